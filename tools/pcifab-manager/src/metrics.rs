// SPDX-License-Identifier: GPL-2.0-only

//! `/metrics`: the manager's state in the Prometheus text format (version 0.0.4), listed in
//! Documentation/manager-api.rst, "Metrics".

use std::{collections::BTreeMap, fmt::Write, time::Duration};

use serde_json::Value;

use crate::{daemon::Daemon, protocol::Request};

/// Upper bounds (seconds) of the request-duration histogram's buckets.
const BUCKETS: [f64; 10] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

/// Requests served since the start, by operation and outcome, and their durations.
#[derive(Debug, Default)]
pub struct Stats {
    /// (operation, outcome: ok | refused | failed) -> count.
    pub requests: BTreeMap<(String, &'static str), u64>,
    /// Cumulative counts per bucket of [`BUCKETS`], then +Inf.
    buckets: [u64; BUCKETS.len() + 1],
    sum_s: f64,
}

fn op_name(r: &Request) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.get("op").and_then(Value::as_str).map(String::from))
        .unwrap_or_else(|| "unknown".into())
}

impl Stats {
    pub fn record(&mut self, req: &Request, reply: &Value, took: Duration) {
        let outcome = match (reply.get("ok"), reply.get("refused")) {
            (Some(Value::Bool(true)), _) => "ok",
            (_, Some(Value::Bool(true))) => "refused",
            _ => "failed",
        };
        *self.requests.entry((op_name(req), outcome)).or_default() += 1;
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

/// A label value, escaped as the text format wants.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &[(&str, String)], v: f64) {
        let l: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", label(v)))
            .collect();
        if l.is_empty() {
            let _ = writeln!(self.0, "{name} {v}");
        } else {
            let _ = writeln!(self.0, "{name}{{{}}} {v}", l.join(","));
        }
    }
}

/// The metrics of `d`, as the text format.
pub fn render(d: &Daemon) -> String {
    let s = &d.sched;
    let mut o = Out(String::new());
    let pool_name = |i: usize| {
        s.config
            .pools
            .get(i)
            .map(|p| p.name.clone())
            .unwrap_or_default()
    };

    o.family(
        "pcifab_device_healthy",
        "gauge",
        "1 when a pool device (by PF) is in the pool, 0 when it was taken out.",
    );
    for dev in &s.devices {
        o.sample(
            "pcifab_device_healthy",
            &[
                ("pool", pool_name(dev.pool)),
                ("pf", format!("{:#06x}", dev.pf)),
            ],
            if dev.unhealthy.is_none() { 1.0 } else { 0.0 },
        );
    }

    let mut leases: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for l in s.leases.values() {
        *leases
            .entry((pool_name(l.pool), l.spec.priority))
            .or_default() += 1;
    }
    o.family(
        "pcifab_leases",
        "gauge",
        "Leases held, by pool and priority.",
    );
    for ((pool, prio), n) in &leases {
        o.sample(
            "pcifab_leases",
            &[("pool", pool.clone()), ("priority", prio.to_string())],
            *n as f64,
        );
    }
    let mut queued: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for q in &s.queue {
        let pool = q.spec.pool.clone().unwrap_or_else(|| "any".into());
        *queued.entry((pool, q.spec.priority)).or_default() += 1;
    }
    o.family(
        "pcifab_queued_requests",
        "gauge",
        "Requests waiting, by the pool they asked for (any: none named) and priority.",
    );
    for ((pool, prio), n) in &queued {
        o.sample(
            "pcifab_queued_requests",
            &[("pool", pool.clone()), ("priority", prio.to_string())],
            *n as f64,
        );
    }

    o.family(
        "pcifab_scheduling_passes_total",
        "counter",
        "Scheduling passes run since the manager started.",
    );
    o.sample("pcifab_scheduling_passes_total", &[], s.passes as f64);
    o.family(
        "pcifab_requests_total",
        "counter",
        "Requests served since the manager started, by operation and outcome.",
    );
    for ((op, outcome), n) in &d.stats.requests {
        o.sample(
            "pcifab_requests_total",
            &[("op", op.clone()), ("outcome", (*outcome).to_string())],
            *n as f64,
        );
    }
    o.family(
        "pcifab_request_duration_seconds",
        "histogram",
        "Time to decide and carry out a request, from its arrival at the scheduler.",
    );
    for (i, b) in BUCKETS.iter().enumerate() {
        o.sample(
            "pcifab_request_duration_seconds_bucket",
            &[("le", b.to_string())],
            d.stats.buckets[i] as f64,
        );
    }
    let total = d.stats.buckets[BUCKETS.len()];
    o.sample(
        "pcifab_request_duration_seconds_bucket",
        &[("le", "+Inf".into())],
        total as f64,
    );
    o.sample("pcifab_request_duration_seconds_sum", &[], d.stats.sum_s);
    o.sample("pcifab_request_duration_seconds_count", &[], total as f64);
    o.family(
        "pcifab_action_failures",
        "gauge",
        "Fabric actions (bind, unbind, move) that failed, among the last ones kept.",
    );
    o.sample("pcifab_action_failures", &[], d.failures.len() as f64);

    if let Some(t) = &d.telemetry {
        let fams = [
            (
                "pcifab_function_temperature_celsius",
                "Temperature the firmware reports for a function.",
            ),
            (
                "pcifab_function_power_watts",
                "Power the firmware reports for a function.",
            ),
            (
                "pcifab_function_utilisation_ratio",
                "Utilisation the firmware reports for a function (0 to 1).",
            ),
            (
                "pcifab_function_health_flags",
                "Health flags the firmware reports for a function (0: healthy).",
            ),
        ];
        for (i, (name, help)) in fams.iter().enumerate() {
            o.family(name, "gauge", help);
            for (f, sample) in &t.samples {
                let Ok(x) = sample else { continue };
                let v = match i {
                    0 => f64::from(x.temperature_centi) / 100.0,
                    1 => f64::from(x.power_mw) / 1000.0,
                    2 => f64::from(x.utilisation) / 100.0,
                    _ => f64::from(x.health),
                };
                o.sample(name, &[("pdfid", format!("{f:#06x}"))], v);
            }
        }
        o.family(
            "pcifab_function_sample_errors",
            "gauge",
            "1 when the last telemetry read of a function failed (an MRPC error or link down).",
        );
        for (f, sample) in &t.samples {
            o.sample(
                "pcifab_function_sample_errors",
                &[("pdfid", format!("{f:#06x}"))],
                if sample.is_err() { 1.0 } else { 0.0 },
            );
        }
    }
    o.0
}
