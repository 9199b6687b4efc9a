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
        max_connections: 64,
    });
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
    World { dir, addr, daemon }
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
