// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest echo` and `switchtec-echo`: MRPC echo round trips with random payloads
//! through pcifab's `PCIFAB_IOCTL_MRPC` or the in-tree C driver's `/dev/switchtec0`, every
//! output compared byte for byte; rate and latency.

use std::time::Instant;

use super::args::{device, Opts};
use super::ioctl::{echo_answer, Dev, ECHO};
use super::util::{check, errno, errno_name, first_diff, json_str, latency, usage, Fail, Res, Rng};

/// Runs `count` echo round trips through `one` and checks every output.
fn echo_loop(
    count: u64,
    seed: u64,
    size: Option<usize>,
    mut one: impl FnMut(&[u8], &mut [u8]) -> Res<()>,
) -> Res<(f64, u64, Vec<u64>)> {
    if size.is_some_and(|s| s > pcifab_uapi::MRPC_MAX_DATA) {
        return Err(usage(format!(
            "--size is at most {}",
            pcifab_uapi::MRPC_MAX_DATA
        )));
    }
    let mut rng = Rng::new(seed);
    let mut input = vec![0u8; pcifab_uapi::MRPC_MAX_DATA];
    let mut output = vec![0u8; pcifab_uapi::MRPC_MAX_DATA];
    let mut lat = Vec::with_capacity(count as usize);
    let mut bytes = 0u64;
    let start = Instant::now();
    for i in 0..count {
        let len = size.unwrap_or_else(|| rng.below(pcifab_uapi::MRPC_MAX_DATA as u64 + 1) as usize);
        rng.fill(&mut input[..len]);
        // Whatever was there must be overwritten: make stale data visible.
        output[..len].iter_mut().for_each(|b| *b = !0);
        let t = Instant::now();
        one(&input[..len], &mut output[..len]).map_err(|e| match e {
            Fail::Check(m) => check(format!("echo {i} ({len} bytes): {m}")),
            u => u,
        })?;
        lat.push(t.elapsed().as_micros() as u64);
        let want = echo_answer(&input[..len]);
        if want[..] != output[..len] {
            return Err(check(format!(
                "echo {i} ({len} bytes, seed {seed}): output is not the input inverted: {}",
                first_diff(&want, &output[..len])
            )));
        }
        bytes += len as u64;
    }
    Ok((start.elapsed().as_secs_f64(), bytes, lat))
}

/// One JSON line; with `all`, `lat_us` lists every round trip's latency in order.
fn report_echo(test: &str, dev: &str, o: &Opts, count: u64, r: (f64, u64, Vec<u64>)) {
    let (secs, bytes, lat) = r;
    let all = if o.latencies {
        let l: Vec<String> = lat.iter().map(u64::to_string).collect();
        format!(",\"lat_us\":[{}]", l.join(","))
    } else {
        String::new()
    };
    let l = latency(lat);
    let rate = if secs > 0.0 { count as f64 / secs } else { 0.0 };
    println!(
        "{{\"test\":{},\"device\":{},\"count\":{count},\"seed\":{},\"bytes\":{bytes},\
         \"secs\":{secs:.3},\"rate\":{rate:.1},\"p50_us\":{},\"p99_us\":{},\"max_us\":{}{all}}}",
        json_str(test),
        json_str(dev),
        o.seed,
        l.p50,
        l.p99,
        l.max
    );
}

fn pcifab_echo_once(d: &Dev, input: &[u8], output: &mut [u8]) -> Res<()> {
    let m = d.mrpc(ECHO, input, output, 0).map_err(|e| {
        check(format!(
            "PCIFAB_IOCTL_MRPC on {}: expected success, got {}",
            d.path,
            errno_name(e)
        ))
    })?;
    if m.status != pcifab_uapi::MRPC_STATUS_DONE || m.ret_value != 0 {
        return Err(check(format!(
            "expected status 0x2 return 0x0, got status {:#x} return {:#x}",
            m.status, m.ret_value
        )));
    }
    Ok(())
}

pub fn cmd_echo(o: &Opts) -> Res<()> {
    let count = o.count.ok_or_else(|| usage("echo needs --count N"))?;
    let path = device(o, "/dev/pcifab0");
    let d = Dev::open(&path, false)?;
    let r = echo_loop(count, o.seed, o.size, |i, out| pcifab_echo_once(&d, i, out))?;
    report_echo("echo", &path, o, count, r);
    Ok(())
}

pub fn cmd_switchtec_echo(o: &Opts) -> Res<()> {
    let count = o
        .count
        .ok_or_else(|| usage("switchtec-echo needs --count N"))?;
    let path = device(o, "/dev/switchtec0");
    let d = Dev::open(&path, true)?;
    let mut wbuf = vec![0u8; 4 + pcifab_uapi::MRPC_MAX_DATA];
    let mut rbuf = vec![0u8; 4 + pcifab_uapi::MRPC_MAX_DATA];
    let r = echo_loop(count, o.seed, o.size, |input, out| {
        let n = input.len();
        wbuf[..4].copy_from_slice(&ECHO.to_le_bytes());
        wbuf[4..4 + n].copy_from_slice(input);
        let w = d.write(&wbuf[..4 + n]);
        if w != (4 + n) as isize {
            return Err(check(format!(
                "write of {} bytes to {path}: expected {}, got {w} ({})",
                4 + n,
                4 + n,
                errno_name(if w < 0 { errno() } else { 0 })
            )));
        }
        let r = d.read(&mut rbuf[..4 + n]);
        if r != (4 + n) as isize {
            return Err(check(format!(
                "read of {} bytes from {path}: expected {}, got {r} ({})",
                4 + n,
                4 + n,
                errno_name(if r < 0 { errno() } else { 0 })
            )));
        }
        let ret = u32::from_le_bytes([rbuf[0], rbuf[1], rbuf[2], rbuf[3]]);
        if ret != 0 {
            return Err(check(format!("return value: expected 0x0, got {ret:#x}")));
        }
        out.copy_from_slice(&rbuf[4..4 + n]);
        Ok(())
    })?;
    report_echo("switchtec-echo", &path, o, count, r);
    Ok(())
}
