// SPDX-License-Identifier: GPL-2.0-only

//! Setting a PCI device's DMA masks in probe.
//!
//! [`kernel::dma::Device`]'s mask setters are `unsafe`: they must not race a DMA allocation or
//! mapping for the device. In probe, before the driver allocated or mapped anything, nothing
//! else does either: the driver core holds the device lock, and no other driver uses the
//! device. [`set_masks`] is that case, checked by the type: it takes the device in the
//! [`Core`] context only probe (and remove) have, and the caller runs it before its first DMA
//! allocation or mapping.

use kernel::{
    device::Core,
    dma::{Device as _, DmaMask},
    pci,
    prelude::*,
};

/// Sets `pdev`'s streaming and coherent DMA masks to `mask` and its largest DMA segment to
/// `max_seg`; called in probe before the driver's first DMA allocation or mapping.
pub(crate) fn set_masks(pdev: &pci::Device<Core<'_>>, mask: DmaMask, max_seg: u32) -> Result {
    // SAFETY: `Core` is probe's (or remove's) context: the device lock is held and the driver's
    // own DMA use of the device has not started (it calls this first), so nothing allocates
    // or maps for the device concurrently.
    unsafe {
        pdev.dma_set_mask_and_coherent(mask)?;
        pdev.dma_set_max_seg_size(max_seg);
    }
    Ok(())
}
