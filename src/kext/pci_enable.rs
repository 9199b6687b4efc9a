// SPDX-License-Identifier: GPL-2.0-only

//! A PCI device's memory decoding enabled for as long as a value lives.
//!
//! `pci::Device::enable_device_mem()` of the kernel crate enables the device and leaves the
//! disable to the driver; pcifab's probe can fail after it and unbinding never undid it, so
//! the device's enable count grew with every failed probe and every load. [`EnabledDevice`]
//! pairs the enable with its `pci_disable_device()`.

use kernel::{bindings, device::Core, error::to_result, pci, prelude::*, sync::aref::ARef};

/// Memory decoding of a PCI device, enabled until drop.
///
/// # Invariants
///
/// `pdev` was enabled once with `pci_enable_device_mem()` by [`EnabledDevice::new`] and not
/// disabled since.
pub(crate) struct EnabledDevice {
    pdev: ARef<pci::Device>,
}

/// The C device behind `dev`.
fn raw(dev: &pci::Device) -> *mut bindings::pci_dev {
    // `pci::Device` is a transparent wrapper of `Opaque<struct pci_dev>`, which allows the C
    // side to change it through a shared reference.
    core::ptr::from_ref(dev)
        .cast::<bindings::pci_dev>()
        .cast_mut()
}

/// Whether `dev` still answers on the bus (`pci_device_is_present()`: its vendor id reads
/// back through config space). A device that left the bus reads all ones there too and can
/// no longer master DMA; one whose BARs read all ones but that answers here may still.
pub(crate) fn present(dev: &pci::Device) -> bool {
    // SAFETY: `dev` is a valid `struct pci_dev` for the duration of the borrow; the function
    // only reads its config space through the bus's accessors.
    unsafe { bindings::pci_device_is_present(raw(dev)) }
}

/// Turns `dev`'s bus mastering off (`pci_clear_master()`) and reads its command register
/// back: whether the device can no longer master DMA (the bit reads clear, or the device
/// left the bus).
pub(crate) fn stop_mastering(dev: &pci::Device) -> bool {
    // SAFETY: `dev` is a valid `struct pci_dev` for the duration of the borrow; the function
    // clears one bit of its command register through the bus's config accessors.
    unsafe { bindings::pci_clear_master(raw(dev)) };
    let mut cmd = 0u16;
    // SAFETY: As above, reading the command register into `cmd`, a valid `u16`.
    let rc =
        unsafe { bindings::pci_read_config_word(raw(dev), bindings::PCI_COMMAND as i32, &mut cmd) };
    if rc != 0 || cmd == u16::MAX {
        return !present(dev);
    }
    u32::from(cmd) & bindings::PCI_COMMAND_MASTER == 0
}

impl EnabledDevice {
    /// Enables `pdev`'s memory decoding (`pci_enable_device_mem()`); called during probe.
    pub(crate) fn new(pdev: &pci::Device<Core<'_>>) -> Result<Self> {
        let dev: &pci::Device = pdev;
        // SAFETY: `dev` is a valid, bound PCI device for the duration of probe.
        to_result(unsafe { bindings::pci_enable_device_mem(raw(dev)) })?;
        Ok(Self { pdev: dev.into() })
    }
}

impl Drop for EnabledDevice {
    fn drop(&mut self) {
        // SAFETY: By the type invariants the device was enabled once by us and not disabled
        // since; the reference keeps the `struct pci_dev` alive.
        unsafe { bindings::pci_disable_device(raw(&self.pdev)) };
    }
}
