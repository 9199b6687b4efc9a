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

#[test]
fn the_root_is_public_and_the_rest_is_read() {
    assert!(matches!(
        route("GET", "/redfish", b""),
        Ok(Route::Public(_))
    ));
    match route("GET", "/redfish/v1/", b"") {
        Ok(Route::Public(v)) => {
            assert_eq!(v["Fabrics"]["@odata.id"], "/redfish/v1/Fabrics");
            assert_eq!(v["@odata.type"], "#ServiceRoot.v1_15_0.ServiceRoot");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        route("GET", "/redfish/v1/Fabrics/PCIe/Zones/1", b""),
        Ok(Route::Read(seg("Fabrics/PCIe/Zones/1")))
    );
    assert_eq!(
        route("DELETE", "/redfish/v1/Fabrics", b"").map_err(|e| e.0),
        Err(405)
    );
    assert_eq!(route("POST", "/redfish", b"").map_err(|e| e.0), Err(405));
    assert_eq!(route("GET", "/redfishx", b"").map_err(|e| e.0), Err(404));
    assert_eq!(
        route("GET", "/redfish/v1/Fabrics", b"{}").map_err(|e| e.0),
        Err(400)
    );
}

#[test]
fn a_zone_patch_is_a_composition() {
    let body = br#"{"Links": {"Endpoints": [
        {"@odata.id": "/redfish/v1/Fabrics/PCIe/Endpoints/host1"},
        {"@odata.id": "/redfish/v1/Fabrics/PCIe/Endpoints/0x0400"},
        {"@odata.id": "/redfish/v1/Fabrics/PCIe/Endpoints/0x0500/"}]}}"#;
    assert_eq!(
        route("PATCH", "/redfish/v1/Fabrics/PCIe/Zones/1", body),
        Ok(Route::Compose(Request::Compose {
            host: 1,
            functions: vec![0x0400, 0x0500],
            priority: 0,
            duration_s: None,
            tenant: None,
            owner: None,
        }))
    );
    let bad = |path: &str, body: &str| route("PATCH", path, body.as_bytes()).map_err(|e| e.0);
    let zone = "/redfish/v1/Fabrics/PCIe/Zones/1";
    let ep = |e: &str| format!(r#"{{"Links": {{"Endpoints": [{{"@odata.id": "{e}"}}]}}}}"#);
    assert_eq!(bad(zone, "not json"), Err(400));
    assert_eq!(bad(zone, r#"{"Links": {}}"#), Err(400));
    assert_eq!(
        bad(zone, r#"{"Links": {"Endpoints": []}, "Name": "x"}"#),
        Err(400)
    );
    assert_eq!(
        bad(zone, &ep("/redfish/v1/Fabrics/PCIe/Endpoints/host0")),
        Err(400)
    );
    assert_eq!(bad(zone, &ep("/redfish/v1/Systems/1")), Err(400));
    assert_eq!(
        bad(zone, &ep("/redfish/v1/Fabrics/PCIe/Endpoints/gpu")),
        Err(400)
    );
    assert_eq!(bad("/redfish/v1/Fabrics/PCIe/Zones/x", &ep("")), Err(404));
    assert_eq!(
        bad("/redfish/v1/Fabrics/PCIe/Endpoints/0x0400", "{}"),
        Err(405)
    );
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
    for missing in [
        "Fabrics/PCIe/Zones/2",
        "Fabrics/PCIe/Endpoints/0x0500",
        "Fabrics/PCIe/Endpoints/host9",
        "Fabrics/PCIe/Connections/8",
        "Fabrics/IB",
        "Systems",
    ] {
        assert!(get(missing).is_none(), "{missing}");
    }
}
