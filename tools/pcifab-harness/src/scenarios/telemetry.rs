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
