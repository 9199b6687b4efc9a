// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest hold` and `mrpc`: one MRPC command, reported with how it ended (errno,
//! status, return value, output, time); `hold` waits on a firmware that does not answer
//! and can be interrupted with SIGUSR1.

use std::time::Instant;

use super::args::{device, Opts};
use super::ioctl::{Dev, ECHO};
use super::util::{check, errno_name, json_str, num, usage, Res};

extern "C" fn on_usr1(_: libc::c_int) {}

/// Runs one command and reports how it ended.
fn one_command(
    o: &Opts,
    test: &str,
    cmd: u32,
    input: &[u8],
    out_len: usize,
    timeout_ms: u32,
) -> Res<()> {
    let path = device(o, "/dev/pcifab0");
    let d = Dev::open(&path, false)?;
    let mut out = vec![0u8; out_len];
    let t = Instant::now();
    let r = d.mrpc(cmd, input, &mut out, timeout_ms);
    let ms = t.elapsed().as_millis();
    let (e, status, ret) = match r {
        Ok(m) => (0, m.status, m.ret_value),
        Err(e) => (e, 0, 0),
    };
    let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
    println!(
        "{{\"test\":{},\"cmd\":\"{cmd:#x}\",\"errno\":{},\"status\":{status},\"ret_value\":\"{ret:#x}\",\
         \"output\":{},\"elapsed_ms\":{ms}}}",
        json_str(test),
        json_str(&errno_name(e)),
        json_str(&hex)
    );
    match o.expect {
        Some(x) if x != e => Err(check(format!(
            "{test} command {cmd:#x}: expected {}, got {} after {ms} ms",
            errno_name(x),
            errno_name(e)
        ))),
        _ => Ok(()),
    }
}

pub fn cmd_hold(o: &Opts) -> Res<()> {
    let secs = o.seconds.ok_or_else(|| usage("hold needs --seconds S"))?;
    if !(1..=60).contains(&secs) {
        return Err(usage(
            "--seconds must be 1..=60 (the driver's longest MRPC timeout)",
        ));
    }
    // SIGUSR1 interrupts the wait (EINTR) instead of killing the process.
    // SAFETY: installs a handler that does nothing; no SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let input = *b"hold";
    one_command(o, "hold", ECHO, &input, input.len(), (secs * 1000) as u32)
}

pub fn cmd_mrpc(o: &Opts) -> Res<()> {
    let cmd = o
        .positional
        .first()
        .ok_or_else(|| usage("mrpc needs a command id"))?;
    let cmd = u32::try_from(num("command id", cmd)?).map_err(|_| usage("command id is 32 bits"))?;
    let extra = o.positional.get(1);
    if let Some(x) = extra {
        return Err(usage(format!("unexpected argument '{x}'")));
    }
    one_command(o, "mrpc", cmd, &o.input, o.out_len, o.timeout_ms)
}
