// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-harness bench`, part `dmaep` (pax dialect): copies through the switch's DMA
//! endpoint in one guest, all on that guest's clock: pcifab's copies between two user
//! buffers (basic mode) and into a buffer the other host registered (fabric mode), a CPU
//! copy of the same bytes, then Linux's own `switchtec_dma` with the kernel's `dmatest` on
//! the same endpoint (Documentation/benchmarks.rst, "The DMA endpoint").

use std::time::Duration;

use serde_json::Value;

use crate::bench::median;
use crate::checks::{begin, dmesg_clean, driver_of, two_hosts, wait_or_dmesg};
use crate::config::Dialect;
use crate::fabric::{Fabric, Host};
use crate::scenarios::dma_endpoint::{
    dmatest_one, emu_counts, find_dmaep, unload_dmatest, DMATEST_KO, SWITCHTEC_DMA_KO,
};

const MIB: u64 = 1 << 20;
/// Copy sizes of the table.
pub const SIZES: [u64; 5] = [4 << 10, 64 << 10, MIB, 16 * MIB, 64 * MIB];
/// Measured runs per size and side.
pub const RUNS: usize = 5;
/// 4 KiB copies per latency round (five rounds).
pub const LAT_COUNT: usize = 200;
/// The largest copy `switchtec_dma` takes (`SWITCHTEC_DESC_MAX_SIZE`, one descriptor per
/// copy), so the largest dmatest can ask of it.
pub const SWITCHTEC_DMA_MAX: u64 = MIB;
/// The pattern both sides copy (`pcifab-selftest dmaep-bench --seed`).
const SEED: u64 = 0x5eed;
/// Where h0's lending process keeps its files.
const LEND_DIR: &str = "/tmp/dmaep-lend";
const DMATEST_PARAMS: &str = "/sys/module/dmatest/parameters";
/// The endpoint's driver in pcifab.ko.
const PCIFAB_DMAEP: &str = "pcifab_dmaep";

/// Copies per run at `bytes`: at least 4 MiB a run up to 64 copies, one from 4 MiB up (the
/// same count on both sides).
pub fn copies_per_run(bytes: u64) -> u32 {
    (4 * MIB / bytes.max(1)).clamp(1, 64) as u32
}

/// The figure name of a size: `4k`, `64k`, `1m`, `16m`, `64m`.
pub fn size_name(bytes: u64) -> String {
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{}m", bytes / MIB)
    } else if bytes >= 1024 && bytes % 1024 == 0 {
        format!("{}k", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

/// One size of the table: every run's MiB/s of each side.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub bytes: u64,
    pub copies: u32,
    /// pcifab, basic mode (host memory to host memory).
    pub copy: Vec<f64>,
    /// The CPU copy of the same bytes, run by run beside `copy`.
    pub cpu: Vec<f64>,
    /// pcifab, fabric mode (into h0's registered buffer).
    pub fabric: Vec<f64>,
    /// switchtec_dma + dmatest (empty above [`SWITCHTEC_DMA_MAX`]).
    pub peer: Vec<f64>,
    /// dmatest's copies per second, per run.
    pub peer_iops: Vec<f64>,
}

/// The 4 KiB latency rounds (us): each round's p50, and the p99 of all copies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Latency {
    pub count: usize,
    pub copy_rounds: Vec<f64>,
    pub copy_p99: f64,
    pub cpu_rounds: Vec<f64>,
    pub cpu_p99: f64,
    pub fabric_rounds: Vec<f64>,
    pub fabric_p99: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DmaepBench {
    pub rows: Vec<Row>,
    pub lat: Latency,
    /// The measuring host and its endpoint, the lending host.
    pub host: String,
    pub bdf: String,
    pub lender: String,
    /// The dmatest channel.
    pub chan: String,
    /// The emulator's count of h1's endpoint over pcifab's copies (the selftest: every
    /// size, both modes, the latency rounds) and over dmatest's runs: entries completed
    /// and bytes copied, on every channel.
    pub pcifab_entries: Entries,
    pub peer_entries: Entries,
}

/// Entries an endpoint completed and the bytes they copied.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Entries {
    pub entries: u64,
    pub bytes: u64,
}

impl Entries {
    /// Entries per MiB copied (NaN of nothing).
    pub fn per_mib(self) -> f64 {
        if self.bytes == 0 {
            return f64::NAN;
        }
        self.entries as f64 * MIB as f64 / self.bytes as f64
    }
}

/// What an endpoint did between two readings of the emulator's counters
/// ([`emu_counts`]: completions, interrupts, bytes per channel).
fn entries_between(before: &[(u64, u64, u64)], after: &[(u64, u64, u64)]) -> Entries {
    before
        .iter()
        .zip(after)
        .fold(Entries::default(), |e, (b, a)| Entries {
            entries: e.entries + a.0.wrapping_sub(b.0),
            bytes: e.bytes + a.2.wrapping_sub(b.2),
        })
}

fn f64s(v: &Value, k: &str) -> Result<Vec<f64>, String> {
    v.get(k)
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
        .ok_or_else(|| format!("dmaep-bench: no list of numbers `{k}` in {v}"))
}

fn f64_of(v: &Value, k: &str) -> Result<f64, String> {
    v.get(k)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("dmaep-bench: no number `{k}` in {v}"))
}

/// The rows and the latency of `pcifab-selftest dmaep-bench`'s output. Every size must have
/// its basic line with `runs` runs of each side; fabric lines are merged into their rows.
pub fn parse_selftest(out: &str, runs: usize) -> Result<(Vec<Row>, Option<Latency>), String> {
    let mut rows: Vec<Row> = Vec::new();
    let mut lat = None;
    for l in out
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("{\"test\":\"dmaep-"))
    {
        let v: Value =
            serde_json::from_str(l).map_err(|e| format!("dmaep-bench: bad line {l}: {e}"))?;
        match v["test"].as_str() {
            Some("dmaep-bench") => {
                let bytes = v["bytes"]
                    .as_u64()
                    .ok_or_else(|| format!("dmaep-bench: no bytes in {v}"))?;
                let copies = v["copies"]
                    .as_u64()
                    .and_then(|c| u32::try_from(c).ok())
                    .ok_or_else(|| format!("dmaep-bench: no copies in {v}"))?;
                let got = f64s(&v, "runs_mib_s")?;
                if got.len() != runs {
                    return Err(format!(
                        "dmaep-bench: {} runs at {bytes} bytes, expected {runs}: {v}",
                        got.len()
                    ));
                }
                match v["mode"].as_str() {
                    Some("basic") => {
                        let cpu = f64s(&v, "cpu_runs_mib_s")?;
                        if cpu.len() != runs {
                            return Err(format!(
                                "dmaep-bench: {} CPU runs at {bytes} bytes, expected {runs}",
                                cpu.len()
                            ));
                        }
                        if rows.iter().any(|r| r.bytes == bytes) {
                            return Err(format!("dmaep-bench: two basic lines of {bytes} bytes"));
                        }
                        rows.push(Row {
                            bytes,
                            copies,
                            copy: got,
                            cpu,
                            ..Row::default()
                        });
                    }
                    Some("fabric") => {
                        let r = rows.iter_mut().find(|r| r.bytes == bytes).ok_or_else(|| {
                            format!(
                                "dmaep-bench: a fabric line of {bytes} bytes before its basic line"
                            )
                        })?;
                        r.fabric = got;
                    }
                    _ => return Err(format!("dmaep-bench: unknown mode in {v}")),
                }
            }
            Some("dmaep-latency") => {
                let count = v["count"]
                    .as_u64()
                    .ok_or_else(|| format!("dmaep-bench: no count in {v}"))?
                    as usize;
                let rounds = |k: &str| -> Result<Vec<f64>, String> {
                    let r = f64s(&v, k)?;
                    if r.len() < 5 {
                        return Err(format!(
                            "dmaep-bench: {} rounds of {k}, expected 5",
                            r.len()
                        ));
                    }
                    Ok(r)
                };
                let fabric = v.get("fabric_round_p50_us").is_some();
                lat = Some(Latency {
                    count,
                    copy_rounds: rounds("copy_round_p50_us")?,
                    copy_p99: f64_of(&v, "copy_p99_us")?,
                    cpu_rounds: rounds("cpu_round_p50_us")?,
                    cpu_p99: f64_of(&v, "cpu_p99_us")?,
                    fabric_rounds: if fabric {
                        rounds("fabric_round_p50_us")?
                    } else {
                        Vec::new()
                    },
                    fabric_p99: if fabric {
                        f64_of(&v, "fabric_p99_us")?
                    } else {
                        f64::NAN
                    },
                });
            }
            _ => {}
        }
    }
    if rows.is_empty() {
        return Err(format!("dmaep-bench printed no results: {}", out.trim()));
    }
    Ok((rows, lat))
}

/// One dmatest thread's summary line.
#[derive(Clone, Debug, PartialEq)]
pub struct DmatestRun {
    pub tests: u64,
    pub failures: u64,
    /// Copies per second over the thread's run, without its buffer fill and compare time.
    pub iops: f64,
    /// dmatest's own throughput figure (KiB of copies per second, an integer).
    pub kb_s: u64,
}

/// The summary of thread `CHAN-copy0` in `log`: `dmatest: CHAN-copy0: summary N tests, K
/// failures X.YY iops Z KB/s (E)` (drivers/dma/dmatest.c). Exactly one must be there.
pub fn dmatest_run(log: &str, chan: &str) -> Result<DmatestRun, String> {
    let want = format!("dmatest: {chan}-copy0: summary ");
    let found: Vec<DmatestRun> = log
        .lines()
        .filter_map(|l| {
            let rest = &l[l.find(&want)? + want.len()..];
            let w: Vec<&str> = rest.split_whitespace().collect();
            match w.as_slice() {
                [tests, "tests,", failures, "failures", iops, "iops", kb, "KB/s", ret, ..] => {
                    if *ret != "(0)" {
                        return None;
                    }
                    Some(DmatestRun {
                        tests: tests.parse().ok()?,
                        failures: failures.parse().ok()?,
                        iops: iops.parse().ok()?,
                        kb_s: kb.parse().ok()?,
                    })
                }
                _ => None,
            }
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(format!(
            "dmatest: no summary line of {chan}-copy0 with status (0) in the kernel log:\n{}",
            log.trim_end()
        )),
        more => Err(format!(
            "dmatest: {} summary lines of {chan}-copy0, expected one",
            more.len()
        )),
    }
}

/// MiB/s of a dmatest run of `bytes`-byte copies (norandom: every copy the whole buffer).
pub fn dmatest_mib_s(r: &DmatestRun, bytes: u64) -> f64 {
    r.iops * bytes as f64 / MIB as f64
}

/// A 95 % percentile-bootstrap interval of median(a) / median(b) for two independent
/// samples (each resampled on its own, 10,000 times, a fixed seed).
pub fn ratio_interval_unpaired(a: &[f64], b: &[f64]) -> (f64, f64) {
    if a.is_empty() || b.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut draw = |v: &[f64]| -> Vec<f64> {
        (0..v.len())
            .map(|_| v[(next() % v.len() as u64) as usize])
            .collect()
    };
    let mut ratios: Vec<f64> = (0..10_000)
        .map(|_| {
            let ra = draw(a);
            let rb = draw(b);
            median(&ra) / median(&rb)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    (at(0.025), at(0.975))
}

/// The HFID the endpoint `bdf` of `h` reports in sysfs.
fn hfid_of(h: &mut Host, bdf: &str) -> Result<u16, String> {
    let s = h.run_ok(&format!("cat /sys/bus/pci/devices/{bdf}/pcifab/hfid"))?;
    let t = s.trim();
    t.strip_prefix("0x")
        .and_then(|x| u16::from_str_radix(x, 16).ok())
        .ok_or_else(|| format!("{}: {bdf}/pcifab/hfid reads {t:?}, not an HFID", h.name))
}

/// The JSON line of `out` whose phase is `phase`.
fn phase_line(out: &str, phase: &str) -> Option<Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v.get("phase").and_then(Value::as_str) == Some(phase))
}

/// The endpoint of `h`, bound to pcifab.
fn pcifab_endpoint(h: &mut Host) -> Result<String, String> {
    let bdf = find_dmaep(h)?;
    match driver_of(h, &bdf)? {
        Some(d) if d == PCIFAB_DMAEP => Ok(bdf),
        d => Err(format!(
            "{}: DMA endpoint {bdf} is bound to {d:?}, expected {PCIFAB_DMAEP} (switchtec_dma \
             cannot be unbound once it bound: boot the host again)",
            h.name
        )),
    }
}

/// `make bench`'s DMA endpoint figures: h1 measures (no IOMMU: its copies map host memory
/// directly), h0 (with an IOMMU, so its buffer maps as one range) lends the buffer of
/// fabric mode. Leaves h1's endpoint bound to switchtec_dma.
pub fn bench(f: &mut Fabric) -> Result<DmaepBench, String> {
    if f.expected.dialect != Dialect::Pax {
        return Err(
            "the dmaep part runs on the pax dialect (the extended one copies through the \
             firmware's own engine): pcifab-harness bench --dialect pax --filter dmaep"
                .into(),
        );
    }
    if f.expected.dma_endpoint_channels == 0 {
        return Err("the emulator's configuration sets no dma_endpoint_channels".into());
    }
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "the dmaep part needs two hosts")?;
    if !crate::fabric::iommu_host(0) {
        return Err("h0 lends a 64 MiB buffer, which maps as one range only with an IOMMU".into());
    }
    for h in [&mut *h0, &mut *h1] {
        begin(h)?;
    }
    for ko in [SWITCHTEC_DMA_KO, DMATEST_KO] {
        if h1.run(&format!("[ -f {ko} ]"))?.code != 0 {
            return Err(format!(
                "{}: {ko} is not in the guest: the harness takes switchtec_dma.ko and \
                 dmatest.ko from beside --switchtec's switchtec.ko or from drivers/dma/ of its \
                 kernel build (`make switchtec-debian` builds them for Debian's kernel)",
                h1.name
            ));
        }
    }
    let bdf0 = pcifab_endpoint(h0)?;
    let bdf1 = pcifab_endpoint(h1)?;
    let (hfid0, hfid1) = (hfid_of(h0, &bdf0)?, hfid_of(h1, &bdf1)?);
    let max = *SIZES.iter().max().unwrap_or(&MIB);

    // h0 lends its buffer for h1's fabric-mode copies.
    h0.run_ok(&format!(
        "rm -rf {LEND_DIR} && mkdir -p {LEND_DIR} && (pcifab-selftest dmaep-lend --peer \
         {hfid1:#x} --len {max} --dir {LEND_DIR} </dev/null >{LEND_DIR}/out 2>&1 & \
         echo $! >{LEND_DIR}/pid)"
    ))?;
    wait_or_dmesg(
        h0,
        &format!("( grep -q registered {LEND_DIR}/out || [ ! -e /proc/$(cat {LEND_DIR}/pid) ] )"),
        60,
        "dmaep-lend did not register its buffer",
    )?;
    let out = h0.run_ok(&format!("cat {LEND_DIR}/out"))?;
    let slot = phase_line(&out, "registered")
        .and_then(|v| v.get("slot").and_then(Value::as_u64))
        .ok_or_else(|| format!("{}: dmaep-lend did not register: {}", h0.name, out.trim()))?;

    let sizes: Vec<String> = SIZES.iter().map(u64::to_string).collect();
    let copies: Vec<String> = SIZES
        .iter()
        .map(|&s| copies_per_run(s).to_string())
        .collect();
    let before = emu_counts(&emu, &h1.name)?;
    let out = h1.run_ok_timeout(
        &format!(
            "pcifab-selftest dmaep-bench --sizes {} --copies {} --runs {RUNS} --latency \
             {LAT_COUNT} --peer {hfid0:#x} --slot {slot} --peer-len {max} --seed {SEED:#x}",
            sizes.join(","),
            copies.join(",")
        ),
        Duration::from_secs(600),
    )?;
    let pcifab_entries = entries_between(&before, &emu_counts(&emu, &h1.name)?);
    let (mut rows, lat) = parse_selftest(&out, RUNS)?;
    let lat = lat.ok_or_else(|| format!("dmaep-bench printed no latency line: {}", out.trim()))?;
    if let Some(r) = rows.iter().find(|r| r.fabric.len() != RUNS) {
        return Err(format!(
            "dmaep-bench: no fabric-mode runs at {} bytes: {}",
            r.bytes,
            out.trim()
        ));
    }

    // h0 checks what arrived: the pattern over the whole buffer (the last copy of the sweep
    // filled it, the 4 KiB ones after rewrote its start with the same bytes).
    h0.run_ok(&format!(
        "echo '{max} {SEED:#x}' >{LEND_DIR}/check.part && mv {LEND_DIR}/check.part {LEND_DIR}/check"
    ))?;
    wait_or_dmesg(
        h0,
        &format!("( grep -q unregistered {LEND_DIR}/out || [ ! -e /proc/$(cat {LEND_DIR}/pid) ] )"),
        120,
        "dmaep-lend did not check and unregister",
    )?;
    let out0 = h0.run_ok(&format!("cat {LEND_DIR}/out"))?;
    let ok = phase_line(&out0, "checked").and_then(|v| v.get("ok").and_then(Value::as_bool));
    let errno =
        phase_line(&out0, "unregistered").and_then(|v| v.get("errno").and_then(Value::as_i64));
    if ok != Some(true) || errno != Some(0) {
        return Err(format!(
            "{}: the buffer h1 copied into does not hold its bytes, or did not unregister: {}",
            h0.name,
            out0.trim()
        ));
    }

    // The peer: Linux's switchtec_dma on the same endpoint of the same guest. It cannot be
    // unbound again (dma_endpoint.rs), so it comes last.
    let chan = switchtec_dma_on(h1, &bdf1)?;
    let before = emu_counts(&emu, &h1.name)?;
    let r = peer_runs(h1, &chan, &mut rows);
    let _ = unload_dmatest(h1);
    r?;
    let peer_entries = entries_between(&before, &emu_counts(&emu, &h1.name)?);
    dmesg_clean(h1)?;
    dmesg_clean(h0)?;
    Ok(DmaepBench {
        rows,
        lat,
        host: h1.name.clone(),
        bdf: bdf1,
        lender: h0.name.clone(),
        chan,
        pcifab_entries,
        peer_entries,
    })
}

/// Unbinds pcifab from the endpoint `bdf` of `h`, binds switchtec_dma and returns its first
/// channel.
fn switchtec_dma_on(h: &mut Host, bdf: &str) -> Result<String, String> {
    let did = h.run_ok(&format!("cat /sys/bus/pci/devices/{bdf}/device"))?;
    let did = did.trim().trim_start_matches("0x").to_string();
    h.run_ok(&format!(
        "echo {bdf} > /sys/bus/pci/drivers/{PCIFAB_DMAEP}/unbind && \
         {{ [ -d /sys/module/switchtec_dma ] || insmod {SWITCHTEC_DMA_KO}; }}"
    ))?;
    // Linux's table has no PAX ids: taught the id with its exact-class match.
    if driver_of(h, bdf)?.is_none() {
        h.run_ok(&format!(
            "echo '11f8 {did} ffffffff ffffffff 088000 ffffff' > \
             /sys/bus/pci/drivers/switchtec_dma/new_id"
        ))?;
    }
    wait_or_dmesg(
        h,
        &format!("[ -e /sys/bus/pci/devices/{bdf}/dma ]"),
        30,
        &format!("{bdf}: switchtec_dma did not bind the DMA endpoint"),
    )?;
    if driver_of(h, bdf)?.as_deref() != Some("switchtec_dma") {
        return Err(format!("{}: {bdf} is not bound to switchtec_dma", h.name));
    }
    let listed = h.run_ok(&format!("ls /sys/bus/pci/devices/{bdf}/dma/"))?;
    let mut chans: Vec<&str> = listed.split_whitespace().collect();
    chans.sort_unstable();
    chans
        .first()
        .map(|c| c.to_string())
        .ok_or_else(|| format!("{}: switchtec_dma made no channel on {bdf}", h.name))
}

/// [`RUNS`] dmatest runs on `chan` per size of `rows` it can copy, into the rows.
fn peer_runs(h: &mut Host, chan: &str, rows: &mut [Row]) -> Result<(), String> {
    unload_dmatest(h)?;
    h.run_ok(&format!("insmod {DMATEST_KO}"))?;
    for r in rows.iter_mut().filter(|r| r.bytes <= SWITCHTEC_DMA_MAX) {
        for _ in 0..RUNS {
            // Every copy the whole buffer from offset 0, checked by dmatest (its fill and
            // compare time is not in its figure).
            // The log so far must be clean before it is cleared.
            dmesg_clean(h)?;
            h.run_ok(&format!(
                "dmesg -c >/dev/null && cd {DMATEST_PARAMS} && echo {} > test_buf_size && \
                 echo {} > iterations && echo Y > norandom && echo N > noverify && \
                 echo 10000 > timeout",
                r.bytes, r.copies
            ))?;
            dmatest_one(h, chan, 300)?;
            dmesg_clean(h)?;
            let log = h.run_ok("dmesg -c")?;
            let run = dmatest_run(&log, chan)?;
            if run.tests != u64::from(r.copies) || run.failures != 0 {
                return Err(format!(
                    "{}: dmatest on {chan}, {} bytes: {} tests, {} failures (expected {}, 0)",
                    h.name, r.bytes, run.tests, run.failures, r.copies
                ));
            }
            r.peer.push(dmatest_mib_s(&run, r.bytes));
            r.peer_iops.push(run.iops);
        }
    }
    Ok(())
}

/// `med [min-max]` of `v` with `prec` decimals, `-` for no runs.
fn spread(v: &[f64], prec: usize) -> String {
    if v.is_empty() {
        return "-".to_string();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.prec$} [{lo:.prec$}-{hi:.prec$}]", median(v))
}

/// The lines the part prints: the table (`bench dmaep` rows and `#` notes) and the named
/// figures, `bench NAME VALUE`.
pub fn report(b: &DmaepBench) -> Vec<String> {
    let mut out = vec![
        format!(
            "# dmaep: copies through the switch's DMA endpoint {} of {}, all on {}'s monotonic \
             clock, MiB/s, median of {RUNS} runs [min-max], a run K copies in a row: basic = \
             pcifab host memory to host memory (PCIFAB_IOCTL_P2P_COPY between two user \
             buffers), fabric = pcifab into the buffer {} registered for {} (fabric mode), \
             cpu = copy_from_slice of the same bytes between the same buffers (run by run \
             beside basic), switchtec_dma = Linux's switchtec_dma + dmatest on {} of the same \
             endpoint afterwards (test_buf_size = the size, norandom, verified; dmatest's own \
             figure, without its fill and compare); ratio = basic / switchtec_dma [95 % \
             bootstrap]",
            b.bdf, b.host, b.host, b.lender, b.host, b.chan
        ),
        format!(
            "# {:>19} {:>2} | {:>27} | {:>27} | {:>27} | {:>27} | ratio [95 %]",
            "bytes",
            "K",
            "basic [min-max]",
            "fabric [min-max]",
            "cpu [min-max]",
            "switchtec_dma [min-max]"
        ),
    ];
    let mut named = Vec::new();
    for r in &b.rows {
        let n = size_name(r.bytes);
        let (ratio, lo, hi) = if r.peer.is_empty() {
            (f64::NAN, f64::NAN, f64::NAN)
        } else {
            let (lo, hi) = ratio_interval_unpaired(&r.copy, &r.peer);
            (median(&r.copy) / median(&r.peer), lo, hi)
        };
        out.push(format!(
            "bench dmaep {:>9} {:>2} | {:>27} | {:>27} | {:>27} | {:>27} | {}",
            r.bytes,
            r.copies,
            spread(&r.copy, 1),
            spread(&r.fabric, 1),
            spread(&r.cpu, 1),
            spread(&r.peer, 1),
            if r.peer.is_empty() {
                "-".to_string()
            } else {
                format!("{ratio:.3} [{lo:.3}-{hi:.3}]")
            }
        ));
        named.push(format!("bench dmaep_copy_mib_s_{n} {:.1}", median(&r.copy)));
        if !r.fabric.is_empty() {
            named.push(format!(
                "bench dmaep_fabric_mib_s_{n} {:.1}",
                median(&r.fabric)
            ));
        }
        named.push(format!("bench dmaep_cpu_mib_s_{n} {:.1}", median(&r.cpu)));
        if !r.peer.is_empty() {
            named.push(format!(
                "bench dmaep_switchtec_dma_mib_s_{n} {:.1}",
                median(&r.peer)
            ));
            named.push(format!(
                "bench dmaep_copy_ratio_vs_switchtec_dma_{n} {ratio:.3}"
            ));
            named.push(format!(
                "bench dmaep_copy_ratio_vs_switchtec_dma_{n}_ci95_low {lo:.3}"
            ));
            named.push(format!(
                "bench dmaep_copy_ratio_vs_switchtec_dma_{n}_ci95_high {hi:.3}"
            ));
        }
    }
    if b.rows.iter().any(|r| r.bytes > SWITCHTEC_DMA_MAX) {
        out.push(format!(
            "# no switchtec_dma figure above {} MiB: dmatest makes one descriptor per copy and \
             switchtec_dma takes at most 1 MiB in one (SWITCHTEC_DESC_MAX_SIZE)",
            SWITCHTEC_DMA_MAX / MIB
        ));
    }
    let l = &b.lat;
    let rounds = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    out.push(format!(
        "# dmaep 4 KiB latency in {}, guest clock, {} rounds of {} copies each, alternating \
         copy by copy (us): basic copy p50 per round {}, p99 of all {:.1}; CPU copy p50 per \
         round {}, p99 {:.1}; fabric copy p50 per round {}, p99 {:.1}",
        b.host,
        l.copy_rounds.len(),
        l.count,
        rounds(&l.copy_rounds),
        l.copy_p99,
        rounds(&l.cpu_rounds),
        l.cpu_p99,
        rounds(&l.fabric_rounds),
        l.fabric_p99
    ));
    out.extend(named);
    out.push(format!(
        "bench dmaep_4k_latency_us {:.2}",
        median(&l.copy_rounds)
    ));
    out.push(format!("bench dmaep_4k_latency_p99_us {:.2}", l.copy_p99));
    out.push(format!(
        "bench dmaep_4k_cpu_latency_us {:.2}",
        median(&l.cpu_rounds)
    ));
    out.push(format!(
        "bench dmaep_4k_cpu_latency_p99_us {:.2}",
        l.cpu_p99
    ));
    if !l.fabric_rounds.is_empty() {
        out.push(format!(
            "bench dmaep_4k_fabric_latency_us {:.2}",
            median(&l.fabric_rounds)
        ));
        out.push(format!(
            "bench dmaep_4k_fabric_latency_p99_us {:.2}",
            l.fabric_p99
        ));
    }
    // Machine-independent: what each driver asks of the endpoint per MiB.
    out.push(format!(
        "# dmaep entries: the emulator counted {} entries for {} bytes of pcifab's copies \
         (every size, both modes, the latency rounds) and {} entries for {} bytes of \
         dmatest's",
        b.pcifab_entries.entries,
        b.pcifab_entries.bytes,
        b.peer_entries.entries,
        b.peer_entries.bytes
    ));
    out.push(format!(
        "bench dmaep_entries_per_mib_pcifab {:.1}",
        b.pcifab_entries.per_mib()
    ));
    out.push(format!(
        "bench dmaep_entries_per_mib_switchtec_dma {:.1}",
        b.peer_entries.per_mib()
    ));
    if let Some(r) = b
        .rows
        .iter()
        .find(|r| r.bytes == 4096 && !r.peer_iops.is_empty())
    {
        // dmatest reports a rate per run, no single copy's time.
        out.push(format!(
            "bench dmaep_4k_switchtec_dma_mean_us {:.2}",
            1e6 / median(&r.peer_iops)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_copies() {
        assert_eq!(
            SIZES.map(copies_per_run),
            [64, 64, 4, 1, 1],
            "4 MiB a run, at most 64 copies"
        );
        assert_eq!(
            SIZES.map(size_name),
            ["4k", "64k", "1m", "16m", "64m"].map(String::from)
        );
        assert_eq!(size_name(1000), "1000");
    }

    #[test]
    fn dmatest_summary_lines() {
        let log = "[   12.5] dmatest: Added 1 threads using dma0chan0\n\
                   [   12.6] dmatest: Started 1 threads using dma0chan0\n\
                   [   20.1] dmatest: dma0chan0-copy0: summary 64 tests, 0 failures 5120.35 iops 20481 KB/s (0)\n\
                   [   20.2] dmatest: dma0chan1-copy0: summary 3 tests, 1 failures 3.00 iops 3 KB/s (0)\n";
        let r = dmatest_run(log, "dma0chan0").unwrap();
        assert_eq!(
            r,
            DmatestRun {
                tests: 64,
                failures: 0,
                iops: 5120.35,
                kb_s: 20481
            }
        );
        assert!((dmatest_mib_s(&r, 4096) - 5120.35 / 256.0).abs() < 1e-9);
        assert_eq!(dmatest_run(log, "dma0chan1").unwrap().failures, 1);
        // Missing, doubled, or ended by an error: no figure.
        assert!(dmatest_run(log, "dma0chan2").is_err());
        let twice = format!("{log}{log}");
        assert!(dmatest_run(&twice, "dma0chan0")
            .unwrap_err()
            .contains("2 summary"));
        let err = "dmatest: dma0chan0-copy0: summary 0 tests, 0 failures 0.00 iops 0 KB/s (-12)";
        assert!(dmatest_run(err, "dma0chan0").is_err());
        // A channel whose name starts like another's is not taken for it.
        assert!(dmatest_run(log, "dma0chan").is_err());
    }

    #[test]
    fn selftest_output() {
        let out = "\
{\"test\":\"dmaep-bench\",\"mode\":\"basic\",\"bytes\":4096,\"copies\":64,\"runs_mib_s\":[10.5,11,12,9,10],\"cpu_runs_mib_s\":[900,950,1000,980,990]}
some other line
{\"test\":\"dmaep-bench\",\"mode\":\"basic\",\"bytes\":1048576,\"copies\":4,\"runs_mib_s\":[1000,1100,900,950,1050],\"cpu_runs_mib_s\":[2000,2000,2000,2000,2000]}
{\"test\":\"dmaep-bench\",\"mode\":\"fabric\",\"bytes\":4096,\"copies\":64,\"runs_mib_s\":[8,9,10,11,12]}
{\"test\":\"dmaep-latency\",\"bytes\":4096,\"count\":200,\"rounds\":5,\"copy_round_p50_us\":[40,41,42,43,44],\"copy_p99_us\":120.5,\"cpu_round_p50_us\":[1,1,1,1,1],\"cpu_p99_us\":2.25,\"fabric_round_p50_us\":[50,51,52,53,54],\"fabric_p99_us\":200}
";
        let (rows, lat) = parse_selftest(out, 5).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].bytes, rows[0].copies), (4096, 64));
        assert_eq!(rows[0].copy, [10.5, 11.0, 12.0, 9.0, 10.0]);
        assert_eq!(rows[0].fabric, [8.0, 9.0, 10.0, 11.0, 12.0]);
        assert!(rows[1].fabric.is_empty());
        assert_eq!(median(&rows[1].copy), 1000.0);
        let lat = lat.unwrap();
        assert_eq!(
            (lat.count, lat.copy_p99, lat.cpu_p99, lat.fabric_p99),
            (200, 120.5, 2.25, 200.0)
        );
        assert_eq!(median(&lat.fabric_rounds), 52.0);
        // Too few runs, a fabric line without its basic one, nothing at all: errors.
        assert!(parse_selftest(out, 6).unwrap_err().contains("expected 6"));
        let orphan = out.lines().nth(3).unwrap();
        assert!(parse_selftest(orphan, 5)
            .unwrap_err()
            .contains("before its basic line"));
        assert!(parse_selftest("", 5).is_err());
        // A latency line with fewer than five rounds is refused.
        let short = out.replace("[40,41,42,43,44]", "[40,41]");
        assert!(parse_selftest(&short, 5)
            .unwrap_err()
            .contains("copy_round_p50_us"));
    }

    #[test]
    fn report_lines() {
        let row = |bytes: u64, peer: bool| Row {
            bytes,
            copies: copies_per_run(bytes),
            copy: vec![100.0, 110.0, 90.0, 105.0, 95.0],
            cpu: vec![1000.0; 5],
            fabric: vec![80.0; 5],
            peer: if peer { vec![50.0; 5] } else { Vec::new() },
            peer_iops: if peer { vec![10000.0; 5] } else { Vec::new() },
        };
        let b = DmaepBench {
            rows: vec![row(4096, true), row(16 * MIB, false)],
            lat: Latency {
                count: 200,
                copy_rounds: vec![40.0, 41.0, 42.0, 43.0, 44.0],
                copy_p99: 120.0,
                cpu_rounds: vec![1.0; 5],
                cpu_p99: 2.0,
                fabric_rounds: vec![50.0; 5],
                fabric_p99: 200.0,
            },
            host: "h1".into(),
            bdf: "0000:01:00.2".into(),
            lender: "h0".into(),
            chan: "dma0chan0".into(),
            pcifab_entries: Entries {
                entries: 512,
                bytes: 2 * MIB,
            },
            peer_entries: Entries::default(),
        };
        let lines = report(&b);
        let fig = |name: &str| -> Option<f64> {
            lines
                .iter()
                .find_map(|l| l.strip_prefix(&format!("bench {name} ")))
                .and_then(|v| v.parse().ok())
        };
        assert_eq!(fig("dmaep_copy_mib_s_4k"), Some(100.0));
        assert_eq!(fig("dmaep_switchtec_dma_mib_s_4k"), Some(50.0));
        assert_eq!(fig("dmaep_copy_ratio_vs_switchtec_dma_4k"), Some(2.0));
        assert_eq!(fig("dmaep_fabric_mib_s_16m"), Some(80.0));
        assert_eq!(
            fig("dmaep_switchtec_dma_mib_s_16m"),
            None,
            "no peer above 1 MiB"
        );
        assert_eq!(fig("dmaep_4k_latency_us"), Some(42.0));
        assert_eq!(fig("dmaep_4k_switchtec_dma_mean_us"), Some(100.0));
        assert_eq!(fig("dmaep_entries_per_mib_pcifab"), Some(256.0));
        assert!(fig("dmaep_entries_per_mib_switchtec_dma").unwrap().is_nan());
        let lo = fig("dmaep_copy_ratio_vs_switchtec_dma_4k_ci95_low").unwrap();
        let hi = fig("dmaep_copy_ratio_vs_switchtec_dma_4k_ci95_high").unwrap();
        assert!(lo <= 2.0 && 2.0 <= hi, "{lo} {hi}");
        let row16 = lines
            .iter()
            .find(|l| l.starts_with("bench dmaep  16777216"))
            .unwrap();
        assert!(
            row16.contains("100.0 [90.0-110.0]") && row16.ends_with("| -"),
            "{row16}"
        );
        assert!(lines
            .iter()
            .any(|l| l.contains("no switchtec_dma figure above 1 MiB")));
        // The notes are one line each, without the source's line breaks in them.
        assert!(lines
            .iter()
            .filter(|l| l.starts_with("# dmaep") || l.starts_with("# no"))
            .all(|l| !l.contains("   ")));
        let head = &lines[1];
        assert_eq!(head.find('|'), lines[2].find('|'), "{head}\n{}", lines[2]);
    }

    #[test]
    fn entries_are_summed_over_channels() {
        let before = [(10, 10, 4096), (0, 0, 0)];
        let after = [(12, 12, 4096 * 3), (256, 256, MIB)];
        let e = entries_between(&before, &after);
        assert_eq!(
            e,
            Entries {
                entries: 258,
                bytes: MIB + 8192
            }
        );
        assert_eq!(
            Entries {
                entries: 4,
                bytes: 4 * MIB
            }
            .per_mib(),
            1.0
        );
        assert!(Entries::default().per_mib().is_nan());
    }

    #[test]
    fn unpaired_interval_covers_the_ratio() {
        let a = [100.0, 110.0, 90.0, 105.0, 95.0];
        let b = [50.0, 55.0, 45.0, 52.0, 48.0];
        let (lo, hi) = ratio_interval_unpaired(&a, &b);
        let r = median(&a) / median(&b);
        assert!(lo <= r && r <= hi, "{lo} {r} {hi}");
        assert!(lo >= 90.0 / 55.0 && hi <= 110.0 / 45.0, "{lo} {hi}");
        assert!(ratio_interval_unpaired(&[], &b).0.is_nan());
    }
}
