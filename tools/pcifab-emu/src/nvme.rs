// SPDX-License-Identifier: GPL-2.0-only
//! NVMe endpoints: QEMU's own `nvme` device on a backing image that follows
//! the function from host to host (Documentation/emulator.rst, "NVMe
//! endpoints"). The emulator only prepares the image and asks the bound
//! host's QEMU to add and remove the device; QEMU emulates the controller.

use serde_json::{json, Value};
use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Make `path` absolute against the current directory (QEMU runs elsewhere).
pub fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("cannot resolve {}: {e}", path.display()))
}

/// Create the image sparse at `size` bytes when it is missing; an existing
/// one must be a regular file of exactly `size` bytes and is never changed.
/// Returns true when it was created.
pub fn prepare_image(path: &Path, size: u64, who: &str) -> Result<bool, String> {
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => {
            // set_len leaves a hole: no block is written.
            f.set_len(size).map_err(|e| {
                let _ = std::fs::remove_file(path);
                format!(
                    "{who}: cannot size image {} to {size} bytes: {e}",
                    path.display()
                )
            })?;
            Ok(true)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let meta = std::fs::metadata(path)
                .map_err(|e| format!("{who}: cannot inspect image {}: {e}", path.display()))?;
            if !meta.is_file() {
                return Err(format!(
                    "{who}: image {} exists and is not a regular file; move it away or set image to a file",
                    path.display()
                ));
            }
            if meta.len() != size {
                return Err(format!(
                    "{who}: image {} is {} bytes but capacity_mib asks for {size} bytes ({} MiB); \
                     it is never resized: set capacity_mib to its size or move the file away",
                    path.display(),
                    meta.len(),
                    size >> 20
                ));
            }
            Ok(false)
        }
        Err(e) => Err(format!(
            "{who}: cannot create image {}: {e}",
            path.display()
        )),
    }
}

/// QMP node name of the image of function `pdfid`.
pub fn node_name(pdfid: u16) -> String {
    format!("drv-{pdfid:04x}")
}

/// `blockdev-add` arguments: the raw image of function `pdfid`.
pub fn blockdev_add_args(pdfid: u16, image: &Path) -> Value {
    json!({
        "driver": "raw",
        "node-name": node_name(pdfid),
        "file": {"driver": "file", "filename": image.to_string_lossy()},
    })
}

/// `device_add` arguments of QEMU's nvme device for function `pdfid`
/// on `bus`, at `addr` when given, with a controller memory buffer of
/// `cmb_mib` MiB when given (QEMU's `cmb_size_mb`: BAR2, 64-bit
/// prefetchable, exactly that size; the host enables it through CMBMSC).
pub fn device_add_args(
    pdfid: u16,
    bus: &str,
    addr: Option<&str>,
    serial: &str,
    cmb_mib: Option<u32>,
) -> Value {
    let mut v = json!({
        "driver": "nvme",
        "id": format!("fn-{pdfid:04x}"),
        "bus": bus,
        "drive": node_name(pdfid),
        "serial": serial,
    });
    if let Some(a) = addr {
        v["addr"] = Value::String(a.to_owned());
    }
    if let Some(c) = cmb_mib {
        v["cmb_size_mb"] = Value::from(c);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("pcifab-nvme-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    #[test]
    fn image_created_sparse_and_kept() {
        let d = dir("img");
        let p = d.join("a.img");
        assert_eq!(prepare_image(&p, 64 << 20, "endpoints[0]"), Ok(true));
        let m = std::fs::metadata(&p).expect("created");
        assert_eq!(m.len(), 64 << 20);
        assert!(m.blocks() * 512 < 1 << 20, "sparse: {} blocks", m.blocks());
        // Data survives: an existing image of the right size is left alone.
        std::fs::write(&p, vec![7u8; 4096]).expect("write");
        let f = OpenOptions::new().write(true).open(&p).expect("open");
        f.set_len(64 << 20).expect("len");
        assert_eq!(prepare_image(&p, 64 << 20, "endpoints[0]"), Ok(false));
        let data = std::fs::read(&p).expect("read");
        assert_eq!(data.len(), 64 << 20);
        assert_eq!(&data[..4096], &[7u8; 4096][..], "not truncated");
        // Another size: refused, the file untouched.
        let e = prepare_image(&p, 128 << 20, "endpoints[0]").unwrap_err();
        assert!(
            e.contains(&p.display().to_string())
                && e.contains("is 67108864 bytes")
                && e.contains("134217728 bytes (128 MiB)"),
            "{e}"
        );
        assert_eq!(std::fs::metadata(&p).expect("still").len(), 64 << 20);
        // A directory in its place.
        let e = prepare_image(&d, 1 << 20, "endpoints[1]").unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        // An unusable directory.
        let e = prepare_image(&d.join("no/such.img"), 1 << 20, "endpoints[2]").unwrap_err();
        assert!(e.contains("endpoints[2]: cannot create image"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn qmp_arguments() {
        let b = blockdev_add_args(0x0500, Path::new("/r/n.img"));
        assert_eq!(
            b,
            json!({"driver": "raw", "node-name": "drv-0500",
                   "file": {"driver": "file", "filename": "/r/n.img"}})
        );
        let d = device_add_args(0x0500, "dsp2", Some("0.1"), "pcifab-nvme0", None);
        assert_eq!(
            d,
            json!({"driver": "nvme", "id": "fn-0500", "bus": "dsp2", "addr": "0.1",
                   "drive": "drv-0500", "serial": "pcifab-nvme0"})
        );
        assert!(device_add_args(1, "dsp0", None, "s", None)
            .get("addr")
            .is_none());
        let d = device_add_args(0x0500, "dsp1", None, "pcifab-cmb", Some(4));
        assert_eq!(
            d,
            json!({"driver": "nvme", "id": "fn-0500", "bus": "dsp1", "drive": "drv-0500",
                   "serial": "pcifab-cmb", "cmb_size_mb": 4})
        );
    }
}
