// SPDX-License-Identifier: GPL-2.0-only

//! `/dev/pcifabN`: the character device of a management endpoint and its ioctls.
//!
//! The device is a misc device ([`crate::kext::miscdev`]) registered with the MEP as parent
//! and with the attribute groups of [`crate::sysfs`], so its files exist before user space
//! hears of the device. This file registers it and holds an open file's state; the ioctls are
//! in [`dispatch`], the reading and writing of their size-first argument structs in [`args`],
//! and who may run what in [`perm`].

use kernel::{
    device::Device,
    fs::File,
    prelude::*,
    str::CString,
    sync::poll::PollTable,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
};

use crate::{
    fnsysfs,
    kext::{
        ida::{Ida, IdaId},
        miscdev::{self, MiscFile, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLPRI},
    },
    sysfs, Mep,
};

mod args;
mod dispatch;
mod perm;

/// The numbers `N` of `/dev/pcifabN` in use, one per bound management endpoint.
static NUMBERS: Ida = Ida::new();

/// The most management endpoints bound at once: `pcifab0` to `pcifab255`, as many as Linux's
/// switchtec driver allows by default (its `max_devices`). A host has one per switch
/// partition it is the host of; the limit only bounds the names.
pub(crate) const MAX_DEVICES: u32 = 256;

/// Makes the numbers usable; called from the module's init before the driver registers.
pub(crate) fn init_numbers() {
    NUMBERS.init();
}

/// Gives back the IDA's memory; called from the module's exit after every endpoint unbound.
pub(crate) fn destroy_numbers() {
    NUMBERS.destroy();
}

/// A registered `/dev/pcifabN` with its sysfs attributes and per-function directories.
///
/// Fields drop in declaration order: the per-function directories (which live under the
/// device's) go first, then the device, then its number.
pub(crate) struct Registration {
    _fndirs: Option<fnsysfs::Installed>,
    _misc: Pin<KBox<miscdev::Registration<OpenFile>>>,
    _number: IdaId,
}

impl Registration {
    /// Registers the character device of `mep` as a child of `parent`.
    pub(crate) fn new(parent: &Device, mep: Arc<Mep>) -> Result<Self> {
        let number = NUMBERS.alloc(MAX_DEVICES - 1).inspect_err(|e| {
            if *e == ENOSPC {
                dev_err!(parent, "no free /dev/pcifabN: all {} in use\n", MAX_DEVICES);
            }
        })?;
        let name = CString::try_from_fmt(fmt!("pcifab{}", number.get()))?;
        let misc = KBox::pin_init(
            miscdev::Registration::new(name, parent, &sysfs::GROUPS, mep),
            GFP_KERNEL,
        )?;
        let fndirs = fnsysfs::install(misc.data(), misc.device())
            .inspect_err(|e| dev_warn!(parent, "no per-function sysfs directories: {:?}\n", e))
            .ok();
        Ok(Self {
            _fndirs: fndirs,
            _misc: misc,
            _number: number,
        })
    }
}

/// State of one open file of `/dev/pcifabN`.
pub(crate) struct OpenFile {
    mep: Arc<Mep>,
    /// Names this file as the owner of the buffers it registers with the DMA endpoint.
    owner: u64,
    /// Event total this file last read with `PCIFAB_IOCTL_EVENTS`; `poll()` compares it.
    seen: Atomic<u64>,
}

impl MiscFile for OpenFile {
    type Data = Arc<Mep>;

    fn open(mep: &Arc<Mep>) -> Result<Self> {
        Ok(Self {
            mep: mep.clone(),
            owner: crate::dmaep::new_owner(),
            seen: Atomic::new(mep.events.counts().total),
        })
    }

    /// Readable when events arrived that this file has not read yet; error and hang-up once
    /// the endpoint is gone.
    fn poll(&self, file: &File, table: &PollTable<'_>) -> u32 {
        table.register_wait(file, self.mep.events.poll_cv());
        if self.mep.events.gone() || !self.mep.present() {
            return EPOLLERR | EPOLLHUP;
        }
        if self.mep.events.counts().total != self.seen.load(Relaxed) {
            EPOLLIN | EPOLLPRI
        } else {
            0
        }
    }

    fn ioctl(&self, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        self.dispatch(cmd, arg).map(|()| 0)
    }
}

impl Drop for OpenFile {
    /// The file is closed: the buffers it registered with the DMA endpoint are unregistered
    /// first, then unmapped and unpinned.
    fn drop(&mut self) {
        crate::dmaep::release_owner(&self.mep.pdev, self.owner);
    }
}
