// SPDX-License-Identifier: GPL-2.0-only
//! What a guest's kernel shows of the driver and the MEP: the modules loaded, the driver
//! bound to the MEP and its character device, the MEP's identity in sysfs against the
//! configuration, dmesg, and the debug kernel's checks.

use crate::checks::expect::{expect_eq, Checks};
use crate::config::Expected;
use crate::fabric::Host;

pub const PCIFAB_KO: &str = "/lib/modules/pcifab.ko";
pub const SWITCHTEC_KO: &str = "/lib/modules/switchtec.ko";
/// Shown for a device without a driver.
pub const NO_DRIVER: &str = "<no driver>";
/// Lines of dmesg that fail a scenario (grep -iE).
const DMESG_BAD: &str = "warning|bug:|oops|call trace|refcount|leak|general protection|deprecated";

/// BDF of the MEP: vendor 0x11f8, class 0x058000, function 1 behind the switch.
pub fn find_mep(h: &mut Host) -> Result<String, String> {
    let out = h.run_ok(
        r#"for d in /sys/bus/pci/devices/*; do
  read -r v <$d/vendor && read -r c <$d/class || continue
  if [ "$v" = 0x11f8 ] && [ "$c" = 0x058000 ]; then echo "${d##*/}"; fi
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

/// Waits up to `secs` for `test_expr` (a shell test or command list) to hold; true once it
/// was seen to hold. It is not evaluated again after that: a state that holds only for a
/// moment (a process in an uninterruptible sleep between two polls) counts when seen.
pub fn wait_for(h: &mut Host, test_expr: &str, secs: u32) -> Result<bool, String> {
    let script = format!(
        "i=0; r=1; while [ $i -le {} ]; do if {test_expr}; then r=0; break; fi; sleep 0.1; \
         i=$((i+1)); done; [ $r -eq 0 ]",
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

/// Best effort, whatever state the guest is in: switchtec unloaded, pcifab loaded. For the
/// paths that leave a guest the way later scenarios expect it; the caller may ignore the
/// result.
pub fn back_to_pcifab(h: &mut Host) -> Result<crate::fabric::Output, String> {
    h.run(&format!(
        "[ -d /sys/module/switchtec ] && rmmod switchtec; \
         [ -d /sys/module/pcifab ] || insmod {PCIFAB_KO}"
    ))
}

/// The driver bound to the MEP, as its sysfs `driver` link says, is `driver`.
pub fn check_mep_driver(h: &mut Host, driver: &str) -> Result<(), String> {
    let bdf = find_mep(h)?;
    let drv = driver_of(h, &bdf)?;
    expect_eq(
        &format!("{}: driver of MEP {bdf}", h.name),
        driver,
        drv.as_deref().unwrap_or(NO_DRIVER),
    )
}

/// The MEP is bound to pcifab and /dev/pcifab0 is a character device.
pub fn check_bound_pcifab(h: &mut Host) -> Result<(), String> {
    check_mep_driver(h, "pcifab")?;
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

/// Pages pinned in `h`'s kernel right now (`nr_foll_pin_acquired - nr_foll_pin_released` of
/// `/proc/vmstat`, once `vm.stat_refresh` folded the CPUs' pending counts in).
pub fn pinned_pages(h: &mut Host) -> Result<i64, String> {
    let o = h.run_ok(
        "echo 1 > /proc/sys/vm/stat_refresh && \
         grep -E '^nr_foll_pin_(acquired|released) ' /proc/vmstat",
    )?;
    let field = |name: &str| -> Result<i64, String> {
        o.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("{}: /proc/vmstat has no {name}: {o}", h.name))
    };
    Ok(field("nr_foll_pin_acquired ")? - field("nr_foll_pin_released ")?)
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

/// What the MEP's identity attribute `name` must read in sysfs (pcifab's and switchtec's
/// alike), from the configuration; `None` for an attribute that is not part of it.
fn identity_value(h: &Host, e: &Expected, name: &str) -> Option<String> {
    Some(match name {
        "fw_version" => format!("{:08x}", e.fw_version),
        "device_id" => format!("{:#06x}", e.device_id),
        "device_version" => format!("{:x}", e.device_version),
        "vendor_id" => e.vendor_id.trim_end().to_string(),
        "product_id" => e.product_id.trim_end().to_string(),
        "product_revision" => e.product_revision.trim_end().to_string(),
        "partition" => h.index.to_string(),
        "partition_count" => e.partition_count().to_string(),
        _ => return None,
    })
}

/// The MEP's identity in the sysfs directory `dir`: each of `names` (identity attributes,
/// see [`identity_value`]) must read what the configuration says, and each of `fixed`
/// (attribute, value) its value. All are read in one command, in the order given, and every
/// mismatch is reported (`HOST: DIR: name: expected .., got ..; ...`).
pub fn check_sysfs_identity(
    h: &mut Host,
    e: &Expected,
    dir: &str,
    names: &[&str],
    fixed: &[(&str, &str)],
) -> Result<(), String> {
    let mut want = Vec::new();
    for name in names {
        let v = identity_value(h, e, name)
            .ok_or_else(|| format!("{name} is not a MEP identity attribute (harness bug)"))?;
        want.push((*name, v));
    }
    want.extend(fixed.iter().map(|(k, v)| (*k, v.to_string())));
    let all: Vec<&str> = want.iter().map(|(k, _)| *k).collect();
    let a = read_attrs(h, dir, &all)?;
    let mut c = Checks::new(&format!("{}: {dir}", h.name));
    for (name, value) in &want {
        c.eq(name, value.as_str(), attr(&a, name));
    }
    c.finish()
}

/// Loads pcifab if needed and empties the kernel log, so the scenario's own end check sees
/// only what the scenario caused.
pub fn begin(h: &mut Host) -> Result<(), String> {
    ensure_pcifab(h)?;
    check_bound_pcifab(h)?;
    h.run_ok("dmesg -c >/dev/null")?;
    Ok(())
}

/// Waits up to `secs` for `test_expr` (see [`wait_for`]); if it does not hold, fails with
/// `HOST: WHAT; dmesg:` and the last 20 lines of the kernel log.
pub fn wait_or_dmesg(h: &mut Host, test_expr: &str, secs: u32, what: &str) -> Result<(), String> {
    if !wait_for(h, test_expr, secs)? {
        let log = h.run("dmesg | tail -n 20")?.out;
        return Err(format!("{}: {what}; dmesg:\n{}", h.name, log.trim_end()));
    }
    Ok(())
}

/// Options the debug kernel (`--debug-kernel`) must have, checked in /proc/config.gz.
pub const DEBUG_CONFIG: &[&str] = &[
    "KASAN",
    "PROVE_LOCKING",
    "PROVE_RCU",
    "DEBUG_ATOMIC_SLEEP",
    "DEBUG_OBJECTS",
    "DEBUG_LIST",
    "DMA_API_DEBUG",
    "DEBUG_KMEMLEAK",
    "DETECT_HUNG_TASK",
    "WQ_WATCHDOG",
    "DEBUG_SHIRQ",
    "RUST_DEBUG_ASSERTIONS",
    "RUST_OVERFLOW_CHECKS",
    "DEBUG_FS",
    "FAULT_INJECTION",
    "UBSAN",
];

/// Files the debug kernel's checks provide, checked when it has no /proc/config.gz.
const DEBUG_FILES: &[&str] = &[
    "/sys/kernel/debug/kmemleak",
    "/proc/lockdep",
    "/sys/kernel/debug/dma-api",
    "/proc/sys/kernel/hung_task_timeout_secs",
];

pub const KMEMLEAK: &str = "/sys/kernel/debug/kmemleak";
/// 1: the DMA-API checker prints every error, not only its first (the init sets it).
const DMA_ALL_ERRORS: &str = "/sys/kernel/debug/dma-api/all_errors";
/// How many errors the DMA-API checker found since boot.
const DMA_ERROR_COUNT: &str = "/sys/kernel/debug/dma-api/error_count";

/// What the debug kernel's checkers say about themselves after a scenario: whether lockdep
/// is still on (it turns itself off for good after its first report, or when it runs out
/// of room) and how many DMA-API errors it counted since boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckerState {
    pub lockdep_on: bool,
    pub dma_errors: u64,
}

/// Reads [`CheckerState`] in a guest of the debug kernel (`/proc/lockdep_stats`,
/// debugfs `dma-api/error_count`); a file that is missing is an error, not a pass.
pub fn checker_state(h: &mut Host) -> Result<CheckerState, String> {
    // Shell built-ins only: this runs after every scenario in every host.
    let out = h.run_ok(&format!(
        "while read -r k v; do [ \"$k\" = debug_locks: ] && echo locks $v; done \
         </proc/lockdep_stats; read -r n <{DMA_ERROR_COUNT} && echo dma $n"
    ))?;
    parse_checker_state(&out).map_err(|e| format!("{}: {e}", h.name))
}

/// A race scenario's proof that its callers overlapped in the driver: the high-water mark
/// `file` of `/sys/class/misc/pcifab0` (reset by the scenario before the race) must be at
/// least 2; otherwise the requests only took turns and the race was not tested.
pub fn callers_met(h: &mut Host, file: &str) -> Result<u64, String> {
    let out = h.run_ok(&format!("cat /sys/class/misc/pcifab0/{file}"))?;
    let n: u64 = out.trim().parse().map_err(|e| {
        format!(
            "{}: sysfs {file}: expected a number, got {:?} ({e})",
            h.name,
            out.trim()
        )
    })?;
    h.log_note(&format!("{file}: {n}"));
    if n < 2 {
        return Err(format!(
            "{}: sysfs {file} is {n}: the concurrent requests never were inside the driver \
             at the same time, so the race did not happen",
            h.name
        ));
    }
    Ok(n)
}

/// The number of CPUs online in the guest (`/sys/devices/system/cpu/online`).
pub fn online_cpus(h: &mut Host) -> Result<u32, String> {
    let out = h.run_ok("cat /sys/devices/system/cpu/online")?;
    parse_cpu_list(out.trim()).ok_or_else(|| {
        format!(
            "{}: /sys/devices/system/cpu/online: expected a CPU list such as 0-1, got {:?}",
            h.name,
            out.trim()
        )
    })
}

/// The number of CPUs in a kernel CPU list (`0`, `0-1`, `0,2-3`).
pub fn parse_cpu_list(list: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in list.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let a = part.parse::<u32>().ok()?;
                (a, a)
            }
        };
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    Some(n)
}

/// [`checker_state`]'s parser: the lines `locks N` and `dma N`.
pub fn parse_checker_state(out: &str) -> Result<CheckerState, String> {
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                format!(
                    "cannot read the checkers' state (`{}` in /proc/lockdep_stats or \
                     {DMA_ERROR_COUNT}): got {:?}",
                    k.trim(),
                    out.trim()
                )
            })
    };
    Ok(CheckerState {
        lockdep_on: field("locks ")? == 1,
        dma_errors: field("dma ")?,
    })
}

/// `--debug-kernel`: the guest's kernel must have the sanitizers (by /proc/config.gz if it
/// has one, else by the files they provide) and kmemleak must be reachable in debugfs.
/// Returns how it was checked.
pub fn debug_kernel_checks(h: &mut Host) -> Result<String, String> {
    let opts = DEBUG_CONFIG.join(" ");
    let files = DEBUG_FILES.join(" ");
    let out = h.run_ok(&format!(
        "if [ -r /proc/config.gz ]; then\n\
           echo SOURCE /proc/config.gz\n\
           zcat /proc/config.gz > /tmp/config || echo 'MISSING a readable /proc/config.gz'\n\
           for o in {opts}; do grep -qx \"CONFIG_$o=y\" /tmp/config || echo \"MISSING CONFIG_$o=y\"; done\n\
           rm -f /tmp/config\n\
         else\n\
           echo SOURCE files\n\
           for f in {files}; do [ -e $f ] || echo \"MISSING $f\"; done\n\
         fi\n\
         [ -e {KMEMLEAK} ] || echo 'MISSING {KMEMLEAK} (debugfs not mounted, or no kmemleak)'\n\
         [ \"$(cat {DMA_ALL_ERRORS} 2>/dev/null)\" = 1 ] || \
           echo 'MISSING {DMA_ALL_ERRORS} = 1 (the init sets it: every DMA-API error printed)'\n\
         grep -q 'debug_locks: *1$' /proc/lockdep_stats 2>/dev/null || \
           echo 'MISSING debug_locks 1 in /proc/lockdep_stats (lockdep off at boot)'\n\
         true"
    ))?;
    let missing: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("MISSING "))
        .collect();
    let source = out
        .lines()
        .find_map(|l| l.strip_prefix("SOURCE "))
        .unwrap_or("?")
        .to_string();
    if missing.is_empty() {
        Ok(format!("checked by {source}"))
    } else {
        Err(format!(
            "{}: checked by {source}: missing {}",
            h.name,
            missing.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-1"), Some(2));
        assert_eq!(parse_cpu_list("0,2-3"), Some(3));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("3-1"), None);
    }

    #[test]
    fn checker_state_lines() {
        assert_eq!(
            parse_checker_state("locks 1\ndma 0\n"),
            Ok(CheckerState {
                lockdep_on: true,
                dma_errors: 0
            })
        );
        assert_eq!(
            parse_checker_state("locks 0\ndma 3\n"),
            Ok(CheckerState {
                lockdep_on: false,
                dma_errors: 3
            })
        );
        // A missing file leaves an empty value: an error, never a pass.
        assert!(parse_checker_state("locks\ndma 0\n").is_err());
        assert!(parse_checker_state("locks 1\ndma\n").is_err());
    }
}
