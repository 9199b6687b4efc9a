// SPDX-License-Identifier: GPL-2.0-only

//! The manager's clocks: whole seconds since the Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// The clock: seconds since the Unix epoch in the daemon, anything in tests.
pub type Clock = Box<dyn Fn() -> u64 + Send>;

/// The Unix time in seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The daemon's clock: the Unix time at start, advanced by the monotonic clock, so a step
/// of the wall clock while the daemon runs (NTP, an operator) moves no lease's expiry, slice
/// or time-out. Stored times stay Unix times, so a restart picks up the wall clock again.
pub fn steady_clock() -> Clock {
    let base = unix_now();
    let start = std::time::Instant::now();
    Box::new(move || base.saturating_add(start.elapsed().as_secs()))
}
