// SPDX-License-Identifier: GPL-2.0-only

//! The daemon: killed with SIGKILL and restarted mid-lease (the real binary, its socket and
//! its database), telemetry failover and host-down through the protocol (in-process, with
//! an injected clock and the simulated executor and telemetry).

mod common;

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use common::*;
use pcifab_manager::{
    daemon::{Daemon, Telemetry},
    executor::{Fence, Fenced, SimExecutor},
    scrub::SimScrubber,
    store::Store,
    telemetry::{Judge, Sample, SimSource},
};
use serde_json::{json, Value};

fn start(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_pcifab-manager"))
        .args(["--executor", "sim", "--config"])
        .arg(dir.join("manager.toml"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--socket")
        .arg(dir.join("sock"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start pcifab-manager")
}

fn connect(sock: &Path) -> UnixStream {
    let t = Instant::now();
    loop {
        if let Ok(s) = UnixStream::connect(sock) {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "manager did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ask(s: &mut UnixStream, req: Value) -> Value {
    writeln!(s, "{req}").expect("send");
    let mut line = String::new();
    BufReader::new(s.try_clone().expect("clone"))
        .read_line(&mut line)
        .expect("reply");
    serde_json::from_str(&line).expect("JSON reply")
}

fn req(host: u8, count: u32, priority: u32) -> Value {
    json!({"op": "request", "spec": {"host": host, "want": {"kind": "gpus", "count": count},
           "priority": priority, "duration_s": 3600}})
}

#[test]
fn survives_kill_9() {
    let dir = tempdir("restart");
    std::fs::write(dir.join("manager.toml"), TWO_GPUS.replace("MODE", "hybrid")).expect("cfg");
    let sock = dir.join("sock");
    let mut child = start(&dir);
    let mut s = connect(&sock);
    let a = ask(&mut s, req(0, 2, 3));
    assert_eq!(a["granted"], json!(true), "{a}");
    let b = ask(&mut s, req(1, 1, 5));
    assert_eq!(b["granted"], json!(false), "{b}");
    let vf = ask(
        &mut s,
        json!({"op": "request", "spec": {"host": 2, "want": {"kind": "vfs", "count": 1}, "priority": 1}}),
    );
    assert_eq!(vf["granted"], json!(false), "{vf}");
    let before = ask(&mut s, json!({"op": "state"}));
    let leases_before = ask(&mut s, json!({"op": "leases"}))["leases"].clone();
    let queue_before = ask(&mut s, json!({"op": "queue"}))["queue"].clone();
    // SIGKILL: no chance to clean up.
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    let mut child = start(&dir);
    let mut s = connect(&sock);
    let after = ask(&mut s, json!({"op": "state"}));
    assert_eq!(
        before["state"], after["state"],
        "state changed across kill -9"
    );
    let ids = |v: &Value, k: &str| -> Vec<Value> {
        v.as_array()
            .map(|a| a.iter().map(|x| x[k].clone()).collect())
            .unwrap_or_default()
    };
    let leases_after = ask(&mut s, json!({"op": "leases"}))["leases"].clone();
    let queue_after = ask(&mut s, json!({"op": "queue"}))["queue"].clone();
    assert_eq!(ids(&leases_before, "id"), ids(&leases_after, "id"));
    assert_eq!(
        ids(&leases_before, "expires_at"),
        ids(&leases_after, "expires_at")
    );
    assert_eq!(ids(&queue_before, "id"), ids(&queue_after, "id"));
    assert_eq!(queue_after.as_array().map(Vec::len), Some(2));
    // The request log survived too.
    let log = ask(&mut s, json!({"op": "log", "n": 10}));
    assert_eq!(log["log"].as_array().map(Vec::len), Some(3), "{log}");
    // And the queue still works: releasing the lease grants the queued requests.
    let r = ask(&mut s, json!({"op": "release", "id": a["id"]}));
    assert_eq!(r["ok"], json!(true), "{r}");
    let leases = ask(&mut s, json!({"op": "leases"}));
    assert_eq!(
        ids(&leases["leases"], "id"),
        vec![b["id"].clone(), vf["id"].clone()]
    );
    // Bad input is answered, not fatal.
    let bad = ask(&mut s, json!({"op": "release"}));
    assert_eq!(bad["ok"], json!(false));
    assert!(
        bad["error"]
            .as_str()
            .unwrap_or("")
            .contains("missing field"),
        "{bad}"
    );
    child.kill().expect("kill");
    child.wait().expect("reap");
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM: the daemon finishes, removes its socket and exits 0; the state is all there at
/// the next start.
#[test]
fn sigterm_stops_cleanly() {
    let dir = tempdir("sigterm");
    std::fs::write(dir.join("manager.toml"), TWO_GPUS.replace("MODE", "hybrid")).expect("cfg");
    let sock = dir.join("sock");
    let mut child = start(&dir);
    let mut s = connect(&sock);
    let a = ask(&mut s, req(0, 2, 3));
    assert_eq!(a["granted"], json!(true), "{a}");
    let before = ask(&mut s, json!({"op": "state"}));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "still running 10 s after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "exit status after SIGTERM: {status}");
    assert!(!sock.exists(), "the socket was left behind");
    let mut child = start(&dir);
    let mut s = connect(&sock);
    let after = ask(&mut s, json!({"op": "state"}));
    assert_eq!(before["state"], after["state"]);
    child.kill().expect("kill");
    child.wait().expect("reap");
    let _ = std::fs::remove_dir_all(&dir);
}

/// systemd's notify protocol, as a Type=notify-reload unit with a watchdog sees it: READY=1
/// once the socket answers, WATCHDOG=1 while it ticks, RELOADING=1 (with MONOTONIC_USEC)
/// then READY=1 around a SIGHUP, STOPPING=1 at SIGTERM before a clean exit.
#[test]
fn systemd_hears_ready_watchdog_reload_and_stop() {
    let dir = tempdir("notify");
    std::fs::write(dir.join("manager.toml"), TWO_GPUS.replace("MODE", "hybrid")).expect("cfg");
    let rx = std::os::unix::net::UnixDatagram::bind(dir.join("notify")).expect("bind");
    rx.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pcifab-manager"))
        .args(["--executor", "sim", "--config"])
        .arg(dir.join("manager.toml"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--socket")
        .arg(dir.join("sock"))
        .env("NOTIFY_SOCKET", dir.join("notify"))
        .env("WATCHDOG_USEC", "30000000")
        .env_remove("WATCHDOG_PID")
        .stderr(Stdio::null())
        .spawn()
        .expect("start pcifab-manager");
    let recv = || {
        let mut buf = [0u8; 256];
        let n = rx.recv(&mut buf).expect("a notice within 10 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    // The next notice other than WATCHDOG=1.
    let next = || loop {
        let m = recv();
        if m != "WATCHDOG=1\n" {
            return m;
        }
    };
    assert_eq!(next(), "READY=1\n");
    // READY=1 comes once the socket listens.
    assert!(UnixStream::connect(dir.join("sock")).is_ok());
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    let r = next();
    assert!(
        r.starts_with("RELOADING=1\nMONOTONIC_USEC=") && r.ends_with('\n'),
        "{r:?}"
    );
    assert_eq!(next(), "READY=1\n");
    // The ticking thread feeds the watchdog once a second.
    assert_eq!(recv(), "WATCHDOG=1\n");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert_eq!(next(), "STOPPING=1\n");
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let _ = std::fs::remove_dir_all(&dir);
}

struct World {
    d: Daemon,
    clock: Arc<AtomicU64>,
    sim: Arc<Mutex<SimExecutor>>,
    tel: SimSource,
    dir: std::path::PathBuf,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn world(name: &str, mode: &str) -> World {
    let dir = tempdir(name);
    let c = config(mode);
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let clock = Arc::new(AtomicU64::new(1000));
    let ck = clock.clone();
    let store = Store::open(&dir).expect("store");
    let dir2 = dir.clone();
    let mut d = Daemon::start(
        c,
        store,
        Box::new(sim.clone()),
        Box::new(move || ck.load(Ordering::SeqCst)),
    )
    .expect("daemon");
    let tel = SimSource::default();
    d.telemetry = Some(Telemetry {
        source: Box::new(tel.clone()),
        functions: d.sched.pool_functions(),
        judge: Judge::default(),
        last_poll: None,
        samples: Default::default(),
    });
    World {
        d,
        clock,
        sim,
        tel,
        dir: dir2,
    }
}

impl World {
    fn at(&mut self, t: u64) {
        self.clock.store(t, Ordering::SeqCst);
        self.d.tick();
        self.check();
    }
    fn ask(&mut self, v: Value) -> Value {
        let r = self.d.handle_line(&v.to_string());
        self.check();
        r
    }
    fn check(&self) {
        let sim = self.sim.lock().expect("sim");
        check(&self.d.sched, &sim.bound);
    }
    fn log(&self) -> Vec<pcifab_manager::scheduler::Action> {
        self.sim.lock().expect("sim").log.clone()
    }
}

#[test]
fn unhealthy_telemetry_moves_the_lease() {
    let mut w = world("telemetry", "hybrid");
    let a = w.ask(req(0, 1, 1));
    assert_eq!(a["lease"]["functions"], json!(["0x0120"]));
    w.at(1001);
    // The GPU overheats: after two bad polls (bad_samples = 2) it leaves the pool and the
    // lease moves to the other GPU.
    w.tel.set(Sample {
        pdfid: 0x120,
        temperature_centi: 9650,
        power_mw: 300_000,
        utilisation: 99,
        health: 0,
    });
    w.at(1002);
    assert_eq!(w.log(), vec![bind(0x120, 0)]);
    w.at(1003);
    assert_eq!(
        w.log(),
        vec![bind(0x120, 0), unbind(0x120, 0), bind(0x140, 0)]
    );
    let ev = w.ask(json!({"op": "events", "host": 0}));
    let last = &ev["events"][1];
    assert_eq!(last["kind"], json!("moved"));
    assert!(
        last["message"].as_str().unwrap_or("").contains("96.50 C"),
        "{last}"
    );
    let pool = w.ask(json!({"op": "pool"}));
    assert_eq!(pool["devices"][0]["healthy"], json!(false));
    // Cooled down: back in the pool (the lease stays where it is).
    w.tel.set(Sample {
        pdfid: 0x120,
        temperature_centi: 5000,
        ..Sample::default()
    });
    w.at(1004);
    let pool = w.ask(json!({"op": "pool"}));
    assert_eq!(pool["devices"][0]["healthy"], json!(true));
    let tel = w.ask(json!({"op": "telemetry"}));
    assert_eq!(tel["samples"].as_array().map(Vec::len), Some(10));
}

#[test]
fn host_down_over_the_socket() {
    let mut w = world("hostdown", "whole");
    w.ask(req(0, 2, 1));
    let q = w.ask(req(1, 1, 7));
    assert_eq!(q["granted"], json!(false));
    let r = w.ask(json!({"op": "host-down", "host": 0}));
    assert_eq!(r["reclaim_at"], json!(1005));
    w.at(1004);
    assert_eq!(w.log().len(), 2);
    w.at(1005);
    assert_eq!(
        w.log()[2..],
        [unbind(0x120, 0), unbind(0x140, 0), bind(0x120, 1)]
    );
    // An executor failure takes the device out of the pool instead of leaving a lie.
    w.sim.lock().expect("sim").fail.push(0x140);
    let f = w.ask(req(1, 1, 1));
    assert_eq!(f["granted"], json!(true));
    let pool = w.ask(json!({"op": "pool"}));
    assert_eq!(pool["devices"][1]["healthy"], json!(false), "{pool}");
}

/// Links as a test sets them.
#[derive(Clone, Default)]
struct SimLinks(Arc<Mutex<Vec<(u8, bool)>>>);

impl pcifab_manager::liveness::Liveness for SimLinks {
    fn links(&mut self, _host_ports: &[u8]) -> Result<Vec<(u8, bool)>, String> {
        Ok(self.0.lock().expect("links").clone())
    }
}

/// With the driver executor the hosts' upstream links are the heartbeats: a host whose link
/// stays down for host_timeout_s is down, its devices go to the queue reclaim_after_s later;
/// a link that is up does not cancel an operator's host-down.
#[test]
fn link_down_host_is_reclaimed() {
    let mut w = world("links", "whole");
    let links = SimLinks::default();
    *links.0.lock().expect("links") = vec![(0, true), (1, true), (2, true)];
    w.d.liveness = Some(Box::new(links.clone()));
    let a = w.ask(req(1, 2, 1));
    assert_eq!(a["granted"], json!(true));
    let q = w.ask(req(0, 1, 5));
    assert_eq!(q["granted"], json!(false));
    w.ask(json!({"op": "host-down", "host": 2}));
    w.at(1001);
    links.0.lock().expect("links")[1].1 = false;
    // Last seen at 1001; host_timeout_s = 20: down at 1021, reclaimed at 1026.
    for t in 1002..1026 {
        w.at(t);
        assert_eq!(
            w.log().len(),
            2,
            "t={t}: nothing changes before the reclaim"
        );
    }
    let pool = w.ask(json!({"op": "pool"}));
    assert_eq!(pool["hosts"]["1"]["down_since"], json!(1021), "{pool}");
    assert_eq!(pool["hosts"]["2"]["declared"], json!(true), "{pool}");
    assert!(
        pool["hosts"]["2"]["down_since"].is_u64(),
        "link up, still down: {pool}"
    );
    w.at(1026);
    assert_eq!(
        w.log()[2..],
        [unbind(0x120, 1), unbind(0x140, 1), bind(0x120, 0)]
    );
    let ev = w.ask(json!({"op": "events", "host": 1}));
    let kinds: Vec<&str> = ev["events"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["kind"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(kinds, ["granted", "reclaimed"]);
    // The link comes back: the host is up again and may be given devices.
    links.0.lock().expect("links")[1].1 = true;
    w.at(1027);
    let pool = w.ask(json!({"op": "pool"}));
    assert_eq!(pool["hosts"]["1"]["down_since"], json!(null), "{pool}");
    let b = w.ask(req(1, 1, 1));
    assert_eq!(b["granted"], json!(true), "{b}");
}

/// The spool directory (kernels without UNIX sockets) carries the same protocol; a client
/// whose daemon is not running fails at once.
#[test]
fn spool_serves_the_protocol() {
    use pcifab_manager::spool;
    let base = tempdir("spool");
    let dir = base.join("socket.d");
    assert!(spool::ask(&dir, r#"{"op":"queue"}"#)
        .unwrap_err()
        .contains("no manager is running"));
    let c = config("hybrid");
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let d = Daemon::start(
        c,
        Store::open(&base.join("state")).expect("store"),
        Box::new(sim),
        Box::new(|| 1000),
    )
    .expect("daemon");
    let d = Arc::new(Mutex::new(d));
    let sdir = dir.clone();
    std::thread::spawn(move || spool::serve(d, &sdir));
    let t = Instant::now();
    while spool::daemon_pid(&dir).is_none() {
        assert!(t.elapsed() < Duration::from_secs(5), "spool not served");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r: Value = serde_json::from_str(&spool::ask(&dir, &req(0, 1, 1).to_string()).expect("ask"))
        .expect("json");
    assert_eq!(r["granted"], json!(true), "{r}");
    let q: Value =
        serde_json::from_str(&spool::ask(&dir, r#"{"op":"leases"}"#).expect("ask")).expect("json");
    assert_eq!(q["leases"][0]["functions"], json!(["0x0120"]), "{q}");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "pid")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&base);
}

/// One NVMe drive (a PF without VFs) in a `scrub = true` whole pool, two tenants.
const DRIVES: &str = r#"
[manager]
hosts = 2
aging_s = 1000
max_lease_s = 1000

[[manager.tenants]]
name = "a"

[[manager.tenants]]
name = "b"

[telemetry]
interval_s = 1
bad_samples = 1

[[pools]]
name = "drives"
mode = "whole"
scrub = true

[[pools.devices]]
pf = 0x0500
"#;

fn drive_req(host: u8, tenant: &str, priority: u32, preemptible: bool) -> Value {
    json!({"op": "request", "spec": {"host": host, "want": {"kind": "gpus", "count": 1},
           "priority": priority, "duration_s": 600, "pool": "drives", "tenant": tenant,
           "preemptible_by_higher": preemptible}})
}

#[test]
fn scrub_pool_erases_between_holders() {
    let dir = tempdir("scrub");
    let c = pcifab_manager::config::Config::parse(DRIVES).expect("configuration");
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let clock = Arc::new(AtomicU64::new(1000));
    let ck = clock.clone();
    let mut d = Daemon::start(
        c,
        Store::open(&dir).expect("store"),
        Box::new(sim.clone()),
        Box::new(move || ck.load(Ordering::SeqCst)),
    )
    .expect("daemon");
    let tel = SimSource::default();
    d.telemetry = Some(Telemetry {
        source: Box::new(tel.clone()),
        functions: d.sched.pool_functions(),
        judge: Judge::default(),
        last_poll: None,
        samples: Default::default(),
    });
    // The manager's host is 0: a scrub binds the drive there and unbinds it.
    let scrubber = SimScrubber {
        fabric: Some(sim.clone()),
        host: 0,
        ..SimScrubber::default()
    };
    d.scrubber = Some(Arc::new(scrubber.clone()));
    let ask = |d: &mut Daemon, v: Value| d.handle_line(&v.to_string());
    let log = || sim.lock().expect("sim").log.clone();
    let checked = |d: &Daemon| check(&d.sched, &sim.lock().expect("sim").bound);

    // Tenant a on host 0 gets the drive; tenant b's request on host 1 queues and does not
    // pre-empt (leases in scrub pools are not pre-empted), though a's lease allows it.
    let a = ask(&mut d, drive_req(0, "a", 1, true));
    assert_eq!(a["lease"]["functions"], json!(["0x0500"]), "{a}");
    let b = ask(&mut d, drive_req(1, "b", 9, false));
    assert_eq!(
        (b["granted"].clone(), b["position"].clone()),
        (json!(false), json!(0)),
        "{b}"
    );
    checked(&d);
    // a releases: the drive is unbound and waits for its scrub, which has started; b is not
    // granted it before the scrub's outcome is in.
    let r = ask(&mut d, json!({"op": "release", "id": a["id"]}));
    assert_eq!(r["ok"], json!(true), "{r}");
    assert_eq!(log()[..2], [bind(0x500, 0), unbind(0x500, 0)]);
    let pool = ask(&mut d, json!({"op": "pool"}));
    assert_eq!(pool["devices"][0]["scrub"], json!("pending"), "{pool}");
    assert_eq!(pool["scrubbing"], json!(["0x0500"]), "{pool}");
    assert_eq!(pool["bound"], json!({}), "{pool}");
    d.wait_scrubs();
    checked(&d);
    // The scrub bound the drive to the manager's host and unbound it; then b got it.
    assert_eq!(
        log(),
        vec![
            bind(0x500, 0),
            unbind(0x500, 0),
            bind(0x500, 0),
            unbind(0x500, 0),
            bind(0x500, 1)
        ]
    );
    let pool = ask(&mut d, json!({"op": "pool"}));
    assert_eq!(pool["devices"][0]["scrub"], Value::Null, "{pool}");
    assert_eq!(pool["scrubs"][0]["ok"], json!(true), "{pool}");
    assert_eq!(pool["bound"], json!({"0x0500": 1}), "{pool}");
    let leases = ask(&mut d, json!({"op": "leases"}));
    assert_eq!(leases["leases"][0]["id"], b["id"], "{leases}");

    // The next scrub fails: the drive leaves the pool with the reason, a's new request is not
    // granted it, and telemetry reading well does not bring it back.
    scrubber.fail.lock().expect("fail").push(0x500);
    let a2 = ask(&mut d, drive_req(0, "a", 1, false));
    assert_eq!(a2["granted"], json!(false), "{a2}");
    ask(&mut d, json!({"op": "release", "id": b["id"]}));
    d.wait_scrubs();
    checked(&d);
    let pool = ask(&mut d, json!({"op": "pool"}));
    let dev = &pool["devices"][0];
    assert_eq!(dev["healthy"], json!(false), "{pool}");
    assert_eq!(dev["scrub"], json!("failed"), "{pool}");
    assert!(
        dev["reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("scrub failed: simulated scrub failure of 0x0500"),
        "{pool}"
    );
    assert_eq!(pool["scrubs"][1]["ok"], json!(false), "{pool}");
    for t in 1001..1004 {
        clock.store(t, Ordering::SeqCst);
        d.tick();
    }
    let q = ask(&mut d, json!({"op": "queue"}));
    assert_eq!(q["queue"][0]["id"], a2["id"], "{q}");
    assert_eq!(
        ask(&mut d, json!({"op": "pool"}))["devices"][0]["healthy"],
        json!(false)
    );
    assert_eq!(*scrubber.done.lock().expect("done"), vec![0x500, 0x500]);
    assert_eq!(log().len(), 8, "{:?}", log());
    // An operator puts it back: it is scrubbed again first, then a2 is granted.
    let h = ask(
        &mut d,
        json!({"op": "set-health", "pf": 0x500, "healthy": true}),
    );
    assert_eq!(h["ok"], json!(true), "{h}");
    assert_eq!(
        ask(&mut d, json!({"op": "pool"}))["devices"][0]["scrub"],
        json!("pending")
    );
    d.wait_scrubs();
    checked(&d);
    assert_eq!(
        log()[8..],
        [bind(0x500, 0), unbind(0x500, 0), bind(0x500, 0)]
    );
    let leases = ask(&mut d, json!({"op": "leases"}));
    assert_eq!(leases["leases"][0]["id"], a2["id"], "{leases}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fence the test opens and closes.
struct Gate(Arc<std::sync::atomic::AtomicBool>);

impl Fence for Gate {
    fn check(&self) -> Result<(), String> {
        if self.0.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("the test's fence is closed".into())
        }
    }
}

/// A scrub changes the fabric (it binds the drive to the manager's host and erases it): a
/// manager whose fence refuses (a leader cut off from etcd) starts none, and starts it once
/// the fence opens again.
#[test]
fn scrub_waits_for_the_fence() {
    let dir = tempdir("scrub-fence");
    let c = pcifab_manager::config::Config::parse(DRIVES).expect("configuration");
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let clock = Arc::new(AtomicU64::new(1000));
    let ck = clock.clone();
    let mut d = Daemon::start(
        c,
        Store::open(&dir).expect("store"),
        Box::new(Fenced {
            inner: Box::new(sim.clone()),
            fence: Arc::new(Gate(open.clone())),
        }),
        Box::new(move || ck.load(Ordering::SeqCst)),
    )
    .expect("daemon");
    let scrubber = SimScrubber {
        fabric: Some(sim.clone()),
        host: 0,
        ..SimScrubber::default()
    };
    d.scrubber = Some(Arc::new(scrubber.clone()));
    let ask = |d: &mut Daemon, v: Value| d.handle_line(&v.to_string());
    let log = || sim.lock().expect("sim").log.clone();

    let a = ask(&mut d, drive_req(0, "a", 1, true));
    assert_eq!(a["lease"]["functions"], json!(["0x0500"]), "{a}");
    assert_eq!(log(), vec![bind(0x500, 0)]);
    // The fence closes; a releases: the drive waits for its scrub, which does not start,
    // neither at the release nor at the ticks after it.
    open.store(false, Ordering::SeqCst);
    let r = ask(&mut d, json!({"op": "release", "id": a["id"]}));
    assert_eq!(r["ok"], json!(true), "{r}");
    for t in 1001..1004 {
        clock.store(t, Ordering::SeqCst);
        d.tick();
    }
    d.wait_scrubs();
    let pool = ask(&mut d, json!({"op": "pool"}));
    assert_eq!(pool["devices"][0]["scrub"], json!("pending"), "{pool}");
    assert_eq!(pool["scrubbing"], json!([]), "{pool}");
    assert!(scrubber.done.lock().expect("done").is_empty());
    assert_eq!(log(), vec![bind(0x500, 0)]);
    // The fence opens: the fabric catches up (the unbind), then the scrub runs.
    open.store(true, Ordering::SeqCst);
    clock.store(1004, Ordering::SeqCst);
    d.tick();
    d.wait_scrubs();
    assert_eq!(*scrubber.done.lock().expect("done"), vec![0x500]);
    assert_eq!(
        log(),
        vec![
            bind(0x500, 0),
            unbind(0x500, 0),
            bind(0x500, 0),
            unbind(0x500, 0)
        ]
    );
    check(&d.sched, &sim.lock().expect("sim").bound);
    let _ = std::fs::remove_dir_all(&dir);
}

/// How many `events` requests `d` has answered (its request counters).
fn events_served(d: &Mutex<Daemon>) -> u64 {
    d.lock().expect("daemon").stats.served("events")
}

/// An `events` line with a `wait` on the control socket is answered when the notice comes:
/// the socket's connection code on one end of a socket pair, a waiting line, then a grant
/// made in the daemon once the daemon has answered the line empty; the reply must carry the
/// grant within 150 ms of it (the CLI used to ask again every second). A bad `wait` is
/// refused.
#[test]
fn socket_events_wait_ends_when_the_notice_comes() {
    let dir = tempdir("socket-wait");
    let mut c = config("hybrid");
    // The socket's peer is this process: root is an admin, another user must be a principal.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&dir).expect("dir"));
    if uid != 0 {
        let p = format!("[manager]\nhosts = 2\n[[principals]]\nname = \"tester\"\nrole = \"admin\"\nuids = [{uid}]\n");
        c.principals = pcifab_manager::config::Config::parse(&p)
            .expect("principals")
            .principals;
    }
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let d = Daemon::start(
        c,
        Store::open(&dir).expect("store"),
        Box::new(sim),
        Box::new(|| 1000),
    )
    .expect("daemon");
    let d = Arc::new(Mutex::new(d));
    let (mut s, theirs) = UnixStream::pair().expect("socket pair");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    {
        let d = d.clone();
        std::thread::spawn(move || pcifab_manager::socket::serve_conn(d, theirs));
    }
    for bad in [json!(61), json!(-1), json!("5"), json!(1.5)] {
        let r = ask(&mut s, json!({"op": "events", "wait": bad}));
        assert_eq!(r["refused"], json!(true), "wait {bad}: {r}");
        assert!(
            r["error"].as_str().is_some_and(|e| e.contains("wait")),
            "wait {bad}: {r}"
        );
    }
    let before = events_served(&d);
    writeln!(s, "{}", json!({"op": "events", "since": 0, "wait": 10})).expect("send");
    let t = Instant::now();
    while events_served(&d) == before {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the waiting line never reached the daemon"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let g = d
        .lock()
        .expect("daemon")
        .handle_line(&req(0, 1, 1).to_string());
    let granted = Instant::now();
    assert_eq!(g["granted"], json!(true), "{g}");
    let mut line = String::new();
    BufReader::new(s.try_clone().expect("clone"))
        .read_line(&mut line)
        .expect("the waiting reply");
    let late = granted.elapsed();
    let v: Value = serde_json::from_str(&line).expect("JSON reply");
    assert_eq!(v["events"][0]["kind"], json!("granted"), "{v}");
    assert!(
        late < Duration::from_millis(150),
        "the waiting events line was answered {late:?} after the grant"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--state` is the directory that holds manager.redb: a path naming the database file
/// (as the shipped unit once did, making a directory `state.redb/`) is refused before
/// anything is made.
#[test]
fn state_is_a_directory_not_the_database_file() {
    let dir = tempdir("state-dir");
    std::fs::write(dir.join("manager.toml"), TWO_GPUS.replace("MODE", "hybrid")).expect("cfg");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pcifab-manager"))
        .args(["--executor", "sim", "--config"])
        .arg(dir.join("manager.toml"))
        .arg("--state")
        .arg(dir.join("state.redb"))
        .arg("--socket")
        .arg(dir.join("sock"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pcifab-manager");
    // It must exit at once; a manager that started serving is stopped and the test fails.
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if t.elapsed() > Duration::from_secs(10) {
            child.kill().expect("kill");
            child.wait().expect("reap");
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("its stderr");
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--state is the directory that holds manager.redb"),
        "{err}"
    );
    assert!(
        !dir.join("state.redb").exists(),
        "it made {:?}",
        dir.join("state.redb")
    );
    // A directory: the database is manager.redb in it.
    let mut child = start(&dir);
    let mut s = connect(&dir.join("sock"));
    assert_eq!(ask(&mut s, json!({"op": "queue"}))["ok"], json!(true));
    assert!(dir.join("state/manager.redb").is_file());
    child.kill().expect("kill");
    child.wait().expect("reap");
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGHUP reloads the principals from the configuration file without a restart: a new
/// token works, the old one is refused, and an expired one is refused with the reason.
#[test]
fn sighup_reloads_tokens_without_a_restart() {
    use pcifab_manager::{client::Remote, protocol::Request};
    let dir = tempdir("sighup");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    p.subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = p.self_signed(&key).expect("certificate");
    std::fs::write(dir.join("server.crt"), cert.pem()).expect("cert");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("key");
    // A free port for the API (taken back from the kernel just before the start).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let sha = |t: &str| {
        use std::fmt::Write as _;
        let d = ring::digest::digest(&ring::digest::SHA256, t.as_bytes());
        d.as_ref().iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    };
    let config = |principals: &str| {
        format!(
            "{}\n[api]\nlisten = \"127.0.0.1:{port}\"\ncert = \"{}\"\nkey = \"{}\"\n{principals}",
            TWO_GPUS.replace("MODE", "hybrid"),
            dir.join("server.crt").display(),
            dir.join("server.key").display(),
        )
    };
    let principal = |token: &str, extra: &str| {
        format!(
            "[[principals]]\nname = \"ops\"\nrole = \"admin\"\ntoken_sha256 = \"{}\"\n{extra}\n",
            sha(token)
        )
    };
    std::fs::write(dir.join("manager.toml"), config(&principal("first", ""))).expect("cfg");
    let mut child = start(&dir);
    let _ = connect(&dir.join("sock"));
    let status = |token: &str| {
        let r = Remote {
            url: format!("https://127.0.0.1:{port}"),
            ca: Some(dir.join("server.crt")),
            token: Some(token.into()),
            timeout: Duration::from_secs(5),
            ..Default::default()
        };
        r.ask(&Request::Queue, 0)
            .map(|(st, v)| (st, v["error"].clone()))
    };
    // The socket answers before the API may; wait for the API.
    let t = Instant::now();
    while status("first").map(|(st, _)| st).ok() != Some(200) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the API did not answer"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let hup = || {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    };
    // Waits until `token` gets `want`.
    let until = |token: &str, want: u16| {
        let t = Instant::now();
        loop {
            let got = status(token).expect("an answer");
            if got.0 == want {
                return got.1;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{token}: still {got:?} 10 s after SIGHUP"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    std::fs::write(dir.join("manager.toml"), config(&principal("second", ""))).expect("cfg");
    hup();
    until("second", 200);
    assert_eq!(status("first").expect("answer").0, 401);
    std::fs::write(
        dir.join("manager.toml"),
        config(&principal("third", "token_expires = 2001-01-01T00:00:00Z")),
    )
    .expect("cfg");
    hup();
    // "third" is refused before the reload too (an unknown token), so the reload is seen
    // by "second" losing its access; only then does the refusal of "third" say why.
    until("second", 401);
    let (st, why) = status("third").expect("an answer");
    assert_eq!(st, 401);
    assert!(
        why.as_str()
            .is_some_and(|m| m.contains("expired at 2001-01-01T00:00:00Z")),
        "{why}"
    );
    assert_eq!(
        child.try_wait().expect("wait"),
        None,
        "SIGHUP ended the daemon"
    );
    child.kill().expect("kill");
    child.wait().expect("reap");
    let _ = std::fs::remove_dir_all(&dir);
}

/// (table, key) -> value.
type Records = std::collections::BTreeMap<(String, String), Vec<u8>>;

/// A store in memory that counts what each commit writes: the daemon through the
/// `StateStore` trait alone, as a second store (etcd) would see it.
#[derive(Clone, Default)]
struct MemStore {
    records: Arc<Mutex<Records>>,
    version: Arc<Mutex<Option<u32>>>,
    log: Arc<Mutex<Vec<pcifab_manager::store::LogEntry>>>,
    /// Records written or removed by each commit.
    commits: Arc<Mutex<Vec<usize>>>,
    /// Commits fail (and store nothing) while set, as a store that cannot be reached.
    fail_commits: Arc<AtomicBool>,
    /// Loads fail while set.
    fail_loads: Arc<AtomicBool>,
}

impl pcifab_manager::store::StateStore for MemStore {
    fn load(
        &self,
        tables: &[pcifab_manager::store::Table],
    ) -> Result<pcifab_manager::store::Stored, String> {
        if self.fail_loads.load(Ordering::SeqCst) {
            return Err("the test's store cannot be read".into());
        }
        let mut s = pcifab_manager::store::Stored {
            version: *self.version.lock().expect("version"),
            ..Default::default()
        };
        for ((t, k), v) in self.records.lock().expect("records").iter() {
            if let Some(&t) = tables.iter().find(|n| **n == t.as_str()) {
                s.records.entry(t).or_default().insert(k.clone(), v.clone());
            }
        }
        Ok(s)
    }

    fn commit(
        &self,
        batch: &pcifab_manager::store::Batch,
        entry: Option<&pcifab_manager::store::LogEntry>,
        _: pcifab_manager::store::Retention,
    ) -> Result<(), String> {
        if self.fail_commits.load(Ordering::SeqCst) {
            return Err("the test's store refuses the commit".into());
        }
        let mut r = self.records.lock().expect("records");
        for (t, k) in &batch.deletes {
            r.remove(&(t.to_string(), k.clone()));
        }
        for (t, k, v) in &batch.puts {
            r.insert((t.to_string(), k.clone()), v.clone());
        }
        if let Some(v) = batch.version {
            *self.version.lock().expect("version") = Some(v);
        }
        self.log.lock().expect("log").extend(entry.cloned());
        self.commits
            .lock()
            .expect("commits")
            .push(batch.puts.len() + batch.deletes.len());
        Ok(())
    }

    fn log_len(&self) -> Result<u64, String> {
        Ok(self.log.lock().expect("log").len() as u64)
    }

    fn log_tail(&self, n: u64) -> Result<Vec<pcifab_manager::store::LogEntry>, String> {
        let l = self.log.lock().expect("log");
        Ok(l[l.len().saturating_sub(n as usize)..].to_vec())
    }

    fn recorded(&self, key: &str) -> Result<Option<pcifab_manager::store::LogEntry>, String> {
        let l = self.log.lock().expect("log");
        Ok(l.iter()
            .rev()
            .find(|e| e.key.as_deref() == Some(key))
            .cloned())
    }
}

/// A request sent again with its idempotency key (over the control socket's line, as the
/// API's header does) is carried out once: the repeat gets the recorded reply, also from a
/// manager started again on the same redb store; another request under the same key is
/// refused with 422; the same key of another principal is another request.
#[test]
fn a_repeated_idempotency_key_is_carried_out_once() {
    let dir = tempdir("idem");
    let c = config("hybrid");
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let start = |sim: Arc<Mutex<SimExecutor>>| {
        Daemon::start(
            c.clone(),
            Store::open(&dir).expect("store"),
            Box::new(sim),
            Box::new(|| 1000),
        )
        .expect("daemon")
    };
    let mut d = start(sim.clone());
    let root = d.principals.by_uid(0).expect("root");
    let grant = json!({"op": "request", "idempotency_key": "k-1", "spec": {"host": 1,
                       "want": {"kind": "gpus", "count": 1}, "priority": 1}});
    let first = d.serve_line(&root, &grant.to_string());
    assert_eq!(first["granted"], json!(true), "{first}");
    let binds = sim.lock().expect("sim").log.len();
    let again = d.serve_line(&root, &grant.to_string());
    assert_eq!(again["replayed"], json!(true), "{again}");
    assert_eq!(again["id"], first["id"], "{again}");
    assert_eq!(leases_of(&mut d).len(), 1, "the repeat was granted again");
    drop(d);
    let mut d = start(sim.clone());
    let again = d.serve_line(&root, &grant.to_string());
    assert_eq!(
        (&again["replayed"], &again["lease"]),
        (&json!(true), &first["lease"]),
        "{again}"
    );
    assert_eq!(sim.lock().expect("sim").log.len(), binds, "acted again");
    let mut other = grant.clone();
    other["spec"]["host"] = json!(2);
    let r = d.serve_line(&root, &other.to_string());
    assert_eq!(
        (&r["ok"], &r["status"]),
        (&json!(false), &json!(422)),
        "{r}"
    );
    assert!(
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("already used")),
        "{r}"
    );
    let served: pcifab_manager::protocol::Request =
        serde_json::from_value(other.as_object().map_or(json!({}), |o| {
            let mut o = o.clone();
            o.remove("idempotency_key");
            Value::Object(o)
        }))
        .expect("request");
    assert_eq!(pcifab_manager::protocol::status_of(&served, &r), 422);
    // Another principal's key of the same name is another request.
    let r = d.handle_keyed(
        &serde_json::from_value(grant["spec"].clone())
            .map(|spec| pcifab_manager::protocol::Request::Request { spec })
            .expect("spec"),
        Some("k-1@someone-else"),
    );
    assert_eq!(r["granted"], json!(true), "{r}");
    assert!(r.get("replayed").is_none(), "{r}");
    assert_eq!(leases_of(&mut d).len(), 2);
    // Reads ignore a key; a bad key is refused before anything is decided.
    let r = d.serve_line(&root, r#"{"op":"leases","idempotency_key":"k-1"}"#);
    assert_eq!(r["ok"], json!(true), "{r}");
    let r = d.serve_line(&root, r#"{"op":"release","id":1,"idempotency_key":"a b"}"#);
    assert_eq!(r["refused"], json!(true), "{r}");
    assert_eq!(leases_of(&mut d).len(), 2);
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With the notices' ring full (4,096) and thousands of requests logged, a grant or a
/// release still writes a handful of records, not the state; and a daemon started again
/// on the same store has the same state.
#[test]
fn requests_write_only_the_records_they_change() {
    let c = config("hybrid");
    let store = MemStore::default();
    let start = |store: MemStore| {
        let c = c.clone();
        let sim = sim_for(&c);
        Daemon::start(c, store, Box::new(sim), Box::new(|| 1000)).expect("daemon")
    };
    let mut d = start(store.clone());
    let req = json!({"op": "request", "spec": {"host": 1, "want": {"kind": "gpus", "count": 1},
                     "priority": 1, "duration_s": 600}});
    let pair = |d: &mut Daemon| {
        let r = d.handle_line(&req.to_string());
        assert_eq!(r["granted"], json!(true), "{r}");
        let r = d.handle_line(&json!({"op": "release", "id": r["id"]}).to_string());
        assert_eq!(r["ok"], json!(true), "{r}");
    };
    for _ in 0..2100 {
        pair(&mut d);
    }
    assert_eq!(d.sched.notices.len(), 4096, "the ring is full");
    let records = store.records.lock().expect("records").len();
    assert!(records > 4096, "{records} records");
    let before = store.commits.lock().expect("commits").len();
    pair(&mut d);
    let commits = store.commits.lock().expect("commits")[before..].to_vec();
    assert_eq!(commits.len(), 2, "one commit per request: {commits:?}");
    // A grant: its lease, the device, the binding, the counters, the notice and the one
    // it pushes out, the tenant's usage (a release about the same).
    assert!(
        commits.iter().all(|&n| n <= 10),
        "records per commit: {commits:?} of {records}"
    );
    // Reads write nothing, not even an unchanged record.
    let before = store.commits.lock().expect("commits").len();
    for read in [
        r#"{"op":"leases"}"#,
        r#"{"op":"queue"}"#,
        r#"{"op":"pool"}"#,
    ] {
        assert_eq!(d.handle_line(read)["ok"], json!(true), "{read}");
    }
    assert_eq!(store.commits.lock().expect("commits").len(), before);
    let state = d.handle_line(r#"{"op":"state"}"#);
    drop(d);
    let mut d = start(store.clone());
    assert_eq!(d.handle_line(r#"{"op":"state"}"#), state);
    assert_eq!(store.log.lock().expect("log").len(), 4202);
}

/// The leases as a daemon answers them: (id, host, functions).
fn leases_of(d: &mut Daemon) -> Vec<(Value, Value, Value)> {
    let r = d.handle_line(r#"{"op":"leases"}"#);
    assert_eq!(r["ok"], json!(true), "{r}");
    r["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| (l["id"].clone(), l["host"].clone(), l["functions"].clone()))
        .collect()
}

/// One manager with its own store (no `[ha]`): a request whose commit fails is answered
/// with an error and leaves nothing in memory either, so neither a later commit stores it
/// nor the fabric gets it, and memory stays what is stored.
#[test]
fn a_failed_commit_leaves_no_request_in_memory() {
    let c = config("hybrid");
    let store = MemStore::default();
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let start = |store: MemStore, sim: Arc<Mutex<SimExecutor>>| {
        Daemon::start(c.clone(), store, Box::new(sim), Box::new(|| 1000)).expect("daemon")
    };
    let mut d = start(store.clone(), sim.clone());
    let req = json!({"op": "request", "spec": {"host": 1, "want": {"kind": "gpus", "count": 1},
                     "priority": 1, "duration_s": 600}});
    let r = d.handle_line(&req.to_string());
    assert_eq!(r["granted"], json!(true), "{r}");
    let held = leases_of(&mut d);
    store.fail_commits.store(true, Ordering::SeqCst);
    let mut other = req.clone();
    other["spec"]["host"] = json!(2);
    let r = d.handle_line(&other.to_string());
    assert_eq!(r["ok"], json!(false), "{r}");
    assert!(
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("refuses the commit")),
        "{r}"
    );
    assert_eq!(
        leases_of(&mut d),
        held,
        "the failed request stayed in memory"
    );
    // The store works again: the next commit (a heartbeat) does not carry the failed
    // request with it, and a daemon started on the store has the same state.
    store.fail_commits.store(false, Ordering::SeqCst);
    let r = d.handle_line(r#"{"op":"heartbeat","host":0}"#);
    assert_eq!(r["ok"], json!(true), "{r}");
    let state = d.handle_line(r#"{"op":"state"}"#);
    let bound = sim.lock().expect("sim").bound.clone();
    check(&d.sched, &bound);
    drop(d);
    let mut d = start(store.clone(), Arc::new(Mutex::new(sim_for(&c))));
    assert_eq!(d.handle_line(r#"{"op":"state"}"#), state);
    assert_eq!(leases_of(&mut d), held);
}

/// A highly available manager after a commit of unknown outcome: a read while the state
/// cannot be read again is answered, but what it changed in memory (a lease that ended
/// meanwhile) is neither committed nor carried out on the fabric.
#[test]
fn a_read_whose_reload_fails_commits_nothing() {
    let c = config("hybrid");
    let store = MemStore::default();
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let clock = Arc::new(AtomicU64::new(1000));
    let ck = clock.clone();
    let mut d = Daemon::start(
        c,
        store.clone(),
        Box::new(sim.clone()),
        Box::new(move || ck.load(Ordering::SeqCst)),
    )
    .expect("daemon");
    d.reload_after_failed_commit = true;
    let req = json!({"op": "request", "spec": {"host": 1, "want": {"kind": "gpus", "count": 1},
                     "priority": 1, "duration_s": 10}});
    let r = d.handle_line(&req.to_string());
    assert_eq!(r["granted"], json!(true), "{r}");
    // A commit fails (its outcome unknown), then the store cannot be read.
    store.fail_commits.store(true, Ordering::SeqCst);
    let r = d.handle_line(r#"{"op":"heartbeat","host":0}"#);
    assert_eq!(r["ok"], json!(false), "{r}");
    store.fail_commits.store(false, Ordering::SeqCst);
    store.fail_loads.store(true, Ordering::SeqCst);
    let commits = store.commits.lock().expect("commits").len();
    let records = store.records.lock().expect("records").clone();
    let fabric = sim.lock().expect("sim").log.len();
    // The lease ends meanwhile.
    clock.store(1020, Ordering::SeqCst);
    let r = d.handle_line(r#"{"op":"leases"}"#);
    assert_eq!(r["ok"], json!(true), "a read is answered: {r}");
    assert_eq!(
        store.commits.lock().expect("commits").len(),
        commits,
        "a read committed what it changed in a state it could not confirm"
    );
    assert_eq!(*store.records.lock().expect("records"), records);
    assert_eq!(
        sim.lock().expect("sim").log.len(),
        fabric,
        "the fabric changed"
    );
    // The store readable again: the next request reads it, and the lease ends for real.
    store.fail_loads.store(false, Ordering::SeqCst);
    let r = d.handle_line(r#"{"op":"heartbeat","host":0}"#);
    assert_eq!(r["ok"], json!(true), "{r}");
    assert_eq!(leases_of(&mut d), vec![]);
    check(&d.sched, &sim.lock().expect("sim").bound);
}

/// A fence that refuses in the scrub threads only: the leader deposed between the daemon's
/// check before it starts a scrub and the scrub's bind.
struct RefusedInScrubThreads;

impl Fence for RefusedInScrubThreads {
    fn check(&self) -> Result<(), String> {
        match std::thread::current().name() {
            Some(n) if n.starts_with("scrub-") => Err("deposed (the test's fence)".into()),
            _ => Ok(()),
        }
    }
}

/// A scrub asks the fence again right before its bind: refused there, it binds nothing,
/// the drive still waits for its scrub (it is not marked failed).
#[test]
fn a_scrub_asks_the_fence_right_before_its_bind() {
    let dir = tempdir("scrub-refence");
    let c = pcifab_manager::config::Config::parse(DRIVES).expect("configuration");
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let mut d = Daemon::start(
        c,
        Store::open(&dir).expect("store"),
        Box::new(Fenced {
            inner: Box::new(sim.clone()),
            fence: Arc::new(RefusedInScrubThreads),
        }),
        Box::new(|| 1000),
    )
    .expect("daemon");
    let scrubber = SimScrubber {
        fabric: Some(sim.clone()),
        host: 0,
        ..SimScrubber::default()
    };
    d.scrubber = Some(Arc::new(scrubber.clone()));
    let ask = |d: &mut Daemon, v: Value| d.handle_line(&v.to_string());
    let a = ask(&mut d, drive_req(0, "a", 1, true));
    assert_eq!(a["lease"]["functions"], json!(["0x0500"]), "{a}");
    let r = ask(&mut d, json!({"op": "release", "id": a["id"]}));
    assert_eq!(r["ok"], json!(true), "{r}");
    d.wait_scrubs();
    assert_eq!(
        sim.lock().expect("sim").log,
        vec![bind(0x500, 0), unbind(0x500, 0)],
        "the scrub bound the drive past a fence that refused"
    );
    assert!(scrubber.done.lock().expect("done").is_empty());
    let pool = ask(&mut d, json!({"op": "pool"}));
    assert_eq!(pool["devices"][0]["scrub"], json!("pending"), "{pool}");
    assert_eq!(pool["devices"][0]["healthy"], json!(true), "{pool}");
    assert_eq!(pool["scrubs"], json!([]), "{pool}");
    let _ = std::fs::remove_dir_all(&dir);
}
