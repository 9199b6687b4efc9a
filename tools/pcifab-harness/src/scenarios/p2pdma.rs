// SPDX-License-Identifier: GPL-2.0-only
//! Linux's own PCI peer-to-peer DMA between two fabric drives
//! (tools/pcifab-harness/fabric-p2pdma.toml): both bound to one host with `pcifab bind`,
//! the nvme driver publishes the controller memory buffer (CMB) of one as p2pmem, and an
//! `O_DIRECT` read from the other lands in a mapping of that p2pmem. In the host with the
//! IOMMU off (h1) Linux maps the pair by bus address and the data must verify in the CMB;
//! in the host with the IOMMU on (h0) Linux refuses the pair (ACS redirection on the
//! switch's downstream ports sends the path through q35's host bridge, which is not on
//! the P2PDMA whitelist) and the read must fail with EINVAL and those kernel messages.
//!
//! What carries the bytes: both drives are QEMU's own nvme devices in the bound host's QEMU
//! (Documentation/emulator.rst, "NVMe endpoints"), so the drive's DMA to the sibling's CMB
//! BAR is routed by QEMU's memory API to that device's CMB, never through guest RAM; the
//! emulator mediates only the binds. That the data did not pass through the CPU is what
//! `O_DIRECT` into p2pmem pages means: the block layer only accepts those pages from a
//! queue that does PCI P2PDMA, the nvme driver maps them with `pci_p2pdma_map_type()`, and
//! a refused pair fails the read instead of copying.

use std::time::Duration;

use serde_json::Value;

use crate::checks::{begin, check_bindings, dmesg_clean, free_all, pcifab_ok, selftest_ok, Owners};
use crate::fabric::{Fabric, Host};

const CMD: Duration = Duration::from_secs(180);
/// Seed of the pattern written to the data drive.
const SEED: u64 = 0x0002_9d3a;
/// Blocks of 4 KiB written and read back (1 MiB: 16 reads of 64 KiB).
const BLOCKS: u64 = 256;

/// (CMB drive's PDFID, data drive's PDFID): the first nvme endpoint with a CMB, and
/// another nvme endpoint.
fn drives(f: &Fabric) -> Result<(u16, u16), String> {
    let nv: Vec<_> = f
        .expected
        .endpoints
        .iter()
        .filter(|e| e.kind == "nvme")
        .collect();
    let cmb = nv.iter().find(|e| e.cmb_mib > 0);
    let data = nv.iter().find(|e| e.cmb_mib == 0);
    match (cmb, data) {
        (Some(c), Some(d)) => Ok((c.pdfid(0), d.pdfid(0))),
        _ => Err(
            "the fabric configuration needs two nvme endpoints, one with cmb_mib and one \
             without; run the p2pdma scenarios with --emu-config \
             tools/pcifab-harness/fabric-p2pdma.toml (make test-p2pdma)"
                .into(),
        ),
    }
}

/// `pcifab bind PDFID --host I` in `h`: the one /dev/nvme* block device it reports.
fn bind(h: &mut Host, pdfid: u16) -> Result<String, String> {
    let what = format!("bind {pdfid:#06x} --host {}", h.index);
    let v = pcifab_ok(h, &what)?;
    super::nvme::reported_block_device(h, &what, &v)
}

/// The PCI function (BDF) under block device `dev`.
fn bdf_of(h: &mut Host, dev: &str) -> Result<String, String> {
    let name = dev.trim_start_matches("/dev/");
    let p = h.run_ok(&format!("readlink -f /sys/block/{name}/device/device"))?;
    let bdf = p.trim().rsplit('/').next().unwrap_or("").to_string();
    if bdf.len() != 12 || !bdf.starts_with("0000:") {
        return Err(format!(
            "{}: {dev} is not on a PCI function ({})",
            h.name,
            p.trim()
        ));
    }
    Ok(bdf)
}

/// `p2pmem/NAME` of `bdf` as a number.
fn p2pmem(h: &mut Host, bdf: &str, name: &str) -> Result<u64, String> {
    let path = format!("/sys/bus/pci/devices/{bdf}/p2pmem/{name}");
    let o = h.run(&format!("cat {path}"))?;
    if o.code != 0 {
        let log = h.run("dmesg | grep -iE 'nvme|p2p|cmb' | tail -n 20")?.out;
        return Err(format!(
            "{}: {path} cannot be read (Linux did not register the CMB of {bdf} as p2pmem): {}; dmesg:\n{}",
            h.name,
            o.out.trim(),
            log.trim_end()
        ));
    }
    o.out
        .trim()
        .parse()
        .map_err(|_| format!("{}: {path} holds {:?}", h.name, o.out.trim()))
}

/// The two drives bound to host `hi`, the CMB published, 1 MiB written to the data drive,
/// then read back with `O_DIRECT` into the p2pmem mapping and verified there.
fn read_into_cmb(f: &mut Fabric, hi: usize) -> Result<(), String> {
    let (cmb_pdfid, data_pdfid) = drives(f)?;
    f.each_host(|h, _| begin(h))?;
    let emu = f.emu();
    let e = f.expected.clone();
    free_all(&emu, &e, "setting up (both drives free)")?;
    let h = &mut f.hosts[hi];
    let iommu = if crate::fabric::iommu_host(hi) {
        "on"
    } else {
        "off"
    };
    let cmb_dev = bind(h, cmb_pdfid)?;
    let data_dev = bind(h, data_pdfid)?;
    let cmb_bdf = bdf_of(h, &cmb_dev)?;
    let data_bdf = bdf_of(h, &data_dev)?;
    let published = p2pmem(h, &cmb_bdf, "published")?;
    let size = p2pmem(h, &cmb_bdf, "size")?;
    let available = p2pmem(h, &cmb_bdf, "available")?;
    // The nvme driver keeps part of the CMB for its own submission queues (CMBSZ.SQS,
    // `use_cmb_sqes`); the reader maps 64 KiB of the rest.
    if published != 1 || size == 0 || available < 65536 || available > size {
        return Err(format!(
            "{}: the CMB of {cmb_bdf}: p2pmem published {published}, size {size}, available \
             {available}; expected published 1, a non-zero size and at least 64 KiB of it \
             available",
            h.name
        ));
    }
    let on = crate::fabric::iommu_host(hi);
    selftest_ok(
        h,
        &format!("blk-write --dev {data_dev} --seed {SEED} --blocks {BLOCKS}"),
        CMD,
    )?;
    let p2p_read = format!(
        "pcifab-selftest blk-verify --dev {data_dev} --seed {SEED} --blocks {BLOCKS} \
         --p2pmem /sys/bus/pci/devices/{cmb_bdf}/p2pmem/allocate 2>&1"
    );
    let t = std::time::Instant::now();
    let o = h.run_timeout(&p2p_read, CMD)?;
    let secs = t.elapsed().as_secs_f64();
    let log = h.run_ok("dmesg")?;
    let refused = format!(
        "nvme {data_bdf}: cannot be used for peer-to-peer DMA as the client and provider \
         ({cmb_bdf}) do not share an upstream bridge or whitelisted host bridge"
    );
    let acs =
        format!("nvme {data_bdf}: ACS redirect is set between the client and provider ({cmb_bdf})");
    let outcome = if on {
        // With the IOMMU on, Linux enables ACS redirection on the switch's downstream
        // ports, so the path goes up through the host bridge, and q35's (8086:29c0) is
        // not on the P2PDMA whitelist: the pair is refused when the read is mapped, and
        // the request fails with BLK_STS_INVAL (EINVAL), nothing copied instead.
        let failed = o.code != 0 && o.out.contains("failed: EINVAL");
        if !failed || !log.contains(&acs) || !log.contains(&refused) {
            return Err(format!(
                "h{hi} (IOMMU on): expected Linux to refuse {data_bdf} -> CMB of {cmb_bdf} \
                 (the read failing with EINVAL, dmesg saying {acs:?} and {refused:?}); the \
                 read exited {}: {}; dmesg:\n{}",
                o.code,
                o.out.trim(),
                log.lines()
                    .filter(|l| l.contains("nvme") || l.contains("P2PDMA"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
        // The drive itself is fine: the same read into ordinary memory verifies.
        let v = selftest_ok(
            h,
            &format!("blk-verify --dev {data_dev} --seed {SEED} --blocks {BLOCKS}"),
            CMD,
        )?;
        if v.get("good").and_then(Value::as_u64) != Some(BLOCKS) {
            return Err(format!(
                "{}: expected {BLOCKS} good blocks read into RAM, got {v}",
                h.name
            ));
        }
        format!("Linux refused the pair (ACS redirect, host bridge not whitelisted; EINVAL in {secs:.2} s)")
    } else {
        let line = o
            .out
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or("");
        let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        if o.code != 0 || v.get("good").and_then(Value::as_u64) != Some(BLOCKS) {
            return Err(format!(
                "h{hi} (IOMMU off): O_DIRECT read of {data_dev} ({data_bdf}) into the CMB of \
                 {cmb_bdf} (p2pmem, {size} bytes): expected {BLOCKS} good blocks, exit {}: {}",
                o.code,
                o.out.trim()
            ));
        }
        if log.contains(&refused) || log.contains(&acs) {
            return Err(format!(
                "h{hi} (IOMMU off): the read verified but dmesg says Linux refused the pair"
            ));
        }
        format!("{BLOCKS} blocks read O_DIRECT from {data_bdf} into it and verified in {secs:.2} s")
    };
    // pcifab's own view of the pair (PCIFAB_IOCTL_P2P_DISTANCE): the kernel's
    // pci_p2pdma_distance() and whether a downstream port redirects peer requests. Asked
    // after the read: the kernel computes a pair's verdict once and caches it, and only
    // the first computation from the DMA mapping logs why it refused.
    let d = pcifab_ok(
        h,
        &format!("p2p distance {cmb_pdfid:#06x} {data_pdfid:#06x}"),
    )?;
    let pci_distance = d.get("pci_distance").and_then(Value::as_i64);
    let flags: Vec<&str> = d
        .get("flags")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let local = flags.contains(&"a_local") && flags.contains(&"b_local");
    let agrees = if on {
        pci_distance == Some(-1) && flags.contains(&"acs_redirect")
    } else {
        pci_distance.is_some_and(|x| x > 0) && !flags.contains(&"acs_redirect")
    };
    if d.get("path").and_then(Value::as_str) != Some("switch") || !local || !agrees {
        return Err(format!(
            "h{hi} (IOMMU {iommu}): `pcifab p2p distance {cmb_pdfid:#06x} {data_pdfid:#06x}`: \
             expected path switch, both local, {}; got {d}",
            if on {
                "pci_distance -1 and acs_redirect"
            } else {
                "a positive pci_distance and no acs_redirect"
            }
        ));
    }
    // The mapping is gone with the process: what was free before is free again.
    let after = p2pmem(h, &cmb_bdf, "available")?;
    if after != available {
        return Err(format!(
            "{}: p2pmem of {cmb_bdf}: {after} bytes available after the reader exited, \
             {available} before",
            h.name
        ));
    }
    dmesg_clean(h)?;
    crate::say(&format!(
        "# p2pdma: h{hi} (IOMMU {iommu}): {cmb_bdf} published {size} bytes of CMB as p2pmem \
         ({available} available); pcifab p2p distance: pci_distance {}; {outcome}",
        pci_distance.unwrap_or(-1)
    ));
    pcifab_ok(h, &format!("unbind {data_pdfid:#06x}"))?;
    pcifab_ok(h, &format!("unbind {cmb_pdfid:#06x}"))?;
    check_bindings(f, &Owners::new(), "both drives unbound")?;
    Ok(())
}

pub fn iommu_on(f: &mut Fabric) -> Result<(), String> {
    read_into_cmb(f, 0)
}

pub fn iommu_off(f: &mut Fabric) -> Result<(), String> {
    if f.hosts.len() < 2 {
        return Err("needs two hosts (h1 boots with the IOMMU off)".into());
    }
    read_into_cmb(f, 1)
}

/// One narrated step of [`demo`]: what it shows, the command, then its output line by line.
fn demo_step(h: &mut Host, what: &str, cmd: &str) -> Result<String, String> {
    crate::say(&format!("--- {what} (on {}: {cmd})", h.name));
    let out = h.run_ok_timeout(cmd, CMD)?;
    for l in out.trim_end().lines() {
        crate::say(&format!("{}: {l}", h.name));
    }
    Ok(out)
}

/// `make demo`'s P2PDMA part (fabric-p2pdma.toml): host 1, which boots without an IOMMU,
/// takes both drives; Linux's nvme driver publishes the CMB of one as p2pmem, and an
/// `O_DIRECT` read from the other lands in it with no CPU copy, every block verified where
/// it landed. The same checks as the IOMMU-off scenario, told step by step; the host with
/// the IOMMU on, where Linux refuses the pair, is left to the scenarios.
pub fn demo(f: &mut Fabric) -> Result<(), String> {
    let (cmb_pdfid, data_pdfid) = drives(f)?;
    if f.hosts.len() < 2 || crate::fabric::iommu_host(1) {
        return Err("the P2PDMA demo needs host 1, which boots with the IOMMU off".into());
    }
    let seed = 0xd4_0000 + u64::from(std::process::id() & 0xffff);
    let h = &mut f.hosts[1];
    demo_step(h, "the fabric, as host 1 sees it", "pcifab list")?;
    let mut devs = Vec::new();
    for (pdfid, what) in [
        (cmb_pdfid, "the drive with a controller memory buffer (CMB)"),
        (data_pdfid, "the data drive"),
    ] {
        let cmd = format!("bind {pdfid:#06x} --host 1");
        let out = demo_step(
            h,
            &format!("host 1 takes {what}"),
            &format!("pcifab --json {cmd}"),
        )?;
        let v: Value = out
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| format!("{}: `pcifab --json {cmd}` printed no JSON: {out}", h.name))?;
        devs.push(super::nvme::reported_block_device(h, &cmd, &v)?);
    }
    let (cmb_dev, data_dev) = (devs[0].clone(), devs[1].clone());
    let cmb_bdf = bdf_of(h, &cmb_dev)?;
    let p2p = format!("/sys/bus/pci/devices/{cmb_bdf}/p2pmem");
    demo_step(
        h,
        &format!("Linux's nvme driver published the CMB of {cmb_dev} ({cmb_bdf}) as p2pmem"),
        &format!("for a in published size available; do echo \"$a $(cat {p2p}/$a)\"; done"),
    )?;
    if p2pmem(h, &cmb_bdf, "published")? != 1 || p2pmem(h, &cmb_bdf, "available")? < 65536 {
        return Err(format!(
            "{}: {p2p} is not published with at least 64 KiB available",
            h.name
        ));
    }
    demo_step(
        h,
        &format!("host 1 writes a seeded pattern to {data_dev} (1 MiB, direct I/O)"),
        &format!("pcifab-selftest blk-write --dev {data_dev} --seed {seed} --blocks {BLOCKS}"),
    )?;
    let out = demo_step(
        h,
        &format!(
            "the drive reads it back with O_DIRECT into 64 KiB of {cmb_dev}'s CMB: the data \
             goes from drive to drive through the switch, not through host memory or a CPU; \
             each block is verified in the CMB"
        ),
        &format!(
            "pcifab-selftest blk-verify --dev {data_dev} --seed {seed} --blocks {BLOCKS} \
             --p2pmem {p2p}/allocate"
        ),
    )?;
    let good = out
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v.get("good").and_then(Value::as_u64));
    if good != Some(BLOCKS) {
        return Err(format!(
            "{}: expected {BLOCKS} good blocks read into the CMB, got {out}",
            h.name
        ));
    }
    demo_step(
        h,
        "the kernel's own verdict on the pair (pci_p2pdma_distance)",
        &format!("pcifab p2p distance {cmb_pdfid:#06x} {data_pdfid:#06x}"),
    )?;
    demo_step(
        h,
        "host 1 gives both drives back",
        &format!("pcifab unbind {data_pdfid:#06x} && pcifab unbind {cmb_pdfid:#06x}"),
    )?;
    crate::say(
        "--- (host 0 boots with the IOMMU on: there the kernel sets ACS redirection on the \
         switch's downstream ports and refuses this pair; `make test-p2pdma` shows both)",
    );
    Ok(())
}
