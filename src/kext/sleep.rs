// SPDX-License-Identifier: GPL-2.0-only

//! A sleep with a chosen slack.
//!
//! `kernel::time::delay::fsleep` lets a sleep end up to a quarter late (`usleep_range(us, us +
//! us / 4)`), and an idle CPU's timer fires at the end of the range: a waiter that sleeps to
//! look at a device's write-back at the right moment needs the range it asks for.

use kernel::{bindings, time::Delta};

/// Sleeps, uninterruptibly, at least `min` and at most about `min + slack` (the C
/// `usleep_range()`); microsecond resolution. A `min` of zero or less returns at once.
pub(crate) fn usleep_range(min: Delta, slack: Delta) {
    let Ok(lo) = kernel::ffi::c_ulong::try_from(min.as_micros_ceil()) else {
        return;
    };
    if lo == 0 {
        return;
    }
    let extra = kernel::ffi::c_ulong::try_from(slack.as_micros_ceil()).unwrap_or(0);
    // SAFETY: `usleep_range_state()` has no memory-safety requirement: any range with `lo <=
    // hi` is valid (`saturating_add` keeps that order) and the state is a valid task state.
    // Like `fsleep()`, it sleeps: calling it in atomic context is a bug the kernel reports.
    unsafe {
        bindings::usleep_range_state(lo, lo.saturating_add(extra), bindings::TASK_UNINTERRUPTIBLE)
    };
}
