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
  p2p-local --len N [--seed S] [--shift K] [--timeout MS] [--device PATH]
        a copy between two user buffers of this host (the DMA endpoint's basic mode
        when the firmware has no engine of its own): a buffer (starting K bytes into
        its allocation) filled with the pattern of SEED is copied into a zeroed one,
        compared byte for byte
  p2p-hold --peer HFID --len N --seed S --dir DIR [--device PATH]
        registers a page-aligned buffer of N bytes (at most 4096: one range without an
        IOMMU) filled with the pattern of SEED for the peer host HFID through the DMA
        endpoint and prints {\"phase\":\"registered\",\"slot\",\"hfid\"}; then waits
        (up to 600 s) for DIR/check holding \"OFF LEN SEED2\", checks that the buffer is
        the pattern of SEED2 in [OFF, OFF+LEN) and of SEED elsewhere and prints
        {\"phase\":\"checked\",\"ok\",\"first_diff\"}; unregisters (\"unregistered\",
        with the errno) and waits for DIR/end before it exits (a kill closes the file:
        the registration ends then)
  p2p-regtime --peer HFID [--device PATH]
        times the DMA endpoint's registration calls: REGISTER of a page-aligned 4 KiB
        buffer for the peer host HFID, its UNREGISTER, a second REGISTER, then the close
        of the file that made it (which unregisters it); prints
        {\"register_ms\",\"register_errno\",\"unregister_ms\",\"unregister_errno\",
        \"register2_errno\",\"close_ms\"} (errno 0 when the call succeeded, -1 when
        UNREGISTER was not tried)
  p2p-peer --hfid H --slot S --off O --len N --seed S2 [--timeout MS] [--device PATH]
        one copy of the pattern of S2 from a user buffer into the buffer peer host H
        registered for this host in slot S, at offset O: prints {\"errno\",\"done\",
        \"dma_status\"} (errno 0 when it succeeded)
  bar-range --device BDF --seed S --src-off X --off Y --len N
        BAR2 bytes [Y, Y+N) must equal pattern bytes [X, X+N) of SEED
  p2p-bench --a PDFID --b PDFID --bar-a BDF --bar-b BDF [--sizes LIST] [--device PATH]
            [--latency N [--latency-size S]]
        per size (default 4K,64K,1M,16M,64M): the fabric copy a:0 -> b:0 with the DMA
        engine against a CPU bounce through host memory (read BAR2 of a, write BAR2 of
        b, wrapping in the BARs when the size exceeds them); best of 3 each. With
        --latency: then 5 rounds of N fabric copies a:0 -> b:0 of S bytes (default 4K),
        one ioctl each, alternating with N CPU bounces of the same bytes, each timed
        after 10 unmeasured ones of each: the median of the rounds' p50s of each side,
        p99/min/max of all copies, and every round's p50s, in microseconds
  p2p-signalled --from PDFID:OFF --to PDFID:OFF --len N --timeout MS --every MS
                [--device PATH]
        one fabric copy with timeout MS while SIGALRM (a handler that does nothing,
        SA_RESTART) arrives every MS: prints how long the call took, its errno (0 if it
        succeeded), the bytes done and the signals taken
  p2p-movable --file PATH --fn PDFID --off O --block N [--timeout MS] [--device PATH]
        reads PATH into a fresh buffer, prints how many of its pages are in memory block
        N (physical addresses from /proc/self/pagemap; needs CAP_SYS_ADMIN), then copies
        the buffer to the function at O and prints the outcome and the count again
";

/// Rounds of the `--latency` figure.
const LAT_ROUNDS: usize = 5;

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

/// Signals taken by [`cmd_p2p_signalled`]'s handler.
static ALARMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn on_alarm(_: libc::c_int) {
    ALARMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// `PDFID:OFF` of `--k`.
fn fn_end(a: &Args, k: &str) -> Res<(u16, u64)> {
    let v = a.need(k)?;
    let (p, o) = v
        .split_once(':')
        .ok_or_else(|| usage(format!("--{k} '{v}': expected PDFID:OFFSET")))?;
    let p = size(&format!("--{k}"), p)?;
    let p = u16::try_from(p).map_err(|_| usage(format!("--{k}: {p:#x} is not a PDFID")))?;
    Ok((p, size(&format!("--{k}"), o)?))
}

/// One fabric copy under a stream of signals whose handler asks for restarts: a call that
/// restarted with a new deadline each time would never time out while the engine is busy.
pub fn cmd_p2p_signalled(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let ((from, from_off), (to, to_off)) = (fn_end(&a, "from")?, fn_end(&a, "to")?);
    let len = a.size("len")?;
    let timeout = u32::try_from(a.size("timeout")?).map_err(|_| usage("--timeout too large"))?;
    let every = a.size("every")?;
    if every == 0 || every > 60_000 {
        return Err(usage("--every: 1 to 60000 ms"));
    }
    let d = a.dev()?;
    // SAFETY: installs a handler that only counts, with SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut()) != 0 {
            return Err(check(format!(
                "sigaction: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    let tv = libc::timeval {
        tv_sec: (every / 1000) as _,
        tv_usec: ((every % 1000) * 1000) as _,
    };
    let it = libc::itimerval {
        it_interval: tv,
        it_value: tv,
    };
    // SAFETY: `it` is a valid timer value; the old value is not wanted.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
    let t = Instant::now();
    let r = dev::p2p_copy(
        &d,
        CopySrc::Function {
            pdfid: from,
            off: from_off,
        },
        CopyDst::Function {
            pdfid: to,
            off: to_off,
        },
        len,
        timeout,
    );
    let ms = t.elapsed().as_millis();
    let off = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
    };
    // SAFETY: as above; a zero value stops the timer.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &off, std::ptr::null_mut()) };
    let (errno, done) = match &r {
        Ok(c) => (0, c.done),
        Err(e) => (e.err.raw_os_error().unwrap_or(-1), e.done),
    };
    println!(
        "{{\"test\":\"p2p-signalled\",\"ms\":{ms},\"errno\":{errno},\"done\":{done},\
         \"signals\":{}}}",
        ALARMS.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(())
}

/// The pages `buf` spans, those of them present, and those of them in memory block `block`.
fn pages_in_block(buf: &[u8], block: u64) -> Res<(u64, u64, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let bs = std::fs::read_to_string("/sys/devices/system/memory/block_size_bytes")
        .map_err(|e| check(format!("block_size_bytes: {e}")))?;
    let block_size = u64::from_str_radix(bs.trim(), 16)
        .map_err(|e| check(format!("block_size_bytes {:?}: {e}", bs.trim())))?;
    let mut pm = File::open("/proc/self/pagemap").map_err(|e| check(format!("pagemap: {e}")))?;
    let (start, end) = (buf.as_ptr() as u64, buf.as_ptr() as u64 + buf.len() as u64);
    let (first, last) = (start / PAGE, end.div_ceil(PAGE));
    let mut raw = vec![0u8; ((last - first) * 8) as usize];
    pm.seek(SeekFrom::Start(first * 8))
        .and_then(|_| pm.read_exact(&mut raw))
        .map_err(|e| check(format!("reading pagemap: {e}")))?;
    let (mut present, mut inside) = (0u64, 0u64);
    for e in raw.chunks_exact(8) {
        let e = u64::from_le_bytes(e.try_into().unwrap_or_default());
        if e >> 63 == 0 {
            continue;
        }
        let pfn = e & ((1 << 55) - 1);
        if pfn == 0 {
            return Err(check(
                "pagemap shows no page frame numbers (needs CAP_SYS_ADMIN)".to_string(),
            ));
        }
        present += 1;
        if pfn.saturating_mul(PAGE) / block_size == block {
            inside += 1;
        }
    }
    Ok((last - first, present, inside))
}

const PAGE: u64 = 4096;

/// A copy from a user buffer whose pages are counted in memory block `--block` before the
/// copy pins them, so a test can tell that the buffer was in that block to begin with.
pub fn cmd_p2p_movable(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let path = a.need("file")?;
    let (pdfid, off, block) = (a.pdfid("fn")?, a.size("off")?, a.size("block")?);
    let timeout = u32::try_from(a.size_or("timeout", 0)?).map_err(|_| usage("--timeout"))?;
    let d = a.dev()?;
    // Read into fresh memory: its pages come from the allocator as the read faults them in.
    let buf = std::fs::read(path).map_err(|e| check(format!("{path}: {e}")))?;
    let (span, pages, before) = pages_in_block(&buf, block)?;
    println!(
        "{{\"test\":\"p2p-movable\",\"phase\":\"before\",\"span\":{span},\"pages\":{pages},\
         \"in_block\":{before}}}"
    );
    let r = dev::p2p_copy(
        &d,
        CopySrc::User(&buf),
        CopyDst::Function { pdfid, off },
        buf.len() as u64,
        timeout,
    );
    let (_, _, after) = pages_in_block(&buf, block)?;
    let (errno, done) = match &r {
        Ok(c) => (0, c.done),
        Err(e) => (e.err.raw_os_error().unwrap_or(-1), e.done),
    };
    println!(
        "{{\"test\":\"p2p-movable\",\"phase\":\"after\",\"span\":{span},\"pages\":{pages},\
         \"in_block_before\":{before},\"in_block_after\":{after},\"errno\":{errno},\
         \"done\":{done}}}"
    );
    Ok(())
}

/// One copy between two user buffers (the DMA endpoint in basic mode where the firmware
/// has no engine of its own), compared byte for byte.
pub fn cmd_p2p_local(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let len = a.size("len")?;
    let seed = a.size_or("seed", 1)?;
    let shift = a.size_or("shift", 0)? as usize;
    let timeout = u32::try_from(a.size_or("timeout", 0)?).map_err(|_| usage("--timeout"))?;
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
        timeout,
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
        let len = usize::try_from(n)
            .ok()
            .filter(|&l| l <= aperture)
            .ok_or_else(|| {
                usage(format!(
                    "--latency-size {n}: at most the BARs' {aperture} bytes"
                ))
            })?;
        let mut bounce_one = || {
            // SAFETY: `len` bytes lie inside both mappings and `buf` (checked above);
            // plain copies between device memory and host memory.
            unsafe {
                std::ptr::copy_nonoverlapping(ma.ptr.cast::<u8>(), buf.as_mut_ptr(), len);
                std::ptr::copy_nonoverlapping(buf.as_ptr(), mb.ptr.cast::<u8>(), len);
            }
        };
        for _ in 0..10 {
            one()?;
            bounce_one();
        }
        let mut all = Vec::with_capacity(count as usize * LAT_ROUNDS);
        let (mut rounds, mut bounce_rounds) = (Vec::new(), Vec::new());
        for _ in 0..LAT_ROUNDS {
            let mut ns = Vec::with_capacity(count as usize);
            let mut bns = Vec::with_capacity(count as usize);
            // A and B alternate copy by copy, on the same clock.
            for _ in 0..count {
                let t = Instant::now();
                one()?;
                ns.push(t.elapsed().as_nanos() as u64);
                let t = Instant::now();
                bounce_one();
                bns.push(t.elapsed().as_nanos() as u64);
            }
            all.extend_from_slice(&ns);
            rounds.push(latency(ns).p50);
            bounce_rounds.push(latency(bns).p50);
        }
        let median = |v: &[u64]| {
            let mut s = v.to_vec();
            s.sort_unstable();
            s[s.len() / 2]
        };
        let min = all.iter().copied().min().unwrap_or(0);
        let l = latency(all);
        let us = |v: u64| v as f64 / 1000.0;
        let list = |v: &[u64]| {
            v.iter()
                .map(|&x| format!("{:.2}", us(x)))
                .collect::<Vec<_>>()
                .join(",")
        };
        println!(
            "{{\"test\":\"p2p-latency\",\"bytes\":{n},\"count\":{count},\"rounds\":{LAT_ROUNDS},\
             \"p50_us\":{:.2},\"p99_us\":{:.1},\"min_us\":{:.1},\"max_us\":{:.1},\
             \"bounce_p50_us\":{:.2},\"round_p50_us\":[{}],\"round_bounce_p50_us\":[{}]}}",
            us(median(&rounds)),
            us(l.p99),
            us(min),
            us(l.max),
            us(median(&bounce_rounds)),
            list(&rounds),
            list(&bounce_rounds)
        );
    }
    Ok(())
}

/// The page-aligned part of `v` of `len` bytes.
fn page_aligned(v: &mut [u8], len: usize) -> Res<&mut [u8]> {
    let shift = (PAGE as usize - (v.as_ptr() as usize % PAGE as usize)) % PAGE as usize;
    v.get_mut(shift..shift + len)
        .ok_or_else(|| check("no room for a page-aligned buffer"))
}

/// Waits for `path` to exist (polled every 20 ms, up to 600 s) and returns its contents.
fn wait_file(path: &std::path::Path) -> Res<String> {
    let t = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return Ok(s);
        }
        if t.elapsed().as_secs() > 600 {
            return Err(check(format!("{} did not appear in 600 s", path.display())));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A buffer registered for a peer host, checked once the peer wrote into it.
pub fn cmd_p2p_hold(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let peer = a.pdfid("peer")?;
    let len = a.size("len")?;
    let seed = a.size("seed")?;
    let dir = std::path::PathBuf::from(a.need("dir")?);
    let n = usize::try_from(len).map_err(|_| usage("--len too large"))?;
    if n == 0 || n as u64 > PAGE {
        return Err(usage("--len: 1 to 4096 bytes"));
    }
    let d = a.dev()?;
    let mut backing = vec![0u8; 2 * PAGE as usize];
    let buf = page_aligned(&mut backing, n)?;
    buf.copy_from_slice(&pattern(seed, 0, n));
    // SAFETY: `backing` lives until this function returns, after the registration ended
    // (UNREGISTER below) or the process exits (the file closes first), and is used for
    // nothing but the peer's writes and the check.
    let b = unsafe { dev::register(&d, peer, buf) }.map_err(|e| check(format!("{e}")))?;
    println!(
        "{{\"test\":\"p2p-hold\",\"phase\":\"registered\",\"slot\":{},\"hfid\":{}}}",
        b.slot, b.hfid
    );
    let spec = wait_file(&dir.join("check"))?;
    let nums: Vec<u64> = spec
        .split_whitespace()
        .map(|w| size("check", w))
        .collect::<Res<_>>()?;
    let [off, clen, seed2] = nums[..] else {
        return Err(usage("DIR/check: OFF LEN SEED2"));
    };
    let (off, clen) = (off as usize, clen as usize);
    let end = off
        .checked_add(clen)
        .filter(|&e| e <= n)
        .ok_or_else(|| usage("DIR/check: range outside the buffer"))?;
    let mut want = pattern(seed, 0, n);
    want[off..end].copy_from_slice(&pattern(seed2, 0, clen));
    // The peer's engine wrote the memory behind the compiler's back.
    let got: Vec<u8> = buf
        .iter()
        .map(|b| {
            // SAFETY: `b` refers to a byte of the live buffer.
            unsafe { std::ptr::read_volatile(b) }
        })
        .collect();
    let diff = first_diff(&want, &got);
    println!(
        "{{\"test\":\"p2p-hold\",\"phase\":\"checked\",\"ok\":{},\"first_diff\":{}}}",
        diff.is_none(),
        diff.map_or("null".to_string(), |i| i.to_string())
    );
    let errno = match dev::unregister(&d, peer, b.slot) {
        Ok(_) => 0,
        Err(e) => e.err.raw_os_error().unwrap_or(-1),
    };
    println!("{{\"test\":\"p2p-hold\",\"phase\":\"unregistered\",\"errno\":{errno}}}");
    wait_file(&dir.join("end"))?;
    drop(d);
    drop(backing);
    Ok(())
}

/// The errno of a failed registration call, 0 for success.
fn reg_errno<T>(r: &Result<T, dev::P2pError>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.err.raw_os_error().unwrap_or(-1),
    }
}

/// How long REGISTER, UNREGISTER and the close of a registering file take (in a scenario:
/// while a copy holds the endpoint's channels).
pub fn cmd_p2p_regtime(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let peer = a.pdfid("peer")?;
    let d = a.dev()?;
    let mut backing = vec![0u8; 2 * PAGE as usize];
    let buf = page_aligned(&mut backing, PAGE as usize)?;
    let t = Instant::now();
    // SAFETY: `backing` outlives the registration: it is unregistered below, and the second
    // one ends with the close of `d`, both before `backing` is dropped.
    let r = unsafe { dev::register(&d, peer, buf) };
    let register_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    // -1: not tried (the REGISTER failed).
    let u = r
        .as_ref()
        .map_or(-1, |b| reg_errno(&dev::unregister(&d, peer, b.slot)));
    let unregister_ms = t.elapsed().as_secs_f64() * 1e3;
    // SAFETY: As above: the close of `d` below ends this registration.
    let r2 = unsafe { dev::register(&d, peer, buf) };
    let t = Instant::now();
    drop(d);
    let close_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(backing);
    println!(
        "{{\"test\":\"p2p-regtime\",\"register_ms\":{register_ms:.1},\"register_errno\":{},\
         \"unregister_ms\":{unregister_ms:.1},\"unregister_errno\":{},\"register2_errno\":{},\
         \"close_ms\":{close_ms:.1}}}",
        reg_errno(&r),
        u,
        reg_errno(&r2)
    );
    Ok(())
}

/// One copy into a buffer a peer host registered for this one.
pub fn cmd_p2p_peer(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let hfid = a.pdfid("hfid")?;
    let slot = u8::try_from(a.size("slot")?).map_err(|_| usage("--slot"))?;
    let (off, len) = (a.size("off")?, a.size("len")?);
    let seed = a.size("seed")?;
    let timeout = u32::try_from(a.size_or("timeout", 0)?).map_err(|_| usage("--timeout"))?;
    let n = usize::try_from(len).map_err(|_| usage("--len too large"))?;
    let d = a.dev()?;
    let src = pattern(seed, 0, n);
    let r = dev::p2p_copy(
        &d,
        CopySrc::User(&src),
        CopyDst::Peer { hfid, slot, off },
        len,
        timeout,
    );
    let (errno, done, status) = match &r {
        Ok(c) => (0, c.done, c.dma_status),
        Err(e) => (e.err.raw_os_error().unwrap_or(-1), e.done, e.dma_status),
    };
    println!("{{\"test\":\"p2p-peer\",\"errno\":{errno},\"done\":{done},\"dma_status\":{status}}}");
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
