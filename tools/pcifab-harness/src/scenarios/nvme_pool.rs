// SPDX-License-Identifier: GPL-2.0-only
//! The fabric manager sharing an NVMe drive (tools/pcifab-harness/fabric-nvme.toml): the
//! daemon runs in h0 with `--executor driver` and a pool of the one drive; requests for
//! the drive queue while another host holds it, a release hands it over, and its data
//! follows it, unless the pool scrubs it (`scrub = true`), in which case the next holder
//! reads zeros. Everything is checked inside the guests (Linux's nvme driver, the block
//! device, its contents) and in the emulator (who holds the drive).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::checks::{
    ask, check_bindings, compose_begin, drive, json_line, manager_log, owners, run_with_manager,
    selftest_ok, Owners,
};
use crate::fabric::{Fabric, Host};

/// Seeds of the block patterns the holders write.
const SEED_A: u64 = 0x0a5e_ed00;
const SEED_B: u64 = 0x0b5e_ed00;
/// Longest wait for the drive to reach a host, its block device to appear, a scrub.
const HANDOVER: Duration = Duration::from_secs(120);
const CMD: Duration = Duration::from_secs(180);

/// The manager's configuration: two tenants, one whole pool of the drive, telemetry every
/// second (on PAX: the die temperature and the drive's link).
fn config_text(f: &Fabric, pf: u16, scrub: bool) -> String {
    format!(
        "[manager]\nhosts = {}\naging_s = 1000\ndefault_lease_s = 600\nmax_lease_s = 3600\n\n\
         [[manager.tenants]]\nname = \"a\"\n\n[[manager.tenants]]\nname = \"b\"\n\n\
         [failover]\nhost_timeout_s = 0\n\n\
         [telemetry]\ninterval_s = 1\nmax_temp_c = 90.0\nbad_samples = 2\n\n\
         [[pools]]\nname = \"drives\"\nmode = \"whole\"\nscrub = {scrub}\n\n\
         [[pools.devices]]\npf = {pf:#06x}\n",
        f.expected.hosts.len()
    )
}

/// A request for the drive for `host` as `tenant`: (id, granted).
fn request(h0: &mut Host, host: usize, tenant: &str) -> Result<(u64, bool), String> {
    let v = ask(
        h0,
        &format!(
            "{{\"op\":\"request\",\"spec\":{{\"host\":{host},\"want\":{{\"kind\":\"gpus\",\
             \"count\":1}},\"priority\":1,\"duration_s\":600,\"pool\":\"drives\",\
             \"tenant\":\"{tenant}\"}}}}"
        ),
    )?;
    let id = v["id"]
        .as_u64()
        .ok_or_else(|| format!("request for h{host}: no id in {v}"))?;
    Ok((id, v["granted"] == Value::Bool(true)))
}

/// `pcifab release ID` through the CLI.
fn release(h0: &mut Host, id: u64) -> Result<(), String> {
    let out = h0.run(&format!("pcifab release {id} --json"))?;
    let v = json_line(&out.out)?;
    if out.code != 0 || v.get("ok") != Some(&Value::Bool(true)) {
        return Err(format!(
            "h0: `pcifab release {id}`: expected exit 0 and ok, got exit {}: {}",
            out.code,
            out.out.trim()
        ));
    }
    Ok(())
}

/// The ids of the daemon's leases and of its queue.
fn leases_and_queue(h0: &mut Host) -> Result<(Vec<u64>, Vec<u64>), String> {
    let ids = |v: &Value, k: &str| -> Vec<u64> {
        v[k].as_array()
            .map(|a| a.iter().filter_map(|x| x["id"].as_u64()).collect())
            .unwrap_or_default()
    };
    let l = ask(h0, "{\"op\":\"leases\"}")?;
    let q = ask(h0, "{\"op\":\"queue\"}")?;
    Ok((ids(&l, "leases"), ids(&q, "queue")))
}

/// Waits until request `id` holds a lease.
fn wait_granted(h0: &mut Host, id: u64, what: &str) -> Result<Duration, String> {
    let t = Instant::now();
    loop {
        let (leases, queue) = leases_and_queue(h0)?;
        if leases.contains(&id) {
            return Ok(t.elapsed());
        }
        if t.elapsed() > HANDOVER {
            return Err(format!(
                "{what}: request {id} not granted within {} s (leases {leases:?}, queue {queue:?})",
                HANDOVER.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Waits until the emulator's bindings are `want`.
fn wait_owners(f: &Fabric, want: &Owners, what: &str) -> Result<(), String> {
    crate::checks::wait_owners(f, want, HANDOVER.as_secs(), what).map(|_| ())
}

/// Waits for the drive's namespace to appear in `h` (the manager binds without waiting
/// for the host) and checks it is readable; returns its node.
fn wait_block_device(h: &mut Host, what: &str) -> Result<String, String> {
    let secs = HANDOVER.as_secs();
    let out = h
        .run_ok_timeout(
            &format!(
                "i=0\n\
                 while :; do\n\
                   d=$(ls /dev/nvme*n1 2>/dev/null | head -1)\n\
                   [ -n \"$d\" ] && break\n\
                   [ $i -ge {} ] && {{ echo \"no /dev/nvme*n1 within {secs} s\"; ls /dev; exit 1; }}\n\
                   sleep 0.1; i=$((i+1))\n\
                 done\n\
                 dd if=$d of=/dev/null bs=4096 count=1 2>/dev/null || {{ echo \"$d is not readable\"; exit 1; }}\n\
                 echo $d",
                secs * 10
            ),
            CMD,
        )
        .map_err(|e| format!("{}: {what}: {e}", h.name))?;
    let dev = out.lines().last().unwrap_or("").trim().to_string();
    if !dev.starts_with("/dev/nvme") {
        return Err(format!("{}: {what}: no block device: {out}", h.name));
    }
    h.log_note(&format!("{what}: {dev}"));
    Ok(dev)
}

/// Writes pattern `seed` over the whole drive in `h`; returns the blocks written.
fn write_all(h: &mut Host, dev: &str, seed: u64) -> Result<u64, String> {
    let w = selftest_ok(h, &format!("blk-write --dev {dev} --seed {seed}"), CMD)?;
    w["blocks"]
        .as_u64()
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("{}: blk-write wrote no blocks: {w}", h.name))
}

/// Checks every block of the drive in `h` is `pattern` (`--seed S` or `--zero`).
fn verify_all(h: &mut Host, dev: &str, pattern: &str, blocks: u64) -> Result<(), String> {
    let v = selftest_ok(h, &format!("blk-verify --dev {dev} {pattern}"), CMD)?;
    if v["good"].as_u64() != Some(blocks) || v["bad"].as_u64() != Some(0) {
        return Err(format!(
            "{}: blk-verify {pattern}: expected {blocks} good blocks, got {v}",
            h.name
        ));
    }
    Ok(())
}

/// No nvme block device left in `h` (the drive went away from it).
fn no_drive(h: &mut Host, what: &str) -> Result<(), String> {
    let out = h.run("ls /dev/nvme*n1 2>/dev/null")?.out;
    if !out.trim().is_empty() {
        return Err(format!(
            "{}: {what}: the drive is gone from this host, yet it shows {}",
            h.name,
            out.trim()
        ));
    }
    Ok(())
}

/// The pool's one device as the `pool` reply shows it, and the reply.
fn pool(h0: &mut Host) -> Result<(Value, Value), String> {
    let v = ask(h0, "{\"op\":\"pool\"}")?;
    Ok((v["devices"][0].clone(), v))
}

/// Runs `body` with a fresh daemon in h0, from the drive free; afterwards stops the daemon
/// and frees the drive; the body's error comes first.
fn with_pool(
    f: &mut Fabric,
    scrub: bool,
    body: impl FnOnce(&mut Fabric, u16) -> Result<(), String>,
) -> Result<(), String> {
    let (pf, _) = drive(f)?;
    compose_begin(f)?;
    check_bindings(f, &Owners::new(), "setup (the drive free)")?;
    let cfg = config_text(f, pf, scrub);
    run_with_manager(f, &cfg, 20, "the drive free", |f| body(f, pf))?;
    check_bindings(
        f,
        &Owners::new(),
        "the end (daemon stopped, the drive free)",
    )
}

/// Telemetry reads the drive and keeps it in the pool (on PAX: die temperature and link).
fn healthy_with_telemetry(h0: &mut Host, pf: u16) -> Result<(), String> {
    let t = ask(h0, "{\"op\":\"telemetry\"}")?;
    let pfx = u64::from(pf);
    let sample = t["samples"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["pdfid"].as_u64() == Some(pfx)))
        .cloned()
        .ok_or_else(|| format!("telemetry: no sample of {pf:#06x}: {t}"))?;
    if sample.get("error").is_some() || sample["health"].as_u64() != Some(0) {
        return Err(format!(
            "telemetry of the drive: expected a clean sample, got {sample}"
        ));
    }
    let (dev, _) = pool(h0)?;
    if dev["healthy"] != Value::Bool(true) {
        return Err(format!("the drive left the pool: {dev}"));
    }
    Ok(())
}

/// (a): no scrub. h0 (tenant a) gets the drive and fills it with seed A; h1's request
/// (tenant b) queues; h0's release hands the drive to h1, which reads seed A everywhere.
pub fn handover_keeps_data(f: &mut Fabric) -> Result<(), String> {
    with_pool(f, false, |f, pf| {
        let (a, granted) = request(&mut f.hosts[0], 0, "a")?;
        if !granted {
            return Err(format!(
                "h0's request {a} for the free drive was not granted"
            ));
        }
        wait_owners(f, &owners(&[(pf, 0)]), "h0's lease")?;
        let dev = wait_block_device(&mut f.hosts[0], "h0's lease")?;
        let blocks = write_all(&mut f.hosts[0], &dev, SEED_A)?;
        let (b, granted) = request(&mut f.hosts[0], 1, "b")?;
        let (leases, queue) = leases_and_queue(&mut f.hosts[0])?;
        if granted || queue != vec![b] || leases != vec![a] {
            return Err(format!(
                "h1's request {b} while h0 holds the drive: expected queued behind lease {a}, \
                 got granted {granted}, leases {leases:?}, queue {queue:?}"
            ));
        }
        check_bindings(f, &owners(&[(pf, 0)]), "h1's request queued")?;
        healthy_with_telemetry(&mut f.hosts[0], pf)?;
        release(&mut f.hosts[0], a)?;
        let took = wait_granted(&mut f.hosts[0], b, "h0's release")?;
        wait_owners(f, &owners(&[(pf, 1)]), "h1's lease")?;
        let dev1 = wait_block_device(&mut f.hosts[1], "h1's lease")?;
        no_drive(&mut f.hosts[0], "after h0's release")?;
        verify_all(&mut f.hosts[1], &dev1, &format!("--seed {SEED_A}"), blocks)?;
        check_bindings(f, &owners(&[(pf, 1)]), "h1's lease")?;
        crate::say(&format!(
            "# nvme: manager: h1 granted the drive {:.1} s after h0's release; {blocks} blocks \
             of h0's data read back in h1",
            took.as_secs_f64()
        ));
        release(&mut f.hosts[0], b)?;
        wait_owners(f, &Owners::new(), "h1's release")
    })
}

/// (b): scrub pool. h1 (tenant b) fills the drive with seed B and releases it; h0's queued
/// request (tenant a) is granted only after the manager erased it, and h0 reads zeros.
pub fn scrub_between_holders(f: &mut Fabric) -> Result<(), String> {
    with_pool(f, true, |f, pf| {
        let (b, granted) = request(&mut f.hosts[0], 1, "b")?;
        if !granted {
            return Err(format!(
                "h1's request {b} for the free drive was not granted"
            ));
        }
        wait_owners(f, &owners(&[(pf, 1)]), "h1's lease")?;
        let dev1 = wait_block_device(&mut f.hosts[1], "h1's lease")?;
        let blocks = write_all(&mut f.hosts[1], &dev1, SEED_B)?;
        verify_all(&mut f.hosts[1], &dev1, &format!("--seed {SEED_B}"), blocks)?;
        let (a, granted) = request(&mut f.hosts[0], 0, "a")?;
        let (_, queue) = leases_and_queue(&mut f.hosts[0])?;
        if granted || queue != vec![a] {
            return Err(format!(
                "h0's request {a} while h1 holds the drive: expected queued, got granted \
                 {granted}, queue {queue:?}"
            ));
        }
        release(&mut f.hosts[0], b)?;
        let took = wait_granted(&mut f.hosts[0], a, "h1's release (scrub, then grant)")?;
        wait_owners(f, &owners(&[(pf, 0)]), "h0's lease")?;
        // The scrub's outcome, and the order in the daemon's log: h1's unbind, the scrub,
        // then the grant's bind to h0.
        let (dev, v) = pool(&mut f.hosts[0])?;
        let scrub = v["scrubs"]
            .as_array()
            .and_then(|s| s.last())
            .cloned()
            .unwrap_or(Value::Null);
        let pfs = format!("{pf:#06x}");
        if scrub["ok"] != Value::Bool(true)
            || scrub["pf"].as_str() != Some(pfs.as_str())
            || !dev["scrub"].is_null()
            || dev["healthy"] != Value::Bool(true)
        {
            return Err(format!(
                "after the grant: expected a successful scrub of {pfs} and the drive back in \
                 the pool, got scrub {scrub}, device {dev}"
            ));
        }
        let log = manager_log(&mut f.hosts[0], 200);
        let at = |needle: &str| log.find(needle);
        let order = (
            at(&format!("done: unbind {pfs} from host 1")),
            at(&format!("scrubbed {pfs} in ")),
            log.rfind(&format!("done: bind {pfs} to host 0")),
        );
        match order {
            (Some(u), Some(s), Some(g)) if u < s && s < g => {}
            _ => {
                return Err(format!(
                    "the manager's log does not show unbind from h1, scrub, bind to h0 in \
                     that order ({order:?}):\n{log}"
                ))
            }
        }
        let dev0 = wait_block_device(&mut f.hosts[0], "h0's lease after the scrub")?;
        // The scrub zeroed the whole namespace h0 now sees.
        let sectors = f.hosts[0].run_ok(&format!(
            "cat /sys/class/block/{}/size",
            dev0.trim_start_matches("/dev/")
        ))?;
        let bytes = sectors.trim().parse::<u64>().map(|s| s * 512).ok();
        if scrub["bytes"].as_u64() != bytes {
            return Err(format!(
                "the scrub zeroed {} bytes, the drive has {bytes:?}",
                scrub["bytes"]
            ));
        }
        verify_all(&mut f.hosts[0], &dev0, "--zero", blocks)?;
        no_drive(&mut f.hosts[1], "after h1's release")?;
        check_bindings(f, &owners(&[(pf, 0)]), "h0's lease after the scrub")?;
        crate::say(&format!(
            "# nvme: manager: scrub of the drive ({} bytes) took {:.2} s; h0 granted {:.1} s \
             after h1's release and read {blocks} zero blocks",
            scrub["bytes"],
            scrub["secs"].as_f64().unwrap_or(-1.0),
            took.as_secs_f64()
        ));
        release(&mut f.hosts[0], a)?;
        // A scrub follows this release too; wait for it so the drive is left free and idle.
        wait_owners(f, &Owners::new(), "h0's release")?;
        let t = Instant::now();
        loop {
            let (dev, v) = pool(&mut f.hosts[0])?;
            if dev["scrub"].is_null() && v["scrubbing"].as_array().is_some_and(Vec::is_empty) {
                break;
            }
            if t.elapsed() > HANDOVER {
                return Err(format!("the scrub after h0's release did not end: {v}"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        wait_owners(f, &Owners::new(), "the scrub after h0's release")
    })
}
