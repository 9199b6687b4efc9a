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
    sync::{atomic::Ordering, Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    body::{Body, Incoming},
    header,
    service::service_fn,
    Method, StatusCode,
};
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

/// The API's listen queue (capped by net.core.somaxconn).
const LISTEN_BACKLOG: libc::c_int = 4096;

pub use crate::protocol::{status_of, MAX_EVENT_WAIT_S};

/// The header of a request's idempotency key (Documentation/manager-api.rst).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The array of a list route's reply, which `offset` and `limit` page.
pub fn list_key(req: &Request) -> Option<&'static str> {
    Some(match req {
        Request::Queue => "queue",
        Request::Leases => "leases",
        Request::Pool => "devices",
        Request::Hosts => "hosts",
        Request::Events { .. } => "events",
        _ => return None,
    })
}

/// A page of a list: skip `offset` items, give at most `limit`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Page {
    pub offset: usize,
    pub limit: usize,
}

/// The page `offset` and `limit` ask for (limit 1 to [`crate::protocol::MAX_PAGE`], that
/// by default).
fn page_of(q: &BTreeMap<String, String>) -> Result<Page, HttpError> {
    let max = crate::protocol::MAX_PAGE;
    let limit: u64 = q
        .get("limit")
        .map(|v| number("limit", v))
        .transpose()?
        .unwrap_or(max);
    if limit == 0 || limit > max {
        return Err(bad(format!("limit is 1 to {max}; page on with offset")));
    }
    let offset: u64 = q
        .get("offset")
        .map(|v| number("offset", v))
        .transpose()?
        .unwrap_or(0);
    Ok(Page {
        offset: usize::try_from(offset).unwrap_or(usize::MAX),
        limit: usize::try_from(limit).unwrap_or(usize::MAX),
    })
}

/// The page of `query` for list route `req`; none for other routes.
pub fn page(req: &Request, query: &str) -> Result<Option<Page>, HttpError> {
    if list_key(req).is_none() {
        return Ok(None);
    }
    page_of(&query_map(query)?).map(Some)
}

/// Cuts the list of a reply to `page`, and says how many there are (`total`) and where the
/// next page starts (`next_offset`, when there is one).
pub fn apply_page(req: &Request, page: Page, v: &mut Value) {
    let Some(key) = list_key(req) else { return };
    let Some(a) = v.get_mut(key).and_then(Value::as_array_mut) else {
        return;
    };
    let total = a.len();
    let start = page.offset.min(total);
    let end = start.saturating_add(page.limit).min(total);
    let kept: Vec<Value> = a.drain(start..end).collect();
    *a = kept;
    v["total"] = json!(total);
    if end < total {
        v["next_offset"] = json!(end);
    }
}

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

/// The parameters of `query`, percent-decoded (`form_urlencoded`, as browsers and HTTP
/// clients encode them; `+` is a space). A parameter given twice, a `%` not followed by two
/// hex digits, or bytes that are not UTF-8 once decoded are a 400 that says so.
fn query_map(query: &str) -> Result<BTreeMap<String, String>, HttpError> {
    let raw = query.as_bytes();
    if let Some(at) = raw.iter().enumerate().find_map(|(i, b)| {
        let hex = |j: usize| raw.get(j).is_some_and(u8::is_ascii_hexdigit);
        (*b == b'%' && !(hex(i + 1) && hex(i + 2))).then_some(i)
    }) {
        let near: String = query[at..].chars().take(3).collect();
        return Err(bad(format!(
            "malformed percent-encoding '{near}' in the query: '%' is followed by two hex \
             digits (encode a literal '%' as %25)"
        )));
    }
    let mut m = BTreeMap::new();
    for (k, v) in form_urlencoded::parse(raw) {
        // Decoding replaces bytes that are not UTF-8 with U+FFFD; refuse them rather than
        // act on a changed value.
        if (k.contains('\u{fffd}') || v.contains('\u{fffd}')) && !query.contains('\u{fffd}') {
            return Err(bad(format!(
                "query parameter '{}' is not UTF-8 once percent-decoded",
                k.escape_default()
            )));
        }
        let k = k.into_owned();
        if m.contains_key(&k) {
            return Err(bad(format!("query parameter '{k}' is given twice")));
        }
        m.insert(k, v.into_owned());
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
        match q.keys().find(|k| !names.contains(&k.as_str())) {
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
            allowed(&["host", "since", "wait", "limit", "offset"])?;
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
            let max = crate::protocol::MAX_PAGE;
            if n == 0 || n > max {
                return Err(bad(format!(
                    "n is 1 to {max}: the log is read {max} at most"
                )));
            }
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
    if let Endpoint::Op(r, _) = &found {
        if list_key(r).is_some() {
            page_of(&q)?;
        }
        if !takes_query {
            allowed(if list_key(r).is_some() {
                &["limit", "offset"]
            } else {
                &[]
            })?;
        }
    } else {
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

// ---- the server ---------------------------------------------------------------------------

type Reply = hyper::Response<Full<Bytes>>;

struct Ctx {
    daemon: Arc<Mutex<Daemon>>,
    /// Changes when the daemon adds notices ([`Daemon::notices`]).
    notices: tokio::sync::watch::Receiver<u64>,
    principals: Arc<Principals>,
    max_body: usize,
    body_timeout: Duration,
    http: Arc<crate::metrics::HttpStats>,
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
    // A long listen queue: connections opened while the API thread is busy (a burst of
    // handshakes) wait there instead of having their SYN dropped and retried a second
    // later. listen(2) again on a listening socket sets its backlog; the kernel caps it at
    // net.core.somaxconn.
    {
        use std::os::fd::AsRawFd;
        // SAFETY: listen(2) on the descriptor `listener` owns and keeps open.
        if unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("[api] listen {}: {e}", cfg.listen));
        }
    }
    let addr = listener
        .local_addr()
        .map_err(|e| format!("[api] listen {}: {e}", cfg.listen))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the API's runtime: {e}"))?;
    let (notices, http) = {
        let d = daemon
            .lock()
            .map_err(|_| "the daemon's lock is poisoned".to_string())?;
        (d.notices(), d.http.clone())
    };
    let redfish = Arc::new(redfish::serve::Ctx::new(
        daemon.clone(),
        principals.clone(),
        cfg,
        http.clone(),
    )?);
    let conns = conns::Conns::new(
        cfg.max_connections,
        cfg.max_connections_per_peer,
        http.clone(),
    );
    let ctx = Arc::new(Ctx {
        daemon,
        notices,
        principals,
        max_body: cfg.max_body,
        body_timeout: Duration::from_secs(cfg.body_timeout_s),
        http,
        redfish,
    });
    let timeout = Duration::from_secs(cfg.client_timeout_s);
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
                    let (tcp, peer) = match listener.accept().await {
                        Ok(c) => c,
                        Err(e) => {
                            eprintln!("pcifab-manager: API accept: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    // Admitted at once, or waiting (bounded in number and time) for a
                    // place without holding up the next accept (crate::api::conns).
                    let Some(pending) = conns.pend() else {
                        conns.refused();
                        drop(tcp);
                        continue;
                    };
                    let conns = conns.clone();
                    let acceptor = acceptor.clone();
                    let ctx = ctx.clone();
                    tokio::spawn(async move {
                        let Some(slot) = conns.admit_waiting(peer.ip()).await else {
                            return;
                        };
                        drop(pending);
                        let slot = Arc::new(slot);
                        let evicted = slot.evicted.clone();
                        tokio::select! {
                            () = serve_conn(acceptor, tcp, peer, ctx, timeout, slot) => {}
                            () = evicted.notified() => {}
                        }
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
    slot: Arc<conns::Slot>,
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
            ctx.http.timeouts.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    // A verified client certificate names its principal for the whole connection.
    let cert_cn: Option<Option<String>> = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| common_name(c));
    let ctx2 = ctx.clone();
    let svc = service_fn(move |req| {
        let ctx = ctx2.clone();
        let cn = cert_cn.clone();
        let slot = slot.clone();
        async move {
            let r = handle(req, &ctx, cn, peer, &slot).await;
            ctx.http.response(r.status().as_u16());
            Ok::<_, std::convert::Infallible>(r)
        }
    });
    // The head of every request, and the wait for the next one on a kept-alive connection,
    // must take at most `timeout`.
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .serve_connection(TokioIo::new(tls), svc);
    if let Err(e) = conn.await {
        if e.is_timeout() {
            ctx.http.timeouts.fetch_add(1, Ordering::Relaxed);
        } else if !e.is_incomplete_message() {
            eprintln!("pcifab-manager: API {peer}: {e}");
        }
    }
}

/// The bearer token: `Authorization: Bearer TOKEN` (the scheme in any case, RFC 7235), or
/// Redfish's `X-Auth-Token: TOKEN`.
fn bearer(headers: &header::HeaderMap) -> Option<Result<String, Denied>> {
    let Some(v) = headers.get(header::AUTHORIZATION) else {
        let t = headers.get("x-auth-token")?;
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
        .map(str::trim_start)
        .and_then(|s| s.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .filter(|t| !t.is_empty());
    Some(t.map(String::from).ok_or_else(|| {
        Denied::Unauthenticated("the Authorization header is not `Bearer TOKEN`".into())
    }))
}

/// Who asks, from the request's head alone: a bearer token wins over the certificate (a
/// host's certificate may carry an operator's token).
fn principal_of(
    ctx: &Ctx,
    headers: &header::HeaderMap,
    cert_cn: Option<Option<String>>,
) -> Result<Principal, Denied> {
    match (bearer(headers), cert_cn) {
        (Some(Ok(t)), _) => ctx.principals.by_token(&t),
        (Some(Err(d)), _) => Err(d),
        (None, Some(Some(cn))) => ctx.principals.by_name(&cn),
        (None, Some(None)) => Err(Denied::Unauthenticated(
            "the client certificate has no common name".into(),
        )),
        (None, None) => Err(Denied::Unauthenticated(
            "no client certificate and no bearer token: present one (Documentation/manager-api.rst)"
                .into(),
        )),
    }
}

/// A refusal sent before the body is read: the connection closes after it, so the body
/// left unread cannot be taken for the next request.
fn closing(mut r: Reply) -> Reply {
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

async fn handle(
    req: hyper::Request<Incoming>,
    ctx: &Arc<Ctx>,
    cert_cn: Option<Option<String>>,
    peer: SocketAddr,
    slot: &conns::Slot,
) -> Reply {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let what = format!("{method} {path}");
    if method == Method::GET && path == "/v1/openapi.json" {
        return reply(200, "application/json", OPENAPI);
    }
    if path == "/redfish" || path.starts_with("/redfish/") {
        // Redfish authenticates in its own ways (sessions, Basic) before it reads a body.
        let cert = cert_cn.map(|cn| match cn {
            Some(cn) => ctx.principals.by_name(&cn),
            None => Err(Denied::Unauthenticated(
                "the client certificate has no common name".into(),
            )),
        });
        let _serving = slot.serving();
        return redfish::serve::serve(req, ctx.redfish.clone(), cert, peer).await;
    }
    // Everything is decided from the head before a byte of the body is read: who asks
    // (a stranger's body is never read), and whether the announced body may be that large.
    let principal = principal_of(ctx, req.headers(), cert_cn);
    if let Err(d) = &principal {
        eprintln!(
            "pcifab-manager: API {peer}: refused {what}: {} {}",
            d.status(),
            d.reason()
        );
        return closing(error_reply(d.status(), d.reason()));
    }
    let too_large = || {
        closing(error_reply(
            413,
            &format!(
                "the body is larger than {} bytes ([api] max_body)",
                ctx.max_body
            ),
        ))
    };
    let key = match req.headers().get(IDEMPOTENCY_KEY).map(|v| v.to_str()) {
        None => None,
        Some(Ok(k)) => match crate::store::check_key(k) {
            Ok(()) => Some(k.to_string()),
            Err(e) => {
                return closing(error_reply(
                    400,
                    &format!("the Idempotency-Key header: {e}"),
                ))
            }
        },
        Some(Err(_)) => {
            return closing(error_reply(
                400,
                "the Idempotency-Key header is not text: send 1 to 128 characters of A-Z a-z \
                 0-9 . _ : -",
            ))
        }
    };
    let announced = req.body().size_hint().upper().unwrap_or(0);
    if announced > ctx.max_body as u64 {
        return too_large();
    }
    let limited = Limited::new(req.into_body(), ctx.max_body);
    let body = match tokio::time::timeout(ctx.body_timeout, limited.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => return closing(error_reply(400, &format!("cannot read the body: {e}"))),
        Err(_) => {
            ctx.http.timeouts.fetch_add(1, Ordering::Relaxed);
            return closing(error_reply(
                408,
                &format!(
                    "the body did not come within {:?} ([api] body_timeout_s)",
                    ctx.body_timeout
                ),
            ));
        }
    };
    // From here the connection serves a request: it is not evicted for a newcomer.
    let _serving = slot.serving();
    let principal = match principal {
        Ok(p) => p,
        Err(d) => return error_reply(d.status(), d.reason()),
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
    let paged = match page(&op, &query) {
        Ok(p) => p,
        Err(HttpError(status, msg)) => return error_reply(status, &msg),
    };
    let deadline = Instant::now() + wait;
    let mut notices = ctx.notices.clone();
    loop {
        // Seen before the daemon is asked: a notice added after this wakes the wait below.
        notices.borrow_and_update();
        let d = ctx.daemon.clone();
        let (p, op2, key2) = (principal.clone(), op.clone(), key.clone());
        let r = tokio::task::spawn_blocking(move || {
            let mut d = d.lock().ok()?;
            Some(d.serve_keyed(&p, op2, key2.as_deref()))
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
        let mut v = v;
        if let (200, Some(p)) = (status, paged) {
            apply_page(&op, p, &mut v);
        }
        return json_reply(status, &v);
    }
}

pub mod conns;

#[cfg(test)]
mod tests;
