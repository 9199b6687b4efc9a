// SPDX-License-Identifier: GPL-2.0-only
//! The registers of a MEP as its firmware keeps them: the Gen4 GAS of BAR0
//! (the MRPC firmware interface, event headers and summaries, the pcifab
//! P2P / DMA engine block) with the write semantics the host sees, and
//! `MepState`, everything one lock of the MEP guards.
//!
//! The layout (offsets) is in `gas`; the device that serves these registers
//! to its client is `mep::Mep`.

use crate::config::Firmware;
use crate::dma::DmaTable;
use crate::gas::*;
use crate::irq::Irqs;
use crate::mrpc::MrpcOutcome;
use crate::pci::{self, ConfigSpace};

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
    /// The DMA MRPC address `dma-arm` left programmed, as a previous kernel would have.
    pub stale_dma: Option<u64>,
    /// Commands started while DMA MRPC was still on at [`Gas::stale_dma`]: their output
    /// went to memory the running kernel does not own.
    pub stale_dma_commands: u64,
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
            stale_dma: None,
            stale_dma_commands: 0,
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
        if self.stale_dma.is_some() && self.dma_mrpc_target() == self.stale_dma {
            self.stale_dma_commands += 1;
        }
        (cmd, input)
    }

    /// Where DMA MRPC output goes: Some(dma_addr) while offered and enabled.
    pub fn dma_mrpc_target(&self) -> Option<u64> {
        let en = self.features.dma_mrpc && self.get32(MRPC_DMA_EN) & DMA_MRPC_EN != 0;
        en.then(|| {
            u64::from(self.get32(MRPC_DMA_ADDR)) | u64::from(self.get32(MRPC_DMA_ADDR + 4)) << 32
        })
    }

    /// `dma-arm`: DMA MRPC on (where offered) and the DMA engine enabled (where the firmware
    /// has it), both pointed at `addr`, as a kernel that did not shut them down (kexec, a
    /// crash) leaves them. Says what was armed: (DMA MRPC, DMA engine).
    pub fn arm_stale(&mut self, addr: u64) -> (bool, bool) {
        let mrpc = self.features.dma_mrpc;
        if mrpc {
            self.put32(MRPC_DMA_ADDR, addr as u32);
            self.put32(MRPC_DMA_ADDR + 4, (addr >> 32) as u32);
            self.put32(MRPC_DMA_EN, DMA_MRPC_EN);
            self.stale_dma = Some(addr);
        }
        let engine = self.features.ext;
        if engine {
            self.set_p2p(DMA_RING_LO, addr as u32);
            self.set_p2p(DMA_RING_HI, (addr >> 32) as u32);
            self.set_p2p(DMA_RING_SIZE, 256);
            self.set_p2p(DMA_CTRL, DMA_CTRL_ENABLE);
        }
        (mrpc, engine)
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

/// What one lock of a MEP guards: its registers (config space, the GAS of
/// BAR0, BAR4) and what its client set up (interrupts, DMA mappings).
pub struct MepState {
    pub cfg: ConfigSpace,
    pub gas: Gas,
    /// BAR4: the MSI-X table and PBA.
    pub bar4: Vec<u8>,
    pub irqs: Irqs,
    pub dma: DmaTable,
    /// Bumped by a device reset so a command started before it cannot
    /// complete into the fresh registers.
    pub epoch: u64,
    /// Bumped by a device reset and by DMA_CTRL.RESET, so the descriptor
    /// in flight does not complete into the fresh registers.
    pub dma_epoch: u64,
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
}
