// SPDX-License-Identifier: GPL-2.0-only

//! This host's side of binding: finding the function the firmware hot-plugged behind one of
//! our virtual switch's downstream ports, removing it gracefully before the firmware takes it
//! away, and the ACS settings of those ports.
//!
//! Topology: the management endpoint is function 1 beside the switch's upstream port
//! (function 0 of the same slot); logical port `L` of this host is the downstream port at
//! device `L` on the upstream port's secondary bus; a bound function is device 0 function 0
//! behind it.
//!
//! Walks of this tree use the PCI core's counted lookups and keep counted references
//! ([`pci_tree`]); they take no lock that device removal or pciehp hold while they wait for
//! pcifab (its probe and remove run under the PCI rescan/remove lock when the switch comes or
//! goes), and nothing here holds a lock while it waits for the PCI core or pciehp.
//!
//! Graceful removal goes through the downstream port's hot-plug slot, as writing `0` to the
//! slot's sysfs `power` file does ([`slot`]): pciehp unbinds the function's driver, removes the
//! device and turns the slot's power off, and a switch (QEMU's downstream port included)
//! detaches a function whose slot is powered off at once, without the attention-button wait of
//! a surprise unplug.

use kernel::{
    pci,
    prelude::*,
    sync::aref::ARef,
    time::{delay::fsleep, Delta},
};

use crate::kext::{
    iomem,
    pci_tree::{self, devfn},
    slot,
};

/// Logical downstream ports of a host's virtual switch this driver uses.
pub(crate) const LOG_PORTS: u8 = 4;

/// Status of a PCI function found behind a port.
pub(crate) struct Found {
    /// `dev_name()` of the function, e.g. `0000:03:00.0`, NUL-padded.
    pub(crate) name: [u8; 16],
    pub(crate) vendor: u16,
    pub(crate) device: u16,
}

/// The downstream port of logical port `port` of the switch `mep` belongs to.
fn downstream_port(mep: &pci::Device, port: u8) -> Option<ARef<pci::Device>> {
    if port >= LOG_PORTS {
        return None;
    }
    let usp = pci_tree::sibling(mep, devfn(0, 0))?;
    pci_tree::child(&usp, devfn(port, 0))
}

/// The function bound behind logical port `port`, if this host has enumerated one.
fn function_at(mep: &pci::Device, port: u8) -> Option<ARef<pci::Device>> {
    let dsp = downstream_port(mep, port)?;
    pci_tree::child(&dsp, devfn(0, 0))
}

/// Whether functions 0 to `count - 1` behind logical port `port` are all enumerated here.
pub(crate) fn functions_present(mep: &pci::Device, port: u8, count: usize) -> bool {
    let Some(dsp) = downstream_port(mep, port) else {
        return false;
    };
    (0..count).all(|f| {
        u8::try_from(f).is_ok_and(|f| f < 8 && pci_tree::child(&dsp, devfn(0, f)).is_some())
    })
}

/// Describes the function behind logical port `port`, if it is enumerated here.
pub(crate) fn find(mep: &pci::Device, port: u8) -> Option<Found> {
    let f = function_at(mep, port)?;
    Some(Found {
        name: pci_tree::name(&f),
        vendor: f.vendor_id().as_raw(),
        device: f.device_id(),
    })
}

/// `PCI_EXT_CAP_ID_ACS` and the ACS control register (`include/uapi/linux/pci_regs.h`).
const EXT_CAP_ID_ACS: u16 = 0x0d;
const ACS_CTRL: u16 = 6;
const ACS_SV: u16 = 1 << 0;
const ACS_RR: u16 = 1 << 2;
const ACS_CR: u16 = 1 << 3;
const ACS_UF: u16 = 1 << 4;
const ACS_EC: u16 = 1 << 5;

/// Where the ACS control register of `d` is, if it has an ACS capability.
fn acs_ctrl_pos(d: &pci::Device) -> Option<u16> {
    pci_tree::find_ext_capability(d, EXT_CAP_ID_ACS)?.checked_add(ACS_CTRL)
}

/// One downstream port whose ACS control probe changed.
struct SavedAcs {
    port: u8,
    dev: ARef<pci::Device>,
    pos: u16,
    before: u16,
    after: u16,
}

/// The ACS control of this switch's downstream ports as probe found them, when probe changed
/// it; dropping it (at remove) puts them back.
///
/// With an IOMMU the kernel sets Request and Completion Redirect on every ACS-capable port,
/// so a peer request climbs to the root complex and through the IOMMU, and it forms the IOMMU
/// groups on the strength of that isolation: VFIO hands each function behind its own port to
/// its own user. Clearing RR, CR and Egress Control afterwards lets those functions reach each
/// other's BARs through the switch while the groups (formed before) still say they are
/// isolated. So probe changes nothing by default; only the opt-in module parameter
/// `p2p_acs_relax` (for hosts that trust every function behind the switch) makes it clear
/// them on all of its own switch's downstream ports, keeping Source Validation and Upstream
/// Forwarding (`Documentation/design.rst`, "P2P and ACS").
pub(crate) struct AcsRestore {
    saved: [Option<SavedAcs>; LOG_PORTS as usize],
}

impl AcsRestore {
    /// Changes nothing (the default: isolation as the kernel set it up).
    pub(crate) fn none() -> Self {
        Self {
            saved: Default::default(),
        }
    }

    /// Lets peer requests between this host's downstream ports go through the switch,
    /// remembering what each port had.
    pub(crate) fn apply(mep: &pci::Device) -> Self {
        let mut saved: [Option<SavedAcs>; LOG_PORTS as usize] = Default::default();
        for (port, s) in (0..LOG_PORTS).zip(saved.iter_mut()) {
            let Some(dev) = downstream_port(mep, port) else {
                continue;
            };
            let Some(pos) = acs_ctrl_pos(&dev) else {
                continue;
            };
            let Ok(before) = pci_tree::read_config_u16(&dev, pos) else {
                continue;
            };
            let want = (before & !(ACS_RR | ACS_CR | ACS_EC)) | ACS_SV | ACS_UF;
            if want == before || pci_tree::write_config_u16(&dev, pos, want).is_err() {
                continue;
            }
            let after = pci_tree::read_config_u16(&dev, pos).unwrap_or(want);
            dev_info!(
                mep,
                "logical port {}: ACS control {:#06x} -> {:#06x} (P2P through the switch)\n",
                port,
                before,
                after
            );
            *s = Some(SavedAcs {
                port,
                dev,
                pos,
                before,
                after,
            });
        }
        Self { saved }
    }
}

impl Drop for AcsRestore {
    fn drop(&mut self) {
        for s in self.saved.iter_mut().filter_map(Option::take) {
            // A value changed since probe (`setpci` by an administrator) is theirs to keep.
            match pci_tree::read_config_u16(&s.dev, s.pos) {
                Ok(now) if now == s.after => {
                    if pci_tree::write_config_u16(&s.dev, s.pos, s.before).is_ok() {
                        dev_info!(
                            &*s.dev,
                            "logical port {}: ACS control restored to {:#06x}\n",
                            s.port,
                            s.before
                        );
                    }
                }
                Ok(now) => dev_info!(
                    &*s.dev,
                    "logical port {}: ACS control changed since probe ({:#06x}), left as is\n",
                    s.port,
                    now
                ),
                // The port is gone (or unreachable): nothing to restore.
                Err(_) => {}
            }
        }
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
    let ports = [downstream_port(mep, a), downstream_port(mep, b)];
    let (fa, fb) = (function_at(mep, a), function_at(mep, b));
    let acs_redirect = ports.iter().flatten().any(|d| {
        acs_ctrl_pos(d)
            .and_then(|pos| pci_tree::read_config_u16(d, pos).ok())
            .is_some_and(|v| v & (ACS_RR | ACS_CR | ACS_EC) != 0)
    });
    let distance = match (fa, fb) {
        (Some(fa), Some(fb)) => pci_tree::p2p_distance(&fa, &fb),
        _ => -1,
    };
    Distance {
        distance,
        acs_redirect,
    }
}

/// How a function left this host.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Removal {
    /// Nothing was enumerated behind the port.
    NotPresent,
    /// The hot-plug slot removed it and powered the slot off.
    SlotPoweredOff,
    /// The device was removed; the slot (if any) stays powered.
    DeviceRemoved,
}

/// Functions of one device behind a port: a multi-function binding has up to eight.
const FUNCTIONS: u8 = 8;

/// Removes the device behind logical port `port` from this host, every function of it: their
/// drivers are unbound, the functions removed and the slot powered off (through the slot's
/// hot-plug driver, as the slot's `power` file does), before the firmware is asked to take
/// them; where the port has no hot-plug slot the functions are removed only. User-space
/// mappings of their BARs are revoked (accesses then get `SIGBUS`).
///
/// Must be called without locks: it waits for the PCI core and pciehp, and pciehp takes the
/// rescan/remove lock. Nothing that the removal of the endpoint waits for may call it (see
/// [`crate::compose::Compose::enter_hotplug`]).
pub(crate) fn remove(mep: &pci::Device, port: u8) -> Result<Removal> {
    let Some(dsp) = downstream_port(mep, port) else {
        return Ok(Removal::NotPresent);
    };
    let funcs: [Option<ARef<pci::Device>>; FUNCTIONS as usize] =
        core::array::from_fn(|f| pci_tree::child(&dsp, devfn(0, f as u8)));
    let Some(f) = funcs.iter().flatten().next() else {
        return Ok(Removal::NotPresent);
    };
    let delay = crate::removal_delay_ms();
    if delay != 0 {
        dev_notice!(
            mep,
            "port {}: removal delayed by {} ms as removal_delay_ms asks\n",
            port,
            delay
        );
        fsleep(Delta::from_millis(i64::from(delay)));
    }
    let bars = funcs
        .each_ref()
        .map(|f| f.as_deref().map(pci_tree::memory_bars));
    let removal = match slot::disable(f) {
        Ok(()) => Removal::SlotPoweredOff,
        Err(e) => {
            dev_info!(
                mep,
                "port {}: slot power-off not possible ({:?}); removing the device only\n",
                port,
                e
            );
            // Every function, the highest first as pciehp does: one left behind would be
            // surprise-removed under its driver when the firmware takes the device.
            for f in funcs.into_iter().rev().flatten() {
                pci_tree::stop_and_remove(f);
            }
            Removal::DeviceRemoved
        }
    };
    if !cfg!(CONFIG_IO_STRICT_DEVMEM) {
        dev_warn!(
            mep,
            "kernel without CONFIG_IO_STRICT_DEVMEM: user mappings of the function's BARs stay\n"
        );
    }
    for (start, len) in bars
        .into_iter()
        .flatten()
        .flatten()
        .filter(|&(_, len)| len != 0)
    {
        if !iomem::revoke_user_mappings(start, len) {
            dev_warn!(
                mep,
                "could not revoke user mappings of [{:#x}, {:#x}]: the range is in use\n",
                start,
                start.saturating_add(len - 1)
            );
        }
    }
    Ok(removal)
}
