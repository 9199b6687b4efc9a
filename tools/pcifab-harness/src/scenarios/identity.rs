// SPDX-License-Identifier: GPL-2.0-only
//! The driver and the MEP in every guest: the agent answers, pcifab binds the MEP and
//! reports the configured identity (sysfs and the ioctl), survives load/unload cycles, the
//! in-tree switchtec driver binds the same MEP, rmmod leaves nothing behind, and at the end
//! of the run kmemleak finds no leak.

use std::time::Duration;

use serde_json::Value;

use crate::checks::{
    back_to_pcifab, check_bound_pcifab, check_mep_driver, check_sysfs_identity, dmesg_clean,
    driver_of, ensure_pcifab, expect_eq, find_mep, json_line, module_loaded, wait_or_dmesg, Checks,
    KMEMLEAK, NO_DRIVER, PCIFAB_KO, SWITCHTEC_KO,
};
use crate::config::Expected;
use crate::fabric::{Fabric, Host};

/// The MEP's identity attributes in pcifab's sysfs directory.
const IDENTITY: [&str; 8] = [
    "fw_version",
    "device_id",
    "device_version",
    "vendor_id",
    "product_id",
    "product_revision",
    "partition",
    "partition_count",
];

pub fn agent_answers(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        // The QMP channel later scenarios use for hot-plug works too.
        let status = h.qmp()?.execute("query-status", None)?;
        expect_eq(
            &format!("{}: QMP query-status", h.name),
            Some("running"),
            status.get("status").and_then(Value::as_str),
        )?;
        let out = h.run_ok("uname -r")?;
        let expected = h.kernel_release.clone();
        expect_eq(
            &format!("{}: uname -r", h.name),
            expected.as_str(),
            out.trim(),
        )
    })
}

pub fn pcifab_binds(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        ensure_pcifab(h)?;
        check_bound_pcifab(h)
    })
}

pub fn sysfs_identity(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, e| {
        ensure_pcifab(h)?;
        check_sysfs_identity(h, e, "/sys/class/misc/pcifab0", &IDENTITY, &[])
    })
}

/// Compares `pcifab info --json` output with the configuration.
fn check_info_json(h: &Host, e: &Expected, text: &str) -> Result<(), String> {
    json_line(text).map_err(|err| format!("{}: `pcifab info --json`: {err}", h.name))?;
    let v: Value = serde_json::from_str(text.trim()).map_err(|err| {
        format!(
            "{}: `pcifab info --json`: expected one JSON object, got {:?} ({err})",
            h.name,
            text.trim()
        )
    })?;
    if !v.is_object() {
        return Err(format!(
            "{}: `pcifab info --json`: expected an object, got {v}",
            h.name
        ));
    }
    let s = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
    let dev = format!("{:#06x}", e.device_id);
    let mut c = Checks::new(&format!("{}: pcifab info --json", h.name));
    // Minor versions only add; any 1.x speaks the ABI checked here.
    let uapi = s("uapi_version");
    let major_1 = uapi
        .as_str()
        .and_then(|v| v.split_once('.'))
        .is_some_and(|(maj, min)| maj == "1" && min.parse::<u32>().is_ok());
    if !major_1 {
        c.fail(format!(
            "uapi_version: expected \"1.<minor>\" (e.g. \"1.0\"), got {uapi}"
        ));
    }
    c.eq_json("device", Value::from("/dev/pcifab0"), s("device"));
    c.eq_json("pci_vendor", Value::from("0x11f8"), s("pci_vendor"));
    c.eq_json("pci_device", Value::from(dev.as_str()), s("pci_device"));
    c.eq_json("device_id", Value::from(dev.as_str()), s("device_id"));
    c.eq_json(
        "device_version",
        Value::from(format!("{:#x}", e.device_version)),
        s("device_version"),
    );
    c.eq_json(
        "fw_version",
        Value::from(format!("0x{:08x}", e.fw_version)),
        s("fw_version"),
    );
    c.eq_json("partition", Value::from(h.index), s("partition"));
    c.eq_json(
        "partition_count",
        Value::from(e.partition_count()),
        s("partition_count"),
    );
    c.eq_json(
        "vendor_id",
        Value::from(e.vendor_id.trim_end()),
        s("vendor_id"),
    );
    c.eq_json(
        "product_id",
        Value::from(e.product_id.trim_end()),
        s("product_id"),
    );
    c.eq_json(
        "product_revision",
        Value::from(e.product_revision.trim_end()),
        s("product_revision"),
    );
    c.finish()
}

pub fn ioctl_identity(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, e| {
        ensure_pcifab(h)?;
        let out = h.run_ok("pcifab info --json")?;
        check_info_json(h, e, &out)
    })
}

/// Load/unload cycles of `load_unload_cycles`: 50 with `--soak` (`make soak`), 4 in
/// `make test` (the busy cycles of `trust::unload_cycles` follow it there).
fn load_cycles() -> u32 {
    if crate::soak() {
        50
    } else {
        4
    }
}

pub fn load_unload_cycles(f: &mut Fabric) -> Result<(), String> {
    let cycles = load_cycles();
    f.each_host(|h, _| {
        ensure_pcifab(h)?;
        let bdf = find_mep(h)?;
        h.run_ok("dmesg -c >/dev/null")?;
        // Every cycle: the module goes and with it the device; insmod must really probe the
        // MEP (driver link pcifab, /dev/pcifab0 within 5 s, VERSION and IDENTITY answer).
        let out = h.run_ok_timeout(
            &format!(
                "d=/sys/bus/pci/devices/{bdf}\n\
                 i=0; while [ $i -lt {cycles} ]; do\n\
                 rmmod pcifab || {{ echo \"cycle $i: rmmod failed\"; exit 1; }}\n\
                 [ -e $d/driver ] && {{ echo \"cycle $i: MEP still bound to $(readlink $d/driver) after rmmod\"; exit 1; }}\n\
                 insmod {PCIFAB_KO} || {{ echo \"cycle $i: insmod failed\"; exit 1; }}\n\
                 drv=$(readlink $d/driver); [ \"${{drv##*/}}\" = pcifab ] || \
                   {{ echo \"cycle $i: MEP driver after insmod: expected pcifab, got '${{drv##*/}}'\"; exit 1; }}\n\
                 n=0; while [ ! -c /dev/pcifab0 ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n+1)); done\n\
                 [ -c /dev/pcifab0 ] || {{ echo \"cycle $i: /dev/pcifab0 not a character device 5 s after insmod\"; exit 1; }}\n\
                 pcifab info >/tmp/info.out 2>&1 || {{ echo \"cycle $i: pcifab info failed:\"; cat /tmp/info.out; exit 1; }}\n\
                 i=$((i+1)); done\n\
                 echo cycles $i"
            ),
            Duration::from_secs(500),
        )?;
        expect_eq(
            &format!("{}: load/unload cycles with the MEP probed each time", h.name),
            format!("cycles {cycles}"),
            out.trim().to_string(),
        )?;
        dmesg_clean(h)?;
        check_bound_pcifab(h)
    })
}
fn switchtec_inner(h: &mut Host, e: &Expected) -> Result<(), String> {
    if module_loaded(h, "pcifab")? {
        h.run_ok("rmmod pcifab")?;
    }
    h.run_ok("dmesg -c >/dev/null")?;
    h.run_ok(&format!("insmod {SWITCHTEC_KO}"))?;
    let dir = "/sys/class/switchtec/switchtec0";
    wait_or_dmesg(
        h,
        &format!("[ -d {dir} ]"),
        5,
        &format!("{dir}: expected to appear after insmod switchtec, got nothing"),
    )?;
    check_mep_driver(h, "switchtec")?;
    // switchtec's directory has every identity attribute but device_id.
    let names: Vec<&str> = IDENTITY
        .iter()
        .copied()
        .filter(|n| *n != "device_id")
        .collect();
    check_sysfs_identity(
        h,
        e,
        dir,
        &names,
        // Gen4 parts have no component_* fields; the driver says so.
        &[("component_vendor", "none"), ("component_id", "none")],
    )?;
    h.run_ok("rmmod switchtec")?;
    dmesg_clean(h)?;
    h.run_ok(&format!("insmod {PCIFAB_KO}"))?;
    check_bound_pcifab(h)
}

pub fn switchtec_binds(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, e| {
        let result = switchtec_inner(h, e);
        if result.is_err() {
            // Leave the guest as later scenarios expect it: pcifab loaded.
            let _ = back_to_pcifab(h);
        }
        result
    })
}

pub fn rmmod_pcifab(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        ensure_pcifab(h)?;
        let bdf = find_mep(h)?;
        h.run_ok("rmmod pcifab")?;
        let mut c = Checks::new(&format!("{}: after rmmod pcifab", h.name));
        c.eq(
            "/sys/module/pcifab exists",
            false,
            module_loaded(h, "pcifab")?,
        );
        c.eq(
            "/dev/pcifab0 exists",
            false,
            h.run("[ -e /dev/pcifab0 ]")?.code == 0,
        );
        let drv = driver_of(h, &bdf)?;
        c.eq(
            "driver of MEP",
            NO_DRIVER,
            drv.as_deref().unwrap_or(NO_DRIVER),
        );
        c.finish()
    })
}

/// At the end of the run: kmemleak scans twice in every live guest and must report nothing.
/// Without kmemleak in the kernel it fails under `--debug-kernel` and is skipped (visibly)
/// otherwise.
pub fn kmemleak_clean(f: &mut Fabric) -> Result<(), String> {
    let debug = f.debug_kernel;
    let dead: Vec<String> = f
        .hosts
        .iter()
        .filter(|h| h.is_dead())
        .map(|h| {
            format!(
                "{}: dead, cannot be scanned ({})",
                h.name,
                h.dead_reason().unwrap_or("?")
            )
        })
        .collect();
    if !dead.is_empty() {
        return Err(dead.join("; "));
    }
    let absent = std::sync::Mutex::new(Vec::new());
    f.each_host(|h, _| {
        if h.run(&format!("[ -e {KMEMLEAK} ]"))?.code != 0 {
            let why = h
                .run(
                    "grep -qw debugfs /proc/filesystems && echo 'no kmemleak in this kernel' \
                      || echo 'no debugfs in this kernel'",
                )?
                .out
                .trim()
                .to_string();
            if debug {
                return Err(format!(
                    "{}: {KMEMLEAK} does not exist ({why}), but --debug-kernel says this is the \
                     debug kernel, which has CONFIG_DEBUG_KMEMLEAK",
                    h.name
                ));
            }
            if let Ok(mut a) = absent.lock() {
                a.push(format!("{}: {why}", h.name));
            }
            return Ok(());
        }
        // Two scans: an object must look unreferenced in both to be reported.
        let out = h.run_ok_timeout(
            &format!("echo scan > {KMEMLEAK} && echo scan > {KMEMLEAK} && cat {KMEMLEAK}"),
            Duration::from_secs(400),
        )?;
        let objects = out
            .lines()
            .filter(|l| l.starts_with("unreferenced object"))
            .count();
        if out.trim().is_empty() {
            return Ok(());
        }
        let lines: Vec<&str> = out.lines().collect();
        let shown = lines[..lines.len().min(crate::splat::SPLAT_LINES)].join("\n  | ");
        let path = h.console.with_file_name(format!("{}.kmemleak", h.name));
        let _ = std::fs::write(&path, &out);
        Err(format!(
            "{}: kmemleak reports {objects} unreferenced object(s) (all of it in {}):\n  | {shown}",
            h.name,
            path.display()
        ))
    })?;
    let absent = absent.into_inner().unwrap_or_default();
    if !absent.is_empty() {
        f.skip(&format!(
            "no kmemleak in this kernel (not the debug kernel: {})",
            absent.join("; ")
        ));
    }
    Ok(())
}
