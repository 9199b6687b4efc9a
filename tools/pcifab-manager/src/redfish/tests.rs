// SPDX-License-Identifier: GPL-2.0-only

use super::*;

fn seg(p: &str) -> Vec<String> {
    p.split('/')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Two hosts; one device with a VF in pool "gpus"; host 1 holds the PF in lease 7.
fn view() -> View {
    View {
        hosts: json!({"ok": true, "hosts": [
            {"host": 0, "up": true, "functions": []},
            {"host": 1, "up": false, "functions": ["0x0400"]},
        ]}),
        pool: json!({"ok": true, "devices": [
            {"pool": "gpus", "pf": "0x0400", "vfs": ["0x0401"], "profile": "q",
             "healthy": true, "scrub": null},
        ], "bound": {"0x0400": 1}}),
        leases: json!({"ok": true, "leases": [
            {"id": 7, "host": 1, "functions": ["0x0400"]},
        ]}),
    }
}

fn status<T: std::fmt::Debug>(r: Result<T, Error>) -> u16 {
    r.map(|_| 200).unwrap_or_else(|e| e.status)
}

#[test]
fn paths_name_resources_and_their_methods() {
    assert_eq!(resource("/redfish"), Ok(Resource::Versions));
    assert_eq!(resource("/redfish/v1/"), Ok(Resource::Root));
    assert_eq!(resource("/redfish/v1"), Ok(Resource::Root));
    assert_eq!(resource("/redfish/v1/$metadata"), Ok(Resource::Metadata));
    assert_eq!(resource("/redfish/v1/odata"), Ok(Resource::OData));
    assert_eq!(
        resource("/redfish/v1/Fabrics/PCIe/Zones/1"),
        Ok(Resource::Fabric(seg("Fabrics/PCIe/Zones/1")))
    );
    assert_eq!(
        resource("/redfish/v1/SessionService/Sessions/ab"),
        Ok(Resource::Session("ab".into()))
    );
    for p in [
        "/redfishx",
        "/redfish/v2",
        "/redfish/v1x",
        "/redfish/v1/Systems",
        "/redfish/v1//Fabrics",
    ] {
        assert_eq!(status(resource(p)), 404, "{p}");
    }
    let zone = resource("/redfish/v1/Fabrics/PCIe/Zones/1").expect("zone");
    assert_eq!(zone.allow(), "GET, HEAD, PATCH");
    assert_eq!(Resource::Root.allow(), "GET, HEAD");
    assert!(Resource::Root.public("GET") && Resource::Metadata.public("HEAD"));
    assert!(Resource::Sessions.public("POST") && !Resource::Sessions.public("GET"));
    assert!(!zone.public("GET"));
    assert_eq!(status(action("DELETE", &Resource::Root, b"")), 405);
    assert_eq!(status(action("POST", &zone, b"{}")), 405);
    // A GET's body is ignored.
    assert_eq!(action("GET", &zone, b"{}"), Ok(Action::Get));
}

#[test]
fn a_zone_patch_is_a_composition() {
    let v = view();
    let zone = resource("/redfish/v1/Fabrics/PCIe/Zones/1").expect("zone");
    let body = br#"{"Links": {"Endpoints": [
        {"@odata.id": "/redfish/v1/Fabrics/PCIe/Endpoints/host1"},
        {"@odata.id": "/redfish/v1/Fabrics/PCIe/Endpoints/0x0401/"}]}, "@odata.etag": "x"}"#;
    let Ok(Action::PatchZone { zone: z, endpoints }) = action("PATCH", &zone, body) else {
        panic!("not a zone PATCH");
    };
    assert_eq!(
        compose_of(&v, &z, &endpoints),
        Ok(Request::Compose {
            host: 1,
            functions: vec![0x0401],
            priority: 0,
            duration_s: None,
            tenant: None,
            owner: None,
        })
    );
    let bad = |body: &str| status(action("PATCH", &zone, body.as_bytes()));
    assert_eq!(bad("not json"), 400);
    assert_eq!(bad("[]"), 400);
    assert_eq!(bad(r#"{"Links": {}}"#), 400);
    assert_eq!(bad(r#"{"Links": {"Endpoints": []}, "Name": "x"}"#), 400);
    assert_eq!(bad(r#"{"@odata.id": "x"}"#), 400);
    assert_eq!(bad(r#"{"Links": {"Endpoints": [{"@odata.id": 1}]}}"#), 400);
    let e = action("PATCH", &zone, br#"{"BogusProp": 1}"#).expect_err("unknown");
    assert_eq!(
        (e.key, e.msg.contains("BogusProp")),
        ("PropertyUnknown", true)
    );
    let refs = |eps: &[&str]| -> u16 {
        let eps: Vec<String> = eps.iter().map(|e| e.to_string()).collect();
        status(compose_of(&v, "1", &eps))
    };
    let ep = "/redfish/v1/Fabrics/PCIe/Endpoints/";
    assert_eq!(refs(&[&format!("{ep}host0")]), 400);
    assert_eq!(refs(&["/redfish/v1/Systems/1"]), 400);
    assert_eq!(refs(&[&format!("{ep}gpu")]), 400);
    assert_eq!(refs(&[&format!("{ep}0x0500")]), 400);
    assert_eq!(refs(&[&format!("{ep}0x400")]), 400);
    assert_eq!(refs(&[&format!("{ep}host01")]), 400);
    assert_eq!(status(compose_of(&v, "2", &[])), 404);
    assert_eq!(status(compose_of(&v, "01", &[])), 404);
}

#[test]
fn resources_follow_the_view() {
    let v = view();
    let get = |p: &str| render(&seg(p), &v);
    let members = |p: &str| -> Vec<String> {
        get(p).expect(p)["Members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| m["@odata.id"].as_str().expect("id").to_string())
            .collect()
    };
    let e = "/redfish/v1/Fabrics/PCIe/Endpoints/";
    assert_eq!(
        members("Fabrics/PCIe/Endpoints"),
        vec![
            format!("{e}host0"),
            format!("{e}host1"),
            format!("{e}0x0400"),
            format!("{e}0x0401")
        ]
    );
    assert_eq!(members("Fabrics/PCIe/Zones").len(), 2);
    assert_eq!(members("Fabrics/PCIe/Switches/pax0/Ports").len(), 3);
    assert_eq!(
        members("Fabrics/PCIe/Connections"),
        vec!["/redfish/v1/Fabrics/PCIe/Connections/7"]
    );
    let z = get("Fabrics/PCIe/Zones/1").expect("zone");
    assert_eq!(
        z["Links"]["Endpoints"],
        json!([{"@odata.id": format!("{e}host1")}, {"@odata.id": format!("{e}0x0400")}])
    );
    assert_eq!(z["Status"]["State"], "UnavailableOffline");
    let pf = get("Fabrics/PCIe/Endpoints/0x0400").expect("pf");
    assert_eq!(pf["Oem"]["Pcifab"]["Host"], 1);
    assert!(pf["Oem"]["Pcifab"]["@odata.type"].is_string());
    assert_eq!(
        pf["Links"]["Zones"],
        json!([{"@odata.id": "/redfish/v1/Fabrics/PCIe/Zones/1"}])
    );
    let vf = get("Fabrics/PCIe/Endpoints/0x0401").expect("vf");
    assert_eq!(vf["Oem"]["Pcifab"]["PhysicalFunction"], "0x0400");
    let c = get("Fabrics/PCIe/Connections/7").expect("connection");
    assert_eq!(
        c["Links"]["InitiatorEndpoints"],
        json!([{"@odata.id": format!("{e}host1")}])
    );
    assert!(c["Oem"]["Pcifab"]["@odata.type"].is_string());
    assert_eq!(c["Oem"]["Pcifab"]["id"], 7);
    for missing in [
        "Fabrics/PCIe/Zones/2",
        "Fabrics/PCIe/Zones/01",
        "Fabrics/PCIe/Zones/00",
        "Fabrics/PCIe/Endpoints/0x0500",
        "Fabrics/PCIe/Endpoints/host9",
        "Fabrics/PCIe/Endpoints/host00",
        "Fabrics/PCIe/Switches/pax0/Ports/host01",
        "Fabrics/PCIe/Connections/8",
        "Fabrics/PCIe/Connections/07",
        "Fabrics/IB",
        "Systems",
    ] {
        assert!(get(missing).is_none(), "{missing}");
    }
}

#[test]
fn the_service_root_links_sessions_and_metadata_lists_its_schemas() {
    let r = service_root();
    assert_eq!(r["Links"]["Sessions"]["@odata.id"], SESSIONS);
    let m = metadata();
    for (ns, _) in SCHEMAS {
        assert!(m.contains(&format!("Namespace=\"{ns}\"")), "{ns}");
    }
    assert!(m.contains("<EntityContainer Name=\"Service\""));
    assert_eq!(
        described_by(&r).as_deref(),
        Some("http://redfish.dmtf.org/schemas/v1/ServiceRoot.v1_15_0.json")
    );
}

#[test]
fn if_match_is_a_strong_comparison() {
    let v = json!({"@odata.id": "/x", "a": 1});
    let t = etag(&v);
    assert_ne!(t, etag(&json!({"@odata.id": "/x", "a": 2})));
    assert!(if_match(&t, &t));
    assert!(if_match("*", &t));
    assert!(if_match(&format!("\"other\", {t}"), &t));
    assert!(!if_match("\"other\"", &t));
    assert!(!if_match(&format!("W/{t}"), &t));
}

#[test]
fn users_are_principals_with_hashed_passwords() {
    use crate::auth::{PrincipalConfig, Principals, Role};
    let p = Principals::new(
        vec![PrincipalConfig {
            name: "ops".into(),
            role: Role::Admin,
            hosts: vec![],
            tenant: None,
            acts_for: vec![],
            token_sha256: None,
            uids: vec![],
            token_expires: None,
        }],
        2,
        vec![],
    )
    .expect("principals");
    let h = users::hash_password("s3cret", users::MIN_ITERATIONS).expect("hash");
    assert!(h.starts_with("$pbkdf2-sha256$i=10000$") && !h.contains("s3cret"));
    let u = users::Users::parse(
        &format!("[[users]]\nname = \"ops\"\npassword_pbkdf2 = \"{h}\"\n"),
        &p,
    )
    .expect("users");
    assert!(u.verify("ops", "s3cret"));
    assert!(!u.verify("ops", "s3cret "));
    assert!(!u.verify("nobody", "s3cret"));
    for (text, why) in [
        (format!("[[users]]\nname = \"eve\"\npassword_pbkdf2 = \"{h}\"\n"), "no principal"),
        (
            format!("[[users]]\nname = \"ops\"\npassword_pbkdf2 = \"{h}\"\n[[users]]\nname = \"ops\"\npassword_pbkdf2 = \"{h}\"\n"),
            "twice",
        ),
        ("[[users]]\nname = \"ops\"\npassword_pbkdf2 = \"s3cret\"\n".into(), "pbkdf2"),
        ("[[users]]\nname = \"ops\"\npassword = \"s3cret\"\n".into(), "unknown field"),
        (
            format!("[[users]]\nname = \"ops\"\npassword_pbkdf2 = \"{}\"\n", h.replace("i=10000", "i=10")),
            "iterations",
        ),
    ] {
        let e = users::Users::parse(&text, &p).expect_err(why);
        assert!(e.contains(why), "{e}");
    }
}

#[test]
fn sessions_end_when_deleted_or_unused_for_the_timeout() {
    use std::time::{Duration, Instant};
    let s = users::Sessions::new(Duration::from_secs(60));
    let t0 = Instant::now();
    let (id, token) = s.create("ops", t0).expect("session");
    assert_eq!(token.len(), 64);
    // Used at 50 s: it lives until 110 s.
    assert_eq!(
        s.by_token(&token, t0 + Duration::from_secs(50)),
        Some((id.clone(), "ops".into()))
    );
    assert!(s.by_token(&token, t0 + Duration::from_secs(100)).is_some());
    assert!(s.by_token(&token, t0 + Duration::from_secs(161)).is_none());
    assert!(s.list(t0 + Duration::from_secs(161)).is_empty());
    // Deleted: gone.
    let (id, token) = s.create("ops", t0).expect("session");
    assert!(s.delete(&id, t0));
    assert!(!s.delete(&id, t0));
    assert!(s.by_token(&token, t0).is_none());
    // At most MAX_SESSIONS at once.
    for _ in 0..users::MAX_SESSIONS {
        assert!(s.create("ops", t0).is_some());
    }
    assert!(s.create("ops", t0).is_none());
    assert!(s.create("ops", t0 + Duration::from_secs(61)).is_some());
}

#[test]
fn the_api_redfish_section_is_checked() {
    let cfg = |extra: &str| {
        crate::config::Config::parse(&format!(
            "[manager]\nhosts = 2\n[[pools]]\nname = \"g\"\nmode = \"whole\"\n\
             [[pools.devices]]\npf = 0x0100\n\
             [api]\nlisten = \"127.0.0.1:0\"\ncert = \"c\"\nkey = \"k\"\n{extra}"
        ))
    };
    let c = cfg("").expect("no [api.redfish]");
    let r = &c.api.expect("api").redfish;
    assert_eq!((r.users.as_deref(), r.session_timeout_s), (None, 1800));
    let c = cfg("[api.redfish]\nusers = \"/etc/u.toml\"\nsession_timeout_s = 30\n").expect("ok");
    assert_eq!(
        c.api.expect("api").redfish.users.as_deref(),
        Some("/etc/u.toml")
    );
    for bad in [
        "[api.redfish]\nsession_timeout_s = 29\n",
        "[api.redfish]\nsession_timeout_s = 86401\n",
        "[api.redfish]\npasswords = \"x\"\n",
    ] {
        assert!(cfg(bad).is_err(), "{bad}");
    }
}
