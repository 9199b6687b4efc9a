// SPDX-License-Identifier: GPL-2.0-only
//! The DMA endpoint's benchmark of `pcifab-selftest` (`make bench`, part `dmaep`): copies
//! through the switch's DMA endpoint (`PCIFAB_IOCTL_P2P_COPY` between two user buffers,
//! basic mode, and into a buffer a peer host registered, fabric mode) against a CPU copy of
//! the same bytes, all on this guest's monotonic clock; and the buffer a peer lends for it.

use std::fs::{File, OpenOptions};
use std::time::Instant;

use pcifab_uapi::dev::{self, CopyDst, CopySrc};

use super::args::Args;
use super::util::{check, latency, num, usage, Fail, Res, Rng};

pub const USAGE: &str = "\
  dmaep-bench [--sizes LIST] [--copies LIST] [--runs N] [--latency N]
              [--peer HFID --slot S --peer-len L] [--seed S] [--device PATH]
        per size (default 4K,64K,1M,16M,64M) N runs (default 5) of K copies each (--copies,
        one K per size, default 1) through the DMA endpoint from one user buffer into
        another (basic mode), each run alternating with a run of K CPU copies of the same
        bytes between the same buffers (copy_from_slice); with --peer, then N runs of K
        copies of the sizes up to L into the buffer peer HFID registered for this host in
        slot S, at offset 0 (fabric mode). Every run timed as a whole on the monotonic
        clock, one JSON line per size and mode with each run's MiB/s; the destination is
        compared with the source after an unmeasured first copy of each size. With
        --latency N: 5 rounds of N 4 KiB copies, one ioctl each, alternating copy by copy
        with a 4 KiB CPU copy (and a fabric copy with --peer), after 10 unmeasured of each:
        each round's p50 and the p99 of all, in microseconds
  dmaep-lend --peer HFID --len N --dir DIR [--device PATH]
        lends the peer host HFID a zeroed, page-aligned buffer of N bytes through the DMA
        endpoint (PCIFAB_IOCTL_P2P_REGISTER; more than 4 KiB needs an IOMMU, one range)
        and prints {\"phase\":\"registered\",\"slot\",\"hfid\",\"bytes\"}; then waits (up to
        1800 s) for DIR/check holding \"LEN SEED\", checks that the first LEN bytes are the
        pattern of SEED (what dmaep-bench --seed SEED copies), prints
        {\"phase\":\"checked\",\"ok\",\"first_diff\"}, unregisters (\"unregistered\", with
        the errno) and exits
";

/// Rounds of the `--latency` figure.
const LAT_ROUNDS: usize = 5;
/// Bytes of one latency copy.
const LAT_BYTES: usize = 4096;
/// Unmeasured copies of each kind before the latency rounds.
const LAT_WARMUP: usize = 10;
const PAGE: usize = 4096;

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

/// A comma-separated list of sizes.
fn sizes(flag: &str, s: &str) -> Res<Vec<u64>> {
    s.split(',').map(|x| size(flag, x)).collect()
}

/// The first `len` bytes of the pattern of `seed` (the byte stream `bar --write SEED` and
/// `p2p-*` use).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len + 8];
    Rng::new(seed).fill(&mut v);
    v.truncate(len);
    v
}

fn open_dev(a: &Args) -> Res<File> {
    let path = a.get("device").unwrap_or("/dev/pcifab0");
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| check(format!("cannot open {path}: {e}")))
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

/// `v` as a JSON array of numbers with `prec` decimals.
fn list(v: &[f64], prec: usize) -> String {
    let s: Vec<String> = v.iter().map(|x| format!("{x:.prec$}")).collect();
    format!("[{}]", s.join(","))
}

/// The run plan: each size with its copies per run.
#[derive(Debug, PartialEq)]
struct Plan {
    sizes: Vec<(u64, u32)>,
    runs: usize,
}

fn plan(a: &Args) -> Res<Plan> {
    let s = sizes("--sizes", a.get("sizes").unwrap_or("4K,64K,1M,16M,64M"))?;
    let copies: Vec<u64> = match a.get("copies") {
        None => vec![1; s.len()],
        Some(c) => c
            .split(',')
            .map(|x| num("--copies", x))
            .collect::<Res<_>>()?,
    };
    if copies.len() != s.len() {
        return Err(usage(format!(
            "--copies: {} values for {} sizes",
            copies.len(),
            s.len()
        )));
    }
    let runs = a.get("runs").map_or(Ok(5), |r| num("--runs", r))?;
    if !(1..=100).contains(&runs) {
        return Err(usage("--runs: 1 to 100"));
    }
    let mut out = Vec::new();
    for (&n, &k) in s.iter().zip(&copies) {
        if n == 0 || n > 1 << 30 {
            return Err(usage(format!("--sizes: {n} is not 1 byte to 1 GiB")));
        }
        if !(1..=10_000).contains(&k) {
            return Err(usage(format!("--copies: {k} is not 1 to 10000")));
        }
        out.push((n, k as u32));
    }
    Ok(Plan {
        sizes: out,
        runs: runs as usize,
    })
}

/// The peer's buffer: (HFID, slot, bytes).
fn peer(a: &Args) -> Res<Option<(u16, u8, u64)>> {
    let Some(h) = a.get("peer") else {
        return Ok(None);
    };
    let hfid = u16::try_from(size("--peer", h)?).map_err(|_| usage("--peer: not an HFID"))?;
    let slot = u8::try_from(size("--slot", a.need("slot")?)?)
        .ok()
        .filter(|s| *s < 6)
        .ok_or_else(|| usage("--slot: 0 to 5"))?;
    let len = size("--peer-len", a.need("peer-len")?)?;
    if len == 0 {
        return Err(usage("--peer-len must be at least 1"));
    }
    Ok(Some((hfid, slot, len)))
}

pub fn cmd_dmaep_bench(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let p = plan(&a)?;
    let peer = peer(&a)?;
    let seed = a.get("seed").map_or(Ok(0x5eed), |s| size("--seed", s))?;
    let lat = match a.get("latency") {
        None => None,
        Some(c) => match num("--latency", c)? {
            0 => return Err(usage("--latency must be at least 1")),
            c => Some(c as usize),
        },
    };
    let d = open_dev(&a)?;
    let max = p.sizes.iter().map(|s| s.0).max().unwrap_or(0) as usize;
    let max = max.max(if lat.is_some() { LAT_BYTES } else { 0 });
    let src = pattern(seed, max);
    let mut dst = vec![0u8; max];

    // Basic mode against the CPU copy, run by run.
    for &(n, k) in &p.sizes {
        let len = n as usize;
        let dma = |dst: &mut [u8]| {
            dev::p2p_copy(
                &d,
                CopySrc::User(&src[..len]),
                CopyDst::User(&mut dst[..len]),
                n,
                0,
            )
            .map_err(|e| copy_err(&format!("user -> user, {n} bytes"), e))
        };
        dst[..len].fill(0);
        // Unmeasured: the destination's pages fault in, and the engine's copy is checked.
        dma(&mut dst[..])?;
        if let Some(i) = src[..len].iter().zip(&dst[..len]).position(|(x, y)| x != y) {
            return Err(check(format!(
                "user -> user, {n} bytes: first difference at byte {i}: sent {:#04x}, got {:#04x}",
                src[i], dst[i]
            )));
        }
        let (mut runs, mut cpu_runs) = (Vec::new(), Vec::new());
        for _ in 0..p.runs {
            let t = Instant::now();
            for _ in 0..k {
                dma(&mut dst[..])?;
            }
            runs.push(mib_s(n * u64::from(k), t.elapsed().as_secs_f64()));
            let t = Instant::now();
            for _ in 0..k {
                dst[..len].copy_from_slice(std::hint::black_box(&src[..len]));
                std::hint::black_box(&mut dst[..len]);
            }
            cpu_runs.push(mib_s(n * u64::from(k), t.elapsed().as_secs_f64()));
        }
        println!(
            "{{\"test\":\"dmaep-bench\",\"mode\":\"basic\",\"bytes\":{n},\"copies\":{k},\
             \"runs_mib_s\":{},\"cpu_runs_mib_s\":{}}}",
            list(&runs, 1),
            list(&cpu_runs, 1)
        );
    }

    // Fabric mode: into the peer's buffer, from the same source.
    if let Some((hfid, slot, plen)) = peer {
        for &(n, k) in p.sizes.iter().filter(|s| s.0 <= plen) {
            let len = n as usize;
            let fab = || {
                dev::p2p_copy(
                    &d,
                    CopySrc::User(&src[..len]),
                    CopyDst::Peer { hfid, slot, off: 0 },
                    n,
                    0,
                )
                .map_err(|e| copy_err(&format!("user -> peer {hfid:#x} slot {slot}, {n} bytes"), e))
            };
            fab()?;
            let mut runs = Vec::new();
            for _ in 0..p.runs {
                let t = Instant::now();
                for _ in 0..k {
                    fab()?;
                }
                runs.push(mib_s(n * u64::from(k), t.elapsed().as_secs_f64()));
            }
            println!(
                "{{\"test\":\"dmaep-bench\",\"mode\":\"fabric\",\"bytes\":{n},\"copies\":{k},\
                 \"runs_mib_s\":{}}}",
                list(&runs, 1)
            );
        }
    }

    let Some(count) = lat else {
        return Ok(());
    };
    let mut basic = || {
        dev::p2p_copy(
            &d,
            CopySrc::User(&src[..LAT_BYTES]),
            CopyDst::User(&mut dst[..LAT_BYTES]),
            LAT_BYTES as u64,
            0,
        )
        .map(|_| ())
        .map_err(|e| copy_err("user -> user, 4096 bytes", e))
    };
    let mut cpu_dst = vec![0u8; LAT_BYTES];
    let mut cpu = || {
        cpu_dst.copy_from_slice(std::hint::black_box(&src[..LAT_BYTES]));
        std::hint::black_box(&mut cpu_dst);
    };
    let fabric = |(hfid, slot, _): (u16, u8, u64)| {
        dev::p2p_copy(
            &d,
            CopySrc::User(&src[..LAT_BYTES]),
            CopyDst::Peer { hfid, slot, off: 0 },
            LAT_BYTES as u64,
            0,
        )
        .map(|_| ())
        .map_err(|e| copy_err("user -> peer, 4096 bytes", e))
    };
    let fab_peer = peer.filter(|p| p.2 >= LAT_BYTES as u64);
    for _ in 0..LAT_WARMUP {
        basic()?;
        cpu();
        if let Some(pp) = fab_peer {
            fabric(pp)?;
        }
    }
    // Per kind: every round's samples (ns).
    let mut rounds: [Vec<Vec<u64>>; 3] = Default::default();
    for _ in 0..LAT_ROUNDS {
        let mut r: [Vec<u64>; 3] = Default::default();
        for _ in 0..count {
            let t = Instant::now();
            basic()?;
            r[0].push(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            cpu();
            r[1].push(t.elapsed().as_nanos() as u64);
            if let Some(pp) = fab_peer {
                let t = Instant::now();
                fabric(pp)?;
                r[2].push(t.elapsed().as_nanos() as u64);
            }
        }
        for (all, one) in rounds.iter_mut().zip(r) {
            all.push(one);
        }
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    let summary = |name: &str, rs: &[Vec<u64>]| -> String {
        let p50s: Vec<f64> = rs.iter().map(|r| us(latency(r.clone()).p50)).collect();
        let l = latency(rs.concat());
        format!(
            "\"{name}_round_p50_us\":{},\"{name}_p99_us\":{:.2}",
            list(&p50s, 2),
            us(l.p99)
        )
    };
    let mut parts = vec![summary("copy", &rounds[0]), summary("cpu", &rounds[1])];
    if fab_peer.is_some() {
        parts.push(summary("fabric", &rounds[2]));
    }
    println!(
        "{{\"test\":\"dmaep-latency\",\"bytes\":{LAT_BYTES},\"count\":{count},\
         \"rounds\":{LAT_ROUNDS},{}}}",
        parts.join(",")
    );
    Ok(())
}

/// Waits for `path` to exist (polled every 20 ms, up to 1800 s) and returns its contents.
fn wait_file(path: &std::path::Path) -> Res<String> {
    let t = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return Ok(s);
        }
        if t.elapsed().as_secs() > 1800 {
            return Err(check(format!(
                "{} did not appear in 1800 s",
                path.display()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A buffer lent to a peer host for its copies, checked once the peer is done.
pub fn cmd_dmaep_lend(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let peer = u16::try_from(size("--peer", a.need("peer")?)?)
        .map_err(|_| usage("--peer: not an HFID"))?;
    let len = size("--len", a.need("len")?)?;
    if len == 0 || len > 1 << 30 {
        return Err(usage("--len: 1 byte to 1 GiB"));
    }
    let n = len as usize;
    let dir = std::path::PathBuf::from(a.need("dir")?);
    let d = open_dev(&a)?;
    let mut backing = vec![0u8; n + PAGE];
    let shift = (PAGE - backing.as_ptr() as usize % PAGE) % PAGE;
    let buf = &mut backing[shift..shift + n];
    // SAFETY: `backing` lives until this function returns, after the registration ended
    // (UNREGISTER below) or the process exits (the file closes first), and is used for
    // nothing but the peer's writes and the check.
    let b = unsafe { dev::register(&d, peer, buf) }.map_err(|e| check(format!("{e}")))?;
    println!(
        "{{\"test\":\"dmaep-lend\",\"phase\":\"registered\",\"slot\":{},\"hfid\":{},\
         \"bytes\":{n}}}",
        b.slot, b.hfid
    );
    let spec = wait_file(&dir.join("check"))?;
    let nums: Vec<u64> = spec
        .split_whitespace()
        .map(|w| size("check", w))
        .collect::<Res<_>>()?;
    let [clen, seed] = nums[..] else {
        return Err(usage("DIR/check: LEN SEED"));
    };
    let clen = usize::try_from(clen)
        .ok()
        .filter(|&c| c <= n)
        .ok_or_else(|| usage("DIR/check: LEN larger than the buffer"))?;
    let want = pattern(seed, clen);
    // The peer's engine wrote the memory behind the compiler's back.
    let diff = buf[..clen].iter().zip(&want).position(|(b, w)| {
        // SAFETY: `b` refers to a byte of the live buffer.
        unsafe { std::ptr::read_volatile(b) != *w }
    });
    println!(
        "{{\"test\":\"dmaep-lend\",\"phase\":\"checked\",\"ok\":{},\"first_diff\":{}}}",
        diff.is_none(),
        diff.map_or("null".to_string(), |i| i.to_string())
    );
    let errno = match dev::unregister(&d, peer, b.slot) {
        Ok(_) => 0,
        Err(e) => e.err.raw_os_error().unwrap_or(-1),
    };
    println!("{{\"test\":\"dmaep-lend\",\"phase\":\"unregistered\",\"errno\":{errno}}}");
    drop(d);
    drop(backing);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of a call that must succeed (`Fail` has no `Debug`).
    fn ok<T>(r: Res<T>) -> T {
        match r {
            Ok(v) => v,
            Err(Fail::Usage(m) | Fail::Check(m)) => panic!("{m}"),
        }
    }

    fn args(v: &[&str]) -> Args {
        ok(Args::parse(
            &v.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        ))
    }

    #[test]
    fn plans() {
        let p = ok(plan(&args(&[])));
        assert_eq!(p.runs, 5);
        assert_eq!(
            p.sizes,
            [
                (4096, 1),
                (65536, 1),
                (1 << 20, 1),
                (16 << 20, 1),
                (64 << 20, 1)
            ]
        );
        let p = ok(plan(&args(&[
            "--sizes", "4K,1M", "--copies", "64,4", "--runs", "7",
        ])));
        assert_eq!((p.sizes, p.runs), (vec![(4096, 64), (1 << 20, 4)], 7));
        // A count per size, sizes and counts in range.
        assert!(plan(&args(&["--sizes", "4K,1M", "--copies", "64"])).is_err());
        assert!(plan(&args(&["--sizes", "0"])).is_err());
        assert!(plan(&args(&["--sizes", "2G"])).is_err());
        assert!(plan(&args(&["--copies", "0,1,1,1,1"])).is_err());
        assert!(plan(&args(&["--runs", "0"])).is_err());
    }

    #[test]
    fn peers() {
        assert_eq!(ok(peer(&args(&[]))), None);
        assert_eq!(
            ok(peer(&args(&[
                "--peer",
                "0x2",
                "--slot",
                "0",
                "--peer-len",
                "64M"
            ]))),
            Some((2, 0, 64 << 20))
        );
        assert!(peer(&args(&["--peer", "0x2", "--slot", "6", "--peer-len", "4K"])).is_err());
        assert!(peer(&args(&["--peer", "0x2", "--peer-len", "4K"])).is_err());
        assert!(peer(&args(&[
            "--peer",
            "0x10000",
            "--slot",
            "0",
            "--peer-len",
            "4K"
        ]))
        .is_err());
    }

    #[test]
    fn pattern_is_the_rng_stream() {
        let mut whole = vec![0u8; 16];
        Rng::new(3).fill(&mut whole);
        assert_eq!(pattern(3, 13), whole[..13].to_vec());
    }
}
