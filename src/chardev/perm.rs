// SPDX-License-Identifier: GPL-2.0-only

//! Who may run what through `/dev/pcifabN`: the privilege classes of MRPC commands and of
//! the ioctls that change the fabric, as fwctl classes its RPCs.

use kernel::prelude::*;

use crate::kext::security::{self, capable, Capability, Lockdown};

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

/// Classes an MRPC command by its id and, where a command has them, its sub-command
/// (`Documentation/uapi.rst` lists them). `input` is the caller's input; missing bytes read
/// as zero, as the firmware reads them.
pub(crate) fn mrpc_class(cmd: u32, input: &[u8]) -> MrpcClass {
    let byte = |at: usize| input.get(at).copied().unwrap_or(0);
    match cmd {
        // Echo, PAX id.
        0x41 | 0x81 => MrpcClass::ReadOnly,
        // Die temperature: GET reads; SET_CLOCK, SET_MEAS and STOP change the sensor.
        0x04 if input.get(..4).unwrap_or(&[]) == [2, 0, 0, 0] => MrpcClass::ReadOnly,
        // Fabric database dump: the single-shot sections (FABRIC, PAX_ALL, PAX general, HVD,
        // FAB_PORT, EP_PORT, HVD_DETAIL) only read; the chunked start/get/finish steps own
        // a dump session in the firmware.
        0x83 if byte(0) <= 6 => MrpcClass::ReadOnly,
        // Other die-temperature and database-dump sub-commands, the topology dump (a session
        // the driver's inventory read uses), GFMS events (GET consumes the queue the driver
        // reads UNBIND_REQUEST from; CLEAR empties it), bind/unbind, device management, port
        // configuration, port control.
        0x04 | 0x82 | 0x83 | 0x84 | 0x85 | 0x88 | 0x89 | 0x8d => MrpcClass::Configuration,
        // P2P routes: LIST and GRANT_LIST read; adding and deleting routes and grants
        // change what a host can reach.
        0xf004 if matches!(byte(4), 3 | 6) => MrpcClass::ReadOnly,
        0xf004 => MrpcClass::Configuration,
        // pcifab's read-only extensions.
        0xf000..=0xf07f => MrpcClass::ReadOnly,
        // pcifab's configuration extensions.
        0xf080..=0xf0ff => MrpcClass::Configuration,
        _ => MrpcClass::DebugWrite,
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
