// SPDX-License-Identifier: GPL-2.0-only
//! The trace figure of the Slurm benchmark (Documentation/benchmarks.rst,
//! `slurm_trace_utilisation_vs_static`): a seeded day of GPU jobs on a few nodes, replayed
//! twice by the same model of Slurm's scheduling, once with the GPUs composed on demand
//! (each job's GPUs bound when it starts, at the start overhead measured on the real stack)
//! and once with every static split of the same GPUs among the nodes; the figure is the GPU
//! busy fraction of the first over that of the best split.
//!
//! Computed, not run: a day of jobs, even compressed, against real Slurm once per split
//! would not fit `make bench`. What the real stack decides, the start overhead, comes in
//! as a number; what is left is which job may start when, which the model below decides the
//! same way for both sides.

/// The cluster the trace runs on.
#[derive(Clone, Copy, Debug)]
pub struct Cluster {
    /// Compute nodes.
    pub nodes: usize,
    /// Fabric GPUs (the manager's pool).
    pub gpus: usize,
    /// Most GPUs one node may hold at once (its Slurm GRES count; at most the manager's
    /// `max_functions_per_host`).
    pub ceiling: usize,
}

impl Cluster {
    /// The benchmark's: four nodes, eight GPUs, at most four per node.
    pub const BENCH: Cluster = Cluster {
        nodes: 4,
        gpus: 8,
        ceiling: 4,
    };
}

/// The trace's seed.
pub const SEED: u64 = 0x5eed_2026_0051;
/// The day the figure covers (seconds).
pub const DAY_S: f64 = 86_400.0;
/// Offered load: the GPU-seconds the jobs ask for over the day, as a share of the GPUs'.
pub const LOAD: f64 = 0.75;
/// Mean run time of a job (exponential, cut to 5 min .. 4 h).
pub const MEAN_RUN_S: f64 = 2_700.0;
/// GPUs per job and their odds.
pub const SIZES: [(usize, f64); 3] = [(1, 0.5), (2, 0.35), (4, 0.15)];

/// One job of the trace: submitted at `submit` to `node` (`sbatch -w`), asking for `gpus`,
/// running `run_s` once started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Job {
    pub submit: f64,
    pub node: usize,
    pub gpus: usize,
    pub run_s: f64,
}

/// splitmix64: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Exponential with mean `mean`.
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// The seeded day of jobs: each node's users submit to it alone, at a rate that follows the
/// day (1 + sin) with its peak shifted by a day / `nodes` from the node before (groups in
/// other time zones, or whose work comes in waves); over the day the jobs ask for `LOAD` of
/// the GPUs. Sorted by submission.
pub fn trace(c: &Cluster, seed: u64) -> Vec<Job> {
    let mut rng = Rng(seed);
    let mean_gpus: f64 = SIZES.iter().map(|&(g, p)| g as f64 * p).sum();
    // Jobs per second per node, on average over the day.
    let rate = LOAD * c.gpus as f64 / c.nodes as f64 / (mean_gpus * MEAN_RUN_S);
    let mut jobs = Vec::new();
    for node in 0..c.nodes {
        let phase = std::f64::consts::TAU * node as f64 / c.nodes as f64;
        // Thinning: candidates at the peak rate, each kept with the rate's share then.
        let mut t = 0.0;
        loop {
            t += rng.exp(1.0 / (2.0 * rate));
            if t >= DAY_S {
                break;
            }
            let now = 1.0 + (std::f64::consts::TAU * t / DAY_S - phase).sin();
            let keep = rng.unit() < now / 2.0;
            let pick = rng.unit();
            let run_s = rng.exp(MEAN_RUN_S).clamp(300.0, 14_400.0);
            if !keep {
                continue;
            }
            let mut acc = 0.0;
            let mut gpus = SIZES[SIZES.len() - 1].0;
            for &(g, p) in &SIZES {
                acc += p;
                if pick < acc {
                    gpus = g;
                    break;
                }
            }
            jobs.push(Job {
                submit: t,
                node,
                gpus: gpus.min(c.ceiling),
                run_s,
            });
        }
    }
    jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    jobs
}

/// How the nodes get their GPUs.
#[derive(Clone, Debug)]
pub enum Policy {
    /// Composed per job from the pool (at most `ceiling` per node); a job's GPUs are held
    /// `overhead_s` before it runs (the bind) and as long after (the release).
    OnDemand { overhead_s: f64 },
    /// Node i owns `split[i]` GPUs for good.
    Static(Vec<usize>),
}

/// The GPU busy fraction of the day: GPU-seconds of jobs running within it over the GPUs'.
///
/// The scheduling model, the same for both policies: at every submission and every end,
/// the queue is scanned in submission order and every job that fits now starts (first fit
/// without reservations; a job that can never fit, e.g. 4 GPUs on a node that owns 2, waits
/// for good, as Slurm would refuse it).
pub fn replay(c: &Cluster, jobs: &[Job], policy: &Policy) -> f64 {
    let (cap, overhead): (Vec<usize>, f64) = match policy {
        Policy::OnDemand { overhead_s } => (vec![c.ceiling; c.nodes], *overhead_s),
        Policy::Static(split) => (split.clone(), 0.0),
    };
    let mut pool = c.gpus;
    let mut held = vec![0usize; c.nodes];
    // (time its GPUs are free again, node, gpus)
    let mut running: Vec<(f64, usize, usize)> = Vec::new();
    let mut queue: Vec<Job> = Vec::new();
    let mut next = 0;
    let mut busy = 0.0;
    loop {
        let end = running.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        let arrive = jobs.get(next).map_or(f64::INFINITY, |j| j.submit);
        let t = end.min(arrive);
        if t >= DAY_S {
            break;
        }
        running.retain(|&(free, node, g)| {
            if free <= t {
                held[node] -= g;
                pool += g;
                false
            } else {
                true
            }
        });
        while jobs.get(next).is_some_and(|j| j.submit <= t) {
            queue.push(jobs[next]);
            next += 1;
        }
        queue.retain(|j| {
            let node_cap = cap.get(j.node).copied().unwrap_or(0);
            if held[j.node] + j.gpus > node_cap || j.gpus > pool {
                return true;
            }
            held[j.node] += j.gpus;
            pool -= j.gpus;
            let start = t + overhead;
            let stop = start + j.run_s;
            busy += j.gpus as f64 * (stop.min(DAY_S) - start.min(DAY_S));
            running.push((stop + overhead, j.node, j.gpus));
            false
        });
    }
    busy / (c.gpus as f64 * DAY_S)
}

/// Every split of the cluster's GPUs among its nodes, at most `ceiling` each.
pub fn splits(c: &Cluster) -> Vec<Vec<usize>> {
    fn go(c: &Cluster, left: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == c.nodes {
            if left == 0 {
                out.push(cur.clone());
            }
            return;
        }
        for g in 0..=left.min(c.ceiling) {
            cur.push(g);
            go(c, left - g, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    go(c, c.gpus, &mut Vec::new(), &mut out);
    out
}

/// Both sides of the figure.
#[derive(Clone, Debug)]
pub struct Figure {
    pub jobs: usize,
    pub on_demand: f64,
    pub best_static: f64,
    pub best_split: Vec<usize>,
}

/// The trace of `seed` replayed on demand (with `overhead_s`) and with every static split.
pub fn replay_both(c: &Cluster, seed: u64, overhead_s: f64) -> Figure {
    let jobs = trace(c, seed);
    let on_demand = replay(c, &jobs, &Policy::OnDemand { overhead_s });
    let (best_split, best_static) = splits(c)
        .into_iter()
        .map(|s| {
            let b = replay(c, &jobs, &Policy::Static(s.clone()));
            (s, b)
        })
        .fold((Vec::new(), -1.0), |a, b| if b.1 > a.1 { b } else { a });
    Figure {
        jobs: jobs.len(),
        on_demand,
        best_static,
        best_split,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: Cluster = Cluster {
        nodes: 2,
        gpus: 2,
        ceiling: 2,
    };

    #[test]
    fn the_trace_is_seeded_within_the_day_and_near_its_load() {
        let c = Cluster::BENCH;
        let a = trace(&c, SEED);
        assert_eq!(a, trace(&c, SEED));
        assert_ne!(a, trace(&c, SEED + 1));
        assert!(a.windows(2).all(|w| w[0].submit <= w[1].submit));
        assert!(a
            .iter()
            .all(|j| j.submit < DAY_S && j.node < c.nodes && j.gpus <= c.ceiling));
        let asked: f64 = a.iter().map(|j| j.gpus as f64 * j.run_s).sum();
        let load = asked / (c.gpus as f64 * DAY_S);
        assert!((0.5..1.0).contains(&load), "offered load {load}");
    }

    #[test]
    fn every_split_is_searched() {
        assert_eq!(splits(&TWO), vec![vec![0, 2], vec![1, 1], vec![2, 0]]);
        let s = splits(&Cluster::BENCH);
        assert!(s
            .iter()
            .all(|s| s.iter().sum::<usize>() == 8 && s.iter().all(|&g| g <= 4)));
        assert_eq!(s.len(), 85);
    }

    /// Node 0 needs both GPUs in the first half of the day, node 1 in the second: composed
    /// on demand they are busy all day; any static split serves one half at most.
    #[test]
    fn demand_that_moves_between_nodes_is_what_composition_wins() {
        let half = DAY_S / 2.0;
        let jobs = [
            Job {
                submit: 0.0,
                node: 0,
                gpus: 2,
                run_s: half,
            },
            Job {
                submit: half,
                node: 1,
                gpus: 2,
                run_s: half,
            },
        ];
        let on = replay(&TWO, &jobs, &Policy::OnDemand { overhead_s: 0.0 });
        assert!((on - 1.0).abs() < 1e-9, "{on}");
        let st: Vec<f64> = splits(&TWO)
            .into_iter()
            .map(|s| replay(&TWO, &jobs, &Policy::Static(s)))
            .collect();
        assert_eq!(st, vec![0.5, 0.0, 0.5]);
        // The overhead costs what it says: the first job runs 10 s late (wholly within the
        // day), the second waits for the first's release and its own bind, 30 s in all,
        // which the day's end cuts off.
        let slow = replay(&TWO, &jobs, &Policy::OnDemand { overhead_s: 10.0 });
        let want = 1.0 - 30.0 * 2.0 / (2.0 * DAY_S);
        assert!((slow - want).abs() < 1e-9, "{slow} vs {want}");
    }
}
