// SPDX-License-Identifier: GPL-2.0-only
//! Device memory of `pcifab-selftest`: a BAR of a PCI function mapped through
//! `/sys/bus/pci/devices/BDF/resourceN` ([`BarMap`]), with volatile accesses.

use std::ffi::CString;

use super::util::{check, usage, Res};

/// A BAR of a PCI function, mapped through `/sys/bus/pci/devices/BDF/resourceN`.
pub struct BarMap {
    pub ptr: *mut u8,
    pub len: usize,
    fd: i32,
}

impl BarMap {
    pub fn words(&self) -> usize {
        self.len / 8
    }

    pub fn read64(&self, i: usize) -> u64 {
        assert!(i < self.words());
        // SAFETY: `i` is inside the mapping, which is 8-byte aligned (page aligned).
        unsafe { std::ptr::read_volatile(self.ptr.cast::<u64>().add(i)) }
    }

    pub fn write64(&self, i: usize, v: u64) {
        assert!(i < self.words());
        // SAFETY: as in `read64`; the mapping is writable.
        unsafe { std::ptr::write_volatile(self.ptr.cast::<u64>().add(i), v) }
    }

    pub fn read32(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: inside the mapping and aligned.
        unsafe { std::ptr::read_volatile(self.ptr.add(off).cast::<u32>()) }
    }
}

impl Drop for BarMap {
    fn drop(&mut self) {
        // SAFETY: the mapping and the descriptor are ours and released once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
            libc::close(self.fd);
        }
    }
}

fn sysfs_dev(bdf: &str) -> String {
    format!("/sys/bus/pci/devices/{bdf}")
}

/// Turns memory decoding on through sysfs `enable` when nobody did (no driver binds these
/// functions in the test guests; without it the BARs read all ones).
fn enable_device(bdf: &str) -> Res<()> {
    let dir = sysfs_dev(bdf);
    let en = std::fs::read_to_string(format!("{dir}/enable"))
        .map_err(|e| check(format!("{dir}/enable: {e}; is {bdf} there?")))?;
    if en.trim() == "0" {
        std::fs::write(format!("{dir}/enable"), "1")
            .map_err(|e| check(format!("writing 1 to {dir}/enable: {e}")))?;
    }
    Ok(())
}

/// Maps BAR `bar` of `bdf` read-write (enabling the device first, see [`enable_device`]).
pub fn map_bar(bdf: &str, bar: u32) -> Res<BarMap> {
    enable_device(bdf)?;
    let path = format!("{}/resource{bar}", sysfs_dev(bdf));
    let c = CString::new(path.as_str()).map_err(|_| usage("device name contains a NUL byte"))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_SYNC | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(check(format!(
            "cannot open {path}: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `st` is written by fstat on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid out pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size <= 0 {
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return Err(check(format!(
            "{path}: expected a BAR of non-zero size, got size {} (BAR unassigned?)",
            st.st_size
        )));
    }
    let len = st.st_size as usize;
    // SAFETY: maps `len` bytes of the open resource file; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return Err(check(format!("mmap of {path} ({len} bytes) failed: {e}")));
    }
    Ok(BarMap {
        ptr: p.cast(),
        len,
        fd,
    })
}
