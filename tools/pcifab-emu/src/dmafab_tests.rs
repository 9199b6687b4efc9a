// SPDX-License-Identifier: GPL-2.0-only
//! Fabric mode of the DMA endpoints, driven the way Microchip's out-of-tree
//! switchtec_dma.c programs it: two hosts' endpoints share one hub, each with its own guest
//! memory; commands go through BAR0 and answer in the host's command buffer.

use super::*;
use crate::dmafab::*;

/// The command output buffer and the event queue in each host's memory.
const CMD: u64 = IOVA + 0x30_0000;
const EQ: u64 = IOVA + 0x31_0000;
/// Buffers the target registers and the initiator's source.
const TBUF: u64 = IOVA + 0x38_0000;
const SRC: u64 = IOVA + 0x3c_0000;

struct Pair {
    h: [Rig; 2],
}

fn pair(channels: u8) -> Pair {
    let hub = Hub::new(vec![0, 1], channels);
    let mk = |i: u32| {
        let ep = DmaEp::in_fabric(
            &format!("dmaep-h{i}"),
            i,
            &Firmware::default(),
            channels,
            Arc::clone(&hub),
        );
        let rig = Rig::attach(ep);
        rig.fabric_init();
        rig
    };
    Pair { h: [mk(0), mk(1)] }
}

impl Rig {
    /// What switchtec_dma_init_fabric() does.
    fn fabric_init(&self) {
        self.w(FAB_CTRL + FC_CMD_ADDR_LO, CMD as u32);
        self.w(FAB_CTRL + FC_CMD_ADDR_HI, (CMD >> 32) as u32);
        self.w(FAB_CTRL + FC_EVENT_ADDR_LO, EQ as u32);
        self.w(FAB_CTRL + FC_EVENT_ADDR_HI, (EQ >> 32) as u32);
        self.w(FAB_CTRL + FC_ENABLE, 0);
        self.w(FAB_CTRL + FC_ENABLE, 1);
    }

    /// execute_cmd(): (status, output).
    fn cmd(&self, cmd: u32, input: &[u8]) -> (u32, Vec<u8>) {
        self.mem_write(CMD, &[0; 16]);
        for (k, chunk) in input.chunks(4).enumerate() {
            let mut dw = [0u8; 4];
            dw[..chunk.len()].copy_from_slice(chunk);
            let mask = (0..chunk.len()).fold(0u32, |m, b| m | 0xff << (8 * b));
            let v = u32::from_le_bytes(dw);
            // Byte writes as memcpy_toio may do for the tail.
            if mask == 0xffff_ffff {
                self.w(FAB_CMD_INPUT + 4 * k as u64, v);
            } else {
                for (b, byte) in chunk.iter().enumerate() {
                    self.w8(FAB_CMD_INPUT + 4 * k as u64 + b as u64, *byte);
                }
            }
        }
        self.w(FAB_CMD, cmd);
        let head = self.mem_read(CMD, 16);
        let size = le32(&head, 12) as usize;
        (le32(&head, 0), self.mem_read(CMD + 16, size.min(1024)))
    }

    fn register(&self, peer_hfid: u16, index: u8, addr: u64, size: u64) -> (u32, Vec<u8>) {
        let mut req = Vec::new();
        req.extend_from_slice(&peer_hfid.to_le_bytes());
        req.extend_from_slice(&[index, 0]);
        req.extend_from_slice(&addr.to_le_bytes());
        req.extend_from_slice(&size.to_le_bytes());
        self.cmd(CMD_REGISTER_BUF, &req)
    }

    /// The event queue's head and entry `n` as (type, hfid, index, rhi_index).
    fn event(&self, n: u64) -> (u32, (u32, u16, u8, u16)) {
        let head = le32(&self.mem_read(EQ, 4), 0);
        let e = self.mem_read(EQ + EQ_HEADER + n * EQ_ENTRY, 16);
        (head, (le32(&e, 0), le16(&e, 4), e[6], le16(&e, 8)))
    }

    /// A fabric SE: DFM with the given DFIDs.
    #[allow(clippy::too_many_arguments)]
    fn fse(&self, slot: u64, opc: u8, len: u32, src: u64, dst: u64, dfid: u16, sfid: u16) {
        self.se(0, slot, opc, SE_DFM | SE_LIOF, slot as u16, len, src, dst);
        let at = SQ + slot * 32 + 28;
        let mut f = [0u8; 4];
        f[..2].copy_from_slice(&dfid.to_le_bytes());
        f[2..].copy_from_slice(&sfid.to_le_bytes());
        self.mem_write(at, &f);
    }
}

/// A GET_BUF_LIST entry: (hfid, index, addr, size, rhi, [local, remote, local rhi, remote rhi]).
type Entry = (u16, u8, u64, u64, u16, [u16; 4]);

fn entries(out: &[u8], first: usize, n: usize) -> Vec<Entry> {
    (0..n)
        .map(|k| {
            let e = &out[first + 32 * k..first + 32 * (k + 1)];
            (
                le16(e, 0),
                e[2],
                u64::from(le32(e, 4)) | u64::from(le32(e, 8)) << 32,
                u64::from(le32(e, 12)) | u64::from(le32(e, 16)) << 32,
                le16(e, 20),
                [le16(e, 24), le16(e, 26), le16(e, 28), le16(e, 30)],
            )
        })
        .collect()
}

#[test]
fn host_list_and_local_hfid() {
    let p = pair(1);
    assert_eq!(
        p.h[1].r(FAB_CTRL + FC_LOCAL_HFID) & 0xffff,
        u32::from(hfid(1))
    );
    let (st, out) = p.h[0].cmd(CMD_GET_HOST_LIST, &[LOCAL_PAX]);
    assert_eq!(st, CMD_STATUS_DONE);
    assert_eq!(out[..4], [PAX_ID, 1, 0, 2]);
    assert_eq!(le16(&out, 8), hfid(0));
    assert_eq!(le16(&out, 12), hfid(1));
    assert_eq!(out[14..16], [1, 3], "phys port 1, L0");
    assert_eq!(p.h[0].cmd(CMD_GET_HOST_LIST, &[7]).0, CMD_STATUS_ERROR);
    assert_eq!(p.h[0].cmd(99, &[]).0, CMD_STATUS_ERROR);
}

/// The target (h1) registers two buffers for h0; h0 hears of it, lists them and copies
/// into the data buffer; the bytes land in h1's memory; write-immediate and RHI as the
/// fabric_client initiator does them.
#[test]
fn cross_host_copy_lands_in_the_registered_buffer() {
    let p = pair(1);
    let (i0, t1) = (&p.h[0], &p.h[1]);
    i0.open(0, 16);
    let ev = i0.ep.hub.event_vec();
    assert_eq!(i0.r(FAB_CTRL + FC_EVENT_VEC) & 0xffff, ev as u32);
    // Target: scratchpad in slot 0, data in slot 1.
    let (st, out) = t1.register(hfid(0), 0, TBUF, 0x1000);
    assert_eq!(st, CMD_STATUS_DONE);
    let rhi_vec0 = usize::from(le16(&out, 2));
    assert_eq!(out[0], 0);
    let (st, out) = t1.register(hfid(0), 1, TBUF + 0x1000, 0x1000);
    assert_eq!(st, CMD_STATUS_DONE);
    assert_ne!(
        usize::from(le16(&out, 2)),
        rhi_vec0,
        "one RHI vector per buffer"
    );
    // The initiator got two register events on its event vector.
    assert_eq!(i0.irqs(ev), 2);
    assert_eq!(i0.event(0), (2, (EVENT_REGISTER, hfid(1), 0, 0)));
    assert_eq!(i0.event(1).1, (EVENT_REGISTER, hfid(1), 1, 1));
    assert_eq!(t1.irqs(t1.ep.hub.event_vec()), 0, "the owner hears nothing");
    i0.w(FAB_CTRL + FC_EVENT_TAIL, 2);
    // The initiator lists h1's buffers for it.
    let (st, out) = i0.cmd(CMD_GET_BUF_LIST, &hfid(1).to_le_bytes());
    assert_eq!(st, CMD_STATUS_DONE);
    assert_eq!(out[0], 2);
    let e = entries(&out, 8, 2);
    assert_eq!(e[0].0, hfid(1));
    assert_eq!(
        (e[1].1, e[1].2, e[1].3, e[1].4),
        (1, TBUF + 0x1000, 0x1000, 1)
    );
    let [local, remote, local_rhi, remote_rhi] = e[1].5;
    // The target lists its own.
    let (st, out) = t1.cmd(CMD_GET_OWN_BUF_LIST, &[0, 0]);
    assert_eq!(st, CMD_STATUS_DONE);
    assert_eq!((le16(&out, 0), out[4]), (2, 2));
    assert_eq!(entries(&out, 8, 2)[1].0, hfid(0), "own list names the peer");
    // The copy: 4 KiB from h0's memory into h1's data buffer.
    let data: Vec<u8> = (0..4096u32).map(|v| (v * 13 + 5) as u8).collect();
    i0.mem_write(SRC, &data);
    i0.fse(0, OPC_MEMCPY, 4096, SRC, TBUF + 0x1000, remote, local);
    // Write-immediates into the scratchpad: 8 then 4 bytes.
    i0.fse(
        1,
        OPC_WRIMM,
        8,
        0x1122_3344_aabb_ccdd,
        TBUF + 8,
        remote,
        local,
    );
    i0.fse(2, OPC_WRIMM, 4, 0x5566_7788, TBUF + 16, remote, local);
    // The RHI of the scratchpad: 0xffffffff at RHI_BASE + 4 * rhi_index.
    i0.fse(
        3,
        OPC_WRIMM,
        4,
        0xffff_ffff,
        RHI_BASE,
        remote_rhi,
        local_rhi,
    );
    i0.w16(Rig::hw(0, HW_SQ_TAIL), 4);
    for slot in 0..4 {
        assert_eq!(i0.ce(0, slot).2, 0, "SE {slot} completes without error");
    }
    assert_eq!(i0.ce(0, 0).0, 4096);
    assert_eq!(t1.mem_read(TBUF + 0x1000, 4096), data);
    assert_eq!(
        i0.mem_read(TBUF + 0x1000, 4096),
        vec![0; 4096],
        "not h0's memory"
    );
    assert_eq!(
        t1.mem_read(TBUF + 8, 8),
        0x1122_3344_aabb_ccddu64.to_le_bytes()
    );
    assert_eq!(t1.mem_read(TBUF + 16, 4), 0x5566_7788u32.to_le_bytes());
    assert_eq!(t1.irqs(rhi_vec0), 1, "the RHI is raised on the target");
    assert_eq!(i0.irqs(rhi_vec0), 0);
    assert_eq!(i0.irqs(1), 4, "the initiator's channel vector per SE");
    assert_eq!(t1.ep.fabric_stats().rhis, 1);
}

/// What the engine refuses, with the status switchtec_dma.c reports as a failed write:
/// a DFID nobody granted, one granted to another host, a write outside the registered
/// buffer, a source that is not the host's own memory, an RHI that names no buffer, and
/// everything once the buffer is unregistered.
#[test]
fn copies_outside_a_registered_buffer_or_grant_are_refused() {
    let p = pair(1);
    let (i0, t1) = (&p.h[0], &p.h[1]);
    i0.open(0, 64);
    let (local, remote) = (mem_dfid(0, 0), mem_dfid(1, 0));
    let run = |opc: u8, len: u32, src: u64, dst: u64, dfid: u16, sfid: u16| {
        // Each refusal pauses the channel (ERR_PAUSE): reopen it.
        i0.open(0, 64);
        i0.fse(0, opc, len, src, dst, dfid, sfid);
        i0.w16(Rig::hw(0, HW_SQ_TAIL), 1);
        i0.ce(0, 0).2
    };
    // Nothing registered: the DFID is not granted.
    assert_eq!(
        run(OPC_MEMCPY, 64, SRC, TBUF, remote, local),
        SC_D_BAD_CONNID
    );
    assert_ne!(i0.r(Rig::hw(0, HW_STATUS)) & STS_ERR_BAD_CONNID, 0);
    assert_eq!(t1.register(hfid(0), 2, TBUF, 0x100).0, CMD_STATUS_DONE);
    // In range: fine.
    assert_eq!(run(OPC_MEMCPY, 0x100, SRC, TBUF, remote, local), 0);
    // One byte past the end, below the start, a wrapping address.
    assert_eq!(run(OPC_MEMCPY, 0x101, SRC, TBUF, remote, local), SC_UR);
    assert_eq!(run(OPC_MEMCPY, 4, SRC, TBUF - 4, remote, local), SC_UR);
    assert_eq!(run(OPC_WRIMM, 8, 1, u64::MAX - 3, remote, local), SC_UR);
    // The DFID h1 granted to h0, used as if h0 were h1 / with another source.
    assert_eq!(
        run(OPC_MEMCPY, 4, SRC, TBUF, mem_dfid(1, 1), local),
        SC_D_BAD_CONNID
    );
    assert_eq!(
        run(OPC_MEMCPY, 4, SRC, TBUF, remote, mem_dfid(1, 0)),
        SC_D_BAD_CONNID
    );
    assert_eq!(
        run(OPC_MEMCPY, 4, SRC, TBUF, 0xffff, local),
        SC_D_BAD_CONNID
    );
    // RHI: index of a slot not registered, unaligned, not 4 bytes.
    let rhi = (rhi_dfid(1, 0), rhi_dfid(0, 0));
    assert_eq!(run(OPC_WRIMM, 4, !0, RHI_BASE + 8, rhi.0, rhi.1), 0);
    assert_eq!(
        run(OPC_WRIMM, 4, !0, RHI_BASE, rhi.0, rhi.1),
        SC_D_BAD_RHI_ADDR
    );
    assert_ne!(i0.r(Rig::hw(0, HW_STATUS)) & STS_ERR_BAD_RHI, 0);
    assert_eq!(
        run(OPC_WRIMM, 4, !0, RHI_BASE + 9, rhi.0, rhi.1),
        SC_D_BAD_RHI_ADDR
    );
    assert_eq!(
        run(OPC_WRIMM, 8, !0, RHI_BASE + 8, rhi.0, rhi.1),
        SC_D_BAD_RHI_ADDR
    );
    // Unregistered: the grant is gone, and h0 heard of it.
    let mut req = hfid(0).to_le_bytes().to_vec();
    req.extend_from_slice(&[2, 0]);
    assert_eq!(t1.cmd(CMD_UNREGISTER_BUF, &req).0, CMD_STATUS_DONE);
    assert_eq!(t1.cmd(CMD_UNREGISTER_BUF, &req).0, CMD_STATUS_ERROR);
    assert_eq!(i0.event(1), (2, (EVENT_UNREGISTER, hfid(1), 2, 0)));
    assert_eq!(
        run(OPC_MEMCPY, 4, SRC, TBUF, remote, local),
        SC_D_BAD_CONNID
    );
    assert_eq!(
        t1.mem_read(TBUF + 0x100, 4),
        [0; 4],
        "nothing past the buffer was written"
    );
}

#[test]
fn register_refuses_what_the_firmware_cannot_take() {
    let p = pair(1);
    let t1 = &p.h[1];
    assert_eq!(
        t1.register(hfid(0), 6, TBUF, 0x100).0,
        CMD_STATUS_ERROR,
        "index 6"
    );
    assert_eq!(
        t1.register(hfid(1), 0, TBUF, 0x100).0,
        CMD_STATUS_ERROR,
        "itself"
    );
    assert_eq!(
        t1.register(0x7777, 0, TBUF, 0x100).0,
        CMD_STATUS_ERROR,
        "no host"
    );
    assert_eq!(
        t1.register(hfid(0), 0, TBUF, 0).0,
        CMD_STATUS_ERROR,
        "empty"
    );
    assert_eq!(
        t1.register(hfid(0), 0, u64::MAX, 2).0,
        CMD_STATUS_ERROR,
        "wraps"
    );
    assert_eq!(t1.register(hfid(0), 0, TBUF, 0x100).0, CMD_STATUS_DONE);
    assert_eq!(
        t1.register(hfid(0), 0, TBUF, 0x100).0,
        CMD_STATUS_ERROR,
        "twice"
    );
    assert_eq!(p.h[0].event(0).0, 1, "one event for one registration");
}

/// cmd-hang: the status stays IDLE (the driver times out); drop-events: no event.
#[test]
fn cmd_hang_and_drop_events() {
    let p = pair(1);
    let (i0, t1) = (&p.h[0], &p.h[1]);
    t1.ep.set_faults(|f| f.cmd_hang = true);
    assert_eq!(t1.register(hfid(0), 0, TBUF, 0x100).0, 0, "never completes");
    t1.ep.set_faults(|f| f.cmd_hang = false);
    i0.ep.set_faults(|f| f.drop_events = true);
    assert_eq!(t1.register(hfid(0), 1, TBUF, 0x100).0, CMD_STATUS_DONE);
    assert_eq!(i0.event(0).0, 0, "no event written");
    assert_eq!(i0.irqs(i0.ep.hub.event_vec()), 0);
    assert_eq!(t1.ep.faults().names(), Vec::<String>::new());
    assert_eq!(i0.ep.faults().names(), ["drop-events"]);
}

/// Hostile firmware lies in command outputs and events, the same way for the same seed;
/// the truth (the registered buffers, the data path) stays.
#[test]
fn hostile_fabric_firmware_lies_in_outputs_and_events() {
    let run = |seed: u64| {
        let p = pair(1);
        let (i0, t1) = (&p.h[0], &p.h[1]);
        i0.ep.set_faults(|f| f.hostile = Some(seed));
        t1.ep.set_faults(|f| f.hostile = Some(seed));
        let mut outs = Vec::new();
        for k in 0..BUFS_PER_PEER {
            outs.push(t1.register(hfid(0), k, TBUF + 0x1000 * u64::from(k), 0x100));
        }
        for _ in 0..40 {
            outs.push(i0.cmd(CMD_GET_BUF_LIST, &hfid(1).to_le_bytes()));
            outs.push(i0.cmd(CMD_GET_HOST_LIST, &[LOCAL_PAX]));
        }
        let events: Vec<_> = (0..u64::from(BUFS_PER_PEER)).map(|n| i0.event(n)).collect();
        assert_eq!(t1.ep.fabric_stats().buffers.len(), 6, "the truth stays");
        let counted = i0.ep.fabric_stats().lies + t1.ep.fabric_stats().lies;
        (outs, events, counted)
    };
    let (outs, events, counted) = run(7);
    assert_eq!(
        (outs.clone(), events.clone(), counted),
        run(7),
        "same seed, same lies"
    );
    let lies = outs
        .iter()
        .filter(|(st, out)| {
            *st != CMD_STATUS_DONE
                || out.len() > 8 + 6 * 32
                || out.first().is_some_and(|b| *b & 0x80 != 0)
        })
        .count();
    assert!(
        lies > 0 && lies < outs.len() / 2,
        "{lies} of {} outputs lie",
        outs.len()
    );
    assert!(
        counted >= lies as u64,
        "{counted} lies counted, {lies} seen in the outputs alone"
    );
    let honest = |(head, (kind, h, idx, _)): &(u32, (u32, u16, u8, u16))| {
        *head < EQ_ENTRIES && *kind == EVENT_REGISTER && *h == hfid(1) && *idx < BUFS_PER_PEER
    };
    assert!(
        (1..=8).any(|seed| run(seed).1.iter().any(|e| !honest(e))),
        "hostile events lie for some seed"
    );
    assert!(
        events
            .iter()
            .any(|(_, (k, h, i, _))| *k == EVENT_REGISTER && *h == hfid(1) && *i < BUFS_PER_PEER),
        "a quarter lie, not all"
    );
}

/// A command output buffer or an event queue the guest put at the top of the address
/// space: the firmware refuses to write what would wrap past 2^64 and goes on.
#[test]
fn output_and_event_addresses_near_the_top_are_refused() {
    let p = pair(1);
    let (i0, t1) = (&p.h[0], &p.h[1]);
    let top = u64::MAX - 7;
    i0.w(FAB_CTRL + FC_CMD_ADDR_LO, top as u32);
    i0.w(FAB_CTRL + FC_CMD_ADDR_HI, (top >> 32) as u32);
    i0.w(FAB_CMD_INPUT, u32::from(LOCAL_PAX));
    i0.w(FAB_CMD, CMD_GET_HOST_LIST);
    assert_eq!(i0.ep.hub.counts(0).0, 1, "the command was taken");
    // h0's event queue at the top: h1's register still completes, h0's event is lost.
    i0.w(FAB_CTRL + FC_EVENT_ADDR_LO, top as u32);
    i0.w(FAB_CTRL + FC_EVENT_ADDR_HI, (top >> 32) as u32);
    assert_eq!(t1.register(hfid(0), 0, TBUF, 0x100).0, CMD_STATUS_DONE);
    assert_eq!(i0.ep.hub.counts(0).1, 1, "the event was taken");
    // Back in range, commands answer again.
    i0.fabric_init();
    assert_eq!(i0.cmd(CMD_GET_HOST_LIST, &[LOCAL_PAX]).0, CMD_STATUS_DONE);
}

/// A host whose QEMU disconnects loses its registrations: the peer hears an unregister
/// event and its copies through the old grant are refused.
#[test]
fn disconnect_drops_the_hosts_buffers() {
    let p = pair(1);
    let (i0, t1) = (&p.h[0], &p.h[1]);
    i0.open(0, 16);
    let (local, remote) = (mem_dfid(0, 0), mem_dfid(1, 0));
    assert_eq!(t1.register(hfid(0), 3, TBUF, 0x100).0, CMD_STATUS_DONE);
    assert_eq!(i0.register(hfid(1), 0, TBUF, 0x100).0, CMD_STATUS_DONE);
    i0.fse(0, OPC_MEMCPY, 4, SRC, TBUF, remote, local);
    i0.w16(Rig::hw(0, HW_SQ_TAIL), 1);
    assert_eq!(i0.ce(0, 0).2, 0, "the copy through the grant works");
    Device::disconnect(&t1.ep);
    assert!(i0.ep.hub.buffers(1).is_empty() && i0.ep.hub.buffers(0).is_empty());
    assert_eq!(i0.event(1), (2, (EVENT_UNREGISTER, hfid(1), 3, 0)));
    i0.open(0, 16);
    i0.fse(0, OPC_MEMCPY, 4, SRC, TBUF, remote, local);
    i0.w16(Rig::hw(0, HW_SQ_TAIL), 1);
    assert_eq!(i0.ce(0, 0).2, SC_D_BAD_CONNID, "the grant is gone");
}

/// A buffer's unregistration cannot complete between the engine's check of a peer's write
/// and the write itself: the write runs under the hub's lock, so UNREGISTER waits for it.
#[test]
fn unregister_waits_for_a_write_already_admitted() {
    use std::sync::mpsc;
    let p = pair(1);
    let (i0, t1) = (&p.h[0], &p.h[1]);
    assert_eq!(t1.register(hfid(0), 3, TBUF, 0x100).0, CMD_STATUS_DONE);
    let mut req = hfid(0).to_le_bytes().to_vec();
    req.extend_from_slice(&[3, 0]);
    let (inside_tx, inside_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    let hub = &i0.ep.hub;
    std::thread::scope(|s| {
        s.spawn(move || {
            let r = hub.dest(
                0,
                mem_dfid(1, 0),
                TBUF,
                4,
                |spans: &[crate::dma::HostSpan]| {
                    inside_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    crate::dmaep::write_spans(spans, &[0xa5; 4]);
                },
            );
            assert!(
                r.is_ok(),
                "the write inside the registered buffer is admitted"
            );
        });
        inside_rx.recv().unwrap();
        let req = &req;
        s.spawn(move || done_tx.send(t1.cmd(CMD_UNREGISTER_BUF, req).0).unwrap());
        // While the admitted write has not landed, the unregistration must not complete.
        let early = done_rx.recv_timeout(std::time::Duration::from_millis(300));
        go_tx.send(()).unwrap();
        assert_eq!(
            early,
            Err(mpsc::RecvTimeoutError::Timeout),
            "UNREGISTER completed while an admitted write to the buffer was still pending"
        );
        assert_eq!(done_rx.recv().unwrap(), CMD_STATUS_DONE);
    });
    assert_eq!(t1.mem_read(TBUF, 4), [0xa5; 4]);
}
