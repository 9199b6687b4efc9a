// SPDX-License-Identifier: GPL-2.0-only

//! The DMA endpoints bound by this module, for the management endpoint's copies to find,
//! and the pages of buffers an unbound endpoint's firmware never answered for
//! ([`with_limbo`]).
//!
//! The kernel crate's static locks ([`kernel::sync::global_lock!`]) must be initialised once
//! before any other use, by an `unsafe` call. [`init`] makes that call at most once (an atomic
//! flag) and every access goes through [`with`], which refuses (`ENODEV`) until it was made,
//! so no use can come before the initialisation.

use kernel::{
    device::Device,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{ordering::Acquire, ordering::Relaxed, ordering::Release, Atomic},
        global_lock, Arc,
    },
};

use crate::{dmaep::Shared, kext::user_pages::UserPages};

/// The pages of a buffer registered for a peer whose UNREGISTER the firmware never
/// answered before its endpoint unbound: unmapped (with the endpoint's bus mastering off)
/// but still pinned, until a later bind of the same endpoint finds the firmware's list of
/// the host's buffers empty.
pub(crate) struct Parked {
    /// The endpoint's device (held, so that no other device can take its address).
    pub(crate) dev: ARef<Device>,
    pub(crate) pages: UserPages,
}

impl Parked {
    /// Whether the pages are of a buffer of `dev`'s.
    pub(crate) fn is_for(&self, dev: &Device) -> bool {
        core::ptr::eq(dev, &*self.dev)
    }
}

/// What the lock guards: the bound endpoints, and the limbo.
struct Registry {
    endpoints: KVec<Arc<Shared>>,
    limbo: KVec<Parked>,
}

global_lock! {
    // SAFETY: `init()` is the only caller of `DMA_ENDPOINTS.init()` and calls it once; every
    // other use goes through `with()`, which runs only after `init()` finished.
    unsafe(uninit) static DMA_ENDPOINTS: Mutex<Registry> = Registry {
        endpoints: KVec::new(),
        limbo: KVec::new(),
    };
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
    let mut r = DMA_ENDPOINTS.lock();
    Ok(f(&mut r.endpoints))
}

/// Runs `f` on the limbo (pages of unbound endpoints' buffers still pinned), under the
/// registry's lock.
pub(crate) fn with_limbo<R>(f: impl FnOnce(&mut KVec<Parked>) -> R) -> Result<R> {
    if STATE.load(Acquire) != 2 {
        return Err(ENODEV);
    }
    let mut r = DMA_ENDPOINTS.lock();
    Ok(f(&mut r.limbo))
}
