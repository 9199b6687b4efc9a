// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab`: look at and compose a multi-host PCIe switch fabric through `/dev/pcifabN`.
//!
//! Exit codes: 0 success, 1 the operation failed, 2 the command line is wrong, 3 the fabric
//! refused it (conflict, policy, unknown function).

use std::{fmt, fs::File, process::ExitCode};

mod manager;
mod p2p;

use pcifab_uapi::{
    dev, fixed_str, Arg, Bind, Events, Function, Identity, Inventory, Move, Port, Stats, Unbind,
    Version,
};
use serde_json::json;

const USAGE: &str = "\
usage: pcifab [--device PATH] COMMAND [--json]

commands:
  info                  identity of the switch and of the driver's ABI
  list                  the fabric: ports, endpoint functions (PFs, VFs), who holds what
  show PDFID            one function in detail, with its telemetry
  bind PDFID --host H   bind a function to host H (a partition number)
      --port P          on its logical port P (default: the first free one)
      --no-wait         return when the fabric bound it, do not wait for H to see it
  unbind PDFID          take a function away from the host holding it
  move PDFID --host H   unbind it where it is and bind it to H (back where it was on failure)
  watch                 print events as they arrive
      --count N         stop after N event reports (default: run until interrupted)
  stats                 counters of the management endpoint (MRPC, interrupts)
  mrpc CMD [HEX]        run one firmware command: CMD is its id (e.g. 0x41), HEX its
                        input bytes; prints status, return value and output
      --out-len N       bytes of output to read (default 0, at most 1024)
      --timeout MS      how long to wait for the firmware (default 5000)

  p2p route add PDFID --size N
                        route N bytes of this host's P2P window to the function's
                        device memory
      --target-off N    from offset N of the device memory (default 0)
      --window-off N    at window offset N (default: the lowest free one; also 'any')
  p2p route del OFF     delete the route that starts at window offset OFF
  p2p route list        the routes of this host's P2P window
  p2p copy --from END --to END --len N
                        copy N bytes with the DMA engine; an END is PDFID:OFF (device
                        memory, through a route), file:PATH (host memory read from or
                        written to PATH) or iova:ADDR (a bus address; CAP_SYS_RAWIO)
      --timeout MS      bound on the whole copy (default 60000)
  p2p distance PDFID PDFID
                        how data would travel between two functions
  p2p grant PDFID --host N
                        let host N route to a function this host holds (the
                        fabric-manager host may grant any bound function)
  p2p revoke PDFID --host N
                        take that back; host N's routes to the function go too
  p2p grants            the grants on functions this host holds or was granted
                        (sizes and offsets: decimal, 0x hex, K/M/G suffixes: 16M, 0x1000, 4k)

  request, release, queue, leases, top, stats --telemetry
                        the fabric manager and telemetry (`pcifab request --help`)

options:
  --device PATH   character device to use (default /dev/pcifab0)
  --json          print one JSON object instead of a table
  -h, --help      this text
";

/// An error for the user: what went wrong and, where known, what to do.
struct Error {
    msg: String,
    usage: bool,
    /// Exit code for a failure that is not a usage error.
    code: u8,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

fn usage_error(msg: impl Into<String>) -> Error {
    Error {
        msg: msg.into(),
        usage: true,
        code: 2,
    }
}

fn failure(msg: impl Into<String>) -> Error {
    Error {
        msg: msg.into(),
        usage: false,
        code: 1,
    }
}

/// Parsed command line.
struct Cli {
    device: String,
    command: String,
    args: Vec<String>,
    json: bool,
    out_len: u32,
    timeout_ms: u32,
    count: u32,
    host: Option<u8>,
    port: Option<u8>,
    no_wait: bool,
    /// `p2p` options, each with the option's name for the messages.
    p2p: p2p::Opts,
}

/// Parses a number written in decimal or as 0x-prefixed hexadecimal.
fn number(what: &str, s: &str) -> Result<u32, Error> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    v.map_err(|_| usage_error(format!("{what} '{s}' is not a number (decimal or 0x...)")))
}

fn parse(args: &[String]) -> Result<Option<Cli>, Error> {
    let mut cli = Cli {
        device: "/dev/pcifab0".into(),
        command: String::new(),
        args: Vec::new(),
        json: false,
        out_len: 0,
        timeout_ms: 0,
        count: 0,
        host: None,
        port: None,
        no_wait: false,
        p2p: p2p::Opts::default(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--json" => cli.json = true,
            "--device" => {
                cli.device = it
                    .next()
                    .ok_or_else(|| usage_error("--device needs a path, e.g. /dev/pcifab0"))?
                    .clone()
            }
            "--no-wait" => cli.no_wait = true,
            "--host" | "--port" => {
                let v = it
                    .next()
                    .ok_or_else(|| usage_error(format!("{a} needs a number")))?;
                let n = u8::try_from(number(a, v)?)
                    .ok()
                    .filter(|n| *n < 0xff)
                    .ok_or_else(|| usage_error(format!("{a} '{v}' is out of range")))?;
                if a == "--host" {
                    cli.host = Some(n);
                } else {
                    cli.port = Some(n);
                }
            }
            "--out-len" | "--timeout" | "--count" => {
                let v = it
                    .next()
                    .ok_or_else(|| usage_error(format!("{a} needs a number")))?;
                let n = number(a, v)?;
                match a.as_str() {
                    "--out-len" => cli.out_len = n,
                    "--timeout" => cli.timeout_ms = n,
                    _ => cli.count = n,
                }
            }
            s if p2p::OPTIONS.contains(&s) => {
                let v = it
                    .next()
                    .ok_or_else(|| usage_error(format!("{a} needs a value")))?;
                cli.p2p.set(s, v)?;
            }
            s if s.starts_with('-') => return Err(usage_error(format!("unknown option '{s}'"))),
            s if cli.command.is_empty() => cli.command = s.to_string(),
            s => cli.args.push(s.to_string()),
        }
    }
    if cli.command.is_empty() {
        return Err(usage_error("no command given"));
    }
    let max_args = match cli.command.as_str() {
        "p2p" => 3,
        "mrpc" => 2,
        "show" | "bind" | "unbind" | "move" => 1,
        _ => 0,
    };
    if let Some(extra) = cli.args.get(max_args) {
        return Err(usage_error(format!("unexpected argument '{extra}'")));
    }
    Ok(Some(cli))
}

/// Opens the character device, explaining the usual reasons it is not there.
fn open(path: &str) -> Result<File, Error> {
    File::open(path).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound => {
                "; is the pcifab module loaded and bound (lsmod, /sys/bus/pci/drivers/pcifab)?"
            }
            std::io::ErrorKind::PermissionDenied => "; run as root or as a member of its group",
            _ => "",
        };
        failure(format!("cannot open {path}: {e}{hint}"))
    })
}

/// Issues a size-first ioctl and returns the filled struct.
fn ioctl<T: Arg>(dev: &File, path: &str, name: &str, cmd: u32) -> Result<T, Error> {
    let mut arg = T::new();
    // SAFETY: the argument structs this is used with hold no user pointers.
    unsafe { dev::ioctl(dev, cmd, &mut arg) }
        .map_err(|e| failure(format!("{name} on {path} failed: {e}")))?;
    Ok(arg)
}

fn info(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let v: Version = ioctl(
        &dev,
        &cli.device,
        "PCIFAB_IOCTL_VERSION",
        pcifab_uapi::PCIFAB_IOCTL_VERSION,
    )?;
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
    let id: Identity = ioctl(
        &dev,
        &cli.device,
        "PCIFAB_IOCTL_IDENTITY",
        pcifab_uapi::PCIFAB_IOCTL_IDENTITY,
    )?;
    let (vendor, product, rev) = (
        fixed_str(&id.vendor_id),
        fixed_str(&id.product_id),
        fixed_str(&id.product_revision),
    );
    if cli.json {
        let o = json!({
            "uapi_version": format!("{}.{}", v.major, v.minor),
            "device": cli.device,
            "pci_vendor": format!("{:#06x}", id.pci_vendor),
            "pci_device": format!("{:#06x}", id.pci_device),
            "device_id": format!("{:#06x}", id.device_id),
            "device_version": format!("{:#x}", id.device_version),
            "fw_version": format!("{:#010x}", id.fw_version),
            "partition": id.partition,
            "partition_count": id.partition_count,
            "vendor_id": vendor,
            "product_id": product,
            "product_revision": rev,
        });
        println!("{o}");
    } else {
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
        println!("uAPI:             {}.{}", v.major, v.minor);
    }
    Ok(())
}

fn stats(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let s: Stats = ioctl(
        &dev,
        &cli.device,
        "PCIFAB_IOCTL_STATS",
        pcifab_uapi::PCIFAB_IOCTL_STATS,
    )?;
    if cli.json {
        let o = json!({
            "mrpc_commands": s.mrpc_commands,
            "mrpc_completions": s.mrpc_completions,
            "mrpc_timeouts": s.mrpc_timeouts,
            "mrpc_firmware_dead": s.mrpc_firmware_dead,
            "event_irqs": s.event_irqs,
        });
        println!("{o}");
    } else {
        println!("mrpc commands:       {}", s.mrpc_commands);
        println!("mrpc completions:    {}", s.mrpc_completions);
        println!("mrpc timeouts:       {}", s.mrpc_timeouts);
        println!("mrpc firmware dead:  {}", s.mrpc_firmware_dead);
        println!("event interrupts:    {}", s.event_irqs);
    }
    Ok(())
}

/// Parses hex bytes ("0a0b0c", spaces and colons allowed).
fn hex_bytes(s: &str) -> Result<Vec<u8>, Error> {
    let digits: Vec<u8> = s.bytes().filter(|b| !matches!(b, b' ' | b':')).collect();
    if digits.len() % 2 != 0 {
        return Err(usage_error(format!(
            "input '{s}' has an odd number of hex digits"
        )));
    }
    digits
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| usage_error(format!("input '{s}' is not hex bytes")))
        })
        .collect()
}

fn mrpc(cli: &Cli) -> Result<(), Error> {
    let cmd = number(
        "command id",
        cli.args
            .first()
            .ok_or_else(|| usage_error("mrpc needs a command id"))?,
    )?;
    let input = match cli.args.get(1) {
        Some(h) => hex_bytes(h)?,
        None => Vec::new(),
    };
    if input.len() > pcifab_uapi::MRPC_MAX_DATA || cli.out_len as usize > pcifab_uapi::MRPC_MAX_DATA
    {
        return Err(usage_error(format!(
            "input and output are at most {} bytes",
            pcifab_uapi::MRPC_MAX_DATA
        )));
    }
    let mut output = vec![0u8; cli.out_len as usize];
    let dev = open(&cli.device)?;
    let (status, ret) = dev::mrpc(&dev, cmd, &input, &mut output, cli.timeout_ms).map_err(|e| {
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
    })?;
    let hex: String = output.iter().map(|b| format!("{b:02x}")).collect();
    if cli.json {
        println!(
            "{}",
            json!({"cmd": format!("{cmd:#x}"), "status": status, "ret_value": format!("{ret:#x}"), "output": hex})
        );
    } else {
        println!("status {status:#x} return {ret:#x}");
        if !hex.is_empty() {
            println!("{hex}");
        }
    }
    if status == pcifab_uapi::MRPC_STATUS_DONE {
        Ok(())
    } else {
        Err(failure(format!(
            "the firmware failed command {cmd:#x}: return value {ret:#x}"
        )))
    }
}

/// The fabric as the driver sees it.
struct Fabric {
    inv: Inventory,
    ports: Vec<Port>,
    functions: Vec<Function>,
}

fn inventory(dev: &File, path: &str) -> Result<Fabric, Error> {
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

fn port_json(p: &Port) -> serde_json::Value {
    json!({
        "port": p.phys_port,
        "type": port_type(p.kind),
        "link_up": p.link_up != 0,
        "width": p.width,
        "rate": p.rate,
    })
}

fn pdfid_str(id: u16) -> String {
    format!("{id:#06x}")
}

fn function_json(f: &Function) -> serde_json::Value {
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
        "host": if bound { json!(f.bound_host) } else { serde_json::Value::Null },
        "host_port": if bound { json!(f.bound_port) } else { serde_json::Value::Null },
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
        let o = json!({
            "generation": fab.inv.generation,
            "partition": fab.inv.partition,
            "host_count": fab.inv.host_count,
            "ports": fab.ports.iter().map(port_json).collect::<Vec<_>>(),
            "functions": fab.functions.iter().map(function_json).collect::<Vec<_>>(),
        });
        println!("{o}");
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

/// pcifab's FUNCTION_TELEMETRY firmware extension (Documentation/mrpc.rst).
const EXT_FUNCTION_TELEMETRY: u32 = 0xf002;

fn show(cli: &Cli) -> Result<(), Error> {
    let arg = cli
        .args
        .first()
        .ok_or_else(|| usage_error("show needs a PDFID, e.g. 0x0300"))?;
    let pdfid = u16::try_from(number("PDFID", arg)?)
        .map_err(|_| usage_error(format!("PDFID '{arg}' is larger than 0xffff")))?;
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
    let mut input = [0u8; 8];
    input[..2].copy_from_slice(&1u16.to_le_bytes());
    input[2..4].copy_from_slice(&8u16.to_le_bytes());
    input[4..6].copy_from_slice(&pdfid.to_le_bytes());
    let mut out = [0u8; 24];
    let done = dev::mrpc(&dev, EXT_FUNCTION_TELEMETRY, &input, &mut out, 0)
        .is_ok_and(|(status, _)| status == pcifab_uapi::MRPC_STATUS_DONE);
    let telemetry = if done {
        let temp = i32::from_le_bytes([out[8], out[9], out[10], out[11]]);
        let power = u32::from_le_bytes([out[12], out[13], out[14], out[15]]);
        let health = u32::from_le_bytes([out[20], out[21], out[22], out[23]]);
        Some((temp, power, out[16], health))
    } else {
        None
    };
    if cli.json {
        let mut o = function_json(f);
        if let Some((temp, power, util, health)) = telemetry {
            o["telemetry"] = json!({
                "temperature_centi": temp,
                "power_mw": power,
                "utilisation": util,
                "health": health,
            });
        }
        println!("{o}");
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
        Some((temp, power, util, health)) => {
            println!("temperature:  {}.{:02} C", temp / 100, (temp % 100).abs());
            println!("power:        {power} mW");
            println!("utilisation:  {util} %");
            println!(
                "health:       {}",
                if health == 0 {
                    "ok".to_string()
                } else {
                    format!("{health:#x}")
                }
            );
        }
        None => println!("telemetry:    not available"),
    }
    Ok(())
}

fn watch(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let mut ev = Events::new();
    let first: Events = ioctl(
        &dev,
        &cli.device,
        "PCIFAB_IOCTL_EVENTS",
        pcifab_uapi::PCIFAB_IOCTL_EVENTS,
    )?;
    let mut seen = first.total;
    if !cli.json {
        eprintln!(
            "watching {} (events so far: {seen}); Ctrl-C stops",
            cli.device
        );
    }
    let mut reports = 0;
    while cli.count == 0 || reports < cli.count {
        ev.flags = pcifab_uapi::EVENTS_WAIT;
        ev.seen = seen;
        ev.timeout_ms = cli.timeout_ms;
        // SAFETY: `pcifab_events` holds no user pointers.
        if let Err(e) = unsafe { dev::ioctl(&dev, pcifab_uapi::PCIFAB_IOCTL_EVENTS, &mut ev) } {
            return Err(failure(format!(
                "waiting for events on {} failed: {e}",
                cli.device
            )));
        }
        if ev.total == seen {
            // Timed out with nothing new.
            if cli.timeout_ms != 0 {
                return Err(failure(format!("no event within {} ms", cli.timeout_ms)));
            }
            continue;
        }
        let new = ev.total - seen;
        seen = ev.total;
        reports += 1;
        if cli.json {
            println!(
                "{}",
                json!({"new": new, "total": ev.total, "link": ev.link, "gfms": ev.gfms})
            );
        } else {
            println!(
                "{new} new event(s): total {} (link {}, fabric {})",
                ev.total, ev.link, ev.gfms
            );
        }
    }
    Ok(())
}

/// Exit code of an operation the fabric refused (conflict, policy, unknown function).
const EXIT_REFUSED: u8 = 3;

/// Names the firmware's return codes of binding (Documentation/mrpc.rst).
fn fw_reason(ret: u32) -> Option<&'static str> {
    Some(match ret {
        0 => return None,
        0x4 => "no such host port",
        0x64006 => "invalid parameter",
        0xf0_0001 => "no function with this PDFID",
        0xf0_0003 => "the function is bound or being bound elsewhere",
        0xf0_0004 => "that logical port already holds a function",
        0xf0_0005 => "the fabric's policy does not allow it",
        0xf0_0006 => "the host holds as many functions as it may",
        0xf0_0007 => "a PF moves only while its VFs are free, a VF only while its PF is free",
        0xf0_0008 => "the hot-plug of the target host failed",
        0xf0_0009 => "the owner did not release the function in time",
        0xf0_000a => "the function is not bound there",
        _ => "firmware error",
    })
}

/// Prints elapsed seconds on stderr while a long operation runs, unless `quiet`.
struct Progress {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(what: String, quiet: bool) -> Self {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = (!quiet).then(|| {
            let done = done.clone();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                let mut shown = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    let secs = start.elapsed().as_secs();
                    if secs > shown {
                        shown = secs;
                        eprintln!("{what}: {secs} s...");
                    }
                }
            })
        });
        Self { done, thread }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Parses a function id (PDFID): a number up to 0xffff, decimal or 0x hex.
fn pdfid(arg: &str) -> Result<u16, Error> {
    u16::try_from(number("PDFID", arg)?)
        .map_err(|_| usage_error(format!("PDFID '{arg}' is larger than 0xffff")))
}

fn pdfid_arg(cli: &Cli) -> Result<u16, Error> {
    let arg = cli
        .args
        .first()
        .ok_or_else(|| usage_error(format!("{} needs a PDFID, e.g. 0x0300", cli.command)))?;
    pdfid(arg)
}

/// The error of a failed bind, unbind or move, with the firmware's reason.
fn compose_error(cli: &Cli, pdfid: u16, e: std::io::Error, fw_ret: u32) -> Error {
    let mut msg = format!("{} {} failed: {e}", cli.command, pdfid_str(pdfid));
    if let Some(r) = fw_reason(fw_ret) {
        msg.push_str(&format!(" ({r}; firmware code {fw_ret:#x})"));
    }
    if e.raw_os_error() == Some(libc::EPERM) {
        msg.push_str("; composing the fabric needs CAP_SYS_ADMIN");
    }
    let refused = matches!(
        e.raw_os_error(),
        Some(libc::EBUSY | libc::EACCES | libc::ENOSPC | libc::ENOENT)
    );
    if cli.json {
        println!(
            "{}",
            json!({"ok": false, "command": cli.command, "pdfid": pdfid_str(pdfid), "error": e.to_string(), "fw_ret": format!("{fw_ret:#x}")})
        );
    }
    Error {
        msg,
        usage: false,
        code: if refused { EXIT_REFUSED } else { 1 },
    }
}

/// A NUL-padded name as text.
fn c_name(raw: &[u8]) -> Option<String> {
    let s = fixed_str(raw);
    (!s.is_empty()).then_some(s)
}

fn bind(cli: &Cli) -> Result<(), Error> {
    let pdfid = pdfid_arg(cli)?;
    let host = cli.host.ok_or_else(|| usage_error("bind needs --host H"))?;
    let dev = open(&cli.device)?;
    let mut b = Bind::new();
    (b.pdfid, b.host, b.port) = (pdfid, host, cli.port.unwrap_or(pcifab_uapi::ANY_PORT));
    b.timeout_ms = cli.timeout_ms;
    if cli.no_wait {
        b.flags = pcifab_uapi::BIND_NO_WAIT;
    }
    let start = std::time::Instant::now();
    let progress = Progress::start(
        format!("binding {} to host {host}", pdfid_str(pdfid)),
        cli.json,
    );
    // SAFETY: `pcifab_bind` holds no user pointers.
    let r = unsafe { dev::ioctl(&dev, pcifab_uapi::PCIFAB_IOCTL_BIND, &mut b) };
    drop(progress);
    r.map_err(|e| compose_error(cli, pdfid, e, b.fw_ret))?;
    let ms = start.elapsed().as_millis();
    let name = c_name(&b.name);
    if cli.json {
        println!(
            "{}",
            json!({"ok": true, "pdfid": pdfid_str(pdfid), "host": host, "port": b.port, "device": name, "vendor": format!("{:#06x}", b.vendor), "device_id": format!("{:#06x}", b.device), "elapsed_ms": ms})
        );
    } else {
        match name {
            Some(n) => println!(
                "{} bound to host {host} port {}: {n} ({:04x}:{:04x}) in {ms} ms",
                pdfid_str(pdfid),
                b.port,
                b.vendor,
                b.device
            ),
            None => println!(
                "{} bound to host {host} port {} in {ms} ms",
                pdfid_str(pdfid),
                b.port
            ),
        }
    }
    Ok(())
}

fn unbind(cli: &Cli) -> Result<(), Error> {
    let pdfid = pdfid_arg(cli)?;
    let dev = open(&cli.device)?;
    let mut u = Unbind::new();
    u.pdfid = pdfid;
    u.timeout_ms = cli.timeout_ms;
    let start = std::time::Instant::now();
    let progress = Progress::start(format!("unbinding {}", pdfid_str(pdfid)), cli.json);
    // SAFETY: `pcifab_unbind` holds no user pointers.
    let r = unsafe { dev::ioctl(&dev, pcifab_uapi::PCIFAB_IOCTL_UNBIND, &mut u) };
    drop(progress);
    r.map_err(|e| compose_error(cli, pdfid, e, u.fw_ret))?;
    let ms = start.elapsed().as_millis();
    if cli.json {
        println!(
            "{}",
            json!({"ok": true, "pdfid": pdfid_str(pdfid), "from_host": u.host, "from_port": u.port, "elapsed_ms": ms})
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

fn move_cmd(cli: &Cli) -> Result<(), Error> {
    let pdfid = pdfid_arg(cli)?;
    let host = cli.host.ok_or_else(|| usage_error("move needs --host H"))?;
    let dev = open(&cli.device)?;
    let mut m = Move::new();
    (m.pdfid, m.host, m.port) = (pdfid, host, cli.port.unwrap_or(pcifab_uapi::ANY_PORT));
    m.timeout_ms = cli.timeout_ms;
    let start = std::time::Instant::now();
    let progress = Progress::start(
        format!("moving {} to host {host}", pdfid_str(pdfid)),
        cli.json,
    );
    // SAFETY: `pcifab_move` holds no user pointers.
    let r = unsafe { dev::ioctl(&dev, pcifab_uapi::PCIFAB_IOCTL_MOVE, &mut m) };
    drop(progress);
    r.map_err(|e| compose_error(cli, pdfid, e, m.fw_ret))?;
    let ms = start.elapsed().as_millis();
    let name = c_name(&m.name);
    if cli.json {
        println!(
            "{}",
            json!({"ok": true, "pdfid": pdfid_str(pdfid), "from_host": m.from_host, "from_port": m.from_port, "host": host, "port": m.port, "device": name, "elapsed_ms": ms})
        );
    } else {
        println!(
            "{} moved from host {} port {} to host {host} port {}{} in {ms} ms",
            pdfid_str(pdfid),
            m.from_host,
            m.from_port,
            m.port,
            name.map(|n| format!(" ({n})")).unwrap_or_default()
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = manager::dispatch(&args) {
        return code;
    }
    let result = parse(&args).and_then(|cli| match cli {
        None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(cli) => match cli.command.as_str() {
            "info" => info(&cli),
            "stats" => stats(&cli),
            "mrpc" => mrpc(&cli),
            "list" => list(&cli),
            "show" => show(&cli),
            "watch" => watch(&cli),
            "bind" => bind(&cli),
            "unbind" => unbind(&cli),
            "move" => move_cmd(&cli),
            "p2p" => p2p::run(&cli),
            other => Err(usage_error(format!("unknown command '{other}'"))),
        },
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.usage => {
            eprintln!("pcifab: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("pcifab: {e}");
            ExitCode::from(e.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_device_and_json() {
        let cli = parse(&args("--device /dev/pcifab1 info --json"))
            .ok()
            .flatten()
            .expect("parse");
        assert_eq!(cli.device, "/dev/pcifab1");
        assert_eq!(cli.command, "info");
        assert!(cli.json);
    }

    #[test]
    fn rejects_bad_command_lines() {
        for bad in [
            "",
            "--bogus info",
            "info extra",
            "--device",
            "mrpc 1 2 3",
            "mrpc --timeout x",
        ] {
            let e = parse(&args(bad)).err().expect(bad);
            assert!(e.usage, "{bad}: {e}");
        }
    }

    #[test]
    fn parses_hex_and_numbers() {
        assert_eq!(hex_bytes("0a:0b 0c").ok(), Some(vec![10, 11, 12]));
        assert!(hex_bytes("abc").is_err());
        assert!(hex_bytes("zz").is_err());
        assert_eq!(number("n", "0x41").ok(), Some(0x41));
        assert_eq!(number("n", "65").ok(), Some(65));
    }

    #[test]
    fn parses_p2p_command_lines() {
        let cli = parse(&args(
            "p2p route add 0x0300 --size 16M --target-off 4k --window-off 0x1000000",
        ))
        .ok()
        .flatten()
        .expect("parse");
        assert_eq!(cli.command, "p2p");
        assert_eq!(cli.args, ["route", "add", "0x0300"]);
        let cli = parse(&args(
            "--json p2p copy --from file:/tmp/in --to 0x0300:0 --len 1M --timeout 500",
        ))
        .ok()
        .flatten()
        .expect("parse");
        assert!(cli.json);
        assert_eq!(cli.timeout_ms, 500);
        for bad in [
            "p2p route add 0x300 --size",
            "p2p route add 0x300 --size 16Q",
            "p2p copy --from nowhere --to 0x300:0 --len 1",
            "p2p copy --from 0x300:0 --to file: --len 1",
            "p2p route add 0x300 extra",
        ] {
            let e = parse(&args(bad)).err().expect(bad);
            assert!(e.usage, "{bad}: {e}");
        }
        assert_eq!(pdfid("0x0300").ok(), Some(0x300));
        assert!(pdfid("0x10000").is_err());
    }

    #[test]
    fn help_is_not_an_error() {
        assert!(matches!(parse(&args("--help")), Ok(None)));
    }
}
