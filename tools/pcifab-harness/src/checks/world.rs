// SPDX-License-Identifier: GPL-2.0-only
//! The fabric as the emulator and the guests see it: who holds which function (the
//! emulator's bindings, every guest's `pcifab list`, the functions each guest enumerated,
//! checked through their BARs), the emulator's invariants, and the common steps of the
//! composition scenarios (every function free, a bind checked, a BAR pattern) and of the
//! scenarios that depend on the firmware's dialect.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::cli::{json_line, pcifab_cmd, pcifab_ok, selftest_json, CMD_TIMEOUT_SHORT};
use crate::checks::expect::{expect_eq, Checks};
use crate::checks::guest::{begin, dmesg_clean};
use crate::config::{Dialect, Expected, FunctionInfo};
use crate::fabric::{EmuControl, Fabric, Host};

/// PDFID -> index of the host holding it.
pub type Owners = BTreeMap<u16, usize>;

/// Function 0 of gpu0 (fabric.toml).
pub const GPU0: u16 = 0x0300;
/// One MiB, for route and copy sizes.
pub const MIB: u64 = 1 << 20;
/// `EOPNOTSUPP`, as the CLI's JSON reports it.
const EOPNOTSUPP: i64 = 95;

/// How long a function may take to appear in (or leave) a host after the fabric bound it:
/// pciehp's 5 s attention-button delay, then enumeration, which on the sanitizer kernel with
/// two vCPUs on a busy two-core machine took more than 20 s.
const APPEAR_SECS: u64 = 45;

fn hex_u16(v: &Value) -> Option<u16> {
    let s = v.as_str()?;
    u16::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

pub fn owners_text(e: &Expected, o: &Owners) -> String {
    if o.is_empty() {
        return "{} (nothing bound)".into();
    }
    let v: Vec<String> = o
        .iter()
        .map(|(p, h)| format!("{p:#06x}->{}", e.hosts.get(*h).map_or("?", String::as_str)))
        .collect();
    format!("{{{}}}", v.join(", "))
}

/// The emulator's `invariants` must list no violation.
pub fn check_invariants(emu: &EmuControl, step: &str) -> Result<(), String> {
    let v = emu.request("invariants")?;
    let viol = v.get("violations").cloned().unwrap_or(Value::Null);
    if viol.as_array().is_some_and(Vec::is_empty) {
        Ok(())
    } else {
        Err(format!(
            "after {step}: emulator invariants: expected no violations, got {viol}"
        ))
    }
}

/// The emulator's bindings (owner per function) and generation; fails while an operation is
/// still in flight.
pub fn emu_owners(emu: &EmuControl, e: &Expected) -> Result<(Owners, Value), String> {
    let v = emu.request("state")?;
    let mut o = Owners::new();
    let bindings = v
        .get("bindings")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("emulator state has no `bindings` array: {v}"))?;
    for b in bindings {
        let pdfid = b.get("pdfid").and_then(Value::as_u64).unwrap_or(0) as u16;
        if b.get("busy") == Some(&Value::Bool(true)) {
            return Err(format!(
                "emulator: function {pdfid:#06x} still has an operation in flight: {b}"
            ));
        }
        if let Some(owner) = b.get("owner").and_then(Value::as_str) {
            let i =
                e.hosts.iter().position(|h| h == owner).ok_or_else(|| {
                    format!("emulator: {pdfid:#06x} owned by unknown host {owner}")
                })?;
            o.insert(pdfid, i);
        }
    }
    Ok((o, v.get("bindings").cloned().unwrap_or_default()))
}

/// [`emu_owners`] until no operation is in flight, polling every `poll` for up to `limit`;
/// the owners, or the last error after that.
pub fn settled_owners(
    emu: &EmuControl,
    e: &Expected,
    limit: Duration,
    poll: Duration,
) -> Result<Owners, String> {
    let t = Instant::now();
    loop {
        match emu_owners(emu, e) {
            Ok((o, _)) => return Ok(o),
            Err(err) if t.elapsed() > limit => return Err(err),
            Err(_) => std::thread::sleep(poll),
        }
    }
}

/// Waits (at most `secs`) until the emulator's bindings are `want` (a change made on the
/// fabric's side, not by the scenario's own command); returns how long it took.
pub fn wait_owners(f: &Fabric, want: &Owners, secs: u64, what: &str) -> Result<Duration, String> {
    let emu = f.emu();
    let t = Instant::now();
    loop {
        let got = emu_owners(&emu, &f.expected).map(|(o, _)| o);
        if got.as_ref() == Ok(want) {
            return Ok(t.elapsed());
        }
        if t.elapsed() > Duration::from_secs(secs) {
            return Err(format!(
                "{what}: emulator bindings: expected {} within {secs} s, got {}",
                owners_text(&f.expected, want),
                match got {
                    Ok(o) => owners_text(&f.expected, &o),
                    Err(e) => e,
                }
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Unbinds every bound function through the emulator's control socket (as the manager);
/// a failed unbind fails with `WHAT: the error`.
pub fn free_all(emu: &EmuControl, e: &Expected, what: &str) -> Result<(), String> {
    let (owners, _) = emu_owners(emu, e)?;
    for p in owners.keys() {
        emu.request(&format!("unbind {p:#06x}"))
            .map_err(|err| format!("{what}: {err}"))?;
    }
    Ok(())
}

/// The emulator's scrub count of `pdfid` (how often its memory was zeroed), if its state
/// has one.
pub fn emu_scrubs(emu: &EmuControl, pdfid: u16) -> Result<Option<u64>, String> {
    let v = emu.request("state")?;
    Ok(v["bindings"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["pdfid"] == pdfid))
        .and_then(|b| b["scrubs"].as_u64()))
}

/// The emulator's bindings `got` after `step` are `want`.
fn bindings_are(e: &Expected, want: &Owners, got: &Owners, step: &str) -> Result<(), String> {
    if got != want {
        return Err(format!(
            "after {step}: emulator bindings: expected {}, got {}",
            owners_text(e, want),
            owners_text(e, got)
        ));
    }
    Ok(())
}

/// `pcifab list --json` in `h`: owners, and the functions array as printed.
pub fn list_owners(h: &mut Host) -> Result<(Owners, Value), String> {
    let out = h.run_ok("pcifab list --json")?;
    listed_owners(h, &out)
}

/// Owners and the functions array of `out`, what `pcifab list --json` printed in `h`.
pub fn listed_owners(h: &Host, out: &str) -> Result<(Owners, Value), String> {
    json_line(out).map_err(|e| format!("{}: `pcifab list --json`: {e}", h.name))?;
    let v: Value = serde_json::from_str(out.trim()).map_err(|e| {
        format!(
            "{}: `pcifab list --json`: expected one JSON object, got {:?} ({e})",
            h.name,
            out.trim()
        )
    })?;
    let fns = v
        .get("functions")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{}: `pcifab list --json` has no functions array", h.name))?;
    let mut o = Owners::new();
    for f in fns {
        if f.get("bound") == Some(&Value::Bool(true)) {
            let p = f.get("pdfid").and_then(hex_u16).unwrap_or(0);
            let host = f.get("host").and_then(Value::as_u64).unwrap_or(999) as usize;
            o.insert(p, host);
        }
    }
    Ok((o, Value::Array(fns.clone())))
}

/// `h`'s `pcifab list --json` after `step` shows the bindings `want`.
fn listed_are(h: &mut Host, e: &Expected, want: &Owners, step: &str) -> Result<(), String> {
    let (listed, _) = list_owners(h)?;
    if listed != *want {
        return Err(format!(
            "{}: after {step}: `pcifab list --json` bindings: expected {}, got {}",
            h.name,
            owners_text(e, want),
            owners_text(e, &listed)
        ));
    }
    Ok(())
}

/// A fabric function as one guest sees it: BDF, ids from config space and from BAR0.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenFn {
    pub bdf: String,
    vendor: String,
    device: String,
    bar0_id: String,
}

/// Every function of vendor 0x10de in `h`, keyed by the PDFID its BAR0 reports.
pub fn fns_seen(h: &mut Host) -> Result<BTreeMap<u16, SeenFn>, String> {
    let out = h.run_ok(
        // `read`, not `$(cat ...)`: no fork per device (a fork costs tens of ms under TCG).
        r#"for d in /sys/bus/pci/devices/*; do
  read -r v 2>/dev/null <$d/vendor || continue
  [ "$v" = 0x10de ] || continue
  read -r dv 2>/dev/null <$d/device || dv=?
  echo "DEV ${d##*/} $v $dv"
  pcifab-selftest bar-id --device ${d##*/} 2>&1 || echo "BARID-FAILED ${d##*/}"
done; true"#,
    )?;
    let mut m = BTreeMap::new();
    let mut cur: Option<(String, String, String)> = None;
    for l in out.lines() {
        if let Some(rest) = l.strip_prefix("DEV ") {
            let w: Vec<&str> = rest.split_whitespace().collect();
            if let [bdf, v, d] = w.as_slice() {
                cur = Some((bdf.to_string(), v.to_string(), d.to_string()));
            }
        } else if l.starts_with("{\"test\":\"bar-id\"") {
            let v: Value = serde_json::from_str(l).unwrap_or(Value::Null);
            let Some((bdf, vendor, device)) = cur.take() else {
                continue;
            };
            let pdfid = v.get("pdfid").and_then(hex_u16).unwrap_or(0);
            let bar0_id = v
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string();
            if let Some(old) = m.insert(
                pdfid,
                SeenFn {
                    bdf: bdf.clone(),
                    vendor,
                    device,
                    bar0_id,
                },
            ) {
                return Err(format!(
                    "{}: PDFID {pdfid:#06x} seen twice, at {} and {bdf}",
                    h.name, old.bdf
                ));
            }
        } else if l.starts_with("BARID-FAILED") {
            // A device in the middle of appearing or leaving; the caller polls.
            m.insert(
                0xffff,
                SeenFn {
                    bdf: l.to_string(),
                    vendor: String::new(),
                    device: String::new(),
                    bar0_id: String::new(),
                },
            );
        }
    }
    Ok(m)
}

/// What `h` should see for `want`: the PDFIDs it holds, with ids from the configuration.
fn check_seen(h: &Host, e: &Expected, want: &Owners, seen: &BTreeMap<u16, SeenFn>) -> Vec<String> {
    let mine = held_by(want, h.index);
    let got: Vec<u16> = seen.keys().copied().collect();
    let mut errs = Vec::new();
    if mine != got {
        errs.push(format!(
            "functions visible (PDFID from BAR0): expected {:x?}, got {:x?} ({seen:?})",
            mine, got
        ));
        return errs;
    }
    for (p, s) in seen {
        let Some(fi) = e.function(*p) else { continue };
        let (v, d) = (
            format!("{:#06x}", fi.vendor_id),
            format!("{:#06x}", fi.device_id),
        );
        let id = format!("{:#010x}", (fi.device_id << 16) | fi.vendor_id);
        if s.vendor != v || s.device != d || s.bar0_id != id {
            errs.push(format!(
                "{p:#06x} at {}: expected vendor {v} device {d} BAR0 id {id}, got {} {} {}",
                s.bdf, s.vendor, s.device, s.bar0_id
            ));
        }
    }
    errs
}

/// After a step: emulator invariants hold, its bindings are `want`, both hosts' inventories
/// say the same, each live host sees exactly its own functions (waiting up to [`APPEAR_SECS`] for
/// hot-plug to settle) and dmesg is clean.
pub fn check_world(f: &mut Fabric, want: &Owners, step: &str) -> Result<(), String> {
    check_world_except(f, want, &[], step)
}

/// [`check_world`], not requiring the functions in `lost` to be visible in their host.
pub fn check_world_except(
    f: &mut Fabric,
    want: &Owners,
    lost: &[u16],
    step: &str,
) -> Result<(), String> {
    let emu = f.emu();
    check_invariants(&emu, step)?;
    let e = f.expected.clone();
    let got = settled_owners(
        &emu,
        &e,
        Duration::from_secs(15),
        Duration::from_millis(200),
    )
    .map_err(|err| format!("after {step}: {err}"))?;
    bindings_are(&e, want, &got, step)?;
    let want = want.clone();
    f.each_host(|h, e| {
        // A host whose QEMU this scenario killed has nothing to look at: said so, visibly.
        // A host that died by itself fails the check.
        if h.is_dead() {
            if h.killed_by_scenario() {
                crate::say(&format!(
                    "# {}: not checked after {step}: its QEMU was killed by the scenario",
                    h.name
                ));
                return Ok(());
            }
            return Err(format!(
                "{}: after {step}: the host is dead ({}), so what it sees cannot be checked",
                h.name,
                h.dead_reason().unwrap_or("?")
            ));
        }
        listed_are(h, e, &want, step)?;
        let t = Instant::now();
        let visible: Owners = want
            .iter()
            .filter(|(p, _)| !lost.contains(p))
            .map(|(p, o)| (*p, *o))
            .collect();
        loop {
            let seen = fns_seen(h)?;
            let errs = check_seen(h, e, &visible, &seen);
            if errs.is_empty() {
                break;
            }
            if t.elapsed() > Duration::from_secs(APPEAR_SECS) {
                return Err(format!(
                    "{}: after {step} (waited {APPEAR_SECS} s): {}",
                    h.name,
                    errs.join("; ")
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        dmesg_clean(h).map_err(|err| format!("after {step}: {err}"))
    })
}

/// The emulator's bindings and every host's `pcifab list` say `want` (QEMU's nvme device
/// carries no PDFID in a BAR, so the GPU scenarios' BAR check does not apply).
pub fn check_bindings(f: &mut Fabric, want: &Owners, step: &str) -> Result<(), String> {
    let e = f.expected.clone();
    let (got, _) = emu_owners(&f.emu(), &e)?;
    bindings_are(&e, want, &got, step)?;
    let want = want.clone();
    f.each_host(|h, e| listed_are(h, e, &want, step))
}

/// Every scenario of this group starts from here: pcifab loaded, dmesg empty, every
/// function free (unbound through the emulator's control socket, as the manager).
pub fn compose_begin(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| begin(h))?;
    let emu = f.emu();
    let e = f.expected.clone();
    free_all(&emu, &e, "setting up (every function free)")?;
    check_world(f, &Owners::new(), "setup (every function free)")
}

/// The PDFIDs `o` has bound to host `host`, in order.
pub fn held_by(o: &Owners, host: usize) -> Vec<u16> {
    o.iter()
        .filter(|(_, h)| **h == host)
        .map(|(p, _)| *p)
        .collect()
}

/// The configuration's function `pdfid`.
pub fn configured(e: &Expected, pdfid: u16) -> Result<FunctionInfo, String> {
    e.function(pdfid)
        .ok_or_else(|| format!("{pdfid:#06x} is not in the configuration"))
}

/// Binds `pdfid` to the host it runs in; returns its BDF after checking the CLI's report.
pub fn bind_here(h: &mut Host, e: &Expected, pdfid: u16) -> Result<String, String> {
    let v = pcifab_ok(h, &format!("bind {pdfid:#06x} --host {}", h.index))?;
    let fi = configured(e, pdfid)?;
    let mut c = Checks::new(&format!("{}: bind {pdfid:#06x}", h.name));
    c.eq_json(
        "vendor",
        Value::from(format!("{:#06x}", fi.vendor_id)),
        v["vendor"].clone(),
    );
    c.eq_json(
        "device_id",
        Value::from(format!("{:#06x}", fi.device_id)),
        v["device_id"].clone(),
    );
    let bdf = v["device"].as_str().unwrap_or("").to_string();
    if bdf.is_empty() {
        c.fail(format!(
            "device: expected a PCI address, got {}",
            v["device"]
        ));
    }
    c.finish()?;
    Ok(bdf)
}

pub fn bar_pattern(
    h: &mut Host,
    e: &Expected,
    bdf: &str,
    pdfid: u16,
    mode: &str,
) -> Result<(), String> {
    let v = selftest_json(h, &format!("bar --device {bdf} {mode}"), CMD_TIMEOUT_SHORT)?;
    let want = e.function(pdfid).map_or(0, |f| f.bar2_bytes);
    expect_eq(
        &format!("{}: BAR2 size of {bdf} ({pdfid:#06x})", h.name),
        Some(want),
        v.get("bytes").and_then(Value::as_u64),
    )
}

pub fn owners(pairs: &[(u16, usize)]) -> Owners {
    pairs.iter().copied().collect()
}

/// Hosts 0 and 1, for a scenario that needs both (`need` says so when there is no h1).
pub fn two_hosts<'a>(
    hosts: &'a mut [Host],
    need: &str,
) -> Result<(&'a mut Host, &'a mut Host), String> {
    let (h0, rest) = hosts.split_first_mut().ok_or("no hosts")?;
    let h1 = rest.first_mut().ok_or(need)?;
    Ok((h0, h1))
}

/// The fabric's first nvme endpoint: its PF's PDFID and name.
pub fn drive(f: &Fabric) -> Result<(u16, String), String> {
    f.expected
        .endpoints
        .iter()
        .find(|e| e.kind == "nvme")
        .map(|e| (e.pdfid(0), e.name.clone()))
        .ok_or_else(|| {
            "the fabric configuration declares no endpoint of kind \"nvme\"; run the nvme \
             scenarios with --emu-config tools/pcifab-harness/fabric-nvme.toml"
                .to_string()
        })
}

/// `pcifab CALL` (exit `code`, JSON `v`, output `out`) failed with `EOPNOTSUPP` and a
/// message that names the missing firmware feature.
pub fn refused_by_firmware(c: &mut Checks, call: &str, code: i64, v: &Value, out: &str) {
    c.eq(
        &format!("`pcifab {call}` errno"),
        Some(EOPNOTSUPP),
        v["error"]["errno"].as_i64(),
    );
    if code == 0 || !out.contains("firmware") {
        c.fail(format!(
            "`pcifab {call}`: expected a failure naming the missing firmware feature, \
             got exit {code}: {}",
            out.trim()
        ));
    }
}

/// Under the PAX dialect, a scenario built on pcifab's firmware extensions checks instead
/// that every call it would make is refused cleanly: `EOPNOTSUPP`, a message that names the
/// missing firmware feature, no route in the emulator, and a clean kernel log; the
/// scenario is then reported as refusal only ([`Fabric::refusal_only`]). `Ok(false)` under
/// the extended dialect: the scenario goes on with its own checks.
pub fn refused_without_extensions(f: &mut Fabric, calls: &[&str]) -> Result<bool, String> {
    if f.dialect() != Dialect::Pax {
        return Ok(false);
    }
    compose_begin(f)?;
    let emu = f.emu();
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    let mut c = Checks::new(&format!("{}: without the firmware's extensions", h.name));
    for call in calls {
        let (code, v, out) = pcifab_cmd(h, call)?;
        refused_by_firmware(&mut c, call, code, &v, &out);
    }
    let routes = emu.request(&format!("routes {}", h.name))?;
    let none = routes
        .get("routes")
        .and_then(Value::as_array)
        .is_some_and(|r| r.is_empty());
    if !none {
        c.fail(format!("emulator routes after the refused calls: {routes}"));
    }
    c.finish()?;
    dmesg_clean(h)?;
    f.refusal_only("PAX firmware, no extensions: each call refused with EOPNOTSUPP");
    Ok(true)
}

impl Fabric {
    /// The firmware dialect of this run.
    pub fn dialect(&self) -> Dialect {
        self.expected.dialect
    }
}
