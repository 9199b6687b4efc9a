// SPDX-License-Identifier: GPL-2.0-only
//! P2P routes and grants, the P2P window and the DMA engine, driven through
//! whole fabrics: MRPC commands, the MEPs' registers and the control socket.

use crate::config::Config;
use crate::control::handle;
use crate::dma::tests::memfd;
use crate::dma::{FLAG_READ, FLAG_WRITE};
use crate::fabric::Fabric;
use crate::gas::*;
use crate::mep::{Mep, REGION_BAR0, REGION_BAR2};
use crate::model::{self, Grant, Route, MAX_GRANTS};
use crate::mrpc::{self, Exec, MrpcOutcome};
use crate::p2p::*;
use crate::vfio_user::Device;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

// h0 holds gpu1's PF (0x0400), h1 gpu0's PF (0x0300); gpu0's VFs are free.
const CFG: &str = "p2p_window_mib = 16\n\
    [[hosts]]\nname = \"h0\"\n[[hosts]]\nname = \"h1\"\n\
    [[endpoints]]\nname = \"gpu0\"\nport = 16\nvendor_id = 1\ndevice_id = 2\nclass = 1\n\
    vfs = 2\nmem_mib = 1\ndev_mem_mib = 4\nvf_mem_mib = 1\n\
    [[endpoints]]\nname = \"gpu1\"\nport = 24\nvendor_id = 1\ndevice_id = 2\nclass = 1\n\
    mem_mib = 2\n\
    [[bindings]]\nendpoint = \"gpu0\"\nhost = \"h1\"\nlogical_port = 0\n\
    [[bindings]]\nendpoint = \"gpu1\"\nhost = \"h0\"\nlogical_port = 0\n";
const MIB: u64 = 1 << 20;
const HOST: u64 = 0x1000_0000;

/// The fabric of CFG, as it starts.
fn bare_fabric() -> Fabric {
    Fabric::new(Config::parse(CFG).expect("config"))
}

/// The fabric of CFG where h1, the holder of gpu0's PF, granted it to
/// h0 (through MRPC), so h0 may route onto both PFs.
fn fabric() -> Fabric {
    let f = bare_fabric();
    assert_eq!(
        ret(&f, 1, &grant_in(GRANT, 0x0300, 0)),
        0,
        "h1 grants 0x0300 to h0"
    );
    f
}

const GRANT: u8 = 4;
const REVOKE: u8 = 5;
const GRANT_LIST: u8 = 6;

/// P2P_ROUTE GRANT / REVOKE / GRANT_LIST input.
fn grant_in(sub: u8, pdfid: u16, grantee: u8) -> Vec<u8> {
    let mut v = route_in(sub, pdfid, 0, 0, 0);
    v[8] = grantee;
    v
}

fn route_in(sub: u8, pdfid: u16, woff: u64, size: u64, toff: u64) -> Vec<u8> {
    let mut v = vec![1, 0, 32, 0, sub, 0];
    v.extend_from_slice(&pdfid.to_le_bytes());
    for x in [woff, size, toff] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

fn mrpc(f: &Fabric, host: usize, input: &[u8]) -> MrpcOutcome {
    let mut m = f.model();
    Exec {
        model: &mut m,
        partition: host,
        bad_length: false,
        notices: Vec::new(),
        deferred: None,
        ep_access: None,
    }
    .run(mrpc::MRPC_P2P_ROUTE, input)
}

fn ret(f: &Fabric, host: usize, input: &[u8]) -> u32 {
    mrpc(f, host, input).ret
}

fn add(f: &Fabric, host: usize, pdfid: u16, woff: u64, size: u64, toff: u64) {
    let r = mrpc(f, host, &route_in(1, pdfid, woff, size, toff));
    assert_eq!(r.ret, 0, "ADD {pdfid:#x} {woff:#x}+{size:#x}");
}

fn reg(mep: &Mep, r: u64) -> u32 {
    let mut b = [0u8; 4];
    mep.region_read(REGION_BAR0, P2P + r, &mut b).expect("read");
    u32::from_le_bytes(b)
}

fn set(mep: &Mep, r: u64, v: u32) {
    mep.region_write(REGION_BAR0, P2P + r, &v.to_le_bytes())
        .expect("write");
}

/// An eventfd on MSI-X vector `v`; returns a reader of its count.
fn msix(mep: &Mep, v: usize) -> impl Fn() -> u64 {
    // SAFETY: plain system call; the fd is owned right away.
    let fd =
        unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)) };
    let reader = fd.try_clone().expect("dup");
    mep.irqs(&mut |i| i.set(crate::irq::MSIX, v, fd.try_clone().ok()));
    move || {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from an fd we own.
        let r = unsafe { libc::read(reader.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        if r == 8 {
            n
        } else {
            0
        }
    }
}

/// 8 MiB of fake guest memory mapped read/write at HOST.
fn map_host(mep: &Mep) {
    let fd = memfd(8 << 20);
    mep.lock()
        .dma
        .map(HOST, 8 << 20, 0, FLAG_READ | FLAG_WRITE, Some(fd))
        .expect("map");
}

fn host_write(mep: &Mep, iova: u64, data: &[u8]) {
    mep.lock().dma.write(iova, data).expect("host write");
}

fn host_read(mep: &Mep, iova: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mep.lock().dma.read(iova, &mut v).expect("host read");
    v
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Pattern::new(seed).fill(&mut v);
    v
}

fn desc(control: u32, len: u64, src: u64, dst: u64) -> Vec<u8> {
    let mut d = vec![0u8; 64];
    d[0..4].copy_from_slice(&control.to_le_bytes());
    d[8..16].copy_from_slice(&len.to_le_bytes());
    d[16..24].copy_from_slice(&src.to_le_bytes());
    d[24..32].copy_from_slice(&dst.to_le_bytes());
    d[40..48].copy_from_slice(&0xc00c1e_u64.to_le_bytes());
    d
}

const RING: u64 = HOST + 0x7f_0000;

/// Enable the engine with a 16-entry ring at RING.
fn start_engine(mep: &Mep) {
    set(mep, DMA_RING_LO, RING as u32);
    set(mep, DMA_RING_HI, (RING >> 32) as u32);
    set(mep, DMA_RING_SIZE, 16);
    set(mep, DMA_CTRL, DMA_CTRL_ENABLE);
}

/// Queue one descriptor at TAIL, run the engine; (status, done).
fn submit(mep: &Mep, d: &[u8]) -> (u32, u64) {
    let tail = reg(mep, DMA_TAIL);
    let at = RING + u64::from(tail % 16) * 64;
    host_write(mep, at, d);
    set(mep, DMA_TAIL, (tail + 1) % 16);
    process(mep);
    let back = host_read(mep, at, 64);
    let st = u32::from_le_bytes(back[4..8].try_into().expect("4"));
    let done = u64::from_le_bytes(back[32..40].try_into().expect("8"));
    assert_eq!(back[40..48], d[40..48], "cookie untouched");
    (st, done)
}

const H2W: u32 = KIND_HOST | KIND_WINDOW << 2;
const W2W: u32 = KIND_WINDOW | KIND_WINDOW << 2;
const W2H: u32 = KIND_WINDOW | KIND_HOST << 2;

#[test]
fn route_add_del_list_layouts() {
    let f = fabric();
    let r = mrpc(&f, 0, &route_in(1, 0x0300, 0x10000, 0x2000, 0x30_0000));
    assert_eq!((r.status, r.ret), (2, 0));
    assert_eq!(r.output, [1, 0, 8, 0, 1, 0, 0, 0]);
    add(&f, 0, 0x0400, 0, 0x1000, 0);
    // A larger size header is accepted, the extra bytes ignored.
    let mut big = route_in(3, 0, 0, 0, 0);
    big[2] = 40;
    big.extend_from_slice(&[0xee; 8]);
    let r = mrpc(&f, 0, &big);
    assert_eq!(r.ret, 0);
    let mut want = vec![1, 0, 72, 0, 2, 0, 32, 0];
    for (w, s, t, p, h) in [
        (0u64, 0x1000u64, 0u64, 0x0400u16, 0u8),
        (0x10000, 0x2000, 0x30_0000, 0x0300, 1),
    ] {
        want.extend_from_slice(&w.to_le_bytes());
        want.extend_from_slice(&s.to_le_bytes());
        want.extend_from_slice(&t.to_le_bytes());
        want.extend_from_slice(&p.to_le_bytes());
        want.extend_from_slice(&[h, 0, 0, 0, 0, 0]);
    }
    assert_eq!(r.output, want, "LIST, ascending window_off");
    // Routes are per MEP.
    assert_eq!(
        mrpc(&f, 1, &route_in(3, 0, 0, 0, 0)).output,
        [1, 0, 8, 0, 0, 0, 32, 0]
    );
    let r = mrpc(&f, 0, &route_in(2, 0, 0, 0, 0));
    assert_eq!((r.ret, r.output), (0, vec![1, 0, 8, 0, 1, 0, 0, 0]), "DEL");
    assert_eq!(
        ret(&f, 0, &route_in(2, 0, 0, 0, 0)),
        model::PCIFAB_ERR_NO_ROUTE
    );
    assert_eq!(
        ret(&f, 0, &route_in(2, 0, 0x11000, 0, 0)),
        model::PCIFAB_ERR_NO_ROUTE,
        "DEL inside a route, not at its start"
    );
    assert!(f.model().invariants().is_empty());
    let s = handle("routes h0", &f);
    assert_eq!(
        s,
        "{\"ok\":true,\"routes\":[{\"window_off\":65536,\"size\":8192,\"target_off\":3145728,\"pdfid\":768,\"target_host\":\"h1\"}]}"
    );
    assert_eq!(handle("routes h1", &f), "{\"ok\":true,\"routes\":[]}");
}

#[test]
fn route_errors_in_order() {
    let f = fabric();
    let w = 16 * MIB;
    use model::*;
    let mut short = route_in(1, 0x0300, 0, 0x1000, 0);
    short.pop();
    let mut v2 = route_in(1, 0x0300, 0, 0x1000, 0);
    v2[0] = 2;
    let mut small = route_in(1, 0x0300, 0, 0x1000, 0);
    small[2] = 28;
    for (input, want, why) in [
        (vec![1, 0, 32], ERR_PARAM_INVALID, "no header"),
        (short, ERR_PARAM_INVALID, "31 of 32 bytes"),
        (v2, ERR_PARAM_INVALID, "version 2"),
        (small, ERR_PARAM_INVALID, "size 28"),
        (
            route_in(0, 0x0300, 0, 0x1000, 0),
            mrpc::ERR_SUBCMD_INVALID,
            "sub 0",
        ),
        (
            route_in(7, 0x0300, 0, 0x1000, 0),
            mrpc::ERR_SUBCMD_INVALID,
            "sub 7",
        ),
        (
            route_in(1, 0x0999, 0x800, 0x1000, 0),
            ERR_PARAM_INVALID,
            "window_off unaligned first",
        ),
        (
            route_in(1, 0x0300, 0, 0x1800, 0),
            ERR_PARAM_INVALID,
            "size unaligned",
        ),
        (
            route_in(1, 0x0300, 0, 0x1000, 0x10),
            ERR_PARAM_INVALID,
            "target_off unaligned",
        ),
        (route_in(1, 0x0300, 0, 0, 0), ERR_PARAM_INVALID, "size 0"),
        (
            route_in(1, 0x0300, w - 0x1000, 0x2000, 0),
            ERR_PARAM_INVALID,
            "past the window",
        ),
        (
            route_in(1, 0x0300, 0x1000, u64::MAX - 0xfff, 0),
            ERR_PARAM_INVALID,
            "wraps",
        ),
        (
            route_in(1, 0x0999, 0, 0x1000, 0),
            PCIFAB_ERR_PDFID_UNKNOWN,
            "unknown pdfid",
        ),
        (
            route_in(1, 0x0301, 0, 0x1000, 1 << 40),
            PCIFAB_ERR_NOT_BOUND,
            "unbound before range",
        ),
        (
            route_in(1, 0x0300, 0, 0x1000, 4 * MIB),
            PCIFAB_ERR_RANGE,
            "past device memory",
        ),
        (
            route_in(1, 0x0400, 0, 0x1000, 2 * MIB),
            PCIFAB_ERR_RANGE,
            "past gpu1's 2 MiB",
        ),
        (
            route_in(1, 0x0300, 0, 0x1000, u64::MAX - 0xfff),
            PCIFAB_ERR_RANGE,
            "target wraps",
        ),
    ] {
        let r = mrpc(&f, 0, &input);
        assert_eq!((r.status, r.ret), (0xff, want), "{why}");
    }
    // All of the device memory is reachable, not only BAR2's 1 MiB.
    add(&f, 0, 0x0300, 0, 0x1000, 4 * MIB - 0x1000);
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0400, 0, 0x2000, 0)),
        PCIFAB_ERR_ROUTE_CONFLICT
    );
    for i in 1..16u64 {
        add(&f, 0, 0x0400, i * 0x1000, 0x1000, 0);
    }
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0400, 0xf000, 0x1000, 0)),
        PCIFAB_ERR_ROUTE_CONFLICT,
        "conflict is checked before full"
    );
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0400, 0x10_0000, 0x1000, 0)),
        PCIFAB_ERR_ROUTE_FULL
    );
    assert_eq!(mrpc(&f, 0, &route_in(3, 0, 0, 0, 0)).output[4], 16);
    assert!(f.model().invariants().is_empty());
    assert_eq!(mrpc::mrpc_name(0xf004), "P2P_ROUTE");
}

#[test]
fn window_accesses() {
    let f = fabric();
    let mep = &f.meps[0];
    let irq = msix(mep, 2);
    set(mep, DMA_IRQ, DMA_IRQ_ENABLE | 2);
    add(&f, 0, 0x0300, 0x10000, 0x2000, 0x30_0000);
    mep.region_write(REGION_BAR2, 0x10010, b"hello")
        .expect("write");
    let pf = f.function_dev(0x0300).expect("PF");
    let mut b = [0u8; 5];
    pf.dev_read(0x30_0010, &mut b).expect("dev read");
    assert_eq!(&b, b"hello", "landed beyond BAR2, in device memory");
    let mut r = [0u8; 5];
    mep.region_read(REGION_BAR2, 0x10010, &mut r).expect("read");
    assert_eq!(&r, b"hello");
    assert_eq!(reg(mep, P2P_FAULT_COUNT), 0);
    // Straddling the route's end: all ones, a fault, nothing written.
    let mut r = [0u8; 4];
    mep.region_read(REGION_BAR2, 0x11ffe, &mut r).expect("read");
    assert_eq!(r, [0xff; 4]);
    assert_eq!(reg(mep, P2P_FAULT_COUNT), 1);
    assert_eq!(reg(mep, P2P_FAULT_ADDR_LO), 0x11ffe);
    assert_eq!(reg(mep, P2P_EVENT_STATUS), EV_P2P_FAULT);
    assert_eq!(irq(), 1, "P2P_FAULT interrupts on DMA_IRQ's vector");
    mep.region_write(REGION_BAR2, 0xff_f000, &[1; 8])
        .expect("write");
    assert_eq!(reg(mep, P2P_FAULT_COUNT), 2);
    assert_eq!(reg(mep, P2P_FAULT_ADDR_LO), 0xff_f000);
    assert_eq!(irq(), 0, "bit already set: no new interrupt");
    set(mep, P2P_EVENT_STATUS, EV_P2P_FAULT);
    assert_eq!(reg(mep, P2P_EVENT_STATUS), 0, "write 1 to clear");
    // h1's MEP has no routes: its window faults.
    let mut r = [0u8; 2];
    f.meps[1]
        .region_read(REGION_BAR2, 0x10010, &mut r)
        .expect("read");
    assert_eq!(r, [0xff; 2]);
    assert_eq!(reg(&f.meps[1], P2P_FAULT_COUNT), 1);
    // Beyond the BAR: an error reply, no fault.
    assert!(mep.region_read(REGION_BAR2, 16 * MIB - 1, &mut r).is_err());
    assert_eq!(mep.region_size(REGION_BAR2), 16 * MIB);
    assert_eq!(reg(mep, P2P_FAULT_COUNT), 2);
    assert_eq!(reg(mep, P2P_CAPS), 0x0010_0301, "v1, window, DMA, 16 MiB");
    let s = handle("p2p h0", &f);
    assert_eq!(s, "{\"ok\":true,\"fault_count\":2,\"fault_addr\":16773120,\"dma_completed\":0,\"head\":0,\"tail\":0,\"status\":0,\"event_status\":0}");
}

#[test]
fn dma_host_window_host() {
    let f = fabric();
    let mep = &f.meps[0];
    map_host(mep);
    let irq = msix(mep, 3);
    set(mep, DMA_IRQ, DMA_IRQ_ENABLE | 3);
    add(&f, 0, 0x0300, 0, 2 * MIB, 2 * MIB); // gpu0 PF, owned by h1
    add(&f, 0, 0x0400, 4 * MIB, 2 * MIB, 0); // gpu1 PF, owned by h0
    start_engine(mep);
    let len = MIB + 0x1234; // two chunks, the last one short
    let data = pattern(7, len as usize);
    host_write(mep, HOST, &data);
    assert_eq!(
        submit(mep, &desc(H2W | DESC_IRQ, len, HOST, 0x10)),
        (ST_OK, len)
    );
    let mut got = vec![0u8; len as usize];
    let pf0 = f.function_dev(0x0300).expect("PF");
    pf0.dev_read(2 * MIB + 0x10, &mut got).expect("read");
    assert!(got == data, "host -> window");
    assert_eq!((reg(mep, DMA_HEAD), reg(mep, DMA_COMPLETED)), (1, 1));
    assert_eq!(reg(mep, DMA_STATUS), 0, "idle");
    assert_eq!(reg(mep, P2P_EVENT_STATUS), EV_DMA_DONE);
    assert_eq!(irq(), 1);
    // Window -> window: function to function.
    assert_eq!(
        submit(mep, &desc(W2W, len, 0x10, 4 * MIB + 0x20)),
        (ST_OK, len)
    );
    let pf1 = f.function_dev(0x0400).expect("PF");
    pf1.dev_read(0x20, &mut got).expect("read");
    assert!(got == data, "window -> window");
    assert_eq!(irq(), 0, "no IRQ bit: no interrupt");
    // Window -> host.
    assert_eq!(
        submit(mep, &desc(W2H, len, 4 * MIB + 0x20, HOST + 4 * MIB)),
        (ST_OK, len)
    );
    assert!(
        host_read(mep, HOST + 4 * MIB, len as usize) == data,
        "window -> host"
    );
    assert_eq!(reg(mep, DMA_COMPLETED), 3);
    assert_eq!(
        mep.p2p.model().hosts[0].routes.len(),
        2,
        "copies leave the routes alone"
    );
    let s = handle("dma-maps h0", &f);
    assert_eq!(s, "{\"ok\":true,\"maps\":[{\"iova\":268435456,\"size\":8388608,\"flags\":3,\"mmapped\":true}]}");
    assert_eq!(handle("dma-maps h1", &f), "{\"ok\":true,\"maps\":[]}");
}

#[test]
fn dma_faults_write_nothing() {
    let f = fabric();
    let mep = &f.meps[0];
    map_host(mep);
    let ro = memfd(0x10000);
    mep.lock()
        .dma
        .map(0x4000_0000, 0x10000, 0, FLAG_READ, Some(ro))
        .expect("map ro");
    add(&f, 0, 0x0300, 0, 0x10000, 0);
    start_engine(mep);
    let pf = f.function_dev(0x0300).expect("PF");
    pf.dev_write(0, &[0x5a; 0x10000]).expect("fill");
    host_write(mep, HOST, &[0xa5; 0x20000]);
    let unchanged = |what: &str| {
        let mut b = vec![0u8; 0x10000];
        pf.dev_read(0, &mut b).expect("read");
        assert!(b.iter().all(|&x| x == 0x5a), "{what}: window written");
        assert!(
            host_read(mep, HOST, 0x20000).iter().all(|&x| x == 0xa5),
            "{what}: host written"
        );
    };
    for (d, st, why) in [
        (
            desc(H2W, 0x1000, 0x2000_0000, 0),
            ST_HOST_FAULT,
            "unmapped source",
        ),
        (
            desc(H2W, 0x2000, HOST + 8 * MIB - 0x1000, 0),
            ST_HOST_FAULT,
            "past the mapping",
        ),
        (
            desc(W2H, 0x1000, 0, 0x4000_0000),
            ST_HOST_FAULT,
            "read-only destination",
        ),
        (
            desc(W2H, 0x1000, 0, 0x2000_0000),
            ST_HOST_FAULT,
            "unmapped destination",
        ),
        (
            desc(H2W, 0x1000, HOST, 0xf800),
            ST_ROUTE_FAULT,
            "straddles the route's end",
        ),
        (desc(H2W, 0x1000, HOST, 0x20000), ST_ROUTE_FAULT, "no route"),
        (
            desc(W2H, 0x1000, 0x10000, HOST),
            ST_ROUTE_FAULT,
            "source without route",
        ),
        (desc(H2W, 0, HOST, 0), ST_BAD, "length 0"),
        (desc(H2W, MAX_DMA_LEN + 1, HOST, 0), ST_BAD, "too long"),
        (
            desc(2 | KIND_WINDOW << 2, 0x1000, HOST, 0),
            ST_BAD,
            "source kind 2",
        ),
        (
            desc(KIND_HOST | 3 << 2, 0x1000, HOST, 0),
            ST_BAD,
            "destination kind 3",
        ),
    ] {
        assert_eq!(submit(mep, &d), (st, 0), "{why}");
        unchanged(why);
    }
    assert_eq!(reg(mep, DMA_COMPLETED), 11, "failed descriptors complete");
    assert_eq!(reg(mep, DMA_STATUS), 0, "not halted");
    assert_eq!(
        reg(mep, P2P_FAULT_COUNT),
        0,
        "DMA faults are not window faults"
    );
}

#[test]
fn dma_halts_and_resets() {
    let f = fabric();
    let mep = &f.meps[0];
    map_host(mep);
    let irq = msix(mep, 1);
    set(mep, DMA_IRQ, DMA_IRQ_ENABLE | 1);
    // A ring that is not mapped: the fetch fails.
    set(mep, DMA_RING_LO, 0x2000_0000);
    set(mep, DMA_RING_SIZE, 4);
    set(mep, DMA_CTRL, DMA_CTRL_ENABLE);
    set(mep, DMA_TAIL, 1);
    assert_eq!(reg(mep, DMA_STATUS), DMA_STATUS_BUSY);
    process(&**mep);
    assert_eq!(reg(mep, DMA_STATUS), DMA_STATUS_BUSY | DMA_STATUS_HALTED);
    assert_eq!(reg(mep, P2P_EVENT_STATUS), EV_DMA_ERROR);
    assert_eq!(irq(), 1);
    assert_eq!(reg(mep, DMA_HEAD), 0);
    // RESET: HEAD = TAIL = 0, STATUS = 0, reads 0; ENABLE as written.
    set(mep, DMA_CTRL, DMA_CTRL_RESET | DMA_CTRL_ENABLE);
    assert_eq!(reg(mep, DMA_CTRL), DMA_CTRL_ENABLE);
    assert_eq!(
        (reg(mep, DMA_STATUS), reg(mep, DMA_HEAD), reg(mep, DMA_TAIL)),
        (0, 0, 0)
    );
    // Bad ring sizes and a misaligned ring halt at once.
    for (size, ring) in [(3, RING), (1, RING), (8192, RING), (16, RING + 8)] {
        set(mep, DMA_CTRL, DMA_CTRL_RESET | DMA_CTRL_ENABLE);
        set(mep, DMA_RING_LO, ring as u32);
        set(mep, DMA_RING_HI, (ring >> 32) as u32);
        set(mep, DMA_RING_SIZE, size);
        set(mep, DMA_TAIL, 1);
        process(&**mep);
        assert_eq!(
            reg(mep, DMA_STATUS) & DMA_STATUS_HALTED,
            DMA_STATUS_HALTED,
            "size {size} ring {ring:#x}"
        );
    }
    // A ring whose write-back fails (read-only mapping) halts too, and
    // the descriptor does not complete.
    let ro = memfd(0x1000);
    mep.lock()
        .dma
        .map(0x4000_0000, 0x1000, 0, FLAG_READ, Some(ro))
        .expect("map ro");
    set(mep, DMA_CTRL, DMA_CTRL_RESET);
    set(mep, P2P_EVENT_STATUS, EV_ALL);
    set(mep, DMA_RING_LO, 0x4000_0000);
    set(mep, DMA_RING_HI, 0);
    set(mep, DMA_RING_SIZE, 2);
    set(mep, DMA_TAIL, 1);
    process(&**mep);
    assert_eq!(
        reg(mep, DMA_STATUS),
        DMA_STATUS_BUSY,
        "disabled: nothing done"
    );
    set(mep, DMA_CTRL, DMA_CTRL_ENABLE);
    process(&**mep);
    assert_eq!(reg(mep, DMA_STATUS), DMA_STATUS_BUSY | DMA_STATUS_HALTED);
    assert_eq!(reg(mep, DMA_COMPLETED), 0);
    // Read-only registers stay.
    for r in [
        DMA_STATUS,
        DMA_HEAD,
        P2P_FAULT_COUNT,
        DMA_COMPLETED,
        P2P_CAPS,
    ] {
        let before = reg(mep, r);
        set(mep, r, 0x1234_5678);
        assert_eq!(reg(mep, r), before, "register {r:#x}");
    }
    // A device reset brings power-on values back.
    mep.reset();
    assert_eq!(reg(mep, DMA_STATUS), 0);
    assert_eq!(reg(mep, P2P_CAPS), 0x0010_0301);
}

#[test]
fn route_deleted_mid_copy() {
    let f = Arc::new(fabric());
    let mep = Arc::clone(&f.meps[0]);
    map_host(&mep);
    add(&f, 0, 0x0300, 0, 4 * MIB, 0);
    start_engine(&mep);
    assert_eq!(handle("fault h0 dma-delay 100", &f), "{\"ok\":true}");
    assert!(handle("state", &f).contains("\"dma-delay 100\""));
    let data = pattern(3, 3 * MIB as usize);
    host_write(&mep, HOST, &data);
    host_write(&mep, RING, &desc(H2W, 3 * MIB, HOST, 0));
    set(&mep, DMA_TAIL, 1);
    let m = Arc::clone(&mep);
    let t = std::thread::spawn(move || process(&*m));
    // Chunk 0 goes at ~100 ms, chunk 1 would at ~200 ms.
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(ret(&f, 0, &route_in(2, 0, 0, 0, 0)), 0, "DEL");
    t.join().expect("engine");
    let back = host_read(&mep, RING, 64);
    assert_eq!(
        u32::from_le_bytes(back[4..8].try_into().expect("4")),
        ST_ROUTE_FAULT
    );
    assert_eq!(u64::from_le_bytes(back[32..40].try_into().expect("8")), MIB);
    let pf = f.function_dev(0x0300).expect("PF");
    let mut got = vec![0u8; 2 * MIB as usize];
    pf.dev_read(0, &mut got).expect("read");
    assert!(
        got[..MIB as usize] == data[..MIB as usize],
        "first chunk arrived"
    );
    assert!(
        got[MIB as usize..].iter().all(|&b| b == 0),
        "second did not"
    );
    assert_eq!((reg(&mep, DMA_HEAD), reg(&mep, DMA_COMPLETED)), (1, 1));
    assert_eq!(handle("fault clear h0", &f), "{\"ok\":true}");
    assert_eq!(mep.faults().dma_delay_ms, 0);
}

#[test]
fn reset_waits_for_the_descriptor_in_flight() {
    let f = Arc::new(fabric());
    let mep = Arc::clone(&f.meps[0]);
    map_host(&mep);
    add(&f, 0, 0x0300, 0, 4 * MIB, 0);
    start_engine(&mep);
    handle("fault h0 dma-delay 60", &f);
    host_write(&mep, RING, &desc(H2W, 2 * MIB, HOST, 0));
    set(&mep, DMA_TAIL, 1);
    let m = Arc::clone(&mep);
    let t = std::thread::spawn(move || process(&*m));
    std::thread::sleep(Duration::from_millis(30));
    set(&mep, DMA_CTRL, DMA_CTRL_RESET | DMA_CTRL_ENABLE);
    assert_eq!(
        (
            reg(&mep, DMA_STATUS),
            reg(&mep, DMA_HEAD),
            reg(&mep, DMA_TAIL)
        ),
        (DMA_STATUS_BUSY, 0, 0),
        "BUSY until the current descriptor is done"
    );
    t.join().expect("engine");
    assert_eq!(reg(&mep, DMA_STATUS), 0, "idle");
    assert_eq!((reg(&mep, DMA_HEAD), reg(&mep, DMA_COMPLETED)), (0, 0));
    let back = host_read(&mep, RING, 64);
    assert_eq!(u32::from_le_bytes(back[4..8].try_into().expect("4")), ST_OK);
}

#[test]
fn unbind_removes_routes_everywhere() {
    let f = fabric();
    add(&f, 0, 0x0300, 0, 0x1000, 0);
    add(&f, 0, 0x0400, 0x1000, 0x1000, 0);
    add(&f, 1, 0x0300, 0x8000, 0x1000, 0);
    let pf = f.function_dev(0x0300).expect("PF");
    pf.dev_write(4 * MIB - 8, &[9; 8]).expect("write");
    let irq0 = msix(&f.meps[0], 0);
    set(&f.meps[0], DMA_IRQ, DMA_IRQ_ENABLE);
    let r = handle("unbind 0x0300", &f);
    assert!(r.starts_with("{\"ok\":true,\"ret\":0"), "{r}");
    let m = f.model();
    assert_eq!(m.hosts[0].routes.len(), 1, "the route to gpu1 stays");
    assert_eq!(m.hosts[0].routes[0].pdfid, 0x0400);
    assert!(m.hosts[1].routes.is_empty());
    assert!(m.invariants().is_empty());
    drop(m);
    for mep in &f.meps {
        assert_eq!(
            reg(mep, P2P_EVENT_STATUS),
            EV_ROUTES_CHANGED,
            "{}",
            mep.name
        );
    }
    assert_eq!(irq0(), 1);
    let mut b = [1u8; 8];
    pf.dev_read(4 * MIB - 8, &mut b).expect("read");
    assert_eq!(b, [0; 8], "all device memory scrubbed");
    // ADD to the now free function: NOT_BOUND.
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0300, 0, 0x1000, 0)),
        model::PCIFAB_ERR_NOT_BOUND
    );
    // An unbind of a function without routes changes no MEP's routes.
    set(&f.meps[1], P2P_EVENT_STATUS, EV_ALL);
    handle("unbind 0x0400", &f);
    assert_eq!(reg(&f.meps[1], P2P_EVENT_STATUS), 0);
    assert_eq!(reg(&f.meps[0], P2P_EVENT_STATUS), EV_ROUTES_CHANGED);
}

#[test]
fn invariants_cover_routes() {
    let f = fabric();
    add(&f, 0, 0x0300, 0, 0x2000, 0);
    let mut m = f.model();
    let bad = |window_off, size, target_off, pdfid| Route {
        window_off,
        size,
        target_off,
        pdfid,
    };
    m.hosts[0].routes.push(bad(0x1000, 0x1000, 0, 0x0300));
    m.hosts[0].routes.push(bad(0x10_0000, 0x1000, 0, 0x0301));
    m.hosts[0]
        .routes
        .push(bad(16 * MIB, 0x1000, 4 * MIB, 0x0300));
    let v = m.invariants();
    assert_eq!(v.len(), 4, "{v:?}");
    assert!(v[0].contains("overlaps route 0x1000+0x1000"), "{v:?}");
    assert!(
        v[1].contains("to 0x0301 targets an unbound function"),
        "{v:?}"
    );
    assert!(v[2].contains("reaches past its device memory"), "{v:?}");
    assert!(v[3].contains("outside the 0x1000000-byte window"), "{v:?}");
    drop(m);
    assert!(handle("invariants", &f).contains("targets an unbound function"));
}

#[test]
fn pattern_and_hash() {
    // The definition in emulator.rst, written out.
    let reference = |seed: u64, n: usize| {
        let mut state = seed | 1;
        let mut out = Vec::new();
        while out.len() < n {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            out.extend_from_slice(&state.to_le_bytes());
        }
        out.truncate(n);
        out
    };
    // seed 1: state 1 -> 0x40822041 after one xorshift64 step.
    assert_eq!(pattern(1, 8), [0x41, 0x20, 0x82, 0x40, 0, 0, 0, 0]);
    for (seed, n) in [(1, 21), (0xdead_beef, 64), (u64::MAX, 3)] {
        assert_eq!(pattern(seed, n), reference(seed, n));
    }
    assert_eq!(pattern(0, 16), pattern(1, 16), "seed | 1");
    let mut p = Pattern::new(99);
    let mut a = vec![0u8; 13];
    p.fill(&mut a[..5]);
    p.fill(&mut a[5..]);
    assert_eq!(a, pattern(99, 13), "a stream, however it is cut");
    assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);

    let f = fabric();
    let len = MIB + 13;
    assert_eq!(
        handle(&format!("mem-fill 0x0300 0x200000 {len} 42"), &f),
        "{\"ok\":true}"
    );
    let want = fnv1a(FNV_OFFSET, &pattern(42, len as usize));
    assert_eq!(
        handle(&format!("mem-hash 0x300 2097152 {len}"), &f),
        format!("{{\"ok\":true,\"fnv1a64\":\"{want:016x}\"}}")
    );
    assert_eq!(
        handle("mem-hash 0x0301 0 0", &f),
        "{\"ok\":true,\"fnv1a64\":\"cbf29ce484222325\"}"
    );
    for (bad, why) in [
        ("mem-fill 0x0300 0 1", "usage: mem-fill"),
        ("mem-fill 0x0999 0 1 1", "no function with pdfid 0x0999"),
        ("mem-fill 0x0300 0x3fffff 2 1", "outside the 0x400000 bytes"),
        ("mem-fill 0x0301 0 0x100001 1", "outside the 0x100000 bytes"),
        ("mem-hash 0x0300 x 1", "offset 'x' is not a number"),
        ("mem-hash 0x0300 0 18446744073709551615", "outside"),
        ("mem-hash 0x10000 0 1", "pdfid 0x10000 is out of range"),
        ("routes", "usage: routes <host>"),
        ("routes h9", "no host 'h9'"),
        ("dma-maps h0 h1", "usage: dma-maps"),
        ("p2p nobody", "no host 'nobody'"),
        ("fault h0 dma-delay 700000", "at most 600000"),
        ("fault h0 dma-delay", "usage: fault"),
    ] {
        let r = handle(bad, &f);
        assert!(
            r.starts_with("{\"ok\":false,\"error\":") && r.contains(why),
            "{bad}: {r}"
        );
    }
}

/// `memcpy-bench`: the engine's copy alone, between two functions' device memories, across
/// a chunk boundary; its answer and its refusals.
#[test]
fn memcpy_bench_copies_between_functions() {
    let f = fabric();
    let len = MIB + 13;
    assert_eq!(
        handle(&format!("mem-fill 0x0300 0 {len} 7"), &f),
        "{\"ok\":true}"
    );
    let r = handle(&format!("memcpy-bench 0x0300 0x0400 {len} 2"), &f);
    let v: serde_json::Value = serde_json::from_str(&r).expect(&r);
    assert_eq!(v["ok"], true, "{r}");
    assert_eq!(v["src"], 0x0300, "{r}");
    assert_eq!(v["dst"], 0x0400, "{r}");
    assert_eq!(v["bytes"], len, "{r}");
    assert_eq!(v["reps"], 2, "{r}");
    assert_eq!(v["chunk"], CHUNK, "{r}");
    let secs = v["seconds"].as_f64().expect(&r);
    let mib_s = v["mib_s"].as_f64().expect(&r);
    assert!(secs > 0.0 && mib_s > 0.0, "{r}");
    // The destination now holds the source's bytes, the byte after them untouched.
    let hash = |req: &str| handle(req, &f);
    assert_eq!(
        hash(&format!("mem-hash 0x0400 0 {len}")),
        hash(&format!("mem-hash 0x0300 0 {len}"))
    );
    let mut b = [0u8; 1];
    f.function_dev(0x0400)
        .expect("0x0400")
        .dev_read(len, &mut b)
        .expect("read");
    assert_eq!(b, [0], "the byte after the copy");
    // reps defaults to 3; the whole of the smaller memory may be copied, onto itself too.
    let r = handle("memcpy-bench 0x400 0x0300 0x200000", &f);
    assert!(r.contains("\"bytes\":2097152,\"reps\":3,"), "{r}");
    assert!(handle("memcpy-bench 0x0300 0x0300 4096 1", &f).starts_with("{\"ok\":true,"));
    for (bad, why) in [
        ("memcpy-bench", "usage: memcpy-bench"),
        ("memcpy-bench 0x0300 0x0400", "usage: memcpy-bench"),
        ("memcpy-bench 0x0300 0x0400 1 2 3", "usage: memcpy-bench"),
        (
            "memcpy-bench 0x0999 0x0400 1",
            "no function with pdfid 0x0999",
        ),
        (
            "memcpy-bench 0x0300 0x0999 1",
            "no function with pdfid 0x0999",
        ),
        (
            "memcpy-bench 0x10000 0x0400 1",
            "pdfid 0x10000 is out of range",
        ),
        ("memcpy-bench 0x0300 0x0400 0", "bytes must be at least 1"),
        ("memcpy-bench 0x0300 0x0400 x", "bytes 'x' is not a number"),
        (
            "memcpy-bench 0x0300 0x0400 0x200001",
            "outside the 0x200000 bytes",
        ),
        (
            "memcpy-bench 0x0301 0x0400 0x100001",
            "outside the 0x100000 bytes",
        ),
        (
            "memcpy-bench 0x0300 0x0400 0x10000001",
            "longest DMA descriptor",
        ),
        (
            "memcpy-bench 0x0300 0x0400 18446744073709551615",
            "longest DMA descriptor",
        ),
        (
            "memcpy-bench 0x0300 0x0400 1 0",
            "reps 0 is not from 1 to 100",
        ),
        (
            "memcpy-bench 0x0300 0x0400 1 101",
            "reps 101 is not from 1 to 100",
        ),
        (
            "memcpy-bench 0x0300 0x0400 1 4294967296",
            "reps 4294967296 is out of range",
        ),
    ] {
        let r = handle(bad, &f);
        assert!(
            r.starts_with("{\"ok\":false,\"error\":") && r.contains(why),
            "{bad}: {r}"
        );
    }
}

// h0 holds gpu1's PF, h1 gpu0's PF; h2 is the manager and holds nothing.
const CFG_MGR: &str = "p2p_window_mib = 16\n\
    [policy]\nmanager = \"h2\"\n\
    [[hosts]]\nname = \"h0\"\n[[hosts]]\nname = \"h1\"\n[[hosts]]\nname = \"h2\"\n\
    [[endpoints]]\nname = \"gpu0\"\nport = 16\nvendor_id = 1\ndevice_id = 2\nclass = 1\n\
    vfs = 2\nmem_mib = 1\ndev_mem_mib = 4\nvf_mem_mib = 1\n\
    [[endpoints]]\nname = \"gpu1\"\nport = 24\nvendor_id = 1\ndevice_id = 2\nclass = 1\n\
    mem_mib = 2\n\
    [[bindings]]\nendpoint = \"gpu0\"\nhost = \"h1\"\nlogical_port = 0\n\
    [[bindings]]\nendpoint = \"gpu1\"\nhost = \"h0\"\nlogical_port = 0\n";

fn mgr_fabric() -> Fabric {
    Fabric::new(Config::parse(CFG_MGR).expect("config"))
}

/// One P2P_ROUTE command through the firmware; also the fabric changes
/// it made.
fn mrpc_notices(f: &Fabric, host: usize, input: &[u8]) -> (MrpcOutcome, Vec<model::Notice>) {
    let mut m = f.model();
    let mut x = Exec {
        model: &mut m,
        partition: host,
        bad_length: false,
        notices: Vec::new(),
        deferred: None,
        ep_access: None,
    };
    let r = x.run(mrpc::MRPC_P2P_ROUTE, input);
    (r, x.notices)
}

/// GRANT_LIST output for these (pdfid, holder, grantee) entries.
fn grant_list_out(entries: &[(u16, u8, u8)]) -> Vec<u8> {
    let mut v = vec![
        1,
        0,
        8 + 8 * entries.len() as u8,
        0,
        entries.len() as u8,
        0,
        8,
        0,
    ];
    for &(p, h, g) in entries {
        v.extend_from_slice(&p.to_le_bytes());
        v.extend_from_slice(&[h, g, 0, 0, 0, 0]);
    }
    v
}

#[test]
fn routes_need_the_holder_or_a_grant() {
    use model::*;
    let f = mgr_fabric();
    // h0 may route onto what it holds, not onto what h1 holds.
    add(&f, 0, 0x0400, 0, 0x1000, 0);
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0300, 0x10000, 0x1000, 0)),
        PCIFAB_ERR_NOT_GRANTED
    );
    assert_eq!(
        ret(&f, 2, &route_in(1, 0x0300, 0, 0x1000, 0)),
        PCIFAB_ERR_NOT_GRANTED,
        "not even the manager without a grant"
    );
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0301, 0x10000, 0x1000, 0)),
        PCIFAB_ERR_NOT_BOUND,
        "NOT_BOUND comes first"
    );
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0300, 0x10000, 0x1000, 4 * MIB)),
        PCIFAB_ERR_NOT_GRANTED,
        "before RANGE"
    );
    // GRANT: refused for a host that neither holds the function nor manages.
    assert_eq!(
        ret(&f, 0, &grant_in(GRANT, 0x0300, 0)),
        PCIFAB_ERR_NOT_HOLDER
    );
    // Checks in order: parameters, pdfid, bound, holder/manager.
    let mut rsvd = grant_in(GRANT, 0x0300, 0);
    rsvd[31] = 1;
    for (host, input, want, why) in [
        (
            1,
            grant_in(GRANT, 0x0999, 3),
            ERR_PARAM_INVALID,
            "grantee 3 first",
        ),
        (1, rsvd, ERR_PARAM_INVALID, "byte 31 not zero"),
        (
            1,
            grant_in(GRANT, 0x0999, 0),
            PCIFAB_ERR_PDFID_UNKNOWN,
            "unknown",
        ),
        (
            1,
            grant_in(GRANT, 0x0301, 0),
            PCIFAB_ERR_NOT_BOUND,
            "unbound",
        ),
        (
            0,
            grant_in(GRANT, 0x0301, 1),
            PCIFAB_ERR_NOT_BOUND,
            "unbound, non-holder",
        ),
        (
            0,
            grant_in(GRANT, 0x0300, 2),
            PCIFAB_ERR_NOT_HOLDER,
            "non-holder",
        ),
        (
            1,
            grant_in(GRANT, 0x0300, 1),
            ERR_PARAM_INVALID,
            "to the holder",
        ),
        (
            0,
            grant_in(REVOKE, 0x0300, 0),
            PCIFAB_ERR_NOT_HOLDER,
            "revoke, non-holder",
        ),
        (
            1,
            grant_in(REVOKE, 0x0300, 0),
            PCIFAB_ERR_NO_GRANT,
            "no grant yet",
        ),
    ] {
        let r = mrpc(&f, host, &input);
        assert_eq!((r.status, r.ret), (0xff, want), "{why}");
    }
    assert!(f.model().grants.is_empty(), "refusals change nothing");
    // The holder grants: output like ADD's, the count of grants on 0x0300.
    let r = mrpc(&f, 1, &grant_in(GRANT, 0x0300, 0));
    assert_eq!((r.ret, r.output), (0, vec![1, 0, 8, 0, 1, 0, 0, 0]));
    let r = mrpc(&f, 1, &grant_in(GRANT, 0x0300, 0));
    assert_eq!(
        (r.ret, r.output),
        (0, vec![1, 0, 8, 0, 1, 0, 0, 0]),
        "idempotent"
    );
    // The manager grants what h1 holds, to itself, and what h0 holds to h1.
    let r = mrpc(&f, 2, &grant_in(GRANT, 0x0300, 2));
    assert_eq!((r.ret, r.output[4]), (0, 2));
    assert_eq!(ret(&f, 2, &grant_in(GRANT, 0x0400, 1)), 0);
    // Routes after the grant work, for the grantee only.
    add(&f, 0, 0x0300, 0x10000, 0x2000, 0x30_0000);
    add(&f, 2, 0x0300, 0, 0x1000, 0);
    f.meps[0]
        .region_write(REGION_BAR2, 0x10008, b"granted")
        .expect("write");
    let mut b = [0u8; 7];
    f.function_dev(0x0300)
        .expect("PF")
        .dev_read(0x30_0008, &mut b)
        .expect("read");
    assert_eq!(&b, b"granted");
    assert_eq!(reg(&f.meps[0], P2P_FAULT_COUNT), 0);
    // GRANT_LIST: what each host may see, ascending pdfid then grantee.
    let list = |h: usize| mrpc(&f, h, &grant_in(GRANT_LIST, 0, 0)).output;
    assert_eq!(list(0), grant_list_out(&[(0x0300, 1, 0), (0x0400, 0, 1)]));
    assert_eq!(
        list(1),
        grant_list_out(&[(0x0300, 1, 0), (0x0300, 1, 2), (0x0400, 0, 1)]),
        "the holder of 0x0300 sees all its grants, and the one it was given"
    );
    assert_eq!(
        list(2),
        grant_list_out(&[(0x0300, 1, 0), (0x0300, 1, 2), (0x0400, 0, 1)]),
        "the manager sees all"
    );
    assert_eq!(
        handle("grants", &f),
        "{\"ok\":true,\"grants\":[{\"pdfid\":768,\"holder\":\"h1\",\"grantee\":\"h0\"},\
         {\"pdfid\":768,\"holder\":\"h1\",\"grantee\":\"h2\"},\
         {\"pdfid\":1024,\"holder\":\"h0\",\"grantee\":\"h1\"}]}"
    );
    assert_eq!(
        handle("grants h2", &f),
        "{\"ok\":true,\"grants\":[{\"pdfid\":768,\"holder\":\"h1\",\"grantee\":\"h2\"}]}"
    );
    assert!(handle("grants h9", &f).contains("no host 'h9'"));
    assert!(handle("grants h0 h1", &f).contains("usage: grants [host]"));
    assert!(f.model().invariants().is_empty());
    // REVOKE by the holder: the grantee's routes onto the function go
    // (and only those), ROUTES_CHANGED is asked for on the grantee's MEP.
    let (r, notices) = mrpc_notices(&f, 1, &grant_in(REVOKE, 0x0300, 0));
    assert_eq!((r.ret, r.output), (0, vec![1, 0, 8, 0, 1, 0, 0, 0]));
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].routes_lost, [0]);
    assert!(!notices[0].gfms && notices[0].pffs.is_empty());
    {
        let m = f.model();
        assert_eq!(
            m.hosts[0].routes.len(),
            1,
            "h0's route to its own 0x0400 stays"
        );
        assert_eq!(m.hosts[0].routes[0].pdfid, 0x0400);
        assert_eq!(m.hosts[2].routes.len(), 1, "h2's grant was not revoked");
        assert!(m.invariants().is_empty());
    }
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0300, 0x10000, 0x1000, 0)),
        PCIFAB_ERR_NOT_GRANTED,
        "revoked"
    );
    assert_eq!(
        ret(&f, 1, &grant_in(REVOKE, 0x0300, 0)),
        PCIFAB_ERR_NO_GRANT
    );
    // The manager revokes a grant without routes: no notice.
    let (r, notices) = mrpc_notices(&f, 2, &grant_in(REVOKE, 0x0400, 1));
    assert_eq!((r.ret, r.output[4]), (0, 0));
    assert!(notices.is_empty());
    assert_eq!(list(1), grant_list_out(&[(0x0300, 1, 2)]));
    assert_eq!(list(0), grant_list_out(&[]));
}

#[test]
fn unbind_drops_grants_and_routes() {
    let f = mgr_fabric();
    assert_eq!(ret(&f, 1, &grant_in(GRANT, 0x0300, 0)), 0);
    add(&f, 0, 0x0300, 0, 0x1000, 0);
    let r = handle("unbind 0x0300", &f);
    assert!(r.starts_with("{\"ok\":true,\"ret\":0"), "{r}");
    {
        let m = f.model();
        assert!(m.grants.is_empty(), "the grant went with the binding");
        assert!(m.hosts[0].routes.is_empty(), "and the route");
        assert!(m.invariants().is_empty());
    }
    assert_eq!(reg(&f.meps[0], P2P_EVENT_STATUS), EV_ROUTES_CHANGED);
    assert_eq!(handle("grants", &f), "{\"ok\":true,\"grants\":[]}");
    // Bound again (to the same host): the old grant does not come back.
    assert_eq!(handle("fault h1 no-enumerate", &f), "{\"ok\":true}");
    let r = handle("bind 0x0300 h1 0", &f);
    assert!(r.starts_with("{\"ok\":true,\"ret\":0"), "{r}");
    assert_eq!(
        ret(&f, 0, &route_in(1, 0x0300, 0, 0x1000, 0)),
        model::PCIFAB_ERR_NOT_GRANTED
    );
}

/// GRANT and REVOKE through the MEP's registers and its firmware worker:
/// a revoke takes the grantee's routes away and raises ROUTES_CHANGED there.
#[test]
fn revoke_through_the_mep() {
    let f = Arc::new(mgr_fabric());
    f.start().expect("start");
    let run = |host: usize, input: &[u8]| -> (u32, u32, Vec<u8>) {
        let mep = &f.meps[host];
        mep.region_write(REGION_BAR0, MRPC_INPUT_DATA, input)
            .expect("input");
        mep.region_write(REGION_BAR0, MRPC_CMD, &mrpc::MRPC_P2P_ROUTE.to_le_bytes())
            .expect("cmd");
        let mut st = [0u8; 4];
        mep.region_read(REGION_BAR0, MRPC_STATUS, &mut st)
            .expect("status");
        let mut rv = [0u8; 4];
        mep.region_read(REGION_BAR0, MRPC_RET_VALUE, &mut rv)
            .expect("ret");
        let mut out = vec![0u8; 8];
        mep.region_read(REGION_BAR0, MRPC_OUTPUT_DATA, &mut out)
            .expect("output");
        (u32::from_le_bytes(st), u32::from_le_bytes(rv), out)
    };
    assert_eq!(
        run(0, &route_in(1, 0x0300, 0, 0x1000, 0)).1,
        model::PCIFAB_ERR_NOT_GRANTED
    );
    assert_eq!(
        run(1, &grant_in(GRANT, 0x0300, 0)),
        (2, 0, vec![1, 0, 8, 0, 1, 0, 0, 0])
    );
    assert_eq!(
        run(0, &route_in(1, 0x0300, 0, 0x1000, 0)).0,
        2,
        "ADD after GRANT"
    );
    let mep0 = &f.meps[0];
    let irq = msix(mep0, 1);
    set(mep0, DMA_IRQ, DMA_IRQ_ENABLE | 1);
    mep0.region_write(REGION_BAR2, 0x10, b"x").expect("write");
    assert_eq!(reg(mep0, P2P_FAULT_COUNT), 0, "reachable while granted");
    assert_eq!(
        run(1, &grant_in(REVOKE, 0x0300, 0)),
        (2, 0, vec![1, 0, 8, 0, 0, 0, 0, 0])
    );
    assert_eq!(reg(mep0, P2P_EVENT_STATUS), EV_ROUTES_CHANGED);
    assert_eq!(irq(), 1);
    assert_eq!(
        reg(&f.meps[1], P2P_EVENT_STATUS),
        0,
        "only the grantee's MEP"
    );
    assert!(f.model().hosts[0].routes.is_empty());
    let mut b = [0u8; 1];
    mep0.region_read(REGION_BAR2, 0x10, &mut b).expect("read");
    assert_eq!(b, [0xff], "unreachable after the revoke");
    assert_eq!(reg(mep0, P2P_FAULT_COUNT), 1);
    assert!(f.model().invariants().is_empty());
}

#[test]
fn grant_limit_and_invariants() {
    let f = mgr_fabric();
    assert_eq!(ret(&f, 1, &grant_in(GRANT, 0x0300, 0)), 0);
    {
        // Fill the table (grants on pdfids no function has, only to count).
        let mut m = f.model();
        for p in 0..(MAX_GRANTS as u16 - 1) {
            m.grants.push(Grant {
                pdfid: 0x1000 + p,
                grantee: 0,
            });
        }
    }
    assert_eq!(
        ret(&f, 1, &grant_in(GRANT, 0x0300, 2)),
        model::PCIFAB_ERR_GRANT_FULL
    );
    assert_eq!(
        ret(&f, 1, &grant_in(GRANT, 0x0300, 0)),
        0,
        "an existing grant is fine"
    );
    let out = mrpc(&f, 2, &grant_in(GRANT_LIST, 0, 0)).output;
    assert_eq!(
        out[..8],
        [1, 0, 16, 0, 1, 0, 8, 0],
        "grants on no function are not listed"
    );
    f.model().grants.truncate(1);
    assert!(f.model().invariants().is_empty());
    // A route onto another host's function without a grant, a grant on
    // an unbound function and one to the holder all break invariants.
    let mut m = f.model();
    m.hosts[2].routes.push(Route {
        window_off: 0,
        size: 0x1000,
        target_off: 0,
        pdfid: 0x0300,
    });
    m.grants.push(Grant {
        pdfid: 0x0301,
        grantee: 0,
    });
    m.grants.push(Grant {
        pdfid: 0x0400,
        grantee: 0,
    });
    let v = m.invariants();
    assert_eq!(v.len(), 3, "{v:?}");
    assert!(
        v[0].contains("targets a function h1 holds, without a grant"),
        "{v:?}"
    );
    assert!(
        v[1].contains("0x0301 to partition 0 is on a function that is not bound"),
        "{v:?}"
    );
    assert!(
        v[2].contains("0x0400 to partition 0 is to the function's holder"),
        "{v:?}"
    );
}

/// A hostile firmware lies in the descriptor's write-back (done larger
/// than asked, random status) but copies the data and keeps HEAD and
/// DMA_COMPLETED true; the lies follow the seed; `fault clear` ends them.
#[test]
fn hostile_dma_writebacks() {
    let writebacks = |seed: u64| {
        let f = bare_fabric();
        let mep = &f.meps[0];
        map_host(mep);
        add(&f, 0, 0x0400, 0, 2 * MIB, 0); // gpu1 PF, held by h0
        start_engine(mep);
        assert_eq!(
            handle(&format!("fault h0 hostile {seed}"), &f),
            "{\"ok\":true}"
        );
        let data = pattern(seed, 0x3000);
        host_write(mep, HOST, &data);
        let mut got = Vec::new();
        for n in 1..=4u32 {
            let len = 0x1000 - u64::from(n);
            got.push(submit(mep, &desc(H2W, len, HOST, 0)));
            assert_eq!(
                (reg(mep, DMA_HEAD), reg(mep, DMA_COMPLETED)),
                (n, n),
                "the engine's registers stay true"
            );
        }
        let mut back = vec![0u8; 0x1000 - 4];
        f.function_dev(0x0400)
            .expect("PF")
            .dev_read(0, &mut back)
            .expect("read");
        assert!(back[..] == data[..back.len()], "the data arrived");
        assert_eq!(mep.hostile_report().counts.dma_writebacks, 4);
        assert_eq!(handle("fault clear h0", &f), "{\"ok\":true}");
        assert_eq!(
            submit(mep, &desc(H2W, 0x800, HOST, 0)),
            (ST_OK, 0x800),
            "truth again"
        );
        got
    };
    let a = writebacks(11);
    for (n, &(st, done)) in a.iter().enumerate() {
        let len = 0x1000 - 1 - n as u64;
        assert!(
            (st, done) != (ST_OK, len),
            "write-back {n} lies: {:?}",
            a[n]
        );
        assert!(
            st != ST_OK || done > len,
            "a lie the driver can see: {:?}",
            a[n]
        );
    }
    assert_eq!(a, writebacks(11), "deterministic per seed");
    assert_ne!(a, writebacks(12));
}

/// An nvme function has no device memory here: routes, grants, DMA
/// copies and control-socket fills onto it are refused, nothing panics.
#[test]
fn nvme_function_has_no_device_memory() {
    let cfg = Config::parse(
        "p2p_window_mib = 16\n[[hosts]]\nname = \"h0\"\n[[hosts]]\nname = \"h1\"\n\
         [[endpoints]]\nname = \"nvme0\"\nport = 20\nkind = \"nvme\"\ncapacity_mib = 1\n\
         [[bindings]]\nendpoint = \"nvme0\"\nhost = \"h0\"\nlogical_port = 0\n",
    )
    .expect("config");
    let dir = std::env::temp_dir().join(format!("pcifab-p2p-nvme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let f = Fabric::with(cfg, dir.clone(), &[]).expect("fabric");
    let nvme = 0x0380;
    assert_eq!(f.model().function(nvme).map(|x| x.dev_mem), Some(0));
    for (input, want, why) in [
        (
            route_in(1, nvme, 0, 0x1000, 0),
            model::PCIFAB_ERR_RANGE,
            "route",
        ),
        (
            route_in(1, nvme, 0, 0x1000, 1 << 40),
            model::PCIFAB_ERR_RANGE,
            "far",
        ),
        (grant_in(GRANT, nvme, 1), model::ERR_PARAM_INVALID, "grant"),
    ] {
        let r = mrpc(&f, 0, &input);
        assert_eq!((r.status, r.ret), (0xff, want), "{why}");
    }
    assert_eq!(f.model().grants.len(), 0);
    assert!(f.model().hosts[0].routes.is_empty());
    // The holder's DMA engine finds no route onto it.
    let mep = &f.meps[0];
    map_host(mep);
    start_engine(mep);
    assert_eq!(
        submit(mep, &desc(H2W, 0x1000, HOST, 0)),
        (ST_ROUTE_FAULT, 0)
    );
    // Direct device memory accesses are out of range, not a crash.
    let d = f.function_dev(nvme).expect("function");
    assert_eq!((d.dev_mem_size(), d.mem_size()), (0, 0));
    assert!(d.dev_read(0, &mut [0u8; 1]).is_err());
    assert!(d.dev_write(0, &[1]).is_err());
    assert!(d.dev_ptr(u64::MAX, 1).is_err());
    d.scrub().expect("scrubbing nothing");
    assert!(handle("mem-fill 0x0380 0 16 1", &f).contains("outside the 0x0 bytes"));
    assert_eq!(
        handle("mem-hash 0x0380 0 0", &f),
        "{\"ok\":true,\"fnv1a64\":\"cbf29ce484222325\"}"
    );
    // No BAR2 in its config space: it reads 0 and does not size.
    let cfg32 = |d: &crate::function::FnDevice, off: u64| {
        let mut b = [0u8; 4];
        d.region_read(crate::function::REGION_CONFIG, off, &mut b)
            .expect("config read");
        u32::from_le_bytes(b)
    };
    d.region_write(crate::function::REGION_CONFIG, 0x18, &[0xff; 8])
        .expect("config write");
    assert_eq!((cfg32(d, 0x18), cfg32(d, 0x1c)), (0, 0));
    assert_eq!(cfg32(d, 0), 0x0010_1b36, "QEMU's nvme ids");
    assert_eq!(cfg32(d, 8) >> 8, 0x01_0802, "class");
    assert_eq!(d.region_size(crate::function::REGION_BAR2), 0);
    assert!(d.region_mmap(crate::function::REGION_BAR2).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
