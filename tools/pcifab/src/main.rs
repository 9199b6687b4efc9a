// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab`: look at and compose a multi-host PCIe switch fabric through `/dev/pcifabN`.
//!
//! Exit codes: 0 success, 1 the operation failed, 2 the command line is wrong, 3 the fabric
//! refused it (conflict, policy, unknown function). Documentation/cli.rst describes every
//! command and its JSON output.

use std::{fs::File, process::ExitCode};

/// mimalloc keeps freed memory for the next allocation; musl's allocator gives it back to
/// the kernel at once (tools/Cargo.toml).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod manager;
mod out;
mod p2p;
mod top;

use clap::{parser::ValueSource, CommandFactory, FromArgMatches};
use out::{emit, failure, usage_error, Error, Progress, EXIT_REFUSED};
use pcifab::cli::{BindArgs, Cli, Command, MoveArgs, SCOPED_GLOBALS};
use pcifab_manager::blockdev::{self, Appeared, Decision, Roots, Usage};
use pcifab_uapi::{dev, fixed_str, Arg, Bind, Events, Function, Move, Port, Unbind};
use serde_json::{json, Value};

/// Opens the character device, explaining the usual reasons it is not there.
fn open(path: &str) -> Result<File, Error> {
    File::open(path).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound => {
                "; is the pcifab module loaded and bound (lsmod, /sys/bus/pci/drivers/pcifab)?"
            }
            std::io::ErrorKind::PermissionDenied => {
                "; run as root or as a member of group pcifab (the udev rule of the \
                 pcifab-tools package gives that group read access)"
            }
            _ => "",
        };
        failure(format!("cannot open {path}: {e}{hint}")).errno(&e)
    })
}

/// The error of a failed ioctl with no further reason.
fn ioctl_error(name: &str, path: &str, e: std::io::Error) -> Error {
    failure(format!("{name} on {path} failed: {e}")).errno(&e)
}

pub fn pdfid_str(id: u16) -> String {
    format!("{id:#06x}")
}

fn info_json(device: &str, v: &pcifab_uapi::Version, id: &pcifab_uapi::Identity) -> Value {
    json!({
        "uapi_version": format!("{}.{}", v.major, v.minor),
        "device": device,
        "pci_vendor": format!("{:#06x}", id.pci_vendor),
        "pci_device": format!("{:#06x}", id.pci_device),
        "device_id": format!("{:#06x}", id.device_id),
        "device_version": format!("{:#x}", id.device_version),
        "fw_version": format!("{:#010x}", id.fw_version),
        "partition": id.partition,
        "partition_count": id.partition_count,
        "vendor_id": fixed_str(&id.vendor_id),
        "product_id": fixed_str(&id.product_id),
        "product_revision": fixed_str(&id.product_revision),
        "features": feature_names(id.features),
        "pax_id": id.pax_id,
    })
}

/// The firmware extensions of `PCIFAB_IOCTL_IDENTITY`'s `features`, by name (as sysfs
/// `features` shows them).
fn feature_names(bits: u32) -> Vec<&'static str> {
    [
        (pcifab_uapi::FEATURE_TELEMETRY, "telemetry"),
        (pcifab_uapi::FEATURE_P2P_ROUTES, "p2p-routes"),
        (pcifab_uapi::FEATURE_DMA_ENGINE, "dma-engine"),
        (pcifab_uapi::FEATURE_UNBIND_REQUEST, "unbind-request"),
    ]
    .into_iter()
    .filter(|(b, _)| bits & b != 0)
    .map(|(_, n)| n)
    .collect()
}

fn info(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let v = dev::version(&dev).map_err(|e| ioctl_error("PCIFAB_IOCTL_VERSION", &cli.device, e))?;
    if v.major != pcifab_uapi::VERSION_MAJOR {
        return Err(failure(format!(
            "{} speaks uAPI {}.{}, this tool {}.{}: use a matching pcifab tool",
            cli.device,
            v.major,
            v.minor,
            pcifab_uapi::VERSION_MAJOR,
            pcifab_uapi::VERSION_MINOR
        )));
    }
    let id =
        dev::identity(&dev).map_err(|e| ioctl_error("PCIFAB_IOCTL_IDENTITY", &cli.device, e))?;
    if cli.json {
        emit("info", info_json(&cli.device, &v, &id));
        return Ok(());
    }
    let (vendor, product, rev) = (
        fixed_str(&id.vendor_id),
        fixed_str(&id.product_id),
        fixed_str(&id.product_revision),
    );
    println!("device:           {}", cli.device);
    println!(
        "switch:           {vendor} {product} rev {rev} (device id {:#06x}, version {:#x})",
        id.device_id, id.device_version
    );
    println!("firmware:         {:08x}", id.fw_version);
    println!(
        "partition:        {} of {}",
        id.partition, id.partition_count
    );
    println!(
        "management EP:    {:04x}:{:04x}",
        id.pci_vendor, id.pci_device
    );
    let features = feature_names(id.features);
    println!(
        "firmware features: {}",
        if features.is_empty() {
            "none (PAX firmware: no telemetry, P2P routes or DMA engine)".to_string()
        } else {
            features.join(" ")
        }
    );
    println!("PAX id:           {}", id.pax_id);
    println!("uAPI:             {}.{}", v.major, v.minor);
    Ok(())
}

fn stats_json(s: &pcifab_uapi::Stats) -> Value {
    json!({
        "mrpc_commands": s.mrpc_commands,
        "mrpc_completions": s.mrpc_completions,
        "mrpc_timeouts": s.mrpc_timeouts,
        "mrpc_firmware_dead": s.mrpc_firmware_dead,
        "event_irqs": s.event_irqs,
    })
}

fn stats(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let s = dev::stats(&dev).map_err(|e| ioctl_error("PCIFAB_IOCTL_STATS", &cli.device, e))?;
    if cli.json {
        emit("stats", stats_json(&s));
    } else {
        println!("mrpc commands:       {}", s.mrpc_commands);
        println!("mrpc completions:    {}", s.mrpc_completions);
        println!("mrpc timeouts:       {}", s.mrpc_timeouts);
        println!("mrpc firmware dead:  {}", s.mrpc_firmware_dead);
        println!("event interrupts:    {}", s.event_irqs);
    }
    Ok(())
}

fn mrpc_json(cmd: u32, status: u32, ret: u32, output: &[u8]) -> Value {
    let hex: String = output.iter().map(|b| format!("{b:02x}")).collect();
    json!({"cmd": format!("{cmd:#x}"), "status": status, "ret_value": format!("{ret:#x}"), "output": hex})
}

fn mrpc(cli: &Cli, cmd: u32, input: &[u8], out_len: u32) -> Result<(), Error> {
    let mut output = vec![0u8; out_len as usize];
    let dev = open(&cli.device)?;
    let (status, ret) = dev::mrpc(&dev, cmd, input, &mut output, cli.timeout.unwrap_or(0))
        .map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EPERM) => "; this command class needs CAP_SYS_ADMIN or CAP_SYS_RAWIO",
                Some(libc::ETIMEDOUT) => "; the firmware is slow: retry with a longer --timeout",
                Some(libc::EIO) => "; the switch firmware is not running",
                _ => "",
            };
            failure(format!(
                "MRPC command {cmd:#x} on {} failed: {e}{hint}",
                cli.device
            ))
            .errno(&e)
        })?;
    if status != pcifab_uapi::MRPC_STATUS_DONE {
        let mut e = failure(format!(
            "the firmware failed command {cmd:#x}: status {status:#x}, return value {ret:#x}"
        ))
        .detail("status", json!(status))
        .detail("ret_value", json!(format!("{ret:#x}")));
        e.kind = "firmware";
        if !cli.json {
            println!("status {status:#x} return {ret:#x}");
        }
        return Err(e);
    }
    if cli.json {
        emit("mrpc", mrpc_json(cmd, status, ret, &output));
    } else {
        println!("status {status:#x} return {ret:#x}");
        let hex: String = output.iter().map(|b| format!("{b:02x}")).collect();
        if !hex.is_empty() {
            println!("{hex}");
        }
    }
    Ok(())
}

/// The fabric as the driver sees it.
pub struct Fabric {
    pub inv: pcifab_uapi::Inventory,
    pub ports: Vec<Port>,
    pub functions: Vec<Function>,
}

pub fn inventory(dev: &File, path: &str) -> Result<Fabric, Error> {
    let (inv, ports, functions) = dev::inventory(dev).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EIO) => {
                "; the firmware's reply was malformed or it failed the query (see dmesg)"
            }
            Some(libc::EAGAIN) => "; the fabric kept growing, try again",
            _ => "",
        };
        failure(format!(
            "PCIFAB_IOCTL_INVENTORY on {path} failed: {e}{hint}"
        ))
        .errno(&e)
    })?;
    Ok(Fabric {
        inv,
        ports,
        functions,
    })
}

fn port_type(kind: u8) -> &'static str {
    match kind {
        pcifab_uapi::PORT_HOST => "host",
        pcifab_uapi::PORT_ENDPOINT => "endpoint",
        pcifab_uapi::PORT_FABRIC => "fabric",
        _ => "unused",
    }
}

fn port_json(p: &Port) -> Value {
    json!({
        "port": p.phys_port,
        "type": port_type(p.kind),
        "link_up": p.link_up != 0,
        "width": p.width,
        "rate": p.rate,
    })
}

fn function_json(f: &Function) -> Value {
    let bound = f.flags & pcifab_uapi::FN_BOUND != 0;
    json!({
        "pdfid": pdfid_str(f.pdfid),
        "kind": if f.flags & pcifab_uapi::FN_VF != 0 { "vf" } else { "pf" },
        "pf": pdfid_str(f.pf_pdfid),
        "vf_index": f.vf_index,
        "total_vfs": f.total_vfs,
        "vendor": format!("{:#06x}", f.vendor),
        "device": format!("{:#06x}", f.device),
        "class": format!("{:#08x}", f.class_code),
        "port": f.phys_port,
        "link_up": f.flags & pcifab_uapi::FN_LINK_UP != 0,
        "bound": bound,
        "host": if bound { json!(f.bound_host) } else { Value::Null },
        "host_port": if bound { json!(f.bound_port) } else { Value::Null },
    })
}

fn list_json(fab: &Fabric) -> Value {
    json!({
        "generation": fab.inv.generation,
        "partition": fab.inv.partition,
        "host_count": fab.inv.host_count,
        "ports": fab.ports.iter().map(port_json).collect::<Vec<_>>(),
        "functions": fab.functions.iter().map(function_json).collect::<Vec<_>>(),
    })
}

fn holder(f: &Function) -> String {
    if f.flags & pcifab_uapi::FN_BOUND != 0 {
        format!("host {} port {}", f.bound_host, f.bound_port)
    } else {
        "free".into()
    }
}

fn list(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let fab = inventory(&dev, &cli.device)?;
    if cli.json {
        emit("list", list_json(&fab));
        return Ok(());
    }
    println!(
        "fabric generation {}; this is host {} of {}",
        fab.inv.generation, fab.inv.partition, fab.inv.host_count
    );
    println!("\nPORT  TYPE      LINK  WIDTH  RATE");
    for p in &fab.ports {
        let link = if p.link_up != 0 { "up" } else { "down" };
        println!(
            "{:<5} {:<9} {:<5} x{:<5} Gen{}",
            p.phys_port,
            port_type(p.kind),
            link,
            p.width,
            p.rate
        );
    }
    println!("\nPDFID   FUNCTION     PF      ID         CLASS     PORT  HELD BY");
    for f in &fab.functions {
        let kind = if f.flags & pcifab_uapi::FN_VF != 0 {
            format!("VF {}", f.vf_index)
        } else {
            format!("PF ({} VFs)", f.total_vfs)
        };
        println!(
            "{:<7} {:<12} {:<7} {:04x}:{:04x}  {:06x}    {:<5} {}",
            pdfid_str(f.pdfid),
            kind,
            pdfid_str(f.pf_pdfid),
            f.vendor,
            f.device,
            f.class_code,
            f.phys_port,
            holder(f)
        );
    }
    Ok(())
}

/// A telemetry sample as JSON (`show`, `top`, `stats --telemetry`).
pub fn telemetry_json(t: &pcifab_uapi::telemetry::Sample) -> Value {
    json!({
        "temperature_centi": t.temperature_centi,
        "power_mw": t.power_mw,
        "utilisation": t.utilisation,
        "health": t.health,
    })
}

/// Why there is no telemetry on PAX firmware (`show`'s line, `top`'s and `stats
/// --telemetry`'s error).
pub const LACKS_TELEMETRY: &str = "the switch firmware lacks the telemetry extension \
     (pcifab's firmware feature `telemetry`; PAX firmware has none: `pcifab info` lists the \
     firmware's features)";

/// Whether the firmware has pcifab's per-function telemetry (`PCIFAB_FEATURE_TELEMETRY` in
/// the identity's `features`). `None` when the driver cannot say (a module before uAPI 1.6,
/// whose identity has no `features`, or a failed ioctl): the caller then just asks.
pub fn has_telemetry(dev: &File) -> Option<bool> {
    let v = dev::version(dev).ok()?;
    if v.major != pcifab_uapi::VERSION_MAJOR || v.minor < 6 {
        return None;
    }
    let id = dev::identity(dev).ok()?;
    Some(id.features & pcifab_uapi::FEATURE_TELEMETRY != 0)
}

/// The error of `top` and `stats --telemetry` on firmware without telemetry: `EOPNOTSUPP`,
/// as the P2P commands fail without their extensions.
pub fn no_telemetry(path: &str) -> Error {
    failure(format!(
        "no telemetry to show from {path}: {LACKS_TELEMETRY}"
    ))
    .errno(&std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    .detail("missing_feature", json!("telemetry"))
}

fn show(cli: &Cli, pdfid: u16) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let fab = inventory(&dev, &cli.device)?;
    let f = fab
        .functions
        .iter()
        .find(|f| f.pdfid == pdfid)
        .ok_or_else(|| {
            failure(format!(
                "no function {} in the fabric; `pcifab list` shows them",
                pdfid_str(pdfid)
            ))
        })?;
    // None: the firmware lacks the extension, so it is not asked.
    let telemetry = (has_telemetry(&dev) != Some(false)).then(|| dev::telemetry(&dev, pdfid));
    if cli.json {
        let mut o = function_json(f);
        match &telemetry {
            Some(Ok(t)) => o["telemetry"] = telemetry_json(t),
            Some(Err(e)) => o["telemetry_error"] = json!(e),
            None => {
                o["telemetry"] = Value::Null;
                o["missing_feature"] = json!("telemetry");
            }
        }
        emit("show", o);
        return Ok(());
    }
    let vfs: Vec<String> = fab
        .functions
        .iter()
        .filter(|v| v.flags & pcifab_uapi::FN_VF != 0 && v.pf_pdfid == pdfid)
        .map(|v| format!("{} ({})", pdfid_str(v.pdfid), holder(v)))
        .collect();
    println!("function:     {}", pdfid_str(f.pdfid));
    if f.flags & pcifab_uapi::FN_VF != 0 {
        println!(
            "kind:         VF {} of {}",
            f.vf_index,
            pdfid_str(f.pf_pdfid)
        );
    } else {
        println!("kind:         PF with {} VFs", f.total_vfs);
    }
    println!(
        "ids:          {:04x}:{:04x} class {:06x}",
        f.vendor, f.device, f.class_code
    );
    let link = if f.flags & pcifab_uapi::FN_LINK_UP != 0 {
        "up"
    } else {
        "down"
    };
    println!("port:         {} (link {link})", f.phys_port);
    println!("held by:      {}", holder(f));
    if !vfs.is_empty() {
        println!("VFs:          {}", vfs.join(", "));
    }
    match telemetry {
        Some(Ok(t)) => {
            let temp = t.temperature_centi;
            println!("temperature:  {}.{:02} C", temp / 100, (temp % 100).abs());
            println!("power:        {} mW", t.power_mw);
            println!("utilisation:  {} %", t.utilisation);
            println!("health:       {}", top::health_text(u64::from(t.health)));
        }
        Some(Err(e)) => println!("telemetry:    not available ({e})"),
        None => println!("telemetry:    none: {LACKS_TELEMETRY}"),
    }
    Ok(())
}

fn watch(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let mut ev = Events::new();
    dev::events(&dev, &mut ev).map_err(|e| ioctl_error("PCIFAB_IOCTL_EVENTS", &cli.device, e))?;
    let mut seen = ev.total;
    let (count, timeout) = (cli.count.unwrap_or(0), cli.timeout.unwrap_or(0));
    if !cli.json {
        eprintln!(
            "watching {} (events so far: {seen}); Ctrl-C stops",
            cli.device
        );
    }
    let mut reports = 0;
    while count == 0 || reports < count {
        ev = Events::new();
        ev.flags = pcifab_uapi::EVENTS_WAIT;
        ev.seen = seen;
        ev.timeout_ms = timeout;
        dev::events(&dev, &mut ev).map_err(|e| {
            failure(format!("waiting for events on {} failed: {e}", cli.device)).errno(&e)
        })?;
        if ev.total == seen {
            // Timed out with nothing new.
            if timeout != 0 {
                return Err(failure(format!("no event within {timeout} ms"))
                    .errno(&std::io::Error::from_raw_os_error(libc::ETIMEDOUT)));
            }
            continue;
        }
        let new = ev.total.wrapping_sub(seen);
        seen = ev.total;
        reports += 1;
        if cli.json {
            emit(
                "watch",
                json!({"new": new, "total": ev.total, "link": ev.link, "gfms": ev.gfms}),
            );
        } else {
            println!(
                "{} {new} new event(s): total {} (link {}, fabric {})",
                out::rfc3339(std::time::SystemTime::now()),
                ev.total,
                ev.link,
                ev.gfms
            );
        }
    }
    Ok(())
}

/// PAX's `ERR_PHYC_PORT_ARDY_BIND`: the function (one of the list) is bound already.
const FW_ALREADY_BOUND: u32 = 0x1;

/// Names the firmware's return codes of binding: PAX's GFMS_BIND_UNBIND codes
/// (switchtec-user's `errors.h`; Documentation/mrpc.rst) and the emulator's two of its own.
fn fw_reason(ret: u32) -> Option<&'static str> {
    Some(match ret {
        0 => return None,
        0x1 => "the function is bound or being bound already",
        0x2 => "that logical port already holds a binding",
        0x3 => "no such host (partition)",
        0x4 => "no function with this PDFID, or no such port",
        0x5 => "the physical port is disabled",
        0x6 => "no such logical port: the host holds as many functions as it may",
        0x7 => "another bind or unbind of the function is in progress",
        0x8 => "the target is an upstream port",
        0xb => "the logical port holds no binding: the function is not bound there",
        0xc => "invalid unbind option",
        0xd => "the binding fails the firmware's checks (a PF and one of its VFs together)",
        0x64006 => "invalid parameter",
        0x64010 => "the fabric's policy does not allow it",
        0xf0_0008 => "the hot-plug of the target host failed",
        0xf0_0009 => "the owner did not release the function in time",
        _ => "firmware error",
    })
}

/// The error of a failed bind, unbind or move, with the firmware's reason.
fn compose_error(verb: &str, pdfid: u16, e: std::io::Error, fw_ret: u32) -> Error {
    compose_error_of(verb, &[pdfid], e, fw_ret)
}

/// [`compose_error`] of an operation on `pdfids` (one function, or a list bound together).
fn compose_error_of(verb: &str, pdfids: &[u16], e: std::io::Error, fw_ret: u32) -> Error {
    let pdfid = pdfids.first().copied().unwrap_or_default();
    let mut msg = format!("{verb} {} failed: {e}", pdfids_str(pdfids));
    if let Some(r) = fw_reason(fw_ret) {
        if pdfids.len() > 1 {
            let r = match fw_ret {
                FW_ALREADY_BOUND => "a function of it is bound or being bound already",
                _ => r,
            };
            msg.push_str(&format!(
                " (the firmware refused the whole list: {r}; firmware code {fw_ret:#x})"
            ));
        } else {
            msg.push_str(&format!(" ({r}; firmware code {fw_ret:#x})"));
        }
    }
    if e.raw_os_error() == Some(libc::EPERM) {
        msg.push_str("; composing the fabric needs CAP_SYS_ADMIN (run as root)");
    }
    let is_refused = matches!(
        e.raw_os_error(),
        Some(libc::EBUSY | libc::EACCES | libc::ENOSPC | libc::ENOENT)
    );
    let mut err = failure(msg)
        .errno(&e)
        .detail("pdfid", json!(pdfid_str(pdfid)))
        .detail("fw_ret", json!(format!("{fw_ret:#x}")));
    if is_refused {
        err.exit = EXIT_REFUSED;
    }
    err
}

/// A NUL-padded name as text.
fn c_name(raw: &[u8]) -> Option<String> {
    let s = fixed_str(raw);
    (!s.is_empty()).then_some(s)
}

/// `bind`'s object for the functions `pdfids` (`b.pdfid` first); `blocks` only for a
/// storage function bound here.
fn bind_json(b: &Bind, pdfids: &[u16], ms: u64, blocks: Option<&[String]>) -> Value {
    let list: Vec<String> = pdfids.iter().map(|&p| pdfid_str(p)).collect();
    let mut o = json!({"pdfid": pdfid_str(b.pdfid), "pdfids": list, "host": b.host,
               "port": b.port, "device": c_name(&b.name),
               "vendor": format!("{:#06x}", b.vendor),
               "device_id": format!("{:#06x}", b.device), "elapsed_ms": ms});
    if let Some(bl) = blocks {
        o["block_devices"] = json!(bl);
    }
    o
}

/// `move`'s object; `blocks` only for a storage function moved here.
fn move_json(m: &Move, ms: u64, blocks: Option<&[String]>) -> Value {
    let mut o = json!({"pdfid": pdfid_str(m.pdfid), "from_host": m.from_host,
               "from_port": m.from_port, "host": m.host, "port": m.port,
               "device": c_name(&m.name), "elapsed_ms": ms});
    if let Some(bl) = blocks {
        o["block_devices"] = json!(bl);
    }
    o
}

/// The functions of a bind list as text: `0x0401, 0x0402, 0x0403`.
fn pdfids_str(pdfids: &[u16]) -> String {
    pdfids
        .iter()
        .map(|&p| pdfid_str(p))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Binding several functions at once needs uAPI 1.6 (`nr_pdfids`, `pdfids`); an older
/// module would refuse the struct with `E2BIG`.
fn require_multi_bind(dev: &File, path: &str) -> Result<(), Error> {
    let v = dev::version(dev).map_err(|e| ioctl_error("PCIFAB_IOCTL_VERSION", path, e))?;
    if v.major == pcifab_uapi::VERSION_MAJOR && v.minor < 6 {
        return Err(failure(format!(
            "{path} speaks uAPI {}.{}: binding several functions together needs uAPI 1.6 \
             (load a newer pcifab module, or bind one function at a time)",
            v.major, v.minor
        )));
    }
    Ok(())
}

/// The error of a failed bind of several functions: as [`compose_error`]'s, naming the whole
/// list, the functions of it that are bound already when the firmware refused it for that,
/// and that none of them was bound.
fn bind_list_error(
    dev: &File,
    path: &str,
    pdfids: &[u16],
    e: std::io::Error,
    fw_ret: u32,
) -> Error {
    let mut held = Vec::new();
    if fw_ret == FW_ALREADY_BOUND {
        if let Ok(fab) = inventory(dev, path) {
            for &p in pdfids {
                if let Some(f) = fab
                    .functions
                    .iter()
                    .find(|f| f.pdfid == p && f.flags & pcifab_uapi::FN_BOUND != 0)
                {
                    held.push(format!(
                        "{} is bound to host {} port {}",
                        pdfid_str(p),
                        f.bound_host,
                        f.bound_port
                    ));
                }
            }
        }
    }
    let mut err = compose_error_of("bind", pdfids, e, fw_ret);
    if !held.is_empty() {
        err.msg.push_str(&format!("; {}", held.join(", ")));
    }
    err.msg.push_str(&format!(
        "; none of the {} functions was bound (a list binds all or none)",
        pdfids.len()
    ));
    err.detail(
        "pdfids",
        json!(pdfids.iter().map(|&p| pdfid_str(p)).collect::<Vec<_>>()),
    )
}

fn bind(cli: &Cli, a: &BindArgs) -> Result<(), Error> {
    pcifab::cli::bind_list(&a.pdfids).map_err(usage_error)?;
    let (list, to) = (&a.pdfids[..], &a.target);
    let (pdfid, host) = (a.primary(), to.host);
    let dev = open(&cli.device)?;
    let multi = list.len() > 1;
    if multi {
        require_multi_bind(&dev, &cli.device)?;
    }
    let mut b = Bind::new();
    (b.pdfid, b.host, b.port) = (pdfid, host, to.port.unwrap_or(pcifab_uapi::ANY_PORT));
    // A list of one is the call of every earlier release: nr_pdfids 0, `pdfid` alone.
    if multi {
        b.nr_pdfids = list.len() as u32;
        b.pdfids[..list.len()].copy_from_slice(list);
    }
    b.timeout_ms = cli.timeout.unwrap_or(0);
    if to.no_wait {
        b.flags = pcifab_uapi::BIND_NO_WAIT;
    }
    let what = pdfids_str(list);
    let start = std::time::Instant::now();
    let progress = Progress::start(format!("binding {what} to host {host}"), cli.json);
    let r = dev::bind(&dev, &mut b);
    drop(progress);
    r.map_err(|e| {
        if multi {
            bind_list_error(&dev, &cli.device, list, e, b.fw_ret)
        } else {
            compose_error("bind", pdfid, e, b.fw_ret)
        }
    })?;
    let ms = start.elapsed().as_millis() as u64;
    let name = c_name(&b.name);
    let blocks = name
        .as_deref()
        .and_then(|n| storage_block_devices(cli, pdfid, n, to.block_timeout));
    if cli.json {
        emit("bind", bind_json(&b, list, ms, blocks.as_deref()));
        return Ok(());
    }
    let together = if multi {
        " as one multi-function device"
    } else {
        ""
    };
    match name {
        Some(n) if multi => println!(
            "{what} bound to host {host} port {}{together} in {ms} ms: function 0 ({}) is {n} \
             ({:04x}:{:04x})",
            b.port,
            pdfid_str(pdfid),
            b.vendor,
            b.device
        ),
        Some(n) => println!(
            "{what} bound to host {host} port {}: {n} ({:04x}:{:04x}) in {ms} ms",
            b.port, b.vendor, b.device
        ),
        None => println!(
            "{what} bound to host {host} port {}{together} in {ms} ms",
            b.port
        ),
    }
    print_block_devices(blocks.as_deref());
    Ok(())
}

fn print_block_devices(blocks: Option<&[String]>) {
    for b in blocks.unwrap_or_default() {
        println!("block device: {b}");
    }
}

/// Interval of polling for a block device after a bind.
const BLOCK_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The block device nodes of function `pdfid`, bound here as PCI device `bdf`, if it is a
/// mass-storage function (PCI class 0x01xxxx); waits up to `secs` seconds for the first one
/// and warns on stderr if none appears. `None` when it is no storage function.
fn storage_block_devices(cli: &Cli, pdfid: u16, bdf: &str, secs: u32) -> Option<Vec<String>> {
    let roots = Roots::system();
    let dir = blockdev::pci_dir(&roots, bdf)?;
    let class = blockdev::pci_class(&dir)?;
    if !blockdev::is_storage(class) {
        return None;
    }
    let progress = (secs > 0)
        .then(|| Progress::start(format!("waiting for the block device of {bdf}"), cli.json));
    let r = blockdev::wait_disks(
        &roots,
        &dir,
        std::time::Duration::from_secs(u64::from(secs)),
        BLOCK_POLL,
    );
    drop(progress);
    match r {
        Appeared::Disks(d) => Some(
            d.iter()
                .map(|d| d.disk.node.display().to_string())
                .collect(),
        ),
        Appeared::TimedOut { sysfs_only } => {
            if secs > 0 {
                eprintln!(
                    "pcifab: warning: {}",
                    no_block_device_message(pdfid, bdf, class, secs, &dir, &sysfs_only)
                );
            }
            Some(Vec::new())
        }
    }
}

/// The warning when no block device of a storage function appeared in time.
fn no_block_device_message(
    pdfid: u16,
    bdf: &str,
    class: u32,
    secs: u32,
    dir: &std::path::Path,
    sysfs_only: &[blockdev::Disk],
) -> String {
    let driver = match blockdev::pci_driver(dir) {
        Some(d) => format!("driver {d} is bound to it"),
        None => format!(
            "no driver is bound to it (/sys/bus/pci/devices/{bdf}/driver is missing: \
             is the driver for class {class:#08x}, e.g. nvme, loaded?)"
        ),
    };
    let mut m = format!(
        "no block device of {} ({bdf}, class {class:#08x}) appeared within {secs} s; {driver}; \
         check the kernel log (dmesg) for its probe; --block-timeout SECS waits longer",
        pdfid_str(pdfid)
    );
    for d in sysfs_only {
        m.push_str(&format!(
            "; sysfs shows {} ({}:{}) but {} does not exist (is /dev a devtmpfs, or udev running?)",
            d.disk.name,
            d.disk.major,
            d.disk.minor,
            d.disk.node.display()
        ));
    }
    m
}

/// Before `verb` (unbind, move) takes `pdfid` away: if it is bound to this host, who uses the
/// block devices behind its logical port. Refuses (error `busy`) on a mount, swap or holder
/// unless `force`; warns on stderr about open files and, with `force`, about everything found.
/// Functions bound to other hosts are not checked here (their host's pcifab does that).
///
/// sysfs is looked at first: only when some function behind this host's logical ports has a
/// block device does it ask the driver (the inventory) which port `pdfid` is bound to.
fn check_in_use(cli: &Cli, dev: &File, verb: &str, pdfid: u16, force: bool) -> Result<(), Error> {
    let roots = Roots::system();
    let mep = match blockdev::char_device_pci_dir(&roots, std::path::Path::new(&cli.device)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!(
                "pcifab: warning: cannot check whether block devices of {} are in use: {e}",
                pdfid_str(pdfid)
            );
            return Ok(());
        }
    };
    let with_disks: Vec<(blockdev::PortFunction, Vec<blockdev::Disk>)> =
        blockdev::port_functions(&mep)
            .into_iter()
            .map(|f| {
                let d = blockdev::disks_under(&roots, &f.dir);
                (f, d)
            })
            .filter(|(_, d)| !d.is_empty())
            .collect();
    if with_disks.is_empty() {
        return Ok(());
    }
    let fab = inventory(dev, &cli.device)?;
    let Some(f) = fab.functions.iter().find(|f| f.pdfid == pdfid) else {
        return Ok(()); // the ioctl says it does not exist
    };
    if f.flags & pcifab_uapi::FN_BOUND == 0 || u16::from(f.bound_host) != fab.inv.partition {
        return Ok(());
    }
    let found: Vec<(String, Usage)> = with_disks
        .into_iter()
        .filter(|(pf, _)| pf.port == f.bound_port)
        .map(|(pf, disks)| (pf.bdf, blockdev::usage(&roots, &disks)))
        .collect();
    in_use_verdict(verb, pdfid, &found, force)
}

/// Decides on what [`check_in_use`] found: the busy error, or warnings on stderr.
fn in_use_verdict(
    verb: &str,
    pdfid: u16,
    found: &[(String, Usage)],
    force: bool,
) -> Result<(), Error> {
    let all = Usage {
        found: found.iter().flat_map(|(_, u)| u.found.clone()).collect(),
        uninspected: found.iter().map(|(_, u)| u.uninspected).max().unwrap_or(0),
    };
    let uses = || -> String {
        let mut parts: Vec<String> = found
            .iter()
            .flat_map(|(bdf, u)| {
                u.found
                    .iter()
                    .map(move |f| format!("{} ({bdf})", f.describe()))
            })
            .collect();
        if all.uninspected > 0 {
            parts.push(format!(
                "{} processes not inspected (their open files could not be read)",
                all.uninspected
            ));
        }
        parts.join("; ")
    };
    let bdfs: Vec<&str> = found.iter().map(|(b, _)| b.as_str()).collect();
    let what = format!("{} ({})", pdfid_str(pdfid), bdfs.join(", "));
    match blockdev::decide(&all, force) {
        Decision::Proceed => Ok(()),
        Decision::Warn => {
            let msg = if all.refuses() {
                format!("--force: {verb} of {what} although {}", uses())
            } else if all.found.is_empty() {
                format!("{what}: {}", uses())
            } else {
                format!(
                    "{what}: {}; their I/O fails once the device is gone",
                    uses()
                )
            };
            eprintln!("pcifab: warning: {msg}");
            Ok(())
        }
        Decision::Refuse => {
            let in_use: Vec<Value> = found
                .iter()
                .flat_map(|(bdf, u)| {
                    u.found.iter().map(move |f| {
                        json!({"bdf": bdf, "device": f.node.display().to_string(),
                               "use": f.what.kind(), "by": f.what.by()})
                    })
                })
                .collect();
            Err(out::busy(format!(
                "refusing to {verb} {what}: {}; unmount/stop them or pass --force",
                uses()
            ))
            .detail("pdfid", json!(pdfid_str(pdfid)))
            .detail("in_use", json!(in_use))
            .detail("not_inspected", json!(all.uninspected)))
        }
    }
}

fn unbind(cli: &Cli, pdfid: u16, force: bool) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    check_in_use(cli, &dev, "unbind", pdfid, force)?;
    let mut u = Unbind::new();
    u.pdfid = pdfid;
    u.timeout_ms = cli.timeout.unwrap_or(0);
    let start = std::time::Instant::now();
    let progress = Progress::start(format!("unbinding {}", pdfid_str(pdfid)), cli.json);
    let r = dev::unbind(&dev, &mut u);
    drop(progress);
    r.map_err(|e| compose_error("unbind", pdfid, e, u.fw_ret))?;
    let ms = start.elapsed().as_millis() as u64;
    if cli.json {
        emit(
            "unbind",
            json!({"pdfid": pdfid_str(pdfid), "from_host": u.host, "from_port": u.port, "elapsed_ms": ms}),
        );
    } else {
        println!(
            "{} unbound from host {} port {} in {ms} ms",
            pdfid_str(pdfid),
            u.host,
            u.port
        );
    }
    Ok(())
}

fn move_cmd(cli: &Cli, args: &MoveArgs) -> Result<(), Error> {
    let (pdfid, a, force) = (args.to.pdfid, &args.to.target, args.force);
    let host = a.host;
    if a.no_wait {
        return Err(usage_error(
            "--no-wait applies to `pcifab bind` only: a move always waits for the target host",
        ));
    }
    let dev = open(&cli.device)?;
    check_in_use(cli, &dev, "move", pdfid, force)?;
    let mut m = Move::new();
    (m.pdfid, m.host, m.port) = (pdfid, host, a.port.unwrap_or(pcifab_uapi::ANY_PORT));
    m.timeout_ms = cli.timeout.unwrap_or(0);
    let start = std::time::Instant::now();
    let progress = Progress::start(
        format!("moving {} to host {host}", pdfid_str(pdfid)),
        cli.json,
    );
    let r = dev::move_to(&dev, &mut m);
    drop(progress);
    r.map_err(|e| compose_error("move", pdfid, e, m.fw_ret))?;
    let ms = start.elapsed().as_millis() as u64;
    let name = c_name(&m.name);
    let blocks = name
        .as_deref()
        .and_then(|n| storage_block_devices(cli, pdfid, n, a.block_timeout));
    if cli.json {
        emit("move", move_json(&m, ms, blocks.as_deref()));
    } else {
        println!(
            "{} moved from host {} port {} to host {host} port {}{} in {ms} ms",
            pdfid_str(pdfid),
            m.from_host,
            m.from_port,
            m.port,
            name.map(|n| format!(" ({n})")).unwrap_or_default()
        );
        print_block_devices(blocks.as_deref());
    }
    Ok(())
}

/// Refuses a global option given on the command line to a command that does not take it.
fn check_scope(cli: &Cli, m: &clap::ArgMatches) -> Result<(), Error> {
    let takes = cli.command.takes();
    for (id, opt) in SCOPED_GLOBALS {
        let given = m.value_source(id) == Some(ValueSource::CommandLine);
        if given && !takes.contains(&id.replace('_', "-").as_str()) {
            return Err(usage_error(format!(
                "{opt} does not apply to `pcifab {}`",
                cli.command.name().replace('-', " ")
            )));
        }
    }
    Ok(())
}

fn run(cli: &Cli) -> Result<(), Error> {
    match &cli.command {
        Command::Info => info(cli),
        Command::List => list(cli),
        Command::Show { pdfid } => show(cli, *pdfid),
        Command::Bind(a) => bind(cli, a),
        Command::Unbind { pdfid, force } => unbind(cli, *pdfid, *force),
        Command::Move(a) => move_cmd(cli, a),
        Command::Watch => watch(cli),
        Command::Stats { telemetry: false } => stats(cli),
        Command::Stats { telemetry: true } => top::snapshot(cli),
        Command::Mrpc {
            cmd,
            input,
            out_len,
        } => mrpc(
            cli,
            *cmd,
            input.as_ref().map_or(&[][..], |h| &h.0[..]),
            *out_len,
        ),
        Command::P2p(p) => p2p::run(cli, p),
        Command::Top { interval, sort } => top::top(cli, *interval, *sort),
        Command::Request(_)
        | Command::Release { .. }
        | Command::Queue
        | Command::Leases
        | Command::Pools
        | Command::Hosts
        | Command::Events { .. }
        | Command::Compose { .. }
        | Command::HostDown { .. }
        | Command::Heartbeat { .. }
        | Command::Health { .. }
        | Command::ManagerTelemetry
        | Command::ManagerState
        | Command::ManagerLog { .. } => manager::run(cli),
    }
}

/// The command's name as far as a command line that did not parse shows it.
fn guess_command(args: &[String]) -> String {
    let words: Vec<&str> = args
        .iter()
        .skip(1)
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .collect();
    match words.first() {
        Some(&"p2p") => {
            let mut n = vec!["p2p"];
            n.extend(words.iter().skip(1).take(2).take_while(|w| {
                [
                    "route", "add", "del", "list", "copy", "receive", "distance", "grant",
                    "revoke", "grants",
                ]
                .contains(w)
            }));
            n.join("-")
        }
        Some(w) => (*w).to_string(),
        None => String::new(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().skip(1).any(|a| a == "--json");
    let matches = match Cli::command().try_get_matches_from(&args) {
        Ok(m) => m,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand
            ) && !json
            {
                let _ = e.print();
                return ExitCode::from(out::EXIT_USAGE);
            }
            if json {
                println!(
                    "{}",
                    usage_error(clap_message(&e)).json(&guess_command(&args))
                );
            }
            let _ = e.print();
            return ExitCode::from(out::EXIT_USAGE);
        }
    };
    let (name, r) = match Cli::from_arg_matches(&matches) {
        Ok(cli) => (
            cli.command.name().to_string(),
            check_scope(&cli, &matches).and_then(|()| run(&cli)),
        ),
        Err(e) => (guess_command(&args), Err(usage_error(e.to_string()))),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                println!("{}", e.json(&name));
            }
            if e.exit == out::EXIT_USAGE {
                eprintln!(
                    "pcifab: {e}\n(`pcifab {} --help` shows the usage)",
                    name.replace('-', " ")
                );
            } else {
                eprintln!("pcifab: {e}");
            }
            ExitCode::from(e.exit)
        }
    }
}

/// A clap error as one line: its message without "error: " and the usage after it.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let body = text.split("\n\nUsage:").next().unwrap_or(&text);
    body.trim_start_matches("error: ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
