// SPDX-License-Identifier: GPL-2.0-only
//! pcifab binds the switch's DMA endpoint (`src/dmaep.rs`): in every guest the module's
//! second PCI driver, `pcifab_dmaep`, holds the emulated endpoint, brings up every channel and
//! copies through each (basic mode, polled completions) at bind; the copies must go through
//! the emulator (its per-channel counters move by exactly the self-test's copies and bytes),
//! and the driver reports each channel's result in sysfs. With the emulator's completions
//! lying (bad status, a short byte count, a phase never written) each channel must fail
//! cleanly: the error in sysfs, the driver still bound, no splat, and a rebind with honest
//! completions passes again.

use serde_json::Value;

use std::time::Duration;

use crate::checks::{begin, dmesg_clean, driver_of, selftest_json, wait_or_dmesg, Checks};
use crate::fabric::{EmuControl, Fabric, Host};

const DRIVER: &str = "pcifab_dmaep";
/// `SELFTEST_COPIES` and `SELFTEST_LEN` of `src/dmaep.rs`.
const COPIES: u64 = 20;
const LEN: u64 = 4096;

/// BDF of the DMA endpoint: vendor 0x11f8, class 0x088000.
fn find_dmaep(h: &mut Host) -> Result<String, String> {
    let out = h.run_ok(
        r#"for d in /sys/bus/pci/devices/*; do
  read -r v <$d/vendor && read -r c <$d/class || continue
  if [ "$v" = 0x11f8 ] && [ "$c" = 0x088000 ]; then echo "${d##*/}"; fi
done"#,
    )?;
    let found: Vec<&str> = out.split_whitespace().collect();
    match found.as_slice() {
        [bdf] => Ok(bdf.to_string()),
        _ => Err(format!(
            "{}: expected one PCI device with vendor 0x11f8 and class 0x088000 (the emulated \
             DMA endpoint), found [{}]; does the emulator config set dma_endpoint_channels?",
            h.name,
            found.join(" ")
        )),
    }
}

/// Per channel (fetched, completions, bytes) as the emulator counts them.
fn emu_counts(emu: &EmuControl, host: &str) -> Result<Vec<(u64, u64, u64)>, String> {
    let v = emu.request(&format!("dmaep {host} stats"))?;
    let chans = v
        .get("channels")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("emulator `dmaep {host} stats`: no channels in {v}"))?;
    Ok(chans
        .iter()
        .map(|c| {
            let n = |k: &str| c.get(k).and_then(Value::as_u64).unwrap_or(u64::MAX);
            (n("fetched"), n("completions"), n("bytes"))
        })
        .collect())
}

/// Unbinds and binds the endpoint again (which runs the self-test) and returns the lines of
/// its `selftest` file.
fn rebind(h: &mut Host, bdf: &str) -> Result<Vec<String>, String> {
    h.run_ok(&format!(
        "echo {bdf} > /sys/bus/pci/drivers/{DRIVER}/unbind && \
         echo {bdf} > /sys/bus/pci/drivers/{DRIVER}/bind"
    ))?;
    wait_or_dmesg(
        h,
        &format!("[ -e /sys/bus/pci/devices/{bdf}/pcifab/selftest ]"),
        20,
        &format!("{bdf}: {DRIVER} did not bind again"),
    )?;
    let out = h.run_ok(&format!("cat /sys/bus/pci/devices/{bdf}/pcifab/selftest"))?;
    Ok(out.lines().map(str::to_string).collect())
}

/// The endpoint of `h`, checked to be bound to pcifab with `configured` channels.
fn bound_endpoint(h: &mut Host, configured: usize) -> Result<String, String> {
    let bdf = find_dmaep(h)?;
    let mut c = Checks::new(&format!("{}: pcifab on the DMA endpoint {bdf}", h.name));
    c.eq("driver", Some(DRIVER.to_string()), driver_of(h, &bdf)?);
    c.finish()?;
    let chans = h.run_ok(&format!("cat /sys/bus/pci/devices/{bdf}/pcifab/channels"))?;
    let mut c = Checks::new(&format!("{}: {bdf}/pcifab/channels", h.name));
    c.eq("channels", configured.to_string(), chans.trim().to_string());
    c.finish()?;
    Ok(bdf)
}

fn copies_host(h: &mut Host, emu: &EmuControl, configured: usize) -> Result<(), String> {
    begin(h)?;
    let bdf = bound_endpoint(h, configured)?;
    let before = emu_counts(emu, &h.name)?;
    let lines = rebind(h, &bdf)?;
    let after = emu_counts(emu, &h.name)?;
    let mut c = Checks::new(&format!("{}: self-test copies through {bdf}", h.name));
    let want: Vec<String> = (0..configured)
        .map(|i| format!("{i} ok {}", COPIES * LEN))
        .collect();
    c.eq("selftest lines", want, lines);
    c.eq("channels the emulator serves", configured, after.len());
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        c.eq(
            &format!("channel {i}: entries fetched"),
            COPIES,
            a.0.wrapping_sub(b.0),
        );
        c.eq(
            &format!("channel {i}: completions written"),
            COPIES,
            a.1.wrapping_sub(b.1),
        );
        c.eq(
            &format!("channel {i}: bytes copied"),
            COPIES * LEN,
            a.2.wrapping_sub(b.2),
        );
    }
    c.finish()?;
    h.log_note(&format!(
        "{DRIVER}: {configured} channels x {COPIES} copies of {LEN} bytes through the emulated \
         DMA endpoint"
    ));
    dmesg_clean(h)
}

pub fn pcifab_copies_through_every_channel(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    f.each_host(|h, _| copies_host(h, &emu, configured))
}

/// One lying completion mode: the `dmaep` fault, and what each channel's line must say.
const LIES: [(&str, &str); 3] = [
    // Every completion carries status 0x100 (READ_FAILED): the first copy fails.
    ("bad-status 0x100", "EIO 0x100"),
    // Half the bytes done, and the completion says so.
    ("short", "EIO 0x0"),
    // Completions written with the previous pass's phase: never seen, the wait ends.
    ("wrong-phase", "ETIMEDOUT 0x0"),
];

fn lies_host(h: &mut Host, emu: &EmuControl, configured: usize) -> Result<(), String> {
    begin(h)?;
    let bdf = bound_endpoint(h, configured)?;
    for (fault, want) in LIES {
        emu.request(&format!("dmaep {} {fault}", h.name))?;
        let lines = rebind(h, &bdf);
        emu.request(&format!("dmaep {} clear", h.name))?;
        let lines = lines?;
        let mut c = Checks::new(&format!(
            "{}: {bdf} with completions lying ({fault})",
            h.name
        ));
        let want: Vec<String> = (0..configured).map(|i| format!("{i} {want}")).collect();
        c.eq("selftest lines", want, lines);
        c.eq("driver", Some(DRIVER.to_string()), driver_of(h, &bdf)?);
        c.finish()?;
        dmesg_clean(h)?;
    }
    // Honest completions again: every channel passes after a rebind.
    let lines = rebind(h, &bdf)?;
    let mut c = Checks::new(&format!("{}: {bdf} after the faults", h.name));
    let want: Vec<String> = (0..configured)
        .map(|i| format!("{i} ok {}", COPIES * LEN))
        .collect();
    c.eq("selftest lines", want, lines);
    c.finish()?;
    dmesg_clean(h)
}

pub fn pcifab_fails_cleanly_on_lying_completions(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    let r = f.each_host(|h, _| lies_host(h, &emu, configured));
    if r.is_err() {
        let _ = emu.request("dmaep all clear");
    }
    r
}

/// The user copies of `user_copies_host`: (length, shift into the allocation).
const USER_COPIES: [(u64, u64); 3] = [(1, 0), (8191, 4095), (3 << 20, 13)];

fn user_copies_host(h: &mut Host, emu: &EmuControl, configured: usize) -> Result<(), String> {
    begin(h)?;
    bound_endpoint(h, configured)?;
    for (len, shift) in USER_COPIES {
        let before = emu_counts(emu, &h.name)?;
        let v = selftest_json(
            h,
            &format!("p2p-local --len {len:#x} --seed 0x77 --shift {shift}"),
            Duration::from_secs(120),
        )?;
        let after = emu_counts(emu, &h.name)?;
        let moved: u64 = before
            .iter()
            .zip(&after)
            .map(|(b, a)| a.2.wrapping_sub(b.2))
            .sum();
        let mut c = Checks::new(&format!(
            "{}: user copy of {len} bytes through the endpoint",
            h.name
        ));
        c.eq("bytes the emulated endpoint copied", len, moved);
        c.finish()?;
        h.log_note(&format!("p2p-local {len} bytes: {v}"));
    }
    dmesg_clean(h)
}

pub fn pcifab_copies_user_buffers(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    f.each_host(|h, _| user_copies_host(h, &emu, configured))
}

fn configured(f: &Fabric) -> Result<usize, String> {
    match f.expected.dma_endpoint_channels as usize {
        0 => Err(
            "the emulator's configuration sets no dma_endpoint_channels: the switch shows no \
             DMA endpoint (tools/pcifab-harness/fabric.toml sets 4)"
                .into(),
        ),
        n => Ok(n),
    }
}
