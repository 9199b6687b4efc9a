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
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use common::*;
use pcifab_manager::{
    daemon::{Daemon, Telemetry},
    executor::SimExecutor,
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
