// SPDX-License-Identifier: GPL-2.0-only

//! The fabric manager's client commands (`request`, `release`, `queue`, `leases`: through
//! pcifab-manager's control socket) and the telemetry views (`top`, `stats --telemetry`: from
//! the driver directly). Documentation/manager.rst describes them.

use std::{
    io::{BufRead, BufReader, IsTerminal, Write},
    os::unix::net::UnixStream,
    process::ExitCode,
};

use serde_json::{json, Value};

use super::{failure, inventory, number, open, pdfid_str, usage_error, Error};

pub const USAGE: &str = "\
fabric manager (pcifab-manager, Documentation/manager.rst):
  request               ask the manager for devices for host H
      --gpus N | --vfs N      N whole GPUs, or N VFs
      --profile P             VFs of devices of profile P
      --host H --priority P   for host H, priority P (0 lowest)
      --duration S            lease length in seconds (default: the manager's)
      --preemptible-by-higher the lease may be pre-empted by higher priorities
      --pool NAME             only from this pool
  release LEASE         end a lease or cancel a queued request
  queue                 the queued requests, in the order they will be served
  leases                the leases
  top                   telemetry of every function, refreshed every second
      --count N         stop after N refreshes (default: until interrupted)
  stats --telemetry     one telemetry snapshot (with --json: for scripts)
  --manager-socket PATH the manager's socket (default /run/pcifab-manager.sock)
";

const COMMANDS: [&str; 5] = ["request", "release", "queue", "leases", "top"];

struct Opts {
    command: String,
    args: Vec<String>,
    json: bool,
    device: String,
    socket: String,
    gpus: Option<u32>,
    vfs: Option<u32>,
    profile: Option<String>,
    pool: Option<String>,
    host: Option<u32>,
    priority: Option<u32>,
    duration: Option<u32>,
    preemptible: bool,
    count: u32,
}

/// Runs a manager command if `args` name one; None leaves the command line to `main`.
pub fn dispatch(args: &[String]) -> Option<ExitCode> {
    let mut command = None;
    let mut it = args.iter();
    let mut telemetry = false;
    while let Some(a) = it.next() {
        match a.as_str() {
            "--device" | "--manager-socket" => {
                it.next();
            }
            "--telemetry" => telemetry = true,
            s if s.starts_with('-') => {}
            s if command.is_none() => command = Some(s.to_string()),
            _ => {}
        }
    }
    let command = command?;
    let ours = COMMANDS.contains(&command.as_str()) || (command == "stats" && telemetry);
    if !ours {
        return None;
    }
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return Some(ExitCode::SUCCESS);
    }
    let r = parse(args).and_then(|o| match o.command.as_str() {
        "request" => request(&o),
        "release" => release(&o),
        "queue" => queue(&o),
        "leases" => leases(&o),
        _ => top(&o),
    });
    Some(match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.usage => {
            eprintln!("pcifab: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("pcifab: {e}");
            ExitCode::from(e.code)
        }
    })
}

fn parse(args: &[String]) -> Result<Opts, Error> {
    let mut o = Opts {
        command: String::new(),
        args: Vec::new(),
        json: false,
        device: "/dev/pcifab0".into(),
        socket: "/run/pcifab-manager.sock".into(),
        gpus: None,
        vfs: None,
        profile: None,
        pool: None,
        host: None,
        priority: None,
        duration: None,
        preemptible: false,
        count: 0,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| usage_error(format!("{a} needs a value")))
        };
        match a.as_str() {
            "--json" => o.json = true,
            "--telemetry" => {}
            "--preemptible-by-higher" => o.preemptible = true,
            "--device" => o.device = value()?,
            "--manager-socket" => o.socket = value()?,
            "--profile" => o.profile = Some(value()?),
            "--pool" => o.pool = Some(value()?),
            "--gpus" | "--vfs" | "--host" | "--priority" | "--duration" | "--count" => {
                let v = value()?;
                let n = number(a, &v)?;
                match a.as_str() {
                    "--gpus" => o.gpus = Some(n),
                    "--vfs" => o.vfs = Some(n),
                    "--host" => o.host = Some(n),
                    "--priority" => o.priority = Some(n),
                    "--duration" => o.duration = Some(n),
                    _ => o.count = n,
                }
            }
            s if s.starts_with('-') => return Err(usage_error(format!("unknown option '{s}'"))),
            s if o.command.is_empty() => o.command = s.to_string(),
            s => o.args.push(s.to_string()),
        }
    }
    let max_args = usize::from(o.command == "release");
    if let Some(extra) = o.args.get(max_args) {
        return Err(usage_error(format!("unexpected argument '{extra}'")));
    }
    Ok(o)
}

/// One request to the manager, one reply.
/// One request through the manager's spool directory `SOCKET.d`, which it serves instead of
/// the socket on a kernel without UNIX sockets (Documentation/manager.rst, "Control socket").
fn ask_spool(dir: &str, req: &Value) -> Result<String, String> {
    let dir = std::path::Path::new(dir);
    let alive = || {
        std::fs::read_to_string(dir.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            // SAFETY: signal 0 only checks that the process exists.
            .is_some_and(|p| p > 0 && unsafe { libc::kill(p, 0) } == 0)
    };
    if !alive() {
        return Err(format!("no manager is running for {}", dir.display()));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = format!("{nanos:024}-{}-0", std::process::id());
    let (tmp, path, reply) = (
        dir.join(format!("{name}.tmp")),
        dir.join(format!("{name}.req")),
        dir.join(format!("{name}.reply")),
    );
    std::fs::write(&tmp, format!("{req}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot write a request into {}: {e}", dir.display()))?;
    loop {
        if let Ok(text) = std::fs::read_to_string(&reply) {
            let _ = std::fs::remove_file(&reply);
            return Ok(text);
        }
        if !alive() {
            let _ = std::fs::remove_file(&path);
            return Err(format!(
                "the manager for {} stopped before it answered",
                dir.display()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn ask(o: &Opts, req: Value) -> Result<Value, Error> {
    let hint = "; is pcifab-manager running (--manager-socket PATH names another socket)?";
    let line = match UnixStream::connect(&o.socket) {
        Ok(mut s) => {
            writeln!(s, "{req}")
                .map_err(|e| failure(format!("cannot send to the manager at {}: {e}", o.socket)))?;
            let mut line = String::new();
            BufReader::new(s)
                .read_line(&mut line)
                .map_err(|e| failure(format!("no reply from the manager at {}: {e}", o.socket)))?;
            line
        }
        // No UNIX sockets in this kernel: the manager serves SOCKET.d instead.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EAFNOSUPPORT)) => {
            ask_spool(&format!("{}.d", o.socket), &req).map_err(|e| {
                failure(format!(
                    "cannot reach the manager at {}.d: {e}{hint}",
                    o.socket
                ))
            })?
        }
        Err(e) => {
            return Err(failure(format!(
                "cannot reach the manager at {}: {e}{hint}",
                o.socket
            )))
        }
    };
    let v: Value = serde_json::from_str(&line).map_err(|e| {
        failure(format!(
            "the manager at {} answered something that is not JSON ({e}): {line:?}",
            o.socket
        ))
    })?;
    if v.get("ok").and_then(Value::as_bool) == Some(true) {
        return Ok(v);
    }
    if o.json {
        println!("{v}");
    }
    let msg = v
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("the manager failed the request without saying why");
    let refused = v.get("refused").and_then(Value::as_bool) == Some(true);
    Err(Error {
        msg: format!("the manager refused it: {msg}"),
        usage: false,
        code: if refused { super::EXIT_REFUSED } else { 1 },
    })
}

fn request(o: &Opts) -> Result<(), Error> {
    let want = match (o.gpus, o.vfs) {
        (Some(n), None) => {
            if o.profile.is_some() {
                return Err(usage_error("--profile goes with --vfs"));
            }
            json!({"kind": "gpus", "count": n})
        }
        (None, Some(n)) => json!({"kind": "vfs", "count": n, "profile": o.profile}),
        _ => return Err(usage_error("request needs one of --gpus N or --vfs N")),
    };
    let host = o
        .host
        .ok_or_else(|| usage_error("request needs --host H"))?;
    let priority = o
        .priority
        .ok_or_else(|| usage_error("request needs --priority P"))?;
    let v = ask(
        o,
        json!({"op": "request", "spec": {
            "host": host, "want": want, "priority": priority, "duration_s": o.duration,
            "preemptible_by_higher": o.preemptible, "pool": o.pool,
        }}),
    )?;
    if o.json {
        println!("{v}");
        return Ok(());
    }
    let id = &v["id"];
    if v["granted"] == json!(true) {
        let l = &v["lease"];
        let fns: Vec<&str> = l["functions"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        println!(
            "lease {id}: {} for host {host} from pool {} for {} s{}",
            fns.join(" "),
            l["pool"].as_str().unwrap_or("?"),
            l["remaining_s"],
            if l["time_sliced"] == json!(true) {
                " (time-sliced)"
            } else {
                ""
            }
        );
    } else {
        println!(
            "request {id} queued at position {}; `pcifab queue` shows the queue",
            v["position"]
        );
    }
    Ok(())
}

fn release(o: &Opts) -> Result<(), Error> {
    let arg = o
        .args
        .first()
        .ok_or_else(|| usage_error("release needs a lease or request id"))?;
    let id = number("lease", arg)?;
    let v = ask(o, json!({"op": "release", "id": id}))?;
    if o.json {
        println!("{v}");
    } else {
        println!("{id} released");
    }
    Ok(())
}

/// A JSON value as table text (strings without quotes), so widths apply.
fn txt(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), String::from)
}

fn rows<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn queue(o: &Opts) -> Result<(), Error> {
    let v = ask(o, json!({"op": "queue"}))?;
    if o.json {
        println!("{v}");
        return Ok(());
    }
    println!("POS  ID     HOST  WANT             PRIO  EFFECTIVE  WAITED");
    for q in rows(&v, "queue") {
        println!(
            "{:<4} {:<6} {:<5} {:<16} {:<5} {:<10} {} s{}",
            txt(&q["position"]),
            txt(&q["id"]),
            txt(&q["host"]),
            q["want"].as_str().unwrap_or("?"),
            txt(&q["priority"]),
            txt(&q["effective_priority"]),
            q["waited_s"],
            if q["promoted"] == json!(true) {
                " (promoted)"
            } else {
                ""
            }
        );
    }
    Ok(())
}

fn leases(o: &Opts) -> Result<(), Error> {
    let v = ask(o, json!({"op": "leases"}))?;
    if o.json {
        println!("{v}");
        return Ok(());
    }
    println!("LEASE  HOST  WANT             PRIO  POOL        LEFT      FUNCTIONS");
    for l in rows(&v, "leases") {
        let fns: Vec<String> = rows(l, "functions")
            .iter()
            .zip(rows(l, "resident"))
            .map(|(f, r)| {
                let f = f.as_str().unwrap_or("?");
                if *r == json!(true) {
                    f.to_string()
                } else {
                    format!("{f}(waiting for its slice)")
                }
            })
            .collect();
        println!(
            "{:<6} {:<5} {:<16} {:<5} {:<11} {:<9} {}",
            txt(&l["id"]),
            txt(&l["host"]),
            l["want"].as_str().unwrap_or("?"),
            txt(&l["priority"]),
            l["pool"].as_str().unwrap_or("?"),
            format!("{} s", l["remaining_s"]),
            fns.join(" ")
        );
    }
    Ok(())
}

/// pcifab's FUNCTION_TELEMETRY reply as JSON, or why there is none.
fn telemetry_of(dev: &std::fs::File, pdfid: u16) -> Result<Value, String> {
    let mut input = [0u8; 8];
    input[..2].copy_from_slice(&1u16.to_le_bytes());
    input[2..4].copy_from_slice(&8u16.to_le_bytes());
    input[4..6].copy_from_slice(&pdfid.to_le_bytes());
    let mut out = [0u8; 24];
    let (status, ret) =
        pcifab_uapi::dev::mrpc(dev, super::EXT_FUNCTION_TELEMETRY, &input, &mut out, 0)
            .map_err(|e| e.to_string())?;
    if status != pcifab_uapi::MRPC_STATUS_DONE {
        return Err(format!("firmware error {ret:#x}"));
    }
    let u32_at = |o: usize| u32::from_le_bytes([out[o], out[o + 1], out[o + 2], out[o + 3]]);
    if u16::from_le_bytes([out[0], out[1]]) != 1 || u16::from_le_bytes([out[4], out[5]]) != pdfid {
        return Err("unexpected reply (version or pdfid)".into());
    }
    Ok(json!({
        "temperature_centi": u32_at(8) as i32,
        "power_mw": u32_at(12),
        "utilisation": out[16],
        "health": u32_at(20),
    }))
}

fn health_text(h: u64) -> String {
    if h == 0 {
        return "ok".into();
    }
    let mut v = Vec::new();
    for (bit, name) in [(1, "link-down"), (2, "thermal"), (4, "power")] {
        if h & bit != 0 {
            v.push(name);
        }
    }
    if v.is_empty() {
        format!("{h:#x}")
    } else {
        v.join(",")
    }
}

/// `top` and `stats --telemetry`: every function of the inventory with its telemetry.
fn top(o: &Opts) -> Result<(), Error> {
    let once = o.command == "stats";
    let dev = open(&o.device)?;
    let tty = std::io::stdout().is_terminal() && !o.json && !once;
    let mut n = 0;
    loop {
        let fab = inventory(&dev, &o.device)?;
        let mut out = Vec::new();
        for f in &fab.functions {
            let mut j = json!({
                "pdfid": pdfid_str(f.pdfid),
                "kind": if f.flags & pcifab_uapi::FN_VF != 0 { "vf" } else { "pf" },
                "host": if f.flags & pcifab_uapi::FN_BOUND != 0 { json!(f.bound_host) } else { Value::Null },
            });
            match telemetry_of(&dev, f.pdfid) {
                Ok(t) => j["telemetry"] = t,
                Err(e) => j["error"] = json!(e),
            }
            out.push(j);
        }
        if o.json {
            println!(
                "{}",
                json!({"generation": fab.inv.generation, "functions": out})
            );
        } else {
            if tty {
                print!("\x1b[H\x1b[2J");
            }
            println!(
                "fabric generation {}: {} functions{}",
                fab.inv.generation,
                out.len(),
                if once { "" } else { "; Ctrl-C stops" }
            );
            println!("PDFID   KIND  HOST  TEMP      POWER       UTIL  HEALTH");
            for j in &out {
                let host = j["host"].as_u64().map_or("-".into(), |h| h.to_string());
                let t = &j["telemetry"];
                if t.is_null() {
                    println!(
                        "{:<7} {:<5} {:<5} telemetry not available: {}",
                        j["pdfid"].as_str().unwrap_or("?"),
                        j["kind"].as_str().unwrap_or("?"),
                        host,
                        j["error"].as_str().unwrap_or("?")
                    );
                    continue;
                }
                let c = t["temperature_centi"].as_i64().unwrap_or(0);
                println!(
                    "{:<7} {:<5} {:<5} {:<9} {:<11} {:<5} {}",
                    j["pdfid"].as_str().unwrap_or("?"),
                    j["kind"].as_str().unwrap_or("?"),
                    host,
                    format!("{}.{:02} C", c / 100, (c % 100).abs()),
                    format!("{} mW", t["power_mw"]),
                    format!("{}%", t["utilisation"]),
                    health_text(t["health"].as_u64().unwrap_or(0))
                );
            }
        }
        let _ = std::io::stdout().flush();
        n += 1;
        if once || (o.count != 0 && n >= o.count) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn dispatches_only_manager_commands() {
        assert!(dispatch(&args("info")).is_none());
        assert!(dispatch(&args("stats --json")).is_none());
        assert!(dispatch(&args("--device /dev/x list")).is_none());
    }

    #[test]
    fn parses_request_options() {
        let o = parse(&args(
            "request --gpus 2 --host 1 --priority 5 --duration 60 --preemptible-by-higher --json",
        ))
        .ok()
        .expect("parse");
        assert_eq!(
            (o.gpus, o.host, o.priority, o.duration),
            (Some(2), Some(1), Some(5), Some(60))
        );
        assert!(o.preemptible && o.json);
        assert!(parse(&args("request --gpus x")).is_err());
        assert!(parse(&args("release 1 2")).is_err());
        assert!(parse(&args("queue --bogus")).is_err());
    }

    #[test]
    fn unreachable_manager_is_a_failure_not_a_usage_error() {
        let o = parse(&args("queue --manager-socket /nonexistent/pcifab.sock"))
            .ok()
            .expect("parse");
        let e = match queue(&o) {
            Err(e) => e,
            Ok(()) => panic!("no manager, yet queue succeeded"),
        };
        assert!(!e.usage && e.code == 1, "{e}");
        assert!(e.msg.contains("is pcifab-manager running"), "{e}");
    }

    #[test]
    fn names_health_bits() {
        assert_eq!(health_text(0), "ok");
        assert_eq!(health_text(3), "link-down,thermal");
        assert_eq!(health_text(8), "0x8");
    }
}
