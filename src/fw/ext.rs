// SPDX-License-Identifier: GPL-2.0-only

//! pcifab's firmware extensions (`Documentation/mrpc.rst`): commands and registers PAX
//! firmware does not have. The driver asks for them once at probe ([`Features::discover`]);
//! on PAX firmware the query is refused with `ERR_CMD_INVALID` and the driver uses none of
//! them.

use kernel::prelude::*;

use super::{call, payload, Command, Failure, ERR_CMD_INVALID, ERR_SUBCMD_INVALID};
use crate::Mep;

/// The first opcode of pcifab's extensions; they end at 0xf0ff.
pub(crate) const FIRST: u32 = 0xf000;

/// Function telemetry (`FUNCTION_TELEMETRY`, 0xF002).
pub(crate) const TELEMETRY: u32 = 1 << 0;
/// P2P window routes and grants (`P2P_ROUTE`, 0xF004).
pub(crate) const P2P_ROUTES: u32 = 1 << 1;
/// The DMA engine's register block (GAS 0x3000).
pub(crate) const DMA_ENGINE: u32 = 1 << 2;
/// The `UNBIND_REQUEST` fabric event (0x80): the firmware waits for a host to let a function
/// go before it takes it away.
pub(crate) const UNBIND_REQUEST_EVENT: u32 = 1 << 3;
/// Every feature this driver knows.
pub(crate) const KNOWN: u32 = TELEMETRY | P2P_ROUTES | DMA_ENGINE | UNBIND_REQUEST_EVENT;

/// Names of the feature bits, as sysfs and the logs show them.
pub(crate) const NAMES: [(u32, &str); 4] = [
    (TELEMETRY, "telemetry"),
    (P2P_ROUTES, "p2p-routes"),
    (DMA_ENGINE, "dma-engine"),
    (UNBIND_REQUEST_EVENT, "unbind-request"),
];

payload! {
    /// `EXT_FEATURES` (0xF000): no input.
    struct FeaturesReq[0] {}

    struct FeaturesReply[8] {
        version: u32,
        features: u32,
    }

    /// `FUNCTION_TELEMETRY` (0xF002).
    pub(crate) struct TelemetryReq[8] {
        version: u16,
        size: u16,
        pdfid: u16,
        rsvd: u16,
    }

    pub(crate) struct Telemetry[24] {
        version: u16,
        size: u16,
        pdfid: u16,
        rsvd0: u16,
        pub(crate) temp_centi: i32,
        pub(crate) power_mw: u32,
        pub(crate) utilisation: u8,
        rsvd1: [u8; 3],
        pub(crate) health: u32,
    }
}

impl Command for FeaturesReq {
    const OPCODE: u32 = FIRST;
    type Reply = FeaturesReply;
}

impl TelemetryReq {
    pub(crate) fn new(pdfid: u16) -> Self {
        Self {
            version: 1,
            size: 8,
            pdfid,
            rsvd: 0,
        }
    }
}

/// `FUNCTION_TELEMETRY`'s opcode.
pub(crate) const TELEMETRY_OPCODE: u32 = 0xf002;

impl Command for TelemetryReq {
    const OPCODE: u32 = TELEMETRY_OPCODE;
    type Reply = Telemetry;
}

/// The extensions the firmware offers.
#[derive(Clone, Copy, Default)]
pub(crate) struct Features(u32);

impl Features {
    /// Asks the firmware which extensions it has. PAX firmware answers `ERR_CMD_INVALID`:
    /// none. Bits this driver does not know are ignored.
    pub(crate) fn discover(mep: &Mep) -> Result<Self> {
        match call(mep, &FeaturesReq {}) {
            Ok(r) if r.version >= 1 => Ok(Self(r.features & KNOWN)),
            Ok(_) => Ok(Self(0)),
            Err(Failure {
                fw_ret: ERR_CMD_INVALID | ERR_SUBCMD_INVALID,
                ..
            }) => Ok(Self(0)),
            Err(Failure { fw_ret: 0, err }) => Err(err),
            Err(f) => {
                dev_warn!(
                    mep.pdev,
                    "feature query refused ({:#x}): using no extensions\n",
                    f.fw_ret
                );
                Ok(Self(0))
            }
        }
    }

    pub(crate) fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    /// `Ok` if the firmware has `bit`, else `EOPNOTSUPP`.
    pub(crate) fn require(self, bit: u32) -> Result {
        if self.has(bit) {
            Ok(())
        } else {
            Err(EOPNOTSUPP)
        }
    }

    pub(crate) fn from_bits(bits: u32) -> Self {
        Self(bits & KNOWN)
    }

    pub(crate) fn bits(self) -> u32 {
        self.0
    }
}
