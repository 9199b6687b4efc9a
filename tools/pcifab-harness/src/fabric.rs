// SPDX-License-Identifier: GPL-2.0-only
//! The running fabric: the emulator, one QEMU per host, the agent channel to
//! each guest, and the logs in the results folder.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use crate::config::Expected;
use crate::conn::Conn;
use crate::procs::{self, Children};
use crate::qmp::Qmp;
use crate::Opts;

/// From QEMU spawn to the agent's READY line. The sanitizer kernel with two CPUs under TCG
/// took more than 120 s to boot while other runs shared the machine's two cores.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(300);
/// From emulator spawn to `pcifab-emu: ready`.
pub const EMU_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Extra time the agent gets, beyond a command's own timeout, to answer.
const REPLY_SLACK: Duration = Duration::from_secs(15);
/// Default timeout of one guest command.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(60);
/// Number of switch downstream ports per host.
pub const DOWNSTREAM_PORTS: usize = 4;
/// Name of the emulator in [`Children`].
const EMU: &str = "pcifab-emu";

/// `commands.log`: every command sent to a guest and what came back.
pub struct CmdLog {
    file: Mutex<File>,
    start: Instant,
}

impl CmdLog {
    pub fn create(path: &Path) -> Result<Self, String> {
        let file =
            File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(CmdLog {
            file: Mutex::new(file),
            start: Instant::now(),
        })
    }

    pub fn write(&self, text: &str) {
        let t = self.start.elapsed().as_secs_f64();
        if let Ok(mut f) = self.file.lock() {
            // A failing log write must not fail the test run.
            let _ = writeln!(f, "[{t:9.3}] {text}");
        }
    }
}

/// Result of one guest command.
#[derive(Debug)]
pub struct Output {
    /// Exit code; -1 if killed by timeout or a signal.
    pub code: i64,
    /// stdout and stderr, merged, as text (invalid UTF-8 replaced).
    pub out: String,
    /// The same bytes exactly as the guest wrote them.
    pub raw: Vec<u8>,
}

/// Short form of a script for messages.
pub fn short(script: &str) -> String {
    let first = script.trim().lines().next().unwrap_or("");
    let mut s: String = first.chars().take(70).collect();
    if s.len() < first.len() || script.trim().lines().count() > 1 {
        s.push_str(" ...");
    }
    s
}

/// One guest, reached through its agent.
pub struct Host {
    pub name: String,
    /// Position in the config = switch partition number.
    pub index: usize,
    pub kernel_release: String,
    pub boot_time: Duration,
    conn: Option<Conn>,
    broken: Option<String>,
    pub qemu_pid: u32,
    pub qmp_path: PathBuf,
    pub console: PathBuf,
    next_id: u64,
    /// End of the current scenario's time budget.
    pub deadline: Option<Instant>,
    log: Arc<CmdLog>,
    /// How this host's QEMU was started, so [`Host::reboot`] can start it again.
    launch: Launch,
    /// A QEMU started by [`Host::reboot`] (the first one belongs to [`Children`]).
    rebooted: Option<std::process::Child>,
    /// Bytes of [`Host::console`] the log check has read.
    pub(crate) console_seen: u64,
    /// The host is dead because a scenario killed its QEMU (not because it broke).
    killed: bool,
}

/// A host's QEMU command line and where its agent connects.
#[derive(Clone, Debug, Default)]
struct Launch {
    program: OsString,
    args: Vec<OsString>,
    qemu_log: PathBuf,
    agent_sock: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(c) = self.rebooted.as_mut() {
            procs::kill_and_reap_child(c);
        }
    }
}

/// Put before every script the guest runs: `sleep N` (N a plain number of seconds, as the
/// scripts write it) waits in the shell itself, by a read with a timeout on a FIFO that
/// nobody writes (`/run/nap`, made by the guest's init), instead of forking and executing
/// busybox. Under TCG with the sanitizer kernel a fork and exec costs tens of milliseconds of
/// CPU, and the scripts' wait loops sleep 0.1 s at a time. Any other `sleep` (or no FIFO)
/// runs the real one. The read's timeout status is swallowed, so `set -e` scripts live on.
const SLEEP_PRELUDE: &str = "sleep() { case $#:$1 in 1:*[!0-9.]*|1:|1:.*|1:*.*.*) ;; 1:*) \
     [ -p /run/nap ] && { read -t \"$1\" _ <>/run/nap || :; return 0; } ;; esac; \
     command sleep \"$@\"; }\n";

impl Host {
    /// Runs `script` with `/bin/sh -c` in the guest.
    pub fn run_timeout(&mut self, script: &str, timeout: Duration) -> Result<Output, String> {
        if let Some(why) = &self.broken {
            return Err(format!(
                "{}: not usable any more ({why}); see {}",
                self.name,
                self.console.display()
            ));
        }
        let now = Instant::now();
        let mut t = timeout;
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(now);
            if left.is_zero() {
                return Err(format!(
                    "{}: scenario time budget used up before `{}`",
                    self.name,
                    short(script)
                ));
            }
            t = t.min(left);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err(format!("{}: no agent connection", self.name));
        };
        self.next_id += 1;
        let id = self.next_id;
        self.log.write(&format!(
            "{} #{id} (timeout {} ms) $ {}",
            self.name,
            t.as_millis(),
            script.trim_end().replace('\n', "\n    ")
        ));
        let len = SLEEP_PRELUDE.len() + script.len();
        let mut req = format!("RUN {id} {} {len}\n", t.as_millis()).into_bytes();
        req.extend_from_slice(SLEEP_PRELUDE.as_bytes());
        req.extend_from_slice(script.as_bytes());
        let result = conn.send(&req).and_then(|()| {
            let deadline = now + t + REPLY_SLACK;
            let line = conn.read_line(deadline)?;
            let line = String::from_utf8_lossy(&line).into_owned();
            let w: Vec<&str> = line.split_ascii_whitespace().collect();
            match w.as_slice() {
                ["DONE", rid, code, len] if *rid == id.to_string() => {
                    let code: i64 = code
                        .parse()
                        .map_err(|_| format!("agent sent a bad exit code in {line:?}"))?;
                    let len: usize = len
                        .parse()
                        .map_err(|_| format!("agent sent a bad length in {line:?}"))?;
                    let out = conn.read_exact(len, deadline)?;
                    Ok(Output {
                        code,
                        out: String::from_utf8_lossy(&out).into_owned(),
                        raw: out,
                    })
                }
                ["ERR", ..] => Err(format!("agent rejected the request: {line}")),
                _ => Err(format!(
                    "protocol out of step: expected `DONE {id} ...`, got {line:?}"
                )),
            }
        });
        let elapsed = now.elapsed().as_secs_f64();
        match &result {
            Ok(o) => self.log.write(&format!(
                "{} #{id} exit {} in {elapsed:.2} s{}",
                self.name,
                o.code,
                indent(&o.out)
            )),
            Err(e) => {
                self.log.write(&format!(
                    "{} #{id} FAILED after {elapsed:.2} s: {e}",
                    self.name
                ));
                if e != procs::INTERRUPTED_MSG {
                    // The stream can no longer be trusted to be in step.
                    self.broken = Some(e.clone());
                    self.conn = None;
                }
            }
        }
        result.map_err(|e| format!("{}: `{}`: {e}", self.name, short(script)))
    }

    /// SIGKILLs this host's QEMU (its process group) as a crash would, waits until it is
    /// gone, and marks the host dead: every later command to it fails at once.
    pub fn kill_qemu(&mut self) -> Result<(), String> {
        let pid = self.qemu_pid;
        procs::kill_group(pid);
        let t = Instant::now();
        while !procs::has_exited(pid) {
            if t.elapsed() > Duration::from_secs(10) {
                return Err(format!(
                    "{}: QEMU (pid {pid}) still running 10 s after SIGKILL",
                    self.name
                ));
            }
            sleep(Duration::from_millis(20));
        }
        if let Some(c) = self.rebooted.as_mut() {
            procs::kill_and_reap_child(c);
            self.rebooted = None;
        }
        self.conn = None;
        self.killed = true;
        self.broken = Some(format!("its QEMU (pid {pid}) was killed by the scenario"));
        self.log_note(&format!("QEMU pid {pid} killed with SIGKILL (host dead)"));
        Ok(())
    }

    /// True once the host's QEMU was killed (or its agent stream broke).
    pub fn is_dead(&self) -> bool {
        self.broken.is_some()
    }

    /// True while the host is dead because a scenario killed its QEMU on purpose
    /// ([`Host::kill_qemu`]), false if it is alive or broke by itself.
    pub fn killed_by_scenario(&self) -> bool {
        self.killed && self.is_dead()
    }

    /// Why the host is dead, if it is.
    pub fn dead_reason(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Starts a killed host's QEMU again with the same command line (console and QEMU log
    /// appended to) and waits for its agent. Must run on the main thread (scenario code, not
    /// inside [`Fabric::each_host`]). Returns the boot time.
    pub fn reboot(&mut self) -> Result<Duration, String> {
        if !procs::has_exited(self.qemu_pid) {
            return Err(format!(
                "{}: reboot: QEMU (pid {}) is still running; kill it first",
                self.name, self.qemu_pid
            ));
        }
        let l = self.launch.clone();
        let _ = fs::remove_file(&l.agent_sock);
        let listener = UnixListener::bind(&l.agent_sock)
            .map_err(|e| format!("cannot listen on {}: {e}", l.agent_sock.display()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("{}: {e}", l.agent_sock.display()))?;
        let args: Vec<OsString> = l
            .args
            .iter()
            .map(|a| match a.to_str() {
                // Keep the first boot's console log.
                Some(t) if t.starts_with("file,id=con,") => {
                    OsString::from(t.replacen("file,id=con,", "file,id=con,append=on,", 1))
                }
                _ => a.clone(),
            })
            .collect();
        let qlog = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&l.qemu_log)
            .map_err(|e| format!("cannot open {}: {e}", l.qemu_log.display()))?;
        let qlog2 = qlog
            .try_clone()
            .map_err(|e| format!("cannot duplicate log handle: {e}"))?;
        let mut cmd = Command::new(&l.program);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(qlog))
            .stderr(Stdio::from(qlog2));
        let spawned = Instant::now();
        let child = procs::spawn_guarded(&format!("qemu-{}", self.name), &mut cmd)?;
        let pid = child.id();
        self.rebooted = Some(child);
        self.qemu_pid = pid;
        self.log_note(&format!("QEMU started again, pid {pid}"));
        let deadline = spawned + BOOT_TIMEOUT;
        let stream = loop {
            if procs::interrupted() {
                return Err(procs::INTERRUPTED_MSG.to_string());
            }
            match listener.accept() {
                Ok((st, _)) => break st,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("{}: accept on agent socket: {e}", self.name)),
            }
            if procs::has_exited(pid) {
                return Err(format!(
                    "{}: QEMU exited during start-up; see {}{}",
                    self.name,
                    l.qemu_log.display(),
                    tail(&l.qemu_log, 3)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{}: QEMU never connected the agent socket",
                    self.name
                ));
            }
            sleep(Duration::from_millis(20));
        };
        stream
            .set_nonblocking(false)
            .map_err(|e| format!("{}: agent socket: {e}", self.name))?;
        let mut conn = Conn::new(stream, Some(pid), &format!("{} agent", self.name))?;
        let line = conn.read_line(deadline).map_err(|e| {
            format!(
                "{}: no READY from the agent after the reboot ({e}); see {}",
                self.name,
                self.console.display()
            )
        })?;
        let line = String::from_utf8_lossy(&line).into_owned();
        let Some(release) = line.strip_prefix("READY ") else {
            return Err(format!(
                "{}: agent greeted with {line:?}, expected READY",
                self.name
            ));
        };
        self.kernel_release = release.trim().to_string();
        self.boot_time = spawned.elapsed();
        self.conn = Some(conn);
        self.broken = None;
        self.killed = false;
        self.log_note(&format!(
            "agent ready again in {:.2} s",
            self.boot_time.as_secs_f64()
        ));
        Ok(self.boot_time)
    }

    /// Writes `mark` into the kernel log and waits (at most [`CONSOLE_MARK_TIMEOUT`]) until
    /// it is in the console file past what the log check has read.
    fn console_mark(&mut self, mark: &str) -> Result<(), String> {
        let sent = self.run_ok_timeout(
            &format!("echo '<5>{mark}' > /dev/kmsg"),
            Duration::from_secs(20),
        );
        if let Err(e) = sent {
            if procs::has_exited(self.qemu_pid) {
                return Err(format!(
                    "{}: console check: its QEMU (pid {}) has exited; see {}{}",
                    self.name,
                    self.qemu_pid,
                    self.launch.qemu_log.display(),
                    tail(&self.launch.qemu_log, 3)
                ));
            }
            return Err(format!("console check: {e}"));
        }
        let t = Instant::now();
        loop {
            let (text, _) = read_from(&self.console, self.console_seen, true)
                .map_err(|e| format!("{}: {e}", self.name))?;
            if text.contains(mark) {
                return Ok(());
            }
            if t.elapsed() > CONSOLE_MARK_TIMEOUT {
                return Err(format!(
                    "{}: console check: the kernel log line `{mark}` did not reach {} within {} s",
                    self.name,
                    self.console.display(),
                    CONSOLE_MARK_TIMEOUT.as_secs()
                ));
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// A QMP session with this host's QEMU (for device_add, device_del, ...).
    pub fn qmp(&self) -> Result<Qmp, String> {
        Qmp::connect(&self.qmp_path, Some(self.qemu_pid), Duration::from_secs(10))
            .map_err(|e| format!("{}: {e}", self.name))
    }

    /// Adds a line about this host to commands.log.
    pub fn log_note(&self, text: &str) {
        self.log.write(&format!("{}: {text}", self.name));
    }

    pub fn run(&mut self, script: &str) -> Result<Output, String> {
        self.run_timeout(script, CMD_TIMEOUT)
    }

    /// Runs `script` and requires exit code 0; returns its output.
    pub fn run_ok(&mut self, script: &str) -> Result<String, String> {
        self.run_ok_timeout(script, CMD_TIMEOUT)
    }

    pub fn run_ok_timeout(&mut self, script: &str, timeout: Duration) -> Result<String, String> {
        let o = self.run_timeout(script, timeout)?;
        if o.code != 0 {
            return Err(format!(
                "{}: `{}` exited with {} (expected 0); output: {}",
                self.name,
                short(script),
                o.code,
                o.out.trim_end()
            ));
        }
        Ok(o.out)
    }
}

/// How long a console mark may take from the guest's kernel log to the console file.
const CONSOLE_MARK_TIMEOUT: Duration = Duration::from_secs(10);

/// The new part of a growing log from byte `seen` on: its complete lines (with `all`, also a
/// last line without a newline) and the offset after them.
fn read_from(path: &Path, seen: u64, all: bool) -> Result<(String, u64), String> {
    use std::io::{Seek, SeekFrom};
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((String::new(), 0)),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let len = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    // A file that shrank was started anew: read it from the start.
    let from = if len < seen { 0 } else { seen };
    f.seek(SeekFrom::Start(from))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut data = Vec::new();
    f.read_to_end(&mut data)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (text, n) = crate::splat::complete_part(&data, all);
    Ok((text, from + n as u64))
}

/// Output beyond this many bytes per command is not copied to commands.log.
const LOG_OUTPUT_MAX: usize = 64 * 1024;

fn indent(s: &str) -> String {
    let mut cut = s.len().min(LOG_OUTPUT_MAX);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let more = if cut < s.len() {
        format!("\n    | [{} more bytes not logged]", s.len() - cut)
    } else {
        String::new()
    };
    s[..cut]
        .trim_end()
        .lines()
        .map(|l| format!("\n    | {l}"))
        .collect::<String>()
        + &more
}

/// Everything a scenario gets.
pub struct Fabric {
    pub hosts: Vec<Host>,
    pub expected: Expected,
    /// The run directory: sockets of the emulator, QEMU and agents.
    pub run_dir: PathBuf,
    /// `--debug-kernel`: the guests run the sanitizer kernel, whose checks must be there.
    pub debug_kernel: bool,
    /// The results folder (`splats.log` goes there).
    pub results: PathBuf,
    /// `--guest-bin`: the guests' tools, also run here on files of the test world (the
    /// drives' images).
    pub guest_bin: PathBuf,
    /// `RESULTS/emu.log` when the emulator runs, and the bytes of it already checked.
    pub emu_log: Option<PathBuf>,
    pub(crate) emu_log_seen: u64,
    /// Emulator error lines the current scenario provokes on purpose (substrings).
    expected_emu_errors: Vec<String>,
    /// Set by a scenario that does not apply to this run ([`Fabric::skip`]).
    skip: Option<String>,
    /// Log checks so far (numbers the console marks).
    checks: u64,
    /// The run's TLS material, once a scenario asked for it ([`Fabric::tls_material`]).
    pub(crate) tls: Option<crate::tls::Authority>,
    /// The emulator's pid, when the harness started it.
    pub emu_pid: Option<u32>,
    /// Per host, the DMA-API error count at the previous log check (debug kernel).
    dma_errors_seen: Vec<u64>,
    /// Set by a scenario that could only check a refusal ([`Fabric::refusal_only`]).
    refusal_only: Option<String>,
    /// The guests carry Debian's Slurm and MUNGE (`--slurm`, a `slurm:` scenario selected).
    pub slurm: bool,
    /// The guests carry etcd (`--etcd`, the manager's HA scenario selected).
    pub etcd: bool,
}

/// What [`EmuControl::host_counters`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostCounters {
    pub mrpc_commands: u64,
    pub bar_reads: u64,
    pub bar_writes: u64,
}

/// The emulator's control socket, for scenarios.
#[derive(Clone)]
pub struct EmuControl {
    run_dir: PathBuf,
}

impl EmuControl {
    /// Sends `request`; returns the reply unless it is not `{"ok":true,...}`.
    pub fn request(&self, request: &str) -> Result<serde_json::Value, String> {
        let reply = emu_control(&self.run_dir, request)?;
        let v: serde_json::Value = serde_json::from_str(&reply).map_err(|e| {
            format!("emulator control `{request}`: expected one JSON line, got {reply:?} ({e})")
        })?;
        if v.get("ok") != Some(&serde_json::Value::Bool(true)) {
            return Err(format!(
                "emulator control `{request}`: expected {{\"ok\":true}}, got {reply}"
            ));
        }
        Ok(v)
    }

    /// How many MRPC replies the emulator falsified for host `name` since its hostile mode
    /// was armed (`state`: `host_state[].hostile.mrpc_replies`); an error if it never was.
    pub fn hostile_replies(&self, name: &str) -> Result<u64, String> {
        let v = self.request("state")?;
        v.get("host_state")
            .and_then(|h| h.as_array())
            .and_then(|a| {
                a.iter()
                    .find(|h| h.get("name").and_then(|n| n.as_str()) == Some(name))
            })
            .and_then(|h| h.get("hostile"))
            .and_then(|h| h.get("mrpc_replies"))
            .and_then(|c| c.as_u64())
            .ok_or_else(|| {
                format!("emulator state has no hostile.mrpc_replies for host {name}: {v}")
            })
    }

    /// The emulator's count of MRPC commands host `name` started.
    /// Host `name`'s counters in the emulator's `state`: MRPC commands picked up and BAR
    /// reads and writes that reached the emulator.
    pub fn host_counters(&self, name: &str) -> Result<HostCounters, String> {
        let v = self.request("state")?;
        let h = v
            .get("hosts")
            .and_then(|h| h.as_array())
            .and_then(|a| {
                a.iter()
                    .find(|h| h.get("name").and_then(|n| n.as_str()) == Some(name))
            })
            .ok_or_else(|| format!("emulator state has no host {name}: {v}"))?;
        let n = |k: &str| {
            h.get(k)
                .and_then(|c| c.as_u64())
                .ok_or_else(|| format!("emulator state has no {k} for host {name}: {h}"))
        };
        Ok(HostCounters {
            mrpc_commands: n("mrpc_commands")?,
            bar_reads: n("bar_reads")?,
            bar_writes: n("bar_writes")?,
        })
    }

    pub fn mrpc_commands(&self, name: &str) -> Result<u64, String> {
        let v = self.request("state")?;
        v.get("hosts")
            .and_then(|h| h.as_array())
            .and_then(|a| {
                a.iter()
                    .find(|h| h.get("name").and_then(|n| n.as_str()) == Some(name))
            })
            .and_then(|h| h.get("mrpc_commands"))
            .and_then(|c| c.as_u64())
            .ok_or_else(|| format!("emulator state has no mrpc_commands for host {name}: {v}"))
    }
}

impl Fabric {
    pub fn new(
        hosts: Vec<Host>,
        expected: Expected,
        run_dir: PathBuf,
        results: PathBuf,
        debug_kernel: bool,
        with_emu: bool,
    ) -> Self {
        Fabric {
            hosts,
            expected,
            run_dir,
            debug_kernel,
            emu_log: with_emu.then(|| results.join("emu.log")),
            guest_bin: PathBuf::new(),
            results,
            emu_log_seen: 0,
            expected_emu_errors: Vec::new(),
            skip: None,
            checks: 0,
            tls: None,
            emu_pid: None,
            dma_errors_seen: Vec::new(),
            refusal_only: None,
            slurm: false,
            etcd: false,
        }
    }

    /// Marks the current scenario as one that, in this run, could only check that what it
    /// is named for is refused (e.g. P2P without the firmware's extensions): it is reported
    /// under its name followed by ` -- refusal only: WHAT`, so that a pass does not read as
    /// the thing itself working.
    pub fn refusal_only(&mut self, what: &str) {
        self.refusal_only = Some(what.to_string());
    }

    /// The refusal-only note the scenario set, if any.
    pub fn take_refusal_only(&mut self) -> Option<String> {
        self.refusal_only.take()
    }

    /// Declares that the current scenario provokes emulator error lines containing
    /// `pattern` on purpose; the log check after the scenario accepts them. (No scenario
    /// provokes one today: the emulator prints what a scenario provokes on purpose as
    /// `pcifab-emu: note:`.)
    #[allow(dead_code)]
    pub fn expect_emu_error(&mut self, pattern: &str) {
        self.expected_emu_errors.push(pattern.to_string());
    }

    /// Marks the current scenario as not applicable to this run; it is reported as
    /// `ok N - name # SKIP reason` once it returns `Ok(())`.
    pub fn skip(&mut self, reason: &str) {
        self.skip = Some(reason.to_string());
    }

    /// Called before each scenario: no expected emulator errors, no skip, no refusal note.
    pub fn begin_scenario(&mut self) {
        self.expected_emu_errors.clear();
        self.skip = None;
        self.refusal_only = None;
    }

    /// The skip reason the scenario set, if any.
    pub fn take_skip(&mut self) -> Option<String> {
        self.skip.take()
    }

    /// Reads what every guest wrote to its console and the emulator to `emu.log` since the
    /// previous check: kernel splats and emulator error lines the scenario did not declare
    /// fail it. Each live guest first writes a numbered mark into its kernel log and the
    /// check waits for that mark on the console, so everything the kernel printed before
    /// is there. Splats are appended to `RESULTS/splats.log`. `at_end`: also take a last
    /// line that has no newline yet.
    pub fn check_logs(&mut self, label: &str, at_end: bool) -> Result<(), String> {
        self.checks += 1;
        // Only a number: the mark lands in dmesg, which scenarios grep for bad words.
        let mark = format!("pcifab-harness: console mark {} done", self.checks);
        if let Some(h) = self.hosts.first() {
            h.log_note(&format!("log check {}: {label}", self.checks));
        }
        let mut problems: Vec<String> = Vec::new();
        let mut saved = String::new();
        let debug = self.debug_kernel;
        self.dma_errors_seen.resize(self.hosts.len(), 0);
        for (h, dma_seen) in self.hosts.iter_mut().zip(self.dma_errors_seen.iter_mut()) {
            if !h.is_dead() {
                if let Err(e) = h.console_mark(&mark) {
                    problems.push(e);
                }
                if debug {
                    problems.extend(check_checkers(h, dma_seen));
                }
            }
            let (text, used) = match read_from(&h.console, h.console_seen, at_end) {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("{}: {e}", h.name));
                    continue;
                }
            };
            h.console_seen = used;
            for s in crate::splat::find_splats(&text) {
                saved.push_str(&format!(
                    "=== {label}: {} in {} ({})\n{}\n\n",
                    s.kind,
                    h.name,
                    h.console.display(),
                    s.lines.join("\n")
                ));
                problems.push(format!(
                    "kernel splat ({}) in {}'s console: {}\n  | {}",
                    s.kind,
                    h.name,
                    s.first_line(),
                    s.lines[1..].join("\n  | ")
                ));
            }
        }
        if let Some(path) = &self.emu_log {
            match read_from(path, self.emu_log_seen, at_end) {
                Ok((text, used)) => {
                    self.emu_log_seen = used;
                    let bad = crate::splat::unexpected_emu_errors(&text, &self.expected_emu_errors);
                    if !bad.is_empty() {
                        saved.push_str(&format!(
                            "=== {label}: emulator error lines in {}\n{}\n\n",
                            path.display(),
                            bad.join("\n")
                        ));
                        let shown: Vec<&str> = bad.iter().copied().take(10).collect();
                        let more = if bad.len() > shown.len() {
                            format!(
                                "\n  | ... {} more in {}",
                                bad.len() - shown.len(),
                                path.display()
                            )
                        } else {
                            String::new()
                        };
                        problems.push(format!(
                            "{} emulator error line(s) in emu.log that the scenario did not \
                             declare:\n  | {}{more}",
                            bad.len(),
                            shown.join("\n  | ")
                        ));
                    }
                }
                Err(e) => problems.push(e),
            }
        }
        if !saved.is_empty() {
            let p = self.results.join("splats.log");
            let w = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .and_then(|mut f| f.write_all(saved.as_bytes()));
            if let Err(e) = w {
                problems.push(format!("cannot append to {}: {e}", p.display()));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }

    pub fn emu(&self) -> EmuControl {
        EmuControl {
            run_dir: self.run_dir.clone(),
        }
    }

    /// Runs `f` on every host in parallel; errors are collected per host.
    pub fn each_host<F>(&mut self, f: F) -> Result<(), String>
    where
        F: Fn(&mut Host, &Expected) -> Result<(), String> + Sync,
    {
        let expected = &self.expected;
        let f = &f;
        let errors: Vec<String> = thread::scope(|s| {
            let handles: Vec<_> = self
                .hosts
                .iter_mut()
                .map(|h| s.spawn(move || f(h, expected)))
                .collect();
            handles
                .into_iter()
                .filter_map(|h| match h.join() {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e),
                    Err(_) => Some("scenario code panicked (harness bug)".into()),
                })
                .collect()
        });
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    pub fn set_deadline(&mut self, d: Option<Instant>) {
        for h in &mut self.hosts {
            h.deadline = d;
        }
    }
}

/// After a scenario on the debug kernel: lockdep must still be on (after its first report,
/// or when it runs out of room, it turns itself off and the rest of the boot is unchecked)
/// and the DMA-API checker must have counted no error since the previous check (`seen`; a
/// count below it is a rebooted guest's new start). Returns the problems.
fn check_checkers(h: &mut Host, seen: &mut u64) -> Vec<String> {
    let st = match crate::checks::guest::checker_state(h) {
        Ok(st) => st,
        Err(e) => return vec![e],
    };
    let mut problems = Vec::new();
    if !st.lockdep_on {
        problems.push(format!(
            "lockdep is off in {} (debug_locks 0 in /proc/lockdep_stats): it turned itself \
             off after a report or for lack of room, so this scenario's locking went \
             unchecked; see {}",
            h.name,
            h.console.display()
        ));
    }
    if st.dma_errors < *seen {
        *seen = 0;
    }
    if st.dma_errors > *seen {
        problems.push(format!(
            "DMA-API debugging counted {} new error(s) in {} ({} since boot, debugfs \
             dma-api/error_count); see {}",
            st.dma_errors - *seen,
            h.name,
            st.dma_errors,
            h.console.display()
        ));
        *seen = st.dma_errors;
    }
    problems
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Result<Self, String> {
        let mut tmpl = *b"/tmp/pcifab-XXXXXX\0";
        // SAFETY: `tmpl` is a writable NUL-terminated template as mkdtemp requires.
        let p = unsafe { libc::mkdtemp(tmpl.as_mut_ptr().cast()) };
        if p.is_null() {
            return Err(format!(
                "cannot create a run directory under /tmp: {}",
                std::io::Error::last_os_error()
            ));
        }
        let s = String::from_utf8_lossy(&tmpl[..tmpl.len() - 1]).into_owned();
        Ok(TempDir(PathBuf::from(s)))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Checks a Unix socket path fits `sun_path`.
fn sock_path(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let p = dir.join(name);
    if p.as_os_str().len() >= 108 {
        return Err(format!(
            "socket path {} is {} bytes, Unix sockets allow 107; use a shorter run directory",
            p.display(),
            p.as_os_str().len()
        ));
    }
    Ok(p)
}

/// Starts the emulator and waits for its `ready` line; returns its pid.
///
/// Every host in `hosts` (the ones that boot) gets `--qmp HOST=RUNDIR/qmp-emu-HOST.sock`: the
/// emulator's own QMP connection to that host's QEMU, through which a bind or unbind
/// hot-plugs the function (QEMU creates the socket; the emulator connects lazily).
pub fn start_emulator(
    opts: &Opts,
    children: &mut Children,
    run_dir: &Path,
    hosts: &[String],
) -> Result<u32, String> {
    let log_path = opts.results.join("emu.log");
    let log = File::create(&log_path)
        .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
    let log_out = log
        .try_clone()
        .map_err(|e| format!("cannot duplicate log handle: {e}"))?;
    let mut cmd = Command::new(&opts.emu);
    cmd.arg("--config")
        .arg(&opts.emu_config)
        .arg("--run-dir")
        .arg(run_dir);
    if let Some(d) = opts.dialect {
        cmd.arg("--dialect").arg(d.name());
    }
    for h in hosts {
        let qmp = sock_path(run_dir, &format!("qmp-emu-{h}.sock"))?;
        cmd.arg("--qmp").arg(format!("{h}={}", qmp.display()));
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log_out))
        .stderr(Stdio::piped());
    let mut child_stderr = None;
    let pid = children.spawn_with(EMU, &mut cmd, |c| child_stderr = c.stderr.take())?;
    let Some(stderr) = child_stderr else {
        return Err("emulator stderr was not captured (harness bug)".into());
    };
    let (tx, rx) = mpsc::channel();
    let mut log = log;
    // Copies stderr into emu.log and reports the ready line; ends at EOF.
    thread::spawn(move || {
        let mut r = BufReader::new(stderr);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let _ = log.write_all(&line);
                    if String::from_utf8_lossy(&line).contains("pcifab-emu: ready") {
                        let _ = tx.send(());
                    }
                }
            }
        }
    });
    let start = Instant::now();
    loop {
        if procs::interrupted() {
            return Err(procs::INTERRUPTED_MSG.into());
        }
        if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
        if let Some(st) = children.try_status(EMU) {
            return Err(format!(
                "the emulator (pid {pid}) exited with {st} before it was ready; see {}{}",
                log_path.display(),
                tail(&log_path, 5)
            ));
        }
        if start.elapsed() >= EMU_READY_TIMEOUT {
            return Err(format!(
                "the emulator printed no `pcifab-emu: ready` within {} s; see {}{}",
                EMU_READY_TIMEOUT.as_secs(),
                log_path.display(),
                tail(&log_path, 5)
            ));
        }
    }
    Ok(pid)
}

/// Last `n` lines of a file, as "\n  | line" text for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    lines[from..]
        .iter()
        .map(|l| format!("\n  | {l}"))
        .collect::<String>()
}

/// One request on the emulator's control socket.
pub fn emu_control(run_dir: &Path, request: &str) -> Result<String, String> {
    let path = run_dir.join("control.sock");
    let mut s = UnixStream::connect(&path)
        .map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
    // Binding and unbinding wait for QEMU's hot-plug: on PAX firmware an unbind of a
    // function in use is a device_del, which waits out pciehp's attention-button delay
    // (5 s) and the removal before the emulator answers; every other request is quick.
    let verb = request.split_whitespace().next().unwrap_or("");
    let timeout = if matches!(verb, "bind" | "unbind") {
        60
    } else {
        5
    };
    s.set_read_timeout(Some(Duration::from_secs(timeout)))
        .map_err(|e| format!("control socket: {e}"))?;
    s.write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("control socket write: {e}"))?;
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.ends_with(b"\n") {
                    break;
                }
            }
            Err(e) => return Err(format!("control socket: no full reply to `{request}`: {e}")),
        }
    }
    Ok(String::from_utf8_lossy(&out).trim_end().to_string())
}

/// Escapes a value for QEMU's comma-separated option syntax.
fn qopt(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// The QEMU binary of the trixie tree, run through that tree's loader.
fn qemu_command(root: &Path) -> Result<Command, String> {
    let qemu = root.join("usr/bin/qemu-system-x86_64");
    if !qemu.exists() {
        return Err(format!(
            "{} not found: --qemu-root must be the Debian trixie tree made by \
             tools/scripts/deps.sh",
            qemu.display()
        ));
    }
    let loader = [
        "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "lib64/ld-linux-x86-64.so.2",
        "usr/lib64/ld-linux-x86-64.so.2",
    ]
    .iter()
    .map(|p| root.join(p))
    .find(|p| p.exists())
    .ok_or_else(|| format!("no ld-linux-x86-64.so.2 in {}", root.display()))?;
    let mut cmd = Command::new(loader);
    cmd.arg("--library-path")
        .arg(root.join("usr/lib/x86_64-linux-gnu"))
        .arg(qemu)
        .arg("-L")
        .arg(root.join("usr/share/qemu"))
        .arg("-L")
        .arg(root.join("usr/share/seabios"));
    Ok(cmd)
}

/// Whether host `index` boots with a virtual IOMMU: the first host does, the others do
/// not, so every run proves the module both ways (Documentation/testing.rst).
pub fn iommu_host(index: usize) -> bool {
    index == 0
}

/// Guest memory in MiB: the debug kernel gets more, for KASAN's shadow (an eighth of RAM),
/// its quarantine and kmemleak's object pool (Documentation/testing.rst, "The debug kernel").
pub fn guest_mem_mib(debug_kernel: bool) -> u32 {
    if debug_kernel {
        1024
    } else {
        512
    }
}

/// The `-accel` value for `smp` virtual CPUs: with more than one, multi-threaded TCG (one
/// host thread per virtual CPU), asked for explicitly so that QEMU refuses to start rather
/// than run the CPUs one after another in a single thread, where a race in the guest's
/// kernel would rarely happen.
pub fn tcg_accel(smp: u32) -> &'static str {
    if smp > 1 {
        "tcg,thread=multi"
    } else {
        "tcg"
    }
}

/// Kernel parameters of host `name`.
pub fn kernel_cmdline(name: &str, iommu: bool, debug_kernel: bool) -> String {
    // `no_timer_check`: at boot the kernel checks that the timer interrupt arrives within a
    // short busy-wait and panics ("IO-APIC + timer doesn't work!") when it does not; under
    // TCG on a loaded machine the virtual CPU may not run for that long, and a Debian guest
    // died so at boot beside the sanitizer lanes. Virtual machines' images boot with it.
    let mut c = format!(
        "console=ttyS0 panic=-1 no_timer_check pcifab_host={name} {}",
        if iommu {
            "intel_iommu=on iommu.strict=1"
        } else {
            "intel_iommu=off"
        }
    );
    if debug_kernel {
        // Every check reports and the guest lives on, so the harness collects every splat
        // of the run (a panic would end the guest at the first one). `kasan_multi_shot`:
        // KASAN reports every bad access, not only the first of the boot (it would leave the
        // rest of the run unchecked). The DMA-API checker prints every error once the init
        // turns `all_errors` on (initramfs.rs; it has no kernel parameter for it).
        c.push_str(
            " kmemleak=on hung_task_panic=0 softlockup_panic=0 panic_on_warn=0 kasan.fault=report \
             kasan_multi_shot",
        );
    }
    c
}

/// Most hosts the management network can address: host k's link is 10.77.k.0/24 and its
/// MACs carry k in one byte.
pub const MGMT_MAX_HOSTS: usize = 255;

/// MAC of the management NIC on host k's link (k >= 1): h0's end (`manager_side`) is
/// 52:54:00:77:KK:01, host k's end 52:54:00:77:KK:02 (KK = k in hex). The guest's init
/// derives the NIC's address 10.77.k.1 or 10.77.k.2 from it (initramfs.rs).
pub fn mgmt_mac(k: usize, manager_side: bool) -> String {
    format!(
        "52:54:00:77:{:02x}:{:02x}",
        k & 0xff,
        if manager_side { 1 } else { 2 }
    )
}

/// The management NICs of host `index` of `n_hosts` (Documentation/testing.rst, "The
/// management network"): h0 has one per other host k, the server end of a `-netdev
/// stream` over `RUN/mgmt-K.sock`; host k has one, the client end, which reconnects, so
/// the boot order does not matter and a host rebooted by a scenario gets its link back.
fn mgmt_nic_args(run_dir: &Path, index: usize, n_hosts: usize) -> Result<Vec<String>, String> {
    if n_hosts > MGMT_MAX_HOSTS {
        return Err(format!(
            "{n_hosts} hosts: the management network addresses at most {MGMT_MAX_HOSTS} \
             (10.77.K.0/24 per host)"
        ));
    }
    let links: Vec<usize> = if index == 0 {
        (1..n_hosts).collect()
    } else {
        vec![index]
    };
    let mut a = Vec::new();
    for k in links {
        let sock = sock_path(run_dir, &format!("mgmt-{k}.sock"))?;
        let end = if index == 0 {
            "server=on".to_string()
        } else {
            format!("server=off,reconnect-ms={MGMT_RECONNECT_MS}")
        };
        a.push("-netdev".into());
        a.push(format!(
            "stream,id=mgmt{k},{end},addr.type=unix,addr.path={}",
            qopt(&sock)
        ));
        // No option ROM: nothing boots from the network, and SeaBIOS would spend time
        // (under TCG) starting iPXE for it.
        a.push("-device".into());
        a.push(format!(
            "virtio-net-pci,id=mgmtnic{k},netdev=mgmt{k},mac={},bus=pcie.0,romfile=",
            mgmt_mac(k, index == 0)
        ));
    }
    Ok(a)
}

/// How often host k's QEMU tries to reach h0's end of their link while it is not there.
const MGMT_RECONNECT_MS: u32 = 200;

/// QEMU arguments for host `name`, number `index` of `n_hosts` (after the binary and -L
/// options).
pub fn qemu_args(
    opts: &Opts,
    name: &str,
    initrd: &Path,
    run_dir: &Path,
    (index, n_hosts): (usize, usize),
    iommu: bool,
) -> Result<Vec<OsString>, String> {
    let mep = sock_path(run_dir, &format!("mep-{name}.sock"))?;
    let agent = sock_path(run_dir, &format!("agent-{name}.sock"))?;
    let qmp = sock_path(run_dir, &format!("qmp-{name}.sock"))?;
    let qmp_emu = sock_path(run_dir, &format!("qmp-emu-{name}.sock"))?;
    let console = opts.results.join(format!("{name}.console"));
    let mem = guest_mem_mib(opts.debug_kernel);
    let mut a: Vec<String> = vec![
        "-M".into(),
        "q35".into(),
        "-global".into(),
        "ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off".into(),
        "-accel".into(),
        tcg_accel(opts.smp).into(),
        "-smp".into(),
        opts.smp.to_string(),
        "-m".into(),
        format!("{mem}M"),
        "-object".into(),
        format!("memory-backend-memfd,id=mem,size={mem}M,share=on"),
        "-machine".into(),
        "memory-backend=mem".into(),
        "-nodefaults".into(),
    ];
    if iommu {
        // Before any PCI device, so every device (the vfio-user MEP and the functions
        // bound later included) sits behind it; caching mode makes QEMU tell the
        // vfio-user server every mapping the guest creates.
        a.extend([
            "-device".into(),
            "intel-iommu,caching-mode=on,intremap=off".into(),
        ]);
    }
    a.extend([
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-kernel".into(),
        opts.kernel.display().to_string(),
        "-initrd".into(),
        initrd.display().to_string(),
        "-append".into(),
        kernel_cmdline(name, iommu, opts.debug_kernel),
        "-chardev".into(),
        format!("file,id=con,path={}", qopt(&console)),
        "-serial".into(),
        "chardev:con".into(),
        // The virtual switch: root port -> upstream port (00.0) + MEP (00.1).
        "-device".into(),
        "pcie-root-port,id=rp0,bus=pcie.0,addr=0x10,chassis=1,slot=1".into(),
        "-device".into(),
        "x3130-upstream,id=usp0,bus=rp0,addr=0.0,multifunction=on".into(),
    ]);
    if opts.no_emu {
        // Development aid: a plain test device where the MEP would be.
        a.extend(["-device".into(), "pci-testdev,bus=rp0,addr=0.1".into()]);
    } else {
        // QEMU 11.1 rejects `socket.type=unix,socket.path=...` in key=value
        // form for vfio-user-pci; the JSON form of -device takes the
        // SocketAddress as an object.
        let dev = serde_json::json!({
            "driver": "vfio-user-pci",
            "id": "mep",
            "bus": "rp0",
            "addr": "0.1",
            "socket": { "type": "unix", "path": mep.display().to_string() },
        });
        a.extend(["-device".into(), dev.to_string()]);
        // The switch's DMA endpoint, when the emulator serves one (its configuration's
        // `dma_endpoint_channels`): function 2 of the upstream port's slot.
        let dmaep = sock_path(run_dir, &format!("dmaep-{name}.sock"))?;
        if dmaep.exists() {
            let dev = serde_json::json!({
                "driver": "vfio-user-pci",
                "id": "dmaep",
                "bus": "rp0",
                "addr": "0.2",
                "socket": { "type": "unix", "path": dmaep.display().to_string() },
            });
            a.extend(["-device".into(), dev.to_string()]);
        }
    }
    // The downstream ports are QEMU's pcie-root-port models placed below the switch's
    // upstream port: unlike xio3130-downstream they have an ACS capability, as a PAX part's
    // downstream ports do, so the driver's ACS set-up and restore are exercised (Linux
    // treats them as the switch's downstream ports; native hot-plug works the same).
    for k in 0..DOWNSTREAM_PORTS {
        a.push("-device".into());
        a.push(format!(
            "pcie-root-port,id=dsp{k},bus=usp0,addr={k}.0,chassis=2,slot={k}"
        ));
    }
    a.extend([
        "-device".into(),
        "virtio-serial-pci,id=vser0,bus=pcie.0".into(),
        "-chardev".into(),
        format!("socket,id=agent,path={}", qopt(&agent)),
        "-device".into(),
        "virtserialport,bus=vser0.0,chardev=agent,name=pcifab-agent".into(),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", qopt(&qmp)),
    ]);
    // After every other device, so the NICs take the last free slots of the root bus and
    // move nothing that was there before.
    a.extend(mgmt_nic_args(run_dir, index, n_hosts)?);
    if !opts.no_emu {
        // The emulator's own monitor: binds and unbinds device_add/device_del through it.
        a.extend([
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", qopt(&qmp_emu)),
        ]);
    }
    Ok(a.into_iter().map(OsString::from).collect())
}

/// Starts every host's QEMU (from the calling = main thread) and waits, in
/// parallel, for each agent's READY line.
pub fn boot_hosts(
    opts: &Opts,
    children: &mut Children,
    run_dir: &Path,
    initrd: &Path,
    names: &[String],
    log: &Arc<CmdLog>,
) -> Result<Vec<Host>, String> {
    struct Pending {
        name: String,
        index: usize,
        listener: UnixListener,
        pid: u32,
        spawned: Instant,
        launch: Launch,
    }
    let mut pending = Vec::new();
    for (index, name) in names.iter().enumerate() {
        let agent = sock_path(run_dir, &format!("agent-{name}.sock"))?;
        // Listen first: QEMU connects as a client at start, so nothing the
        // guest writes can be lost.
        let listener = UnixListener::bind(&agent)
            .map_err(|e| format!("cannot listen on {}: {e}", agent.display()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("{}: {e}", agent.display()))?;
        let args = qemu_args(
            opts,
            name,
            initrd,
            run_dir,
            (index, names.len()),
            iommu_host(index),
        )?;
        let mut cmd = qemu_command(&opts.qemu_root)?;
        cmd.args(&args);
        let qlog_path = opts.results.join(format!("{name}.qemu.log"));
        let qlog = File::create(&qlog_path)
            .map_err(|e| format!("cannot create {}: {e}", qlog_path.display()))?;
        let qlog2 = qlog
            .try_clone()
            .map_err(|e| format!("cannot duplicate log handle: {e}"))?;
        // Keep the full command line next to the logs for reproduction.
        let line = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| shell_quote(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        let _ = fs::write(opts.results.join(format!("{name}.cmdline")), line + "\n");
        let launch = Launch {
            program: cmd.get_program().to_owned(),
            args: cmd.get_args().map(|a| a.to_owned()).collect(),
            qemu_log: qlog_path.clone(),
            agent_sock: agent.clone(),
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(qlog))
            .stderr(Stdio::from(qlog2));
        let spawned = Instant::now();
        let pid = children.spawn(&format!("qemu-{name}"), &mut cmd)?;
        log.write(&format!("{name}: QEMU started, pid {pid}"));
        pending.push(Pending {
            name: name.clone(),
            index,
            listener,
            pid,
            spawned,
            launch,
        });
    }

    let results: Vec<Result<Host, String>> = thread::scope(|s| {
        let handles: Vec<_> = pending
            .into_iter()
            .map(|p| {
                let log = Arc::clone(log);
                let results = opts.results.clone();
                let run_dir = run_dir.to_path_buf();
                s.spawn(move || {
                    let qlog = results.join(format!("{}.qemu.log", p.name));
                    let console = results.join(format!("{}.console", p.name));
                    let deadline = p.spawned + BOOT_TIMEOUT;
                    let fail = |why: String| {
                        format!(
                            "{}: {why}; see {} and {}{}{}",
                            p.name,
                            qlog.display(),
                            console.display(),
                            tail(&qlog, 3),
                            tail(&console, 8)
                        )
                    };
                    let stream = loop {
                        if procs::interrupted() {
                            return Err(procs::INTERRUPTED_MSG.to_string());
                        }
                        match p.listener.accept() {
                            Ok((s, _)) => break s,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) => return Err(fail(format!("accept on agent socket: {e}"))),
                        }
                        if procs::has_exited(p.pid) {
                            return Err(fail("QEMU exited during start-up".into()));
                        }
                        if Instant::now() >= deadline {
                            return Err(fail("QEMU never connected the agent socket".into()));
                        }
                        sleep(Duration::from_millis(20));
                    };
                    stream
                        .set_nonblocking(false)
                        .map_err(|e| fail(format!("agent socket: {e}")))?;
                    let mut conn = Conn::new(stream, Some(p.pid), &format!("{} agent", p.name))?;
                    let line = conn.read_line(deadline).map_err(|e| {
                        fail(format!(
                            "no READY from the agent within {} s ({e})",
                            BOOT_TIMEOUT.as_secs()
                        ))
                    })?;
                    let line = String::from_utf8_lossy(&line).into_owned();
                    let Some(release) = line.strip_prefix("READY ") else {
                        return Err(fail(format!("agent greeted with {line:?}, expected READY")));
                    };
                    let boot_time = p.spawned.elapsed();
                    log.write(&format!(
                        "{}: agent ready in {:.2} s ({line})",
                        p.name,
                        boot_time.as_secs_f64()
                    ));
                    Ok(Host {
                        qmp_path: run_dir.join(format!("qmp-{}.sock", p.name)),
                        name: p.name,
                        index: p.index,
                        kernel_release: release.trim().to_string(),
                        boot_time,
                        conn: Some(conn),
                        broken: None,
                        qemu_pid: p.pid,
                        console,
                        next_id: 0,
                        deadline: None,
                        log,
                        launch: p.launch,
                        rebooted: None,
                        console_seen: 0,
                        killed: false,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("boot thread panicked (harness bug)".into()))
            })
            .collect()
    });
    let mut hosts = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(h) => hosts.push(h),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(hosts)
    } else {
        Err(errors.join("\n"))
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Stops every QEMU (QMP `quit`, then signals) and the emulator.
pub fn shutdown(
    children: &mut Children,
    hosts: &[(String, u32, PathBuf)],
    run_dir: &Path,
    results: &Path,
    log: &CmdLog,
    with_emu: bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    if with_emu && children.has(EMU) && !procs::interrupted() {
        // The emulator's view at the end of the run, hosts still attached.
        match emu_control(run_dir, "state") {
            Ok(state) => {
                let _ = fs::write(results.join("emu-state.json"), state + "\n");
            }
            Err(e) => log.write(&format!("emulator state dump failed: {e}")),
        }
    }
    for (name, pid, qmp_path) in hosts {
        let child = format!("qemu-{name}");
        if !children.has(&child) || children.try_status(&child).is_some() {
            continue;
        }
        if procs::interrupted() {
            // No time for courtesy; QMP waits would end at once anyway.
            children.stop(&child, Duration::from_secs(1));
            continue;
        }
        match Qmp::connect(qmp_path, Some(*pid), Duration::from_secs(5))
            .and_then(|mut q| q.execute("quit", None))
        {
            Ok(_) => log.write(&format!("{name}: QMP quit accepted")),
            // QEMU may close the socket before the reply arrives.
            Err(e) => log.write(&format!("{name}: QMP quit: {e}")),
        }
        if children.wait_for(&child, Duration::from_secs(10)).is_none() {
            problems.push(format!("{name}: QEMU ignored QMP quit; killed it"));
            children.stop(&child, Duration::from_secs(2));
        }
    }
    if with_emu && children.has(EMU) {
        match children.stop(EMU, Duration::from_secs(3)) {
            Some(st) => log.write(&format!("emulator ended: {st}")),
            None => problems.push("emulator could not be stopped".into()),
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mgmt_macs_carry_the_link_and_the_end() {
        assert_eq!(mgmt_mac(1, true), "52:54:00:77:01:01");
        assert_eq!(mgmt_mac(1, false), "52:54:00:77:01:02");
        assert_eq!(mgmt_mac(254, false), "52:54:00:77:fe:02");
    }

    #[test]
    fn h0_serves_every_link_and_hosts_reconnect_to_theirs() {
        let dir = Path::new("/tmp/pcifab-test");
        let h0 = mgmt_nic_args(dir, 0, 3).unwrap();
        assert_eq!(
            h0,
            [
                "-netdev",
                "stream,id=mgmt1,server=on,addr.type=unix,addr.path=/tmp/pcifab-test/mgmt-1.sock",
                "-device",
                "virtio-net-pci,id=mgmtnic1,netdev=mgmt1,mac=52:54:00:77:01:01,bus=pcie.0,romfile=",
                "-netdev",
                "stream,id=mgmt2,server=on,addr.type=unix,addr.path=/tmp/pcifab-test/mgmt-2.sock",
                "-device",
                "virtio-net-pci,id=mgmtnic2,netdev=mgmt2,mac=52:54:00:77:02:01,bus=pcie.0,romfile=",
            ]
        );
        let h2 = mgmt_nic_args(dir, 2, 3).unwrap();
        assert_eq!(
            h2,
            [
                "-netdev",
                "stream,id=mgmt2,server=off,reconnect-ms=200,addr.type=unix,\
                 addr.path=/tmp/pcifab-test/mgmt-2.sock",
                "-device",
                "virtio-net-pci,id=mgmtnic2,netdev=mgmt2,mac=52:54:00:77:02:02,bus=pcie.0,romfile=",
            ]
        );
        // One host alone has no link; more hosts than addresses are refused.
        assert!(mgmt_nic_args(dir, 0, 1).unwrap().is_empty());
        assert!(mgmt_nic_args(dir, 0, MGMT_MAX_HOSTS).is_ok());
        assert!(mgmt_nic_args(dir, 0, MGMT_MAX_HOSTS + 1).is_err());
    }
}
