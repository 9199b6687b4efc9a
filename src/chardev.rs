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
    sync::poll::PollTable,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        Arc,
    },
};

use crate::{
    fnsysfs,
    kext::miscdev::{self, MiscFile, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLPRI},
    sysfs, Mep,
};

mod args;
mod dispatch;
mod perm;

/// Names of the character devices, one per bound management endpoint.
const NAMES: [&CStr; 8] = [
    c"pcifab0", c"pcifab1", c"pcifab2", c"pcifab3", c"pcifab4", c"pcifab5", c"pcifab6", c"pcifab7",
];

/// Bitmap of the entries of [`NAMES`] in use.
static NAMES_USED: Atomic<u32> = Atomic::new(0);

/// Takes the lowest free name slot.
fn take_slot() -> Result<usize> {
    let mut used = NAMES_USED.load(Relaxed);
    loop {
        let slot = (!used).trailing_zeros() as usize;
        if slot >= NAMES.len() {
            return Err(ENOSPC);
        }
        match NAMES_USED.cmpxchg(used, used | (1 << slot), Relaxed) {
            Ok(_) => return Ok(slot),
            Err(now) => used = now,
        }
    }
}

/// Returns a slot taken by [`take_slot`].
fn put_slot(slot: usize) {
    let mut used = NAMES_USED.load(Relaxed);
    while let Err(now) = NAMES_USED.cmpxchg(used, used & !(1 << slot), Relaxed) {
        used = now;
    }
}

/// A name slot taken by [`take_slot`], given back on drop.
struct Slot(usize);

impl Drop for Slot {
    fn drop(&mut self) {
        put_slot(self.0);
    }
}

/// A registered `/dev/pcifabN` with its sysfs attributes and per-function directories.
///
/// Fields drop in declaration order: the per-function directories (which live under the
/// device's) go first, then the device, then its name.
pub(crate) struct Registration {
    _fndirs: Option<fnsysfs::Installed>,
    _misc: Pin<KBox<miscdev::Registration<OpenFile>>>,
    _slot: Slot,
}

impl Registration {
    /// Registers the character device of `mep` as a child of `parent`.
    pub(crate) fn new(parent: &Device, mep: Arc<Mep>) -> Result<Self> {
        let slot = Slot(take_slot()?);
        let misc = KBox::pin_init(
            miscdev::Registration::new(NAMES[slot.0], parent, &sysfs::GROUPS, mep),
            GFP_KERNEL,
        )?;
        let fndirs = fnsysfs::install(misc.data(), misc.device())
            .inspect_err(|e| dev_warn!(parent, "no per-function sysfs directories: {:?}\n", e))
            .ok();
        Ok(Self {
            _fndirs: fndirs,
            _misc: misc,
            _slot: slot,
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
