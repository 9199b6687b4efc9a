// SPDX-License-Identifier: GPL-2.0-only

//! The fabric manager's client commands (`request`, `release`, `queue`, `leases`, `pools`,
//! `hosts`, `events`, `compose`, `host-down`, `heartbeat`, `health`, `manager-*`): through
//! pcifab-manager's network API when a manager URL is given (`--manager`, PCIFAB_MANAGER or
//! /etc/pcifab/client.toml), else its control socket (or, on a kernel without UNIX sockets,
//! its spool directory). Documentation/manager-api.rst describes the API,
//! Documentation/cli.rst the commands.

use std::{path::PathBuf, time::Duration};

use pcifab::cli::{Command, HealthState, RequestArgs};
use pcifab_manager::{client::Remote, protocol::Request};
use serde_json::{json, Value};

use super::{emit, failure, out::refused, Cli, Error};

/// Where the client configuration is read from unless PCIFAB_CLIENT_CONFIG names another.
pub const CLIENT_CONFIG: &str = "/etc/pcifab/client.toml";

/// `/etc/pcifab/client.toml`: the same settings as the options, for every call.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientConfig {
    manager: Option<String>,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    token_file: Option<PathBuf>,
}

fn client_config() -> Result<ClientConfig, Error> {
    let path = std::env::var("PCIFAB_CLIENT_CONFIG").unwrap_or_else(|_| CLIENT_CONFIG.into());
    match std::fs::read_to_string(&path) {
        Ok(t) => toml::from_str(&t).map_err(|e| failure(format!("{path}: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ClientConfig::default()),
        Err(e) => Err(failure(format!("cannot read {path}: {e}"))),
    }
}

/// The manager's network API as the options, the environment and the client
/// configuration give it (in that order); none: the local socket.
fn remote(cli: &Cli) -> Result<Option<Remote>, Error> {
    let f = client_config()?;
    let Some(url) = cli.manager.clone().or(f.manager) else {
        return Ok(None);
    };
    let token = match cli.token_file.clone().or(f.token_file) {
        Some(p) => Some(
            std::fs::read_to_string(&p)
                .map_err(|e| failure(format!("cannot read the token file {}: {e}", p.display())))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    Ok(Some(Remote {
        url,
        ca: cli.ca.clone().or(f.ca),
        cert: cli.cert.clone().or(f.cert),
        key: cli.key.clone().or(f.key),
        token,
        timeout: Duration::from_secs(90),
    }))
}

/// Runs a manager command.
pub fn run(cli: &Cli) -> Result<(), Error> {
    let to = remote(cli)?;
    let m = Manager { cli, remote: to };
    match &cli.command {
        Command::Request(r) => request(&m, r),
        Command::Release { id } => release(&m, *id),
        Command::Queue => queue(&m),
        Command::Leases => leases(&m),
        Command::Pools => pools(&m),
        Command::Hosts => hosts(&m),
        Command::Events {
            host,
            since,
            follow,
        } => events(&m, *host, *since, *follow),
        Command::Compose {
            host,
            functions,
            priority,
            duration,
            tenant,
        } => {
            let v = m.ask(&Request::Compose {
                host: *host,
                functions: functions.clone(),
                priority: *priority,
                duration_s: *duration,
                tenant: tenant.clone(),
                owner: None,
            })?;
            let list = |k: &str| -> String {
                v[k].as_array()
                    .map(|a| {
                        a.iter()
                            .map(|x| match x {
                                Value::String(s) => s.clone(),
                                Value::Object(o) => {
                                    o.get("id").map(Value::to_string).unwrap_or_default()
                                }
                                other => other.to_string(),
                            })
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "none".into())
            };
            let text = format!(
                "host {host} holds {}; leases ended: {}; leases granted: {}",
                list("functions"),
                list("released"),
                list("granted")
            );
            done(&m, "compose", v, &text)
        }
        Command::HostDown { host } => {
            let v = m.ask(&Request::HostDown { host: *host })?;
            done(&m, "host-down", v, &format!("host {host} declared down"))
        }
        Command::Heartbeat { host } => {
            let v = m.ask(&Request::Heartbeat { host: *host })?;
            done(
                &m,
                "heartbeat",
                v,
                &format!("heartbeat for host {host} sent"),
            )
        }
        Command::Health { pf, state, reason } => {
            let healthy = *state == HealthState::Ok;
            if healthy && reason.is_some() {
                return Err(super::usage_error(
                    "a reason goes with `bad` only".to_string(),
                ));
            }
            let v = m.ask(&Request::SetHealth {
                pf: *pf,
                healthy,
                reason: reason.clone(),
            })?;
            let what = if healthy {
                "back in the pool"
            } else {
                "out of the pool"
            };
            done(&m, "health", v, &format!("{pf:#06x} {what}"))
        }
        Command::ManagerTelemetry => raw(&m, "manager-telemetry", &Request::Telemetry),
        Command::ManagerState => raw(&m, "manager-state", &Request::State),
        Command::ManagerLog { n } => raw(&m, "manager-log", &Request::Log { n: *n }),
        _ => unreachable!("not a manager command"),
    }
}

/// Whether a manager URL is set (options, environment or client configuration).
pub fn has_url(cli: &Cli) -> Result<bool, Error> {
    Ok(remote(cli)?.is_some())
}

/// What `top` shows when a manager URL is set: the manager's URL, its telemetry and pool
/// replies; none without a URL (then `top` reads the driver).
pub fn telemetry_view(cli: &Cli) -> Result<Option<(String, Value, Value)>, Error> {
    let Some(r) = remote(cli)? else {
        return Ok(None);
    };
    let url = r.url.clone();
    let m = Manager {
        cli,
        remote: Some(r),
    };
    Ok(Some((
        url,
        m.ask(&Request::Telemetry)?,
        m.ask(&Request::Pool)?,
    )))
}

/// A command's way to the manager.
struct Manager<'a> {
    cli: &'a Cli,
    remote: Option<Remote>,
}

impl Manager<'_> {
    fn ask(&self, req: &Request) -> Result<Value, Error> {
        self.ask_waiting(req, 0)
    }

    /// One request, one reply; a reply with `"ok": false` is an error (exit 3 when the
    /// manager refused the request, or refused the caller).
    fn ask_waiting(&self, req: &Request, wait_s: u64) -> Result<Value, Error> {
        match &self.remote {
            Some(r) => {
                let (status, v) = r.ask(req, wait_s).map_err(|f| {
                    let mut e = failure(f.msg);
                    e.errno = f.errno;
                    e
                })?;
                reply(v, Some(status))
            }
            None => {
                let mut v = serde_json::to_value(req)
                    .map_err(|e| failure(format!("cannot encode the request: {e}")))?;
                // The socket takes an `events` request's wait in the line itself.
                if wait_s > 0 {
                    v["wait"] = json!(wait_s);
                }
                ask(&self.cli.manager_socket, &v.to_string())
            }
        }
    }
}

/// One request line to the manager's socket, one reply.
pub fn ask(socket: &str, line: &str) -> Result<Value, Error> {
    let line = pcifab_manager::client::ask(std::path::Path::new(socket), line).map_err(|f| {
        let mut e = failure(format!(
            "{} (--manager-socket PATH names another socket, --manager URL a manager on the \
             network)",
            f.msg
        ));
        e.errno = f.errno;
        e
    })?;
    let v: Value = serde_json::from_str(&line).map_err(|e| {
        failure(format!(
            "the manager at {socket} answered something that is not JSON ({e}): {line:?}"
        ))
    })?;
    reply(v, None)
}

fn reply(v: Value, status: Option<u16>) -> Result<Value, Error> {
    if v.get("ok").and_then(Value::as_bool) == Some(true) {
        return Ok(v);
    }
    let msg = v
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("the manager failed the request without saying why");
    let status = status.or_else(|| {
        v.get("status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
    });
    match status {
        Some(401) => Err(refused(format!(
            "the manager does not know who this is (401): {msg}"
        ))),
        Some(403) => Err(refused(format!(
            "the manager does not allow it (403): {msg}"
        ))),
        _ if v.get("refused").and_then(Value::as_bool) == Some(true) => {
            Err(refused(format!("the manager refused it: {msg}")))
        }
        _ => Err(failure(format!("the manager failed it: {msg}"))),
    }
}

/// A command that changes something: its reply as JSON, or one line.
fn done(m: &Manager, name: &str, v: Value, text: &str) -> Result<(), Error> {
    if m.cli.json {
        emit(name, v);
    } else {
        println!("{text}");
    }
    Ok(())
}

/// A command whose reply is only JSON (state, log, telemetry): pretty unless --json.
fn raw(m: &Manager, name: &str, req: &Request) -> Result<(), Error> {
    let v = m.ask(req)?;
    if m.cli.json {
        emit(name, v);
    } else {
        let mut v = v;
        if let Some(o) = v.as_object_mut() {
            o.remove("ok");
        }
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    Ok(())
}

fn request(m: &Manager, r: &RequestArgs) -> Result<(), Error> {
    let cli = m.cli;
    let want = match (r.gpus, r.vfs) {
        (Some(n), _) => json!({"kind": "gpus", "count": n}),
        (None, Some(n)) => json!({"kind": "vfs", "count": n, "profile": r.profile}),
        (None, None) => unreachable!("clap requires one of --gpus, --vfs"),
    };
    let host = r.host;
    let spec = serde_json::from_value(json!({
        "host": host, "want": want, "priority": r.priority, "duration_s": r.duration,
        "preemptible_by_higher": r.preemptible_by_higher, "pool": r.pool, "tenant": r.tenant,
        "tag": r.tag,
    }))
    .map_err(|e| failure(format!("cannot encode the request: {e}")))?;
    let v = m.ask(&Request::Request { spec })?;
    if cli.json {
        emit("request", v);
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

fn release(m: &Manager, id: u32) -> Result<(), Error> {
    let cli = m.cli;
    let v = m.ask(&Request::Release { id: u64::from(id) })?;
    if cli.json {
        emit("release", v);
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

fn queue(m: &Manager) -> Result<(), Error> {
    let cli = m.cli;
    let v = m.ask(&Request::Queue)?;
    if cli.json {
        emit("queue", v);
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

fn leases(m: &Manager) -> Result<(), Error> {
    let cli = m.cli;
    let v = m.ask(&Request::Leases)?;
    if cli.json {
        emit("leases", v);
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

fn pools(m: &Manager) -> Result<(), Error> {
    let v = m.ask(&Request::Pool)?;
    if m.cli.json {
        emit("pools", v);
        return Ok(());
    }
    println!("POOL        MODE        PF      HEALTH  HOLDERS");
    let bound = &v["bound"];
    for d in rows(&v, "devices") {
        let pf = d["pf"].as_str().unwrap_or("?");
        let mut holders: Vec<String> = std::iter::once(pf)
            .chain(rows(d, "vfs").iter().filter_map(Value::as_str))
            .filter_map(|f| bound.get(f).map(|h| format!("{f}->h{h}")))
            .collect();
        if holders.is_empty() {
            holders.push("-".into());
        }
        let health = if d["healthy"] == json!(true) {
            "ok".to_string()
        } else {
            format!("out ({})", d["reason"].as_str().unwrap_or("?"))
        };
        println!(
            "{:<11} {:<11} {:<7} {:<7} {}",
            d["pool"].as_str().unwrap_or("?"),
            txt(&d["mode"]),
            pf,
            health,
            holders.join(" ")
        );
    }
    Ok(())
}

fn hosts(m: &Manager) -> Result<(), Error> {
    let v = m.ask(&Request::Hosts)?;
    if m.cli.json {
        emit("hosts", v);
        return Ok(());
    }
    println!("HOST  STATE  LEASES  QUEUED  FUNCTIONS");
    for h in rows(&v, "hosts") {
        let fns: Vec<&str> = rows(h, "functions")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        println!(
            "{:<5} {:<6} {:<7} {:<7} {}",
            txt(&h["host"]),
            if h["up"] == json!(true) { "up" } else { "down" },
            txt(&h["leases"]),
            txt(&h["queued"]),
            if fns.is_empty() {
                "-".into()
            } else {
                fns.join(" ")
            }
        );
    }
    Ok(())
}

/// Notices after `since`; with `follow`, waits for more (the manager holds each request up
/// to 30 s until a notice comes) until --count notices were shown.
fn events(m: &Manager, host: Option<u8>, since: u64, follow: bool) -> Result<(), Error> {
    let mut since = since;
    let mut shown: u64 = 0;
    let limit = m.cli.count.map(u64::from);
    loop {
        let wait = if follow { 30 } else { 0 };
        let asked = std::time::Instant::now();
        let v = m.ask_waiting(&Request::Events { host, since }, wait)?;
        let evs = rows(&v, "events");
        if m.cli.json && !follow {
            emit("events", v);
            return Ok(());
        }
        for e in evs {
            since = since.max(e["seq"].as_u64().unwrap_or(since));
            if m.cli.json {
                emit("events", json!({"events": [e]}));
            } else {
                println!(
                    "{:<6} {:<11} host {:<3} lease {:<5} {:<10} {}",
                    txt(&e["seq"]),
                    txt(&e["at"]),
                    txt(&e["host"]),
                    txt(&e["lease"]),
                    txt(&e["kind"]),
                    e["message"].as_str().unwrap_or("")
                );
            }
            shown += 1;
            if limit.is_some_and(|l| shown >= l) {
                return Ok(());
            }
        }
        if !follow {
            return Ok(());
        }
        // A manager serving through its spool directory (no UNIX sockets here) answers a
        // wait at once: ask it again a second later, not at once.
        let quick = Duration::from_secs(1).saturating_sub(asked.elapsed());
        if m.remote.is_none() && evs.is_empty() && !quick.is_zero() {
            std::thread::sleep(quick);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_manager_is_a_failure_not_a_usage_error() {
        let e = ask("/nonexistent/pcifab.sock", r#"{"op":"queue"}"#)
            .expect_err("no manager, yet queue succeeded");
        assert!(e.exit == 1 && e.code() == "ENOENT", "{e}");
        assert!(e.msg.contains("is pcifab-manager running"), "{e}");
    }
}
