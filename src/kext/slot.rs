// SPDX-License-Identifier: GPL-2.0-only

//! Turning a PCI hot-plug slot off through its sysfs `power` file.
//!
//! The PCI hot-plug core exports no function that powers a slot off; the one interface it
//! offers is the slot's `power` attribute (`/sys/bus/pci/slots/NAME/power`). Writing `0` there
//! makes the slot's hot-plug driver (pciehp) unbind the driver of the function in the slot,
//! remove the function and turn the slot's power off, and returns when that is done. Going
//! through the file keeps every guarantee the PCI core gives a user writing it: sysfs holds
//! the attribute active (the slot and its hot-plug driver cannot go away during the write) and
//! the hot-plug core holds a reference on the driver's module.
//!
//! The files are opened through a kernel-internal mount of sysfs ([`Sysfs`]), so the caller's
//! mount namespace does not matter and a kernel thread (whose root is empty) can use them.
//! A PCIe hot-plug driver names a slot after the port's Physical Slot Number (`PSN`, or
//! `PSN-1`, `PSN-2`, ... when the name is taken); the slot whose `address` file names the
//! function's bus and device is the one written, so another slot never gets the write.
//! Where the files cannot be used, the caller falls back to removing the device only.

use core::ptr::NonNull;

use kernel::{bindings, error, prelude::*};

/// The directory of every registered hot-plug slot, relative to the root of sysfs.
const SLOTS: &[u8] = b"bus/pci/slots/";
/// Room for `SLOTS`, a slot name, `/address` and the NUL.
const PATH_LEN: usize = 64;
/// Slot names tried per Physical Slot Number: `PSN`, `PSN-1`, ..., `PSN-(TRIES - 1)`.
const TRIES: u32 = 32;

/// A kernel-internal mount of sysfs, unmounted on drop.
///
/// # Invariants
///
/// `0` points to a mount made by `kern_mount()` that this object unmounts.
pub(crate) struct Sysfs(NonNull<bindings::vfsmount>);

// SAFETY: A mount is reference counted and may be used and unmounted from any thread.
unsafe impl Send for Sysfs {}
// SAFETY: Opening files below a mount takes no state of the `Sysfs` object beyond the
// mount, which the VFS protects itself.
unsafe impl Sync for Sysfs {}

impl Sysfs {
    /// Mounts sysfs for the kernel's own use.
    pub(crate) fn mount() -> Result<Self> {
        // SAFETY: The name is a NUL-terminated static string.
        let fs = unsafe { bindings::get_fs_type(c"sysfs".as_char_ptr()) };
        if fs.is_null() {
            return Err(ENODEV);
        }
        // SAFETY: `fs` is a registered file system type `get_fs_type()` returned.
        let mnt = unsafe { bindings::kern_mount(fs) };
        // SAFETY: `get_fs_type()` took a reference on the type's module, which the mount (if
        // made) holds on its own; `fs` stays registered (sysfs is built in).
        unsafe { bindings::module_put((*fs).owner) };
        let mnt = error::from_err_ptr(mnt)?;
        // INVARIANT: `kern_mount()` returned a mount.
        NonNull::new(mnt).map(Self).ok_or(ENODEV)
    }

    /// Opens the file at the NUL-terminated `path` (relative to sysfs's root) with `flags`.
    fn open(&self, path: &[u8], flags: u32) -> Result<KernelFile> {
        if path.last() != Some(&0) || path.iter().filter(|&&b| b == 0).count() != 1 {
            return Err(EINVAL);
        }
        let flags = i32::try_from(flags).map_err(|_| EINVAL)?;
        let root = bindings::path {
            mnt: self.0.as_ptr(),
            // SAFETY: The mount is live (invariant); its root dentry is set when it is made.
            dentry: unsafe { (*self.0.as_ptr()).mnt_root },
        };
        // SAFETY: `root` is the live mount and its root; `path` is a NUL-terminated string
        // (checked above) that outlives the call.
        let file = unsafe { bindings::file_open_root(&root, path.as_ptr().cast(), flags, 0) };
        let file = error::from_err_ptr(file)?;
        // INVARIANT: `file_open_root()` returned an open file.
        NonNull::new(file).map(KernelFile).ok_or(ENOENT)
    }
}

impl Drop for Sysfs {
    fn drop(&mut self) {
        // SAFETY: The mount was made by `kern_mount()` and is unmounted only here (invariant).
        unsafe { bindings::kern_unmount(self.0.as_ptr()) };
    }
}

/// An open file, closed on drop.
///
/// # Invariants
///
/// `0` points to an open file that this object closes.
struct KernelFile(NonNull<bindings::file>);

impl KernelFile {
    /// Reads up to `buf.len()` bytes from the start of the file.
    fn read(&self, buf: &mut [u8]) -> Result<usize> {
        let mut pos: bindings::loff_t = 0;
        // SAFETY: The file is open (invariant); `buf` is valid for `buf.len()` bytes of writes
        // and `pos` for the duration of the call.
        let n = unsafe {
            bindings::kernel_read(
                self.0.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut pos,
            )
        };
        usize::try_from(n).map_err(|_| errno(n))
    }

    /// Writes `buf` at the start of the file; returns the bytes written.
    fn write(&self, buf: &[u8]) -> Result<usize> {
        let mut pos: bindings::loff_t = 0;
        // SAFETY: The file is open (invariant); `buf` is valid for `buf.len()` bytes of reads
        // and `pos` for the duration of the call.
        let n = unsafe {
            bindings::kernel_write(self.0.as_ptr(), buf.as_ptr().cast(), buf.len(), &mut pos)
        };
        usize::try_from(n).map_err(|_| errno(n))
    }
}

impl Drop for KernelFile {
    fn drop(&mut self) {
        // SAFETY: The file is open and closed only here (invariant); a kernel-opened file has
        // no owner id.
        unsafe { bindings::filp_close(self.0.as_ptr(), core::ptr::null_mut()) };
    }
}

/// The error a negative return of `kernel_read()` / `kernel_write()` stands for.
fn errno(ret: isize) -> Error {
    i32::try_from(ret)
        .ok()
        .and_then(|e| error::to_result(e).err())
        .unwrap_or(EIO)
}

/// Appends the decimal digits of `v` to `out` at `*at`.
fn push_decimal(out: &mut [u8], at: &mut usize, v: u32) -> Result {
    let mut digits = [0u8; 10];
    let mut n = 0usize;
    let mut v = v;
    loop {
        let d = digits.get_mut(n).ok_or(EINVAL)?;
        *d = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &d in digits.get(..n).ok_or(EINVAL)?.iter().rev() {
        *out.get_mut(*at).ok_or(ENAMETOOLONG)? = d;
        *at += 1;
    }
    Ok(())
}

/// Appends `part` to `out` at `*at`.
fn push(out: &mut [u8], at: &mut usize, part: &[u8]) -> Result {
    let end = at.checked_add(part.len()).ok_or(EINVAL)?;
    out.get_mut(*at..end)
        .ok_or(ENAMETOOLONG)?
        .copy_from_slice(part);
    *at = end;
    Ok(())
}

/// `bus/pci/slots/PSN[-DUP]/FILE` (below sysfs's root) with a NUL, in `buf`; returns the used part.
fn slot_path<'a>(buf: &'a mut [u8; PATH_LEN], psn: u32, dup: u32, file: &[u8]) -> Result<&'a [u8]> {
    let mut at = 0usize;
    push(buf, &mut at, SLOTS)?;
    push_decimal(buf, &mut at, psn)?;
    if dup != 0 {
        push(buf, &mut at, b"-")?;
        push_decimal(buf, &mut at, dup)?;
    }
    push(buf, &mut at, b"/")?;
    push(buf, &mut at, file)?;
    push(buf, &mut at, b"\0")?;
    buf.get(..at).ok_or(EINVAL)
}

/// Whether the slot `PSN[-DUP]` exists and its `address` file reads `address`.
fn slot_matches(sysfs: &Sysfs, psn: u32, dup: u32, address: &[u8]) -> bool {
    let mut path = [0u8; PATH_LEN];
    let mut got = [0u8; 32];
    let Ok(path) = slot_path(&mut path, psn, dup, b"address") else {
        return false;
    };
    let Ok(n) = sysfs
        .open(path, bindings::O_RDONLY)
        .and_then(|f| f.read(&mut got))
    else {
        return false;
    };
    let got = got.get(..n).unwrap_or(&[]);
    got.strip_suffix(b"\n").unwrap_or(got) == address
}

/// Powers off the hot-plug slot of a port whose Physical Slot Number is `psn` and whose
/// `address` file reads `address` (`DDDD:BB:SS`, the function's name without `.F`): the
/// function in it is removed (driver unbound first) and the slot turned off; returns when
/// done. `ENOENT` when no such slot is found.
///
/// Must be called without any lock the PCI core or the hot-plug driver takes (the rescan/remove
/// lock included): the write waits for the hot-plug driver's work.
pub(crate) fn power_off(sysfs: &Sysfs, psn: u32, address: &[u8]) -> Result {
    let dup = (0..TRIES)
        .find(|&dup| slot_matches(sysfs, psn, dup, address))
        .ok_or(ENOENT)?;
    let mut path = [0u8; PATH_LEN];
    let power = sysfs.open(
        slot_path(&mut path, psn, dup, b"power")?,
        bindings::O_WRONLY,
    )?;
    if power.write(b"0")? != 1 {
        return Err(EIO);
    }
    Ok(())
}
