// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab-harness bench`: MRPC echo through pcifab and through the in-tree C driver at
//! several firmware completion delays, payload sizes and caller counts, and bind/unbind
//! latency through pcifab against raw hot-plug (Documentation/benchmarks.rst); the data of
//! the charts `make bench` writes.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::charts::{Panel, Scale, Series};
use crate::checks::{
    back_to_pcifab, begin, check_bound_pcifab, dmesg_clean, emu_owners, ensure_pcifab, wait_for,
    GPU0, PCIFAB_KO, SWITCHTEC_KO,
};
use crate::config::Expected;
use crate::fabric::{EmuControl, Fabric, Host};

/// Firmware completion delays (us), payload sizes (bytes) and caller counts of the table.
pub const DELAYS_US: [u64; 3] = [0, 20, 200];
pub const SIZES: [usize; 4] = [4, 64, 256, 1024];
pub const CALLERS: [usize; 2] = [1, 4];
/// Alternations of the two drivers (ABAB: per completion delay, pcifab's points, then
/// switchtec.ko's, this many times).
pub const ALTERNATIONS: usize = 5;
/// Measured round trips per point per alternation, over all callers; a short warm-up runs
/// first. Each point's figures pool `ALTERNATIONS * POINT_COUNT` round trips per driver.
pub const POINT_COUNT: u64 = 1000;
const WARMUP: u64 = 20;

/// One measured run of one point through one driver (one alternation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    /// Round trips made, over all callers.
    pub echoes: u64,
    /// The longest caller's run (s); the callers' runs overlap.
    pub secs: f64,
    /// Every round trip's latency (us), all callers.
    pub lat_us: Vec<u64>,
    /// The emulator's counts of the host's accesses to the MEP's BARs and of the MRPC
    /// commands it picked up, over the run.
    pub bar_reads: u64,
    pub bar_writes: u64,
    pub commands: u64,
}

impl Run {
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.echoes as f64 / self.secs
        } else {
            0.0
        }
    }
    pub fn p99_us(&self) -> f64 {
        quantile(&self.lat_us, 0.99)
    }
}

/// The `q` quantile of `v` as `pcifab-selftest` takes it: the sorted sample at
/// `round((n - 1) * q)` (NaN of nothing).
pub fn quantile(v: &[u64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    if s.is_empty() {
        return f64::NAN;
    }
    s[((s.len() - 1) as f64 * q).round() as usize] as f64
}

/// One side of one point: its runs, one per alternation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Side {
    pub runs: Vec<Run>,
}

impl Side {
    fn echoes(&self) -> u64 {
        self.runs.iter().map(|r| r.echoes).sum()
    }
    fn pooled(&self) -> Vec<u64> {
        self.runs
            .iter()
            .flat_map(|r| r.lat_us.iter().copied())
            .collect()
    }
    /// Round trips per second: all of them over the sum of the runs' lengths.
    pub fn rate(&self) -> f64 {
        let secs: f64 = self.runs.iter().map(|r| r.secs).sum();
        if secs > 0.0 {
            self.echoes() as f64 / secs
        } else {
            0.0
        }
    }
    /// Median and 99th percentile of every round trip of every run and caller (us).
    pub fn p50_us(&self) -> f64 {
        quantile(&self.pooled(), 0.5)
    }
    pub fn p99_us(&self) -> f64 {
        quantile(&self.pooled(), 0.99)
    }
    fn per_echo(&self, f: fn(&Run) -> u64) -> f64 {
        let n = self.echoes();
        if n == 0 {
            return f64::NAN;
        }
        self.runs.iter().map(f).sum::<u64>() as f64 / n as f64
    }
    /// BAR reads, BAR writes and both per round trip, and MRPC commands per round trip.
    pub fn reads_per_echo(&self) -> f64 {
        self.per_echo(|r| r.bar_reads)
    }
    pub fn writes_per_echo(&self) -> f64 {
        self.per_echo(|r| r.bar_writes)
    }
    pub fn mmio_per_echo(&self) -> f64 {
        self.per_echo(|r| r.bar_reads + r.bar_writes)
    }
    pub fn commands_per_echo(&self) -> f64 {
        self.per_echo(|r| r.commands)
    }
}

/// One point of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub delay_us: u64,
    pub size: usize,
    pub callers: usize,
    pub pcifab: Side,
    pub switchtec: Side,
}

impl Point {
    pub fn rate_ratio(&self) -> f64 {
        self.pcifab.rate() / self.switchtec.rate()
    }
    pub fn p99_ratio(&self) -> f64 {
        self.pcifab.p99_us() / self.switchtec.p99_us()
    }
    /// The per-alternation ratios of `f` (pcifab / switchtec.ko, the runs of one
    /// alternation paired).
    fn paired(&self, f: fn(&Run) -> f64) -> Vec<f64> {
        self.pcifab
            .runs
            .iter()
            .zip(&self.switchtec.runs)
            .map(|(a, b)| f(a) / f(b))
            .collect()
    }
    /// 95 % intervals of the rate and p99 ratios over the alternations
    /// ([`ratio_t_interval`]).
    pub fn rate_ratio_ci(&self) -> (f64, f64) {
        ratio_t_interval(&self.paired(Run::rate))
    }
    pub fn p99_ratio_ci(&self) -> (f64, f64) {
        ratio_t_interval(&self.paired(Run::p99_us))
    }
    /// Goal: pcifab at least as fast and no worse at the 99th percentile.
    pub fn meets_goal(&self) -> bool {
        self.rate_ratio() >= 1.0 && self.p99_ratio() <= 1.0
    }
    /// Goal: pcifab makes no more BAR accesses per command than switchtec.ko.
    pub fn mmio_meets_goal(&self) -> bool {
        self.pcifab.mmio_per_echo() <= self.switchtec.mmio_per_echo()
    }
}

/// Two-sided 97.5 % quantiles of Student's t for 1 to 10 degrees of freedom.
const T_975: [f64; 10] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
];

/// A 95 % interval of a ratio from its paired per-alternation values: Student's t on their
/// logarithms (mean +- t * sd / sqrt(n), n - 1 degrees of freedom; past 10 the quantile of
/// 10, which is wider than the true one), back to ratios. It covers the spread between
/// alternations, i.e. the shared machine's drift, not only the sampling noise within a run.
/// NaN with fewer than two values or a value that is not positive.
pub fn ratio_t_interval(ratios: &[f64]) -> (f64, f64) {
    let n = ratios.len();
    if n < 2 || ratios.iter().any(|r| !(*r > 0.0 && r.is_finite())) {
        return (f64::NAN, f64::NAN);
    }
    let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    let mean = logs.iter().sum::<f64>() / n as f64;
    let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let t = T_975[(n - 2).min(T_975.len() - 1)];
    let half = t * (var / n as f64).sqrt();
    ((mean - half).exp(), (mean + half).exp())
}

fn num(v: &Value, k: &str) -> Result<f64, String> {
    v.get(k)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("selftest JSON {v}: expected a number in {k:?}"))
}

/// `callers` processes of `pcifab-selftest <sub>` at once, `count` echoes of `size` bytes
/// over all of them; every one must exit 0 and report. The emulator's counts of `h`'s BAR
/// accesses and MRPC commands are read right before and after.
fn run_point(
    h: &mut Host,
    emu: &EmuControl,
    sub: &str,
    size: usize,
    callers: usize,
    count: u64,
) -> Result<Run, String> {
    let each = count.div_ceil(callers as u64).max(1);
    let script = format!(
        "rm -f /tmp/bench-*.json; pids=''; \
         for i in $(seq 1 {callers}); do \
           pcifab-selftest {sub} --count {each} --size {size} --seed $i --latencies > /tmp/bench-$i.json 2>&1 & \
           pids=\"$pids $!\"; \
         done; rc=0; for p in $pids; do wait $p || rc=1; done; cat /tmp/bench-*.json; exit $rc"
    );
    let before = emu.host_counters(&h.name)?;
    let t = Instant::now();
    let o = h.run_timeout(&script, Duration::from_secs(300))?;
    let wall = t.elapsed().as_secs_f64();
    let after = emu.host_counters(&h.name)?;
    if o.code != 0 {
        return Err(format!(
            "{}: {callers} x `pcifab-selftest {sub} --count {each} --size {size}` failed \
             (exit {}):\n{}",
            h.name, o.code, o.out
        ));
    }
    let reports: Vec<Value> = o
        .out
        .lines()
        .filter(|l| l.starts_with("{\"test\":"))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: selftest JSON: {e}; output:\n{}", h.name, o.out))?;
    if reports.len() != callers {
        return Err(format!(
            "{}: expected {callers} reports of `pcifab-selftest {sub}`, got {}:\n{}",
            h.name,
            reports.len(),
            o.out
        ));
    }
    let mut run = combine(&reports, each)?;
    run.bar_reads = after.bar_reads.saturating_sub(before.bar_reads);
    run.bar_writes = after.bar_writes.saturating_sub(before.bar_writes);
    run.commands = after.mrpc_commands.saturating_sub(before.mrpc_commands);
    h.log_note(&format!(
        "bench {sub} size {size} callers {callers}: {} echoes, {:.3} s in the guest ({wall:.3} \
         s wall), p99 {:.0} us, {} BAR reads, {} BAR writes, {} MRPC commands; {}",
        run.echoes,
        run.secs,
        run.p99_us(),
        run.bar_reads,
        run.bar_writes,
        run.commands,
        reports
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if let Some(m) = r.as_object_mut() {
                    m.remove("lat_us");
                }
                r.to_string()
            })
            .collect::<Vec<_>>()
            .join(" ")
    ));
    Ok(run)
}

/// One run from its callers' reports of `each` echoes: all round trips over the longest
/// caller's run (their windows overlap), every caller's latencies.
fn combine(reports: &[Value], each: u64) -> Result<Run, String> {
    if reports.is_empty() {
        return Err("no selftest reports".into());
    }
    let mut run = Run {
        echoes: each * reports.len() as u64,
        ..Run::default()
    };
    for r in reports {
        run.secs = run.secs.max(num(r, "secs")?);
        let lat = r
            .get("lat_us")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("selftest JSON {r}: expected the latencies in \"lat_us\""))?;
        if lat.len() as u64 != each {
            return Err(format!(
                "selftest JSON: {} latencies, expected {each}",
                lat.len()
            ));
        }
        for l in lat {
            run.lat_us.push(
                l.as_u64()
                    .ok_or_else(|| format!("selftest JSON: latency {l} is not a number"))?,
            );
        }
    }
    Ok(run)
}

/// Every (size, callers) point of completion delay `d` through `sub`, one run each.
fn sweep(f: &mut Fabric, sub: &str, d: u64) -> Result<Vec<Run>, String> {
    let emu = f.emu();
    emu.request(&format!("fault all completion-delay {d}"))?;
    let h = &mut f.hosts[0];
    let mut out = Vec::new();
    for size in SIZES {
        for callers in CALLERS {
            run_point(h, &emu, sub, size, 1, WARMUP)?;
            out.push(run_point(h, &emu, sub, size, callers, POINT_COUNT)?);
        }
    }
    Ok(out)
}

/// The MRPC chart: echo rate against payload size, one line per driver per completion
/// delay, one panel per caller count.
pub fn mrpc_panels(points: &[Point]) -> Vec<Panel> {
    CALLERS
        .iter()
        .map(|&callers| {
            let mut series = Vec::new();
            for d in DELAYS_US {
                for name in ["pcifab", "switchtec"] {
                    let pts: Vec<(f64, f64)> = points
                        .iter()
                        .filter(|p| p.delay_us == d && p.callers == callers)
                        .map(|p| {
                            let side = if name == "pcifab" {
                                &p.pcifab
                            } else {
                                &p.switchtec
                            };
                            (p.size as f64, side.rate())
                        })
                        .collect();
                    if !pts.is_empty() {
                        series.push(Series {
                            name: format!("{name} {d} us"),
                            points: pts,
                        });
                    }
                }
            }
            Panel {
                title: format!(
                    "MRPC echo, {callers} caller{} (line: driver, firmware completion delay)",
                    if callers == 1 { "" } else { "s" }
                ),
                x_label: "payload (bytes)".into(),
                y_label: "round trips/s".into(),
                x: Scale::Log2Bytes,
                y: Scale::Log10,
                series,
            }
        })
        .collect()
}

/// One size of the P2P benchmark (MiB/s, best of each side's repetitions).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct P2pRow {
    pub bytes: u64,
    /// The DMA engine through the fabric, timed in the guest around the ioctl.
    pub fabric: f64,
    /// The guest's CPU bounce through host memory.
    pub bounce: f64,
    /// Bounce time / fabric time, as p2p-bench computed it.
    pub ratio: f64,
    /// The emulator's own copy of the same bytes between the two functions' memories.
    pub memcpy: f64,
}

impl P2pRow {
    /// Fabric throughput / memcpy throughput.
    pub fn efficiency(&self) -> f64 {
        self.fabric / self.memcpy
    }
}

/// The P2P chart: throughput against copy size (fabric, the emulator's memcpy, the CPU
/// bounce), and the fabric's efficiency against the memcpy.
pub fn p2p_panels(rows: &[P2pRow]) -> Vec<Panel> {
    let line = |name: &str, f: fn(&P2pRow) -> f64| Series {
        name: name.into(),
        points: rows.iter().map(|r| (r.bytes as f64, f(r))).collect(),
    };
    vec![
        Panel {
            title: "P2P copy 0x0300:0 -> 0x0400:0, best of each".into(),
            x_label: "copy size (bytes)".into(),
            y_label: "MiB/s".into(),
            x: Scale::Log2Bytes,
            y: Scale::Log10,
            series: vec![
                line("fabric (DMA engine)", |r| r.fabric),
                line("emulator memcpy", |r| r.memcpy),
                line("CPU bounce", |r| r.bounce),
            ],
        },
        Panel {
            title: "Fabric copy efficiency against the emulator's memcpy".into(),
            x_label: "copy size (bytes)".into(),
            y_label: "fabric / memcpy".into(),
            x: Scale::Log2Bytes,
            y: Scale::Log10,
            series: vec![line("fabric / memcpy", P2pRow::efficiency)],
        },
    ]
}

/// What each driver's MRPC completion path is (DMA MRPC or the mailbox).
pub struct Paths {
    pub pcifab: String,
    pub switchtec: String,
}

/// Unloads pcifab and loads switchtec.ko, or back.
fn swap(h: &mut Host, to_switchtec: bool) -> Result<(), String> {
    if to_switchtec {
        h.run_ok(&format!("rmmod pcifab && insmod {SWITCHTEC_KO}"))?;
        if !wait_for(h, "[ -c /dev/switchtec0 ]", 10)? {
            return Err(format!(
                "{}: /dev/switchtec0 did not appear after insmod switchtec",
                h.name
            ));
        }
        Ok(())
    } else {
        h.run_ok(&format!("rmmod switchtec && insmod {PCIFAB_KO}"))?;
        check_bound_pcifab(h)
    }
}

/// The MRPC table: per completion delay, every point through pcifab's ioctl, then through
/// switchtec.ko's /dev/switchtec0, in the same guest against the same emulated MEP (the
/// drivers alternate per delay, so a change of the shared machine's load hits both).
/// Leaves pcifab loaded and the completion delay at 0.
pub fn mrpc(f: &mut Fabric) -> Result<(Vec<Point>, Paths), String> {
    {
        let h = &mut f.hosts[0];
        ensure_pcifab(h)?;
        check_bound_pcifab(h)?;
    }
    let r = mrpc_inner(f);
    let _ = back_to_pcifab(&mut f.hosts[0]);
    f.emu().request("fault all completion-delay 0")?;
    r
}

fn mrpc_inner(f: &mut Fabric) -> Result<(Vec<Point>, Paths), String> {
    let mut points = Vec::new();
    for d in DELAYS_US {
        for size in SIZES {
            for callers in CALLERS {
                points.push(Point {
                    delay_us: d,
                    size,
                    callers,
                    pcifab: Side::default(),
                    switchtec: Side::default(),
                });
            }
        }
    }
    let per_delay = SIZES.len() * CALLERS.len();
    let mut switchtec_path = String::new();
    let mut pcifab_paths = Vec::new();
    let start = Instant::now();
    for alt in 0..ALTERNATIONS {
        pcifab_paths.clear();
        for (di, d) in DELAYS_US.into_iter().enumerate() {
            let p = sweep(f, "echo", d)?;
            let h = &mut f.hosts[0];
            let on = h.run_ok("cat /sys/class/misc/pcifab0/mrpc_dma")?;
            let n = h.run_ok("cat /sys/class/misc/pcifab0/mrpc_dma_commands")?;
            pcifab_paths.push(format!(
                "{d} us: mrpc_dma {} ({} commands through DMA MRPC since load)",
                on.trim(),
                n.trim()
            ));
            swap(h, true)?;
            let s = sweep(f, "switchtec-echo", d)?;
            let h = &mut f.hosts[0];
            // switchtec.ko takes DMA MRPC when dma_ver is non-zero and use_dma_mrpc is set;
            // its interrupts (the event vector and, with DMA MRPC, the DMA MRPC vector)
            // show which.
            switchtec_path = format!(
                "use_dma_mrpc {}; /proc/interrupts: {}",
                h.run_ok("cat /sys/module/switchtec/parameters/use_dma_mrpc")?
                    .trim(),
                h.run("grep switchtec /proc/interrupts | tr -s ' ' | tr '\\n' ';'")?
                    .out
                    .trim()
            );
            swap(h, false)?;
            let pts = &mut points[di * per_delay..(di + 1) * per_delay];
            for ((pt, a), b) in pts.iter_mut().zip(p).zip(s) {
                pt.pcifab.runs.push(a);
                pt.switchtec.runs.push(b);
            }
        }
        crate::say(&format!(
            "# MRPC alternation {} of {ALTERNATIONS} done, {:.0} s since the start",
            alt + 1,
            start.elapsed().as_secs_f64()
        ));
    }
    let pcifab_path = pcifab_paths.join(", ");
    Ok((
        points,
        Paths {
            pcifab: pcifab_path,
            switchtec: switchtec_path,
        },
    ))
}

/// Binds and unbinds measured per side.
pub const COMPOSE_N: usize = 5;

/// Bind-to-usable and unbind latencies (ms) through pcifab and the raw baselines.
pub struct ComposeBench {
    pub bind_ms: Vec<f64>,
    /// The same bind through the driver's sysfs `bind` file (a shell's `echo`, no process
    /// started): the driver's share without the CLI's start.
    pub bind_sysfs_ms: Vec<f64>,
    pub unbind_ms: Vec<f64>,
    pub raw_add_ms: Vec<f64>,
    /// Slot powered off through sysfs, then QMP `device_del`, to DEVICE_DELETED.
    pub raw_del_ms: Vec<f64>,
    /// Of each pcifab bind: the bind ioctl as the CLI timed it (`elapsed_ms`; it returns
    /// once the function is enumerated) and the time since this host's last power-off of
    /// the slot.
    pub bind_cmd_ms: Vec<f64>,
    /// Of each pcifab unbind: the unbind ioctl as the CLI timed it (`elapsed_ms`).
    pub unbind_cmd_ms: Vec<f64>,
    pub since_poweroff_ms: Vec<f64>,
    /// The test world's share, per round: the agent's round trip to a guest shell running
    /// one built-in (`true`), and the same running `pcifab --version` (the CLI's start and
    /// exit on top).
    pub agent_rt_ms: Vec<f64>,
    pub cli_rt_ms: Vec<f64>,
}

/// The median (NaN of nothing).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return f64::NAN;
    }
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The slot directory under /sys/bus/pci/slots whose address is `addr` (`0000:04:00`).
fn slot_of(h: &mut Host, addr: &str) -> Result<String, String> {
    let o = h.run_ok(&format!(
        "for s in /sys/bus/pci/slots/*; do [ \"$(cat $s/address)\" = {addr} ] && echo $s; done; true"
    ))?;
    o.lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no hot-plug slot with address {addr}", h.name))
}

/// The driver's `bind` file of the one endpoint of the bench's fabric (Documentation/sysfs.rst).
const SYSFS_BIND: &str = "/sys/class/misc/pcifab0/bind";

/// The `elapsed_ms` of the `pcifab --json <cmd>` line in `out` (a reader's line may be
/// another one).
fn elapsed_ms(out: &str, cmd: &str) -> Result<f64, String> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v.get("elapsed_ms").and_then(Value::as_f64))
        .ok_or_else(|| format!("pcifab --json {cmd} printed no elapsed_ms: {out}"))
}

/// Runs the bind command `cmd` in `h` and the reader of BAR0 of `bdf` right after it, as
/// the reader starts right after `device_add` on the raw side (started first, its start
/// would delay the command measured). Returns the ms until the function is usable and the
/// command has returned, whichever is later, and the output (one JSON line of each; nothing
/// else runs in the guest, as on the raw side), after checking that BAR0 read GPU0's PDFID.
fn bind_to_usable(h: &mut Host, what: &str, cmd: &str, bdf: &str) -> Result<(f64, String), String> {
    let t = Instant::now();
    let out = h.run_ok(&format!(
        "{cmd} & p=$!; pcifab-selftest bar-id --device {bdf} --wait 30000 & r=$!; \
         if wait $p; then wait $r; else kill $r; false; fi"
    ))?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    if !reads_gpu0(&out) {
        return Err(format!(
            "{what}: BAR0 of {bdf}: expected pdfid {GPU0:#06x}, got {out}"
        ));
    }
    Ok((ms, out))
}

/// Whether a reader's output shows GPU0's PDFID in BAR0.
fn reads_gpu0(out: &str) -> bool {
    out.contains(&format!("\"pdfid\":\"{GPU0:#06x}\""))
}

/// Host 0 only: GPU0 (0x0300) on logical port 1 (`dsp1`, bus 04), in each round bound and
/// unbound through the pcifab CLI, bound through the driver's sysfs file and unbound again,
/// and hot-plugged by the harness's own QMP `device_add`, then removed by powering the slot
/// off through sysfs and QMP `device_del`; never two of them at once.
pub fn compose(f: &mut Fabric) -> Result<ComposeBench, String> {
    let emu = f.emu();
    let e = f.expected.clone();
    let run_dir = f.run_dir.clone();
    let h = &mut f.hosts[0];
    begin(h)?;
    let (bound, _) = emu_owners(&emu, &e)?;
    for p in bound.keys() {
        emu.request(&format!("unbind {p:#06x}"))?;
    }
    let bdf = "0000:04:00.0";
    let slot = slot_of(h, "0000:04:00")?;
    let sock = run_dir.join(format!("fn-{GPU0:04x}.sock"));
    let mut r = ComposeBench {
        bind_ms: Vec::new(),
        bind_sysfs_ms: Vec::new(),
        unbind_ms: Vec::new(),
        raw_add_ms: Vec::new(),
        raw_del_ms: Vec::new(),
        bind_cmd_ms: Vec::new(),
        unbind_cmd_ms: Vec::new(),
        since_poweroff_ms: Vec::new(),
        agent_rt_ms: Vec::new(),
        cli_rt_ms: Vec::new(),
    };
    let mut powered_off: Option<Instant> = None;
    // One unmeasured round of each warms the guest's page cache and QEMU.
    for i in 0..=COMPOSE_N {
        let since = powered_off.map_or(f64::INFINITY, |t| t.elapsed().as_secs_f64() * 1000.0);
        let (bind, out) = bind_to_usable(
            h,
            "pcifab bind",
            &format!("pcifab --json bind {GPU0:#06x} --host 0 --port 1"),
            bdf,
        )?;
        let bind_cmd = elapsed_ms(&out, "bind")?;
        let t = Instant::now();
        let out = h.run_ok(&format!("pcifab --json unbind {GPU0:#06x}"))?;
        let unbind = t.elapsed().as_secs_f64() * 1000.0;
        let unbind_cmd = elapsed_ms(&out, "unbind")?;
        // The same bind through sysfs.
        let (bind_sysfs, _) = bind_to_usable(
            h,
            "sysfs bind",
            &format!("echo '{GPU0:#06x} 0 1' > {SYSFS_BIND}"),
            bdf,
        )?;
        h.run_ok(&format!("pcifab unbind {GPU0:#06x}"))?;
        powered_off = Some(Instant::now());
        // The function must be free in the fabric before the harness plugs it itself.
        let (bound, _) = emu_owners(&emu, &e)?;
        if bound.contains_key(&GPU0) {
            return Err(format!(
                "{GPU0:#06x} still bound after pcifab unbind: {bound:?}"
            ));
        }
        let mut q = h.qmp()?;
        let dev = serde_json::json!({
            "driver": "vfio-user-pci", "id": "raw-0300", "bus": "dsp1",
            "socket": {"type": "unix", "path": sock.display().to_string()},
        });
        let t = Instant::now();
        q.execute("device_add", Some(dev))?;
        let out = h.run_ok(&format!(
            "pcifab-selftest bar-id --device {bdf} --wait 30000"
        ))?;
        let add = t.elapsed().as_secs_f64() * 1000.0;
        if !reads_gpu0(&out) {
            return Err(format!(
                "raw device_add: BAR0 of {bdf}: expected pdfid {GPU0:#06x}, got {out}"
            ));
        }
        let t = Instant::now();
        h.run_ok(&format!("echo 0 > {slot}/power"))?;
        // QEMU unplugs the devices of a slot the guest powered off (indicator off) itself;
        // `device_del` is then refused as DeviceNotFound and DEVICE_DELETED is already
        // queued.
        match q.execute("device_del", Some(serde_json::json!({"id": "raw-0300"}))) {
            Ok(_) => {}
            Err(e) if e.contains("DeviceNotFound") => {}
            Err(e) => return Err(e),
        }
        q.wait_event(
            "DEVICE_DELETED",
            |d| d.get("device").and_then(Value::as_str) == Some("raw-0300"),
            Instant::now() + Duration::from_secs(30),
        )?;
        let del = t.elapsed().as_secs_f64() * 1000.0;
        h.log_note(&format!(
            "bench round {i}: pcifab bind {bind:.0} ms (bind command {bind_cmd:.0} ms, \
             {since:.0} ms after pcifab's power-off of the slot), unbind {unbind:.0} ms (unbind command {unbind_cmd:.0} ms), \
             sysfs bind {bind_sysfs:.0} ms; raw device_add {add:.0} ms, power-off + \
             device_del {del:.0} ms"
        ));
        if i > 0 {
            r.bind_ms.push(bind);
            r.bind_sysfs_ms.push(bind_sysfs);
            r.unbind_ms.push(unbind);
            r.raw_add_ms.push(add);
            r.raw_del_ms.push(del);
            r.bind_cmd_ms.push(bind_cmd);
            r.unbind_cmd_ms.push(unbind_cmd);
            r.since_poweroff_ms.push(since);
        }
    }
    // After the rounds, so they run as before: the test world's share of a request made in
    // the guest.
    for _ in 0..COMPOSE_N {
        let t = Instant::now();
        h.run_ok("true")?;
        r.agent_rt_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        h.run_ok("pcifab --version >/dev/null")?;
        r.cli_rt_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    dmesg_clean(h)?;
    Ok(r)
}

/// Measured alternations of pcifab and the switchtec-user peer; one unmeasured alternation
/// comes first.
pub const PEER_N: usize = 10;
/// Bootstrap resamples of the 95 % intervals of the peer ratios.
const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// Where switchtec-user's CLI and the C driver's character device are in the guest
/// (`--switchtec-user`, `--switchtec`).
const SWITCHTEC_CLI: &str = "/bin/switchtec";
const SWITCHTEC_DEV: &str = "/dev/switchtec0";

/// One operation timed in the guest, from the guest clock's stamps of its markers and of
/// the kernel's hot-plug messages, in ms since its start marker.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stamps {
    /// Start marker to end marker.
    pub total_ms: f64,
    /// The `cmd` marker: after `pcifab bind` or `switchtec fabric gfms-bind` returned
    /// (the reader may still run), after `echo 0 > power` (before `gfms-unbind`).
    pub cmd_ms: Option<f64>,
    /// pciehp's first message between start and end: the slot's attention button or
    /// presence change, i.e. the emulator's `device_add` has reached the guest.
    pub card_ms: Option<f64>,
    /// MRPC commands the host sent from before the operation until after its end (the
    /// emulator's count).
    pub mrpc: u64,
}

/// One alternation: pcifab (A), then switchtec.ko with switchtec-user (B).
#[derive(Clone, Debug, Default)]
pub struct PeerRound {
    pub pcifab_bind: Stamps,
    pub peer_bind: Stamps,
    pub pcifab_unbind: Stamps,
    pub peer_unbind: Stamps,
    /// The CLI's `elapsed_ms` of pcifab's bind and unbind ioctls.
    pub pcifab_bind_ioctl_ms: f64,
    pub pcifab_unbind_ioctl_ms: f64,
}

/// The kernel log lines `[ secs] text` of `out` as (secs, text).
fn kmsg_lines(out: &str) -> Vec<(f64, &str)> {
    out.lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix('[')?;
            let (ts, text) = rest.split_once(']')?;
            Some((ts.trim().parse().ok()?, text.trim_start()))
        })
        .collect()
}

/// The stamps of operation `tag` in the kernel log `out`: its markers `pcifab-bench <tag>
/// start|cmd|end` and pciehp's first message between start and end.
fn stamps_of(out: &str, tag: &str) -> Result<Stamps, String> {
    let lines = kmsg_lines(out);
    let marker = |name: &str| {
        let want = format!("pcifab-bench {tag} {name}");
        lines.iter().find(|(_, t)| *t == want).map(|(s, _)| *s)
    };
    let (Some(start), Some(end)) = (marker("start"), marker("end")) else {
        return Err(format!(
            "no start and end markers of {tag:?} in the guest's kernel log:\n{out}"
        ));
    };
    let ms = |s: f64| (s - start) * 1000.0;
    let card = lines
        .iter()
        .find(|(s, t)| *s >= start && *s <= end && t.contains("pciehp"))
        .map(|(s, _)| ms(*s));
    Ok(Stamps {
        total_ms: ms(end),
        cmd_ms: marker("cmd").map(ms),
        card_ms: card,
        mrpc: 0,
    })
}

/// The shell function that writes a marker into the kernel log: a built-in `echo`, no
/// process started; level 7, which the console does not print.
const MARK: &str = "m() { echo \"<7>pcifab-bench $T $1\" > /dev/kmsg; }";
/// The guest's kernel log lines [`stamps_of`] reads.
const LOG_FILTER: &str = "dmesg | grep -E 'pcifab-bench|pciehp'";

/// Times bind command `cmd` and the BAR0 reader of `bdf`, started as in
/// [`bind_to_usable`], on the guest's clock from before the command's start until both
/// have ended, after checking that BAR0 read GPU0's PDFID. Returns the stamps and the
/// output.
fn timed_bind(
    h: &mut Host,
    emu: &EmuControl,
    tag: &str,
    cmd: &str,
    bdf: &str,
) -> Result<(Stamps, String), String> {
    let before = emu.mrpc_commands(&h.name)?;
    let out = h.run_ok(&format!(
        "T={tag}; {MARK}; m start; {cmd} & p=$!; \
         pcifab-selftest bar-id --device {bdf} --wait 30000 & r=$!; \
         if wait $p; then m cmd; wait $r; rc=$?; m end; exit $rc; else kill $r; false; fi"
    ))?;
    if !reads_gpu0(&out) {
        return Err(format!(
            "{tag}: BAR0 of {bdf}: expected pdfid {GPU0:#06x}, got {out}"
        ));
    }
    let log = h.run_ok(LOG_FILTER)?;
    let mut s = stamps_of(&log, tag)?;
    s.mrpc = emu.mrpc_commands(&h.name)?.saturating_sub(before);
    Ok((s, out))
}

/// Times unbind `script` (which may mark `cmd` with `m cmd`) on the guest's clock.
fn timed_unbind(
    h: &mut Host,
    emu: &EmuControl,
    tag: &str,
    script: &str,
) -> Result<(Stamps, String), String> {
    let before = emu.mrpc_commands(&h.name)?;
    let out = h.run_ok(&format!(
        "T={tag}; {MARK}; m start; {script} || exit 1; m end"
    ))?;
    let log = h.run_ok(LOG_FILTER)?;
    let mut s = stamps_of(&log, tag)?;
    s.mrpc = emu.mrpc_commands(&h.name)?.saturating_sub(before);
    Ok((s, out))
}

/// After an unbind: the guest has no function at `bdf` and the emulator shows GPU0 free.
fn check_unbound(
    h: &mut Host,
    emu: &EmuControl,
    e: &Expected,
    what: &str,
    bdf: &str,
) -> Result<(), String> {
    let (bound, _) = emu_owners(emu, e)?;
    if bound.contains_key(&GPU0) {
        return Err(format!("{GPU0:#06x} still bound after {what}: {bound:?}"));
    }
    if h.run(&format!("[ -e /sys/bus/pci/devices/{bdf} ]"))?.code == 0 {
        return Err(format!("{}: {bdf} still present after {what}", h.name));
    }
    Ok(())
}

/// pcifab's bind/unbind against what a PAX user runs without it: switchtec.ko on the MEP,
/// switchtec-user's `switchtec fabric gfms-bind` (then pciehp enumerates the function),
/// and the slot's power-off through sysfs followed by `switchtec fabric gfms-unbind`.
/// Host 0, GPU0 on logical port 1 as in [`compose`], the same BAR0 reader; the drivers
/// alternate, one bind and one unbind each per turn, all timed on the guest's clock by
/// markers in its kernel log. Leaves pcifab loaded.
pub fn peer(f: &mut Fabric) -> Result<Vec<PeerRound>, String> {
    let r = peer_inner(f);
    let _ = back_to_pcifab(&mut f.hosts[0]);
    let _ = f.hosts[0].run("echo ratelimit > /proc/sys/kernel/printk_devkmsg");
    r
}

fn peer_inner(f: &mut Fabric) -> Result<Vec<PeerRound>, String> {
    let emu = f.emu();
    let e = f.expected.clone();
    let port = *e.usp_ports.first().ok_or("the configuration has no host")?;
    let h = &mut f.hosts[0];
    if h.run(&format!("[ -x {SWITCHTEC_CLI} ] && [ -f {SWITCHTEC_KO} ]"))?
        .code
        != 0
    {
        return Err(format!(
            "{}: the comparison with switchtec-user needs {SWITCHTEC_CLI} and {SWITCHTEC_KO} \
             in the guest: give the harness --switchtec-user and --switchtec (make bench does)",
            h.name
        ));
    }
    begin(h)?;
    let (bound, _) = emu_owners(&emu, &e)?;
    for p in bound.keys() {
        emu.request(&format!("unbind {p:#06x}"))?;
    }
    // The markers are kernel log lines; /dev/kmsg keeps only ten in five seconds otherwise.
    h.run_ok("echo on > /proc/sys/kernel/printk_devkmsg")?;
    let bdf = "0000:04:00.0";
    let slot = slot_of(h, "0000:04:00")?;
    let gfms = format!("{SWITCHTEC_CLI} fabric gfms");
    let mut rounds = Vec::new();
    for i in 0..=PEER_N {
        let mut r = PeerRound::default();
        // A: pcifab.
        let (s, out) = timed_bind(
            h,
            &emu,
            &format!("r{i}-pcifab-bind"),
            &format!("pcifab --json bind {GPU0:#06x} --host 0 --port 1"),
            bdf,
        )?;
        r.pcifab_bind = s;
        r.pcifab_bind_ioctl_ms = elapsed_ms(&out, "bind")?;
        let (s, out) = timed_unbind(
            h,
            &emu,
            &format!("r{i}-pcifab-unbind"),
            &format!("pcifab --json unbind {GPU0:#06x}"),
        )?;
        r.pcifab_unbind = s;
        r.pcifab_unbind_ioctl_ms = elapsed_ms(&out, "unbind")?;
        check_unbound(h, &emu, &e, "pcifab unbind", bdf)?;
        // B: switchtec.ko and switchtec-user.
        swap(h, true)?;
        let (s, _) = timed_bind(
            h,
            &emu,
            &format!("r{i}-peer-bind"),
            &format!("{gfms}-bind {SWITCHTEC_DEV} -s 0 -p {port} -l 1 -f {GPU0:#x}"),
            bdf,
        )?;
        r.peer_bind = s;
        let (s, _) = timed_unbind(
            h,
            &emu,
            &format!("r{i}-peer-unbind"),
            &format!(
                "echo 0 > {slot}/power && m cmd && \
                 {gfms}-unbind {SWITCHTEC_DEV} -s 0 -p {port} -l 1"
            ),
        )?;
        r.peer_unbind = s;
        check_unbound(h, &emu, &e, "slot power-off and gfms-unbind", bdf)?;
        swap(h, false)?;
        let o = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.1}"));
        h.log_note(&format!(
            "bench peer round {i} (guest clock, ms since each start): pcifab bind: pciehp {}, \
             pcifab returned {} (ioctl {:.0}), usable {:.1}; gfms-bind: pciehp {}, switchtec \
             returned {}, usable {:.1}; pcifab unbind {:.1} (ioctl {:.0}); power-off {}, \
             gfms-unbind returned {:.1}; MRPC commands: pcifab bind {}, unbind {}; \
             gfms-bind {}, gfms-unbind {}",
            o(r.pcifab_bind.card_ms),
            o(r.pcifab_bind.cmd_ms),
            r.pcifab_bind_ioctl_ms,
            r.pcifab_bind.total_ms,
            o(r.peer_bind.card_ms),
            o(r.peer_bind.cmd_ms),
            r.peer_bind.total_ms,
            r.pcifab_unbind.total_ms,
            r.pcifab_unbind_ioctl_ms,
            o(r.peer_unbind.cmd_ms),
            r.peer_unbind.total_ms,
            r.pcifab_bind.mrpc,
            r.pcifab_unbind.mrpc,
            r.peer_bind.mrpc,
            r.peer_unbind.mrpc
        ));
        if i > 0 {
            rounds.push(r);
        }
    }
    dmesg_clean(h)?;
    Ok(rounds)
}

/// The bind/unbind chart: per alternation of [`peer`], each side's bind (to the function
/// usable) and unbind, on the guest's clock.
pub fn peer_panels(rounds: &[PeerRound]) -> Vec<Panel> {
    let line = |name: &str, f: fn(&PeerRound) -> f64| Series {
        name: name.into(),
        points: rounds
            .iter()
            .enumerate()
            .map(|(i, r)| ((i + 1) as f64, f(r)))
            .collect(),
    };
    let panel = |what: &str, a: Series, b: Series| Panel {
        title: format!("{what}, one point per alternation (pcifab first, then switchtec-user)"),
        x_label: "alternation".into(),
        y_label: "ms".into(),
        x: Scale::Linear,
        y: Scale::Linear,
        series: vec![a, b],
    };
    vec![
        panel(
            "Bind until the function is usable",
            line("pcifab bind", |r| r.pcifab_bind.total_ms),
            line("switchtec fabric gfms-bind", |r| r.peer_bind.total_ms),
        ),
        panel(
            "Unbind",
            line("pcifab unbind", |r| r.pcifab_unbind.total_ms),
            line("power-off + gfms-unbind", |r| r.peer_unbind.total_ms),
        ),
    ]
}

/// A 95 % percentile-bootstrap interval of median(a) / median(b) over paired samples: the
/// pairs (one alternation each) are resampled together, [`BOOTSTRAP_RESAMPLES`] times,
/// with a fixed seed, so a run's interval can be recomputed from its samples.
pub fn ratio_interval(a: &[f64], b: &[f64]) -> (f64, f64) {
    let n = a.len().min(b.len());
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    // xorshift64*: enough to draw indices.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut ratios = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    let (mut ra, mut rb) = (vec![0.0; n], vec![0.0; n]);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        for k in 0..n {
            let j = (next() % n as u64) as usize;
            ra[k] = a[j];
            rb[k] = b[j];
        }
        ratios.push(median(&ra) / median(&rb));
    }
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    (at(0.025), at(0.975))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_combine_into_one_run() {
        let r = |secs: f64, lat: &[u64]| serde_json::json!({"test": "echo", "secs": secs, "lat_us": lat});
        let run = combine(&[r(0.5, &[100, 900, 300]), r(1.0, &[400, 200, 50])], 3).unwrap();
        assert_eq!(run.secs, 1.0);
        assert_eq!(run.echoes, 6);
        assert_eq!(run.rate(), 6.0);
        assert_eq!(run.lat_us, [100, 900, 300, 400, 200, 50]);
        // Sorted 50 100 200 300 400 900: round(5 * 0.5) = 3rd from 0, round(5 * 0.99) = 5th.
        assert_eq!(quantile(&run.lat_us, 0.5), 300.0);
        assert_eq!(run.p99_us(), 900.0);
        assert!(combine(&[], 60).is_err());
        let e = combine(&[serde_json::json!({"test": "echo"})], 1).unwrap_err();
        assert!(e.contains("secs"), "{e}");
        // Every round trip must be there.
        let e = combine(&[r(1.0, &[1, 2])], 3).unwrap_err();
        assert!(e.contains("2 latencies, expected 3"), "{e}");
        let e = combine(&[serde_json::json!({"test": "echo", "secs": 1.0})], 1).unwrap_err();
        assert!(e.contains("lat_us"), "{e}");
    }

    fn run(secs: f64, lat: Vec<u64>, reads: u64, writes: u64) -> Run {
        Run {
            echoes: lat.len() as u64,
            secs,
            lat_us: lat,
            bar_reads: reads,
            bar_writes: writes,
            commands: 0,
        }
    }

    #[test]
    fn sides_pool_their_alternations() {
        let s = Side {
            runs: vec![
                run(1.0, (1..=100).collect(), 300, 100),
                run(3.0, (101..=200).collect(), 500, 100),
            ],
        };
        // 200 round trips in 4 s; the quantiles of all 200; BAR accesses per round trip.
        assert_eq!(s.rate(), 50.0);
        assert_eq!(s.p50_us(), 101.0);
        assert_eq!(s.p99_us(), 198.0);
        assert_eq!(s.reads_per_echo(), 4.0);
        assert_eq!(s.writes_per_echo(), 1.0);
        assert_eq!(s.mmio_per_echo(), 5.0);
        assert!(Side::default().mmio_per_echo().is_nan());
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn t_interval_of_paired_ratios() {
        // Equal ratios: no spread.
        let (lo, hi) = ratio_t_interval(&[2.0; 5]);
        assert!(
            (lo - 2.0).abs() < 1e-12 && (hi - 2.0).abs() < 1e-12,
            "{lo} {hi}"
        );
        // ln r = +-0.1 alternating over 5 (mean 0.02): half-width 2.776 * sd / sqrt 5.
        let logs = [0.1, -0.1, 0.1, -0.1, 0.1];
        let ratios: Vec<f64> = logs.iter().map(|l: &f64| l.exp()).collect();
        let (lo, hi) = ratio_t_interval(&ratios);
        let mean: f64 = 0.02;
        let sd = (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / 4.0).sqrt();
        let half = 2.776 * sd / 5f64.sqrt();
        assert!((lo.ln() - (mean - half)).abs() < 1e-9, "{lo}");
        assert!((hi.ln() - (mean + half)).abs() < 1e-9, "{hi}");
        assert!(lo < 1.0 && hi > 1.0);
        // Too few alternations, or a ratio that is not positive: no interval.
        assert!(ratio_t_interval(&[1.0]).0.is_nan());
        assert!(ratio_t_interval(&[1.0, 0.0]).0.is_nan());
        assert!(ratio_t_interval(&[1.0, f64::NAN]).1.is_nan());
    }

    #[test]
    fn stamps_from_the_kernel_log() {
        let log = "[   30.298345] pcifab-bench r0-pcifab-bind start\n\
                   [   30.335103] pcieport 0000:02:01.0: pciehp: Slot(1-1): Button press: will power on in 5 sec\n\
                   [   30.335482] pcieport 0000:02:01.0: pciehp: Slot(1-1): Card present\n\
                   [   30.509942] pcifab-bench r0-pcifab-bind cmd\n\
                   [   30.512217] pcifab-bench r0-pcifab-bind end\n\
                   [   30.545124] pcifab-bench r0-pcifab-unbind start\n\
                   [   31.676134] pcifab-bench r0-pcifab-unbind end\n\
                   [   32.111145] pcieport 0000:02:01.0: pciehp: Slot(1-1): Button press\n\
                   [   33.601097] pcifab-bench r10-pcifab-bind start\n";
        let s = stamps_of(log, "r0-pcifab-bind").unwrap();
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(near(s.total_ms, 213.872), "{s:?}");
        assert!(near(s.cmd_ms.unwrap(), 211.597), "{s:?}");
        assert!(near(s.card_ms.unwrap(), 36.758), "{s:?}");
        // pciehp's messages outside an operation's markers are not its own.
        let u = stamps_of(log, "r0-pcifab-unbind").unwrap();
        assert!(near(u.total_ms, 1131.01), "{u:?}");
        assert_eq!((u.cmd_ms, u.card_ms), (None, None));
        // r1 is not r10, and an operation without its end is an error.
        assert!(stamps_of(log, "r1-pcifab-bind").is_err());
        assert!(stamps_of(log, "r10-pcifab-bind").is_err());
    }

    #[test]
    fn bootstrap_interval_of_a_ratio() {
        let a = [
            210.0, 227.0, 201.0, 202.0, 215.0, 273.0, 227.0, 205.0, 235.0, 226.0,
        ];
        let b = [
            206.0, 212.0, 218.0, 264.0, 217.0, 280.0, 213.0, 232.0, 206.0, 229.0,
        ];
        let (lo, hi) = ratio_interval(&a, &b);
        let r = median(&a) / median(&b);
        assert!(lo <= r && r <= hi && lo < hi, "{lo} {r} {hi}");
        assert!(lo > 0.8 && hi < 1.2, "{lo} {hi}");
        // The same samples give the same interval (fixed seed).
        assert_eq!(ratio_interval(&a, &b), (lo, hi));
        // Identical sides: every resample's ratio is 1.
        assert_eq!(ratio_interval(&a, &a), (1.0, 1.0));
        assert!(ratio_interval(&[], &[]).0.is_nan());
    }

    #[test]
    fn bind_time_from_the_cli_line() {
        let out = "{\"pdfid\":\"0x0300\",\"bar0\":\"ok\"}\n\
                   {\"schema\":\"x\",\"ok\":true,\"pdfid\":\"0x0300\",\"elapsed_ms\":153}\n";
        assert_eq!(elapsed_ms(out, "bind").unwrap(), 153.0);
        assert!(elapsed_ms("{\"pdfid\":\"0x0300\"}\nnot json\n", "bind").is_err());
    }

    #[test]
    fn verdict_needs_both_ratios() {
        // One run of 100 round trips in `secs` whose latencies all are `p99_us`, with
        // `mmio` BAR accesses per round trip.
        let side = |secs: f64, p99_us: u64, mmio: u64| Side {
            runs: vec![run(secs, vec![p99_us; 100], mmio * 100, 0)],
        };
        let pt = |p: Side, s: Side| Point {
            delay_us: 20,
            size: 64,
            callers: 1,
            pcifab: p,
            switchtec: s,
        };
        assert!(pt(side(1.0, 10, 5), side(1.0, 10, 5)).meets_goal());
        assert!(pt(side(1.0, 10, 5), side(1.0, 10, 5)).mmio_meets_goal());
        // Slower, though better at p99.
        assert!(!pt(side(1.01, 5, 5), side(1.0, 10, 5)).meets_goal());
        // Faster, worse at p99.
        assert!(!pt(side(0.5, 11, 5), side(1.0, 10, 5)).meets_goal());
        // More MMIO per command.
        assert!(!pt(side(0.5, 5, 6), side(1.0, 10, 5)).mmio_meets_goal());
        // The ratios' intervals come from the paired alternations.
        let two = |a: f64, b: f64| Side {
            runs: vec![run(a, vec![10; 100], 0, 0), run(b, vec![10; 100], 0, 0)],
        };
        let p = pt(two(1.0, 1.0), two(2.0, 4.0));
        let (lo, hi) = p.rate_ratio_ci();
        assert!(lo < 2.0 && hi > 4.0, "{lo} {hi}");
        assert_eq!(p.p99_ratio_ci(), (1.0, 1.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn chart_data() {
        // One run of 1000 round trips in 1000 / rate s.
        let side = |rate: f64| Side {
            runs: vec![run(1000.0 / rate, vec![1; 1000], 0, 0)],
        };
        let mut points = Vec::new();
        for d in DELAYS_US {
            for size in SIZES {
                for callers in CALLERS {
                    points.push(Point {
                        delay_us: d,
                        size,
                        callers,
                        pcifab: side(1000.0 + d as f64),
                        switchtec: side(100.0),
                    });
                }
            }
        }
        let m = mrpc_panels(&points);
        assert_eq!(m.len(), CALLERS.len());
        let names: Vec<&str> = m[0].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "pcifab 0 us",
                "switchtec 0 us",
                "pcifab 20 us",
                "switchtec 20 us",
                "pcifab 200 us",
                "switchtec 200 us"
            ]
        );
        assert_eq!(
            m[1].series[4].points,
            SIZES.map(|s| (s as f64, 1200.0)).to_vec()
        );
        let row = |bytes: u64, fabric: f64| P2pRow {
            bytes,
            fabric,
            bounce: 10.0,
            ratio: 0.0,
            memcpy: 2.0 * fabric,
        };
        let p = p2p_panels(&[row(4096, 1.0), row(16 << 20, 3000.0)]);
        assert_eq!(p[0].series.len(), 3);
        assert_eq!(p[0].series[1].points, [(4096.0, 2.0), (16777216.0, 6000.0)]);
        assert_eq!(p[1].series[0].points, [(4096.0, 0.5), (16777216.0, 0.5)]);
        // Both render.
        let dir = std::env::temp_dir().join(format!("pcifab-bench-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        crate::charts::write_svg(&dir.join("mrpc.svg"), "MRPC", &m).unwrap();
        crate::charts::write_svg(&dir.join("p2p.svg"), "P2P", &p).unwrap();
        let stamps = |total_ms| Stamps {
            total_ms,
            ..Stamps::default()
        };
        let rounds: Vec<PeerRound> = (0..3)
            .map(|i| PeerRound {
                pcifab_bind: stamps(170.0 + i as f64),
                peer_bind: stamps(200.0),
                pcifab_unbind: stamps(1050.0),
                peer_unbind: stamps(1100.0 - i as f64),
                ..PeerRound::default()
            })
            .collect();
        let b = peer_panels(&rounds);
        assert_eq!(b.len(), 2);
        assert_eq!(
            b[0].series[0].points,
            [(1.0, 170.0), (2.0, 171.0), (3.0, 172.0)]
        );
        assert_eq!(b[0].series[1].points[2], (3.0, 200.0));
        assert_eq!(b[1].series[0].points[0], (1.0, 1050.0));
        assert_eq!(b[1].series[1].points[2], (3.0, 1098.0));
        crate::charts::write_svg(&dir.join("bind.svg"), "bind", &b).unwrap();
        assert!(std::fs::read_to_string(dir.join("bind.svg"))
            .unwrap()
            .contains("gfms-bind"));
        let svg = std::fs::read_to_string(dir.join("mrpc.svg")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.contains("switchtec 200 us"));
    }
}
