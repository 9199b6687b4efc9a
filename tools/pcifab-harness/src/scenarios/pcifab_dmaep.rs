// SPDX-License-Identifier: GPL-2.0-only
//! pcifab binds the switch's DMA endpoint (`src/dmaep.rs`): in every guest the module's
//! second PCI driver, `pcifab_dmaep`, holds the emulated endpoint, brings up every channel and
//! copies through each (basic mode, polled completions) at bind; the copies must go through
//! the emulator (its per-channel counters move by exactly the self-test's copies and bytes),
//! and the driver reports each channel's result in sysfs. With the emulator's completions
//! lying (bad status, a short byte count, a phase never written) each channel must fail
//! cleanly: the error in sysfs, the driver still bound, no splat, and a rebind with honest
//! completions passes again.
//!
//! Fabric mode: h1 registers a buffer for h0 through its endpoint (`PCIFAB_IOCTL_P2P_REGISTER`),
//! h0 copies into it through its own (`PCIFAB_P2P_PEER`), h1 checks the bytes itself; a copy
//! outside the buffer, into a slot h1 did not register, and after h1 unregistered (or its
//! process died, closing the file) is refused before a descriptor is written, and the
//! emulated firmware lists the buffer exactly while it is registered.

use serde_json::Value;

use std::time::Duration;

use crate::checks::{
    begin, dmesg_clean, driver_of, pcifab_cmd, pinned_pages, selftest_json, two_hosts,
    wait_or_dmesg, Checks,
};
use crate::fabric::{EmuControl, Fabric, Host};

const DRIVER: &str = "pcifab_dmaep";
/// `SELFTEST_COPIES` and `SELFTEST_LEN` of `src/dmaep.rs`.
const COPIES: u64 = 20;
const LEN: u64 = 4096;

/// BDF of the DMA endpoint: vendor 0x11f8, class 0x088000.
fn find_dmaep(h: &mut Host) -> Result<String, String> {
    let out = h.run_ok(
        r#"for d in /sys/bus/pci/devices/*; do
  read -r v <$d/vendor && read -r c <$d/class || continue
  if [ "$v" = 0x11f8 ] && [ "$c" = 0x088000 ]; then echo "${d##*/}"; fi
done"#,
    )?;
    let found: Vec<&str> = out.split_whitespace().collect();
    match found.as_slice() {
        [bdf] => Ok(bdf.to_string()),
        _ => Err(format!(
            "{}: expected one PCI device with vendor 0x11f8 and class 0x088000 (the emulated \
             DMA endpoint), found [{}]; does the emulator config set dma_endpoint_channels?",
            h.name,
            found.join(" ")
        )),
    }
}

/// Per channel (fetched, completions, bytes) as the emulator counts them.
fn emu_counts(emu: &EmuControl, host: &str) -> Result<Vec<(u64, u64, u64)>, String> {
    let v = emu.request(&format!("dmaep {host} stats"))?;
    let chans = v
        .get("channels")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("emulator `dmaep {host} stats`: no channels in {v}"))?;
    Ok(chans
        .iter()
        .map(|c| {
            let n = |k: &str| c.get(k).and_then(Value::as_u64).unwrap_or(u64::MAX);
            (n("fetched"), n("completions"), n("bytes"))
        })
        .collect())
}

/// Unbinds and binds the endpoint again (which runs the self-test) and returns the lines of
/// its `selftest` file.
fn rebind(h: &mut Host, bdf: &str) -> Result<Vec<String>, String> {
    h.run_ok(&format!(
        "echo {bdf} > /sys/bus/pci/drivers/{DRIVER}/unbind && \
         echo {bdf} > /sys/bus/pci/drivers/{DRIVER}/bind"
    ))?;
    wait_or_dmesg(
        h,
        &format!("[ -e /sys/bus/pci/devices/{bdf}/pcifab/selftest ]"),
        20,
        &format!("{bdf}: {DRIVER} did not bind again"),
    )?;
    let out = h.run_ok(&format!("cat /sys/bus/pci/devices/{bdf}/pcifab/selftest"))?;
    Ok(out.lines().map(str::to_string).collect())
}

/// The endpoint of `h`, checked to be bound to pcifab with `configured` channels.
fn bound_endpoint(h: &mut Host, configured: usize) -> Result<String, String> {
    let bdf = find_dmaep(h)?;
    let mut c = Checks::new(&format!("{}: pcifab on the DMA endpoint {bdf}", h.name));
    c.eq("driver", Some(DRIVER.to_string()), driver_of(h, &bdf)?);
    c.finish()?;
    let chans = h.run_ok(&format!("cat /sys/bus/pci/devices/{bdf}/pcifab/channels"))?;
    let mut c = Checks::new(&format!("{}: {bdf}/pcifab/channels", h.name));
    c.eq("channels", configured.to_string(), chans.trim().to_string());
    c.finish()?;
    Ok(bdf)
}

fn copies_host(h: &mut Host, emu: &EmuControl, configured: usize) -> Result<(), String> {
    begin(h)?;
    let bdf = bound_endpoint(h, configured)?;
    let before = emu_counts(emu, &h.name)?;
    let lines = rebind(h, &bdf)?;
    let after = emu_counts(emu, &h.name)?;
    let mut c = Checks::new(&format!("{}: self-test copies through {bdf}", h.name));
    let want: Vec<String> = (0..configured)
        .map(|i| format!("{i} ok {}", COPIES * LEN))
        .collect();
    c.eq("selftest lines", want, lines);
    c.eq("channels the emulator serves", configured, after.len());
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        c.eq(
            &format!("channel {i}: entries fetched"),
            COPIES,
            a.0.wrapping_sub(b.0),
        );
        c.eq(
            &format!("channel {i}: completions written"),
            COPIES,
            a.1.wrapping_sub(b.1),
        );
        c.eq(
            &format!("channel {i}: bytes copied"),
            COPIES * LEN,
            a.2.wrapping_sub(b.2),
        );
    }
    c.finish()?;
    h.log_note(&format!(
        "{DRIVER}: {configured} channels x {COPIES} copies of {LEN} bytes through the emulated \
         DMA endpoint"
    ));
    dmesg_clean(h)
}

pub fn pcifab_copies_through_every_channel(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    f.each_host(|h, _| copies_host(h, &emu, configured))
}

/// One lying completion mode: the `dmaep` fault, and what each channel's line must say.
const LIES: [(&str, &str); 3] = [
    // Every completion carries status 0x100 (READ_FAILED): the first copy fails.
    ("bad-status 0x100", "EIO 0x100"),
    // Half the bytes done, and the completion says so.
    ("short", "EIO 0x0"),
    // Completions written with the previous pass's phase: never seen, the wait ends.
    ("wrong-phase", "ETIMEDOUT 0x0"),
];

fn lies_host(h: &mut Host, emu: &EmuControl, configured: usize) -> Result<(), String> {
    begin(h)?;
    let bdf = bound_endpoint(h, configured)?;
    for (fault, want) in LIES {
        emu.request(&format!("dmaep {} {fault}", h.name))?;
        let lines = rebind(h, &bdf);
        emu.request(&format!("dmaep {} clear", h.name))?;
        let lines = lines?;
        let mut c = Checks::new(&format!(
            "{}: {bdf} with completions lying ({fault})",
            h.name
        ));
        let want: Vec<String> = (0..configured).map(|i| format!("{i} {want}")).collect();
        c.eq("selftest lines", want, lines);
        c.eq("driver", Some(DRIVER.to_string()), driver_of(h, &bdf)?);
        c.finish()?;
        dmesg_clean(h)?;
    }
    // Honest completions again: every channel passes after a rebind.
    let lines = rebind(h, &bdf)?;
    let mut c = Checks::new(&format!("{}: {bdf} after the faults", h.name));
    let want: Vec<String> = (0..configured)
        .map(|i| format!("{i} ok {}", COPIES * LEN))
        .collect();
    c.eq("selftest lines", want, lines);
    c.finish()?;
    dmesg_clean(h)
}

pub fn pcifab_fails_cleanly_on_lying_completions(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    let r = f.each_host(|h, _| lies_host(h, &emu, configured));
    if r.is_err() {
        let _ = emu.request("dmaep all clear");
    }
    r
}

/// The user copies of `user_copies_host`: (length, shift into the allocation).
const USER_COPIES: [(u64, u64); 3] = [(1, 0), (8191, 4095), (3 << 20, 13)];

fn user_copies_host(h: &mut Host, emu: &EmuControl, configured: usize) -> Result<(), String> {
    begin(h)?;
    bound_endpoint(h, configured)?;
    for (len, shift) in USER_COPIES {
        let before = emu_counts(emu, &h.name)?;
        let v = selftest_json(
            h,
            &format!("p2p-local --len {len:#x} --seed 0x77 --shift {shift}"),
            Duration::from_secs(120),
        )?;
        let after = emu_counts(emu, &h.name)?;
        let moved: u64 = before
            .iter()
            .zip(&after)
            .map(|(b, a)| a.2.wrapping_sub(b.2))
            .sum();
        let mut c = Checks::new(&format!(
            "{}: user copy of {len} bytes through the endpoint",
            h.name
        ));
        c.eq("bytes the emulated endpoint copied", len, moved);
        c.finish()?;
        h.log_note(&format!("p2p-local {len} bytes: {v}"));
    }
    dmesg_clean(h)
}

pub fn pcifab_copies_user_buffers(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    f.each_host(|h, _| user_copies_host(h, &emu, configured))
}

fn configured(f: &Fabric) -> Result<usize, String> {
    match f.expected.dma_endpoint_channels as usize {
        0 => Err(
            "the emulator's configuration sets no dma_endpoint_channels: the switch shows no \
             DMA endpoint (tools/pcifab-harness/fabric.toml sets 4)"
                .into(),
        ),
        n => Ok(n),
    }
}

/// h0's copies into the buffer h1 holds: (offset, length, seed, errno expected).
const PEER_LEN: u64 = 4096;
const PEER_SEED: u64 = 0x31;
const COPY_IN: (u64, u64, u64) = (100, 1000, 0x52);
const ENOENT: i64 = 2;
const EFAULT: i64 = 14;

/// The HFID the endpoint of `h` reports in sysfs.
fn hfid_of(h: &mut Host, bdf: &str) -> Result<u16, String> {
    let s = h.run_ok(&format!("cat /sys/bus/pci/devices/{bdf}/pcifab/hfid"))?;
    let t = s.trim();
    t.strip_prefix("0x")
        .and_then(|x| u16::from_str_radix(x, 16).ok())
        .ok_or_else(|| format!("{}: {bdf}/pcifab/hfid reads {t:?}, not an HFID", h.name))
}

/// Both hosts with their endpoints bound to pcifab, as every fabric-mode scenario starts:
/// the endpoints' BDFs and HFIDs, h0's first.
struct Endpoints {
    bdf: [String; 2],
    hfid: [u16; 2],
}

fn both_endpoints(h0: &mut Host, h1: &mut Host, configured: usize) -> Result<Endpoints, String> {
    begin(h0)?;
    begin(h1)?;
    let bdf0 = bound_endpoint(h0, configured)?;
    let bdf1 = bound_endpoint(h1, configured)?;
    let hfid = [hfid_of(h0, &bdf0)?, hfid_of(h1, &bdf1)?];
    Ok(Endpoints {
        bdf: [bdf0, bdf1],
        hfid,
    })
}

/// Buffers a host registered, as the emulated firmware lists them: (peer, index, size).
type EmuBufs = Vec<(String, u64, u64)>;

/// The emulated firmware's view of `host`'s endpoint: its HFID and the buffers it
/// registered.
fn emu_fabric(emu: &EmuControl, host: &str) -> Result<(u64, EmuBufs), String> {
    let v = emu.request(&format!("dmaep {host} stats"))?;
    let fab = v
        .get("fabric")
        .ok_or_else(|| format!("emulator `dmaep {host} stats`: no fabric in {v}"))?;
    let hfid = fab.get("hfid").and_then(Value::as_u64).unwrap_or(u64::MAX);
    let bufs = fab
        .get("buffers")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("emulator `dmaep {host} stats`: no buffers in {v}"))?
        .iter()
        .map(|b| {
            (
                b.get("peer")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string(),
                b.get("index").and_then(Value::as_u64).unwrap_or(u64::MAX),
                b.get("size").and_then(Value::as_u64).unwrap_or(u64::MAX),
            )
        })
        .collect();
    Ok((hfid, bufs))
}

/// Bytes all channels of `host`'s endpoint copied so far.
fn emu_bytes(emu: &EmuControl, host: &str) -> Result<u64, String> {
    Ok(emu_counts(emu, host)?.iter().map(|c| c.2).sum())
}

/// The JSON line of `out` whose phase is `phase`.
fn phase_line(out: &str, phase: &str) -> Option<Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("phase").and_then(Value::as_str) == Some(phase))
}

/// Starts `pcifab-selftest p2p-hold` on h1 for h0 in `dir` and waits for its registration:
/// the slot and the HFID it reports.
fn start_hold(h1: &mut Host, hfid0: u16, dir: &str) -> Result<(u8, u16), String> {
    h1.run_ok(&format!(
        "rm -rf {dir} && mkdir -p {dir} && (pcifab-selftest p2p-hold --peer {hfid0:#x} \
         --len {PEER_LEN} --seed {PEER_SEED:#x} --dir {dir} </dev/null >{dir}/out 2>&1 & \
         echo $! >{dir}/pid)"
    ))?;
    wait_or_dmesg(
        h1,
        &format!("( grep -q registered {dir}/out || [ ! -e /proc/$(cat {dir}/pid) ] )"),
        30,
        "p2p-hold did not register its buffer",
    )?;
    let out = h1.run_ok(&format!("cat {dir}/out"))?;
    let v = phase_line(&out, "registered")
        .ok_or_else(|| format!("{}: p2p-hold did not register: {}", h1.name, out.trim()))?;
    let slot = v.get("slot").and_then(Value::as_u64).unwrap_or(u64::MAX);
    let hfid = v.get("hfid").and_then(Value::as_u64).unwrap_or(u64::MAX);
    match (u8::try_from(slot), u16::try_from(hfid)) {
        (Ok(s), Ok(h)) => Ok((s, h)),
        _ => Err(format!("{}: p2p-hold reported {v}", h1.name)),
    }
}

/// One copy of h0 into h1's slot: (errno, bytes done).
fn peer_copy(
    h0: &mut Host,
    hfid1: u16,
    slot: u8,
    (off, len, seed): (u64, u64, u64),
) -> Result<(i64, u64), String> {
    let v = selftest_json(
        h0,
        &format!(
            "p2p-peer --hfid {hfid1:#x} --slot {slot} --off {off} --len {len} --seed {seed:#x}"
        ),
        Duration::from_secs(60),
    )?;
    let errno = v.get("errno").and_then(Value::as_i64).unwrap_or(-1);
    let done = v.get("done").and_then(Value::as_u64).unwrap_or(u64::MAX);
    Ok((errno, done))
}

pub fn peer_copies_into_registered_buffer(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "this scenario needs two hosts")?;
    let ep = both_endpoints(h0, h1, configured)?;
    let ([hfid0, hfid1], bdf1) = (ep.hfid, &ep.bdf[1]);
    let mut c = Checks::new("the endpoints' HFIDs, as sysfs and the firmware say");
    c.eq("h0", emu_fabric(&emu, "h0")?.0, u64::from(hfid0));
    c.eq("h1", emu_fabric(&emu, "h1")?.0, u64::from(hfid1));
    c.eq(
        "h1's buffers before",
        EmuBufs::new(),
        emu_fabric(&emu, "h1")?.1,
    );
    c.finish()?;

    let (slot, reported) = start_hold(h1, hfid0, "/tmp/hold")?;
    let mut c = Checks::new("h1 registers a buffer for h0");
    c.eq("HFID REGISTER reports", hfid1, reported);
    c.eq(
        "h1's buffers in the firmware",
        vec![("h0".to_string(), u64::from(slot), PEER_LEN)],
        emu_fabric(&emu, "h1")?.1,
    );
    c.finish()?;

    let before = emu_bytes(&emu, "h0")?;
    let (errno, done) = peer_copy(h0, hfid1, slot, COPY_IN)?;
    let (off, len, _) = COPY_IN;
    let mut c = Checks::new("h0 copies into h1's buffer");
    c.eq("errno", 0, errno);
    c.eq("bytes done", len, done);
    c.eq(
        "bytes h0's endpoint copied",
        len,
        emu_bytes(&emu, "h0")?.wrapping_sub(before),
    );
    c.finish()?;

    // Refused before a descriptor is written: nothing moves.
    let before = emu_bytes(&emu, "h0")?;
    let outside = peer_copy(h0, hfid1, slot, (PEER_LEN - 96, 200, 0x77))?;
    let other = peer_copy(h0, hfid1, (slot + 1) % 6, (0, 64, 0x77))?;
    // The same through the CLI's peer end.
    h0.run_ok("head -c 200 /dev/zero >/tmp/peer.src")?;
    let (code, v, out) = pcifab_cmd(
        h0,
        &format!(
            "p2p copy --from file:/tmp/peer.src --to peer:{hfid1:#x}:{slot}:{} --len 200",
            PEER_LEN - 96
        ),
    )?;
    let mut c = Checks::new("h0's copies h1's registration does not admit");
    c.eq("past the buffer's end: (errno, done)", (EFAULT, 0), outside);
    c.eq(
        "past the buffer's end, `pcifab p2p copy --to peer:...`: (exit, errno)",
        (1, Some(EFAULT)),
        (code, v.pointer("/error/errno").and_then(Value::as_i64)),
    );
    if code != 1 {
        c.fail(format!("`pcifab p2p copy` printed: {}", out.trim()));
    }
    c.eq(
        "a slot h1 did not register: (errno, done)",
        (ENOENT, 0),
        other,
    );
    c.eq(
        "bytes h0's endpoint copied",
        0,
        emu_bytes(&emu, "h0")?.wrapping_sub(before),
    );
    c.finish()?;

    // h1 checks its buffer itself, then unregisters it.
    h1.run_ok(&format!(
        "echo '{off} {len} {:#x}' >/tmp/hold/check.part && mv /tmp/hold/check.part /tmp/hold/check",
        COPY_IN.2
    ))?;
    wait_or_dmesg(
        h1,
        "( grep -q unregistered /tmp/hold/out || [ ! -e /proc/$(cat /tmp/hold/pid) ] )",
        30,
        "p2p-hold did not check and unregister",
    )?;
    let out = h1.run_ok("cat /tmp/hold/out")?;
    let checked = phase_line(&out, "checked");
    let unreg = phase_line(&out, "unregistered");
    let mut c = Checks::new("h1 finds h0's bytes in its buffer and unregisters it");
    c.eq(
        "check: ok",
        Some(true),
        checked
            .as_ref()
            .and_then(|v| v.get("ok"))
            .and_then(Value::as_bool),
    );
    c.eq(
        "UNREGISTER errno",
        Some(0),
        unreg
            .as_ref()
            .and_then(|v| v.get("errno"))
            .and_then(Value::as_i64),
    );
    c.eq(
        "h1's buffers in the firmware",
        EmuBufs::new(),
        emu_fabric(&emu, "h1")?.1,
    );
    c.finish()?;
    let before = emu_bytes(&emu, "h0")?;
    let after_unreg = peer_copy(h0, hfid1, slot, COPY_IN)?;
    let mut c = Checks::new("h0's copy once h1 unregistered");
    c.eq("(errno, done)", (ENOENT, 0), after_unreg);
    c.eq(
        "bytes h0's endpoint copied",
        0,
        emu_bytes(&emu, "h0")?.wrapping_sub(before),
    );
    c.finish()?;
    h1.run_ok("touch /tmp/hold/end")?;
    wait_or_dmesg(
        h1,
        "[ ! -e /proc/$(cat /tmp/hold/pid) ]",
        30,
        "p2p-hold did not exit",
    )?;

    // The registration belongs to the file: a process killed with its buffer registered
    // leaves nothing registered.
    let (slot2, _) = start_hold(h1, hfid0, "/tmp/hold2")?;
    let mut c = Checks::new("h1 registers a second buffer");
    c.eq(
        "h1's buffers in the firmware",
        1,
        emu_fabric(&emu, "h1")?.1.len(),
    );
    c.finish()?;
    h1.run_ok("kill -9 $(cat /tmp/hold2/pid)")?;
    wait_or_dmesg(
        h1,
        "[ ! -e /proc/$(cat /tmp/hold2/pid) ]",
        30,
        "p2p-hold did not die",
    )?;
    let mut c = Checks::new("h1's process killed with its buffer registered");
    c.eq(
        "h1's buffers in the firmware",
        EmuBufs::new(),
        emu_fabric(&emu, "h1")?.1,
    );
    c.eq(
        "h0's copy: (errno, done)",
        (ENOENT, 0),
        peer_copy(h0, hfid1, slot2, COPY_IN)?,
    );
    c.finish()?;

    // Unbinding the endpoint unregisters what its files registered, before the pages go.
    let (slot3, _) = start_hold(h1, hfid0, "/tmp/hold3")?;
    let mut c = Checks::new("h1 registers a third buffer");
    c.eq(
        "h1's buffers in the firmware",
        1,
        emu_fabric(&emu, "h1")?.1.len(),
    );
    c.finish()?;
    let unbound = h1.run_ok(&format!(
        "echo {bdf1} > /sys/bus/pci/drivers/{DRIVER}/unbind"
    ));
    let listed = emu_fabric(&emu, "h1");
    let after = peer_copy(h0, hfid1, slot3, COPY_IN);
    let rebound = h1.run_ok(&format!(
        "echo '0 0 0x1' >/tmp/hold3/check.part && mv /tmp/hold3/check.part /tmp/hold3/check; \
         touch /tmp/hold3/end; echo {bdf1} > /sys/bus/pci/drivers/{DRIVER}/bind"
    ));
    unbound?;
    rebound?;
    wait_or_dmesg(
        h1,
        &format!("[ -e /sys/bus/pci/devices/{bdf1}/pcifab/hfid ]"),
        20,
        &format!("{bdf1}: {DRIVER} did not bind again"),
    )?;
    wait_or_dmesg(
        h1,
        "[ ! -e /proc/$(cat /tmp/hold3/pid) ]",
        30,
        "p2p-hold did not exit",
    )?;
    let mut c = Checks::new("h1's endpoint unbound with a buffer registered");
    c.eq("h1's buffers in the firmware", EmuBufs::new(), listed?.1);
    c.eq("h0's copy: (errno, done)", (ENOENT, 0), after?);
    c.finish()?;
    h0.log_note(&format!(
        "h0 ({hfid0:#06x}) copied {len} bytes into the buffer h1 ({hfid1:#06x}) registered in \
         slot {slot}"
    ));
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

/// The state letter of process `pid` in `h` (`/proc/PID/status`), or `gone`.
fn proc_state(h: &mut Host, pid: &str) -> Result<String, String> {
    let o = h.run(&format!(
        "sed -n 's/^State:[[:space:]]*\\([A-Z]\\).*/\\1/p' /proc/{pid}/status 2>/dev/null"
    ))?;
    let s = o.out.trim();
    Ok(if s.is_empty() {
        "gone".into()
    } else {
        s.into()
    })
}

fn killable_host(h: &mut Host, emu: &EmuControl, configured: usize) -> Result<(), String> {
    begin(h)?;
    bound_endpoint(h, configured)?;
    // The channels fetch nothing: the first copy holds them until the fault is cleared.
    emu.request(&format!("dmaep {} stall", h.name))?;
    let r = killable_steps(h);
    emu.request(&format!("dmaep {} clear", h.name))?;
    let killed = r?;
    wait_or_dmesg(
        h,
        "[ ! -e /proc/$(cat /tmp/first.pid) ]",
        60,
        "the first copy did not end once the channels ran again",
    )?;
    let out = h.run_ok("cat /tmp/first.out")?;
    let mut c = Checks::new(&format!("{}: a copier waiting for the channels", h.name));
    c.eq(
        "the waiting copier, killed, is gone within 2 s",
        true,
        killed,
    );
    c.eq(
        "the first copy, once the channels run again",
        true,
        out.contains("\"test\":\"p2p-local\""),
    );
    c.finish()?;
    dmesg_clean(h)
}

/// Starts a copy that stalls, a second behind it, kills the second: whether it was gone
/// within 2 s.
fn killable_steps(h: &mut Host) -> Result<bool, String> {
    h.run_ok(
        "(pcifab-selftest p2p-local --len 4096 --seed 0x5 </dev/null >/tmp/first.out 2>&1 & \
         echo $! >/tmp/first.pid)",
    )?;
    let first = h.run_ok("cat /tmp/first.pid")?.trim().to_string();
    // The first copy polls its completion in uninterruptible sleeps (D).
    wait_or_dmesg(
        h,
        &format!("grep -q '^State:.*D' /proc/{first}/status"),
        20,
        "the first copy never waited for its completion",
    )?;
    h.run_ok(
        "(pcifab-selftest p2p-local --len 4096 --seed 0x6 </dev/null >/tmp/second.out 2>&1 & \
         echo $! >/tmp/second.pid)",
    )?;
    let second = h.run_ok("cat /tmp/second.pid")?.trim().to_string();
    // Waiting for the channels' turn: an interruptible sleep (S), not D.
    let waited = crate::checks::wait_for(
        h,
        &format!("grep -q '^State:.*S' /proc/{second}/status"),
        20,
    )?;
    let state = proc_state(h, &second)?;
    h.run_ok(&format!("kill -9 {second}"))?;
    let gone = crate::checks::wait_for(h, &format!("[ ! -e /proc/{second} ]"), 2)?;
    if !waited {
        return Err(format!(
            "{}: the second copy never slept interruptibly behind the first (state {state})",
            h.name
        ));
    }
    Ok(gone)
}

pub fn copier_waiting_for_channels_can_be_killed(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    let h = f.hosts.first_mut().ok_or("no hosts")?;
    let r = killable_host(h, &emu, configured);
    if r.is_err() {
        let _ = emu.request("dmaep all clear");
    }
    r
}

/// What happened beside a copy stalled on h0's endpoint ([`beside_stalled_steps`]).
struct Beside {
    /// `pcifab-selftest p2p-regtime`'s line.
    regtime: Value,
    /// The stalled copy's state once the registration calls returned.
    copy_state: String,
    /// How long the endpoint's unbind took, in ms, with the copy still stalled.
    unbind_ms: u64,
    /// Whether the stalled copy was gone within 2 s of the unbind's return.
    copy_gone: bool,
}

/// Starts a copy on h0 that stalls (its timeout 20 s), times h0's REGISTER, UNREGISTER and
/// a registering file's close for h1 beside it, then unbinds h0's endpoint under it.
fn beside_stalled_steps(h0: &mut Host, bdf0: &str, hfid1: u16) -> Result<Beside, String> {
    h0.run_ok(
        "(pcifab-selftest p2p-local --len 4096 --seed 0x7 --timeout 20000 </dev/null \
         >/tmp/stalled.out 2>&1 & echo $! >/tmp/stalled.pid)",
    )?;
    let pid = h0.run_ok("cat /tmp/stalled.pid")?.trim().to_string();
    // The copy polls its completion in uninterruptible sleeps (D).
    wait_or_dmesg(
        h0,
        &format!("grep -q '^State:.*D' /proc/{pid}/status"),
        20,
        "the stalled copy never waited for its completion",
    )?;
    let regtime = selftest_json(
        h0,
        &format!("p2p-regtime --peer {hfid1:#x}"),
        Duration::from_secs(60),
    )?;
    // Still inside its copy: alive and without its one result line. Its state letter
    // alone would not do: between two polls of its completion it is briefly running.
    let copy_state = match proc_state(h0, &pid)?.as_str() {
        "gone" => "gone".to_string(),
        _ if h0.run("[ -s /tmp/stalled.out ]")?.code == 0 => "finished".to_string(),
        _ => "waiting".to_string(),
    };
    let out = h0.run_ok(&format!(
        "pcifab-selftest time -- sh -c 'echo {bdf0} > /sys/bus/pci/drivers/{DRIVER}/unbind' \
         2>&1"
    ))?;
    let unbind_ms = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v.get("us").and_then(Value::as_u64))
        .map(|us| us / 1000)
        .ok_or_else(|| format!("{}: the unbind's timing printed {out:?}", h0.name))?;
    let copy_gone = crate::checks::wait_for(h0, &format!("[ ! -e /proc/{pid} ]"), 2)?;
    Ok(Beside {
        regtime,
        copy_state,
        unbind_ms,
        copy_gone,
    })
}

/// A copy stalled on h0's endpoint holds up none of h0's registration calls for h1, and
/// unbinding the endpoint under it aborts it.
pub fn registration_beside_stalled_copy(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "this scenario needs two hosts")?;
    let ep = both_endpoints(h0, h1, configured)?;
    let (bdf0, hfid1) = (&ep.bdf[0], ep.hfid[1]);
    // The channels fetch nothing: the copy holds them until its timeout or the unbind.
    emu.request(&format!("dmaep {} stall", h0.name))?;
    let r = beside_stalled_steps(h0, bdf0, hfid1);
    emu.request(&format!("dmaep {} clear", h0.name))?;
    let rebound = h0.run_ok(&format!(
        "[ -e /sys/bus/pci/drivers/{DRIVER}/{bdf0} ] || \
         echo {bdf0} > /sys/bus/pci/drivers/{DRIVER}/bind"
    ));
    let b = r?;
    rebound?;
    wait_or_dmesg(
        h0,
        &format!("[ -e /sys/bus/pci/devices/{bdf0}/pcifab/selftest ]"),
        20,
        &format!("{bdf0}: {DRIVER} did not bind again"),
    )?;
    let num = |k: &str| b.regtime.get(k).and_then(Value::as_f64).unwrap_or(f64::MAX);
    let errno = |k: &str| b.regtime.get(k).and_then(Value::as_i64);
    let mut c = Checks::new("h0's registration calls while a copy on its endpoint is stalled");
    c.eq("REGISTER errno", Some(0), errno("register_errno"));
    c.eq("UNREGISTER errno", Some(0), errno("unregister_errno"));
    c.eq("second REGISTER errno", Some(0), errno("register2_errno"));
    c.eq("REGISTER within 1 s", true, num("register_ms") < 1000.0);
    c.eq("UNREGISTER within 1 s", true, num("unregister_ms") < 1000.0);
    c.eq(
        "close of the registering file within 1 s",
        true,
        num("close_ms") < 1000.0,
    );
    c.eq(
        "the copy, when they returned: still waiting (alive, no result yet)",
        "waiting".to_string(),
        b.copy_state.clone(),
    );
    c.eq(
        "h0's buffers in the firmware after the close",
        EmuBufs::new(),
        emu_fabric(&emu, "h0")?.1,
    );
    c.finish()?;
    let out = h0.run_ok("cat /tmp/stalled.out")?;
    let mut c = Checks::new("h0's endpoint unbound under the stalled copy");
    c.eq(
        "unbind within 10 s (not at the copy's 20 s timeout)",
        true,
        b.unbind_ms < 10_000,
    );
    c.eq("the copy gone within 2 s of the unbind", true, b.copy_gone);
    c.eq(
        "the copy's error: ENODEV",
        true,
        out.contains("ENODEV") || out.contains("No such device"),
    );
    if !out.contains("No such device") && !out.contains("ENODEV") {
        c.fail(format!("the stalled copy printed: {}", out.trim()));
    }
    c.finish()?;
    h0.log_note(&format!(
        "beside a stalled copy: REGISTER {:.1} ms, UNREGISTER {:.1} ms, close {:.1} ms; \
         unbind under it {} ms",
        num("register_ms"),
        num("unregister_ms"),
        num("close_ms"),
        b.unbind_ms
    ));
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

/// A file's bytes in hex, as the guest reads them.
fn hex_of(h: &mut Host, path: &str) -> Result<String, String> {
    Ok(h.run_ok(&format!("od -An -v -tx1 {path} | tr -d ' \\n'"))?
        .trim()
        .to_string())
}

/// The commands a user runs: `pcifab p2p receive` on h1 lends h0 a buffer and prints where
/// it is; h0's `pcifab p2p copy --to peer:...` fills it; SIGINT ends h1's wait, and the file
/// h1 saved holds exactly the bytes h0 sent (read in both guests); nothing stays registered.
pub fn cli_receive_gets_the_peers_copy(f: &mut Fabric) -> Result<(), String> {
    let r = cli_receive_steps(f);
    if r.is_err() {
        // Whatever failed, the receiver must not hold a slot for the next scenario.
        if let Some(h1) = f.hosts.get_mut(1) {
            let _ = h1.run("[ -e /tmp/rx/pid ] && kill -9 $(cat /tmp/rx/pid)");
        }
    }
    r
}

fn cli_receive_steps(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "this scenario needs two hosts")?;
    let [hfid0, hfid1] = both_endpoints(h0, h1, configured)?.hfid;
    h1.run_ok(&format!(
        "rm -rf /tmp/rx && mkdir -p /tmp/rx && (pcifab --json p2p receive --from {hfid0:#06x} \
         --len 4k --out /tmp/rx/data --wait 120 </dev/null >/tmp/rx/out 2>/tmp/rx/err & \
         echo $! >/tmp/rx/pid)"
    ))?;
    wait_or_dmesg(
        h1,
        "( grep -q registered /tmp/rx/out || [ ! -e /proc/$(cat /tmp/rx/pid) ] )",
        30,
        "`pcifab p2p receive` did not lend its buffer",
    )?;
    let out = h1.run_ok("cat /tmp/rx/out /tmp/rx/err")?;
    let reg = phase_line(&out, "registered")
        .ok_or_else(|| format!("{}: `pcifab p2p receive` printed: {}", h1.name, out.trim()))?;
    let slot = reg.get("slot").and_then(Value::as_u64).unwrap_or(u64::MAX);
    let mut c = Checks::new("`pcifab p2p receive` on h1 lends h0 a buffer");
    c.eq(
        "its hfid",
        Some(format!("{hfid1:#06x}")),
        reg.get("hfid").and_then(Value::as_str).map(str::to_string),
    );
    c.eq(
        "its peer",
        Some(format!("{hfid0:#06x}")),
        reg.get("peer").and_then(Value::as_str).map(str::to_string),
    );
    c.eq(
        "h1's buffers in the firmware",
        vec![("h0".to_string(), slot, PEER_LEN)],
        emu_fabric(&emu, "h1")?.1,
    );
    c.finish()?;

    h0.run_ok("head -c 4096 /dev/urandom >/tmp/tx")?;
    let sent = hex_of(h0, "/tmp/tx")?;
    let (code, v, cout) = pcifab_cmd(
        h0,
        &format!("p2p copy --from file:/tmp/tx --to peer:{hfid1:#06x}:{slot}:0 --len 4k"),
    )?;
    if code != 0 {
        return Err(format!(
            "h0: `pcifab p2p copy --to peer:` exited {code}: {}",
            cout.trim()
        ));
    }
    h1.run_ok("kill -INT $(cat /tmp/rx/pid)")?;
    wait_or_dmesg(
        h1,
        "[ ! -e /proc/$(cat /tmp/rx/pid) ]",
        30,
        "`pcifab p2p receive` did not end on SIGINT",
    )?;
    let out = h1.run_ok("cat /tmp/rx/out /tmp/rx/err")?;
    let saved = phase_line(&out, "saved")
        .ok_or_else(|| format!("{}: `pcifab p2p receive` printed: {}", h1.name, out.trim()))?;
    let got = hex_of(h1, "/tmp/rx/data")?;
    let mut c = Checks::new("h1 saved what h0 copied, and lent nothing more");
    c.eq(
        "h0's copy: bytes",
        Some(4096),
        v.get("bytes").and_then(Value::as_u64),
    );
    c.eq(
        "the wait ended by",
        Some("SIGINT"),
        saved.get("ended_by").and_then(Value::as_str),
    );
    c.eq("bytes saved (hex digits / 2)", 4096, got.len() / 2);
    if got != sent {
        c.fail(format!(
            "h1's file differs from h0's: first 32 hex digits {} vs {}",
            got.get(..32).unwrap_or(&got),
            sent.get(..32).unwrap_or(&sent)
        ));
    }
    c.eq(
        "h1's buffers in the firmware",
        EmuBufs::new(),
        emu_fabric(&emu, "h1")?.1,
    );
    c.finish()?;
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

/// errnos of the fabric-mode calls (`uapi.rst`, REGISTER, UNREGISTER and `PCIFAB_P2P_PEER`).
const EIO: i64 = 5;
const ENOSPC: i64 = 28;
const EOPNOTSUPP: i64 = 95;
const EREMOTEIO: i64 = 121;
const ETIMEDOUT: i64 = 110;
/// The seed of the endpoints' hostile mode (printed, so a failure can be replayed).
const LYING_SEED: u64 = 0x1a5e_ed01;
/// Rounds under hostile firmware: on h1 a REGISTER, its UNREGISTER, a second REGISTER and
/// the close (`p2p-regtime`); on h0 a 4 KiB copy into h1's buffer.
const LYING_ROUNDS: usize = 12;
/// A copy's timeout under hostile firmware: a completion written with the wrong phase is
/// never seen, and the copy ends at it.
const LYING_COPY_TIMEOUT_MS: u64 = 1000;

/// What hostile mode falsified on `host` so far, as the emulator counts it: (command outputs
/// and events, completions).
fn emu_lies(emu: &EmuControl, host: &str) -> Result<(u64, u64), String> {
    let v = emu.request(&format!("dmaep {host} stats"))?;
    let fab = v.pointer("/fabric/lies").and_then(Value::as_u64);
    let ces = v.get("completion_lies").and_then(Value::as_u64);
    match (fab, ces) {
        (Some(f), Some(c)) => Ok((f, c)),
        _ => Err(format!(
            "emulator `dmaep {host} stats`: no fabric.lies or completion_lies in {v}"
        )),
    }
}

/// The `{"test":NAME,...}` lines of `out`.
fn test_lines(out: &str, name: &str) -> Vec<Value> {
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("test").and_then(Value::as_str) == Some(name))
        .collect()
}

/// `pcifab --json p2p receive` on `h` for `peer`, waiting 1 s (`--wait 1`): (exit code,
/// errno of the error, if one).
fn cli_receive(h: &mut Host, peer: u16) -> Result<(i64, Option<i64>), String> {
    let (code, v, _) = pcifab_cmd(
        h,
        &format!("p2p receive --from {peer:#06x} --len 4k --out /tmp/lying.rx --wait 1"),
    )?;
    Ok((code, v.pointer("/error/errno").and_then(Value::as_i64)))
}

/// Unbinds `h`'s endpoint and binds it again; waits for its `hfid` file.
fn rebind_endpoint(h: &mut Host, bdf: &str) -> Result<(), String> {
    h.run_ok(&format!(
        "echo {bdf} > /sys/bus/pci/drivers/{DRIVER}/unbind && \
         echo {bdf} > /sys/bus/pci/drivers/{DRIVER}/bind"
    ))?;
    wait_or_dmesg(
        h,
        &format!("[ -e /sys/bus/pci/devices/{bdf}/pcifab/hfid ]"),
        20,
        &format!("{bdf}: {DRIVER} did not bind again"),
    )
}

/// Fabric mode under lying firmware ([`fabric_commands_under_lying_firmware`]).
fn lying_steps(
    h0: &mut Host,
    h1: &mut Host,
    emu: &EmuControl,
    ep: &Endpoints,
) -> Result<(), String> {
    let [hfid0, hfid1] = ep.hfid;
    let pinned = [pinned_pages(h0)?, pinned_pages(h1)?];
    // h1 lends h0 a buffer while the firmware is honest: the target of h0's copies.
    let (slot, _) = start_hold(h1, hfid0, "/tmp/lying-hold")?;
    let lies_before = [emu_lies(emu, "h0")?, emu_lies(emu, "h1")?];

    crate::say(&format!(
        "# dma endpoint: hostile firmware seed {LYING_SEED:#x}"
    ));
    emu.request(&format!("dmaep all hostile {LYING_SEED:#x}"))?;
    let regs = h1.run_timeout(
        &format!(
            "for i in $(seq {LYING_ROUNDS}); do pcifab-selftest p2p-regtime --peer {hfid0:#x}; \
             done 2>&1"
        ),
        Duration::from_secs(60),
    )?;
    let copies = h0.run_timeout(
        &format!(
            "for i in $(seq {LYING_ROUNDS}); do pcifab-selftest p2p-peer --hfid {hfid1:#x} \
             --slot {slot} --off 0 --len {PEER_LEN} --seed 0x9 --timeout \
             {LYING_COPY_TIMEOUT_MS}; done 2>&1"
        ),
        Duration::from_secs(60),
    )?;
    let cli = [cli_receive(h1, hfid0)?, cli_receive(h1, hfid0)?];
    emu.request("dmaep all clear")?;
    let lies_after = [emu_lies(emu, "h0")?, emu_lies(emu, "h1")?];

    let regs = test_lines(&regs.out, "p2p-regtime");
    let copies = test_lines(&copies.out, "p2p-peer");
    let mut c = Checks::new("fabric-mode calls under hostile firmware: documented errors only");
    c.eq("p2p-regtime rounds on h1", LYING_ROUNDS, regs.len());
    c.eq("p2p-peer copies on h0", LYING_ROUNDS, copies.len());
    let errno = |v: &Value, k: &str| v.get(k).and_then(Value::as_i64).unwrap_or(i64::MIN);
    let mut failed = [0usize; 2];
    for (i, v) in regs.iter().enumerate() {
        for (k, allowed) in [
            ("register_errno", &[0, EIO, ENOSPC][..]),
            // -1: not tried, the REGISTER failed.
            ("unregister_errno", &[-1, 0, EIO, ENOENT][..]),
            ("register2_errno", &[0, EIO, ENOSPC][..]),
        ] {
            let e = errno(v, k);
            if !allowed.contains(&e) {
                c.fail(format!(
                    "h1 round {i}: {k} {e}, not one of {allowed:?}: {v}"
                ));
            }
            if e > 0 {
                failed[1] += 1;
            }
        }
    }
    for (i, v) in copies.iter().enumerate() {
        let e = errno(v, "errno");
        let done = v.get("done").and_then(Value::as_u64).unwrap_or(u64::MAX);
        let allowed = [0, ENOENT, EFAULT, EIO, EREMOTEIO, ETIMEDOUT, EOPNOTSUPP];
        if !allowed.contains(&e) {
            c.fail(format!(
                "h0 copy {i}: errno {e}, not one of {allowed:?}: {v}"
            ));
        }
        // Success only with every byte done; a failure with fewer.
        if (e == 0) != (done == PEER_LEN) || done > PEER_LEN {
            c.fail(format!(
                "h0 copy {i}: errno {e} with {done} of {PEER_LEN} bytes: {v}"
            ));
        }
        if e != 0 {
            failed[0] += 1;
        }
    }
    for (i, (code, e)) in cli.iter().enumerate() {
        let ok = matches!(
            (code, e),
            (0, None) | (1, Some(EIO)) | (3, Some(ENOSPC)) | (3, Some(ENOENT))
        );
        if !ok {
            c.fail(format!(
                "h1 `pcifab p2p receive --wait 1` {i}: exit {code}, errno {e:?}: not success, \
                 EIO (exit 1), ENOSPC or ENOENT (exit 3)"
            ));
        }
        if *code != 0 {
            failed[1] += 1;
        }
    }
    let told = |h: usize| {
        let (b, a) = (lies_before[h], lies_after[h]);
        (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1))
    };
    let (t0, t1) = (told(0), told(1));
    c.eq(
        "h1's firmware falsified command outputs (emulator's count > 0)",
        true,
        t1.0 > 0,
    );
    c.eq(
        "h0's endpoint falsified command outputs or completions (emulator's count > 0)",
        true,
        t0.0 + t0.1 > 0,
    );
    c.eq("h1's calls that failed > 0", true, failed[1] > 0);
    c.eq("h0's copies that failed > 0", true, failed[0] > 0);
    c.finish()?;
    h1.log_note(&format!(
        "hostile firmware (seed {LYING_SEED:#x}): h1 {} outputs falsified, {} of its calls \
         failed; h0 {} outputs and {} completions falsified, {} of its {LYING_ROUNDS} copies \
         failed",
        t1.0, failed[1], t0.0, t0.1, failed[0]
    ));

    // The lent buffer goes with its process (honest firmware again).
    h1.run_ok("kill -9 $(cat /tmp/lying-hold/pid)")?;
    wait_or_dmesg(
        h1,
        "[ ! -e /proc/$(cat /tmp/lying-hold/pid) ]",
        30,
        "p2p-hold did not die",
    )?;

    // Commands that never complete.
    emu.request("dmaep all cmd-hang")?;
    let hang_rx = [cli_receive(h1, hfid0)?, cli_receive(h1, hfid0)?];
    let hang_copy = [
        peer_copy(h0, hfid1, slot, (0, 64, 0x9))?,
        peer_copy(h0, hfid1, slot, (0, 64, 0x9))?,
    ];
    let held = pinned_pages(h1)?;
    emu.request("dmaep all clear")?;
    let after_clear = cli_receive(h1, hfid0)?;
    let mut c = Checks::new("fabric-mode calls when the firmware never answers");
    c.eq(
        "h1 `pcifab p2p receive`: (exit, errno), then again",
        [(1, Some(ETIMEDOUT)), (1, Some(EIO))],
        hang_rx,
    );
    c.eq(
        "h0's copy into h1's slot: (errno, done), then again",
        [(ETIMEDOUT, 0), (EIO, 0)],
        hang_copy,
    );
    c.eq(
        "h1: the unanswered buffer's page still pinned after its process ended",
        true,
        held > pinned[1],
    );
    c.eq(
        "h1 `pcifab p2p receive` once the fault is cleared (the path stays closed until \
         the endpoint is bound again): (exit, errno)",
        (1, Some(EIO)),
        after_clear,
    );
    c.finish()?;

    // Bound again, honest: the endpoints work, and every page comes back.
    rebind_endpoint(h1, &ep.bdf[1])?;
    rebind_endpoint(h0, &ep.bdf[0])?;
    let (slot, _) = start_hold(h1, hfid0, "/tmp/lying-hold2")?;
    let copied = peer_copy(h0, hfid1, slot, COPY_IN)?;
    let (off, len, seed) = COPY_IN;
    h1.run_ok(&format!(
        "echo '{off} {len} {seed:#x}' >/tmp/lying-hold2/check.part && \
         mv /tmp/lying-hold2/check.part /tmp/lying-hold2/check"
    ))?;
    wait_or_dmesg(
        h1,
        "( grep -q unregistered /tmp/lying-hold2/out || \
         [ ! -e /proc/$(cat /tmp/lying-hold2/pid) ] )",
        30,
        "p2p-hold did not check and unregister",
    )?;
    let out = h1.run_ok("cat /tmp/lying-hold2/out; touch /tmp/lying-hold2/end")?;
    wait_or_dmesg(
        h1,
        "[ ! -e /proc/$(cat /tmp/lying-hold2/pid) ]",
        30,
        "p2p-hold did not exit",
    )?;
    let field = |phase: &str, k: &str| phase_line(&out, phase).and_then(|v| v.get(k).cloned());
    let mut c = Checks::new("after the faults, both endpoints bound again");
    c.eq(
        "h0's copy into h1's buffer: (errno, done)",
        (0, len),
        copied,
    );
    c.eq(
        "h1 finds h0's bytes in its buffer",
        Some(Value::Bool(true)),
        field("checked", "ok"),
    );
    c.eq(
        "h1's UNREGISTER errno",
        Some(Value::from(0)),
        field("unregistered", "errno"),
    );
    c.eq(
        "h1's buffers in the firmware",
        EmuBufs::new(),
        emu_fabric(emu, "h1")?.1,
    );
    c.eq("h0: pages pinned, as before", pinned[0], pinned_pages(h0)?);
    c.eq("h1: pages pinned, as before", pinned[1], pinned_pages(h1)?);
    c.finish()?;
    dmesg_clean(h0)?;
    dmesg_clean(h1)
}

/// The fabric-mode calls under the emulator's `hostile` and `cmd-hang` faults of both
/// endpoints: each call fails with a documented error or succeeds whole, the emulator did
/// lie, the endpoints work again once bound again, and no page stays pinned.
pub fn fabric_commands_under_lying_firmware(f: &mut Fabric) -> Result<(), String> {
    let configured = configured(f)?;
    let emu = f.emu();
    let (h0, h1) = two_hosts(&mut f.hosts, "this scenario needs two hosts")?;
    let ep = both_endpoints(h0, h1, configured)?;
    let r = lying_steps(h0, h1, &emu, &ep);
    if r.is_err() {
        let _ = emu.request("dmaep all clear");
        for d in ["/tmp/lying-hold", "/tmp/lying-hold2"] {
            let _ = h1.run(&format!("[ -e {d}/pid ] && kill -9 $(cat {d}/pid)"));
        }
        // The next scenario finds both endpoints bound, with a working command path.
        let _ = rebind_endpoint(h0, &ep.bdf[0]);
        let _ = rebind_endpoint(h1, &ep.bdf[1]);
    }
    r
}
