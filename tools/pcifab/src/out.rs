// SPDX-License-Identifier: GPL-2.0-only

//! What `pcifab` prints: errors (text on stderr, or one JSON object on stdout with --json),
//! results with their JSON schema name, and progress of long operations.

use std::{
    fmt,
    io::{IsTerminal, Write},
    sync::mpsc::{self, RecvTimeoutError},
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Map, Value};

/// Exit code of a failed operation.
pub const EXIT_FAILED: u8 = 1;
/// Exit code of a wrong command line.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of an operation the fabric or the manager refused.
pub const EXIT_REFUSED: u8 = 3;

/// The version of every schema this tool prints (`pcifab/<command>/v1`).
pub const SCHEMA_VERSION: u32 = 1;

/// The schema name of a command's output.
pub fn schema(command: &str) -> String {
    format!("pcifab/{command}/v{SCHEMA_VERSION}")
}

/// An error for the user: what went wrong and, where known, what to do.
#[derive(Debug)]
pub struct Error {
    pub msg: String,
    /// The exit code.
    pub exit: u8,
    /// The errno of the failed call, if one failed.
    pub errno: Option<i32>,
    /// A short code for scripts when there is no errno: "usage", "refused", "firmware",
    /// "failed".
    pub kind: &'static str,
    /// What the failed call reported besides the errno (firmware code, bytes done...).
    pub details: Map<String, Value>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl Error {
    /// The code scripts match on: the errno's name, else the kind.
    pub fn code(&self) -> String {
        match self.errno {
            Some(n) if self.kind != BUSY => errno_name(n),
            _ => self.kind.to_string(),
        }
    }

    /// With the errno of `e`.
    pub fn errno(mut self, e: &std::io::Error) -> Self {
        self.errno = e.raw_os_error();
        self
    }

    /// With one more detail.
    pub fn detail(mut self, key: &str, v: Value) -> Self {
        self.details.insert(key.into(), v);
        self
    }

    /// The error as the JSON object of `pcifab/error/v1`.
    pub fn json(&self, command: &str) -> Value {
        let mut e = json!({
            "code": self.code(),
            "errno": self.errno,
            "message": self.msg,
        });
        for (k, v) in &self.details {
            e[k] = v.clone();
        }
        json!({
            "schema": schema("error"),
            "ok": false,
            "command": command,
            "exit_code": self.exit,
            "error": e,
        })
    }
}

pub fn usage_error(msg: impl Into<String>) -> Error {
    Error {
        msg: msg.into(),
        exit: EXIT_USAGE,
        errno: None,
        kind: "usage",
        details: Map::new(),
    }
}

pub fn failure(msg: impl Into<String>) -> Error {
    Error {
        msg: msg.into(),
        exit: EXIT_FAILED,
        errno: None,
        kind: "failed",
        details: Map::new(),
    }
}

/// The code of [`busy`]: it names itself over its errno.
pub const BUSY: &str = "busy";

/// This tool refused to take a function away from this host: its block devices are in use
/// (errno EBUSY, code `busy`, exit 3).
pub fn busy(msg: impl Into<String>) -> Error {
    Error {
        msg: msg.into(),
        exit: EXIT_REFUSED,
        errno: Some(libc::EBUSY),
        kind: BUSY,
        details: Map::new(),
    }
}

pub fn refused(msg: impl Into<String>) -> Error {
    Error {
        msg: msg.into(),
        exit: EXIT_REFUSED,
        errno: None,
        kind: "refused",
        details: Map::new(),
    }
}

/// The symbolic name of an errno (`EPERM`), or `E<n>` for one this tool does not name.
pub fn errno_name(n: i32) -> String {
    let name = match n {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENOTTY => "ENOTTY",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ERANGE => "ERANGE",
        libc::ENOSYS => "ENOSYS",
        libc::ENOLINK => "ENOLINK",
        libc::EPROTO => "EPROTO",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::EPIPE => "EPIPE",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EREMOTEIO => "EREMOTEIO",
        libc::ECANCELED => "ECANCELED",
        _ => return format!("E{n}"),
    };
    name.to_string()
}

/// Prints a result: `v` with `"schema"` and `"ok": true` added, as one line.
pub fn emit(command: &str, v: Value) {
    let mut o = Map::new();
    o.insert("schema".into(), json!(schema(command)));
    o.insert("ok".into(), json!(true));
    if let Value::Object(m) = v {
        for (k, v) in m {
            if k != "ok" {
                o.insert(k, v);
            }
        }
    }
    println!("{}", Value::Object(o));
    let _ = std::io::stdout().flush();
}

/// `t` as UTC `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Progress of a long operation on stderr: on a terminal one live line (elapsed time,
/// redrawn ten times a second and erased at the end); otherwise one timestamped line when
/// it starts and one a second while it runs. Nothing with --json.
pub struct Progress {
    /// Dropped to stop the thread: its wait for the next redraw ends at once.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    pub fn start(what: String, quiet: bool) -> Self {
        if quiet {
            return Self {
                stop: None,
                thread: None,
            };
        }
        Self::start_on(
            what,
            std::io::stderr().is_terminal(),
            Box::new(std::io::stderr()),
        )
    }

    /// Shows progress on `out`, a terminal if `tty`.
    fn start_on(what: String, tty: bool, mut out: Box<dyn Write + Send>) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        if !tty {
            let _ = writeln!(out, "{} {what}...", rfc3339(SystemTime::now()));
        }
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut shown = 0;
            let mut drawn = false;
            // Redraws every tenth of a second until the sender is dropped.
            while let Err(RecvTimeoutError::Timeout) =
                stopped.recv_timeout(Duration::from_millis(100))
            {
                let el = start.elapsed();
                if tty {
                    // The first tenth of a second shows nothing: quick calls stay quiet.
                    let _ = write!(out, "\r{what}: {:.1} s\x1b[K", el.as_secs_f64());
                    drawn = true;
                } else if el.as_secs() > shown {
                    shown = el.as_secs();
                    let _ = writeln!(out, "{} {what}: {shown} s", rfc3339(SystemTime::now()));
                }
                let _ = out.flush();
            }
            if drawn {
                let _ = write!(out, "\r\x1b[K");
                let _ = out.flush();
            }
        });
        Self {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096); // leap day 2024
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56Z");
    }

    /// A writer whose bytes the test can read.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
        }
    }

    #[test]
    fn progress_is_timestamped_lines_off_a_terminal() {
        let buf = Shared::default();
        let p = Progress::start_on("binding 0x0300".into(), false, Box::new(buf.clone()));
        std::thread::sleep(Duration::from_millis(1250));
        drop(p);
        let t = buf.text();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t:?}");
        assert!(lines[0].ends_with("Z binding 0x0300..."), "{t:?}");
        assert!(lines[1].ends_with("Z binding 0x0300: 1 s"), "{t:?}");
        assert!(!t.contains('\r') && !t.contains('\x1b'), "{t:?}");
    }

    /// The operation's end is not held up by the thread's wait for its next redraw.
    #[test]
    fn progress_ends_at_once() {
        for tty in [false, true] {
            let p = Progress::start_on("x".into(), tty, Box::new(Shared::default()));
            // Mid-wait: 80 ms before the next redraw.
            std::thread::sleep(Duration::from_millis(120));
            let t = Instant::now();
            drop(p);
            let took = t.elapsed();
            assert!(took < Duration::from_millis(50), "tty {tty}: {took:?}");
        }
    }

    #[test]
    fn progress_is_one_live_line_on_a_terminal() {
        let buf = Shared::default();
        let p = Progress::start_on("copying 1 MiB".into(), true, Box::new(buf.clone()));
        std::thread::sleep(Duration::from_millis(650));
        drop(p);
        let t = buf.text();
        assert!(!t.contains('\n'), "{t:?}");
        assert!(t.starts_with("\rcopying 1 MiB: 0."), "{t:?}");
        assert!(t.contains(" s\x1b[K"), "{t:?}");
        assert!(
            t.matches("\rcopying 1 MiB: ").count() >= 2,
            "redrawn: {t:?}"
        );
        assert!(
            t.ends_with("\r\x1b[K"),
            "the line is erased at the end: {t:?}"
        );
    }

    #[test]
    fn errors_carry_their_errno_name() {
        let e = failure("x").errno(&std::io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(e.code(), "EPERM");
        let j = e.json("bind");
        assert_eq!(j["schema"], "pcifab/error/v1");
        assert_eq!(j["error"]["errno"], libc::EPERM);
        assert_eq!(usage_error("y").json("info")["error"]["code"], "usage");
        assert_eq!(errno_name(4000), "E4000");
        let b = busy("in use").json("unbind");
        assert_eq!(b["error"]["code"], "busy");
        assert_eq!(b["error"]["errno"], libc::EBUSY);
        assert_eq!(b["exit_code"], EXIT_REFUSED);
    }
}
