// SPDX-License-Identifier: GPL-2.0-only

//! A Redfish view of the fabric (`/redfish/v1`), for the tools data-centre operators already
//! have: the service root, the fabric `PCIe` with its switch and ports, its endpoints (one
//! initiator per host, one target per pool function), a zone per host holding what that host
//! holds, and a connection per lease. Composing is a PATCH of a zone's endpoints; it becomes
//! the manager's `compose` operation, so the scheduler and its policy decide as for any other
//! request. `Documentation/manager-api.rst` ("Redfish") describes the mapping.
//!
//! This module turns paths into what to serve and the manager's own replies (pools, hosts,
//! leases) into Redfish resources; it does no I/O and holds no lock.

use serde_json::{json, Value};

use crate::api::HttpError;
use crate::protocol::{parse_pdfid, Request};
use crate::scheduler::Host;

/// Where the tree starts.
pub const ROOT: &str = "/redfish/v1";
const FABRIC: &str = "/redfish/v1/Fabrics/PCIe";
const SWITCH: &str = "pax0";

/// What a Redfish request asks for.
#[derive(Debug, PartialEq)]
pub enum Route {
    /// A resource anyone may read (the version object and the service root).
    Public(Value),
    /// A resource of the fabric, by its path below `/redfish/v1`.
    Read(Vec<String>),
    /// A zone's new endpoints: the manager's `compose`.
    Compose(Request),
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
pub fn error_body(status: u16, msg: &str) -> Value {
    let code = match status {
        400 => "Base.1.16.PropertyValueError",
        401 | 403 => "Base.1.16.InsufficientPrivilege",
        404 => "Base.1.16.ResourceNotFound",
        405 => "Base.1.16.OperationNotAllowed",
        409 => "Base.1.16.ResourceInUse",
        _ => "Base.1.16.GeneralError",
    };
    json!({"error": {
        "code": code,
        "message": msg,
        "@Message.ExtendedInfo": [{
            "MessageId": code,
            "Message": msg,
            "Severity": if status >= 500 { "Critical" } else { "Warning" },
        }],
    }})
}

fn service_root() -> Value {
    json!({
        "@odata.id": format!("{ROOT}/"),
        "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
        "Id": "RootService",
        "Name": "pcifab fabric manager",
        "RedfishVersion": "1.17.0",
        "Fabrics": id(&format!("{ROOT}/Fabrics")),
        "Links": {},
    })
}

/// The route of `method path` with `body`.
pub fn route(method: &str, path: &str, body: &[u8]) -> Result<Route, HttpError> {
    let p = path.trim_end_matches('/');
    if p == "/redfish" {
        return match method {
            "GET" => Ok(Route::Public(json!({ "v1": format!("{ROOT}/") }))),
            _ => Err(HttpError(405, format!("{path} is read-only"))),
        };
    }
    let Some(rest) = p.strip_prefix(ROOT) else {
        return Err(HttpError(404, format!("no such Redfish resource: {path}")));
    };
    let seg: Vec<String> = rest
        .split('/')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    match (method, seg.as_slice()) {
        ("GET", []) => Ok(Route::Public(service_root())),
        ("GET", _) => {
            if !body.is_empty() {
                return Err(HttpError(400, "a GET takes no body".into()));
            }
            Ok(Route::Read(seg))
        }
        ("PATCH", [f, pcie, z, h]) if f == "Fabrics" && pcie == "PCIe" && z == "Zones" => {
            let host: Host = h
                .parse()
                .map_err(|_| HttpError(404, format!("no such zone: {path}")))?;
            Ok(Route::Compose(zone_patch(host, body)?))
        }
        _ => Err(HttpError(
            405,
            format!("{path} does not take {method} (only a zone's Links.Endpoints may be PATCHed)"),
        )),
    }
}

/// A zone PATCH's body: `{"Links": {"Endpoints": [{"@odata.id": ...}, ...]}}`; the zone's
/// own initiator may be named, other hosts' may not.
fn zone_patch(host: Host, body: &[u8]) -> Result<Request, HttpError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Patch {
        #[serde(rename = "Links")]
        links: Links,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Links {
        #[serde(rename = "Endpoints")]
        endpoints: Vec<Link>,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Link {
        #[serde(rename = "@odata.id")]
        id: String,
    }
    let p: Patch = serde_json::from_slice(body).map_err(|e| {
        HttpError(
            400,
            format!(
                "the body is not {{\"Links\": {{\"Endpoints\": [{{\"@odata.id\": URI}}, ...]}}}}: {e}"
            ),
        )
    })?;
    let prefix = format!("{FABRIC}/Endpoints/");
    let mut functions = Vec::new();
    for l in p.links.endpoints {
        let e = l.id.trim_end_matches('/');
        let Some(name) = e.strip_prefix(&prefix) else {
            return Err(HttpError(
                400,
                format!("{} is not an endpoint of this fabric ({prefix}...)", l.id),
            ));
        };
        if let Some(h) = name.strip_prefix("host") {
            if h.parse::<Host>().ok() == Some(host) {
                continue;
            }
            return Err(HttpError(
                400,
                format!(
                    "{} is another host's initiator; a zone holds only its own",
                    l.id
                ),
            ));
        }
        functions.push(
            parse_pdfid(name)
                .ok_or_else(|| HttpError(400, format!("{} names no function", l.id)))?,
        );
    }
    Ok(Request::Compose {
        host,
        functions,
        priority: 0,
        duration_s: None,
        tenant: None,
        owner: None,
    })
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

fn host_of(v: &View, name: &str) -> Option<u64> {
    let h: u64 = name.parse().ok()?;
    hosts(v)
        .iter()
        .any(|x| x["host"].as_u64() == Some(h))
        .then_some(h)
}

fn port(v: &View, p: &str) -> Option<Value> {
    let path = format!("{FABRIC}/Switches/{SWITCH}/Ports/{p}");
    if let Some(h) = p.strip_prefix("host").and_then(|h| host_of(v, h)) {
        let up = hosts(v)
            .iter()
            .find(|x| x["host"].as_u64() == Some(h))
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
        .find(|x| x["host"].as_u64() == Some(h))?;
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
        .filter(|l| l["host"].as_u64() == Some(h))
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
        "Oem": {"Pcifab": l},
    }))
}

#[cfg(test)]
mod tests;
