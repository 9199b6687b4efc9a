// SPDX-License-Identifier: GPL-2.0-only

//! The manager's modules are layers (Documentation/manager.rst, "Layers"): a module may
//! name (`use crate::x`, `crate::x::...`) modules of its own layer and of the layers below,
//! never one above, and no modules name each other in a circle. These tests read the
//! source files and check both rules against the table below. Unit-test files
//! (`x/tests.rs`) are not held to them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, bottom first: (layer, its modules). Every module of `src/` is in one.
const LAYERS: &[(&str, &[&str])] = &[
    ("base", &["clock", "config", "driver", "notify", "blockdev"]),
    ("store", &["store", "etcd"]),
    ("scheduler", &["scheduler"]),
    ("executor", &["executor", "scrub", "liveness", "telemetry"]),
    ("service", &["protocol", "auth", "stats", "daemon"]),
    (
        "front ends",
        &["metrics", "redfish", "api", "spool", "socket", "client"],
    ),
    ("tools", &["bench"]),
];

/// The crate-level modules `text` names: `crate::x` anywhere outside comments, and the
/// first-level names of `use crate::{x, y::z, ...}` groups.
fn named_modules(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The first-level names of the group, up to its closing brace.
            let mut depth = 1;
            let mut name = String::new();
            let mut at_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 1 && (c.is_alphanumeric() || c == '_') {
                    if at_start {
                        name.push(c);
                    }
                    continue;
                }
                if !name.is_empty() {
                    out.insert(std::mem::take(&mut name));
                }
                if depth == 0 {
                    break;
                }
                // A name starts a path only after the group's opening or a comma.
                if depth == 1 && c == ',' {
                    at_start = true;
                } else if !c.is_whitespace() {
                    at_start = false;
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out.remove("self");
    out
}

/// The crate module a source file belongs to (`api/conns.rs` -> `api`); none for the
/// crate root, the binaries and the unit-test files (`x/tests.rs`, built only for
/// `cargo test`, which may use any module, e.g. the benchmark's workloads).
fn module_of(rel: &str) -> Option<String> {
    if rel == "lib.rs" || rel == "main.rs" || rel.starts_with("bin/") || rel.ends_with("/tests.rs")
    {
        return None;
    }
    let first = rel.split('/').next()?;
    Some(first.trim_end_matches(".rs").to_string())
}

/// Every violation of the rules in `files` (path under `src/` -> text).
fn violations(files: &BTreeMap<String, String>) -> Vec<String> {
    let layer: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, ms))| ms.iter().map(move |m| (*m, i)))
        .collect();
    let mut bad = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files {
        let Some(m) = module_of(rel) else { continue };
        let Some(&lm) = layer.get(m.as_str()) else {
            bad.push(format!(
                "src/{rel}: module `{m}` is in no layer of the table (tests/layers.rs)"
            ));
            continue;
        };
        for n in named_modules(text) {
            if n == m {
                continue;
            }
            let Some(&ln) = layer.get(n.as_str()) else {
                bad.push(format!(
                    "src/{rel}: names `crate::{n}`, which is in no layer"
                ));
                continue;
            };
            if ln > lm {
                bad.push(format!(
                    "src/{rel}: `{m}` (layer {}) names `{n}` (layer {}, above it)",
                    LAYERS[lm].0, LAYERS[ln].0
                ));
            }
            graph.entry(m.clone()).or_default().insert(n);
        }
    }
    // Circles within a layer: a depth-first search for a back edge.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
        bad: &mut Vec<String>,
    ) {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for n in graph.get(m).into_iter().flatten() {
            match state.get(n.as_str()) {
                Some(1) => {
                    let from = path.iter().position(|p| p == n).unwrap_or(0);
                    bad.push(format!(
                        "import circle: {} -> {n}",
                        path[from..].join(" -> ")
                    ));
                }
                Some(_) => {}
                None => visit(n, graph, state, path, bad),
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    let roots: Vec<String> = graph.keys().cloned().collect();
    for m in roots {
        if !state.contains_key(&m) {
            visit(&m, &graph, &mut state, &mut Vec::new(), &mut bad);
        }
    }
    bad
}

fn read_dir(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
    for e in std::fs::read_dir(dir).expect("read src/") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            read_dir(&p, base, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p
                .strip_prefix(base)
                .expect("under src/")
                .display()
                .to_string();
            out.insert(rel, std::fs::read_to_string(&p).expect("read source"));
        }
    }
}

#[test]
fn no_module_imports_a_higher_layer_or_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    read_dir(&src, &src, &mut files);
    assert!(files.len() > 20, "found only {} source files", files.len());
    let bad = violations(&files);
    assert!(bad.is_empty(), "layer rule broken:\n{}", bad.join("\n"));
}

/// The check itself sees an upward import, in both spellings, a circle within a layer and a
/// module missing from the table.
#[test]
fn the_layer_check_catches_what_it_must() {
    let files = |list: &[(&str, &str)]| -> BTreeMap<String, String> {
        list.iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    };
    let up = files(&[(
        "scheduler/mod.rs",
        "use crate::{\n    config::Config,\n    daemon::{Daemon, Clock},\n};\n",
    )]);
    let v = violations(&up);
    assert!(v.len() == 1 && v[0].contains("names `daemon`"), "{v:?}");
    let path = files(&[("store.rs", "fn f() { let _ = crate::api::spawn; }\n")]);
    assert_eq!(violations(&path).len(), 1);
    // In a comment it is no import.
    let comment = files(&[("store.rs", "/// See crate::api.\nfn f() {}\n")]);
    assert!(violations(&comment).is_empty());
    let circle = files(&[
        ("api.rs", "use crate::redfish;\n"),
        ("redfish/serve.rs", "use crate::{api::status_of, auth};\n"),
    ]);
    let v = violations(&circle);
    assert!(v.iter().any(|b| b.contains("import circle")), "{v:?}");
    let stray = files(&[("newthing.rs", "")]);
    assert_eq!(violations(&stray).len(), 1);
    assert_eq!(
        named_modules("use crate::{a::{b, c}, d, self};\nlet x = crate::e::f;"),
        ["a", "d", "e"].iter().map(|s| s.to_string()).collect()
    );
}
