// SPDX-License-Identifier: GPL-2.0-only

//! `P2P_ROUTE` (0xF004), pcifab's extension for the P2P window: routes from window ranges to
//! functions' memory, and grants that let another host route to a function
//! (`Documentation/mrpc.rst`). Present only when [`super::ext::P2P_ROUTES`] is.

use kernel::prelude::*;

use super::{call, call_raw, payload, read_at, Command, Failure, ERR_PARAM_INVALID};
use crate::{mrpc, Mep};

pub(super) const OPCODE: u32 = 0xf004;
const SUB_ADD: u8 = 1;
const SUB_DEL: u8 = 2;
const SUB_LIST: u8 = 3;
const SUB_GRANT: u8 = 4;
const SUB_REVOKE: u8 = 5;
const SUB_GRANT_LIST: u8 = 6;
/// Routes a MEP holds at most.
pub(crate) const MAX_ROUTES: usize = 16;

/// Return codes of `P2P_ROUTE`.
const FW_PDFID_UNKNOWN: u32 = 0xf0_0001;
const FW_RANGE: u32 = 0xf0_0002;
const FW_DENIED: u32 = 0xf0_0005;
const FW_NOT_BOUND: u32 = 0xf0_000a;
const FW_ROUTE_FULL: u32 = 0xf0_000b;
const FW_ROUTE_CONFLICT: u32 = 0xf0_000c;
const FW_NO_ROUTE: u32 = 0xf0_000d;
const FW_NOT_HOLDER: u32 = 0xf0_000e;
const FW_NO_GRANT: u32 = 0xf0_000f;
const FW_NOT_GRANTED: u32 = 0xf0_0010;
const FW_GRANT_FULL: u32 = 0xf0_0011;

payload! {
    /// Every sub-command's request: header (version 1, size 32), sub-command, function and
    /// three arguments (ADD: window offset, size, target offset; DEL: window offset; GRANT
    /// and REVOKE: the grantee host in the first).
    struct Req[32] {
        version: u16,
        size: u16,
        sub: u8,
        rsvd: u8,
        pdfid: u16,
        args: [u64; 3],
    }

    /// ADD, DEL, GRANT and REVOKE reply; lists start with it.
    struct ReplyHdr[8] {
        version: u16,
        size: u16,
        count: u16,
        entry: u16,
    }

    struct RouteEntry[32] {
        window_off: u64,
        size: u64,
        target_off: u64,
        pdfid: u16,
        target_host: u8,
        rsvd: [u8; 5],
    }

    struct GrantEntry[8] {
        pdfid: u16,
        holder: u8,
        grantee: u8,
        rsvd: u32,
    }
}

/// Whether a raw `P2P_ROUTE` request with `input` only reads (LIST, GRANT_LIST). Missing
/// bytes read as zero, as the firmware reads them.
pub(super) fn raw_reads(input: &[u8]) -> bool {
    let mut bytes = [0u8; core::mem::size_of::<Req>()];
    let n = input.len().min(bytes.len());
    bytes[..n].copy_from_slice(&input[..n]);
    read_at::<Req>(&bytes, 0).is_ok_and(|r| matches!(r.sub, SUB_LIST | SUB_GRANT_LIST))
}

impl Command for Req {
    const OPCODE: u32 = OPCODE;
    type Reply = ReplyHdr;

    fn errno(ret: u32) -> Error {
        match ret {
            ERR_PARAM_INVALID => EINVAL,
            FW_PDFID_UNKNOWN | FW_NO_ROUTE | FW_NO_GRANT => ENOENT,
            // Not this host's function to share, or not shared with this host.
            FW_NOT_HOLDER | FW_NOT_GRANTED | FW_DENIED => EACCES,
            FW_NOT_BOUND => ENOLINK,
            FW_RANGE => ERANGE,
            FW_ROUTE_CONFLICT => EEXIST,
            FW_ROUTE_FULL | FW_GRANT_FULL => ENOSPC,
            _ => EIO,
        }
    }
}

impl Req {
    fn new(sub: u8, pdfid: u16, args: [u64; 3]) -> Self {
        Self {
            version: 1,
            size: 32,
            sub,
            rsvd: 0,
            pdfid,
            args,
        }
    }
}

/// One route as the firmware lists it (not yet checked against the window).
#[derive(Clone, Copy)]
pub(crate) struct Route {
    pub(crate) window_off: u64,
    pub(crate) size: u64,
    pub(crate) target_off: u64,
    pub(crate) pdfid: u16,
    pub(crate) target_host: u8,
}

/// One grant: `holder` lets `grantee` route to `pdfid`.
#[derive(Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) pdfid: u16,
    pub(crate) holder: u8,
    pub(crate) grantee: u8,
}

/// Adds a route; returns the number of routes now.
pub(crate) fn add(mep: &Mep, r: &Route) -> Result<u32, Failure> {
    let req = Req::new(SUB_ADD, r.pdfid, [r.window_off, r.size, r.target_off]);
    Ok(u32::from(call(mep, &req)?.count))
}

/// Removes the route at `window_off`; returns the number of routes left.
pub(crate) fn del(mep: &Mep, window_off: u64) -> Result<u32, Failure> {
    Ok(u32::from(
        call(mep, &Req::new(SUB_DEL, 0, [window_off, 0, 0]))?.count,
    ))
}

/// Lets `grantee` route to `pdfid` (`grant`) or takes it back; returns the grants on `pdfid`.
pub(crate) fn grant(mep: &Mep, pdfid: u16, grantee: u8, grant: bool) -> Result<u32, Failure> {
    let sub = if grant { SUB_GRANT } else { SUB_REVOKE };
    Ok(u32::from(
        call(mep, &Req::new(sub, pdfid, [u64::from(grantee), 0, 0]))?.count,
    ))
}

/// Runs a list sub-command: the reply's entries, each at least `size_of::<T>()` bytes.
fn list<T: kernel::transmute::FromBytes>(
    mep: &Mep,
    sub: u8,
    out: &mut [u8],
    max: usize,
) -> Result<KVec<T>> {
    call_raw(mep, &Req::new(sub, 0, [0; 3]), out, 0).map_err(|f| f.err)?;
    let hdr: ReplyHdr = read_at(out, 0)?;
    let count = usize::from(hdr.count);
    let entry = usize::from(hdr.entry);
    // The reply must hold the entries its header counts before anything is sized by it.
    let fits = count
        .checked_mul(entry)
        .and_then(|b| b.checked_add(core::mem::size_of::<ReplyHdr>()))
        .is_some_and(|end| end <= out.len());
    if count > max || entry < core::mem::size_of::<T>() || !fits {
        return Err(EIO);
    }
    let mut v = KVec::with_capacity(count, GFP_KERNEL)?;
    for i in 0..count {
        // A count the reply cannot hold is a firmware bug: `EIO`, never a read past it.
        let at = i
            .checked_mul(entry)
            .and_then(|a| a.checked_add(core::mem::size_of::<ReplyHdr>()))
            .ok_or(EIO)?;
        v.push(read_at::<T>(out, at)?, GFP_KERNEL)?;
    }
    Ok(v)
}

/// The routes of this host, as the firmware lists them.
pub(crate) fn routes(mep: &Mep) -> Result<KVec<Route>> {
    let mut out = [0u8; 8 + 32 * MAX_ROUTES];
    let entries: KVec<RouteEntry> = list(mep, SUB_LIST, &mut out, MAX_ROUTES)?;
    let mut v = KVec::with_capacity(entries.len(), GFP_KERNEL)?;
    for e in &entries {
        v.push(
            Route {
                window_off: e.window_off,
                size: e.size,
                target_off: e.target_off,
                pdfid: e.pdfid,
                target_host: e.target_host,
            },
            GFP_KERNEL,
        )?;
    }
    Ok(v)
}

/// The grants this host may see.
pub(crate) fn grants(mep: &Mep) -> Result<KVec<Grant>> {
    let mut out = [0u8; mrpc::PAYLOAD];
    let max =
        (mrpc::PAYLOAD - core::mem::size_of::<ReplyHdr>()) / core::mem::size_of::<GrantEntry>();
    let entries: KVec<GrantEntry> = list(mep, SUB_GRANT_LIST, &mut out, max)?;
    let mut v = KVec::with_capacity(entries.len(), GFP_KERNEL)?;
    for e in &entries {
        v.push(
            Grant {
                pdfid: e.pdfid,
                holder: e.holder,
                grantee: e.grantee,
            },
            GFP_KERNEL,
        )?;
    }
    Ok(v)
}
