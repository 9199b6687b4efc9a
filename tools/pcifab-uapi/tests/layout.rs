// SPDX-License-Identifier: GPL-2.0-only

//! Proves that the Rust mirror matches `include/uapi/linux/pcifab.h`: the header is compiled
//! by the system C compiler into a program that prints every size, offset and ioctl number,
//! and each is compared with this crate's value.

use std::{mem::offset_of, path::PathBuf, process::Command};

use pcifab_uapi::*;

/// Builds and runs the C probe, returning its `name value` lines.
fn c_layout() -> Vec<(String, u64)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let header = root.join("include/uapi/linux/pcifab.h");
    let dir = std::env::temp_dir().join(format!("pcifab-uapi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let src = dir.join("probe.c");
    let mut c = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"{}\"\nint main(void) {{\n",
        header.display()
    );
    let mut p = |expr: &str| {
        c.push_str(&format!(
            "printf(\"%s %llu\\n\", \"{expr}\", (unsigned long long)({expr}));\n"
        ))
    };
    for s in [
        "pcifab_version",
        "pcifab_identity",
        "pcifab_mrpc",
        "pcifab_stats",
        "pcifab_events",
        "pcifab_port",
        "pcifab_function",
        "pcifab_inventory",
        "pcifab_bind",
        "pcifab_unbind",
        "pcifab_move",
        "pcifab_route",
        "pcifab_p2p_route",
        "pcifab_p2p_routes",
        "pcifab_p2p_end",
        "pcifab_p2p_copy",
        "pcifab_p2p_distance",
        "pcifab_p2p_grant",
        "pcifab_grant",
        "pcifab_p2p_grants",
        "pcifab_p2p_buffer",
    ] {
        p(&format!("sizeof(struct {s})"));
    }
    for f in ["size", "flags", "major", "minor"] {
        p(&format!("offsetof(struct pcifab_version, {f})"));
    }
    for f in [
        "size",
        "flags",
        "pci_vendor",
        "pci_device",
        "device_id",
        "device_version",
        "fw_version",
        "partition",
        "partition_count",
        "vendor_id",
        "product_id",
        "product_revision",
        "__reserved0",
        "features",
        "pax_id",
    ] {
        p(&format!("offsetof(struct pcifab_identity, {f})"));
    }
    for f in [
        "size",
        "flags",
        "cmd",
        "in_len",
        "out_len",
        "timeout_ms",
        "in_ptr",
        "out_ptr",
        "status",
        "ret_value",
    ] {
        p(&format!("offsetof(struct pcifab_mrpc, {f})"));
    }
    for f in [
        "size",
        "flags",
        "mrpc_commands",
        "mrpc_completions",
        "mrpc_timeouts",
        "mrpc_firmware_dead",
        "event_irqs",
    ] {
        p(&format!("offsetof(struct pcifab_stats, {f})"));
    }
    for (s, fields) in EXTRA_FIELDS {
        for f in *fields {
            p(&format!("offsetof(struct {s}, {f})"));
        }
    }
    for n in [
        "PCIFAB_IOCTL_P2P_ROUTE_ADD",
        "PCIFAB_IOCTL_P2P_ROUTE_DEL",
        "PCIFAB_IOCTL_P2P_ROUTES",
        "PCIFAB_IOCTL_P2P_COPY",
        "PCIFAB_IOCTL_P2P_DISTANCE",
        "PCIFAB_IOCTL_P2P_GRANT",
        "PCIFAB_IOCTL_P2P_REVOKE",
        "PCIFAB_IOCTL_P2P_GRANTS",
        "PCIFAB_IOCTL_P2P_REGISTER",
        "PCIFAB_IOCTL_P2P_UNREGISTER",
        "PCIFAB_P2P_PEER",
        "PCIFAB_P2P_PEER_SLOTS",
        "PCIFAB_ROUTE_ANY_WINDOW",
        "PCIFAB_P2P_FUNCTION",
        "PCIFAB_P2P_USER",
        "PCIFAB_P2P_IOVA",
        "PCIFAB_P2P_MAX_LEN",
        "PCIFAB_P2P_MAX_TIMEOUT_MS",
        "PCIFAB_P2P_MAX_ROUTES",
        "PCIFAB_P2P_ROUTE_ALIGN",
        "PCIFAB_P2P_DMA_NONE",
        "PCIFAB_P2P_DMA_OK",
        "PCIFAB_P2P_DMA_HOST_FAULT",
        "PCIFAB_P2P_DMA_ROUTE_FAULT",
        "PCIFAB_P2P_DMA_BAD",
        "PCIFAB_P2P_PATH_SAME",
        "PCIFAB_P2P_PATH_SWITCH",
        "PCIFAB_P2P_PATH_FABRIC",
        "PCIFAB_P2P_A_LOCAL",
        "PCIFAB_P2P_B_LOCAL",
        "PCIFAB_P2P_A_ROUTED",
        "PCIFAB_P2P_B_ROUTED",
        "PCIFAB_P2P_ACS_REDIRECT",
        "PCIFAB_IOCTL_BIND",
        "PCIFAB_IOCTL_UNBIND",
        "PCIFAB_IOCTL_MOVE",
        "PCIFAB_ANY_PORT",
        "PCIFAB_BIND_NO_WAIT",
        "PCIFAB_BIND_MAX_TIMEOUT_MS",
        "PCIFAB_IOCTL_EVENTS",
        "PCIFAB_IOCTL_INVENTORY",
        "PCIFAB_EVENTS_WAIT",
        "PCIFAB_PORT_UNUSED",
        "PCIFAB_PORT_FABRIC",
        "PCIFAB_PORT_ENDPOINT",
        "PCIFAB_PORT_HOST",
        "PCIFAB_FN_VF",
        "PCIFAB_FN_BOUND",
        "PCIFAB_FN_LINK_UP",
        "PCIFAB_UNBOUND",
        "PCIFAB_FEATURE_TELEMETRY",
        "PCIFAB_FEATURE_P2P_ROUTES",
        "PCIFAB_FEATURE_DMA_ENGINE",
        "PCIFAB_FEATURE_UNBIND_REQUEST",
        "PCIFAB_BIND_MAX_PDFIDS",
        "PCIFAB_IOCTL_MRPC",
        "PCIFAB_IOCTL_STATS",
        "PCIFAB_MRPC_MAX_DATA",
        "PCIFAB_MRPC_MAX_TIMEOUT_MS",
        "PCIFAB_MRPC_USER_MIN_TIMEOUT_MS",
        "PCIFAB_MRPC_USER_MAX_TIMEOUT_MS",
        "PCIFAB_IOCTL_VERSION",
        "PCIFAB_IOCTL_IDENTITY",
        "PCIFAB_UAPI_VERSION_MAJOR",
        "PCIFAB_UAPI_VERSION_MINOR",
    ] {
        p(n);
    }
    for (n, _, _) in ioctls() {
        for part in ["_IOC_DIR", "_IOC_TYPE", "_IOC_NR", "_IOC_SIZE"] {
            p(&format!("{part}({n})"));
        }
    }
    c.push_str("return 0;\n}\n");
    std::fs::write(&src, c).expect("write probe.c");
    let exe = dir.join("probe");
    let cc = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("run cc (install gcc and linux-libc-dev)");
    assert!(cc.success(), "the uAPI header does not compile");
    let out = Command::new(&exe).output().expect("run probe");
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("name value");
            (k.to_string(), v.parse().expect("number"))
        })
        .collect()
}

/// Every ioctl: its name, this crate's number and the size of its argument struct.
fn ioctls() -> Vec<(&'static str, u32, usize)> {
    use std::mem::size_of;
    vec![
        (
            "PCIFAB_IOCTL_VERSION",
            PCIFAB_IOCTL_VERSION,
            size_of::<Version>(),
        ),
        (
            "PCIFAB_IOCTL_IDENTITY",
            PCIFAB_IOCTL_IDENTITY,
            size_of::<Identity>(),
        ),
        ("PCIFAB_IOCTL_MRPC", PCIFAB_IOCTL_MRPC, size_of::<Mrpc>()),
        ("PCIFAB_IOCTL_STATS", PCIFAB_IOCTL_STATS, size_of::<Stats>()),
        (
            "PCIFAB_IOCTL_EVENTS",
            PCIFAB_IOCTL_EVENTS,
            size_of::<Events>(),
        ),
        (
            "PCIFAB_IOCTL_INVENTORY",
            PCIFAB_IOCTL_INVENTORY,
            size_of::<Inventory>(),
        ),
        ("PCIFAB_IOCTL_BIND", PCIFAB_IOCTL_BIND, size_of::<Bind>()),
        (
            "PCIFAB_IOCTL_UNBIND",
            PCIFAB_IOCTL_UNBIND,
            size_of::<Unbind>(),
        ),
        ("PCIFAB_IOCTL_MOVE", PCIFAB_IOCTL_MOVE, size_of::<Move>()),
        (
            "PCIFAB_IOCTL_P2P_ROUTE_ADD",
            PCIFAB_IOCTL_P2P_ROUTE_ADD,
            size_of::<P2pRoute>(),
        ),
        (
            "PCIFAB_IOCTL_P2P_ROUTE_DEL",
            PCIFAB_IOCTL_P2P_ROUTE_DEL,
            size_of::<P2pRoute>(),
        ),
        (
            "PCIFAB_IOCTL_P2P_ROUTES",
            PCIFAB_IOCTL_P2P_ROUTES,
            size_of::<P2pRoutes>(),
        ),
        (
            "PCIFAB_IOCTL_P2P_COPY",
            PCIFAB_IOCTL_P2P_COPY,
            size_of::<P2pCopy>(),
        ),
        (
            "PCIFAB_IOCTL_P2P_DISTANCE",
            PCIFAB_IOCTL_P2P_DISTANCE,
            size_of::<P2pDistance>(),
        ),
        (
            "PCIFAB_IOCTL_P2P_GRANT",
            PCIFAB_IOCTL_P2P_GRANT,
            size_of::<P2pGrant>(),
        ),
        (
            "PCIFAB_IOCTL_P2P_REVOKE",
            PCIFAB_IOCTL_P2P_REVOKE,
            size_of::<P2pGrant>(),
        ),
        (
            "PCIFAB_IOCTL_P2P_GRANTS",
            PCIFAB_IOCTL_P2P_GRANTS,
            size_of::<P2pGrants>(),
        ),
    ]
}

/// What the C macros decode from each number, as the header's `_IOWR(0xFA, nr, struct)`
/// must encode it: read and write (3), type 0xFA, the number in the header's order, and the
/// size of the argument struct.
fn ioctl_parts() -> Vec<(String, u64)> {
    let mut v = Vec::new();
    for (nr, (n, _, size)) in ioctls().into_iter().enumerate() {
        v.push((format!("_IOC_DIR({n})"), 3));
        v.push((format!("_IOC_TYPE({n})"), u64::from(IOCTL_TYPE)));
        v.push((format!("_IOC_NR({n})"), nr as u64));
        v.push((format!("_IOC_SIZE({n})"), size as u64));
    }
    v
}

/// The numbers of uAPI 1.0-1.6, which the kernel still accepts, are `_IO(0xFA, nr)`.
#[test]
fn legacy_numbers_are_the_old_io_numbers() {
    for (nr, (n, cmd, _)) in ioctls().into_iter().enumerate() {
        assert_eq!(legacy(cmd), 0xfa00 | nr as u32, "{n}");
        assert_ne!(legacy(cmd), cmd, "{n}");
    }
}

/// Fields of the structs added after the first version, probed in C (C names).
const EXTRA_FIELDS: &[(&str, &[&str])] = &[
    (
        "pcifab_events",
        &[
            "size",
            "flags",
            "timeout_ms",
            "__reserved0",
            "seen",
            "total",
            "link",
            "gfms",
            "irqs",
        ],
    ),
    (
        "pcifab_port",
        &[
            "phys_port",
            "type",
            "link_up",
            "width",
            "rate",
            "__reserved",
        ],
    ),
    (
        "pcifab_function",
        &[
            "pdfid",
            "pf_pdfid",
            "vendor",
            "device",
            "class_code",
            "phys_port",
            "vf_index",
            "total_vfs",
            "flags",
            "bound_host",
            "bound_port",
            "__reserved0",
            "__reserved1",
        ],
    ),
    (
        "pcifab_bind",
        &[
            "size",
            "flags",
            "pdfid",
            "host",
            "port",
            "timeout_ms",
            "fw_ret",
            "vendor",
            "device",
            "name",
            "nr_pdfids",
            "pdfids",
        ],
    ),
    (
        "pcifab_unbind",
        &[
            "size",
            "flags",
            "pdfid",
            "host",
            "port",
            "timeout_ms",
            "fw_ret",
            "__reserved0",
        ],
    ),
    (
        "pcifab_move",
        &[
            "size",
            "flags",
            "pdfid",
            "host",
            "port",
            "timeout_ms",
            "fw_ret",
            "vendor",
            "device",
            "name",
            "from_host",
            "from_port",
            "__reserved0",
        ],
    ),
    (
        "pcifab_inventory",
        &[
            "size",
            "flags",
            "generation",
            "partition",
            "host_count",
            "nr_ports",
            "nr_functions",
            "port_size",
            "function_size",
            "ports_ptr",
            "functions_ptr",
        ],
    ),
    (
        "pcifab_route",
        &[
            "window_off",
            "size",
            "target_off",
            "pdfid",
            "target_host",
            "__reserved0",
            "__reserved1",
        ],
    ),
    (
        "pcifab_p2p_route",
        &[
            "size",
            "flags",
            "route",
            "route.window_off",
            "route.size",
            "route.target_off",
            "route.pdfid",
            "route.target_host",
            "fw_ret",
            "nr_routes",
        ],
    ),
    (
        "pcifab_p2p_routes",
        &[
            "size",
            "flags",
            "nr_routes",
            "route_size",
            "routes_ptr",
            "window_size",
        ],
    ),
    ("pcifab_p2p_end", &["kind", "pdfid", "__reserved0", "addr"]),
    (
        "pcifab_p2p_copy",
        &[
            "size",
            "flags",
            "src",
            "src.kind",
            "src.pdfid",
            "src.addr",
            "dst",
            "dst.kind",
            "dst.pdfid",
            "dst.addr",
            "len",
            "done",
            "dma_status",
            "timeout_ms",
        ],
    ),
    (
        "pcifab_p2p_distance",
        &[
            "size",
            "flags",
            "a",
            "b",
            "path",
            "hops",
            "pci_distance",
            "info",
            "__reserved0",
        ],
    ),
    (
        "pcifab_p2p_grant",
        &[
            "size",
            "flags",
            "pdfid",
            "grantee",
            "__reserved0",
            "fw_ret",
            "nr_grants",
            "__reserved1",
        ],
    ),
    (
        "pcifab_grant",
        &["pdfid", "holder", "grantee", "__reserved"],
    ),
    (
        "pcifab_p2p_grants",
        &["size", "flags", "nr_grants", "grant_size", "grants_ptr"],
    ),
    (
        "pcifab_p2p_buffer",
        &[
            "size",
            "flags",
            "peer",
            "slot",
            "__reserved0",
            "hfid",
            "__reserved1",
            "fw_ret",
            "__reserved2",
            "addr",
            "len",
        ],
    ),
    ("pcifab_p2p_end", &["slot"]),
];

/// The same fields' offsets in Rust, in the same order.
fn extra_rust() -> Vec<(String, u64)> {
    let e = [
        offset_of!(Events, size),
        offset_of!(Events, flags),
        offset_of!(Events, timeout_ms),
        offset_of!(Events, reserved0),
        offset_of!(Events, seen),
        offset_of!(Events, total),
        offset_of!(Events, link),
        offset_of!(Events, gfms),
        offset_of!(Events, irqs),
    ];
    let p = [
        offset_of!(Port, phys_port),
        offset_of!(Port, kind),
        offset_of!(Port, link_up),
        offset_of!(Port, width),
        offset_of!(Port, rate),
        offset_of!(Port, reserved),
    ];
    let f = [
        offset_of!(Function, pdfid),
        offset_of!(Function, pf_pdfid),
        offset_of!(Function, vendor),
        offset_of!(Function, device),
        offset_of!(Function, class_code),
        offset_of!(Function, phys_port),
        offset_of!(Function, vf_index),
        offset_of!(Function, total_vfs),
        offset_of!(Function, flags),
        offset_of!(Function, bound_host),
        offset_of!(Function, bound_port),
        offset_of!(Function, reserved0),
        offset_of!(Function, reserved1),
    ];
    let i = [
        offset_of!(Inventory, size),
        offset_of!(Inventory, flags),
        offset_of!(Inventory, generation),
        offset_of!(Inventory, partition),
        offset_of!(Inventory, host_count),
        offset_of!(Inventory, nr_ports),
        offset_of!(Inventory, nr_functions),
        offset_of!(Inventory, port_size),
        offset_of!(Inventory, function_size),
        offset_of!(Inventory, ports_ptr),
        offset_of!(Inventory, functions_ptr),
    ];
    let b = [
        offset_of!(Bind, size),
        offset_of!(Bind, flags),
        offset_of!(Bind, pdfid),
        offset_of!(Bind, host),
        offset_of!(Bind, port),
        offset_of!(Bind, timeout_ms),
        offset_of!(Bind, fw_ret),
        offset_of!(Bind, vendor),
        offset_of!(Bind, device),
        offset_of!(Bind, name),
        offset_of!(Bind, nr_pdfids),
        offset_of!(Bind, pdfids),
    ];
    let u = [
        offset_of!(Unbind, size),
        offset_of!(Unbind, flags),
        offset_of!(Unbind, pdfid),
        offset_of!(Unbind, host),
        offset_of!(Unbind, port),
        offset_of!(Unbind, timeout_ms),
        offset_of!(Unbind, fw_ret),
        offset_of!(Unbind, reserved0),
    ];
    let m = [
        offset_of!(Move, size),
        offset_of!(Move, flags),
        offset_of!(Move, pdfid),
        offset_of!(Move, host),
        offset_of!(Move, port),
        offset_of!(Move, timeout_ms),
        offset_of!(Move, fw_ret),
        offset_of!(Move, vendor),
        offset_of!(Move, device),
        offset_of!(Move, name),
        offset_of!(Move, from_host),
        offset_of!(Move, from_port),
        offset_of!(Move, reserved0),
    ];
    let r = [
        offset_of!(Route, window_off),
        offset_of!(Route, size),
        offset_of!(Route, target_off),
        offset_of!(Route, pdfid),
        offset_of!(Route, target_host),
        offset_of!(Route, reserved0),
        offset_of!(Route, reserved1),
    ];
    let pr = [
        offset_of!(P2pRoute, size),
        offset_of!(P2pRoute, flags),
        offset_of!(P2pRoute, route),
        offset_of!(P2pRoute, route.window_off),
        offset_of!(P2pRoute, route.size),
        offset_of!(P2pRoute, route.target_off),
        offset_of!(P2pRoute, route.pdfid),
        offset_of!(P2pRoute, route.target_host),
        offset_of!(P2pRoute, fw_ret),
        offset_of!(P2pRoute, nr_routes),
    ];
    let prs = [
        offset_of!(P2pRoutes, size),
        offset_of!(P2pRoutes, flags),
        offset_of!(P2pRoutes, nr_routes),
        offset_of!(P2pRoutes, route_size),
        offset_of!(P2pRoutes, routes_ptr),
        offset_of!(P2pRoutes, window_size),
    ];
    let pe = [
        offset_of!(P2pEnd, kind),
        offset_of!(P2pEnd, pdfid),
        offset_of!(P2pEnd, reserved0),
        offset_of!(P2pEnd, addr),
    ];
    let pc = [
        offset_of!(P2pCopy, size),
        offset_of!(P2pCopy, flags),
        offset_of!(P2pCopy, src),
        offset_of!(P2pCopy, src.kind),
        offset_of!(P2pCopy, src.pdfid),
        offset_of!(P2pCopy, src.addr),
        offset_of!(P2pCopy, dst),
        offset_of!(P2pCopy, dst.kind),
        offset_of!(P2pCopy, dst.pdfid),
        offset_of!(P2pCopy, dst.addr),
        offset_of!(P2pCopy, len),
        offset_of!(P2pCopy, done),
        offset_of!(P2pCopy, dma_status),
        offset_of!(P2pCopy, timeout_ms),
    ];
    let pd = [
        offset_of!(P2pDistance, size),
        offset_of!(P2pDistance, flags),
        offset_of!(P2pDistance, a),
        offset_of!(P2pDistance, b),
        offset_of!(P2pDistance, path),
        offset_of!(P2pDistance, hops),
        offset_of!(P2pDistance, pci_distance),
        offset_of!(P2pDistance, info),
        offset_of!(P2pDistance, reserved0),
    ];
    let pg = [
        offset_of!(P2pGrant, size),
        offset_of!(P2pGrant, flags),
        offset_of!(P2pGrant, pdfid),
        offset_of!(P2pGrant, grantee),
        offset_of!(P2pGrant, reserved0),
        offset_of!(P2pGrant, fw_ret),
        offset_of!(P2pGrant, nr_grants),
        offset_of!(P2pGrant, reserved1),
    ];
    let g = [
        offset_of!(Grant, pdfid),
        offset_of!(Grant, holder),
        offset_of!(Grant, grantee),
        offset_of!(Grant, reserved),
    ];
    let pgs = [
        offset_of!(P2pGrants, size),
        offset_of!(P2pGrants, flags),
        offset_of!(P2pGrants, nr_grants),
        offset_of!(P2pGrants, grant_size),
        offset_of!(P2pGrants, grants_ptr),
    ];
    let pb = [
        offset_of!(P2pBuffer, size),
        offset_of!(P2pBuffer, flags),
        offset_of!(P2pBuffer, peer),
        offset_of!(P2pBuffer, slot),
        offset_of!(P2pBuffer, reserved0),
        offset_of!(P2pBuffer, hfid),
        offset_of!(P2pBuffer, reserved1),
        offset_of!(P2pBuffer, fw_ret),
        offset_of!(P2pBuffer, reserved2),
        offset_of!(P2pBuffer, addr),
        offset_of!(P2pBuffer, len),
    ];
    // The header's `slot` shares the place of `__reserved0`.
    let pes = [offset_of!(P2pEnd, reserved0)];
    let offsets: [&[usize]; 18] = [
        &e, &p, &f, &b, &u, &m, &i, &r, &pr, &prs, &pe, &pc, &pd, &pg, &g, &pgs, &pb, &pes,
    ];
    assert_eq!(
        offsets.len(),
        EXTRA_FIELDS.len(),
        "one offset list per struct"
    );
    let mut out = Vec::new();
    for ((s, fields), offs) in EXTRA_FIELDS.iter().zip(offsets) {
        assert_eq!(fields.len(), offs.len(), "{s}: field lists differ");
        for (f, o) in fields.iter().zip(offs) {
            out.push((format!("offsetof(struct {s}, {f})"), *o as u64));
        }
    }
    out.extend([
        (
            "sizeof(struct pcifab_events)".into(),
            size_of::<Events>() as u64,
        ),
        (
            "sizeof(struct pcifab_port)".into(),
            size_of::<Port>() as u64,
        ),
        (
            "sizeof(struct pcifab_function)".into(),
            size_of::<Function>() as u64,
        ),
        (
            "sizeof(struct pcifab_inventory)".into(),
            size_of::<Inventory>() as u64,
        ),
        ("PCIFAB_IOCTL_EVENTS".into(), PCIFAB_IOCTL_EVENTS as u64),
        (
            "PCIFAB_IOCTL_INVENTORY".into(),
            PCIFAB_IOCTL_INVENTORY as u64,
        ),
        ("PCIFAB_EVENTS_WAIT".into(), EVENTS_WAIT as u64),
        ("PCIFAB_PORT_UNUSED".into(), PORT_UNUSED as u64),
        ("PCIFAB_PORT_FABRIC".into(), PORT_FABRIC as u64),
        ("PCIFAB_PORT_ENDPOINT".into(), PORT_ENDPOINT as u64),
        ("PCIFAB_PORT_HOST".into(), PORT_HOST as u64),
        ("PCIFAB_FN_VF".into(), FN_VF as u64),
        ("PCIFAB_FN_BOUND".into(), FN_BOUND as u64),
        ("PCIFAB_FN_LINK_UP".into(), FN_LINK_UP as u64),
        ("PCIFAB_UNBOUND".into(), UNBOUND as u64),
        ("PCIFAB_FEATURE_TELEMETRY".into(), FEATURE_TELEMETRY as u64),
        (
            "PCIFAB_FEATURE_P2P_ROUTES".into(),
            FEATURE_P2P_ROUTES as u64,
        ),
        (
            "PCIFAB_FEATURE_DMA_ENGINE".into(),
            FEATURE_DMA_ENGINE as u64,
        ),
        (
            "PCIFAB_FEATURE_UNBIND_REQUEST".into(),
            FEATURE_UNBIND_REQUEST as u64,
        ),
        ("PCIFAB_BIND_MAX_PDFIDS".into(), BIND_MAX_PDFIDS as u64),
        (
            "sizeof(struct pcifab_bind)".into(),
            size_of::<Bind>() as u64,
        ),
        (
            "sizeof(struct pcifab_unbind)".into(),
            size_of::<Unbind>() as u64,
        ),
        (
            "sizeof(struct pcifab_move)".into(),
            size_of::<Move>() as u64,
        ),
        (
            "sizeof(struct pcifab_route)".into(),
            size_of::<Route>() as u64,
        ),
        (
            "sizeof(struct pcifab_p2p_route)".into(),
            size_of::<P2pRoute>() as u64,
        ),
        (
            "sizeof(struct pcifab_p2p_routes)".into(),
            size_of::<P2pRoutes>() as u64,
        ),
        (
            "sizeof(struct pcifab_p2p_end)".into(),
            size_of::<P2pEnd>() as u64,
        ),
        (
            "sizeof(struct pcifab_p2p_copy)".into(),
            size_of::<P2pCopy>() as u64,
        ),
        (
            "sizeof(struct pcifab_p2p_distance)".into(),
            size_of::<P2pDistance>() as u64,
        ),
        (
            "PCIFAB_IOCTL_P2P_ROUTE_ADD".into(),
            PCIFAB_IOCTL_P2P_ROUTE_ADD as u64,
        ),
        (
            "PCIFAB_IOCTL_P2P_ROUTE_DEL".into(),
            PCIFAB_IOCTL_P2P_ROUTE_DEL as u64,
        ),
        (
            "PCIFAB_IOCTL_P2P_ROUTES".into(),
            PCIFAB_IOCTL_P2P_ROUTES as u64,
        ),
        ("PCIFAB_IOCTL_P2P_COPY".into(), PCIFAB_IOCTL_P2P_COPY as u64),
        (
            "PCIFAB_IOCTL_P2P_DISTANCE".into(),
            PCIFAB_IOCTL_P2P_DISTANCE as u64,
        ),
        (
            "PCIFAB_IOCTL_P2P_GRANT".into(),
            PCIFAB_IOCTL_P2P_GRANT as u64,
        ),
        (
            "PCIFAB_IOCTL_P2P_REVOKE".into(),
            PCIFAB_IOCTL_P2P_REVOKE as u64,
        ),
        (
            "PCIFAB_IOCTL_P2P_GRANTS".into(),
            PCIFAB_IOCTL_P2P_GRANTS as u64,
        ),
        (
            "sizeof(struct pcifab_p2p_grant)".into(),
            size_of::<P2pGrant>() as u64,
        ),
        (
            "sizeof(struct pcifab_grant)".into(),
            size_of::<Grant>() as u64,
        ),
        (
            "sizeof(struct pcifab_p2p_grants)".into(),
            size_of::<P2pGrants>() as u64,
        ),
        (
            "sizeof(struct pcifab_p2p_buffer)".into(),
            size_of::<P2pBuffer>() as u64,
        ),
        (
            "PCIFAB_IOCTL_P2P_REGISTER".into(),
            PCIFAB_IOCTL_P2P_REGISTER as u64,
        ),
        (
            "PCIFAB_IOCTL_P2P_UNREGISTER".into(),
            PCIFAB_IOCTL_P2P_UNREGISTER as u64,
        ),
        ("PCIFAB_P2P_PEER".into(), P2P_PEER as u64),
        ("PCIFAB_P2P_PEER_SLOTS".into(), P2P_PEER_SLOTS as u64),
        ("PCIFAB_ROUTE_ANY_WINDOW".into(), ROUTE_ANY_WINDOW),
        ("PCIFAB_P2P_FUNCTION".into(), P2P_FUNCTION as u64),
        ("PCIFAB_P2P_USER".into(), P2P_USER as u64),
        ("PCIFAB_P2P_IOVA".into(), P2P_IOVA as u64),
        ("PCIFAB_P2P_MAX_LEN".into(), P2P_MAX_LEN),
        (
            "PCIFAB_P2P_MAX_TIMEOUT_MS".into(),
            u64::from(P2P_MAX_TIMEOUT_MS),
        ),
        ("PCIFAB_P2P_MAX_ROUTES".into(), MAX_ROUTES as u64),
        ("PCIFAB_P2P_ROUTE_ALIGN".into(), ROUTE_ALIGN),
        ("PCIFAB_P2P_DMA_NONE".into(), u64::from(DMA_STATUS_NONE)),
        ("PCIFAB_P2P_DMA_OK".into(), u64::from(DMA_STATUS_OK)),
        (
            "PCIFAB_P2P_DMA_HOST_FAULT".into(),
            u64::from(DMA_STATUS_HOST_FAULT),
        ),
        (
            "PCIFAB_P2P_DMA_ROUTE_FAULT".into(),
            u64::from(DMA_STATUS_ROUTE_FAULT),
        ),
        ("PCIFAB_P2P_DMA_BAD".into(), u64::from(DMA_STATUS_BAD)),
        ("PCIFAB_P2P_PATH_SAME".into(), P2P_PATH_SAME as u64),
        ("PCIFAB_P2P_PATH_SWITCH".into(), P2P_PATH_SWITCH as u64),
        ("PCIFAB_P2P_PATH_FABRIC".into(), P2P_PATH_FABRIC as u64),
        ("PCIFAB_P2P_A_LOCAL".into(), P2P_A_LOCAL as u64),
        ("PCIFAB_P2P_B_LOCAL".into(), P2P_B_LOCAL as u64),
        ("PCIFAB_P2P_A_ROUTED".into(), P2P_A_ROUTED as u64),
        ("PCIFAB_P2P_B_ROUTED".into(), P2P_B_ROUTED as u64),
        ("PCIFAB_P2P_ACS_REDIRECT".into(), P2P_ACS_REDIRECT as u64),
        ("PCIFAB_IOCTL_BIND".into(), PCIFAB_IOCTL_BIND as u64),
        ("PCIFAB_IOCTL_UNBIND".into(), PCIFAB_IOCTL_UNBIND as u64),
        ("PCIFAB_IOCTL_MOVE".into(), PCIFAB_IOCTL_MOVE as u64),
        ("PCIFAB_ANY_PORT".into(), ANY_PORT as u64),
        ("PCIFAB_BIND_NO_WAIT".into(), BIND_NO_WAIT as u64),
        (
            "PCIFAB_BIND_MAX_TIMEOUT_MS".into(),
            BIND_MAX_TIMEOUT_MS as u64,
        ),
    ]);
    out
}

#[test]
fn rust_mirror_matches_c_header() {
    let rust: Vec<(&str, u64)> = vec![
        ("sizeof(struct pcifab_version)", size_of::<Version>() as u64),
        ("sizeof(struct pcifab_mrpc)", size_of::<Mrpc>() as u64),
        ("sizeof(struct pcifab_stats)", size_of::<Stats>() as u64),
        (
            "sizeof(struct pcifab_identity)",
            size_of::<Identity>() as u64,
        ),
        (
            "offsetof(struct pcifab_version, size)",
            offset_of!(Version, size) as u64,
        ),
        (
            "offsetof(struct pcifab_version, flags)",
            offset_of!(Version, flags) as u64,
        ),
        (
            "offsetof(struct pcifab_version, major)",
            offset_of!(Version, major) as u64,
        ),
        (
            "offsetof(struct pcifab_version, minor)",
            offset_of!(Version, minor) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, size)",
            offset_of!(Identity, size) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, flags)",
            offset_of!(Identity, flags) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, pci_vendor)",
            offset_of!(Identity, pci_vendor) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, pci_device)",
            offset_of!(Identity, pci_device) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, device_id)",
            offset_of!(Identity, device_id) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, device_version)",
            offset_of!(Identity, device_version) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, fw_version)",
            offset_of!(Identity, fw_version) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, partition)",
            offset_of!(Identity, partition) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, partition_count)",
            offset_of!(Identity, partition_count) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, vendor_id)",
            offset_of!(Identity, vendor_id) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, product_id)",
            offset_of!(Identity, product_id) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, product_revision)",
            offset_of!(Identity, product_revision) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, __reserved0)",
            offset_of!(Identity, reserved0) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, features)",
            offset_of!(Identity, features) as u64,
        ),
        (
            "offsetof(struct pcifab_identity, pax_id)",
            offset_of!(Identity, pax_id) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, size)",
            offset_of!(Mrpc, size) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, flags)",
            offset_of!(Mrpc, flags) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, cmd)",
            offset_of!(Mrpc, cmd) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, in_len)",
            offset_of!(Mrpc, in_len) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, out_len)",
            offset_of!(Mrpc, out_len) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, timeout_ms)",
            offset_of!(Mrpc, timeout_ms) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, in_ptr)",
            offset_of!(Mrpc, in_ptr) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, out_ptr)",
            offset_of!(Mrpc, out_ptr) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, status)",
            offset_of!(Mrpc, status) as u64,
        ),
        (
            "offsetof(struct pcifab_mrpc, ret_value)",
            offset_of!(Mrpc, ret_value) as u64,
        ),
        (
            "offsetof(struct pcifab_stats, size)",
            offset_of!(Stats, size) as u64,
        ),
        (
            "offsetof(struct pcifab_stats, flags)",
            offset_of!(Stats, flags) as u64,
        ),
        (
            "offsetof(struct pcifab_stats, mrpc_commands)",
            offset_of!(Stats, mrpc_commands) as u64,
        ),
        (
            "offsetof(struct pcifab_stats, mrpc_completions)",
            offset_of!(Stats, mrpc_completions) as u64,
        ),
        (
            "offsetof(struct pcifab_stats, mrpc_timeouts)",
            offset_of!(Stats, mrpc_timeouts) as u64,
        ),
        (
            "offsetof(struct pcifab_stats, mrpc_firmware_dead)",
            offset_of!(Stats, mrpc_firmware_dead) as u64,
        ),
        (
            "offsetof(struct pcifab_stats, event_irqs)",
            offset_of!(Stats, event_irqs) as u64,
        ),
        ("PCIFAB_IOCTL_MRPC", PCIFAB_IOCTL_MRPC as u64),
        ("PCIFAB_IOCTL_STATS", PCIFAB_IOCTL_STATS as u64),
        ("PCIFAB_MRPC_MAX_DATA", MRPC_MAX_DATA as u64),
        ("PCIFAB_MRPC_MAX_TIMEOUT_MS", MRPC_MAX_TIMEOUT_MS as u64),
        (
            "PCIFAB_MRPC_USER_MIN_TIMEOUT_MS",
            MRPC_USER_MIN_TIMEOUT_MS as u64,
        ),
        (
            "PCIFAB_MRPC_USER_MAX_TIMEOUT_MS",
            MRPC_USER_MAX_TIMEOUT_MS as u64,
        ),
        ("PCIFAB_IOCTL_VERSION", PCIFAB_IOCTL_VERSION as u64),
        ("PCIFAB_IOCTL_IDENTITY", PCIFAB_IOCTL_IDENTITY as u64),
        ("PCIFAB_UAPI_VERSION_MAJOR", VERSION_MAJOR as u64),
        ("PCIFAB_UAPI_VERSION_MINOR", VERSION_MINOR as u64),
    ];
    let c: std::collections::BTreeMap<String, u64> = c_layout().into_iter().collect();
    let rust: std::collections::BTreeMap<String, u64> = rust
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(extra_rust())
        .chain(ioctl_parts())
        .collect();
    for (name, value) in &c {
        assert_eq!(
            rust.get(name),
            Some(value),
            "{name}: C says {value}, Rust disagrees"
        );
    }
    for name in rust.keys() {
        assert!(
            c.contains_key(name),
            "{name} is checked in Rust but not probed in C"
        );
    }
}
