// SPDX-License-Identifier: GPL-2.0-only
//! `as-admin CMD [ARGS...]`: runs a command as uid/gid 65534 holding only `CAP_SYS_ADMIN`
//! (no `CAP_DAC_OVERRIDE`): an administrator whose files and sysfs accesses are checked like
//! anybody's, for the driver's paths that must not depend on the caller's file permissions.

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::util::{check, errno, errno_name, usage, Res};

pub const USAGE: &str = "\
  as-admin CMD [ARGS...]
        runs CMD as uid/gid 65534 with CAP_SYS_ADMIN only (permitted, effective,
        inheritable and ambient; no CAP_DAC_OVERRIDE); exits as CMD does
";

const NOBODY: u32 = 65534;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_DAC_OVERRIDE: u32 = 1;
/// `_LINUX_CAPABILITY_VERSION_3`.
const CAP_V3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn capset(data: &[CapData; 2]) -> Res<()> {
    let hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    // SAFETY: `hdr` and `data` are the v3 header and its two data words, valid for the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &hdr, data.as_ptr()) };
    if r != 0 {
        return Err(check(format!("capset: {}", errno_name(errno()))));
    }
    Ok(())
}

fn capget() -> Res<[CapData; 2]> {
    let hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: as for `capset`; the kernel writes the two data words.
    let r = unsafe { libc::syscall(libc::SYS_capget, &hdr, data.as_mut_ptr()) };
    if r != 0 {
        return Err(check(format!("capget: {}", errno_name(errno()))));
    }
    Ok(data)
}

pub fn cmd_as_admin(args: &[String]) -> Res<()> {
    let Some((prog, rest)) = args.split_first() else {
        return Err(usage("as-admin: a command to run is required"));
    };
    // SAFETY: plain credential system calls.
    let ok = unsafe {
        libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) == 0
            && libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(NOBODY) == 0
            && libc::setuid(NOBODY) == 0
    };
    if !ok {
        return Err(check(format!(
            "cannot become uid/gid {NOBODY} keeping capabilities: {} (run as root)",
            errno_name(errno())
        )));
    }
    let admin = 1u32 << CAP_SYS_ADMIN;
    capset(&[
        CapData {
            effective: admin,
            permitted: admin,
            inheritable: admin,
        },
        CapData::default(),
    ])?;
    // SAFETY: raising an ambient capability that is permitted and inheritable.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE,
            libc::c_ulong::from(CAP_SYS_ADMIN),
            0,
            0,
        )
    };
    if r != 0 {
        return Err(check(format!(
            "raising ambient CAP_SYS_ADMIN: {}",
            errno_name(errno())
        )));
    }
    let got = capget()?;
    if got[0].effective != admin || got[0].effective & (1 << CAP_DAC_OVERRIDE) != 0 {
        return Err(check(format!(
            "effective capabilities: expected only CAP_SYS_ADMIN ({admin:#x}), got {:#x}",
            got[0].effective
        )));
    }
    let e = Command::new(prog).args(rest).exec();
    Err(check(format!("exec {prog}: {e}")))
}
