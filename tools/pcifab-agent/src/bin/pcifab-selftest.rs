// SPDX-License-Identifier: GPL-2.0-only
//! pcifab-selftest: exercises the management path of `/dev/pcifabN` from inside a test guest.
//!
//! Every subcommand prints one JSON line with its results on stdout and exits with 0 when all
//! its checks held, 1 (with a message on stderr saying what was expected and what happened)
//! when one failed, 2 for a bad command line. See `usage` below and
//! Documentation/testing.rst.

use std::process::ExitCode;

use args::parse_opts;
use util::{usage, Fail, Res};

// The shared layer: the areas use it; it uses none of them.
#[path = "selftest/args.rs"]
mod args;
#[path = "selftest/ioctl.rs"]
mod ioctl;
#[path = "selftest/kmod.rs"]
mod kmod;
#[path = "selftest/kmsg.rs"]
mod kmsg;
#[path = "selftest/mem.rs"]
mod mem;
#[path = "selftest/mmio.rs"]
mod mmio;
#[path = "selftest/util.rs"]
mod util;

// The areas, one a command or a family of commands; they use the shared layer only.
#[path = "selftest/abi.rs"]
mod abi;
#[path = "selftest/bar.rs"]
mod bar;
#[path = "selftest/blk.rs"]
mod blk;
#[path = "selftest/caps.rs"]
mod caps;
#[path = "selftest/concurrent.rs"]
mod concurrent;
#[path = "selftest/cycles.rs"]
mod cycles;
#[path = "selftest/dmaep_bench.rs"]
mod dmaep_bench;
#[path = "selftest/echo.rs"]
mod echo;
#[path = "selftest/faults.rs"]
mod faults;
#[path = "selftest/fuzz.rs"]
mod fuzz;
#[path = "selftest/mrpc.rs"]
mod mrpc;
#[path = "selftest/nocap.rs"]
mod nocap;
#[path = "selftest/p2p.rs"]
mod p2p;
#[path = "selftest/stall.rs"]
mod stall;
#[path = "selftest/time.rs"]
mod time;
#[path = "selftest/unpriv.rs"]
mod unpriv;

/// A command that parses its own arguments.
type RawCmd = fn(&[String]) -> Res<()>;

const USAGE: &str = "\
usage: pcifab-selftest COMMAND [OPTIONS]

commands:
  echo --count N [--seed S] [--size B] [--latencies] [--device PATH]
        N MRPC echo (0x41) round trips, random payload sizes 0..=1024 (or B bytes),
        random bytes, each output compared byte for byte; rate and p50/p99 latency;
        --latencies: also every round trip's latency in us, in order (lat_us)
  concurrent --procs P --count N [--seed S] [--device PATH]
        P processes at once, N echoes each with their own byte pattern; STATS must
        grow by exactly P*N commands
  abi [--device PATH]
        the bad-input table of every ioctl; nothing may change on a rejected call
  unpriv [--device PATH]
        drop to uid/gid 65534, then: read-only commands work, configuration and
        debug-write commands get EPERM and start nothing (the node must be readable)
  hold --seconds S [--expect ERRNO] [--device PATH]
        one echo with a timeout of S seconds (for a firmware that hangs); reports the
        errno it ended with; SIGUSR1 interrupts it (EINTR)
  mrpc CMD [--in HEX] [--out-len N] [--timeout MS] [--expect ERRNO] [--device PATH]
        one command; reports errno, status, return value, output and elapsed time
  switchtec-echo --count N [--seed S] [--size B] [--latencies] [--device PATH]
        like echo, through the in-tree C driver's /dev/switchtec0 (write the 4-byte
        command id and the input, read the 4-byte return value and the output)
  bar --device BDF (--write SEED | --check SEED | --check-zero)
        maps /sys/bus/pci/devices/BDF/resource2 (a fabric function's device memory):
        --write fills the whole BAR with the pseudo-random pattern of SEED and reads
        it back; --check compares it with that pattern; --check-zero requires zeros
  bar-id --device BDF [--wait MS]
        maps resource0 and prints the function's id (u32 at 0x0: device << 16 |
        vendor) and pdfid (u32 at 0x4); --wait: poll up to MS ms for the device to
        appear and read as something other than all ones
  hold-bar --device BDF --seconds S [--seed S]
        maps resource2 and touches it every 10 ms for S seconds or until SIGTERM (for
        unbinding while mapped); prints `mapped` once mapped, then one JSON line:
        whether SIGBUS came, after how many touches and how long after the last good
        one; without SIGBUS, per phase (SIGUSR1 starts the next, at most 4) how many
        reads returned the pattern of `bar --write SEED`, all ones, zero or other data
(the BAR commands enable the device through sysfs `enable` when no driver holds it)
";

// ------------------------------------------------------------------ main

/// Usage of the commands that live in their own modules.
fn more_usage() -> String {
    [
        p2p::USAGE,
        dmaep_bench::USAGE,
        fuzz::USAGE,
        cycles::USAGE,
        faults::USAGE,
        blk::USAGE,
        nocap::USAGE,
        stall::USAGE,
        caps::USAGE,
        time::USAGE,
    ]
    .concat()
}

fn main() -> ExitCode {
    if std::env::args()
        .nth(1)
        .is_some_and(|a| a == "--version" || a == "-V")
    {
        println!("{} {}", env!("CARGO_BIN_NAME"), env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    if cmd == "-h" || cmd == "--help" {
        print!("{USAGE}{}", more_usage());
        return ExitCode::SUCCESS;
    }
    let p2p_cmd: Option<RawCmd> = match cmd.as_str() {
        "p2p-user" => Some(p2p::cmd_p2p_user),
        "p2p-local" => Some(p2p::cmd_p2p_local),
        "p2p-hold" => Some(p2p::cmd_p2p_hold),
        "p2p-peer" => Some(p2p::cmd_p2p_peer),
        "p2p-regtime" => Some(p2p::cmd_p2p_regtime),
        "bar-range" => Some(p2p::cmd_bar_range),
        "p2p-bench" => Some(p2p::cmd_p2p_bench),
        "p2p-signalled" => Some(p2p::cmd_p2p_signalled),
        "p2p-movable" => Some(p2p::cmd_p2p_movable),
        "dmaep-bench" => Some(dmaep_bench::cmd_dmaep_bench),
        "dmaep-lend" => Some(dmaep_bench::cmd_dmaep_lend),
        "fuzz" => Some(fuzz::cmd_fuzz),
        "unload-cycles" => Some(cycles::cmd_unload_cycles),
        "probe-faults" => Some(faults::cmd_probe_faults),
        "probe-steps" => Some(faults::cmd_probe_steps),
        "blk-write" => Some(blk::cmd_blk_write),
        "blk-verify" => Some(blk::cmd_blk_verify),
        "blk-stream" => Some(blk::cmd_blk_stream),
        "nocap" => Some(nocap::cmd_nocap),
        "stall-inventory" => Some(stall::cmd_stall_inventory),
        "as-admin" => Some(caps::cmd_as_admin),
        "time" => Some(time::cmd_time),
        _ => None,
    };
    let r = if let Some(run) = p2p_cmd {
        run(&args[1..])
    } else {
        parse_opts(&args[1..]).and_then(|o| {
            let only_pos = matches!(cmd.as_str(), "mrpc");
            if !only_pos {
                if let Some(x) = o.positional.first() {
                    return Err(usage(format!("unexpected argument '{x}'")));
                }
            }
            match cmd.as_str() {
                "echo" => echo::cmd_echo(&o),
                "switchtec-echo" => echo::cmd_switchtec_echo(&o),
                "concurrent" => concurrent::cmd_concurrent(&o),
                "abi" => abi::cmd_abi(&o),
                "unpriv" => unpriv::cmd_unpriv(&o),
                "hold" => mrpc::cmd_hold(&o),
                "mrpc" => mrpc::cmd_mrpc(&o),
                "bar" => bar::cmd_bar(&o),
                "bar-id" => bar::cmd_bar_id(&o),
                "hold-bar" => bar::cmd_hold_bar(&o),
                other => Err(usage(format!("unknown command '{other}'"))),
            }
        })
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Usage(m)) => {
            eprintln!("pcifab-selftest: {m}\n\n{USAGE}{}", more_usage());
            ExitCode::from(2)
        }
        Err(Fail::Check(m)) => {
            eprintln!("pcifab-selftest {cmd}: FAILED: {m}");
            ExitCode::from(1)
        }
    }
}
