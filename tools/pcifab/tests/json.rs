// SPDX-License-Identifier: GPL-2.0-only

//! Runs the `pcifab` binary and validates each `--json` object it prints against
//! Documentation/json: the manager commands against a socket answered by the manager's own
//! protocol code, and the error object of every command.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
    process::Command,
};

use pcifab_manager::{config::Config, protocol, scheduler::Scheduler};
use serde_json::Value;

const POOL: &str = r#"
[manager]
hosts = 3
default_lease_s = 100
max_lease_s = 1000

[[pools]]
name = "gpus"
mode = "whole"

[[pools.devices]]
pf = 0x0120
vfs = [0x0121, 0x0122]
profile = "half"
"#;

/// Runs pcifab with `args`; returns (exit code, stdout, stderr).
fn pcifab(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_pcifab"))
        .args(args)
        .output()
        .expect("run pcifab");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The one JSON object of `out`, validated against the schema it names.
fn object(out: &str) -> Value {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "expected one JSON line, got {out:?}");
    let v: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {out}"));
    pcifab_schemas::validate(&v).unwrap_or_else(|e| panic!("{e}"));
    v
}

/// A fresh temporary directory, removed when the test is done with it.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("pcifab-json-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    TempDir(d)
}

/// A manager socket answered by pcifab-manager's protocol code on a real scheduler.
fn serve(sock: &Path) {
    let l = UnixListener::bind(sock).expect("bind socket");
    let config = Config::parse(POOL).expect("config");
    std::thread::spawn(move || {
        let mut s = Scheduler::new(config);
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let mut line = String::new();
            if BufReader::new(&c).read_line(&mut line).is_err() {
                continue;
            }
            let reply = match protocol::parse(&line) {
                Ok(req) => protocol::handle(&mut s, &req, 10),
                Err(e) => e,
            };
            let _ = writeln!(c, "{reply}");
        }
    });
}

#[test]
fn manager_commands_fit_their_schemas() {
    let dir = temp_dir("manager");
    let sock = dir.join("m.sock");
    serve(&sock);
    let s = sock.to_str().expect("utf-8 path");
    let m = |args: &[&str]| {
        let mut a = vec!["--json", "--manager-socket", s];
        a.extend_from_slice(args);
        pcifab(&a)
    };
    // Tagged (the tag is in the lease and the queue entry, and their schemas).
    let tagged = |host: &'static str, tag: &'static str| {
        [
            "request",
            "--gpus",
            "1",
            "--host",
            host,
            "--priority",
            "2",
            "--tag",
            tag,
        ]
    };
    let (code, out, err) = m(&tagged("1", "job-7"));
    assert_eq!(code, 0, "{err}");
    let v = object(&out);
    assert_eq!(v["schema"], "pcifab/request/v1");
    assert_eq!(v["granted"], true, "{v}");
    assert_eq!(v["lease"]["tag"], "job-7", "{v}");
    let lease = v["id"].as_u64().expect("id");
    // The pool's only GPU is taken: the next request queues.
    let (code, out, _) = m(&tagged("2", "job-8"));
    assert_eq!(code, 0);
    let v = object(&out);
    assert_eq!(v["granted"], false, "{v}");
    let (code, out, _) = m(&["queue"]);
    assert_eq!(code, 0);
    assert_eq!(object(&out)["queue"].as_array().map(Vec::len), Some(1));
    assert_eq!(object(&out)["queue"][0]["tag"], "job-8");
    let (code, out, _) = m(&["leases"]);
    assert_eq!(code, 0);
    assert_eq!(object(&out)["leases"][0]["functions"][0], "0x0120");
    assert_eq!(object(&out)["leases"][0]["tag"], "job-7");
    let (code, out, _) = m(&["release", &lease.to_string()]);
    assert_eq!(code, 0);
    assert_eq!(object(&out)["id"], lease);
    // Refused by the manager: exit 3, the error object.
    let (code, out, err) = m(&["release", "999"]);
    assert_eq!(code, 3, "{err}");
    let v = object(&out);
    assert_eq!(v["error"]["code"], "refused");
    assert_eq!(v["command"], "release");
    assert!(err.contains("refused"), "{err}");
}

#[test]
fn every_command_fails_as_one_json_error() {
    let dir = temp_dir("errors");
    let dev = dir.join("nodev");
    let dev = dev.to_str().expect("utf-8 path");
    let sock = dir.join("nosock");
    let sock = sock.to_str().expect("utf-8 path");
    for (cmd, args) in [
        ("info", "info"),
        ("list", "list"),
        ("show", "show 0x0300"),
        ("bind", "bind 0x0300 --host 1"),
        ("bind", "bind 0x0401 0x0402 0x0403 --host 1"),
        ("unbind", "unbind 0x0300"),
        ("move", "move 0x0300 --host 1"),
        ("watch", "watch --count 1"),
        ("stats", "stats"),
        ("stats-telemetry", "stats --telemetry"),
        ("mrpc", "mrpc 0x41 00"),
        ("p2p-route-add", "p2p route add 0x0300 --size 4k"),
        ("p2p-route-del", "p2p route del 0"),
        ("p2p-route-list", "p2p route list"),
        (
            "p2p-copy",
            "p2p copy --from 0x0300:0 --to 0x0400:0 --len 4k",
        ),
        ("p2p-distance", "p2p distance 0x0300 0x0400"),
        (
            "p2p-receive",
            "p2p receive --from 0x0001 --len 4k --out /dev/null --wait 1",
        ),
        ("p2p-grant", "p2p grant 0x0300 --host 1"),
        ("p2p-revoke", "p2p revoke 0x0300 --host 1"),
        ("p2p-grants", "p2p grants"),
        ("top", "top --count 1"),
    ] {
        let mut a = vec!["--json", "--device", dev];
        a.extend(args.split_whitespace());
        let (code, out, err) = pcifab(&a);
        assert_eq!(code, 1, "{args}: {err}");
        let v = object(&out);
        assert_eq!(v["command"], cmd, "{args}");
        assert_eq!(v["error"]["code"], "ENOENT", "{args}");
        assert_eq!(v["error"]["errno"], libc_enoent(), "{args}");
        assert!(err.contains("is the pcifab module loaded"), "{args}: {err}");
    }
    for (cmd, args) in [
        ("request", "request --gpus 1 --host 1 --priority 1"),
        ("release", "release 1"),
        ("queue", "queue"),
        ("leases", "leases"),
    ] {
        let mut a = vec!["--json", "--manager-socket", sock];
        a.extend(args.split_whitespace());
        let (code, out, _) = pcifab(&a);
        assert_eq!(code, 1, "{args}");
        assert_eq!(object(&out)["command"], cmd, "{args}");
    }
}

fn libc_enoent() -> i64 {
    2
}

#[test]
fn usage_errors_are_exit_2_and_json() {
    for (cmd, args) in [
        ("info", "--count 3 info"),
        ("bind", "bind 0x0300"),
        ("p2p-route-add", "p2p route add 0x0300 --size 5"),
        (
            "p2p-receive",
            "p2p receive --from 0x0001 --len 4k --out /tmp/x --wait 0",
        ),
        ("bogus", "bogus"),
        ("top", "top --interval 0"),
        ("bind", "bind 0x0401 0x0402 0x0401 --host 0"),
        ("bind", "bind 1 2 3 4 5 6 7 8 9 --host 0"),
        ("bind", "bind 0x0401 0xzz --host 0"),
    ] {
        let mut a = vec!["--json"];
        a.extend(args.split_whitespace());
        let (code, out, err) = pcifab(&a);
        assert_eq!(code, 2, "{args}: {err}");
        let v = object(&out);
        assert_eq!(v["error"]["code"], "usage", "{args}");
        assert_eq!(v["command"], cmd, "{args}");
        assert!(!err.is_empty(), "{args}: nothing on stderr");
    }
    // A list of functions: what is wrong with it, before the device is opened.
    let (code, _, err) = pcifab(&["bind", "0x0401", "0x0402", "0x0401", "--host", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("function 0x0401 is named twice"), "{err}");
    let (code, _, err) = pcifab(&[
        "bind", "1", "2", "3", "4", "5", "6", "7", "8", "9", "--host", "0",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("9 functions named: at most 8"), "{err}");
    let (code, _, err) = pcifab(&["bind", "0x0401", "0xzz", "--host", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("PDFID '0xzz' is not a number"), "{err}");
    // Without --json nothing goes to stdout.
    let (code, out, err) = pcifab(&["--count", "3", "info"]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.contains("--count does not apply to `pcifab info`"),
        "{err}"
    );
}

#[test]
fn version_and_help() {
    let (code, out, _) = pcifab(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("pcifab {}", env!("CARGO_PKG_VERSION")));
    let (code, out, _) = pcifab(&["p2p", "copy", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--from <END>") && !out.contains("Exit codes"));
    let (code, out, _) = pcifab(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Exit codes: 0 success"), "{out}");
}

/// `pcifab events --follow` on the manager's socket learns of a notice when it comes: the
/// manager's own daemon and connection code serve the socket; once the CLI's waiting
/// request has been answered empty, a grant is made in the daemon, and the CLI (`--count
/// 1`) must print it and exit within 500 ms (it used to ask again a second later; the
/// socket now holds the request until the notice).
#[test]
fn events_follow_prints_a_notice_when_it_comes() {
    use pcifab_manager::{daemon::Daemon, executor::SimExecutor, store::Store};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    let dir = temp_dir("follow");
    let sock = dir.join("m.sock");
    let config = Config::parse(POOL).expect("config");
    let sim = SimExecutor::new(
        config
            .pools
            .iter()
            .flat_map(|p| &p.devices)
            .map(|d| (d.pf, d.vfs.as_slice())),
    );
    let d = Daemon::start(
        config,
        Store::open(&dir.join("state")).expect("store"),
        Box::new(sim),
        Box::new(|| 10),
    )
    .expect("daemon");
    let d = Arc::new(Mutex::new(d));
    let l = UnixListener::bind(&sock).expect("bind socket");
    {
        let d = d.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let d = d.clone();
                std::thread::spawn(move || pcifab_manager::socket::serve_conn(d, c));
            }
        });
    }
    let served = |d: &Mutex<Daemon>| d.lock().expect("daemon").stats.served("events");
    let s = sock.to_str().expect("utf-8 path");
    let child = Command::new(env!("CARGO_BIN_EXE_pcifab"))
        .args([
            "--json",
            "--manager-socket",
            s,
            "events",
            "--follow",
            "--count",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run pcifab");
    let t = Instant::now();
    while served(&d) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "pcifab events --follow never asked the manager"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let req = r#"{"op":"request","spec":{"host":1,"want":{"kind":"gpus","count":1},"priority":2,"duration_s":100}}"#;
    let g = d.lock().expect("daemon").handle_line(req);
    assert_eq!(g["granted"], true, "{g}");
    let granted = Instant::now();
    let o = child.wait_with_output().expect("pcifab events");
    let late = granted.elapsed();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = object(&out);
    assert_eq!(v["events"][0]["kind"], "granted", "{v}");
    assert!(
        late < Duration::from_millis(500),
        "pcifab events --follow printed the grant {late:?} after it"
    );
}
