// SPDX-License-Identifier: GPL-2.0-only
//! The switch's DMA endpoint, accepted by a third party: Linux's own
//! `drivers/dma/switchtec_dma.c` binds the emulated endpoint in every guest and the kernel's
//! own dmaengine test (`dmatest`) runs memcpy on every channel, copies of random length up
//! to 1 MiB; every copy must go through the emulator (its per-channel counters move by
//! exactly the number of tests) and the kernel log must show no failure and no splat.

use std::time::Duration;

use serde_json::Value;

use crate::checks::{dmesg_clean, driver_of, wait_or_dmesg, Checks};
use crate::fabric::{EmuControl, Fabric, Host};

pub(crate) const SWITCHTEC_DMA_KO: &str = "/lib/modules/switchtec_dma.ko";
pub(crate) const DMATEST_KO: &str = "/lib/modules/dmatest.ko";

/// The dmatest runs: (test_buf_size, iterations per channel). dmatest picks each copy's
/// length (1 byte up to the buffer) and source/destination offsets at random inside the
/// buffer (aligned to the driver's 8-byte copy_align); 1 MiB is the largest descriptor
/// switchtec_dma.c takes. One run: each run adds every channel again, and switchtec_dma
/// allocates 32768 descriptors per channel each time (15-100 s on the sanitizer kernel).
const RUNS: [(u32, u32); 1] = [(1 << 20, 24)];

/// BDF of the DMA endpoint: vendor 0x11f8, class 0x088000, function 2 behind the switch.
pub(crate) fn find_dmaep(h: &mut Host) -> Result<String, String> {
    let out = h.run_ok(
        r#"for d in /sys/bus/pci/devices/*; do
  read -r v <$d/vendor && read -r c <$d/class || continue
  if [ "$v" = 0x11f8 ] && [ "$c" = 0x088000 ]; then echo "${d##*/}"; fi
done"#,
    )?;
    let found: Vec<&str> = out.split_whitespace().collect();
    match found.as_slice() {
        [bdf] if bdf.ends_with(".2") => Ok(bdf.to_string()),
        [bdf] => Err(format!(
            "{}: DMA endpoint {bdf}: expected function 2 of the switch's upstream slot",
            h.name
        )),
        [] => Err(format!(
            "{}: no PCI device with vendor 0x11f8 and class 0x088000 (the emulated DMA \
             endpoint at rp0 00.2); does the emulator config set dma_endpoint_channels?",
            h.name
        )),
        many => Err(format!(
            "{}: expected one DMA endpoint, found {}",
            h.name,
            many.join(" ")
        )),
    }
}

/// Per channel (completions, irqs, bytes) as the emulator counts them.
pub(crate) fn emu_counts(emu: &EmuControl, host: &str) -> Result<Vec<(u64, u64, u64)>, String> {
    let v = emu.request(&format!("dmaep {host} stats"))?;
    let chans = v
        .get("channels")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("emulator `dmaep {host} stats`: no channels in {v}"))?;
    Ok(chans
        .iter()
        .map(|c| {
            let n = |k: &str| c.get(k).and_then(Value::as_u64).unwrap_or(u64::MAX);
            (n("completions"), n("irqs"), n("bytes"))
        })
        .collect())
}

/// The `dmatest: CHAN-copy0: summary N tests, K failures` lines as (chan, N, K).
fn summaries(log: &str) -> Vec<(String, u64, u64)> {
    log.lines()
        .filter_map(|l| {
            let rest = &l[l.find("dmatest: ")? + 9..];
            let (thread, rest) = rest.split_once(": summary ")?;
            let chan = thread.strip_suffix("-copy0")?;
            let mut w = rest.split_whitespace();
            let tests = w.next()?.parse().ok()?;
            let _ = w.next()?; // "tests,"
            let failures = w.next()?.parse().ok()?;
            Some((chan.to_string(), tests, failures))
        })
        .collect()
}

/// Unloads dmatest, never switchtec_dma: Linux 7.3's `switchtec_dma_remove()` calls
/// `iounmap(swdma_dev->bar)` after `dma_async_device_unregister()` dropped the last
/// reference and its release callback freed `swdma_dev` (KASAN: slab-use-after-free in
/// switchtec_dma_remove, seen here on every rmmod and unbind). So the driver stays bound
/// once it bound; a second run in the same boot finds it so.
pub(crate) fn unload_dmatest(h: &mut Host) -> Result<(), String> {
    h.run_ok("if [ -d /sys/module/dmatest ]; then rmmod dmatest; fi")
        .map(|_| ())
}

/// One dmatest memcpy run on `chan` alone: the channel is added, started at once and
/// polled until its thread is done. One channel at a time, because dmatest creates a
/// channel's thread when the channel is added and leaves it in D state until `run`:
/// adding the next channel (switchtec_dma allocates 32768 descriptors, 15-20 s under the
/// sanitizer kernel) kept the first thread waiting past the guest's 20 s hung-task limit.
pub(crate) fn dmatest_one(h: &mut Host, chan: &str, secs: u32) -> Result<(), String> {
    const P: &str = "/sys/module/dmatest/parameters";
    let polls = secs.saturating_mul(10);
    let out = h.run_timeout(
        &format!(
            "echo {chan} > {P}/channel || exit 2; echo 1 > {P}/run || exit 3; i=0; \
             while [ \"$(cat {P}/run)\" = Y ]; do \
               [ $i -lt {polls} ] || exit 4; sleep 0.1; i=$((i+1)); done"
        ),
        Duration::from_secs(u64::from(secs) + 120),
    )?;
    match out.code {
        0 => Ok(()),
        2 => Err(format!(
            "{}: dmatest did not take channel {chan}: {}",
            h.name,
            out.out.trim()
        )),
        3 => Err(format!(
            "{}: dmatest did not start on {chan}: {}",
            h.name,
            out.out.trim()
        )),
        4 => Err(format!(
            "{}: dmatest on {chan} still running after {secs} s",
            h.name
        )),
        c => Err(format!(
            "{}: dmatest on {chan}: exit {c}: {}",
            h.name,
            out.out.trim()
        )),
    }
}

/// `configured`: the channels fabric.toml gives each DMA endpoint, read by the harness
/// itself (not the emulator's answer, which is under test).
fn run_host(h: &mut Host, emu: &EmuControl, configured: usize) -> Result<(), String> {
    for ko in [SWITCHTEC_DMA_KO, DMATEST_KO] {
        if h.run(&format!("[ -f {ko} ]"))?.code != 0 {
            return Err(format!(
                "{}: {ko} is not in the guest: the harness takes it from drivers/dma/ of the \
                 kernel build --switchtec names (CONFIG_SWITCHTEC_DMA=m, CONFIG_DMATEST=m)",
                h.name
            ));
        }
    }
    let served = emu_counts(emu, &h.name)?.len();
    if served != configured {
        return Err(format!(
            "{}: the emulator's DMA endpoint has {served} channels, fabric.toml gives it \
             {configured}",
            h.name
        ));
    }
    let bdf = find_dmaep(h)?;
    let did = h.run_ok(&format!("cat /sys/bus/pci/devices/{bdf}/device"))?;
    let did = did.trim().trim_start_matches("0x").to_string();
    unload_dmatest(h)?;
    h.run_ok("dmesg -c >/dev/null")?;
    h.run_ok(&format!(
        "[ -d /sys/module/switchtec_dma ] || insmod {SWITCHTEC_DMA_KO}"
    ))?;
    // pcifab's own driver of the endpoint (src/dmaep.rs) holds it while pcifab is loaded.
    if driver_of(h, &bdf)?.as_deref() == Some("pcifab_dmaep") {
        h.run_ok(&format!(
            "echo {bdf} > /sys/bus/pci/drivers/pcifab_dmaep/unbind"
        ))?;
    }
    // Linux's table lists the PFX/PSX/PFXA/PSXA parts by device id and class; a PAX part's
    // DMA endpoint has the PAX id (Microchip's own driver lists it), so the driver is told
    // the id, with the same exact-class match its table uses.
    if driver_of(h, &bdf)?.is_none() {
        h.run_ok(&format!(
            "echo '11f8 {did} ffffffff ffffffff 088000 ffffff' > \
             /sys/bus/pci/drivers/switchtec_dma/new_id"
        ))?;
    }
    wait_or_dmesg(
        h,
        &format!("[ -e /sys/bus/pci/devices/{bdf}/driver ]"),
        20,
        &format!("{bdf}: switchtec_dma did not bind the DMA endpoint"),
    )?;
    let mut c = Checks::new(&format!("{}: Linux's switchtec_dma on {bdf}", h.name));
    c.eq(
        "driver of the DMA endpoint",
        Some("switchtec_dma".to_string()),
        driver_of(h, &bdf)?,
    );
    let listed = h.run_ok(&format!("ls /sys/bus/pci/devices/{bdf}/dma/"))?;
    let chans: Vec<String> = listed.split_whitespace().map(str::to_string).collect();
    c.eq("dmaengine channels", configured, chans.len());
    c.finish()?;

    for (buf, iterations) in RUNS {
        let before = emu_counts(emu, &h.name)?;
        // The log so far (the probe, the run before) must be clean before it is cleared.
        dmesg_clean(h)?;
        h.run_ok("dmesg -c >/dev/null")?;
        h.run_ok(&format!(
            "insmod {DMATEST_KO} test_buf_size={buf} iterations={iterations} timeout=60000"
        ))?;
        let mut log = String::new();
        for ch in &chans {
            dmatest_one(h, ch, 300)?;
            // Read after each channel: a failing copy logs dozens of lines, so a run with
            // failures on every channel pushed the first channels' summaries out of the
            // kernel's log buffer before the end of the run.
            dmesg_clean(h)?;
            log.push_str(&h.run_ok("dmesg -c")?);
        }
        h.run_ok("rmmod dmatest")?;
        let after = emu_counts(emu, &h.name)?;
        let mut c = Checks::new(&format!(
            "{}: dmatest memcpy, {buf}-byte buffers, {iterations} per channel",
            h.name
        ));
        let mut got = summaries(&log);
        got.sort();
        let mut want: Vec<(String, u64, u64)> = chans
            .iter()
            .map(|ch| (ch.clone(), u64::from(iterations), 0))
            .collect();
        want.sort();
        c.eq("summary lines (channel, tests, failures)", want, got);
        c.eq(
            "dmatest result lines (a failed copy)",
            Vec::<&str>::new(),
            log.lines().filter(|l| l.contains(": result #")).collect(),
        );
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            c.eq(
                &format!("channel {i}: completions the emulator wrote"),
                u64::from(iterations),
                a.0.wrapping_sub(b.0),
            );
            c.eq(
                &format!("channel {i}: interrupts the emulator raised"),
                u64::from(iterations),
                a.1.wrapping_sub(b.1),
            );
        }
        let bytes: u64 = before
            .iter()
            .zip(&after)
            .map(|(b, a)| a.2.wrapping_sub(b.2))
            .sum();
        h.log_note(&format!(
            "dmatest: {} channels x {iterations} memcpy of up to {buf} bytes, {bytes} bytes \
             copied by the emulated DMA endpoint",
            chans.len()
        ));
        c.finish()?;
    }
    let mut c = Checks::new(&format!("{}: after the runs", h.name));
    c.eq(
        "driver of the DMA endpoint",
        Some("switchtec_dma".to_string()),
        driver_of(h, &bdf)?,
    );
    c.finish()?;
    dmesg_clean(h)
}

pub fn linux_driver_passes_dmatest(f: &mut Fabric) -> Result<(), String> {
    let configured = f.expected.dma_endpoint_channels as usize;
    if configured == 0 {
        return Err(
            "the emulator's configuration sets no dma_endpoint_channels: the switch shows no \
             DMA endpoint to test (tools/pcifab-harness/fabric.toml sets 4)"
                .into(),
        );
    }
    let emu = f.emu();
    f.each_host(|h, _| {
        let r = run_host(h, &emu, configured);
        if r.is_err() {
            let _ = unload_dmatest(h);
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lines_are_parsed() {
        let log = "[   12.5] dmatest: Added 1 threads using dma0chan0\n\
                   [   20.1] dmatest: dma0chan0-copy0: summary 100 tests, 0 failures 41.20 iops 331 KB/s (0)\n\
                   [   20.2] dmatest: dma0chan1-copy0: summary 99 tests, 1 failures 3.00 iops 3 KB/s (0)\n\
                   [   20.3] dmatest: dma0chan1-copy0: result #7: 'test timed out' with src_off=0x0\n";
        assert_eq!(
            summaries(log),
            [
                ("dma0chan0".to_string(), 100, 0),
                ("dma0chan1".to_string(), 99, 1)
            ]
        );
    }
}
