// SPDX-License-Identifier: GPL-2.0-only

//! systemd's readiness and watchdog protocol (sd_notify): `READY=1` once the control socket
//! listens, `WATCHDOG=1` from the ticking thread, as datagrams to `$NOTIFY_SOCKET` (a path,
//! or an abstract name written `@name`). Without `$NOTIFY_SOCKET` (not started by systemd
//! with Type=notify) nothing is sent.

use std::{io, os::unix::net::UnixDatagram};

/// Sends `msg` to the notify socket `addr`.
pub fn send(addr: &str, msg: &str) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    match addr.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            sock.send_to_addr(msg.as_bytes(), &a)?;
        }
        None => {
            sock.send_to(msg.as_bytes(), addr)?;
        }
    }
    Ok(())
}

fn notify(msg: &str) {
    if let Ok(addr) = std::env::var("NOTIFY_SOCKET") {
        if let Err(e) = send(&addr, msg) {
            eprintln!("pcifab-manager: cannot tell systemd {msg} at {addr}: {e}");
        }
    }
}

/// The service is up: the control socket (or its spool directory) answers.
pub fn ready() {
    notify("READY=1");
}

/// The daemon reloads its configuration (Type=notify-reload): `READY=1` follows when done.
pub fn reloading() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`, which is valid for it.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let usec = u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000
        + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1000;
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
}

/// The daemon is shutting down.
pub fn stopping() {
    notify("STOPPING=1");
}

/// Whether systemd watches this process (`$WATCHDOG_USEC`, and `$WATCHDOG_PID` is ours or
/// unset).
fn watched() -> bool {
    std::env::var("WATCHDOG_USEC").is_ok_and(|u| u.parse::<u64>().is_ok_and(|u| u > 0))
        && std::env::var("WATCHDOG_PID")
            .map_or(true, |p| p.parse::<u32>().ok() == Some(std::process::id()))
}

/// The daemon still ticks.
pub fn watchdog() {
    if watched() {
        notify("WATCHDOG=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_and_an_abstract_name() {
        let dir = std::env::temp_dir().join(format!("pcifab-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("notify");
        let rx = UnixDatagram::bind(&path).expect("bind");
        send(path.to_str().expect("utf-8"), "READY=1").expect("send");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("pcifab-notify-test-{}", std::process::id());
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("a");
        let rx = UnixDatagram::bind_addr(&a).expect("bind abstract");
        send(&format!("@{name}"), "WATCHDOG=1").expect("send abstract");
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"WATCHDOG=1");
        assert!(send(dir.join("none").to_str().expect("utf-8"), "X=1").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
