// SPDX-License-Identifier: GPL-2.0-only

//! The DMA endpoints bound by this module, for the management endpoint's copies to find.
//!
//! The kernel crate's static locks ([`kernel::sync::global_lock!`]) must be initialised once
//! before any other use, by an `unsafe` call. [`init`] makes that call at most once (an atomic
//! flag) and every access goes through [`with`], which refuses (`ENODEV`) until it was made,
//! so no use can come before the initialisation.

use kernel::{
    prelude::*,
    sync::{
        atomic::{ordering::Acquire, ordering::Relaxed, ordering::Release, Atomic},
        global_lock, Arc,
    },
};

use crate::dmaep::Shared;

global_lock! {
    // SAFETY: `init()` is the only caller of `DMA_ENDPOINTS.init()` and calls it once; every
    // other use goes through `with()`, which runs only after `init()` finished.
    unsafe(uninit) static DMA_ENDPOINTS: Mutex<KVec<Arc<Shared>>> = KVec::new();
}

/// 0: not initialised; 1: being initialised; 2: ready.
static STATE: Atomic<u32> = Atomic::new(0);

/// Initialises the registry; called from the module's init before the drivers register.
pub(crate) fn init() {
    if STATE.cmpxchg(0, 1, Relaxed).is_err() {
        return;
    }
    // SAFETY: The flag lets exactly one caller get here, once, and no access to the lock
    // happens before (`with()` waits for state 2, set below).
    unsafe { DMA_ENDPOINTS.init() };
    STATE.store(2, Release);
}

/// Runs `f` on the list of bound endpoints, under its lock.
pub(crate) fn with<R>(f: impl FnOnce(&mut KVec<Arc<Shared>>) -> R) -> Result<R> {
    if STATE.load(Acquire) != 2 {
        return Err(ENODEV);
    }
    let mut list = DMA_ENDPOINTS.lock();
    Ok(f(&mut list))
}
