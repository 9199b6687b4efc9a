// SPDX-License-Identifier: GPL-2.0-only

//! The system workqueues Linux 7.3 wants new users on, and flushing one work item.

use kernel::{
    bindings,
    workqueue::{Queue, Work},
};

/// The unbound system workqueue, `system_dfl_wq` (7.3 logs a deprecation notice for work
/// queued on `system_unbound_wq`, which `kernel::workqueue::system_unbound()` returns).
pub(crate) fn system_dfl() -> &'static Queue {
    // SAFETY: `system_dfl_wq` is a C global set up at boot and never destroyed, so it is
    // valid for the `'static` lifetime.
    unsafe { Queue::from_raw(bindings::system_dfl_wq) }
}

/// Waits until `work` is neither queued nor running.
pub(crate) fn flush<T, const ID: u64>(work: &Work<T, ID>) {
    // SAFETY: `work` is an initialised work item (a `Work` exists only initialised), and it
    // outlives this call, which only waits on it.
    unsafe { bindings::flush_work(Work::raw_get(work)) };
}
