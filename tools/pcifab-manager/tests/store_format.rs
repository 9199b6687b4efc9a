// SPDX-License-Identifier: GPL-2.0-only

//! The store's on-disk format across versions (Documentation/manager.rst, "The store").
//!
//! `tests/fixtures/state-v2/manager.redb` is a database written by the manager of format 2
//! (the whole scheduler as one JSON value, rewritten by every request), made with
//! `write_state_fixture` below at that format's last commit; `state-v2.json` is what that
//! manager answered to `state` and `log` just before it stopped. The manager of today must
//! open it, migrate it on its first start, and answer the same.

mod common;

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use common::*;
use pcifab_manager::{daemon::Daemon, store::Store};
use serde_json::{json, Value};

/// The fixture's clock at its last request: the replies are compared at this time, so no
/// lease expires in between.
const FIXTURE_NOW: u64 = 1000 + 40;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn start(dir: &Path, clock: Arc<AtomicU64>) -> Daemon {
    let c = config("hybrid");
    let sim = sim_for(&c);
    Daemon::start(
        c,
        Store::open(dir).expect("store"),
        Box::new(sim),
        Box::new(move || clock.load(Ordering::SeqCst)),
    )
    .expect("daemon")
}

fn ask(d: &mut Daemon, v: Value) -> Value {
    d.handle_line(&v.to_string())
}

/// The replies a restart must keep: the whole state and the request log.
fn replies(d: &mut Daemon) -> Value {
    json!({
        "state": ask(d, json!({"op": "state"})),
        "log": ask(d, json!({"op": "log", "n": 1000})),
    })
}

/// Writes the fixture with the manager of this tree (`PCIFAB_FIXTURE_DIR` names the
/// directory): leases, a queue, notices, a tenant's usage, host heartbeats and a log.
#[test]
#[ignore = "writes tests/fixtures/state-vN: run at the last commit of a format"]
fn write_state_fixture() {
    let out = PathBuf::from(std::env::var("PCIFAB_FIXTURE_DIR").expect("PCIFAB_FIXTURE_DIR"));
    let _ = std::fs::remove_dir_all(&out);
    let clock = Arc::new(AtomicU64::new(1000));
    let mut d = start(&out, clock.clone());
    let req = |host: u8, kind: &str, count: u32, priority: u32| {
        json!({"op": "request", "spec": {"host": host, "want": {"kind": kind, "count": count},
               "priority": priority, "duration_s": 600}})
    };
    // Request/release pairs: notices and log entries.
    for i in 0..20u64 {
        clock.store(1000 + i, Ordering::SeqCst);
        let r = ask(&mut d, req((i % 3) as u8, "gpus", 1, 1));
        assert_eq!(r["granted"], json!(true), "{r}");
        let r = ask(&mut d, json!({"op": "release", "id": r["id"]}));
        assert_eq!(r["ok"], json!(true), "{r}");
    }
    clock.store(FIXTURE_NOW, Ordering::SeqCst);
    let a = ask(&mut d, req(0, "gpus", 1, 3));
    assert_eq!(a["granted"], json!(true), "{a}");
    let b = ask(&mut d, req(1, "vfs", 2, 2));
    assert_eq!(b["granted"], json!(true), "{b}");
    let q = ask(&mut d, req(2, "gpus", 2, 5));
    assert_eq!(q["granted"], json!(false), "{q}");
    let q = ask(&mut d, req(1, "gpus", 1, 1));
    assert_eq!(q["granted"], json!(false), "{q}");
    let h = ask(&mut d, json!({"op": "heartbeat", "host": 2}));
    assert_eq!(h["ok"], json!(true), "{h}");
    let expected = replies(&mut d);
    drop(d);
    std::fs::write(
        out.with_extension("json"),
        serde_json::to_string_pretty(&expected).expect("JSON") + "\n",
    )
    .expect("write the expected replies");
}

/// A database of format 2 opens, migrates on the first start (to per-key records, the old
/// whole-state value removed) and answers as the manager that wrote it did; a second start
/// reads the migrated records and answers the same again.
#[test]
fn a_format_2_database_migrates_on_first_start() {
    let dir = tempdir("fixture-v2");
    std::fs::copy(
        fixtures().join("state-v2/manager.redb"),
        dir.join("manager.redb"),
    )
    .expect("copy the fixture");
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("state-v2.json")).expect("expected replies"),
    )
    .expect("JSON");
    assert!(
        expected["state"]["state"]["notices"]
            .as_array()
            .is_some_and(|n| n.len() > 40),
        "the fixture has notices"
    );
    let clock = Arc::new(AtomicU64::new(FIXTURE_NOW));
    let mut d = start(&dir, clock.clone());
    assert_eq!(replies(&mut d), expected, "first start after the migration");
    drop(d);
    let format = Store::open(&dir).expect("store").format().expect("format");
    assert_eq!(format, pcifab_manager::store::Format::Records(3));
    let mut d = start(&dir, clock);
    assert_eq!(replies(&mut d), expected, "second start");
    let _ = std::fs::remove_dir_all(&dir);
}
