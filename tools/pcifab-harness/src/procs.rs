// SPDX-License-Identifier: GPL-2.0-only
//! Child processes (emulator, QEMUs) that can never outlive the harness.
//!
//! Every child runs in its own process group and gets `PR_SET_PDEATHSIG(SIGKILL)`.
//! [`Children`] kills and reaps all of them on drop, which covers normal exit,
//! `?` returns and panics (unwinding). SIGINT/SIGTERM/SIGHUP set a flag that all
//! waits poll; a second signal kills every child group at once and exits.
//!
//! The parent-death signal is tied to the *thread* that forked, so children must
//! be spawned from the main thread only (worker threads end early).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
const MAX_GROUPS: usize = 64;
static GROUPS: [AtomicI32; MAX_GROUPS] = [const { AtomicI32::new(0) }; MAX_GROUPS];

extern "C" fn on_signal(_sig: libc::c_int) {
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // Second signal: the user insists. Only async-signal-safe calls here.
        for g in &GROUPS {
            let pgid = g.load(Ordering::SeqCst);
            if pgid > 0 {
                // SAFETY: kill(2) is async-signal-safe; pgid is a child's group.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
            }
        }
        // SAFETY: _exit(2) is async-signal-safe and never returns.
        unsafe { libc::_exit(130) };
    }
}

/// Installs the SIGINT/SIGTERM/SIGHUP handler.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is valid; we set a plain handler that only
        // touches atomics and async-signal-safe syscalls.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// True once SIGINT/SIGTERM/SIGHUP arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Error text for an interrupted wait.
pub const INTERRUPTED_MSG: &str = "interrupted by signal; shutting down";

/// True if process `pid` has exited (without reaping it).
pub fn has_exited(pid: u32) -> bool {
    // SAFETY: siginfo_t is plain data; zeroed is valid for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; WNOHANG|WNOWAIT neither blocks nor reaps.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r != 0 {
        // ECHILD: not (or no longer) a child of ours: reaped already, so it has exited.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
    }
    // SAFETY: waitid filled `info` (or left it zeroed, giving pid 0).
    (unsafe { info.si_pid() }) != 0
}

struct Proc {
    name: String,
    child: Child,
    done: Option<ExitStatus>,
}

/// Owner of every child process; kills and reaps them all on drop.
#[derive(Default)]
pub struct Children {
    procs: Vec<Proc>,
}

impl Children {
    /// Spawns `cmd` in its own process group with a parent-death SIGKILL.
    /// Returns the child's pid.
    pub fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<u32, String> {
        self.spawn_with(name, cmd, |_| {})
    }

    /// Like [`Children::spawn`]; `take` may take the child's pipes first.
    pub fn spawn_with(
        &mut self,
        name: &str,
        cmd: &mut Command,
        take: impl FnOnce(&mut Child),
    ) -> Result<u32, String> {
        let mut child = spawn_guarded(name, cmd)?;
        let pid = child.id();
        take(&mut child);
        self.procs.push(Proc {
            name: name.to_string(),
            child,
            done: None,
        });
        Ok(pid)
    }

    /// True if a child of that name was started.
    pub fn has(&self, name: &str) -> bool {
        self.procs.iter().any(|p| p.name == name)
    }

    fn find(&mut self, name: &str) -> Option<&mut Proc> {
        self.procs.iter_mut().find(|p| p.name == name)
    }

    /// Exit status of `name` if it has exited (reaps it).
    pub fn try_status(&mut self, name: &str) -> Option<ExitStatus> {
        let p = self.find(name)?;
        if p.done.is_none() {
            if let Ok(Some(st)) = p.child.try_wait() {
                p.done = Some(st);
                forget_group(p.child.id());
            }
        }
        p.done
    }

    /// Waits up to `timeout` for `name` to exit by itself.
    pub fn wait_for(&mut self, name: &str, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.try_status(name) {
                return Some(st);
            }
            if start.elapsed() >= timeout {
                return None;
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM to the group, then SIGKILL after `grace`; reaps. Returns how it ended.
    pub fn stop(&mut self, name: &str, grace: Duration) -> Option<ExitStatus> {
        if let Some(st) = self.try_status(name) {
            return Some(st);
        }
        let pid = self.find(name)?.child.id() as i32;
        // SAFETY: signals the process group we created for this child.
        unsafe { libc::kill(-pid, libc::SIGTERM) };
        if let Some(st) = self.wait_for(name, grace) {
            return Some(st);
        }
        let p = self.find(name)?;
        kill_and_reap(p);
        p.done
    }
}

/// Spawns `cmd` in its own process group with a parent-death SIGKILL and registers the
/// group, so a second signal kills it too. Must run on the main thread (the death signal
/// follows the thread that forked). The caller owns the child: reap it, or [`kill_group`].
pub fn spawn_guarded(name: &str, cmd: &mut Command) -> Result<Child, String> {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: gettid has no preconditions.
    if unsafe { libc::gettid() } != parent {
        return Err(format!(
            "cannot start {name} from a worker thread: its parent-death signal would fire \
             when the thread ends (harness bug)"
        ));
    }
    cmd.process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe syscalls (prctl, getppid, _exit); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| {
        format!(
            "cannot start {name} ({:?}): {e}; check the path and that it is executable",
            cmd.get_program()
        )
    })?;
    let pid = child.id();
    for g in &GROUPS {
        if g.compare_exchange(0, pid as i32, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            break;
        }
    }
    Ok(child)
}

/// SIGKILL to the process group of `pid` (a child started in its own group); does not reap.
pub fn kill_group(pid: u32) {
    // SAFETY: signals a process group one of our children leads; ESRCH is harmless.
    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
}

/// Kills a child started with [`spawn_guarded`] (its whole group) and reaps it.
pub fn kill_and_reap_child(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        forget_group(child.id());
        return;
    }
    kill_group(child.id());
    let _ = child.wait();
    forget_group(child.id());
}

fn forget_group(pid: u32) {
    for g in &GROUPS {
        let _ = g.compare_exchange(pid as i32, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

fn kill_and_reap(p: &mut Proc) {
    let pid = p.child.id() as i32;
    if p.done.is_none() {
        // SAFETY: signals the process group we created for this child; the
        // group still exists because the leader has not been reaped.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        p.done = p.child.wait().ok();
    } else {
        // The leader is gone; stragglers of its group (if any) still go.
        // SAFETY: as above; ESRCH is harmless.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    forget_group(pid as u32);
}

impl Drop for Children {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            kill_and_reap(p);
        }
    }
}

/// Every thread of a process held on one CPU; each thread's former CPU set comes back on
/// drop (a thread started meanwhile inherits its creator's single CPU and keeps it). For the P2P benchmark: the emulator's DMA engine thread then copies on the core its
/// memcpy floor is measured on, instead of being moved between cores whenever a guest's
/// timer wakes QEMU (which the floor, measured with the guests idle, never sees).
pub struct PinnedThreads {
    saved: Vec<(libc::pid_t, libc::cpu_set_t)>,
    pub cpu: usize,
}

impl PinnedThreads {
    /// Pins every thread of `pid` to the highest CPU this process may run on. `Ok(None)` on
    /// a machine with one CPU (nothing to choose).
    pub fn new(pid: u32) -> Result<Option<Self>, String> {
        // SAFETY: a zeroed cpu_set_t is a valid, empty set.
        let mut mine: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `mine` is a valid cpu_set_t of the size passed.
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut mine) }
            != 0
        {
            return Err(format!(
                "sched_getaffinity: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: CPU_ISSET reads the set; every index is below CPU_SETSIZE.
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &mine) })
            .collect();
        let (Some(&cpu), true) = (cpus.last(), cpus.len() > 1) else {
            return Ok(None);
        };
        // SAFETY: a zeroed cpu_set_t is a valid, empty set.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` came from the set above, so it is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut one) };
        let dir = format!("/proc/{pid}/task");
        let tasks = std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))?;
        let mut pinned = PinnedThreads {
            saved: Vec::new(),
            cpu,
        };
        for t in tasks {
            let t = t.map_err(|e| format!("{dir}: {e}"))?;
            let Some(tid) = t
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<libc::pid_t>().ok())
            else {
                continue;
            };
            // SAFETY: as above.
            let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::cpu_set_t>();
            // SAFETY: `old` is a valid cpu_set_t of the size passed; a thread that ended
            // meanwhile makes the call fail (ESRCH), and it is skipped.
            if unsafe { libc::sched_getaffinity(tid, size, &mut old) } != 0 {
                continue;
            }
            // SAFETY: `one` is a valid cpu_set_t of the size passed.
            if unsafe { libc::sched_setaffinity(tid, size, &one) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ESRCH) {
                    continue;
                }
                return Err(format!(
                    "sched_setaffinity of thread {tid} of pid {pid}: {e}"
                ));
            }
            pinned.saved.push((tid, old));
        }
        Ok(Some(pinned))
    }

    /// Threads pinned.
    pub fn threads(&self) -> usize {
        self.saved.len()
    }
}

impl Drop for PinnedThreads {
    fn drop(&mut self) {
        for (tid, old) in &self.saved {
            // SAFETY: `old` is the valid set read before; a thread that ended is ESRCH.
            unsafe { libc::sched_setaffinity(*tid, std::mem::size_of::<libc::cpu_set_t>(), old) };
        }
    }
}

#[cfg(test)]
mod pin_tests {
    use super::PinnedThreads;

    fn allowed(pid: u32) -> String {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// A child's threads are held on the highest CPU while pinned and get their CPU set
    /// back on drop.
    #[test]
    fn pins_and_restores() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let before = allowed(child.id());
        match PinnedThreads::new(child.id()).unwrap() {
            Some(p) => {
                assert_eq!(p.threads(), 1);
                assert_eq!(allowed(child.id()), p.cpu.to_string());
                drop(p);
                assert_eq!(allowed(child.id()), before);
            }
            // One CPU: nothing to pin, and nothing changed.
            None => assert_eq!(allowed(child.id()), before),
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// CPU time (user + system, seconds) that process `pid` has used so far, from
/// `/proc/PID/stat`; `None` once it is gone or the file does not parse.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_seconds(&stat, clock_ticks())
}

/// Clock ticks per second of `/proc/PID/stat`'s times.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; no pointer is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a `/proc/PID/stat` line in seconds. The command name (field 2) is in
/// parentheses and may hold spaces, so the fields are counted after its closing one.
fn parse_cpu_seconds(stat: &str, ticks: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    // After the name: state (3), ppid, pgrp, session, tty_nr, tpgid, flags, minflt,
    // cminflt, majflt, cmajflt, utime (14), stime (15).
    let utime: u64 = f.nth(11)?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime.checked_add(stime)? as f64 / ticks)
}

#[cfg(test)]
mod cpu_tests {
    use super::parse_cpu_seconds;

    #[test]
    fn cpu_seconds_are_utime_plus_stime_after_a_name_with_spaces() {
        let stat = "4242 (qemu system x86) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0";
        assert_eq!(parse_cpu_seconds(stat, 100.0), Some(3.0));
        assert_eq!(parse_cpu_seconds("4242 (x) S 1", 100.0), None);
    }
}
