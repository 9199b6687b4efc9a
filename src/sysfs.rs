// SPDX-License-Identifier: GPL-2.0-only

//! Read-only sysfs attributes of a management endpoint, one value per file, in
//! `/sys/class/misc/pcifabN/` (documented in `Documentation/ABI/testing/sysfs-class-pcifab`).
//!
//! The kernel crate has no sysfs attribute abstraction; this file is the smallest safe wrapper:
//! a static table of [`Attr`]s, each a C `device_attribute` followed by the Rust function that
//! formats its value, and one `extern "C"` trampoline that finds both.

use core::{
    fmt::{self, Write},
    ptr::{addr_of, null},
};

use kernel::{
    bindings, container_of, page::PAGE_SIZE, prelude::*, str::as_char_ptr_in_const_context,
};

use crate::{chardev::Registration, compose, uapi::UNBOUND, Mep};

/// Formats one attribute's value into `out`.
type ShowFn = fn(&Mep, &mut PageWriter<'_>) -> Result;
/// Acts on what was written to a write-only attribute.
type StoreFn = fn(&Mep, &[u8]) -> Result;

/// One attribute: read-only with a [`ShowFn`] or write-only (root) with a [`StoreFn`].
#[repr(C)]
struct Attr {
    dev_attr: bindings::device_attribute,
    show: Option<ShowFn>,
    store: Option<StoreFn>,
}

impl Attr {
    // `struct attribute` has more fields with CONFIG_DEBUG_LOCK_ALLOC.
    #[allow(clippy::needless_update)]
    const fn new(name: &'static CStr, show: ShowFn) -> Self {
        Self {
            dev_attr: bindings::device_attribute {
                attr: bindings::attribute {
                    name: as_char_ptr_in_const_context(name),
                    mode: 0o444,
                    ..pin_init::zeroed()
                },
                __bindgen_anon_1: bindings::device_attribute__bindgen_ty_1 {
                    show: Some(show_trampoline),
                },
                __bindgen_anon_2: pin_init::zeroed(),
            },
            show: Some(show),
            store: None,
        }
    }

    // `struct attribute` has more fields with CONFIG_DEBUG_LOCK_ALLOC.
    #[allow(clippy::needless_update)]
    const fn write_only(name: &'static CStr, store: StoreFn) -> Self {
        Self {
            dev_attr: bindings::device_attribute {
                attr: bindings::attribute {
                    name: as_char_ptr_in_const_context(name),
                    mode: 0o200,
                    ..pin_init::zeroed()
                },
                __bindgen_anon_1: pin_init::zeroed(),
                __bindgen_anon_2: bindings::device_attribute__bindgen_ty_2 {
                    store: Some(store_trampoline),
                },
            },
            show: None,
            store: Some(store),
        }
    }
}

/// Wrapper making the static C tables shareable.
#[repr(transparent)]
pub(crate) struct SyncStatic<T>(pub(crate) T);

// SAFETY: The wrapped tables are immutable after compile time; the C side only reads them
// (the attributes are static, so lockdep never writes a key into them).
unsafe impl<T> Sync for SyncStatic<T> {}

/// Writes formatted text into a sysfs page, truncating at `PAGE_SIZE`.
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

    pub(crate) fn emit(&mut self, args: fmt::Arguments<'_>) -> Result {
        self.write_fmt(args).map_err(|_| EINVAL)
    }

    /// Writes a fixed-size register string as the switchtec driver does: up to the first NUL,
    /// without trailing spaces, then a newline.
    fn emit_str(&mut self, raw: &[u8]) -> Result {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let s = raw[..end].trim_ascii_end();
        for &b in s {
            let c = if b.is_ascii_graphic() || b == b' ' {
                b
            } else {
                b'?'
            };
            self.emit(format_args!("{}", c as char))?;
        }
        self.emit(format_args!("\n"))
    }
}

/// The C `show` callback of every [`Attr`].
///
/// # Safety
///
/// Called by sysfs only: `dev` is the `this_device` of a registered `/dev/pcifabN`, `attr`
/// is the `dev_attr` of one of [`ATTRS`], and `buf` is a `PAGE_SIZE` buffer.
unsafe extern "C" fn show_trampoline(
    dev: *mut bindings::device,
    attr: *mut bindings::device_attribute,
    buf: *mut kernel::ffi::c_char,
) -> isize {
    // SAFETY: By the safety requirements `attr` is the `dev_attr` field of a static `Attr`.
    let attr = unsafe { &*container_of!(attr, Attr, dev_attr) };
    // SAFETY: By the safety requirements `dev` belongs to a registered `Registration`, which
    // `misc_deregister()` keeps alive until this callback has returned.
    let mep = unsafe { Registration::mep_from_device(dev) };
    // SAFETY: sysfs passes a zeroed, writable buffer of `PAGE_SIZE` bytes.
    let buf = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), PAGE_SIZE) };
    let mut out = PageWriter { buf, len: 0 };
    match attr.show.map(|show| show(mep, &mut out)) {
        Some(Ok(())) => out.len as isize,
        Some(Err(e)) => e.to_errno() as isize,
        None => EIO.to_errno() as isize,
    }
}

/// The C `store` callback of every write-only [`Attr`].
///
/// # Safety
///
/// Called by sysfs only: `dev` is the `this_device` of a registered `/dev/pcifabN`, `attr`
/// is the `dev_attr` of one of [`ATTRS`], and `buf` holds `count` readable bytes.
unsafe extern "C" fn store_trampoline(
    dev: *mut bindings::device,
    attr: *mut bindings::device_attribute,
    buf: *const kernel::ffi::c_char,
    count: usize,
) -> isize {
    // SAFETY: By the safety requirements `attr` is the `dev_attr` field of a static `Attr`.
    let attr = unsafe { &*container_of!(attr, Attr, dev_attr) };
    // SAFETY: As in `show_trampoline`.
    let mep = unsafe { Registration::mep_from_device(dev) };
    // SAFETY: sysfs passes `count` readable bytes (at most `PAGE_SIZE`).
    let input = unsafe { core::slice::from_raw_parts(buf.cast::<u8>(), count) };
    match attr.store.map(|store| store(mep, input)) {
        Some(Ok(())) => count as isize,
        Some(Err(e)) => e.to_errno() as isize,
        None => EIO.to_errno() as isize,
    }
}

/// Parses up to `N` whitespace-separated numbers (decimal or 0x hexadecimal).
fn numbers<const N: usize>(input: &[u8]) -> Result<([u32; N], usize)> {
    let text = core::str::from_utf8(input).map_err(|_| EINVAL)?;
    let mut out = [0u32; N];
    let mut n = 0;
    for word in text.split_ascii_whitespace() {
        let slot = out.get_mut(n).ok_or(EINVAL)?;
        *slot = match word.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => word.parse(),
        }
        .map_err(|_| EINVAL)?;
        n += 1;
    }
    Ok((out, n))
}

/// `bind`: "PDFID HOST [PORT]".
fn store_bind(m: &Mep, input: &[u8]) -> Result {
    let (v, n) = numbers::<3>(input)?;
    if n < 2 {
        return Err(EINVAL);
    }
    let pdfid = u16::try_from(v[0]).map_err(|_| EINVAL)?;
    let host = u8::try_from(v[1]).map_err(|_| EINVAL)?;
    let port = if n == 3 {
        Some(u8::try_from(v[2]).map_err(|_| EINVAL)?)
    } else {
        None
    };
    m.bind(&[pdfid], host, port, compose::DEFAULT_TIMEOUT_MS, true)
        .map(|_| ())
        .map_err(|f| f.err)
}

/// `unbind`: "PDFID".
fn store_unbind(m: &Mep, input: &[u8]) -> Result {
    let (v, n) = numbers::<1>(input)?;
    if n != 1 {
        return Err(EINVAL);
    }
    let pdfid = u16::try_from(v[0]).map_err(|_| EINVAL)?;
    m.unbind(pdfid, compose::DEFAULT_TIMEOUT_MS)
        .map(|_| ())
        .map_err(|f| f.err)
}

macro_rules! attrs {
    ($($name:literal => $show:expr),* $(,)?; $($wname:literal => $store:expr),* $(,)?) => {
        /// The attributes, in the order listed in the ABI document.
        static ATTRS: SyncStatic<[Attr; attrs!(@count $($name)* $($wname)*)]> =
            SyncStatic([$(Attr::new($name, $show),)* $(Attr::write_only($wname, $store),)*]);
        const NATTRS: usize = attrs!(@count $($name)* $($wname)*);
    };
    (@count $($x:tt)*) => { 0 $(+ { let _ = stringify!($x); 1 })* };
}

attrs! {
    c"device_id" => |m, o| o.emit(format_args!("{:#06x}\n", m.identity()?.device_id)),
    c"device_version" => |m, o| o.emit(format_args!("{:x}\n", m.identity()?.device_version)),
    c"fw_version" => |m, o| o.emit(format_args!("{:08x}\n", m.identity()?.fw_version)),
    c"vendor_id" => |m, o| o.emit_str(&m.identity()?.vendor_id),
    c"product_id" => |m, o| o.emit_str(&m.identity()?.product_id),
    c"product_revision" => |m, o| o.emit_str(&m.identity()?.product_revision),
    c"partition" => |m, o| o.emit(format_args!("{}\n", m.identity()?.partition)),
    c"partition_count" => |m, o| o.emit(format_args!("{}\n", m.identity()?.partition_count)),
    // The firmware's extensions, by name, or "none" on PAX firmware.
    c"features" => |m, o| {
        let f = m.features();
        let mut first = true;
        for (bit, name) in crate::fw::ext::NAMES {
            if f.has(bit) {
                o.emit(format_args!("{}{}", if first { "" } else { " " }, name))?;
                first = false;
            }
        }
        o.emit(format_args!("{}\n", if first { "none" } else { "" }))
    },
    // Die temperature in millidegrees Celsius, as hwmon reports temperatures.
    c"temperature" => |m, o| {
        o.emit(format_args!("{}\n", u64::from(m.telemetry.die_temperature(m)?) * 10))
    },
    c"generation" => |m, o| {
        let g = m.fabric.with_view(m, |v| v.generation)?;
        o.emit(format_args!("{}\n", g))
    },
    c"nr_ports" => |m, o| {
        let n = m.fabric.with_view(m, |v| v.ports.len())?;
        o.emit(format_args!("{}\n", n))
    },
    c"nr_functions" => |m, o| {
        let n = m.fabric.with_view(m, |v| v.functions.len())?;
        o.emit(format_args!("{}\n", n))
    },
    c"nr_bound" => |m, o| {
        let n = m.fabric.with_view(m, |v| {
            v.functions.iter().filter(|f| f.bound_host != UNBOUND).count()
        })?;
        o.emit(format_args!("{}\n", n))
    },
    // Bitmap of the physical ports whose link is up, in hexadecimal.
    c"ports_link_up" => |m, o| {
        let map = m.fabric.with_view(m, |v| v.link_up_map)?;
        o.emit(format_args!("{:#x}\n", map))
    },
    c"events_total" => |m, o| o.emit(format_args!("{}\n", m.events.counts().total)),
    c"events_link" => |m, o| o.emit(format_args!("{}\n", m.events.counts().link)),
    c"events_gfms" => |m, o| o.emit(format_args!("{}\n", m.events.counts().gfms)),
    c"event_irqs" => |m, o| o.emit(format_args!("{}\n", m.events.counts().irqs)),
    c"mrpc_commands" => |m, o| o.emit(format_args!("{}\n", m.mrpc.stats().commands)),
    c"mrpc_timeouts" => |m, o| o.emit(format_args!("{}\n", m.mrpc.stats().timeouts)),
    // 1 while commands complete through DMA MRPC, 0 through the mailbox registers.
    c"mrpc_dma" => |m, o| o.emit(format_args!("{}\n", u8::from(m.mrpc.dma_active()))),
    c"mrpc_dma_commands" => |m, o| o.emit(format_args!("{}\n", m.mrpc.stats().dma_commands)),
    // Size of the P2P window in bytes (0: the firmware has none).
    c"p2p_window_size" => |m, o| o.emit(format_args!("{}\n", m.p2p.window_size())),
    // Without the P2P extension there are no routes.
    c"p2p_routes" => |m, o| {
        let n = if m.features().has(crate::fw::ext::P2P_ROUTES) {
            crate::p2p::routes(m)?.len()
        } else {
            0
        };
        o.emit(format_args!("{}\n", n))
    },
    c"p2p_copies" => |m, o| o.emit(format_args!("{}\n", m.p2p.counters().copies)),
    c"p2p_bytes" => |m, o| o.emit(format_args!("{}\n", m.p2p.counters().bytes)),
    c"p2p_faults" => |m, o| o.emit(format_args!("{}\n", m.p2p.counters().faults)),
    ;
    c"bind" => store_bind,
    c"unbind" => store_unbind,
}

/// `NULL`-terminated array of the attributes' `struct attribute`s.
static ATTR_PTRS: SyncStatic<[*const bindings::attribute; NATTRS + 1]> = SyncStatic({
    let mut ptrs = [null(); NATTRS + 1];
    let mut i = 0;
    while i < NATTRS {
        ptrs[i] = addr_of!(ATTRS.0[i].dev_attr.attr);
        i += 1;
    }
    ptrs
});

static GROUP: SyncStatic<bindings::attribute_group> = SyncStatic(bindings::attribute_group {
    __bindgen_anon_2: bindings::attribute_group__bindgen_ty_2 {
        attrs: addr_of!(ATTR_PTRS.0).cast_mut().cast(),
    },
    ..pin_init::zeroed()
});

/// `NULL`-terminated attribute groups of `/dev/pcifabN`.
pub(crate) static GROUPS: SyncStatic<[*const bindings::attribute_group; 2]> =
    SyncStatic([addr_of!(GROUP.0), null()]);

impl<const N: usize> SyncStatic<[*const bindings::attribute_group; N]> {
    /// Pointer to the first group, for `miscdevice.groups`.
    pub(crate) fn as_ptr(&self) -> *mut *const bindings::attribute_group {
        self.0.as_ptr().cast_mut()
    }
}
