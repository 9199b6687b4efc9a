// SPDX-License-Identifier: GPL-2.0-only

//! The JSON schemas of `pcifab --json` (Documentation/json/*.schema.json, built in) and the
//! check that an output object is what its `"schema"` field says: the CLI's tests and the
//! QEMU harness validate through this one function.

use serde_json::Value;

/// Every schema: (command, the schema file's text). The object of `pcifab <command> --json`
/// carries `"schema": "pcifab/<command>/v1"`; a failure carries `"pcifab/error/v1"`.
pub const SCHEMAS: [(&str, &str); 36] = [
    (
        "bind",
        include_str!("../../../Documentation/json/bind.schema.json"),
    ),
    (
        "compose",
        include_str!("../../../Documentation/json/compose.schema.json"),
    ),
    (
        "error",
        include_str!("../../../Documentation/json/error.schema.json"),
    ),
    (
        "events",
        include_str!("../../../Documentation/json/events.schema.json"),
    ),
    (
        "health",
        include_str!("../../../Documentation/json/health.schema.json"),
    ),
    (
        "heartbeat",
        include_str!("../../../Documentation/json/heartbeat.schema.json"),
    ),
    (
        "host-down",
        include_str!("../../../Documentation/json/host-down.schema.json"),
    ),
    (
        "hosts",
        include_str!("../../../Documentation/json/hosts.schema.json"),
    ),
    (
        "info",
        include_str!("../../../Documentation/json/info.schema.json"),
    ),
    (
        "leases",
        include_str!("../../../Documentation/json/leases.schema.json"),
    ),
    (
        "list",
        include_str!("../../../Documentation/json/list.schema.json"),
    ),
    (
        "manager-log",
        include_str!("../../../Documentation/json/manager-log.schema.json"),
    ),
    (
        "manager-state",
        include_str!("../../../Documentation/json/manager-state.schema.json"),
    ),
    (
        "manager-top",
        include_str!("../../../Documentation/json/manager-top.schema.json"),
    ),
    (
        "manager-telemetry",
        include_str!("../../../Documentation/json/manager-telemetry.schema.json"),
    ),
    (
        "move",
        include_str!("../../../Documentation/json/move.schema.json"),
    ),
    (
        "mrpc",
        include_str!("../../../Documentation/json/mrpc.schema.json"),
    ),
    (
        "p2p-copy",
        include_str!("../../../Documentation/json/p2p-copy.schema.json"),
    ),
    (
        "p2p-distance",
        include_str!("../../../Documentation/json/p2p-distance.schema.json"),
    ),
    (
        "p2p-grant",
        include_str!("../../../Documentation/json/p2p-grant.schema.json"),
    ),
    (
        "p2p-grants",
        include_str!("../../../Documentation/json/p2p-grants.schema.json"),
    ),
    (
        "p2p-receive",
        include_str!("../../../Documentation/json/p2p-receive.schema.json"),
    ),
    (
        "p2p-revoke",
        include_str!("../../../Documentation/json/p2p-revoke.schema.json"),
    ),
    (
        "p2p-route-add",
        include_str!("../../../Documentation/json/p2p-route-add.schema.json"),
    ),
    (
        "p2p-route-del",
        include_str!("../../../Documentation/json/p2p-route-del.schema.json"),
    ),
    (
        "p2p-route-list",
        include_str!("../../../Documentation/json/p2p-route-list.schema.json"),
    ),
    (
        "pools",
        include_str!("../../../Documentation/json/pools.schema.json"),
    ),
    (
        "queue",
        include_str!("../../../Documentation/json/queue.schema.json"),
    ),
    (
        "release",
        include_str!("../../../Documentation/json/release.schema.json"),
    ),
    (
        "request",
        include_str!("../../../Documentation/json/request.schema.json"),
    ),
    (
        "show",
        include_str!("../../../Documentation/json/show.schema.json"),
    ),
    (
        "stats",
        include_str!("../../../Documentation/json/stats.schema.json"),
    ),
    (
        "stats-telemetry",
        include_str!("../../../Documentation/json/stats-telemetry.schema.json"),
    ),
    (
        "top",
        include_str!("../../../Documentation/json/top.schema.json"),
    ),
    (
        "unbind",
        include_str!("../../../Documentation/json/unbind.schema.json"),
    ),
    (
        "watch",
        include_str!("../../../Documentation/json/watch.schema.json"),
    ),
];

/// The schema file of a `pcifab/<command>/v<N>` name.
pub fn schema_text(name: &str) -> Option<&'static str> {
    let command = name.strip_prefix("pcifab/")?.strip_suffix("/v1")?;
    SCHEMAS
        .iter()
        .find(|(c, _)| *c == command)
        .map(|(_, text)| *text)
}

/// Checks `v` against the schema its `"schema"` field names; the error says which field is
/// wrong and how.
pub fn validate(v: &Value) -> Result<(), String> {
    let name = v
        .get("schema")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("no \"schema\" field in {v}"))?;
    let text = schema_text(name).ok_or_else(|| format!("unknown schema {name:?} in {v}"))?;
    let schema: Value =
        serde_json::from_str(text).map_err(|e| format!("schema {name} is not JSON: {e}"))?;
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| format!("schema {name} is not a valid JSON Schema: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(v)
        .map(|e| format!("at {}: {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{name}: {} in {v}", errors.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_schema_compiles_and_names_itself() {
        for (command, text) in SCHEMAS {
            let s: Value = serde_json::from_str(text).expect(command);
            jsonschema::validator_for(&s).unwrap_or_else(|e| panic!("{command}: {e}"));
            assert_eq!(
                s["properties"]["schema"]["const"],
                json!(format!("pcifab/{command}/v1")),
                "{command}"
            );
        }
    }

    #[test]
    fn rejects_what_does_not_fit() {
        let ok = json!({"schema": "pcifab/release/v1", "ok": true, "id": 3});
        assert!(validate(&ok).is_ok());
        let bad = json!({"schema": "pcifab/release/v1", "ok": true, "id": "3"});
        assert!(validate(&bad).unwrap_err().contains("/id"));
        let extra = json!({"schema": "pcifab/release/v1", "ok": true, "id": 3, "x": 1});
        assert!(validate(&extra).is_err());
        assert!(validate(&json!({"ok": true})).is_err());
        assert!(validate(&json!({"schema": "pcifab/nope/v1"})).is_err());
    }

    /// The network API pages every list (`total`, `next_offset`): what `pcifab --manager URL`
    /// prints of a page must fit the same schema as the socket's whole list.
    #[test]
    fn paged_lists_fit_their_schemas() {
        for (command, key) in [
            ("leases", "leases"),
            ("queue", "queue"),
            ("hosts", "hosts"),
            ("events", "events"),
        ] {
            let mut v = json!({"schema": format!("pcifab/{command}/v1"), "ok": true, "now": 1});
            v[key] = json!([]);
            if let (true, Some(o)) = (command == "events", v.as_object_mut()) {
                o.remove("now");
            }
            assert!(validate(&v).is_ok(), "{command}: {:?}", validate(&v));
            v["total"] = json!(7);
            v["next_offset"] = json!(5);
            assert!(validate(&v).is_ok(), "{command} paged: {:?}", validate(&v));
            v["total"] = json!(-1);
            assert!(validate(&v).is_err(), "{command}: a negative total fits");
        }
    }
}
