// SPDX-License-Identifier: GPL-2.0-only

//! What the daemon and the network API count as they serve: requests by operation and
//! outcome, their durations, and the API's replies and connections. `/metrics` (the
//! `metrics` module) renders them.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, AtomicUsize},
        Mutex,
    },
    time::Duration,
};

use serde_json::Value;

use crate::protocol::Request;

/// Upper bounds (seconds) of the request-duration histogram's buckets.
pub const BUCKETS: [f64; 10] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

/// Requests served since the start, by operation and outcome, and their durations.
#[derive(Debug, Default)]
pub struct Stats {
    /// (operation, outcome: ok | refused | failed) -> count.
    pub requests: BTreeMap<(String, &'static str), u64>,
    /// Cumulative counts per bucket of [`BUCKETS`], then +Inf.
    pub(crate) buckets: [u64; BUCKETS.len() + 1],
    pub(crate) sum_s: f64,
}

fn op_name(r: &Request) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.get("op").and_then(Value::as_str).map(String::from))
        .unwrap_or_else(|| "unknown".into())
}

/// The outcome of a reply: ok, refused or failed.
pub fn outcome(reply: &Value) -> &'static str {
    match (reply.get("ok"), reply.get("refused")) {
        (Some(Value::Bool(true)), _) => "ok",
        (_, Some(Value::Bool(true))) => "refused",
        _ => "failed",
    }
}

/// The operations `pcifab_requests_total` counts (every one shown, zero or not): the
/// protocol's, and `redfish` for a Redfish read.
pub const OPS: &[&str] = &[
    "request",
    "release",
    "queue",
    "leases",
    "pool",
    "hosts",
    "host-down",
    "heartbeat",
    "compose",
    "set-health",
    "events",
    "telemetry",
    "state",
    "log",
    "redfish",
];

pub const OUTCOMES: [&str; 3] = ["ok", "refused", "failed"];

/// The HTTP statuses `pcifab_http_responses_total` always shows (others once seen).
pub const STATUSES: [u16; 11] = [200, 201, 400, 401, 403, 404, 405, 408, 409, 413, 500];

/// What the network API counts outside the daemon's lock: its replies by status and its
/// connections.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// HTTP status -> replies sent.
    pub responses: Mutex<BTreeMap<u16, u64>>,
    /// Connections held now.
    pub connections: AtomicUsize,
    /// Stalled connections closed to make room for new ones.
    pub evicted: AtomicU64,
    /// New connections closed because every connection that could make room was busy.
    pub refused: AtomicU64,
    /// Connections closed for a TLS handshake or a request body not done in time.
    pub timeouts: AtomicU64,
}

impl HttpStats {
    /// Counts one reply.
    pub fn response(&self, status: u16) {
        if let Ok(mut r) = self.responses.lock() {
            *r.entry(status).or_default() += 1;
        }
    }
}

impl Stats {
    pub fn record(&mut self, req: &Request, reply: &Value, took: Duration) {
        self.record_op(&op_name(req), outcome(reply), took);
    }

    /// Counts one request of operation `op` that ended with `outcome`.
    pub fn record_op(&mut self, op: &str, outcome: &'static str, took: Duration) {
        *self.requests.entry((op.to_string(), outcome)).or_default() += 1;
        let s = took.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                self.buckets[i] += 1;
            }
        }
        self.buckets[BUCKETS.len()] += 1;
        self.sum_s += s;
    }

    /// Requests of operation `op` served so far, whatever their outcome.
    pub fn served(&self, op: &str) -> u64 {
        self.requests
            .iter()
            .filter(|((o, _), _)| o == op)
            .map(|(_, n)| n)
            .sum()
    }
}
