// SPDX-License-Identifier: GPL-2.0-only

//! Reserved pools (`[[pools]] principals`, Documentation/manager.rst "Reserved pools")
//! through the network API as the CLI uses it: a daemon on the simulated fabric, its HTTPS
//! server on a loopback port, principals by bearer token. Pool `slurm` is reserved to
//! principal `slurm` (Slurm's hooks); pool `lab` is anybody's.

mod common;

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{gpus, sim_for, tempdir};
use pcifab_manager::{
    api,
    auth::Principals,
    client::Remote,
    config::{ApiConfig, Config},
    daemon::Daemon,
    protocol::Request,
    store::Store,
};
use rcgen::{CertificateParams, KeyPair};
use serde_json::Value;

const SLURM_TOKEN: &str = "slurm-hooks-token";
const ALICE_TOKEN: &str = "alice-token";
const OPS_TOKEN: &str = "ops-token";

fn sha256(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn config() -> Config {
    Config::parse(&format!(
        r#"
[manager]
hosts = 3
default_lease_s = 100
max_lease_s = 1000

[telemetry]
interval_s = 0

[[pools]]
name = "slurm"
mode = "whole"
principals = ["slurm"]
[[pools.devices]]
pf = 0x0120

[[pools]]
name = "lab"
mode = "whole"
[[pools.devices]]
pf = 0x0140

[[principals]]
name = "slurm"
role = "tenant"
hosts = [1, 2]
token_sha256 = "{}"

[[principals]]
name = "alice"
role = "tenant"
hosts = [1, 2]
token_sha256 = "{}"

[[principals]]
name = "ops"
role = "admin"
token_sha256 = "{}"
"#,
        sha256(SLURM_TOKEN),
        sha256(ALICE_TOKEN),
        sha256(OPS_TOKEN)
    ))
    .expect("configuration")
}

fn server_cert(dir: &Path) {
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(vec!["pcifab-manager".to_string()]).expect("params");
    p.subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = p.self_signed(&key).expect("server cert");
    std::fs::write(dir.join("server.crt"), cert.pem()).expect("write");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("write");
}

fn request(pool: Option<&str>, host: u8) -> Request {
    let mut spec = gpus(host, 1, 5, 600);
    spec.pool = pool.map(String::from);
    Request::Request { spec }
}

/// The pool and functions of a granted request's reply.
fn granted(v: &Value) -> (String, Vec<String>) {
    let l = &v["lease"];
    (
        l["pool"].as_str().unwrap_or("?").to_string(),
        l["functions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
    )
}

#[test]
fn a_reserved_pool_serves_only_its_principals_and_they_only_it() {
    let dir = tempdir("reserved-pools");
    server_cert(&dir);
    let mut c = config();
    c.api = Some(ApiConfig::new(
        "127.0.0.1:0",
        &dir.join("server.crt").display().to_string(),
        &dir.join("server.key").display().to_string(),
    ));
    let cfg = c.api.clone().expect("api");
    let principals =
        Principals::new(c.principals.clone(), c.manager.hosts, Vec::new()).expect("principals");
    let sim = Arc::new(Mutex::new(sim_for(&c)));
    let d = Daemon::start(
        c,
        Store::open(&dir.join("state")).expect("store"),
        Box::new(sim),
        Box::new(|| 1000),
    )
    .expect("daemon");
    let daemon = Arc::new(Mutex::new(d));
    let addr = api::spawn(daemon.clone(), &cfg, Arc::new(principals)).expect("API");
    let ask = |token: &str, req: &Request| -> (u16, Value) {
        Remote {
            url: format!("https://{addr}"),
            ca: Some(dir.join("server.crt")),
            cert: None,
            key: None,
            token: Some(token.into()),
            timeout: Duration::from_secs(10),
        }
        .ask(req, 0)
        .expect("an answer")
    };
    let leases = || daemon.lock().expect("daemon").sched.leases.len();
    let error = |v: &Value| v["error"].as_str().unwrap_or_default().to_string();

    // Another principal's request for the reserved pool is refused, saying why; so is an
    // admin's: the reservation holds for everybody.
    let (st, v) = ask(ALICE_TOKEN, &request(Some("slurm"), 1));
    assert_eq!(st, 409, "{v}");
    assert!(
        error(&v).contains("pool 'slurm' is reserved to principals [\"slurm\"]")
            && error(&v).contains("'alice' may not lease from it"),
        "{v}"
    );
    let (st, v) = ask(OPS_TOKEN, &request(Some("slurm"), 1));
    assert_eq!(st, 409, "{v}");
    assert!(error(&v).contains("'ops' may not lease from it"), "{v}");
    assert_eq!(leases(), 0);

    // Slurm's principal, naming no pool, gets its own pool's GPU (the first pool); then
    // asks the other pool by name: refused.
    let (st, v) = ask(SLURM_TOKEN, &request(None, 1));
    assert_eq!(st, 201, "{v}");
    assert_eq!(granted(&v), ("slurm".into(), vec!["0x0120".into()]));
    let slurm_lease = v["id"].as_u64().expect("id");
    let (st, v) = ask(SLURM_TOKEN, &request(Some("lab"), 2));
    assert_eq!(st, 409, "{v}");
    assert!(
        error(&v).contains("'slurm' leases only from the pools reserved to it")
            && error(&v).contains("pool 'lab' is not one of them"),
        "{v}"
    );
    // Naming no pool, it is not given the lab's free GPU either: it queues for its own.
    let (st, v) = ask(SLURM_TOKEN, &request(None, 2));
    assert_eq!((st, &v["granted"]), (201, &Value::Bool(false)), "{v}");
    let slurm_queued = v["id"].as_u64().expect("id");
    let (st, v) = ask(SLURM_TOKEN, &Request::Release { id: slurm_queued });
    assert_eq!(st, 200, "{v}");

    // Alice, naming no pool, gets the lab's GPU; with the lab's taken and the slurm pool's
    // GPU free, she queues rather than get it.
    let (st, v) = ask(SLURM_TOKEN, &Request::Release { id: slurm_lease });
    assert_eq!(st, 200, "{v}");
    let (st, v) = ask(ALICE_TOKEN, &request(None, 1));
    assert_eq!(st, 201, "{v}");
    assert_eq!(granted(&v), ("lab".into(), vec!["0x0140".into()]));
    let (st, v) = ask(ALICE_TOKEN, &request(None, 2));
    assert_eq!((st, &v["granted"]), (201, &Value::Bool(false)), "{v}");
    let alice_queued = v["id"].as_u64().expect("id");
    // Slurm's principal still gets its pool's GPU past her queued request.
    let (st, v) = ask(SLURM_TOKEN, &request(Some("slurm"), 2));
    assert_eq!(st, 201, "{v}");
    assert_eq!(granted(&v), ("slurm".into(), vec!["0x0120".into()]));
    let (st, _) = ask(ALICE_TOKEN, &Request::Release { id: alice_queued });
    assert_eq!(st, 200);
    assert_eq!(leases(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reservation is the configuration file's, not the stored state's: a daemon started
/// on a state stored before the pool was reserved enforces it.
#[test]
fn a_restart_takes_the_reservation_from_the_file() {
    let dir = tempdir("reserved-pools-restart");
    let reserved = config();
    let mut open = reserved.clone();
    for p in &mut open.pools {
        p.principals.clear();
    }
    let start = |c: &Config| {
        Daemon::start(
            c.clone(),
            Store::open(&dir.join("state")).expect("store"),
            Box::new(Arc::new(Mutex::new(sim_for(c)))),
            Box::new(|| 1000),
        )
        .expect("daemon")
    };
    let principals = Principals::new(reserved.principals.clone(), 3, Vec::new()).expect("p");
    let alice = principals.by_token(ALICE_TOKEN).expect("alice");
    let mut d = start(&open);
    let (_, v) = d.serve(&alice, request(Some("slurm"), 1)).expect("served");
    assert_eq!(v["granted"], true, "without the reservation: {v}");
    let id = v["id"].as_u64().expect("id");
    let (_, v) = d.serve(&alice, Request::Release { id }).expect("served");
    assert_eq!(v["ok"], true, "{v}");
    drop(d);
    let mut d = start(&reserved);
    let (_, v) = d.serve(&alice, request(Some("slurm"), 1)).expect("served");
    assert_eq!(v["ok"], false, "{v}");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("reserved to principals")),
        "{v}"
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}
