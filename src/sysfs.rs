// SPDX-License-Identifier: GPL-2.0-only

//! The sysfs attributes of a management endpoint, one value per file, in
//! `/sys/class/misc/pcifabN/` (documented in `Documentation/ABI/testing/sysfs-class-pcifab`).
//!
//! The attributes are a static table of [`DeviceAttr`]s of the misc device
//! ([`crate::kext::miscdev`]), each naming the function that formats or parses its value.

use kernel::{prelude::*, sync::Arc};

use crate::{
    compose,
    kext::{
        miscdev::DeviceAttr,
        security::{capable, Capability},
        sysfs::{attribute_groups, PageWriter},
    },
    uapi::UNBOUND,
    Mep,
};

/// Writes a fixed-size register string as the switchtec driver does: up to the first NUL,
/// without trailing spaces, then a newline.
fn emit_str(out: &mut PageWriter<'_>, raw: &[u8]) -> Result {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let s = raw[..end].trim_ascii_end();
    for &b in s {
        let c = if b.is_ascii_graphic() || b == b' ' {
            b
        } else {
            b'?'
        };
        out.emit(format_args!("{}", c as char))?;
    }
    out.emit(format_args!("\n"))
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

/// `EPERM` unless the writer has `CAP_SYS_ADMIN`, as the ioctls that change the fabric
/// require: the file's mode (0200) lets any root process write, and a root without that
/// capability (a container, a service with a reduced bounding set) must not bind or unbind
/// through the file what it may not through the device.
fn allowed_config() -> Result {
    if capable(Capability::SysAdmin) {
        Ok(())
    } else {
        Err(EPERM)
    }
}

/// `bind`: "PDFID HOST [PORT]".
fn store_bind(m: &Arc<Mep>, input: &[u8]) -> Result {
    allowed_config()?;
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
fn store_unbind(m: &Arc<Mep>, input: &[u8]) -> Result {
    allowed_config()?;
    let (v, n) = numbers::<1>(input)?;
    if n != 1 {
        return Err(EINVAL);
    }
    let pdfid = u16::try_from(v[0]).map_err(|_| EINVAL)?;
    m.unbind_detached(pdfid, compose::DEFAULT_TIMEOUT_MS)
        .map(|_| ())
        .map_err(|f| f.err)
}

/// A read-only attribute of `/dev/pcifabN`.
const fn ro(name: &'static CStr, show: fn(&Arc<Mep>, &mut PageWriter<'_>) -> Result) -> Attr {
    DeviceAttr::read_only(name, show)
}

/// `view_max_age_ms`: one number of milliseconds, 0 to a minute.
fn store_max_age(m: &Arc<Mep>, input: &[u8]) -> Result {
    let (v, n) = numbers::<1>(input)?;
    if n != 1 {
        return Err(EINVAL);
    }
    m.fabric.set_max_age_ms(v[0])
}

/// `mrpc_callers_max`: only `0`, which starts the high-water mark again.
fn store_callers_max(m: &Arc<Mep>, input: &[u8]) -> Result {
    let (v, n) = numbers::<1>(input)?;
    if n != 1 || v[0] != 0 {
        return Err(EINVAL);
    }
    m.mrpc.reset_callers_max();
    Ok(())
}

/// A read-write attribute of `/dev/pcifabN`: anyone reads, root writes.
const fn rw(
    name: &'static CStr,
    show: fn(&Arc<Mep>, &mut PageWriter<'_>) -> Result,
    store: fn(&Arc<Mep>, &[u8]) -> Result,
) -> Attr {
    DeviceAttr::read_write(name, show, store)
}

/// A write-only (root) attribute of `/dev/pcifabN`.
const fn wo(name: &'static CStr, store: fn(&Arc<Mep>, &[u8]) -> Result) -> Attr {
    DeviceAttr::write_only(name, store)
}

type Attr = DeviceAttr<Arc<Mep>>;

attribute_groups! {
    /// The attribute groups of `/dev/pcifabN`: the files in the order listed in the ABI
    /// document.
    pub(crate) static GROUPS: Attr = [
        ro(c"device_id", |m, o| o.emit(format_args!("{:#06x}\n", m.identity()?.device_id))),
        ro(c"device_version", |m, o| o.emit(format_args!("{:x}\n", m.identity()?.device_version))),
        ro(c"fw_version", |m, o| o.emit(format_args!("{:08x}\n", m.identity()?.fw_version))),
        ro(c"vendor_id", |m, o| emit_str(o, &m.identity()?.vendor_id)),
        ro(c"product_id", |m, o| emit_str(o, &m.identity()?.product_id)),
        ro(c"product_revision", |m, o| emit_str(o, &m.identity()?.product_revision)),
        ro(c"partition", |m, o| o.emit(format_args!("{}\n", m.identity()?.partition))),
        ro(c"partition_count", |m, o| o.emit(format_args!("{}\n", m.identity()?.partition_count))),
        // The firmware's extensions, by name, or "none" on PAX firmware.
        ro(c"features", |m, o| {
            let f = m.features();
            let mut first = true;
            for (bit, name) in crate::fw::ext::NAMES {
                if f.has(bit) {
                    o.emit(format_args!("{}{}", if first { "" } else { " " }, name))?;
                    first = false;
                }
            }
            o.emit(format_args!("{}\n", if first { "none" } else { "" }))
        }),
        // Die temperature in millidegrees Celsius, as hwmon reports temperatures.
        ro(c"temperature", |m, o| {
            o.emit(format_args!("{}\n", u64::from(m.telemetry.die_temperature(m)?) * 10))
        }),
        ro(c"generation", |m, o| {
            let g = m.fabric.with_view(m, |v| v.generation)?;
            o.emit(format_args!("{}\n", g))
        }),
        ro(c"nr_ports", |m, o| {
            let n = m.fabric.with_view(m, |v| v.ports.len())?;
            o.emit(format_args!("{}\n", n))
        }),
        ro(c"nr_functions", |m, o| {
            let n = m.fabric.with_view(m, |v| v.functions.len())?;
            o.emit(format_args!("{}\n", n))
        }),
        ro(c"nr_bound", |m, o| {
            let n = m.fabric.with_view(m, |v| {
                v.functions.iter().filter(|f| f.bound_host != UNBOUND).count()
            })?;
            o.emit(format_args!("{}\n", n))
        }),
        // Bitmap of the physical ports whose link is up, in hexadecimal.
        ro(c"ports_link_up", |m, o| {
            let map = m.fabric.with_view(m, |v| v.link_up_map)?;
            o.emit(format_args!("{:#x}\n", map))
        }),
        ro(c"events_total", |m, o| o.emit(format_args!("{}\n", m.events.counts().total))),
        ro(c"events_link", |m, o| o.emit(format_args!("{}\n", m.events.counts().link))),
        ro(c"events_gfms", |m, o| o.emit(format_args!("{}\n", m.events.counts().gfms))),
        ro(c"event_irqs", |m, o| o.emit(format_args!("{}\n", m.events.counts().irqs))),
        ro(c"mrpc_commands", |m, o| o.emit(format_args!("{}\n", m.mrpc.stats().commands))),
        ro(c"mrpc_timeouts", |m, o| o.emit(format_args!("{}\n", m.mrpc.stats().timeouts))),
        // The most callers inside the MRPC engine at once (in the mailbox or queued for it);
        // writing 0 starts it again.
        rw(
            c"mrpc_callers_max",
            |m, o| o.emit(format_args!("{}\n", m.mrpc.callers_max())),
            store_callers_max
        ),
        // 1 while commands complete through DMA MRPC, 0 through the mailbox registers.
        ro(c"mrpc_dma", |m, o| o.emit(format_args!("{}\n", u8::from(m.mrpc.dma_active())))),
        ro(c"mrpc_dma_commands", |m, o| o.emit(format_args!("{}\n", m.mrpc.stats().dma_commands))),
        // Size of the P2P window in bytes (0: the firmware has none).
        ro(c"p2p_window_size", |m, o| o.emit(format_args!("{}\n", m.p2p.window_size()))),
        // Without the P2P extension there are no routes. The list is the P2P code's cache,
        // which route changes and the firmware's route events invalidate: a reader in a loop
        // does not send a firmware command per read.
        ro(c"p2p_routes", |m, o| {
            let n = if m.features().has(crate::fw::ext::P2P_ROUTES) {
                crate::p2p::cached_routes(m, false)?.len()
            } else {
                0
            };
            o.emit(format_args!("{}\n", n))
        }),
        ro(c"p2p_copies", |m, o| o.emit(format_args!("{}\n", m.p2p.counters().copies))),
        ro(c"p2p_bytes", |m, o| o.emit(format_args!("{}\n", m.p2p.counters().bytes))),
        ro(c"p2p_faults", |m, o| o.emit(format_args!("{}\n", m.p2p.counters().faults))),
        ro(c"compose_waiting", |m, o| o.emit(format_args!("{}\n", m.compose.waiting()))),
        // How old a view of the fabric may be served (ms); bindings and link changes of this
        // partition reach the view by their events whatever the age.
        rw(
            c"view_max_age_ms",
            |m, o| o.emit(format_args!("{}\n", m.fabric.max_age_ms())),
            store_max_age
        ),
        wo(c"bind", store_bind),
        wo(c"unbind", store_unbind),
    ];
}
