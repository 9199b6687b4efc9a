// SPDX-License-Identifier: GPL-2.0-only
//! Test scenarios run in the booted guests.
//!
//! Each scenario is a plain function over the [`Fabric`]; add one by writing
//! the function and listing it in [`all`]. Scenarios set up their own
//! preconditions (module loaded or not), so any one of them can run alone
//! with `--filter`.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::Expected;
use crate::fabric::{EmuControl, Fabric, Host};

pub type ScenarioFn = fn(&mut Fabric) -> Result<(), String>;

pub struct Scenario {
    pub name: &'static str,
    /// Time budget for the whole scenario; commands are cut to fit it.
    pub timeout: Duration,
    pub run: ScenarioFn,
}

/// Every scenario, in the order `test` runs them.
pub fn all() -> Vec<Scenario> {
    let s = |name, secs, run| Scenario {
        name,
        timeout: Duration::from_secs(secs),
        run,
    };
    vec![
        s("agent answers in every host", 60, agent_answers),
        s("pcifab binds the MEP in every host", 120, pcifab_binds),
        s(
            "sysfs identity matches the emulator config",
            120,
            sysfs_identity,
        ),
        s(
            "identity ioctl matches the emulator config",
            120,
            ioctl_identity,
        ),
        s(
            "20 load/unload cycles leave dmesg clean",
            600,
            load_unload_cycles,
        ),
        s(
            "in-tree switchtec driver binds the emulated MEP",
            180,
            switchtec_binds,
        ),
        s(
            "MRPC echo: random sizes, byte exact, in every host",
            600,
            echo_random,
        ),
        s(
            "MRPC echo: four processes at once, no mixing or loss",
            300,
            echo_concurrent,
        ),
        s(
            "ioctl bad-input table: rejected calls change nothing",
            180,
            abi_table,
        ),
        s(
            "unprivileged caller: read-only MRPC only",
            120,
            unprivileged,
        ),
        s(
            "fault mrpc-hang: ETIMEDOUT, EINTR, then the mailbox recovers",
            180,
            fault_hang,
        ),
        s(
            "fault mrpc-error: status 0xff with the return value",
            120,
            fault_error,
        ),
        s(
            "fault drop-irq: the 50 ms poll completes commands",
            120,
            fault_drop_irq,
        ),
        s("fault delay: completion after the delay", 120, fault_delay),
        s(
            "fault bad-length: oversize length claims pass cleanly",
            120,
            fault_bad_length,
        ),
        s("fault firmware-dead: EIO within 1 s", 120, fault_dead),
        s("rmmod pcifab in every host", 120, rmmod_pcifab),
        s(
            "MEP hot removal with a command in flight: ENODEV",
            240,
            hot_removal,
        ),
    ]
}

// ---------------------------------------------------------------- helpers

/// `Err("what: expected X, got Y")` unless equal.
pub fn expect_eq<T: PartialEq + Debug>(what: &str, expected: T, got: T) -> Result<(), String> {
    if expected == got {
        Ok(())
    } else {
        Err(format!("{what}: expected {expected:?}, got {got:?}"))
    }
}

/// Collects every mismatch of a check list instead of stopping at the first.
pub struct Checks {
    prefix: String,
    errors: Vec<String>,
}

impl Checks {
    pub fn new(prefix: &str) -> Self {
        Checks {
            prefix: prefix.to_string(),
            errors: Vec::new(),
        }
    }

    pub fn eq<T: PartialEq + Debug>(&mut self, what: &str, expected: T, got: T) {
        if let Err(e) = expect_eq(what, expected, got) {
            self.errors.push(e);
        }
    }

    /// Like [`Checks::eq`], showing JSON values as JSON text.
    pub fn eq_json(&mut self, what: &str, expected: Value, got: Value) {
        if expected != got {
            self.errors
                .push(format!("{what}: expected {expected}, got {got}"));
        }
    }

    /// Records a failed check described by `msg`.
    pub fn fail(&mut self, msg: String) {
        self.errors.push(msg);
    }

    pub fn finish(self) -> Result<(), String> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(format!("{}: {}", self.prefix, self.errors.join("; ")))
        }
    }
}

const PCIFAB_KO: &str = "/lib/modules/pcifab.ko";
const SWITCHTEC_KO: &str = "/lib/modules/switchtec.ko";
/// Shown for a device without a driver.
const NO_DRIVER: &str = "<no driver>";
/// Lines of dmesg that fail a scenario (grep -iE).
const DMESG_BAD: &str = "warning|bug:|oops|call trace|refcount|leak|general protection";

/// BDF of the MEP: vendor 0x11f8, class 0x058000, function 1 behind the switch.
pub fn find_mep(h: &mut Host) -> Result<String, String> {
    let out = h.run_ok(
        r#"for d in /sys/bus/pci/devices/*; do
  if [ "$(cat $d/vendor)" = 0x11f8 ] && [ "$(cat $d/class)" = 0x058000 ]; then echo "${d##*/}"; fi
done"#,
    )?;
    let found: Vec<&str> = out.split_whitespace().collect();
    match found.as_slice() {
        [bdf] if bdf.ends_with(".1") => Ok(bdf.to_string()),
        [bdf] => Err(format!(
            "{}: MEP {bdf}: expected function 1 (beside the upstream port at .0), got function {}",
            h.name,
            bdf.rsplit('.').next().unwrap_or("?")
        )),
        [] => Err(format!(
            "{}: no PCI device with vendor 0x11f8 and class 0x058000 \
             (expected the emulated MEP at rp0 00.1; is the emulator serving it? see the console log)",
            h.name
        )),
        many => Err(format!(
            "{}: expected one MEP, found {}: {}",
            h.name,
            many.len(),
            many.join(" ")
        )),
    }
}

/// Name of the driver bound to `bdf`, if any.
pub fn driver_of(h: &mut Host, bdf: &str) -> Result<Option<String>, String> {
    let o = h.run(&format!("readlink /sys/bus/pci/devices/{bdf}/driver"))?;
    if o.code != 0 {
        return Ok(None);
    }
    Ok(o.out.trim().rsplit('/').next().map(str::to_string))
}

pub fn module_loaded(h: &mut Host, module: &str) -> Result<bool, String> {
    Ok(h.run(&format!("[ -d /sys/module/{module} ]"))?.code == 0)
}

/// Waits up to `secs` for `test_expr` (a `[ ... ]` test) to hold.
fn wait_for(h: &mut Host, test_expr: &str, secs: u32) -> Result<bool, String> {
    let script = format!(
        "i=0; while ! {test_expr} && [ $i -lt {} ]; do sleep 0.1; i=$((i+1)); done; {test_expr}",
        secs * 10
    );
    Ok(h.run(&script)?.code == 0)
}

/// Loads pcifab (unloading switchtec first) unless it is loaded.
pub fn ensure_pcifab(h: &mut Host) -> Result<(), String> {
    if module_loaded(h, "switchtec")? {
        h.run_ok("rmmod switchtec")?;
    }
    if !module_loaded(h, "pcifab")? {
        h.run_ok(&format!("insmod {PCIFAB_KO}"))?;
    }
    Ok(())
}

/// The MEP is bound to pcifab and /dev/pcifab0 is a character device.
pub fn check_bound_pcifab(h: &mut Host) -> Result<(), String> {
    let bdf = find_mep(h)?;
    let drv = driver_of(h, &bdf)?;
    expect_eq(
        &format!("{}: driver of MEP {bdf}", h.name),
        "pcifab",
        drv.as_deref().unwrap_or(NO_DRIVER),
    )?;
    if !wait_for(h, "[ -c /dev/pcifab0 ]", 5)? {
        let ls = h.run("ls -l /dev/pcifab* 2>&1")?.out;
        return Err(format!(
            "{}: /dev/pcifab0: expected a character device, got: {}",
            h.name,
            ls.trim()
        ));
    }
    Ok(())
}

/// dmesg has no line matching [`DMESG_BAD`].
pub fn dmesg_clean(h: &mut Host) -> Result<(), String> {
    let o = h.run(&format!("dmesg | grep -iE '{DMESG_BAD}'"))?;
    match o.code {
        1 => Ok(()),
        0 => Err(format!(
            "{}: dmesg: expected no line matching /{DMESG_BAD}/i, got:\n{}",
            h.name,
            o.out
                .trim_end()
                .lines()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        )),
        c => Err(format!(
            "{}: dmesg | grep failed with {c}: {}",
            h.name,
            o.out.trim()
        )),
    }
}

/// Reads sysfs attributes of `dir` as name -> value (trailing newline removed).
fn read_attrs(h: &mut Host, dir: &str, names: &[&str]) -> Result<Vec<(String, String)>, String> {
    let script = format!(
        "cd {dir} || {{ echo \"{dir} missing; siblings: $(ls {dir}/.. 2>&1)\"; exit 1; }}\n\
         for f in {}; do v=$(cat \"$f\" 2>&1); printf '%s=%s\\n' \"$f\" \"$v\"; done",
        names.join(" ")
    );
    let out = h.run_ok(&script)?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn attr<'a>(attrs: &'a [(String, String)], name: &str) -> &'a str {
    attrs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or("<missing>")
}

// -------------------------------------------------------------- scenarios

fn agent_answers(f: &mut Fabric) -> Result<(), String> {
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

fn pcifab_binds(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        if module_loaded(h, "switchtec")? {
            h.run_ok("rmmod switchtec")?;
        }
        if !module_loaded(h, "pcifab")? {
            h.run_ok(&format!("insmod {PCIFAB_KO}"))?;
        }
        check_bound_pcifab(h)
    })
}

fn sysfs_identity(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, e| {
        ensure_pcifab(h)?;
        let names = [
            "fw_version",
            "device_id",
            "device_version",
            "vendor_id",
            "product_id",
            "product_revision",
            "partition",
            "partition_count",
        ];
        let a = read_attrs(h, "/sys/class/misc/pcifab0", &names)?;
        let mut c = Checks::new(&format!("{}: /sys/class/misc/pcifab0", h.name));
        c.eq(
            "fw_version",
            format!("{:08x}", e.fw_version).as_str(),
            attr(&a, "fw_version"),
        );
        c.eq(
            "device_id",
            format!("{:#06x}", e.device_id).as_str(),
            attr(&a, "device_id"),
        );
        c.eq(
            "device_version",
            format!("{:x}", e.device_version).as_str(),
            attr(&a, "device_version"),
        );
        c.eq("vendor_id", e.vendor_id.trim_end(), attr(&a, "vendor_id"));
        c.eq(
            "product_id",
            e.product_id.trim_end(),
            attr(&a, "product_id"),
        );
        c.eq(
            "product_revision",
            e.product_revision.trim_end(),
            attr(&a, "product_revision"),
        );
        c.eq(
            "partition",
            h.index.to_string().as_str(),
            attr(&a, "partition"),
        );
        c.eq(
            "partition_count",
            e.partition_count().to_string().as_str(),
            attr(&a, "partition_count"),
        );
        c.finish()
    })
}

/// Compares `pcifab info --json` output with the configuration.
fn check_info_json(h: &Host, e: &Expected, text: &str) -> Result<(), String> {
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

fn ioctl_identity(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, e| {
        ensure_pcifab(h)?;
        let out = h.run_ok("pcifab info --json")?;
        check_info_json(h, e, &out)
    })
}

fn load_unload_cycles(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        ensure_pcifab(h)?;
        h.run_ok("dmesg -c >/dev/null")?;
        h.run_ok_timeout(
            &format!(
                "i=0; while [ $i -lt 20 ]; do\n\
                 rmmod pcifab || {{ echo \"rmmod failed in cycle $i\"; exit 1; }}\n\
                 insmod {PCIFAB_KO} || {{ echo \"insmod failed in cycle $i\"; exit 1; }}\n\
                 i=$((i+1)); done"
            ),
            Duration::from_secs(500),
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
    if !wait_for(h, &format!("[ -d {dir} ]"), 5)? {
        let log = h.run("dmesg | tail -n 20")?.out;
        return Err(format!(
            "{}: {dir}: expected to appear after insmod switchtec, got nothing; dmesg:\n{}",
            h.name,
            log.trim_end()
        ));
    }
    let bdf = find_mep(h)?;
    let drv = driver_of(h, &bdf)?;
    expect_eq(
        &format!("{}: driver of MEP {bdf}", h.name),
        "switchtec",
        drv.as_deref().unwrap_or(NO_DRIVER),
    )?;
    let names = [
        "fw_version",
        "device_version",
        "vendor_id",
        "product_id",
        "product_revision",
        "partition",
        "partition_count",
        "component_vendor",
        "component_id",
    ];
    let a = read_attrs(h, dir, &names)?;
    let mut c = Checks::new(&format!("{}: {dir}", h.name));
    c.eq(
        "fw_version",
        format!("{:08x}", e.fw_version).as_str(),
        attr(&a, "fw_version"),
    );
    c.eq(
        "device_version",
        format!("{:x}", e.device_version).as_str(),
        attr(&a, "device_version"),
    );
    c.eq("vendor_id", e.vendor_id.trim_end(), attr(&a, "vendor_id"));
    c.eq(
        "product_id",
        e.product_id.trim_end(),
        attr(&a, "product_id"),
    );
    c.eq(
        "product_revision",
        e.product_revision.trim_end(),
        attr(&a, "product_revision"),
    );
    c.eq(
        "partition",
        h.index.to_string().as_str(),
        attr(&a, "partition"),
    );
    c.eq(
        "partition_count",
        e.partition_count().to_string().as_str(),
        attr(&a, "partition_count"),
    );
    // Gen4 parts have no component_* fields; the driver says so.
    c.eq("component_vendor", "none", attr(&a, "component_vendor"));
    c.eq("component_id", "none", attr(&a, "component_id"));
    c.finish()?;
    h.run_ok("rmmod switchtec")?;
    dmesg_clean(h)?;
    h.run_ok(&format!("insmod {PCIFAB_KO}"))?;
    check_bound_pcifab(h)
}

fn switchtec_binds(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, e| {
        let result = switchtec_inner(h, e);
        if result.is_err() {
            // Leave the guest as later scenarios expect it: pcifab loaded.
            let _ = h.run(&format!(
                "[ -d /sys/module/switchtec ] && rmmod switchtec; \
                 [ -d /sys/module/pcifab ] || insmod {PCIFAB_KO}"
            ));
        }
        result
    })
}

fn rmmod_pcifab(f: &mut Fabric) -> Result<(), String> {
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

// ------------------------------------------------ the management path

/// MRPC echo round trips per host in `echo_random` (sized for TCG: see testing.rst).
const ECHO_COUNT: u64 = 5000;
/// Echoes per process in `echo_concurrent`.
const CONCURRENT_COUNT: u64 = 250;
const CONCURRENT_PROCS: u64 = 4;

/// Loads pcifab if needed and empties the kernel log, so the scenario's own end check sees
/// only what the scenario caused.
fn begin(h: &mut Host) -> Result<(), String> {
    ensure_pcifab(h)?;
    check_bound_pcifab(h)?;
    h.run_ok("dmesg -c >/dev/null")?;
    Ok(())
}

/// Runs a `pcifab-selftest` command line and returns its JSON result line.
///
/// Stdout and stderr arrive merged; the result is the line starting with `{"test":`.
fn selftest_json(h: &mut Host, args: &str, timeout: Duration) -> Result<Value, String> {
    let o = h.run_timeout(&format!("pcifab-selftest {args}"), timeout)?;
    let line = o
        .out
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"test\":"))
        .map(str::to_string);
    if o.code != 0 {
        // The failure lines, not the whole table.
        let lines: Vec<&str> = o
            .out
            .lines()
            .filter(|l| !l.starts_with("{\"test\":"))
            .collect();
        let mut shown: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.contains("FAIL"))
            .collect();
        if shown.is_empty() {
            shown = lines[lines.len().saturating_sub(20)..].to_vec();
        }
        return Err(format!(
            "{}: `pcifab-selftest {args}` exited with {} (expected 0):\n{}",
            h.name,
            o.code,
            shown.join("\n")
        ));
    }
    let line = line.ok_or_else(|| {
        format!(
            "{}: `pcifab-selftest {args}` printed no JSON result line; output:\n{}",
            h.name,
            o.out.trim_end()
        )
    })?;
    serde_json::from_str(&line).map_err(|e| {
        format!(
            "{}: bad JSON from pcifab-selftest {args}: {e}: {line}",
            h.name
        )
    })
}

fn num_field(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// `pcifab stats --json` as a JSON object.
fn stats(h: &mut Host) -> Result<Value, String> {
    let out = h.run_ok("pcifab stats --json")?;
    serde_json::from_str(out.trim())
        .map_err(|e| format!("{}: `pcifab stats --json`: {e}: {out:?}", h.name))
}

fn stat(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(u64::MAX)
}

fn echo_random(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        begin(h)?;
        let before = stats(h)?;
        let t = Instant::now();
        let v = selftest_json(
            h,
            &format!(
                "echo --count {ECHO_COUNT} --seed {}",
                0x5eed + h.index as u64
            ),
            Duration::from_secs(540),
        )?;
        let after = stats(h)?;
        h.log_note(&format!(
            "echo: {ECHO_COUNT} round trips in {:.1} s (guest {:.1} s, {:.0}/s, p50 {} us, \
             p99 {} us)",
            t.elapsed().as_secs_f64(),
            num_field(&v, "secs"),
            num_field(&v, "rate"),
            num_field(&v, "p50_us"),
            num_field(&v, "p99_us")
        ));
        let mut c = Checks::new(&format!("{}: echo", h.name));
        c.eq(
            "round trips reported",
            Some(ECHO_COUNT),
            v.get("count").and_then(Value::as_u64),
        );
        c.eq(
            "STATS mrpc_commands delta",
            ECHO_COUNT,
            stat(&after, "mrpc_commands").wrapping_sub(stat(&before, "mrpc_commands")),
        );
        c.finish()?;
        dmesg_clean(h)
    })
}

fn echo_concurrent(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        begin(h)?;
        let v = selftest_json(
            h,
            &format!(
                "concurrent --procs {CONCURRENT_PROCS} --count {CONCURRENT_COUNT} --seed {}",
                h.index + 1
            ),
            Duration::from_secs(240),
        )?;
        h.log_note(&format!("concurrent: {v}"));
        expect_eq(
            &format!("{}: STATS mrpc_commands delta", h.name),
            Some(CONCURRENT_PROCS * CONCURRENT_COUNT),
            v.get("mrpc_commands_delta").and_then(Value::as_u64),
        )?;
        dmesg_clean(h)
    })
}

fn abi_table(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        begin(h)?;
        let v = selftest_json(h, "abi", Duration::from_secs(120))?;
        let cases = v.get("cases").and_then(Value::as_u64).unwrap_or(0);
        if cases < 60 {
            return Err(format!(
                "{}: abi: expected at least 60 cases, got {cases}: {v}",
                h.name
            ));
        }
        dmesg_clean(h)
    })
}

fn unprivileged(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        begin(h)?;
        h.run_ok("chmod 666 /dev/pcifab0")?;
        let r = selftest_json(h, "unpriv", Duration::from_secs(60));
        let restore = h.run_ok("chmod 600 /dev/pcifab0");
        let v = r?;
        restore?;
        h.log_note(&format!("unpriv: {v}"));
        dmesg_clean(h)
    })
}

/// Injects `fault` into host `h`'s MEP, runs `body`, and clears the fault whatever happened.
fn with_fault(
    emu: &EmuControl,
    h: &mut Host,
    fault: &str,
    body: impl FnOnce(&mut Host) -> Result<(), String>,
) -> Result<(), String> {
    emu.request(&format!("fault {} {fault}", h.name))
        .map_err(|e| format!("{}: {e}", h.name))?;
    let r = body(h);
    let cleared = emu
        .request(&format!("fault clear {}", h.name))
        .map_err(|e| format!("{}: {e}", h.name));
    r.and(cleared.map(|_| ()))
}

/// After a fault: a 64-byte echo works again and dmesg is clean.
fn recovered(h: &mut Host) -> Result<(), String> {
    selftest_json(h, "echo --count 20 --size 64", CMD_TIMEOUT_SHORT)
        .map_err(|e| format!("after `fault clear`: {e}"))?;
    dmesg_clean(h)
}

const CMD_TIMEOUT_SHORT: Duration = Duration::from_secs(60);

/// Runs `pcifab-selftest mrpc ...`; returns (errno name, elapsed ms, result).
fn one_mrpc(h: &mut Host, args: &str) -> Result<(String, f64, Value), String> {
    let v = selftest_json(h, &format!("mrpc {args}"), CMD_TIMEOUT_SHORT)?;
    let errno = v
        .get("errno")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    Ok((errno, num_field(&v, "elapsed_ms"), v))
}

/// Starts `pcifab-selftest hold` in the background; waits until the emulator saw its command.
fn start_hold(emu: &EmuControl, h: &mut Host, secs: u32) -> Result<(), String> {
    let before = emu.mrpc_commands(&h.name)?;
    h.run_ok(&format!(
        "rm -f /tmp/hold.out; pcifab-selftest hold --seconds {secs} >/tmp/hold.out 2>&1 & \
         echo $! >/tmp/hold.pid"
    ))?;
    let t = Instant::now();
    while emu.mrpc_commands(&h.name)? == before {
        if t.elapsed() > Duration::from_secs(20) {
            let out = h.run("cat /tmp/hold.out")?.out;
            return Err(format!(
                "{}: the held command never reached the emulator within 20 s; hold output: {}",
                h.name,
                out.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Waits (at most `secs`) for the background `hold` to end; returns its JSON result.
fn wait_hold(h: &mut Host, secs: u32) -> Result<Value, String> {
    let o = h.run_timeout(
        &format!(
            "i=0; while kill -0 $(cat /tmp/hold.pid) 2>/dev/null && [ $i -lt {} ]; do \
             sleep 0.1; i=$((i+1)); done; \
             if kill -0 $(cat /tmp/hold.pid) 2>/dev/null; then echo STILL-RUNNING; fi; \
             cat /tmp/hold.out",
            secs * 10
        ),
        Duration::from_secs(u64::from(secs) + 30),
    )?;
    if o.out.contains("STILL-RUNNING") {
        return Err(format!(
            "{}: the held command did not end within {secs} s (hang); output so far: {}",
            h.name,
            o.out.trim()
        ));
    }
    let line = o
        .out
        .lines()
        .find(|l| l.starts_with("{\"test\":"))
        .ok_or_else(|| format!("{}: hold printed no result: {}", h.name, o.out.trim()))?;
    serde_json::from_str(line).map_err(|e| format!("{}: hold: {e}: {line}", h.name))
}

fn fault_hang(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        let before = stats(h)?;
        with_fault(&emu, h, "mrpc-hang", |h| {
            // The caller's own timeout, through the CLI.
            let t = Instant::now();
            let o = h.run("pcifab mrpc 0x41 00 --timeout 1000")?;
            let secs = t.elapsed().as_secs_f64();
            let mut c = Checks::new(&format!("{}: mrpc-hang", h.name));
            c.eq("`pcifab mrpc 0x41 00 --timeout 1000` exit code", 1, o.code);
            if !o.out.contains("Connection timed out") && !o.out.contains("timed out") {
                c.fail(format!(
                    "CLI message: expected ETIMEDOUT, got {:?}",
                    o.out.trim()
                ));
            }
            if secs > 10.0 {
                c.fail(format!("CLI took {secs:.1} s for a 1 s timeout"));
            }
            // The same through the ioctl, timed inside the guest.
            let (e, ms, _) = one_mrpc(h, "0x41 --in 0102 --out-len 2 --timeout 1500")?;
            c.eq("errno with timeout 1500 ms", "ETIMEDOUT", e.as_str());
            if !(1400.0..=3500.0).contains(&ms) {
                c.fail(format!("ETIMEDOUT after {ms} ms, expected about 1500 ms"));
            }
            // A signal ends the wait with EINTR.
            start_hold(&emu, h, 30)?;
            // Probe (logged, not asserted): does STATS wait for the command in flight?
            let probe = h.run_ok(
                "rm -f /tmp/st.out; pcifab stats --json >/tmp/st.out 2>&1 & sleep 2; \
                 if [ -s /tmp/st.out ]; then echo answered; else echo blocked; fi",
            )?;
            h.log_note(&format!(
                "PCIFAB_IOCTL_STATS while a command is in flight: {} after 2 s",
                probe.trim()
            ));
            h.run_ok("kill -USR1 $(cat /tmp/hold.pid)")?;
            let v = wait_hold(h, 10)?;
            c.eq(
                "errno of a held command after SIGUSR1",
                Some("EINTR"),
                v.get("errno").and_then(Value::as_str),
            );
            c.finish()
        })?;
        let after = stats(h)?;
        // Two callers timed out. The driver also counts every 100 ms grace a later caller
        // gives the abandoned command (reported as a driver bug), so only a floor holds.
        let delta = stat(&after, "mrpc_timeouts").wrapping_sub(stat(&before, "mrpc_timeouts"));
        if delta < 2 {
            return Err(format!(
                "{}: STATS mrpc_timeouts: expected to grow by at least 2, grew by {delta}",
                h.name
            ));
        }
        h.log_note(&format!(
            "mrpc-hang: mrpc_timeouts grew by {delta} for 2 timed-out calls"
        ));
        recovered(h)
    })
}

fn fault_error(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        with_fault(&emu, h, "mrpc-error 0x64005", |h| {
            let o = h.run("pcifab mrpc 0x41 0a0b --out-len 2 --json")?;
            let mut c = Checks::new(&format!("{}: mrpc-error", h.name));
            c.eq("CLI exit code", 1, o.code);
            let line = o.out.lines().find(|l| l.starts_with('{')).unwrap_or("");
            let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
            c.eq_json(
                "status",
                Value::from(255),
                v.get("status").cloned().unwrap_or_default(),
            );
            c.eq_json(
                "ret_value",
                Value::from("0x64005"),
                v.get("ret_value").cloned().unwrap_or_default(),
            );
            if !o.out.contains("return value 0x64005") {
                c.fail(format!(
                    "CLI message: expected to name return value 0x64005, got {:?}",
                    o.out.trim()
                ));
            }
            let (e, _, v) = one_mrpc(h, "0x41 --in 01 --out-len 1")?;
            c.eq(
                "ioctl errno (a firmware error is no ioctl error)",
                "ok",
                e.as_str(),
            );
            c.eq_json("ioctl status", Value::from(255), v["status"].clone());
            c.eq_json(
                "ioctl ret_value",
                Value::from("0x64005"),
                v["ret_value"].clone(),
            );
            c.finish()
        })?;
        recovered(h)
    })
}

fn fault_drop_irq(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        // Without a delay the emulator finishes inside the write of the command register, so
        // the first status read already sees DONE; with one, only the 50 ms poll can notice.
        emu.request(&format!("fault {} delay 200", h.name))
            .map_err(|e| format!("{}: {e}", h.name))?;
        let before = stats(h)?;
        with_fault(&emu, h, "drop-irq", |h| {
            let v = selftest_json(h, "echo --count 10 --size 64", CMD_TIMEOUT_SHORT)?;
            h.log_note(&format!("drop-irq + delay 200: {v}"));
            let (p50, max) = (num_field(&v, "p50_us"), num_field(&v, "max_us"));
            // 200 ms firmware time + one 50 ms poll interval; generous for TCG.
            if !(190_000.0..=260_000.0).contains(&p50) || max > 600_000.0 {
                return Err(format!(
                    "{}: drop-irq + delay 200: p50 {p50} us, slowest {max} us; expected each \
                     echo to be picked up by the 50 ms poll within about 250 ms",
                    h.name
                ));
            }
            Ok(())
        })?;
        let after = stats(h)?;
        let d = |k| stat(&after, k).wrapping_sub(stat(&before, k));
        let mut c = Checks::new(&format!("{}: drop-irq", h.name));
        c.eq("STATS mrpc_commands delta", 10, d("mrpc_commands"));
        c.eq(
            "STATS mrpc_completions delta (no interrupt came)",
            0,
            d("mrpc_completions"),
        );
        c.eq("STATS mrpc_timeouts delta", 0, d("mrpc_timeouts"));
        c.finish()?;
        recovered(h)
    })
}

fn fault_delay(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        with_fault(&emu, h, "delay 700", |h| {
            let (e, ms, v) = one_mrpc(h, "0x41 --in 0badcafe --out-len 4")?;
            let mut c = Checks::new(&format!("{}: delay 700", h.name));
            c.eq("errno", "ok", e.as_str());
            c.eq_json("output", Value::from("0badcafe"), v["output"].clone());
            if !(650.0..=2500.0).contains(&ms) {
                c.fail(format!("completed after {ms} ms, expected about 700 ms"));
            }
            // Longer than the caller's timeout: ETIMEDOUT, not EIO (the firmware is alive).
            let (e, _, _) = one_mrpc(h, "0x41 --in 01 --out-len 1 --timeout 300")?;
            c.eq("errno with timeout 300 ms < delay", "ETIMEDOUT", e.as_str());
            c.finish()
        })?;
        recovered(h)
    })
}

fn fault_bad_length(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        with_fault(&emu, h, "bad-length", |h| {
            // TOPO_INFO_DUMP: START, DATA_GET (claims 512 dwords), FINISH.
            let mut c = Checks::new(&format!("{}: bad-length", h.name));
            let o = h.run("pcifab mrpc 0x82 01 --out-len 4")?;
            c.eq("TOPO_INFO_DUMP START exit code", 0, o.code);
            let o = h.run("pcifab mrpc 0x82 03000000 --out-len 1024 --json")?;
            c.eq("TOPO_INFO_DUMP DATA_GET exit code", 0, o.code);
            let v: Value = serde_json::from_str(o.out.trim()).unwrap_or(Value::Null);
            let out = v.get("output").and_then(Value::as_str).unwrap_or("");
            c.eq("output hex digits (1024 bytes, no more)", 2048, out.len());
            c.eq(
                "data_len_dw claimed (LE 512)",
                "0002",
                out.get(4..8).unwrap_or(""),
            );
            let o = h.run("pcifab mrpc 0x82 04 --out-len 4")?;
            c.eq("TOPO_INFO_DUMP FINISH exit code", 0, o.code);
            c.finish()
        })?;
        recovered(h)
    })
}

fn fault_dead(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        let before = stats(h)?;
        with_fault(&emu, h, "firmware-dead", |h| {
            let (e, ms, _) = one_mrpc(h, "0x41 --in 01 --out-len 1 --timeout 10000")?;
            let mut c = Checks::new(&format!("{}: firmware-dead", h.name));
            c.eq("errno", "EIO", e.as_str());
            if ms > 1500.0 {
                c.fail(format!("EIO after {ms} ms, expected within about 1 s"));
            }
            let o = h.run("pcifab mrpc 0x41 00")?;
            c.eq("CLI exit code", 1, o.code);
            if !o.out.contains("not running") {
                c.fail(format!(
                    "CLI message: expected to say the firmware is not running, got {:?}",
                    o.out.trim()
                ));
            }
            c.finish()
        })?;
        let after = stats(h)?;
        expect_eq(
            &format!("{}: STATS mrpc_firmware_dead delta", h.name),
            2,
            stat(&after, "mrpc_firmware_dead").wrapping_sub(stat(&before, "mrpc_firmware_dead")),
        )?;
        recovered(h)
    })
}

/// How the hot-removal scenario removes the MEP (see testing.rst).
fn remove_mep(h: &mut Host, bdf: &str) -> Result<String, String> {
    match h
        .qmp()?
        .execute("device_del", Some(serde_json::json!({"id": "mep"})))
    {
        Ok(_) => Ok("QMP device_del".into()),
        Err(qmp_err) => {
            h.log_note(&format!(
                "QMP device_del mep failed: {qmp_err}; using sysfs remove"
            ));
            h.run_ok(&format!("echo 1 > /sys/bus/pci/devices/{bdf}/remove"))?;
            Ok(format!("sysfs remove (QMP device_del refused: {qmp_err})"))
        }
    }
}

fn hot_removal(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    f.each_host(|h, _| {
        begin(h)?;
        let bdf = find_mep(h)?;
        let r = with_fault(&emu, h, "mrpc-hang", |h| {
            start_hold(&emu, h, 40)?;
            let t = Instant::now();
            let how = remove_mep(h, &bdf)?;
            let v = wait_hold(h, 30)?;
            h.log_note(&format!(
                "hot removal by {how}: held command ended after {:.1} s: {v}",
                t.elapsed().as_secs_f64()
            ));
            expect_eq(
                &format!(
                    "{}: errno of the held command after removal ({how})",
                    h.name
                ),
                Some("ENODEV"),
                v.get("errno").and_then(Value::as_str),
            )
        });
        let gone = h.run(&format!("[ -e /sys/bus/pci/devices/{bdf} ]"))?.code != 0;
        let rmmod = h.run_ok("rmmod pcifab");
        let dmesg = dmesg_clean(h);
        // Bring a sysfs-removed MEP back for anything run after this.
        let _ = h.run("echo 1 > /sys/bus/pci/rescan");
        r?;
        expect_eq(
            &format!("{}: MEP {bdf} gone after removal", h.name),
            true,
            gone,
        )?;
        rmmod?;
        dmesg
    })
}

// ------------------------------------------------------------------ bench

/// Round trips and payload size of `pcifab-harness bench`.
pub const BENCH_COUNT: u64 = 2000;
pub const BENCH_SIZE: usize = 64;

/// One side of the benchmark.
pub struct BenchResult {
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

fn bench_run(h: &mut Host, sub: &str) -> Result<BenchResult, String> {
    // A short warm-up (page cache, first interrupts), then the measured run.
    selftest_json(
        h,
        &format!("{sub} --count 100 --size {BENCH_SIZE}"),
        Duration::from_secs(120),
    )?;
    let v = selftest_json(
        h,
        &format!("{sub} --count {BENCH_COUNT} --size {BENCH_SIZE} --seed 1"),
        Duration::from_secs(600),
    )?;
    h.log_note(&format!("bench {sub}: {v}"));
    Ok(BenchResult {
        rate: num_field(&v, "rate"),
        p50_us: num_field(&v, "p50_us"),
        p99_us: num_field(&v, "p99_us"),
    })
}

/// MRPC echo through pcifab's ioctl, then through the C driver's /dev/switchtec0, in the
/// same guest against the same emulated MEP. Leaves pcifab loaded.
pub fn bench(h: &mut Host) -> Result<(BenchResult, BenchResult), String> {
    ensure_pcifab(h)?;
    check_bound_pcifab(h)?;
    let pcifab = bench_run(h, "echo")?;
    h.run_ok("rmmod pcifab")?;
    h.run_ok(&format!("insmod {SWITCHTEC_KO}"))?;
    let r = if wait_for(h, "[ -c /dev/switchtec0 ]", 10)? {
        bench_run(h, "switchtec-echo")
    } else {
        Err(format!(
            "{}: /dev/switchtec0 did not appear after insmod switchtec",
            h.name
        ))
    };
    let _ = h.run(&format!(
        "rmmod switchtec; [ -d /sys/module/pcifab ] || insmod {PCIFAB_KO}"
    ));
    Ok((pcifab, r?))
}

// ------------------------------------------------------------- self-test

/// Checks of the harness and agent themselves (`pcifab-harness selftest`).
/// They need no driver; the last one leaves host 0 unusable on purpose.
pub fn selftest() -> Vec<Scenario> {
    let s = |name, secs, run| Scenario {
        name,
        timeout: Duration::from_secs(secs),
        run,
    };
    vec![
        s(
            "agent reports exit codes and merged output",
            30,
            st_exit_codes,
        ),
        s("agent output is binary-safe and large", 60, st_binary),
        s(
            "agent kills a timed-out command's process group",
            30,
            st_timeout,
        ),
        s(
            "a stopped guest fails the command and is fenced off",
            60,
            st_hung_guest,
        ),
    ]
}

fn st_exit_codes(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        let o = h.run("echo out; echo err >&2; exit 3")?;
        let mut c = Checks::new(&h.name);
        c.eq("exit code", 3, o.code);
        c.eq("output", "out\nerr\n", o.out.as_str());
        c.finish()
    })
}

fn st_binary(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        let o = h.run("head -c 3000000 /dev/zero; printf '\\001\\377\\n'")?;
        let raw = &o.raw;
        let mut c = Checks::new(&h.name);
        c.eq("exit code", 0, o.code);
        c.eq("output length", 3_000_003, raw.len());
        c.eq(
            "NUL bytes",
            3_000_000,
            raw.iter().filter(|&&b| b == 0).count(),
        );
        c.eq(
            "last bytes",
            &b"\x01\xff\n"[..],
            &raw[raw.len().saturating_sub(3)..],
        );
        c.finish()
    })
}

fn st_timeout(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        let t = std::time::Instant::now();
        let o = h.run_timeout("sleep 100 & sleep 101", Duration::from_secs(1))?;
        let secs = t.elapsed().as_secs_f64();
        let mut c = Checks::new(&h.name);
        c.eq("exit code of a timed-out command", -1, o.code);
        c.eq("returned within 5 s", true, secs < 5.0);
        let left = h.run("ps | grep -c '[s]leep 10[01]'")?;
        c.eq("sleeps left behind", "0", left.out.trim());
        c.finish()
    })
}

fn st_hung_guest(f: &mut Fabric) -> Result<(), String> {
    let h = &mut f.hosts[0];
    let mut q = h.qmp()?;
    q.execute("stop", None)?;
    let r = h.run_timeout("true", Duration::from_secs(1));
    q.execute("cont", None)?;
    match r {
        Ok(o) => return Err(format!("expected an error from a stopped guest, got {o:?}")),
        Err(e) if e.contains("timed out") => {}
        Err(e) => return Err(format!("expected a timeout error, got {e:?}")),
    }
    match h.run("true") {
        Err(e) if e.contains("not usable") => Ok(()),
        other => Err(format!(
            "expected later commands to be refused with \"not usable\", got {other:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let all = all();
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| b.name != a.name));
        }
    }

    #[test]
    fn expect_eq_message() {
        let e = expect_eq("x", 1, 2).unwrap_err();
        assert_eq!(e, "x: expected 1, got 2");
    }
}
