// SPDX-License-Identifier: GPL-2.0-only

//! Turning off the PCI hot-plug slot a function sits in, as the slot's sysfs `power` file
//! does, through the slot's `struct hotplug_slot` operations.
//!
//! Writing `0` to `/sys/bus/pci/slots/NAME/power` calls the slot's `disable_slot` operation
//! (`power_write_file()` in `drivers/pci/hotplug/pci_hotplug_core.c`); pciehp's
//! (`pciehp_sysfs_disable_slot()`) unbinds the driver of the functions in the slot, removes
//! them and turns the slot's power off, and returns when that is done. [`disable`] makes the
//! same call from kernel code, with a reference on the slot driver's module as
//! `pci_reset_hotplug_slot()` in `drivers/pci/pci.c` takes one: no file is opened, so neither
//! the caller's credentials nor its mount namespace matter, and no VFS lock is taken.
//!
//! Linux 7.3 gives Rust no bindings for `include/linux/pci_hotplug.h` (its
//! `rust/bindings/bindings_helper.h` includes only `linux/pci.h`, where `struct hotplug_slot`
//! is an incomplete type), and exports no function that disables a slot. The two structures
//! are mirrored below from that header; [`disable`] checks the mirror against the slot before
//! it calls anything (`Documentation/design.rst`, "Graceful removal").

use core::ffi::{c_char, c_int};

use kernel::{bindings, error, pci, prelude::*};

/// The leading members of `struct hotplug_slot_ops` (`include/linux/pci_hotplug.h`, 7.3),
/// up to the one used here.
#[repr(C)]
struct HotplugSlotOps {
    enable_slot: Option<unsafe extern "C" fn(*mut bindings::hotplug_slot) -> c_int>,
    disable_slot: Option<unsafe extern "C" fn(*mut bindings::hotplug_slot) -> c_int>,
}

/// `struct hotplug_slot` (`include/linux/pci_hotplug.h`, 7.3).
#[repr(C)]
struct HotplugSlot {
    ops: *const HotplugSlotOps,
    pci_slot: *mut bindings::pci_slot,
    owner: *mut bindings::module,
    mod_name: *const c_char,
}

/// The C device behind `dev`.
fn raw(dev: &pci::Device) -> *mut bindings::pci_dev {
    // `pci::Device` is a transparent wrapper of `Opaque<struct pci_dev>`, which allows the C
    // side to change it through a shared reference.
    core::ptr::from_ref(dev)
        .cast::<bindings::pci_dev>()
        .cast_mut()
}

/// A hot-plug slot's `disable_slot` operation, with a reference on the module that provides
/// it (put on drop).
struct DisableOp {
    slot: *mut bindings::hotplug_slot,
    op: unsafe extern "C" fn(*mut bindings::hotplug_slot) -> c_int,
    owner: *mut bindings::module,
}

impl DisableOp {
    /// The `disable_slot` operation of the hot-plug slot `dev` sits in, looked up with `dev`'s
    /// device lock held, as `pci_dev_reset_slot_function()` looks up `reset_slot`: the slot
    /// and its hot-plug driver are torn down only when the port above `dev` is removed or its
    /// driver unbound, which first stops `dev`, taking that lock.
    fn lookup(dev: &pci::Device) -> Result<Self> {
        let pdev = raw(dev);
        // SAFETY: `dev` is live; the lock is released below on every path.
        unsafe { bindings::pci_dev_lock(pdev) };
        // SAFETY: `dev` is live and locked. A device not yet deleted (`device_del()` marks it
        // dead under this lock) is still on its bus, so its slot pointer is current and the
        // slot and its hot-plug driver stay registered until it is unlocked (see above). The
        // mirrored structures are those of 7.3's `include/linux/pci_hotplug.h`, checked
        // through the slot's back-pointer before the operation is used.
        let found = unsafe {
            let p = (*pdev).dev.p;
            let ps = if p.is_null() || (*p).dead() != 0 {
                core::ptr::null_mut()
            } else {
                (*pdev).slot
            };
            let hs = if ps.is_null() {
                core::ptr::null_mut()
            } else {
                (*ps).hotplug
            };
            let m = hs.cast::<HotplugSlot>();
            if hs.is_null() || (*m).pci_slot != ps || (*m).ops.is_null() {
                None
            } else {
                (*(*m).ops)
                    .disable_slot
                    .filter(|_| bindings::try_module_get((*m).owner))
                    .map(|op| Self {
                        slot: hs,
                        op,
                        owner: (*m).owner,
                    })
            }
        };
        // SAFETY: Locked above.
        unsafe { bindings::pci_dev_unlock(pdev) };
        found.ok_or(ENODEV)
    }
}

impl Drop for DisableOp {
    fn drop(&mut self) {
        // SAFETY: `lookup()` took this reference.
        unsafe { bindings::module_put(self.owner) };
    }
}

/// Turns off the hot-plug slot `dev` sits in: its hot-plug driver unbinds the drivers of the
/// slot's functions, removes them and powers the slot off; returns when that is done.
/// `ENODEV` when `dev` is in no hot-plug slot (or its driver cannot disable it).
///
/// Must be called without any lock the PCI core or the hot-plug driver takes (the device
/// locks and the rescan/remove lock included), and from nothing that the removal of a device
/// under the rescan/remove lock waits for: pciehp's disabling takes that lock.
pub(crate) fn disable(dev: &pci::Device) -> Result {
    let op = DisableOp::lookup(dev)?;
    // SAFETY: The operation is the slot's own, called with its slot as the power file calls
    // it, with a reference on its module held; the slot stays registered while the port above
    // `dev` is (`lookup()`). Nothing here holds the port: unlike a writer of the power file,
    // whom kernfs's active reference makes `pci_hp_del()` wait for, this call is not waited
    // for, so a removal of the port itself during it can free the hot-plug controller under
    // it. That race is known and open (`Documentation/design.rst`, "Graceful removal"); the
    // interface that would close it is named there.
    let ret = unsafe { (op.op)(op.slot) };
    error::to_result(ret)
}
