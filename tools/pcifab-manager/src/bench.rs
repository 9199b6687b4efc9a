// SPDX-License-Identifier: GPL-2.0-only

//! The benchmark's workloads (run by `pcifab-manager-bench`): scheduling rate with a long
//! queue, and pool utilisation over a scripted day against static assignment.

use std::time::Instant;

use crate::{
    config::{Config, DeviceConfig, ManagerConfig, Mode, PoolConfig},
    scheduler::{RequestSpec, Scheduler, Want},
};

/// splitmix64: small, seeded, the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// GPUs per host in the static split, VFs per GPU, hosts.
pub const VFS_PER_GPU: u16 = 3;

/// A hybrid pool of `gpus` devices (PF + 3 VFs each, so 4 functions per GPU).
pub fn pool_config(gpus: u16, hosts: u8, first: u16) -> Config {
    let devices = (0..gpus)
        .map(|g| {
            let pf = first + g * 4;
            DeviceConfig {
                pf,
                vfs: (1..=VFS_PER_GPU).map(|v| pf + v).collect(),
                profile: "third".into(),
            }
        })
        .collect();
    Config {
        manager: ManagerConfig {
            hosts,
            aging_s: 600,
            max_lease_s: 86_400,
            max_queue: 1_000_000,
            // The benchmark is about sharing, not the four logical ports of a PAX host.
            max_functions_per_host: 1024,
            ..ManagerConfig::default()
        },
        pools: vec![PoolConfig {
            name: "gpus".into(),
            mode: Mode::Hybrid,
            slice_s: 60,
            max_sharers: 4,
            devices,
        }],
        ..Config::default()
    }
}

fn job(rng: &mut Rng, host: u8) -> RequestSpec {
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
        host,
        want,
        priority: rng.below(10) as u32,
        // 20 to 180 minutes.
        duration_s: Some(60 * (20 + rng.below(161))),
        preemptible_by_higher: rng.below(4) == 0,
        migratable: true,
        pool: None,
        tenant: None,
    }
}

/// Scheduling rate: a pool of 64 GPUs (256 functions), full, with `queued` requests waiting;
/// each decision is one release or submission followed by a full scheduling pass over the
/// queue. Returns decisions per second and the mean queue length.
pub fn decisions_per_second(queued: usize, decisions: usize, seed: u64) -> (f64, f64) {
    let mut rng = Rng::new(seed);
    let mut s = Scheduler::new(pool_config(64, 16, 0x0100));
    let mut now = 0;
    while s.queue.len() < queued {
        let h = rng.below(16) as u8;
        let _ = s.submit(job(&mut rng, h), now);
        now += 1;
    }
    s.take_actions();
    let start = Instant::now();
    let mut qsum = 0usize;
    for i in 0..decisions {
        now += 1;
        if i % 2 == 0 {
            // A release: a random lease ends, the pass hands its devices on.
            let n = s.leases.len() as u64;
            if n > 0 {
                let k = rng.below(n) as usize;
                if let Some(&id) = s.leases.keys().nth(k) {
                    let _ = s.release(id, now);
                }
            }
        } else {
            let h = rng.below(16) as u8;
            let _ = s.submit(job(&mut rng, h), now);
        }
        s.take_actions();
        qsum += s.queue.len();
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    (
        decisions as f64 / secs,
        qsum as f64 / decisions.max(1) as f64,
    )
}

/// Result of the scripted day.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Day {
    pub shared_utilisation: f64,
    pub static_utilisation: f64,
    pub jobs: usize,
    pub shared_granted: usize,
    pub static_granted: usize,
}

/// VF-units a scheduler's leases occupy (a whole GPU counts as its 3 VFs).
fn busy_units(s: &Scheduler) -> usize {
    s.leases
        .values()
        .map(|l| match l.spec.want {
            Want::Gpus { count } => count as usize * VFS_PER_GPU as usize,
            Want::Vfs { count, .. } => count as usize,
        })
        .sum()
}

/// Cancels requests that waited longer than users wait (both policies alike).
fn give_up(s: &mut Scheduler, now: u64, patience: u64) {
    let old: Vec<u64> = s
        .queue
        .iter()
        .filter(|q| now.saturating_sub(q.submitted) > patience)
        .map(|q| q.id)
        .collect();
    for id in old {
        let _ = s.release(id, now);
    }
}

/// A day of jobs from 8 hosts on 64 GPUs (256 functions): two busy teams that want about
/// 20 GPUs each, six that want about 3, each with a daily peak at its own hour. Static: each
/// host owns 8 GPUs and only its own jobs use them. Shared: one hybrid pool. Users give up
/// on a request after four hours in the queue. Utilisation is the mean over the day of the
/// busy share of all GPU capacity (VF-units).
pub fn scripted_day(seed: u64) -> Day {
    const HOSTS: u8 = 8;
    const GPUS_PER_HOST: u16 = 8;
    const STEP: u64 = 60;
    const DAY: u64 = 86_400;
    const PATIENCE: u64 = 4 * 3600;
    let mut rng = Rng::new(seed);
    // Mean GPU-equivalents per job: 0.5*1 + 0.2*2 + 0.3*(2/3) = 1.1; mean duration 100 min.
    let want_gpus = |h: u8| if h < 2 { 20.0 } else { 3.0 };
    let mut jobs = Vec::new();
    for t in (0..DAY).step_by(STEP as usize) {
        for h in 0..HOSTS {
            let phase =
                (t as f64 / DAY as f64 + f64::from(h) / f64::from(HOSTS)) * std::f64::consts::TAU;
            let rate = want_gpus(h) / (1.1 * 100.0) * (1.0 + 0.5 * phase.sin());
            if rng.unit() < rate {
                jobs.push((t, job(&mut rng, h)));
            }
        }
    }
    let mut shared = Scheduler::new(pool_config(GPUS_PER_HOST * u16::from(HOSTS), HOSTS, 0x0100));
    let mut statics: Vec<Scheduler> = (0..HOSTS)
        .map(|h| {
            Scheduler::new(pool_config(
                GPUS_PER_HOST,
                HOSTS,
                0x0100 + u16::from(h) * GPUS_PER_HOST * 4,
            ))
        })
        .collect();
    let total_units = (GPUS_PER_HOST * u16::from(HOSTS) * VFS_PER_GPU) as f64;
    let (mut su, mut tu, mut steps) = (0.0, 0.0, 0.0);
    let mut next = 0;
    for t in (0..DAY).step_by(STEP as usize) {
        while next < jobs.len() && jobs[next].0 <= t {
            let (_, spec) = &jobs[next];
            let _ = shared.submit(spec.clone(), t);
            let _ = statics[spec.host as usize].submit(spec.clone(), t);
            next += 1;
        }
        give_up(&mut shared, t, PATIENCE);
        shared.tick(t);
        shared.take_actions();
        let mut busy_static = 0;
        for s in &mut statics {
            give_up(s, t, PATIENCE);
            s.tick(t);
            s.take_actions();
            busy_static += busy_units(s);
        }
        su += busy_units(&shared) as f64 / total_units;
        tu += busy_static as f64 / total_units;
        steps += 1.0;
    }
    Day {
        shared_utilisation: su / steps,
        static_utilisation: tu / steps,
        jobs: jobs.len(),
        shared_granted: shared.grants as usize,
        static_granted: statics.iter().map(|s| s.grants as usize).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_day_is_deterministic_and_sharing_wins() {
        let a = scripted_day(7);
        assert_eq!(a, scripted_day(7));
        assert!(a.shared_utilisation >= 1.5 * a.static_utilisation, "{a:?}");
    }
}
