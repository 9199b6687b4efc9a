// SPDX-License-Identifier: GPL-2.0-only

//! GFMS_DB_DUMP (0x83): the fabric manager's database, read in START / GET / FINISH steps
//! that name the section type (switchtec-user `lib/fabric.c`, `gfms_dump_start`,
//! `gfms_dump_get`, `gfms_dump_finish`, `gfms_pax_all_parse` and the structs of
//! `inc/switchtec/fabric.h`).
//!
//! The driver reads two sections: PAX_ALL (the PAX's general record, every host's virtual
//! switch and every endpoint port with its functions) for its view of the fabric, and HVD
//! (one host's virtual switch) before it binds or unbinds. Every size the firmware states is
//! checked against what was read; a record that does not fit is `EIO`.

use kernel::prelude::*;

use super::{payload, query, read_at, Command};
use crate::Mep;

pub(super) const OPCODE: u32 = 0x83;
/// Section sub-commands (`MRPC_GFMS_DB_DUMP_*`).
pub(crate) const PAX_ALL: u8 = 1;
pub(crate) const HVD: u8 = 3;
pub(crate) const EP_PORT: u8 = 5;
/// Steps of a chunked dump.
const TYPE_START: u32 = 1;
pub(super) const TYPE_GET: u32 = 2;
const TYPE_FINISH: u32 = 3;
/// Header dwords of a GET reply, which its `size_dw` counts.
const GET_HEADER_DW: u32 = 3;
/// Data bytes one GET reply carries at most.
const GET_DATA: usize = 1012;
/// Largest dump the driver reads: room for 2,048 functions and every host's ports.
const MAX_DUMP: usize = 256 * 1024;
/// Logical port entries per logical port in an HVD record (functions of a multi-function
/// binding).
pub(crate) const FUNCS_PER_LOG_PORT: usize = 8;
/// Function types (`sriov_cap_pf`, as switchtec-user's `cli/fabric.c` names them).
const FUNC_SRIOV_VF: u8 = 0;
const FUNC_SRIOV_PF: u8 = 3;
/// Endpoint port record types.
const PORT_TYPE_EP: u8 = 0;
const PORT_TYPE_SWITCH: u8 = 1;

payload! {
    /// START: `param` is the host index (HVD) or the endpoint's physical port (EP_PORT).
    struct Start[8] {
        sub: u8,
        param: u8,
        rsvd: [u8; 2],
        ty: u32,
    }

    struct StartReply[8] {
        dw_len: u32,
        num_of_switch: u32,
    }

    /// GET from dword `offset_dw` of the dump.
    struct Get[12] {
        sub: u8,
        param: u8,
        rsvd: [u8; 2],
        ty: u32,
        offset_dw: u32,
    }

    struct GetReply[1024] {
        offset_dw: u32,
        size_dw: u32,
        rsvd: u32,
        data: [u8; GET_DATA],
    }

    struct Finish[8] {
        sub: u8,
        rsvd: [u8; 3],
        ty: u32,
    }

    struct FinishReply[0] {}

    /// `struct switchtec_gfms_db_dump_section_hdr`.
    struct SectionHdr[12] {
        section_class: u8,
        pax_idx: u8,
        swfid: u16,
        resp_size_dw: u32,
        rsvd: u32,
    }

    /// `struct switchtec_gfms_db_pax_general_body`.
    pub(crate) struct PaxGeneral[68] {
        pub(crate) phy_port_count: u8,
        pub(crate) hvd_count: u8,
        pub(crate) ep_count: u16,
        pub(crate) ep_function_count: u16,
        rsvd0: u16,
        rsvd1: [u32; 3],
        fid: [u16; 2],
        hfid: [u16; 2],
        vdfid: [u16; 2],
        pdfid: [u16; 2],
        rc_port_map: [u32; 2],
        ep_port_map: [u32; 2],
        fab_port_map: [u32; 2],
        free_port_map: [u32; 2],
    }

    /// The fixed part of `struct switchtec_gfms_db_hvd_body`.
    struct HvdHdr[8] {
        hvd_inst_id: u8,
        phy_pid: u8,
        hfid: u16,
        logical_port_count: u16,
        rsvd: u16,
    }

    /// `struct port_bound`: one function slot of a logical port.
    pub(crate) struct PortBound[4] {
        pub(crate) log_pid: u8,
        pub(crate) bound: u8,
        pub(crate) bound_pdfid: u16,
    }

    /// `struct switchtec_gfms_db_ep_port_hdr`.
    struct EpPortHdr[8] {
        ty: u8,
        phy_pid: u8,
        ep_count: u16,
        /// Bits 0-23: the record's size in dwords, header included.
        size: u32,
    }

    /// `struct switchtec_gfms_db_ep_port_attachement_hdr`.
    struct AttachHdr[8] {
        function_number: u16,
        attached_dsp_enumid: u16,
        /// Bits 0-23: the attachment's size in dwords, header included.
        size: u32,
    }

    struct Bar[2] {
        ty: u8,
        size: u8,
    }

    /// `struct switchtec_gfms_db_ep_port_attached_device_function`.
    pub(crate) struct EpFunction[36] {
        pub(crate) func_id: u16,
        pub(crate) pdfid: u16,
        pub(crate) sriov_cap_pf: u8,
        pub(crate) vf_num: u8,
        rsvd: u16,
        pub(crate) bound: u8,
        pub(crate) bound_pax_id: u8,
        pub(crate) bound_hvd_phy_pid: u8,
        pub(crate) bound_hvd_log_pid: u8,
        pub(crate) vid: u16,
        pub(crate) did: u16,
        sub_sys_vid: u16,
        sub_sys_did: u16,
        /// Bits 0-23: the class code; 24-31: the number of BARs.
        class_bars: u32,
        bars: [Bar; 6],
    }
}

impl Command for Start {
    const OPCODE: u32 = OPCODE;
    type Reply = StartReply;
}

impl Command for Get {
    const OPCODE: u32 = OPCODE;
    type Reply = GetReply;
}

impl Command for Finish {
    const OPCODE: u32 = OPCODE;
    type Reply = FinishReply;
}

impl EpFunction {
    pub(crate) fn class(&self) -> u32 {
        self.class_bars & 0xff_ffff
    }
}

/// Reads one whole section. The caller holds the fabric's dump-session lock.
pub(crate) fn dump(mep: &Mep, sub: u8, param: u8) -> Result<KVec<u8>> {
    let start = query(
        mep,
        &Start {
            sub,
            param,
            rsvd: [0; 2],
            ty: TYPE_START,
        },
    )?;
    let result = get_all(mep, sub, param, start.dw_len);
    // FINISH whatever happened, so the firmware drops its snapshot.
    let _ = query(
        mep,
        &Finish {
            sub,
            rsvd: [0; 3],
            ty: TYPE_FINISH,
        },
    );
    result
}

fn get_all(mep: &Mep, sub: u8, param: u8, dw_len: u32) -> Result<KVec<u8>> {
    let total = usize::try_from(dw_len)
        .ok()
        .and_then(|d| d.checked_mul(4))
        .filter(|&t| t <= MAX_DUMP)
        .ok_or(EIO)?;
    let mut data = KVec::with_capacity(total, GFP_KERNEL)?;
    while data.len() < total {
        let offset_dw = u32::try_from(data.len() / 4).map_err(|_| EIO)?;
        let r = query(
            mep,
            &Get {
                sub,
                // Only EP_PORT names its port again in GET; elsewhere the byte is reserved.
                param: if sub == EP_PORT { param } else { 0 },
                rsvd: [0; 2],
                ty: TYPE_GET,
                offset_dw,
            },
        )?;
        let len = r
            .size_dw
            .checked_sub(GET_HEADER_DW)
            .and_then(|d| usize::try_from(d).ok())
            .and_then(|d| d.checked_mul(4))
            .ok_or(EIO)?;
        if r.offset_dw != offset_dw || len == 0 || len > GET_DATA || len > total - data.len() {
            return Err(EIO);
        }
        data.extend_from_slice(&r.data[..len], GFP_KERNEL)?;
    }
    Ok(data)
}

/// One host's virtual switch.
pub(crate) struct Hvd {
    /// The host's index (its partition).
    pub(crate) inst: u8,
    /// The host's upstream physical port.
    pub(crate) phy_pid: u8,
    /// [`FUNCS_PER_LOG_PORT`] function slots per logical port, function-major: entry
    /// `j * log_ports + l` is function `j` of logical port `l` (as `cli/fabric.c` reads it).
    pub(crate) slots: KVec<PortBound>,
}

impl Hvd {
    /// Logical ports of the host.
    pub(crate) fn log_ports(&self) -> usize {
        self.slots.len() / FUNCS_PER_LOG_PORT
    }

    /// The functions bound to logical port `port`, function 0 first.
    pub(crate) fn bound(&self, port: u8) -> impl Iterator<Item = u16> + '_ {
        let n = self.log_ports();
        let l = usize::from(port);
        (0..FUNCS_PER_LOG_PORT)
            .filter_map(move |j| {
                if l < n {
                    self.slots.get(j * n + l)
                } else {
                    None
                }
            })
            .filter(|s| s.bound != 0)
            .map(|s| s.bound_pdfid)
    }
}

/// One endpoint function and the physical port of its endpoint.
pub(crate) struct Function {
    pub(crate) phy_pid: u8,
    pub(crate) rec: EpFunction,
    /// The SR-IOV physical function of the endpoint this function belongs to, if it is one
    /// of that PF's virtual functions, and its VF number.
    pub(crate) pf: Option<(u16, u8)>,
    /// Virtual functions of this function, if it is an SR-IOV PF.
    pub(crate) total_vfs: u8,
}

/// The PAX_ALL dump.
pub(crate) struct Db {
    pub(crate) general: PaxGeneral,
    pub(crate) hvds: KVec<Hvd>,
    pub(crate) functions: KVec<Function>,
}

/// Size in bytes of a record whose header states `size` (bits 0-23) in dwords.
fn rec_bytes(size: u32) -> Result<usize> {
    usize::try_from(size & 0xff_ffff)
        .ok()
        .and_then(|d| d.checked_mul(4))
        .ok_or(EIO)
}

/// The bytes of a section that starts at `at`: its header says how long it is.
fn section(data: &[u8], at: usize) -> Result<&[u8]> {
    let hdr: SectionHdr = read_at(data, at)?;
    let len = rec_bytes(hdr.resp_size_dw)?;
    let end = at.checked_add(len).ok_or(EIO)?;
    if len < core::mem::size_of::<SectionHdr>() {
        return Err(EIO);
    }
    data.get(at..end).ok_or(EIO)
}

/// Parses host records from `body` (an HVD section without its header) into `hvds`.
fn parse_hvds(mut body: &[u8], hvds: &mut KVec<Hvd>) -> Result {
    while !body.is_empty() {
        let hdr: HvdHdr = read_at(body, 0)?;
        let n = usize::from(hdr.logical_port_count)
            .checked_mul(FUNCS_PER_LOG_PORT)
            .ok_or(EIO)?;
        let base = core::mem::size_of::<HvdHdr>();
        // The record must hold the slots its header counts before anything is sized by it.
        if n.checked_mul(4)
            .and_then(|b| b.checked_add(base))
            .is_none_or(|end| end > body.len())
        {
            return Err(EIO);
        }
        let mut slots = KVec::with_capacity(n, GFP_KERNEL)?;
        for i in 0..n {
            slots.push(read_at::<PortBound>(body, base + 4 * i)?, GFP_KERNEL)?;
        }
        hvds.push(
            Hvd {
                inst: hdr.hvd_inst_id,
                phy_pid: hdr.phy_pid,
                slots,
            },
            GFP_KERNEL,
        )?;
        body = body.get(base + 4 * n..).ok_or(EIO)?;
    }
    Ok(())
}

/// Parses the functions of one attached endpoint at the start of `rec`; returns its size.
fn parse_attached(rec: &[u8], phy_pid: u8, out: &mut KVec<Function>) -> Result<usize> {
    let hdr: AttachHdr = read_at(rec, 0)?;
    let len = rec_bytes(hdr.size)?;
    let base = core::mem::size_of::<AttachHdr>();
    let fsize = core::mem::size_of::<EpFunction>();
    let count = usize::from(hdr.function_number);
    if len > rec.len() || base + count * fsize > len {
        return Err(EIO);
    }
    let first = out.len();
    let mut pf = None;
    for i in 0..count {
        let f: EpFunction = read_at(rec, base + fsize * i)?;
        // An SR-IOV PF states its VFs in `vf_num`; a VF its own number there.
        let total_vfs = if f.sriov_cap_pf == FUNC_SRIOV_PF {
            pf.get_or_insert(f.pdfid);
            f.vf_num
        } else {
            0
        };
        out.push(
            Function {
                phy_pid,
                rec: f,
                pf: None,
                total_vfs,
            },
            GFP_KERNEL,
        )?;
    }
    // The VFs of an endpoint belong to its SR-IOV PF.
    for f in out.iter_mut().skip(first) {
        if f.rec.sriov_cap_pf == FUNC_SRIOV_VF {
            let pf = pf.ok_or(EIO)?;
            f.pf = Some((pf, f.rec.vf_num));
        }
    }
    Ok(len)
}

/// Parses endpoint port records from `body` (an EP_PORT section without its header).
fn parse_ep_ports(mut body: &[u8], out: &mut KVec<Function>) -> Result {
    while !body.is_empty() {
        let hdr: EpPortHdr = read_at(body, 0)?;
        let len = rec_bytes(hdr.size)?;
        let base = core::mem::size_of::<EpPortHdr>();
        if len < base {
            return Err(EIO);
        }
        let rec = body.get(..len).ok_or(EIO)?;
        let mut at = base;
        match hdr.ty {
            PORT_TYPE_EP => {
                if at < len {
                    at += parse_attached(rec.get(at..).ok_or(EIO)?, hdr.phy_pid, out)?;
                }
            }
            PORT_TYPE_SWITCH => {
                // The downstream switch's own functions, then its endpoints.
                let sw: AttachHdr = read_at(rec, at)?;
                let skip = usize::from(sw.function_number)
                    .checked_mul(core::mem::size_of::<EpFunction>())
                    .and_then(|s| s.checked_add(core::mem::size_of::<AttachHdr>()))
                    .ok_or(EIO)?;
                at = at.checked_add(skip).ok_or(EIO)?;
                while at < len {
                    let used = parse_attached(rec.get(at..).ok_or(EIO)?, hdr.phy_pid, out)?;
                    if used == 0 {
                        return Err(EIO);
                    }
                    at += used;
                }
            }
            // Nothing attached.
            _ => at = len,
        }
        if at != len {
            return Err(EIO);
        }
        body = body.get(len..).ok_or(EIO)?;
    }
    Ok(())
}

/// Reads the whole database (PAX_ALL).
pub(crate) fn pax_all(mep: &Mep) -> Result<Db> {
    let data = dump(mep, PAX_ALL, 0)?;
    let hdr = core::mem::size_of::<SectionHdr>();
    // The PAX general section: header and body.
    let general: PaxGeneral = read_at(&data, hdr)?;
    let mut at = hdr + core::mem::size_of::<PaxGeneral>();
    let hvd = section(&data, at)?;
    let mut hvds = KVec::new();
    parse_hvds(hvd.get(hdr..).ok_or(EIO)?, &mut hvds)?;
    at += hvd.len();
    let ep = section(&data, at)?;
    let mut functions = KVec::new();
    parse_ep_ports(ep.get(hdr..).ok_or(EIO)?, &mut functions)?;
    at += ep.len();
    if at != data.len() {
        return Err(EIO);
    }
    Ok(Db {
        general,
        hvds,
        functions,
    })
}

/// Reads host `host`'s virtual switch (HVD).
pub(crate) fn hvd(mep: &Mep, host: u8) -> Result<Hvd> {
    let data = dump(mep, HVD, host)?;
    let sec = section(&data, 0)?;
    let mut hvds = KVec::new();
    parse_hvds(
        sec.get(core::mem::size_of::<SectionHdr>()..).ok_or(EIO)?,
        &mut hvds,
    )?;
    let mut it = hvds.into_iter();
    match (it.next(), it.next()) {
        (Some(h), None) if h.inst == host => Ok(h),
        _ => Err(EIO),
    }
}
