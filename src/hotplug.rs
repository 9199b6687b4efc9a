// SPDX-License-Identifier: GPL-2.0-only

//! This host's side of binding: finding the function the firmware hot-plugged behind one of
//! our virtual switch's downstream ports, and removing it gracefully before the firmware
//! takes it away.
//!
//! Topology: the management endpoint is function 1 beside the switch's upstream port
//! (function 0 of the same slot); logical port `L` of this host is the downstream port at
//! device `L` on the upstream port's secondary bus; a bound function is device 0 function 0
//! behind it.
//!
//! Graceful removal goes through the downstream port's hot-plug slot, as the slot's sysfs
//! `power` file does: pciehp unbinds the function's driver, removes the device and turns the
//! slot's power off, and a switch (QEMU's downstream port included) detaches a function whose
//! slot is powered off at once, without the attention-button wait of a surprise unplug.
//!
//! The kernel crate has no abstraction for walking PCI buses or for hot-plug slots, so this
//! file uses the C API through [`DevRef`], a counted reference, and keeps every raw access
//! here.

use core::ptr::NonNull;

use kernel::{bindings, pci, prelude::*};

/// Status of a PCI function found behind a port.
pub(crate) struct Found {
    /// `dev_name()` of the function, e.g. `0000:03:00.0`, NUL-padded.
    pub(crate) name: [u8; 16],
    pub(crate) vendor: u16,
    pub(crate) device: u16,
}

/// A counted reference to a `struct pci_dev`, dropped with `pci_dev_put()`.
///
/// # Invariants
///
/// `0` points to a `struct pci_dev` on which this object holds one reference.
struct DevRef(NonNull<bindings::pci_dev>);

impl DevRef {
    /// Looks up device `devfn` on `bus`, taking a reference.
    ///
    /// # Safety
    ///
    /// `bus` must be null or point to a live `struct pci_bus`.
    unsafe fn at(bus: *mut bindings::pci_bus, devfn: u32) -> Option<Self> {
        if bus.is_null() {
            return None;
        }
        // SAFETY: `bus` is live by the safety requirements; `pci_get_slot()` returns a
        // referenced device or null.
        let dev = unsafe { bindings::pci_get_slot(bus, devfn) };
        // INVARIANT: `pci_get_slot()` took the reference this object owns.
        NonNull::new(dev).map(Self)
    }

    fn raw(&self) -> *mut bindings::pci_dev {
        self.0.as_ptr()
    }

    /// The bus behind this bridge, or null.
    fn subordinate(&self) -> *mut bindings::pci_bus {
        // SAFETY: By the invariants the device is live; `subordinate` is set at enumeration.
        unsafe { (*self.raw()).subordinate }
    }
}

impl Drop for DevRef {
    fn drop(&mut self) {
        // SAFETY: By the invariants this object owns one reference.
        unsafe { bindings::pci_dev_put(self.raw()) };
    }
}

/// `PCI_DEVFN(slot, func)`.
const fn devfn(slot: u32, func: u32) -> u32 {
    (slot << 3) | func
}

/// The downstream port of logical port `port` of the switch `mep` belongs to.
fn downstream_port(mep: &pci::Device, port: u8) -> Option<DevRef> {
    // `pci::Device` is a transparent wrapper of `struct pci_dev`.
    let raw = core::ptr::from_ref(mep)
        .cast::<bindings::pci_dev>()
        .cast_mut();
    // SAFETY: `raw` is the bound management endpoint, live while its driver runs; its `bus`
    // is live as long as the device is.
    let usp = unsafe { DevRef::at((*raw).bus, devfn(0, 0)) }?;
    // SAFETY: `usp` holds a reference, so its subordinate bus is live.
    unsafe { DevRef::at(usp.subordinate(), devfn(u32::from(port), 0)) }
}

/// The function bound behind logical port `port`, if this host has enumerated one.
fn function_at(mep: &pci::Device, port: u8) -> Option<DevRef> {
    let dsp = downstream_port(mep, port)?;
    // SAFETY: `dsp` holds a reference, so its subordinate bus is live.
    unsafe { DevRef::at(dsp.subordinate(), devfn(0, 0)) }
}

/// Describes the function behind logical port `port`, if it is enumerated here.
pub(crate) fn find(mep: &pci::Device, port: u8) -> Option<Found> {
    let f = function_at(mep, port)?;
    let raw = f.raw();
    let mut name = [0u8; 16];
    // SAFETY: `f` holds a reference: the device and its name string are live. The name is a
    // NUL-terminated string set when the device was added.
    unsafe {
        let s = (*raw).dev.kobj.name.cast::<u8>();
        if !s.is_null() {
            for (i, b) in name.iter_mut().take(15).enumerate() {
                let c = *s.add(i);
                if c == 0 {
                    break;
                }
                *b = c;
            }
        }
    }
    // SAFETY: As above; the ids are plain fields set at enumeration.
    let (vendor, device) = unsafe { ((*raw).vendor, (*raw).device) };
    Some(Found {
        name,
        vendor,
        device,
    })
}

/// `PCI_EXT_CAP_ID_ACS` and the ACS control register (`include/uapi/linux/pci_regs.h`).
const EXT_CAP_ID_ACS: i32 = 0x0d;
const ACS_CTRL: i32 = 6;
const ACS_SV: u16 = 1 << 0;
const ACS_RR: u16 = 1 << 2;
const ACS_CR: u16 = 1 << 3;
const ACS_UF: u16 = 1 << 4;
const ACS_EC: u16 = 1 << 5;

/// Position of a device's ACS capability, or 0.
fn acs_pos(d: &DevRef) -> u16 {
    // SAFETY: `d` holds a reference to a live device.
    unsafe { bindings::pci_find_ext_capability(d.raw(), EXT_CAP_ID_ACS) }
}

fn acs_ctrl(d: &DevRef, pos: u16) -> u16 {
    let mut v = 0u16;
    // SAFETY: `d` is live and `v` a valid destination; a failed read leaves 0.
    unsafe { bindings::pci_read_config_word(d.raw(), i32::from(pos) + ACS_CTRL, &mut v) };
    v
}

/// ACS of one downstream port after [`set_acs`].
pub(crate) struct Acs {
    /// The port has an ACS capability.
    pub(crate) present: bool,
    /// Control register before and after.
    pub(crate) before: u16,
    pub(crate) after: u16,
}

/// Lets peer requests between this host's downstream ports go through the switch.
///
/// With an IOMMU the kernel sets Request and Completion Redirect on every ACS-capable port,
/// so a peer request climbs to the root complex and through the IOMMU; P2P then works only
/// through a host bridge the kernel trusts, which a virtual switch's root complex is not.
/// pcifab clears RR, CR and Egress Control on its own switch's downstream ports and keeps
/// Source Validation and Upstream Forwarding: requests between functions bound to this host
/// are routed by the switch, and requests towards the host still go through the IOMMU.
/// The price is isolation between those functions: they share an IOMMU group
/// (`Documentation/design.rst`, "P2P and ACS").
pub(crate) fn set_acs(mep: &pci::Device, port: u8) -> Acs {
    let Some(d) = downstream_port(mep, port) else {
        return Acs {
            present: false,
            before: 0,
            after: 0,
        };
    };
    let pos = acs_pos(&d);
    if pos == 0 {
        return Acs {
            present: false,
            before: 0,
            after: 0,
        };
    }
    let before = acs_ctrl(&d, pos);
    let want = (before & !(ACS_RR | ACS_CR | ACS_EC)) | ACS_SV | ACS_UF;
    if want != before {
        // SAFETY: `d` is live; the ACS control register is a plain config-space write.
        unsafe { bindings::pci_write_config_word(d.raw(), i32::from(pos) + ACS_CTRL, want) };
    }
    Acs {
        present: true,
        before,
        after: acs_ctrl(&d, pos),
    }
}

/// The kernel's view of P2P between the functions behind two logical ports.
pub(crate) struct Distance {
    /// `pci_p2pdma_distance_many()`: -1 when the kernel would refuse P2P.
    pub(crate) distance: i32,
    /// A downstream port on the path redirects peer requests upstream.
    pub(crate) acs_redirect: bool,
}

/// P2P distance between the functions behind logical ports `a` and `b` of this host.
pub(crate) fn p2p_distance(mep: &pci::Device, a: u8, b: u8) -> Distance {
    let mut out = Distance {
        distance: -1,
        acs_redirect: false,
    };
    for port in [a, b] {
        if let Some(d) = downstream_port(mep, port) {
            let pos = acs_pos(&d);
            if pos != 0 && acs_ctrl(&d, pos) & (ACS_RR | ACS_CR | ACS_EC) != 0 {
                out.acs_redirect = true;
            }
        }
    }
    let (Some(fa), Some(fb)) = (function_at(mep, a), function_at(mep, b)) else {
        return out;
    };
    // SAFETY: `fb` holds a reference, so its embedded `struct device` is live.
    let mut client = unsafe { core::ptr::addr_of_mut!((*fb.raw()).dev) };
    // SAFETY: Both devices are live (references held); the client array has one entry.
    out.distance = unsafe { bindings::pci_p2pdma_distance_many(fa.raw(), &mut client, 1, false) };
    out
}

/// First fields of `struct hotplug_slot_ops` (`include/linux/pci_hotplug.h`).
#[repr(C)]
struct HotplugSlotOps {
    enable_slot: Option<unsafe extern "C" fn(*mut bindings::hotplug_slot) -> i32>,
    disable_slot: Option<unsafe extern "C" fn(*mut bindings::hotplug_slot) -> i32>,
}

/// First field of `struct hotplug_slot`, which the generated bindings leave opaque.
#[repr(C)]
struct HotplugSlot {
    ops: *const HotplugSlotOps,
}

/// How a function left this host.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Removal {
    /// Nothing was enumerated behind the port.
    NotPresent,
    /// The hot-plug slot removed it and powered the slot off.
    SlotPoweredOff,
    /// There is no hot-plug slot: the device was removed, the slot stays powered.
    DeviceRemoved,
}

/// Standard BARs of a PCI function.
const BARS: usize = 6;

/// The memory BARs of a function as `(start, length)`; unused entries have length 0.
fn memory_bars(f: &DevRef) -> [(u64, u64); BARS] {
    let mut bars = [(0, 0); BARS];
    for (i, bar) in bars.iter_mut().enumerate() {
        // SAFETY: `f` holds a reference, so the device and its resource table are live; the
        // table has at least `BARS` entries.
        let (start, end, flags) = unsafe {
            let r = &(*f.raw()).resource[i];
            (r.start, r.end, r.flags)
        };
        if flags & bindings::IORESOURCE_MEM as usize != 0 && end > start {
            *bar = (start, end - start + 1);
        }
    }
    bars
}

/// Revokes every user-space mapping of a removed function's BAR (e.g. an `mmap` of its
/// sysfs `resourceN` file), so a process cannot reach whatever the fabric puts at that
/// address next. Claiming a range in the iomem tree makes the kernel zap the mappings of it
/// (`CONFIG_IO_STRICT_DEVMEM`); the claim is released at once.
fn revoke(start: u64, len: u64) -> bool {
    // SAFETY: `iomem_resource` is the kernel's static root of the iomem tree, and
    // `__request_region()` takes the resource lock itself; the name is a static string.
    let claimed = unsafe {
        bindings::__request_region(
            core::ptr::addr_of_mut!(bindings::iomem_resource),
            start,
            len,
            c"pcifab-revoke".as_char_ptr(),
            0,
        )
    };
    if claimed.is_null() {
        return false;
    }
    // SAFETY: The range was claimed just above.
    unsafe {
        bindings::__release_region(
            core::ptr::addr_of_mut!(bindings::iomem_resource),
            start,
            len,
        )
    };
    true
}

/// Removes the function behind logical port `port` from this host: its driver is unbound,
/// the device removed and the slot powered off, before the firmware is asked to take it;
/// user-space mappings of its BARs are revoked (accesses then get `SIGBUS`).
pub(crate) fn remove(mep: &pci::Device, port: u8) -> Result<Removal> {
    let Some(f) = function_at(mep, port) else {
        return Ok(Removal::NotPresent);
    };
    let bars = memory_bars(&f);
    let removal = remove_device(f)?;
    if !cfg!(CONFIG_IO_STRICT_DEVMEM) {
        dev_warn!(
            mep,
            "kernel without CONFIG_IO_STRICT_DEVMEM: user mappings of the function's BARs stay\n"
        );
    }
    for (start, len) in bars.into_iter().filter(|&(_, len)| len != 0) {
        if !revoke(start, len) {
            dev_warn!(
                mep,
                "could not revoke user mappings of [{:#x}, {:#x}]: the range is in use\n",
                start,
                start + len - 1
            );
        }
    }
    Ok(removal)
}

/// Removes one enumerated function, through its hot-plug slot if it has one.
fn remove_device(f: DevRef) -> Result<Removal> {
    let raw = f.raw();
    // SAFETY: `f` holds a reference, so `slot` (the `pci_slot` the function sits in, owned
    // by its bus) is null or live; its `hotplug` is null or pciehp's `hotplug_slot`, whose
    // first field is its `ops`.
    let disable = unsafe {
        let slot = (*raw).slot;
        let hp = if slot.is_null() {
            core::ptr::null_mut()
        } else {
            (*slot).hotplug
        };
        if hp.is_null() || (*hp.cast::<HotplugSlot>()).ops.is_null() {
            None
        } else {
            (*(*hp.cast::<HotplugSlot>()).ops)
                .disable_slot
                .map(|f| (f, hp))
        }
    };
    match disable {
        Some((disable_slot, hp)) => {
            drop(f);
            // SAFETY: `hp` is the live `hotplug_slot` of this port (pciehp stays bound to the
            // downstream port while we run); `disable_slot` is its own operation, which
            // waits until the slot is off.
            let ret = unsafe { disable_slot(hp) };
            kernel::error::to_result(ret)?;
            Ok(Removal::SlotPoweredOff)
        }
        None => {
            // SAFETY: We hold a reference to the device; the locked variant takes the rescan
            // lock itself and unbinds the driver before removing the device.
            unsafe { bindings::pci_stop_and_remove_bus_device_locked(raw) };
            drop(f);
            Ok(Removal::DeviceRemoved)
        }
    }
}
