// SPDX-License-Identifier: GPL-2.0-only

//! Whether the calling task has been killed.
//!
//! The kernel crate's [`kernel::task::Task::signal_pending`] tells any pending signal; a wait
//! that must end on `SIGKILL` but not on other signals (a bind the caller did not ask to
//! abandon) needs the C `fatal_signal_pending()`, a static inline the bindings do not have.

use kernel::bindings;

/// Whether `SIGKILL` is pending for the calling task (the C `fatal_signal_pending()`): the
/// task is being killed and every wait it is in should end.
pub(crate) fn fatal_signal_pending() -> bool {
    let task = kernel::current!().as_ptr();
    let bit: kernel::ffi::c_ulong = 1 << (bindings::SIGKILL - 1);
    // SAFETY: `task` is the calling task, live while it runs. Only its own pending set is
    // read, once and without the signal lock, as `__fatal_signal_pending()` does: a sender
    // sets the bit under that lock, and a stale read only makes the check a poll later.
    let word = unsafe { core::ptr::read_volatile(&raw const (*task).pending.signal.sig[0]) };
    word & bit != 0
}
