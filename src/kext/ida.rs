// SPDX-License-Identifier: GPL-2.0-only

//! Small integer ids from the kernel's IDA (`include/linux/idr.h`).
//!
//! The kernel crate of Linux 7.3 has no IDA abstraction. [`Ida`] is one that can be a
//! `static`, as C's `DEFINE_IDA()` is: C initialises that one at compile time, which Rust
//! cannot do for the lock inside it (its lockdep and spinlock-debugging fields depend on the
//! kernel's configuration), so [`Ida::init`] does it once, from the module's init, and
//! [`Ida::alloc`] refuses (`ENODEV`) until it was done. An id is an [`IdaId`], given back when
//! it drops.

use kernel::{
    bindings,
    prelude::*,
    sync::atomic::{ordering::Acquire, ordering::Relaxed, ordering::Release, Atomic},
    types::Opaque,
};

/// `IDA_INIT_FLAGS`: the IDA's lock is taken with interrupts off, and the xarray allocates.
const IDA_INIT_FLAGS: bindings::gfp_t =
    bindings::xa_lock_type_XA_LOCK_IRQ as bindings::gfp_t | bindings::XA_FLAGS_ALLOC;

/// `state`: not initialised.
const UNINIT: u32 = 0;
/// `state`: [`Ida::init`] is initialising it.
const INITIALISING: u32 = 1;
/// `state`: ready for use.
const READY: u32 = 2;

/// A `struct ida` that can be a `static`.
///
/// # Invariants
///
/// Once `state` reads [`READY`] (with acquire ordering), `ida` holds a `struct ida` initialised
/// as `ida_init()` does, and it is never torn down while the `Ida` exists (`ida_destroy()`
/// leaves it empty but initialised).
pub(crate) struct Ida {
    ida: Opaque<bindings::ida>,
    state: Atomic<u32>,
}

// SAFETY: The IDA's operations take its own lock; `&Ida` only reaches them.
unsafe impl Sync for Ida {}
// SAFETY: A `struct ida` has no ties to the thread that made it.
unsafe impl Send for Ida {}

impl Ida {
    /// An IDA that [`Ida::init`] must initialise before use.
    pub(crate) const fn new() -> Self {
        Self {
            ida: Opaque::uninit(),
            state: Atomic::new(UNINIT),
        }
    }

    /// Initialises the IDA; the first call does it, later ones do nothing.
    pub(crate) fn init(&'static self) {
        if self.state.cmpxchg(UNINIT, INITIALISING, Relaxed).is_err() {
            return;
        }
        // SAFETY: `ida` is valid for writes (a static), and the flag lets exactly one caller
        // get here, once, before any use (`alloc()` and `destroy()` wait for `READY`).
        unsafe { bindings::xa_init_flags(&raw mut (*self.ida.get()).xa, IDA_INIT_FLAGS) };
        // INVARIANT: `ida` is initialised as `ida_init()` does.
        self.state.store(READY, Release);
    }

    /// The lowest free id in `0..=max`.
    ///
    /// # Errors
    ///
    /// `ENOSPC` when every one is in use, `ENOMEM`, and `ENODEV` before [`Ida::init`].
    pub(crate) fn alloc(&'static self, max: u32) -> Result<IdaId> {
        if self.state.load(Acquire) != READY {
            return Err(ENODEV);
        }
        // The IDA's ids are C `int`s: none above `INT_MAX`.
        let max = max.min(i32::MAX.unsigned_abs());
        // SAFETY: `ida` is initialised (invariant, `READY` read above); the call takes its
        // lock and may sleep, which `GFP_KERNEL` callers may.
        let id = unsafe { bindings::ida_alloc_range(self.ida.get(), 0, max, bindings::GFP_KERNEL) };
        if id < 0 {
            return Err(Error::from_errno(id));
        }
        // `id` is not negative, and the IDA gave it out for us alone.
        Ok(IdaId {
            ida: self,
            id: id.unsigned_abs(),
        })
    }

    /// Frees every id and the memory the IDA holds: at module exit, once every [`IdaId`] was
    /// dropped (one dropped later makes the IDA warn, nothing worse).
    pub(crate) fn destroy(&'static self) {
        if self.state.load(Acquire) != READY {
            return;
        }
        // SAFETY: `ida` is initialised (invariant); `ida_destroy()` takes its lock and leaves
        // it empty but initialised.
        unsafe { bindings::ida_destroy(self.ida.get()) };
    }
}

/// An id taken from an [`Ida`]; given back on drop.
///
/// # Invariants
///
/// `id` was allocated from `ida`, which is initialised, and is freed only by this drop.
pub(crate) struct IdaId {
    ida: &'static Ida,
    id: u32,
}

impl IdaId {
    /// The id.
    pub(crate) fn get(&self) -> u32 {
        self.id
    }
}

impl Drop for IdaId {
    fn drop(&mut self) {
        // SAFETY: By the type invariants `ida` is initialised and `id` was allocated from it
        // and not freed since.
        unsafe { bindings::ida_free(self.ida.ida.get(), self.id) };
    }
}
