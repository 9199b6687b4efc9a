// SPDX-License-Identifier: GPL-2.0-only

//! Reading and writing the ioctl argument structs of `/dev/pcifabN`: size first, so that an
//! older or newer caller's struct is accepted as the uAPI's extension rules say
//! (`Documentation/uapi.rst`).

use core::mem::size_of;

use kernel::{
    prelude::*,
    uaccess::{UserPtr, UserSlice, UserSliceWriter},
};

use crate::uapi::SizedArg;

/// Largest argument struct accepted at all; user structs beyond it are `E2BIG`.
pub(super) const MAX_ARG_SIZE: usize = 4096;

/// Reads a size-first argument struct from user space.
///
/// Returns the struct (bytes the caller did not pass stay zero) and how many bytes to copy back.
///
/// # Errors
///
/// `EFAULT` for a bad pointer, `EINVAL` for a struct smaller than its first version or with
/// unknown flags, `E2BIG` for a larger struct whose extra bytes are not zero.
pub(super) fn read_arg<T: SizedArg>(arg: usize) -> Result<(T, usize)> {
    let ptr = UserPtr::from_addr(arg);
    let size = UserSlice::new(ptr, size_of::<u32>())
        .reader()
        .read::<u32>()? as usize;
    if size < T::MIN_SIZE {
        return Err(EINVAL);
    }
    if size > MAX_ARG_SIZE {
        return Err(E2BIG);
    }
    let len = size.min(size_of::<T>());
    let mut reader = UserSlice::new(ptr, size).reader();
    let mut val = T::default();
    reader.read_slice(&mut val.as_bytes_mut()[..len])?;
    let mut tail = [0u8; 64];
    while !reader.is_empty() {
        let n = reader.len().min(tail.len());
        reader.read_slice(&mut tail[..n])?;
        if tail[..n].iter().any(|&b| b != 0) {
            return Err(E2BIG);
        }
    }
    if val.flags() & !T::FLAGS != 0 {
        return Err(EINVAL);
    }
    Ok((val, len))
}

/// Writes one array entry of `stride` bytes: the kernel's entry, then zeroes.
pub(super) fn write_entry(w: &mut UserSliceWriter, entry: &[u8], stride: usize) -> Result {
    w.write_slice(entry)?;
    let zeros = [0u8; 64];
    let mut pad = stride - entry.len();
    while pad > 0 {
        let n = pad.min(zeros.len());
        w.write_slice(&zeros[..n])?;
        pad -= n;
    }
    Ok(())
}

/// Copies the first `len` bytes of `val` back to user space.
pub(super) fn write_arg<T: SizedArg>(arg: usize, val: &T, len: usize) -> Result {
    UserSlice::new(UserPtr::from_addr(arg), len)
        .writer()
        .write_slice(&val.as_bytes()[..len])
}
