// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest bar`, `bar-id` and `hold-bar`: a fabric function's BARs mapped through
//! sysfs, filled with and checked against a seed's pattern, its id read, and a mapping held
//! (and touched) while the function is unbound, with SIGBUS reported from its handler.

use std::time::Instant;

use super::args::{bdf_arg, Opts};
use super::mmio::map_bar;
use super::util::{check, json_str, monotonic_ns, usage, Res, Rng};

pub fn cmd_bar(o: &Opts) -> Res<()> {
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

pub fn cmd_bar_id(o: &Opts) -> Res<()> {
    let bdf = bdf_arg(o, "bar-id")?;
    let t = Instant::now();
    let deadline = std::time::Duration::from_millis(o.wait_ms);
    // A function whose memory decoding is not on yet reads all ones on real hardware and
    // zeroes in QEMU (a hot-added function a moment after it appeared): neither is an id
    // (vendor 0x0000 and 0xffff are not vendors).
    let (id, pdfid) = loop {
        let r = map_bar(&bdf, 0).map(|m| (m.read32(0), m.read32(4)));
        match r {
            Ok((id, pdfid)) if !matches!(id & 0xffff, 0 | 0xffff) => break (id, pdfid),
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

pub fn cmd_hold_bar(o: &Opts) -> Res<()> {
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
