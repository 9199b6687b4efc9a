// SPDX-License-Identifier: GPL-2.0-only
//! Commands run in a guest and what they print: the `pcifab` CLI's JSON (checked against
//! its schema), `pcifab-selftest`'s JSON result lines, and the driver's MRPC counters.

use std::time::Duration;

use serde_json::Value;

use crate::fabric::Host;

/// The CLI's JSON object in `out` (the first line that starts with `{`), checked against the
/// schema it names (Documentation/json); Null when `out` has none.
pub fn json_line(out: &str) -> Result<Value, String> {
    let Some(line) = out.lines().find(|l| l.starts_with('{')) else {
        return Ok(Value::Null);
    };
    let v: Value = serde_json::from_str(line)
        .map_err(|e| format!("the CLI printed a line that is not JSON ({e}): {line}"))?;
    pcifab_schemas::validate(&v).map_err(|e| format!("the CLI's JSON breaks its schema: {e}"))?;
    Ok(v)
}

/// One CLI call; returns (exit code, the JSON line if any, the whole output).
pub fn pcifab_cmd(h: &mut Host, args: &str) -> Result<(i64, Value, String), String> {
    let o = h.run(&format!("pcifab {args} --json"))?;
    h.log_note(&format!("pcifab {args}: exit {}", o.code));
    let v = json_line(&o.out).map_err(|e| format!("{}: `pcifab {args} --json`: {e}", h.name))?;
    Ok((o.code, v, o.out))
}

/// Like [`pcifab_cmd`] but requires success; returns the JSON result.
pub fn pcifab_ok(h: &mut Host, args: &str) -> Result<Value, String> {
    let (code, v, out) = pcifab_cmd(h, args)?;
    if code != 0 || v.get("ok") != Some(&Value::Bool(true)) {
        return Err(format!(
            "{}: `pcifab {args}`: expected exit 0 and {{\"ok\":true,...}}, got exit {code}: {}",
            h.name,
            out.trim()
        ));
    }
    Ok(v)
}

/// Runs a `pcifab-selftest` command line and returns its JSON result line.
///
/// Stdout and stderr arrive merged; the result is the line starting with `{"test":`.
pub fn selftest_json(h: &mut Host, args: &str, timeout: Duration) -> Result<Value, String> {
    let o = h.run_timeout(&format!("pcifab-selftest {args}"), timeout)?;
    let line = o
        .out
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"test\":"))
        .map(str::to_string);
    if o.code != 0 {
        // The failure lines, not the whole table.
        let lines: Vec<&str> = o
            .out
            .lines()
            .filter(|l| !l.starts_with("{\"test\":"))
            .collect();
        let mut shown: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.contains("FAIL"))
            .collect();
        if shown.is_empty() {
            shown = lines[lines.len().saturating_sub(20)..].to_vec();
        }
        return Err(format!(
            "{}: `pcifab-selftest {args}` exited with {} (expected 0):\n{}",
            h.name,
            o.code,
            shown.join("\n")
        ));
    }
    let line = line.ok_or_else(|| {
        format!(
            "{}: `pcifab-selftest {args}` printed no JSON result line; output:\n{}",
            h.name,
            o.out.trim_end()
        )
    })?;
    serde_json::from_str(&line).map_err(|e| {
        format!(
            "{}: bad JSON from pcifab-selftest {args}: {e}: {line}",
            h.name
        )
    })
}

pub fn num_field(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// `pcifab stats --json` as a JSON object.
pub fn stats(h: &mut Host) -> Result<Value, String> {
    let out = h.run_ok("pcifab stats --json")?;
    json_line(&out).map_err(|e| format!("{}: `pcifab stats --json`: {e}", h.name))?;
    serde_json::from_str(out.trim())
        .map_err(|e| format!("{}: `pcifab stats --json`: {e}: {out:?}", h.name))
}

/// One counter of `pcifab stats --json`.
pub fn stats_field(h: &mut Host, k: &str) -> Result<u64, String> {
    let v = stats(h)?;
    v.get(k)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("{}: `pcifab stats --json` has no counter {k}: {v}", h.name))
}

/// Timeout of the short `pcifab-selftest` runs (an MRPC, a BAR check, 20 echoes).
pub const CMD_TIMEOUT_SHORT: Duration = Duration::from_secs(60);

/// Runs `pcifab-selftest mrpc ...`; returns (errno name, elapsed ms, result).
pub fn one_mrpc(h: &mut Host, args: &str) -> Result<(String, f64, Value), String> {
    let v = selftest_json(h, &format!("mrpc {args}"), CMD_TIMEOUT_SHORT)?;
    let errno = v
        .get("errno")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    Ok((errno, num_field(&v, "elapsed_ms"), v))
}

/// `pcifab-selftest ARGS` in `h`, which must exit 0 within `timeout`: the last line of its
/// output that starts with `{`, as JSON (the `blk-*` commands print their result there).
pub fn selftest_ok(h: &mut Host, args: &str, timeout: Duration) -> Result<Value, String> {
    let out = h.run_ok_timeout(&format!("pcifab-selftest {args}"), timeout)?;
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| {
            format!(
                "{}: `pcifab-selftest {args}` printed no JSON: {out}",
                h.name
            )
        })?;
    serde_json::from_str(line).map_err(|e| format!("{}: bad JSON {line}: {e}", h.name))
}
