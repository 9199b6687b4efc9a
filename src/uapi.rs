// SPDX-License-Identifier: GPL-2.0-only

//! The ioctl ABI, mirrored from `include/uapi/linux/pcifab.h` (the one definition).
//!
//! The sizes and ioctl numbers are asserted at build time against the values the header
//! documents; the userspace mirror in `tools/pcifab-uapi` checks the same against the header
//! compiled by a C compiler.

use core::mem::size_of;

use kernel::{
    ioctl::{_IO, _IOWR},
    transmute::{AsBytes, FromBytes},
};

pub(crate) const VERSION_MAJOR: u32 = 1;
pub(crate) const VERSION_MINOR: u32 = 8;

const IOCTL_TYPE: u32 = 0xFA;
pub(crate) const PCIFAB_IOCTL_VERSION: u32 = _IOWR::<Version>(IOCTL_TYPE, 0x00);
pub(crate) const PCIFAB_IOCTL_IDENTITY: u32 = _IOWR::<Identity>(IOCTL_TYPE, 0x01);
pub(crate) const PCIFAB_IOCTL_MRPC: u32 = _IOWR::<Mrpc>(IOCTL_TYPE, 0x02);
pub(crate) const PCIFAB_IOCTL_STATS: u32 = _IOWR::<Stats>(IOCTL_TYPE, 0x03);
pub(crate) const PCIFAB_IOCTL_EVENTS: u32 = _IOWR::<Events>(IOCTL_TYPE, 0x04);
pub(crate) const PCIFAB_IOCTL_INVENTORY: u32 = _IOWR::<Inventory>(IOCTL_TYPE, 0x05);
pub(crate) const PCIFAB_IOCTL_BIND: u32 = _IOWR::<Bind>(IOCTL_TYPE, 0x06);
pub(crate) const PCIFAB_IOCTL_UNBIND: u32 = _IOWR::<Unbind>(IOCTL_TYPE, 0x07);
pub(crate) const PCIFAB_IOCTL_MOVE: u32 = _IOWR::<Move>(IOCTL_TYPE, 0x08);
pub(crate) const PCIFAB_IOCTL_P2P_ROUTE_ADD: u32 = _IOWR::<P2pRoute>(IOCTL_TYPE, 0x09);
pub(crate) const PCIFAB_IOCTL_P2P_ROUTE_DEL: u32 = _IOWR::<P2pRoute>(IOCTL_TYPE, 0x0a);
pub(crate) const PCIFAB_IOCTL_P2P_ROUTES: u32 = _IOWR::<P2pRoutes>(IOCTL_TYPE, 0x0b);
pub(crate) const PCIFAB_IOCTL_P2P_COPY: u32 = _IOWR::<P2pCopy>(IOCTL_TYPE, 0x0c);
pub(crate) const PCIFAB_IOCTL_P2P_DISTANCE: u32 = _IOWR::<P2pDistance>(IOCTL_TYPE, 0x0d);
pub(crate) const PCIFAB_IOCTL_P2P_GRANT: u32 = _IOWR::<P2pGrant>(IOCTL_TYPE, 0x0e);
pub(crate) const PCIFAB_IOCTL_P2P_REVOKE: u32 = _IOWR::<P2pGrant>(IOCTL_TYPE, 0x0f);
pub(crate) const PCIFAB_IOCTL_P2P_GRANTS: u32 = _IOWR::<P2pGrants>(IOCTL_TYPE, 0x10);
pub(crate) const PCIFAB_IOCTL_P2P_REGISTER: u32 = _IOWR::<P2pBuffer>(IOCTL_TYPE, 0x11);
pub(crate) const PCIFAB_IOCTL_P2P_UNREGISTER: u32 = _IOWR::<P2pBuffer>(IOCTL_TYPE, 0x12);

/// The ioctl numbers of uAPI 1.0-1.6, `_IO(0xFA, nr)`, in `nr` order: aliases of the
/// numbers above, accepted so that programs built against an older header keep working.
const LEGACY: [u32; 17] = [
    PCIFAB_IOCTL_VERSION,
    PCIFAB_IOCTL_IDENTITY,
    PCIFAB_IOCTL_MRPC,
    PCIFAB_IOCTL_STATS,
    PCIFAB_IOCTL_EVENTS,
    PCIFAB_IOCTL_INVENTORY,
    PCIFAB_IOCTL_BIND,
    PCIFAB_IOCTL_UNBIND,
    PCIFAB_IOCTL_MOVE,
    PCIFAB_IOCTL_P2P_ROUTE_ADD,
    PCIFAB_IOCTL_P2P_ROUTE_DEL,
    PCIFAB_IOCTL_P2P_ROUTES,
    PCIFAB_IOCTL_P2P_COPY,
    PCIFAB_IOCTL_P2P_DISTANCE,
    PCIFAB_IOCTL_P2P_GRANT,
    PCIFAB_IOCTL_P2P_REVOKE,
    PCIFAB_IOCTL_P2P_GRANTS,
];

/// The ioctl `cmd` names: itself, or for a number of uAPI 1.0-1.6 (`_IO(0xFA, nr)`) the
/// current number of the same ioctl. Anything else is returned as is (and is `ENOTTY`).
pub(crate) fn canonical(cmd: u32) -> u32 {
    let nr = cmd & 0xff;
    match LEGACY.get(nr as usize) {
        Some(&now) if cmd == _IO(IOCTL_TYPE, nr) => now,
        _ => cmd,
    }
}

/// `PCIFAB_MRPC_USER_MIN_TIMEOUT_MS` and `PCIFAB_MRPC_USER_MAX_TIMEOUT_MS`: the MRPC
/// timeouts a caller without `CAP_SYS_ADMIN` may ask for (besides 0, the default).
pub(crate) const MRPC_USER_MIN_TIMEOUT_MS: u32 = 1_000;
pub(crate) const MRPC_USER_MAX_TIMEOUT_MS: u32 = 10_000;

/// `PCIFAB_ROUTE_ANY_WINDOW`.
pub(crate) const ROUTE_ANY_WINDOW: u64 = u64::MAX;
/// `PCIFAB_P2P_FUNCTION`, `PCIFAB_P2P_USER`, `PCIFAB_P2P_IOVA`, `PCIFAB_P2P_PEER`.
pub(crate) const P2P_FUNCTION: u32 = 0;
pub(crate) const P2P_USER: u32 = 1;
pub(crate) const P2P_IOVA: u32 = 2;
/// A buffer a peer host registered for this one: `pdfid` is the peer's HFID, `reserved0`
/// (`slot` in the header) the slot, `addr` the offset in the buffer.
pub(crate) const P2P_PEER: u32 = 3;
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

/// `struct pcifab_identity` up to `__reserved0` (uAPI 1.0).
const IDENTITY_V1_SIZE: usize = 68;
/// `struct pcifab_bind` up to `name` (uAPI 1.0).
const BIND_V1_SIZE: usize = 40;
/// `struct pcifab_bind.pdfids`: functions one bind names at most.
pub(crate) const BIND_MAX_PDFIDS: usize = 8;

/// An ioctl argument struct: `size` and `flags` first, as `include/uapi/linux/pcifab.h` says.
pub(crate) trait SizedArg: FromBytes + AsBytes + Default {
    /// Size of the first published version of the struct; smaller is `EINVAL`.
    const MIN_SIZE: usize;
    /// `flags` bits this version understands.
    const FLAGS: u32;
    /// The `flags` field.
    fn flags(&self) -> u32;
}

/// Compiles only for types every byte pattern of which is valid and which have no padding.
// Used in `abi!`'s constants, which rustc 1.85 does not count as uses.
#[allow(dead_code)]
const fn assert_abi<T: FromBytes + AsBytes>() {}

/// Declares uAPI structs.
///
/// `struct Name[SIZE] { field: type, ... }` becomes a `#[repr(C)]` struct with `pub(crate)`
/// fields that are integers, integer arrays or other uAPI structs, checked at compile time to
/// be exactly `SIZE` bytes (the size the C header gives it) and the sum of its fields (so it
/// has no padding), and made [`FromBytes`] and [`AsBytes`].
macro_rules! abi {
    ($(
        $(#[$m:meta])*
        struct $name:ident[$size:expr] {
            $( $f:ident : $t:ty ),* $(,)?
        }
    )*) => {$(
        $(#[$m])*
        #[repr(C)]
        pub(crate) struct $name { $( pub(crate) $f: $t ),* }

        const _: () = {
            $( assert_abi::<$t>(); )*
            assert!(size_of::<$name>() == $size);
            assert!(size_of::<$name>() == 0 $( + size_of::<$t>() )*);
        };

        // SAFETY: `$name` is `#[repr(C)]`, every field is `FromBytes` (checked above), and its
        // size is the sum of its fields' sizes (checked above), so it has no padding and any
        // byte pattern of that size is a valid value.
        unsafe impl FromBytes for $name {}
        // SAFETY: Every field is `AsBytes` and, with no room for padding (checked above), every
        // byte of a value is initialised.
        unsafe impl AsBytes for $name {}
    )*};
}

abi! {
    /// `struct pcifab_version`.
    #[derive(Default)]
    struct Version[16] {
        size: u32,
        flags: u32,
        major: u32,
        minor: u32,
    }

    /// `struct pcifab_identity`.
    #[derive(Default)]
    struct Identity[76] {
        size: u32,
        flags: u32,
        pci_vendor: u16,
        pci_device: u16,
        device_id: u32,
        device_version: u32,
        fw_version: u32,
        partition: u32,
        partition_count: u32,
        vendor_id: [u8; 8],
        product_id: [u8; 24],
        product_revision: [u8; 2],
        reserved0: u16,
        features: u32,
        pax_id: u32,
    }


    /// `struct pcifab_mrpc`.
    #[derive(Default)]
    struct Mrpc[48] {
        size: u32,
        flags: u32,
        cmd: u32,
        in_len: u32,
        out_len: u32,
        timeout_ms: u32,
        in_ptr: u64,
        out_ptr: u64,
        status: u32,
        ret_value: u32,
    }

    /// `struct pcifab_stats`.
    #[derive(Default)]
    struct Stats[48] {
        size: u32,
        flags: u32,
        mrpc_commands: u64,
        mrpc_completions: u64,
        mrpc_timeouts: u64,
        mrpc_firmware_dead: u64,
        event_irqs: u64,
    }

    /// `struct pcifab_events`.
    #[derive(Default)]
    struct Events[56] {
        size: u32,
        flags: u32,
        timeout_ms: u32,
        reserved0: u32,
        seen: u64,
        total: u64,
        link: u64,
        gfms: u64,
        irqs: u64,
    }

    /// `struct pcifab_port`.
    #[derive(Default)]
    struct Port[8] {
        phys_port: u8,
        kind: u8,
        link_up: u8,
        width: u8,
        rate: u8,
        reserved: [u8; 3],
    }

    /// `struct pcifab_function`.
    #[derive(Default)]
    struct Function[24] {
        pdfid: u16,
        pf_pdfid: u16,
        vendor: u16,
        device: u16,
        class_code: u32,
        phys_port: u8,
        vf_index: u8,
        total_vfs: u8,
        flags: u8,
        bound_host: u8,
        bound_port: u8,
        reserved0: u16,
        reserved1: u32,
    }

    /// `struct pcifab_inventory`.
    #[derive(Default)]
    struct Inventory[48] {
        size: u32,
        flags: u32,
        generation: u32,
        partition: u16,
        host_count: u16,
        nr_ports: u32,
        nr_functions: u32,
        port_size: u32,
        function_size: u32,
        ports_ptr: u64,
        functions_ptr: u64,
    }

    /// `struct pcifab_bind`.
    #[derive(Default)]
    struct Bind[60] {
        size: u32,
        flags: u32,
        pdfid: u16,
        host: u8,
        port: u8,
        timeout_ms: u32,
        fw_ret: u32,
        vendor: u16,
        device: u16,
        name: [u8; 16],
        nr_pdfids: u32,
        pdfids: [u16; BIND_MAX_PDFIDS],
    }

    /// `struct pcifab_unbind`.
    #[derive(Default)]
    struct Unbind[24] {
        size: u32,
        flags: u32,
        pdfid: u16,
        host: u8,
        port: u8,
        timeout_ms: u32,
        fw_ret: u32,
        reserved0: u32,
    }

    /// `struct pcifab_move`.
    #[derive(Default)]
    struct Move[44] {
        size: u32,
        flags: u32,
        pdfid: u16,
        host: u8,
        port: u8,
        timeout_ms: u32,
        fw_ret: u32,
        vendor: u16,
        device: u16,
        name: [u8; 16],
        from_host: u8,
        from_port: u8,
        reserved0: u16,
    }

    /// `struct pcifab_route`.
    #[derive(Default, Clone, Copy)]
    struct Route[32] {
        window_off: u64,
        size: u64,
        target_off: u64,
        pdfid: u16,
        target_host: u8,
        reserved0: u8,
        reserved1: u32,
    }

    /// `struct pcifab_p2p_route`.
    #[derive(Default)]
    struct P2pRoute[48] {
        size: u32,
        flags: u32,
        route: Route,
        fw_ret: u32,
        nr_routes: u32,
    }

    /// `struct pcifab_p2p_routes`.
    #[derive(Default)]
    struct P2pRoutes[32] {
        size: u32,
        flags: u32,
        nr_routes: u32,
        route_size: u32,
        routes_ptr: u64,
        window_size: u64,
    }

    /// `struct pcifab_p2p_end`.
    #[derive(Default, Clone, Copy)]
    struct P2pEnd[16] {
        kind: u32,
        pdfid: u16,
        reserved0: u16,
        addr: u64,
    }

    /// `struct pcifab_p2p_copy`.
    #[derive(Default)]
    struct P2pCopy[64] {
        size: u32,
        flags: u32,
        src: P2pEnd,
        dst: P2pEnd,
        len: u64,
        done: u64,
        dma_status: u32,
        timeout_ms: u32,
    }

    /// `struct pcifab_p2p_distance`.
    #[derive(Default)]
    struct P2pDistance[32] {
        size: u32,
        flags: u32,
        a: u16,
        b: u16,
        path: u32,
        hops: u32,
        pci_distance: i32,
        info: u32,
        reserved0: u32,
    }

    /// `struct pcifab_p2p_grant`.
    #[derive(Default)]
    struct P2pGrant[24] {
        size: u32,
        flags: u32,
        pdfid: u16,
        grantee: u8,
        reserved0: u8,
        fw_ret: u32,
        nr_grants: u32,
        reserved1: u32,
    }

    /// `struct pcifab_grant`.
    #[derive(Default, Clone, Copy)]
    struct Grant[8] {
        pdfid: u16,
        holder: u8,
        grantee: u8,
        reserved: u32,
    }

    /// `struct pcifab_p2p_grants`.
    #[derive(Default)]
    struct P2pGrants[24] {
        size: u32,
        flags: u32,
        nr_grants: u32,
        grant_size: u32,
        grants_ptr: u64,
    }

    /// `struct pcifab_p2p_buffer`.
    #[derive(Default)]
    struct P2pBuffer[40] {
        size: u32,
        flags: u32,
        peer: u16,
        slot: u8,
        reserved0: u8,
        hfid: u16,
        reserved1: u16,
        fw_ret: u32,
        reserved2: u32,
        addr: u64,
        len: u64,
    }
}

// The numbers the header gives: `_IOWR` (direction 3 in bits 30-31), the struct's size in bits
// 16-29, type 0xFA, nr.
const _: () = assert!(PCIFAB_IOCTL_VERSION == 0xc010_fa00 && PCIFAB_IOCTL_IDENTITY == 0xc04c_fa01);
const _: () = assert!(PCIFAB_IOCTL_BIND == 0xc03c_fa06 && PCIFAB_IOCTL_P2P_COPY == 0xc040_fa0c);
const _: () = assert!(PCIFAB_IOCTL_P2P_GRANTS == 0xc018_fa10);
const _: () = assert!(PCIFAB_IOCTL_P2P_REGISTER == 0xc028_fa11);
const _: () = assert!(PCIFAB_IOCTL_P2P_UNREGISTER == 0xc028_fa12);
// The old ones, their aliases.
const _: () = assert!(_IO(IOCTL_TYPE, 0x00) == 0xfa00 && _IO(IOCTL_TYPE, 0x10) == 0xfa10);

/// Implements [`SizedArg`] for argument structs of the first version, with no flags.
macro_rules! sized_args {
    ($($t:ty),* $(,)?) => {$(
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
    P2pBuffer,
);

impl SizedArg for Identity {
    const MIN_SIZE: usize = IDENTITY_V1_SIZE;
    const FLAGS: u32 = 0;
    fn flags(&self) -> u32 {
        self.flags
    }
}

impl SizedArg for Bind {
    const MIN_SIZE: usize = BIND_V1_SIZE;
    const FLAGS: u32 = BIND_NO_WAIT;
    fn flags(&self) -> u32 {
        self.flags
    }
}

impl SizedArg for Events {
    const MIN_SIZE: usize = size_of::<Self>();
    const FLAGS: u32 = EVENTS_WAIT;
    fn flags(&self) -> u32 {
        self.flags
    }
}
