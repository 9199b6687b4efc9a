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
        "p2p copy --from file:/tmp/in --to 0x0300:0 --len 1M --timeout 500 --json",
        "p2p distance 0x0300 0x0401",
        "request --gpus 2 --host 1 --priority 5 --duration 60 --preemptible-by-higher --json",
        "request --vfs 2 --profile quarter --host 1 --priority 5 --pool gpus",
        "release 4 --json",
        "queue",
        "leases --json",
        "top --count 2 --interval 0.5 --sort temp",
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
