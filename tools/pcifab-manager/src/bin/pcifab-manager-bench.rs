// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab-manager-bench`: scheduling rate and pool utilisation of the manager's scheduler
//! on a simulated fabric (Documentation/manager.rst, "Benchmark").
//!
//! `cargo run --release -p pcifab-manager --bin pcifab-manager-bench [-- --seed N]`

use std::process::ExitCode;

use pcifab_manager::bench;

fn main() -> ExitCode {
    if std::env::args()
        .nth(1)
        .is_some_and(|a| a == "--version" || a == "-V")
    {
        println!("{} {}", env!("CARGO_BIN_NAME"), env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seed = 0x5eed_u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.next().map(|v| v.parse::<u64>())) {
            ("--seed", Some(Ok(v))) => seed = v,
            _ => {
                eprintln!("usage: pcifab-manager-bench [--seed N]");
                return ExitCode::from(2);
            }
        }
    }
    let (rate, mean_queue) = bench::decisions_per_second(1000, 20_000, seed);
    println!(
        "bench queue: 1000 requests waiting on 64 GPUs (256 functions), mean queue {mean_queue:.0}"
    );
    let day = bench::scripted_day(seed);
    println!(
        "bench day: {} jobs from 8 hosts; granted shared {} static {}",
        day.jobs, day.shared_granted, day.static_granted
    );
    println!(
        "bench pool_utilisation shared {:.3} static {:.3}",
        day.shared_utilisation, day.static_utilisation
    );
    println!(
        "bench pool_utilisation_ratio_vs_static {:.2}",
        day.shared_utilisation / day.static_utilisation.max(1e-9)
    );
    println!("bench schedule_decisions_per_second {rate:.0}");
    ExitCode::SUCCESS
}
