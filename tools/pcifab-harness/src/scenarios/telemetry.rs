// SPDX-License-Identifier: GPL-2.0-only
//! The per-function telemetry directories in sysfs
//! (`/sys/class/misc/pcifabN/functions/0xPDFID/`), checked against what the emulator's
//! firmware is told to report.

use crate::checks::{begin, expect_eq, Checks};
use crate::fabric::Fabric;

/// Reads the four telemetry files of `pdfid` in one command.
fn read(h: &mut crate::fabric::Host, pdfid: u16) -> Result<Vec<String>, String> {
    let d = format!("/sys/class/misc/pcifab0/functions/{pdfid:#06x}");
    let out = h.run_ok(&format!(
        "cat {d}/temperature {d}/power {d}/utilisation {d}/health"
    ))?;
    Ok(out.lines().map(|l| l.trim().to_string()).collect())
}

/// Reads `pdfid`'s telemetry until its first two files (temperature, power) are `want`, at
/// most 5 s: the driver serves an answer for up to a second after the firmware gave it
/// (Documentation/sysfs.rst), so a change shows within about a second. Returns the last read.
fn read_until(
    h: &mut crate::fabric::Host,
    pdfid: u16,
    want: (&str, &str),
) -> Result<Vec<String>, String> {
    let t = std::time::Instant::now();
    loop {
        let v = read(h, pdfid)?;
        let now = (v.first().map(String::as_str), v.get(1).map(String::as_str));
        if now == (Some(want.0), Some(want.1)) || t.elapsed() > std::time::Duration::from_secs(5) {
            return Ok(v);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Every host has a directory per function of the fabric (bound anywhere or not), and the
/// files follow the firmware's telemetry, converted to hwmon units.
pub fn sysfs_telemetry(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| begin(h))?;
    let e = f.expected.clone();
    let emu = f.emu();
    let want: Vec<String> = e
        .functions()
        .iter()
        .map(|fi| format!("{:#06x}", fi.pdfid))
        .collect();
    for h in &mut f.hosts {
        let out = h.run_ok("ls /sys/class/misc/pcifab0/functions")?;
        let mut got: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        got.sort();
        let mut w = want.clone();
        w.sort();
        expect_eq(&format!("{}: function directories", h.name), w, got)?;
    }
    if f.dialect() == crate::config::Dialect::Pax {
        f.refusal_only("PAX firmware: per-function telemetry refused (EOPNOTSUPP), DIETEMP read");
        return pax_telemetry(f);
    }
    // What the configuration says gpu0 reports, in sysfs units (m°C, µW, %, health bits:
    // 2 temperature >= 85 C, 4 power above the limit).
    let gpu0 = e
        .endpoints
        .iter()
        .find(|ep| ep.pdfid(0) == 0x0300)
        .ok_or("the configuration has no endpoint with PF 0x0300 (gpu0)")?
        .clone();
    let health =
        u32::from(gpu0.temp_centi >= 8500) * 2 + u32::from(gpu0.power_mw > gpu0.power_limit_mw) * 4;
    let configured = vec![
        (i64::from(gpu0.temp_centi) * 10).to_string(),
        (u64::from(gpu0.power_mw) * 1000).to_string(),
        gpu0.utilisation.to_string(),
        format!("{health:#x}"),
    ];
    let before = read(&mut f.hosts[0], 0x0300)?;
    expect_eq(
        "h0: 0x0300 telemetry before the change (the configuration's values)",
        &configured,
        &before,
    )?;
    // gpu0's PF: 91.50 C, 800 W (above its 700 W limit), 42 %; a VF gets a fifth of the power.
    emu.request("telemetry 0x0300 9150 800000 42")?;
    let result = (|| -> Result<(), String> {
        for h in &mut f.hosts {
            let mut c = Checks::new(&format!("{}: sysfs telemetry of 0x0300", h.name));
            let pf = read_until(h, 0x0300, ("91500", "800000000"))?;
            c.eq(
                "temperature (m°C)",
                "91500",
                pf.first().map_or("", String::as_str),
            );
            c.eq(
                "power (µW)",
                "800000000",
                pf.get(1).map_or("", String::as_str),
            );
            c.eq(
                "utilisation (%)",
                "42",
                pf.get(2).map_or("", String::as_str),
            );
            // Bit 1 temperature >= 85 C, bit 2 power above the limit.
            c.eq("health", "0x6", pf.get(3).map_or("", String::as_str));
            let vf = read_until(h, 0x0301, ("91500", "160000000"))?;
            c.eq(
                "VF 0x0301 temperature",
                "91500",
                vf.first().map_or("", String::as_str),
            );
            c.eq(
                "VF 0x0301 power (a fifth)",
                "160000000",
                vf.get(1).map_or("", String::as_str),
            );
            c.finish()?;
        }
        Ok(())
    })();
    // Put back what the configuration says, and every host must show it again.
    emu.request(&format!(
        "telemetry 0x0300 {} {} {}",
        gpu0.temp_centi, gpu0.power_mw, gpu0.utilisation
    ))?;
    result?;
    for h in &mut f.hosts {
        let again = read_until(h, 0x0300, (&configured[0], &configured[1]))?;
        expect_eq(
            &format!(
                "{}: 0x0300 telemetry restored to the configuration's values",
                h.name
            ),
            &configured,
            &again,
        )?;
    }
    Ok(())
}

/// PAX firmware reports only the die temperature (DIETEMP): every function file fails with
/// `EOPNOTSUPP`, and the switch's `temperature` follows the firmware's die temperature.
fn pax_telemetry(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    let state = emu.request("state")?;
    let die = state["firmware"]["die_temp_centi"]
        .as_i64()
        .ok_or_else(|| format!("emulator state has no firmware.die_temp_centi: {state}"))?;
    for h in &mut f.hosts {
        let mut c = Checks::new(&format!("{}: telemetry on PAX firmware", h.name));
        for file in ["temperature", "power", "utilisation", "health"] {
            let o = h.run(&format!(
                "cat /sys/class/misc/pcifab0/functions/0x0300/{file}"
            ))?;
            if o.code == 0 || !o.out.contains("not supported") {
                c.fail(format!(
                    "0x0300/{file}: expected EOPNOTSUPP (\"Operation not supported\"), got \
                     exit {}: {}",
                    o.code,
                    o.out.trim()
                ));
            }
        }
        let t = h.run_ok("cat /sys/class/misc/pcifab0/temperature")?;
        c.eq(
            "die temperature (m°C, from DIETEMP)",
            (die * 10).to_string(),
            t.trim().to_string(),
        );
        c.finish()?;
    }
    Ok(())
}

/// The sorted names under `functions/` of host `h`.
fn dirs(h: &mut crate::fabric::Host) -> Result<Vec<String>, String> {
    // Names from the directory's listing alone: `ls` also looks each entry up, which fails
    // for a directory the driver removes meanwhile (what the scenario waits for).
    let out = h.run_ok(
        "d=/sys/class/misc/pcifab0/functions; [ -d $d ] || exit 1; \
         for f in $d/0x*; do [ \"$f\" = \"$d/0x*\" ] || echo \"${f##*/}\"; done",
    )?;
    let mut v: Vec<String> = out.split_whitespace().map(str::to_string).collect();
    v.sort();
    Ok(v)
}

/// Reads `functions/` of `h` until it lists exactly `want`, at most `secs`; returns the
/// last listing and how long it took.
fn dirs_until(
    h: &mut crate::fabric::Host,
    want: &[String],
    secs: u64,
) -> Result<(Vec<String>, std::time::Duration), String> {
    let t = std::time::Instant::now();
    loop {
        let got = dirs(h)?;
        if got == want || t.elapsed() > std::time::Duration::from_secs(secs) {
            return Ok((got, t.elapsed()));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The per-function directories follow the fabric: when gpu1's endpoint leaves (its link goes
/// down, so the firmware's endpoint records no longer list its functions) every host loses
/// gpu1's directories within 10 s, the others stay; when the link comes back the directories
/// return, and their files read again.
pub fn sysfs_dirs_follow_fabric(f: &mut Fabric) -> Result<(), String> {
    crate::checks::compose_begin(f)?;
    let e = f.expected.clone();
    let emu = f.emu();
    let gpu1 = e
        .endpoints
        .iter()
        .find(|ep| ep.name == "gpu1")
        .ok_or("the configuration has no gpu1")?;
    let port = gpu1.port;
    let all: Vec<String> = {
        let mut v: Vec<String> = e
            .functions()
            .iter()
            .map(|fi| format!("{:#06x}", fi.pdfid))
            .collect();
        v.sort();
        v
    };
    let without: Vec<String> = {
        let mut v: Vec<String> = e
            .functions()
            .iter()
            .filter(|fi| fi.endpoint != "gpu1")
            .map(|fi| format!("{:#06x}", fi.pdfid))
            .collect();
        v.sort();
        v
    };
    if without.len() == all.len() {
        return Err("gpu1 has no functions in the configuration".into());
    }
    for h in &mut f.hosts {
        expect_eq(
            &format!("{}: function directories at the start", h.name),
            all.clone(),
            dirs(h)?,
        )?;
    }
    emu.request(&format!("link {port} down"))?;
    let r = (|| {
        for h in &mut f.hosts {
            let (got, took) = dirs_until(h, &without, 10)?;
            expect_eq(
                &format!(
                    "{}: function directories after gpu1's link went down",
                    h.name
                ),
                without.clone(),
                got,
            )?;
            h.log_note(&format!(
                "gpu1's directories gone {took:?} after its link went down"
            ));
        }
        Ok::<(), String>(())
    })();
    emu.request(&format!("link {port} up"))?;
    r?;
    let pf = e
        .functions()
        .iter()
        .find(|fi| fi.endpoint == "gpu1")
        .map(|fi| fi.pdfid)
        .ok_or("gpu1 has no functions")?;
    let pax = f.dialect() == crate::config::Dialect::Pax;
    for h in &mut f.hosts {
        let (got, took) = dirs_until(h, &all, 10)?;
        expect_eq(
            &format!(
                "{}: function directories after gpu1's link came back",
                h.name
            ),
            all.clone(),
            got,
        )?;
        h.log_note(&format!(
            "gpu1's directories back {took:?} after its link came up"
        ));
        if !pax {
            let v = read(h, pf)?;
            expect_eq(&format!("{}: gpu1 PF's files read", h.name), 4, v.len())?;
        }
    }
    let mut c = Checks::new("dmesg after the directories followed the fabric");
    for h in &mut f.hosts {
        let d = h.run_ok("dmesg")?;
        if d.contains("per-function sysfs directories not updated") {
            c.fail(format!("{}: the sync failed: {d}", h.name));
        }
    }
    c.finish()
}
