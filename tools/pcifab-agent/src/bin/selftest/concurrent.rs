// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest concurrent`: several processes echo at once through one device, each
//! with its own byte pattern, so that a reply that reaches the wrong process shows; STATS
//! must count every command.

use std::time::Instant;

use super::args::{device, Opts};
use super::ioctl::{Dev, ECHO};
use super::util::{check, errno, errno_name, first_diff, usage, Fail, Res, Rng};

/// Byte `j` of echo `i` of process `p`: the process number in the top three bits.
fn pattern(p: u64, i: u64, j: usize) -> u8 {
    ((p as u8 & 7) << 5) | ((i as usize + j) % 32) as u8
}

/// One child's work; returns a message on failure.
fn child_work(path: &str, p: u64, count: u64, seed: u64) -> Result<(), String> {
    let d = Dev::open(path, false).map_err(|e| match e {
        Fail::Check(m) | Fail::Usage(m) => m,
    })?;
    let mut rng = Rng::new(seed ^ (p + 1).wrapping_mul(0x1000_0000_0001));
    let mut input = vec![0u8; pcifab_uapi::MRPC_MAX_DATA];
    let mut output = vec![0u8; pcifab_uapi::MRPC_MAX_DATA];
    for i in 0..count {
        // At least 1 byte, so every echo carries the process number.
        let len = 1 + rng.below(pcifab_uapi::MRPC_MAX_DATA as u64) as usize;
        for (j, b) in input[..len].iter_mut().enumerate() {
            *b = pattern(p, i, j);
        }
        output[..len].iter_mut().for_each(|b| *b = 0);
        let m = d
            .mrpc(ECHO, &input[..len], &mut output[..len], 0)
            .map_err(|e| format!("process {p} echo {i}: ioctl failed with {}", errno_name(e)))?;
        if m.status != pcifab_uapi::MRPC_STATUS_DONE || m.ret_value != 0 {
            return Err(format!(
                "process {p} echo {i}: expected status 0x2 return 0x0, got {:#x} {:#x}",
                m.status, m.ret_value
            ));
        }
        // PAX firmware answers ECHO with its input bit-inverted.
        let want: Vec<u8> = input[..len].iter().map(|b| !b).collect();
        if want[..] != output[..len] {
            let foreign = output[..len]
                .iter()
                .map(|b| !b)
                .find(|b| b >> 5 != (p as u8 & 7))
                .map(|b| format!("; bytes of process {} seen", b >> 5))
                .unwrap_or_default();
            return Err(format!(
                "process {p} echo {i} ({len} bytes): expected the input inverted, got: {}{foreign}",
                first_diff(&want, &output[..len])
            ));
        }
    }
    Ok(())
}

pub fn cmd_concurrent(o: &Opts) -> Res<()> {
    let procs = o.procs.ok_or_else(|| usage("concurrent needs --procs P"))?;
    let count = o.count.ok_or_else(|| usage("concurrent needs --count N"))?;
    if !(1..=8).contains(&procs) {
        return Err(usage(
            "--procs must be 1..=8 (3 bits of every byte name the process)",
        ));
    }
    let path = device(o, "/dev/pcifab0");
    let d = Dev::open(&path, false)?;
    let before = d.stats()?;
    // A start gate: every child blocks reading the pipe until the parent closes it.
    let mut gate = [0i32; 2];
    // SAFETY: `gate` has room for the two descriptors.
    if unsafe { libc::pipe(gate.as_mut_ptr()) } != 0 {
        return Err(check(format!("pipe: {}", errno_name(errno()))));
    }
    let start = Instant::now();
    let mut pids = Vec::new();
    for p in 0..procs {
        // SAFETY: this process is single-threaded; the child only calls async-signal-safe
        // functions and its own code, then `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(check(format!("fork: {}", errno_name(errno()))));
        }
        if pid == 0 {
            let mut b = 0u8;
            // SAFETY: plain descriptor calls in the child.
            unsafe {
                libc::close(gate[1]);
                libc::read(gate[0], (&mut b as *mut u8).cast(), 1);
            }
            let code = match child_work(&path, p, count, o.seed) {
                Ok(()) => 0,
                Err(m) => {
                    eprintln!("pcifab-selftest: concurrent: {m}");
                    1
                }
            };
            // SAFETY: ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        pids.push(pid);
    }
    // SAFETY: closing our pipe ends opens the gate.
    unsafe {
        libc::close(gate[0]);
        libc::close(gate[1]);
    }
    let mut failed = Vec::new();
    for (p, pid) in pids.iter().enumerate() {
        let mut st = 0;
        // SAFETY: `st` is a valid out-pointer; `pid` is our child.
        let r = unsafe { libc::waitpid(*pid, &mut st, 0) };
        if r != *pid || !libc::WIFEXITED(st) || libc::WEXITSTATUS(st) != 0 {
            failed.push(format!("process {p} (pid {pid}): wait status {st:#x}"));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let after = d.stats()?;
    let grew = after.mrpc_commands - before.mrpc_commands;
    println!(
        "{{\"test\":\"concurrent\",\"procs\":{procs},\"count\":{count},\"secs\":{secs:.3},\
         \"rate\":{:.1},\"mrpc_commands_delta\":{grew},\"failed_procs\":{}}}",
        (procs * count) as f64 / secs,
        failed.len()
    );
    if !failed.is_empty() {
        return Err(check(format!(
            "{} of {procs} processes failed: {}",
            failed.len(),
            failed.join("; ")
        )));
    }
    if grew != procs * count {
        return Err(check(format!(
            "STATS mrpc_commands: expected to grow by {} ({procs} x {count}), grew by {grew}",
            procs * count
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_names_the_process() {
        for p in 0..8 {
            assert!((0..2000).all(|j| pattern(p, 5, j) >> 5 == p as u8));
        }
    }
}
