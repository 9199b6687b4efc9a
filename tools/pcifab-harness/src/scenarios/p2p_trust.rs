// SPDX-License-Identifier: GPL-2.0-only
//! What a P2P copy (`PCIFAB_IOCTL_P2P_COPY`, the MEP's DMA engine) does with the memory and
//! the locks it holds when things go wrong: the MEP leaving the bus mid-copy, a user buffer in
//! movable memory, a copier killed while it waits for the engine. Host h0 boots with a
//! virtual IOMMU (`fabric::iommu_host`); all three run there.
//!
//! Pinned pages are counted by the guest kernel itself: `nr_foll_pin_acquired` and
//! `nr_foll_pin_released` of `/proc/vmstat` (every `pin_user_pages*()` page and every unpin),
//! so "acquired - released" is the number of pages pinned right now, in the whole guest,
//! once `vm.stat_refresh` folded the CPUs' pending counts in (without it the two may lag by
//! a CPU's batch).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::{
    bind_here, check_bound_pcifab, check_invariants, compose_begin, dmesg_clean, expect_eq,
    json_line, pcifab_cmd, pcifab_ok, pinned_pages, refused_without_extensions, selftest_json,
    Checks, GPU0, MIB, PCIFAB_KO,
};
use crate::fabric::{EmuControl, Fabric, Host};

const LONG: Duration = Duration::from_secs(240);
/// ENODEV as the CLI reports it (`error.errno`).
const ENODEV: i64 = 19;
/// The x86-64 system call number of ioctl, as `/proc/PID/syscall` shows it.
const SYS_IOCTL: &str = "16";

/// Adds a route to `pdfid` at window offset 0 of `h`'s window.
fn route0(h: &mut Host, pdfid: u16, size: u64) -> Result<(), String> {
    let v = pcifab_ok(
        h,
        &format!("p2p route add {pdfid:#06x} --size {size:#x} --target-off 0 --window-off 0"),
    )?;
    expect_eq(
        &format!("{}: window offset of the route to {pdfid:#06x}", h.name),
        Some(0),
        v["window_off"].as_u64(),
    )
}

/// How every scenario here starts: under PAX firmware only the refusal is checked (`None`);
/// else every function free, GPU0 bound to h0 and a route of `route_len` bytes to it.
fn begin_gpu0(f: &mut Fabric, route_len: u64) -> Result<Option<EmuControl>, String> {
    if refused_without_extensions(f, &["p2p copy --from 0x0300:0 --to 0x0401:0 --len 0x1000"])? {
        return Ok(None);
    }
    compose_begin(f)?;
    let e = f.expected.clone();
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let _ = bind_here(h0, &e, GPU0)?;
    route0(h0, GPU0, route_len)?;
    Ok(Some(f.emu()))
}

/// Waits (at most 20 s) until `host`'s MEP has a DMA descriptor in flight.
fn wait_dma_in_flight(emu: &EmuControl, host: &str, what: &str) -> Result<(), String> {
    let t = Instant::now();
    loop {
        let v = emu.request(&format!("p2p {host}"))?;
        if v["head"].as_u64() != v["tail"].as_u64() {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "{host}: {what}: the copy never reached the DMA engine within 20 s \
                 (emulator p2p state: {v})"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `pcifab p2p copy ARGS --json` in the background of `h`; its exit code lands in
/// `/tmp/TAG.rc` and its output in `/tmp/TAG.json`.
fn copy_in_background(h: &mut Host, tag: &str, args: &str) -> Result<(), String> {
    h.run_ok(&format!(
        "rm -f /tmp/{tag}.rc /tmp/{tag}.json; (pcifab p2p copy {args} --json > /tmp/{tag}.json \
         2>&1; echo $? > /tmp/{tag}.rc) >/dev/null 2>&1 &"
    ))?;
    Ok(())
}

/// Waits (at most `secs`) for the background copy `tag` to end; returns its exit code and
/// JSON.
fn copy_result(h: &mut Host, tag: &str, secs: u32) -> Result<(i64, Value), String> {
    let o = h.run_ok_timeout(
        &format!(
            "i=0; while [ ! -s /tmp/{tag}.rc ] && [ $i -lt {} ]; do sleep 0.05; i=$((i+1)); done; \
             [ -s /tmp/{tag}.rc ] || {{ echo 'the copy still runs {secs} s on'; exit 1; }}; \
             cat /tmp/{tag}.rc /tmp/{tag}.json",
            secs * 20
        ),
        LONG,
    )?;
    let code = o
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| format!("{}: copy {tag}: no exit code in {o:?}", h.name))?;
    Ok((code, json_line(&o)?))
}

/// Waits (at most `secs`) for the background `pcifab-selftest p2p-movable` to end; returns its
/// exit code and its last (`"phase":"after"`) line.
fn movable_result(h: &mut Host, secs: u32) -> Result<(i64, Value), String> {
    let o = h.run_ok_timeout(
        &format!(
            "i=0; while [ ! -s /tmp/lt.rc ] && [ $i -lt {} ]; do sleep 0.05; i=$((i+1)); done; \
             [ -s /tmp/lt.rc ] || {{ echo 'the copy still runs {secs} s on'; exit 1; }}; \
             cat /tmp/lt.rc /tmp/lt.json",
            secs * 20
        ),
        LONG,
    )?;
    let code = o
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| format!("{}: p2p-movable: no exit code in {o:?}", h.name))?;
    let line = o
        .lines()
        .rfind(|l| l.contains("\"phase\":\"after\""))
        .ok_or_else(|| format!("{}: p2p-movable printed no result: {o}", h.name))?;
    let v = serde_json::from_str(line)
        .map_err(|e| format!("{}: p2p-movable result {line:?}: {e}", h.name))?;
    Ok((code, v))
}

/// The MEP leaves the bus (surprise removal: every BAR0 and config-space read returns all
/// ones, and the emulator's engine stops) while a copy
/// from a 16 MiB user buffer runs: the copy must end with ENODEV at once, with every page it
/// pinned unpinned and nothing left mapped for the device; once the MEP is back, copies work.
pub fn gone_during_copy(f: &mut Fabric) -> Result<(), String> {
    let Some(emu) = begin_gpu0(f, 64 * MIB)? else {
        return Ok(());
    };
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    h0.run_ok("head -c 16777216 /dev/urandom > /tmp/gone.in")?;
    let maps = emu.request("dma-maps h0")?;
    let pinned = pinned_pages(h0)?;
    // The engine sleeps before every 1 MiB it copies: the copy is still running when the
    // MEP goes.
    emu.request("fault h0 dma-delay 100")?;
    let result = (|| -> Result<(u128, i64, Value), String> {
        copy_in_background(
            h0,
            "gone",
            "--from file:/tmp/gone.in --to 0x0300:0 --len 16M --timeout 120000",
        )?;
        wait_dma_in_flight(&emu, "h0", "copy before the MEP goes")?;
        let t = Instant::now();
        emu.request("fault h0 gone")?;
        let (code, v) = copy_result(h0, "gone", 60)?;
        Ok((t.elapsed().as_millis(), code, v))
    })();
    // What the device can reach and what is pinned is looked at before the MEP comes back.
    let pinned_after = pinned_pages(h0);
    let maps_after = emu.request("dma-maps h0");
    emu.request("fault h0 clear")?;
    let (ms, code, v) = result?;
    h0.log_note(&format!(
        "copy ended {ms} ms after the MEP went (exit {code}): {v}"
    ));
    let mut c = Checks::new("h0: 16 MiB copy from a user buffer, the MEP gone during it");
    if code == 0 {
        c.fail(format!("exit code: expected a failure, got 0 ({v})"));
    }
    c.eq_json(
        "errno (ENODEV)",
        Value::from(ENODEV),
        v["error"]["errno"].clone(),
    );
    if ms > 3000 {
        c.fail(format!(
            "the copy ended {ms} ms after the MEP went; expected within 3000 ms"
        ));
    }
    c.eq("pages pinned (as before the copy)", pinned, pinned_after?);
    let maps_after = maps_after?;
    if maps_after["maps"] != maps["maps"] {
        let n = |v: &Value| v["maps"].as_array().map_or(0, Vec::len);
        c.fail(format!(
            "the emulator's DMA table: expected only what was mapped before the copy (the \
             ring, {} mappings: {}), got {} mappings",
            n(&maps),
            maps["maps"],
            n(&maps_after)
        ));
    }
    c.finish()?;
    // Back on the bus: the next copy resets the engine first, and works.
    pcifab_ok(
        h0,
        "p2p copy --from file:/tmp/gone.in --to 0x0300:0 --len 1M --timeout 120000",
    )?;
    pcifab_ok(
        h0,
        "p2p copy --from 0x0300:0 --to file:/tmp/gone.out --len 1M --timeout 120000",
    )?;
    h0.run_ok("head -c 1048576 /tmp/gone.in | cmp - /tmp/gone.out && rm -f /tmp/gone.*")
        .map_err(|e| format!("h0: 1 MiB round trip after the MEP came back: {e}"))?;
    expect_eq("h0: pages pinned at the end", pinned, pinned_pages(h0)?)?;
    check_invariants(&emu, "P2P trust: MEP gone")?;
    dmesg_clean(h0)
}

/// A user buffer in movable memory: the copy pins it long-term (`FOLL_LONGTERM`), so the
/// kernel moves the pages out of the movable zone first, and that memory block can still be
/// taken offline while the copy holds the pages. A short-term pin would leave them in the
/// block, unmovable, and the offline would not finish. The copier (`pcifab-selftest
/// p2p-movable`) counts its buffer's pages in the block before the copy
/// (`/proc/self/pagemap`): a buffer that was never there would prove nothing.
pub fn longterm_pins(f: &mut Fabric) -> Result<(), String> {
    let Some(emu) = begin_gpu0(f, 64 * MIB)? else {
        return Ok(());
    };
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    h0.run_ok("head -c 8388608 /dev/urandom > /tmp/lt.in")?;
    let pinned = pinned_pages(h0)?;
    // A memory block taken offline and brought back as ZONE_MOVABLE, which fresh user
    // memory (the CLI's buffer) is taken from first. The highest block that goes offline:
    // the kernel refuses blocks that hold unmovable pages and says so with a dump of the
    // page ("page dumped because: unmovable page"), which is no fault of the module. dmesg
    // is checked before and cleared after the search, so nothing else is hidden.
    dmesg_clean(h0)?;
    let o = h0.run_ok_timeout(
        "cd /sys/devices/system/memory || exit 1\n\
         for n in $(ls | sed -n 's/^memory\\([0-9]*\\)$/\\1/p' | sort -n -r); do\n\
           [ \"$(cat memory$n/state)\" = online ] || continue\n\
           timeout 20 sh -c \"echo offline > memory$n/state\" 2>/dev/null || continue\n\
           echo online_movable > memory$n/state || { echo online > memory$n/state; exit 1; }\n\
           echo \"block $n $(cat memory$n/valid_zones)\"; exit 0\n\
         done; echo 'no memory block goes offline'; exit 1",
        LONG,
    )?;
    h0.run_ok("dmesg -c >/dev/null")?;
    let line = o
        .lines()
        .find(|l| l.starts_with("block "))
        .ok_or_else(|| format!("h0: no movable memory block: {o}"))?;
    let mut words = line.split_whitespace().skip(1);
    let block = words.next().unwrap_or("").to_string();
    let zone = words.next().unwrap_or("");
    h0.log_note(&format!("memory block {block} onlined as {zone}"));
    expect_eq(
        "h0: zone of the memory block onlined movable",
        "Movable",
        zone,
    )?;
    let state = format!("/sys/devices/system/memory/memory{block}/state");

    // Every chunk waits 30 s in the engine: the first part of the buffer stays pinned
    // while the block is taken offline.
    emu.request("fault h0 dma-delay 30000")?;
    let result = (|| -> Result<(i64, String), String> {
        h0.run_ok(&format!(
            "rm -f /tmp/lt.rc /tmp/lt.json; (pcifab-selftest p2p-movable --file /tmp/lt.in \
             --fn 0x0300 --off 0 --block {block} --timeout 300000 > /tmp/lt.json 2>&1; \
             echo $? > /tmp/lt.rc) >/dev/null 2>&1 &"
        ))?;
        wait_dma_in_flight(&emu, "h0", "copy from a buffer in movable memory")?;
        let o = h0.run_timeout(
            &format!("timeout 20 sh -c 'echo offline > {state}' 2>&1; echo rc=$?"),
            LONG,
        )?;
        let head_tail = emu.request("p2p h0")?;
        h0.log_note(&format!(
            "offline during the copy: {}; engine {head_tail}",
            o.out.trim()
        ));
        let in_flight = head_tail["head"].as_u64() != head_tail["tail"].as_u64();
        if !in_flight {
            return Err(format!(
                "h0: the copy left the engine before the offline ended ({head_tail}): \
                 nothing was pinned during it"
            ));
        }
        Ok((o.code, o.out))
    })();
    emu.request("fault h0 clear")?;
    let copied = movable_result(h0, 200);
    // The block comes back whatever happened.
    let _ = h0.run(&format!(
        "[ \"$(cat {state})\" = online ] || echo online_movable > {state}"
    ));
    let (_, out) = result?;
    let mut c = Checks::new("h0: 8 MiB copy from a buffer in a movable memory block");
    if !out.contains("rc=0") {
        c.fail(format!(
            "taking the block offline while the copy held its pages: expected it to finish \
             (the pinned pages moved out of the movable zone), got: {}",
            out.trim()
        ));
    }
    let (code, v) = copied?;
    h0.log_note(&format!("copier: {v}"));
    c.eq("copier exit code", 0, code);
    c.eq_json("copy errno", Value::from(0), v["errno"].clone());
    c.eq_json("bytes copied", Value::from(8 * MIB), v["done"].clone());
    c.eq_json(
        "buffer pages present (every page it spans)",
        v["span"].clone(),
        v["pages"].clone(),
    );
    if v["in_block_before"].as_u64().unwrap_or(0) == 0 {
        c.fail(format!(
            "none of the buffer's pages was in memory block {block} before the copy: the \
             offline proves nothing about the pin ({v})"
        ));
    }
    c.eq_json(
        "buffer pages left in the block after the copy",
        Value::from(0),
        v["in_block_after"].clone(),
    );
    c.finish()?;
    pcifab_ok(
        h0,
        "p2p copy --from 0x0300:0 --to file:/tmp/lt.out --len 8M --timeout 120000",
    )?;
    h0.run_ok("cmp /tmp/lt.in /tmp/lt.out && rm -f /tmp/lt.*")
        .map_err(|e| format!("h0: 8 MiB round trip through a movable block: {e}"))?;
    expect_eq(
        "h0: pages pinned after the copies",
        pinned,
        pinned_pages(h0)?,
    )?;
    check_invariants(&emu, "P2P trust: long-term pins")?;
    dmesg_clean(h0)
}

/// One long function-to-function copy runs; a second copier waits for the engine. SIGKILL
/// ends the waiting one within a second; the first completes, byte for byte.
pub fn killed_waiter(f: &mut Fabric) -> Result<(), String> {
    let Some(emu) = begin_gpu0(f, 128 * MIB)? else {
        return Ok(());
    };
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    emu.request(&format!("mem-fill {GPU0:#06x} 0 {:#x} 0x5eed0d", 32 * MIB))?;
    emu.request(&format!(
        "mem-fill {GPU0:#06x} {:#x} {:#x} 1",
        32 * MIB,
        32 * MIB
    ))?;
    let want = emu.request(&format!("mem-hash {GPU0:#06x} 0 {:#x}", 32 * MIB))?;
    // 32 chunks of 1 MiB, 400 ms each: about 13 s.
    emu.request("fault h0 dma-delay 400")?;
    let cmd = pcifab_uapi::PCIFAB_IOCTL_P2P_COPY;
    let result = (|| -> Result<(String, bool), String> {
        copy_in_background(
            h0,
            "long",
            "--from 0x0300:0 --to 0x0300:0x2000000 --len 32M --timeout 120000",
        )?;
        wait_dma_in_flight(&emu, "h0", "the long copy")?;
        // The second copier: in the copy ioctl (system call and command, from
        // /proc/PID/syscall, where the command shows sign-extended), then killed; the time from the kill to its end is measured
        // in the guest (/proc/uptime, 10 ms steps).
        let o = h0.run_ok_timeout(
            &format!(
                "pcifab p2p copy --from 0x0300:0 --to 0x0300:0x6000000 --len 0x1000 --json \
                 >/tmp/second.out 2>&1 & pid=$!\n\
                 seen=''\n\
                 in_copy() {{ sc=$(cat /proc/$pid/syscall 2>&1); \
                   case \"$seen\" in *\"[$sc]\"*) ;; *) seen=\"$seen [$sc]\";; esac; \
                   set -- $sc; [ \"$1\" = {SYS_IOCTL} ] && \
                   case \"$3\" in {cmd:#x}|0xffffffff{cmd:08x}) true;; *) false;; esac; }}\n\
                 read s0 x < /proc/uptime; now=$s0\n\
                 while ! in_copy && [ ${{now%.*}} -lt $((${{s0%.*}} + 20)) ]; do \
                   sleep 0.05; read now x < /proc/uptime; done\n\
                 in_copy || {{ echo \"the second copier never waited in the copy ioctl: \
                   /proc/PID/syscall read $seen; $(grep State /proc/$pid/status 2>&1); output \
                   $(cat /tmp/second.out)\"; kill -9 $pid; exit 1; }}\n\
                 echo \"second copier: syscall $sc, $(grep State /proc/$pid/status)\"\n\
                 read t0 x < /proc/uptime; kill -9 $pid; wait $pid; rc=$?; \
                 read t1 x < /proc/uptime\n\
                 echo \"killed rc=$rc t0=$t0 t1=$t1\""
            ),
            LONG,
        )?;
        let head_tail = emu.request("p2p h0")?;
        h0.log_note(&format!("engine after the kill: {head_tail}"));
        Ok((o, head_tail["head"].as_u64() != head_tail["tail"].as_u64()))
    })();
    // The long copy must finish as it was: the delay stays until it is checked.
    let long = copy_result(h0, "long", 120);
    emu.request("fault h0 clear")?;
    let (o, in_flight) = result?;
    h0.log_note(o.trim());
    let line = o
        .lines()
        .find(|l| l.starts_with("killed "))
        .ok_or_else(|| format!("h0: no kill line in {o:?}"))?;
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("h0: no {k} in {line:?}"))
    };
    let ms = ((field("t1=")? - field("t0=")?) * 1000.0).round() as i64;
    let mut c = Checks::new("h0: a copier killed while a 32 MiB copy holds the engine");
    c.eq(
        "killed copier's exit status (SIGKILL)",
        137,
        field("rc=")? as i64,
    );
    if ms > 1000 {
        c.fail(format!(
            "the killed copier ended {ms} ms after SIGKILL; expected within 1000 ms"
        ));
    } else if !in_flight {
        // Quick, but proves nothing unless the first copy still held the engine.
        c.fail(
            "the long copy left the engine before the kill was measured: nothing was waited for"
                .into(),
        );
    }
    let (code, v) = long?;
    c.eq("long copy exit code", 0, code);
    c.eq_json("long copy bytes", Value::from(32 * MIB), v["bytes"].clone());
    let got = emu.request(&format!(
        "mem-hash {GPU0:#06x} {:#x} {:#x}",
        32 * MIB,
        32 * MIB
    ))?;
    c.eq_json(
        "hash of [32M, 64M) after the copy from [0, 32M)",
        want["fnv1a64"].clone(),
        got["fnv1a64"].clone(),
    );
    c.finish()?;
    h0.log_note(&format!("the killed copier ended {ms} ms after SIGKILL"));
    check_invariants(&emu, "P2P trust: killed waiter")?;
    dmesg_clean(h0)
}

/// `EINTR` as the selftest reports it.
const EINTR: i64 = 4;

/// A copier waits for the engine while SIGALRM (handler with `SA_RESTART`) arrives every
/// 100 ms. Its 1 s timeout must hold: the call ends within it, with `EINTR` and nothing
/// copied, while the copy ahead of it still has the engine. Before, the wait returned
/// `ERESTARTSYS`, the call restarted with a new deadline at every signal, and it waited
/// until the engine was free (then copied).
pub fn signalled_waiter(f: &mut Fabric) -> Result<(), String> {
    let Some(emu) = begin_gpu0(f, 16 * MIB)? else {
        return Ok(());
    };
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    // One 4 MiB part of 4 chunks, 2 s each: the engine is busy for about 8 s.
    emu.request("fault h0 dma-delay 2000")?;
    let result = (|| -> Result<(Value, bool), String> {
        copy_in_background(
            h0,
            "long",
            "--from 0x0300:0 --to 0x0300:0x400000 --len 4M --timeout 120000",
        )?;
        wait_dma_in_flight(&emu, "h0", "the long copy")?;
        let v = selftest_json(
            h0,
            "p2p-signalled --from 0x0300:0 --to 0x0300:0x800000 --len 4096 --timeout 1000 \
             --every 100",
            LONG,
        )?;
        let engine = emu.request("p2p h0")?;
        Ok((v, engine["head"].as_u64() != engine["tail"].as_u64()))
    })();
    let long = copy_result(h0, "long", 120);
    emu.request("fault h0 clear")?;
    let (v, in_flight) = result?;
    h0.log_note(&format!("signalled copier: {v}"));
    let mut c = Checks::new("h0: a copier signalled (SA_RESTART) while it waits for the engine");
    let ms = v["ms"].as_u64().unwrap_or(u64::MAX);
    if ms > 2000 {
        c.fail(format!(
            "the call took {ms} ms; its timeout is 1000 ms (restarted with a new deadline?)"
        ));
    }
    c.eq_json("errno", Value::from(EINTR), v["errno"].clone());
    c.eq_json("bytes done", Value::from(0), v["done"].clone());
    if v["signals"].as_u64().unwrap_or(0) == 0 {
        c.fail("no SIGALRM reached the copier".into());
    }
    if !in_flight {
        c.fail("the long copy left the engine before the signalled copier ended".into());
    }
    let (code, lv) = long?;
    c.eq("long copy exit code", 0, code);
    c.eq_json("long copy bytes", Value::from(4 * MIB), lv["bytes"].clone());
    c.finish()?;
    check_invariants(&emu, "P2P trust: signalled waiter")?;
    dmesg_clean(h0)
}

/// The MEP's registers go back to their power-on values as a function-level or bus reset
/// leaves them, config space restored as the PCI core does (`reset-regs h0`): the DMA
/// engine's ring base and size, interrupt and enable are gone. The next copy must find that
/// out and set the engine up again; before, the driver programmed the ring at probe only and
/// every later copy timed out.
pub fn ring_after_reset(f: &mut Fabric) -> Result<(), String> {
    let Some(emu) = begin_gpu0(f, 16 * MIB)? else {
        return Ok(());
    };
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    h0.run_ok("head -c 1048576 /dev/urandom > /tmp/rst.in")?;
    pcifab_ok(
        h0,
        "p2p copy --from file:/tmp/rst.in --to 0x0300:0 --len 1M --timeout 20000",
    )?;
    emu.request("reset-regs h0")?;
    let r = ring_after_reset_checks(&emu, h0);
    // Events, DMA MRPC and the rest of the registers as a fresh probe sets them, whatever
    // happened: the scenarios after this one need the MEP's events.
    let reloaded = h0
        .run_ok(&format!("rmmod pcifab && insmod {PCIFAB_KO}"))
        .and_then(|_| check_bound_pcifab(h0));
    r?;
    reloaded?;
    check_invariants(&emu, "P2P trust: ring after a reset")?;
    dmesg_clean(h0)
}

/// The checks of [`ring_after_reset`] once the registers were reset.
fn ring_after_reset_checks(emu: &EmuControl, h0: &mut Host) -> Result<(), String> {
    let reset = emu.request("dma-state h0")?;
    let t = Instant::now();
    let (code, v, out) = pcifab_cmd(
        h0,
        "p2p copy --from 0x0300:0 --to file:/tmp/rst.out --len 1M --timeout 20000",
    )?;
    let ms = t.elapsed().as_millis();
    let after = emu.request("dma-state h0")?;
    h0.log_note(&format!(
        "engine after the reset: {reset}; copy after it: exit {code} in {ms} ms; engine then: \
         {after}"
    ));
    let mut c = Checks::new("h0: 1 MiB copy after the MEP's registers were reset");
    c.eq_json(
        "ring size right after the reset",
        Value::from(0),
        reset["ring_size"].clone(),
    );
    c.eq("copy exit code", 0, code);
    if code != 0 {
        c.fail(format!("the copy failed: {}", out.trim()));
    }
    c.eq_json("bytes copied", Value::from(MIB), v["bytes"].clone());
    c.eq_json(
        "engine enabled again",
        Value::Bool(true),
        after["engine_on"].clone(),
    );
    c.eq_json(
        "ring size again",
        Value::from(256),
        after["ring_size"].clone(),
    );
    if h0
        .run("dmesg | grep -q 'P2P DMA engine lost its ring'")?
        .code
        != 0
    {
        c.fail("the driver did not log that the engine lost its ring".into());
    }
    c.finish()?;
    h0.run_ok("cmp /tmp/rst.in /tmp/rst.out && rm -f /tmp/rst.*")
        .map_err(|e| format!("h0: 1 MiB round trip across the reset: {e}"))?;
    Ok(())
}
