// SPDX-License-Identifier: GPL-2.0-only
//! Faults injected into a host's emulated firmware through the emulator's control socket,
//! always cleared again, and the check that the mailbox works after one.

use crate::checks::cli::{selftest_json, CMD_TIMEOUT_SHORT};
use crate::checks::guest::dmesg_clean;
use crate::fabric::{EmuControl, Host};

/// Injects `fault` into host `h`'s MEP, runs `body`, and clears the fault whatever happened.
pub fn with_fault(
    emu: &EmuControl,
    h: &mut Host,
    fault: &str,
    body: impl FnOnce(&mut Host) -> Result<(), String>,
) -> Result<(), String> {
    emu.request(&format!("fault {} {fault}", h.name))
        .map_err(|e| format!("{}: {e}", h.name))?;
    let r = body(h);
    let cleared = emu
        .request(&format!("fault clear {}", h.name))
        .map_err(|e| format!("{}: {e}", h.name));
    r.and(cleared.map(|_| ()))
}

/// After a fault: a 64-byte echo works again and dmesg is clean.
pub fn recovered(h: &mut Host) -> Result<(), String> {
    selftest_json(h, "echo --count 20 --size 64", CMD_TIMEOUT_SHORT)
        .map_err(|e| format!("after `fault clear`: {e}"))?;
    dmesg_clean(h)
}

/// Clears host `.1`'s emulator faults when dropped, whatever path the scenario takes.
pub struct ClearFault(pub EmuControl, pub &'static str);

impl Drop for ClearFault {
    fn drop(&mut self) {
        let _ = self.0.request(&format!("fault clear {}", self.1));
    }
}
