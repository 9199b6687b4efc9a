// SPDX-License-Identifier: GPL-2.0-only

//! The pcifab driver's ioctls as the manager uses them (`/dev/pcifabN`, through pcifab-uapi).

use std::fs::File;

use pcifab_uapi::{dev, Arg, Bind, Function, Move, Port, Unbind};

/// PAX's DIETEMP command and its GET sub-command (Gen4).
const DIETEMP: u32 = 0x04;
const DIETEMP_GET: u32 = 2;

/// An open `/dev/pcifabN`.
pub struct Driver {
    file: File,
    pub path: String,
    /// Whether the firmware has per-function telemetry: asked once, it does not change while
    /// the device stays open.
    telemetry: std::sync::OnceLock<bool>,
}

/// A failed ioctl: the errno and, for composition, the firmware's return code.
#[derive(Debug)]
pub struct IoctlError {
    pub what: String,
    pub err: std::io::Error,
    pub fw_ret: u32,
}

impl std::fmt::Display for IoctlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.err)?;
        if self.fw_ret != 0 {
            write!(f, " (firmware code {:#x})", self.fw_ret)?;
        }
        if self.err.raw_os_error() == Some(libc::EPERM) {
            f.write_str("; composing the fabric needs CAP_SYS_ADMIN")?;
        }
        Ok(())
    }
}

impl Driver {
    /// Opens the device, naming the usual reasons it is not there.
    pub fn open(path: &str) -> Result<Self, String> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .or_else(|_| File::open(path))
            .map_err(|e| {
                let hint = match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        "; is the pcifab module loaded and bound (lsmod, /sys/bus/pci/drivers/pcifab)?"
                    }
                    std::io::ErrorKind::PermissionDenied => "; run as root",
                    _ => "",
                };
                format!("cannot open {path}: {e}{hint}")
            })?;
        Ok(Self {
            file,
            path: path.into(),
            telemetry: std::sync::OnceLock::new(),
        })
    }

    /// Runs one firmware command; returns status and return value.
    pub fn mrpc(&self, cmd: u32, input: &[u8], output: &mut [u8]) -> std::io::Result<(u32, u32)> {
        dev::mrpc(&self.file, cmd, input, output, 0)
    }

    /// Every function of the fabric (INVENTORY).
    /// Whether the firmware has pcifab's per-function telemetry (`PCIFAB_FEATURE_TELEMETRY`);
    /// PAX firmware has not.
    pub fn has_telemetry(&self) -> Result<bool, String> {
        if let Some(&t) = self.telemetry.get() {
            return Ok(t);
        }
        let t = dev::identity(&self.file)
            .map(|id| id.features & pcifab_uapi::FEATURE_TELEMETRY != 0)
            .map_err(|e| format!("PCIFAB_IOCTL_IDENTITY on {} failed: {e}", self.path))?;
        Ok(*self.telemetry.get_or_init(|| t))
    }

    /// The switch's die temperature in hundredths of a degree Celsius (PAX's DIETEMP).
    pub fn die_temperature(&self) -> Result<i32, String> {
        let mut out = [0u8; 4];
        let (status, ret) = self
            .mrpc(DIETEMP, &DIETEMP_GET.to_le_bytes(), &mut out)
            .map_err(|e| format!("DIETEMP on {}: {e}", self.path))?;
        if status != pcifab_uapi::MRPC_STATUS_DONE {
            return Err(format!(
                "the firmware failed DIETEMP: return value {ret:#x}"
            ));
        }
        i32::try_from(u32::from_le_bytes(out)).map_err(|_| {
            format!(
                "DIETEMP reported an impossible {:#x}",
                u32::from_le_bytes(out)
            )
        })
    }

    pub fn functions(&self) -> Result<Vec<Function>, String> {
        dev::inventory(&self.file)
            .map(|(_, _, functions)| functions)
            .map_err(|e| format!("PCIFAB_IOCTL_INVENTORY on {} failed: {e}", self.path))
    }

    /// Every physical port of the fabric with its link state (INVENTORY).
    pub fn ports(&self) -> Result<Vec<Port>, String> {
        dev::inventory(&self.file)
            .map(|(_, ports, _)| ports)
            .map_err(|e| format!("PCIFAB_IOCTL_INVENTORY on {} failed: {e}", self.path))
    }

    pub fn bind(&self, pdfid: u16, host: u8) -> Result<(), IoctlError> {
        let mut b = Bind::new();
        (b.pdfid, b.host, b.port) = (pdfid, host, pcifab_uapi::ANY_PORT);
        // The manager binds for other hosts: their enumeration is theirs to wait for.
        b.flags = pcifab_uapi::BIND_NO_WAIT;
        dev::bind(&self.file, &mut b).map_err(|err| IoctlError {
            what: format!("bind {pdfid:#06x} to host {host}"),
            err,
            fw_ret: b.fw_ret,
        })
    }

    /// The partition (host) this manager runs in (IDENTITY).
    pub fn own_host(&self) -> Result<u8, String> {
        let id = dev::identity(&self.file)
            .map_err(|e| format!("PCIFAB_IOCTL_IDENTITY on {} failed: {e}", self.path))?;
        u8::try_from(id.partition).map_err(|_| {
            format!(
                "the driver reports partition {} for this host, beyond any host number",
                id.partition
            )
        })
    }

    /// Binds a function to this manager's own host `host` and waits until this host has
    /// enumerated it (up to `timeout_ms`, 0: the driver's default); returns the PCI name the
    /// function got here (`0000:03:00.0`).
    pub fn bind_here(&self, pdfid: u16, host: u8, timeout_ms: u32) -> Result<String, IoctlError> {
        let mut b = Bind::new();
        (b.pdfid, b.host, b.port) = (pdfid, host, pcifab_uapi::ANY_PORT);
        b.timeout_ms = timeout_ms;
        let err = |b: &Bind, err| IoctlError {
            what: format!("bind {pdfid:#06x} to this host ({host})"),
            err,
            fw_ret: b.fw_ret,
        };
        dev::bind(&self.file, &mut b).map_err(|e| err(&b, e))?;
        let end = b.name.iter().position(|c| *c == 0).unwrap_or(b.name.len());
        let name = String::from_utf8_lossy(&b.name[..end]).into_owned();
        if name.is_empty() {
            return Err(err(
                &b,
                std::io::Error::other("the driver named no PCI device for it on this host"),
            ));
        }
        Ok(name)
    }

    pub fn unbind(&self, pdfid: u16) -> Result<(), IoctlError> {
        let mut u = Unbind::new();
        u.pdfid = pdfid;
        dev::unbind(&self.file, &mut u).map_err(|err| IoctlError {
            what: format!("unbind {pdfid:#06x}"),
            err,
            fw_ret: u.fw_ret,
        })
    }

    pub fn move_to(&self, pdfid: u16, host: u8) -> Result<(), IoctlError> {
        let mut m = Move::new();
        (m.pdfid, m.host, m.port) = (pdfid, host, pcifab_uapi::ANY_PORT);
        dev::move_to(&self.file, &mut m).map_err(|err| IoctlError {
            what: format!("move {pdfid:#06x} to host {host}"),
            err,
            fw_ret: m.fw_ret,
        })
    }
}
