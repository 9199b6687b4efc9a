// SPDX-License-Identifier: GPL-2.0-only

//! Safe wrappers for kernel interfaces the Rust abstractions of Linux 7.3 do not offer yet.
//!
//! Each file is one small abstraction written the way upstream ones are: the raw `bindings::`
//! use and its `unsafe` stay in here, behind a safe function with its invariants documented,
//! so the driver's files above it need neither.

pub(crate) mod security;
pub(crate) mod workqueue;
