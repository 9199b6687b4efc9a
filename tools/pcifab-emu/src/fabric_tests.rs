// SPDX-License-Identifier: GPL-2.0-only
//! Tests that drive a whole emulated fabric (`fabric::Fabric`) through the
//! MEPs' registers, their firmware and the control socket. They sit above
//! every module they exercise, so the modules themselves need not know the
//! fabric or the control socket to be tested through them.

mod ep;
mod hostile;
mod p2p;
