// SPDX-License-Identifier: GPL-2.0-only

//! GFMS_BIND_UNBIND (0x84): binding endpoint functions to a host's logical port and unbinding
//! them (switchtec-user `lib/fabric.c`, `switchtec_gfms_bind`, `switchtec_gfms_unbind`; return
//! codes from `inc/switchtec/errors.h`).

use kernel::prelude::*;

use super::{lie, payload, Command, Failure, ERR_MRPC_DENIED, ERR_PARAM_INVALID};
use crate::Mep;

pub(super) const OPCODE: u32 = 0x84;
const SUB_BIND: u8 = 1;
const SUB_UNBIND: u8 = 2;
/// Functions one bind request names at most (`SWITCHTEC_FABRIC_MULTI_FUNC_NUM`).
pub(crate) const MAX_FUNCS: usize = 8;

/// The function is bound already (to some host).
pub(crate) const ERR_PHYC_PORT_ARDY_BIND: u32 = 0x1;
/// The logical port has a binding already.
pub(crate) const ERR_LOGC_PORT_ARDY_BIND: u32 = 0x2;
/// No such partition (host).
pub(crate) const ERR_BIND_PRTT_NOT_EXIST: u32 = 0x3;
/// No such function or physical port.
pub(crate) const ERR_PHYC_PORT_NOT_EXIST: u32 = 0x4;
/// The physical port is disabled.
pub(crate) const ERR_PHYC_PORT_DIS: u32 = 0x5;
/// No such logical port.
pub(crate) const ERR_NO_LOGC_PORT: u32 = 0x6;
/// Another bind or unbind of the function is in progress.
pub(crate) const ERR_BIND_IN_PROGRESS: u32 = 0x7;
/// The target is an upstream port.
pub(crate) const ERR_BIND_TGT_IS_USP: u32 = 0x8;
/// The logical port is not bound.
pub(crate) const ERR_LOGC_PORT_NOT_BIND_PHYC_PORT: u32 = 0xb;
/// The unbind option is not valid.
pub(crate) const ERR_UNBIND_OPT_INVALID: u32 = 0xc;
/// The binding does not pass the firmware's checks (e.g. a PF and one of its VFs together).
pub(crate) const ERR_BIND_CHECK_FAIL: u32 = 0xd;

/// pcifab's extension codes (only with [`super::ext::UNBIND_REQUEST_EVENT`]): the host this
/// function was bound to did not let it go in time, or did not enumerate it.
pub(crate) const EXT_HOTPLUG_FAILED: u32 = 0xf0_0008;
pub(crate) const EXT_UNBIND_TIMEOUT: u32 = 0xf0_0009;

payload! {
    struct FuncEntry[4] {
        pdfid: u16,
        next_valid: u8,
        rsvd: u8,
    }

    /// Bind up to [`MAX_FUNCS`] functions to one logical port of a host.
    pub(crate) struct Bind[36] {
        sub: u8,
        host_sw_idx: u8,
        host_phys_port_id: u8,
        host_log_port_id: u8,
        function: [FuncEntry; MAX_FUNCS],
    }

    pub(crate) struct BindReply[4] {
        status: u8,
        rsvd: [u8; 3],
    }

    /// Unbind what is bound to one logical port of a host.
    pub(crate) struct Unbind[8] {
        sub: u8,
        host_sw_idx: u8,
        host_phys_port_id: u8,
        host_log_port_id: u8,
        pdfid: u16,
        option: u8,
        rsvd: u8,
    }

    pub(crate) struct UnbindReply[1] {
        status: u8,
    }
}

/// The errno for a refusal of a bind or unbind.
fn errno(ret: u32) -> Error {
    match ret {
        ERR_PHYC_PORT_ARDY_BIND
        | ERR_LOGC_PORT_ARDY_BIND
        | ERR_BIND_IN_PROGRESS
        | ERR_BIND_CHECK_FAIL => EBUSY,
        ERR_PHYC_PORT_NOT_EXIST | ERR_BIND_PRTT_NOT_EXIST | ERR_LOGC_PORT_NOT_BIND_PHYC_PORT => {
            ENOENT
        }
        ERR_NO_LOGC_PORT => ENOSPC,
        ERR_MRPC_DENIED => EACCES,
        EXT_UNBIND_TIMEOUT => ETIMEDOUT,
        ERR_PARAM_INVALID | ERR_BIND_TGT_IS_USP | ERR_UNBIND_OPT_INVALID | ERR_PHYC_PORT_DIS => {
            EINVAL
        }
        _ => EIO,
    }
}

impl Bind {
    /// Binds `pdfids` (1 to [`MAX_FUNCS`]) to logical port `log_port` of the host whose
    /// upstream port is `phys_port`, on switch `sw_idx`.
    pub(crate) fn new(sw_idx: u8, phys_port: u8, log_port: u8, pdfids: &[u16]) -> Result<Self> {
        if pdfids.is_empty() || pdfids.len() > MAX_FUNCS {
            return Err(EINVAL);
        }
        let mut function = [FuncEntry {
            pdfid: 0,
            next_valid: 0,
            rsvd: 0,
        }; MAX_FUNCS];
        for (i, (e, &pdfid)) in function.iter_mut().zip(pdfids).enumerate() {
            e.pdfid = pdfid;
            e.next_valid = u8::from(i + 1 < pdfids.len());
        }
        Ok(Self {
            sub: SUB_BIND,
            host_sw_idx: sw_idx,
            host_phys_port_id: phys_port,
            host_log_port_id: log_port,
            function,
        })
    }
}

impl BindReply {
    /// Whether a bind the firmware finished (DONE) bound: its status byte must be 0, the only
    /// value the record gives for DONE. Anything else is a firmware lie: refused with `EIO`
    /// (what the firmware did is unknown; the caller reads the fabric again).
    pub(crate) fn accepted(&self, mep: &Mep, pdfid: u16) -> Result<(), Failure> {
        if self.status == 0 {
            return Ok(());
        }
        lie(
            mep,
            format_args!(
                "bind of {:#06x} answered DONE with unknown status {:#04x}; refused",
                pdfid, self.status
            ),
        );
        mep.fabric.invalidate();
        Err(EIO.into())
    }
}

impl Command for Bind {
    const OPCODE: u32 = OPCODE;
    type Reply = BindReply;

    fn errno(ret: u32) -> Error {
        errno(ret)
    }
}

impl Unbind {
    /// Unbinds what is bound to logical port `log_port` of the host whose upstream port is
    /// `phys_port`; `pdfid` names the function as a PAX client does (option 0).
    pub(crate) fn new(sw_idx: u8, phys_port: u8, log_port: u8, pdfid: u16) -> Self {
        Self {
            sub: SUB_UNBIND,
            host_sw_idx: sw_idx,
            host_phys_port_id: phys_port,
            host_log_port_id: log_port,
            pdfid,
            option: 0,
            rsvd: 0,
        }
    }
}

impl Command for Unbind {
    const OPCODE: u32 = OPCODE;
    type Reply = UnbindReply;

    fn errno(ret: u32) -> Error {
        errno(ret)
    }
}
