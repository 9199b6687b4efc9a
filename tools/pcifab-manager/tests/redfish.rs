// SPDX-License-Identifier: GPL-2.0-only

//! The Redfish service served for real: a daemon on the simulated fabric, its HTTPS server on
//! a loopback port with a certificate made for the test, Redfish users with hashed
//! passwords, and raw HTTP/1.1 requests, so every status and header is seen as a client sees
//! it (Documentation/manager-api.rst, "Redfish").

mod common;

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use common::{config, sim_for, tempdir};
use pcifab_manager::{
    api,
    auth::Principals,
    config::{ApiConfig, Config, RedfishConfig},
    daemon::Daemon,
    redfish::users::{hash_password, MIN_ITERATIONS},
    store::Store,
};
use rcgen::{CertificateParams, KeyPair, SanType};
use serde_json::{json, Value};

const OPS_PASSWORD: &str = "ops password";
const WATCHER_PASSWORD: &str = "watcher password";
const H0_PASSWORD: &str = "h0 password";
const FABRIC: &str = "/redfish/v1/Fabrics/PCIe";

struct World {
    dir: PathBuf,
    addr: SocketAddr,
    daemon: Arc<Mutex<Daemon>>,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A manager with three users: ops (admin), watcher (reader), h0-job (tenant of host 0).
fn start(name: &str) -> World {
    let dir = tempdir(name);
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(vec!["pcifab-manager".to_string()]).expect("params");
    p.subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = p.self_signed(&key).expect("server cert");
    std::fs::write(dir.join("server.crt"), cert.pem()).expect("cert");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("key");
    let mut users = String::new();
    for (u, pw) in [
        ("ops", OPS_PASSWORD),
        ("watcher", WATCHER_PASSWORD),
        ("h0-job", H0_PASSWORD),
    ] {
        let h = hash_password(pw, MIN_ITERATIONS).expect("hash");
        users.push_str(&format!(
            "[[users]]\nname = \"{u}\"\npassword_pbkdf2 = \"{h}\"\n\n"
        ));
    }
    assert!(
        !users.contains("password\""),
        "the credentials file holds no password in clear"
    );
    std::fs::write(dir.join("users.toml"), &users).expect("users");
    let mut c: Config = config("hybrid");
    let extra: Config = Config::parse(
        r#"
[manager]
hosts = 3

[[principals]]
name = "ops"
role = "admin"

[[principals]]
name = "watcher"
role = "reader"

[[principals]]
name = "h0-job"
role = "tenant"
hosts = [0]
"#,
    )
    .expect("principals");
    c.principals = extra.principals;
    c.api = Some(ApiConfig {
        listen: "127.0.0.1:0".into(),
        cert: dir.join("server.crt").display().to_string(),
        key: dir.join("server.key").display().to_string(),
        client_ca: None,
        max_body: 4096,
        client_timeout_s: 5,
        body_timeout_s: 5,
        max_connections: 64,
        max_connections_per_peer: 64,
        redfish: RedfishConfig {
            users: Some(dir.join("users.toml").display().to_string()),
            session_timeout_s: 600,
        },
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

/// A reply as the client sees it.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
    /// The `Base` registry message key of an error reply.
    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

impl World {
    /// Sends `method path` with `headers` (`Name: value` lines) and `body`.
    fn send(&self, method: &str, path: &str, headers: &[String], body: &str) -> Reply {
        use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.dir.join("server.crt")).expect("cert") {
            roots.add(c.expect("cert")).expect("root");
        }
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let conn = rustls::ClientConnection::new(
            Arc::new(cfg),
            ServerName::try_from("127.0.0.1").expect("name"),
        )
        .expect("connection");
        let tcp = std::net::TcpStream::connect(self.addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut s = rustls::StreamOwned::new(conn, tcp);
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        for h in headers {
            req.push_str(&format!("{h}\r\n"));
        }
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        req.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        s.write_all(req.as_bytes()).expect("send");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Reply {
            status,
            headers,
            body: body.to_string(),
        }
    }

    fn get(&self, path: &str, auth: &[String]) -> Reply {
        self.send("GET", path, auth, "")
    }

    /// Which host holds function `f` (the scheduler's own view, not through the API).
    fn holder(&self, f: u16) -> Option<u8> {
        self.daemon
            .lock()
            .expect("daemon")
            .sched
            .holders
            .get(&f)
            .copied()
    }
}

fn basic(user: &str, password: &str) -> Vec<String> {
    vec![format!(
        "Authorization: Basic {}",
        B64.encode(format!("{user}:{password}"))
    )]
}

fn token(t: &str) -> Vec<String> {
    vec![format!("X-Auth-Token: {t}")]
}

fn login(w: &World, user: &str, password: &str) -> Reply {
    w.send(
        "POST",
        "/redfish/v1/SessionService/Sessions",
        &[],
        &json!({"UserName": user, "Password": password}).to_string(),
    )
}

fn zone_body(eps: &[&str]) -> String {
    let l: Vec<Value> = eps
        .iter()
        .map(|e| json!({"@odata.id": format!("{FABRIC}/Endpoints/{e}")}))
        .collect();
    json!({"Links": {"Endpoints": l}}).to_string()
}

#[test]
fn standard_clients_log_in_with_a_session_or_basic_auth() {
    let w = start("redfish-login");
    // The service root links the sessions; the session service says its timeout.
    let root = w.get("/redfish/v1/", &[]).json();
    assert_eq!(
        root["Links"]["Sessions"]["@odata.id"],
        "/redfish/v1/SessionService/Sessions"
    );
    // Log in: 201, the token and the session's URI.
    let r = login(&w, "ops", OPS_PASSWORD);
    assert_eq!(r.status, 201, "{r:?}");
    let t = r.header("x-auth-token").expect("X-Auth-Token").to_string();
    let loc = r.header("location").expect("Location").to_string();
    let s = r.json();
    assert_eq!(s["@odata.id"], loc.as_str());
    assert_eq!(s["UserName"], "ops");
    assert_eq!(s["Password"], Value::Null);
    // The token opens the tree, the session service and the session itself.
    assert_eq!(w.get(FABRIC, &token(&t)).status, 200);
    let ss = w.get("/redfish/v1/SessionService", &token(&t));
    assert_eq!(ss.json()["SessionTimeout"], 600, "{ss:?}");
    let members = w
        .get("/redfish/v1/SessionService/Sessions", &token(&t))
        .json();
    assert_eq!(members["Members"], json!([{"@odata.id": loc}]));
    assert_eq!(w.get(&loc, &token(&t)).json()["UserName"], "ops");
    // Another user sees neither the admin's session nor may end it.
    let rt = login(&w, "watcher", WATCHER_PASSWORD);
    assert_eq!(rt.status, 201, "{rt:?}");
    let wt = rt.header("x-auth-token").expect("token").to_string();
    let wl = rt.header("location").expect("location").to_string();
    let theirs = w
        .get("/redfish/v1/SessionService/Sessions", &token(&wt))
        .json();
    assert_eq!(theirs["Members"], json!([{"@odata.id": wl}]));
    let r = w.send("DELETE", &loc, &token(&wt), "");
    assert_eq!(
        (r.status, r.code()),
        (403, "Base.1.16.InsufficientPrivilege".into())
    );
    // Log out: 204, and the token is no longer a session (401 NoValidSession).
    assert_eq!(w.send("DELETE", &loc, &token(&t), "").status, 204);
    let r = w.get(FABRIC, &token(&t));
    assert_eq!(
        (r.status, r.code()),
        (401, "Base.1.16.NoValidSession".into())
    );
    assert!(r
        .header("www-authenticate")
        .is_some_and(|h| h.starts_with("Basic")));
    // A wrong password or an unknown user: 401, no session.
    for (u, p) in [("ops", "wrong"), ("nobody", OPS_PASSWORD), ("ops", "")] {
        let r = login(&w, u, p);
        assert_eq!(r.status, 401, "{u}/{p}: {r:?}");
        assert!(r.header("x-auth-token").is_none());
    }
    assert_eq!(
        w.send(
            "POST",
            "/redfish/v1/SessionService/Sessions",
            &[],
            "{\"UserName\": \"ops\"}"
        )
        .status,
        400
    );
    // HTTP Basic on any resource.
    assert_eq!(
        w.get(FABRIC, &basic("watcher", WATCHER_PASSWORD)).status,
        200
    );
    let r = w.get(FABRIC, &basic("watcher", "wrong"));
    assert_eq!(r.status, 401, "{r:?}");
    assert!(r.header("www-authenticate").is_some());
    // The accounts map users to Redfish's predefined roles.
    let a = w.get(
        "/redfish/v1/AccountService/Accounts/h0-job",
        &basic("ops", OPS_PASSWORD),
    );
    assert_eq!(a.json()["RoleId"], "Operator", "{a:?}");
}

#[test]
fn roles_hold_for_redfish_users_and_refusals_are_401_or_403() {
    let w = start("redfish-roles");
    let zone1 = format!("{FABRIC}/Zones/1");
    // No credentials: 401 NoValidSession, not a privilege error.
    let r = w.get(FABRIC, &[]);
    assert_eq!(
        (r.status, r.code()),
        (401, "Base.1.16.NoValidSession".into())
    );
    let r = w.get(FABRIC, &token("no-such-token"));
    assert_eq!(
        (r.status, r.code()),
        (401, "Base.1.16.NoValidSession".into())
    );
    // A known reader composing: 403 InsufficientPrivilege, and nothing changes.
    let r = w.send(
        "PATCH",
        &zone1,
        &basic("watcher", WATCHER_PASSWORD),
        &zone_body(&["host1", "0x0120"]),
    );
    assert_eq!(
        (r.status, r.code()),
        (403, "Base.1.16.InsufficientPrivilege".into()),
        "{r:?}"
    );
    // The tenant of host 0 may compose zone 0, through its session, not zone 1.
    let t = login(&w, "h0-job", H0_PASSWORD)
        .header("x-auth-token")
        .expect("token")
        .to_string();
    let r = w.send("PATCH", &zone1, &token(&t), &zone_body(&["0x0120"]));
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(w.holder(0x0120), None);
    let r = w.send(
        "PATCH",
        &format!("{FABRIC}/Zones/0"),
        &token(&t),
        &zone_body(&["host0", "0x0120"]),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(w.holder(0x0120), Some(0));
}

#[test]
fn the_protocol_parts_redfish_clients_rely_on_are_served() {
    let w = start("redfish-protocol");
    let ops = basic("ops", OPS_PASSWORD);
    let r = w.get("/redfish/v1/", &[]);
    assert_eq!(r.header("odata-version"), Some("4.0"), "{r:?}");
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    assert!(r.header("etag").is_some_and(|t| t.starts_with('"')));
    assert!(r.header("cache-control").is_some());
    assert!(r
        .header("link")
        .is_some_and(|l| l.contains("ServiceRoot.v1_15_0.json") && l.contains("describedby")));
    // HEAD: the same headers, no body.
    let h = w.send("HEAD", "/redfish/v1/", &[], "");
    assert_eq!((h.status, h.body.as_str()), (200, ""));
    assert_eq!(h.header("etag"), r.header("etag"));
    // The OData documents, without credentials.
    let m = w.get("/redfish/v1/$metadata", &[]);
    assert_eq!(m.status, 200);
    assert!(m
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/xml")));
    assert!(m.body.contains("<EntityContainer") && m.body.contains("Zone.v1_6_0"));
    let o = w.get("/redfish/v1/odata", &[]).json();
    assert_eq!(o["@odata.context"], "/redfish/v1/$metadata");
    assert!(o["value"]
        .as_array()
        .is_some_and(|v| v.iter().any(|s| s["url"] == "/redfish/v1/")));
    // A method a resource does not take: 405 with Allow.
    for (m, p) in [
        ("DELETE", "/redfish/v1/".to_string()),
        ("POST", format!("{FABRIC}/Zones/1")),
        ("PUT", format!("{FABRIC}/Endpoints")),
    ] {
        let r = w.send(m, &p, &ops, "{}");
        assert_eq!(r.status, 405, "{m} {p}: {r:?}");
        assert!(r.header("allow").is_some(), "{m} {p}: {r:?}");
    }
    assert_eq!(
        w.get(&format!("{FABRIC}/Zones/1"), &ops).header("allow"),
        Some("GET, HEAD, PATCH")
    );
    // Unsupported OData-Version: 412; an unsupported $ query: 501; a GET's body ignored.
    let r = w.get("/redfish/v1/", &["OData-Version: 4.1".into()]);
    assert_eq!(r.status, 412);
    assert_eq!(w.get("/redfish/v1/?$expand=*", &[]).status, 501);
    // Percent-encoded, `$expand` is still `$expand`.
    assert_eq!(w.get("/redfish/v1/?%24expand=*", &[]).status, 501);
    assert_eq!(w.send("GET", FABRIC, &ops, "{}").status, 200);
    // A resource's ETag and If-None-Match.
    let e = w.get(FABRIC, &ops);
    let tag = e.header("etag").expect("etag").to_string();
    let r = w.get(FABRIC, &[ops[0].clone(), format!("If-None-Match: {tag}")]);
    assert_eq!(r.status, 304);
    // Oem objects say their type.
    let ep = w.get(&format!("{FABRIC}/Endpoints/0x0120"), &ops).json();
    assert_eq!(
        ep["Oem"]["Pcifab"]["@odata.type"],
        "#PcifabEndpoint.v1_0_0.PcifabEndpoint"
    );
    let r = w.send(
        "PATCH",
        &format!("{FABRIC}/Zones/1"),
        &ops,
        &zone_body(&["host1", "0x0120"]),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let c = w.get(&format!("{FABRIC}/Connections"), &ops).json();
    let first = c["Members"][0]["@odata.id"]
        .as_str()
        .expect("a connection")
        .to_string();
    let c = w.get(&first, &ops).json();
    assert_eq!(
        c["Oem"]["Pcifab"]["@odata.type"],
        "#PcifabConnection.v1_0_0.PcifabConnection"
    );
}

#[test]
fn a_zone_patch_with_a_stale_if_match_is_412_and_changes_nothing() {
    let w = start("redfish-etag");
    let ops = basic("ops", OPS_PASSWORD);
    let zone1 = format!("{FABRIC}/Zones/1");
    let tag = w
        .get(&zone1, &ops)
        .header("etag")
        .expect("etag")
        .to_string();
    let with = |t: &str| vec![ops[0].clone(), format!("If-Match: {t}")];
    let r = w.send(
        "PATCH",
        &zone1,
        &with("\"0000000000000000\""),
        &zone_body(&["host1", "0x0120"]),
    );
    assert_eq!(
        (r.status, r.code()),
        (412, "Base.1.16.PreconditionFailed".into()),
        "{r:?}"
    );
    assert_eq!(
        w.holder(0x0120),
        None,
        "a PATCH refused for its If-Match changed the fabric"
    );
    // The zone's own tag: applied, and the reply's tag is the new one.
    let r = w.send(
        "PATCH",
        &zone1,
        &with(&tag),
        &zone_body(&["host1", "0x0120"]),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(w.holder(0x0120), Some(1));
    let new = r.header("etag").expect("etag").to_string();
    assert_ne!(new, tag);
    // The old tag is stale now.
    let r = w.send("PATCH", &zone1, &with(&tag), &zone_body(&["host1"]));
    assert_eq!(r.status, 412, "{r:?}");
    assert_eq!(w.holder(0x0120), Some(1));
    // Authentication comes before the precondition.
    let r = w.send(
        "PATCH",
        &zone1,
        &["If-Match: \"x\"".to_string()],
        &zone_body(&["host1"]),
    );
    assert_eq!(r.status, 401);
}

#[test]
fn missing_zones_and_endpoints_are_404_and_bad_references_400() {
    let w = start("redfish-missing");
    let ops = basic("ops", OPS_PASSWORD);
    // Zone ids are canonical: 00 and 01 name no zone.
    for z in ["00", "01", "9", "256", "+1"] {
        let p = format!("{FABRIC}/Zones/{z}");
        let r = w.get(&p, &ops);
        assert_eq!(
            (r.status, r.code()),
            (404, "Base.1.16.ResourceNotFound".into()),
            "{p}"
        );
        let r = w.send("PATCH", &p, &ops, &zone_body(&["0x0120"]));
        assert_eq!(
            (r.status, r.code()),
            (404, "Base.1.16.ResourceNotFound".into()),
            "PATCH {p}: {r:?}"
        );
    }
    for e in ["host01", "host9", "0x0500", "0x120"] {
        let p = format!("{FABRIC}/Endpoints/{e}");
        assert_eq!(w.get(&p, &ops).status, 404, "{p}");
    }
    // A body naming an endpoint the fabric does not have: 400, nothing changes.
    let zone1 = format!("{FABRIC}/Zones/1");
    for e in ["0x0500", "0x120", "host01", "host9", "host0"] {
        let r = w.send("PATCH", &zone1, &ops, &zone_body(&["0x0120", e]));
        assert_eq!(r.status, 400, "{e}: {r:?}");
        assert_eq!(w.holder(0x0120), None, "{e}");
    }
    // An unknown property is named in the 400.
    let r = w.send("PATCH", &zone1, &ops, "{\"BogusProp\": 1}");
    assert_eq!(r.status, 400);
    assert!(r.body.contains("BogusProp"), "{r:?}");
}
