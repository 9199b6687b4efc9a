// SPDX-License-Identifier: GPL-2.0-only

//! Scrubbing: erasing a drive of a `scrub = true` pool between two holders
//! (`Documentation/manager.rst`, "Scrubbing"). The manager binds the drive to its own host,
//! finds the drive's block devices under the function's sysfs device, zeroes each over its
//! whole capacity with `BLKZEROOUT`, checks that samples read back zero, and unbinds it.
//!
//! The erase works on a [`Target`], so the tests run it on a file; finding the disks reads
//! through a [`Roots`], so they run on a fake sysfs tree.

use std::{
    fs::File,
    os::unix::{fs::FileExt, io::AsRawFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::blockdev::{self, Roots};
use crate::driver::Driver;
use crate::executor::{Executor, SimExecutor};
use crate::scheduler::{Action, Host, Pdfid};

/// `BLKGETSIZE64` (`_IOR(0x12, 114, size_t)`): the capacity in bytes.
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272u32 as libc::Ioctl;
/// `BLKZEROOUT` (`_IO(0x12, 127)`): zero a byte range (`[start, len]`, 512-byte aligned).
const BLKZEROOUT: libc::Ioctl = 0x127f;
/// `BLKFLSBUF` (`_IO(0x12, 97)`): write back and drop the device's page cache.
const BLKFLSBUF: libc::Ioctl = 0x1261;

/// Bytes zeroed per `BLKZEROOUT` call (the kernel splits it further).
const CHUNK: u64 = 256 << 20;
/// Bytes read back at each sample position.
const SAMPLE: u64 = 64 << 10;
/// Sample positions: the first and last bytes and evenly spaced ones between.
const SAMPLES: u64 = 16;
/// How long the drive's block device may take to appear after the bind.
pub const APPEAR_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// What one scrub did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The device nodes erased, as the manager's host named them.
    pub disks: Vec<String>,
    /// Bytes zeroed over all of them.
    pub bytes: u64,
    /// From the bind to the unbind, seconds.
    pub secs: f64,
}

/// Why a scrub did not end well.
#[derive(Clone, Debug, PartialEq)]
pub enum ScrubError {
    /// This manager may not change the fabric now (its fence refused right before the
    /// bind): nothing was done, and the device still waits for its scrub.
    NotStarted(String),
    /// The scrub failed; the message says how, and where it left the drive.
    Failed(String),
}

impl std::fmt::Display for ScrubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotStarted(e) => write!(f, "not started: {e}"),
            Self::Failed(e) => f.write_str(e),
        }
    }
}

/// Erases a pool device between holders.
pub trait Scrubber: Send + Sync {
    /// Erases every block device of function `pf`; the fabric is as before when it returns
    /// (the function unbound), unless the error says otherwise. `ready` is asked right
    /// before each change of the fabric (the bind, the unbind), as the daemon asks its
    /// executor before each action: a deposed leader must not bind a drive a new leader
    /// may have granted.
    fn scrub(
        &self,
        pf: Pdfid,
        ready: &dyn Fn() -> Result<(), String>,
    ) -> Result<Report, ScrubError>;
}

// ---- erasing ---------------------------------------------------------------------------

/// What erasing needs of a block device.
pub trait Target {
    /// Capacity in bytes.
    fn size(&mut self) -> Result<u64, String>;
    /// Zeroes `len` bytes at `offset` (both multiples of 512).
    fn zero(&mut self, offset: u64, len: u64) -> Result<(), String>;
    /// Makes the zeroes durable and drops cached copies, so reads come from the device.
    fn flush(&mut self) -> Result<(), String>;
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), String>;
}

/// A block device node opened for erasing.
pub struct BlockDevice {
    file: File,
    path: PathBuf,
}

impl BlockDevice {
    /// Opens `path` read-write and exclusively: it fails while the device is mounted or
    /// otherwise claimed on this host.
    pub fn open(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| {
                let hint = if e.raw_os_error() == Some(libc::EBUSY) {
                    " (mounted or claimed on the manager's host?)"
                } else {
                    ""
                };
                format!("cannot open {} for erasing: {e}{hint}", path.display())
            })?;
        Ok(Self {
            file,
            path: path.into(),
        })
    }

    fn ioctl_err(&self, what: &str) -> String {
        format!(
            "{what} on {}: {}",
            self.path.display(),
            std::io::Error::last_os_error()
        )
    }
}

impl Target for BlockDevice {
    fn size(&mut self) -> Result<u64, String> {
        let mut size: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 to the pointer, which points to `size`.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKGETSIZE64, &mut size) };
        if r < 0 {
            return Err(self.ioctl_err("BLKGETSIZE64"));
        }
        Ok(size)
    }

    fn zero(&mut self, offset: u64, len: u64) -> Result<(), String> {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKZEROOUT reads two u64 from the pointer, which points to `range`.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKZEROOUT, range.as_ptr()) };
        if r < 0 {
            return Err(self.ioctl_err(&format!("BLKZEROOUT of {len} bytes at {offset}")));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        self.file
            .sync_all()
            .map_err(|e| format!("flushing {}: {e}", self.path.display()))?;
        // SAFETY: BLKFLSBUF takes no argument.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKFLSBUF, 0) };
        if r < 0 {
            return Err(self.ioctl_err("BLKFLSBUF"));
        }
        Ok(())
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| format!("reading {} at {offset}: {e}", self.path.display()))
    }
}

/// Where the samples of a `size`-byte device are read: (offset, length), the first and the
/// last bytes among them.
pub fn sample_ranges(size: u64) -> Vec<(u64, u64)> {
    let len = SAMPLE.min(size);
    let span = size - len;
    let mut v: Vec<(u64, u64)> = (0..SAMPLES)
        .map(|i| {
            // Evenly spaced, aligned down to 4 KiB except the last, which ends the device.
            let at = span / (SAMPLES - 1) * i;
            let at = if i == SAMPLES - 1 { span } else { at & !4095 };
            (at, len)
        })
        .collect();
    v.dedup();
    v
}

/// Zeroes all of `t` and checks that the samples read back zero; returns its size.
pub fn erase(t: &mut dyn Target) -> Result<u64, String> {
    let size = t.size()?;
    if size == 0 {
        return Err("the device has no capacity (size 0)".into());
    }
    if !size.is_multiple_of(512) {
        return Err(format!("its size {size} is not a multiple of 512 bytes"));
    }
    let mut at = 0;
    while at < size {
        let len = CHUNK.min(size - at);
        t.zero(at, len)?;
        at += len;
    }
    t.flush()?;
    let mut buf = vec![0u8; SAMPLE as usize];
    for (off, len) in sample_ranges(size) {
        let b = &mut buf[..len as usize];
        t.read_at(off, b)?;
        if let Some(i) = b.iter().position(|c| *c != 0) {
            return Err(format!(
                "byte {} reads {:#04x} after zeroing: the device did not erase",
                off + i as u64,
                b[i]
            ));
        }
    }
    Ok(size)
}

// ---- finding the drive's block devices -------------------------------------------------

/// Waits up to `timeout` until the function `bdf` shows at least one disk and every disk
/// it shows has its device node (a disk still without one would be left unerased);
/// returns the nodes. Discovery is the CLI's ([`blockdev::disks_under`]).
pub fn wait_disks(roots: &Roots, bdf: &str, timeout: Duration) -> Result<Vec<PathBuf>, String> {
    if !blockdev::is_bdf(bdf) {
        return Err(format!(
            "the driver named the function '{bdf}', not a PCI name"
        ));
    }
    let deadline = Instant::now() + timeout;
    loop {
        let disks = blockdev::pci_dir(roots, bdf)
            .map(|dir| blockdev::disks_under(roots, &dir))
            .unwrap_or_default();
        let (ready, missing): (Vec<_>, Vec<_>) = disks.iter().partition(|d| d.disk.node.exists());
        if !ready.is_empty() && missing.is_empty() {
            let mut nodes: Vec<PathBuf> = ready.iter().map(|d| d.disk.node.clone()).collect();
            nodes.sort();
            nodes.dedup();
            return Ok(nodes);
        }
        let now = Instant::now();
        if now >= deadline {
            let driver = blockdev::pci_dir(roots, bdf).and_then(|dir| blockdev::pci_driver(&dir));
            let missing: Vec<String> = missing
                .iter()
                .map(|d| d.disk.sysdir.display().to_string())
                .collect();
            return Err(format!(
                "no block device of {bdf} appeared within {} s (driver: {}; disks without a \
                 device node: {missing:?}); is the drive's driver (nvme) in the manager host's \
                 kernel?",
                timeout.as_secs(),
                driver.as_deref().unwrap_or("none"),
            ));
        }
        std::thread::sleep(POLL.min(deadline - now));
    }
}

// ---- the scrubbers ---------------------------------------------------------------------

/// The real one: through the pcifab driver on the manager's own host.
pub struct DriverScrubber {
    /// The pcifab device (`/dev/pcifab0`).
    pub device: String,
    pub roots: Roots,
    pub appear: Duration,
}

impl Scrubber for DriverScrubber {
    fn scrub(
        &self,
        pf: Pdfid,
        ready: &dyn Fn() -> Result<(), String>,
    ) -> Result<Report, ScrubError> {
        let failed = |e: String| ScrubError::Failed(e);
        let drv = Driver::open(&self.device).map_err(failed)?;
        let me = drv.own_host().map_err(failed)?;
        ready().map_err(ScrubError::NotStarted)?;
        let start = Instant::now();
        let bdf = drv
            .bind_here(pf, me, 0)
            .map_err(|e| failed(e.to_string()))?;
        let erased = wait_disks(&self.roots, &bdf, self.appear).and_then(|nodes| {
            let mut bytes = 0u64;
            for n in &nodes {
                let mut t = BlockDevice::open(n)?;
                bytes = bytes.saturating_add(erase(&mut t)?);
            }
            Ok((nodes, bytes))
        });
        let unbound = ready().and_then(|()| drv.unbind(pf).map_err(|e| e.to_string()));
        let secs = start.elapsed().as_secs_f64();
        match (erased, unbound) {
            (Ok((nodes, bytes)), Ok(())) => Ok(Report {
                disks: nodes.iter().map(|n| n.display().to_string()).collect(),
                bytes,
                secs,
            }),
            (Err(e), Ok(())) => Err(failed(e)),
            (Ok(_), Err(u)) => Err(failed(format!(
                "erased, but {u}; the drive stays bound to the manager's host {me}"
            ))),
            (Err(e), Err(u)) => Err(failed(format!(
                "{e}; then {u}; the drive stays bound to the manager's host {me}"
            ))),
        }
    }
}

/// A simulated scrub (`--executor sim`, tests): binds the device to `host` and unbinds it
/// on the simulated fabric, if there is one; fails for the functions in `fail`; records
/// every scrub in `done`.
#[derive(Clone, Default)]
pub struct SimScrubber {
    pub fabric: Option<Arc<Mutex<SimExecutor>>>,
    pub host: Host,
    pub fail: Arc<Mutex<Vec<Pdfid>>>,
    pub done: Arc<Mutex<Vec<Pdfid>>>,
}

impl Scrubber for SimScrubber {
    fn scrub(
        &self,
        pf: Pdfid,
        ready: &dyn Fn() -> Result<(), String>,
    ) -> Result<Report, ScrubError> {
        let lock = || ScrubError::Failed("simulated scrubber lock poisoned".into());
        let fabric = |a: Action| match &self.fabric {
            Some(f) => f.clone().apply(&a).map_err(ScrubError::Failed),
            None => Ok(()),
        };
        ready().map_err(ScrubError::NotStarted)?;
        fabric(Action::Bind {
            pdfid: pf,
            host: self.host,
        })?;
        let failed = {
            let mut f = self.fail.lock().map_err(|_| lock())?;
            f.iter().position(|x| *x == pf).map(|i| f.remove(i))
        };
        ready().map_err(|e| {
            ScrubError::Failed(format!("{e}; the drive stays bound to host {}", self.host))
        })?;
        fabric(Action::Unbind {
            pdfid: pf,
            host: self.host,
        })?;
        self.done.lock().map_err(|_| lock())?.push(pf);
        if failed.is_some() {
            return Err(ScrubError::Failed(format!(
                "simulated scrub failure of {pf:#06x}"
            )));
        }
        Ok(Report {
            disks: vec![format!("sim-{pf:#06x}")],
            bytes: 0,
            secs: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A device in memory; `lazy` ignores zeroing (a drive that does not erase).
    struct Mem {
        data: Vec<u8>,
        lazy: bool,
        zeroed: Vec<(u64, u64)>,
    }

    impl Target for Mem {
        fn size(&mut self) -> Result<u64, String> {
            Ok(self.data.len() as u64)
        }
        fn zero(&mut self, offset: u64, len: u64) -> Result<(), String> {
            assert!(
                offset.is_multiple_of(512) && len.is_multiple_of(512),
                "unaligned"
            );
            self.zeroed.push((offset, len));
            if !self.lazy {
                self.data[offset as usize..(offset + len) as usize].fill(0);
            }
            Ok(())
        }
        fn flush(&mut self) -> Result<(), String> {
            Ok(())
        }
        fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
            let o = offset as usize;
            buf.copy_from_slice(&self.data[o..o + buf.len()]);
            Ok(())
        }
    }

    fn mem(size: usize, lazy: bool) -> Mem {
        Mem {
            data: (0..size).map(|i| (i % 251) as u8 | 1).collect(),
            lazy,
            zeroed: Vec::new(),
        }
    }

    #[test]
    fn erase_zeroes_everything_in_chunks() {
        let size = 2 * CHUNK as usize + 4096;
        let mut m = mem(size, false);
        assert_eq!(erase(&mut m), Ok(size as u64));
        assert!(m.data.iter().all(|b| *b == 0));
        assert_eq!(
            m.zeroed,
            vec![(0, CHUNK), (CHUNK, CHUNK), (2 * CHUNK, 4096)]
        );
    }

    #[test]
    fn erase_fails_when_the_device_keeps_its_data() {
        let mut m = mem(1 << 20, true);
        let e = erase(&mut m).unwrap_err();
        assert!(
            e.contains("did not erase") && e.starts_with("byte 0 "),
            "{e}"
        );
        // A drive that erased all but its last byte: found.
        let mut m2 = Mem {
            data: vec![0; 1 << 20],
            lazy: true,
            zeroed: Vec::new(),
        };
        m2.data[(1 << 20) - 1] = 7;
        let e = erase(&mut m2).unwrap_err();
        assert!(
            e.contains(&format!("byte {} reads 0x07", (1 << 20) - 1)),
            "{e}"
        );
        let mut odd = mem(1000, false);
        assert!(erase(&mut odd).unwrap_err().contains("multiple of 512"));
        let mut empty = mem(0, false);
        assert!(erase(&mut empty).unwrap_err().contains("no capacity"));
    }

    #[test]
    fn samples_cover_both_ends() {
        let s = sample_ranges(16 << 20);
        assert_eq!(s.len(), SAMPLES as usize);
        assert_eq!(s[0], (0, SAMPLE));
        assert_eq!(s.last(), Some(&((16 << 20) - SAMPLE, SAMPLE)));
        assert!(s.windows(2).all(|w| w[0].0 < w[1].0));
        // A device smaller than one sample is read whole.
        assert_eq!(sample_ranges(4096), vec![(0, 4096)]);
    }

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "pcifab-scrub-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("tempdir");
        d
    }

    /// A fake sysfs: PCI device `bdf` with an nvme controller and disk `nvme0n1` (and its
    /// partition), the block class's `subsystem` links.
    fn fake_sysfs(root: &Path, bdf: &str) -> Roots {
        let sys = root.join("sys");
        let dev = root.join("dev");
        let pci = sys.join("devices/pci0000:00").join(bdf);
        let disk = pci.join("nvme/nvme0/nvme0n1");
        let part = disk.join("nvme0n1p1");
        fs::create_dir_all(&part).expect("mkdir");
        fs::create_dir_all(sys.join("class/block")).expect("mkdir");
        fs::create_dir_all(sys.join("bus/pci/devices")).expect("mkdir");
        fs::create_dir_all(&dev).expect("mkdir");
        std::os::unix::fs::symlink(&pci, sys.join("bus/pci/devices").join(bdf)).expect("ln");
        for d in [&disk, &part] {
            std::os::unix::fs::symlink(sys.join("class/block"), d.join("subsystem")).expect("ln");
        }
        fs::write(disk.join("dev"), "259:0\n").expect("dev");
        fs::write(disk.join("uevent"), "MAJOR=259\nDEVNAME=nvme0n1\n").expect("uevent");
        fs::write(part.join("dev"), "259:1\n").expect("dev");
        fs::write(part.join("partition"), "1\n").expect("partition");
        Roots {
            sys,
            proc: root.join("proc"),
            dev,
        }
    }

    #[test]
    fn finds_the_disk_once_its_node_exists() {
        let root = tempdir("find");
        let bdf = "0000:03:00.0";
        let roots = fake_sysfs(&root, bdf);
        // No node yet: times out and says which disk it saw.
        let e = wait_disks(&roots, bdf, Duration::ZERO).unwrap_err();
        assert!(
            e.contains("nvme0n1") && e.contains("no block device of 0000:03:00.0"),
            "{e}"
        );
        // The node appears while it waits.
        let node = roots.dev.join("nvme0n1");
        let n2 = node.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            fs::write(n2, b"").expect("node");
        });
        let found = wait_disks(&roots, bdf, Duration::from_secs(20)).expect("found");
        t.join().expect("join");
        assert_eq!(found, vec![node]);
        assert!(wait_disks(&roots, "../../etc", Duration::ZERO)
            .unwrap_err()
            .contains("not a PCI name"));
        assert!(wait_disks(&roots, "0000:04:00.0", Duration::ZERO).is_err());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn sim_scrubber_binds_to_its_host_and_fails_on_demand() {
        let fabric = Arc::new(Mutex::new(SimExecutor::default()));
        let s = SimScrubber {
            fabric: Some(fabric.clone()),
            host: 0,
            ..SimScrubber::default()
        };
        s.fail.lock().expect("fail").push(0x500);
        let go = || Ok(());
        assert!(s
            .scrub(0x500, &go)
            .unwrap_err()
            .to_string()
            .contains("simulated scrub failure"));
        assert!(s.scrub(0x500, &go).is_ok());
        // Refused right before the bind: nothing done, and said so.
        let refused = || Err("deposed".to_string());
        assert_eq!(
            s.scrub(0x500, &refused),
            Err(ScrubError::NotStarted("deposed".into()))
        );
        let log = fabric.lock().expect("fabric").log.clone();
        assert_eq!(log.len(), 4);
        assert!(fabric.lock().expect("fabric").bound.is_empty());
        assert_eq!(*s.done.lock().expect("done"), vec![0x500, 0x500]);
    }
}
