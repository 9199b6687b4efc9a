// SPDX-License-Identifier: GPL-2.0-only
//! Command-line options of `pcifab-selftest`: [`Opts`], the common option set most commands
//! share, and [`Args`], the `--key value` map of the commands that parse their own.

use std::collections::HashMap;

use super::util::{errno_from_name, num, usage, Res};

/// The options of the commands that take the common set (see `USAGE` of the entry point).
pub struct Opts {
    pub device: Option<String>,
    pub count: Option<u64>,
    pub procs: Option<u64>,
    pub seed: u64,
    pub size: Option<usize>,
    pub seconds: Option<u64>,
    pub expect: Option<i32>,
    pub input: Vec<u8>,
    pub out_len: usize,
    pub timeout_ms: u32,
    pub write_seed: Option<u64>,
    pub check_seed: Option<u64>,
    pub check_zero: bool,
    /// `echo`, `switchtec-echo`: also report every round trip's latency (`lat_us`).
    pub latencies: bool,
    pub wait_ms: u64,
    pub positional: Vec<String>,
}

fn hex_bytes(s: &str) -> Res<Vec<u8>> {
    let d: Vec<u8> = s.bytes().filter(|b| !matches!(b, b' ' | b':')).collect();
    if d.len() % 2 != 0 {
        return Err(usage(format!("--in '{s}' has an odd number of hex digits")));
    }
    d.chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| usage(format!("--in '{s}' is not hex bytes")))
        })
        .collect()
}

pub fn parse_opts(args: &[String]) -> Res<Opts> {
    let mut o = Opts {
        device: None,
        count: None,
        procs: None,
        seed: 1,
        size: None,
        seconds: None,
        expect: None,
        input: Vec::new(),
        out_len: 0,
        timeout_ms: 0,
        write_seed: None,
        check_seed: None,
        check_zero: false,
        latencies: false,
        wait_ms: 0,
        positional: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| usage(format!("{a} needs a value")))
        };
        match a.as_str() {
            "--device" => o.device = Some(val()?),
            "--count" => o.count = Some(num(a, &val()?)?),
            "--procs" => o.procs = Some(num(a, &val()?)?),
            "--seed" => o.seed = num(a, &val()?)?,
            "--size" => o.size = Some(num(a, &val()?)? as usize),
            "--seconds" => o.seconds = Some(num(a, &val()?)?),
            "--out-len" => o.out_len = num(a, &val()?)? as usize,
            "--timeout" => {
                o.timeout_ms = u32::try_from(num(a, &val()?)?)
                    .map_err(|_| usage("--timeout is at most 4294967295"))?
            }
            "--in" => o.input = hex_bytes(&val()?)?,
            "--write" => o.write_seed = Some(num(a, &val()?)?),
            "--check" => o.check_seed = Some(num(a, &val()?)?),
            "--check-zero" => o.check_zero = true,
            "--latencies" => o.latencies = true,
            "--wait" => o.wait_ms = num(a, &val()?)?,
            "--expect" => {
                let v = val()?;
                o.expect = Some(errno_from_name(&v).ok_or_else(|| {
                    usage(format!(
                        "--expect '{v}': expected an errno name such as ENODEV or 'ok'"
                    ))
                })?)
            }
            s if s.starts_with('-') => return Err(usage(format!("unknown option '{s}'"))),
            s => o.positional.push(s.to_string()),
        }
    }
    Ok(o)
}

/// `--device`, or `default`.
pub fn device(o: &Opts, default: &str) -> String {
    o.device.clone().unwrap_or_else(|| default.to_string())
}

/// `--device` as a PCI address (`cmd` names the command for the message).
pub fn bdf_arg(o: &Opts, cmd: &str) -> Res<String> {
    let d = o
        .device
        .clone()
        .ok_or_else(|| usage(format!("{cmd} needs --device BDF, e.g. 0000:03:00.0")))?;
    if d.contains('/') {
        return Err(usage(format!(
            "--device '{d}': expected a PCI address such as 0000:03:00.0, not a path"
        )));
    }
    Ok(d)
}

/// `--key value` options of the commands that parse their own arguments.
pub struct Args(HashMap<String, String>);

impl Args {
    pub fn parse(args: &[String]) -> Res<Args> {
        let mut m = HashMap::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let Some(k) = a.strip_prefix("--") else {
                return Err(usage(format!("unexpected argument '{a}'")));
            };
            let v = it
                .next()
                .ok_or_else(|| usage(format!("{a} needs a value")))?;
            m.insert(k.to_string(), v.clone());
        }
        Ok(Args(m))
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    pub fn need(&self, k: &str) -> Res<&str> {
        self.get(k)
            .ok_or_else(|| usage(format!("--{k} is required")))
    }
}
