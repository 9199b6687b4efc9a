// SPDX-License-Identifier: GPL-2.0-only
//! Scenarios about what the driver must survive: hostile callers (`pcifab-selftest fuzz`),
//! loading and unloading with the device busy (`unload-cycles`), and every error path of
//! probe (`probe-faults`, with the kernel's per-task fault injection). The guest-side loops
//! live in the selftest, so one agent round trip covers thousands of calls or a batch of
//! cycles. See Documentation/testing-trust.rst.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::{
    begin, check_bound_pcifab, check_invariants, check_world, compose_begin, owners_text,
    selftest_json, settled_owners, Checks, Owners, PCIFAB_KO,
};
use crate::fabric::{EmuControl, Fabric, Host};

/// ioctl calls per fuzz run: 100,000 with `--soak` (`make soak`), 4,000 in `make test`.
fn fuzz_calls() -> u64 {
    if crate::soak() {
        100_000
    } else {
        4_000
    }
}
/// Seeds of the two fuzz runs (printed, so a failure can be replayed with
/// `pcifab-selftest fuzz --seed S --calls N [--unpriv]`).
pub const UNPRIV_SEED: u64 = 0x7a11_0001;
pub const ROOT_SEED: u64 = 0x7a11_0002;
/// Guest time one fuzz run may take: the root run took 388 s on the plain test kernel
/// (274 calls/s), the unprivileged one 74 s; room for a debug kernel several times slower.
const FUZZ_TIMEOUT: Duration = Duration::from_secs(2400);
/// Load/unload cycles in all (1,000 with `--soak`, 4 in `make test`), and per agent round
/// trip.
fn cycles() -> u64 {
    if crate::soak() {
        1000
    } else {
        4
    }
}
fn cycle_batch() -> u64 {
    cycles().min(100)
}
/// The emulator's firmware delay during the cycles, so an echo is always in flight.
const CYCLE_DELAY_MS: u32 = 20;
/// Fault points tried per agent round trip, and the highest one tried at all.
const FAULT_BATCH: u64 = 250;
const FAULT_MAX_NTH: u64 = 60_000;

/// The line `fuzz ioctl_calls=N splats=K changes=C` and the JSON record of a fuzz run.
struct FuzzResult {
    code: i64,
    ioctl_calls: u64,
    splats: u64,
    changes: u64,
    record: Value,
    out: String,
}

fn run_fuzz(h: &mut Host, seed: u64, unpriv: bool) -> Result<FuzzResult, String> {
    let args = format!(
        "fuzz --seed {seed:#x} --calls {}{}",
        fuzz_calls(),
        if unpriv { " --unpriv" } else { "" }
    );
    let o = h.run_timeout(&format!("pcifab-selftest {args}"), FUZZ_TIMEOUT)?;
    let Some(line) = o.out.lines().find(|l| l.starts_with("fuzz ioctl_calls=")) else {
        // A fuzzer that died: the kernel's own account of the fault says where.
        let faults = h
            .run("dmesg | grep -E 'segfault at|traps:|general protection' | tail -n 5")
            .map(|d| d.out)
            .unwrap_or_default();
        return Err(format!(
            "{}: `pcifab-selftest {args}` (exit {}) printed no summary line:\n{}\n\
             kernel log of the fault: {}",
            h.name,
            o.code,
            tail(&o.out, 20),
            if faults.trim().is_empty() {
                "none"
            } else {
                faults.trim()
            }
        ));
    };
    let field = |k: &str| -> Result<u64, String> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{}: no {k}= in {line:?}", h.name))
    };
    let record = o
        .out
        .lines()
        .find(|l| l.starts_with("{\"test\":\"fuzz\""))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    Ok(FuzzResult {
        code: o.code,
        ioctl_calls: field("ioctl_calls")?,
        splats: field("splats")?,
        changes: field("changes")?,
        record,
        out: o.out,
    })
}

fn tail(s: &str, n: usize) -> String {
    let l: Vec<&str> = s.trim_end().lines().collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

/// The checks every fuzz run shares: enough calls, no splat, the device still answers.
fn check_fuzz(h: &Host, what: &str, r: &FuzzResult) -> Result<(), String> {
    let rate = r.record["calls_per_s"].as_f64().unwrap_or(0.0);
    h.log_note(&format!(
        "{what}: ioctl_calls={} splats={} changes={} ({rate:.0} calls/s, {} s); record: {}",
        r.ioctl_calls, r.splats, r.changes, r.record["secs"], r.record
    ));
    crate::say(&format!(
        "# {what} in {}: {} ioctl calls, {rate:.0} calls/s, splats={}, changes={}",
        h.name, r.ioctl_calls, r.splats, r.changes
    ));
    let mut errs = Vec::new();
    if r.ioctl_calls < fuzz_calls() {
        errs.push(format!(
            "ioctl calls: expected at least {}, got {}",
            fuzz_calls(),
            r.ioctl_calls
        ));
    }
    if r.splats != 0 {
        errs.push(format!(
            "kernel splat lines during the run: expected 0, got {} (first after call {}): {}",
            r.splats, r.record["first_splat_after_call"], r.record["splat_lines"]
        ));
    }
    if r.record["healthy_after"] != Value::Bool(true) {
        errs.push(format!(
            "/dev/pcifab0 after the run: expected VERSION and an echo to work, got {}",
            r.record["healthy_after"]
        ));
    }
    if r.code != 0 && errs.is_empty() {
        errs.push(format!(
            "pcifab-selftest exited with {}: {}",
            r.code,
            tail(&r.out, 5)
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {what}: {}", h.name, errs.join("; ")))
    }
}

/// The fabric as the emulator holds it: bindings, generation, link states and every host's
/// routes.
fn fabric_state(emu: &EmuControl, hosts: &[String]) -> Result<Value, String> {
    let s = emu.request("state")?;
    let bindings: Vec<Value> = s["bindings"]
        .as_array()
        .ok_or_else(|| format!("emulator state has no bindings: {s}"))?
        .iter()
        .map(|b| {
            serde_json::json!({
                "pdfid": b["pdfid"], "owner": b["owner"], "logical_port": b["logical_port"]
            })
        })
        .collect();
    let links: Vec<Value> = s["ports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| serde_json::json!({"port": p["port"], "link": p["link"]}))
                .collect()
        })
        .unwrap_or_default();
    let mut routes = serde_json::Map::new();
    for h in hosts {
        routes.insert(
            h.clone(),
            emu.request(&format!("routes {h}"))?["routes"].clone(),
        );
    }
    Ok(serde_json::json!({
        "generation": s["generation"], "bindings": bindings, "links": links, "routes": routes
    }))
}

pub fn fuzz_unpriv(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let hosts = f.expected.hosts.clone();
    let before = fabric_state(&emu, &hosts)?;
    crate::say(&format!(
        "# fuzz seed {UNPRIV_SEED:#x} (unprivileged, h0): pcifab-selftest fuzz --seed \
         {UNPRIV_SEED:#x} --calls {} --unpriv",
        fuzz_calls()
    ));
    let h = &mut f.hosts[0];
    h.run_ok("chmod 666 /dev/pcifab0")?;
    let r = run_fuzz(h, UNPRIV_SEED, true);
    // The node may be gone if the run broke the driver; put the mode back if it is there.
    let _ = h.run("[ -e /dev/pcifab0 ] && chmod 600 /dev/pcifab0");
    let r = r?;
    check_fuzz(h, "unprivileged fuzz", &r)?;
    if r.changes != 0 {
        return Err(format!(
            "h0: unprivileged fuzz: successful fabric changes: expected 0, got {}: {}",
            r.changes, r.record["change_log"]
        ));
    }
    if r.record["reopen_as_user"] != "ok" {
        return Err(format!(
            "h0: unprivileged fuzz: opening /dev/pcifab0 (mode 666) as uid 65534: expected \
             ok, got {}",
            r.record["reopen_as_user"]
        ));
    }
    let after = fabric_state(&emu, &hosts)?;
    if after != before {
        return Err(format!(
            "fabric state after the unprivileged fuzz: expected it unchanged, was {before}, \
             is {after}"
        ));
    }
    check_world(f, &Owners::new(), "the unprivileged fuzz")
}

/// One round of h1's own workload: bind one of its gpu1 functions to itself, unbind it.
fn h1_round(h: &mut Host, pdfid: u16, tally: &Mutex<Vec<String>>) -> Result<(), String> {
    let o = h.run_timeout(
        &format!(
            "pcifab bind {pdfid:#06x} --host 1 >/dev/null 2>&1; echo bind=$?; \
             pcifab unbind {pdfid:#06x} >/dev/null 2>&1; echo unbind=$?"
        ),
        Duration::from_secs(120),
    )?;
    let mut t = tally.lock().map_err(|_| "tally lock poisoned")?;
    for l in o.out.lines().filter(|l| l.contains('=')) {
        t.push(l.trim().to_string());
    }
    Ok(())
}

pub fn fuzz_root(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    // h1 may bind gpu1's functions to itself (fabric.toml's policy).
    let h1_fns: Vec<u16> = e
        .endpoints
        .iter()
        .filter(|ep| {
            e.allowed
                .get(1)
                .and_then(|a| a.as_ref())
                .is_none_or(|a| a.contains(&ep.name))
        })
        .flat_map(|ep| {
            let pf = (0x0100 + 0x20 * ep.port) as u16;
            (0..=ep.vfs as u16).map(move |v| pf + v)
        })
        .collect();
    if f.hosts.len() < 2 || h1_fns.is_empty() {
        return Err(format!(
            "needs two hosts and functions h1 may bind; got {} hosts and {h1_fns:x?}",
            f.hosts.len()
        ));
    }
    let names: Vec<String> = h1_fns.iter().map(|p| format!("{p:#06x}")).collect();
    crate::say(&format!(
        "# fuzz seed {ROOT_SEED:#x} (root, h0, while h1 binds and unbinds {}): \
         pcifab-selftest fuzz --seed {ROOT_SEED:#x} --calls {}",
        names.join(" "),
        fuzz_calls()
    ));
    let done = AtomicBool::new(false);
    let tally = Mutex::new(Vec::new());
    let result = Mutex::new(None);
    let rounds = std::sync::atomic::AtomicU64::new(0);
    f.each_host(|h, _| {
        if h.index == 0 {
            let r = run_fuzz(h, ROOT_SEED, false);
            done.store(true, Ordering::SeqCst);
            *result.lock().map_err(|_| "result lock poisoned")? = Some(r);
            Ok(())
        } else if h.index == 1 {
            let mut i = 0usize;
            while !done.load(Ordering::SeqCst) {
                h1_round(h, h1_fns[i % h1_fns.len()], &tally)?;
                rounds.fetch_add(1, Ordering::SeqCst);
                i = i.wrapping_mul(7).wrapping_add(3);
            }
            Ok(())
        } else {
            Ok(())
        }
    })?;
    let r = result
        .into_inner()
        .map_err(|_| "result lock poisoned")?
        .ok_or("the fuzz run did not report")??;
    let tally = tally.into_inner().unwrap_or_default();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for t in &tally {
        *counts.entry(t.clone()).or_default() += 1;
    }
    f.hosts[1].log_note(&format!(
        "workload beside the root fuzz: {} rounds, outcomes {counts:?}",
        rounds.load(Ordering::SeqCst)
    ));
    crate::say(&format!(
        "# h1 workload beside the root fuzz: {} rounds, exit codes {counts:?}",
        rounds.load(Ordering::SeqCst)
    ));
    check_fuzz(&f.hosts[0], "root fuzz", &r)?;
    if rounds.load(Ordering::SeqCst) == 0 {
        return Err("h1's workload ran no round during the root fuzz".into());
    }
    check_invariants(&emu, "the root fuzz")?;
    // Whatever the fuzz left bound: both hosts must agree with the emulator and see exactly
    // their own functions.
    let left = settled_owners(
        &emu,
        &e,
        Duration::from_secs(60),
        Duration::from_millis(250),
    )
    .map_err(|err| format!("after the root fuzz: {err}"))?;
    f.hosts[0].log_note(&format!("root fuzz left bound: {}", owners_text(&e, &left)));
    check_world(f, &left, "the root fuzz")?;
    // Free everything again (as the manager), links up again; the fabric must be as at the
    // start and both hosts must say so.
    for p in left.keys() {
        emu.request(&format!("unbind {p:#06x}"))
            .map_err(|err| format!("freeing after the root fuzz: {err}"))?;
    }
    let state = emu.request("state")?;
    for p in state["ports"].as_array().into_iter().flatten() {
        if p["link"] != "up" {
            emu.request(&format!("link {} up", p["port"]))?;
        }
    }
    for h in &e.hosts {
        let routes = emu.request(&format!("routes {h}"))?;
        if routes["routes"].as_array().is_some_and(|a| !a.is_empty()) {
            return Err(format!(
                "after freeing every function: routes of {h}: expected none (a route needs a \
                 bound target), got {}",
                routes["routes"]
            ));
        }
    }
    check_world(
        f,
        &Owners::new(),
        "freeing every function after the root fuzz",
    )
}

fn kmemleak(h: &mut Host, since: Instant) -> Result<(), String> {
    let o = h.run(
        "[ -e /sys/kernel/debug/kmemleak ] || mount -t debugfs none /sys/kernel/debug \
         2>/dev/null; [ -e /sys/kernel/debug/kmemleak ]",
    )?;
    if o.code != 0 {
        crate::say(&format!(
            "# {}: no /sys/kernel/debug/kmemleak (kernel without CONFIG_DEBUG_KMEMLEAK): \
             leaks NOT checked",
            h.name
        ));
        h.log_note("kmemleak: not available in this kernel; leaks not checked");
        return Ok(());
    }
    // kmemleak reports an object only once it is older than 5 s.
    let age = Duration::from_secs(6);
    if since.elapsed() < age {
        std::thread::sleep(age - since.elapsed());
    }
    let out = h.run_ok(
        "echo scan > /sys/kernel/debug/kmemleak; echo scan > /sys/kernel/debug/kmemleak; \
         cat /sys/kernel/debug/kmemleak",
    )?;
    if out.trim().is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{}: kmemleak: expected no suspected leak, got:\n{}",
            h.name,
            out.lines().take(40).collect::<Vec<_>>().join("\n")
        ))
    }
}

pub fn unload_cycles(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        // Forget what kmemleak found before, so only these cycles count.
        let _ = h.run(
            "[ -e /sys/kernel/debug/kmemleak ] || mount -t debugfs none /sys/kernel/debug \
             2>/dev/null; [ -e /sys/kernel/debug/kmemleak ] && \
             echo clear > /sys/kernel/debug/kmemleak",
        );
        emu.request(&format!("fault {} delay {CYCLE_DELAY_MS}", h.name))
            .map_err(|e| format!("{}: {e}", h.name))?;
        let mut r = Ok(());
        let t = Instant::now();
        let mut results = Vec::new();
        for b in 0..cycles() / cycle_batch() {
            let first = b * cycle_batch();
            let batch = cycle_batch();
            let o = h.run_timeout(
                &format!(
                    "pcifab-selftest unload-cycles --cycles {batch} --first {first} \
                     --module {PCIFAB_KO}"
                ),
                Duration::from_secs(600),
            );
            let o = match o {
                Ok(o) => o,
                Err(e) => {
                    r = Err(format!("{}: cycles from {first}: {e}", h.name));
                    break;
                }
            };
            let line = o
                .out
                .lines()
                .find(|l| l.starts_with("{\"test\":\"unload-cycles\""))
                .map(str::to_string);
            if o.code != 0 {
                r = Err(format!(
                    "{}: cycles {first}..{}: {}",
                    h.name,
                    first + cycle_batch(),
                    o.out
                        .lines()
                        .filter(|l| l.contains("FAILED"))
                        .collect::<Vec<_>>()
                        .join("\n")
                ));
                if let Some(l) = line {
                    h.log_note(&format!("unload-cycles: {l}"));
                }
                break;
            }
            results.push(line.unwrap_or_default());
        }
        let cleared = emu
            .request(&format!("fault clear {}", h.name))
            .map_err(|e| format!("{}: {e}", h.name));
        // Whatever happened, leave pcifab loaded for the scenarios after this one.
        let _ = h.run(&format!("[ -d /sys/module/pcifab ] || insmod {PCIFAB_KO}"));
        r?;
        cleared?;
        let secs = t.elapsed().as_secs_f64();
        h.log_note(&format!(
            "unload-cycles: {} cycles in {secs:.1} s; batches: {}",
            cycles(),
            results.join(" ")
        ));
        crate::say(&format!(
            "# {}: {} load/unload cycles with the device busy in {secs:.0} s ({:.0} ms \
             per cycle)",
            h.name,
            cycles(),
            secs * 1000.0 / cycles() as f64
        ));
        kmemleak(h, Instant::now())
    })
}

/// Every fault point of a module load (`insmod`: the loader's own and probe's).
pub fn probe_faults(f: &mut Fabric) -> Result<(), String> {
    probe_fault_sweep(f, "load", None)
}

/// The JSON report line `{"test":"<test>",...}` a selftest command printed, or null.
fn report_line(out: &str, test: &str) -> Value {
    let head = format!("{{\"test\":\"{test}\"");
    out.lines()
        .find(|l| l.starts_with(&head))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null)
}

/// Every fault point of a probe through the driver's sysfs `bind` file, the module loaded.
pub fn probe_faults_bind(f: &mut Fabric) -> Result<(), String> {
    probe_fault_sweep(f, "bind", None)
}

/// Stack frames between a fault point and pcifab's code for [`probe_faults_own`]: the
/// allocator's own frames and the kernel's allocation helpers the driver calls, not the
/// subsystems a probe reaches deeper down (ACPICA, genirq's /proc entries).
pub const OWN_DEPTH: u32 = 10;

/// pcifab's own allocations in a probe through the driver's sysfs `bind` file fail, one at
/// a time (the fault points within [`OWN_DEPTH`] frames of its text). In `make test` a run
/// takes half the point numbers, the odd or the even ones ([`own_half`]), and the hosts
/// split them (host i of n takes 1+half+2i, then every 2n-th): their probes are alike but
/// not the same (h0 has an IOMMU and is the fabric manager's host, so its N-th point may be
/// another allocation than h1's); `make soak` fails every point on every host.
pub fn probe_faults_own(f: &mut Fabric) -> Result<(), String> {
    probe_fault_sweep(f, "bind", Some(OWN_DEPTH))
}

/// Which half of the point numbers a `make test` run fails: `PCIFAB_FAULT_HALF` (0: the
/// odd ones, 1: the even ones), else the day's parity, so that runs on consecutive days
/// cover both.
fn own_half() -> u64 {
    match std::env::var("PCIFAB_FAULT_HALF").ok().as_deref() {
        Some("0") => 0,
        Some("1") => 1,
        _ => {
            let days = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() / 86_400);
            days % 2
        }
    }
}

fn probe_fault_sweep(
    f: &mut Fabric,
    attach: &'static str,
    depth: Option<u32>,
) -> Result<(), String> {
    let depth_arg = depth.map_or(String::new(), |d| format!(" --depth {d}"));
    // Split among the hosts only for the driver's own allocations, and not in a soak run
    // (see probe_faults_own).
    let (stride, half) = if depth.is_some() && !crate::soak() {
        (2 * f.hosts.len().max(1) as u64, own_half())
    } else {
        (1, 0)
    };
    if stride > 1 {
        crate::say(&format!(
            "# fault points of parity {} this run (PCIFAB_FAULT_HALF={half} repeats it)",
            if half == 0 { "odd" } else { "even" }
        ));
    }
    f.each_host(|h, _| {
        begin(h)?;
        let t = Instant::now();
        let first = 1 + half + (2 * h.index as u64) % stride;
        let stride_arg = if stride > 1 {
            format!(" --stride {stride}")
        } else {
            String::new()
        };
        let mut from = first;
        let mut summary = (0u64, 0u64, 0u64);
        let r = loop {
            if from > FAULT_MAX_NTH {
                break Err(format!(
                    "{}: loading still met a fault at fail-nth {FAULT_MAX_NTH}: expected it to \
                     pass every fault point before",
                    h.name
                ));
            }
            let to = from + (FAULT_BATCH - 1) * stride;
            let o = h.run_timeout(
                &format!(
                    "pcifab-selftest probe-faults --module {PCIFAB_KO} --attach {attach} \
                     --from {from} --to {to}{stride_arg}{depth_arg}"
                ),
                Duration::from_secs(900),
            )?;
            let v = report_line(&o.out, "probe-faults");
            if o.code != 0 {
                break Err(format!(
                    "{}: probe-faults from {from}: {}",
                    h.name,
                    o.out
                        .lines()
                        .filter(|l| !l.starts_with('{'))
                        .collect::<Vec<_>>()
                        .join("\n")
                ));
            }
            h.log_note(&format!("probe-faults: {v}"));
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            summary.0 += n("load_failed");
            summary.1 += n("probe_failed");
            summary.2 += n("tolerated");
            if v["done"] == Value::Bool(true) {
                break Ok(n("final_nth"));
            }
            from = to + stride;
        };
        // Leave pcifab loaded and bound, and the log without the allocation reports.
        let _ = h.run(&format!(
            "[ -d /sys/module/pcifab ] || insmod {PCIFAB_KO}; dmesg -c >/dev/null"
        ));
        let last = r?;
        // A filter that let no fault point of the driver's own through would pass the sweep
        // without having failed anything.
        if summary.0 + summary.1 + summary.2 == 0 {
            return Err(format!(
                "{}: no fault point was injected ({attach}{depth_arg}): the sweep failed \
                 nothing",
                h.name
            ));
        }
        crate::say(&format!(
            "# {} ({attach}{depth_arg}{stride_arg}): fault points {first} to {} in {:.0} s: {} \
             failed steps, {} failed probes, {} tolerated; fail-nth {last} loads and binds",
            h.name,
            last.saturating_sub(stride),
            t.elapsed().as_secs_f64(),
            summary.0,
            summary.1,
            summary.2
        ));
        check_bound_pcifab(h)?;
        selftest_echo(h)
    })
}

/// A final normal use of the device: 20 echoes.
fn selftest_echo(h: &mut Host) -> Result<(), String> {
    selftest_json(h, "echo --count 20 --size 64", Duration::from_secs(60)).map(|_| ())
}

/// Steps of the driver's probe that its `probe_fault_step` parameter can fail
/// (`PROBE_STEPS` in `src/pcifab.rs`).
const PROBE_STEPS: u64 = 15;

/// Every step of the driver's probe failed once through its own `probe_fault_step`
/// parameter, in every host: nothing stays behind, and the step after the last binds. After
/// each step (and after the rmmod of the probe that completes) the emulator must see DMA
/// MRPC off and the DMA engine stopped and idle with no ring address: the memory they pointed
/// at was freed with the failed probe, so anything else lets the device write into it.
pub fn probe_steps(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        let mut failed_steps = 0u64;
        let mut done_at = None;
        for n in 1..=PROBE_STEPS + 1 {
            let o = h.run_timeout(
                &format!("pcifab-selftest probe-steps --module {PCIFAB_KO} --step {n}"),
                Duration::from_secs(120),
            )?;
            let v = report_line(&o.out, "probe-steps");
            if o.code != 0 {
                let _ = h.run(&format!("[ -d /sys/module/pcifab ] || insmod {PCIFAB_KO}"));
                return Err(format!(
                    "{}: probe-steps --step {n}: {}",
                    h.name,
                    o.out.trim()
                ));
            }
            failed_steps += v["failed_steps"].as_u64().unwrap_or(0);
            if let Some(d) = v["done_at"].as_u64() {
                done_at = Some(d);
            }
            let after = if v["done_at"].as_u64().is_some() {
                format!("the rmmod after probe completed (probe_fault_step={n})")
            } else {
                format!("probe failed at step {n}")
            };
            check_dma_quiet(&emu, &h.name, &after)?;
        }
        h.log_note(&format!(
            "probe-steps: {failed_steps} failed steps, done at {done_at:?}"
        ));
        let _ = h.run(&format!("[ -d /sys/module/pcifab ] || insmod {PCIFAB_KO}"));
        let mut c = Checks::new(&format!("{}: probe-steps", h.name));
        c.eq("steps failed and undone", PROBE_STEPS, failed_steps);
        c.eq(
            "first probe_fault_step that probe does not reach",
            Some(PROBE_STEPS + 1),
            done_at,
        );
        c.finish()?;
        check_bound_pcifab(h)?;
        selftest_echo(h)
    })
}

/// The emulator's view of host `host`'s MEP after `after`: DMA MRPC off with no address, the
/// DMA engine off, idle, with no ring and no interrupt.
fn check_dma_quiet(emu: &EmuControl, host: &str, after: &str) -> Result<(), String> {
    let v = emu.request(&format!("dma-state {host}"))?;
    let mut c = Checks::new(&format!("{host}: after {after}, the device's DMA"));
    c.eq("DMA MRPC on", Some(false), v["mrpc_dma_on"].as_bool());
    c.eq("DMA MRPC address", Some(0), v["mrpc_dma_addr"].as_u64());
    c.eq("DMA engine enabled", Some(false), v["engine_on"].as_bool());
    c.eq("DMA engine busy", Some(false), v["engine_busy"].as_bool());
    c.eq("DMA engine ring address", Some(0), v["ring"].as_u64());
    c.eq("DMA engine ring size", Some(0), v["ring_size"].as_u64());
    c.eq("DMA engine interrupt", Some(0), v["irq"].as_u64());
    c.finish()
}

/// DMA MRPC (and, where the firmware has one, the DMA engine) left armed by a previous
/// kernel, as after a kexec: the driver must turn them off at probe before its first
/// command, whose completion would otherwise go to memory it does not own.
pub fn stale_dma(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        h.run_ok("rmmod pcifab")?;
        check_dma_quiet(&emu, &h.name, "rmmod")?;
        let armed = emu.request(&format!("dma-arm {}", h.name))?;
        let v = emu.request(&format!("dma-state {}", h.name))?;
        let mut c = Checks::new(&format!("{}: dma-arm", h.name));
        c.eq(
            "DMA MRPC armed at the stale address",
            Some(true),
            v["stale_armed"].as_bool(),
        );
        c.finish()?;
        const LOGGED: &str = "dmesg | grep -c 'DMA MRPC found armed at probe' || true";
        let count = |o: &crate::fabric::Output| o.out.trim().parse::<u64>().unwrap_or(0);
        let logged_before = count(&h.run(LOGGED)?);
        let commands = emu.mrpc_commands(&h.name)?;
        let load = h.run(&format!("insmod {PCIFAB_KO}"))?;
        let v = emu.request(&format!("dma-state {}", h.name))?;
        let after = emu.mrpc_commands(&h.name)?;
        let logged = count(&h.run(LOGGED)?);
        let mut c = Checks::new(&format!("{}: probe after dma-arm", h.name));
        c.eq("insmod exit code", 0, load.code);
        if after <= commands {
            c.fail(format!(
                "the probe ran no MRPC command ({commands} before, {after} after)"
            ));
        }
        c.eq(
            "MRPC commands started while DMA MRPC pointed at the stale address",
            Some(0),
            v["stale_commands"].as_u64(),
        );
        c.eq(
            "DMA MRPC still at the stale address",
            Some(false),
            v["stale_armed"].as_bool(),
        );
        if armed["engine"].as_bool() == Some(true) && v["ring"].as_u64() == armed["addr"].as_u64() {
            c.fail(format!(
                "the DMA engine's ring is still at the stale address: {v}"
            ));
        }
        if armed["mrpc_dma"].as_bool() == Some(true) && logged <= logged_before {
            c.fail("the driver did not log that it found DMA MRPC armed".into());
        }
        c.finish()?;
        check_bound_pcifab(h)?;
        selftest_echo(h)
    })
}
