// SPDX-License-Identifier: GPL-2.0-only
//! Tests of the DMA endpoint, driven the way switchtec_dma.c programs it.

use super::*;
use crate::dma::tests::memfd;
use crate::vfio_user::Device;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Guest memory the tests map: 4 MiB at this IOVA.
const IOVA: u64 = 0x1000_0000;
const MEM: u64 = 4 << 20;
const SQ: u64 = IOVA;
const CQ: u64 = IOVA + 0x10_0000;
const BUF: u64 = IOVA + 0x20_0000;

struct Rig {
    ep: DmaEp,
    /// One eventfd per MSI-X vector.
    efds: Vec<OwnedFd>,
}

fn eventfd() -> OwnedFd {
    // SAFETY: plain system call; the descriptor is owned from here on.
    unsafe {
        let fd = libc::eventfd(0, libc::EFD_NONBLOCK);
        assert!(fd >= 0);
        OwnedFd::from_raw_fd(fd)
    }
}

impl Rig {
    fn new(channels: u8) -> Rig {
        Rig::attach(DmaEp::new("dmaep-t", 0, &Firmware::default(), channels))
    }

    /// An eventfd per vector and 4 MiB of guest memory at IOVA for `ep`.
    fn attach(ep: DmaEp) -> Rig {
        let mut efds = Vec::new();
        let vectors = ep.irq_count(irq::MSIX) as usize;
        for v in 0..vectors {
            let fd = eventfd();
            let dup = fd.try_clone().expect("dup");
            ep.irqs(&mut |i| i.set(irq::MSIX, v, Some(dup.try_clone().expect("dup"))));
            efds.push(fd);
        }
        let mut res = Ok(());
        ep.dma(&mut |t| {
            res = t.map(
                IOVA,
                MEM,
                0,
                FLAG_READ | FLAG_WRITE,
                Some(memfd(MEM as i64)),
            )
        });
        res.expect("map");
        Rig { ep, efds }
    }

    /// Interrupts on `vector` since the last look.
    fn irqs(&self, vector: usize) -> u64 {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a local u64 from an eventfd we own.
        let n = unsafe {
            libc::read(
                self.efds[vector].as_raw_fd(),
                (&mut v as *mut u64).cast(),
                8,
            )
        };
        if n == 8 {
            v
        } else {
            0
        }
    }

    fn w(&self, off: u64, v: u32) {
        self.ep
            .region_write(REGION_BAR0, off, &v.to_le_bytes())
            .expect("write");
    }
    fn w16(&self, off: u64, v: u16) {
        self.ep
            .region_write(REGION_BAR0, off, &v.to_le_bytes())
            .expect("write");
    }
    fn w8(&self, off: u64, v: u8) {
        self.ep.region_write(REGION_BAR0, off, &[v]).expect("write");
    }
    fn r(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.ep.region_read(REGION_BAR0, off, &mut b).expect("read");
        u32::from_le_bytes(b)
    }
    fn hw(i: u64, reg: u64) -> u64 {
        CHAN_HW_BASE + i * CHAN_HW_STRIDE + reg
    }
    fn fw(i: u64, reg: u64) -> u64 {
        CHAN_FW_BASE + i * CHAN_FW_STRIDE + reg
    }
    fn mem_write(&self, iova: u64, data: &[u8]) {
        let mut r = Ok(());
        self.ep.dma(&mut |t| r = t.write(iova, data));
        r.expect("mem write");
    }
    fn mem_read(&self, iova: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        let mut r = Ok(());
        self.ep.dma(&mut |t| r = t.read(iova, &mut v));
        r.expect("mem read");
        v
    }

    /// What switchtec_dma.c does for channel `i` at probe and at alloc_chan_resources,
    /// with queues of `entries` entries at this channel's slice of SQ/CQ.
    fn open(&self, i: u64, entries: u16) {
        self.w8(Self::hw(i, HW_CTRL), CTRL_PAUSE);
        self.w(Self::hw(i, HW_CTRL), u32::from(CTRL_RESET | CTRL_ERR_PAUSE));
        self.w(Self::hw(i, HW_CTRL), u32::from(CTRL_ERR_PAUSE));
        let sq = SQ + i * 0x4_0000;
        let cq = CQ + i * 0x4_0000;
        self.w(Self::fw(i, FW_SQ_BASE_LO), sq as u32);
        self.w(Self::fw(i, FW_SQ_BASE_HI), (sq >> 32) as u32);
        self.w(Self::fw(i, FW_CQ_BASE_LO), cq as u32);
        self.w(Self::fw(i, FW_CQ_BASE_HI), (cq >> 32) as u32);
        self.w16(Self::fw(i, FW_SQ_SIZE), entries);
        self.w16(Self::fw(i, FW_CQ_SIZE), entries);
        let v = self.r(Self::fw(i, FW_VALID_EN_SE));
        self.w(Self::fw(i, FW_VALID_EN_SE), v | ENABLE);
        self.w(Self::hw(i, HW_CTRL), u32::from(CTRL_RESET | CTRL_ERR_PAUSE));
        self.w(Self::hw(i, HW_CTRL), u32::from(CTRL_ERR_PAUSE));
        let ctrl = self.r(Self::hw(i, HW_CTRL)) as u8 & !CTRL_HALT;
        self.w8(Self::hw(i, HW_CTRL), ctrl);
        assert_eq!(
            self.r(Self::hw(i, HW_STATUS)) & (STS_HALTED | STS_PAUSED),
            0
        );
    }

    /// Put an SE into slot `slot` of channel `i`'s SQ.
    #[allow(clippy::too_many_arguments)]
    fn se(&self, i: u64, slot: u64, opc: u8, ctrl: u8, cid: u16, len: u32, src: u64, dst: u64) {
        let mut se = [0u8; 32];
        se[0] = opc;
        se[1] = ctrl;
        se[6..8].copy_from_slice(&cid.to_le_bytes());
        se[8..12].copy_from_slice(&len.to_le_bytes());
        se[12..20].copy_from_slice(&src.to_le_bytes());
        se[20..28].copy_from_slice(&dst.to_le_bytes());
        se[28..30].copy_from_slice(&0xffffu16.to_le_bytes());
        se[30..32].copy_from_slice(&0xffffu16.to_le_bytes());
        self.mem_write(SQ + i * 0x4_0000 + slot * 32, &se);
    }

    /// The CE in slot `slot` of channel `i`: (byte count, sq_head, status, cid, phase).
    fn ce(&self, i: u64, slot: u64) -> (u32, u16, u32, u16, u16) {
        let c = self.mem_read(CQ + i * 0x4_0000 + slot * 32, 32);
        (
            le32(&c, 12),
            le16(&c, 16),
            le32(&c, 24),
            le16(&c, 28),
            le16(&c, 30),
        )
    }
}

#[test]
fn config_space_and_general_registers() {
    let rig = Rig::new(4);
    let mut cfg = [0u8; 64];
    rig.ep
        .region_read(REGION_CONFIG, 0, &mut cfg)
        .expect("config");
    assert_eq!(le16(&cfg, 0), 0x11f8);
    assert_eq!(le16(&cfg, 2), Firmware::default().device_id);
    assert_eq!(le32(&cfg, 8) >> 8, 0x08_8000, "class system other");
    let mut msix = [0u8; 2];
    rig.ep
        .region_read(REGION_CONFIG, pci::CAP_MSIX as u64 + 2, &mut msix)
        .expect("msix");
    // Status, 4 channels, fabric command and event, 6 RHI vectors for each of 8 peers.
    assert_eq!(u16::from_le_bytes(msix) & 0x7ff, 54, "55 vectors");
    assert_eq!(rig.ep.irq_count(irq::MSIX), 55);
    assert_eq!(rig.ep.region_size(REGION_BAR0), BAR0_SIZE);
    assert_eq!(rig.r(REG_CHAN_CNT), 4);
    assert_eq!(rig.r(REG_CHAN_STS_VEC) & 0xffff, 0);
    assert_eq!(rig.r(REG_SE_BUF) & 0xffff, 4 * SE_BUF_PER_CHAN);
    for i in 0..4u64 {
        assert_eq!(rig.r(Rig::fw(i, FW_INT_VEC)), i as u32 + 1);
        let v = rig.r(Rig::fw(i, FW_VALID_EN_SE));
        assert_eq!(v & VALID, VALID);
        assert_eq!((v >> 12) & 0x1ff, SE_BUF_PER_CHAN, "SE buffer count");
        assert_eq!(
            (v >> 2) & 0x1ff,
            i as u32 * SE_BUF_PER_CHAN,
            "SE buffer base"
        );
    }
    // The valid bit and SE buffer fields are the firmware's; threshold and enable the host's.
    rig.w(Rig::fw(0, FW_VALID_EN_SE), 0xffff_ffff);
    assert_eq!(
        rig.r(Rig::fw(0, FW_VALID_EN_SE)),
        VALID | ENABLE | SE_THRESH_MASK | (SE_BUF_PER_CHAN << 12)
    );
    // Past the last channel reads 0 and ignores writes; outside BAR0 is refused.
    rig.w(Rig::hw(4, HW_SQ_TAIL), 5);
    assert_eq!(rig.r(Rig::hw(4, HW_SQ_TAIL)), 0);
    let mut b = [0u8; 4];
    assert!(rig
        .ep
        .region_read(REGION_BAR0, BAR0_SIZE - 2, &mut b)
        .is_err());
    assert!(rig.ep.region_write(REGION_BAR0, u64::MAX - 1, &b).is_err());
    assert!(rig.ep.region_read(REGION_BAR0, 0, &mut [0u8; 16]).is_err());
}

#[test]
fn memcpy_writes_the_completion_with_phase_and_raises_the_channel_vector() {
    let rig = Rig::new(2);
    rig.open(1, 16);
    let data: Vec<u8> = (0..5000u32).map(|v| (v * 7) as u8).collect();
    rig.mem_write(BUF, &data);
    rig.se(1, 0, OPC_MEMCPY, SE_LIOF, 0, 5000, BUF, BUF + 0x1_0000);
    rig.se(1, 1, OPC_MEMCPY, 0, 1, 100, BUF, BUF + 0x2_0000);
    rig.w16(Rig::hw(1, HW_SQ_TAIL), 2);
    assert_eq!(rig.mem_read(BUF + 0x1_0000, 5000), data);
    assert_eq!(rig.mem_read(BUF + 0x2_0000, 100), data[..100]);
    assert_eq!(rig.ce(1, 0), (5000, 1, 0, 0, 1));
    assert_eq!(rig.ce(1, 1), (100, 2, 0, 1, 1));
    // One interrupt: only the first SE asked for one (LIOF); none on channel 0's vector.
    assert_eq!(rig.irqs(2), 1);
    assert_eq!(rig.irqs(1), 0);
    let s = rig.ep.stats();
    assert_eq!((s[1].fetched, s[1].bytes, s[1].completions), (2, 5100, 2));
    assert_eq!(rig.r(Rig::fw(1, FW_FETCHED_LO)), 2);
    assert_eq!(rig.r(Rig::fw(1, FW_BYTES_LO)), 5100);
    // A NOP completes without copying.
    rig.se(1, 2, OPC_NOP, SE_LIOF, 2, 64, BUF, BUF + 0x3_0000);
    rig.w16(Rig::hw(1, HW_SQ_TAIL), 3);
    assert_eq!(rig.ce(1, 2), (0, 3, 0, 2, 1));
    assert_eq!(rig.mem_read(BUF + 0x3_0000, 4), [0; 4]);
}

#[test]
fn phase_flips_when_the_cq_wraps_and_a_full_cq_holds_the_engine() {
    let rig = Rig::new(1);
    rig.open(0, 4);
    rig.mem_write(BUF, &[0xab; 64]);
    // Four SEs into a 4-entry SQ (the host keeps one free, so three first).
    for k in 0..3u64 {
        rig.se(
            0,
            k,
            OPC_MEMCPY,
            SE_LIOF,
            k as u16,
            8,
            BUF,
            BUF + 0x100 * (k + 1),
        );
    }
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 3);
    assert_eq!(rig.ep.stats()[0].completions, 3);
    rig.se(0, 3, OPC_MEMCPY, SE_LIOF, 3, 8, BUF, BUF + 0x400);
    rig.se(0, 0, OPC_MEMCPY, SE_LIOF, 4, 8, BUF, BUF + 0x500);
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 1);
    // The CQ is full (the host has consumed nothing): the fourth waits.
    assert_eq!(rig.ep.stats()[0].completions, 3);
    rig.w16(Rig::hw(0, HW_CQ_HEAD), 3);
    assert_eq!(rig.ep.stats()[0].completions, 5);
    assert_eq!(rig.ce(0, 3), (8, 0, 0, 3, 1));
    assert_eq!(rig.ce(0, 0), (8, 1, 0, 4, 0), "second pass: phase 0");
    assert_eq!(rig.irqs(1), 5);
    // Reset: the engine starts again at slot 0 with phase 1.
    rig.w(Rig::hw(0, HW_CTRL), u32::from(CTRL_RESET | CTRL_ERR_PAUSE));
    rig.w(Rig::hw(0, HW_CTRL), u32::from(CTRL_ERR_PAUSE));
    assert_eq!(rig.r(Rig::hw(0, HW_SQ_TAIL)), 0);
    assert_eq!(rig.r(Rig::fw(0, FW_CQ_CURRENT)), 1 << 16);
    rig.se(0, 0, OPC_MEMCPY, 0, 9, 8, BUF, BUF + 0x600);
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 1);
    assert_eq!(rig.ce(0, 0), (8, 1, 0, 9, 1));
}

#[test]
fn halt_pause_and_disable_stop_the_channel_until_lifted() {
    let rig = Rig::new(1);
    rig.open(0, 16);
    rig.mem_write(BUF, &[1; 8]);
    rig.se(0, 0, OPC_MEMCPY, SE_LIOF, 0, 8, BUF, BUF + 0x100);
    rig.w8(Rig::hw(0, HW_CTRL), CTRL_PAUSE);
    assert_ne!(rig.r(Rig::hw(0, HW_STATUS)) & STS_PAUSED, 0);
    assert_eq!(rig.r(REG_PAUSE_SUM_LO), 1);
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 1);
    assert_eq!(rig.ep.stats()[0].completions, 0, "paused");
    rig.w8(Rig::hw(0, HW_CTRL), CTRL_HALT);
    assert_eq!(
        rig.r(Rig::hw(0, HW_STATUS)) & (STS_PAUSED | STS_HALTED),
        STS_HALTED
    );
    assert_eq!(rig.r(REG_HALT_SUM_LO), 1);
    assert_eq!(rig.ep.stats()[0].completions, 0, "halted");
    let v = rig.r(Rig::fw(0, FW_VALID_EN_SE));
    rig.w(Rig::fw(0, FW_VALID_EN_SE), v & !ENABLE);
    rig.w8(Rig::hw(0, HW_CTRL), 0);
    assert_eq!(rig.ep.stats()[0].completions, 0, "disabled");
    rig.w(Rig::fw(0, FW_VALID_EN_SE), v);
    assert_eq!(rig.ep.stats()[0].completions, 1, "runs once enabled");
    assert_eq!(rig.mem_read(BUF + 0x100, 8), [1; 8]);
}

#[test]
fn bad_descriptors_complete_with_an_error_and_pause_the_channel() {
    let rig = Rig::new(1);
    rig.open(0, 16);
    // A reserved opcode: INVD_CMD, and with ERR_PAUSE the channel pauses and says why on
    // the channel-status vector.
    rig.se(0, 0, 0x5, SE_LIOF, 7, 8, BUF, BUF + 0x100);
    rig.se(0, 1, OPC_MEMCPY, SE_LIOF, 8, 8, BUF, BUF + 0x100);
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 2);
    assert_eq!(rig.ce(0, 0), (0, 1, SC_D_INVD_CMD, 7, 1));
    let st = rig.r(Rig::hw(0, HW_STATUS));
    assert_eq!(
        st & (STS_PAUSED | STS_ERR_RSVD_OPCODE),
        STS_PAUSED | STS_ERR_RSVD_OPCODE
    );
    assert_eq!(rig.irqs(0), 1, "channel status vector");
    assert_eq!(rig.ep.stats()[0].completions, 1, "the next SE waits");
    // Resume (ctrl with PAUSE clear) runs the rest.
    rig.w8(Rig::hw(0, HW_CTRL), CTRL_ERR_PAUSE);
    assert_eq!(rig.r(Rig::hw(0, HW_STATUS)), 0);
    assert_eq!(rig.ce(0, 1).2, 0);
    // Unmapped source and destination, too long, fabric mode in basic mode.
    rig.w8(Rig::hw(0, HW_CTRL), 0);
    rig.se(0, 2, OPC_MEMCPY, 0, 9, 8, 0x10, BUF);
    rig.se(0, 3, OPC_MEMCPY, 0, 10, 8, BUF, IOVA + MEM);
    rig.se(0, 4, OPC_MEMCPY, 0, 11, SE_MAX_BYTES + 1, BUF, BUF + 0x100);
    rig.se(0, 5, OPC_MEMCPY, SE_DFM, 12, 8, BUF, BUF + 0x100);
    rig.se(0, 6, OPC_MEMCPY, 0, 13, 8, BUF, BUF + 0x100);
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 7);
    assert_eq!(rig.ce(0, 2).2, SC_D_RD_CTO);
    assert_eq!(rig.ce(0, 3).2, SC_UR);
    assert_eq!(rig.ce(0, 4).2, SC_LEN_ERR);
    assert_eq!(rig.ce(0, 5).2, SC_D_BAD_CONNID);
    assert_eq!(rig.ce(0, 6), (8, 7, 0, 13, 1));
    // An SQ tail past the queue is not run.
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 16);
    assert_eq!(rig.ep.stats()[0].completions, 7);
    // A CQ that cannot be written pauses the channel.
    rig.w(Rig::fw(0, FW_CQ_BASE_LO), 0x20);
    rig.w(Rig::fw(0, FW_CQ_BASE_HI), 0);
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 8);
    assert_ne!(rig.r(Rig::hw(0, HW_STATUS)) & STS_ERR_SE_CPL, 0);
}

#[test]
fn faults_lie_in_the_completion_or_drop_what_the_driver_checks() {
    let rig = Rig::new(1);
    rig.open(0, 32);
    rig.mem_write(BUF, &[7; 64]);
    let mut slot = 0u64;
    let mut submit = |rig: &Rig, len: u32| {
        rig.se(
            0,
            slot,
            OPC_MEMCPY,
            SE_LIOF,
            slot as u16,
            len,
            BUF,
            BUF + 0x1000 + slot * 0x100,
        );
        slot += 1;
        rig.w16(Rig::hw(0, HW_SQ_TAIL), slot as u16);
        slot - 1
    };
    rig.ep.set_faults(|f| f.bad_status = Some(SC_UR));
    let s = submit(&rig, 8);
    assert_eq!(rig.ce(0, s).2, SC_UR);
    rig.ep.set_faults(|f| {
        *f = DmaFaults {
            wrong_phase: true,
            ..Default::default()
        }
    });
    let s = submit(&rig, 8);
    assert_eq!(rig.ce(0, s).4, 0, "the phase of the previous pass");
    rig.ep.set_faults(|f| {
        *f = DmaFaults {
            drop_irq: true,
            ..Default::default()
        }
    });
    rig.irqs(1);
    let s = submit(&rig, 8);
    assert_eq!(rig.ce(0, s).4, 1);
    assert_eq!(rig.irqs(1), 0, "no interrupt");
    rig.ep.set_faults(|f| {
        *f = DmaFaults {
            short: true,
            ..Default::default()
        }
    });
    let s = submit(&rig, 64);
    assert_eq!(rig.ce(0, s).0, 32);
    let dst = rig.mem_read(BUF + 0x1000 + s * 0x100, 64);
    assert_eq!((&dst[..32], &dst[32..]), (&[7u8; 32][..], &[0u8; 32][..]));
    rig.ep.set_faults(|f| {
        *f = DmaFaults {
            stall: true,
            ..Default::default()
        }
    });
    let s = submit(&rig, 8);
    assert_eq!(rig.ep.stats()[0].completions, s);
    rig.ep.set_faults(|f| *f = DmaFaults::default());
    assert_eq!(
        rig.ep.stats()[0].completions,
        s + 1,
        "clearing the stall runs it"
    );
    assert_eq!(
        DmaFaults {
            bad_status: Some(2),
            stall: true,
            ..Default::default()
        }
        .names(),
        ["bad-status 0x2", "stall"]
    );
    // Hostile: the same seed lies the same way; some completions lie, not all.
    let ces = |seed: u64| {
        let rig = Rig::new(1);
        rig.open(0, 64);
        rig.ep.set_faults(|f| f.hostile = Some(seed));
        for k in 0..40u64 {
            rig.se(0, k, OPC_MEMCPY, SE_LIOF, k as u16, 8, BUF, BUF + 0x1000);
        }
        rig.w16(Rig::hw(0, HW_SQ_TAIL), 40);
        let ces = (0..40).map(|k| rig.ce(0, k)).collect::<Vec<_>>();
        (ces, rig.ep.completion_lies())
    };
    let (a, counted) = ces(42);
    assert_eq!((a.clone(), counted), ces(42));
    let honest = |k: usize, c: &(u32, u16, u32, u16, u16)| *c == (8, k as u16 + 1, 0, k as u16, 1);
    let lies = a.iter().enumerate().filter(|(k, c)| !honest(*k, c)).count();
    assert!((1..40).contains(&lies), "{lies} of 40 lied");
    assert_eq!(
        counted, lies as u64,
        "the lies counted are the lies written"
    );
}

#[test]
fn copies_span_several_iommu_mappings() {
    let ep = DmaEp::new("dmaep-t", 0, &Firmware::default(), 1);
    let rig = Rig {
        ep,
        efds: Vec::new(),
    };
    // Queues in one mapping, the buffers page by page in separate memfds.
    let mut res = Ok(());
    rig.ep
        .dma(&mut |t| res = t.map(IOVA, 0x20_0000, 0, 3, Some(memfd(0x20_0000))));
    res.expect("map queues");
    for p in 0..8u64 {
        let mut res = Ok(());
        rig.ep
            .dma(&mut |t| res = t.map(BUF + p * 0x1000, 0x1000, 0, 3, Some(memfd(0x1000))));
        res.expect("map page");
    }
    rig.open(0, 16);
    let data: Vec<u8> = (0..0x2800u32).map(|v| (v % 251) as u8).collect();
    let mut at = BUF + 0x800;
    let mut rest = &data[..];
    while !rest.is_empty() {
        let n = (0x1000 - (at % 0x1000) as usize).min(rest.len());
        rig.mem_write(at, &rest[..n]);
        rest = &rest[n..];
        at += n as u64;
    }
    rig.se(0, 0, OPC_MEMCPY, 0, 0, 0x2800, BUF + 0x800, BUF + 0x4100);
    rig.w16(Rig::hw(0, HW_SQ_TAIL), 1);
    assert_eq!(rig.ce(0, 0).2, 0);
    let mut back = Vec::new();
    let mut at = BUF + 0x4100;
    while back.len() < data.len() {
        let n = (0x1000 - (at % 0x1000) as usize).min(data.len() - back.len());
        back.extend(rig.mem_read(at, n));
        at += n as u64;
    }
    assert_eq!(back, data);
}

#[path = "dmafab_tests.rs"]
mod fabric;
