// SPDX-License-Identifier: GPL-2.0-only

//! User memory pinned and mapped for a device's DMA.
//!
//! The kernel crate maps kernel memory for DMA ([`kernel::dma::Coherent`],
//! [`kernel::scatterlist::SGTable`] of owned pages) but has no way to pin a user buffer and
//! map it, which a device copying to or from a process's memory needs. [`UserPages`] pins the
//! pages of a range of the calling task's memory (`pin_user_pages_fast()` with
//! `FOLL_LONGTERM`: a copy may hold them for minutes), with no lock of
//! the driver held; [`UserPages::map`] then builds a scatter-gather table over them and maps
//! it for a bound device ([`UserDma`]). Dropping the mapping unmaps it; dropping the pages
//! unpins them (marking them dirty when the device wrote to them).

use core::{marker::PhantomData, mem::ManuallyDrop};

use kernel::{
    bindings,
    device::{Bound, Device},
    dma::DataDirection,
    error::to_result,
    page::PAGE_SIZE,
    prelude::*,
    scatterlist::SGTable,
    sync::aref::ARef,
};

/// A user buffer's pages, pinned; unpinned on drop.
///
/// Pinning faults the pages in, which may take as long as the process's memory makes it take
/// (a file system, a userfaultfd range): it is done before any lock of the driver is taken,
/// and [`UserPages::map`] maps the pinned pages for a device afterwards.
///
/// # Invariants
///
/// `pages` holds pages pinned with `pin_user_pages_fast()` (`FOLL_LONGTERM`) and owned by this
/// object; they
/// hold the `len` bytes at `addr`, the first at offset `addr % PAGE_SIZE`.
pub(crate) struct UserPages {
    pages: KVec<*mut bindings::page>,
    addr: u64,
    len: usize,
    dir: DataDirection,
}

impl UserPages {
    /// Pins the `len` bytes of the calling task's memory at `addr`, for a device that reads
    /// them (`ToDevice`) or writes them (`FromDevice`).
    ///
    /// # Errors
    ///
    /// `EFAULT` if the range is not all mapped user memory (writable for `FromDevice`),
    /// `EINVAL` for a range too large, `ENOMEM`.
    pub(crate) fn pin(addr: u64, len: usize, dir: DataDirection) -> Result<Self> {
        let page = PAGE_SIZE as u64;
        let first = addr & !(page - 1);
        let end = addr
            .checked_add(u64::try_from(len).map_err(|_| EINVAL)?)
            .ok_or(EFAULT)?;
        let npages = usize::try_from((end - first).div_ceil(page)).map_err(|_| EINVAL)?;
        let nr = i32::try_from(npages).map_err(|_| EINVAL)?;
        let mut pages = KVec::from_elem(core::ptr::null_mut(), npages, GFP_KERNEL)?;
        // Long-term: the pages stay pinned for as long as the copy runs, up to its timeout,
        // which the kernel must know so it first moves them out of movable and CMA memory
        // (whose pages must stay migratable) and refuses file pages it cannot write back.
        let gup = bindings::FOLL_LONGTERM
            | match dir {
                DataDirection::ToDevice => 0,
                _ => bindings::FOLL_WRITE,
            };
        let start = usize::try_from(first).map_err(|_| EFAULT)?;
        // SAFETY: `pages` has room for `npages` pointers; the range is user memory of the
        // calling task, which the function checks; `gup` holds only `FOLL_LONGTERM` and
        // `FOLL_WRITE`, flags the function takes (it adds `FOLL_PIN` itself).
        let got = unsafe { bindings::pin_user_pages_fast(start, nr, gup, pages.as_mut_ptr()) };
        // A negative return is the reason nothing was pinned (`EFAULT`, or `ENOMEM` and
        // `EINTR` from a long-term pin's migration).
        if got < 0 {
            return Err(Error::from_errno(got));
        }
        let got = usize::try_from(got).unwrap_or(0);
        // INVARIANT: Only the pages pinned are kept, so only those are unpinned.
        pages.truncate(got.min(npages));
        let this = Self {
            pages,
            addr,
            len,
            dir,
        };
        if got < npages {
            return Err(EFAULT);
        }
        Ok(this)
    }

    /// Bytes of the buffer.
    pub(crate) fn bytes(&self) -> usize {
        self.len
    }

    /// Maps the pages for `dev`, which is bound for `'a`; unmapped when the result is dropped.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or the DMA mapping's error.
    pub(crate) fn map<'a>(&'a mut self, dev: &'a Device<Bound>) -> Result<UserDma<'a>> {
        let sgt = self.map_table(dev)?;
        // INVARIANT: `map_table` built the table over `self`'s pages and mapped it for `dev`
        // in `self.dir`; they stay borrowed for `'a`.
        Ok(UserDma {
            dev,
            _pages: PhantomData,
            sgt,
            dir: self.dir,
        })
    }

    /// Builds a scatter-gather table over the pages and maps it for `dev` in the pages'
    /// direction: the one way both [`UserPages::map`] and [`UserPages::map_held`] map. The
    /// caller unmaps it for `dev` with `dma_unmap_sgtable()` and frees it with
    /// `sg_free_table()` before the pages are unpinned.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or the DMA mapping's error; nothing is left allocated or mapped then.
    fn map_table(&mut self, dev: &Device<Bound>) -> Result<bindings::sg_table> {
        let page = PAGE_SIZE as u64;
        let nr = u32::try_from(self.pages.len()).map_err(|_| EINVAL)?;
        let (offset, len) = ((self.addr & (page - 1)) as u32, self.len);
        // SAFETY: An all-zero `sg_table` is the empty table `sg_alloc_table*()` fills in.
        let mut sgt: bindings::sg_table = unsafe { core::mem::zeroed() };
        // SAFETY: `sgt` is zeroed and owned; `pages` are `nr` pinned pages that hold `len`
        // bytes from `offset`, which is below a page (invariant of `UserPages`).
        to_result(unsafe {
            bindings::sg_alloc_table_from_pages_segment(
                &mut sgt,
                self.pages.as_mut_ptr(),
                nr,
                offset,
                len,
                !(PAGE_SIZE as u32 - 1),
                bindings::GFP_KERNEL,
            )
        })?;
        let raw = core::ptr::from_ref::<Device>(dev)
            .cast::<bindings::device>()
            .cast_mut();
        // SAFETY: `dev` is bound for this call and `sgt` a valid table.
        let r = to_result(unsafe { bindings::dma_map_sgtable(raw, &mut sgt, self.dir.into(), 0) });
        if let Err(e) = r {
            // SAFETY: Allocated above and not mapped; freed once.
            unsafe { bindings::sg_free_table(&mut sgt) };
            return Err(e);
        }
        Ok(sgt)
    }
}

// SAFETY: The pinned pages are owned by the `UserPages` and touched only through `&mut self`
// or on drop (the unpin); nothing in them is tied to the task that pinned them.
unsafe impl Send for UserPages {}

impl Drop for UserPages {
    fn drop(&mut self) {
        if !self.pages.is_empty() {
            // SAFETY: Each page was pinned by `pin_user_pages_fast()` and is unpinned once; the
            // device wrote to them only for a device-to-memory mapping, so they are dirtied then.
            unsafe {
                bindings::unpin_user_pages_dirty_lock(
                    self.pages.as_mut_ptr(),
                    self.pages.len(),
                    !matches!(self.dir, DataDirection::ToDevice),
                )
            };
        }
    }
}

/// Pinned user pages mapped for `dev`; unmapped on drop (the pages stay pinned until their
/// [`UserPages`] is dropped).
///
/// # Invariants
///
/// `sgt` is a table over the borrowed pages allocated by `sg_alloc_table_from_pages_segment()` and
/// mapped with `dma_map_sgtable()` for `dev` in direction `dir`. `dev` is bound for `'a`.
pub(crate) struct UserDma<'a> {
    dev: &'a Device<Bound>,
    /// The pages stay borrowed, so pinned, while they are mapped.
    _pages: PhantomData<&'a mut UserPages>,
    sgt: bindings::sg_table,
    dir: DataDirection,
}

impl UserDma<'_> {
    /// The mapped segments: bus address and length.
    pub(crate) fn segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        // SAFETY: `sgt` is a valid, DMA-mapped table (type invariant) that lives as long as
        // the returned borrow.
        let t = unsafe { SGTable::from_raw(core::ptr::from_ref(&self.sgt).cast_mut()) };
        t.iter().map(|s| (s.dma_address(), s.dma_len()))
    }
}

impl Drop for UserDma<'_> {
    fn drop(&mut self) {
        let raw = core::ptr::from_ref::<Device>(self.dev)
            .cast::<bindings::device>()
            .cast_mut();
        // SAFETY: Mapped for `dev`, which is still bound, with `dir`, and allocated by
        // `sg_alloc_table_from_pages_segment()` (type invariant); unmapped and freed once.
        unsafe {
            bindings::dma_unmap_sgtable(raw, &mut self.sgt, self.dir.into(), 0);
            bindings::sg_free_table(&mut self.sgt);
        }
    }
}

/// Pinned user pages mapped for a device for longer than one call (a buffer registered for a
/// peer host to write into).
///
/// Only [`HeldDma::release`], given the device bound, unmaps and unpins them ([`HeldDma::unmap`]
/// unmaps them and hands the pages back, still pinned). Dropped without either, the mapping
/// and the pages are kept for good: the device (or a peer writing through it) may still
/// reach them, so a leak is the safe outcome.
///
/// # Invariants
///
/// `sgt` is a table over the pages of `pages` allocated by
/// `sg_alloc_table_from_pages_segment()` and mapped with `dma_map_sgtable()` for `dev` in
/// `pages.dir`; `pages` is dropped only by [`HeldDma::release`] and moved out only by
/// [`HeldDma::unmap`], each after the unmap.
pub(crate) struct HeldDma {
    dev: ARef<Device>,
    pages: ManuallyDrop<UserPages>,
    sgt: bindings::sg_table,
}

// SAFETY: The pages and the table are owned by the `HeldDma` and touched only through
// `&mut self` or `self`; nothing in them is tied to the task that made them.
unsafe impl Send for HeldDma {}
// SAFETY: `&HeldDma` only reads the table (`segments`).
unsafe impl Sync for HeldDma {}

impl UserPages {
    /// Maps the pages for `dev` until [`HeldDma::release`].
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or the DMA mapping's error; the pages are unpinned then.
    pub(crate) fn map_held(mut self, dev: &Device<Bound>) -> Result<HeldDma> {
        let sgt = self.map_table(dev)?;
        // INVARIANT: `map_table` built the table over these pages and mapped it for `dev`
        // in `self.dir`.
        Ok(HeldDma {
            dev: dev.into(),
            pages: ManuallyDrop::new(self),
            sgt,
        })
    }
}

impl HeldDma {
    /// The mapped segments: bus address and length.
    pub(crate) fn segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        // SAFETY: `sgt` is a valid, DMA-mapped table (type invariant) that lives as long as
        // the returned borrow.
        let t = unsafe { SGTable::from_raw(core::ptr::from_ref(&self.sgt).cast_mut()) };
        t.iter().map(|s| (s.dma_address(), s.dma_len()))
    }

    /// Bytes of the buffer.
    pub(crate) fn bytes(&self) -> usize {
        self.pages.bytes()
    }

    /// Unmaps the buffer for `dev`, which must be the device it was mapped for (else it is
    /// kept for good, `None`), and returns its pages, still pinned.
    pub(crate) fn unmap(mut self, dev: &Device<Bound>) -> Option<UserPages> {
        if !core::ptr::eq(core::ptr::from_ref::<Device>(dev), &*self.dev) {
            return None;
        }
        let raw = core::ptr::from_ref::<Device>(dev)
            .cast::<bindings::device>()
            .cast_mut();
        // SAFETY: Mapped for `dev` (type invariant), which the caller proves bound, in the
        // pages' direction; unmapped and freed once, as `self` is consumed.
        unsafe {
            bindings::dma_unmap_sgtable(raw, &mut self.sgt, self.pages.dir.into(), 0);
            bindings::sg_free_table(&mut self.sgt);
        }
        // `HeldDma` has no `Drop`: the pages move out, pinned, and unpin when dropped.
        let HeldDma { pages, .. } = self;
        Some(ManuallyDrop::into_inner(pages))
    }

    /// Unmaps the buffer for `dev`, which must be the device it was mapped for (else it is
    /// kept for good), then unpins its pages.
    pub(crate) fn release(mut self, dev: &Device<Bound>) {
        let raw = core::ptr::from_ref::<Device>(dev)
            .cast::<bindings::device>()
            .cast_mut();
        if !core::ptr::eq(core::ptr::from_ref::<Device>(dev), &*self.dev) {
            return;
        }
        let dir = self.pages.dir;
        // SAFETY: Mapped for `dev` (type invariant), which the caller proves bound, with
        // `dir`; unmapped and freed once, as `self` is consumed.
        unsafe {
            bindings::dma_unmap_sgtable(raw, &mut self.sgt, dir.into(), 0);
            bindings::sg_free_table(&mut self.sgt);
        }
        // SAFETY: Dropped once, here, after the unmap; `self` is consumed and `Drop` of
        // `HeldDma` never touches `pages`.
        unsafe { ManuallyDrop::drop(&mut self.pages) };
    }
}
