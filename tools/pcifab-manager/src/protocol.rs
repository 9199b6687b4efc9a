// SPDX-License-Identifier: GPL-2.0-only

//! The control socket's protocol: one JSON object per line each way.
//!
//! A request is `{"op": NAME, ...}`; every reply has `"ok"` and, when it is false, `"error"`
//! (what went wrong and what to do) and `"refused"` (true when the manager refused the
//! request itself, as opposed to failing). `Documentation/manager.rst` lists the operations.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::scheduler::{Host, Lease, Pdfid, RequestSpec, Scheduler, Secs, Want};

/// A request on the control socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Ask for GPUs or VFs.
    Request { spec: RequestSpec },
    /// End a lease or cancel a queued request.
    Release { id: u64 },
    /// The queue in rank order.
    Queue,
    /// The leases.
    Leases,
    /// The pool's devices, their health and users.
    Pool,
    /// The hosts: heartbeats, down or up, and what each holds.
    Hosts,
    /// Notices (grants, pre-emptions, moves, expiry...) after `since`, for `host` or all.
    Events {
        #[serde(default)]
        host: Option<Host>,
        #[serde(default)]
        since: u64,
    },
    /// A host's agent is alive.
    Heartbeat { host: Host },
    /// Declare a host down: its leases are reclaimed after `reclaim_after_s`.
    HostDown { host: Host },
    /// Make `host` hold exactly `functions`: leases of functions not named end, whole devices
    /// newly named are granted now (see `Scheduler::compose`).
    Compose {
        host: Host,
        #[serde(deserialize_with = "pdfids")]
        functions: Vec<Pdfid>,
        #[serde(default)]
        priority: u32,
        #[serde(default)]
        duration_s: Option<u64>,
        #[serde(default)]
        tenant: Option<String>,
        /// Set by the manager from the caller's credentials, never taken from the caller.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    /// Take a device out of the pool or put it back.
    SetHealth {
        pf: Pdfid,
        healthy: bool,
        #[serde(default)]
        reason: Option<String>,
    },
    /// The last telemetry samples (driver executor only).
    Telemetry,
    /// The whole scheduler state (debugging, tests).
    State,
    /// The last `n` entries of the request log.
    Log {
        #[serde(default = "default_log")]
        n: u64,
    },
}

/// Most items one reply lists: `log`'s `n`, and the API's `limit` on list routes.
pub const MAX_PAGE: u64 = 1000;

/// Longest a `GET /v1/events?wait=S` (or a socket line's `wait`) waits for a notice.
pub const MAX_EVENT_WAIT_S: u64 = 60;

/// The HTTP status of a protocol reply: 200 (201 for a new request), 409 when the manager
/// refused it (a conflict with the pool, the queue or its rules), 500 when it failed.
pub fn status_of(req: &Request, reply: &Value) -> u16 {
    if reply.get("status").and_then(Value::as_u64) == Some(422) {
        // An idempotency key already used for another request (Daemon::handle_keyed).
        return 422;
    }
    match (reply.get("ok"), reply.get("refused")) {
        (Some(Value::Bool(true)), _) if matches!(req, Request::Request { .. }) => 201,
        (Some(Value::Bool(true)), _) => 200,
        (_, Some(Value::Bool(true))) => 409,
        _ => 500,
    }
}

fn default_log() -> u64 {
    20
}

/// PDFIDs as numbers or as text (`"0x0400"`, `"1024"`).
pub fn pdfids<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Pdfid>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum One {
        Number(Pdfid),
        Text(String),
    }
    Vec::<One>::deserialize(d)?
        .into_iter()
        .map(|o| match o {
            One::Number(n) => Ok(n),
            One::Text(t) => parse_pdfid(&t).ok_or_else(|| {
                serde::de::Error::custom(format!("'{t}' is not a PDFID (a number such as 0x0400)"))
            }),
        })
        .collect()
}

/// A PDFID written as `0x0400` or `1024`.
pub fn parse_pdfid(t: &str) -> Option<Pdfid> {
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => Pdfid::from_str_radix(h, 16).ok(),
        None => t.parse().ok(),
    }
}

impl Request {
    /// Whether it may change the state (and so is logged and committed).
    pub fn mutates(&self) -> bool {
        matches!(
            self,
            Request::Request { .. }
                | Request::Release { .. }
                | Request::Heartbeat { .. }
                | Request::HostDown { .. }
                | Request::Compose { .. }
                | Request::SetHealth { .. }
        )
    }
}

/// A failed reply.
pub fn error(msg: impl Into<String>, refused: bool) -> Value {
    json!({"ok": false, "error": msg.into(), "refused": refused})
}

fn want_text(w: &Want) -> String {
    match w {
        Want::Gpus { count } => format!("{count} GPU{}", if *count == 1 { "" } else { "s" }),
        Want::Vfs { count, profile } => format!(
            "{count} VF{}{}",
            if *count == 1 { "" } else { "s" },
            profile
                .as_ref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        ),
    }
}

/// A lease as clients see it.
pub fn lease_json(s: &Scheduler, l: &Lease, now: Secs) -> Value {
    let functions: Vec<String> = l
        .units
        .iter()
        .map(|u| format!("{:#06x}", u.pdfid))
        .collect();
    let resident: Vec<bool> = l
        .units
        .iter()
        .map(|u| !l.sliced || s.devices[u.device].resident == Some(l.id))
        .collect();
    let mut v = json!({
        "id": l.id,
        "host": l.spec.host,
        "owner": l.spec.owner,
        "tenant": l.spec.tenant_name(),
        "want": want_text(&l.spec.want),
        "priority": l.spec.priority,
        "pool": s.config.pools[l.pool].name,
        "functions": functions,
        "resident": resident,
        "time_sliced": l.sliced,
        "preemptible": l.spec.preemptible_by_higher,
        "granted_at": l.granted_at,
        "expires_at": l.expires_at,
        "remaining_s": l.expires_at.saturating_sub(now),
    });
    if let Some(t) = &l.spec.tag {
        v["tag"] = json!(t);
    }
    v
}

/// Answers one request against the scheduler (no I/O: the daemon applies the actions it
/// leaves and commits the state).
pub fn handle(s: &mut Scheduler, req: &Request, now: Secs) -> Value {
    match req {
        Request::Request { spec } => match s.submit(spec.clone(), now) {
            Ok(r) => {
                let lease = s.leases.get(&r.id).map(|l| lease_json(s, l, now));
                json!({"ok": true, "id": r.id, "granted": r.granted, "position": r.position, "lease": lease})
            }
            Err(e) => error(e.0, true),
        },
        Request::Release { id } => match s.release(*id, now) {
            Ok(()) => json!({"ok": true, "id": id}),
            Err(e) => error(e.0, true),
        },
        Request::Queue => {
            let q: Vec<Value> = s
                .ranked(now)
                .into_iter()
                .enumerate()
                .map(|(pos, i)| {
                    let q = &s.queue[i];
                    let mut v = json!({
                        "position": pos,
                        "id": q.id,
                        "host": q.spec.host,
                        "owner": q.spec.owner,
                        "tenant": q.spec.tenant_name(),
                        "want": want_text(&q.spec.want),
                        "priority": q.spec.priority,
                        "effective_priority": s.effective_priority(q, now),
                        "promoted": s.promoted(q, now),
                        "waited_s": now.saturating_sub(q.enqueued),
                        "duration_s": q.duration_s,
                    });
                    if let Some(t) = &q.spec.tag {
                        v["tag"] = json!(t);
                    }
                    v
                })
                .collect();
            json!({"ok": true, "now": now, "queue": q})
        }
        Request::Leases => {
            let l: Vec<Value> = s.leases.values().map(|l| lease_json(s, l, now)).collect();
            json!({"ok": true, "now": now, "leases": l})
        }
        Request::Pool => {
            let d: Vec<Value> = s
                .devices
                .iter()
                .map(|d| {
                    json!({
                        "pool": s.config.pools[d.pool].name,
                        "mode": s.config.pools[d.pool].mode,
                        "pf": format!("{:#06x}", d.pf),
                        "vfs": d.vfs.iter().map(|v| format!("{v:#06x}")).collect::<Vec<_>>(),
                        "profile": d.profile,
                        "healthy": d.unhealthy.is_none(),
                        "reason": d.unhealthy,
                        "scrub": d.scrub,
                        "whole_leases": d.whole,
                        "vf_leases": d.vf_lease,
                        "resident": d.resident,
                    })
                })
                .collect();
            let holders: serde_json::Map<String, Value> = s
                .holders
                .iter()
                .map(|(f, h)| (format!("{f:#06x}"), json!(h)))
                .collect();
            json!({"ok": true, "devices": d, "bound": holders, "hosts": s.hosts})
        }
        Request::Hosts => {
            let hosts: Vec<Value> = (0..s.config.manager.hosts)
                .map(|h| {
                    let st = s.hosts.get(&h).cloned().unwrap_or_default();
                    let holds: Vec<String> = s
                        .holders
                        .iter()
                        .filter(|(_, &o)| o == h)
                        .map(|(f, _)| format!("{f:#06x}"))
                        .collect();
                    json!({
                        "host": h,
                        "up": st.down_since.is_none(),
                        "last_seen": st.last_seen,
                        "down_since": st.down_since,
                        "declared_down": st.declared,
                        "leases": s.leases.values().filter(|l| l.spec.host == h).count(),
                        "queued": s.queue.iter().filter(|q| q.spec.host == h).count(),
                        "functions": holds,
                    })
                })
                .collect();
            json!({"ok": true, "now": now, "hosts": hosts})
        }
        Request::Events { host, since } => {
            json!({"ok": true, "events": s.notices_for(*host, *since)})
        }
        Request::Heartbeat { host } => {
            if *host >= s.config.manager.hosts {
                return error(
                    format!(
                        "host {host} is not in this fabric (hosts 0-{})",
                        s.config.manager.hosts.saturating_sub(1)
                    ),
                    true,
                );
            }
            s.heartbeat(*host, now);
            json!({"ok": true})
        }
        Request::HostDown { host } => {
            if *host >= s.config.manager.hosts {
                return error(format!("host {host} is not in this fabric"), true);
            }
            s.declare_down(*host, now);
            json!({"ok": true, "reclaim_at": now + s.config.failover.reclaim_after_s})
        }
        Request::Compose {
            host,
            functions,
            priority,
            duration_s,
            tenant,
            owner,
        } => {
            let base = RequestSpec {
                host: *host,
                want: Want::Gpus { count: 1 },
                priority: *priority,
                duration_s: *duration_s,
                preemptible_by_higher: false,
                migratable: true,
                pool: None,
                tenant: tenant.clone(),
                owner: owner.clone(),
                tag: None,
            };
            match s.compose(&base, functions, now) {
                Ok(c) => {
                    let granted: Vec<Value> = c
                        .granted
                        .iter()
                        .filter_map(|id| s.leases.get(id))
                        .map(|l| lease_json(s, l, now))
                        .collect();
                    let holds: Vec<String> = s
                        .leases
                        .values()
                        .filter(|l| l.spec.host == *host)
                        .flat_map(|l| l.units.iter().map(|u| format!("{:#06x}", u.pdfid)))
                        .collect();
                    json!({"ok": true, "host": host, "released": c.released,
                           "granted": granted, "functions": holds})
                }
                Err(e) => error(e.0, true),
            }
        }
        Request::SetHealth {
            pf,
            healthy,
            reason,
        } => {
            let r = if *healthy {
                s.readmit(*pf, now)
            } else {
                let why = reason.clone().unwrap_or_else(|| "set by operator".into());
                s.set_health(*pf, Some(why), now)
            };
            match r {
                Ok(()) => json!({"ok": true}),
                Err(e) => error(e.0, true),
            }
        }
        Request::State => json!({"ok": true, "state": s}),
        // Served by the daemon, which has them.
        Request::Telemetry | Request::Log { .. } => error("not served here", false),
    }
}

/// Splits the socket's `wait` (seconds, at most [`MAX_EVENT_WAIT_S`]) off an
/// `events` request line: the line without it, and the wait (0 when absent or not an
/// `events` line, whose own parse then judges it). A `wait` that is not such a number is a
/// refused request. A line without the word is passed on as it is, unparsed.
pub fn take_wait(line: &str) -> Result<(Cow<'_, str>, u64), Value> {
    let unchanged = Ok((Cow::Borrowed(line), 0));
    if !line.contains("\"wait\"") {
        return unchanged;
    }
    let Ok(Value::Object(mut o)) = serde_json::from_str::<Value>(line) else {
        return unchanged;
    };
    if o.get("op").and_then(Value::as_str) != Some("events") {
        return unchanged;
    }
    let Some(w) = o.remove("wait") else {
        return unchanged;
    };
    let max = MAX_EVENT_WAIT_S;
    match w.as_u64().filter(|&w| w <= max) {
        Some(w) => Ok((Cow::Owned(Value::Object(o).to_string()), w)),
        None => Err(error(
            format!("bad request: wait is whole seconds, 0 to {max}; got {w}"),
            true,
        )),
    }
}

/// Whether `reply` is an `events` reply with no notices (a long poll waits on).
pub fn no_events(reply: &Value) -> bool {
    reply
        .get("events")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
}

/// Parses one request line; the error reply says what is wrong.
pub fn parse(line: &str) -> Result<Request, Value> {
    serde_json::from_str(line).map_err(|e| {
        error(
            format!(
                "bad request: {e}; send one JSON object per line, e.g. {{\"op\":\"queue\"}} \
                 (Documentation/manager.rst lists the operations)"
            ),
            true,
        )
    })
}

/// The control socket's name of a request's idempotency key (the API's is the
/// `Idempotency-Key` header).
pub const KEY_FIELD: &str = "idempotency_key";

/// [`parse`], with the line's idempotency key ([`KEY_FIELD`]) taken off and checked.
pub fn parse_keyed(line: &str) -> Result<(Request, Option<String>), Value> {
    if !line.contains(KEY_FIELD) {
        return parse(line).map(|r| (r, None));
    }
    let mut v: Value = serde_json::from_str(line).map_err(|e| {
        error(
            format!("bad request: {e}; send one JSON object per line"),
            true,
        )
    })?;
    let key = match v.as_object_mut().and_then(|o| o.remove(KEY_FIELD)) {
        None => None,
        Some(Value::String(k)) => {
            crate::store::check_key(&k).map_err(|e| error(format!("bad request: {e}"), true))?;
            Some(k)
        }
        Some(k) => {
            return Err(error(
                format!("bad request: {KEY_FIELD} is a string, got {k}"),
                true,
            ))
        }
    };
    parse(&v.to_string()).map(|r| (r, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's tag is shown with its queue entry and its lease (a client finds what it
    /// asked for by it, e.g. Slurm's epilog the requests of its job); an untagged one shows
    /// none; a tag that is not 1 to 128 characters of `A-Z a-z 0-9 . _ : -` is refused.
    #[test]
    fn a_requests_tag_is_shown_with_its_queue_entry_and_lease() {
        let c = crate::config::Config::parse(
            "[manager]\nhosts = 2\n[[pools]]\nname = \"g\"\nmode = \"whole\"\n\
             devices = [{ pf = 0x300 }]\n",
        )
        .expect("config");
        let mut s = Scheduler::new(c);
        let ask = |s: &mut Scheduler, tag: &str| {
            let line = format!(
                r#"{{"op":"request","spec":{{"host":1,"want":{{"kind":"gpus","count":1}},"priority":1{tag}}}}}"#
            );
            handle(s, &parse(&line).expect("parses"), 0)
        };
        let granted = ask(&mut s, r#","tag":"slurm-job-42""#);
        assert_eq!(granted["granted"], json!(true), "{granted}");
        assert_eq!(granted["lease"]["tag"], json!("slurm-job-42"));
        let queued = ask(&mut s, r#","tag":"slurm-job-43""#);
        assert_eq!(queued["granted"], json!(false), "{queued}");
        let plain = ask(&mut s, "");
        let leases = handle(&mut s, &Request::Leases, 0);
        assert_eq!(
            leases["leases"][0]["tag"],
            json!("slurm-job-42"),
            "{leases}"
        );
        let queue = handle(&mut s, &Request::Queue, 0);
        let tags: Vec<Value> = queue["queue"]
            .as_array()
            .expect("queue")
            .iter()
            .map(|q| (q["id"].clone(), q.get("tag").cloned()))
            .map(|(id, t)| json!([id, t]))
            .collect();
        assert_eq!(
            tags,
            vec![
                json!([queued["id"], "slurm-job-43"]),
                json!([plain["id"], null])
            ]
        );
        for bad in ["", "a b", "job/1", &"x".repeat(129)] {
            let r = ask(&mut s, &format!(r#","tag":"{bad}""#));
            assert_eq!(
                (r["ok"].clone(), r["refused"].clone()),
                (json!(false), json!(true))
            );
            assert!(r["error"].as_str().unwrap_or("").contains("tag"), "{r}");
        }
    }

    #[test]
    fn the_idempotency_key_is_taken_off_the_line() {
        let (r, k) =
            parse_keyed(r#"{"op":"release","id":3,"idempotency_key":"a-1"}"#).expect("keyed");
        assert_eq!((r, k.as_deref()), (Request::Release { id: 3 }, Some("a-1")));
        let (r, k) = parse_keyed(r#"{"op":"release","id":3}"#).expect("plain");
        assert_eq!((r, k), (Request::Release { id: 3 }, None));
        for bad in [
            r#"{"op":"release","id":3,"idempotency_key":""}"#,
            r#"{"op":"release","id":3,"idempotency_key":"a b"}"#,
            r#"{"op":"release","id":3,"idempotency_key":"a@b"}"#,
            r#"{"op":"release","id":3,"idempotency_key":7}"#,
        ] {
            let e = parse_keyed(bad).expect_err(bad);
            assert_eq!(e["refused"], json!(true), "{bad}: {e}");
        }
        let long = format!(
            r#"{{"op":"release","id":3,"idempotency_key":"{}"}}"#,
            "k".repeat(129)
        );
        assert!(parse_keyed(&long).is_err());
    }

    #[test]
    fn wait_is_taken_off_events_lines_only() {
        let plain = r#"{"op":"queue"}"#;
        assert!(matches!(take_wait(plain), Ok((Cow::Borrowed(l), 0)) if l == plain));
        let (line, w) = take_wait(r#"{"op":"events","since":3,"wait":30}"#).expect("taken");
        assert_eq!(w, 30);
        assert!(matches!(
            parse(&line),
            Ok(Request::Events {
                host: None,
                since: 3
            })
        ));
        // Not an events line: left for its parse, which refuses the unknown field.
        let (line, w) = take_wait(r#"{"op":"release","id":1,"wait":5}"#).expect("passed on");
        assert_eq!(w, 0);
        assert!(parse(&line).is_err());
        assert!(take_wait(r#"{"op":"events","wait":61}"#).is_err());
    }

    #[test]
    fn parses_requests() {
        let r = parse(
            r#"{"op":"request","spec":{"host":1,"want":{"kind":"vfs","count":2,"profile":"q"},"priority":3}}"#,
        )
        .expect("parse");
        match r {
            Request::Request { spec } => {
                assert_eq!(spec.host, 1);
                assert!(spec.migratable);
                assert_eq!(
                    spec.want,
                    Want::Vfs {
                        count: 2,
                        profile: Some("q".into())
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse(r#"{"op":"queue"}"#).ok(), Some(Request::Queue));
        assert!(parse(r#"{"op":"nope"}"#).is_err());
        assert!(parse("not json").is_err());
        assert!(parse(r#"{"op":"release"}"#).is_err());
    }
}
