// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab p2p`: the routes of this host's P2P window, copies with the management endpoint's
//! DMA engine, and the distance between two functions (uAPI 1.4, Documentation/uapi.rst).

use std::{
    fs::File,
    io::{Read, Write},
    time::Instant,
};

use pcifab::cli::{End, GrantArgs, P2p, Route as RouteCmd, GIB, KIB, MIB};
use pcifab_uapi::{
    dev::{self, CopyDst, CopySrc, P2pError, P2pOp},
    Route,
};
use serde_json::{json, Value};

use super::{emit, failure, open, pdfid_str, usage_error, Cli, Error, Progress};

/// Writes a byte count the way people read it: `16 MiB`, `4 KiB`, `4097 bytes`.
fn human(n: u64) -> String {
    match n {
        0 => "0 bytes".into(),
        n if n % GIB == 0 => format!("{} GiB", n / GIB),
        n if n % MIB == 0 => format!("{} MiB", n / MIB),
        n if n % KIB == 0 => format!("{} KiB", n / KIB),
        n => format!("{n} bytes"),
    }
}

/// Runs `pcifab p2p ...`.
pub fn run(cli: &Cli, p: &P2p) -> Result<(), Error> {
    match p {
        P2p::Route(RouteCmd::Add {
            pdfid,
            size,
            target_off,
            window_off,
        }) => route_add(cli, *pdfid, *size, *target_off, *window_off),
        P2p::Route(RouteCmd::Del { off }) => route_del(cli, *off),
        P2p::Route(RouteCmd::List) => route_list(cli),
        P2p::Copy { from, to, len } => copy(cli, from, to, *len),
        P2p::Distance { a, b } => distance(cli, *a, *b),
        P2p::Receive {
            from,
            len,
            out,
            wait,
        } => receive(cli, *from, *len, out, *wait),
        P2p::Grant(g) => grant(cli, g, true),
        P2p::Revoke(g) => grant(cli, g, false),
        P2p::Grants => grant_list(cli),
    }
}

/// Names the firmware's return codes of P2P_ROUTE (Documentation/mrpc.rst).
fn fw_reason(ret: u32) -> Option<&'static str> {
    Some(match ret {
        0 => return None,
        0x64006 => "invalid parameter",
        0xf0_0001 => "no function with this PDFID",
        0xf0_0002 => "beyond the function's device memory",
        0xf0_000a => "the function is not bound to any host",
        0xf0_000b => "the MEP already has 16 routes",
        0xf0_000c => "the window range overlaps a route",
        0xf0_000d => "no route starts at this window offset",
        0xf0_000e => "this host neither holds the function nor is the fabric-manager host",
        0xf0_000f => "no such grant",
        0xf0_0010 => "the function's holder has not granted this host access",
        0xf0_0011 => "the fabric holds 127 grants already",
        _ => "firmware error",
    })
}

/// The error of a failed P2P ioctl: what was asked, the errno and its meaning, the firmware's
/// reason, and `hint` (what to do). With `--json` it also prints a failure object.
fn p2p_error(cli: &Cli, what: &str, e: &P2pError, hint: Option<String>) -> Error {
    let mut msg = format!("{what} on {} failed", cli.device);
    if e.op == P2pOp::Copy && (e.done != 0 || e.dma_status != pcifab_uapi::DMA_STATUS_NONE) {
        msg.push_str(&format!(
            " after {} bytes (engine status {})",
            e.done,
            dev::dma_status_name(e.dma_status)
        ));
    }
    msg.push_str(&format!(": {}", e.err));
    if let Some(m) = e.meaning() {
        msg.push_str(&format!(" ({m})"));
    }
    if let Some(r) = fw_reason(e.fw_ret) {
        msg.push_str(&format!(" ({r}; firmware code {:#x})", e.fw_ret));
    }
    if let Some(h) = hint {
        msg.push_str(&format!("; {h}"));
    }
    let mut err = failure(msg)
        .errno(&e.err)
        .detail("ioctl", json!(e.op.ioctl_name()));
    match e.op {
        P2pOp::RouteAdd | P2pOp::RouteDel | P2pOp::Grant | P2pOp::Revoke => {
            err = err.detail("fw_ret", json!(format!("{:#x}", e.fw_ret)))
        }
        P2pOp::Copy => {
            err = err
                .detail("done", json!(e.done))
                .detail("dma_status", json!(dev::dma_status_name(e.dma_status)));
        }
        _ => {}
    }
    if e.refused() {
        err.exit = super::EXIT_REFUSED;
    }
    err
}

fn route_json(r: &Route) -> Value {
    json!({
        "window_off": r.window_off,
        "size": r.size,
        "pdfid": pdfid_str(r.pdfid),
        "target_off": r.target_off,
        "target_host": r.target_host,
    })
}

/// Checks that a route offset or size is a multiple of the route granule (4 KiB).
fn aligned(what: &str, n: u64) -> Result<(), Error> {
    if n % pcifab_uapi::ROUTE_ALIGN == 0 {
        Ok(())
    } else {
        Err(usage_error(format!(
            "{what} {n} ({n:#x}) is not a multiple of 4096 (4k): routes map whole 4 KiB pages"
        )))
    }
}

fn route_add(
    cli: &Cli,
    target: u16,
    size: u64,
    target_off: Option<u64>,
    window_off: Option<u64>,
) -> Result<(), Error> {
    if size == 0 {
        return Err(usage_error("--size must be more than 0"));
    }
    aligned("--size", size)?;
    let target_off = target_off.unwrap_or(0);
    aligned("--target-off", target_off)?;
    let window_off = window_off.unwrap_or(pcifab_uapi::ROUTE_ANY_WINDOW);
    if window_off != pcifab_uapi::ROUTE_ANY_WINDOW {
        aligned("--window-off", window_off)?;
    }
    let dev = open(&cli.device)?;
    let route = Route {
        window_off,
        size,
        target_off,
        pdfid: target,
        ..Route::default()
    };
    let r = dev::route_add(&dev, &route).map_err(|e| {
        let hint = match e.err.raw_os_error() {
            Some(libc::ENOENT) => Some("`pcifab list` shows the functions".to_string()),
            Some(libc::ENOLINK) => Some(format!(
                "bind it to a host first: `pcifab bind {} --host H`",
                pdfid_str(target)
            )),
            Some(libc::ERANGE) => Some("use a smaller --size or --target-off".into()),
            Some(libc::EEXIST | libc::ENOSPC) => Some(
                "`pcifab p2p route list` shows the routes, `pcifab p2p route del OFF` frees one"
                    .into(),
            ),
            Some(libc::EINVAL) if window_off != pcifab_uapi::ROUTE_ANY_WINDOW => Some(
                "`pcifab p2p route list` shows the window's size; leave --window-off out to \
                 take the lowest free offset"
                    .into(),
            ),
            _ => None,
        };
        p2p_error(
            cli,
            &format!("p2p route add {}", pdfid_str(target)),
            &e,
            hint,
        )
    })?;
    let added = r.route;
    if cli.json {
        let mut o = route_json(&added);
        o["nr_routes"] = json!(r.nr_routes);
        emit("p2p-route-add", o);
    } else {
        println!(
            "route added: window {:#x}-{:#x} ({}) -> {} at {:#x} (bound to host {}); {} of {} \
             routes",
            added.window_off,
            added
                .window_off
                .saturating_add(added.size)
                .saturating_sub(1),
            human(added.size),
            pdfid_str(added.pdfid),
            added.target_off,
            added.target_host,
            r.nr_routes,
            pcifab_uapi::MAX_ROUTES
        );
    }
    Ok(())
}

fn route_del(cli: &Cli, off: u64) -> Result<(), Error> {
    aligned("window offset", off)?;
    let dev = open(&cli.device)?;
    let r = dev::route_del(&dev, off).map_err(|e| {
        let hint = (e.err.raw_os_error() == Some(libc::ENOENT))
            .then(|| "`pcifab p2p route list` shows where the routes start".to_string());
        p2p_error(cli, &format!("p2p route del {off:#x}"), &e, hint)
    })?;
    if cli.json {
        emit(
            "p2p-route-del",
            json!({"window_off": off, "nr_routes": r.nr_routes}),
        );
    } else {
        println!(
            "route at window offset {off:#x} deleted; {} routes left",
            r.nr_routes
        );
    }
    Ok(())
}

fn route_list(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let t = dev::routes(&dev).map_err(|e| p2p_error(cli, "p2p route list", &e, None))?;
    if cli.json {
        emit(
            "p2p-route-list",
            json!({
                "window_size": t.window_size,
                "max_routes": pcifab_uapi::MAX_ROUTES,
                "routes": t.routes.iter().map(route_json).collect::<Vec<_>>(),
            }),
        );
        return Ok(());
    }
    println!(
        "P2P window: {} ({:#x} bytes); {} of {} routes",
        human(t.window_size),
        t.window_size,
        t.routes.len(),
        pcifab_uapi::MAX_ROUTES
    );
    println!("\nWINDOW OFF    SIZE          TARGET  TARGET OFF    HOST");
    for r in &t.routes {
        println!(
            "{:<13} {:<13} {:<7} {:<13} {}",
            format!("{:#x}", r.window_off),
            human(r.size),
            pdfid_str(r.pdfid),
            format!("{:#x}", r.target_off),
            r.target_host
        );
    }
    if t.routes.is_empty() {
        println!("(none; `pcifab p2p route add PDFID --size N` adds one)");
    }
    Ok(())
}

/// `p2p grant PDFID --host N` and `p2p revoke PDFID --host N`.
fn grant(cli: &Cli, g: &GrantArgs, grant: bool) -> Result<(), Error> {
    let verb = if grant { "grant" } else { "revoke" };
    let (f, host) = (g.pdfid, g.host);
    let dev = open(&cli.device)?;
    let what = format!("p2p {verb} {} --host {host}", pdfid_str(f));
    let g = dev::grant(&dev, f, host, grant).map_err(|e| p2p_error(cli, &what, &e, None))?;
    if cli.json {
        emit(
            if grant { "p2p-grant" } else { "p2p-revoke" },
            json!({"pdfid": pdfid_str(f), "grantee": host, "granted": grant,
                   "nr_grants": g.nr_grants}),
        );
    } else if grant {
        println!(
            "host {host} may now route to {}; {} grants on it",
            pdfid_str(f),
            g.nr_grants
        );
    } else {
        println!(
            "host {host} may no longer route to {} (its routes to it are gone); {} grants left",
            pdfid_str(f),
            g.nr_grants
        );
    }
    Ok(())
}

/// `p2p grants`: the grants this host may see.
fn grant_list(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let grants = dev::grants(&dev).map_err(|e| p2p_error(cli, "p2p grants", &e, None))?;
    if cli.json {
        let list: Vec<Value> = grants
            .iter()
            .map(|g| json!({"pdfid": pdfid_str(g.pdfid), "holder": g.holder, "grantee": g.grantee}))
            .collect();
        emit("p2p-grants", json!({ "grants": list }));
        return Ok(());
    }
    println!("FUNCTION  HOLDER  GRANTEE");
    for g in &grants {
        println!("{:<9} {:<7} {}", pdfid_str(g.pdfid), g.holder, g.grantee);
    }
    if grants.is_empty() {
        println!("(none; `pcifab p2p grant PDFID --host N` shares a function this host holds)");
    }
    Ok(())
}

/// The route that would cover `len` bytes at `off` of a function, as a command to add it.
fn route_suggestion(pdfid: u16, off: u64, len: u64) -> String {
    let a = pcifab_uapi::ROUTE_ALIGN;
    let start = off - off % a;
    let end = off.saturating_add(len).div_ceil(a).saturating_mul(a);
    let mut s = format!(
        "pcifab p2p route add {} --size {:#x}",
        pdfid_str(pdfid),
        end - start
    );
    if start != 0 {
        s.push_str(&format!(" --target-off {start:#x}"));
    }
    s
}

fn copy(cli: &Cli, from: &End, to: &End, len: u64) -> Result<(), Error> {
    let (from, to) = (from.clone(), to.clone());
    if len == 0 || len > pcifab_uapi::P2P_MAX_LEN {
        return Err(usage_error(format!(
            "--len {len} is out of range: copies are 1 byte to {}",
            human(pcifab_uapi::P2P_MAX_LEN)
        )));
    }
    match (&from, &to) {
        (End::File(_), End::File(_)) => {
            return Err(usage_error(
                "--from and --to are both files: one end of a copy must be device memory \
                 (PDFID:OFF); use cp for file to file",
            ))
        }
        (End::Iova(_), End::Iova(_)) => {
            return Err(usage_error(
                "--from and --to are both IOVAs: one end of a copy must be device memory \
                 (PDFID:OFF)",
            ))
        }
        (End::Peer { .. }, _) => {
            return Err(usage_error(
                "--from is a peer's buffer: a peer's buffer is only a destination (its owner \
                 copies out of it)",
            ))
        }
        (src, End::Peer { .. }) if !matches!(src, End::File(_)) => {
            return Err(usage_error(
                "--to is a peer's buffer: the source must be file:PATH (host memory)",
            ))
        }
        _ => {}
    }
    let n = usize::try_from(len).map_err(|_| usage_error("--len is too large for this host"))?;

    // Host memory for the file ends: read the source now, open the destination now (so a
    // path we cannot write fails before the copy), write it only after a copy that succeeded.
    let mut src_buf = Vec::new();
    if let End::File(p) = &from {
        let f = File::open(p)
            .map_err(|e| failure(format!("cannot open {} (--from): {e}", p.display())))?;
        src_buf.reserve_exact(n);
        f.take(len)
            .read_to_end(&mut src_buf)
            .map_err(|e| failure(format!("cannot read {} (--from): {e}", p.display())))?;
        if src_buf.len() < n {
            return Err(failure(format!(
                "{} holds only {} bytes but --len asks for {len}: copy fewer bytes or use a \
                 larger file",
                p.display(),
                src_buf.len()
            )));
        }
    }
    let mut dst_buf = Vec::new();
    let mut dst_file = None;
    if let End::File(p) = &to {
        let existed = p.exists();
        let f = File::options()
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .map_err(|e| failure(format!("cannot open {} (--to): {e}", p.display())))?;
        dst_file = Some((f, existed));
        dst_buf = vec![0u8; n];
    }

    let dev = open(&cli.device)?;
    let src = match &from {
        End::Function { pdfid, off } => CopySrc::Function {
            pdfid: *pdfid,
            off: *off,
        },
        End::File(_) => CopySrc::User(&src_buf),
        End::Iova(a) => CopySrc::Iova(*a),
        End::Peer { .. } => return Err(usage_error("--from cannot be a peer's buffer")),
    };
    let dst = match &to {
        End::Function { pdfid, off } => CopyDst::Function {
            pdfid: *pdfid,
            off: *off,
        },
        End::File(_) => CopyDst::User(&mut dst_buf),
        End::Iova(a) => CopyDst::Iova(*a),
        End::Peer { hfid, slot, off } => CopyDst::Peer {
            hfid: *hfid,
            slot: *slot,
            off: *off,
        },
    };
    let what = format!("p2p copy {from} -> {to}");
    let progress = Progress::start(format!("copying {}", human(len)), cli.json);
    let start = Instant::now();
    let r = dev::p2p_copy(&dev, src, dst, len, cli.timeout.unwrap_or(0));
    let elapsed = start.elapsed();
    drop(progress);
    let c = r.map_err(|e| {
        let peer = match &to {
            End::Peer { hfid, slot, .. } => Some((*hfid, *slot)),
            _ => None,
        };
        let mut hint = match (e.err.raw_os_error(), peer) {
            (Some(libc::ENOENT), Some((h, s))) => Some(format!(
                "peer {h:#06x} registers no buffer in slot {s} for this host (its owner \
                 registers it with PCIFAB_IOCTL_P2P_REGISTER)"
            )),
            (Some(libc::EFAULT), Some((h, s))) => Some(format!(
                "the range is not inside the buffer peer {h:#06x} registered in slot {s}"
            )),
            (Some(libc::EREMOTEIO), Some(_)) => {
                Some("the peer unregistered its buffer while the copy ran".into())
            }
            (Some(libc::ENOENT), None) => {
                let adds: Vec<String> = [&from, &to]
                    .into_iter()
                    .filter_map(|end| match end {
                        End::Function { pdfid, off } => Some(route_suggestion(*pdfid, *off, len)),
                        _ => None,
                    })
                    .collect();
                Some(format!(
                    "add a route that covers it: `{}` (`pcifab p2p route list` shows the routes)",
                    adds.join("` or `")
                ))
            }
            (Some(libc::EREMOTEIO), None) => {
                Some("a route was deleted, or its function unbound, while the copy ran".into())
            }
            (Some(libc::ETIMEDOUT), _) => Some("retry with a longer --timeout MS".into()),
            _ => None,
        };
        if let (End::File(p), Some((_, existed))) = (&to, &dst_file) {
            if !existed {
                let _ = std::fs::remove_file(p);
            }
            let note = format!("nothing was written to {}", p.display());
            hint = Some(match hint {
                Some(h) => format!("{h}; {note}"),
                None => note,
            });
        }
        p2p_error(cli, &what, &e, hint)
    })?;
    if c.done != len {
        return Err(failure(format!(
            "{what} on {}: the kernel reported success but only {} of {len} bytes copied \
             (engine status {})",
            cli.device,
            c.done,
            dev::dma_status_name(c.dma_status)
        )));
    }
    if let (Some((mut f, _)), End::File(p)) = (dst_file, &to) {
        let write = |f: &mut File| -> std::io::Result<()> {
            if f.metadata()?.is_file() {
                f.set_len(0)?;
            }
            f.write_all(&dst_buf)
        };
        write(&mut f).map_err(|e| {
            failure(format!(
                "the copy succeeded but writing {} failed: {e}",
                p.display()
            ))
        })?;
    }
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 {
        len as f64 / MIB as f64 / secs
    } else {
        0.0
    };
    if cli.json {
        emit(
            "p2p-copy",
            json!({
                "from": from.to_string(),
                "to": to.to_string(),
                "bytes": c.done,
                "elapsed_us": elapsed.as_micros() as u64,
                "mib_per_s": (rate * 10.0).round() / 10.0,
                "dma_status": dev::dma_status_name(c.dma_status),
            }),
        );
    } else {
        println!(
            "copied {} bytes ({}) {from} -> {to} in {:.3} ms: {rate:.1} MiB/s",
            c.done,
            human(c.done),
            secs * 1000.0
        );
    }
    Ok(())
}

/// Page size the buffer of `receive` is aligned to (the endpoint maps whole pages).
const PAGE: usize = 4096;

/// Waits up to `secs` seconds for SIGINT or SIGTERM, which the caller blocked; returns the
/// signal's name, or `None` when the time ran out.
fn wait_for_signal(secs: u64) -> Option<&'static str> {
    let deadline = Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let ts = libc::timespec {
            tv_sec: left.as_secs().try_into().unwrap_or(i32::MAX.into()),
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `set` is initialised by sigemptyset before use; `ts` outlives the call.
        let sig = unsafe {
            let mut set = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigtimedwait(&set, std::ptr::null_mut(), &ts)
        };
        match sig {
            libc::SIGINT => return Some("SIGINT"),
            libc::SIGTERM => return Some("SIGTERM"),
            // EAGAIN (time ran out) or EINTR (another signal): look at the clock again.
            _ => continue,
        }
    }
}

/// Blocks SIGINT and SIGTERM in this (single-threaded) process, so that they end the wait of
/// [`wait_for_signal`] instead of the process: the buffer is then saved and unregistered.
fn block_stop_signals() -> Result<(), Error> {
    // SAFETY: `set` is initialised by sigemptyset before use; the old mask is not wanted.
    let rc = unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(failure(format!(
            "cannot block SIGINT and SIGTERM: {}",
            std::io::Error::from_raw_os_error(rc)
        )));
    }
    Ok(())
}

fn receive(cli: &Cli, peer: u16, len: u64, out: &std::path::Path, wait: u64) -> Result<(), Error> {
    let n = usize::try_from(len)
        .ok()
        .filter(|&n| n > 0 && len <= pcifab_uapi::P2P_MAX_LEN)
        .ok_or_else(|| {
            usage_error(format!(
                "--len {len} is out of range: a buffer is 1 byte to {}",
                human(pcifab_uapi::P2P_MAX_LEN)
            ))
        })?;
    // The output file first, so that a path we cannot write fails before anything is lent.
    let mut file = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(out)
        .map_err(|e| failure(format!("cannot open {} (--out): {e}", out.display())))?;
    // Page-aligned, zeroed: the endpoint maps whole pages, and what the peer did not write
    // reads back as zeroes. Declared before `dev`, so that it is dropped after the file's
    // close (which ends the registration).
    let mut backing = vec![0u8; n + PAGE];
    let dev = open(&cli.device)?;
    block_stop_signals()?;
    let skip = backing.as_ptr().align_offset(PAGE);
    let buf = &mut backing[skip..skip + n];
    // SAFETY: `backing` outlives the registration: it ends with the unregister below or
    // when `dev` closes, and `backing` is dropped after `dev` (or never, when the unregister
    // failed); the buffer is used for nothing but the peer's writes and the read-back.
    let b = unsafe { dev::register(&dev, peer, buf) }.map_err(|e| {
        let hint = match e.err.raw_os_error() {
            Some(libc::EOPNOTSUPP) => Some(
                "this host has no DMA endpoint in fabric mode bound to pcifab (ls \
                 /sys/bus/pci/drivers/pcifab_dmaep)"
                    .to_string(),
            ),
            Some(libc::ENODEV) => Some("the DMA endpoint went away (unbound)".to_string()),
            Some(libc::ENOSPC) => Some(format!(
                "every slot for peer {peer:#06x} is taken: end another registration first"
            )),
            Some(libc::EINVAL) => Some(format!(
                "--from must be another host's HFID, and the buffer must map as one range \
                 for the endpoint ({} without an IOMMU)",
                human(PAGE as u64)
            )),
            _ => None,
        };
        p2p_error(cli, &format!("p2p receive from {peer:#06x}"), &e, hint)
    })?;
    let copy = format!(
        "pcifab p2p copy --from file:PATH --to peer:{:#06x}:{}:0 --len {len}",
        b.hfid, b.slot
    );
    if cli.json {
        emit(
            "p2p-receive",
            json!({
                "phase": "registered",
                "peer": pdfid_str(peer),
                "hfid": pdfid_str(b.hfid),
                "slot": b.slot,
                "bytes": len,
            }),
        );
    } else {
        println!(
            "lent {} to peer {peer:#06x} in slot {} (this host's HFID {:#06x}); on the peer: \
             {copy}; waiting up to {wait} s (SIGINT or SIGTERM ends the wait)",
            human(len),
            b.slot,
            b.hfid
        );
        let _ = std::io::stdout().flush();
    }
    let start = Instant::now();
    let ended = wait_for_signal(wait);
    let waited = start.elapsed();
    let unreg = dev::unregister(&dev, peer, b.slot);
    // The peer's engine wrote the memory behind the compiler's back: read it volatile, a
    // chunk at a time.
    let mut nonzero = 0usize;
    let mut chunk = Vec::with_capacity(n.min(64 << 10));
    let mut written = Ok(());
    for part in buf.chunks(64 << 10) {
        chunk.clear();
        // SAFETY: each `b` refers to a byte of the live buffer.
        chunk.extend(part.iter().map(|b| unsafe { std::ptr::read_volatile(b) }));
        nonzero += chunk.iter().filter(|&&b| b != 0).count();
        if written.is_ok() {
            written = file.write_all(&chunk);
        }
    }
    if unreg.is_err() {
        // Still registered (the firmware did not answer): the peer may still write, so the
        // memory is never given back to the allocator, even after the close.
        std::mem::forget(backing);
    }
    written.map_err(|e| failure(format!("writing {} failed: {e}", out.display())))?;
    unreg.map_err(|e| {
        p2p_error(
            cli,
            &format!("p2p receive: unregistering slot {} of {peer:#06x}", b.slot),
            &e,
            Some(format!(
                "{} holds the buffer as it was; closing the device ends the registration",
                out.display()
            )),
        )
    })?;
    let ended = ended.unwrap_or("timeout");
    if cli.json {
        emit(
            "p2p-receive",
            json!({
                "phase": "saved",
                "peer": pdfid_str(peer),
                "hfid": pdfid_str(b.hfid),
                "slot": b.slot,
                "bytes": len,
                "nonzero_bytes": nonzero,
                "out": out.display().to_string(),
                "waited_ms": waited.as_millis() as u64,
                "ended_by": ended,
            }),
        );
    } else {
        println!(
            "saved {} ({nonzero} bytes not zero) to {} after {:.1} s ({ended}); slot {} \
             unregistered",
            human(len),
            out.display(),
            waited.as_secs_f64(),
            b.slot
        );
    }
    Ok(())
}

fn path_name(path: u32) -> (&'static str, &'static str) {
    match path {
        pcifab_uapi::P2P_PATH_SAME => ("same", "the same function"),
        pcifab_uapi::P2P_PATH_SWITCH => ("switch", "both on this host, through its virtual switch"),
        pcifab_uapi::P2P_PATH_FABRIC => (
            "fabric",
            "through the fabric, by a route of this host's management endpoint",
        ),
        _ => ("unknown", "a path this tool does not know"),
    }
}

/// The info bits of a distance: name, JSON key and what it says (with `a`, `b` filled in).
fn info_flags(info: u32, a: u16, b: u16) -> Vec<(&'static str, &'static str, String)> {
    let (a, b) = (pdfid_str(a), pdfid_str(b));
    let mut out: Vec<_> = [
        (
            pcifab_uapi::P2P_A_LOCAL,
            "A_LOCAL",
            "a_local",
            format!("{a} is bound to and enumerated on this host"),
        ),
        (
            pcifab_uapi::P2P_B_LOCAL,
            "B_LOCAL",
            "b_local",
            format!("{b} is bound to and enumerated on this host"),
        ),
        (
            pcifab_uapi::P2P_A_ROUTED,
            "A_ROUTED",
            "a_routed",
            format!("a route of this host reaches {a}"),
        ),
        (
            pcifab_uapi::P2P_B_ROUTED,
            "B_ROUTED",
            "b_routed",
            format!("a route of this host reaches {b}"),
        ),
        (
            pcifab_uapi::P2P_ACS_REDIRECT,
            "ACS_REDIRECT",
            "acs_redirect",
            "a downstream port redirects peer requests upstream".to_string(),
        ),
    ]
    .into_iter()
    .filter(|(bit, ..)| info & bit != 0)
    .map(|(_, name, key, text)| (name, key, text))
    .collect();
    let known = pcifab_uapi::P2P_A_LOCAL
        | pcifab_uapi::P2P_B_LOCAL
        | pcifab_uapi::P2P_A_ROUTED
        | pcifab_uapi::P2P_B_ROUTED
        | pcifab_uapi::P2P_ACS_REDIRECT;
    if info & !known != 0 {
        out.push((
            "UNKNOWN",
            "unknown",
            format!("bits {:#x} this tool does not know", info & !known),
        ));
    }
    out
}

fn distance(cli: &Cli, a: u16, b: u16) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let d = dev::p2p_distance(&dev, a, b).map_err(|e| {
        let hint = (e.err.raw_os_error() == Some(libc::ENOENT))
            .then(|| "`pcifab list` shows the functions".to_string());
        p2p_error(
            cli,
            &format!("p2p distance {} {}", pdfid_str(a), pdfid_str(b)),
            &e,
            hint,
        )
    })?;
    let (path, path_text) = path_name(d.path);
    let flags = info_flags(d.info, a, b);
    if cli.json {
        let mut info = serde_json::Map::new();
        for (_, key, _) in &flags {
            info.insert(key.to_string(), json!(true));
        }
        emit(
            "p2p-distance",
            json!({
                "a": pdfid_str(a),
                "b": pdfid_str(b),
                "path": path,
                "hops": d.hops,
                "pci_distance": d.pci_distance,
                "info": format!("{:#x}", d.info),
                "flags": flags.iter().map(|(_, key, _)| *key).collect::<Vec<_>>(),
            }),
        );
        return Ok(());
    }
    println!("between:       {} and {}", pdfid_str(a), pdfid_str(b));
    println!("path:          {path} ({path_text})");
    println!("hops:          {} switch ports", d.hops);
    if d.pci_distance < 0 {
        println!(
            "pci distance:  {} (the kernel would refuse P2P, or one of them is not local)",
            d.pci_distance
        );
    } else {
        println!("pci distance:  {}", d.pci_distance);
    }
    if flags.is_empty() {
        println!("info:          none");
    }
    for (i, (name, _, text)) in flags.iter().enumerate() {
        let label = if i == 0 { "info:" } else { "" };
        println!("{label:<14} {name}: {text}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(16 << 20), "16 MiB");
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(4097), "4097 bytes");
        assert_eq!(human(0), "0 bytes");
    }

    #[test]
    fn route_suggestions_cover_the_range() {
        assert_eq!(
            route_suggestion(0x300, 0, 4096),
            "pcifab p2p route add 0x0300 --size 0x1000"
        );
        assert_eq!(
            route_suggestion(0x300, 0x1800, 0x1000),
            "pcifab p2p route add 0x0300 --size 0x2000 --target-off 0x1000"
        );
    }

    #[test]
    fn info_flags_are_spelled_out() {
        let f = info_flags(
            pcifab_uapi::P2P_A_LOCAL | pcifab_uapi::P2P_B_ROUTED | 0x100,
            0x300,
            0x400,
        );
        let names: Vec<_> = f.iter().map(|(n, ..)| *n).collect();
        assert_eq!(names, ["A_LOCAL", "B_ROUTED", "UNKNOWN"]);
        assert!(f[1].2.contains("0x0400"));
    }
}
