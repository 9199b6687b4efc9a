// SPDX-License-Identifier: GPL-2.0-only
//! P2P checks and the P2P benchmark of `pcifab-selftest` (`PCIFAB_IOCTL_P2P_*`).
//!
//! Patterns are the byte stream of [`Rng`] for a seed: byte `i` is byte `i % 8` (little
//! endian) of the stream's `i / 8`-th value, which is what `bar --write SEED` leaves in a BAR.

use std::fs::{File, OpenOptions};
use std::time::Instant;

use pcifab_uapi::dev::{self, CopyDst, CopySrc};

use super::args::Args;
use super::mmio::map_bar;
use super::util::{check, json_str, latency, num, usage, Fail, Res, Rng};

pub const USAGE: &str = "\
  p2p-user --fn PDFID --off O --len N [--seed S] [--shift K] [--device PATH]
        host<->function round trip through the DMA engine: a user buffer (starting K
        bytes into its allocation) filled with the pattern of SEED is copied to the
        function at O, then back into a zeroed buffer, compared byte for byte
  p2p-local --len N [--seed S] [--shift K] [--device PATH]
        a copy between two user buffers of this host (the DMA endpoint's basic mode
        when the firmware has no engine of its own): a buffer (starting K bytes into
        its allocation) filled with the pattern of SEED is copied into a zeroed one,
        compared byte for byte
  bar-range --device BDF --seed S --src-off X --off Y --len N
        BAR2 bytes [Y, Y+N) must equal pattern bytes [X, X+N) of SEED
  p2p-bench --a PDFID --b PDFID --bar-a BDF --bar-b BDF [--sizes LIST] [--device PATH]
            [--latency N [--latency-size S]]
        per size (default 4K,64K,1M,16M,64M): the fabric copy a:0 -> b:0 with the DMA
        engine against a CPU bounce through host memory (read BAR2 of a, write BAR2 of
        b, wrapping in the BARs when the size exceeds them); best of 3 each. With
        --latency: then N fabric copies a:0 -> b:0 of S bytes (default 4K), one ioctl
        each after 10 unmeasured ones, each timed: p50/p99/min/max in microseconds
";

/// The options only these commands have.
impl Args {
    fn size(&self, k: &str) -> Res<u64> {
        size(&format!("--{k}"), self.need(k)?)
    }

    fn size_or(&self, k: &str, d: u64) -> Res<u64> {
        self.get(k).map_or(Ok(d), |v| size(&format!("--{k}"), v))
    }

    fn pdfid(&self, k: &str) -> Res<u16> {
        let v = self.size(k)?;
        u16::try_from(v).map_err(|_| usage(format!("--{k}: {v:#x} is not a PDFID")))
    }

    fn dev(&self) -> Res<File> {
        let path = self.get("device").unwrap_or("/dev/pcifab0");
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| check(format!("cannot open {path}: {e}")))
    }
}

/// A number with an optional binary K/M/G suffix.
fn size(flag: &str, s: &str) -> Res<u64> {
    let (n, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num(flag, n)?
        .checked_mul(mul)
        .ok_or_else(|| usage(format!("{flag} '{s}' is too large")))
}

/// `len` bytes of the pattern of `seed`, from stream byte `from`.
fn pattern(seed: u64, from: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    for _ in 0..from / 8 {
        r.next();
    }
    let skip = (from % 8) as usize;
    let mut v = vec![0u8; len + skip + 8];
    r.fill(&mut v);
    v.drain(..skip);
    v.truncate(len);
    v
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

fn copy_err(what: &str, e: dev::P2pError) -> Fail {
    check(format!(
        "{what}: {e}; {} bytes done, engine status {}",
        e.done,
        dev::dma_status_name(e.dma_status)
    ))
}

pub fn cmd_p2p_user(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let (pdfid, off, len) = (a.pdfid("fn")?, a.size("off")?, a.size("len")?);
    let seed = a.size_or("seed", 1)?;
    let shift = a.size_or("shift", 0)? as usize;
    let d = a.dev()?;
    let n = usize::try_from(len).map_err(|_| usage("--len too large"))?;
    let mut src = vec![0u8; n + shift];
    src[shift..].copy_from_slice(&pattern(seed, 0, n));
    let t = Instant::now();
    dev::p2p_copy(
        &d,
        CopySrc::User(&src[shift..]),
        CopyDst::Function { pdfid, off },
        len,
        0,
    )
    .map_err(|e| copy_err(&format!("user -> {pdfid:#06x}:{off:#x}"), e))?;
    let to = t.elapsed().as_secs_f64();
    let mut back = vec![0u8; n + shift];
    let t = Instant::now();
    dev::p2p_copy(
        &d,
        CopySrc::Function { pdfid, off },
        CopyDst::User(&mut back[shift..]),
        len,
        0,
    )
    .map_err(|e| copy_err(&format!("{pdfid:#06x}:{off:#x} -> user"), e))?;
    let from = t.elapsed().as_secs_f64();
    println!(
        "{{\"test\":\"p2p-user\",\"fn\":\"{pdfid:#06x}\",\"off\":{off},\"len\":{len},\
         \"shift\":{shift},\"to_mib_s\":{:.1},\"from_mib_s\":{:.1}}}",
        mib_s(len, to),
        mib_s(len, from)
    );
    if back[..shift].iter().any(|&b| b != 0) {
        return Err(check(format!(
            "bytes before the buffer (shift {shift}) were written"
        )));
    }
    match first_diff(&src[shift..], &back[shift..]) {
        None => Ok(()),
        Some(i) => Err(check(format!(
            "round trip of {len} bytes through {pdfid:#06x}:{off:#x}: first difference at byte \
             {i}: sent {:#04x}, got {:#04x}",
            src[shift + i],
            back[shift + i]
        ))),
    }
}

pub fn cmd_p2p_local(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let len = a.size("len")?;
    let seed = a.size_or("seed", 1)?;
    let shift = a.size_or("shift", 0)? as usize;
    let d = a.dev()?;
    let n = usize::try_from(len).map_err(|_| usage("--len too large"))?;
    let mut src = vec![0u8; n + shift];
    src[shift..].copy_from_slice(&pattern(seed, 0, n));
    let mut dst = vec![0u8; n + shift];
    let t = Instant::now();
    dev::p2p_copy(
        &d,
        CopySrc::User(&src[shift..]),
        CopyDst::User(&mut dst[shift..]),
        len,
        0,
    )
    .map_err(|e| copy_err("user -> user", e))?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{{\"test\":\"p2p-local\",\"len\":{len},\"shift\":{shift},\"mib_s\":{:.1}}}",
        mib_s(len, secs)
    );
    if dst[..shift].iter().any(|&b| b != 0) {
        return Err(check(format!(
            "bytes before the buffer (shift {shift}) were written"
        )));
    }
    match first_diff(&src[shift..], &dst[shift..]) {
        None => Ok(()),
        Some(i) => Err(check(format!(
            "copy of {len} bytes: first difference at byte {i}: sent {:#04x}, got {:#04x}",
            src[shift + i],
            dst[shift + i]
        ))),
    }
}

pub fn cmd_bar_range(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let bdf = a.need("device")?.to_string();
    let (seed, src_off, off, len) = (
        a.size("seed")?,
        a.size("src-off")?,
        a.size("off")?,
        a.size("len")?,
    );
    let m = map_bar(&bdf, 2)?;
    let end = off
        .checked_add(len)
        .filter(|&e| e <= m.len as u64)
        .ok_or_else(|| {
            usage(format!(
                "[{off:#x}, +{len:#x}) is outside BAR2 ({:#x} bytes)",
                m.len
            ))
        })?;
    let want = pattern(seed, src_off, len as usize);
    let mut got = vec![0u8; len as usize];
    // SAFETY: `off..end` lies inside the mapping (checked above); reads of device memory.
    unsafe {
        for (i, b) in got.iter_mut().enumerate() {
            *b = std::ptr::read_volatile(m.ptr.cast::<u8>().add(off as usize + i));
        }
    }
    println!(
        "{{\"test\":\"bar-range\",\"device\":{},\"off\":{off},\"len\":{len},\"end\":{end}}}",
        json_str(&bdf)
    );
    match first_diff(&want, &got) {
        None => Ok(()),
        Some(i) => Err(check(format!(
            "BAR2 of {bdf} at {:#x}: expected {:#04x} (pattern {seed} byte {:#x}), got {:#04x}",
            off + i as u64,
            want[i],
            src_off + i as u64,
            got[i]
        ))),
    }
}

pub fn cmd_p2p_bench(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let (pa, pb) = (a.pdfid("a")?, a.pdfid("b")?);
    let (bar_a, bar_b) = (a.need("bar-a")?.to_string(), a.need("bar-b")?.to_string());
    let sizes = a
        .get("sizes")
        .unwrap_or("4K,64K,1M,16M,64M")
        .split(',')
        .map(|s| size("--sizes", s))
        .collect::<Res<Vec<u64>>>()?;
    // --latency N [--latency-size S]: N single copies of S bytes after the sweep.
    let lat = match a.get("latency") {
        None => None,
        Some(c) => match num("--latency", c)? {
            0 => return Err(usage("--latency must be at least 1")),
            c => match a.size_or("latency-size", 4096)? {
                0 => return Err(usage("--latency-size must be at least 1")),
                n => Some((c, n)),
            },
        },
    };
    let d = a.dev()?;
    let ma = map_bar(&bar_a, 2)?;
    let mb = map_bar(&bar_b, 2)?;
    let aperture = ma.len.min(mb.len);
    let mut buf = vec![0u8; aperture];
    for &n in &sizes {
        let mut fabric = f64::MAX;
        let mut bounce = f64::MAX;
        // Each side copies three times in a row, so neither runs on caches the other left.
        // The fabric side copies once more first, unmeasured: the first copy into the
        // destination is the first touch of that device memory (the emulator's pages fault
        // in), which the floor it is compared with (the emulator's memcpy of the same
        // bytes, after this) never pays.
        for i in 0..4 {
            let t = Instant::now();
            dev::p2p_copy(
                &d,
                CopySrc::Function { pdfid: pa, off: 0 },
                CopyDst::Function { pdfid: pb, off: 0 },
                n,
                0,
            )
            .map_err(|e| copy_err(&format!("{pa:#06x} -> {pb:#06x}, {n} bytes"), e))?;
            if i > 0 {
                fabric = fabric.min(t.elapsed().as_secs_f64());
            }
        }
        for _ in 0..3 {
            let t = Instant::now();
            let mut left = n as usize;
            while left > 0 {
                let c = left.min(aperture);
                // SAFETY: `c` bytes lie inside both mappings and `buf`; plain copies
                // between device memory and host memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(ma.ptr.cast::<u8>(), buf.as_mut_ptr(), c);
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), mb.ptr.cast::<u8>(), c);
                }
                left -= c;
            }
            bounce = bounce.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{{\"test\":\"p2p-bench\",\"bytes\":{n},\"fabric_mib_s\":{:.1},\
             \"bounce_mib_s\":{:.1},\"ratio\":{:.3}}}",
            mib_s(n, fabric),
            mib_s(n, bounce),
            bounce / fabric
        );
    }
    if let Some((count, n)) = lat {
        let one = || {
            dev::p2p_copy(
                &d,
                CopySrc::Function { pdfid: pa, off: 0 },
                CopyDst::Function { pdfid: pb, off: 0 },
                n,
                0,
            )
            .map_err(|e| copy_err(&format!("{pa:#06x} -> {pb:#06x}, {n} bytes"), e))
        };
        for _ in 0..10 {
            one()?;
        }
        let mut ns = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let t = Instant::now();
            one()?;
            ns.push(t.elapsed().as_nanos() as u64);
        }
        let min = ns.iter().copied().min().unwrap_or(0);
        let l = latency(ns);
        let us = |v: u64| v as f64 / 1000.0;
        println!(
            "{{\"test\":\"p2p-latency\",\"bytes\":{n},\"count\":{count},\"p50_us\":{:.1},\
             \"p99_us\":{:.1},\"min_us\":{:.1},\"max_us\":{:.1}}}",
            us(l.p50),
            us(l.p99),
            us(min),
            us(l.max)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_the_bar_stream() {
        let mut r = Rng::new(7);
        let mut whole = vec![0u8; 64];
        r.fill(&mut whole);
        assert_eq!(pattern(7, 0, 64), whole);
        assert_eq!(pattern(7, 13, 20), whole[13..33].to_vec());
    }

    #[test]
    fn sizes() {
        assert_eq!(size("x", "4K").ok(), Some(4096));
        assert_eq!(size("x", "16M").ok(), Some(16 << 20));
        assert_eq!(size("x", "0x10").ok(), Some(16));
    }
}
