// SPDX-License-Identifier: GPL-2.0-only

//! The ioctls of `/dev/pcifabN`: what each one does with its argument struct.

use core::mem::size_of;

use kernel::{
    prelude::*,
    sync::atomic::ordering::Relaxed,
    transmute::AsBytes,
    uaccess::{UserPtr, UserSlice},
};

use super::{
    args::{read_arg, write_arg, write_entry, MAX_ARG_SIZE},
    perm::{allow, allow_mrpc_timeout, allowed_config, mrpc_class, MrpcClass},
    OpenFile,
};
use crate::{compose, fw, kext::security::Lockdown, mrpc, p2p, uapi};

impl OpenFile {
    /// Runs the ioctl `cmd` with the argument at `arg`.
    pub(super) fn dispatch(&self, cmd: u32, arg: usize) -> Result {
        // A file whose endpoint went away answers nothing any more, not even VERSION: the
        // caller learns at once that it must reopen (or give up) instead of getting answers
        // from a device that is gone.
        if self.mep.events.gone() {
            return Err(ENODEV);
        }
        // The numbers of uAPI 1.0-1.6 are aliases of today's.
        match uapi::canonical(cmd) {
            uapi::PCIFAB_IOCTL_VERSION => self.version(arg),
            uapi::PCIFAB_IOCTL_IDENTITY => self.identity(arg),
            uapi::PCIFAB_IOCTL_MRPC => self.mrpc(arg),
            uapi::PCIFAB_IOCTL_STATS => self.stats(arg),
            uapi::PCIFAB_IOCTL_EVENTS => self.events(arg),
            uapi::PCIFAB_IOCTL_INVENTORY => self.inventory(arg),
            uapi::PCIFAB_IOCTL_BIND => self.bind(arg),
            uapi::PCIFAB_IOCTL_UNBIND => self.unbind(arg),
            uapi::PCIFAB_IOCTL_MOVE => self.move_fn(arg),
            uapi::PCIFAB_IOCTL_P2P_ROUTE_ADD => self.route_add(arg),
            uapi::PCIFAB_IOCTL_P2P_ROUTE_DEL => self.route_del(arg),
            uapi::PCIFAB_IOCTL_P2P_ROUTES => self.routes(arg),
            uapi::PCIFAB_IOCTL_P2P_COPY => self.p2p_copy(arg),
            uapi::PCIFAB_IOCTL_P2P_DISTANCE => self.p2p_distance(arg),
            uapi::PCIFAB_IOCTL_P2P_GRANT => self.p2p_grant(arg, true),
            uapi::PCIFAB_IOCTL_P2P_REVOKE => self.p2p_grant(arg, false),
            uapi::PCIFAB_IOCTL_P2P_GRANTS => self.p2p_grants(arg),
            uapi::PCIFAB_IOCTL_P2P_REGISTER => self.p2p_register(arg, true),
            uapi::PCIFAB_IOCTL_P2P_UNREGISTER => self.p2p_register(arg, false),
            _ => Err(ENOTTY),
        }
    }

    fn version(&self, arg: usize) -> Result {
        let (mut v, len) = read_arg::<uapi::Version>(arg)?;
        v.major = uapi::VERSION_MAJOR;
        v.minor = uapi::VERSION_MINOR;
        write_arg(arg, &v, len)
    }

    fn identity(&self, arg: usize) -> Result {
        let (mut out, len) = read_arg::<uapi::Identity>(arg)?;
        if out.reserved0 != 0 {
            return Err(EINVAL);
        }
        let id = self.mep.identity()?;
        (out.pci_vendor, out.pci_device) = self.mep.pci_ids();
        out.device_id = id.device_id;
        out.device_version = id.device_version;
        out.fw_version = id.fw_version;
        out.partition = id.partition;
        out.partition_count = id.partition_count;
        out.vendor_id = id.vendor_id;
        out.product_id = id.product_id;
        out.product_revision = id.product_revision;
        out.features = self.mep.features().bits();
        out.pax_id = self.mep.pax_id().into();
        write_arg(arg, &out, len)
    }

    fn mrpc(&self, arg: usize) -> Result {
        let (mut m, len) = read_arg::<uapi::Mrpc>(arg)?;
        let (in_len, out_len) = (m.in_len as usize, m.out_len as usize);
        if in_len > mrpc::PAYLOAD || out_len > mrpc::PAYLOAD || m.timeout_ms > mrpc::MAX_TIMEOUT_MS
        {
            return Err(EINVAL);
        }
        let mut input = KVec::from_elem(0u8, in_len, GFP_KERNEL)?;
        UserSlice::new(UserPtr::from_addr(m.in_ptr as usize), in_len)
            .reader()
            .read_slice(&mut input)?;
        // The class is decided on the bytes the firmware will see: read once, above.
        allow(
            mrpc_class(m.cmd, &input, self.mep.features()),
            Lockdown::PciAccess,
        )?;
        allow_mrpc_timeout(m.timeout_ms)?;
        let mut output = KVec::from_elem(0u8, out_len, GFP_KERNEL)?;
        // Prove both destinations writable before the command runs, so a bad pointer cannot
        // leave a configuration command done but unreported.
        let out_ptr = UserPtr::from_addr(m.out_ptr as usize);
        UserSlice::new(out_ptr, out_len)
            .writer()
            .write_slice(&output)?;
        write_arg(arg, &m, len)?;

        if fw::raw::p2p_routes(m.cmd) {
            self.mep.p2p.routes_changed();
        }
        // A raw step of a dump session never lands inside the driver's own session.
        let session = fw::raw::dump_session(m.cmd).then(|| self.mep.fabric.session());
        let reply = self
            .mep
            .mrpc
            .run(&self.mep, m.cmd, &input, &mut output, m.timeout_ms);
        drop(session);
        if fw::raw::event_queue(m.cmd) {
            // A raw GET or CLEAR may have taken binding events the view would be told by.
            self.mep.fabric.invalidate();
        }
        let reply = reply?;
        UserSlice::new(out_ptr, out_len)
            .writer()
            .write_slice(&output)?;
        m.status = reply.status;
        m.ret_value = reply.ret;
        write_arg(arg, &m, len)
    }

    fn events(&self, arg: usize) -> Result {
        let (mut ev, len) = read_arg::<uapi::Events>(arg)?;
        if ev.reserved0 != 0 {
            return Err(EINVAL);
        }
        let c = if ev.flags & uapi::EVENTS_WAIT != 0 {
            self.mep.events.wait(ev.seen, ev.timeout_ms)?
        } else {
            self.mep.events.counts()
        };
        ev.total = c.total;
        ev.link = c.link;
        ev.gfms = c.gfms;
        ev.irqs = c.irqs;
        write_arg(arg, &ev, len)?;
        self.seen.store(c.total, Relaxed);
        Ok(())
    }

    fn inventory(&self, arg: usize) -> Result {
        let (mut inv, len) = read_arg::<uapi::Inventory>(arg)?;
        let (psize, fsize) = (inv.port_size as usize, inv.function_size as usize);
        if psize < size_of::<uapi::Port>()
            || fsize < size_of::<uapi::Function>()
            || psize > MAX_ARG_SIZE
            || fsize > MAX_ARG_SIZE
        {
            return Err(EINVAL);
        }
        let (nports, nfns) = (inv.nr_ports as usize, inv.nr_functions as usize);
        // Bytes the caller gave us; checked before anything is written.
        let ports_len = nports.checked_mul(psize).ok_or(EINVAL)?;
        let fns_len = nfns.checked_mul(fsize).ok_or(EINVAL)?;

        // The entries are gathered under the view's lock and copied out after it: a caller
        // whose buffer faults slowly (or never finishes faulting) must not hold up the binds,
        // unbinds, sysfs readers and unbind of the endpoint that need the view.
        let mep = &self.mep;
        let (ports, functions) = mep.fabric.with_view(mep, |view| -> Result<_> {
            let mut ports = KVec::with_capacity(nports.min(view.ports.len()), GFP_KERNEL)?;
            for p in view.ports.iter().take(nports) {
                let e = uapi::Port {
                    phys_port: p.phys,
                    kind: p.kind,
                    link_up: p.link_up.into(),
                    width: p.width,
                    rate: p.rate,
                    reserved: [0; 3],
                };
                ports.push(e, GFP_KERNEL)?;
            }
            let mut functions = KVec::with_capacity(nfns.min(view.functions.len()), GFP_KERNEL)?;
            for f in view.functions.iter().take(nfns) {
                let e = uapi::Function {
                    pdfid: f.pdfid,
                    pf_pdfid: f.pf_pdfid,
                    vendor: f.vendor,
                    device: f.device,
                    class_code: f.class,
                    phys_port: f.phys_port,
                    vf_index: f.vf_index,
                    total_vfs: f.total_vfs,
                    flags: f.flags,
                    bound_host: f.bound_host,
                    bound_port: f.bound_log_port,
                    reserved0: 0,
                    reserved1: 0,
                };
                functions.push(e, GFP_KERNEL)?;
            }
            inv.generation = view.generation;
            inv.partition = view.partition.into();
            inv.host_count = view.host_count.into();
            inv.nr_ports = u32::try_from(view.ports.len()).map_err(|_| EIO)?;
            inv.nr_functions = u32::try_from(view.functions.len()).map_err(|_| EIO)?;
            Ok((ports, functions))
        })??;
        let mut w = UserSlice::new(UserPtr::from_addr(inv.ports_ptr as usize), ports_len).writer();
        for e in ports.iter() {
            write_entry(&mut w, e.as_bytes(), psize)?;
        }
        let mut w =
            UserSlice::new(UserPtr::from_addr(inv.functions_ptr as usize), fns_len).writer();
        for e in functions.iter() {
            write_entry(&mut w, e.as_bytes(), fsize)?;
        }
        write_arg(arg, &inv, len)
    }

    fn bind(&self, arg: usize) -> Result {
        let (mut b, len) = read_arg::<uapi::Bind>(arg)?;
        let timeout = bind_timeout(b.timeout_ms)?;
        allowed_config()?;
        let port = (b.port != uapi::ANY_PORT).then_some(b.port);
        let wait = b.flags & uapi::BIND_NO_WAIT == 0;
        // Several functions at once: @pdfids, the first of which is @pdfid.
        let n = usize::try_from(b.nr_pdfids).map_err(|_| EINVAL)?;
        let pdfids = match n {
            0 => core::slice::from_ref(&b.pdfid),
            n if n <= uapi::BIND_MAX_PDFIDS && b.pdfids[0] == b.pdfid => &b.pdfids[..n],
            _ => return Err(EINVAL),
        };
        // The entries past @nr_pdfids are reserved: zero.
        if b.pdfids.iter().skip(n).any(|&p| p != 0) {
            return Err(EINVAL);
        }
        let mut list = [0u16; uapi::BIND_MAX_PDFIDS];
        list[..pdfids.len()].copy_from_slice(pdfids);
        let pdfids = &list[..pdfids.len()];
        match self.mep.bind(pdfids, b.host, port, timeout, wait) {
            Ok(bound) => {
                b.port = bound.port;
                b.fw_ret = 0;
                // Never hand the caller's own bytes back as if the kernel had found them.
                (b.vendor, b.device, b.name) = local_ids(bound.local.as_ref());
                write_arg(arg, &b, len)
            }
            Err(f) => {
                b.fw_ret = f.fw_ret;
                write_arg(arg, &b, len)?;
                Err(f.err)
            }
        }
    }

    fn unbind(&self, arg: usize) -> Result {
        let (mut u, len) = read_arg::<uapi::Unbind>(arg)?;
        let timeout = bind_timeout(u.timeout_ms)?;
        if u.reserved0 != 0 {
            return Err(EINVAL);
        }
        allowed_config()?;
        match self.mep.unbind(u.pdfid, timeout) {
            Ok((host, port)) => {
                (u.host, u.port, u.fw_ret) = (host, port, 0);
                write_arg(arg, &u, len)
            }
            Err(f) => {
                u.fw_ret = f.fw_ret;
                write_arg(arg, &u, len)?;
                Err(f.err)
            }
        }
    }

    fn move_fn(&self, arg: usize) -> Result {
        let (mut m, len) = read_arg::<uapi::Move>(arg)?;
        let timeout = bind_timeout(m.timeout_ms)?;
        if m.reserved0 != 0 {
            return Err(EINVAL);
        }
        allowed_config()?;
        let port = (m.port != uapi::ANY_PORT).then_some(m.port);
        match self.mep.move_to(m.pdfid, m.host, port, timeout) {
            Ok((bound, (from_host, from_port))) => {
                m.port = bound.port;
                (m.from_host, m.from_port, m.fw_ret) = (from_host, from_port, 0);
                (m.vendor, m.device, m.name) = local_ids(bound.local.as_ref());
                write_arg(arg, &m, len)
            }
            Err(f) => {
                m.fw_ret = f.fw_ret;
                write_arg(arg, &m, len)?;
                Err(f.err)
            }
        }
    }

    fn route_add(&self, arg: usize) -> Result {
        let (mut r, len) = read_arg::<uapi::P2pRoute>(arg)?;
        if r.route.reserved0 != 0 || r.route.reserved1 != 0 {
            return Err(EINVAL);
        }
        allowed_config()?;
        match p2p::route_add(&self.mep, r.route) {
            Ok((route, count)) => {
                (r.route, r.nr_routes, r.fw_ret) = (route, count, 0);
                write_arg(arg, &r, len)
            }
            Err(f) => {
                r.fw_ret = f.fw_ret;
                write_arg(arg, &r, len)?;
                Err(f.err)
            }
        }
    }

    fn route_del(&self, arg: usize) -> Result {
        let (mut r, len) = read_arg::<uapi::P2pRoute>(arg)?;
        if r.route.reserved0 != 0 || r.route.reserved1 != 0 {
            return Err(EINVAL);
        }
        allowed_config()?;
        match p2p::route_del(&self.mep, r.route.window_off) {
            Ok(count) => {
                (r.nr_routes, r.fw_ret) = (count, 0);
                write_arg(arg, &r, len)
            }
            Err(f) => {
                r.fw_ret = f.fw_ret;
                write_arg(arg, &r, len)?;
                Err(f.err)
            }
        }
    }

    fn routes(&self, arg: usize) -> Result {
        let (mut l, len) = read_arg::<uapi::P2pRoutes>(arg)?;
        let rsize = l.route_size as usize;
        if rsize < size_of::<uapi::Route>() || rsize > MAX_ARG_SIZE {
            return Err(EINVAL);
        }
        let n = l.nr_routes as usize;
        let bytes = n.checked_mul(rsize).ok_or(EINVAL)?;
        // Prove the argument writable before asking the firmware.
        write_arg(arg, &l, len)?;
        let routes = p2p::routes(&self.mep)?;
        let mut w = UserSlice::new(UserPtr::from_addr(l.routes_ptr as usize), bytes).writer();
        for r in routes.iter().take(n) {
            write_entry(&mut w, r.as_bytes(), rsize)?;
        }
        l.nr_routes = routes.len() as u32;
        l.window_size = self.mep.p2p.window_size();
        write_arg(arg, &l, len)
    }

    fn p2p_copy(&self, arg: usize) -> Result {
        let (mut c, len) = read_arg::<uapi::P2pCopy>(arg)?;
        // A peer end's slot is in the field the other kinds keep zero.
        let stray = |e: &uapi::P2pEnd| e.kind != uapi::P2P_PEER && e.reserved0 != 0;
        if stray(&c.src) || stray(&c.dst) {
            return Err(EINVAL);
        }
        allowed_config()?;
        // A raw bus address reaches whatever the IOMMU lets the MEP reach: fwctl's rules.
        let raw = |e: &uapi::P2pEnd| e.kind == uapi::P2P_IOVA;
        if raw(&c.src) || raw(&c.dst) {
            allow(MrpcClass::DebugWrite, Lockdown::DevMem)?;
        }
        // Prove the argument writable before data moves, so the outcome can be reported.
        write_arg(arg, &c, len)?;
        let out = p2p::copy(&self.mep, &c.src, &c.dst, c.len, c.timeout_ms)?;
        (c.done, c.dma_status) = (out.done, out.status);
        write_arg(arg, &c, len)?;
        match out.err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn p2p_distance(&self, arg: usize) -> Result {
        let (mut d, len) = read_arg::<uapi::P2pDistance>(arg)?;
        if d.reserved0 != 0 {
            return Err(EINVAL);
        }
        let out = p2p::distance(&self.mep, d.a, d.b)?;
        (d.path, d.hops, d.pci_distance, d.info) = (out.path, out.hops, out.pci_distance, out.info);
        write_arg(arg, &d, len)
    }

    fn p2p_grant(&self, arg: usize, grant: bool) -> Result {
        let (mut g, len) = read_arg::<uapi::P2pGrant>(arg)?;
        if g.reserved0 != 0 || g.reserved1 != 0 {
            return Err(EINVAL);
        }
        allowed_config()?;
        match p2p::grant(&self.mep, g.pdfid, g.grantee, grant) {
            Ok(count) => {
                (g.nr_grants, g.fw_ret) = (count, 0);
                write_arg(arg, &g, len)
            }
            Err(f) => {
                (g.nr_grants, g.fw_ret) = (0, f.fw_ret);
                write_arg(arg, &g, len)?;
                Err(f.err)
            }
        }
    }

    /// `PCIFAB_IOCTL_P2P_REGISTER` (`register`) and `_UNREGISTER`: a buffer of the caller
    /// registered for a peer host with the switch's DMA endpoint, owned by this file.
    fn p2p_register(&self, arg: usize, register: bool) -> Result {
        let (mut b, len) = read_arg::<uapi::P2pBuffer>(arg)?;
        if b.reserved0 != 0 || b.reserved1 != 0 || b.reserved2 != 0 {
            return Err(EINVAL);
        }
        if !register && (b.addr != 0 || b.len != 0) {
            return Err(EINVAL);
        }
        allowed_config()?;
        // Prove the argument writable before the firmware registers anything.
        write_arg(arg, &b, len)?;
        let r = if register {
            crate::dmaep::register(&self.mep.pdev, self.owner, b.peer, b.addr, b.len)
        } else {
            crate::dmaep::unregister(&self.mep.pdev, self.owner, b.peer, b.slot)
                .map(|hfid| (b.slot, hfid))
        };
        match r {
            Ok((slot, hfid)) => {
                (b.slot, b.hfid, b.fw_ret) = (slot, hfid, 0);
                write_arg(arg, &b, len)
            }
            Err(f) => {
                b.fw_ret = f.fw_ret;
                write_arg(arg, &b, len)?;
                Err(f.err)
            }
        }
    }

    fn p2p_grants(&self, arg: usize) -> Result {
        let (mut l, len) = read_arg::<uapi::P2pGrants>(arg)?;
        let gsize = l.grant_size as usize;
        if gsize < size_of::<uapi::Grant>() || gsize > MAX_ARG_SIZE {
            return Err(EINVAL);
        }
        let n = l.nr_grants as usize;
        let bytes = n.checked_mul(gsize).ok_or(EINVAL)?;
        // Prove the argument writable before asking the firmware.
        write_arg(arg, &l, len)?;
        let grants = p2p::grants(&self.mep)?;
        let mut w = UserSlice::new(UserPtr::from_addr(l.grants_ptr as usize), bytes).writer();
        for g in grants.iter().take(n) {
            write_entry(&mut w, g.as_bytes(), gsize)?;
        }
        l.nr_grants = u32::try_from(grants.len()).map_err(|_| EIO)?;
        write_arg(arg, &l, len)
    }

    fn stats(&self, arg: usize) -> Result {
        let (mut out, len) = read_arg::<uapi::Stats>(arg)?;
        let s = self.mep.mrpc.stats();
        out.mrpc_commands = s.commands;
        out.mrpc_completions = s.completions;
        out.mrpc_timeouts = s.timeouts;
        out.mrpc_firmware_dead = s.firmware_dead;
        out.event_irqs = self.mep.events.counts().irqs;
        write_arg(arg, &out, len)
    }
}

/// Vendor, device and name of the function this host enumerated; zeros if none.
fn local_ids(f: Option<&crate::hotplug::Found>) -> (u16, u16, [u8; 16]) {
    f.map_or((0, 0, [0; 16]), |f| (f.vendor, f.device, f.name))
}

/// The bound on a bind, unbind or move: 0 is the default, more than the maximum `EINVAL`.
fn bind_timeout(ms: u32) -> Result<u32> {
    match ms {
        0 => Ok(compose::DEFAULT_TIMEOUT_MS),
        ms if ms > uapi::BIND_MAX_TIMEOUT_MS => Err(EINVAL),
        ms => Ok(ms),
    }
}
