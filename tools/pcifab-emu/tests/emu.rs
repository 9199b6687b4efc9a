// SPDX-License-Identifier: GPL-2.0-only
//! End-to-end tests: run the built emulator and talk to it over its sockets.

mod client;

use client::*;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_pcifab-emu");
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fabric.toml");

// GAS offsets, written out independently of the emulator's own constants.
const MRPC_OUTPUT: u64 = 0x400;
const MRPC_CMD: u64 = 0x800;
const MRPC_STATUS: u64 = 0x804;
const MRPC_RET: u64 = 0x808;
const MRPC_DMA_VER: u64 = 0x81c;
const SYS_INFO: u64 = 0x2000;
const PART_CFG: u64 = 0x4000;
const MRPC_COMP_HDR: u64 = 0x13c;
const PART_EVENT_SUMMARY: u64 = 0x114;
const NTB: u64 = 0x10000;
const PFF_CSR: u64 = 0x134000;

struct Emu {
    child: Child,
    dir: PathBuf,
    log: mpsc::Receiver<String>,
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pcifab-emu-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

impl Emu {
    fn start(tag: &str, config: &Path) -> Emu {
        let dir = scratch_dir(tag);
        let mut child = Command::new(EXE)
            .arg("--config")
            .arg(config)
            .arg("--run-dir")
            .arg(dir.join("run"))
            .arg("--verbose")
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn pcifab-emu");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[emu] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let emu = Emu {
            child,
            dir,
            log: rx,
        };
        emu.wait_log("pcifab-emu: ready");
        emu
    }

    /// Wait for a stderr line containing `what`.
    fn wait_log(&self, what: &str) -> String {
        loop {
            match self.log.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line containing '{what}': {e}"),
            }
        }
    }

    /// Every stderr line up to and including the first containing `what`.
    fn log_until(&self, what: &str) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            match self.log.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => {
                    let last = line.contains(what);
                    lines.push(line);
                    if last {
                        return lines;
                    }
                }
                Err(e) => panic!("no log line containing '{what}': {e}"),
            }
        }
    }

    fn sock(&self, name: &str) -> PathBuf {
        self.dir.join("run").join(name)
    }

    fn control(&self, req: &str) -> String {
        let mut s = UnixStream::connect(self.sock("control.sock")).expect("control socket");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        writeln!(s, "{req}").expect("send request");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).expect("reply");
        line.trim_end().to_owned()
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: signals our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("wait")
    }
}

impl Drop for Emu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn vfio_user_session_against_the_mep() {
    let emu = Emu::start("session", Path::new(EXAMPLE));
    assert_eq!(emu.control("ping"), "{\"ok\":true}");
    let mut c = Client::connect(&emu.sock("mep-h1.sock"));
    emu.wait_log("h1: client connected");

    // VERSION: QEMU speaks 0.0 and refuses a higher minor in the reply.
    let v = c.version(0).ok();
    assert_eq!((v[0], v[1], v[2], v[3]), (0, 0, 0, 0), "version 0.0");
    assert_eq!(v.last(), Some(&0), "JSON is NUL-terminated");
    let json = text(&v[4..v.len() - 1]);
    assert!(json.starts_with("{\"capabilities\":{"), "{json}");
    assert!(json.contains("\"max_msg_fds\":8") && json.contains("\"max_data_xfer_size\":1048576"));
    let v = c.version(1).ok();
    assert_eq!(u16::from_le_bytes([v[2], v[3]]), 1, "0.1 client gets 0.1");

    // Device, region and IRQ info.
    let info = c.request(GET_INFO, &le_words(&[16, 0, 0, 0]));
    assert_eq!(
        (info.u32_at(4), info.u32_at(8), info.u32_at(12)),
        (0b11, 9, 5),
        "PCI|RESET, 9 regions, 5 irqs"
    );
    let region = |c: &mut Client, i: u32| {
        let mut p = le_words(&[32, 0, i, 0]);
        p.extend_from_slice(&[0; 16]);
        c.request(GET_REGION_INFO, &p)
    };
    for (i, size, flags) in [
        (0, 0x40_0000u64, 3),
        (1, 0, 0),
        (2, 0x400_0000, 3), // the P2P window, 64 MiB by default, trapped
        (4, 0x4000, 3),
        (6, 0, 0),
        (7, 4096, 3),
        (8, 0, 0),
    ] {
        let r = region(&mut c, i);
        assert_eq!(
            (r.u32_at(8), r.u32_at(4), r.u64_at(16)),
            (i, flags, size),
            "region {i}"
        );
    }
    assert_eq!(region(&mut c, 9).errno(), Some(libc::EINVAL as u32));
    let irq = |c: &mut Client, i: u32| c.request(GET_IRQ_INFO, &le_words(&[16, 0, i, 0]));
    assert_eq!(irq(&mut c, 0).u32_at(12), 1, "INTx");
    assert_eq!(irq(&mut c, 2).u32_at(12), 4, "MSI-X vectors");
    assert_eq!(irq(&mut c, 5).errno(), Some(libc::EINVAL as u32));

    // Config space: ids, class, BARs, MSI-X and PCIe capabilities.
    let cfg = c.read(CONFIG, 0, 4096);
    let w16 = |o: usize| u16::from_le_bytes([cfg[o], cfg[o + 1]]);
    let w32 = |o: usize| u32::from_le_bytes(cfg[o..o + 4].try_into().expect("4"));
    assert_eq!((w16(0), w16(2)), (0x11f8, 0x4228));
    assert_eq!(w32(8), 0x0580_0001, "class 058000, revision 1");
    assert_eq!(cfg[0x0e], 0, "header type 0");
    assert_eq!(w32(0x10), 0x4, "BAR0 64-bit memory");
    assert_eq!(w32(0x20), 0x4, "BAR4 64-bit memory");
    let (mut pos, mut msix, mut exp) = (cfg[0x34] as usize, None, None);
    while pos != 0 {
        match cfg[pos] {
            0x11 => msix = Some(pos),
            0x10 => exp = Some(pos),
            _ => {}
        }
        pos = cfg[pos + 1] as usize;
    }
    let msix = msix.expect("MSI-X capability");
    assert_eq!(w16(msix + 2) & 0x7ff, 3, "4 MSI-X vectors");
    assert_eq!(w32(msix + 4), 0x4, "table in BAR4 at 0");
    assert_eq!(w32(msix + 8), 0x804, "PBA in BAR4 at 0x800");
    let exp = exp.expect("PCIe capability");
    assert_eq!(w16(exp + 2) & 0xff, 0x02, "v2 endpoint");
    // Command register writes stick; BAR sizing works.
    c.write(CONFIG, 4, &[0x06, 0x00]);
    assert_eq!(c.read(CONFIG, 4, 2), [0x06, 0x00]);
    c.write(CONFIG, 0x10, &[0xff; 8]);
    assert_eq!(
        c.read(CONFIG, 0x10, 8),
        (!0x3f_ffffu64 & !0xf | 4).to_le_bytes()
    );

    // sys_info equals the TOML config; h1 is partition 1 of 2.
    assert_eq!(c.read32(BAR0, SYS_INFO), 0x4228);
    assert_eq!(c.read32(BAR0, SYS_INFO + 4), 0x0000_4228);
    assert_eq!(c.read32(BAR0, SYS_INFO + 8), 0x0407_0041);
    assert_eq!(text(&c.read(BAR0, SYS_INFO + 0x13c, 8)), "MICROSEM");
    assert_eq!(
        text(&c.read(BAR0, SYS_INFO + 0x144, 24)),
        "PAX 28XG4               "
    );
    assert_eq!(text(&c.read(BAR0, SYS_INFO + 0x15c, 2)), "B0");
    assert_eq!(c.read(BAR0, SYS_INFO + 0x48, 1), [1], "gen4 partition_id");
    assert_eq!(
        c.read(BAR0, NTB, 2),
        [2, 1],
        "partition_count, partition_id"
    );
    assert_eq!(c.read32(BAR0, MRPC_DMA_VER), 1, "DMA MRPC offered");
    assert_eq!(c.read32(BAR0, MRPC_DMA_VER - 4), 1, "its own MSI-X vector");
    // Unaligned 8-byte and 2-byte accesses.
    let q = c.read(BAR0, SYS_INFO + 2, 8);
    assert_eq!(q, [0, 0, 0x28, 0x42, 0, 0, 0x41, 0x00]);
    assert_eq!(c.read(BAR0, SYS_INFO + 1, 2), [0x42, 0]);
    // PFFs counted the way the C driver does.
    let mut pffs = 0;
    while u16::from_le_bytes(
        c.read(BAR0, PFF_CSR + pffs * 0x1000, 2)
            .try_into()
            .expect("2"),
    ) == 0x11f8
    {
        pffs += 1;
    }
    assert_eq!(pffs, 12, "6 PFFs per partition");
    let p1 = PART_CFG + 0x400;
    assert_eq!(c.read32(BAR0, p1 + 0x10), 6, "h1 USP PFF");

    // Bad input gets error replies, not a dead connection.
    assert_eq!(
        c.try_read(BAR0, 0x3f_fffe, 4).errno(),
        Some(libc::EINVAL as u32)
    );
    assert_eq!(c.try_read(3, 0, 4).errno(), Some(libc::EINVAL as u32));
    // The P2P window without routes: all ones, a P2P fault.
    assert_eq!(c.read(2, 0x1000, 4), [0xff; 4]);
    assert_eq!(c.read32(BAR0, 0x3024), 1, "P2P_FAULT_COUNT");
    assert_eq!(c.read32(BAR0, 0x3034), 0x0040_0301, "P2P_CAPS: 64 MiB");
    assert_eq!(w32(0x18), 0xc, "BAR2 64-bit prefetchable");
    assert_eq!(
        c.try_write(CONFIG, 4095, &[0, 0]).errno(),
        Some(libc::EINVAL as u32)
    );
    assert_eq!(c.request(99, &[]).errno(), Some(libc::ENOSYS as u32));
    assert_eq!(
        c.request(REGION_READ, &[1, 2]).errno(),
        Some(libc::EINVAL as u32)
    );

    // MRPC echo through posted and acknowledged writes.
    let input: Vec<u8> = (0..100u32).map(|i| (i * 7 + 3) as u8).collect();
    for (i, chunk) in input.chunks(8).enumerate() {
        c.post_write(BAR0, (i * 8) as u64, chunk);
    }
    c.write32(BAR0, MRPC_CMD, 0x41);
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 2, "DONE");
    assert_eq!(c.read32(BAR0, MRPC_RET), 0);
    let inverted: Vec<u8> = input.iter().map(|b| !b).collect();
    assert_eq!(
        c.read(BAR0, MRPC_OUTPUT, 100),
        inverted,
        "echo output (inverted)"
    );
    assert_eq!(c.read(BAR0, MRPC_OUTPUT + 100, 4), [0; 4], "nothing beyond");
    emu.wait_log("h1: MRPC cmd 0x41 (ECHO) input 100 bytes -> status DONE");

    // Unknown command: ERROR with ERR_CMD_INVALID.
    c.write32(BAR0, MRPC_CMD, 0x1234);
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 0xff);
    assert_eq!(c.read32(BAR0, MRPC_RET), 0x64005);

    // MSI-X vector 0 gets an eventfd; MRPC completion interrupts are enabled
    // the way switchtec.c does at probe (CLEAR | EN_IRQ).
    let efd = eventfd();
    c.set_irq_eventfds(2, 0, 1, &[efd.as_raw_fd()]).ok();
    assert_eq!(c.read(BAR0, p1 + 0x100, 2), [0, 0], "vep_vector_number 0");
    c.write32(BAR0, p1 + MRPC_COMP_HDR, 0x9);
    assert_eq!(c.read32(BAR0, p1 + MRPC_COMP_HDR), 0x8);
    assert_eq!(wait_eventfd(&efd, 0), None, "quiet before the command");
    c.write32(BAR0, 0, 2); // DIETEMP_GET
    c.write32(BAR0, MRPC_CMD, 0x04);
    assert_eq!(
        wait_eventfd(&efd, 5000),
        Some(1),
        "MRPC completion interrupt"
    );
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 2);
    assert_eq!(c.read32(BAR0, MRPC_OUTPUT), 4500, "die temperature");
    let hdr = c.read32(BAR0, p1 + MRPC_COMP_HDR);
    assert_eq!(hdr, 0x8 | 0x1 | 1 << 5, "occurred, count 1, IRQ enabled");
    assert_eq!(
        c.read32(BAR0, p1 + PART_EVENT_SUMMARY),
        0x2,
        "MRPC_CMP summary"
    );
    c.write32(BAR0, p1 + MRPC_COMP_HDR, hdr); // the driver's ISR acknowledges
    assert_eq!(c.read32(BAR0, p1 + MRPC_COMP_HDR), 0x8);
    assert_eq!(c.read32(BAR0, p1 + PART_EVENT_SUMMARY), 0);
    emu.wait_log("h1: MSI-X vector 0 fired (MRPC completion)");

    // Disabling the vector (no fds) stops interrupts.
    c.set_irq_eventfds(2, 0, 1, &[]).ok();
    c.write32(BAR0, MRPC_CMD, 0x41);
    assert_eq!(wait_eventfd(&efd, 200), None, "vector disabled");

    let state = emu.control("state");
    assert!(
        state.starts_with("{\"ok\":true,\"firmware\":{\"device_id\":16936,"),
        "{state}"
    );
    assert!(state.contains("\"die_temp_centi\":4500"), "{state}");
    assert!(
        state.contains(
            "{\"name\":\"h1\",\"partition\":1,\"connected\":true,\"mrpc_commands\":4,\"irqs_fired\":1,\"ext_block_accesses\":0,\"bar_reads\":"
        ),
        "{state}"
    );
    assert!(
        state.contains("{\"name\":\"h0\",\"partition\":0,\"connected\":false,"),
        "{state}"
    );
    // Every BAR access of the client is one count; config space is none.
    let bar = |state: &str, k: &str| -> u64 {
        let h1 = &state[state.find("{\"name\":\"h1\"").expect("h1 in state")..];
        let at = h1.find(&format!("\"{k}\":")).expect(k) + k.len() + 3;
        h1[at..]
            .split(|ch: char| !ch.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a count")
    };
    let (r0, w0) = (bar(&state, "bar_reads"), bar(&state, "bar_writes"));
    c.read32(BAR0, SYS_INFO);
    c.read32(BAR0, MRPC_STATUS);
    c.read(BAR0, SYS_INFO + 0x13c, 8);
    c.write32(BAR0, 0, 7); // the MRPC input buffer: no command
    c.read(CONFIG, 0, 4);
    let after = emu.control("state");
    assert_eq!(
        (
            bar(&after, "bar_reads") - r0,
            bar(&after, "bar_writes") - w0
        ),
        (3, 1),
        "{after}"
    );
    assert_eq!(
        emu.control("frobnicate"),
        "{\"ok\":false,\"error\":\"unknown request 'frobnicate'; try ping or state\"}"
    );

    // Reset restores power-on registers.
    c.request(DEVICE_RESET, &[]).ok();
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 0);
    assert_eq!(c.read32(BAR0, p1 + MRPC_COMP_HDR), 0);

    // QEMU may reconnect: the socket accepts a new client.
    drop(c);
    emu.wait_log("h1: client disconnected");
    let mut c2 = Client::connect(&emu.sock("mep-h1.sock"));
    c2.version(0).ok();
    assert_eq!(c2.read32(BAR0, SYS_INFO), 0x4228);
    drop(c2);
    emu.wait_log("h1: client disconnected");

    let sockets = [
        emu.sock("mep-h0.sock"),
        emu.sock("mep-h1.sock"),
        emu.sock("control.sock"),
    ];
    let status = emu.terminate();
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    for s in sockets {
        assert!(!s.exists(), "{} removed", s.display());
    }
}

#[test]
fn garbage_does_not_kill_the_server() {
    let emu = Emu::start("garbage", Path::new(EXAMPLE));
    {
        // A header claiming a 4 GiB message: the server drops this client.
        let mut s = UnixStream::connect(emu.sock("mep-h0.sock")).expect("connect");
        s.write_all(&[1, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0])
            .expect("send");
        emu.wait_log("h0: client disconnected");
    }
    let mut c = Client::connect(&emu.sock("mep-h0.sock"));
    c.version(0).ok();
    assert_eq!(c.read(BAR0, NTB, 2), [2, 0]);
}

#[test]
fn bad_config_is_rejected() {
    let dir = scratch_dir("badcfg");
    let cfg = dir.join("bad.toml");
    std::fs::write(
        &cfg,
        "[firmware]\nproduct_id = \"much too long for the 24 bytes\"\n[[hosts]]\nname = \"h0\"\n",
    )
    .expect("write config");
    let out = Command::new(EXE)
        .arg("--config")
        .arg(&cfg)
        .arg("--run-dir")
        .arg(dir.join("run"))
        .output()
        .expect("run");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("firmware.product_id") && err.contains("at most 24"),
        "{err}"
    );

    let out = Command::new(EXE).arg("--frob").output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unexpected argument '--frob'"));
    let out = Command::new(EXE).arg("--help").output().expect("run");
    assert!(out.status.success() && text(&out.stdout).contains("--run-dir <DIR>"));
    let _ = std::fs::remove_dir_all(dir);
}

// ---- The fabric model and its MRPC commands (Documentation/mrpc.rst) ----

const SW_GFMS_HDR: u64 = 0x1968;
const SW_GFMS_DATA: u64 = 0x196c;
const GLOBAL_SUMMARY: u64 = 0x1820;
const PFF_LINK_STATE_HDR: u64 = 0xd30;
const PFF_EVENT_SUMMARY: u64 = 0xc00;
const PORT_EVENT_BITMAP: u64 = 0x104;

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4"))
}

/// Run one MRPC command; wait for it to leave INPROGRESS.
/// Returns (status, ret_value, output buffer).
fn mrpc(c: &mut Client, cmd: u32, input: &[u8]) -> (u32, u32, Vec<u8>) {
    if !input.is_empty() {
        c.write(BAR0, 0, input);
    }
    c.write32(BAR0, MRPC_CMD, cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let status = c.read32(BAR0, MRPC_STATUS);
        if status != 1 {
            return (
                status,
                c.read32(BAR0, MRPC_RET),
                c.read(BAR0, MRPC_OUTPUT, 1024),
            );
        }
        assert!(std::time::Instant::now() < deadline, "cmd {cmd:#x} hangs");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn ok(c: &mut Client, cmd: u32, input: &[u8]) -> Vec<u8> {
    let (status, ret, out) = mrpc(c, cmd, input);
    assert_eq!((status, ret), (2, 0), "cmd {cmd:#x} input {input:?}");
    out
}

fn err(c: &mut Client, cmd: u32, input: &[u8]) -> u32 {
    let (status, ret, _) = mrpc(c, cmd, input);
    assert_eq!(status, 0xff, "cmd {cmd:#x} input {input:?} must fail");
    ret
}

fn connect(emu: &Emu, host: &str) -> Client {
    let mut c = Client::connect(&emu.sock(&format!("mep-{host}.sock")));
    c.version(0).ok();
    c
}

#[test]
fn extension_commands_byte_by_byte() {
    let emu = Emu::start("ext", Path::new(EXAMPLE));
    let mut c = connect(&emu, "h1");

    // FABRIC_SUMMARY.
    let s = ok(&mut c, 0xf001, &[1, 0, 4, 0]);
    assert_eq!(le16(&s, 0), 1, "version");
    assert_eq!(le16(&s, 2), 32, "size");
    assert_eq!(le32(&s, 4), 1, "generation");
    assert_eq!(
        &s[8..12],
        &[2, 1, 4, 2],
        "hosts, partition, ports, endpoints"
    );
    assert_eq!(le16(&s, 12), 10, "functions");
    assert_eq!(le16(&s, 14), 2, "bound");
    let links = 1u64 | 1 << 8 | 1 << 16 | 1 << 24;
    assert_eq!(u64::from_le_bytes(s[16..24].try_into().expect("8")), links);
    assert_eq!(le32(&s, 24), 0, "no events");
    assert_eq!(&s[28..36], &[0; 8], "rsvd, then nothing");
    assert_eq!(
        err(&mut c, 0xf001, &[1, 0, 2, 0]),
        0x64006,
        "size too small"
    );
    assert_eq!(err(&mut c, 0xf001, &[2, 0, 4, 0]), 0x64006, "version");
    assert_eq!(err(&mut c, 0xf001, &[1, 0, 64, 0]), 0x64006, "not written");

    // FUNCTION_LIST, all in one page.
    let l = ok(&mut c, 0xf003, &[1, 0, 8, 0, 0, 0, 0, 0]);
    assert_eq!(le16(&l, 0), 1);
    assert_eq!(le16(&l, 2), 16 + 24 * 10);
    assert_eq!(le32(&l, 4), 1, "generation");
    assert_eq!((le16(&l, 8), le16(&l, 10), le16(&l, 12)), (10, 0, 10));
    assert_eq!(le16(&l, 14), 24);
    let pdfids: Vec<u16> = (0..10).map(|i| le16(&l, 16 + 24 * i)).collect();
    assert_eq!(
        pdfids,
        [0x300, 0x301, 0x302, 0x303, 0x304, 0x400, 0x401, 0x402, 0x403, 0x404]
    );
    let pf0 = &l[16..40];
    assert_eq!(
        pf0,
        &[
            0x00, 0x03, 0x00, 0x03, 0xde, 0x10, 0x30, 0x23, 0x00, 0x02, 0x03, 0x00, 16, 0, 4,
            0b100, 0, 0xff, 0xff, 0, 0, 0, 0, 0
        ]
    );
    let vf1 = &l[40..64];
    assert_eq!(
        vf1,
        &[
            0x01, 0x03, 0x00, 0x03, 0xde, 0x10, 0x31, 0x23, 0x00, 0x02, 0x03, 0x00, 16, 1, 0,
            0b111, 1, 0, 0, 0, 0, 0, 0, 0
        ],
        "gpu0 VF1 bound to h0 logical port 0"
    );
    let g1vf2 = &l[16 + 24 * 7..16 + 24 * 8];
    assert_eq!((g1vf2[16], g1vf2[17], g1vf2[18]), (1, 1, 1), "h1 lport 1");
    assert_eq!(&l[16 + 240..16 + 260], &[0; 20], "zero beyond the page");
    // Paged: 3 at a time, reassembled.
    let mut all = Vec::new();
    let mut start = 0u16;
    loop {
        let mut inp = vec![1, 0, 8, 0];
        inp.extend_from_slice(&start.to_le_bytes());
        inp.extend_from_slice(&3u16.to_le_bytes());
        let p = ok(&mut c, 0xf003, &inp);
        let n = le16(&p, 12) as usize;
        assert!(n <= 3);
        if n == 0 {
            break;
        }
        all.extend_from_slice(&p[16..16 + 24 * n]);
        start += n as u16;
    }
    assert_eq!(all, &l[16..16 + 240], "pages reassemble the table");
    assert_eq!(err(&mut c, 0xf003, &[1, 0, 8, 0, 11, 0, 0, 0]), 0xf0_0002);

    // FUNCTION_TELEMETRY.
    let t = ok(&mut c, 0xf002, &[1, 0, 8, 0, 0x00, 0x03, 0, 0]);
    assert_eq!(&t[0..8], &[1, 0, 24, 0, 0x00, 0x03, 0, 0]);
    assert_eq!(le32(&t, 8), 5500, "temperature");
    assert_eq!(le32(&t, 12), 250_000, "power");
    assert_eq!(&t[16..24], &[0, 0, 0, 0, 0, 0, 0, 0], "util 0, healthy");
    let t = ok(&mut c, 0xf002, &[1, 0, 8, 0, 0x01, 0x03, 0, 0]);
    assert_eq!(le32(&t, 12), 50_000, "VF: a fifth of the power");
    assert_eq!(
        err(&mut c, 0xf002, &[1, 0, 8, 0, 0x05, 0x03, 0, 0]),
        0xf0_0001
    );
    assert_eq!(
        emu.control("telemetry 0x300 9000 800000 77"),
        "{\"ok\":true}"
    );
    let t = ok(&mut c, 0xf002, &[1, 0, 8, 0, 0x00, 0x03, 0, 0]);
    assert_eq!(le32(&t, 8), 9000);
    assert_eq!(t[16], 77);
    assert_eq!(le32(&t, 20), 0b110, "thermal and power warnings");
}

#[test]
fn standard_fabric_commands() {
    let emu = Emu::start("std", Path::new(EXAMPLE));
    let mut c = connect(&emu, "h0");

    // TOPO_INFO_DUMP: start, status, data, finish.
    assert_eq!(ok(&mut c, 0x82, &[2])[..4], [1, 0, 0, 0], "NOT_START");
    assert_eq!(err(&mut c, 0x82, &[3, 0, 0, 0]), 0x64012);
    ok(&mut c, 0x82, &[1]);
    let st = ok(&mut c, 0x82, &[2]);
    assert_eq!((st[0], le16(&st, 2)), (3, (56 + 32 * 4) / 4), "READY");
    let mut topo = Vec::new();
    while topo.len() < 56 + 32 * 4 {
        let mut inp = vec![3, 0];
        inp.extend_from_slice(&(topo.len() as u16).to_le_bytes());
        let d = ok(&mut c, 0x82, &inp);
        let n = le16(&d, 2) as usize * 4;
        assert!(n > 0 && n <= 1000);
        topo.extend_from_slice(&d[4..4 + n]);
    }
    assert_eq!(err(&mut c, 0x82, &[3, 0, 2, 0]), 0x64006, "unaligned");
    ok(&mut c, 0x82, &[4]);
    assert_eq!(ok(&mut c, 0x82, &[2])[0], 1, "finished");
    assert_eq!(&topo[..48], &[0; 48][..]);
    let links = 1u64 | 1 << 8 | 1 << 16 | 1 << 24;
    assert_eq!(
        u64::from_le_bytes(topo[48..56].try_into().expect("8")),
        links
    );
    let port = |i: usize| &topo[56 + 32 * i..56 + 32 * (i + 1)];
    assert_eq!(&port(1)[..4], &[8, 3, 0, 8], "h1 USP: FABRIC_HOST");
    assert_eq!(&port(2)[..4], &[16, 2, 0, 16], "gpu0: FABRIC_EP");
    assert_eq!(&port(2)[4..24], &[0; 20][..]);
    assert_eq!(&port(2)[24..32], &[16, 16, 4, 4, 3, 0, 0, 0]);

    // GFMS_DB_DUMP PAX general.
    let p = ok(&mut c, 0x83, &[2]);
    assert_eq!(&p[..12], &[2, 0, 0, 0, 20, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&p[12..20], &[4, 2, 2, 0, 10, 0, 0, 0]);
    assert_eq!(&p[20..32], &[0; 12]);
    let ids: Vec<u16> = (0..8).map(|i| le16(&p, 32 + 2 * i)).collect();
    assert_eq!(ids, [1, 0xfff, 0x800, 0x82f, 0x900, 0x9ff, 0x100, 0x6ff]);
    assert_eq!(le32(&p, 48), 1 | 1 << 8, "rc ports");
    assert_eq!(le32(&p, 56), 1 << 16 | 1 << 24, "ep ports");
    assert_eq!(le32(&p, 76), 0xf_ffff, "free high: ports 32-51 of the 52");

    // HVD of h1: START names the HVD, GET and FINISH only the type.
    let start = ok(&mut c, 0x83, &[3, 1, 0, 0, 1, 0, 0, 0]);
    assert_eq!((le32(&start, 0), le32(&start, 4)), (37, 1));
    let r = ok(&mut c, 0x83, &[3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!((le32(&r, 0), le32(&r, 4)), (0, 3 + 37));
    let h = r[12..12 + 4 * 37].to_vec();
    ok(&mut c, 0x83, &[3, 0, 0, 0, 3, 0, 0, 0]);
    assert_eq!(
        err(&mut c, 0x83, &[3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]),
        0x64012,
        "GET after FINISH"
    );
    assert_eq!(&h[..12], &[3, 0, 0, 0, 37, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&h[12..20], &[1, 8, 0x01, 0x08, 4, 0, 0, 0]);
    let slot = |l: usize, s: usize| &h[20 + 4 * (4 * s + l)..24 + 4 * (4 * s + l)];
    assert_eq!(slot(0, 0), &[0, 0, 0, 0]);
    assert_eq!(slot(1, 0), &[1, 1, 0x02, 0x04], "gpu1 VF2 on lport 1");
    assert_eq!(slot(1, 1), &[1, 0, 0, 0]);
    assert_eq!(slot(3, 7), &[3, 0, 0, 0]);
    assert_eq!(h.len(), 148);
    assert_eq!(err(&mut c, 0x83, &[3, 2, 0, 0, 1, 0, 0, 0]), 0x64006);
    assert_eq!(err(&mut c, 0x83, &[3, 1]), 0x64006, "no type");

    // EP port 16, chunked like lib/fabric.c.
    let start = ok(&mut c, 0x83, &[5, 16, 0, 0, 1, 0, 0, 0]);
    let total = le32(&start, 0) as usize;
    assert_eq!((total, le32(&start, 4)), (3 + 4 + 9 * 5, 1));
    let mut data = Vec::new();
    let mut off = 0u32;
    loop {
        let mut inp = vec![5, 16, 0, 0, 2, 0, 0, 0];
        inp.extend_from_slice(&off.to_le_bytes());
        let r = ok(&mut c, 0x83, &inp);
        assert_eq!(le32(&r, 0), off);
        let size = le32(&r, 4) - 3;
        data.extend_from_slice(&r[12..12 + 4 * size as usize]);
        off += size;
        if total as u32 <= le32(&r, 0) + size {
            break;
        }
    }
    ok(&mut c, 0x83, &[5, 0, 0, 0, 3, 0, 0, 0]);
    assert_eq!(data.len(), total * 4);
    assert_eq!(&data[..12], &[5, 0, 0, 0, 52, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        &data[12..20],
        &[0, 16, 1, 0, 49, 0, 0, 0],
        "EP, port, 1, size"
    );
    assert_eq!(&data[20..28], &[5, 0, 0, 0, 47, 0, 0, 0], "5 functions");
    let f = |i: usize| &data[28 + 36 * i..28 + 36 * (i + 1)];
    assert_eq!(
        &f(0)[..24],
        &[
            0, 0, 0x00, 0x03, 3, 4, 0, 0, 0, 0, 0, 0, 0xde, 0x10, 0x30, 0x23, 0xde, 0x10, 0x30,
            0x23, 0x00, 0x02, 0x03, 2
        ],
        "SRIOV-PF with 4 VFs, class, 2 BARs"
    );
    assert_eq!(
        &f(1)[..12],
        &[1, 0, 0x01, 0x03, 0, 1, 0, 0, 1, 0, 0, 0],
        "SRIOV-VF 1 bound to h0 (USP port 0) lport 0"
    );
    assert_eq!(&f(1)[24..28], &[4, 14, 0, 0], "BAR0: 64-bit, 16 KiB");
    assert_eq!(f(1)[28], 0xc, "BAR2: 64-bit prefetchable");
    assert_eq!(&f(1)[30..36], &[0; 6]);
    assert_eq!(
        err(&mut c, 0x83, &[5, 16, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]),
        0x64012
    );
    assert_eq!(
        err(&mut c, 0x83, &[5, 8, 0, 0, 1, 0, 0, 0]),
        0x4,
        "host port"
    );
    let fg = ok(&mut c, 0x83, &[0]);
    assert_eq!(&fg[..12], &[0, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0], "FABRIC");
    assert_eq!(
        &fg[24..32],
        &[0, 0, 0, 0, 1, 2, 0, 0],
        "PAX 0 local, 1 unreachable"
    );
    assert_eq!(err(&mut c, 0x83, &[7]), 0x64004, "no such dump");

    // Link down of gpu0: EP section shrinks to NON.
    assert!(emu.control("link 16 down").contains("\"changed\":true"));
    let start = ok(&mut c, 0x83, &[5, 16, 0, 0, 1, 0, 0, 0]);
    assert_eq!(le32(&start, 0), 5);
    let r = ok(&mut c, 0x83, &[5, 16, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(le32(&r, 4), 8);
    assert_eq!(&r[24..32], &[2, 16, 0, 0, 2, 0, 0, 0]);
    let topo_port = {
        ok(&mut c, 0x82, &[1]);
        let d = ok(&mut c, 0x82, &[3, 0, 0, 0]);
        d[4 + 56 + 64 + 24..4 + 56 + 64 + 32].to_vec()
    };
    assert_eq!(topo_port, [16, 0, 4, 0, 0, 0, 0, 0], "down in the topology");
}

#[test]
fn events_and_shared_state() {
    let emu = Emu::start("events", Path::new(EXAMPLE));
    let mut c0 = connect(&emu, "h0");
    let mut c1 = connect(&emu, "h1");
    let efd = eventfd();
    c1.set_irq_eventfds(2, 0, 1, &[efd.as_raw_fd()]).ok();
    // h1 enables link-state interrupts on every PFF, like switchtec.c's
    // enable_link_state_events(), and the GFMS event interrupt.
    for pff in 0..12u64 {
        c1.write32(BAR0, PFF_CSR + pff * 0x1000 + PFF_LINK_STATE_HDR, 0x9);
    }
    c1.write32(BAR0, SW_GFMS_HDR, 0x9);
    assert_eq!(wait_eventfd(&efd, 0), None);

    // Host 0 disables the port of gpu0 (VF1 bound to h0 lport 0 = PFF 2).
    ok(&mut c0, 0x8d, &[0, 16, 0, 0]);
    assert_eq!(
        wait_eventfd(&efd, 5000),
        Some(1),
        "one interrupt per change on h1"
    );
    let hdr = c1.read32(BAR0, PFF_CSR + 2 * 0x1000 + PFF_LINK_STATE_HDR);
    assert_eq!(hdr, 0x8 | 1 | 1 << 5, "occurred, count 1");
    assert_eq!(
        c1.read32(BAR0, PFF_CSR + 2 * 0x1000 + PFF_EVENT_SUMMARY),
        1 << 12
    );
    assert_eq!(
        c1.read32(BAR0, PART_CFG + PORT_EVENT_BITMAP),
        1 << 1,
        "h0 DSP 0"
    );
    assert_eq!(c1.read32(BAR0, SW_GFMS_HDR), 0x8 | 1 | 1 << 5);
    assert_eq!(c1.read32(BAR0, SW_GFMS_DATA), 1, "one event queued for h1");
    assert_eq!(c1.read32(BAR0, GLOBAL_SUMMARY), 1 << 13);
    assert_eq!(
        c1.read32(BAR0, PFF_CSR + 0x1000 * 8 + PFF_LINK_STATE_HDR),
        0x8
    );
    // h0 did not enable anything: registers change, no interrupt is raised.
    assert_eq!(
        c0.read32(BAR0, PFF_CSR + 2 * 0x1000 + PFF_LINK_STATE_HDR),
        1 | 1 << 5
    );

    // Visible through h1's MEP.
    let s = ok(&mut c1, 0xf001, &[1, 0, 4, 0]);
    assert_eq!(le32(&s, 4), 2, "generation bumped");
    assert_eq!(s[16..24], (1u64 | 1 << 8 | 1 << 24).to_le_bytes());
    assert_eq!(le32(&s, 24), 1);
    let l = ok(&mut c1, 0xf003, &[1, 0, 8, 0, 1, 0, 1, 0]);
    assert_eq!(l[16 + 15], 0b011, "VF1: bound, link down");

    // GFMS_EVENT GET on h1: DEV_DEL port 16, 5 functions.
    let e = ok(&mut c1, 0x89, &[1, 0, 10, 0]);
    assert_eq!(&e[..12], &[1, 0, 0, 0, 8, 0, 3, 0, 16, 0, 5, 0]);
    assert_eq!(&e[12..16], &[0; 4]);
    assert_eq!(
        ok(&mut c1, 0x89, &[1, 0, 10, 0])[..4],
        [0, 0, 0, 0],
        "drained"
    );
    // h0 still has its own copy; CLEAR empties it.
    assert_eq!(ok(&mut c0, 0x89, &[1, 0, 0, 0])[..4], [0, 0, 1, 0], "req 0");
    ok(&mut c0, 0x89, &[0, 0, 0, 0]);
    assert_eq!(ok(&mut c0, 0x89, &[1, 0, 10, 0])[..4], [0, 0, 0, 0]);

    // The driver's ISR acknowledges; the summaries clear.
    c1.write32(BAR0, PFF_CSR + 2 * 0x1000 + PFF_LINK_STATE_HDR, hdr);
    assert_eq!(c1.read32(BAR0, PFF_CSR + 2 * 0x1000 + PFF_EVENT_SUMMARY), 0);
    assert_eq!(c1.read32(BAR0, PART_CFG + PORT_EVENT_BITMAP), 0);
    c1.write32(BAR0, SW_GFMS_HDR, 0x9);
    assert_eq!(c1.read32(BAR0, GLOBAL_SUMMARY), 0);

    // Control requests: host link and a database change.
    assert!(emu.control("link 8 down").contains("\"generation\":3"));
    assert_eq!(wait_eventfd(&efd, 5000), Some(1), "h1 USP PFF 6 + GFMS");
    assert_eq!(
        c1.read32(BAR0, PFF_CSR + 6 * 0x1000 + PFF_LINK_STATE_HDR) >> 5 & 0xff,
        1
    );
    assert_eq!(
        emu.control("fabric-change"),
        "{\"ok\":true,\"generation\":4}"
    );
    assert_eq!(wait_eventfd(&efd, 5000), Some(1), "GFMS");
    let e = ok(&mut c1, 0x89, &[1, 0, 10, 0]);
    assert_eq!(&e[..16], &[2, 0, 0, 0, 8, 0, 1, 0, 8, 0, 0, 0, 4, 0, 8, 0]);
    // Retrain through PORT_CONTROL: down and up, two changes.
    ok(&mut c0, 0x8d, &[2, 24, 0, 0]);
    assert_eq!(le32(&ok(&mut c1, 0xf001, &[1, 0, 4, 0]), 4), 6);
    assert_eq!(err(&mut c0, 0x8d, &[0, 30, 0, 0]), 0x4);
    assert_eq!(err(&mut c0, 0x8d, &[9, 16, 0, 0]), 0x64004);

    let state = emu.control("state");
    assert!(state.contains("\"generation\":6"), "{state}");
    assert!(
        state.contains("{\"port\":16,\"type\":\"endpoint\",\"name\":\"gpu0\",\"link\":\"down\"}"),
        "{state}"
    );
    assert!(
        state.contains("{\"pdfid\":769,\"pf_pdfid\":768,\"vf\":1,\"port\":16,\"kind\":\"gpu\",\"vid\":4318,\"did\":9009,\"class\":197120,\"total_vfs\":0,\"bound\":true,\"host\":\"h0\",\"logical_port\":0}"),
        "{state}"
    );
}

#[test]
fn fault_injection() {
    let emu = Emu::start("faults", Path::new(EXAMPLE));
    let mut c = connect(&emu, "h0");
    let efd = eventfd();
    c.set_irq_eventfds(2, 0, 1, &[efd.as_raw_fd()]).ok();
    c.write32(BAR0, PART_CFG + MRPC_COMP_HDR, 0x9);

    // delay: INPROGRESS until it completes.
    assert_eq!(emu.control("fault h0 delay 300"), "{\"ok\":true}");
    c.write32(BAR0, MRPC_CMD, 0x41);
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 1, "INPROGRESS");
    assert_eq!(wait_eventfd(&efd, 100), None);
    assert_eq!(wait_eventfd(&efd, 5000), Some(1));
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 2);
    c.write32(BAR0, PART_CFG + MRPC_COMP_HDR, 0x9);

    // completion-delay: the write returns at once, the command completes (status and
    // interrupt) no sooner than that long after it; `fault clear` keeps the setting.
    assert_eq!(emu.control("fault clear"), "{\"ok\":true}");
    assert_eq!(
        emu.control("fault h0 completion-delay 200000"),
        "{\"ok\":true}"
    );
    assert_eq!(emu.control("fault clear"), "{\"ok\":true}");
    let state = emu.control("state");
    assert!(
        state.contains("\"faults\":[\"completion-delay 200000\"]"),
        "{state}"
    );
    let t = std::time::Instant::now();
    c.write32(BAR0, MRPC_CMD, 0x41);
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 1, "INPROGRESS");
    assert!(t.elapsed() < Duration::from_millis(150), "write not held");
    assert_eq!(wait_eventfd(&efd, 5000), Some(1));
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 2);
    c.write32(BAR0, PART_CFG + MRPC_COMP_HDR, 0x9);
    assert!(emu
        .control("fault h0 completion-delay 1000001")
        .contains("too long"));
    assert_eq!(emu.control("fault h0 completion-delay 0"), "{\"ok\":true}");

    // mrpc-error.
    assert_eq!(emu.control("fault clear"), "{\"ok\":true}");
    assert_eq!(emu.control("fault h0 mrpc-error 0x64007"), "{\"ok\":true}");
    assert_eq!(err(&mut c, 0x41, b"x"), 0x64007);
    assert_eq!(wait_eventfd(&efd, 5000), Some(1), "errors complete too");
    c.write32(BAR0, PART_CFG + MRPC_COMP_HDR, 0x9);

    // drop-irq: completes, registers say so, no interrupt.
    assert_eq!(emu.control("fault clear h0"), "{\"ok\":true}");
    assert_eq!(emu.control("fault h0 drop-irq"), "{\"ok\":true}");
    ok(&mut c, 0x41, b"y");
    assert_eq!(c.read32(BAR0, PART_CFG + MRPC_COMP_HDR) & 1, 1);
    assert_eq!(wait_eventfd(&efd, 200), None, "interrupt dropped");
    c.write32(BAR0, PART_CFG + MRPC_COMP_HDR, 0x9);

    // bad-length.
    assert_eq!(emu.control("fault clear"), "{\"ok\":true}");
    assert_eq!(emu.control("fault all bad-length"), "{\"ok\":true}");
    let l = ok(&mut c, 0xf003, &[1, 0, 8, 0, 0, 0, 0, 0]);
    assert_eq!((le16(&l, 2), le16(&l, 12)), (2048, 84));
    assert_eq!(le32(&ok(&mut c, 0x83, &[2]), 4), 512);
    assert_eq!(le32(&ok(&mut c, 0x83, &[5, 16, 0, 0, 1, 0, 0, 0]), 0), 512);
    let r = ok(&mut c, 0x83, &[5, 16, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(le32(&r, 4), 512);
    ok(&mut c, 0x82, &[1]);
    assert_eq!(le16(&ok(&mut c, 0x82, &[3, 0, 0, 0]), 2), 512);
    assert_eq!(le16(&ok(&mut c, 0x89, &[1, 0, 1, 0]), 0), 300);

    // mrpc-hang: stays INPROGRESS; clearing the fault lets later ones run.
    assert_eq!(emu.control("fault clear"), "{\"ok\":true}");
    assert_eq!(emu.control("fault h0 mrpc-hang"), "{\"ok\":true}");
    wait_eventfd(&efd, 0); // drain the completions so far
    c.write32(BAR0, MRPC_CMD, 0x41);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 1, "hangs");
    assert_eq!(wait_eventfd(&efd, 0), None);
    let state = emu.control("state");
    assert!(state.contains("\"faults\":[\"mrpc-hang\"]"), "{state}");
    assert_eq!(emu.control("fault clear"), "{\"ok\":true}");
    ok(&mut c, 0x41, b"z");

    // firmware-dead: device_id reads 0 and commands hang.
    assert_eq!(emu.control("fault h0 firmware-dead"), "{\"ok\":true}");
    assert_eq!(c.read32(BAR0, SYS_INFO), 0);
    assert_eq!(c.read32(BAR0, SYS_INFO + 4), 0x4228, "only device_id");
    c.write32(BAR0, MRPC_CMD, 0x41);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(c.read32(BAR0, MRPC_STATUS), 1);
    let mut c1 = connect(&emu, "h1");
    assert_eq!(c1.read32(BAR0, SYS_INFO), 0x4228, "h1 unaffected");
    assert_eq!(emu.control("fault clear"), "{\"ok\":true}");
    assert_eq!(c.read32(BAR0, SYS_INFO), 0x4228);
    assert!(emu.control("fault h0 frob").contains("usage: fault"));
}

#[test]
fn bad_fabric_config_is_rejected() {
    let dir = scratch_dir("badfabric");
    let cfg = dir.join("bad.toml");
    std::fs::write(
        &cfg,
        "[[hosts]]\nname = \"h0\"\n[[endpoints]]\nname = \"g\"\nport = 0\nvendor_id = 1\n\
         device_id = 2\nclass = 0x030200\n",
    )
    .expect("write config");
    let out = Command::new(EXE)
        .arg("--config")
        .arg(&cfg)
        .arg("--run-dir")
        .arg(dir.join("run"))
        .output()
        .expect("run");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("endpoints[0]: port 0 is already used by hosts[0]"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// DMA_MAP / DMA_UNMAP bodies (vfio-user): argsz, flags, [offset,] iova, size.
fn dma_map_body(iova: u64, size: u64) -> Vec<u8> {
    let mut b = le_words(&[32, 3]);
    for v in [0, iova, size] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

fn dma_unmap_body(iova: u64, size: u64) -> Vec<u8> {
    let mut b = le_words(&[24, 0]);
    for v in [iova, size] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

/// QEMU unmaps everything from 0xfef00000 to the top of the address space
/// (iova + size == 2^64): accepted, exactly that range is dropped, and no
/// error line is logged; a range that really wraps is refused with one.
#[test]
fn dma_unmap_to_the_top_of_the_address_space() {
    const DMA_MAP: u16 = 2;
    const DMA_UNMAP: u16 = 3;
    let emu = Emu::start("dma-top", Path::new(EXAMPLE));
    let mut c = connect(&emu, "h0");
    for (iova, size) in [
        (0x1000_0000, 0x10_0000),
        (0xfee0_0000, 0x20_0000),
        (0x1_0000_0000, 0x1000),
        (0xffff_ffff_ffff_f000, 0x1000),
    ] {
        c.request(DMA_MAP, &dma_map_body(iova, size)).ok();
    }
    let body = dma_unmap_body(0xfef0_0000, 0xffff_ffff_0110_0000);
    assert_eq!(
        c.request(DMA_UNMAP, &body).ok(),
        body,
        "the reply echoes the request"
    );
    assert_eq!(
        emu.control("dma-maps h0"),
        "{\"ok\":true,\"maps\":[{\"iova\":268435456,\"size\":1048576,\"flags\":3,\"mmapped\":false},\
         {\"iova\":4276092928,\"size\":1048576,\"flags\":3,\"mmapped\":false}]}"
    );
    let wrap = dma_unmap_body(0xffff_ffff_ffff_f000, 0x2000);
    assert_eq!(
        c.request(DMA_UNMAP, &wrap).errno(),
        Some(libc::EINVAL as u32)
    );
    let lines = emu.log_until("bad DMA unmap range 0xfffffffffffff000+0x2000");
    let (last, before) = lines.split_last().expect("a line");
    assert!(last.starts_with("pcifab-emu: error: "), "{last}");
    let errors: Vec<_> = before
        .iter()
        .filter(|l| l.contains("pcifab-emu: error:"))
        .collect();
    assert!(
        errors.is_empty(),
        "error lines before the bad unmap: {errors:?}"
    );
}

/// The hostile mode through the real server: parsed replies lie, ECHO does
/// not, the counts show in `state`, and `fault clear` brings the truth back.
#[test]
fn hostile_firmware_over_vfio_user() {
    let emu = Emu::start("hostile", Path::new(EXAMPLE));
    let mut c = connect(&emu, "h0");
    // The output buffer and ret_value are read as they are; the status
    // register may lie in hostile mode, and without an injected delay a
    // command is complete once the write of `cmd` is acknowledged.
    let mut run = |cmd: u32, input: &[u8]| -> (u32, Vec<u8>) {
        c.write(BAR0, 0, input);
        c.write32(BAR0, MRPC_CMD, cmd);
        (c.read32(BAR0, MRPC_RET), c.read(BAR0, MRPC_OUTPUT, 1024))
    };
    let summary = [1u8, 0, 4, 0];
    let list = [1u8, 0, 8, 0, 0, 0, 0, 0];
    let truth = (run(0xf001, &summary), run(0xf003, &list));
    assert_eq!(emu.control("fault h0 hostile 0x5eed"), "{\"ok\":true}");
    let lies = (run(0xf001, &summary), run(0xf003, &list));
    let mut echo = b"the mailbox itself stays honest".to_vec();
    echo.resize(1024, 0xa5);
    let inverted: Vec<u8> = echo.iter().map(|b| !b).collect();
    assert_eq!(run(0x41, &echo), (0, inverted), "ECHO is exact (inverted)");
    let state = emu.control("state");
    assert!(
        state.contains("\"faults\":[\"hostile 24301\"],")
            && state.contains("\"hostile\":{\"seed\":24301,\"on\":true,\"mrpc_replies\":2,"),
        "{state}"
    );
    assert_eq!(emu.control("fault clear h0"), "{\"ok\":true}");
    let after = (run(0xf001, &summary), run(0xf003, &list));
    assert!(after == truth, "the truth after fault clear");
    // A reply whose status flipped to ERROR leaves the previous output in
    // the buffer, so compare (ret, output) of the pair as a whole.
    assert!(lies != truth, "hostile replies lie");
    assert_eq!(emu.control("invariants"), "{\"ok\":true,\"violations\":[]}");
}
