// SPDX-License-Identifier: GPL-2.0-only

//! Misc devices with a parent device, sysfs attributes, data every open file reaches, and
//! `poll()`.
//!
//! [`kernel::miscdevice::MiscDeviceRegistration`] registers a device with a name only: no
//! parent, no attribute groups, no `poll`, and nothing an open file can reach but the
//! registration itself. [`Registration`] adds those: it owns a [`MiscFile::Data`] that
//! [`MiscFile::open`] and every [`DeviceAttr`] callback get, registers the device as a child
//! of a given device with static [`AttrGroups`] (so the files exist before user space hears of
//! the device), and adds [`MiscFile::poll`] to the file operations of the kernel crate's
//! misc-device vtable.

use core::marker::PhantomData;

use kernel::{
    bindings, container_of,
    device::Device,
    error::to_result,
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    page::PAGE_SIZE,
    prelude::*,
    str::{as_char_ptr_in_const_context, CString},
    sync::poll::PollTable,
    types::{ForeignOwnable, Opaque},
};

use super::sysfs::{self, AttrGroups, Attribute, PageWriter};

/// `poll()` bits (`include/uapi/linux/eventpoll.h`; not in the generated bindings).
pub(crate) const EPOLLIN: u32 = 0x0001;
pub(crate) const EPOLLPRI: u32 = 0x0002;
pub(crate) const EPOLLERR: u32 = 0x0008;
pub(crate) const EPOLLHUP: u32 = 0x0010;

/// An open file of a misc device registered with [`Registration`].
pub(crate) trait MiscFile: Sized + Send + Sync + 'static {
    /// What the registration owns and every open file and attribute reaches.
    type Data: Send + Sync + 'static;

    /// Opens a file of the device whose data is `data`.
    fn open(data: &Self::Data) -> Result<Self>;

    /// Handles an ioctl.
    fn ioctl(&self, file: &File, cmd: u32, arg: usize) -> Result<isize>;

    /// `poll()`: registers the file's wait queues with `table` and returns the `EPOLL*` mask.
    fn poll(&self, file: &File, table: &PollTable<'_>) -> u32;
}

/// The kernel crate's [`MiscDevice`] for a [`MiscFile`]; registered only by [`Registration`].
#[repr(transparent)]
struct Adapter<T>(T);

#[vtable]
impl<T: MiscFile> MiscDevice for Adapter<T> {
    type Ptr = KBox<Self>;

    fn open(_file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        // SAFETY: `Adapter<T>` is private to this file and its file operations are only given
        // to the `misc` field of the `Inner<T::Data>` of a `Registration<T>`, which
        // `misc_open()` keeps registered (and therefore alive) during this call.
        let inner = unsafe { Inner::<T::Data>::from_misc(misc.as_raw()) };
        Ok(KBox::new(Adapter(T::open(&inner.data)?), GFP_KERNEL)?)
    }

    fn ioctl(me: &Self, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        me.0.ioctl(file, cmd, arg)
    }
}

impl<T: MiscFile> Adapter<T> {
    /// The kernel crate's misc-device file operations with `poll` added.
    const FOPS: bindings::file_operations = {
        let misc = MiscDeviceOptions { name: c"" }.into_raw::<Self>();
        // SAFETY: `into_raw()` points `fops` at a static, fully initialised `file_operations`.
        let mut fops = unsafe { *misc.fops };
        fops.poll = Some(Self::poll);
        fops
    };

    /// [`Self::FOPS`], promoted to a static.
    const fn fops() -> &'static bindings::file_operations {
        &Self::FOPS
    }

    /// The C `poll` callback.
    ///
    /// # Safety
    ///
    /// Called by the VFS with a valid `file` of a device of a `Registration<T>` (whose private
    /// data is the `KBox<Adapter<T>>` its `open` stored) and a valid poll table.
    unsafe extern "C" fn poll(
        file: *mut bindings::file,
        table: *mut bindings::poll_table_struct,
    ) -> bindings::__poll_t {
        // SAFETY: The misc-device `open` stored a `KBox<Self>` in `private_data`; it stays
        // there until `release`, which cannot run while this call uses the file.
        let me: &Self = unsafe { <KBox<Self> as ForeignOwnable>::borrow((*file).private_data) };
        // SAFETY: `file` is valid for the duration of this call, and no `fdget_pos` region
        // is active on it in this thread.
        let f = unsafe { File::from_raw_file(file) };
        // SAFETY: `table` is the poll table the VFS passed for this call.
        let pt = unsafe { PollTable::from_raw(table) };
        me.0.poll(f, &pt)
    }
}

/// A registered misc device whose files are `T`s.
///
/// # Invariants
///
/// `inner.misc` is registered with the file operations [`Adapter<T>::FOPS`].
#[pin_data]
pub(crate) struct Registration<T: MiscFile> {
    #[pin]
    inner: Inner<T::Data>,
    _t: PhantomData<T>,
}

/// The part of a [`Registration`] that its attribute callbacks find: data and device.
///
/// # Invariants
///
/// `misc` holds a `struct miscdevice` registered with `misc_register()` whose `groups` are a
/// static [`AttrGroups<DeviceAttr<D>>`]; it stays registered until drop. `data` is
/// initialised before `misc` is registered, so every open and every attribute callback sees
/// it.
#[pin_data(PinnedDrop)]
struct Inner<D> {
    data: D,
    /// The device's name, which `misc.name` points into (its buffer stays put when the
    /// `CString` moves) and which the misc core reads until deregistration.
    _name: CString,
    #[pin]
    misc: Opaque<bindings::miscdevice>,
}

// SAFETY: `misc_deregister()` may be called from any thread, and `D` is `Send`.
unsafe impl<D: Send> Send for Inner<D> {}
// SAFETY: `&Inner` only gives out `&D`, which is `Sync`, and the `&Device` of the registered
// device, which the C side synchronises itself.
unsafe impl<D: Sync> Sync for Inner<D> {}

impl<T: MiscFile> Registration<T> {
    /// Registers `/dev/NAME` as a child of `parent` with the attributes of `groups`.
    pub(crate) fn new<'a>(
        name: CString,
        parent: &'a Device,
        groups: &'static AttrGroups<DeviceAttr<T::Data>>,
        data: T::Data,
    ) -> impl PinInit<Self, Error> + 'a {
        // The name's bytes live on the heap: the pointer stays valid when `name` moves into
        // the registration, which keeps it until after deregistration.
        let name_ptr = name.as_char_ptr();
        try_pin_init!(Self {
            inner <- try_pin_init!(Inner {
                data,
                _name: name,
                misc <- Opaque::try_ffi_init(move |raw: *mut bindings::miscdevice| {
                    let mut misc = MiscDeviceOptions { name: c"" }.into_raw::<Adapter<T>>();
                    misc.name = name_ptr;
                    misc.fops = Adapter::<T>::fops();
                    // `Device` is a transparent wrapper of `struct device`.
                    misc.parent = core::ptr::from_ref(parent)
                        .cast::<bindings::device>()
                        .cast_mut();
                    misc.groups = groups.as_raw();
                    // SAFETY: `raw` is valid for writes: the initializer owns the slot.
                    unsafe { raw.write(misc) };
                    // SAFETY: `raw` holds a fully initialised `miscdevice` that is pinned and
                    // deregistered in `drop` before its memory goes away; its name is the
                    // buffer of `_name`, which drops after that (fields drop after
                    // `PinnedDrop::drop`).
                    // INVARIANT: On success `misc` is registered with the fops and groups above.
                    to_result(unsafe { bindings::misc_register(raw) })
                }),
            }),
            _t: PhantomData,
        })
    }

    /// The data every open file and attribute reaches.
    pub(crate) fn data(&self) -> &T::Data {
        &self.inner.data
    }

    /// The registered device (`/sys/class/misc/NAME`).
    pub(crate) fn device(&self) -> &Device {
        // SAFETY: By the type invariants `misc` is registered, so `this_device` is a valid
        // device until `misc_deregister()` in drop, which the returned borrow cannot outlive.
        unsafe { Device::from_raw((*self.inner.misc.get()).this_device) }
    }
}

impl<D> Inner<D> {
    /// The `Inner` whose `misc` field `misc` is.
    ///
    /// # Safety
    ///
    /// `misc` must point to the `misc` field of a live `Inner<D>`, and the returned reference
    /// must not be used after that is dropped.
    unsafe fn from_misc<'a>(misc: *mut bindings::miscdevice) -> &'a Self {
        // SAFETY: `Opaque<T>` is `repr(transparent)`, and by the safety requirements `misc` is
        // the `misc` field of a live `Inner<D>`.
        unsafe { &*container_of!(misc.cast::<Opaque<bindings::miscdevice>>(), Self, misc) }
    }

    /// The data of the registration whose device is `dev`.
    ///
    /// # Safety
    ///
    /// `dev` must be the `this_device` of a registered `Inner<D>`, and the reference must only
    /// be used while that device's sysfs callbacks may run (`misc_deregister()` drains them
    /// before the registration is freed).
    unsafe fn data_of_device<'a>(dev: *mut bindings::device) -> &'a D {
        // SAFETY: `misc_register()` sets the driver data of `this_device` to the `miscdevice`.
        let misc = unsafe { bindings::dev_get_drvdata(dev) }.cast::<bindings::miscdevice>();
        // SAFETY: By the safety requirements, `misc` is the `misc` field of a live `Inner<D>`.
        unsafe { &Self::from_misc(misc).data }
    }
}

#[pinned_drop]
impl<D> PinnedDrop for Inner<D> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: By the type invariants `misc` is registered; this deregisters it exactly
        // once, which also drains running opens and sysfs callbacks.
        unsafe { bindings::misc_deregister(self.misc.get()) };
    }
}

/// Formats one attribute's value.
pub(crate) type ShowFn<D> = fn(&D, &mut PageWriter<'_>) -> Result;
/// Acts on what was written to a write-only attribute.
pub(crate) type StoreFn<D> = fn(&D, &[u8]) -> Result;

/// A sysfs attribute of the device of a [`Registration`] whose data is a `D`: read-only with a
/// [`ShowFn`], write-only (root) with a [`StoreFn`], or both; listed with
/// [`sysfs::attribute_groups!`].
///
/// # Invariants
///
/// `dev_attr`'s `show` is [`Self::show_trampoline`] exactly when `show` is set, its `store`
/// [`Self::store_trampoline`] exactly when `store` is set.
#[repr(C)]
pub(crate) struct DeviceAttr<D: Send + Sync + 'static> {
    dev_attr: bindings::device_attribute,
    show: Option<ShowFn<D>>,
    store: Option<StoreFn<D>>,
}

// SAFETY: A `DeviceAttr` is immutable; the C side only reads it (the attributes are static, so
// lockdep never writes a key into them).
unsafe impl<D: Send + Sync + 'static> Sync for DeviceAttr<D> {}
// SAFETY: `#[repr(C)]`, starting with a `struct device_attribute`, which starts with its
// `struct attribute`; the trampolines find `Self` from it.
unsafe impl<D: Send + Sync + 'static> Attribute for DeviceAttr<D> {}

impl<D: Send + Sync + 'static> DeviceAttr<D> {
    /// A read-only (0444) attribute.
    // `struct attribute` has more fields with CONFIG_DEBUG_LOCK_ALLOC.
    #[allow(clippy::needless_update)]
    pub(crate) const fn read_only(name: &'static CStr, show: ShowFn<D>) -> Self {
        Self {
            dev_attr: bindings::device_attribute {
                attr: bindings::attribute {
                    name: as_char_ptr_in_const_context(name),
                    mode: 0o444,
                    ..pin_init::zeroed()
                },
                __bindgen_anon_1: bindings::device_attribute__bindgen_ty_1 {
                    show: Some(Self::show_trampoline),
                },
                __bindgen_anon_2: pin_init::zeroed(),
            },
            show: Some(show),
            store: None,
        }
    }

    /// A write-only (0200) attribute.
    // `struct attribute` has more fields with CONFIG_DEBUG_LOCK_ALLOC.
    #[allow(clippy::needless_update)]
    pub(crate) const fn write_only(name: &'static CStr, store: StoreFn<D>) -> Self {
        Self {
            dev_attr: bindings::device_attribute {
                attr: bindings::attribute {
                    name: as_char_ptr_in_const_context(name),
                    mode: 0o200,
                    ..pin_init::zeroed()
                },
                __bindgen_anon_1: pin_init::zeroed(),
                __bindgen_anon_2: bindings::device_attribute__bindgen_ty_2 {
                    store: Some(Self::store_trampoline),
                },
            },
            show: None,
            store: Some(store),
        }
    }

    /// A read-write attribute: anyone reads, root writes (0644).
    // `struct attribute` has more fields with CONFIG_DEBUG_LOCK_ALLOC.
    #[allow(clippy::needless_update)]
    pub(crate) const fn read_write(
        name: &'static CStr,
        show: ShowFn<D>,
        store: StoreFn<D>,
    ) -> Self {
        Self {
            dev_attr: bindings::device_attribute {
                attr: bindings::attribute {
                    name: as_char_ptr_in_const_context(name),
                    mode: 0o644,
                    ..pin_init::zeroed()
                },
                __bindgen_anon_1: bindings::device_attribute__bindgen_ty_1 {
                    show: Some(Self::show_trampoline),
                },
                __bindgen_anon_2: bindings::device_attribute__bindgen_ty_2 {
                    store: Some(Self::store_trampoline),
                },
            },
            show: Some(show),
            store: Some(store),
        }
    }

    /// The C `show` callback.
    ///
    /// # Safety
    ///
    /// Called by sysfs only: `dev` is the `this_device` of a registered `Inner<D>`
    /// (whose groups are `DeviceAttr<D>`s), `attr` the `dev_attr` of one of them, and `buf` a
    /// `PAGE_SIZE` buffer.
    unsafe extern "C" fn show_trampoline(
        dev: *mut bindings::device,
        attr: *mut bindings::device_attribute,
        buf: *mut kernel::ffi::c_char,
    ) -> isize {
        // SAFETY: By the safety requirements `attr` is the `dev_attr` field of a static `Self`.
        let attr = unsafe { &*container_of!(attr, Self, dev_attr) };
        // SAFETY: By the safety requirements `dev` belongs to a registered `Inner<D>`,
        // which `misc_deregister()` keeps alive until this callback has returned.
        let data = unsafe { Inner::<D>::data_of_device(dev) };
        // SAFETY: sysfs passes a zeroed, writable buffer of `PAGE_SIZE` bytes.
        let buf = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), PAGE_SIZE) };
        let mut out = PageWriter::new(buf);
        let r = attr.show.ok_or(EIO).and_then(|show| show(data, &mut out));
        sysfs::to_ssize(r.map(|()| out.len()))
    }

    /// The C `store` callback.
    ///
    /// # Safety
    ///
    /// Called by sysfs only: `dev` is the `this_device` of a registered `Inner<D>`,
    /// `attr` the `dev_attr` of one of its `DeviceAttr<D>`s, and `buf` holds `count` readable
    /// bytes.
    unsafe extern "C" fn store_trampoline(
        dev: *mut bindings::device,
        attr: *mut bindings::device_attribute,
        buf: *const kernel::ffi::c_char,
        count: usize,
    ) -> isize {
        // SAFETY: By the safety requirements `attr` is the `dev_attr` field of a static `Self`.
        let attr = unsafe { &*container_of!(attr, Self, dev_attr) };
        // SAFETY: As in `show_trampoline`.
        let data = unsafe { Inner::<D>::data_of_device(dev) };
        // SAFETY: sysfs passes `count` readable bytes (at most `PAGE_SIZE`).
        let input = unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), count) };
        let r = attr.store.ok_or(EIO).and_then(|store| store(data, input));
        sysfs::to_ssize(r.map(|()| count))
    }
}
