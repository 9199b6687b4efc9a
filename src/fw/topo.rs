// SPDX-License-Identifier: GPL-2.0-only

//! TOPO_INFO_DUMP (0x82): the switch's physical ports, read in a START / STATUS / DATA /
//! FINISH session (switchtec-user `lib/fabric.c`, `topo_info_dump_gen4`).

use kernel::prelude::*;

use super::{payload, query, read_at, Command};
use crate::Mep;

pub(super) const OPCODE: u32 = 0x82;
const SUB_START: u8 = 1;
const SUB_STATUS: u8 = 2;
const SUB_DATA: u8 = 3;
const SUB_FINISH: u8 = 4;
/// STATUS: the firmware is still collecting the dump.
const STATUS_WAIT: u8 = 2;
/// STATUS: the dump is ready to be read.
const STATUS_READY: u8 = 3;
/// Times STATUS is asked before giving up on a dump that never gets ready.
const STATUS_TRIES: usize = 100;
/// Bytes of the dump before the port records.
const HEADER: usize = 56;
/// Where the header holds the bitmap of enabled ports.
const PORT_BITMAP_AT: usize = 48;
/// Most ports a Gen4 part has.
const MAX_PORTS: usize = 64;
/// Data bytes one DATA step returns at most.
const DATA_MAX: usize = 1000;

payload! {
    /// START, STATUS and FINISH.
    struct Step[1] {
        sub: u8,
    }

    struct StepReply[1] {
        status: u8,
    }

    struct StatusReply[4] {
        status: u8,
        rsvd: u8,
        len_dw: u16,
    }

    /// DATA from byte `offset` of the dump.
    struct Data[4] {
        sub: u8,
        rsvd: u8,
        offset: u16,
    }

    struct DataReply[1004] {
        status: u8,
        rsvd: u8,
        len_dw: u16,
        data: [u8; DATA_MAX],
    }

    /// A GPIO the port's connector uses.
    struct Gpio[4] {
        idx: u16,
        value: u8,
        rsvd: u8,
    }

    /// `struct switchtec_fab_port_info`.
    pub(crate) struct PortInfo[32] {
        pub(crate) phys_port_id: u8,
        pub(crate) port_type: u8,
        clock_channel: u8,
        connector_id: u8,
        gpios: [Gpio; 5],
        cfg_width: u8,
        pub(crate) neg_width: u8,
        cfg_rate: u8,
        pub(crate) neg_rate: u8,
        major_ltssm: u8,
        minor_ltssm: u8,
        rsvd: [u8; 2],
    }
}

impl Command for Step {
    const OPCODE: u32 = OPCODE;
    type Reply = StepReply;
}

payload! {
    struct StatusReq[1] {
        sub: u8,
    }
}

impl Command for StatusReq {
    const OPCODE: u32 = OPCODE;
    type Reply = StatusReply;
}

impl Command for Data {
    const OPCODE: u32 = OPCODE;
    type Reply = DataReply;
}

impl PortInfo {
    /// The link is trained (the firmware reports a negotiated width).
    pub(crate) fn link_up(&self) -> bool {
        self.neg_width != 0
    }
}

/// Reads every enabled port. The caller holds the fabric's dump-session lock.
pub(crate) fn ports(mep: &Mep) -> Result<KVec<PortInfo>> {
    query(mep, &Step { sub: SUB_START })?;
    let result = read(mep);
    // FINISH whatever happened, so the firmware drops its snapshot.
    let _ = query(mep, &Step { sub: SUB_FINISH });
    result
}

fn read(mep: &Mep) -> Result<KVec<PortInfo>> {
    let mut total = None;
    for _ in 0..STATUS_TRIES {
        let s = query(mep, &StatusReq { sub: SUB_STATUS })?;
        match s.status {
            STATUS_WAIT => continue,
            STATUS_READY => {
                total = Some(usize::from(s.len_dw) * 4);
                break;
            }
            _ => return Err(EIO),
        }
    }
    let total = total.ok_or(ETIMEDOUT)?;
    if total < HEADER || total > HEADER + MAX_PORTS * core::mem::size_of::<PortInfo>() {
        return Err(EIO);
    }
    let mut dump = KVec::with_capacity(total, GFP_KERNEL)?;
    while dump.len() < total {
        let offset = u16::try_from(dump.len()).map_err(|_| EIO)?;
        let r = query(
            mep,
            &Data {
                sub: SUB_DATA,
                rsvd: 0,
                offset,
            },
        )?;
        let len = usize::from(r.len_dw) * 4;
        if len == 0 || len > DATA_MAX || len > total - dump.len() {
            return Err(EIO);
        }
        dump.extend_from_slice(&r.data[..len], GFP_KERNEL)?;
    }
    let bitmap: u64 = read_at(&dump, PORT_BITMAP_AT)?;
    let count = bitmap.count_ones() as usize;
    // The dump must hold the records its bitmap counts before anything is sized by it.
    if core::mem::size_of::<PortInfo>()
        .checked_mul(count)
        .and_then(|b| b.checked_add(HEADER))
        .is_none_or(|end| end > dump.len())
    {
        return Err(EIO);
    }
    let mut ports = KVec::with_capacity(count, GFP_KERNEL)?;
    for i in 0..count {
        let at = core::mem::size_of::<PortInfo>()
            .checked_mul(i)
            .and_then(|o| o.checked_add(HEADER))
            .ok_or(EIO)?;
        ports.push(read_at::<PortInfo>(&dump, at)?, GFP_KERNEL)?;
    }
    Ok(ports)
}
