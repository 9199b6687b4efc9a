// SPDX-License-Identifier: GPL-2.0-only

//! Composition: binding endpoint functions to hosts, unbinding them, moving them.
//!
//! Binding and unbinding are the PAX fabric-manager command `GFMS_BIND_UNBIND` ([`fw::bind`]),
//! naming the host by its upstream physical port (from the `GFMS_DB_DUMP` HVD section,
//! [`fw::gfms::hvd`], which also says which logical ports are free), the logical port and the
//! function by its PDFID. This host's side of each change goes through [`hotplug`]: a
//! function bound here is waited for until this host has enumerated it; a function unbound
//! from here is removed (driver unbound, slot powered off) before the firmware is asked.
//!
//! Composition operations of one endpoint run side by side, each holding a reservation of the
//! functions it works on and, on this host, of the logical port it touches ([`Reservation`]).
//! An operation reserves all its functions at once or none: it waits holding nothing, so
//! operations waiting for each other's functions (or for free entries) never wait in a circle.
//! The state lock ([`Compose`]) is held only to take, look at and give back reservations:
//! never across a firmware command, a hot-plug or PCI-core call or a wait, so unbinding the
//! endpoint (or pciehp removing it) never waits for a running operation. Once the endpoint
//! is going away ([`Compose::shut_down`]) every wait ends at once with `ENODEV`; a caller that
//! is killed (`SIGKILL`) leaves its wait within [`POLL_MS`] with `EINTR`.

use kernel::{
    new_condvar, new_mutex,
    prelude::*,
    sync::{Arc, CondVar, CondVarTimeoutResult, Mutex},
    time::{delay::fsleep, msecs_to_jiffies, Delta, Instant, Monotonic},
};

use crate::{
    fw::{
        self,
        bind::{
            ERR_BIND_IN_PROGRESS, ERR_LOGC_PORT_ARDY_BIND, ERR_LOGC_PORT_NOT_BIND_PHYC_PORT,
            EXT_HOTPLUG_FAILED, EXT_UNBIND_TIMEOUT,
        },
        ext,
        gfms::FUNCS_PER_LOG_PORT,
    },
    hotplug::{self, LOG_PORTS},
    kext::{self, signal::fatal_signal_pending},
    Mep,
};

pub(crate) use crate::fw::Failure;

/// Default bound on a whole bind or unbind, firmware and enumeration included.
pub(crate) const DEFAULT_TIMEOUT_MS: u32 = 30_000;
/// How often a waiter for a reservation or the firmware looks again.
const POLL_MS: u32 = 50;
/// How often a bind looks for its function in this host's PCI tree: each look is a few
/// counted lookups, and the bind returns within this much of pciehp adding the function.
const ENUM_POLL_MS: i64 = 10;
/// Functions operations may work on at once; one more waits for a free entry.
const MAX_OPS: usize = 16;

/// Where a function ended up after a successful bind.
pub(crate) struct Bound {
    pub(crate) port: u8,
    /// The function as this host enumerated it, when bound to this host.
    pub(crate) local: Option<hotplug::Found>,
}

/// One host's virtual switch as the firmware's database describes it.
struct Hvd {
    usp_port: u8,
    /// PDFID bound to each logical port.
    ports: [Option<u16>; LOG_PORTS as usize],
}

/// State guarded by [`Compose`]'s lock.
struct State {
    /// `false` once the endpoint is being unbound.
    alive: bool,
    /// Per logical port, the PDFID this host itself unbound from it, whose `UNBIND_REQUEST`
    /// the firmware sends back to us: the fabric-event work must not act on it, since the
    /// port may hold a function bound again since (a rolled-back move).
    own_unbind: [Option<u16>; LOG_PORTS as usize],
    /// Per logical port, the PDFID that last left it through this host (its own unbind or
    /// a removal the firmware asked for): a later request for it is stale, not a lie.
    left: [Option<u16>; LOG_PORTS as usize],
    /// Functions an operation is working on.
    busy_fns: [Option<u16>; MAX_OPS],
    /// This host's logical ports an operation (or the fabric-event work) is working on.
    busy_ports: [bool; LOG_PORTS as usize],
    /// Operations waiting now for a function or a logical port another one holds.
    waiting: u32,
    /// Callers inside [`hotplug::remove`], which waits for pciehp ([`Compose::enter_hotplug`]).
    in_hotplug: usize,
}

impl State {
    fn set_own_unbind(&mut self, port: u8, pdfid: Option<u16>) {
        if let Some(own) = self.own_unbind.get_mut(usize::from(port)) {
            *own = pdfid;
        }
        if pdfid.is_some() {
            self.set_left(port, pdfid);
        }
    }

    fn set_left(&mut self, port: u8, pdfid: Option<u16>) {
        if let Some(left) = self.left.get_mut(usize::from(port)) {
            *left = pdfid;
        }
    }

    fn port_busy(&self, port: u8) -> bool {
        self.busy_ports
            .get(usize::from(port))
            .copied()
            .unwrap_or(true)
    }

    fn set_port_busy(&mut self, port: u8, busy: bool) {
        if let Some(b) = self.busy_ports.get_mut(usize::from(port)) {
            *b = busy;
        }
    }
}

/// Composition state of one endpoint.
#[pin_data]
pub(crate) struct Compose {
    #[pin]
    lock: Mutex<State>,
    /// Signalled when a reservation is given back and when the endpoint goes away.
    #[pin]
    changed: CondVar,
}

impl Compose {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            lock <- new_mutex!(State {
                alive: true,
                own_unbind: [None; LOG_PORTS as usize],
                left: [None; LOG_PORTS as usize],
                busy_fns: [None; MAX_OPS],
                busy_ports: [false; LOG_PORTS as usize],
                waiting: 0,
                in_hotplug: 0,
            }),
            changed <- new_condvar!("pcifab::Compose::changed"),
        })
    }

    /// Refuses new operations and ends every wait of running ones (`ENODEV`); called on
    /// unbind of the endpoint. Does not wait for anything: a running operation finds out at
    /// its next step (its firmware commands fail once the mailbox is killed).
    ///
    /// Returns whether a caller is inside a hot-plug removal: it waits for pciehp, which may
    /// wait for the PCI rescan/remove lock that the endpoint's removal may hold, so the
    /// removal must not wait for that caller (the fabric-event work included). None enters
    /// one after this.
    pub(crate) fn shut_down(&self) -> bool {
        let in_hotplug = {
            let mut st = self.lock.lock();
            st.alive = false;
            st.in_hotplug != 0
        };
        self.changed.notify_all();
        in_hotplug
    }

    /// Admits the caller to a hot-plug removal ([`hotplug::remove`]) until the guard drops:
    /// `ENODEV` once the endpoint is going away. [`Compose::shut_down`] reports admitted
    /// callers, so that the endpoint's removal never waits for one.
    fn enter_hotplug(&self) -> Result<HotplugGuard<'_>> {
        let mut st = self.lock.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        st.in_hotplug = st.in_hotplug.checked_add(1).ok_or(EBUSY)?;
        Ok(HotplugGuard(self))
    }

    /// `ENODEV` once the endpoint is going away.
    fn check_alive(&self) -> Result {
        if self.lock.lock().alive {
            Ok(())
        } else {
            Err(ENODEV)
        }
    }

    /// Operations of this endpoint waiting now for a function or logical port that another
    /// one holds (sysfs `compose_waiting`).
    pub(crate) fn waiting(&self) -> u32 {
        self.lock.lock().waiting
    }

    /// Counts an operation in (`true`) or out of [`Compose::waiting`].
    fn set_waiting(&self, st: &mut State, waiting: bool) {
        st.waiting = if waiting {
            st.waiting.saturating_add(1)
        } else {
            st.waiting.saturating_sub(1)
        };
    }

    /// Sleeps for up to `ms` milliseconds, or until a reservation is given back; `ENODEV` at
    /// once when the endpoint goes away, `EINTR` when the caller is killed. Other signals do
    /// not end the wait early: a bind or unbind is not abandoned half done for them.
    fn pause(&self, ms: i64) -> Result {
        let ms = u32::try_from(ms.clamp(1, i64::from(POLL_MS))).unwrap_or(POLL_MS);
        let mut st = self.lock.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        let r = self
            .changed
            .wait_interruptible_timeout(&mut st, msecs_to_jiffies(ms));
        let alive = st.alive;
        drop(st);
        if !alive {
            return Err(ENODEV);
        }
        if let CondVarTimeoutResult::Signal { .. } = r {
            if fatal_signal_pending() {
                return Err(EINTR);
            }
            // Another pending signal makes every interruptible wait return at once: sleep
            // instead (`shut_down()` and a `SIGKILL` are then seen within `POLL_MS`).
            fsleep(Delta::from_millis(i64::from(ms)));
        }
        Ok(())
    }

    /// Sleeps for `ms` milliseconds in [`Compose::pause`] steps.
    fn sleep(&self, ms: i64) -> Result {
        let start = Instant::<Monotonic>::now();
        loop {
            let left = ms.saturating_sub(start.elapsed().as_millis());
            if left <= 0 {
                return Ok(());
            }
            self.pause(left)?;
        }
    }

    /// Reserves the functions `pdfids` (1 to [`fw::bind::MAX_FUNCS`], no duplicates), all at
    /// once: while another operation of this endpoint holds one of them, or the table has no
    /// room for all of them, waits holding none.
    fn reserve(&self, pdfids: &[u16]) -> Result<Reservation<'_>> {
        let mut list = [0u16; fw::bind::MAX_FUNCS];
        list.get_mut(..pdfids.len())
            .ok_or(EINVAL)?
            .copy_from_slice(pdfids);
        if pdfids.is_empty() {
            return Err(EINVAL);
        }
        let mut waiting = false;
        let r = loop {
            {
                let mut st = self.lock.lock();
                if !st.alive {
                    break Err(ENODEV);
                }
                let free = st.busy_fns.iter().filter(|e| e.is_none()).count();
                let held = pdfids.iter().any(|&p| st.busy_fns.contains(&Some(p)));
                if !held && free >= pdfids.len() {
                    let mut entries = st.busy_fns.iter_mut().filter(|e| e.is_none());
                    for (&p, e) in pdfids.iter().zip(&mut entries) {
                        *e = Some(p);
                    }
                    break Ok(Reservation {
                        compose: self,
                        pdfids: list,
                        count: pdfids.len(),
                        port: None,
                    });
                }
                if !waiting {
                    waiting = true;
                    self.set_waiting(&mut st, true);
                }
            }
            if let Err(e) = self.pause(i64::from(POLL_MS)) {
                break Err(e);
            }
        };
        if waiting {
            self.set_waiting(&mut self.lock.lock(), false);
        }
        r
    }
}

/// The outcome of an unbind run for a sysfs writer ([`Mep::unbind_detached`]), once known.
type DetachedOutcome = Mutex<Option<Result<(u8, u8), Failure>>>;

/// A caller admitted to a hot-plug removal ([`Compose::enter_hotplug`]).
struct HotplugGuard<'a>(&'a Compose);

impl Drop for HotplugGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock.lock();
        st.in_hotplug = st.in_hotplug.saturating_sub(1);
    }
}

/// The functions (and at most one logical port of this host) an operation works on; given
/// back on drop.
struct Reservation<'a> {
    compose: &'a Compose,
    /// The functions, the first one function 0 of a bind; `count` of them are used.
    pdfids: [u16; fw::bind::MAX_FUNCS],
    count: usize,
    port: Option<u8>,
}

impl Reservation<'_> {
    /// The first function reserved: the one an unbind or move works on, function 0 of a bind.
    fn pdfid(&self) -> u16 {
        self.pdfids[0]
    }

    /// Reserves logical port `port` of this host, waiting while another operation holds it;
    /// gives back a port reserved before.
    fn take_port(&mut self, port: u8) -> Result {
        if self.port == Some(port) {
            return Ok(());
        }
        self.release_port();
        let mut waiting = false;
        let r = loop {
            {
                let mut st = self.compose.lock.lock();
                if !st.alive {
                    break Err(ENODEV);
                }
                if !st.port_busy(port) {
                    st.set_port_busy(port, true);
                    self.port = Some(port);
                    break Ok(());
                }
                if !waiting {
                    waiting = true;
                    self.compose.set_waiting(&mut st, true);
                }
            }
            if let Err(e) = self.compose.pause(i64::from(POLL_MS)) {
                break Err(e);
            }
        };
        if waiting {
            self.compose
                .set_waiting(&mut self.compose.lock.lock(), false);
        }
        r
    }

    /// Reserves the first logical port of this host that `h` shows free and no operation holds.
    /// `Ok(None)` when every free port is held by another operation: the caller is counted in
    /// [`Compose::waiting`] through `waiting` then, and out again once it gets a port (or
    /// `waiting` drops); `ENOSPC` when none is free.
    fn take_free_port(&mut self, h: &Hvd, waiting: &mut Waiting<'_>) -> Result<Option<u8>> {
        self.release_port();
        let mut st = self.compose.lock.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        let free = |p: &u8| h.ports.get(usize::from(*p)).is_some_and(Option::is_none);
        if !(0..LOG_PORTS).any(|p| free(&p)) {
            return Err(ENOSPC);
        }
        let pick = (0..LOG_PORTS).filter(free).find(|&p| !st.port_busy(p));
        if let Some(p) = pick {
            st.set_port_busy(p, true);
            self.port = Some(p);
        }
        waiting.set(&mut st, pick.is_none());
        Ok(pick)
    }

    fn release_port(&mut self) {
        if let Some(p) = self.port.take() {
            self.compose.lock.lock().set_port_busy(p, false);
            self.compose.changed.notify_all();
        }
    }
}

/// An operation's place in [`Compose::waiting`]: counted in and out with [`Waiting::set`],
/// out at the latest when it drops (on every return of a wait loop).
struct Waiting<'a> {
    compose: &'a Compose,
    counted: bool,
}

impl<'a> Waiting<'a> {
    fn new(compose: &'a Compose) -> Self {
        Self {
            compose,
            counted: false,
        }
    }

    /// Counts the operation in (`true`) or out; `st` is the compose lock's state.
    fn set(&mut self, st: &mut State, waiting: bool) {
        if self.counted != waiting {
            self.counted = waiting;
            self.compose.set_waiting(st, waiting);
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.compose
                .set_waiting(&mut self.compose.lock.lock(), false);
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        {
            let mut st = self.compose.lock.lock();
            if let Some(p) = self.port.take() {
                st.set_port_busy(p, false);
            }
            for &p in self.pdfids.iter().take(self.count) {
                if let Some(e) = st.busy_fns.iter_mut().find(|e| **e == Some(p)) {
                    *e = None;
                }
            }
        }
        self.compose.changed.notify_all();
    }
}

/// The functions logical port `port` of `host` holds, as the firmware's HVD shows them: in
/// function order, function 0 first; `.1` of them are used.
fn port_functions(mep: &Mep, host: u8, port: u8) -> Result<([u16; FUNCS_PER_LOG_PORT], usize)> {
    let h = {
        let _session = mep.fabric.session();
        fw::gfms::hvd(mep, host)?
    };
    if h.log_ports() < usize::from(LOG_PORTS) {
        return Err(EIO);
    }
    let mut list = [0u16; FUNCS_PER_LOG_PORT];
    let mut n = 0;
    for (slot, pdfid) in list.iter_mut().zip(h.bound(port)) {
        *slot = pdfid;
        n += 1;
    }
    Ok((list, n))
}

/// Whether what the port holds after a bind the firmware accepted can be that bind: no
/// function that was not asked for. Fewer than asked is not a lie: when the bind is for
/// another host, that host may already have unbound the port again.
fn bound_as_asked(asked: &[u16], seen: &[u16]) -> bool {
    seen.iter().all(|p| asked.contains(p))
}

/// A list of PDFIDs in a log line: `0x0300,0x0301`, or `none`.
struct Pdfids<'a>(&'a [u16]);

impl core::fmt::Display for Pdfids<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, p) in self.0.iter().enumerate() {
            if i != 0 {
                f.write_str(",")?;
            }
            write!(f, "{:#06x}", p)?;
        }
        Ok(())
    }
}

fn hvd(mep: &Mep, host: u8) -> Result<Hvd> {
    let h = {
        let _session = mep.fabric.session();
        fw::gfms::hvd(mep, host)?
    };
    if h.log_ports() < usize::from(LOG_PORTS) {
        return Err(EIO);
    }
    let mut ports = [None; LOG_PORTS as usize];
    for (l, p) in (0..LOG_PORTS).zip(ports.iter_mut()) {
        *p = h.bound(l).next();
    }
    Ok(Hvd {
        usp_port: h.phy_pid,
        ports,
    })
}

/// Runs a bind or unbind command; a refusal becomes a [`Failure`] with the firmware's code.
fn bind_unbind<C: fw::Command>(mep: &Mep, cmd: &C, timeout_ms: u32) -> Result<(), Failure> {
    fw::call_timeout(mep, cmd, timeout_ms).map(|_| ())
}

fn bind_cmd(mep: &Mep, usp_port: u8, port: u8, pdfids: &[u16]) -> Result<fw::bind::Bind, Failure> {
    Ok(fw::bind::Bind::new(mep.pax_id(), usp_port, port, pdfids)?)
}

fn unbind_cmd(mep: &Mep, usp_port: u8, port: u8, pdfid: u16) -> fw::bind::Unbind {
    fw::bind::Unbind::new(mep.pax_id(), usp_port, port, pdfid)
}

/// Milliseconds left of `timeout_ms` since `start`, at least 1.
fn left(start: &Instant<Monotonic>, timeout_ms: u32) -> u32 {
    let spent = u32::try_from(start.elapsed().as_millis()).unwrap_or(u32::MAX);
    timeout_ms.saturating_sub(spent).max(1)
}

impl Mep {
    /// Finds where `pdfid` is bound: `(host, logical port)`.
    ///
    /// A function whose endpoint's link is down is missing from the endpoint records but
    /// may still hold a host's logical port: the hosts' virtual switches (HVD) say where.
    fn binding(&self, pdfid: u16) -> Result<Option<(u8, u8)>> {
        // Bindings reach the view by the firmware's events whatever its age.
        let (found, hosts) = self.fabric.with_view_by_events(self, |v| {
            let found = v.functions.iter().find(|f| f.pdfid == pdfid).map(|f| {
                if f.bound_host == crate::uapi::UNBOUND {
                    None
                } else {
                    Some((f.bound_host, f.bound_log_port))
                }
            });
            (found, v.host_count)
        })?;
        if let Some(b) = found {
            return Ok(b);
        }
        for host in 0..hosts {
            let h = hvd(self, host)?;
            if let Some(port) = (0..LOG_PORTS)
                .find(|&l| h.ports.get(usize::from(l)).copied().flatten() == Some(pdfid))
            {
                return Ok(Some((host, port)));
            }
        }
        Err(ENOENT)
    }

    /// Binds `pdfids` (1 to [`fw::bind::MAX_FUNCS`], the first one function 0) together to
    /// logical port `port` (or the first free one) of `host`: all of them or none.
    ///
    /// When `host` is this host, returns once this host has enumerated every function; if
    /// they do not all appear in time the binding is undone and the caller gets `ETIMEDOUT`.
    /// If the endpoint goes away meanwhile, the wait ends at once with `ENODEV`.
    pub(crate) fn bind(
        &self,
        pdfids: &[u16],
        host: u8,
        port: Option<u8>,
        timeout_ms: u32,
        wait_local: bool,
    ) -> Result<Bound, Failure> {
        let start = Instant::<Monotonic>::now();
        if port.is_some_and(|p| p >= LOG_PORTS) {
            return Err(EINVAL.into());
        }
        let (_, rest) = pdfids.split_first().ok_or(EINVAL)?;
        if rest.len() >= fw::bind::MAX_FUNCS
            || pdfids
                .iter()
                .enumerate()
                .any(|(i, p)| pdfids[i + 1..].contains(p))
        {
            return Err(EINVAL.into());
        }
        // All of them at once: a bind never waits holding part of its list.
        let mut r = self.compose.reserve(pdfids)?;
        self.bind_reserved(&mut r, rest, host, port, &start, timeout_ms, wait_local)
    }

    #[allow(clippy::too_many_arguments)]
    fn bind_reserved(
        &self,
        r: &mut Reservation<'_>,
        rest: &[u16],
        host: u8,
        port: Option<u8>,
        start: &Instant<Monotonic>,
        timeout_ms: u32,
        wait_local: bool,
    ) -> Result<Bound, Failure> {
        let pdfid = r.pdfid();
        let mut list = [0u16; fw::bind::MAX_FUNCS];
        let count = rest.len().checked_add(1).ok_or(EINVAL)?;
        list.get_mut(..count).ok_or(EINVAL)?[0] = pdfid;
        list[1..count].copy_from_slice(rest);
        let local = usize::from(host) == self.partition;
        // With no port given, take the first free one; another host may take it between our
        // look and our bind, so look again then.
        let mut tries = 0;
        let mut waiting = Waiting::new(&self.compose);
        let (h, port) = loop {
            let h = hvd(self, host)?;
            let p = match (port, local) {
                (Some(p), true) => {
                    r.take_port(p)?;
                    p
                }
                (Some(p), false) => p,
                (None, true) => match r.take_free_port(&h, &mut waiting)? {
                    Some(p) => p,
                    None => {
                        // Every free port is being worked on by another operation here.
                        if start.elapsed().as_millis() >= i64::from(timeout_ms) {
                            return Err(EBUSY.into());
                        }
                        self.compose.pause(i64::from(POLL_MS))?;
                        continue;
                    }
                },
                (None, false) => (0..LOG_PORTS)
                    .find(|&p| h.ports.get(usize::from(p)).is_some_and(Option::is_none))
                    .ok_or(ENOSPC)?,
            };
            match fw::call_timeout(
                self,
                &bind_cmd(self, h.usp_port, p, &list[..count])?,
                left(start, timeout_ms),
            )
            .and_then(|reply| reply.accepted(self, pdfid))
            {
                Err(Failure {
                    fw_ret: ERR_LOGC_PORT_ARDY_BIND,
                    ..
                }) if port.is_none() && tries < LOG_PORTS => tries += 1,
                // Another host's bind is filling the port we picked (the first free one,
                // which it picked too): wait for its outcome and pick again, as a bind made
                // after it would. A function of ours that is busy gets its own error then.
                Err(Failure {
                    fw_ret: ERR_BIND_IN_PROGRESS,
                    ..
                }) if port.is_none() && start.elapsed().as_millis() < i64::from(timeout_ms) => {
                    r.release_port();
                    self.compose.pause(i64::from(POLL_MS))?;
                }
                Err(f) => return Err(f),
                Ok(()) => break (h, p),
            }
        };
        // The firmware's BIND events bring the change to the view; its next reader reads the
        // fabric only if they have not (`Fabric::own_change`).
        self.fabric.own_change(&list[..count], host, port, true);
        self.check_bound(&h, host, port, &list[..count], local)?;
        if !local || !wait_local {
            return Ok(Bound { port, local: None });
        }
        loop {
            let all = hotplug::functions_present(&self.pdev, port, count);
            if let Some(found) = hotplug::find(&self.pdev, port).filter(|_| all) {
                return Ok(Bound {
                    port,
                    local: Some(found),
                });
            }
            let spent = start.elapsed().as_millis();
            if spent >= i64::from(timeout_ms) {
                break;
            }
            // Ends at once (`ENODEV`) when the endpoint goes away: the function stays bound
            // to this host, which can no longer ask the firmware for anything.
            self.compose.pause(
                i64::from(timeout_ms)
                    .saturating_sub(spent)
                    .min(ENUM_POLL_MS),
            )?;
        }
        // Never enumerated: give the function back so it is not held by a host that
        // cannot use it.
        dev_warn!(
            self.pdev,
            "function {:#06x} bound to port {} but not enumerated within {} ms; unbinding\n",
            pdfid,
            port,
            timeout_ms
        );
        let _ = bind_unbind(
            self,
            &unbind_cmd(self, h.usp_port, port, pdfid),
            DEFAULT_TIMEOUT_MS,
        );
        self.fabric.invalidate();
        Err(ETIMEDOUT.into())
    }

    /// Checks, after the firmware accepted a bind of `asked` to logical port `port` of `host`
    /// (whose virtual switch is `h`), that the port holds no function that was not asked
    /// for: one HVD dump. If it does, the firmware lied about the bind: logs it, takes whatever the port holds away again (from this host
    /// first, as an unbind does, when `local`; the caller holds the port) and fails with
    /// `EIO`.
    fn check_bound(
        &self,
        h: &Hvd,
        host: u8,
        port: u8,
        asked: &[u16],
        local: bool,
    ) -> Result<(), Failure> {
        let (list, n) = port_functions(self, host, port)?;
        let seen = list.get(..n).ok_or(EIO)?;
        if bound_as_asked(asked, seen) {
            return Ok(());
        }
        fw::lie(
            self,
            format_args!(
                "bind of {} to host {} port {} accepted, but the port holds {}; unbinding",
                Pdfids(asked),
                host,
                port,
                Pdfids(seen)
            ),
        );
        let Some(&first) = seen.first() else {
            return Err(EIO.into());
        };
        if local {
            let removed = match self.compose.enter_hotplug() {
                Ok(_admitted) => hotplug::remove(&self.pdev, port),
                Err(e) => Err(e),
            };
            if let Err(e) = removed {
                dev_warn!(
                    self.pdev,
                    "could not remove the device on port {}: {:?}\n",
                    port,
                    e
                );
            }
            self.compose.lock.lock().set_own_unbind(port, Some(first));
        }
        let res = bind_unbind(
            self,
            &unbind_cmd(self, h.usp_port, port, first),
            DEFAULT_TIMEOUT_MS,
        );
        if let Err(Failure { fw_ret, .. }) = res {
            if local && fw_ret != EXT_UNBIND_TIMEOUT && fw_ret != EXT_HOTPLUG_FAILED {
                self.compose.lock.lock().set_own_unbind(port, None);
            }
            dev_warn!(
                self.pdev,
                "could not unbind port {} of host {} again ({:#x})\n",
                port,
                host,
                fw_ret
            );
        }
        self.fabric.invalidate();
        Err(EIO.into())
    }

    /// Unbinds `pdfid` from the host holding it. Returns `(host, port)` it was bound to.
    ///
    /// Of two unbinds of one function at once (from this host and another, or two here),
    /// one succeeds and the other gets `ENOENT`: the function is not bound any more.
    pub(crate) fn unbind(&self, pdfid: u16, timeout_ms: u32) -> Result<(u8, u8), Failure> {
        let start = Instant::<Monotonic>::now();
        let mut r = self.compose.reserve(&[pdfid])?;
        self.unbind_reserved(&mut r, &start, timeout_ms)
    }

    /// [`Mep::unbind`] for a writer of a sysfs file of the endpoint: the unbind runs on the
    /// driver's workqueue and the writer waits for its outcome, or until the endpoint goes
    /// away (`ENODEV` at once). The endpoint's removal waits for the sysfs writers to leave
    /// (kernfs drains its attributes), and may hold the PCI rescan/remove lock while it does,
    /// which the unbind's hot-plug removal may need: so no writer waits in pciehp itself. An
    /// unbind left running then ends on its own (the module's exit waits for it).
    pub(crate) fn unbind_detached(
        self: &Arc<Self>,
        pdfid: u16,
        timeout_ms: u32,
    ) -> Result<(u8, u8), Failure> {
        let outcome: Arc<DetachedOutcome> =
            Arc::pin_init(new_mutex!(None, "pcifab::unbind_detached"), GFP_KERNEL)?;
        let (mep, out) = (self.clone(), outcome.clone());
        kext::workqueue::driver().try_spawn(GFP_KERNEL, move || {
            let r = mep.unbind(pdfid, timeout_ms);
            *out.lock() = Some(r);
            mep.compose.changed.notify_all();
        })?;
        loop {
            if let Some(r) = outcome.lock().take() {
                return r;
            }
            self.compose.pause(i64::from(POLL_MS))?;
        }
    }

    fn unbind_reserved(
        &self,
        r: &mut Reservation<'_>,
        start: &Instant<Monotonic>,
        timeout_ms: u32,
    ) -> Result<(u8, u8), Failure> {
        let pdfid = r.pdfid();
        let (host, port) = self.binding(pdfid)?.ok_or(Failure {
            err: ENOENT,
            fw_ret: ERR_LOGC_PORT_NOT_BIND_PHYC_PORT,
        })?;
        let local = usize::from(host) == self.partition && port < LOG_PORTS;
        let removed = if local {
            r.take_port(port)?;
            let _admitted = self.compose.enter_hotplug()?;
            hotplug::remove(&self.pdev, port)?
        } else {
            hotplug::Removal::NotPresent
        };
        let h = hvd(self, host)?;
        if local {
            self.compose.lock.lock().set_own_unbind(port, Some(pdfid));
        }
        let result = loop {
            let res = bind_unbind(
                self,
                &unbind_cmd(self, h.usp_port, port, pdfid),
                left(start, timeout_ms),
            );
            match res {
                // Another operation on the function is in flight in the firmware (another
                // host's unbind, say): wait for its outcome. If it took the function away, the
                // next try gets NOT_BOUND.
                Err(Failure {
                    fw_ret: ERR_BIND_IN_PROGRESS,
                    ..
                }) if start.elapsed().as_millis() < i64::from(timeout_ms) => {
                    self.compose.sleep(i64::from(POLL_MS))?;
                }
                res => break res,
            }
        };
        if local {
            // A refused request never reaches the point where the firmware sends the event.
            if let Err(Failure { fw_ret, .. }) = result {
                if fw_ret != EXT_UNBIND_TIMEOUT && fw_ret != EXT_HOTPLUG_FAILED {
                    self.compose.lock.lock().set_own_unbind(port, None);
                }
            }
        }
        match result {
            Ok(()) => self.fabric.own_change(&[pdfid], host, port, false),
            Err(_) => self.fabric.invalidate(),
        }
        match result {
            // Somebody else unbound it first (another host's unbind, or the manager's): the
            // caller's request found nothing to do. What this host removed is gone from the
            // fabric too, so its side is consistent.
            Err(f) if f.fw_ret == ERR_LOGC_PORT_NOT_BIND_PHYC_PORT => Err(f),
            Err(f) => {
                dev_warn!(
                    self.pdev,
                    "firmware refused to unbind {:#06x} ({:#x}); removed here: {:?}\n",
                    pdfid,
                    f.fw_ret,
                    removed
                );
                Err(f)
            }
            Ok(()) => Ok((host, port)),
        }
    }

    /// Moves `pdfid` to `host`: unbinds it where it is, binds it there; if the bind fails,
    /// binds it back where it was. Returns the new binding and the old `(host, port)`.
    pub(crate) fn move_to(
        &self,
        pdfid: u16,
        host: u8,
        port: Option<u8>,
        timeout_ms: u32,
    ) -> Result<(Bound, (u8, u8)), Failure> {
        let start = Instant::<Monotonic>::now();
        if port.is_some_and(|p| p >= LOG_PORTS) {
            return Err(EINVAL.into());
        }
        let mut r = self.compose.reserve(&[pdfid])?;
        if let Some(at) = self.binding(pdfid)? {
            if at.0 == host && port.is_none_or(|p| p == at.1) {
                // Already there: nothing to move.
                let local = if usize::from(host) == self.partition {
                    hotplug::find(&self.pdev, at.1)
                } else {
                    None
                };
                return Ok((Bound { port: at.1, local }, at));
            }
        }
        let from = self.unbind_reserved(&mut r, &start, timeout_ms)?;
        match self.bind_reserved(&mut r, &[], host, port, &start, timeout_ms, true) {
            Ok(b) => Ok((b, from)),
            Err(f) => {
                // Put it back (unless the endpoint is going away); the caller learns the move
                // failed either way.
                let back = if f.err == ENODEV {
                    Err(f.err)
                } else {
                    self.bind_reserved(
                        &mut r,
                        &[],
                        from.0,
                        Some(from.1),
                        &Instant::<Monotonic>::now(),
                        DEFAULT_TIMEOUT_MS,
                        true,
                    )
                    .map_err(|b| b.err)
                };
                if back.is_err() {
                    dev_err!(
                        self.pdev,
                        "move of {:#06x} failed and it could not be bound back to host {} port {}: it is free\n",
                        pdfid,
                        from.0,
                        from.1
                    );
                }
                Err(f)
            }
        }
    }
}

impl Mep {
    /// Reads this host's queue of fabric-manager events and acts on them: a function the
    /// firmware is about to take away is removed here first (driver unbound, slot powered
    /// off), so its owner never sees a surprise removal. Runs from [`crate::event`]'s work.
    ///
    /// Holds no lock while it removes a function, so unbinding the endpoint (which flushes
    /// this work) waits only for the removal in progress, never for another operation.
    pub(crate) fn handle_gfms_events(&self) {
        if self.compose.check_alive().is_err() {
            return;
        }
        // Bindings go to the view; unbind requests come back here, also those a reader of
        // the view read from the queue first.
        self.fabric.drain(self, false);
        let requests = self.fabric.take_requests();
        if !self.features().has(ext::UNBIND_REQUEST_EVENT) {
            return;
        }
        // This host's bindings as the firmware has them now: a request for a function that
        // is no longer at its port is stale (the port may hold a new function).
        let mut mine = None;
        for &(usp, port, pdfid) in requests.iter() {
            if mine.is_none() {
                let Ok(h) = hvd(self, self.partition as u8) else {
                    return;
                };
                mine = Some(h);
            }
            match mine.as_ref().filter(|m| m.usp_port == usp) {
                Some(m) => self.unbind_requested(m, port, pdfid),
                None => fw::lie(
                    self,
                    format_args!(
                        "unbind request for {:#06x} at upstream port {}, not this host's; ignored",
                        pdfid, usp
                    ),
                ),
            }
        }
    }

    /// The firmware is taking `pdfid` away from logical port `port` of this host.
    fn unbind_requested(&self, mine: &Hvd, port: u8, pdfid: u16) {
        {
            let mut st = self.compose.lock.lock();
            if !st.alive {
                return;
            }
            let Some(own) = st.own_unbind.get_mut(usize::from(port)) else {
                return;
            };
            if *own == Some(pdfid) {
                // Our own unbind: the function already left, and the port may hold a new
                // one by now.
                *own = None;
                return;
            }
            let there = mine.ports.get(usize::from(port)).copied().flatten();
            if there != Some(pdfid) && st.left.get(usize::from(port)) == Some(&Some(pdfid)) {
                // It was here and has left since: a request that raced its going.
                drop(st);
                fw::stale(
                    self,
                    format_args!(
                        "unbind request for {:#06x} on port {}, which it has left; ignored",
                        pdfid, port
                    ),
                );
                return;
            }
            if there != Some(pdfid) {
                // The function is not at that port: the firmware asks this host to let go of
                // something it does not hold.
                drop(st);
                fw::lie(
                    self,
                    format_args!(
                        "unbind request for {:#06x} on port {}, which holds {}; ignored",
                        pdfid,
                        port,
                        there.map_or(-1, i32::from)
                    ),
                );
                return;
            }
            if st.port_busy(port) {
                // An operation of this host is removing or binding that port; it deals with
                // the function (or the firmware's device removal does).
                return;
            }
            st.set_port_busy(port, true);
        }
        let how = match self.compose.enter_hotplug() {
            Ok(_admitted) => hotplug::remove(&self.pdev, port),
            Err(e) => Err(e),
        };
        {
            let mut st = self.compose.lock.lock();
            st.set_port_busy(port, false);
            if how.is_ok() {
                st.set_left(port, Some(pdfid));
            }
        }
        self.compose.changed.notify_all();
        match how {
            Ok(how) => dev_info!(
                self.pdev,
                "function on port {} leaving this host: {:?}\n",
                port,
                how
            ),
            Err(e) => dev_warn!(
                self.pdev,
                "could not remove the function on port {}: {:?}\n",
                port,
                e
            ),
        }
    }
}
