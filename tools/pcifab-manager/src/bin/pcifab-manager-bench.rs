// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab-manager-bench`: scheduling cost, fair share and pool utilisation of the manager's
//! scheduler on a simulated fabric (Documentation/benchmarks.rst, "Fabric manager
//! scheduling").
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

    // Scheduling cost.
    let r = bench::decisions_per_second(1000, 256, 20_000, seed);
    println!(
        "bench queue: {} requests waiting (mean {:.0}) on {} functions; per decision {:.2} grants, \
         {:.2} pre-emptions, {:.0} ops; {:.0} decisions per wall-clock second",
        r.queued,
        r.mean_queue,
        r.functions,
        r.grants_per_decision,
        r.preemptions_per_decision,
        r.ops_per_decision,
        r.per_wall_second
    );
    println!("bench schedule_decisions_per_second {:.0}", r.per_second);
    println!("bench queued  functions  decisions/s  ns/decision  ops/decision  grants/decision");
    for functions in [256, 1024, 4096] {
        for queued in [1000, 2000, 5000, 10_000] {
            let r = bench::decisions_per_second(queued, functions, 5_000, seed);
            println!(
                "bench {:>6}  {:>9}  {:>11.0}  {:>11.0}  {:>12.1}  {:>15.2}",
                queued,
                r.functions,
                r.per_second,
                r.ns_per_decision,
                r.ops_per_decision,
                r.grants_per_decision
            );
        }
    }

    // Fair share.
    let f = bench::fairshare_day(seed);
    let shares: Vec<String> = f
        .shares
        .iter()
        .map(|(n, w, s)| format!("{n} (weight {w}) {s:.3}"))
        .collect();
    println!(
        "bench fairshare: {} grants; GPU-hour shares {}",
        f.grants,
        shares.join(", ")
    );
    println!("bench fairshare_max_deviation {:.3}", f.max_deviation);

    // Sharing against the best static split.
    let day = bench::scripted_day(seed);
    println!(
        "bench day: {} jobs from {} hosts on {} GPUs; granted dynamic {} static {}; best static \
         split (GPUs per host) {:?}",
        day.jobs,
        bench::DAY_HOSTS,
        bench::DAY_GPUS,
        day.dynamic_granted,
        day.static_granted,
        day.static_split
    );
    println!(
        "bench pool_utilisation dynamic {:.3} best_static {:.3}",
        day.dynamic_utilisation, day.static_utilisation
    );
    println!(
        "bench pool_utilisation_ratio_vs_best_static {:.2}",
        day.dynamic_utilisation / day.static_utilisation.max(1e-9)
    );
    println!(
        "bench pool_utilisation_ratio_vs_best_static_aging_off {:.2} (diagnostic: dynamic side \
         with aging_s = 0)",
        day.dynamic_utilisation_aging_off / day.static_utilisation.max(1e-9)
    );
    println!(
        "bench pool_wait_mean_s_dynamic {:.0}",
        day.wait_mean_dynamic
    );
    println!("bench pool_wait_mean_s_static {:.0}", day.wait_mean_static);
    println!("bench pool_wait_p95_s_dynamic {:.0}", day.wait_p95_dynamic);
    println!("bench pool_wait_p95_s_static {:.0}", day.wait_p95_static);
    ExitCode::SUCCESS
}
