// SPDX-License-Identifier: GPL-2.0-only
//! This host's side of composition, where it meets the PCI core and pciehp: the MEP removed
//! (under the PCI rescan/remove lock) while a function's graceful removal is under way, the
//! graceful removal through the slot's hot-plug driver from the sysfs `unbind` file and for an
//! administrator without `CAP_DAC_OVERRIDE`, and the downstream ports' ACS (with a function
//! passed through with vfio-pci) left as the kernel set it when pcifab loads. See
//! `Documentation/testing.rst` and `Documentation/design.rst` ("Graceful removal", "Hot-plug
//! and the rescan lock", "P2P and ACS").

use std::time::{Duration, Instant};

use crate::checks::{
    bind_here, check_bound_pcifab, check_world, compose_begin, dmesg_clean, driver_of, find_mep,
    pcifab_ok, wait_for, Checks, Owners, PCIFAB_KO,
};
use crate::config::{Dialect, Expected};
use crate::fabric::{iommu_host, EmuControl, Fabric, Host};

use super::compose_trust::{dsp_acs, free_in_emu, no_hang, wait_bg, ACS_CR, ACS_RR};

/// `removal_delay_ms` of the MEP-removal scenario: how long an admitted removal waits before
/// it asks pciehp. A removal of the MEP that waited for it ends after the delay does, which
/// the guest's kernel log shows even where it would not hang; the delay is long enough that
/// a correct removal on a loaded sanitizer kernel (up to 6.3 s seen) ends well before.
const REMOVAL_DELAY_MS: u32 = 20_000;
/// Kernel log line the harness writes (`/dev/kmsg`) once the MEP's removal has returned.
const MEP_REMOVED_MARK: &str = "pcifab-harness: removal of the MEP returned";
/// Kernel log line of pcifab's fallback (device removed, slot left on).
const FALLBACK: &str = "removing the device only";
/// Kernel log line of `removal_delay_ms` holding a removal.
const DELAYED: &str = "removal delayed by";

/// How the function's removal is started.
#[derive(Clone, Copy, Debug)]
enum RemovalBy {
    /// `echo PDFID > /sys/class/misc/pcifab0/unbind` (kernfs waits for the writer when the
    /// MEP's attributes go).
    SysfsUnbind,
    /// The manager unbinds the function (the emulator's control socket): the firmware sends
    /// h0 `UNBIND_REQUEST` and the fabric-event work removes the function (which the MEP's
    /// removal flushes). Extended dialect only.
    UnbindRequest,
}

/// Reloads pcifab in `h` with `params`.
fn reload(h: &mut Host, params: &str) -> Result<(), String> {
    h.run_ok(&format!(
        "[ -d /sys/module/pcifab ] && rmmod pcifab; insmod {PCIFAB_KO} {params}"
    ))?;
    check_bound_pcifab(h)
}

/// The hot-plug slot whose `address` is that of `bdf` (its name without `.F`).
fn slot_of(h: &mut Host, bdf: &str) -> Result<String, String> {
    let addr = bdf.rsplit_once('.').map_or(bdf, |(a, _)| a);
    let slot = h.run_ok(&format!(
        "for s in /sys/bus/pci/slots/*; do \
         [ \"$(cat $s/address 2>/dev/null)\" = {addr} ] && echo ${{s##*/}}; done; true"
    ))?;
    let slot = slot.trim().to_string();
    if slot.is_empty() || slot.contains('\n') {
        return Err(format!(
            "{}: expected one hot-plug slot with address {addr} (the port of {bdf}), got {slot:?}",
            h.name
        ));
    }
    Ok(slot)
}

/// One round: `p` is bound to h0; its removal is started `by` and held by `removal_delay_ms`
/// after its admission; meanwhile the MEP is removed from the PCI bus (pcifab's remove runs
/// under the rescan/remove lock, which pciehp's removal of the function needs). The MEP must
/// be gone before the delay is over (by the kernel log's clock: the line of the delay and a
/// line the harness writes once the removal returned), a sysfs writer must get ENODEV, the
/// function must
/// still leave h0 (its removal finishes once the lock is free), no task may hang, and pcifab
/// must work on the MEP again after a rescan.
fn mep_removed_round(
    h0: &mut Host,
    emu: &EmuControl,
    e: &Expected,
    p: u16,
    by: RemovalBy,
) -> Result<(), String> {
    let mep = find_mep(h0)?;
    let bdf = bind_here(h0, e, p)?;
    h0.run_ok("dmesg -c >/dev/null")?;
    let manager = match by {
        RemovalBy::SysfsUnbind => {
            h0.run_ok(&format!(
                "rm -f /tmp/ru.out /tmp/ru.rc; \
                 ((echo {p:#06x} > /sys/class/misc/pcifab0/unbind) >/tmp/ru.out 2>&1; \
                 echo $? >/tmp/ru.rc) </dev/null >/dev/null 2>&1 &"
            ))?;
            None
        }
        RemovalBy::UnbindRequest => {
            let emu = emu.clone();
            Some(std::thread::spawn(move || {
                emu.request(&format!("unbind {p:#06x}"))
            }))
        }
    };
    if !wait_for(h0, &format!("dmesg | grep -q '{DELAYED}'"), 20)? {
        let log = h0
            .run("dmesg | tail -n 20; cat /tmp/ru.out 2>/dev/null")?
            .out;
        return Err(format!(
            "h0: the removal of {p:#06x} ({by:?}) never reached the hot-plug step within 20 s \
             (no '{DELAYED}' in dmesg):\n{}",
            log.trim_end()
        ));
    }
    let t = Instant::now();
    let o = h0.run_timeout(
        &format!(
            "echo 1 > /sys/bus/pci/devices/{mep}/remove; rc=$?; \
             echo '{MEP_REMOVED_MARK}' >/dev/kmsg; exit $rc"
        ),
        Duration::from_secs(60),
    )?;
    let secs = t.elapsed().as_secs_f64();
    h0.log_note(&format!(
        "MEP removed during a held removal ({by:?}): exit {} after {secs:.2} s",
        o.code
    ));
    let mut c = Checks::new(&format!(
        "h0: MEP removed while the removal of {p:#06x} ({by:?}) waits for pciehp"
    ));
    c.eq("exit code of the MEP's removal", 0, o.code);
    // The kernel log's clock when the removal was held, and when the MEP's removal returned:
    // a removal that waited for the held one returns after the delay is over.
    let log = h0.run_ok("dmesg")?;
    let held = log_stamp(&log, DELAYED);
    let removed = log_stamp(&log, MEP_REMOVED_MARK);
    let delay = f64::from(REMOVAL_DELAY_MS) / 1000.0;
    match (held, removed) {
        (Some(h), Some(r)) if r - h < delay => h0.log_note(&format!(
            "the MEP's removal returned {:.2} s after the removal was held ({delay} s)",
            r - h
        )),
        (Some(h), Some(r)) => c.fail(format!(
            "removing the MEP returned {:.2} s after the function's removal was held, not \
             before its {delay} s delay was over: it waited for the function's removal \
             ({secs:.1} s from the harness)",
            r - h
        )),
        (h, r) => c.fail(format!(
            "the kernel log lacks the line of the held removal ({h:?}) or of the MEP's \
             removal returning ({r:?}): cannot tell whether the removal waited"
        )),
    }
    if let RemovalBy::SysfsUnbind = by {
        match wait_bg(h0, "ru", 10)? {
            None => {
                c.fail("the write of `unbind` was still running 10 s after the MEP went".into())
            }
            Some((rc, out)) => {
                if rc == 0 || !out.contains("No such device") {
                    c.fail(format!(
                        "the write of `unbind`: expected it to fail with ENODEV (\"No such \
                         device\") once the MEP went, got exit {rc}: {}",
                        out.trim()
                    ));
                }
            }
        }
    }
    // The held removal goes on after the delay and takes the function out of h0.
    let gone_within = REMOVAL_DELAY_MS / 1000 + 20;
    if !wait_for(
        h0,
        &format!("[ ! -e /sys/bus/pci/devices/{bdf} ]"),
        gone_within,
    )? {
        c.fail(format!(
            "{bdf} ({p:#06x}) was still in h0 {gone_within} s after the MEP's removal: the \
             function's removal did not finish"
        ));
    }
    if let Some(m) = manager {
        match m.join() {
            Ok(r) => h0.log_note(&format!("the manager's unbind of {p:#06x}: {r:?}")),
            Err(_) => c.fail("the thread of the manager's unbind panicked".into()),
        }
    }
    if let Err(err) = no_hang(h0) {
        c.fail(err);
    }
    let back = h0
        .run_ok("echo 1 > /sys/bus/pci/rescan")
        .map_err(|e| format!("rescanning the PCI bus: {e}"))
        .and_then(|_| check_bound_pcifab(h0))
        .and_then(|()| {
            h0.run_ok("pcifab mrpc 0x41 00")
                .map(|_| ())
                .map_err(|e| format!("an echo after the rescan: {e}"))
        });
    if let Err(err) = back {
        c.fail(err);
    }
    if let Err(err) = no_hang(h0) {
        c.fail(format!("after bringing the MEP back: {err}"));
    }
    c.finish()
}

/// The kernel log's time stamp (seconds) of the first line of `log` that contains `what`.
fn log_stamp(log: &str, what: &str) -> Option<f64> {
    let line = log.lines().find(|l| l.contains(what))?;
    let (stamp, _) = line.strip_prefix('[')?.split_once(']')?;
    stamp.trim().parse().ok()
}

/// (a) The MEP is removed (`echo 1 > .../remove`, under the rescan/remove lock) while a
/// function's graceful removal is admitted and held before pciehp (`removal_delay_ms`): the
/// removal started by a write of the sysfs `unbind` file, and (extended dialect) by the
/// firmware's `UNBIND_REQUEST` in the fabric-event work. Neither may hold up the MEP's removal.
pub fn mep_removed_during_removal(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let p: u16 = 0x0300;
    let mut rounds = vec![RemovalBy::SysfsUnbind];
    match f.dialect() {
        Dialect::Extended => rounds.push(RemovalBy::UnbindRequest),
        Dialect::Pax => f.hosts[0].log_note(
            "pax dialect: no UNBIND_REQUEST event, so only the sysfs `unbind` round runs",
        ),
    }
    let mut r = reload(
        &mut f.hosts[0],
        &format!("removal_delay_ms={REMOVAL_DELAY_MS}"),
    );
    for by in rounds {
        if r.is_err() {
            break;
        }
        r = mep_removed_round(&mut f.hosts[0], &emu, &e, p, by);
        // The firmware was never asked (the MEP went first): free it as the manager would.
        if r.is_ok() {
            r = free_in_emu(&emu, f, p);
        }
    }
    let back = reload(&mut f.hosts[0], "");
    let freed = free_in_emu(&emu, f, p);
    r?;
    back?;
    freed?;
    check_world(
        f,
        &Owners::new(),
        "the MEP removed during functions' removals, and back",
    )
}

/// The slot's `power` reads 0 (the hot-plug driver turned it off) and pcifab did not fall
/// back to removing the device only.
fn graceful(h: &mut Host, slot: &str, c: &mut Checks, what: &str) -> Result<(), String> {
    let power = h.run_ok(&format!("cat /sys/bus/pci/slots/{slot}/power"))?;
    c.eq(
        &format!("{what}: slot {slot} power after the unbind"),
        "0",
        power.trim(),
    );
    let fallback = h.run(&format!("dmesg | grep '{FALLBACK}'"))?;
    if fallback.code == 0 {
        c.fail(format!(
            "{what}: pcifab fell back to removing the device only: {}",
            fallback.out.trim()
        ));
    }
    Ok(())
}

/// (b) h0 binds GPU0 and unbinds it through the sysfs `unbind` file (on the sanitizer kernel
/// a removal that opened the slot's sysfs `power` file inside that write was a recursive
/// `sb_writers` for lockdep); then binds it again and unbinds it with `pcifab unbind` run as
/// uid 65534 holding only `CAP_SYS_ADMIN` (no `CAP_DAC_OVERRIDE`: opening the root-owned
/// `power` file as the caller failed). Each time the slot must be powered off by its hot-plug
/// driver, with no fallback and a clean dmesg.
pub fn unbind_graceful(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let e = f.expected.clone();
    let p: u16 = 0x0300;
    let h0 = &mut f.hosts[0];
    h0.run_ok("dmesg -c >/dev/null")?;
    let mut c = Checks::new("h0: graceful unbinds");
    let bdf = bind_here(h0, &e, p)?;
    let slot = slot_of(h0, &bdf)?;
    let o = h0.run(&format!("echo {p:#06x} > /sys/class/misc/pcifab0/unbind"))?;
    c.eq("exit code of the write of sysfs `unbind`", 0, o.code);
    graceful(h0, &slot, &mut c, "sysfs unbind")?;
    if let Err(err) = dmesg_clean(h0) {
        c.fail(format!("after the sysfs unbind: {err}"));
    }
    let bdf = bind_here(h0, &e, p)?;
    let slot = slot_of(h0, &bdf)?;
    h0.run_ok("chmod 666 /dev/pcifab0")?;
    let o = h0.run(&format!(
        "pcifab-selftest as-admin pcifab unbind {p:#06x} --json"
    ));
    let restore = h0.run_ok("chmod 600 /dev/pcifab0");
    let o = o?;
    restore?;
    h0.log_note(&format!(
        "unbind as uid 65534 with CAP_SYS_ADMIN only: exit {}: {}",
        o.code,
        o.out.trim()
    ));
    c.eq(
        "exit code of `pcifab unbind` as uid 65534 with CAP_SYS_ADMIN only",
        0,
        o.code,
    );
    graceful(h0, &slot, &mut c, "unbind without CAP_DAC_OVERRIDE")?;
    if let Err(err) = dmesg_clean(h0) {
        c.fail(err);
    }
    c.finish()?;
    check_world(f, &Owners::new(), "two graceful unbinds")
}

/// The IOMMU group of `bdf` and the devices in it.
fn iommu_group(h: &mut Host, bdf: &str) -> Result<(String, Vec<String>), String> {
    let g = h.run_ok(&format!(
        "basename $(readlink /sys/bus/pci/devices/{bdf}/iommu_group)"
    ))?;
    let g = g.trim().to_string();
    let members = h.run_ok(&format!("ls /sys/kernel/iommu_groups/{g}/devices"))?;
    Ok((g, members.split_whitespace().map(str::to_string).collect()))
}

/// (c) In h0 (the host with an IOMMU): GPU0 is passed through with vfio-pci, beside another
/// function bound to h0; then pcifab is unloaded and loaded again with its defaults. The
/// downstream ports' ACS control must be exactly as the kernel set it (Request and Completion
/// Redirect on, as the IOMMU asks), and GPU0 must stay in the same IOMMU group with the same
/// members, still bound to vfio-pci.
pub fn acs_untouched(f: &mut Fabric) -> Result<(), String> {
    if !iommu_host(0) {
        return Err("h0 boots without an IOMMU: nothing to isolate".into());
    }
    compose_begin(f)?;
    let e = f.expected.clone();
    let (a, b): (u16, u16) = (0x0300, 0x0401);
    let h0 = &mut f.hosts[0];
    let bdf_a = bind_here(h0, &e, a)?;
    let bdf_b = bind_here(h0, &e, b)?;
    let r = acs_untouched_in(h0, &bdf_a, &bdf_b);
    let undo = h0.run_ok(&format!(
        "echo > /sys/bus/pci/devices/{bdf_a}/driver_override; \
         [ -e /sys/bus/pci/drivers/vfio-pci/{bdf_a} ] && \
         echo {bdf_a} > /sys/bus/pci/drivers/vfio-pci/unbind; true"
    ));
    let unbound = pcifab_ok(h0, &format!("unbind {a:#06x}"))
        .and_then(|_| pcifab_ok(h0, &format!("unbind {b:#06x}")));
    r?;
    undo?;
    unbound?;
    check_world(
        f,
        &Owners::new(),
        "vfio-pci function isolated across a reload",
    )
}

fn acs_untouched_in(h0: &mut Host, bdf_a: &str, bdf_b: &str) -> Result<(), String> {
    h0.run_ok(&format!(
        "echo vfio-pci > /sys/bus/pci/devices/{bdf_a}/driver_override; \
         [ -e /sys/bus/pci/devices/{bdf_a}/driver ] && \
         echo {bdf_a} > /sys/bus/pci/devices/{bdf_a}/driver/unbind; \
         echo {bdf_a} > /sys/bus/pci/drivers_probe"
    ))?;
    let mut c = Checks::new("h0: a vfio-pci function across a reload of pcifab");
    c.eq(
        &format!("driver of {bdf_a}"),
        Some("vfio-pci".to_string()),
        driver_of(h0, bdf_a)?,
    );
    // The emulated switch's upstream port has no ACS, so the kernel puts the whole switch in
    // one group; what must hold is that pcifab's load changes neither ACS nor the groups.
    let (group, members) = iommu_group(h0, bdf_a)?;
    let (group_b, members_b) = iommu_group(h0, bdf_b)?;
    h0.log_note(&format!(
        "IOMMU groups: {bdf_a} in {group} {members:?}, {bdf_b} in {group_b} {members_b:?}"
    ));
    if h0.run(&format!("[ -c /dev/vfio/{group} ]"))?.code != 0 {
        c.fail(format!(
            "/dev/vfio/{group}: expected vfio-pci's group device"
        ));
    }
    let mep = find_mep(h0)?;
    h0.run_ok("rmmod pcifab")?;
    let before = dsp_acs(h0, &mep)?;
    h0.run_ok(&format!("insmod {PCIFAB_KO}"))?;
    check_bound_pcifab(h0)?;
    let loaded = dsp_acs(h0, &mep)?;
    h0.log_note(&format!(
        "ACS control without pcifab {before:x?}, with pcifab loaded {loaded:x?}; \
         {bdf_a} in group {group}"
    ));
    c.eq(
        "ACS control of the downstream ports with pcifab loaded (as without it)",
        &before,
        &loaded,
    );
    if before.iter().all(|(_, v)| v.is_none()) {
        c.fail("no downstream port has an ACS capability: nothing was tested".into());
    }
    for (bdf, v) in before.iter() {
        if let Some(v) = v {
            if v & (ACS_RR | ACS_CR) != ACS_RR | ACS_CR {
                c.fail(format!(
                    "{bdf}: ACS control {v:#06x} without pcifab: expected Request and \
                     Completion Redirect set by the kernel for its IOMMU"
                ));
            }
        }
    }
    let (group_after, members_after) = iommu_group(h0, bdf_a)?;
    c.eq("IOMMU group after the reload", &group, &group_after);
    c.eq(
        "devices in the group after the reload",
        &members,
        &members_after,
    );
    c.eq(
        &format!("driver of {bdf_a} after the reload"),
        Some("vfio-pci".to_string()),
        driver_of(h0, bdf_a)?,
    );
    if let Err(err) = dmesg_clean(h0) {
        c.fail(err);
    }
    c.finish()
}
