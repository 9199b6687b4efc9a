// SPDX-License-Identifier: GPL-2.0-only

//! The fabric manager's client commands (`request`, `release`, `queue`, `leases`), through
//! pcifab-manager's control socket or, on a kernel without UNIX sockets, its spool directory.
//! Documentation/manager.rst describes the protocol, Documentation/cli.rst the commands.

use pcifab::cli::{Command, RequestArgs};
use serde_json::{json, Value};

use super::{emit, failure, out::refused, Cli, Error};

/// Runs a manager command.
pub fn run(cli: &Cli) -> Result<(), Error> {
    match &cli.command {
        Command::Request(r) => request(cli, r),
        Command::Release { id } => release(cli, *id),
        Command::Queue => queue(cli),
        Command::Leases => leases(cli),
        _ => unreachable!("not a manager command"),
    }
}

/// One request to the manager, one reply; a reply with `"ok": false` is an error (exit 3
/// when the manager refused the request itself).
pub fn ask(socket: &str, req: &Value) -> Result<Value, Error> {
    let line = pcifab_manager::client::ask(std::path::Path::new(socket), &req.to_string())
        .map_err(|f| {
            let mut e = failure(format!(
                "{} (--manager-socket PATH names another socket)",
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
    if v.get("ok").and_then(Value::as_bool) == Some(true) {
        return Ok(v);
    }
    let msg = v
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("the manager failed the request without saying why");
    if v.get("refused").and_then(Value::as_bool) == Some(true) {
        Err(refused(format!("the manager refused it: {msg}")))
    } else {
        Err(failure(format!("the manager failed it: {msg}")))
    }
}

fn request(cli: &Cli, r: &RequestArgs) -> Result<(), Error> {
    let want = match (r.gpus, r.vfs) {
        (Some(n), _) => json!({"kind": "gpus", "count": n}),
        (None, Some(n)) => json!({"kind": "vfs", "count": n, "profile": r.profile}),
        (None, None) => unreachable!("clap requires one of --gpus, --vfs"),
    };
    let host = r.host;
    let v = ask(
        &cli.manager_socket,
        &json!({"op": "request", "spec": {
            "host": host, "want": want, "priority": r.priority, "duration_s": r.duration,
            "preemptible_by_higher": r.preemptible_by_higher, "pool": r.pool,
        }}),
    )?;
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

fn release(cli: &Cli, id: u32) -> Result<(), Error> {
    let v = ask(&cli.manager_socket, &json!({"op": "release", "id": id}))?;
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

fn queue(cli: &Cli) -> Result<(), Error> {
    let v = ask(&cli.manager_socket, &json!({"op": "queue"}))?;
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

fn leases(cli: &Cli) -> Result<(), Error> {
    let v = ask(&cli.manager_socket, &json!({"op": "leases"}))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_manager_is_a_failure_not_a_usage_error() {
        let e = ask("/nonexistent/pcifab.sock", &json!({"op": "queue"}))
            .expect_err("no manager, yet queue succeeded");
        assert!(e.exit == 1 && e.code() == "ENOENT", "{e}");
        assert!(e.msg.contains("is pcifab-manager running"), "{e}");
    }
}
