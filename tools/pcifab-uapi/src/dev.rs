// SPDX-License-Identifier: GPL-2.0-only

//! The ioctl calls on an open `/dev/pcifabN`, shared by every tool that talks to the driver.

use std::{fs::File, io, marker::PhantomData, os::fd::AsRawFd};

use crate::{
    Arg, Bind, Events, Function, Grant, Identity, Inventory, Move, Mrpc, P2pBuffer, P2pCopy,
    P2pDistance, P2pEnd, P2pGrant, P2pGrants, P2pRoute, P2pRoutes, Port, Route, Stats, Unbind,
    Version,
};

/// An ioctl number tied to the argument struct it takes: a wrapper cannot pass one ioctl the
/// struct of another.
#[derive(Clone, Copy)]
struct Cmd<T: Arg>(u32, PhantomData<T>);

const fn cmd<T: Arg>(nr: u32) -> Cmd<T> {
    Cmd(nr, PhantomData)
}

const VERSION: Cmd<Version> = cmd(crate::PCIFAB_IOCTL_VERSION);
const IDENTITY: Cmd<Identity> = cmd(crate::PCIFAB_IOCTL_IDENTITY);
const MRPC: Cmd<Mrpc> = cmd(crate::PCIFAB_IOCTL_MRPC);
const STATS: Cmd<Stats> = cmd(crate::PCIFAB_IOCTL_STATS);
const EVENTS: Cmd<Events> = cmd(crate::PCIFAB_IOCTL_EVENTS);
const INVENTORY: Cmd<Inventory> = cmd(crate::PCIFAB_IOCTL_INVENTORY);
const BIND: Cmd<Bind> = cmd(crate::PCIFAB_IOCTL_BIND);
const UNBIND: Cmd<Unbind> = cmd(crate::PCIFAB_IOCTL_UNBIND);
const MOVE: Cmd<Move> = cmd(crate::PCIFAB_IOCTL_MOVE);
const ROUTE_ADD: Cmd<P2pRoute> = cmd(crate::PCIFAB_IOCTL_P2P_ROUTE_ADD);
const ROUTE_DEL: Cmd<P2pRoute> = cmd(crate::PCIFAB_IOCTL_P2P_ROUTE_DEL);
const ROUTES: Cmd<P2pRoutes> = cmd(crate::PCIFAB_IOCTL_P2P_ROUTES);
const COPY: Cmd<P2pCopy> = cmd(crate::PCIFAB_IOCTL_P2P_COPY);
const DISTANCE: Cmd<P2pDistance> = cmd(crate::PCIFAB_IOCTL_P2P_DISTANCE);
const GRANT: Cmd<P2pGrant> = cmd(crate::PCIFAB_IOCTL_P2P_GRANT);
const REVOKE: Cmd<P2pGrant> = cmd(crate::PCIFAB_IOCTL_P2P_REVOKE);
const GRANTS: Cmd<P2pGrants> = cmd(crate::PCIFAB_IOCTL_P2P_GRANTS);
const REGISTER: Cmd<P2pBuffer> = cmd(crate::PCIFAB_IOCTL_P2P_REGISTER);
const UNREGISTER: Cmd<P2pBuffer> = cmd(crate::PCIFAB_IOCTL_P2P_UNREGISTER);

/// Issues `cmd` with `arg`; a module older than uAPI 1.7 (`ENOTTY`) gets the same ioctl by
/// its old number ([`crate::legacy`]).
///
/// # Safety
///
/// Every user pointer inside `arg` must address a buffer at least as long as `arg` says,
/// alive for the call.
unsafe fn ioctl<T: Arg>(dev: &File, cmd: Cmd<T>, arg: &mut T) -> io::Result<()> {
    let call = |nr: u32, arg: &mut T| {
        // SAFETY: `arg` is a live `repr(C)` struct of this ABI whose `size` bounds what the
        // kernel reads and writes, and `nr` is a number of the ioctl that takes it; the caller
        // vouches for the pointers inside it.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), nr as _, arg as *mut T) };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    match call(cmd.0, arg) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => call(crate::legacy(cmd.0), arg),
        r => r,
    }
}

/// The driver's uAPI version (`PCIFAB_IOCTL_VERSION`).
pub fn version(dev: &File) -> io::Result<Version> {
    let mut v = Version::new();
    // SAFETY: `pcifab_version` holds no user pointers.
    unsafe { ioctl(dev, VERSION, &mut v) }?;
    Ok(v)
}

/// The switch's identity (`PCIFAB_IOCTL_IDENTITY`).
pub fn identity(dev: &File) -> io::Result<Identity> {
    let mut id = Identity::new();
    // SAFETY: `pcifab_identity` holds no user pointers.
    unsafe { ioctl(dev, IDENTITY, &mut id) }?;
    Ok(id)
}

/// The management endpoint's counters (`PCIFAB_IOCTL_STATS`).
pub fn stats(dev: &File) -> io::Result<Stats> {
    let mut s = Stats::new();
    // SAFETY: `pcifab_stats` holds no user pointers.
    unsafe { ioctl(dev, STATS, &mut s) }?;
    Ok(s)
}

/// The event counters (`PCIFAB_IOCTL_EVENTS`); with [`crate::EVENTS_WAIT`] in `ev.flags` it
/// waits until `ev.total` passes `ev.seen` or `ev.timeout_ms` runs out. `ev` comes back as the
/// kernel filled it.
pub fn events(dev: &File, ev: &mut Events) -> io::Result<()> {
    ev.size = std::mem::size_of::<Events>() as u32;
    // SAFETY: `pcifab_events` holds no user pointers.
    unsafe { ioctl(dev, EVENTS, ev) }
}

/// Binds a function (`PCIFAB_IOCTL_BIND`). `b` comes back as the kernel filled it, on an
/// error too (`fw_ret`: the firmware's reason).
pub fn bind(dev: &File, b: &mut Bind) -> io::Result<()> {
    b.size = std::mem::size_of::<Bind>() as u32;
    // SAFETY: `pcifab_bind` holds no user pointers.
    unsafe { ioctl(dev, BIND, b) }
}

/// Unbinds a function (`PCIFAB_IOCTL_UNBIND`); `u` comes back as the kernel filled it.
pub fn unbind(dev: &File, u: &mut Unbind) -> io::Result<()> {
    u.size = std::mem::size_of::<Unbind>() as u32;
    // SAFETY: `pcifab_unbind` holds no user pointers.
    unsafe { ioctl(dev, UNBIND, u) }
}

/// Moves a function to another host (`PCIFAB_IOCTL_MOVE`); `m` comes back as the kernel
/// filled it.
pub fn move_to(dev: &File, m: &mut Move) -> io::Result<()> {
    m.size = std::mem::size_of::<Move>() as u32;
    // SAFETY: `pcifab_move` holds no user pointers.
    unsafe { ioctl(dev, MOVE, m) }
}

/// Runs one firmware command (`PCIFAB_IOCTL_MRPC`); returns its status and return value.
pub fn mrpc(
    dev: &File,
    cmd: u32,
    input: &[u8],
    output: &mut [u8],
    timeout_ms: u32,
) -> io::Result<(u32, u32)> {
    let mut m = Mrpc::new();
    m.cmd = cmd;
    m.in_len = u32::try_from(input.len()).unwrap_or(u32::MAX);
    m.out_len = u32::try_from(output.len()).unwrap_or(u32::MAX);
    m.timeout_ms = timeout_ms;
    m.in_ptr = input.as_ptr() as u64;
    m.out_ptr = output.as_mut_ptr() as u64;
    // SAFETY: the pointers and lengths come from the two slices, which outlive the call.
    unsafe { ioctl(dev, MRPC, &mut m) }?;
    Ok((m.status, m.ret_value))
}

/// The whole fabric (`PCIFAB_IOCTL_INVENTORY`), growing the arrays until they hold it.
///
/// Fails with `EAGAIN` if the fabric keeps growing between calls.
pub fn inventory(dev: &File) -> io::Result<(Inventory, Vec<Port>, Vec<Function>)> {
    let (mut nports, mut nfns) = (64usize, 256usize);
    for _ in 0..4 {
        let mut ports = vec![Port::default(); nports];
        let mut functions = vec![Function::default(); nfns];
        let mut inv = Inventory::new();
        inv.nr_ports = nports as u32;
        inv.nr_functions = nfns as u32;
        inv.port_size = std::mem::size_of::<Port>() as u32;
        inv.function_size = std::mem::size_of::<Function>() as u32;
        inv.ports_ptr = ports.as_mut_ptr() as u64;
        inv.functions_ptr = functions.as_mut_ptr() as u64;
        // SAFETY: `inv` points at `ports` and `functions`, which hold as many entries of the
        // sizes it states and outlive the call.
        unsafe { ioctl(dev, INVENTORY, &mut inv) }?;
        if inv.nr_ports as usize <= nports && inv.nr_functions as usize <= nfns {
            ports.truncate(inv.nr_ports as usize);
            functions.truncate(inv.nr_functions as usize);
            return Ok((inv, ports, functions));
        }
        nports = inv.nr_ports as usize;
        nfns = inv.nr_functions as usize;
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Which P2P ioctl a [`P2pError`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pOp {
    RouteAdd,
    RouteDel,
    Routes,
    Copy,
    Distance,
    Grant,
    Revoke,
    Grants,
    Register,
    Unregister,
}

impl P2pOp {
    /// The ioctl's name in the header.
    pub fn ioctl_name(self) -> &'static str {
        match self {
            P2pOp::RouteAdd => "PCIFAB_IOCTL_P2P_ROUTE_ADD",
            P2pOp::RouteDel => "PCIFAB_IOCTL_P2P_ROUTE_DEL",
            P2pOp::Routes => "PCIFAB_IOCTL_P2P_ROUTES",
            P2pOp::Copy => "PCIFAB_IOCTL_P2P_COPY",
            P2pOp::Distance => "PCIFAB_IOCTL_P2P_DISTANCE",
            P2pOp::Grant => "PCIFAB_IOCTL_P2P_GRANT",
            P2pOp::Revoke => "PCIFAB_IOCTL_P2P_REVOKE",
            P2pOp::Grants => "PCIFAB_IOCTL_P2P_GRANTS",
            P2pOp::Register => "PCIFAB_IOCTL_P2P_REGISTER",
            P2pOp::Unregister => "PCIFAB_IOCTL_P2P_UNREGISTER",
        }
    }
}

/// A failed P2P ioctl: the errno and what the argument struct reported with it.
#[derive(Debug)]
pub struct P2pError {
    pub op: P2pOp,
    pub err: io::Error,
    /// ROUTE_ADD, ROUTE_DEL: the firmware's return code when it refused, else 0.
    pub fw_ret: u32,
    /// COPY: bytes copied before the error.
    pub done: u64,
    /// COPY: the engine's status of the last descriptor ([`crate::DMA_STATUS_OK`], ...), 0 if
    /// none ran.
    pub dma_status: u32,
}

impl P2pError {
    fn new(op: P2pOp, err: io::Error) -> Self {
        Self {
            op,
            err,
            fw_ret: 0,
            done: 0,
            dma_status: 0,
        }
    }

    /// What the header says this errno means for this ioctl.
    pub fn meaning(&self) -> Option<&'static str> {
        use P2pOp::*;
        let errno = self.err.raw_os_error()?;
        Some(match (self.op, errno) {
            (_, libc::ENOTTY) => {
                "not a pcifab device, or its module predates uAPI 1.4 (no P2P ioctls)"
            }
            (_, libc::ENODEV) => "the management endpoint was removed",
            (Register | Unregister, libc::EOPNOTSUPP) => {
                "no DMA endpoint bound to pcifab (pcifab_dmaep) with a fabric command path"
            }
            (Register, libc::EINVAL) => {
                "the buffer does not map as one range for the DMA endpoint (without an IOMMU, \
                 keep it within one page), or the peer is this host"
            }
            (Register, libc::ENOSPC) => "the peer's 6 slots are taken",
            (Unregister, libc::ENOENT) => "this file registered no buffer in that slot",
            (Copy, libc::EOPNOTSUPP) => {
                "the switch firmware has no P2P DMA engine (pcifab's dma-engine extension; PAX \
                 firmware has none: see sysfs `features`)"
            }
            (_, libc::EOPNOTSUPP) => {
                "the switch firmware has no P2P routes (pcifab's p2p-routes extension; PAX \
                 firmware has none: see sysfs `features`)"
            }
            (Copy, libc::EPERM) => "copies need CAP_SYS_ADMIN, an iova end also CAP_SYS_RAWIO",
            (RouteAdd | RouteDel, libc::EPERM) => "routes are changed with CAP_SYS_ADMIN",
            (RouteAdd, libc::EINVAL) => {
                "offsets and size must be multiples of 4096, the size non-zero and the range \
                 inside the P2P window"
            }
            (RouteAdd, libc::ENOENT) => "no function has this PDFID",
            (RouteAdd, libc::ENOLINK) => "the target function is not bound to any host",
            (RouteAdd, libc::ERANGE) => "the range goes beyond the target's device memory",
            (RouteAdd, libc::EEXIST) => "the window range overlaps a route",
            (RouteAdd, libc::ENOSPC) => "the window holds 16 routes or has no free space left",
            (RouteDel, libc::ENOENT) => "no route starts at this window offset",
            (RouteAdd, libc::EACCES) => {
                "the function is bound to another host that has not granted this host access \
                 (its holder runs `pcifab p2p grant`)"
            }
            (Grant | Revoke, libc::EPERM) => "grants are changed with CAP_SYS_ADMIN",
            (Grant | Revoke, libc::EACCES) => {
                "only the host the function is bound to, or the fabric-manager host, may \
                 grant or revoke access to it"
            }
            (Grant | Revoke, libc::ENOLINK) => "the function is not bound to any host",
            (Grant | Revoke, libc::EINVAL) => "the grantee is not a host of this fabric",
            (Grant, libc::ENOENT) => "no function has this PDFID",
            (Revoke, libc::ENOENT) => "no such grant (or no function has this PDFID)",
            (RouteDel, libc::EINVAL) => "the window offset is not a multiple of 4096",
            (Copy, libc::EINVAL) => {
                "the length is 0 or above 1 GiB, or the ends are not a valid pair (both in \
                 host memory)"
            }
            (Copy, libc::ENOENT) => "no route of this host covers the function range",
            (Copy, libc::EFAULT) if self.dma_status == crate::DMA_STATUS_HOST_FAULT => {
                "the engine was refused host memory the IOMMU did not map"
            }
            (Copy, libc::EFAULT) => "a user buffer is not accessible",
            (Copy, libc::EREMOTEIO) => "a route went away during the copy",
            (Copy, libc::ETIMEDOUT) => "the copy did not finish in time",
            (Copy, libc::EINTR) => "a signal interrupted the copy",
            (Distance, libc::ENOENT) => "no function has this PDFID",
            _ => return None,
        })
    }

    /// Whether the fabric refused the request as it stands (unknown function, no route,
    /// conflict, no space) rather than failing to carry it out.
    pub fn refused(&self) -> bool {
        matches!(
            self.err.raw_os_error(),
            Some(
                libc::ENOENT
                    | libc::ENOLINK
                    | libc::ERANGE
                    | libc::EEXIST
                    | libc::ENOSPC
                    | libc::EACCES
            )
        )
    }
}

impl std::fmt::Display for P2pError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.op.ioctl_name(), self.err)?;
        if let Some(m) = self.meaning() {
            write!(f, " ({m})")?;
        }
        if self.fw_ret != 0 {
            write!(f, " (firmware code {:#x})", self.fw_ret)?;
        }
        Ok(())
    }
}

impl std::error::Error for P2pError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.err)
    }
}

impl From<P2pError> for io::Error {
    fn from(e: P2pError) -> Self {
        e.err
    }
}

/// Adds a route (`PCIFAB_IOCTL_P2P_ROUTE_ADD`); `route.window_off` may be
/// [`crate::ROUTE_ANY_WINDOW`]. Returns the struct as the kernel filled it: the route as added
/// and the number of routes now.
pub fn route_add(dev: &File, route: &Route) -> Result<P2pRoute, P2pError> {
    let mut r = P2pRoute::new();
    r.route = *route;
    // SAFETY: `pcifab_p2p_route` holds no user pointers.
    unsafe { ioctl(dev, ROUTE_ADD, &mut r) }.map_err(|err| P2pError {
        fw_ret: r.fw_ret,
        ..P2pError::new(P2pOp::RouteAdd, err)
    })?;
    Ok(r)
}

/// Deletes the route that starts at `window_off` (`PCIFAB_IOCTL_P2P_ROUTE_DEL`). Returns the
/// struct as the kernel filled it (`nr_routes`: routes left).
pub fn route_del(dev: &File, window_off: u64) -> Result<P2pRoute, P2pError> {
    let mut r = P2pRoute::new();
    r.route.window_off = window_off;
    // SAFETY: `pcifab_p2p_route` holds no user pointers.
    unsafe { ioctl(dev, ROUTE_DEL, &mut r) }.map_err(|err| P2pError {
        fw_ret: r.fw_ret,
        ..P2pError::new(P2pOp::RouteDel, err)
    })?;
    Ok(r)
}

/// Lets host `grantee` route to function `pdfid` (`PCIFAB_IOCTL_P2P_GRANT`), or with
/// `grant == false` takes that back with every route it allowed (`PCIFAB_IOCTL_P2P_REVOKE`).
/// Returns the struct as the kernel filled it (`nr_grants`: grants on `pdfid` now).
pub fn grant(dev: &File, pdfid: u16, grantee: u8, grant: bool) -> Result<P2pGrant, P2pError> {
    let mut g = P2pGrant::new();
    g.pdfid = pdfid;
    g.grantee = grantee;
    let (nr, op) = if grant {
        (GRANT, P2pOp::Grant)
    } else {
        (REVOKE, P2pOp::Revoke)
    };
    // SAFETY: `pcifab_p2p_grant` holds no user pointers.
    unsafe { ioctl(dev, nr, &mut g) }.map_err(|err| P2pError {
        fw_ret: g.fw_ret,
        ..P2pError::new(op, err)
    })?;
    Ok(g)
}

/// Registers `buf` for the peer host `peer` (its HFID) with the switch's DMA endpoint
/// (`PCIFAB_IOCTL_P2P_REGISTER`): the kernel pins it and the peer's copies may write into it
/// until [`unregister`] or until `dev` is closed. Returns the struct as the kernel filled it
/// (`slot`, this host's `hfid`).
///
/// # Safety
///
/// `buf` must stay allocated, and be used for nothing else that a write of the peer could
/// break, until the registration ends (UNREGISTER, or `dev` closed).
pub unsafe fn register(dev: &File, peer: u16, buf: &mut [u8]) -> Result<P2pBuffer, P2pError> {
    let mut b = P2pBuffer::new();
    b.peer = peer;
    b.addr = buf.as_mut_ptr() as u64;
    b.len = buf.len() as u64;
    // SAFETY: `addr` and `len` describe `buf`, which the caller keeps alive for as long as
    // the registration lasts.
    unsafe { ioctl(dev, REGISTER, &mut b) }.map_err(|err| P2pError {
        fw_ret: b.fw_ret,
        ..P2pError::new(P2pOp::Register, err)
    })?;
    Ok(b)
}

/// Unregisters the buffer this file registered for `peer` in `slot`
/// (`PCIFAB_IOCTL_P2P_UNREGISTER`).
pub fn unregister(dev: &File, peer: u16, slot: u8) -> Result<P2pBuffer, P2pError> {
    let mut b = P2pBuffer::new();
    b.peer = peer;
    b.slot = slot;
    // SAFETY: `pcifab_p2p_buffer` for UNREGISTER holds no user pointer (`addr` 0).
    unsafe { ioctl(dev, UNREGISTER, &mut b) }.map_err(|err| P2pError {
        fw_ret: b.fw_ret,
        ..P2pError::new(P2pOp::Unregister, err)
    })?;
    Ok(b)
}

/// Lists the P2P grants this host may see (`PCIFAB_IOCTL_P2P_GRANTS`), growing the array until
/// it holds them. Fails with `EAGAIN` if they keep growing between calls.
pub fn grants(dev: &File) -> Result<Vec<Grant>, P2pError> {
    let mut n = 16;
    for _ in 0..4 {
        let mut grants = vec![Grant::default(); n];
        let mut g = P2pGrants::new();
        g.nr_grants = n as u32;
        g.grant_size = std::mem::size_of::<Grant>() as u32;
        g.grants_ptr = grants.as_mut_ptr() as u64;
        // SAFETY: `g` points at `grants`, which holds `nr_grants` entries of `grant_size`
        // bytes and outlives the call.
        unsafe { ioctl(dev, GRANTS, &mut g) }.map_err(|err| P2pError::new(P2pOp::Grants, err))?;
        if g.nr_grants as usize <= n {
            grants.truncate(g.nr_grants as usize);
            return Ok(grants);
        }
        n = g.nr_grants as usize;
    }
    Err(P2pError::new(
        P2pOp::Grants,
        io::Error::from_raw_os_error(libc::EAGAIN),
    ))
}

/// This host's routes and its P2P window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteTable {
    /// Size of the P2P window in bytes.
    pub window_size: u64,
    /// The routes, as the kernel listed them.
    pub routes: Vec<Route>,
}

/// Lists the routes (`PCIFAB_IOCTL_P2P_ROUTES`), growing the array until it holds them.
///
/// Fails with `EAGAIN` if the routes keep growing between calls.
pub fn routes(dev: &File) -> Result<RouteTable, P2pError> {
    let mut n = crate::MAX_ROUTES;
    for _ in 0..4 {
        let mut routes = vec![Route::default(); n];
        let mut r = P2pRoutes::new();
        r.nr_routes = n as u32;
        r.route_size = std::mem::size_of::<Route>() as u32;
        r.routes_ptr = routes.as_mut_ptr() as u64;
        // SAFETY: `r` points at `routes`, which holds `nr_routes` entries of `route_size`
        // bytes and outlives the call.
        unsafe { ioctl(dev, ROUTES, &mut r) }.map_err(|err| P2pError::new(P2pOp::Routes, err))?;
        if r.nr_routes as usize <= n {
            routes.truncate(r.nr_routes as usize);
            return Ok(RouteTable {
                window_size: r.window_size,
                routes,
            });
        }
        n = r.nr_routes as usize;
    }
    Err(P2pError::new(
        P2pOp::Routes,
        io::Error::from_raw_os_error(libc::EAGAIN),
    ))
}

/// Where a [`p2p_copy`] reads from.
#[derive(Debug)]
pub enum CopySrc<'a> {
    /// A function's device memory at `off`, through a route of this host.
    Function { pdfid: u16, off: u64 },
    /// Host memory: the first `len` bytes of this buffer.
    User(&'a [u8]),
    /// A raw bus address (needs CAP_SYS_RAWIO; for tests and diagnostics).
    Iova(u64),
}

/// Where a [`p2p_copy`] writes to.
#[derive(Debug)]
pub enum CopyDst<'a> {
    /// A function's device memory at `off`, through a route of this host.
    Function { pdfid: u16, off: u64 },
    /// Host memory: the first `len` bytes of this buffer.
    User(&'a mut [u8]),
    /// A raw bus address (needs CAP_SYS_RAWIO; for tests and diagnostics).
    Iova(u64),
    /// The buffer peer host `hfid` registered for this host in `slot`, at offset `off`
    /// (through the switch's DMA endpoint; since 1.8).
    Peer { hfid: u16, slot: u8, off: u64 },
}

fn end(kind: u32, pdfid: u16, addr: u64) -> P2pEnd {
    P2pEnd {
        kind,
        pdfid,
        addr,
        ..P2pEnd::default()
    }
}

/// Copies `len` bytes with the MEP's DMA engine (`PCIFAB_IOCTL_P2P_COPY`); `timeout_ms` 0
/// means the kernel's default (60 s). Returns the struct as the kernel filled it. On an error
/// the [`P2pError`] carries `done` and `dma_status`. A user buffer shorter than `len` is
/// `EINVAL` without a call.
pub fn p2p_copy(
    dev: &File,
    src: CopySrc<'_>,
    dst: CopyDst<'_>,
    len: u64,
    timeout_ms: u32,
) -> Result<P2pCopy, P2pError> {
    let short = |n: usize| (n as u64) < len;
    let mut c = P2pCopy::new();
    c.src = match src {
        CopySrc::Function { pdfid, off } => end(crate::P2P_FUNCTION, pdfid, off),
        CopySrc::User(b) if short(b.len()) => return Err(einval()),
        CopySrc::User(b) => end(crate::P2P_USER, 0, b.as_ptr() as u64),
        CopySrc::Iova(a) => end(crate::P2P_IOVA, 0, a),
    };
    c.dst = match dst {
        CopyDst::Function { pdfid, off } => end(crate::P2P_FUNCTION, pdfid, off),
        CopyDst::User(b) if short(b.len()) => return Err(einval()),
        CopyDst::User(b) => end(crate::P2P_USER, 0, b.as_mut_ptr() as u64),
        CopyDst::Iova(a) => end(crate::P2P_IOVA, 0, a),
        CopyDst::Peer { hfid, slot, off } => P2pEnd {
            reserved0: slot.into(),
            ..end(crate::P2P_PEER, hfid, off)
        },
    };
    c.len = len;
    c.timeout_ms = timeout_ms;
    // SAFETY: a user end points at a slice of at least `len` bytes (checked above), borrowed
    // (mutably for the destination) for the whole call; the kernel unmaps it before returning.
    unsafe { ioctl(dev, COPY, &mut c) }.map_err(|err| P2pError {
        done: c.done,
        dma_status: c.dma_status,
        ..P2pError::new(P2pOp::Copy, err)
    })?;
    Ok(c)
}

fn einval() -> P2pError {
    P2pError::new(P2pOp::Copy, io::Error::from_raw_os_error(libc::EINVAL))
}

/// How data would travel between functions `a` and `b` (`PCIFAB_IOCTL_P2P_DISTANCE`).
pub fn p2p_distance(dev: &File, a: u16, b: u16) -> Result<P2pDistance, P2pError> {
    let mut d = P2pDistance::new();
    (d.a, d.b) = (a, b);
    // SAFETY: `pcifab_p2p_distance` holds no user pointers.
    unsafe { ioctl(dev, DISTANCE, &mut d) }.map_err(|err| P2pError::new(P2pOp::Distance, err))?;
    Ok(d)
}

/// One reading of a function's telemetry through the FUNCTION_TELEMETRY firmware extension
/// (MRPC pass-through; [`crate::telemetry`] is the codec).
pub fn telemetry(dev: &File, pdfid: u16) -> Result<crate::telemetry::Sample, String> {
    let mut out = [0u8; crate::telemetry::REPLY_LEN];
    let (status, ret) = mrpc(
        dev,
        crate::telemetry::EXT_FUNCTION_TELEMETRY,
        &crate::telemetry::request(pdfid),
        &mut out,
        0,
    )
    .map_err(|e| format!("FUNCTION_TELEMETRY {pdfid:#06x}: {e}"))?;
    if status != crate::MRPC_STATUS_DONE {
        return Err(format!(
            "the firmware failed FUNCTION_TELEMETRY for {pdfid:#06x}: return value {ret:#x}"
        ));
    }
    crate::telemetry::parse(pdfid, &out)
}

/// The name of a [`P2pCopy::dma_status`] value.
pub fn dma_status_name(status: u32) -> &'static str {
    match status {
        crate::DMA_STATUS_NONE => "NONE",
        crate::DMA_STATUS_OK => "OK",
        crate::DMA_STATUS_HOST_FAULT => "HOST_FAULT",
        crate::DMA_STATUS_ROUTE_FAULT => "ROUTE_FAULT",
        crate::DMA_STATUS_BAD => "BAD",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_rejects_short_buffers_before_the_call() {
        // /dev/null takes no ioctls; a short buffer must fail before one is tried.
        let dev = File::open("/dev/null").expect("open /dev/null");
        let buf = [0u8; 8];
        let e = p2p_copy(
            &dev,
            CopySrc::User(&buf),
            CopyDst::Function { pdfid: 1, off: 0 },
            9,
            0,
        )
        .expect_err("short buffer");
        assert_eq!(e.err.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(e.op, P2pOp::Copy);
        let e = p2p_copy(
            &dev,
            CopySrc::User(&buf),
            CopyDst::Function { pdfid: 1, off: 0 },
            8,
            0,
        )
        .expect_err("/dev/null is not pcifab");
        assert_eq!(e.err.raw_os_error(), Some(libc::ENOTTY));
        assert!(e.to_string().contains("predates uAPI 1.4"), "{e}");
    }

    #[test]
    fn errors_name_the_firmware_code_and_meaning() {
        let e = P2pError {
            fw_ret: 0xf0_000c,
            ..P2pError::new(P2pOp::RouteAdd, io::Error::from_raw_os_error(libc::EEXIST))
        };
        let s = e.to_string();
        assert!(s.starts_with("PCIFAB_IOCTL_P2P_ROUTE_ADD: "), "{s}");
        assert!(s.contains("overlaps a route"), "{s}");
        assert!(s.contains("firmware code 0xf0000c"), "{s}");
        assert!(e.refused());
        let e = P2pError {
            dma_status: crate::DMA_STATUS_HOST_FAULT,
            ..P2pError::new(P2pOp::Copy, io::Error::from_raw_os_error(libc::EFAULT))
        };
        assert!(e.meaning().unwrap_or_default().contains("IOMMU"));
        assert!(!e.refused());
        assert_eq!(dma_status_name(3), "ROUTE_FAULT");
    }
}
