// SPDX-License-Identifier: GPL-2.0-only
//! Hostile firmware through a whole fabric: every reply the driver parses,
//! the event registers and the MRPC status lie, deterministically per seed,
//! while the model stays true; `fault clear` ends it.

use crate::config::Config;
use crate::control::handle;
use crate::fabric::Fabric;
use crate::gas::*;
use crate::mep::REGION_BAR0;
use std::sync::Arc;
use std::time::{Duration, Instant};

// h0 holds gpu1's PF, h1 gpu0's PF; gpu2 is free.
const CFG: &str = "[[hosts]]\nname = \"h0\"\n[[hosts]]\nname = \"h1\"\nusp_port = 8\n\
    [[endpoints]]\nname = \"gpu0\"\nport = 16\nvendor_id = 1\ndevice_id = 2\nclass = 1\n\
    vfs = 2\nmem_mib = 1\n\
    [[endpoints]]\nname = \"gpu1\"\nport = 24\nvendor_id = 1\ndevice_id = 2\nclass = 1\n\
    mem_mib = 1\n\
    [[endpoints]]\nname = \"gpu2\"\nport = 32\nvendor_id = 1\ndevice_id = 2\nclass = 1\n\
    mem_mib = 1\n\
    [[bindings]]\nendpoint = \"gpu0\"\nhost = \"h1\"\nlogical_port = 0\n\
    [[bindings]]\nendpoint = \"gpu1\"\nhost = \"h0\"\nlogical_port = 0\n";

fn ext(sub: u8, pdfid: u16, b8: u8) -> Vec<u8> {
    let mut v = vec![1, 0, 32, 0, sub, 0];
    v.extend_from_slice(&pdfid.to_le_bytes());
    v.push(b8);
    v.resize(32, 0);
    v
}

fn route_add(pdfid: u16, woff: u64, size: u64) -> Vec<u8> {
    let mut v = ext(1, pdfid, 0);
    v[8..16].copy_from_slice(&woff.to_le_bytes());
    v[16..24].copy_from_slice(&size.to_le_bytes());
    v
}

/// Every command the driver sends (and ECHO last), from h0.
fn sequence() -> Vec<(u32, Vec<u8>)> {
    vec![
        (0x04, vec![2, 0, 0, 0]),
        (0x04, vec![7, 0, 0, 0]), // ERROR: SUBCMD_INVALID
        (0x82, vec![1]),
        (0x82, vec![2]),
        (0x82, vec![3, 0, 0, 0]),
        (0x82, vec![3, 0, 0x40, 0]),
        (0x82, vec![4]),
        (0x83, vec![2]),
        (0x83, vec![3, 1, 0, 0, 1, 0, 0, 0]),
        (0x83, vec![3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]),
        (0x83, vec![5, 16, 0, 0, 1, 0, 0, 0]),
        (0x83, vec![5, 16, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]),
        (0x83, vec![5, 16, 0, 0, 3, 0, 0, 0]),
        (0x89, vec![1, 0, 10, 0]),
        (0xf001, vec![1, 0, 4, 0]),
        (0xf002, vec![1, 0, 8, 0, 0x00, 0x03, 0, 0]),
        (0xf003, vec![1, 0, 8, 0, 0, 0, 0, 0]),
        (0xf004, ext(4, 0x0400, 1)),
        (0xf004, route_add(0x0400, 0, 0x1000)),
        (0xf004, ext(3, 0, 0)),
        (0xf004, ext(6, 0, 0)),
        (0x84, vec![1, 0, 0, 1, 0x00, 0x05, 0, 0]),
        (0x41, b"echo stays byte-exact".to_vec()),
    ]
}

fn fabric(seed: Option<u64>) -> Arc<Fabric> {
    let f = Arc::new(Fabric::new(Config::parse(CFG).expect("config")));
    f.start().expect("start");
    assert_eq!(handle("fault h0 no-enumerate", &f), "{\"ok\":true}");
    handle("fabric-change", &f);
    handle("link 16 down", &f);
    handle("link 16 up", &f);
    if let Some(seed) = seed {
        let r = handle(&format!("fault h0 hostile {seed}"), &f);
        assert_eq!(r, "{\"ok\":true}");
    }
    f
}

/// Run one command on h0's MEP; what the firmware put in the
/// registers (read past the register-read lies): status, ret, output.
fn run(f: &Fabric, cmd: u32, input: &[u8]) -> (u32, u32, Vec<u8>) {
    let mep = &f.meps[0];
    mep.region_write(REGION_BAR0, MRPC_INPUT_DATA, input)
        .expect("input");
    mep.region_write(REGION_BAR0, MRPC_CMD, &cmd.to_le_bytes())
        .expect("cmd");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inner = mep.lock();
        let st = inner.gas.get32(MRPC_STATUS);
        if st != MRPC_STATUS_INPROGRESS {
            let mut out = vec![0u8; 1024];
            inner.gas.read(MRPC_OUTPUT_DATA, &mut out).expect("output");
            return (st, inner.gas.get32(MRPC_RET_VALUE), out);
        }
        drop(inner);
        assert!(Instant::now() < deadline, "cmd {cmd:#x} never completes");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The model as a string: what must not depend on the hostile mode.
fn model_view(f: &Fabric) -> String {
    let m = f.model();
    format!(
        "gen {} bindings {:?} routes {:?} grants {:?} events {:?} inv {:?}",
        m.generation,
        m.functions
            .iter()
            .map(|x| (x.pdfid, x.binding))
            .collect::<Vec<_>>(),
        m.hosts.iter().map(|h| h.routes.clone()).collect::<Vec<_>>(),
        m.grants,
        m.pending(),
        m.invariants()
    )
}

type Replies = Vec<(u32, u32, Vec<u8>)>;

fn replies(f: &Fabric) -> Replies {
    sequence().iter().map(|(c, i)| run(f, *c, i)).collect()
}

#[test]
fn every_parsed_reply_lies_deterministically() {
    let clean = fabric(None);
    let a = fabric(Some(7));
    let b = fabric(Some(7));
    let c = fabric(Some(8));
    let (rc, ra, rb, rx) = (replies(&clean), replies(&a), replies(&b), replies(&c));
    // Sanity: the clean run works (only the bad DIETEMP fails) and
    // had events to report.
    for (i, r) in rc.iter().enumerate() {
        let want = if i == 1 {
            MRPC_STATUS_ERROR
        } else {
            MRPC_STATUS_DONE
        };
        assert_eq!(r.0, want, "clean reply {i}: {r:?}");
    }
    assert!(rc[13].2[0] >= 3, "GFMS_EVENT GET had events");
    assert!(ra == rb, "same seed, same commands: same lies");
    assert!(ra != rx, "another seed lies differently");
    let seq = sequence();
    for (i, (cmd, input)) in seq.iter().enumerate() {
        if *cmd == 0x41 {
            assert!(ra[i] == rc[i], "ECHO is byte-exact");
        } else {
            assert!(
                ra[i] != rc[i],
                "reply {i} (cmd {cmd:#x} {input:?}) not corrupted"
            );
        }
    }
    // The model never lies: the same state as the clean run's.
    assert_eq!(model_view(&a), model_view(&clean));
    assert!(a.model().invariants().is_empty());
    let st = a.meps[0].hostile_report();
    assert_eq!(st.counts.mrpc_replies, seq.len() as u64 - 1);
    let s = handle("state", &a);
    assert!(s.contains("\"faults\":[\"hostile 7\"]"), "{s}");
    assert!(
        s.contains(&format!(
            "\"hostile\":{{\"seed\":7,\"on\":true,\"mrpc_replies\":{},",
            seq.len() - 1
        )),
        "{s}"
    );
    assert!(
        s.contains("\"name\":\"h1\",\"port\":8,\"faults\":[],\"events_pending\":"),
        "{s}"
    );
    // fault clear: replies are the truth again (the models are equal,
    // so the clean fabric's replies are the truth).
    assert_eq!(handle("fault clear h0", &a), "{\"ok\":true}");
    for (cmd, input) in [
        (0xf001, vec![1, 0, 4, 0]),
        (0xf003, vec![1, 0, 8, 0, 0, 0, 0, 0]),
        (0x04, vec![2, 0, 0, 0]),
        (0xf004, ext(6, 0, 0)),
        (0x83, vec![2]),
    ] {
        assert!(
            run(&a, cmd, &input) == run(&clean, cmd, &input),
            "cmd {cmd:#x} after clear"
        );
    }
    let s = handle("state", &a);
    assert!(
        s.contains(&format!(
            "\"hostile\":{{\"seed\":7,\"on\":false,\"mrpc_replies\":{},",
            seq.len() - 1
        )),
        "counts stay after clear: {s}"
    );
    assert!(handle("state", &clean).contains("\"event_overflow\":false,\"hostile\":null}"));
}

/// BAR0 reads of the MRPC status and the event registers lie (about
/// half the time, by seed); other registers never; clear stops it.
#[test]
fn register_reads_lie_until_cleared() {
    let reads = |f: &Fabric| -> Vec<u32> {
        let mep = &f.meps[0];
        let mut v = Vec::new();
        for off in [
            MRPC_STATUS,
            SW_EVENT + SW_GFMS_EVENT_HDR,
            SW_EVENT + SW_GLOBAL_SUMMARY,
            PART_CFG + PC_PART_EVENT_SUMMARY,
            SYS_INFO + SI_DEVICE_ID,
        ] {
            for _ in 0..32 {
                let mut b = [0u8; 4];
                mep.region_read(REGION_BAR0, off, &mut b).expect("read");
                v.push(u32::from_le_bytes(b));
            }
        }
        v
    };
    let truth = |f: &Fabric| -> Vec<u32> {
        let inner = f.meps[0].lock();
        [
            MRPC_STATUS,
            SW_EVENT + SW_GFMS_EVENT_HDR,
            SW_EVENT + SW_GLOBAL_SUMMARY,
            PART_CFG + PC_PART_EVENT_SUMMARY,
            SYS_INFO + SI_DEVICE_ID,
        ]
        .iter()
        .flat_map(|&o| std::iter::repeat_n(inner.gas.get32(o), 32))
        .collect()
    };
    let a = fabric(Some(3));
    let b = fabric(Some(3));
    run(&a, 0x04, &[2, 0, 0, 0]);
    run(&b, 0x04, &[2, 0, 0, 0]);
    let (ra, rb, t) = (reads(&a), reads(&b), truth(&a));
    assert_eq!(ra, rb, "deterministic per seed and read sequence");
    for (k, name) in [
        "MRPC status",
        "GFMS header",
        "global summary",
        "part summary",
    ]
    .iter()
    .enumerate()
    {
        let lies = (0..32).filter(|&i| ra[32 * k + i] != t[32 * k + i]).count();
        assert!((4..=28).contains(&lies), "{name}: {lies} of 32 reads lie");
    }
    assert_eq!(ra[128..], t[128..], "sys_info never lies");
    assert!(a.meps[0].hostile_report().counts.register_reads > 0);
    handle("fault clear", &a);
    assert_eq!(reads(&a), truth(&a), "the truth after fault clear");
}
