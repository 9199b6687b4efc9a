// SPDX-License-Identifier: GPL-2.0-only
//! `time`: runs a command and prints how long it took on the monotonic clock in
//! microseconds, where a shell in the guest has only `/proc/uptime` (10 ms).

use std::process::Command;
use std::time::Instant;

use super::util::{check, usage, Res};

pub const USAGE: &str = "\
  time -- CMD [ARG...]
        runs CMD (its output goes where this command's goes) and prints on stderr
        {\"test\":\"time\",\"us\":N,\"code\":C}: microseconds on the monotonic clock from
        before its start to after its exit, and its exit code; exits with CMD's code
";

pub fn cmd_time(args: &[String]) -> Res<()> {
    let cmd = match args {
        [dash, cmd @ ..] if dash == "--" && !cmd.is_empty() => cmd,
        _ => return Err(usage("time needs -- CMD [ARG...]")),
    };
    let t = Instant::now();
    let status = Command::new(&cmd[0])
        .args(&cmd[1..])
        .status()
        .map_err(|e| check(format!("cannot start {}: {e}", cmd[0])))?;
    let us = t.elapsed().as_micros();
    let code = status.code().unwrap_or(-1);
    eprintln!("{{\"test\":\"time\",\"us\":{us},\"code\":{code}}}");
    if code != 0 {
        return Err(check(format!("{} exited with {code}", cmd[0])));
    }
    Ok(())
}
