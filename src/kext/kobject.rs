// SPDX-License-Identifier: GPL-2.0-only

//! Sysfs directories below a device: a plain named one ([`Dir`]) and ones that own data their
//! read-only attributes format ([`DataDir`]).
//!
//! The kernel crate has no kobject abstraction. A [`DataDir<D>`] is a `struct kobject`
//! embedded with its `D` in an allocation the kobject's release callback frees, so the data
//! lives as long as anything (a running `show`, a delayed release) may use it. Deleting a
//! directory waits for running `show` callbacks.

use core::{marker::PhantomData, ptr::NonNull};

use kernel::{
    bindings, container_of, device::Device, page::PAGE_SIZE, prelude::*,
    str::as_char_ptr_in_const_context,
};

use super::sysfs::{self, AttrGroups, Attribute, PageWriter};

/// A directory with no files of its own, holding a reference to its kobject.
///
/// # Invariants
///
/// `0` is a kobject made by `kobject_create_and_add()` whose reference this object owns.
pub(crate) struct Dir(NonNull<bindings::kobject>);

// SAFETY: A kobject may be used and released from any thread.
unsafe impl Send for Dir {}
// SAFETY: `&Dir` only lets the kobject be used as a parent, which the kobject core allows
// from any thread.
unsafe impl Sync for Dir {}

impl Dir {
    /// Makes the directory `name` in the sysfs directory of `parent`.
    pub(crate) fn new(name: &'static CStr, parent: &Device) -> Result<Self> {
        // `Device` is a transparent wrapper of `struct device`.
        let dev = core::ptr::from_ref(parent)
            .cast::<bindings::device>()
            .cast_mut();
        // SAFETY: `parent` is a live device, so its embedded kobject is; `name` is a
        // NUL-terminated static string.
        let kobj = unsafe {
            bindings::kobject_create_and_add(
                as_char_ptr_in_const_context(name),
                &raw mut (*dev).kobj,
            )
        };
        // INVARIANT: A non-null return is a new kobject with one reference, ours.
        NonNull::new(kobj).map(Self).ok_or(ENOMEM)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: By the type invariants this object owns a reference to the kobject.
        unsafe { bindings::kobject_put(self.0.as_ptr()) };
    }
}

/// Formats one attribute from a directory's data.
pub(crate) type ShowFn<D> = fn(&D, &mut PageWriter<'_>) -> Result;

/// A read-only (0444) attribute of a [`DataDir<D>`]; listed with
/// [`sysfs::attribute_groups!`].
#[repr(C)]
pub(crate) struct KobjAttr<D: Send + Sync + 'static> {
    kattr: bindings::kobj_attribute,
    show: ShowFn<D>,
}

// SAFETY: A `KobjAttr` is immutable; the C side only reads it.
unsafe impl<D: Send + Sync + 'static> Sync for KobjAttr<D> {}
// SAFETY: `#[repr(C)]`, starting with a `struct kobj_attribute`, which starts with its
// `struct attribute`; the trampoline finds `Self` from it.
unsafe impl<D: Send + Sync + 'static> Attribute for KobjAttr<D> {}

impl<D: Send + Sync + 'static> KobjAttr<D> {
    /// The attribute `name`, formatted by `show`, readable by root only (0400).
    // `struct attribute` has more fields with CONFIG_DEBUG_LOCK_ALLOC.
    #[allow(clippy::needless_update)]
    pub(crate) const fn root_only(name: &'static CStr, show: ShowFn<D>) -> Self {
        Self {
            kattr: bindings::kobj_attribute {
                attr: bindings::attribute {
                    name: as_char_ptr_in_const_context(name),
                    mode: 0o400,
                    ..pin_init::zeroed()
                },
                __bindgen_anon_1: bindings::kobj_attribute__bindgen_ty_1 {
                    show: Some(Self::show_trampoline),
                },
                __bindgen_anon_2: pin_init::zeroed(),
            },
            show,
        }
    }

    /// The C `show` callback.
    ///
    /// # Safety
    ///
    /// Called by sysfs only, with the kobject of a [`Node<D>`] (the only kobjects whose type
    /// lists `KobjAttr<D>`s), one of its attributes and a `PAGE_SIZE` buffer.
    unsafe extern "C" fn show_trampoline(
        kobj: *mut bindings::kobject,
        attr: *mut bindings::kobj_attribute,
        buf: *mut kernel::ffi::c_char,
    ) -> isize {
        // SAFETY: `attr` is the `kattr` field of a static `Self`.
        let attr = unsafe { &*container_of!(attr, Self, kattr) };
        // SAFETY: `kobj` is the `kobj` field of a live `Node<D>` (sysfs holds a reference
        // during the call).
        let node = unsafe { &*container_of!(kobj, Node<D>, kobj) };
        // SAFETY: sysfs passes a zeroed, writable buffer of `PAGE_SIZE` bytes.
        let buf = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), PAGE_SIZE) };
        let mut out = PageWriter::new(buf);
        let r = (attr.show)(&node.data, &mut out);
        sysfs::to_ssize(r.map(|()| out.len()))
    }
}

/// The kobject type of the [`DataDir<D>`]s whose attributes are `groups`.
///
/// # Invariants
///
/// `ktype.release` is [`release::<D>`] and `ktype.default_groups` a static
/// [`AttrGroups<KobjAttr<D>>`].
#[repr(transparent)]
pub(crate) struct KType<D: Send + Sync + 'static> {
    ktype: bindings::kobj_type,
    _d: PhantomData<D>,
}

// SAFETY: The type is immutable; the C side only reads it.
unsafe impl<D: Send + Sync + 'static> Sync for KType<D> {}

impl<D: Send + Sync + 'static> KType<D> {
    /// The type whose directories hold the attributes of `groups`.
    pub(crate) const fn new(groups: &'static AttrGroups<KobjAttr<D>>) -> Self {
        Self {
            ktype: bindings::kobj_type {
                release: Some(release::<D>),
                // The C `kobj_sysfs_ops` lives forever; taking its address reads nothing.
                sysfs_ops: &raw const bindings::kobj_sysfs_ops,
                default_groups: groups.as_raw(),
                ..pin_init::zeroed()
            },
            _d: PhantomData,
        }
    }
}

/// The allocation of a [`DataDir<D>`].
#[repr(C)]
struct Node<D> {
    kobj: bindings::kobject,
    data: D,
}

/// The kobject release callback of [`KType<D>`]: frees the [`Node<D>`].
///
/// # Safety
///
/// Called by the kobject core once, when the last reference to a `Node<D>`'s kobject goes.
unsafe extern "C" fn release<D>(kobj: *mut bindings::kobject) {
    // SAFETY: Every kobject of a `KType<D>` is the `kobj` field of a leaked `KBox<Node<D>>`.
    let node = unsafe { container_of!(kobj, Node<D>, kobj) };
    // SAFETY: As above; this is the last reference, so the box is freed exactly once.
    drop(unsafe { KBox::from_raw(node) });
}

/// A directory owning a `D` that its attributes format; deleted on drop.
///
/// # Invariants
///
/// `0` is the kobject of a `Node<D>` leaked from a `KBox`, added to sysfs with a
/// [`KType<D>`], to which this object owns a reference.
pub(crate) struct DataDir<D: Send + Sync + 'static>(NonNull<bindings::kobject>, PhantomData<D>);

// SAFETY: The kobject may be deleted and released from any thread; `D` is `Send`.
unsafe impl<D: Send + Sync + 'static> Send for DataDir<D> {}
// SAFETY: `&DataDir` gives no access to the kobject.
unsafe impl<D: Send + Sync + 'static> Sync for DataDir<D> {}

impl<D: Send + Sync + 'static> DataDir<D> {
    /// Makes the directory `name` of type `ktype` in `parent`, owning `data`.
    pub(crate) fn new(
        ktype: &'static KType<D>,
        parent: &Dir,
        name: &CStr,
        data: D,
    ) -> Result<Self> {
        // SAFETY: By the invariants of `Dir` its kobject is live while `parent` is borrowed.
        unsafe { Self::add(ktype, parent.0.as_ptr(), name, data) }
    }

    /// Makes the directory `name` of type `ktype` in the sysfs directory of the device
    /// `parent`, owning `data`.
    pub(crate) fn in_device(
        ktype: &'static KType<D>,
        parent: &Device,
        name: &CStr,
        data: D,
    ) -> Result<Self> {
        // `Device` is a transparent wrapper of `struct device`.
        let dev = core::ptr::from_ref(parent)
            .cast::<bindings::device>()
            .cast_mut();
        // SAFETY: `parent` is a live device, so its embedded kobject is; only its address is
        // taken here.
        let kobj = unsafe { &raw mut (*dev).kobj };
        // SAFETY: The device's kobject is live while `parent` is borrowed.
        unsafe { Self::add(ktype, kobj, name, data) }
    }

    /// Makes the directory below the kobject `parent`.
    ///
    /// # Safety
    ///
    /// `parent` is a live kobject for the duration of the call.
    unsafe fn add(
        ktype: &'static KType<D>,
        parent: *mut bindings::kobject,
        name: &CStr,
        data: D,
    ) -> Result<Self> {
        let node = KBox::new(
            Node {
                // SAFETY: An all-zero kobject is what `kobject_init_and_add()` expects.
                kobj: unsafe { core::mem::zeroed() },
                data,
            },
            GFP_KERNEL,
        )?;
        let raw = KBox::into_raw(node);
        // SAFETY: `raw` is live until its kobject's release, which needs a reference we own.
        let kobj = unsafe { &raw mut (*raw).kobj };
        // SAFETY: `kobj` is a zeroed kobject; `parent` is live (both callers borrow its owner for
        // the call, and the kobject core takes its own reference); the format takes one string,
        // which outlives the call.
        let ret = unsafe {
            bindings::kobject_init_and_add(
                kobj,
                &ktype.ktype,
                parent,
                as_char_ptr_in_const_context(c"%s"),
                name.as_char_ptr(),
            )
        };
        if ret != 0 {
            // SAFETY: Even on failure the kobject was initialised; the put frees the node.
            unsafe { bindings::kobject_put(kobj) };
            return Err(Error::from_errno(ret));
        }
        // INVARIANT: `kobj` is the added kobject of a leaked `Node<D>`; its reference is ours.
        NonNull::new(kobj)
            .map(|k| Self(k, PhantomData))
            .ok_or(EINVAL)
    }
}

impl<D: Send + Sync + 'static> Drop for DataDir<D> {
    fn drop(&mut self) {
        // SAFETY: By the type invariants this object owns a reference to the added kobject;
        // deleting waits for running `show` callbacks, the put may free the node.
        unsafe {
            bindings::kobject_del(self.0.as_ptr());
            bindings::kobject_put(self.0.as_ptr());
        }
    }
}
