// SPDX-License-Identifier: GPL-2.0-only

//! The driver's view of the fabric: physical ports and every endpoint function (PFs and VFs)
//! with what each is bound to.
//!
//! It is read from the firmware with the PAX topology dump (`TOPO_INFO_DUMP`, 0x82) for the
//! ports and pcifab's `FABRIC_SUMMARY` (0xF001) and `FUNCTION_LIST` (0xF003) extensions for
//! the generation counter and the functions (`Documentation/mrpc.rst`). The view is cached
//! and read again when the firmware's generation moved or a fabric event arrived. Every
//! length the firmware reports is checked against the 1 KiB output buffer; a reply that does
//! not add up is `EIO`, never an out-of-bounds access.

use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Mutex, MutexGuard,
    },
};

use crate::{mrpc, Mep};

/// PAX die temperature command.
const CMD_DIETEMP: u32 = 0x04;
/// PAX topology information dump.
const CMD_TOPO_INFO_DUMP: u32 = 0x82;
/// pcifab extension: fabric summary.
const EXT_FABRIC_SUMMARY: u32 = 0xf001;
/// pcifab extension: one page of the function table.
const EXT_FUNCTION_LIST: u32 = 0xf003;

/// How often the function list is re-read when the fabric changes while paging.
const LIST_RETRIES: usize = 3;

/// One physical port.
#[derive(Clone, Copy, Default)]
pub(crate) struct Port {
    pub(crate) phys: u8,
    pub(crate) kind: u8,
    pub(crate) link_up: bool,
    pub(crate) width: u8,
    pub(crate) rate: u8,
}

/// One endpoint function, named by its PDFID.
#[derive(Clone, Copy, Default)]
pub(crate) struct Function {
    pub(crate) pdfid: u16,
    pub(crate) pf_pdfid: u16,
    pub(crate) vendor: u16,
    pub(crate) device: u16,
    pub(crate) class: u32,
    pub(crate) phys_port: u8,
    pub(crate) vf_index: u8,
    pub(crate) total_vfs: u8,
    pub(crate) flags: u8,
    pub(crate) bound_host: u8,
    pub(crate) bound_log_port: u8,
}

/// A consistent snapshot of the fabric.
pub(crate) struct View {
    pub(crate) generation: u32,
    pub(crate) host_count: u8,
    pub(crate) partition: u8,
    pub(crate) link_up_map: u64,
    pub(crate) ports: KVec<Port>,
    pub(crate) functions: KVec<Function>,
    valid: bool,
}

/// The cached view and its refresh logic.
#[pin_data]
pub(crate) struct Fabric {
    #[pin]
    view: Mutex<View>,
    /// A fabric event arrived since the view was read.
    stale: Atomic<bool>,
    /// Held across a multi-step firmware dump session (the topology dump's START to FINISH),
    /// the driver's and a raw caller's, so that neither runs a step inside the other's.
    #[pin]
    session: Mutex<()>,
}

/// Little-endian field readers that fail with `EIO` instead of reading past a reply.
pub(crate) fn le16(b: &[u8], at: usize) -> Result<u16> {
    let s = b.get(at..at + 2).ok_or(EIO)?;
    Ok(u16::from_le_bytes([s[0], s[1]]))
}

pub(crate) fn le32(b: &[u8], at: usize) -> Result<u32> {
    let s = b.get(at..at + 4).ok_or(EIO)?;
    Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

pub(crate) fn le64(b: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from(le32(b, at)?) | (u64::from(le32(b, at + 4)?) << 32))
}

pub(crate) fn byte(b: &[u8], at: usize) -> Result<u8> {
    b.get(at).copied().ok_or(EIO)
}

/// Runs a command the driver itself needs; a firmware error is `EIO`.
pub(crate) fn call(mep: &Mep, cmd: u32, input: &[u8], out: &mut [u8]) -> Result {
    let reply = mep.mrpc.run(mep, cmd, input, out, 0)?;
    if reply.status != mrpc::STATUS_DONE {
        dev_warn!(
            mep.pdev,
            "firmware failed command {:#x}: status {:#x} return {:#x}\n",
            cmd,
            reply.status,
            reply.ret
        );
        return Err(EIO);
    }
    Ok(())
}

/// Die temperature in hundredths of a degree Celsius.
pub(crate) fn die_temperature(mep: &Mep) -> Result<u32> {
    let mut out = [0u8; 4];
    call(mep, CMD_DIETEMP, &2u32.to_le_bytes(), &mut out)?;
    Ok(u32::from_le_bytes(out))
}

/// The firmware's fabric summary.
struct Summary {
    generation: u32,
    host_count: u8,
    partition: u8,
    link_up_map: u64,
}

fn summary(mep: &Mep) -> Result<Summary> {
    let mut out = [0u8; 32];
    // Header: version 1, size 4.
    call(mep, EXT_FABRIC_SUMMARY, &[1, 0, 4, 0], &mut out)?;
    if le16(&out, 0)? != 1 || usize::from(le16(&out, 2)?) < out.len() {
        return Err(EIO);
    }
    Ok(Summary {
        generation: le32(&out, 4)?,
        host_count: byte(&out, 8)?,
        partition: byte(&out, 9)?,
        link_up_map: le64(&out, 16)?,
    })
}

/// Reads the topology dump: one [`Port`] per physical port.
fn read_ports(mep: &Mep, link_up_map: u64) -> Result<KVec<Port>> {
    let _session = mep.fabric.session();
    let mut out = [0u8; mrpc::PAYLOAD];
    // START, then STATUS for the size.
    call(mep, CMD_TOPO_INFO_DUMP, &[1, 0, 0, 0], &mut out[..4])?;
    let result = (|| -> Result<KVec<Port>> {
        call(mep, CMD_TOPO_INFO_DUMP, &[2, 0, 0, 0], &mut out[..4])?;
        let total = usize::from(le16(&out, 2)?) * 4;
        // 56 bytes of header and at most 64 ports of 32 bytes.
        if total > 56 + 64 * 32 {
            return Err(EIO);
        }
        let mut dump = KVec::with_capacity(total, GFP_KERNEL)?;
        while dump.len() < total {
            let offset = u16::try_from(dump.len()).map_err(|_| EIO)?.to_le_bytes();
            call(
                mep,
                CMD_TOPO_INFO_DUMP,
                &[3, 0, offset[0], offset[1]],
                &mut out,
            )?;
            let len = usize::from(le16(&out, 2)?) * 4;
            if len == 0 || len > out.len() - 4 || dump.len() + len > total {
                return Err(EIO);
            }
            dump.extend_from_slice(&out[4..4 + len], GFP_KERNEL)?;
        }
        let bitmap = le64(&dump, 48)?;
        let mut ports = KVec::new();
        for i in 0..bitmap.count_ones() as usize {
            let e = 56 + 32 * i;
            let phys = byte(&dump, e)?;
            ports.push(
                Port {
                    phys,
                    kind: byte(&dump, e + 1)?,
                    link_up: phys < 64 && link_up_map & (1 << phys) != 0,
                    width: byte(&dump, e + 25)?,
                    rate: byte(&dump, e + 27)?,
                },
                GFP_KERNEL,
            )?;
        }
        Ok(ports)
    })();
    // FINISH, whatever happened, so the firmware drops its snapshot.
    let _ = call(mep, CMD_TOPO_INFO_DUMP, &[4, 0, 0, 0], &mut out[..4]);
    result
}

/// Reads the whole function table; `None` if the fabric changed while paging.
fn read_functions(mep: &Mep) -> Result<Option<(u32, KVec<Function>)>> {
    let mut out = [0u8; mrpc::PAYLOAD];
    let mut functions = KVec::new();
    let mut generation = None;
    loop {
        let start = u16::try_from(functions.len())
            .map_err(|_| EIO)?
            .to_le_bytes();
        // Header version 1, size 8; start; max 0 (as many as fit).
        let input = [1, 0, 8, 0, start[0], start[1], 0, 0];
        call(mep, EXT_FUNCTION_LIST, &input, &mut out)?;
        let size = usize::from(le16(&out, 2)?);
        let total = usize::from(le16(&out, 8)?);
        let count = usize::from(le16(&out, 12)?);
        let entry = usize::from(le16(&out, 14)?);
        if le16(&out, 0)? != 1
            || size > out.len()
            || entry < 24
            || 16 + count * entry > size
            || functions.len() + count > total
        {
            return Err(EIO);
        }
        let page_gen = le32(&out, 4)?;
        if *generation.get_or_insert(page_gen) != page_gen {
            return Ok(None);
        }
        for i in 0..count {
            let e = &out[16 + i * entry..16 + (i + 1) * entry];
            functions.push(
                Function {
                    pdfid: le16(e, 0)?,
                    pf_pdfid: le16(e, 2)?,
                    vendor: le16(e, 4)?,
                    device: le16(e, 6)?,
                    class: le32(e, 8)? & 0xff_ffff,
                    phys_port: byte(e, 12)?,
                    vf_index: byte(e, 13)?,
                    total_vfs: byte(e, 14)?,
                    flags: byte(e, 15)?,
                    bound_host: byte(e, 17)?,
                    bound_log_port: byte(e, 18)?,
                },
                GFP_KERNEL,
            )?;
        }
        if functions.len() == total {
            return Ok(Some((generation.unwrap_or(0), functions)));
        }
        if count == 0 {
            // The table shrank under us.
            return Ok(None);
        }
    }
}

impl Fabric {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            view <- new_mutex!(View {
                generation: 0,
                host_count: 0,
                partition: 0,
                link_up_map: 0,
                ports: KVec::new(),
                functions: KVec::new(),
                valid: false,
            }),
            stale: Atomic::new(true),
            session <- new_mutex!(()),
        })
    }

    /// Excludes every other dump session while the guard lives.
    pub(crate) fn session(&self) -> MutexGuard<'_, ()> {
        self.session.lock()
    }

    /// Marks the view out of date; called from the event interrupt.
    pub(crate) fn invalidate(&self) {
        self.stale.store(true, Relaxed);
    }

    /// Runs `f` on an up-to-date view of the fabric.
    pub(crate) fn with_view<R>(&self, mep: &Mep, f: impl FnOnce(&View) -> R) -> Result<R> {
        let mut view = self.view.lock();
        let s = summary(mep)?;
        let stale = self.stale.xchg(false, Relaxed);
        if stale || !view.valid || view.generation != s.generation {
            view.valid = false;
            let mut tries = 0;
            let (generation, functions) = loop {
                if let Some(list) = read_functions(mep)? {
                    break list;
                }
                tries += 1;
                if tries >= LIST_RETRIES {
                    return Err(EAGAIN);
                }
            };
            view.ports = read_ports(mep, s.link_up_map)?;
            view.functions = functions;
            view.generation = generation;
            view.host_count = s.host_count;
            view.partition = s.partition;
            view.link_up_map = s.link_up_map;
            view.valid = true;
        }
        Ok(f(&view))
    }
}
