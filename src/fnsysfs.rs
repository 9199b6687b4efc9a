// SPDX-License-Identifier: GPL-2.0-only

//! Per-function telemetry in sysfs: `/sys/class/misc/pcifabN/functions/0xPDFID/`, one
//! directory for every function of the fabric (not only those bound to this host), each with
//! `temperature`, `power`, `utilisation` and `health`, read through the MEP with the
//! `FUNCTION_TELEMETRY` extension command (0xF002) when the file is read, at most once a
//! second per function ([`crate::telemetry`]).
//!
//! The directories ([`crate::kext::kobject`]) are made at probe from the fabric's function
//! list and removed before the character device goes; removing a sysfs directory waits for
//! running `show` callbacks, so none of them sees the endpoint after that.

use kernel::{prelude::*, str::CString, sync::Arc};

use crate::{
    kext::{
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
        KobjAttr::new(c"temperature", |d, o| {
            show(d, o, |t, o| o.emit(format_args!("{}\n", i64::from(t.temp_centi) * 10)))
        }),
        // Microwatts, as hwmon reports power.
        KobjAttr::new(c"power", |d, o| {
            show(d, o, |t, o| o.emit(format_args!("{}\n", u64::from(t.power_mw) * 1000)))
        }),
        // Percent, 0-100.
        KobjAttr::new(c"utilisation", |d, o| {
            show(d, o, |t, o| o.emit(format_args!("{}\n", t.utilisation)))
        }),
        // Bit 0 link down, bit 1 temperature warning, bit 2 power warning (0x0: healthy).
        KobjAttr::new(c"health", |d, o| {
            show(d, o, |t, o| o.emit(format_args!("{:#x}\n", t.health)))
        }),
    ];
}

static KTYPE: KType<FnDir> = KType::new(&GROUPS);

/// The `functions` directory and one directory per function. Fields drop in declaration
/// order: the function directories before their parent.
pub(crate) struct FnDirs {
    _dirs: KVec<DataDir<FnDir>>,
    _parent: Dir,
}

impl FnDirs {
    /// Makes `functions/` under `under` (the misc device) with one directory per function the
    /// fabric has now. A function that cannot get a directory is logged and skipped:
    /// telemetry files are not worth failing the probe for.
    pub(crate) fn new(mep: Arc<Mep>, under: &kernel::device::Device) -> Result<Self> {
        let pdfids = mep.fabric.with_view(&mep, |v| -> Result<KVec<u16>> {
            let mut p = KVec::with_capacity(v.functions.len(), GFP_KERNEL)?;
            for f in v.functions.iter() {
                p.push(f.pdfid, GFP_KERNEL)?;
            }
            Ok(p)
        })??;
        let parent = Dir::new(c"functions", under)?;
        let mut dirs = KVec::with_capacity(pdfids.len(), GFP_KERNEL)?;
        for &pdfid in pdfids.iter() {
            let name = CString::try_from_fmt(fmt!("{:#06x}", pdfid))?;
            let data = FnDir {
                mep: mep.clone(),
                pdfid,
            };
            match DataDir::new(&KTYPE, &parent, &name, data) {
                Ok(dir) => dirs.push(dir, GFP_KERNEL)?,
                Err(_) => pr_warn!("no sysfs directory for function {:#06x}\n", pdfid),
            }
        }
        Ok(Self {
            _dirs: dirs,
            _parent: parent,
        })
    }
}
