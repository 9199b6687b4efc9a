// SPDX-License-Identifier: GPL-2.0-only

//! The control socket: request lines in, reply lines out, as the peer's principal; the
//! signals that stop the daemon or reload its principals; the network API started beside it.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::{UnixListener, UnixStream},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use signal_hook::{
    consts::{SIGHUP, SIGINT, SIGTERM},
    iterator::Signals,
};

use crate::{
    auth::{Denied, Principal, Principals},
    config::Config,
    daemon::Daemon,
    protocol,
};

/// Serves the control socket until the process is killed; ticks once a second.
pub fn serve(daemon: Daemon, socket: &Path) -> Result<(), String> {
    if socket.exists() {
        if UnixStream::connect(socket).is_ok() {
            return Err(format!(
                "another manager answers on {}; stop it or use another --socket",
                socket.display()
            ));
        }
        std::fs::remove_file(socket)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", socket.display()))?;
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let listener = match UnixListener::bind(socket) {
        Ok(l) => Some(l),
        Err(e) if crate::spool::no_unix_sockets(&e) => None,
        Err(e) => return Err(format!("cannot listen on {}: {e}", socket.display())),
    };
    // SIGTERM, SIGINT and SIGHUP are taken by one thread (signal-hook's handler wakes it).
    let signals = Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| format!("cannot take SIGTERM, SIGINT and SIGHUP: {e}"))?;
    let api = daemon.api.clone();
    let principals = daemon.principals.clone();
    let d = Arc::new(Mutex::new(daemon));
    {
        let d = d.clone();
        let socket = socket.to_path_buf();
        std::thread::spawn(move || stop_on_signal(signals, &d, &socket));
    }
    if let Some(cfg) = &api {
        crate::api::spawn(d.clone(), cfg, principals)?;
    }
    {
        let d = d.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            match d.lock() {
                Ok(mut d) => {
                    d.tick();
                    crate::notify::watchdog();
                }
                Err(_) => return,
            }
        });
    }
    crate::notify::ready();
    let Some(listener) = listener else {
        return crate::spool::serve(d, &crate::spool::dir_for(socket));
    };
    eprintln!("pcifab-manager: listening on {}", socket.display());
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let d = d.clone();
        std::thread::spawn(move || serve_conn(d, conn));
    }
    Ok(())
}

/// Serves one connection of the control socket until it closes: request lines in, reply
/// lines out, as the peer's principal. Public for the tests, which drive it over a socket
/// pair.
pub fn serve_conn(d: Arc<Mutex<Daemon>>, conn: UnixStream) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    // The peer's user id, from the kernel (SO_PEERCRED), names its principal.
    let principal = match peer_uid(&conn) {
        Ok(uid) => match d.lock() {
            Ok(d) => d.principals.by_uid(uid),
            Err(_) => return,
        },
        Err(e) => Err(Denied::Forbidden(format!(
            "cannot tell who is on the socket's other end: {e}"
        ))),
    };
    let reader = BufReader::new(conn);
    // Made on the first `events` line with a `wait`: it waits for the daemon's notices.
    let mut rt = None;
    for line in reader.lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match protocol::take_wait(&line) {
            Ok((line, 0)) => serve_once(&d, &principal, &line),
            Ok((line, wait)) => serve_waiting(&d, &principal, &line, wait, &mut rt),
            Err(reply) => reply,
        };
        if writeln!(out, "{reply}").is_err() {
            return;
        }
    }
}

fn serve_once(d: &Mutex<Daemon>, principal: &Result<Principal, Denied>, line: &str) -> Value {
    match (principal, d.lock()) {
        (Ok(p), Ok(mut d)) => d.serve_line(p, line),
        (Err(denied), _) => {
            eprintln!("pcifab-manager: socket: refused: {}", denied.reason());
            json!({"ok": false, "error": denied.reason(), "refused": true,
                   "status": denied.status()})
        }
        (_, Err(_)) => protocol::error("the manager failed internally; restart it", false),
    }
}

/// An `events` line with a `wait`: answered once it has notices, or empty after `wait_s`
/// seconds. The wait holds no lock; any notice the daemon adds wakes it to look again.
fn serve_waiting(
    d: &Mutex<Daemon>,
    principal: &Result<Principal, Denied>,
    line: &str,
    wait_s: u64,
    rt: &mut Option<tokio::runtime::Runtime>,
) -> Value {
    let Ok(mut notices) = d.lock().map(|d| d.notices()) else {
        return protocol::error("the manager failed internally; restart it", false);
    };
    let deadline = Instant::now() + Duration::from_secs(wait_s);
    loop {
        // Seen before the daemon is asked: a notice added after this ends the wait below.
        notices.borrow_and_update();
        let reply = serve_once(d, principal, line);
        let now = Instant::now();
        if !protocol::no_events(&reply) || now >= deadline {
            return reply;
        }
        let rt = match rt {
            Some(rt) => rt,
            None => match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(r) => rt.insert(r),
                Err(e) => {
                    eprintln!("pcifab-manager: socket: cannot wait for notices: {e}");
                    return reply;
                }
            },
        };
        // The timer is made inside the runtime, whose time driver it needs.
        let left = deadline - now;
        let woke = rt.block_on(async { tokio::time::timeout(left, notices.changed()).await });
        if let Ok(Err(_)) = woke {
            // The daemon is gone: nothing more will come.
            return reply;
        }
    }
}

/// The user id of the process on the other end of a UNIX socket (SO_PEERCRED).
fn peer_uid(s: &UnixStream) -> Result<u32, String> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is open for the life of `s`; `cred` and `len` are valid for writes of
    // the size passed, which is what SO_PEERCRED writes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(cred.uid)
}

/// Reads the configuration file again and takes its principals (names, roles, tokens,
/// expiries, uids) in place of the running ones, for the API and the socket alike; the
/// rest of the file is not reloaded. On an error the running principals stay.
pub fn reload_principals(d: &Mutex<Daemon>) -> Result<Vec<String>, String> {
    let (path, principals, hosts, tenants) = {
        let d = d
            .lock()
            .map_err(|_| "the daemon's lock is poisoned".to_string())?;
        let m = &d.sched.config.manager;
        (
            d.config_path.clone(),
            d.principals.clone(),
            m.hosts,
            m.tenants.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        )
    };
    let path = path.ok_or("this manager was started without a configuration file")?;
    let c = Config::load(&path.display().to_string())?;
    let new = Principals::new(c.principals, hosts, tenants)?;
    let names = new.names();
    principals.replace(new);
    Ok(names)
}

/// Waits for SIGTERM or SIGINT, then stops cleanly: takes the daemon's lock (so the request
/// being served finishes and nothing is half-applied), commits the state, tells systemd,
/// removes the socket and exits 0. SIGHUP reloads the principals and waits on.
fn stop_on_signal(mut signals: Signals, d: &Arc<Mutex<Daemon>>, socket: &Path) {
    let mut stop = None;
    for sig in signals.forever() {
        if sig != SIGHUP {
            stop = Some(sig);
            break;
        }
        crate::notify::reloading();
        match reload_principals(d) {
            Ok(names) => eprintln!(
                "pcifab-manager: SIGHUP: principals reloaded: {}",
                names.join(", ")
            ),
            Err(e) => eprintln!(
                "pcifab-manager: SIGHUP: principals not reloaded, the running ones stay: {e}"
            ),
        }
        crate::notify::ready();
    }
    let Some(sig) = stop else {
        eprintln!("pcifab-manager: the signal thread ended; SIGTERM will not stop it cleanly");
        return;
    };
    crate::notify::stopping();
    let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
    eprintln!("pcifab-manager: {name}: finishing the request in hand and stopping");
    let code = match d.lock() {
        Ok(mut d) => match d.commit(None) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("pcifab-manager: the last commit failed: {e}");
                1
            }
        },
        Err(_) => 1,
    };
    let _ = std::fs::remove_file(socket);
    eprintln!("pcifab-manager: stopped");
    std::process::exit(code);
}
