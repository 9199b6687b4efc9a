// SPDX-License-Identifier: GPL-2.0-only

//! Who may run what through `/dev/pcifabN`: the privilege classes of MRPC commands and of
//! the ioctls that change the fabric, as fwctl classes its RPCs.

use kernel::prelude::*;

use crate::{
    fw::{self, raw::Effect},
    kext::security::{self, capable, Capability, Lockdown},
    uapi,
};

/// Which privilege an MRPC command needs, as fwctl classes its RPCs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum MrpcClass {
    /// Reads state and changes nothing, not even a session of the driver's: open to anyone
    /// who can open the device.
    ReadOnly,
    /// Changes the fabric's configuration or firmware state the driver relies on (event
    /// queues, dump sessions): `CAP_SYS_ADMIN`.
    Configuration,
    /// Anything else, unknown commands included: `CAP_SYS_RAWIO`, refused under lockdown,
    /// and it taints the kernel (`TAINT_FWCTL`), as fwctl's debug-write RPCs do.
    DebugWrite,
}

/// Classes an MRPC command by what it does ([`fw::raw::effect`], from its id and, where a
/// command has them, its sub-command; `Documentation/uapi.rst` lists them). `input` is the
/// caller's input, `features` the extensions the probe discovered (an extension it did not
/// discover is a command the driver does not know).
pub(crate) fn mrpc_class(cmd: u32, input: &[u8], features: fw::ext::Features) -> MrpcClass {
    match fw::raw::effect(cmd, input, features) {
        Effect::Reads => MrpcClass::ReadOnly,
        Effect::Configures => MrpcClass::Configuration,
        Effect::Unknown => MrpcClass::DebugWrite,
    }
}

/// Whether the calling task may run a command of `class`: `EPERM` if not. A debug write
/// that is allowed taints the kernel.
pub(super) fn allow(class: MrpcClass, lockdown: Lockdown) -> Result {
    match class {
        MrpcClass::ReadOnly => Ok(()),
        MrpcClass::Configuration if capable(Capability::SysAdmin) => Ok(()),
        MrpcClass::DebugWrite if capable(Capability::SysRawio) => {
            security::locked_down(lockdown)?;
            security::taint_fwctl();
            Ok(())
        }
        _ => Err(EPERM),
    }
}

/// Whether the calling task may wait `timeout_ms` (0: the default) for an MRPC command:
/// without `CAP_SYS_ADMIN`, only 0 or [`uapi::MRPC_USER_MIN_TIMEOUT_MS`] to
/// [`uapi::MRPC_USER_MAX_TIMEOUT_MS`], else `EINVAL`. The mailbox is the switch's only one:
/// a long wait holds every other caller off for as long, and a command given up on before
/// the firmware finished it leaves the mailbox to that command until it does.
pub(super) fn allow_mrpc_timeout(timeout_ms: u32) -> Result {
    let bounded = timeout_ms == 0
        || (uapi::MRPC_USER_MIN_TIMEOUT_MS..=uapi::MRPC_USER_MAX_TIMEOUT_MS).contains(&timeout_ms);
    if bounded || capable(Capability::SysAdmin) {
        Ok(())
    } else {
        Err(EINVAL)
    }
}

/// Whether the calling task may change the fabric's configuration (`CAP_SYS_ADMIN`).
pub(super) fn allowed_config() -> Result {
    allow(MrpcClass::Configuration, Lockdown::PciAccess)
}
