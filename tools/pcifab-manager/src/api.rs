// SPDX-License-Identifier: GPL-2.0-only

//! The network API: HTTP/1.1 over TLS 1.3 (Documentation/manager-api.rst, the OpenAPI
//! document Documentation/manager-api.json).
//!
//! Every `/v1` route is one operation of the control socket's protocol
//! ([`crate::protocol::Request`]): [`route`] maps an HTTP request to it, [`http_of`] maps it
//! back for the client, and the daemon answers both the same way. `/metrics` is the
//! Prometheus text of [`crate::metrics`].

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, header, service::service_fn, Method, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};
use serde_json::{json, Value};

use crate::{
    auth::{Denied, Principal, Principals},
    config::ApiConfig,
    daemon::Daemon,
    protocol::Request,
    redfish,
    scheduler::{Pdfid, RequestSpec},
};

/// The OpenAPI document the server implements (also served at `/v1/openapi.json`).
pub const OPENAPI: &str = include_str!("../../../Documentation/manager-api.json");

/// Every route: method, path (`{name}` for a path parameter), operation. The OpenAPI
/// document lists exactly these (a test checks it).
pub const ROUTES: &[(&str, &str, &str)] = &[
    ("POST", "/v1/requests", "request"),
    ("DELETE", "/v1/requests/{id}", "release"),
    ("GET", "/v1/queue", "queue"),
    ("GET", "/v1/leases", "leases"),
    ("GET", "/v1/pools", "pool"),
    ("GET", "/v1/hosts", "hosts"),
    ("POST", "/v1/hosts/{host}/down", "host-down"),
    ("POST", "/v1/hosts/{host}/heartbeat", "heartbeat"),
    ("PUT", "/v1/hosts/{host}/functions", "compose"),
    ("PUT", "/v1/devices/{pf}/health", "set-health"),
    ("GET", "/v1/events", "events"),
    ("GET", "/v1/telemetry", "telemetry"),
    ("GET", "/v1/state", "state"),
    ("GET", "/v1/log", "log"),
    ("GET", "/metrics", "metrics"),
    ("GET", "/v1/openapi.json", "openapi"),
];

/// Longest a `GET /v1/events?wait=S` waits for a notice.
pub const MAX_EVENT_WAIT_S: u64 = 60;

/// What an HTTP request asks for.
#[derive(Debug, PartialEq)]
pub enum Endpoint {
    /// A protocol operation; for events, how long to wait for one.
    Op(Request, Duration),
    Metrics,
    OpenApi,
}

/// An HTTP error reply: status and reason.
#[derive(Debug, PartialEq)]
pub struct HttpError(pub u16, pub String);

fn bad(msg: impl Into<String>) -> HttpError {
    HttpError(400, msg.into())
}

fn query_map(query: &str) -> Result<BTreeMap<&str, &str>, HttpError> {
    let mut m = BTreeMap::new();
    for kv in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if m.insert(k, v).is_some() {
            return Err(bad(format!("query parameter '{k}' is given twice")));
        }
    }
    Ok(m)
}

fn number<T: TryFrom<u64>>(what: &str, s: &str) -> Result<T, HttpError> {
    let n = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse::<u64>().ok()
    };
    n.and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| bad(format!("{what} '{s}' is not a number in range")))
}

fn body_json<T: serde::de::DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, HttpError> {
    serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "the body is not {what}: {e} (Documentation/manager-api.json has the schema)"
        ))
    })
}

/// The endpoint of `method path?query` with `body`; a 400/404/405 says what is wrong.
pub fn route(method: &str, path: &str, query: &str, body: &[u8]) -> Result<Endpoint, HttpError> {
    let q = query_map(query)?;
    let allowed = |names: &[&str]| -> Result<(), HttpError> {
        match q.keys().find(|k| !names.contains(k)) {
            Some(k) => Err(bad(format!(
                "unknown query parameter '{k}' (this route takes {names:?})"
            ))),
            None => Ok(()),
        }
    };
    let no_body = || -> Result<(), HttpError> {
        if body.is_empty() {
            Ok(())
        } else {
            Err(bad("this route takes no body"))
        }
    };
    let seg: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let op = |r: Request| Ok(Endpoint::Op(r, Duration::ZERO));
    let found = match (method, seg.as_slice()) {
        ("POST", ["v1", "requests"]) => {
            allowed(&[])?;
            let spec: RequestSpec = body_json("a request (RequestSpec)", body)?;
            op(Request::Request { spec })
        }
        ("DELETE", ["v1", "requests", id]) => {
            allowed(&[])?;
            no_body()?;
            op(Request::Release {
                id: number("request id", id)?,
            })
        }
        ("GET", ["v1", "queue"]) => op(Request::Queue),
        ("GET", ["v1", "leases"]) => op(Request::Leases),
        ("GET", ["v1", "pools"]) => op(Request::Pool),
        ("GET", ["v1", "hosts"]) => op(Request::Hosts),
        ("POST", ["v1", "hosts", h, "down"]) => {
            no_body()?;
            op(Request::HostDown {
                host: number("host", h)?,
            })
        }
        ("POST", ["v1", "hosts", h, "heartbeat"]) => {
            no_body()?;
            op(Request::Heartbeat {
                host: number("host", h)?,
            })
        }
        ("PUT", ["v1", "hosts", h, "functions"]) => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Compose {
                #[serde(deserialize_with = "crate::protocol::pdfids")]
                functions: Vec<Pdfid>,
                #[serde(default)]
                priority: u32,
                #[serde(default)]
                duration_s: Option<u64>,
                #[serde(default)]
                tenant: Option<String>,
            }
            let c: Compose = body_json(
                "{\"functions\": [PDFID, ...], \"priority\": N, \"duration_s\": N, \"tenant\": TEXT}",
                body,
            )?;
            op(Request::Compose {
                host: number("host", h)?,
                functions: c.functions,
                priority: c.priority,
                duration_s: c.duration_s,
                tenant: c.tenant,
                owner: None,
            })
        }
        ("PUT", ["v1", "devices", pf, "health"]) => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Health {
                healthy: bool,
                #[serde(default)]
                reason: Option<String>,
            }
            let h: Health = body_json("{\"healthy\": BOOL, \"reason\": TEXT}", body)?;
            op(Request::SetHealth {
                pf: number::<Pdfid>("function", pf)?,
                healthy: h.healthy,
                reason: h.reason,
            })
        }
        ("GET", ["v1", "events"]) => {
            allowed(&["host", "since", "wait"])?;
            let host = q.get("host").map(|h| number("host", h)).transpose()?;
            let since = q.get("since").map(|s| number("since", s)).transpose()?;
            let wait: u64 = q
                .get("wait")
                .map(|w| number("wait", w))
                .transpose()?
                .unwrap_or(0);
            if wait > MAX_EVENT_WAIT_S {
                return Err(bad(format!(
                    "wait is at most {MAX_EVENT_WAIT_S} s; ask again for more"
                )));
            }
            Ok(Endpoint::Op(
                Request::Events {
                    host,
                    since: since.unwrap_or(0),
                },
                Duration::from_secs(wait),
            ))
        }
        ("GET", ["v1", "telemetry"]) => op(Request::Telemetry),
        ("GET", ["v1", "state"]) => op(Request::State),
        ("GET", ["v1", "log"]) => {
            allowed(&["n"])?;
            let n = q
                .get("n")
                .map(|n| number("n", n))
                .transpose()?
                .unwrap_or(20);
            op(Request::Log { n })
        }
        ("GET", ["metrics"]) => Ok(Endpoint::Metrics),
        ("GET", ["v1", "openapi.json"]) => Ok(Endpoint::OpenApi),
        _ => {
            let known = ROUTES.iter().any(|(_, p, _)| template_matches(p, &seg));
            return Err(if known {
                HttpError(405, format!("{path} does not take {method}"))
            } else {
                HttpError(
                    404,
                    format!("no such route: {path} (GET /v1/openapi.json lists the routes)"),
                )
            });
        }
    }?;
    // Routes without a query parameter of their own take none; those without a body, none.
    let takes_query = matches!(
        found,
        Endpoint::Op(Request::Events { .. }, _) | Endpoint::Op(Request::Log { .. }, _)
    );
    if !takes_query {
        allowed(&[])?;
    }
    if method == "GET" {
        no_body()?;
    }
    Ok(found)
}

fn template_matches(template: &str, seg: &[&str]) -> bool {
    let t: Vec<&str> = template.split('/').skip(1).collect();
    t.len() == seg.len()
        && t.iter()
            .zip(seg)
            .all(|(t, s)| t == s || (t.starts_with('{') && t.ends_with('}')))
}

/// The HTTP request the client sends for `req`: method, path and query, JSON body.
pub fn http_of(req: &Request, wait_s: u64) -> (&'static str, String, Option<Value>) {
    match req {
        Request::Request { spec } => ("POST", "/v1/requests".into(), Some(json!(spec))),
        Request::Release { id } => ("DELETE", format!("/v1/requests/{id}"), None),
        Request::Queue => ("GET", "/v1/queue".into(), None),
        Request::Leases => ("GET", "/v1/leases".into(), None),
        Request::Pool => ("GET", "/v1/pools".into(), None),
        Request::Hosts => ("GET", "/v1/hosts".into(), None),
        Request::HostDown { host } => ("POST", format!("/v1/hosts/{host}/down"), None),
        Request::Heartbeat { host } => ("POST", format!("/v1/hosts/{host}/heartbeat"), None),
        Request::Compose {
            host,
            functions,
            priority,
            duration_s,
            tenant,
            owner: _,
        } => (
            "PUT",
            format!("/v1/hosts/{host}/functions"),
            Some(json!({
                "functions": functions.iter().map(|f| format!("{f:#06x}")).collect::<Vec<_>>(),
                "priority": priority,
                "duration_s": duration_s,
                "tenant": tenant,
            })),
        ),
        Request::SetHealth {
            pf,
            healthy,
            reason,
        } => (
            "PUT",
            format!("/v1/devices/{pf:#06x}/health"),
            Some(json!({"healthy": healthy, "reason": reason})),
        ),
        Request::Events { host, since } => {
            let mut q = format!("/v1/events?since={since}");
            if let Some(h) = host {
                q.push_str(&format!("&host={h}"));
            }
            if wait_s > 0 {
                q.push_str(&format!("&wait={wait_s}"));
            }
            ("GET", q, None)
        }
        Request::Telemetry => ("GET", "/v1/telemetry".into(), None),
        Request::State => ("GET", "/v1/state".into(), None),
        Request::Log { n } => ("GET", format!("/v1/log?n={n}"), None),
    }
}

/// The HTTP status of a protocol reply: 200 (201 for a new request), 409 when the manager
/// refused it (a conflict with the pool, the queue or its rules), 500 when it failed.
pub fn status_of(req: &Request, reply: &Value) -> u16 {
    match (reply.get("ok"), reply.get("refused")) {
        (Some(Value::Bool(true)), _) if matches!(req, Request::Request { .. }) => 201,
        (Some(Value::Bool(true)), _) => 200,
        (_, Some(Value::Bool(true))) => 409,
        _ => 500,
    }
}

// ---- the server ---------------------------------------------------------------------------

type Reply = hyper::Response<Full<Bytes>>;

struct Ctx {
    daemon: Arc<Mutex<Daemon>>,
    /// Changes when the daemon adds notices ([`Daemon::notices`]).
    notices: tokio::sync::watch::Receiver<u64>,
    principals: Arc<Principals>,
    max_body: usize,
    redfish: Arc<redfish::serve::Ctx>,
}

fn reply(status: u16, ctype: &str, body: impl Into<Bytes>) -> Reply {
    let mut r = hyper::Response::new(Full::new(body.into()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn json_reply(status: u16, v: &Value) -> Reply {
    let mut r = reply(status, "application/json", format!("{v}\n"));
    if status == 401 {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"pcifab-manager\""),
        );
    }
    r
}

fn error_reply(status: u16, msg: &str) -> Reply {
    json_reply(
        status,
        &json!({"ok": false, "error": msg, "refused": status < 500}),
    )
}

/// Loads the server's TLS configuration: TLS 1.3 only, HTTP/1.1, client certificates
/// checked against `client_ca` when it is set (and then optional: a bearer token will do).
pub fn tls_config(cfg: &ApiConfig) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cfg.cert)
        .and_then(|i| i.collect())
        .map_err(|e| format!("[api] cert {}: {e}", cfg.cert))?;
    if certs.is_empty() {
        return Err(format!("[api] cert {}: no certificate in it", cfg.cert));
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key)
        .map_err(|e| format!("[api] key {}: {e}", cfg.key))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3: {e}"))?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .map_err(|e| format!("[api] client_ca {ca}: {e}"))?
            {
                let c = c.map_err(|e| format!("[api] client_ca {ca}: {e}"))?;
                roots
                    .add(c)
                    .map_err(|e| format!("[api] client_ca {ca}: {e}"))?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("[api] client_ca {ca}: {e}"))?;
            builder.with_client_cert_verifier(v)
        }
        None => builder.with_no_client_auth(),
    };
    let mut c = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("[api] cert {} and key {}: {e}", cfg.cert, cfg.key))?;
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(c)
}

/// The common name of a client certificate (its principal's name).
fn common_name(der: &[u8]) -> Option<String> {
    let (_, c) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = c.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_string())
}

/// Starts the API on its own thread; the address is bound before this returns, so a
/// configuration error stops the daemon's start.
pub fn spawn(
    daemon: Arc<Mutex<Daemon>>,
    cfg: &ApiConfig,
    principals: Arc<Principals>,
) -> Result<SocketAddr, String> {
    let tls = Arc::new(tls_config(cfg)?);
    let listener = std::net::TcpListener::bind(&cfg.listen)
        .map_err(|e| format!("[api] listen {}: {e}", cfg.listen))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("[api] listen {}: {e}", cfg.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("[api] listen {}: {e}", cfg.listen))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the API's runtime: {e}"))?;
    let notices = daemon
        .lock()
        .map_err(|_| "the daemon's lock is poisoned".to_string())?
        .notices();
    let redfish = Arc::new(redfish::serve::Ctx::new(
        daemon.clone(),
        principals.clone(),
        cfg,
    )?);
    let ctx = Arc::new(Ctx {
        daemon,
        notices,
        principals,
        max_body: cfg.max_body,
        redfish,
    });
    let timeout = Duration::from_secs(cfg.client_timeout_s);
    let slots = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections));
    std::thread::Builder::new()
        .name("api".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("pcifab-manager: the API cannot listen: {e}");
                        std::process::abort();
                    }
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                loop {
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    let (tcp, peer) = match listener.accept().await {
                        Ok(c) => c,
                        Err(e) => {
                            eprintln!("pcifab-manager: API accept: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let acceptor = acceptor.clone();
                    let ctx = ctx.clone();
                    tokio::spawn(async move {
                        serve_conn(acceptor, tcp, peer, ctx, timeout).await;
                        drop(permit);
                    });
                }
            })
        })
        .map_err(|e| format!("cannot start the API thread: {e}"))?;
    eprintln!("pcifab-manager: API on https://{addr}/v1");
    Ok(addr)
}

async fn serve_conn(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    ctx: Arc<Ctx>,
    timeout: Duration,
) {
    // A reply is written in several small pieces (the TLS 1.3 session tickets, then the
    // HTTP response): with Nagle's algorithm the last one waits for the client's delayed
    // ACK, 40 ms on Linux, in every request.
    if let Err(e) = tcp.set_nodelay(true) {
        eprintln!("pcifab-manager: API {peer}: cannot set TCP_NODELAY: {e}");
    }
    let tls = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            eprintln!("pcifab-manager: API {peer}: TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            eprintln!("pcifab-manager: API {peer}: no TLS handshake within {timeout:?}");
            return;
        }
    };
    // A verified client certificate names its principal for the whole connection.
    let cert_principal: Option<Result<Principal, Denied>> = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| match common_name(c) {
            Some(cn) => ctx.principals.by_name(&cn),
            None => Err(Denied::Unauthenticated(
                "the client certificate has no common name".into(),
            )),
        });
    let svc = service_fn(move |req| {
        let ctx = ctx.clone();
        let cp = cert_principal.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(req, ctx, cp, peer).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(tls), svc);
    if let Err(e) = conn.await {
        if !e.is_incomplete_message() {
            eprintln!("pcifab-manager: API {peer}: {e}");
        }
    }
}

/// The bearer token: `Authorization: Bearer TOKEN`, or Redfish's `X-Auth-Token: TOKEN`.
fn bearer(req: &hyper::Request<Incoming>) -> Option<Result<String, Denied>> {
    let Some(v) = req.headers().get(header::AUTHORIZATION) else {
        let t = req.headers().get("x-auth-token")?;
        return Some(
            t.to_str()
                .ok()
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(String::from)
                .ok_or_else(|| Denied::Unauthenticated("the X-Auth-Token header is empty".into())),
        );
    };
    let t = v
        .to_str()
        .ok()
        .and_then(|s| s.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    Some(t.map(String::from).ok_or_else(|| {
        Denied::Unauthenticated("the Authorization header is not `Bearer TOKEN`".into())
    }))
}

async fn handle(
    req: hyper::Request<Incoming>,
    ctx: Arc<Ctx>,
    cert: Option<Result<Principal, Denied>>,
    peer: SocketAddr,
) -> Reply {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let what = format!("{method} {path}");
    if path == "/redfish" || path.starts_with("/redfish/") {
        return redfish::serve::serve(req, ctx.redfish.clone(), cert, peer).await;
    }
    // Who asks: a bearer token wins over the certificate (a host's certificate may carry
    // an operator's token).
    let principal = match (bearer(&req), cert) {
        (Some(Ok(t)), _) => ctx.principals.by_token(&t),
        (Some(Err(d)), _) | (None, Some(Err(d))) => Err(d),
        (None, Some(Ok(p))) => Ok(p),
        (None, None) => Err(Denied::Unauthenticated(
            "no client certificate and no bearer token: present one (Documentation/manager-api.rst)"
                .into(),
        )),
    };
    let limited = Limited::new(req.into_body(), ctx.max_body);
    let body = match limited.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return error_reply(
                413,
                &format!(
                    "the body is larger than {} bytes ([api] max_body)",
                    ctx.max_body
                ),
            )
        }
        Err(e) => return error_reply(400, &format!("cannot read the body: {e}")),
    };
    if method == Method::GET && path == "/v1/openapi.json" {
        return reply(200, "application/json", OPENAPI);
    }
    let principal = match principal {
        Ok(p) => p,
        Err(d) => {
            eprintln!(
                "pcifab-manager: API {peer}: refused {what}: {} {}",
                d.status(),
                d.reason()
            );
            return error_reply(d.status(), d.reason());
        }
    };
    let (op, wait) = match route(method.as_str(), &path, &query, &body) {
        Ok(Endpoint::Op(op, wait)) => (op, wait),
        Ok(Endpoint::OpenApi) => return reply(200, "application/json", OPENAPI),
        Ok(Endpoint::Metrics) => {
            let d = ctx.daemon.clone();
            return match tokio::task::spawn_blocking(move || {
                d.lock().map(|d| crate::metrics::render(&d)).ok()
            })
            .await
            {
                Ok(Some(text)) => reply(200, "text/plain; version=0.0.4; charset=utf-8", text),
                _ => error_reply(500, "the manager failed internally; restart it"),
            };
        }
        Err(HttpError(status, msg)) => {
            eprintln!(
                "pcifab-manager: API {peer} ({}): {status} {what}: {msg}",
                principal.name
            );
            return error_reply(status, &msg);
        }
    };
    let deadline = Instant::now() + wait;
    let mut notices = ctx.notices.clone();
    loop {
        // Seen before the daemon is asked: a notice added after this wakes the wait below.
        notices.borrow_and_update();
        let d = ctx.daemon.clone();
        let (p, op2) = (principal.clone(), op.clone());
        let r = tokio::task::spawn_blocking(move || {
            let mut d = d.lock().ok()?;
            Some(d.serve(&p, op2))
        })
        .await;
        let (status, v) = match r {
            Ok(Some(Ok((served, v)))) => (status_of(&served, &v), v),
            Ok(Some(Err(denied))) => {
                eprintln!(
                    "pcifab-manager: API {peer} ({}): refused {what}: {} {}",
                    principal.name,
                    denied.status(),
                    denied.reason()
                );
                return error_reply(denied.status(), denied.reason());
            }
            _ => return error_reply(500, "the manager failed internally; restart it"),
        };
        let now = Instant::now();
        if status == 200 && crate::protocol::no_events(&v) && now < deadline {
            // A long poll (`wait`): ask again when the daemon has added notices (for any
            // host; others' are filtered out), or once at the deadline.
            match tokio::time::timeout(deadline - now, notices.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return error_reply(500, "the manager failed internally; restart it"),
                Err(_) => continue,
            }
        }
        return json_reply(status, &v);
    }
}

#[cfg(test)]
mod tests;
