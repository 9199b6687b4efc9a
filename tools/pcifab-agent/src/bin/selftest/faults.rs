// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest probe-faults`: load pcifab with the N-th fault point of the loading task
//! failing, for every N, and check that nothing of a failed load or probe stays behind.
//!
//! The kernel's per-task fault injection (`/proc/thread-self/fail-nth`, CONFIG_FAULT_INJECTION)
//! makes the N-th fault point (slab and page allocations, user copies, ... as configured) of
//! this task fail. This process is the `insmod`: it writes N, calls `finit_module` (the module's
//! init registers the PCI driver, which probes the MEP synchronously in this task), and reads
//! the file back: 0 means the fault was injected, more means the load passed fewer than N
//! points. The run goes up from `--from` and ends at the first N that was not consumed and
//! loaded the module with the MEP bound and working (`"done":true`), or after `--to`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use pcifab_uapi::{self as u, Arg};

use super::args::Args;
use super::ioctl::{echo_answer, fd_ioctl, mrpc_arg, open_fd, ECHO};
use super::kmod::{self, ModuleFile, Traces};
use super::kmsg::Kmsg;
use super::util::{check, errno, errno_name, json_str, num, Res};

pub const USAGE: &str = "\
  probe-faults --module PATH [--from N] [--to M]
        for N = from..=to (1..=100000): fail the N-th fault point of the loading task
        (/proc/thread-self/fail-nth) and load the module; after a failed load or probe
        nothing may remain (module, driver, /dev/pcifab0, sysfs, interrupt, memory
        region, MSI vectors, device enable count) and no kernel splat may appear; ends
        at the first N the load does not reach, which must bind and work. Needs a kernel
        with CONFIG_FAULT_INJECTION, FAILSLAB, FAIL_PAGE_ALLOC and debugfs
";

const FAIL_NTH: &str = "/proc/thread-self/fail-nth";

/// Makes sleeping allocations count and silences the per-fault report.
fn configure_debugfs() -> Res<Vec<String>> {
    if !kmod::exists("/sys/kernel/debug/failslab") {
        // SAFETY: constant C strings; mounting debugfs where the kernel expects it.
        unsafe {
            libc::mount(
                c"debugfs".as_ptr(),
                c"/sys/kernel/debug".as_ptr(),
                c"debugfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    }
    let mut missing = Vec::new();
    let mut set = Vec::new();
    for (dir, knobs) in [
        (
            "failslab",
            &[("ignore-gfp-wait", "N"), ("verbose", "0")][..],
        ),
        (
            "fail_page_alloc",
            &[
                ("ignore-gfp-wait", "N"),
                ("ignore-gfp-highmem", "N"),
                ("min-order", "0"),
                ("verbose", "0"),
            ][..],
        ),
        ("fail_usercopy", &[("verbose", "0")][..]),
        ("fail_futex", &[("verbose", "0")][..]),
    ] {
        let d = format!("/sys/kernel/debug/{dir}");
        if !kmod::exists(&d) {
            missing.push(dir.to_string());
            continue;
        }
        for (k, v) in knobs {
            std::fs::write(format!("{d}/{k}"), v)
                .map_err(|e| check(format!("writing {v} to {d}/{k}: {e}")))?;
            set.push(format!("{dir}/{k}={v}"));
        }
    }
    let needed: Vec<&String> = missing
        .iter()
        .filter(|m| m.as_str() == "failslab" || m.as_str() == "fail_page_alloc")
        .collect();
    if !needed.is_empty() {
        return Err(check(format!(
            "/sys/kernel/debug/{{{}}} missing: the kernel needs CONFIG_FAILSLAB, \
             CONFIG_FAIL_PAGE_ALLOC and CONFIG_FAULT_INJECTION_DEBUG_FS (the debug test kernel)",
            needed
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(",")
        )));
    }
    Ok(set)
}

struct FailNth(i32);

impl FailNth {
    fn open() -> Res<FailNth> {
        // SAFETY: a constant path.
        let fd = unsafe { libc::open(c"/proc/thread-self/fail-nth".as_ptr(), libc::O_RDWR) };
        if fd < 0 {
            let e = errno();
            return Err(check(format!(
                "{FAIL_NTH}: {} -- this kernel has no per-task fault injection \
                 (CONFIG_FAULT_INJECTION); the probe error paths need the debug test kernel",
                errno_name(e)
            )));
        }
        Ok(FailNth(fd))
    }

    fn set(&self, n: u64) -> Result<(), i32> {
        let s = n.to_string();
        // SAFETY: writes the bytes of `s`.
        if unsafe { libc::pwrite(self.0, s.as_ptr().cast(), s.len(), 0) } < 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    /// The counter: 0 once the fault was injected. A failing read means the read itself
    /// met the fault (its copy to user space), so the load before it did not.
    fn left(&self) -> Option<u64> {
        let mut b = [0u8; 32];
        // SAFETY: reads into `b`.
        let n = unsafe { libc::pread(self.0, b.as_mut_ptr().cast(), b.len(), 0) };
        if n <= 0 {
            return None;
        }
        std::str::from_utf8(&b[..n as usize])
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Turns injection off (a write may itself meet the fault while the counter runs).
    fn clear(&self) -> Res<()> {
        for _ in 0..8 {
            if self.set(0).is_ok() && self.left() == Some(0) {
                return Ok(());
            }
        }
        Err(check(format!("cannot write 0 to {FAIL_NTH}")))
    }
}

impl Drop for FailNth {
    fn drop(&mut self) {
        // SAFETY: ours.
        unsafe { libc::close(self.0) };
    }
}

/// `/dev/pcifab0` answers VERSION and an echo.
fn works() -> Result<(), String> {
    let fd = open_fd("/dev/pcifab0", libc::O_RDWR)
        .map_err(|e| format!("open /dev/pcifab0: {}", errno_name(e)))?;
    let mut v = u::Version::new();
    let input = *b"probe-faults-ok!";
    let mut out = [0u8; 16];
    // Valid structs; the MRPC pointers address the two arrays, alive for the call.
    let mut m = mrpc_arg(ECHO, &input, &mut out, 0);
    let r = if let Err(e) = fd_ioctl(fd, u::PCIFAB_IOCTL_VERSION, &mut v) {
        Err(format!("VERSION: {}", errno_name(e)))
    } else if let Err(e) = fd_ioctl(fd, u::PCIFAB_IOCTL_MRPC, &mut m) {
        Err(format!("echo: {}", errno_name(e)))
    } else if out[..] != echo_answer(&input)[..] {
        Err(format!("echo returned {out:?}, not the input inverted"))
    } else {
        Ok(())
    };
    // SAFETY: ours.
    unsafe { libc::close(fd) };
    r
}

pub fn cmd_probe_faults(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let path = a.need("module")?.to_string();
    let from = num("--from", a.get("from").unwrap_or("1"))?.max(1);
    let to = num("--to", a.get("to").unwrap_or("100000"))?.min(100_000);
    let fail = FailNth::open()?;
    let knobs = configure_debugfs()?;
    let mut kmsg = Kmsg::open()?;
    let bdf = kmod::find_mep()?;
    if kmod::loaded() {
        kmod::unload_retry(Duration::from_secs(10))
            .map_err(|e| check(format!("unloading pcifab first: {}", errno_name(e))))?;
    }
    let baseline = Traces::now(&bdf);
    let left = kmod::leftovers(&bdf, &baseline, false);
    if !left.is_empty() {
        return Err(check(format!("before the first load: {}", left.join("; "))));
    }
    let m = ModuleFile::open(&path)?;
    let start = Instant::now();
    let (mut load_failed, mut probe_failed, mut tolerated) = (0u64, 0u64, 0u64);
    let mut errnos: BTreeMap<String, u64> = BTreeMap::new();
    let mut done = None;
    let mut failure = None;
    let mut last = from;
    for n in from..=to {
        last = n;
        fail.set(n)
            .map_err(|e| check(format!("writing {n} to {FAIL_NTH}: {}", errno_name(e))))?;
        let rc = m.load();
        let injected = fail.left() == Some(0);
        fail.clear()?;
        let mut bad = Vec::new();
        match (rc, injected) {
            (Err(e), true) => {
                load_failed += 1;
                *errnos.entry(errno_name(e)).or_default() += 1;
                bad.extend(kmod::leftovers(&bdf, &baseline, false));
            }
            (Err(e), false) => bad.push(format!(
                "loading failed with {} though no fault was injected",
                errno_name(e)
            )),
            (Ok(()), injected) => {
                let bound = kmod::driver_of(&bdf).as_deref() == Some(kmod::MODULE);
                if bound {
                    if let Err(e) = works() {
                        bad.push(format!(
                            "the MEP is bound but /dev/pcifab0 does not work: {e}"
                        ));
                    }
                } else {
                    bad.extend(kmod::leftovers(&bdf, &baseline, true));
                }
                if !injected {
                    if bound && bad.is_empty() {
                        done = Some(n);
                    } else if !bound {
                        bad.push("no fault was injected, yet the MEP is not bound".into());
                    }
                } else {
                    if bound {
                        tolerated += 1;
                    } else {
                        probe_failed += 1;
                    }
                    match kmod::unload() {
                        Ok(()) => bad.extend(kmod::leftovers(&bdf, &baseline, false)),
                        Err(e) => bad.push(format!("unloading afterwards: {}", errno_name(e))),
                    }
                }
            }
        }
        if kmsg.poll() > 0 {
            bad.push(format!(
                "kernel splat: {}",
                kmsg.splats
                    .iter()
                    .take(8)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
        if !bad.is_empty() {
            failure = Some(format!("fail-nth {n}: {}", bad.join("; ")));
            // Leave the guest with the module loaded and bound, as the scenarios expect.
            if !kmod::loaded() {
                let _ = m.load();
            }
            break;
        }
        if done.is_some() {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let tried = last - from + 1;
    let mut e = String::new();
    for (k, v) in &errnos {
        let _ = write!(
            e,
            "{}{}:{v}",
            if e.is_empty() { "" } else { "," },
            json_str(k)
        );
    }
    println!(
        "{{\"test\":\"probe-faults\",\"from\":{from},\"last\":{last},\"done\":{},\
         \"final_nth\":{},\"load_failed\":{load_failed},\"probe_failed\":{probe_failed},\
         \"tolerated\":{tolerated},\"load_errnos\":{{{e}}},\"secs\":{secs:.1},\
         \"ms_per_nth\":{:.1},\"kmsg_lost\":{},\"knobs\":[{}],\"failure\":{}}}",
        done.is_some(),
        done.map_or("null".into(), |n| n.to_string()),
        secs * 1000.0 / tried as f64,
        kmsg.lost,
        knobs
            .iter()
            .map(|k| json_str(k))
            .collect::<Vec<_>>()
            .join(","),
        failure.as_deref().map_or("null".to_string(), json_str)
    );
    match failure {
        None => Ok(()),
        Some(f) => Err(check(f)),
    }
}
