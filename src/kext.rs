// SPDX-License-Identifier: GPL-2.0-only

//! Safe wrappers for the kernel interfaces pcifab needs that the Rust abstractions of Linux 7.3
//! do not offer yet.
//!
//! Each file is one small abstraction written the way upstream ones are: the raw `bindings::`
//! use and its `unsafe` stay in here, behind a safe function whose documentation states the
//! invariants it relies on, so the driver's files above it need neither.

pub(crate) mod binding;
pub(crate) mod dma;
pub(crate) mod dmaep_registry;
pub(crate) mod ida;
pub(crate) mod iomem;
pub(crate) mod kobject;
pub(crate) mod miscdev;
pub(crate) mod pci_enable;
pub(crate) mod pci_tree;
pub(crate) mod security;
pub(crate) mod signal;
pub(crate) mod sleep;
pub(crate) mod slot;
pub(crate) mod sysfs;
pub(crate) mod user_pages;
pub(crate) mod workqueue;
