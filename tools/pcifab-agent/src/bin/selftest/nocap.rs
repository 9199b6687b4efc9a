// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest nocap SCRIPT`: runs `/bin/sh -c SCRIPT` as root without `CAP_SYS_ADMIN`
//! (dropped from the bounding, inheritable and ambient sets, so the shell and everything it
//! starts never has it), for checking what a root without that capability may do.

use std::os::unix::process::CommandExt;

use super::util::{check, errno, errno_name, usage, Res};

/// `CAP_SYS_ADMIN` (`include/uapi/linux/capability.h`).
const CAP_SYS_ADMIN: libc::c_ulong = 21;

pub const USAGE: &str = "\
  nocap SCRIPT
        runs /bin/sh -c SCRIPT as root without CAP_SYS_ADMIN (dropped from the bounding,
        inheritable and ambient sets before the exec); its exit status is the script's
";

pub fn cmd_nocap(args: &[String]) -> Res<()> {
    let [script] = args else {
        return Err(usage("nocap takes one argument: the shell script to run"));
    };
    // SAFETY: prctl with integer arguments only.
    let r = unsafe {
        libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_LOWER as libc::c_ulong,
                CAP_SYS_ADMIN,
                0,
                0,
            ) == 0
    };
    if !r {
        return Err(check(format!(
            "cannot drop CAP_SYS_ADMIN from the bounding set: {} (run as root)",
            errno_name(errno())
        )));
    }
    // The inheritable set: a root's is normally empty; clear CAP_SYS_ADMIN from it anyway,
    // as execve keeps inheritable capabilities that the (root) file allows.
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `hdr` and `data` are the two-element v3 layout capget/capset expect.
    let ok = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        ) == 0
            && {
                data[0].inheritable &= !(1 << CAP_SYS_ADMIN);
                data[0].effective &= !(1 << CAP_SYS_ADMIN);
                data[0].permitted &= !(1 << CAP_SYS_ADMIN);
                libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) == 0
            }
    };
    if !ok {
        return Err(check(format!(
            "cannot drop CAP_SYS_ADMIN: {}",
            errno_name(errno())
        )));
    }
    let e = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .exec();
    Err(check(format!("cannot run /bin/sh: {e}")))
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

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
