// SPDX-License-Identifier: GPL-2.0-only

//! Static sysfs attribute groups and the page a `show` callback fills.
//!
//! The kernel crate has no sysfs attribute abstraction. Attributes here are static tables, as
//! C drivers declare them: an attribute type ([`crate::kext::miscdev::DeviceAttr`],
//! [`crate::kext::kobject::KobjAttr`]) pairs the C attribute with the Rust function that
//! formats or parses its value, and [`attribute_group!`] puts a list of them into a
//! `NULL`-terminated `struct attribute_group` the C side reads. Every table is immutable and
//! lives as long as the module.

use core::{
    fmt::{self, Write},
    marker::PhantomData,
    ptr::null,
};

use kernel::{bindings, prelude::*};

/// Writes formatted text into a sysfs page, truncating at its end.
pub(crate) struct PageWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Write for PageWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

impl<'a> PageWriter<'a> {
    /// A writer filling `buf` from its start.
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    /// Bytes written so far.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends formatted text.
    pub(crate) fn emit(&mut self, args: fmt::Arguments<'_>) -> Result {
        self.write_fmt(args).map_err(|_| EINVAL)
    }
}

/// What a `show` or `store` callback returns to sysfs: the byte count, or a negative errno.
pub(super) fn to_ssize(r: Result<usize>) -> isize {
    match r {
        Ok(n) => isize::try_from(n).unwrap_or(EINVAL.to_errno() as isize),
        Err(e) => e.to_errno() as isize,
    }
}

/// An attribute type that can be listed in an [`AttrGroup`].
///
/// # Safety
///
/// `Self` must be `#[repr(C)]` and start with a C attribute (`struct device_attribute`,
/// `struct kobj_attribute`, ...) that starts with its `struct attribute`, whose callbacks find
/// `Self` from that pointer.
pub(crate) unsafe trait Attribute: Sync + 'static {}

/// A `NULL`-terminated list of `N` attributes of one type `A`.
///
/// # Invariants
///
/// `ptrs` point to `struct attribute`s of static `A`s; `null` is null.
#[repr(C)]
pub(crate) struct AttrList<A: Attribute, const N: usize> {
    ptrs: [*const bindings::attribute; N],
    null: *const bindings::attribute,
    _a: PhantomData<A>,
}

// SAFETY: The list is immutable and only points to immutable statics.
unsafe impl<A: Attribute, const N: usize> Sync for AttrList<A, N> {}

impl<A: Attribute, const N: usize> AttrList<A, N> {
    /// The list of `attrs`.
    pub(crate) const fn new(attrs: &'static [A; N]) -> Self {
        let mut ptrs = [null(); N];
        let mut i = 0;
        while i < N {
            ptrs[i] = attr_ptr(&attrs[i]);
            i += 1;
        }
        Self {
            ptrs,
            null: null(),
            _a: PhantomData,
        }
    }
}

/// The `struct attribute` at the start of `a` (see [`Attribute`]).
const fn attr_ptr<A: Attribute>(a: &'static A) -> *const bindings::attribute {
    core::ptr::from_ref(a).cast()
}

/// One attribute group of attributes of type `A`.
///
/// # Invariants
///
/// `group.attrs` points to a static [`AttrList`] of `A`s.
#[repr(transparent)]
pub(crate) struct AttrGroup<A: Attribute> {
    group: bindings::attribute_group,
    _a: PhantomData<A>,
}

// SAFETY: The group is immutable and only points to immutable statics.
unsafe impl<A: Attribute> Sync for AttrGroup<A> {}

impl<A: Attribute> AttrGroup<A> {
    /// The unnamed group (files directly in the object's directory) of `list`.
    pub(crate) const fn new<const N: usize>(list: &'static AttrList<A, N>) -> Self {
        Self {
            group: bindings::attribute_group {
                __bindgen_anon_2: bindings::attribute_group__bindgen_ty_2 {
                    attrs: core::ptr::from_ref(list).cast_mut().cast(),
                },
                ..pin_init::zeroed()
            },
            _a: PhantomData,
        }
    }
}

/// The `NULL`-terminated groups of an object whose attributes are `A`s (one group here).
///
/// # Invariants
///
/// `groups[0]` points to a static [`AttrGroup`] of `A`s; `groups[1]` is null.
#[repr(transparent)]
pub(crate) struct AttrGroups<A: Attribute> {
    groups: [*const bindings::attribute_group; 2],
    _a: PhantomData<A>,
}

// SAFETY: The array is immutable and only points to immutable statics.
unsafe impl<A: Attribute> Sync for AttrGroups<A> {}

impl<A: Attribute> AttrGroups<A> {
    /// The groups made of `group` alone.
    pub(crate) const fn new(group: &'static AttrGroup<A>) -> Self {
        Self {
            groups: [core::ptr::from_ref(group).cast(), null()],
            _a: PhantomData,
        }
    }

    /// The C array, for `miscdevice.groups` or `kobj_type.default_groups`.
    pub(super) const fn as_raw(&'static self) -> *mut *const bindings::attribute_group {
        core::ptr::from_ref(&self.groups).cast_mut().cast()
    }
}

/// Declares a static [`AttrGroups`] of one unnamed group: `static NAME: Type = [attr, ...];`
/// where `Type` is the attribute type and each `attr` a `const` value of it.
macro_rules! attribute_groups {
    ($(#[$m:meta])* $vis:vis static $name:ident: $ty:ty = [$($attr:expr),* $(,)?];) => {
        $(#[$m])*
        $vis static $name: $crate::kext::sysfs::AttrGroups<$ty> = {
            const N: usize = [$(stringify!($attr)),*].len();
            static ATTRS: [$ty; N] = [$($attr),*];
            static LIST: $crate::kext::sysfs::AttrList<$ty, N> =
                $crate::kext::sysfs::AttrList::new(&ATTRS);
            static GROUP: $crate::kext::sysfs::AttrGroup<$ty> =
                $crate::kext::sysfs::AttrGroup::new(&LIST);
            $crate::kext::sysfs::AttrGroups::new(&GROUP)
        };
    };
}
pub(crate) use attribute_groups;
