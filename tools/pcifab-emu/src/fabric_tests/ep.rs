// SPDX-License-Identifier: GPL-2.0-only
//! EP_TUNNEL_CFG (0x8F) and EP_RESOURCE_ACCESS (0x8E) through a whole fabric:
//! the MEP's registers, its firmware worker, and the function servers'
//! config space, BAR0 registers and device memory.

use crate::config::Config;
use crate::control::handle;
use crate::ep::{self, Access, EpAccess, ERR_BAD_FW_STATE};
use crate::fabric::Fabric;
use crate::function::{REGION_BAR0, REGION_CONFIG, REG_ID, REG_PDFID, SCRATCH};
use crate::gas::*;
use crate::mrpc::{ERR_MRPC_DENIED, ERR_PARAM_INVALID};
use crate::vfio_user::Device;
use std::sync::Arc;
use std::time::{Duration, Instant};

// h0 is the manager; h1 holds gpu1's PF (0x0400); gpu0 (PF 0x0300, VF
// 0x0301) is free. gpu0's PF shows 1 MiB of its 2 MiB in BAR2.
const CFG: &str = "[policy]\nmanager = \"h0\"\n\
    [[hosts]]\nname = \"h0\"\n[[hosts]]\nname = \"h1\"\nusp_port = 8\n\
    [[endpoints]]\nname = \"gpu0\"\nport = 16\nvendor_id = 0x10de\ndevice_id = 0x2330\n\
    class = 0x030200\nvfs = 1\nmem_mib = 1\ndev_mem_mib = 2\nvf_mem_mib = 1\n\
    [[endpoints]]\nname = \"gpu1\"\nport = 24\nvendor_id = 0x10de\ndevice_id = 0x2330\n\
    class = 0x030200\nmem_mib = 1\n\
    [[bindings]]\nendpoint = \"gpu1\"\nhost = \"h1\"\nlogical_port = 0\n";

const TUNNEL: u32 = 0x8f;
const ACCESS: u32 = 0x8e;

fn fabric() -> Arc<Fabric> {
    let f = Arc::new(Fabric::new(Config::parse(CFG).expect("config")));
    f.start().expect("start");
    f
}

/// Run one command on `host`'s MEP as a driver does: input, then cmd, then
/// poll status. Returns status, return value and the output buffer.
fn run(f: &Fabric, host: usize, cmd: u32, input: &[u8]) -> (u32, u32, Vec<u8>) {
    let mep = &f.meps[host];
    mep.region_write(REGION_BAR0, MRPC_INPUT_DATA, input)
        .expect("input");
    mep.region_write(REGION_BAR0, MRPC_CMD, &cmd.to_le_bytes())
        .expect("cmd");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inner = mep.lock();
        let st = inner.gas.get32(MRPC_STATUS);
        if st != MRPC_STATUS_INPROGRESS {
            let mut out = vec![0u8; 1024];
            inner.gas.read(MRPC_OUTPUT_DATA, &mut out).expect("output");
            return (st, inner.gas.get32(MRPC_RET_VALUE), out);
        }
        drop(inner);
        assert!(Instant::now() < deadline, "cmd {cmd:#x} never completes");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The output of a command that must succeed.
fn ok(f: &Fabric, host: usize, cmd: u32, input: &[u8]) -> Vec<u8> {
    let (st, ret, out) = run(f, host, cmd, input);
    assert_eq!(
        (st, ret),
        (MRPC_STATUS_DONE, 0),
        "h{host} {cmd:#x} {input:?}"
    );
    out
}

/// The return value of a command that must fail.
fn refused(f: &Fabric, host: usize, cmd: u32, input: &[u8]) -> u32 {
    let (st, ret, _) = run(f, host, cmd, input);
    assert_eq!(st, MRPC_STATUS_ERROR, "h{host} {cmd:#x} {input:?}");
    ret
}

fn tunnel(sub: u16, pdfid: u16) -> Vec<u8> {
    [sub, pdfid, if sub == 2 { 4 } else { 0 }, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

fn csr_read(pdfid: u16, addr: u16, bytes: u8) -> Vec<u8> {
    let mut v = vec![0, 0];
    v.extend_from_slice(&pdfid.to_le_bytes());
    v.extend_from_slice(&addr.to_le_bytes());
    v.extend_from_slice(&[bytes, 0]);
    v
}

fn csr_write(pdfid: u16, addr: u16, bytes: u8, val: u32) -> Vec<u8> {
    let mut v = csr_read(pdfid, addr, bytes);
    v[0] = 1;
    v.extend_from_slice(&val.to_le_bytes());
    v
}

fn bar_read(pdfid: u16, bar: u8, addr: u64, bytes: u16) -> Vec<u8> {
    let mut v = vec![2, 0];
    v.extend_from_slice(&pdfid.to_le_bytes());
    v.extend_from_slice(&[bar, 0]);
    v.extend_from_slice(&bytes.to_le_bytes());
    v.extend_from_slice(&(addr as u32).to_le_bytes());
    v.extend_from_slice(&((addr >> 32) as u32).to_le_bytes());
    v
}

/// As switchtec-user sends it: the header and all 512 data bytes.
fn bar_write(pdfid: u16, bar: u8, addr: u64, data: &[u8]) -> Vec<u8> {
    let mut v = bar_read(pdfid, bar, addr, data.len() as u16);
    v[0] = 3;
    let mut d = data.to_vec();
    d.resize(512, 0);
    v.extend_from_slice(&d);
    v
}

#[test]
fn config_space_and_bars_through_the_tunnel() {
    let f = fabric();
    let dev = Arc::clone(f.function_dev(0x0300).expect("fn 0x0300"));
    assert_eq!(
        refused(&f, 0, ACCESS, &csr_read(0x0300, 0, 4)),
        ERR_BAD_FW_STATE
    );
    assert_eq!(&ok(&f, 0, TUNNEL, &tunnel(0, 0x0300))[..4], [0; 4]);
    assert_eq!(
        &ok(&f, 0, TUNNEL, &tunnel(2, 0x0300))[..8],
        [4, 0, 0, 0, 1, 0, 0, 0]
    );

    // CSR reads: {u32 data}, the bytes read first.
    let r = ok(&f, 0, ACCESS, &csr_read(0x0300, 0, 4));
    assert_eq!(&r[..4], [0xde, 0x10, 0x30, 0x23], "vendor, device");
    assert_eq!(
        &ok(&f, 0, ACCESS, &csr_read(0x0300, 2, 2))[..4],
        [0x30, 0x23, 0, 0]
    );
    assert_eq!(
        &ok(&f, 0, ACCESS, &csr_read(0x0300, 0x0b, 1))[..4],
        [3, 0, 0, 0]
    );
    // CSR writes land in the function's own config space, with its masks.
    assert_eq!(
        &ok(&f, 0, ACCESS, &csr_write(0x0300, 4, 2, 0x0006))[..4],
        [0; 4]
    );
    assert_eq!(&ok(&f, 0, ACCESS, &csr_read(0x0300, 4, 2))[..2], [6, 0]);
    let mut b = [0u8; 2];
    dev.region_read(REGION_CONFIG, 4, &mut b).expect("config");
    assert_eq!(b, [6, 0], "what the host's QEMU reads");
    ok(&f, 0, ACCESS, &csr_write(0x0300, 0, 4, 0));
    assert_eq!(
        &ok(&f, 0, ACCESS, &csr_read(0x0300, 0, 2))[..2],
        [0xde, 0x10],
        "read-only"
    );

    // BAR0: the function's registers (a read takes the model lock: the
    // worker must have let go of it) and its scratch space.
    let id = ok(&f, 0, ACCESS, &bar_read(0x0300, 0, REG_ID, 4));
    assert_eq!(&id[..4], (0x2330u32 << 16 | 0x10de).to_le_bytes());
    assert_eq!(
        &ok(&f, 0, ACCESS, &bar_read(0x0300, 0, REG_PDFID, 2))[..2],
        [0x00, 0x03]
    );
    ok(
        &f,
        0,
        ACCESS,
        &bar_write(0x0300, 0, SCRATCH, &0xdead_beefu32.to_le_bytes()),
    );
    let r = ok(&f, 0, ACCESS, &bar_read(0x0300, 0, SCRATCH, 8));
    assert_eq!(&r[..8], [0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0]);
    let mut b = [0u8; 4];
    dev.region_read(REGION_BAR0, SCRATCH, &mut b).expect("bar0");
    assert_eq!(u32::from_le_bytes(b), 0xdead_beef);

    // BAR2: device memory, 128 bytes per write, 1024 per read.
    let pattern: Vec<u8> = (0..128u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    ok(&f, 0, ACCESS, &bar_write(0x0300, 2, 0x1000, &pattern));
    let mut mem = vec![0u8; 128];
    dev.mem_read(0x1000, &mut mem).expect("memory");
    assert_eq!(mem, pattern);
    let r = ok(&f, 0, ACCESS, &bar_read(0x0300, 2, 0x1000, 1024));
    assert_eq!(&r[..128], &pattern[..]);
    assert!(r[128..].iter().all(|&x| x == 0));
    let end = 1 << 20;
    assert_eq!(
        ok(&f, 0, ACCESS, &bar_read(0x0300, 2, end - 8, 8)).len(),
        1024
    );
    assert_eq!(
        refused(&f, 0, ACCESS, &bar_read(0x0300, 2, end, 8)),
        ERR_PARAM_INVALID,
        "past BAR2"
    );
    let too_long = bar_write(0x0300, 2, 0, &[1; 129]);
    assert_eq!(refused(&f, 0, ACCESS, &too_long), ERR_PARAM_INVALID);

    // Closed again: nothing gets through.
    ok(&f, 0, TUNNEL, &tunnel(1, 0x0300));
    assert_eq!(
        refused(&f, 0, ACCESS, &bar_read(0x0300, 2, 0x1000, 4)),
        ERR_BAD_FW_STATE
    );
    assert_eq!(
        &ok(&f, 0, TUNNEL, &tunnel(2, 0x0300))[..8],
        [4, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn the_holder_uses_its_tunnel_until_the_unbind() {
    let f = fabric();
    let dev = Arc::clone(f.function_dev(0x0400).expect("fn 0x0400"));
    assert_eq!(
        refused(&f, 1, TUNNEL, &tunnel(0, 0x0300)),
        ERR_MRPC_DENIED,
        "not h1's"
    );
    ok(&f, 1, TUNNEL, &tunnel(0, 0x0400));
    ok(&f, 1, ACCESS, &bar_write(0x0400, 2, 0, &[0xa5; 64]));
    assert_eq!(
        &ok(&f, 0, ACCESS, &bar_read(0x0400, 2, 0, 4))[..4],
        [0xa5; 4],
        "the manager"
    );
    assert_eq!(
        refused(&f, 1, ACCESS, &csr_read(0x0300, 0, 4)),
        ERR_MRPC_DENIED
    );

    // An access checked under the model lock, then the tunnel closes before
    // the worker gets to it: the second check, under the copy gate, holds it.
    let acc = EpAccess {
        pdfid: 0x0400,
        access: Access::BarWrite {
            bar: 2,
            addr: 0,
            data: vec![0x11; 8],
        },
    };
    assert_eq!(ep::check(&f.model(), 1, &acc), Ok(()));
    ok(&f, 1, TUNNEL, &tunnel(1, 0x0400));
    assert_eq!(ep::perform(&f.p2p, 1, &acc), Err(ERR_BAD_FW_STATE));
    ok(&f, 1, TUNNEL, &tunnel(0, 0x0400));
    assert_eq!(ep::perform(&f.p2p, 1, &acc), Ok(Vec::new()));
    let mut b = [0u8; 9];
    dev.mem_read(0, &mut b).expect("memory");
    assert_eq!(b, [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0xa5]);

    // The unbind (bound in the model only: no QEMU involved) closes the
    // tunnel and scrubs; h1 no longer holds the function.
    let r = handle("unbind 0x0400", &f);
    assert!(r.starts_with("{\"ok\":true"), "{r}");
    dev.mem_read(0, &mut b).expect("memory");
    assert_eq!(b, [0; 9], "scrubbed");
    assert_eq!(
        &ok(&f, 0, TUNNEL, &tunnel(2, 0x0400))[..8],
        [4, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        refused(&f, 1, ACCESS, &bar_read(0x0400, 2, 0, 4)),
        ERR_MRPC_DENIED
    );
    assert_eq!(
        refused(&f, 0, ACCESS, &bar_read(0x0400, 2, 0, 4)),
        ERR_BAD_FW_STATE
    );
    assert_eq!(ep::perform(&f.p2p, 1, &acc), Err(ERR_MRPC_DENIED));
}

/// Random requests from every host, each run as the worker runs it (checked
/// under the model lock, then carried out on the function): every answer
/// is DONE or ERROR, nothing panics or deadlocks, and a DONE has the
/// output its request calls for.
#[test]
fn hostile_requests_on_real_functions() {
    use crate::ep::tests::{hostile_input, rng};
    use crate::mrpc::{Exec, MrpcOutcome};
    let f = Fabric::new(Config::parse(CFG).expect("config"));
    let mut next = rng(0x0123_4567_89ab_cdef);
    let (mut done, mut performed) = (0, 0);
    for i in 0..12_000 {
        let cmd = if i % 3 == 0 { TUNNEL } else { ACCESS };
        let input = hostile_input(&mut next, cmd);
        let host = (next() % 3) as usize;
        let (mut r, acc) = {
            let mut m = f.model();
            let mut x = Exec {
                model: &mut m,
                partition: host,
                bad_length: false,
                notices: Vec::new(),
                deferred: None,
                ep_access: None,
            };
            let r = x.run(cmd, &input);
            (r, x.ep_access)
        };
        if let Some(acc) = acc {
            r = match ep::perform(&f.p2p, host, &acc) {
                Ok(out) => MrpcOutcome::done(out),
                Err(ret) => MrpcOutcome::error(ret),
            };
            let want = match &acc.access {
                Access::CsrRead { .. } => 4,
                Access::BarRead { len, .. } => *len,
                Access::CsrWrite { .. } | Access::BarWrite { .. } => 0,
            };
            assert_eq!(
                (r.status, r.output.len()),
                (MRPC_STATUS_DONE, want),
                "{acc:?}"
            );
            performed += 1;
        }
        assert!(r.status == MRPC_STATUS_DONE || r.status == MRPC_STATUS_ERROR);
        done += usize::from(r.status == MRPC_STATUS_DONE);
    }
    assert!(
        performed > 60 && done > performed,
        "{performed} accesses, {done} DONE"
    );
}
