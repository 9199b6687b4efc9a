// SPDX-License-Identifier: GPL-2.0-only

//! `/metrics`: the manager's state in the Prometheus text format (version 0.0.4), listed in
//! Documentation/manager-api.rst, "Metrics".

use std::{collections::BTreeMap, fmt::Write, sync::atomic::Ordering};

use crate::daemon::Daemon;
pub use crate::stats::{outcome, HttpStats, Stats, BUCKETS, OPS, OUTCOMES, STATUSES};

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

    // Every pool and priority is shown, zero or not, so a series does not vanish when its
    // last lease ends (and rate() and alerts see the drop to zero).
    let zeros = |extra: Option<&str>| -> BTreeMap<(String, u32), u64> {
        let mut m = BTreeMap::new();
        let names = s.config.pools.iter().map(|p| p.name.clone());
        for pool in names.chain(extra.map(String::from)) {
            for prio in 0..=s.config.manager.max_priority.min(100) {
                m.insert((pool.clone(), prio), 0);
            }
        }
        m
    };
    let mut leases = zeros(None);
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
    let mut queued = zeros(Some("any"));
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
    let mut requests: BTreeMap<(String, &str), u64> = OPS
        .iter()
        .flat_map(|op| OUTCOMES.iter().map(move |oc| ((op.to_string(), *oc), 0)))
        .collect();
    for ((op, oc), n) in &d.stats.requests {
        requests.insert((op.clone(), oc), *n);
    }
    for ((op, outcome), n) in &requests {
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
    http(&mut o, &d.http);
    process(&mut o);

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

/// The network API's counters.
fn http(o: &mut Out, h: &HttpStats) {
    let mut responses: BTreeMap<u16, u64> = STATUSES.iter().map(|s| (*s, 0)).collect();
    if let Ok(r) = h.responses.lock() {
        responses.extend(r.iter().map(|(k, v)| (*k, *v)));
    }
    o.family(
        "pcifab_http_responses_total",
        "counter",
        "Replies of the network API by HTTP status (401, 403 and 413 included).",
    );
    for (code, n) in &responses {
        o.sample(
            "pcifab_http_responses_total",
            &[("code", code.to_string())],
            *n as f64,
        );
    }
    o.family(
        "pcifab_http_connections",
        "gauge",
        "Connections the network API holds now.",
    );
    o.sample(
        "pcifab_http_connections",
        &[],
        h.connections.load(Ordering::Relaxed) as f64,
    );
    for (name, help, v) in [
        (
            "pcifab_http_connections_evicted_total",
            "Stalled connections (handshake, head, body or idle) closed to make room.",
            &h.evicted,
        ),
        (
            "pcifab_http_connections_refused_total",
            "New connections closed because every one that could make room was serving.",
            &h.refused,
        ),
        (
            "pcifab_http_timeouts_total",
            "Connections closed for a TLS handshake, request head or body not done in time.",
            &h.timeouts,
        ),
    ] {
        o.family(name, "counter", help);
        o.sample(name, &[], v.load(Ordering::Relaxed) as f64);
    }
}

/// What the process uses, under the names every Prometheus client library gives them.
#[derive(Debug, Default, PartialEq)]
pub struct Process {
    pub resident_memory_bytes: u64,
    pub virtual_memory_bytes: u64,
    pub open_fds: u64,
    pub max_fds: u64,
    pub cpu_seconds: f64,
    pub start_time_seconds: f64,
}

/// Reads [`Process`] from /proc/self; a value it cannot read is 0.
pub fn process_now() -> Process {
    // SAFETY: sysconf only reads a configuration value.
    let (tick, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let tick = if tick > 0 { tick as f64 } else { 100.0 };
    let page = u64::try_from(page).unwrap_or(4096);
    let mut p = Process::default();
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // The fields after the command name, which is in parentheses and may hold spaces.
        if let Some((_, rest)) = stat.rsplit_once(')') {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            // rest[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24.
            p.cpu_seconds = (num(11) + num(12)) as f64 / tick;
            p.virtual_memory_bytes = num(20);
            p.resident_memory_bytes = num(21).saturating_mul(page);
            let boot = std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
                })
                .unwrap_or(0);
            p.start_time_seconds = boot as f64 + num(19) as f64 / tick;
        }
    }
    p.open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `lim`, which is valid for it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        p.max_fds = lim.rlim_cur;
    }
    p
}

fn process(o: &mut Out) {
    let p = process_now();
    for (name, kind, help, v) in [
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            p.resident_memory_bytes as f64,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_memory_bytes as f64,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            p.open_fds as f64,
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            p.max_fds as f64,
        ),
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            p.cpu_seconds,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds,
        ),
    ] {
        o.family(name, kind, help);
        o.sample(name, &[], v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn process_figures_are_this_process() {
        let p = process_now();
        assert!(p.resident_memory_bytes > 1 << 20, "{p:?}");
        assert!(p.virtual_memory_bytes >= p.resident_memory_bytes, "{p:?}");
        assert!(p.open_fds >= 3 && p.max_fds >= p.open_fds, "{p:?}");
        let now = crate::clock::unix_now() as f64;
        assert!(
            p.start_time_seconds > now - 3600.0 && p.start_time_seconds <= now + 1.0,
            "{p:?} (now {now})"
        );
        // Burn some CPU: the counter moves.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(process_now().cpu_seconds > p.cpu_seconds);
    }
}
