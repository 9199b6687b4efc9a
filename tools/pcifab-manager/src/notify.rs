// SPDX-License-Identifier: GPL-2.0-only

//! systemd's readiness and watchdog protocol (sd_notify) through the `sd-notify` crate:
//! `READY=1` once the control socket listens, `RELOADING=1` and `READY=1` around a SIGHUP
//! reload, `STOPPING=1` at a clean stop, `WATCHDOG=1` from the ticking thread, as datagrams
//! to `$NOTIFY_SOCKET`. Without `$NOTIFY_SOCKET` (not started by systemd with Type=notify)
//! nothing is sent.

use sd_notify::NotifyState;

fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        let addr = std::env::var("NOTIFY_SOCKET").unwrap_or_default();
        eprintln!("pcifab-manager: cannot tell systemd {states:?} at {addr}: {e}");
    }
}

/// The service is up: the control socket (or its spool directory) answers.
pub fn ready() {
    notify(&[NotifyState::Ready]);
}

/// The daemon reloads its configuration (Type=notify-reload): `READY=1` follows when done.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// The daemon is shutting down.
pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}

/// Whether systemd watches this process: `$WATCHDOG_USEC` is set and `$WATCHDOG_PID` is ours
/// or unset, as sd_watchdog_enabled(3) has it (the crate's `watchdog_enabled` also wants
/// `$WATCHDOG_PID` set).
fn watched() -> bool {
    std::env::var("WATCHDOG_USEC").is_ok_and(|u| u.parse::<u64>().is_ok_and(|u| u > 0))
        && std::env::var("WATCHDOG_PID")
            .map_or(true, |p| p.parse::<u32>().ok() == Some(std::process::id()))
}

/// The daemon still ticks.
pub fn watchdog() {
    if watched() {
        notify(&[NotifyState::Watchdog]);
    }
}
