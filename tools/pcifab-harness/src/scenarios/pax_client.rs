// SPDX-License-Identifier: GPL-2.0-only
//! The `pax client:` scenarios: the public PAX client, switchtec-user's CLI, runs its own
//! commands in the guests over the in-tree switchtec.ko against the emulator, under
//! either dialect (`pcifab-harness test --dialect`). What it prints is checked against
//! the fabric configuration and the emulator's control-socket view. The client must
//! never print an error. See Documentation/testing.rst, "PAX client".

use crate::checks::{ensure_pcifab, find_mep, module_loaded, wait_or_dmesg, SWITCHTEC_KO};
use crate::config::Expected;
use crate::fabric::{Fabric, Host};
use std::time::Duration;

/// Where the initramfs puts the client (`--switchtec-user`).
const CLIENT: &str = "/bin/switchtec";
const DEV: &str = "/dev/switchtec0";
/// What switchtec-user prints when something failed (switchtec_perror and the CLI's own
/// messages); none of it may appear.
const CLIENT_ERRORS: [&str; 8] = [
    "error",
    "Error",
    "Invalid",
    "invalid",
    "failed",
    "Unknown MRPC",
    "No such",
    "not supported",
];

/// Runs one client command; it must exit 0 and print no error. Returns its output.
fn client(h: &mut Host, args: &str) -> Result<String, String> {
    let cmd = format!("{CLIENT} {args} 2>&1");
    let o = h.run_timeout(&cmd, Duration::from_secs(60))?;
    if o.code != 0 {
        return Err(format!(
            "{}: `switchtec {args}` exited with {}: {}",
            h.name,
            o.code,
            o.out.trim_end()
        ));
    }
    if let Some(bad) = CLIENT_ERRORS.iter().find(|e| o.out.contains(*e)) {
        return Err(format!(
            "{}: `switchtec {args}` printed {bad:?}: {}",
            h.name,
            o.out.trim_end()
        ));
    }
    Ok(o.out)
}

fn expect_in(h: &Host, what: &str, out: &str, want: &str) -> Result<(), String> {
    if out.contains(want) {
        Ok(())
    } else {
        Err(format!(
            "{}: {what}: expected {want:?} in the output, got:\n{}",
            h.name,
            out.trim_end()
        ))
    }
}

/// Replaces pcifab with switchtec.ko and waits for its character device.
fn load_switchtec(h: &mut Host) -> Result<(), String> {
    if module_loaded(h, "pcifab")? {
        h.run_ok("rmmod pcifab")?;
    }
    if !module_loaded(h, "switchtec")? {
        h.run_ok(&format!("insmod {SWITCHTEC_KO}"))?;
    }
    wait_or_dmesg(
        h,
        &format!("[ -e {DEV} ]"),
        5,
        &format!("{DEV} did not appear after insmod switchtec"),
    )?;
    find_mep(h).map(|_| ())
}

/// Back to what later scenarios expect: pcifab loaded.
fn restore(f: &mut Fabric) {
    for h in &mut f.hosts {
        let _ = h.run("[ -d /sys/module/switchtec ] && rmmod switchtec");
        let _ = ensure_pcifab(h);
    }
}

fn have_client(f: &mut Fabric) -> Result<bool, String> {
    let h = &mut f.hosts[0];
    Ok(h.run(&format!("[ -x {CLIENT} ]"))?.code == 0)
}

/// The read-only commands on every host: list, info, status, test, topo-info and every
/// gfms-dump type (HVD and HVD_DETAIL for every host, EP_PORT for every endpoint).
fn identify_and_dump(h: &mut Host, e: &Expected) -> Result<(), String> {
    load_switchtec(h)?;
    let out = client(h, "list")?;
    expect_in(h, "switchtec list", &out, "switchtec0")?;
    expect_in(h, "switchtec list", &out, e.product_id.trim_end())?;
    let v = e.fw_version;
    // switchtec-user's version_to_string: "%x.%02x B%03X".
    let version = format!("{:x}.{:02x} B{:03X}", v >> 24, (v >> 16) & 0xff, v & 0xffff);
    // The pinned client (switchtec-user 4.0, tools/scripts/switchtec-user.sh) prints the
    // identity lines below; later versions add a firmware summary.
    let out = client(h, &format!("info {DEV}"))?;
    for want in [
        "Generation:  GEN4",
        "Variant:     PAX",
        &format!("Device ID:   0x{:04x}", e.device_id),
        &format!("FW Version:  {version}"),
    ] {
        expect_in(h, "switchtec info", &out, want)?;
    }
    let out = client(h, &format!("fw-info {DEV}"))?;
    expect_in(
        h,
        "switchtec fw-info",
        &out,
        &format!("IMG\tVersion: {version}"),
    )?;
    // MULTI_CFG: two configurations in the CFG partition, the first active.
    for want in ["Multi Config 0 - Active", "Multi Config 1"] {
        expect_in(h, "switchtec fw-info (MULTI_CFG)", &out, want)?;
    }
    let out = client(h, &format!("status {DEV}"))?;
    expect_in(
        h,
        "switchtec status",
        &out,
        &format!("Partition {}:    (LOCAL)", h.index),
    )?;
    let out = client(h, &format!("test {DEV}"))?;
    expect_in(h, "switchtec test (ECHO)", &out, "success")?;
    client(h, &format!("fabric topo-info {DEV}"))?;
    for t in ["FABRIC", "PAX_ALL", "PAX"] {
        client(h, &format!("fabric gfms-dump {DEV} -t {t}"))?;
    }
    for (i, _) in e.hosts.iter().enumerate() {
        let out = client(h, &format!("fabric gfms-dump {DEV} -t HVD -d {i}"))?;
        let port = host_port(h, e, i)?;
        expect_in(
            h,
            &format!("HVD {i}"),
            &out,
            &format!("HVD {i:x} (Physical Port ID: {port},"),
        )?;
        let out = client(h, &format!("fabric gfms-dump {DEV} -t HVD_DETAIL -d {i}"))?;
        expect_in(h, &format!("HVD_DETAIL {i} VEP type"), &out, "EP_MGMT")?;
        client(h, &format!("fabric gfms-dump {DEV} -t FAB_PORT -f {port}"))?;
    }
    for ep in &e.endpoints {
        let out = client(
            h,
            &format!("fabric gfms-dump {DEV} -t EP_PORT -e {}", ep.port),
        )?;
        expect_in(
            h,
            &format!("EP_PORT {}", ep.port),
            &out,
            &format!("0x{:04x}-0x{:04x}", ep.vendor_id, ep.device_id),
        )?;
    }
    Ok(())
}

/// log-dump and `-x` on every host.
pub fn log_and_other_pax(f: &mut Fabric) -> Result<(), String> {
    if !have_client(f)? {
        f.skip("no --switchtec-user given: the guests have no switchtec-user CLI");
        return Ok(());
    }
    let r = f.each_host(|h, _| {
        load_switchtec(h)?;
        log_dump(h)?;
        other_pax(h)
    });
    restore(f);
    r
}

/// `switchtec log-dump` of the app log in RAM (the default) and in flash: FWLOGRD read in
/// pages to its end, written after the client's 32-byte "SWMCLOGF" header as 32-byte
/// entries (the emulator keeps 40 in RAM, two pages, and 8 in flash).
fn log_dump(h: &mut Host) -> Result<(), String> {
    for (ty, entries) in [("RAM", 40), ("FLASH", 8)] {
        let file = format!("/tmp/pax-client-{ty}.log");
        let out = client(h, &format!("log-dump {DEV} {file} -t {ty}"))?;
        expect_in(
            h,
            &format!("switchtec log-dump -t {ty}"),
            &out,
            "Log saved to",
        )?;
        let size = h.run_ok(&format!("wc -c < {file}"))?;
        let want = 32 + 32 * entries;
        if size.trim() != want.to_string() {
            return Err(format!(
                "{}: switchtec log-dump -t {ty} wrote {} bytes, expected {want} (header and {entries} entries)",
                h.name,
                size.trim()
            ));
        }
        let magic = h.run_ok(&format!("head -c 8 {file}"))?;
        if magic.trim() != "SWMCLOGF" {
            return Err(format!(
                "{}: switchtec log-dump -t {ty}: the file starts with {magic:?}, not the log header SWMCLOGF",
                h.name
            ));
        }
        h.run_ok(&format!("rm -f {file}"))?;
    }
    Ok(())
}

/// `-x N` sends the command through this switch to PAX N: this fabric has one switch, so
/// PAX 1 is unreachable and refused (ERR_PARAM_INVALID, 0x64006); PAX 0 is this switch.
fn other_pax(h: &mut Host) -> Result<(), String> {
    let out = client(h, &format!("test -x 0 {DEV}"))?;
    expect_in(h, "switchtec test -x 0", &out, "success")?;
    for args in [
        format!("test -x 1 {DEV}"),
        format!("fabric gfms-dump {DEV} -t PAX -x 1"),
    ] {
        let o = h.run_timeout(&format!("{CLIENT} {args} 2>&1"), Duration::from_secs(60))?;
        if o.code == 0 || !o.out.contains("error: 0x64006") {
            return Err(format!(
                "{}: `switchtec {args}` (an unreachable PAX) exited with {} and printed {:?}; \
                 expected a failure with MRPC error 0x64006",
                h.name,
                o.code,
                o.out.trim_end()
            ));
        }
    }
    Ok(())
}

/// The USP physical port of host `i`, as the emulator serves it (PORT_CONFIG is not
/// needed: the harness config only names `usp_port`, default the index).
fn host_port(h: &Host, e: &Expected, i: usize) -> Result<u32, String> {
    e.usp_ports.get(i).copied().ok_or_else(|| {
        format!(
            "{}: host {i} is not in the configuration (harness bug)",
            h.name
        )
    })
}

pub fn dump_and_identify(f: &mut Fabric) -> Result<(), String> {
    if !have_client(f)? {
        f.skip("no --switchtec-user given: the guests have no switchtec-user CLI");
        return Ok(());
    }
    let r = f
        .each_host(identify_and_dump)
        .and_then(|()| dma_mrpc_used(f));
    restore(f);
    r
}

/// With `dma_mrpc` on (the default), switchtec.ko takes its results from the DMA buffer:
/// the emulator must have completed commands of every host through it.
fn dma_mrpc_used(f: &Fabric) -> Result<(), String> {
    if !f.expected.dma_mrpc {
        return Ok(());
    }
    let Some(path) = &f.emu_log else {
        return Ok(());
    };
    let log = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    for h in &f.hosts {
        let want = format!("{}: MSI-X vector 1 fired (DMA MRPC completion)", h.name);
        if !log.contains(&want) {
            return Err(format!(
                "{} (dialect {}): switchtec.ko did not use DMA MRPC: no {want:?} in {}",
                h.name,
                f.dialect().name(),
                path.display()
            ));
        }
    }
    Ok(())
}

/// PDFIDs of the functions the emulator's `state` shows bound to `host`.
fn bound_to(f: &Fabric, host: &str) -> Result<Vec<u64>, String> {
    let s = f.emu().request("state")?;
    let b = s["bindings"]
        .as_array()
        .ok_or("emulator state has no bindings array")?;
    Ok(b.iter()
        .filter(|x| x["owner"] == host)
        .filter_map(|x| x["pdfid"].as_u64())
        .collect())
}

/// Functions of `vendor:device` the guest sees on the PCI bus, as (bdf) lines.
fn guest_functions(h: &mut Host, vendor: u32, device: u32) -> Result<Vec<String>, String> {
    let out = h.run_ok(&format!(
        r#"for d in /sys/bus/pci/devices/*; do
  read -r v <$d/vendor && read -r dv <$d/device || continue
  if [ "$v" = 0x{vendor:04x} ] && [ "$dv" = 0x{device:04x} ]; then echo "${{d##*/}}"; fi
done"#
    ))?;
    Ok(out.split_whitespace().map(str::to_string).collect())
}

fn wait_functions(h: &mut Host, vendor: u32, device: u32, n: usize) -> Result<Vec<String>, String> {
    let mut last = Vec::new();
    for _ in 0..300 {
        last = guest_functions(h, vendor, device)?;
        if last.len() == n {
            return Ok(last);
        }
        h.run("sleep 0.1")?;
    }
    Err(format!(
        "{}: expected {n} functions {vendor:04x}:{device:04x} within 30 s, got {last:?}",
        h.name
    ))
}

/// gfms-bind of two VFs of the last endpoint to the last host's logical port 0 as one
/// multi-function device, from the manager host, then gfms-unbind as the client sends
/// it (host port and logical port only).
pub fn bind_unbind(f: &mut Fabric) -> Result<(), String> {
    if !have_client(f)? {
        f.skip("no --switchtec-user given: the guests have no switchtec-user CLI");
        return Ok(());
    }
    if f.hosts.len() < 2 || f.expected.endpoints.is_empty() {
        return Err("the pax client bind scenario needs two hosts and an endpoint".into());
    }
    let r = bind_unbind_inner(f);
    restore(f);
    r
}

fn bind_unbind_inner(f: &mut Fabric) -> Result<(), String> {
    let e = f.expected.clone();
    let mgr = (0..f.hosts.len())
        .find(|&i| e.is_manager(i))
        .ok_or("no manager host in the configuration")?;
    let target = if mgr == f.hosts.len() - 1 {
        0
    } else {
        f.hosts.len() - 1
    };
    let ep = e
        .endpoints
        .iter()
        .rev()
        .find(|x| x.vfs >= 2)
        .ok_or("the pax client bind scenario needs an endpoint with two VFs")?;
    let (a, b) = (ep.pdfid(1), ep.pdfid(2));
    let tname = e.hosts[target].clone();
    let tport = e.usp_ports[target];
    if !bound_to(f, &tname)?.is_empty() {
        return Err(format!(
            "{tname} already holds functions before the scenario: {:?}",
            bound_to(f, &tname)?
        ));
    }
    load_switchtec(&mut f.hosts[mgr])?;
    {
        let h = &mut f.hosts[mgr];
        client(
            h,
            &format!("fabric gfms-bind {DEV} -s 0 -p {tport} -l 0 -f {a:#x},{b:#x}"),
        )?;
    }
    let mut got = bound_to(f, &tname)?;
    got.sort_unstable();
    if got != [u64::from(a), u64::from(b)] {
        return Err(format!(
            "after gfms-bind of {a:#06x},{b:#06x} to {tname}: the emulator shows {got:?} bound there"
        ));
    }
    // The target sees one device with two functions in one slot.
    let fns = wait_functions(&mut f.hosts[target], ep.vendor_id, ep.vf_device_id, 2)?;
    let slot = |bdf: &str| bdf.rsplit_once('.').map(|x| x.0.to_string());
    if slot(&fns[0]) != slot(&fns[1]) || !fns.iter().any(|x| x.ends_with(".0")) {
        return Err(format!(
            "{tname}: expected functions 0 and 1 of one device, got {fns:?}"
        ));
    }
    {
        let h = &mut f.hosts[mgr];
        let out = client(h, &format!("fabric gfms-dump {DEV} -t HVD -d {target}"))?;
        for (j, p) in [(0, a), (1, b)] {
            expect_in(
                h,
                "HVD after bind",
                &out,
                &format!("Function {j}:    \tPDFID 0x{p:04x}"),
            )?;
        }
        let out = client(
            h,
            &format!("fabric gfms-dump {DEV} -t EP_PORT -e {}", ep.port),
        )?;
        expect_in(
            h,
            "EP_PORT after bind",
            &out,
            &format!("HVD Physical PID: {tport}, HVD Logical PID: 0"),
        )?;
        client(h, &format!("fabric gfms-unbind {DEV} -s 0 -p {tport} -l 0"))?;
    }
    let left = bound_to(f, &tname)?;
    if !left.is_empty() {
        return Err(format!(
            "after gfms-unbind of {tname} logical port 0 the emulator still shows {left:?}"
        ));
    }
    wait_functions(&mut f.hosts[target], ep.vendor_id, ep.vf_device_id, 0)?;
    let out = client(
        &mut f.hosts[mgr],
        &format!("fabric gfms-dump {DEV} -t HVD -d {target}"),
    )?;
    expect_in(
        &f.hosts[mgr],
        "HVD after unbind",
        &out,
        "Logical PID 0:\t\tUnbound",
    )
}
