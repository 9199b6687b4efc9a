// SPDX-License-Identifier: GPL-2.0-only

//! Setting a PCI device's DMA masks in probe.
//!
//! [`kernel::dma::Device`]'s mask setters are `unsafe`: they must not run concurrently with a
//! DMA allocation or mapping for the device. [`set_masks`] takes the device in the [`Core`]
//! context, which only probe and remove have: the driver core holds the device lock, no other
//! driver uses the device, and the calling driver's own callbacks for it do not run
//! concurrently. What the type cannot see is work the same probe started earlier on another
//! thread; the caller sets the masks before it starts any (pcifab's probe does so first).

use kernel::{
    device::Core,
    dma::{Device as _, DmaMask},
    pci,
    prelude::*,
};

/// Sets `pdev`'s streaming and coherent DMA masks to `mask` and its largest DMA segment to
/// `max_seg`; called in probe before the driver starts any work that could allocate or map
/// DMA memory for the device on another thread.
pub(crate) fn set_masks(pdev: &pci::Device<Core<'_>>, mask: DmaMask, max_seg: u32) -> Result {
    // SAFETY: `Core` is probe's (or remove's) context: the device lock is held, no other
    // driver uses the device, and the caller started no other thread that allocates or maps
    // DMA memory for it (see above), so nothing does so concurrently.
    unsafe {
        pdev.dma_set_mask_and_coherent(mask)?;
        pdev.dma_set_max_seg_size(max_seg);
    }
    Ok(())
}
