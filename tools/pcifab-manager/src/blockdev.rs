// SPDX-License-Identifier: GPL-2.0-only

//! Block devices of composed functions: which block devices (disks and their partitions) sit
//! under a PCI device in sysfs, waiting for them after a bind, and whether they are in use
//! (mounted, swap, held by another block device, open by a process) before an unbind or move
//! takes the function away.
//!
//! Every function reads through a [`Roots`] (the sysfs, procfs and /dev roots), so the tests
//! run against fake trees in a temporary directory. Walks of sysfs never follow symbolic links
//! (the device tree's real directories hold every child device) and stop at a depth and an
//! entry limit, so a strange tree cannot make them run forever.

use std::{
    fs,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Deepest directory level below the PCI device a walk looks at (nvme: `nvme/nvme0/nvme0n1`
/// is 3; SCSI: `host0/target0:0:0/0:0:0:0/block/sda` is 5).
const MAX_DEPTH: usize = 12;
/// Most directory entries one walk reads.
const MAX_ENTRIES: usize = 50_000;

/// Where sysfs, procfs and the device nodes are.
#[derive(Clone, Debug)]
pub struct Roots {
    pub sys: PathBuf,
    pub proc: PathBuf,
    pub dev: PathBuf,
}

impl Roots {
    /// The running system's: `/sys`, `/proc`, `/dev`.
    pub fn system() -> Self {
        Self {
            sys: "/sys".into(),
            proc: "/proc".into(),
            dev: "/dev".into(),
        }
    }
}

/// One block device (a whole disk or a partition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Its sysfs name (`nvme0n1p1`).
    pub name: String,
    /// Its device node (`/dev/nvme0n1p1`).
    pub node: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// Its sysfs directory.
    pub sysdir: PathBuf,
}

/// A whole disk and its partitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    pub disk: Block,
    pub parts: Vec<Block>,
}

impl Disk {
    /// The disk, then its partitions.
    pub fn all(&self) -> impl Iterator<Item = &Block> {
        std::iter::once(&self.disk).chain(&self.parts)
    }
}

/// Whether a PCI class code (base << 16 | sub << 8 | prog-if) is mass storage (base 0x01).
pub fn is_storage(class: u32) -> bool {
    class >> 16 == 0x01
}

/// Whether `s` is a PCI device name as sysfs spells it (`0000:03:00.0`).
pub fn is_bdf(s: &str) -> bool {
    parse_bdf(s).is_some()
}

/// (domain, bus, device, function) of a PCI name `DDDD:BB:DD.F`.
fn parse_bdf(s: &str) -> Option<(u32, u8, u8, u8)> {
    let b = s.as_bytes();
    if b.len() != 12 || b[4] != b':' || b[7] != b':' || b[10] != b'.' {
        return None;
    }
    let hex = |r: std::ops::Range<usize>| {
        let t = &s[r];
        t.bytes()
            .all(|c| c.is_ascii_hexdigit())
            .then(|| u32::from_str_radix(t, 16).ok())
            .flatten()
    };
    let (dom, bus, dev, func) = (hex(0..4)?, hex(5..7)?, hex(8..10)?, hex(11..12)?);
    if dev > 0x1f || func > 7 {
        return None;
    }
    Some((dom, bus as u8, dev as u8, func as u8))
}

/// The sysfs directory of PCI device `bdf` (`/sys/bus/pci/devices/<bdf>`, resolved).
pub fn pci_dir(roots: &Roots, bdf: &str) -> Option<PathBuf> {
    if !is_bdf(bdf) {
        return None;
    }
    fs::canonicalize(roots.sys.join("bus/pci/devices").join(bdf)).ok()
}

/// A sysfs file's text, trimmed; `None` if it cannot be read.
fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// The PCI class code of the device in `dir` (its `class` file, `0x010802`).
pub fn pci_class(dir: &Path) -> Option<u32> {
    let s = read_trim(&dir.join("class"))?;
    let hex = s.strip_prefix("0x").unwrap_or(&s);
    u32::from_str_radix(hex, 16)
        .ok()
        .filter(|c| *c <= 0xff_ffff)
}

/// The name of the driver bound to the device in `dir`, if one is.
pub fn pci_driver(dir: &Path) -> Option<String> {
    let t = fs::read_link(dir.join("driver")).ok()?;
    t.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Parses a `dev` file's `MAJOR:MINOR`.
fn parse_devno(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Whether the sysfs directory `d` is a block device's (its `subsystem` links to `block`).
fn is_block_dir(d: &Path) -> bool {
    fs::read_link(d.join("subsystem"))
        .ok()
        .is_some_and(|t| t.file_name().is_some_and(|n| n == "block"))
}

/// The block device of sysfs directory `d`, if it has a device number (a hidden disk, such as
/// an NVMe multipath path device, has none).
fn block_at(roots: &Roots, d: &Path) -> Option<Block> {
    let name = d.file_name()?.to_str()?.to_string();
    let (major, minor) = parse_devno(&fs::read_to_string(d.join("dev")).ok()?)?;
    // The node's name: DEVNAME of `uevent`, else the sysfs name with `!` for `/`.
    let devname = fs::read_to_string(d.join("uevent"))
        .ok()
        .and_then(|u| {
            u.lines()
                .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string))
        })
        .unwrap_or_else(|| name.replace('!', "/"));
    let safe = !devname.is_empty()
        && !devname.starts_with('/')
        && devname
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if !safe {
        return None;
    }
    Some(Block {
        node: roots.dev.join(&devname),
        name,
        major,
        minor,
        sysdir: d.to_path_buf(),
    })
}

/// Real (not symlinked) subdirectories of `d`.
fn subdirs(d: &Path, budget: &mut usize) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(d) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// The sysfs directories of block devices below `top`, depth first, without following links.
fn walk_blocks(top: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut budget = MAX_ENTRIES;
    let mut stack = vec![(top.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        if depth > 0 && is_block_dir(&d) {
            found.push(d.clone());
        }
        if depth < MAX_DEPTH {
            for s in subdirs(&d, &mut budget).into_iter().rev() {
                stack.push((s, depth + 1));
            }
        }
    }
    found
}

/// The disks whose `multipath/` lists the hidden path device `name` (NVMe native multipath:
/// the disk with the device node is not below the controller, its path device is).
fn multipath_heads(roots: &Roots, name: &str) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(roots.sys.join("class/block")) else {
        return Vec::new();
    };
    let mut heads: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| fs::symlink_metadata(p.join("multipath").join(name)).is_ok())
        .filter_map(|p| fs::canonicalize(p).ok())
        .collect();
    heads.sort();
    heads
}

/// The partitions of the disk in `sysdir` (child block devices with a `partition` file).
fn partitions(roots: &Roots, sysdir: &Path) -> Vec<Block> {
    let mut budget = MAX_ENTRIES;
    subdirs(sysdir, &mut budget)
        .iter()
        .filter(|d| d.join("partition").is_file() && is_block_dir(d))
        .filter_map(|d| block_at(roots, d))
        .collect()
}

/// The disks (with their partitions) of the PCI device whose sysfs directory is `pci`: every
/// block device in its subtree, a hidden multipath path device standing for its head disk.
pub fn disks_under(roots: &Roots, pci: &Path) -> Vec<Disk> {
    let mut disks: Vec<Disk> = Vec::new();
    for d in walk_blocks(pci) {
        if d.join("partition").exists() {
            continue; // found with its disk
        }
        let sysdirs = if d.join("dev").exists() {
            vec![d]
        } else {
            let Some(name) = d.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            multipath_heads(roots, name)
        };
        for s in sysdirs {
            let Some(disk) = block_at(roots, &s) else {
                continue;
            };
            if disks
                .iter()
                .any(|x| (x.disk.major, x.disk.minor) == (disk.major, disk.minor))
            {
                continue;
            }
            let parts = partitions(roots, &s);
            disks.push(Disk { disk, parts });
        }
    }
    disks.sort_by(|a, b| a.disk.name.cmp(&b.disk.name));
    disks
}

/// What waiting for block devices found.
#[derive(Debug, PartialEq, Eq)]
pub enum Appeared {
    /// Disks whose device nodes exist.
    Disks(Vec<Disk>),
    /// None by the deadline; `sysfs_only` are disks sysfs shows but whose node is missing.
    TimedOut { sysfs_only: Vec<Disk> },
}

/// Polls every `interval` until a disk with an existing device node is below `pci`, or
/// `timeout` has passed (a zero timeout looks once).
pub fn wait_disks(roots: &Roots, pci: &Path, timeout: Duration, interval: Duration) -> Appeared {
    let deadline = Instant::now() + timeout;
    loop {
        let all = disks_under(roots, pci);
        let (ready, missing): (Vec<Disk>, Vec<Disk>) =
            all.into_iter().partition(|d| d.disk.node.exists());
        if !ready.is_empty() {
            return Appeared::Disks(ready);
        }
        let now = Instant::now();
        if now >= deadline {
            return Appeared::TimedOut {
                sysfs_only: missing,
            };
        }
        std::thread::sleep(interval.min(deadline - now));
    }
}

/// A PCI function this host enumerated behind one of its logical ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortFunction {
    /// The logical port.
    pub port: u8,
    /// Its PCI name (`0000:03:00.0`).
    pub bdf: String,
    /// Its sysfs directory.
    pub dir: PathBuf,
}

/// The functions this host enumerated behind its logical ports, for the switch whose
/// management endpoint's sysfs directory is `mep`: logical port `L` is the downstream port at
/// device `L` function 0 on the secondary bus of the upstream port (device 0 function 0 of the
/// endpoint's bus), the functions are device 0 behind it (as the driver finds them). Unbinding or moving a function away from
/// this host removes everything behind its port.
pub fn port_functions(mep: &Path) -> Vec<PortFunction> {
    let Some((dom, bus, _, _)) = mep.file_name().and_then(|n| n.to_str()).and_then(parse_bdf)
    else {
        return Vec::new();
    };
    let Some(parent) = mep.parent() else {
        return Vec::new();
    };
    let usp = parent.join(format!("{dom:04x}:{bus:02x}:00.0"));
    let mut budget = MAX_ENTRIES;
    let children = |dir: &Path, budget: &mut usize| -> Vec<(String, u8, u8, PathBuf)> {
        subdirs(dir, budget)
            .into_iter()
            .filter_map(|p| {
                let n = p.file_name()?.to_str()?.to_string();
                let (_, _, d, f) = parse_bdf(&n)?;
                Some((n, d, f, p))
            })
            .collect()
    };
    let mut out = Vec::new();
    for (_, port, func, dsp) in children(&usp, &mut budget) {
        if func != 0 {
            continue;
        }
        for (bdf, d, _, dir) in children(&dsp, &mut budget) {
            if d == 0 {
                out.push(PortFunction { port, bdf, dir });
            }
        }
    }
    out
}

/// The sysfs directory of the PCI device (the management endpoint) behind the character device
/// node `node`.
pub fn char_device_pci_dir(roots: &Roots, node: &Path) -> Result<PathBuf, String> {
    let md = fs::metadata(node).map_err(|e| format!("cannot stat {}: {e}", node.display()))?;
    if !md.file_type().is_char_device() {
        return Err(format!("{} is not a character device", node.display()));
    }
    let (ma, mi) = dev_split(md.rdev());
    let link = roots.sys.join(format!("dev/char/{ma}:{mi}/device"));
    fs::canonicalize(&link).map_err(|e| format!("cannot resolve {}: {e}", link.display()))
}

/// (major, minor) of a `dev_t` (glibc's encoding, which Linux's `stat` uses).
fn dev_split(d: u64) -> (u32, u32) {
    let major = ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff);
    let minor = (d & 0xff) | ((d >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// One use of a block device that stops it from going away quietly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Use {
    /// Mounted on this mount point.
    Mounted(String),
    /// An active swap area.
    Swap,
    /// Held by this block device (device-mapper, md, ...).
    Held(String),
    /// Open by a process: pid and command name.
    Open(u32, String),
}

impl Use {
    /// Whether this use refuses an unbind or move without `--force`.
    pub fn refuses(&self) -> bool {
        !matches!(self, Use::Open(..))
    }

    /// The short name in JSON (`mounted`, `swap`, `held`, `open`).
    pub fn kind(&self) -> &'static str {
        match self {
            Use::Mounted(_) => "mounted",
            Use::Swap => "swap",
            Use::Held(_) => "held",
            Use::Open(..) => "open",
        }
    }

    /// Who or where: the mount point, the holder, `pid (comm)`; empty for swap.
    pub fn by(&self) -> String {
        match self {
            Use::Mounted(m) => m.clone(),
            Use::Swap => String::new(),
            Use::Held(h) => h.clone(),
            Use::Open(pid, comm) => format!("{pid} ({comm})"),
        }
    }
}

/// A use found on one block device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The device node (`/dev/nvme0n1p1`).
    pub node: PathBuf,
    pub what: Use,
}

impl Found {
    /// `/dev/nvme0n1p1 is mounted on /mnt`, for messages.
    pub fn describe(&self) -> String {
        let n = self.node.display();
        match &self.what {
            Use::Mounted(m) => format!("{n} is mounted on {m}"),
            Use::Swap => format!("{n} is in use as swap"),
            Use::Held(h) => format!("{n} is held by {h}"),
            Use::Open(pid, comm) => format!("{n} is open by {pid} ({comm})"),
        }
    }
}

/// Everything found using some block devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub found: Vec<Found>,
    /// Processes whose open files could not be read (permission).
    pub uninspected: usize,
}

impl Usage {
    /// Whether anything found refuses an unbind or move without `--force`.
    pub fn refuses(&self) -> bool {
        self.found.iter().any(|f| f.what.refuses())
    }
}

/// Undoes the octal escapes (`\040`) of mountinfo and swaps fields.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = u32::from(oct[0] - b'0') * 64
                    + u32::from(oct[1] - b'0') * 8
                    + u32::from(oct[2] - b'0');
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points of `/proc/self/mountinfo` text whose device is `b` (by number, or by source
/// path for file systems that report an anonymous device number, such as btrfs).
fn mounts_of(mountinfo: &str, b: &Block) -> Vec<String> {
    let devno = format!("{}:{}", b.major, b.minor);
    let node = b.node.to_string_lossy();
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 5 {
            continue;
        }
        let source = f
            .iter()
            .position(|x| *x == "-")
            .and_then(|i| f.get(i + 2))
            .map(|s| unescape(s));
        if f[2] == devno || source.as_deref() == Some(node.as_ref()) {
            let mp = unescape(f[4]);
            if !out.contains(&mp) {
                out.push(mp);
            }
        }
    }
    out
}

/// Whether `b` is an active swap area of `/proc/swaps` text.
fn is_swap(swaps: &str, b: &Block) -> bool {
    swaps.lines().skip(1).any(|l| {
        let Some(f) = l.split_whitespace().next() else {
            return false;
        };
        let f = unescape(f);
        Path::new(&f) == b.node || rdev_is(Path::new(&f), b)
    })
}

/// Whether `p` (followed) is the block device `b`.
fn rdev_is(p: &Path, b: &Block) -> bool {
    fs::metadata(p)
        .is_ok_and(|m| m.file_type().is_block_device() && dev_split(m.rdev()) == (b.major, b.minor))
}

/// The holders of `b` (`holders/` in its sysfs directory).
fn holders_of(b: &Block) -> Vec<String> {
    let Ok(rd) = fs::read_dir(b.sysdir.join("holders")) else {
        return Vec::new();
    };
    let mut h: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    h.sort();
    h
}

/// Processes with one of `blocks` open: (block index, pid, comm); and how many processes'
/// open files could not be read.
fn openers(roots: &Roots, blocks: &[&Block]) -> (Vec<(usize, u32, String)>, usize) {
    let mut out = Vec::new();
    let mut uninspected = 0;
    let Ok(rd) = fs::read_dir(&roots.proc) else {
        return (out, 0);
    };
    let mut pids: Vec<u32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let pdir = roots.proc.join(pid.to_string());
        let fds = match fs::read_dir(pdir.join("fd")) {
            Ok(fds) => fds,
            // Gone since the listing: not a user.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => {
                uninspected += 1;
                continue;
            }
        };
        let mut hit = vec![false; blocks.len()];
        for fd in fds.flatten() {
            let p = fd.path();
            let Ok(target) = fs::read_link(&p) else {
                continue; // closed since the listing
            };
            // Sockets, pipes and anonymous inodes ("socket:[..]") are no block devices; a
            // node of another name (another /dev, a container's) is found by its number.
            let is_path = target.is_absolute();
            for (i, b) in blocks.iter().enumerate() {
                if !hit[i] && (target == b.node || (is_path && rdev_is(&p, b))) {
                    hit[i] = true;
                }
            }
        }
        if hit.iter().any(|h| *h) {
            let comm = read_trim(&pdir.join("comm")).unwrap_or_else(|| "?".into());
            for (i, _) in hit.iter().enumerate().filter(|(_, h)| **h) {
                out.push((i, pid, comm.clone()));
            }
        }
    }
    (out, uninspected)
}

/// Who uses the disks (and their partitions): mounts, swap, holders, open files.
pub fn usage(roots: &Roots, disks: &[Disk]) -> Usage {
    let blocks: Vec<&Block> = disks.iter().flat_map(Disk::all).collect();
    let mut u = Usage::default();
    if blocks.is_empty() {
        return u;
    }
    let mountinfo = fs::read_to_string(roots.proc.join("self/mountinfo")).unwrap_or_default();
    let swaps = fs::read_to_string(roots.proc.join("swaps")).unwrap_or_default();
    for b in &blocks {
        for m in mounts_of(&mountinfo, b) {
            u.found.push(Found {
                node: b.node.clone(),
                what: Use::Mounted(m),
            });
        }
        if is_swap(&swaps, b) {
            u.found.push(Found {
                node: b.node.clone(),
                what: Use::Swap,
            });
        }
        for h in holders_of(b) {
            u.found.push(Found {
                node: b.node.clone(),
                what: Use::Held(h),
            });
        }
    }
    let (open, uninspected) = openers(roots, &blocks);
    for (i, pid, comm) in open {
        u.found.push(Found {
            node: blocks[i].node.clone(),
            what: Use::Open(pid, comm),
        });
    }
    u.uninspected = uninspected;
    u
}

/// What to do about a function whose block devices are in use.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing found: go ahead quietly.
    Proceed,
    /// Go ahead, warning about what was found (open only, or `--force`).
    Warn,
    /// Do not take it away.
    Refuse,
}

/// The decision for `u`: refuse on a mount, swap or holder unless `force`.
pub fn decide(u: &Usage, force: bool) -> Decision {
    if u.refuses() && !force {
        Decision::Refuse
    } else if u.found.is_empty() && u.uninspected == 0 {
        Decision::Proceed
    } else {
        Decision::Warn
    }
}

#[cfg(test)]
mod tests;
