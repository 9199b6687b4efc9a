// SPDX-License-Identifier: GPL-2.0-only
//! The fabric manager across the guests: `pcifab-manager --executor driver` runs inside h0
//! (the fabric-manager host), requests go through the `pcifab request|release|queue|leases`
//! CLI there, and every change is checked from inside both guests and in the emulator.
//! Documentation/testing.rst ("The manager scenarios") lists what each one asserts.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::{
    ask, bar_pattern, check_invariants, check_world, compose_begin, emu_owners, emu_scrubs,
    expect_eq, fns_seen, json_line, manager_log, owners, owners_text, run_with_manager,
    settled_owners, start_manager, stop_manager, wait_owners, Checks, ClearFault, Owners, LOG,
    PIDFILE,
};
use crate::fabric::{EmuControl, Fabric, Host};

mod ha;
pub use ha::leader_host_powered_off;

/// The high-availability scenario (`--etcd` puts etcd into the guests only when it runs).
pub const HA_SCENARIO: &str =
    "manager: HA on etcd in the guests: the leader's host powered off, h1's standby takes over";

/// Failover settings of every scenario (seconds): short, so a host kill is noticed quickly.
const HOST_TIMEOUT_S: u64 = 3;
const RECLAIM_AFTER_S: u64 = 2;
/// Time-slice length of the time-sliced scenario. Each holder's checks (the world, its BAR
/// pattern) must fit in its slice: on the sanitizer kernel with two vCPUs on a busy
/// machine a hand-over and those checks took more than 12 s.
const SLICE_S: u64 = 30;
/// Lease of the priority-9 request, whose expiry hands its GPU over. It must outlast the
/// steps between its grant and the check of the queue R4 joins (the pre-emption's moves
/// included): on the sanitizer kernel with two vCPUs, 30 s did not.
const R3_LEASE_S: u64 = 60;
/// Pattern seeds written into BAR2 by the time-sliced scenario.
const SEED_H0: u64 = 0x5eed_0000;
const SEED_H1: u64 = 0x5eed_0001;
/// gpu0's telemetry as the configuration gives it (`telemetry` request arguments).
fn configured_telemetry(f: &Fabric, name: &str) -> Result<String, String> {
    let ep = f
        .expected
        .endpoint(name)
        .ok_or_else(|| format!("the configuration has no endpoint {name}"))?;
    Ok(format!(
        "{} {} {}",
        ep.temp_centi, ep.power_mw, ep.utilisation
    ))
}

/// PF and VF `k` of the configuration's endpoint `name` (gpu0: 0x0300.., gpu1: 0x0400..).
fn pdfid(f: &Fabric, name: &str, k: u32) -> u16 {
    let fallback = if name == "gpu0" { 0x0300 } else { 0x0400 };
    f.expected
        .endpoint(name)
        .map_or(fallback + k as u16, |e| e.pdfid(k))
}

/// The manager configuration for a scenario: hosts 0 and 1, one pool of gpu0 and gpu1 (VFs
/// from the inventory) in `mode`, telemetry every `telemetry_s` (0: off).
fn config_text(f: &Fabric, mode: &str, telemetry_s: u64) -> String {
    let (g0, g1) = (pdfid(f, "gpu0", 0), pdfid(f, "gpu1", 0));
    let devices = if mode == "time-slice" {
        format!("[[pools.devices]]\npf = {g0:#06x}\n")
    } else {
        format!(
            "[[pools.devices]]\npf = {g0:#06x}\nprofile = \"quarter\"\n\
             [[pools.devices]]\npf = {g1:#06x}\nprofile = \"quarter\"\n"
        )
    };
    format!(
        "[manager]\nhosts = {}\nmax_priority = 9\naging_s = 1000\ndefault_lease_s = 600\n\
         max_lease_s = 3600\nmax_functions_per_host = 4\n\n\
         [failover]\nhost_timeout_s = {HOST_TIMEOUT_S}\nreclaim_after_s = {RECLAIM_AFTER_S}\n\n\
         [telemetry]\ninterval_s = {telemetry_s}\nmax_temp_c = 90.0\nbad_samples = 2\n\n\
         [[pools]]\nname = \"gpus\"\nmode = \"{mode}\"\nslice_s = {SLICE_S}\n\n{devices}",
        f.expected.hosts.len()
    )
}

/// `pcifab ARGS --json` in the guest (h0; h1 for its own manager) through the daemon: (exit
/// code, the reply).
fn cli(h0: &mut Host, args: &str) -> Result<(i64, Value), String> {
    let o = h0.run(&format!("pcifab {args} --json"))?;
    let v = json_line(&o.out).map_err(|e| format!("{}: `pcifab {args} --json`: {e}", h0.name))?;
    Ok((o.code, v))
}

/// Like [`cli`] but the reply must be `{"ok":true,...}` with exit 0.
fn cli_ok(h0: &mut Host, args: &str) -> Result<Value, String> {
    let (code, v) = cli(h0, args)?;
    if code != 0 || v.get("ok") != Some(&Value::Bool(true)) {
        let log = manager_log(h0, 15);
        return Err(format!(
            "{}: `pcifab {args}`: expected exit 0 and {{\"ok\":true,...}}, got exit {code}: {v}\n\
             manager log:\n{log}",
            h0.name
        ));
    }
    Ok(v)
}

/// A request through the CLI; returns (id, granted, the reply).
fn request(h0: &mut Host, args: &str) -> Result<(u64, bool, Value), String> {
    let v = cli_ok(h0, &format!("request {args}"))?;
    let id = v["id"]
        .as_u64()
        .ok_or_else(|| format!("`pcifab request {args}`: no id in the reply {v}"))?;
    Ok((id, v["granted"] == Value::Bool(true), v))
}

fn lease_functions(v: &Value) -> Vec<String> {
    v["functions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn hexes(p: &[u16]) -> Vec<String> {
    p.iter().map(|x| format!("{x:#06x}")).collect()
}

/// Lease id -> its functions, from `pcifab leases --json`.
fn leases(h0: &mut Host) -> Result<Vec<(u64, Vec<String>)>, String> {
    let v = cli_ok(h0, "leases")?;
    Ok(v["leases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|l| (l["id"].as_u64().unwrap_or(0), lease_functions(l)))
                .collect()
        })
        .unwrap_or_default())
}

/// Queued request ids in rank order, from `pcifab queue --json`.
fn queue(h0: &mut Host) -> Result<Vec<u64>, String> {
    let v = cli_ok(h0, "queue")?;
    Ok(v["queue"]
        .as_array()
        .map(|a| a.iter().filter_map(|q| q["id"].as_u64()).collect())
        .unwrap_or_default())
}

/// (lease, kind) of every notice for `host`, in order.
fn notices(h0: &mut Host, host: usize) -> Result<Vec<(u64, String)>, String> {
    let v = ask(h0, &format!("{{\"op\":\"events\",\"host\":{host}}}"))?;
    Ok(v["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| {
                    (
                        n["lease"].as_u64().unwrap_or(0),
                        n["kind"].as_str().unwrap_or("?").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// `got` is `want` followed by nothing but more of the same lease's time-slice rotation
/// (slice-in and slice-out alternating on from `want`'s last notice).
fn rotation(want: &[(u64, &str)], got: Vec<(u64, String)>) -> Result<(), String> {
    let head = notes(want);
    if got.len() < head.len() || got[..head.len()] != head[..] {
        return Err(format!(
            "expected {head:?} (then only slice notices), got {got:?}"
        ));
    }
    let Some(&(lease, last)) = want.last() else {
        return Ok(());
    };
    let mut prev = last.to_string();
    for (id, kind) in &got[head.len()..] {
        let next = if prev == "slice-in" {
            "slice-out"
        } else {
            "slice-in"
        };
        if *id != lease || kind != next {
            return Err(format!(
                "expected {head:?} then only lease {lease}'s slices alternating, got {got:?}"
            ));
        }
        prev = kind.clone();
    }
    Ok(())
}

fn notes(v: &[(u64, &str)]) -> Vec<(u64, String)> {
    v.iter().map(|(i, k)| (*i, k.to_string())).collect()
}

/// Runs `body` with a fresh daemon in h0 (configuration `mode`, telemetry every
/// `telemetry_s`), starting from every function free; afterwards, whatever happened, stops
/// the daemon and frees every function; the body's error comes first.
fn with_manager(
    f: &mut Fabric,
    mode: &str,
    telemetry_s: u64,
    body: impl FnOnce(&mut Fabric) -> Result<(), String>,
) -> Result<(), String> {
    with_manager_and(f, mode, telemetry_s, "", body)
}

/// [`with_manager`] with `extra` appended to the configuration (`[api]`, principals).
fn with_manager_and(
    f: &mut Fabric,
    mode: &str,
    telemetry_s: u64,
    extra: &str,
    body: impl FnOnce(&mut Fabric) -> Result<(), String>,
) -> Result<(), String> {
    compose_begin(f)?;
    let cfg = format!("{}{extra}", config_text(f, mode, telemetry_s));
    run_with_manager(f, &cfg, 15, "every function free", body)?;
    check_world(
        f,
        &Owners::new(),
        "the end (daemon stopped, every function free)",
    )
}

// ----------------------------------------------------------------------- scenarios

/// Issue 6, test 1: four requests at three priorities on a hybrid pool of two GPUs with
/// four VFs each, in the order Documentation/manager.rst documents.
pub fn four_requests(f: &mut Fabric) -> Result<(), String> {
    with_manager(f, "hybrid", 0, |f| {
        let g0 = pdfid(f, "gpu0", 0);
        let g1 = pdfid(f, "gpu1", 0);
        let g1_vfs: Vec<u16> = (1..=4).map(|k| pdfid(f, "gpu1", k)).collect();

        // R1: h0, one whole GPU, priority 5: the first whole-free device, gpu0.
        let h0 = &mut f.hosts[0];
        let (r1, granted, v) = request(h0, "--gpus 1 --host 0 --priority 5 --duration 600")?;
        let mut c = Checks::new("R1 (h0, 1 GPU, priority 5)");
        c.eq("granted", true, granted);
        c.eq("functions", hexes(&[g0]), lease_functions(&v["lease"]));
        c.finish()?;
        check_world(f, &owners(&[(g0, 0)]), "R1 granted")?;

        // R2: h1, four VFs, priority 1, pre-emptible: gpu1's VFs (gpu0 is taken whole).
        let h0 = &mut f.hosts[0];
        let (r2, granted, v) = request(
            h0,
            "--vfs 4 --profile quarter --host 1 --priority 1 --duration 600 \
             --preemptible-by-higher",
        )?;
        let mut c = Checks::new("R2 (h1, 4 VFs, priority 1, pre-emptible)");
        c.eq("granted", true, granted);
        c.eq("functions", hexes(&g1_vfs), lease_functions(&v["lease"]));
        c.finish()?;
        let mut want = owners(&[(g0, 0)]);
        want.extend(g1_vfs.iter().map(|v| (*v, 1)));
        check_world(f, &want, "R2 granted")?;

        // R3: h0, one GPU, priority 9: nothing is free; R2 allows pre-emption: its VFs leave
        // h1, gpu1's PF goes to h0, R2 is queued again.
        let h0 = &mut f.hosts[0];
        let (r3, granted, v) = request(
            h0,
            &format!("--gpus 1 --host 0 --priority 9 --duration {R3_LEASE_S}"),
        )?;
        let mut c = Checks::new("R3 (h0, 1 GPU, priority 9)");
        c.eq("granted", true, granted);
        c.eq("functions", hexes(&[g1]), lease_functions(&v["lease"]));
        c.eq("queue after R3 (R2 pre-empted)", vec![r2], queue(h0)?);
        c.finish()?;

        // R4: h1, two VFs, priority 5: nothing free, nothing pre-emptible below 5: queued,
        // ahead of R2 (priority 1).
        let (r4, granted, v) = request(
            h0,
            "--vfs 2 --profile quarter --host 1 --priority 5 --duration 600",
        )?;
        let mut c = Checks::new("R4 (h1, 2 VFs, priority 5)");
        c.eq("granted", false, granted);
        c.eq("position", Some(0), v["position"].as_u64());
        c.eq("queue in rank order", vec![r4, r2], queue(h0)?);
        c.finish()?;
        check_world(
            f,
            &owners(&[(g0, 0), (g1, 0)]),
            "R3 granted (R2 pre-empted), R4 queued",
        )?;

        // R3 expires: gpu1 leaves h0; R4 gets two of its VFs; R2 (four VFs) still waits.
        let want = owners(&[(g0, 0), (g1_vfs[0], 1), (g1_vfs[1], 1)]);
        let took = wait_owners(f, &want, R3_LEASE_S + 30, "R3's lease expiring")?;
        f.hosts[0].log_note(&format!("hand-over at R3's expiry seen after {took:?}"));
        check_world(f, &want, "R3 expired, R4 granted")?;
        let h0 = &mut f.hosts[0];
        let mut c = Checks::new("after R3 expired");
        c.eq(
            "leases",
            vec![(r1, hexes(&[g0])), (r4, hexes(&[g1_vfs[0], g1_vfs[1]]))],
            leases(h0)?,
        );
        c.eq("queue", vec![r2], queue(h0)?);
        c.finish()?;

        // R4 released: R2 gets its four VFs back on h1.
        cli_ok(h0, &format!("release {r4}"))?;
        let mut want = owners(&[(g0, 0)]);
        want.extend(g1_vfs.iter().map(|v| (*v, 1)));
        check_world(f, &want, "R4 released, R2 granted again")?;
        let h0 = &mut f.hosts[0];
        expect(
            "leases after R4's release",
            vec![(r1, hexes(&[g0])), (r2, hexes(&g1_vfs))],
            leases(h0)?,
        )?;
        expect("queue after R4's release", Vec::<u64>::new(), queue(h0)?)?;
        cli_ok(h0, &format!("release {r1}"))?;
        cli_ok(h0, &format!("release {r2}"))?;
        check_world(f, &Owners::new(), "R1 and R2 released")?;

        // Each holder was told, in order.
        let h0 = &mut f.hosts[0];
        let mut c = Checks::new("notices");
        c.eq(
            "host 0",
            notes(&[
                (r1, "granted"),
                (r3, "granted"),
                (r3, "expired"),
                (r1, "released"),
            ]),
            notices(h0, 0)?,
        );
        c.eq(
            "host 1",
            notes(&[
                (r2, "granted"),
                (r2, "preempted"),
                (r4, "granted"),
                (r4, "released"),
                (r2, "granted"),
                (r2, "released"),
            ]),
            notices(h0, 1)?,
        );
        c.finish()
    })
}

fn expect<T: PartialEq + std::fmt::Debug>(what: &str, want: T, got: T) -> Result<(), String> {
    expect_eq(what, want, got)
}

/// The emulator's scrub count of `pdfid`.
fn scrubs(emu: &EmuControl, pdfid: u16) -> Result<u64, String> {
    emu_scrubs(emu, pdfid)?
        .ok_or_else(|| format!("emulator state has no scrub count for {pdfid:#06x}"))
}

/// BDF of `pdfid` in `h` (it must be visible there).
fn bdf_in(h: &mut Host, pdfid: u16) -> Result<String, String> {
    fns_seen(h)?
        .get(&pdfid)
        .map(|s| s.bdf.clone())
        .ok_or_else(|| format!("{}: {pdfid:#06x} is not visible", h.name))
}

/// Issue 6, test 2: a time-sliced GPU visits both hosts in turn, its memory scrubbed on
/// every hand-over.
pub fn time_sliced(f: &mut Fabric) -> Result<(), String> {
    with_manager(f, "time-slice", 0, |f| {
        let g0 = pdfid(f, "gpu0", 0);
        let e = f.expected.clone();
        let emu = f.emu();
        let h0 = &mut f.hosts[0];
        let (ra, granted, v) = request(h0, "--gpus 1 --host 0 --priority 5 --duration 600")?;
        let mut c = Checks::new("Ra (h0, 1 GPU, time-sliced pool)");
        c.eq("granted", true, granted);
        c.eq("functions", hexes(&[g0]), lease_functions(&v["lease"]));
        c.eq(
            "time_sliced",
            Some(true),
            v["lease"]["time_sliced"].as_bool(),
        );
        c.finish()?;
        check_world(f, &owners(&[(g0, 0)]), "Ra granted (gpu0 on h0)")?;
        let bdf = bdf_in(&mut f.hosts[0], g0)?;
        bar_pattern(
            &mut f.hosts[0],
            &e,
            &bdf,
            g0,
            &format!("--write {SEED_H0:#x}"),
        )?;
        let h0 = &mut f.hosts[0];
        let (rb, granted, v) = request(h0, "--gpus 1 --host 1 --priority 5 --duration 600")?;
        let mut c = Checks::new("Rb (h1, 1 GPU, time-sliced pool)");
        c.eq("granted (as the second sharer)", true, granted);
        c.eq(
            "resident (waits for its slice)",
            Some(false),
            v["lease"]["resident"][0].as_bool(),
        );
        c.finish()?;

        // Two hand-overs: h0 -> h1 -> h0. Each time the new holder must see zeros, not the
        // pattern the previous one left, and then leaves its own.
        for (to, seed) in [(1usize, SEED_H1), (0, SEED_H0)] {
            let before = scrubs(&emu, g0)?;
            let want = owners(&[(g0, to)]);
            let took = wait_owners(f, &want, SLICE_S + 45, "the time slice ending")?;
            f.hosts[0].log_note(&format!("slice hand-over to host {to} seen after {took:?}"));
            check_world(f, &want, &format!("the slice moving gpu0 to host {to}"))?;
            expect(
                "emulator scrubs of gpu0 on the hand-over",
                before + 1,
                scrubs(&emu, g0)?,
            )?;
            let h = &mut f.hosts[to];
            let bdf = bdf_in(h, g0)?;
            bar_pattern(h, &e, &bdf, g0, "--check-zero")?;
            bar_pattern(h, &e, &bdf, g0, &format!("--write {seed:#x}"))?;
        }
        let h0 = &mut f.hosts[0];
        // The slices go on while the checks above run: on a slow machine another hand-over
        // may have come since, which must continue the same rotation.
        let mut c = Checks::new("notices");
        if let Err(e) = rotation(
            &[(rb, "granted"), (rb, "slice-in"), (rb, "slice-out")],
            notices(h0, 1)?,
        ) {
            c.fail(format!("host 1: {e}"));
        }
        if let Err(e) = rotation(
            &[(ra, "granted"), (ra, "slice-out"), (ra, "slice-in")],
            notices(h0, 0)?,
        ) {
            c.fail(format!("host 0: {e}"));
        }
        c.finish()?;
        cli_ok(h0, &format!("release {ra}"))?;
        // The resident sharer left: the other one gets the device at once.
        check_world(f, &owners(&[(g0, 1)]), "Ra released (gpu0 to h1 at once)")?;
        let h1 = &mut f.hosts[1];
        let bdf = bdf_in(h1, g0)?;
        bar_pattern(h1, &e, &bdf, g0, "--check-zero")?;
        cli_ok(&mut f.hosts[0], &format!("release {rb}"))?;
        check_world(f, &Owners::new(), "Rb released")
    })
}

/// The parts of the daemon's state that must survive a restart unchanged.
pub fn durable_state(h0: &mut Host) -> Result<Value, String> {
    let v = ask(h0, "{\"op\":\"state\"}")?;
    let s = &v["state"];
    Ok(serde_json::json!({
        "leases": s["leases"],
        "queue": s["queue"],
        "holders": s["holders"],
        "devices": s["devices"],
        "next_id": s["next_id"],
    }))
}

/// Issue 6, test 3: the daemon killed with SIGKILL and restarted mid-lease loses nothing.
pub fn kill_9(f: &mut Fabric) -> Result<(), String> {
    with_manager(f, "hybrid", 0, |f| {
        let g0 = pdfid(f, "gpu0", 0);
        let v = |k| pdfid(f, "gpu1", k);
        let (v1, v2, v3, v4) = (v(1), v(2), v(3), v(4));
        let h0 = &mut f.hosts[0];
        let (r1, g, _) = request(h0, "--gpus 1 --host 0 --priority 5 --duration 600")?;
        expect("R1 (h0, 1 GPU) granted", true, g)?;
        let (r2, g, _) = request(h0, "--vfs 2 --host 1 --priority 3 --duration 600")?;
        expect("R2 (h1, 2 VFs) granted", true, g)?;
        // h1 would hold six functions: queued behind R4.
        let (r3, g, _) = request(h0, "--vfs 4 --host 1 --priority 2 --duration 600")?;
        expect("R3 (h1, 4 VFs) granted", false, g)?;
        // gpu1 is partitioned, gpu0 taken: queued.
        let (r4, g, _) = request(h0, "--gpus 1 --host 0 --priority 4 --duration 600")?;
        expect("R4 (h0, 1 GPU) granted", false, g)?;
        let want = owners(&[(g0, 0), (v1, 1), (v2, 1)]);
        check_world(f, &want, "two leases granted, two requests queued")?;
        let h0 = &mut f.hosts[0];
        expect("queue before the kill", vec![r4, r3], queue(h0)?)?;
        let leases_before = leases(h0)?;
        let state_before = durable_state(h0)?;

        stop_manager(h0, "KILL")?;
        h0.log_note("pcifab-manager killed with SIGKILL");
        // Nothing happens to the fabric while no manager runs: watched for 2 s.
        let emu = f.emu();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            let (now, _) =
                emu_owners(&emu, &f.expected).map_err(|e| format!("while no manager runs: {e}"))?;
            if now != want {
                return Err(format!(
                    "while no manager runs: emulator bindings changed after {:?}: expected {}, \
                     got {}",
                    t.elapsed(),
                    owners_text(&f.expected, &want),
                    owners_text(&f.expected, &now)
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        check_world(f, &want, "the manager killed (-9)")?;
        let h0 = &mut f.hosts[0];
        start_manager(h0, None, true)?;
        let mut c = Checks::new("after the restart");
        c.eq_json("durable state", state_before, durable_state(h0)?);
        c.eq("leases", leases_before, leases(h0)?);
        c.eq("queue", vec![r4, r3], queue(h0)?);
        let fixed = h0.run(&format!("grep -c 'differs from the stored state' {LOG}"))?;
        c.eq(
            "restarts that had to fix the fabric (log lines)",
            "0",
            fixed.out.trim(),
        );
        c.finish()?;
        check_world(f, &want, "the manager restarted")?;

        // The queue still works: R2 released; gpu1 is whole again and R4 (priority 4) ranks
        // before R3 (priority 2): R4 gets gpu1's PF, R3 still waits.
        let g1 = pdfid(f, "gpu1", 0);
        cli_ok(&mut f.hosts[0], &format!("release {r2}"))?;
        let want = owners(&[(g0, 0), (g1, 0)]);
        check_world(f, &want, "R2 released after the restart, R4 granted")?;
        let h0 = &mut f.hosts[0];
        expect(
            "leases",
            vec![(r1, hexes(&[g0])), (r4, hexes(&[g1]))],
            leases(h0)?,
        )?;
        expect("queue", vec![r3], queue(h0)?)?;

        // Killed again while it carries out a release (R4's gpu1 leaves h0, then R3's four
        // VFs go to h1): the kill lands as soon as the daemon logged the unbind, i.e. after
        // the release was committed and before its binds ran (each takes about a second).
        // The restart brings the fabric to what was committed.
        // Every firmware command of h0's MEP (the manager's) takes a second meanwhile, so on
        // any kernel, however slow, the kill lands while most of the release is still owed.
        f.emu()
            .request("fault h0 delay 1000")
            .map_err(|e| format!("slowing h0's firmware for the kill: {e}"))?;
        // Cleared on every path: a failure here must not slow the scenarios after it.
        let _clear = ClearFault(f.emu(), "h0");
        let h0 = &mut f.hosts[0];
        h0.run_ok(&format!(
            "rm -f /tmp/release.out; n0=$(wc -l < {LOG}); echo $n0 > /tmp/release.n0\n\
             setsid sh -c 'pcifab release {r4} --json; echo \"rc $?\"' </dev/null \
             >/tmp/release.out 2>&1 &\n\
             echo $! > /tmp/release.pid"
        ))?;
        // The release is committed before the daemon acts on it; its first action unbinds
        // gpu1 from h0. The kill lands as soon as the emulator shows that unbind in flight
        // or done: h0 removes the device before the firmware command, so the firmware's
        // part can be over between two polls. The four binds after it take a second each.
        let emu = f.emu();
        let t = Instant::now();
        loop {
            let v = emu.request("state")?;
            let started = v["bindings"].as_array().is_some_and(|a| {
                a.iter().any(|b| {
                    b["pdfid"] == g1 && (b["busy"] == Value::Bool(true) || b["owner"] != "h0")
                })
            });
            if started {
                break;
            }
            if t.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "the release of R4 never unbound gpu1 within 20 s; emulator \
                     bindings: {}",
                    v["bindings"]
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let h0 = &mut f.hosts[0];
        let o = h0.run_ok_timeout(
            &format!(
                "p=$(cat {PIDFILE}); kill -9 $p && echo killed-alive\n\
                 rm -f {PIDFILE}\n\
                 i=0; while kill -0 $p 2>/dev/null || kill -0 $(cat /tmp/release.pid) 2>/dev/null; do\n\
                   [ $i -ge 300 ] && {{ echo 'daemon or release client still running 30 s after the kill'; exit 1; }}\n\
                   sleep 0.1; i=$((i+1))\n\
                 done\n\
                 echo done-before-kill $(tail -n +$(($(cat /tmp/release.n0)+1)) {LOG} | grep -c 'done: ')\n\
                 cat /tmp/release.out"
            ),
            Duration::from_secs(60),
        )?;
        f.emu()
            .request("fault clear h0")
            .map_err(|e| format!("after the kill: {e}"))?;
        let h0 = &mut f.hosts[0];
        h0.log_note(&format!("killed during a release: {}", o.trim()));
        let done_before_kill: usize = o
            .lines()
            .find_map(|l| l.strip_prefix("done-before-kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(usize::MAX);
        let client_rc = o
            .lines()
            .find_map(|l| l.strip_prefix("rc "))
            .unwrap_or("?")
            .trim()
            .to_string();
        let mut c = Checks::new("kill -9 during the release of R4");
        c.eq("daemon alive when killed", true, o.contains("killed-alive"));
        c.eq(
            "actions (unbind gpu1, bind four VFs) the daemon logged done before the kill",
            true,
            done_before_kill < 5,
        );
        // The daemon answers a release after carrying it out: killed mid-way, it never did.
        if client_rc == "0" || client_rc == "?" {
            c.fail(format!(
                "`pcifab release {r4}`: expected a failing exit code (no answer from the \
                 killed daemon), got {client_rc:?}"
            ));
        }
        c.finish()?;
        // The fabric as the killed daemon left it: not yet the release's outcome.
        let left = settled_owners(
            &emu,
            &f.expected,
            Duration::from_secs(20),
            Duration::from_millis(200),
        )
        .map_err(|e| format!("after the kill during the release: {e}"))?;
        let missing = usize::from(left.contains_key(&g1))
            + [v1, v2, v3, v4]
                .iter()
                .filter(|v| left.get(v) != Some(&1))
                .count();
        let h0 = &mut f.hosts[0];
        h0.log_note(&format!(
            "fabric left by the killed daemon: {} ({missing} action(s) of the release not done)",
            owners_text(&f.expected, &left)
        ));
        expect(
            "actions the release still owed after the kill (it was cut short)",
            true,
            missing > 0,
        )?;
        let n0 = h0.run_ok(&format!("wc -l < {LOG}"))?.trim().to_string();
        start_manager(h0, None, true)?;
        let st = durable_state(h0)?;
        let holders: Owners = st["holders"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64()? as usize)))
                    .collect()
            })
            .unwrap_or_default();
        let fixed = h0.run_ok(&format!(
            "tail -n +$(({n0}+1)) {LOG} | grep 'action(s) to fix it' || true"
        ))?;
        h0.log_note(&format!(
            "restart after a kill during a release: {}",
            fixed.trim()
        ));
        expect(
            "the restart's repair (daemon log)",
            format!(
                "pcifab-manager: the fabric differs from the stored state; {missing} action(s) \
                 to fix it"
            ),
            fixed.trim().to_string(),
        )?;
        let want = owners(&[(g0, 0), (v1, 1), (v2, 1), (v3, 1), (v4, 1)]);
        expect(
            "committed bindings after the release (R4 ended, R3 granted gpu1's VFs)",
            owners_text(&f.expected, &want),
            owners_text(&f.expected, &holders),
        )?;
        check_world(
            f,
            &want,
            "restart after a kill during a release (fabric = committed state)",
        )?;
        let h0 = &mut f.hosts[0];
        expect(
            "queue after the second restart",
            Vec::<u64>::new(),
            queue(h0)?,
        )?;
        expect(
            "leases after the second restart",
            vec![(r1, hexes(&[g0])), (r3, hexes(&[v1, v2, v3, v4]))],
            leases(h0)?,
        )?;
        Ok(())
    })
}

/// Issue 6, test 5: an endpoint fails (its telemetry over the threshold in the emulator):
/// it leaves the pool and its lease moves to the healthy GPU.
pub fn endpoint_failure(f: &mut Fabric) -> Result<(), String> {
    with_manager(f, "hybrid", 1, |f| {
        let g0 = pdfid(f, "gpu0", 0);
        let g1 = pdfid(f, "gpu1", 0);
        let emu = f.emu();
        let h0 = &mut f.hosts[0];
        let (r1, g, v) = request(h0, "--gpus 1 --host 1 --priority 5 --duration 600")?;
        expect("R1 (h1, 1 GPU) granted", true, g)?;
        expect("R1's functions", hexes(&[g0]), lease_functions(&v["lease"]))?;
        check_world(f, &owners(&[(g0, 1)]), "R1 granted (gpu0 on h1)")?;

        // PAX firmware reports no per-function telemetry: there gpu0 fails by its link going
        // down, which the manager reads from the inventory. With pcifab's extension it
        // overheats: 99 C, above max_temp_c 90, two polls in a row.
        let pax = f.dialect() == crate::config::Dialect::Pax;
        let port0 = f
            .expected
            .endpoints
            .iter()
            .find(|ep| ep.name == "gpu0")
            .map(|ep| ep.port)
            .ok_or("the configuration has no gpu0")?;
        if pax {
            emu.request(&format!("link {port0} down"))?;
        } else {
            emu.request(&format!("telemetry {g0:#06x} 9900 250000 100"))?;
        }
        let r = (|| {
            let want = owners(&[(g1, 1)]);
            let took = wait_owners(f, &want, 20, "gpu0 overheating")?;
            f.hosts[0].log_note(&format!("lease moved {took:?} after the fault"));
            check_world(f, &want, "gpu0 unhealthy, R1 moved to gpu1")?;
            let h0 = &mut f.hosts[0];
            let pool = ask(h0, "{\"op\":\"pool\"}")?;
            let d0 = &pool["devices"][0];
            let mut c = Checks::new("pool after the fault");
            c.eq("gpu0 healthy", Some(false), d0["healthy"].as_bool());
            let reason = d0["reason"].as_str().unwrap_or("");
            if pax && !reason.contains("link down") {
                c.fail(format!(
                    "gpu0 reason: expected \"link down\", got {reason:?}"
                ));
            }
            if !pax && (!reason.contains("telemetry") || !reason.contains("99.00")) {
                c.fail(format!(
                    "gpu0 reason: expected the telemetry reading (99.00 C), got {reason:?}"
                ));
            }
            c.eq("R1", vec![(r1, hexes(&[g1]))], leases(h0)?);
            c.eq(
                "host 1 notices",
                notes(&[(r1, "granted"), (r1, "moved")]),
                notices(h0, 1)?,
            );
            c.finish()?;
            // Out of the pool: a request for a GPU waits although gpu0 is free.
            let (r2, g, _) = request(h0, "--gpus 1 --host 0 --priority 5 --duration 600")?;
            expect("R2 (h0, 1 GPU) granted while gpu0 is out", false, g)?;
            Ok::<u64, String>(r2)
        })();
        // Link up again (PAX) or cooled down: one good poll puts gpu0 back; R2 gets it.
        if pax {
            emu.request(&format!("link {port0} up"))?;
        } else {
            let normal = configured_telemetry(f, "gpu0")?;
            emu.request(&format!("telemetry {g0:#06x} {normal}"))?;
        }
        let r2 = r?;
        let want = owners(&[(g1, 1), (g0, 0)]);
        wait_owners(f, &want, 20, "gpu0 back in the pool")?;
        check_world(f, &want, "gpu0 healthy again, R2 granted")?;
        let h0 = &mut f.hosts[0];
        let pool = ask(h0, "{\"op\":\"pool\"}")?;
        expect(
            "gpu0 healthy again",
            Some(true),
            pool["devices"][0]["healthy"].as_bool(),
        )?;
        cli_ok(h0, &format!("release {r1}"))?;
        cli_ok(h0, &format!("release {r2}"))?;
        check_world(f, &Owners::new(), "R1 and R2 released")
    })
}

/// The emulator's link state of `host`'s upstream port.
fn host_link(emu: &EmuControl, host: &str) -> Result<String, String> {
    let v = emu.request("state")?;
    v["ports"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|p| p["type"] == "host" && p["name"] == host)
                .and_then(|p| p["link"].as_str())
        })
        .map(str::to_string)
        .ok_or_else(|| format!("emulator state has no host port for {host}: {v}"))
}

/// Issue 6, test 4: host h1's QEMU is killed (SIGKILL): its upstream link goes down, the
/// manager declares it down after host_timeout_s, reclaims its GPUs reclaim_after_s later
/// and a queued request of h0 gets one. Then h1 boots again for the scenarios after this.
pub fn host_killed(f: &mut Fabric) -> Result<(), String> {
    let r = with_manager(f, "hybrid", 0, |f| {
        let g0 = pdfid(f, "gpu0", 0);
        let g1 = pdfid(f, "gpu1", 0);
        let emu = f.emu();
        let h0 = &mut f.hosts[0];
        let (r1, g, _) = request(h0, "--gpus 2 --host 1 --priority 5 --duration 600")?;
        expect("R1 (h1, 2 GPUs) granted", true, g)?;
        let (r2, g, _) = request(h0, "--gpus 1 --host 0 --priority 5 --duration 600")?;
        expect("R2 (h0, 1 GPU) granted", false, g)?;
        check_world(f, &owners(&[(g0, 1), (g1, 1)]), "R1 granted, R2 queued")?;
        let h1_name = f.hosts[1].name.clone();
        expect(
            "h1's upstream link",
            "up".to_string(),
            host_link(&emu, &h1_name)?,
        )?;

        f.hosts[1].kill_qemu()?;
        let killed = Instant::now();
        // The emulator notices the MEP client going and takes the link down.
        loop {
            if host_link(&emu, &h1_name)? == "down" {
                break;
            }
            if killed.elapsed() > Duration::from_secs(5) {
                return Err("h1's upstream link: expected down within 5 s of the kill".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        check_invariants(&emu, "h1 killed")?;
        let limit = HOST_TIMEOUT_S + RECLAIM_AFTER_S + 20;
        let want = owners(&[(g0, 0)]);
        wait_owners(f, &want, limit, "h1's GPUs reclaimed and R2 granted")?;
        let took = killed.elapsed();
        f.hosts[0].log_note(&format!("reclaimed and re-granted {took:?} after the kill"));
        if took < Duration::from_secs(HOST_TIMEOUT_S) {
            return Err(format!(
                "h1's GPUs were reclaimed {took:?} after the kill, before host_timeout_s \
                 ({HOST_TIMEOUT_S} s) had passed"
            ));
        }
        check_world(f, &want, "h1's GPUs reclaimed, R2 granted")?;
        let h0 = &mut f.hosts[0];
        let mut c = Checks::new("after the reclaim");
        c.eq("leases", vec![(r2, hexes(&[g0]))], leases(h0)?);
        c.eq("queue", Vec::<u64>::new(), queue(h0)?);
        c.eq(
            "host 1 notices",
            notes(&[(r1, "granted"), (r1, "reclaimed")]),
            notices(h0, 1)?,
        );
        let pool = ask(h0, "{\"op\":\"pool\"}")?;
        if !pool["hosts"]["1"]["down_since"].is_u64() {
            c.fail(format!(
                "host 1: expected down (down_since set), got {}",
                pool["hosts"]["1"]
            ));
        }
        c.finish()?;
        cli_ok(h0, &format!("release {r2}"))?;
        check_world(f, &Owners::new(), "R2 released")
    });
    // Bring h1 back for the scenarios after this one, whatever happened.
    let reboot = start_again(f, 1);
    r?;
    reboot?;
    compose_begin(f)
}

/// The API's port in the test world.
const API_PORT: u16 = 8443;

/// `pcifab` from host `h` to the manager's network API as `who` (its certificate).
fn net_cli(h: &mut Host, url: &str, who: Option<&str>, args: &str) -> Result<(i64, Value), String> {
    let d = crate::tls::GUEST_DIR;
    let cert = who
        .map(|w| format!(" --cert {d}/{w}.crt --key {d}/{w}.key"))
        .unwrap_or_default();
    let cmd = format!("pcifab --manager {url} --ca {d}/ca.crt{cert} {args} --json");
    let o = h.run(&cmd)?;
    let v = json_line(&o.out).map_err(|e| format!("{}: `{cmd}`: {e}", h.name))?;
    Ok((o.code, v))
}

/// A refusal: exit 3 and an error naming the HTTP status.
fn refused_with(what: &str, status: &str, (code, v): (i64, Value)) -> Result<(), String> {
    let msg = v["error"]["message"].as_str().unwrap_or("");
    if code != 3 || !msg.contains(status) {
        return Err(format!(
            "{what}: expected exit 3 and a {status} refusal, got exit {code}: {v}"
        ));
    }
    Ok(())
}

/// Requests from h1 over the management network: h1's tenant gets a GPU for h1 through
/// the HTTPS API with its client certificate, and is refused (403, nothing changes) when it
/// tries to release h0's lease or compose onto h0; a reader sees everything and changes
/// nothing; no certificate is a 401.
pub fn network_api(f: &mut Fabric) -> Result<(), String> {
    f.tls_material(&["h1-job", "auditor"])?;
    let url = format!("https://{}:{API_PORT}", f.manager_addr(1)?);
    let d = crate::tls::GUEST_DIR;
    let extra = format!(
        "\n[api]\nlisten = \"0.0.0.0:{API_PORT}\"\ncert = \"{d}/manager.crt\"\n\
         key = \"{d}/manager.key\"\nclient_ca = \"{d}/ca.crt\"\n\n\
         [[principals]]\nname = \"h1-job\"\nrole = \"tenant\"\nhosts = [1]\n\n\
         [[principals]]\nname = \"auditor\"\nrole = \"reader\"\n"
    );
    with_manager_and(f, "hybrid", 0, &extra, |f| {
        let h1 = &mut f.hosts[1];
        let (code, v) = net_cli(
            h1,
            &url,
            Some("h1-job"),
            "request --gpus 1 --host 1 --priority 5 --duration 600",
        )?;
        if code != 0 || v["granted"] != Value::Bool(true) {
            return Err(format!(
                "h1's tenant asking for a GPU for h1 over the network: expected exit 0 and \
                 granted, got exit {code}: {v}"
            ));
        }
        let r1 = v["id"].as_u64().ok_or("no id in the reply")?;
        let mut c = Checks::new("h1's lease (over the network)");
        c.eq("owner", Some("h1-job"), v["lease"]["owner"].as_str());
        c.eq("host", Some(1), v["lease"]["host"].as_u64());
        c.finish()?;
        let f1 = lease_functions(&v["lease"]);
        let g1 = u16::from_str_radix(f1.first().map_or("", |s| &s[2..]), 16)
            .map_err(|e| format!("the lease's function {f1:?}: {e}"))?;
        check_world(
            f,
            &owners(&[(g1, 1)]),
            "h1's request granted over the network",
        )?;

        // h0's root asks over the local socket.
        let (r0, granted, v0) = request(
            &mut f.hosts[0],
            "--gpus 1 --host 0 --priority 5 --duration 600",
        )?;
        expect("h0's request granted", true, granted)?;
        let g0 = u16::from_str_radix(
            lease_functions(&v0["lease"])
                .first()
                .map_or("", |s| &s[2..]),
            16,
        )
        .map_err(|e| format!("h0's lease: {e}"))?;
        let both = owners(&[(g1, 1), (g0, 0)]);
        check_world(f, &both, "h0's request granted over the socket")?;

        // h1's tenant may not release h0's lease, nor compose onto h0; a reader may not
        // request; no certificate at all is not a principal. Nothing changes.
        let h1 = &mut f.hosts[1];
        refused_with(
            "h1's tenant releasing h0's lease",
            "403",
            net_cli(h1, &url, Some("h1-job"), &format!("release {r0}"))?,
        )?;
        refused_with(
            "h1's tenant asking for a GPU for h0",
            "403",
            net_cli(
                h1,
                &url,
                Some("h1-job"),
                "request --gpus 1 --host 0 --priority 9 --duration 60",
            )?,
        )?;
        refused_with(
            "h1's tenant composing h0's zone",
            "403",
            net_cli(
                h1,
                &url,
                Some("h1-job"),
                &format!("compose 0 {g0:#06x} {g1:#06x}"),
            )?,
        )?;
        refused_with(
            "a reader asking for a GPU",
            "403",
            net_cli(
                h1,
                &url,
                Some("auditor"),
                "request --gpus 1 --host 1 --priority 9 --duration 60",
            )?,
        )?;
        refused_with(
            "no client certificate",
            "401",
            net_cli(h1, &url, None, "queue")?,
        )?;
        check_world(f, &both, "after the refused requests")?;

        // What each sees: the reader both leases, the tenant its own; the tenant's notices.
        let h1 = &mut f.hosts[1];
        let ids = |v: &Value| -> Vec<u64> {
            v["leases"]
                .as_array()
                .map(|a| a.iter().filter_map(|l| l["id"].as_u64()).collect())
                .unwrap_or_default()
        };
        let (_, all) = net_cli(h1, &url, Some("auditor"), "leases")?;
        let (_, own) = net_cli(h1, &url, Some("h1-job"), "leases")?;
        let (_, ev) = net_cli(h1, &url, Some("h1-job"), "events --host 1")?;
        let mut c = Checks::new("views over the network");
        c.eq("the reader's leases", vec![r1, r0], ids(&all));
        c.eq("the tenant's leases", vec![r1], ids(&own));
        c.eq(
            "the tenant's notices",
            vec![(r1, "granted".to_string())],
            ev["events"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|n| {
                            (
                                n["lease"].as_u64().unwrap_or(0),
                                n["kind"].as_str().unwrap_or("").to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
        );
        c.finish()?;
        // `top` from h1 through the manager: a reader sees the pool's functions and who
        // holds them; a tenant may not read the telemetry.
        let (code, top) = net_cli(h1, &url, Some("auditor"), "top --count 1")?;
        let holder = |f: u16| -> Option<u64> {
            top["functions"].as_array().and_then(|a| {
                a.iter()
                    .find(|x| x["pdfid"] == format!("{f:#06x}"))
                    .and_then(|x| x["host"].as_u64())
            })
        };
        let mut c = Checks::new("top through the manager");
        c.eq("exit", 0, code);
        c.eq(
            "schema",
            Some("pcifab/manager-top/v1"),
            top["schema"].as_str(),
        );
        c.eq("h1's GPU", Some(1), holder(g1));
        c.eq("h0's GPU", Some(0), holder(g0));
        c.finish()?;
        refused_with(
            "h1's tenant reading the manager's telemetry",
            "403",
            net_cli(h1, &url, Some("h1-job"), "top --count 1")?,
        )?;

        // The tenant releases its own lease: h1's GPU goes, h0's stays.
        let (code, v) = net_cli(h1, &url, Some("h1-job"), &format!("release {r1}"))?;
        if code != 0 {
            return Err(format!("h1's tenant releasing its lease: exit {code}: {v}"));
        }
        check_world(
            f,
            &owners(&[(g0, 0)]),
            "h1's lease released over the network",
        )?;
        // The tenant composes its own zone: the GPU named comes back to h1, and goes again
        // when it names none.
        let h1 = &mut f.hosts[1];
        let (code, v) = net_cli(h1, &url, Some("h1-job"), &format!("compose 1 {g1:#06x}"))?;
        if code != 0 || v["functions"] != serde_json::json!([format!("{g1:#06x}")]) {
            return Err(format!(
                "h1's tenant composing h1 with {g1:#06x}: expected exit 0 and the function, \
                 got exit {code}: {v}"
            ));
        }
        check_world(f, &both, "h1's zone composed over the network")?;
        let h1 = &mut f.hosts[1];
        let (code, v) = net_cli(h1, &url, Some("h1-job"), "compose 1")?;
        if code != 0 {
            return Err(format!("h1's tenant emptying h1's zone: exit {code}: {v}"));
        }
        check_world(f, &owners(&[(g0, 0)]), "h1's zone emptied over the network")?;
        // Every refusal is in the daemon's log with the principal.
        let h0 = &mut f.hosts[0];
        let logged = h0.run(&format!("grep -c 'refused' {LOG}"))?;
        let n: usize = logged.out.trim().parse().unwrap_or(0);
        if n < 6 {
            return Err(format!(
                "the manager logged {n} refusals, expected the 6 made:\n{}",
                manager_log(h0, 20)
            ));
        }
        cli_ok(h0, &format!("release {r0}"))?;
        Ok(())
    })
}

/// Starts host `k` again if a bench or scenario stopped it, then waits (up to 10 s) until
/// its upstream link is up in the emulator.
pub fn start_again(f: &mut Fabric, k: usize) -> Result<(), String> {
    if f.hosts[k].is_dead() {
        let t = f.hosts[k].reboot()?;
        f.hosts[k].log_note(&format!("rebooted in {t:?}"));
    }
    let emu = f.emu();
    let name = f.hosts[k].name.clone();
    let t = Instant::now();
    while host_link(&emu, &name)? != "up" {
        if t.elapsed() > Duration::from_secs(10) {
            return Err(format!("{name}: its upstream link is not up after 10 s"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The microseconds of one `pcifab-selftest time` line.
fn request_us(line: &str) -> Result<f64, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
        format!("h1: a timing line is not pcifab-selftest time's JSON ({e}): {line:?}")
    })?;
    match (v["us"].as_u64(), v["code"].as_i64()) {
        (Some(us), Some(0)) => Ok(us as f64),
        _ => Err(format!(
            "h1: a timing line without us or with a failed command: {line:?}"
        )),
    }
}

/// Request round trips of `make bench`'s manager figure.
pub const BENCH_REQUESTS: usize = 200;

/// `make bench`: [`BENCH_REQUESTS`] requests for a GPU made on h1 with `pcifab --manager`
/// over the management network, each timed in h1 by `pcifab-selftest time` (the monotonic
/// clock, us) from the command's start to its exit with the grant (TLS handshake, the API,
/// the decision, the bind command), then released (untimed), after one more request made
/// the same way right after the manager's start.
/// Returns the times in ms of the [`BENCH_REQUESTS`] and of that first one: about 1.3 s
/// under TCG, the first run of the TLS and HTTP code in both guests (not ARP: a ping just
/// before takes 50 ms; natively the first request is as fast as the rest).
pub fn bench_requests(f: &mut Fabric) -> Result<(Vec<f64>, f64), String> {
    if f.hosts.len() < 2 {
        return Err("the manager bench needs h1: boot two hosts".into());
    }
    start_again(f, 1)?;
    f.tls_material(&["h1-job"])?;
    let url = format!("https://{}:{API_PORT}", f.manager_addr(1)?);
    let d = crate::tls::GUEST_DIR;
    let extra = format!(
        "\n[api]\nlisten = \"0.0.0.0:{API_PORT}\"\ncert = \"{d}/manager.crt\"\n\
         key = \"{d}/manager.key\"\nclient_ca = \"{d}/ca.crt\"\n\n\
         [[principals]]\nname = \"h1-job\"\nrole = \"tenant\"\nhosts = [1]\n"
    );
    let mut times = Vec::new();
    with_manager_and(f, "hybrid", 0, &extra, |f| {
        let h1 = &mut f.hosts[1];
        let net = format!(
            "pcifab --manager {url} --ca {d}/ca.crt --cert {d}/h1-job.crt --key {d}/h1-job.key"
        );
        let o = h1.run_ok_timeout(
            &format!(
                "for i in $(seq 0 {BENCH_REQUESTS}); do\n\
                   pcifab-selftest time -- {net} request --gpus 1 --host 1 --priority 5 \
                     --duration 600 --json > /tmp/bench-req.json 2> /tmp/bench-time.json \
                     || {{ cat /tmp/bench-req.json /tmp/bench-time.json; exit 1; }}\n\
                   grep -q '\"granted\":true' /tmp/bench-req.json || {{ echo 'not granted:'; cat /tmp/bench-req.json; exit 1; }}\n\
                   id=$(sed -n 's/.*\"id\":\\([0-9]*\\),\"lease\".*/\\1/p' /tmp/bench-req.json)\n\
                   [ -n \"$id\" ] || {{ echo 'no id in:'; cat /tmp/bench-req.json; exit 1; }}\n\
                   echo \"t $(grep '^{{\"test\":\"time\"' /tmp/bench-time.json)\"\n\
                   {net} release $id >/dev/null || exit 1\n\
                 done"
            ),
            Duration::from_secs(1800),
        )?;
        for l in o.lines().filter_map(|l| l.strip_prefix("t ")) {
            times.push(request_us(l)? / 1000.0);
        }
        if times.len() != BENCH_REQUESTS + 1 {
            return Err(format!(
                "h1: {} timed requests of {}:\n{o}",
                times.len(),
                BENCH_REQUESTS + 1
            ));
        }
        Ok(())
    })?;
    let first = times.remove(0);
    Ok((times, first))
}

#[cfg(test)]
mod tests {
    use super::request_us;

    #[test]
    fn request_time_from_the_selftest_line() {
        assert_eq!(
            request_us("{\"test\":\"time\",\"us\":61234,\"code\":0}"),
            Ok(61234.0)
        );
        // A failed command, a line without the time, or no JSON at all is an error.
        assert!(request_us("{\"test\":\"time\",\"us\":5,\"code\":1}").is_err());
        assert!(request_us("{\"test\":\"time\",\"code\":0}").is_err());
        assert!(request_us("").is_err());
    }
}
