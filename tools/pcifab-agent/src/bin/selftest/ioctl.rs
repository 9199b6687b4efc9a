// SPDX-License-Identifier: GPL-2.0-only
//! The ioctl layer of `pcifab-selftest`: [`Dev`], an open `/dev/pcifabN` (or
//! `/dev/switchtec0`) whose raw ioctl passes any argument pointer on purpose, so that the
//! checks can hand the kernel malformed ones; the same on bare descriptors for forked
//! children; and the uAPI structs as bytes and filled in.

use std::ffi::CString;

use pcifab_uapi::{Arg, Mrpc, Stats};

use super::util::{check, errno, errno_name, usage, Res};

/// An open character device.
pub struct Dev {
    fd: i32,
    pub path: String,
}

impl Dev {
    pub fn open(path: &str, write: bool) -> Res<Dev> {
        let c = CString::new(path).map_err(|_| usage("device path contains a NUL byte"))?;
        let flags = if write { libc::O_RDWR } else { libc::O_RDONLY };
        // SAFETY: `c` is a valid NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = errno();
            let hint = match e {
                libc::ENOENT => "; is the driver loaded and bound?",
                libc::EACCES => "; the node must be readable by this user (chmod 666)",
                _ => "",
            };
            return Err(check(format!(
                "cannot open {path}: {}{hint}",
                std::io::Error::from_raw_os_error(e)
            )));
        }
        Ok(Dev {
            fd,
            path: path.to_string(),
        })
    }

    /// ioctl with a raw argument; Ok or the errno.
    pub fn ioctl_raw(&self, cmd: u32, arg: *mut u8) -> Result<(), i32> {
        // SAFETY: the kernel validates `arg`; callers pass pointers into memory they own or
        // deliberately bad ones, which the kernel must reject with EFAULT.
        let rc = unsafe { libc::ioctl(self.fd, cmd as _, arg) };
        if rc < 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    pub fn ioctl<T: Arg>(&self, cmd: u32, arg: &mut T) -> Result<(), i32> {
        self.ioctl_raw(cmd, (arg as *mut T).cast())
    }

    pub fn stats(&self) -> Res<Stats> {
        let mut s = Stats::new();
        self.ioctl(pcifab_uapi::PCIFAB_IOCTL_STATS, &mut s)
            .map_err(|e| {
                check(format!(
                    "PCIFAB_IOCTL_STATS on {} failed: {}",
                    self.path,
                    errno_name(e)
                ))
            })?;
        Ok(s)
    }

    /// write(2) of all of `buf`: the count written, or -1 with errno set.
    pub fn write(&self, buf: &[u8]) -> isize {
        // SAFETY: `buf` holds `buf.len()` initialised bytes.
        unsafe { libc::write(self.fd, buf.as_ptr().cast(), buf.len()) }
    }

    /// read(2) into `buf`: the count read, or -1 with errno set.
    pub fn read(&self, buf: &mut [u8]) -> isize {
        // SAFETY: `buf` has room for `buf.len()` bytes.
        unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) }
    }

    /// One MRPC command. Returns the filled struct or the errno.
    pub fn mrpc(
        &self,
        cmd: u32,
        input: &[u8],
        out: &mut [u8],
        timeout_ms: u32,
    ) -> Result<Mrpc, i32> {
        let mut m = mrpc_arg(cmd, input, out, timeout_ms);
        self.ioctl(pcifab_uapi::PCIFAB_IOCTL_MRPC, &mut m)?;
        Ok(m)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: `fd` is ours and closed once.
        unsafe { libc::close(self.fd) };
    }
}

// ---------------------------------------------------------------- structs

/// The MRPC echo command.
pub const ECHO: u32 = 0x41;

/// What a PAX part answers to ECHO: its input, bit-inverted (switchtec-user's cli/main.c
/// `test` expects `out == ~in`).
pub fn echo_answer(input: &[u8]) -> Vec<u8> {
    input.iter().map(|b| !b).collect()
}

/// The `struct pcifab_mrpc` of one command with `input` and room for `out`.
pub fn mrpc_arg(cmd: u32, input: &[u8], out: &mut [u8], timeout_ms: u32) -> Mrpc {
    let mut m = Mrpc::new();
    m.cmd = cmd;
    m.in_len = input.len() as u32;
    m.out_len = out.len() as u32;
    m.timeout_ms = timeout_ms;
    m.in_ptr = input.as_ptr() as u64;
    m.out_ptr = out.as_mut_ptr() as u64;
    m
}

/// A uAPI struct as the bytes the kernel reads.
pub fn as_bytes<T: Arg>(v: &T) -> Vec<u8> {
    // SAFETY: `Arg` types are plain `repr(C)` data without padding.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

// ------------------------------------------------------------ descriptors

/// Opens `path` with `flags` (and `O_CLOEXEC`): the descriptor or the errno.
pub fn open_fd(path: &str, flags: i32) -> Result<i32, i32> {
    let c = CString::new(path).map_err(|_| libc::EINVAL)?;
    // SAFETY: a valid path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

/// ioctl on a bare descriptor: Ok or the errno.
pub fn fd_ioctl<T: Arg>(fd: i32, nr: u32, arg: &mut T) -> Result<(), i32> {
    // SAFETY: `arg` is a valid struct of this ABI without user pointers, or with pointers
    // the caller made valid.
    if unsafe { libc::ioctl(fd, nr as _, arg as *mut T) } != 0 {
        Err(errno())
    } else {
        Ok(())
    }
}
