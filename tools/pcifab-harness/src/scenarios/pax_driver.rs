// SPDX-License-Identifier: GPL-2.0-only
//! Scenarios for the driver on PAX firmware and on firmware with pcifab's extensions: the
//! features the driver discovers, what it refuses without them, PAX's multi-function bind
//! (all functions or none) and DMA MRPC with its fallback to the mailbox. Each runs under
//! both dialects (`pcifab-harness test --dialect`) and expects what that dialect offers.

use std::time::Duration;

use serde_json::Value;

use crate::checks::{
    begin, check_world, compose_begin, configured, emu_owners, owners, pcifab_cmd, pcifab_ok,
    refused_by_firmware, selftest_json, Checks,
};
use crate::config::Dialect;
use crate::fabric::{Fabric, Host};

const SYSFS: &str = "/sys/class/misc/pcifab0";
/// gpu1's VFs (fabric.toml): a PF at 0x0400 with four VFs.
const GPU1_VFS: [u16; 3] = [0x0401, 0x0402, 0x0403];
/// `EOPNOTSUPP`, as the CLI's JSON reports it.
const EOPNOTSUPP: i64 = 95;
const EBUSY: i64 = 16;
const ETIMEDOUT: i64 = 110;
/// PAX's `ERR_CMD_INVALID`: what PAX firmware answers a command it does not have.
const ERR_CMD_INVALID: u64 = 0x64005;
/// PAX's `ERR_PHYC_PORT_ARDY_BIND`: a function of the list is bound already.
const ERR_PHYC_PORT_ARDY_BIND: &str = "0x1";

fn sysfs(h: &mut Host, file: &str) -> Result<String, String> {
    Ok(h.run_ok(&format!("cat {SYSFS}/{file}"))?.trim().to_string())
}

/// The features the driver must find under `d`.
fn expected_features(d: Dialect) -> &'static str {
    match d {
        Dialect::Pax => "none",
        Dialect::Extended => "telemetry p2p-routes dma-engine unbind-request",
    }
}

/// The driver asks the firmware once at probe which extensions it has and shows them; PAX
/// firmware refuses the query as it refuses any command it does not know.
pub fn features(f: &mut Fabric) -> Result<(), String> {
    let d = f.dialect();
    f.each_host(|h, _| {
        begin(h)?;
        let mut c = Checks::new(&format!("{}: firmware features ({d:?})", h.name));
        c.eq(
            "sysfs features",
            expected_features(d).to_string(),
            sysfs(h, "features")?,
        );
        // The discovery query itself, raw: an error status with ERR_CMD_INVALID on PAX.
        let (code, v, out) = pcifab_cmd(h, "mrpc 0xf000 --out-len 8")?;
        match d {
            Dialect::Pax => {
                c.eq_json(
                    "EXT_FEATURES return value on PAX firmware",
                    Value::from(format!("{ERR_CMD_INVALID:#x}")),
                    v["error"]["ret_value"].clone(),
                );
            }
            Dialect::Extended => {
                if code != 0 || v.get("status").and_then(Value::as_u64) != Some(2) {
                    c.fail(format!(
                        "EXT_FEATURES: expected status 2 (done), got exit {code}: {}",
                        out.trim()
                    ));
                }
            }
        }
        c.finish()
    })
}

/// Without the extensions the telemetry and P2P calls fail with `EOPNOTSUPP` and the CLI
/// names the missing firmware feature; the DMA engine's registers are never touched. With
/// them the same calls work.
pub fn extensions(f: &mut Fabric) -> Result<(), String> {
    let d = f.dialect();
    compose_begin(f)?;
    let emu = f.emu();
    f.each_host(|h, _| {
        let mut c = Checks::new(&format!("{}: extension calls ({d:?})", h.name));
        let (code, v, out) = pcifab_cmd(h, "p2p route list")?;
        let temp = h.run(&format!("cat {SYSFS}/functions/0x0300/temperature"))?;
        let window = sysfs(h, "p2p_window_size")?;
        match d {
            Dialect::Pax => {
                refused_by_firmware(&mut c, "p2p route list", code, &v, &out);
                if temp.code == 0 || !temp.out.contains("not supported") {
                    c.fail(format!(
                        "function telemetry: expected EOPNOTSUPP (\"Operation not supported\"), \
                         got exit {}: {}",
                        temp.code,
                        temp.out.trim()
                    ));
                }
                c.eq("p2p_window_size", "0".to_string(), window);
                c.eq("p2p_routes", "0".to_string(), sysfs(h, "p2p_routes")?);
                no_telemetry_cli(h, &mut c)?;
                // The driver never touched the register block the firmware lacks, since
                // the emulator started (probe included).
                let state = emu.request("state")?;
                let touched = state["hosts"]
                    .as_array()
                    .and_then(|a| a.iter().find(|x| x["name"] == h.name.as_str()))
                    .and_then(|x| x["ext_block_accesses"].as_u64());
                c.eq(
                    "emulator: accesses to the absent extension block",
                    Some(0),
                    touched,
                );
            }
            Dialect::Extended => {
                if code != 0 {
                    c.fail(format!(
                        "`pcifab p2p route list`: exit {code}: {}",
                        out.trim()
                    ));
                }
                if temp.code != 0 {
                    c.fail(format!(
                        "function telemetry: exit {}: {}",
                        temp.code,
                        temp.out.trim()
                    ));
                }
                if window == "0" {
                    c.fail("p2p_window_size: expected the MEP's window, got 0".into());
                }
                telemetry_cli(h, &mut c)?;
            }
        }
        c.finish()
    })
}

/// On PAX firmware `pcifab show` shows the function and says the firmware lacks the
/// telemetry extension (it does not ask the firmware); `stats --telemetry` and `top` fail
/// with `EOPNOTSUPP` naming the missing feature.
fn no_telemetry_cli(h: &mut Host, c: &mut Checks) -> Result<(), String> {
    let (code, v, out) = pcifab_cmd(h, "show 0x0300")?;
    c.eq("`pcifab show 0x0300` exit", 0, code);
    c.eq_json(
        "`pcifab show` pdfid",
        Value::from("0x0300"),
        v["pdfid"].clone(),
    );
    c.eq_json(
        "`pcifab show` telemetry",
        Value::Null,
        v.get("telemetry").cloned().unwrap_or(Value::from("absent")),
    );
    c.eq_json(
        "`pcifab show` missing_feature",
        Value::from("telemetry"),
        v["missing_feature"].clone(),
    );
    if v.get("telemetry_error").is_some() {
        c.fail(format!(
            "`pcifab show`: the firmware was asked for telemetry it lacks: {}",
            out.trim()
        ));
    }
    let text = h.run("pcifab show 0x0300")?;
    if text.code != 0 || !text.out.contains("lacks the telemetry extension") {
        c.fail(format!(
            "`pcifab show 0x0300`: expected exit 0 and a line saying the firmware lacks the \
             telemetry extension, got exit {}: {}",
            text.code,
            text.out.trim()
        ));
    }
    for call in ["stats --telemetry", "top --count 1"] {
        let (code, v, out) = pcifab_cmd(h, call)?;
        refused_by_firmware(c, call, code, &v, &out);
        c.eq(&format!("`pcifab {call}` exit"), 1, code);
        c.eq_json(
            &format!("`pcifab {call}` missing_feature"),
            Value::from("telemetry"),
            v["error"]["missing_feature"].clone(),
        );
        if !out.contains("lacks the telemetry extension") {
            c.fail(format!(
                "`pcifab {call}`: expected a message naming the telemetry extension, got: {}",
                out.trim()
            ));
        }
    }
    Ok(())
}

/// With the extensions `pcifab show` and `stats --telemetry` read the telemetry.
fn telemetry_cli(h: &mut Host, c: &mut Checks) -> Result<(), String> {
    let (code, v, out) = pcifab_cmd(h, "show 0x0300")?;
    if code != 0 || !v["telemetry"].is_object() || v.get("missing_feature").is_some() {
        c.fail(format!(
            "`pcifab show 0x0300`: expected exit 0 with a telemetry object, got exit {code}: {}",
            out.trim()
        ));
    }
    let (code, v, out) = pcifab_cmd(h, "stats --telemetry")?;
    let errno = v["error"]["errno"].as_i64();
    if code != 0 || errno == Some(EOPNOTSUPP) {
        c.fail(format!(
            "`pcifab stats --telemetry`: expected exit 0, got exit {code}: {}",
            out.trim()
        ));
    }
    Ok(())
}

/// Runs the multi-function bind sample in `h`; returns (exit code, its JSON line).
fn bind_multi(
    h: &mut Host,
    host: usize,
    pdfids: &[u16],
    extra: &str,
) -> Result<(i64, Value), String> {
    let list: Vec<String> = pdfids.iter().map(|p| format!("{p:#06x}")).collect();
    let o = h.run_timeout(
        &format!("pcifab-bind {host} {} {extra}", list.join(" ")),
        Duration::from_secs(90),
    )?;
    let v = o
        .out
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    h.log_note(&format!(
        "pcifab-bind {host} {}: exit {}: {}",
        list.join(" "),
        o.code,
        o.out.trim()
    ));
    Ok((o.code, v))
}

/// The PCI functions behind one slot of `h`: `NAME` is function 0's; returns the vendor and
/// device ids of functions 0, 1, ... that exist.
fn slot_functions(h: &mut Host, name: &str) -> Result<Vec<String>, String> {
    let base = name.strip_suffix(".0").ok_or_else(|| {
        format!(
            "{}: bound device {name:?} is not function 0 of its slot",
            h.name
        )
    })?;
    let out = h.run_ok(&format!(
        "for f in 0 1 2 3 4 5 6 7; do d=/sys/bus/pci/devices/{base}.$f; \
         [ -e $d ] && echo $(cat $d/vendor):$(cat $d/device); done; true"
    ))?;
    Ok(out.lines().map(str::to_string).collect())
}

/// PAX binds up to eight functions to one logical port as one multi-function device: the
/// VFs arrive together, and leave together. A list with one function bound elsewhere is
/// refused whole, and a list whose functions do not all appear is undone by the driver.
pub fn multi_bind(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let mut c = Checks::new(&format!("{}: multi-function bind", h0.name));

    // Three VFs as one device.
    let (code, v) = bind_multi(h0, 0, &GPU1_VFS, "")?;
    if code != 0 || v.get("ok") != Some(&Value::Bool(true)) {
        return Err(format!(
            "{}: binding {GPU1_VFS:04x?} together failed: {v}",
            h0.name
        ));
    }
    let name = v["name"].as_str().unwrap_or("").to_string();
    let vf = configured(&e, GPU1_VFS[0])?;
    let want: Vec<String> = GPU1_VFS
        .iter()
        .map(|_| format!("{:#06x}:{:#06x}", vf.vendor_id, vf.device_id))
        .collect();
    c.eq(
        "functions of the slot (vendor:device)",
        want,
        slot_functions(h0, &name)?,
    );
    let all_h0 = owners(&GPU1_VFS.iter().map(|&p| (p, 0)).collect::<Vec<_>>());
    c.eq("emulator: owners", all_h0.clone(), emu_owners(&emu, &e)?.0);
    c.finish()?;
    check_world(f, &all_h0, "three VFs bound together to h0")?;

    // Unbinding function 0 takes the logical port away: all three leave.
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let (code, _, out) = pcifab_cmd(h0, &format!("unbind {:#06x}", GPU1_VFS[0]))?;
    if code != 0 {
        return Err(format!(
            "{}: unbind {:#06x}: exit {code}: {}",
            h0.name,
            GPU1_VFS[0],
            out.trim()
        ));
    }
    check_world(f, &owners(&[]), "function 0 unbound: the whole device left")?;

    // One function of the list bound elsewhere: refused whole, nothing bound.
    emu.request(&format!("bind {:#06x} h1 0", GPU1_VFS[1]))?;
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let (code, v) = bind_multi(h0, 0, &GPU1_VFS, "")?;
    let mut c = Checks::new(&format!("{}: multi-function bind with one taken", h0.name));
    c.eq("exit", 1i64, code);
    c.eq("errno", Some(EBUSY), v.get("errno").and_then(Value::as_i64));
    c.eq(
        "firmware code",
        Some(ERR_PHYC_PORT_ARDY_BIND),
        v.get("fw_ret").and_then(Value::as_str),
    );
    c.finish()?;
    check_world(
        f,
        &owners(&[(GPU1_VFS[1], 1)]),
        "refused list: only h1's VF bound",
    )?;
    emu.request(&format!("unbind {:#06x}", GPU1_VFS[1]))?;

    // The functions never appear on h0: the driver undoes the whole binding.
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    emu.request("fault h0 no-enumerate")?;
    let r = bind_multi(h0, 0, &[GPU1_VFS[0], GPU1_VFS[2]], "-t 3000");
    emu.request("fault clear h0")?;
    let (code, v) = r?;
    let mut c = Checks::new(&format!(
        "{}: multi-function bind never enumerated",
        h0.name
    ));
    c.eq("exit", 1i64, code);
    c.eq(
        "errno",
        Some(ETIMEDOUT),
        v.get("errno").and_then(Value::as_i64),
    );
    c.finish()?;
    check_world(f, &owners(&[]), "never enumerated: nothing left bound")
}

/// `pcifab bind` with a list of functions: the first is function 0 of one multi-function
/// device and the list binds all or none, as with the C sample above. A list whose third
/// function is bound elsewhere is refused whole, with the firmware's reason and none of it
/// bound; a good list arrives whole; unbinding function 0 takes it all away again.
pub fn multi_bind_cli(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let list: Vec<String> = GPU1_VFS.iter().map(|p| format!("{p:#06x}")).collect();
    let bind = format!("bind {} --host 0", list.join(" "));

    // A list named wrong never reaches the driver.
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let mut c = Checks::new(&format!("{}: `pcifab bind` with a wrong list", h0.name));
    let (code, v, out) = pcifab_cmd(h0, "bind 0x0401 0x0402 0x0401 --host 0")?;
    c.eq("exit", 2, code);
    c.eq_json(
        "error code",
        Value::from("usage"),
        v["error"]["code"].clone(),
    );
    if !out.contains("0x0401 is named twice") {
        c.fail(format!(
            "expected a message naming the duplicate, got: {}",
            out.trim()
        ));
    }
    c.finish()?;
    check_world(f, &owners(&[]), "a wrong list: nothing bound")?;

    // The third function of the list bound elsewhere: the firmware refuses the whole list.
    let third = GPU1_VFS[2];
    emu.request(&format!("bind {third:#06x} h1 0"))?;
    check_world(
        f,
        &owners(&[(third, 1)]),
        "the list's third function bound to h1",
    )?;
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let (code, v, _) = pcifab_cmd(h0, &bind)?;
    let mut c = Checks::new(&format!(
        "{}: `pcifab {bind}` with {third:#06x} on h1",
        h0.name
    ));
    c.eq("exit", 3, code);
    c.eq("errno", Some(EBUSY), v["error"]["errno"].as_i64());
    c.eq(
        "firmware code",
        Some(ERR_PHYC_PORT_ARDY_BIND),
        v["error"]["fw_ret"].as_str(),
    );
    c.eq_json(
        "error pdfids",
        Value::from(list.clone()),
        v["error"]["pdfids"].clone(),
    );
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    for want in [
        "the firmware refused the whole list",
        "bound or being bound already",
        &format!("{third:#06x} is bound to host 1"),
        "none of the 3 functions was bound",
    ] {
        if !msg.contains(want) {
            c.fail(format!("message: expected it to say {want:?}, got {msg:?}"));
        }
    }
    c.finish()?;
    check_world(
        f,
        &owners(&[(third, 1)]),
        "`pcifab bind` of a list refused: only h1's VF bound",
    )?;
    emu.request(&format!("unbind {third:#06x}"))?;
    check_world(f, &owners(&[]), "h1's VF unbound")?;

    // The list free: all three arrive on h0 as one device, the first as function 0.
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let v = pcifab_ok(h0, &bind)?;
    let mut c = Checks::new(&format!("{}: `pcifab {bind}`", h0.name));
    c.eq_json("pdfid", Value::from(list[0].clone()), v["pdfid"].clone());
    c.eq_json("pdfids", Value::from(list.clone()), v["pdfids"].clone());
    c.eq_json("host", Value::from(0), v["host"].clone());
    let name = v["device"].as_str().unwrap_or("").to_string();
    let vf = configured(&e, GPU1_VFS[0])?;
    c.eq_json(
        "vendor",
        Value::from(format!("{:#06x}", vf.vendor_id)),
        v["vendor"].clone(),
    );
    let want: Vec<String> = GPU1_VFS
        .iter()
        .map(|_| format!("{:#06x}:{:#06x}", vf.vendor_id, vf.device_id))
        .collect();
    c.eq(
        "functions of the slot (vendor:device)",
        want,
        slot_functions(h0, &name)?,
    );
    c.finish()?;
    let all_h0 = owners(&GPU1_VFS.iter().map(|&p| (p, 0)).collect::<Vec<_>>());
    check_world(f, &all_h0, "`pcifab bind` of three VFs together to h0")?;

    // Clean up: unbinding function 0 takes the whole device away.
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let (code, _, out) = pcifab_cmd(h0, &format!("unbind {}", list[0]))?;
    if code != 0 {
        return Err(format!(
            "{}: unbind {}: exit {code}: {}",
            h0.name,
            list[0],
            out.trim()
        ));
    }
    check_world(
        f,
        &owners(&[]),
        "function 0 unbound: the three VFs left together",
    )
}

/// `mrpc_dma` and `mrpc_dma_commands` of `h`.
fn dma_state(h: &mut Host) -> Result<(String, u64), String> {
    let on = sysfs(h, "mrpc_dma")?;
    let n = sysfs(h, "mrpc_dma_commands")?;
    let n = n
        .parse()
        .map_err(|e| format!("{}: mrpc_dma_commands {n:?}: {e}", h.name))?;
    Ok((on, n))
}

/// Commands complete through DMA MRPC while the firmware offers it; when a reset takes it
/// away in the middle of a run of commands, the mailbox takes over without losing or
/// corrupting one, and the driver uses DMA again once the firmware offers it again.
pub fn dma_mrpc(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    begin(h)?;
    let mut c = Checks::new(&format!("{}: DMA MRPC", h.name));
    selftest_json(h, "echo --count 50 --size 64", Duration::from_secs(120))?;
    let (on, n0) = dma_state(h)?;
    c.eq("mrpc_dma after 50 echoes", "1".to_string(), on);
    // Withdrawn while a long run of byte-checked echoes is going on.
    h.run_ok(
        "rm -f /tmp/echo.out /tmp/echo.rc; (pcifab-selftest echo --count 3000 --size 256 \
         >/tmp/echo.out 2>&1; echo $? >/tmp/echo.rc) >/dev/null 2>&1 &",
    )?;
    let t = std::time::Instant::now();
    while dma_state(h)?.1 < n0 + 200 {
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "{}: the echo run did not start within 60 s",
                h.name
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // A 20 ms firmware completion delay around the withdrawal, so a command is almost
    // surely in flight when it happens: that command completes in the mailbox only, and a
    // driver that reads its output from the DMA buffer returns an earlier command's bytes.
    emu.request("fault h0 completion-delay 20000")?;
    let busy_from = dma_state(h)?.1;
    let t = std::time::Instant::now();
    while dma_state(h)?.1 < busy_from + 3 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    emu.request("fault h0 dma-mrpc off")?;
    emu.request("fault h0 completion-delay 0")?;
    let off_at = dma_state(h)?.1;
    let rc = h.run_ok_timeout(
        "while [ ! -s /tmp/echo.rc ]; do sleep 0.2; done; cat /tmp/echo.rc",
        Duration::from_secs(300),
    )?;
    let out = h.run_ok("tail -3 /tmp/echo.out")?;
    c.eq(
        "echo run exit across the withdrawal",
        "0".to_string(),
        rc.trim().to_string(),
    );
    let (on, n1) = dma_state(h)?;
    c.eq("mrpc_dma after the withdrawal", "0".to_string(), on);
    if n1 > off_at + 1 {
        c.fail(format!(
            "mrpc_dma_commands grew from {off_at} to {n1} after the firmware withdrew DMA MRPC"
        ));
    }
    // Offered again: the driver arms it again at the next command.
    emu.request("fault h0 dma-mrpc on")?;
    selftest_json(h, "echo --count 50 --size 1024", Duration::from_secs(120))?;
    let (on, n2) = dma_state(h)?;
    c.eq("mrpc_dma once offered again", "1".to_string(), on);
    if n2 < n1 + 50 {
        c.fail(format!(
            "mrpc_dma_commands: expected at least {} after 50 more echoes, got {n2}",
            n1 + 50
        ));
    }
    if !out.contains("\"test\":") {
        c.fail(format!("echo run printed no result line: {}", out.trim()));
    }
    c.finish()
}
