// SPDX-License-Identifier: GPL-2.0-only

//! The workqueues pcifab queues its work on, and flushing one work item.
//!
//! The driver's own work (fabric events, per-function directories, and unbinds that sysfs
//! writers hand off) runs on a workqueue the module owns ([`ModuleQueue`]), so that the
//! module's exit can wait for work that removing the endpoint did not wait for: a removal of
//! the endpoint may run under the PCI rescan/remove lock and must not wait for work that is
//! blocked in pciehp, which needs that lock (`Documentation/design.rst`, "Hot-plug and the
//! rescan lock"). `destroy_workqueue()` at module exit drains it, and a work item returns
//! into the workqueue core, never into freed module text.

use core::{
    ptr::null_mut,
    sync::atomic::{AtomicPtr, Ordering},
};

use kernel::{
    bindings, container_of,
    prelude::*,
    workqueue::{DelayedWork, Queue, Work},
};

/// The module's workqueue while it exists (from module init to module exit).
static QUEUE: AtomicPtr<bindings::workqueue_struct> = AtomicPtr::new(null_mut());

/// The module's own workqueue; destroyed (after waiting for all its work) on drop.
///
/// # Invariants
///
/// While an object of this type exists, [`QUEUE`] holds the workqueue it allocated.
pub(crate) struct ModuleQueue(());

impl ModuleQueue {
    /// Allocates the module's workqueue. Called once, in module init, before the driver is
    /// registered.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: The name is a NUL-terminated static string without format directives, and
        // no variadic arguments are passed.
        let wq = unsafe {
            bindings::alloc_workqueue_noprof(
                c"pcifab".as_char_ptr(),
                bindings::wq_flags_WQ_UNBOUND,
                0,
            )
        };
        if wq.is_null() {
            return Err(ENOMEM);
        }
        if QUEUE
            .compare_exchange(null_mut(), wq, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // SAFETY: `wq` was allocated above and nothing was queued on it.
            unsafe { bindings::destroy_workqueue(wq) };
            return Err(EBUSY);
        }
        // INVARIANT: `QUEUE` holds `wq`.
        Ok(Self(()))
    }
}

impl Drop for ModuleQueue {
    fn drop(&mut self) {
        let wq = QUEUE.swap(null_mut(), Ordering::AcqRel);
        if !wq.is_null() {
            // SAFETY: `wq` was allocated by `new()` (invariant) and is destroyed only here;
            // `destroy_workqueue()` first waits for all work queued on it.
            unsafe { bindings::destroy_workqueue(wq) };
        }
    }
}

/// The workqueue for the driver's work: the module's own one, or `system_dfl_wq` outside the
/// module's lifetime (which no driver code sees).
pub(crate) fn driver() -> &'static Queue {
    let wq = QUEUE.load(Ordering::Acquire);
    if wq.is_null() {
        return system_dfl();
    }
    // SAFETY: The module's workqueue exists from module init, before the driver is
    // registered, until module exit, after the driver is unregistered and every endpoint is
    // unbound; all driver code that queues work runs within that time (work running on the
    // queue itself included, which `destroy_workqueue()` waits for).
    unsafe { Queue::from_raw(wq) }
}

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

/// Runs `work` now if its timer is pending, and waits until it is neither queued nor running.
pub(crate) fn flush_delayed<T, const ID: u64>(work: &DelayedWork<T, ID>) {
    // SAFETY: `work` is a reference, so the pointer is aligned and not dangling.
    let w = unsafe { DelayedWork::raw_as_work(work) };
    // SAFETY: `w` points to the initialised `work_struct` inside `work`.
    let raw = unsafe { Work::raw_get(w) };
    // SAFETY: `raw` is the `work` field of the `delayed_work` inside `work`.
    let dwork = unsafe { container_of!(raw, bindings::delayed_work, work) };
    // SAFETY: `dwork` is the initialised `delayed_work` of `work` (a `DelayedWork` exists only
    // initialised), which outlives this call, which only runs and waits on it.
    unsafe { bindings::flush_delayed_work(dwork) };
}
