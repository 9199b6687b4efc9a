// SPDX-License-Identifier: GPL-2.0-only

//! Safe wrappers of the few C interfaces pcifab needs that the kernel crate does not cover yet.
//!
//! Every raw `bindings::` use of the composition code lives in one of these files, behind a
//! function whose documentation states what it relies on.

pub(crate) mod iomem;
pub(crate) mod pci_tree;
pub(crate) mod slot;
