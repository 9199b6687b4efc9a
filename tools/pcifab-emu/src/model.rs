// SPDX-License-Identifier: GPL-2.0-only
//! The fabric behind the MRPC commands: physical ports and their links,
//! hosts with logical ports, endpoint functions and their bindings, the
//! generation counter, the per-host GFMS event queues, and the P2P routes of
//! every MEP and the grants they need ("0xF004 P2P_ROUTE"). One model is
//! shared by every MEP (see Documentation/mrpc.rst, "The fabric model").

use crate::config::{Config, Dialect, Firmware, LOG_PORTS};
use crate::gas::{DSPS_PER_PARTITION, PFFS_PER_PARTITION};
use std::collections::VecDeque;

/// PDFID of function `f` (0 the PF, i VF i) of the endpoint on physical port `port`: the
/// PF and VFs 1-31 in the port's block of 32 from 0x0100 (up to 0x077f), VFs 32-255 in the
/// port's block of 256 from 0x1000 (whose first 32 stay unused), so no two meet.
pub fn pdfid(port: u8, f: u8) -> u16 {
    if f < 32 {
        0x0100 + 0x20 * u16::from(port) + u16::from(f)
    } else {
        0x1000 + 0x100 * u16::from(port) + u16::from(f)
    }
}

/// Most GFMS events queued per host.
pub const EVENT_QUEUE_DEPTH: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PortKind {
    /// Upstream port of the host with this partition index.
    Host(usize),
    /// Endpoint port with this endpoint index.
    Endpoint(usize),
}

#[derive(Debug, Clone)]
pub struct Port {
    pub id: u8,
    pub kind: PortKind,
    pub link_up: bool,
}

#[derive(Debug, Clone)]
pub struct Function {
    pub pdfid: u16,
    pub pf_pdfid: u16,
    /// 0 for the PF, i for VF i.
    pub vf_index: u8,
    pub port: u8,
    pub endpoint: usize,
    pub vid: u16,
    pub did: u16,
    pub class: u32,
    /// For a PF: its number of VFs; 0 for a VF.
    pub total_vfs: u8,
    /// (partition, logical port)
    pub binding: Option<(usize, u8)>,
    /// A bind (to this partition, logical port) or unbind is in flight.
    pub op: Option<Op>,
    /// Its function number in the multi-function device on its logical port
    /// (0 for a single function); meaningful while bound or binding.
    pub devfn: u8,
    /// Bound by a `no-enumerate` fault: no device was added to QEMU.
    pub phantom: bool,
    /// Times its device memory was scrubbed.
    pub scrubs: u64,
    /// Size of its device memory in bytes (what routes may reach).
    pub dev_mem: u64,
    /// Size of its BAR2 in bytes.
    pub bar2: u64,
    /// An nvme function: QEMU's own device, whose config space and BARs
    /// the emulator does not hold.
    pub nvme: bool,
    /// Its EP management tunnel is enabled (EP_TUNNEL_CFG); closed when an
    /// unbind of it begins.
    pub tunnel: bool,
}

/// A bind or unbind in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    Bind(usize, u8),
    Unbind,
}

/// Who asks for a bind or unbind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Requester {
    /// The host of this partition (an MRPC command on its MEP).
    Host(usize),
    /// The control socket, acting as the fabric manager.
    Control,
}

/// A checked bind or unbind, reserved in the model until finished.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    pub bind: bool,
    pub pdfid: u16,
    pub host: usize,
    pub log_port: u8,
    pub requester: Requester,
    /// Function number on the logical port (PCI function of the device).
    pub devfn: u8,
}

/// Most functions one logical port holds (one multi-function device):
/// switchtec-user's SWITCHTEC_FABRIC_MULTI_FUNC_NUM.
pub const MULTI_FUNC_NUM: usize = 8;

// Return codes of GFMS_BIND_UNBIND: PAX's (switchtec-user's errors.h) and,
// for what only an emulator can meet, pcifab's (Documentation/mrpc.rst).
pub const ERR_PHYC_PORT_ARDY_BIND: u32 = 0x1;
pub const ERR_LOGC_PORT_ARDY_BIND: u32 = 0x2;
pub const ERR_PHYC_PORT_NOT_EXIST: u32 = 0x4;
pub const ERR_NO_LOGC_PORT: u32 = 0x6;
pub const ERR_BIND_IN_PROGRESS: u32 = 0x7;
pub const ERR_BIND_SUBCMD_INVALID: u32 = 0x9;
pub const ERR_LOGC_PORT_NOT_BIND_PHYC_PORT: u32 = 0xb;
pub const ERR_BIND_CHECK_FAIL: u32 = 0xd;
pub const ERR_PARAM_INVALID: u32 = 0x64006;
pub const ERR_MRPC_DENIED: u32 = 0x64010;
pub const PCIFAB_ERR_PDFID_UNKNOWN: u32 = 0xf0_0001;
pub const PCIFAB_ERR_RANGE: u32 = 0xf0_0002;
pub const PCIFAB_ERR_FUNCTION_BUSY: u32 = 0xf0_0003;
pub const PCIFAB_ERR_PORT_BUSY: u32 = 0xf0_0004;
pub const PCIFAB_ERR_DENIED: u32 = 0xf0_0005;
pub const PCIFAB_ERR_HOST_LIMIT: u32 = 0xf0_0006;
pub const PCIFAB_ERR_PF_VF_CONFLICT: u32 = 0xf0_0007;
pub const PCIFAB_ERR_HOTPLUG_FAILED: u32 = 0xf0_0008;
pub const PCIFAB_ERR_UNBIND_TIMEOUT: u32 = 0xf0_0009;
pub const PCIFAB_ERR_NOT_BOUND: u32 = 0xf0_000a;
pub const PCIFAB_ERR_ROUTE_FULL: u32 = 0xf0_000b;
pub const PCIFAB_ERR_ROUTE_CONFLICT: u32 = 0xf0_000c;
pub const PCIFAB_ERR_NO_ROUTE: u32 = 0xf0_000d;
pub const PCIFAB_ERR_NOT_HOLDER: u32 = 0xf0_000e;
pub const PCIFAB_ERR_NO_GRANT: u32 = 0xf0_000f;
pub const PCIFAB_ERR_NOT_GRANTED: u32 = 0xf0_0010;
pub const PCIFAB_ERR_GRANT_FULL: u32 = 0xf0_0011;

pub fn ret_name(ret: u32) -> &'static str {
    match ret {
        0 => "OK",
        ERR_PHYC_PORT_ARDY_BIND => "PHYC_PORT_ARDY_BIND",
        ERR_LOGC_PORT_ARDY_BIND => "LOGC_PORT_ARDY_BIND",
        ERR_PHYC_PORT_NOT_EXIST => "PHYC_PORT_NOT_EXIST",
        ERR_NO_LOGC_PORT => "NO_LOGC_PORT",
        ERR_BIND_IN_PROGRESS => "BIND_IN_PROGRESS",
        ERR_BIND_SUBCMD_INVALID => "BIND_SUBCMD_INVALID",
        ERR_LOGC_PORT_NOT_BIND_PHYC_PORT => "LOGC_PORT_NOT_BIND_PHYC_PORT",
        ERR_BIND_CHECK_FAIL => "BIND_CHECK_FAIL",
        ERR_PARAM_INVALID => "PARAM_INVALID",
        ERR_MRPC_DENIED => "MRPC_DENIED",
        PCIFAB_ERR_PDFID_UNKNOWN => "PDFID_UNKNOWN",
        PCIFAB_ERR_RANGE => "RANGE",
        PCIFAB_ERR_FUNCTION_BUSY => "FUNCTION_BUSY",
        PCIFAB_ERR_PORT_BUSY => "PORT_BUSY",
        PCIFAB_ERR_DENIED => "DENIED",
        PCIFAB_ERR_HOST_LIMIT => "HOST_LIMIT",
        PCIFAB_ERR_PF_VF_CONFLICT => "PF_VF_CONFLICT",
        PCIFAB_ERR_HOTPLUG_FAILED => "HOTPLUG_FAILED",
        PCIFAB_ERR_UNBIND_TIMEOUT => "UNBIND_TIMEOUT",
        PCIFAB_ERR_NOT_BOUND => "NOT_BOUND",
        PCIFAB_ERR_ROUTE_FULL => "ROUTE_FULL",
        PCIFAB_ERR_ROUTE_CONFLICT => "ROUTE_CONFLICT",
        PCIFAB_ERR_NO_ROUTE => "NO_ROUTE",
        PCIFAB_ERR_NOT_HOLDER => "NOT_HOLDER",
        PCIFAB_ERR_NO_GRANT => "NO_GRANT",
        PCIFAB_ERR_NOT_GRANTED => "NOT_GRANTED",
        PCIFAB_ERR_GRANT_FULL => "GRANT_FULL",
        _ => "?",
    }
}

#[derive(Debug, Clone)]
pub struct Telemetry {
    pub temp_centi: i32,
    pub power_mw: u32,
    pub power_limit_mw: u32,
    pub utilisation: u8,
}

#[derive(Debug, Clone)]
pub struct Endpoint {
    pub name: String,
    pub vfs: u8,
    pub telemetry: Telemetry,
}

/// A queued GFMS event (fabric.h's event codes).
#[derive(Debug, Clone, PartialEq)]
pub enum GfmsEvent {
    HostLink {
        port: u8,
        up: bool,
    },
    Dev {
        port: u8,
        functions: u16,
        add: bool,
    },
    DatabaseChanged,
    /// BIND (6), UNBIND (7) or pcifab's UNBIND_REQUEST (0x80): the host's
    /// USP port, its logical port, the function.
    Binding {
        code: u8,
        host_port: u8,
        log_port: u8,
        pdfid: u16,
    },
}

pub const GFMS_HOST_LINK_UP: u8 = 0;
pub const GFMS_HOST_LINK_DOWN: u8 = 1;
pub const GFMS_DEV_ADD: u8 = 2;
pub const GFMS_DEV_DEL: u8 = 3;
pub const GFMS_BIND: u8 = 6;
pub const GFMS_UNBIND: u8 = 7;
pub const GFMS_DATABASE_CHANGED: u8 = 8;
/// pcifab: the owner is asked to let go of a function (owner's queue only).
pub const GFMS_UNBIND_REQUEST: u8 = 0x80;

impl GfmsEvent {
    /// The wire entry: entry_len, event_code, src_sw_id, data.
    pub fn encode(&self) -> Vec<u8> {
        let (code, data): (u8, Vec<u8>) = match *self {
            GfmsEvent::HostLink { port, up } => (
                if up {
                    GFMS_HOST_LINK_UP
                } else {
                    GFMS_HOST_LINK_DOWN
                },
                [u16::from(port).to_le_bytes(), [0, 0]].concat(),
            ),
            GfmsEvent::Dev {
                port,
                functions,
                add,
            } => (
                if add { GFMS_DEV_ADD } else { GFMS_DEV_DEL },
                [u16::from(port).to_le_bytes(), functions.to_le_bytes()].concat(),
            ),
            GfmsEvent::DatabaseChanged => (GFMS_DATABASE_CHANGED, Vec::new()),
            GfmsEvent::Binding {
                code,
                host_port,
                log_port,
                pdfid,
            } => (
                code,
                [
                    &[0, host_port, log_port, 0][..],
                    &pdfid.to_le_bytes(),
                    &[0, 0],
                ]
                .concat(),
            ),
        };
        let len = 4 + data.len() as u16;
        let mut out = len.to_le_bytes().to_vec();
        out.push(code);
        out.push(0);
        out.extend_from_slice(&data);
        out
    }

    pub fn describe(&self) -> String {
        match *self {
            GfmsEvent::HostLink { port, up } => {
                format!("host_link_{} port {port}", if up { "up" } else { "down" })
            }
            GfmsEvent::Dev {
                port,
                functions,
                add,
            } => format!(
                "dev_{} port {port} functions {functions}",
                if add { "add" } else { "del" }
            ),
            GfmsEvent::DatabaseChanged => "database_changed".into(),
            GfmsEvent::Binding {
                code,
                host_port,
                log_port,
                pdfid,
            } => format!(
                "{} pdfid {pdfid:#06x} host_port {host_port} log_port {log_port}",
                match code {
                    GFMS_BIND => "bind",
                    GFMS_UNBIND => "unbind",
                    _ => "unbind_request",
                }
            ),
        }
    }
}

/// Per-host firmware state: its GFMS event queue and dump snapshots.
#[derive(Debug, Default)]
pub struct HostState {
    pub name: String,
    pub port: u8,
    /// Endpoint indices this host may bind to itself (None: all).
    pub allowed: Option<Vec<usize>>,
    pub max_functions: u8,
    /// May bind / unbind anything anywhere.
    pub manager: bool,
    pub events: VecDeque<GfmsEvent>,
    pub overflow: bool,
    pub topo: Option<Vec<u8>>,
    /// The GFMS_DB_DUMP section a START fetched: (sub-command, bytes).
    pub dump: Option<(u8, Vec<u8>)>,
    /// The P2P routes of this host's MEP, ascending window_off.
    pub routes: Vec<Route>,
}

/// Most routes per MEP.
pub const MAX_ROUTES: usize = 16;
/// Alignment of route offsets and sizes.
pub const ROUTE_ALIGN: u64 = 4096;

/// `size` bytes of a MEP's window from `window_off` onto the device memory
/// of function `pdfid` from `target_off`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub window_off: u64,
    pub size: u64,
    pub target_off: u64,
    pub pdfid: u16,
}

impl Route {
    fn end(&self) -> u64 {
        self.window_off.saturating_add(self.size)
    }
}

/// The host of partition `grantee` may route its window onto function
/// `pdfid`, which another host holds. Dropped when the function is unbound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    pub pdfid: u16,
    pub grantee: usize,
}

/// Most grants in the fabric: a GRANT_LIST of all of them fills the
/// 1024-byte output buffer exactly ((1024 - 8) / 8).
pub const MAX_GRANTS: usize = 127;

/// One GRANT_LIST entry: (pdfid, holder partition, grantee partition).
pub type GrantEntry = (u16, usize, usize);

/// What the GAS of every MEP must show after a fabric change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Notice {
    /// PFF instances whose link_state_hdr fires.
    pub pffs: Vec<u32>,
    /// The GFMS event header fires.
    pub gfms: bool,
    /// Partitions whose MEP lost P2P routes (ROUTES_CHANGED fires there).
    pub routes_lost: Vec<usize>,
}

pub struct Model {
    pub fw: Firmware,
    pub dialect: Dialect,
    /// Sorted by id.
    pub ports: Vec<Port>,
    pub endpoints: Vec<Endpoint>,
    /// Sorted by pdfid.
    pub functions: Vec<Function>,
    pub hosts: Vec<HostState>,
    pub generation: u32,
    /// Size of every MEP's P2P window in bytes.
    pub window: u64,
    /// P2P grants: who may route onto a function another host holds.
    /// Ascending (pdfid, grantee).
    pub grants: Vec<Grant>,
}

impl Model {
    pub fn new(cfg: &Config) -> Model {
        let mut ports = Vec::new();
        let mut hosts = Vec::new();
        for (i, h) in cfg.hosts.iter().enumerate() {
            let port = cfg.host_port(i);
            ports.push(Port {
                id: port,
                kind: PortKind::Host(i),
                link_up: true,
            });
            let allowed = h.allowed.as_ref().map(|names| {
                names
                    .iter()
                    .filter_map(|n| cfg.endpoints.iter().position(|e| e.name == *n))
                    .collect()
            });
            hosts.push(HostState {
                name: h.name.clone(),
                port,
                allowed,
                max_functions: h.max_functions,
                manager: cfg.policy.manager.as_ref().is_none_or(|m| *m == h.name),
                ..HostState::default()
            });
        }
        let mut endpoints = Vec::new();
        let mut functions = Vec::new();
        for (e, ep) in cfg.endpoints.iter().enumerate() {
            ports.push(Port {
                id: ep.port,
                kind: PortKind::Endpoint(e),
                link_up: true,
            });
            endpoints.push(Endpoint {
                name: ep.name.clone(),
                vfs: ep.vfs,
                telemetry: Telemetry {
                    temp_centi: ep.temp_centi,
                    power_mw: ep.power_mw,
                    power_limit_mw: ep.power_limit_mw,
                    utilisation: ep.utilisation,
                },
            });
            for f in 0..=ep.vfs {
                functions.push(Function {
                    pdfid: pdfid(ep.port, f),
                    pf_pdfid: pdfid(ep.port, 0),
                    vf_index: f,
                    port: ep.port,
                    endpoint: e,
                    vid: ep.vid(),
                    did: if f == 0 { ep.did() } else { ep.vf_did() },
                    class: ep.class_code(),
                    total_vfs: if f == 0 { ep.vfs } else { 0 },
                    binding: None,
                    devfn: 0,
                    op: None,
                    phantom: false,
                    scrubs: 0,
                    dev_mem: if f == 0 {
                        u64::from(ep.pf_dev_mem_mib()) << 20
                    } else {
                        u64::from(ep.vf_mem()) << 20
                    },
                    bar2: u64::from(if f == 0 { ep.pf_mem_mib() } else { ep.vf_mem() }) << 20,
                    nvme: ep.is_nvme(),
                    tunnel: false,
                });
            }
        }
        for b in &cfg.bindings {
            // Validated by Config: names exist, ports and functions are free.
            let (Some(ep), Some(host)) = (
                cfg.endpoints.iter().find(|e| e.name == b.endpoint),
                cfg.hosts.iter().position(|h| h.name == b.host),
            ) else {
                continue;
            };
            let id = pdfid(ep.port, b.vf);
            if let Some(f) = functions.iter_mut().find(|f| f.pdfid == id) {
                f.binding = Some((host, b.logical_port));
                // Not in QEMU until attach_initial() added it.
                f.phantom = true;
            }
        }
        ports.sort_by_key(|p| p.id);
        functions.sort_by_key(|f| f.pdfid);
        Model {
            fw: cfg.firmware.clone(),
            dialect: cfg.dialect,
            ports,
            endpoints,
            functions,
            hosts,
            generation: 1,
            window: u64::from(cfg.p2p_window_mib) << 20,
            grants: Vec::new(),
        }
    }

    pub fn port(&self, id: u8) -> Option<&Port> {
        self.ports.iter().find(|p| p.id == id)
    }

    pub fn function(&self, pdfid: u16) -> Option<&Function> {
        self.functions.iter().find(|f| f.pdfid == pdfid)
    }

    pub fn endpoint_functions(&self, e: usize) -> impl Iterator<Item = &Function> {
        self.functions.iter().filter(move |f| f.endpoint == e)
    }

    pub fn port_map(&self, want: impl Fn(&Port) -> bool) -> u64 {
        self.ports
            .iter()
            .filter(|p| want(p))
            .fold(0, |m, p| m | 1u64 << p.id)
    }

    pub fn link_up(&self, port: u8) -> bool {
        self.port(port).is_some_and(|p| p.link_up)
    }

    pub fn bound_count(&self) -> usize {
        self.functions
            .iter()
            .filter(|f| f.binding.is_some())
            .count()
    }

    /// Queue an event on every host.
    fn queue(&mut self, ev: GfmsEvent) {
        for h in &mut self.hosts {
            if h.events.len() >= EVENT_QUEUE_DEPTH {
                h.overflow = true;
            } else {
                h.events.push_back(ev.clone());
            }
        }
    }

    /// GFMS events queued per host, in partition order.
    pub fn pending(&self) -> Vec<u32> {
        self.hosts.iter().map(|h| h.events.len() as u32).collect()
    }

    /// Set a port's link state. Returns the change to signal, or None when
    /// the link already was in that state; Err for an unknown port.
    pub fn set_link(&mut self, port: u8, up: bool) -> Result<Option<Notice>, String> {
        let p = self
            .ports
            .iter_mut()
            .find(|p| p.id == port)
            .ok_or_else(|| format!("no physical port {port} in the fabric"))?;
        if p.link_up == up {
            return Ok(None);
        }
        p.link_up = up;
        let kind = p.kind;
        self.generation = self.generation.wrapping_add(1).max(1);
        let pffs = match kind {
            PortKind::Host(h) => {
                self.queue(GfmsEvent::HostLink { port, up });
                vec![h as u32 * PFFS_PER_PARTITION]
            }
            PortKind::Endpoint(e) => {
                let functions = self.endpoint_functions(e).count() as u16;
                self.queue(GfmsEvent::Dev {
                    port,
                    functions,
                    add: up,
                });
                let mut pffs: Vec<u32> = self
                    .endpoint_functions(e)
                    .filter_map(|f| f.binding)
                    .filter(|&(_, l)| u32::from(l) < DSPS_PER_PARTITION)
                    .map(|(h, l)| h as u32 * PFFS_PER_PARTITION + 2 + u32::from(l))
                    .collect();
                pffs.sort_unstable();
                pffs.dedup();
                pffs
            }
        };
        Ok(Some(Notice {
            pffs,
            gfms: true,
            ..Notice::default()
        }))
    }

    /// Any other change of the fabric database.
    pub fn fabric_change(&mut self) -> Notice {
        self.generation = self.generation.wrapping_add(1).max(1);
        self.queue(GfmsEvent::DatabaseChanged);
        Notice {
            gfms: true,
            ..Notice::default()
        }
    }

    /// Telemetry of one function: (temp, power, utilisation, health flags).
    pub fn telemetry(&self, f: &Function) -> (i32, u32, u8, u32) {
        let ep = &self.endpoints[f.endpoint];
        let t = &ep.telemetry;
        let power = if f.vf_index == 0 {
            t.power_mw
        } else {
            t.power_mw / (u32::from(ep.vfs) + 1)
        };
        let mut health = 0;
        if !self.link_up(f.port) {
            health |= 1;
        }
        if t.temp_centi >= 8500 {
            health |= 2;
        }
        if t.power_mw > t.power_limit_mw {
            health |= 4;
        }
        (t.temp_centi, power, t.utilisation, health)
    }

    fn bump_generation(&mut self) {
        self.generation = self.generation.wrapping_add(1).max(1);
    }

    /// Queue an event on one host only. True when it was queued.
    pub fn queue_to(&mut self, host: usize, ev: GfmsEvent) -> bool {
        let Some(h) = self.hosts.get_mut(host) else {
            return false;
        };
        if h.events.len() >= EVENT_QUEUE_DEPTH {
            h.overflow = true;
            false
        } else {
            h.events.push_back(ev);
            true
        }
    }

    fn index(&self, pdfid: u16) -> Option<usize> {
        self.functions.iter().position(|f| f.pdfid == pdfid)
    }

    /// Functions held by (or being bound to) a host.
    fn held(&self, host: usize) -> usize {
        self.functions
            .iter()
            .filter(|f| {
                f.binding.is_some_and(|b| b.0 == host)
                    || matches!(f.op, Some(Op::Bind(h, _)) if h == host)
            })
            .count()
    }

    /// The host whose USP is physical port `port`.
    pub fn host_by_port(&self, port: u8) -> Result<usize, u32> {
        match self.port(port).map(|p| p.kind) {
            Some(PortKind::Host(h)) => Ok(h),
            _ => Err(ERR_PHYC_PORT_NOT_EXIST),
        }
    }

    /// Check a bind of `pdfids` as one multi-function device (function i is
    /// `pdfids[i]`) to (`host`, `log_port`) and reserve all of them, or none.
    pub fn begin_bind_group(
        &mut self,
        requester: Requester,
        host: usize,
        log_port: u8,
        pdfids: &[u16],
    ) -> Result<Vec<Request>, u32> {
        if host >= self.hosts.len() {
            return Err(ERR_PARAM_INVALID);
        }
        if log_port >= LOG_PORTS {
            return Err(ERR_NO_LOGC_PORT);
        }
        if pdfids.is_empty() || pdfids.len() > MULTI_FUNC_NUM {
            return Err(ERR_PARAM_INVALID);
        }
        let mut idx = Vec::with_capacity(pdfids.len());
        for (n, &pdfid) in pdfids.iter().enumerate() {
            if pdfids[..n].contains(&pdfid) {
                return Err(ERR_PARAM_INVALID);
            }
            idx.push(self.index(pdfid).ok_or(ERR_PHYC_PORT_NOT_EXIST)?);
        }
        // The functions of a GFMS bind make one device: PAX firmware takes
        // them from one endpoint. The control socket may compose across
        // endpoints (a test fabric's multi-kind device).
        if let (Requester::Host(_), Some((&first, rest))) = (requester, idx.split_first()) {
            let ep = self.functions[first].endpoint;
            if rest.iter().any(|&i| self.functions[i].endpoint != ep) {
                return Err(ERR_BIND_CHECK_FAIL);
            }
        }
        if let Requester::Host(r) = requester {
            let rh = &self.hosts[r];
            if !rh.manager {
                for &i in &idx {
                    let ep = self.functions[i].endpoint;
                    if r != host || rh.allowed.as_ref().is_some_and(|a| !a.contains(&ep)) {
                        return Err(ERR_MRPC_DENIED);
                    }
                }
            }
        }
        for &i in &idx {
            let f = &self.functions[i];
            if f.op.is_some() {
                return Err(ERR_BIND_IN_PROGRESS);
            }
            if f.binding.is_some() {
                return Err(ERR_PHYC_PORT_ARDY_BIND);
            }
        }
        if self
            .functions
            .iter()
            .any(|g| g.op == Some(Op::Bind(host, log_port)))
        {
            return Err(ERR_BIND_IN_PROGRESS);
        }
        if self
            .functions
            .iter()
            .any(|g| g.binding == Some((host, log_port)))
        {
            return Err(ERR_LOGC_PORT_ARDY_BIND);
        }
        let busy = |g: &Function| g.binding.is_some() || g.op.is_some();
        let listed = |g: &Function| pdfids.contains(&g.pdfid);
        for &i in &idx {
            let f = &self.functions[i];
            // A PF and its VFs are never bound at once (here, elsewhere, or
            // in the same request).
            let conflict = if f.vf_index == 0 {
                self.functions
                    .iter()
                    .any(|g| g.pf_pdfid == f.pdfid && g.vf_index != 0 && (busy(g) || listed(g)))
            } else {
                self.function(f.pf_pdfid)
                    .is_some_and(|pf| busy(pf) || listed(pf))
            };
            if conflict {
                return Err(ERR_BIND_CHECK_FAIL);
            }
        }
        if self.held(host) + idx.len() > usize::from(self.hosts[host].max_functions) {
            return Err(ERR_MRPC_DENIED);
        }
        let mut reqs = Vec::with_capacity(idx.len());
        for (n, &i) in idx.iter().enumerate() {
            let f = &mut self.functions[i];
            f.op = Some(Op::Bind(host, log_port));
            f.devfn = n as u8;
            reqs.push(Request {
                bind: true,
                pdfid: f.pdfid,
                host,
                log_port,
                requester,
                devfn: n as u8,
            });
        }
        Ok(reqs)
    }

    /// Check an unbind of `pdfid` from (`host`, `log_port`) and reserve it
    /// with the rest of the device on that logical port.
    pub fn begin_unbind(
        &mut self,
        requester: Requester,
        host: usize,
        log_port: u8,
        pdfid: u16,
    ) -> Result<Vec<Request>, u32> {
        if host >= self.hosts.len() {
            return Err(ERR_PARAM_INVALID);
        }
        if log_port >= LOG_PORTS {
            return Err(ERR_NO_LOGC_PORT);
        }
        let i = self.index(pdfid).ok_or(ERR_PHYC_PORT_NOT_EXIST)?;
        if self.functions[i].op.is_some() {
            return Err(ERR_BIND_IN_PROGRESS);
        }
        if self.functions[i].binding != Some((host, log_port)) {
            return Err(ERR_LOGC_PORT_NOT_BIND_PHYC_PORT);
        }
        self.begin_unbind_port(requester, host, log_port)
    }

    /// Check an unbind of everything on logical port `log_port` of `host`
    /// (what a PAX unbind names) and reserve it.
    pub fn begin_unbind_port(
        &mut self,
        requester: Requester,
        host: usize,
        log_port: u8,
    ) -> Result<Vec<Request>, u32> {
        if host >= self.hosts.len() {
            return Err(ERR_PARAM_INVALID);
        }
        if log_port >= LOG_PORTS {
            return Err(ERR_NO_LOGC_PORT);
        }
        if let Requester::Host(r) = requester {
            if !self.hosts[r].manager && r != host {
                return Err(ERR_MRPC_DENIED);
            }
        }
        if self
            .functions
            .iter()
            .any(|g| g.op == Some(Op::Bind(host, log_port)))
        {
            return Err(ERR_BIND_IN_PROGRESS);
        }
        let mut idx: Vec<usize> = (0..self.functions.len())
            .filter(|&i| self.functions[i].binding == Some((host, log_port)))
            .collect();
        if idx.is_empty() {
            return Err(ERR_LOGC_PORT_NOT_BIND_PHYC_PORT);
        }
        if idx.iter().any(|&i| self.functions[i].op.is_some()) {
            return Err(ERR_BIND_IN_PROGRESS);
        }
        idx.sort_by_key(|&i| self.functions[i].devfn);
        let mut reqs = Vec::with_capacity(idx.len());
        for i in idx {
            let f = &mut self.functions[i];
            f.op = Some(Op::Unbind);
            // No EP_RESOURCE_ACCESS may start once the function is leaving
            // its owner (ep.rs); one already past its check finishes before
            // the scrub (the copy gate).
            f.tunnel = false;
            reqs.push(Request {
                bind: false,
                pdfid: f.pdfid,
                host,
                log_port,
                requester,
                devfn: f.devfn,
            });
        }
        Ok(reqs)
    }

    /// The owner is asked to let go (UNBIND_REQUEST on its queue only).
    /// Only the extended dialect has this event; a plain PAX queues nothing.
    pub fn unbind_request(&mut self, req: &Request) -> bool {
        if !self.dialect.extended() {
            return false;
        }
        let host_port = self.hosts[req.host].port;
        self.queue_to(
            req.host,
            GfmsEvent::Binding {
                code: GFMS_UNBIND_REQUEST,
                host_port,
                log_port: req.log_port,
                pdfid: req.pdfid,
            },
        )
    }

    /// A bind or unbind ended: on success the binding changes, BIND or
    /// UNBIND is queued on every host and the generation bumped.
    pub fn finish(&mut self, req: &Request, ok: bool, phantom: bool) -> Option<Notice> {
        let i = self.index(req.pdfid)?;
        let f = &mut self.functions[i];
        f.op = None;
        if !ok {
            return None;
        }
        let mut routes_lost = Vec::new();
        if req.bind {
            f.binding = Some((req.host, req.log_port));
            f.devfn = req.devfn;
            f.phantom = phantom;
        } else {
            f.binding = None;
            f.devfn = 0;
            f.phantom = false;
            routes_lost = self.drop_routes_to(req.pdfid);
            self.grants.retain(|g| g.pdfid != req.pdfid);
        }
        let host_port = self.hosts[req.host].port;
        self.bump_generation();
        self.queue(GfmsEvent::Binding {
            code: if req.bind { GFMS_BIND } else { GFMS_UNBIND },
            host_port,
            log_port: req.log_port,
            pdfid: req.pdfid,
        });
        Some(Notice {
            pffs: Vec::new(),
            gfms: true,
            routes_lost,
        })
    }

    /// The invariants of the fabric; empty when they hold.
    pub fn invariants(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (a, f) in self.functions.iter().enumerate() {
            let Some((h, l)) = f.binding else { continue };
            if h >= self.hosts.len() || l >= LOG_PORTS {
                v.push(format!(
                    "function {:#06x} bound to a host/port that does not exist",
                    f.pdfid
                ));
            }
            for g in &self.functions[a + 1..] {
                if g.binding == Some((h, l)) && g.devfn == f.devfn {
                    v.push(format!(
                        "logical port {l} of host {h} holds {:#06x} and {:#06x} as function {}",
                        f.pdfid, g.pdfid, f.devfn
                    ));
                }
            }
            if usize::from(f.devfn) >= MULTI_FUNC_NUM {
                v.push(format!(
                    "function {:#06x} has function number {}",
                    f.pdfid, f.devfn
                ));
            }
            if f.vf_index == 0 {
                for g in self
                    .functions
                    .iter()
                    .filter(|g| g.pf_pdfid == f.pdfid && g.vf_index != 0)
                {
                    if g.binding.is_some() {
                        v.push(format!(
                            "PF {:#06x} is bound while its VF {:#06x} is bound",
                            f.pdfid, g.pdfid
                        ));
                    }
                }
            }
        }
        for (h, host) in self.hosts.iter().enumerate() {
            let n = self
                .functions
                .iter()
                .filter(|f| f.binding.is_some_and(|b| b.0 == h))
                .count();
            if n > usize::from(host.max_functions) {
                v.push(format!(
                    "host {} holds {n} functions, more than its max_functions {}",
                    host.name, host.max_functions
                ));
            }
        }
        v.extend(self.route_invariants());
        v
    }
}

/// P2P routes and grants: what the MEPs' windows and DMA engines may reach.
impl Model {
    /// P2P_ROUTE ADD on the MEP of `host`, checked in the documented order.
    /// Returns the number of routes now.
    pub fn add_route(
        &mut self,
        host: usize,
        window_off: u64,
        size: u64,
        target_off: u64,
        pdfid: u16,
    ) -> Result<usize, u32> {
        let aligned = [window_off, size, target_off]
            .iter()
            .all(|v| v % ROUTE_ALIGN == 0);
        let fits = window_off
            .checked_add(size)
            .is_some_and(|end| end <= self.window);
        if !aligned || size == 0 || !fits || host >= self.hosts.len() {
            return Err(ERR_PARAM_INVALID);
        }
        let f = self.function(pdfid).ok_or(PCIFAB_ERR_PDFID_UNKNOWN)?;
        let Some((holder, _)) = f.binding else {
            return Err(PCIFAB_ERR_NOT_BOUND);
        };
        if holder != host && !self.granted(pdfid, host) {
            return Err(PCIFAB_ERR_NOT_GRANTED);
        }
        if target_off
            .checked_add(size)
            .is_none_or(|end| end > f.dev_mem)
        {
            return Err(PCIFAB_ERR_RANGE);
        }
        let routes = &mut self.hosts[host].routes;
        let end = window_off + size;
        if routes
            .iter()
            .any(|r| window_off < r.end() && r.window_off < end)
        {
            return Err(PCIFAB_ERR_ROUTE_CONFLICT);
        }
        if routes.len() >= MAX_ROUTES {
            return Err(PCIFAB_ERR_ROUTE_FULL);
        }
        let at = routes.partition_point(|r| r.window_off < window_off);
        routes.insert(
            at,
            Route {
                window_off,
                size,
                target_off,
                pdfid,
            },
        );
        Ok(routes.len())
    }

    /// P2P_ROUTE DEL: remove the route of `host` starting at `window_off`.
    /// Returns the number of routes now.
    pub fn del_route(&mut self, host: usize, window_off: u64) -> Result<usize, u32> {
        let routes = &mut self.hosts.get_mut(host).ok_or(ERR_PARAM_INVALID)?.routes;
        let i = routes
            .iter()
            .position(|r| r.window_off == window_off)
            .ok_or(PCIFAB_ERR_NO_ROUTE)?;
        routes.remove(i);
        Ok(routes.len())
    }

    /// A grant for (`pdfid`, `grantee`) exists.
    pub fn granted(&self, pdfid: u16, grantee: usize) -> bool {
        self.grants
            .iter()
            .any(|g| g.pdfid == pdfid && g.grantee == grantee)
    }

    /// The checks GRANT and REVOKE share, in the documented order: the
    /// grantee is a partition, the function exists and is bound, and `host`
    /// holds it or is a manager. Returns the holder's partition.
    fn grant_check(&self, host: usize, pdfid: u16, grantee: usize) -> Result<usize, u32> {
        if grantee >= self.hosts.len() || host >= self.hosts.len() {
            return Err(ERR_PARAM_INVALID);
        }
        let f = self.function(pdfid).ok_or(PCIFAB_ERR_PDFID_UNKNOWN)?;
        let (holder, _) = f.binding.ok_or(PCIFAB_ERR_NOT_BOUND)?;
        if holder != host && !self.hosts[host].manager {
            return Err(PCIFAB_ERR_NOT_HOLDER);
        }
        Ok(holder)
    }

    /// Grants on `pdfid`.
    fn grant_count(&self, pdfid: u16) -> usize {
        self.grants.iter().filter(|g| g.pdfid == pdfid).count()
    }

    /// P2P_ROUTE GRANT by the host of partition `host`: let `grantee` route
    /// onto `pdfid`. Idempotent. Returns the number of grants on `pdfid`.
    pub fn grant(&mut self, host: usize, pdfid: u16, grantee: usize) -> Result<usize, u32> {
        let holder = self.grant_check(host, pdfid, grantee)?;
        if grantee == holder {
            // The holder needs no grant: refuse rather than record nonsense.
            return Err(ERR_PARAM_INVALID);
        }
        if self.function(pdfid).is_some_and(|f| f.dev_mem == 0) {
            // No device memory the fabric reaches (an nvme function): a
            // grant could never carry a route.
            return Err(ERR_PARAM_INVALID);
        }
        if !self.granted(pdfid, grantee) {
            if self.grants.len() >= MAX_GRANTS {
                return Err(PCIFAB_ERR_GRANT_FULL);
            }
            let at = self
                .grants
                .partition_point(|g| (g.pdfid, g.grantee) < (pdfid, grantee));
            self.grants.insert(at, Grant { pdfid, grantee });
        }
        Ok(self.grant_count(pdfid))
    }

    /// P2P_ROUTE REVOKE by the host of partition `host`: remove the grant
    /// and every route of the grantee's MEP onto `pdfid`. Returns the number
    /// of grants left on `pdfid` and whether the grantee lost a route.
    pub fn revoke(
        &mut self,
        host: usize,
        pdfid: u16,
        grantee: usize,
    ) -> Result<(usize, bool), u32> {
        self.grant_check(host, pdfid, grantee)?;
        let i = self
            .grants
            .iter()
            .position(|g| g.pdfid == pdfid && g.grantee == grantee)
            .ok_or(PCIFAB_ERR_NO_GRANT)?;
        self.grants.remove(i);
        let routes = &mut self.hosts[grantee].routes;
        let before = routes.len();
        routes.retain(|r| r.pdfid != pdfid);
        let lost = routes.len() != before;
        Ok((self.grant_count(pdfid), lost))
    }

    /// The grants the host of partition `host` may see (on functions it
    /// holds or was granted; a manager sees all), ascending (pdfid,
    /// grantee), with the holder of each.
    pub fn grant_list(&self, host: usize) -> Vec<GrantEntry> {
        let manager = self.hosts.get(host).is_some_and(|h| h.manager);
        self.grants
            .iter()
            .filter_map(|g| {
                let holder = self.function(g.pdfid)?.binding?.0;
                (manager || holder == host || g.grantee == host)
                    .then_some((g.pdfid, holder, g.grantee))
            })
            .collect()
    }

    /// Where `len` bytes at window offset `off` of `host`'s MEP go: the
    /// target function and the offset in its device memory, when the range
    /// lies wholly inside one route.
    pub fn route_target(&self, host: usize, off: u64, len: u64) -> Option<(u16, u64)> {
        let end = off.checked_add(len)?;
        self.hosts
            .get(host)?
            .routes
            .iter()
            .find(|r| off >= r.window_off && end <= r.end())
            .map(|r| (r.pdfid, r.target_off + (off - r.window_off)))
    }

    /// Remove every route to `pdfid` on every MEP; returns the partitions
    /// that lost one.
    pub fn drop_routes_to(&mut self, pdfid: u16) -> Vec<usize> {
        let mut lost = Vec::new();
        for (h, host) in self.hosts.iter_mut().enumerate() {
            let before = host.routes.len();
            host.routes.retain(|r| r.pdfid != pdfid);
            if host.routes.len() != before {
                lost.push(h);
            }
        }
        lost
    }

    /// Route invariants: every route targets a bound function, lies within
    /// the window and the target's device memory, and the routes of one MEP
    /// do not overlap (and are at most MAX_ROUTES).
    pub fn route_invariants(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (h, host) in self.hosts.iter().enumerate() {
            let name = &host.name;
            if host.routes.len() > MAX_ROUTES {
                v.push(format!(
                    "MEP of {name} has {} routes, more than {MAX_ROUTES}",
                    host.routes.len()
                ));
            }
            for (i, r) in host.routes.iter().enumerate() {
                let what = format!(
                    "route {:#x}+{:#x} of {name} to {:#06x}",
                    r.window_off, r.size, r.pdfid
                );
                match self.function(r.pdfid) {
                    None => v.push(format!("{what} targets no function")),
                    Some(f) => {
                        match f.binding {
                            None => v.push(format!("{what} targets an unbound function")),
                            Some((holder, _)) if holder != h && !self.granted(r.pdfid, h) => v
                                .push(format!(
                                    "{what} targets a function {} holds, without a grant",
                                    self.hosts.get(holder).map_or("?", |x| x.name.as_str())
                                )),
                            Some(_) => {}
                        }
                        if r.target_off
                            .checked_add(r.size)
                            .is_none_or(|e| e > f.dev_mem)
                        {
                            v.push(format!(
                                "{what} reaches past its device memory ({:#x} bytes) from {:#x}",
                                f.dev_mem, r.target_off
                            ));
                        }
                    }
                }
                if r.window_off
                    .checked_add(r.size)
                    .is_none_or(|e| e > self.window)
                {
                    v.push(format!(
                        "{what} lies outside the {:#x}-byte window",
                        self.window
                    ));
                }
                for o in &host.routes[i + 1..] {
                    if r.window_off < o.end() && o.window_off < r.end() {
                        v.push(format!(
                            "{what} overlaps route {:#x}+{:#x}",
                            o.window_off, o.size
                        ));
                    }
                }
            }
        }
        for (i, g) in self.grants.iter().enumerate() {
            let what = format!("grant of {:#06x} to partition {}", g.pdfid, g.grantee);
            match self.function(g.pdfid).and_then(|f| f.binding) {
                None => v.push(format!("{what} is on a function that is not bound")),
                Some((holder, _)) if holder == g.grantee => {
                    v.push(format!("{what} is to the function's holder"))
                }
                Some(_) => {}
            }
            if g.grantee >= self.hosts.len() {
                v.push(format!("{what}: no such partition"));
            }
            if self.grants[..i]
                .iter()
                .any(|o| (o.pdfid, o.grantee) >= (g.pdfid, g.grantee))
            {
                v.push(format!("{what} is duplicated or out of order"));
            }
        }
        if self.grants.len() > MAX_GRANTS {
            v.push(format!(
                "{} grants, more than {MAX_GRANTS}",
                self.grants.len()
            ));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = "[[hosts]]\nname = \"a\"\n[[hosts]]\nname = \"b\"\nusp_port = 8\n\
        [[endpoints]]\nname = \"g\"\nport = 16\nvendor_id = 0x10de\ndevice_id = 0x2330\n\
        vf_device_id = 0x2331\nclass = 0x030200\nvfs = 2\n\
        [[bindings]]\nendpoint = \"g\"\nvf = 1\nhost = \"b\"\nlogical_port = 3\n";

    #[test]
    fn builds_functions_and_bindings() {
        let m = Model::new(&Config::parse(CFG).expect("config"));
        let ids: Vec<u16> = m.functions.iter().map(|f| f.pdfid).collect();
        assert_eq!(ids, [0x0300, 0x0301, 0x0302]);
        assert_eq!(m.functions[0].did, 0x2330);
        assert_eq!(m.functions[1].did, 0x2331);
        assert_eq!(m.functions[0].total_vfs, 2);
        assert_eq!(m.functions[1].binding, Some((1, 3)));
        let ports: Vec<u8> = m.ports.iter().map(|p| p.id).collect();
        assert_eq!(ports, [0, 8, 16]);
        assert_eq!(m.generation, 1);
    }

    #[test]
    fn pdfids_of_many_vfs() {
        assert_eq!(
            (pdfid(16, 0), pdfid(16, 4), pdfid(16, 31)),
            (0x0300, 0x0304, 0x031f)
        );
        assert_eq!((pdfid(48, 32), pdfid(51, 255)), (0x4020, 0x43ff));
        let mut all: Vec<u16> = (0..crate::config::MAX_PORTS)
            .flat_map(|p| (0..=crate::config::MAX_VFS).map(move |f| pdfid(p, f)))
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "every (port, function) has its own PDFID");
        let cfg = "[[hosts]]\nname = \"a\"\n[[endpoints]]\nname = \"g\"\nport = 50\n\
                   vendor_id = 1\ndevice_id = 2\nclass = 3\nvfs = 255\n";
        let m = Model::new(&Config::parse(cfg).expect("config"));
        assert_eq!(m.functions.len(), 256);
        let vf40 = m
            .functions
            .iter()
            .find(|f| f.vf_index == 40)
            .expect("VF 40");
        assert_eq!((vf40.pdfid, vf40.pf_pdfid), (0x1000 + 0x3200 + 40, 0x0740));
        assert_eq!(m.functions[0].total_vfs, 255);
    }

    #[test]
    fn link_changes() {
        let mut m = Model::new(&Config::parse(CFG).expect("config"));
        let n = m.set_link(16, false).expect("port").expect("change");
        assert_eq!(n.pffs, [6 + 2 + 3]);
        assert_eq!(m.generation, 2);
        assert_eq!(m.set_link(16, false), Ok(None));
        assert_eq!(
            m.hosts[0].events[0],
            GfmsEvent::Dev {
                port: 16,
                functions: 3,
                add: false
            }
        );
        let n = m.set_link(8, false).expect("port").expect("change");
        assert_eq!(n.pffs, [6]);
        assert!(m.set_link(9, true).is_err());
        for _ in 0..EVENT_QUEUE_DEPTH {
            m.fabric_change();
        }
        assert!(m.hosts[1].overflow);
        assert_eq!(m.hosts[1].events.len(), EVENT_QUEUE_DEPTH);
        assert_eq!(
            GfmsEvent::HostLink { port: 8, up: true }.encode(),
            [8, 0, 0, 0, 8, 0, 0, 0]
        );
        assert_eq!(GfmsEvent::DatabaseChanged.encode(), [4, 0, 8, 0]);
    }
}
