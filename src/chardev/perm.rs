// SPDX-License-Identifier: GPL-2.0-only

//! Who may run what through `/dev/pcifabN`: the privilege classes of MRPC commands and of
//! the ioctls that change the fabric, as fwctl classes its RPCs.

use kernel::prelude::*;

use crate::{
    fw::{self, raw::Effect},
    kext::security::{self, capable, Capability, Lockdown},
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
/// caller's input.
pub(crate) fn mrpc_class(cmd: u32, input: &[u8]) -> MrpcClass {
    match fw::raw::effect(cmd, input) {
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

/// Whether the calling task may change the fabric's configuration (`CAP_SYS_ADMIN`).
pub(super) fn allowed_config() -> Result {
    allow(MrpcClass::Configuration, Lockdown::PciAccess)
}
