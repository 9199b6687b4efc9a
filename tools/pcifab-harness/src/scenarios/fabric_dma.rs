// SPDX-License-Identifier: GPL-2.0-only
//! Fabric mode of the DMA endpoint, accepted by a third party: Microchip's out-of-tree
//! `switchtec_dma.ko` (github.com/Microsemi/switchtec-dma, built by
//! tools/scripts/switchtec-dma.sh and passed with `--switchtec-dma DIR`) binds the emulated
//! PAX DMA endpoint in h0 and h1; its `fabric_client` target on h1 registers a scratchpad
//! and a data buffer for h0, and its initiator on h0 copies 4 KiB into the data buffer,
//! writes the size and pattern into the scratchpad by write-immediate and raises a remote
//! host interrupt, once per channel of h0 with a pattern of its own. The target checks the
//! data in its RHI handler; the harness reads its verdicts and the emulator's counters.
//! `make check-fabric-dma`; not part of `make test` (Microchip's source is in no registry).

use serde_json::Value;

use crate::checks::{dmesg_clean, driver_of, wait_or_dmesg, Checks};
use crate::fabric::{EmuControl, Fabric, Host};

/// Where the overlay of `--switchtec-dma` puts the three modules.
const DIR: &str = "/lib/modules/switchtec-dma";
/// The copy the initiator makes: one page.
const COPY: u64 = 4096;

/// BDF of the DMA endpoint (vendor 0x11f8, class 0x088000).
fn find_dmaep(h: &mut Host) -> Result<String, String> {
    let out = h.run_ok(
        r#"for d in /sys/bus/pci/devices/*; do
  if [ "$(cat $d/vendor)" = 0x11f8 ] && [ "$(cat $d/class)" = 0x088000 ]; then echo "${d##*/}"; fi
done"#,
    )?;
    match out.split_whitespace().collect::<Vec<_>>().as_slice() {
        [bdf] => Ok(bdf.to_string()),
        other => Err(format!(
            "{}: expected one DMA endpoint (vendor 0x11f8, class 0x088000), found {other:?}; \
             does the emulator config set dma_endpoint_channels?",
            h.name
        )),
    }
}

/// Loads Microchip's driver and returns (dmaengine device name, its channels).
fn load_driver(h: &mut Host) -> Result<(String, Vec<String>), String> {
    for ko in ["switchtec_dma", "target", "initiator"] {
        if h.run(&format!("[ -f {DIR}/{ko}.ko ]"))?.code != 0 {
            return Err(format!(
                "{}: {DIR}/{ko}.ko is not in the guest: pass --switchtec-dma with the tree \
                 tools/scripts/switchtec-dma.sh builds (make check-fabric-dma \
                 SWITCHTEC_DMA_SRC=...)",
                h.name
            ));
        }
    }
    let bdf = find_dmaep(h)?;
    if h.run("[ -d /sys/module/switchtec_dma ]")?.code == 0 {
        return Err(format!(
            "{}: a switchtec_dma module is already loaded (Linux's own, from another \
             scenario?): Microchip's has the same name; run this scenario in a boot of its own",
            h.name
        ));
    }
    h.run_ok("dmesg -c >/dev/null")?;
    h.run_ok(&format!("insmod {DIR}/switchtec_dma.ko"))?;
    wait_or_dmesg(
        h,
        &format!("[ -e /sys/bus/pci/devices/{bdf}/driver ]"),
        30,
        &format!("{bdf}: Microchip's switchtec_dma did not bind the DMA endpoint"),
    )?;
    let mut c = Checks::new(&format!("{}: Microchip's switchtec_dma on {bdf}", h.name));
    c.eq(
        "driver of the DMA endpoint",
        Some("switchtec_dma".to_string()),
        driver_of(h, &bdf)?,
    );
    let pax = h.run_ok("dmesg | grep -c 'Switchtec PAX DMA EP' || true")?;
    c.eq("probe saw a PAX (fabric) endpoint", "1", pax.trim());
    c.finish()?;
    let listed = h.run_ok(&format!("ls /sys/bus/pci/devices/{bdf}/dma/"))?;
    let mut chans: Vec<String> = listed.split_whitespace().map(str::to_string).collect();
    chans.sort_by_key(|c| c.rsplit("chan").next().and_then(|n| n.parse::<u32>().ok()));
    let dev = chans
        .first()
        .and_then(|c| c.split("chan").next())
        .ok_or_else(|| format!("{}: {bdf} registered no dmaengine channel", h.name))?
        .to_string();
    Ok((dev, chans))
}

/// Per channel bytes the emulator's endpoint of `host` moved, and its fabric counters.
fn emu_stats(emu: &EmuControl, host: &str) -> Result<(Vec<u64>, Value), String> {
    let v = emu.request(&format!("dmaep {host} stats"))?;
    let bytes = v
        .get("channels")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("emulator `dmaep {host} stats`: no channels in {v}"))?
        .iter()
        .map(|c| c.get("bytes").and_then(Value::as_u64).unwrap_or(u64::MAX))
        .collect();
    let fab = v
        .get("fabric")
        .cloned()
        .ok_or_else(|| format!("emulator `dmaep {host} stats`: no fabric in {v}"))?;
    Ok((bytes, fab))
}

fn hfid_of(fab: &Value, host: &str) -> Result<u64, String> {
    fab.get("hfid")
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("emulator: no hfid for {host} in {fab}"))
}

pub fn fabric_client_copies_into_peer_buffers(f: &mut Fabric) -> Result<(), String> {
    if f.hosts.len() < 2 {
        return Err("needs two hosts (--hosts 2): h0 initiates, h1 is the target".into());
    }
    if f.expected.dma_endpoint_channels == 0 {
        return Err("the emulator's configuration sets no dma_endpoint_channels".into());
    }
    let emu = f.emu();
    let (h0, rest) = f.hosts.split_at_mut(1);
    let (i0, t1) = (&mut h0[0], &mut rest[0]);
    let (idev, ichans) = load_driver(i0)?;
    let (tdev, _) = load_driver(t1)?;
    let hfid0 = hfid_of(&emu_stats(&emu, &i0.name)?.1, &i0.name)?;
    let hfid1 = hfid_of(&emu_stats(&emu, &t1.name)?.1, &t1.name)?;

    // The target registers its scratchpad (slot 0) and a page of data buffer (slot 1).
    t1.run_ok(&format!(
        "insmod {DIR}/target.ko dma_dev={tdev} peer_hfid={hfid0:#x} data_buf_size={COPY:#x}"
    ))?;
    let (_, fab1) = emu_stats(&emu, &t1.name)?;
    let bufs = fab1
        .get("buffers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut c = Checks::new(&format!("{}: fabric_client target registered", t1.name));
    c.eq(
        "buffers the emulator holds for h0 (slot, size)",
        vec![(0, 4096), (1, COPY)],
        bufs.iter()
            .map(|b| {
                (
                    b.get("index").and_then(Value::as_u64).unwrap_or(99),
                    b.get("size").and_then(Value::as_u64).unwrap_or(0),
                )
            })
            .collect::<Vec<_>>(),
    );
    c.finish()?;
    t1.run_ok("dmesg -c >/dev/null")?;

    let (before, _) = emu_stats(&emu, &i0.name)?;
    let mut rounds = 0u64;
    for (k, chan) in ichans.iter().enumerate() {
        let name = chan.strip_prefix(&idev).unwrap_or(chan);
        let pattern = 0x1122_3344_aabb_ccd0u64 + k as u64;
        i0.run_ok("dmesg -c >/dev/null")?;
        i0.run_ok(&format!(
            "insmod {DIR}/initiator.ko dma_dev={idev} dma_chan={name} peer_hfid={hfid1:#x} \
             timeout=10 pattern={pattern:#x}"
        ))?;
        wait_or_dmesg(
            i0,
            "[ \"$(dmesg | grep -c 'RHI done')\" = 1 ]",
            30,
            &format!("initiator on {chan}: the RHI descriptor did not complete"),
        )?;
        let ilog = i0.run_ok("dmesg")?;
        i0.run_ok("rmmod initiator")?;
        wait_or_dmesg(
            t1,
            "[ \"$(dmesg | grep -c 'Memory verification succeeded')\" = 1 ]",
            30,
            &format!("target: no verification after the RHI of {chan}"),
        )?;
        let tlog = t1.run_ok("dmesg -c")?;
        let count = |log: &str, s: &str| log.lines().filter(|l| l.contains(s)).count();
        let mut c = Checks::new(&format!(
            "{chan}: {COPY}-byte copy, 2 write-immediates, RHI to {}",
            t1.name
        ));
        c.eq("initiator: MEMCPY done", 1, count(&ilog, "MEMCPY done."));
        c.eq("initiator: WIMM done", 2, count(&ilog, "WIMM done."));
        c.eq("initiator: RHI done", 1, count(&ilog, "RHI done."));
        c.eq(
            "target: RHI notifications",
            1,
            count(&tlog, "Receive RHI notification"),
        );
        c.eq(
            "target: copied size (the first write-immediate)",
            1,
            count(&tlog, &format!("copied size: {COPY:#x}")),
        );
        c.eq(
            "target: pattern (the second write-immediate)",
            1,
            count(&tlog, &format!("pattern:     {pattern:#x}")),
        );
        c.eq(
            "target: data[0] (the copy)",
            1,
            count(&tlog, &format!("data[0]:     {pattern:#x}")),
        );
        c.eq(
            "target: qwords that failed verification",
            0,
            count(&tlog, "Memory verification failed"),
        );
        c.finish()?;
        rounds += 1;
    }
    let (after, fab0) = emu_stats(&emu, &i0.name)?;
    let (_, fab1) = emu_stats(&emu, &t1.name)?;
    let mut c = Checks::new("the emulator's view of the rounds");
    for (k, (b, a)) in before.iter().zip(&after).enumerate() {
        // A page and 8 + 8 bytes of write-immediate (an RHI moves no data).
        c.eq(
            &format!("{}: channel {k} bytes", i0.name),
            COPY + 16,
            a.wrapping_sub(*b),
        );
    }
    c.eq(
        &format!("{}: RHIs raised", t1.name),
        Some(rounds),
        fab1.get("rhis").and_then(Value::as_u64),
    );
    c.eq(
        &format!("{}: register events written", i0.name),
        Some(2),
        fab0.get("events").and_then(Value::as_u64),
    );
    c.finish()?;
    i0.log_note(&format!(
        "fabric_client: {rounds} channels of {idev}, each one {COPY}-byte copy, two \
         write-immediates and one RHI into {}'s buffers, verified by the target",
        t1.name
    ));
    // The target unregisters on unload; h0 hears of it.
    t1.run_ok("rmmod target")?;
    let (_, fab0) = emu_stats(&emu, &i0.name)?;
    let (_, fab1) = emu_stats(&emu, &t1.name)?;
    let mut c = Checks::new("after the target's unload");
    c.eq(
        &format!("{}: buffers left", t1.name),
        Some(0),
        fab1.get("buffers").and_then(Value::as_array).map(Vec::len),
    );
    c.eq(
        &format!("{}: register + unregister events", i0.name),
        Some(4),
        fab0.get("events").and_then(Value::as_u64),
    );
    c.finish()?;
    dmesg_clean(i0)?;
    dmesg_clean(t1)
}
