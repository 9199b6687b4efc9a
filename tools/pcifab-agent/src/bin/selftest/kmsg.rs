// SPDX-License-Identifier: GPL-2.0-only
//! Kernel log watcher of `pcifab-selftest`: the splat lines `/dev/kmsg` gained since it was
//! opened.
//!
//! A reader of `/dev/kmsg` gets one record per `read()`; opening it and seeking to the end
//! skips what was logged before. A record that the ring buffer overwrote before it was read
//! makes `read()` fail once with `EPIPE`; those are counted as lost.

use super::util::{check, errno, errno_name, Res};

/// Message fragments that mark a kernel splat (warnings, bugs, sanitizers, lockdep, hangs,
/// leaks). A bare "Call Trace" is not one: the kernel dumps the stack for reports that are no
/// bug, such as an allocation failure that fault injection caused; every splat above has
/// its own first line.
pub const SPLAT_MARKS: &[&str] = &[
    "BUG:",
    "WARNING:",
    "KASAN",
    "UBSAN",
    "KFENCE",
    "kernel BUG",
    "Oops",
    "general protection fault",
    "possible circular locking",
    "possible recursive locking",
    "inconsistent lock state",
    "lockdep",
    "INFO: task",
    "rcu: INFO",
    "refcount_t:",
    "list_add corruption",
    "list_del corruption",
    "Kernel panic",
    // kmemleak's leak reports, and kmemleak switching itself off (which would blind the
    // run's leak scans). Not its "Cannot allocate a scan area" warning: under injected
    // allocation failures it scans the whole object instead, and still finds every leak.
    "new suspected memory leak",
    "memory leak detector disabled",
    "Cannot allocate a kmemleak_object",
    "stack-protector",
    "double free",
    "use-after-free",
    "unreferenced object",
];

/// Whether a kernel message is part of a splat.
pub fn is_splat(msg: &str) -> bool {
    SPLAT_MARKS.iter().any(|m| msg.contains(m))
}

/// `/dev/kmsg`, read from where it stood when opened.
pub struct Kmsg {
    fd: i32,
    /// Splat lines seen so far (message text only).
    pub splats: Vec<String>,
    /// Records the ring buffer overwrote before they were read.
    pub lost: u64,
    /// Records read.
    pub records: u64,
    /// Lines that contain [`Kmsg::watch`], when it is set.
    pub watched: Vec<String>,
    /// A text whose lines `poll` keeps in [`Kmsg::watched`].
    pub watch: Option<String>,
}

impl Kmsg {
    /// Opens `/dev/kmsg` and skips everything logged so far. Needs the right to read the log
    /// (root, or `dmesg_restrict` 0); the descriptor keeps working after privileges drop.
    pub fn open() -> Res<Kmsg> {
        // SAFETY: a constant NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c"/dev/kmsg".as_ptr(),
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(check(format!(
                "cannot open /dev/kmsg: {} (needed to count kernel splats)",
                errno_name(errno())
            )));
        }
        // SAFETY: `fd` is open.
        if unsafe { libc::lseek(fd, 0, libc::SEEK_END) } < 0 {
            let e = errno();
            // SAFETY: ours.
            unsafe { libc::close(fd) };
            return Err(check(format!("lseek /dev/kmsg: {}", errno_name(e))));
        }
        Ok(Kmsg {
            fd,
            splats: Vec::new(),
            lost: 0,
            records: 0,
            watched: Vec::new(),
            watch: None,
        })
    }

    /// Reads every record logged since the last call; returns how many new splat lines came.
    pub fn poll(&mut self) -> usize {
        let before = self.splats.len();
        let mut buf = vec![0u8; 8192];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                match errno() {
                    libc::EPIPE => {
                        self.lost += 1;
                        continue;
                    }
                    libc::EINTR => continue,
                    _ => break,
                }
            }
            if n == 0 {
                break;
            }
            self.records += 1;
            let rec = String::from_utf8_lossy(&buf[..n as usize]);
            // "prio,seq,usec,flags;message\n" then " KEY=value" continuation lines.
            let msg = rec
                .split_once(';')
                .map(|(_, m)| m)
                .unwrap_or(&rec)
                .lines()
                .next()
                .unwrap_or("");
            if is_splat(msg) {
                self.splats.push(msg.to_string());
            }
            if self.watch.as_deref().is_some_and(|w| msg.contains(w)) {
                self.watched.push(msg.to_string());
            }
        }
        self.splats.len() - before
    }

    /// The first five splat lines, for a failure message.
    pub fn first_splats(&self) -> String {
        self.splats
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

impl Drop for Kmsg {
    fn drop(&mut self) {
        // SAFETY: ours, closed once.
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splat_marks() {
        assert!(is_splat(
            "WARNING: CPU: 0 PID: 1 at drivers/x.c:1 f+0x1/0x2"
        ));
        assert!(is_splat("BUG: KASAN: slab-use-after-free in foo"));
        assert!(is_splat(
            "WARNING: possible circular locking dependency detected"
        ));
        assert!(is_splat(
            "unreferenced object 0xffff888003f1c000 (size 64):"
        ));
        assert!(!is_splat(
            "pcifab 0000:02:00.1: switch 0x4228 firmware 04070041"
        ));
        assert!(!is_splat("pcifab: warning about nothing"));
        assert!(!is_splat("Call Trace:"));
        assert!(!is_splat("insmod: vmalloc error: size 4096, page order 0"));
        assert!(is_splat(
            "kmemleak: 2 new suspected memory leaks (see /sys/kernel/debug/kmemleak)"
        ));
        assert!(is_splat("kmemleak: Kernel memory leak detector disabled"));
        assert!(!is_splat(
            "kmemleak: Cannot allocate a scan area, scanning the full object"
        ));
    }
}
