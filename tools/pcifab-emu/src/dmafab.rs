// SPDX-License-Identifier: GPL-2.0-only
//! Fabric mode of the DMA endpoints (PAX parts), as Microchip's out-of-tree
//! `switchtec_dma.c` (github.com/Microsemi/switchtec-dma) programs it: a firmware command
//! interface in BAR0 (input at 0x164000, command at 0x164800, output and status written
//! to a host buffer whose address is set at 0x165004), an event queue in host memory for
//! buffer register/unregister events, buffers a host registers for a peer (6 per peer), DMA
//! function ids (DFIDs) that name whose memory a descriptor reads or writes, copies and
//! write-immediates into a peer's registered buffers and remote host interrupts (RHI).
//!
//! The hub is shared by every host's endpoint: it holds each host's fabric registers, the
//! registered buffers and a handle on each host's DMA table and interrupts, so that h0's
//! engine can write into h1's memory. Lock order: an endpoint's state, then the hub, then a
//! host's DMA table or interrupts (leaves, never two at once).
//! Documentation/emulator.rst, "Fabric mode", lists what is guessed.

use crate::dma::{DmaTable, HostSpan, FLAG_WRITE};
use crate::dmaep::{
    SC_D_BAD_CONNID, SC_D_BAD_RHI_ADDR, SC_UR, STS_ERR_BAD_CONNID, STS_ERR_BAD_RHI, STS_ERR_SE_CPL,
};
use crate::hostile::{Rng, Stream};
use crate::irq::{self, Irqs};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Buffers a host may register for one peer.
pub const BUFS_PER_PEER: u8 = 6;
/// Host ports of one PAX (peers that get RHI vectors).
pub const MAX_PEERS: usize = 8;
/// Entries of the event queue (the driver's SWITCHTEC_DMA_EQ_SIZE; it never writes the
/// size register).
pub const EQ_ENTRIES: u32 = 1024;
pub const EQ_ENTRY: u64 = 16;
/// Where the event entries start after the queue's head dword (+ 3 reserved).
pub const EQ_HEADER: u64 = 16;
/// The command output buffer: status, command, return value, output size, 1 KiB of data.
pub const CMD_OUT_DATA: u64 = 16;
pub const CMD_OUT_MAX: usize = 1024;

// BAR0 offsets.
pub const FAB_CMD_INPUT: u64 = 0x16_4000;
pub const FAB_CMD_INPUT_LEN: u64 = 0x400;
pub const FAB_CMD: u64 = 0x16_4800;
pub const FAB_CTRL: u64 = 0x16_5000;
pub const FC_CMD_VEC: u64 = 0x00;
pub const FC_CMD_ADDR_LO: u64 = 0x04;
pub const FC_CMD_ADDR_HI: u64 = 0x08;
pub const FC_EVENT_VEC: u64 = 0x0c;
pub const FC_EVENT_ADDR_LO: u64 = 0x10;
pub const FC_EVENT_ADDR_HI: u64 = 0x14;
pub const FC_EVENT_SIZE: u64 = 0x18;
pub const FC_EVENT_TAIL: u64 = 0x1c;
pub const FC_ENABLE: u64 = 0x20;
pub const FC_LOCAL_HFID: u64 = 0x24;
pub const FC_REQUESTER_ID: u64 = 0x28;
pub const FAB_CTRL_LEN: u64 = 0x2c;

// Commands and their status.
pub const CMD_GET_HOST_LIST: u32 = 1;
pub const CMD_REGISTER_BUF: u32 = 2;
pub const CMD_UNREGISTER_BUF: u32 = 3;
pub const CMD_GET_BUF_LIST: u32 = 4;
pub const CMD_GET_OWN_BUF_LIST: u32 = 5;
pub const CMD_STATUS_DONE: u32 = 2;
pub const CMD_STATUS_ERROR: u32 = 0xff;

// Events.
pub const EVENT_REGISTER: u32 = 0;
pub const EVENT_UNREGISTER: u32 = 1;
pub const EVENT_OVERFLOW: u32 = 2;

/// The window RHI writes go to: a 4-byte write of any value at RHI_BASE + 4 * rhi_index
/// through the peer's RHI DFID.
pub const RHI_BASE: u64 = 0x13_5000;
/// Buffer entry of GET_BUF_LIST / GET_OWN_BUF_LIST replies.
pub const BUF_ENTRY: usize = 32;
/// The PAX id of the one switch of the fabric.
pub const PAX_ID: u8 = 0;
pub const LOCAL_PAX: u8 = 0xff;
/// Link state the host list reports (LTSSM major state L0).
const LTSSM_L0: u8 = 3;

/// The HFID of host `i` (guess: the README's examples, 0x0a01...).
pub fn hfid(i: usize) -> u16 {
    0x0a01 + i as u16
}

/// The DFID through which `user`'s engine reaches `owner`'s memory.
pub fn mem_dfid(owner: usize, user: usize) -> u16 {
    0x1000 | ((owner as u16) << 6) | user as u16
}

/// The DFID through which `user`'s engine raises RHIs on `owner`.
pub fn rhi_dfid(owner: usize, user: usize) -> u16 {
    0x2000 | ((owner as u16) << 6) | user as u16
}

/// (kind, owner, user) of a DFID, kind 1 memory, 2 RHI.
fn split_dfid(d: u16, hosts: usize) -> Option<(u16, usize, usize)> {
    let kind = d >> 12;
    let (owner, user) = (usize::from((d >> 6) & 0x3f), usize::from(d & 0x3f));
    (matches!(kind, 1 | 2) && owner < hosts && user < hosts).then_some((kind, owner, user))
}

/// One host's DMA table and interrupts, reachable by every engine of the fabric.
#[derive(Default)]
pub struct Port {
    pub dma: Mutex<DmaTable>,
    pub irqs: Mutex<Irqs>,
}

impl Port {
    pub fn dma(&self) -> MutexGuard<'_, DmaTable> {
        self.dma.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn irqs(&self) -> MutexGuard<'_, Irqs> {
        self.irqs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A registered buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Buf {
    pub addr: u64,
    pub size: u64,
}

/// Faults of one host's fabric firmware (set with the endpoint's `dmaep` faults).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FabFaults {
    /// Commands are taken but never complete (the driver's 200 ms timeout).
    pub cmd_hang: bool,
    /// Events are not written or raised.
    pub drop_events: bool,
    /// Hostile firmware: a quarter of the command outputs and events lie in one field.
    pub hostile: Option<u64>,
}

/// One host's fabric registers.
#[derive(Debug, Clone, Default)]
struct Ctrl {
    input: Vec<u8>,
    cmd_addr: u64,
    event_addr: u64,
    event_size: u32,
    event_head: u32,
    event_tail: u32,
    enable: u32,
    overflowed: bool,
    faults: FabFaults,
    hostile_n: u64,
    /// Command outputs and events hostile mode falsified (a field written other than the
    /// truth), since the emulator started.
    lies: u64,
    commands: u64,
    events: u64,
    rhis: u64,
}

struct HubState {
    ctrl: Vec<Ctrl>,
    /// (owner, peer, index) -> buffer the owner registered for the peer.
    bufs: BTreeMap<(usize, usize, u8), Buf>,
}

/// The fabric-mode firmware shared by every host's DMA endpoint.
pub struct Hub {
    ports: Vec<Arc<Port>>,
    /// Physical port of each host (the host list).
    phys: Vec<u8>,
    /// MSI-X vectors of each endpoint before the fabric ones (channels + status).
    base_vec: usize,
    st: Mutex<HubState>,
}

/// What a fabric descriptor's destination was.
pub enum Dest {
    /// Memory of the owner, written.
    Mem,
    /// An RHI raised.
    Rhi,
}

/// Why a fabric descriptor was refused: (completion status, channel pause reason).
pub type Refusal = (u32, u32);

impl Hub {
    /// A hub for `phys.len()` hosts whose endpoints have `channels` channels.
    pub fn new(phys: Vec<u8>, channels: u8) -> Arc<Hub> {
        let n = phys.len();
        Arc::new(Hub {
            ports: (0..n).map(|_| Arc::new(Port::default())).collect(),
            phys,
            base_vec: usize::from(channels) + 1,
            st: Mutex::new(HubState {
                ctrl: vec![
                    Ctrl {
                        input: vec![0; FAB_CMD_INPUT_LEN as usize],
                        ..Ctrl::default()
                    };
                    n
                ],
                bufs: BTreeMap::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn hosts(&self) -> usize {
        self.ports.len()
    }

    pub fn port(&self, i: usize) -> Arc<Port> {
        Arc::clone(&self.ports[i])
    }

    /// MSI-X vectors each endpoint has: status, channels, command, event, 6 RHI per peer.
    pub fn vectors(&self) -> usize {
        self.base_vec + 2 + usize::from(BUFS_PER_PEER) * MAX_PEERS
    }

    pub fn cmd_vec(&self) -> usize {
        self.base_vec
    }

    pub fn event_vec(&self) -> usize {
        self.base_vec + 1
    }

    /// Peers of `owner` in host order without itself: the slot of `peer`, if it has one.
    fn peer_slot(owner: usize, peer: usize) -> Option<usize> {
        let s = if peer < owner {
            peer
        } else {
            peer.checked_sub(1)?
        };
        (peer != owner && s < MAX_PEERS).then_some(s)
    }

    fn rhi_index(owner: usize, peer: usize, index: u8) -> Option<u16> {
        Self::peer_slot(owner, peer)
            .map(|s| (s * usize::from(BUFS_PER_PEER)) as u16 + u16::from(index))
    }

    pub fn set_faults(&self, host: usize, f: impl FnOnce(&mut FabFaults)) {
        let mut st = self.lock();
        let c = &mut st.ctrl[host];
        f(&mut c.faults);
        c.hostile_n = 0;
    }

    /// (commands, events, RHIs raised) on host `host`.
    pub fn counts(&self, host: usize) -> (u64, u64, u64) {
        let st = self.lock();
        let c = &st.ctrl[host];
        (c.commands, c.events, c.rhis)
    }

    /// Command outputs and events of host `host` that hostile mode falsified.
    pub fn lies(&self, host: usize) -> u64 {
        self.lock().ctrl[host].lies
    }

    /// Buffers `owner` registered, as (peer, index, buffer).
    pub fn buffers(&self, owner: usize) -> Vec<(usize, u8, Buf)> {
        self.lock()
            .bufs
            .iter()
            .filter(|((o, _, _), _)| *o == owner)
            .map(|((_, p, i), b)| (*p, *i, *b))
            .collect()
    }

    /// A read of the fabric dword at `off` of host `host`'s BAR0, if it is one.
    pub fn read32(&self, host: usize, off: u64) -> Option<u32> {
        let st = self.lock();
        let c = &st.ctrl[host];
        if (FAB_CMD_INPUT..FAB_CMD_INPUT + FAB_CMD_INPUT_LEN).contains(&off) {
            let o = (off - FAB_CMD_INPUT) as usize;
            return Some(u32::from_le_bytes([
                c.input[o],
                c.input[o + 1],
                c.input[o + 2],
                c.input[o + 3],
            ]));
        }
        if off == FAB_CMD {
            return Some(0);
        }
        if !(FAB_CTRL..FAB_CTRL + FAB_CTRL_LEN).contains(&off) {
            return None;
        }
        Some(match off - FAB_CTRL {
            FC_CMD_VEC => self.cmd_vec() as u32,
            FC_CMD_ADDR_LO => c.cmd_addr as u32,
            FC_CMD_ADDR_HI => (c.cmd_addr >> 32) as u32,
            FC_EVENT_VEC => self.event_vec() as u32,
            FC_EVENT_ADDR_LO => c.event_addr as u32,
            FC_EVENT_ADDR_HI => (c.event_addr >> 32) as u32,
            FC_EVENT_SIZE => c.event_size,
            FC_EVENT_TAIL => c.event_tail,
            FC_ENABLE => c.enable,
            FC_LOCAL_HFID => u32::from(hfid(host)),
            // Guess: bus 0x80 + host, device 0, function 2 of the endpoint.
            FC_REQUESTER_ID => (0x80 + host as u32) << 8 | 2,
            _ => 0,
        })
    }

    /// A write of the fabric dword at `off`; false when `off` is not a fabric register.
    pub fn write32(&self, host: usize, off: u64, val: u32, mask: u32) -> bool {
        let mut st = self.lock();
        if (FAB_CMD_INPUT..FAB_CMD_INPUT + FAB_CMD_INPUT_LEN).contains(&off) {
            let o = (off - FAB_CMD_INPUT) as usize;
            let c = &mut st.ctrl[host];
            for k in 0..4 {
                if mask >> (8 * k) & 0xff != 0 {
                    c.input[o + k] = (val >> (8 * k)) as u8;
                }
            }
            return true;
        }
        if off == FAB_CMD {
            // The command is a u16; the driver writes it with a 32-bit write.
            self.command(&mut st, host, val & mask & 0xffff);
            return true;
        }
        if !(FAB_CTRL..FAB_CTRL + FAB_CTRL_LEN).contains(&off) {
            return false;
        }
        let merge = |old: u32| (old & !mask) | (val & mask);
        let lo = |b: u64, w: u32| (b & !0xffff_ffff) | u64::from(w);
        let hi = |b: u64, w: u32| (b & 0xffff_ffff) | u64::from(w) << 32;
        let c = &mut st.ctrl[host];
        match off - FAB_CTRL {
            FC_CMD_ADDR_LO => c.cmd_addr = lo(c.cmd_addr, merge(c.cmd_addr as u32)),
            FC_CMD_ADDR_HI => c.cmd_addr = hi(c.cmd_addr, merge((c.cmd_addr >> 32) as u32)),
            FC_EVENT_ADDR_LO => c.event_addr = lo(c.event_addr, merge(c.event_addr as u32)),
            FC_EVENT_ADDR_HI => c.event_addr = hi(c.event_addr, merge((c.event_addr >> 32) as u32)),
            FC_EVENT_SIZE => c.event_size = merge(c.event_size),
            FC_EVENT_TAIL => {
                let t = merge(c.event_tail);
                if t < EQ_ENTRIES {
                    c.event_tail = t;
                } else {
                    note!(
                        "dmaep h{host}: event queue tail {t} outside {EQ_ENTRIES} entries ignored"
                    );
                }
            }
            FC_ENABLE => {
                let e = merge(c.enable);
                // Turning events on starts the queue afresh (the driver writes 0, then 1).
                if e & 1 != 0 && c.enable & 1 == 0 {
                    c.event_head = 0;
                    c.event_tail = 0;
                    c.overflowed = false;
                }
                c.enable = e;
            }
            _ => {}
        }
        true
    }

    /// Function reset of host `host`'s endpoint: its registers start over; the buffers it
    /// registered stay (they are the firmware's, not the function's).
    pub fn reset(&self, host: usize) {
        let mut st = self.lock();
        st.ctrl[host] = Ctrl {
            input: vec![0; FAB_CMD_INPUT_LEN as usize],
            faults: st.ctrl[host].faults.clone(),
            ..Ctrl::default()
        };
    }

    /// Host `host` is gone (its QEMU disconnected): the firmware drops every buffer it
    /// registered and every one registered for it, tells each peer that lost one of the
    /// host's buffers with an unregister event, and forgets the host's command and event
    /// addresses (guess: what the firmware does when a host's link goes down). Otherwise a
    /// peer's engine could write through an old registration, or an event land at an old
    /// address, into whatever the host's next boot maps there. Owners of buffers that were
    /// registered for the host hear nothing; their later UNREGISTER is refused.
    pub fn forget(&self, host: usize) {
        let mut st = self.lock();
        let gone: Vec<(usize, usize, u8)> = st
            .bufs
            .keys()
            .filter(|(o, p, _)| *o == host || *p == host)
            .copied()
            .collect();
        for k in &gone {
            st.bufs.remove(k);
        }
        st.ctrl[host] = Ctrl {
            input: vec![0; FAB_CMD_INPUT_LEN as usize],
            faults: st.ctrl[host].faults.clone(),
            ..Ctrl::default()
        };
        for (o, p, i) in gone {
            if o == host {
                let mut ev = [0u8; 12];
                ev[0..2].copy_from_slice(&hfid(host).to_le_bytes());
                ev[2] = i;
                self.event(&mut st, p, EVENT_UNREGISTER, ev);
            }
        }
    }

    /// Run command `cmd` of host `host` and write its output.
    fn command(&self, st: &mut HubState, host: usize, cmd: u32) {
        st.ctrl[host].commands += 1;
        if st.ctrl[host].faults.cmd_hang {
            debug!("dmaep h{host}: fabric command {cmd} left hanging (fault)");
            return;
        }
        let input = st.ctrl[host].input.clone();
        let (status, mut out) = match self.run_command(st, host, cmd, &input) {
            Ok(out) => (CMD_STATUS_DONE, out),
            Err(why) => {
                note!("dmaep h{host}: fabric command {cmd} refused: {why}");
                (CMD_STATUS_ERROR, Vec::new())
            }
        };
        let mut status = status;
        let mut size = out.len() as u32;
        if let Some(seed) = st.ctrl[host].faults.hostile {
            let n = st.ctrl[host].hostile_n;
            st.ctrl[host].hostile_n += 1;
            let mut rng = Rng::new(seed, 0x200 + host as u32, Stream::Mrpc, n);
            if rng.chance(1, 4) {
                let truth = (status, size, out.clone());
                match rng.below(4) {
                    0 => status = rng.next() as u32,
                    1 => size = rng.next() as u32 | 0x400,
                    2 if !out.is_empty() => {
                        // A count or index: the first byte of every reply is one.
                        out[0] = rng.next() as u8 | 0x80;
                    }
                    _ if out.len() >= 4 => {
                        let k = 2 + rng.below(out.len() as u64 - 2) as usize;
                        out[k] = rng.next() as u8;
                    }
                    _ => status = rng.next() as u32,
                }
                if (status, size, &out) != (truth.0, truth.1, &truth.2) {
                    st.ctrl[host].lies += 1;
                }
            }
        }
        let addr = st.ctrl[host].cmd_addr;
        if addr == 0 {
            note!("dmaep h{host}: fabric command {cmd} with no output buffer set");
            return;
        }
        // A guest-set address: refuse to write an output that wraps past 2^64.
        let (Some(at_cmd), Some(at_data)) = (
            addr.checked_add(4),
            addr.checked_add(CMD_OUT_DATA)
                .filter(|a| a.checked_add(out.len() as u64).is_some()),
        ) else {
            note!("dmaep h{host}: fabric command {cmd} output at {addr:#x} wraps past 2^64: not written");
            return;
        };
        let mut head = [0u8; 16];
        head[4..8].copy_from_slice(&cmd.to_le_bytes());
        head[12..16].copy_from_slice(&size.to_le_bytes());
        let port = &self.ports[host];
        let dma = port.dma();
        let res = dma
            .write(at_cmd, &head[4..])
            .and_then(|_| dma.write(at_data, &out))
            // The status last: the driver polls it.
            .and_then(|_| dma.write(addr, &status.to_le_bytes()));
        if let Err(e) = res {
            note!("dmaep h{host}: fabric command {cmd} output at {addr:#x}: {e}");
        }
    }

    fn run_command(
        &self,
        st: &mut HubState,
        host: usize,
        cmd: u32,
        input: &[u8],
    ) -> Result<Vec<u8>, String> {
        let le16 = |at: usize| u16::from_le_bytes([input[at], input[at + 1]]);
        let le32 = |at: usize| {
            u32::from_le_bytes([input[at], input[at + 1], input[at + 2], input[at + 3]])
        };
        let peer_of = |h: u16| -> Result<usize, String> {
            (0..self.hosts())
                .find(|&i| hfid(i) == h && i != host)
                .ok_or_else(|| format!("HFID {h:#06x} is no peer host"))
        };
        match cmd {
            CMD_GET_HOST_LIST => {
                let pax = input[0];
                if pax != LOCAL_PAX && pax != PAX_ID {
                    return Err(format!("PAX {pax} is not in the fabric"));
                }
                let n = self.hosts().min(MAX_PEERS);
                let mut out = vec![PAX_ID, 1, self.phys[host], n as u8, 0, 0, 0, 0];
                for i in 0..n {
                    out.extend_from_slice(&hfid(i).to_le_bytes());
                    out.extend_from_slice(&[self.phys[i], LTSSM_L0]);
                }
                Ok(out)
            }
            CMD_REGISTER_BUF => {
                let peer = peer_of(le16(0))?;
                let index = input[2];
                let addr = u64::from(le32(4)) | u64::from(le32(8)) << 32;
                let size = u64::from(le32(12)) | u64::from(le32(16)) << 32;
                if index >= BUFS_PER_PEER {
                    return Err(format!("buffer index {index} is not below {BUFS_PER_PEER}"));
                }
                let rhi = Self::rhi_index(host, peer, index)
                    .ok_or_else(|| format!("peer h{peer} has no RHI vectors"))?;
                if size == 0 || addr.checked_add(size).is_none() {
                    return Err(format!("buffer {addr:#x}+{size:#x} is empty or wraps"));
                }
                if st.bufs.contains_key(&(host, peer, index)) {
                    return Err(format!("buffer {index} for h{peer} is already registered"));
                }
                st.bufs.insert((host, peer, index), Buf { addr, size });
                let vec = self.base_vec + 2 + usize::from(rhi);
                let mut ev = [0u8; 12];
                ev[0..2].copy_from_slice(&hfid(host).to_le_bytes());
                ev[2] = index;
                ev[4..6].copy_from_slice(&rhi.to_le_bytes());
                self.event(st, peer, EVENT_REGISTER, ev);
                let mut out = vec![index, 0];
                out.extend_from_slice(&(vec as u16).to_le_bytes());
                Ok(out)
            }
            CMD_UNREGISTER_BUF => {
                let peer = peer_of(le16(0))?;
                let index = input[2];
                if st.bufs.remove(&(host, peer, index)).is_none() {
                    return Err(format!("buffer {index} for h{peer} is not registered"));
                }
                let mut ev = [0u8; 12];
                ev[0..2].copy_from_slice(&hfid(host).to_le_bytes());
                ev[2] = index;
                self.event(st, peer, EVENT_UNREGISTER, ev);
                Ok(Vec::new())
            }
            CMD_GET_BUF_LIST => {
                let owner = peer_of(le16(0))?;
                let bufs: Vec<(u8, Buf)> = st
                    .bufs
                    .iter()
                    .filter(|((o, p, _), _)| *o == owner && *p == host)
                    .map(|((_, _, i), b)| (*i, *b))
                    .collect();
                let mut out = vec![bufs.len() as u8, 0, 0, 0, 0, 0, 0, 0];
                for (i, b) in bufs {
                    // The initiator's view: local is itself, remote the owner.
                    entry(
                        &mut out,
                        owner,
                        i,
                        b,
                        Self::rhi_index(owner, host, i).unwrap_or(0),
                        [
                            mem_dfid(host, host),
                            mem_dfid(owner, host),
                            rhi_dfid(host, host),
                            rhi_dfid(owner, host),
                        ],
                    );
                }
                Ok(out)
            }
            CMD_GET_OWN_BUF_LIST => {
                // The driver writes the start index as a u16 once and a u8 after: the low
                // byte is the index.
                let start = usize::from(input[0]);
                let bufs: Vec<(usize, u8, Buf)> = st
                    .bufs
                    .iter()
                    .filter(|((o, _, _), _)| *o == host)
                    .map(|((_, p, i), b)| (*p, *i, *b))
                    .collect();
                let total = bufs.len() as u16;
                let room = (CMD_OUT_MAX - 8) / BUF_ENTRY;
                let part: Vec<_> = bufs.into_iter().skip(start).take(room).collect();
                let mut out = Vec::new();
                out.extend_from_slice(&total.to_le_bytes());
                out.extend_from_slice(&(start as u16).to_le_bytes());
                out.extend_from_slice(&[part.len() as u8, 0, 0, 0]);
                for (peer, i, b) in part {
                    // The owner's view: local is itself as the peer reaches it.
                    entry(
                        &mut out,
                        peer,
                        i,
                        b,
                        Self::rhi_index(host, peer, i).unwrap_or(0),
                        [
                            mem_dfid(host, peer),
                            mem_dfid(peer, peer),
                            rhi_dfid(host, peer),
                            rhi_dfid(peer, peer),
                        ],
                    );
                }
                Ok(out)
            }
            _ => Err(format!("unknown command {cmd}")),
        }
    }

    /// Put an event into host `to`'s queue and raise its event vector. A full queue loses
    /// the event; the next one that fits is preceded by an overflow event (guess).
    fn event(&self, st: &mut HubState, to: usize, kind: u32, data: [u8; 12]) {
        let c = &st.ctrl[to];
        if c.faults.drop_events {
            debug!("dmaep h{to}: fabric event {kind} dropped (fault)");
            return;
        }
        if c.enable & 1 == 0 || c.event_addr == 0 {
            debug!("dmaep h{to}: fabric event {kind} with events off: not written");
            return;
        }
        if c.overflowed {
            if !self.push(st, to, EVENT_OVERFLOW, [0; 12]) {
                return;
            }
            st.ctrl[to].overflowed = false;
        }
        if !self.push(st, to, kind, data) {
            st.ctrl[to].overflowed = true;
            note!("dmaep h{to}: fabric event queue full, event {kind} lost");
            return;
        }
        if let Err(e) = self.ports[to].irqs().fire(irq::MSIX, self.event_vec()) {
            note!("dmaep h{to}: fabric event interrupt not delivered: {e}");
        }
    }

    /// Write one event entry and the new head; false when the queue is full.
    fn push(&self, st: &mut HubState, to: usize, kind: u32, data: [u8; 12]) -> bool {
        let c = &mut st.ctrl[to];
        let next = (c.event_head + 1) % EQ_ENTRIES;
        if next == c.event_tail {
            return false;
        }
        let (mut kind, mut data, mut head_out) = (kind, data, next);
        if let Some(seed) = c.faults.hostile {
            let n = c.hostile_n;
            c.hostile_n += 1;
            let mut rng = Rng::new(seed, 0x300 + to as u32, Stream::Register, n);
            if rng.chance(1, 4) {
                let truth = (kind, head_out, data);
                match rng.below(4) {
                    0 => kind = rng.next() as u32 | 0x100,
                    1 => head_out = rng.next() as u32 | EQ_ENTRIES,
                    2 => data[2] = rng.next() as u8 | 0x80,
                    _ => data[0..2].copy_from_slice(&(rng.next() as u16).to_le_bytes()),
                }
                if (kind, head_out, data) != truth {
                    c.lies += 1;
                }
            }
        }
        let mut e = [0u8; EQ_ENTRY as usize];
        e[0..4].copy_from_slice(&kind.to_le_bytes());
        e[4..16].copy_from_slice(&data);
        // A guest-set address: an entry that would wrap past 2^64 is lost, as one the
        // DMA table refuses is.
        let at = c
            .event_addr
            .checked_add(EQ_HEADER + u64::from(c.event_head) * EQ_ENTRY)
            .filter(|a| a.checked_add(EQ_ENTRY).is_some());
        let addr = c.event_addr;
        c.event_head = next;
        c.events += 1;
        let Some(at) = at else {
            note!("dmaep h{to}: fabric event queue at {addr:#x} wraps past 2^64: event {kind} not written");
            return true;
        };
        let dma = self.ports[to].dma();
        if let Err(e) = dma
            .write(at, &e)
            .and_then(|_| dma.write(addr, &head_out.to_le_bytes()))
        {
            note!("dmaep h{to}: fabric event at {at:#x}: {e}");
        }
        true
    }

    /// Writes `len` bytes at `addr` through `dfid` for `user`'s engine, when `dfid` lets it
    /// (the user's own memory, or inside one buffer its owner registered for the user):
    /// `write` gets the spans, and runs under the hub's lock, so a buffer's unregistration
    /// (which takes that lock) completes either before the check or after the write, never
    /// between them.
    pub fn dest(
        &self,
        user: usize,
        dfid: u16,
        addr: u64,
        len: usize,
        write: impl FnOnce(&[HostSpan]),
    ) -> Result<Dest, Refusal> {
        let bad_conn = (SC_D_BAD_CONNID, STS_ERR_BAD_CONNID);
        let Some((kind, owner, u)) = split_dfid(dfid, self.hosts()) else {
            note!("dmaep h{user}: DFID {dfid:#06x} names no connection");
            return Err(bad_conn);
        };
        if u != user {
            note!("dmaep h{user}: DFID {dfid:#06x} was granted to h{u}, not h{user}");
            return Err(bad_conn);
        }
        let mut st = self.lock();
        if owner != user && !st.bufs.keys().any(|(o, p, _)| *o == owner && *p == user) {
            note!("dmaep h{user}: DFID {dfid:#06x}: h{owner} registers no buffer for h{user}");
            return Err(bad_conn);
        }
        if kind == 2 {
            let idx = addr
                .checked_sub(RHI_BASE)
                .filter(|o| o % 4 == 0 && len == 4)
                .map(|o| o / 4);
            let hit = idx.and_then(|idx| {
                (0..BUFS_PER_PEER)
                    .find(|&i| Self::rhi_index(owner, user, i).map(u64::from) == Some(idx))
                    .filter(|&i| st.bufs.contains_key(&(owner, user, i)))
                    .map(|i| (idx, i))
            });
            let Some((idx, _)) = hit else {
                note!("dmaep h{user}: RHI write of {len} bytes at {addr:#x} to h{owner} names no registered buffer");
                return Err((SC_D_BAD_RHI_ADDR, STS_ERR_BAD_RHI));
            };
            let vec = self.base_vec + 2 + idx as usize;
            st.ctrl[owner].rhis += 1;
            drop(st);
            if let Err(e) = self.ports[owner].irqs().fire(irq::MSIX, vec) {
                note!("dmaep h{owner}: RHI vector {vec} not delivered: {e}");
            }
            return Ok(Dest::Rhi);
        }
        if owner != user {
            let inside = st.bufs.iter().any(|((o, p, _), b)| {
                *o == owner
                    && *p == user
                    && addr >= b.addr
                    && (addr - b.addr)
                        .checked_add(len as u64)
                        .is_some_and(|end| end <= b.size)
            });
            if !inside {
                note!("dmaep h{user}: write of {len} bytes at {addr:#x} to h{owner} is outside every buffer h{owner} registered for h{user}");
                return Err((SC_UR, STS_ERR_SE_CPL));
            }
        }
        let spans = self.ports[owner].dma().resolve(addr, len, FLAG_WRITE);
        match spans {
            Ok(s) => {
                write(&s);
                drop(st);
                Ok(Dest::Mem)
            }
            Err(e) => {
                note!("dmaep h{user}: write to h{owner} at {addr:#x}: {e}");
                Err((SC_UR, STS_ERR_SE_CPL))
            }
        }
    }
}

/// Append one 32-byte buffer entry.
fn entry(out: &mut Vec<u8>, hfid_of: usize, index: u8, b: Buf, rhi: u16, dfids: [u16; 4]) {
    out.extend_from_slice(&hfid(hfid_of).to_le_bytes());
    out.extend_from_slice(&[index, 0]);
    out.extend_from_slice(&(b.addr as u32).to_le_bytes());
    out.extend_from_slice(&((b.addr >> 32) as u32).to_le_bytes());
    out.extend_from_slice(&(b.size as u32).to_le_bytes());
    out.extend_from_slice(&((b.size >> 32) as u32).to_le_bytes());
    out.extend_from_slice(&rhi.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    for d in dfids {
        out.extend_from_slice(&d.to_le_bytes());
    }
}
