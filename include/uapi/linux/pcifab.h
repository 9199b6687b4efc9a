/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * pcifab: host side of a multi-host PCIe switch fabric (Switchtec PAX class).
 *
 * The ioctl ABI of /dev/pcifabN. Every argument struct starts with its own
 * size, so it can grow: user space sets @size to sizeof() of the struct it
 * was built with; the kernel reads and writes at most that many bytes, and
 * rejects (E2BIG) a larger struct whose bytes beyond the kernel's own struct
 * are not zero. Unknown @flags bits get EINVAL. Structs only ever grow at the
 * end; fields are never moved or reused. PCIFAB_UAPI_VERSION_MINOR grows with
 * every addition, PCIFAB_UAPI_VERSION_MAJOR only on an incompatible change.
 */
#ifndef _UAPI_LINUX_PCIFAB_H
#define _UAPI_LINUX_PCIFAB_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define PCIFAB_UAPI_VERSION_MAJOR 1
#define PCIFAB_UAPI_VERSION_MINOR 8

#define PCIFAB_IOCTL_TYPE 0xFA

/**
 * struct pcifab_version - PCIFAB_IOCTL_VERSION argument
 * @size: in: sizeof(struct pcifab_version)
 * @flags: in: must be 0
 * @major: out: PCIFAB_UAPI_VERSION_MAJOR of the running module
 * @minor: out: PCIFAB_UAPI_VERSION_MINOR of the running module
 */
struct pcifab_version {
	__u32 size;
	__u32 flags;
	__u32 major;
	__u32 minor;
};

/**
 * struct pcifab_identity - PCIFAB_IOCTL_IDENTITY argument
 * @size: in: sizeof(struct pcifab_identity)
 * @flags: in: must be 0
 * @pci_vendor: out: PCI vendor id of the management endpoint
 * @pci_device: out: PCI device id of the management endpoint
 * @device_id: out: switch device id from the system-info block
 * @device_version: out: switch device version
 * @fw_version: out: running firmware version
 * @partition: out: partition (host virtual switch) this host is in
 * @partition_count: out: number of partitions of the switch
 * @vendor_id: out: vendor id string, not NUL-terminated
 * @product_id: out: product id string, not NUL-terminated
 * @product_revision: out: product revision string, not NUL-terminated
 * @__reserved0: zero
 * @features: out: the firmware's extensions, PCIFAB_FEATURE_* (since 1.6); 0 on PAX firmware
 * @pax_id: out: the switch's index in the fabric, GET_PAX_ID (since 1.6)
 */
struct pcifab_identity {
	__u32 size;
	__u32 flags;
	__u16 pci_vendor;
	__u16 pci_device;
	__u32 device_id;
	__u32 device_version;
	__u32 fw_version;
	__u32 partition;
	__u32 partition_count;
	__u8 vendor_id[8];
	__u8 product_id[24];
	__u8 product_revision[2];
	__u16 __reserved0;
	__u32 features;
	__u32 pax_id;
};

/* struct pcifab_identity.features: pcifab's firmware extensions (Documentation/mrpc.rst). */
#define PCIFAB_FEATURE_TELEMETRY	(1U << 0)	/* per-function telemetry */
#define PCIFAB_FEATURE_P2P_ROUTES	(1U << 1)	/* P2P window routes and grants */
#define PCIFAB_FEATURE_DMA_ENGINE	(1U << 2)	/* the P2P DMA engine (copies) */
#define PCIFAB_FEATURE_UNBIND_REQUEST	(1U << 3)	/* unbind handshake event */

/* Largest MRPC input or output. */
#define PCIFAB_MRPC_MAX_DATA	1024
/* Longest timeout an MRPC caller may ask for, in milliseconds; 0 means 5000. */
#define PCIFAB_MRPC_MAX_TIMEOUT_MS 60000
/*
 * Without CAP_SYS_ADMIN, @timeout_ms is 0 or within these bounds (else EINVAL): a caller
 * holds the switch's one mailbox while it waits, and a command given up on keeps it until
 * the firmware finished it.
 */
#define PCIFAB_MRPC_USER_MIN_TIMEOUT_MS 1000
#define PCIFAB_MRPC_USER_MAX_TIMEOUT_MS 10000

/**
 * struct pcifab_mrpc - PCIFAB_IOCTL_MRPC argument: run one firmware (MRPC) command
 * @size: in: sizeof(struct pcifab_mrpc)
 * @flags: in: must be 0
 * @cmd: in: MRPC command id
 * @in_len: in: bytes at @in_ptr, at most PCIFAB_MRPC_MAX_DATA
 * @out_len: in: bytes of output wanted at @out_ptr, at most PCIFAB_MRPC_MAX_DATA
 * @timeout_ms: in: how long to wait for the firmware; 0 for the default (5 s)
 * @in_ptr: in: user address of the command's input
 * @out_ptr: in: user address for the command's output
 * @status: out: firmware status: 2 done, 0xff error (see @ret_value)
 * @ret_value: out: firmware return value (0 on success, else the firmware's error code)
 *
 * Commands are classed as fwctl does, by id and sub-command (Documentation/uapi.rst):
 * read-only commands (echo, die temperature GET, single-shot database dump sections and
 * the GET step of chunked ones, the read extensions the firmware offers) need only an
 * open file; configuration commands (dump sessions, event queue, bind/unbind, port
 * control and configuration, device management) need CAP_SYS_ADMIN; everything else,
 * unknown ids and extensions the firmware does not offer included, is debug-write and
 * needs CAP_SYS_RAWIO. Errors: EPERM (class not allowed), EINVAL (lengths, timeout
 * (see PCIFAB_MRPC_USER_MIN_TIMEOUT_MS), flags), EFAULT, ETIMEDOUT (firmware did not
 * finish in time), EIO (firmware stopped running), EINTR (signal while waiting; the command may
 * still complete in the switch), ENODEV (endpoint removed). A firmware error is
 * not an ioctl error: the call succeeds with @status 0xff and @ret_value set.
 */
struct pcifab_mrpc {
	__u32 size;
	__u32 flags;
	__u32 cmd;
	__u32 in_len;
	__u32 out_len;
	__u32 timeout_ms;
	__aligned_u64 in_ptr;
	__aligned_u64 out_ptr;
	__u32 status;
	__u32 ret_value;
};

/**
 * struct pcifab_stats - PCIFAB_IOCTL_STATS argument: counters of the endpoint
 * @size: in: sizeof(struct pcifab_stats)
 * @flags: in: must be 0
 * @mrpc_commands: out: MRPC commands started
 * @mrpc_completions: out: MRPC completion interrupts
 * @mrpc_timeouts: out: commands the firmware did not finish in time
 * @mrpc_firmware_dead: out: commands failed because the firmware stopped running
 * @event_irqs: out: event interrupts handled
 */
struct pcifab_stats {
	__u32 size;
	__u32 flags;
	__aligned_u64 mrpc_commands;
	__aligned_u64 mrpc_completions;
	__aligned_u64 mrpc_timeouts;
	__aligned_u64 mrpc_firmware_dead;
	__aligned_u64 event_irqs;
};

/* PCIFAB_IOCTL_EVENTS flags: wait until more than @seen events happened. */
#define PCIFAB_EVENTS_WAIT	(1U << 0)

/**
 * struct pcifab_events - PCIFAB_IOCTL_EVENTS argument: event counters, optionally waiting
 * @size: in: sizeof(struct pcifab_events)
 * @flags: in: 0 or PCIFAB_EVENTS_WAIT
 * @timeout_ms: in, with PCIFAB_EVENTS_WAIT: longest wait, 0 for no limit
 * @__reserved0: zero
 * @seen: in, with PCIFAB_EVENTS_WAIT: the @total the caller has already seen
 * @total: out: fabric and link events since the driver bound (MRPC completions not counted)
 * @link: out: link-state events of this host's ports
 * @gfms: out: fabric-manager events (bindings, devices, database changes)
 * @irqs: out: event interrupts handled
 *
 * Without PCIFAB_EVENTS_WAIT the call returns at once. With it, it returns when @total
 * exceeds @seen, when @timeout_ms passed (then @total may equal @seen: not an error), or
 * with EINTR on a signal. poll() on the device reports EPOLLIN | EPOLLPRI when events
 * arrived that this open file has not read with PCIFAB_IOCTL_EVENTS yet.
 */
struct pcifab_events {
	__u32 size;
	__u32 flags;
	__u32 timeout_ms;
	__u32 __reserved0;
	__aligned_u64 seen;
	__aligned_u64 total;
	__aligned_u64 link;
	__aligned_u64 gfms;
	__aligned_u64 irqs;
};

/* struct pcifab_port.type */
#define PCIFAB_PORT_UNUSED	0
#define PCIFAB_PORT_FABRIC	1
#define PCIFAB_PORT_ENDPOINT	2
#define PCIFAB_PORT_HOST	3

/**
 * struct pcifab_port - one physical port of the switch
 * @phys_port: physical port id
 * @type: PCIFAB_PORT_*
 * @link_up: 1 when the link is up
 * @width: negotiated link width (lanes), 0 when down
 * @rate: negotiated link rate (PCIe generation), 0 when down
 * @__reserved: zero
 */
struct pcifab_port {
	__u8 phys_port;
	__u8 type;
	__u8 link_up;
	__u8 width;
	__u8 rate;
	__u8 __reserved[3];
};

/* struct pcifab_function.flags */
#define PCIFAB_FN_VF		(1U << 0)
#define PCIFAB_FN_BOUND		(1U << 1)
#define PCIFAB_FN_LINK_UP	(1U << 2)

/* struct pcifab_function.bound_host and bound_port when not bound */
#define PCIFAB_UNBOUND		0xff

/**
 * struct pcifab_function - one endpoint function (PF or VF) of the fabric
 * @pdfid: the function's fabric id (PDFID), the name every command uses
 * @pf_pdfid: PDFID of its physical function (its own for a PF)
 * @vendor: PCI vendor id
 * @device: PCI device id
 * @class_code: PCI class code (base << 16 | sub << 8 | prog-if)
 * @phys_port: physical port of the endpoint
 * @vf_index: 0 for a PF, n for VF n
 * @total_vfs: for a PF, its number of VFs
 * @flags: PCIFAB_FN_*
 * @bound_host: partition (host) it is bound to, PCIFAB_UNBOUND if none
 * @bound_port: logical downstream port of that host, PCIFAB_UNBOUND if none
 * @__reserved0: zero
 * @__reserved1: zero
 */
struct pcifab_function {
	__u16 pdfid;
	__u16 pf_pdfid;
	__u16 vendor;
	__u16 device;
	__u32 class_code;
	__u8 phys_port;
	__u8 vf_index;
	__u8 total_vfs;
	__u8 flags;
	__u8 bound_host;
	__u8 bound_port;
	__u16 __reserved0;
	__u32 __reserved1;
};

/**
 * struct pcifab_inventory - PCIFAB_IOCTL_INVENTORY argument: the whole fabric
 * @size: in: sizeof(struct pcifab_inventory)
 * @flags: in: must be 0
 * @generation: out: the firmware's fabric generation this snapshot belongs to
 * @partition: out: this host's partition
 * @host_count: out: number of hosts (partitions)
 * @nr_ports: in: entries available at @ports_ptr; out: ports in the fabric
 * @nr_functions: in: entries available at @functions_ptr; out: functions in the fabric
 * @port_size: in: sizeof(struct pcifab_port) as the caller knows it
 * @function_size: in: sizeof(struct pcifab_function) as the caller knows it
 * @ports_ptr: in: user array of @nr_ports entries of @port_size bytes
 * @functions_ptr: in: user array of @nr_functions entries of @function_size bytes
 *
 * The kernel fills min(in, out) entries of each array; when an out count is larger than
 * the in count, call again with larger arrays. Entry sizes smaller than the first
 * version's are EINVAL; larger ones get their extra bytes zeroed.
 */
struct pcifab_inventory {
	__u32 size;
	__u32 flags;
	__u32 generation;
	__u16 partition;
	__u16 host_count;
	__u32 nr_ports;
	__u32 nr_functions;
	__u32 port_size;
	__u32 function_size;
	__aligned_u64 ports_ptr;
	__aligned_u64 functions_ptr;
};

/* struct pcifab_bind.port: the first free logical port of the host. */
#define PCIFAB_ANY_PORT		0xff
/* PCIFAB_IOCTL_BIND flags: return when the firmware bound it, do not wait to enumerate it. */
#define PCIFAB_BIND_NO_WAIT	(1U << 0)
/* Longest bind/unbind/move timeout, in milliseconds; 0 means 30000. */
#define PCIFAB_BIND_MAX_TIMEOUT_MS 120000

/**
 * struct pcifab_bind - PCIFAB_IOCTL_BIND argument: bind a function to a host
 * @size: in: sizeof(struct pcifab_bind)
 * @flags: in: 0 or PCIFAB_BIND_NO_WAIT
 * @pdfid: in: the function
 * @host: in: the host (partition) to bind it to
 * @port: in: logical downstream port of that host, or PCIFAB_ANY_PORT; out: the port used
 * @timeout_ms: in: bound on the whole operation; 0 for 30 s
 * @fw_ret: out: the firmware's return code when it refused (see Documentation/mrpc.rst)
 * @vendor: out: PCI vendor id as this host enumerated it (binding to this host only)
 * @device: out: PCI device id, likewise
 * @name: out: PCI name on this host, e.g. "0000:03:00.0", NUL-terminated; empty otherwise
 * @nr_pdfids: in: 0 to bind @pdfid alone, or 1 to PCIFAB_BIND_MAX_PDFIDS to bind @pdfids[0..n]
 *	together to one logical port as one multi-function device (since 1.6)
 * @pdfids: in: the functions, @pdfids[0] == @pdfid (function 0 on the host)
 *
 * Binding to this host returns once this host enumerated the function; if it does not
 * appear within @timeout_ms the binding is undone and the call fails with ETIMEDOUT.
 * Errors: EPERM (needs CAP_SYS_ADMIN), ENOENT (unknown function), EBUSY (function or port
 * taken, or a PF/VF conflict), EACCES (the fabric's policy refuses), ENOSPC (no free port or
 * host limit), EIO (hot-plug failed). On a firmware refusal @fw_ret is written back too.
 * Several functions are bound all or none: a refusal or a function that does not appear
 * leaves none of them bound. @vendor, @device and @name describe function 0.
 */
struct pcifab_bind {
	__u32 size;
	__u32 flags;
	__u16 pdfid;
	__u8 host;
	__u8 port;
	__u32 timeout_ms;
	__u32 fw_ret;
	__u16 vendor;
	__u16 device;
	char name[16];
	__u32 nr_pdfids;
	__u16 pdfids[8];
};

/* struct pcifab_bind.pdfids: functions one bind names at most. */
#define PCIFAB_BIND_MAX_PDFIDS	8

/**
 * struct pcifab_unbind - PCIFAB_IOCTL_UNBIND argument: take a function away from its host
 * @size: in: sizeof(struct pcifab_unbind)
 * @flags: in: must be 0
 * @pdfid: in: the function
 * @host: out: the host it was bound to
 * @port: out: the logical port it was bound to
 * @timeout_ms: in: bound on the whole operation; 0 for 30 s
 * @fw_ret: out: the firmware's return code when it refused
 * @__reserved0: zero
 *
 * If the function is bound to this host, its driver is unbound and the device removed (slot
 * powered off) before the firmware is asked. ENOENT if it is not bound.
 */
struct pcifab_unbind {
	__u32 size;
	__u32 flags;
	__u16 pdfid;
	__u8 host;
	__u8 port;
	__u32 timeout_ms;
	__u32 fw_ret;
	__u32 __reserved0;
};

/**
 * struct pcifab_move - PCIFAB_IOCTL_MOVE argument: unbind a function and bind it elsewhere
 * @size, @flags, @pdfid, @host, @port, @timeout_ms, @fw_ret, @vendor, @device, @name: as in
 *	struct pcifab_bind (@flags must be 0)
 * @from_host: out: the host it was bound to
 * @from_port: out: the logical port it was bound to
 * @__reserved0: zero
 *
 * If binding at the destination fails, the function is bound back where it was and the
 * call fails with the destination's error.
 */
struct pcifab_move {
	__u32 size;
	__u32 flags;
	__u16 pdfid;
	__u8 host;
	__u8 port;
	__u32 timeout_ms;
	__u32 fw_ret;
	__u16 vendor;
	__u16 device;
	char name[16];
	__u8 from_host;
	__u8 from_port;
	__u16 __reserved0;
};

/**
 * struct pcifab_route - one P2P route of this host's window (MRPC 0xF004)
 * @window_off: offset in the MEP's P2P window (BAR2), a multiple of 4096
 * @size: bytes, a multiple of 4096
 * @target_off: offset in the target function's device memory, a multiple of 4096
 * @pdfid: the target function
 * @target_host: out: the partition the target is bound to
 *
 * Routes are the only way this host's CPU and the MEP's DMA engine reach a
 * function's memory; a function that is unbound loses every route to it.
 */
struct pcifab_route {
	__aligned_u64 window_off;
	__aligned_u64 size;
	__aligned_u64 target_off;
	__u16 pdfid;
	__u8 target_host;
	__u8 __reserved0;
	__u32 __reserved1;
};

/* struct pcifab_route.window_off for PCIFAB_IOCTL_P2P_ROUTE_ADD: the lowest free offset. */
#define PCIFAB_ROUTE_ANY_WINDOW	(~0ULL)

/**
 * struct pcifab_p2p_route - PCIFAB_IOCTL_P2P_ROUTE_ADD and _DEL argument
 * @size: in: sizeof(struct pcifab_p2p_route)
 * @flags: in: must be 0
 * @route: in: the route (DEL reads only @route.window_off); out (ADD): the
 *	route as added, with @route.window_off chosen if it was PCIFAB_ROUTE_ANY_WINDOW
 * @fw_ret: out: the firmware's return code when it refused, else 0
 * @nr_routes: out: routes of this host after the change
 *
 * Needs CAP_SYS_ADMIN. Errors: EINVAL (alignment, zero size, outside the
 * window), ENOENT (no such function / no route at @window_off), ENOLINK (the
 * target is not bound), ERANGE (beyond the target's memory), EEXIST (overlaps
 * a route), ENOSPC (16 routes, or no free window space).
 */
struct pcifab_p2p_route {
	__u32 size;
	__u32 flags;
	struct pcifab_route route;
	__u32 fw_ret;
	__u32 nr_routes;
};

/**
 * struct pcifab_p2p_routes - PCIFAB_IOCTL_P2P_ROUTES argument: list the routes
 * @size: in: sizeof(struct pcifab_p2p_routes)
 * @flags: in: must be 0
 * @nr_routes: in: entries @routes_ptr has room for; out: routes that exist
 *	(at most min(in, out) entries are written)
 * @route_size: in: sizeof(struct pcifab_route)
 * @routes_ptr: in: user array of struct pcifab_route
 * @window_size: out: size of the P2P window in bytes
 */
struct pcifab_p2p_routes {
	__u32 size;
	__u32 flags;
	__u32 nr_routes;
	__u32 route_size;
	__aligned_u64 routes_ptr;
	__aligned_u64 window_size;
};

/* struct pcifab_p2p_end.kind */
#define PCIFAB_P2P_FUNCTION	0	/* @pdfid's device memory at @addr, through a route */
#define PCIFAB_P2P_USER		1	/* a user buffer at virtual address @addr */
#define PCIFAB_P2P_IOVA		2	/* the bus address @addr as is: CAP_SYS_RAWIO, for tests */
#define PCIFAB_P2P_PEER		3	/* since 1.8: a buffer peer host @pdfid (its HFID)
					 * registered for this host in @slot, at offset @addr */

/**
 * struct pcifab_p2p_end - one end of a PCIFAB_IOCTL_P2P_COPY
 * @kind: PCIFAB_P2P_FUNCTION, _USER, _IOVA or _PEER
 * @pdfid: the function (PCIFAB_P2P_FUNCTION), the peer host's HFID (PCIFAB_P2P_PEER)
 * @slot: the peer's slot (PCIFAB_P2P_PEER, 0 to 5); zero for the other kinds
 * @addr: offset in the function's device memory, user address, IOVA, or offset in the
 *	peer's buffer
 */
struct pcifab_p2p_end {
	__u32 kind;
	__u16 pdfid;
	union {
		__u16 __reserved0;
		__u16 slot;
	};
	__aligned_u64 addr;
};

/* Largest PCIFAB_IOCTL_P2P_COPY length. */
#define PCIFAB_P2P_MAX_LEN	(1ULL << 30)
/* Longest PCIFAB_IOCTL_P2P_COPY timeout in milliseconds; 0 means 60000. */
#define PCIFAB_P2P_MAX_TIMEOUT_MS 600000
/* Routes a host's window holds at most; routes map whole 4 KiB pages. */
#define PCIFAB_P2P_MAX_ROUTES	16
#define PCIFAB_P2P_ROUTE_ALIGN	4096

/* struct pcifab_p2p_copy.dma_status: the engine's status of a descriptor. */
#define PCIFAB_P2P_DMA_NONE		0	/* no descriptor ran */
#define PCIFAB_P2P_DMA_OK		1
#define PCIFAB_P2P_DMA_HOST_FAULT	2	/* host memory the IOMMU did not map */
#define PCIFAB_P2P_DMA_ROUTE_FAULT	3	/* no route, or it went away mid-copy */
#define PCIFAB_P2P_DMA_BAD		4	/* a descriptor the engine rejected */

/**
 * struct pcifab_p2p_copy - PCIFAB_IOCTL_P2P_COPY argument: copy with the MEP's DMA engine
 * @size: in: sizeof(struct pcifab_p2p_copy)
 * @flags: in: must be 0
 * @src: in: where the data comes from
 * @dst: in: where it goes (not both ends user buffers or IOVAs)
 * @len: in: bytes, 1 to PCIFAB_P2P_MAX_LEN
 * @done: out: bytes copied; less than @len after an error
 * @dma_status: out: the engine's status of the last descriptor
 *	(PCIFAB_P2P_DMA_*), PCIFAB_P2P_DMA_NONE if none ran
 * @timeout_ms: in: bound on the whole copy, 0 means 60000, at most
 *	PCIFAB_P2P_MAX_TIMEOUT_MS
 *
 * A function end must lie wholly inside one route of this host. User
 * buffers are pinned and DMA-mapped for the copy and unmapped before the
 * ioctl returns. Function-to-function data moves through the fabric, never
 * through host memory. Needs CAP_SYS_ADMIN. Errors: EINVAL, ENOENT (no route
 * covers a function range), EFAULT (a user buffer, or a HOST_FAULT: the
 * engine was refused memory the IOMMU did not map), EREMOTEIO (ROUTE_FAULT:
 * a route went away during the copy), ETIMEDOUT, EINTR, ENODEV.
 *
 * Since 1.8, @dst may be a PCIFAB_P2P_PEER end with a user buffer as @src: the
 * switch's DMA endpoint copies into the buffer the peer registered for this host
 * (PCIFAB_IOCTL_P2P_REGISTER on the peer), checked against the firmware's list of
 * the peer's buffers before any descriptor is written: ENOENT when the peer
 * registered none in that slot for this host (or is no host of the fabric), EFAULT
 * when [@addr, @addr + @len) is not inside it, EREMOTEIO when the firmware refused
 * a descriptor (the buffer went away during the copy); @dma_status is then the
 * endpoint's completion status.
 */
struct pcifab_p2p_copy {
	__u32 size;
	__u32 flags;
	struct pcifab_p2p_end src;
	struct pcifab_p2p_end dst;
	__aligned_u64 len;
	__aligned_u64 done;
	__u32 dma_status;
	__u32 timeout_ms;
};

/* struct pcifab_p2p_distance.path */
#define PCIFAB_P2P_PATH_SAME	0	/* the same function */
#define PCIFAB_P2P_PATH_SWITCH	1	/* both on this host: through its virtual switch */
#define PCIFAB_P2P_PATH_FABRIC	2	/* through the fabric, by a route of the MEP */

/* struct pcifab_p2p_distance.info bits */
#define PCIFAB_P2P_A_LOCAL	(1U << 0)	/* @a is bound to and enumerated on this host */
#define PCIFAB_P2P_B_LOCAL	(1U << 1)
#define PCIFAB_P2P_A_ROUTED	(1U << 2)	/* a route of this host reaches @a */
#define PCIFAB_P2P_B_ROUTED	(1U << 3)
#define PCIFAB_P2P_ACS_REDIRECT	(1U << 4)	/* a downstream port redirects peer requests up */

/**
 * struct pcifab_p2p_distance - PCIFAB_IOCTL_P2P_DISTANCE argument
 * @size: in: sizeof(struct pcifab_p2p_distance)
 * @flags: in: must be 0
 * @a: in: a function
 * @b: in: another (or the same) function
 * @path: out: PCIFAB_P2P_PATH_*
 * @hops: out: switch ports the data crosses (0 for the same function)
 * @pci_distance: out: the kernel's pci_p2pdma_distance() between the two
 *	when both are local, -1 when the kernel would refuse P2P or either is not local
 * @info: out: PCIFAB_P2P_* bits
 */
struct pcifab_p2p_distance {
	__u32 size;
	__u32 flags;
	__u16 a;
	__u16 b;
	__u32 path;
	__u32 hops;
	__s32 pci_distance;
	__u32 info;
	__u32 __reserved0;
};

/**
 * struct pcifab_p2p_grant - PCIFAB_IOCTL_P2P_GRANT and _REVOKE argument (since 1.5)
 * @size: sizeof(struct pcifab_p2p_grant)
 * @flags: 0
 * @pdfid: in: the function; it must be bound to this host, or this host must be the
 *	fabric-manager host
 * @grantee: in: the partition (host) that may then route to @pdfid
 * @__reserved0: zero
 * @fw_ret: out: the firmware's return code when it refused, else 0
 * @nr_grants: out: grants on @pdfid now
 * @__reserved1: zero
 *
 * A host may add P2P routes only onto functions bound to itself, or onto a function whose
 * holder (or the fabric-manager host) granted it. The firmware drops a grant, and every
 * route it allowed, when the function is unbound; REVOKE drops them at once.
 */
struct pcifab_p2p_grant {
	__u32 size;
	__u32 flags;
	__u16 pdfid;
	__u8 grantee;
	__u8 __reserved0;
	__u32 fw_ret;
	__u32 nr_grants;
	__u32 __reserved1;
};

/**
 * struct pcifab_grant - one P2P grant (PCIFAB_IOCTL_P2P_GRANTS)
 * @pdfid: the function
 * @holder: the partition the function is bound to
 * @grantee: the partition that may route to it
 * @__reserved: zero
 */
struct pcifab_grant {
	__u16 pdfid;
	__u8 holder;
	__u8 grantee;
	__u32 __reserved;
};

/**
 * struct pcifab_p2p_grants - PCIFAB_IOCTL_P2P_GRANTS argument: list grants (since 1.5)
 * @size: sizeof(struct pcifab_p2p_grants)
 * @flags: 0
 * @nr_grants: in: entries @grants_ptr has room for; out: grants that exist (those on
 *	functions this host holds or was granted; the fabric-manager host sees all)
 * @grant_size: in: sizeof(struct pcifab_grant) as the caller knows it (at least 8)
 * @grants_ptr: in: array of @nr_grants entries of @grant_size bytes
 */
struct pcifab_p2p_grants {
	__u32 size;
	__u32 flags;
	__u32 nr_grants;
	__u32 grant_size;
	__aligned_u64 grants_ptr;
};

/* Buffers a host may register for one peer host (the DMA endpoint's slots 0 to 5). */
#define PCIFAB_P2P_PEER_SLOTS	6

/**
 * struct pcifab_p2p_buffer - PCIFAB_IOCTL_P2P_REGISTER and _UNREGISTER argument (since 1.8)
 * @size: sizeof(struct pcifab_p2p_buffer)
 * @flags: 0
 * @peer: in: the HFID of the host that may then write into the buffer
 * @slot: REGISTER: out: the slot the buffer took (0 to 5); UNREGISTER: in
 * @__reserved0: zero
 * @hfid: out: this host's HFID (what the peer names as @pdfid of a PCIFAB_P2P_PEER end)
 * @__reserved1: zero
 * @fw_ret: out: the firmware's return value when it refused, else 0
 * @__reserved2: zero
 * @addr: in: REGISTER: user address of the buffer; UNREGISTER: 0
 * @len: in: REGISTER: its length in bytes, 1 to PCIFAB_P2P_MAX_LEN; UNREGISTER: 0
 *
 * Through the switch's DMA endpoint in fabric mode (PAX parts, the module's pcifab_dmaep
 * driver bound to it). REGISTER pins the buffer, maps it for the endpoint as one range
 * (EINVAL when it does not map as one: without an IOMMU, a buffer within one
 * page always does) and registers it in the peer's lowest free slot; the peer's copies
 * may then write into it, and nothing else of this host's memory. The registration
 * belongs to the open file: UNREGISTER, closing the file and unbinding the endpoint
 * unregister it, and its pages are unmapped and unpinned only once the firmware answered.
 * Needs CAP_SYS_ADMIN. Errors: EINVAL, EFAULT, ENOSPC (the peer's 6 slots are taken),
 * ENOENT (UNREGISTER: no such registration of this file; or the firmware no longer had it,
 * which releases it too), EIO (the firmware refused: @fw_ret; or a reply that does not
 * parse), ETIMEDOUT, EINTR, ENODEV, EOPNOTSUPP (no DMA endpoint with a command path).
 * After ETIMEDOUT, EINTR or a reply that does not parse, the buffer may be registered: it
 * stays the file's, unregistered when the file is closed.
 */
struct pcifab_p2p_buffer {
	__u32 size;
	__u32 flags;
	__u16 peer;
	__u8 slot;
	__u8 __reserved0;
	__u16 hfid;
	__u16 __reserved1;
	__u32 fw_ret;
	__u32 __reserved2;
	__aligned_u64 addr;
	__aligned_u64 len;
};

/*
 * The ioctl numbers (since 1.7): _IOWR, as the kernel reads each struct and writes it back,
 * with the size of the struct as of 1.7. When a struct grows its number stays what it is
 * here (the size it encodes is then spelt as a number): the struct's @size field, not the
 * number, says how large the caller's struct is.
 *
 * Until 1.6 the numbers were _IO(PCIFAB_IOCTL_TYPE, nr), without direction and size. The
 * kernel still accepts those as aliases of the same ioctls, so programs built against an
 * older header keep working; new programs use the numbers below.
 */
#define PCIFAB_IOCTL_VERSION		_IOWR(PCIFAB_IOCTL_TYPE, 0x00, struct pcifab_version)
#define PCIFAB_IOCTL_IDENTITY		_IOWR(PCIFAB_IOCTL_TYPE, 0x01, struct pcifab_identity)
#define PCIFAB_IOCTL_MRPC		_IOWR(PCIFAB_IOCTL_TYPE, 0x02, struct pcifab_mrpc)
#define PCIFAB_IOCTL_STATS		_IOWR(PCIFAB_IOCTL_TYPE, 0x03, struct pcifab_stats)
#define PCIFAB_IOCTL_EVENTS		_IOWR(PCIFAB_IOCTL_TYPE, 0x04, struct pcifab_events)
#define PCIFAB_IOCTL_INVENTORY		_IOWR(PCIFAB_IOCTL_TYPE, 0x05, struct pcifab_inventory)
#define PCIFAB_IOCTL_BIND		_IOWR(PCIFAB_IOCTL_TYPE, 0x06, struct pcifab_bind)
#define PCIFAB_IOCTL_UNBIND		_IOWR(PCIFAB_IOCTL_TYPE, 0x07, struct pcifab_unbind)
#define PCIFAB_IOCTL_MOVE		_IOWR(PCIFAB_IOCTL_TYPE, 0x08, struct pcifab_move)
#define PCIFAB_IOCTL_P2P_ROUTE_ADD	_IOWR(PCIFAB_IOCTL_TYPE, 0x09, struct pcifab_p2p_route)
#define PCIFAB_IOCTL_P2P_ROUTE_DEL	_IOWR(PCIFAB_IOCTL_TYPE, 0x0a, struct pcifab_p2p_route)
#define PCIFAB_IOCTL_P2P_ROUTES		_IOWR(PCIFAB_IOCTL_TYPE, 0x0b, struct pcifab_p2p_routes)
#define PCIFAB_IOCTL_P2P_COPY		_IOWR(PCIFAB_IOCTL_TYPE, 0x0c, struct pcifab_p2p_copy)
#define PCIFAB_IOCTL_P2P_DISTANCE	_IOWR(PCIFAB_IOCTL_TYPE, 0x0d, struct pcifab_p2p_distance)
#define PCIFAB_IOCTL_P2P_GRANT		_IOWR(PCIFAB_IOCTL_TYPE, 0x0e, struct pcifab_p2p_grant)
#define PCIFAB_IOCTL_P2P_REVOKE		_IOWR(PCIFAB_IOCTL_TYPE, 0x0f, struct pcifab_p2p_grant)
#define PCIFAB_IOCTL_P2P_GRANTS		_IOWR(PCIFAB_IOCTL_TYPE, 0x10, struct pcifab_p2p_grants)
/* Since 1.8; these have no _IO alias. */
#define PCIFAB_IOCTL_P2P_REGISTER	_IOWR(PCIFAB_IOCTL_TYPE, 0x11, struct pcifab_p2p_buffer)
#define PCIFAB_IOCTL_P2P_UNREGISTER	_IOWR(PCIFAB_IOCTL_TYPE, 0x12, struct pcifab_p2p_buffer)

#endif /* _UAPI_LINUX_PCIFAB_H */
