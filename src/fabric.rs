// SPDX-License-Identifier: GPL-2.0-only

//! The driver's view of the fabric: physical ports and every endpoint function (PFs and VFs)
//! with what each is bound to.
//!
//! It is read with PAX commands only: the topology dump ([`fw::topo`]) for the ports and the
//! fabric database ([`fw::gfms`], PAX_ALL) for the hosts and every endpoint's functions. The
//! view is cached and read again when a fabric or link event arrived, when one is pending in
//! the event registers, when this host changed a binding, or when it is older than
//! [`MAX_AGE`] (a change the firmware signals to no host of ours, such as another host's
//! link, is seen within that time). Every length the firmware
//! reports is checked; a reply that does not add up is `EIO`, never an out-of-bounds access.

use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Mutex, MutexGuard,
    },
};

use kernel::time::{Delta, Instant, Monotonic};

use crate::{fw, uapi, Mep};

/// The oldest view served without reading the fabric again.
const MAX_AGE: Delta = Delta::from_millis(1_000);

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
    /// A fabric event arrived since the view was read.
    stale: Atomic<bool>,
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
            session <- new_mutex!(()),
        })
    }

    /// Excludes every other dump session while the guard lives.
    pub(crate) fn session(&self) -> MutexGuard<'_, ()> {
        self.session.lock()
    }

    /// Marks the view out of date: a fabric or link event arrived, or this host changed a
    /// binding. The event interrupt calls it before it clears the event, so a reader sees
    /// either the pending event or the mark.
    pub(crate) fn invalidate(&self) {
        self.stale.store(true, Relaxed);
    }

    /// Runs `f` on an up-to-date view of the fabric.
    pub(crate) fn with_view<R>(&self, mep: &Mep, f: impl FnOnce(&View) -> R) -> Result<R> {
        let mut view = self.view.lock();
        // An event the interrupt has not handled yet makes the view as stale as one it has.
        let pending = crate::event::pending(mep)?;
        let stale = self.stale.xchg(false, Relaxed);
        let fresh = view.read_at.is_some_and(|t| t.elapsed() < MAX_AGE);
        if stale || pending || !fresh {
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
