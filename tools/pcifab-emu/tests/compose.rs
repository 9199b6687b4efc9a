// SPDX-License-Identifier: GPL-2.0-only
//! Composing hosts at run time: function servers, GFMS bind/unbind (MRPC
//! 0x84) over a fake QMP server, policy, invariants, events and scrubbing.

mod client;

use client::*;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_pcifab-emu");

const FABRIC: &str = r#"
[policy]
manager = "h0"

[[hosts]]
name = "h0"
usp_port = 0

[[hosts]]
name = "h1"
usp_port = 8
allowed = ["gpu1"]
max_functions = 1

[[hosts]]
name = "h2"
usp_port = 9

[[endpoints]]
name = "gpu0"
port = 16
vendor_id = 0x10de
device_id = 0x2330
vf_device_id = 0x2331
class = 0x030200
vfs = 2
mem_mib = 2
vf_mem_mib = 1

[[endpoints]]
name = "gpu1"
port = 24
vendor_id = 0x10de
device_id = 0x2330
class = 0x030200
mem_mib = 1
"#;

/// A fake QEMU monitor: greeting, qmp_capabilities, device_add (refused on
/// bus dsp3), device_del (DEVICE_DELETED 100 ms later, except for ids in
/// `stuck`; a device_del of function 0 takes every function on its bus, as
/// a PCIe slot power-off does), blockdev-add and blockdev-del as QEMU checks
/// them: a node name is unique, a device's `drive` must name a node no other
/// device uses, and a node stays busy until its device's DEVICE_DELETED.
/// Every command line is logged.
#[derive(Clone)]
struct FakeQmp {
    log: Arc<Mutex<Vec<String>>>,
    stuck: Arc<Mutex<Vec<String>>>,
    delay_add: Arc<Mutex<Duration>>,
    /// Block nodes: (node-name, filename), in creation order.
    nodes: Arc<Mutex<Vec<(String, String)>>>,
    /// Nodes a device uses (until its DEVICE_DELETED).
    in_use: Arc<Mutex<Vec<String>>>,
    /// Refuse every blockdev-del.
    fail_blockdev_del: Arc<Mutex<bool>>,
    /// Device ids whose device_add is refused.
    refuse_add: Arc<Mutex<Vec<String>>>,
}

impl FakeQmp {
    fn start(path: &Path) -> FakeQmp {
        let listener = UnixListener::bind(path).expect("fake qmp");
        let q = FakeQmp {
            log: Arc::default(),
            stuck: Arc::default(),
            delay_add: Arc::new(Mutex::new(Duration::ZERO)),
            nodes: Arc::default(),
            in_use: Arc::default(),
            fail_blockdev_del: Arc::default(),
            refuse_add: Arc::default(),
        };
        let server = q.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let q = server.clone();
                std::thread::spawn(move || serve_qmp(conn, &q));
            }
        });
        q
    }

    fn commands(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The commands logged, parsed: (execute, arguments).
    fn parsed(&self) -> Vec<(String, serde_json::Value)> {
        self.commands()
            .iter()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                (
                    v["execute"].as_str().unwrap_or("").to_owned(),
                    v["arguments"].clone(),
                )
            })
            .collect()
    }

    fn nodes(&self) -> Vec<(String, String)> {
        self.nodes.lock().unwrap().clone()
    }
}

fn serve_qmp(conn: UnixStream, q: &FakeQmp) {
    let out = Arc::new(Mutex::new(conn.try_clone().expect("clone")));
    let send = |s: String| {
        let _ = out.lock().unwrap().write_all(format!("{s}\r\n").as_bytes());
    };
    send(r#"{"QMP": {"version": {"qemu": {"micro": 3, "minor": 1, "major": 11}}, "capabilities": ["oob"]}}"#.into());
    // (id, bus, addr, drive) of the devices added.
    let mut devices: Vec<(String, String, String, Option<String>)> = Vec::new();
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let v: serde_json::Value = serde_json::from_str(&line).expect("json from the emulator");
        q.log.lock().unwrap().push(line.clone());
        let id = v.get("id").cloned().unwrap_or(serde_json::Value::Null);
        let exec = v["execute"].as_str().unwrap_or("");
        let a = &v["arguments"];
        let ok = format!(r#"{{"return": {{}}, "id": {id}}}"#);
        let fail = |desc: String| {
            format!(
                r#"{{"error": {{"class": "GenericError", "desc": {}}}, "id": {id}}}"#,
                serde_json::Value::String(desc)
            )
        };
        match exec {
            "qmp_capabilities" => send(r#"{"return": {}}"#.into()),
            "device_add" => {
                std::thread::sleep(*q.delay_add.lock().unwrap());
                let drive = a["drive"].as_str().map(str::to_owned);
                let known = |d: &str| q.nodes.lock().unwrap().iter().any(|n| n.0 == d);
                if a["bus"] == "dsp3" {
                    send(fail("Bus 'dsp3' is full".into()));
                } else if q.refuse_add.lock().unwrap().iter().any(|r| a["id"] == *r) {
                    send(fail("refused by the test".into()));
                } else if let Some(d) = drive.as_deref().filter(|d| !known(d)) {
                    send(fail(format!("Drive '{d}' not found")));
                } else if let Some(d) = drive
                    .as_deref()
                    .filter(|d| q.in_use.lock().unwrap().iter().any(|u| u == d))
                {
                    send(fail(format!("Drive '{d}' is already in use")));
                } else {
                    if let Some(d) = &drive {
                        q.in_use.lock().unwrap().push(d.clone());
                    }
                    devices.push((
                        a["id"].as_str().unwrap_or("").into(),
                        a["bus"].as_str().unwrap_or("").into(),
                        a["addr"].as_str().unwrap_or("0.0").into(),
                        drive,
                    ));
                    send(ok);
                }
            }
            "device_del" => {
                let dev = a["id"].as_str().unwrap_or("").to_owned();
                send(ok);
                let gone: Vec<_> = match devices.iter().find(|d| d.0 == dev).cloned() {
                    Some((_, bus, addr, _)) if addr == "0.0" => {
                        devices.iter().filter(|d| d.1 == bus).cloned().collect()
                    }
                    Some(d) => vec![d],
                    None => Vec::new(),
                };
                if !q.stuck.lock().unwrap().contains(&dev) {
                    devices.retain(|d| !gone.iter().any(|g| g.0 == d.0));
                    let (out, in_use) = (out.clone(), q.in_use.clone());
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(100));
                        for (dev, _, _, drive) in gone {
                            if let Some(d) = drive {
                                in_use.lock().unwrap().retain(|u| *u != d);
                            }
                            let ev = format!(
                                r#"{{"timestamp": {{"seconds": 1, "microseconds": 2}}, "event": "DEVICE_DELETED", "data": {{"device": "{dev}", "path": "/machine/peripheral/{dev}"}}}}"#
                            );
                            let _ = out
                                .lock()
                                .unwrap()
                                .write_all(format!("{ev}\r\n").as_bytes());
                        }
                    });
                }
            }
            "blockdev-add" => {
                let node = a["node-name"].as_str().unwrap_or("").to_owned();
                let file = a["file"]["filename"].as_str().unwrap_or("").to_owned();
                let mut nodes = q.nodes.lock().unwrap();
                if a["driver"] != "raw" || a["file"]["driver"] != "file" {
                    send(fail(format!("unexpected blockdev-add {a}")));
                } else if nodes.iter().any(|n| n.0 == node) {
                    send(fail(format!("Duplicate nodes with node-name='{node}'")));
                } else if !Path::new(&file).is_file() {
                    send(fail(format!("Could not open '{file}'")));
                } else {
                    nodes.push((node, file));
                    send(ok);
                }
            }
            "blockdev-del" => {
                let node = a["node-name"].as_str().unwrap_or("").to_owned();
                let mut nodes = q.nodes.lock().unwrap();
                if *q.fail_blockdev_del.lock().unwrap() {
                    send(fail("blockdev-del refused by the test".into()));
                } else if q.in_use.lock().unwrap().contains(&node) {
                    send(fail(format!(
                        "Node '{node}' is busy: node is used as drive"
                    )));
                } else if !nodes.iter().any(|n| n.0 == node) {
                    send(fail(format!("Failed to find node with node-name='{node}'")));
                } else {
                    nodes.retain(|n| n.0 != node);
                    send(ok);
                }
            }
            _ => send(format!(
                r#"{{"error": {{"class": "CommandNotFound", "desc": "no"}}, "id": {id}}}"#
            )),
        }
    }
}

struct Emu {
    child: Child,
    dir: PathBuf,
    /// Every stderr line after `ready`.
    lines: Arc<Mutex<Vec<String>>>,
}

impl Emu {
    fn start(tag: &str) -> (Emu, FakeQmp, FakeQmp) {
        Self::start_with(tag, &[])
    }

    fn start_with(tag: &str, extra: &[&str]) -> (Emu, FakeQmp, FakeQmp) {
        Self::start_cfg(tag, FABRIC, extra, |_| {})
    }

    /// Start on `fabric` in a fresh directory; `prepare` gets the run
    /// directory (created) before the emulator starts.
    fn start_cfg(
        tag: &str,
        fabric: &str,
        extra: &[&str],
        prepare: impl FnOnce(&Path),
    ) -> (Emu, FakeQmp, FakeQmp) {
        let dir = std::env::temp_dir().join(format!("pcifab-compose-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("run")).expect("dir");
        prepare(&dir.join("run"));
        let cfg = dir.join("fabric.toml");
        std::fs::write(&cfg, fabric).expect("config");
        let q0 = FakeQmp::start(&dir.join("qmp0.sock"));
        let q1 = FakeQmp::start(&dir.join("qmp1.sock"));
        let mut child = Command::new(EXE)
            .arg("--config")
            .arg(&cfg)
            .arg("--run-dir")
            .arg(dir.join("run"))
            .arg(format!("--qmp=h0={}", dir.join("qmp0.sock").display()))
            .arg("--qmp")
            .arg(format!("h1={}", dir.join("qmp1.sock").display()))
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[emu] {line}");
                let _ = tx.send(line);
            }
        });
        loop {
            let l = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("emulator ready");
            if l.contains("pcifab-emu: ready") {
                break;
            }
        }
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            while let Ok(l) = rx.recv() {
                sink.lock().unwrap().push(l);
            }
        });
        (Emu { child, dir, lines }, q0, q1)
    }

    /// The log lines so far that contain `what`.
    fn logged(&self, what: &str) -> Vec<String> {
        let l = self.lines.lock().unwrap();
        l.iter().filter(|l| l.contains(what)).cloned().collect()
    }

    fn sock(&self, name: &str) -> PathBuf {
        self.dir.join("run").join(name)
    }

    fn control(&self, req: &str) -> String {
        let mut s = UnixStream::connect(self.sock("control.sock")).expect("control");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        writeln!(s, "{req}").expect("send");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).expect("reply");
        line.trim_end().to_owned()
    }

    fn state(&self) -> serde_json::Value {
        serde_json::from_str(&self.control("state")).expect("state json")
    }
}

impl Drop for Emu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const MRPC_CMD: u64 = 0x800;
const MRPC_STATUS: u64 = 0x804;
const MRPC_RET: u64 = 0x808;
const MRPC_COMP_HDR: u64 = 0x4000 + 0x13c;

/// Run an MRPC command and wait for it to complete: (status, ret, the
/// status seen right after the write of cmd).
fn mrpc(c: &mut Client, cmd: u32, input: &[u8]) -> (u32, u32, u32) {
    if !input.is_empty() {
        c.write(BAR0, 0, input);
    }
    c.write32(BAR0, MRPC_CMD, cmd);
    let first = c.read32(BAR0, MRPC_STATUS);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = c.read32(BAR0, MRPC_STATUS);
        if st != 1 {
            return (st, c.read32(BAR0, MRPC_RET), first);
        }
        assert!(
            Instant::now() < deadline,
            "command {cmd:#x} never completed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn bind_in(port: u8, lport: u8, pdfid: u16, next_valid: u8) -> Vec<u8> {
    let mut v = vec![1, 0, port, lport];
    v.extend_from_slice(&pdfid.to_le_bytes());
    v.push(next_valid);
    v.push(0);
    v.resize(36, 0);
    v
}

fn unbind_in(port: u8, lport: u8, pdfid: u16) -> Vec<u8> {
    let mut v = vec![2, 0, port, lport];
    v.extend_from_slice(&pdfid.to_le_bytes());
    v.extend_from_slice(&[0, 0]);
    v
}

/// GFMS events of this host: (code, data).
fn events(c: &mut Client) -> Vec<(u8, Vec<u8>)> {
    let (st, _, _) = mrpc(c, 0x89, &[1, 0, 64, 0]);
    assert_eq!(st, 2);
    let out = c.read(BAR0, 0x400, 1024);
    let n = u16::from_le_bytes([out[0], out[1]]) as usize;
    let mut at = 4;
    let mut v = Vec::new();
    for _ in 0..n {
        let len = u16::from_le_bytes([out[at], out[at + 1]]) as usize;
        v.push((out[at + 2], out[at + 4..at + len].to_vec()));
        at += len;
    }
    v
}

#[test]
fn function_servers_serve_gpu_like_functions() {
    let (emu, _q0, _q1) = Emu::start("fn");
    let mut c = Client::connect(&emu.sock("fn-0300.sock"));
    c.version(0).ok();
    let cfg = c.read(CONFIG, 0, 4096);
    let w16 = |o: usize| u16::from_le_bytes([cfg[o], cfg[o + 1]]);
    let w32 = |o: usize| u32::from_le_bytes(cfg[o..o + 4].try_into().expect("4"));
    assert_eq!((w16(0), w16(2)), (0x10de, 0x2330));
    assert_eq!(w32(8) >> 8, 0x030200, "class");
    assert_eq!((w16(0x2c), w16(0x2e)), (0x10de, 0x2330), "subsystem");
    assert_eq!(w32(0x10), 0x4, "BAR0 64-bit");
    assert_eq!(w32(0x18), 0xc, "BAR2 64-bit prefetchable");
    let mut pos = cfg[0x34] as usize;
    let mut caps = Vec::new();
    while pos != 0 {
        caps.push(cfg[pos]);
        pos = cfg[pos + 1] as usize;
    }
    assert_eq!(caps, [0x01, 0x10], "PM, PCIe (no MSI-X: see emulator.rst)");
    assert_eq!(w32(0x100) & 0xffff, 0x10, "SR-IOV extended capability");
    assert_eq!(w16(0x10e), 2, "TotalVFs");
    assert_eq!(w16(0x11a), 0x2331, "VF device id");
    // BAR sizing.
    c.write(CONFIG, 0x18, &[0xff; 8]);
    let b = u64::from_le_bytes(c.read(CONFIG, 0x18, 8).try_into().expect("8"));
    assert_eq!(b & !0xf, !(2u64 << 20).wrapping_sub(1) & !0xf, "2 MiB BAR2");
    let region = |c: &mut Client, i: u32| {
        let mut p = le_words(&[32, 0, i, 0]);
        p.extend_from_slice(&[0; 16]);
        c.request_get_fd(GET_REGION_INFO, &p)
    };
    let (r, fd) = region(&mut c, 0);
    assert_eq!(
        (r.u32_at(4), r.u64_at(16)),
        (3, 0x4000),
        "BAR0 16 KiB, no mmap"
    );
    assert!(fd.is_none());
    let (r, fd) = region(&mut c, 2);
    assert_eq!(
        (r.u32_at(4), r.u64_at(16)),
        (7, 2 << 20),
        "BAR2 read/write/mmap"
    );
    let fd = fd.expect("BAR2 comes with its memfd");
    // Write through a mapping of the fd, read back with REGION_READ.
    let off = r.u64_at(24);
    // SAFETY: maps the region the server offered; unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            off as libc::off_t,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: p maps 4096 bytes.
    unsafe { std::ptr::copy_nonoverlapping(b"hello gpu".as_ptr(), (p as *mut u8).add(64), 9) };
    assert_eq!(c.read(2, 64, 9), b"hello gpu");
    c.write(2, 128, b"via region write");
    let mut back = [0u8; 16];
    // SAFETY: p maps 4096 bytes.
    unsafe { std::ptr::copy_nonoverlapping((p as *const u8).add(128), back.as_mut_ptr(), 16) };
    assert_eq!(&back, b"via region write");
    // SAFETY: unmaps what was mapped above.
    unsafe { libc::munmap(p, 4096) };
    assert!(c.try_read(2, 2 << 20, 1).errno().is_some(), "past BAR2");
    // BAR0 registers.
    assert_eq!(c.read32(BAR0, 0), 0x2330_10de);
    assert_eq!(c.read32(BAR0, 4), 0x300);
    assert_eq!(c.read32(BAR0, 8), 2 << 20);
    assert_eq!(c.read32(BAR0, 0x10), 5500, "temperature");
    c.write32(BAR0, 0x1f0, 0xfeed);
    assert_eq!(c.read32(BAR0, 0x1f0), 0xfeed, "scratch");
    c.write32(BAR0, 0, 0);
    assert_eq!(c.read32(BAR0, 0), 0x2330_10de, "id read-only");

    // A VF: its own id, 1 MiB, its slice of the endpoint's memfd.
    let mut v = Client::connect(&emu.sock("fn-0302.sock"));
    v.version(0).ok();
    assert_eq!(v.read32(CONFIG, 0), 0x2331_10de);
    assert_eq!(v.read32(BAR0, 8), 1 << 20);
    v.write(2, 0, b"vf2");
    assert_eq!(c.read(2, 0, 3), [0, 0, 0], "VF memory is not the PF's");
    assert_eq!(v.read(2, 0, 3), b"vf2");
}

#[test]
fn bind_unbind_over_qmp() {
    let (emu, q0, q1) = Emu::start("bind");
    let mut h0 = Client::connect(&emu.sock("mep-h0.sock"));
    h0.version(0).ok();
    let mut h1 = Client::connect(&emu.sock("mep-h1.sock"));
    h1.version(0).ok();
    let mut h2 = Client::connect(&emu.sock("mep-h2.sock"));
    h2.version(0).ok();
    // h0 wants MRPC completion interrupts.
    let efd = eventfd();
    h0.set_irq_eventfds(2, 0, 1, &[efd.as_raw_fd()]).ok();
    h0.write32(BAR0, MRPC_COMP_HDR, 0x9);

    // Asynchronous: INPROGRESS at once, DONE with an interrupt later.
    *q0.delay_add.lock().unwrap() = Duration::from_millis(500);
    while wait_eventfd(&efd, 0).is_some() {}
    let (st, ret, first) = mrpc(&mut h0, 0x84, &bind_in(0, 0, 0x0300, 0));
    assert_eq!((first, st, ret), (1, 2, 0), "INPROGRESS, then DONE");
    assert!(wait_eventfd(&efd, 2000).is_some(), "completion interrupt");
    *q0.delay_add.lock().unwrap() = Duration::ZERO;
    let add = q0
        .commands()
        .into_iter()
        .find(|l| l.contains("device_add"))
        .expect("device_add");
    let v: serde_json::Value = serde_json::from_str(&add).expect("json");
    assert_eq!(v["arguments"]["driver"], "vfio-user-pci");
    assert_eq!(v["arguments"]["id"], "fn-0300");
    assert_eq!(v["arguments"]["bus"], "dsp0");
    assert!(v["arguments"]["socket"]["path"]
        .as_str()
        .expect("path")
        .ends_with("run/fn-0300.sock"));
    // BIND event on every host.
    let bind_ev = (6u8, vec![0, 0, 0, 0, 0x00, 0x03, 0, 0]);
    assert_eq!(events(&mut h1), std::slice::from_ref(&bind_ev));
    assert_eq!(events(&mut h0), [bind_ev]);

    // Errors.
    let e = |c: &mut Client, input: Vec<u8>| {
        let (st, ret, _) = mrpc(c, 0x84, &input);
        assert_eq!(st, 0xff, "{input:?} fails");
        ret
    };
    assert_eq!(
        e(&mut h0, bind_in(0, 1, 0x0300, 0)),
        0x1,
        "PHYC_PORT_ARDY_BIND"
    );
    assert_eq!(
        e(&mut h0, bind_in(0, 0, 0x0400, 0)),
        0x2,
        "LOGC_PORT_ARDY_BIND"
    );
    assert_eq!(
        e(&mut h0, bind_in(0, 1, 0x0301, 0)),
        0xd,
        "VF while PF bound: BIND_CHECK_FAIL"
    );
    assert_eq!(
        e(&mut h0, bind_in(0, 1, 0x0999, 0)),
        0x4,
        "unknown PDFID: PHYC_PORT_NOT_EXIST"
    );
    assert_eq!(
        e(&mut h0, bind_in(16, 1, 0x0400, 0)),
        0x64006,
        "not a host port"
    );
    assert_eq!(e(&mut h0, bind_in(0, 4, 0x0400, 0)), 0x6, "log port 4");
    assert_eq!(
        e(&mut h0, bind_in(0, 1, 0x0400, 1)),
        0x4,
        "chained to PDFID 0, which does not exist"
    );
    assert_eq!(e(&mut h0, vec![1, 0, 0, 1]), 0x64006, "short");
    assert_eq!(e(&mut h0, vec![3, 0, 0, 0, 0, 0, 0, 0]), 0x9, "sub-command");
    assert_eq!(
        e(&mut h0, bind_in(0, 3, 0x0400, 0)),
        0xf0_0008,
        "QEMU refused"
    );
    assert_eq!(
        e(&mut h0, bind_in(9, 0, 0x0400, 0)),
        0xf0_0008,
        "h2 has no QMP"
    );
    assert_eq!(
        e(&mut h0, unbind_in(0, 1, 0x0300)),
        0xb,
        "LOGC_PORT_NOT_BIND_PHYC_PORT"
    );
    // Policy: h1 may bind gpu1 to itself only, and hold one function.
    assert_eq!(e(&mut h1, bind_in(8, 0, 0x0301, 0)), 0x64010, "not allowed");
    assert_eq!(e(&mut h1, bind_in(0, 1, 0x0400, 0)), 0x64010, "not itself");
    assert_eq!(e(&mut h1, unbind_in(0, 0, 0x0300)), 0x64010, "not its own");
    assert_eq!(
        mrpc(&mut h1, 0x84, &bind_in(8, 2, 0x0400, 0)).0,
        2,
        "own, allowed"
    );
    assert!(q1.commands().iter().any(|l| l.contains("\"bus\":\"dsp2\"")));
    // A VF is not bound while its PF is.
    assert!(emu.control("bind 0x0301 h0 1").contains("BIND_CHECK_FAIL"));
    assert_eq!(emu.control("invariants"), "{\"ok\":true,\"violations\":[]}");

    // Unbind: UNBIND_REQUEST to the owner only, device_del, scrub, UNBIND.
    events(&mut h0);
    events(&mut h1);
    let mut f = Client::connect(&emu.sock("fn-0300.sock"));
    f.version(0).ok();
    f.write(2, 4096, b"secret");
    f.write32(BAR0, 0x100, 7);
    let (st, ret, first) = mrpc(&mut h0, 0x84, &unbind_in(0, 0, 0x0300));
    assert_eq!((first, st, ret), (1, 2, 0));
    assert_eq!(f.read(2, 4096, 6), [0; 6], "scrubbed");
    assert_eq!(f.read32(BAR0, 0x100), 0, "scratch scrubbed");
    let un = vec![0, 0, 0, 0, 0x00, 0x03, 0, 0];
    assert_eq!(events(&mut h0), [(0x80, un.clone()), (7, un.clone())]);
    assert_eq!(events(&mut h1), [(7, un)]);
    assert!(q0
        .commands()
        .iter()
        .any(|l| l.contains("device_del") && l.contains("fn-0300")));
    let s = emu.state();
    let b = &s["bindings"][0];
    assert_eq!(
        (
            b["pdfid"].as_u64(),
            b["owner"].is_null(),
            b["scrubs"].as_u64()
        ),
        (Some(0x300), true, Some(1))
    );

    // h1 already holds its max_functions (1).
    assert_eq!(
        emu.control("bind 0x0302 h1 0"),
        "{\"ok\":false,\"error\":\"bind of 0x0302 to h1 logical port 0 failed: MRPC_DENIED (0x64010)\",\"ret\":409616,\"ms\":0}"
    );
    // A PF is not bound while one of its VFs is.
    assert!(emu.control("bind 0x0302 h0 2").starts_with("{\"ok\":true"));
    assert!(emu.control("bind 0x0300 h0 1").contains("BIND_CHECK_FAIL"));
    assert!(emu.control("unbind 0x0302").starts_with("{\"ok\":true"));

    // Unbind timeout: QEMU never reports the device gone; still owned.
    q1.stuck.lock().unwrap().push("fn-0400".into());
    let t = Instant::now();
    let (st, ret, _) = mrpc(&mut h1, 0x84, &unbind_in(8, 2, 0x0400));
    assert_eq!((st, ret), (0xff, 0xf0_0009), "UNBIND_TIMEOUT");
    assert!(t.elapsed() >= Duration::from_secs(10));
    let s = emu.state();
    assert_eq!(s["bindings"][3]["owner"], "h1");
    assert_eq!(s["bindings"][3]["scrubs"], 0);

    // no-enumerate: DONE without a device_add; unbind needs no device_del.
    let adds = q0.commands().len();
    assert_eq!(emu.control("fault h0 no-enumerate"), "{\"ok\":true}");
    assert!(emu.control("bind 0x0301 h0 1").starts_with("{\"ok\":true"));
    assert_eq!(q0.commands().len(), adds, "no QMP traffic");
    assert!(emu.control("unbind 0x0301").starts_with("{\"ok\":true"));
    assert!(emu
        .control("unbind 0x0301")
        .contains("LOGC_PORT_NOT_BIND_PHYC_PORT"));
    assert_eq!(emu.control("invariants"), "{\"ok\":true,\"violations\":[]}");
}

/// A bind request of several functions chained by next_valid.
fn bind_multi(port: u8, lport: u8, pdfids: &[u16]) -> Vec<u8> {
    let mut v = vec![1, 0, port, lport];
    for (i, p) in pdfids.iter().enumerate() {
        v.extend_from_slice(&p.to_le_bytes());
        v.push(u8::from(i + 1 < pdfids.len()));
        v.push(0);
    }
    // The rest as switchtec-user leaves it: whatever was on the stack.
    while v.len() < 36 {
        v.push(0xa5);
    }
    v
}

/// A chunked GFMS_DB_DUMP (START, GETs, FINISH) as lib/fabric.c runs it.
fn dump(c: &mut Client, sub: u8, param: u8) -> Vec<u8> {
    let (st, ret, _) = mrpc(c, 0x83, &[sub, param, 0, 0, 1, 0, 0, 0]);
    assert_eq!((st, ret), (2, 0), "START of dump {sub}");
    let total = u32::from_le_bytes(c.read(BAR0, 0x400, 4).try_into().expect("4")) as usize;
    let mut data = Vec::new();
    while data.len() < total * 4 {
        let mut inp = vec![sub, 0, 0, 0, 2, 0, 0, 0];
        inp.extend_from_slice(&((data.len() / 4) as u32).to_le_bytes());
        let (st, _, _) = mrpc(c, 0x83, &inp);
        assert_eq!(st, 2, "GET");
        let out = c.read(BAR0, 0x400, 1024);
        let n = u32::from_le_bytes(out[4..8].try_into().expect("4")) as usize - 3;
        assert!(n > 0);
        data.extend_from_slice(&out[12..12 + 4 * n]);
    }
    assert_eq!(mrpc(c, 0x83, &[sub, 0, 0, 0, 3, 0, 0, 0]).0, 2, "FINISH");
    data
}

#[test]
fn pax_dialect_multifunction_bind_and_dma_mrpc() {
    let (emu, q0, _q1) = Emu::start_with("pax", &["--dialect", "pax"]);
    let mut h0 = Client::connect(&emu.sock("mep-h0.sock"));
    h0.version(0).ok();
    let mut h1 = Client::connect(&emu.sock("mep-h1.sock"));
    h1.version(0).ok();

    // ECHO comes back inverted; TWI ping names a Gen4 part in main firmware.
    assert_eq!(mrpc(&mut h0, 0x41, &[1, 2, 3, 4]).0, 2);
    assert_eq!(h0.read(BAR0, 0x400, 4), [!1, !2, !3, !4]);
    assert_eq!(mrpc(&mut h0, 0x100, &0x1234_5678u32.to_le_bytes()).0, 2);
    let p = h0.read(BAR0, 0x400, 8);
    assert_eq!(&p[..4], &[3, 0, 0, 0], "phase main firmware, rev B, Gen4");
    assert_eq!(&p[4..], &(!0x1234_5678u32).to_le_bytes());
    assert_eq!(mrpc(&mut h0, 0x81, &[]).0, 2, "GET_PAX_ID");
    assert_eq!(h0.read(BAR0, 0x400, 1), [0]);
    // No extension command, no extension registers.
    for cmd in [0xf000, 0xf001, 0xf002, 0xf003, 0xf004, 0xf0ff] {
        let (st, ret, _) = mrpc(&mut h0, cmd, &[1, 0, 8, 0, 0, 0, 0, 0]);
        assert_eq!((st, ret), (0xff, 0x64005), "cmd {cmd:#x}");
    }
    // EP_TUNNEL_CFG and EP_RESOURCE_ACCESS are PAX's: the manager opens
    // gpu0's PF's tunnel and reads its ids from config space.
    let (st, ret, _) = mrpc(&mut h0, 0x8e, &[0, 0, 0x00, 0x03, 0, 0, 4, 0]);
    assert_eq!((st, ret), (0xff, 0x64007), "tunnel still closed");
    let (st, ret, _) = mrpc(&mut h0, 0x8f, &[0, 0, 0x00, 0x03, 0, 0, 0, 0]);
    assert_eq!((st, ret), (2, 0), "EP_TUNNEL_CFG ENABLE 0x0300");
    assert_eq!(h0.read(BAR0, 0x400, 4), [0; 4], "len 0");
    let (st, ret, _) = mrpc(&mut h0, 0x8e, &[0, 0, 0x00, 0x03, 0, 0, 4, 0]);
    assert_eq!((st, ret), (2, 0), "CSR read of 4 bytes at 0");
    assert_eq!(h0.read(BAR0, 0x400, 4), [0xde, 0x10, 0x30, 0x23]);
    assert_eq!(h0.read(BAR0, 0x3000, 0x38), [0; 0x38], "nothing at 0x3000");
    h0.write32(BAR0, 0x3000, 1);
    assert_eq!(h0.read32(BAR0, 0x3000), 0, "writes dropped");

    let (st, ret, _) = mrpc(&mut h0, 0x84, &bind_multi(0, 2, &[0x0300, 0x0301]));
    assert_eq!((st, ret), (0xff, 0xd), "PF with its VF: BIND_CHECK_FAIL");
    // Two VFs as one multi-function device: function 1 first, function 0
    // (multifunction=on) last.
    let (st, ret, _) = mrpc(&mut h0, 0x84, &bind_multi(0, 1, &[0x0301, 0x0302]));
    assert_eq!((st, ret), (2, 0));
    let adds: Vec<serde_json::Value> = q0
        .commands()
        .iter()
        .filter(|l| l.contains("device_add"))
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(adds.len(), 2);
    assert_eq!(
        (&adds[0]["arguments"]["id"], &adds[0]["arguments"]["addr"]),
        (&"fn-0302".into(), &"0.1".into())
    );
    assert_eq!(
        (&adds[1]["arguments"]["id"], &adds[1]["arguments"]["addr"]),
        (&"fn-0301".into(), &"0.0".into())
    );
    assert_eq!(adds[1]["arguments"]["multifunction"], true);
    assert_eq!(adds[0]["arguments"]["bus"], "dsp1");
    // Both on h0's logical port 1 in the HVD; h1's HVD names h1's port.
    let hvd = dump(&mut h1, 3, 0);
    assert_eq!(&hvd[12..14], &[0, 0], "HVD 0 on port 0");
    let slot =
        |h: &[u8], l: usize, s: usize| h[20 + 4 * (4 * s + l)..24 + 4 * (4 * s + l)].to_vec();
    assert_eq!(slot(&hvd, 1, 0), [1, 1, 0x01, 0x03]);
    assert_eq!(slot(&hvd, 1, 1), [1, 1, 0x02, 0x03]);
    let hvd1 = dump(&mut h0, 3, 1);
    assert_eq!(&hvd1[12..14], &[1, 8], "HVD 1 on port 8");
    // All or none: an unknown function in the list binds nothing.
    let n = q0.commands().len();
    let (st, ret, _) = mrpc(&mut h0, 0x84, &bind_multi(0, 2, &[0x0400, 0x0999]));
    assert_eq!((st, ret), (0xff, 0x4));
    assert_eq!(q0.commands().len(), n, "no device_add");

    // Unbind names the port only (switchtec-user leaves pdfid unset): one
    // device_del of function 0 takes both; no UNBIND_REQUEST in pax.
    events(&mut h0);
    let mut un = vec![2, 0, 0, 1, 0xad, 0xde, 0xa5, 0xa5];
    let (st, ret, _) = mrpc(&mut h0, 0x84, &un);
    assert_eq!((st, ret), (2, 0));
    let dels: Vec<String> = q0
        .commands()
        .into_iter()
        .filter(|l| l.contains("device_del"))
        .collect();
    assert_eq!(dels.len(), 1, "{dels:?}");
    assert!(dels[0].contains("fn-0301"));
    let ev = events(&mut h0);
    assert_eq!(
        ev.iter().map(|e| e.0).collect::<Vec<_>>(),
        [7, 7],
        "UNBIND per function, no 0x80"
    );
    un[3] = 1;
    assert_eq!(mrpc(&mut h0, 0x84, &un).1, 0xb, "empty port");
    assert_eq!(emu.control("invariants"), "{\"ok\":true,\"violations\":[]}");

    // DMA MRPC: map a buffer, enable, run ECHO: the result lands there.
    const DMA_MAP: u16 = 2;
    // SAFETY: creating an anonymous memory file.
    let fd = unsafe { libc::memfd_create(c"dma".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: fd is ours.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizing our own memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0x2000) }, 0);
    let mut body = le_words(&[32, 3]);
    for v in [0u64, 0x10_0000, 0x2000] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    h0.request_fds(DMA_MAP, &body, &[fd.as_raw_fd()]).ok();
    let read_buf = |len: usize| {
        let mut b = vec![0u8; len];
        // SAFETY: reads into b from our memfd.
        let n = unsafe { libc::pread(fd.as_raw_fd(), b.as_mut_ptr().cast(), len, 0) };
        assert_eq!(n, len as isize);
        b
    };
    assert_eq!(h0.read32(BAR0, 0x81c), 1, "dma_ver");
    assert_eq!(h0.read32(BAR0, 0x818), 1, "dma_vector");
    h0.write(BAR0, 0x810, &0x10_0000u64.to_le_bytes());
    h0.write32(BAR0, 0x80c, 1);
    assert_eq!(mrpc(&mut h0, 0x41, &[0x0f, 0xf0]).0, 2);
    let b = read_buf(18);
    assert_eq!(
        &b[..16],
        &le_words(&[2, 0x41, 0, 2])[..],
        "status, cmd, ret, size"
    );
    assert_eq!(&b[16..], &[0xf0, 0x0f]);
    assert_eq!(mrpc(&mut h0, 0xf000, &[]).0, 0xff);
    assert_eq!(
        &read_buf(16)[..],
        &le_words(&[0xff, 0xf000, 0x64005, 0])[..]
    );
    assert_eq!(h0.read(BAR0, 0x400, 2), [0xf0, 0x0f], "mailbox too");
    // Withdrawn as a firmware reset without it would: nothing more written.
    assert_eq!(emu.control("fault h0 dma-mrpc off"), "{\"ok\":true}");
    assert_eq!(
        (h0.read32(BAR0, 0x81c), h0.read32(BAR0, 0x80c)),
        (0, 0),
        "dma_ver, dma_en"
    );
    h0.write32(BAR0, 0x80c, 1);
    assert_eq!(h0.read32(BAR0, 0x80c), 0, "cannot be enabled");
    assert_eq!(mrpc(&mut h0, 0x41, &[1]).0, 2);
    assert_eq!(
        &read_buf(16)[..],
        &le_words(&[0xff, 0xf000, 0x64005, 0])[..]
    );
    assert_eq!(h0.read(BAR0, 0x400, 1), [!1], "the mailbox works");
    assert_eq!(emu.control("fault h0 dma-mrpc on"), "{\"ok\":true}");
    assert_eq!(h0.read32(BAR0, 0x81c), 1);
}

#[test]
fn extended_dialect_features() {
    let (emu, _q0, _q1) = Emu::start("ext");
    let mut h0 = Client::connect(&emu.sock("mep-h0.sock"));
    h0.version(0).ok();
    assert_eq!(mrpc(&mut h0, 0xf000, &[]).0, 2, "EXT_FEATURES");
    assert_eq!(h0.read(BAR0, 0x400, 8), le_words(&[1, 0xf]));
    assert_ne!(h0.read32(BAR0, 0x3034), 0, "P2P_CAPS");
}

const NVME_FABRIC: &str = r#"
[[hosts]]
name = "h0"
usp_port = 0

[[hosts]]
name = "h1"
usp_port = 8

[[endpoints]]
name = "gpu0"
port = 16
vendor_id = 0x10de
device_id = 0x2330
class = 0x030200
vfs = 1
mem_mib = 1
vf_mem_mib = 1

[[endpoints]]
name = "nvme0"
port = 20
kind = "nvme"
capacity_mib = 4

[[endpoints]]
name = "nvme1"
port = 21
kind = "nvme"
capacity_mib = 1
image = "disks/second.raw"
"#;

/// The commands after the first `skip`: (execute, arguments).
fn since(q: &FakeQmp, skip: usize) -> Vec<(String, serde_json::Value)> {
    q.parsed().into_iter().skip(skip).collect()
}

fn execs(cmds: &[(String, serde_json::Value)]) -> Vec<&str> {
    cmds.iter().map(|c| c.0.as_str()).collect()
}

#[test]
fn nvme_bind_unbind_over_qmp() {
    let (emu, q0, q1) = Emu::start_cfg("nvme", NVME_FABRIC, &[], |run| {
        std::fs::create_dir_all(run.join("disks")).expect("disks");
    });
    let run = emu.dir.join("run");
    let img0 = run.join("nvme0.img");
    let meta = std::fs::metadata(&img0).expect("image created");
    assert_eq!(meta.len(), 4 << 20, "capacity");
    assert!(
        run.join("disks/second.raw").is_file(),
        "image key, relative"
    );
    assert!(run.join("fn-0300.sock").exists(), "gpu function served");
    assert!(!run.join("fn-0380.sock").exists(), "no server for nvme");

    // state: kind and image per function, QEMU's ids.
    let s = emu.state();
    let f = |pdfid: u64| {
        s["functions"]
            .as_array()
            .expect("functions")
            .iter()
            .find(|f| f["pdfid"] == pdfid)
            .cloned()
            .expect("function")
    };
    let n0 = f(0x380);
    assert_eq!(n0["kind"], "nvme");
    assert_eq!(n0["image"], img0.to_str().expect("utf-8"));
    assert_eq!(
        (n0["vid"].as_u64(), n0["did"].as_u64(), n0["class"].as_u64()),
        (Some(0x1b36), Some(0x10), Some(0x010802))
    );
    assert_eq!(
        f(0x3a0)["image"],
        run.join("disks/second.raw").to_str().expect("utf-8")
    );
    assert_eq!(f(0x300)["kind"], "gpu");
    assert!(f(0x300).get("image").is_none());
    let b = s["bindings"]
        .as_array()
        .expect("bindings")
        .iter()
        .find(|b| b["pdfid"] == 0x380)
        .cloned()
        .expect("binding");
    assert_eq!(
        (b["mem_bytes"].as_u64(), b["dev_mem_bytes"].as_u64()),
        (Some(0), Some(0))
    );

    // Bind: blockdev-add of the image, then QEMU's nvme device on it.
    assert!(emu.control("bind 0x0380 h0 0").starts_with("{\"ok\":true"));
    let c = since(&q0, 0);
    assert_eq!(
        execs(&c),
        ["qmp_capabilities", "blockdev-add", "device_add"]
    );
    assert_eq!(
        c[1].1,
        serde_json::json!({"driver": "raw", "node-name": "drv-0380",
            "file": {"driver": "file", "filename": img0.to_str().expect("utf-8")}})
    );
    assert_eq!(
        c[2].1,
        serde_json::json!({"driver": "nvme", "id": "fn-0380", "bus": "dsp0", "addr": "0.0",
            "drive": "drv-0380", "serial": "pcifab-nvme0"})
    );
    assert_eq!(emu.state()["bindings"][2]["in_qemu"], true);

    // Unbind: device_del, DEVICE_DELETED, then blockdev-del (the fake
    // refuses it while the device still uses the node).
    let n = q0.commands().len();
    assert!(emu.control("unbind 0x0380").starts_with("{\"ok\":true"));
    let c = since(&q0, n);
    assert_eq!(execs(&c), ["device_del", "blockdev-del"]);
    assert_eq!(c[0].1, serde_json::json!({"id": "fn-0380"}));
    assert_eq!(c[1].1, serde_json::json!({"node-name": "drv-0380"}));
    assert!(q0.nodes().is_empty(), "node deleted: image closed");

    // The other host's QEMU opens the same image next.
    assert!(emu.control("bind 0x0380 h1 1").starts_with("{\"ok\":true"));
    assert_eq!(
        q1.nodes(),
        [(
            "drv-0380".to_string(),
            img0.to_str().expect("utf-8").to_string()
        )]
    );
    assert!(emu.control("unbind 0x0380").starts_with("{\"ok\":true"));
    assert!(q1.nodes().is_empty());

    // A refused device_add: the node is deleted again, the bind fails.
    let n = q0.commands().len();
    let r = emu.control("bind 0x0380 h0 3");
    assert!(r.contains("HOTPLUG_FAILED"), "{r}");
    let c = since(&q0, n);
    assert_eq!(execs(&c), ["blockdev-add", "device_add", "blockdev-del"]);
    assert_eq!(c[2].1, serde_json::json!({"node-name": "drv-0380"}));
    assert!(q0.nodes().is_empty());
    assert_eq!(emu.state()["bindings"][2]["owner"], serde_json::Value::Null);

    // One logical port, two kinds: the VF (function 1) as vfio-user, the
    // nvme controller as function 0 with multifunction=on; one device_del
    // takes both, then the node goes.
    let n = q0.commands().len();
    let r = emu.control("bind 0x0380,0x0301 h0 2");
    assert!(r.starts_with("{\"ok\":true"), "{r}");
    let c = since(&q0, n);
    assert_eq!(execs(&c), ["device_add", "blockdev-add", "device_add"]);
    assert_eq!(
        (&c[0].1["driver"], &c[0].1["addr"]),
        (&"vfio-user-pci".into(), &"0.1".into())
    );
    assert_eq!(
        (&c[2].1["driver"], &c[2].1["addr"]),
        (&"nvme".into(), &"0.0".into())
    );
    assert_eq!(c[2].1["multifunction"], true);
    let n = q0.commands().len();
    assert!(emu.control("unbind 0x0380").starts_with("{\"ok\":true"));
    let c = since(&q0, n);
    assert_eq!(execs(&c), ["device_del", "blockdev-del"]);
    assert!(q0.nodes().is_empty());

    // A refused device_add of function 0 removes the nvme function 1
    // added before it, and then its node.
    q0.refuse_add.lock().unwrap().push("fn-0301".into());
    let n = q0.commands().len();
    let r = emu.control("bind 0x0301,0x0380 h0 2");
    assert!(r.contains("HOTPLUG_FAILED"), "{r}");
    let c = since(&q0, n);
    assert_eq!(
        execs(&c),
        [
            "blockdev-add",
            "device_add",
            "device_add",
            "device_del",
            "blockdev-del"
        ]
    );
    assert_eq!(
        (&c[1].1["id"], &c[1].1["addr"]),
        (&"fn-0380".into(), &"0.1".into())
    );
    assert_eq!(c[3].1, serde_json::json!({"id": "fn-0380"}));
    assert!(q0.nodes().is_empty());
    q0.refuse_add.lock().unwrap().clear();

    // A failed blockdev-del is an error in the log; the unbind completes.
    assert!(emu.control("bind 0x0380 h0 0").starts_with("{\"ok\":true"));
    *q0.fail_blockdev_del.lock().unwrap() = true;
    assert!(emu.control("unbind 0x0380").starts_with("{\"ok\":true"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while emu.logged("blockdev-del drv-0380 failed").is_empty() {
        assert!(Instant::now() < deadline, "no error logged");
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = emu.logged("blockdev-del drv-0380 failed");
    assert!(e[0].starts_with("pcifab-emu: error: "), "{e:?}");
    assert_eq!(emu.state()["bindings"][2]["owner"], serde_json::Value::Null);
    assert_eq!(emu.control("invariants"), "{\"ok\":true,\"violations\":[]}");
}

/// Run the emulator on `fabric` in `dir` expecting it to refuse to start:
/// its exit status and stderr.
fn refused_start(dir: &Path, fabric: &str) -> (Option<i32>, String) {
    let cfg = dir.join("fabric.toml");
    std::fs::write(&cfg, fabric).expect("config");
    let out = Command::new(EXE)
        .arg("--config")
        .arg(&cfg)
        .arg("--run-dir")
        .arg(dir.join("run"))
        .output()
        .expect("run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn nvme_image_kept_initial_binding_and_size_checked() {
    let fabric = format!(
        "{NVME_FABRIC}\n[[bindings]]\nendpoint = \"nvme0\"\nhost = \"h0\"\nlogical_port = 1\n"
    );
    let data = b"data written by an earlier run";
    let (emu, q0, _q1) = Emu::start_cfg("nvme-keep", &fabric, &[], |run| {
        std::fs::create_dir_all(run.join("disks")).expect("disks");
        let f = std::fs::File::create(run.join("nvme0.img")).expect("image");
        f.set_len(4 << 20).expect("size");
        std::os::unix::fs::FileExt::write_all_at(&f, data, 1 << 20).expect("data");
    });
    let img0 = emu.dir.join("run/nvme0.img");
    let back = std::fs::read(&img0).expect("image");
    assert_eq!(back.len(), 4 << 20, "not resized");
    assert_eq!(&back[1 << 20..(1 << 20) + data.len()], data, "data kept");
    // The initial binding: blockdev-add, then device_add on dsp1 once QEMU answers.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !q0.commands().iter().any(|l| l.contains("device_add")) {
        assert!(Instant::now() < deadline, "initial binding never added");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = q0.parsed();
    assert_eq!(
        execs(&c),
        ["qmp_capabilities", "blockdev-add", "device_add"]
    );
    assert_eq!(c[1].1["node-name"], "drv-0380");
    assert_eq!(
        c[2].1,
        serde_json::json!({"driver": "nvme", "id": "fn-0380", "bus": "dsp1",
            "drive": "drv-0380", "serial": "pcifab-nvme0"})
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while emu.state()["bindings"][2]["in_qemu"] != true {
        assert!(Instant::now() < deadline, "never marked in QEMU");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(emu.control("unbind 0x0380").starts_with("{\"ok\":true"));
    assert!(q0.nodes().is_empty());
    drop(emu);

    // An image of another size: refused, named, left alone.
    let dir = std::env::temp_dir().join(format!("pcifab-compose-{}-nvme-size", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("run/disks")).expect("dir");
    let img = dir.join("run/nvme0.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(3 << 20))
        .expect("image");
    let (code, err) = refused_start(&dir, NVME_FABRIC);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "pcifab-emu: error: endpoints[1] ('nvme0'): image {} is 3145728 bytes but capacity_mib asks for 4194304 bytes (4 MiB)",
            img.display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&img).expect("kept").len(), 3 << 20);
    // Two endpoints on one image.
    std::fs::remove_file(&img).expect("rm");
    let shared = NVME_FABRIC
        .replace("image = \"disks/second.raw\"", "image = \"nvme0.img\"")
        .replace("capacity_mib = 1\n", "capacity_mib = 4\n");
    let (code, err) = refused_start(&dir, &shared);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("endpoints[2] ('nvme1'): image")
            && err.contains("is also the image of endpoints[1]"),
        "{err}"
    );
    // A bad key: named, with what to do.
    let (code, err) = refused_start(
        &dir,
        &NVME_FABRIC.replace("capacity_mib = 4", "capacity_mib = 4\nvfs = 2"),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("endpoints[1].vfs = 2 but an nvme endpoint has no VFs"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
