// SPDX-License-Identifier: GPL-2.0-only
//! P2P scenarios: routes, the MEP's DMA engine, IOMMU isolation, races; and the P2P
//! benchmark. Host h0 boots with a virtual IOMMU, h1 without (`fabric::iommu_host`).
//!
//! Function memory is checked byte for byte: through the functions' BARs in the guest that
//! holds them (`pcifab-selftest bar-range`), through a user-buffer round trip
//! (`pcifab-selftest p2p-user`), and for ranges beyond the 2 MiB BAR apertures by the
//! emulator's FNV-1a hash of device memory (`mem-hash`).

use std::time::Duration;

use serde_json::Value;

use crate::bench::P2pRow;
use crate::checks::{
    bind_here, check_invariants, compose_begin, dmesg_clean, expect_eq, find_mep, json_line,
    pcifab_cmd, pcifab_ok, refused_without_extensions, selftest_json, two_hosts, Checks, GPU0, MIB,
};
use crate::fabric::{EmuControl, Fabric, Host};

const GPU1: u16 = 0x0400;
const GPU1_VF1: u16 = 0x0401;
const GPU1_VF2: u16 = 0x0402;
const SEED_A: u64 = 0x005e_ed0a;
const SEED_B: u64 = 0x005e_ed0b;
const LONG: Duration = Duration::from_secs(240);
/// Source pattern of the race scenario.
const RACE_SEED: u64 = 0x005e_ed0c;

/// Adds a route to `pdfid` at `window_off` in `h`'s window; returns its window offset.
fn route(
    h: &mut Host,
    pdfid: u16,
    size: u64,
    target_off: u64,
    window_off: u64,
) -> Result<u64, String> {
    let v = pcifab_ok(
        h,
        &format!(
            "p2p route add {pdfid:#06x} --size {size:#x} --target-off {target_off:#x} \
             --window-off {window_off:#x}"
        ),
    )?;
    expect_eq(
        &format!("{}: window offset of the route to {pdfid:#06x}", h.name),
        Some(window_off),
        v["window_off"].as_u64(),
    )?;
    Ok(window_off)
}

/// Runs `pcifab p2p copy` and requires it to copy all `len` bytes.
fn copy_ok(h: &mut Host, from: &str, to: &str, len: u64) -> Result<Value, String> {
    let v = pcifab_ok(
        h,
        &format!("p2p copy --from {from} --to {to} --len {len:#x}"),
    )?;
    expect_eq(
        &format!("{}: bytes copied {from} -> {to}", h.name),
        Some(len),
        v["bytes"].as_u64(),
    )?;
    Ok(v)
}

/// Runs `pcifab p2p copy` that must fail; returns (exit code, JSON).
fn copy_fails(h: &mut Host, from: &str, to: &str, len: u64) -> Result<(i64, Value), String> {
    let (code, v, out) = pcifab_cmd(
        h,
        &format!("p2p copy --from {from} --to {to} --len {len:#x}"),
    )?;
    if code == 0 {
        return Err(format!(
            "{}: `pcifab p2p copy --from {from} --to {to}`: expected a failure, got exit 0: {}",
            h.name,
            out.trim()
        ));
    }
    Ok((code, v))
}

fn mem_hash(emu: &EmuControl, pdfid: u16, off: u64, len: u64) -> Result<String, String> {
    let v = emu.request(&format!("mem-hash {pdfid:#06x} {off:#x} {len:#x}"))?;
    v.get("fnv1a64")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("emulator mem-hash {pdfid:#06x}: no hash in {v}"))
}

fn sysfs_num(h: &mut Host, name: &str) -> Result<u64, String> {
    let t = h.run_ok(&format!("cat /sys/class/misc/pcifab0/{name}"))?;
    t.trim()
        .parse()
        .map_err(|_| format!("{}: sysfs {name}: expected a number, got {t:?}", h.name))
}

/// The BDF of the MEP in `h`.
fn mep_bdf(h: &mut Host) -> Result<String, String> {
    find_mep(h)
}

/// Waits (at most 20 s) until `host`'s MEP has a DMA descriptor in flight.
fn wait_dma_in_flight(emu: &EmuControl, host: &str, what: &str) -> Result<(), String> {
    let t = std::time::Instant::now();
    loop {
        let v = emu.request(&format!("p2p {host}"))?;
        if v["head"].as_u64() != v["tail"].as_u64() {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "{host}: {what}: the copy never reached the DMA engine within 20 s \
                 (emulator p2p state: {v})"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The emulator's DMA table for `host`'s MEP must be `baseline` again after `step`: nothing
/// a copy mapped (its user buffer above all) may stay reachable by the device.
fn dma_table_is(emu: &EmuControl, host: &str, baseline: &Value, step: &str) -> Result<(), String> {
    let now = emu.request(&format!("dma-maps {host}"))?;
    if now["maps"] == baseline["maps"] {
        Ok(())
    } else {
        Err(format!(
            "{host}: after {step}: the emulator's DMA table: expected only what was mapped \
             before (the descriptor ring) {}, got {}",
            baseline["maps"], now["maps"]
        ))
    }
}

/// The failed copy's JSON `v` says the DMA engine met a host fault before it moved a byte.
fn host_fault_nothing_done(what: &str, v: &Value) -> Result<(), String> {
    let mut c = Checks::new(what);
    c.eq_json(
        "dma_status",
        Value::from("HOST_FAULT"),
        v["error"]["dma_status"].clone(),
    );
    c.eq_json("done", Value::from(0), v["error"]["done"].clone());
    c.finish()
}

/// Same-host and cross-host function-to-function copies, checked through the BARs of the
/// guests that hold the functions; the CPU reaching a function through the window.
pub fn p2p_copies(f: &mut Fabric) -> Result<(), String> {
    if refused_without_extensions(
        f,
        &[
            "p2p route add 0x0300 --size 0x100000 --window-off 0",
            "p2p copy --from 0x0300:0 --to 0x0401:0 --len 0x1000",
        ],
    )? {
        return Ok(());
    }
    compose_begin(f)?;
    let e = f.expected.clone();
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "the P2P scenarios need two hosts")?;
    let bdf_src = bind_here(h0, &e, GPU0)?;
    let bdf_same = bind_here(h0, &e, GPU1_VF1)?;
    let bdf_cross = bind_here(h1, &e, GPU1_VF2)?;
    selftest_json(
        h0,
        &format!("bar --device {bdf_src} --write {SEED_A:#x}"),
        LONG,
    )?;

    route(h0, GPU0, 160 * MIB, 0, 0)?;
    route(h0, GPU1_VF1, MIB, 0, 160 * MIB)?;
    // 0x0402 is h1's: h0 may route to it once granted (h0, the fabric-manager host, may
    // grant any bound function; `driver_trust::p2p_grants` tests the rule itself).
    pcifab_ok(h0, &format!("p2p grant {GPU1_VF2:#06x} --host 0"))?;
    route(h0, GPU1_VF2, MIB, 0, 161 * MIB)?;
    expect_eq("h0: sysfs p2p_routes", 3, sysfs_num(h0, "p2p_routes")?)?;

    // Same host, unaligned at both ends: through the switch, checked in h0's BAR.
    copy_ok(h0, "0x0300:0x1001", "0x0401:0x3", 0x7ffd)?;
    selftest_json(
        h0,
        &format!("bar-range --device {bdf_same} --seed {SEED_A:#x} --src-off 0x1001 --off 0x3 --len 0x7ffd"),
        LONG,
    )?;
    // Across hosts: data h0 wrote lands in the function h1 holds, checked in h1's BAR.
    copy_ok(h0, "0x0300:0x10", "0x0402:0", MIB)?;
    selftest_json(
        h1,
        &format!("bar-range --device {bdf_cross} --seed {SEED_A:#x} --src-off 0x10 --off 0 --len {MIB:#x}"),
        LONG,
    )?;
    // One byte, at the last byte of the target.
    copy_ok(h0, "0x0300:0x7", "0x0402:0xfffff", 1)?;
    selftest_json(
        h1,
        &format!(
            "bar-range --device {bdf_cross} --seed {SEED_A:#x} --src-off 0x7 --off 0xfffff --len 1"
        ),
        LONG,
    )?;

    // samples/p2p.c reads the cross-host function back into host memory: its hash must be
    // the emulator's hash of that device memory.
    let out = h0.run_ok("pcifab-p2p 0x0402 0 0x100000")?;
    let hash = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("fnv1a64="))
        .unwrap_or("")
        .to_string();
    expect_eq(
        "h0: samples/p2p.c hash of 0x0402 [0, 1 MiB) vs the emulator's",
        mem_hash(&emu, GPU1_VF2, 0, MIB)?,
        hash,
    )?;
    if !out.contains("routes=3 ") {
        return Err(format!(
            "h0: samples/p2p.c: expected routes=3, got: {}",
            out.trim()
        ));
    }

    // The CPU through the window: h0 reads h1's function at window 161 MiB.
    let mep = mep_bdf(h0)?;
    selftest_json(
        h0,
        &format!(
            "bar-range --device {mep} --seed {SEED_A:#x} --src-off 0x10 --off {:#x} --len 0x1000",
            161 * MIB
        ),
        LONG,
    )?;
    // Outside every route: all ones and a fault.
    let faults = sysfs_num(h0, "p2p_faults")?;
    let o = h0.run(&format!(
        "pcifab-selftest bar-range --device {mep} --seed 0 --src-off 0 --off {:#x} --len 8",
        200 * MIB
    ))?;
    if o.code == 0 || !o.out.contains("got 0xff") {
        return Err(format!(
            "h0: a window read outside every route: expected all ones, got exit {}: {}",
            o.code,
            o.out.trim()
        ));
    }
    let after = sysfs_num(h0, "p2p_faults")?;
    if after <= faults {
        return Err(format!(
            "h0: sysfs p2p_faults: expected more than {faults} after a window read outside \
             every route, got {after}"
        ));
    }

    // Distances.
    let mut c = Checks::new("h0: p2p distance");
    let (_, d, _) = pcifab_cmd(h0, &format!("p2p distance {GPU0:#06x} {GPU1_VF1:#06x}"))?;
    c.eq_json(
        "path 0x0300-0x0401",
        Value::from("switch"),
        d["path"].clone(),
    );
    c.eq_json("hops 0x0300-0x0401", Value::from(2), d["hops"].clone());
    let (_, d, _) = pcifab_cmd(h0, &format!("p2p distance {GPU0:#06x} {GPU1_VF2:#06x}"))?;
    c.eq_json(
        "path 0x0300-0x0402",
        Value::from("fabric"),
        d["path"].clone(),
    );
    let (_, d, _) = pcifab_cmd(h0, &format!("p2p distance {GPU0:#06x} {GPU0:#06x}"))?;
    c.eq_json("path 0x0300-0x0300", Value::from("same"), d["path"].clone());
    c.eq_json("hops 0x0300-0x0300", Value::from(0), d["hops"].clone());
    c.finish()?;
    check_invariants(&emu, "P2P copies")?;
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

/// Host<->function copies from user buffers, 1 byte to 64 MiB with unaligned edges, in the
/// host with the IOMMU and in the one without; a 64 MiB function-to-function copy.
pub fn p2p_user_buffers(f: &mut Fabric) -> Result<(), String> {
    if refused_without_extensions(f, &["p2p copy --from 0x0300:0 --to 0x0401:0 --len 0x1000"])? {
        return Ok(());
    }
    compose_begin(f)?;
    let e = f.expected.clone();
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "the P2P scenarios need two hosts")?;
    let bdf = bind_here(h0, &e, GPU0)?;
    route(h0, GPU0, 160 * MIB, 0, 0)?;
    for (off, len, shift) in [
        (0u64, 1u64, 0u64),
        (4095, 2, 1),
        (4097, 8191, 4095),
        (MIB - 3, MIB + 7, 13),
        (0, 64 * MIB, 0),
    ] {
        let v = selftest_json(
            h0,
            &format!("p2p-user --fn {GPU0:#06x} --off {off:#x} --len {len:#x} --seed {SEED_B:#x} --shift {shift}"),
            LONG,
        )?;
        h0.log_note(&format!("p2p-user {len} bytes: {v}"));
    }
    // The 64 MiB case, last, left the pattern from byte 0 at offset 0: the BAR shows it.
    selftest_json(
        h0,
        &format!(
            "bar-range --device {bdf} --seed {SEED_B:#x} --src-off 0 --off 0 --len {:#x}",
            2 * MIB
        ),
        LONG,
    )?;
    // 64 MiB inside the fabric: function memory [0, 64M) -> [64M, 128M), hashed by the
    // emulator.
    copy_ok(h0, "0x0300:0", "0x0300:0x4000000", 64 * MIB)?;
    expect_eq(
        "emulator hash of 0x0300 [64M, 128M) after the copy from [0, 64M)",
        mem_hash(&emu, GPU0, 0, 64 * MIB)?,
        mem_hash(&emu, GPU0, 64 * MIB, 64 * MIB)?,
    )?;
    // The host without an IOMMU.
    let _ = bind_here(h1, &e, GPU1)?;
    route(h1, GPU1, 16 * MIB, 0, 0)?;
    selftest_json(
        h1,
        &format!(
            "p2p-user --fn {GPU1:#06x} --off 0x5 --len {:#x} --seed 3 --shift 7",
            3 * MIB + 1
        ),
        LONG,
    )?;
    expect_eq("h0: sysfs p2p_routes", 1, sysfs_num(h0, "p2p_routes")?)?;
    check_invariants(&emu, "P2P user buffers")?;
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

/// No device reaches memory it was not given: an IOVA the IOMMU never mapped, an address
/// outside RAM, a function without a route.
pub fn p2p_isolation(f: &mut Fabric) -> Result<(), String> {
    if refused_without_extensions(
        f,
        &[
            "p2p route list",
            "p2p route add 0x0300 --size 0x1000 --window-off 0",
        ],
    )? {
        return Ok(());
    }
    compose_begin(f)?;
    let e = f.expected.clone();
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "the P2P scenarios need two hosts")?;
    let bdf = bind_here(h0, &e, GPU0)?;
    route(h0, GPU0, 2 * MIB, 0, 0)?;
    selftest_json(h0, &format!("bar --device {bdf} --write {SEED_A:#x}"), LONG)?;

    // What the MEP may reach in h0: only what h0's IOMMU mapped for it.
    let maps = emu.request("dma-maps h0")?;
    h0.log_note(&format!(
        "emulator DMA mappings of h0's MEP (IOMMU on): {maps}"
    ));
    let covers = |v: &Value, iova: u64| {
        v.get("maps").and_then(Value::as_array).is_some_and(|a| {
            a.iter().any(|m| {
                let (s, n) = (
                    m["iova"].as_u64().unwrap_or(0),
                    m["size"].as_u64().unwrap_or(0),
                );
                s <= iova && iova < s + n
            })
        })
    };
    if covers(&maps, 0x1000) {
        return Err(format!(
            "h0 boots with an IOMMU, yet the emulator can reach IOVA 0x1000: {maps}"
        ));
    }
    // From an IOVA never mapped into the function: refused, nothing written.
    let (_, v) = copy_fails(h0, "iova:0x1000", "0x0300:0", 4096)?;
    dma_table_is(&emu, "h0", &maps, "the copy from iova:0x1000")?;
    host_fault_nothing_done("h0: copy from unmapped IOVA 0x1000", &v)?;
    // From the function to that IOVA: refused too.
    let (_, v) = copy_fails(h0, "0x0300:0", "iova:0x1000", 4096)?;
    dma_table_is(&emu, "h0", &maps, "the copy to iova:0x1000")?;
    host_fault_nothing_done("h0: copy to unmapped IOVA 0x1000", &v)?;
    selftest_json(h0, &format!("bar --device {bdf} --check {SEED_A:#x}"), LONG)?;

    // User buffers (the CLI's file: ends) are mapped for one copy only: after each copy in
    // either direction, none of the buffer is left in the device's reach.
    for (off, len) in [(0u64, 4096u64), (0x1003, MIB + 5)] {
        h0.run_ok(&format!(
            "head -c {len} /dev/urandom > /tmp/iso.in && rm -f /tmp/iso.out"
        ))?;
        copy_ok(h0, "file:/tmp/iso.in", &format!("0x0300:{off:#x}"), len)?;
        dma_table_is(
            &emu,
            "h0",
            &maps,
            &format!("the copy of a {len}-byte user buffer to 0x0300:{off:#x}"),
        )?;
        copy_ok(h0, &format!("0x0300:{off:#x}"), "file:/tmp/iso.out", len)?;
        dma_table_is(
            &emu,
            "h0",
            &maps,
            &format!("the copy of 0x0300:{off:#x} into a {len}-byte user buffer"),
        )?;
        h0.run_ok("cmp /tmp/iso.in /tmp/iso.out && rm -f /tmp/iso.in /tmp/iso.out")
            .map_err(|e| format!("user buffer round trip through 0x0300: {e}"))?;
    }

    // Without an IOMMU the emulator reaches all of h1's RAM (isolation cannot be proven
    // there), but not beyond it.
    let maps1 = emu.request("dma-maps h1")?;
    h1.log_note(&format!(
        "emulator DMA mappings of h1's MEP (no IOMMU): {maps1}"
    ));
    let _ = bind_here(h1, &e, GPU1)?;
    route(h1, GPU1, MIB, 0, 0)?;
    let (_, v) = copy_fails(h1, "0x0400:0", "iova:0x100000000", 4096)?;
    expect_eq(
        "h1: copy to 4 GiB (beyond RAM): dma_status",
        Value::from("HOST_FAULT"),
        v["error"]["dma_status"].clone(),
    )?;

    // A function without a route: nothing to reach it by.
    let (code, v) = copy_fails(h0, "0x0300:0", "0x0400:0", 1)?;
    let mut c = Checks::new("h0: copy to 0x0400 without a route");
    c.eq("exit code (refused)", 3, code);
    c.eq_json(
        "errno",
        Value::from(libc_enoent()),
        v["error"]["errno"].clone(),
    );
    c.finish()?;
    // A route to a function that is not bound is refused by the firmware.
    let (code, _, _) = pcifab_cmd(
        h0,
        "p2p route add 0x0404 --size 0x1000 --window-off 0xf000000",
    )?;
    expect_eq("h0: route to unbound 0x0404: exit code", 3, code)?;
    check_invariants(&emu, "P2P isolation")?;
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

const fn libc_enoent() -> i64 {
    2
}

/// A route removed during a copy, and the target unbound during a copy: the copy stops with
/// ROUTE_FAULT and reports what arrived; nothing oopses.
pub fn p2p_races(f: &mut Fabric) -> Result<(), String> {
    if refused_without_extensions(f, &["p2p route del 0x0"])? {
        return Ok(());
    }
    compose_begin(f)?;
    let e = f.expected.clone();
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "the P2P scenarios need two hosts")?;
    let _ = bind_here(h0, &e, GPU0)?;
    pcifab_ok(h0, &format!("bind {GPU1:#06x} --host 1"))?;
    route(h0, GPU0, 64 * MIB, 0, 0)?;
    route(h0, GPU0, 64 * MIB, 64 * MIB, 64 * MIB)?;
    // GPU1 is h1's: a grant first (h0 is the fabric-manager host).
    pcifab_ok(h0, &format!("p2p grant {GPU1:#06x} --host 0"))?;
    route(h0, GPU1, 64 * MIB, 0, 128 * MIB)?;
    // A source pattern, and other bytes where each copy's first MiB lands: the first MiB
    // arriving is how the harness sees a copy under way.
    emu.request(&format!(
        "mem-fill {GPU0:#06x} 0 {:#x} {RACE_SEED:#x}",
        64 * MIB
    ))?;
    emu.request(&format!("mem-fill {GPU0:#06x} {:#x} {MIB:#x} 1", 64 * MIB))?;
    emu.request(&format!("mem-fill {GPU1:#06x} 0 {MIB:#x} 1"))?;
    let first_mib = mem_hash(&emu, GPU0, 0, MIB)?;
    // 400 ms before every 1 MiB chunk: a whole copy takes 25.6 s, far longer than an
    // unbind under TCG (up to 7 s seen while the machine was busy).
    emu.request("fault h0 dma-delay 400")?;
    let result = (|| -> Result<(), String> {
        for (what, to, dst, cut) in [
            (
                "route deleted",
                "0x0300:0x4000000",
                (GPU0, 64 * MIB),
                "pcifab p2p route del 0x4000000",
            ),
            (
                "target unbound",
                "0x0400:0",
                (GPU1, 0),
                "pcifab unbind 0x0400",
            ),
        ] {
            h0.run_ok(&format!(
                "rm -f /tmp/race.rc; (pcifab p2p copy --from 0x0300:0 --to {to} --len 64M --json \
                 > /tmp/race.json; echo $? > /tmp/race.rc) >/dev/null 2>&1 &"
            ))?;
            // The cut must land while the engine works on the copy: wait until the
            // emulator's DMA engine has a descriptor in flight (HEAD != TAIL) and the
            // copy's first MiB has arrived.
            wait_dma_in_flight(&emu, "h0", what)?;
            let t = std::time::Instant::now();
            while mem_hash(&emu, dst.0, dst.1, MIB)? != first_mib {
                if t.elapsed() > Duration::from_secs(20) {
                    return Err(format!(
                        "h0: {what}: the copy's first MiB did not arrive within 20 s"
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            h0.run_ok(&format!("{cut} >/tmp/cut.out 2>&1; echo cut $?"))?;
            let o = h0.run_ok_timeout(
                "for i in $(seq 100); do [ -s /tmp/race.rc ] && break; sleep 0.2; done; \
                 [ -s /tmp/race.rc ] || { echo 'the copy still runs 20 s after the cut'; exit 1; }; \
                 cat /tmp/race.rc; cat /tmp/race.json; rm -f /tmp/race.rc",
                LONG,
            )?;
            let v = json_line(&o)?;
            let rc = o.lines().next().unwrap_or("").trim().to_string();
            let done = v["error"]["done"].as_u64().unwrap_or(u64::MAX);
            let mut c = Checks::new(&format!("h0: 64 MiB copy, {what} during it"));
            c.eq_json(
                "dma_status",
                Value::from("ROUTE_FAULT"),
                v["error"]["dma_status"].clone(),
            );
            if rc == "0" {
                c.fail(format!("exit code: expected a failure, got 0 ({o})"));
            }
            if !(MIB..64 * MIB).contains(&done) || done % MIB != 0 {
                c.fail(format!(
                    "done: expected whole 1 MiB chunks, at least one (it arrived before the \
                     cut) and short of 64 MiB, got {done}"
                ));
            }
            c.finish()?;
            h0.log_note(&format!("{what}: {done} bytes arrived before the stop"));
        }
        Ok(())
    })();
    emu.request("fault h0 clear")?;
    result?;
    expect_eq(
        "h0: sysfs p2p_routes after the races",
        1,
        sysfs_num(h0, "p2p_routes")?,
    )?;
    check_invariants(&emu, "P2P races")?;
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

/// What `make bench` measures of P2P.
#[derive(Clone, Debug)]
pub struct P2pBench {
    pub rows: Vec<P2pRow>,
    /// The 4 KiB latency ([`P2pLatency`]).
    pub lat: P2pLatency,
}

/// Single copies of [`LAT_BYTES`] through the fabric against CPU bounces of the same bytes,
/// alternating copy by copy on the guest's clock, in rounds of [`LAT_COUNT`] each
/// (`pcifab-selftest p2p-bench --latency`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct P2pLatency {
    /// Copies per round, per side.
    pub count: u64,
    /// The median of the rounds' p50s (us), fabric and bounce.
    pub p50_us: f64,
    pub bounce_p50_us: f64,
    /// The 99th percentile of every fabric copy (us).
    pub p99_us: f64,
    /// Each round's p50 (us), fabric and bounce.
    pub rounds: Vec<f64>,
    pub bounce_rounds: Vec<f64>,
}

impl P2pLatency {
    /// From the selftest's `p2p-latency` line.
    pub fn parse(v: &Value) -> Result<P2pLatency, String> {
        let g = |k: &str| {
            v[k].as_f64()
                .ok_or_else(|| format!("p2p-latency line without {k}: {v}"))
        };
        let list = |k: &str| -> Result<Vec<f64>, String> {
            v[k].as_array()
                .ok_or_else(|| format!("p2p-latency line without {k}: {v}"))?
                .iter()
                .map(|x| {
                    x.as_f64()
                        .ok_or_else(|| format!("p2p-latency {k}: {x} is not a number"))
                })
                .collect()
        };
        let l = P2pLatency {
            count: g("count")? as u64,
            p50_us: g("p50_us")?,
            bounce_p50_us: g("bounce_p50_us")?,
            p99_us: g("p99_us")?,
            rounds: list("round_p50_us")?,
            bounce_rounds: list("round_bounce_p50_us")?,
        };
        if l.rounds.len() < 5 || l.rounds.len() != l.bounce_rounds.len() {
            return Err(format!(
                "p2p-latency: expected 5 or more rounds of each side: {v}"
            ));
        }
        Ok(l)
    }

    /// Fabric / bounce, per round.
    pub fn round_ratios(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .zip(&self.bounce_rounds)
            .map(|(a, b)| a / b)
            .collect()
    }
}

/// The copy size of the latency figure, and how many copies of each side a round times.
pub const LAT_BYTES: u64 = 4096;
pub const LAT_COUNT: u64 = 200;
/// Repetitions of the emulator's memcpy per size (it answers the best): as many as the
/// guest's fabric copies of each size, which are also back to back.
pub const MEMCPY_REPS: u32 = 3;

/// `make bench`: fabric-routed copies vs a CPU bounce through host memory and vs the
/// emulator's own memcpy between the same memories, 4 KiB to 64 MiB; then the latency of
/// single 4 KiB copies against CPU bounces of 4 KiB.
pub fn bench_p2p(f: &mut Fabric) -> Result<P2pBench, String> {
    compose_begin(f)?;
    let e = f.expected.clone();
    let emu = f.emu();
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let a = bind_here(h0, &e, GPU0)?;
    let b = bind_here(h0, &e, GPU1)?;
    route(h0, GPU0, 64 * MIB, 0, 0)?;
    route(h0, GPU1, 64 * MIB, 0, 64 * MIB)?;
    // The emulator's threads stay on one CPU for the copies and the floor alike
    // (`PinnedThreads`), and come back after.
    let pin = match f.emu_pid {
        Some(pid) => crate::procs::PinnedThreads::new(pid)?,
        None => None,
    };
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    match &pin {
        Some(p) => h0.log_note(&format!(
            "p2p bench: the emulator's {} threads pinned to CPU {}",
            p.threads(),
            p.cpu
        )),
        None => {
            h0.log_note("p2p bench: the emulator's threads not pinned (one CPU, or no emulator)")
        }
    }
    let o = h0.run_ok_timeout(
        &format!(
            "pcifab-selftest p2p-bench --a {GPU0:#06x} --b {GPU1:#06x} --bar-a {a} --bar-b {b} \
             --sizes 4K,64K,1M,4M,16M,64M --latency {LAT_COUNT} --latency-size {LAT_BYTES}"
        ),
        Duration::from_secs(900),
    )?;
    let mut rows = Vec::new();
    let mut lat = None;
    for l in o.lines().filter(|l| l.starts_with("{\"test\":\"p2p-")) {
        let v: Value =
            serde_json::from_str(l).map_err(|e| format!("bad p2p-bench line {l}: {e}"))?;
        let g = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        match v["test"].as_str() {
            Some("p2p-bench") => rows.push(P2pRow {
                bytes: g("bytes") as u64,
                fabric: g("fabric_mib_s"),
                bounce: g("bounce_mib_s"),
                ratio: g("ratio"),
                memcpy: f64::NAN,
            }),
            Some("p2p-latency") => lat = Some(P2pLatency::parse(&v)?),
            _ => {}
        }
    }
    if rows.is_empty() {
        return Err(format!("p2p-bench printed no results: {o}"));
    }
    let lat = lat.ok_or_else(|| format!("p2p-bench printed no p2p-latency line: {o}"))?;
    // The floor: the same bytes between the same memories inside the emulator, while the
    // guest is idle.
    for r in &mut rows {
        let v = emu.request(&format!(
            "memcpy-bench {GPU0:#06x} {GPU1:#06x} {} {MEMCPY_REPS}",
            r.bytes
        ))?;
        r.memcpy = v["mib_s"]
            .as_f64()
            .ok_or_else(|| format!("emulator memcpy-bench: no mib_s in {v}"))?;
    }
    drop(pin);
    h0.log_note(&format!(
        "p2p bench: {} sizes, memcpy {:?} MiB/s; {LAT_BYTES}-byte latency {lat:?}",
        rows.len(),
        rows.iter().map(|r| r.memcpy).collect::<Vec<_>>(),
    ));
    Ok(P2pBench { rows, lat })
}

#[cfg(test)]
mod tests {
    use super::P2pLatency;

    #[test]
    fn latency_line_of_the_selftest() {
        let v = serde_json::json!({"test": "p2p-latency", "bytes": 4096, "count": 200,
            "rounds": 5, "p50_us": 40.0, "p99_us": 210.5, "min_us": 30.0, "max_us": 900.0,
            "bounce_p50_us": 8.0, "round_p50_us": [40.0, 38.0, 44.0, 41.0, 39.0],
            "round_bounce_p50_us": [8.0, 8.0, 11.0, 8.2, 7.8]});
        let l = P2pLatency::parse(&v).unwrap();
        assert_eq!(
            (l.count, l.p50_us, l.bounce_p50_us, l.p99_us),
            (200, 40.0, 8.0, 210.5)
        );
        assert_eq!(l.round_ratios(), [5.0, 4.75, 4.0, 41.0 / 8.2, 5.0]);
        // Fewer than five rounds, unpaired rounds or a missing figure are errors.
        let mut short = v.clone();
        short["round_p50_us"] = serde_json::json!([40.0, 38.0, 44.0, 41.0]);
        short["round_bounce_p50_us"] = serde_json::json!([8.0, 8.0, 11.0, 8.2]);
        assert!(P2pLatency::parse(&short).is_err());
        let mut unpaired = v.clone();
        unpaired["round_bounce_p50_us"] = serde_json::json!([8.0]);
        assert!(P2pLatency::parse(&unpaired).is_err());
        let mut none = v.clone();
        none.as_object_mut().unwrap().remove("bounce_p50_us");
        assert!(P2pLatency::parse(&none)
            .unwrap_err()
            .contains("bounce_p50_us"));
    }
}
