// SPDX-License-Identifier: GPL-2.0-only

//! The issue's scenarios against the pure scheduler and the simulated executor; the
//! invariants are checked after every step.

mod common;

use common::*;
use pcifab_manager::{
    config::Config,
    executor::Executor,
    scheduler::{Action, Scheduler},
};

fn kinds_for(s: &Scheduler, host: u8) -> Vec<(u64, String)> {
    s.notices_for(Some(host), 0)
        .into_iter()
        .map(|n| (n.lease, n.kind))
        .collect()
}

/// Four requests at three priorities on two GPUs with four VFs each (hybrid pool): grants,
/// a pre-emption, queueing by priority and the hand-overs, in the order
/// `Documentation/manager.rst` gives.
#[test]
fn four_requests_three_priorities() {
    let c = config("hybrid");
    let mut sim = sim_for(&c);
    let mut s = Scheduler::new(c);

    // R1: host 0, one whole GPU, priority 5: the first whole-free device.
    let r1 = s.submit(gpus(0, 1, 5, 100), 0).expect("r1");
    assert!(r1.granted);
    assert_eq!(step(&mut s, &mut sim), vec![bind(0x120, 0)]);

    // R2: host 1, four VFs, priority 1, pre-emptible: the VFs of the other device.
    let mut spec = vfs(1, 4, 1, 60);
    spec.preemptible_by_higher = true;
    let r2 = s.submit(spec, 1).expect("r2");
    assert!(r2.granted);
    assert_eq!(
        step(&mut s, &mut sim),
        (0x141..=0x144).map(|f| bind(f, 1)).collect::<Vec<_>>()
    );

    // R3: host 2, one GPU, priority 9: nothing is free, R2 allows pre-emption: R2 loses
    // its VFs (and is queued again with the 59 s it had left), R3 gets the device.
    let r3 = s.submit(gpus(2, 1, 9, 50), 2).expect("r3");
    assert!(r3.granted);
    let mut want: Vec<Action> = (0x141..=0x144).map(|f| unbind(f, 1)).collect();
    want.push(bind(0x140, 2));
    assert_eq!(step(&mut s, &mut sim), want);
    assert_eq!(s.queue.len(), 1);
    assert_eq!(s.queue[0].id, r2.id);
    assert_eq!(s.queue[0].duration_s, 59);

    // R4: host 0, two VFs, priority 5: nothing free, no pre-emptible lease below 5: queued,
    // ahead of R2 (priority 1).
    let r4 = s.submit(vfs(0, 2, 5, 30), 3).expect("r4");
    assert!(!r4.granted);
    assert_eq!(r4.position, Some(0));
    assert!(step(&mut s, &mut sim).is_empty());
    let order: Vec<u64> = s.ranked(3).iter().map(|&i| s.queue[i].id).collect();
    assert_eq!(order, vec![r4.id, r2.id]);

    // Time passes; nothing changes until R3 expires at 52.
    for t in 4..52 {
        s.tick(t);
        assert!(step(&mut s, &mut sim).is_empty(), "t={t}");
    }
    // R3 expires: R4 gets two VFs of that device; R2 (four VFs) still does not fit.
    s.tick(52);
    assert_eq!(
        step(&mut s, &mut sim),
        vec![unbind(0x140, 2), bind(0x141, 0), bind(0x142, 0)]
    );
    // R4 expires at 82: R2 gets its four VFs for the 59 s it had left.
    for t in 53..82 {
        s.tick(t);
        assert!(step(&mut s, &mut sim).is_empty(), "t={t}");
    }
    s.tick(82);
    let mut want = vec![unbind(0x141, 0), unbind(0x142, 0)];
    want.extend((0x141..=0x144).map(|f| bind(f, 1)));
    assert_eq!(step(&mut s, &mut sim), want);
    assert_eq!(s.leases[&r2.id].expires_at, 82 + 59);
    // R1 expires at 100, R2 at 141: the fabric is empty again.
    s.tick(100);
    assert_eq!(step(&mut s, &mut sim), vec![unbind(0x120, 0)]);
    s.tick(141);
    assert_eq!(
        step(&mut s, &mut sim),
        (0x141..=0x144).map(|f| unbind(f, 1)).collect::<Vec<_>>()
    );
    assert!(s.leases.is_empty() && s.queue.is_empty() && sim.bound.is_empty());

    // The holders were told, in order.
    let g = "granted".to_string();
    assert_eq!(
        kinds_for(&s, 1),
        vec![
            (r2.id, g.clone()),
            (r2.id, "preempted".into()),
            (r2.id, g.clone()),
            (r2.id, "expired".into())
        ]
    );
    assert_eq!(
        kinds_for(&s, 0),
        vec![
            (r1.id, g.clone()),
            (r4.id, g),
            (r4.id, "expired".into()),
            (r1.id, "expired".into())
        ]
    );
}

/// A lease that does not allow pre-emption is never pre-empted, whatever the priority.
#[test]
fn preemption_only_where_allowed() {
    let c = config("whole");
    let mut sim = sim_for(&c);
    let mut s = Scheduler::new(c);
    s.submit(gpus(0, 2, 0, 100), 0).expect("low");
    step(&mut s, &mut sim);
    let hi = s.submit(gpus(1, 1, 9, 10), 1).expect("high");
    assert!(!hi.granted);
    assert!(step(&mut s, &mut sim).is_empty());
    // Whole pools refuse VF requests, with the reason.
    let e = s
        .submit(vfs(1, 1, 1, 1), 2)
        .expect_err("vfs in a whole pool");
    assert!(e.0.contains("no pool gives VFs"), "{e}");
}

/// Spatial partitions: the VFs of one GPU held by three hosts at once.
#[test]
fn partitions_share_one_gpu() {
    let c = config("partition");
    let mut sim = sim_for(&c);
    let mut s = Scheduler::new(c);
    for (h, n) in [(0u8, 2u32), (1, 1), (2, 1)] {
        assert!(s.submit(vfs(h, n, 1, 50), 0).expect("vfs").granted);
        step(&mut s, &mut sim);
    }
    // Best fit: all four on the first GPU, the second stays untouched.
    let hosts: Vec<u8> = (0x121..=0x124).map(|f| sim.bound[&f]).collect();
    assert_eq!(hosts, vec![0, 0, 1, 2]);
    assert!((0x140..=0x144).all(|f| !sim.bound.contains_key(&f)));
    assert!(s.submit(gpus(0, 1, 1, 5), 0).is_err());
}

const SLICED: &str = r#"
[manager]
hosts = 2
[[pools]]
name = "shared"
mode = "time-slice"
slice_s = 10
devices = [{ pf = 0x0120 }]
"#;

/// Time-slicing: one device rotated between two hosts, each hand-over a move.
#[test]
fn time_sliced_device_visits_both_hosts() {
    let c = Config::parse(SLICED).expect("config");
    let mut sim = sim_for(&c);
    let mut s = Scheduler::new(c);
    let a = s.submit(gpus(0, 1, 1, 1000), 0).expect("a");
    let b = s.submit(gpus(1, 1, 1, 1000), 1).expect("b");
    assert!(
        a.granted && b.granted,
        "time-sliced leases are granted as sharers"
    );
    step(&mut s, &mut sim);
    for t in 2..=34 {
        s.tick(t);
        step(&mut s, &mut sim);
    }
    // b (host 1) releases while it holds the device: it goes back to host 0 at once.
    s.release(b.id, 35).expect("release");
    step(&mut s, &mut sim);
    s.tick(50);
    step(&mut s, &mut sim);
    s.release(a.id, 51).expect("release");
    step(&mut s, &mut sim);
    assert_eq!(
        sim.log,
        vec![
            bind(0x120, 0),
            mv(0x120, 0, 1),
            mv(0x120, 1, 0),
            mv(0x120, 0, 1),
            mv(0x120, 1, 0),
            unbind(0x120, 0)
        ]
    );
    let host1: Vec<String> = s
        .notices_for(Some(1), 0)
        .into_iter()
        .map(|n| n.kind)
        .collect();
    assert_eq!(
        host1,
        vec!["granted", "slice-in", "slice-out", "slice-in", "released"]
    );
}

/// Anti-starvation: a priority-0 request for both GPUs under a constant stream of
/// priority-9 one-GPU requests is granted within the computed bound; without aging it
/// starves.
#[test]
fn low_priority_is_not_starved() {
    let text = r#"
    [manager]
    hosts = 2
    max_priority = 9
    aging_s = 10
    max_lease_s = 30
    max_queue = 100000
    [[pools]]
    name = "gpus"
    mode = "whole"
    devices = [{ pf = 0x0120 }, { pf = 0x0140 }]
    "#;
    let run = |aging: u64, until: u64| -> (Option<u64>, Option<u64>) {
        let mut c = Config::parse(text).expect("config");
        c.manager.aging_s = aging;
        let mut sim = sim_for(&c);
        let mut s = Scheduler::new(c);
        let mut low = None;
        let mut bound = None;
        for t in 0..until {
            if t % 5 == 0 {
                s.submit(gpus(1, 1, 9, 30), t).expect("high");
            }
            if t == 3 {
                let queued_before = s.queue.len();
                let r = s.submit(gpus(0, 2, 0, 30), t).expect("low");
                bound = s.starvation_bound(0, queued_before);
                low = Some(r.id);
            }
            s.tick(t);
            step(&mut s, &mut sim);
            if let Some(id) = low {
                if let Some(l) = s.leases.get(&id) {
                    return (Some(l.granted_at - 3), bound);
                }
            }
        }
        (None, bound)
    };
    let (waited, bound) = run(10, 10_000);
    let bound = bound.expect("aging on: a bound");
    // (max_priority + 1 - 0) * aging_s + (queued_before + 1) * (2 * max_lease_s + 1)
    assert_eq!(bound, 100 + 2 * 30 + 1);
    let waited = waited.expect("the low-priority request was granted");
    assert!(waited <= bound, "waited {waited} s, bound {bound} s");
    assert!(
        waited >= 100,
        "granted before promotion ({waited} s): the stream was not saturating"
    );
    // The same without aging: never granted while the stream lasts.
    let (waited, bound) = run(0, 5_000);
    assert_eq!((waited, bound), (None, None));
}

/// Host limits, unknown hosts, priorities and sizes are refused with the reason.
#[test]
fn refusals_name_the_reason() {
    let mut s = Scheduler::new(config("hybrid"));
    let e = |r: Result<_, pcifab_manager::scheduler::Refused>| r.expect_err("refused").0;
    assert!(e(s.submit(gpus(7, 1, 1, 1), 0)).contains("not in this fabric"));
    assert!(e(s.submit(gpus(0, 1, 99, 1), 0)).contains("priority 99"));
    assert!(e(s.submit(gpus(0, 3, 1, 1), 0)).contains("ask for fewer"));
    assert!(e(s.submit(vfs(0, 5, 1, 1), 0)).contains("at most 4 functions"));
    assert!(e(s.submit(gpus(0, 0, 1, 1), 0)).contains("at least one"));
    assert!(s
        .release(99, 0)
        .expect_err("unknown")
        .0
        .contains("no lease or queued request 99"));
}

/// Device failure: whole-GPU and VF leases move to a healthy device; a lease that does not
/// allow moving is queued again.
#[test]
fn unhealthy_device_moves_its_leases() {
    let c = config("hybrid");
    let mut sim = sim_for(&c);
    let mut s = Scheduler::new(c);
    let a = s.submit(vfs(0, 2, 1, 100), 0).expect("a");
    let b = s.submit(vfs(1, 1, 1, 100), 0).expect("b");
    step(&mut s, &mut sim);
    assert_eq!(sim.bound[&0x121], 0);
    s.set_health(0x120, Some("test".into()), 1).expect("health");
    let acts = step(&mut s, &mut sim);
    assert_eq!(
        acts,
        vec![
            unbind(0x121, 0),
            unbind(0x122, 0),
            unbind(0x123, 1),
            bind(0x141, 0),
            bind(0x142, 0),
            bind(0x143, 1)
        ]
    );
    assert!(s.leases.contains_key(&a.id) && s.leases.contains_key(&b.id));
    // Whole GPU with nowhere to go: queued again; back when the device is healthy.
    let mut spec = gpus(2, 1, 1, 100);
    spec.migratable = false;
    s.set_health(0x120, None, 2).expect("health");
    let c = s.submit(spec, 2).expect("c");
    assert!(c.granted);
    step(&mut s, &mut sim);
    s.set_health(0x120, Some("test".into()), 3).expect("health");
    assert_eq!(step(&mut s, &mut sim), vec![unbind(0x120, 2)]);
    assert!(s.queue.iter().any(|q| q.id == c.id));
    s.set_health(0x120, None, 4).expect("health");
    assert_eq!(step(&mut s, &mut sim), vec![bind(0x120, 2)]);
}

/// Host down: after reclaim_after_s its devices return and a queued request gets them;
/// a host whose heartbeats stop is declared down after host_timeout_s.
#[test]
fn host_down_returns_devices() {
    let c = config("whole");
    let mut sim = sim_for(&c);
    let mut s = Scheduler::new(c);
    s.submit(gpus(0, 2, 1, 1000), 0).expect("h0");
    let q = s.submit(gpus(1, 1, 1, 1000), 0).expect("h1");
    assert!(!q.granted);
    step(&mut s, &mut sim);
    s.declare_down(0, 10);
    for t in 10..15 {
        s.tick(t);
        assert!(step(&mut s, &mut sim).is_empty());
    }
    s.tick(15); // reclaim_after_s = 5
    assert_eq!(
        step(&mut s, &mut sim),
        vec![unbind(0x120, 0), unbind(0x140, 0), bind(0x120, 1)]
    );
    // Heartbeats: host 1 is seen at 20, then silent; down at 40, reclaimed at 45.
    s.heartbeat(1, 20);
    for t in 21..45 {
        s.tick(t);
        assert!(step(&mut s, &mut sim).is_empty(), "t={t}");
    }
    s.tick(45);
    assert_eq!(step(&mut s, &mut sim), vec![unbind(0x120, 1)]);
    assert_eq!(
        kinds_for(&s, 1).last().map(|k| k.1.as_str()),
        Some("reclaimed")
    );
}

/// Reconcile: a fabric found different from the stored state is brought back in a legal
/// order.
#[test]
fn reconcile_fixes_the_fabric() {
    let c = config("hybrid");
    let mut sim = sim_for(&c);
    let mut s = Scheduler::new(c);
    s.submit(gpus(0, 1, 1, 100), 0).expect("a");
    s.take_actions();
    // The fabric has VFs of that device bound elsewhere and not the PF.
    sim.bound.insert(0x121, 2);
    sim.bound.insert(0x140, 1);
    for a in s.reconcile(&sim.bound.clone()) {
        sim.apply(&a).expect("legal");
    }
    check(&s, &sim.bound);
}
