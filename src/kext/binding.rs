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

/// The binding of a device, or nothing once the driver unbound.
///
/// # Invariants
///
/// `dev` is `Some` only while the device is bound to the driver that made the `Binding`: the
/// devres action [`Unbind`] registered by [`Binding::new`] sets it to `None` (under the lock)
/// when the driver unbinds, before the device is released.
#[pin_data]
pub(crate) struct Binding {
    #[pin]
    dev: Mutex<Option<ARef<Device>>>,
}

/// Proof that the device of a [`Binding`] stays bound while this guard is held.
pub(crate) struct BindingGuard<'a>(MutexGuard<'a, Option<ARef<Device>>>);

/// The devres action that ends a [`Binding`].
struct Unbind(Arc<Binding>);

impl Drop for Unbind {
    fn drop(&mut self) {
        // INVARIANT: Runs at unbind, while the device is still bound; waits for the holders.
        *self.0.dev.lock() = None;
    }
}

impl Binding {
    /// The binding of `dev`, which is bound now (probe).
    pub(crate) fn new(dev: &Device<Bound>) -> Result<Arc<Self>> {
        let this = Arc::pin_init(
            pin_init!(Self {
                dev <- new_mutex!(Some(dev.into())),
            }),
            GFP_KERNEL,
        )?;
        devres::register(dev, Unbind(this.clone()), GFP_KERNEL)?;
        Ok(this)
    }

    /// The bound device, held until the guard is dropped; `None` once the driver unbound.
    pub(crate) fn access(&self) -> Option<BindingGuard<'_>> {
        let guard = self.dev.lock();
        guard.is_some().then_some(BindingGuard(guard))
    }
}

impl BindingGuard<'_> {
    /// The bound device.
    pub(crate) fn device(&self) -> &Device<Bound> {
        let dev: &Device = self.0.as_deref().unwrap_or_else(|| unreachable!());
        // SAFETY: By the invariants of `Binding` the device is bound while `dev` is `Some`,
        // and it stays `Some` while this guard holds the lock; the returned borrow cannot
        // outlive the guard.
        unsafe { dev.as_bound() }
    }
}
