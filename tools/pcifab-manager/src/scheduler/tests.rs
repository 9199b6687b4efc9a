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
    }
}

/// Runs one seeded workload on both schedulers; panics at the first difference.
fn compare(seed: u64, steps: usize, busy: bool) -> (u64, u64) {
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
        } else if what < 92 {
            let pf = pfs[rng.below(pfs.len() as u64) as usize];
            let bad = (rng.below(2) == 0).then(|| "test".to_string());
            let a = inc.set_health(pf, bad.clone(), now);
            let b = full.set_health(pf, bad, now);
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
    (inc.grants, preempted as u64)
}

#[test]
fn incremental_pass_matches_the_full_scan() {
    let (mut grants, mut preempted) = (0, 0);
    for seed in 0..300 {
        let (g, p) = compare(seed, 300, seed % 2 == 1);
        grants += g;
        preempted += p;
    }
    // The workloads did something: many grants and pre-emptions over all seeds.
    assert!(
        grants > 3_000 && preempted > 50,
        "{grants} grants, {preempted} pre-emptions"
    );
}
