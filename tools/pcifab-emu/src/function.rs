// SPDX-License-Identifier: GPL-2.0-only
//! Endpoint functions (PFs and VFs) as GPU-like PCI devices, each served on
//! its own vfio-user socket so QEMU can hot-plug it into the host it is
//! bound to (see Documentation/emulator.rst, "Function servers").
//!
//! BAR0 holds a few registers and the MSI-X table; BAR2 is the aperture of
//! the function's device memory (its first `mem_mib`), a slice of one memfd
//! per endpoint, offered to the client for mmap. P2P routes and the MEPs'
//! DMA engines reach all of the device memory (`dev_mem_mib`).

use crate::dma::DmaTable;
use crate::irq::Irqs;
use crate::model::Model;
use crate::pci::{self, ConfigSpace, FunctionIds};
use crate::vfio_user::Device;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub const REGION_BAR0: u32 = 0;
pub const REGION_BAR2: u32 = 2;
pub const REGION_BAR4: u32 = 4;
pub const REGION_CONFIG: u32 = 7;

// BAR0 registers.
pub const REG_ID: u64 = 0x0;
pub const REG_PDFID: u64 = 0x4;
pub const REG_MEM_SIZE: u64 = 0x8;
pub const REG_TEMP: u64 = 0x10;
pub const REG_POWER: u64 = 0x14;
pub const REG_UTIL: u64 = 0x18;
pub const REG_HEALTH: u64 = 0x1c;
pub const SCRATCH: u64 = 0x100;
pub const SCRATCH_SIZE: usize = 0x100;

/// The device memory of one endpoint: a memfd, mapped here too.
pub struct Memory {
    fd: OwnedFd,
    addr: usize,
    size: usize,
}

// SAFETY: the mapping is plain shared memory owned by this struct; accesses
// go through raw pointer copies that stay inside it.
unsafe impl Send for Memory {}
// SAFETY: as above; concurrent accesses are racy by nature (the guest
// shares the memory) but never leave the mapping.
unsafe impl Sync for Memory {}

impl Memory {
    pub fn new(name: &str, size: usize) -> Result<Memory, String> {
        let cname = std::ffi::CString::new(name).map_err(|_| "bad memfd name".to_owned())?;
        // SAFETY: plain system call with a valid C string.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if size == 0 {
            // No device memory (an nvme endpoint): nothing to map; every
            // access of one byte or more is out of range.
            return Ok(Memory {
                fd,
                addr: std::ptr::NonNull::<u8>::dangling().as_ptr() as usize,
                size,
            });
        }
        // SAFETY: plain system call on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(format!(
                "ftruncate memfd: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a fresh shared mapping of our memfd chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap memfd: {}", std::io::Error::last_os_error()));
        }
        Ok(Memory {
            fd,
            addr: p as usize,
            size,
        })
    }

    fn range(&self, off: u64, len: usize) -> Result<usize, String> {
        usize::try_from(off)
            .ok()
            .filter(|&o| o.checked_add(len).is_some_and(|e| e <= self.size))
            .ok_or_else(|| format!("memory access of {len} bytes at {off:#x} out of range"))
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), String> {
        let o = self.range(off, buf.len())?;
        // SAFETY: o..o+len lies inside our mapping (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping((self.addr + o) as *const u8, buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    pub fn write(&self, off: u64, data: &[u8]) -> Result<(), String> {
        let o = self.range(off, data.len())?;
        // SAFETY: o..o+len lies inside our mapping (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (self.addr + o) as *mut u8, data.len())
        };
        Ok(())
    }

    /// Address of `len` bytes at `off` of the mapping, for copies that go
    /// straight between two mappings. The memory lives as long as `self`.
    pub fn ptr(&self, off: u64, len: usize) -> Result<*mut u8, String> {
        let o = self.range(off, len)?;
        Ok((self.addr + o) as *mut u8)
    }

    /// Zero `len` bytes at `off`. The whole pages inside the range are given back to the
    /// kernel (a hole punched into the memfd reads as zeros in every mapping of it, ours
    /// and QEMU's), so the cost follows the pages that were ever written rather than the
    /// size; the partial pages at the ends, or all of it where the kernel cannot punch
    /// holes, are written with zeros.
    pub fn zero(&self, off: u64, len: usize) -> Result<(), String> {
        let o = self.range(off, len)?;
        let end = o + len; // cannot overflow: range() checked it against the size
        let page = page_size();
        let (first, last) = (o.next_multiple_of(page), end - end % page);
        let punched = first < last && self.punch(first, last - first);
        let fill = |from: usize, to: usize| {
            // SAFETY: from..to lies inside o..end, inside our mapping (checked above).
            unsafe { std::ptr::write_bytes((self.addr + from) as *mut u8, 0, to - from) };
        };
        if punched {
            fill(o, first);
            fill(last, end);
            self.populate(first, last - first);
        } else {
            fill(o, end);
        }
        Ok(())
    }

    /// Gives the pages of `len` bytes at `off` back to the file in the background, as zeros,
    /// so device memory stays memory that is there (no page faults in the next copy, as
    /// before the hole). Allocating never changes what a page holds: a write that lands
    /// first keeps its data. A failure only costs those faults.
    fn populate(&self, off: usize, len: usize) {
        let (Ok(o), Ok(l), Ok(fd)) = (
            libc::off_t::try_from(off),
            libc::off_t::try_from(len),
            self.fd.try_clone(),
        ) else {
            return;
        };
        std::thread::spawn(move || {
            // SAFETY: plain system call on a descriptor this thread owns.
            unsafe { libc::fallocate(fd.as_raw_fd(), 0, o, l) };
        });
    }

    /// Punch a hole of `len` bytes at page-aligned `off` into the memfd; false if the
    /// kernel refused (the caller then writes zeros).
    fn punch(&self, off: usize, len: usize) -> bool {
        let (Ok(o), Ok(l)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
            return false;
        };
        // SAFETY: plain system call on our descriptor; the range is inside the file.
        let r = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                o,
                l,
            )
        };
        r == 0
    }

    pub fn dup_fd(&self) -> Option<OwnedFd> {
        self.fd.try_clone().ok()
    }
}

/// The page size of this machine (4 KiB where the kernel will not say).
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

impl Drop for Memory {
    fn drop(&mut self) {
        if self.size == 0 {
            return;
        }
        // SAFETY: exactly the mapping mmap returned; nothing refers into it.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.size) };
    }
}

struct Inner {
    cfg: ConfigSpace,
    scratch: [u8; SCRATCH_SIZE],
    /// BAR4: MSI-X table and PBA.
    msix: Vec<u8>,
    irqs: Irqs,
    dma: DmaTable,
}

fn new_msix() -> Vec<u8> {
    let mut m = vec![0u8; pci::FN_BAR4_SIZE as usize];
    for v in 0..usize::from(pci::MSIX_VECTORS) {
        m[pci::FN_MSIX_TABLE as usize + 16 * v + 12] = 1; // masked
    }
    m
}

/// One endpoint function as a PCI device.
pub struct FnDevice {
    pub pdfid: u16,
    pub name: String,
    ids: FunctionIds,
    mem: Arc<Memory>,
    mem_off: u64,
    /// Device memory in bytes, at least the BAR2 size (`ids.mem_size`).
    dev_size: u64,
    model: Arc<Mutex<Model>>,
    inner: Mutex<Inner>,
    pub connected: AtomicBool,
}

impl FnDevice {
    pub fn new(
        pdfid: u16,
        ids: FunctionIds,
        mem: Arc<Memory>,
        mem_off: u64,
        dev_size: u64,
        model: Arc<Mutex<Model>>,
    ) -> FnDevice {
        FnDevice {
            pdfid,
            name: format!("fn-{pdfid:04x}"),
            inner: Mutex::new(Inner {
                cfg: ConfigSpace::function(&ids),
                scratch: [0; SCRATCH_SIZE],
                msix: new_msix(),
                irqs: Irqs::new(),
                dma: DmaTable::default(),
            }),
            dev_size: dev_size.max(ids.mem_size),
            ids,
            mem,
            mem_off,
            model,
            connected: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn mem_size(&self) -> u64 {
        self.ids.mem_size
    }

    /// Size of the device memory in bytes (BAR2 shows its start).
    pub fn dev_mem_size(&self) -> u64 {
        self.dev_size
    }

    /// Zero the device memory and the scratch registers: the function left
    /// its owner.
    pub fn scrub(&self) -> Result<(), String> {
        self.lock().scratch = [0; SCRATCH_SIZE];
        self.mem.zero(self.mem_off, self.dev_size as usize)
    }

    fn check_dev(&self, off: u64, len: usize) -> Result<u64, String> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.dev_size => Ok(self.mem_off + off),
            _ => Err(format!(
                "device memory access of {len} bytes at {off:#x} is outside {} of its {:#x} bytes",
                self.name, self.dev_size
            )),
        }
    }

    /// Read device memory (all of it, not only the BAR2 aperture).
    pub fn dev_read(&self, off: u64, buf: &mut [u8]) -> Result<(), String> {
        let o = self.check_dev(off, buf.len())?;
        self.mem.read(o, buf)
    }

    /// Write device memory (all of it, not only the BAR2 aperture).
    pub fn dev_write(&self, off: u64, data: &[u8]) -> Result<(), String> {
        let o = self.check_dev(off, data.len())?;
        self.mem.write(o, data)
    }

    /// Address of `len` bytes of device memory at `off`; valid as long as
    /// this function exists (it never goes away).
    pub fn dev_ptr(&self, off: u64, len: usize) -> Result<*mut u8, String> {
        let o = self.check_dev(off, len)?;
        self.mem.ptr(o, len)
    }

    /// Read the device memory (BAR2) directly, for tests.
    pub fn mem_read(&self, off: u64, buf: &mut [u8]) -> Result<(), String> {
        self.check_mem(off, buf.len())?;
        self.mem.read(self.mem_off + off, buf)
    }

    fn check_mem(&self, off: u64, len: usize) -> Result<(), String> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.ids.mem_size => Ok(()),
            _ => Err(format!(
                "BAR2 access of {len} bytes at {off:#x} is outside its {:#x} bytes",
                self.ids.mem_size
            )),
        }
    }

    fn bar0_regs(&self, inner: &Inner) -> Vec<u8> {
        let mut r = vec![0u8; pci::FN_BAR0_SIZE as usize];
        let put = |r: &mut Vec<u8>, off: u64, v: u32| {
            r[off as usize..off as usize + 4].copy_from_slice(&v.to_le_bytes())
        };
        put(
            &mut r,
            REG_ID,
            u32::from(self.ids.did) << 16 | u32::from(self.ids.vid),
        );
        put(&mut r, REG_PDFID, u32::from(self.pdfid));
        put(&mut r, REG_MEM_SIZE, self.ids.mem_size as u32);
        let m = self.model.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = m.function(self.pdfid) {
            let (t, p, u, h) = m.telemetry(f);
            put(&mut r, REG_TEMP, t as u32);
            put(&mut r, REG_POWER, p);
            put(&mut r, REG_UTIL, u32::from(u));
            put(&mut r, REG_HEALTH, h);
        }
        drop(m);
        r[SCRATCH as usize..SCRATCH as usize + SCRATCH_SIZE].copy_from_slice(&inner.scratch);
        r
    }
}

fn to_usize(off: u64) -> Result<usize, String> {
    usize::try_from(off).map_err(|_| format!("offset {off:#x} too large"))
}

impl Device for FnDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn region_size(&self, index: u32) -> u64 {
        match index {
            REGION_BAR0 => pci::FN_BAR0_SIZE,
            REGION_BAR2 => self.ids.mem_size,
            REGION_BAR4 if pci::FN_MSIX => pci::FN_BAR4_SIZE,
            REGION_CONFIG => pci::CONFIG_SIZE as u64,
            _ => 0,
        }
    }

    fn region_mmap(&self, index: u32) -> Option<(OwnedFd, u64)> {
        (index == REGION_BAR2 && self.ids.mem_size != 0)
            .then(|| self.mem.dup_fd())
            .flatten()
            .map(|fd| (fd, self.mem_off))
    }

    fn region_read(&self, region: u32, off: u64, buf: &mut [u8]) -> Result<(), String> {
        match region {
            REGION_CONFIG => self.lock().cfg.read(to_usize(off)?, buf),
            REGION_BAR2 => self.mem_read(off, buf),
            REGION_BAR0 => {
                let end = off
                    .checked_add(buf.len() as u64)
                    .filter(|&e| e <= pci::FN_BAR0_SIZE)
                    .ok_or_else(|| {
                        format!(
                            "BAR0 access of {} bytes at {off:#x} out of range",
                            buf.len()
                        )
                    })?;
                let inner = self.lock();
                let all = self.bar0_regs(&inner);
                buf.copy_from_slice(&all[off as usize..end as usize]);
                Ok(())
            }
            REGION_BAR4 => {
                let o = to_usize(off)?;
                let inner = self.lock();
                let src = inner
                    .msix
                    .get(o..o.saturating_add(buf.len()))
                    .ok_or_else(|| {
                        format!(
                            "BAR4 access of {} bytes at {off:#x} out of range",
                            buf.len()
                        )
                    })?;
                buf.copy_from_slice(src);
                Ok(())
            }
            _ => Err(format!("region {region} has no space")),
        }
    }

    fn region_write(&self, region: u32, off: u64, data: &[u8]) -> Result<(), String> {
        match region {
            REGION_CONFIG => self.lock().cfg.write(to_usize(off)?, data),
            REGION_BAR2 => {
                self.check_mem(off, data.len())?;
                self.mem.write(self.mem_off + off, data)
            }
            REGION_BAR0 => {
                let end = off
                    .checked_add(data.len() as u64)
                    .filter(|&e| e <= pci::FN_BAR0_SIZE)
                    .ok_or_else(|| {
                        format!(
                            "BAR0 access of {} bytes at {off:#x} out of range",
                            data.len()
                        )
                    })?;
                let mut inner = self.lock();
                let s = SCRATCH as usize;
                for (a, &b) in (off as usize..end as usize).zip(data) {
                    if (s..s + SCRATCH_SIZE).contains(&a) {
                        inner.scratch[a - s] = b;
                    }
                }
                Ok(())
            }
            REGION_BAR4 => {
                let o = to_usize(off)?;
                let t = pci::FN_MSIX_TABLE as usize;
                let table_end = t + 16 * usize::from(pci::MSIX_VECTORS);
                let end = o
                    .checked_add(data.len())
                    .filter(|&e| e <= pci::FN_BAR4_SIZE as usize)
                    .ok_or_else(|| {
                        format!(
                            "BAR4 access of {} bytes at {off:#x} out of range",
                            data.len()
                        )
                    })?;
                if o >= t && end <= table_end {
                    self.lock().msix[o..end].copy_from_slice(data);
                }
                Ok(())
            }
            _ => Err(format!("region {region} has no space")),
        }
    }

    fn reset(&self) {
        let mut inner = self.lock();
        inner.cfg = ConfigSpace::function(&self.ids);
        inner.scratch = [0; SCRATCH_SIZE];
        inner.msix = new_msix();
        info!("{}: device reset", self.name);
    }

    fn irqs(&self, f: &mut dyn FnMut(&mut Irqs)) {
        f(&mut self.lock().irqs)
    }

    fn dma(&self, f: &mut dyn FnMut(&mut DmaTable)) {
        f(&mut self.lock().dma)
    }

    fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::Relaxed);
    }

    fn disconnect(&self) {
        let mut inner = self.lock();
        inner.irqs.clear();
        inner.dma.clear();
        self.connected.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Memory;

    /// Zeroing punches the whole pages and writes the partial ones: every byte of the
    /// range reads zero afterwards and no byte outside it changed.
    #[test]
    fn zero_clears_exactly_the_range() {
        let size = 64 * 1024;
        let m = Memory::new("zero-test", size).unwrap();
        let pattern: Vec<u8> = (0..size).map(|i| (i % 251) as u8 + 1).collect();
        for (off, len) in [(100, 20_000), (0, size), (4096, 8192), (5000, 10), (0, 0)] {
            m.write(0, &pattern).unwrap();
            m.zero(off as u64, len).unwrap();
            let mut back = vec![0u8; size];
            m.read(0, &mut back).unwrap();
            for (i, (&b, &p)) in back.iter().zip(&pattern).enumerate() {
                let want = if (off..off + len).contains(&i) { 0 } else { p };
                assert_eq!(b, want, "byte {i} after zero({off}, {len})");
            }
        }
        assert!(m.zero(size as u64 - 1, 2).is_err());
    }
}
