// SPDX-License-Identifier: GPL-2.0-only

//! Scenarios of what the packages set up (Documentation/install.rst): the udev rule's
//! ownership of /dev/pcifab0 for group pcifab, and choosing pcifab over switchtec for the
//! management endpoint with driver_override while both modules are loaded.
//!
//! The guests run no udevd: the first scenario reads GROUP and MODE from the rule file the
//! packages install (packaging/udev/60-pcifab.rules, built in) and applies them as udev
//! would; `make check-systemd` checks the rule parses (udevadm verify).

use crate::checks::{
    check_bound_pcifab, driver_of, ensure_pcifab, find_mep, json_line, module_loaded, wait_for,
    Checks, PCIFAB_KO, SWITCHTEC_KO,
};
use crate::fabric::{Fabric, Host};

/// The rule the packages install.
const RULE: &str = include_str!("../../../../packaging/udev/60-pcifab.rules");

/// (group, mode) the rule gives a `pcifab*` misc device.
fn rule_owner(rules: &str) -> Result<(String, String), String> {
    let line = rules
        .lines()
        .map(str::trim)
        .find(|l| !l.starts_with('#') && l.contains("KERNEL==\"pcifab"))
        .ok_or("60-pcifab.rules: no rule matching KERNEL==\"pcifab...\"")?;
    let value = |key: &str| {
        line.split(',')
            .map(str::trim)
            .find_map(|kv| kv.strip_prefix(key))
            .map(|v| v.trim_matches('"').to_string())
            .ok_or(format!("60-pcifab.rules: no {key} in {line:?}"))
    };
    Ok((value("GROUP=")?, value("MODE=")?))
}

const USER: &str = "fabuser";
const OTHER: &str = "fabother";

/// As `user`: `pcifab ARGS --json`; (exit code, validated JSON, output).
fn as_user(
    h: &mut Host,
    user: &str,
    args: &str,
) -> Result<(i64, serde_json::Value, String), String> {
    let o = h.run(&format!("su -s /bin/sh {user} -c 'pcifab {args} --json'"))?;
    h.log_note(&format!("as {user}: pcifab {args}: exit {}", o.code));
    let v = json_line(&o.out).map_err(|e| format!("{}: as {user}: pcifab {args}: {e}", h.name))?;
    Ok((o.code, v, o.out))
}

pub fn group_access(f: &mut Fabric) -> Result<(), String> {
    let (group, mode) = rule_owner(RULE)?;
    let h = &mut f.hosts[0];
    ensure_pcifab(h)?;
    check_bound_pcifab(h)?;
    // What the device had before, to put back at the end.
    let before = h.run_ok("stat -c '%g %a' /dev/pcifab0")?;
    let (gid, was_mode) = before.trim().split_once(' ').unwrap_or(("0", "600"));
    let restore = format!("chgrp {gid} /dev/pcifab0 && chmod {was_mode} /dev/pcifab0");
    h.run_ok(&format!(
        "mkdir -p /etc; grep -q '^{group}:' /etc/group || echo '{group}:x:990:{USER}' >>/etc/group; \
         grep -q '^{USER}:' /etc/passwd || echo '{USER}:x:990:990:{USER}:/:/bin/sh' >>/etc/passwd; \
         grep -q '^{OTHER}:' /etc/passwd || echo '{OTHER}:x:991:991:{OTHER}:/:/bin/sh' >>/etc/passwd; \
         chgrp {group} /dev/pcifab0 && chmod {mode} /dev/pcifab0"
    ))?;
    let mut c = Checks::new(&format!("{}: /dev/pcifab0 as the rule sets it", h.name));
    let ls = h.run_ok("stat -c '%u %G %a' /dev/pcifab0")?;
    c.eq(
        "owner uid, group, mode",
        format!("0 {group} {}", mode.trim_start_matches('0')),
        ls.trim().to_string(),
    );
    // A member of the group: the read-only commands work.
    for args in ["list", "info", "stats"] {
        let (code, v, out) = as_user(h, USER, args)?;
        c.eq(&format!("{USER}: pcifab {args}: exit"), 0, code);
        c.eq_json(
            &format!("{USER}: pcifab {args}: ok"),
            true.into(),
            v["ok"].clone(),
        );
        if code != 0 {
            c.fail(format!("{USER}: pcifab {args}: {}", out.trim()));
        }
    }
    // ... and the ones that change the fabric fail with EPERM and say what is missing.
    for args in [
        "bind 0x0300 --host 0",
        "unbind 0x0300",
        "p2p route add 0x0300 --size 4k",
    ] {
        let (code, v, out) = as_user(h, USER, args)?;
        c.eq(&format!("{USER}: pcifab {args}: exit"), 1, code);
        c.eq_json(
            &format!("{USER}: pcifab {args}: errno"),
            1.into(),
            v["error"]["errno"].clone(),
        );
        c.eq_json(
            &format!("{USER}: pcifab {args}: code"),
            "EPERM".into(),
            v["error"]["code"].clone(),
        );
        if !out.contains("CAP_SYS_ADMIN") {
            c.fail(format!(
                "{USER}: pcifab {args}: the message does not name CAP_SYS_ADMIN: {}",
                out.trim()
            ));
        }
    }
    // Not in the group: the device does not open, and the message says how to get access.
    let (code, v, out) = as_user(h, OTHER, "list")?;
    c.eq(&format!("{OTHER}: pcifab list: exit"), 1, code);
    c.eq_json(
        &format!("{OTHER}: pcifab list: code"),
        "EACCES".into(),
        v["error"]["code"].clone(),
    );
    if !out.contains("group pcifab") {
        c.fail(format!(
            "{OTHER}: pcifab list: the message does not name group pcifab: {}",
            out.trim()
        ));
    }
    h.run_ok(&restore)?;
    c.finish()
}

/// Runs the recipe of Documentation/install.rst: `driver` takes `bdf` from whoever holds it.
fn hand_to(h: &mut Host, bdf: &str, from: &str, driver: &str) -> Result<(), String> {
    h.run_ok(&format!(
        "echo {driver} > /sys/bus/pci/devices/{bdf}/driver_override && \
         echo {bdf} > /sys/bus/pci/drivers/{from}/unbind && \
         echo {bdf} > /sys/bus/pci/drivers_probe"
    ))
    .map(|_| ())
}

pub fn driver_override(f: &mut Fabric) -> Result<(), String> {
    let h = &mut f.hosts[0];
    let r = override_inner(h);
    // Whatever happened: no override left, switchtec gone, pcifab bound for what follows.
    let bdf = find_mep(h)?;
    h.run(&format!(
        "echo > /sys/bus/pci/devices/{bdf}/driver_override; \
         [ -d /sys/module/switchtec ] && rmmod switchtec; \
         [ -d /sys/module/pcifab ] || insmod {PCIFAB_KO}; \
         [ -e /sys/bus/pci/devices/{bdf}/driver ] || echo {bdf} > /sys/bus/pci/drivers_probe"
    ))?;
    r.and_then(|()| check_bound_pcifab(h))
}

fn override_inner(h: &mut Host) -> Result<(), String> {
    let bdf = find_mep(h)?;
    if module_loaded(h, "pcifab")? {
        h.run_ok("rmmod pcifab")?;
    }
    // switchtec first: it takes the MEP; pcifab loaded after it finds nothing to bind.
    h.run_ok(&format!("insmod {SWITCHTEC_KO} && insmod {PCIFAB_KO}"))?;
    let mut c = Checks::new(&format!("{}: switchtec and pcifab both loaded", h.name));
    c.eq(
        "driver of the MEP after both loaded",
        Some("switchtec".to_string()),
        driver_of(h, &bdf)?,
    );
    c.eq(
        "/dev/pcifab0 exists",
        false,
        h.run("[ -e /dev/pcifab0 ]")?.code == 0,
    );
    c.finish()?;

    hand_to(h, &bdf, "switchtec", "pcifab")?;
    let mut c = Checks::new(&format!("{}: driver_override=pcifab", h.name));
    c.eq(
        "driver of the MEP",
        Some("pcifab".to_string()),
        driver_of(h, &bdf)?,
    );
    c.eq(
        "/dev/pcifab0 appears",
        true,
        wait_for(h, "[ -c /dev/pcifab0 ]", 5)?,
    );
    let o = h.run("pcifab info --json")?;
    c.eq("pcifab info: exit", 0, o.code);
    let v = json_line(&o.out)?;
    c.eq_json(
        "pcifab info: schema",
        "pcifab/info/v1".into(),
        v["schema"].clone(),
    );
    c.eq(
        "switchtec still loaded",
        true,
        module_loaded(h, "switchtec")?,
    );
    c.finish()?;

    hand_to(h, &bdf, "pcifab", "switchtec")?;
    let mut c = Checks::new(&format!("{}: driver_override=switchtec", h.name));
    c.eq(
        "driver of the MEP",
        Some("switchtec".to_string()),
        driver_of(h, &bdf)?,
    );
    c.eq(
        "/sys/class/switchtec/switchtec0 appears",
        true,
        wait_for(h, "[ -d /sys/class/switchtec/switchtec0 ]", 5)?,
    );
    c.eq(
        "/dev/pcifab0 gone",
        true,
        wait_for(h, "[ ! -e /dev/pcifab0 ]", 5)?,
    );
    c.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_shipped_rule() {
        assert_eq!(
            rule_owner(RULE).ok(),
            Some(("pcifab".to_string(), "0660".to_string()))
        );
        assert!(rule_owner("# nothing\n").is_err());
        assert!(rule_owner("KERNEL==\"pcifab*\", MODE=\"0600\"").is_err());
    }
}
