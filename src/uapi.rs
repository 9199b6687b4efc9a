// SPDX-License-Identifier: GPL-2.0-only

//! The ioctl ABI, mirrored from `include/uapi/linux/pcifab.h` (the one definition).
//!
//! The sizes and ioctl numbers are asserted at build time against the values the header
//! documents; the userspace mirror in `tools/pcifab-uapi` checks the same against the header
//! compiled by a C compiler.

use core::mem::size_of;

use kernel::{
    ioctl::_IO,
    transmute::{AsBytes, FromBytes},
};

use crate::chardev::SizedArg;

pub(crate) const VERSION_MAJOR: u32 = 1;
pub(crate) const VERSION_MINOR: u32 = 6;

const IOCTL_TYPE: u32 = 0xFA;
pub(crate) const PCIFAB_IOCTL_VERSION: u32 = _IO(IOCTL_TYPE, 0x00);
pub(crate) const PCIFAB_IOCTL_IDENTITY: u32 = _IO(IOCTL_TYPE, 0x01);
pub(crate) const PCIFAB_IOCTL_MRPC: u32 = _IO(IOCTL_TYPE, 0x02);
pub(crate) const PCIFAB_IOCTL_STATS: u32 = _IO(IOCTL_TYPE, 0x03);
pub(crate) const PCIFAB_IOCTL_EVENTS: u32 = _IO(IOCTL_TYPE, 0x04);
pub(crate) const PCIFAB_IOCTL_INVENTORY: u32 = _IO(IOCTL_TYPE, 0x05);
pub(crate) const PCIFAB_IOCTL_BIND: u32 = _IO(IOCTL_TYPE, 0x06);
pub(crate) const PCIFAB_IOCTL_UNBIND: u32 = _IO(IOCTL_TYPE, 0x07);
pub(crate) const PCIFAB_IOCTL_MOVE: u32 = _IO(IOCTL_TYPE, 0x08);
pub(crate) const PCIFAB_IOCTL_P2P_ROUTE_ADD: u32 = _IO(IOCTL_TYPE, 0x09);
pub(crate) const PCIFAB_IOCTL_P2P_ROUTE_DEL: u32 = _IO(IOCTL_TYPE, 0x0a);
pub(crate) const PCIFAB_IOCTL_P2P_ROUTES: u32 = _IO(IOCTL_TYPE, 0x0b);
pub(crate) const PCIFAB_IOCTL_P2P_COPY: u32 = _IO(IOCTL_TYPE, 0x0c);
pub(crate) const PCIFAB_IOCTL_P2P_DISTANCE: u32 = _IO(IOCTL_TYPE, 0x0d);
pub(crate) const PCIFAB_IOCTL_P2P_GRANT: u32 = _IO(IOCTL_TYPE, 0x0e);
pub(crate) const PCIFAB_IOCTL_P2P_REVOKE: u32 = _IO(IOCTL_TYPE, 0x0f);
pub(crate) const PCIFAB_IOCTL_P2P_GRANTS: u32 = _IO(IOCTL_TYPE, 0x10);

/// `PCIFAB_ROUTE_ANY_WINDOW`.
pub(crate) const ROUTE_ANY_WINDOW: u64 = u64::MAX;
/// `PCIFAB_P2P_FUNCTION`, `PCIFAB_P2P_USER`, `PCIFAB_P2P_IOVA`.
pub(crate) const P2P_FUNCTION: u32 = 0;
pub(crate) const P2P_USER: u32 = 1;
pub(crate) const P2P_IOVA: u32 = 2;
/// `PCIFAB_P2P_MAX_LEN`.
pub(crate) const P2P_MAX_LEN: u64 = 1 << 30;
/// `PCIFAB_P2P_MAX_TIMEOUT_MS`.
pub(crate) const P2P_MAX_TIMEOUT_MS: u32 = 600_000;
/// `PCIFAB_P2P_PATH_*`.
pub(crate) const P2P_PATH_SAME: u32 = 0;
pub(crate) const P2P_PATH_SWITCH: u32 = 1;
pub(crate) const P2P_PATH_FABRIC: u32 = 2;
/// `struct pcifab_p2p_distance.info` bits.
pub(crate) const P2P_A_LOCAL: u32 = 1 << 0;
pub(crate) const P2P_B_LOCAL: u32 = 1 << 1;
pub(crate) const P2P_A_ROUTED: u32 = 1 << 2;
pub(crate) const P2P_B_ROUTED: u32 = 1 << 3;
pub(crate) const P2P_ACS_REDIRECT: u32 = 1 << 4;

/// `PCIFAB_ANY_PORT`.
pub(crate) const ANY_PORT: u8 = 0xff;
/// `PCIFAB_BIND_NO_WAIT`.
pub(crate) const BIND_NO_WAIT: u32 = 1 << 0;
/// `PCIFAB_BIND_MAX_TIMEOUT_MS`.
pub(crate) const BIND_MAX_TIMEOUT_MS: u32 = 120_000;

/// `PCIFAB_EVENTS_WAIT`.
pub(crate) const EVENTS_WAIT: u32 = 1 << 0;
/// `PCIFAB_UNBOUND`.
pub(crate) const UNBOUND: u8 = 0xff;

/// `struct pcifab_version`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Version {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) major: u32,
    pub(crate) minor: u32,
}

/// `struct pcifab_identity`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Identity {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) pci_vendor: u16,
    pub(crate) pci_device: u16,
    pub(crate) device_id: u32,
    pub(crate) device_version: u32,
    pub(crate) fw_version: u32,
    pub(crate) partition: u32,
    pub(crate) partition_count: u32,
    pub(crate) vendor_id: [u8; 8],
    pub(crate) product_id: [u8; 24],
    pub(crate) product_revision: [u8; 2],
    pub(crate) reserved0: u16,
    pub(crate) features: u32,
    pub(crate) pax_id: u32,
}

/// `struct pcifab_identity` up to `__reserved0` (uAPI 1.0).
const IDENTITY_V1_SIZE: usize = 68;
/// `struct pcifab_bind` up to `name` (uAPI 1.0).
const BIND_V1_SIZE: usize = 40;
/// `struct pcifab_bind.pdfids`: functions one bind names at most.
pub(crate) const BIND_MAX_PDFIDS: usize = 8;

/// `struct pcifab_mrpc`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Mrpc {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) cmd: u32,
    pub(crate) in_len: u32,
    pub(crate) out_len: u32,
    pub(crate) timeout_ms: u32,
    pub(crate) in_ptr: u64,
    pub(crate) out_ptr: u64,
    pub(crate) status: u32,
    pub(crate) ret_value: u32,
}

/// `struct pcifab_stats`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) mrpc_commands: u64,
    pub(crate) mrpc_completions: u64,
    pub(crate) mrpc_timeouts: u64,
    pub(crate) mrpc_firmware_dead: u64,
    pub(crate) event_irqs: u64,
}

/// `struct pcifab_events`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Events {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) timeout_ms: u32,
    pub(crate) reserved0: u32,
    pub(crate) seen: u64,
    pub(crate) total: u64,
    pub(crate) link: u64,
    pub(crate) gfms: u64,
    pub(crate) irqs: u64,
}

/// `struct pcifab_port`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Port {
    pub(crate) phys_port: u8,
    pub(crate) kind: u8,
    pub(crate) link_up: u8,
    pub(crate) width: u8,
    pub(crate) rate: u8,
    pub(crate) reserved: [u8; 3],
}

/// `struct pcifab_function`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Function {
    pub(crate) pdfid: u16,
    pub(crate) pf_pdfid: u16,
    pub(crate) vendor: u16,
    pub(crate) device: u16,
    pub(crate) class_code: u32,
    pub(crate) phys_port: u8,
    pub(crate) vf_index: u8,
    pub(crate) total_vfs: u8,
    pub(crate) flags: u8,
    pub(crate) bound_host: u8,
    pub(crate) bound_port: u8,
    pub(crate) reserved0: u16,
    pub(crate) reserved1: u32,
}

/// `struct pcifab_inventory`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Inventory {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) generation: u32,
    pub(crate) partition: u16,
    pub(crate) host_count: u16,
    pub(crate) nr_ports: u32,
    pub(crate) nr_functions: u32,
    pub(crate) port_size: u32,
    pub(crate) function_size: u32,
    pub(crate) ports_ptr: u64,
    pub(crate) functions_ptr: u64,
}

/// `struct pcifab_bind`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Bind {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) pdfid: u16,
    pub(crate) host: u8,
    pub(crate) port: u8,
    pub(crate) timeout_ms: u32,
    pub(crate) fw_ret: u32,
    pub(crate) vendor: u16,
    pub(crate) device: u16,
    pub(crate) name: [u8; 16],
    pub(crate) nr_pdfids: u32,
    pub(crate) pdfids: [u16; BIND_MAX_PDFIDS],
}

/// `struct pcifab_unbind`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Unbind {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) pdfid: u16,
    pub(crate) host: u8,
    pub(crate) port: u8,
    pub(crate) timeout_ms: u32,
    pub(crate) fw_ret: u32,
    pub(crate) reserved0: u32,
}

/// `struct pcifab_move`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Move {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) pdfid: u16,
    pub(crate) host: u8,
    pub(crate) port: u8,
    pub(crate) timeout_ms: u32,
    pub(crate) fw_ret: u32,
    pub(crate) vendor: u16,
    pub(crate) device: u16,
    pub(crate) name: [u8; 16],
    pub(crate) from_host: u8,
    pub(crate) from_port: u8,
    pub(crate) reserved0: u16,
}

/// `struct pcifab_route`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct Route {
    pub(crate) window_off: u64,
    pub(crate) size: u64,
    pub(crate) target_off: u64,
    pub(crate) pdfid: u16,
    pub(crate) target_host: u8,
    pub(crate) reserved0: u8,
    pub(crate) reserved1: u32,
}

/// `struct pcifab_p2p_route`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct P2pRoute {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) route: Route,
    pub(crate) fw_ret: u32,
    pub(crate) nr_routes: u32,
}

/// `struct pcifab_p2p_routes`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct P2pRoutes {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) nr_routes: u32,
    pub(crate) route_size: u32,
    pub(crate) routes_ptr: u64,
    pub(crate) window_size: u64,
}

/// `struct pcifab_p2p_end`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct P2pEnd {
    pub(crate) kind: u32,
    pub(crate) pdfid: u16,
    pub(crate) reserved0: u16,
    pub(crate) addr: u64,
}

/// `struct pcifab_p2p_copy`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct P2pCopy {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) src: P2pEnd,
    pub(crate) dst: P2pEnd,
    pub(crate) len: u64,
    pub(crate) done: u64,
    pub(crate) dma_status: u32,
    pub(crate) timeout_ms: u32,
}

/// `struct pcifab_p2p_distance`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct P2pDistance {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) a: u16,
    pub(crate) b: u16,
    pub(crate) path: u32,
    pub(crate) hops: u32,
    pub(crate) pci_distance: i32,
    pub(crate) info: u32,
    pub(crate) reserved0: u32,
}

/// `struct pcifab_p2p_grant`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct P2pGrant {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) pdfid: u16,
    pub(crate) grantee: u8,
    pub(crate) reserved0: u8,
    pub(crate) fw_ret: u32,
    pub(crate) nr_grants: u32,
    pub(crate) reserved1: u32,
}

/// `struct pcifab_grant`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) pdfid: u16,
    pub(crate) holder: u8,
    pub(crate) grantee: u8,
    pub(crate) reserved: u32,
}

/// `struct pcifab_p2p_grants`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct P2pGrants {
    pub(crate) size: u32,
    pub(crate) flags: u32,
    pub(crate) nr_grants: u32,
    pub(crate) grant_size: u32,
    pub(crate) grants_ptr: u64,
}

const _: () = assert!(size_of::<P2pGrant>() == 24);
const _: () = assert!(size_of::<Grant>() == 8);
const _: () = assert!(size_of::<P2pGrants>() == 24);
const _: () = assert!(PCIFAB_IOCTL_P2P_GRANTS == 0xfa10);
const _: () = assert!(size_of::<Route>() == 32);
const _: () = assert!(size_of::<P2pRoute>() == 48);
const _: () = assert!(size_of::<P2pRoutes>() == 32);
const _: () = assert!(size_of::<P2pEnd>() == 16);
const _: () = assert!(size_of::<P2pCopy>() == 64);
const _: () = assert!(size_of::<P2pDistance>() == 32);
const _: () = assert!(PCIFAB_IOCTL_P2P_DISTANCE == 0xfa0d);
const _: () = assert!(size_of::<Unbind>() == 24);
const _: () = assert!(size_of::<Move>() == 44);
const _: () = assert!(size_of::<Events>() == 56);
const _: () = assert!(size_of::<Port>() == 8);
const _: () = assert!(size_of::<Function>() == 24);
const _: () = assert!(size_of::<Inventory>() == 48);
const _: () = assert!(size_of::<Version>() == 16);
const _: () = assert!(size_of::<Mrpc>() == 48);
const _: () = assert!(size_of::<Stats>() == 48);
const _: () = assert!(size_of::<Identity>() == 76);
const _: () = assert!(size_of::<Bind>() == 60);
const _: () = assert!(PCIFAB_IOCTL_VERSION == 0xfa00 && PCIFAB_IOCTL_IDENTITY == 0xfa01);

/// Implements the byte-view traits and [`SizedArg`] for argument structs.
macro_rules! sized_args {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: The struct is `repr(C)`, made only of integers and byte arrays, and has no
        // padding (its size is asserted above against the sum the C header gives); every bit
        // pattern is a valid value.
        unsafe impl FromBytes for $t {}
        // SAFETY: As above: `repr(C)`, integers and byte arrays only, no padding.
        unsafe impl AsBytes for $t {}

        impl SizedArg for $t {
            const MIN_SIZE: usize = size_of::<Self>();
            const FLAGS: u32 = 0;
            fn flags(&self) -> u32 {
                self.flags
            }
        }
    )*};
}

sized_args!(
    Version,
    Mrpc,
    Stats,
    Inventory,
    Unbind,
    Move,
    P2pRoute,
    P2pRoutes,
    P2pCopy,
    P2pDistance,
    P2pGrant,
    P2pGrants,
);

impl SizedArg for Identity {
    const MIN_SIZE: usize = IDENTITY_V1_SIZE;
    const FLAGS: u32 = 0;
    fn flags(&self) -> u32 {
        self.flags
    }
}

// SAFETY: `repr(C)`, integers and byte arrays only, no padding (size asserted above).
unsafe impl FromBytes for Identity {}
// SAFETY: As above.
unsafe impl AsBytes for Identity {}

impl SizedArg for Bind {
    const MIN_SIZE: usize = BIND_V1_SIZE;
    const FLAGS: u32 = BIND_NO_WAIT;
    fn flags(&self) -> u32 {
        self.flags
    }
}

// SAFETY: `repr(C)`, integers and byte arrays only, no padding (size asserted above).
unsafe impl FromBytes for Bind {}
// SAFETY: As above.
unsafe impl AsBytes for Bind {}

impl SizedArg for Events {
    const MIN_SIZE: usize = size_of::<Self>();
    const FLAGS: u32 = EVENTS_WAIT;
    fn flags(&self) -> u32 {
        self.flags
    }
}

// SAFETY: `repr(C)`, integers only, no padding (size asserted above); any bit pattern is valid.
unsafe impl FromBytes for Events {}
// SAFETY: As above.
unsafe impl AsBytes for Events {}
// SAFETY: `repr(C)`, bytes only; any bit pattern is valid.
unsafe impl AsBytes for Port {}
// SAFETY: `repr(C)`, integers only, no padding (size asserted above).
unsafe impl AsBytes for Function {}
// SAFETY: `repr(C)`, integers only, no padding (size asserted above); any bit pattern is valid.
unsafe impl AsBytes for Route {}
// SAFETY: As above.
unsafe impl FromBytes for Route {}
// SAFETY: `repr(C)`, integers only, no padding (size asserted above).
unsafe impl AsBytes for Grant {}
