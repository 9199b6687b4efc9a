// SPDX-License-Identifier: GPL-2.0-only

//! A device's binding to the driver, held across sleeps by code outside the driver's
//! callbacks.
//!
//! The kernel crate proves a device bound with a `&Device<Bound>`, which only the driver's
//! callbacks get; [`kernel::devres::Devres`] lets other code reach resources while the device
//! is bound, but under RCU, so without sleeping. A [`Binding`] gives a `&Device<Bound>` to
//! process context for as long as a [`BindingGuard`] is held, sleeps included: a devres action
//! ends the binding when the driver unbinds and waits for the guard holders first.

use kernel::{
    device::{Bound, Device},
    devres, new_mutex,
    prelude::*,
    sync::{aref::ARef, Arc, Mutex, MutexGuard},
};

/// The binding of a device to the driver that made it.
///
/// # Invariants
///
/// `bound` is `true` only while `dev` is bound to the driver that made the `Binding`: the
/// devres action [`Unbind`] registered by [`Binding::new`] sets it to `false` (under the lock)
/// when the driver unbinds, before the device is released from the driver.
#[pin_data]
pub(crate) struct Binding {
    dev: ARef<Device>,
    #[pin]
    bound: Mutex<bool>,
}

/// Proof that the device of a [`Binding`] stays bound while this guard is held.
///
/// # Invariants
///
/// `_bound` holds the lock of a [`Binding`] whose `bound` is `true`, and `dev` is its device.
pub(crate) struct BindingGuard<'a> {
    dev: &'a Device,
    _bound: MutexGuard<'a, bool>,
}

/// The devres action that ends a [`Binding`].
struct Unbind(Arc<Binding>);

impl Drop for Unbind {
    fn drop(&mut self) {
        // INVARIANT: Runs at unbind, while the device is still bound; waits for the holders.
        *self.0.bound.lock() = false;
    }
}

impl Binding {
    /// The binding of `dev`, which is bound now (probe).
    pub(crate) fn new(dev: &Device<Bound>) -> Result<Arc<Self>> {
        let this = Arc::pin_init(
            pin_init!(Self {
                dev: dev.into(),
                bound <- new_mutex!(true),
            }),
            GFP_KERNEL,
        )?;
        devres::register(dev, Unbind(this.clone()), GFP_KERNEL)?;
        Ok(this)
    }

    /// The bound device, held until the guard is dropped; `None` once the driver unbound.
    pub(crate) fn access(&self) -> Option<BindingGuard<'_>> {
        let bound = self.bound.lock();
        // INVARIANT: The lock is held and `bound` is `true`.
        (*bound).then_some(BindingGuard {
            dev: &self.dev,
            _bound: bound,
        })
    }
}

impl BindingGuard<'_> {
    /// The bound device.
    pub(crate) fn device(&self) -> &Device<Bound> {
        // SAFETY: By the type invariants the binding's `bound` is `true` and stays so while
        // this guard holds the lock, so by the invariants of `Binding` the device is bound;
        // the returned borrow cannot outlive the guard.
        unsafe { self.dev.as_bound() }
    }
}
