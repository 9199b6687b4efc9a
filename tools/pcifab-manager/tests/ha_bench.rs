// SPDX-License-Identifier: GPL-2.0-only

//! The HA figures of Documentation/benchmarks.rst ("Fabric manager high availability"):
//! `manager_failover_ms` over 20 kills of the leader, and grants per second on etcd against
//! the embedded redb store on the same work. `make bench-ha` runs it (ignored otherwise:
//! real etcd, a minute and a half).

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

const POOL: &str = r#"
[manager]
hosts = 3
default_lease_s = 3600

[[pools]]
name = "gpus"
mode = "partition"

[[pools.devices]]
pf = 0x0120
vfs = [0x0121, 0x0122, 0x0123, 0x0124]
profile = "quarter"
"#;

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pcifab-habench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tempdir");
    d
}

fn ask(sock: &Path, req: &Value) -> Option<Value> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    writeln!(s, "{req}").ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    serde_json::from_str(&line).ok()
}

fn vf() -> Value {
    json!({"op": "request", "spec": {"host": 0, "want": {"kind": "vfs", "count": 1,
           "profile": "quarter"}, "priority": 1}})
}

/// The members, and the directory of their data (removed when they stop, unless the
/// bench failed: each member preallocates 120 MB of write-ahead log).
struct Etcd(Vec<Child>, PathBuf);

impl Drop for Etcd {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            for i in 0..self.0.len() {
                let _ = std::fs::remove_dir_all(self.1.join(format!("etcd{i}")));
            }
        }
    }
}

fn etcd(dir: &Path, base: u16) -> (Etcd, Vec<String>) {
    let bin = std::env::var_os("PCIFAB_ETCD").expect("PCIFAB_ETCD: run `make bench-ha`");
    let client = |i: u16| format!("http://127.0.0.1:{}", base + i);
    let peer = |i: u16| format!("http://127.0.0.1:{}", base + 10 + i);
    let initial: Vec<String> = (0..3).map(|j| format!("e{j}={}", peer(j))).collect();
    let mut kids = Vec::new();
    for i in 0..3 {
        kids.push(
            Command::new(&bin)
                .arg("--name")
                .arg(format!("e{i}"))
                .arg("--data-dir")
                .arg(dir.join(format!("etcd{i}")))
                .args(["--listen-client-urls", &client(i)])
                .args(["--advertise-client-urls", &client(i)])
                .args(["--listen-peer-urls", &peer(i)])
                .args(["--initial-advertise-peer-urls", &peer(i)])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("etcd"),
        );
    }
    let eps: Vec<String> = (0..3).map(client).collect();
    for e in &eps {
        let t = Instant::now();
        while !ureq::get(format!("{e}/health"))
            .call()
            .ok()
            .and_then(|r| r.into_body().read_to_string().ok())
            .is_some_and(|b| b.contains("\"true\""))
        {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "etcd {e} not healthy"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (Etcd(kids, dir.to_path_buf()), eps)
}

fn manager(dir: &Path, node: &str, eps: Option<&[String]>) -> Child {
    let mut cfg = POOL.to_string();
    if let Some(eps) = eps {
        let list: Vec<String> = eps.iter().map(|e| format!("\"{e}\"")).collect();
        cfg += &format!(
            "[ha]\nendpoints = [{}]\nnode = \"{node}\"\nadvertise = \"{node}\"\n\
             lease_ttl_s = 2\ntimeout_ms = 500\n",
            list.join(", ")
        );
    }
    let path = dir.join(format!("{node}.toml"));
    std::fs::write(&path, cfg).expect("config");
    Command::new(env!("CARGO_BIN_EXE_pcifab-manager"))
        .args(["--executor", "sim", "--fabric"])
        .arg(dir.join("fabric.json"))
        .arg("--config")
        .arg(&path)
        .arg("--state")
        .arg(dir.join(format!("{node}-state")))
        .arg("--socket")
        .arg(dir.join(format!("{node}.sock")))
        .stderr(Stdio::null())
        .spawn()
        .expect("pcifab-manager")
}

/// The node whose answer is not a standby's, and its answer to `req`.
fn leader(dir: &Path, nodes: &[&str], req: &Value, limit: Duration) -> (String, Value) {
    let t = Instant::now();
    loop {
        for n in nodes {
            if let Some(r) = ask(&dir.join(format!("{n}.sock")), req) {
                if r["standby"] != json!(true) {
                    return (n.to_string(), r);
                }
            }
        }
        assert!(t.elapsed() < limit, "no leader within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `n` grants and releases in turn, one at a time: grants per second.
fn grants_per_second(sock: &Path, n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let r = ask(sock, &vf()).expect("grant");
        assert_eq!(r["granted"], json!(true), "{r}");
        let r = ask(sock, &json!({"op": "release", "id": r["id"]})).expect("release");
        assert_eq!(r["ok"], json!(true), "{r}");
    }
    f64::from(n) / t.elapsed().as_secs_f64()
}

#[test]
#[ignore = "real etcd: make bench-ha"]
fn bench_ha() {
    let dir = tempdir("failover");
    let (_etcd, eps) = etcd(&dir, 24800);
    let nodes = ["a", "b"];
    let mut kids: std::collections::BTreeMap<String, Child> = nodes
        .iter()
        .map(|n| (n.to_string(), manager(&dir, n, Some(&eps))))
        .collect();
    let mut ms = Vec::new();
    for _ in 0..20 {
        let (l, r) = leader(&dir, &nodes, &vf(), Duration::from_secs(30));
        assert_eq!(r["granted"], json!(true), "{r}");
        let acked = Instant::now();
        let mut k = kids.remove(&l).expect("leader");
        k.kill().expect("kill -9");
        k.wait().expect("reap");
        // The first request served by the new leader: the release of that grant.
        let (n, r) = leader(
            &dir,
            &nodes,
            &json!({"op": "release", "id": r["id"]}),
            Duration::from_secs(30),
        );
        ms.push(acked.elapsed().as_secs_f64() * 1000.0);
        assert_ne!(n, l);
        assert_eq!(r["ok"], json!(true), "{r}");
        kids.insert(l.clone(), manager(&dir, &l, Some(&eps)));
    }
    ms.sort_by(f64::total_cmp);
    println!("bench manager_failover_ms_p50 {:.0}", percentile(&ms, 0.5));
    println!("bench manager_failover_ms_p99 {:.0}", percentile(&ms, 0.99));
    let (l, _) = leader(
        &dir,
        &nodes,
        &json!({"op": "queue"}),
        Duration::from_secs(30),
    );
    let ha = grants_per_second(&dir.join(format!("{l}.sock")), 300);
    for (_, mut k) in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    let dir2 = tempdir("embedded");
    let mut k = manager(&dir2, "solo", None);
    let sock = dir2.join("solo.sock");
    leader(
        &dir2,
        &["solo"],
        &json!({"op": "queue"}),
        Duration::from_secs(30),
    );
    let embedded = grants_per_second(&sock, 300);
    let _ = k.kill();
    let _ = k.wait();
    println!("bench manager_grants_per_second_ha {ha:.0}");
    println!("bench manager_grants_per_second_embedded {embedded:.0}");
}
