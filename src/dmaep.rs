// SPDX-License-Identifier: GPL-2.0-only

//! The switch's DMA endpoint, bound by pcifab: the first step of P2P on the interface PAX
//! parts have (`Documentation/design.rst`, "P2P on the DMA endpoint").
//!
//! The DMA endpoint is a PCI function of its own (the switch's vendor and device id, class
//! 0x088000). [`DmaEpDriver`] binds the one of a PAX part, takes every channel the endpoint
//! reports (at most [`MAX_CHANNELS`]) to rest (a previous kernel may have left one running),
//! turns bus mastering on, gives each channel a submission and a completion queue in coherent
//! DMA memory and runs a self-test on it: [`SELFTEST_COPIES`] basic-mode copies of a pattern
//! between two coherent buffers, each waited for by polling the completion queue (no
//! interrupt), bounded by [`SELFTEST_TIMEOUT_MS`] and interrupted by a signal. Every field of
//! a completion is device input: its phase says whether it was written, its command id, byte
//! count and SQ head must be the ones of the copy, its status must be 0, and the copied bytes
//! are compared with the source. A channel that fails is stopped and not used; the result of
//! each is in sysfs ([`Summary`], `Documentation/sysfs.rst`). At unbind every channel is
//! halted and disabled before its queues are freed; queues of a channel that does not come to
//! rest are never freed (the endpoint may still write to them).
//!
//! Fabric mode (the firmware's command path, buffers registered for peer hosts, copies into
//! a peer's buffer) is in [`fabric`]; what is next is in `Documentation/design.rst`.

use core::mem::ManuallyDrop;

use kernel::{
    device::Core,
    dma::{Coherent, DataDirection, DmaMask},
    io::{
        io_read, io_write,
        poll::read_poll_timeout,
        register::{Array, RegisterArray, RegisterArrayLoc},
        Io,
    },
    pci,
    prelude::*,
    sync::{
        aref::ARef,
        barrier::{dma_mb, Read},
        new_mutex, Arc, Mutex,
    },
    time::{Delta, Instant, Monotonic},
};

use crate::{
    dmaep_regs::{self as r, Ce, Se, BAR0_SIZE, MAX_CHANNELS},
    kext::{
        self,
        binding::Binding,
        dmaep_registry as registry,
        kobject::{DataDir, KType, KobjAttr},
        pci_enable,
        sleep::usleep_range,
        sysfs::{attribute_groups, PageWriter},
        user_pages::UserPages,
    },
    p2p::Copied,
    turn::TurnLock,
    uapi,
};

mod fabric;

pub(crate) use fabric::{new_owner, FabFail};

/// The BAR0 mapping, sized so that every fixed register offset is checked at compile time.
type DmaBar<'a> = pci::Bar<'a, BAR0_SIZE>;

/// Entries of each channel's submission and completion queue.
const QUEUE_ENTRIES: u16 = 16;
/// Copies of the self-test per channel: more than a queue holds, so the queues wrap and the
/// completion phase flips once.
pub(crate) const SELFTEST_COPIES: u16 = 20;
/// Bytes of each self-test copy.
pub(crate) const SELFTEST_LEN: usize = 4096;
/// Bound on the wait for one copy of the self-test.
const SELFTEST_TIMEOUT_MS: i64 = 1000;
/// Bound on the wait for a channel to report paused or halted.
const STATE_WAIT_MS: i64 = 100;
/// While a copy is waited for, the status register is read this often (a channel that paused
/// on an error without a completion, a device that left the bus).
const POLL_REGS_US: i64 = 20_000;

/// Register `i` of the array `T`; `EINVAL` for an index the array does not have.
fn at<T: Array + RegisterArray>(i: usize) -> Result<RegisterArrayLoc<T>> {
    T::try_at(i).ok_or(EINVAL)
}

/// Whether `device` is a PAX part (Gen4 PAX 0x42xx and PAXA 0x45xx, Gen5 0x52xx and 0x55xx):
/// Linux's `switchtec_dma` drives the DMA endpoints of the other parts.
fn is_pax(device: u16) -> bool {
    matches!(device >> 8, 0x42 | 0x45 | 0x52 | 0x55)
}

/// What the self-test found on one channel.
#[derive(Clone, Copy)]
enum Outcome {
    /// The endpoint says the channel does not exist.
    Absent,
    /// Every copy completed and its bytes arrived.
    Ok { bytes: u64 },
    /// A copy failed (the error and the completion status, 0 when there was none).
    Failed { err: Error, status: u32 },
}

/// What the endpoint reported and the self-test found: the data of the sysfs directory.
struct Summary {
    fw_version: u32,
    protocol: u32,
    /// This host's HFID in fabric mode; `None` when the command path is not usable.
    hfid: Option<u16>,
    outcomes: KVec<Outcome>,
}

attribute_groups! {
    /// The files of `/sys/bus/pci/devices/BDF/pcifab/`, in the order of `sysfs.rst`.
    static GROUPS: KobjAttr<Summary> = [
        KobjAttr::root_only(c"channels", |s, o| {
            o.emit(format_args!("{}\n", s.outcomes.len()))
        }),
        KobjAttr::root_only(c"version", |s, o| {
            o.emit(format_args!("{:#010x} {}\n", s.fw_version, s.protocol))
        }),
        KobjAttr::root_only(c"selftest", show_selftest),
        KobjAttr::root_only(c"hfid", |s, o| match s.hfid {
            Some(h) => o.emit(format_args!("{:#06x}\n", h)),
            None => o.emit(format_args!("none\n")),
        }),
    ];
}

static KTYPE: KType<Summary> = KType::new(&GROUPS);

/// The name of the errors a channel's self-test ends with (the kernel's own names are not
/// built into every kernel).
fn err_name(err: Error) -> Option<&'static str> {
    [
        (EIO, "EIO"),
        (ETIMEDOUT, "ETIMEDOUT"),
        (EINTR, "EINTR"),
        (ENODEV, "ENODEV"),
        (EINVAL, "EINVAL"),
        (ENOMEM, "ENOMEM"),
    ]
    .into_iter()
    .find(|&(e, _)| e == err)
    .map(|(_, name)| name)
}

fn show_selftest(s: &Summary, o: &mut PageWriter<'_>) -> Result {
    for (i, outcome) in s.outcomes.iter().enumerate() {
        match *outcome {
            Outcome::Absent => o.emit(format_args!("{} absent\n", i))?,
            Outcome::Ok { bytes } => o.emit(format_args!("{} ok {}\n", i, bytes))?,
            Outcome::Failed { err, status } => match err_name(err) {
                Some(name) => o.emit(format_args!("{} {} {:#x}\n", i, name, status))?,
                None => o.emit(format_args!(
                    "{} errno{} {:#x}\n",
                    i,
                    err.to_errno(),
                    status
                ))?,
            },
        }
    }
    Ok(())
}

/// One channel with its queues.
struct Chan {
    index: usize,
    sq: Coherent<[Se]>,
    cq: Coherent<[Ce]>,
    /// The next submission slot (the `sq_tail` last written).
    tail: u16,
    /// The next completion slot to look at (the `cq_head` last written).
    head: u16,
    /// The phase the endpoint writes in this pass over the completion queue.
    phase: u16,
    /// The command id of the next copy.
    cid: u16,
    /// The self-test passed and no copy failed since: copies may use it.
    ok: bool,
}

/// A failed copy: why, and the completion's status (0 when there was none).
struct Fail {
    err: Error,
    status: u32,
}

impl From<Error> for Fail {
    fn from(err: Error) -> Self {
        Fail { err, status: 0 }
    }
}

impl From<kernel::ptr::projection::OutOfBound> for Fail {
    fn from(e: kernel::ptr::projection::OutOfBound) -> Self {
        Error::from(e).into()
    }
}

/// The endpoint: its registers and the channels brought up. On drop every channel is taken
/// to rest before its queues are freed.
struct Endpoint {
    pdev: ARef<pci::Device>,
    /// Shared with the fabric command path ([`fabric::Fabric`]).
    bar: Arc<pci::DevresBar<BAR0_SIZE>>,
    chans: KVec<Chan>,
}

impl Endpoint {
    /// Runs `f` on the mapped BAR0; `ENODEV` once the device is unbound.
    fn with_bar<R>(&self, f: impl for<'a> FnOnce(&DmaBar<'a>) -> R) -> Result<R> {
        self.bar.try_access_with(f).ok_or(ENODEV)
    }

    /// The status of channel `i`; `ENODEV` when it reads all ones (the device left the bus).
    fn status(&self, i: usize) -> Result<r::CHAN_STATUS> {
        let s = self.with_bar(|bar| -> Result<_> { Ok(bar.read(at::<r::CHAN_STATUS>(i)?)) })??;
        if s.into_raw() == u32::MAX {
            return Err(ENODEV);
        }
        Ok(s)
    }

    /// Channel `i`'s `valid_en_se`.
    fn read_valid(&self, i: usize) -> Result<r::CHAN_VALID_EN_SE> {
        self.with_bar(|bar| -> Result<_> { Ok(bar.read(at::<r::CHAN_VALID_EN_SE>(i)?)) })?
    }

    /// Stops channel `i` and forgets its queues: halted, disabled, no queue address left.
    /// Returns whether it is at rest (halted, or gone from the bus): only then may memory it
    /// was given be freed.
    fn quiet(&self, i: usize) -> bool {
        let _ = self.with_bar(|bar| -> Result {
            bar.write(
                at::<r::CHAN_CTRL>(i)?,
                r::CHAN_CTRL::zeroed().with_pause(true).with_halt(true),
            );
            Ok(())
        });
        let r = read_poll_timeout(
            || Ok(self.status(i).map(|s| s.halted())),
            |s| !matches!(s, Ok(false)),
            Delta::from_micros(100),
            Delta::from_millis(STATE_WAIT_MS),
        );
        let at_rest = match r {
            Ok(Ok(true)) => true,
            // All ones from BAR0 is a device gone only if config space says so too.
            Ok(Err(_)) => !pci_enable::present(&self.pdev),
            _ => false,
        };
        if !at_rest {
            return false;
        }
        let _ = self.with_bar(|bar| -> Result {
            let v = bar.read(at::<r::CHAN_VALID_EN_SE>(i)?);
            if v.into_raw() != u32::MAX {
                bar.write(at::<r::CHAN_VALID_EN_SE>(i)?, v.with_enable(false));
            }
            bar.write(
                at::<r::CHAN_CTRL>(i)?,
                r::CHAN_CTRL::zeroed().with_halt(true).with_reset(true),
            );
            bar.write(at::<r::CHAN_SQ_BASE_LO>(i)?, r::CHAN_SQ_BASE_LO::zeroed());
            bar.write(at::<r::CHAN_SQ_BASE_HI>(i)?, r::CHAN_SQ_BASE_HI::zeroed());
            bar.write(at::<r::CHAN_CQ_BASE_LO>(i)?, r::CHAN_CQ_BASE_LO::zeroed());
            bar.write(at::<r::CHAN_CQ_BASE_HI>(i)?, r::CHAN_CQ_BASE_HI::zeroed());
            bar.write(at::<r::CHAN_SQ_SIZE>(i)?, r::CHAN_SQ_SIZE::zeroed());
            bar.write(at::<r::CHAN_CQ_SIZE>(i)?, r::CHAN_CQ_SIZE::zeroed());
            bar.write(
                at::<r::CHAN_CTRL>(i)?,
                r::CHAN_CTRL::zeroed().with_halt(true),
            );
            // Posted writes: read back so the endpoint has them before memory is freed.
            let _ = bar.read(at::<r::CHAN_CTRL>(i)?);
            Ok(())
        });
        true
    }

    /// Gives channel `i` its queues, enables it and lets it run.
    fn bring_up(
        &self,
        dev: &kernel::device::Device<kernel::device::Bound>,
        i: usize,
    ) -> Result<Chan> {
        let n = usize::from(QUEUE_ENTRIES);
        let sq = Coherent::<Se>::zeroed_slice(dev, n, GFP_KERNEL)?;
        let cq = Coherent::<Ce>::zeroed_slice(dev, n, GFP_KERNEL)?;
        let (sa, ca) = (sq.dma_address(), cq.dma_address());
        // The queues are the channel's from here on: a failure below leaves them to the
        // caller, which takes the channel to rest before they are freed.
        let chan = Chan {
            index: i,
            sq,
            cq,
            tail: 0,
            head: 0,
            // The endpoint's first pass writes phase 1 into the zeroed queue.
            phase: 1,
            cid: 0,
            ok: false,
        };
        self.with_bar(|bar| -> Result {
            bar.write(
                at::<r::CHAN_SQ_BASE_LO>(i)?,
                r::CHAN_SQ_BASE_LO::zeroed().with_value(sa as u32),
            );
            bar.write(
                at::<r::CHAN_SQ_BASE_HI>(i)?,
                r::CHAN_SQ_BASE_HI::zeroed().with_value((sa >> 32) as u32),
            );
            bar.write(
                at::<r::CHAN_CQ_BASE_LO>(i)?,
                r::CHAN_CQ_BASE_LO::zeroed().with_value(ca as u32),
            );
            bar.write(
                at::<r::CHAN_CQ_BASE_HI>(i)?,
                r::CHAN_CQ_BASE_HI::zeroed().with_value((ca >> 32) as u32),
            );
            bar.write(
                at::<r::CHAN_SQ_SIZE>(i)?,
                r::CHAN_SQ_SIZE::zeroed().with_entries(QUEUE_ENTRIES),
            );
            bar.write(
                at::<r::CHAN_CQ_SIZE>(i)?,
                r::CHAN_CQ_SIZE::zeroed().with_entries(QUEUE_ENTRIES),
            );
            let v = bar.read(at::<r::CHAN_VALID_EN_SE>(i)?);
            if v.into_raw() == u32::MAX {
                return Err(ENODEV);
            }
            // Fetch ahead up to half the channel's SE buffers, as Linux's driver asks.
            let thresh = u32::from(v.se_count()) / 2;
            bar.write(
                at::<r::CHAN_VALID_EN_SE>(i)?,
                v.with_enable(true)
                    .try_with_se_thresh(thresh)
                    .map_err(|_| EINVAL)?,
            );
            bar.write(
                at::<r::CHAN_CTRL>(i)?,
                r::CHAN_CTRL::zeroed()
                    .with_reset(true)
                    .with_halt(true)
                    .with_err_pause(true),
            );
            let _ = bar.read(at::<r::CHAN_CTRL>(i)?);
            Ok(())
        })??;
        usleep_range(Delta::from_micros(1000), Delta::from_micros(100));
        self.with_bar(|bar| -> Result {
            bar.write(
                at::<r::CHAN_CTRL>(i)?,
                r::CHAN_CTRL::zeroed().with_err_pause(true),
            );
            Ok(())
        })??;
        let r = read_poll_timeout(
            || self.status(i),
            |s| !s.halted() && !s.paused(),
            Delta::from_micros(100),
            Delta::from_millis(STATE_WAIT_MS),
        );
        match r {
            Ok(_) => Ok(chan),
            Err(e) => {
                // Still halted or paused: it is taken to rest again by the caller.
                self.park(chan);
                Err(if e == ENODEV { ENODEV } else { EIO })
            }
        }
    }

    /// Keeps `chan` for the drop, which takes it to rest before its queues are freed.
    fn park(&self, chan: Chan) {
        // A channel that cannot be kept (no memory for the list) is taken to rest now; if it
        // does not come to rest its queues are never freed.
        if !self.quiet(chan.index) {
            core::mem::forget(chan);
        }
    }

    /// Copies `len` bytes from bus address `src` to `dst` on `chan` and waits for the
    /// completion, polled. Basic mode, or with `fab` (destination and source DFID) fabric
    /// mode: `dst` is then the peer's bus address. Checks every field of the completion the
    /// endpoint wrote. The wait ends with `ENODEV` once `turn` is closed (unbind).
    fn copy(
        &self,
        chan: &mut Chan,
        (src, dst, len): (u64, u64, u32),
        fab: Option<(u16, u16)>,
        (start, timeout_ms): (Instant<Monotonic>, i64),
        turn: Option<&TurnLock>,
    ) -> Result<(), Fail> {
        if len == 0 || len > r::SE_MAX_BYTES {
            return Err(EINVAL.into());
        }
        let i = chan.index;
        let slot = usize::from(chan.tail);
        let cid = chan.cid;
        let sq = &chan.sq;
        let (ctrl, dfid, sfid) = match fab {
            Some((d, s)) => (r::SE_DFM, d, s),
            None => (0, 0, 0),
        };
        io_write!(sq, [try: slot].opc, r::OPC_MEMCPY);
        // No interrupt: the completion is polled.
        io_write!(sq, [try: slot].ctrl, ctrl);
        io_write!(sq, [try: slot].tlp, 0u16);
        io_write!(sq, [try: slot].rsvd1, 0u16);
        io_write!(sq, [try: slot].cid, cid);
        io_write!(sq, [try: slot].byte_cnt, len);
        io_write!(sq, [try: slot].saddr_lo, src as u32);
        io_write!(sq, [try: slot].saddr_hi, (src >> 32) as u32);
        io_write!(sq, [try: slot].daddr_lo, dst as u32);
        io_write!(sq, [try: slot].daddr_hi, (dst >> 32) as u32);
        io_write!(sq, [try: slot].dfid, dfid);
        io_write!(sq, [try: slot].sfid, sfid);
        let tail = (chan.tail + 1) % QUEUE_ENTRIES;
        // The MMIO write is ordered after the entry's writes to coherent memory.
        self.with_bar(|bar| -> Result {
            bar.write(
                at::<r::CHAN_SQ_TAIL>(i)?,
                r::CHAN_SQ_TAIL::zeroed().with_tail(tail),
            );
            Ok(())
        })??;
        chan.tail = tail;
        chan.cid = cid.wrapping_add(1);

        let head = usize::from(chan.head);
        let cq = &chan.cq;
        let waited = Instant::<Monotonic>::now();
        let mut regs_at = 0i64;
        loop {
            let phase: u16 = io_read!(cq, [try: head].phase);
            if phase == chan.phase {
                break;
            }
            let waited_us = waited.elapsed().as_nanos() / 1000;
            if waited_us >= regs_at {
                regs_at = waited_us + POLL_REGS_US;
                let s = self.status(i)?;
                if u32::from(s.errors()) != 0 {
                    // Paused on an error without a completion (a queue it could not reach).
                    return Err(Fail {
                        err: EIO,
                        status: s.into_raw(),
                    });
                }
            }
            if start.elapsed().as_millis() >= timeout_ms {
                return Err(ETIMEDOUT.into());
            }
            if kernel::current!().signal_pending() {
                return Err(EINTR.into());
            }
            // Unbind is waiting for the channels: the caller halts this one.
            if turn.is_some_and(TurnLock::is_closed) {
                return Err(ENODEV.into());
            }
            usleep_range(Delta::from_micros(20), Delta::from_micros(30));
        }
        // The endpoint writes the phase last: the fields it guards are read after it.
        dma_mb(Read);
        let status: u32 = io_read!(cq, [try: head].status);
        let done: u32 = io_read!(cq, [try: head].byte_cnt);
        let ce_cid: u16 = io_read!(cq, [try: head].cid);
        let sq_head: u16 = io_read!(cq, [try: head].sq_head);
        // The slot is the host's again.
        chan.head = (chan.head + 1) % QUEUE_ENTRIES;
        if chan.head == 0 {
            chan.phase ^= 1;
        }
        let head = chan.head;
        self.with_bar(|bar| -> Result {
            bar.write(
                at::<r::CHAN_CQ_HEAD>(i)?,
                r::CHAN_CQ_HEAD::zeroed().with_head(head),
            );
            Ok(())
        })??;
        if ce_cid != cid || sq_head != tail || done > len {
            dev_warn!(
                self.pdev,
                "DMA endpoint channel {}: completion of command {} says command {}, SQ head {} \
                 (expected {}), {} of {} bytes\n",
                i,
                cid,
                ce_cid,
                sq_head,
                tail,
                done,
                len
            );
            return Err(Fail { err: EIO, status });
        }
        if status != 0 || done != len {
            return Err(Fail { err: EIO, status });
        }
        Ok(())
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for chan in core::mem::take(&mut self.chans) {
            if !self.quiet(chan.index) {
                dev_err!(
                    self.pdev,
                    "DMA endpoint channel {} does not halt; keeping its queues\n",
                    chan.index
                );
                // The endpoint may still write to them: a leak, not a use after free.
                core::mem::forget(chan);
            }
        }
    }
}

/// The self-test's buffers: a source and a destination, in coherent memory.
struct Buffers {
    src: Coherent<[u64]>,
    dst: Coherent<[u64]>,
}

/// Runs the self-test on `chan`: [`SELFTEST_COPIES`] copies of a pattern that differs per
/// channel and copy, each checked.
fn selftest(ep: &Endpoint, chan: &mut Chan, bufs: &Buffers) -> Result<u64, Fail> {
    let words = SELFTEST_LEN / 8;
    let len = u32::try_from(SELFTEST_LEN).map_err(|_| EINVAL)?;
    let mut bytes = 0u64;
    for n in 0..SELFTEST_COPIES {
        let seed = (chan.index as u64) << 48 | u64::from(n) << 32 | 0x5a5a_0000;
        for w in 0..words {
            io_write!(bufs.src, [try: w], seed ^ (w as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            io_write!(bufs.dst, [try: w], 0u64);
        }
        ep.copy(
            chan,
            (bufs.src.dma_address(), bufs.dst.dma_address(), len),
            None,
            (Instant::<Monotonic>::now(), SELFTEST_TIMEOUT_MS),
            None,
        )?;
        for w in 0..words {
            let want = seed ^ (w as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let got: u64 = io_read!(bufs.dst, [try: w]);
            if got != want {
                dev_warn!(
                    ep.pdev,
                    "DMA endpoint channel {}: copy {} reported done, word {} is {:#x}, not {:#x}\n",
                    chan.index,
                    n,
                    w,
                    got,
                    want
                );
                return Err(EIO.into());
            }
        }
        bytes = bytes.saturating_add(u64::from(len));
    }
    Ok(bytes)
}

/// An endpoint as copies reach it: found in [`registry`] by the MEP of the same switch.
#[pin_data]
pub(crate) struct Shared {
    /// Bus and device/function number; the MEP is function 1 of the same slot.
    dev_id: u16,
    /// For mapping user pages for the endpoint's device while it is bound. Counted, not
    /// exclusive ([`Binding`]): a copy holds it for each part, beside registrations.
    binding: Arc<Binding>,
    /// The channels' turn: a copy has it for each part; a copier waits for it
    /// interruptibly, bounded by its own deadline. Unbind closes it and takes it, so it
    /// waits for the running copy and no new copier goes ahead of it.
    #[pin]
    turn: TurnLock,
    /// The channels; `None` once unbind took them. Taken by the copy that has the turn,
    /// and by unbind.
    #[pin]
    ep: Mutex<Option<KBox<Endpoint>>>,
    /// The fabric command path and the registrations; `None` when the endpoint offers no
    /// usable command path, and once unbind took it.
    #[pin]
    fab: Mutex<Option<fabric::Fabric>>,
}

/// The endpoint's entry in [`registry`]: removed, and the channels taken to rest and freed,
/// on drop (at unbind), before the device's binding ends.
struct Registered(Arc<Shared>);

impl Drop for Registered {
    fn drop(&mut self) {
        let me = &self.0;
        let _ = registry::with(|l| {
            l.retain(|s| !Arc::ptr_eq(s, me));
            // The list is a static that module exit never drops: give its buffer back with
            // the last endpoint, or it leaks at every unload.
            if l.is_empty() {
                *l = KVec::new();
            }
        });
        // Waits for a running copy; its queues must not outlive the binding.
        let turn = me.turn.close_and_take();
        // The buffers registered for peers: unregistered, then unmapped and unpinned while
        // the device is still bound.
        let fab = me.fab.lock().take();
        if let Some(mut fab) = fab {
            let bound = me.binding.access();
            match &bound {
                Some(b) => fab.release_owner(None, b.device()),
                None => pr_err!("DMA endpoint unbound before its registrations were released\n"),
            }
            // What the firmware may still write goes only with bus mastering off.
            fab.finish(bound.as_ref().map(|b| b.device()));
        }
        let ep = me.ep.lock().take();
        drop(ep);
        drop(turn);
    }
}

/// Per-binding driver data. Fields drop in declaration order: the sysfs directory, then the
/// endpoint (out of the registry; channels taken to rest before their queues are freed),
/// then the device's enable.
#[pin_data]
pub(crate) struct DmaEpData {
    _dir: DataDir<Summary>,
    _ep: Registered,
    _enabled: kext::pci_enable::EnabledDevice,
}

/// Default bound on a copy for user space, as the MEP's engine has.
const DEFAULT_COPY_TIMEOUT_MS: u32 = 60_000;
/// User memory pinned and mapped per part of a copy.
const USER_CHUNK: u64 = 4 << 20;

/// The endpoint of the switch whose MEP is `mep_pdev`: function 2 of the MEP's slot.
fn endpoint_of(mep_pdev: &pci::Device) -> Result<Arc<Shared>> {
    let slot = mep_pdev.dev_id() & !7;
    registry::with(|l| l.iter().find(|s| s.dev_id & !7 == slot).cloned())?.ok_or(EOPNOTSUPP)
}

/// Where a copy's data goes.
enum Dst {
    /// A user buffer of the caller, pinned and mapped one part at a time.
    User(u64),
    /// A buffer a peer host registered for this one: the peer's bus address of the range
    /// and the descriptor's (destination, source) DFIDs.
    Peer { addr: u64, dfid: u16, sfid: u16 },
}

/// Copies `len` bytes from a user buffer of the caller through the DMA endpoint of the
/// switch whose MEP is `mep_pdev` (`PCIFAB_IOCTL_P2P_COPY` without the firmware's own
/// engine): into another user buffer of the caller (basic mode), or into a buffer a peer
/// host registered for this one (`PCIFAB_P2P_PEER`, fabric mode), checked against the
/// firmware's list of the peer's buffers before any descriptor is written. The source (and
/// a user destination) is pinned long-term and mapped for the endpoint's device one part at
/// a time; each part is copied in entries of at most 1 MiB on the first channel that passed
/// its self-test, each completion polled and checked.
pub(crate) fn copy(
    mep_pdev: &pci::Device,
    src: &uapi::P2pEnd,
    dst: &uapi::P2pEnd,
    len: u64,
    timeout_ms: u32,
) -> Result<Copied> {
    if src.kind != uapi::P2P_USER || src.reserved0 != 0 {
        return Err(EOPNOTSUPP);
    }
    let peer = match dst.kind {
        uapi::P2P_USER if dst.reserved0 == 0 => None,
        uapi::P2P_PEER => Some((dst.pdfid, u8::try_from(dst.reserved0).map_err(|_| EINVAL)?)),
        _ => return Err(EOPNOTSUPP),
    };
    if len == 0 || len > uapi::P2P_MAX_LEN {
        return Err(EINVAL);
    }
    src.addr.checked_add(len).ok_or(EFAULT)?;
    let timeout_ms = match timeout_ms {
        0 => DEFAULT_COPY_TIMEOUT_MS,
        t if t > uapi::P2P_MAX_TIMEOUT_MS => return Err(EINVAL),
        t => t,
    };
    let shared = endpoint_of(mep_pdev)?;
    let target = match peer {
        None => {
            dst.addr.checked_add(len).ok_or(EFAULT)?;
            Dst::User(dst.addr)
        }
        Some((hfid, slot)) => {
            let mut fab = shared.fab.lock();
            let f = (*fab).as_mut().ok_or(EOPNOTSUPP)?;
            let range = f.peer_range(hfid, slot, dst.addr, len)?;
            Dst::Peer {
                addr: range.addr,
                dfid: range.dfid,
                sfid: range.sfid,
            }
        }
    };
    let start = Instant::<Monotonic>::now();
    let mut copied = Copied {
        done: 0,
        status: 0,
        err: None,
    };
    while copied.done < len && copied.err.is_none() {
        let off = copied.done;
        let part = (len - off).min(USER_CHUNK);
        let n = usize::try_from(part).map_err(|_| EINVAL)?;
        // Pinned before any lock: faulting the pages in may take long.
        let pinned = UserPages::pin(src.addr + off, n, DataDirection::ToDevice).and_then(|s| {
            let d = match target {
                Dst::User(a) => Some(UserPages::pin(a + off, n, DataDirection::FromDevice)?),
                Dst::Peer { .. } => None,
            };
            Ok((s, d))
        });
        let (mut sp, mut dp) = match pinned {
            Ok(p) => p,
            Err(e) if off == 0 => return Err(e),
            Err(e) => {
                copied.err = Some(e);
                break;
            }
        };
        let turn = match shared.turn.take_within(start, timeout_ms) {
            Ok(t) => t,
            Err(e) if off == 0 => return Err(e),
            Err(e) => {
                copied.err = Some(e);
                break;
            }
        };
        // The binding is counted, not locked: registrations, unregistrations and closes hold
        // it beside this copy. Unbind ends it only after it closed the turn and took it,
        // so once this copy stopped and gave the turn back, and after the part's pages were
        // unmapped (dropped before `bound`).
        let Some(bound) = shared.binding.access() else {
            copied.err = Some(ENODEV);
            break;
        };
        // A mapping that fails after the first part ends the copy with the bytes done.
        let sm = match sp.map(bound.device()) {
            Ok(m) => m,
            Err(e) if off == 0 => return Err(e),
            Err(e) => {
                copied.err = Some(e);
                break;
            }
        };
        let dm = match dp.as_mut().map(|d| d.map(bound.device())).transpose() {
            Ok(m) => m,
            Err(e) if off == 0 => return Err(e),
            Err(e) => {
                copied.err = Some(e);
                break;
            }
        };
        let mut guard = shared.ep.lock();
        let Some(ep) = (*guard).as_mut() else {
            copied.err = Some(ENODEV);
            break;
        };
        let (dsegs, fab) = match (&dm, &target) {
            (Some(m), _) => (Segs::Mapped(m.segments()), None),
            (None, Dst::Peer { addr, dfid, sfid }) => {
                (Segs::One(Some((addr + off, part))), Some((*dfid, *sfid)))
            }
            (None, Dst::User(_)) => {
                copied.err = Some(EINVAL);
                break;
            }
        };
        let mut chans = core::mem::take(&mut ep.chans);
        let r = copy_part(
            ep,
            &mut chans,
            (&mut sm.segments(), dsegs, part),
            fab,
            (start, timeout_ms),
            &shared.turn,
        );
        ep.chans = chans;
        drop(guard);
        drop(turn);
        match r {
            Ok(()) => copied.done += part,
            Err((at, f, stuck)) => {
                copied.done += at;
                copied.status = f.status;
                // A fabric entry the firmware refused (the buffer went away, a range it
                // does not admit): the peer's side, as a route fault is for the engine.
                copied.err = Some(if fab.is_some() && f.err == EIO && f.status != 0 {
                    EREMOTEIO
                } else {
                    f.err
                });
                if stuck {
                    // The channel may still write into these pages: mapped and pinned for
                    // good rather than handed back for reuse.
                    core::mem::forget(sm);
                    core::mem::forget(dm);
                    core::mem::forget(sp);
                    core::mem::forget(dp);
                }
            }
        }
    }
    Ok(copied)
}

/// The destination's segments of one part.
enum Segs<I> {
    /// A user buffer's mapping.
    Mapped(I),
    /// One range (a peer's buffer), taken once.
    One(Option<(u64, u64)>),
}

impl<I: Iterator<Item = (u64, u64)>> Iterator for Segs<I> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        match self {
            Segs::Mapped(i) => i.next(),
            Segs::One(o) => o.take(),
        }
    }
}

/// Copies one mapped part on the first usable channel (in fabric mode with `fab`); on
/// failure the bytes copied before it and why. A channel whose copy failed is taken to rest
/// and not used again; one that does not come to rest is reported (`true`): the caller then
/// keeps the part's pages mapped and pinned for good. The caller holds the channels' turn
/// `turn`; its closing (unbind) ends the copy with `ENODEV`.
fn copy_part(
    ep: &Endpoint,
    chans: &mut KVec<Chan>,
    (si, mut di, part): (
        &mut dyn Iterator<Item = (u64, u64)>,
        impl Iterator<Item = (u64, u64)>,
        u64,
    ),
    fab: Option<(u16, u16)>,
    (start, timeout_ms): (Instant<Monotonic>, u32),
    turn: &TurnLock,
) -> Result<(), (u64, Fail, bool)> {
    let Some(chan) = chans.iter_mut().find(|c| c.ok) else {
        return Err((0, EOPNOTSUPP.into(), false));
    };
    let (mut s, mut d) = (si.next(), di.next());
    let mut at = 0u64;
    while at < part {
        let (Some((sa, sl)), Some((da, dl))) = (s, d) else {
            return Err((at, EIO.into(), false));
        };
        let n = sl.min(dl).min(u64::from(r::SE_MAX_BYTES)).min(part - at);
        if n == 0 {
            return Err((at, EIO.into(), false));
        }
        // At most 1 MiB: fits.
        let n32 = n as u32;
        let deadline = (start, i64::from(timeout_ms));
        if let Err(f) = ep.copy(chan, (sa, da, n32), fab, deadline, Some(turn)) {
            chan.ok = false;
            let stuck = !ep.quiet(chan.index);
            if stuck {
                dev_err!(
                    ep.pdev,
                    "DMA endpoint channel {} does not halt after a failed copy\n",
                    chan.index
                );
            }
            return Err((at, f, stuck));
        }
        at += n;
        s = if sl > n {
            Some((sa + n, sl - n))
        } else {
            si.next()
        };
        d = if dl > n {
            Some((da + n, dl - n))
        } else {
            di.next()
        };
    }
    Ok(())
}

/// Registers the caller's buffer of `len` bytes at `addr` for the peer host `peer` (its
/// HFID) with the DMA endpoint of the switch whose MEP is `mep_pdev`, for the open file
/// `owner`: pinned long-term, mapped for the endpoint's device as one range, in the peer's
/// lowest free slot. Returns the slot and this host's HFID.
pub(crate) fn register(
    mep_pdev: &pci::Device,
    owner: u64,
    peer: u16,
    addr: u64,
    len: u64,
) -> Result<(u8, u16), FabFail> {
    if len == 0 || len > uapi::P2P_MAX_LEN {
        return Err(EINVAL.into());
    }
    addr.checked_add(len).ok_or(EFAULT)?;
    let n = usize::try_from(len).map_err(|_| EINVAL)?;
    let shared = endpoint_of(mep_pdev)?;
    // Pinned before any lock: faulting the pages in may take long. The peer writes them.
    let pages = UserPages::pin(addr, n, DataDirection::FromDevice)?;
    let bound = shared.binding.access().ok_or(ENODEV)?;
    let dma = pages.map_held(bound.device())?;
    let mut fab = shared.fab.lock();
    let Some(f) = (*fab).as_mut() else {
        dma.release(bound.device());
        return Err(EOPNOTSUPP.into());
    };
    if peer == f.hfid {
        dma.release(bound.device());
        return Err(EINVAL.into());
    }
    let hfid = f.hfid;
    f.register(owner, peer, dma, bound.device())
        .map(|slot| (slot, hfid))
}

/// Unregisters the buffer the open file `owner` registered for `peer` in `slot`; its pages
/// are unmapped and unpinned once the firmware answered. Returns this host's HFID.
pub(crate) fn unregister(
    mep_pdev: &pci::Device,
    owner: u64,
    peer: u16,
    slot: u8,
) -> Result<u16, FabFail> {
    let shared = endpoint_of(mep_pdev)?;
    let bound = shared.binding.access().ok_or(ENODEV)?;
    let mut fab = shared.fab.lock();
    let f = (*fab).as_mut().ok_or(EOPNOTSUPP)?;
    let hfid = f.hfid;
    f.unregister(owner, peer, slot, bound.device())
        .map(|()| hfid)
}

/// Unregisters every buffer the open file `owner` registered (it is being closed).
pub(crate) fn release_owner(mep_pdev: &pci::Device, owner: u64) {
    let Ok(shared) = endpoint_of(mep_pdev) else {
        return;
    };
    // Only this file registers for itself, and it is being closed: nothing is added
    // meanwhile.
    if !shared.fab.lock().as_ref().is_some_and(|f| f.owns(owner)) {
        return;
    }
    let Some(bound) = shared.binding.access() else {
        return;
    };
    let mut fab = shared.fab.lock();
    if let Some(f) = (*fab).as_mut() {
        f.release_owner(Some(owner), bound.device());
    }
}

pub(crate) struct DmaEpDriver;

// DMA endpoints are matched by vendor and exact class (0x088000), as Linux's switchtec_dma
// does; the part (PAX only) is checked in probe.
kernel::pci_device_table!(
    PCI_TABLE,
    <DmaEpDriver as pci::Driver>::IdInfo,
    [(
        pci::DeviceId::from_class_and_vendor(
            pci::Class::SYSTEM_OTHER,
            pci::ClassMask::Full,
            pci::Vendor::MICROSEMI,
        ),
        ()
    )]
);

impl pci::Driver for DmaEpDriver {
    type IdInfo = ();
    type Data<'bound> = DmaEpData;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        pin_init::pin_init_scope(move || {
            if !is_pax(pdev.device_id()) {
                dev_info!(
                    pdev,
                    "DMA endpoint of device {:#06x}, not a PAX part: left to switchtec_dma\n",
                    pdev.device_id()
                );
                return Err(ENODEV);
            }
            // Disabled again when probe fails below or the driver unbinds (dropped last).
            let enabled = kext::pci_enable::EnabledDevice::new(pdev)?;
            let bar = pdev
                .iomap_region_sized::<BAR0_SIZE>(0, c"pcifab-dmaep")
                .inspect_err(|_| {
                    dev_err!(pdev, "BAR0 is not a {} byte register space\n", BAR0_SIZE)
                })?
                .into_devres()?;
            let bar = Arc::new(bar, GFP_KERNEL)?;
            let mut ep = Endpoint {
                pdev: pdev.into(),
                bar: bar.clone(),
                chans: KVec::new(),
            };
            let (fw_version, protocol, count) = ep.with_bar(|bar| {
                (
                    bar.read(r::FW_VER).into_raw(),
                    bar.read(r::DMA_PROT_VER).into_raw(),
                    bar.read(r::CHAN_CNT).into_raw(),
                )
            })?;
            if fw_version == u32::MAX && count == u32::MAX {
                dev_err!(pdev, "DMA endpoint reads all ones: device gone\n");
                return Err(ENODEV);
            }
            let count = match usize::try_from(count) {
                Ok(c) if c <= MAX_CHANNELS => c,
                _ => {
                    dev_err!(
                        pdev,
                        "DMA endpoint reports {} channels; its registers have room for {}\n",
                        count,
                        MAX_CHANNELS
                    );
                    return Err(ENODEV);
                }
            };
            // Before bus mastering: a previous kernel may have left channels running on
            // queues that are no longer its.
            for i in 0..count {
                let valid = ep.read_valid(i)?;
                if valid.into_raw() == u32::MAX {
                    dev_err!(pdev, "DMA endpoint reads all ones: device gone\n");
                    return Err(ENODEV);
                }
                if valid.valid() && !ep.quiet(i) {
                    dev_err!(pdev, "DMA endpoint channel {} does not halt\n", i);
                    return Err(EIO);
                }
            }
            // No segment limit: copies split their entries at 1 MiB themselves, and the
            // user pages' table merges contiguous pages into segments of any length.
            kext::dma::set_masks(pdev, DmaMask::new::<64>(), u32::MAX)?;
            pdev.set_master();

            let dev: &kernel::device::Device<kernel::device::Bound> = pdev.as_ref();
            let words = SELFTEST_LEN / 8;
            // Freed below only once every channel that had them is at rest; an early return
            // leaks them rather than free what a channel might still write.
            let bufs = ManuallyDrop::new(Buffers {
                src: Coherent::<u64>::zeroed_slice(dev, words, GFP_KERNEL)?,
                dst: Coherent::<u64>::zeroed_slice(dev, words, GFP_KERNEL)?,
            });
            let mut outcomes = KVec::with_capacity(count, GFP_KERNEL)?;
            ep.chans.reserve(count, GFP_KERNEL)?;
            let mut all_at_rest = true;
            for i in 0..count {
                let valid = ep.read_valid(i)?;
                if valid.into_raw() == u32::MAX {
                    return Err(ENODEV);
                }
                if !valid.valid() {
                    outcomes.push(Outcome::Absent, GFP_KERNEL)?;
                    continue;
                }
                let outcome = match ep.bring_up(dev, i) {
                    Err(err) => Outcome::Failed { err, status: 0 },
                    Ok(mut chan) => {
                        let r = selftest(&ep, &mut chan, &bufs);
                        let outcome = match r {
                            Ok(bytes) => {
                                chan.ok = true;
                                Outcome::Ok { bytes }
                            }
                            Err(f) => {
                                dev_warn!(
                                    pdev,
                                    "DMA endpoint channel {}: self-test failed: errno {}, status {:#x}\n",
                                    i,
                                    f.err.to_errno(),
                                    f.status
                                );
                                // Stopped now: nothing of the test may land later.
                                if !ep.quiet(i) {
                                    all_at_rest = false;
                                }
                                Outcome::Failed {
                                    err: f.err,
                                    status: f.status,
                                }
                            }
                        };
                        // Capacity reserved above: the push cannot fail.
                        if let Err(e) = ep.chans.push_within_capacity(chan) {
                            ep.park(e.0);
                        }
                        outcome
                    }
                };
                outcomes.push(outcome, GFP_KERNEL)?;
            }
            if all_at_rest {
                drop(ManuallyDrop::into_inner(bufs));
            }
            let ok = outcomes
                .iter()
                .filter(|o| matches!(o, Outcome::Ok { .. }))
                .count();
            dev_info!(
                pdev,
                "DMA endpoint: firmware {:#010x}, protocol {}, {} of {} channels pass the self-test\n",
                fw_version,
                protocol,
                ok,
                count
            );
            // Fabric mode: the command path, and no buffer left registered by an earlier
            // load (its pages are no longer pinned). An endpoint whose path does not work
            // still copies within the host.
            let fab = match fabric::Fabric::new(pdev, dev, bar) {
                // Nothing of the host's is registered after the purge: what an earlier
                // binding kept pinned for want of an answer may go.
                Ok(mut f) => match f.purge().and_then(|()| f.release_limbo(dev)) {
                    Ok(()) => Some(f),
                    Err(e) => {
                        dev_warn!(
                            pdev,
                            "DMA endpoint: fabric command path unusable: errno {}\n",
                            e.to_errno()
                        );
                        if f.hung() {
                            // The firmware may still write the output buffer.
                            core::mem::forget(f);
                        }
                        None
                    }
                },
                Err(e) => {
                    dev_warn!(
                        pdev,
                        "DMA endpoint: no fabric command path: errno {}\n",
                        e.to_errno()
                    );
                    None
                }
            };
            let summary = Summary {
                fw_version,
                protocol,
                hfid: fab.as_ref().map(|f| f.hfid),
                outcomes,
            };
            let binding = Binding::new(pdev.as_ref())?;
            let ep = KBox::new(ep, GFP_KERNEL)?;
            let shared = Arc::pin_init(
                pin_init!(Shared {
                    dev_id: pdev.dev_id(),
                    binding,
                    turn <- TurnLock::new(),
                    ep <- new_mutex!(Some(ep)),
                    fab <- new_mutex!(fab),
                }),
                GFP_KERNEL,
            )?;
            let registered = Registered(shared.clone());
            registry::with(|l| l.push(shared, GFP_KERNEL))??;
            let dir = DataDir::in_device(&KTYPE, pdev.as_ref(), c"pcifab", summary)?;
            Ok(try_pin_init!(DmaEpData {
                _dir: dir,
                _ep: registered,
                _enabled: enabled,
            }))
        })
    }
}
