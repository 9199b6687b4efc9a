// SPDX-License-Identifier: GPL-2.0-only
//! The bottom of `pcifab-selftest`: how a check fails ([`Fail`], [`Res`]), errno names,
//! JSON strings, numbers on the command line, the payload generator [`Rng`], latency
//! percentiles and the monotonic clock.

use std::fmt::Write as _;

// ------------------------------------------------------------------ errors

/// What went wrong, and how the process should exit.
pub enum Fail {
    Usage(String),
    Check(String),
}

pub type Res<T> = Result<T, Fail>;

pub fn check(msg: impl Into<String>) -> Fail {
    Fail::Check(msg.into())
}

pub fn usage(msg: impl Into<String>) -> Fail {
    Fail::Usage(msg.into())
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Symbolic name of an errno value (0 = "ok").
pub fn errno_name(e: i32) -> String {
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

pub fn errno_from_name(s: &str) -> Option<i32> {
    (0..200).find(|&e| errno_name(e).eq_ignore_ascii_case(s))
}

pub fn json_str(s: &str) -> String {
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

// ---------------------------------------------------------------- numbers

pub fn num(flag: &str, s: &str) -> Res<u64> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    v.map_err(|_| usage(format!("{flag} '{s}' is not a number (decimal or 0x...)")))
}

// -------------------------------------------------------------- helpers

/// xorshift64*: small, fast, good enough for payloads.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Never zero; spread small seeds.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Latency summary in microseconds.
pub struct Lat {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

pub fn latency(mut us: Vec<u64>) -> Lat {
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

pub fn first_diff(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "first difference at byte {i}: expected {:#04x}, got {:#04x}",
            a[i], b[i]
        ),
        None => format!("lengths differ: expected {}, got {}", a.len(), b.len()),
    }
}

/// CLOCK_MONOTONIC in nanoseconds; async-signal-safe.
pub fn monotonic_ns() -> u64 {
    // SAFETY: `ts` is a valid out pointer; clock_gettime is async-signal-safe.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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
}
