// SPDX-License-Identifier: GPL-2.0-only

//! Events: the interrupt handler, counters, and waking pollers and waiters.
//!
//! One vector (MSI-X, MSI or a shared INTx), the one `part_cfg.vep_vector_number` names,
//! carries every event of this partition. The handler looks at the event headers pcifab
//! enabled: MRPC completion (`part_cfg.mrpc_comp_hdr`), fabric-manager events
//! (`sw_event.gfms_event_hdr`) and the link state of the partition's upstream and downstream
//! ports (`pff_csr[n].link_state_hdr`). For each that occurred it writes the header back,
//! which clears "occurred" and keeps the interrupt enabled, counts it and wakes whoever waits.
//!
//! A function-level or bus reset of the MEP (or the switch resetting it) puts the event
//! headers back to their power-on values, interrupts off, and the PCI core restores config
//! space only; the kernel crate's PCI driver has no `reset_done` to hear of it. Every
//! [`CHECK_MS`] a work item ([`check`]) reads the fabric-manager event header, which pcifab
//! never leaves without its interrupt while events are on: when it lost it, the device was
//! reset, and the work sets every event up again and services what occurred meanwhile.

use kernel::{
    io::{register::Array, Io},
    irq::{self, IrqReturn},
    new_mutex, new_poll_condvar, new_spinlock_irq,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        poll::PollCondVar,
        Arc, CondVarTimeoutResult, Mutex, SpinLockIrq,
    },
    time::{msecs_to_jiffies, Instant, Monotonic},
    workqueue::{impl_has_delayed_work, impl_has_work, WorkItem},
};

use crate::{fabric::Fabric, headers::Pffs, kext, regs, Bar0, Mep};

/// Event counters since probe.
#[derive(Clone, Copy, Default)]
pub(crate) struct Counts {
    /// Interrupts that found at least one event.
    pub(crate) irqs: u64,
    /// Events other than MRPC completions (link and fabric-manager events).
    pub(crate) total: u64,
    /// Link-state events of this partition's ports.
    pub(crate) link: u64,
    /// Fabric-manager (GFMS) events: bindings, devices, the fabric database changed.
    pub(crate) gfms: u64,
}

/// What [`Events::state`] guards.
struct State {
    counts: Counts,
    /// The endpoint is going away: waiters and pollers get `ENODEV` / error and hang-up.
    gone: bool,
}

/// Event state of one endpoint.
#[pin_data]
pub(crate) struct Events {
    #[pin]
    state: SpinLockIrq<State>,
    /// Woken on every event and when the endpoint goes away; `poll()` waits on it too.
    #[pin]
    changed: PollCondVar,
    /// The interrupt handler found the registers reading all ones (logged once).
    gone_seen: Atomic<bool>,
    /// Held while the event headers' interrupts are set ([`enable`], [`check`]), so that the
    /// check cannot turn them on again after unbind turned them off.
    #[pin]
    setup: Mutex<()>,
    /// Held while the event headers are read and cleared ([`service`]): the interrupt
    /// handler and the check after a reset may both look.
    #[pin]
    scanning: SpinLockIrq<()>,
}

impl Events {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            state <- new_spinlock_irq!(State {
                counts: Counts::default(),
                gone: false,
            }),
            changed <- new_poll_condvar!(),
            gone_seen: Atomic::new(false),
            setup <- new_mutex!(()),
            scanning <- new_spinlock_irq!(()),
        })
    }

    pub(crate) fn counts(&self) -> Counts {
        self.state.lock().counts
    }

    /// Whether the endpoint is going away.
    pub(crate) fn gone(&self) -> bool {
        self.state.lock().gone
    }

    /// The condition variable `poll()` registers on.
    pub(crate) fn poll_cv(&self) -> &PollCondVar {
        &self.changed
    }

    /// Waits until more than `seen` events happened, for at most `timeout_ms` (0: no limit).
    ///
    /// # Errors
    ///
    /// `EINTR` if a signal arrived first, `ENODEV` once the endpoint is going away. A timeout
    /// is not an error: the counts say nothing new happened.
    pub(crate) fn wait(&self, seen: u64, timeout_ms: u32) -> Result<Counts> {
        let start = Instant::<Monotonic>::now();
        let mut guard = self.state.lock();
        loop {
            if guard.gone {
                return Err(ENODEV);
            }
            if guard.counts.total > seen {
                break;
            }
            let left = if timeout_ms == 0 {
                i64::from(u32::MAX)
            } else {
                i64::from(timeout_ms).saturating_sub(start.elapsed().as_millis())
            };
            if left <= 0 {
                break;
            }
            let jiffies = msecs_to_jiffies(u32::try_from(left).unwrap_or(u32::MAX));
            if let CondVarTimeoutResult::Signal { .. } =
                self.changed.wait_interruptible_timeout(&mut guard, jiffies)
            {
                return Err(EINTR);
            }
        }
        Ok(guard.counts)
    }

    /// Ends every wait with `ENODEV` and makes `poll()` report error and hang-up, for good:
    /// the endpoint is going away.
    pub(crate) fn shut_down(&self) {
        self.state.lock().gone = true;
        self.changed.notify_all();
    }

    /// Queues the next [`check`] of `mep` in [`CHECK_MS`], unless the endpoint is going
    /// away: decided under the state lock that [`Events::shut_down`] sets `gone` under, so
    /// none is queued after it (and [`stop_check`] then waits for the last one).
    fn queue_check(&self, mep: Arc<Mep>) {
        let refused = {
            let state = self.state.lock();
            if state.gone {
                None
            } else {
                kext::workqueue::driver()
                    .enqueue_delayed::<Arc<Mep>, 2>(mep, msecs_to_jiffies(CHECK_MS))
                    .err()
            }
        };
        // Already queued: the reference comes back, dropped here outside the lock.
        drop(refused);
    }
}

/// How often [`check`] looks for event set-up that a reset of the device took.
const CHECK_MS: u32 = 1000;

/// Starts the periodic [`check`]; at probe, once the events are on.
pub(crate) fn start_check(mep: &Arc<Mep>) {
    mep.events.queue_check(mep.clone());
}

/// Waits for the last [`check`]; after [`Events::shut_down`], which stops it queueing itself
/// again. The check takes no lock a hot-plug removal holds, so this may wait for it there too.
pub(crate) fn stop_check(mep: &Mep) {
    kext::workqueue::flush_delayed(&mep.events_check);
}

/// Whether the device lost the event set-up: the fabric-manager event header, whose
/// interrupt pcifab keeps on while events are on, reads with it off (and not all ones, as a
/// device that is gone reads).
fn setup_lost(mep: &Mep) -> bool {
    mep.with_bar(|bar| bar.read(regs::SW_GFMS_EVENT_HDR))
        .is_ok_and(|hdr| hdr.into_raw() != u32::MAX && !hdr.irq_enable())
}

/// Sets the event interrupts up again when a reset of the device turned them off, then
/// services the events that occurred while they were off (they stay "occurred" in their
/// headers, but raised no interrupt).
fn check(mep: &Arc<Mep>) {
    {
        let _setup = mep.events.setup.lock();
        if mep.events.gone() || !mep.mrpc.events_on() || !setup_lost(mep) {
            return;
        }
        dev_warn!(
            mep.pdev,
            "event interrupts lost their set-up (device reset); setting them up again\n"
        );
        if let Err(e) = program(mep, true, false) {
            dev_warn!(mep.pdev, "event set-up failed: {:?}\n", e);
            return;
        }
    }
    let _ = service(mep, false);
}

/// What one pass over the event headers found.
#[derive(Default)]
struct Found {
    mrpc: bool,
    /// P2P events that were set (and cleared).
    p2p: Option<regs::P2P_EVENT_STATUS>,
    link: u64,
    gfms: u64,
}

/// Reads every enabled event header and clears those whose event occurred.
///
/// Writing a header back clears "occurred" and keeps its interrupt enabled.
/// Tells the fabric view before a fabric or link event is cleared, so that a reader of the
/// view sees either the event still pending ([`crate::headers::pending`]) or the mark.
fn scan(
    bar: &Bar0<'_>,
    partition: usize,
    pffs: &Pffs,
    p2p: bool,
    fabric: &Fabric,
) -> Result<Found> {
    let mut found = Found::default();

    let mrpc_loc = || regs::PART_MRPC_COMP_HDR::try_at(partition).ok_or(EINVAL);
    let hdr = bar.read(mrpc_loc()?);
    // A device that left the bus (surprise removal) reads all ones: every "occurred" bit set.
    // Nothing is written back, counted or woken for it.
    if hdr.into_raw() == u32::MAX {
        return Err(ENODEV);
    }
    if hdr.occurred() {
        bar.write(mrpc_loc()?, hdr);
        found.mrpc = true;
    }

    // The P2P block exists only where the firmware said so (`P2P_CAPS`, read at probe).
    if p2p {
        let ev = bar.read(regs::P2P_EVENT_STATUS);
        if ev.into_raw() == u32::MAX {
            return Err(ENODEV);
        }
        if ev.any() {
            bar.write_reg(ev);
            found.p2p = Some(ev);
        }
    }

    let hdr = bar.read(regs::SW_GFMS_EVENT_HDR);
    if hdr.into_raw() == u32::MAX {
        return Err(ENODEV);
    }
    if hdr.occurred() {
        fabric.events_signalled();
        bar.write_reg(hdr);
        found.gfms += 1;
    }

    for &pff in pffs {
        let loc = || regs::PFF_LINK_STATE_HDR::try_at(pff as usize);
        let Some(at) = loc() else {
            continue;
        };
        let hdr = bar.read(at);
        if hdr.into_raw() == u32::MAX {
            return Err(ENODEV);
        }
        if hdr.occurred() {
            fabric.invalidate();
            if let Some(at) = loc() {
                bar.write(at, hdr);
            }
            found.link += 1;
        }
    }
    Ok(found)
}

/// Enables (or disables) the interrupts of every event pcifab handles, clearing stale ones.
pub(crate) fn enable(mep: &Mep, on: bool) -> Result {
    let _setup = mep.events.setup.lock();
    program(mep, on, true)
}

/// Writes the interrupt enable of every event header pcifab handles; `clear` also clears
/// their "occurred" (at probe and unbind; not after a reset, whose events are still to be
/// serviced).
fn program(mep: &Mep, on: bool, clear: bool) -> Result {
    let pffs = mep.pffs();
    // On only while commands complete in the mailbox (see there).
    mep.mrpc.set_completion_irq(mep, on)?;
    mep.with_bar(|bar| -> Result {
        bar.write_reg(
            regs::SW_GFMS_EVENT_HDR::zeroed()
                .with_occurred(clear)
                .with_irq_enable(on),
        );
        for &pff in pffs {
            if let Some(loc) = regs::PFF_LINK_STATE_HDR::try_at(pff as usize) {
                bar.write(
                    loc,
                    regs::PFF_LINK_STATE_HDR::zeroed()
                        .with_occurred(clear)
                        .with_irq_enable(on),
                );
            }
        }
        Ok(())
    })?
}

/// The event vector this partition's firmware raises.
pub(crate) fn vector(mep: &Mep) -> Result<usize> {
    mep.with_bar(|bar| -> Result<usize> {
        let loc = regs::PART_VEP_VECTOR::try_at(mep.partition).ok_or(EINVAL)?;
        Ok(usize::from(u16::from(bar.read(loc).vector())))
    })?
}

/// The handler registered on the event vector.
pub(crate) struct Handler {
    pub(crate) mep: Arc<Mep>,
}

impl irq::Handler for Handler {
    fn handle(&self) -> IrqReturn {
        service(&self.mep, true)
    }
}

/// Reads and clears the event headers, counts what occurred and wakes whoever waits for it:
/// the interrupt handler (`irq`), and [`check`] after a reset.
fn service(mep: &Arc<Mep>, irq: bool) -> IrqReturn {
    let p2p = mep.p2p.window_size() != 0;
    let found = {
        let _scanning = mep.events.scanning.lock();
        mep.with_bar(|bar| scan(bar, mep.partition, mep.pffs(), p2p, &mep.fabric))
    };
    let found = match found {
        Ok(Ok(found)) => found,
        Ok(Err(e)) if e == ENODEV => {
            // Said once: a shared line may bring the handler here again and again.
            if !mep.events.gone_seen.xchg(true, Relaxed) {
                dev_warn!(
                    mep.pdev,
                    "event registers read all ones: the device is gone; interrupt not handled\n"
                );
            }
            return IrqReturn::None;
        }
        _ => return IrqReturn::None,
    };
    let other = found.link.saturating_add(found.gfms);
    if let Some(ev) = found.p2p {
        mep.p2p.on_events(ev);
    }
    if !found.mrpc && other == 0 {
        return if found.p2p.is_some() {
            IrqReturn::Handled
        } else {
            IrqReturn::None
        };
    }
    {
        // Counters of events since probe: they cannot wrap in the life of a machine, and
        // wrapping would only confuse a reader, so no check can fail here.
        let c = &mut mep.events.state.lock().counts;
        if irq {
            c.irqs = c.irqs.wrapping_add(1);
        }
        c.link = c.link.wrapping_add(found.link);
        c.gfms = c.gfms.wrapping_add(found.gfms);
        c.total = c.total.wrapping_add(other);
    }
    if found.mrpc {
        mep.mrpc.complete();
    }
    if other != 0 {
        mep.events.changed.notify_all();
        crate::fnsysfs::queue(mep);
    }
    if found.gfms != 0 {
        // Already queued is fine: the running or queued work reads every event.
        let _ = kext::workqueue::driver().enqueue::<Arc<Mep>, 0>(mep.clone());
    }
    IrqReturn::Handled
}

impl_has_work! {
    impl HasWork<Self> for Mep { self.gfms_work }
}

impl_has_delayed_work! {
    impl HasDelayedWork<Self, 2> for Mep { self.events_check }
}

impl WorkItem<2> for Mep {
    type Pointer = Arc<Mep>;

    fn run(this: Arc<Mep>) {
        check(&this);
        this.events.queue_check(this.clone());
    }
}

impl WorkItem for Mep {
    type Pointer = Arc<Mep>;

    fn run(this: Arc<Mep>) {
        this.handle_gfms_events();
    }
}

/// Waits until the fabric-event work is not running; called on unbind, after which it can
/// no longer be queued (the interrupt is gone).
pub(crate) fn flush_work(mep: &Mep) {
    kext::workqueue::flush(&mep.gfms_work);
}
