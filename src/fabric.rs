// SPDX-License-Identifier: GPL-2.0-only

//! The driver's view of the fabric: physical ports and every endpoint function (PFs and VFs)
//! with what each is bound to.
//!
//! It is read with PAX commands only: the topology dump ([`fw::topo`]) for the ports and the
//! fabric database ([`fw::gfms`], PAX_ALL) for the hosts and every endpoint's functions. The
//! view is cached and read again when a link event arrived, when a fabric event came that its
//! data cannot describe, when this host's own binding change is not shown once the events
//! queued so far are applied, or when the view is older than
//! [`MAX_AGE_MS`] (a change the firmware signals to no host of ours, such as another host's
//! link, is seen within that time). Every length the firmware reports is checked; a reply that
//! does not add up is `EIO`, never an out-of-bounds access.
//!
//! A binding made or undone anywhere in the fabric costs a constant number of commands, not a
//! read of the whole fabric: the firmware's BIND and UNBIND events name the function, the
//! host's upstream port and the logical port, and the next reader of the view (or the
//! fabric-event work, whichever comes first) reads the event queue ([`Fabric::drain`]) and
//! applies them to the cached view. Anything the events cannot describe (another event code,
//! a function or host the view does not know, a dropped event, a failed read of the queue)
//! makes the view stale instead.
//!
//! This host's own binds and unbinds take the same path ([`Fabric::own_change`]): the
//! firmware's event for each is applied in its place among the others, and a reader that
//! finds the view not yet showing the change reads the whole fabric
//! (`Documentation/design.rst`, "The view after this host's own bind").

use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Mutex, MutexGuard,
    },
};

use kernel::time::{Delta, Instant, Monotonic};

use crate::{fw, fw::event, uapi, Mep};

/// The oldest view served without reading the fabric again, unless set otherwise
/// ([`Fabric::set_max_age_ms`], sysfs `view_max_age_ms`).
pub(crate) const MAX_AGE_MS: u32 = 1_000;
/// The largest age that can be set: a minute.
pub(crate) const MAX_AGE_LIMIT_MS: u32 = 60_000;
/// Event-queue reads one drain makes at most (32 events each).
const DRAIN_BATCHES: usize = 16;
/// Binding changes kept for the view at most; past that the view is read again.
const MAX_CHANGES: usize = 512;
/// Unbind requests kept for the fabric-event work at most; the firmware sends one per
/// function it takes from this host, so more than that is a firmware that floods.
const MAX_REQUESTS: usize = 256;
/// This host's own binding changes kept for the next reader at most; past that the view is
/// read again.
const MAX_OWN: usize = 64;

/// One physical port.
#[derive(Clone, Copy, Default)]
pub(crate) struct Port {
    pub(crate) phys: u8,
    pub(crate) kind: u8,
    pub(crate) link_up: bool,
    pub(crate) width: u8,
    pub(crate) rate: u8,
}

/// `Function::flags`: a virtual function.
pub(crate) const FN_VF: u8 = 1 << 0;
/// `Function::flags`: bound to a host.
pub(crate) const FN_BOUND: u8 = 1 << 1;
/// `Function::flags`: the link of its physical port is up.
pub(crate) const FN_LINK_UP: u8 = 1 << 2;

/// One endpoint function, named by its PDFID.
#[derive(Clone, Copy, Default)]
pub(crate) struct Function {
    pub(crate) pdfid: u16,
    pub(crate) pf_pdfid: u16,
    pub(crate) vendor: u16,
    pub(crate) device: u16,
    pub(crate) class: u32,
    pub(crate) phys_port: u8,
    pub(crate) vf_index: u8,
    pub(crate) total_vfs: u8,
    pub(crate) flags: u8,
    pub(crate) bound_host: u8,
    pub(crate) bound_log_port: u8,
}

/// A host's virtual switch: its upstream port and index.
#[derive(Clone, Copy, Default)]
pub(crate) struct Host {
    pub(crate) index: u8,
    pub(crate) usp_port: u8,
}

/// A function bound or unbound somewhere in the fabric, as a BIND or UNBIND event says.
#[derive(Clone, Copy)]
struct Change {
    pdfid: u16,
    /// `(host's upstream port, logical port)` for a bind, `None` for an unbind.
    to: Option<(u8, u8)>,
}

/// A binding change this host made itself and the firmware accepted ([`Fabric::own_change`]):
/// what the view must show once the firmware's own event for it is applied.
#[derive(Clone, Copy)]
struct Own {
    pdfid: u16,
    /// The host (index) and its logical port.
    host: u8,
    port: u8,
    /// Bound there (a bind), or unbound, the port left empty (an unbind).
    bound: bool,
}

/// Whether `view` shows `o`: for a bind, the function bound to that host's port; for an
/// unbind, the function bound nowhere and no function left on that port.
fn shows(view: &View, o: &Own) -> bool {
    let Some(f) = view.functions.iter().find(|f| f.pdfid == o.pdfid) else {
        return false;
    };
    if o.bound {
        f.flags & FN_BOUND != 0 && f.bound_host == o.host && f.bound_log_port == o.port
    } else {
        f.flags & FN_BOUND == 0
            && !view.functions.iter().any(|g| {
                g.flags & FN_BOUND != 0 && g.bound_host == o.host && g.bound_log_port == o.port
            })
    }
}

/// An `UNBIND_REQUEST` for one of this host's functions: `(upstream port, logical port,
/// PDFID)` as the event names them.
pub(crate) type Request = (u8, u8, u16);

/// What was read from the firmware's event queue and not yet used.
struct Queue {
    /// Binding changes, oldest first, not yet applied to the view.
    changes: KVec<Change>,
    /// The queue held something the changes cannot describe: read the whole fabric.
    reread: bool,
    /// Unbind requests for the fabric-event work.
    requests: KVec<Request>,
    /// This host's own binding changes since the last reader, oldest first.
    own: KVec<Own>,
}

/// Applies one change to `view`; `false` if the view does not know the function or host.
fn apply(view: &mut View, c: &Change) -> bool {
    let host = match c.to {
        Some((usp, _)) => match view.hosts.iter().find(|h| h.usp_port == usp) {
            Some(h) => h.index,
            None => return false,
        },
        None => uapi::UNBOUND,
    };
    let Some(f) = view.functions.iter_mut().find(|f| f.pdfid == c.pdfid) else {
        return false;
    };
    match c.to {
        Some((_, port)) => {
            f.flags |= FN_BOUND;
            f.bound_host = host;
            f.bound_log_port = port;
        }
        None => {
            f.flags &= !FN_BOUND;
            f.bound_host = uapi::UNBOUND;
            f.bound_log_port = uapi::UNBOUND;
        }
    }
    true
}

/// A consistent snapshot of the fabric.
pub(crate) struct View {
    /// Counts the driver's reads of a changed fabric.
    pub(crate) generation: u32,
    pub(crate) host_count: u8,
    pub(crate) partition: u8,
    pub(crate) link_up_map: u64,
    pub(crate) ports: KVec<Port>,
    pub(crate) hosts: KVec<Host>,
    pub(crate) functions: KVec<Function>,
    /// When the view was read; `None` until it first is.
    read_at: Option<Instant<Monotonic>>,
}

/// The cached view and its refresh logic.
#[pin_data]
pub(crate) struct Fabric {
    #[pin]
    view: Mutex<View>,
    /// The view must be read again: a link event, a binding of this host's whose outcome is
    /// unknown, or events that cannot be applied.
    stale: Atomic<bool>,
    /// The firmware signalled fabric events that nobody has read from its queue yet.
    unread: Atomic<bool>,
    /// The oldest view served without reading the fabric again, in milliseconds.
    max_age_ms: Atomic<u32>,
    /// Events read from the firmware's queue, for the view and the fabric-event work. Taken
    /// after the view's lock, never before it.
    #[pin]
    queue: Mutex<Queue>,
    /// Held across a multi-step firmware dump session (START to FINISH), the driver's and a
    /// raw caller's, so that neither runs a step inside the other's.
    #[pin]
    session: Mutex<()>,
}

/// Die temperature in hundredths of a degree Celsius.
pub(crate) fn die_temperature(mep: &Mep) -> Result<u32> {
    Ok(fw::query(mep, &fw::sys::DieTempGet::new())?.centi)
}

/// Reads the ports and the database and puts them together.
fn read(mep: &Mep, view: &mut View) -> Result {
    let (topo, db) = {
        let _session = mep.fabric.session();
        (fw::topo::ports(mep)?, fw::gfms::pax_all(mep)?)
    };
    let mut link_up_map = 0u64;
    let mut ports = KVec::with_capacity(topo.len(), GFP_KERNEL)?;
    for p in &topo {
        if p.link_up() && p.phys_port_id < 64 {
            link_up_map |= 1 << p.phys_port_id;
        }
        ports.push(
            Port {
                phys: p.phys_port_id,
                kind: p.port_type,
                link_up: p.link_up(),
                width: p.neg_width,
                rate: p.neg_rate,
            },
            GFP_KERNEL,
        )?;
    }
    let mut hosts = KVec::with_capacity(db.hvds.len(), GFP_KERNEL)?;
    for h in &db.hvds {
        hosts.push(
            Host {
                index: h.inst,
                usp_port: h.phy_pid,
            },
            GFP_KERNEL,
        )?;
    }
    let mut functions = KVec::with_capacity(db.functions.len(), GFP_KERNEL)?;
    for f in &db.functions {
        let r = &f.rec;
        // The host is named by its upstream port; a binding to a host the database does not
        // list is shown bound to nobody in particular.
        let bound_host = if r.bound != 0 {
            hosts
                .iter()
                .find(|h| h.usp_port == r.bound_hvd_phy_pid)
                .map_or(uapi::UNBOUND, |h| h.index)
        } else {
            uapi::UNBOUND
        };
        let link_up = f.phy_pid < 64 && link_up_map & (1 << f.phy_pid) != 0;
        let mut flags = 0;
        if f.pf.is_some() {
            flags |= FN_VF;
        }
        if r.bound != 0 {
            flags |= FN_BOUND;
        }
        if link_up {
            flags |= FN_LINK_UP;
        }
        functions.push(
            Function {
                pdfid: r.pdfid,
                pf_pdfid: f.pf.map_or(r.pdfid, |p| p.0),
                vendor: r.vid,
                device: r.did,
                class: r.class(),
                phys_port: f.phy_pid,
                vf_index: f.pf.map_or(0, |p| p.1),
                total_vfs: f.total_vfs,
                flags,
                bound_host,
                bound_log_port: if r.bound != 0 {
                    r.bound_hvd_log_pid
                } else {
                    uapi::UNBOUND
                },
            },
            GFP_KERNEL,
        )?;
    }
    view.generation = view.generation.wrapping_add(1);
    view.host_count = db.general.hvd_count;
    view.partition = u8::try_from(mep.partition).map_err(|_| EINVAL)?;
    view.link_up_map = link_up_map;
    view.ports = ports;
    view.hosts = hosts;
    view.functions = functions;
    Ok(())
}

impl Fabric {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            view <- new_mutex!(View {
                generation: 0,
                host_count: 0,
                partition: 0,
                link_up_map: 0,
                ports: KVec::new(),
                hosts: KVec::new(),
                functions: KVec::new(),
                read_at: None,
            }),
            stale: Atomic::new(true),
            unread: Atomic::new(false),
            max_age_ms: Atomic::new(MAX_AGE_MS),
            queue <- new_mutex!(Queue {
                changes: KVec::new(),
                reread: false,
                requests: KVec::new(),
                own: KVec::new(),
            }),
            session <- new_mutex!(()),
        })
    }

    /// Excludes every other dump session while the guard lives.
    pub(crate) fn session(&self) -> MutexGuard<'_, ()> {
        self.session.lock()
    }

    /// The oldest view served without reading the fabric again, in milliseconds.
    pub(crate) fn max_age_ms(&self) -> u32 {
        self.max_age_ms.load(Relaxed)
    }

    /// Sets how old a view may be served: 0 reads the fabric for every reader; more than
    /// [`MAX_AGE_LIMIT_MS`] is `EINVAL`.
    pub(crate) fn set_max_age_ms(&self, ms: u32) -> Result {
        if ms > MAX_AGE_LIMIT_MS {
            return Err(EINVAL);
        }
        self.max_age_ms.store(ms, Relaxed);
        Ok(())
    }

    /// Marks the view out of date: a link event arrived, a binding command of this host's
    /// failed in a way that leaves its outcome unknown, or something else consumed the
    /// firmware's event queue. The event interrupt calls it before it clears a link event, so
    /// a reader sees either the pending event or the mark.
    pub(crate) fn invalidate(&self) {
        self.stale.store(true, Relaxed);
    }

    /// Notes a binding change this host made and the firmware accepted: functions `pdfids`
    /// bound together to logical port `port` of host `host` (`bound`), or unbound from it.
    ///
    /// The view is not marked for a full read: the firmware queues its own BIND or UNBIND
    /// event for each function, and the next reader applies them in the firmware's order with
    /// the others ([`Fabric::drain`]). That reader then checks that the view shows the change;
    /// if it does not (an event is not queued yet, was lost, or a later event changed the
    /// function again), it reads the whole fabric, so a reader after the change never sees the
    /// view from before it.
    ///
    /// A change supersedes the changes noted earlier for the same functions or the same
    /// logical port (the unbind and the bind of a move, a port emptied and filled again): only
    /// the newest must show.
    pub(crate) fn own_change(&self, pdfids: &[u16], host: u8, port: u8, bound: bool) {
        let mut q = self.queue.lock();
        q.own
            .retain(|o| !pdfids.contains(&o.pdfid) && (o.host, o.port) != (host, port));
        for &pdfid in pdfids {
            let o = Own {
                pdfid,
                host,
                port,
                bound,
            };
            if q.own.len() >= MAX_OWN || q.own.push(o, GFP_KERNEL).is_err() {
                // The next reader reads the whole fabric, which shows every change noted.
                q.own.clear();
                drop(q);
                self.invalidate();
                return;
            }
        }
    }

    /// Notes that the firmware signalled fabric events: the next reader of the view or the
    /// fabric-event work reads them. The event interrupt calls it before it clears the
    /// event, so a reader sees either the pending event or the mark.
    pub(crate) fn events_signalled(&self) {
        self.unread.store(true, Relaxed);
    }

    /// Reads the firmware's fabric-event queue until it is empty: bindings become changes
    /// for the view, unbind requests wait for [`Fabric::take_requests`], and anything else
    /// (or a lost event, or a failed read) marks the view for a full read.
    ///
    /// Reads nothing unless events were signalled since the last drain, or `pending` (the
    /// event is in the registers, its interrupt not handled yet): of a reader and the
    /// fabric-event work woken by one event, only the first reads the queue.
    pub(crate) fn drain(&self, mep: &Mep, pending: bool) {
        let mut q = self.queue.lock();
        // Cleared before the queue is read: an event signalled from now on is read again.
        if !self.unread.xchg(false, Relaxed) && !pending {
            return;
        }
        let mut emptied = false;
        let mut dropped = 0u32;
        for _ in 0..DRAIN_BATCHES {
            let batch = match event::read(mep) {
                Ok(b) => b,
                Err(_) => break,
            };
            if batch.overflow {
                dev_warn!(mep.pdev, "the firmware dropped fabric events\n");
                q.reread = true;
            }
            for e in batch.events.iter() {
                let change = match (e.code, e.binding) {
                    (event::BIND, Some((usp, port, pdfid))) => Some(Change {
                        pdfid,
                        to: Some((usp, port)),
                    }),
                    (event::UNBIND, Some((_, _, pdfid))) => Some(Change { pdfid, to: None }),
                    (event::UNBIND_REQUEST, Some(r)) => {
                        if q.requests.len() >= MAX_REQUESTS
                            || q.requests.push(r, GFP_KERNEL).is_err()
                        {
                            dropped = dropped.saturating_add(1);
                        }
                        continue;
                    }
                    _ => None,
                };
                match change {
                    Some(c) if !q.reread && q.changes.len() < MAX_CHANGES => {
                        if q.changes.push(c, GFP_KERNEL).is_err() {
                            q.reread = true;
                        }
                    }
                    _ => q.reread = true,
                }
            }
            if !batch.more {
                emptied = true;
                break;
            }
        }
        if dropped != 0 {
            // Once per drain: a firmware that floods the queue must not flood the log.
            dev_warn!(
                mep.pdev,
                "dropped {} unbind requests of the firmware: more than {} waiting\n",
                dropped,
                MAX_REQUESTS
            );
        }
        if !emptied {
            // A failed read, or more events than one drain takes: read the fabric, and let
            // the next drain go on where this one stopped.
            q.reread = true;
            self.unread.store(true, Relaxed);
        }
        if q.reread {
            q.changes.clear();
        }
    }

    /// The unbind requests read so far, oldest first.
    pub(crate) fn take_requests(&self) -> KVec<Request> {
        core::mem::take(&mut self.queue.lock().requests)
    }

    /// Runs `f` on an up-to-date view of the fabric.
    ///
    /// `f` runs under the view's lock, which binds, unbinds, sysfs readers, the fabric-event
    /// work and the endpoint's unbind all take: it must not copy to or from user memory (a
    /// fault there may take as long as the caller likes) or wait for anything. Callers copy
    /// what they need into kernel memory in `f` and hand it to user space afterwards.
    pub(crate) fn with_view<R>(&self, mep: &Mep, f: impl FnOnce(&View) -> R) -> Result<R> {
        self.view(mep, true, f)
    }

    /// [`Fabric::with_view`] for a caller that uses only what the firmware's fabric events
    /// keep current: which functions exist (a device or endpoint port added or removed is an
    /// event, which makes the view stale) and where each is bound (a binding made anywhere in
    /// the fabric is a BIND or UNBIND event on every host's queue). The view is not read again
    /// only because it is older than [`Fabric::max_age_ms`], an age meant for what no event
    /// signals (such as another host's link); everything else that makes it stale still does.
    pub(crate) fn with_view_by_events<R>(
        &self,
        mep: &Mep,
        f: impl FnOnce(&View) -> R,
    ) -> Result<R> {
        self.view(mep, false, f)
    }

    /// The view for `f`; `aged`: read it again when it is older than the age set.
    fn view<R>(&self, mep: &Mep, aged: bool, f: impl FnOnce(&View) -> R) -> Result<R> {
        let mut view = self.view.lock();
        // An event the interrupt has not handled yet counts as much as one it has.
        let pending = crate::headers::pending(mep)?;
        if pending.link {
            self.invalidate();
        }
        // Unbind requests read here wait for the fabric-event work, which the event's
        // interrupt queues.
        self.drain(mep, pending.gfms);
        // Taken before a full read, so that events read while it runs are applied after it.
        // This host's own changes are taken with them: each was accepted before it was noted,
        // so a full read from here on shows it.
        let (changes, reread, own) = {
            let mut q = self.queue.lock();
            (
                core::mem::take(&mut q.changes),
                core::mem::replace(&mut q.reread, false),
                core::mem::take(&mut q.own),
            )
        };
        let max_age = Delta::from_millis(i64::from(self.max_age_ms()));
        let fresh = view.read_at.is_some_and(|t| !aged || t.elapsed() < max_age);
        let mut whole = self.stale.xchg(false, Relaxed) || reread || !fresh;
        if !whole && !changes.is_empty() {
            // A change the view cannot take leaves it part applied: read it whole then.
            whole = !changes.iter().all(|c| apply(&mut view, c));
            view.generation = view.generation.wrapping_add(1);
        }
        // The firmware's events, applied in its order, must have brought this host's own
        // changes; if not, its event for one is late or lost: read the fabric.
        if !whole && !own.iter().all(|o| shows(&view, o)) {
            whole = true;
        }
        if whole {
            view.read_at = None;
            if let Err(e) = read(mep, &mut view) {
                self.invalidate();
                return Err(e);
            }
            view.read_at = Some(Instant::now());
        }
        Ok(f(&view))
    }
}
