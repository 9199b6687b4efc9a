// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab-manager`: the fabric manager daemon (Documentation/manager.rst).

use std::{path::PathBuf, process::ExitCode};

use pcifab_manager::{
    config::Config,
    daemon::{self, Daemon, Telemetry},
    driver::Driver,
    executor::{DriverExecutor, Executor, SimExecutor},
    store::Store,
    telemetry::{Judge, Source},
};

const USAGE: &str = "\
usage: pcifab-manager --config FILE [options]

Runs the fabric manager: leases GPUs and VFs of the pools in FILE to hosts, on the
fabric-manager host of a pcifab fabric (Documentation/manager.rst).

options:
  --config FILE     the pools and rules (TOML)
  --state DIR       where the state database lives (default /var/lib/pcifab-manager)
  --socket PATH     the control socket (default /run/pcifab-manager.sock)
  --executor KIND   driver (default: bind/unbind/move through --device) or sim (no fabric)
  --device PATH     the pcifab device (default /dev/pcifab0)
  -h, --help        this text
";

struct Args {
    config: Option<String>,
    state: PathBuf,
    socket: PathBuf,
    executor: String,
    device: String,
}

fn parse(args: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args {
        config: None,
        state: "/var/lib/pcifab-manager".into(),
        socket: "/run/pcifab-manager.sock".into(),
        executor: "driver".into(),
        device: "/dev/pcifab0".into(),
    };
    let mut it = args.iter();
    while let Some(o) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{o} needs a value"))
        };
        match o.as_str() {
            "-h" | "--help" => return Ok(None),
            "--config" => a.config = Some(val()?),
            "--state" => a.state = val()?.into(),
            "--socket" => a.socket = val()?.into(),
            "--device" => a.device = val()?,
            "--executor" => {
                a.executor = val()?;
                if a.executor != "driver" && a.executor != "sim" {
                    return Err(format!("--executor is driver or sim, not '{}'", a.executor));
                }
            }
            other => return Err(format!("unexpected argument '{other}'")),
        }
    }
    if a.config.is_none() {
        return Err("--config FILE is needed".into());
    }
    Ok(Some(a))
}

fn run(a: Args) -> Result<(), String> {
    let mut config = Config::load(a.config.as_deref().unwrap_or_default())?;
    let store = Store::open(&a.state)?;
    let (exec, telemetry): (Box<dyn Executor + Send>, Option<Telemetry>) = if a.executor == "driver"
    {
        let drv = Driver::open(&a.device)?;
        let inv = drv.functions()?;
        // Fill in VFs the configuration left to the inventory.
        for p in &mut config.pools {
            for d in &mut p.devices {
                if d.vfs.is_empty() {
                    d.vfs = inv
                        .iter()
                        .filter(|f| f.flags & pcifab_uapi::FN_VF != 0 && f.pf_pdfid == d.pf)
                        .map(|f| f.pdfid)
                        .collect();
                }
                if !inv.iter().any(|f| f.pdfid == d.pf) {
                    return Err(format!(
                        "pool '{}': PF {:#06x} is not in the fabric behind {}; `pcifab list` \
                             shows the functions",
                        p.name, d.pf, a.device
                    ));
                }
            }
        }
        let source: Box<dyn Source + Send> = Box::new(Driver::open(&a.device)?);
        let tel = Telemetry {
            source,
            functions: inv.iter().map(|f| f.pdfid).collect(),
            judge: Judge::default(),
            last_poll: None,
            samples: Default::default(),
        };
        (Box::new(DriverExecutor { driver: drv }), Some(tel))
    } else {
        // The simulated fabric starts as the stored state left it.
        let mut sim = SimExecutor::new(
            config
                .pools
                .iter()
                .flat_map(|p| &p.devices)
                .map(|d| (d.pf, d.vfs.as_slice())),
        );
        if let Some(s) = store.load()? {
            sim.bound = s.holders.clone();
        }
        (Box::new(sim), None)
    };
    let mut d = Daemon::start(config, store, exec, Box::new(daemon::unix_now))?;
    d.telemetry = telemetry;
    daemon::serve(d, &a.socket)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args) {
        Ok(None) => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pcifab-manager: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Ok(Some(a)) => match run(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("pcifab-manager: {e}");
                ExitCode::from(1)
            }
        },
    }
}
