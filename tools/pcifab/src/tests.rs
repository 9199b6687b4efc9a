// SPDX-License-Identifier: GPL-2.0-only

//! Command-line parsing and JSON output against Documentation/json/*.schema.json.

use super::*;

fn parse(line: &str) -> Result<Cli, Error> {
    let args: Vec<String> = std::iter::once("pcifab")
        .chain(line.split_whitespace())
        .map(String::from)
        .collect();
    let m = Cli::command()
        .try_get_matches_from(&args)
        .map_err(|e| usage_error(e.to_string()))?;
    let cli = Cli::from_arg_matches(&m).map_err(|e| usage_error(e.to_string()))?;
    check_scope(&cli, &m)?;
    Ok(cli)
}

fn parse_err(line: &str) -> Error {
    match parse(line) {
        Ok(c) => panic!("{line:?} parsed as {:?}", c.command),
        Err(e) => e,
    }
}

#[test]
fn global_options_go_anywhere() {
    for line in [
        "--count 3 top",
        "top --count 3",
        "--json --device /dev/pcifab1 info",
        "info --json --device /dev/pcifab1",
        "--timeout 500 bind 0x0300 --host 1",
        "--manager-socket /tmp/s queue",
    ] {
        let cli = parse(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        if line.contains("pcifab1") {
            assert!(cli.json && cli.device == "/dev/pcifab1", "{line}");
        }
        if line.contains("--count 3") {
            assert_eq!(cli.count, Some(3), "{line}");
        }
    }
}

#[test]
fn options_that_do_not_apply_are_errors() {
    for (line, opt) in [
        ("--count 3 info", "--count"),
        ("list --timeout 5", "--timeout"),
        ("queue --device /dev/pcifab1", "--device"),
        ("info --manager-socket /tmp/s", "--manager-socket"),
        ("top --timeout 1", "--timeout"),
    ] {
        let e = parse_err(line);
        assert_eq!(e.exit, out::EXIT_USAGE, "{line}");
        assert!(
            e.msg.starts_with(opt) && e.msg.contains("does not apply"),
            "{line}: {e}"
        );
    }
    for bad in [
        "",
        "--bogus info",
        "info extra",
        "--device",
        "mrpc 1 2 3",
        "mrpc 1 --timeout x",
        "bind 0x300",
        "show 0x10000",
        "p2p route add 0x300",
        "p2p route add 0x300 --size 16Q",
        "p2p copy --from nowhere --to 0x300:0 --len 1",
        "p2p copy --from 0x300:0 --to file: --len 1",
        "p2p route add 0x300 --size 4k extra",
        "p2p route add 0x300 --size 4k --len 4",
        "request --gpus 1 --vfs 1 --host 1 --priority 1",
        "request --gpus 1 --profile q --host 1 --priority 1",
        "release 1 2",
        "top --interval 0",
        "top --sort bogus",
        "bind 0x300 --host 0 --force",
        "unbind 0x300 --block-timeout 5",
        "bind 0x300 --host 0 --block-timeout 3601",
        "bind 0x300 --host 0 --block-timeout x",
        "move 0x300 --host 0 --block-timeout -1",
    ] {
        assert_eq!(parse_err(bad).exit, out::EXIT_USAGE, "{bad}");
    }
}

/// Every command line the QEMU scenarios and samples run parses.
#[test]
fn the_harness_command_lines_parse() {
    for line in [
        "info",
        "list --json",
        "show 0x0300",
        "stats --json",
        "stats --telemetry --json",
        "mrpc 0x41 00 --timeout 1000",
        "mrpc 0x41 0a0b --out-len 2 --json",
        "mrpc 0x82 03000000 --out-len 1024 --json",
        "bind 0x0300 --host 0 --port 1",
        "bind 0x0300 --host 0 --timeout 2000 --json",
        "bind 0x0300 --host 1 --no-wait",
        "unbind 0x0300 --timeout 2000",
        "move 0x0300 --host 1 --timeout 2000",
        "bind 0x0500 --host 0 --block-timeout 60 --json",
        "bind 0x0500 --host 0 --block-timeout 0",
        "unbind 0x0500 --force --json",
        "move 0x0500 --host 1 --force --block-timeout 5",
        "watch --count 1 --timeout 100",
        "p2p route add 0x0401 --size 1M",
        "p2p route add 0x0300 --size 16M --target-off 4k --window-off 0x1000000",
        "p2p route add 0x0300 --size 16M --window-off any",
        "p2p route del 0x4000000",
        "p2p route list --json",
        "p2p grant 0x0300 --host 0",
        "p2p revoke 0x0300 --host 0",
        "p2p grants --json",
        "p2p copy --from 0x0300:0 --to 0x0401:0 --len 1M",
        "p2p copy --from file:/tmp/peer.src --to peer:0x0a02:0:4000 --len 200",
        "--json p2p receive --from 0x0a01 --len 4k --out /tmp/rx/data --wait 120",
        "p2p receive --from 0x0a01 --len 4k --out /tmp/demo-rx --wait 120",
        "p2p copy --from file:/tmp/in --to 0x0300:0 --len 1M --timeout 500 --json",
        "p2p distance 0x0300 0x0401",
        "request --gpus 2 --host 1 --priority 5 --duration 60 --preemptible-by-higher --json",
        "request --vfs 2 --profile quarter --host 1 --priority 5 --pool gpus",
        "request --gpus 1 --host 1 --priority 5 --pool slurm --tenant physics --tag slurm-job-7 --json",
        "release 4 --json",
        "queue",
        "leases --json",
        "top --count 2 --interval 0.5 --sort temp",
        "top --count 1 --json",
        "show 0x0300 --json",
        "bind 0x0401 0x0402 0x0403 0x0404 --host 0 --json",
        "bind 0x0401 0x0401 --host 0 --json",
    ] {
        parse(line).unwrap_or_else(|e| panic!("{line}: {e}"));
    }
}

fn valid(v: Value) {
    pcifab_schemas::validate(&v).unwrap_or_else(|e| panic!("{e}"));
}

/// `emit`'s object: what the command built with the schema name and `"ok": true` added.
fn emitted(command: &str, mut v: Value) -> Value {
    v["schema"] = json!(out::schema(command));
    v["ok"] = json!(true);
    v
}

#[test]
fn device_outputs_fit_their_schemas() {
    let mut v = pcifab_uapi::Version::new();
    (v.major, v.minor) = (1, 4);
    let mut id = pcifab_uapi::Identity::new();
    id.vendor_id[..4].copy_from_slice(b"PCIF");
    (id.pci_vendor, id.pci_device, id.fw_version) = (0x11f8, 0x4052, 0x0107_0203);
    valid(emitted("info", info_json("/dev/pcifab0", &v, &id)));
    valid(emitted("stats", stats_json(&pcifab_uapi::Stats::new())));
    valid(emitted("mrpc", mrpc_json(0x41, 2, 0, &[0xa, 0xb])));
    let mut f = Function {
        pdfid: 0x300,
        flags: pcifab_uapi::FN_BOUND | pcifab_uapi::FN_VF,
        class_code: 0x30200,
        ..Function::default()
    };
    let free = Function {
        pdfid: 0x400,
        ..Function::default()
    };
    let fab = Fabric {
        inv: pcifab_uapi::Inventory::new(),
        ports: vec![Port::default()],
        functions: vec![f, free],
    };
    valid(emitted("list", list_json(&fab)));
    let mut s = function_json(&f);
    s["telemetry"] = telemetry_json(&pcifab_uapi::telemetry::Sample::default());
    valid(emitted("show", s));
    f.flags = 0;
    let mut s = function_json(&f);
    s["telemetry_error"] = json!("no telemetry");
    valid(emitted("show", s));
    let mut e = compose_error(
        "bind",
        0x300,
        std::io::Error::from_raw_os_error(libc::EBUSY),
        0xf0_0003,
    );
    assert_eq!(e.exit, EXIT_REFUSED);
    valid(e.json("bind"));
    e = compose_error("move", 1, std::io::Error::from_raw_os_error(libc::EPERM), 0);
    assert!(e.msg.contains("CAP_SYS_ADMIN") && e.exit == 1);
    valid(e.json("move"));
}

#[test]
fn new_storage_options_reach_the_commands() {
    let c = parse("bind 0x0500 --host 0").expect("parse");
    let Command::Bind(a) = &c.command else {
        panic!("{:?}", c.command)
    };
    assert_eq!(a.target.block_timeout, 30, "the default --block-timeout");
    let c = parse("move 0x0500 --host 1 --force --block-timeout 0").expect("parse");
    let Command::Move(m) = &c.command else {
        panic!("{:?}", c.command)
    };
    assert!(m.force && m.to.target.block_timeout == 0 && m.to.target.host == 1);
    let c = parse("unbind 0x0500").expect("parse");
    assert!(matches!(c.command, Command::Unbind { force: false, .. }));
    let c = parse("unbind 0x0500 --force").expect("parse");
    assert!(matches!(c.command, Command::Unbind { force: true, .. }));
}

#[test]
fn bind_takes_a_list_of_functions() {
    let c = parse("bind 0x0401 0x0402 0x0403 --host 0 --port 2 --no-wait").expect("parse");
    let Command::Bind(a) = &c.command else {
        panic!("{:?}", c.command)
    };
    assert_eq!(a.pdfids, [0x401, 0x402, 0x403]);
    assert_eq!(a.primary(), 0x401);
    assert!(a.target.no_wait && a.target.port == Some(2) && a.target.host == 0);
    for line in [
        "bind 0x0300 --host 1",
        "bind --host 1 0x0300",
        "bind 768 --host 1",
    ] {
        let c = parse(line).expect(line);
        let Command::Bind(a) = &c.command else {
            panic!("{:?}", c.command)
        };
        assert_eq!(
            (a.pdfids.as_slice(), a.target.host),
            (&[0x300][..], 1),
            "{line}"
        );
    }
    let c = parse("bind --host 0 0x0401 0x0402").expect("options first");
    assert!(matches!(&c.command, Command::Bind(a) if a.pdfids == [0x401, 0x402]));
    for bad in [
        "bind --host 0",
        "bind 0x0401 0xzz --host 0",
        "bind 0x0401 0x10000 --host 0",
        "move 0x0401 0x0402 --host 0",
    ] {
        assert_eq!(parse_err(bad).exit, out::EXIT_USAGE, "{bad}");
    }
}

#[test]
fn a_bound_list_and_its_refusal_fit_the_schemas() {
    let mut b = Bind::new();
    (b.pdfid, b.host, b.port) = (0x401, 0, 1);
    b.name[..12].copy_from_slice(b"0000:03:00.0");
    let list = [0x401, 0x402, 0x403];
    let v = emitted("bind", bind_json(&b, &list, 5, None));
    valid(v.clone());
    assert_eq!(v["pdfid"], "0x0401");
    assert_eq!(v["pdfids"], json!(["0x0401", "0x0402", "0x0403"]));
    let v = emitted("bind", bind_json(&b, &[0x401], 5, None));
    assert_eq!(v["pdfids"], json!(["0x0401"]));
    // /dev/null has no inventory: the error cannot say which function is bound already.
    let null = File::open("/dev/null").expect("open /dev/null");
    let e = bind_list_error(
        &null,
        "/dev/null",
        &list,
        std::io::Error::from_raw_os_error(libc::EBUSY),
        0x1,
    );
    assert_eq!(
        e.msg,
        format!(
            "bind 0x0401, 0x0402, 0x0403 failed: {} (the firmware refused the whole list: a \
             function of it is bound or being bound already; firmware code 0x1); none of the 3 \
             functions was bound (a list binds all or none)",
            std::io::Error::from_raw_os_error(libc::EBUSY)
        )
    );
    assert_eq!(e.exit, EXIT_REFUSED);
    let j = e.json("bind");
    valid(j.clone());
    assert_eq!(j["error"]["pdfid"], "0x0401");
    assert_eq!(j["error"]["pdfids"], json!(["0x0401", "0x0402", "0x0403"]));
    assert_eq!(j["error"]["fw_ret"], "0x1");
    // One function alone: the message of every earlier release.
    let e = compose_error(
        "bind",
        0x401,
        std::io::Error::from_raw_os_error(libc::EBUSY),
        0x1,
    );
    assert!(
        e.msg.starts_with("bind 0x0401 failed: ")
            && e.msg
                .ends_with(" (the function is bound or being bound already; firmware code 0x1)"),
        "{}",
        e.msg
    );
}

#[test]
fn without_the_telemetry_extension() {
    let f = Function {
        pdfid: 0x300,
        ..Function::default()
    };
    let mut s = function_json(&f);
    s["telemetry"] = Value::Null;
    s["missing_feature"] = json!("telemetry");
    valid(emitted("show", s));
    let e = no_telemetry("/dev/pcifab0");
    assert_eq!((e.exit, e.code()), (1, "EOPNOTSUPP".to_string()));
    assert!(
        e.msg.contains("lacks the telemetry extension") && e.msg.contains("`telemetry`"),
        "{}",
        e.msg
    );
    for cmd in ["stats-telemetry", "top"] {
        let j = e.json(cmd);
        valid(j.clone());
        assert_eq!(j["error"]["missing_feature"], "telemetry");
    }
    // /dev/null is no pcifab device: the features are unknown, so the tool just asks.
    let null = File::open("/dev/null").expect("open /dev/null");
    assert_eq!(has_telemetry(&null), None);
}

#[test]
fn block_devices_fit_the_bind_and_move_schemas() {
    let mut b = Bind::new();
    (b.pdfid, b.host, b.port) = (0x500, 0, 1);
    b.name[..12].copy_from_slice(b"0000:03:00.0");
    let disks = vec!["/dev/nvme0n1".to_string()];
    for blocks in [None, Some(&[][..]), Some(&disks[..])] {
        let v = emitted("bind", bind_json(&b, &[0x500], 12, blocks));
        valid(v.clone());
        assert_eq!(v.get("block_devices").cloned(), blocks.map(|d| json!(d)));
    }
    let mut m = Move::new();
    (m.pdfid, m.host, m.port, m.from_host) = (0x500, 0, 1, 1);
    let v = emitted("move", move_json(&m, 7, Some(&disks)));
    valid(v.clone());
    assert_eq!(v["block_devices"], json!(["/dev/nvme0n1"]));
    valid(emitted("move", move_json(&m, 7, None)));
}

fn found(node: &str, what: blockdev::Use) -> blockdev::Found {
    blockdev::Found {
        node: node.into(),
        what,
    }
}

#[test]
fn a_mounted_swap_or_held_device_refuses_with_error_busy() {
    use blockdev::Use;
    let usage = Usage {
        found: vec![
            found("/dev/nvme0n1", Use::Held("dm-0".into())),
            found("/dev/nvme0n1p1", Use::Mounted("/mnt/data".into())),
            found("/dev/nvme0n1p2", Use::Swap),
            found("/dev/nvme0n1", Use::Open(42, "dd".into())),
        ],
        uninspected: 2,
    };
    let f = [("0000:03:00.0".to_string(), usage)];
    let e = in_use_verdict("unbind", 0x500, &f, false).expect_err("not refused");
    assert_eq!(
        e.msg,
        "refusing to unbind 0x0500 (0000:03:00.0): /dev/nvme0n1 is held by dm-0 \
         (0000:03:00.0); /dev/nvme0n1p1 is mounted on /mnt/data (0000:03:00.0); \
         /dev/nvme0n1p2 is in use as swap (0000:03:00.0); /dev/nvme0n1 is open by 42 (dd) \
         (0000:03:00.0); 2 processes not inspected (their open files could not be read); \
         unmount/stop them or pass --force"
    );
    assert_eq!((e.exit, e.code()), (EXIT_REFUSED, "busy".to_string()));
    let j = e.json("unbind");
    valid(j.clone());
    assert_eq!(j["error"]["errno"], libc::EBUSY);
    assert_eq!(j["error"]["pdfid"], "0x0500");
    assert_eq!(j["error"]["not_inspected"], 2);
    assert_eq!(
        j["error"]["in_use"][1],
        json!({"bdf": "0000:03:00.0", "device": "/dev/nvme0n1p1", "use": "mounted",
               "by": "/mnt/data"})
    );
    assert_eq!(j["error"]["in_use"][2]["by"], "");
    assert_eq!(j["error"]["in_use"][3]["by"], "42 (dd)");
    assert!(
        in_use_verdict("move", 0x500, &f, true).is_ok(),
        "--force goes ahead"
    );
    for only in [Use::Mounted("/".into()), Use::Swap, Use::Held("md0".into())] {
        let f = [(
            "0000:03:00.0".to_string(),
            Usage {
                found: vec![found("/dev/sda", only.clone())],
                uninspected: 0,
            },
        )];
        let e = in_use_verdict("move", 0x500, &f, false).expect_err("not refused");
        assert!(
            e.msg.starts_with("refusing to move 0x0500"),
            "{only:?}: {e}"
        );
        valid(e.json("move"));
    }
}

#[test]
fn open_files_alone_or_nothing_do_not_refuse() {
    let open = Usage {
        found: vec![found("/dev/nvme0n1", blockdev::Use::Open(7, "fio".into()))],
        uninspected: 0,
    };
    let f = [("0000:03:00.0".to_string(), open)];
    assert!(in_use_verdict("unbind", 0x500, &f, false).is_ok());
    let f = [("0000:03:00.0".to_string(), Usage::default())];
    assert!(in_use_verdict("unbind", 0x500, &f, false).is_ok());
    assert!(in_use_verdict("unbind", 0x500, &[], false).is_ok());
}

#[test]
fn the_no_block_device_warning_says_what_to_check() {
    let dir = std::env::temp_dir().join(format!("pcifab-warn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let m = no_block_device_message(0x500, "0000:03:00.0", 0x010802, 30, &dir, &[]);
    assert_eq!(
        m,
        "no block device of 0x0500 (0000:03:00.0, class 0x010802) appeared within 30 s; no \
         driver is bound to it (/sys/bus/pci/devices/0000:03:00.0/driver is missing: is the \
         driver for class 0x010802, e.g. nvme, loaded?); check the kernel log (dmesg) for its \
         probe; --block-timeout SECS waits longer"
    );
    std::os::unix::fs::symlink("/sys/bus/pci/drivers/nvme", dir.join("driver")).expect("link");
    let m = no_block_device_message(0x500, "0000:03:00.0", 0x010802, 5, &dir, &[]);
    assert!(m.contains("within 5 s; driver nvme is bound to it; check the kernel log (dmesg)"));
    let _ = std::fs::remove_dir_all(&dir);
}
