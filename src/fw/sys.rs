// SPDX-License-Identifier: GPL-2.0-only

//! The part's own commands: die temperature and the PAX id (switchtec-user `lib/switchtec.c`,
//! `inc/switchtec/mrpc.h`).

use super::{payload, Command, Zeroed};

payload! {
    /// DIETEMP (0x04) with sub-command GET (Gen4: 2).
    pub(crate) struct DieTempGet[4] {
        sub: u32,
    }

    /// The die temperature in hundredths of a degree Celsius.
    pub(crate) struct DieTemp[4] {
        pub(crate) centi: u32,
    }

    /// GET_PAX_ID (0x81): no input.
    pub(crate) struct GetPaxId[0] {}

    /// The switch's index in the fabric, what bind requests call `host_sw_idx`.
    pub(crate) struct PaxId[1] {
        pub(crate) id: u8,
    }
}

impl DieTempGet {
    pub(crate) const fn new() -> Self {
        Self { sub: 2 }
    }
}

impl Command for DieTempGet {
    const OPCODE: u32 = 0x04;
    type Reply = DieTemp;
}

impl GetPaxId {
    pub(crate) const fn new() -> Self {
        Self::ZEROED
    }
}

impl Command for GetPaxId {
    const OPCODE: u32 = 0x81;
    type Reply = PaxId;
}
