// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab-manager-bench`: scheduling cost, fair share and pool utilisation of the manager's
//! scheduler on a simulated fabric (Documentation/benchmarks.rst, "Fabric manager
//! scheduling").
//!
//! `cargo run --release -p pcifab-manager --bin pcifab-manager-bench [-- --seed N]
//! [--charts DIR]`; `--charts DIR` (or `PCIFAB_BENCH_CHARTS=DIR`) also writes the scaling
//! table as the chart `DIR/bench-scheduler-scaling.svg`.

use std::path::PathBuf;
use std::process::ExitCode;

use pcifab_manager::bench;

// The harness's chart module, shared as a file so neither tool depends on the other; this
// chart does not use every scale it offers.
#[allow(dead_code)]
#[path = "../../../pcifab-harness/src/charts.rs"]
mod charts;

/// Environment variable naming the directory for the chart when `--charts` is not given.
const CHARTS_ENV: &str = "PCIFAB_BENCH_CHARTS";

/// The command line (Documentation/benchmarks.rst, "Fabric manager scheduling").
#[derive(clap::Parser, Debug)]
#[command(
    name = "pcifab-manager-bench",
    version,
    about = "Measures the fabric manager's scheduling cost and prints `bench NAME VALUE` lines"
)]
struct Args {
    /// Seed of the generated requests
    #[arg(long, value_name = "N", default_value_t = 0x5eed)]
    seed: u64,
    /// Write the charts (SVG) into DIR (default: $PCIFAB_BENCH_CHARTS when set and not empty)
    #[arg(long, value_name = "DIR", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    charts: Option<String>,
}

/// The scaling table as a chart: decisions per second, CPU time and ops per decision
/// against the queue, one line per pool size.
fn scaling_panels(rows: &[bench::Rate]) -> Vec<charts::Panel> {
    let mut pools: Vec<usize> = rows.iter().map(|r| r.functions).collect();
    pools.dedup();
    let panel = |title: &str, y_label: &str, f: fn(&bench::Rate) -> f64| charts::Panel {
        title: title.into(),
        x_label: "requests queued".into(),
        y_label: y_label.into(),
        x: charts::Scale::Linear,
        y: charts::Scale::Linear,
        series: pools
            .iter()
            .map(|&n| charts::Series {
                name: format!("{n} functions"),
                points: rows
                    .iter()
                    .filter(|r| r.functions == n)
                    .map(|r| (r.queued as f64, f(r)))
                    .collect(),
            })
            .collect(),
    };
    vec![
        panel(
            "Scheduling decisions per second of CPU time",
            "decisions/s",
            |r| r.per_second,
        ),
        panel("CPU time per decision", "ns/decision", |r| {
            r.ns_per_decision
        }),
        panel(
            "Queue entries examined and tree operations per decision",
            "ops/decision",
            |r| r.ops_per_decision,
        ),
    ]
}

fn main() -> ExitCode {
    // Bad usage exits with status 2, --help and --version with 0.
    let args = <Args as clap::Parser>::parse();
    let seed = args.seed;
    let charts_dir: Option<PathBuf> = args.charts.map(PathBuf::from).or_else(|| {
        std::env::var_os(CHARTS_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });

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
    let mut scaling = Vec::new();
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
            scaling.push(r);
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

    if let Some(dir) = charts_dir {
        let path = dir.join("bench-scheduler-scaling.svg");
        let title = format!(
            "Scheduler scaling: 5,000 decisions per point on full hybrid pools, seed {seed:#x}"
        );
        if let Err(e) = std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))
            .and_then(|()| charts::write_svg(&path, &title, &scaling_panels(&scaling)))
        {
            eprintln!("pcifab-manager-bench: chart not written: {e}");
            return ExitCode::FAILURE;
        }
        println!("# chart: {}", path.display());
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_chart_has_a_line_per_pool() {
        let rate = |queued, functions, per_second| bench::Rate {
            queued,
            functions,
            decisions: 5000,
            per_second,
            ns_per_decision: 1e9 / per_second,
            per_wall_second: per_second,
            grants_per_decision: 1.0,
            preemptions_per_decision: 0.5,
            ops_per_decision: 100.0,
            mean_queue: queued as f64,
        };
        let rows = [
            rate(1000, 256, 1e5),
            rate(2000, 256, 2e5),
            rate(1000, 1024, 5e4),
            rate(2000, 1024, 4e4),
        ];
        let p = scaling_panels(&rows);
        assert_eq!(p.len(), 3);
        let names: Vec<&str> = p[0].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["256 functions", "1024 functions"]);
        assert_eq!(p[0].series[1].points, [(1000.0, 5e4), (2000.0, 4e4)]);
        assert_eq!(p[1].series[0].points, [(1000.0, 1e4), (2000.0, 5e3)]);
        let dir = std::env::temp_dir().join(format!("pcifab-mgr-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.svg");
        charts::write_svg(&path, "scaling", &p).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.contains("1024 functions") && svg.contains("ops/decision"));
    }
}
