// SPDX-License-Identifier: GPL-2.0-only
//! The management network between the guests and the TLS material for it
//! (Documentation/testing.rst, "The management network"): h0, the fabric manager's host,
//! has one point-to-point link to every other host k, 10.77.k.1 on h0's end and 10.77.k.2
//! on host k's; nothing else is on it. The scenarios here prove that from inside the
//! guests; the addresses and the TLS material come from `checks::net`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::checks::{expect_eq, h0_end, host_end, TlsFiles};
use crate::fabric::{mgmt_mac, Fabric, Host};
use crate::tls;

/// One network interface of a guest: name and MAC.
struct Nic {
    dev: String,
    mac: String,
}

/// The guest's interfaces other than `lo`.
fn nics(h: &mut Host) -> Result<Vec<Nic>, String> {
    let out = h.run_ok(
        "for d in /sys/class/net/*; do n=${d##*/}; [ \"$n\" = lo ] && continue; \
         echo \"$n $(cat $d/address)\"; done",
    )?;
    out.lines()
        .map(
            |l| match l.split_whitespace().collect::<Vec<_>>().as_slice() {
                [dev, mac] => Ok(Nic {
                    dev: dev.to_string(),
                    mac: mac.to_string(),
                }),
                _ => Err(format!("{}: unexpected interface line {l:?}", h.name)),
            },
        )
        .collect()
}

/// The destinations of the guest's IPv4 routes in the main table, sorted.
fn routes(h: &mut Host) -> Result<Vec<String>, String> {
    let out = h.run_ok("ip -4 route show")?;
    let mut v: Vec<String> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    v.sort();
    Ok(v)
}

/// Waits (at most 60 s) until the interface `dev` has its carrier: QEMU reports the
/// link up once both ends of its stream are connected.
fn wait_carrier(h: &mut Host, dev: &str) -> Result<(), String> {
    h.run_ok_timeout(
        &format!(
            "i=0; until [ \"$(cat /sys/class/net/{dev}/carrier 2>/dev/null)\" = 1 ]; do \
               [ $i -ge 600 ] && {{ echo '{dev}: no carrier within 60 s'; exit 1; }}; \
               sleep 0.1; i=$((i+1)); done"
        ),
        Duration::from_secs(90),
    )
    .map(|_| ())
}

/// Scenario: every host k reaches h0 at 10.77.k.1 (ping, and a TCP payload that h0 checks),
/// h0 reaches it at 10.77.k.2, and nothing else is reachable: each guest has only its
/// management NICs, only the routes of its links (no default route), off-link addresses
/// (another host's link, QEMU's user-mode gateway, anything else) are unreachable, and h0
/// does not forward between the links.
pub fn reach_manager_only(f: &mut Fabric) -> Result<(), String> {
    let n = f.hosts.len();
    if n < 2 {
        f.skip("the management network needs at least two hosts");
        return Ok(());
    }
    // Each guest's NICs are exactly its management NICs, with the addresses the MACs say.
    let mut devs: Vec<Vec<(usize, String)>> = Vec::new();
    for i in 0..n {
        let h = &mut f.hosts[i];
        let links: Vec<usize> = if i == 0 { (1..n).collect() } else { vec![i] };
        let found = nics(h)?;
        let mut want_macs: Vec<String> = links.iter().map(|&k| mgmt_mac(k, i == 0)).collect();
        want_macs.sort();
        let mut got_macs: Vec<String> = found.iter().map(|x| x.mac.clone()).collect();
        got_macs.sort();
        expect_eq(
            &format!("{}: MACs of its network interfaces", h.name),
            &want_macs,
            &got_macs,
        )?;
        let mut mine = Vec::new();
        for &k in &links {
            let mac = mgmt_mac(k, i == 0);
            let Some(nic) = found.iter().find(|x| x.mac == mac) else {
                return Err(format!("{}: no interface with MAC {mac}", h.name));
            };
            let addr = if i == 0 { h0_end(k) } else { host_end(k) };
            let out = h.run_ok(&format!("ip -4 -o addr show dev {}", nic.dev))?;
            let got: Vec<&str> = out
                .lines()
                .filter_map(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.iter()
                        .position(|x| *x == "inet")
                        .and_then(|p| w.get(p + 1).copied())
                })
                .collect();
            let want = format!("{addr}/24");
            expect_eq(
                &format!("{}: IPv4 addresses of {} ({mac})", h.name, nic.dev),
                vec![want.as_str()],
                got,
            )?;
            mine.push((k, nic.dev.clone()));
        }
        // Only the links' routes: no default route, nothing towards the outside.
        let mut want_routes: Vec<String> =
            links.iter().map(|k| format!("10.77.{k}.0/24")).collect();
        want_routes.sort();
        expect_eq(&format!("{}: IPv4 routes", h.name), want_routes, routes(h)?)?;
        devs.push(mine);
    }
    // h0's addresses are the ones the manager's certificate names.
    let out = f.hosts[0].run_ok("ip -4 -o addr show")?;
    let mut got: Vec<String> = out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let p = w.iter().position(|x| *x == "inet")?;
            let a = w.get(p + 1)?.split('/').next()?;
            (a != "127.0.0.1").then(|| a.to_string())
        })
        .collect();
    got.sort();
    let mut want = f.manager_addrs();
    want.sort();
    expect_eq("h0: its management addresses", want, got)?;
    // h0 routes nothing from one host's link to another's.
    let fwd = f.hosts[0].run_ok("cat /proc/sys/net/ipv4/ip_forward")?;
    expect_eq("h0: net.ipv4.ip_forward", "0", fwd.trim())?;

    for k in 1..n {
        let h0_dev = devs[0]
            .iter()
            .find(|(j, _)| *j == k)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| format!("h0 has no interface for host {k}'s link"))?;
        let hk_dev = devs[k][0].1.clone();
        wait_carrier(&mut f.hosts[0], &h0_dev)?;
        wait_carrier(&mut f.hosts[k], &hk_dev)?;
        let mgr = f.manager_addr(k)?;
        let own = f.mgmt_addr(k)?;
        // Both ways, every echo answered.
        for (from, to) in [(k, &mgr), (0, &own)] {
            let h = &mut f.hosts[from];
            let out =
                h.run_ok_timeout(&format!("ping -c 3 -w 30 {to}"), Duration::from_secs(45))?;
            if !out.contains("3 packets transmitted, 3 packets received") {
                return Err(format!(
                    "{}: ping {to}: expected 3 of 3 echoes answered, got: {}",
                    h.name,
                    out.trim_end()
                ));
            }
        }
        // A TCP payload from host k to h0's listener arrives intact.
        let port = 7070 + k;
        let token = format!(
            "pcifab-mgmt-{k}-{}",
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let out_file = format!("/tmp/mgmt-nc-{k}.out");
        f.hosts[0].run_ok(&format!(
            "rm -f {out_file}; nc -l -p {port} > {out_file} 2>&1 </dev/null & echo $! > {out_file}.pid\n\
             i=0; until netstat -ltn | grep -q ':{port} '; do \
               [ $i -ge 100 ] && {{ echo 'nc is not listening on {port} after 10 s'; exit 1; }}; \
               sleep 0.1; i=$((i+1)); done"
        ))?;
        let sent = f.hosts[k].run_timeout(
            &format!("echo {token} | nc -w 10 {mgr} {port}"),
            Duration::from_secs(30),
        )?;
        let got = f.hosts[0].run_ok(&format!(
            "p=$(cat {out_file}.pid); i=0\n\
             while kill -0 $p 2>/dev/null; do \
               [ $i -ge 100 ] && {{ kill $p; echo 'the listener got no end of stream within 10 s'; exit 1; }}; \
               sleep 0.1; i=$((i+1)); done\n\
             cat {out_file}"
        ));
        if sent.code != 0 {
            return Err(format!(
                "{}: nc {mgr} {port} exited with {}: {}",
                f.hosts[k].name,
                sent.code,
                sent.out.trim_end()
            ));
        }
        expect_eq(
            &format!("h0: what host {k} sent over TCP to {mgr}:{port}"),
            token.as_str(),
            got?.trim_end(),
        )?;
        // Off-link addresses: another host's link, QEMU's user-mode gateway, a documentation
        // address. No route, so the kernel refuses at once.
        let h = &mut f.hosts[k];
        // Host k's neighbour's link: there is one with three hosts or more.
        let other = if k < 254 { k + 1 } else { k - 1 };
        for dst in [
            h0_end(other).to_string(),
            "10.0.2.2".to_string(),
            "192.0.2.1".to_string(),
        ] {
            let o = h.run(&format!("ping -c 1 -w 3 {dst}"))?;
            if o.code == 0 || !o.out.contains("unreachable") {
                return Err(format!(
                    "{}: ping {dst} off the management link: expected `Network is \
                     unreachable`, got exit {}: {}",
                    h.name,
                    o.code,
                    o.out.trim_end()
                ));
            }
        }
    }
    Ok(())
}

/// Scenario: the TLS material is in every guest at the documented paths, the manager's key
/// only in h0, every key readable by root only.
pub fn tls_installed(f: &mut Fabric) -> Result<(), String> {
    let principals = ["operator", "h1-tenant"];
    let files = f.tls_material(&principals)?;
    // Host side: certificates readable, keys private.
    for p in [
        files.ca(),
        files.manager_cert(),
        files.cert("operator"),
        files.cert("h1-tenant"),
    ] {
        let text = fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if !text.starts_with("-----BEGIN CERTIFICATE-----\n") {
            return Err(format!("{}: not a PEM certificate", p.display()));
        }
        let mode = fs::metadata(&p)
            .map_err(|e| format!("{}: {e}", p.display()))?
            .permissions()
            .mode()
            & 0o777;
        expect_eq(&format!("mode of {}", p.display()), 0o644, mode)?;
    }
    for p in [
        files.manager_key(),
        files.key("operator"),
        files.key("h1-tenant"),
    ] {
        let mode = fs::metadata(&p)
            .map_err(|e| format!("{}: {e}", p.display()))?
            .permissions()
            .mode()
            & 0o777;
        expect_eq(&format!("mode of {}", p.display()), 0o600, mode)?;
    }
    let ca =
        fs::read_to_string(files.ca()).map_err(|e| format!("{}: {e}", files.ca().display()))?;
    for h in &mut f.hosts {
        let mut want = vec![
            format!("{} 644", TlsFiles::guest_ca()),
            format!("{} 644", TlsFiles::guest_cert("h1-tenant")),
            format!("{} 600", TlsFiles::guest_key("h1-tenant")),
            format!("{} 644", TlsFiles::guest_cert("operator")),
            format!("{} 600", TlsFiles::guest_key("operator")),
        ];
        if h.index == 0 {
            want.push(format!("{} 644", TlsFiles::guest_manager_cert()));
            want.push(format!("{} 600", TlsFiles::guest_manager_key()));
        }
        want.sort();
        let out = h.run_ok(&format!("stat -c '%n %a' {}/*", tls::GUEST_DIR))?;
        let mut got: Vec<String> = out.lines().map(str::to_string).collect();
        got.sort();
        expect_eq(
            &format!("{}: files in {}", h.name, tls::GUEST_DIR),
            want,
            got,
        )?;
        let guest_ca = h.run_ok(&format!("cat {}", TlsFiles::guest_ca()))?;
        expect_eq(
            &format!("{}: {}", h.name, TlsFiles::guest_ca()),
            &ca,
            &guest_ca,
        )?;
    }
    // A second call with a new principal keeps the CA and adds the principal everywhere.
    let again = f.tls_material(&["late"])?;
    expect_eq(
        "principals after a second call",
        vec!["h1-tenant", "late", "operator"],
        again.principals.iter().map(String::as_str).collect(),
    )?;
    let ca2 =
        fs::read_to_string(again.ca()).map_err(|e| format!("{}: {e}", again.ca().display()))?;
    expect_eq("CA after a second call", &ca, &ca2)?;
    for h in &mut f.hosts {
        h.run_ok(&format!(
            "test -s {} && test -s {}",
            TlsFiles::guest_cert("late"),
            TlsFiles::guest_key("late")
        ))?;
    }
    // Hostile names are refused before anything is written.
    if f.tls_material(&["../../etc/shadow"]).is_ok() {
        return Err("tls_material accepted the principal \"../../etc/shadow\"".into());
    }
    Ok(())
}

/// Checks host k's link from both ends once both NICs have their carrier: the NIC with
/// host k's MAC has 10.77.k.2/24 and `ping -c 3` each way gets 3 of 3 answers.
fn link_works(f: &mut Fabric, k: usize) -> Result<(), String> {
    let mut ends = Vec::new();
    for i in [0, k] {
        let h = &mut f.hosts[i];
        let mac = mgmt_mac(k, i == 0);
        let dev = nics(h)?
            .into_iter()
            .find(|x| x.mac == mac)
            .map(|x| x.dev)
            .ok_or_else(|| format!("{}: no interface with MAC {mac}", h.name))?;
        wait_carrier(h, &dev)?;
        ends.push(dev);
    }
    let own = f.mgmt_addr(k)?;
    let out = f.hosts[k].run_ok(&format!("ip -4 -o addr show dev {}", ends[1]))?;
    if !out.contains(&format!(" inet {own}/24 ")) {
        return Err(format!(
            "{}: {} does not have {own}/24: {}",
            f.hosts[k].name,
            ends[1],
            out.trim_end()
        ));
    }
    for (from, to) in [(k, f.manager_addr(k)?), (0, own)] {
        let h = &mut f.hosts[from];
        let out = h.run_ok_timeout(&format!("ping -c 3 -w 30 {to}"), Duration::from_secs(45))?;
        if !out.contains("3 packets transmitted, 3 packets received") {
            return Err(format!(
                "{}: ping {to}: expected 3 of 3 echoes answered, got: {}",
                h.name,
                out.trim_end()
            ));
        }
    }
    Ok(())
}

/// Scenario: the last host's QEMU is killed and started again (same command line, as
/// [`Host::reboot`] does); its link with h0 comes back by itself (its end reconnects, h0's
/// listens again) and works both ways.
pub fn rebooted_host_reconnects(f: &mut Fabric) -> Result<(), String> {
    let n = f.hosts.len();
    if n < 2 {
        f.skip("the management network needs at least two hosts");
        return Ok(());
    }
    let k = n - 1;
    link_works(f, k)?;
    let h = &mut f.hosts[k];
    h.kill_qemu()?;
    let t = h.reboot()?;
    h.log_note(&format!("rebooted in {:.1} s", t.as_secs_f64()));
    link_works(f, k)
}
