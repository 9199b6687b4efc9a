// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest unpriv`: as uid/gid 65534, read-only commands work while configuration
//! and debug-write commands (and P2P changes) get EPERM and start nothing.

use pcifab_uapi::{Arg, Identity, Mrpc, P2pCopy, P2pRoutes, Version};

use super::args::{device, Opts};
use super::ioctl::{echo_answer, Dev, ECHO};
use super::util::{check, errno, errno_name, json_str, Res};

/// How one MRPC command ended, between two reads of STATS.
struct Counted {
    r: Result<Mrpc, i32>,
    /// `r` as an errno name ("ok" for success).
    got: String,
    /// STATS `mrpc_commands` before and after the command.
    before: u64,
    after: u64,
}

fn counted(d: &Dev, cmd: u32, input: &[u8], out: &mut [u8], timeout_ms: u32) -> Res<Counted> {
    let before = d.stats()?;
    let r = d.mrpc(cmd, input, out, timeout_ms);
    let after = d.stats()?;
    let got = match &r {
        Ok(_) => "ok".to_string(),
        Err(e) => errno_name(*e),
    };
    Ok(Counted {
        r,
        got,
        before: before.mrpc_commands,
        after: after.mrpc_commands,
    })
}

/// One entry of the results: how command `name` was expected to end and how it did.
fn row(name: &str, expected: &str, got: &str) -> String {
    format!(
        "{{\"cmd\":{},\"expected\":{},\"got\":{}}}",
        json_str(name),
        json_str(expected),
        json_str(got)
    )
}

pub fn cmd_unpriv(o: &Opts) -> Res<()> {
    let path = device(o, "/dev/pcifab0");
    const NOBODY: u32 = 65534;
    // SAFETY: plain credential system calls.
    let ok = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(NOBODY) == 0
            && libc::setuid(NOBODY) == 0
    };
    if !ok {
        return Err(check(format!(
            "cannot drop privileges to uid/gid {NOBODY}: {} (run as root)",
            errno_name(errno())
        )));
    }
    // SAFETY: trivial getters.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    if uid != NOBODY || euid != NOBODY {
        return Err(check(format!(
            "uid/euid after setuid: expected {NOBODY}, got {uid}/{euid}"
        )));
    }
    let d = Dev::open(&path, false)?;
    let mut fails = Vec::new();
    let mut rows = Vec::new();
    let mut v = Version::new();
    if let Err(e) = d.ioctl(pcifab_uapi::PCIFAB_IOCTL_VERSION, &mut v) {
        fails.push(format!("VERSION: expected ok, got {}", errno_name(e)));
    }
    let mut id = Identity::new();
    if let Err(e) = d.ioctl(pcifab_uapi::PCIFAB_IOCTL_IDENTITY, &mut id) {
        fails.push(format!("IDENTITY: expected ok, got {}", errno_name(e)));
    }
    // Read-only class: allowed.
    let mut temp = 0u32;
    for (name, cmd, input) in [
        ("echo 0x41", ECHO, b"unprivileged!".to_vec()),
        ("die temp 0x04 GET", 0x04, 2u32.to_le_bytes().to_vec()),
    ] {
        let mut out = vec![0u8; if cmd == ECHO { input.len() } else { 4 }];
        let c = counted(&d, cmd, &input, &mut out, 0)?;
        rows.push(row(name, "ok", &c.got));
        match c.r {
            Ok(m) if m.status == pcifab_uapi::MRPC_STATUS_DONE && m.ret_value == 0 => {
                if cmd == ECHO && out[..] != echo_answer(&input)[..] {
                    fails.push(format!("{name}: output is not the input inverted"));
                }
                if cmd == 0x04 {
                    temp = u32::from_le_bytes([out[0], out[1], out[2], out[3]]);
                }
            }
            Ok(m) => fails.push(format!(
                "{name}: expected status 0x2 return 0x0, got {:#x} {:#x}",
                m.status, m.ret_value
            )),
            Err(e) => fails.push(format!("{name}: expected ok, got {}", errno_name(e))),
        }
        if c.after != c.before + 1 {
            fails.push(format!(
                "{name}: STATS mrpc_commands: expected +1, got +{}",
                c.after - c.before
            ));
        }
    }
    // Configuration (CAP_SYS_ADMIN) and debug-write (CAP_SYS_RAWIO) classes: refused.
    for (name, cmd) in [
        ("port control 0x8d", 0x8d),
        ("bind 0x84", 0x84),
        ("unbind 0x85", 0x85),
        ("pcifab configuration extension 0xf080", 0xf080),
        ("P2P route 0xf004", 0xf004),
        ("debug-write 0x87", 0x87),
        ("unknown id 0x1234", 0x1234),
        ("bind with bits 16-31 set 0x10084", 0x1_0084),
        ("echo with bits 16-31 set 0x10041", 0x1_0041),
    ] {
        let input = [0u8; 16];
        let mut out = [0u8; 16];
        let c = counted(&d, cmd, &input, &mut out, 0)?;
        rows.push(row(name, "EPERM", &c.got));
        if c.r.err() != Some(libc::EPERM) {
            fails.push(format!("{name}: expected EPERM, got {}", c.got));
        }
        if c.after != c.before {
            fails.push(format!(
                "{name}: STATS mrpc_commands: expected +0 for a refused command, got +{}",
                c.after - c.before
            ));
        }
    }
    // Timeouts: without CAP_SYS_ADMIN only 0 or PCIFAB_MRPC_USER_MIN_TIMEOUT_MS to
    // PCIFAB_MRPC_USER_MAX_TIMEOUT_MS.
    for (ms, want) in [
        (1, libc::EINVAL),
        (pcifab_uapi::MRPC_USER_MIN_TIMEOUT_MS - 1, libc::EINVAL),
        (pcifab_uapi::MRPC_USER_MIN_TIMEOUT_MS, 0),
        (pcifab_uapi::MRPC_USER_MAX_TIMEOUT_MS, 0),
        (pcifab_uapi::MRPC_USER_MAX_TIMEOUT_MS + 1, libc::EINVAL),
        (pcifab_uapi::MRPC_MAX_TIMEOUT_MS, libc::EINVAL),
    ] {
        let name = format!("echo 0x41, timeout {ms} ms");
        let mut out = [0u8; 4];
        let c = counted(&d, ECHO, b"time", &mut out, ms)?;
        rows.push(row(&name, &errno_name(want), &c.got));
        if c.r.err().unwrap_or(0) != want {
            fails.push(format!(
                "{name}: expected {}, got {}",
                errno_name(want),
                c.got
            ));
        }
        let starts = u64::from(want == 0);
        if c.after != c.before + starts {
            fails.push(format!(
                "{name}: STATS mrpc_commands: expected +{starts}, got +{}",
                c.after - c.before
            ));
        }
    }
    // P2P: changing routes and copying need CAP_SYS_ADMIN; the route list is open.
    let mut add = pcifab_uapi::P2pRoute::new();
    (add.route.pdfid, add.route.size) = (0x0300, 4096);
    let mut copy = P2pCopy::new();
    (copy.src.pdfid, copy.dst.pdfid, copy.len) = (0x0300, 0x0400, 1);
    let mut list = P2pRoutes::new();
    list.route_size = std::mem::size_of::<pcifab_uapi::Route>() as u32;
    for (name, r, want) in [
        (
            "P2P_ROUTE_ADD",
            d.ioctl(pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTE_ADD, &mut add),
            libc::EPERM,
        ),
        (
            "P2P_COPY",
            d.ioctl(pcifab_uapi::PCIFAB_IOCTL_P2P_COPY, &mut copy),
            libc::EPERM,
        ),
        (
            "P2P_ROUTES",
            d.ioctl(pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTES, &mut list),
            // Only firmware with pcifab's route extension has routes to list.
            if id.features & pcifab_uapi::FEATURE_P2P_ROUTES != 0 {
                0
            } else {
                libc::EOPNOTSUPP
            },
        ),
    ] {
        let got = r.err().unwrap_or(0);
        rows.push(row(name, &errno_name(want), &errno_name(got)));
        if got != want {
            fails.push(format!(
                "{name}: expected {}, got {}",
                errno_name(want),
                errno_name(got)
            ));
        }
    }
    println!(
        "{{\"test\":\"unpriv\",\"uid\":{uid},\"die_temp_centi\":{temp},\"results\":[{}],\"failed\":{}}}",
        rows.join(","),
        fails.len()
    );
    if fails.is_empty() {
        Ok(())
    } else {
        Err(check(fails.join("; ")))
    }
}
