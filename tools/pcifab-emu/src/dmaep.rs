// SPDX-License-Identifier: GPL-2.0-only
//! The switch's DMA endpoint: a PCI function of its own (class 0x088000 "system other",
//! the switch's vendor and device id) that Linux's `drivers/dma/switchtec_dma.c` drives as a
//! dmaengine provider. BAR0 holds the general registers (versions, capabilities, channel
//! count, the channel-status vector), per channel a 4 KiB block of hardware registers from
//! 0x1000 (CQ head, SQ tail, control, status) and a 0x80-byte block of firmware registers
//! from 0x160000 (enable, SQ/CQ base and size, interrupt vector, counters, current phase);
//! BAR4 the MSI-X table. Copies run in basic mode: on a write that may let a channel move,
//! the channel reads submission entries from the SQ in guest memory, copies, writes
//! completion entries with the phase bit into the CQ and raises its vector. Entries with DFM
//! set run in fabric mode (copies into buffers other hosts registered, RHIs) through the
//! firmware all endpoints share (dmafab.rs), whose registers sit at 0x164000/0x165000.
//! Documentation/emulator.rst, "The DMA endpoint" and "Fabric mode of the DMA endpoint",
//! list what is guessed.

use crate::config::Firmware;
use crate::dma::{DmaTable, HostSpan, FLAG_READ, FLAG_WRITE};
use crate::dmafab::{self, Dest, FabFaults, Hub, Port};
use crate::hostile::{Rng, Stream};
use crate::irq::{self, Irqs};
use crate::mep::{REGION_BAR0, REGION_BAR4, REGION_CONFIG};
use crate::pci::{self, ConfigSpace};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// BAR0: the channels' firmware blocks sit at 0x160000 and the fabric blocks of PAX parts
/// at 0x164000/0x165000, so 2 MiB.
pub const BAR0_SIZE: u64 = 0x20_0000;
/// Channels the configuration may ask for (vectors: one per channel plus the status one).
pub const MAX_CHANNELS: u8 = 32;

// General registers.
pub const REG_FW_VER: u64 = 0x00;
pub const REG_DMA_PROT_VER: u64 = 0x04;
pub const REG_HW_DMAC_VER: u64 = 0x08;
pub const REG_CAP: u64 = 0x80;
pub const REG_CHAN_CNT: u64 = 0x84;
pub const REG_CPLT_TMO: u64 = 0x8c;
pub const REG_TAG_LIMIT: u64 = 0x90;
pub const REG_CHAN_STS_VEC: u64 = 0x94;
pub const REG_SE_BUF: u64 = 0x98; // se_buf_cnt (u16) | se_buf_base (u16) << 16
pub const REG_STATE: u64 = 0x100;
pub const REG_HALT_SUM_LO: u64 = 0x108;
pub const REG_HALT_SUM_HI: u64 = 0x10c;
pub const REG_PAUSE_SUM_LO: u64 = 0x118;
pub const REG_PAUSE_SUM_HI: u64 = 0x11c;

/// Per-channel hardware registers: 4 KiB each from here.
pub const CHAN_HW_BASE: u64 = 0x1000;
pub const CHAN_HW_STRIDE: u64 = 0x1000;
pub const HW_CQ_HEAD: u64 = 0x0;
pub const HW_SQ_TAIL: u64 = 0x4;
pub const HW_CTRL: u64 = 0x8;
pub const HW_STATUS: u64 = 0xc;

/// Per-channel firmware registers: 0x80 bytes each from here.
pub const CHAN_FW_BASE: u64 = 0x16_0000;
pub const CHAN_FW_STRIDE: u64 = 0x80;
pub const FW_VALID_EN_SE: u64 = 0x00;
pub const FW_CQ_BASE_LO: u64 = 0x04;
pub const FW_CQ_BASE_HI: u64 = 0x08;
pub const FW_CQ_SIZE: u64 = 0x0c;
pub const FW_SQ_BASE_LO: u64 = 0x10;
pub const FW_SQ_BASE_HI: u64 = 0x14;
pub const FW_SQ_SIZE: u64 = 0x18;
pub const FW_INT_VEC: u64 = 0x1c;
pub const FW_PERF_CFG: u64 = 0x20;
pub const FW_PERF_LAT_SEL: u64 = 0x28;
pub const FW_FETCHED_LO: u64 = 0x2c;
pub const FW_FETCHED_HI: u64 = 0x30;
pub const FW_BYTES_LO: u64 = 0x34;
pub const FW_BYTES_HI: u64 = 0x38;
pub const FW_SE_PENDING: u64 = 0x40; // se_pending | se_buf_empty << 16
pub const FW_CHAN_IDLE: u64 = 0x44;
pub const FW_SQ_CURRENT: u64 = 0x54; // sq_current | sq_phase << 16
pub const FW_CQ_CURRENT: u64 = 0x58; // cq_current | cq_phase << 16

// Control and status bits.
pub const CTRL_PAUSE: u8 = 1 << 0;
pub const CTRL_HALT: u8 = 1 << 1;
pub const CTRL_RESET: u8 = 1 << 2;
pub const CTRL_ERR_PAUSE: u8 = 1 << 3;
pub const STS_PAUSED: u32 = 1 << 9;
pub const STS_HALTED: u32 = 1 << 10;
/// Why a channel paused on an error (bits 13..=29 as switchtec_dma.c names them).
pub const STS_ERR_MASK: u32 = 0x3fff_e000;
pub const STS_ERR_BAD_CONNID: u32 = 1 << 26;
pub const STS_ERR_BAD_RHI: u32 = 1 << 27;
pub const STS_ERR_RSVD_OPCODE: u32 = 1 << 28;
pub const STS_ERR_SE_CPL: u32 = 1 << 29;

/// valid_en_se: bit 0 the channel exists, bit 1 enable, SE buffer base 10:2, SE buffer
/// count 20:12, threshold 31:23 (the host's).
pub const VALID: u32 = 1 << 0;
pub const ENABLE: u32 = 1 << 1;
const SE_THRESH_MASK: u32 = 0xff80_0000;
/// SE buffer entries each channel owns.
pub const SE_BUF_PER_CHAN: u32 = 64;

// Submission entry (32 bytes).
pub const SE_SIZE: u64 = 32;
pub const OPC_MEMCPY: u8 = 0;
pub const OPC_RDIMM: u8 = 1;
pub const OPC_WRIMM: u8 = 2;
pub const OPC_RHI: u8 = 6;
pub const OPC_NOP: u8 = 7;
pub const SE_DFM: u8 = 1 << 5;
pub const SE_LIOF: u8 = 1 << 6;
/// Largest byte count of one entry.
pub const SE_MAX_BYTES: u32 = 0x10_0000;

// Completion entry (32 bytes) and its status codes.
pub const CE_SIZE: u64 = 32;
pub const SC_LEN_ERR: u32 = 1 << 0;
pub const SC_UR: u32 = 1 << 1;
pub const SC_D_RD_CTO: u32 = 1 << 8;
pub const SC_D_BAD_CONNID: u32 = 1 << 14;
pub const SC_D_BAD_RHI_ADDR: u32 = 1 << 15;
pub const SC_D_INVD_CMD: u32 = 1 << 16;

/// Largest queue the firmware takes, in entries (what switchtec_dma.c gives).
pub const MAX_QUEUE: u32 = 0x8000;

/// Faults injected into a DMA endpoint (control request `dmaep`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DmaFaults {
    /// Every completion carries this status code.
    pub bad_status: Option<u32>,
    /// Completions are written with the phase of the previous pass.
    pub wrong_phase: bool,
    /// Completions are written but no interrupt is raised.
    pub drop_irq: bool,
    /// Only the first half of each copy is done, and the completion says so.
    pub short: bool,
    /// The channels fetch nothing: submissions never complete.
    pub stall: bool,
    /// Hostile firmware with this seed: a quarter of the completions lie in one field,
    /// and in fabric mode a quarter of the command outputs and of the events.
    pub hostile: Option<u64>,
    /// Fabric commands are taken but never complete.
    pub cmd_hang: bool,
    /// Fabric events are neither written nor raised.
    pub drop_events: bool,
}

impl DmaFaults {
    pub fn names(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(s) = self.bad_status {
            v.push(format!("bad-status {s:#x}"));
        }
        if self.wrong_phase {
            v.push("wrong-phase".into());
        }
        if self.drop_irq {
            v.push("drop-irq".into());
        }
        if self.short {
            v.push("short".into());
        }
        if self.stall {
            v.push("stall".into());
        }
        if let Some(s) = self.hostile {
            v.push(format!("hostile {s}"));
        }
        if self.cmd_hang {
            v.push("cmd-hang".into());
        }
        if self.drop_events {
            v.push("drop-events".into());
        }
        v
    }
}

/// One channel's registers and engine state.
#[derive(Debug, Clone, Default)]
struct Chan {
    cq_head: u16,
    sq_tail: u16,
    ctrl: u8,
    /// Error pause reasons (STS_ERR_MASK bits).
    err: u32,
    valid_en_se: u32,
    cq_base: u64,
    cq_size: u16,
    sq_base: u64,
    sq_size: u16,
    perf_cfg: u32,
    lat_sel: u32,
    /// The engine's next SQ entry and next CQ slot, and the phase it writes.
    sq_head: u32,
    cq_tail: u32,
    phase: bool,
    fetched: u64,
    bytes: u64,
    completions: u64,
    irqs: u64,
    /// A queue set-up the engine refused, said once until it changes.
    refused: Option<String>,
}

impl Chan {
    fn reset_engine(&mut self) {
        self.sq_head = 0;
        self.cq_tail = 0;
        self.phase = true;
        self.sq_tail = 0;
        self.cq_head = 0;
        self.err = 0;
    }

    fn paused(&self) -> bool {
        self.ctrl & CTRL_PAUSE != 0 || self.err != 0
    }

    fn halted(&self) -> bool {
        self.ctrl & CTRL_HALT != 0
    }

    fn status(&self) -> u32 {
        let mut s = self.err;
        if self.paused() {
            s |= STS_PAUSED;
        }
        if self.halted() {
            s |= STS_HALTED;
        }
        s
    }

    /// Queue sizes in entries, when the host set up both queues so that the engine can
    /// run them; else why not.
    fn queues(&self) -> Result<(u32, u32), String> {
        let (sq, cq) = (u32::from(self.sq_size), u32::from(self.cq_size));
        if self.sq_base == 0 || self.cq_base == 0 {
            return Err("SQ or CQ base is 0".into());
        }
        if !(1..=MAX_QUEUE).contains(&sq) || !(2..=MAX_QUEUE).contains(&cq) {
            return Err(format!(
                "SQ size {sq} or CQ size {cq} outside 1..={MAX_QUEUE} (CQ at least 2)"
            ));
        }
        if self.sq_base % SE_SIZE != 0 || self.cq_base % CE_SIZE != 0 {
            return Err(format!(
                "SQ base {:#x} or CQ base {:#x} not 32-byte aligned",
                self.sq_base, self.cq_base
            ));
        }
        Ok((sq, cq))
    }
}

/// What the host's configuration and DMA set-up hold.
struct State {
    cfg: ConfigSpace,
    bar4: Vec<u8>,
    chans: Vec<Chan>,
    faults: DmaFaults,
    /// Completions drawn so far in hostile mode (the generator's position).
    hostile_n: u64,
    /// Completions hostile mode falsified (a field written other than the truth), since
    /// the emulator started.
    lies: u64,
}

/// Counters of one channel, for the control socket and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChanStats {
    pub fetched: u64,
    pub bytes: u64,
    pub completions: u64,
    pub irqs: u64,
    pub enabled: bool,
    pub status: u32,
}

/// Fabric-mode counters of one host: commands run, events written to it, RHIs raised on
/// it, and the buffers it registered as (peer host, index, buffer).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FabricStats {
    pub hfid: u16,
    pub commands: u64,
    pub events: u64,
    pub rhis: u64,
    /// Command outputs and events hostile mode falsified.
    pub lies: u64,
    pub buffers: Vec<(usize, u8, dmafab::Buf)>,
}

/// One host's DMA endpoint.
pub struct DmaEp {
    pub name: String,
    pub host: u32,
    fw: Firmware,
    channels: u8,
    inner: Mutex<State>,
    /// The fabric-mode firmware all endpoints share, and this host's DMA table and
    /// interrupts in it.
    hub: Arc<Hub>,
    port: Arc<Port>,
    pub connected: AtomicBool,
    /// Interrupts delivered (completion and channel-status vectors).
    pub irqs_fired: AtomicU64,
}

fn new_bar4(vectors: usize) -> Vec<u8> {
    let mut bar4 = vec![0u8; pci::BAR4_SIZE as usize];
    for v in 0..vectors {
        bar4[pci::MSIX_TABLE_OFFSET as usize + 16 * v + 12] = 1;
    }
    bar4
}

fn new_chans(n: u8) -> Vec<Chan> {
    (0..u32::from(n))
        .map(|i| {
            let mut c = Chan {
                valid_en_se: VALID
                    | ((i * SE_BUF_PER_CHAN) & 0x1ff) << 2
                    | (SE_BUF_PER_CHAN & 0x1ff) << 12,
                ..Chan::default()
            };
            c.reset_engine();
            c
        })
        .collect()
}

/// Which dword of a 32-byte SE/CE field holds what.
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl DmaEp {
    /// An endpoint alone in its fabric (no peers).
    #[cfg(test)]
    pub fn new(name: &str, host: u32, fw: &Firmware, channels: u8) -> DmaEp {
        let channels = channels.clamp(1, MAX_CHANNELS);
        DmaEp::in_fabric(
            name,
            host,
            fw,
            channels,
            Hub::new(vec![0; host as usize + 1], channels),
        )
    }

    /// Host `host`'s endpoint in the fabric of `hub` (made for the same channel count).
    pub fn in_fabric(name: &str, host: u32, fw: &Firmware, channels: u8, hub: Arc<Hub>) -> DmaEp {
        let channels = channels.clamp(1, MAX_CHANNELS);
        let vectors = hub.vectors() as u16;
        let port = hub.port(host as usize);
        *port.irqs() = Irqs::with_msix(u32::from(vectors));
        DmaEp {
            hub,
            port,
            name: name.to_owned(),
            host,
            fw: fw.clone(),
            channels,
            inner: Mutex::new(State {
                cfg: ConfigSpace::dma_endpoint(fw.device_id, fw.revision, BAR0_SIZE, vectors),
                bar4: new_bar4(usize::from(vectors)),
                chans: new_chans(channels),
                faults: DmaFaults::default(),
                hostile_n: 0,
                lies: 0,
            }),
            connected: AtomicBool::new(false),
            irqs_fired: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn faults(&self) -> DmaFaults {
        self.lock().faults.clone()
    }

    /// Changes the injected faults; lifting a stall lets the channels run what waits.
    pub fn set_faults(&self, f: impl FnOnce(&mut DmaFaults)) {
        let mut st = self.lock();
        f(&mut st.faults);
        if st.faults.hostile.is_some() {
            st.hostile_n = 0;
        }
        let fab = FabFaults {
            cmd_hang: st.faults.cmd_hang,
            drop_events: st.faults.drop_events,
            hostile: st.faults.hostile,
        };
        self.hub.set_faults(self.host as usize, |f| *f = fab);
        for i in 0..st.chans.len() {
            self.run(&mut st, i);
        }
    }

    /// This host's fabric-mode counters and the buffers it registered.
    pub fn fabric_stats(&self) -> FabricStats {
        let h = self.host as usize;
        let (commands, events, rhis) = self.hub.counts(h);
        FabricStats {
            hfid: dmafab::hfid(h),
            commands,
            events,
            rhis,
            lies: self.hub.lies(h),
            buffers: self.hub.buffers(h),
        }
    }

    /// Completions hostile mode falsified.
    pub fn completion_lies(&self) -> u64 {
        self.lock().lies
    }

    pub fn stats(&self) -> Vec<ChanStats> {
        self.lock()
            .chans
            .iter()
            .map(|c| ChanStats {
                fetched: c.fetched,
                bytes: c.bytes,
                completions: c.completions,
                irqs: c.irqs,
                enabled: c.valid_en_se & ENABLE != 0,
                status: c.status(),
            })
            .collect()
    }

    /// The dword of BAR0 at `off` (4-byte aligned) as the host reads it.
    fn read32(&self, st: &State, off: u64) -> u32 {
        let n = u64::from(self.channels);
        if let Some(v) = self.hub.read32(self.host as usize, off) {
            return v;
        }
        match off {
            REG_FW_VER => self.fw.fw_version,
            // Guesses: protocol 1, hardware DMAC 1.0.
            REG_DMA_PROT_VER => 1,
            REG_HW_DMAC_VER => 0x0001_0000,
            REG_CAP => 0,
            REG_CHAN_CNT => u32::from(self.channels),
            REG_CPLT_TMO => 50_000,
            REG_TAG_LIMIT => 64,
            REG_CHAN_STS_VEC => 0,
            REG_SE_BUF => u32::from(self.channels) * SE_BUF_PER_CHAN,
            REG_STATE => 1,
            REG_HALT_SUM_LO | REG_HALT_SUM_HI | REG_PAUSE_SUM_LO | REG_PAUSE_SUM_HI => {
                let halt = matches!(off, REG_HALT_SUM_LO | REG_HALT_SUM_HI);
                let base = if matches!(off, REG_HALT_SUM_LO | REG_PAUSE_SUM_LO) {
                    0
                } else {
                    32
                };
                let mut v = 0u32;
                for (i, c) in st.chans.iter().enumerate().skip(base).take(32) {
                    if (halt && c.halted()) || (!halt && c.paused()) {
                        v |= 1 << (i - base);
                    }
                }
                v
            }
            o if (CHAN_HW_BASE..CHAN_HW_BASE + n * CHAN_HW_STRIDE).contains(&o) => {
                let c = &st.chans[((o - CHAN_HW_BASE) / CHAN_HW_STRIDE) as usize];
                match (o - CHAN_HW_BASE) % CHAN_HW_STRIDE {
                    HW_CQ_HEAD => u32::from(c.cq_head),
                    HW_SQ_TAIL => u32::from(c.sq_tail),
                    HW_CTRL => u32::from(c.ctrl),
                    HW_STATUS => c.status(),
                    _ => 0,
                }
            }
            o if (CHAN_FW_BASE..CHAN_FW_BASE + n * CHAN_FW_STRIDE).contains(&o) => {
                let i = (o - CHAN_FW_BASE) / CHAN_FW_STRIDE;
                let c = &st.chans[i as usize];
                match (o - CHAN_FW_BASE) % CHAN_FW_STRIDE {
                    FW_VALID_EN_SE => c.valid_en_se,
                    FW_CQ_BASE_LO => c.cq_base as u32,
                    FW_CQ_BASE_HI => (c.cq_base >> 32) as u32,
                    FW_CQ_SIZE => u32::from(c.cq_size),
                    FW_SQ_BASE_LO => c.sq_base as u32,
                    FW_SQ_BASE_HI => (c.sq_base >> 32) as u32,
                    FW_SQ_SIZE => u32::from(c.sq_size),
                    FW_INT_VEC => i as u32 + 1,
                    FW_PERF_CFG => c.perf_cfg,
                    FW_PERF_LAT_SEL => c.lat_sel,
                    FW_FETCHED_LO => c.fetched as u32,
                    FW_FETCHED_HI => (c.fetched >> 32) as u32,
                    FW_BYTES_LO => c.bytes as u32,
                    FW_BYTES_HI => (c.bytes >> 32) as u32,
                    FW_SE_PENDING => SE_BUF_PER_CHAN << 16,
                    FW_CHAN_IDLE => u32::from(c.sq_head == u32::from(c.sq_tail)),
                    FW_SQ_CURRENT => c.sq_head & 0xffff,
                    FW_CQ_CURRENT => (c.cq_tail & 0xffff) | u32::from(c.phase) << 16,
                    _ => 0,
                }
            }
            _ => 0,
        }
    }

    /// A write of the dword at `off` (aligned); `mask` says which bytes the host wrote,
    /// `v` holds them in place.
    fn write32(&self, st: &mut State, off: u64, v: u32, mask: u32) {
        let n = u64::from(self.channels);
        if self.hub.write32(self.host as usize, off, v, mask) {
            return;
        }
        let merge = |old: u32| (old & !mask) | (v & mask);
        if (CHAN_HW_BASE..CHAN_HW_BASE + n * CHAN_HW_STRIDE).contains(&off) {
            let i = ((off - CHAN_HW_BASE) / CHAN_HW_STRIDE) as usize;
            let c = &mut st.chans[i];
            match (off - CHAN_HW_BASE) % CHAN_HW_STRIDE {
                HW_CQ_HEAD => c.cq_head = merge(u32::from(c.cq_head)) as u16,
                HW_SQ_TAIL => c.sq_tail = merge(u32::from(c.sq_tail)) as u16,
                HW_CTRL => {
                    let ctrl = (merge(u32::from(c.ctrl)) & 0xf) as u8;
                    c.ctrl = ctrl;
                    if ctrl & CTRL_RESET != 0 {
                        c.reset_engine();
                        debug!("{}: channel {i} reset", self.name);
                    } else if ctrl & CTRL_PAUSE == 0 {
                        // A write with PAUSE clear resumes a channel paused on an error.
                        c.err = 0;
                    }
                }
                _ => return,
            }
            self.run(st, i);
            return;
        }
        if (CHAN_FW_BASE..CHAN_FW_BASE + n * CHAN_FW_STRIDE).contains(&off) {
            let i = ((off - CHAN_FW_BASE) / CHAN_FW_STRIDE) as usize;
            let c = &mut st.chans[i];
            let lo = |b: u64, w: u32| (b & !0xffff_ffff) | u64::from(w);
            let hi = |b: u64, w: u32| (b & 0xffff_ffff) | u64::from(w) << 32;
            match (off - CHAN_FW_BASE) % CHAN_FW_STRIDE {
                FW_VALID_EN_SE => {
                    let w = merge(c.valid_en_se);
                    let host = ENABLE | SE_THRESH_MASK;
                    c.valid_en_se = (c.valid_en_se & !host) | (w & host);
                }
                FW_CQ_BASE_LO => c.cq_base = lo(c.cq_base, merge(c.cq_base as u32)),
                FW_CQ_BASE_HI => c.cq_base = hi(c.cq_base, merge((c.cq_base >> 32) as u32)),
                FW_CQ_SIZE => c.cq_size = merge(u32::from(c.cq_size)) as u16,
                FW_SQ_BASE_LO => c.sq_base = lo(c.sq_base, merge(c.sq_base as u32)),
                FW_SQ_BASE_HI => c.sq_base = hi(c.sq_base, merge((c.sq_base >> 32) as u32)),
                FW_SQ_SIZE => c.sq_size = merge(u32::from(c.sq_size)) as u16,
                FW_PERF_CFG => c.perf_cfg = merge(c.perf_cfg),
                FW_PERF_LAT_SEL => c.lat_sel = merge(c.lat_sel),
                _ => return,
            }
            c.refused = None;
            self.run(st, i);
        }
    }

    fn bar0_read(&self, off: u64, buf: &mut [u8]) -> Result<(), String> {
        let end = check_range(off, buf.len(), BAR0_SIZE, "BAR0")?;
        let st = self.lock();
        let mut at = off & !3;
        while at < end {
            let dw = self.read32(&st, at).to_le_bytes();
            for (k, b) in dw.iter().enumerate() {
                let a = at + k as u64;
                if (off..end).contains(&a) {
                    buf[(a - off) as usize] = *b;
                }
            }
            at += 4;
        }
        Ok(())
    }

    fn bar0_write(&self, off: u64, data: &[u8]) -> Result<(), String> {
        let end = check_range(off, data.len(), BAR0_SIZE, "BAR0")?;
        let mut st = self.lock();
        let mut at = off & !3;
        while at < end {
            let (mut v, mut mask) = ([0u8; 4], [0u8; 4]);
            for k in 0..4 {
                let a = at + k as u64;
                if (off..end).contains(&a) {
                    v[k] = data[(a - off) as usize];
                    mask[k] = 0xff;
                }
            }
            self.write32(&mut st, at, u32::from_le_bytes(v), u32::from_le_bytes(mask));
            at += 4;
        }
        Ok(())
    }

    /// Let channel `i` work through its SQ as far as its state allows.
    fn run(&self, st: &mut State, i: usize) {
        if st.faults.stall {
            return;
        }
        loop {
            let c = &st.chans[i];
            if c.valid_en_se & ENABLE == 0 || c.halted() || c.paused() || c.ctrl & CTRL_RESET != 0 {
                return;
            }
            if c.sq_head == u32::from(c.sq_tail) {
                return;
            }
            let (sq, cq) = match c.queues() {
                Ok(q) => q,
                Err(why) => {
                    if c.refused.as_deref() != Some(why.as_str()) {
                        note!("{}: channel {i} does not run: {why}", self.name);
                        st.chans[i].refused = Some(why);
                    }
                    return;
                }
            };
            if u32::from(c.sq_tail) >= sq {
                let why = format!("SQ tail {} is outside its {sq} entries", c.sq_tail);
                if c.refused.as_deref() != Some(why.as_str()) {
                    note!("{}: channel {i} does not run: {why}", self.name);
                    st.chans[i].refused = Some(why);
                }
                return;
            }
            // The CQ is full when the next slot is the host's head.
            if (c.cq_tail + 1) % cq == u32::from(c.cq_head) {
                return;
            }
            let se_at = c.sq_base + u64::from(c.sq_head) * SE_SIZE;
            let mut se = [0u8; SE_SIZE as usize];
            let fetched = self.port.dma().read(se_at, &mut se);
            if let Err(e) = fetched {
                note!("{}: channel {i}: SE fetch at {se_at:#x}: {e}", self.name);
                self.error_pause(st, i, STS_ERR_SE_CPL);
                return;
            }
            let c = &mut st.chans[i];
            c.sq_head = (c.sq_head + 1) % sq;
            c.fetched += 1;
            let (status, done, err) = self.execute(st, i, &se);
            let ctrl = se[1];
            let stop = self.complete(st, i, &se, status, done, cq);
            if ctrl & SE_LIOF != 0 {
                self.raise(st, i);
            }
            if stop {
                return;
            }
            if err != 0 && st.chans[i].ctrl & CTRL_ERR_PAUSE != 0 {
                self.error_pause(st, i, err);
                return;
            }
        }
    }

    /// Do what one SE asks: (completion status, bytes done, pause reason if any).
    /// Without DFM the engine works in basic mode (the host's own memory); with DFM the
    /// SE's DFIDs say whose memory it reads and writes (fabric mode, dmafab.rs).
    fn execute(&self, st: &mut State, i: usize, se: &[u8]) -> (u32, u32, u32) {
        let (opc, ctrl) = (se[0], se[1]);
        let len = le32(se, 8);
        let src = u64::from(le32(se, 12)) | u64::from(le32(se, 16)) << 32;
        let dst = u64::from(le32(se, 20)) | u64::from(le32(se, 24)) << 32;
        let (dfid, sfid) = (le16(se, 28), le16(se, 30));
        match opc {
            OPC_NOP => return (0, 0, 0),
            OPC_MEMCPY | OPC_WRIMM => {}
            OPC_RDIMM | OPC_RHI => {
                note!(
                    "{}: channel {i}: opcode {opc:#x} is not emulated",
                    self.name
                );
                return (SC_D_INVD_CMD, 0, STS_ERR_RSVD_OPCODE);
            }
            _ => {
                note!("{}: channel {i}: reserved opcode {opc:#x}", self.name);
                return (SC_D_INVD_CMD, 0, STS_ERR_RSVD_OPCODE);
            }
        }
        let fabric = ctrl & SE_DFM != 0;
        let me = self.host as usize;
        if fabric && sfid != dmafab::mem_dfid(me, me) && sfid != dmafab::rhi_dfid(me, me) {
            note!(
                "{}: channel {i}: source DFID {sfid:#06x} is not this host's own ({:#06x} or {:#06x})",
                self.name,
                dmafab::mem_dfid(me, me),
                dmafab::rhi_dfid(me, me)
            );
            return (SC_D_BAD_CONNID, 0, STS_ERR_BAD_CONNID);
        }
        if opc == OPC_WRIMM {
            // Write immediate: the 4 or 8 bytes of the SE's source field.
            if len != 4 && len != 8 {
                note!("{}: channel {i}: write-immediate of {len} bytes", self.name);
                return (SC_LEN_ERR, 0, STS_ERR_SE_CPL);
            }
            let data = src.to_le_bytes();
            let n = len as usize;
            let written = self.destination((i, "write-immediate"), fabric, dfid, dst, n, |d| {
                write_spans(d, &data[..n])
            });
            match written {
                Ok(true) => st.chans[i].bytes += u64::from(len),
                // An RHI: the interrupt is raised, no memory written.
                Ok(false) => {}
                Err((sc, why)) => return (sc, 0, why),
            }
            return (0, len, 0);
        }
        if len > SE_MAX_BYTES {
            note!(
                "{}: channel {i}: SE of {len} bytes exceeds {SE_MAX_BYTES}",
                self.name
            );
            return (SC_LEN_ERR, 0, STS_ERR_SE_CPL);
        }
        let len = if st.faults.short { len / 2 } else { len };
        if len == 0 {
            return (0, 0, 0);
        }
        let n = len as usize;
        let srcs = match self.port.dma().resolve(src, n, FLAG_READ) {
            Ok(s) => s,
            Err(e) => {
                note!("{}: channel {i}: copy source: {e}", self.name);
                return (SC_D_RD_CTO, 0, STS_ERR_SE_CPL);
            }
        };
        let written = self.destination((i, "copy destination"), fabric, dfid, dst, n, |d| {
            copy_spans(&srcs, d, n)
        });
        match written {
            Ok(true) => st.chans[i].bytes += u64::from(len),
            // An RHI window takes 4-byte writes only: dest() refused anything else.
            Ok(false) => {}
            Err((sc, why)) => return (sc, 0, why),
        }
        (0, len, 0)
    }

    /// Channel `i` (`what`: the descriptor's kind, for the log) writes `n` bytes at `dst` with `write`: with `fabric`, into the peer buffer
    /// that `dfid` names (checked and written under the hub's lock, [`Hub::dest`]), or to the
    /// RHI window (`Ok(false)`: the interrupt is raised, `write` not called); else into this
    /// host's own memory. `Ok(true)` once written; `Err((status, error))` for the CE.
    fn destination(
        &self,
        (i, what): (usize, &str),
        fabric: bool,
        dfid: u16,
        dst: u64,
        n: usize,
        write: impl FnOnce(&[HostSpan]),
    ) -> Result<bool, (u32, u32)> {
        if fabric {
            return match self.hub.dest(self.host as usize, dfid, dst, n, write)? {
                Dest::Mem => Ok(true),
                Dest::Rhi => Ok(false),
            };
        }
        let d = self.port.dma().resolve(dst, n, FLAG_WRITE).map_err(|e| {
            note!("{}: channel {i}: {what}: {e}", self.name);
            (SC_UR, STS_ERR_SE_CPL)
        })?;
        write(&d);
        Ok(true)
    }

    /// Write the CE of `se` into channel `i`'s CQ. True when the channel must stop (the
    /// CQ could not be written).
    fn complete(
        &self,
        st: &mut State,
        i: usize,
        se: &[u8],
        status: u32,
        done: u32,
        cq: u32,
    ) -> bool {
        let mut status = status;
        let mut done = done;
        let mut cid = le16(se, 6);
        let c = &st.chans[i];
        let mut phase = c.phase;
        let sq_head = c.sq_head as u16;
        if let Some(s) = st.faults.bad_status {
            status = s;
        }
        if st.faults.wrong_phase {
            phase = !phase;
        }
        if let Some(seed) = st.faults.hostile {
            let mut rng = Rng::new(seed, 0x100 + self.host, Stream::Dma, st.hostile_n);
            st.hostile_n += 1;
            if rng.chance(1, 4) {
                let truth = (status, phase, cid, done);
                match rng.below(4) {
                    0 => status = (rng.next() as u32) & 0x1_ffff | 1,
                    1 => phase = !phase,
                    2 => cid = rng.next() as u16,
                    _ => done = rng.next() as u32,
                }
                if (status, phase, cid, done) != truth {
                    st.lies += 1;
                }
            }
        }
        let mut ce = [0u8; CE_SIZE as usize];
        ce[12..16].copy_from_slice(&done.to_le_bytes());
        ce[16..18].copy_from_slice(&sq_head.to_le_bytes());
        ce[24..28].copy_from_slice(&status.to_le_bytes());
        ce[28..30].copy_from_slice(&cid.to_le_bytes());
        ce[30..32].copy_from_slice(&u16::from(phase).to_le_bytes());
        let c = &st.chans[i];
        let at = c.cq_base + u64::from(c.cq_tail) * CE_SIZE;
        let written = self.port.dma().write(at, &ce);
        if let Err(e) = written {
            note!("{}: channel {i}: CE write at {at:#x}: {e}", self.name);
            self.error_pause(st, i, STS_ERR_SE_CPL);
            return true;
        }
        let c = &mut st.chans[i];
        c.cq_tail = (c.cq_tail + 1) % cq;
        if c.cq_tail == 0 {
            c.phase = !c.phase;
        }
        c.completions += 1;
        false
    }

    /// The channel stops on an error and says why on the channel-status vector.
    fn error_pause(&self, st: &mut State, i: usize, why: u32) {
        st.chans[i].err |= why & STS_ERR_MASK;
        note!(
            "{}: channel {i} paused on error (status {:#x})",
            self.name,
            st.chans[i].status()
        );
        self.fire(st, 0, "channel status");
    }

    fn raise(&self, st: &mut State, i: usize) {
        if st.faults.drop_irq {
            debug!("{}: channel {i} interrupt dropped (fault)", self.name);
            return;
        }
        if self.fire(st, i + 1, "completion") {
            st.chans[i].irqs += 1;
        }
    }

    fn fire(&self, st: &State, vector: usize, why: &str) -> bool {
        let _ = st;
        match self.port.irqs().fire(irq::MSIX, vector) {
            Ok(()) => {
                self.irqs_fired.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                note!("{}: {why} interrupt not delivered: {e}", self.name);
                false
            }
        }
    }

    /// Function reset: registers back to power-on values; the client's interrupt and DMA
    /// set-up stay.
    pub fn reset(&self) {
        let mut st = self.lock();
        let vectors = self.hub.vectors() as u16;
        self.hub.reset(self.host as usize);
        st.cfg = ConfigSpace::dma_endpoint(self.fw.device_id, self.fw.revision, BAR0_SIZE, vectors);
        st.bar4 = new_bar4(usize::from(vectors));
        st.chans = new_chans(self.channels);
        info!("{}: device reset", self.name);
    }
}

/// Write `data` over the destination spans.
pub(crate) fn write_spans(dsts: &[HostSpan], data: &[u8]) {
    let mut at = 0;
    for d in dsts {
        let k = d.len().min(data.len() - at);
        // SAFETY: resolve() returned spans inside live mappings of at least len() bytes;
        // k stays within the span and within `data`.
        unsafe { std::ptr::copy(data.as_ptr().add(at), d.ptr(), k) };
        at += k;
        if at == data.len() {
            break;
        }
    }
}

/// Copy `n` bytes from the source spans to the destination spans.
fn copy_spans(srcs: &[HostSpan], dsts: &[HostSpan], n: usize) {
    let (mut si, mut so, mut di, mut doff) = (0, 0, 0, 0);
    let mut left = n;
    while left > 0 && si < srcs.len() && di < dsts.len() {
        let k = (srcs[si].len() - so).min(dsts[di].len() - doff).min(left);
        // SAFETY: resolve() returned spans inside live mappings (kept alive by the
        // spans) of at least len() bytes; k stays within both. Guest buffers may overlap
        // (a hostile host), so copy as memmove does.
        unsafe { std::ptr::copy(srcs[si].ptr().add(so), dsts[di].ptr().add(doff), k) };
        left -= k;
        so += k;
        doff += k;
        if so == srcs[si].len() {
            si += 1;
            so = 0;
        }
        if doff == dsts[di].len() {
            di += 1;
            doff = 0;
        }
    }
}

fn check_range(off: u64, len: usize, size: u64, what: &str) -> Result<u64, String> {
    off.checked_add(len as u64)
        .filter(|&e| e <= size && len <= 8)
        .ok_or_else(|| format!("{what} access of {len} bytes at {off:#x} is outside its {size:#x} bytes or wider than 8"))
}

impl crate::vfio_user::Device for DmaEp {
    fn name(&self) -> &str {
        &self.name
    }
    fn region_size(&self, index: u32) -> u64 {
        match index {
            REGION_BAR0 => BAR0_SIZE,
            REGION_BAR4 => pci::BAR4_SIZE,
            REGION_CONFIG => pci::CONFIG_SIZE as u64,
            _ => 0,
        }
    }
    fn region_read(&self, region: u32, off: u64, buf: &mut [u8]) -> Result<(), String> {
        match region {
            REGION_BAR0 => self.bar0_read(off, buf),
            REGION_CONFIG => {
                let o = usize::try_from(off).map_err(|_| format!("offset {off:#x}"))?;
                self.lock().cfg.read(o, buf)
            }
            REGION_BAR4 => {
                let o = usize::try_from(off).map_err(|_| format!("offset {off:#x}"))?;
                let st = self.lock();
                let src = st
                    .bar4
                    .get(o..o.saturating_add(buf.len()))
                    .ok_or_else(|| format!("BAR4 read of {} bytes at {off:#x}", buf.len()))?;
                buf.copy_from_slice(src);
                Ok(())
            }
            _ => Err(format!("region {region} has no space")),
        }
    }
    fn region_write(&self, region: u32, off: u64, data: &[u8]) -> Result<(), String> {
        match region {
            REGION_BAR0 => self.bar0_write(off, data),
            REGION_CONFIG => {
                let o = usize::try_from(off).map_err(|_| format!("offset {off:#x}"))?;
                self.lock().cfg.write(o, data)
            }
            REGION_BAR4 => {
                let o = usize::try_from(off).map_err(|_| format!("offset {off:#x}"))?;
                let table_end = pci::MSIX_TABLE_OFFSET as usize + 16 * self.hub.vectors();
                let mut st = self.lock();
                match o.checked_add(data.len()) {
                    Some(end) if end <= table_end => st.bar4[o..end].copy_from_slice(data),
                    Some(end) if end <= st.bar4.len() => {
                        debug!(
                            "{}: BAR4 write at {off:#x} outside the table ignored",
                            self.name
                        )
                    }
                    _ => return Err(format!("BAR4 write of {} bytes at {off:#x}", data.len())),
                }
                Ok(())
            }
            _ => Err(format!("region {region} has no space")),
        }
    }
    fn reset(&self) {
        DmaEp::reset(self)
    }
    fn irqs(&self, f: &mut dyn FnMut(&mut Irqs)) {
        f(&mut self.port.irqs())
    }
    fn dma(&self, f: &mut dyn FnMut(&mut DmaTable)) {
        f(&mut self.port.dma())
    }
    fn irq_count(&self, index: usize) -> u32 {
        if index == irq::MSIX {
            self.hub.vectors() as u32
        } else {
            irq::COUNTS.get(index).copied().unwrap_or(0)
        }
    }
    fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::Relaxed);
    }
    fn disconnect(&self) {
        let _st = self.lock();
        // Before the DMA table goes: no peer may write through the host's registrations.
        self.hub.forget(self.host as usize);
        self.port.irqs().clear();
        self.port.dma().clear();
        self.connected.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
#[path = "dmaep_tests.rs"]
mod tests;
