// SPDX-License-Identifier: GPL-2.0-only

//! Walking the PCI device tree below a device and reading what the kernel crate's
//! [`pci::Device`] does not offer (config space of a device bound to another driver, the
//! resources of a BAR, the PCIe slot capabilities of a port).
//!
//! Every lookup goes through the PCI core's counted lookups (`pci_get_slot()`,
//! `pci_get_device()`) and returns an [`ARef`]; no pointer between devices and buses is
//! followed without a reference that keeps its target alive. Lookups take no lock that device
//! removal or hot-plug take for long, notably not the PCI rescan/remove lock: pcifab's probe
//! and remove run under that lock when the switch is hot-added or removed, and unbinding the
//! endpoint waits for work that walks the tree, so a walk that took the lock could deadlock
//! against them. Each step of a walk checks the parent link of what it found instead, so a
//! walk racing a removal finds nothing rather than a wrong device.

use core::ptr::NonNull;

use kernel::{bindings, pci, prelude::*, sync::aref::ARef};

/// `PCI_DEVFN(slot, func)`.
pub(crate) const fn devfn(slot: u8, func: u8) -> u8 {
    ((slot & 0x1f) << 3) | (func & 0x07)
}

/// The C device behind `dev`.
fn raw(dev: &pci::Device) -> *mut bindings::pci_dev {
    // `pci::Device` is a transparent wrapper of `Opaque<struct pci_dev>`, which allows the C
    // side to change it through a shared reference.
    core::ptr::from_ref(dev)
        .cast::<bindings::pci_dev>()
        .cast_mut()
}

/// Turns a referenced device returned by a `pci_get_*()` function into an [`ARef`].
///
/// # Safety
///
/// `dev` must be null or point to a `struct pci_dev` whose reference the caller hands over.
unsafe fn adopt(dev: *mut bindings::pci_dev) -> Option<ARef<pci::Device>> {
    let dev = NonNull::new(dev)?.cast::<pci::Device>();
    // SAFETY: `pci::Device` is a transparent wrapper of `struct pci_dev`, and the caller hands
    // over the reference the `ARef` now owns.
    Some(unsafe { ARef::from_raw(dev) })
}

/// Looks up device `devfn` on `bus`, taking a reference.
///
/// # Safety
///
/// `bus` must be null or point to a live `struct pci_bus`.
unsafe fn on_bus(bus: *mut bindings::pci_bus, devfn: u8) -> Option<ARef<pci::Device>> {
    if bus.is_null() {
        return None;
    }
    // SAFETY: `bus` is live by the safety requirements; `pci_get_slot()` takes the bus
    // semaphore itself and returns a referenced device or null.
    unsafe { adopt(bindings::pci_get_slot(bus, u32::from(devfn))) }
}

/// The device at `devfn` on the bus `dev` sits on.
pub(crate) fn sibling(dev: &pci::Device, devfn: u8) -> Option<ARef<pci::Device>> {
    // SAFETY: `dev` is a live device; a device holds a reference to its bus
    // (`pci_alloc_dev()`), so `bus` is live as long as `dev` is.
    unsafe { on_bus((*raw(dev)).bus, devfn) }
}

/// The device at `devfn` on the secondary bus of the bridge `bridge`.
pub(crate) fn child(bridge: &pci::Device, devfn: u8) -> Option<ARef<pci::Device>> {
    let bridge = raw(bridge);
    let mut cur: *mut bindings::pci_dev = core::ptr::null_mut();
    loop {
        // SAFETY: `cur` is null or a device whose reference we own; `pci_get_device()` drops
        // that reference and returns the next device with a new one, or null at the end.
        cur = unsafe {
            bindings::pci_get_device(
                bindings::PCI_ANY_ID as u32,
                bindings::PCI_ANY_ID as u32,
                cur,
            )
        };
        if cur.is_null() {
            return None;
        }
        // SAFETY: We own a reference to `cur`, which holds one to its bus; a bus's `self` (the
        // bridge it is the secondary bus of) is set when the bus is created and never changes.
        // Only the pointer value is compared.
        let found = unsafe {
            let bus = (*cur).bus;
            !bus.is_null() && (*bus).self_ == bridge && (*cur).devfn == u32::from(devfn)
        };
        if found {
            // SAFETY: We own the reference `pci_get_device()` took on `cur`.
            return unsafe { adopt(cur) };
        }
    }
}

/// `dev_name()` of `dev`, e.g. `0000:03:00.0`, NUL-padded (cut at 15 bytes).
pub(crate) fn name(dev: &pci::Device) -> [u8; 16] {
    let mut out = [0u8; 16];
    let dev: &kernel::device::Device = dev.as_ref();
    for (o, b) in out.iter_mut().take(15).zip(dev.name().to_bytes()) {
        *o = *b;
    }
    out
}

/// Standard BARs of a PCI function.
pub(crate) const BARS: usize = 6;

/// Number of elements of the array `_a` points to (the pointer is not read).
const fn array_len<T, const N: usize>(_a: *const [T; N]) -> usize {
    N
}

/// The memory BARs of `dev` as `(start, length)`; unused entries have length 0.
pub(crate) fn memory_bars(dev: &pci::Device) -> [(u64, u64); BARS] {
    let mut bars = [(0, 0); BARS];
    // SAFETY: `dev` is live; only the address of its resource table is taken.
    let table = unsafe { core::ptr::addr_of!((*raw(dev)).resource) };
    for (i, bar) in bars.iter_mut().enumerate().take(array_len(table)) {
        // SAFETY: `dev` is live, and so is its resource table; `i` is within the table.
        let flags = unsafe { (*table.cast::<bindings::resource>().add(i)).flags };
        let Ok(n) = u32::try_from(i) else {
            break;
        };
        if flags & bindings::IORESOURCE_MEM as usize == 0 {
            continue;
        }
        if let (Ok(start), Ok(len)) = (dev.resource_start(n), dev.resource_len(n)) {
            *bar = (start, len);
        }
    }
    bars
}

/// Position of the extended capability `id` of `dev`, if it has one.
pub(crate) fn find_ext_capability(dev: &pci::Device, id: u16) -> Option<u16> {
    // SAFETY: `dev` is live; the lookup reads its config space.
    let pos = unsafe { bindings::pci_find_ext_capability(raw(dev), i32::from(id)) };
    (pos != 0).then_some(pos)
}

/// Reads a config-space word of `dev` (which may be bound to another driver).
pub(crate) fn read_config_u16(dev: &pci::Device, pos: u16) -> Result<u16> {
    let mut v = 0u16;
    // SAFETY: `dev` is live and `v` a valid destination.
    let ret = unsafe { bindings::pci_read_config_word(raw(dev), i32::from(pos), &mut v) };
    if ret != 0 {
        return Err(EIO);
    }
    Ok(v)
}

/// Writes a config-space word of `dev` (which may be bound to another driver).
pub(crate) fn write_config_u16(dev: &pci::Device, pos: u16, v: u16) -> Result {
    // SAFETY: `dev` is live; a config write goes through the PCI core's config lock.
    let ret = unsafe { bindings::pci_write_config_word(raw(dev), i32::from(pos), v) };
    if ret != 0 {
        return Err(EIO);
    }
    Ok(())
}

/// `pci_p2pdma_distance_many()` from `provider` to the one client `client`: -1 when the kernel
/// would refuse P2P between them.
pub(crate) fn p2p_distance(provider: &pci::Device, client: &pci::Device) -> i32 {
    // SAFETY: `client` is live, so its embedded `struct device` is.
    let mut c = unsafe { core::ptr::addr_of_mut!((*raw(client)).dev) };
    // SAFETY: Both devices are live; the client array has one entry.
    unsafe { bindings::pci_p2pdma_distance_many(raw(provider), &mut c, 1, false) }
}

/// Unbinds the driver of `dev` and removes it from the system, as the sysfs `remove` file
/// does. Takes the rescan/remove lock itself, so the caller must hold no lock that a removal
/// under that lock waits for.
pub(crate) fn stop_and_remove(dev: ARef<pci::Device>) {
    // SAFETY: `dev` holds a reference; the locked variant takes the rescan/remove lock and
    // copes with a device that is already removed.
    unsafe { bindings::pci_stop_and_remove_bus_device_locked(raw(&dev)) };
}
