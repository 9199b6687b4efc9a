// SPDX-License-Identifier: GPL-2.0-only
//! Loading and unloading pcifab from `pcifab-selftest` (no `insmod` process in between), and
//! the checks that nothing of a binding is left once it is gone.

use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

use super::util::{check, errno, errno_name, Res};

pub const MODULE: &str = "pcifab";

/// The module file, open for `finit_module`.
pub struct ModuleFile {
    fd: i32,
    pub path: String,
}

impl ModuleFile {
    pub fn open(path: &str) -> Res<ModuleFile> {
        let c = CString::new(path).map_err(|_| check("module path contains a NUL byte"))?;
        // SAFETY: a valid path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(check(format!(
                "cannot open {path}: {}",
                errno_name(errno())
            )));
        }
        Ok(ModuleFile {
            fd,
            path: path.to_string(),
        })
    }

    /// `finit_module(fd, "", 0)`: Ok or the errno. Probing runs inside this call.
    pub fn load(&self) -> Result<(), i32> {
        self.load_with(c"")
    }

    /// `finit_module(fd, params, 0)` with module parameters such as `"name=value"`.
    pub fn load_with(&self, params: &CStr) -> Result<(), i32> {
        // SAFETY: `fd` is open; `params` is a valid C string for the call.
        let r = unsafe { libc::syscall(libc::SYS_finit_module, self.fd, params.as_ptr(), 0) };
        if r != 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }
}

impl Drop for ModuleFile {
    fn drop(&mut self) {
        // SAFETY: ours.
        unsafe { libc::close(self.fd) };
    }
}

/// `delete_module("pcifab", O_NONBLOCK)` as `rmmod` does: Ok or the errno.
pub fn unload() -> Result<(), i32> {
    // SAFETY: a valid C string.
    let r = unsafe {
        libc::syscall(
            libc::SYS_delete_module,
            c"pcifab".as_ptr(),
            libc::O_NONBLOCK,
        )
    };
    if r != 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// Unloads, retrying for `within` while the module is busy; for putting the guest back.
pub fn unload_retry(within: Duration) -> Result<(), i32> {
    let t = Instant::now();
    loop {
        match unload() {
            Err(libc::EAGAIN | libc::EBUSY) if t.elapsed() < within => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(libc::ENOENT) => return Ok(()),
            r => return r,
        }
    }
}

pub fn exists(p: &str) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

pub fn loaded() -> bool {
    exists("/sys/module/pcifab")
}

/// BDF of the MEP: vendor 0x11f8, class 0x058000.
pub fn find_mep() -> Res<String> {
    let mut found = Vec::new();
    let rd = std::fs::read_dir("/sys/bus/pci/devices")
        .map_err(|e| check(format!("/sys/bus/pci/devices: {e}")))?;
    for e in rd.flatten() {
        let p = e.path();
        let rd = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        if rd("vendor").trim() == "0x11f8" && rd("class").trim() == "0x058000" {
            found.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(check(format!(
            "expected one MEP (vendor 0x11f8, class 0x058000), found {found:?}"
        ))),
    }
}

/// Name of the driver bound to `bdf`, if any.
pub fn driver_of(bdf: &str) -> Option<String> {
    std::fs::read_link(format!("/sys/bus/pci/devices/{bdf}/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn read(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// What a binding of the MEP leaves when it is gone: everything here must be absent (or
/// back to the baseline) after a failed probe, a failed load and an unload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traces {
    /// `enable` of the MEP (the count of enables, as sysfs shows it).
    pub enable: String,
    /// Entries of the MEP's `msi_irqs` directory.
    pub msi_irqs: usize,
}

impl Traces {
    pub fn now(bdf: &str) -> Traces {
        Traces {
            enable: read(&format!("/sys/bus/pci/devices/{bdf}/enable"))
                .trim()
                .to_string(),
            msi_irqs: std::fs::read_dir(format!("/sys/bus/pci/devices/{bdf}/msi_irqs"))
                .map(|d| d.count())
                .unwrap_or(0),
        }
    }
}

/// Whether a line of `/proc/iomem` (`start-end : name`) or `/proc/interrupts` (the name
/// last) names the MEP's `pcifab`, or one of its `pcifab...` interrupts other than the DMA
/// endpoint's.
fn names_pcifab(line: &str) -> bool {
    let name = match line.rsplit_once(" : ") {
        Some((_, n)) => n.trim(),
        None => line.split_whitespace().last().unwrap_or(""),
    };
    name.starts_with("pcifab") && !name.starts_with("pcifab-dmaep")
}

/// Everything of a binding that is still there, with `module_may_stay` when the module may
/// be loaded but the MEP must not be bound.
pub fn leftovers(bdf: &str, baseline: &Traces, module_may_stay: bool) -> Vec<String> {
    let mut left = Vec::new();
    if !module_may_stay {
        for p in ["/sys/module/pcifab", "/sys/bus/pci/drivers/pcifab"] {
            if exists(p) {
                left.push(format!("{p} exists"));
            }
        }
    }
    for p in ["/dev/pcifab0", "/sys/class/misc/pcifab0"] {
        if exists(p) {
            left.push(format!("{p} exists"));
        }
    }
    if let Some(d) = driver_of(bdf) {
        left.push(format!("the MEP {bdf} is bound to {d}"));
    }
    // The MEP's own names: the DMA endpoint, which the module's second driver may keep
    // bound while it stays, names its region `pcifab-dmaep`.
    for (file, what) in [
        ("/proc/interrupts", "an interrupt"),
        ("/proc/iomem", "a memory region"),
    ] {
        if let Some(l) = read(file).lines().find(|l| names_pcifab(l)) {
            left.push(format!("{what} named pcifab in {file}: {}", l.trim()));
        }
    }
    let now = Traces::now(bdf);
    if now != *baseline {
        left.push(format!(
            "the MEP's enable / msi_irqs: expected {baseline:?} as before loading, got {now:?}"
        ));
    }
    left
}
