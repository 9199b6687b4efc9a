// SPDX-License-Identifier: GPL-2.0-only

//! Rust mirror of `include/uapi/linux/pcifab.h`, the ioctl ABI of `/dev/pcifabN`.
//!
//! The header is the one definition; `tests/layout.rs` compiles it with the C compiler and
//! checks every size, field offset and ioctl number against this crate.

pub mod dev;
pub mod telemetry;

/// Major version of the ABI this crate describes (`PCIFAB_UAPI_VERSION_MAJOR`).
pub const VERSION_MAJOR: u32 = 1;
/// Minor version of the ABI this crate describes (`PCIFAB_UAPI_VERSION_MINOR`).
pub const VERSION_MINOR: u32 = 8;

/// ioctl type byte of pcifab (`PCIFAB_IOCTL_TYPE`).
pub const IOCTL_TYPE: u32 = 0xFA;

/// `_IO(type, nr)`: how uAPI 1.0-1.6 numbered the ioctls (see [`legacy`]).
pub const fn io(ty: u32, nr: u32) -> u32 {
    (ty << 8) | nr
}

/// `_IOWR(type, nr, T)`: read and written by the kernel, `T`'s size in bits 16-29.
pub const fn iowr<T>(ty: u32, nr: u32) -> u32 {
    (3 << 30) | ((std::mem::size_of::<T>() as u32) << 16) | (ty << 8) | nr
}

/// The number of ioctl `cmd` (a `PCIFAB_IOCTL_*`) in uAPI 1.0-1.6, `_IO(0xFA, nr)`, which
/// the kernel still accepts as an alias: what a program built against an older header sends.
pub const fn legacy(cmd: u32) -> u32 {
    io(IOCTL_TYPE, cmd & 0xff)
}

/// `PCIFAB_IOCTL_VERSION`: argument [`Version`].
pub const PCIFAB_IOCTL_VERSION: u32 = iowr::<Version>(IOCTL_TYPE, 0x00);
/// `PCIFAB_IOCTL_IDENTITY`: argument [`Identity`].
pub const PCIFAB_IOCTL_IDENTITY: u32 = iowr::<Identity>(IOCTL_TYPE, 0x01);
/// `PCIFAB_IOCTL_MRPC`: argument [`Mrpc`].
pub const PCIFAB_IOCTL_MRPC: u32 = iowr::<Mrpc>(IOCTL_TYPE, 0x02);
/// `PCIFAB_IOCTL_STATS`: argument [`Stats`].
pub const PCIFAB_IOCTL_STATS: u32 = iowr::<Stats>(IOCTL_TYPE, 0x03);

/// `PCIFAB_IOCTL_EVENTS`: argument [`Events`].
pub const PCIFAB_IOCTL_EVENTS: u32 = iowr::<Events>(IOCTL_TYPE, 0x04);
/// `PCIFAB_IOCTL_INVENTORY`: argument [`Inventory`].
pub const PCIFAB_IOCTL_INVENTORY: u32 = iowr::<Inventory>(IOCTL_TYPE, 0x05);

/// `PCIFAB_IOCTL_BIND`: argument [`Bind`].
pub const PCIFAB_IOCTL_BIND: u32 = iowr::<Bind>(IOCTL_TYPE, 0x06);
/// `PCIFAB_IOCTL_UNBIND`: argument [`Unbind`].
pub const PCIFAB_IOCTL_UNBIND: u32 = iowr::<Unbind>(IOCTL_TYPE, 0x07);
/// `PCIFAB_IOCTL_MOVE`: argument [`Move`].
pub const PCIFAB_IOCTL_MOVE: u32 = iowr::<Move>(IOCTL_TYPE, 0x08);
/// `PCIFAB_IOCTL_P2P_ROUTE_ADD`: argument [`P2pRoute`].
pub const PCIFAB_IOCTL_P2P_ROUTE_ADD: u32 = iowr::<P2pRoute>(IOCTL_TYPE, 0x09);
/// `PCIFAB_IOCTL_P2P_ROUTE_DEL`: argument [`P2pRoute`].
pub const PCIFAB_IOCTL_P2P_ROUTE_DEL: u32 = iowr::<P2pRoute>(IOCTL_TYPE, 0x0a);
/// `PCIFAB_IOCTL_P2P_ROUTES`: argument [`P2pRoutes`].
pub const PCIFAB_IOCTL_P2P_ROUTES: u32 = iowr::<P2pRoutes>(IOCTL_TYPE, 0x0b);
/// `PCIFAB_IOCTL_P2P_COPY`: argument [`P2pCopy`].
pub const PCIFAB_IOCTL_P2P_COPY: u32 = iowr::<P2pCopy>(IOCTL_TYPE, 0x0c);
/// `PCIFAB_IOCTL_P2P_DISTANCE`: argument [`P2pDistance`].
pub const PCIFAB_IOCTL_P2P_DISTANCE: u32 = iowr::<P2pDistance>(IOCTL_TYPE, 0x0d);
/// `PCIFAB_IOCTL_P2P_GRANT`: argument [`P2pGrant`] (since 1.5).
pub const PCIFAB_IOCTL_P2P_GRANT: u32 = iowr::<P2pGrant>(IOCTL_TYPE, 0x0e);
/// `PCIFAB_IOCTL_P2P_REVOKE`: argument [`P2pGrant`] (since 1.5).
pub const PCIFAB_IOCTL_P2P_REVOKE: u32 = iowr::<P2pGrant>(IOCTL_TYPE, 0x0f);
/// `PCIFAB_IOCTL_P2P_GRANTS`: argument [`P2pGrants`] (since 1.5).
pub const PCIFAB_IOCTL_P2P_GRANTS: u32 = iowr::<P2pGrants>(IOCTL_TYPE, 0x10);
/// `PCIFAB_IOCTL_P2P_REGISTER`: argument [`P2pBuffer`] (since 1.8).
pub const PCIFAB_IOCTL_P2P_REGISTER: u32 = iowr::<P2pBuffer>(IOCTL_TYPE, 0x11);
/// `PCIFAB_IOCTL_P2P_UNREGISTER`: argument [`P2pBuffer`] (since 1.8).
pub const PCIFAB_IOCTL_P2P_UNREGISTER: u32 = iowr::<P2pBuffer>(IOCTL_TYPE, 0x12);
/// `PCIFAB_ANY_PORT`.
pub const ANY_PORT: u8 = 0xff;
/// `PCIFAB_BIND_NO_WAIT`.
pub const BIND_NO_WAIT: u32 = 1 << 0;
/// `PCIFAB_BIND_MAX_TIMEOUT_MS`.
pub const BIND_MAX_TIMEOUT_MS: u32 = 120_000;

/// `PCIFAB_EVENTS_WAIT`.
pub const EVENTS_WAIT: u32 = 1 << 0;
/// `PCIFAB_PORT_*`: port types.
pub const PORT_UNUSED: u8 = 0;
pub const PORT_FABRIC: u8 = 1;
pub const PORT_ENDPOINT: u8 = 2;
pub const PORT_HOST: u8 = 3;
/// `PCIFAB_FN_*`: function flags.
pub const FN_VF: u8 = 1 << 0;
pub const FN_BOUND: u8 = 1 << 1;
pub const FN_LINK_UP: u8 = 1 << 2;
/// `PCIFAB_UNBOUND`.
pub const UNBOUND: u8 = 0xff;

/// `PCIFAB_ROUTE_ANY_WINDOW`: [`Route::window_off`] for ROUTE_ADD: the lowest free offset.
pub const ROUTE_ANY_WINDOW: u64 = !0;
/// `PCIFAB_P2P_ROUTE_ALIGN`: granule of route offsets and sizes.
pub const ROUTE_ALIGN: u64 = 4096;
/// `PCIFAB_P2P_MAX_TIMEOUT_MS`.
pub const P2P_MAX_TIMEOUT_MS: u32 = 600_000;
/// `PCIFAB_P2P_MAX_ROUTES`: most routes a host's MEP holds.
pub const MAX_ROUTES: usize = 16;
/// `PCIFAB_P2P_*`: [`P2pEnd::kind`].
pub const P2P_FUNCTION: u32 = 0;
pub const P2P_USER: u32 = 1;
pub const P2P_IOVA: u32 = 2;
/// A buffer a peer host registered for this one (since 1.8): [`P2pEnd::pdfid`] is the peer's
/// HFID, [`P2pEnd::reserved0`] (`slot` in the header) the slot, [`P2pEnd::addr`] the offset.
pub const P2P_PEER: u32 = 3;
/// `PCIFAB_P2P_PEER_SLOTS`: buffers a host may register for one peer.
pub const P2P_PEER_SLOTS: u8 = 6;
/// `PCIFAB_P2P_MAX_LEN`: largest copy.
pub const P2P_MAX_LEN: u64 = 1 << 30;
/// `PCIFAB_P2P_DMA_*`: [`P2pCopy::dma_status`] values (0: no descriptor ran).
pub const DMA_STATUS_NONE: u32 = 0;
pub const DMA_STATUS_OK: u32 = 1;
pub const DMA_STATUS_HOST_FAULT: u32 = 2;
pub const DMA_STATUS_ROUTE_FAULT: u32 = 3;
pub const DMA_STATUS_BAD: u32 = 4;
/// `PCIFAB_P2P_PATH_*`: [`P2pDistance::path`].
pub const P2P_PATH_SAME: u32 = 0;
pub const P2P_PATH_SWITCH: u32 = 1;
pub const P2P_PATH_FABRIC: u32 = 2;
/// `PCIFAB_P2P_*` bits of [`P2pDistance::info`].
pub const P2P_A_LOCAL: u32 = 1 << 0;
pub const P2P_B_LOCAL: u32 = 1 << 1;
pub const P2P_A_ROUTED: u32 = 1 << 2;
pub const P2P_B_ROUTED: u32 = 1 << 3;
pub const P2P_ACS_REDIRECT: u32 = 1 << 4;

/// `PCIFAB_MRPC_MAX_DATA`: largest MRPC input or output.
pub const MRPC_MAX_DATA: usize = 1024;
/// `PCIFAB_MRPC_MAX_TIMEOUT_MS`.
pub const MRPC_MAX_TIMEOUT_MS: u32 = 60_000;
/// `PCIFAB_MRPC_USER_MIN_TIMEOUT_MS` and `PCIFAB_MRPC_USER_MAX_TIMEOUT_MS`: the timeouts a
/// caller without `CAP_SYS_ADMIN` may ask for, besides 0.
pub const MRPC_USER_MIN_TIMEOUT_MS: u32 = 1_000;
pub const MRPC_USER_MAX_TIMEOUT_MS: u32 = 10_000;
/// MRPC status of a finished command.
pub const MRPC_STATUS_DONE: u32 = 2;
/// MRPC status of a command the firmware failed; `ret_value` says why.
pub const MRPC_STATUS_ERROR: u32 = 0xff;

/// An argument struct of the size-first convention.
///
/// # Safety
///
/// Implementors are `repr(C)` plain-old-data structs without padding whose first field is the
/// `u32` size, so any byte pattern is a valid value.
pub unsafe trait Arg: Default + Copy {
    /// A zeroed struct with `size` set.
    fn new() -> Self;
}

/// `struct pcifab_version`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Version {
    pub size: u32,
    pub flags: u32,
    pub major: u32,
    pub minor: u32,
}

/// `struct pcifab_identity`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub size: u32,
    pub flags: u32,
    pub pci_vendor: u16,
    pub pci_device: u16,
    pub device_id: u32,
    pub device_version: u32,
    pub fw_version: u32,
    pub partition: u32,
    pub partition_count: u32,
    pub vendor_id: [u8; 8],
    pub product_id: [u8; 24],
    pub product_revision: [u8; 2],
    pub reserved0: u16,
    /// Since 1.6: `FEATURE_*` bits.
    pub features: u32,
    /// Since 1.6: the switch's index in the fabric.
    pub pax_id: u32,
}

/// `PCIFAB_FEATURE_TELEMETRY`: per-function telemetry.
pub const FEATURE_TELEMETRY: u32 = 1 << 0;
/// `PCIFAB_FEATURE_P2P_ROUTES`: P2P window routes and grants.
pub const FEATURE_P2P_ROUTES: u32 = 1 << 1;
/// `PCIFAB_FEATURE_DMA_ENGINE`: the P2P DMA engine.
pub const FEATURE_DMA_ENGINE: u32 = 1 << 2;
/// `PCIFAB_FEATURE_UNBIND_REQUEST`: the unbind handshake event.
pub const FEATURE_UNBIND_REQUEST: u32 = 1 << 3;
/// `PCIFAB_BIND_MAX_PDFIDS`.
pub const BIND_MAX_PDFIDS: usize = 8;

/// `struct pcifab_mrpc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mrpc {
    pub size: u32,
    pub flags: u32,
    pub cmd: u32,
    pub in_len: u32,
    pub out_len: u32,
    pub timeout_ms: u32,
    pub in_ptr: u64,
    pub out_ptr: u64,
    pub status: u32,
    pub ret_value: u32,
}

/// `struct pcifab_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub size: u32,
    pub flags: u32,
    pub mrpc_commands: u64,
    pub mrpc_completions: u64,
    pub mrpc_timeouts: u64,
    pub mrpc_firmware_dead: u64,
    pub event_irqs: u64,
}

/// `struct pcifab_events`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    pub size: u32,
    pub flags: u32,
    pub timeout_ms: u32,
    pub reserved0: u32,
    pub seen: u64,
    pub total: u64,
    pub link: u64,
    pub gfms: u64,
    pub irqs: u64,
}

/// `struct pcifab_port`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Port {
    pub phys_port: u8,
    pub kind: u8,
    pub link_up: u8,
    pub width: u8,
    pub rate: u8,
    pub reserved: [u8; 3],
}

/// `struct pcifab_function`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Function {
    pub pdfid: u16,
    pub pf_pdfid: u16,
    pub vendor: u16,
    pub device: u16,
    pub class_code: u32,
    pub phys_port: u8,
    pub vf_index: u8,
    pub total_vfs: u8,
    pub flags: u8,
    pub bound_host: u8,
    pub bound_port: u8,
    pub reserved0: u16,
    pub reserved1: u32,
}

/// `struct pcifab_inventory`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    pub size: u32,
    pub flags: u32,
    pub generation: u32,
    pub partition: u16,
    pub host_count: u16,
    pub nr_ports: u32,
    pub nr_functions: u32,
    pub port_size: u32,
    pub function_size: u32,
    pub ports_ptr: u64,
    pub functions_ptr: u64,
}

/// `struct pcifab_bind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bind {
    pub size: u32,
    pub flags: u32,
    pub pdfid: u16,
    pub host: u8,
    pub port: u8,
    pub timeout_ms: u32,
    pub fw_ret: u32,
    pub vendor: u16,
    pub device: u16,
    pub name: [u8; 16],
    /// Since 1.6: functions in `pdfids` (0: `pdfid` alone).
    pub nr_pdfids: u32,
    /// Since 1.6: the functions bound together, `pdfids[0] == pdfid`.
    pub pdfids: [u16; BIND_MAX_PDFIDS],
}

/// `struct pcifab_unbind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unbind {
    pub size: u32,
    pub flags: u32,
    pub pdfid: u16,
    pub host: u8,
    pub port: u8,
    pub timeout_ms: u32,
    pub fw_ret: u32,
    pub reserved0: u32,
}

/// `struct pcifab_move`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Move {
    pub size: u32,
    pub flags: u32,
    pub pdfid: u16,
    pub host: u8,
    pub port: u8,
    pub timeout_ms: u32,
    pub fw_ret: u32,
    pub vendor: u16,
    pub device: u16,
    pub name: [u8; 16],
    pub from_host: u8,
    pub from_port: u8,
    pub reserved0: u16,
}

/// `struct pcifab_route`: one P2P route of this host's window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Route {
    pub window_off: u64,
    pub size: u64,
    pub target_off: u64,
    pub pdfid: u16,
    pub target_host: u8,
    pub reserved0: u8,
    pub reserved1: u32,
}

/// `struct pcifab_p2p_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pRoute {
    pub size: u32,
    pub flags: u32,
    pub route: Route,
    pub fw_ret: u32,
    pub nr_routes: u32,
}

/// `struct pcifab_p2p_routes`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pRoutes {
    pub size: u32,
    pub flags: u32,
    pub nr_routes: u32,
    pub route_size: u32,
    pub routes_ptr: u64,
    pub window_size: u64,
}

/// `struct pcifab_p2p_end`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pEnd {
    pub kind: u32,
    pub pdfid: u16,
    pub reserved0: u16,
    pub addr: u64,
}

/// `struct pcifab_p2p_copy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pCopy {
    pub size: u32,
    pub flags: u32,
    pub src: P2pEnd,
    pub dst: P2pEnd,
    pub len: u64,
    pub done: u64,
    pub dma_status: u32,
    pub timeout_ms: u32,
}

/// `struct pcifab_p2p_distance`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pDistance {
    pub size: u32,
    pub flags: u32,
    pub a: u16,
    pub b: u16,
    pub path: u32,
    pub hops: u32,
    pub pci_distance: i32,
    pub info: u32,
    pub reserved0: u32,
}

/// `struct pcifab_p2p_grant`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pGrant {
    pub size: u32,
    pub flags: u32,
    pub pdfid: u16,
    pub grantee: u8,
    pub reserved0: u8,
    pub fw_ret: u32,
    pub nr_grants: u32,
    pub reserved1: u32,
}

/// `struct pcifab_grant`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    pub pdfid: u16,
    pub holder: u8,
    pub grantee: u8,
    pub reserved: u32,
}

/// `struct pcifab_p2p_grants`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pGrants {
    pub size: u32,
    pub flags: u32,
    pub nr_grants: u32,
    pub grant_size: u32,
    pub grants_ptr: u64,
}

/// `struct pcifab_p2p_buffer` (since 1.8).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pBuffer {
    pub size: u32,
    pub flags: u32,
    pub peer: u16,
    pub slot: u8,
    pub reserved0: u8,
    pub hfid: u16,
    pub reserved1: u16,
    pub fw_ret: u32,
    pub reserved2: u32,
    pub addr: u64,
    pub len: u64,
}

macro_rules! impl_arg {
    ($($t:ty),*) => {$(
        // SAFETY: `repr(C)`, integers, byte arrays and structs of those only, no padding
        // (sizes checked against the C header in tests/layout.rs), `size` first.
        unsafe impl Arg for $t {
            fn new() -> Self {
                Self { size: core::mem::size_of::<Self>() as u32, ..Self::default() }
            }
        }
    )*};
}
impl_arg!(
    Version,
    Identity,
    Mrpc,
    Stats,
    Events,
    Inventory,
    Bind,
    Unbind,
    Move,
    P2pRoute,
    P2pRoutes,
    P2pCopy,
    P2pDistance,
    P2pGrant,
    P2pGrants,
    P2pBuffer
);

/// A fixed-size register string as text: up to the first NUL, trailing spaces removed.
pub fn fixed_str(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sets_size() {
        assert_eq!(Identity::new().size, 76);
        assert_eq!(Version::new().size, 16);
    }

    #[test]
    fn fixed_str_trims() {
        assert_eq!(fixed_str(b"PAX 28XG4   \0\0"), "PAX 28XG4");
        assert_eq!(fixed_str(b"MICROSEM"), "MICROSEM");
        assert_eq!(fixed_str(b"\0abc"), "");
    }
}
