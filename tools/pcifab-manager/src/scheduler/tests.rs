// SPDX-License-Identifier: GPL-2.0-only

//! The incremental pass against the full scan (the reference model) on seeded random
//! workloads: the same replies, grants, actions and notices, in the same order.

use super::*;
use crate::bench::Rng;
use crate::config::{DeviceConfig, ManagerConfig, PoolConfig, TenantConfig};

/// A random small fabric: 1-3 pools of mixed modes, 1-5 devices of 0-4 VFs each, tight
/// host limits, fast aging, 1-3 tenants with weights and sometimes quotas.
fn random_config(rng: &mut Rng) -> Config {
    let modes = [Mode::Whole, Mode::Partition, Mode::TimeSlice, Mode::Hybrid];
    let mut pools = Vec::new();
    let mut next = 0x0100u16;
    for p in 0..1 + rng.below(3) {
        let mode = modes[rng.below(4) as usize];
        let devices = (0..1 + rng.below(5))
            .map(|_| {
                let pf = next;
                next += 8;
                let nvf = if mode == Mode::Partition || mode == Mode::Hybrid {
                    1 + rng.below(4) as u16
                } else {
                    rng.below(3) as u16
                };
                DeviceConfig {
                    pf,
                    vfs: (1..=nvf).map(|v| pf + v).collect(),
                    profile: ["a", "b"][rng.below(2) as usize].into(),
                }
            })
            .collect();
        pools.push(PoolConfig {
            name: format!("p{p}"),
            mode,
            slice_s: 1 + rng.below(20),
            max_sharers: 1 + rng.below(3) as usize,
            scrub: mode == Mode::Whole && rng.below(2) == 0,
            principals: Vec::new(),
            devices,
        });
    }
    let tenants = (0..rng.below(4))
        .map(|i| TenantConfig {
            name: format!("t{i}"),
            weight: 1 + rng.below(4) as u32,
            quota: (rng.below(3) == 0).then(|| 1 + rng.below(6) as usize),
        })
        .collect();
    Config {
        manager: ManagerConfig {
            hosts: 1 + rng.below(6) as u8,
            max_priority: 1 + rng.below(9) as u32,
            aging_s: [0, 3, 10, 40][rng.below(4) as usize],
            default_lease_s: 30,
            max_lease_s: 10 + rng.below(100),
            max_queue: 200,
            max_functions_per_host: 1 + rng.below(5) as usize,
            half_life_s: [0, 20, 300][rng.below(3) as usize],
            tenants,
            ..ManagerConfig::default()
        },
        pools,
        ..Config::default()
    }
}

fn random_spec(rng: &mut Rng, c: &Config) -> RequestSpec {
    let count = 1 + rng.below(3) as u32;
    let want = if rng.below(2) == 0 {
        Want::Gpus { count }
    } else {
        Want::Vfs {
            count,
            profile: [None, Some("a".to_string()), Some("b".to_string())][rng.below(3) as usize]
                .clone(),
        }
    };
    let ntenants = c.manager.tenants.len() as u64;
    RequestSpec {
        host: rng.below(u64::from(c.manager.hosts) + 1) as u8,
        want,
        priority: rng.below(u64::from(c.manager.max_priority) + 1) as u32,
        duration_s: Some(1 + rng.below(120)),
        preemptible_by_higher: rng.below(2) == 0,
        migratable: rng.below(4) != 0,
        pool: (rng.below(5) == 0).then(|| format!("p{}", rng.below(3))),
        tenant: match rng.below(ntenants + 2) {
            0 => None,
            k if k <= ntenants => Some(format!("t{}", k - 1)),
            _ => Some("nobody".into()),
        },
        owner: None,
        tag: None,
    }
}

/// Runs one seeded workload on both schedulers; panics at the first difference.
fn compare(seed: u64, steps: usize, busy: bool) -> (u64, u64, u64) {
    let mut rng = Rng::new(seed);
    let c = random_config(&mut rng);
    let mut inc = Scheduler::new(c.clone());
    let mut full = Scheduler::new(c.clone());
    full.full_scan = true;
    let pfs: Vec<Pdfid> = c
        .pools
        .iter()
        .flat_map(|p| p.devices.iter().map(|d| d.pf))
        .collect();
    let mut now = 0;
    let mut scrubbed = 0;
    for step in 0..steps {
        let r = rng.below(100);
        // Op: < 45 submit, < 60 release, < 85 time, < 92 health, else hosts. Busy: mostly
        // submissions and little time (long queues, many pre-emptions).
        let what = if !busy {
            r
        } else if r < 70 {
            r * 45 / 70
        } else if r < 75 {
            45 + (r - 70) * 3
        } else if r < 95 {
            60 + (r - 75)
        } else {
            85 + (r - 95) * 3
        };
        let at = now;
        let ctx = || format!("seed {seed} step {step} op {what} at {at}\n{c:?}");
        if what < 45 {
            let spec = random_spec(&mut rng, &c);
            let a = inc.submit(spec.clone(), now);
            let b = full.submit(spec, now);
            assert_eq!(a, b, "submit: {}", ctx());
        } else if what < 60 {
            let ids: Vec<u64> = inc
                .leases
                .keys()
                .copied()
                .chain(inc.queue.iter().map(|q| q.id))
                .collect();
            let id = if ids.is_empty() || rng.below(10) == 0 {
                9999
            } else {
                let mut v = ids;
                v.sort_unstable();
                v[rng.below(v.len() as u64) as usize]
            };
            assert_eq!(inc.release(id, now), full.release(id, now), "{}", ctx());
        } else if what < 85 {
            if rng.below(25) == 0 {
                // The clock goes back (the daemon's is the wall clock).
                now = now.saturating_sub(rng.below(10));
            } else {
                now += rng.below(if busy { 4 } else { 15 });
            }
            inc.tick(now);
            full.tick(now);
        } else if what < 92 && rng.below(3) == 0 {
            // A scrub ends (a device of a scrub pool waiting for it), well or badly.
            let due = inc.scrubs_due();
            assert_eq!(due, full.scrubs_due(), "{}", ctx());
            if let Some(&pf) = due.get(rng.below(due.len().max(1) as u64) as usize) {
                let r = (rng.below(4) != 0).then_some(()).ok_or("test".to_string());
                scrubbed += u64::from(r.is_ok());
                let a = inc.scrub_done(pf, r.clone(), now);
                let b = full.scrub_done(pf, r, now);
                assert_eq!(a, b, "{}", ctx());
            }
        } else if what < 92 {
            let pf = pfs[rng.below(pfs.len() as u64) as usize];
            let bad = (rng.below(2) == 0).then(|| "test".to_string());
            let (a, b) = match bad {
                Some(_) => (
                    inc.set_health(pf, bad.clone(), now),
                    full.set_health(pf, bad, now),
                ),
                // Put back as an operator does (a failed scrub waits for another).
                None => (inc.readmit(pf, now), full.readmit(pf, now)),
            };
            assert_eq!(a, b, "{}", ctx());
        } else {
            let h = rng.below(u64::from(c.manager.hosts)) as u8;
            if rng.below(2) == 0 {
                inc.declare_down(h, now);
                full.declare_down(h, now);
            } else {
                inc.heartbeat(h, now);
                full.heartbeat(h, now);
            }
        }
        assert_eq!(inc.take_actions(), full.take_actions(), "{}", ctx());
        assert_eq!(inc.leases, full.leases, "{}", ctx());
        assert_eq!(inc.notices, full.notices, "{}", ctx());
        assert_eq!(inc.usage, full.usage, "{}", ctx());
        let mut qa = inc.queue.clone();
        let mut qb = full.queue.clone();
        qa.sort_by_key(|q| q.id);
        qb.sort_by_key(|q| q.id);
        assert_eq!(qa, qb, "{}", ctx());
        let ra: Vec<u64> = inc.ranked(now).iter().map(|&i| inc.queue[i].id).collect();
        let rb: Vec<u64> = full.ranked(now).iter().map(|&i| full.queue[i].id).collect();
        assert_eq!(ra, rb, "{}", ctx());
        if let Err(e) = inc.check_invariants() {
            panic!("incremental: {e}: {}", ctx());
        }
        if let Err(e) = full.check_invariants() {
            panic!("full scan: {e}: {}", ctx());
        }
    }
    let preempted = inc.notices.iter().filter(|n| n.kind == "preempted").count();
    (inc.grants, preempted as u64, scrubbed)
}

#[test]
fn incremental_pass_matches_the_full_scan() {
    let (mut grants, mut preempted, mut scrubbed) = (0, 0, 0);
    for seed in 0..300 {
        let (g, p, s) = compare(seed, 300, seed % 2 == 1);
        grants += g;
        preempted += p;
        scrubbed += s;
    }
    // The workloads did something: many grants and pre-emptions over all seeds.
    assert!(
        grants > 3_000 && preempted > 50 && scrubbed > 50,
        "{grants} grants, {preempted} pre-emptions, {scrubbed} scrubs"
    );
}

fn tenants_config(extra: &str) -> Config {
    Config::parse(&format!(
        r#"
        [manager]
        hosts = 4
        aging_s = 0
        max_lease_s = 1000
        half_life_s = 3600
        {extra}
        [[manager.tenants]]
        name = "x"
        [[manager.tenants]]
        name = "y"
        [[manager.tenants]]
        name = "q"
        quota = 2
        [[pools]]
        name = "gpus"
        mode = "whole"
        devices = [{{ pf = 0x0120 }}, {{ pf = 0x0140 }}, {{ pf = 0x0160 }}]
        "#
    ))
    .expect("config")
}

fn gpu(host: Host, count: u32, priority: u32, duration: u64, tenant: &str) -> RequestSpec {
    RequestSpec {
        host,
        want: Want::Gpus { count },
        priority,
        duration_s: Some(duration),
        preemptible_by_higher: false,
        migratable: true,
        pool: None,
        tenant: Some(tenant.into()),
        owner: None,
        tag: None,
    }
}

/// Among requests of equal priority the tenant further below its share goes first, even
/// when its request is younger; the queue and the reply's position say so.
#[test]
fn fair_share_prefers_the_tenant_below_its_share() {
    for full_scan in [false, true] {
        let mut s = Scheduler::new(tenants_config(""));
        s.full_scan = full_scan;
        // x uses all three GPUs for 100 s; y has used nothing.
        let big = s.submit(gpu(0, 3, 1, 100, "x"), 0).expect("x");
        assert!(big.granted);
        let f = s.fair_share_factors(50);
        assert!(f[1] > f[0], "x used more: {f:?}");
        let x = s.submit(gpu(1, 1, 1, 100, "x"), 60).expect("x again");
        let y = s.submit(gpu(2, 1, 1, 100, "y"), 61).expect("y");
        assert_eq!(
            (x.position, y.position),
            (Some(0), Some(0)),
            "y ranks before x"
        );
        let order: Vec<u64> = s.ranked(61).iter().map(|&i| s.queue[i].id).collect();
        assert_eq!(order, vec![y.id, x.id]);
        // One GPU frees: y gets it.
        s.release(big.id, 70).expect("release");
        assert!(s.leases.contains_key(&y.id) && s.leases.contains_key(&x.id));
        s.check_invariants().expect("invariants");
        // Only one GPU for two: the younger y first.
        let mut s = Scheduler::new(tenants_config(""));
        s.full_scan = full_scan;
        let hold = s.submit(gpu(0, 3, 1, 100, "x"), 0).expect("x");
        let x = s.submit(gpu(1, 3, 1, 100, "x"), 60).expect("x again");
        let y = s.submit(gpu(2, 3, 1, 100, "y"), 61).expect("y");
        s.release(hold.id, 70).expect("release");
        assert!(s.leases.contains_key(&y.id) && !s.leases.contains_key(&x.id));
    }
}

/// A tenant's quota: its leases hold at most `quota` functions; more waits, a request for
/// more than the quota is refused; unknown tenants are refused.
#[test]
fn quota_limits_a_tenant() {
    let mut s = Scheduler::new(tenants_config(""));
    assert!(s.submit(gpu(0, 2, 1, 100, "q"), 0).expect("q").granted);
    let more = s.submit(gpu(1, 1, 1, 100, "q"), 1).expect("q more");
    assert!(!more.granted, "a GPU is free but q is at its quota");
    assert!(s.submit(gpu(2, 1, 1, 100, "x"), 2).expect("x").granted);
    let e = s.submit(gpu(3, 3, 1, 100, "q"), 3).expect_err("over quota");
    assert!(
        e.0.contains("tenant 'q' may hold at most 2 functions"),
        "{e}"
    );
    let e = s.submit(gpu(3, 1, 1, 100, "z"), 3).expect_err("unknown");
    assert!(e.0.contains("no tenant named 'z'"), "{e}");
    // Without a tenant: the default one.
    let mut spec = gpu(3, 1, 1, 100, "x");
    spec.tenant = None;
    assert_eq!(spec.tenant_name(), "default");
    s.check_invariants().expect("invariants");
    // q's lease ends: its queued request gets the room.
    let first = s
        .leases
        .values()
        .find(|l| l.spec.tenant_name() == "q")
        .map(|l| l.id);
    s.release(first.expect("q's lease"), 10).expect("release");
    assert!(s.leases.contains_key(&more.id));
}

/// The request JSON takes `tenant` (and goes without it).
#[test]
fn request_json_carries_the_tenant() {
    let spec: RequestSpec = serde_json::from_str(
        r#"{"host":1,"want":{"kind":"gpus","count":1},"priority":2,"tenant":"x"}"#,
    )
    .expect("with tenant");
    assert_eq!(spec.tenant.as_deref(), Some("x"));
    let spec: RequestSpec =
        serde_json::from_str(r#"{"host":1,"want":{"kind":"gpus","count":1},"priority":2}"#)
            .expect("without");
    assert_eq!(spec.tenant_name(), "default");
}

/// The starvation bound with fair share: a priority-0 request of the tenant furthest above
/// its share (it held both GPUs first), under a constant stream of priority-9 requests of
/// a tenant that used nothing and has eight times its weight, is granted within the bound
/// of `Documentation/manager.rst` and not before its promotion.
#[test]
fn starvation_bound_holds_with_fair_share() {
    let text = r#"
    [manager]
    hosts = 2
    max_priority = 9
    aging_s = 10
    max_lease_s = 30
    max_queue = 100000
    half_life_s = 600
    [[manager.tenants]]
    name = "light"
    weight = 1
    [[manager.tenants]]
    name = "heavy"
    weight = 8
    quota = 2
    [[pools]]
    name = "gpus"
    mode = "whole"
    devices = [{ pf = 0x0120 }, { pf = 0x0140 }]
    "#;
    for full_scan in [false, true] {
        let mut s = Scheduler::new(Config::parse(text).expect("config"));
        s.full_scan = full_scan;
        assert!(
            s.submit(gpu(0, 2, 9, 30, "light"), 0)
                .expect("first")
                .granted
        );
        let mut low = None;
        let mut bound = None;
        let mut waited = None;
        for t in 1..5_000 {
            if t % 5 == 0 {
                s.submit(gpu(1, 1, 9, 30, "heavy"), t).expect("high");
            }
            if t == 33 {
                let f = s.fair_share_factors(t);
                assert!(f[0] < f[1], "light is above its share: {f:?}");
                let queued_before = s.queue.len();
                let r = s.submit(gpu(0, 2, 0, 30, "light"), t).expect("low");
                bound = s.starvation_bound(0, queued_before);
                low = Some(r.id);
            }
            s.tick(t);
            s.check_invariants().expect("invariants");
            if let Some(l) = low.and_then(|id| s.leases.get(&id)) {
                waited = Some(l.granted_at - 33);
                break;
            }
        }
        let bound = bound.expect("aging on: a bound");
        let waited = waited.expect("the low-priority request was granted");
        assert!(waited <= bound, "waited {waited} s, bound {bound} s");
        assert!(waited >= 100, "granted before promotion ({waited} s)");
    }
}

/// The reservation passes over a promoted request whose own host is at its limit: the
/// other hosts keep getting the pool while it waits, and it is still granted within the
/// bound of `Documentation/manager.rst` once its host frees (on both passes).
#[test]
fn promoted_request_at_its_host_limit_does_not_idle_the_pool() {
    let text = r#"
    [manager]
    hosts = 3
    max_priority = 9
    aging_s = 1
    max_lease_s = 30
    max_functions_per_host = 2
    max_queue = 100000
    [[pools]]
    name = "gpus"
    mode = "whole"
    devices = [{ pf = 0x0120 }, { pf = 0x0140 }, { pf = 0x0160 }, { pf = 0x0180 }]
    "#;
    for full_scan in [false, true] {
        let mut s = Scheduler::new(Config::parse(text).expect("config"));
        s.full_scan = full_scan;
        for _ in 0..2 {
            assert!(
                s.submit(gpu(0, 1, 9, 30, "default"), 0)
                    .expect("host 0")
                    .granted
            );
        }
        let queued_before = s.queue.len();
        let r = s.submit(gpu(0, 1, 0, 30, "default"), 1).expect("low");
        assert!(!r.granted, "host 0 is at its limit");
        let bound = s.starvation_bound(0, queued_before).expect("aging on");
        let mut others_while_blocked = 0;
        let mut waited = None;
        for t in 1..1_000 {
            s.submit(gpu(1 + (t % 2) as Host, 1, 9, 5, "default"), t)
                .expect("stream");
            let leases_before: BTreeSet<u64> = s.leases.keys().copied().collect();
            s.tick(t);
            s.check_invariants().expect("invariants");
            if let Some(l) = s.leases.get(&r.id) {
                waited = Some(l.granted_at - 1);
                break;
            }
            let q = s.queue.iter().find(|q| q.id == r.id).expect("still queued");
            if s.promoted(q, t) {
                others_while_blocked += s
                    .leases
                    .values()
                    .filter(|l| !leases_before.contains(&l.id) && l.spec.host != 0)
                    .count();
            }
        }
        let waited = waited.expect("the promoted request was granted");
        assert!(waited <= bound, "waited {waited} s, bound {bound} s");
        assert!(
            others_while_blocked > 0,
            "no other host got a device while the promoted request waited for its host \
             (full scan: {full_scan})"
        );
    }
}

/// Runs seeded random operations on `s` and, after each, asks both choices of victims
/// (`preempt.rs` and the walk, the reference) for random requests with room; panics at
/// the first difference. Returns (requests compared, of which with victims).
fn compare_victims(
    s: &mut Scheduler,
    rng: &mut Rng,
    steps: usize,
    spec_of: &dyn Fn(&mut Rng, &Config) -> RequestSpec,
    label: &str,
) -> (usize, usize) {
    let c = s.config.clone();
    let pfs: Vec<Pdfid> = s.devices.iter().map(|d| d.pf).collect();
    let (mut compared, mut found) = (0, 0);
    let mut now = 0;
    for step in 0..steps {
        let r = rng.below(100);
        if r < 60 {
            let _ = s.submit(spec_of(rng, &c), now);
        } else if r < 75 {
            let ids: Vec<u64> = s.leases.keys().copied().collect();
            if !ids.is_empty() {
                let _ = s.release(ids[rng.below(ids.len() as u64) as usize], now);
            }
        } else if r < 95 {
            now += rng.below(6);
            s.tick(now);
        } else {
            let pf = pfs[rng.below(pfs.len() as u64) as usize];
            if rng.below(2) == 0 {
                let _ = s.set_health(pf, Some("test".into()), now);
            } else {
                let _ = s.readmit(pf, now);
            }
            for pf in s.scrubs_due() {
                let _ = s.scrub_done(pf, Ok(()), now);
            }
        }
        s.take_actions();
        // The indexes as a pass finds them.
        s.sync(now);
        for _ in 0..4 {
            let spec = spec_of(rng, &c);
            if !s.room(&spec, &BTreeSet::new()) {
                continue;
            }
            let a = s.victims(&spec);
            let b = s.victims_walk(&spec);
            assert_eq!(
                a, b,
                "{label} step {step} at {now}: victims for {spec:?}\nleases {:?}",
                s.leases
            );
            compared += 1;
            found += usize::from(a.is_some());
        }
        if let Err(e) = s.check_invariants() {
            panic!("{label} step {step}: {e}");
        }
    }
    (compared, found)
}

/// The victims chosen from the pre-emption index and the capacity counts are those of the
/// walk over the leases and the pool's devices (the same leases, in the same order), on
/// seeded random small fabrics of every mode and on a hybrid pool like the benchmark's.
#[test]
fn indexed_victims_match_the_walk() {
    let (mut compared, mut found) = (0, 0);
    for seed in 0..200u64 {
        let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9) ^ 0x51c7);
        let c = random_config(&mut rng);
        let mut s = Scheduler::new(c);
        let (n, f) = compare_victims(
            &mut s,
            &mut rng,
            150,
            &random_spec,
            &format!("small seed {seed}"),
        );
        compared += n;
        found += f;
    }
    // A hybrid pool of 24 GPUs with 3 VFs each, 16 hosts, jobs as the benchmark's.
    let bench_job = |rng: &mut Rng, _: &Config| {
        let r = rng.below(10);
        let want = if r < 5 {
            Want::Gpus { count: 1 }
        } else if r < 7 {
            Want::Gpus { count: 2 }
        } else {
            Want::Vfs {
                count: 1 + rng.below(3) as u32,
                profile: None,
            }
        };
        RequestSpec {
            host: rng.below(16) as u8,
            want,
            priority: rng.below(10) as u32,
            duration_s: Some(60 * (20 + rng.below(161))),
            preemptible_by_higher: rng.below(3) == 0,
            migratable: true,
            pool: None,
            tenant: None,
            owner: None,
            tag: None,
        }
    };
    for seed in 0..10 {
        let mut rng = Rng::new(seed + 0x5eed);
        let mut c = crate::bench::pool_config(24, 16, 0x0100);
        c.manager.max_functions_per_host = 1 << 20;
        let mut s = Scheduler::new(c);
        let (n, f) = compare_victims(
            &mut s,
            &mut rng,
            400,
            &bench_job,
            &format!("hybrid seed {seed}"),
        );
        compared += n;
        found += f;
    }
    assert!(
        compared > 50_000 && found > 5_000,
        "{compared} requests compared, {found} with victims"
    );
}
