// SPDX-License-Identifier: GPL-2.0-only
//! NVMe drives on the fabric (tools/pcifab-harness/fabric-nvme.toml): QEMU's own `nvme`
//! device, hot-added by the emulator with the drive's image, taken by Linux's nvme driver in
//! the guest. The scenarios prove that the host's standard driver uses the composed drive,
//! that its data follows it from host to host, that taking it away with I/O in flight fails
//! the writer instead of hanging it and keeps every acknowledged write, and that a mounted
//! file system stops `pcifab unbind`/`move` unless forced.
//!
//! Block contents are `pcifab-selftest blk-*` patterns (seeded, checksummed per 4 KiB
//! block); the drive's image is also checked from outside, on this machine, with the same
//! tool (`blk-verify --buffered` on the image file).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::{
    begin, check_bindings, drive, free_all, owners, pcifab_cmd, pcifab_ok, selftest_ok, Owners,
};
use crate::fabric::{Fabric, Host};

/// Moves of the drive in the round-trip scenario (h0 -> h1 -> h0 is one round trip): 10
/// with `--soak` (`make soak`), 2 in `make test`.
fn round_trips() -> u32 {
    if crate::soak() {
        10
    } else {
        2
    }
}
/// Longest wait for the writer to end once its drive is gone.
const WRITER_END: Duration = Duration::from_secs(90);
/// Blocks the streaming writer must have completed before its drive is taken away.
const STREAM_BEFORE: u64 = 256;
const CMD: Duration = Duration::from_secs(180);

/// The drive's image file, as the emulator's state names it.
fn image(f: &Fabric, pdfid: u16) -> Result<PathBuf, String> {
    let v = f.emu().request("state")?;
    v.get("functions")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .find(|b| b.get("pdfid").and_then(Value::as_u64) == Some(u64::from(pdfid)))
        })
        .and_then(|b| b.get("image"))
        .and_then(Value::as_str)
        .map(|p| f.run_dir.join(p))
        .ok_or_else(|| format!("emulator state names no image for {pdfid:#06x}: {v}"))
}

/// Every host clean and the drive free (unbound through the emulator, as the manager).
fn nvme_begin(f: &mut Fabric) -> Result<(u16, String), String> {
    let d = drive(f)?;
    f.each_host(|h, _| begin(h))?;
    let emu = f.emu();
    let e = f.expected.clone();
    free_all(&emu, &e, "setting up (the drive free)")?;
    check_bindings(f, &Owners::new(), "setup (the drive free)")?;
    Ok(d)
}

/// The one block device the CLI reported for a bind or move onto `h`.
pub(super) fn reported_block_device(h: &Host, what: &str, v: &Value) -> Result<String, String> {
    let devs: Vec<&str> = v
        .get("block_devices")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match devs.as_slice() {
        [one] if one.starts_with("/dev/nvme") => Ok(one.to_string()),
        _ => Err(format!(
            "{}: `pcifab {what}`: expected block_devices with one /dev/nvme* device, got {v}",
            h.name
        )),
    }
}

/// `pcifab bind` or `move` of the drive onto `h`, run in `h`; returns the block device and
/// the time from the command to the first block read through it.
fn take(h: &mut Host, verb: &str, pdfid: u16) -> Result<(String, f64), String> {
    let t = Instant::now();
    let what = format!("{verb} {pdfid:#06x} --host {}", h.index);
    let v = pcifab_ok(h, &what)?;
    let dev = reported_block_device(h, &what, &v)?;
    h.run_ok_timeout(
        &format!("dd if={dev} of=/dev/null bs=4096 count=1 2>&1"),
        CMD,
    )
    .map_err(|e| {
        format!(
            "{}: the drive is not readable after `pcifab {what}`: {e}",
            h.name
        )
    })?;
    let secs = t.elapsed().as_secs_f64();
    h.log_note(&format!("{what}: {dev} readable after {secs:.2} s"));
    Ok((dev, secs))
}

/// `pcifab-selftest blk-verify` of the drive's image file on this machine.
fn verify_image(f: &Fabric, image: &PathBuf, args: &str) -> Result<Value, String> {
    let tool = f.guest_bin.join("pcifab-selftest");
    let mut cmd = Command::new(&tool);
    cmd.arg("blk-verify")
        .arg("--dev")
        .arg(image)
        .arg("--buffered")
        .args(args.split_whitespace());
    let o = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", tool.display()))?;
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        return Err(format!(
            "the image {} after the drive left: {}{}",
            image.display(),
            out.trim(),
            err.trim()
        ));
    }
    serde_json::from_str(out.trim())
        .map_err(|e| format!("blk-verify of {} printed {out:?}: {e}", image.display()))
}

pub fn data_follows(f: &mut Fabric) -> Result<(), String> {
    let (pdfid, _) = nvme_begin(f)?;
    let (dev, first) = take(&mut f.hosts[0], "bind", pdfid)?;
    let mut seed = 0x5eed_0000u64;
    let w = selftest_ok(
        &mut f.hosts[0],
        &format!("blk-write --dev {dev} --seed {seed}"),
        CMD,
    )?;
    let blocks = w.get("blocks").and_then(Value::as_u64).unwrap_or(0);
    check_bindings(f, &owners(&[(pdfid, 0)]), "bind to h0")?;
    let mut takes = vec![first];
    for trip in 0..round_trips() {
        for to in [1usize, 0] {
            // The host that wants the drive asks for it (a move requested by the new
            // holder); the old holder's kernel gives it up through pciehp.
            let (dev, secs) = take(&mut f.hosts[to], "move", pdfid)?;
            takes.push(secs);
            let step = format!("round trip {}: move to h{to}", trip + 1);
            let h = &mut f.hosts[to];
            let v = selftest_ok(h, &format!("blk-verify --dev {dev} --seed {seed}"), CMD)
                .map_err(|e| format!("{step}: {e}"))?;
            if v.get("good").and_then(Value::as_u64) != Some(blocks) {
                return Err(format!("{step}: expected {blocks} good blocks, got {v}"));
            }
            seed += 1;
            selftest_ok(h, &format!("blk-write --dev {dev} --seed {seed}"), CMD)
                .map_err(|e| format!("{step}: {e}"))?;
            check_bindings(f, &owners(&[(pdfid, to)]), &step)?;
        }
    }
    takes.sort_by(f64::total_cmp);
    let p50 = takes[takes.len() / 2];
    let max = takes.last().copied().unwrap_or(0.0);
    crate::say(&format!(
        "# nvme: {} takes of the drive ({blocks} blocks each way verified): bind/move to \
         a readable /dev/nvme* p50 {p50:.2} s, max {max:.2} s",
        takes.len()
    ));
    Ok(())
}

/// Starts the streaming writer in `h` on `dev` and waits until it has completed
/// [`STREAM_BEFORE`] blocks.
fn start_writer(h: &mut Host, dev: &str, seed: u64) -> Result<(), String> {
    h.run_ok(&format!(
        "rm -f /tmp/ack /tmp/stream.out; pcifab-selftest blk-stream --dev {dev} --seed {seed} \
         --ack /tmp/ack >/tmp/stream.out 2>&1 & echo $! >/tmp/stream.pid"
    ))?;
    let t = Instant::now();
    loop {
        let a = h.run("cat /tmp/ack 2>/dev/null")?.out;
        if a.trim().parse::<u64>().is_ok_and(|n| n >= STREAM_BEFORE) {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(60) {
            let out = h.run("cat /tmp/stream.out")?.out;
            return Err(format!(
                "{}: the writer completed fewer than {STREAM_BEFORE} blocks in 60 s (ack {:?}); its output: {}",
                h.name,
                a.trim(),
                out.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for the writer to end after its drive went away; returns the blocks it had
/// completed, after checking that it ended with an error.
fn writer_result(h: &mut Host) -> Result<u64, String> {
    let t = Instant::now();
    while h.run("kill -0 $(cat /tmp/stream.pid) 2>/dev/null")?.code == 0 {
        if t.elapsed() > WRITER_END {
            let st = h
                .run("p=$(cat /tmp/stream.pid); cat /proc/$p/wchan; echo; cat /proc/$p/stack")?
                .out;
            return Err(format!(
                "{}: the writer still runs {} s after its drive was taken away (hung?): {}",
                h.name,
                WRITER_END.as_secs(),
                st.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = h.run("cat /tmp/stream.out")?.out;
    let line = out.lines().find(|l| l.starts_with('{')).unwrap_or("");
    let v: Value = serde_json::from_str(line)
        .map_err(|_| format!("{}: the writer printed no result: {}", h.name, out.trim()))?;
    let err = v.get("error").and_then(Value::as_str).unwrap_or("");
    if err.is_empty() {
        return Err(format!(
            "{}: the writer ended without an error: {v}",
            h.name
        ));
    }
    h.log_note(&format!("writer ended: {v}"));
    let acked = v.get("acked_blocks").and_then(Value::as_u64).unwrap_or(0);
    crate::say(&format!(
        "# nvme: {}: the writer ended with {err} after {acked} completed blocks (failing write took {} ms)",
        h.name,
        v.get("failed_write_ms").and_then(Value::as_u64).unwrap_or(0)
    ));
    Ok(acked)
}

const OLD: u64 = 0x01d0_0000;
const NEW: u64 = 0x0e30_0000;

pub fn unbind_in_flight(f: &mut Fabric) -> Result<(), String> {
    let (pdfid, _) = nvme_begin(f)?;
    let img = image(f, pdfid)?;
    let h0 = &mut f.hosts[0];
    let (dev, _) = take(h0, "bind", pdfid)?;
    selftest_ok(h0, &format!("blk-write --dev {dev} --seed {OLD}"), CMD)?;
    start_writer(h0, &dev, NEW)?;
    pcifab_ok(h0, &format!("unbind {pdfid:#06x}"))?;
    let acked = writer_result(h0)?;
    check_bindings(f, &Owners::new(), "unbind with the writer running")?;
    let v = verify_image(
        f,
        &img,
        &format!("--seed {NEW} --acked {acked} --old {OLD}"),
    )?;
    f.hosts[0].log_note(&format!("image after unbind: {v}"));
    Ok(())
}

pub fn move_in_flight(f: &mut Fabric) -> Result<(), String> {
    let (pdfid, _) = nvme_begin(f)?;
    let (dev, _) = take(&mut f.hosts[0], "bind", pdfid)?;
    selftest_ok(
        &mut f.hosts[0],
        &format!("blk-write --dev {dev} --seed {OLD}"),
        CMD,
    )?;
    start_writer(&mut f.hosts[0], &dev, NEW)?;
    let (dev1, _) = take(&mut f.hosts[1], "move", pdfid)?;
    let acked = writer_result(&mut f.hosts[0])?;
    check_bindings(
        f,
        &owners(&[(pdfid, 1)]),
        "move to h1 with h0's writer running",
    )?;
    let v = selftest_ok(
        &mut f.hosts[1],
        &format!("blk-verify --dev {dev1} --seed {NEW} --acked {acked} --old {OLD}"),
        CMD,
    )?;
    f.hosts[1].log_note(&format!("drive on h1 after the move: {v}"));
    Ok(())
}

pub fn mounted_refused(f: &mut Fabric) -> Result<(), String> {
    let (pdfid, _) = nvme_begin(f)?;
    let img = image(f, pdfid)?;
    // The file system is made from outside while no QEMU has the image open.
    let o = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "nodiscard"])
        .arg(&img)
        .output()
        .map_err(|e| format!("cannot run mkfs.ext4 (e2fsprogs): {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "mkfs.ext4 {}: {}",
            img.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let h0 = &mut f.hosts[0];
    let (dev, _) = take(h0, "bind", pdfid)?;
    h0.run_ok(&format!(
        "mkdir -p /mnt/ssd && mount -t ext4 {dev} /mnt/ssd && echo kept >/mnt/ssd/file && sync"
    ))?;
    for what in [
        format!("unbind {pdfid:#06x}"),
        format!("move {pdfid:#06x} --host 1"),
    ] {
        let (code, v, out) = pcifab_cmd(h0, &what)?;
        let msg = v["error"]["message"].as_str().unwrap_or("");
        if code == 0
            || v["error"]["code"] != "busy"
            || v["error"]["errno"] != 16
            || !msg.contains("/mnt/ssd")
        {
            return Err(format!(
                "h0: `pcifab {what}` with {dev} mounted on /mnt/ssd: expected a non-zero exit \
                 with error code \"busy\", errno 16 and a message naming /mnt/ssd, got exit \
                 {code}: {}",
                out.trim()
            ));
        }
    }
    check_bindings(f, &owners(&[(pdfid, 0)]), "refused unbind and move")?;
    let h0 = &mut f.hosts[0];
    if h0.run("cat /mnt/ssd/file")?.out.trim() != "kept" {
        return Err("h0: /mnt/ssd/file lost after the refused unbind".into());
    }
    pcifab_ok(h0, &format!("unbind {pdfid:#06x} --force"))?;
    // The file system has lost its device: reads that miss the page cache fail.
    let r = h0.run("echo 3 >/proc/sys/vm/drop_caches; cat /mnt/ssd/file")?;
    if r.code == 0 {
        return Err(format!(
            "h0: reading /mnt/ssd/file after the forced unbind: expected an I/O error, got {:?}",
            r.out.trim()
        ));
    }
    h0.log_note(&format!("read after forced unbind: {}", r.out.trim()));
    h0.run_ok("umount /mnt/ssd || umount -l /mnt/ssd")?;
    // What the file system said about losing its device stays in the log; kernel splats
    // fail the scenario through the console check.
    let fs = h0.run("dmesg -c | grep -ciE 'ext4|I/O error'")?.out;
    h0.log_note(&format!(
        "{} file-system lines after the forced unbind",
        fs.trim()
    ));
    check_bindings(f, &Owners::new(), "forced unbind")
}
