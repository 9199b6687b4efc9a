// SPDX-License-Identifier: GPL-2.0-only
//! pcifab-selftest: exercises the management path of `/dev/pcifabN` from inside a test guest.
//!
//! Every subcommand prints one JSON line with its results on stdout and exits with 0 when all
//! its checks held, 1 (with a message on stderr saying what was expected and what happened)
//! when one failed, 2 for a bad command line. See `usage` below and
//! Documentation/testing.rst.

use std::ffi::CString;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use pcifab_uapi::{Arg, Identity, Mrpc, P2pCopy, P2pRoutes, Stats, Version};

#[path = "selftest/blk.rs"]
mod blk;
#[path = "selftest/cycles.rs"]
mod cycles;
#[path = "selftest/faults.rs"]
mod faults;
#[path = "selftest/fuzz.rs"]
mod fuzz;
#[path = "selftest/kmod.rs"]
mod kmod;
#[path = "selftest/kmsg.rs"]
mod kmsg;
#[path = "selftest/p2p.rs"]
mod p2p;

/// A command that parses its own arguments.
type RawCmd = fn(&[String]) -> Res<()>;

const USAGE: &str = "\
usage: pcifab-selftest COMMAND [OPTIONS]

commands:
  echo --count N [--seed S] [--size B] [--device PATH]
        N MRPC echo (0x41) round trips, random payload sizes 0..=1024 (or B bytes),
        random bytes, each output compared byte for byte; rate and p50/p99 latency
  concurrent --procs P --count N [--seed S] [--device PATH]
        P processes at once, N echoes each with their own byte pattern; STATS must
        grow by exactly P*N commands
  abi [--device PATH]
        the bad-input table of every ioctl; nothing may change on a rejected call
  unpriv [--device PATH]
        drop to uid/gid 65534, then: read-only commands work, configuration and
        debug-write commands get EPERM and start nothing (the node must be readable)
  hold --seconds S [--expect ERRNO] [--device PATH]
        one echo with a timeout of S seconds (for a firmware that hangs); reports the
        errno it ended with; SIGUSR1 interrupts it (EINTR)
  mrpc CMD [--in HEX] [--out-len N] [--timeout MS] [--expect ERRNO] [--device PATH]
        one command; reports errno, status, return value, output and elapsed time
  switchtec-echo --count N [--seed S] [--size B] [--device PATH]
        like echo, through the in-tree C driver's /dev/switchtec0 (write the 4-byte
        command id and the input, read the 4-byte return value and the output)
  bar --device BDF (--write SEED | --check SEED | --check-zero)
        maps /sys/bus/pci/devices/BDF/resource2 (a fabric function's device memory):
        --write fills the whole BAR with the pseudo-random pattern of SEED and reads
        it back; --check compares it with that pattern; --check-zero requires zeros
  bar-id --device BDF [--wait MS]
        maps resource0 and prints the function's id (u32 at 0x0: device << 16 |
        vendor) and pdfid (u32 at 0x4); --wait: poll up to MS ms for the device to
        appear and read as something other than all ones
  hold-bar --device BDF --seconds S [--seed S]
        maps resource2 and touches it every 10 ms for S seconds or until SIGTERM (for
        unbinding while mapped); prints `mapped` once mapped, then one JSON line:
        whether SIGBUS came, after how many touches and how long after the last good
        one; without SIGBUS, per phase (SIGUSR1 starts the next, at most 4) how many
        reads returned the pattern of `bar --write SEED`, all ones, zero or other data
(the BAR commands enable the device through sysfs `enable` when no driver holds it)
";

// ------------------------------------------------------------------ errors

/// What went wrong, and how the process should exit.
enum Fail {
    Usage(String),
    Check(String),
}

type Res<T> = Result<T, Fail>;

fn check(msg: impl Into<String>) -> Fail {
    Fail::Check(msg.into())
}

fn usage(msg: impl Into<String>) -> Fail {
    Fail::Usage(msg.into())
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Symbolic name of an errno value (0 = "ok").
fn errno_name(e: i32) -> String {
    let n = match e {
        0 => "ok",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOTTY => "ENOTTY",
        libc::ENOSPC => "ENOSPC",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSYS => "ENOSYS",
        libc::ESPIPE => "ESPIPE",
        libc::EEXIST => "EEXIST",
        libc::ENOLINK => "ENOLINK",
        libc::ERANGE => "ERANGE",
        libc::EREMOTEIO => "EREMOTEIO",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::ENOEXEC => "ENOEXEC",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

fn errno_from_name(s: &str) -> Option<i32> {
    (0..200).find(|&e| errno_name(e).eq_ignore_ascii_case(s))
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

// -------------------------------------------------------------- arguments

struct Opts {
    device: Option<String>,
    count: Option<u64>,
    procs: Option<u64>,
    seed: u64,
    size: Option<usize>,
    seconds: Option<u64>,
    expect: Option<i32>,
    input: Vec<u8>,
    out_len: usize,
    timeout_ms: u32,
    write_seed: Option<u64>,
    check_seed: Option<u64>,
    check_zero: bool,
    wait_ms: u64,
    positional: Vec<String>,
}

fn num(flag: &str, s: &str) -> Res<u64> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|_| usage(format!("{flag} '{s}' is not a number (decimal or 0x...)")))
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

fn parse_opts(args: &[String]) -> Res<Opts> {
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

// ---------------------------------------------------------------- device

/// An open character device.
struct Dev {
    fd: i32,
    path: String,
}

impl Dev {
    fn open(path: &str, write: bool) -> Res<Dev> {
        let c = CString::new(path).map_err(|_| usage("device path contains a NUL byte"))?;
        let flags = if write { libc::O_RDWR } else { libc::O_RDONLY };
        // SAFETY: `c` is a valid NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = errno();
            let hint = match e {
                libc::ENOENT => "; is the driver loaded and bound?",
                libc::EACCES => "; the node must be readable by this user (chmod 666)",
                _ => "",
            };
            return Err(check(format!(
                "cannot open {path}: {}{hint}",
                std::io::Error::from_raw_os_error(e)
            )));
        }
        Ok(Dev {
            fd,
            path: path.to_string(),
        })
    }

    /// ioctl with a raw argument; Ok or the errno.
    fn ioctl_raw(&self, cmd: u32, arg: *mut u8) -> Result<(), i32> {
        // SAFETY: the kernel validates `arg`; callers pass pointers into memory they own or
        // deliberately bad ones, which the kernel must reject with EFAULT.
        let rc = unsafe { libc::ioctl(self.fd, cmd as _, arg) };
        if rc < 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    fn ioctl<T: Arg>(&self, cmd: u32, arg: &mut T) -> Result<(), i32> {
        self.ioctl_raw(cmd, (arg as *mut T).cast())
    }

    fn stats(&self) -> Res<Stats> {
        let mut s = Stats::new();
        self.ioctl(pcifab_uapi::PCIFAB_IOCTL_STATS, &mut s)
            .map_err(|e| {
                check(format!(
                    "PCIFAB_IOCTL_STATS on {} failed: {}",
                    self.path,
                    errno_name(e)
                ))
            })?;
        Ok(s)
    }

    /// One MRPC command. Returns the filled struct or the errno.
    fn mrpc(&self, cmd: u32, input: &[u8], out: &mut [u8], timeout_ms: u32) -> Result<Mrpc, i32> {
        let mut m = Mrpc::new();
        m.cmd = cmd;
        m.in_len = input.len() as u32;
        m.out_len = out.len() as u32;
        m.timeout_ms = timeout_ms;
        m.in_ptr = input.as_ptr() as u64;
        m.out_ptr = out.as_mut_ptr() as u64;
        self.ioctl(pcifab_uapi::PCIFAB_IOCTL_MRPC, &mut m)?;
        Ok(m)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: `fd` is ours and closed once.
        unsafe { libc::close(self.fd) };
    }
}

// -------------------------------------------------------------- helpers

/// xorshift64*: small, fast, good enough for payloads.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Never zero; spread small seeds.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Latency summary in microseconds.
struct Lat {
    p50: u64,
    p99: u64,
    max: u64,
}

fn latency(mut us: Vec<u64>) -> Lat {
    if us.is_empty() {
        return Lat {
            p50: 0,
            p99: 0,
            max: 0,
        };
    }
    us.sort_unstable();
    let at = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize];
    Lat {
        p50: at(0.50),
        p99: at(0.99),
        max: us[us.len() - 1],
    }
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "first difference at byte {i}: expected {:#04x}, got {:#04x}",
            a[i], b[i]
        ),
        None => format!("lengths differ: expected {}, got {}", a.len(), b.len()),
    }
}

fn device(o: &Opts, default: &str) -> String {
    o.device.clone().unwrap_or_else(|| default.to_string())
}

const ECHO: u32 = 0x41;

// ------------------------------------------------------------------ echo

/// What a PAX part answers to ECHO: its input, bit-inverted (switchtec-user's cli/main.c
/// `test` expects `out == ~in`).
pub(crate) fn echo_answer(input: &[u8]) -> Vec<u8> {
    input.iter().map(|b| !b).collect()
}

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

fn report_echo(test: &str, dev: &str, count: u64, seed: u64, r: (f64, u64, Vec<u64>)) {
    let (secs, bytes, lat) = r;
    let l = latency(lat);
    let rate = if secs > 0.0 { count as f64 / secs } else { 0.0 };
    println!(
        "{{\"test\":{},\"device\":{},\"count\":{count},\"seed\":{seed},\"bytes\":{bytes},\
         \"secs\":{secs:.3},\"rate\":{rate:.1},\"p50_us\":{},\"p99_us\":{},\"max_us\":{}}}",
        json_str(test),
        json_str(dev),
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

fn cmd_echo(o: &Opts) -> Res<()> {
    let count = o.count.ok_or_else(|| usage("echo needs --count N"))?;
    let path = device(o, "/dev/pcifab0");
    let d = Dev::open(&path, false)?;
    let r = echo_loop(count, o.seed, o.size, |i, out| pcifab_echo_once(&d, i, out))?;
    report_echo("echo", &path, count, o.seed, r);
    Ok(())
}

fn cmd_switchtec_echo(o: &Opts) -> Res<()> {
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
        // SAFETY: `wbuf` holds at least 4 + n initialised bytes.
        let w = unsafe { libc::write(d.fd, wbuf.as_ptr().cast(), 4 + n) };
        if w != (4 + n) as isize {
            return Err(check(format!(
                "write of {} bytes to {path}: expected {}, got {w} ({})",
                4 + n,
                4 + n,
                errno_name(if w < 0 { errno() } else { 0 })
            )));
        }
        // SAFETY: `rbuf` has room for 4 + n bytes.
        let r = unsafe { libc::read(d.fd, rbuf.as_mut_ptr().cast(), 4 + n) };
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
    report_echo("switchtec-echo", &path, count, o.seed, r);
    Ok(())
}

// ------------------------------------------------------------ concurrent

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

fn cmd_concurrent(o: &Opts) -> Res<()> {
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

// ------------------------------------------------------------------- abi

/// Anonymous memory with a known layout: pages 0-1 read-write, page 2 inaccessible, page 3
/// read-only (holding what [`Arena::set_read_only`] put there).
struct Arena {
    base: *mut u8,
}

/// The addresses of the arena's special pages, for building bad arguments.
#[derive(Clone, Copy)]
struct Pages {
    none: *mut u8,
    read_only: *mut u8,
}

const PAGE: usize = 4096;
const ARENA_RW: usize = 2 * PAGE;

impl Arena {
    fn new() -> Res<Arena> {
        // SAFETY: a fresh anonymous private mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(check(format!("mmap: {}", errno_name(errno()))));
        }
        let a = Arena { base: p.cast() };
        a.protect(2, libc::PROT_NONE)?;
        a.protect(3, libc::PROT_READ)?;
        Ok(a)
    }

    fn protect(&self, page: usize, prot: i32) -> Res<()> {
        // SAFETY: the page lies inside the mapping made in `new`.
        if unsafe { libc::mprotect(self.base.add(page * PAGE).cast(), PAGE, prot) } != 0 {
            return Err(check(format!("mprotect: {}", errno_name(errno()))));
        }
        Ok(())
    }

    /// Puts `bytes` at the start of the read-only page.
    fn set_read_only(&mut self, bytes: &[u8]) -> Res<()> {
        self.protect(3, libc::PROT_READ | libc::PROT_WRITE)?;
        // SAFETY: page 3 is writable now and `bytes` fits in it.
        unsafe {
            std::ptr::write_bytes(self.base.add(3 * PAGE), 0, PAGE);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(3 * PAGE), bytes.len());
        }
        self.protect(3, libc::PROT_READ)
    }

    fn rw(&mut self) -> &mut [u8] {
        // SAFETY: the first two pages are read-write and only reachable through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.base, ARENA_RW) }
    }

    fn pages(&self) -> Pages {
        // SAFETY: both addresses lie inside the mapping.
        unsafe {
            Pages {
                none: self.base.add(2 * PAGE),
                read_only: self.base.add(3 * PAGE),
            }
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.base.cast(), 4 * PAGE) };
    }
}

fn as_bytes<T: Arg>(v: &T) -> Vec<u8> {
    // SAFETY: `Arg` types are plain `repr(C)` data without padding.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

/// One ioctl of the table.
/// `struct pcifab_identity` of uAPI 1.0, which grew since.
const IDENTITY_V1_SIZE: usize = 68;

struct Ioctl {
    name: &'static str,
    nr: u32,
    size: usize,
    /// The first version's size: smaller is `EINVAL`, from here to `size` is accepted.
    min: usize,
    /// A valid struct of this ioctl, as bytes.
    valid: Vec<u8>,
    /// MRPC commands a successful call starts.
    starts: u64,
}

struct AbiRun<'a> {
    dev: &'a Dev,
    arena: Arena,
    rows: Vec<String>,
    failures: Vec<String>,
}

impl AbiRun<'_> {
    /// Runs one case: `setup` fills the arena and returns the argument pointer.
    fn case(
        &mut self,
        name: &str,
        nr: u32,
        expected: i32,
        starts: u64,
        setup: impl FnOnce(&mut [u8], Pages) -> *mut u8,
    ) -> Res<()> {
        let pages = self.arena.pages();
        let rw = self.arena.rw();
        rw.fill(0);
        let arg = setup(rw, pages);
        let snapshot = self.arena.rw().to_vec();
        let before = self.dev.stats()?;
        let got = match self.dev.ioctl_raw(nr, arg) {
            Ok(()) => 0,
            Err(e) => e,
        };
        let after = self.dev.stats()?;
        let mut why = Vec::new();
        if got != expected {
            why.push(format!(
                "expected {}, got {}",
                errno_name(expected),
                errno_name(got)
            ));
        }
        let want_commands = if got == 0 { starts } else { 0 };
        let delta = after.mrpc_commands.wrapping_sub(before.mrpc_commands);
        if delta != want_commands {
            why.push(format!(
                "STATS mrpc_commands: expected +{want_commands}, got +{delta}"
            ));
        }
        if got != 0 {
            // mrpc_completions and event_irqs are left out: the completion interrupt of an
            // earlier, successful command may be counted after its ioctl returned.
            if before.mrpc_timeouts != after.mrpc_timeouts
                || before.mrpc_firmware_dead != after.mrpc_firmware_dead
            {
                why.push(format!(
                    "STATS changed by a rejected call: before {before:?}, after {after:?}"
                ));
            }
            if self.arena.rw() != snapshot.as_slice() {
                let i = snapshot
                    .iter()
                    .zip(self.arena.rw().iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                why.push(format!(
                    "a rejected call wrote user memory (first changed byte at offset {i})"
                ));
            }
        }
        self.rows.push(format!(
            "{{\"case\":{},\"expected\":{},\"got\":{},\"ok\":{}}}",
            json_str(name),
            json_str(&errno_name(expected)),
            json_str(&errno_name(got)),
            why.is_empty()
        ));
        eprintln!(
            "{:<58} expected {:<9} got {:<9} {}",
            name,
            errno_name(expected),
            errno_name(got),
            if why.is_empty() { "ok" } else { "FAIL" }
        );
        if !why.is_empty() {
            self.failures.push(format!("{name}: {}", why.join(", ")));
        }
        Ok(())
    }
}

fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn cmd_abi(o: &Opts) -> Res<()> {
    let path = device(o, "/dev/pcifab0");
    let dev = Dev::open(&path, false)?;
    // P2P calls exist only where the firmware has pcifab's route extension.
    let mut id = Identity::new();
    dev.ioctl(pcifab_uapi::PCIFAB_IOCTL_IDENTITY, &mut id)
        .map_err(|e| check(format!("IDENTITY: {}", errno_name(e))))?;
    let p2p = id.features & pcifab_uapi::FEATURE_P2P_ROUTES != 0;
    let mut r = AbiRun {
        dev: &dev,
        arena: Arena::new()?,
        rows: Vec::new(),
        failures: Vec::new(),
    };
    // MRPC input/output live at fixed offsets of the second page, past any struct.
    const IN_OFF: usize = PAGE;
    const OUT_OFF: usize = PAGE + 1024 + 64;
    let base = r.arena.base as u64;
    let mut m = Mrpc::new();
    m.cmd = ECHO;
    m.in_ptr = base + IN_OFF as u64;
    m.out_ptr = base + OUT_OFF as u64;
    let mut ioctls = vec![
        Ioctl {
            name: "VERSION",
            nr: pcifab_uapi::PCIFAB_IOCTL_VERSION,
            size: std::mem::size_of::<Version>(),
            min: std::mem::size_of::<Version>(),
            valid: as_bytes(&Version::new()),
            starts: 0,
        },
        Ioctl {
            name: "IDENTITY",
            nr: pcifab_uapi::PCIFAB_IOCTL_IDENTITY,
            size: std::mem::size_of::<Identity>(),
            min: IDENTITY_V1_SIZE,
            valid: as_bytes(&Identity::new()),
            starts: 0,
        },
        Ioctl {
            name: "MRPC",
            nr: pcifab_uapi::PCIFAB_IOCTL_MRPC,
            size: std::mem::size_of::<Mrpc>(),
            min: std::mem::size_of::<Mrpc>(),
            valid: as_bytes(&m),
            starts: 1,
        },
        Ioctl {
            name: "STATS",
            nr: pcifab_uapi::PCIFAB_IOCTL_STATS,
            size: std::mem::size_of::<Stats>(),
            min: std::mem::size_of::<Stats>(),
            valid: as_bytes(&Stats::new()),
            starts: 0,
        },
        Ioctl {
            // Room for no routes: the firmware's route list is one command.
            name: "P2P_ROUTES",
            nr: pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTES,
            size: std::mem::size_of::<P2pRoutes>(),
            min: std::mem::size_of::<P2pRoutes>(),
            valid: as_bytes(&{
                let mut l = P2pRoutes::new();
                l.route_size = std::mem::size_of::<pcifab_uapi::Route>() as u32;
                l
            }),
            starts: 1,
        },
    ];
    if !p2p {
        // The whole call is refused before its argument matters.
        r.case(
            "P2P_ROUTES without the firmware's route extension",
            pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTES,
            libc::EOPNOTSUPP,
            0,
            |b, _| {
                let mut l = P2pRoutes::new();
                l.route_size = std::mem::size_of::<pcifab_uapi::Route>() as u32;
                b[..std::mem::size_of::<P2pRoutes>()].copy_from_slice(&as_bytes(&l));
                b.as_mut_ptr()
            },
        )?;
        ioctls.retain(|io| io.name != "P2P_ROUTES");
    }
    for io in &ioctls {
        let (n, sz, v) = (io.name, io.size, &io.valid);
        let with_size = |buf: &mut [u8], size: usize| {
            buf[..v.len()].copy_from_slice(v);
            put_u32(buf, 0, size as u32);
        };
        r.case(
            &format!("{n} valid (size {sz})"),
            io.nr,
            0,
            io.starts,
            |b, _| {
                with_size(b, sz);
                b.as_mut_ptr()
            },
        )?;
        let min = io.min;
        for (what, size) in [("0", 0), ("4", 4), ("first version's size-1", min - 1)] {
            r.case(
                &format!("{n} size {what}"),
                io.nr,
                libc::EINVAL,
                0,
                |b, _| {
                    with_size(b, size);
                    b.as_mut_ptr()
                },
            )?;
        }
        r.case(&format!("{n} size 4097"), io.nr, libc::E2BIG, 0, |b, _| {
            with_size(b, 4097);
            b.as_mut_ptr()
        })?;
        r.case(
            &format!("{n} size 0xffffffff"),
            io.nr,
            libc::E2BIG,
            0,
            |b, _| {
                with_size(b, u32::MAX as usize);
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} size sizeof+64, non-zero byte past the struct"),
            io.nr,
            libc::E2BIG,
            0,
            |b, _| {
                with_size(b, sz + 64);
                b[sz + 63] = 1;
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} size sizeof+1, non-zero byte right after"),
            io.nr,
            libc::E2BIG,
            0,
            |b, _| {
                with_size(b, sz + 1);
                b[sz] = 0x80;
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} size sizeof+64, zeros past the struct"),
            io.nr,
            0,
            io.starts,
            |b, _| {
                with_size(b, sz + 64);
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} size 4096, zeros past the struct"),
            io.nr,
            0,
            io.starts,
            |b, _| {
                with_size(b, 4096);
                b.as_mut_ptr()
            },
        )?;
        for flags in [1u32, 0x8000_0000] {
            r.case(
                &format!("{n} flags {flags:#x}"),
                io.nr,
                libc::EINVAL,
                0,
                |b, _| {
                    with_size(b, sz);
                    put_u32(b, 4, flags);
                    b.as_mut_ptr()
                },
            )?;
        }
        r.case(
            &format!("{n} NULL argument"),
            io.nr,
            libc::EFAULT,
            0,
            |_, _| std::ptr::null_mut(),
        )?;
        r.case(
            &format!("{n} argument in an inaccessible page"),
            io.nr,
            libc::EFAULT,
            0,
            |_, p| p.none,
        )?;
        r.case(
            &format!("{n} argument running into an inaccessible page"),
            io.nr,
            libc::EFAULT,
            0,
            |b, _| {
                // The size field is readable, the rest of the struct is not.
                let at = ARENA_RW - 8;
                b[at..at + 8].copy_from_slice(&v[..8]);
                b[at..].as_mut_ptr()
            },
        )?;
        // Readable but not writable: the result cannot be written back.
        let mut ro = v.clone();
        put_u32(&mut ro, 0, sz as u32);
        r.arena.set_read_only(&ro)?;
        r.case(
            &format!("{n} argument in a read-only page"),
            io.nr,
            libc::EFAULT,
            0,
            |_, p| p.read_only,
        )?;
    }

    // MRPC-specific fields. Offsets in struct pcifab_mrpc.
    const IN_LEN: usize = 12;
    const OUT_LEN: usize = 16;
    const TIMEOUT: usize = 20;
    const IN_PTR: usize = 24;
    const OUT_PTR: usize = 32;
    let mrpc_nr = pcifab_uapi::PCIFAB_IOCTL_MRPC;
    let valid = ioctls[2].valid.clone();
    let put_u64 =
        |b: &mut [u8], off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    type Edit<'a> = Box<dyn Fn(&mut [u8]) + 'a>;
    let none = r.arena.pages().none as u64;
    // Zero-filled again: only the first bytes of the read-only page were set.
    let ro = r.arena.pages().read_only as u64 + 1024;
    let cases: Vec<(&str, i32, u64, Edit)> = vec![
        (
            "MRPC in_len 1024, out_len 1024",
            0,
            1,
            Box::new(|b| {
                put_u32(b, IN_LEN, 1024);
                put_u32(b, OUT_LEN, 1024);
            }),
        ),
        (
            "MRPC in_len 1025",
            libc::EINVAL,
            0,
            Box::new(|b| put_u32(b, IN_LEN, 1025)),
        ),
        (
            "MRPC out_len 1025",
            libc::EINVAL,
            0,
            Box::new(|b| put_u32(b, OUT_LEN, 1025)),
        ),
        (
            "MRPC in_len 0xffffffff",
            libc::EINVAL,
            0,
            Box::new(|b| put_u32(b, IN_LEN, u32::MAX)),
        ),
        (
            "MRPC timeout_ms 60000",
            0,
            1,
            Box::new(|b| put_u32(b, TIMEOUT, 60_000)),
        ),
        (
            "MRPC timeout_ms 60001",
            libc::EINVAL,
            0,
            Box::new(|b| put_u32(b, TIMEOUT, 60_001)),
        ),
        (
            "MRPC in_ptr NULL, in_len 4",
            libc::EFAULT,
            0,
            Box::new(|b| {
                put_u32(b, IN_LEN, 4);
                put_u64(b, IN_PTR, 0);
            }),
        ),
        (
            "MRPC in_ptr inaccessible, in_len 4",
            libc::EFAULT,
            0,
            Box::new(move |b| {
                put_u32(b, IN_LEN, 4);
                put_u64(b, IN_PTR, none);
            }),
        ),
        (
            "MRPC in_ptr runs into an inaccessible page",
            libc::EFAULT,
            0,
            Box::new(move |b| {
                put_u32(b, IN_LEN, 16);
                put_u64(b, IN_PTR, none - 8);
            }),
        ),
        (
            "MRPC in_ptr NULL, in_len 0",
            0,
            1,
            Box::new(|b| put_u64(b, IN_PTR, 0)),
        ),
        (
            "MRPC out_ptr NULL, out_len 4",
            libc::EFAULT,
            0,
            Box::new(|b| {
                put_u32(b, OUT_LEN, 4);
                put_u64(b, OUT_PTR, 0);
            }),
        ),
        (
            "MRPC out_ptr inaccessible, out_len 4",
            libc::EFAULT,
            0,
            Box::new(move |b| {
                put_u32(b, OUT_LEN, 4);
                put_u64(b, OUT_PTR, none);
            }),
        ),
        (
            "MRPC out_ptr read-only, out_len 4",
            libc::EFAULT,
            0,
            Box::new(move |b| {
                put_u32(b, OUT_LEN, 4);
                put_u64(b, OUT_PTR, ro);
            }),
        ),
    ];
    for (name, expected, starts, edit) in cases {
        r.case(name, mrpc_nr, expected, starts, |b, _| {
            b[..valid.len()].copy_from_slice(&valid);
            edit(b);
            b.as_mut_ptr()
        })?;
    }
    // P2P_COPY: every bad argument is refused before the firmware is asked.
    let copy_nr = pcifab_uapi::PCIFAB_IOCTL_P2P_COPY;
    let mut c = P2pCopy::new();
    (c.src.kind, c.src.pdfid) = (pcifab_uapi::P2P_FUNCTION, 0x0300);
    (c.dst.kind, c.dst.pdfid) = (pcifab_uapi::P2P_FUNCTION, 0x0400);
    c.len = 1;
    let copy_valid = as_bytes(&c);
    // Offsets in struct pcifab_p2p_copy.
    const SRC_KIND: usize = 8;
    const SRC_RSVD: usize = 14;
    const DST_KIND: usize = 24;
    const LEN: usize = 40;
    const COPY_TIMEOUT: usize = 60;
    let copy_cases: Vec<(&str, Edit)> = vec![
        ("P2P_COPY len 0", Box::new(|b| put_u64(b, LEN, 0))),
        (
            "P2P_COPY len PCIFAB_P2P_MAX_LEN + 1",
            Box::new(|b| put_u64(b, LEN, pcifab_uapi::P2P_MAX_LEN + 1)),
        ),
        (
            "P2P_COPY source kind 3",
            Box::new(|b| put_u32(b, SRC_KIND, 3)),
        ),
        (
            "P2P_COPY destination kind 0xffffffff",
            Box::new(|b| put_u32(b, DST_KIND, u32::MAX)),
        ),
        (
            "P2P_COPY both ends user buffers",
            Box::new(|b| {
                put_u32(b, SRC_KIND, pcifab_uapi::P2P_USER);
                put_u32(b, DST_KIND, pcifab_uapi::P2P_USER);
            }),
        ),
        (
            "P2P_COPY user buffer to IOVA",
            Box::new(|b| {
                put_u32(b, SRC_KIND, pcifab_uapi::P2P_USER);
                put_u32(b, DST_KIND, pcifab_uapi::P2P_IOVA);
            }),
        ),
        (
            "P2P_COPY reserved field of an end",
            Box::new(|b| b[SRC_RSVD] = 1),
        ),
        (
            "P2P_COPY timeout_ms PCIFAB_P2P_MAX_TIMEOUT_MS + 1",
            Box::new(|b| put_u32(b, COPY_TIMEOUT, pcifab_uapi::P2P_MAX_TIMEOUT_MS + 1)),
        ),
    ];
    for (name, edit) in copy_cases {
        r.case(name, copy_nr, libc::EINVAL, 0, |b, _| {
            b[..copy_valid.len()].copy_from_slice(&copy_valid);
            edit(b);
            b.as_mut_ptr()
        })?;
    }
    // Unknown ioctl numbers.
    for (name, nr) in [
        ("unknown ioctl 0xfa7f", pcifab_uapi::io(0xfa, 0x7f)),
        ("unknown ioctl 0xfaff", pcifab_uapi::io(0xfa, 0xff)),
        ("unknown ioctl TCGETS 0x5401", 0x5401),
        (
            "unknown ioctl _IOWR(0xfa, 0x02, 48)",
            (3 << 30) | (48 << 16) | pcifab_uapi::io(0xfa, 0x02),
        ),
    ] {
        r.case(name, nr, libc::ENOTTY, 0, |b, _| {
            b[..valid.len()].copy_from_slice(&valid);
            b.as_mut_ptr()
        })?;
    }
    // The version a valid call reports.
    let mut v = Version::new();
    dev.ioctl(pcifab_uapi::PCIFAB_IOCTL_VERSION, &mut v)
        .map_err(|e| check(format!("VERSION: {}", errno_name(e))))?;
    if v.major != pcifab_uapi::VERSION_MAJOR {
        r.failures.push(format!(
            "VERSION major: expected {}, got {}",
            pcifab_uapi::VERSION_MAJOR,
            v.major
        ));
    }
    println!(
        "{{\"test\":\"abi\",\"uapi\":\"{}.{}\",\"cases\":{},\"failed\":{},\"results\":[{}]}}",
        v.major,
        v.minor,
        r.rows.len(),
        r.failures.len(),
        r.rows.join(",")
    );
    if r.failures.is_empty() {
        Ok(())
    } else {
        Err(check(format!(
            "{} of {} cases failed: {}",
            r.failures.len(),
            r.rows.len(),
            r.failures.join("; ")
        )))
    }
}

// ---------------------------------------------------------------- unpriv

fn cmd_unpriv(o: &Opts) -> Res<()> {
    let path = device(o, "/dev/pcifab0");
    const NOBODY: u32 = 65534;
    // SAFETY: plain credential system calls.
    let ok = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(NOBODY) == 0
            && libc::setuid(NOBODY) == 0
    };
    if !ok {
        return Err(check(format!(
            "cannot drop privileges to uid/gid {NOBODY}: {} (run as root)",
            errno_name(errno())
        )));
    }
    // SAFETY: trivial getters.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    if uid != NOBODY || euid != NOBODY {
        return Err(check(format!(
            "uid/euid after setuid: expected {NOBODY}, got {uid}/{euid}"
        )));
    }
    let d = Dev::open(&path, false)?;
    let mut fails = Vec::new();
    let mut rows = Vec::new();
    let mut v = Version::new();
    if let Err(e) = d.ioctl(pcifab_uapi::PCIFAB_IOCTL_VERSION, &mut v) {
        fails.push(format!("VERSION: expected ok, got {}", errno_name(e)));
    }
    let mut id = Identity::new();
    if let Err(e) = d.ioctl(pcifab_uapi::PCIFAB_IOCTL_IDENTITY, &mut id) {
        fails.push(format!("IDENTITY: expected ok, got {}", errno_name(e)));
    }
    // Read-only class: allowed.
    let mut temp = 0u32;
    for (name, cmd, input) in [
        ("echo 0x41", ECHO, b"unprivileged!".to_vec()),
        ("die temp 0x04 GET", 0x04, 2u32.to_le_bytes().to_vec()),
    ] {
        let before = d.stats()?;
        let mut out = vec![0u8; if cmd == ECHO { input.len() } else { 4 }];
        let r = d.mrpc(cmd, &input, &mut out, 0);
        let after = d.stats()?;
        let got = match &r {
            Ok(_) => "ok".to_string(),
            Err(e) => errno_name(*e),
        };
        rows.push(format!(
            "{{\"cmd\":{},\"expected\":\"ok\",\"got\":{}}}",
            json_str(name),
            json_str(&got)
        ));
        match r {
            Ok(m) if m.status == pcifab_uapi::MRPC_STATUS_DONE && m.ret_value == 0 => {
                if cmd == ECHO && out[..] != echo_answer(&input)[..] {
                    fails.push(format!("{name}: output is not the input inverted"));
                }
                if cmd == 0x04 {
                    temp = u32::from_le_bytes([out[0], out[1], out[2], out[3]]);
                }
            }
            Ok(m) => fails.push(format!(
                "{name}: expected status 0x2 return 0x0, got {:#x} {:#x}",
                m.status, m.ret_value
            )),
            Err(e) => fails.push(format!("{name}: expected ok, got {}", errno_name(e))),
        }
        if after.mrpc_commands != before.mrpc_commands + 1 {
            fails.push(format!(
                "{name}: STATS mrpc_commands: expected +1, got +{}",
                after.mrpc_commands - before.mrpc_commands
            ));
        }
    }
    // Configuration (CAP_SYS_ADMIN) and debug-write (CAP_SYS_RAWIO) classes: refused.
    for (name, cmd) in [
        ("port control 0x8d", 0x8d),
        ("bind 0x84", 0x84),
        ("unbind 0x85", 0x85),
        ("pcifab configuration extension 0xf080", 0xf080),
        ("P2P route 0xf004", 0xf004),
        ("debug-write 0x87", 0x87),
        ("unknown id 0x1234", 0x1234),
        ("bind with bits 16-31 set 0x10084", 0x1_0084),
        ("echo with bits 16-31 set 0x10041", 0x1_0041),
    ] {
        let before = d.stats()?;
        let input = [0u8; 16];
        let mut out = [0u8; 16];
        let r = d.mrpc(cmd, &input, &mut out, 0);
        let after = d.stats()?;
        let got = match &r {
            Ok(_) => "ok".to_string(),
            Err(e) => errno_name(*e),
        };
        rows.push(format!(
            "{{\"cmd\":{},\"expected\":\"EPERM\",\"got\":{}}}",
            json_str(name),
            json_str(&got)
        ));
        if r.err() != Some(libc::EPERM) {
            fails.push(format!("{name}: expected EPERM, got {got}"));
        }
        if after.mrpc_commands != before.mrpc_commands {
            fails.push(format!(
                "{name}: STATS mrpc_commands: expected +0 for a refused command, got +{}",
                after.mrpc_commands - before.mrpc_commands
            ));
        }
    }
    // P2P: changing routes and copying need CAP_SYS_ADMIN; the route list is open.
    let mut add = pcifab_uapi::P2pRoute::new();
    (add.route.pdfid, add.route.size) = (0x0300, 4096);
    let mut copy = P2pCopy::new();
    (copy.src.pdfid, copy.dst.pdfid, copy.len) = (0x0300, 0x0400, 1);
    let mut list = P2pRoutes::new();
    list.route_size = std::mem::size_of::<pcifab_uapi::Route>() as u32;
    for (name, r, want) in [
        (
            "P2P_ROUTE_ADD",
            d.ioctl(pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTE_ADD, &mut add),
            libc::EPERM,
        ),
        (
            "P2P_COPY",
            d.ioctl(pcifab_uapi::PCIFAB_IOCTL_P2P_COPY, &mut copy),
            libc::EPERM,
        ),
        (
            "P2P_ROUTES",
            d.ioctl(pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTES, &mut list),
            // Only firmware with pcifab's route extension has routes to list.
            if id.features & pcifab_uapi::FEATURE_P2P_ROUTES != 0 {
                0
            } else {
                libc::EOPNOTSUPP
            },
        ),
    ] {
        let got = r.err().unwrap_or(0);
        rows.push(format!(
            "{{\"cmd\":{},\"expected\":{},\"got\":{}}}",
            json_str(name),
            json_str(&errno_name(want)),
            json_str(&errno_name(got))
        ));
        if got != want {
            fails.push(format!(
                "{name}: expected {}, got {}",
                errno_name(want),
                errno_name(got)
            ));
        }
    }
    println!(
        "{{\"test\":\"unpriv\",\"uid\":{uid},\"die_temp_centi\":{temp},\"results\":[{}],\"failed\":{}}}",
        rows.join(","),
        fails.len()
    );
    if fails.is_empty() {
        Ok(())
    } else {
        Err(check(fails.join("; ")))
    }
}

// ------------------------------------------------------------ hold / mrpc

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

fn cmd_hold(o: &Opts) -> Res<()> {
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

fn cmd_mrpc(o: &Opts) -> Res<()> {
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

// ------------------------------------------------------------------- BARs

/// A BAR of a PCI function, mapped through `/sys/bus/pci/devices/BDF/resourceN`.
struct BarMap {
    ptr: *mut u8,
    len: usize,
    fd: i32,
}

impl BarMap {
    fn words(&self) -> usize {
        self.len / 8
    }

    fn read64(&self, i: usize) -> u64 {
        assert!(i < self.words());
        // SAFETY: `i` is inside the mapping, which is 8-byte aligned (page aligned).
        unsafe { std::ptr::read_volatile(self.ptr.cast::<u64>().add(i)) }
    }

    fn write64(&self, i: usize, v: u64) {
        assert!(i < self.words());
        // SAFETY: as in `read64`; the mapping is writable.
        unsafe { std::ptr::write_volatile(self.ptr.cast::<u64>().add(i), v) }
    }

    fn read32(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: inside the mapping and aligned.
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u32>()) }
    }
}

impl Drop for BarMap {
    fn drop(&mut self) {
        // SAFETY: the mapping and the descriptor are ours and released once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
            libc::close(self.fd);
        }
    }
}

fn sysfs_dev(bdf: &str) -> String {
    format!("/sys/bus/pci/devices/{bdf}")
}

/// Turns memory decoding on through sysfs `enable` when nobody did (no driver binds these
/// functions in the test guests; without it the BARs read all ones).
fn enable_device(bdf: &str) -> Res<()> {
    let dir = sysfs_dev(bdf);
    let en = std::fs::read_to_string(format!("{dir}/enable"))
        .map_err(|e| check(format!("{dir}/enable: {e}; is {bdf} there?")))?;
    if en.trim() == "0" {
        std::fs::write(format!("{dir}/enable"), "1")
            .map_err(|e| check(format!("writing 1 to {dir}/enable: {e}")))?;
    }
    Ok(())
}

fn map_bar(bdf: &str, bar: u32) -> Res<BarMap> {
    enable_device(bdf)?;
    let path = format!("{}/resource{bar}", sysfs_dev(bdf));
    let c = CString::new(path.as_str()).map_err(|_| usage("device name contains a NUL byte"))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_SYNC | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(check(format!(
            "cannot open {path}: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `st` is written by fstat on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size <= 0 {
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return Err(check(format!(
            "{path}: expected a BAR of non-zero size, got size {} (BAR unassigned?)",
            st.st_size
        )));
    }
    let len = st.st_size as usize;
    // SAFETY: maps `len` bytes of the open resource file; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return Err(check(format!("mmap of {path} ({len} bytes) failed: {e}")));
    }
    Ok(BarMap {
        ptr: p.cast(),
        len,
        fd,
    })
}

fn bdf_arg(o: &Opts, cmd: &str) -> Res<String> {
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

fn cmd_bar(o: &Opts) -> Res<()> {
    let bdf = bdf_arg(o, "bar")?;
    let modes = usize::from(o.write_seed.is_some())
        + usize::from(o.check_seed.is_some())
        + usize::from(o.check_zero);
    if modes != 1 {
        return Err(usage(
            "bar needs exactly one of --write SEED, --check SEED, --check-zero",
        ));
    }
    let m = map_bar(&bdf, 2)?;
    let words = m.words();
    let t = Instant::now();
    let mut write_ms = 0;
    if let Some(seed) = o.write_seed {
        let mut r = Rng::new(seed);
        for i in 0..words {
            m.write64(i, r.next());
        }
        write_ms = t.elapsed().as_millis();
    }
    let t = Instant::now();
    let (mode, seed) = match (o.write_seed, o.check_seed) {
        (Some(s), _) => ("write", Some(s)),
        (_, Some(s)) => ("check", Some(s)),
        _ => ("check-zero", None),
    };
    let mut r = seed.map(Rng::new);
    let mut bad = 0u64;
    let mut first: Option<(usize, u64, u64)> = None;
    for i in 0..words {
        let want = r.as_mut().map_or(0, Rng::next);
        let got = m.read64(i);
        if got != want {
            bad += 1;
            first.get_or_insert((i * 8, want, got));
        }
    }
    let check_ms = t.elapsed().as_millis();
    println!(
        "{{\"test\":\"bar\",\"device\":{},\"mode\":\"{mode}\",\"bytes\":{},\"bad_words\":{bad},\
         \"write_ms\":{write_ms},\"check_ms\":{check_ms}}}",
        json_str(&bdf),
        m.len
    );
    match first {
        None => Ok(()),
        Some((off, want, got)) => Err(check(format!(
            "BAR2 of {bdf} ({mode}{}): {bad} of {words} 64-bit words differ; first at offset \
             {off:#x}: expected {want:#018x}, got {got:#018x}",
            seed.map(|s| format!(" seed {s}")).unwrap_or_default()
        ))),
    }
}

fn cmd_bar_id(o: &Opts) -> Res<()> {
    let bdf = bdf_arg(o, "bar-id")?;
    let t = Instant::now();
    let deadline = std::time::Duration::from_millis(o.wait_ms);
    let (id, pdfid) = loop {
        let r = map_bar(&bdf, 0).map(|m| (m.read32(0), m.read32(4)));
        match r {
            Ok((id, pdfid)) if id != u32::MAX => break (id, pdfid),
            Ok((id, _)) if t.elapsed() >= deadline => {
                return Err(check(format!(
                    "BAR0 of {bdf}: expected an id, got {id:#010x} (memory decoding off or \
                     the device is gone)"
                )))
            }
            Err(e) if t.elapsed() >= deadline => return Err(e),
            _ => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    println!(
        "{{\"test\":\"bar-id\",\"device\":{},\"id\":\"{id:#010x}\",\"vendor\":\"{:#06x}\",\
         \"device_id\":\"{:#06x}\",\"pdfid\":\"{pdfid:#06x}\",\"waited_ms\":{}}}",
        json_str(&bdf),
        id & 0xffff,
        id >> 16,
        t.elapsed().as_millis()
    );
    Ok(())
}

static HOLD_TOUCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static HOLD_LAST_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static HOLD_START_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn monotonic_ns() -> u64 {
    // SAFETY: `ts` is a valid out pointer; clock_gettime is async-signal-safe.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Appends `v` in decimal; async-signal-safe (no allocation).
fn put_dec(buf: &mut [u8], at: &mut usize, mut v: u64) {
    let mut tmp = [0u8; 20];
    let mut n = 0;
    loop {
        tmp[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while n > 0 && *at < buf.len() {
        n -= 1;
        buf[*at] = tmp[n];
        *at += 1;
    }
}

fn put_str(buf: &mut [u8], at: &mut usize, s: &[u8]) {
    for &b in s {
        if *at < buf.len() {
            buf[*at] = b;
            *at += 1;
        }
    }
}

/// SIGBUS on the held BAR: report and leave (only async-signal-safe calls).
extern "C" fn on_sigbus(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    use std::sync::atomic::Ordering::Relaxed;
    let now = monotonic_ns();
    let mut buf = [0u8; 200];
    let mut at = 0;
    put_str(
        &mut buf,
        &mut at,
        b"{\"test\":\"hold-bar\",\"sigbus\":true,\"touches\":",
    );
    put_dec(&mut buf, &mut at, HOLD_TOUCHES.load(Relaxed));
    put_str(&mut buf, &mut at, b",\"held_ms\":");
    put_dec(
        &mut buf,
        &mut at,
        (now - HOLD_START_NS.load(Relaxed)) / 1_000_000,
    );
    put_str(&mut buf, &mut at, b",\"since_last_touch_ms\":");
    put_dec(
        &mut buf,
        &mut at,
        (now - HOLD_LAST_NS.load(Relaxed)) / 1_000_000,
    );
    put_str(&mut buf, &mut at, b"}\n");
    // SAFETY: write and _exit are async-signal-safe; `buf[..at]` is initialised.
    unsafe {
        libc::write(1, buf.as_ptr().cast(), at);
        libc::_exit(0);
    }
}

static HOLD_PHASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static HOLD_STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_hold_usr1(_: libc::c_int) {
    HOLD_PHASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

extern "C" fn on_hold_term(_: libc::c_int) {
    HOLD_STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

const HOLD_PHASES: usize = 4;

fn cmd_hold_bar(o: &Opts) -> Res<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let bdf = bdf_arg(o, "hold-bar")?;
    let secs = o
        .seconds
        .ok_or_else(|| usage("hold-bar needs --seconds S"))?;
    let m = map_bar(&bdf, 2)?;
    // SAFETY: installs handlers that only use async-signal-safe calls or atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_hold_usr1 as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
        sa.sa_sigaction = on_hold_term as *const () as libc::sighandler_t;
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
    // What the BAR held when mapped (written by `bar --write SEED` with --seed SEED).
    let words = m.words().max(1);
    let mut r = Rng::new(o.seed);
    let pattern: Vec<u64> = (0..words).map(|_| r.next()).collect();
    let start = monotonic_ns();
    HOLD_START_NS.store(start, Relaxed);
    HOLD_LAST_NS.store(start, Relaxed);
    println!("mapped {bdf} BAR2, {} bytes", m.len);
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    // Per phase (SIGUSR1 starts the next one): reads of the pattern, all ones, zero, other.
    let mut counts = [[0u64; 4]; HOLD_PHASES];
    let mut i = 0usize;
    while monotonic_ns() - start < secs * 1_000_000_000 && !HOLD_STOP.load(Relaxed) {
        let w = i % words;
        let v = m.read64(w);
        m.write64(w, v ^ 0x5a5a);
        m.write64(w, v);
        let class = if v == pattern[w] {
            0
        } else if v == u64::MAX {
            1
        } else if v == 0 {
            2
        } else {
            3
        };
        counts[HOLD_PHASE.load(Relaxed).min(HOLD_PHASES - 1)][class] += 1;
        HOLD_TOUCHES.fetch_add(1, Relaxed);
        HOLD_LAST_NS.store(monotonic_ns(), Relaxed);
        i = i.wrapping_add(4099);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let phases: Vec<String> = counts
        .iter()
        .map(|c| {
            format!(
                "{{\"pattern\":{},\"ones\":{},\"zero\":{},\"other\":{}}}",
                c[0], c[1], c[2], c[3]
            )
        })
        .collect();
    println!(
        "{{\"test\":\"hold-bar\",\"sigbus\":false,\"touches\":{},\"held_ms\":{},\
         \"phases\":[{}]}}",
        HOLD_TOUCHES.load(Relaxed),
        (monotonic_ns() - start) / 1_000_000,
        phases.join(",")
    );
    Ok(())
}

// ------------------------------------------------------------------ main

/// Usage of the commands that live in their own modules.
fn more_usage() -> String {
    [
        p2p::USAGE,
        fuzz::USAGE,
        cycles::USAGE,
        faults::USAGE,
        blk::USAGE,
    ]
    .concat()
}

fn main() -> ExitCode {
    if std::env::args()
        .nth(1)
        .is_some_and(|a| a == "--version" || a == "-V")
    {
        println!("{} {}", env!("CARGO_BIN_NAME"), env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    if cmd == "-h" || cmd == "--help" {
        print!("{USAGE}{}", more_usage());
        return ExitCode::SUCCESS;
    }
    let p2p_cmd: Option<RawCmd> = match cmd.as_str() {
        "p2p-user" => Some(p2p::cmd_p2p_user),
        "bar-range" => Some(p2p::cmd_bar_range),
        "p2p-bench" => Some(p2p::cmd_p2p_bench),
        "fuzz" => Some(fuzz::cmd_fuzz),
        "unload-cycles" => Some(cycles::cmd_unload_cycles),
        "probe-faults" => Some(faults::cmd_probe_faults),
        "blk-write" => Some(blk::cmd_blk_write),
        "blk-verify" => Some(blk::cmd_blk_verify),
        "blk-stream" => Some(blk::cmd_blk_stream),
        _ => None,
    };
    let r = if let Some(run) = p2p_cmd {
        run(&args[1..])
    } else {
        parse_opts(&args[1..]).and_then(|o| {
            let only_pos = matches!(cmd.as_str(), "mrpc");
            if !only_pos {
                if let Some(x) = o.positional.first() {
                    return Err(usage(format!("unexpected argument '{x}'")));
                }
            }
            match cmd.as_str() {
                "echo" => cmd_echo(&o),
                "switchtec-echo" => cmd_switchtec_echo(&o),
                "concurrent" => cmd_concurrent(&o),
                "abi" => cmd_abi(&o),
                "unpriv" => cmd_unpriv(&o),
                "hold" => cmd_hold(&o),
                "mrpc" => cmd_mrpc(&o),
                "bar" => cmd_bar(&o),
                "bar-id" => cmd_bar_id(&o),
                "hold-bar" => cmd_hold_bar(&o),
                other => Err(usage(format!("unknown command '{other}'"))),
            }
        })
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Usage(m)) => {
            eprintln!("pcifab-selftest: {m}\n\n{USAGE}{}", more_usage());
            ExitCode::from(2)
        }
        Err(Fail::Check(m)) => {
            eprintln!("pcifab-selftest {cmd}: FAILED: {m}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_names_round_trip() {
        assert_eq!(errno_from_name("enodev"), Some(libc::ENODEV));
        assert_eq!(errno_from_name("ok"), Some(0));
        assert_eq!(errno_name(libc::ETIMEDOUT), "ETIMEDOUT");
    }

    #[test]
    fn rng_is_deterministic_and_varied() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let x: Vec<u64> = (0..4).map(|_| a.next()).collect();
        let y: Vec<u64> = (0..4).map(|_| b.next()).collect();
        assert_eq!(x, y);
        assert_ne!(x[0], x[1]);
        assert_ne!(Rng::new(0).next(), 0);
    }

    #[test]
    fn percentiles() {
        let l = latency((1..=100).collect());
        assert_eq!((l.p50, l.p99, l.max), (51, 99, 100));
    }

    #[test]
    fn pattern_names_the_process() {
        for p in 0..8 {
            assert!((0..2000).all(|j| pattern(p, 5, j) >> 5 == p as u8));
        }
    }
}
