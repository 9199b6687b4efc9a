// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab-manager`: the fabric manager daemon (Documentation/manager.rst).

use std::{path::PathBuf, process::ExitCode};

use pcifab_manager::{
    config::Config,
    daemon::{self, Daemon, Telemetry},
    driver::Driver,
    executor::{DriverExecutor, Executor, SimExecutor},
    liveness::Liveness,
    scrub::{self, DriverScrubber, Scrubber, SimScrubber},
    spool,
    store::Store,
    telemetry::{Judge, Source},
};

const USAGE: &str = "\
usage: pcifab-manager --config FILE [options]

Runs the fabric manager: leases GPUs and VFs of the pools in FILE to hosts, on the
fabric-manager host of a pcifab fabric (Documentation/manager.rst).

options:
  --config FILE     the pools and rules (TOML)
  --state DIR       the directory that holds the state database manager.redb (default
                    /var/lib/pcifab-manager)
  --socket PATH     the control socket (default /run/pcifab-manager.sock)
  --executor KIND   driver (default: bind/unbind/move through --device) or sim (no fabric)
  --device PATH     the pcifab device (default /dev/pcifab0)
  --ask JSON        do not run: send one request to the manager at --socket, print the
                    reply (exit 0 if it succeeded, 3 if refused, 1 otherwise)
  --hash-password   do not run: read a password from standard input (its first line),
                    print the password_pbkdf2 of a Redfish user (Documentation/manager-api.rst)
  --iterations N    PBKDF2 iterations for --hash-password (default 600000, at least 10000)
  -h, --help        this text
";

struct Args {
    config: Option<String>,
    state: PathBuf,
    socket: PathBuf,
    executor: String,
    device: String,
    ask: Option<String>,
    hash_password: bool,
    iterations: u32,
}

fn parse(args: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args {
        config: None,
        state: "/var/lib/pcifab-manager".into(),
        socket: "/run/pcifab-manager.sock".into(),
        executor: "driver".into(),
        device: "/dev/pcifab0".into(),
        ask: None,
        hash_password: false,
        iterations: pcifab_manager::redfish::users::ITERATIONS,
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
            "--ask" => a.ask = Some(val()?),
            "--hash-password" => a.hash_password = true,
            "--iterations" => {
                let v = val()?;
                a.iterations = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= pcifab_manager::redfish::users::MIN_ITERATIONS)
                    .ok_or_else(|| {
                        format!("--iterations is a number of at least 10000, not '{v}'")
                    })?;
            }
            "--executor" => {
                a.executor = val()?;
                if a.executor != "driver" && a.executor != "sim" {
                    return Err(format!("--executor is driver or sim, not '{}'", a.executor));
                }
            }
            other => return Err(format!("unexpected argument '{other}'")),
        }
    }
    if a.config.is_none() && a.ask.is_none() && !a.hash_password {
        return Err("--config FILE is needed".into());
    }
    state_dir(&a.state)?;
    Ok(Some(a))
}

/// Checks that `--state` names a directory (existing or to be made), not the database file:
/// the database is `manager.redb` inside it (Documentation/manager.rst).
fn state_dir(p: &std::path::Path) -> Result<(), String> {
    let shown = p.display();
    if p.extension().is_some_and(|e| e == "redb") {
        return Err(format!(
            "--state {shown} names a database file; --state is the directory that holds \
             manager.redb (e.g. --state {})",
            p.parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map_or_else(|| ".".into(), |d| d.display().to_string())
        ));
    }
    match std::fs::metadata(p) {
        Ok(m) if !m.is_dir() => Err(format!(
            "--state {shown} is a file; --state is the directory that holds manager.redb"
        )),
        _ => Ok(()),
    }
}

fn run(a: Args) -> Result<(), String> {
    let mut config = Config::load(a.config.as_deref().unwrap_or_default())?;
    // Before the database is opened and the fabric touched: one manager per socket.
    if std::os::unix::net::UnixStream::connect(&a.socket).is_ok() {
        return Err(format!(
            "another manager answers on {}; stop it or use another --socket",
            a.socket.display()
        ));
    }
    let spool = spool::dir_for(&a.socket);
    if let Some(pid) = spool::daemon_pid(&spool) {
        return Err(format!(
            "another manager (pid {pid}) serves {}; stop it or use another --socket",
            spool.display()
        ));
    }
    let store = Store::open(&a.state)?;
    let mut liveness: Option<Box<dyn Liveness + Send>> = None;
    let scrubber: std::sync::Arc<dyn Scrubber> = if a.executor == "driver" {
        std::sync::Arc::new(DriverScrubber {
            device: a.device.clone(),
            roots: pcifab_manager::blockdev::Roots::system(),
            appear: scrub::APPEAR_TIMEOUT,
        })
    } else {
        std::sync::Arc::new(SimScrubber::default())
    };
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
        liveness = Some(Box::new(Driver::open(&a.device)?));
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
        if let Some((s, _)) = pcifab_manager::scheduler::persist::load(&store)? {
            sim.bound = s.holders.clone();
        }
        (Box::new(sim), None)
    };
    let mut d = Daemon::start(config, store, exec, daemon::steady_clock())?;
    d.config_path = a.config.as_deref().map(PathBuf::from);
    d.telemetry = telemetry;
    d.liveness = liveness;
    d.scrubber = Some(scrubber);
    pcifab_manager::socket::serve(d, &a.socket)
}

/// `--ask`: one request to a running manager; the exit status says how it went.
fn ask(socket: &std::path::Path, request: &str) -> ExitCode {
    let reply = pcifab_manager::client::ask(socket, request).map_err(|f| f.msg);
    match reply {
        Ok(line) => {
            print!("{line}");
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            match (v.get("ok"), v.get("refused")) {
                (Some(serde_json::Value::Bool(true)), _) => ExitCode::SUCCESS,
                (_, Some(serde_json::Value::Bool(true))) => ExitCode::from(3),
                _ => ExitCode::from(1),
            }
        }
        Err(e) => {
            eprintln!("pcifab-manager: {e}");
            ExitCode::from(1)
        }
    }
}

/// Prints the stored form of the password on standard input's first line.
fn hash_password(iterations: u32) -> ExitCode {
    let mut line = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut line) {
        eprintln!("pcifab-manager: cannot read the password from standard input: {e}");
        return ExitCode::from(1);
    }
    let pw = line.strip_suffix('\n').unwrap_or(&line);
    let pw = pw.strip_suffix('\r').unwrap_or(pw);
    if pw.is_empty() {
        eprintln!("pcifab-manager: the password (standard input's first line) is empty");
        return ExitCode::from(2);
    }
    match pcifab_manager::redfish::users::hash_password(pw, iterations) {
        Ok(h) => {
            println!("{h}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pcifab-manager: {e}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    if std::env::args()
        .nth(1)
        .is_some_and(|a| a == "--version" || a == "-V")
    {
        println!("{} {}", env!("CARGO_BIN_NAME"), env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    // A handler that panics ends the process (a supervisor restarts it and the start
    // reconciles the fabric with the stored state) rather than poisoning the daemon's lock
    // and limping on.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("pcifab-manager: a thread panicked; aborting so that a supervisor restarts it");
        std::process::abort();
    }));
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
        Ok(Some(a)) if a.hash_password => hash_password(a.iterations),
        Ok(Some(a)) if a.ask.is_some() => ask(&a.socket, a.ask.as_deref().unwrap_or_default()),
        Ok(Some(a)) => match run(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("pcifab-manager: {e}");
                ExitCode::from(1)
            }
        },
    }
}
