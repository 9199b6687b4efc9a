// SPDX-License-Identifier: GPL-2.0-only

//! A Redfish view of the fabric (`/redfish/v1`), for the tools data-centre operators already
//! have: the service root, the fabric `PCIe` with its switch and ports, its endpoints (one
//! initiator per host, one target per pool function), a zone per host holding what that host
//! holds, and a connection per lease; a session service (login by user name and password,
//! [`users`]), `$metadata` and the OData service document. Composing is a PATCH of a zone's
//! endpoints; it becomes the manager's `compose` operation, so the scheduler and its policy
//! decide as for any other request. `Documentation/manager-api.rst` ("Redfish") describes
//! the mapping.
//!
//! This module turns paths into resources and the manager's own replies (pools, hosts,
//! leases) into Redfish resources; it does no I/O and holds no lock. [`serve`] is the HTTP
//! side.

use serde_json::{json, Map, Value};

use crate::protocol::Request;
use crate::scheduler::{Host, Pdfid};

pub mod serve;
pub mod users;

/// Where the tree starts.
pub const ROOT: &str = "/redfish/v1";
const FABRIC: &str = "/redfish/v1/Fabrics/PCIe";
const SWITCH: &str = "pax0";
/// The session collection.
pub const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
/// The version of the `Base` message registry the error codes come from.
const BASE: &str = "Base.1.16";

/// A Redfish error: status, the `Base` registry's message key, and what went wrong.
#[derive(Debug, PartialEq)]
pub struct Error {
    pub status: u16,
    pub key: &'static str,
    pub msg: String,
}

/// An error of `status` with `key` (a `Base` message) saying `msg`.
pub fn err(status: u16, key: &'static str, msg: impl Into<String>) -> Error {
    Error {
        status,
        key,
        msg: msg.into(),
    }
}

/// What a Redfish URI names (whether it exists is decided with the fabric's view).
#[derive(Clone, Debug, PartialEq)]
pub enum Resource {
    /// `/redfish`: the versions.
    Versions,
    Root,
    /// `/redfish/v1/odata`: the OData service document.
    OData,
    /// `/redfish/v1/$metadata`: the CSDL document.
    Metadata,
    SessionService,
    Sessions,
    /// `Sessions/Members`: logging in by a POST to the collection's members.
    SessionMembers,
    Session(String),
    AccountService,
    Accounts,
    Account(String),
    Roles,
    Role(String),
    /// Below `/redfish/v1/Fabrics`: the path's segments from `Fabrics` on.
    Fabric(Vec<String>),
}

impl Resource {
    /// The methods it takes (the `Allow` header).
    pub fn allow(&self) -> &'static str {
        match self {
            Resource::Sessions => "GET, HEAD, POST",
            Resource::SessionMembers => "POST",
            Resource::Session(_) => "GET, HEAD, DELETE",
            Resource::Fabric(s) if zone_of(s).is_some() => "GET, HEAD, PATCH",
            _ => "GET, HEAD",
        }
    }

    /// Whether `method` on it needs no credentials: the versions, the service root, the
    /// OData documents, and logging in.
    pub fn public(&self, method: &str) -> bool {
        match self {
            Resource::Versions | Resource::Root | Resource::OData | Resource::Metadata => {
                method == "GET" || method == "HEAD"
            }
            Resource::Sessions | Resource::SessionMembers => method == "POST",
            _ => false,
        }
    }
}

/// The zone a fabric path names (`Fabrics/PCIe/Zones/Z`).
fn zone_of(seg: &[String]) -> Option<&str> {
    match seg {
        [f, p, z, id] if f == "Fabrics" && p == "PCIe" && z == "Zones" => Some(id),
        _ => None,
    }
}

/// The resource `path` names; a 404 when it is none of this service's.
pub fn resource(path: &str) -> Result<Resource, Error> {
    let missing = || {
        err(
            404,
            "ResourceNotFound",
            format!("no such Redfish resource: {path}"),
        )
    };
    if path == "/redfish" || path == "/redfish/" {
        return Ok(Resource::Versions);
    }
    let rest = path.strip_prefix(ROOT).ok_or_else(missing)?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return Err(missing());
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let seg: Vec<String> = rest.split('/').skip(1).map(String::from).collect();
    if seg.iter().any(String::is_empty) {
        return Err(missing());
    }
    let s: Vec<&str> = seg.iter().map(String::as_str).collect();
    Ok(match s.as_slice() {
        [] => Resource::Root,
        ["odata"] => Resource::OData,
        ["$metadata"] => Resource::Metadata,
        ["SessionService"] => Resource::SessionService,
        ["SessionService", "Sessions"] => Resource::Sessions,
        ["SessionService", "Sessions", "Members"] => Resource::SessionMembers,
        ["SessionService", "Sessions", id] => Resource::Session(id.to_string()),
        ["AccountService"] => Resource::AccountService,
        ["AccountService", "Accounts"] => Resource::Accounts,
        ["AccountService", "Accounts", id] => Resource::Account(id.to_string()),
        ["AccountService", "Roles"] => Resource::Roles,
        ["AccountService", "Roles", id] => Resource::Role(id.to_string()),
        ["Fabrics", ..] => Resource::Fabric(seg),
        _ => return Err(missing()),
    })
}

/// What a request does to its resource.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// GET (or HEAD, the same without the body).
    Get,
    /// POST to the sessions: log in.
    Login { user: String, password: String },
    /// DELETE of a session: log out.
    Logout(String),
    /// PATCH of a zone: the endpoints (URIs) it is to hold.
    PatchZone {
        zone: String,
        endpoints: Vec<String>,
    },
}

/// The action of `method` on `r` with `body` (a GET's body is ignored); a 405 when `r` does
/// not take `method` (the reply's `Allow` says which it takes).
pub fn action(method: &str, r: &Resource, body: &[u8]) -> Result<Action, Error> {
    match (method, r) {
        ("GET" | "HEAD", r) if *r != Resource::SessionMembers => Ok(Action::Get),
        ("POST", Resource::Sessions | Resource::SessionMembers) => login(body),
        ("DELETE", Resource::Session(id)) => Ok(Action::Logout(id.clone())),
        ("PATCH", Resource::Fabric(seg)) if zone_of(seg).is_some() => Ok(Action::PatchZone {
            zone: zone_of(seg).unwrap_or_default().to_string(),
            endpoints: zone_patch(body)?,
        }),
        _ => Err(err(
            405,
            "OperationNotAllowed",
            format!(
                "this resource does not take {method}; it takes {} (only a zone's \
                 Links.Endpoints may be PATCHed)",
                r.allow()
            ),
        )),
    }
}

fn object(body: &[u8], what: &str) -> Result<Map<String, Value>, Error> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(err(400, "MalformedJSON", format!("the body is not {what}"))),
        Err(e) => Err(err(
            400,
            "MalformedJSON",
            format!("the body is not JSON ({e}); it is {what}"),
        )),
    }
}

/// A login's body: `{"UserName": NAME, "Password": PASSWORD}`.
fn login(body: &[u8]) -> Result<Action, Error> {
    let what = "{\"UserName\": NAME, \"Password\": PASSWORD}";
    let m = object(body, what)?;
    let text = |k: &str| match m.get(k) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(err(
            400,
            "PropertyValueTypeError",
            format!("{k} is a string: {what}"),
        )),
        None => Err(err(
            400,
            "PropertyMissing",
            format!("the body has no {k}: {what}"),
        )),
    };
    Ok(Action::Login {
        user: text("UserName")?,
        password: text("Password")?,
    })
}

/// A zone PATCH's body: `{"Links": {"Endpoints": [{"@odata.id": URI}, ...]}}`; OData
/// annotations (`@odata.*`) are ignored, any other property is a 400 naming it.
fn zone_patch(body: &[u8]) -> Result<Vec<String>, Error> {
    let what = "{\"Links\": {\"Endpoints\": [{\"@odata.id\": URI}, ...]}}";
    let m = object(body, what)?;
    let unknown = |k: &str, at: &str| {
        err(
            400,
            "PropertyUnknown",
            format!("the property {k} is not known here{at}; a zone PATCH is {what}"),
        )
    };
    if let Some(k) = m
        .keys()
        .find(|k| *k != "Links" && !k.starts_with("@odata."))
    {
        return Err(unknown(k, ""));
    }
    let Some(links) = m.get("Links") else {
        return Err(err(
            400,
            "NoOperation",
            format!("the body changes nothing; a zone PATCH is {what}"),
        ));
    };
    let Value::Object(links) = links else {
        return Err(err(
            400,
            "PropertyValueTypeError",
            format!("Links is an object: {what}"),
        ));
    };
    if let Some(k) = links.keys().find(|k| *k != "Endpoints") {
        return Err(unknown(k, " in Links"));
    }
    let Some(Value::Array(eps)) = links.get("Endpoints") else {
        return Err(err(
            400,
            "PropertyValueTypeError",
            format!("Links.Endpoints is a list of links: {what}"),
        ));
    };
    eps.iter()
        .map(|l| match l.as_object() {
            Some(o) if o.len() == 1 => o
                .get("@odata.id")
                .and_then(Value::as_str)
                .map(String::from)
                .ok_or(()),
            _ => Err(()),
        })
        .collect::<Result<Vec<_>, ()>>()
        .map_err(|()| {
            err(
                400,
                "PropertyValueTypeError",
                format!("each of Links.Endpoints is {{\"@odata.id\": URI}}: {what}"),
            )
        })
}

/// The manager's `compose` for a zone PATCH: the zone must be one of the view's (else 404),
/// every endpoint one of the view's (else 400), and the zone's own initiator is the only one
/// it may name.
pub fn compose_of(v: &View, zone: &str, endpoints: &[String]) -> Result<Request, Error> {
    let host = host_of(v, zone).ok_or_else(|| {
        err(
            404,
            "ResourceNotFound",
            format!("no such zone: {FABRIC}/Zones/{zone}"),
        )
    })?;
    let prefix = format!("{FABRIC}/Endpoints/");
    let mut wanted: Vec<Pdfid> = Vec::new();
    for e in endpoints {
        let missing = || {
            err(
                400,
                "ResourceMissingAtURI",
                format!(
                    "{e} is not an endpoint of this fabric (GET {FABRIC}/Endpoints lists them)"
                ),
            )
        };
        let name = e
            .trim_end_matches('/')
            .strip_prefix(&prefix)
            .ok_or_else(missing)?;
        if let Some(h) = name.strip_prefix("host") {
            match host_of(v, h) {
                Some(h) if h == host => continue,
                Some(_) => {
                    return Err(err(
                        400,
                        "PropertyValueConflict",
                        format!("{e} is another host's initiator; a zone holds only its own"),
                    ))
                }
                None => return Err(missing()),
            }
        }
        let f = functions(v)
            .into_iter()
            .find(|(f, _, _)| f == name)
            .and_then(|(f, _, _)| crate::protocol::parse_pdfid(&f))
            .ok_or_else(missing)?;
        wanted.push(f);
    }
    Ok(Request::Compose {
        host,
        functions: wanted,
        priority: 0,
        duration_s: None,
        tenant: None,
        owner: None,
    })
}

/// The manager's replies a Redfish resource is made from (as the principal may see them).
pub struct View {
    pub hosts: Value,
    pub pool: Value,
    pub leases: Value,
}

fn id(path: &str) -> Value {
    json!({ "@odata.id": path })
}

fn collection(path: &str, ty: &str, name: &str, members: Vec<String>) -> Value {
    let m: Vec<Value> = members.iter().map(|p| id(p)).collect();
    json!({
        "@odata.id": path,
        "@odata.type": format!("#{ty}.{ty}"),
        "Name": name,
        "Members@odata.count": m.len(),
        "Members": m,
    })
}

/// A Redfish error body (`Base` message registry).
pub fn error_body(e: &Error) -> Value {
    let code = format!("{BASE}.{}", e.key);
    json!({"error": {
        "code": code,
        "message": e.msg,
        "@Message.ExtendedInfo": [{
            "@odata.type": "#Message.v1_1_1.Message",
            "MessageId": code,
            "Message": e.msg,
            "Severity": if e.status >= 500 { "Critical" } else { "Warning" },
            "MessageSeverity": if e.status >= 500 { "Critical" } else { "Warning" },
        }],
    }})
}

/// `GET /redfish`.
pub fn versions() -> Value {
    json!({ "v1": format!("{ROOT}/") })
}

/// The service root.
pub fn service_root() -> Value {
    json!({
        "@odata.id": format!("{ROOT}/"),
        "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
        "Id": "RootService",
        "Name": "pcifab fabric manager",
        "RedfishVersion": "1.17.0",
        "Fabrics": id(&format!("{ROOT}/Fabrics")),
        "SessionService": id(&format!("{ROOT}/SessionService")),
        "AccountService": id(&format!("{ROOT}/AccountService")),
        "Links": {"Sessions": id(SESSIONS)},
    })
}

/// The OData service document (`/redfish/v1/odata`): the service's top-level resources.
pub fn odata() -> Value {
    let e = |name: &str, url: &str| json!({"name": name, "kind": "Singleton", "url": url});
    json!({
        "@odata.context": format!("{ROOT}/$metadata"),
        "value": [
            e("Service", &format!("{ROOT}/")),
            e("Fabrics", &format!("{ROOT}/Fabrics")),
            e("SessionService", &format!("{ROOT}/SessionService")),
            e("Sessions", SESSIONS),
            e("AccountService", &format!("{ROOT}/AccountService")),
        ],
    })
}

/// The DMTF schemas (and versions) this service's resources use: `$metadata` references
/// them.
const SCHEMAS: &[(&str, &str)] = &[
    ("ServiceRoot", "v1_15_0"),
    ("SessionService", "v1_1_8"),
    ("Session", "v1_3_0"),
    ("SessionCollection", ""),
    ("Fabric", "v1_3_0"),
    ("FabricCollection", ""),
    ("Switch", "v1_9_0"),
    ("SwitchCollection", ""),
    ("Port", "v1_7_0"),
    ("PortCollection", ""),
    ("Endpoint", "v1_8_0"),
    ("EndpointCollection", ""),
    ("Zone", "v1_6_0"),
    ("ZoneCollection", ""),
    ("Connection", "v1_3_0"),
    ("ConnectionCollection", ""),
    ("Message", "v1_1_1"),
    ("AccountService", "v1_12_0"),
    ("ManagerAccount", "v1_10_0"),
    ("ManagerAccountCollection", ""),
    ("Role", "v1_3_1"),
    ("RoleCollection", ""),
    ("Resource", "v1_14_0"),
];

/// The `$metadata` document (OData CSDL 4.0): a reference to each DMTF schema the
/// resources use, and the service's entity container.
pub fn metadata() -> String {
    let mut x = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <edmx:Edmx xmlns:edmx=\"http://docs.oasis-open.org/odata/ns/edmx\" Version=\"4.0\">\n",
    );
    for (ns, v) in SCHEMAS {
        x.push_str(&format!(
            "  <edmx:Reference Uri=\"http://redfish.dmtf.org/schemas/v1/{ns}_v1.xml\">\n"
        ));
        x.push_str(&format!("    <edmx:Include Namespace=\"{ns}\"/>\n"));
        if !v.is_empty() {
            x.push_str(&format!("    <edmx:Include Namespace=\"{ns}.{v}\"/>\n"));
        }
        x.push_str("  </edmx:Reference>\n");
    }
    x.push_str(
        "  <edmx:DataServices>\n\
         \x20   <Schema xmlns=\"http://docs.oasis-open.org/odata/ns/edm\" Namespace=\"Service\">\n\
         \x20     <EntityContainer Name=\"Service\" Extends=\"ServiceRoot.v1_15_0.ServiceContainer\"/>\n\
         \x20   </Schema>\n\
         \x20 </edmx:DataServices>\n\
         </edmx:Edmx>\n",
    );
    x
}

/// The `describedby` schema of a resource: its `@odata.type`'s versioned namespace (the
/// JSON schema DMTF publishes for it).
pub fn described_by(v: &Value) -> Option<String> {
    let t = v["@odata.type"].as_str()?.strip_prefix('#')?;
    let ns = t.rsplit_once('.')?.0;
    Some(format!("http://redfish.dmtf.org/schemas/v1/{ns}.json"))
}

/// The session service (`SessionTimeout` in seconds).
pub fn session_service(timeout_s: u64) -> Value {
    json!({
        "@odata.id": format!("{ROOT}/SessionService"),
        "@odata.type": "#SessionService.v1_1_8.SessionService",
        "Id": "SessionService",
        "Name": "Session Service",
        "ServiceEnabled": true,
        "SessionTimeout": timeout_s,
        "Status": {"State": "Enabled", "Health": "OK"},
        "Sessions": id(SESSIONS),
    })
}

/// A session of `user`.
pub fn session(id: &str, user: &str) -> Value {
    json!({
        "@odata.id": format!("{SESSIONS}/{id}"),
        "@odata.type": "#Session.v1_3_0.Session",
        "Id": id,
        "Name": "User Session",
        "UserName": user,
        "Password": null,
    })
}

/// The session collection of `ids`.
pub fn sessions(ids: &[String]) -> Value {
    collection(
        SESSIONS,
        "SessionCollection",
        "Sessions",
        ids.iter().map(|i| format!("{SESSIONS}/{i}")).collect(),
    )
}

const ACCOUNTS: &str = "/redfish/v1/AccountService/Accounts";
const ROLES: &str = "/redfish/v1/AccountService/Roles";

/// The Redfish role of a manager role: admin is `Administrator`, tenant `Operator` (it
/// composes, its own hosts only), reader `ReadOnly`.
pub fn role_id(r: crate::auth::Role) -> &'static str {
    match r {
        crate::auth::Role::Admin => "Administrator",
        crate::auth::Role::Tenant => "Operator",
        crate::auth::Role::Reader => "ReadOnly",
    }
}

/// The account service: read-only; users and their roles come from the configuration.
pub fn account_service() -> Value {
    json!({
        "@odata.id": format!("{ROOT}/AccountService"),
        "@odata.type": "#AccountService.v1_12_0.AccountService",
        "Id": "AccountService",
        "Name": "Account Service",
        "Description": "Users come from the manager's configuration ([api.redfish] users)",
        "ServiceEnabled": true,
        "HTTPBasicAuth": "Enabled",
        "Status": {"State": "Enabled", "Health": "OK"},
        "Accounts": id(ACCOUNTS),
        "Roles": id(ROLES),
    })
}

/// The accounts collection of `names`.
pub fn accounts(names: &[String]) -> Value {
    collection(
        ACCOUNTS,
        "ManagerAccountCollection",
        "Accounts",
        names.iter().map(|n| format!("{ACCOUNTS}/{n}")).collect(),
    )
}

/// User `name`'s account, with its Redfish role.
pub fn account(name: &str, role: crate::auth::Role) -> Value {
    json!({
        "@odata.id": format!("{ACCOUNTS}/{name}"),
        "@odata.type": "#ManagerAccount.v1_10_0.ManagerAccount",
        "Id": name,
        "Name": format!("user {name}"),
        "UserName": name,
        "RoleId": role_id(role),
        "Enabled": true,
        "Locked": false,
        "Password": null,
        "AccountTypes": ["Redfish"],
        "Links": {"Role": id(&format!("{ROLES}/{}", role_id(role)))},
    })
}

/// The predefined roles' privileges (Redfish's, DSP0266 "Privilege model").
const ROLE_PRIVILEGES: &[(&str, &[&str])] = &[
    (
        "Administrator",
        &[
            "Login",
            "ConfigureManager",
            "ConfigureUsers",
            "ConfigureComponents",
            "ConfigureSelf",
        ],
    ),
    (
        "Operator",
        &["Login", "ConfigureComponents", "ConfigureSelf"],
    ),
    ("ReadOnly", &["Login", "ConfigureSelf"]),
];

/// The roles collection.
pub fn roles() -> Value {
    collection(
        ROLES,
        "RoleCollection",
        "Roles",
        ROLE_PRIVILEGES
            .iter()
            .map(|(r, _)| format!("{ROLES}/{r}"))
            .collect(),
    )
}

/// A predefined role; none: no such role.
pub fn role(r: &str) -> Option<Value> {
    let (name, privs) = ROLE_PRIVILEGES.iter().find(|(n, _)| *n == r)?;
    Some(json!({
        "@odata.id": format!("{ROLES}/{name}"),
        "@odata.type": "#Role.v1_3_1.Role",
        "Id": name,
        "Name": format!("{name} role"),
        "RoleId": name,
        "IsPredefined": true,
        "AssignedPrivileges": privs,
    }))
}

/// A resource's entity tag: a hash of its representation.
pub fn etag(v: &Value) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, v.to_string().as_bytes());
    let hex: String = d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// Whether an `If-Match` header's value lets a change of a resource whose tag is `tag`
/// through: `*` or one of its tags (strong comparison, RFC 9110 13.1.1).
pub fn if_match(header: &str, tag: &str) -> bool {
    header
        .split(',')
        .map(str::trim)
        .any(|t| t == "*" || t == tag)
}

fn hosts(v: &View) -> Vec<&Value> {
    v.hosts["hosts"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn devices(v: &View) -> Vec<&Value> {
    v.pool["devices"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn leases(v: &View) -> Vec<&Value> {
    v.leases["leases"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// Every function of the pool (PFs and VFs) with the PF it belongs to and its device.
fn functions(v: &View) -> Vec<(String, Option<String>, &Value)> {
    let mut out = Vec::new();
    for d in devices(v) {
        let pf = d["pf"].as_str().unwrap_or_default().to_string();
        out.push((pf.clone(), None, d));
        for vf in d["vfs"].as_array().into_iter().flatten() {
            if let Some(vf) = vf.as_str() {
                out.push((vf.to_string(), Some(pf.clone()), d));
            }
        }
    }
    out
}

/// The host holding function `f`, if any.
fn holder(v: &View, f: &str) -> Option<u64> {
    v.pool["bound"].get(f).and_then(Value::as_u64)
}

fn endpoint_path(name: &str) -> String {
    format!("{FABRIC}/Endpoints/{name}")
}

/// The resource at `seg` (below `/redfish/v1`); none: there is none.
pub fn render(seg: &[String], v: &View) -> Option<Value> {
    let s: Vec<&str> = seg.iter().map(String::as_str).collect();
    let r = match s.as_slice() {
        ["Fabrics"] => collection(
            &format!("{ROOT}/Fabrics"),
            "FabricCollection",
            "Fabrics",
            vec![FABRIC.into()],
        ),
        ["Fabrics", "PCIe"] => json!({
            "@odata.id": FABRIC,
            "@odata.type": "#Fabric.v1_3_0.Fabric",
            "Id": "PCIe",
            "Name": "PCIe switch fabric",
            "FabricType": "PCIe",
            "Status": {"State": "Enabled", "Health": "OK"},
            "Switches": id(&format!("{FABRIC}/Switches")),
            "Endpoints": id(&format!("{FABRIC}/Endpoints")),
            "Zones": id(&format!("{FABRIC}/Zones")),
            "Connections": id(&format!("{FABRIC}/Connections")),
        }),
        ["Fabrics", "PCIe", "Switches"] => collection(
            &format!("{FABRIC}/Switches"),
            "SwitchCollection",
            "Switches",
            vec![format!("{FABRIC}/Switches/{SWITCH}")],
        ),
        ["Fabrics", "PCIe", "Switches", SWITCH] => json!({
            "@odata.id": format!("{FABRIC}/Switches/{SWITCH}"),
            "@odata.type": "#Switch.v1_9_0.Switch",
            "Id": SWITCH,
            "Name": "PCIe fabric switch",
            "SwitchType": "PCIe",
            "Status": {"State": "Enabled", "Health": "OK"},
            "Ports": id(&format!("{FABRIC}/Switches/{SWITCH}/Ports")),
        }),
        ["Fabrics", "PCIe", "Switches", SWITCH, "Ports"] => {
            let mut m: Vec<String> = hosts(v)
                .iter()
                .filter_map(|h| h["host"].as_u64())
                .map(|h| format!("{FABRIC}/Switches/{SWITCH}/Ports/host{h}"))
                .collect();
            m.extend(
                devices(v)
                    .iter()
                    .filter_map(|d| d["pf"].as_str())
                    .map(|pf| format!("{FABRIC}/Switches/{SWITCH}/Ports/{pf}")),
            );
            collection(
                &format!("{FABRIC}/Switches/{SWITCH}/Ports"),
                "PortCollection",
                "Ports",
                m,
            )
        }
        ["Fabrics", "PCIe", "Switches", SWITCH, "Ports", p] => port(v, p)?,
        ["Fabrics", "PCIe", "Endpoints"] => {
            let mut m: Vec<String> = hosts(v)
                .iter()
                .filter_map(|h| h["host"].as_u64())
                .map(|h| endpoint_path(&format!("host{h}")))
                .collect();
            m.extend(functions(v).iter().map(|(f, _, _)| endpoint_path(f)));
            collection(
                &format!("{FABRIC}/Endpoints"),
                "EndpointCollection",
                "Endpoints",
                m,
            )
        }
        ["Fabrics", "PCIe", "Endpoints", e] => endpoint(v, e)?,
        ["Fabrics", "PCIe", "Zones"] => collection(
            &format!("{FABRIC}/Zones"),
            "ZoneCollection",
            "Zones",
            hosts(v)
                .iter()
                .filter_map(|h| h["host"].as_u64())
                .map(|h| format!("{FABRIC}/Zones/{h}"))
                .collect(),
        ),
        ["Fabrics", "PCIe", "Zones", z] => zone(v, z)?,
        ["Fabrics", "PCIe", "Connections"] => collection(
            &format!("{FABRIC}/Connections"),
            "ConnectionCollection",
            "Connections",
            leases(v)
                .iter()
                .filter_map(|l| l["id"].as_u64())
                .map(|id| format!("{FABRIC}/Connections/{id}"))
                .collect(),
        ),
        ["Fabrics", "PCIe", "Connections", c] => connection(v, c)?,
        _ => return None,
    };
    Some(r)
}

/// The host a zone or `hostN` names: its canonical decimal only (`00` names none).
fn host_of(v: &View, name: &str) -> Option<Host> {
    let h: Host = name.parse().ok()?;
    if h.to_string() != name {
        return None;
    }
    hosts(v)
        .iter()
        .any(|x| x["host"].as_u64() == Some(u64::from(h)))
        .then_some(h)
}

fn port(v: &View, p: &str) -> Option<Value> {
    let path = format!("{FABRIC}/Switches/{SWITCH}/Ports/{p}");
    if let Some(h) = p.strip_prefix("host").and_then(|h| host_of(v, h)) {
        let up = hosts(v)
            .iter()
            .find(|x| x["host"].as_u64() == Some(u64::from(h)))
            .and_then(|x| x["up"].as_bool())
            .unwrap_or(false);
        return Some(json!({
            "@odata.id": path,
            "@odata.type": "#Port.v1_7_0.Port",
            "Id": p,
            "Name": format!("host {h}'s upstream port"),
            "PortProtocol": "PCIe",
            "PortType": "UpstreamPort",
            "LinkState": if up { "Enabled" } else { "Disabled" },
            "Links": {"AssociatedEndpoints": [id(&endpoint_path(&format!("host{h}")))]},
        }));
    }
    let d = devices(v)
        .into_iter()
        .find(|d| d["pf"].as_str() == Some(p))?;
    Some(json!({
        "@odata.id": path,
        "@odata.type": "#Port.v1_7_0.Port",
        "Id": p,
        "Name": format!("downstream port of {p}"),
        "PortProtocol": "PCIe",
        "PortType": "DownstreamPort",
        "Status": status(d),
        "Links": {"AssociatedEndpoints": [id(&endpoint_path(p))]},
    }))
}

fn status(d: &Value) -> Value {
    if d["healthy"].as_bool() == Some(true) && d["scrub"].is_null() {
        json!({"State": "Enabled", "Health": "OK"})
    } else {
        json!({"State": "StandbyOffline", "Health": "Critical"})
    }
}

fn endpoint(v: &View, e: &str) -> Option<Value> {
    let path = endpoint_path(e);
    if let Some(h) = e.strip_prefix("host").and_then(|h| host_of(v, h)) {
        return Some(json!({
            "@odata.id": path,
            "@odata.type": "#Endpoint.v1_8_0.Endpoint",
            "Id": e,
            "Name": format!("host {h}"),
            "EndpointProtocol": "PCIe",
            "ConnectedEntities": [{"EntityRole": "Initiator", "EntityType": "RootComplex"}],
            "Links": {
                "ConnectedPorts": [id(&format!("{FABRIC}/Switches/{SWITCH}/Ports/host{h}"))],
                "Zones": [id(&format!("{FABRIC}/Zones/{h}"))],
            },
        }));
    }
    let (f, pf, d) = functions(v).into_iter().find(|(f, _, _)| f == e)?;
    let port = pf.clone().unwrap_or_else(|| f.clone());
    let zones: Vec<Value> = holder(v, &f)
        .map(|h| id(&format!("{FABRIC}/Zones/{h}")))
        .into_iter()
        .collect();
    Some(json!({
        "@odata.id": path,
        "@odata.type": "#Endpoint.v1_8_0.Endpoint",
        "Id": f,
        "Name": match &pf {
            None => format!("physical function {f}"),
            Some(pf) => format!("virtual function {f} of {pf}"),
        },
        "EndpointProtocol": "PCIe",
        "ConnectedEntities": [{"EntityRole": "Target"}],
        "Status": status(d),
        "Links": {
            "ConnectedPorts": [id(&format!("{FABRIC}/Switches/{SWITCH}/Ports/{port}"))],
            "Zones": zones,
        },
        "Oem": {"Pcifab": {
            "@odata.type": "#PcifabEndpoint.v1_0_0.PcifabEndpoint",
            "Pool": d["pool"],
            "Profile": d["profile"],
            "PhysicalFunction": pf,
            "Host": holder(v, &f),
        }},
    }))
}

fn zone(v: &View, z: &str) -> Option<Value> {
    let h = host_of(v, z)?;
    let x = hosts(v)
        .into_iter()
        .find(|x| x["host"].as_u64() == Some(u64::from(h)))?;
    // What the host holds now, and what its leases hold (a time-sliced lease's device is
    // not always resident): the list a PATCH keeps by naming it again.
    let mut fns: Vec<&str> = x["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for l in leases(v)
        .into_iter()
        .filter(|l| l["host"].as_u64() == Some(u64::from(h)))
    {
        fns.extend(
            l["functions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str),
        );
    }
    fns.sort_unstable();
    fns.dedup();
    let mut eps = vec![id(&endpoint_path(&format!("host{h}")))];
    eps.extend(fns.into_iter().map(|f| id(&endpoint_path(f))));
    let up = x["up"].as_bool().unwrap_or(false);
    Some(json!({
        "@odata.id": format!("{FABRIC}/Zones/{h}"),
        "@odata.type": "#Zone.v1_6_0.Zone",
        "Id": z,
        "Name": format!("host {h}"),
        "ZoneType": "ZoneOfEndpoints",
        "Status": if up {
            json!({"State": "Enabled", "Health": "OK"})
        } else {
            json!({"State": "UnavailableOffline", "Health": "Critical"})
        },
        "Links": {"Endpoints": eps},
    }))
}

fn connection(v: &View, c: &str) -> Option<Value> {
    let l = leases(v)
        .into_iter()
        .find(|l| l["id"].as_u64().map(|i| i.to_string()).as_deref() == Some(c))?;
    let h = l["host"].as_u64()?;
    let targets: Vec<Value> = l["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|f| id(&endpoint_path(f)))
        .collect();
    Some(json!({
        "@odata.id": format!("{FABRIC}/Connections/{c}"),
        "@odata.type": "#Connection.v1_3_0.Connection",
        "Id": c,
        "Name": format!("lease {c}"),
        "Links": {
            "InitiatorEndpoints": [id(&endpoint_path(&format!("host{h}")))],
            "TargetEndpoints": targets,
        },
        "Oem": {"Pcifab": oem_lease(l)},
    }))
}

/// A lease as a connection's `Oem.Pcifab` (the manager's own lease object, typed).
fn oem_lease(l: &Value) -> Value {
    let mut o = l.as_object().cloned().unwrap_or_default();
    o.insert(
        "@odata.type".into(),
        json!("#PcifabConnection.v1_0_0.PcifabConnection"),
    );
    Value::Object(o)
}

#[cfg(test)]
mod tests;
