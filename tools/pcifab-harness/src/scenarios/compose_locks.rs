// SPDX-License-Identifier: GPL-2.0-only
//! Composition scenarios about what one caller may hold up: a caller whose inventory buffer
//! never finishes faulting holds no lock another caller needs; binds reserve their functions
//! all at once, so three 8-function binds that wait for one another all finish; a bind
//! waiting for a reservation ends at once when killed; and a multi-function device removed
//! without a hot-plug slot leaves with every function. See `Documentation/testing.rst`.

use std::time::{Duration, Instant};

use crate::checks::{
    bind_here, check_bound_pcifab, check_world, compose_begin, emu_owners, owners, ClearFault,
    PCIFAB_KO,
};
use crate::config::Expected;
use crate::fabric::{EmuControl, Fabric, Host};

const SYSFS: &str = "/sys/class/misc/pcifab0";
/// The function the holding bind keeps reserved (gpu0's PF): it sorts between the made-up
/// PDFIDs of the three 8-function binds below.
const HELD: u16 = 0x0300;
/// How long the holding bind keeps [`HELD`] (it waits for an enumeration that never comes).
const HOLD_MS: u32 = 25_000;

/// Starts `cmd` in the background of `h`; its output goes to `/tmp/NAME.out`, its exit code
/// to `/tmp/NAME.rc` and its PID to `/tmp/NAME.pid`.
fn start_bg(h: &mut Host, name: &str, cmd: &str) -> Result<(), String> {
    h.run_ok(&format!(
        "rm -f /tmp/{name}.out /tmp/{name}.rc /tmp/{name}.pid; \
         ( ({cmd}) >/tmp/{name}.out 2>&1 </dev/null & echo $! >/tmp/{name}.pid; wait $!; \
         echo $? >/tmp/{name}.rc ) </dev/null >/dev/null 2>&1 &"
    ))
    .map(|_| ())
}

/// The exit code of background command `name` if it has ended.
fn bg_rc(h: &mut Host, name: &str) -> Result<Option<i64>, String> {
    let o = h.run(&format!("cat /tmp/{name}.rc 2>/dev/null"))?;
    Ok(o.out.trim().parse().ok())
}

/// Output of background command `name`.
fn bg_out(h: &mut Host, name: &str) -> Result<String, String> {
    Ok(h.run(&format!("cat /tmp/{name}.out 2>/dev/null"))?.out)
}

/// Polls (every 100 ms in the guest) until `test_expr` holds; `false` after `secs`.
fn poll(h: &mut Host, test_expr: &str, secs: u32) -> Result<bool, String> {
    let o = h.run_timeout(
        &format!(
            "i=0; while ! {{ {test_expr}; }} && [ $i -lt {} ]; do sleep 0.1; i=$((i+1)); done; \
             {test_expr}",
            secs * 10
        ),
        Duration::from_secs(u64::from(secs) + 30),
    )?;
    Ok(o.code == 0)
}

/// `compose_waiting` of `h`.
fn waiting(h: &mut Host) -> Result<u64, String> {
    let s = h.run_ok(&format!("cat {SYSFS}/compose_waiting"))?;
    s.trim()
        .parse()
        .map_err(|e| format!("{}: compose_waiting {s:?}: {e}", h.name))
}

/// Binds [`HELD`] to h0, which never enumerates it: the bind holds its reservation for
/// [`HOLD_MS`]. Returns once the emulator shows it bound (the driver is in its wait).
fn hold(h0: &mut Host, emu: &EmuControl, e: &Expected) -> Result<(), String> {
    emu.request("fault h0 no-enumerate")?;
    start_bg(
        h0,
        "hold",
        &format!("pcifab-bind 0 {HELD:#06x} -t {HOLD_MS}"),
    )?;
    let t = Instant::now();
    loop {
        let (o, _) = emu_owners(emu, e)?;
        if o.get(&HELD) == Some(&0) {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "h0: the holding bind of {HELD:#06x} did not reach the firmware within 20 s: {}",
                bg_out(h0, "hold")?.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `compose_waiting` of `h` is at least `n`; fails after `secs`.
fn wait_waiting(h: &mut Host, n: u64, secs: u32, what: &str) -> Result<(), String> {
    if poll(
        h,
        &format!("[ $(cat {SYSFS}/compose_waiting) -ge {n} ]"),
        secs,
    )? {
        return Ok(());
    }
    let now = waiting(h)?;
    Err(format!(
        "{}: {what}: compose_waiting did not reach {n} within {secs} s (it is {now})",
        h.name
    ))
}

/// Three binds of eight functions each, all of them including [`HELD`], which a fourth bind
/// holds. Reserved one function at a time into the driver's 16 entries, the first would hold
/// six, the second five and the third four (every entry taken) when the holder lets go, and
/// whichever then took [`HELD`] would wait for a free entry forever. Reserving all or nothing,
/// all three wait holding nothing (`compose_waiting` shows 3 at once), then go one after
/// another: every one of them ends (the firmware refuses their made-up functions).
pub fn three_binds_no_deadlock(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let _clear = ClearFault(emu.clone(), "h0");
    let lists: [Vec<u16>; 3] = [
        // Six below HELD, one above.
        (0x0101..=0x0106).chain([HELD, 0x0f01]).collect(),
        // Five below, two above.
        (0x0111..=0x0115).chain([HELD, 0x0f11, 0x0f12]).collect(),
        // Four below, three above.
        (0x0121..=0x0124)
            .chain([HELD, 0x0f21, 0x0f22, 0x0f23])
            .collect(),
    ];
    let e = f.expected.clone();
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let w0 = waiting(h0)?;
    if w0 != 0 {
        return Err(format!("h0: compose_waiting is {w0} before anything runs"));
    }
    hold(h0, &emu, &e)?;
    let held_at = Instant::now();
    for (i, l) in lists.iter().enumerate() {
        let pdfids: Vec<String> = l.iter().map(|p| format!("{p:#06x}")).collect();
        start_bg(
            h0,
            &format!("b{i}"),
            &format!("pcifab-bind 1 {} -t 60000", pdfids.join(" ")),
        )?;
        wait_waiting(h0, i as u64 + 1, 15, &format!("bind {i} started"))?;
    }
    let overlapped = waiting(h0)?;
    let hold_running = bg_rc(h0, "hold")?.is_none();
    h0.log_note(&format!(
        "three binds waiting at once: compose_waiting {overlapped}, holder running {hold_running}, \
         {:.1} s after the hold began",
        held_at.elapsed().as_secs_f64()
    ));
    if overlapped != 3 || !hold_running {
        return Err(format!(
            "h0: expected the three binds waiting together while the holder runs, got \
             compose_waiting {overlapped}, holder running {hold_running}"
        ));
    }
    // The holder gives up (ETIMEDOUT) after HOLD_MS; then all three must end.
    let limit = HOLD_MS / 1000 + 60;
    let all_done =
        "[ -s /tmp/hold.rc ] && [ -s /tmp/b0.rc ] && [ -s /tmp/b1.rc ] && [ -s /tmp/b2.rc ]";
    let done = poll(h0, all_done, limit)?;
    let now_waiting = waiting(h0)?;
    let mut report = Vec::new();
    for name in ["hold", "b0", "b1", "b2"] {
        report.push(format!(
            "{name}: rc {:?}: {}",
            bg_rc(h0, name)?,
            bg_out(h0, name)?.trim()
        ));
    }
    h0.log_note(&report.join("; "));
    if !done {
        // Left as they are: only unbinding the MEP (the next scenario's begin) ends them.
        return Err(format!(
            "h0: the three 8-function binds did not all end within {limit} s of the hold \
             (compose_waiting {now_waiting}): {}",
            report.join("; ")
        ));
    }
    if now_waiting != 0 {
        return Err(format!(
            "h0: compose_waiting is {now_waiting} after every bind ended"
        ));
    }
    for name in ["b0", "b1", "b2"] {
        if bg_rc(h0, name)? == Some(0) {
            return Err(format!(
                "h0: bind {name} of made-up functions succeeded: {}",
                bg_out(h0, name)?.trim()
            ));
        }
    }
    drop(_clear);
    check_world(f, &owners(&[]), "three 8-function binds ended")
}

/// A bind waiting for a function another bind holds is killed with SIGKILL: it ends within
/// a second, leaves `compose_waiting`, and the holder goes on unaffected.
pub fn killed_waiter_ends(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let emu = f.emu();
    let _clear = ClearFault(emu.clone(), "h0");
    let e = f.expected.clone();
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    hold(h0, &emu, &e)?;
    start_bg(h0, "waiter", &format!("pcifab-bind 1 {HELD:#06x} -t 60000"))?;
    wait_waiting(h0, 1, 15, "the second bind started")?;
    // Timed inside the guest from /proc/uptime (10 ms steps): kill, then until the shell
    // that waits for it has its exit code.
    let o = h0.run_ok_timeout(
        "read t0 x </proc/uptime; kill -9 $(cat /tmp/waiter.pid); \
         i=0; while [ ! -s /tmp/waiter.rc ] && [ $i -lt 1000 ]; do usleep 10000; i=$((i+1)); done; \
         read t1 x </proc/uptime; echo \"$t0 $t1 $(cat /tmp/waiter.rc 2>/dev/null)\"",
        Duration::from_secs(60),
    )?;
    let parts: Vec<&str> = o.split_whitespace().collect();
    let secs = |s: &str| s.parse::<f64>().map_err(|e| format!("uptime {s:?}: {e}"));
    let (t0, t1) = match parts.as_slice() {
        [a, b, ..] => (secs(a)?, secs(b)?),
        _ => return Err(format!("h0: unexpected timing output {o:?}")),
    };
    let rc = parts.get(2).copied().unwrap_or("none");
    let took = t1 - t0;
    h0.log_note(&format!("killed waiter ended after {took:.2} s, rc {rc}"));
    let holder_running = bg_rc(h0, "hold")?.is_none();
    let now_waiting = waiting(h0)?;
    if rc != "137" || took > 1.0 {
        return Err(format!(
            "h0: a bind waiting for {HELD:#06x} killed with SIGKILL: expected it gone (exit 137) \
             within 1 s, got exit {rc} after {took:.2} s (the holder still running: \
             {holder_running})"
        ));
    }
    if now_waiting != 0 {
        return Err(format!(
            "h0: compose_waiting is {now_waiting} after the waiter was killed"
        ));
    }
    // The holder ends on its own (ETIMEDOUT, its function given back).
    let limit = HOLD_MS / 1000 + 30;
    if !poll(h0, "[ -s /tmp/hold.rc ]", limit)? {
        return Err(format!("h0: the holding bind did not end within {limit} s"));
    }
    drop(_clear);
    check_world(f, &owners(&[]), "killed waiter, holder timed out")
}

/// The inventory ioctl copies into a buffer that never finishes faulting (a userfaultfd
/// range nobody fills): meanwhile another caller lists the fabric, reads sysfs, binds and
/// unbinds. Each must end while the stalled caller is still stalled.
pub fn inventory_stall(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    start_bg(h0, "stall", "pcifab-selftest stall-inventory --seconds 300")?;
    if !poll(h0, "grep -q -e stalled -e userfaultfd /tmp/stall.out", 60)? {
        return Err(format!(
            "h0: the stalled inventory caller did not start: {}",
            bg_out(h0, "stall")?.trim()
        ));
    }
    let out = bg_out(h0, "stall")?;
    if out.contains("\"userfaultfd\":false") {
        if f.debug_kernel {
            return Err(
                "h0: the sanitizer kernel has no userfaultfd: tools/kconfig/pcifab-debug.config \
                 enables CONFIG_USERFAULTFD for this scenario"
                    .into(),
            );
        }
        f.skip("this kernel has no userfaultfd (CONFIG_USERFAULTFD), which the stall needs");
        return Ok(());
    }
    // The other caller, in the background so that a hang cannot keep the stall from being
    // released below.
    let pdfid = 0x0401u16;
    let t = Instant::now();
    start_bg(
        h0,
        "other",
        &format!(
            "pcifab list --json >/dev/null && cat {SYSFS}/nr_functions {SYSFS}/generation && \
             pcifab bind {pdfid:#06x} --host 0 --json && pcifab unbind {pdfid:#06x} --json"
        ),
    )?;
    let done = poll(h0, "[ -s /tmp/other.rc ]", 90)?;
    let took = t.elapsed().as_secs_f64();
    let still = bg_rc(h0, "stall")?.is_none();
    let other_rc = bg_rc(h0, "other")?;
    let other_out = bg_out(h0, "other")?;
    // Released whatever happened, so that a hang ends here.
    h0.run_ok("kill -TERM $(cat /tmp/stall.pid)")?;
    let released = poll(h0, "[ -s /tmp/stall.rc ]", 60)?;
    let stall_rc = bg_rc(h0, "stall")?;
    let stall_out = bg_out(h0, "stall")?;
    h0.log_note(&format!(
        "other caller: done {done} after {took:.1} s, rc {other_rc:?}; stall: {}",
        stall_out.trim()
    ));
    if !done || other_rc != Some(0) {
        return Err(format!(
            "h0: with an inventory copy stalled in its buffer, list/sysfs/bind/unbind by \
             another caller: done {done} after {took:.1} s, exit {other_rc:?}: {}",
            other_out.trim()
        ));
    }
    if !still {
        return Err(format!(
            "h0: the stalled inventory caller ended before its release: {}",
            stall_out.trim()
        ));
    }
    if !released || stall_rc != Some(0) {
        return Err(format!(
            "h0: the stalled inventory caller after its release: exit {stall_rc:?}: {}",
            stall_out.trim()
        ));
    }
    check_world(f, &owners(&[]), "stalled inventory released")
}

/// The two functions of the device the next scenario binds (gpu1's VFs 1 and 2).
const TWO_FNS: [u16; 2] = [0x0401, 0x0402];

/// A two-function device is unbound from a host whose downstream port has no hot-plug slot
/// (pciehp unbound from the port): the driver removes the device itself before the firmware
/// takes it, and every function must go, not function 0 alone, or the rest would be
/// surprise-removed under their drivers. Afterwards pciehp is bound again and the slot
/// powered off, which lets QEMU finish the firmware's removal.
pub fn multi_fn_no_slot(f: &mut Fabric) -> Result<(), String> {
    compose_begin(f)?;
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    let list: Vec<String> = TWO_FNS.iter().map(|p| format!("{p:#06x}")).collect();
    let o = h0.run_timeout(
        &format!("pcifab-bind 0 {}", list.join(" ")),
        Duration::from_secs(90),
    )?;
    let v: serde_json::Value = o
        .out
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(serde_json::Value::Null);
    let name = v["name"].as_str().unwrap_or("").to_string();
    let Some(slot_addr) = name.strip_suffix(".0").map(str::to_string) else {
        return Err(format!(
            "h0: binding {} together: exit {}: {}",
            list.join(" "),
            o.code,
            o.out.trim()
        ));
    };
    let dev = |fnum: u8| format!("/sys/bus/pci/devices/{slot_addr}.{fnum}");
    if !poll(h0, &format!("[ -e {} ]", dev(1)), 30)? {
        return Err(format!("h0: function 1 of {slot_addr} never appeared"));
    }
    // The downstream port above the device, its hot-plug service, and that service's slot.
    let dsp = h0
        .run_ok(&format!("basename $(readlink -f {}/..)", dev(0)))?
        .trim()
        .to_string();
    let svc = h0
        .run_ok(&format!(
            "for s in /sys/bus/pci_express/drivers/pciehp/{dsp}:pcie*; do basename $s; done"
        ))?
        .trim()
        .to_string();
    if !svc.starts_with(&dsp) || svc.contains('*') {
        return Err(format!("h0: no pciehp service on {dsp} ({svc:?})"));
    }
    let find_slot = format!(
        "for s in /sys/bus/pci/slots/*; do [ \"$(cat $s/address)\" = {slot_addr} ] && basename $s; done; true"
    );
    h0.run_ok(&format!(
        "echo {svc} > /sys/bus/pci_express/drivers/pciehp/unbind"
    ))?;
    let slot = h0.run_ok(&find_slot)?;
    if !slot.trim().is_empty() {
        return Err(format!(
            "h0: slot {} of {slot_addr} still there with pciehp unbound",
            slot.trim()
        ));
    }
    start_bg(h0, "mfu", &format!("pcifab unbind {} --json", list[0]))?;
    // The driver removes the functions before the firmware is asked; function 0 last.
    let f0_gone = poll(h0, &format!("[ ! -e {} ]", dev(0)), 60)?;
    let f1_left = h0.run(&format!("[ -e {} ]", dev(1)))?.code == 0;
    let log = h0
        .run("dmesg | grep -E 'slot power-off not possible' | tail -n 2")?
        .out;
    // Put pciehp back and power the slot off: QEMU then ends the firmware's device_del.
    h0.run_ok(&format!(
        "echo {svc} > /sys/bus/pci_express/drivers/pciehp/bind"
    ))?;
    let mut slot = String::new();
    for _ in 0..50 {
        slot = h0.run_ok(&find_slot)?.trim().to_string();
        if !slot.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if slot.is_empty() {
        return Err(format!(
            "h0: the slot of {slot_addr} did not come back with pciehp"
        ));
    }
    let _ = h0.run(&format!("echo 0 > /sys/bus/pci/slots/{slot}/power"))?;
    let unbound = poll(h0, "[ -s /tmp/mfu.rc ]", 60)?;
    let rc = bg_rc(h0, "mfu")?;
    let out = bg_out(h0, "mfu")?;
    h0.log_note(&format!(
        "no-slot unbind: function 0 gone {f0_gone}, function 1 left {f1_left}; {}; unbind rc {rc:?}: {}",
        log.trim(),
        out.trim()
    ));
    if !f0_gone || f1_left {
        return Err(format!(
            "h0: unbinding {slot_addr} (two functions) without a hot-plug slot: function 0 \
             removed: {f0_gone}, function 1 still there: {f1_left} (expected both gone before \
             the firmware takes the device)"
        ));
    }
    if !log.contains("slot power-off not possible") {
        return Err(format!(
            "h0: the driver did not take the no-slot path (dmesg: {:?})",
            log.trim()
        ));
    }
    if !unbound || rc != Some(0) {
        return Err(format!(
            "h0: pcifab unbind {}: ended {unbound}, exit {rc:?}: {}",
            list[0],
            out.trim()
        ));
    }
    check_world(
        f,
        &owners(&[]),
        "two-function device unbound without a slot",
    )
}

/// `removal_delay_ms` of [`free_port_waiter_counted`]: holds the fabric-event work's removal
/// of the function on the last port, whose port the firmware shows free meanwhile.
const FREE_PORT_HOLD_MS: u32 = 20_000;

/// A bind with no port given, while every logical port of the host the firmware shows free
/// is held by another operation, waits for one (`take_free_port`); it must show in
/// `compose_waiting` as the waits for a function or for a given port do. The holder is the
/// fabric-event work removing the function the manager unbinds from the last free port
/// (held there by `removal_delay_ms`, while pciehp and the firmware have already let the
/// function go); the other three ports hold functions. Before the fix the bind waited with
/// `compose_waiting` at 0. Extended dialect only (the firmware's UNBIND_REQUEST).
pub fn free_port_waiter_counted(f: &mut Fabric) -> Result<(), String> {
    if f.dialect() == crate::config::Dialect::Pax {
        return Err(
            "needs the extended dialect: the holder is the removal an UNBIND_REQUEST starts".into(),
        );
    }
    compose_begin(f)?;
    let emu = f.emu();
    let e = f.expected.clone();
    let h0 = f.hosts.first_mut().ok_or("no hosts")?;
    h0.run_ok(&format!(
        "rmmod pcifab && insmod {PCIFAB_KO} removal_delay_ms={FREE_PORT_HOLD_MS}"
    ))?;
    check_bound_pcifab(h0)?;
    let r = (|| -> Result<(), String> {
        // Ports 0-2 hold gpu1's VFs 1-3, port 3 gpu0's PF (enumerated in h0, so that its
        // removal reaches the delay).
        for (port, pdfid) in [0x0401u16, 0x0402, 0x0403].into_iter().enumerate() {
            let v = emu.request(&format!("bind {pdfid:#06x} h0 {port}"))?;
            if v["ok"] != serde_json::Value::Bool(true) {
                return Err(format!(
                    "emulator bind of {pdfid:#06x} to h0 port {port}: {v}"
                ));
            }
        }
        bind_here(h0, &e, HELD)?;
        // The manager unbinds it: h0's fabric-event work takes port 3 and waits in the
        // removal delay; QEMU's device_del and pciehp let the firmware's unbind finish.
        let unbind = {
            let emu = emu.clone();
            std::thread::spawn(move || emu.request(&format!("unbind {HELD:#06x}")))
        };
        if !poll(h0, "dmesg | grep -q 'removal delayed by'", 20)? {
            return Err("h0: the removal of the unbound function never reached its delay".into());
        }
        let unbound = unbind
            .join()
            .map_err(|_| "the emulator's unbind thread panicked".to_string())??;
        h0.log_note(&format!("manager's unbind of {HELD:#06x}: {unbound}"));
        let (o, _) = emu_owners(&emu, &e)?;
        if o.contains_key(&HELD) {
            return Err(format!(
                "h0: {HELD:#06x} still bound after the manager's unbind"
            ));
        }
        let t = Instant::now();
        start_bg(h0, "anyport", "pcifab-bind 0 0x0404 -t 60000")?;
        wait_waiting(h0, 1, 10, "a bind with no port while port 3 is held")?;
        let removing = !poll(h0, "dmesg | grep -q 'leaving this host'", 0)?;
        h0.log_note(&format!(
            "the any-port bind counted in compose_waiting after {:.1} s; removal still held: \
             {removing}",
            t.elapsed().as_secs_f64()
        ));
        if !removing {
            return Err(
                "h0: the removal holding port 3 ended before the bind was seen waiting".into(),
            );
        }
        let limit = FREE_PORT_HOLD_MS / 1000 + 60;
        if !poll(h0, "[ -s /tmp/anyport.rc ]", limit)? {
            return Err(format!(
                "h0: the any-port bind did not end within {limit} s"
            ));
        }
        let rc = bg_rc(h0, "anyport")?;
        let out = bg_out(h0, "anyport")?;
        if rc != Some(0) {
            return Err(format!(
                "h0: the any-port bind, once port 3 was free: exit {rc:?}: {}",
                out.trim()
            ));
        }
        let now = waiting(h0)?;
        if now != 0 {
            return Err(format!("h0: compose_waiting is {now} after the bind ended"));
        }
        Ok(())
    })();
    // The module without the delay again, whatever happened.
    let reloaded = h0
        .run_ok(&format!("rmmod pcifab && insmod {PCIFAB_KO}"))
        .and_then(|_| check_bound_pcifab(h0));
    r?;
    reloaded?;
    check_world(
        f,
        &owners(&[(0x0401, 0), (0x0402, 0), (0x0403, 0), (0x0404, 0)]),
        "any-port bind after the held removal",
    )
}
