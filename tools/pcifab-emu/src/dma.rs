// SPDX-License-Identifier: GPL-2.0-only
//! DMA mappings of guest memory announced with DMA_MAP.
//!
//! A mapping that comes with a file descriptor is mmap'ed shared, so the
//! device model can read and write guest memory directly. Mappings are
//! reference counted: a copy that resolved a range keeps its mapping alive
//! even if the client unmaps it meanwhile.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

pub const FLAG_READ: u32 = 1 << 0;
pub const FLAG_WRITE: u32 = 1 << 1;

struct Mapping {
    iova: u64,
    size: u64,
    flags: u32,
    /// Address of our shared mapping, if an fd came with the map request.
    addr: Option<usize>,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Some(addr) = self.addr {
            // SAFETY: addr/size are exactly what mmap returned and nothing
            // refers into the mapping once it is dropped.
            unsafe { libc::munmap(addr as *mut libc::c_void, self.size as usize) };
        }
    }
}

/// `len` bytes of guest memory at `ptr`, inside a mapping kept alive by
/// this value (see `DmaTable::resolve`).
pub struct HostSpan {
    _map: Arc<Mapping>,
    ptr: usize,
    len: usize,
}

impl HostSpan {
    /// Start of the span in our address space.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    /// Bytes in the span.
    pub fn len(&self) -> usize {
        self.len
    }
}

/// One mapping as the control socket shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct MapInfo {
    pub iova: u64,
    pub size: u64,
    pub flags: u32,
    pub mmapped: bool,
}

#[derive(Default)]
pub struct DmaTable {
    maps: Vec<Arc<Mapping>>,
}

impl DmaTable {
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    pub fn map(
        &mut self,
        iova: u64,
        size: u64,
        offset: u64,
        flags: u32,
        fd: Option<OwnedFd>,
    ) -> Result<(), (i32, String)> {
        let end = iova
            .checked_add(size)
            .filter(|_| size > 0)
            .ok_or((libc::EINVAL, format!("bad DMA range {iova:#x}+{size:#x}")))?;
        if let Some(m) = self
            .maps
            .iter()
            .find(|m| iova < m.iova + m.size && m.iova < end)
        {
            return Err((
                libc::EEXIST,
                format!(
                    "DMA range {iova:#x}+{size:#x} overlaps mapping {:#x}+{:#x}",
                    m.iova, m.size
                ),
            ));
        }
        let addr = match fd {
            None => None,
            Some(fd) => {
                let len = usize::try_from(size)
                    .map_err(|_| (libc::EINVAL, format!("DMA size {size:#x} too large")))?;
                let off = libc::off_t::try_from(offset)
                    .map_err(|_| (libc::EINVAL, format!("DMA fd offset {offset:#x} too large")))?;
                let mut prot = 0;
                if flags & FLAG_READ != 0 {
                    prot |= libc::PROT_READ;
                }
                if flags & FLAG_WRITE != 0 {
                    prot |= libc::PROT_WRITE;
                }
                // SAFETY: a fresh shared mapping chosen by the kernel; the fd
                // may be closed afterwards.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        prot,
                        libc::MAP_SHARED,
                        fd.as_raw_fd(),
                        off,
                    )
                };
                if p == libc::MAP_FAILED {
                    let e = std::io::Error::last_os_error();
                    return Err((
                        e.raw_os_error().unwrap_or(libc::EINVAL),
                        format!(
                            "mmap of DMA range {iova:#x}+{size:#x} at fd offset {offset:#x}: {e}"
                        ),
                    ));
                }
                Some(p as usize)
            }
        };
        self.maps.push(Arc::new(Mapping {
            iova,
            size,
            flags,
            addr,
        }));
        Ok(())
    }

    /// Remove the mappings lying inside [iova, iova+size), or all of them.
    pub fn unmap(&mut self, iova: u64, size: u64, all: bool) -> Result<usize, (i32, String)> {
        let before = self.maps.len();
        if all {
            self.maps.clear();
            return Ok(before);
        }
        let end = iova
            .checked_add(size)
            .ok_or((libc::EINVAL, format!("bad DMA range {iova:#x}+{size:#x}")))?;
        if let Some(m) = self.maps.iter().find(|m| {
            let inside = m.iova >= iova && m.iova + m.size <= end;
            let overlaps = m.iova < end && iova < m.iova + m.size;
            overlaps && !inside
        }) {
            return Err((
                libc::EINVAL,
                format!(
                    "unmap of {iova:#x}+{size:#x} would split mapping {:#x}+{:#x}",
                    m.iova, m.size
                ),
            ));
        }
        self.maps
            .retain(|m| !(m.iova >= iova && m.iova + m.size <= end));
        Ok(before - self.maps.len())
    }

    pub fn clear(&mut self) {
        self.maps.clear();
    }

    /// The mappings, in the order they were made.
    pub fn list(&self) -> Vec<MapInfo> {
        self.maps
            .iter()
            .map(|m| MapInfo {
                iova: m.iova,
                size: m.size,
                flags: m.flags,
                mmapped: m.addr.is_some(),
            })
            .collect()
    }

    /// `len` bytes at `iova`, covered without a gap by mmap'ed mappings that
    /// allow the access `need` (FLAG_READ and/or FLAG_WRITE): one span per
    /// mapping, in IOVA order. An IOMMU maps a buffer page by page, so a range
    /// that is contiguous in IOVA space is usually several mappings whose host
    /// memory is not contiguous.
    pub fn resolve(&self, iova: u64, len: usize, need: u32) -> Result<Vec<HostSpan>, String> {
        let mut spans = Vec::new();
        let (mut at, mut left) = (iova, len);
        if len == 0 {
            return Err(format!("DMA range {iova:#x}+0 is empty"));
        }
        while left > 0 {
            let m = self
                .maps
                .iter()
                .find(|m| at >= m.iova && at - m.iova < m.size)
                .ok_or_else(|| format!("DMA {iova:#x}+{len:#x}: {at:#x} is not mapped"))?;
            let n = left.min((m.iova + m.size - at) as usize);
            let (m, ptr) = self.locate(at, n, need)?;
            spans.push(HostSpan {
                _map: Arc::clone(m),
                ptr,
                len: n,
            });
            at += n as u64;
            left -= n;
        }
        Ok(spans)
    }

    /// Find the host address for `len` bytes at `iova` within one mapping.
    fn locate(&self, iova: u64, len: usize, need: u32) -> Result<(&Arc<Mapping>, usize), String> {
        let end = iova
            .checked_add(len as u64)
            .ok_or_else(|| format!("DMA address {iova:#x}+{len:#x} wraps"))?;
        let m = self
            .maps
            .iter()
            .find(|m| iova >= m.iova && end <= m.iova + m.size)
            .ok_or_else(|| format!("DMA {iova:#x}+{len:#x} is not inside one mapping"))?;
        if m.flags & need != need {
            return Err(format!(
                "DMA mapping {:#x} does not allow {}",
                m.iova,
                if need & FLAG_WRITE != 0 {
                    "writes"
                } else {
                    "reads"
                }
            ));
        }
        let base = m
            .addr
            .ok_or_else(|| format!("DMA mapping {:#x} came without a file descriptor", m.iova))?;
        Ok((m, base + (iova - m.iova) as usize))
    }

    /// Copy guest memory at `iova` into `buf` (device reads host memory).
    /// The range must lie wholly inside one readable mapping.
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), String> {
        let (_, src) = self.locate(iova, buf.len(), FLAG_READ)?;
        // SAFETY: locate() checked the range lies inside a live mapping.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copy `data` into guest memory at `iova` (device writes host memory).
    /// The range must lie wholly inside one writable mapping.
    pub fn write(&self, iova: u64, data: &[u8]) -> Result<(), String> {
        let (_, dst) = self.locate(iova, data.len(), FLAG_WRITE)?;
        // SAFETY: locate() checked the range lies inside a live, writable mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
        Ok(())
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    pub fn memfd(size: i64) -> OwnedFd {
        // SAFETY: plain syscalls on a name literal and the fd they return.
        unsafe {
            let fd = libc::memfd_create(c"dma-test".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create failed");
            assert_eq!(libc::ftruncate(fd, size), 0);
            OwnedFd::from_raw_fd(fd)
        }
    }

    #[test]
    fn map_read_write_unmap() {
        let fd = memfd(0x4000);
        let raw = fd.as_raw_fd();
        let dup = fd.try_clone().expect("dup");
        let mut t = DmaTable::default();
        t.map(0x10_0000, 0x2000, 0x1000, FLAG_READ | FLAG_WRITE, Some(dup))
            .expect("map");
        t.write(0x10_0010, b"hello").expect("write");
        let mut back = [0u8; 5];
        // SAFETY: pread into a local buffer.
        let n = unsafe { libc::pread(raw, back.as_mut_ptr().cast(), 5, 0x1010) };
        assert_eq!(n, 5);
        assert_eq!(&back, b"hello");
        let mut via = [0u8; 5];
        t.read(0x10_0010, &mut via).expect("read");
        assert_eq!(&via, b"hello");
        assert!(t.read(0x10_1fff, &mut [0u8; 2]).is_err(), "crosses end");
        assert!(
            t.map(0x10_1000, 0x1000, 0, FLAG_READ, None).is_err(),
            "overlap"
        );
        t.map(0x20_0000, 0x1000, 0, FLAG_READ, None)
            .expect("fd-less map");
        assert!(t.read(0x20_0000, &mut [0u8; 1]).is_err(), "no fd");
        assert!(t.unmap(0x10_0000, 0x1000, false).is_err(), "split");
        // A resolved span outlives the unmap of its mapping.
        let span = t.resolve(0x10_0010, 5, FLAG_READ).expect("resolve");
        assert!(t.resolve(0x10_0000, 0x2001, FLAG_READ).is_err(), "too long");
        assert_eq!(
            t.list(),
            [
                MapInfo {
                    iova: 0x10_0000,
                    size: 0x2000,
                    flags: 3,
                    mmapped: true
                },
                MapInfo {
                    iova: 0x20_0000,
                    size: 0x1000,
                    flags: 1,
                    mmapped: false
                }
            ]
        );
        assert_eq!(t.unmap(0x10_0000, 0x2000, false).expect("unmap"), 1);
        let mut still = [0u8; 5];
        // SAFETY: the span keeps its mapping alive; 5 bytes inside it.
        unsafe { std::ptr::copy_nonoverlapping(span[0].ptr(), still.as_mut_ptr(), 5) };
        assert_eq!(&still, b"hello");
        drop(span);
        let ro = memfd(0x1000);
        t.map(0x30_0000, 0x1000, 0, FLAG_READ, Some(ro))
            .expect("map ro");
        assert!(t.write(0x30_0000, b"x").is_err(), "read-only mapping");
        assert!(t.resolve(0x30_0000, 1, FLAG_WRITE).is_err());
        assert!(t.resolve(0x30_0000, 1, FLAG_READ).is_ok());
        assert_eq!(t.unmap(0x30_0000, 0x1000, false).expect("unmap"), 1);
        assert_eq!(t.unmap(0, 0, true).expect("unmap all"), 1);
        assert_eq!(t.len(), 0);

        // An IOMMU maps page by page: a range contiguous in IOVA space may span several
        // mappings, one span each; a gap is refused.
        t.map(0x40_0000, 0x1000, 0, 3, Some(memfd(0x1000)))
            .expect("map page 0");
        t.map(0x40_1000, 0x1000, 0, 3, Some(memfd(0x1000)))
            .expect("map page 1");
        let spans = t.resolve(0x40_0ff0, 0x20, FLAG_WRITE).expect("two pages");
        assert_eq!(
            spans.iter().map(HostSpan::len).collect::<Vec<_>>(),
            [0x10, 0x10]
        );
        assert!(
            t.resolve(0x40_1ff0, 0x20, FLAG_READ).is_err(),
            "past the end"
        );
        t.map(0x40_3000, 0x1000, 0, 3, Some(memfd(0x1000)))
            .expect("map page 3");
        assert!(
            t.resolve(0x40_1000, 0x3000, FLAG_READ).is_err(),
            "gap at page 2"
        );
    }
}
