// SPDX-License-Identifier: GPL-2.0-only

//! A device's binding to the driver, held across sleeps by code outside the driver's
//! callbacks.
//!
//! The kernel crate proves a device bound with a `&Device<Bound>`, which only the driver's
//! callbacks get; [`kernel::devres::Devres`] lets other code reach resources while the device
//! is bound, but under RCU, so without sleeping. A [`Binding`] gives a `&Device<Bound>` to
//! process context for as long as a [`BindingGuard`] is held, sleeps included: a devres action
//! ends the binding when the driver unbinds and waits for the guard holders first.
//!
//! Guards are counted, not exclusive: any number of callers may hold one at a time, and the
//! lock inside is held only to look at the state and count a holder in or out, never while a
//! guard is out. So a caller that holds its guard across a long wait (a copy, up to its
//! timeout) holds up no other holder, and a caller waiting to get a guard never waits longer
//! than it takes another to count itself in or out. Only unbind waits for the holders, as it
//! must: what they reach through the device (DMA mappings) must be gone before it is unbound.

use kernel::{
    device::{Bound, Device},
    devres, new_condvar, new_mutex,
    prelude::*,
    sync::{aref::ARef, Arc, CondVar, Mutex},
};

/// The binding of a device to the driver that made it.
///
/// # Invariants
///
/// `state.bound` is `true` only while `dev` is bound to the driver that made the `Binding`:
/// the devres action [`Unbind`] registered by [`Binding::new`] sets it to `false` (under the
/// lock) when the driver unbinds, then waits until `state.holders` is zero, before the device
/// is released from the driver. `state.holders` counts the [`BindingGuard`]s alive.
#[pin_data]
pub(crate) struct Binding {
    dev: ARef<Device>,
    /// Held only to look at or change the state, never while a guard is out.
    #[pin]
    state: Mutex<State>,
    /// Signalled when the last holder gives its guard back.
    #[pin]
    released: CondVar,
}

/// Whether the device is bound, and how many guards are out.
struct State {
    bound: bool,
    holders: usize,
}

/// Proof that the device of a [`Binding`] stays bound while this guard is held.
///
/// # Invariants
///
/// The guard was counted in `binding.state.holders` while `binding.state.bound` was `true`,
/// and is counted out only on drop.
pub(crate) struct BindingGuard<'a> {
    binding: &'a Binding,
}

impl Drop for BindingGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.binding.state.lock();
        st.holders = st.holders.saturating_sub(1);
        if st.holders == 0 {
            self.binding.released.notify_all();
        }
    }
}

/// The devres action that ends a [`Binding`].
struct Unbind(Arc<Binding>);

impl Drop for Unbind {
    fn drop(&mut self) {
        // INVARIANT: Runs at unbind, while the device is still bound: no new guard from here
        // on, and the ones out are waited for.
        let b = &self.0;
        let mut st = b.state.lock();
        st.bound = false;
        while st.holders != 0 {
            b.released.wait(&mut st);
        }
    }
}

impl Binding {
    /// The binding of `dev`, which is bound now (probe).
    pub(crate) fn new(dev: &Device<Bound>) -> Result<Arc<Self>> {
        let this = Arc::pin_init(
            pin_init!(Self {
                dev: dev.into(),
                state <- new_mutex!(State {
                    bound: true,
                    holders: 0,
                }),
                released <- new_condvar!("pcifab::Binding::released"),
            }),
            GFP_KERNEL,
        )?;
        devres::register(dev, Unbind(this.clone()), GFP_KERNEL)?;
        Ok(this)
    }

    /// The bound device, held until the guard is dropped; `None` once the driver unbound (or
    /// is unbinding).
    pub(crate) fn access(&self) -> Option<BindingGuard<'_>> {
        let mut st = self.state.lock();
        if !st.bound {
            return None;
        }
        st.holders = st.holders.checked_add(1)?;
        // INVARIANT: Counted in while `bound` is `true`.
        Some(BindingGuard { binding: self })
    }
}

impl BindingGuard<'_> {
    /// The bound device.
    pub(crate) fn device(&self) -> &Device<Bound> {
        // SAFETY: By the type invariants this guard is counted in the binding's holders,
        // which it was while `bound` was `true`; by the invariants of `Binding` the driver's
        // unbind waits for it before the device is released, so the device is bound while
        // the guard lives, and the returned borrow cannot outlive the guard.
        unsafe { self.binding.dev.as_bound() }
    }
}
