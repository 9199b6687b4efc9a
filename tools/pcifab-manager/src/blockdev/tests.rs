// SPDX-License-Identifier: GPL-2.0-only

//! Block device discovery and in-use checks against fake sysfs, procfs and /dev trees.

use super::*;
use std::os::unix::fs::symlink;

/// A fake root with `sys/`, `proc/` and `dev/`, removed when dropped.
struct Tree {
    root: PathBuf,
}

const PCI: &str = "sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:01.0/0000:03:00.0";

impl Tree {
    fn new(name: &str) -> Self {
        let root =
            std::env::temp_dir().join(format!("pcifab-blockdev-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for d in [
            "sys/class/block",
            "sys/class/nvme",
            "sys/bus/pci/devices",
            "proc/self",
            "dev",
        ] {
            fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        Self { root }
    }

    fn roots(&self) -> Roots {
        Roots {
            sys: self.root.join("sys"),
            proc: self.root.join("proc"),
            dev: self.root.join("dev"),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn file(&self, rel: &str, text: &str) {
        let p = self.p(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }

    fn link(&self, rel: &str, target: &Path) {
        let p = self.p(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        symlink(target, p).expect("symlink");
    }

    /// A sysfs device directory of `subsystem`, with the links real sysfs has back up the
    /// tree (`device`, `subsystem`) so a walk that followed them would loop.
    fn device(&self, rel: &str, subsystem: &str) {
        fs::create_dir_all(self.p(rel)).expect("mkdir");
        fs::create_dir_all(self.p(&format!("sys/class/{subsystem}"))).expect("mkdir");
        self.link(
            &format!("{rel}/subsystem"),
            &self.p(&format!("sys/class/{subsystem}")),
        );
        let parent = self.p(rel).parent().expect("parent").to_path_buf();
        self.link(&format!("{rel}/device"), &parent);
    }

    /// A block device (disk, or partition if `part`), registered in `/sys/class/block`;
    /// `dev` None makes a hidden one.
    fn block(&self, rel: &str, dev: Option<&str>, part: bool) {
        self.device(rel, "block");
        let name = Path::new(rel).file_name().expect("name").to_string_lossy();
        if let Some(d) = dev {
            self.file(&format!("{rel}/dev"), &format!("{d}\n"));
            self.file(
                &format!("{rel}/uevent"),
                &format!("MAJOR=1\nDEVNAME={name}\n"),
            );
        }
        if part {
            self.file(&format!("{rel}/partition"), "1\n");
        }
        fs::create_dir_all(self.p(&format!("{rel}/holders"))).expect("mkdir");
        self.link(&format!("sys/class/block/{name}"), &self.p(rel));
    }

    /// The PCI function 0000:03:00.0 of class `class`.
    fn pci(&self, class: &str) -> PathBuf {
        self.device(PCI, "pci");
        self.file(&format!("{PCI}/class"), &format!("{class}\n"));
        self.link("sys/bus/pci/devices/0000:03:00.0", &self.p(PCI));
        self.p(PCI)
    }

    /// An NVMe controller with namespace nvme0n1 (259:0) and partitions p1, p2; nodes in /dev.
    fn nvme(&self) -> PathBuf {
        let pci = self.pci("0x010802");
        let ctrl = format!("{PCI}/nvme/nvme0");
        self.device(&ctrl, "nvme");
        self.device(&format!("{ctrl}/ng0n1"), "nvme-generic");
        self.file(&format!("{ctrl}/ng0n1/dev"), "240:0\n");
        self.block(&format!("{ctrl}/nvme0n1"), Some("259:0"), false);
        self.block(&format!("{ctrl}/nvme0n1/nvme0n1p1"), Some("259:1"), true);
        self.block(&format!("{ctrl}/nvme0n1/nvme0n1p2"), Some("259:2"), true);
        // What real sysfs has too: a link from the disk back to the PCI device.
        self.link(&format!("{ctrl}/nvme0n1/bdi"), &pci);
        for n in ["nvme0n1", "nvme0n1p1", "nvme0n1p2"] {
            self.file(&format!("dev/{n}"), "");
        }
        pci
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn names(disks: &[Disk]) -> Vec<String> {
    disks
        .iter()
        .flat_map(Disk::all)
        .map(|b| b.name.clone())
        .collect()
}

#[test]
fn finds_an_nvme_namespace_and_its_partitions_under_the_pci_device() {
    let t = Tree::new("nvme");
    let pci = t.nvme();
    let r = t.roots();
    let disks = disks_under(&r, &pci);
    assert_eq!(names(&disks), ["nvme0n1", "nvme0n1p1", "nvme0n1p2"]);
    let d = &disks[0].disk;
    assert_eq!((d.major, d.minor), (259, 0));
    assert_eq!(d.node, t.p("dev/nvme0n1"));
    assert_eq!(disks[0].parts[1].node, t.p("dev/nvme0n1p2"));
    // Through /sys/bus/pci/devices, as bind finds it.
    let dir = pci_dir(&r, "0000:03:00.0").expect("pci dir");
    assert_eq!(disks_under(&r, &dir), disks);
}

#[test]
fn finds_a_generic_block_child_and_honours_devname() {
    let t = Tree::new("scsi");
    let pci = t.pci("0x010601");
    let sda = format!("{PCI}/ata1/host0/target0:0:0/0:0:0:0/block/sda");
    fs::create_dir_all(t.p(&format!("{PCI}/ata1/host0/target0:0:0/0:0:0:0/block"))).expect("mkdir");
    t.block(&sda, Some("8:0"), false);
    t.file(&format!("{sda}/uevent"), "MAJOR=8\nDEVNAME=disk/sda\n");
    let disks = disks_under(&t.roots(), &pci);
    assert_eq!(names(&disks), ["sda"]);
    assert_eq!(disks[0].disk.node, t.p("dev/disk/sda"));
}

#[test]
fn a_hostile_devname_is_ignored() {
    let t = Tree::new("devname");
    let pci = t.pci("0x010802");
    t.block(&format!("{PCI}/nvme/nvme0/nvme0n1"), Some("259:0"), false);
    t.file(
        &format!("{PCI}/nvme/nvme0/nvme0n1/uevent"),
        "DEVNAME=../etc/passwd\n",
    );
    assert!(disks_under(&t.roots(), &pci).is_empty());
}

#[test]
fn a_hidden_multipath_path_stands_for_its_head_disk() {
    let t = Tree::new("mpath");
    let pci = t.pci("0x010802");
    t.device(&format!("{PCI}/nvme/nvme0"), "nvme");
    t.block(&format!("{PCI}/nvme/nvme0/nvme0c0n1"), None, false);
    let head = "sys/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1";
    t.block(head, Some("259:3"), false);
    t.block(&format!("{head}/nvme0n1p1"), Some("259:4"), true);
    t.link(
        &format!("{head}/multipath/nvme0c0n1"),
        &t.p(&format!("{PCI}/nvme/nvme0/nvme0c0n1")),
    );
    let disks = disks_under(&t.roots(), &pci);
    assert_eq!(names(&disks), ["nvme0n1", "nvme0n1p1"]);
    assert_eq!(
        disks[0].disk.sysdir,
        fs::canonicalize(t.p(head)).expect("head")
    );
}

#[test]
fn class_bdf_and_driver_are_read_and_checked() {
    let t = Tree::new("class");
    let pci = t.pci("0x010802");
    assert_eq!(pci_class(&pci), Some(0x010802));
    assert!(is_storage(0x010802) && is_storage(0x010601));
    assert!(!is_storage(0x030200) && !is_storage(0x020000));
    assert_eq!(pci_driver(&pci), None);
    t.link(&format!("{PCI}/driver"), &t.p("sys/bus/pci/drivers/nvme"));
    assert_eq!(pci_driver(&pci).as_deref(), Some("nvme"));
    t.file(&format!("{PCI}/class"), "garbage\n");
    assert_eq!(pci_class(&pci), None);
    for bad in [
        "",
        "../../etc",
        "0000:03:00.0/..",
        "0000:03:00.8",
        "0000:03:20.0",
        "zzzz:03:00.0",
    ] {
        assert!(!is_bdf(bad), "{bad}");
        assert!(pci_dir(&t.roots(), bad).is_none(), "{bad}");
    }
    assert!(is_bdf("0000:03:1f.7"));
}

#[test]
fn waiting_returns_once_the_disk_and_its_node_appear() {
    let t = Tree::new("wait");
    let pci = t.pci("0x010802");
    let r = t.roots();
    let short = Duration::from_millis(50);
    assert_eq!(
        wait_disks(&r, &pci, Duration::ZERO, short),
        Appeared::TimedOut { sysfs_only: vec![] }
    );
    // sysfs shows it, the node is missing: still not there.
    t.block(&format!("{PCI}/nvme/nvme0/nvme0n1"), Some("259:0"), false);
    let start = Instant::now();
    match wait_disks(&r, &pci, Duration::from_millis(200), short) {
        Appeared::TimedOut { sysfs_only } => assert_eq!(names(&sysfs_only), ["nvme0n1"]),
        a => panic!("{a:?}"),
    }
    assert!(start.elapsed() >= Duration::from_millis(200));
    // The node appears while it waits.
    let node = t.p("dev/nvme0n1");
    let maker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        fs::write(node, "").expect("node");
    });
    let start = Instant::now();
    match wait_disks(&r, &pci, Duration::from_secs(10), short) {
        Appeared::Disks(d) => assert_eq!(names(&d), ["nvme0n1"]),
        a => panic!("{a:?}"),
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    maker.join().expect("thread");
}

#[test]
fn the_functions_behind_a_logical_port_are_found_from_the_mep() {
    let t = Tree::new("port");
    let base = "sys/devices/pci0000:00/0000:00:02.0";
    let mep = t.p(&format!("{base}/0000:01:00.1"));
    fs::create_dir_all(&mep).expect("mkdir");
    for f in [
        "0000:02:01.0/0000:03:00.0",
        "0000:02:01.0/0000:03:00.1",
        "0000:02:02.0",
    ] {
        fs::create_dir_all(t.p(&format!("{base}/0000:01:00.0/{f}"))).expect("mkdir");
    }
    // Port 3: a function; beside it on the downstream bus, not behind a port, a stray one.
    fs::create_dir_all(t.p(&format!("{base}/0000:01:00.0/0000:02:03.0/0000:04:00.0")))
        .expect("mkdir");
    fs::create_dir_all(t.p(&format!("{base}/0000:01:00.0/0000:02:03.1/0000:05:00.0")))
        .expect("mkdir");
    fs::create_dir_all(t.p(&format!("{base}/0000:01:00.0/0000:02:03.0/0000:04:01.0")))
        .expect("mkdir");
    let got: Vec<(u8, String)> = port_functions(&mep)
        .into_iter()
        .map(|f| (f.port, f.bdf))
        .collect();
    assert_eq!(
        got,
        [
            (1, "0000:03:00.0".to_string()),
            (1, "0000:03:00.1".to_string()),
            (3, "0000:04:00.0".to_string()),
        ]
    );
    let f = &port_functions(&mep)[0];
    assert_eq!(
        f.dir,
        t.p(&format!("{base}/0000:01:00.0/0000:02:01.0/0000:03:00.0"))
    );
    assert!(port_functions(&t.p("sys/devices/not-a-bdf")).is_empty());
    assert!(port_functions(&t.p(&format!("{base}/0000:01:00.0/0000:02:02.0"))).is_empty());
}

/// The nvme tree with: p1 mounted (by number), p2 swap, the disk held by dm-0 and open by
/// pid 123 (dd); pid 77's fd list unreadable.
fn busy_tree(name: &str) -> (Tree, Vec<Disk>) {
    let t = Tree::new(name);
    let pci = t.nvme();
    t.file(
        "proc/self/mountinfo",
        "22 1 0:21 / /proc rw - proc proc rw\n\
         40 22 259:1 / /mnt/my\\040data rw,relatime - ext4 /dev/nvme0n1p1 rw\n",
    );
    t.file(
        "proc/swaps",
        &format!(
            "Filename\tType\tSize\tUsed\tPriority\n{}\tpartition\t1024\t0\t-2\n",
            t.p("dev/nvme0n1p2").display()
        ),
    );
    t.link(
        &format!("{PCI}/nvme/nvme0/nvme0n1/holders/dm-0"),
        &t.p("sys/devices/virtual/block/dm-0"),
    );
    t.file("proc/123/comm", "dd\n");
    t.link("proc/123/fd/0", Path::new("/dev/null"));
    t.link("proc/123/fd/3", &t.p("dev/nvme0n1"));
    t.file("proc/124/comm", "sh\n");
    t.link("proc/124/fd/1", Path::new("/dev/null"));
    t.file("proc/77/fd", "not a directory: unreadable\n");
    t.file("proc/notapid/fd/1", "");
    let disks = disks_under(&t.roots(), &pci);
    (t, disks)
}

#[test]
fn mounts_swap_holders_and_openers_are_found() {
    let (t, disks) = busy_tree("busy");
    let u = usage(&t.roots(), &disks);
    let text: Vec<String> = u.found.iter().map(Found::describe).collect();
    let n = |d: &str| t.p(&format!("dev/{d}")).display().to_string();
    assert_eq!(
        text,
        [
            format!("{} is held by dm-0", n("nvme0n1")),
            format!("{} is mounted on /mnt/my data", n("nvme0n1p1")),
            format!("{} is in use as swap", n("nvme0n1p2")),
            format!("{} is open by 123 (dd)", n("nvme0n1")),
        ]
    );
    assert_eq!(u.uninspected, 1);
    assert!(u.refuses());
    assert_eq!(decide(&u, false), Decision::Refuse);
    assert_eq!(decide(&u, true), Decision::Warn);
}

#[test]
fn each_use_alone_decides_as_it_should() {
    let (t, disks) = busy_tree("alone");
    let r = t.roots();
    // Only the opener and the unreadable process: warn, do not refuse.
    fs::write(t.p("proc/self/mountinfo"), "").expect("write");
    fs::write(t.p("proc/swaps"), "Filename\tType\tSize\tUsed\tPriority\n").expect("write");
    fs::remove_file(t.p(&format!("{PCI}/nvme/nvme0/nvme0n1/holders/dm-0"))).expect("rm");
    let u = usage(&r, &disks);
    assert_eq!(u.found.len(), 1, "{u:?}");
    assert_eq!(u.found[0].what, Use::Open(123, "dd".into()));
    assert_eq!(decide(&u, false), Decision::Warn);
    // Nothing at all.
    fs::remove_file(t.p("proc/123/fd/3")).expect("rm");
    fs::remove_file(t.p("proc/77/fd")).expect("rm");
    let u = usage(&r, &disks);
    assert_eq!(u, Usage::default());
    assert_eq!(decide(&u, false), Decision::Proceed);
    // A partition mounted by source path only (btrfs reports an anonymous device number).
    fs::write(
        t.p("proc/self/mountinfo"),
        format!(
            "50 1 0:45 / /srv rw - btrfs {} rw\n",
            t.p("dev/nvme0n1p2").display()
        ),
    )
    .expect("write");
    let u = usage(&r, &disks);
    assert_eq!(u.found[0].what, Use::Mounted("/srv".into()));
    assert_eq!(decide(&u, false), Decision::Refuse);
    // A swap partition alone refuses; so does a holder alone.
    fs::write(t.p("proc/self/mountinfo"), "").expect("write");
    fs::write(
        t.p("proc/swaps"),
        format!(
            "Filename\tType\n{}\tpartition\n",
            t.p("dev/nvme0n1p1").display()
        ),
    )
    .expect("write");
    assert_eq!(decide(&usage(&r, &disks), false), Decision::Refuse);
    fs::write(t.p("proc/swaps"), "Filename\tType\n").expect("write");
    fs::create_dir_all(t.p(&format!("{PCI}/nvme/nvme0/nvme0n1/nvme0n1p2/holders/md0")))
        .expect("mkdir");
    let u = usage(&r, &disks);
    assert_eq!(u.found[0].what, Use::Held("md0".into()));
    assert_eq!(decide(&u, false), Decision::Refuse);
    assert_eq!(decide(&u, true), Decision::Warn);
}

#[test]
fn no_disks_means_nothing_is_read() {
    let t = Tree::new("none");
    assert_eq!(usage(&t.roots(), &[]), Usage::default());
}

#[test]
fn octal_escapes_are_undone() {
    assert_eq!(unescape("/mnt/a\\040b\\011c"), "/mnt/a b\tc");
    assert_eq!(unescape("end\\04"), "end\\04");
    assert_eq!(unescape("\\999"), "\\999");
    assert_eq!(unescape("\\777"), "\\777");
}

#[test]
fn dev_t_splits_like_glibc() {
    assert_eq!(dev_split(0x103), (1, 3));
    assert_eq!(dev_split((259 << 8) | 5), (259, 5));
    // major 4095+1, minor 256: the high parts.
    assert_eq!(dev_split((1u64 << 44) | (1 << 20)), (0x1000, 0x100));
}
