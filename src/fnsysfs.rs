// SPDX-License-Identifier: GPL-2.0-only

//! Per-function telemetry in sysfs: `/sys/class/misc/pcifabN/functions/0xPDFID/`, one
//! directory for every function of the fabric (not only those bound to this host), each with
//! `temperature`, `power`, `utilisation` and `health`, read through the MEP with the
//! `FUNCTION_TELEMETRY` extension command (0xF002) when the file is read, at most once a
//! second per function ([`crate::telemetry`]).
//!
//! The files are root's only (0400): they show other tenants' functions too, which is what the
//! fabric manager's host needs (it watches every function) and what root can read through the
//! device anyway. Members of the device's group read telemetry through `/dev/pcifabN`
//! (`pcifab top`); nobody else does.
//!
//! The directories ([`crate::kext::kobject`]) follow the fabric's function list: made at probe,
//! then brought up to date by a work item ([`sync`]) that every fabric event queues, so a
//! function that leaves the fabric (its endpoint's link goes down) loses its directory and one
//! that arrives gets one. They are removed before the character device goes; removing a sysfs
//! directory waits for running `show` callbacks, so none of them sees the endpoint after that.
//! The work holds no lock of the fabric's while it adds or removes directories: it copies the
//! function list out of the view first, and `show` callbacks never take the directories' lock.

use kernel::{
    prelude::*,
    str::CString,
    sync::Arc,
    workqueue::{impl_has_work, WorkItem},
};

use crate::{
    kext::{
        self,
        kobject::{DataDir, Dir, KType, KobjAttr},
        sysfs::{attribute_groups, PageWriter},
    },
    telemetry, Mep,
};

/// What one function's directory knows.
struct FnDir {
    mep: Arc<Mep>,
    pdfid: u16,
}

/// Formats one file from the function's telemetry, read through the MEP.
fn show(
    dir: &FnDir,
    out: &mut PageWriter<'_>,
    f: fn(&telemetry::Function, &mut PageWriter<'_>) -> Result,
) -> Result {
    let t = dir.mep.telemetry.function(&dir.mep, dir.pdfid)?;
    f(&t, out)
}

attribute_groups! {
    /// The files, in the order of the ABI document.
    static GROUPS: KobjAttr<FnDir> = [
        // Millidegrees Celsius, as hwmon reports temperatures.
        KobjAttr::root_only(c"temperature", |d, o| {
            show(d, o, |t, o| o.emit(format_args!("{}\n", i64::from(t.temp_centi) * 10)))
        }),
        // Microwatts, as hwmon reports power.
        KobjAttr::root_only(c"power", |d, o| {
            show(d, o, |t, o| o.emit(format_args!("{}\n", u64::from(t.power_mw) * 1000)))
        }),
        // Percent, 0-100.
        KobjAttr::root_only(c"utilisation", |d, o| {
            show(d, o, |t, o| o.emit(format_args!("{}\n", t.utilisation)))
        }),
        // Bit 0 link down, bit 1 temperature warning, bit 2 power warning (0x0: healthy).
        KobjAttr::root_only(c"health", |d, o| {
            show(d, o, |t, o| o.emit(format_args!("{:#x}\n", t.health)))
        }),
    ];
}

static KTYPE: KType<FnDir> = KType::new(&GROUPS);

/// The `functions` directory and one directory per function of the fabric. Fields drop in
/// declaration order: the function directories before their parent.
pub(crate) struct FnDirs {
    dirs: KVec<(u16, DataDir<FnDir>)>,
    parent: Dir,
}

/// Words of a bitmap with one bit per possible PDFID.
const PDFID_WORDS: usize = (u16::MAX as usize + 1) / 64;

impl FnDirs {
    /// Makes an empty `functions/` under `under` (the misc device); [`FnDirs::sync`] fills it.
    pub(crate) fn new(under: &kernel::device::Device) -> Result<Self> {
        Ok(Self {
            dirs: KVec::new(),
            parent: Dir::new(c"functions", under)?,
        })
    }

    /// Makes the directories those of the functions `pdfids` lists (in any order, duplicates
    /// allowed): keeps the ones still there, removes the others (which waits for their running
    /// `show` callbacks) and adds the new ones. Nothing changes when memory for the new list
    /// cannot be had. A function that cannot get a directory is logged and skipped: telemetry
    /// files are not worth failing for; the next sync tries again.
    pub(crate) fn sync(&mut self, mep: &Arc<Mep>, pdfids: &[u16]) -> Result {
        let mut want = KVec::from_elem(0u64, PDFID_WORDS, GFP_KERNEL)?;
        let mut count = 0usize;
        for &p in pdfids {
            // In range: the bitmap has a bit for every u16.
            if let Some(word) = want.get_mut(usize::from(p) / 64) {
                let bit = 1u64 << (p % 64);
                if *word & bit == 0 {
                    *word |= bit;
                    count += 1;
                }
            }
        }
        let mut next = KVec::with_capacity(count, GFP_KERNEL)?;
        // Keep what is still wanted (clearing its bit); the rest drops with `old`.
        let old = core::mem::take(&mut self.dirs);
        for (pdfid, dir) in old {
            if let Some(word) = want.get_mut(usize::from(pdfid) / 64) {
                let bit = 1u64 << (pdfid % 64);
                if *word & bit != 0 {
                    *word &= !bit;
                    // Within the capacity reserved above: cannot fail.
                    next.push((pdfid, dir), GFP_KERNEL)?;
                }
            }
        }
        // What is left set is new.
        for (w, &word) in want.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let Ok(pdfid) = u16::try_from(w * 64 + b as usize) else {
                    continue;
                };
                let data = FnDir {
                    mep: mep.clone(),
                    pdfid,
                };
                let made = CString::try_from_fmt(fmt!("{:#06x}", pdfid))
                    .and_then(|name| DataDir::new(&KTYPE, &self.parent, &name, data));
                match made {
                    // Within the capacity reserved above: cannot fail.
                    Ok(dir) => next.push((pdfid, dir), GFP_KERNEL)?,
                    Err(_) => pr_warn!("no sysfs directory for function {:#06x}\n", pdfid),
                }
            }
        }
        self.dirs = next;
        Ok(())
    }
}

/// Makes `mep`'s `functions/` under `under` and fills it from the fabric (if the fabric cannot
/// be read now, the next fabric event fills it). The directories stay until the returned guard
/// drops.
pub(crate) fn install(mep: &Arc<Mep>, under: &kernel::device::Device) -> Result<Installed> {
    let dirs = FnDirs::new(under)?;
    *mep.fn_dirs.lock() = Some(dirs);
    let installed = Installed(mep.clone());
    if let Err(e) = sync(mep) {
        pr_warn!(
            "per-function sysfs directories left empty for now: {:?}\n",
            e
        );
    }
    Ok(installed)
}

/// Removes the per-function directories on drop.
pub(crate) struct Installed(Arc<Mep>);

impl Drop for Installed {
    fn drop(&mut self) {
        // Taken out under the lock (a running sync finishes first), dropped outside it.
        let dirs = self.0.fn_dirs.lock().take();
        drop(dirs);
    }
}

/// Queues a sync of `mep`'s directories with the fabric; called on every fabric event.
/// Already queued is fine: the queued sync reads the fabric as it is when it runs.
pub(crate) fn queue(mep: &Arc<Mep>) {
    let _ = kext::workqueue::driver().enqueue::<Arc<Mep>, 1>(mep.clone());
}

/// Waits until no sync runs; called at unbind once no interrupt can queue one.
pub(crate) fn flush(mep: &Mep) {
    kext::workqueue::flush(&mep.fn_dirs_work);
}

/// Brings `mep`'s directories up to date with the fabric's function list. The list is copied
/// out of the view first, so no fabric lock is held while directories come and go. The list
/// changes only by fabric events, so the view's age alone does not make this sync, which
/// every event queues, read the whole fabric.
fn sync(mep: &Arc<Mep>) -> Result {
    let pdfids = mep
        .fabric
        .with_view_by_events(mep, |v| -> Result<KVec<u16>> {
            let mut p = KVec::with_capacity(v.functions.len(), GFP_KERNEL)?;
            for f in v.functions.iter() {
                p.push(f.pdfid, GFP_KERNEL)?;
            }
            Ok(p)
        })??;
    let mut guard = mep.fn_dirs.lock();
    match &mut *guard {
        Some(dirs) => dirs.sync(mep, &pdfids),
        None => Ok(()),
    }
}

impl_has_work! {
    impl HasWork<Self, 1> for Mep { self.fn_dirs_work }
}

impl WorkItem<1> for Mep {
    type Pointer = Arc<Mep>;

    fn run(this: Arc<Mep>) {
        // A failed read leaves the directories as they are; the next event tries again.
        if let Err(e) = sync(&this) {
            if this.present() {
                pr_warn!("per-function sysfs directories not updated: {:?}\n", e);
            }
        }
    }
}
