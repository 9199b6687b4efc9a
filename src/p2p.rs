// SPDX-License-Identifier: GPL-2.0-only

//! Peer-to-peer through the fabric: routes, the MEP's DMA engine, distances.
//!
//! A **route** (MRPC `P2P_ROUTE`, 0xF004) maps part of the MEP's P2P window onto the device
//! memory of one function anywhere in the fabric. Routes are this host's permission to reach
//! a function: the DMA engine's function addresses are window offsets, so a copy reaches only
//! what a route covers. The firmware removes every route to a function that is unbound.
//!
//! The **DMA engine** reads 64-byte descriptors from a ring in coherent DMA memory that this
//! driver owns. Host memory is named by bus address: user buffers are pinned (before any lock
//! of the driver is taken, since faulting them in may take as long as the caller's memory
//! makes it take) and mapped with the DMA API for the length of one batch, so with an IOMMU
//! the engine reaches only those pages, and they are unmapped and unpinned on every exit path
//! (the guards' `Drop`). The engine runs one copy's part at a time (the [`TurnLock`]'s turn,
//! taken for each part: a copier waits for it interruptibly and no longer than its own
//! timeout); each batch is submitted with one doorbell, then waited for by watching the
//! engine's status write-back in the ring (polled, no completion interrupt:
//! [`POLL_SPIN_US`]), with the engine's lock taken only for each look; a timeout, a signal or
//! unbind resets the engine and waits until it is idle before the batch's pages are released.
//! A MEP whose registers read all ones has left the bus (a surprise removal): the copy ends
//! with `ENODEV` at once and releases its pages, since a device that is gone reaches no
//! memory.

use kernel::{
    device::{Bound, Device},
    dma::{Coherent, DataDirection},
    io::{io_read, io_write, poll::read_poll_timeout, Io},
    new_mutex,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        barrier::{dma_mb, Read},
        Arc, Mutex,
    },
    time::{Delta, Instant, Monotonic},
};

use crate::{
    fw::{self, ext, Failure},
    hotplug,
    kext::{binding::Binding, pci_enable, sleep::usleep_range, user_pages::UserPages},
    regs,
    turn::TurnLock,
    uapi, Mep,
};

const PAGE: u64 = 4096;

/// Descriptors in the ring.
const RING_ENTRIES: usize = 256;
/// Descriptors submitted per batch (one slot stays empty to tell full from empty).
const BATCH: usize = RING_ENTRIES - 1;
/// Largest length of one descriptor between two function ranges.
const DESC_MAX: u64 = 16 << 20;
/// User memory pinned and mapped per batch.
const USER_CHUNK: usize = 4 << 20;
/// Default bound on a whole copy.
const DEFAULT_COPY_TIMEOUT_MS: u32 = 60_000;
/// The waiter of a batch watches the last descriptor's status write-back in host memory; the
/// descriptors ask for no completion interrupt (its handler reads every event header, a
/// dozen device round trips). It spins this long first, which covers a small copy (about 30
/// us for 4 KiB under TCG); longer, the spinning CPU slows the engine's copy down.
const POLL_SPIN_US: i64 = 100;
/// Then it sleeps an eighth of the time waited so far between looks, within these bounds: a
/// completion is seen within an eighth of the copy's time, and a long copy wakes the waiter
/// a number of times that grows with the logarithm of its length.
const POLL_NAP_MIN_US: i64 = 50;
const POLL_NAP_MAX_US: i64 = 4_000;
/// How often HEAD and STATUS are read while no status is written back (an engine that
/// halted before its write-back).
const POLL_REGS_MS: i64 = 20;
/// How long a reset waits for the engine's current descriptor.
const RESET_WAIT_MS: i64 = 5_000;

/// Descriptor control bits: source and destination kinds (bit 8, a completion interrupt, is
/// never set: see [`POLL_SPIN_US`]).
const KIND_HOST: u32 = 0;
const KIND_WINDOW: u32 = 1;
/// Descriptor status values the engine writes.
pub(crate) const DMA_OK: u32 = 1;
const DMA_HOST_FAULT: u32 = 2;
const DMA_ROUTE_FAULT: u32 = 3;

crate::payload::payload! {
    /// One DMA descriptor, as the engine reads it.
    struct Desc[64] {
        control: u32,
        status: u32,
        len: u64,
        src: u64,
        dst: u64,
        done: u64,
        cookie: u64,
        rsvd: [u64; 2],
    }
}

/// The engine side of one endpoint; only touched with [`P2p::engine`] held.
struct Engine {
    ring: Option<Coherent<[Desc]>>,
    /// The device's binding, which the DMA mapping of user pages needs; set with the ring.
    binding: Option<Arc<Binding>>,
    /// Next descriptor slot to fill (the engine's TAIL).
    tail: u32,
    /// Unbind started: no more copies.
    dead: bool,
    /// A reset did not bring the engine to rest: it may still write to host memory it was
    /// given, so nothing it was given (ring, user pages) is ever released, and no copy runs.
    stuck: bool,
    /// The device read all ones at the last reset (it was gone), so the reset may not have
    /// reached it: the next part resets the engine again before it uses it.
    reset_due: bool,
    /// The MSI-X vector the engine signals (set with the ring).
    vector: u16,
}

/// P2P state of one endpoint.
#[pin_data]
pub(crate) struct P2p {
    /// The right to run one part of a copy on the engine, held from before the engine is
    /// locked until the engine is done with the part's pages: the engine runs one part's
    /// batches at a time. Unbind closes it ([`shut_down`]), so a running copy stops at its
    /// next look at the engine, and takes the turn to wait for it.
    #[pin]
    turn: TurnLock,
    /// Held briefly: to check the engine's state, fill the ring and ring the doorbell, for
    /// each look at the ring while a batch runs, and for a reset.
    #[pin]
    engine: Mutex<Engine>,
    /// Serialises route changes (the free-window search and the add).
    #[pin]
    routes: Mutex<()>,
    /// The routes as last read from the firmware, for copies: reading them is a firmware
    /// command of several hundred bytes, which would dominate a small copy. Only a hint: the
    /// engine checks every range against the firmware's own routes.
    #[pin]
    cache: Mutex<Option<KVec<uapi::Route>>>,
    /// The cache may be out of date: set by route changes and by the firmware's
    /// ROUTES_CHANGED event (from the interrupt handler, which cannot take `cache`).
    stale: Atomic<bool>,
    /// Window size in bytes; 0 when the firmware has no P2P window.
    window: Atomic<u64>,
    faults: Atomic<u64>,
    copies: Atomic<u64>,
    bytes: Atomic<u64>,
}

/// Counters for sysfs.
pub(crate) struct Counters {
    pub(crate) faults: u64,
    pub(crate) copies: u64,
    pub(crate) bytes: u64,
}

impl P2p {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            turn <- TurnLock::new(),
            engine <- new_mutex!(Engine {
                ring: None,
                binding: None,
                tail: 0,
                dead: false,
                stuck: false,
                reset_due: false,
                vector: 0,
            }),
            routes <- new_mutex!(()),
            cache <- new_mutex!(None),
            stale: Atomic::new(true),
            window: Atomic::new(0),
            faults: Atomic::new(0),
            copies: Atomic::new(0),
            bytes: Atomic::new(0),
        })
    }

    pub(crate) fn counters(&self) -> Counters {
        Counters {
            faults: self.faults.load(Relaxed),
            copies: self.copies.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
        }
    }

    /// Marks the cached routes out of date (someone changed them).
    pub(crate) fn routes_changed(&self) {
        self.stale.store(true, Relaxed);
    }

    /// Size of the P2P window in bytes (0: none).
    pub(crate) fn window_size(&self) -> u64 {
        self.window.load(Relaxed)
    }

    /// Called by the interrupt handler with the P2P events it cleared.
    pub(crate) fn on_events(&self, ev: regs::P2P_EVENT_STATUS) {
        if ev.fault() {
            self.faults.fetch_add(1, Relaxed);
        }
        if ev.routes_changed() {
            self.stale.store(true, Relaxed);
        }
    }
}

/// Sets the DMA mask, allocates the ring and starts the engine, if the firmware has one.
pub(crate) fn init(mep: &Mep, dev: &Device<Bound>, vector: usize) -> Result {
    // The engine's registers are pcifab's extension: on firmware without it that space is
    // not the driver's to touch.
    if !mep.features().has(ext::DMA_ENGINE) {
        dev_info!(mep.pdev, "firmware has no P2P DMA engine extension\n");
        return Ok(());
    }
    let caps = mep.with_bar(|bar| bar.read(regs::P2P_CAPS))?;
    if !caps.engine() || u8::from(caps.version()) != 1 {
        dev_info!(mep.pdev, "firmware has no P2P DMA engine\n");
        return Ok(());
    }
    mep.p2p
        .window
        .store(u64::from(u16::from(caps.window_mib())) << 20, Relaxed);
    let ring = Coherent::<Desc>::zeroed_slice(dev, RING_ENTRIES, GFP_KERNEL)?;
    let addr = ring.dma_address();
    let vector = u16::try_from(vector).map_err(|_| EINVAL)?;
    let binding = Binding::new(dev)?;
    // The ring is the engine's before the engine is pointed at it: from here on
    // [`shut_down`] (at unbind, or when probe fails later) stops the engine before freeing it.
    let mut e = mep.p2p.engine.lock();
    if e.stuck {
        // [`disarm_stale`] found the engine still running a ring that is not this driver's:
        // it is not pointed at a new one.
        dev_warn!(mep.pdev, "P2P DMA engine stuck at probe: left off\n");
        return Ok(());
    }
    e.ring = Some(ring);
    e.binding = Some(binding);
    e.tail = 0;
    e.vector = vector;
    mep.with_bar(|bar| bar.write_reg(regs::DMA_CTRL::zeroed().with_reset(true)))?;
    start(mep, &e, addr)
}

/// Points the stopped engine at the ring `addr` and its interrupt at `e.vector`, and enables
/// it. At probe, after every reset, and when the device lost them to a reset of its own.
fn start(mep: &Mep, e: &Engine, addr: u64) -> Result {
    mep.with_bar(|bar| {
        bar.write_reg(regs::DMA_RING_LO::zeroed().with_value(addr as u32));
        bar.write_reg(regs::DMA_RING_HI::zeroed().with_value((addr >> 32) as u32));
        bar.write_reg(regs::DMA_RING_SIZE::zeroed().with_value(RING_ENTRIES as u32));
        bar.write_reg(
            regs::DMA_IRQ::zeroed()
                .with_vector(e.vector)
                .with_enable(true),
        );
        bar.write_reg(regs::P2P_EVENT_STATUS::all());
        bar.write_reg(regs::DMA_CTRL::zeroed().with_enable(true));
    })
}

/// Whether the device forgot the ring it was given: a function-level or bus reset (or the
/// device coming back after one) puts the engine's registers back to zero, and the PCI core
/// restores config space only. One register read: the ring size, which this driver never
/// leaves at zero while the engine has a ring. A device that reads all ones is gone, which
/// the copy finds out on its own.
fn ring_lost(mep: &Mep) -> bool {
    mep.with_bar(|bar| bar.read(regs::DMA_RING_SIZE).into_raw())
        .is_ok_and(|size| size != RING_ENTRIES as u32 && size != u32::MAX)
}

/// Stops a DMA engine this driver did not start: one a previous kernel (kexec) or a probe
/// that failed left pointing at a ring that is no longer its. Called at probe once the
/// firmware said it has the engine, before [`init`].
pub(crate) fn disarm_stale(mep: &Mep) {
    if !mep.features().has(ext::DMA_ENGINE) {
        return;
    }
    let engine = mep
        .with_bar(|bar| {
            let caps = bar.read(regs::P2P_CAPS);
            caps.engine() && u8::from(caps.version()) == 1
        })
        .unwrap_or(false);
    if !engine {
        return;
    }
    let mut e = mep.p2p.engine.lock();
    // Nothing of this driver is in flight: no ring yet.
    let dead = core::mem::replace(&mut e.dead, true);
    reset(mep, &mut e);
    if e.stuck {
        // Still busy after the reset: its ring address stays, and no copy ever runs.
        return;
    }
    e.dead = dead;
    forget_ring(mep);
}

/// Clears the engine's ring address, size and interrupt: nothing is left for it to reach.
/// The engine must be stopped ([`reset`] without restart).
fn forget_ring(mep: &Mep) {
    let _ = mep.with_bar(|bar| {
        bar.write_reg(regs::DMA_IRQ::zeroed());
        bar.write_reg(regs::DMA_RING_SIZE::zeroed());
        bar.write_reg(regs::DMA_RING_LO::zeroed());
        bar.write_reg(regs::DMA_RING_HI::zeroed());
        // Posted writes: read back so the engine has them before the ring is freed.
        let _ = bar.read(regs::DMA_STATUS);
    });
}

/// Stops copies for unbind: the running one aborts (and has released its pages when this
/// returns), later ones fail with `ENODEV`.
pub(crate) fn shut_down(mep: &Mep) {
    let _turn = mep.p2p.turn.close_and_take();
    let mut e = mep.p2p.engine.lock();
    e.dead = true;
    // Stopped and idle before the ring goes: the engine writes statuses back into it. Only
    // an engine that was set up (the firmware has the extension) is touched at all.
    if e.ring.is_some() {
        reset(mep, &mut e);
        if !e.stuck {
            forget_ring(mep);
        }
    }
    // The ring's DMA mapping must not outlive the binding (the IOMMU domain and the DMA ops
    // of the device go with it), while open files may keep the `Mep` for longer.
    let ring = e.ring.take();
    let stuck = e.stuck;
    drop(e);
    if stuck {
        // Freed memory the engine still writes to would be worse than a leak.
        core::mem::forget(ring);
    } else {
        drop(ring);
    }
}

/// Lets host `grantee` route to `pdfid` (`grant`) or takes that back with every route it
/// allowed (`!grant`). Returns the number of grants on `pdfid` now.
pub(crate) fn grant(mep: &Mep, pdfid: u16, grantee: u8, grant: bool) -> Result<u32, Failure> {
    mep.features().require(ext::P2P_ROUTES)?;
    if !grant {
        mep.p2p.routes_changed();
    }
    fw::p2p::grant(mep, pdfid, grantee, grant)
}

/// The grants this host may see, ascending PDFID.
pub(crate) fn grants(mep: &Mep) -> Result<KVec<uapi::Grant>> {
    mep.features().require(ext::P2P_ROUTES)?;
    let list = fw::p2p::grants(mep)?;
    let mut v = KVec::with_capacity(list.len(), GFP_KERNEL)?;
    for g in &list {
        v.push(
            uapi::Grant {
                pdfid: g.pdfid,
                holder: g.holder,
                grantee: g.grantee,
                reserved: 0,
            },
            GFP_KERNEL,
        )?;
    }
    Ok(v)
}

/// The routes of this host, ascending window offset.
pub(crate) fn routes(mep: &Mep) -> Result<KVec<uapi::Route>> {
    mep.features().require(ext::P2P_ROUTES)?;
    let list = fw::p2p::routes(mep)?;
    let count = list.len();
    let window = mep.p2p.window_size();
    let mut v = KVec::with_capacity(count, GFP_KERNEL)?;
    for e in &list {
        let r = uapi::Route {
            window_off: e.window_off,
            size: e.size,
            target_off: e.target_off,
            pdfid: e.pdfid,
            target_host: e.target_host,
            ..uapi::Route::default()
        };
        // A route must lie inside the window and its target range must not wrap; anything
        // else is a firmware bug, and every sum made with these values below stays in range.
        let in_window = r
            .window_off
            .checked_add(r.size)
            .is_some_and(|end| end <= window);
        if r.size == 0 || !in_window || r.target_off.checked_add(r.size).is_none() {
            dev_warn!(
                mep.pdev,
                "firmware reported an impossible P2P route: window {:#x}+{:#x}, target {:#x}\n",
                r.window_off,
                r.size,
                r.target_off
            );
            return Err(EIO);
        }
        v.push(r, GFP_KERNEL)?;
    }
    Ok(v)
}

/// The routes for a copy: the cached list unless it is out of date, else read again.
pub(crate) fn cached_routes(mep: &Mep, refresh: bool) -> Result<KVec<uapi::Route>> {
    let mut cache = mep.p2p.cache.lock();
    let stale = mep.p2p.stale.xchg(false, Relaxed);
    if let (Some(c), false, false) = (cache.as_ref(), stale, refresh) {
        let mut v = KVec::with_capacity(c.len(), GFP_KERNEL)?;
        v.extend_from_slice(c, GFP_KERNEL)?;
        return Ok(v);
    }
    let fresh = routes(mep);
    match &fresh {
        Ok(r) => {
            let mut v = KVec::with_capacity(r.len(), GFP_KERNEL)?;
            v.extend_from_slice(r, GFP_KERNEL)?;
            *cache = Some(v);
        }
        Err(_) => mep.p2p.stale.store(true, Relaxed),
    }
    fresh
}

/// Adds a route; `PCIFAB_ROUTE_ANY_WINDOW` picks the lowest free window range.
///
/// Returns the route as added and the number of routes now.
pub(crate) fn route_add(mep: &Mep, mut r: uapi::Route) -> Result<(uapi::Route, u32), Failure> {
    mep.features().require(ext::P2P_ROUTES)?;
    let _guard = mep.p2p.routes.lock();
    if r.window_off == uapi::ROUTE_ANY_WINDOW {
        let window = mep.p2p.window_size();
        if r.size == 0 || r.size % PAGE != 0 || r.size > window {
            return Err(EINVAL.into());
        }
        let mut at = 0u64;
        for e in routes(mep)?.iter() {
            if e.window_off >= at && e.window_off - at >= r.size {
                break;
            }
            at = at.max(e.window_off.saturating_add(e.size));
        }
        if at.checked_add(r.size).is_none_or(|end| end > window) {
            return Err(ENOSPC.into());
        }
        r.window_off = at;
    }
    mep.p2p.routes_changed();
    let count = fw::p2p::add(
        mep,
        &fw::p2p::Route {
            window_off: r.window_off,
            size: r.size,
            target_off: r.target_off,
            pdfid: r.pdfid,
            target_host: 0,
        },
    )?;
    // The firmware says which host the target is bound to in its list.
    if let Some(e) = routes(mep)?.iter().find(|e| e.window_off == r.window_off) {
        r.target_host = e.target_host;
    }
    Ok((r, count))
}

/// Removes the route that starts at `window_off`; returns the number of routes left.
pub(crate) fn route_del(mep: &Mep, window_off: u64) -> Result<u32, Failure> {
    mep.features().require(ext::P2P_ROUTES)?;
    let _guard = mep.p2p.routes.lock();
    mep.p2p.routes_changed();
    fw::p2p::del(mep, window_off)
}

/// Window offset of `len` bytes at `off` in function `pdfid`'s memory, if one route covers
/// them.
fn window_of(routes: &[uapi::Route], pdfid: u16, off: u64, len: u64) -> Option<u64> {
    let end = off.checked_add(len)?;
    routes.iter().find_map(|r| {
        let target_end = r.target_off.checked_add(r.size)?;
        if r.pdfid != pdfid || off < r.target_off || end > target_end {
            return None;
        }
        r.window_off.checked_add(off.checked_sub(r.target_off)?)
    })
}

/// One end of a copy once resolved: a window offset, a bus address, or a user buffer.
#[derive(Clone, Copy)]
enum End {
    Window(u64),
    Iova(u64),
    User(u64),
}

/// The outcome of a copy: bytes copied, the last descriptor status, and the error if any.
pub(crate) struct Copied {
    pub(crate) done: u64,
    pub(crate) status: u32,
    pub(crate) err: Option<Error>,
}

/// Copies `len` bytes from `src` to `dst` with the DMA engine (`PCIFAB_IOCTL_P2P_COPY`).
pub(crate) fn copy(
    mep: &Mep,
    src: &uapi::P2pEnd,
    dst: &uapi::P2pEnd,
    len: u64,
    timeout_ms: u32,
) -> Result<Copied> {
    // Into a buffer a peer host registered for this one: the switch's DMA endpoint in
    // fabric mode, whatever the firmware's extensions (`dmaep`).
    if dst.kind == uapi::P2P_PEER {
        if src.kind != uapi::P2P_USER || src.reserved0 != 0 {
            return Err(EINVAL);
        }
        return crate::dmaep::copy(&mep.pdev, src, dst, len, timeout_ms);
    }
    if len == 0 || len > uapi::P2P_MAX_LEN || src.reserved0 != 0 || dst.reserved0 != 0 {
        return Err(EINVAL);
    }
    // Between two buffers of the caller, without the firmware's own engine: the switch's DMA
    // endpoint, when pcifab bound it (`dmaep`).
    if src.kind == uapi::P2P_USER
        && dst.kind == uapi::P2P_USER
        && !mep.features().has(ext::DMA_ENGINE)
    {
        return crate::dmaep::copy(&mep.pdev, src, dst, len, timeout_ms);
    }
    let host = |e: &uapi::P2pEnd| e.kind != uapi::P2P_FUNCTION;
    if host(src) && host(dst) {
        return Err(EINVAL);
    }
    let timeout_ms = match timeout_ms {
        0 => DEFAULT_COPY_TIMEOUT_MS,
        t if t > uapi::P2P_MAX_TIMEOUT_MS => return Err(EINVAL),
        t => t,
    };
    let known =
        |e: &uapi::P2pEnd| matches!(e.kind, uapi::P2P_FUNCTION | uapi::P2P_USER | uapi::P2P_IOVA);
    if !known(src) || !known(dst) {
        return Err(EINVAL);
    }
    // A malformed call is EINVAL whatever the firmware; a sound one needs the engine.
    mep.features().require(ext::DMA_ENGINE)?;
    // A route added behind the driver's back (raw MRPC) is found by reading them again.
    let mut routes = cached_routes(mep, false)?;
    let covered = |routes: &[uapi::Route], e: &uapi::P2pEnd| {
        e.kind != uapi::P2P_FUNCTION || window_of(routes, e.pdfid, e.addr, len).is_some()
    };
    if !covered(&routes, src) || !covered(&routes, dst) {
        routes = cached_routes(mep, true)?;
    }
    let resolve = |e: &uapi::P2pEnd| -> Result<End> {
        match e.kind {
            uapi::P2P_FUNCTION => window_of(&routes, e.pdfid, e.addr, len)
                .map(End::Window)
                .ok_or(ENOENT),
            uapi::P2P_USER => {
                e.addr.checked_add(len).ok_or(EFAULT)?;
                Ok(End::User(e.addr))
            }
            uapi::P2P_IOVA => {
                e.addr.checked_add(len).ok_or(EINVAL)?;
                Ok(End::Iova(e.addr))
            }
            _ => Err(EINVAL),
        }
    };
    let (s, d) = (resolve(src)?, resolve(dst)?);

    let start = Instant::<Monotonic>::now();
    let mut copied = Copied {
        done: 0,
        status: 0,
        err: None,
    };
    // The user side, if any: the engine reads it (`to_device`) or writes it.
    let (user, to_device) = match (s, d) {
        (End::User(a), _) => (Some(a), true),
        (_, End::User(a)) => (Some(a), false),
        _ => (None, false),
    };
    let dir = if to_device {
        DataDirection::ToDevice
    } else {
        DataDirection::FromDevice
    };
    let mut batch = KVec::with_capacity(BATCH, GFP_KERNEL)?;
    while copied.done < len && copied.err.is_none() {
        let off = copied.done;
        batch.clear();
        // The user side of this part is pinned before any lock is taken: faulting it in takes
        // as long as the caller's memory makes it take, and must hold up no other caller nor
        // unbind. Unpinned when `pages` is dropped, at the end of the iteration, after the
        // engine finished with it.
        let mut pages = match user {
            Some(addr) => {
                let part = (len - off).min(USER_CHUNK as u64);
                match UserPages::pin(addr + off, part as usize, dir) {
                    Ok(p) => Some(p),
                    Err(err) if off == 0 => return Err(err),
                    // What was copied is reported with the error.
                    Err(err) => {
                        copied.err = Some(err);
                        break;
                    }
                }
            }
            None => None,
        };
        // Waiting for the turn ends on a signal or at the copy's deadline: the part that runs
        // may take up to its own timeout.
        let _turn = match mep.p2p.turn.take_within(start, timeout_ms) {
            Ok(t) => t,
            Err(err) if off == 0 => return Err(err),
            Err(err) => {
                copied.err = Some(err);
                break;
            }
        };
        // The device stays bound while a part is copied: unbind takes a turn
        // (`shut_down()`) before the binding ends, and closes it first so the part running
        // stops at its next look. The binding is held before the engine is locked, never the
        // other way round: the engine's lock is taken and dropped for each look while a batch
        // waits.
        let binding = mep.p2p.engine.lock().binding.clone().ok_or(EOPNOTSUPP)?;
        let Some(bound) = binding.access() else {
            copied.err = Some(ENODEV);
            break;
        };
        let gone = {
            let mut e = mep.p2p.engine.lock();
            if e.reset_due && !e.dead {
                // The last part ended with the device gone: the engine may not have seen the
                // reset then.
                reset(mep, &mut e);
            } else if !e.dead && e.ring.is_some() && ring_lost(mep) {
                dev_warn!(
                    mep.pdev,
                    "P2P DMA engine lost its ring (device reset); setting it up again\n"
                );
                reset(mep, &mut e);
            }
            if e.dead || e.reset_due || mep.p2p.turn.is_closed() {
                Some(ENODEV)
            } else if e.ring.is_none() {
                Some(EOPNOTSUPP)
            } else {
                None
            }
        };
        if let Some(err) = gone {
            if off == 0 {
                return Err(err);
            }
            copied.err = Some(err);
            break;
        }
        // Map the pinned part for the engine; unmapped after the engine finished with it.
        let mapped = match pages.as_mut() {
            Some(p) => Some(p.map(bound.device())?),
            None => None,
        };
        let part = if let Some(u) = mapped.as_ref() {
            let part = (len - off).min(USER_CHUNK as u64);
            let mut at = 0u64;
            for (seg, seg_len) in u.segments() {
                let (sa, da) = if to_device {
                    (End::Iova(seg), advance(d, off + at))
                } else {
                    (advance(s, off + at), End::Iova(seg))
                };
                batch.push((sa, da, seg_len), GFP_KERNEL)?;
                at += seg_len;
                if batch.len() == BATCH && at < part {
                    // More segments than a batch holds: copy what fits this round.
                    break;
                }
            }
            at
        } else {
            let mut at = 0u64;
            while off + at < len && batch.len() < BATCH {
                let n = (len - off - at).min(DESC_MAX);
                batch.push((advance(s, off + at), advance(d, off + at), n), GFP_KERNEL)?;
                at += n;
            }
            at
        };
        let r = run_batch(mep, &batch, start, timeout_ms);
        if mep.p2p.engine.lock().stuck {
            // The engine may still write into these pages: keep them pinned and mapped for
            // good rather than hand them back for reuse.
            core::mem::forget(mapped);
            core::mem::forget(pages);
        } else {
            drop(mapped);
        }
        match r {
            Ok((bytes, status, err)) => {
                // `collect` counts at most what the batch asked for: at most `part`.
                copied.done = copied.done.saturating_add(bytes.min(part));
                copied.status = status;
                copied.err = err;
                if err.is_none() && bytes < part {
                    copied.err = Some(EIO);
                }
            }
            Err(err) => copied.err = Some(err),
        }
    }
    mep.p2p.copies.fetch_add(1, Relaxed);
    mep.p2p.bytes.fetch_add(copied.done, Relaxed);
    Ok(copied)
}

/// `end` moved forward by `by` bytes, within the copy's checked range (the start plus the
/// copy's length does not wrap, see [`copy`]), so the sum cannot wrap either.
fn advance(end: End, by: u64) -> End {
    match end {
        End::Window(a) => End::Window(a.wrapping_add(by)),
        End::Iova(a) => End::Iova(a.wrapping_add(by)),
        End::User(a) => End::User(a.wrapping_add(by)),
    }
}

fn kind_addr(end: End) -> (u32, u64) {
    match end {
        End::Window(a) => (KIND_WINDOW, a),
        End::Iova(a) | End::User(a) => (KIND_HOST, a),
    }
}

/// Submits `batch` (source, destination, length) and waits for it; the caller holds the
/// engine's [`Turn`]. The engine's lock is held to fill the ring and ring the doorbell, then
/// only for each look at the ring and for a reset.
///
/// Returns the bytes copied, the status of the last descriptor that ran, and the error of
/// the first that failed. On timeout, signal or unbind the engine is reset and waited for,
/// so nothing of the batch is in flight when this returns. A device that reads all ones is
/// gone: `ENODEV`, and it reaches no memory any more.
fn run_batch(
    mep: &Mep,
    batch: &[(End, End, u64)],
    start: Instant<Monotonic>,
    timeout_ms: u32,
) -> Result<(u64, u32, Option<Error>)> {
    let mut e = mep.p2p.engine.lock();
    let first = e.tail;
    let n = batch.len() as u32;
    {
        let ring = e.ring.as_ref().ok_or(EOPNOTSUPP)?;
        for (i, &(src, dst, len)) in batch.iter().enumerate() {
            let slot = ((first + i as u32) as usize) % RING_ENTRIES;
            let (sk, sa) = kind_addr(src);
            let (dk, da) = kind_addr(dst);
            io_write!(ring, [try: slot].status, 0u32);
            io_write!(ring, [try: slot].len, len);
            io_write!(ring, [try: slot].src, sa);
            io_write!(ring, [try: slot].dst, da);
            io_write!(ring, [try: slot].done, 0u64);
            io_write!(ring, [try: slot].cookie, u64::from(first + i as u32));
            io_write!(ring, [try: slot].control, sk | (dk << 2));
        }
    }
    let tail = (first + n) % RING_ENTRIES as u32;
    e.tail = tail;
    mep.with_bar(|bar| bar.write_reg(regs::DMA_TAIL::zeroed().with_value(tail)))?;
    drop(e);

    // Wait until the engine is past the batch. It writes a descriptor's status back when it
    // is done with it, in ring order: the batch's last descriptor written back as a success
    // means the engine is past the batch, and no register needs reading (each read is a
    // round trip to the device). Anything else goes by HEAD and STATUS, which also tell a
    // halted engine.
    let last = (first.wrapping_add(n).wrapping_sub(1) as usize) % RING_ENTRIES;
    let waited = Instant::<Monotonic>::now();
    let mut regs_at = POLL_REGS_MS;
    let mut failed = None;
    loop {
        let last_status: u32 = {
            let e = mep.p2p.engine.lock();
            let ring = e.ring.as_ref().ok_or(EOPNOTSUPP)?;
            io_read!(ring, [try: last].status)
        };
        if n != 0 && last_status == DMA_OK {
            break;
        }
        let waited_us = waited.elapsed().as_nanos() / 1000;
        if last_status != 0 || waited_us / 1000 >= regs_at {
            regs_at = waited_us / 1000 + POLL_REGS_MS;
            let (head, status) =
                mep.with_bar(|bar| (bar.read(regs::DMA_HEAD).value(), bar.read(regs::DMA_STATUS)))?;
            let head: u32 = head.into();
            if status.into_raw() == u32::MAX {
                // Nothing answers: the device left the bus.
                dev_warn!(
                    mep.pdev,
                    "P2P DMA engine reads all ones: device gone; copy stopped\n"
                );
                failed = Some(ENODEV);
                break;
            }
            if head == tail {
                break;
            }
            if status.halted() {
                failed = Some(EIO);
                break;
            }
        }
        if mep.p2p.turn.is_closed() {
            failed = Some(ENODEV);
            break;
        }
        if start.elapsed().as_millis() >= i64::from(timeout_ms) {
            failed = Some(ETIMEDOUT);
            break;
        }
        if kernel::current!().signal_pending() {
            failed = Some(EINTR);
            break;
        }
        if waited_us < POLL_SPIN_US {
            core::hint::spin_loop();
        } else {
            // Naps end within a thirty-second of their length (fsleep's quarter would make
            // every look late by up to that much).
            let nap = (waited_us / 8).clamp(POLL_NAP_MIN_US, POLL_NAP_MAX_US);
            usleep_range(Delta::from_micros(nap), Delta::from_micros(nap / 32));
        }
    }
    let mut e = mep.p2p.engine.lock();
    if let Some(err) = failed {
        reset(mep, &mut e);
        // What completed before the reset still counts.
        let (bytes, status, _) = collect(mep, &e, first, batch)?;
        return Ok((bytes, status, Some(err)));
    }
    collect(mep, &e, first, batch)
}

/// Reads back the statuses of the descriptors of `batch`, written from `first`.
///
/// The engine's write-back is device input: a descriptor's bytes-done counts at most the
/// length it was given, and a short one ends the batch.
fn collect(
    mep: &Mep,
    e: &Engine,
    first: u32,
    batch: &[(End, End, u64)],
) -> Result<(u64, u32, Option<Error>)> {
    let ring = e.ring.as_ref().ok_or(EOPNOTSUPP)?;
    let (mut bytes, mut last) = (0u64, 0u32);
    for (i, &(_, _, len)) in batch.iter().enumerate() {
        let slot = (first as usize).wrapping_add(i) % RING_ENTRIES;
        let status: u32 = io_read!(ring, [try: slot].status);
        if status == 0 {
            break;
        }
        // The engine writes the status last: the bytes-done it guards is read after it.
        dma_mb(Read);
        let done: u64 = io_read!(ring, [try: slot].done);
        if done > len {
            // More than it was given: the copy is not believed from here on.
            crate::fw::lie(
                mep,
                format_args!(
                    "DMA descriptor {} written back with {} bytes done of {}",
                    slot, done, len
                ),
            );
            return Ok((bytes, status, Some(EIO)));
        }
        // Both are at most `P2P_MAX_LEN`, so the sum cannot overflow.
        bytes = bytes.saturating_add(done);
        last = status;
        if status == DMA_OK && done < len {
            return Ok((bytes, status, Some(EIO)));
        }
        if status != DMA_OK {
            let err = match status {
                DMA_HOST_FAULT => EFAULT,
                DMA_ROUTE_FAULT => EREMOTEIO,
                _ => EINVAL,
            };
            return Ok((bytes, status, Some(err)));
        }
    }
    Ok((bytes, last, None))
}

/// Resets the engine, waits until its current descriptor is finished and starts it again.
///
/// An engine still busy after [`RESET_WAIT_MS`] is marked stuck: whatever host memory it was
/// given stays allocated, pinned and mapped, and no copy runs on it any more. A device that
/// reads all ones has left the bus and writes nothing any more: it is not waited for, and the
/// next part resets it again (`reset_due`), as the reset may not have reached it.
fn reset(mep: &Mep, e: &mut Engine) {
    let _ = mep.with_bar(|bar| {
        bar.write_reg(regs::DMA_CTRL::zeroed().with_reset(true));
    });
    // `None`: unbound; `Some(None)`: reads all ones (gone); else whether it is busy. Neither
    // an unbound nor a gone device writes anything any more.
    let r = read_poll_timeout(
        || {
            let status = mep.with_bar(|bar| bar.read(regs::DMA_STATUS)).ok();
            Ok(status.map(|s| (s.into_raw() != u32::MAX).then_some(s.busy())))
        },
        |s| !matches!(s, Some(Some(true))),
        Delta::from_millis(1),
        Delta::from_millis(RESET_WAIT_MS),
    );
    // All ones from BAR0 is a device gone from the bus only if config space says so too: a
    // device that still answers there (its memory decode off, an error being contained) may
    // still master DMA, so its buffers are kept as a busy engine's are.
    let all_ones = matches!(r, Ok(Some(None)));
    let gone = all_ones && !pci_enable::present(&mep.pdev);
    let idle = r.is_ok() && !all_ones;
    e.tail = 0;
    e.reset_due = gone;
    if gone {
        return;
    }
    if !idle {
        dev_err!(
            mep.pdev,
            "P2P DMA engine {} {} ms after a reset; keeping its buffers, no more copies\n",
            if all_ones {
                "reads all ones but the device is still on the bus"
            } else {
                "still busy"
            },
            RESET_WAIT_MS
        );
        e.stuck = true;
        e.dead = true;
    }
    if !e.dead {
        // The ring again too: a device that came back from a reset of its own has lost it.
        if let Some(addr) = e.ring.as_ref().map(|r| r.dma_address()) {
            let _ = start(mep, e, addr);
        }
    }
}

/// The distance between two functions (`PCIFAB_IOCTL_P2P_DISTANCE`).
pub(crate) fn distance(mep: &Mep, a: u16, b: u16) -> Result<uapi::P2pDistance> {
    let mut out = uapi::P2pDistance::default();
    let (pa, pb) = mep
        .fabric
        .with_view(mep, |v| -> Result<(Option<u8>, Option<u8>)> {
            let local = |pdfid: u16| -> Result<Option<u8>> {
                let f = v
                    .functions
                    .iter()
                    .find(|f| f.pdfid == pdfid)
                    .ok_or(ENOENT)?;
                Ok((f.bound_host == v.partition).then_some(f.bound_log_port))
            };
            Ok((local(a)?, local(b)?))
        })??;
    let routes = routes(mep).unwrap_or_default();
    let routed = |p: u16| routes.iter().any(|r| r.pdfid == p);
    let la = pa.and_then(|p| hotplug::find(&mep.pdev, p).map(|_| p));
    let lb = pb.and_then(|p| hotplug::find(&mep.pdev, p).map(|_| p));
    for (set, bit) in [
        (la.is_some(), uapi::P2P_A_LOCAL),
        (lb.is_some(), uapi::P2P_B_LOCAL),
        (routed(a), uapi::P2P_A_ROUTED),
        (routed(b), uapi::P2P_B_ROUTED),
    ] {
        if set {
            out.info |= bit;
        }
    }
    out.pci_distance = -1;
    if a == b {
        out.path = uapi::P2P_PATH_SAME;
        out.hops = 0;
        out.pci_distance = 0;
        return Ok(out);
    }
    // Every function of the fabric hangs off one switch: data enters at one port and leaves
    // at another, whichever host the two are bound to.
    out.hops = 2;
    match (la, lb) {
        (Some(x), Some(y)) => {
            out.path = uapi::P2P_PATH_SWITCH;
            let d = hotplug::p2p_distance(&mep.pdev, x, y);
            out.pci_distance = d.distance;
            if d.acs_redirect {
                out.info |= uapi::P2P_ACS_REDIRECT;
            }
        }
        _ => out.path = uapi::P2P_PATH_FABRIC,
    }
    Ok(out)
}
