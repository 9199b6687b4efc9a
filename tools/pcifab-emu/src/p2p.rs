// SPDX-License-Identifier: GPL-2.0-only
//! The P2P window (the MEP's BAR2) and the MEP's DMA engine
//! (Documentation/mrpc.rst: "The P2P window (BAR2)", "The DMA engine"),
//! plus the memory pattern and hash of the control requests `mem-fill` and
//! `mem-hash`, and the engine's copy alone for `memcpy-bench`. The routes and
//! grants they follow ("0xF004 P2P_ROUTE") are part of the fabric model
//! (`model`); the MEP they belong to is reached through the `MepPort` trait
//! only.
//!
//! Locking: data is never copied under the model lock or a MEP's lock.
//! Every copy (a window access, one DMA chunk) looks its route up under the
//! model lock, drops it and copies while holding the read side of
//! `Shared::gate`; an unbind drops the function's routes, then takes the
//! write side once (`quiesce`) before it scrubs, so no copy that passed
//! its route check can still land in the scrubbed memory.

use crate::dma::{HostSpan, FLAG_READ, FLAG_WRITE};
use crate::function::FnDevice;
use crate::gas::*;
use crate::model::Model;
use crate::regs::MepState;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::Duration;

/// The DMA engine copies this much between two route / mapping look-ups.
pub const CHUNK: u64 = 1 << 20;
/// Longest descriptor.
pub const MAX_DMA_LEN: u64 = 256 << 20;
pub const DESC_SIZE: u64 = 64;

// Descriptor: kinds, control bits, status values.
pub const KIND_HOST: u32 = 0;
pub const KIND_WINDOW: u32 = 1;
pub const DESC_IRQ: u32 = 1 << 8;
pub const ST_OK: u32 = 1;
pub const ST_HOST_FAULT: u32 = 2;
pub const ST_ROUTE_FAULT: u32 = 3;
pub const ST_BAD: u32 = 4;

pub fn status_name(st: u32) -> &'static str {
    match st {
        ST_OK => "OK",
        ST_HOST_FAULT => "HOST_FAULT",
        ST_ROUTE_FAULT => "ROUTE_FAULT",
        ST_BAD => "BAD",
        _ => "?",
    }
}

/// What every MEP's window and DMA engine reach: the fabric model (routes)
/// and the functions' device memory.
pub struct Shared {
    model: Arc<Mutex<Model>>,
    functions: Vec<Arc<FnDevice>>,
    /// Window size in bytes.
    pub window: u64,
    /// Read side: a copy in progress; write side: see `quiesce`.
    gate: RwLock<()>,
}

impl Shared {
    pub fn new(model: Arc<Mutex<Model>>, functions: Vec<Arc<FnDevice>>, window: u64) -> Shared {
        Shared {
            model,
            functions,
            window,
            gate: RwLock::new(()),
        }
    }

    pub fn window_mib(&self) -> u32 {
        (self.window >> 20) as u32
    }

    /// The fabric model, locked.
    pub fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn function(&self, pdfid: u16) -> Option<&Arc<FnDevice>> {
        self.functions.iter().find(|f| f.pdfid == pdfid)
    }

    /// The read side of the copy gate: held while data moves into or out of
    /// a function after its check (a window access, a DMA chunk, an
    /// EP_RESOURCE_ACCESS).
    pub(crate) fn enter(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until every copy that already looked its route up (and every
    /// EP_RESOURCE_ACCESS past its check) is done.
    pub fn quiesce(&self) {
        drop(self.gate.write().unwrap_or_else(|e| e.into_inner()));
    }
}

/// The MEP as its P2P window and DMA engine see it. Implemented by
/// `mep::Mep`; called by `window_read`, `window_write`, `process` and
/// `engine`, which never name the MEP's type.
///
/// Contract: `lock` is the MEP's one device lock, the one its register
/// accesses take. The window and engine hold it only briefly, for register
/// and DMA-mapping work: never while copying data and never while taking
/// the model lock. `raise_p2p` is called with it held (`state` is its
/// guard) and must not take it again; neither may `name`, `partition` and
/// `shared`, which may also be called with it held.
pub trait MepPort: Sync {
    /// The MEP's name, for log lines.
    fn name(&self) -> &str;
    /// The MEP's partition: the host whose routes its window follows.
    fn partition(&self) -> usize;
    /// What the window and engine reach: routes and device memory.
    fn shared(&self) -> &Shared;
    /// Lock the MEP's state: its GAS (the P2P / DMA engine registers), its
    /// client's DMA mappings and the DMA epoch.
    fn lock(&self) -> MutexGuard<'_, MepState>;
    /// Set P2P EVENT_STATUS `bits` in the locked `state` and interrupt the
    /// host when one went from 0 to 1 with DMA_IRQ enabled (unless
    /// interrupts are dropped by a fault); `why` names it in the log.
    fn raise_p2p(&self, state: &mut MepState, bits: u32, why: &str);
    /// How long the engine sleeps before each chunk it copies (the
    /// `dma-delay` fault), in milliseconds; read once per chunk.
    fn dma_delay_ms(&self) -> u64;
    /// What a descriptor of `len` bytes that ended with `status` after
    /// `done` bytes writes back to the guest: (done, status) as they are,
    /// or the hostile mode's lie about them. Called once per descriptor,
    /// without the lock held.
    fn dma_writeback(&self, len: u64, done: u64, status: u32) -> (u64, u32);
    /// Block until the engine is kicked (a TAIL write, ENABLE) and consume
    /// the kick.
    fn wait_dma_kick(&self);
    /// Whether the MEP has left the bus (`fault HOST gone`): a device that is gone
    /// masters no DMA, so the engine stops and writes nothing back.
    fn gone(&self) -> bool;
}

fn window_check(sh: &Shared, off: u64, len: usize) -> Result<(), String> {
    match off.checked_add(len as u64) {
        Some(end) if end <= sh.window => Ok(()),
        _ => Err(format!(
            "BAR2 (P2P window) access of {len} bytes at {off:#x} is outside its {:#x} bytes",
            sh.window
        )),
    }
}

/// A CPU read of the window (region 2 of the MEP).
pub fn window_read<M: MepPort + ?Sized>(mep: &M, off: u64, buf: &mut [u8]) -> Result<(), String> {
    let sh = mep.shared();
    window_check(sh, off, buf.len())?;
    if buf.is_empty() {
        return Ok(());
    }
    {
        let _copy = sh.enter();
        let target = sh
            .model()
            .route_target(mep.partition(), off, buf.len() as u64);
        if let Some((pdfid, toff)) = target {
            if let Some(f) = sh.function(pdfid) {
                match f.dev_read(toff, buf) {
                    Ok(()) => return Ok(()),
                    Err(e) => error!("{}: P2P window read: {e}", mep.name()),
                }
            }
        }
    }
    buf.fill(0xff);
    p2p_fault(mep, off, "read", buf.len());
    Ok(())
}

/// A CPU write to the window (region 2 of the MEP).
pub fn window_write<M: MepPort + ?Sized>(mep: &M, off: u64, data: &[u8]) -> Result<(), String> {
    let sh = mep.shared();
    window_check(sh, off, data.len())?;
    if data.is_empty() {
        return Ok(());
    }
    {
        let _copy = sh.enter();
        let target = sh
            .model()
            .route_target(mep.partition(), off, data.len() as u64);
        if let Some((pdfid, toff)) = target {
            if let Some(f) = sh.function(pdfid) {
                match f.dev_write(toff, data) {
                    Ok(()) => return Ok(()),
                    Err(e) => error!("{}: P2P window write: {e}", mep.name()),
                }
            }
        }
    }
    p2p_fault(mep, off, "write", data.len());
    Ok(())
}

/// Record a refused window access.
fn p2p_fault<M: MepPort + ?Sized>(mep: &M, off: u64, what: &str, len: usize) {
    let mut inner = mep.lock();
    let g = &mut inner.gas;
    let n = g.p2p(P2P_FAULT_COUNT).wrapping_add(1);
    g.set_p2p(P2P_FAULT_COUNT, n);
    g.set_p2p(P2P_FAULT_ADDR_LO, off as u32);
    g.set_p2p(P2P_FAULT_ADDR_HI, (off >> 32) as u32);
    note!(
        "{}: P2P fault {n}: {what} of {len} bytes at window offset {off:#x} is not inside one route",
        mep.name()
    );
    mep.raise_p2p(&mut inner, EV_P2P_FAULT, "P2P fault");
}

/// A DMA descriptor as the host wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Desc {
    pub control: u32,
    pub len: u64,
    pub src: u64,
    pub dst: u64,
}

impl Desc {
    pub fn parse(raw: &[u8; DESC_SIZE as usize]) -> Desc {
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[o..o + 8]);
            u64::from_le_bytes(b)
        };
        Desc {
            control: u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]),
            len: u64_at(8),
            src: u64_at(16),
            dst: u64_at(24),
        }
    }

    fn kinds(&self) -> (u32, u32) {
        (self.control & 3, (self.control >> 2) & 3)
    }
}

fn kind_name(k: u32) -> &'static str {
    if k == KIND_HOST {
        "HOST"
    } else {
        "WINDOW"
    }
}

/// A resolved source or destination range.
enum Span {
    /// Guest memory: one piece per DMA mapping the range crosses.
    Host(Vec<HostSpan>),
    /// Device memory of a function (which lives as long as the fabric).
    Dev(*mut u8, usize),
}

impl Span {
    /// The pieces of the range: our address and length of each, in order.
    fn pieces(&self) -> Vec<(*mut u8, usize)> {
        match self {
            Span::Host(v) => v.iter().map(|h| (h.ptr(), h.len())).collect(),
            Span::Dev(p, n) => vec![(*p, *n)],
        }
    }
}

/// Copies between two resolved ranges of equal length, piece by piece.
///
/// # Safety
///
/// Every piece of both spans must be valid for its length (a `HostSpan` keeps its mapping
/// alive; device memory lives as long as the fabric).
unsafe fn copy_spans(src: &Span, dst: &Span) {
    let (s, d) = (src.pieces(), dst.pieces());
    let (mut i, mut j, mut si, mut dj) = (0, 0, 0usize, 0usize);
    while i < s.len() && j < d.len() {
        let n = (s[i].1 - si).min(d[j].1 - dj);
        // SAFETY: within piece i of the source and piece j of the destination, by the
        // caller's guarantee; ptr::copy allows overlap.
        unsafe { std::ptr::copy(s[i].0.add(si), d[j].0.add(dj), n) };
        si += n;
        dj += n;
        if si == s[i].1 {
            (i, si) = (i + 1, 0);
        }
        if dj == d[j].1 {
            (j, dj) = (j + 1, 0);
        }
    }
}

/// Look `len` bytes at `addr` of kind `kind` up, for access `need`. Errors
/// are descriptor status values.
fn resolve<M: MepPort + ?Sized>(
    mep: &M,
    kind: u32,
    addr: u64,
    len: u64,
    need: u32,
) -> Result<Span, u32> {
    let n = usize::try_from(len).map_err(|_| ST_BAD)?;
    if kind == KIND_HOST {
        let span = mep.lock().dma.resolve(addr, n, need);
        return span.map(Span::Host).map_err(|_| ST_HOST_FAULT);
    }
    let sh = mep.shared();
    let (pdfid, toff) = sh
        .model()
        .route_target(mep.partition(), addr, len)
        .ok_or(ST_ROUTE_FAULT)?;
    let f = sh.function(pdfid).ok_or(ST_ROUTE_FAULT)?;
    f.dev_ptr(toff, n)
        .map(|p| Span::Dev(p, n))
        .map_err(|_| ST_ROUTE_FAULT)
}

/// Carry one descriptor out: (status, bytes copied).
fn run<M: MepPort + ?Sized>(mep: &M, d: &Desc) -> (u32, u64) {
    let (sk, dk) = d.kinds();
    if sk > KIND_WINDOW || dk > KIND_WINDOW || d.len == 0 || d.len > MAX_DMA_LEN {
        return (ST_BAD, 0);
    }
    // The whole ranges first: a descriptor that fails writes nothing.
    for (kind, addr, need) in [(sk, d.src, FLAG_READ), (dk, d.dst, FLAG_WRITE)] {
        if let Err(st) = resolve(mep, kind, addr, d.len, need) {
            return (st, 0);
        }
    }
    let mut done = 0;
    while done < d.len {
        if mep.gone() {
            return (ST_OK, done);
        }
        let n = (d.len - done).min(CHUNK);
        let delay = mep.dma_delay_ms();
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        let _copy = mep.shared().enter();
        let src = match resolve(mep, sk, d.src.saturating_add(done), n, FLAG_READ) {
            Ok(s) => s,
            Err(st) => return (st, done),
        };
        let dst = match resolve(mep, dk, d.dst.saturating_add(done), n, FLAG_WRITE) {
            Ok(s) => s,
            Err(st) => return (st, done),
        };
        // SAFETY: both spans were just resolved for n bytes inside live
        // mappings (a HostSpan keeps its mapping alive, device memory lives
        // as long as the fabric).
        unsafe { copy_spans(&src, &dst) };
        done += n;
    }
    (ST_OK, done)
}

/// Stop the engine until RESET: HALTED and DMA_ERROR.
fn halt<M: MepPort + ?Sized>(mep: &M, inner: &mut MepState, why: &str) {
    let st = inner.gas.p2p(DMA_STATUS);
    inner.gas.set_p2p(DMA_STATUS, st | DMA_STATUS_HALTED);
    note!("{}: DMA engine halted: {why}", mep.name());
    mep.raise_p2p(inner, EV_DMA_ERROR, "DMA error");
}

/// The next descriptor to carry out: (DMA epoch, its IOVA, its index).
fn next<M: MepPort + ?Sized>(mep: &M) -> Option<(u64, u64, u32)> {
    let mut inner = mep.lock();
    let g = &inner.gas;
    if g.p2p(DMA_CTRL) & DMA_CTRL_ENABLE == 0 || g.p2p(DMA_STATUS) & DMA_STATUS_HALTED != 0 {
        return None;
    }
    let ring = u64::from(g.p2p(DMA_RING_LO)) | u64::from(g.p2p(DMA_RING_HI)) << 32;
    let Some(size) = g.dma_ring_size() else {
        let why = format!(
            "DMA_RING_SIZE {} is not a power of two from 2 to 4096",
            g.p2p(DMA_RING_SIZE)
        );
        halt(mep, &mut inner, &why);
        return None;
    };
    if ring % DESC_SIZE != 0 {
        halt(
            mep,
            &mut inner,
            &format!("ring IOVA {ring:#x} is not 64-byte aligned"),
        );
        return None;
    }
    inner.gas.update_dma_busy();
    let head = inner.gas.p2p(DMA_HEAD) % size;
    let tail = inner.gas.p2p(DMA_TAIL) % size;
    if head == tail {
        return None;
    }
    match ring.checked_add(u64::from(head) * DESC_SIZE) {
        Some(addr) => {
            inner.gas.dma_in_flight = true;
            Some((inner.dma_epoch, addr, head))
        }
        None => {
            halt(
                mep,
                &mut inner,
                &format!("descriptor {head} of ring {ring:#x} wraps"),
            );
            None
        }
    }
}

/// The descriptor in flight is finished (whatever became of it).
fn landed(inner: &mut MepState) {
    inner.gas.dma_in_flight = false;
    inner.gas.update_dma_busy();
}

/// Carry out descriptors from HEAD to TAIL until none is pending, the
/// engine is disabled or halted.
pub fn process<M: MepPort + ?Sized>(mep: &M) {
    while let Some((epoch, addr, index)) = next(mep) {
        let mut raw = [0u8; DESC_SIZE as usize];
        let fetched = mep.lock().dma.read(addr, &mut raw);
        if let Err(e) = fetched {
            let mut inner = mep.lock();
            landed(&mut inner);
            if inner.dma_epoch == epoch {
                halt(
                    mep,
                    &mut inner,
                    &format!("descriptor {index} at {addr:#x} could not be fetched: {e}"),
                );
            }
            continue;
        }
        let d = Desc::parse(&raw);
        let t = std::time::Instant::now();
        let (status, done) = run(mep, &d);
        let us = t.elapsed().as_micros();
        if mep.gone() {
            // Off the bus: no write-back, no interrupt, registers left as they were, and no
            // more descriptors until the next kick (a reset once the MEP is back).
            landed(&mut mep.lock());
            note!(
                "{}: DMA descriptor {index}: the MEP is gone: stopped after {done} of {} bytes, nothing written back",
                mep.name(),
                d.len
            );
            return;
        }
        // A hostile firmware lies in the write-back only (see `MepPort`);
        // the engine's own registers below stay true.
        let (wb_done, wb_status) = mep.dma_writeback(d.len, done, status);
        let mut inner = mep.lock();
        let written = inner
            .dma
            .write(addr + 32, &wb_done.to_le_bytes())
            .and_then(|()| {
                std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
                inner.dma.write(addr + 4, &wb_status.to_le_bytes())
            });
        landed(&mut inner);
        let (sk, dk) = d.kinds();
        info_or_note!(
            status != ST_OK,
            "{}: DMA descriptor {index}: {} {:#x} -> {} {:#x}, {} bytes: {} ({done} copied in {us} us)",
            mep.name(),
            kind_name(sk),
            d.src,
            kind_name(dk),
            d.dst,
            d.len,
            status_name(status)
        );
        if inner.dma_epoch != epoch {
            info!(
                "{}: DMA engine was reset during descriptor {index}; registers left alone",
                mep.name()
            );
            continue;
        }
        if let Err(e) = written {
            halt(
                mep,
                &mut inner,
                &format!("status of descriptor {index} at {addr:#x} could not be written: {e}"),
            );
            continue;
        }
        let g = &mut inner.gas;
        let size = g.dma_ring_size().unwrap_or(1);
        g.set_p2p(DMA_HEAD, (index + 1) % size);
        let n = g.p2p(DMA_COMPLETED).wrapping_add(1);
        g.set_p2p(DMA_COMPLETED, n);
        g.update_dma_busy();
        if d.control & DESC_IRQ != 0 {
            mep.raise_p2p(&mut inner, EV_DMA_DONE, "DMA done");
        }
    }
}

/// The DMA engine thread of one MEP: wait for a kick, work, repeat.
pub fn engine<M: MepPort + ?Sized>(mep: &M) {
    loop {
        mep.wait_dma_kick();
        process(mep);
    }
}

/// The `mem-fill` pattern: a xorshift64 stream seeded with `seed | 1`,
/// each state emitted as 8 little-endian bytes.
pub struct Pattern {
    state: u64,
    /// Bytes of the current word not yet emitted.
    word: [u8; 8],
    used: usize,
}

impl Pattern {
    pub fn new(seed: u64) -> Pattern {
        Pattern {
            state: seed | 1,
            word: [0; 8],
            used: 8,
        }
    }

    /// The next `buf.len()` bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            if self.used == 8 {
                let mut x = self.state;
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                self.state = x;
                self.word = x.to_le_bytes();
                self.used = 0;
            }
            *b = self.word[self.used];
            self.used += 1;
        }
    }
}

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub const FNV_PRIME: u64 = 0x100_0000_01b3;

/// FNV-1a 64: continue hash `h` over `data` (start with FNV_OFFSET).
pub fn fnv1a(mut h: u64, data: &[u8]) -> u64 {
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

fn check_dev_range(f: &FnDevice, off: u64, len: u64) -> Result<(), String> {
    match off.checked_add(len) {
        Some(end) if end <= f.dev_mem_size() => Ok(()),
        _ => Err(format!(
            "range {off:#x}+{len:#x} is outside the {:#x} bytes of device memory of {}",
            f.dev_mem_size(),
            f.name
        )),
    }
}

/// Fill `len` bytes of device memory at `off` with the pattern of `seed`.
pub fn mem_fill(f: &FnDevice, off: u64, len: u64, seed: u64) -> Result<(), String> {
    check_dev_range(f, off, len)?;
    let mut p = Pattern::new(seed);
    let mut buf = vec![0u8; CHUNK.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CHUNK) as usize;
        p.fill(&mut buf[..n]);
        f.dev_write(off + done, &buf[..n])?;
        done += n as u64;
    }
    Ok(())
}

/// Most repetitions of one `memcpy-bench` request.
pub const MEMCPY_MAX_REPS: u32 = 100;

/// The fair floor of the DMA engine's function-to-function copy (control request
/// `memcpy-bench`): `len` bytes from offset 0 of `src`'s device memory to offset 0 of `dst`'s,
/// copied in this process by the engine's own routine ([`copy_spans`]), in its chunks
/// ([`CHUNK`]) and each chunk under the copy gate as the engine copies it; no descriptor, no
/// route look-up, no guest. Returns the fastest of `reps` copies in seconds. Overwrites
/// `dst`'s first `len` bytes, as a fabric copy of the same range would.
pub fn memcpy_bench(sh: &Shared, src: u16, dst: u16, len: u64, reps: u32) -> Result<f64, String> {
    let f = |pdfid: u16| {
        sh.function(pdfid)
            .ok_or_else(|| format!("no function with pdfid {pdfid:#06x}"))
    };
    let (s, d) = (f(src)?, f(dst)?);
    if len == 0 {
        return Err("bytes must be at least 1".into());
    }
    if len > MAX_DMA_LEN {
        return Err(format!(
            "bytes {len:#x} exceed the longest DMA descriptor ({MAX_DMA_LEN:#x})"
        ));
    }
    check_dev_range(s, 0, len)?;
    check_dev_range(d, 0, len)?;
    if reps == 0 || reps > MEMCPY_MAX_REPS {
        return Err(format!("reps {reps} is not from 1 to {MEMCPY_MAX_REPS}"));
    }
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = std::time::Instant::now();
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK) as usize;
            let _copy = sh.enter();
            let from = Span::Dev(s.dev_ptr(done, n)?, n);
            let to = Span::Dev(d.dev_ptr(done, n)?, n);
            // SAFETY: both pieces lie inside device memory (checked by dev_ptr), which
            // lives as long as the fabric.
            unsafe { copy_spans(&from, &to) };
            done += n as u64;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// FNV-1a 64 of `len` bytes of device memory at `off`.
pub fn mem_hash(f: &FnDevice, off: u64, len: u64) -> Result<u64, String> {
    check_dev_range(f, off, len)?;
    let mut buf = vec![0u8; CHUNK.min(len) as usize];
    let (mut h, mut done) = (FNV_OFFSET, 0);
    while done < len {
        let n = (len - done).min(CHUNK) as usize;
        f.dev_read(off + done, &mut buf[..n])?;
        h = fnv1a(h, &buf[..n]);
        done += n as u64;
    }
    Ok(h)
}
