// SPDX-License-Identifier: GPL-2.0-only

//! The write path's rate as notices fill (Documentation/manager.rst, "The store"): the
//! daemon in-process, the simulated executor, the real store on disk (redb, an fsync per
//! commit). Not run by default:
//!
//! ```text
//! cargo test --release -p pcifab-manager --test store_bench -- --ignored --nocapture
//! ```

mod common;

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Instant,
};

use common::*;
use pcifab_manager::{bench::thread_cpu_s, daemon::Daemon, store::Store};
use serde_json::json;

/// Bytes this process has had written to storage (`write_bytes` of /proc/self/io).
fn written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| {
                    l.strip_prefix("write_bytes: ")
                        .map(|v| v.trim().parse().ok())
                })
                .flatten()
        })
        .unwrap_or(0)
}

/// Requests per window; windows measured.
const WINDOW: u64 = 500;
const WINDOWS: u64 = 12;

#[test]
#[ignore = "a benchmark: cargo test --release -p pcifab-manager --test store_bench -- --ignored --nocapture"]
fn write_path_requests_per_second_as_notices_fill() {
    // On the disk of the build (CARGO_TARGET_TMPDIR), not a tmpfs: an fsync costs what
    // it costs.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("store-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let c = config("hybrid");
    let sim = sim_for(&c);
    let clock = Arc::new(AtomicU64::new(1000));
    let ck = clock.clone();
    let mut d = Daemon::start(
        c,
        Store::open(&dir).expect("store"),
        Box::new(sim),
        Box::new(move || ck.load(Ordering::SeqCst)),
    )
    .expect("daemon");
    println!(
        "# window  requests  notices  db_bytes  requests/s  cpu_us/request  written_kb/request"
    );
    let mut rates = Vec::new();
    for w in 0..WINDOWS {
        let t = Instant::now();
        let cpu = thread_cpu_s();
        let w0 = written();
        // A grant and a release per pair: two writes, two notices.
        for i in 0..WINDOW / 2 {
            let host = (i % 3) as u8;
            let r = d.handle_line(
                &json!({"op": "request", "spec": {"host": host,
                        "want": {"kind": "gpus", "count": 1}, "priority": 1,
                        "duration_s": 600}})
                .to_string(),
            );
            assert_eq!(r["granted"], json!(true), "{r}");
            let r = d.handle_line(&json!({"op": "release", "id": r["id"]}).to_string());
            assert_eq!(r["ok"], json!(true), "{r}");
        }
        let rate = WINDOW as f64 / t.elapsed().as_secs_f64();
        let cpu_us = (thread_cpu_s() - cpu) * 1e6 / WINDOW as f64;
        let kb = written().saturating_sub(w0) as f64 / 1024.0 / WINDOW as f64;
        clock.fetch_add(1, Ordering::SeqCst);
        let bytes = std::fs::metadata(dir.join("manager.redb"))
            .map(|m| m.len())
            .unwrap_or(0);
        println!(
            "  {w:6}  {:8}  {:7}  {bytes:8}  {rate:10.0}  {cpu_us:14.0}  {kb:18.1}",
            (w + 1) * WINDOW,
            d.sched.notices.len(),
        );
        rates.push((rate, cpu_us, kb));
    }
    let (first, first_cpu, first_kb) = rates[0];
    let tail = &rates[rates.len() - 4..];
    let n = tail.len() as f64;
    let last = tail.iter().map(|r| r.0).sum::<f64>() / n;
    let last_cpu = tail.iter().map(|r| r.1).sum::<f64>() / n;
    let last_kb = tail.iter().map(|r| r.2).sum::<f64>() / n;
    println!(
        "bench store_write_rate requests/s {first:.0} -> {last:.0}, cpu_us/request \
         {first_cpu:.0} -> {last_cpu:.0}, written_kb/request {first_kb:.1} -> {last_kb:.1} \
         (first window -> last four, notices full)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
