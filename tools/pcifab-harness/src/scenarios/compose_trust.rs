// SPDX-License-Identifier: GPL-2.0-only
//! Composition scenarios that check what the driver promises when things happen at once:
//! the management endpoint unbound in the middle of an operation (no operation may hold it
//! up, waits end with `ENODEV`), the downstream ports' ACS control put back at `rmmod`, and
//! two hosts unbinding one function at the same moment (one wins, the other gets `ENOENT`).
//! See `Documentation/testing.rst`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::{
    bind_here, check_bound_pcifab, check_invariants, check_world, compose_begin, dmesg_clean,
    emu_owners, ensure_pcifab, find_mep, module_loaded, pcifab_cmd, pcifab_ok, Checks, ClearFault,
    Owners, GPU0, PCIFAB_KO,
};
use crate::fabric::{EmuControl, Fabric, Host};

/// How long unbinding the MEP may take while an operation is in flight.
const UNBIND_MEP_MAX_S: f64 = 5.0;
/// The bind timeout of the waiting bind: far longer than the unbind may take.
const LONG_BIND_TIMEOUT_MS: u32 = 60_000;
/// How long the MEP may take to go while a bind waits for enumeration. A removal that waited
/// for the bind would take the bind's timeout (60 s for the ioctl, the driver's default of
/// 30 s for the sysfs `bind` file); half the shorter one leaves room for a sanitizer kernel on
/// a loaded machine (up to 6 s seen), whose correct removal takes 0.1-3 s when it is quiet.
const BIND_WAIT_MEP_MAX_S: f64 = 15.0;
/// Kernel log lines of a task blocked too long (on top of the usual dmesg check).
const HUNG: &str = "blocked for more than|hung_task|INFO: task";
/// Rounds of the double unbind: 20 with `--soak` (`make soak`), 5 in `make test`.
pub fn double_unbind_rounds() -> usize {
    if crate::soak() {
        20
    } else {
        5
    }
}

/// `echo BDF > /sys/bus/pci/drivers/pcifab/unbind`, timed.
/// Also returns the guest's clock (`/proc/uptime`) when the unbind ended.
fn unbind_mep(h: &mut Host, mep: &str) -> Result<(i64, f64, Option<f64>), String> {
    let t = Instant::now();
    let o = h.run_timeout(
        &format!(
            "echo {mep} > /sys/bus/pci/drivers/pcifab/unbind; rc=$?; read -r u _ </proc/uptime; \
             echo \"END $u\"; exit $rc"
        ),
        Duration::from_secs(u64::from(LONG_BIND_TIMEOUT_MS / 1000) + 30),
    )?;
    let end = o
        .out
        .lines()
        .find_map(|l| l.strip_prefix("END "))
        .and_then(|u| u.trim().parse().ok());
    Ok((o.code, t.elapsed().as_secs_f64(), end))
}

/// Binds the MEP to pcifab again through sysfs and checks the driver works (an MRPC echo).
fn rebind_mep(h: &mut Host, mep: &str) -> Result<(), String> {
    h.run_ok(&format!("echo {mep} > /sys/bus/pci/drivers/pcifab/bind"))
        .map_err(|e| format!("rebinding the MEP to pcifab: {e}"))?;
    check_bound_pcifab(h)?;
    h.run_ok("pcifab mrpc 0x41 00")
        .map(|_| ())
        .map_err(|e| format!("an echo after rebinding the MEP: {e}"))
}

/// Waits (at most `secs`) for the background command that writes `/tmp/NAME.rc` to end;
/// returns its exit code and output, `None` if it is still running.
pub(super) fn wait_bg(
    h: &mut Host,
    name: &str,
    secs: u32,
) -> Result<Option<(i64, String)>, String> {
    let o = h.run_timeout(
        &format!(
            "i=0; while [ ! -s /tmp/{name}.rc ] && [ $i -lt {} ]; do sleep 0.1; i=$((i+1)); done; \
             if [ -s /tmp/{name}.rc ]; then echo \"RC $(cat /tmp/{name}.rc)\"; fi; cat /tmp/{name}.out",
            secs * 10
        ),
        Duration::from_secs(u64::from(secs) + 30),
    )?;
    let mut lines = o.out.lines();
    let first = lines.next().unwrap_or("");
    let rest: Vec<&str> = lines.collect();
    Ok(first
        .strip_prefix("RC ")
        .and_then(|c| c.trim().parse::<i64>().ok())
        .map(|c| (c, rest.join("\n"))))
}

/// No task was reported blocked, and dmesg is clean.
pub(super) fn no_hang(h: &mut Host) -> Result<(), String> {
    let o = h.run(&format!("dmesg | grep -E '{HUNG}'"))?;
    if o.code == 0 {
        return Err(format!(
            "{}: dmesg reports a blocked task:\n{}",
            h.name,
            o.out.trim_end()
        ));
    }
    dmesg_clean(h)
}

/// Frees `pdfid` through the emulator if it is bound (as the manager would).
pub(super) fn free_in_emu(emu: &EmuControl, f: &Fabric, pdfid: u16) -> Result<(), String> {
    let (o, _) = emu_owners(emu, &f.expected)?;
    if o.contains_key(&pdfid) {
        emu.request(&format!("unbind {pdfid:#06x}"))?;
    }
    Ok(())
}

/// How the waiting bind is started.
#[derive(Clone, Copy)]
enum BindBy {
    /// `pcifab bind` (the ioctl), with a 60 s timeout.
    Ioctl,
    /// `echo "PDFID 0" > /sys/class/misc/pcifab0/bind` (the default 30 s timeout).
    SysfsAttr,
}

/// How the MEP goes away from pcifab.
#[derive(Clone, Copy)]
enum MepGone {
    /// `echo BDF > /sys/bus/pci/drivers/pcifab/unbind`.
    DriverUnbind,
    /// `echo 1 > /sys/bus/pci/devices/BDF/remove`: the PCI core removes the device, and calls
    /// pcifab's remove, under the PCI rescan/remove lock; `echo 1 > /sys/bus/pci/rescan`
    /// brings it back (pcifab's probe then runs under that lock).
    PciRemove,
}

/// One round: `p` is bound to h0 (which never enumerates it), and while the driver waits for
/// it the MEP goes away. The MEP must be gone within [`BIND_WAIT_MEP_MAX_S`], the bind must end
/// with ENODEV, no task may hang, and pcifab must work on the MEP again afterwards.
fn bind_wait_then_gone(
    h0: &mut Host,
    emu: &EmuControl,
    e: &crate::config::Expected,
    p: u16,
    by: BindBy,
    gone: MepGone,
) -> Result<(), String> {
    let mep = find_mep(h0)?;
    emu.request("fault h0 no-enumerate")?;
    let start = match by {
        BindBy::Ioctl => {
            format!("pcifab bind {p:#06x} --host 0 --timeout {LONG_BIND_TIMEOUT_MS} --json")
        }
        BindBy::SysfsAttr => format!("echo '{p:#06x} 0' > /sys/class/misc/pcifab0/bind"),
    };
    h0.run_ok(&format!(
        "rm -f /tmp/bw.out /tmp/bw.rc; \
         (({start}) >/tmp/bw.out 2>&1; echo $? >/tmp/bw.rc) </dev/null >/dev/null 2>&1 &"
    ))?;
    // Once the fabric holds the binding the driver waits for the function to appear.
    let t = Instant::now();
    loop {
        if emu_owners(emu, e).is_ok_and(|(o, _)| o.get(&p) == Some(&0)) {
            break;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let out = h0.run("cat /tmp/bw.out")?.out;
            return Err(format!(
                "h0: bind {p:#06x} never reached the fabric within 20 s: {}",
                out.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (what, script) = match gone {
        MepGone::DriverUnbind => (
            "sysfs driver unbind",
            format!("echo {mep} > /sys/bus/pci/drivers/pcifab/unbind"),
        ),
        MepGone::PciRemove => (
            "sysfs PCI remove",
            format!("echo 1 > /sys/bus/pci/devices/{mep}/remove"),
        ),
    };
    let t = Instant::now();
    let o = h0.run_timeout(
        &script,
        Duration::from_secs(u64::from(LONG_BIND_TIMEOUT_MS / 1000) + 30),
    )?;
    let secs = t.elapsed().as_secs_f64();
    h0.log_note(&format!(
        "{what} of the MEP during a bind's enumeration wait: exit {} after {secs:.2} s",
        o.code
    ));
    let bind = wait_bg(h0, "bw", 10)?;
    let mut c = Checks::new(&format!(
        "h0: MEP gone ({what}) while a bind waits for enumeration"
    ));
    c.eq(&format!("exit code of the {what}"), 0, o.code);
    if secs > BIND_WAIT_MEP_MAX_S {
        c.fail(format!(
            "the {what} took {secs:.1} s: expected at most {BIND_WAIT_MEP_MAX_S} s (it waited \
             for the bind)"
        ));
    }
    match (&bind, by) {
        (None, _) => c.fail("the bind was still running 10 s after the MEP went away".into()),
        (Some((rc, out)), BindBy::Ioctl) => {
            if *rc != 1 || !out.contains("No such device") {
                c.fail(format!(
                    "the bind: expected exit 1 with ENODEV (\"No such device\"), got exit \
                     {rc}: {}",
                    out.trim()
                ));
            }
        }
        (Some((rc, out)), BindBy::SysfsAttr) => {
            if *rc == 0 || !out.contains("No such device") {
                c.fail(format!(
                    "the write of `bind`: expected it to fail with ENODEV (\"No such \
                     device\"), got exit {rc}: {}",
                    out.trim()
                ));
            }
        }
    }
    match gone {
        MepGone::DriverUnbind => {
            let driver = h0.run(&format!("readlink /sys/bus/pci/devices/{mep}/driver"))?;
            if driver.code == 0 {
                c.fail(format!(
                    "the MEP still has a driver after the unbind: {}",
                    driver.out.trim()
                ));
            }
        }
        MepGone::PciRemove => {
            if h0.run(&format!("[ -e /sys/bus/pci/devices/{mep} ]"))?.code == 0 {
                c.fail(format!("{mep} still exists after its removal"));
            }
        }
    }
    if let Err(err) = no_hang(h0) {
        c.fail(err);
    }
    let back = match gone {
        MepGone::DriverUnbind => rebind_mep(h0, &mep),
        MepGone::PciRemove => h0
            .run_ok("echo 1 > /sys/bus/pci/rescan")
            .map_err(|e| format!("rescanning the PCI bus: {e}"))
            .and_then(|_| check_bound_pcifab(h0))
            .and_then(|()| {
                h0.run_ok("pcifab mrpc 0x41 00")
                    .map(|_| ())
                    .map_err(|e| format!("an echo after the rescan: {e}"))
            }),
    };
    if let Err(err) = back {
        c.fail(err);
    }
    if let Err(err) = no_hang(h0) {
        c.fail(format!("after bringing the MEP back: {err}"));
    }
    c.finish()
}

/// (c) A bind in h0 waits for a function that never enumerates (`fault h0 no-enumerate`);
/// meanwhile the MEP goes away: first a `pcifab bind` (60 s timeout) while the MEP is unbound
/// from pcifab through sysfs, then a bind through the sysfs `bind` attribute while the MEP is
/// removed from the PCI bus (and rescanned back). Each time the MEP must be gone within a few
/// seconds, the bind must end with ENODEV, no task may hang, and pcifab must work again.
pub fn unbind_mep_during_bind(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let rounds = [
        (0x0301, BindBy::Ioctl, MepGone::DriverUnbind),
        (0x0302, BindBy::SysfsAttr, MepGone::PciRemove),
    ];
    let mut r = Ok(());
    for (p, by, gone) in rounds {
        r = bind_wait_then_gone(&mut f.hosts[0], &emu, &e, p, by, gone);
        if r.is_err() {
            break;
        }
        emu.request("fault clear h0")?;
    }
    let cleared = emu.request("fault clear h0");
    // The fabric bound the functions to h0, which never saw them and could not give them back.
    let freed: Result<(), String> = rounds
        .iter()
        .try_for_each(|(p, _, _)| free_in_emu(&emu, f, *p));
    r?;
    cleared?;
    freed?;
    check_world(f, &Owners::new(), "the MEP gone during binds, and back")
}

/// (c) h0 holds GPU0; while pciehp powers its slot off (`echo 0 > .../slots/S/power`) h0 also
/// asks pcifab to unbind it and the MEP is unbound from pcifab. The MEP unbind must be done
/// within a few seconds, the pcifab unbind must end (success, or ENODEV if the MEP went away
/// first), the slot's power-off must complete, no task may hang, and the MEP binds again.
pub fn unbind_mep_during_pciehp_removal(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let p: u16 = 0x0300;
    let h0 = &mut f.hosts[0];
    let mep = find_mep(h0)?;
    let bdf = bind_here(h0, &e, p)?;
    let addr = bdf.rsplit_once('.').map_or(bdf.as_str(), |(a, _)| a);
    let slot = h0.run_ok(&format!(
        "for s in /sys/bus/pci/slots/*; do \
         [ \"$(cat $s/address 2>/dev/null)\" = {addr} ] && echo ${{s##*/}}; done; true"
    ))?;
    let slot = slot.trim().to_string();
    if slot.is_empty() || slot.contains('\n') {
        return Err(format!(
            "h0: expected one hot-plug slot with address {addr} (the port of {bdf}), got {slot:?}"
        ));
    }
    // Every firmware command of h0 takes 400 ms from here, so that pcifab's unbind is still
    // in the driver when the harness unbinds the MEP (without it a fast unbind can be over
    // before the harness sees it start); cleared before the MEP binds again.
    emu.request("fault h0 delay 400")?;
    let delay = ClearFault(f.emu(), "h0");
    let h0 = &mut f.hosts[0];
    h0.run_ok(&format!(
        "rm -f /tmp/pw.out /tmp/pw.rc /tmp/ub.out /tmp/ub.rc /tmp/ub.pid; \
         (echo 0 > /sys/bus/pci/slots/{slot}/power; rc=$?; read -r u _ </proc/uptime; \
         echo $u >/tmp/pw.end; echo $rc >/tmp/pw.rc) \
         </dev/null >/tmp/pw.out 2>&1 & \
         (sh -c 'echo $$ >/tmp/ub.pid; exec pcifab unbind {p:#06x} --json' \
         >/tmp/ub.out 2>&1; echo $? >/tmp/ub.rc) </dev/null >/dev/null 2>&1 &"
    ))?;
    // The unbind is in the driver once the CLI has the device open (it calls the ioctl next).
    let started = h0.run(
        "i=0; while [ $i -lt 100 ]; do \
         [ -s /tmp/ub.pid ] && ls -l /proc/$(cat /tmp/ub.pid)/fd 2>/dev/null | grep -q pcifab0 \
         && exit 0; [ -s /tmp/ub.rc ] && exit 2; sleep 0.05; i=$((i+1)); done; exit 1",
    )?;
    if started.code != 0 {
        let out = h0.run("cat /tmp/ub.out /tmp/pw.out")?.out;
        return Err(format!(
            "h0: `pcifab unbind {p:#06x}` was not seen in the driver before it ended or within \
             5 s (code {}): {}",
            started.code,
            out.trim()
        ));
    }
    let (code, secs, unbind_end) = unbind_mep(h0, &mep)?;
    h0.log_note(&format!(
        "MEP unbind during a pciehp power-off of slot {slot}: exit {code} after {secs:.2} s"
    ));
    let power = wait_bg(h0, "pw", 15)?;
    let unbind = wait_bg(h0, "ub", 15)?;
    drop(delay);
    let mut c = Checks::new("h0: MEP unbound while pciehp removes GPU0");
    c.eq("exit code of the sysfs unbind", 0, code);
    // The guest's clock (/proc/uptime) when the slot's power-off ended.
    let power_end = h0.run("cat /tmp/pw.end")?.out.trim().parse::<f64>().ok();
    // An unbind that waited for pciehp ends after the power-off it waited for. A slow
    // machine can stretch a correct unbind past the bound, but not past the power-off.
    if secs > UNBIND_MEP_MAX_S {
        match (unbind_end, power_end) {
            (Some(u), Some(p)) if u < p => h0.log_note(&format!(
                "the sysfs unbind took {secs:.1} s (over {UNBIND_MEP_MAX_S} s) but ended at \
                 {u:.2} s, before the slot's power-off at {p:.2} s: it did not wait for it"
            )),
            (u, p) => c.fail(format!(
                "the sysfs unbind took {secs:.1} s: expected at most {UNBIND_MEP_MAX_S} s, or \
                 an end before the slot's power-off (guest clock: unbind ended {u:?}, \
                 power-off ended {p:?})"
            )),
        }
    }
    match &power {
        None => c.fail("the slot's power-off was still running after 15 s".into()),
        Some((rc, out)) => h0.log_note(&format!("slot power-off: exit {rc}: {}", out.trim())),
    }
    let unbind_ok = match &unbind {
        None => {
            c.fail("`pcifab unbind` was still running 15 s after the MEP was unbound".into());
            false
        }
        Some((0, _)) => true,
        Some((1, out)) if out.contains("No such device") => false,
        Some((rc, out)) => {
            c.fail(format!(
                "`pcifab unbind`: expected success or ENODEV (\"No such device\"), got exit \
                 {rc}: {}",
                out.trim()
            ));
            false
        }
    };
    h0.log_note(&format!(
        "pcifab unbind during the MEP unbind: {}",
        if unbind_ok { "succeeded" } else { "ENODEV" }
    ));
    let gone = h0.run(&format!("[ -e /sys/bus/pci/devices/{bdf} ]"))?.code != 0;
    c.eq(&format!("{bdf} gone from h0"), true, gone);
    if let Err(err) = no_hang(h0) {
        c.fail(err);
    }
    if let Err(err) = rebind_mep(h0, &mep) {
        c.fail(err);
    }
    let freed = free_in_emu(&emu, f, p);
    c.finish()?;
    freed?;
    check_world(f, &Owners::new(), "the MEP unbound during a pciehp removal")
}

/// `PCI_EXT_CAP_ID_ACS` and its control register.
const EXT_CAP_ACS: u16 = 0x000d;
const ACS_CTRL: usize = 6;
const ACS_SV: u16 = 1 << 0;
pub(super) const ACS_RR: u16 = 1 << 2;
pub(super) const ACS_CR: u16 = 1 << 3;
const ACS_UF: u16 = 1 << 4;
const ACS_EC: u16 = 1 << 5;

/// ACS control of a config space image, if it has an ACS extended capability.
fn acs_ctrl(cfg: &[u8]) -> Option<u16> {
    let rd16 = |o: usize| Some(u16::from_le_bytes([*cfg.get(o)?, *cfg.get(o + 1)?]));
    let rd32 = |o: usize| Some(u32::from_le_bytes(cfg.get(o..o + 4)?.try_into().ok()?));
    let mut pos = 0x100usize;
    for _ in 0..64 {
        let hdr = rd32(pos)?;
        if hdr == 0 || hdr == u32::MAX {
            return None;
        }
        if (hdr & 0xffff) as u16 == EXT_CAP_ACS {
            return rd16(pos + ACS_CTRL);
        }
        pos = (hdr >> 20) as usize & 0xffc;
        if pos < 0x100 {
            return None;
        }
    }
    None
}

/// The downstream ports of this host's switch (children of the upstream port beside the
/// MEP) with the ACS control of each, `None` without an ACS capability.
pub(super) fn dsp_acs(h: &mut Host, mep: &str) -> Result<Vec<(String, Option<u16>)>, String> {
    let usp = format!("{}.0", mep.rsplit_once('.').map_or(mep, |(a, _)| a));
    let out = h.run_ok(&format!(
        "for d in /sys/bus/pci/devices/{usp}/0000:*; do \
         echo \"DSP ${{d##*/}} $(od -An -tx1 -v $d/config | tr -d ' \\n')\"; done"
    ))?;
    let mut v = Vec::new();
    for l in out.lines() {
        let Some(rest) = l.strip_prefix("DSP ") else {
            continue;
        };
        let (bdf, hex) = rest.split_once(' ').unwrap_or((rest, ""));
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
            .collect();
        if bytes.len() < 0x1000 {
            return Err(format!(
                "{}: config space of {bdf}: expected 4096 bytes (PCIe extended), got {}",
                h.name,
                bytes.len()
            ));
        }
        v.push((bdf.to_string(), acs_ctrl(&bytes)));
    }
    if v.is_empty() {
        return Err(format!("{}: no downstream port below {usp}", h.name));
    }
    Ok(v)
}

/// (g) In every host, with the opt-in `p2p_acs_relax=1`: ACS control of each downstream port
/// before `insmod`, after it (RR, CR and EC cleared, SV and UF set where the port has ACS),
/// and after `rmmod` (exactly as before). At least one port must have an ACS capability, or
/// nothing was tested. (Without the parameter nothing changes: `hotplug::acs_untouched`.)
pub fn acs_restored(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        if module_loaded(h, "pcifab")? {
            h.run_ok("rmmod pcifab")?;
        }
        let mep = find_mep(h)?;
        h.run_ok("dmesg -c >/dev/null")?;
        let before = dsp_acs(h, &mep)?;
        h.run_ok(&format!("insmod {PCIFAB_KO} p2p_acs_relax=1"))?;
        let loaded = dsp_acs(h, &mep)?;
        h.run_ok("rmmod pcifab")?;
        let after = dsp_acs(h, &mep)?;
        ensure_pcifab(h)?;
        h.log_note(&format!(
            "ACS control before insmod {before:x?}, loaded {loaded:x?}, after rmmod {after:x?}"
        ));
        let mut c = Checks::new(&format!("{}: ACS control of the downstream ports", h.name));
        c.eq("after rmmod (as before insmod)", &before, &after);
        for ((bdf, b), (_, l)) in before.iter().zip(&loaded) {
            let want = b.map(|b| (b & !(ACS_RR | ACS_CR | ACS_EC)) | ACS_SV | ACS_UF);
            c.eq(&format!("{bdf} while pcifab is loaded"), want, *l);
        }
        if before.iter().all(|(_, a)| a.is_none()) {
            c.fail(format!(
                "no downstream port has an ACS capability ({}): the save and restore were not \
                 exercised (QEMU's xio3130-downstream has none; a pcie-root-port in its place \
                 has one)",
                before
                    .iter()
                    .map(|(b, _)| b.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        if let Err(err) = dmesg_clean(h) {
            c.fail(err);
        }
        c.finish()
    })
}

/// (h) h1 holds a gpu1 VF; h0 (the manager) and h1 (the owner) unbind it at the same moment,
/// [`double_unbind_rounds`] times. Each round exactly one succeeds and the other gets ENOENT
/// (exit 3, "No such file or directory"); the function is then free everywhere, and gone
/// from h1.
pub fn double_unbind(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let p: u16 = 0x0402;
    let args = format!("unbind {p:#06x}");
    let mut winners = [0usize; 2];
    for round in 0..double_unbind_rounds() {
        pcifab_ok(&mut f.hosts[1], &format!("bind {p:#06x} --host 1"))?;
        let results = Mutex::new(vec![(0i64, Value::Null, String::new()); f.hosts.len()]);
        f.each_host(|h, _| {
            let r = pcifab_cmd(h, &args)?;
            h.log_note(&format!(
                "double unbind round {round}: exit {}: {}",
                r.0,
                r.2.trim().replace('\n', " | ")
            ));
            if let Ok(mut v) = results.lock() {
                if let Some(slot) = v.get_mut(h.index) {
                    *slot = r;
                }
            }
            Ok(())
        })?;
        let results = results.into_inner().unwrap_or_default();
        let describe = || {
            results
                .iter()
                .enumerate()
                .map(|(i, (code, _, out))| {
                    format!("h{i}: exit {code}: {}", out.trim().replace('\n', " | "))
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let ok: Vec<usize> = (0..results.len()).filter(|&i| results[i].0 == 0).collect();
        let mut c = Checks::new(&format!(
            "round {round}: h0 and h1 unbinding {p:#06x} at once"
        ));
        if ok.len() != 1 {
            c.fail(format!(
                "expected exactly one success, got {}:\n{}",
                ok.len(),
                describe()
            ));
        }
        for (i, (code, v, out)) in results.iter().enumerate() {
            if *code == 0 {
                winners[i] += 1;
                continue;
            }
            let err = v["error"]["message"].as_str().unwrap_or("");
            if *code != 3 || !err.contains("No such file or directory") {
                c.fail(format!(
                    "h{i} (the loser): expected exit 3 with ENOENT (\"No such file or \
                     directory\"), got exit {code}: {}",
                    out.trim()
                ));
            }
        }
        c.finish()?;
        check_invariants(&emu, &format!("double unbind round {round}"))?;
        check_world(
            f,
            &Owners::new(),
            &format!("double unbind round {round} (function free)"),
        )?;
    }
    f.hosts[0].log_note(&format!(
        "double unbind: {} rounds, h0 won {}, h1 won {}",
        double_unbind_rounds(),
        winners[0],
        winners[1]
    ));
    Ok(())
}

/// Runs `script` in `h` as root without `CAP_SYS_ADMIN` (`pcifab-selftest nocap`).
fn as_nocap(h: &mut Host, script: &str) -> Result<(i64, String), String> {
    let quoted = script.replace('\'', r"'\''");
    let o = h.run(&format!("pcifab-selftest nocap '{quoted}' 2>&1"))?;
    h.log_note(&format!("without CAP_SYS_ADMIN: {script}: exit {}", o.code));
    Ok((o.code, o.out))
}

/// The sysfs `bind` and `unbind` files need `CAP_SYS_ADMIN`, as the ioctls do. Before, their
/// mode (0200) was the only check, so any root process, one without `CAP_SYS_ADMIN`
/// included, bound and unbound functions through them.
pub fn sysfs_bind_needs_cap(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let p = GPU0;
    let h = &mut f.hosts[0];
    let mut c = Checks::new(&format!(
        "{}: sysfs bind/unbind as root without CAP_SYS_ADMIN",
        h.name
    ));
    // The wrapper really drops it: bit 21 of the shell's bounding and effective sets.
    let (_, caps) = as_nocap(h, "grep -E '^Cap(Eff|Bnd):' /proc/self/status")?;
    for line in caps.lines() {
        let mask = line
            .split_whitespace()
            .nth(1)
            .and_then(|m| u64::from_str_radix(m, 16).ok())
            .ok_or_else(|| format!("{}: unexpected capability line {line:?}", h.name))?;
        if mask & (1 << 21) != 0 {
            return Err(format!(
                "{}: `pcifab-selftest nocap` left CAP_SYS_ADMIN: {line}; the checks below \
                 could not fail",
                h.name
            ));
        }
    }
    let owner = |emu: &EmuControl| emu_owners(emu, &e).map(|(o, _)| o.get(&p).copied());
    let bind = format!("echo '{p:#06x} 0' > /sys/class/misc/pcifab0/bind");
    let unbind = format!("echo '{p:#06x}' > /sys/class/misc/pcifab0/unbind");
    let (code, out) = as_nocap(h, &bind)?;
    if code == 0 || !out.contains("Operation not permitted") {
        c.fail(format!(
            "write of `bind`: expected EPERM (\"Operation not permitted\"), got exit {code}: {}",
            out.trim()
        ));
    }
    c.eq(
        "owner of the function after the refused bind",
        None,
        owner(&emu)?,
    );
    // The ioctl says the same.
    let (code, out) = as_nocap(h, &format!("pcifab bind {p:#06x} --host 0"))?;
    if code == 0 || !out.contains("CAP_SYS_ADMIN") {
        c.fail(format!(
            "pcifab bind: expected EPERM naming CAP_SYS_ADMIN, got exit {code}: {}",
            out.trim()
        ));
    }
    // With the capability the file binds; without it, it does not unbind.
    h.run_ok(&bind)
        .map_err(|err| format!("{}: root's write of `bind`: {err}", h.name))?;
    c.eq("owner after root's bind", Some(0), owner(&emu)?);
    let (code, out) = as_nocap(h, &unbind)?;
    if code == 0 || !out.contains("Operation not permitted") {
        c.fail(format!(
            "write of `unbind`: expected EPERM (\"Operation not permitted\"), got exit {code}: \
             {}",
            out.trim()
        ));
    }
    c.eq("owner after the refused unbind", Some(0), owner(&emu)?);
    h.run_ok(&unbind)
        .map_err(|err| format!("{}: root's write of `unbind`: {err}", h.name))?;
    c.eq("owner after root's unbind", None, owner(&emu)?);
    c.finish()?;
    check_world(f, &Owners::new(), "after the sysfs bind/unbind checks")?;
    dmesg_clean(&mut f.hosts[0])
}
