// SPDX-License-Identifier: GPL-2.0-only
//! Scenarios for what the driver must refuse or guarantee to callers it does not trust: the
//! raw MRPC classes by sub-command, an abandoned command's output, fwctl's rules for raw
//! firmware writes (capability, taint, lockdown), event waiters when the endpoint goes away,
//! and tenant isolation of P2P routes by grants.
//!
//! Each scenario fails on the driver as it was before the matching fix: the reason is in the
//! comment above it.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::{
    begin, bind_here, check_bound_pcifab, check_world, compose_begin, dmesg_clean, emu_owners,
    ensure_pcifab, find_mep, free_all, json_line, one_mrpc, pcifab_cmd, pcifab_ok, recovered,
    refused_without_extensions, selftest_json, stats_field, two_hosts, wait_for, with_fault,
    Checks, Owners, CMD_TIMEOUT_SHORT, GPU0, MIB,
};
use crate::config::Dialect;
use crate::fabric::{EmuControl, Fabric, Host};

const SEED: u64 = 0x0007_a5e1;

/// `EACCES` as the CLI's JSON reports it.
const EACCES: i64 = 13;

/// Makes user `nobody` (65534) exist and `/dev/pcifab0` open to everyone, so that
/// `as_nobody` can run commands unprivileged.
fn nobody_setup(h: &mut Host) -> Result<(), String> {
    h.run_ok(
        "mkdir -p /etc; grep -q '^nobody:' /etc/passwd 2>/dev/null || \
         echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >>/etc/passwd; \
         grep -q '^nogroup:' /etc/group 2>/dev/null || echo 'nogroup:x:65534:' >>/etc/group; \
         chmod 666 /dev/pcifab0; su -s /bin/sh nobody -c 'id -u'",
    )
    .and_then(|out| {
        if out.trim() == "65534" {
            Ok(())
        } else {
            Err(format!(
                "{}: `su nobody -c 'id -u'` printed {:?}, expected 65534",
                h.name,
                out.trim()
            ))
        }
    })
}

/// Runs `pcifab ARGS --json` as user `nobody`; returns (exit code, JSON line, output).
fn as_nobody(h: &mut Host, args: &str) -> Result<(i64, Value, String), String> {
    let o = h.run(&format!("su -s /bin/sh nobody -c 'pcifab {args} --json'"))?;
    let v =
        json_line(&o.out).map_err(|e| format!("{}: as nobody: `pcifab {args}`: {e}", h.name))?;
    h.log_note(&format!("as nobody: pcifab {args}: exit {}", o.code));
    Ok((o.code, v, o.out))
}

/// Whether a failed CLI call reported `EPERM` (its message names "Operation not permitted").
fn refused_eperm(out: &str) -> bool {
    out.contains("Operation not permitted") || out.contains("EPERM")
}

/// Raw MRPC is classed by command and sub-command. Before, 0x82, 0x83 and 0x89 were
/// read-only whatever the sub-command, so any user could drain the fabric-event queue (the
/// owner would never see UNBIND_REQUEST) or start and finish the driver's dump sessions.
pub fn mrpc_classes(f: &mut Fabric) -> Result<(), String> {
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    begin(h)?;
    nobody_setup(h)?;
    let commands_before = stats_field(h, "mrpc_commands")?;
    let mut c = Checks::new(&format!("{}: unprivileged raw MRPC", h.name));
    // Refused: each would change firmware state or disturb a session of the driver's.
    let refused = [
        (
            "0x89 01000100 --out-len 16",
            "GFMS_EVENT GET (consumes the event queue)",
        ),
        ("0x89 00000000", "GFMS_EVENT CLEAR"),
        ("0x82 01 --out-len 4", "TOPO_INFO_DUMP START"),
        ("0x82 03000000 --out-len 16", "TOPO_INFO_DUMP DATA_GET"),
        ("0x82 04 --out-len 4", "TOPO_INFO_DUMP FINISH"),
        (
            "0x83 10 --out-len 16",
            "GFMS_DB_DUMP chunked-session sub-command 0x10",
        ),
        (
            "0x83 0100000001000000 --out-len 8",
            "GFMS_DB_DUMP PAX_ALL START (opens the dump session)",
        ),
        (
            "0x83 0300000003000000 --out-len 4",
            "GFMS_DB_DUMP HVD FINISH (closes the dump session)",
        ),
        (
            "0x83 0600000001000000 --out-len 8",
            "GFMS_DB_DUMP HVD_DETAIL START",
        ),
        ("0x04 00000000", "DIETEMP SET_CLOCK"),
        ("0x04 03000000", "DIETEMP STOP"),
        (
            "0xf004 0100200001000000 --out-len 8",
            "P2P_ROUTE ADD (sub-command 1)",
        ),
        (
            "0xf004 0100200004000003 --out-len 8",
            "P2P_ROUTE GRANT (sub-command 4)",
        ),
    ];
    for (args, what) in refused {
        let (code, _, out) = as_nobody(h, &format!("mrpc {args}"))?;
        if code == 0 || !refused_eperm(&out) {
            c.fail(format!(
                "{what}: expected EPERM, got exit {code}: {}",
                out.trim()
            ));
        }
    }
    let after_refused = stats_field(h, "mrpc_commands")?;
    c.eq(
        "STATS mrpc_commands after the refused calls (none reached the firmware)",
        commands_before,
        after_refused,
    );
    // Allowed: reads that change nothing.
    let allowed = [
        ("0x41 0102 --out-len 2", "ECHO"),
        ("0x04 02000000 --out-len 4", "DIETEMP GET"),
        (
            "0x83 00 --out-len 64",
            "GFMS_DB_DUMP FABRIC (single-shot section)",
        ),
        (
            "0x83 010000000200000000000000 --out-len 64",
            "GFMS_DB_DUMP PAX_ALL GET (reads, whether or not a session is open)",
        ),
    ];
    for (args, what) in allowed {
        let (code, _, out) = as_nobody(h, &format!("mrpc {args}"))?;
        if refused_eperm(&out) {
            c.fail(format!(
                "{what}: expected to run for an unprivileged caller, got exit {code}: {}",
                out.trim()
            ));
        }
    }
    c.eq(
        "STATS mrpc_commands after the allowed calls",
        after_refused + allowed.len() as u64,
        stats_field(h, "mrpc_commands")?,
    );
    c.finish()?;
    dmesg_clean(h)
}

/// pcifab's extension ids (0xF000-0xF0FF) are classed only when the probe found the
/// extension, and an unprivileged caller's MRPC timeout is bounded. Before, every id
/// 0xF000-0xF07F was read-only on any firmware (on PAX firmware, where none of them exists,
/// anyone could send them), and anyone could hold the mailbox for a minute or leave it stale
/// after a 1 ms timeout.
pub fn mrpc_ext_timeouts(f: &mut Fabric) -> Result<(), String> {
    let extended = f.dialect() == Dialect::Extended;
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    begin(h)?;
    nobody_setup(h)?;
    let features = h.run_ok("cat /sys/class/misc/pcifab0/features")?;
    let mut c = Checks::new(&format!("{}: unprivileged extensions and timeouts", h.name));
    c.eq(
        "features in sysfs (the dialect's extensions)",
        if extended {
            "telemetry p2p-routes dma-engine unbind-request"
        } else {
            "none"
        },
        features.trim(),
    );
    // Each: (args, what, expected errno name, or "ran": it reached the firmware, which may
    // have refused it, e.g. an unassigned extension id).
    let ext = if extended { "ran" } else { "EPERM" };
    let calls = [
        ("0xf000 --out-len 8", "EXT_FEATURES 0xF000", ext),
        (
            "0xf002 0100080000030000 --out-len 24",
            "FUNCTION_TELEMETRY 0xF002",
            ext,
        ),
        (
            "0xf004 0100200003000000 --out-len 64",
            "P2P_ROUTE LIST (sub-command 3)",
            ext,
        ),
        ("0xf07f --out-len 4", "read-range extension 0xF07F", ext),
        ("0x41 0102 --out-len 2 --timeout 1", "ECHO, 1 ms", "EINVAL"),
        (
            "0x41 0102 --out-len 2 --timeout 999",
            "ECHO, 999 ms",
            "EINVAL",
        ),
        (
            "0x41 0102 --out-len 2 --timeout 10001",
            "ECHO, 10,001 ms",
            "EINVAL",
        ),
        (
            "0x41 0102 --out-len 2 --timeout 60000",
            "ECHO, 60 s",
            "EINVAL",
        ),
        (
            "0x41 0102 --out-len 2 --timeout 1000",
            "ECHO, 1000 ms",
            "ran",
        ),
        (
            "0x41 0102 --out-len 2 --timeout 10000",
            "ECHO, 10,000 ms",
            "ran",
        ),
        ("0x41 0102 --out-len 2", "ECHO, the default timeout", "ran"),
    ];
    for (args, what, want) in calls {
        let before = stats_field(h, "mrpc_commands")?;
        let (code, v, out) = as_nobody(h, &format!("mrpc {args}"))?;
        let after = stats_field(h, "mrpc_commands")?;
        let got = match v["error"]["code"].as_str() {
            _ if code == 0 => "ran".to_string(),
            Some("firmware") => "ran".to_string(),
            Some(e) => e.to_string(),
            None => format!("exit {code}"),
        };
        if got != want {
            c.fail(format!(
                "{what}: expected {want}, got {got}: {}",
                out.trim()
            ));
        }
        c.eq(
            &format!("{what}: commands that reached the firmware"),
            u64::from(want == "ran"),
            after - before,
        );
    }
    // Root keeps the whole range.
    let (code, _, out) = pcifab_cmd(h, "mrpc 0x41 0102 --out-len 2 --timeout 60000")?;
    if code != 0 {
        c.fail(format!("root: ECHO with a 60 s timeout: {}", out.trim()));
    }
    c.finish()?;
    dmesg_clean(h)
}

/// Reads of `/sys/class/misc/pcifab0/p2p_routes` in the cache check.
const ROUTE_READS: u64 = 10;

/// Per-function telemetry (other tenants' functions included) is root's only, and reading
/// `p2p_routes` does not cost a firmware command per read. Before, the telemetry files were
/// world-readable (0444: any user read every function's, other hosts' GPUs included), and
/// every read of `p2p_routes`, by any user, sent a P2P_ROUTE LIST to the firmware.
pub fn sysfs_tenant_data(f: &mut Fabric) -> Result<(), String> {
    let extended = f.dialect() == Dialect::Extended;
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    begin(h)?;
    nobody_setup(h)?;
    let mut c = Checks::new(&format!("{}: other tenants' data in sysfs", h.name));
    let dir = format!("/sys/class/misc/pcifab0/functions/{GPU0:#06x}");
    for file in ["temperature", "power", "utilisation", "health"] {
        let mode = h.run_ok(&format!("stat -c '%a %u' {dir}/{file}"))?;
        c.eq(&format!("{file}: mode and owner uid"), "400 0", mode.trim());
        let o = h.run(&format!("su -s /bin/sh nobody -c 'cat {dir}/{file}' 2>&1"))?;
        if o.code == 0 || !o.out.contains("Permission denied") {
            c.fail(format!(
                "{file} as nobody: expected \"Permission denied\", got exit {}: {}",
                o.code,
                o.out.trim()
            ));
        }
        // Root still reads it (PAX firmware has no telemetry: EOPNOTSUPP).
        let o = h.run(&format!("cat {dir}/{file} 2>&1"))?;
        let root_ok = if extended {
            o.code == 0
        } else {
            o.out.contains("not supported")
        };
        if !root_ok {
            c.fail(format!("{file} as root: exit {}: {}", o.code, o.out.trim()));
        }
    }
    if extended {
        // Once to fill the cache, then ten reads by an unprivileged user.
        h.run_ok("cat /sys/class/misc/pcifab0/p2p_routes")?;
        let before = stats_field(h, "mrpc_commands")?;
        let o = h.run(&format!(
            "su -s /bin/sh nobody -c 'for i in $(seq {ROUTE_READS}); do \
             cat /sys/class/misc/pcifab0/p2p_routes || exit 1; done'"
        ))?;
        let after = stats_field(h, "mrpc_commands")?;
        c.eq("exit of the p2p_routes reads as nobody", 0, o.code);
        // A firmware event of the fabric may invalidate the cache once meanwhile.
        if after - before > 1 {
            c.fail(format!(
                "{ROUTE_READS} reads of p2p_routes sent {} firmware commands: expected at most \
                 1 (the cached list)",
                after - before
            ));
        }
    } else {
        h.log_note(
            "pax: no P2P route extension, so p2p_routes sends no command at all; the cache \
             check runs in the extended dialect",
        );
    }
    c.finish()?;
    dmesg_clean(h)
}

/// A command the caller gave up on keeps the mailbox until the firmware finished it. Before,
/// the next caller took the mailbox after 100 ms and read the abandoned command's output as
/// its own (here: `aaaaaaaa` instead of `bbbbbbbb`).
pub fn abandoned_output(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    begin(h)?;
    with_fault(&emu, h, "delay 1500", |h| {
        let mut c = Checks::new(&format!("{}: abandoned MRPC command", h.name));
        let (e, _, _) = one_mrpc(h, "0x41 --in aaaaaaaa --out-len 4 --timeout 300")?;
        c.eq(
            "first caller, timeout 300 ms < firmware 1500 ms",
            "ETIMEDOUT",
            e.as_str(),
        );
        let (e, ms, v) = one_mrpc(h, "0x41 --in bbbbbbbb --out-len 4 --timeout 10000")?;
        c.eq("second caller", "ok", e.as_str());
        c.eq_json(
            "second caller's output (its own echo, inverted as PAX answers it, not the \
             abandoned one's)",
            Value::from("44444444"),
            v["output"].clone(),
        );
        // It waited for the abandoned command (about 1.2 s left of it) and then its own.
        if ms < 1500.0 {
            c.fail(format!(
                "second caller finished after {ms} ms: it cannot have waited for the abandoned \
                 command (1.2 s left) and its own (1.5 s)"
            ));
        }
        c.finish()
    })?;
    recovered(h)
}

/// A caller queued for the mailbox behind a command the firmware takes 20 s for is killed:
/// it must be gone within 1 s of SIGKILL, and the command ahead of it must still complete.
/// Before, callers queued on the mailbox's mutex, asleep uninterruptibly (state D) until
/// every command ahead of theirs ended (up to 60 s each): the killed caller took about 19 s.
pub fn queued_caller_killed(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    begin(h)?;
    let mut o = String::new();
    with_fault(&emu, h, "delay 20000", |h| {
        // The first caller, then the second once the first is inside (the driver counts its
        // callers: `mrpc_callers_max` 1, then 2 with the second queued); the time from the
        // kill to the second's end is measured in the guest (/proc/uptime, 10 ms steps).
        o = h.run_ok_timeout(
            &format!(
                "echo 0 > {MISC0}/mrpc_callers_max
                 pcifab-selftest mrpc 0x41 --in aaaaaaaa --out-len 4 --timeout 60000                    >/tmp/first.out 2>&1 & first=$!
                 callers() {{ [ $(cat {MISC0}/mrpc_callers_max) -ge $1 ]; }}
                 i=0; while ! callers 1 && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
                 callers 1 || {{ echo 'the first caller never entered'; exit 1; }}
                 pcifab-selftest mrpc 0x41 --in bbbbbbbb --out-len 4 --timeout 60000                    >/tmp/second.out 2>&1 & second=$!
                 i=0; while ! callers 2 && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
                 callers 2 || {{ echo 'the second caller never queued'; exit 1; }}
                 echo \"second caller: $(grep State /proc/$second/status)\"
                 read t0 x < /proc/uptime; kill -9 $second; wait $second; rc=$?
                 read t1 x < /proc/uptime
                 echo \"killed rc=$rc t0=$t0 t1=$t1\"
                 wait $first; echo \"first rc=$? $(cat /tmp/first.out)\""
            ),
            Duration::from_secs(120),
        )?;
        Ok(())
    })?;
    h.log_note(o.trim());
    let line = o
        .lines()
        .find(|l| l.starts_with("killed "))
        .ok_or_else(|| format!("{}: no kill line in {o:?}", h.name))?;
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no {k} in {line:?}"))
    };
    let ms = ((field("t1=")? - field("t0=")?) * 1000.0).round() as i64;
    let mut c = Checks::new(&format!(
        "{}: a caller queued behind a 20 s command, killed",
        h.name
    ));
    c.eq(
        "killed caller's exit status (SIGKILL)",
        137,
        field("rc=")? as i64,
    );
    if ms > 1000 {
        c.fail(format!(
            "the killed caller ended {ms} ms after SIGKILL; expected within 1000 ms"
        ));
    }
    let first = o
        .lines()
        .find_map(|l| l.strip_prefix("first "))
        .and_then(|l| l.split_once(' '))
        .and_then(|(_, j)| serde_json::from_str::<Value>(j).ok())
        .unwrap_or(Value::Null);
    c.eq_json(
        "first caller's errno",
        Value::from("ok"),
        first["errno"].clone(),
    );
    c.eq_json(
        "first caller's output (its echo, inverted)",
        Value::from("55555555"),
        first["output"].clone(),
    );
    c.finish()?;
    recovered(h)
}

/// Bit 19 of `/proc/sys/kernel/tainted`: TAINT_FWCTL.
const TAINT_FWCTL: u64 = 1 << 19;

fn tainted(h: &mut Host) -> Result<u64, String> {
    let out = h.run_ok("cat /proc/sys/kernel/tainted")?;
    out.trim()
        .parse()
        .map_err(|e| format!("{}: /proc/sys/kernel/tainted: {e}: {out:?}", h.name))
}

/// Raw firmware writes and raw-IOVA copies follow fwctl's rules: CAP_SYS_RAWIO, a taint,
/// refused under lockdown. Before, they needed only CAP_SYS_RAWIO: no taint, no lockdown
/// check. Lockdown cannot be lifted, so the host is rebooted afterwards.
pub fn fwctl_rules(f: &mut Fabric) -> Result<(), String> {
    let h = f
        .hosts
        .get_mut(1)
        .ok_or("this scenario needs a second host")?;
    begin(h)?;
    // The taint lasts as long as the kernel: one an earlier scenario's raw write left (a
    // filtered run may order them so) goes with a new boot, so that the checks below can fail.
    if tainted(h)? & TAINT_FWCTL != 0 {
        let t = h.kill_qemu().and_then(|()| h.reboot())?;
        h.log_note(&format!(
            "tainted by an earlier raw firmware write: rebooted first in {:.1} s",
            t.as_secs_f64()
        ));
        ensure_pcifab(h)?;
    }
    let r = fwctl_rules_on(h);
    // Whatever happened, give the later scenarios a host that is not locked down: a new
    // boot (the QEMU goes first; lockdown lasts as long as the kernel).
    let boot = h.kill_qemu().and_then(|()| h.reboot()).map(|t| {
        h.log_note(&format!(
            "rebooted after the lockdown test in {:.1} s",
            t.as_secs_f64()
        ))
    });
    r?;
    boot?;
    ensure_pcifab(h)
}

fn fwctl_rules_on(h: &mut Host) -> Result<(), String> {
    let mut c = Checks::new(&format!("{}: fwctl rules", h.name));
    let t0 = tainted(h)?;
    if t0 & TAINT_FWCTL != 0 {
        return Err(format!(
            "{}: the kernel was already tainted by a raw firmware write before this scenario \
             (tainted={t0}); the check below could not fail",
            h.name
        ));
    }
    nobody_setup(h)?;
    // Unprivileged: refused, no taint.
    let (code, _, out) = as_nobody(h, "mrpc 0x87 00000000")?;
    if code == 0 || !refused_eperm(&out) {
        c.fail(format!(
            "unprivileged 0x87 (GAS write, debug-write class): expected EPERM, got exit {code}: {}",
            out.trim()
        ));
    }
    c.eq(
        "TAINT_FWCTL after a refused debug write",
        0,
        tainted(h)? & TAINT_FWCTL,
    );
    // Root: the command runs (the firmware refuses an unknown id) and the kernel is tainted.
    let (_, _, out) = pcifab_cmd(h, "mrpc 0x1234 00000000")?;
    if refused_eperm(&out) {
        c.fail(format!("root: debug write refused: {}", out.trim()));
    }
    c.eq(
        "TAINT_FWCTL after root's debug write",
        TAINT_FWCTL,
        tainted(h)? & TAINT_FWCTL,
    );
    // Lockdown: refused even for root, before anything reaches the firmware.
    let o = h.run(
        "mkdir -p /sys/kernel/security; \
         mountpoint -q /sys/kernel/security || mount -t securityfs none /sys/kernel/security; \
         echo integrity >/sys/kernel/security/lockdown && cat /sys/kernel/security/lockdown",
    )?;
    if o.code != 0 || !o.out.contains("[integrity]") {
        return Err(format!(
            "{}: could not lock the kernel down (needs CONFIG_SECURITY_LOCKDOWN_LSM, which the \
             debug kernel has): exit {}: {}",
            h.name,
            o.code,
            o.out.trim()
        ));
    }
    let before = stats_field(h, "mrpc_commands")?;
    let (code, _, out) = pcifab_cmd(h, "mrpc 0x1234 00000000")?;
    if code == 0 || !refused_eperm(&out) {
        c.fail(format!(
            "root, locked down: debug write: expected EPERM, got exit {code}: {}",
            out.trim()
        ));
    }
    let (code, _, out) = pcifab_cmd(
        h,
        "p2p copy --from iova:0x100000 --to file:/tmp/iova.out --len 4096",
    )?;
    if code == 0 || !refused_eperm(&out) {
        c.fail(format!(
            "root, locked down: copy from a raw IOVA: expected EPERM, got exit {code}: {}",
            out.trim()
        ));
    }
    c.eq(
        "STATS mrpc_commands after the refused calls",
        before,
        stats_field(h, "mrpc_commands")?,
    );
    // What lockdown leaves alone still works: a read-only command.
    let (e, _, _) = one_mrpc(h, "0x41 --in 01 --out-len 1")?;
    c.eq("echo while locked down", "ok", e.as_str());
    c.finish()
}

/// An event waiter without a timeout ends with ENODEV when the endpoint goes away, so it
/// does not keep the module pinned. Before, unbind woke it, it found no new event and slept
/// again, until a signal.
pub fn waiter_enodev(f: &mut Fabric) -> Result<(), String> {
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    begin(h)?;
    let mep = find_mep(h)?;
    h.run_ok(
        "rm -f /tmp/watch.out; (pcifab watch >/tmp/watch.out 2>&1; echo \"exit=$?\" \
         >>/tmp/watch.out) & echo $! >/tmp/watch.pid",
    )?;
    // The watcher prints its banner just before its first wait; whether the unbind then
    // meets it asleep or about to sleep, the answer must be ENODEV.
    wait_until(
        h,
        "grep -q watching /tmp/watch.out",
        20,
        "the watcher to start",
    )?;
    let t = Instant::now();
    h.run_ok_timeout(
        &format!("echo {mep} >/sys/bus/pci/drivers/pcifab/unbind"),
        Duration::from_secs(30),
    )?;
    let unbind_s = t.elapsed().as_secs_f64();
    let mut c = Checks::new(&format!("{}: event waiter at unbind", h.name));
    if unbind_s > 10.0 {
        c.fail(format!("unbinding the MEP took {unbind_s:.1} s"));
    }
    let ended = h
        .run("i=0; while ! grep -q exit= /tmp/watch.out && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; cat /tmp/watch.out")?
        .out;
    if !ended.contains("exit=1") || !ended.contains("No such device") {
        c.fail(format!(
            "the waiter: expected to end within 5 s with ENODEV (exit 1, \"No such device\"), got: {}",
            ended.trim()
        ));
        // Do not leave it behind pinning the module.
        let _ = h.run("kill $(cat /tmp/watch.pid) 2>/dev/null; sleep 0.2");
    }
    let o = h.run("rmmod pcifab")?;
    if o.code != 0 {
        c.fail(format!(
            "rmmod after the waiter ended: exit {}: {}",
            o.code,
            o.out.trim()
        ));
    }
    c.finish()?;
    begin(h)
}

/// Runs `test` (a shell condition) until it holds, at most `secs`.
fn wait_until(h: &mut Host, test: &str, secs: u32, what: &str) -> Result<(), String> {
    if wait_for(h, test, secs)? {
        Ok(())
    } else {
        Err(format!(
            "{}: timed out after {secs} s waiting for {what}",
            h.name
        ))
    }
}

/// The grants of the functions `h` may see, as (pdfid, holder, grantee).
fn grants(h: &mut Host) -> Result<Vec<(String, u64, u64)>, String> {
    let v = pcifab_cmd(h, "p2p grants")?.1;
    let list = v["grants"].as_array().ok_or_else(|| {
        format!(
            "{}: `pcifab p2p grants --json`: no grants array: {v}",
            h.name
        )
    })?;
    Ok(list
        .iter()
        .map(|g| {
            (
                g["pdfid"].as_str().unwrap_or("?").to_string(),
                g["holder"].as_u64().unwrap_or(u64::MAX),
                g["grantee"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect())
}

fn route_count(h: &mut Host) -> Result<usize, String> {
    let v = pcifab_cmd(h, "p2p route list")?.1;
    v["routes"]
        .as_array()
        .map(Vec::len)
        .ok_or_else(|| format!("{}: `pcifab p2p route list --json`: {v}", h.name))
}

/// Tenant isolation: h1 may route to a function h0 holds only after h0 granted it; the
/// grant and the route go when h0 revokes or unbinds. Before, any host with CAP_SYS_ADMIN
/// could route onto any bound function and read or write its memory.
pub fn p2p_grants(f: &mut Fabric) -> Result<(), String> {
    if refused_without_extensions(f, &["p2p grant 0x0300 --host 1", "p2p grants"])? {
        return Ok(());
    }
    compose_begin(f)?;
    let e = f.expected.clone();
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "this scenario needs two hosts")?;
    let bdf = bind_here(h0, &e, GPU0)?;
    selftest_json(
        h0,
        &format!("bar --device {bdf} --write {SEED:#x}"),
        Duration::from_secs(120),
    )?;
    let add = format!("p2p route add {GPU0:#06x} --size {MIB:#x} --window-off 0");
    let mut c = Checks::new("p2p grants");

    // Not granted: refused, nothing added.
    let (code, v, out) = pcifab_cmd(h1, &add)?;
    c.eq(&format!("h1 `{add}` before a grant: exit"), 3, code);
    c.eq(
        "h1 route add before a grant: errno",
        Some(EACCES),
        v["error"]["errno"].as_i64(),
    );
    if code == 0 {
        c.fail(format!(
            "h1 routed to h0's function without a grant: {}",
            out.trim()
        ));
    }
    c.eq("h1 routes before a grant", 0, route_count(h1)?);
    // Only the holder (or the manager host) may grant: h1 cannot grant itself.
    let (code, v, _) = pcifab_cmd(h1, &format!("p2p grant {GPU0:#06x} --host 1"))?;
    c.eq("h1 granting itself h0's function: exit", 3, code);
    c.eq(
        "h1 granting itself h0's function: errno",
        Some(EACCES),
        v["error"]["errno"].as_i64(),
    );
    c.finish()?;

    // Granted: the route works and carries h0's data.
    pcifab_ok(h0, &format!("p2p grant {GPU0:#06x} --host 1"))?;
    let want = vec![("0x0300".to_string(), 0, 1)];
    let mut c = Checks::new("p2p grants");
    c.eq("grants h0 sees", want.clone(), grants(h0)?);
    c.eq("grants h1 sees", want, grants(h1)?);
    pcifab_ok(h1, &add)?;
    let out = h1.run_ok(&format!("pcifab-p2p {GPU0:#06x} 0 {MIB:#x}"))?;
    let hash = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("fnv1a64="))
        .unwrap_or("")
        .to_string();
    let v = emu.request(&format!("mem-hash {GPU0:#06x} 0 {MIB:#x}"))?;
    c.eq(
        "h1 reading h0's function through the granted route: hash vs the emulator's",
        v["fnv1a64"].as_str().unwrap_or("?").to_string(),
        hash,
    );

    // Revoked: h1's route goes with the grant.
    pcifab_ok(h0, &format!("p2p revoke {GPU0:#06x} --host 1"))?;
    c.eq("h1 routes after the revoke", 0, route_count(h1)?);
    c.eq("grants h1 sees after the revoke", vec![], grants(h1)?);
    let (code, v, _) = pcifab_cmd(h1, &add)?;
    c.eq("h1 route add after the revoke: exit", 3, code);
    c.eq(
        "h1 route add after the revoke: errno",
        Some(EACCES),
        v["error"]["errno"].as_i64(),
    );

    // Unbound: the firmware drops the grant and every route it allowed.
    pcifab_ok(h0, &format!("p2p grant {GPU0:#06x} --host 1"))?;
    pcifab_ok(h1, &add)?;
    c.eq("h1 routes after a new grant", 1, route_count(h1)?);
    pcifab_ok(h0, &format!("unbind {GPU0:#06x}"))?;
    c.eq(
        "h1 routes after h0 unbound the function",
        0,
        route_count(h1)?,
    );
    c.eq("grants h0 sees after the unbind", vec![], grants(h0)?);
    c.eq("grants h1 sees after the unbind", vec![], grants(h1)?);
    c.finish()?;
    // Unprivileged callers cannot grant at all.
    nobody_setup(h0)?;
    let (code, _, out) = as_nobody(h0, &format!("p2p grant {GPU0:#06x} --host 1"))?;
    if code == 0 || !refused_eperm(&out) {
        return Err(format!(
            "h0: unprivileged `p2p grant`: expected EPERM, got exit {code}: {}",
            out.trim()
        ));
    }
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

/// Seeds of the hostile-firmware run, one per host (printed, so a failure can be replayed).
const HOSTILE_SEEDS: [u64; 2] = [0x0bad_f00d, 0x0dec_a1f0];
/// Firmware replies the emulator falsifies at least (its count of replies it lied in, both
/// hosts together): 5,000 with `--soak` (`make soak`), 250 in `make test`. About one
/// command in six of the workload gets a falsified reply (the others are not among the
/// commands the emulator lies in): 5 rounds per host made about 600 lies, and `make test`
/// keeps to about half of that.
fn hostile_commands() -> u64 {
    if crate::soak() {
        5_000
    } else {
        250
    }
}

/// One round of the normal workload in a guest, every command bounded by `timeout` (a hang
/// is exit 124 or 143). Prints `rc=N COMMAND` per command and, after a failure, the last
/// lines of what it printed on stderr as `err: LINE`, for the harness to check.
fn hostile_round(host: usize, rounds: u32) -> String {
    let fnid = if host == 0 { "0x0301" } else { "0x0403" };
    format!(
        "n=0; while [ $n -lt {rounds} ]; do n=$((n+1)); \
         for c in 'pcifab info' 'pcifab list' 'pcifab show {fnid}' \
                  'pcifab bind {fnid} --host {host} --timeout 2000' 'pcifab unbind {fnid} --timeout 2000' \
                  'pcifab move {fnid} --host {host} --timeout 2000' 'pcifab p2p route list' \
                  'pcifab p2p route add {fnid} --size 1M' 'pcifab p2p grants' \
                  'pcifab p2p copy --from {fnid}:0 --to file:/tmp/h.out --len 4096 --timeout 2000' \
                  'pcifab watch --count 1 --timeout 100' 'pcifab stats' \
                  'cat /sys/class/misc/pcifab0/temperature /sys/class/misc/pcifab0/generation \
                       /sys/class/misc/pcifab0/nr_functions' \
                  'cat /sys/class/misc/pcifab0/functions/{fnid}/power'; do \
           o=$(timeout 30 sh -c \"$c\" 2>&1 >/dev/null); rc=$?; echo \"rc=$rc $c\"; \
           [ $rc -eq 0 ] || printf '%s\\n' \"$o\" | tail -n 3 | sed 's/^/err: /'; \
         done; done"
    )
}

/// What is wrong in a hostile round's output ([`hostile_round`]): a command that did not
/// end with 0 (ok), 1 (failed) or 3 (refused) -- 2 is a usage error, 124/143 a hang killed
/// by `timeout`, anything else a crash -- or a failure that does not say what went wrong: a
/// `pcifab` command must print `pcifab: MESSAGE` and `cat` `cat: MESSAGE` on stderr, and a
/// Rust panic is never an error message.
fn hostile_outcomes(out: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let mut lines = out.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("rc=") else {
            continue;
        };
        let (code, cmd) = rest.split_once(' ').unwrap_or((rest, ""));
        let mut err = Vec::new();
        while let Some(e) = lines.peek().and_then(|l| l.strip_prefix("err: ")) {
            err.push(e);
            lines.next();
        }
        if !matches!(code, "0" | "1" | "3") {
            bad.push(format!("exit {code}: {cmd}"));
            continue;
        }
        if code == "0" {
            continue;
        }
        let tool = if cmd.starts_with("cat ") {
            "cat"
        } else {
            "pcifab"
        };
        let named = err.iter().any(|e| {
            e.strip_prefix(tool)
                .and_then(|m| m.strip_prefix(": "))
                .is_some_and(|m| m.trim().len() >= 8)
        });
        let panicked = err.iter().any(|e| e.contains("panicked"));
        if !named || panicked {
            bad.push(format!(
                "exit {code} without a `{tool}: MESSAGE` error: {cmd}: stderr {err:?}"
            ));
        }
    }
    bad
}

/// Hostile firmware: the emulator lies in every reply, register and DMA write-back the
/// driver parses (`fault HOST hostile SEED`, Documentation/emulator.rst) while both hosts
/// run the normal workload for at least 5,000 firmware commands. Nothing may crash, hang or
/// splat (the harness checks the consoles after every scenario); every command ends with a
/// bounded, named error or success; then the firmware turns sane and everything works
/// again without a reboot, the module unloading and loading included.
pub fn hostile_firmware(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    // Arming the mode starts the emulator's counts of falsified replies from 0.
    for (h, seed) in f.hosts.iter().zip(HOSTILE_SEEDS) {
        crate::say(&format!("# hostile firmware: {} seed {seed:#x}", h.name));
        emu.request(&format!("fault {} hostile {seed:#x}", h.name))?;
    }
    let t = Instant::now();
    let mut made = 0;
    let mut bad = Vec::new();
    let mut rounds = 0u32;
    // Rounds per host between two looks at the emulator's count: one round of both hosts
    // made about 110 lies.
    let batch = if crate::soak() { 5 } else { 3 };
    let r = (|| -> Result<(), String> {
        while made < hostile_commands() {
            if t.elapsed() > Duration::from_secs(600) {
                return Err(format!(
                    "only {made} falsified firmware replies in 600 s (expected {})",
                    hostile_commands()
                ));
            }
            let outs = std::sync::Mutex::new(Vec::new());
            f.each_host(|h, _| {
                let o = h.run_timeout(&hostile_round(h.index, batch), Duration::from_secs(900))?;
                outs.lock()
                    .map_err(|_| "poisoned".to_string())?
                    .push((h.name.clone(), o));
                Ok(())
            })?;
            for (name, o) in outs.into_inner().map_err(|_| "poisoned".to_string())? {
                bad.extend(
                    hostile_outcomes(&o.out)
                        .into_iter()
                        .map(|b| format!("{name}: {b}")),
                );
            }
            rounds += batch;
            made = 0;
            for h in &f.hosts {
                made += emu.hostile_replies(&h.name)?;
            }
        }
        Ok(())
    })();
    let cleared = emu.request("fault clear all");
    crate::say(&format!(
        "# hostile firmware: {made} falsified firmware replies in {rounds} rounds per host, {:.0} s",
        t.elapsed().as_secs_f64()
    ));
    r?;
    cleared?;
    if !bad.is_empty() {
        return Err(format!(
            "{} commands hung or crashed under hostile firmware (first: {})",
            bad.len(),
            bad.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    // Sane again, without a reboot: reload the module, check the world, compose.
    f.each_host(|h, _| {
        h.run_ok("rmmod pcifab")?;
        begin(h)?;
        recovered(h)
    })?;
    compose_begin(f)?;
    let e = f.expected.clone();
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    bind_here(h0, &e, GPU0)?;
    pcifab_ok(h0, &format!("unbind {GPU0:#06x}"))?;
    Ok(())
}

/// The kernel log lines of `h` that name a firmware lie and match `pattern` (grep -E).
fn lies_logged(h: &mut Host, pattern: &str) -> Result<u64, String> {
    let o = h.run(&format!(
        "dmesg | grep -E 'firmware lie #[0-9]+: ({pattern})' | wc -l"
    ))?;
    o.out
        .trim()
        .parse()
        .map_err(|_| format!("{}: counting lie lines: {:?}", h.name, o.out.trim()))
}

/// The lies of `kind` host `host`'s MEP told since the emulator started.
fn lies_told(emu: &EmuControl, host: &str, kind: &str) -> Result<u64, String> {
    let v = emu.request(&format!("lies {host}"))?;
    v["told"][kind]
        .as_u64()
        .ok_or_else(|| format!("emulator `lies {host}` has no count for {kind}: {v}"))
}

/// Arms one lie of `kind` on `h`'s MEP, runs `act`, waits (at most 20 s) until the emulator
/// told it and the driver logged as many lines matching `pattern` as lies were told, and
/// returns `act`'s result. Counts only lies the emulator reports it told.
fn one_lie<T>(
    emu: &EmuControl,
    h: &mut Host,
    kind: &str,
    pattern: &str,
    act: impl FnOnce(&mut Host) -> Result<T, String>,
) -> Result<T, String> {
    let told = lies_told(emu, &h.name, kind)?;
    let logged = lies_logged(h, pattern)?;
    emu.request(&format!("fault {} lie {kind}", h.name))?;
    let r = act(h);
    let t = Instant::now();
    let (told_now, logged_now) = loop {
        let told_now = lies_told(emu, &h.name, kind)? - told;
        let logged_now = lies_logged(h, pattern)? - logged;
        if (told_now >= 1 && logged_now >= told_now) || t.elapsed() > Duration::from_secs(20) {
            break (told_now, logged_now);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    emu.request(&format!("fault clear {}", h.name))?;
    let r = r?;
    let mut c = Checks::new(&format!("{}: lie {kind}", h.name));
    c.eq("lies the emulator told", 1, told_now);
    c.eq(
        "driver log lines naming it (`firmware lie #N: ...`)",
        told_now,
        logged_now,
    );
    c.finish()?;
    Ok(r)
}

/// Firmware lies the driver used to take in silence, each told once by the emulator
/// (`fault HOST lie KIND`): a bind answered DONE with an unknown status byte (taken as
/// success before), a fabric-event reply with an unknown event code, one counting more events
/// than were asked for (clamped before), an UNBIND_REQUEST for a function not bound to the
/// host (dropped without a word before) and, with the DMA engine, a write-back claiming more
/// bytes done than asked (clamped before). Each must be refused or logged as a lie and
/// counted; the driver works on afterwards.
pub fn firmware_lies(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let extended = f.dialect() != crate::config::Dialect::Pax;
    let h = f.hosts.first_mut().ok_or("no hosts")?;

    // A bind the firmware did (or not) but answered with a status no firmware gives.
    let (code, v, out) = one_lie(&emu, h, "bind-status", "bind of .* unknown status", |h| {
        pcifab_cmd(h, &format!("bind {GPU0:#06x} --host {}", h.index))
    })?;
    if code == 0 || v.get("ok") == Some(&Value::Bool(true)) {
        return Err(format!(
            "{}: bind answered with an unknown status: expected a refusal, got exit {code}: {}",
            h.name,
            out.trim()
        ));
    }
    // What the firmware did is unknown to the driver: put the function back free.
    free_all(&emu, &e, "after the bind-status lie")?;

    // Fabric events: each lie rides on the reply to the read a fabric change starts.
    let change = |h: &mut Host| -> Result<(), String> {
        let _ = h;
        emu.request("fabric-change").map(|_| ())
    };
    one_lie(
        &emu,
        h,
        "event-code",
        "fabric event with unknown code 0x42",
        change,
    )?;
    one_lie(
        &emu,
        h,
        "event-count",
        "fabric event reply with [0-9]+ events",
        change,
    )?;
    one_lie(
        &emu,
        h,
        "unbind-request",
        "unbind request for 0x0fff|fabric event with unknown code 0x80",
        change,
    )?;

    if extended {
        bind_here(h, &e, GPU0)?;
        pcifab_ok(
            h,
            &format!("p2p route add {GPU0:#06x} --size 1M --window-off 0"),
        )?;
        let (code, _, out) = one_lie(
            &emu,
            h,
            "dma-done",
            "DMA descriptor .* bytes done of",
            |h| {
                pcifab_cmd(
                    h,
                    &format!("p2p copy --from {GPU0:#06x}:0 --to file:/tmp/lie.out --len 4096"),
                )
            },
        )?;
        if code == 0 {
            return Err(format!(
                "{}: copy whose write-back claimed more bytes than asked: expected a \
                 failure, got exit 0: {}",
                h.name,
                out.trim()
            ));
        }
        pcifab_ok(h, "p2p route del 0")?;
        pcifab_ok(h, &format!("unbind {GPU0:#06x}"))?;
    } else {
        crate::say("# firmware lies: dma-done needs the DMA engine (extended dialect): not told");
    }
    recovered(h)
}

/// `EIO` as the CLI's JSON reports it.
const EIO: i64 = 5;

/// A bind the firmware answered with success but that left another function on the port
/// than the one asked for (`fault HOST lie bind-other`): reported as bound before. The driver
/// reads the host's HVD after the bind, must fail it with `EIO`, log the lie naming what it
/// asked and what it saw, and take the port back (the emulator then shows nothing bound);
/// a normal bind afterwards works.
pub fn firmware_lies_bind_other(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    let t = Instant::now();
    let (code, v, out) = one_lie(
        &emu,
        h,
        "bind-other",
        &format!(
            "bind of {GPU0:#06x} to host {} port [0-9]+ accepted, but the port holds 0x[0-9a-f]{{4}}; unbinding",
            h.index
        ),
        |h| pcifab_cmd(h, &format!("bind {GPU0:#06x} --host {}", h.index)),
    )?;
    crate::say(&format!(
        "# firmware lies: the lying bind failed after {} ms",
        t.elapsed().as_millis()
    ));
    let mut c = Checks::new(&format!("{}: bind that bound another function", h.name));
    if code == 0 || v.get("ok") == Some(&Value::Bool(true)) {
        c.fail(format!(
            "expected a failure, got exit {code}: {}",
            out.trim()
        ));
    }
    c.eq("errno", Some(EIO), v["error"]["errno"].as_i64());
    let (owners, _) = emu_owners(&emu, &e)?;
    c.eq(
        "functions the emulator shows bound afterwards",
        Vec::<u16>::new(),
        owners.keys().copied().collect::<Vec<_>>(),
    );
    c.finish()?;
    bind_here(h, &e, GPU0)?;
    pcifab_ok(h, &format!("unbind {GPU0:#06x}"))?;
    recovered(h)
}

/// An UNBIND_REQUEST that reaches the owner after the function left it is normal (the
/// request raced the function's unbind): `fault HOST late-unbind-request` makes the emulator
/// queue one more request for the function after its UNBIND, as a request that crossed this
/// host's own unbind would come. The driver must log it as a stale request (info level),
/// never as a firmware lie, and remove nothing; before, it was counted and logged as `firmware
/// lie #N: unbind request for 0x0300 on port P, which holds -1`. A request for a function
/// never bound here stays a lie (`firmware lies: ...` checks that).
pub fn stale_unbind_request(f: &mut Fabric) -> Result<(), String> {
    if f.dialect() == Dialect::Pax {
        return Err("needs the extended dialect: PAX firmware sends no UNBIND_REQUEST".into());
    }
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    let count = |h: &mut Host, pattern: &str| -> Result<u64, String> {
        let o = h.run(&format!("dmesg | grep -cE '{pattern}'; true"))?;
        o.out
            .trim()
            .parse()
            .map_err(|_| format!("{}: counting `{pattern}`: {:?}", h.name, o.out.trim()))
    };
    let stale_line = format!(
        "stale unbind request #[0-9]+: unbind request for {GPU0:#06x} on port [0-9]+, which it \
         has left; ignored"
    );
    bind_here(h, &e, GPU0)?;
    emu.request(&format!("fault {} late-unbind-request", h.name))?;
    pcifab_ok(h, &format!("unbind {GPU0:#06x}"))?;
    let seen = wait_for(
        h,
        &format!("{{ dmesg | grep -qE '{stale_line}' || dmesg | grep -q 'firmware lie #'; }}"),
        20,
    );
    let armed = emu.request("state");
    emu.request(&format!("fault clear {}", h.name))?;
    let seen = seen?;
    let mut c = Checks::new(&format!(
        "{}: unbind request after the function left",
        h.name
    ));
    if !seen {
        c.fail("within 20 s the driver logged neither a stale request nor a lie".into());
    }
    if armed?.to_string().contains("late-unbind-request") {
        c.fail("the emulator never sent the late UNBIND_REQUEST (fault still armed)".into());
    }
    c.eq("stale request lines", 1, count(h, &stale_line)?);
    c.eq("firmware lie lines", 0, count(h, "firmware lie #")?);
    c.finish()?;
    // Nothing was removed or unbound by the stale request: the function binds here again.
    bind_here(h, &e, GPU0)?;
    pcifab_ok(h, &format!("unbind {GPU0:#06x}"))?;
    recovered(h)
}

/// A MEP gone from the bus (surprise removal) reads all ones. Its interrupt handler must see
/// that and stop: before, it took every "occurred" bit as set, wrote the headers back,
/// counted events and queued work against a device that was not there.
pub fn gone_irq(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    // The driver says it once per probe (a shared line may bring the handler back again and
    // again): a fresh probe, so that a surprise removal an earlier scenario made in this
    // boot has not used it up.
    h.run_ok("[ -d /sys/module/pcifab ] && rmmod pcifab; true")?;
    ensure_pcifab(h)?;
    begin(h)?;
    let gone_writes = |emu: &EmuControl, host: &str| -> Result<u64, String> {
        let v = emu.request(&format!("lies {host}"))?;
        v["gone_writes"]
            .as_u64()
            .ok_or_else(|| format!("emulator `lies {host}` has no gone_writes: {v}"))
    };
    let before = gone_writes(&emu, &h.name)?;
    let irqs = stats_field(h, "event_irqs").ok();
    emu.request(&format!("fault {} gone", h.name))?;
    let seen = wait_for(h, "dmesg | grep -q 'event registers read all ones'", 20);
    // Only one interrupt: every BAR0 write from now on would be the handler's.
    let writes = gone_writes(&emu, &h.name);
    emu.request(&format!("fault clear {}", h.name))?;
    let mut c = Checks::new(&format!(
        "{}: interrupt while the MEP reads all ones",
        h.name
    ));
    c.eq("BAR0 writes while gone", 0, writes? - before);
    if !seen? {
        c.fail("the driver did not log that the event registers read all ones".into());
    }
    if let Some(n) = irqs {
        c.eq(
            "STATS event interrupts handled",
            n,
            stats_field(h, "event_irqs")?,
        );
    }
    c.finish()?;
    recovered(h)
}

/// The `pcifabN` misc devices of `h`, in order.
fn pcifab_names(h: &mut Host) -> Result<String, String> {
    let out = h.run_ok("ls /sys/class/misc | grep '^pcifab' | sort | tr '\\n' ' '")?;
    Ok(out.trim().to_string())
}

/// Unbinding the MEP gives its number back: bound again, it is `pcifab0` again, each of
/// [`NUMBER_CYCLES`] times, and nothing else is left. One MEP per guest is all the emulator
/// gives, so neither more endpoints than the old table of eight names nor running out of
/// numbers (`ENOSPC`) can be reached here; this proves that the numbers come back.
pub fn number_comes_back(f: &mut Fabric) -> Result<(), String> {
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    begin(h)?;
    let bdf = find_mep(h)?;
    let mut c = Checks::new(&format!(
        "{}: /dev/pcifabN over {NUMBER_CYCLES} unbinds and binds of the MEP",
        h.name
    ));
    for i in 0..NUMBER_CYCLES {
        h.run_ok(&format!("echo {bdf} > /sys/bus/pci/drivers/pcifab/unbind"))?;
        let unbound = pcifab_names(h)?;
        h.run_ok(&format!("echo {bdf} > /sys/bus/pci/drivers/pcifab/bind"))?;
        let bound = pcifab_names(h)?;
        let good = unbound.is_empty() && bound == "pcifab0";
        c.eq(
            &format!("cycle {i}: names while unbound"),
            "",
            unbound.as_str(),
        );
        c.eq(
            &format!("cycle {i}: names when bound again"),
            "pcifab0",
            bound.as_str(),
        );
        if !good {
            break;
        }
    }
    c.finish()?;
    check_bound_pcifab(h)?;
    recovered(h)
}

/// Unbind/bind cycles of [`number_comes_back`]: more than the eight names there were.
const NUMBER_CYCLES: u32 = 10;

/// The sysfs directory of h0's MEP.
const MISC0: &str = "/sys/class/misc/pcifab0";

/// A counter of `/sys/class/misc/pcifab0`.
fn misc0_counter(h: &mut Host, file: &str) -> Result<u64, String> {
    let out = h.run_ok(&format!("cat {MISC0}/{file}"))?;
    out.trim()
        .parse()
        .map_err(|e| format!("{}: {MISC0}/{file}: {e}: {out:?}", h.name))
}

/// The MEP's registers go back to their power-on values as a function-level or bus reset
/// leaves them, config space restored (`reset-regs h0`): every event header's interrupt is
/// off. A bind h1 makes afterwards must still reach h0 as a fabric event, with h0 issuing no
/// command that could find the reset out, and h0's mailbox commands must complete through the
/// event interrupt again, not the 50 ms status poll. Before, the driver enabled the event
/// interrupts at probe only: h0 never heard of the bind and no completion interrupted.
///
/// DMA MRPC is withdrawn first: with it, completions come on its own vector, which every
/// command sets up again, so only the mailbox shows the completion interrupt.
pub fn events_after_reset(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let r = events_after_reset_checks(f, &emu);
    let back = emu.request("fault h0 dma-mrpc on").map(|_| ());
    r?;
    back?;
    // The first command after DMA MRPC is offered again arms it (`mrpc_dma` back to 1).
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    selftest_json(h0, "echo --count 1 --size 64", CMD_TIMEOUT_SHORT)?;
    let mut c = Checks::new("h0: DMA MRPC offered again after the scenario");
    c.eq("mrpc_dma", 1, misc0_counter(h0, "mrpc_dma")?);
    c.finish()?;
    check_world(f, &Owners::new(), "events after a reset")?;
    dmesg_clean(&mut f.hosts[0])
}

/// The body of [`events_after_reset`]; DMA MRPC is offered again by the caller.
fn events_after_reset_checks(f: &mut Fabric, emu: &EmuControl) -> Result<(), String> {
    const VF: u16 = 0x0403;
    let (h0, h1) = two_hosts(&mut f.hosts, "the scenario needs h1 to bind")?;
    emu.request("fault h0 dma-mrpc off")?;
    // One command finds DMA MRPC withdrawn and turns the completion interrupt on.
    selftest_json(h0, "echo --count 1 --size 64", CMD_TIMEOUT_SHORT)?;
    let mut c = Checks::new("h0: the mailbox before the reset");
    c.eq("mrpc_dma", 0, misc0_counter(h0, "mrpc_dma")?);
    c.finish()?;
    emu.request("reset-regs h0")?;
    let gfms0 = misc0_counter(h0, "events_gfms")?;
    let cmds0 = misc0_counter(h0, "mrpc_commands")?;
    pcifab_ok(h1, &format!("bind {VF:#06x} --host 1"))?;
    let t = Instant::now();
    let seen = wait_for(
        h0,
        &format!("[ $(cat {MISC0}/events_gfms) -gt {gfms0} ]"),
        30,
    )?;
    let ms = t.elapsed().as_millis();
    // Commands h0 sent until then (the fabric-event work's reads), none before the event.
    let cmds = misc0_counter(h0, "mrpc_commands")?.wrapping_sub(cmds0);
    let irqs0 = stats_field(h0, "event_irqs")?;
    let echo = selftest_json(h0, "echo --count 20 --size 64", CMD_TIMEOUT_SHORT);
    let irqs = stats_field(h0, "event_irqs")?.wrapping_sub(irqs0);
    let logged = h0
        .run("dmesg | grep -q 'event interrupts lost their set-up'")?
        .code
        == 0;
    h0.log_note(&format!(
        "after reset-regs: h1's bind seen by h0 {} in {ms} ms ({cmds} commands by h0 by \
         then); 20 mailbox echoes: {irqs} event interrupts",
        if seen { "as a fabric event" } else { "NOT" },
    ));
    let unbound = pcifab_ok(h1, &format!("unbind {VF:#06x}"));
    let mut c = Checks::new("h0 after the MEP's registers were reset");
    if !seen {
        c.fail(format!(
            "h0 saw no fabric event within 30 s of h1's bind after the reset \
             ({MISC0}/events_gfms stayed at {gfms0})"
        ));
    }
    if let Err(e) = echo {
        c.fail(format!("20 echoes in the mailbox after the reset: {e}"));
    }
    // Each completion interrupts; two may share one when the waiter saw the status before
    // the interrupt came and the next command finished first. None at all: polled.
    if irqs < 10 {
        c.fail(format!(
            "20 mailbox commands raised {irqs} event interrupts (at least 10 expected): \
             completions were polled"
        ));
    }
    if !logged {
        c.fail("the driver did not log that the event interrupts lost their set-up".into());
    }
    c.finish()?;
    unbound.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::hostile_outcomes;

    #[test]
    fn hostile_outcomes_need_named_errors() {
        let out = "rc=0 pcifab info\n\
                   rc=1 pcifab list\nerr: pcifab: reading the fabric: EIO (firmware reply)\n\
                   rc=3 pcifab bind 0x0301 --host 0\nerr: pcifab: bind 0x0301: refused: EBUSY\n\
                   rc=1 cat /sys/class/misc/pcifab0/temperature\nerr: cat: read error: I/O error\n";
        assert!(
            hostile_outcomes(out).is_empty(),
            "{:?}",
            hostile_outcomes(out)
        );
        let out = "rc=1 pcifab list\n\
                   rc=124 pcifab show 0x0301\n\
                   rc=1 pcifab stats\nerr: thread 'main' panicked at src/main.rs:1:1\n\
                   rc=1 cat /sys/x\nerr: pcifab: wrong tool\n";
        let bad = hostile_outcomes(out);
        assert_eq!(bad.len(), 4, "{bad:?}");
        assert!(bad[1].starts_with("exit 124"));
    }
}
