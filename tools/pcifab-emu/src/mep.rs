// SPDX-License-Identifier: GPL-2.0-only
//! The management endpoint: its BAR0 register model (the Gen4 GAS with the
//! MRPC firmware interface), BAR4 (MSI-X table and PBA), config space and
//! the interrupts and DMA mappings the client set up.

use crate::config::{Config, Firmware};
use crate::dma::DmaTable;
use crate::function::{FnDevice, Memory};
use crate::gas::*;
use crate::hostile::{self, Stream};
use crate::irq::{self, Irqs};
use crate::model::{self, Model, Notice, Request, Requester};
use crate::mrpc::{mrpc_name, Exec, MrpcOutcome};
use crate::nvme;
use crate::p2p;
use crate::pci::{self, ConfigSpace};
use crate::qmp::{Qmp, QmpError};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

// vfio_pci region indices.
pub const REGION_BAR0: u32 = 0;
pub const REGION_BAR4: u32 = 4;
pub const REGION_ROM: u32 = 6;
pub const REGION_CONFIG: u32 = 7;
pub const REGION_VGA: u32 = 8;

pub const REGION_BAR2: u32 = 2;

/// Size of a region; 0 for the ones the MEP does not have. `window` is the
/// size of the P2P window (BAR2).
pub fn region_size(index: u32, window: u64) -> u64 {
    match index {
        REGION_BAR0 => pci::BAR0_SIZE,
        REGION_BAR2 => window,
        REGION_BAR4 => pci::BAR4_SIZE,
        REGION_CONFIG => pci::CONFIG_SIZE as u64,
        // BAR1/3/5 are upper halves; no ROM, no VGA.
        REGION_ROM | REGION_VGA => 0,
        _ => 0,
    }
}

pub fn status_name(status: u32) -> &'static str {
    match status {
        MRPC_STATUS_INPROGRESS => "INPROGRESS",
        MRPC_STATUS_DONE => "DONE",
        MRPC_STATUS_ERROR => "ERROR",
        MRPC_STATUS_INTERRUPTED => "INTERRUPTED",
        _ => "?",
    }
}

/// How the host may access a dword of the GAS.
#[derive(Debug, PartialEq)]
enum Kind {
    Input,
    Cmd,
    Ram,
    EventHdr,
    /// The pcifab P2P / DMA engine registers.
    P2p,
    /// MRPC dma_en: bit 0, writable while DMA MRPC is offered.
    DmaEn,
    ReadOnly,
}

/// What a host write to the GAS asks the firmware to do.
#[derive(Debug, Default, PartialEq)]
pub struct Written {
    /// The MRPC command register was written: run a command.
    pub mrpc: bool,
    /// The DMA engine has work to look at (TAIL written while enabled, or
    /// ENABLE set).
    pub dma_kick: bool,
    /// DMA_CTRL.RESET was written.
    pub dma_reset: bool,
}

/// Event header write: CLEAR (bit 0) clears occurred and count, the enable
/// bits are stored, the rest is read-only. `mask` says which bytes were written.
fn event_hdr_write(old: u32, new: u32, mask: u32) -> u32 {
    let w = EVENT_WRITABLE & mask;
    let mut v = (old & !w) | (new & w);
    if mask & EVENT_CLEAR != 0 && new & EVENT_CLEAR != 0 {
        v &= !(EVENT_OCCURRED | EVENT_COUNT_MASK);
    }
    v
}

/// What a MEP's firmware offers beyond the Gen4 GAS (the dialect and DMA MRPC).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GasFeatures {
    /// The pcifab extension register block (P2P / DMA engine at 0x3000).
    pub ext: bool,
    /// DMA MRPC (dma_ver non-zero).
    pub dma_mrpc: bool,
}

impl Default for GasFeatures {
    fn default() -> Self {
        GasFeatures {
            ext: true,
            dma_mrpc: true,
        }
    }
}

/// DMA MRPC: the version in dma_ver, the MSI-X vector in dma_vector, the
/// enable bit of dma_en (Linux's switchtec.h).
pub const DMA_MRPC_VER: u32 = 1;
pub const DMA_MRPC_VECTOR: u32 = 1;
pub const DMA_MRPC_EN: u32 = 1;
/// Size of Linux's `struct dma_mrpc_output`: status, cmd_id, rtn_code,
/// output_size, then the 1024 data bytes.
pub const DMA_MRPC_OUTPUT_SIZE: usize = 16 + MRPC_PAYLOAD_SIZE as usize;

/// The Global Address Space of one MEP.
pub struct Gas {
    mem: Vec<u8>,
    features: GasFeatures,
    partition: u32,
    partitions: u32,
    /// End of the part of the MRPC input buffer written since the last command.
    input_end: usize,
    /// The DMA engine is carrying a descriptor out (BUSY stays set).
    pub dma_in_flight: bool,
}

impl Gas {
    pub fn new(
        fw: &Firmware,
        partition: u32,
        partitions: u32,
        window_mib: u32,
        features: GasFeatures,
    ) -> Gas {
        let mut g = Gas {
            mem: vec![0; GAS_SIZE as usize],
            features,
            partition,
            partitions,
            input_end: 0,
            dma_in_flight: false,
        };
        // MRPC: idle; DMA MRPC offered (dma_ver, dma_vector) or not.
        if features.dma_mrpc {
            g.put32(MRPC_DMA_VER, DMA_MRPC_VER);
            g.put32(MRPC_DMA_VECTOR, DMA_MRPC_VECTOR);
        }
        // The extension block; a plain PAX has nothing there (reads 0).
        if features.ext {
            g.put32(P2P + P2P_CAPS, P2P_CAPS_BITS | window_mib.min(0xffff) << 16);
        }

        // sys_info.
        let si = SYS_INFO;
        g.put32(si + SI_DEVICE_ID, u32::from(fw.device_id));
        g.put32(si + SI_DEVICE_VERSION, fw.device_version);
        g.put32(si + SI_FIRMWARE_VERSION, fw.fw_version);
        g.put16(si + SI4_GAS_LAYOUT_VER, 1);
        g.put16(si + SI4_MGMT_CMD_SET_VER, 1);
        g.put16(si + SI4_FABRIC_CMD_SET_VER, 1);
        g.put32(si + SI4_PARTITION_ID, partition);
        g.put16(si + SI4_BL2_RUNNING, GEN4_BL2_0_RUNNING);
        g.put16(si + SI4_CFG_RUNNING, GEN4_CFG0_RUNNING);
        g.put16(si + SI4_IMG_RUNNING, GEN4_IMG0_RUNNING);
        g.put16(si + SI4_KEY_RUNNING, GEN4_KEY0_RUNNING);
        g.put16(si + SI4_P2P_VENDOR_ID, pci::VENDOR_MICROSEMI);
        g.put16(si + SI4_P2P_DEVICE_ID, fw.device_id);
        g.mem[(si + SI4_P2P_REVISION_ID) as usize] = fw.revision;
        g.put32(si + SI4_P2P_CLASS_ID, pci::CLASS_MEMORY_OTHER);
        g.put16(si + SI4_SUBSYSTEM_VENDOR_ID, pci::VENDOR_MICROSEMI);
        g.put16(si + SI4_SUBSYSTEM_ID, fw.device_id);
        g.put_str(si + SI4_VENDOR_ID, &fw.vendor_id, 8);
        g.put_str(si + SI4_PRODUCT_ID, &fw.product_id, 24);
        g.put_str(si + SI4_PRODUCT_REVISION, &fw.product_revision, 2);

        // Partition configuration, for every partition.
        for p in 0..partitions {
            let base = PART_CFG + u64::from(p) * PART_CFG_SIZE;
            let first_pff = p * PFFS_PER_PARTITION;
            g.put32(base + PC_PORT_CNT, PORTS_PER_PARTITION);
            g.put32(base + PC_USP_PFF_INST_ID, first_pff);
            g.put32(base + PC_VEP_PFF_INST_ID, first_pff + 1);
            for d in 0..PC_DSP_PFF_COUNT as u32 {
                let id = if d < DSPS_PER_PARTITION {
                    first_pff + 2 + d
                } else {
                    PFF_NONE
                };
                g.put32(base + PC_DSP_PFF_INST_ID + 4 * u64::from(d), id);
            }
            g.put16(base + PC_VEP_VECTOR_NUMBER, 0);
            g.put16(base + PC_USP_VECTOR_NUMBER, 0);
        }

        // NTB info.
        g.mem[(NTB + NTB_PARTITION_COUNT) as usize] = partitions as u8;
        g.mem[(NTB + NTB_PARTITION_ID) as usize] = partition as u8;

        // PFF CSRs: USP, VEP, DSPs of each partition, numbered contiguously.
        for i in 0..partitions * PFFS_PER_PARTITION {
            let base = PFF_CSR + u64::from(i) * PFF_CSR_SIZE;
            let class = if i % PFFS_PER_PARTITION == 1 {
                pci::CLASS_MEMORY_OTHER
            } else {
                0x06_0400 // PCI-to-PCI bridge
            };
            g.put16(base + PFF_VENDOR_ID, pci::VENDOR_MICROSEMI);
            g.put16(base + PFF_DEVICE_ID, fw.device_id);
            g.put32(base + PFF_CLASS, class << 8 | u32::from(fw.revision));
        }
        g
    }

    fn pff_count(&self) -> u64 {
        u64::from(self.partitions * PFFS_PER_PARTITION)
    }

    fn put16(&mut self, off: u64, v: u16) {
        let o = off as usize;
        self.mem[o..o + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, off: u64, v: u32) {
        let o = off as usize;
        self.mem[o..o + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn put_str(&mut self, off: u64, s: &str, width: usize) {
        let o = off as usize;
        let field = &mut self.mem[o..o + width];
        field.fill(b' ');
        field[..s.len()].copy_from_slice(s.as_bytes());
    }

    pub fn get32(&self, off: u64) -> u32 {
        let o = off as usize;
        u32::from_le_bytes([
            self.mem[o],
            self.mem[o + 1],
            self.mem[o + 2],
            self.mem[o + 3],
        ])
    }

    fn get16(&self, off: u64) -> u16 {
        let o = off as usize;
        u16::from_le_bytes([self.mem[o], self.mem[o + 1]])
    }

    fn check(off: u64, len: usize) -> Result<(), String> {
        match off.checked_add(len as u64) {
            Some(end) if end <= GAS_SIZE => Ok(()),
            _ => Err(format!(
                "BAR0 access of {len} bytes at {off:#x} is outside its {GAS_SIZE:#x} bytes"
            )),
        }
    }

    fn kind(&self, off: u64) -> Kind {
        let in_block = |base: u64, count: u64, size: u64| off >= base && off < base + count * size;
        let is_hdr = |rel: u64, first: u64, count: u64| {
            rel >= first
                && rel < first + count * EVENT_HDR_STRIDE
                && (rel - first) % EVENT_HDR_STRIDE == 0
        };
        if off < MRPC_OUTPUT_DATA {
            Kind::Input
        } else if off == MRPC_CMD {
            Kind::Cmd
        } else if off == MRPC_DMA_EN {
            Kind::DmaEn
        } else if [MRPC_DMA_ADDR, MRPC_DMA_ADDR + 4].contains(&off)
            || (TOP_CFG..SW_EVENT).contains(&off)
        {
            Kind::Ram
        } else if (SW_EVENT..SYS_INFO).contains(&off) {
            let rel = off - SW_EVENT;
            if is_hdr(rel, SW_EVENT_HDR_FIRST, SW_EVENT_HDR_COUNT) {
                Kind::EventHdr
            } else if rel < 8 {
                Kind::Ram // event_report_ctrl
            } else {
                Kind::ReadOnly
            }
        } else if (P2P..P2P + P2P_SIZE).contains(&off) && self.features.ext {
            Kind::P2p
        } else if in_block(PART_CFG, u64::from(self.partitions), PART_CFG_SIZE) {
            let rel = (off - PART_CFG) % PART_CFG_SIZE;
            if PC_EVENT_HDRS.contains(&rel) {
                Kind::EventHdr
            } else {
                Kind::ReadOnly
            }
        } else if in_block(PFF_CSR, self.pff_count(), PFF_CSR_SIZE) {
            let rel = (off - PFF_CSR) % PFF_CSR_SIZE;
            if is_hdr(rel, PFF_EVENT_HDR_FIRST, PFF_EVENT_HDR_COUNT) {
                Kind::EventHdr
            } else {
                Kind::ReadOnly
            }
        } else {
            Kind::ReadOnly
        }
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), String> {
        Self::check(off, buf.len())?;
        buf.copy_from_slice(&self.mem[off as usize..off as usize + buf.len()]);
        Ok(())
    }

    /// Apply a host write; says what the firmware must do about it.
    pub fn write(&mut self, off: u64, data: &[u8]) -> Result<Written, String> {
        Self::check(off, data.len())?;
        let end = off + data.len() as u64;
        let mut w = Written::default();
        let mut dw = off & !3;
        while dw < end {
            let mut bytes = self.get32(dw).to_le_bytes();
            let mut mask = 0u32;
            for (i, byte) in bytes.iter_mut().enumerate() {
                let a = dw + i as u64;
                if a >= off && a < end {
                    *byte = data[(a - off) as usize];
                    mask |= 0xff << (8 * i);
                }
            }
            let old = self.get32(dw);
            let new = u32::from_le_bytes(bytes);
            match self.kind(dw) {
                Kind::Input => {
                    self.put32(dw, new);
                    self.input_end = self.input_end.max(end.min(MRPC_OUTPUT_DATA) as usize);
                }
                Kind::Cmd => {
                    self.put32(dw, new);
                    w.mrpc = true;
                }
                Kind::P2p => self.p2p_write(dw - P2P, old, new, mask, &mut w),
                Kind::Ram => self.put32(dw, new),
                Kind::DmaEn => {
                    if self.features.dma_mrpc {
                        self.put32(dw, new & DMA_MRPC_EN);
                    } else {
                        debug!("dma_en write of {new:#x} ignored: no DMA MRPC");
                    }
                }
                Kind::EventHdr => {
                    self.put32(dw, event_hdr_write(old, new, mask));
                    if dw >= PFF_CSR {
                        self.update_pff_summary((dw - PFF_CSR) / PFF_CSR_SIZE);
                    } else {
                        self.update_summaries();
                    }
                }
                Kind::ReadOnly => {
                    debug!("BAR0 write of {new:#010x} (mask {mask:#010x}) to read-only {dw:#x} ignored")
                }
            }
            dw += 4;
        }
        Ok(w)
    }

    /// A host write to P2P register `reg` (Documentation/mrpc.rst, "The DMA
    /// engine"); `new` is the dword with the written bytes merged in.
    fn p2p_write(&mut self, reg: u64, old: u32, new: u32, mask: u32, w: &mut Written) {
        let at = P2P + reg;
        match reg {
            DMA_CTRL => {
                self.put32(at, new & DMA_CTRL_ENABLE);
                if mask & new & DMA_CTRL_RESET != 0 {
                    self.put32(P2P + DMA_HEAD, 0);
                    self.put32(P2P + DMA_TAIL, 0);
                    self.put32(P2P + DMA_STATUS, 0);
                    // BUSY until the descriptor in flight is finished.
                    self.update_dma_busy();
                    w.dma_reset = true;
                }
                if new & DMA_CTRL_ENABLE != 0 && old & DMA_CTRL_ENABLE == 0 {
                    w.dma_kick = true;
                }
            }
            DMA_RING_LO | DMA_RING_HI | DMA_RING_SIZE | DMA_IRQ => self.put32(at, new),
            DMA_TAIL => {
                self.put32(at, new);
                self.update_dma_busy();
                if self.p2p(DMA_CTRL) & DMA_CTRL_ENABLE != 0 {
                    w.dma_kick = true;
                }
            }
            P2P_EVENT_STATUS => self.put32(at, old & !(new & mask & EV_ALL)),
            _ => debug!("BAR0 write of {new:#010x} to read-only P2P register {at:#x} ignored"),
        }
    }

    /// A P2P register (offset relative to the block).
    pub fn p2p(&self, reg: u64) -> u32 {
        self.get32(P2P + reg)
    }

    /// Set a P2P register (firmware side; no write semantics).
    pub fn set_p2p(&mut self, reg: u64, v: u32) {
        self.put32(P2P + reg, v);
    }

    /// The DMA ring size when it is usable (a power of two, 2-4096).
    pub fn dma_ring_size(&self) -> Option<u32> {
        let n = self.p2p(DMA_RING_SIZE);
        (n.is_power_of_two() && (2..=4096).contains(&n)).then_some(n)
    }

    /// DMA_STATUS.BUSY = descriptors pending (HEAD != TAIL mod RING_SIZE)
    /// or one in flight.
    pub fn update_dma_busy(&mut self) {
        let pending = self.dma_in_flight
            || self
                .dma_ring_size()
                .is_some_and(|n| self.p2p(DMA_HEAD) % n != self.p2p(DMA_TAIL) % n);
        let st = self.p2p(DMA_STATUS) & !DMA_STATUS_BUSY;
        self.set_p2p(DMA_STATUS, st | if pending { DMA_STATUS_BUSY } else { 0 });
    }

    /// Set EVENT_STATUS bits. Returns the MSI-X vector to signal when one
    /// went from 0 to 1 and DMA_IRQ is enabled.
    pub fn raise_p2p(&mut self, bits: u32) -> Option<u16> {
        let old = self.p2p(P2P_EVENT_STATUS);
        self.set_p2p(P2P_EVENT_STATUS, old | bits);
        let irq = self.p2p(DMA_IRQ);
        (bits & !old != 0 && irq & DMA_IRQ_ENABLE != 0).then_some(irq as u16)
    }

    /// Recompute every summary register from the event headers' OCCURRED bits.
    fn update_summaries(&mut self) {
        let occurred = |g: &Gas, off: u64| g.get32(off) & EVENT_OCCURRED != 0;
        let mut part_bitmap = 0u64;
        for p in 0..u64::from(self.partitions) {
            let base = PART_CFG + p * PART_CFG_SIZE;
            let mut summary = 0;
            for (bit, hdr) in PC_EVENT_HDRS.iter().take(4).enumerate() {
                if occurred(self, base + hdr) {
                    summary |= 1 << bit;
                }
            }
            self.put32(base + PC_PART_EVENT_SUMMARY, summary);
            // port_event_bitmap: bit 0 the USP, 1-4 the DSPs.
            let mut ports = 0;
            let first = p * u64::from(PFFS_PER_PARTITION);
            for (bit, pff) in [0, 2, 3, 4, 5].iter().enumerate() {
                let pbase = PFF_CSR + (first + pff) * PFF_CSR_SIZE;
                if self.get32(pbase + PFF_EVENT_SUMMARY) != 0 {
                    ports |= 1 << bit;
                }
            }
            self.put32(base + PC_PORT_EVENT_BITMAP, ports);
            if summary != 0 || ports != 0 {
                part_bitmap |= 1 << p;
            }
        }
        let sw = SW_EVENT + SW_PART_EVENT_BITMAP;
        self.put32(sw, part_bitmap as u32);
        self.put32(sw + 4, (part_bitmap >> 32) as u32);
        let mut global = 0;
        for i in 0..SW_EVENT_HDR_COUNT {
            if occurred(self, SW_EVENT + SW_EVENT_HDR_FIRST + i * EVENT_HDR_STRIDE) {
                global |= 1 << i;
            }
        }
        self.put32(SW_EVENT + SW_GLOBAL_SUMMARY, global);
    }

    /// Recompute the pff_event_summary of PFF `i` (then the rest).
    fn update_pff_summary(&mut self, i: u64) {
        let base = PFF_CSR + i * PFF_CSR_SIZE;
        let mut summary = 0;
        for h in 0..PFF_EVENT_HDR_COUNT {
            if self.get32(base + PFF_EVENT_HDR_FIRST + h * EVENT_HDR_STRIDE) & EVENT_OCCURRED != 0 {
                summary |= 1 << h;
            }
        }
        self.put32(base + PFF_EVENT_SUMMARY, summary);
        self.update_summaries();
    }

    /// An event occurred: set OCCURRED, count it. True when its IRQ is enabled.
    fn bump(&mut self, hdr_off: u64) -> bool {
        let hdr = self.get32(hdr_off);
        let count = ((hdr & EVENT_COUNT_MASK) >> EVENT_COUNT_SHIFT)
            .saturating_add(1)
            .min(0xff);
        let hdr = (hdr & !EVENT_COUNT_MASK) | EVENT_OCCURRED | count << EVENT_COUNT_SHIFT;
        self.put32(hdr_off, hdr);
        hdr & EVENT_EN_IRQ != 0
    }

    /// A link state change on PFF `pff`. True when it should interrupt.
    pub fn raise_link(&mut self, pff: u32) -> bool {
        if u64::from(pff) >= self.pff_count() {
            return false;
        }
        let irq = self.bump(PFF_CSR + u64::from(pff) * PFF_CSR_SIZE + PFF_LINK_STATE_HDR);
        self.update_pff_summary(u64::from(pff));
        irq
    }

    /// A GFMS event, `pending` events queued. True when it should interrupt.
    pub fn raise_gfms(&mut self, pending: u32) -> bool {
        let irq = self.bump(SW_EVENT + SW_GFMS_EVENT_HDR);
        self.put32(SW_EVENT + SW_GFMS_EVENT_DATA, pending);
        self.update_summaries();
        irq
    }

    /// The MSI-X vector of this MEP's partition events.
    pub fn vep_vector(&self) -> u16 {
        self.get16(PART_CFG + u64::from(self.partition) * PART_CFG_SIZE + PC_VEP_VECTOR_NUMBER)
    }

    /// Firmware picks up a command: status INPROGRESS; returns the command
    /// and the input written for it.
    pub fn start_mrpc(&mut self) -> (u32, Vec<u8>) {
        let cmd = self.get32(MRPC_CMD);
        let input = self.mem[MRPC_INPUT_DATA as usize..self.input_end].to_vec();
        self.input_end = 0;
        self.put32(MRPC_STATUS, MRPC_STATUS_INPROGRESS);
        (cmd, input)
    }

    /// Where DMA MRPC output goes: Some(dma_addr) while offered and enabled.
    pub fn dma_mrpc_target(&self) -> Option<u64> {
        let en = self.features.dma_mrpc && self.get32(MRPC_DMA_EN) & DMA_MRPC_EN != 0;
        en.then(|| {
            u64::from(self.get32(MRPC_DMA_ADDR)) | u64::from(self.get32(MRPC_DMA_ADDR + 4)) << 32
        })
    }

    /// Offer DMA MRPC or withdraw it as a firmware reset without it would:
    /// dma_ver and dma_vector read 0 and dma_en is cleared.
    pub fn set_dma_mrpc(&mut self, on: bool) {
        self.features.dma_mrpc = on;
        self.put32(MRPC_DMA_EN, 0);
        self.put32(MRPC_DMA_VER, if on { DMA_MRPC_VER } else { 0 });
        self.put32(MRPC_DMA_VECTOR, if on { DMA_MRPC_VECTOR } else { 0 });
    }

    /// Firmware completes a command. Returns the MSI-X vector to signal when
    /// the partition's MRPC completion event has interrupts enabled.
    pub fn finish_mrpc(&mut self, outcome: &MrpcOutcome) -> Option<u16> {
        if outcome.status == MRPC_STATUS_DONE {
            let out = &mut self.mem
                [MRPC_OUTPUT_DATA as usize..(MRPC_OUTPUT_DATA + MRPC_PAYLOAD_SIZE) as usize];
            let n = outcome.output.len().min(out.len());
            out.fill(0);
            out[..n].copy_from_slice(&outcome.output[..n]);
        }
        self.put32(MRPC_RET_VALUE, outcome.ret);
        self.put32(MRPC_STATUS, outcome.status);

        let base = PART_CFG + u64::from(self.partition) * PART_CFG_SIZE;
        if self.get32(base + PC_MRPC_COMP_HDR) & EVENT_EN_IRQ == 0 {
            return None;
        }
        self.bump(base + PC_MRPC_COMP_HDR);
        self.update_summaries();
        Some(self.vep_vector())
    }
}

pub struct Inner {
    cfg: ConfigSpace,
    pub gas: Gas,
    bar4: Vec<u8>,
    irqs: Irqs,
    pub dma: DmaTable,
    /// Bumped by a device reset so a command started before it cannot
    /// complete into the fresh registers.
    epoch: u64,
    /// Bumped by a device reset and by DMA_CTRL.RESET, so the descriptor
    /// in flight does not complete into the fresh registers.
    pub dma_epoch: u64,
}

fn new_bar4() -> Vec<u8> {
    let mut bar4 = vec![0u8; pci::BAR4_SIZE as usize];
    // MSI-X table entries start masked (vector control bit 0).
    for v in 0..usize::from(pci::MSIX_VECTORS) {
        bar4[pci::MSIX_TABLE_OFFSET as usize + 16 * v + 12] = 1;
    }
    bar4
}

/// Faults injected into one MEP's firmware (control request `fault`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Commands never complete.
    pub hang: bool,
    /// Commands fail with this return value.
    pub error: Option<u32>,
    /// Interrupts are not raised (registers still update).
    pub drop_irq: bool,
    /// Commands complete after this many milliseconds.
    pub delay_ms: u64,
    /// Dump and list replies claim more than the output buffer.
    pub bad_length: bool,
    /// sys_info.device_id reads 0 and commands never complete.
    pub dead: bool,
    /// The next bind to this host adds no device to QEMU but reports DONE.
    pub no_enumerate: bool,
    /// The DMA engine sleeps this long before every chunk it copies.
    pub dma_delay_ms: u64,
    /// Hostile firmware with this seed: replies, event registers and DMA
    /// write-backs lie (see `hostile`).
    pub hostile: Option<u64>,
    /// Commands complete this many microseconds after the write of the
    /// command register (config `mrpc_completion_us`; kept by `fault clear`).
    pub completion_us: u64,
}

impl Faults {
    /// The active faults as JSON strings.
    pub fn names(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.hang {
            v.push("mrpc-hang".to_owned());
        }
        if let Some(r) = self.error {
            v.push(format!("mrpc-error {r:#x}"));
        }
        if self.drop_irq {
            v.push("drop-irq".to_owned());
        }
        if self.delay_ms > 0 {
            v.push(format!("delay {}", self.delay_ms));
        }
        if self.bad_length {
            v.push("bad-length".to_owned());
        }
        if self.dead {
            v.push("firmware-dead".to_owned());
        }
        if self.no_enumerate {
            v.push("no-enumerate".to_owned());
        }
        if self.dma_delay_ms > 0 {
            v.push(format!("dma-delay {}", self.dma_delay_ms));
        }
        if let Some(seed) = self.hostile {
            v.push(format!("hostile {seed}"));
        }
        if self.completion_us > 0 {
            v.push(format!("completion-delay {}", self.completion_us));
        }
        v
    }
}

/// A command handed to the MEP's worker thread.
#[derive(Clone)]
pub struct Job {
    seq: u64,
    epoch: u64,
    cmd: u32,
    input: Vec<u8>,
    /// When the host wrote the command register.
    written: Instant,
}

/// How long a write of the command register waits for a command without an
/// injected delay to complete before acknowledging the write anyway.
const SYNC_WAIT: Duration = Duration::from_secs(2);

/// One host's management endpoint.
pub struct Mep {
    pub name: String,
    pub partition: u32,
    partitions: u32,
    fw: Firmware,
    /// What the firmware offers after a reset (`fault dma-mrpc` changes it).
    features: Mutex<GasFeatures>,
    inner: Mutex<Inner>,
    pub connected: AtomicBool,
    pub mrpc_commands: AtomicU64,
    pub irqs_fired: AtomicU64,
    /// Host reads and writes of the extension register block while the firmware has none
    /// (the PAX dialect): a driver that speaks PAX never makes one.
    pub ext_block_accesses: AtomicU64,
    pub faults: Mutex<Faults>,
    /// The command an `mrpc-hang` or `firmware-dead` fault swallowed, still INPROGRESS.
    hung: Mutex<Option<Job>>,
    /// The hostile mode's streams and counts.
    hostile: Mutex<hostile::State>,
    jobs: Mutex<Option<Sender<Job>>>,
    next_seq: AtomicU64,
    done: Mutex<u64>,
    done_cv: Condvar,
    /// What the P2P window and the DMA engine reach.
    pub p2p: Arc<p2p::Shared>,
    /// The DMA engine has been kicked and not yet looked.
    dma_kick: Mutex<bool>,
    dma_cv: Condvar,
    /// Called with true when a vfio-user client (the host's QEMU) connects and with false
    /// when it goes away: the fabric follows with the host's upstream port link.
    link_hook: LinkHook,
}

/// What [`Mep::set_link_hook`] installs.
type LinkHook = Mutex<Option<Box<dyn Fn(bool) + Send + Sync>>>;

impl Mep {
    pub fn new(
        name: &str,
        fw: &Firmware,
        partition: u32,
        partitions: u32,
        p2p: Arc<p2p::Shared>,
        features: GasFeatures,
    ) -> Mep {
        Mep {
            features: Mutex::new(features),
            name: name.to_owned(),
            partition,
            partitions,
            fw: fw.clone(),
            inner: Mutex::new(Inner {
                cfg: ConfigSpace::new(fw, p2p.window),
                gas: Gas::new(fw, partition, partitions, p2p.window_mib(), features),
                bar4: new_bar4(),
                irqs: Irqs::new(),
                dma: DmaTable::default(),
                epoch: 0,
                dma_epoch: 0,
            }),
            connected: AtomicBool::new(false),
            mrpc_commands: AtomicU64::new(0),
            irqs_fired: AtomicU64::new(0),
            ext_block_accesses: AtomicU64::new(0),
            faults: Mutex::new(Faults::default()),
            hung: Mutex::new(None),
            hostile: Mutex::new(hostile::State::default()),
            jobs: Mutex::new(None),
            next_seq: AtomicU64::new(0),
            done: Mutex::new(0),
            done_cv: Condvar::new(),
            p2p,
            dma_kick: Mutex::new(false),
            dma_cv: Condvar::new(),
            link_hook: Mutex::new(None),
        }
    }

    /// Installs what runs when the host's QEMU connects (true) or disconnects (false).
    pub fn set_link_hook(&self, hook: Box<dyn Fn(bool) + Send + Sync>) {
        *self.link_hook.lock().unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    fn run_link_hook(&self, up: bool) {
        let hook = self.link_hook.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = hook.as_ref() {
            h(up);
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not take the device down with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn faults(&self) -> Faults {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_faults(&self, f: impl FnOnce(&mut Faults)) {
        let recovered = {
            let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
            let stuck = faults.hang || faults.dead;
            f(&mut faults);
            stuck && !faults.hang && !faults.dead
        };
        if recovered {
            self.release_hung();
        }
    }

    /// The worker swallowed `job` because of a hang or dead fault.
    fn note_hung(&self, job: &Job) {
        *self.hung.lock().unwrap_or_else(|e| e.into_inner()) = Some(job.clone());
    }

    /// The firmware recovered from a hang or crash: like a firmware reset, it reports the
    /// command it swallowed as INTERRUPTED (`MRPC_STATUS_INTERRUPTED`, which the C driver
    /// turns into ENXIO), so the mailbox is free again. A driver must not reuse the mailbox
    /// before that (Documentation/emulator.rst).
    fn release_hung(&self) {
        let job = self.hung.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            let outcome = MrpcOutcome {
                status: MRPC_STATUS_INTERRUPTED,
                ret: 0,
                output: Vec::new(),
            };
            let drop_irq = self.faults().drop_irq;
            self.complete(&job, &outcome, drop_irq);
            self.mark_done(job.seq);
        }
    }

    fn hostile_state(&self) -> MutexGuard<'_, hostile::State> {
        self.hostile.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hostile mode was set with `seed`: its streams and counts start over.
    pub fn arm_hostile(&self, seed: u64) {
        self.hostile_state().arm(seed);
    }

    /// The hostile mode's seed (None: never set) and counts.
    pub fn hostile_report(&self) -> hostile::State {
        self.hostile_state().clone()
    }

    /// The generator for the next event of `stream`, when the mode is on.
    pub fn hostile_rng(&self, stream: Stream) -> Option<hostile::Rng> {
        self.faults().hostile?;
        Some(self.hostile_state().rng(self.partition, stream))
    }

    /// Count something the hostile mode corrupted.
    pub fn hostile_count(&self, f: impl FnOnce(&mut hostile::Counts)) {
        f(&mut self.hostile_state().counts);
    }

    /// Counts an access to the extension register block the firmware does not have.
    fn note_ext_block(&self, region: u32, off: u64) {
        let in_block = region == REGION_BAR0 && (P2P..P2P + P2P_SIZE).contains(&off);
        if in_block && !self.features.lock().unwrap_or_else(|e| e.into_inner()).ext {
            self.ext_block_accesses.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn region_read(&self, region: u32, off: u64, buf: &mut [u8]) -> Result<(), String> {
        self.note_ext_block(region, off);
        let inner = self.lock();
        match region {
            REGION_BAR0 => {
                inner.gas.read(off, buf)?;
                if let Some(mut rng) = self.hostile_rng(Stream::Register) {
                    if hostile::corrupt_read(&mut rng, self.partitions, off, buf) {
                        self.hostile_count(|c| c.register_reads += 1);
                    }
                }
                if self.faults().dead {
                    // A crashed firmware: sys_info.device_id reads 0.
                    let id = SYS_INFO + SI_DEVICE_ID;
                    for (i, b) in buf.iter_mut().enumerate() {
                        if (id..id + 4).contains(&(off + i as u64)) {
                            *b = 0;
                        }
                    }
                }
                Ok(())
            }
            REGION_CONFIG => inner.cfg.read(to_usize(off)?, buf),
            REGION_BAR2 => {
                drop(inner);
                p2p::window_read(self, off, buf)
            }
            REGION_BAR4 => {
                let o = to_usize(off)?;
                let src = inner
                    .bar4
                    .get(o..o.saturating_add(buf.len()))
                    .ok_or_else(|| bar4_range(off, buf.len()))?;
                buf.copy_from_slice(src);
                Ok(())
            }
            _ => Err(format!("region {region} has no space")),
        }
    }

    pub fn region_write(&self, region: u32, off: u64, data: &[u8]) -> Result<(), String> {
        self.note_ext_block(region, off);
        if region == REGION_BAR2 {
            return p2p::window_write(self, off, data);
        }
        if region == REGION_BAR0 {
            let job = {
                let mut inner = self.lock();
                let w = inner.gas.write(off, data)?;
                if w.dma_reset {
                    inner.dma_epoch += 1;
                    info!("{}: DMA engine reset", self.name);
                }
                if w.dma_kick {
                    self.kick_dma();
                }
                if !w.mrpc {
                    return Ok(());
                }
                let (cmd, input) = inner.gas.start_mrpc();
                Job {
                    seq: self.next_seq.fetch_add(1, Ordering::Relaxed) + 1,
                    epoch: inner.epoch,
                    cmd,
                    input,
                    written: Instant::now(),
                }
            };
            self.mrpc_commands.fetch_add(1, Ordering::Relaxed);
            self.submit(job);
            return Ok(());
        }
        let mut inner = self.lock();
        match region {
            REGION_CONFIG => inner.cfg.write(to_usize(off)?, data),
            REGION_BAR4 => {
                let o = to_usize(off)?;
                let end = o
                    .checked_add(data.len())
                    .filter(|&e| e <= inner.bar4.len())
                    .ok_or_else(|| bar4_range(off, data.len()))?;
                let table_end =
                    pci::MSIX_TABLE_OFFSET as usize + 16 * usize::from(pci::MSIX_VECTORS);
                if end <= table_end {
                    inner.bar4[o..end].copy_from_slice(data);
                } else {
                    debug!(
                        "{}: BAR4 write at {off:#x} outside the MSI-X table ignored",
                        self.name
                    );
                }
                Ok(())
            }
            _ => Err(format!("region {region} has no space")),
        }
    }

    /// Hand a command to the worker. Without an injected delay or hang,
    /// wait until it completed, so the host's next access sees the result.
    fn submit(&self, job: Job) {
        let seq = job.seq;
        let sent = {
            let tx = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            tx.as_ref().is_some_and(|tx| tx.send(job).is_ok())
        };
        if !sent {
            error!("{}: no MRPC worker; command stays INPROGRESS", self.name);
            return;
        }
        let f = self.faults();
        if f.hang || f.dead || f.delay_ms > 0 || f.completion_us > 0 {
            return;
        }
        let deadline = Instant::now() + SYNC_WAIT;
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while *done < seq {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                note!(
                    "{}: MRPC command {seq} still running after {} s; write acknowledged",
                    self.name,
                    SYNC_WAIT.as_secs()
                );
                break;
            }
            done = match self.done_cv.wait_timeout(done, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    fn mark_done(&self, seq: u64) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        *done = (*done).max(seq);
        self.done_cv.notify_all();
    }

    /// The firmware finished a command: registers, completion event, IRQ.
    fn complete(&self, job: &Job, outcome: &MrpcOutcome, drop_irq: bool) {
        let mut inner = self.lock();
        if inner.epoch != job.epoch {
            note!(
                "{}: MRPC cmd {:#x} finished after a device reset; result discarded",
                self.name,
                job.cmd
            );
            return;
        }
        let vector = inner.gas.finish_mrpc(outcome);
        let dma_vector = inner.gas.dma_mrpc_target().and_then(|addr| {
            let mut out = vec![0u8; DMA_MRPC_OUTPUT_SIZE];
            let n = if outcome.status == MRPC_STATUS_DONE {
                outcome.output.len().min(MRPC_PAYLOAD_SIZE as usize)
            } else {
                0
            };
            out[4..8].copy_from_slice(&job.cmd.to_le_bytes());
            out[8..12].copy_from_slice(&outcome.ret.to_le_bytes());
            out[12..16].copy_from_slice(&(n as u32).to_le_bytes());
            out[16..16 + n].copy_from_slice(&outcome.output[..n]);
            // Everything but the status first: the host polls the status.
            let res = inner
                .dma
                .write(addr + 4, &out[4..])
                .and_then(|()| inner.dma.write(addr, &outcome.status.to_le_bytes()));
            match res {
                Ok(()) => Some(DMA_MRPC_VECTOR as u16),
                Err(e) => {
                    note!(
                        "{}: DMA MRPC output to {addr:#x} not written: {e}",
                        self.name
                    );
                    None
                }
            }
        });
        info_or_note!(
            outcome.status != MRPC_STATUS_DONE,
            "{}: MRPC cmd {:#x} ({}) input {} bytes -> status {} ret {:#x}",
            self.name,
            job.cmd,
            mrpc_name(job.cmd),
            job.input.len(),
            status_name(outcome.status),
            outcome.ret
        );
        if let Some(v) = dma_vector {
            self.raise(&inner, v, "DMA MRPC completion", drop_irq);
        }
        if let Some(v) = vector {
            self.raise(&inner, v, "MRPC completion", drop_irq);
        }
        if let Some(mut rng) = self.hostile_rng(Stream::Irq) {
            if rng.chance(1, 3) {
                let v = rng.below(u64::from(pci::MSIX_VECTORS)) as u16;
                self.hostile_count(|c| c.spurious_irqs += 1);
                self.raise(&inner, v, "nothing (hostile: spurious)", drop_irq);
            }
        }
    }

    /// Wake the DMA engine thread.
    pub fn kick_dma(&self) {
        *self.dma_kick.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.dma_cv.notify_all();
    }

    /// Wait until the DMA engine is kicked (and consume the kick).
    pub fn wait_dma_kick(&self) {
        let mut k = self.dma_kick.lock().unwrap_or_else(|e| e.into_inner());
        while !*k {
            k = self.dma_cv.wait(k).unwrap_or_else(|e| e.into_inner());
        }
        *k = false;
    }

    /// Set P2P event bits and interrupt if that is enabled.
    pub fn raise_p2p(&self, inner: &mut Inner, bits: u32, why: &str) {
        if let Some(v) = inner.gas.raise_p2p(bits) {
            let drop_irq = self.faults().drop_irq;
            self.raise(inner, v, why, drop_irq);
        }
    }

    /// Consume a `no-enumerate` fault.
    pub fn take_no_enumerate(&self) -> bool {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut f.no_enumerate)
    }

    /// Show fabric changes in this MEP's registers and interrupt.
    pub fn signal(&self, notices: &[Notice], pending: u32) {
        let drop_irq = self.faults().drop_irq;
        let mut inner = self.lock();
        for n in notices {
            let mut irq = false;
            for &pff in &n.pffs {
                irq |= inner.gas.raise_link(pff);
            }
            if n.gfms {
                irq |= inner.gas.raise_gfms(pending);
            }
            if irq {
                let v = inner.gas.vep_vector();
                self.raise(&inner, v, "fabric event", drop_irq);
            }
            if n.routes_lost.contains(&(self.partition as usize)) {
                info!(
                    "{}: P2P routes removed (target unbound or grant revoked)",
                    self.name
                );
                self.raise_p2p(&mut inner, EV_ROUTES_CHANGED, "P2P routes changed");
            }
        }
    }

    /// Interrupt the host: the MSI-X vector when MSI-X is set up, else INTx.
    fn raise(&self, inner: &Inner, vector: u16, why: &str, drop_irq: bool) {
        if drop_irq {
            note!(
                "{}: interrupt for {why} dropped (fault drop-irq)",
                self.name
            );
            return;
        }
        let (index, vec) = if inner.irqs.has_any(irq::MSIX) || !inner.irqs.has_any(irq::INTX) {
            (irq::MSIX, usize::from(vector))
        } else {
            (irq::INTX, 0)
        };
        match inner.irqs.fire(index, vec) {
            Ok(()) => {
                self.irqs_fired.fetch_add(1, Ordering::Relaxed);
                info!(
                    "{}: {} vector {vec} fired ({why})",
                    self.name,
                    irq::index_name(index)
                );
            }
            Err(e) => note!("{}: interrupt for {why} not delivered: {e}", self.name),
        }
    }

    /// Function reset: registers and config space back to power-on values.
    /// Interrupt and DMA setup belong to the client and stay.
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.cfg = ConfigSpace::new(&self.fw, self.p2p.window);
        let features = *self.features.lock().unwrap_or_else(|e| e.into_inner());
        inner.gas = Gas::new(
            &self.fw,
            self.partition,
            self.partitions,
            self.p2p.window_mib(),
            features,
        );
        inner.bar4 = new_bar4();
        inner.epoch += 1;
        inner.dma_epoch += 1;
        info!("{}: device reset", self.name);
    }

    /// `fault <host> dma-mrpc off|on`: the firmware withdraws DMA MRPC (or
    /// offers it again), now and after later resets.
    pub fn set_dma_mrpc(&self, on: bool) {
        self.features
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dma_mrpc = on;
        self.lock().gas.set_dma_mrpc(on);
        info!(
            "{}: DMA MRPC {}",
            self.name,
            if on { "offered" } else { "withdrawn" }
        );
    }

    /// The client went away: drop its eventfds and DMA mappings; the host's upstream port
    /// link goes down (the host is gone as far as the fabric can tell).
    pub fn disconnect(&self) {
        {
            let mut inner = self.lock();
            inner.irqs.clear();
            inner.dma.clear();
            self.connected.store(false, Ordering::Relaxed);
        }
        self.run_link_hook(false);
    }
}

impl crate::vfio_user::Device for Mep {
    fn name(&self) -> &str {
        &self.name
    }
    fn region_size(&self, index: u32) -> u64 {
        region_size(index, self.p2p.window)
    }
    fn region_read(&self, region: u32, off: u64, buf: &mut [u8]) -> Result<(), String> {
        Mep::region_read(self, region, off, buf)
    }
    fn region_write(&self, region: u32, off: u64, data: &[u8]) -> Result<(), String> {
        Mep::region_write(self, region, off, data)
    }
    fn reset(&self) {
        Mep::reset(self)
    }
    fn irqs(&self, f: &mut dyn FnMut(&mut Irqs)) {
        f(&mut self.lock().irqs)
    }
    fn dma(&self, f: &mut dyn FnMut(&mut DmaTable)) {
        f(&mut self.lock().dma)
    }
    fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::Relaxed);
        if on {
            self.run_link_hook(true);
        }
    }
    fn disconnect(&self) {
        Mep::disconnect(self)
    }
}

fn to_usize(off: u64) -> Result<usize, String> {
    usize::try_from(off).map_err(|_| format!("offset {off:#x} too large"))
}

fn bar4_range(off: u64, len: usize) -> String {
    format!(
        "BAR4 access of {len} bytes at {off:#x} is outside its {:#x} bytes",
        pci::BAR4_SIZE
    )
}

/// Create (or check) the image of every nvme endpoint; its absolute path
/// per endpoint, None for gpu endpoints. Two endpoints may not share one.
fn prepare_images(
    config: &Config,
    run_dir: &std::path::Path,
) -> Result<Vec<Option<PathBuf>>, String> {
    let mut images: Vec<Option<PathBuf>> = Vec::new();
    let mut real: Vec<(PathBuf, usize)> = Vec::new();
    for (i, ep) in config.endpoints.iter().enumerate() {
        if !ep.is_nvme() {
            images.push(None);
            continue;
        }
        let who = format!("endpoints[{i}] ('{}')", ep.name);
        let path = nvme::absolute(&ep.image_path(run_dir))?;
        if nvme::prepare_image(&path, ep.capacity_bytes(), &who)? {
            info!(
                "{}: image {} created ({} bytes, sparse)",
                ep.name,
                path.display(),
                ep.capacity_bytes()
            );
        }
        let canon = std::fs::canonicalize(&path)
            .map_err(|e| format!("{who}: cannot resolve image {}: {e}", path.display()))?;
        if let Some((_, j)) = real.iter().find(|(p, _)| *p == canon) {
            return Err(format!(
                "{who}: image {} is also the image of endpoints[{j}]; give every nvme endpoint its own image",
                path.display()
            ));
        }
        real.push((canon, i));
        images.push(Some(path));
    }
    Ok(images)
}

/// How long `blockdev-del` of an nvme node is retried while QEMU says the node is in use.
const BLOCKDEV_DEL_WAIT: Duration = Duration::from_secs(5);

/// The whole emulated switch: one MEP per host and the shared fabric model.
pub struct Fabric {
    pub config: Config,
    pub meps: Vec<Arc<Mep>>,
    model: Arc<Mutex<Model>>,
    /// Every endpoint function, in pdfid order.
    pub functions: Vec<Arc<FnDevice>>,
    /// QMP client of each host (None: no --qmp for it).
    pub qmp: Vec<Option<Arc<Qmp>>>,
    /// Where the function sockets are (fn-XXXX.sock).
    pub run_dir: PathBuf,
    /// What the MEPs' P2P windows and DMA engines reach.
    pub p2p: Arc<p2p::Shared>,
    /// The absolute image path of each endpoint (in config order); None for gpu.
    pub images: Vec<Option<PathBuf>>,
}

impl Fabric {
    #[cfg(test)]
    pub fn new(config: Config) -> Fabric {
        Self::with(config, PathBuf::from("."), &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The fabric, with QMP sockets `(host, path)` and the run directory.
    pub fn with(
        config: Config,
        run_dir: PathBuf,
        qmp: &[(String, PathBuf)],
    ) -> Result<Fabric, String> {
        let n = config.hosts.len() as u32;
        let images = prepare_images(&config, &run_dir)?;
        let model = Arc::new(Mutex::new(Model::new(&config)));
        let mut functions = Vec::new();
        for ep in &config.endpoints {
            let pf = u64::from(ep.pf_mem_mib()) << 20;
            let pf_dev = u64::from(ep.pf_dev_mem_mib()) << 20;
            let vf = u64::from(ep.vf_mem()) << 20;
            let total = pf_dev + vf * u64::from(ep.vfs);
            let mem = Arc::new(Memory::new(&format!("pcifab-{}", ep.name), total as usize)?);
            for f in 0..=ep.vfs {
                let ids = crate::pci::FunctionIds {
                    vid: ep.vid(),
                    did: if f == 0 { ep.did() } else { ep.vf_did() },
                    class: ep.class_code(),
                    total_vfs: if f == 0 { ep.vfs } else { 0 },
                    vf_did: ep.vf_did(),
                    mem_size: if f == 0 { pf } else { vf },
                };
                let (off, dev) = if f == 0 {
                    (0, pf_dev)
                } else {
                    (pf_dev + vf * u64::from(f - 1), vf)
                };
                functions.push(Arc::new(FnDevice::new(
                    model::pdfid(ep.port, f),
                    ids,
                    Arc::clone(&mem),
                    off,
                    dev,
                    Arc::clone(&model),
                )));
            }
        }
        functions.sort_by_key(|f| f.pdfid);
        let shared = Arc::new(p2p::Shared::new(
            Arc::clone(&model),
            functions.clone(),
            u64::from(config.p2p_window_mib) << 20,
        ));
        let meps = config
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                Arc::new(Mep::new(
                    &h.name,
                    &config.firmware,
                    i as u32,
                    n,
                    Arc::clone(&shared),
                    GasFeatures {
                        ext: config.dialect.extended(),
                        dma_mrpc: config.dma_mrpc,
                    },
                ))
            })
            .collect();
        for m in &meps {
            let m: &Arc<Mep> = m;
            m.set_faults(|f| f.completion_us = config.mrpc_completion_us);
        }
        let mut qmps = vec![None; config.hosts.len()];
        for (host, path) in qmp {
            let i = config
                .hosts
                .iter()
                .position(|h| h.name == *host)
                .ok_or_else(|| {
                    format!("--qmp names host '{host}', which is not in the configuration")
                })?;
            qmps[i] = Some(Qmp::new(host, path.clone()));
        }
        Ok(Fabric {
            config,
            meps,
            model,
            functions,
            qmp: qmps,
            run_dir,
            p2p: shared,
            images,
        })
    }

    /// The image and serial number of function `pdfid` when it is an nvme function.
    /// Takes no lock: the configuration says which endpoint owns `pdfid`.
    pub fn nvme(&self, pdfid: u16) -> Option<(PathBuf, String)> {
        let e = self.config.endpoints.iter().position(|ep| {
            (model::pdfid(ep.port, 0)..=model::pdfid(ep.port, ep.vfs)).contains(&pdfid)
        })?;
        let image = self.images.get(e)?.clone()?;
        Some((image, self.config.endpoints[e].nvme_serial()))
    }

    pub fn function_dev(&self, pdfid: u16) -> Option<&Arc<FnDevice>> {
        self.functions.iter().find(|f| f.pdfid == pdfid)
    }

    /// How long an unbind waits for QEMU's DEVICE_DELETED (config `unbind_timeout_ms`).
    fn unbind_timeout(&self) -> Duration {
        Duration::from_millis(self.config.unbind_timeout_ms)
    }

    pub fn fn_socket(&self, pdfid: u16) -> PathBuf {
        self.run_dir.join(format!("fn-{pdfid:04x}.sock"))
    }

    fn requester_name(&self, r: Requester) -> String {
        match r {
            Requester::Host(h) => self.meps.get(h).map_or("?".into(), |m| m.name.clone()),
            Requester::Control => "control".into(),
        }
    }

    /// Carry out a checked bind or unbind of one logical port's functions
    /// (QMP, scrub, model, events): all of them or none. Returns 0 or the
    /// return code. Blocks: never call it on a vfio-user socket thread.
    pub fn execute(&self, reqs: Vec<Request>) -> u32 {
        let Some(&first) = reqs.first() else {
            return 0;
        };
        let start = Instant::now();
        let host = self.meps[first.host].name.clone();
        let qmp = self.qmp.get(first.host).cloned().flatten();
        let mut phantom = false;
        let mut why = String::new();
        let ret = if first.bind {
            if self.meps[first.host].take_no_enumerate() {
                phantom = true;
                why = "fault no-enumerate: no device_add".into();
                0
            } else if let Some(q) = qmp {
                self.hot_add(&q, &reqs, &mut why)
            } else {
                why = format!("no --qmp socket for host {host}");
                model::PCIFAB_ERR_HOTPLUG_FAILED
            }
        } else {
            let (queued, pending, all_phantom) = {
                let mut m = self.model();
                let mut queued = false;
                for r in &reqs {
                    queued |= m.unbind_request(r);
                }
                let ph = reqs
                    .iter()
                    .all(|r| m.function(r.pdfid).is_some_and(|f| f.phantom));
                (queued, m.pending(), ph)
            };
            if queued {
                self.meps[first.host].signal(
                    &[Notice {
                        gfms: true,
                        ..Notice::default()
                    }],
                    pending.get(first.host).copied().unwrap_or(0),
                );
            }
            if all_phantom {
                why = "no device in QEMU (no-enumerate or not added)".into();
                0
            } else if let Some(q) = qmp {
                self.hot_remove(&q, &reqs, &mut why)
            } else {
                why = format!("no --qmp socket for host {host}");
                model::PCIFAB_ERR_HOTPLUG_FAILED
            }
        };
        let mut lost = Vec::new();
        if !first.bind && ret == 0 {
            // No route may reach a function once it is scrubbed: drop its
            // routes and wait for copies already past their route check.
            {
                let mut m = self.model();
                for r in &reqs {
                    lost.extend(m.drop_routes_to(r.pdfid));
                }
            }
            self.p2p.quiesce();
            for r in &reqs {
                if let Some(f) = self.function_dev(r.pdfid) {
                    if let Err(e) = f.scrub() {
                        error!("fn-{:04x}: scrub failed: {e}", r.pdfid);
                    }
                }
            }
        }
        let (notices, violations) = {
            let mut m = self.model();
            let mut notices = Vec::new();
            for r in &reqs {
                if let Some(n) = m.finish(r, ret == 0, phantom) {
                    notices.push(n);
                }
                if !r.bind && ret == 0 {
                    if let Some(f) = m.functions.iter_mut().find(|f| f.pdfid == r.pdfid) {
                        f.scrubs += 1;
                    }
                }
            }
            (notices, m.invariants())
        };
        let ids: Vec<String> = reqs.iter().map(|r| format!("{:#06x}", r.pdfid)).collect();
        info_or_note!(
            ret != 0,
            "{} {} {} {host} logical port {} requested by {}: {} ({:#x}) in {} ms{}",
            if first.bind { "bind" } else { "unbind" },
            ids.join(","),
            if first.bind { "to" } else { "from" },
            first.log_port,
            self.requester_name(first.requester),
            model::ret_name(ret),
            ret,
            start.elapsed().as_millis(),
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        );
        for v in &violations {
            error!("INVARIANT VIOLATED: {v}");
        }
        if !notices.is_empty() {
            let mut n = Notice::default();
            for x in notices {
                n.gfms |= x.gfms;
                n.pffs.extend(x.pffs);
                n.routes_lost.extend(x.routes_lost);
            }
            n.routes_lost.extend(lost);
            n.routes_lost.sort_unstable();
            n.routes_lost.dedup();
            self.notify(&[n]);
        }
        ret
    }

    /// device_add the functions of one logical port as one device: the
    /// non-zero functions first, function 0 (multifunction=on when there are
    /// others) last, as QEMU hot-adds a multi-function device. On a failure
    /// the ones already added are removed again.
    fn hot_add(&self, q: &Arc<Qmp>, reqs: &[Request], why: &mut String) -> u32 {
        let multi = reqs.len() > 1;
        let mut order: Vec<&Request> = reqs.iter().filter(|r| r.devfn != 0).collect();
        order.extend(reqs.iter().filter(|r| r.devfn == 0));
        let mut added: Vec<u16> = Vec::new();
        for r in order {
            let bus = format!("dsp{}", r.log_port);
            let addr = format!("0.{}", r.devfn);
            if let Err(e) = self.add_function(q, r.pdfid, &bus, Some(&addr), multi && r.devfn == 0)
            {
                *why = e;
                for &a in added.iter().rev() {
                    let id = format!("fn-{a:04x}");
                    match q.device_del_wait(&id, self.unbind_timeout()) {
                        Ok(()) => {
                            if self.nvme(a).is_some() {
                                self.blockdev_del(q, a);
                            }
                        }
                        Err(e) => {
                            error!("{id}: not removed after a failed multi-function bind: {e}")
                        }
                    }
                }
                return model::PCIFAB_ERR_HOTPLUG_FAILED;
            }
            added.push(r.pdfid);
        }
        0
    }

    /// Add function `pdfid` to `q`'s QEMU on `bus` (at `addr` when given):
    /// a vfio-user-pci device on its function socket, or for an nvme
    /// function `blockdev-add` of its image and QEMU's `nvme` device on it
    /// (the node is deleted again when the device_add fails).
    fn add_function(
        &self,
        q: &Arc<Qmp>,
        pdfid: u16,
        bus: &str,
        addr: Option<&str>,
        multifunction: bool,
    ) -> Result<(), String> {
        let id = format!("fn-{pdfid:04x}");
        let nvme = self.nvme(pdfid);
        let mut args = match &nvme {
            Some((image, serial)) => {
                q.execute("blockdev-add", nvme::blockdev_add_args(pdfid, image))
                    .map_err(|e| format!("blockdev-add {}: {e}", nvme::node_name(pdfid)))?;
                nvme::device_add_args(pdfid, bus, addr, serial)
            }
            None => {
                let mut a = serde_json::json!({
                    "driver": "vfio-user-pci",
                    "id": id,
                    "bus": bus,
                    "socket": {"type": "unix", "path": self.fn_socket(pdfid).to_string_lossy()},
                });
                if let Some(addr) = addr {
                    a["addr"] = serde_json::Value::String(addr.to_owned());
                }
                a
            }
        };
        if multifunction {
            args["multifunction"] = serde_json::Value::Bool(true);
        }
        q.forget_deleted(&id);
        if let Err(e) = q.execute("device_add", args) {
            if nvme.is_some() {
                self.blockdev_del(q, pdfid);
            }
            return Err(format!("device_add {id}: {e}"));
        }
        Ok(())
    }

    /// `blockdev-del` of nvme function `pdfid`'s image node in `q`'s QEMU,
    /// which closes the image there. A failure is an error (the image stays
    /// open and the node name taken) but changes nothing else.
    fn blockdev_del(&self, q: &Arc<Qmp>, pdfid: u16) {
        let node = nvme::node_name(pdfid);
        // QEMU may report DEVICE_DELETED before the device let go of its node (a slot the
        // guest powered off detaches the device at once; the drive is released when the
        // device is finalized, a moment later): "in use" is waited out, briefly.
        let deadline = Instant::now() + BLOCKDEV_DEL_WAIT;
        loop {
            match q.execute("blockdev-del", serde_json::json!({ "node-name": node })) {
                Ok(_) => {
                    debug!("{}: blockdev-del {node} done", q.host);
                    return;
                }
                Err(QmpError::Failed(e))
                    if e.contains("is in use") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    error!(
                        "{}: blockdev-del {node} failed: {e}; its image stays open in that QEMU",
                        q.host
                    );
                    return;
                }
            }
        }
    }

    /// device_del the device on one logical port (function 0: QEMU takes
    /// every function of the slot with it) and wait for every function's
    /// DEVICE_DELETED.
    fn hot_remove(&self, q: &Arc<Qmp>, reqs: &[Request], why: &mut String) -> u32 {
        let host = reqs[0].host;
        let deadline = Instant::now() + self.unbind_timeout();
        let main = reqs.iter().find(|r| r.devfn == 0).unwrap_or(&reqs[0]);
        let id = format!("fn-{:04x}", main.pdfid);
        let mut res = q.device_del_wait(&id, self.unbind_timeout());
        if res.is_ok() {
            for r in reqs.iter().filter(|r| r.pdfid != main.pdfid) {
                let other = format!("fn-{:04x}", r.pdfid);
                res = q.wait_deleted(&other, deadline);
                if res.is_err() {
                    break;
                }
            }
        }
        match res {
            Ok(()) => {
                // Every function's DEVICE_DELETED arrived: QEMU let go of the
                // nvme images' nodes; close them so another QEMU may open them.
                for r in reqs {
                    if self.nvme(r.pdfid).is_some() {
                        self.blockdev_del(q, r.pdfid);
                    }
                }
                0
            }
            Err(QmpError::Unreachable(e)) if !self.meps[host].connected.load(Ordering::Relaxed) => {
                // The host's QEMU is gone (its MEP client disconnected and its QMP
                // does not answer): nothing is left to remove the device from.
                *why = format!(
                    "{}'s QEMU is gone (MEP disconnected; {e}): treated as removed",
                    self.meps[host].name
                );
                0
            }
            Err(QmpError::Timeout) => {
                *why = "no DEVICE_DELETED in time".into();
                model::PCIFAB_ERR_UNBIND_TIMEOUT
            }
            Err(e) => {
                *why = format!("device_del: {e}");
                model::PCIFAB_ERR_HOTPLUG_FAILED
            }
        }
    }

    /// Bring the configuration's initial bindings into QEMU: for every host
    /// with a QMP socket, device_add its bound functions once its QEMU
    /// answers (retrying for two minutes).
    pub fn attach_initial(self: &Arc<Self>) {
        for (h, q) in self.qmp.iter().enumerate() {
            let Some(q) = q.clone() else { continue };
            let bound: Vec<(u16, u8)> = self
                .model()
                .functions
                .iter()
                .filter_map(|f| f.binding.filter(|b| b.0 == h).map(|b| (f.pdfid, b.1)))
                .collect();
            if bound.is_empty() {
                continue;
            }
            let me = Arc::clone(self);
            let _ = std::thread::Builder::new()
                .name(format!("attach-{}", q.host))
                .spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(120);
                    for (pdfid, l) in bound {
                        let id = format!("fn-{pdfid:04x}");
                        loop {
                            match me.add_function(&q, pdfid, &format!("dsp{l}"), None, false) {
                                Ok(()) => {
                                    info!("{}: initial binding {id} added on dsp{l}", q.host);
                                    let mut m = me.model();
                                    if let Some(f) =
                                        m.functions.iter_mut().find(|f| f.pdfid == pdfid)
                                    {
                                        f.phantom = false;
                                    }
                                    break;
                                }
                                Err(e) if Instant::now() < deadline => {
                                    debug!("{}: initial binding {id}: {e}; retrying", q.host);
                                    std::thread::sleep(Duration::from_millis(500));
                                }
                                Err(e) => {
                                    error!("{}: initial binding {id} not added: {e}", q.host);
                                    break;
                                }
                            }
                        }
                    }
                });
        }
    }

    pub fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host's QEMU connected to its MEP (`up`) or went away: the host's upstream port
    /// link follows, with the events of a `link` control request.
    pub fn host_link(&self, host: usize, up: bool) {
        let Some(port) = self.model().hosts.get(host).map(|h| h.port) else {
            return;
        };
        let name = &self.meps[host].name;
        match self.set_link(port, up) {
            Ok(true) => info!(
                "{name}: MEP client {}: upstream port {port} link {}",
                if up { "connected" } else { "gone" },
                if up { "up" } else { "down" }
            ),
            Ok(false) => {}
            Err(e) => error!("{name}: cannot set upstream port {port} link: {e}"),
        }
    }

    /// Start one MRPC worker thread per MEP.
    pub fn start(self: &Arc<Self>) -> Result<(), String> {
        for (i, m) in self.meps.iter().enumerate() {
            let weak = Arc::downgrade(self);
            m.set_link_hook(Box::new(move |up| {
                if let Some(f) = weak.upgrade() {
                    f.host_link(i, up);
                }
            }));
            let (tx, rx) = mpsc::channel();
            *m.jobs.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
            let fabric = Arc::clone(self);
            std::thread::Builder::new()
                .name(format!("mrpc-{}", m.name))
                .spawn(move || fabric.worker(i, rx))
                .map_err(|e| format!("cannot start thread: {e}"))?;
            let mep = Arc::clone(m);
            std::thread::Builder::new()
                .name(format!("dma-{}", m.name))
                .spawn(move || p2p::engine(&mep))
                .map_err(|e| format!("cannot start thread: {e}"))?;
        }
        Ok(())
    }

    /// The firmware of MEP `idx`: executes its commands one at a time.
    fn worker(&self, idx: usize, rx: Receiver<Job>) {
        let mep = &self.meps[idx];
        for job in rx {
            let f = mep.faults();
            if f.hang || f.dead {
                mep.note_hung(&job);
                note!(
                    "{}: MRPC cmd {:#x} ({}) never completes (fault {})",
                    mep.name,
                    job.cmd,
                    mrpc_name(job.cmd),
                    if f.dead { "firmware-dead" } else { "mrpc-hang" }
                );
                continue;
            }
            if f.delay_ms > 0 {
                std::thread::sleep(Duration::from_millis(f.delay_ms));
            }
            let (mut outcome, notices, deferred) = match f.error {
                Some(ret) => (MrpcOutcome::error(ret), Vec::new(), None),
                None => {
                    let mut model = self.model();
                    let mut x = Exec {
                        model: &mut model,
                        partition: idx,
                        bad_length: f.bad_length,
                        notices: Vec::new(),
                        deferred: None,
                    };
                    let outcome = x.run(job.cmd, &job.input);
                    (outcome, x.notices, x.deferred)
                }
            };
            if notices.iter().any(|n| !n.routes_lost.is_empty()) {
                // A REVOKE removed routes: complete only once no copy that
                // passed its check on one of them is still running.
                self.p2p.quiesce();
            }
            if let Some(req) = deferred {
                // Acknowledge the write of `cmd` now (status INPROGRESS);
                // the hot-plug may take seconds and needs QEMU's main loop.
                mep.mark_done(job.seq);
                let ret = self.execute(req);
                if ret != 0 {
                    outcome = MrpcOutcome::error(ret);
                }
            }
            if f.hostile.is_some() && hostile::targeted(job.cmd) {
                if let Some(mut rng) = mep.hostile_rng(Stream::Mrpc) {
                    if hostile::corrupt_reply(&mut rng, job.cmd, &job.input, &mut outcome) {
                        mep.hostile_count(|c| c.mrpc_replies += 1);
                    }
                }
            }
            if f.completion_us > 0 {
                let at = job.written + Duration::from_micros(f.completion_us);
                let left = at.saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    std::thread::sleep(left);
                }
            }
            mep.complete(&job, &outcome, f.drop_irq);
            self.notify(&notices);
            mep.mark_done(job.seq);
        }
    }

    /// Show fabric changes on every MEP.
    pub fn notify(&self, notices: &[Notice]) {
        if notices.is_empty() {
            return;
        }
        let pending = self.model().pending();
        for (i, m) in self.meps.iter().enumerate() {
            m.signal(notices, pending.get(i).copied().unwrap_or(0));
        }
    }

    /// Change a port's link state (control request `link`). Ok(false) when
    /// it already was in that state.
    pub fn set_link(&self, port: u8, up: bool) -> Result<bool, String> {
        let notice = self.model().set_link(port, up)?;
        match notice {
            Some(n) => {
                self.notify(&[n]);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// A fabric database change (control request `fabric-change`).
    pub fn fabric_change(&self) -> u32 {
        let (n, generation) = {
            let mut m = self.model();
            let n = m.fabric_change();
            (n, m.generation)
        };
        self.notify(&[n]);
        generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gas(partition: u32, partitions: u32) -> Gas {
        Gas::new(
            &Firmware::default(),
            partition,
            partitions,
            64,
            GasFeatures::default(),
        )
    }

    #[test]
    fn sys_info_and_partition() {
        let g = gas(1, 2);
        assert_eq!(g.get32(SYS_INFO + SI_DEVICE_ID), 0x4228);
        assert_eq!(g.get32(SYS_INFO + SI_FIRMWARE_VERSION), 0x0407_0041);
        assert_eq!(g.get32(SYS_INFO + SI4_PARTITION_ID), 1);
        let mut s = [0u8; 24];
        g.read(SYS_INFO + SI4_PRODUCT_ID, &mut s).expect("read");
        assert_eq!(&s, b"PAX 28XG4               ");
        assert_eq!(g.mem[NTB as usize], 2);
        assert_eq!(g.mem[NTB as usize + 1], 1);
    }

    #[test]
    fn pffs_counted_like_the_driver() {
        let g = gas(0, 2);
        let mut n = 0;
        while g.get16(PFF_CSR + n * PFF_CSR_SIZE) == 0x11f8 {
            n += 1;
        }
        assert_eq!(n, 12);
        let p1 = PART_CFG + PART_CFG_SIZE;
        assert_eq!(g.get32(p1 + PC_USP_PFF_INST_ID), 6);
        assert_eq!(g.get32(p1 + PC_VEP_PFF_INST_ID), 7);
        assert_eq!(g.get32(p1 + PC_DSP_PFF_INST_ID), 8);
        assert_eq!(g.get32(p1 + PC_DSP_PFF_INST_ID + 16), PFF_NONE);
    }

    #[test]
    fn event_header_semantics() {
        let mut g = gas(0, 1);
        let hdr = PART_CFG + PC_MRPC_COMP_HDR;
        g.write(hdr, &(EVENT_CLEAR | EVENT_EN_IRQ).to_le_bytes())
            .expect("write");
        assert_eq!(g.get32(hdr), EVENT_EN_IRQ);
        let outcome = MrpcOutcome::done(b"x".to_vec());
        assert_eq!(g.finish_mrpc(&outcome), Some(0));
        assert_eq!(g.get32(hdr), EVENT_EN_IRQ | EVENT_OCCURRED | 1 << 5);
        assert_eq!(
            g.get32(PART_CFG + PC_PART_EVENT_SUMMARY),
            PART_EVENT_MRPC_CMP
        );
        // A byte write to the upper half must not clear.
        g.write(hdr + 1, &[0]).expect("write");
        assert_eq!(g.get32(hdr) & EVENT_OCCURRED, EVENT_OCCURRED);
        // The driver's ISR writes back what it read: clears, keeps IRQ enable.
        let v = g.get32(hdr);
        g.write(hdr, &v.to_le_bytes()).expect("write");
        assert_eq!(g.get32(hdr), EVENT_EN_IRQ);
        assert_eq!(g.get32(PART_CFG + PC_PART_EVENT_SUMMARY), 0);
        // Without IRQ enable: nothing to signal.
        g.write(hdr, &0u32.to_le_bytes()).expect("write");
        assert_eq!(g.finish_mrpc(&outcome), None);
    }

    #[test]
    fn readonly_and_bounds() {
        let mut g = gas(0, 1);
        g.write(SYS_INFO, &[0; 8]).expect("write");
        assert_eq!(g.get32(SYS_INFO), 0x4228);
        g.write(MRPC_STATUS, &[9; 4]).expect("write");
        assert_eq!(g.get32(MRPC_STATUS), 0);
        assert!(g.write(GAS_SIZE - 2, &[0; 4]).is_err());
        assert!(g.read(GAS_SIZE, &mut [0; 1]).is_err());
        assert!(g.read(u64::MAX, &mut [0; 8]).is_err());
        g.write(MRPC_DMA_ADDR, &0x1234_5678_9abc_def0u64.to_le_bytes())
            .expect("write");
        let mut b = [0u8; 8];
        g.read(MRPC_DMA_ADDR, &mut b).expect("read");
        assert_eq!(u64::from_le_bytes(b), 0x1234_5678_9abc_def0);
    }

    #[test]
    fn link_and_gfms_events() {
        let mut g = gas(0, 2);
        let hdr = PFF_CSR + 8 * PFF_CSR_SIZE + PFF_LINK_STATE_HDR;
        g.write(hdr, &(EVENT_CLEAR | EVENT_EN_IRQ).to_le_bytes())
            .expect("write");
        assert!(g.raise_link(8));
        assert!(!g.raise_link(0), "IRQ not enabled on PFF 0");
        assert!(!g.raise_link(12), "no such PFF");
        assert_eq!(g.get32(hdr), EVENT_EN_IRQ | EVENT_OCCURRED | 1 << 5);
        assert_eq!(
            g.get32(PFF_CSR + 8 * PFF_CSR_SIZE + PFF_EVENT_SUMMARY),
            PFF_EVENT_LINK_STATE
        );
        let p1 = PART_CFG + PART_CFG_SIZE;
        assert_eq!(g.get32(p1 + PC_PORT_EVENT_BITMAP), 1 << 1, "DSP 0 of h1");
        assert_eq!(g.get32(PART_CFG + PC_PORT_EVENT_BITMAP), 1, "USP of h0");
        assert_eq!(g.get32(SW_EVENT + SW_PART_EVENT_BITMAP), 0b11);
        let v = g.get32(hdr);
        g.write(hdr, &v.to_le_bytes()).expect("ack");
        assert_eq!(g.get32(p1 + PC_PORT_EVENT_BITMAP), 0);
        assert!(!g.raise_gfms(3));
        assert_eq!(g.get32(SW_EVENT + SW_GFMS_EVENT_DATA), 3);
        assert_eq!(g.get32(SW_EVENT + SW_GLOBAL_SUMMARY), GLOBAL_EVENT_GFMS);
        g.write(SW_EVENT + SW_GFMS_EVENT_HDR, &9u32.to_le_bytes())
            .expect("clear, enable");
        assert_eq!(g.get32(SW_EVENT + SW_GLOBAL_SUMMARY), 0);
        assert!(g.raise_gfms(4));
    }

    /// A host's QEMU going away takes its upstream port link down (events on the other
    /// MEPs), and an unbind of a function it held completes without QEMU.
    #[test]
    fn host_gone_link_down_and_unbind_without_qemu() {
        use crate::vfio_user::Device;
        let cfg = Config::parse(
            "[[hosts]]\nname = \"a\"\n[[hosts]]\nname = \"b\"\nusp_port = 8\n\
             [[endpoints]]\nname = \"g\"\nport = 16\nvendor_id = 0x10de\n\
             device_id = 0x2330\nclass = 0x030200\n\
             [[bindings]]\nendpoint = \"g\"\nhost = \"b\"\nlogical_port = 0\n",
        )
        .expect("config");
        let dir = std::env::temp_dir().join(format!("pcifab-emu-gone-{}", std::process::id()));
        let qmp = [("b".to_string(), dir.join("no-such-qmp.sock"))];
        let f = Arc::new(Fabric::with(cfg, dir, &qmp).expect("fabric"));
        f.start().expect("start");
        let gen0 = f.model().generation;
        Device::set_connected(&*f.meps[1], true);
        assert!(f.model().link_up(8));
        assert_eq!(f.model().generation, gen0, "already up: no change");
        Device::disconnect(&*f.meps[1]);
        assert!(!f.model().link_up(8), "b's upstream link follows its QEMU");
        assert_ne!(f.model().generation, gen0);
        assert!(f.model().pending()[0] > 0, "a got the HOST_LINK_DOWN event");
        // The function b holds was really added to its QEMU; QEMU is gone now.
        let pdfid = 0x0300;
        let req = {
            let mut m = f.model();
            if let Some(x) = m.functions.iter_mut().find(|x| x.pdfid == pdfid) {
                x.phantom = false;
            }
            m.begin_unbind(Requester::Host(0), 1, 0, pdfid)
                .expect("unbind accepted")
        };
        assert_eq!(f.execute(req), 0, "unbind from a gone host completes");
        assert_eq!(f.model().function(pdfid).and_then(|x| x.binding), None);
        Device::set_connected(&*f.meps[1], true);
        assert!(f.model().link_up(8), "a new QEMU brings the link back");
    }
}
