// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest fuzz`: a seeded hostile caller of `/dev/pcifab0`.
//!
//! Every step picks one operation: an ioctl of the uAPI with a struct built from a valid
//! template and then bent (size, flags, ids, timeouts, nested pointers and lengths), an ioctl
//! number nobody defined, `read`/`write`/`mmap`/`poll`/`lseek` with odd sizes and offsets,
//! closing and reopening the device, or garbage written into a writable sysfs file of the
//! driver, its PCI driver directory or the MEP's device directory. Every user pointer comes
//! from a private arena (read-write pages, an inaccessible page, a read-only page, another
//! inaccessible page) or is NULL, a kernel address, non-canonical or tiny, so whatever the
//! kernel writes lands in the arena. Calls that may block are cut short by a 150 ms SIGALRM.
//!
//! Prints one line `fuzz ioctl_calls=N splats=K changes=C` on stdout and a JSON line with the
//! seed and the per-operation errno counts on stderr; exits 1 when a splat was logged, a
//! call changed the fabric with `--unpriv`, or the device does not answer afterwards.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use pcifab_uapi::{self as u, Arg};

use super::args::Args;
use super::ioctl::{echo_answer, fd_ioctl, mrpc_arg, open_fd, ECHO};
use super::kmsg::Kmsg;
use super::mem::{AnonPages, PAGE};
use super::util::{check, errno, errno_name, json_str, num, usage, Res, Rng};

pub const USAGE: &str = "\
  fuzz --seed S --calls N [--unpriv] [--device PATH]
        N hostile ioctls (every ioctl of the uAPI with bent sizes, flags, ids, timeouts
        and pointers, and undefined ioctl numbers) mixed with read/write/mmap/poll/lseek,
        reopening the device and garbage written to the driver's writable sysfs files;
        --unpriv drops to uid/gid 65534 after opening the device and /dev/kmsg (and
        opens the device again as that user). Prints `fuzz ioctl_calls=N splats=K
        changes=C` (kernel splat lines in /dev/kmsg during the run; successful binds,
        unbinds, moves, route changes, copies and configuration commands), and a JSON
        line with the seed and every operation's errno counts on stderr
";

/// Arena pages: 0-3 read-write, 4 inaccessible, 5 read-only, 6 inaccessible.
const RW_PAGES: usize = 4;
const ARENA_PAGES: usize = 7;
const NONE_PAGE: usize = 4;
const RO_PAGE: usize = 5;
/// Argument structs start in the first two pages; nested buffers mostly in the next two.
const ARG_REGION: usize = 2 * PAGE;
/// SIGALRM after this long ends a call that blocks.
const ALARM_US: i64 = 150_000;
/// Device ids documented in Documentation/mrpc.rst (0x87, GAS write, left out).
const MRPC_KNOWN: &[u32] = &[
    0x04, 0x41, 0x81, 0x82, 0x83, 0x84, 0x85, 0x88, 0x89, 0x8d, 0xf000, 0xf001, 0xf002, 0xf003,
    0xf004, 0xf07f, 0xf080, 0xf0ff,
];
/// Bus addresses for `PCIFAB_P2P_IOVA` ends: never RAM, with or without an IOMMU.
const SAFE_IOVAS: &[u64] = &[1 << 40, 1 << 46, 0xdead_beef_0000, !0xfffu64, 1 << 63];
const KERNEL_PTRS: &[u64] = &[
    0xffff_8880_0000_0000,
    0xffff_ffff_8100_0000,
    0xffff_ffff_ffff_f000,
    u64::MAX - 7,
    0x8000_0000_0000,
    0x7fff_ffff_f000,
];
const SIZES: &[u32] = &[
    0,
    1,
    4,
    8,
    4095,
    4096,
    4097,
    0x7fff_ffff,
    0x8000_0000,
    u32::MAX,
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Version,
    Identity,
    Mrpc,
    Stats,
    Events,
    Inventory,
    Bind,
    Unbind,
    Move,
    RouteAdd,
    RouteDel,
    Routes,
    Copy,
    Distance,
    Grant,
    Revoke,
    Grants,
    Register,
    Unregister,
}

/// What a successful call does to the fabric, as Documentation/uapi.rst classes the ioctls
/// and src/chardev/dispatch.rs checks them (the capability before anything is done).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Effect {
    /// Read-only: needs only an open file; never a change.
    ReadOnly,
    /// Changes the fabric (bindings, routes, grants, device memory): needs
    /// `CAP_SYS_ADMIN`, so a success is a change and an unprivileged caller is refused.
    Changes,
    /// By command and sub-command ([`mrpc_changes`]).
    ByCommand,
}

/// The class of `kind` (no catch-all: a new ioctl must be classed here).
fn effect(kind: Kind) -> Effect {
    match kind {
        Kind::Version
        | Kind::Identity
        | Kind::Stats
        | Kind::Events
        | Kind::Inventory
        | Kind::Routes
        | Kind::Distance
        | Kind::Grants => Effect::ReadOnly,
        Kind::Bind
        | Kind::Unbind
        | Kind::Move
        | Kind::RouteAdd
        | Kind::RouteDel
        | Kind::Copy
        | Kind::Grant
        | Kind::Revoke
        | Kind::Register
        | Kind::Unregister => Effect::Changes,
        Kind::Mrpc => Effect::ByCommand,
    }
}

struct Def {
    name: &'static str,
    nr: u32,
    size: usize,
    kind: Kind,
}

fn defs() -> Vec<Def> {
    use std::mem::size_of;
    let d = |name, nr, size, kind| Def {
        name,
        nr,
        size,
        kind,
    };
    vec![
        d(
            "VERSION",
            u::PCIFAB_IOCTL_VERSION,
            size_of::<u::Version>(),
            Kind::Version,
        ),
        d(
            "IDENTITY",
            u::PCIFAB_IOCTL_IDENTITY,
            size_of::<u::Identity>(),
            Kind::Identity,
        ),
        d(
            "MRPC",
            u::PCIFAB_IOCTL_MRPC,
            size_of::<u::Mrpc>(),
            Kind::Mrpc,
        ),
        d(
            "STATS",
            u::PCIFAB_IOCTL_STATS,
            size_of::<u::Stats>(),
            Kind::Stats,
        ),
        d(
            "EVENTS",
            u::PCIFAB_IOCTL_EVENTS,
            size_of::<u::Events>(),
            Kind::Events,
        ),
        d(
            "INVENTORY",
            u::PCIFAB_IOCTL_INVENTORY,
            size_of::<u::Inventory>(),
            Kind::Inventory,
        ),
        d(
            "BIND",
            u::PCIFAB_IOCTL_BIND,
            size_of::<u::Bind>(),
            Kind::Bind,
        ),
        d(
            "UNBIND",
            u::PCIFAB_IOCTL_UNBIND,
            size_of::<u::Unbind>(),
            Kind::Unbind,
        ),
        d(
            "MOVE",
            u::PCIFAB_IOCTL_MOVE,
            size_of::<u::Move>(),
            Kind::Move,
        ),
        d(
            "P2P_ROUTE_ADD",
            u::PCIFAB_IOCTL_P2P_ROUTE_ADD,
            size_of::<u::P2pRoute>(),
            Kind::RouteAdd,
        ),
        d(
            "P2P_ROUTE_DEL",
            u::PCIFAB_IOCTL_P2P_ROUTE_DEL,
            size_of::<u::P2pRoute>(),
            Kind::RouteDel,
        ),
        d(
            "P2P_ROUTES",
            u::PCIFAB_IOCTL_P2P_ROUTES,
            size_of::<u::P2pRoutes>(),
            Kind::Routes,
        ),
        d(
            "P2P_COPY",
            u::PCIFAB_IOCTL_P2P_COPY,
            size_of::<u::P2pCopy>(),
            Kind::Copy,
        ),
        d(
            "P2P_DISTANCE",
            u::PCIFAB_IOCTL_P2P_DISTANCE,
            size_of::<u::P2pDistance>(),
            Kind::Distance,
        ),
        d(
            "P2P_GRANT",
            u::PCIFAB_IOCTL_P2P_GRANT,
            size_of::<u::P2pGrant>(),
            Kind::Grant,
        ),
        d(
            "P2P_REVOKE",
            u::PCIFAB_IOCTL_P2P_REVOKE,
            size_of::<u::P2pGrant>(),
            Kind::Revoke,
        ),
        d(
            "P2P_GRANTS",
            u::PCIFAB_IOCTL_P2P_GRANTS,
            size_of::<u::P2pGrants>(),
            Kind::Grants,
        ),
        d(
            "P2P_REGISTER",
            u::PCIFAB_IOCTL_P2P_REGISTER,
            size_of::<u::P2pBuffer>(),
            Kind::Register,
        ),
        d(
            "P2P_UNREGISTER",
            u::PCIFAB_IOCTL_P2P_UNREGISTER,
            size_of::<u::P2pBuffer>(),
            Kind::Unregister,
        ),
    ]
}

/// Byte offsets of the user pointers in `kind`'s struct (8 bytes each).
fn pointer_fields(kind: Kind) -> Vec<usize> {
    use std::mem::offset_of;
    let end = offset_of!(u::P2pEnd, addr);
    match kind {
        Kind::Mrpc => vec![offset_of!(u::Mrpc, in_ptr), offset_of!(u::Mrpc, out_ptr)],
        Kind::Inventory => vec![
            offset_of!(u::Inventory, ports_ptr),
            offset_of!(u::Inventory, functions_ptr),
        ],
        Kind::Routes => vec![offset_of!(u::P2pRoutes, routes_ptr)],
        Kind::Grants => vec![offset_of!(u::P2pGrants, grants_ptr)],
        Kind::Register | Kind::Unregister => vec![offset_of!(u::P2pBuffer, addr)],
        Kind::Copy => vec![
            offset_of!(u::P2pCopy, src) + end,
            offset_of!(u::P2pCopy, dst) + end,
        ],
        _ => Vec::new(),
    }
}

// ------------------------------------------------------------------ arena

/// The fuzzer's memory: every pointer handed to the kernel points in here (or nowhere).
struct Arena {
    mem: AnonPages,
}

impl Arena {
    fn new() -> Res<Arena> {
        let a = Arena {
            mem: AnonPages::new(ARENA_PAGES)?,
        };
        a.protect(NONE_PAGE, libc::PROT_NONE)?;
        a.protect(RO_PAGE, libc::PROT_READ)?;
        a.protect(6, libc::PROT_NONE)?;
        Ok(a)
    }

    fn base(&self) -> *mut u8 {
        self.mem.base()
    }

    fn protect(&self, page: usize, prot: i32) -> Res<()> {
        self.mem.protect(page, prot)
    }

    fn addr(&self, off: usize) -> u64 {
        self.base() as u64 + off as u64
    }

    /// Up to `n` bytes at user address `ptr` when it lies in a readable page of the arena
    /// (cut at the end of that readable run); nothing for any other address.
    fn bytes_at(&self, ptr: u64, n: usize) -> Vec<u8> {
        let base = self.addr(0);
        let readable = [(0, RW_PAGES * PAGE), (RO_PAGE * PAGE, (RO_PAGE + 1) * PAGE)];
        for (lo, hi) in readable {
            if ptr >= base + lo as u64 && ptr < base + hi as u64 {
                let off = (ptr - base) as usize;
                let n = n.min(hi - off);
                // SAFETY: `off..off + n` lies in pages mapped readable by `new` for the
                // arena's lifetime; nothing writes them while this copy is made.
                return unsafe { std::slice::from_raw_parts(self.base().add(off), n) }.to_vec();
            }
        }
        Vec::new()
    }

    /// The read-write pages.
    fn rw(&mut self) -> &mut [u8] {
        // SAFETY: the first RW_PAGES pages are read-write and only reached through `&mut`.
        unsafe { std::slice::from_raw_parts_mut(self.base(), RW_PAGES * PAGE) }
    }

    /// Puts `bytes` at `off` of the read-only page.
    fn write_read_only(&mut self, off: usize, bytes: &[u8]) -> Res<()> {
        let n = bytes.len().min(PAGE - off);
        self.protect(RO_PAGE, libc::PROT_READ | libc::PROT_WRITE)?;
        // SAFETY: the page is writable now and `off + n` stays inside it.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base().add(RO_PAGE * PAGE + off), n)
        };
        self.protect(RO_PAGE, libc::PROT_READ)
    }
}

/// Where an argument struct went.
enum Place {
    /// At this offset of the read-write pages; bytes that would cross into the inaccessible
    /// page are dropped.
    Rw(usize),
    /// At this offset of the read-only page.
    ReadOnly(usize),
    /// Nowhere the fuzzer can write: the pointer is bad by design.
    Bad,
}

// ------------------------------------------------------------------- sysfs

/// A writable sysfs file and what may be written to it.
struct SysFile {
    path: String,
    /// Garbage only, never a parsable value (driver-core files whose valid values would
    /// rebind devices or send uevents, and the driver's view age).
    garbage_only: bool,
}

/// Why a writable file is left alone, if it is.
fn sysfs_deny(dir_kind: &str, rel: &str) -> Option<&'static str> {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    match (dir_kind, name) {
        ("mep", "remove" | "rescan" | "reset" | "driver_override") => {
            Some("removes, rescans or resets the MEP, or steers its driver")
        }
        ("mep", "config") => Some("the MEP's config space: would turn off decoding or move BARs"),
        ("mep", "enable") => Some("disabling the MEP under its bound driver tears the test down"),
        ("mep", "control") if rel.starts_with("power/") => {
            Some("runtime-suspending the MEP tears the test down")
        }
        ("mep", n) if n.starts_with("resource") || n == "rom" => {
            Some("raw BAR access, not an interface of the driver")
        }
        ("driver", "bind" | "unbind") => Some("driver-core bind/unbind of the MEP"),
        _ => None,
    }
}

fn walk(
    dir: &str,
    rel: &str,
    depth: usize,
    kind: &str,
    out: &mut Vec<SysFile>,
    skipped: &mut Vec<(String, &'static str)>,
) {
    let Ok(rd) = std::fs::read_dir(format!("{dir}/{rel}")) else {
        return;
    };
    let mut names: Vec<_> = rd.flatten().collect();
    names.sort_by_key(|e| e.file_name());
    for e in names {
        let name = e.file_name().to_string_lossy().into_owned();
        let r = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let Ok(md) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        let ft = md.file_type();
        if ft.is_symlink() {
            continue;
        }
        if ft.is_dir() {
            if depth > 0 {
                walk(dir, &r, depth - 1, kind, out, skipped);
            }
            continue;
        }
        use std::os::unix::fs::PermissionsExt;
        if md.permissions().mode() & 0o222 == 0 {
            continue;
        }
        let path = format!("{dir}/{r}");
        if let Some(why) = sysfs_deny(kind, &r) {
            skipped.push((path, why));
            continue;
        }
        // view_max_age_ms: a valid value would change how stale a view the driver serves to
        // every later scenario of the run; garbage still goes through its parser.
        let garbage_only = matches!(
            name.as_str(),
            "uevent" | "new_id" | "remove_id" | "view_max_age_ms"
        );
        out.push(SysFile { path, garbage_only });
    }
}

/// Writable sysfs files of the device, its PCI driver and the MEP (symlinks not followed).
fn sysfs_files(misc: &str) -> (Vec<SysFile>, Vec<(String, &'static str)>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let canon = |p: &str| {
        std::fs::canonicalize(p)
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    };
    let misc_dir = canon(misc);
    let mep_dir = canon(&format!("{misc}/device"));
    if let Some(d) = &misc_dir {
        walk(d, "", 3, "misc", &mut out, &mut skipped);
    }
    if let Some(d) = canon("/sys/bus/pci/drivers/pcifab") {
        walk(&d, "", 1, "driver", &mut out, &mut skipped);
    }
    if let Some(d) = &mep_dir {
        // The misc device lives below the MEP; it is in the lists already.
        let (mut mep, mut mep_skipped) = (Vec::new(), Vec::new());
        walk(d, "", 2, "mep", &mut mep, &mut mep_skipped);
        let below_misc = |p: &str| misc_dir.as_deref().is_some_and(|m| p.starts_with(m));
        out.extend(mep.into_iter().filter(|f| !below_misc(&f.path)));
        skipped.extend(mep_skipped.into_iter().filter(|(p, _)| !below_misc(p)));
    }
    (out, skipped)
}

// -------------------------------------------------------------- the state

struct Fuzz {
    rng: Rng,
    arena: Arena,
    defs: Vec<Def>,
    path: String,
    /// Open descriptors of the device (at least one while the run goes on).
    fds: Vec<i32>,
    unpriv: bool,
    pdfids: Vec<u16>,
    hosts: u16,
    /// HFIDs of this host's DMA endpoints (`pcifab/hfid` in sysfs): peers are named near
    /// them.
    hfids: Vec<u16>,
    /// (peer, slot) of the last successful REGISTERs, for UNREGISTER to name.
    registered: Vec<(u16, u8)>,
    sys: Vec<SysFile>,
    /// errno counts per operation: name -> errno name -> count.
    counts: BTreeMap<String, BTreeMap<String, u64>>,
    ioctl_calls: u64,
    other_calls: u64,
    changes: u64,
    change_log: Vec<String>,
    alarms: u64,
    /// The last MRPC command sent and the first bytes of its input, as the kernel read them.
    mrpc_sent: (u32, Vec<u8>),
}

extern "C" fn on_alarm(_: libc::c_int) {}

/// SIGALRM does nothing but end a blocked call: no SA_RESTART, so it fails with EINTR.
fn install_alarm() {
    // SAFETY: installs a handler that does nothing.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
    }
}

fn arm(us: i64) {
    let it = libc::itimerval {
        it_interval: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        it_value: libc::timeval {
            tv_sec: us / 1_000_000,
            tv_usec: (us % 1_000_000) as _,
        },
    };
    // SAFETY: `it` is a valid timer value; the old value is not wanted.
    unsafe { libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) };
}

/// The arena's base and the step in progress, for the crash report.
static CRASH_ARENA: AtomicU64 = AtomicU64::new(0);
static CRASH_STEP: AtomicU64 = AtomicU64::new(0);
static CRASH_OP: AtomicU64 = AtomicU64::new(0);

/// Appends `v` in hex to `buf` at `at`; returns the new end. Async-signal-safe.
fn put_hex(buf: &mut [u8], mut at: usize, v: u64) -> usize {
    for i in (0..16).rev() {
        if at < buf.len() {
            buf[at] = b"0123456789abcdef"[((v >> (i * 4)) & 0xf) as usize];
            at += 1;
        }
    }
    at
}

/// A fault in the fuzzer itself (SIGSEGV, SIGBUS): one line on stderr with the address,
/// the instruction, the arena and the step, then the default action (the kernel logs its
/// own "segfault at" line too). Only async-signal-safe calls.
extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let mut buf = [0u8; 160];
    let mut n = 0;
    for (label, v) in [
        ("\n[pcifab-selftest fuzz: signal ", sig as u64),
        (" addr ", {
            // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
            unsafe { (*info).si_addr() as u64 }
        }),
        (" ip ", {
            // SAFETY: the kernel passes the interrupted context as a ucontext_t.
            unsafe {
                (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RIP as usize] as u64
            }
        }),
        (" arena ", CRASH_ARENA.load(Relaxed)),
        (" step ", CRASH_STEP.load(Relaxed)),
        (" op ", CRASH_OP.load(Relaxed)),
    ] {
        for &b in label.as_bytes() {
            if n < buf.len() {
                buf[n] = b;
                n += 1;
            }
        }
        n = put_hex(&mut buf, n, v);
    }
    if n < buf.len() {
        buf[n] = b']';
        n += 1;
    }
    // SAFETY: write(2) and signal(2) are async-signal-safe; `buf` holds `n` bytes.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
        libc::signal(sig, libc::SIG_DFL);
    }
    // Returning runs the faulting instruction again, now with the default action.
}

/// Reports SIGSEGV and SIGBUS of the fuzzer (see [`on_fault`]), on the alternate stack
/// the Rust runtime set up for the main thread, if any.
fn install_fault_report() {
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: installs a handler that makes only async-signal-safe calls.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fault as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Result of a raw call: Ok(return value) or the errno.
fn ret(rc: isize) -> Result<isize, i32> {
    if rc < 0 {
        Err(errno())
    } else {
        Ok(rc)
    }
}

fn put(b: &mut [u8], off: usize, v: &[u8]) {
    if off < b.len() {
        let n = v.len().min(b.len() - off);
        b[off..off + n].copy_from_slice(&v[..n]);
    }
}

impl Fuzz {
    fn new(
        seed: u64,
        path: &str,
        fds: Vec<i32>,
        pdfids: Vec<u16>,
        hosts: u16,
        sys: Vec<SysFile>,
    ) -> Res<Fuzz> {
        let mut z = Fuzz {
            rng: Rng::new(seed),
            arena: Arena::new()?,
            defs: defs(),
            path: path.to_string(),
            fds,
            unpriv: false,
            pdfids,
            hosts,
            hfids: Vec::new(),
            registered: Vec::new(),
            sys,
            counts: BTreeMap::new(),
            ioctl_calls: 0,
            other_calls: 0,
            changes: 0,
            change_log: Vec::new(),
            alarms: 0,
            mrpc_sent: (0, Vec::new()),
        };
        CRASH_ARENA.store(z.arena.addr(0), Relaxed);
        z.arena.rw().fill(0);
        Ok(z)
    }

    /// One operation: mostly a uAPI ioctl, then undefined ioctls, other calls, sysfs.
    fn step(&mut self) -> Res<()> {
        CRASH_STEP.fetch_add(1, Relaxed);
        match self.rng.below(1000) {
            0..=899 => self.one_ioctl()?,
            900..=939 => self.random_ioctl(),
            940..=996 => self.other(),
            _ => self.sysfs_write(),
        }
        Ok(())
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.rng.below(v.len() as u64) as usize]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.rng.below(100) < percent
    }

    fn count(&mut self, op: &str, r: Result<isize, i32>) {
        let e = match r {
            Ok(_) => "ok".to_string(),
            Err(e) => errno_name(e),
        };
        *self
            .counts
            .entry(op.to_string())
            .or_default()
            .entry(e)
            .or_default() += 1;
    }

    fn fd(&mut self) -> i32 {
        let i = self.rng.below(self.fds.len() as u64) as usize;
        self.fds[i]
    }

    fn pdfid(&mut self) -> u16 {
        match self.rng.below(10) {
            0..=5 if !self.pdfids.is_empty() => {
                self.pdfids[self.rng.below(self.pdfids.len() as u64) as usize]
            }
            6 => self.pick(&[0, 0xffff, 0x00ff, 0x0100, 0x06ff, 0x0700, 0x0305, 0x8300]),
            _ => self.rng.next() as u16,
        }
    }

    fn host(&mut self) -> u8 {
        match self.rng.below(10) {
            0..=5 => self.rng.below(u64::from(self.hosts.max(1))) as u8,
            6 => self.hosts as u8,
            7 => self.pick(&[0xfe, 0xff, 0x80, 7, 8]),
            _ => self.rng.next() as u8,
        }
    }

    /// A peer host's HFID: mostly one next to this host's own (the emulator numbers hosts
    /// from 0x0a01), sometimes this host's own (`EINVAL`), sometimes anything.
    fn hfid(&mut self) -> u16 {
        let own = if self.hfids.is_empty() {
            0x0a01
        } else {
            self.hfids[self.rng.below(self.hfids.len() as u64) as usize]
        };
        match self.rng.below(10) {
            // own - 1, own + 1, own + 2.
            0..=5 => own.wrapping_add(self.pick(&[0xffff, 1, 2])),
            6 => own,
            7 => self.pick(&[0, 0xffff, 0x0a00, 0x0b01, 0x8000]),
            _ => self.rng.next() as u16,
        }
    }

    /// A peer's buffer slot: mostly one of its 6, sometimes past them.
    fn slot(&mut self) -> u8 {
        match self.rng.below(10) {
            0..=6 => self.rng.below(u64::from(u::P2P_PEER_SLOTS)) as u8,
            7 => self.pick(&[u::P2P_PEER_SLOTS, 7, 0x80, 0xff]),
            _ => self.rng.next() as u8,
        }
    }

    fn port(&mut self) -> u8 {
        match self.rng.below(10) {
            0..=4 => self.rng.below(4) as u8,
            5..=6 => u::ANY_PORT,
            7 => self.pick(&[4, 5, 0xfe, 0x80]),
            _ => self.rng.next() as u8,
        }
    }

    /// A short timeout mostly, sometimes 0 (the kernel's default) or out of range.
    fn timeout(&mut self, max: u32) -> u32 {
        match self.rng.below(20) {
            0..=11 => self.pick(&[1, 2, 5, 10, 20, 50]),
            12..=13 => 0,
            14 => max,
            15 => max.wrapping_add(1),
            16 => u32::MAX,
            _ => self.rng.below(200) as u32,
        }
    }

    fn len_u32(&mut self, exact: u32) -> u32 {
        match self.rng.below(10) {
            0..=3 => exact,
            4 => exact.wrapping_sub(1),
            5 => exact.wrapping_add(1),
            6..=7 => self.pick(SIZES),
            _ => self.rng.below(u64::from(exact.max(1)) * 2 + 1) as u32,
        }
    }

    /// A pointer for a nested buffer of `len` bytes: mostly inside the read-write pages.
    fn buf_ptr(&mut self, len: usize) -> u64 {
        let rw = RW_PAGES * PAGE;
        match self.rng.below(20) {
            0..=12 => {
                let room = rw.saturating_sub(len.min(rw));
                let lo = if room > ARG_REGION { ARG_REGION } else { 0 };
                let off = lo + self.rng.below((room - lo) as u64 + 1) as usize;
                self.arena.addr(off & !7)
            }
            13 => self.arena.addr(rw - len.clamp(1, rw) / 2),
            14 => self
                .arena
                .addr(RO_PAGE * PAGE + self.rng.below(PAGE as u64) as usize),
            15 => self.arena.addr(NONE_PAGE * PAGE),
            16 => 0,
            17 => self.pick(KERNEL_PTRS),
            18 => self.arena.addr(1 + self.rng.below(rw as u64 - 1) as usize),
            _ => self.rng.next(),
        }
    }

    /// Chooses where the argument struct of `size` bytes goes; returns the pointer.
    fn arg_place(&mut self, size: usize) -> (u64, Place) {
        match self.rng.below(40) {
            0..=27 => {
                let off = (self.rng.below((ARG_REGION / 8) as u64) as usize) * 8;
                (self.arena.addr(off), Place::Rw(off))
            }
            28..=29 => {
                let off = self.rng.below((ARG_REGION - 8) as u64) as usize | 1;
                (self.arena.addr(off), Place::Rw(off))
            }
            30..=31 => {
                // Truncated at the page boundary before the inaccessible page.
                let k = 1 + self.rng.below(size.max(2) as u64 - 1) as usize;
                let off = RW_PAGES * PAGE - k;
                (self.arena.addr(off), Place::Rw(off))
            }
            32..=33 => {
                let off = (self.rng.below(((PAGE - 256) / 8) as u64) as usize) * 8;
                (self.arena.addr(RO_PAGE * PAGE + off), Place::ReadOnly(off))
            }
            34 => (0, Place::Bad),
            35 => (self.arena.addr(NONE_PAGE * PAGE + 8), Place::Bad),
            36 => (self.pick(KERNEL_PTRS), Place::Bad),
            37 => (self.pick(&[1u64, 0xfff, 0x1_0000]), Place::Bad),
            38 => (
                self.arena.addr(6 * PAGE - 4), // read-only tail, then inaccessible
                Place::ReadOnly(PAGE - 4),
            ),
            _ => (self.rng.next(), Place::Bad),
        }
    }

    // ----------------------------------------------------------- ioctls

    /// The struct's bytes (valid template, then bent), its pointer and the call.
    fn one_ioctl(&mut self) -> Res<()> {
        // BIND, UNBIND and MOVE hot-plug functions when they get through, which takes
        // seconds under TCG: one tenth of the weight of the others.
        let weight = |k: Kind| {
            if matches!(k, Kind::Bind | Kind::Unbind | Kind::Move) {
                1
            } else {
                10
            }
        };
        let total: u64 = self.defs.iter().map(|d| weight(d.kind)).sum();
        let mut pick = self.rng.below(total);
        let mut i = 0;
        while pick >= weight(self.defs[i].kind) {
            pick -= weight(self.defs[i].kind);
            i += 1;
        }
        let (name, nr, sz, kind) = {
            let d = &self.defs[i];
            (d.name, d.nr, d.size, d.kind)
        };
        let mut b = vec![0u8; sz];
        // The size field.
        let size = match self.rng.below(20) {
            0..=11 => sz as u32,
            12 => 0,
            13 => self.pick(&[4u32, 8]),
            14 => sz as u32 - 1,
            15 => sz as u32 + 1,
            16 => self.pick(&[sz as u32 + 8, 4096, 4097]),
            17 => self.pick(&[u32::MAX, 0x8000_0000, 0x1_0000]),
            18 => 4096,
            _ => self.rng.below(300) as u32,
        };
        put(&mut b, 0, &size.to_le_bytes());
        let flags = match self.rng.below(20) {
            0..=13 => 0u32,
            14..=15 => 1,
            16 => 2,
            17 => 0x8000_0000,
            _ => self.rng.next() as u32,
        };
        put(&mut b, 4, &flags.to_le_bytes());
        let blocking = self.body(kind, &mut b)?;
        // Corrupt a few bytes past size and flags now and then; never a byte of a user
        // pointer, which would aim the kernel at the fuzzer's own memory (pointers are bent
        // by `buf_ptr` instead).
        if self.chance(8) && sz > 8 {
            let pointers = pointer_fields(kind);
            for _ in 0..1 + self.rng.below(3) {
                let at = 8 + self.rng.below((sz - 8) as u64) as usize;
                if !pointers.iter().any(|&o| (o..o + 8).contains(&at)) {
                    b[at] = self.rng.next() as u8;
                }
            }
        }
        let (ptr, place) = self.arg_place(sz);
        // Bytes after the struct up to `size`: zero them (accepted) or leave what is there.
        let zero_tail = self.chance(60);
        match place {
            Place::Rw(off) => {
                let rw = self.arena.rw();
                let end = (off + sz).min(rw.len());
                rw[off..end].copy_from_slice(&b[..end - off]);
                if zero_tail && (size as usize) > sz {
                    let tail_end = (off + size as usize).min(rw.len());
                    if end < tail_end {
                        rw[end..tail_end].fill(0);
                    }
                }
            }
            Place::ReadOnly(off) => self.arena.write_read_only(off, &b)?,
            Place::Bad => {}
        }
        if kind == Kind::Mrpc {
            let rd = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
            let (cmd, in_len, in_ptr) = (rd(8) as u32, (rd(8) >> 32) as usize, rd(24));
            self.mrpc_sent = (cmd, self.arena.bytes_at(in_ptr, in_len.min(8)));
        }
        let fd = self.fd();
        if blocking {
            arm(ALARM_US);
        }
        // SAFETY: the pointer is into the arena (any byte the kernel writes lands there) or
        // bad by design; the kernel must reject bad ones.
        CRASH_OP.store(u64::from(nr), Relaxed);
        let rc = ret(unsafe { libc::ioctl(fd, nr as _, ptr) } as isize);
        if blocking {
            arm(0);
        }
        if rc == Err(libc::EINTR) {
            self.alarms += 1;
        }
        self.ioctl_calls += 1;
        if rc.is_ok() {
            // The struct as the kernel left it, where the fuzzer can read it.
            let after = match place {
                Place::Rw(off) if off + sz <= RW_PAGES * PAGE => {
                    self.arena.rw()[off..off + sz].to_vec()
                }
                _ => b.clone(),
            };
            self.note_change(kind, &after);
        }
        self.count(name, rc);
        Ok(())
    }

    /// Counts a successful call that changes the fabric.
    fn note_change(&mut self, kind: Kind, b: &[u8]) {
        let rd16 = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let rd32 = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let what = match (effect(kind), kind) {
            (Effect::ReadOnly, _) => return,
            (_, Kind::Bind) => format!("BIND {:#06x} host {}", rd16(8), b[10]),
            (_, Kind::Unbind) => format!("UNBIND {:#06x}", rd16(8)),
            (_, Kind::Move) => format!("MOVE {:#06x} host {}", rd16(8), b[10]),
            (_, Kind::RouteAdd) => format!("P2P_ROUTE_ADD to {:#06x}", rd16(32)),
            (_, Kind::RouteDel) => "P2P_ROUTE_DEL".to_string(),
            (_, Kind::Copy) => "P2P_COPY".to_string(),
            (_, Kind::Register) => {
                if self.registered.len() >= 16 {
                    self.registered.remove(0);
                }
                self.registered.push((rd16(8), b[10]));
                format!("P2P_REGISTER for {:#06x} slot {}", rd16(8), b[10])
            }
            (_, Kind::Unregister) => format!("P2P_UNREGISTER {:#06x} slot {}", rd16(8), b[10]),
            (_, Kind::Grant) => format!("P2P_GRANT {:#06x} to host {}", rd16(8), b[10]),
            (_, Kind::Revoke) => format!("P2P_REVOKE {:#06x} from host {}", rd16(8), b[10]),
            (Effect::ByCommand, _) => {
                // The command as sent, with the input the kernel read before the call (the
                // output may land on top of it), that the firmware completed.
                let cmd = self.mrpc_sent.0;
                let (status, ret) = (rd32(40), rd32(44));
                if !mrpc_changes(cmd, &self.mrpc_sent.1)
                    || status != u::MRPC_STATUS_DONE
                    || ret != 0
                {
                    return;
                }
                format!("MRPC {cmd:#x}")
            }
            (Effect::Changes, _) => format!("{kind:?}"),
        };
        self.changes += 1;
        if self.change_log.len() < 50 {
            self.change_log.push(what);
        }
    }

    /// Fills the body of the struct (after size and flags); returns whether the call may
    /// block.
    fn body(&mut self, kind: Kind, b: &mut [u8]) -> Res<bool> {
        Ok(match kind {
            Kind::Version | Kind::Identity | Kind::Stats => false,
            Kind::Mrpc => {
                let cmd = match self.rng.below(10) {
                    0..=6 => self.pick(MRPC_KNOWN),
                    7 => self.pick(MRPC_KNOWN) | ((self.rng.below(0xffff) as u32 + 1) << 16),
                    _ => loop {
                        let c = self.rng.next() as u32;
                        let c = if self.chance(50) { c & 0xffff } else { c };
                        if !MRPC_KNOWN.contains(&(c & 0xffff)) && c & 0xffff != 0x87 {
                            break c;
                        }
                    },
                };
                let in_len = match self.rng.below(10) {
                    0..=5 => self.rng.below(65) as u32,
                    6 => self.rng.below(1025) as u32,
                    7 => 1024,
                    _ => self.len_u32(1024),
                };
                let out_len = match self.rng.below(10) {
                    0..=5 => self.rng.below(129) as u32,
                    6 => 1024,
                    _ => self.len_u32(1024),
                };
                let in_ptr = self.buf_ptr(in_len as usize);
                let out_ptr = self.buf_ptr(out_len as usize);
                self.mrpc_input(cmd, in_ptr, in_len as usize);
                let timeout = self.timeout(u::MRPC_MAX_TIMEOUT_MS);
                put(b, 8, &cmd.to_le_bytes());
                put(b, 12, &in_len.to_le_bytes());
                put(b, 16, &out_len.to_le_bytes());
                put(b, 20, &timeout.to_le_bytes());
                put(b, 24, &in_ptr.to_le_bytes());
                put(b, 32, &out_ptr.to_le_bytes());
                true
            }
            Kind::Events => {
                let timeout = self.timeout(1000);
                let seen: u64 = match self.rng.below(6) {
                    0 => 0,
                    1 => u64::MAX,
                    2 => self.rng.below(100),
                    _ => self.rng.next(),
                };
                put(b, 8, &timeout.to_le_bytes());
                if self.chance(5) {
                    put(b, 12, &(self.rng.next() as u32).to_le_bytes());
                }
                put(b, 16, &seen.to_le_bytes());
                true
            }
            Kind::Inventory => {
                let nports = self.pick(&[0u32, 1, 4, 8, 64, 0x1000_0000, u32::MAX]);
                let nfns = self.pick(&[0u32, 1, 10, 64, 256, 0x1000_0000, u32::MAX]);
                let psize = self.len_u32(8);
                let fsize = self.len_u32(24);
                let pp = self.buf_ptr((nports as usize).saturating_mul(psize as usize));
                let fp = self.buf_ptr((nfns as usize).saturating_mul(fsize as usize));
                put(b, 16, &nports.to_le_bytes());
                put(b, 20, &nfns.to_le_bytes());
                put(b, 24, &psize.to_le_bytes());
                put(b, 28, &fsize.to_le_bytes());
                put(b, 32, &pp.to_le_bytes());
                put(b, 40, &fp.to_le_bytes());
                false
            }
            Kind::Bind | Kind::Move => {
                let pdfid = self.pdfid();
                let host = self.host();
                let port = self.port();
                let timeout = self.timeout(u::BIND_MAX_TIMEOUT_MS);
                put(b, 8, &pdfid.to_le_bytes());
                b[10] = host;
                b[11] = port;
                put(b, 12, &timeout.to_le_bytes());
                if kind == Kind::Move && self.chance(5) {
                    put(b, 42, &(self.rng.next() as u16).to_le_bytes());
                }
                true
            }
            Kind::Unbind => {
                let pdfid = self.pdfid();
                let timeout = self.timeout(u::BIND_MAX_TIMEOUT_MS);
                put(b, 8, &pdfid.to_le_bytes());
                put(b, 12, &timeout.to_le_bytes());
                if self.chance(5) {
                    put(b, 20, &(self.rng.next() as u32).to_le_bytes());
                }
                true
            }
            Kind::RouteAdd | Kind::RouteDel => {
                let win = match self.rng.below(8) {
                    0..=3 => self.rng.below(64) * 4096,
                    4 => u::ROUTE_ANY_WINDOW,
                    5 => self.rng.below(1 << 28),
                    6 => self.pick(&[256 << 20, (256 << 20) - 4096, 1 << 40, u64::MAX - 4095]),
                    _ => self.rng.next(),
                };
                let size = match self.rng.below(8) {
                    0..=3 => (1 + self.rng.below(16)) * 4096,
                    4 => self.pick(&[0u64, 1, 4095, 2 << 20]),
                    5 => self.pick(&[160 << 20, 256 << 20, 1 << 40, !0xfffu64]),
                    _ => self.rng.next(),
                };
                let target = match self.rng.below(6) {
                    0..=2 => self.rng.below(64) * 4096,
                    3 => self.rng.below(1 << 28),
                    4 => self.pick(&[(160 << 20) - 4096, 160 << 20, !0xfffu64]),
                    _ => self.rng.next(),
                };
                let pdfid = self.pdfid();
                put(b, 8, &win.to_le_bytes());
                put(b, 16, &size.to_le_bytes());
                put(b, 24, &target.to_le_bytes());
                put(b, 32, &pdfid.to_le_bytes());
                if self.chance(5) {
                    b[35] = self.rng.next() as u8;
                }
                if self.chance(5) {
                    put(b, 36, &(self.rng.next() as u32).to_le_bytes());
                }
                true
            }
            Kind::Routes => {
                let n = self.pick(&[0u32, 1, 2, 16, 17, 0x1000_0000, u32::MAX]);
                let rs = self.len_u32(32);
                let p = self.buf_ptr((n as usize).saturating_mul(rs as usize));
                put(b, 8, &n.to_le_bytes());
                put(b, 12, &rs.to_le_bytes());
                put(b, 16, &p.to_le_bytes());
                true
            }
            Kind::Copy => {
                let len: u64 = match self.rng.below(10) {
                    0..=4 => 1 + self.rng.below(8192),
                    5 => self.pick(&[0u64, 4096, 16384, 1 << 20]),
                    6 => self.pick(&[u::P2P_MAX_LEN, u::P2P_MAX_LEN + 1, u64::MAX]),
                    _ => self.rng.next() >> self.rng.below(64),
                };
                for (at, is_dst) in [(8usize, false), (24usize, true)] {
                    let k = match self.rng.below(12) {
                        0..=4 => u::P2P_FUNCTION,
                        5..=7 => u::P2P_USER,
                        8 => u::P2P_IOVA,
                        // A peer's buffer: the destination the DMA endpoint copies into
                        // (as a source it is refused).
                        10..=11 if is_dst || self.chance(20) => u::P2P_PEER,
                        _ => self.rng.next() as u32 % 6,
                    };
                    let pdfid = if k == u::P2P_PEER {
                        self.hfid()
                    } else {
                        self.pdfid()
                    };
                    let addr = match k {
                        u::P2P_FUNCTION => match self.rng.below(4) {
                            0..=1 => self.rng.below(64) * 4096,
                            2 => self.rng.below(1 << 28),
                            _ => self.rng.next(),
                        },
                        u::P2P_IOVA if is_dst => self.pick(SAFE_IOVAS),
                        // The offset in the peer's buffer: inside a page, at its end, past
                        // it, wrapping with the length.
                        u::P2P_PEER => match self.rng.below(6) {
                            0..=2 => self.rng.below(4096),
                            3 => self.pick(&[4095u64, 4096, 1 << 20]),
                            4 => u64::MAX - self.rng.below(4096),
                            _ => self.rng.next(),
                        },
                        u::P2P_IOVA => {
                            if self.chance(50) {
                                self.pick(SAFE_IOVAS)
                            } else {
                                self.rng.next()
                            }
                        }
                        _ => self.buf_ptr(len.min(1 << 20) as usize),
                    };
                    // An out-of-range kind must not smuggle in an address the engine could
                    // write if a later driver took it as an IOVA.
                    let addr = if k > u::P2P_IOVA && is_dst && self.chance(50) {
                        self.pick(SAFE_IOVAS)
                    } else {
                        addr
                    };
                    put(b, at, &k.to_le_bytes());
                    put(b, at + 4, &pdfid.to_le_bytes());
                    if k == u::P2P_PEER {
                        // `slot` of a peer end, the reserved field of the others.
                        let slot = if self.chance(10) {
                            self.rng.next() as u16
                        } else {
                            u16::from(self.slot())
                        };
                        put(b, at + 6, &slot.to_le_bytes());
                    } else if self.chance(4) {
                        put(b, at + 6, &(self.rng.next() as u16).to_le_bytes());
                    }
                    put(b, at + 8, &addr.to_le_bytes());
                }
                put(b, 40, &len.to_le_bytes());
                let t = self.timeout(u::P2P_MAX_TIMEOUT_MS);
                put(b, 60, &t.to_le_bytes());
                true
            }
            Kind::Distance => {
                let a = self.pdfid();
                let c = self.pdfid();
                put(b, 8, &a.to_le_bytes());
                put(b, 10, &c.to_le_bytes());
                if self.chance(5) {
                    put(b, 28, &(self.rng.next() as u32).to_le_bytes());
                }
                false
            }
            Kind::Grant | Kind::Revoke => {
                let pdfid = self.pdfid();
                let grantee = self.host();
                put(b, 8, &pdfid.to_le_bytes());
                put(b, 10, &[grantee]);
                // The reserved fields (EINVAL unless zero).
                if self.chance(5) {
                    put(b, 11, &[self.rng.next() as u8]);
                }
                if self.chance(5) {
                    put(b, 20, &(self.rng.next() as u32).to_le_bytes());
                }
                // The out fields `fw_ret` and `nr_grants` as the caller left them.
                if self.chance(5) {
                    put(b, 12, &self.rng.next().to_le_bytes());
                }
                true
            }
            Kind::Register | Kind::Unregister => {
                // REGISTER: a buffer of the arena (read-write, read-only, inaccessible,
                // unaligned, across a page end) or none; the peer's writes could only land
                // there. UNREGISTER takes no buffer: a non-zero address or length is
                // refused.
                let register = kind == Kind::Register;
                let len: u64 = match self.rng.below(10) {
                    0..=4 if register => 1 + self.rng.below(4096),
                    0..=6 if !register => 0,
                    5 => self.pick(&[0u64, 4096, 8192, 4097]),
                    6 => self.pick(&[u::P2P_MAX_LEN, u::P2P_MAX_LEN + 1, u64::MAX]),
                    _ => self.rng.next() >> self.rng.below(64),
                };
                let addr = match self.rng.below(10) {
                    0..=7 if register => self.buf_ptr(len.min(1 << 20) as usize),
                    0..=7 => 0,
                    8 => self.buf_ptr(len.min(1 << 20) as usize),
                    _ => self.rng.next(),
                };
                // UNREGISTER: half the time a registration of the run (which may belong to
                // another descriptor, or be gone already).
                let (peer, slot) = match self.registered.len() {
                    n if n > 0 && !register && self.chance(50) => {
                        self.registered[self.rng.below(n as u64) as usize]
                    }
                    _ => (self.hfid(), self.slot()),
                };
                put(b, 8, &peer.to_le_bytes());
                // REGISTER: an out field, as the caller left it.
                put(b, 10, &[slot]);
                // The reserved fields (EINVAL unless zero).
                if self.chance(5) {
                    put(b, 11, &[self.rng.next() as u8]);
                }
                if self.chance(5) {
                    put(b, 14, &(self.rng.next() as u16).to_le_bytes());
                }
                if self.chance(5) {
                    put(b, 20, &(self.rng.next() as u32).to_le_bytes());
                }
                // The out fields `hfid` and `fw_ret` as the caller left them.
                if self.chance(5) {
                    put(b, 12, &(self.rng.next() as u16).to_le_bytes());
                    put(b, 16, &(self.rng.next() as u32).to_le_bytes());
                }
                put(b, 24, &addr.to_le_bytes());
                put(b, 32, &len.to_le_bytes());
                true
            }
            Kind::Grants => {
                // The firmware lists at most 127 grants (one MRPC payload).
                let n = self.pick(&[0u32, 1, 2, 8, 127, 128, 0x1000_0000, u32::MAX]);
                let gs = self.len_u32(std::mem::size_of::<u::Grant>() as u32);
                let p = self.buf_ptr((n as usize).saturating_mul(gs as usize));
                put(b, 8, &n.to_le_bytes());
                put(b, 12, &gs.to_le_bytes());
                put(b, 16, &p.to_le_bytes());
                true
            }
        })
    }

    /// Writes an input for `cmd` at `ptr` when it is in the read-write pages: mostly the
    /// shape the command expects with random values, sometimes random bytes.
    fn mrpc_input(&mut self, cmd: u32, ptr: u64, len: usize) {
        let base = self.arena.addr(0);
        let rw_len = RW_PAGES * PAGE;
        if ptr < base || ptr >= base + rw_len as u64 {
            return;
        }
        let off = (ptr - base) as usize;
        let n = len.min(rw_len - off);
        let mut v = vec![0u8; n];
        self.rng.fill(&mut v);
        if !self.chance(20) {
            let pdfid = self.pdfid().to_le_bytes();
            let host_port = self.pick(&[0u8, 8, 16, 24, 47, 48, 0xff]);
            let sub = self.rng.below(6) as u8;
            match cmd & 0xffff {
                0x04 => put(&mut v, 0, &(self.rng.below(5) as u32).to_le_bytes()),
                0x82 | 0x83 => {
                    put(&mut v, 0, &[sub, self.rng.below(4) as u8, host_port, 0]);
                }
                0x84 => {
                    let log = self.port();
                    put(&mut v, 0, &[1 + self.rng.below(2) as u8, 0, host_port, log]);
                    put(&mut v, 4, &pdfid);
                }
                0x89 => {
                    let req = self.rng.below(40) as u16;
                    put(&mut v, 0, &[self.rng.below(3) as u8, 0]);
                    put(&mut v, 2, &req.to_le_bytes());
                }
                0x8d => {
                    put(&mut v, 0, &[self.rng.below(5) as u8, host_port, sub & 1, 0]);
                }
                0xf000..=0xf0ff => {
                    let size = self.pick(&[4u16, 8, 32, 3, 0xffff]);
                    put(&mut v, 0, &[1, 0]);
                    put(&mut v, 2, &size.to_le_bytes());
                    match cmd & 0xffff {
                        0xf002 => put(&mut v, 4, &pdfid),
                        0xf003 => {
                            put(&mut v, 4, &(self.rng.below(12) as u16).to_le_bytes());
                            put(&mut v, 6, &(self.rng.below(50) as u16).to_le_bytes());
                        }
                        0xf004 => {
                            // Sub-commands 1-6: ADD, DEL, LIST, GRANT, REVOKE, GRANT_LIST.
                            let sub = self.rng.below(8) as u8;
                            put(&mut v, 4, &[sub, 0]);
                            put(&mut v, 6, &pdfid);
                            let arg0 = if matches!(sub, 4 | 5) {
                                u64::from(self.host()) // the grantee
                            } else {
                                self.rng.below(64) * 4096
                            };
                            put(&mut v, 8, &arg0.to_le_bytes());
                            put(&mut v, 16, &(4096 * (1 + self.rng.below(4))).to_le_bytes());
                            put(&mut v, 24, &(self.rng.below(64) * 4096).to_le_bytes());
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        self.arena.rw()[off..off + n].copy_from_slice(&v);
    }

    /// An ioctl number nobody defined, with a pointer from the pool.
    fn random_ioctl(&mut self) {
        let nr = match self.rng.below(4) {
            0 => {
                // A defined number with direction and size bits added.
                let base = self.defs[self.rng.below(self.defs.len() as u64) as usize].nr;
                base | ((self.rng.below(4) as u32) << 30) | ((self.rng.below(0x4000) as u32) << 16)
            }
            1 => {
                // A number of the ioctl type past the last one defined.
                let last = self.defs.iter().map(|d| d.nr & 0xff).max().unwrap_or(0);
                let first = (last + 1).min(0xff);
                let nr = first + self.rng.below(u64::from(0x100 - first)) as u32;
                u::io(0xFA, nr)
            }
            2 => {
                let dir = (self.rng.below(4) as u32) << 30;
                let size = (self.rng.below(0x4000) as u32) << 16;
                dir | size | ((self.rng.next() as u32) & 0xffff)
            }
            _ => self.rng.next() as u32,
        };
        // Neither a number of the uAPI nor an old number it still accepts.
        let nr = if self
            .defs
            .iter()
            .any(|d| d.nr == nr || u::legacy(d.nr) == nr)
        {
            nr ^ 0x8000_0000
        } else {
            nr
        };
        let ptr = self.buf_ptr(64);
        let fd = self.fd();
        arm(ALARM_US);
        // SAFETY: an undefined command; the pointer is into the arena or bad by design.
        CRASH_OP.store(u64::from(nr), Relaxed);
        let rc = ret(unsafe { libc::ioctl(fd, nr as _, ptr) } as isize);
        arm(0);
        self.ioctl_calls += 1;
        self.count("undefined-ioctl", rc);
    }

    // ------------------------------------------------------ other calls

    fn other(&mut self) {
        let fd = self.fd();
        let len = match self.rng.below(6) {
            0 => 0usize,
            1 => self.rng.below(16) as usize,
            2 => 4096,
            3 => 4097,
            4 => 1 << 20,
            _ => self.rng.below(9000) as usize,
        };
        let ptr = self.buf_ptr(len.min(RW_PAGES * PAGE)) as *mut libc::c_void;
        let off: i64 = self.pick(&[0i64, 1, 4095, 4096, -1, i64::MAX, 1 << 40]);
        let (op, rc) = match self.rng.below(9) {
            // SAFETY: `ptr` points into the arena or is bad by design; the kernel checks it.
            0 => ("read", ret(unsafe { libc::read(fd, ptr, len) })),
            // SAFETY: as above.
            1 => ("pread", ret(unsafe { libc::pread(fd, ptr, len, off) })),
            // SAFETY: as above.
            2 => ("write", ret(unsafe { libc::write(fd, ptr, len) })),
            // SAFETY: as above.
            3 => ("pwrite", ret(unsafe { libc::pwrite(fd, ptr, len, off) })),
            4 => {
                let prot = self.pick(&[
                    libc::PROT_READ,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::PROT_NONE,
                    libc::PROT_EXEC,
                ]);
                let flags = self.pick(&[libc::MAP_SHARED, libc::MAP_PRIVATE]);
                let mlen = self.pick(&[0usize, 1, 4096, 8192, 1 << 20, 1 << 30]);
                let moff = self.pick(&[0i64, 4096, 1, 1 << 40]);
                // SAFETY: a new mapping chosen by the kernel; unmapped at once if it works.
                let p = unsafe { libc::mmap(std::ptr::null_mut(), mlen, prot, flags, fd, moff) };
                if p == libc::MAP_FAILED {
                    ("mmap", Err(errno()))
                } else {
                    // SAFETY: the mapping just made.
                    unsafe { libc::munmap(p, mlen) };
                    ("mmap", Ok(0))
                }
            }
            5 | 6 => {
                let mut pfd = libc::pollfd {
                    fd,
                    events: self.rng.next() as i16,
                    revents: 0,
                };
                let t = self.pick(&[0, 0, 1, 5]);
                // SAFETY: one valid pollfd.
                let r = ret(unsafe { libc::poll(&mut pfd, 1, t) } as isize);
                ("poll", r)
            }
            7 => {
                let whence = self.rng.below(6) as i32;
                // SAFETY: plain descriptor call.
                (
                    "lseek",
                    ret(unsafe { libc::lseek(fd, off, whence) } as isize),
                )
            }
            _ => {
                // Close one descriptor and open the device again.
                let i = self.rng.below(self.fds.len() as u64) as usize;
                // SAFETY: ours, removed from the list below.
                unsafe { libc::close(self.fds[i]) };
                let flags = self.pick(&[libc::O_RDONLY, libc::O_RDWR, libc::O_WRONLY])
                    | if self.chance(50) { libc::O_NONBLOCK } else { 0 };
                let c = CString::new(self.path.as_str()).unwrap_or_default();
                // SAFETY: a valid path.
                let nfd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
                if nfd >= 0 {
                    self.fds[i] = nfd;
                    ("reopen", Ok(0))
                } else {
                    let e = errno();
                    self.fds.remove(i);
                    ("reopen", Err(e))
                }
            }
        };
        self.other_calls += 1;
        self.count(op, rc);
    }

    fn sysfs_write(&mut self) {
        if self.sys.is_empty() {
            return;
        }
        let i = self.rng.below(self.sys.len() as u64) as usize;
        let (path, garbage_only) = (self.sys[i].path.clone(), self.sys[i].garbage_only);
        let data = self.garbage(garbage_only);
        let c = CString::new(path.as_str()).unwrap_or_default();
        // SAFETY: a valid path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        let name = format!("sysfs:{}", path.rsplit('/').next().unwrap_or(""));
        self.other_calls += 1;
        if fd < 0 {
            let e = errno();
            self.count(&name, Err(e));
            return;
        }
        arm(ALARM_US * 4);
        // SAFETY: `data` is readable for its length.
        let rc = ret(unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) });
        arm(0);
        // SAFETY: ours.
        unsafe { libc::close(fd) };
        if matches!(rc, Ok(n) if n as usize == data.len() && !data.is_empty())
            && (path.ends_with("pcifab0/bind") || path.ends_with("pcifab0/unbind"))
        {
            self.changes += 1;
            if self.change_log.len() < 50 {
                self.change_log.push(format!(
                    "write {:?} to {path}",
                    String::from_utf8_lossy(&data)
                ));
            }
        }
        self.count(&name, rc);
    }

    /// Something to write into a sysfs file: numbers, ids, separators, junk.
    fn garbage(&mut self, garbage_only: bool) -> Vec<u8> {
        let mut s: Vec<u8> = Vec::new();
        if garbage_only {
            // Never parses as a number or a uevent action.
            s.push(b'z');
        }
        match self.rng.below(10) {
            0 => {}
            1 => {
                let n = self.pick(&[1usize, 4095, 4096, 4097, 9000]);
                s.extend((0..n).map(|_| self.rng.next() as u8));
            }
            2 => s.extend_from_slice(b"\0\0\x01\xff\xfe"),
            _ => {
                let tokens = 1 + self.rng.below(4);
                for t in 0..tokens {
                    if t > 0 {
                        let sep = self.pick(&[" ", "  ", "\t", ",", "\n", ""]);
                        s.extend_from_slice(sep.as_bytes());
                    }
                    let tok = match self.rng.below(9) {
                        0 => format!("{:#06x}", self.pdfid()),
                        1 => format!("{}", self.pdfid()),
                        2 => format!("{}", self.host()),
                        3 => format!("{}", self.port()),
                        4 => self
                            .pick(&["-1", "0x", "0x-1", "+5", "99999999999999999999", "1e3"])
                            .to_string(),
                        5 => format!("{:#x}", self.rng.next()),
                        6 => self
                            .pick(&["0", "1", "0x0300", "0x0400", "0x0401"])
                            .to_string(),
                        7 => {
                            let mut j = vec![0u8; self.rng.below(12) as usize];
                            self.rng.fill(&mut j);
                            String::from_utf8_lossy(&j).into_owned()
                        }
                        _ => "\u{00e9}\u{1f600}".to_string(),
                    };
                    s.extend_from_slice(tok.as_bytes());
                }
                if self.chance(50) {
                    s.push(b'\n');
                }
            }
        }
        s
    }
}

/// Whether command `cmd` with `input` (the first bytes the kernel read) changes firmware
/// state when the firmware completes it: everything but the read-only class of
/// Documentation/uapi.rst, by the low 16 bits the firmware dispatches on and, where a
/// command has them, its sub-command (missing input bytes read as zero, as the firmware
/// reads them). Commands the firmware does not know change nothing (it refuses them).
fn mrpc_changes(cmd: u32, input: &[u8]) -> bool {
    let byte = |at: usize| input.get(at).copied().unwrap_or(0);
    match cmd & 0xffff {
        // Die temperature: only GET reads.
        0x04 => [byte(0), byte(1), byte(2), byte(3)] != [2, 0, 0, 0],
        // Database dump: the single-shot sections (0, 2, 4) and the GET step (2 at byte 4) of
        // the chunked ones (1, 3, 5, 6) read; START and FINISH open and close the session.
        0x83 => match byte(0) {
            0 | 2 | 4 => false,
            1 | 3 | 5 | 6 => [byte(4), byte(5), byte(6), byte(7)] != [2, 0, 0, 0],
            _ => true,
        },
        // Topology dump session, bind/unbind, device management, port configuration, GFMS
        // events (GET consumes the queue), port control.
        0x82 | 0x84 | 0x85 | 0x88 | 0x89 | 0x8d => true,
        // P2P routes: LIST (3) and GRANT_LIST (6) read.
        0xf004 => !matches!(byte(4), 3 | 6),
        0xf080..=0xf0ff => true,
        _ => false,
    }
}

/// The HFIDs of the DMA endpoints pcifab's `pcifab_dmaep` driver holds (their sysfs
/// `pcifab/hfid`, read before privileges are dropped); none when no endpoint is bound.
fn endpoint_hfids() -> Vec<u16> {
    let Ok(dir) = std::fs::read_dir("/sys/bus/pci/drivers/pcifab_dmaep") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("pcifab/hfid")).ok())
        .filter_map(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        .collect()
}

fn drop_privileges() -> Res<()> {
    const NOBODY: u32 = 65534;
    // SAFETY: plain credential system calls.
    let ok = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(NOBODY) == 0
            && libc::setuid(NOBODY) == 0
    };
    // SAFETY: trivial getters.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    if !ok || uid != NOBODY || euid != NOBODY {
        return Err(check(format!(
            "cannot drop privileges to uid/gid {NOBODY}: {} (uid {uid}, euid {euid}; run as \
             root)",
            errno_name(errno())
        )));
    }
    Ok(())
}

/// After the run: a fresh descriptor answers VERSION and an echo.
fn health(path: &str) -> Result<(), String> {
    let fd = open_fd(path, libc::O_RDONLY)
        .map_err(|e| format!("open {path} after the run: {}", errno_name(e)))?;
    let mut v = u::Version::new();
    let res = if let Err(e) = fd_ioctl(fd, u::PCIFAB_IOCTL_VERSION, &mut v) {
        Err(format!("VERSION after the run: {}", errno_name(e)))
    } else {
        let input = *b"still-alive-0123";
        let mut out = [0u8; 16];
        // The pointers address the two 16-byte arrays, alive for the call.
        let mut m = mrpc_arg(ECHO, &input, &mut out, 0);
        if let Err(e) = fd_ioctl(fd, u::PCIFAB_IOCTL_MRPC, &mut m) {
            Err(format!("echo after the run: {}", errno_name(e)))
        } else if m.status != u::MRPC_STATUS_DONE || out[..] != echo_answer(&input)[..] {
            Err(format!(
                "echo after the run: status {:#x} ret {:#x}, output {:?}",
                m.status, m.ret_value, out
            ))
        } else {
            Ok(())
        }
    };
    // SAFETY: ours.
    unsafe { libc::close(fd) };
    res
}

pub fn cmd_fuzz(args: &[String]) -> Res<()> {
    let mut rest = Vec::new();
    let mut unpriv = false;
    for a in args {
        if a == "--unpriv" {
            unpriv = true;
        } else {
            rest.push(a.clone());
        }
    }
    let a = Args::parse(&rest)?;
    let seed = num("--seed", a.need("seed")?)?;
    let calls = num("--calls", a.need("calls")?)?;
    let path = a.get("device").unwrap_or("/dev/pcifab0").to_string();
    if calls == 0 {
        return Err(usage("--calls must be at least 1"));
    }

    // As root: the log, the device, the fabric's ids and the sysfs files.
    let mut kmsg = Kmsg::open()?;
    let root_fd = open_fd(&path, libc::O_RDWR)
        .map_err(|e| check(format!("cannot open {path}: {}", errno_name(e))))?;
    // SAFETY: `root_fd` is open; the `File` takes it over for the inventory and gives it back.
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(root_fd) };
    let inv = pcifab_uapi::dev::inventory(&f);
    let root_fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    let (inv, _, fns) = inv.map_err(|e| check(format!("INVENTORY before the run: {e}")))?;
    let pdfids: Vec<u16> = fns.iter().map(|f| f.pdfid).collect();
    let misc = format!(
        "/sys/class/misc/{}",
        path.rsplit('/').next().unwrap_or("pcifab0")
    );
    let (sys, skipped) = sysfs_files(&misc);
    let hfids = endpoint_hfids();

    install_alarm();
    install_fault_report();

    let mut fds = vec![root_fd];
    let mut reopen_as_user = String::from("not tried");
    if unpriv {
        drop_privileges()?;
        match open_fd(&path, libc::O_RDWR) {
            Ok(fd) => {
                fds.push(fd);
                reopen_as_user = "ok".into();
            }
            Err(e) => reopen_as_user = errno_name(e),
        }
    }

    let mut z = Fuzz::new(seed, &path, fds, pdfids, inv.host_count, sys)?;
    z.unpriv = unpriv;
    z.hfids = hfids;
    let start = Instant::now();
    let mut first_splat: Option<u64> = None;
    while z.ioctl_calls < calls {
        if z.fds.is_empty() {
            // Every reopen failed: the device is gone or refuses this user.
            break;
        }
        z.step()?;
        if z.ioctl_calls % 512 == 0 && kmsg.poll() > 0 && first_splat.is_none() {
            first_splat = Some(z.ioctl_calls);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    for fd in &z.fds {
        // SAFETY: ours.
        unsafe { libc::close(*fd) };
    }
    let alive = health(&path);
    if kmsg.poll() > 0 && first_splat.is_none() {
        first_splat = Some(z.ioctl_calls);
    }
    let splats = kmsg.splats.len();

    // The JSON record (stderr), then the summary line (stdout).
    let mut counts = String::new();
    for (i, (op, m)) in z.counts.iter().enumerate() {
        let inner: Vec<String> = m
            .iter()
            .map(|(e, n)| format!("{}:{n}", json_str(e)))
            .collect();
        let _ = write!(
            counts,
            "{}{}:{{{}}}",
            if i > 0 { "," } else { "" },
            json_str(op),
            inner.join(",")
        );
    }
    let list = |v: &[String]| v.iter().map(|s| json_str(s)).collect::<Vec<_>>().join(",");
    let files: Vec<String> = z.sys.iter().map(|f| f.path.clone()).collect();
    let skipped: Vec<String> = skipped
        .iter()
        .map(|(p, why)| format!("{p}: {why}"))
        .collect();
    eprintln!(
        "{{\"test\":\"fuzz\",\"seed\":{seed},\"unpriv\":{},\"ioctl_calls\":{},\
         \"other_calls\":{},\"secs\":{secs:.1},\"calls_per_s\":{:.0},\"alarms\":{},\
         \"splats\":{splats},\"first_splat_after_call\":{},\"splat_lines\":[{}],\
         \"kmsg_lost\":{},\"changes\":{},\"change_log\":[{}],\"reopen_as_user\":{},\
         \"healthy_after\":{},\"sysfs_files\":[{}],\"sysfs_skipped\":[{}],\"errnos\":{{{counts}}}}}",
        z.unpriv,
        z.ioctl_calls,
        z.other_calls,
        (z.ioctl_calls + z.other_calls) as f64 / secs.max(1e-9),
        z.alarms,
        first_splat.map_or("null".to_string(), |c| c.to_string()),
        list(&kmsg.splats.iter().take(40).cloned().collect::<Vec<_>>()),
        kmsg.lost,
        z.changes,
        list(&z.change_log),
        json_str(&reopen_as_user),
        match &alive {
            Ok(()) => "true".to_string(),
            Err(e) => json_str(e),
        },
        list(&files),
        list(&skipped),
    );
    println!(
        "fuzz ioctl_calls={} splats={splats} changes={}",
        z.ioctl_calls, z.changes
    );
    let mut fails = Vec::new();
    if z.ioctl_calls < calls {
        fails.push(format!(
            "made {} of {calls} ioctl calls: every descriptor of {path} was lost (reopen: {})",
            z.ioctl_calls,
            z.counts
                .get("reopen")
                .map(|m| format!("{m:?}"))
                .unwrap_or_default()
        ));
    }
    if splats > 0 {
        fails.push(format!(
            "{splats} kernel splat lines (first after call {}): {}",
            first_splat.unwrap_or(0),
            kmsg.first_splats()
        ));
    }
    if unpriv && z.changes > 0 {
        fails.push(format!(
            "an unprivileged caller changed the fabric {} times: {}",
            z.changes,
            z.change_log.join("; ")
        ));
    }
    if let Err(e) = alive {
        fails.push(e);
    }
    if fails.is_empty() {
        Ok(())
    } else {
        Err(check(format!("seed {seed}: {}", fails.join("; "))))
    }
}

#[cfg(test)]
mod tests {
    use super::super::ioctl::as_bytes;
    use super::*;

    /// The generator runs long without panicking against a device that takes no ioctls,
    /// and every ioctl is counted.
    #[test]
    fn generator_runs_on_dev_null() {
        install_alarm();
        let fd = open_fd("/dev/null", libc::O_RDWR).expect("open /dev/null");
        let sys = vec![SysFile {
            path: "/dev/null".into(),
            garbage_only: false,
        }];
        let mut z = Fuzz::new(7, "/dev/null", vec![fd], vec![0x0300, 0x0400], 2, sys)
            .unwrap_or_else(|_| panic!("arena"));
        while z.ioctl_calls < 20_000 {
            if z.step().is_err() {
                panic!("step failed");
            }
        }
        let ioctls: u64 = z
            .counts
            .iter()
            .filter(|(k, _)| {
                !k.starts_with("sysfs:") && z.defs.iter().any(|d| d.name == *k)
                    || *k == "undefined-ioctl"
            })
            .flat_map(|(_, m)| m.values())
            .sum();
        assert_eq!(ioctls, 20_000);
        // Every ioctl of the table was called, the grant ioctls among them.
        for d in &z.defs {
            assert!(z.counts.contains_key(d.name), "{} never called", d.name);
        }
        assert_eq!(z.changes, 0, "{:?}", z.change_log);
        assert!(z.other_calls > 0);
        // /dev/null knows no ioctl at all.
        assert!(
            z.counts["VERSION"].keys().all(|e| e == "ENOTTY"),
            "{:?}",
            z.counts
        );
        for fd in z.fds {
            // SAFETY: ours.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn configuration_commands_by_low_bits_and_sub_command() {
        assert!(mrpc_changes(0x84, &[]));
        assert!(mrpc_changes(0x1_0084, &[1, 0, 0, 0]));
        assert!(mrpc_changes(0xf004, &[1, 0, 0, 0, 1]));
        assert!(mrpc_changes(0xf004, &[1, 0, 32, 0]));
        assert!(!mrpc_changes(0xf004, &[1, 0, 32, 0, 3]));
        assert!(!mrpc_changes(0x1_f004, &[1, 0, 32, 0, 6, 0]));
        assert!(mrpc_changes(0x04, &[1, 0, 0, 0]));
        assert!(!mrpc_changes(0x04, &[2, 0, 0]));
        assert!(!mrpc_changes(0x04, &[2, 0, 0, 0]));
        assert!(!mrpc_changes(0x83, &[4]));
        assert!(mrpc_changes(0x83, &[6]));
        assert!(mrpc_changes(0x83, &[1, 0, 0, 0, 1, 0, 0, 0]));
        assert!(!mrpc_changes(0x83, &[1, 0, 0, 0, 2, 0, 0, 0]));
        assert!(mrpc_changes(0x83, &[3, 0, 0, 0, 3, 0, 0, 0]));
        assert!(mrpc_changes(0x83, &[7]));
        assert!(mrpc_changes(0x89, &[0]));
        assert!(!mrpc_changes(0x41, &[]));
        assert!(!mrpc_changes(0xf003, &[]));
    }

    /// The grant ioctls are in the table with the header's numbers and struct sizes, and
    /// the GRANTS array pointer is never corrupted byte-wise.
    #[test]
    fn grant_ioctls_in_the_table() {
        let defs = defs();
        let def = |k: Kind| {
            defs.iter()
                .find(|d| d.kind == k)
                .unwrap_or_else(|| panic!("{k:?} not in the table"))
        };
        for (k, name, nr, size) in [
            (Kind::Grant, "P2P_GRANT", 0xc018_fa0e, 24),
            (Kind::Revoke, "P2P_REVOKE", 0xc018_fa0f, 24),
            (Kind::Grants, "P2P_GRANTS", 0xc018_fa10, 24),
        ] {
            let d = def(k);
            assert_eq!((d.name, d.nr, d.size), (name, nr, size), "{k:?}");
        }
        assert_eq!(pointer_fields(Kind::Grants), vec![16]);
        assert!(pointer_fields(Kind::Grant).is_empty());
        assert!(pointer_fields(Kind::Revoke).is_empty());
        // Every definition has its own number, and every pointer field lies in its struct.
        for (i, d) in defs.iter().enumerate() {
            assert!(defs[..i].iter().all(|e| e.nr != d.nr), "{} twice", d.name);
            for o in pointer_fields(d.kind) {
                assert!(o % 8 == 0 && o + 8 <= d.size, "{}: pointer at {o}", d.name);
            }
        }
    }

    /// As Documentation/uapi.rst and the driver class them: GRANT and REVOKE need
    /// CAP_SYS_ADMIN and change the fabric, GRANTS is read-only like ROUTES.
    #[test]
    fn grant_classification() {
        assert_eq!(effect(Kind::Grant), Effect::Changes);
        assert_eq!(effect(Kind::Revoke), Effect::Changes);
        assert_eq!(effect(Kind::Grants), Effect::ReadOnly);
        assert_eq!(effect(Kind::Routes), Effect::ReadOnly);
        assert_eq!(effect(Kind::RouteAdd), Effect::Changes);
        assert_eq!(effect(Kind::Mrpc), Effect::ByCommand);
        // The firmware sub-commands behind them, sent raw: GRANT (4) and REVOKE (5)
        // change, GRANT_LIST (6) reads.
        assert!(mrpc_changes(0xf004, &[1, 0, 32, 0, 4]));
        assert!(mrpc_changes(0xf004, &[1, 0, 32, 0, 5]));
        assert!(!mrpc_changes(0xf004, &[1, 0, 32, 0, 6]));
    }

    /// A successful GRANT or REVOKE counts as a change, a successful GRANTS does not.
    #[test]
    fn successful_grant_and_revoke_are_changes_grants_is_not() {
        let fd = open_fd("/dev/null", libc::O_RDWR).expect("open /dev/null");
        let mut z = Fuzz::new(1, "/dev/null", vec![fd], vec![0x0300], 2, Vec::new())
            .unwrap_or_else(|_| panic!("arena"));
        let mut g = u::P2pGrant::new();
        g.pdfid = 0x0300;
        g.grantee = 1;
        g.nr_grants = 1;
        let gb = as_bytes(&g);
        let mut l = u::P2pGrants::new();
        l.nr_grants = 3;
        l.grant_size = 8;
        let lb = as_bytes(&l);
        for k in [Kind::Grants, Kind::Routes, Kind::Distance] {
            let b = if k == Kind::Grants { &lb } else { &gb };
            z.note_change(k, &vec![0; b.len().max(48)]);
            z.note_change(k, b);
        }
        assert_eq!(z.changes, 0, "{:?}", z.change_log);
        z.note_change(Kind::Grant, &gb);
        assert_eq!(z.changes, 1);
        z.note_change(Kind::Revoke, &gb);
        assert_eq!(z.changes, 2);
        assert_eq!(
            z.change_log,
            [
                "P2P_GRANT 0x0300 to host 1",
                "P2P_REVOKE 0x0300 from host 1"
            ]
        );
        for fd in z.fds {
            // SAFETY: ours.
            unsafe { libc::close(fd) };
        }
    }

    /// The bodies of the grant ioctls: mostly a valid template (reserved fields zero, the
    /// entry size of `struct pcifab_grant`), sometimes bent.
    #[test]
    fn grant_bodies() {
        let fd = open_fd("/dev/null", libc::O_RDWR).expect("open /dev/null");
        let mut z = Fuzz::new(3, "/dev/null", vec![fd], vec![0x0300], 2, Vec::new())
            .unwrap_or_else(|_| panic!("arena"));
        let (mut valid, mut bent, mut exact_size) = (0, 0, 0);
        for _ in 0..2000 {
            let mut b = vec![0u8; 24];
            assert!(z.body(Kind::Revoke, &mut b).unwrap_or(false));
            if b[11] == 0 && b[20..24] == [0; 4] {
                valid += 1;
            } else {
                bent += 1;
            }
            let mut b = vec![0u8; 24];
            assert!(z.body(Kind::Grants, &mut b).unwrap_or(false));
            if b[12..16] == 8u32.to_le_bytes() {
                exact_size += 1;
            }
        }
        assert!(valid > 1600 && bent > 50, "valid {valid} bent {bent}");
        assert!(exact_size > 500, "{exact_size}");
        for fd in z.fds {
            // SAFETY: ours.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn register_ioctls_and_bodies() {
        let defs = defs();
        for (k, name, nr) in [
            (Kind::Register, "P2P_REGISTER", 0xc028_fa11u32),
            (Kind::Unregister, "P2P_UNREGISTER", 0xc028_fa12),
        ] {
            let d = defs.iter().find(|d| d.kind == k).expect("in the table");
            assert_eq!((d.name, d.nr, d.size), (name, nr, 40), "{k:?}");
            assert_eq!(pointer_fields(k), vec![24]);
            assert_eq!(effect(k), Effect::Changes);
        }
        let fd = open_fd("/dev/null", libc::O_RDWR).expect("open /dev/null");
        let mut z = Fuzz::new(5, "/dev/null", vec![fd], vec![0x0300], 2, Vec::new())
            .unwrap_or_else(|_| panic!("arena"));
        z.hfids = vec![0x0a01];
        let (mut clean, mut reserved, mut peers, mut own) = (0, 0, 0, 0);
        let (mut unreg_clean, mut peer_dst) = (0, 0);
        for _ in 0..2000 {
            let mut b = vec![0u8; 40];
            assert!(z.body(Kind::Register, &mut b).unwrap_or(false));
            let rd64 = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
            if b[11] != 0 || b[14..16] != [0; 2] || b[20..24] != [0; 4] {
                reserved += 1;
            } else if (1..=4096).contains(&rd64(32)) && rd64(24) != 0 {
                clean += 1;
            }
            match u16::from_le_bytes([b[8], b[9]]) {
                0x0a00 | 0x0a02 => peers += 1,
                0x0a01 => own += 1,
                _ => {}
            }
            let mut b = vec![0u8; 40];
            assert!(z.body(Kind::Unregister, &mut b).unwrap_or(false));
            if b[24..40] == [0; 16] && b[10] < 6 {
                unreg_clean += 1;
            }
            let mut b = vec![0u8; 64];
            assert!(z.body(Kind::Copy, &mut b).unwrap_or(false));
            if b[24..28] == u::P2P_PEER.to_le_bytes() {
                peer_dst += 1;
            }
        }
        assert!(
            clean > 600 && reserved > 50,
            "clean {clean} reserved {reserved}"
        );
        assert!(peers > 600 && own > 100, "peers {peers} own {own}");
        assert!(unreg_clean > 500, "{unreg_clean}");
        assert!(peer_dst > 150, "{peer_dst}");
        for fd in z.fds {
            // SAFETY: ours.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn deny_list() {
        assert!(sysfs_deny("mep", "remove").is_some());
        assert!(sysfs_deny("mep", "power/control").is_some());
        assert!(sysfs_deny("mep", "resource0").is_some());
        assert!(sysfs_deny("driver", "unbind").is_some());
        assert!(sysfs_deny("misc", "bind").is_none());
        assert!(sysfs_deny("misc", "unbind").is_none());
        assert!(sysfs_deny("mep", "broken_parity_status").is_none());
    }
}
