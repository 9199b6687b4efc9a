// SPDX-License-Identifier: GPL-2.0-only

//! The event headers of this partition that pcifab watches, as registers: which ports they
//! belong to and which events occurred that the interrupt has not cleared yet.
//!
//! Below both the interrupt handler ([`crate::event`]) and the fabric view
//! ([`crate::fabric`]), which asks here whether an event is on its way to it.

use kernel::{
    io::{register::Array, Io},
    prelude::*,
};

use crate::{regs, Bar0, Mep};

/// The PFF instances of the partition's ports pcifab watches: upstream first. Read once at
/// probe ([`Mep::pffs`]): the switch's configuration fixes a partition's ports, and changing
/// it restarts the switch, which takes the endpoint away.
pub(crate) type Pffs = [u32; 1 + regs::DSP_PORTS];

/// Reads [`Pffs`] from the partition's configuration.
pub(crate) fn local_pffs(bar: &Bar0<'_>, partition: usize) -> Result<[u32; 1 + regs::DSP_PORTS]> {
    let mut pffs = [u32::MAX; 1 + regs::DSP_PORTS];
    pffs[0] = bar
        .read(regs::PART_USP_PFF::try_at(partition).ok_or(EINVAL)?)
        .pff()
        .into();
    for (i, pff) in pffs[1..].iter_mut().enumerate() {
        let loc = regs::PART_DSP_PFF::try_at(regs::dsp_pff_index(partition, i)).ok_or(EINVAL)?;
        *pff = bar.read(loc).pff().into();
    }
    Ok(pffs)
}

/// Events that occurred and that the interrupt has not cleared yet.
pub(crate) struct Pending {
    /// Fabric-manager events: the firmware's event queue has more.
    pub(crate) gfms: bool,
    /// A link of this partition's ports changed.
    pub(crate) link: bool,
}

/// Which fabric and link events occurred that the interrupt has not cleared yet.
pub(crate) fn pending(mep: &Mep) -> Result<Pending> {
    let pffs = mep.pffs();
    mep.with_bar(|bar| -> Result<Pending> {
        let gfms = bar.read(regs::SW_GFMS_EVENT_HDR).occurred();
        for &pff in pffs {
            if let Some(at) = regs::PFF_LINK_STATE_HDR::try_at(pff as usize) {
                if bar.read(at).occurred() {
                    return Ok(Pending { gfms, link: true });
                }
            }
        }
        Ok(Pending { gfms, link: false })
    })?
}
