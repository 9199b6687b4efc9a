// SPDX-License-Identifier: GPL-2.0-only

//! The manager's state in etcd, and the election of one leader among several managers
//! (Documentation/manager.rst, "High availability").
//!
//! etcd is reached through its v3 JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`,
//! `/v3/lease/...`) with the HTTP client the manager already has, so the build needs no
//! gRPC stack and no `protoc`. Keys, under the configured prefix `P`:
//!
//! - `P/leader`: the leader's name and address, bound to its etcd lease. The revision at
//!   which a manager created it is that manager's epoch.
//! - `P/format`: the records' format version.
//! - `P/r/TABLE/KEY`: one record of the scheduler (`scheduler::persist`).
//! - `P/log/SEQ`: the request log, SEQ as 20 digits so keys sort as numbers.
//! - `P/keys/HEX`: a request's idempotency key (`KEY@PRINCIPAL`, in hex) -> the SEQ of the
//!   log entry that has it; written in the entry's transaction, deleted in the one that
//!   trims the entry.
//!
//! Every commit of a leader is one etcd transaction guarded by a compare of the leader
//! key's create revision with the epoch: a manager that is no longer the leader cannot
//! write, whatever it believes.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use base64::Engine;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

use crate::{
    config::HaConfig,
    store::{Batch, LogEntry, Retention, StateStore, Stored, Table},
};

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn unb64(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// etcd's 64-bit numbers come as JSON strings; absent means 0.
fn num(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// A revision or lease id etcd must give: a positive number. A reply without one, or with
/// 0, a negative number or text, is not etcd's (or is corrupt): an error, never an epoch.
fn positive(v: &Value, what: &str) -> Result<i64, String> {
    let n = match v {
        Value::String(s) => s.parse::<i64>().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    };
    match n {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "etcd's reply gives no valid {what} ({v}; a positive number was expected): is \
             every endpoint an etcd v3 gateway?"
        )),
    }
}

/// The end of the range of keys that start with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// One key-value of a range reply.
#[derive(Clone, Debug, Default)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub lease: i64,
}

fn kvs_of(v: &Value) -> Vec<Kv> {
    v.get("kvs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|kv| Kv {
                    key: unb64(&kv["key"]),
                    value: unb64(&kv["value"]),
                    create_revision: num(&kv["create_revision"]),
                    lease: num(&kv["lease"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A client of one etcd cluster: its members' client URLs, tried in turn.
pub struct Etcd {
    endpoints: Vec<String>,
    agent: ureq::Agent,
    /// The member that answered last, tried first.
    preferred: AtomicUsize,
    timeout: Duration,
    /// Until when calls fail at once, and with what.
    down: std::sync::Mutex<Option<(Instant, String)>>,
    /// TLS with a client certificate (`[ha] cert`).
    client_cert: bool,
    /// The etcd user: its name, password and the file it came from.
    user: Option<(String, String, PathBuf)>,
    /// The user's token: none yet (to be asked for), or etcd's answer (none: etcd's
    /// authentication is not enabled).
    token: std::sync::Mutex<Option<Option<String>>>,
}

const NO_MEMBER: &str = "no etcd member could answer";

/// gRPC codes the gateway passes on that another member may not have: Unavailable,
/// DeadlineExceeded (no leader, no quorum, a member shutting down).
const RETRY_ELSEWHERE: [i64; 2] = [14, 4];

/// TLS to etcd (`[ha]` ca, cert and key): the CA file etcd's certificates must chain to
/// and, for etcd's `--client-cert-auth`, this manager's certificate chain and key (PEM
/// files).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub client: Option<(PathBuf, PathBuf)>,
}

/// An etcd user (`[ha] user` and `password_file`, for etcd's authentication).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdUser {
    pub name: String,
    pub password_file: PathBuf,
}

/// Where an error of [`Etcd::call`] says etcd refused this manager's user, or requires one
/// and none is configured: a configuration to fix, not an outage.
pub const AUTH_FAILED: &str = "etcd authentication failed";

/// etcd's words for a call without a valid token (it expired, the member lost it, or it
/// was never given).
const INVALID_TOKEN: &str = "invalid auth token";
const USER_EMPTY: &str = "user name is empty";

/// Where an error of [`Etcd::call`] says TLS with etcd failed on every member in a way
/// that trying again cannot mend (a certificate refused, on either side): a configuration
/// to fix, not an outage.
pub const TLS_FAILED: &str = "TLS with etcd failed";

fn read_pem(key: &str, p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("[ha] {key}: cannot read {}: {e}", p.display()))
}

/// The certificates of a PEM file, each checked to be X.509 rustls can use; none is an
/// error.
fn certs_of(key: &str, p: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let pem = read_pem(key, p)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("[ha] {key}: {} is not valid PEM: {e:?}", p.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "[ha] {key}: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            p.display()
        ));
    }
    for (i, c) in certs.iter().enumerate() {
        x509_parser::parse_x509_certificate(c).map_err(|e| {
            format!(
                "[ha] {key}: certificate {} of {} is not a valid X.509 certificate: {e}",
                i + 1,
                p.display()
            )
        })?;
    }
    Ok(certs)
}

impl EtcdTls {
    /// `[ha]`'s TLS: with `ca` (`https://` endpoints), the CA and the client certificate,
    /// if any.
    pub fn of(h: &HaConfig) -> Option<Self> {
        Some(Self {
            ca: h.ca.as_ref()?.into(),
            client: h
                .cert
                .as_ref()
                .zip(h.key.as_ref())
                .map(|(c, k)| (c.into(), k.into())),
        })
    }

    /// The rustls configuration of ureq: the CA, the client certificate and key, each
    /// read and checked (the key must be the certificate's). Errors name the `[ha]` key and
    /// the file.
    fn config(&self) -> Result<ureq::tls::TlsConfig, String> {
        use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsProvider};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots: Vec<Certificate<'static>> = certs_of("ca", &self.ca)?
            .iter()
            .map(|c| Certificate::from_der(c).to_owned())
            .collect();
        let mut tls = ureq::tls::TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(provider.clone())
            .root_certs(RootCerts::Specific(Arc::new(roots)));
        if let Some((cert, key)) = &self.client {
            use rustls::pki_types::pem::PemObject;
            let chain = certs_of("cert", cert)?;
            let pem = read_pem("key", key)?;
            let no_key = |e: String| {
                format!(
                    "[ha] key: {} holds no PEM private key (PKCS#8, SEC1 or PKCS#1): {e}",
                    key.display()
                )
            };
            let der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| no_key(format!("{e:?}")))?;
            let pk = PrivateKey::from_pem(&pem).map_err(|e| no_key(e.to_string()))?;
            rustls::sign::CertifiedKey::from_der(chain.clone(), der, &provider).map_err(|e| {
                format!(
                    "[ha] key: {} does not go with the certificate {} ([ha] cert): {e}",
                    key.display(),
                    cert.display()
                )
            })?;
            let chain: Vec<Certificate<'static>> = chain
                .iter()
                .map(|c| Certificate::from_der(c).to_owned())
                .collect();
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, pk)));
        }
        Ok(tls.build())
    }
}

/// What a failed connection says of TLS, when it is a certificate refused (by etcd or by
/// this manager): trying again, or another member, does not mend it. `has_cert`: this
/// manager presented a client certificate.
fn tls_refusal(e: &ureq::Error, has_cert: bool) -> Option<String> {
    use rustls::{AlertDescription as A, Error as R};
    let r: &R = match e {
        ureq::Error::Rustls(r) => r,
        ureq::Error::Io(io) => io.get_ref()?.downcast_ref::<R>()?,
        _ => return None,
    };
    Some(match r {
        // Go's TLS before 1.22 says a missing certificate with bad_certificate.
        R::AlertReceived(a @ (A::CertificateRequired | A::BadCertificate)) if !has_cert => {
            format!(
                "etcd requires a client certificate (TLS alert {a:?}), and this manager has \
                 none: set [ha] cert and key to a certificate signed by a CA of etcd's \
                 --trusted-ca-file, and its key"
            )
        }
        R::AlertReceived(
            a @ (A::CertificateRequired
            | A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::CertificateExpired
            | A::CertificateRevoked
            | A::UnsupportedCertificate
            | A::AccessDenied),
        ) => format!(
            "etcd refused this manager's client certificate ([ha] cert; TLS alert {a:?}): it \
             must be signed by a CA of etcd's --trusted-ca-file, and be valid now"
        ),
        R::InvalidCertificate(c) => format!(
            "etcd's certificate is not one this manager trusts ({c:?}): [ha] ca must hold \
             the CA that signed it, and the certificate name the endpoint's host"
        ),
        _ => return None,
    })
}

impl EtcdUser {
    /// `[ha]`'s etcd user, if any.
    pub fn of(h: &HaConfig) -> Option<Self> {
        Some(Self {
            name: h.user.clone()?,
            password_file: h.password_file.as_ref()?.into(),
        })
    }
}

impl Etcd {
    /// The client of `[ha]`: its endpoints and timeout, its TLS and its user, the files
    /// read and checked now.
    pub fn for_ha(h: &HaConfig) -> Result<Self, String> {
        Self::with_tls(
            &h.endpoints,
            Duration::from_millis(h.timeout_ms),
            EtcdTls::of(h).as_ref(),
        )?
        .with_user(EtcdUser::of(h).as_ref())
    }

    /// A client of etcd over plain HTTP.
    pub fn new(endpoints: &[String], timeout: Duration) -> Self {
        Self::with_agent(
            endpoints,
            timeout,
            Self::agent_config(timeout).build(),
            false,
        )
    }

    /// A client of etcd; `tls` for `https://` endpoints. An error names the `[ha]` key and
    /// the file that is missing, unreadable or not what it should be.
    pub fn with_tls(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<&EtcdTls>,
    ) -> Result<Self, String> {
        let mut config = Self::agent_config(timeout);
        if let Some(t) = tls {
            config = config.tls_config(t.config()?);
        }
        let client_cert = tls.is_some_and(|t| t.client.is_some());
        Ok(Self::with_agent(
            endpoints,
            timeout,
            config.build(),
            client_cert,
        ))
    }

    fn agent_config(timeout: Duration) -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope> {
        ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
    }

    fn with_agent(
        endpoints: &[String],
        timeout: Duration,
        config: ureq::config::Config,
        client_cert: bool,
    ) -> Self {
        Self {
            endpoints: endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_string())
                .collect(),
            agent: config.into(),
            preferred: AtomicUsize::new(0),
            timeout,
            down: std::sync::Mutex::new(None),
            client_cert,
            user: None,
            token: std::sync::Mutex::new(None),
        }
    }

    /// Authenticates as `user` (etcd's `auth enable`): its password is the first line of
    /// its file, read now; an error names the `[ha]` key and the file.
    pub fn with_user(mut self, user: Option<&EtcdUser>) -> Result<Self, String> {
        let Some(u) = user else { return Ok(self) };
        let f = &u.password_file;
        let text = std::fs::read_to_string(f)
            .map_err(|e| format!("[ha] password_file: cannot read {}: {e}", f.display()))?;
        let password = text.lines().next().unwrap_or("");
        if password.is_empty() {
            return Err(format!(
                "[ha] password_file: {} is empty (its first line is the password of [ha] user \
                 '{}')",
                f.display(),
                u.name
            ));
        }
        self.user = Some((u.name.clone(), password.to_string(), f.clone()));
        Ok(self)
    }

    /// Asks etcd for a token of the user; none when etcd's authentication is not enabled.
    fn authenticate(
        &self,
        name: &str,
        password: &str,
        file: &Path,
    ) -> Result<Option<String>, String> {
        let body = json!({"name": name, "password": password});
        let token = match self.call_members_once("/v3/auth/authenticate", &body, None) {
            Ok(v) => match v["token"].as_str() {
                Some(t) if !t.is_empty() => Some(t.to_string()),
                _ => return Err(format!("etcd's reply to authenticate has no token: {v}")),
            },
            Err(e) if e.contains("authentication is not enabled") => None,
            Err(e) if e.contains("authentication failed") => {
                return Err(format!(
                    "{AUTH_FAILED}: etcd refused [ha] user '{name}' with the password of [ha] \
                     password_file {} ({e})",
                    file.display()
                ))
            }
            Err(e) => return Err(e),
        };
        if let Ok(mut g) = self.token.lock() {
            *g = Some(token.clone());
        }
        Ok(token)
    }

    /// One call of the gateway; a member that cannot answer (down, cut off, without a
    /// quorum) is passed over for the next. The error names every member's failure.
    pub fn call(&self, path: &str, body: &Value) -> Result<Value, String> {
        // After a call no member answered, the next ones fail at once for a while, so a
        // manager without etcd still answers reads promptly.
        if let Ok(g) = self.down.lock() {
            if let Some((until, e)) = &*g {
                if Instant::now() < *until {
                    return Err(e.clone());
                }
            }
        }
        let r = self.call_members(path, body);
        self.note(&r);
        r
    }

    /// Remembers whether etcd answered: after no member did, [`Etcd::call`] fails at once
    /// for twice the timeout.
    fn note(&self, r: &Result<Value, String>) {
        if let Ok(mut g) = self.down.lock() {
            *g = match r {
                Err(e) if e.starts_with(NO_MEMBER) => {
                    Some((Instant::now() + self.timeout * 2, e.clone()))
                }
                _ => None,
            };
        }
    }

    /// [`Etcd::call_members_once`] as the user, if any: with its token, asked for first
    /// and again when etcd says it is not valid (expired, or authentication enabled since).
    fn call_members(&self, path: &str, body: &Value) -> Result<Value, String> {
        let Some((name, password, file)) = &self.user else {
            return match self.call_members_once(path, body, None) {
                Err(e) if e.contains(USER_EMPTY) => Err(format!(
                    "{AUTH_FAILED}: etcd requires a user (its authentication is enabled), and \
                     this manager has none: set [ha] user and password_file ({e})"
                )),
                r => r,
            };
        };
        let known = self.token.lock().ok().and_then(|g| g.clone());
        let token = match known {
            Some(t) => t,
            None => self.authenticate(name, password, file)?,
        };
        match self.call_members_once(path, body, token.as_deref()) {
            Err(e) if e.contains(INVALID_TOKEN) || e.contains(USER_EMPTY) => {
                let token = self.authenticate(name, password, file)?;
                self.call_members_once(path, body, token.as_deref())
            }
            r => r,
        }
    }

    /// One call, tried on every member (see [`Etcd::call`]); `token`, an etcd user's.
    fn call_members_once(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
    ) -> Result<Value, String> {
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut errors = Vec::new();
        // The members of this round that refused TLS, and why (the first's reason); those
        // that dropped the connection (a member that refuses a certificate may close it
        // before this manager reads its alert).
        let mut refused = (0, String::new());
        let mut dropped = 0;
        // Every member once, then again until twice the timeout has passed: a cluster
        // electing a new leader (a member lost) answers again within its election timeout.
        // A round of members that all refused TLS (or dropped the connection, one at least
        // refusing) is a configuration to fix: said at once.
        let start = Instant::now();
        for i in 0.. {
            if i >= n && i % n == 0 && refused.0 > 0 && refused.0 + dropped == n {
                return Err(format!(
                    "{TLS_FAILED}: {} ({})",
                    refused.1,
                    errors.join("; ")
                ));
            }
            if i >= n && start.elapsed() >= self.timeout * 2 {
                break;
            }
            if i >= n && i % n == 0 {
                std::thread::sleep(Duration::from_millis(100));
                errors.clear();
                refused = (0, String::new());
                dropped = 0;
            }
            let at = (first + i) % n;
            let url = format!("{}{path}", self.endpoints[at]);
            let mut req = self
                .agent
                .post(&url)
                .header("Content-Type", "application/json");
            if let Some(t) = token {
                req = req.header("Authorization", t);
            }
            let r = req.send(body.to_string());
            let mut resp = match r {
                Ok(r) => r,
                Err(e) => {
                    if let Some(why) = tls_refusal(&e, self.client_cert) {
                        refused.0 += 1;
                        if refused.1.is_empty() {
                            refused.1 = why;
                        }
                    } else if matches!(&e, ureq::Error::Io(io) if matches!(io.kind(),
                        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset))
                    {
                        dropped += 1;
                    }
                    errors.push(format!("{}: {e}", self.endpoints[at]));
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let text = match resp.body_mut().read_to_string() {
                Ok(t) => t,
                Err(e) => {
                    errors.push(format!("{}: {e}", self.endpoints[at]));
                    continue;
                }
            };
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if status == 200 {
                self.preferred.store(at, Ordering::Relaxed);
                return Ok(v);
            }
            let msg = v
                .get("message")
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .unwrap_or(&text)
                .to_string();
            if RETRY_ELSEWHERE.contains(&num(&v["code"])) || status >= 502 {
                errors.push(format!("{}: {msg}", self.endpoints[at]));
                continue;
            }
            return Err(format!("etcd {}: {path}: {msg}", self.endpoints[at]));
        }
        Err(format!(
            "{NO_MEMBER} ({}); check that a majority of the cluster runs and \
             is reachable",
            errors.join("; ")
        ))
    }

    /// The keys from `key` (exactly, or up to `end`), with extra range options.
    pub fn range(&self, key: &[u8], end: Option<&[u8]>, extra: Value) -> Result<Value, String> {
        let mut body = json!({"key": b64(key)});
        if let Some(e) = end {
            body["range_end"] = json!(b64(e));
        }
        if let (Some(b), Some(x)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(x.clone());
        }
        self.call("/v3/kv/range", &body)
    }

    /// A transaction: whether the compares held, and the reply.
    pub fn txn(
        &self,
        compare: Vec<Value>,
        success: Vec<Value>,
        failure: Vec<Value>,
    ) -> Result<(bool, Value), String> {
        let v = self.call(
            "/v3/kv/txn",
            &json!({"compare": compare, "success": success, "failure": failure}),
        )?;
        Ok((v["succeeded"].as_bool() == Some(true), v))
    }

    pub fn lease_grant(&self, ttl_s: u64) -> Result<i64, String> {
        let v = self.call("/v3/lease/grant", &json!({"TTL": ttl_s.to_string()}))?;
        match num(&v["ID"]) {
            0 => Err(format!("etcd granted no lease: {v}")),
            id => Ok(id),
        }
    }

    /// Renews a lease; its remaining TTL, 0 when it is gone. Always asks etcd, even right
    /// after a call no member answered: a leader's lease must not be lost to that shortcut
    /// while etcd is back (its outcome is remembered for the other calls all the same).
    pub fn lease_keepalive(&self, id: i64) -> Result<i64, String> {
        let r = self.call_members("/v3/lease/keepalive", &json!({"ID": id.to_string()}));
        self.note(&r);
        Ok(num(&r?["result"]["TTL"]))
    }

    pub fn lease_revoke(&self, id: i64) -> Result<(), String> {
        match self.call("/v3/lease/revoke", &json!({"ID": id.to_string()})) {
            Ok(_) => Ok(()),
            Err(e) if e.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn put(key: &[u8], value: &[u8]) -> Value {
    json!({"request_put": {"key": b64(key), "value": b64(value)}})
}

fn delete(key: &[u8], end: Option<&[u8]>) -> Value {
    match end {
        Some(e) => json!({"request_delete_range": {"key": b64(key), "range_end": b64(e)}}),
        None => json!({"request_delete_range": {"key": b64(key)}}),
    }
}

/// The leader's name and address, as stored in the leader key.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaderInfo {
    pub node: String,
    pub advertise: String,
}

/// A won election: the epoch (the revision at which the leader key was created) and the
/// lease that holds the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub epoch: i64,
    pub lease: i64,
}

/// What a store's commits compare before they write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// The leader key still has this create revision (the epoch).
    Leader(i64),
    /// No leader key at all (`migrate`: no manager may run meanwhile).
    NoLeader,
}

/// Called once this manager learns it is no longer the leader (the reason).
pub type Deposed = Arc<dyn Fn(&str) + Send + Sync>;

/// The election of one leader among the managers of a prefix.
pub struct Elector {
    etcd: Arc<Etcd>,
    key: Vec<u8>,
    me: LeaderInfo,
    ttl_s: u64,
}

impl Elector {
    pub fn new(etcd: Arc<Etcd>, prefix: &str, me: LeaderInfo, ttl_s: u64) -> Self {
        Self {
            etcd,
            key: format!("{prefix}/leader").into_bytes(),
            me,
            ttl_s,
        }
    }

    /// The leader now (linearizable read), with its epoch and lease.
    pub fn leader(&self) -> Result<Option<(LeaderInfo, i64, i64)>, String> {
        let v = self.etcd.range(&self.key, None, json!({}))?;
        let Some(kv) = kvs_of(&v).into_iter().next() else {
            return Ok(None);
        };
        // The epoch: the key's create revision, which etcd always gives a key that exists.
        let epoch = positive(
            &v["kvs"][0]["create_revision"],
            "create revision of the leader key",
        )?;
        let info = serde_json::from_slice(&kv.value).unwrap_or(LeaderInfo {
            node: "?".into(),
            advertise: String::from_utf8_lossy(&kv.value).into_owned(),
        });
        Ok(Some((info, epoch, kv.lease)))
    }

    /// Waits until this manager is the leader; `waiting` hears of the leader meanwhile
    /// (none: no leader, or etcd unreachable). A leader key of this manager's own name is
    /// a previous run's (a node name is unique): its lease is revoked, not waited out.
    /// TLS refused by every member ([`TLS_FAILED`]) or a user refused ([`AUTH_FAILED`])
    /// before etcd ever answered is an error: a configuration to fix, which waiting does not
    /// mend.
    pub fn campaign(
        &self,
        mut waiting: impl FnMut(Option<&LeaderInfo>),
    ) -> Result<Leadership, String> {
        let poll = Duration::from_millis((self.ttl_s * 1000 / 5).clamp(100, 1000));
        let mut said = String::new();
        let mut answered = false;
        loop {
            match self.try_once() {
                Ok(Ok(l)) => return Ok(l),
                Ok(Err(leader)) => {
                    answered = true;
                    waiting(Some(&leader))
                }
                Err(e)
                    if !answered && (e.starts_with(TLS_FAILED) || e.starts_with(AUTH_FAILED)) =>
                {
                    return Err(e)
                }
                Err(e) => {
                    if e != said {
                        eprintln!("pcifab-manager: standby: {e}");
                        said = e;
                    }
                    waiting(None);
                }
            }
            std::thread::sleep(poll);
        }
    }

    /// One attempt: won, or the leader there is.
    fn try_once(&self) -> Result<Result<Leadership, LeaderInfo>, String> {
        if let Some((info, _, lease)) = self.leader()? {
            if info.node != self.me.node {
                return Ok(Err(info));
            }
            eprintln!(
                "pcifab-manager: the leader key is this node's ({}) from an earlier run: \
                 revoking its lease",
                self.me.node
            );
            self.etcd.lease_revoke(lease)?;
        }
        let lease = self.etcd.lease_grant(self.ttl_s)?;
        let me = serde_json::to_vec(&self.me).map_err(|e| e.to_string())?;
        let created = json!({"key": b64(&self.key), "target": "CREATE", "result": "EQUAL",
                             "create_revision": "0"});
        let put = json!({"request_put": {"key": b64(&self.key), "value": b64(&me),
                                         "lease": lease.to_string()}});
        let (won, v) = self.etcd.txn(vec![created], vec![put], vec![])?;
        if won {
            // Without a valid revision there is no epoch to guard commits with: the next
            // attempt finds this node's key and revokes its lease.
            let epoch = positive(&v["header"]["revision"], "revision of the won election")?;
            return Ok(Ok(Leadership { epoch, lease }));
        }
        let _ = self.etcd.lease_revoke(lease);
        match self.leader()? {
            Some((info, _, _)) => Ok(Err(info)),
            None => Err("the election was lost to a leader that is gone already".into()),
        }
    }

    /// Fencing: Ok only while `l` is still the leadership etcd knows (a linearizable read,
    /// so it needs a quorum). Deposed, it calls `deposed`.
    pub fn check(&self, l: Leadership, deposed: &Deposed) -> Result<(), String> {
        match self.leader()? {
            Some((_, epoch, _)) if epoch == l.epoch => Ok(()),
            other => {
                let why = match other {
                    Some((info, epoch, _)) => format!(
                        "deposed: node {} at {} leads since revision {epoch} (this manager's \
                         epoch was {})",
                        info.node, info.advertise, l.epoch
                    ),
                    None => format!(
                        "deposed: the leader key of epoch {} is gone (its lease expired)",
                        l.epoch
                    ),
                };
                deposed(&why);
                Err(why)
            }
        }
    }

    /// How often the leader renews its lease: every third of the TTL, or more often so that
    /// a keepalive that waits out a member that does not answer (the timeout) still leaves
    /// another a whole timeout before the TTL ends (the configuration makes sure twice the
    /// timeout is less than the TTL, `config::HaConfig`).
    fn renew_every(&self) -> Duration {
        let ttl = Duration::from_secs(self.ttl_s);
        (ttl / 3)
            .min(ttl.saturating_sub(self.etcd.timeout * 2))
            .max(Duration::from_millis(10))
    }

    /// Renews the lease of `l` in a thread ([`Elector::renew_every`]). A lease etcd says is
    /// gone calls `deposed`. A keepalive that fails is tried again at once, and again until
    /// etcd answers (the fence and the commits fail meanwhile, so the fabric does not
    /// change): etcd back before the TTL has passed, the leader keeps its lease.
    pub fn keep(self: &Arc<Self>, l: Leadership, deposed: Deposed) {
        let me = self.clone();
        let every = me.renew_every();
        std::thread::spawn(move || {
            let mut last_ok = Instant::now();
            let mut said = false;
            let mut wait = every;
            loop {
                std::thread::sleep(wait);
                let sent = Instant::now();
                match me.etcd.lease_keepalive(l.lease) {
                    Ok(ttl) if ttl > 0 => {
                        last_ok = sent;
                        wait = every;
                        if said {
                            eprintln!("pcifab-manager: etcd reached again; still the leader");
                            said = false;
                        }
                    }
                    Ok(_) => {
                        deposed(&format!(
                            "deposed: the leader lease of epoch {} expired",
                            l.epoch
                        ));
                        return;
                    }
                    Err(e) => {
                        // Each failed keepalive tried every member for twice the timeout;
                        // a short pause keeps an etcd that refuses at once from being
                        // hammered.
                        wait = Duration::from_millis(100);
                        if !said && last_ok.elapsed() >= Duration::from_secs(me.ttl_s) {
                            eprintln!(
                                "pcifab-manager: cannot renew the leader lease for {} s: {e}; \
                                 not changing the fabric until etcd answers",
                                me.ttl_s
                            );
                            said = true;
                        }
                    }
                }
            }
        });
    }
}

/// The state in etcd (see the module's comment for the keys).
pub struct EtcdStore {
    etcd: Arc<Etcd>,
    prefix: String,
    guard: Guard,
    leader_key: Vec<u8>,
    /// The next log entry's number.
    next_log: AtomicU64,
    deposed: Option<Deposed>,
}

const SEQ_DIGITS: usize = 20;

impl EtcdStore {
    /// The store under `prefix`; commits compare `guard`; a failed compare of a leader
    /// calls `deposed`.
    pub fn open(
        etcd: Arc<Etcd>,
        prefix: &str,
        guard: Guard,
        deposed: Option<Deposed>,
    ) -> Result<Self, String> {
        let s = Self {
            etcd,
            prefix: prefix.to_string(),
            guard,
            leader_key: format!("{prefix}/leader").into_bytes(),
            next_log: AtomicU64::new(1),
            deposed,
        };
        let lp = s.log_prefix();
        let v = s.etcd.range(
            lp.as_bytes(),
            Some(&prefix_end(lp.as_bytes())),
            json!({"sort_order": "DESCEND", "sort_target": "KEY", "limit": "1",
                   "keys_only": true}),
        )?;
        if let Some(kv) = kvs_of(&v).first() {
            let seq = s.seq_of(&kv.key)?;
            s.next_log.store(s.after(seq)?, Ordering::Relaxed);
        }
        Ok(s)
    }

    fn log_prefix(&self) -> String {
        format!("{}/log/", self.prefix)
    }

    fn log_key(&self, seq: u64) -> Vec<u8> {
        format!("{}{seq:0width$}", self.log_prefix(), width = SEQ_DIGITS).into_bytes()
    }

    fn seq_of(&self, key: &[u8]) -> Result<u64, String> {
        String::from_utf8_lossy(key)
            .strip_prefix(&self.log_prefix())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                format!(
                    "etcd key {} under the log is not a log entry's; the prefix {} is not \
                     pcifab-manager's alone",
                    String::from_utf8_lossy(key),
                    self.prefix
                )
            })
    }

    /// The log entry number after `seq`; none after the last a u64 holds.
    fn after(&self, seq: u64) -> Result<u64, String> {
        seq.checked_add(1).ok_or_else(|| {
            format!(
                "etcd key {}: the request log is at its last entry number ({seq}); copy the \
                 state out with `pcifab-manager migrate` and back into an empty prefix to \
                 number it afresh",
                String::from_utf8_lossy(&self.log_key(seq))
            )
        })
    }

    fn idem_key(&self, key: &str) -> Vec<u8> {
        let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{}/keys/{hex}", self.prefix).into_bytes()
    }

    fn record_key(&self, table: &str, key: &str) -> Vec<u8> {
        format!("{}/r/{table}/{key}", self.prefix).into_bytes()
    }

    fn guard_compare(&self) -> Value {
        let rev = match self.guard {
            Guard::Leader(epoch) => epoch,
            Guard::NoLeader => 0,
        };
        json!({"key": b64(&self.leader_key), "target": "CREATE", "result": "EQUAL",
               "create_revision": rev.to_string()})
    }
}

const RESERVED: [&str; 4] = ["format", "log", "state", "keys"];

/// Most log entries one commit reads to trim them (see [`EtcdStore::commit`]).
const TRIM_READ: u64 = 1000;

impl StateStore for EtcdStore {
    fn load(&self, tables: &[Table]) -> Result<Stored, String> {
        let mut out = Stored::default();
        let fk = format!("{}/format", self.prefix);
        if let Some(kv) = kvs_of(&self.etcd.range(fk.as_bytes(), None, json!({}))?).first() {
            let v = std::str::from_utf8(&kv.value)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .ok_or_else(|| format!("etcd key {fk}: the format version is not a number"))?;
            out.version = Some(v);
        }
        let rp = format!("{}/r/", self.prefix);
        let v = self
            .etcd
            .range(rp.as_bytes(), Some(&prefix_end(rp.as_bytes())), json!({}))?;
        for kv in kvs_of(&v) {
            let k = String::from_utf8_lossy(&kv.key);
            let Some((table, key)) = k.strip_prefix(&rp).and_then(|r| r.split_once('/')) else {
                continue;
            };
            if let Some(t) = tables.iter().find(|t| **t == table) {
                out.records
                    .entry(*t)
                    .or_default()
                    .insert(key.to_string(), kv.value);
            }
        }
        Ok(out)
    }

    fn commit(
        &self,
        batch: &Batch,
        entry: Option<&LogEntry>,
        retention: Retention,
    ) -> Result<(), String> {
        let mut ops = Vec::new();
        for (t, k) in &batch.deletes {
            if RESERVED.contains(t) {
                return Err(format!("etcd store: table '{t}' is the store's own"));
            }
            ops.push(delete(&self.record_key(t, k), None));
        }
        for (t, k, v) in &batch.puts {
            if RESERVED.contains(t) {
                return Err(format!("etcd store: table '{t}' is the store's own"));
            }
            ops.push(put(&self.record_key(t, k), v));
        }
        if let Some(v) = batch.version {
            ops.push(put(
                format!("{}/format", self.prefix).as_bytes(),
                v.to_string().as_bytes(),
            ));
        }
        let seq = self.next_log.load(Ordering::Relaxed);
        let next = entry.map(|_| self.after(seq)).transpose()?;
        if let Some(entry) = entry {
            let e = serde_json::to_vec(entry).map_err(|e| format!("etcd store: encode: {e}"))?;
            ops.push(put(&self.log_key(seq), &e));
            if let Some(k) = &entry.key {
                ops.push(put(&self.idem_key(k), seq.to_string().as_bytes()));
            }
            let keep = retention.max_entries.max(1);
            if seq > keep {
                // The entries trimmed, read first for their idempotency keys, which go
                // with them (one entry per commit once the log is full; at most TRIM_READ
                // at a time after `log_max_entries` was lowered, the rest by later commits).
                let end = self.log_key(seq - (keep - 1));
                let v = self.etcd.range(
                    &self.log_key(0),
                    Some(&end),
                    json!({"limit": TRIM_READ.to_string()}),
                )?;
                let old = kvs_of(&v);
                let end = match (v["more"].as_bool(), old.last()) {
                    (Some(true), Some(last)) => {
                        let mut e = last.key.clone();
                        e.push(0);
                        e
                    }
                    _ => end,
                };
                let mut gone = std::collections::BTreeSet::new();
                for kv in &old {
                    if let Ok(LogEntry { key: Some(k), .. }) = serde_json::from_slice(&kv.value) {
                        if Some(&k) != entry.key.as_ref() {
                            gone.insert(k);
                        }
                    }
                }
                for k in gone {
                    ops.push(delete(&self.idem_key(&k), None));
                }
                ops.push(delete(&self.log_key(0), Some(&end)));
            }
        }
        if ops.is_empty() {
            return Ok(());
        }
        let (ok, _) = self.etcd.txn(vec![self.guard_compare()], ops, vec![])?;
        if !ok {
            let why = match self.guard {
                Guard::Leader(epoch) => format!(
                    "deposed: the commit of epoch {epoch} was refused by etcd, another \
                     manager leads now"
                ),
                Guard::NoLeader => "a manager runs on this etcd prefix (its leader key is \
                                    there): stop every manager first"
                    .to_string(),
            };
            if let Some(d) = &self.deposed {
                d(&why);
            }
            return Err(why);
        }
        if let Some(n) = next {
            self.next_log.store(n, Ordering::Relaxed);
        }
        Ok(())
    }

    fn log_len(&self) -> Result<u64, String> {
        let p = self.log_prefix();
        let v = self.etcd.range(
            p.as_bytes(),
            Some(&prefix_end(p.as_bytes())),
            json!({"count_only": true}),
        )?;
        Ok(num(&v["count"]).max(0) as u64)
    }

    fn log_tail(&self, n: u64) -> Result<Vec<LogEntry>, String> {
        let p = self.log_prefix();
        let v = self.etcd.range(
            p.as_bytes(),
            Some(&prefix_end(p.as_bytes())),
            json!({"sort_order": "DESCEND", "sort_target": "KEY",
                   "limit": n.min(i64::MAX as u64).to_string()}),
        )?;
        let mut out = kvs_of(&v)
            .iter()
            .map(|kv| serde_json::from_slice(&kv.value).map_err(|e| format!("etcd log entry: {e}")))
            .collect::<Result<Vec<LogEntry>, String>>()?;
        out.reverse();
        Ok(out)
    }

    fn recorded(&self, key: &str) -> Result<Option<LogEntry>, String> {
        let v = self.etcd.range(&self.idem_key(key), None, json!({}))?;
        let Some(kv) = kvs_of(&v).into_iter().next() else {
            return Ok(None);
        };
        let seq: u64 = std::str::from_utf8(&kv.value)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| {
                format!(
                    "etcd key {}: not a log entry's number",
                    String::from_utf8_lossy(&kv.key)
                )
            })?;
        let v = self.etcd.range(&self.log_key(seq), None, json!({}))?;
        match kvs_of(&v).into_iter().next() {
            None => Ok(None),
            Some(kv) => serde_json::from_slice(&kv.value)
                .map(Some)
                .map_err(|e| format!("etcd log entry {seq}: {e}")),
        }
    }
}

/// Copies a whole state (records, format, log) from one store into an empty one:
/// `pcifab-manager migrate`. Returns what was copied, in words.
pub fn copy_state(
    from: &dyn StateStore,
    to: &dyn StateStore,
    tables: &[Table],
) -> Result<String, String> {
    let st = from.load(tables)?;
    if st.whole.is_some() {
        return Err(
            "the source holds a state of format 1 or 2: start pcifab-manager on it once \
                    (it stores it again as records), then migrate"
                .into(),
        );
    }
    let Some(version) = st.version else {
        return Err("the source holds no state".into());
    };
    let mut batch = Batch {
        version: Some(version),
        ..Batch::default()
    };
    let mut n = 0;
    for (t, m) in &st.records {
        for (k, v) in m {
            batch.puts.push((*t, k.clone(), v.clone()));
            n += 1;
        }
    }
    let log = from.log_tail(u64::MAX)?;
    let keep = Retention {
        max_entries: (log.len() as u64).max(1),
        max_age_s: 0,
    };
    to.commit(&batch, None, keep)?;
    for e in &log {
        to.commit(&Batch::default(), Some(e), keep)?;
    }
    Ok(format!(
        "{n} records of format {version} and {} log entries",
        log.len()
    ))
}

/// The records a store holds, as (table, key) -> value (tests, `migrate --check`).
pub fn records_of(
    s: &dyn StateStore,
    tables: &[Table],
) -> Result<BTreeMap<(String, String), Vec<u8>>, String> {
    Ok(s.load(tables)?
        .records
        .into_iter()
        .flat_map(|(t, m)| m.into_iter().map(move |(k, v)| ((t.to_string(), k), v)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};

    /// A fake etcd gateway on loopback: every POST is answered with 200 and what `answer`
    /// gives for its path and body. Its URL.
    fn gateway(answer: impl Fn(&str, &Value) -> Value + Send + 'static) -> String {
        gateway_with_auth(move |path, _, req| (200, answer(path, req)))
    }

    /// [`gateway`] whose answer also sees the `Authorization` header, and gives the status.
    fn gateway_with_auth(
        answer: impl Fn(&str, Option<&str>, &Value) -> (u16, Value) + Send + 'static,
    ) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut r = BufReader::new(conn.try_clone().expect("clone"));
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split(' ').nth(1).unwrap_or("").to_string();
                let mut len = 0;
                let mut token = None;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                        if k.eq_ignore_ascii_case("authorization") {
                            token = Some(v.trim().to_string());
                        }
                    }
                }
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body);
                let req = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let (status, reply) = answer(&path, token.as_deref(), &req);
                let reply = reply.to_string();
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: \
                     {}\r\nConnection: close\r\n\r\n{reply}",
                    reply.len()
                );
            }
        });
        url
    }

    /// etcd's key-value calls, in memory, as far as the store uses them: `range` (one key or
    /// `[key, range_end)`, `limit`, `sort_order`, `count_only`; `more`) and `txn` (compares
    /// of `create_revision`, puts, range deletes).
    fn kv_gateway() -> String {
        let kv = std::sync::Mutex::new(BTreeMap::<Vec<u8>, Vec<u8>>::new());
        let range_of = |m: &BTreeMap<Vec<u8>, Vec<u8>>, r: &Value| -> Vec<(Vec<u8>, Vec<u8>)> {
            let key = unb64(&r["key"]);
            match r.get("range_end") {
                None => m.get(&key).map(|v| (key, v.clone())).into_iter().collect(),
                Some(e) => {
                    let end = unb64(e);
                    m.range(key..end)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                }
            }
        };
        gateway(move |path, req| {
            let mut m = kv.lock().expect("kv");
            match path {
                "/v3/kv/range" => {
                    let mut all = range_of(&m, req);
                    let count = all.len();
                    if req["sort_order"] == json!("DESCEND") {
                        all.reverse();
                    }
                    let limit = num(&req["limit"]) as usize;
                    let more = limit > 0 && all.len() > limit;
                    if limit > 0 {
                        all.truncate(limit);
                    }
                    if req["count_only"] == json!(true) {
                        all.clear();
                    }
                    let kvs: Vec<Value> = all
                        .iter()
                        .map(|(k, v)| {
                            json!({"key": b64(k), "value": b64(v), "create_revision": "1"})
                        })
                        .collect();
                    json!({"kvs": kvs, "count": count.to_string(), "more": more})
                }
                "/v3/kv/txn" => {
                    let holds = req["compare"].as_array().into_iter().flatten().all(|c| {
                        let there = m.contains_key(&unb64(&c["key"]));
                        let rev = num(&c["create_revision"]);
                        there == (rev != 0)
                    });
                    let ops = if holds {
                        &req["success"]
                    } else {
                        &req["failure"]
                    };
                    for op in ops.as_array().into_iter().flatten() {
                        if let Some(p) = op.get("request_put") {
                            m.insert(unb64(&p["key"]), unb64(&p["value"]));
                        } else if let Some(d) = op.get("request_delete_range") {
                            for (k, _) in range_of(&m, d) {
                                m.remove(&k);
                            }
                        }
                    }
                    json!({"succeeded": holds})
                }
                _ => json!({}),
            }
        })
    }

    /// The store's checks of idempotency keys (`store::tests`) on the etcd store.
    #[test]
    fn idempotency_keys_are_kept_with_their_log_entries() {
        let store =
            EtcdStore::open(client(kv_gateway()), "/p", Guard::NoLeader, None).expect("open");
        crate::store::tests::keys_are_kept_with_their_log_entries(&store);
    }

    fn client(url: String) -> Arc<Etcd> {
        Arc::new(Etcd::new(&[url], Duration::from_millis(500)))
    }

    fn me() -> LeaderInfo {
        LeaderInfo {
            node: "fm1".into(),
            advertise: "x".into(),
        }
    }

    /// A leader key whose create revision is missing, 0, negative or not a number is no
    /// leadership: the read fails as an etcd error, and the fence with it (it does not
    /// call `deposed`, nor take the key for someone else's).
    #[test]
    fn a_leader_key_without_a_valid_create_revision_is_an_etcd_error() {
        for rev in [
            json!(null),
            json!("0"),
            json!("-3"),
            json!("seven"),
            json!(0),
        ] {
            let r = rev.clone();
            let url = gateway(move |_, _| {
                let mut kv = json!({"key": b64(b"/p/leader"), "lease": "9",
                                    "value": b64(br#"{"node":"fm2","advertise":"y"}"#)});
                if !r.is_null() {
                    kv["create_revision"] = r.clone();
                }
                json!({"header": {"revision": "12"}, "kvs": [kv], "count": "1"})
            });
            let e = Elector::new(client(url), "/p", me(), 5);
            let err = e.leader().expect_err("no valid create revision");
            assert!(
                err.contains("create revision of the leader key"),
                "{rev}: {err}"
            );
            let called = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let c = called.clone();
            let deposed: Deposed = Arc::new(move |_| c.store(true, Ordering::SeqCst));
            let l = Leadership { epoch: 5, lease: 9 };
            assert!(e.check(l, &deposed).is_err(), "{rev}");
            assert!(
                !called.load(Ordering::SeqCst),
                "{rev}: deposed on a bad reply"
            );
        }
    }

    /// An election whose transaction etcd reports won, but with no valid revision (so no
    /// epoch), is not won.
    #[test]
    fn a_won_election_without_a_valid_revision_is_an_etcd_error() {
        for rev in [json!(null), json!("0"), json!("-1"), json!("x")] {
            let r = rev.clone();
            let url = gateway(move |path, _| match path {
                "/v3/kv/range" => json!({"header": {"revision": "3"}}),
                "/v3/lease/grant" => json!({"ID": "77", "TTL": "5"}),
                "/v3/kv/txn" => json!({"header": {"revision": r.clone()}, "succeeded": true}),
                _ => json!({}),
            });
            let e = Elector::new(client(url), "/p", me(), 5);
            let err = e.try_once().expect_err("no epoch");
            assert!(err.contains("revision of the won election"), "{rev}: {err}");
        }
    }

    /// A log whose last key has the last number a u64 holds: the store refuses to open,
    /// saying so, instead of overflowing the next number.
    #[test]
    fn a_log_at_its_last_number_is_refused() {
        let url = gateway(|path, _| match path {
            "/v3/kv/range" => json!({"header": {"revision": "3"}, "kvs": [
                {"key": b64(format!("/p/log/{}", u64::MAX).as_bytes()),
                 "create_revision": "2", "mod_revision": "2"}]}),
            _ => json!({}),
        });
        let Err(e) = EtcdStore::open(client(url), "/p", Guard::Leader(2), None) else {
            panic!("opened a store whose log has no number left");
        };
        assert!(
            e.contains("last entry number") && e.contains("18446744073709551615"),
            "{e}"
        );
    }

    /// `[ha]`'s keys as the client's TLS and user: none without them.
    #[test]
    fn ha_keys_make_the_tls_and_the_user() {
        let ha = |extra: &str| {
            crate::config::Config::parse(&format!(
                "[manager]\nhosts = 2\n[ha]\nnode = 'a'\nadvertise = 'x'\n{extra}"
            ))
            .expect("config")
            .ha
            .expect("ha")
        };
        let plain = ha("endpoints = ['http://e:2379']");
        assert_eq!((EtcdTls::of(&plain), EtcdUser::of(&plain)), (None, None));
        let h = ha(
            "endpoints = ['https://e:2379']\nca = '/c'\ncert = '/m.crt'\nkey = '/m.key'\n\
                    user = 'fm'\npassword_file = '/p'",
        );
        assert_eq!(
            EtcdTls::of(&h),
            Some(EtcdTls {
                ca: "/c".into(),
                client: Some(("/m.crt".into(), "/m.key".into()))
            })
        );
        assert_eq!(
            EtcdUser::of(&h),
            Some(EtcdUser {
                name: "fm".into(),
                password_file: "/p".into()
            })
        );
        let h = ha("endpoints = ['https://e:2379']\nca = '/c'");
        assert_eq!(EtcdTls::of(&h).and_then(|t| t.client), None);
    }

    /// The TLS files of `[ha]`: each one missing, unreadable or not what it should be is
    /// an error that names the key and the file; good ones make a client.
    #[test]
    fn tls_files_are_checked_and_named_in_errors() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let dir = std::env::temp_dir().join(format!("pcifab-etcd-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write");
            p
        };
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).expect("CA").pem();
        let issuer = Issuer::from_params(&ca, &ca_key);
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["m".to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("cert");
        let good = EtcdTls {
            ca: file("ca.crt", &ca_pem),
            client: Some((
                file("m.crt", &cert.pem()),
                file("m.key", &key.serialize_pem()),
            )),
        };
        let eps = ["https://127.0.0.1:1".to_string()];
        let make = |t: &EtcdTls| Etcd::with_tls(&eps, Duration::from_millis(100), Some(t));
        assert!(make(&good).expect("good files").client_cert);
        let ca_only = EtcdTls {
            client: None,
            ..good.clone()
        };
        assert!(!make(&ca_only).expect("a CA alone").client_cert);
        let err = |t: EtcdTls| make(&t).err().expect("an error");
        let missing = dir.join("none.crt");
        let e = err(EtcdTls {
            ca: missing.clone(),
            ..good.clone()
        });
        assert!(
            e.starts_with(&format!("[ha] ca: cannot read {}: ", missing.display())),
            "{e}"
        );
        let e = err(EtcdTls {
            ca: file("empty.crt", "no PEM here\n"),
            ..good.clone()
        });
        assert!(
            e.contains("[ha] ca: ") && e.contains("empty.crt holds no PEM certificate"),
            "{e}"
        );
        let junk = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let e = err(EtcdTls {
            ca: file("junk.crt", junk),
            ..good.clone()
        });
        assert!(
            e.contains("[ha] ca: certificate 1 of ") && e.contains("is not a valid X.509"),
            "{e}"
        );
        let (c, _) = good.client.clone().expect("client");
        let with_key = |k: PathBuf| EtcdTls {
            client: Some((c.clone(), k)),
            ..good.clone()
        };
        let e = err(with_key(file("nokey.key", &cert.pem())));
        assert!(
            e.contains("[ha] key: ") && e.contains("holds no PEM private key"),
            "{e}"
        );
        let other = KeyPair::generate().expect("key").serialize_pem();
        let e = err(with_key(file("other.key", &other)));
        assert!(
            e.contains("[ha] key: ") && e.contains("does not go with the certificate"),
            "{e}"
        );
        let e = err(EtcdTls {
            client: Some((
                file("k-as-cert.crt", &other),
                good.client.clone().expect("c").1,
            )),
            ..good.clone()
        });
        assert!(
            e.contains("[ha] cert: ") && e.contains("holds no PEM certificate"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An etcd user: its token asked for once and sent with every call, asked for again
    /// when etcd says it is not valid; a wrong password is [`AUTH_FAILED`] naming the user
    /// and the file; an etcd without authentication gets no token; the password file is
    /// checked.
    #[test]
    fn an_etcd_user_sends_its_token_and_renews_it() {
        let dir = std::env::temp_dir().join(format!("pcifab-etcd-user-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let pw = dir.join("pw");
        std::fs::write(&pw, "s3cret\nignored\n").expect("pw");
        let user = EtcdUser {
            name: "fm".into(),
            password_file: pw.clone(),
        };
        let asked = Arc::new(AtomicU64::new(0));
        let a = asked.clone();
        // Tokens t1, t2, ...; t1 expires after its first use.
        let url = gateway_with_auth(move |path, token, req| match path {
            "/v3/auth/authenticate" if req["password"] == "s3cret" && req["name"] == "fm" => {
                let n = a.fetch_add(1, Ordering::SeqCst) + 1;
                (200, json!({"token": format!("t{n}")}))
            }
            "/v3/auth/authenticate" => (
                400,
                json!({"code": 3, "message":
                       "etcdserver: authentication failed, invalid user ID or password"}),
            ),
            _ if token == Some("t2") || (token == Some("t1") && req["key"] == "Zmlyc3Q=") => {
                (200, json!({"header": {"revision": "3"}}))
            }
            _ if token.is_some() => (
                401,
                json!({"code": 16, "message": "etcdserver: invalid auth token"}),
            ),
            _ => (
                400,
                json!({"code": 3, "message": "etcdserver: user name is empty"}),
            ),
        });
        let etcd = Etcd::new(std::slice::from_ref(&url), Duration::from_millis(500))
            .with_user(Some(&user))
            .expect("user");
        let first = json!({"key": b64(b"first")});
        let later = json!({"key": b64(b"later")});
        assert!(etcd.call("/v3/kv/range", &first).is_ok());
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        // t1 no longer valid: asked for again (t2), the call made again with it.
        assert!(etcd.call("/v3/kv/range", &later).is_ok());
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        assert!(etcd.call("/v3/kv/range", &later).is_ok());
        assert_eq!(asked.load(Ordering::SeqCst), 2, "t2 is kept");
        // No user with an etcd that requires one; a wrong password.
        let e = Etcd::new(std::slice::from_ref(&url), Duration::from_millis(500))
            .call("/v3/kv/range", &first)
            .expect_err("no user");
        assert!(
            e.starts_with(AUTH_FAILED) && e.contains("set [ha] user and password_file"),
            "{e}"
        );
        std::fs::write(&pw, "guess\n").expect("pw");
        let e = Etcd::new(&[url], Duration::from_millis(500))
            .with_user(Some(&user))
            .expect("user")
            .call("/v3/kv/range", &first)
            .expect_err("wrong password");
        assert!(
            e.starts_with(AUTH_FAILED)
                && e.contains("refused [ha] user 'fm'")
                && e.contains(&pw.display().to_string()),
            "{e}"
        );
        // An etcd without authentication: no token, and calls go on.
        let plain = gateway_with_auth(|path, token, _| match (path, token) {
            ("/v3/auth/authenticate", _) => (
                400,
                json!({"code": 9, "message": "etcdserver: authentication is not enabled"}),
            ),
            (_, None) => (200, json!({"header": {"revision": "3"}})),
            (_, Some(_)) => (500, json!({"message": "a token was sent"})),
        });
        let etcd = Etcd::new(&[plain], Duration::from_millis(500))
            .with_user(Some(&user))
            .expect("user");
        assert!(etcd.call("/v3/kv/range", &first).is_ok());
        assert!(etcd.call("/v3/kv/range", &later).is_ok());
        // The password file: missing, empty.
        let no = |f: &Path| {
            let u = EtcdUser {
                password_file: f.to_path_buf(),
                ..user.clone()
            };
            Etcd::new(&["http://127.0.0.1:1".into()], Duration::from_millis(100))
                .with_user(Some(&u))
                .err()
                .expect("refused")
        };
        let e = no(&dir.join("none"));
        assert!(
            e.starts_with("[ha] password_file: cannot read ") && e.contains("none"),
            "{e}"
        );
        std::fs::write(&pw, "\n").expect("pw");
        let e = no(&pw);
        assert!(
            e.contains("is empty") && e.contains("[ha] user 'fm'"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// After a call no member answered, calls fail at once for a while, but a keepalive
    /// still asks etcd (and its answer ends the shortcut for the other calls).
    #[test]
    fn a_keepalive_is_not_short_circuited_by_an_earlier_failure() {
        let url = gateway(|_, _| json!({"result": {"ID": "7", "TTL": "5"}}));
        let etcd = Etcd::new(&[url], Duration::from_millis(500));
        // As a call no member answered leaves it: the next ones fail at once for a while.
        *etcd.down.lock().expect("down") = Some((
            Instant::now() + Duration::from_secs(600),
            format!("{NO_MEMBER} (etcd was down)"),
        ));
        // Still within the shortcut's time: a plain call fails without asking.
        assert!(etcd
            .call("/v3/kv/range", &json!({}))
            .expect_err("short-circuited")
            .starts_with(NO_MEMBER));
        assert_eq!(etcd.lease_keepalive(7), Ok(5));
        assert!(etcd.call("/v3/kv/range", &json!({})).is_ok());
    }
}
