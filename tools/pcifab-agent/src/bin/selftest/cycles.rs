// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest unload-cycles`: load and unload pcifab while files are open, commands are
//! in flight and waiters wait.
//!
//! Each cycle loads the module (`finit_module`, which probes), checks that the MEP is bound to
//! pcifab and that `/dev/pcifab0` answers VERSION, then forks four users of the device: an
//! `EVENTS` waiter without a time limit, a loop of MRPC echoes (slow when the emulator delays
//! commands), a `poll()` waiter without a time limit, and a holder that only keeps the file
//! open. Once each sits in its system call (`/proc/PID/syscall`): unloading the module
//! (`delete_module`, as `rmmod` does) must fail, since open files pin it; the MEP is unbound
//! from pcifab through sysfs (as hot removal does), which must finish within `--rmmod-ms`;
//! every waiter must then end within `--end-ms` with an error (poll: ERR/HUP), the holder's
//! next ioctl must fail with ENODEV; with the files closed the module must unload within
//! `--rmmod-ms`, and nothing of the binding may remain. The first cycle that breaks
//! a rule ends the run with its number; no kernel splat may appear in `/dev/kmsg`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use pcifab_uapi::{self as u, Arg};

use super::args::Args;
use super::ioctl::{fd_ioctl, mrpc_arg, open_fd, ECHO};
use super::kmod::{self, ModuleFile, Traces};
use super::kmsg::Kmsg;
use super::util::{check, errno, errno_name, json_str, num, Res};

pub const USAGE: &str = "\
  unload-cycles --cycles N --module PATH [--first I] [--rmmod-ms MS] [--end-ms MS]
        N times: load the module, check the MEP is bound and /dev/pcifab0 answers, start
        an EVENTS waiter, an echo loop, a poll() waiter and an idle open file; unloading
        must fail (open files pin the module); unbind the MEP through sysfs within
        --rmmod-ms (15000); the waiters end with an error within --end-ms (15000), the idle
        file's next ioctl gets ENODEV; with the files closed the module unloads within
        --rmmod-ms, nothing of the binding remains, no kernel splat; stops at the first
        cycle that breaks a rule
        (cycles are numbered from --first, for batches)
";

/// Default of `--rmmod-ms` and `--end-ms`.
const DEFAULT_WITHIN_MS: &str = "15000";

/// The users of the device each cycle starts, and the system call each blocks in.
const USERS: [(&str, i64); 4] = [
    ("events-wait", libc::SYS_ioctl),
    ("echo-loop", libc::SYS_ioctl),
    ("poll", libc::SYS_poll),
    ("idle-open", libc::SYS_read),
];

fn open_dev() -> Result<i32, i32> {
    open_fd("/dev/pcifab0", libc::O_RDWR)
}

/// What one user saw: "errno NAME" or "revents 0x..".
fn user_work(which: usize, go: i32) -> String {
    let fd = match open_dev() {
        Ok(fd) => fd,
        Err(e) => return format!("open-failed {}", errno_name(e)),
    };
    match which {
        0 => loop {
            let mut ev = u::Events::new();
            if let Err(e) = fd_ioctl(fd, u::PCIFAB_IOCTL_EVENTS, &mut ev) {
                return format!("errno {}", errno_name(e));
            }
            ev.flags = u::EVENTS_WAIT;
            ev.seen = ev.total;
            ev.timeout_ms = 0;
            if let Err(e) = fd_ioctl(fd, u::PCIFAB_IOCTL_EVENTS, &mut ev) {
                return format!("errno {}", errno_name(e));
            }
            // An event came: wait again.
        },
        1 => {
            let input = [0x5au8; 64];
            let mut out = [0u8; 64];
            loop {
                let mut m = mrpc_arg(ECHO, &input, &mut out, 0);
                if let Err(e) = fd_ioctl(fd, u::PCIFAB_IOCTL_MRPC, &mut m) {
                    return format!("errno {}", errno_name(e));
                }
            }
        }
        2 => loop {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN | libc::POLLPRI,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut p, 1, -1) };
            if r < 0 {
                return format!("errno {}", errno_name(errno()));
            }
            if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                return format!("revents {:#x}", p.revents);
            }
            // Events arrived: mark them read and wait again.
            let mut ev = u::Events::new();
            if let Err(e) = fd_ioctl(fd, u::PCIFAB_IOCTL_EVENTS, &mut ev) {
                return format!("errno {}", errno_name(e));
            }
        },
        _ => {
            let mut b = 0u8;
            // SAFETY: one byte into `b`.
            unsafe { libc::read(go, (&mut b as *mut u8).cast(), 1) };
            let mut v = u::Version::new();
            let r = fd_ioctl(fd, u::PCIFAB_IOCTL_VERSION, &mut v);
            // SAFETY: ours.
            let c = unsafe { libc::close(fd) };
            match r {
                Ok(()) => format!("errno ok close {c}"),
                Err(e) => format!("errno {}", errno_name(e)),
            }
        }
    }
}

/// The system call `pid` sits in, if it is blocked in one.
fn in_syscall(pid: i32) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

struct Users {
    pids: Vec<i32>,
    results: i32,
    go: i32,
}

impl Users {
    fn start() -> Res<Users> {
        let mut res = [0i32; 2];
        let mut go = [0i32; 2];
        // SAFETY: room for two descriptors each.
        if unsafe { libc::pipe2(res.as_mut_ptr(), libc::O_CLOEXEC) } != 0
            || unsafe { libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) } != 0
        {
            return Err(check(format!("pipe: {}", errno_name(errno()))));
        }
        let mut pids = Vec::new();
        for (i, (name, _)) in USERS.iter().enumerate() {
            // SAFETY: single-threaded; the child runs its own code and `_exit`s.
            let pid = unsafe { libc::fork() };
            if pid < 0 {
                return Err(check(format!("fork: {}", errno_name(errno()))));
            }
            if pid == 0 {
                // SAFETY: closing the ends the child does not use.
                unsafe {
                    libc::close(res[0]);
                    libc::close(go[1]);
                }
                let line = format!("{name} {}\n", user_work(i, go[0]));
                // SAFETY: one short write (atomic on a pipe), then leave without destructors.
                unsafe {
                    libc::write(res[1], line.as_ptr().cast(), line.len());
                    libc::_exit(0);
                }
            }
            pids.push(pid);
        }
        // SAFETY: the parent's unused ends.
        unsafe {
            libc::close(res[1]);
            libc::close(go[0]);
        }
        Ok(Users {
            pids,
            results: res[0],
            go: go[1],
        })
    }

    /// Waits until every user sits in its system call.
    fn settled(&self, within: Duration) -> Result<(), String> {
        let t = Instant::now();
        let mut seen = [false; USERS.len()];
        while t.elapsed() < within {
            for (i, pid) in self.pids.iter().enumerate() {
                seen[i] |= in_syscall(*pid) == Some(USERS[i].1);
            }
            if seen.iter().all(|s| *s) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let missing: Vec<String> = USERS
            .iter()
            .zip(&self.pids)
            .zip(seen)
            .filter(|(_, s)| !s)
            .map(|((u, pid), _)| {
                format!(
                    "{} (pid {pid}: syscall {})",
                    u.0,
                    std::fs::read_to_string(format!("/proc/{pid}/syscall"))
                        .unwrap_or_else(|e| e.to_string())
                        .trim()
                )
            })
            .collect();
        Err(format!(
            "not blocked in their system call after {} ms: {}",
            within.as_millis(),
            missing.join(", ")
        ))
    }

    /// Lets the idle holder go on, then collects one line per user within `within`.
    fn collect(&self, within: Duration) -> (Vec<String>, Vec<&'static str>) {
        // SAFETY: one byte from a constant.
        unsafe { libc::write(self.go, b"g".as_ptr().cast(), 1) };
        let t = Instant::now();
        let mut buf = Vec::new();
        let mut lines = Vec::new();
        while lines.len() < USERS.len() && t.elapsed() < within {
            let mut p = libc::pollfd {
                fd: self.results,
                events: libc::POLLIN,
                revents: 0,
            };
            let left = within.saturating_sub(t.elapsed()).as_millis() as i32;
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut p, 1, left.max(1)) } <= 0 {
                continue;
            }
            let mut chunk = [0u8; 512];
            // SAFETY: reads into `chunk`.
            let n = unsafe { libc::read(self.results, chunk.as_mut_ptr().cast(), chunk.len()) };
            if n <= 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n as usize]);
            while let Some(i) = buf.iter().position(|&b| b == b'\n') {
                let l: Vec<u8> = buf.drain(..=i).collect();
                lines.push(String::from_utf8_lossy(&l).trim().to_string());
            }
        }
        let hung: Vec<&str> = USERS
            .iter()
            .map(|u| u.0)
            .filter(|n| !lines.iter().any(|l| l.split(' ').next() == Some(n)))
            .collect();
        (lines, hung)
    }

    /// Kills whatever is left and reaps every child.
    fn finish(self) {
        for pid in &self.pids {
            // SAFETY: our children.
            unsafe {
                libc::kill(*pid, libc::SIGKILL);
            }
        }
        for pid in &self.pids {
            let mut st = 0;
            // SAFETY: reaps our child.
            unsafe { libc::waitpid(*pid, &mut st, 0) };
        }
        // SAFETY: ours.
        unsafe {
            libc::close(self.results);
            libc::close(self.go);
        }
    }
}

/// Whether a user's line is the ending the rules ask for.
fn ending_ok(line: &str) -> bool {
    let mut w = line.split(' ');
    let (name, kind, val) = (w.next(), w.next(), w.next().unwrap_or(""));
    match (name, kind) {
        (Some("idle-open"), Some("errno")) => val == "ENODEV",
        (Some("poll"), Some("revents")) => {
            let v = i64::from_str_radix(val.trim_start_matches("0x"), 16).unwrap_or(0);
            v & i64::from(libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
        }
        (Some(_), Some("errno")) => val != "ok" && !val.is_empty(),
        _ => false,
    }
}

/// One cycle; Err says what broke.
fn cycle(
    m: &ModuleFile,
    bdf: &str,
    baseline: &Traces,
    rmmod_within: Duration,
    end_within: Duration,
    endings: &mut BTreeMap<String, u64>,
    rmmod_ms: &mut Vec<u128>,
) -> Result<(), String> {
    m.load()
        .map_err(|e| format!("loading {}: {}", m.path, errno_name(e)))?;
    match kmod::driver_of(bdf) {
        Some(d) if d == kmod::MODULE => {}
        other => {
            return Err(format!(
                "after loading: driver of the MEP {bdf}: expected pcifab, got {}",
                other.unwrap_or_else(|| "none".into())
            ))
        }
    }
    let fd = open_dev().map_err(|e| format!("open /dev/pcifab0: {}", errno_name(e)))?;
    let mut v = u::Version::new();
    let r = fd_ioctl(fd, u::PCIFAB_IOCTL_VERSION, &mut v);
    // SAFETY: ours.
    unsafe { libc::close(fd) };
    r.map_err(|e| format!("VERSION: {}", errno_name(e)))?;
    if v.major != u::VERSION_MAJOR {
        return Err(format!("VERSION major {}", v.major));
    }

    let users = Users::start().map_err(|_| "cannot start the device users".to_string())?;
    if let Err(e) = users.settled(Duration::from_secs(5)) {
        users.finish();
        let _ = kmod::unload_retry(Duration::from_secs(10));
        return Err(format!("device users {e}"));
    }
    // While files are open the module must stay pinned: unloading its code under them would
    // leave the files pointing at freed memory.
    if let Ok(()) = kmod::unload() {
        users.finish();
        return Err(
            "the module unloaded while /dev/pcifab0 was open (expected EBUSY or \
                    EAGAIN: open files must pin it)"
                .to_string(),
        );
    }
    // The endpoint goes away under the open files (as on hot removal): every waiter must end.
    let t = Instant::now();
    let r = std::fs::write("/sys/bus/pci/drivers/pcifab/unbind", bdf);
    let took = t.elapsed();
    rmmod_ms.push(took.as_millis());
    if let Err(e) = r {
        users.finish();
        let _ = kmod::unload_retry(Duration::from_secs(10));
        return Err(format!(
            "unbinding the MEP {bdf} from pcifab with the device open and waiters waiting: \
             {e} after {} ms",
            took.as_millis()
        ));
    }
    let (lines, hung) = users.collect(end_within);
    users.finish();
    // The files are closed: nothing pins the module any more.
    let t = Instant::now();
    let unloaded = kmod::unload_retry(rmmod_within);
    let unload_took = t.elapsed();
    for l in &lines {
        let key = l.split(' ').take(3).collect::<Vec<_>>().join(" ");
        *endings.entry(key).or_default() += 1;
    }
    let mut bad: Vec<String> = lines
        .iter()
        .filter(|l| !ending_ok(l))
        .map(|l| format!("`{l}`"))
        .collect();
    if !hung.is_empty() {
        bad.push(format!(
            "{} did not end within {} ms of the unload (hang)",
            hung.join(", "),
            end_within.as_millis()
        ));
    }
    if took > rmmod_within {
        bad.push(format!(
            "unbinding the MEP took {} ms (at most {} allowed)",
            took.as_millis(),
            rmmod_within.as_millis()
        ));
    }
    if let Err(e) = unloaded {
        bad.push(format!(
            "unloading once the files were closed: {} after {} ms",
            errno_name(e),
            unload_took.as_millis()
        ));
    }
    let left = kmod::leftovers(bdf, baseline, false);
    if !left.is_empty() {
        bad.push(format!("after the unload: {}", left.join("; ")));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "expected waiters to end with an error (poll: ERR/HUP), the idle file's ioctl \
             with ENODEV and nothing left; got {}",
            bad.join(", ")
        ))
    }
}

pub fn cmd_unload_cycles(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let cycles = num("--cycles", a.need("cycles")?)?;
    let first = num("--first", a.get("first").unwrap_or("0"))?;
    let path = a.need("module")?.to_string();
    // The waiters have no time limit and the echo loop never stops, so an unbind (or a
    // waiter's end) that depended on them would not end at all: the bounds only tell an end
    // from a hang, and leave room for the sanitizer kernel on a loaded machine (unbinding the
    // MEP took up to 6.7 s there).
    let rmmod_within = Duration::from_millis(num(
        "--rmmod-ms",
        a.get("rmmod-ms").unwrap_or(DEFAULT_WITHIN_MS),
    )?);
    let end_within = Duration::from_millis(num(
        "--end-ms",
        a.get("end-ms").unwrap_or(DEFAULT_WITHIN_MS),
    )?);
    let mut kmsg = Kmsg::open()?;
    let bdf = kmod::find_mep()?;
    if kmod::loaded() {
        kmod::unload_retry(Duration::from_secs(10)).map_err(|e| {
            check(format!(
                "unloading pcifab before the cycles: {}",
                errno_name(e)
            ))
        })?;
    }
    let baseline = Traces::now(&bdf);
    let left = kmod::leftovers(&bdf, &baseline, false);
    if !left.is_empty() {
        return Err(check(format!(
            "before the first cycle: {}",
            left.join("; ")
        )));
    }
    let m = ModuleFile::open(&path)?;
    let mut endings = BTreeMap::new();
    let mut rmmod_ms = Vec::new();
    let start = Instant::now();
    let mut failure = None;
    let mut done = 0;
    for i in first..first + cycles {
        let _ = std::fs::write("/tmp/unload-cycles.at", format!("{i}\n"));
        let r = cycle(
            &m,
            &bdf,
            &baseline,
            rmmod_within,
            end_within,
            &mut endings,
            &mut rmmod_ms,
        );
        let splat = (kmsg.poll() > 0).then(|| format!("kernel splat: {}", kmsg.first_splats()));
        let why: Vec<String> = r.err().into_iter().chain(splat).collect();
        if !why.is_empty() {
            failure = Some(format!("cycle {i}: {}", why.join("; ")));
            break;
        }
        done += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    // Leave the module loaded, as the other scenarios expect.
    if !kmod::loaded() {
        let _ = m.load();
    }
    let mut ends = String::new();
    for (k, n) in &endings {
        let _ = write!(
            ends,
            "{}{}:{n}",
            if ends.is_empty() { "" } else { "," },
            json_str(k)
        );
    }
    rmmod_ms.sort_unstable();
    println!(
        "{{\"test\":\"unload-cycles\",\"first\":{first},\"cycles\":{cycles},\"completed\":{done},\"secs\":{secs:.1},\
         \"ms_per_cycle\":{:.0},\"rmmod_ms_p50\":{},\"rmmod_ms_max\":{},\"endings\":{{{ends}}},\
         \"splats\":{},\"failure\":{}}}",
        secs * 1000.0 / (done.max(1) as f64),
        rmmod_ms.get(rmmod_ms.len() / 2).copied().unwrap_or(0),
        rmmod_ms.last().copied().unwrap_or(0),
        kmsg.splats.len(),
        failure.as_deref().map_or("null".to_string(), json_str),
    );
    match failure {
        None => Ok(()),
        Some(f) => Err(check(f)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings() {
        assert!(ending_ok("events-wait errno ENODEV"));
        assert!(ending_ok("echo-loop errno EIO"));
        assert!(!ending_ok("echo-loop errno ok"));
        assert!(ending_ok("poll revents 0x18"));
        assert!(!ending_ok("poll revents 0x1"));
        assert!(ending_ok("idle-open errno ENODEV"));
        assert!(!ending_ok("idle-open errno ok close 0"));
        assert!(!ending_ok("idle-open errno EIO"));
        assert!(!ending_ok("events-wait open-failed ENOENT"));
    }
}
