// SPDX-License-Identifier: GPL-2.0-only
//! A caller whose buffer never finishes faulting (`stall-inventory`): the inventory ioctl's
//! function array lies in a userfaultfd range that is never filled, so the kernel's copy into
//! it waits for as long as this process lets it. The scenario meanwhile checks that other
//! callers of the driver are not held up by it.

use std::io::Write as _;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pcifab_uapi::{Arg, Function, Inventory, Port};

use super::args::Args;
use super::ioctl::{fd_ioctl, open_fd};
use super::util::{check, errno, errno_name, json_str, num, Res};

pub const USAGE: &str = "\
  stall-inventory --seconds S [--device PATH]
        the inventory ioctl from a second thread, its function array in a userfaultfd
        range that is never filled: prints {\"stalled\":true} once the kernel's copy
        faulted there, holds it S seconds (or until SIGTERM), then closes the
        userfaultfd and prints how long the ioctl was held and how it ended (ok or
        EFAULT);
        {\"userfaultfd\":false,...} (exit 0) on a kernel without userfaultfd
";

/// `<linux/userfaultfd.h>`.
const UFFD_API: u64 = 0xaa;
/// `_IOWR(0xaa, 0x3f, struct uffdio_api)` (24 bytes).
const UFFDIO_API: u64 = 0xc018_aa3f;
/// `_IOWR(0xaa, 0x00, struct uffdio_register)` (32 bytes).
const UFFDIO_REGISTER: u64 = 0xc020_aa00;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// `struct uffd_msg`.
const UFFD_MSG_SIZE: usize = 32;

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn out(line: &str) {
    let mut o = std::io::stdout();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

pub fn cmd_stall_inventory(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let seconds = num("--seconds", a.need("seconds")?)?;
    let path = a.get("device").unwrap_or("/dev/pcifab0").to_string();

    // SAFETY: a plain system call; no user-mode-only flag, so kernel faults are held too.
    let uffd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as i32;
    if uffd < 0 {
        let e = errno();
        if e == libc::ENOSYS {
            out(&format!(
                "{{\"userfaultfd\":false,\"reason\":{}}}",
                json_str("the kernel has no CONFIG_USERFAULTFD (userfaultfd: ENOSYS)")
            ));
            return Ok(());
        }
        return Err(check(format!("userfaultfd(): {}", errno_name(e))));
    }
    let mut api = [UFFD_API, 0u64, 0u64];
    // SAFETY: `api` is a `struct uffdio_api`.
    if unsafe { libc::ioctl(uffd, UFFDIO_API as _, api.as_mut_ptr()) } != 0 {
        return Err(check(format!("UFFDIO_API: {}", errno_name(errno()))));
    }
    let len = 2 * 4096usize;
    // SAFETY: a fresh anonymous mapping, never touched by this process.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if buf == libc::MAP_FAILED {
        return Err(check(format!("mmap: {}", errno_name(errno()))));
    }
    let mut reg = [buf as u64, len as u64, UFFDIO_REGISTER_MODE_MISSING, 0u64];
    // SAFETY: `reg` is a `struct uffdio_register` naming the mapping above.
    if unsafe { libc::ioctl(uffd, UFFDIO_REGISTER as _, reg.as_mut_ptr()) } != 0 {
        return Err(check(format!("UFFDIO_REGISTER: {}", errno_name(errno()))));
    }
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t) };

    let fd = open_fd(&path, libc::O_RDONLY)
        .map_err(|e| check(format!("open {path}: {}", errno_name(e))))?;
    let funcs = buf as u64;
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let mut ports = vec![Port::default(); 64];
        let mut inv = Inventory::new();
        inv.nr_ports = ports.len() as u32;
        inv.nr_functions = (len / std::mem::size_of::<Function>()) as u32;
        inv.port_size = std::mem::size_of::<Port>() as u32;
        inv.function_size = std::mem::size_of::<Function>() as u32;
        inv.ports_ptr = ports.as_mut_ptr() as u64;
        inv.functions_ptr = funcs;
        let r = fd_ioctl(fd, pcifab_uapi::PCIFAB_IOCTL_INVENTORY, &mut inv);
        let _ = tx.send((r, started.elapsed()));
    });

    // The kernel's copy faulted in the range: the ioctl is inside the driver, stalled.
    let mut pfd = libc::pollfd {
        fd: uffd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 30_000) };
    if n != 1 {
        return Err(check(format!(
            "the inventory ioctl did not fault in the userfaultfd range within 30 s (poll {n}; \
             ioctl ended: {:?})",
            rx.try_recv().ok().map(|(r, _)| r.err().map(errno_name))
        )));
    }
    let mut msg = [0u8; UFFD_MSG_SIZE];
    // SAFETY: `msg` has room for one `struct uffd_msg`.
    let got = unsafe { libc::read(uffd, msg.as_mut_ptr().cast(), msg.len()) };
    if got != UFFD_MSG_SIZE as isize || msg[0] != UFFD_EVENT_PAGEFAULT {
        return Err(check(format!(
            "userfaultfd: expected a page-fault message, read {got} bytes, event {:#x}",
            msg[0]
        )));
    }
    let addr = u64::from_le_bytes(msg[16..24].try_into().unwrap_or_default());
    out(&format!(
        "{{\"stalled\":true,\"fault_addr_offset\":{}}}",
        addr.wrapping_sub(funcs)
    ));

    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline && !STOP.load(std::sync::atomic::Ordering::Relaxed) {
        if rx.try_recv().is_ok() {
            return Err(check(
                "the stalled inventory ioctl returned before it was released",
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let held = started.elapsed();
    // Closing the userfaultfd unregisters the range: the fault is taken again as an ordinary
    // one (or fails), and the copy ends.
    // SAFETY: `uffd` is ours and closed once.
    unsafe { libc::close(uffd) };
    let (r, took) = rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| check("the inventory ioctl did not return within 30 s of the release"))?;
    let e = r.err().unwrap_or(0);
    out(&format!(
        "{{\"released\":true,\"held_ms\":{},\"ioctl_ms\":{},\"errno\":{e},\"error\":{}}}",
        held.as_millis(),
        took.as_millis(),
        json_str(&errno_name(e))
    ));
    if e != 0 && e != libc::EFAULT {
        return Err(check(format!(
            "the released inventory ioctl: expected success or EFAULT, got {}",
            errno_name(e)
        )));
    }
    Ok(())
}
