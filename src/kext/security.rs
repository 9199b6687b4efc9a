// SPDX-License-Identifier: GPL-2.0-only

//! The calling task's capabilities, kernel lockdown, and taint.

use kernel::{bindings, prelude::*};

/// A capability the driver checks (`include/uapi/linux/capability.h`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Capability {
    /// `CAP_SYS_ADMIN`: change the fabric's configuration.
    SysAdmin,
    /// `CAP_SYS_RAWIO`: raw firmware writes and raw bus addresses.
    SysRawio,
}

/// Whether the current task has `cap` (and marks the task as having used it, as the C
/// `capable()` does).
pub(crate) fn capable(cap: Capability) -> bool {
    let cap = match cap {
        Capability::SysAdmin => bindings::CAP_SYS_ADMIN,
        Capability::SysRawio => bindings::CAP_SYS_RAWIO,
    };
    // SAFETY: `capable()` only reads the current task's credentials; `cap` is one of the
    // capability numbers above, all valid. The constants are small, so the cast is lossless.
    unsafe { bindings::capable(cap as i32) }
}

/// Why the driver asks whether the kernel is locked down.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Lockdown {
    /// Raw access to a PCI device's firmware (as `LOCKDOWN_PCI_ACCESS` guards config space).
    PciAccess,
    /// DMA to or from an arbitrary bus address (as `LOCKDOWN_DEV_MEM` guards `/dev/mem`).
    DevMem,
}

/// `EPERM` if the kernel's lockdown forbids what `why` names, as the C `security_locked_down()`
/// reports it; always `Ok` in a kernel without security modules.
pub(crate) fn locked_down(why: Lockdown) -> Result {
    #[cfg(CONFIG_SECURITY)]
    {
        let reason = match why {
            Lockdown::PciAccess => bindings::lockdown_reason_LOCKDOWN_PCI_ACCESS,
            Lockdown::DevMem => bindings::lockdown_reason_LOCKDOWN_DEV_MEM,
        };
        // SAFETY: `security_locked_down()` takes any `lockdown_reason` and only reads state.
        let ret = unsafe { bindings::security_locked_down(reason) };
        if ret != 0 {
            return Err(Error::from_errno(ret));
        }
    }
    #[cfg(not(CONFIG_SECURITY))]
    let _ = why;
    Ok(())
}

/// Taints the kernel as fwctl does for a raw firmware write (`TAINT_FWCTL`): whatever happens
/// afterwards may be the firmware's doing. Lockdep stays valid.
pub(crate) fn taint_fwctl() {
    // SAFETY: `add_taint()` accepts any taint flag below `TAINT_FLAGS_COUNT`; `TAINT_FWCTL`
    // is one, and `LOCKDEP_STILL_OK` is a valid lockdep state.
    unsafe { bindings::add_taint(bindings::TAINT_FWCTL, bindings::lockdep_ok_LOCKDEP_STILL_OK) };
}
