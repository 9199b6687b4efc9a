// SPDX-License-Identifier: GPL-2.0-only

//! GFMS_EVENT (0x89): the fabric manager's event queue (switchtec-user `lib/fabric.c`,
//! `switchtec_get_gfms_events`; codes from `enum switchtec_gfms_event_type`).

use kernel::prelude::*;

use super::{ext, lie, payload, query, read_at, Command};
use crate::Mep;

pub(super) const OPCODE: u32 = 0x89;
const SUB_GET: u8 = 1;
/// Events one GET asks for.
const REQ_NUM: u16 = 32;
/// Bytes of event entries one reply carries at most.
const DATA: usize = 1020;
/// `remain_num_flag`: events were lost.
const OVERFLOW: u16 = 0x8000;

/// PAX event codes (0-13) the driver reads the data of; every event makes the driver's view
/// of the fabric stale.
pub(crate) const BIND: u8 = 6;
pub(crate) const UNBIND: u8 = 7;
/// pcifab's extension ([`super::ext::UNBIND_REQUEST_EVENT`]): the firmware is about to take a
/// function away from a host and waits for the host to let it go.
pub(crate) const UNBIND_REQUEST: u8 = 0x80;
/// The highest PAX event code (`enum switchtec_gfms_event_type`).
const LAST_PAX_CODE: u8 = 13;

payload! {
    struct Get[4] {
        sub: u8,
        rsvd: u8,
        req_num: u16,
    }

    struct GetReply[1024] {
        num: u16,
        remain_num_flag: u16,
        data: [u8; DATA],
    }

    struct EntryHdr[4] {
        entry_len: u16,
        event_code: u8,
        src_sw_id: u8,
    }

    /// `struct switchtec_gfms_event_bind`, also the data of [`UNBIND_REQUEST`].
    struct BindData[6] {
        host_sw_idx: u8,
        host_phys_port_id: u8,
        log_port_id: u8,
        rsvd: u8,
        pdfid: u16,
    }
}

impl Command for Get {
    const OPCODE: u32 = OPCODE;
    type Reply = GetReply;
}

/// One event of the queue.
#[derive(Clone, Copy)]
pub(crate) struct Event {
    pub(crate) code: u8,
    /// For binding events ([`BIND`], [`UNBIND`], [`UNBIND_REQUEST`]): the host's upstream
    /// port, the logical port and the function.
    pub(crate) binding: Option<(u8, u8, u16)>,
}

/// What one read of the queue found.
pub(crate) struct Batch {
    pub(crate) events: KVec<Event>,
    /// More events wait in the queue.
    pub(crate) more: bool,
    /// The firmware dropped events: the reader must assume anything changed.
    pub(crate) overflow: bool,
}

/// Reads (and so consumes) up to 32 events.
pub(crate) fn read(mep: &Mep) -> Result<Batch> {
    let r = query(
        mep,
        &Get {
            sub: SUB_GET,
            rsvd: 0,
            req_num: REQ_NUM,
        },
    )?;
    // More events than asked for cannot be true: nothing of the reply is believed (the
    // caller reads the whole fabric again).
    if r.num > REQ_NUM {
        lie(
            mep,
            format_args!(
                "fabric event reply with {} events, {} asked for",
                r.num, REQ_NUM
            ),
        );
        return Err(EIO);
    }
    let unbind_requests = mep.features().has(ext::UNBIND_REQUEST_EVENT);
    let mut events = KVec::with_capacity(usize::from(r.num), GFP_KERNEL)?;
    let mut at = 0usize;
    for _ in 0..r.num {
        let hdr: EntryHdr = read_at(&r.data, at)?;
        let len = usize::from(hdr.entry_len);
        let end = at.checked_add(len).ok_or(EIO)?;
        if len < core::mem::size_of::<EntryHdr>() || end > DATA {
            lie(
                mep,
                format_args!(
                    "fabric event list of {} events with an entry of {} bytes at {}",
                    r.num, len, at
                ),
            );
            return Err(EIO);
        }
        if hdr.event_code > LAST_PAX_CODE && !(hdr.event_code == UNBIND_REQUEST && unbind_requests)
        {
            // Kept (it makes the view stale as any event does), but said.
            lie(
                mep,
                format_args!("fabric event with unknown code {:#04x}", hdr.event_code),
            );
        }
        let binding = match hdr.event_code {
            BIND | UNBIND | UNBIND_REQUEST => {
                let d: BindData = read_at(&r.data[..end], at + 4)?;
                Some((d.host_phys_port_id, d.log_port_id, d.pdfid))
            }
            _ => None,
        };
        events.push(
            Event {
                code: hdr.event_code,
                binding,
            },
            GFP_KERNEL,
        )?;
        at = end;
    }
    Ok(Batch {
        more: r.num != 0 && r.remain_num_flag & !OVERFLOW != 0,
        overflow: r.remain_num_flag & OVERFLOW != 0,
        events,
    })
}
