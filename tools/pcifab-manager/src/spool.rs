// SPDX-License-Identifier: GPL-2.0-only

//! The control protocol without UNIX sockets: a spool directory (`SOCKET.d`) for kernels built
//! without them (`CONFIG_UNIX` off, as in the test guests). Same JSON lines as the socket.
//!
//! A client writes its request line to `DIR/NAME.tmp`, renames it to `DIR/NAME.req` (so the
//! daemon never sees half a request) and waits for `DIR/NAME.reply`, which the daemon writes
//! the same way; `NAME` is `<nanoseconds>-<pid>-<counter>`, so requests are served in the
//! order they were made. The daemon's pid is in `DIR/pid`: a client whose daemon is not
//! running (or dies while it waits) fails instead of waiting forever.
//! `Documentation/manager.rst` ("Control socket") describes it.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::{daemon::Daemon, protocol};

/// How often the daemon looks for requests and a client for its reply.
const POLL: Duration = Duration::from_millis(20);

/// The spool directory that stands for `socket`.
pub fn dir_for(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".d");
    PathBuf::from(s)
}

/// True when `e` says the kernel has no UNIX sockets (so the spool is the way in).
pub fn no_unix_sockets(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT)
    )
}

/// The pid in `DIR/pid` if that process is alive.
pub fn daemon_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = fs::read_to_string(dir.join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: kill with signal 0 only checks that the process exists.
    (pid > 0 && unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
}

/// Sends one request line through the spool in `dir` and returns the reply line.
pub fn ask(dir: &Path, line: &str) -> Result<String, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    if daemon_pid(dir).is_none() {
        return Err(format!(
            "no manager is running for {} (no live pid in {})",
            dir.display(),
            dir.join("pid").display()
        ));
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = format!(
        "{nanos:024}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let tmp = dir.join(format!("{name}.tmp"));
    let req = dir.join(format!("{name}.req"));
    let reply = dir.join(format!("{name}.reply"));
    fs::write(&tmp, format!("{}\n", line.trim()))
        .and_then(|()| fs::rename(&tmp, &req))
        .map_err(|e| format!("cannot write a request into {}: {e}", dir.display()))?;
    loop {
        if let Ok(text) = fs::read_to_string(&reply) {
            let _ = fs::remove_file(&reply);
            return Ok(text);
        }
        if daemon_pid(dir).is_none() {
            let _ = fs::remove_file(&req);
            return Err(format!(
                "the manager for {} stopped before it answered",
                dir.display()
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Serves the spool in `dir` until the process ends: refuses to start if another live daemon
/// owns it, removes what an earlier one left behind, then answers requests in order.
pub fn serve(d: Arc<Mutex<Daemon>>, dir: &Path) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    if let Some(pid) = daemon_pid(dir) {
        if pid != std::process::id() as i32 {
            return Err(format!(
                "another manager (pid {pid}) serves {}; stop it or use another --socket",
                dir.display()
            ));
        }
    }
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for e in entries.flatten() {
        let _ = fs::remove_file(e.path());
    }
    fs::write(dir.join("pid"), format!("{}\n", std::process::id()))
        .map_err(|e| format!("cannot write {}: {e}", dir.join("pid").display()))?;
    eprintln!(
        "pcifab-manager: no UNIX sockets in this kernel; serving the spool {}",
        dir.display()
    );
    loop {
        let mut reqs: Vec<PathBuf> = fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "req"))
                    .collect()
            })
            .unwrap_or_default();
        reqs.sort();
        for req in reqs {
            // The file's owner is the caller, as the socket's peer credentials would say.
            let owner = fs::symlink_metadata(&req).map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.uid()
            });
            let Ok(line) = fs::read_to_string(&req) else {
                continue;
            };
            let _ = fs::remove_file(&req);
            let reply = match (owner, d.lock()) {
                (Ok(uid), Ok(mut d)) => match d.principals.by_uid(uid) {
                    // One server for every caller: a `wait` is answered at once.
                    Ok(p) => match protocol::take_wait(line.trim()) {
                        Ok((line, _)) => d.serve_line(&p, &line),
                        Err(reply) => reply,
                    },
                    Err(denied) => {
                        eprintln!("pcifab-manager: spool: refused: {}", denied.reason());
                        protocol::error(denied.reason(), true)
                    }
                },
                (Err(e), _) => protocol::error(format!("cannot tell who asked: {e}"), true),
                (_, Err(_)) => protocol::error("the manager failed internally; restart it", false),
            };
            let out = req.with_extension("reply");
            let tmp = req.with_extension("reply.tmp");
            if let Err(e) =
                fs::write(&tmp, format!("{reply}\n")).and_then(|()| fs::rename(&tmp, &out))
            {
                eprintln!("pcifab-manager: cannot answer {}: {e}", req.display());
            }
        }
        std::thread::sleep(POLL);
    }
}
