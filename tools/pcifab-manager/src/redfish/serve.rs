// SPDX-License-Identifier: GPL-2.0-only

//! The HTTP side of the Redfish view: who asks (a session's `X-Auth-Token`, HTTP Basic, a
//! bearer token or the client certificate), then the resource, its method, and the reply
//! with the headers Redfish asks for (`OData-Version`, `ETag`, `Allow`, `Link`,
//! `Cache-Control`, `WWW-Authenticate` on a 401). A zone PATCH is checked against the zone's
//! `ETag` (`If-Match`) and carried out under the daemon's lock, so nothing changes the zone
//! between the two.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    body::{Body as _, Incoming},
    header, HeaderMap, StatusCode,
};
use serde_json::Value;

use super::{err, users::Sessions, users::Users, Action, Error, Resource, View};
use crate::{
    auth::{Denied, Principal, Principals, Role},
    daemon::Daemon,
    protocol::Request,
};

/// The Redfish service's own state: its users and open sessions.
#[derive(Debug)]
pub struct Service {
    pub users: Users,
    pub sessions: Sessions,
}

/// Default session timeout in seconds.
pub use crate::config::SESSION_TIMEOUT_S;

impl Service {
    pub fn new(users: Users, session_timeout: Duration) -> Self {
        Self {
            users,
            sessions: Sessions::new(session_timeout),
        }
    }
}

type Reply = hyper::Response<Full<Bytes>>;

/// What the server hands a Redfish request.
pub struct Ctx {
    pub daemon: Arc<Mutex<Daemon>>,
    pub principals: Arc<Principals>,
    pub service: Arc<Service>,
    pub max_body: usize,
    /// How long a body may take to arrive (`[api] body_timeout_s`).
    pub body_timeout: Duration,
    pub http: Arc<crate::metrics::HttpStats>,
}

impl Ctx {
    /// The Redfish side of the API of `cfg`: its users file read and checked.
    pub fn new(
        daemon: Arc<Mutex<Daemon>>,
        principals: Arc<Principals>,
        cfg: &crate::config::ApiConfig,
        http: Arc<crate::metrics::HttpStats>,
    ) -> Result<Self, String> {
        let users = match &cfg.redfish.users {
            Some(f) => Users::load(f, &principals)?,
            None => Users::default(),
        };
        Ok(Self {
            daemon,
            principals,
            service: Arc::new(Service::new(
                users,
                Duration::from_secs(cfg.redfish.session_timeout_s),
            )),
            max_body: cfg.max_body,
            body_timeout: Duration::from_secs(cfg.body_timeout_s),
            http,
        })
    }
}

/// Who asks.
struct Who {
    principal: Principal,
}

fn set(r: &mut Reply, name: &'static str, value: &str) {
    if let Ok(v) = header::HeaderValue::from_str(value) {
        r.headers_mut().insert(name, v);
    }
}

fn base(status: u16, ctype: &str, body: Bytes) -> Reply {
    let mut r = hyper::Response::new(Full::new(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    set(&mut r, "content-type", ctype);
    set(&mut r, "odata-version", "4.0");
    set(&mut r, "cache-control", "no-cache");
    r
}

fn error_reply(e: &Error, allow: &str) -> Reply {
    let mut r = base(
        e.status,
        "application/json;charset=utf-8",
        format!("{}\n", super::error_body(e)).into(),
    );
    if e.status == 401 {
        set(&mut r, "www-authenticate", "Basic realm=\"pcifab-manager\"");
    }
    if e.status == 405 {
        set(&mut r, "allow", allow);
    }
    r
}

/// A resource's reply: its `ETag`, `Allow` and `Link` headers; no body for a HEAD.
fn resource_reply(status: u16, v: &Value, allow: &str, head: bool) -> Reply {
    let body = if head {
        Bytes::new()
    } else {
        format!("{v}\n").into()
    };
    let mut r = base(status, "application/json;charset=utf-8", body);
    set(&mut r, "allow", allow);
    if v.get("@odata.id").is_some() {
        set(&mut r, "etag", &super::etag(v));
    }
    if let Some(s) = super::described_by(v) {
        set(&mut r, "link", &format!("<{s}>; rel=describedby"));
    }
    r
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn denied(d: &Denied) -> Error {
    match d {
        Denied::Unauthenticated(m) => err(401, "NoValidSession", m.clone()),
        Denied::Forbidden(m) => err(403, "InsufficientPrivilege", m.clone()),
    }
}

/// Who sends a request with `headers` (and the connection's client certificate).
async fn authenticate(
    ctx: &Ctx,
    headers: &HeaderMap,
    cert: Option<Result<Principal, Denied>>,
) -> Result<Who, Error> {
    let no_session = |m: &str| err(401, "NoValidSession", m.to_string());
    if let Some(t) = headers.get("x-auth-token") {
        let t = t.to_str().map(str::trim).unwrap_or_default();
        if t.is_empty() {
            return Err(no_session("the X-Auth-Token header is empty"));
        }
        if let Some((_, user)) = ctx.service.sessions.by_token(t, Instant::now()) {
            let principal = ctx.principals.by_name(&user).map_err(|d| denied(&d))?;
            return Ok(Who { principal });
        }
        return match ctx.principals.by_token(t) {
            Ok(principal) => Ok(Who { principal }),
            Err(_) => Err(no_session(
                "the X-Auth-Token is no open session's (it may have timed out or been \
                 deleted) and no principal's token: log in again",
            )),
        };
    }
    if let Some(a) = headers.get(header::AUTHORIZATION) {
        let a = a.to_str().unwrap_or_default();
        if let Some(b) = a.strip_prefix("Basic ") {
            let (user, password) = B64
                .decode(b.trim())
                .ok()
                .and_then(|d| String::from_utf8(d).ok())
                .and_then(|s| {
                    s.split_once(':')
                        .map(|(u, p)| (u.to_string(), p.to_string()))
                })
                .ok_or_else(|| {
                    no_session("the Authorization header is not `Basic base64(USER:PASSWORD)`")
                })?;
            let principal = check_password(ctx, &user, &password).await?;
            return Ok(Who { principal });
        }
        if let Some(t) = a.strip_prefix("Bearer ") {
            let principal = ctx.principals.by_token(t.trim()).map_err(|d| denied(&d))?;
            return Ok(Who { principal });
        }
        return Err(no_session(
            "the Authorization header is neither `Basic …` nor `Bearer …`",
        ));
    }
    match cert {
        Some(Ok(principal)) => Ok(Who { principal }),
        Some(Err(d)) => Err(denied(&d)),
        None => Err(no_session(
            "no credentials: log in (POST /redfish/v1/SessionService/Sessions) and send the \
             X-Auth-Token, or use HTTP Basic, a bearer token or a client certificate",
        )),
    }
}

/// The principal of `user` when `password` is theirs (the hash is worked out off the
/// server's thread).
async fn check_password(ctx: &Ctx, user: &str, password: &str) -> Result<Principal, Error> {
    let bad = || {
        err(
            401,
            "AccessDenied",
            format!(
                "the user name or password is wrong (users: [api.redfish] users in the \
                 manager's configuration){}",
                if ctx.service.users.is_empty() {
                    "; this manager has no Redfish users"
                } else {
                    ""
                }
            ),
        )
    };
    let svc = ctx.service.clone();
    let (u, p) = (user.to_string(), password.to_string());
    let ok = tokio::task::spawn_blocking(move || svc.users.verify(&u, &p))
        .await
        .unwrap_or(false);
    if !ok {
        return Err(bad());
    }
    ctx.principals.by_name(user).map_err(|_| bad())
}

/// Serves one Redfish request.
pub async fn serve(
    req: hyper::Request<Incoming>,
    ctx: Arc<Ctx>,
    cert: Option<Result<Principal, Denied>>,
    peer: SocketAddr,
) -> Reply {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers = req.headers().clone();
    let head = method == "HEAD";
    let log = |e: &Error, who: &str| {
        eprintln!(
            "pcifab-manager: API {peer} ({who}): refused {method} {path}: {} {}",
            e.status, e.msg
        );
    };
    let r = match super::resource(&path) {
        Ok(r) => r,
        Err(e) => {
            log(&e, "-");
            return error_reply(&e, "");
        }
    };
    let allow = r.allow();
    let who = if r.public(&method) {
        None
    } else {
        match authenticate(&ctx, &headers, cert).await {
            Ok(w) => Some(w),
            Err(e) => {
                log(&e, "-");
                return error_reply(&e, allow);
            }
        }
    };
    let name = who
        .as_ref()
        .map_or("-".to_string(), |w| w.principal.name.clone());
    let fail = |e: Error| {
        log(&e, &name);
        error_reply(&e, allow)
    };
    if let Some(v) = header_str(&headers, "odata-version") {
        if v.trim() != "4.0" {
            return fail(err(
                412,
                "PreconditionFailed",
                format!("OData-Version {v} is not served; this service speaks 4.0"),
            ));
        }
    }
    // Percent-decoded, so that `%24expand` is `$expand` too.
    if let Some((k, _)) = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k.starts_with('$'))
    {
        return fail(err(
            501,
            "QueryNotSupported",
            format!("the query parameter {k} is not supported by this service"),
        ));
    }
    // A refusal before the body is read closes the connection, so the unread body cannot be
    // taken for the next request.
    let closing = |mut r: Reply| {
        set(&mut r, "connection", "close");
        r
    };
    let too_large = || {
        err(
            413,
            "GeneralError",
            format!(
                "the body is larger than {} bytes ([api] max_body)",
                ctx.max_body
            ),
        )
    };
    if req.body().size_hint().upper().unwrap_or(0) > ctx.max_body as u64 {
        return closing(fail(too_large()));
    }
    let limited = Limited::new(req.into_body(), ctx.max_body);
    let body = match tokio::time::timeout(ctx.body_timeout, limited.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return closing(fail(too_large()))
        }
        Ok(Err(e)) => {
            return closing(fail(err(
                400,
                "MalformedJSON",
                format!("cannot read the body: {e}"),
            )))
        }
        Err(_) => {
            ctx.http
                .timeouts
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return closing(fail(err(
                408,
                "GeneralError",
                format!(
                    "the body did not come within {:?} ([api] body_timeout_s)",
                    ctx.body_timeout
                ),
            )));
        }
    };
    let action = match super::action(&method, &r, &body) {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let ok = |v: &Value| resource_reply(200, v, allow, head);
    match (&r, action) {
        (Resource::Versions, _) => ok(&super::versions()),
        (Resource::Root, _) => ok(&super::service_root()),
        (Resource::OData, _) => ok(&super::odata()),
        (Resource::Metadata, _) => {
            let x = super::metadata();
            let mut rep = base(
                200,
                "application/xml;charset=utf-8",
                if head { Bytes::new() } else { x.into() },
            );
            set(&mut rep, "allow", allow);
            rep
        }
        (Resource::SessionService, _) => ok(&super::session_service(
            ctx.service.sessions.timeout().as_secs(),
        )),
        (Resource::Sessions | Resource::SessionMembers, Action::Login { user, password }) => {
            let principal = match check_password(&ctx, &user, &password).await {
                Ok(p) => p,
                Err(e) => return fail(e),
            };
            let Some((id, token)) = ctx.service.sessions.create(&user, Instant::now()) else {
                return fail(err(
                    503,
                    "SessionLimitExceeded",
                    format!(
                        "{} sessions are open, the most this service keeps; log out of one \
                         or wait for one to time out",
                        super::users::MAX_SESSIONS
                    ),
                ));
            };
            eprintln!(
                "pcifab-manager: API {peer} ({}): Redfish session {id} opened",
                principal.name
            );
            let v = super::session(&id, &user);
            let mut rep = resource_reply(201, &v, allow, false);
            set(&mut rep, "x-auth-token", &token);
            set(&mut rep, "location", &format!("{}/{id}", super::SESSIONS));
            rep
        }
        (r, Action::Get) if who.is_none() => {
            // Only the public resources above come here without credentials.
            fail(err(500, "GeneralError", format!("{r:?} needs credentials")))
        }
        (Resource::Sessions, Action::Get) => {
            let w = who.as_ref().map(|w| &w.principal);
            let ids: Vec<String> = ctx
                .service
                .sessions
                .list(Instant::now())
                .into_iter()
                .filter(|(_, u)| w.is_some_and(|p| p.role == Role::Admin || &p.name == u))
                .map(|(i, _)| i)
                .collect();
            ok(&super::sessions(&ids))
        }
        (Resource::AccountService, _) => ok(&super::account_service()),
        (Resource::Roles, _) => ok(&super::roles()),
        (Resource::Role(r), _) => match super::role(r) {
            Some(v) => ok(&v),
            None => fail(err(404, "ResourceNotFound", format!("no such role: {r}"))),
        },
        (Resource::Accounts, _) => {
            // An admin sees every user; anyone else, their own account.
            let p = who.as_ref().map(|w| &w.principal);
            let names: Vec<String> = ctx
                .service
                .users
                .names()
                .into_iter()
                .filter(|n| p.is_some_and(|p| p.role == Role::Admin || &p.name == n))
                .collect();
            ok(&super::accounts(&names))
        }
        (Resource::Account(n), _) => {
            let p = who.as_ref().map(|w| &w.principal);
            let visible = p.is_some_and(|p| p.role == Role::Admin || &p.name == n)
                && ctx.service.users.names().contains(n);
            match ctx.principals.by_name(n) {
                Ok(u) if visible => ok(&super::account(n, u.role)),
                _ => fail(err(
                    404,
                    "ResourceNotFound",
                    format!("no such account: {n}"),
                )),
            }
        }
        (Resource::Session(id), action) => {
            let now = Instant::now();
            let p = who.as_ref().map(|w| &w.principal);
            let user = ctx.service.sessions.user(id, now);
            let mine = |u: &String| p.is_some_and(|p| &p.name == u);
            let admin = p.is_some_and(|p| p.role == Role::Admin);
            match user {
                Some(u) if mine(&u) || admin => match action {
                    Action::Logout(_) => {
                        ctx.service.sessions.delete(id, now);
                        eprintln!(
                            "pcifab-manager: API {peer} ({name}): Redfish session {id} closed"
                        );
                        let mut rep = base(204, "application/json;charset=utf-8", Bytes::new());
                        set(&mut rep, "allow", allow);
                        rep
                    }
                    _ => ok(&super::session(id, &u)),
                },
                Some(_) if matches!(action, Action::Logout(_)) => fail(err(
                    403,
                    "InsufficientPrivilege",
                    format!("session {id} is another user's: only an admin ends others' sessions"),
                )),
                _ => fail(err(
                    404,
                    "ResourceNotFound",
                    format!("no such session: {}/{id}", super::SESSIONS),
                )),
            }
        }
        (Resource::Fabric(seg), action) => {
            let Some(w) = who else {
                return fail(err(500, "GeneralError", "no principal"));
            };
            let if_match = header_str(&headers, "if-match").map(String::from);
            let if_none_match = header_str(&headers, "if-none-match").map(String::from);
            let d = ctx.daemon.clone();
            let seg = seg.clone();
            let p = w.principal.clone();
            let r = tokio::task::spawn_blocking(move || {
                let mut d = d.lock().ok()?;
                Some(fabric(&mut d, &p, seg, action, if_match.as_deref()))
            })
            .await;
            match r {
                Ok(Some(Ok(v))) => {
                    let tag = super::etag(&v);
                    if if_none_match.is_some_and(|h| super::if_match(&h, &tag)) {
                        let mut rep = base(304, "application/json;charset=utf-8", Bytes::new());
                        set(&mut rep, "etag", &tag);
                        return rep;
                    }
                    ok(&v)
                }
                Ok(Some(Err(e))) => fail(e),
                _ => fail(err(
                    500,
                    "GeneralError",
                    "the manager failed internally; restart it",
                )),
            }
        }
        (_, _) => fail(err(
            405,
            "OperationNotAllowed",
            format!("this resource takes {allow}"),
        )),
    }
}

/// The fabric's view as principal `p` sees it: three reads, not counted in the metrics on
/// their own (a Redfish request counts once, as `redfish`, or as the `compose` it makes).
fn view(d: &mut Daemon, p: &Principal) -> Result<View, Error> {
    let mut get = |r: Request| {
        d.serve_uncounted(p, r)
            .map(|(_, v)| v)
            .map_err(|e| denied(&e))
    };
    Ok(View {
        hosts: get(Request::Hosts)?,
        pool: get(Request::Pool)?,
        leases: get(Request::Leases)?,
    })
}

/// A fabric resource's GET or a zone's PATCH, under the daemon's lock.
fn fabric(
    d: &mut Daemon,
    p: &Principal,
    seg: Vec<String>,
    action: Action,
    if_match: Option<&str>,
) -> Result<Value, Error> {
    let missing = || {
        err(
            404,
            "ResourceNotFound",
            format!(
                "no such Redfish resource: {}/{}",
                super::ROOT,
                seg.join("/")
            ),
        )
    };
    let t = std::time::Instant::now();
    let v = view(d, p);
    let Action::PatchZone { zone, endpoints } = action else {
        let now = v.and_then(|v| super::render(&seg, &v).ok_or_else(missing));
        let outcome = if now.is_ok() { "ok" } else { "refused" };
        d.stats.record_op("redfish", outcome, t.elapsed());
        return now;
    };
    let v = v?;
    let now = super::render(&seg, &v).ok_or_else(missing)?;
    if let Some(h) = if_match {
        let tag = super::etag(&now);
        if !super::if_match(h, &tag) {
            return Err(err(
                412,
                "PreconditionFailed",
                format!(
                    "If-Match {h} is not the zone's ETag {tag}: it changed since it was read; \
                     GET it again"
                ),
            ));
        }
    }
    let req = super::compose_of(&v, &zone, &endpoints)?;
    match d.serve(p, req) {
        Ok((served, reply)) => {
            let status = crate::protocol::status_of(&served, &reply);
            if status != 200 {
                let msg = reply["error"].as_str().unwrap_or("refused").to_string();
                return Err(if status == 409 {
                    err(409, "ResourceInUse", msg)
                } else {
                    err(500, "GeneralError", msg)
                });
            }
        }
        Err(e) => return Err(denied(&e)),
    }
    let v = view(d, p)?;
    super::render(&seg, &v).ok_or_else(missing)
}
