// SPDX-License-Identifier: GPL-2.0-only
//! User memory of `pcifab-selftest` with guard pages: [`AnonPages`], an anonymous mapping
//! whose pages can be made inaccessible or read-only, and the `abi` check's [`Arena`] on it,
//! for handing the kernel pointers into good, read-only and inaccessible memory.

use super::util::{check, errno, errno_name, Res};

/// The page size the arenas are laid out in.
pub const PAGE: usize = 4096;

/// `pages` pages of anonymous private memory, read-write until [`AnonPages::protect`] says
/// otherwise; unmapped when dropped.
pub struct AnonPages {
    base: *mut u8,
    pages: usize,
}

impl AnonPages {
    pub fn new(pages: usize) -> Res<AnonPages> {
        // SAFETY: a fresh anonymous private mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(check(format!("mmap: {}", errno_name(errno()))));
        }
        Ok(AnonPages {
            base: p.cast(),
            pages,
        })
    }

    /// The first byte of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn protect(&self, page: usize, prot: i32) -> Res<()> {
        assert!(page < self.pages);
        // SAFETY: the page lies inside the mapping made in `new`.
        if unsafe { libc::mprotect(self.base.add(page * PAGE).cast(), PAGE, prot) } != 0 {
            return Err(check(format!("mprotect: {}", errno_name(errno()))));
        }
        Ok(())
    }
}

impl Drop for AnonPages {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.base.cast(), self.pages * PAGE) };
    }
}

/// Anonymous memory with a known layout: pages 0-1 read-write, page 2 inaccessible, page 3
/// read-only (holding what [`Arena::set_read_only`] put there).
pub struct Arena {
    mem: AnonPages,
}

/// The addresses of the arena's special pages, for building bad arguments.
#[derive(Clone, Copy)]
pub struct Pages {
    pub none: *mut u8,
    pub read_only: *mut u8,
}

/// The arena's read-write bytes, from its base.
pub const ARENA_RW: usize = 2 * PAGE;

impl Arena {
    pub fn new() -> Res<Arena> {
        let a = Arena {
            mem: AnonPages::new(4)?,
        };
        a.mem.protect(2, libc::PROT_NONE)?;
        a.mem.protect(3, libc::PROT_READ)?;
        Ok(a)
    }

    /// The first byte of the arena.
    pub fn base(&self) -> *mut u8 {
        self.mem.base()
    }

    /// Puts `bytes` at the start of the read-only page.
    pub fn set_read_only(&mut self, bytes: &[u8]) -> Res<()> {
        self.mem.protect(3, libc::PROT_READ | libc::PROT_WRITE)?;
        // SAFETY: page 3 is writable now and `bytes` fits in it.
        unsafe {
            std::ptr::write_bytes(self.base().add(3 * PAGE), 0, PAGE);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base().add(3 * PAGE), bytes.len());
        }
        self.mem.protect(3, libc::PROT_READ)
    }

    pub fn rw(&mut self) -> &mut [u8] {
        // SAFETY: the first two pages are read-write and only reachable through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.base(), ARENA_RW) }
    }

    pub fn pages(&self) -> Pages {
        // SAFETY: both addresses lie inside the mapping.
        unsafe {
            Pages {
                none: self.base().add(2 * PAGE),
                read_only: self.base().add(3 * PAGE),
            }
        }
    }
}
