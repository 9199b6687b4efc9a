// SPDX-License-Identifier: GPL-2.0-only

//! Helpers shared by the scenario tests.

#![allow(dead_code)]

use pcifab_manager::{
    config::Config,
    executor::{Executor, SimExecutor},
    scheduler::{Action, RequestSpec, Scheduler, Want},
};

/// The issue's pool: two GPUs with four VFs each (PDFIDs as pcifab-emu numbers them).
pub const TWO_GPUS: &str = r#"
[manager]
hosts = 3
aging_s = 1000
default_lease_s = 100
max_lease_s = 1000

[failover]
host_timeout_s = 20
reclaim_after_s = 5

[telemetry]
interval_s = 1
max_temp_c = 90.0
bad_samples = 2

[[pools]]
name = "gpus"
mode = "MODE"

[[pools.devices]]
pf = 0x0120
vfs = [0x0121, 0x0122, 0x0123, 0x0124]
profile = "quarter"

[[pools.devices]]
pf = 0x0140
vfs = [0x0141, 0x0142, 0x0143, 0x0144]
profile = "quarter"
"#;

pub fn config(mode: &str) -> Config {
    Config::parse(&TWO_GPUS.replace("MODE", mode)).expect("test configuration")
}

pub fn sim_for(c: &Config) -> SimExecutor {
    SimExecutor::new(
        c.pools
            .iter()
            .flat_map(|p| &p.devices)
            .map(|d| (d.pf, d.vfs.as_slice())),
    )
}

pub fn gpus(host: u8, count: u32, priority: u32, duration: u64) -> RequestSpec {
    RequestSpec {
        host,
        want: Want::Gpus { count },
        priority,
        duration_s: Some(duration),
        preemptible_by_higher: false,
        migratable: true,
        pool: None,
        tenant: None,
        owner: None,
        tag: None,
    }
}

pub fn vfs(host: u8, count: u32, priority: u32, duration: u64) -> RequestSpec {
    RequestSpec {
        want: Want::Vfs {
            count,
            profile: Some("quarter".into()),
        },
        ..gpus(host, count, priority, duration)
    }
}

/// Applies the scheduler's actions to the simulated fabric (each must be legal there) and
/// checks the invariants and that both agree on the fabric. Returns the actions.
pub fn step(s: &mut Scheduler, sim: &mut SimExecutor) -> Vec<Action> {
    let actions = s.take_actions();
    for a in &actions {
        if let Err(e) = sim.apply(a) {
            panic!("illegal action {a:?}: {e}");
        }
    }
    check(s, &sim.bound);
    actions
}

pub fn check(s: &Scheduler, bound: &std::collections::BTreeMap<u16, u8>) {
    if let Err(e) = s.check_invariants() {
        panic!("invariant broken: {e}\n{s:#?}");
    }
    assert_eq!(&s.holders, bound, "scheduler and fabric disagree");
}

pub fn bind(pdfid: u16, host: u8) -> Action {
    Action::Bind { pdfid, host }
}
pub fn unbind(pdfid: u16, host: u8) -> Action {
    Action::Unbind { pdfid, host }
}
pub fn mv(pdfid: u16, from: u8, to: u8) -> Action {
    Action::Move { pdfid, from, to }
}

/// A fresh temporary directory.
pub fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pcifab-manager-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
