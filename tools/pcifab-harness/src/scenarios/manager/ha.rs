// SPDX-License-Identifier: GPL-2.0-only
//! The manager's high availability in the guests (Documentation/manager.rst, "High
//! availability"; Documentation/testing.rst, "The manager scenarios"): a manager in h0 and
//! one in h1, each with `--executor driver` on its own host's pcifab, share their state in
//! a real three-member etcd cluster whose members run in the guests (e0 in h0, e1 and e2 in
//! h1) on the management network. h0, the leader's host, is powered off (its QEMU killed
//! with SIGKILL); the standby in h1 must take over, keep the grant h0's manager
//! acknowledged, serve a new grant through h1's driver, and leave no function bound to two
//! hosts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{cli_ok, expect, hexes, lease_functions, leases, pdfid, request, start_again};
use crate::checks::{
    check_invariants, check_world, compose_begin, emu_owners, h0_end, host_end, manager_log,
    owners, settled_owners, Checks, Owners, LOG, PIDFILE,
};
use crate::fabric::{EmuControl, Fabric, Host};

/// The leader's etcd lease (`[ha] lease_ttl_s`) and one etcd call's time-out
/// (`timeout_ms`; twice it must stay under the TTL).
const TTL_S: u64 = 10;
const TIMEOUT_MS: u64 = 3000;
/// etcd's Raft timing in the guests: TCG guests on a loaded two-core machine miss 100 ms
/// heartbeats (etcd's default), which would make the members elect again and again. The
/// managers' TTL and time-out are as long for the same reason: with 5 s and 1 s, calls to
/// the members in the sanitizer guests took more than a second on a loaded machine and the
/// first leader lost its lease at once.
const ETCD_HEARTBEAT_MS: u64 = 500;
const ETCD_ELECTION_MS: u64 = 5000;
/// What the takeover may take beyond the TTL: etcd may first have to elect a new Raft
/// leader (when e0 in h0 led: up to twice the election timeout, etcd's timeouts being
/// randomised; etcd then gives the leases a fresh TTL, counted from its election), then
/// the standby reads the leader key every fifth of the TTL (2 s), loads the state from
/// etcd, reads the fabric through its driver and opens its socket, and the harness sees it
/// through h1's agent (10 s for those on a loaded machine). Seen: 23.6 s with e0 leading.
const TAKEOVER_MARGIN_S: u64 = 2 * ETCD_ELECTION_MS.div_ceil(1000) + 10;

/// One etcd member: name, host index, address, client and peer ports.
struct Member {
    name: &'static str,
    host: usize,
    addr: String,
    client: u16,
    peer: u16,
}

impl Member {
    fn client_url(&self) -> String {
        format!("http://{}:{}", self.addr, self.client)
    }

    fn peer_url(&self) -> String {
        format!("http://{}:{}", self.addr, self.peer)
    }
}

/// e0 in h0, e1 and e2 in h1, on the addresses of host 1's management link.
fn members() -> Vec<Member> {
    let (a0, a1) = (h0_end(1).to_string(), host_end(1).to_string());
    vec![
        Member {
            name: "e0",
            host: 0,
            addr: a0,
            client: 2379,
            peer: 2380,
        },
        Member {
            name: "e1",
            host: 1,
            addr: a1.clone(),
            client: 2379,
            peer: 2380,
        },
        Member {
            name: "e2",
            host: 1,
            addr: a1,
            client: 12379,
            peer: 12380,
        },
    ]
}

/// Starts member `m` in its guest (data in /tmp/etcd-NAME, log /tmp/etcd-NAME.log).
fn start_member(h: &mut Host, m: &Member, all: &[Member]) -> Result<(), String> {
    let cluster: Vec<String> = all
        .iter()
        .map(|x| format!("{}={}", x.name, x.peer_url()))
        .collect();
    let n = m.name;
    h.run_ok(&format!(
        "rm -rf /tmp/etcd-{n}; : > /tmp/etcd-{n}.log\n\
         setsid etcd --name {n} --data-dir /tmp/etcd-{n} \
           --listen-client-urls {c} --advertise-client-urls {c} \
           --listen-peer-urls {p} --initial-advertise-peer-urls {p} \
           --initial-cluster {cl} --initial-cluster-state new \
           --initial-cluster-token pcifab-ha \
           --heartbeat-interval {ETCD_HEARTBEAT_MS} --election-timeout {ETCD_ELECTION_MS} \
           </dev/null >>/tmp/etcd-{n}.log 2>&1 &\n\
         echo $! > /tmp/etcd-{n}.pid\n\
         sleep 0.2; kill -0 $(cat /tmp/etcd-{n}.pid) || {{ echo 'etcd {n} exited:'; tail -20 /tmp/etcd-{n}.log; exit 1; }}",
        c = m.client_url(),
        p = m.peer_url(),
        cl = cluster.join(","),
    ))
    .map(|_| ())
    .map_err(|e| format!("starting etcd member {n}: {e}"))
}

/// Waits (at most 90 s) until member `m` says it is healthy (`/health`: it has a leader
/// and a quorum), asked from its own guest with `nc` (busybox's `wget` crashes in the
/// guest).
fn wait_healthy(h: &mut Host, m: &Member) -> Result<(), String> {
    let n = m.name;
    h.run_ok_timeout(
        &format!(
            "i=0; until printf 'GET /health HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {a} {p} 2>/dev/null \
               | grep -q '\"health\":\"true\"'; do\n\
               kill -0 $(cat /tmp/etcd-{n}.pid) 2>/dev/null || {{ echo 'etcd {n} exited:'; tail -20 /tmp/etcd-{n}.log; exit 1; }}\n\
               [ $i -ge 450 ] && {{ echo 'etcd {n} not healthy within 90 s:'; tail -20 /tmp/etcd-{n}.log; exit 1; }}\n\
               sleep 0.2; i=$((i+1))\n\
             done",
            a = m.addr,
            p = m.client
        ),
        Duration::from_secs(120),
    )
    .map(|_| ())
}

/// The managers' node names, by host.
fn node(host: usize) -> String {
    format!("fm-h{host}")
}

/// The configuration of host `host`'s manager: hosts 0 and 1, a hybrid pool of gpu1 (its
/// VFs from the inventory; gpu1 because h1's MEP may bind only gpu1 to h1, fabric.toml's
/// policy), `[ha]` on the three members, this host's own members first.
fn ha_config(f: &Fabric, host: usize) -> String {
    let g1 = pdfid(f, "gpu1", 0);
    let mut eps: Vec<String> = Vec::new();
    let all = members();
    for m in all.iter().filter(|m| m.host == host) {
        eps.push(format!("\"{}\"", m.client_url()));
    }
    for m in all.iter().filter(|m| m.host != host) {
        eps.push(format!("\"{}\"", m.client_url()));
    }
    format!(
        "[manager]\nhosts = {}\nmax_priority = 9\naging_s = 1000\ndefault_lease_s = 600\n\
         max_lease_s = 3600\nmax_functions_per_host = 4\n\n\
         [[pools]]\nname = \"gpus\"\nmode = \"hybrid\"\n\n\
         [[pools.devices]]\npf = {g1:#06x}\nprofile = \"quarter\"\n\n\
         [ha]\nendpoints = [{}]\nnode = \"{}\"\nadvertise = \"{}:/run/pcifab-manager.sock\"\n\
         lease_ttl_s = {TTL_S}\ntimeout_ms = {TIMEOUT_MS}\n",
        f.expected.hosts.len(),
        eps.join(", "),
        node(host),
        f.hosts[host].name,
    )
}

/// Starts the HA manager in `h` (no --state: with `[ha]` the state is etcd's) and waits
/// until its control socket answers, as the leader (`pcifab queue` works) or, with
/// `standby_of`, as a standby that has read who leads (a 421 reply naming that node).
fn start_ha_manager(h: &mut Host, config: &str, standby_of: Option<&str>) -> Result<(), String> {
    h.log_note(&format!("HA manager configuration:\n{config}"));
    let ready = match standby_of {
        None => "pcifab queue >/dev/null 2>&1".to_string(),
        Some(n) => format!(
            "pcifab-manager --ask '{{\"op\":\"queue\"}}' 2>/dev/null | grep -q '\"node\":\"{n}\"'"
        ),
    };
    h.run_ok_timeout(
        &format!(
            ": > {LOG}\ncat > /tmp/pcifab-manager-ha.toml <<'EOF'\n{config}EOF\n\
             setsid pcifab-manager --config /tmp/pcifab-manager-ha.toml \
               --socket /run/pcifab-manager.sock --executor driver \
               </dev/null >>{LOG} 2>&1 &\n\
             echo $! > {PIDFILE}\n\
             i=0\n\
             until {ready}; do\n\
               kill -0 $(cat {PIDFILE}) 2>/dev/null || {{ echo 'pcifab-manager exited:'; tail -20 {LOG}; exit 1; }}\n\
               [ $i -ge 300 ] && {{ echo 'pcifab-manager did not answer within 60 s:'; tail -20 {LOG}; exit 1; }}\n\
               sleep 0.2; i=$((i+1))\n\
             done"
        ),
        Duration::from_secs(90),
    )
    .map(|_| ())
    .map_err(|e| format!("starting the HA manager in {}: {e}", h.name))
}

/// What `h`'s control socket answers to `{"op":"leases"}` (the standby's refusal too).
fn socket_reply(h: &mut Host) -> Result<Value, String> {
    let o = h.run("pcifab-manager --ask '{\"op\":\"leases\"}'")?;
    serde_json::from_str(o.out.trim()).map_err(|e| {
        format!(
            "{}: `pcifab-manager --ask {{\"op\":\"leases\"}}`: expected one JSON line, got \
             {:?} ({e})",
            h.name,
            o.out.trim()
        )
    })
}

/// The epoch `h`'s manager logged when it was elected.
fn epoch(h: &mut Host) -> Result<u64, String> {
    let n = node(h.index);
    let out = h.run_ok(&format!(
        "sed -n 's/.*node {n}: the leader, epoch \\([0-9]*\\).*/\\1/p' {LOG}"
    ))?;
    match out.trim().parse() {
        Ok(e) => Ok(e),
        Err(_) => {
            let log = manager_log(h, 20);
            Err(format!(
                "{}: the manager's log has no `node {n}: the leader, epoch N` line: {log}",
                h.name
            ))
        }
    }
}

/// Stops the manager and the etcd members `h` runs (SIGKILL; nothing of them is kept).
fn stop_all(h: &mut Host) -> Result<(), String> {
    h.run_ok(&format!(
        "for p in {PIDFILE} /tmp/etcd-*.pid; do [ -f \"$p\" ] || continue; \
           kill -KILL $(cat \"$p\") 2>/dev/null; rm -f \"$p\"; done\n\
         rm -rf /tmp/etcd-e?"
    ))
    .map(|_| ())
}

/// Nothing is bound to two hosts: in the emulator's own state every function is listed
/// once with at most one owner (and its invariants hold: no PF bound while one of its VFs
/// is), no function is in two leases, and the fabric holds exactly the leases' functions,
/// each at its lease's host.
fn one_host_each(
    emu: &EmuControl,
    f: &Fabric,
    leases: &[(u64, u64, Vec<String>)],
    step: &str,
) -> Result<(), String> {
    // Once no operation is in flight (the manager binds without waiting for the host).
    let got = settled_owners(
        emu,
        &f.expected,
        Duration::from_secs(15),
        Duration::from_millis(200),
    )
    .map_err(|e| format!("after {step}: {e}"))?;
    check_invariants(emu, step)?;
    let state = emu.request("state")?;
    let mut c = Checks::new(&format!("after {step}: nothing bound to two hosts"));
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for b in state["bindings"].as_array().into_iter().flatten() {
        *seen
            .entry(b["pdfid"].as_u64().unwrap_or(u64::MAX))
            .or_default() += 1;
    }
    for (p, n) in &seen {
        if *n != 1 {
            c.fail(format!(
                "the emulator lists function {p:#06x} {n} times in its bindings"
            ));
        }
    }
    let mut want = Owners::new();
    for (id, host, fns) in leases {
        for s in fns {
            let p = u16::from_str_radix(s.trim_start_matches("0x"), 16)
                .map_err(|e| format!("lease {id}: function {s:?}: {e}"))?;
            if let Some(h) = want.insert(p, *host as usize) {
                c.fail(format!(
                    "function {s} is in two leases (host {h} and lease {id} for host {host})"
                ));
            }
        }
    }
    c.eq(
        "the emulator's bindings are the leases' functions at their hosts",
        want,
        got,
    );
    c.finish()
}

/// (id, host, functions) of every lease `h`'s manager lists.
fn lease_hosts(h: &mut Host) -> Result<Vec<(u64, u64, Vec<String>)>, String> {
    let v = cli_ok(h, "leases")?;
    Ok(v["leases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|l| {
                    (
                        l["id"].as_u64().unwrap_or(0),
                        l["host"].as_u64().unwrap_or(u64::MAX),
                        lease_functions(l),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Scenario: see the module's documentation and Documentation/testing.rst.
pub fn leader_host_powered_off(f: &mut Fabric) -> Result<(), String> {
    if f.hosts.len() < 2 {
        f.skip("two managers in two guests need two hosts");
        return Ok(());
    }
    if !f.etcd {
        return Err(
            "the guests have no etcd: pass --etcd PATH (tools/scripts/etcd.sh prints it; the \
             Makefile's debug-manager cell and `make scenarios` pass it)"
                .into(),
        );
    }
    compose_begin(f)?;
    let r = powered_off(f);
    // Whatever happened: the managers and etcd stopped in every live guest, every function
    // freed through the emulator, h0 booted again for the scenarios after this one.
    let mut cleanup = Vec::new();
    for h in f.hosts.iter_mut().filter(|h| !h.is_dead()) {
        if let Err(e) = stop_all(h) {
            cleanup.push(e);
        }
    }
    let emu = f.emu();
    if let Ok((o, _)) = emu_owners(&emu, &f.expected) {
        for p in o.keys() {
            if let Err(e) = emu.request(&format!("unbind {p:#06x}")) {
                cleanup.push(format!("freeing {p:#06x}: {e}"));
            }
        }
    }
    let reboot = start_again(f, 0);
    r?;
    reboot?;
    if let Some(e) = cleanup.into_iter().next() {
        return Err(format!("cleaning up: {e}"));
    }
    compose_begin(f)
}

fn powered_off(f: &mut Fabric) -> Result<(), String> {
    let emu = f.emu();
    let v1 = pdfid(f, "gpu1", 1);
    let all = members();
    // The cluster: every member started before any is waited for (a member is healthy
    // only with a quorum).
    for m in &all {
        start_member(&mut f.hosts[m.host], m, &all)?;
    }
    let t = Instant::now();
    for m in &all {
        wait_healthy(&mut f.hosts[m.host], m)?;
    }
    f.hosts[1].log_note(&format!(
        "etcd: three members healthy {:.1} s after the last start",
        t.elapsed().as_secs_f64()
    ));

    // h0's manager first, so that it leads; then h1's, a standby naming it.
    let c0 = ha_config(f, 0);
    start_ha_manager(&mut f.hosts[0], &c0, None)?;
    let c1 = ha_config(f, 1);
    start_ha_manager(&mut f.hosts[1], &c1, Some(&node(0)))?;
    let e0 = epoch(&mut f.hosts[0])?;
    let s = socket_reply(&mut f.hosts[1])?;
    let mut c = Checks::new("h1's manager before the power-off");
    c.eq("standby", Some(true), s["standby"].as_bool());
    c.eq("status", Some(421), s["status"].as_u64());
    c.eq(
        "leader",
        Some(node(0).as_str()),
        s["leader"]["node"].as_str(),
    );
    c.finish()?;

    // R1: granted by h0's leader for host 1 (h0's MEP binds it to h1), acknowledged.
    let (r1, granted, v) = request(
        &mut f.hosts[0],
        "--vfs 1 --profile quarter --host 1 --priority 5 --duration 600",
    )?;
    let mut c = Checks::new("R1 (host 1, one VF of gpu1), from h0's leader");
    c.eq("granted", true, granted);
    c.eq("functions", hexes(&[v1]), lease_functions(&v["lease"]));
    c.finish()?;
    check_world(f, &owners(&[(v1, 1)]), "R1 granted by h0's leader")?;

    // Power off the leader's host: its QEMU (and with it its manager and etcd member e0)
    // SIGKILLed, no polite stop.
    f.hosts[0].kill_qemu()?;
    let killed = Instant::now();
    // Right after: h1's manager is still a standby (it waits for the dead leader's lease).
    let s = socket_reply(&mut f.hosts[1])?;
    if s["standby"] != Value::Bool(true) {
        return Err(format!(
            "h1's manager right after h0's power-off: expected still a standby (the old \
             leader's lease of {TTL_S} s has not run out), got {s}"
        ));
    }
    let limit = TTL_S + TAKEOVER_MARGIN_S;
    let waited = f.hosts[1].run_timeout(
        &format!(
            "i=0; until pcifab queue >/dev/null 2>&1; do\n\
               kill -0 $(cat {PIDFILE}) 2>/dev/null || {{ echo 'pcifab-manager exited:'; tail -20 {LOG}; exit 1; }}\n\
               [ $i -ge {} ] && exit 2\n\
               sleep 0.1; i=$((i+1))\n\
             done",
            (limit + 30) * 10
        ),
        Duration::from_secs(limit + 45),
    )?;
    let took = killed.elapsed();
    f.hosts[1].log_note(&format!(
        "took over {:.1} s after h0's power-off",
        took.as_secs_f64()
    ));
    crate::say(&format!(
        "# h1's standby took over {:.1} s after h0's power-off (lease_ttl_s {TTL_S})",
        took.as_secs_f64()
    ));
    if waited.code != 0 || took > Duration::from_secs(limit) {
        return Err(format!(
            "h1's manager: expected to lead within lease_ttl_s + {TAKEOVER_MARGIN_S} s = \
             {limit} s of h0's power-off, {} after {:.1} s: {}\n{}",
            if waited.code == 0 {
                "led only"
            } else {
                "not leading"
            },
            took.as_secs_f64(),
            waited.out.trim(),
            manager_log(&mut f.hosts[1], 20)
        ));
    }
    let e1 = epoch(&mut f.hosts[1])?;
    if e1 <= e0 {
        return Err(format!(
            "h1's epoch {e1} is not above h0's {e0}: the new leader must have a later one"
        ));
    }

    // The acknowledged grant survived: the new leader has R1, as it was.
    let h1 = &mut f.hosts[1];
    expect(
        "leases at h1's new leader (R1, granted by h0's)",
        vec![(r1, hexes(&[v1]))],
        leases(h1)?,
    )?;

    // R2 through h1's control socket: served by the new leader, carried out by h1's driver
    // (h1's MEP runs the bind; h0's is gone).
    let before = emu.mrpc_commands(&f.hosts[1].name)?;
    let (r2, granted, v) = request(
        &mut f.hosts[1],
        "--vfs 1 --profile quarter --host 1 --priority 5 --duration 600",
    )?;
    let after = emu.mrpc_commands(&f.hosts[1].name)?;
    let fns = lease_functions(&v["lease"]);
    let ls = lease_hosts(&mut f.hosts[1])?;
    let mut c = Checks::new("R2 (host 1, one VF), from h1's new leader");
    c.eq("granted", true, granted);
    c.eq("lease host", Some(1), v["lease"]["host"].as_u64());
    c.eq("number of functions", 1, fns.len());
    if fns.first() == Some(&format!("{v1:#06x}")) {
        c.fail(format!("R2 got R1's function {v1:#06x}"));
    }
    if after <= before {
        c.fail(format!(
            "h1's MEP ran no MRPC command for R2's bind (count {before} -> {after})"
        ));
    }
    c.eq(
        "leases (id, host, functions) after the failover",
        vec![(r1, 1, hexes(&[v1])), (r2, 1, fns.clone())],
        ls.clone(),
    );
    if let Err(e) = one_host_each(&emu, f, &ls, "the failover and R2") {
        c.fail(e);
    }
    c.finish()?;
    let v2 = u16::from_str_radix(fns[0].trim_start_matches("0x"), 16)
        .map_err(|e| format!("R2's function {:?}: {e}", fns[0]))?;
    check_world(
        f,
        &owners(&[(v1, 1), (v2, 1)]),
        "R2 granted by h1's new leader",
    )?;

    // The new leader goes on serving: both released, the functions leave h1.
    let h1 = &mut f.hosts[1];
    cli_ok(h1, &format!("release {r1}"))?;
    cli_ok(h1, &format!("release {r2}"))?;
    check_world(f, &Owners::new(), "R1 and R2 released at h1's new leader")?;
    one_host_each(&emu, f, &[], "the releases")
}
