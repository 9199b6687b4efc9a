// SPDX-License-Identifier: GPL-2.0-only

//! Per-function telemetry in sysfs: `/sys/class/misc/pcifabN/functions/0xPDFID/`, one
//! directory for every function of the fabric (not only those bound to this host), each with
//! `temperature`, `power`, `utilisation` and `health`, read through the MEP with the
//! `FUNCTION_TELEMETRY` extension command (0xF002) when the file is read, at most once a
//! second per function ([`crate::telemetry`]).
//!
//! The kernel crate has no kobject abstraction: [`FnDirs`] owns the directories, each a
//! `struct kobject` embedded in a [`FnDir`] that is freed by the kobject's release callback.
//! The directories are made at probe from the fabric's function list and removed before the
//! character device goes; removing a sysfs directory waits for running `show` callbacks, so
//! none of them sees the endpoint after that.

use core::ptr::addr_of;

use kernel::{
    bindings, container_of, page::PAGE_SIZE, prelude::*, str::as_char_ptr_in_const_context,
    sync::Arc,
};

use crate::{
    sysfs::{PageWriter, SyncStatic},
    telemetry, Mep,
};

/// Formats one file from the telemetry.
type ShowFn = fn(&telemetry::Function, &mut PageWriter<'_>) -> Result;

/// A read-only attribute of a function directory.
#[repr(C)]
struct FnAttr {
    kattr: bindings::kobj_attribute,
    show: ShowFn,
}

impl FnAttr {
    // `struct attribute` has more fields with CONFIG_DEBUG_LOCK_ALLOC.
    #[allow(clippy::needless_update)]
    const fn new(name: &'static CStr, show: ShowFn) -> Self {
        Self {
            kattr: bindings::kobj_attribute {
                attr: bindings::attribute {
                    name: as_char_ptr_in_const_context(name),
                    mode: 0o444,
                    ..pin_init::zeroed()
                },
                __bindgen_anon_1: bindings::kobj_attribute__bindgen_ty_1 {
                    show: Some(show_trampoline),
                },
                __bindgen_anon_2: pin_init::zeroed(),
            },
            show,
        }
    }
}

/// The files, in the order of the ABI document.
static ATTRS: SyncStatic<[FnAttr; 4]> = SyncStatic([
    // Millidegrees Celsius, as hwmon reports temperatures.
    FnAttr::new(c"temperature", |t, o| {
        o.emit(format_args!("{}\n", i64::from(t.temp_centi) * 10))
    }),
    // Microwatts, as hwmon reports power.
    FnAttr::new(c"power", |t, o| {
        o.emit(format_args!("{}\n", u64::from(t.power_mw) * 1000))
    }),
    // Percent, 0-100.
    FnAttr::new(c"utilisation", |t, o| {
        o.emit(format_args!("{}\n", t.utilisation))
    }),
    // Bit 0 link down, bit 1 temperature warning, bit 2 power warning (0x0: healthy).
    FnAttr::new(c"health", |t, o| o.emit(format_args!("{:#x}\n", t.health))),
]);

static ATTR_PTRS: SyncStatic<[*const bindings::attribute; 5]> = SyncStatic({
    let mut p = [core::ptr::null(); 5];
    let mut i = 0;
    while i < 4 {
        p[i] = addr_of!(ATTRS.0[i].kattr.attr);
        i += 1;
    }
    p
});

static GROUP: SyncStatic<bindings::attribute_group> = SyncStatic(bindings::attribute_group {
    __bindgen_anon_2: bindings::attribute_group__bindgen_ty_2 {
        attrs: addr_of!(ATTR_PTRS.0[0]).cast_mut().cast(),
    },
    ..pin_init::zeroed()
});

static GROUPS: SyncStatic<[*const bindings::attribute_group; 2]> =
    SyncStatic([addr_of!(GROUP.0), core::ptr::null()]);

static KTYPE: SyncStatic<bindings::kobj_type> = SyncStatic(bindings::kobj_type {
    release: Some(release),
    // The C `kobj_sysfs_ops` lives forever; taking its address reads nothing.
    sysfs_ops: addr_of!(bindings::kobj_sysfs_ops),
    default_groups: addr_of!(GROUPS.0[0]).cast_mut(),
    ..pin_init::zeroed()
});

/// One function's directory.
///
/// # Invariants
///
/// `kobj` is initialised with [`KTYPE`]; the allocation is a `KBox<FnDir>` leaked at
/// creation and freed by [`release`]. `mep` points to the endpoint of the [`FnDirs`] that made
/// it, which outlives every `show` callback (the directories are deleted first).
#[repr(C)]
struct FnDir {
    kobj: bindings::kobject,
    mep: *const Mep,
    pdfid: u16,
}

/// The kobject release callback: frees the [`FnDir`].
///
/// # Safety
///
/// Called by the kobject core once, when the last reference to a [`FnDir`]'s kobject goes.
unsafe extern "C" fn release(kobj: *mut bindings::kobject) {
    // SAFETY: Every kobject of `KTYPE` is the `kobj` field of a leaked `KBox<FnDir>`.
    let dir = unsafe { container_of!(kobj, FnDir, kobj) };
    // SAFETY: As above; this is the last reference, so the box is freed exactly once.
    drop(unsafe { KBox::from_raw(dir) });
}

/// The C `show` callback of every [`FnAttr`].
///
/// # Safety
///
/// Called by sysfs only, with a kobject of [`KTYPE`], one of [`ATTRS`] and a `PAGE_SIZE`
/// buffer.
unsafe extern "C" fn show_trampoline(
    kobj: *mut bindings::kobject,
    attr: *mut bindings::kobj_attribute,
    buf: *mut kernel::ffi::c_char,
) -> isize {
    // SAFETY: `attr` is the `kattr` field of a static `FnAttr`.
    let attr = unsafe { &*container_of!(attr, FnAttr, kattr) };
    // SAFETY: `kobj` is the `kobj` field of a live `FnDir` (sysfs holds it during the call).
    let dir = unsafe { &*container_of!(kobj, FnDir, kobj) };
    // SAFETY: By the invariants of `FnDir`, the endpoint outlives this callback.
    let mep = unsafe { &*dir.mep };
    // SAFETY: sysfs passes a zeroed, writable buffer of `PAGE_SIZE` bytes.
    let buf = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), PAGE_SIZE) };
    let mut out = PageWriter::new(buf);
    match mep
        .telemetry
        .function(mep, dir.pdfid)
        .and_then(|t| (attr.show)(&t, &mut out))
    {
        Ok(()) => out.len() as isize,
        Err(e) => e.to_errno() as isize,
    }
}

/// The `functions` directory and one directory per function.
///
/// # Invariants
///
/// `parent` is null or a kobject made by `kobject_create_and_add()` that this object holds a
/// reference to; each of `dirs` is a registered [`FnDir`] kobject this object holds a
/// reference to. `_mep` keeps the endpoint the directories point to alive.
pub(crate) struct FnDirs {
    parent: *mut bindings::kobject,
    dirs: KVec<*mut bindings::kobject>,
    _mep: Arc<Mep>,
}

// SAFETY: The raw pointers are only used to delete the kobjects, which the kobject core allows
// from any thread.
unsafe impl Send for FnDirs {}
// SAFETY: `&FnDirs` gives no access to the pointers.
unsafe impl Sync for FnDirs {}

impl FnDirs {
    /// Makes `functions/` under `under` (the misc device's kobject) with one directory per
    /// function the fabric has now. A function that cannot get a directory is logged and
    /// skipped: telemetry files are not worth failing the probe for.
    pub(crate) fn new(mep: Arc<Mep>, under: *mut bindings::kobject) -> Result<Self> {
        let pdfids = mep.fabric.with_view(&mep, |v| -> Result<KVec<u16>> {
            let mut p = KVec::with_capacity(v.functions.len(), GFP_KERNEL)?;
            for f in v.functions.iter() {
                p.push(f.pdfid, GFP_KERNEL)?;
            }
            Ok(p)
        })??;
        // SAFETY: `under` is the live kobject of the registered misc device.
        let parent = unsafe {
            bindings::kobject_create_and_add(as_char_ptr_in_const_context(c"functions"), under)
        };
        if parent.is_null() {
            return Err(ENOMEM);
        }
        // INVARIANT: `parent` holds the reference `kobject_create_and_add()` returned.
        let mut this = Self {
            parent,
            dirs: KVec::with_capacity(pdfids.len(), GFP_KERNEL)?,
            _mep: mep,
        };
        for &pdfid in pdfids.iter() {
            let dir = KBox::new(
                FnDir {
                    // SAFETY: An all-zero kobject is what `kobject_init_and_add()` expects.
                    kobj: unsafe { core::mem::zeroed() },
                    mep: Arc::as_ptr(&this._mep),
                    pdfid,
                },
                GFP_KERNEL,
            )?;
            let raw = KBox::into_raw(dir);
            // SAFETY: `raw` is a fresh `FnDir`; `parent` is live; the format takes one
            // unsigned int.
            let ret = unsafe {
                bindings::kobject_init_and_add(
                    &raw mut (*raw).kobj,
                    &KTYPE.0,
                    parent,
                    as_char_ptr_in_const_context(c"0x%04x"),
                    kernel::ffi::c_uint::from(pdfid),
                )
            };
            // SAFETY: `raw` is live until its kobject's release.
            let kobj = unsafe { &raw mut (*raw).kobj };
            if ret != 0 {
                // SAFETY: Even on failure the kobject was initialised; the put frees it.
                unsafe { bindings::kobject_put(kobj) };
                pr_warn!("no sysfs directory for function {:#06x}\n", pdfid);
                continue;
            }
            this.dirs.push(kobj, GFP_KERNEL)?;
        }
        Ok(this)
    }
}

impl Drop for FnDirs {
    fn drop(&mut self) {
        for &k in self.dirs.iter() {
            // SAFETY: By the invariants this object holds a reference to each registered
            // kobject; deleting waits for running `show` callbacks.
            unsafe {
                bindings::kobject_del(k);
                bindings::kobject_put(k);
            }
        }
        // SAFETY: By the invariants `parent` is a kobject this object holds a reference to.
        unsafe { bindings::kobject_put(self.parent) };
    }
}
