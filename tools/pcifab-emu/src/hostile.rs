// SPDX-License-Identifier: GPL-2.0-only
//! Hostile firmware (control request `fault <host|all> hostile <seed>`): a
//! MEP whose firmware lies in everything the driver parses, to prove the
//! driver checks what it reads (Documentation/emulator.rst, "Hostile
//! firmware").
//!
//! Only what the guest sees is corrupted: MRPC replies on their way into
//! the output buffer and the return value / status registers, register
//! values on their way out of a read, DMA write-backs on their way into
//! guest memory. The fabric model, the stored registers and the DMA
//! engine's own registers stay true.
//!
//! Every decision comes from a SplitMix64 stream keyed by (seed, partition,
//! stream, event number), so a seed and the same sequence of events give the
//! same lies, whatever the other streams (other threads) do.

use crate::gas::*;
use crate::mrpc::{self, MrpcOutcome, PAYLOAD};

/// The independent event streams.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stream {
    /// MRPC replies.
    Mrpc = 0,
    /// BAR0 reads of event registers and the MRPC status.
    Register = 1,
    /// DMA descriptor write-backs.
    Dma = 2,
    /// Spurious interrupts (one draw per MRPC completion).
    Irq = 3,
}

/// What a hostile MEP has done since the mode was last set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    pub mrpc_replies: u64,
    pub register_reads: u64,
    pub dma_writebacks: u64,
    pub spurious_irqs: u64,
}

/// Per-MEP state of the mode (whether it is on is `Faults::hostile`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    /// The seed last set; None: never set since start.
    pub seed: Option<u64>,
    /// Events drawn per stream.
    next: [u64; 4],
    pub counts: Counts,
}

impl State {
    /// The mode is (re)armed with `seed`: streams and counts start over.
    pub fn arm(&mut self, seed: u64) {
        *self = State {
            seed: Some(seed),
            ..State::default()
        };
    }

    /// The generator for the next event of `stream` of the MEP of `partition`.
    pub fn rng(&mut self, partition: u32, stream: Stream) -> Rng {
        let n = self.next[stream as usize];
        self.next[stream as usize] += 1;
        Rng::new(self.seed.unwrap_or(0), partition, stream, n)
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A SplitMix64 generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, partition: u32, stream: Stream, n: u64) -> Rng {
        let key = splitmix(seed) ^ splitmix(u64::from(partition) << 8 | stream as u64) ^ n;
        Rng(splitmix(key))
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix(self.0)
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability num/den.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// What a field of a reply means, which decides its lies.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A length, size, count or offset.
    Len,
    /// A PDFID.
    Pdfid,
    /// A physical port id.
    Port,
    /// A partition, logical port, function index, version or sub-command.
    Index,
    /// A status or flag byte, an event code.
    Status,
    /// Any other value (a map, a generation, a temperature).
    Value,
}

#[derive(Debug, Clone, Copy)]
struct Field {
    off: usize,
    width: usize,
    kind: Kind,
}

fn get(buf: &[u8], f: &Field) -> u64 {
    let mut b = [0u8; 8];
    b[..f.width].copy_from_slice(&buf[f.off..f.off + f.width]);
    u64::from_le_bytes(b)
}

fn put(buf: &mut [u8], f: &Field, v: u64) {
    buf[f.off..f.off + f.width].copy_from_slice(&v.to_le_bytes()[..f.width]);
}

/// A lie for `v`, a `width`-byte field of `kind`: half the time plausible
/// (in range, near the truth or another valid value), half the time wildly
/// out of range. Never the truth.
fn lie(rng: &mut Rng, kind: Kind, width: usize, v: u64) -> u64 {
    let max = if width >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    };
    let plausible = rng.chance(1, 2);
    let x = match (kind, plausible) {
        (Kind::Len, true) => match rng.below(4) {
            0 => v.wrapping_add(1 + rng.below(4)),
            1 => v.wrapping_sub(1 + rng.below(4)),
            2 => v.wrapping_mul(2),
            _ => rng.below(64),
        },
        (Kind::Len, false) => match rng.below(3) {
            0 => max,
            1 => max / 2 + 1 + rng.below(max / 2),
            _ => v.wrapping_add(0x100 + rng.below(0x10000)),
        },
        (Kind::Pdfid, true) => {
            if rng.chance(1, 2) {
                v ^ (1 + rng.below(0x1f))
            } else {
                0x0100 + 0x20 * rng.below(48) + rng.below(32)
            }
        }
        (Kind::Pdfid, false) => [0, 0xffff, 0x0700 + rng.below(0xf900)][rng.below(3) as usize],
        (Kind::Port, true) => rng.below(48),
        (Kind::Port, false) => 48 + rng.below(max - 47),
        (Kind::Index, true) => rng.below(8),
        (Kind::Index, false) => {
            [max, 8 + rng.below(max.saturating_sub(7).max(1))][rng.below(2) as usize]
        }
        (Kind::Status, true) => [0, 1, 2, 3, 4, 0xff][rng.below(6) as usize],
        (Kind::Status, false) | (Kind::Value, false) => rng.next(),
        (Kind::Value, true) => v ^ (1 << rng.below(8 * width as u64)),
    } & max;
    if x == v {
        v ^ 1
    } else {
        x
    }
}

/// Return codes a lie may use: real ones (plausible) or nonsense.
fn lie_ret(rng: &mut Rng, truth: u32) -> u32 {
    const REAL: [u32; 8] = [
        mrpc::ERR_PARAM_INVALID,
        mrpc::ERR_SUBCMD_INVALID,
        mrpc::ERR_CMD_INVALID,
        mrpc::PCIFAB_ERR_PDFID_UNKNOWN,
        crate::model::PCIFAB_ERR_NOT_BOUND,
        crate::model::PCIFAB_ERR_HOTPLUG_FAILED,
        crate::model::PCIFAB_ERR_NOT_GRANTED,
        1,
    ];
    let r = if rng.chance(1, 2) {
        REAL[rng.below(REAL.len() as u64) as usize]
    } else {
        rng.next() as u32
    };
    if r == truth {
        truth ^ 0x8000_0000
    } else {
        r
    }
}

/// The commands whose replies the driver parses (ECHO stays byte-exact).
pub fn targeted(cmd: u32) -> bool {
    matches!(
        cmd & 0xffff,
        mrpc::MRPC_DIETEMP
            | mrpc::MRPC_TOPO_INFO_DUMP
            | mrpc::MRPC_GFMS_DB_DUMP
            | mrpc::MRPC_GFMS_BIND_UNBIND
            | mrpc::MRPC_GFMS_EVENT
            | mrpc::MRPC_FABRIC_SUMMARY
            | mrpc::MRPC_FUNCTION_TELEMETRY
            | mrpc::MRPC_FUNCTION_LIST
            | mrpc::MRPC_P2P_ROUTE
    )
}

fn u16_at(b: &[u8], at: usize) -> usize {
    b.get(at..at + 2)
        .map_or(0, |x| usize::from(u16::from_le_bytes([x[0], x[1]])))
}

fn u32_at(b: &[u8], at: usize) -> usize {
    b.get(at..at + 4)
        .map_or(0, |x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as usize)
}

/// The meaningful fields of a DONE reply of `cmd` to `input` (mrpc.rst).
fn fields(cmd: u32, input: &[u8], out: &[u8]) -> Vec<Field> {
    use Kind::*;
    let mut v = Vec::new();
    let mut add = |off: usize, width: usize, kind: Kind| {
        if off + width <= out.len() {
            v.push(Field { off, width, kind });
        }
    };
    let sub = input.first().copied().unwrap_or(0);
    match cmd & 0xffff {
        mrpc::MRPC_DIETEMP => add(0, 4, Value),
        mrpc::MRPC_GFMS_BIND_UNBIND => add(0, 1, Status),
        mrpc::MRPC_TOPO_INFO_DUMP => {
            add(0, 1, Status);
            add(2, 2, Len);
            if sub == 3 {
                // Dump bytes from `off` follow the 4-byte header.
                let off = u16_at(input, 2);
                let mut at = |pos: usize, width: usize, kind: Kind| {
                    if pos >= off {
                        add(4 + pos - off, width, kind);
                    }
                };
                at(48, 8, Value); // port_bitmap
                for k in 0..48 {
                    let e = 56 + 32 * k;
                    at(e, 1, Port);
                    at(e + 1, 1, Index); // port_type
                    at(e + 25, 1, Len); // neg width
                    at(e + 28, 1, Status); // ltssm
                }
            }
        }
        mrpc::MRPC_GFMS_DB_DUMP => match sub {
            2 => {
                add(4, 4, Len);
                for (o, w) in [(12, 1), (13, 1), (14, 2), (16, 2)] {
                    add(o, w, Len);
                }
                for o in [48, 56, 64, 72] {
                    add(o, 8, Value);
                }
            }
            1 | 3 | 5 | 6 => {
                // Chunked: START -> {dw_len, num_of_switch}; GET -> {offset_dw,
                // size_dw, rsvd, section bytes from offset_dw * 4}.
                match u32_at(input, 4) {
                    1 => {
                        add(0, 4, Len);
                        add(4, 4, Len);
                    }
                    2 => {
                        add(0, 4, Len);
                        add(4, 4, Len);
                        let off = u32_at(input, 8).saturating_mul(4);
                        let mut at = |pos: usize, width: usize, kind: Kind| {
                            if pos >= off {
                                add(12 + pos - off, width, kind);
                            }
                        };
                        at(4, 4, Len); // resp_size_dw
                        if sub == 3 {
                            at(12, 1, Index);
                            at(13, 1, Port);
                            at(14, 2, Value);
                            at(16, 2, Len);
                            for k in 0..32 {
                                let e = 20 + 4 * k;
                                at(e, 1, Index);
                                at(e + 1, 1, Status);
                                at(e + 2, 2, Pdfid);
                            }
                        } else if sub == 5 {
                            at(13, 1, Port);
                            at(14, 2, Len);
                            at(16, 4, Len);
                            at(20, 2, Len);
                            at(24, 4, Len);
                            for k in 0..32 {
                                let f = 28 + 36 * k;
                                at(f, 2, Index);
                                at(f + 2, 2, Pdfid);
                                at(f + 5, 1, Len);
                                at(f + 8, 1, Status);
                                at(f + 10, 1, Port);
                                at(f + 11, 1, Index);
                            }
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        },
        mrpc::MRPC_GFMS_EVENT => {
            add(0, 2, Len);
            add(2, 2, Len);
            let mut p = 4;
            for _ in 0..u16_at(out, 0) {
                let len = u16_at(out, p);
                if len < 4 || p + len > out.len() {
                    break;
                }
                add(p, 2, Len);
                add(p + 2, 1, Status);
                match out[p + 2] {
                    0..=3 => {
                        add(p + 4, 2, Port);
                        add(p + 6, 2, Len);
                    }
                    6 | 7 | 0x80 => {
                        add(p + 5, 1, Port);
                        add(p + 6, 1, Index);
                        add(p + 8, 2, Pdfid);
                    }
                    _ => {}
                }
                p += len;
            }
        }
        ext @ (mrpc::MRPC_FABRIC_SUMMARY
        | mrpc::MRPC_FUNCTION_TELEMETRY
        | mrpc::MRPC_FUNCTION_LIST
        | mrpc::MRPC_P2P_ROUTE) => {
            add(0, 2, Index); // version
            add(2, 2, Len); // size
            match ext {
                mrpc::MRPC_FABRIC_SUMMARY => {
                    add(4, 4, Value);
                    add(8, 1, Len);
                    add(9, 1, Index);
                    add(10, 1, Len);
                    add(11, 1, Len);
                    add(12, 2, Len);
                    add(14, 2, Len);
                    add(16, 8, Value);
                    add(24, 4, Len);
                }
                mrpc::MRPC_FUNCTION_TELEMETRY => {
                    add(4, 2, Pdfid);
                    add(8, 4, Value);
                    add(12, 4, Value);
                    add(16, 1, Len);
                    add(20, 4, Value);
                }
                mrpc::MRPC_FUNCTION_LIST => {
                    add(4, 4, Value);
                    add(8, 2, Len);
                    add(10, 2, Len);
                    add(12, 2, Len);
                    add(14, 2, Len);
                    for k in 0..mrpc::LIST_MAX_ENTRIES {
                        let e = 16 + 24 * k;
                        add(e, 2, Pdfid);
                        add(e + 2, 2, Pdfid);
                        add(e + 12, 1, Port);
                        add(e + 13, 1, Index);
                        add(e + 14, 1, Len);
                        add(e + 15, 1, Status);
                        add(e + 16, 1, Status);
                        add(e + 17, 1, Index);
                        add(e + 18, 1, Index);
                    }
                }
                _ => {
                    add(4, 2, Len); // count
                    match input.get(4).copied() {
                        Some(mrpc::ROUTE_LIST) => {
                            add(6, 2, Len);
                            for k in 0..31 {
                                let e = 8 + 32 * k;
                                add(e, 8, Value);
                                add(e + 8, 8, Len);
                                add(e + 16, 8, Value);
                                add(e + 24, 2, Pdfid);
                                add(e + 26, 1, Index);
                            }
                        }
                        Some(mrpc::ROUTE_GRANT_LIST) => {
                            add(6, 2, Len);
                            for k in 0..127 {
                                let e = 8 + 8 * k;
                                add(e, 2, Pdfid);
                                add(e + 2, 1, Index);
                                add(e + 3, 1, Index);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        _ => {}
    }
    v
}

/// What the guest sees of an outcome: status, ret and (DONE) the whole buffer.
fn seen(o: &MrpcOutcome) -> (u32, u32, Vec<u8>) {
    let mut out = Vec::new();
    if o.status == MRPC_STATUS_DONE {
        out = o.output.clone();
        out.resize(PAYLOAD, 0);
    }
    (o.status, o.ret, out)
}

/// Corrupt the reply `o` of `cmd` to `input`, if the driver parses it.
/// Returns true when it was corrupted (it then differs from the truth).
pub fn corrupt_reply(rng: &mut Rng, cmd: u32, input: &[u8], o: &mut MrpcOutcome) -> bool {
    if !targeted(cmd) {
        return false;
    }
    let truth = seen(o);
    let mutations = 1 + rng.below(3);
    for _ in 0..mutations {
        let fs = if o.status == MRPC_STATUS_DONE {
            fields(cmd, input, &o.output)
        } else {
            Vec::new()
        };
        if !fs.is_empty() && rng.chance(7, 10) {
            let f = fs[rng.below(fs.len() as u64) as usize];
            let v = get(&o.output, &f);
            let x = lie(rng, f.kind, f.width, v);
            put(&mut o.output, &f, x);
            continue;
        }
        match rng.below(4) {
            // A return value that does not go with the status.
            0 => o.ret = lie_ret(rng, o.ret),
            // The status flips: DONE becomes ERROR, ERROR becomes DONE
            // with whatever is in the buffer.
            1 => {
                if o.status == MRPC_STATUS_DONE {
                    o.status = MRPC_STATUS_ERROR;
                    o.ret = lie_ret(rng, 0);
                } else {
                    o.status = MRPC_STATUS_DONE;
                    if rng.chance(1, 2) {
                        o.ret = 0;
                    }
                    let n = rng.below(PAYLOAD as u64 + 1) as usize;
                    o.output = (0..n).map(|_| rng.next() as u8).collect();
                }
            }
            // Garbage after the reply, where a lying length points.
            2 => {
                let from = o.output.len();
                let to = from + rng.below((PAYLOAD - from.min(PAYLOAD)) as u64 + 1) as usize;
                o.output.extend((from..to).map(|_| rng.next() as u8));
            }
            // The reply cut short.
            _ => {
                let n = rng.below(o.output.len() as u64 + 1) as usize;
                o.output.truncate(n);
            }
        }
    }
    o.output.truncate(PAYLOAD);
    if seen(o) == truth {
        if o.status == MRPC_STATUS_DONE {
            if o.output.is_empty() {
                o.output.push(0);
            }
            o.output[0] ^= 1;
        } else {
            o.ret ^= 1;
        }
    }
    true
}

/// Which BAR0 dwords a hostile MEP lies about when read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    MrpcStatus,
    /// An event header: OCCURRED, count and the read-only bits.
    EventHdr,
    /// An event summary or bitmap, GFMS_EVENT_DATA, the P2P EVENT_STATUS.
    Summary,
}

/// The target at dword `dw` of a GAS of `partitions` partitions, if any.
pub fn target(dw: u64, partitions: u32) -> Option<Target> {
    let hdr = |rel: u64, first: u64, count: u64| {
        rel >= first
            && rel < first + count * EVENT_HDR_STRIDE
            && (rel - first) % EVENT_HDR_STRIDE == 0
    };
    let parts = u64::from(partitions);
    if dw == MRPC_STATUS {
        Some(Target::MrpcStatus)
    } else if (SW_EVENT..SYS_INFO).contains(&dw) {
        let rel = dw - SW_EVENT;
        if hdr(rel, SW_EVENT_HDR_FIRST, SW_EVENT_HDR_COUNT) {
            Some(Target::EventHdr)
        } else if [
            SW_PART_EVENT_BITMAP,
            SW_PART_EVENT_BITMAP + 4,
            SW_GLOBAL_SUMMARY,
            SW_GFMS_EVENT_DATA,
        ]
        .contains(&rel)
        {
            Some(Target::Summary)
        } else {
            None
        }
    } else if dw == P2P + P2P_EVENT_STATUS {
        Some(Target::Summary)
    } else if dw >= PART_CFG && dw < PART_CFG + parts * PART_CFG_SIZE {
        let rel = (dw - PART_CFG) % PART_CFG_SIZE;
        if PC_EVENT_HDRS.contains(&rel) {
            Some(Target::EventHdr)
        } else if rel == PC_PART_EVENT_SUMMARY || rel == PC_PORT_EVENT_BITMAP {
            Some(Target::Summary)
        } else {
            None
        }
    } else if dw >= PFF_CSR && dw < PFF_CSR + parts * u64::from(PFFS_PER_PARTITION) * PFF_CSR_SIZE {
        let rel = (dw - PFF_CSR) % PFF_CSR_SIZE;
        if hdr(rel, PFF_EVENT_HDR_FIRST, PFF_EVENT_HDR_COUNT) {
            Some(Target::EventHdr)
        } else if rel == PFF_EVENT_SUMMARY {
            Some(Target::Summary)
        } else {
            None
        }
    } else {
        None
    }
}

/// Lie about the targeted dwords of a BAR0 read of `buf.len()` bytes at
/// `off`, each with probability 1/2. True when something changed.
pub fn corrupt_read(rng: &mut Rng, partitions: u32, off: u64, buf: &mut [u8]) -> bool {
    let end = off + buf.len() as u64;
    let mut changed = false;
    let mut dw = off & !3;
    while dw < end {
        let inside = |i: u64| dw + i >= off && dw + i < end;
        if let Some(t) = target(dw, partitions) {
            if rng.chance(1, 2) {
                let mut b = [0u8; 4];
                for i in (0..4u64).filter(|&i| inside(i)) {
                    b[i as usize] = buf[(dw + i - off) as usize];
                }
                let cur = u32::from_le_bytes(b);
                let new = match t {
                    Target::MrpcStatus if rng.chance(1, 2) => {
                        // Another status the driver knows.
                        let lies: Vec<u32> = [
                            0,
                            MRPC_STATUS_INPROGRESS,
                            MRPC_STATUS_DONE,
                            MRPC_STATUS_ERROR,
                        ]
                        .into_iter()
                        .filter(|&l| l != cur)
                        .collect();
                        lies[rng.below(lies.len() as u64) as usize]
                    }
                    Target::MrpcStatus => rng.next() as u32 | 0x100,
                    Target::EventHdr => {
                        cur ^ ((rng.next() as u32
                            & (EVENT_OCCURRED | EVENT_COUNT_MASK | 0xffff_e000))
                            | EVENT_OCCURRED)
                    }
                    Target::Summary => cur ^ (rng.next() as u32 | 1 << rng.below(32)),
                };
                let nb = new.to_le_bytes();
                for i in (0..4u64).filter(|&i| inside(i)) {
                    let at = (dw + i - off) as usize;
                    changed |= buf[at] != nb[i as usize];
                    buf[at] = nb[i as usize];
                }
            }
        }
        dw += 4;
    }
    changed
}

/// Lie about a DMA descriptor's write-back: (done, status) as the engine
/// found them, for a descriptor of `len` bytes. A lying `done` is always
/// larger than `len`; a lying status is another valid one or random. One or
/// both lie.
pub fn corrupt_writeback(rng: &mut Rng, len: u64, done: u64, status: u32) -> (u64, u32) {
    let which = rng.below(3);
    let mut d = done;
    let mut s = status;
    if which != 1 {
        d = match rng.below(4) {
            0 => len.wrapping_add(1 + rng.below(4096)),
            1 => len.wrapping_mul(2).max(len.wrapping_add(1)),
            2 => u64::MAX,
            // Descriptors are at most 256 MiB: this is always larger.
            _ => rng.next() | 1 << 63,
        };
        if d == done {
            d = done ^ (1 << 63);
        }
    }
    if which != 0 {
        s = if rng.chance(1, 2) {
            1 + rng.below(4) as u32
        } else {
            rng.next() as u32
        };
        if s == status {
            s = status ^ 0x8000_0000;
        }
    }
    (d, s)
}

/// One deterministic lie (control request `fault <host> lie <kind>`): told once, in the
/// next reply (or DMA write-back) it fits, then the firmware is truthful again. Unlike the
/// seeded mode each is a lie the driver must name, so a test can count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lie {
    /// A bind finishes DONE with an unknown status byte in its reply.
    BindStatus,
    /// A GFMS_EVENT reply carries an extra entry with an unknown event code.
    EventCode,
    /// A GFMS_EVENT reply counts more events than were asked for.
    EventCount,
    /// A GFMS_EVENT reply carries an UNBIND_REQUEST for a function not bound to the host.
    UnbindRequest,
    /// A DMA descriptor's write-back claims more bytes done than it was given.
    DmaDone,
    /// A bind answered DONE bound another free function to the port in place of the first
    /// one asked for (see [`bind_other_input`]).
    BindOther,
}

/// The unknown event code an [`Lie::EventCode`] entry carries.
pub const LIE_EVENT_CODE: u8 = 0x42;
/// The status byte a [`Lie::BindStatus`] reply carries.
pub const LIE_BIND_STATUS: u8 = 0x5a;
/// The PDFID (no such function) and logical port of a [`Lie::UnbindRequest`].
pub const LIE_UNBIND_PDFID: u16 = 0x0fff;
pub const LIE_UNBIND_PORT: u8 = 3;

impl Lie {
    pub const ALL: [Lie; 6] = [
        Lie::BindStatus,
        Lie::EventCode,
        Lie::EventCount,
        Lie::UnbindRequest,
        Lie::DmaDone,
        Lie::BindOther,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Lie::BindStatus => "bind-status",
            Lie::EventCode => "event-code",
            Lie::EventCount => "event-count",
            Lie::UnbindRequest => "unbind-request",
            Lie::DmaDone => "dma-done",
            Lie::BindOther => "bind-other",
        }
    }

    pub fn parse(s: &str) -> Option<Lie> {
        Lie::ALL.into_iter().find(|l| l.name() == s)
    }

    /// Whether the reply to MRPC `cmd` with `input` is where this lie is told.
    pub fn fits(self, cmd: u32, input: &[u8]) -> bool {
        match self {
            Lie::BindStatus => {
                cmd == mrpc::MRPC_GFMS_BIND_UNBIND && input.first() == Some(&mrpc::GFMS_BIND)
            }
            Lie::EventCode | Lie::EventCount | Lie::UnbindRequest => {
                cmd == mrpc::MRPC_GFMS_EVENT && input.first() == Some(&1)
            }
            // Told by changing the request before it runs ([`bind_other_input`]).
            Lie::DmaDone | Lie::BindOther => false,
        }
    }
}

/// The request a [`Lie::BindOther`] carries out in place of the GFMS bind request `input`:
/// the same request with its first PDFID replaced by another function's, one the model could
/// bind there (unbound, no operation in flight, not a VF, none of its VFs bound or busy, not
/// asked for, not an nvme function), of the first function's endpoint if it has one, else
/// of its kind (class), else any. `None` when `input` is no bind request or no function fits.
pub fn bind_other_input(model: &crate::model::Model, cmd: u32, input: &[u8]) -> Option<Vec<u8>> {
    if cmd != mrpc::MRPC_GFMS_BIND_UNBIND || input.first() != Some(&mrpc::GFMS_BIND) {
        return None;
    }
    let mut asked = Vec::new();
    for i in 0..8 {
        let at = 4 + 4 * i;
        let e = input.get(at..at + 4)?;
        asked.push(u16::from_le_bytes([e[0], e[1]]));
        if e[2] == 0 {
            break;
        }
    }
    let first = model.function(asked[0])?;
    let free = |g: &&crate::model::Function| {
        g.binding.is_none()
            && g.op.is_none()
            && g.vf_index == 0
            && !g.nvme
            && !asked.contains(&g.pdfid)
            && !model.functions.iter().any(|v| {
                v.pf_pdfid == g.pdfid && v.vf_index != 0 && (v.binding.is_some() || v.op.is_some())
            })
    };
    let pick = model
        .functions
        .iter()
        .filter(free)
        .find(|g| g.endpoint == first.endpoint)
        .or_else(|| {
            model
                .functions
                .iter()
                .filter(free)
                .find(|g| g.class == first.class)
        })
        .or_else(|| model.functions.iter().find(free))?;
    let mut out = input.to_vec();
    out[4..6].copy_from_slice(&pick.pdfid.to_le_bytes());
    Some(out)
}

/// Tells `lie` in the reply `o` to a command with `input`; `usp` is the host's upstream
/// port. Returns whether it was told (a reply that failed, or has no room, stays true).
pub fn tell(lie: Lie, input: &[u8], o: &mut MrpcOutcome, usp: u8) -> bool {
    if o.status != MRPC_STATUS_DONE {
        return false;
    }
    let entry = |code: u8, data: &[u8]| {
        let mut e = Vec::with_capacity(4 + data.len());
        e.extend_from_slice(&((4 + data.len()) as u16).to_le_bytes());
        e.push(code);
        e.push(0);
        e.extend_from_slice(data);
        e
    };
    let add = |o: &mut MrpcOutcome, e: Vec<u8>| {
        if o.output.len() < 4 || o.output.len() + e.len() > PAYLOAD {
            return false;
        }
        let num = u16::from_le_bytes([o.output[0], o.output[1]]);
        let req = input
            .get(2..4)
            .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
        if num >= req {
            return false;
        }
        o.output[..2].copy_from_slice(&(num + 1).to_le_bytes());
        o.output.extend_from_slice(&e);
        true
    };
    match lie {
        Lie::BindStatus => match o.output.first_mut() {
            Some(b) => {
                *b = LIE_BIND_STATUS;
                true
            }
            None => {
                o.output = vec![LIE_BIND_STATUS, 0, 0, 0];
                true
            }
        },
        Lie::EventCode => add(o, entry(LIE_EVENT_CODE, &[0; 4])),
        Lie::UnbindRequest => {
            let [lo, hi] = LIE_UNBIND_PDFID.to_le_bytes();
            add(
                o,
                entry(
                    crate::model::GFMS_UNBIND_REQUEST,
                    &[0, usp, LIE_UNBIND_PORT, 0, lo, hi],
                ),
            )
        }
        Lie::EventCount => {
            if o.output.len() < 4 {
                return false;
            }
            let req = input
                .get(2..4)
                .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
            o.output[..2].copy_from_slice(&req.saturating_add(7).to_le_bytes());
            true
        }
        Lie::DmaDone | Lie::BindOther => false,
    }
}

/// The write-back of a [`Lie::DmaDone`]: the descriptor succeeded with more bytes done than
/// its length.
pub fn overdone(len: u64) -> (u64, u32) {
    (len.saturating_add(4096), crate::p2p::ST_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_other_binds_a_free_function_in_place_of_the_first() {
        let mut m = crate::model::Model::new(
            &crate::config::Config::parse(include_str!("../fabric.toml")).expect("fabric.toml"),
        );
        // The example fabric binds a VF of each GPU: free them, so their PFs can stand in.
        for f in &mut m.functions {
            f.binding = None;
        }
        let mut bind = vec![mrpc::GFMS_BIND, 0, 0, 1];
        bind.extend_from_slice(&0x0300u16.to_le_bytes());
        bind.extend_from_slice(&[0, 0]);
        bind.resize(36, 0);
        let other = bind_other_input(&m, mrpc::MRPC_GFMS_BIND_UNBIND, &bind).expect("a function");
        let pdfid = u16::from_le_bytes([other[4], other[5]]);
        assert_ne!(pdfid, 0x0300);
        assert_eq!(other[..4], bind[..4]);
        assert_eq!(other[6..], bind[6..]);
        let f = m.function(pdfid).expect("a configured function");
        assert!(f.binding.is_none() && f.vf_index == 0 && !f.nvme);
        // Not a bind, or no function left free: nothing to lie with.
        assert!(bind_other_input(&m, mrpc::MRPC_GFMS_EVENT, &bind).is_none());
        for f in &mut m.functions {
            f.binding = Some((1, 0));
        }
        m.functions
            .iter_mut()
            .find(|f| f.pdfid == 0x0300)
            .unwrap()
            .binding = None;
        assert!(bind_other_input(&m, mrpc::MRPC_GFMS_BIND_UNBIND, &bind).is_none());
    }

    #[test]
    fn lies_are_never_the_truth() {
        let mut rng = Rng::new(1, 0, Stream::Mrpc, 0);
        for kind in [
            Kind::Len,
            Kind::Pdfid,
            Kind::Port,
            Kind::Index,
            Kind::Status,
            Kind::Value,
        ] {
            for width in [1, 2, 4, 8] {
                for v in [0, 1, 0x7f, 0xff] {
                    let x = lie(&mut rng, kind, width, v);
                    assert_ne!(x, v, "{kind:?} width {width}");
                    if width < 8 {
                        assert!(x < 1 << (8 * width), "{kind:?} {x:#x} fits {width} bytes");
                    }
                }
            }
        }
        for _ in 0..100 {
            let (d, s) = corrupt_writeback(&mut rng, 4096, 4096, 1);
            assert!((d, s) != (4096, 1));
        }
    }

    #[test]
    fn streams_are_independent_and_seeded() {
        let draw = |seed, part, stream, n| Rng::new(seed, part, stream, n).next();
        assert_eq!(draw(7, 0, Stream::Mrpc, 3), draw(7, 0, Stream::Mrpc, 3));
        assert_ne!(draw(7, 0, Stream::Mrpc, 3), draw(8, 0, Stream::Mrpc, 3));
        assert_ne!(draw(7, 0, Stream::Mrpc, 3), draw(7, 1, Stream::Mrpc, 3));
        assert_ne!(draw(7, 0, Stream::Mrpc, 3), draw(7, 0, Stream::Dma, 3));
        let mut st = State::default();
        st.arm(7);
        let a = st.rng(0, Stream::Dma).next();
        let _ = st.rng(0, Stream::Mrpc).next();
        let b = st.rng(0, Stream::Dma).next();
        assert_eq!(a, draw(7, 0, Stream::Dma, 0));
        assert_eq!(
            b,
            draw(7, 0, Stream::Dma, 1),
            "another stream does not move this one"
        );
    }

    #[test]
    fn register_targets() {
        assert_eq!(target(MRPC_STATUS, 2), Some(Target::MrpcStatus));
        assert_eq!(target(MRPC_RET_VALUE, 2), None);
        assert_eq!(
            target(SW_EVENT + SW_GFMS_EVENT_HDR, 2),
            Some(Target::EventHdr)
        );
        assert_eq!(
            target(SW_EVENT + SW_GLOBAL_SUMMARY, 2),
            Some(Target::Summary)
        );
        let p1 = PART_CFG + PART_CFG_SIZE;
        assert_eq!(target(p1 + PC_MRPC_COMP_HDR, 2), Some(Target::EventHdr));
        assert_eq!(target(p1 + PC_PART_EVENT_SUMMARY, 2), Some(Target::Summary));
        assert_eq!(
            target(p1 + PC_PART_EVENT_SUMMARY, 1),
            None,
            "no partition 1"
        );
        let pff = PFF_CSR + 11 * PFF_CSR_SIZE;
        assert_eq!(target(pff + PFF_LINK_STATE_HDR, 2), Some(Target::EventHdr));
        assert_eq!(target(pff + PFF_EVENT_SUMMARY, 2), Some(Target::Summary));
        assert_eq!(target(pff + PFF_VENDOR_ID, 2), None);
        assert_eq!(target(P2P + P2P_EVENT_STATUS, 2), Some(Target::Summary));
        assert_eq!(target(SYS_INFO + SI_DEVICE_ID, 2), None);
    }

    #[test]
    fn one_shot_lies() {
        let get = [1u8, 0, 32, 0];
        let events = |num: u16| {
            let mut out = num.to_le_bytes().to_vec();
            out.extend_from_slice(&[0, 0]);
            MrpcOutcome::done(out)
        };
        let mut o = events(0);
        assert!(tell(Lie::EventCode, &get, &mut o, 16));
        assert_eq!(&o.output[..2], &[1, 0]);
        assert_eq!(&o.output[4..8], &[8, 0, LIE_EVENT_CODE, 0]);
        let mut o = events(3);
        assert!(tell(Lie::EventCount, &get, &mut o, 16));
        assert_eq!(u16::from_le_bytes([o.output[0], o.output[1]]), 39);
        let mut o = events(0);
        assert!(tell(Lie::UnbindRequest, &get, &mut o, 16));
        assert_eq!(&o.output[4..14], &[10, 0, 0x80, 0, 0, 16, 3, 0, 0xff, 0x0f]);
        // A full reply has no room for one more entry: not told.
        let mut o = events(32);
        assert!(!tell(Lie::EventCode, &get, &mut o, 16));
        let mut o = MrpcOutcome::done(vec![0; 4]);
        assert!(Lie::BindStatus.fits(mrpc::MRPC_GFMS_BIND_UNBIND, &[1, 0, 0, 0]));
        assert!(!Lie::BindStatus.fits(mrpc::MRPC_GFMS_BIND_UNBIND, &[2, 0, 0, 0]));
        assert!(tell(Lie::BindStatus, &[1], &mut o, 16));
        assert_eq!(o.output[0], LIE_BIND_STATUS);
        let mut o = MrpcOutcome::error(5);
        assert!(!tell(Lie::BindStatus, &[1], &mut o, 16));
        assert_eq!(overdone(4096), (8192, crate::p2p::ST_OK));
        for l in Lie::ALL {
            assert_eq!(Lie::parse(l.name()), Some(l));
        }
    }
}
