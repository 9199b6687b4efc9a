// SPDX-License-Identifier: GPL-2.0-only
//! `pcifab-selftest abi`: the bad-input table of every ioctl (sizes, flags, pointers into
//! inaccessible and read-only pages, MRPC and P2P_COPY fields, unknown numbers). A rejected
//! call must change nothing: no command started, no STATS counter moved, no user memory
//! written.

use pcifab_uapi::{Arg, Identity, Mrpc, P2pCopy, P2pRoutes, Stats, Version};

use super::args::{device, Opts};
use super::ioctl::{as_bytes, Dev, ECHO};
use super::mem::{Arena, Pages, ARENA_RW, PAGE};
use super::util::{check, errno_name, json_str, Res};

/// One ioctl of the table.
/// `struct pcifab_identity` of uAPI 1.0, which grew since.
const IDENTITY_V1_SIZE: usize = 68;

struct Ioctl {
    name: &'static str,
    nr: u32,
    size: usize,
    /// The first version's size: smaller is `EINVAL`, from here to `size` is accepted.
    min: usize,
    /// A valid struct of this ioctl, as bytes.
    valid: Vec<u8>,
    /// MRPC commands a successful call starts.
    starts: u64,
}

struct AbiRun<'a> {
    dev: &'a Dev,
    arena: Arena,
    rows: Vec<String>,
    failures: Vec<String>,
}

impl AbiRun<'_> {
    /// Runs one case: `setup` fills the arena and returns the argument pointer.
    fn case(
        &mut self,
        name: &str,
        nr: u32,
        expected: i32,
        starts: u64,
        setup: impl FnOnce(&mut [u8], Pages) -> *mut u8,
    ) -> Res<()> {
        let pages = self.arena.pages();
        let rw = self.arena.rw();
        rw.fill(0);
        let arg = setup(rw, pages);
        let snapshot = self.arena.rw().to_vec();
        let before = self.dev.stats()?;
        let got = match self.dev.ioctl_raw(nr, arg) {
            Ok(()) => 0,
            Err(e) => e,
        };
        let after = self.dev.stats()?;
        let mut why = Vec::new();
        if got != expected {
            why.push(format!(
                "expected {}, got {}",
                errno_name(expected),
                errno_name(got)
            ));
        }
        let want_commands = if got == 0 { starts } else { 0 };
        let delta = after.mrpc_commands.wrapping_sub(before.mrpc_commands);
        if delta != want_commands {
            why.push(format!(
                "STATS mrpc_commands: expected +{want_commands}, got +{delta}"
            ));
        }
        if got != 0 {
            // mrpc_completions and event_irqs are left out: the completion interrupt of an
            // earlier, successful command may be counted after its ioctl returned.
            if before.mrpc_timeouts != after.mrpc_timeouts
                || before.mrpc_firmware_dead != after.mrpc_firmware_dead
            {
                why.push(format!(
                    "STATS changed by a rejected call: before {before:?}, after {after:?}"
                ));
            }
            if self.arena.rw() != snapshot.as_slice() {
                let i = snapshot
                    .iter()
                    .zip(self.arena.rw().iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                why.push(format!(
                    "a rejected call wrote user memory (first changed byte at offset {i})"
                ));
            }
        }
        self.rows.push(format!(
            "{{\"case\":{},\"expected\":{},\"got\":{},\"ok\":{}}}",
            json_str(name),
            json_str(&errno_name(expected)),
            json_str(&errno_name(got)),
            why.is_empty()
        ));
        eprintln!(
            "{:<58} expected {:<9} got {:<9} {}",
            name,
            errno_name(expected),
            errno_name(got),
            if why.is_empty() { "ok" } else { "FAIL" }
        );
        if !why.is_empty() {
            self.failures.push(format!("{name}: {}", why.join(", ")));
        }
        Ok(())
    }
}

fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn cmd_abi(o: &Opts) -> Res<()> {
    let path = device(o, "/dev/pcifab0");
    let dev = Dev::open(&path, false)?;
    // P2P calls exist only where the firmware has pcifab's route extension.
    let mut id = Identity::new();
    dev.ioctl(pcifab_uapi::PCIFAB_IOCTL_IDENTITY, &mut id)
        .map_err(|e| check(format!("IDENTITY: {}", errno_name(e))))?;
    let p2p = id.features & pcifab_uapi::FEATURE_P2P_ROUTES != 0;
    let mut r = AbiRun {
        dev: &dev,
        arena: Arena::new()?,
        rows: Vec::new(),
        failures: Vec::new(),
    };
    // MRPC input/output live at fixed offsets of the second page, past any struct.
    const IN_OFF: usize = PAGE;
    const OUT_OFF: usize = PAGE + 1024 + 64;
    let base = r.arena.base() as u64;
    let mut m = Mrpc::new();
    m.cmd = ECHO;
    m.in_ptr = base + IN_OFF as u64;
    m.out_ptr = base + OUT_OFF as u64;
    let mut ioctls = vec![
        Ioctl {
            name: "VERSION",
            nr: pcifab_uapi::PCIFAB_IOCTL_VERSION,
            size: std::mem::size_of::<Version>(),
            min: std::mem::size_of::<Version>(),
            valid: as_bytes(&Version::new()),
            starts: 0,
        },
        Ioctl {
            name: "IDENTITY",
            nr: pcifab_uapi::PCIFAB_IOCTL_IDENTITY,
            size: std::mem::size_of::<Identity>(),
            min: IDENTITY_V1_SIZE,
            valid: as_bytes(&Identity::new()),
            starts: 0,
        },
        Ioctl {
            name: "MRPC",
            nr: pcifab_uapi::PCIFAB_IOCTL_MRPC,
            size: std::mem::size_of::<Mrpc>(),
            min: std::mem::size_of::<Mrpc>(),
            valid: as_bytes(&m),
            starts: 1,
        },
        Ioctl {
            name: "STATS",
            nr: pcifab_uapi::PCIFAB_IOCTL_STATS,
            size: std::mem::size_of::<Stats>(),
            min: std::mem::size_of::<Stats>(),
            valid: as_bytes(&Stats::new()),
            starts: 0,
        },
        Ioctl {
            // Room for no routes: the firmware's route list is one command.
            name: "P2P_ROUTES",
            nr: pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTES,
            size: std::mem::size_of::<P2pRoutes>(),
            min: std::mem::size_of::<P2pRoutes>(),
            valid: as_bytes(&{
                let mut l = P2pRoutes::new();
                l.route_size = std::mem::size_of::<pcifab_uapi::Route>() as u32;
                l
            }),
            starts: 1,
        },
    ];
    if !p2p {
        // The whole call is refused before its argument matters.
        r.case(
            "P2P_ROUTES without the firmware's route extension",
            pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTES,
            libc::EOPNOTSUPP,
            0,
            |b, _| {
                let mut l = P2pRoutes::new();
                l.route_size = std::mem::size_of::<pcifab_uapi::Route>() as u32;
                b[..std::mem::size_of::<P2pRoutes>()].copy_from_slice(&as_bytes(&l));
                b.as_mut_ptr()
            },
        )?;
        ioctls.retain(|io| io.name != "P2P_ROUTES");
    }
    for io in &ioctls {
        let (n, sz, v) = (io.name, io.size, &io.valid);
        let with_size = |buf: &mut [u8], size: usize| {
            buf[..v.len()].copy_from_slice(v);
            put_u32(buf, 0, size as u32);
        };
        r.case(
            &format!("{n} valid (size {sz})"),
            io.nr,
            0,
            io.starts,
            |b, _| {
                with_size(b, sz);
                b.as_mut_ptr()
            },
        )?;
        // Programs built against uAPI 1.0-1.6 send _IO(0xFA, nr): the same ioctl.
        let old = pcifab_uapi::legacy(io.nr);
        r.case(
            &format!("{n} by its uAPI 1.6 number {old:#x}, valid"),
            old,
            0,
            io.starts,
            |b, _| {
                with_size(b, sz);
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} by its uAPI 1.6 number {old:#x}, size 0"),
            old,
            libc::EINVAL,
            0,
            |b, _| {
                with_size(b, 0);
                b.as_mut_ptr()
            },
        )?;
        let min = io.min;
        for (what, size) in [("0", 0), ("4", 4), ("first version's size-1", min - 1)] {
            r.case(
                &format!("{n} size {what}"),
                io.nr,
                libc::EINVAL,
                0,
                |b, _| {
                    with_size(b, size);
                    b.as_mut_ptr()
                },
            )?;
        }
        r.case(&format!("{n} size 4097"), io.nr, libc::E2BIG, 0, |b, _| {
            with_size(b, 4097);
            b.as_mut_ptr()
        })?;
        r.case(
            &format!("{n} size 0xffffffff"),
            io.nr,
            libc::E2BIG,
            0,
            |b, _| {
                with_size(b, u32::MAX as usize);
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} size sizeof+64, non-zero byte past the struct"),
            io.nr,
            libc::E2BIG,
            0,
            |b, _| {
                with_size(b, sz + 64);
                b[sz + 63] = 1;
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} size sizeof+1, non-zero byte right after"),
            io.nr,
            libc::E2BIG,
            0,
            |b, _| {
                with_size(b, sz + 1);
                b[sz] = 0x80;
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} size sizeof+64, zeros past the struct"),
            io.nr,
            0,
            io.starts,
            |b, _| {
                with_size(b, sz + 64);
                b.as_mut_ptr()
            },
        )?;
        r.case(
            &format!("{n} size 4096, zeros past the struct"),
            io.nr,
            0,
            io.starts,
            |b, _| {
                with_size(b, 4096);
                b.as_mut_ptr()
            },
        )?;
        for flags in [1u32, 0x8000_0000] {
            r.case(
                &format!("{n} flags {flags:#x}"),
                io.nr,
                libc::EINVAL,
                0,
                |b, _| {
                    with_size(b, sz);
                    put_u32(b, 4, flags);
                    b.as_mut_ptr()
                },
            )?;
        }
        r.case(
            &format!("{n} NULL argument"),
            io.nr,
            libc::EFAULT,
            0,
            |_, _| std::ptr::null_mut(),
        )?;
        r.case(
            &format!("{n} argument in an inaccessible page"),
            io.nr,
            libc::EFAULT,
            0,
            |_, p| p.none,
        )?;
        r.case(
            &format!("{n} argument running into an inaccessible page"),
            io.nr,
            libc::EFAULT,
            0,
            |b, _| {
                // The size field is readable, the rest of the struct is not.
                let at = ARENA_RW - 8;
                b[at..at + 8].copy_from_slice(&v[..8]);
                b[at..].as_mut_ptr()
            },
        )?;
        // Readable but not writable: the result cannot be written back.
        let mut ro = v.clone();
        put_u32(&mut ro, 0, sz as u32);
        r.arena.set_read_only(&ro)?;
        r.case(
            &format!("{n} argument in a read-only page"),
            io.nr,
            libc::EFAULT,
            0,
            |_, p| p.read_only,
        )?;
    }

    // MRPC-specific fields. Offsets in struct pcifab_mrpc.
    const IN_LEN: usize = 12;
    const OUT_LEN: usize = 16;
    const TIMEOUT: usize = 20;
    const IN_PTR: usize = 24;
    const OUT_PTR: usize = 32;
    let mrpc_nr = pcifab_uapi::PCIFAB_IOCTL_MRPC;
    let valid = ioctls[2].valid.clone();
    let put_u64 =
        |b: &mut [u8], off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    type Edit<'a> = Box<dyn Fn(&mut [u8]) + 'a>;
    let none = r.arena.pages().none as u64;
    // Zero-filled again: only the first bytes of the read-only page were set.
    let ro = r.arena.pages().read_only as u64 + 1024;
    let cases: Vec<(&str, i32, u64, Edit)> = vec![
        (
            "MRPC in_len 1024, out_len 1024",
            0,
            1,
            Box::new(|b| {
                put_u32(b, IN_LEN, 1024);
                put_u32(b, OUT_LEN, 1024);
            }),
        ),
        (
            "MRPC in_len 1025",
            libc::EINVAL,
            0,
            Box::new(|b| put_u32(b, IN_LEN, 1025)),
        ),
        (
            "MRPC out_len 1025",
            libc::EINVAL,
            0,
            Box::new(|b| put_u32(b, OUT_LEN, 1025)),
        ),
        (
            "MRPC in_len 0xffffffff",
            libc::EINVAL,
            0,
            Box::new(|b| put_u32(b, IN_LEN, u32::MAX)),
        ),
        (
            "MRPC timeout_ms 60000",
            0,
            1,
            Box::new(|b| put_u32(b, TIMEOUT, 60_000)),
        ),
        (
            "MRPC timeout_ms 60001",
            libc::EINVAL,
            0,
            Box::new(|b| put_u32(b, TIMEOUT, 60_001)),
        ),
        (
            "MRPC in_ptr NULL, in_len 4",
            libc::EFAULT,
            0,
            Box::new(|b| {
                put_u32(b, IN_LEN, 4);
                put_u64(b, IN_PTR, 0);
            }),
        ),
        (
            "MRPC in_ptr inaccessible, in_len 4",
            libc::EFAULT,
            0,
            Box::new(move |b| {
                put_u32(b, IN_LEN, 4);
                put_u64(b, IN_PTR, none);
            }),
        ),
        (
            "MRPC in_ptr runs into an inaccessible page",
            libc::EFAULT,
            0,
            Box::new(move |b| {
                put_u32(b, IN_LEN, 16);
                put_u64(b, IN_PTR, none - 8);
            }),
        ),
        (
            "MRPC in_ptr NULL, in_len 0",
            0,
            1,
            Box::new(|b| put_u64(b, IN_PTR, 0)),
        ),
        (
            "MRPC out_ptr NULL, out_len 4",
            libc::EFAULT,
            0,
            Box::new(|b| {
                put_u32(b, OUT_LEN, 4);
                put_u64(b, OUT_PTR, 0);
            }),
        ),
        (
            "MRPC out_ptr inaccessible, out_len 4",
            libc::EFAULT,
            0,
            Box::new(move |b| {
                put_u32(b, OUT_LEN, 4);
                put_u64(b, OUT_PTR, none);
            }),
        ),
        (
            "MRPC out_ptr read-only, out_len 4",
            libc::EFAULT,
            0,
            Box::new(move |b| {
                put_u32(b, OUT_LEN, 4);
                put_u64(b, OUT_PTR, ro);
            }),
        ),
    ];
    for (name, expected, starts, edit) in cases {
        r.case(name, mrpc_nr, expected, starts, |b, _| {
            b[..valid.len()].copy_from_slice(&valid);
            edit(b);
            b.as_mut_ptr()
        })?;
    }
    // P2P_COPY: every bad argument is refused before the firmware is asked.
    let copy_nr = pcifab_uapi::PCIFAB_IOCTL_P2P_COPY;
    let mut c = P2pCopy::new();
    (c.src.kind, c.src.pdfid) = (pcifab_uapi::P2P_FUNCTION, 0x0300);
    (c.dst.kind, c.dst.pdfid) = (pcifab_uapi::P2P_FUNCTION, 0x0400);
    c.len = 1;
    let copy_valid = as_bytes(&c);
    // Offsets in struct pcifab_p2p_copy.
    const SRC_KIND: usize = 8;
    const SRC_RSVD: usize = 14;
    const DST_KIND: usize = 24;
    const LEN: usize = 40;
    const COPY_TIMEOUT: usize = 60;
    let copy_cases: Vec<(&str, Edit)> = vec![
        ("P2P_COPY len 0", Box::new(|b| put_u64(b, LEN, 0))),
        (
            "P2P_COPY len PCIFAB_P2P_MAX_LEN + 1",
            Box::new(|b| put_u64(b, LEN, pcifab_uapi::P2P_MAX_LEN + 1)),
        ),
        (
            "P2P_COPY source kind 3",
            Box::new(|b| put_u32(b, SRC_KIND, 3)),
        ),
        (
            "P2P_COPY destination kind 0xffffffff",
            Box::new(|b| put_u32(b, DST_KIND, u32::MAX)),
        ),
        (
            "P2P_COPY user buffer to IOVA",
            Box::new(|b| {
                put_u32(b, SRC_KIND, pcifab_uapi::P2P_USER);
                put_u32(b, DST_KIND, pcifab_uapi::P2P_IOVA);
            }),
        ),
        (
            "P2P_COPY reserved field of an end",
            Box::new(|b| b[SRC_RSVD] = 1),
        ),
        (
            "P2P_COPY timeout_ms PCIFAB_P2P_MAX_TIMEOUT_MS + 1",
            Box::new(|b| put_u32(b, COPY_TIMEOUT, pcifab_uapi::P2P_MAX_TIMEOUT_MS + 1)),
        ),
    ];
    let mut copy_cases = copy_cases;
    // Without the firmware's engine two user buffers are a valid copy: the switch's DMA
    // endpoint runs it (uapi.rst).
    if id.features & pcifab_uapi::FEATURE_DMA_ENGINE != 0 {
        copy_cases.push((
            "P2P_COPY both ends user buffers",
            Box::new(|b| {
                put_u32(b, SRC_KIND, pcifab_uapi::P2P_USER);
                put_u32(b, DST_KIND, pcifab_uapi::P2P_USER);
            }),
        ));
    }
    for (name, edit) in copy_cases {
        r.case(name, copy_nr, libc::EINVAL, 0, |b, _| {
            b[..copy_valid.len()].copy_from_slice(&copy_valid);
            edit(b);
            b.as_mut_ptr()
        })?;
    }
    // Reserved fields must be zero, in every ioctl that has them (UNBIND, MOVE, EVENTS,
    // P2P_DISTANCE, P2P_GRANT and the P2P_COPY ends above). Each is refused before anything
    // else is looked at: an unknown function and a missing route would be other errors.
    const IDENTITY_RSVD: usize = 66;
    r.case(
        "IDENTITY __reserved0 non-zero",
        pcifab_uapi::PCIFAB_IOCTL_IDENTITY,
        libc::EINVAL,
        0,
        |b, _| {
            let v = as_bytes(&Identity::new());
            b[..v.len()].copy_from_slice(&v);
            b[IDENTITY_RSVD] = 1;
            b.as_mut_ptr()
        },
    )?;
    r.case(
        "BIND pdfids past nr_pdfids non-zero",
        pcifab_uapi::PCIFAB_IOCTL_BIND,
        libc::EINVAL,
        0,
        |b, _| {
            let mut x = pcifab_uapi::Bind::new();
            (x.pdfid, x.nr_pdfids, x.flags) = (0xfffe, 1, pcifab_uapi::BIND_NO_WAIT);
            x.pdfids[0] = 0xfffe;
            x.pdfids[3] = 0xfffd;
            let v = as_bytes(&x);
            b[..v.len()].copy_from_slice(&v);
            b.as_mut_ptr()
        },
    )?;
    for (what, off) in [("__reserved0", 8 + 27), ("__reserved1", 8 + 28)] {
        r.case(
            &format!("P2P_ROUTE_DEL route.{what} non-zero"),
            pcifab_uapi::PCIFAB_IOCTL_P2P_ROUTE_DEL,
            libc::EINVAL,
            0,
            |b, _| {
                let v = as_bytes(&pcifab_uapi::P2pRoute::new());
                b[..v.len()].copy_from_slice(&v);
                b[off] = 1;
                b.as_mut_ptr()
            },
        )?;
    }
    // Unknown ioctl numbers.
    for (name, nr) in [
        ("unknown ioctl 0xfa7f", pcifab_uapi::io(0xfa, 0x7f)),
        ("unknown ioctl 0xfaff", pcifab_uapi::io(0xfa, 0xff)),
        ("unknown ioctl TCGETS 0x5401", 0x5401),
        (
            "unknown ioctl _IOWR(0xfa, 0x11, 48)",
            (3 << 30) | (48 << 16) | pcifab_uapi::io(0xfa, 0x11),
        ),
        (
            "MRPC's number with direction _IOR",
            (2 << 30) | (48 << 16) | pcifab_uapi::io(0xfa, 0x02),
        ),
        (
            "MRPC's number with size 47",
            (3 << 30) | (47 << 16) | pcifab_uapi::io(0xfa, 0x02),
        ),
        (
            "_IO(0xfa, 0x11), past the old numbers",
            pcifab_uapi::io(0xfa, 0x11),
        ),
    ] {
        r.case(name, nr, libc::ENOTTY, 0, |b, _| {
            b[..valid.len()].copy_from_slice(&valid);
            b.as_mut_ptr()
        })?;
    }
    // The version a valid call reports.
    let mut v = Version::new();
    dev.ioctl(pcifab_uapi::PCIFAB_IOCTL_VERSION, &mut v)
        .map_err(|e| check(format!("VERSION: {}", errno_name(e))))?;
    if v.major != pcifab_uapi::VERSION_MAJOR {
        r.failures.push(format!(
            "VERSION major: expected {}, got {}",
            pcifab_uapi::VERSION_MAJOR,
            v.major
        ));
    }
    // ... and the same by the old number, as an old binary asks.
    let mut old = Version::new();
    dev.ioctl(
        pcifab_uapi::legacy(pcifab_uapi::PCIFAB_IOCTL_VERSION),
        &mut old,
    )
    .map_err(|e| check(format!("VERSION by its uAPI 1.6 number: {}", errno_name(e))))?;
    if (old.major, old.minor) != (v.major, v.minor) {
        r.failures.push(format!(
            "VERSION by its uAPI 1.6 number: {}.{}, by today's {}.{}",
            old.major, old.minor, v.major, v.minor
        ));
    }
    println!(
        "{{\"test\":\"abi\",\"uapi\":\"{}.{}\",\"cases\":{},\"failed\":{},\"results\":[{}]}}",
        v.major,
        v.minor,
        r.rows.len(),
        r.failures.len(),
        r.rows.join(",")
    );
    if r.failures.is_empty() {
        Ok(())
    } else {
        Err(check(format!(
            "{} of {} cases failed: {}",
            r.failures.len(),
            r.rows.len(),
            r.failures.join("; ")
        )))
    }
}
