// SPDX-License-Identifier: GPL-2.0-only
//! DMA mappings of guest memory announced with DMA_MAP.
//!
//! A mapping that comes with a file descriptor is mmap'ed shared, so the
//! device model can read and write guest memory directly. Our mmap is
//! reference counted: a copy that resolved a range keeps it alive even if
//! the client unmaps it meanwhile, and the pieces a partial unmap leaves
//! share it. What the device may reach is decided by the table alone.
//!
//! Range ends are computed as last bytes (`iova + size - 1`), so a range
//! may end exactly at 2^64 (QEMU unmaps "everything above X" that way).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

pub const FLAG_READ: u32 = 1 << 0;
pub const FLAG_WRITE: u32 = 1 << 1;

/// Our shared mapping of the memory a DMA_MAP came with; unmapped when the
/// last table entry and the last span using it are gone.
struct Backing {
    addr: usize,
    len: usize,
}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: addr/len are exactly what mmap returned and nothing refers
        // into the mapping once the last reference is dropped.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// One entry of the table: `size` (> 0) bytes of IOVA space from `iova`.
/// A partial unmap splits an entry; the pieces share the backing.
#[derive(Clone)]
struct Mapping {
    iova: u64,
    size: u64,
    flags: u32,
    /// Our mapping and the offset of `iova` in it, if an fd came with the
    /// map request.
    host: Option<(Arc<Backing>, usize)>,
}

impl Mapping {
    /// The last IOVA of the mapping (ends are inclusive so a mapping may
    /// reach the top of the 64-bit space).
    fn last(&self) -> u64 {
        self.iova + (self.size - 1)
    }

    fn contains(&self, iova: u64) -> bool {
        iova >= self.iova && iova <= self.last()
    }

    /// The part [first, last] of this mapping (which must lie inside it).
    fn piece(&self, first: u64, last: u64) -> Mapping {
        Mapping {
            iova: first,
            size: last - first + 1,
            flags: self.flags,
            host: self
                .host
                .as_ref()
                .map(|(b, off)| (Arc::clone(b), off + (first - self.iova) as usize)),
        }
    }
}

/// The last IOVA of `size` bytes at `iova`: None for an empty range or one
/// that wraps past the top of the 64-bit space (ending exactly at 2^64 is fine).
fn last_of(iova: u64, size: u64) -> Option<u64> {
    size.checked_sub(1).and_then(|s| iova.checked_add(s))
}

/// `len` bytes of guest memory at `ptr`, inside a mapping kept alive by
/// this value (see `DmaTable::resolve`).
pub struct HostSpan {
    _map: Arc<Backing>,
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
    maps: Vec<Mapping>,
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
        let last = last_of(iova, size).ok_or((
            libc::EINVAL,
            format!("bad DMA range {iova:#x}+{size:#x} (empty or wraps past 2^64)"),
        ))?;
        if let Some(m) = self
            .maps
            .iter()
            .find(|m| iova <= m.last() && m.iova <= last)
        {
            return Err((
                libc::EEXIST,
                format!(
                    "DMA range {iova:#x}+{size:#x} overlaps mapping {:#x}+{:#x}",
                    m.iova, m.size
                ),
            ));
        }
        let host = match fd {
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
                Some((
                    Arc::new(Backing {
                        addr: p as usize,
                        len,
                    }),
                    0,
                ))
            }
        };
        self.maps.push(Mapping {
            iova,
            size,
            flags,
            host,
        });
        Ok(())
    }

    /// Remove exactly [iova, iova+size) from the table (or everything with
    /// `all`): mappings inside it go, mappings that straddle its ends are
    /// cut down to what lies outside it. Returns the number of mappings
    /// removed or cut. A range may end exactly at 2^64; an empty range or
    /// one that wraps is refused.
    pub fn unmap(&mut self, iova: u64, size: u64, all: bool) -> Result<usize, (i32, String)> {
        if all {
            let n = self.maps.len();
            self.maps.clear();
            return Ok(n);
        }
        let last = last_of(iova, size).ok_or((
            libc::EINVAL,
            format!("bad DMA unmap range {iova:#x}+{size:#x} (empty or wraps past 2^64)"),
        ))?;
        let mut touched = 0;
        let mut kept = Vec::with_capacity(self.maps.len() + 1);
        for m in self.maps.drain(..) {
            if m.last() < iova || m.iova > last {
                kept.push(m);
                continue;
            }
            touched += 1;
            if m.iova < iova {
                kept.push(m.piece(m.iova, iova - 1));
            }
            if m.last() > last {
                kept.push(m.piece(last + 1, m.last()));
            }
        }
        self.maps = kept;
        Ok(touched)
    }

    pub fn clear(&mut self) {
        self.maps.clear();
    }

    /// The mappings, in the order they were made (the pieces of a cut
    /// mapping stand where it stood).
    pub fn list(&self) -> Vec<MapInfo> {
        self.maps
            .iter()
            .map(|m| MapInfo {
                iova: m.iova,
                size: m.size,
                flags: m.flags,
                mmapped: m.host.is_some(),
            })
            .collect()
    }

    /// `len` bytes at `iova`, covered without a gap by mmap'ed mappings that
    /// allow the access `need` (FLAG_READ and/or FLAG_WRITE): one span per
    /// mapping, in IOVA order. An IOMMU maps a buffer page by page, so a range
    /// that is contiguous in IOVA space is usually several mappings whose host
    /// memory is not contiguous.
    pub fn resolve(&self, iova: u64, len: usize, need: u32) -> Result<Vec<HostSpan>, String> {
        if len == 0 {
            return Err(format!("DMA range {iova:#x}+0 is empty"));
        }
        last_of(iova, len as u64)
            .ok_or_else(|| format!("DMA range {iova:#x}+{len:#x} wraps past 2^64"))?;
        let mut spans = Vec::new();
        let (mut at, mut left) = (iova, len);
        while left > 0 {
            let m = self
                .maps
                .iter()
                .find(|m| m.contains(at))
                .ok_or_else(|| format!("DMA {iova:#x}+{len:#x}: {at:#x} is not mapped"))?;
            let avail = m.size - (at - m.iova);
            let n = usize::try_from(avail).map_or(left, |a| a.min(left));
            let (backing, ptr) = self.locate(at, n, need)?;
            spans.push(HostSpan {
                _map: backing,
                ptr,
                len: n,
            });
            left -= n;
            if left > 0 {
                // Cannot wrap: the whole range was checked above.
                at += n as u64;
            }
        }
        Ok(spans)
    }

    /// Find the host address for `len` bytes at `iova` within one mapping.
    fn locate(&self, iova: u64, len: usize, need: u32) -> Result<(Arc<Backing>, usize), String> {
        // An empty access must still start inside a mapping.
        let last = last_of(iova, (len as u64).max(1))
            .ok_or_else(|| format!("DMA address {iova:#x}+{len:#x} wraps"))?;
        let m = self
            .maps
            .iter()
            .find(|m| m.contains(iova) && last <= m.last())
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
        let (backing, off) = m
            .host
            .as_ref()
            .ok_or_else(|| format!("DMA mapping {:#x} came without a file descriptor", m.iova))?;
        let ptr = backing.addr + off + (iova - m.iova) as usize;
        Ok((Arc::clone(backing), ptr))
    }

    /// Copy guest memory at `iova` into `buf` (device reads host memory).
    /// The range must lie wholly inside one readable mapping.
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), String> {
        let (_keep, src) = self.locate(iova, buf.len(), FLAG_READ)?;
        // SAFETY: locate() checked the range lies inside a live mapping.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copy `data` into guest memory at `iova` (device writes host memory).
    /// The range must lie wholly inside one writable mapping.
    pub fn write(&self, iova: u64, data: &[u8]) -> Result<(), String> {
        let (_keep, dst) = self.locate(iova, data.len(), FLAG_WRITE)?;
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
    /// `n` bytes of `fd` from `off`, read with pread.
    fn pread(fd: &OwnedFd, off: i64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        // SAFETY: pread into a local buffer of n bytes.
        let r = unsafe { libc::pread(fd.as_raw_fd(), v.as_mut_ptr().cast(), n, off) };
        assert_eq!(r, n as isize);
        v
    }

    fn maps(t: &DmaTable) -> Vec<(u64, u64)> {
        t.list().iter().map(|m| (m.iova, m.size)).collect()
    }

    const TOP: u64 = 0xffff_ffff_ffff_f000;

    #[test]
    fn ranges_ending_at_the_top_of_the_address_space() {
        let mut t = DmaTable::default();
        // A mapping whose end is exactly 2^64 is valid, with and without an fd.
        t.map(TOP, 0x1000, 0, 3, None).expect("last page, no fd");
        t.map(TOP - 0x2000, 0x2000, 0, 3, Some(memfd(0x2000)))
            .expect("the two pages below it");
        assert!(
            t.map(TOP, 0x1000, 0, 3, None).is_err(),
            "overlap at the top"
        );
        t.write(TOP - 8, b"top!")
            .expect("write up to the last mapped byte");
        let mut b = [0u8; 4];
        t.read(TOP - 8, &mut b).expect("read");
        assert_eq!(&b, b"top!");
        assert!(
            t.read(TOP - 4, &mut [0u8; 8]).is_err(),
            "into the fd-less page"
        );
        // Wrapping or empty ranges are refused, by map and unmap alike.
        for (iova, size) in [(TOP, 0x2000), (u64::MAX, 2), (0x1000, 0), (2, u64::MAX)] {
            assert_eq!(
                t.map(iova, size, 0, 3, None).map_err(|e| e.0),
                Err(libc::EINVAL)
            );
            assert_eq!(
                t.unmap(iova, size, false).map_err(|e| e.0),
                Err(libc::EINVAL)
            );
        }
        assert!(t.resolve(u64::MAX, 2, FLAG_READ).is_err(), "wraps");
        assert_eq!(maps(&t).len(), 2, "refused requests change nothing");
        // QEMU's "everything from 0xfef00000 up": iova + size == 2^64.
        t.map(0x1000_0000, 0x1000, 0, 3, None).expect("low map");
        t.map(0xfee0_0000, 0x20_0000, 0, 3, None)
            .expect("straddles 0xfef00000");
        let n = t
            .unmap(0xfef0_0000, 0xffff_ffff_0110_0000, false)
            .expect("unmap to the top");
        assert_eq!(n, 3, "two mappings dropped, one cut");
        assert_eq!(
            maps(&t),
            [(0x1000_0000, 0x1000), (0xfee0_0000, 0x10_0000)],
            "exactly what lies below 0xfef00000 stays"
        );
        // An unmap of the whole space (iova 0, size 2^64 - 1 leaves the last byte).
        t.map(TOP, 0x1000, 0, 3, None).expect("top again");
        assert_eq!(
            t.unmap(0, u64::MAX, false).expect("all but the last byte"),
            3
        );
        assert_eq!(maps(&t), [(u64::MAX, 1)]);
        assert_eq!(t.unmap(u64::MAX, 1, false).expect("last byte"), 1);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn partial_and_multiple_unmaps() {
        let mut t = DmaTable::default();
        let fd = memfd(0x4000);
        t.map(0x10_0000, 0x4000, 0, 3, Some(fd.try_clone().expect("dup")))
            .expect("map 4 pages");
        t.map(0x20_0000, 0x1000, 0, 1, None).expect("a");
        t.map(0x20_2000, 0x1000, 0, 1, None).expect("b");
        t.map(0x20_4000, 0x1000, 0, 1, None).expect("c");
        t.write(0x10_0000, &[1; 0x4000]).expect("fill");
        // Cut the middle of the first: two pieces, still backed by the same memory.
        assert_eq!(t.unmap(0x10_1000, 0x1000, false).expect("hole"), 1);
        assert_eq!(
            maps(&t)[..2],
            [(0x10_0000, 0x1000), (0x10_2000, 0x2000)],
            "the pieces stand where the mapping stood"
        );
        assert!(t.write(0x10_1000, b"x").is_err(), "the hole is gone");
        assert!(
            t.resolve(0x10_0ff0, 0x20, FLAG_READ).is_err(),
            "gap at the hole"
        );
        t.write(0x10_2ffe, b"ab")
            .expect("write into the upper piece");
        assert_eq!(
            pread(&fd, 0x2ffe, 2),
            b"ab",
            "at the right offset of the fd"
        );
        let s = t.resolve(0x10_3ff0, 0x10, FLAG_WRITE).expect("resolve");
        assert_eq!(s.len(), 1);
        // Cut the head and the tail.
        assert_eq!(t.unmap(0x10_0000, 0x800, false).expect("head"), 1);
        assert_eq!(t.unmap(0x10_3800, 0x800, false).expect("tail"), 1);
        assert_eq!(maps(&t)[..2], [(0x10_0800, 0x800), (0x10_2000, 0x1800)]);
        let mut b = [0u8; 2];
        t.read(0x10_2ffe, &mut b).expect("read back");
        assert_eq!(&b, b"ab");
        // The resolved span outlives the unmap of its piece.
        assert_eq!(t.unmap(0x10_2000, 0x2000, false).expect("upper piece"), 1);
        // SAFETY: the span keeps the memory mapped; 16 bytes inside it.
        let first = unsafe { *s[0].ptr() };
        assert_eq!(first, 1);
        drop(s);
        // One unmap over several mappings and the gaps between them, cutting
        // into the last one: exactly what it covers goes.
        assert_eq!(t.unmap(0x20_0000, 0x4800, false).expect("several"), 3);
        assert_eq!(maps(&t), [(0x10_0800, 0x800), (0x20_4800, 0x800)]);
        // An unmap of nothing mapped succeeds and changes nothing.
        assert_eq!(t.unmap(0x30_0000, 0x1000, false).expect("nothing"), 0);
        assert_eq!(t.unmap(0, 0, true).expect("all"), 2);
    }
}
