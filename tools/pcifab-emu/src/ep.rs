// SPDX-License-Identifier: GPL-2.0-only
//! The EP management tunnel (EP_TUNNEL_CFG, MRPC 0x8F) and the accesses
//! through it to an endpoint function's config space and BARs
//! (EP_RESOURCE_ACCESS, MRPC 0x8E), in the layouts switchtec-user's fabric
//! library sends (Documentation/emulator.rst, "EP tunnel and resource
//! access").
//!
//! The tunnel is a flag per function (`Function::tunnel`). An access is
//! checked twice: by the MEP's firmware worker under the model lock
//! (`parse`, `check`, from `mrpc::Exec`), then by `perform`, which the
//! worker calls without the model lock (a function's BAR0 read takes that
//! lock itself), under the read side of the copy gate, right before it
//! touches the function. An unbind closes the tunnel under the model lock
//! before it waits for the gate and scrubs, so no access lands in memory
//! that was already scrubbed.

use crate::function::{REGION_BAR0, REGION_BAR2, REGION_BAR4, REGION_CONFIG};
use crate::model::{Function, Model, Op, ERR_BIND_IN_PROGRESS};
use crate::mrpc::{
    ERR_MRPC_DENIED, ERR_PARAM_INVALID, ERR_PHYC_PORT_NOT_EXIST, ERR_SUBCMD_INVALID, PAYLOAD,
};
use crate::p2p::Shared;
use crate::pci;
use crate::vfio_user::Device;

/// EP_TUNNEL_CFG sub-commands (switchtec-user's mrpc.h).
pub const TUNNEL_ENABLE: u16 = 0;
pub const TUNNEL_DISABLE: u16 = 1;
pub const TUNNEL_STATUS: u16 = 2;
/// STATUS values (fabric.h's `enum switchtec_ep_tunnel_status`).
pub const TUNNEL_DISABLED: u32 = 0;
pub const TUNNEL_ENABLED: u32 = 1;
/// EP_TUNNEL_CFG input header: `{u16 subcmd, u16 pdfid, u16
/// expected_rsp_len, u16 meta_data_len}`, the meta data after it.
pub const TUNNEL_HDR: usize = 8;

/// EP_RESOURCE_ACCESS sub-commands (lib/fabric.c's requests).
pub const CSR_READ: u8 = 0;
pub const CSR_WRITE: u8 = 1;
pub const BAR_READ: u8 = 2;
pub const BAR_WRITE: u8 = 3;
/// CSR request: `{u8 subcmd, u8 rsvd, u16 pdfid, u16 addr, u8 bytes, u8
/// rsvd}`, a write's `u32 data` after it.
pub const CSR_HDR: usize = 8;
/// BAR request: `{u8 subcmd, u8 rsvd, u16 pdfid, u8 bar, u8 rsvd, u16
/// bytes, u32 addr_low, u32 addr_high}`, a write's data after it.
pub const BAR_HDR: usize = 16;
/// fabric.h's SWITCHTEC_EP_CSR_MAX_READ_LEN / _WRITE_LEN.
pub const CSR_MAX: usize = 4;
/// fabric.h's SWITCHTEC_EP_BAR_MAX_READ_LEN (the MRPC payload).
pub const BAR_READ_MAX: usize = PAYLOAD;
/// fabric.h's SWITCHTEC_EP_BAR_MAX_WRITE_LEN.
pub const BAR_WRITE_MAX: usize = 128;

/// errors.h: the command cannot run in the firmware's present state (here:
/// the function's tunnel is not enabled).
pub const ERR_BAD_FW_STATE: u32 = 0x64007;
/// errors.h: the physical port is disabled (here: the endpoint's link is down).
pub const ERR_PHYC_PORT_DIS: u32 = 0x5;

/// One access of an EP_RESOURCE_ACCESS request, its sizes checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Access {
    CsrRead { addr: u16, len: usize },
    CsrWrite { addr: u16, data: Vec<u8> },
    BarRead { bar: u8, addr: u64, len: usize },
    BarWrite { bar: u8, addr: u64, data: Vec<u8> },
}

/// A parsed EP_RESOURCE_ACCESS request.
#[derive(Debug, Clone, PartialEq)]
pub struct EpAccess {
    pub pdfid: u16,
    pub access: Access,
}

fn le16(b: &[u8], at: usize) -> Result<u16, u32> {
    match b.get(at..at + 2) {
        Some(x) => Ok(u16::from_le_bytes([x[0], x[1]])),
        None => Err(ERR_PARAM_INVALID),
    }
}

fn le32(b: &[u8], at: usize) -> Result<u32, u32> {
    match b.get(at..at + 4) {
        Some(x) => Ok(u32::from_le_bytes([x[0], x[1], x[2], x[3]])),
        None => Err(ERR_PARAM_INVALID),
    }
}

/// The host of `partition` may open, close and use `f`'s tunnel: it holds
/// `f`, or it is a fabric manager (pcifab's policy, as for binds).
fn may_manage(m: &Model, partition: usize, f: &Function) -> bool {
    m.hosts.get(partition).is_some_and(|h| h.manager) || f.binding.is_some_and(|b| b.0 == partition)
}

/// Size of BAR `bar` of `f`; 0 when it has none (the upper halves 1, 3, 5
/// of the 64-bit BARs, BAR4 while functions have no MSI-X, BAR2 of a
/// function without device memory, anything past 5).
pub fn bar_size(f: &Function, bar: u8) -> u64 {
    match u32::from(bar) {
        REGION_BAR0 => pci::FN_BAR0_SIZE,
        REGION_BAR2 => f.bar2,
        REGION_BAR4 if pci::FN_MSIX => pci::FN_BAR4_SIZE,
        _ => 0,
    }
}

/// EP_TUNNEL_CFG from the host of `partition`: ENABLE and DISABLE answer
/// `{u32 len 0}`, STATUS `{u32 len 4, u32 status}`.
pub fn tunnel_cfg(m: &mut Model, partition: usize, input: &[u8]) -> Result<Vec<u8>, u32> {
    if input.len() < TUNNEL_HDR {
        return Err(ERR_PARAM_INVALID);
    }
    let sub = le16(input, 0)?;
    let pdfid = le16(input, 2)?;
    let meta = usize::from(le16(input, 6)?);
    // Some(state) to set, None for STATUS.
    let set = match sub {
        TUNNEL_ENABLE => Some(true),
        TUNNEL_DISABLE => Some(false),
        TUNNEL_STATUS => None,
        _ => return Err(ERR_SUBCMD_INVALID),
    };
    // The meta data (none for these sub-commands) must lie in the input.
    if TUNNEL_HDR + meta > input.len() {
        return Err(ERR_PARAM_INVALID);
    }
    let f = m.function(pdfid).ok_or(ERR_PHYC_PORT_NOT_EXIST)?;
    let Some(open) = set else {
        let st = if f.tunnel {
            TUNNEL_ENABLED
        } else {
            TUNNEL_DISABLED
        };
        return Ok([4u32.to_le_bytes(), st.to_le_bytes()].concat());
    };
    if !may_manage(m, partition, f) {
        return Err(ERR_MRPC_DENIED);
    }
    if open && f.op == Some(Op::Unbind) {
        // Leaving its owner: the unbind closed the tunnel and keeps it shut.
        return Err(ERR_BIND_IN_PROGRESS);
    }
    if let Some(f) = m.functions.iter_mut().find(|f| f.pdfid == pdfid) {
        f.tunnel = open;
    }
    Ok(0u32.to_le_bytes().to_vec())
}

/// Parse an EP_RESOURCE_ACCESS request: its sub-command, its lengths and
/// the sizes fabric.h allows. What depends on the function is `check`'s.
pub fn parse(input: &[u8]) -> Result<EpAccess, u32> {
    let sub = *input.first().ok_or(ERR_PARAM_INVALID)?;
    match sub {
        CSR_READ | CSR_WRITE => {
            if input.len() < CSR_HDR {
                return Err(ERR_PARAM_INVALID);
            }
            let pdfid = le16(input, 2)?;
            let addr = le16(input, 4)?;
            let len = usize::from(input[6]);
            // One configuration request carries one dword: the bytes stay
            // inside the dword of `addr`, inside the 4 KiB config space.
            if len == 0
                || len > CSR_MAX
                || usize::from(addr) % 4 + len > 4
                || usize::from(addr) >= pci::CONFIG_SIZE
            {
                return Err(ERR_PARAM_INVALID);
            }
            let access = if sub == CSR_READ {
                Access::CsrRead { addr, len }
            } else {
                let data = input.get(CSR_HDR..CSR_HDR + len).ok_or(ERR_PARAM_INVALID)?;
                Access::CsrWrite {
                    addr,
                    data: data.to_vec(),
                }
            };
            Ok(EpAccess { pdfid, access })
        }
        BAR_READ | BAR_WRITE => {
            if input.len() < BAR_HDR {
                return Err(ERR_PARAM_INVALID);
            }
            let pdfid = le16(input, 2)?;
            let bar = input[4];
            let len = usize::from(le16(input, 6)?);
            let addr = u64::from(le32(input, 8)?) | u64::from(le32(input, 12)?) << 32;
            let max = if sub == BAR_READ {
                BAR_READ_MAX
            } else {
                BAR_WRITE_MAX
            };
            if len == 0 || len > max {
                return Err(ERR_PARAM_INVALID);
            }
            let access = if sub == BAR_READ {
                Access::BarRead { bar, addr, len }
            } else {
                let data = input.get(BAR_HDR..BAR_HDR + len).ok_or(ERR_PARAM_INVALID)?;
                Access::BarWrite {
                    bar,
                    addr,
                    data: data.to_vec(),
                }
            };
            Ok(EpAccess { pdfid, access })
        }
        _ => Err(ERR_SUBCMD_INVALID),
    }
}

/// May the host of `partition` carry out `acc` now? In order: the function
/// exists, the host may manage it, the emulator holds its device (not nvme),
/// the BAR exists and holds the range, the tunnel is enabled, the link is up.
pub fn check(m: &Model, partition: usize, acc: &EpAccess) -> Result<(), u32> {
    let f = m.function(acc.pdfid).ok_or(ERR_PHYC_PORT_NOT_EXIST)?;
    if !may_manage(m, partition, f) {
        return Err(ERR_MRPC_DENIED);
    }
    if f.nvme {
        return Err(ERR_PARAM_INVALID);
    }
    let bar_range = match &acc.access {
        Access::BarRead { bar, addr, len } => Some((*bar, *addr, *len)),
        Access::BarWrite { bar, addr, data } => Some((*bar, *addr, data.len())),
        Access::CsrRead { .. } | Access::CsrWrite { .. } => None,
    };
    if let Some((bar, addr, len)) = bar_range {
        let size = bar_size(f, bar);
        if addr.checked_add(len as u64).is_none_or(|end| end > size) {
            return Err(ERR_PARAM_INVALID);
        }
    }
    if !f.tunnel {
        return Err(ERR_BAD_FW_STATE);
    }
    if !m.link_up(f.port) {
        return Err(ERR_PHYC_PORT_DIS);
    }
    Ok(())
}

/// Carry out a request `check` let through, for the host of `partition`:
/// check it again under the copy gate, then read or write the function.
/// Call without the model lock. CSR read: `{u32 data}`, the bytes read
/// first, the rest 0; BAR read: the bytes; writes: no output.
pub fn perform(sh: &Shared, partition: usize, acc: &EpAccess) -> Result<Vec<u8>, u32> {
    let _access = sh.enter();
    check(&sh.model(), partition, acc)?;
    let dev = sh.function(acc.pdfid).ok_or(ERR_PHYC_PORT_NOT_EXIST)?;
    // After the checks the device refuses nothing; if it did, the request
    // was out of range after all.
    let refused = |_| ERR_PARAM_INVALID;
    match &acc.access {
        Access::CsrRead { addr, len } => {
            let mut out = vec![0u8; CSR_MAX];
            dev.region_read(REGION_CONFIG, u64::from(*addr), &mut out[..*len])
                .map_err(refused)?;
            Ok(out)
        }
        Access::CsrWrite { addr, data } => {
            dev.region_write(REGION_CONFIG, u64::from(*addr), data)
                .map_err(refused)?;
            Ok(Vec::new())
        }
        Access::BarRead { bar, addr, len } => {
            let mut out = vec![0u8; *len];
            dev.region_read(u32::from(*bar), *addr, &mut out)
                .map_err(refused)?;
            Ok(out)
        }
        Access::BarWrite { bar, addr, data } => {
            dev.region_write(u32::from(*bar), *addr, data)
                .map_err(refused)?;
            Ok(Vec::new())
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{Config, Dialect};
    use crate::gas::{MRPC_STATUS_DONE, MRPC_STATUS_ERROR};
    use crate::model::Requester;
    use crate::mrpc::{Exec, MrpcOutcome, MRPC_EP_RESOURCE_ACCESS, MRPC_EP_TUNNEL_CFG};

    // h0 is the manager; h1 holds gpu0's VF 1 (0x0301) on logical port 0;
    // nvme0 (port 20) is free.
    const CFG: &str = "[policy]\nmanager = \"h0\"\n\
        [[hosts]]\nname = \"h0\"\n[[hosts]]\nname = \"h1\"\nusp_port = 8\n\
        [[endpoints]]\nname = \"gpu0\"\nport = 16\nvendor_id = 0x10de\ndevice_id = 0x2330\n\
        class = 0x030200\nvfs = 2\nmem_mib = 2\nvf_mem_mib = 1\n\
        [[endpoints]]\nname = \"nvme0\"\nport = 20\nkind = \"nvme\"\n\
        [[bindings]]\nendpoint = \"gpu0\"\nvf = 1\nhost = \"h1\"\nlogical_port = 0\n";

    fn model(dialect: Dialect) -> Model {
        let mut cfg = Config::parse(CFG).expect("config");
        cfg.dialect = dialect;
        Model::new(&cfg)
    }

    fn exec(m: &mut Model, host: usize, cmd: u32, input: &[u8]) -> (MrpcOutcome, Option<EpAccess>) {
        let mut x = Exec {
            model: m,
            partition: host,
            bad_length: false,
            notices: Vec::new(),
            deferred: None,
            ep_access: None,
        };
        let r = x.run(cmd, input);
        (r, x.ep_access)
    }

    /// EP_TUNNEL_CFG input as switchtec_ep_tunnel_config() builds it.
    fn tunnel(sub: u16, pdfid: u16) -> Vec<u8> {
        let rsp_len: u16 = if sub == TUNNEL_STATUS { 4 } else { 0 };
        [sub, pdfid, rsp_len, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    fn tunnel_ret(m: &mut Model, host: usize, input: &[u8]) -> (u32, Vec<u8>) {
        let (r, _) = exec(m, host, MRPC_EP_TUNNEL_CFG, input);
        (r.ret, r.output)
    }

    /// The CSR request of ep_csr_read / ep_csr_write (8 or 12 bytes).
    fn csr(sub: u8, pdfid: u16, addr: u16, bytes: u8, data: u32) -> Vec<u8> {
        let mut v = vec![sub, 0];
        v.extend_from_slice(&pdfid.to_le_bytes());
        v.extend_from_slice(&addr.to_le_bytes());
        v.extend_from_slice(&[bytes, 0]);
        if sub == CSR_WRITE {
            v.extend_from_slice(&data.to_le_bytes());
        }
        v
    }

    /// The BAR request of ep_bar_read (16 bytes) / ep_bar_write (16 + 512).
    fn bar(sub: u8, pdfid: u16, bar: u8, addr: u64, bytes: u16, data: &[u8]) -> Vec<u8> {
        let mut v = vec![sub, 0];
        v.extend_from_slice(&pdfid.to_le_bytes());
        v.extend_from_slice(&[bar, 0]);
        v.extend_from_slice(&bytes.to_le_bytes());
        v.extend_from_slice(&(addr as u32).to_le_bytes());
        v.extend_from_slice(&((addr >> 32) as u32).to_le_bytes());
        if sub == BAR_WRITE {
            let mut d = data.to_vec();
            d.resize(512, 0);
            v.extend_from_slice(&d);
        }
        v
    }

    fn enabled(m: &Model, pdfid: u16) -> bool {
        m.function(pdfid).is_some_and(|f| f.tunnel)
    }

    #[test]
    fn tunnel_enable_disable_status_in_both_dialects() {
        for d in [Dialect::Pax, Dialect::Extended] {
            let mut m = model(d);
            let status = |m: &mut Model, host| tunnel_ret(m, host, &tunnel(TUNNEL_STATUS, 0x0300));
            // {u32 len, u8 data[]}: STATUS carries one u32.
            assert_eq!(status(&mut m, 0), (0, vec![4, 0, 0, 0, 0, 0, 0, 0]));
            assert_eq!(
                tunnel_ret(&mut m, 0, &tunnel(TUNNEL_ENABLE, 0x0300)),
                (0, vec![0; 4])
            );
            assert!(enabled(&m, 0x0300));
            assert_eq!(status(&mut m, 0), (0, vec![4, 0, 0, 0, 1, 0, 0, 0]));
            assert_eq!(
                status(&mut m, 1).1,
                [4, 0, 0, 0, 1, 0, 0, 0],
                "anyone may ask"
            );
            assert_eq!(
                tunnel_ret(&mut m, 0, &tunnel(TUNNEL_ENABLE, 0x0300)).0,
                0,
                "idempotent"
            );
            assert_eq!(
                tunnel_ret(&mut m, 0, &tunnel(TUNNEL_DISABLE, 0x0300)),
                (0, vec![0; 4])
            );
            assert!(!enabled(&m, 0x0300));
            // The holder manages its own function's tunnel; a tunnel is per function.
            assert_eq!(tunnel_ret(&mut m, 1, &tunnel(TUNNEL_ENABLE, 0x0301)).0, 0);
            assert!(enabled(&m, 0x0301) && !enabled(&m, 0x0300) && !enabled(&m, 0x0302));
            // Meta data is allowed (and ignored) when it lies in the input.
            let mut with_meta = tunnel(TUNNEL_DISABLE, 0x0301);
            with_meta[6] = 3;
            with_meta.extend_from_slice(&[1, 2, 3]);
            assert_eq!(tunnel_ret(&mut m, 1, &with_meta).0, 0);
            assert!(!enabled(&m, 0x0301));
            // An nvme function has a tunnel flag too (its accesses are refused).
            assert_eq!(tunnel_ret(&mut m, 0, &tunnel(TUNNEL_ENABLE, 0x0380)).0, 0);
        }
    }

    #[test]
    fn tunnel_refusals() {
        let mut m = model(Dialect::Pax);
        let mut meta_past_end = tunnel(TUNNEL_ENABLE, 0x0300);
        meta_past_end[6] = 1;
        let mut bad_sub = tunnel(TUNNEL_ENABLE, 0x0300);
        bad_sub[0] = 3;
        let mut bad_sub_hi = tunnel(TUNNEL_ENABLE, 0x0300);
        bad_sub_hi[1] = 1;
        for (host, input, ret) in [
            (0, vec![], ERR_PARAM_INVALID),
            (
                0,
                tunnel(TUNNEL_ENABLE, 0x0300)[..7].to_vec(),
                ERR_PARAM_INVALID,
            ),
            (0, bad_sub, ERR_SUBCMD_INVALID),
            (0, bad_sub_hi, ERR_SUBCMD_INVALID),
            (0, meta_past_end, ERR_PARAM_INVALID),
            (0, tunnel(TUNNEL_ENABLE, 0x0999), ERR_PHYC_PORT_NOT_EXIST),
            (0, tunnel(TUNNEL_STATUS, 0xffff), ERR_PHYC_PORT_NOT_EXIST),
            // A host function id (h0's HFID) is no endpoint function.
            (0, tunnel(TUNNEL_ENABLE, 0x0800), ERR_PHYC_PORT_NOT_EXIST),
            // h1 is no manager and does not hold 0x0300 (free) or 0x0302.
            (1, tunnel(TUNNEL_ENABLE, 0x0300), ERR_MRPC_DENIED),
            (1, tunnel(TUNNEL_DISABLE, 0x0302), ERR_MRPC_DENIED),
            (5, tunnel(TUNNEL_ENABLE, 0x0300), ERR_MRPC_DENIED),
        ] {
            let (r, _) = exec(&mut m, host, MRPC_EP_TUNNEL_CFG, &input);
            assert_eq!(
                (r.status, r.ret),
                (MRPC_STATUS_ERROR, ret),
                "h{host} {input:?}"
            );
            assert!(r.output.is_empty());
        }
        assert!(m.functions.iter().all(|f| !f.tunnel), "nothing changed");
    }

    #[test]
    fn an_unbind_closes_the_tunnel_and_keeps_it_shut() {
        let mut m = model(Dialect::Extended);
        assert_eq!(tunnel_ret(&mut m, 1, &tunnel(TUNNEL_ENABLE, 0x0301)).0, 0);
        let reqs = m
            .begin_unbind_port(Requester::Host(1), 1, 0)
            .expect("h1 unbinds its own");
        assert!(!enabled(&m, 0x0301), "closed when the unbind begins");
        for host in [0, 1] {
            let r = tunnel_ret(&mut m, host, &tunnel(TUNNEL_ENABLE, 0x0301)).0;
            assert_eq!(r, ERR_BIND_IN_PROGRESS);
        }
        assert_eq!(tunnel_ret(&mut m, 1, &tunnel(TUNNEL_DISABLE, 0x0301)).0, 0);
        // The unbind failed: the function stays h1's, the tunnel closed but free to open.
        m.finish(&reqs[0], false, false);
        assert_eq!(tunnel_ret(&mut m, 1, &tunnel(TUNNEL_ENABLE, 0x0301)).0, 0);
        // It succeeds: h1 lost the function and with it the right to its tunnel.
        let reqs = m
            .begin_unbind_port(Requester::Host(1), 1, 0)
            .expect("again");
        m.finish(&reqs[0], true, false);
        assert_eq!(
            tunnel_ret(&mut m, 1, &tunnel(TUNNEL_ENABLE, 0x0301)).0,
            ERR_MRPC_DENIED
        );
        assert_eq!(
            tunnel_ret(&mut m, 0, &tunnel(TUNNEL_ENABLE, 0x0301)).0,
            0,
            "the manager"
        );
    }

    #[test]
    fn resource_access_layouts_parse_as_the_library_sends_them() {
        assert_eq!(
            parse(&csr(CSR_READ, 0x0301, 0x0e, 2, 0)),
            Ok(EpAccess {
                pdfid: 0x0301,
                access: Access::CsrRead { addr: 0x0e, len: 2 }
            })
        );
        assert_eq!(
            parse(&csr(CSR_WRITE, 0x0300, 0x3c, 1, 0x1234_56aa)),
            Ok(EpAccess {
                pdfid: 0x0300,
                access: Access::CsrWrite {
                    addr: 0x3c,
                    data: vec![0xaa]
                }
            })
        );
        assert_eq!(
            parse(&bar(BAR_READ, 0x0300, 2, 0x1_0000_0010, 1024, &[])),
            Ok(EpAccess {
                pdfid: 0x0300,
                access: Access::BarRead {
                    bar: 2,
                    addr: 0x1_0000_0010,
                    len: 1024
                }
            })
        );
        let w = bar(BAR_WRITE, 0x0302, 0, 0x100, 8, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(w.len(), 16 + 512, "sizeof(struct ep_bar_write)");
        assert_eq!(
            parse(&w),
            Ok(EpAccess {
                pdfid: 0x0302,
                access: Access::BarWrite {
                    bar: 0,
                    addr: 0x100,
                    data: vec![1, 2, 3, 4, 5, 6, 7, 8]
                }
            })
        );
        // Only the data the request names need be there.
        assert!(parse(&w[..24]).is_ok());
    }

    #[test]
    fn resource_access_refusals() {
        let mut m = model(Dialect::Pax);
        for p in [0x0300, 0x0302, 0x0380] {
            assert_eq!(tunnel_ret(&mut m, 0, &tunnel(TUNNEL_ENABLE, p)).0, 0);
        }
        let mut csr_read_long = csr(CSR_READ, 0x0300, 0, 4, 0);
        csr_read_long.resize(64, 0x5a);
        let bar_end = 2 << 20; // gpu0's PF BAR2: 2 MiB
        for (host, input, ret) in [
            (0, vec![], ERR_PARAM_INVALID),
            (0, vec![4, 0, 0, 3, 0, 0, 4, 0], ERR_SUBCMD_INVALID),
            (0, vec![0xff], ERR_SUBCMD_INVALID),
            // Short requests.
            (
                0,
                csr(CSR_READ, 0x0300, 0, 4, 0)[..7].to_vec(),
                ERR_PARAM_INVALID,
            ),
            (
                0,
                csr(CSR_WRITE, 0x0300, 0, 4, 0)[..11].to_vec(),
                ERR_PARAM_INVALID,
            ),
            (
                0,
                csr(CSR_WRITE, 0x0300, 0, 4, 0)[..8].to_vec(),
                ERR_PARAM_INVALID,
            ),
            (
                0,
                bar(BAR_READ, 0x0300, 0, 0, 4, &[])[..15].to_vec(),
                ERR_PARAM_INVALID,
            ),
            (
                0,
                bar(BAR_WRITE, 0x0300, 0, 0, 8, &[])[..23].to_vec(),
                ERR_PARAM_INVALID,
            ),
            // CSR sizes: 1-4 bytes inside one dword of the 4 KiB space.
            (0, csr(CSR_READ, 0x0300, 0, 0, 0), ERR_PARAM_INVALID),
            (0, csr(CSR_READ, 0x0300, 0, 5, 0), ERR_PARAM_INVALID),
            (0, csr(CSR_READ, 0x0300, 2, 4, 0), ERR_PARAM_INVALID),
            (0, csr(CSR_WRITE, 0x0300, 3, 2, 0), ERR_PARAM_INVALID),
            (0, csr(CSR_READ, 0x0300, 0x1000, 4, 0), ERR_PARAM_INVALID),
            (0, csr(CSR_READ, 0x0300, 0xfffc, 4, 0), ERR_PARAM_INVALID),
            // BAR sizes: 1-1024 bytes read, 1-128 written.
            (0, bar(BAR_READ, 0x0300, 0, 0, 0, &[]), ERR_PARAM_INVALID),
            (0, bar(BAR_READ, 0x0300, 2, 0, 1025, &[]), ERR_PARAM_INVALID),
            (0, bar(BAR_WRITE, 0x0300, 2, 0, 0, &[]), ERR_PARAM_INVALID),
            (0, bar(BAR_WRITE, 0x0300, 2, 0, 129, &[]), ERR_PARAM_INVALID),
            // The function.
            (0, csr(CSR_READ, 0x0999, 0, 4, 0), ERR_PHYC_PORT_NOT_EXIST),
            (
                0,
                bar(BAR_READ, 0x0800, 0, 0, 4, &[]),
                ERR_PHYC_PORT_NOT_EXIST,
            ),
            (1, csr(CSR_READ, 0x0300, 0, 4, 0), ERR_MRPC_DENIED),
            (1, bar(BAR_WRITE, 0x0302, 2, 0, 4, &[1; 4]), ERR_MRPC_DENIED),
            (0, csr(CSR_READ, 0x0380, 0, 4, 0), ERR_PARAM_INVALID),
            (0, bar(BAR_READ, 0x0380, 0, 0, 4, &[]), ERR_PARAM_INVALID),
            // BARs: 0 (16 KiB) and 2 only; the range inside the BAR.
            (0, bar(BAR_READ, 0x0300, 1, 0, 4, &[]), ERR_PARAM_INVALID),
            (0, bar(BAR_READ, 0x0300, 3, 0, 4, &[]), ERR_PARAM_INVALID),
            (0, bar(BAR_READ, 0x0300, 4, 0, 4, &[]), ERR_PARAM_INVALID),
            (0, bar(BAR_READ, 0x0300, 5, 0, 4, &[]), ERR_PARAM_INVALID),
            (0, bar(BAR_READ, 0x0300, 6, 0, 4, &[]), ERR_PARAM_INVALID),
            (0, bar(BAR_READ, 0x0300, 0xff, 0, 4, &[]), ERR_PARAM_INVALID),
            (
                0,
                bar(BAR_READ, 0x0300, 0, 0x3ffd, 4, &[]),
                ERR_PARAM_INVALID,
            ),
            (
                0,
                bar(BAR_READ, 0x0300, 2, bar_end - 1023, 1024, &[]),
                ERR_PARAM_INVALID,
            ),
            (
                0,
                bar(BAR_WRITE, 0x0300, 2, bar_end, 1, &[1]),
                ERR_PARAM_INVALID,
            ),
            (
                0,
                bar(BAR_READ, 0x0300, 2, u64::MAX - 1, 4, &[]),
                ERR_PARAM_INVALID,
            ),
            (
                0,
                bar(BAR_READ, 0x0302, 2, 1 << 20, 4, &[]),
                ERR_PARAM_INVALID,
            ),
            // The tunnel: 0x0301 (h1's) is closed.
            (0, csr(CSR_READ, 0x0301, 0, 4, 0), ERR_BAD_FW_STATE),
            (1, bar(BAR_READ, 0x0301, 0, 0, 4, &[]), ERR_BAD_FW_STATE),
        ] {
            let (r, acc) = exec(&mut m, host, MRPC_EP_RESOURCE_ACCESS, &input);
            assert_eq!(
                (r.status, r.ret),
                (MRPC_STATUS_ERROR, ret),
                "h{host} {input:?}"
            );
            assert_eq!(acc, None, "nothing to carry out");
        }
        // The endpoint's link is down.
        m.set_link(16, false).expect("port 16");
        let (r, _) = exec(
            &mut m,
            0,
            MRPC_EP_RESOURCE_ACCESS,
            &csr(CSR_READ, 0x0300, 0, 4, 0),
        );
        assert_eq!(r.ret, ERR_PHYC_PORT_DIS);
        m.set_link(16, true).expect("port 16");
        // Extra input bytes are ignored.
        let (r, acc) = exec(&mut m, 0, MRPC_EP_RESOURCE_ACCESS, &csr_read_long);
        assert_eq!((r.status, acc.is_some()), (MRPC_STATUS_DONE, true));
    }

    #[test]
    fn a_checked_access_is_left_to_the_worker() {
        let mut m = model(Dialect::Pax);
        assert_eq!(tunnel_ret(&mut m, 1, &tunnel(TUNNEL_ENABLE, 0x0301)).0, 0);
        let input = bar(BAR_READ, 0x0301, 2, (1 << 20) - 8, 8, &[]);
        let (r, acc) = exec(&mut m, 1, MRPC_EP_RESOURCE_ACCESS, &input);
        assert_eq!((r.status, r.ret), (MRPC_STATUS_DONE, 0));
        assert!(r.output.is_empty(), "the worker fills it in");
        assert_eq!(
            acc,
            Some(EpAccess {
                pdfid: 0x0301,
                access: Access::BarRead {
                    bar: 2,
                    addr: (1 << 20) - 8,
                    len: 8
                }
            })
        );
        // The manager may use any function's open tunnel, bound or not.
        let (r, acc) = exec(
            &mut m,
            0,
            MRPC_EP_RESOURCE_ACCESS,
            &csr(CSR_WRITE, 0x0301, 4, 2, 6),
        );
        assert_eq!(
            (r.ret, acc.map(|a| a.access)),
            (
                0,
                Some(Access::CsrWrite {
                    addr: 4,
                    data: vec![6, 0]
                })
            )
        );
    }

    /// A xorshift generator for the random inputs below.
    pub(crate) fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// A random input for EP_TUNNEL_CFG or EP_RESOURCE_ACCESS: random bytes of
    /// random length, three times in four shaped near a valid request (a
    /// sub-command near the valid ones, a PDFID of the fabric of CFG or one
    /// near it, small sizes, addresses around the BARs and config space).
    pub(crate) fn hostile_input(next: &mut impl FnMut() -> u64, cmd: u32) -> Vec<u8> {
        let pdfids = [
            0x0300u16, 0x0301, 0x0302, 0x0380, 0x0400, 0x0800, 0x0999, 0, 0xffff,
        ];
        let len = (next() % 1100) as usize;
        let mut input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if next() % 4 == 0 || input.len() < 8 {
            return input;
        }
        let p = pdfids[(next() % pdfids.len() as u64) as usize];
        input[2..4].copy_from_slice(&p.to_le_bytes());
        if cmd == MRPC_EP_TUNNEL_CFG {
            input[0..2].copy_from_slice(&((next() % 4) as u16).to_le_bytes());
            input[6..8].copy_from_slice(&((next() % 16) as u16).to_le_bytes());
        } else {
            input[0] = (next() % 5) as u8;
            // CSR: the address's low byte; BAR: the BAR, mostly 0 or 2.
            input[4] = [0, 2, 0, 2, 1, 4, 5, 7][(next() % 8) as usize];
            input[5] = (next() % 20) as u8;
            input[6] = (next() % 6) as u8;
            if input.len() >= 16 {
                input[7] = u8::from(next() % 4 == 0);
                // Inside BAR0, around the end of a 1 MiB BAR2, anywhere in
                // 2 MiB, or anything.
                let addr = match next() % 4 {
                    _ if input[4] == 0 && next() % 4 != 0 => next() % 0x4000,
                    0 => next() % 0x4000,
                    1 => (1 << 20) - next() % 0x800,
                    2 => next() % (2 << 20),
                    _ => next(),
                };
                input[8..16].copy_from_slice(&addr.to_le_bytes());
            }
        }
        input
    }

    /// Random inputs for both commands from every host (and one past the
    /// last): each answer is DONE or ERROR, nothing panics, and every access
    /// left to the worker passed its check.
    #[test]
    fn hostile_inputs_never_panic() {
        let mut m = model(Dialect::Extended);
        let mut next = rng(0x9e37_79b9_7f4a_7c15);
        let mut passed = 0;
        for i in 0..20_000 {
            let cmd = if i % 2 == 0 {
                MRPC_EP_TUNNEL_CFG
            } else {
                MRPC_EP_RESOURCE_ACCESS
            };
            let input = hostile_input(&mut next, cmd);
            let host = (next() % 3) as usize;
            let (r, acc) = exec(&mut m, host, cmd, &input);
            assert!(r.status == MRPC_STATUS_DONE || r.status == MRPC_STATUS_ERROR);
            if let Some(a) = acc {
                assert_eq!(r.status, MRPC_STATUS_DONE);
                assert_eq!(check(&m, host, &a), Ok(()));
                passed += 1;
            }
        }
        assert!(passed > 60, "only {passed} accesses passed their checks");
    }
}
