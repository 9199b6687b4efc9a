// SPDX-License-Identifier: GPL-2.0-only

use super::*;

/// Every operation, as the client sends it and as the server reads it.
fn every_op() -> Vec<Request> {
    let spec: RequestSpec = serde_json::from_value(json!({
        "host": 1, "want": {"kind": "vfs", "count": 2, "profile": "q"}, "priority": 3,
        "duration_s": 60, "pool": "gpus", "tenant": "team-a"}))
    .expect("spec");
    vec![
        Request::Request { spec },
        Request::Release { id: 42 },
        Request::Queue,
        Request::Leases,
        Request::Pool,
        Request::Hosts,
        Request::HostDown { host: 1 },
        Request::Heartbeat { host: 0 },
        Request::Compose {
            host: 2,
            functions: vec![0x0400, 0x0500],
            priority: 4,
            duration_s: Some(30),
            tenant: Some("team-a".into()),
            owner: None,
        },
        Request::SetHealth {
            pf: 0x300,
            healthy: false,
            reason: Some("fan".into()),
        },
        Request::Events {
            host: Some(1),
            since: 7,
        },
        Request::Events {
            host: None,
            since: 0,
        },
        Request::Telemetry,
        Request::State,
        Request::Log { n: 5 },
    ]
}

#[test]
fn every_operation_round_trips_through_its_route() {
    for op in every_op() {
        let (m, pq, body) = http_of(&op, 3);
        let (path, query) = pq.split_once('?').unwrap_or((&pq, ""));
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let want_wait = matches!(op, Request::Events { .. })
            .then_some(3)
            .unwrap_or(0);
        assert_eq!(
            route(m, path, query, body.as_bytes()),
            Ok(Endpoint::Op(op.clone(), Duration::from_secs(want_wait))),
            "{m} {pq}"
        );
        assert!(
            ROUTES.iter().any(|(rm, t, _)| *rm == m
                && template_matches(t, &path.split('/').skip(1).collect::<Vec<_>>())),
            "{m} {path} is not in ROUTES"
        );
    }
}

#[test]
fn the_openapi_document_lists_exactly_the_routes() {
    let doc: Value = serde_json::from_str(OPENAPI).expect("the OpenAPI document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented: Vec<(String, String, String)> = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, o) in item.as_object().expect("path item") {
            documented.push((
                method.to_uppercase(),
                path.clone(),
                o["operationId"].as_str().expect("operationId").to_string(),
            ));
        }
    }
    documented.sort();
    let mut served: Vec<(String, String, String)> = ROUTES
        .iter()
        .map(|(m, p, o)| (m.to_string(), p.to_string(), o.to_string()))
        .collect();
    served.sort();
    assert_eq!(documented, served);
    // Each operation id is the protocol's name of the operation it serves.
    for op in every_op() {
        let name = serde_json::to_value(&op).expect("op")["op"]
            .as_str()
            .map(String::from);
        assert!(
            ROUTES.iter().any(|(_, _, o)| Some(o.to_string()) == name),
            "{name:?} has no route"
        );
    }
}

#[test]
fn bad_http_requests_say_what_is_wrong() {
    let err = |m, p, q, b: &str| route(m, p, q, b.as_bytes()).expect_err(p);
    assert_eq!(err("GET", "/v1/nope", "", "").0, 404);
    assert_eq!(err("GET", "/v1/requests", "", "").0, 405);
    assert_eq!(err("PUT", "/v1/queue", "", "").0, 405);
    assert_eq!(err("POST", "/v1/requests", "", "{").0, 400);
    assert_eq!(err("POST", "/v1/requests", "", "{\"host\":1}").0, 400);
    assert_eq!(err("DELETE", "/v1/requests/abc", "", "").0, 400);
    assert_eq!(
        err("DELETE", "/v1/requests/99999999999999999999", "", "").0,
        400
    );
    assert_eq!(err("POST", "/v1/hosts/256/down", "", "").0, 400);
    assert_eq!(
        err(
            "PUT",
            "/v1/devices/0x10000/health",
            "",
            "{\"healthy\":true}"
        )
        .0,
        400
    );
    assert_eq!(
        err("PUT", "/v1/devices/0x300/health", "", "{\"healthy\":1}").0,
        400
    );
    assert_eq!(err("GET", "/v1/events", "wait=61", "").0, 400);
    assert_eq!(err("GET", "/v1/events", "since=1&since=2", "").0, 400);
    assert_eq!(err("GET", "/v1/events", "nope=1", "").0, 400);
    assert_eq!(err("GET", "/v1/queue", "x=1", "").0, 400);
    assert_eq!(err("GET", "/v1/queue", "", "{}").0, 400);
    let m = err("GET", "/v1/events", "host=-1", "").1;
    assert!(m.contains("host"), "{m}");
}

#[test]
fn replies_map_to_statuses() {
    let r = Request::Queue;
    assert_eq!(status_of(&r, &json!({"ok": true})), 200);
    let spec = every_op().remove(0);
    assert_eq!(status_of(&spec, &json!({"ok": true})), 201);
    assert_eq!(status_of(&r, &json!({"ok": false, "refused": true})), 409);
    assert_eq!(status_of(&r, &json!({"ok": false, "refused": false})), 500);
}

#[test]
fn list_routes_page_with_a_bounded_limit() {
    let get = |p: &str, q: &str| route("GET", p, q, b"");
    for p in [
        "/v1/queue",
        "/v1/leases",
        "/v1/pools",
        "/v1/hosts",
        "/v1/events",
    ] {
        assert!(get(p, "limit=5&offset=10").is_ok(), "{p}");
        assert!(get(p, "limit=1000").is_ok(), "{p}");
        for q in ["limit=0", "limit=1001", "limit=x", "offset=-1"] {
            assert_eq!(get(p, q).expect_err(q).0, 400, "{p}?{q}");
        }
    }
    // Routes that list nothing take no paging.
    assert_eq!(get("/v1/state", "limit=5").expect_err("state").0, 400);
    // The log's page is its n: 1 to 1000.
    assert!(get("/v1/log", "n=1000").is_ok());
    for q in [
        "n=0",
        "n=1001",
        "n=18446744073709551615",
        "n=18446744073709551616",
    ] {
        assert_eq!(get("/v1/log", q).expect_err(q).0, 400, "{q}");
    }
    let op = Request::Leases;
    let pg = |q: &str| page(&op, q).expect("page").expect("a list");
    assert_eq!(
        pg(""),
        Page {
            offset: 0,
            limit: 1000
        }
    );
    let mut v = json!({"ok": true, "leases": [0, 1, 2, 3, 4]});
    apply_page(&op, pg("offset=1&limit=2"), &mut v);
    assert_eq!(
        v,
        json!({"ok": true, "leases": [1, 2], "total": 5, "next_offset": 3})
    );
    let mut v = json!({"ok": true, "leases": [0, 1, 2]});
    apply_page(&op, pg("offset=2&limit=2"), &mut v);
    assert_eq!(v, json!({"ok": true, "leases": [2], "total": 3}));
    let mut v = json!({"ok": true, "leases": [0]});
    apply_page(&op, pg("offset=9"), &mut v);
    assert_eq!(v, json!({"ok": true, "leases": [], "total": 1}));
    assert_eq!(page(&Request::State, "").expect("state"), None);
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let token = |v: &str| {
        let mut h = header::HeaderMap::new();
        h.insert(header::AUTHORIZATION, v.parse().expect("header value"));
        bearer(&h).expect("an Authorization header")
    };
    for v in ["Bearer t0k", "bearer t0k", "BEARER t0k", "BeArEr   t0k "] {
        assert_eq!(token(v), Ok("t0k".to_string()), "{v:?}");
    }
    for v in ["Basic dTpw", "Bearer", "Bearer  ", "Bearert0k"] {
        assert!(token(v).is_err(), "{v:?}");
    }
}

#[test]
fn the_openapi_document_lists_the_paging_parameters() {
    let doc: Value = serde_json::from_str(OPENAPI).expect("the OpenAPI document is JSON");
    for p in [
        "/v1/queue",
        "/v1/leases",
        "/v1/pools",
        "/v1/hosts",
        "/v1/events",
    ] {
        let params = doc["paths"][p]["get"]["parameters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for name in ["limit", "offset"] {
            assert!(
                params.iter().any(|x| x["name"] == name),
                "{p} does not document {name}"
            );
        }
        let limit = params.iter().find(|x| x["name"] == "limit").expect("limit");
        assert_eq!(limit["schema"]["maximum"], crate::protocol::MAX_PAGE);
    }
    let n = &doc["paths"]["/v1/log"]["get"]["parameters"][0];
    assert_eq!(
        (n["name"].as_str(), &n["schema"]["maximum"]),
        (Some("n"), &json!(crate::protocol::MAX_PAGE))
    );
}

#[test]
fn query_parameters_are_percent_decoded() {
    let get = |p: &str, q: &str| route("GET", p, q, b"");
    // Names and values as a client's URL encoder writes them.
    assert_eq!(
        get("/v1/events", "h%6Fst=%31&since=0x%32a&wait=%30").expect("encoded"),
        Endpoint::Op(
            Request::Events {
                host: Some(1),
                since: 0x2a
            },
            Duration::ZERO
        )
    );
    assert_eq!(
        get("/v1/log", "n=1%30").expect("n=10"),
        Endpoint::Op(Request::Log { n: 10 }, Duration::ZERO)
    );
    let pg = page(&Request::Leases, "%6Cimit=2&offset=%31").expect("page");
    assert_eq!(
        pg,
        Some(Page {
            offset: 1,
            limit: 2
        })
    );
    // A parameter given twice is caught after decoding too.
    let e = get("/v1/events", "since=1&%73ince=2").expect_err("twice");
    assert!(e.1.contains("'since' is given twice"), "{e:?}");
    // A decoded name is checked like any other: `x` is not a parameter of the log.
    assert_eq!(get("/v1/log", "%78=1").expect_err("x").0, 400);
    // Malformed encodings are a 400 that says what is wrong.
    for q in ["n=%zz", "n=1%", "n=%3", "%zz=1"] {
        let e = get("/v1/log", q).expect_err(q);
        assert_eq!(e.0, 400, "{q}");
        assert!(e.1.contains("malformed percent-encoding"), "{q}: {e:?}");
    }
    let e = get("/v1/log", "n=%ff%fe").expect_err("not UTF-8");
    assert_eq!(e.0, 400);
    assert!(e.1.contains("not UTF-8"), "{e:?}");
}
