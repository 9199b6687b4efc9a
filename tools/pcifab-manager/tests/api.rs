// SPDX-License-Identifier: GPL-2.0-only

//! The network API served for real: a daemon on the simulated fabric, its HTTPS server on a
//! loopback port with certificates made for the test, and the client the CLI uses.

mod common;

use std::{
    io::{Read, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{config, gpus, sim_for, tempdir};
use pcifab_manager::{
    api,
    auth::Principals,
    client::Remote,
    config::{ApiConfig, Config},
    daemon::Daemon,
    protocol::Request,
    store::Store,
};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use serde_json::{json, Value};

/// sha256("ops-token").
const OPS_TOKEN: &str = "ops-token";
/// The h0-job tenant's token.
const H0_TOKEN: &str = "h0-token";

struct World {
    dir: PathBuf,
    addr: SocketAddr,
    daemon: Arc<Mutex<Daemon>>,
    /// Its turn on the machine (see [`TURNS`]); held while the world lives.
    _turn: Turn,
}

/// The tests of this file run at once, but the one that times an operator's requests under
/// an attack runs alone: it takes this for writing, every other world for reading.
static TURNS: std::sync::RwLock<()> = std::sync::RwLock::new(());

enum Turn {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
}

/// The scenario's files go with it (the daemon's open database stays usable until the
/// test process ends).
impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

/// A CA, the server's certificate for 127.0.0.1, and client certificates for `clients`
/// (plus one from a CA the server does not trust).
fn certificates(dir: &Path, clients: &[&str]) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "test CA");
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    write(dir, "ca.crt", &ca_cert.pem());
    let issuer = Issuer::from_params(&ca, &ca_key);
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(vec!["pcifab-manager".to_string()]).expect("params");
    p.subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = p.signed_by(&key, &issuer).expect("server cert");
    write(dir, "server.crt", &cert.pem());
    write(dir, "server.key", &key.serialize_pem());
    for c in clients {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, *c);
        let cert = p.signed_by(&key, &issuer).expect("client cert");
        write(dir, &format!("{c}.crt"), &cert.pem());
        write(dir, &format!("{c}.key"), &key.serialize_pem());
    }
    // A client certificate the manager must not accept: another CA signed it.
    let rogue_key = KeyPair::generate().expect("key");
    let mut rogue = CertificateParams::new(Vec::<String>::new()).expect("params");
    rogue.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let _ = rogue.self_signed(&rogue_key).expect("rogue CA");
    let rogue_issuer = Issuer::from_params(&rogue, &rogue_key);
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    p.distinguished_name.push(DnType::CommonName, "ops");
    let cert = p.signed_by(&key, &rogue_issuer).expect("rogue cert");
    write(dir, "rogue.crt", &cert.pem());
    write(dir, "rogue.key", &key.serialize_pem());
}

fn start(name: &str) -> World {
    start_with(name, |_| {})
}

/// [`start`] with the API's settings changed by `tweak`.
fn start_with(name: &str, tweak: impl FnOnce(&mut ApiConfig)) -> World {
    let turn = Turn::Shared(
        TURNS
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    start_in_turn(name, tweak, turn)
}

fn start_in_turn(name: &str, tweak: impl FnOnce(&mut ApiConfig), turn: Turn) -> World {
    let dir = tempdir(name);
    certificates(&dir, &["h1-job", "h0-job", "grafana", "stranger"]);
    let mut c: Config = config("hybrid");
    let principals = format!(
        r#"
[[principals]]
name = "ops"
role = "admin"
token_sha256 = "{}"

[[principals]]
name = "h1-job"
role = "tenant"
hosts = [1]

[[principals]]
name = "h0-job"
role = "tenant"
hosts = [0]
token_sha256 = "{}"

[[principals]]
name = "grafana"
role = "reader"
"#,
        sha256(OPS_TOKEN),
        sha256(H0_TOKEN)
    );
    let extra: Config =
        Config::parse(&format!("[manager]\nhosts = 3\n{principals}")).expect("principals");
    c.principals = extra.principals;
    c.api = Some(ApiConfig {
        listen: "127.0.0.1:0".into(),
        cert: dir.join("server.crt").display().to_string(),
        key: dir.join("server.key").display().to_string(),
        client_ca: Some(dir.join("ca.crt").display().to_string()),
        max_body: 4096,
        client_timeout_s: 2,
        body_timeout_s: 2,
        max_connections: 64,
        max_connections_per_peer: 64,
        redfish: Default::default(),
    });
    if let Some(a) = c.api.as_mut() {
        tweak(a);
    }
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
    World {
        dir,
        addr,
        daemon,
        _turn: turn,
    }
}

fn sha256(s: &str) -> String {
    use std::process::Command;
    let out = Command::new("sh")
        .args(["-c", &format!("printf %s '{s}' | sha256sum")])
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

impl World {
    fn client(&self, who: Option<&str>, token: Option<&str>) -> Remote {
        Remote {
            url: format!("https://{}", self.addr),
            ca: Some(self.dir.join("ca.crt")),
            cert: who.map(|w| self.dir.join(format!("{w}.crt"))),
            key: who.map(|w| self.dir.join(format!("{w}.key"))),
            token: token.map(String::from),
            timeout: Duration::from_secs(10),
        }
    }

    fn ask(&self, who: Option<&str>, req: &Request) -> (u16, Value) {
        self.client(who, None).ask(req, 0).expect("an answer")
    }

    /// How many `events` requests the daemon has answered (its request counters).
    fn events_served(&self) -> u64 {
        self.daemon.lock().expect("daemon").stats.served("events")
    }

    /// The leases as the scheduler holds them (not through the API).
    fn lease_ids(&self) -> Vec<u64> {
        self.daemon
            .lock()
            .expect("daemon")
            .sched
            .leases
            .keys()
            .copied()
            .collect()
    }
}

#[test]
fn roles_decide_and_refusals_say_why() {
    let w = start("api-roles");
    let req = |host| Request::Request {
        spec: gpus(host, 1, 5, 600),
    };
    // A tenant requests for its own host: granted, owned by it.
    let (st, v) = w.ask(Some("h1-job"), &req(1));
    assert_eq!(st, 201, "{v}");
    let id1 = v["id"].as_u64().expect("id");
    assert_eq!(v["lease"]["owner"], "h1-job");
    // Not for another host; a reader not at all; nothing changes.
    let (st, v) = w.ask(Some("h1-job"), &req(0));
    assert_eq!(st, 403, "{v}");
    assert!(
        v["error"].as_str().expect("error").contains("host 0"),
        "{v}"
    );
    let (st, _) = w.ask(Some("grafana"), &req(0));
    assert_eq!(st, 403);
    assert_eq!(w.lease_ids(), vec![id1]);
    // h0's tenant gets the other GPU, and may not release h1's lease.
    let (st, v) = w.ask(Some("h0-job"), &req(0));
    assert_eq!(st, 201, "{v}");
    let id0 = v["id"].as_u64().expect("id");
    let (st, v) = w.ask(Some("h0-job"), &Request::Release { id: id1 });
    assert_eq!(st, 403, "{v}");
    assert_eq!(w.lease_ids(), vec![id1, id0]);
    // Each tenant sees its own lease; the reader sees both.
    let (_, v) = w.ask(Some("h1-job"), &Request::Leases);
    assert_eq!(v["leases"].as_array().map(Vec::len), Some(1), "{v}");
    let (_, v) = w.ask(Some("grafana"), &Request::Leases);
    assert_eq!(v["leases"].as_array().map(Vec::len), Some(2), "{v}");
    // The admin, by bearer token, releases h1's lease; the scheduler's refusal is a 409.
    let admin = w.client(None, Some(OPS_TOKEN));
    let (st, v) = admin.ask(&Request::Release { id: id1 }, 0).expect("answer");
    assert_eq!(st, 200, "{v}");
    let (st, v) = admin.ask(&Request::Release { id: id1 }, 0).expect("answer");
    assert_eq!(st, 409, "{v}");
    assert_eq!(w.lease_ids(), vec![id0]);
}

/// Every reply is written in pieces (TLS 1.3 session tickets, then the HTTP response); with
/// Nagle's algorithm on the server's socket the last piece waits for the client's delayed
/// ACK, at least 40 ms on Linux, in every request; loopback answers in a few ms without it.
/// The fastest of ten is the figure: the stall is in each one, a busy machine is not.
#[test]
fn replies_come_without_a_delayed_ack_stall() {
    let w = start("api-nodelay");
    let c = w.client(Some("h1-job"), None);
    let mut ms: Vec<f64> = (0..10)
        .map(|_| {
            let t = std::time::Instant::now();
            let (st, v) = c.ask(&Request::Leases, 0).expect("an answer");
            assert_eq!(st, 200, "{v}");
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    assert!(
        ms[0] < 30.0,
        "the fastest of 10 requests over loopback took {:.1} ms (all: {ms:.1?}); a \
         delayed-ACK stall (no TCP_NODELAY on the API's sockets) costs 40 ms each",
        ms[0]
    );
}

#[test]
fn strangers_are_turned_away() {
    let w = start("api-strangers");
    // No credentials, a wrong token, a certificate of no principal: 401.
    for c in [
        w.client(None, None),
        w.client(None, Some("guess")),
        w.client(Some("stranger"), None),
    ] {
        let (st, v) = c.ask(&Request::Queue, 0).expect("answer");
        assert_eq!(st, 401, "{v}");
        assert_eq!(v["ok"], false);
    }
    // A certificate from another CA does not get past the handshake: the manager's TLS
    // stack rejects it with the alert for an unknown issuer, not with an HTTP status or a
    // connection that merely fails.
    let e = w
        .client(Some("rogue"), None)
        .ask(&Request::Queue, 0)
        .expect_err("rogue certificate");
    assert!(
        e.msg.contains("received fatal alert: UnknownCA"),
        "expected the TLS alert UnknownCA, got: {}",
        e.msg
    );
    // The OpenAPI document is public.
    let doc = raw(
        &w,
        None,
        "GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(doc.starts_with("HTTP/1.1 200"), "{doc}");
}

#[test]
fn malformed_and_oversized_bodies_change_nothing() {
    let w = start("api-bad");
    let token = format!("Authorization: Bearer {OPS_TOKEN}\r\n");
    let post = |body: &str| {
        format!(
            "POST /v1/requests HTTP/1.1\r\nHost: x\r\n{token}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    assert!(raw(&w, None, &post("{")).starts_with("HTTP/1.1 400"));
    assert!(raw(
        &w,
        None,
        &post(r#"{"host":1,"want":{"kind":"gpus","count":1},"priority":1,"bogus":1}"#)
    )
    .starts_with("HTTP/1.1 400"));
    let big = format!(
        r#"{{"host":1,"want":{{"kind":"gpus","count":1}},"priority":1,"pool":"{}"}}"#,
        "x".repeat(5000)
    );
    assert!(raw(&w, None, &post(&big)).starts_with("HTTP/1.1 413"));
    assert!(raw(
        &w,
        None,
        &format!("GET /v1/nope HTTP/1.1\r\nHost: x\r\n{token}Connection: close\r\n\r\n")
    )
    .starts_with("HTTP/1.1 404"));
    assert!(w.lease_ids().is_empty());
    // A client that never finishes its request head is cut off after client_timeout_s.
    let t = std::time::Instant::now();
    let r = raw(&w, None, "GET /v1/queue HTTP/1.1\r\n");
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert!(!r.starts_with("HTTP/1.1 200"), "{r}");
}

/// `Idempotency-Key` over HTTPS: a repeated `POST /v1/requests` gets the recorded reply
/// (201, `replayed`, the same lease), another body under the key is 422, a malformed key is
/// 400 before the body is read; nothing of these makes a second lease.
#[test]
fn an_idempotency_key_is_answered_once_over_https() {
    let w = start("api-idem");
    let keyed = |key: &str, body: &str| {
        format!(
            "POST /v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS_TOKEN}\r\n\
             Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let body_of = |r: &str| -> Value {
        serde_json::from_str(r.split("\r\n\r\n").nth(1).unwrap_or("")).expect("JSON body")
    };
    let first = raw(&w, None, &keyed("job-7", &spec_json(1)));
    assert_eq!(status(&first), 201, "{first}");
    let again = raw(&w, None, &keyed("job-7", &spec_json(1)));
    assert_eq!(status(&again), 201, "{again}");
    let (first, again) = (body_of(&first), body_of(&again));
    assert_eq!(again["replayed"], json!(true), "{again}");
    assert_eq!(again["id"], first["id"], "{again}");
    let other = raw(&w, None, &keyed("job-7", &spec_json(2)));
    assert_eq!(status(&other), 422, "{other}");
    assert!(body_of(&other)["error"]
        .as_str()
        .is_some_and(|e| e.contains("job-7") && e.contains("already used")));
    let bad = raw(&w, None, &keyed("job 7", &spec_json(2)));
    assert_eq!(status(&bad), 400, "{bad}");
    assert_eq!(w.lease_ids().len(), 1, "a repeat made a lease");
}

/// A client whose request's outcome stays unknown (every manager of its list takes the
/// connection and drops it) sends it again with the same key, at most `MAX_SENDS` times,
/// then gives up saying so; a request without a key is sent once.
#[test]
fn the_client_gives_up_after_its_sends_saying_the_outcome_is_unknown() {
    let w = start("api-giveup");
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = l.local_addr().expect("addr");
    let taken = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let t2 = taken.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            // Read what the client sends, then drop the connection unanswered.
            let Ok(mut c) = c else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = c.read(&mut [0; 512]);
            t2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let mut c = w.client(None, Some(OPS_TOKEN));
    c.url = format!("https://{addr},https://{addr}");
    let req = Request::Release { id: 1 };
    let f = c.ask(&req, 0).expect_err("no answer");
    assert!(
        f.msg.contains(&format!(
            "gave up after sending the request {} time(s)",
            pcifab_manager::client::MAX_SENDS
        )) && f.msg.contains("may or may not have been carried out"),
        "{}",
        f.msg
    );
    assert_eq!(
        taken.load(std::sync::atomic::Ordering::SeqCst),
        pcifab_manager::client::MAX_SENDS
    );
    let f = c.ask_keyed(&req, 0, None).expect_err("no answer");
    assert!(!f.msg.contains("gave up"), "{}", f.msg);
    assert_eq!(
        taken.load(std::sync::atomic::Ordering::SeqCst),
        pcifab_manager::client::MAX_SENDS + 1,
        "a request without a key was sent twice"
    );
}

#[test]
fn metrics_and_events_are_served() {
    let w = start("api-metrics");
    let (st, _) = w.ask(
        Some("h1-job"),
        &Request::Request {
            spec: gpus(1, 1, 5, 600),
        },
    );
    assert_eq!(st, 201);
    let m = raw(
        &w,
        Some("grafana"),
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(m.starts_with("HTTP/1.1 200"), "{m}");
    for want in [
        "# TYPE pcifab_leases gauge",
        "pcifab_leases{pool=\"gpus\",priority=\"5\"} 1",
        "pcifab_requests_total{op=\"request\",outcome=\"ok\"} 1",
        "pcifab_request_duration_seconds_count 1",
        "pcifab_device_healthy{pool=\"gpus\",pf=\"0x0120\"} 1",
    ] {
        assert!(m.contains(want), "no {want:?} in\n{m}");
    }
    // Prometheus's own linter accepts the text (make deps unpacks promtool into the cache).
    let body = m.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| {
        format!(
            "{}/prometheus/usr/bin/promtool",
            std::env::var("PCIFAB_CACHE").unwrap_or_else(|_| "/var/cache/pcifab".into())
        )
    });
    let mut p = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {promtool} ({e}): `make deps` unpacks it"));
    p.stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write");
    let out = p.wait_with_output().expect("promtool");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {} {}{}\n{body}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // A tenant's events: its host's grant.
    let (st, v) = w
        .client(Some("h1-job"), None)
        .ask(
            &Request::Events {
                host: None,
                since: 0,
            },
            1,
        )
        .expect("events");
    assert_eq!(st, 200);
    assert_eq!(v["events"][0]["kind"], "granted", "{v}");
    let (st, _) = w.ask(
        Some("h1-job"),
        &Request::Events {
            host: Some(0),
            since: 0,
        },
    );
    assert_eq!(st, 403);
    let _ = json!(null);
}

/// A long poll of `events` ends when the notice is added, not at a later look: five
/// rounds of a tenant waiting (`wait` 10 s) while the admin grants its host a GPU; each wait
/// must end within 150 ms of the grant's reply (a loop that looks every 200 ms, as this
/// one did, ends about 190 ms after it: the poll has just looked). The grant is made once the
/// daemon has answered the poll empty.
#[test]
fn events_long_poll_ends_when_the_notice_comes() {
    let w = start("api-long-poll");
    let admin = w.client(None, Some(OPS_TOKEN));
    let mut since = 0;
    let mut late = Vec::new();
    let mut served = w.events_served();
    for round in 0..5 {
        let tenant = w.client(Some("h1-job"), None);
        let waiter = std::thread::spawn(move || {
            let r = tenant.ask(&Request::Events { host: None, since }, 10);
            (r, std::time::Instant::now())
        });
        // The poll is waiting once the daemon has served it (empty) once.
        let t = std::time::Instant::now();
        while w.events_served() == served {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "round {round}: the events poll never reached the daemon"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let (st, v) = admin
            .ask(
                &Request::Request {
                    spec: gpus(1, 1, 5, 600),
                },
                0,
            )
            .expect("grant");
        let granted = std::time::Instant::now();
        assert_eq!(st, 201, "round {round}: {v}");
        let id = v["id"].as_u64().expect("id");
        let (r, answered) = waiter.join().expect("waiter");
        let (st, ev) = r.expect("events");
        assert_eq!(st, 200, "{ev}");
        let evs = ev["events"].as_array().expect("events");
        assert!(
            evs.iter()
                .any(|e| e["kind"] == "granted" && e["lease"] == id),
            "round {round}: the wait ended without lease {id}'s grant: {ev}"
        );
        since = evs
            .iter()
            .filter_map(|e| e["seq"].as_u64())
            .max()
            .unwrap_or(since);
        late.push(answered.saturating_duration_since(granted).as_secs_f64() * 1000.0);
        let (st, v) = admin.ask(&Request::Release { id }, 0).expect("release");
        assert_eq!(st, 200, "{v}");
        // The release's notice, if any, is not what the next round waits for.
        let (_, v) = w.ask(Some("h1-job"), &Request::Events { host: None, since });
        served = w.events_served();
        since = v["events"]
            .as_array()
            .and_then(|a| a.iter().filter_map(|e| e["seq"].as_u64()).max())
            .unwrap_or(since);
    }
    late.sort_by(f64::total_cmp);
    assert!(
        late[4] < 150.0,
        "an events long poll ended {:.1}-{:.1} ms after the grant that made its notice",
        late[0],
        late[4]
    );
}

/// One raw HTTP exchange over TLS (to send what the client never would); `who` presents
/// a client certificate. Returns what the server sent until it closed.
fn raw(w: &World, who: Option<&str>, request: &str) -> String {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(w.dir.join("ca.crt")).expect("ca") {
        roots.add(c.expect("ca")).expect("root");
    }
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let cfg = match who {
        Some(n) => b
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(w.dir.join(format!("{n}.crt")))
                    .expect("cert")
                    .collect::<Result<Vec<_>, _>>()
                    .expect("cert"),
                PrivateKeyDer::from_pem_file(w.dir.join(format!("{n}.key"))).expect("key"),
            )
            .expect("client auth"),
        None => b.with_no_client_auth(),
    };
    let conn = rustls::ClientConnection::new(
        Arc::new(cfg),
        ServerName::try_from("127.0.0.1").expect("name"),
    )
    .expect("connection");
    let tcp = std::net::TcpStream::connect(w.addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut s = rustls::StreamOwned::new(conn, tcp);
    s.write_all(request.as_bytes()).expect("send");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// SplitMix64: the seeded stream of the bad-input phase.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The status of a raw exchange, or 0 when the server closed without a status line.
fn status(reply: &str) -> u16 {
    reply
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn invariants(w: &World, phase: &str) {
    let d = w.daemon.lock().expect("daemon");
    d.sched
        .check_invariants()
        .unwrap_or_else(|e| panic!("{phase}: scheduler invariants: {e}"));
}

/// 1,000 seeded malformed, oversized and unauthenticated requests, then 200 clients at
/// once: the manager answers every one, loses and duplicates nothing, and its invariants
/// hold after each phase.
#[test]
fn bad_input_and_load() {
    let w = start("api-load");
    let seed = 0x05ee_da91;
    let mut rng = Rng(seed);
    let auth = format!("Authorization: Bearer {OPS_TOKEN}\r\n");
    let mut by_status = std::collections::BTreeMap::<u16, u32>::new();
    for i in 0..1000 {
        let kind = rng.below(8);
        let junk: String = (0..1 + rng.below(200))
            .map(|_| char::from(b' ' + (rng.below(95)) as u8))
            .collect();
        let (who, req, want): (Option<&str>, String, &[u16]) = match kind {
            // Not JSON, or JSON of the wrong shape.
            0 => (None, post(&auth, &junk), &[400]),
            1 => (
                None,
                post(
                    &auth,
                    &format!("{{\"host\":{},\"want\":{junk:?}}}", rng.below(300)),
                ),
                &[400],
            ),
            // Too large.
            2 => (
                None,
                post(&auth, &"x".repeat(4097 + rng.below(10_000) as usize)),
                &[413],
            ),
            // No credentials, a wrong token, a malformed Authorization header.
            3 => (None, post("", "{}"), &[401]),
            4 => (None, post("Authorization: Bearer nope\r\n", "{}"), &[401]),
            5 => (
                None,
                post(&format!("Authorization: {junk}\r\n"), "{}"),
                &[401, 400],
            ),
            // A reader writing; a tenant for someone else's host.
            6 => (Some("grafana"), post("", &spec_json(1)), &[403]),
            // Routes and methods that do not exist.
            _ => (
                Some("h0-job"),
                format!(
                    "{} /v1/{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                    ["GET", "PATCH", "DELETE", "OPTIONS"][rng.below(4) as usize],
                    junk.replace([' ', '?', '#', '%', '/'], "")
                ),
                &[400, 404, 405],
            ),
        };
        let r = raw(&w, who, &req);
        let st = status(&r);
        *by_status.entry(st).or_default() += 1;
        assert!(
            want.contains(&st),
            "bad request {i} (kind {kind}, seed {seed:#x}): status {st}, wanted {want:?}:\n{req:.300}\n-> {r:.300}"
        );
    }
    eprintln!("1,000 bad requests (seed {seed:#x}): statuses {by_status:?}");
    assert!(w.lease_ids().is_empty(), "a bad request made a lease");
    invariants(&w, "after the bad requests");

    // 200 clients at once, each asking for one VF for one of the three hosts.
    let clients = 200;
    let ids: Vec<(u64, bool)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients)
            .map(|i| {
                let c = w.client(None, Some(OPS_TOKEN));
                s.spawn(move || {
                    let mut spec = common::vfs((i % 3) as u8, 1, (i % 7) as u32, 600);
                    spec.want = pcifab_manager::scheduler::Want::Vfs {
                        count: 1,
                        profile: None,
                    };
                    let (st, v) = c.ask(&Request::Request { spec }, 0).expect("answer");
                    assert_eq!(st, 201, "client {i}: {v}");
                    (v["id"].as_u64().expect("id"), v["granted"] == json!(true))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("client")).collect()
    });
    let mut seen: Vec<u64> = ids.iter().map(|(id, _)| *id).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), clients, "duplicated request ids");
    {
        let d = w.daemon.lock().expect("daemon");
        let mut held: Vec<u64> = d
            .sched
            .leases
            .keys()
            .copied()
            .chain(d.sched.queue.iter().map(|q| q.id))
            .collect();
        held.sort_unstable();
        assert_eq!(held, seen, "every request is a lease or queued, once");
        let granted: Vec<u64> = ids.iter().filter(|(_, g)| *g).map(|(id, _)| *id).collect();
        for id in &granted {
            assert!(d.sched.leases.contains_key(id) || d.sched.queue.iter().all(|q| q.id != *id));
        }
    }
    invariants(&w, "after 200 concurrent requests");
    // And all of them released at once: nothing left.
    std::thread::scope(|s| {
        for (id, _) in &ids {
            let c = w.client(None, Some(OPS_TOKEN));
            let id = *id;
            s.spawn(move || {
                let (st, v) = c.ask(&Request::Release { id }, 0).expect("answer");
                // A queued request promoted to a lease and released is fine either way.
                assert_eq!(st, 200, "release {id}: {v}");
            });
        }
    });
    let d = w.daemon.lock().expect("daemon");
    assert!(d.sched.leases.is_empty() && d.sched.queue.is_empty());
    d.sched
        .check_invariants()
        .expect("invariants after the releases");
}

fn spec_json(host: u8) -> String {
    serde_json::to_string(&gpus(host, 1, 1, 60)).expect("spec")
}

fn post(auth: &str, body: &str) -> String {
    format!(
        "POST /v1/requests HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The Python of the virtual environment `make deps` makes for DMTF's `redfish` library.
fn redfish_python() -> PathBuf {
    let p = std::env::var_os("PCIFAB_REDFISH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache =
                std::env::var("PCIFAB_CACHE").unwrap_or_else(|_| "/var/cache/pcifab".into());
            Path::new(&cache).join("redfish-venv/bin/python3")
        });
    assert!(
        p.exists(),
        "{} is missing: `make deps` installs DMTF's redfish library there \
         (or set PCIFAB_REDFISH_PYTHON)",
        p.display()
    );
    p
}

#[test]
fn redfish_client_walks_the_fabric_and_composes_a_zone() {
    let w = start("api-redfish");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/redfish/client.py");
    let out = std::process::Command::new(redfish_python())
        .arg(&script)
        .arg(format!("https://{}", w.addr))
        .arg(w.dir.join("ca.crt"))
        .args([OPS_TOKEN, H0_TOKEN])
        .output()
        .expect("run the Redfish client");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).expect("the client's JSON");
    let e = "/redfish/v1/Fabrics/PCIe/Endpoints/";
    assert_eq!(seen["root"], "#ServiceRoot.v1_15_0.ServiceRoot");
    assert_eq!(seen["fabric_type"], "PCIe");
    // Three hosts, two devices of four VFs: 3 initiators and 10 targets, 3 zones, 5 ports.
    assert_eq!(
        seen["endpoints"].as_array().map(Vec::len),
        Some(13),
        "{seen}"
    );
    assert_eq!(seen["zones"].as_array().map(Vec::len), Some(3), "{seen}");
    assert_eq!(seen["ports"].as_array().map(Vec::len), Some(5), "{seen}");
    assert_eq!(
        seen["zone1_after_patch"],
        json!([format!("{e}host1"), format!("{e}0x0120")])
    );
    assert_eq!(
        seen["target_zones"],
        json!(["/redfish/v1/Fabrics/PCIe/Zones/1"])
    );
    // The composition went through the scheduler: host 1 holds the GPU, in a lease the
    // admin owns, and that lease is the one connection.
    {
        let d = w.daemon.lock().expect("daemon");
        assert_eq!(d.sched.holders.get(&0x0120), Some(&1));
        let leases: Vec<_> = d.sched.leases.values().collect();
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].spec.owner.as_deref(), Some("ops"));
        assert_eq!(
            seen["connections"],
            json!([format!(
                "/redfish/v1/Fabrics/PCIe/Connections/{}",
                leases[0].id
            )])
        );
    }
    // The tenant of h0 is refused, with the reason, and nothing changed.
    assert_eq!(seen["tenant0_patch_zone1"], 403, "{seen}");
    assert!(
        seen["tenant0_patch_zone1_error"]
            .as_str()
            .is_some_and(|m| m.contains("host 1")),
        "{seen}"
    );
    assert_eq!(seen["tenant0_patch_taken"], 409, "{seen}");
    assert!(
        seen["tenant0_patch_taken_error"]
            .as_str()
            .is_some_and(|m| m.contains("not free")),
        "{seen}"
    );
    assert_eq!(seen["tenant0_patch_malformed"], 400, "{seen}");
    assert_eq!(seen["anonymous_root"], "RootService");
    assert_eq!(seen["anonymous_fabric"], 401);
    assert_eq!(
        w.daemon.lock().expect("daemon").sched.holders.get(&0x0120),
        Some(&1)
    );
}

// ---- connections that stall ------------------------------------------------------------

/// A TLS client configuration that trusts the test CA and presents no certificate.
fn tls_client(w: &World) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(w.dir.join("ca.crt")).expect("ca") {
        roots.add(c.expect("ca")).expect("root");
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// Sends `head` over TLS and returns what the server sent within `within` (until it
/// closed or the time was up) and how long that took.
fn head_only(w: &World, head: &str, within: Duration) -> (String, Duration) {
    use rustls::pki_types::ServerName;
    let conn = rustls::ClientConnection::new(
        tls_client(w),
        ServerName::try_from("127.0.0.1").expect("name"),
    )
    .expect("connection");
    let tcp = std::net::TcpStream::connect(w.addr).expect("connect");
    tcp.set_read_timeout(Some(within)).expect("timeout");
    let mut s = rustls::StreamOwned::new(conn, tcp);
    let t = std::time::Instant::now();
    s.write_all(head.as_bytes()).expect("send");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    (String::from_utf8_lossy(&out).into_owned(), t.elapsed())
}

/// The body of a request is read only once its head says who asks and that the body may
/// be that large: a stranger announcing a body, or anyone announcing one above max_body,
/// is answered at once and the connection closed, without waiting for the body.
#[test]
fn refusals_come_from_the_head_without_waiting_for_the_body() {
    let w = start_with("api-head", |a| {
        a.client_timeout_s = 30;
        a.body_timeout_s = 30;
    });
    let within = Duration::from_secs(5);
    let stranger = "POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n";
    let (r, took) = head_only(&w, stranger, within);
    assert_eq!(status(&r), 401, "{r:?} after {took:?}");
    assert!(took < Duration::from_secs(2), "401 took {took:?}");
    let huge = format!(
        "POST /v1/requests HTTP/1.1\r\nHost: x\r\nauthorization: bearer {OPS_TOKEN}\r\n\
         Content-Length: 1000000000\r\n\r\n"
    );
    let (r, took) = head_only(&w, &huge, within);
    assert_eq!(status(&r), 413, "{r:?} after {took:?}");
    assert!(took < Duration::from_secs(2), "413 took {took:?}");
    // The Redfish service root stays public; the rest of it wants credentials.
    let (r, _) = head_only(
        &w,
        "GET /redfish/v1/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        within,
    );
    assert_eq!(status(&r), 200, "{r:?}");
    let (r, took) = head_only(
        &w,
        "PATCH /redfish/v1/Fabrics/PCIe/Zones/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n",
        within,
    );
    assert_eq!(status(&r), 401, "{r:?} after {took:?}");
    let m = metrics(&w);
    for code in ["401", "413"] {
        let line = format!("pcifab_http_responses_total{{code=\"{code}\"}} ");
        let n: f64 = m
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line} in\n{m}"));
        assert!(n >= 1.0, "{line}{n}");
    }
}

/// A body that does not come within body_timeout_s ends the connection with 408.
#[test]
fn a_body_that_does_not_come_is_cut_off() {
    let w = start_with("api-body-timeout", |a| {
        a.client_timeout_s = 30;
        a.body_timeout_s = 1;
    });
    let head = format!(
        "POST /v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS_TOKEN}\r\n\
         Content-Length: 100\r\n\r\n{{\"host\":"
    );
    let (r, took) = head_only(&w, &head, Duration::from_secs(10));
    assert_eq!(status(&r), 408, "{r:?} after {took:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(w.lease_ids().is_empty());
}

fn metrics(w: &World) -> String {
    raw(
        w,
        None,
        &format!(
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS_TOKEN}\r\n\
             Connection: close\r\n\r\n"
        ),
    )
}

/// Resident memory of this process (server and clients both), in KiB.
fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .expect("VmRSS in /proc/self/status")
}

#[derive(Clone, Copy, Debug)]
enum Stall {
    /// TCP only: never starts the TLS handshake.
    Handshake,
    /// A request head announcing a body that never comes; with a tenant's token or none.
    Body { token: bool },
    /// A request head sent a header line a second, never finished.
    Slowloris,
}

/// One attacking connection from `from`: connects, stalls as `kind` says, and holds the
/// connection until the server closes it or `stop` is set. Returns whether it connected.
async fn stall(
    addr: SocketAddr,
    from: std::net::IpAddr,
    kind: Stall,
    tls: tokio_rustls::TlsConnector,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> bool {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(sock) = tokio::net::TcpSocket::new_v4() else {
        return false;
    };
    if sock.bind(SocketAddr::new(from, 0)).is_err() {
        return false;
    }
    let Ok(Ok(mut tcp)) = tokio::time::timeout(Duration::from_secs(20), sock.connect(addr)).await
    else {
        return false;
    };
    let tick = Duration::from_millis(200);
    let mut buf = [0u8; 512];
    if let Stall::Handshake = kind {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(tick, tcp.read(&mut buf)).await {
                break;
            }
        }
        return true;
    }
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(20), tls.connect(name, tcp)).await
    else {
        return true;
    };
    let head = match kind {
        Stall::Body { token: true } => format!(
            "POST /v1/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {H0_TOKEN}\r\n\
             Content-Length: 4000\r\n\r\n"
        ),
        Stall::Body { token: false } => {
            "POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n".to_string()
        }
        _ => "GET /v1/hosts HTTP/1.1\r\nHost: x\r\n".to_string(),
    };
    if s.write_all(head.as_bytes()).await.is_err() {
        return true;
    }
    let mut last = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match tokio::time::timeout(tick, s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(_)) => {} // a refusal: the server closes next
            Err(_) => {}
        }
        if matches!(kind, Stall::Slowloris) && last.elapsed() >= Duration::from_secs(1) {
            last = std::time::Instant::now();
            if s.write_all(b"X-Slow: 1\r\n").await.is_err() {
                break;
            }
        }
    }
    true
}

/// 1,000 stalled connections (no handshake; a head whose body never comes, with a
/// tenant's token and without) and 1,000 slowloris ones, from 40 loopback addresses,
/// against a manager holding at most 64 connections: an operator's requests from another
/// address are answered all along with a p99 of at most 100 ms, the manager never holds
/// more than its 64 connections, and memory stays bounded. Before stalled connections
/// were evicted, 64 of them held every place and the operator's requests timed out.
#[test]
fn stalled_and_slowloris_connections_lock_nobody_out() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    // 2,000 client sockets and the server's: more than the usual 1,024.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit, valid for both.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(
        lim.rlim_cur >= 4096,
        "RLIMIT_NOFILE's hard limit is {}: this test needs 4096 descriptors",
        lim.rlim_max
    );
    const MAX: usize = 64;
    // Alone on the machine: no other test of this file runs meanwhile.
    let alone = Turn::Alone(
        TURNS
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let w = start_in_turn(
        "api-lockout",
        |a| {
            // Long time-outs: the limits, not the time-outs, must keep the places free.
            a.client_timeout_s = 60;
            a.body_timeout_s = 60;
            a.max_connections = MAX;
            a.max_connections_per_peer = 16;
        },
        alone,
    );
    let http = w.daemon.lock().expect("daemon").http.clone();
    let ops = w.client(None, Some(OPS_TOKEN));
    let ask = || {
        let t = std::time::Instant::now();
        let r = ops.ask(&Request::Hosts, 0);
        let took = t.elapsed();
        match r {
            Ok((200, _)) => took,
            other => panic!("the operator's request failed after {took:?}: {other:?}"),
        }
    };
    ask(); // warm up
    let rss_before = vm_rss_kib();

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let connected = Arc::new(AtomicUsize::new(0));
    let attack = {
        let (stop, opened, connected) = (stop.clone(), opened.clone(), connected.clone());
        let (addr, tls) = (w.addr, tokio_rustls::TlsConnector::from(tls_client(&w)));
        std::thread::spawn(move || {
            // The attacker's CPU is not the manager's: on a real network it is another
            // machine's. Here its thread yields the CPU to the manager and the operator.
            // SAFETY: setpriority on this thread's own id changes only its nice value.
            unsafe {
                let tid = libc::gettid();
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let mut tasks = Vec::new();
                for i in 0..2000usize {
                    let kind = match i % 6 {
                        0 => Stall::Handshake,
                        1 => Stall::Body { token: true },
                        2 => Stall::Body { token: false },
                        _ => Stall::Slowloris,
                    };
                    let from = std::net::IpAddr::from([127, 0, 1, (i % 40) as u8 + 1]);
                    let (stop, connected) = (stop.clone(), connected.clone());
                    tasks.push(tokio::spawn({
                        let tls = tls.clone();
                        async move {
                            if stall(addr, from, kind, tls, stop).await {
                                connected.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                    opened.fetch_add(1, Ordering::Relaxed);
                    // 200 a second, in rounds of 10: the attack is stalled connections,
                    // not a flood of TLS handshakes, which costs the manager CPU whatever
                    // it does with the connections (a rate limit in front of it helps).
                    if i % 10 == 9 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                for t in tasks {
                    let _ = t.await;
                }
            });
        })
    };
    // The operator asks all along: while the attack opens its connections and after.
    let mut ms = Vec::new();
    let mut peak = 0;
    let t = std::time::Instant::now();
    while opened.load(Ordering::Relaxed) < 2000 || ms.len() < 200 {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the attack did not open its connections in 120 s"
        );
        ms.push(ask().as_secs_f64() * 1000.0);
        peak = peak.max(http.connections.load(Ordering::Relaxed));
    }
    let full = http.evicted.load(Ordering::Relaxed);
    let held = http.connections.load(Ordering::Relaxed);
    let rss_during = vm_rss_kib();
    stop.store(true, Ordering::Relaxed);
    attack.join().expect("attack thread");
    let rss_after = vm_rss_kib();
    ms.sort_by(f64::total_cmp);
    let p = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    let (p50, p99, max) = (p(0.50), p(0.99), ms[ms.len() - 1]);
    eprintln!(
        "lockout: {} operator requests in {:.1} s: p50 {p50:.1} ms, p99 {p99:.1} ms, max \
         {max:.1} ms; attack: {} connected of 2000; server held at most {peak} (limit {MAX}), \
         {held} at the end, evicted {full}; VmRSS {rss_before} KiB before, {rss_during} during, \
         {rss_after} after",
        ms.len(),
        t.elapsed().as_secs_f64(),
        connected.load(Ordering::Relaxed),
    );
    assert_eq!(
        connected.load(Ordering::Relaxed),
        2000,
        "every attack connected"
    );
    assert!(
        peak <= MAX,
        "the server held {peak} connections, more than {MAX}"
    );
    assert!(
        full >= 1000,
        "only {full} evictions: the attack did not fill the places"
    );
    assert!(p99 <= 100.0, "p99 {p99:.1} ms (p50 {p50:.1}, max {max:.1})");
    // Both ends of 2,000 connections in one process: a few MiB per connection the server
    // held would show; 64 MiB is far above what the bounded table costs.
    assert!(
        rss_during.saturating_sub(rss_before) < 64 * 1024,
        "VmRSS grew from {rss_before} KiB to {rss_during} KiB"
    );
}

// ---- input checks, paging, metrics -------------------------------------------------------

/// One raw request with the operator's token; returns the status and the JSON reply.
fn ops_raw(w: &World, method: &str, path: &str, body: &str) -> (u16, Value) {
    let r = raw(
        w,
        None,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {OPS_TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n\
             {body}",
            body.len()
        ),
    );
    let v = r
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status(&r), v)
}

/// Hosts outside the fabric, leases of no time and unbounded log reads are refused; the
/// log keeps its retention; list routes page.
#[test]
fn hostile_values_are_refused_and_lists_are_paged() {
    let w = start("api-input");
    // manager.hosts = 3: host 3 and 255 are not in the fabric.
    for h in ["3", "255"] {
        let (st, v) = ops_raw(&w, "POST", &format!("/v1/hosts/{h}/heartbeat"), "");
        assert_eq!(st, 409, "heartbeat for host {h}: {v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap_or("")
                .contains("not in this fabric"),
            "{v}"
        );
    }
    let (st, v) = ops_raw(&w, "POST", "/v1/hosts/2/heartbeat", "");
    assert_eq!(st, 200, "{v}");
    // duration_s 0: refused for a request and a composition.
    let zero = r#"{"host":1,"want":{"kind":"gpus","count":1},"priority":1,"duration_s":0}"#;
    let (st, v) = ops_raw(&w, "POST", "/v1/requests", zero);
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"].as_str().unwrap_or("").contains("duration_s"),
        "{v}"
    );
    let (st, v) = ops_raw(
        &w,
        "PUT",
        "/v1/hosts/1/functions",
        r#"{"functions":["0x0120"],"duration_s":0}"#,
    );
    assert_eq!(st, 409, "{v}");
    assert!(w.lease_ids().is_empty(), "a lease of no time was granted");
    // The log is read 1,000 entries at most.
    let (st, v) = ops_raw(&w, "GET", "/v1/log?n=18446744073709551615", "");
    assert_eq!(st, 400, "{v}");
    let (st, v) = ops_raw(&w, "GET", "/v1/log?n=1000", "");
    assert_eq!(st, 200, "{v}");
    // Paging: three leases, two a page.
    for h in 0..3 {
        let (st, v) = ops_raw(
            &w,
            "POST",
            "/v1/requests",
            &format!(
                r#"{{"host":{h},"want":{{"kind":"vfs","count":1,"profile":"quarter"}},"priority":1}}"#
            ),
        );
        assert_eq!(st, 201, "{v}");
    }
    let (st, p1) = ops_raw(&w, "GET", "/v1/leases?limit=2", "");
    assert_eq!(st, 200, "{p1}");
    assert_eq!(p1["leases"].as_array().map(Vec::len), Some(2), "{p1}");
    assert_eq!(
        (p1["total"].clone(), p1["next_offset"].clone()),
        (json!(3), json!(2))
    );
    let (_, p2) = ops_raw(&w, "GET", "/v1/leases?limit=2&offset=2", "");
    assert_eq!(p2["leases"].as_array().map(Vec::len), Some(1), "{p2}");
    assert!(p2.get("next_offset").is_none(), "{p2}");
    let ids: Vec<Value> = p1["leases"]
        .as_array()
        .into_iter()
        .chain(p2["leases"].as_array())
        .flatten()
        .map(|l| l["id"].clone())
        .collect();
    let mut want: Vec<Value> = w.lease_ids().into_iter().map(|i| json!(i)).collect();
    want.sort_by_key(|v| v.as_u64());
    assert_eq!(ids, want);
    let (st, _) = ops_raw(&w, "GET", "/v1/hosts?limit=1001", "");
    assert_eq!(st, 400);
    // Query parameters are percent-decoded: `%6Cimit=%32` is `limit=2`.
    let (st, p) = ops_raw(&w, "GET", "/v1/leases?%6Cimit=%32", "");
    assert_eq!(st, 200, "{p}");
    assert_eq!(p["leases"].as_array().map(Vec::len), Some(2), "{p}");
    // A malformed encoding is a 400 that says so.
    let (st, v) = ops_raw(&w, "GET", "/v1/leases?limit=%zz", "");
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or("")
            .contains("malformed percent-encoding '%zz'"),
        "{v}"
    );
}

fn sample(m: &str, series: &str) -> f64 {
    let prefix = format!("{series} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{m}"))
}

/// A Redfish read counts once in pcifab_requests_total; 401, 403 and 413 replies are
/// counted; series at zero stay; the process metrics are there.
#[test]
fn metrics_count_each_request_once_and_keep_every_series() {
    let w = start("api-metrics-count");
    let before = metrics(&w);
    // Zero-valued series are listed before anything happened.
    for zero in [
        "pcifab_requests_total{op=\"redfish\",outcome=\"ok\"}",
        "pcifab_requests_total{op=\"release\",outcome=\"failed\"}",
        "pcifab_leases{pool=\"gpus\",priority=\"0\"}",
        "pcifab_queued_requests{pool=\"any\",priority=\"9\"}",
        "pcifab_http_responses_total{code=\"403\"}",
        "pcifab_http_responses_total{code=\"413\"}",
    ] {
        assert_eq!(sample(&before, zero), 0.0, "{zero}");
    }
    for p in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
        "process_cpu_seconds_total",
    ] {
        assert!(sample(&before, p) > 0.0, "{p}");
    }
    let r = raw(
        &w,
        None,
        &format!(
            "GET /redfish/v1/Fabrics/PCIe HTTP/1.1\r\nHost: x\r\nX-Auth-Token: {OPS_TOKEN}\r\n\
             Connection: close\r\n\r\n"
        ),
    );
    assert_eq!(status(&r), 200, "{r}");
    // 401, 403, 413 once each.
    let (st, _) = w.ask(None, &Request::Queue);
    assert_eq!(st, 401);
    let (st, _) = w.ask(Some("grafana"), &Request::HostDown { host: 1 });
    assert_eq!(st, 403);
    let (st, _) = ops_raw(&w, "POST", "/v1/requests", &"x".repeat(5000));
    assert_eq!(st, 413);
    let after = metrics(&w);
    let ok = |op: &str| format!("pcifab_requests_total{{op=\"{op}\",outcome=\"ok\"}}");
    assert_eq!(sample(&after, &ok("redfish")), 1.0);
    for op in ["hosts", "pool", "leases"] {
        assert_eq!(sample(&after, &ok(op)), sample(&before, &ok(op)), "{op}");
    }
    for code in ["401", "403", "413"] {
        let s = format!("pcifab_http_responses_total{{code=\"{code}\"}}");
        assert_eq!(sample(&after, &s) - sample(&before, &s), 1.0, "{s}");
    }
    // The grant's series goes back to zero when its lease ends, and stays.
    let (st, v) = w.ask(
        Some("h1-job"),
        &Request::Request {
            spec: gpus(1, 1, 5, 600),
        },
    );
    assert_eq!(st, 201, "{v}");
    let series = "pcifab_leases{pool=\"gpus\",priority=\"5\"}";
    assert_eq!(sample(&metrics(&w), series), 1.0);
    let (st, v) = w.ask(
        Some("h1-job"),
        &Request::Release {
            id: v["id"].as_u64().expect("id"),
        },
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(sample(&metrics(&w), series), 0.0);
}
