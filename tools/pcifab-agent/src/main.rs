// SPDX-License-Identifier: GPL-2.0-only
//! pcifab-agent: the guest half of the test harness's command channel.
//!
//! Runs as PID 1 of the test initramfs (exec'd by `/init`). It finds the
//! virtio-serial port named `pcifab-agent`, announces itself with
//! `READY <kernel release>\n` and then serves requests, one at a time:
//!
//! ```text
//! harness -> agent:  RUN <id> <timeout_ms> <len>\n<len bytes of /bin/sh script>
//! agent -> harness:  DONE <id> <exit code, -1 on timeout/signal> <len>\n<len bytes of output>
//! agent -> harness:  ERR <text>\n            (protocol error; the agent keeps serving)
//! harness -> agent:  PING\n   agent -> harness: PONG\n
//! ```
//!
//! stdout and stderr of the script are merged. On timeout the script's whole
//! process group gets SIGKILL. The agent never exits on bad input: if PID 1
//! exits, the guest kernel panics.

use std::ffi::CStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Name of the virtserialport the harness attaches (`-device virtserialport,name=...`).
const PORT_NAME: &str = "pcifab-agent";
/// Longest request header accepted.
const MAX_HEADER: usize = 512;
/// Largest script accepted.
const MAX_SCRIPT: usize = 4 << 20;
/// Output kept per command; the rest is dropped with a note.
const MAX_OUTPUT: usize = 16 << 20;
/// How long to wait for a killed process group to be reaped.
const KILL_GRACE: Duration = Duration::from_secs(3);
/// Longest single wait for a script's output or end (the timeout is checked after each).
const POLL_MAX: Duration = Duration::from_secs(1);
const PATH_ENV: &str = "/sbin:/usr/sbin:/bin:/usr/bin";

fn log(msg: &str) {
    // stderr is /dev/console (the serial console) when run from /init.
    eprintln!("pcifab-agent: {msg}");
}

fn kernel_release() -> String {
    // SAFETY: `utsname` is plain old data; all-zero is a valid value.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable `utsname` for the duration of the call.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return "unknown".into();
    }
    // SAFETY: the kernel NUL-terminates `release`, which lives as long as `uts`.
    let rel = unsafe { CStr::from_ptr(uts.release.as_ptr()) };
    rel.to_string_lossy().into_owned()
}

/// Finds `/dev/<vportNpM>` whose sysfs name is `pcifab-agent`.
fn find_port() -> Option<PathBuf> {
    let dir = fs::read_dir("/sys/class/virtio-ports").ok()?;
    for entry in dir.flatten() {
        let name = fs::read_to_string(entry.path().join("name")).unwrap_or_default();
        if name.trim() == PORT_NAME {
            return Some(PathBuf::from("/dev").join(entry.file_name()));
        }
    }
    None
}

fn open_port() -> File {
    let start = Instant::now();
    let mut next_note = Duration::from_secs(5);
    loop {
        if let Some(path) = find_port() {
            match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(f) => {
                    log(&format!("using {}", path.display()));
                    return f;
                }
                Err(e) => {
                    if start.elapsed() >= next_note {
                        log(&format!("cannot open {}: {e}; retrying", path.display()));
                    }
                }
            }
        }
        if start.elapsed() >= next_note {
            log(&format!(
                "still no virtio port named {PORT_NAME} after {} s \
                 (is CONFIG_VIRTIO_CONSOLE set and the virtserialport attached?)",
                start.elapsed().as_secs()
            ));
            next_note += Duration::from_secs(10);
        }
        sleep(Duration::from_millis(20));
    }
}

/// Reaps every exited child (PID 1 inherits orphans). Returns the wait
/// status of `pid` if it was among them.
fn reap(pid: libc::pid_t) -> Option<i32> {
    let mut found = None;
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if r <= 0 {
            return found;
        }
        if r == pid {
            found = Some(status);
        }
    }
}

/// A descriptor that polls readable once the child `pid` (not yet reaped) has exited
/// (`pidfd_open(2)`, Linux 5.3); `None` if the kernel has none.
fn pidfd(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it has no
    // memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just returned this fresh descriptor (close-on-exec); we own it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own; failure only leaves it blocking.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

/// Reads what is available without blocking. Returns false at EOF.
fn drain(fd: &mut File, out: &mut Vec<u8>, dropped: &mut usize) -> bool {
    let mut buf = [0u8; 8192];
    loop {
        match fd.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => {
                let room = MAX_OUTPUT.saturating_sub(out.len());
                let keep = n.min(room);
                out.extend_from_slice(&buf[..keep]);
                *dropped += n - keep;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return true, // EAGAIN: nothing more for now
        }
    }
}

/// Runs `script` under `/bin/sh -c`, output merged, bounded by `timeout`.
fn run_script(script: &[u8], timeout: Duration) -> (i64, Vec<u8>) {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let e = io::Error::last_os_error();
        return (
            -1,
            format!("[pcifab-agent: pipe2 failed: {e}]\n").into_bytes(),
        );
    }
    // SAFETY: pipe2 just returned these two fresh descriptors; we own them.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let script = String::from_utf8_lossy(script).into_owned();
    let spawned = {
        let wr2 = match wr.try_clone() {
            Ok(f) => f,
            Err(e) => {
                return (
                    -1,
                    format!("[pcifab-agent: dup failed: {e}]\n").into_bytes(),
                )
            }
        };
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(&script)
            .env("PATH", PATH_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::from(wr))
            .stderr(Stdio::from(wr2))
            .process_group(0);
        cmd.spawn()
        // `cmd` drops here and closes our copies of the write end.
    };
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return (
                -1,
                format!("[pcifab-agent: cannot start /bin/sh: {e}]\n").into_bytes(),
            )
        }
    };
    let pid = child.id() as libc::pid_t;
    let mut reader = File::from(rd);
    set_nonblocking(reader.as_raw_fd());

    // Readable once the script has exited, so its end is seen at once, not at the next
    // look; without pidfds (Linux < 5.3) the loop looks every 20 ms (10 once the output
    // has closed).
    let exited = pidfd(pid);
    let start = Instant::now();
    let mut out = Vec::new();
    let mut dropped = 0usize;
    let mut open = true;
    let status = loop {
        let mut pfds = Vec::with_capacity(2);
        if open {
            pfds.push(libc::pollfd {
                fd: reader.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if let Some(p) = &exited {
            pfds.push(libc::pollfd {
                fd: p.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if pfds.is_empty() {
            sleep(Duration::from_millis(10));
        } else {
            // Without a pidfd only the output wakes the poll: look for the end every 20 ms.
            let most = if exited.is_some() {
                POLL_MAX
            } else {
                Duration::from_millis(20)
            };
            let wait = timeout.saturating_sub(start.elapsed()).min(most);
            let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: `pfds` holds `pfds.len()` (at most 2) valid pollfds on descriptors
            // this function owns; the timeout is bounded.
            unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        }
        if open {
            open = drain(&mut reader, &mut out, &mut dropped);
        }
        if let Some(st) = reap(pid) {
            // Whatever is still buffered in the pipe belongs to the output.
            drain(&mut reader, &mut out, &mut dropped);
            break Some(st);
        }
        if start.elapsed() >= timeout {
            break None;
        }
    };
    let code = match status {
        Some(st) if libc::WIFEXITED(st) => i64::from(libc::WEXITSTATUS(st)),
        Some(st) => {
            let sig = libc::WTERMSIG(st);
            out.extend_from_slice(format!("\n[pcifab-agent: killed by signal {sig}]\n").as_bytes());
            -1
        }
        None => {
            // SAFETY: signals the process group we created for this child.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            let killed_at = Instant::now();
            let mut reaped = false;
            while killed_at.elapsed() < KILL_GRACE {
                if reap(pid).is_some() {
                    reaped = true;
                    break;
                }
                sleep(Duration::from_millis(10));
            }
            drain(&mut reader, &mut out, &mut dropped);
            let note = if reaped {
                format!(
                    "\n[pcifab-agent: timed out after {} ms; process group killed]\n",
                    timeout.as_millis()
                )
            } else {
                format!(
                    "\n[pcifab-agent: timed out after {} ms; process did not die after SIGKILL \
                     (stuck in the kernel?)]\n",
                    timeout.as_millis()
                )
            };
            out.extend_from_slice(note.as_bytes());
            -1
        }
    };
    if dropped > 0 {
        out.extend_from_slice(
            format!("\n[pcifab-agent: {dropped} output bytes dropped]\n").as_bytes(),
        );
    }
    (code, out)
}

/// The serial port, read through a buffer; EOF (host not connected) is
/// waited out, never fatal.
struct Port {
    rd: BufReader<File>,
    wr: File,
}

impl Port {
    fn fill(&mut self) -> &[u8] {
        loop {
            match self.rd.fill_buf() {
                Ok([]) => sleep(Duration::from_millis(100)), // host side not connected
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log(&format!("read error on port: {e}; retrying"));
                    sleep(Duration::from_millis(500));
                }
            }
        }
        // The loop above leaves data buffered; this call returns it without I/O.
        self.rd.fill_buf().unwrap_or(&[])
    }

    /// Reads one header line. `Err` carries a protocol complaint (line too long).
    fn read_line(&mut self) -> Result<Vec<u8>, String> {
        let mut line = Vec::new();
        let mut overflow = false;
        loop {
            let buf = self.fill();
            let (take, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            if !overflow {
                line.extend_from_slice(&buf[..take]);
                if line.len() > MAX_HEADER {
                    overflow = true;
                    line.clear();
                }
            }
            self.rd.consume(take);
            if done {
                break;
            }
        }
        if overflow {
            return Err(format!("header longer than {MAX_HEADER} bytes"));
        }
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Ok(line)
    }

    fn read_exact(&mut self, len: usize, keep: bool) -> Vec<u8> {
        let mut data = Vec::with_capacity(if keep { len } else { 0 });
        let mut left = len;
        while left > 0 {
            let buf = self.fill();
            let n = buf.len().min(left);
            if keep {
                data.extend_from_slice(&buf[..n]);
            }
            self.rd.consume(n);
            left -= n;
        }
        data
    }

    fn send(&mut self, data: &[u8]) {
        loop {
            match self.wr.write_all(data).and_then(|()| self.wr.flush()) {
                Ok(()) => return,
                Err(e) => {
                    log(&format!("write to port failed: {e}; retrying"));
                    sleep(Duration::from_millis(200));
                }
            }
        }
    }

    fn err(&mut self, text: &str) {
        let text = text.replace('\n', " ");
        self.send(format!("ERR {text}\n").as_bytes());
    }
}

fn serve(port: &mut Port) {
    loop {
        let line = match port.read_line() {
            Ok(l) => l,
            Err(e) => {
                port.err(&e);
                continue;
            }
        };
        let line = String::from_utf8_lossy(&line).into_owned();
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["PING"] => port.send(b"PONG\n"),
            ["RUN", id, timeout, len] => {
                let (Ok(timeout_ms), Ok(len)) = (timeout.parse::<u64>(), len.parse::<usize>())
                else {
                    port.err(&format!(
                        "bad RUN header {line:?}: want RUN <id> <timeout_ms> <len>"
                    ));
                    continue;
                };
                if len > MAX_SCRIPT {
                    port.read_exact(len, false);
                    port.err(&format!("script of {len} bytes exceeds {MAX_SCRIPT}"));
                    continue;
                }
                let script = port.read_exact(len, true);
                let (code, out) = run_script(&script, Duration::from_millis(timeout_ms));
                let mut reply = format!("DONE {id} {code} {}\n", out.len()).into_bytes();
                reply.extend_from_slice(&out);
                port.send(&reply);
            }
            _ => port.err(&format!(
                "unknown request {line:?}: want RUN <id> <timeout_ms> <len> or PING"
            )),
        }
    }
}

/// The command line: nothing but --help and --version (`/init` execs the agent without
/// arguments).
#[derive(clap::Parser, Debug)]
#[command(
    name = "pcifab-agent",
    version,
    about = "The guest half of pcifab-harness's command channel",
    long_about = "The guest half of pcifab-harness's command channel: runs as PID 1 of the \
                  test initramfs, finds the virtio-serial port named pcifab-agent, announces \
                  itself with `READY <kernel release>` and runs the harness's scripts \
                  (RUN <id> <timeout_ms> <len>, PING) one at a time \
                  (Documentation/testing.rst)."
)]
struct Cli {}

fn main() {
    if let Err(e) = <Cli as clap::Parser>::try_parse() {
        // As PID 1 the agent must not exit (the guest kernel would panic), not even for
        // --help or --version: it says what it was given and serves anyway.
        if std::process::id() != 1 {
            e.exit();
        }
        log(&format!("ignoring the command line: {e}"));
    }
    let file = open_port();
    let wr = match file.try_clone() {
        Ok(f) => f,
        Err(e) => {
            // Cannot happen short of fd exhaustion; keep PID 1 alive regardless.
            log(&format!("cannot duplicate port descriptor: {e}"));
            loop {
                sleep(Duration::from_secs(3600));
            }
        }
    };
    let mut port = Port {
        rd: BufReader::with_capacity(64 * 1024, file),
        wr,
    };
    let ready = format!("READY {}\n", kernel_release());
    port.send(ready.as_bytes());
    log("ready");
    serve(&mut port);
}
