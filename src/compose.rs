// SPDX-License-Identifier: GPL-2.0-only

//! Composition: binding endpoint functions to hosts, unbinding them, moving them.
//!
//! Binding and unbinding are the PAX fabric-manager command `GFMS_BIND_UNBIND` (0x84),
//! naming the host by its upstream physical port (from the `GFMS_DB_DUMP` HVD section, which
//! also says which logical ports are free) and the function by its PDFID
//! (`Documentation/mrpc.rst`). This host's side of each change goes through [`hotplug`]: a
//! function bound here is waited for until this host has enumerated it; a function unbound
//! from here is removed (driver unbound, slot powered off) before the firmware is asked.
//!
//! One composition operation runs at a time per endpoint ([`Compose::lock`]); unbind of the
//! endpoint waits for the running one and fails later ones with `ENODEV`.

use kernel::{
    new_mutex,
    prelude::*,
    sync::Mutex,
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

use crate::{fabric, hotplug, mrpc, Mep};

const CMD_GFMS_DB_DUMP: u32 = 0x83;
const DB_DUMP_HVD: u8 = 3;
const CMD_GFMS_BIND_UNBIND: u32 = 0x84;
const CMD_GFMS_EVENT: u32 = 0x89;
const SUB_EVENT_GET: u8 = 1;
/// pcifab's GFMS event: the firmware is about to take a function away from this host.
const EVENT_UNBIND_REQUEST: u8 = 0x80;
/// GFMS event batches read per work run, at most.
const EVENT_BATCHES: usize = 16;
const SUB_BIND: u8 = 1;
const SUB_UNBIND: u8 = 2;
/// Logical downstream ports of a host's virtual switch.
pub(crate) const LOG_PORTS: u8 = 4;
/// Default bound on a whole bind or unbind, firmware and enumeration included.
pub(crate) const DEFAULT_TIMEOUT_MS: u32 = 30_000;
/// Enumeration poll interval.
const POLL: Delta = Delta::from_millis(50);

/// Firmware return codes of the binding commands (`Documentation/mrpc.rst`).
const FW_PARAM_INVALID: u32 = 0x64006;
const FW_PDFID_UNKNOWN: u32 = 0xf0_0001;
const FW_FUNCTION_BUSY: u32 = 0xf0_0003;
const FW_PORT_BUSY: u32 = 0xf0_0004;
const FW_DENIED: u32 = 0xf0_0005;
const FW_HOST_LIMIT: u32 = 0xf0_0006;
const FW_PF_VF_CONFLICT: u32 = 0xf0_0007;
const FW_HOTPLUG_FAILED: u32 = 0xf0_0008;
const FW_UNBIND_TIMEOUT: u32 = 0xf0_0009;
const FW_NOT_BOUND: u32 = 0xf0_000a;

/// A failed operation: the errno for the caller and the firmware's return code, if the
/// firmware refused.
pub(crate) struct Failure {
    pub(crate) err: Error,
    pub(crate) fw_ret: u32,
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Self { err, fw_ret: 0 }
    }
}

/// The errno for a firmware refusal.
fn fw_errno(ret: u32) -> Error {
    match ret {
        FW_PDFID_UNKNOWN | FW_NOT_BOUND => ENOENT,
        FW_FUNCTION_BUSY | FW_PORT_BUSY | FW_PF_VF_CONFLICT => EBUSY,
        FW_DENIED => EACCES,
        FW_HOST_LIMIT => ENOSPC,
        FW_UNBIND_TIMEOUT => ETIMEDOUT,
        FW_PARAM_INVALID => EINVAL,
        FW_HOTPLUG_FAILED => EIO,
        _ => EIO,
    }
}

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

/// How long a slot this host powered off is left alone before a function is bound into it
/// again: pciehp finishes its power-off sequence (indicators, the one-second wait after
/// power-off) and the switch its detach before a new hot-plug arrives at that slot.
const SETTLE: Delta = Delta::from_millis(2_000);

/// State guarded by [`Compose::lock`].
struct State {
    /// `false` once the endpoint is being unbound.
    alive: bool,
    /// When this host last powered off each of its logical ports' slots.
    powered_off: [Option<Instant<Monotonic>>; LOG_PORTS as usize],
    /// Per logical port, the PDFID this host itself unbound from it, whose `UNBIND_REQUEST`
    /// the firmware sends back to us: the fabric-event work must not act on it, since the
    /// port may hold a function bound again since (a rolled-back move).
    own_unbind: [Option<u16>; LOG_PORTS as usize],
}

impl State {
    /// Records how a function left logical port `port` of this host.
    fn removed(&mut self, port: u8, how: hotplug::Removal) {
        if how == hotplug::Removal::SlotPoweredOff {
            if let Some(t) = self.powered_off.get_mut(usize::from(port)) {
                *t = Some(Instant::now());
            }
        }
    }

    /// Waits until the slot of `port` has settled after a power-off of ours.
    fn settle(&self, port: u8) {
        if let Some(Some(t)) = self.powered_off.get(usize::from(port)) {
            let spent = t.elapsed();
            if spent < SETTLE {
                fsleep(SETTLE - spent);
            }
        }
    }
}

/// Serialises composition operations of one endpoint.
#[pin_data]
pub(crate) struct Compose {
    #[pin]
    lock: Mutex<State>,
}

impl Compose {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            lock <- new_mutex!(State {
                alive: true,
                powered_off: [None; LOG_PORTS as usize],
                own_unbind: [None; LOG_PORTS as usize],
            }),
        })
    }

    /// Waits for a running operation and refuses new ones; called on unbind.
    pub(crate) fn shut_down(&self) {
        self.lock.lock().alive = false;
    }
}

fn hvd(mep: &Mep, host: u8) -> Result<Hvd> {
    let mut out = [0u8; 148];
    fabric::call(mep, CMD_GFMS_DB_DUMP, &[DB_DUMP_HVD, host], &mut out)?;
    let size = usize::try_from(fabric::le32(&out, 4)?).map_err(|_| EIO)? * 4;
    let count = fabric::le16(&out, 16)?;
    if size < out.len() || size > mrpc::PAYLOAD || count < u16::from(LOG_PORTS) {
        return Err(EIO);
    }
    let mut ports = [None; LOG_PORTS as usize];
    for (l, p) in ports.iter_mut().enumerate() {
        // Entry `8 * L` is function slot 0 of logical port L.
        let e = 20 + 4 * 8 * l;
        if fabric::byte(&out, e + 1)? != 0 {
            *p = Some(fabric::le16(&out, e + 2)?);
        }
    }
    Ok(Hvd {
        usp_port: fabric::byte(&out, 13)?,
        ports,
    })
}

/// Runs a bind or unbind command; a refusal becomes a [`Failure`] with the firmware's code.
fn bind_unbind(mep: &Mep, input: &[u8], timeout_ms: u32) -> Result<(), Failure> {
    let mut out = [0u8; 4];
    let reply = mep
        .mrpc
        .run(mep, CMD_GFMS_BIND_UNBIND, input, &mut out, timeout_ms)?;
    if reply.status != mrpc::STATUS_DONE {
        return Err(Failure {
            err: fw_errno(reply.ret),
            fw_ret: reply.ret,
        });
    }
    Ok(())
}

fn bind_cmd(usp_port: u8, port: u8, pdfid: u16) -> [u8; 36] {
    let mut input = [0u8; 36];
    input[..4].copy_from_slice(&[SUB_BIND, 0, usp_port, port]);
    // Function entry 0: the PDFID, no further entry.
    input[4..6].copy_from_slice(&pdfid.to_le_bytes());
    input
}

fn unbind_cmd(usp_port: u8, port: u8, pdfid: u16) -> [u8; 8] {
    let p = pdfid.to_le_bytes();
    [SUB_UNBIND, 0, usp_port, port, p[0], p[1], 0, 0]
}

/// Milliseconds left of `timeout_ms` since `start`, at least 1.
fn left(start: &Instant<Monotonic>, timeout_ms: u32) -> u32 {
    let spent = u32::try_from(start.elapsed().as_millis()).unwrap_or(u32::MAX);
    timeout_ms.saturating_sub(spent).max(1)
}

impl Mep {
    /// Finds where `pdfid` is bound: `(host, logical port)`.
    fn binding(&self, pdfid: u16) -> Result<Option<(u8, u8)>> {
        self.fabric
            .with_view(self, |v| {
                v.functions.iter().find(|f| f.pdfid == pdfid).map(|f| {
                    if f.bound_host == crate::uapi::UNBOUND {
                        None
                    } else {
                        Some((f.bound_host, f.bound_log_port))
                    }
                })
            })?
            .ok_or(ENOENT)
    }

    /// Binds `pdfid` to logical port `port` (or the first free one) of `host`.
    ///
    /// When `host` is this host, returns once this host has enumerated the function; if it
    /// does not appear in time the binding is undone and the caller gets `ETIMEDOUT`.
    pub(crate) fn bind(
        &self,
        pdfid: u16,
        host: u8,
        port: Option<u8>,
        timeout_ms: u32,
        wait_local: bool,
    ) -> Result<Bound, Failure> {
        let start = Instant::<Monotonic>::now();
        let mut st = self.compose.lock.lock();
        if !st.alive {
            return Err(ENODEV.into());
        }
        self.bind_locked(&mut st, pdfid, host, port, &start, timeout_ms, wait_local)
    }

    #[allow(clippy::too_many_arguments)]
    fn bind_locked(
        &self,
        st: &mut State,
        pdfid: u16,
        host: u8,
        port: Option<u8>,
        start: &Instant<Monotonic>,
        timeout_ms: u32,
        wait_local: bool,
    ) -> Result<Bound, Failure> {
        if port.is_some_and(|p| p >= LOG_PORTS) {
            return Err(EINVAL.into());
        }
        // With no port given, take the first free one; another host may take it between our
        // look and our bind, so look again then.
        let mut tries = 0;
        let (h, port) = loop {
            let h = hvd(self, host)?;
            let local = usize::from(host) == self.partition;
            let p = match port {
                Some(p) => p,
                // A free port; on this host the one we powered off longest ago.
                None => (0..LOG_PORTS)
                    .filter(|&p| h.ports[usize::from(p)].is_none())
                    .min_by_key(|&p| match st.powered_off[usize::from(p)] {
                        Some(t) if local => i64::MAX - t.elapsed().as_millis(),
                        _ => i64::MIN,
                    })
                    .ok_or(ENOSPC)?,
            };
            if local {
                st.settle(p);
            }
            match bind_unbind(
                self,
                &bind_cmd(h.usp_port, p, pdfid),
                left(start, timeout_ms),
            ) {
                Err(Failure {
                    fw_ret: FW_PORT_BUSY,
                    ..
                }) if port.is_none() && tries < LOG_PORTS => tries += 1,
                Err(f) => return Err(f),
                Ok(()) => break (h, p),
            }
        };
        self.fabric.invalidate();
        if usize::from(host) != self.partition || !wait_local {
            return Ok(Bound { port, local: None });
        }
        loop {
            if let Some(found) = hotplug::find(&self.pdev, port) {
                return Ok(Bound {
                    port,
                    local: Some(found),
                });
            }
            if start.elapsed().as_millis() >= i64::from(timeout_ms) {
                break;
            }
            fsleep(POLL);
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
            &unbind_cmd(h.usp_port, port, pdfid),
            DEFAULT_TIMEOUT_MS,
        );
        self.fabric.invalidate();
        Err(ETIMEDOUT.into())
    }

    /// Unbinds `pdfid` from the host holding it. Returns `(host, port)` it was bound to.
    pub(crate) fn unbind(&self, pdfid: u16, timeout_ms: u32) -> Result<(u8, u8), Failure> {
        let start = Instant::<Monotonic>::now();
        let mut st = self.compose.lock.lock();
        if !st.alive {
            return Err(ENODEV.into());
        }
        self.unbind_locked(&mut st, pdfid, &start, timeout_ms)
    }

    fn unbind_locked(
        &self,
        st: &mut State,
        pdfid: u16,
        start: &Instant<Monotonic>,
        timeout_ms: u32,
    ) -> Result<(u8, u8), Failure> {
        let (host, port) = self.binding(pdfid)?.ok_or(Failure {
            err: ENOENT,
            fw_ret: FW_NOT_BOUND,
        })?;
        let removed = if usize::from(host) == self.partition {
            let how = hotplug::remove(&self.pdev, port)?;
            st.removed(port, how);
            how
        } else {
            hotplug::Removal::NotPresent
        };
        let h = hvd(self, host)?;
        let own = usize::from(host) == self.partition && port < LOG_PORTS;
        if own {
            st.own_unbind[usize::from(port)] = Some(pdfid);
        }
        let result = bind_unbind(
            self,
            &unbind_cmd(h.usp_port, port, pdfid),
            left(start, timeout_ms),
        );
        if own {
            // A refused request never reaches the point where the firmware sends the event.
            if let Err(Failure { fw_ret, .. }) = result {
                if fw_ret != FW_UNBIND_TIMEOUT && fw_ret != FW_HOTPLUG_FAILED {
                    st.own_unbind[usize::from(port)] = None;
                }
            }
        }
        self.fabric.invalidate();
        match result {
            // The firmware may already have seen the function leave when its slot went off.
            Err(Failure {
                fw_ret: FW_NOT_BOUND,
                ..
            }) if removed == hotplug::Removal::SlotPoweredOff => Ok((host, port)),
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
        let mut st = self.compose.lock.lock();
        if !st.alive {
            return Err(ENODEV.into());
        }
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
        let from = self.unbind_locked(&mut st, pdfid, &start, timeout_ms)?;
        match self.bind_locked(&mut st, pdfid, host, port, &start, timeout_ms, true) {
            Ok(b) => Ok((b, from)),
            Err(f) => {
                // Put it back; the caller learns the move failed either way.
                let back = self.bind_locked(
                    &mut st,
                    pdfid,
                    from.0,
                    Some(from.1),
                    &Instant::<Monotonic>::now(),
                    DEFAULT_TIMEOUT_MS,
                    true,
                );
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
    pub(crate) fn handle_gfms_events(&self) {
        let mut st = self.compose.lock.lock();
        if !st.alive {
            return;
        }
        let Ok(mine) = hvd(self, self.partition as u8).map(|h| h.usp_port) else {
            return;
        };
        let mut out = [0u8; mrpc::PAYLOAD];
        for _ in 0..EVENT_BATCHES {
            // GET, up to 32 events.
            if fabric::call(self, CMD_GFMS_EVENT, &[SUB_EVENT_GET, 0, 32, 0], &mut out).is_err() {
                return;
            }
            let Ok(num) = fabric::le16(&out, 0) else {
                return;
            };
            let mut at = 4;
            for _ in 0..num {
                let (Ok(len), Ok(code)) = (fabric::le16(&out, at), fabric::byte(&out, at + 2))
                else {
                    return;
                };
                let len = usize::from(len);
                if len < 4 || len % 4 != 0 || at + len > out.len() {
                    dev_warn!(self.pdev, "malformed fabric event list from the firmware\n");
                    return;
                }
                if code == EVENT_UNBIND_REQUEST && fabric::byte(&out, at + 5) == Ok(mine) {
                    let (Ok(port), Ok(pdfid)) =
                        (fabric::byte(&out, at + 6), fabric::le16(&out, at + 8))
                    else {
                        return;
                    };
                    let slot = st.own_unbind.get_mut(usize::from(port));
                    if let Some(own) = slot.filter(|own| **own == Some(pdfid)) {
                        // Our own unbind: the function already left, and the port may hold a
                        // new one by now.
                        *own = None;
                    } else {
                        match hotplug::remove(&self.pdev, port) {
                            Ok(how) => {
                                st.removed(port, how);
                                dev_info!(
                                    self.pdev,
                                    "function on port {} leaving this host: {:?}\n",
                                    port,
                                    how
                                )
                            }
                            Err(e) => dev_warn!(
                                self.pdev,
                                "could not remove the function on port {}: {:?}\n",
                                port,
                                e
                            ),
                        }
                    }
                }
                at += len;
            }
            let remain = fabric::le16(&out, 2).unwrap_or(0) & 0x7fff;
            if num == 0 || remain == 0 {
                return;
            }
        }
    }
}
