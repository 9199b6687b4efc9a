// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab-manager`: the fabric manager daemon (Documentation/manager.rst).

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex},
};

use clap::Parser;

use pcifab_manager::{
    config::Config,
    daemon::{self, Daemon, Telemetry},
    driver::Driver,
    etcd::{Deposed, Elector, Etcd, EtcdStore, Guard, LeaderInfo, Leadership},
    executor::{DriverExecutor, Executor, Fence, Fenced, FileFabric, SimExecutor},
    liveness::Liveness,
    scrub::{self, DriverScrubber, Scrubber, SimScrubber},
    spool,
    store::{StateStore, Store},
    telemetry::{Judge, Source},
};

/// The command line (Documentation/manager.rst, "The daemon").
#[derive(Parser, Debug)]
#[command(
    name = "pcifab-manager",
    version,
    about = "The fabric manager daemon of a pcifab fabric",
    long_about = "Runs the fabric manager: leases GPUs and VFs of the pools in --config to \
                  hosts, on the fabric-manager host of a pcifab fabric \
                  (Documentation/manager.rst).\n\n\
                  With --ask or --hash-password it runs no manager but does that one thing.",
    after_help = "Exit status: 0 success, 1 failure, 2 bad command line; \
                  --ask: 3 when the manager refused the request."
)]
struct Args {
    /// The pools and rules (TOML); needed unless --ask or --hash-password is given
    #[arg(long, value_name = "FILE", required_unless_present_any = ["ask", "hash_password"])]
    config: Option<String>,
    /// The directory that holds the state database manager.redb (made when missing)
    #[arg(long, value_name = "DIR", default_value = "/var/lib/pcifab-manager",
          value_parser = state_dir)]
    state: PathBuf,
    /// The control socket
    #[arg(long, value_name = "PATH", default_value = "/run/pcifab-manager.sock")]
    socket: PathBuf,
    /// `driver`: bind/unbind/move through --device; `sim`: a simulated fabric (no device)
    #[arg(long, value_name = "KIND", default_value = "driver",
          value_parser = ["driver", "sim"])]
    executor: String,
    /// The pcifab device (--executor driver)
    #[arg(long, value_name = "PATH", default_value = "/dev/pcifab0")]
    device: String,
    /// With --executor sim: a simulated fabric in FILE, shared by several managers (tests of
    /// high availability)
    #[arg(long, value_name = "FILE")]
    fabric: Option<PathBuf>,
    /// Do not run: send one request to the manager at --socket, print the reply (exit 0 if
    /// it succeeded, 3 if refused, 1 otherwise)
    #[arg(long, value_name = "JSON")]
    ask: Option<String>,
    /// Do not run: read a password from standard input (its first line), print the
    /// password_pbkdf2 of a Redfish user (Documentation/manager-api.rst)
    #[arg(long)]
    hash_password: bool,
    /// PBKDF2 iterations for --hash-password (at least 10000)
    #[arg(long, value_name = "N", default_value_t = pcifab_manager::redfish::users::ITERATIONS,
          value_parser = iterations)]
    iterations: u32,
}

/// `--iterations`: a number of at least [`MIN_ITERATIONS`](pcifab_manager::redfish::users::MIN_ITERATIONS).
fn iterations(v: &str) -> Result<u32, String> {
    v.parse()
        .ok()
        .filter(|n| *n >= pcifab_manager::redfish::users::MIN_ITERATIONS)
        .ok_or_else(|| {
            format!(
                "a number of at least {} is needed",
                pcifab_manager::redfish::users::MIN_ITERATIONS
            )
        })
}

/// Checks that `--state` names a directory (existing or to be made), not the database file:
/// the database is `manager.redb` inside it (Documentation/manager.rst).
fn state_dir(v: &str) -> Result<PathBuf, String> {
    let p = std::path::Path::new(v);
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
        _ => Ok(p.to_path_buf()),
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
    // Highly available: wait to be elected (answering as a standby meanwhile), then the
    // state in etcd, commits guarded by the epoch, every fabric change fenced.
    let mut ha_fence: Option<(Arc<Elector>, Leadership, Deposed)> = None;
    let store: Box<dyn StateStore> = match config.ha.clone() {
        None => Box::new(Store::open(&a.state)?),
        Some(ha) => {
            let etcd = Arc::new(Etcd::for_ha(&ha)?);
            let me = LeaderInfo {
                node: ha.node.clone(),
                advertise: ha.advertise.clone(),
            };
            let elector = Arc::new(Elector::new(
                etcd.clone(),
                &ha.prefix,
                me.clone(),
                ha.lease_ttl_s,
            ));
            let standby = Standby::start(&a.socket, me)?;
            eprintln!(
                "pcifab-manager: node {}: standby, campaigning for leadership on {}",
                ha.node,
                ha.endpoints.join(",")
            );
            let won = elector.campaign(|leader| standby.leader(leader));
            standby.stop(&a.socket);
            let won = won?;
            eprintln!(
                "pcifab-manager: node {}: the leader, epoch {}",
                ha.node, won.epoch
            );
            let deposed: Deposed = Arc::new(|why: &str| {
                eprintln!("pcifab-manager: {why}; exiting (a supervisor restarts it as a standby)");
                std::process::exit(DEPOSED);
            });
            elector.keep(won, deposed.clone());
            let store = EtcdStore::open(
                etcd,
                &ha.prefix,
                Guard::Leader(won.epoch),
                Some(deposed.clone()),
            )?;
            ha_fence = Some((elector, won, deposed));
            Box::new(store)
        }
    };
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
    } else if let Some(path) = &a.fabric {
        let mut pf_of = std::collections::BTreeMap::new();
        for d in config.pools.iter().flat_map(|p| &p.devices) {
            for v in &d.vfs {
                pf_of.insert(*v, d.pf);
            }
        }
        let f = FileFabric {
            path: path.clone(),
            epoch: ha_fence.as_ref().map_or(0, |(_, l, _)| l.epoch),
            node: config
                .ha
                .as_ref()
                .map_or_else(|| "standalone".into(), |h| h.node.clone()),
            pf_of,
        };
        (Box::new(f), None)
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
    let exec: Box<dyn Executor + Send> = match ha_fence {
        Some((elector, leadership, deposed)) => Box::new(Fenced {
            inner: exec,
            fence: Arc::new(EtcdFence {
                elector,
                leadership,
                deposed,
            }),
        }),
        None => exec,
    };
    let ha = config.ha.is_some();
    let mut d = Daemon::start(config, store, exec, daemon::steady_clock())?;
    d.reload_after_failed_commit = ha;
    // The tests of high availability only (Documentation/manager.rst, "Request ids").
    d.stop_after_keyed = std::env::var("PCIFAB_MANAGER_TEST_STOP_AFTER_KEYED")
        .ok()
        .and_then(|n| n.parse().ok());
    d.config_path = a.config.as_deref().map(PathBuf::from);
    d.telemetry = telemetry;
    d.liveness = liveness;
    d.scrubber = Some(scrubber);
    pcifab_manager::socket::serve(d, &a.socket)
}

/// The exit status of a manager that learnt it is no longer the leader (EX_TEMPFAIL).
const DEPOSED: i32 = 75;

/// The fence of a highly available leader: etcd still names it the leader, asked
/// immediately before each change of the fabric.
struct EtcdFence {
    elector: Arc<Elector>,
    leadership: Leadership,
    deposed: Deposed,
}

impl Fence for EtcdFence {
    fn check(&self) -> Result<(), String> {
        self.elector.check(self.leadership, &self.deposed)
    }
}

/// The control socket of a standby: every request is answered with where the leader is.
struct Standby {
    leader: Arc<Mutex<Option<LeaderInfo>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Standby {
    fn start(socket: &std::path::Path, me: LeaderInfo) -> Result<Self, String> {
        use std::io::{BufRead, Write};
        if socket.exists() {
            std::fs::remove_file(socket)
                .map_err(|e| format!("cannot remove stale socket {}: {e}", socket.display()))?;
        }
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let listener = std::os::unix::net::UnixListener::bind(socket)
            .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
        let leader: Arc<Mutex<Option<LeaderInfo>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (l, st) = (leader.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let l = l.clone();
                let me = me.clone();
                std::thread::spawn(move || {
                    let Ok(mut out) = conn.try_clone() else {
                        return;
                    };
                    for line in std::io::BufReader::new(conn).lines() {
                        let Ok(line) = line else { return };
                        if line.trim().is_empty() {
                            continue;
                        }
                        let leader = l.lock().ok().and_then(|g| g.clone());
                        let reply = standby_reply(&me, leader.as_ref());
                        if writeln!(out, "{reply}").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(Self {
            leader,
            stop,
            thread: Some(thread),
        })
    }

    fn leader(&self, l: Option<&LeaderInfo>) {
        if let Ok(mut g) = self.leader.lock() {
            *g = l.cloned();
        }
    }

    fn stop(mut self, socket: &std::path::Path) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wake the accept.
        let _ = std::os::unix::net::UnixStream::connect(socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(socket);
    }
}

/// A standby's answer to any request (Documentation/manager.rst, "High availability").
fn standby_reply(me: &LeaderInfo, leader: Option<&LeaderInfo>) -> serde_json::Value {
    let error = match leader {
        Some(l) => format!(
            "this manager (node {}) is a standby; the leader is node {} at {}: ask it",
            me.node, l.node, l.advertise
        ),
        None => format!(
            "this manager (node {}) is a standby and there is no leader now (or etcd \
             cannot be reached); retry in a few seconds",
            me.node
        ),
    };
    serde_json::json!({"ok": false, "standby": true, "status": 421, "error": error,
                       "leader": leader})
}

/// `pcifab-manager migrate`'s command line (Documentation/manager.rst, "High availability").
#[derive(Parser, Debug)]
#[command(
    name = "pcifab-manager migrate",
    about = "Copy a stopped manager's state from one store to another that holds none"
)]
struct MigrateArgs {
    /// The store to copy from: redb:DIR or etcd:URL[,URL...]
    #[arg(long, value_name = "STORE")]
    from: String,
    /// The store to copy to (it must hold no state): redb:DIR or etcd:URL[,URL...]
    #[arg(long, value_name = "STORE")]
    to: String,
    /// The key prefix of the state in etcd (default: --config's [ha] prefix, else /pcifab)
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// A manager configuration whose [ha] section the etcd store is reached with: its
    /// TLS (ca, cert, key), its user (user, password_file), timeout_ms and prefix, and its
    /// endpoints when the store is `etcd:` with no URL
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// `migrate --from STORE --to STORE [--prefix P]`: copies the whole state of a stopped
/// manager between its embedded database and etcd.
fn migrate(m: MigrateArgs) -> Result<String, String> {
    let MigrateArgs {
        from,
        to,
        prefix,
        config,
    } = m;
    // The [ha] section of --config: the same keys, checks and etcd client as a manager's.
    let ha = match &config {
        None => None,
        Some(p) => {
            let shown = p.display();
            let c = Config::load(&p.to_string_lossy())
                .map_err(|e| format!("migrate: --config {shown}: {e}"))?;
            Some(c.ha.ok_or_else(|| {
                format!("migrate: --config {shown} has no [ha] section to reach etcd with")
            })?)
        }
    };
    let prefix = prefix
        .or_else(|| ha.as_ref().map(|h| h.prefix.clone()))
        .unwrap_or_else(|| "/pcifab".into());
    let open = |spec: &str| -> Result<Box<dyn StateStore>, String> {
        if let Some(dir) = spec.strip_prefix("redb:") {
            state_dir(dir)?;
            return Ok(Box::new(Store::open(std::path::Path::new(dir))?));
        }
        if let Some(eps) = spec.strip_prefix("etcd:") {
            let eps: Vec<String> = eps
                .split(',')
                .filter(|e| !e.is_empty())
                .map(String::from)
                .collect();
            let etcd = match &ha {
                Some(h) => {
                    let mut h = h.clone();
                    if !eps.is_empty() {
                        h.endpoints = eps;
                    }
                    h.check().map_err(|e| {
                        format!(
                            "migrate: {spec} with --config {}: {e}",
                            config
                                .as_deref()
                                .unwrap_or(std::path::Path::new(""))
                                .display()
                        )
                    })?;
                    Etcd::for_ha(&h).map_err(|e| format!("migrate: {spec}: {e}"))?
                }
                None => {
                    if eps.is_empty() {
                        return Err(format!(
                            "migrate: {spec} names no etcd endpoint: give etcd:URL[,URL...], or \
                             --config with an [ha] section"
                        ));
                    }
                    if eps.iter().any(|e| !e.starts_with("http://")) {
                        return Err(format!(
                            "migrate: {spec}: without --config, etcd endpoints are \
                             http://HOST:PORT; for etcd over TLS or with a user, give --config \
                             a manager configuration whose [ha] has ca (cert, key) or user \
                             (password_file)"
                        ));
                    }
                    Etcd::new(&eps, std::time::Duration::from_secs(5))
                }
            };
            let etcd = Arc::new(etcd);
            return Ok(Box::new(EtcdStore::open(
                etcd,
                &prefix,
                Guard::NoLeader,
                None,
            )?));
        }
        Err(format!(
            "migrate: '{spec}' is neither redb:DIR nor etcd:URL[,URL...]"
        ))
    };
    let src = open(&from)?;
    let dst = open(&to)?;
    let tables = pcifab_manager::scheduler::persist::TABLES;
    let held = dst.load(tables)?;
    if held.version.is_some() || held.whole.is_some() || dst.log_len()? > 0 {
        return Err(format!(
            "migrate: {to} holds a state already; migrate only into an empty store"
        ));
    }
    let what = pcifab_manager::etcd::copy_state(&*src, &*dst, tables)?;
    let (a, b) = (
        pcifab_manager::etcd::records_of(&*src, tables)?,
        pcifab_manager::etcd::records_of(&*dst, tables)?,
    );
    if a != b || src.log_tail(u64::MAX)? != dst.log_tail(u64::MAX)? {
        return Err(format!(
            "migrate: {to} does not read back what {from} holds; do not start a manager on it"
        ));
    }
    Ok(format!("migrated {what} from {from} to {to}"))
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
    // A handler that panics ends the process (a supervisor restarts it and the start
    // reconciles the fabric with the stored state) rather than poisoning the daemon's lock
    // and limping on.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("pcifab-manager: a thread panicked; aborting so that a supervisor restarts it");
        std::process::abort();
    }));
    // `pcifab-manager migrate ...` copies a stopped manager's state between stores.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "migrate") {
        let m = MigrateArgs::try_parse_from(
            std::iter::once("pcifab-manager migrate".to_string()).chain(args[1..].iter().cloned()),
        )
        .unwrap_or_else(|e| e.exit());
        return match migrate(m) {
            Ok(m) => {
                println!("pcifab-manager: {m}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pcifab-manager: {e}");
                ExitCode::from(1)
            }
        };
    }
    // Bad usage exits with status 2, --help and --version with 0.
    let a = Args::parse();
    if a.fabric.is_some() && a.executor != "sim" {
        eprintln!("pcifab-manager: --fabric FILE goes with --executor sim");
        return ExitCode::from(2);
    }
    if a.hash_password {
        return hash_password(a.iterations);
    }
    if let Some(request) = &a.ask {
        return ask(&a.socket, request);
    }
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pcifab-manager: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn migrate_command_line() {
        MigrateArgs::command().debug_assert();
        let p = |a: &[&str]| {
            MigrateArgs::try_parse_from(std::iter::once("migrate").chain(a.iter().copied()))
        };
        let m = p(&["--from", "redb:/x", "--to", "etcd:http://h:2379"]).unwrap();
        assert_eq!(
            (m.from.as_str(), m.to.as_str(), m.prefix, m.config),
            ("redb:/x", "etcd:http://h:2379", None, None)
        );
        let m = p(&["--from", "redb:/x", "--to", "etcd:", "--config", "m.toml"]).unwrap();
        assert_eq!(m.config, Some(PathBuf::from("m.toml")));
        for bad in [
            &["--from", "redb:/x"][..],
            &["--to", "redb:/x"],
            &["--frob", "1"],
        ] {
            assert_eq!(p(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn command_line() {
        Args::command().debug_assert();
        let p = |a: &[&str]| {
            Args::try_parse_from(std::iter::once("pcifab-manager").chain(a.iter().copied()))
        };
        let a = p(&["--config", "m.toml"]).unwrap();
        assert_eq!(a.state, PathBuf::from("/var/lib/pcifab-manager"));
        assert_eq!(a.socket, PathBuf::from("/run/pcifab-manager.sock"));
        assert_eq!(
            (a.executor.as_str(), a.device.as_str()),
            ("driver", "/dev/pcifab0")
        );
        assert_eq!(a.iterations, pcifab_manager::redfish::users::ITERATIONS);
        // --ask and --hash-password need no --config; running does.
        assert!(p(&["--ask", "{}"]).is_ok());
        assert!(p(&["--hash-password", "--iterations", "10000"]).is_ok());
        let e = p(&[]).unwrap_err();
        assert_eq!(
            (e.exit_code(), e.kind()),
            (2, clap::error::ErrorKind::MissingRequiredArgument)
        );
        for bad in [
            &["--config", "m", "--executor", "qemu"][..],
            &["--hash-password", "--iterations", "9999"],
            &["--config", "m", "--state", "/var/lib/x/state.redb"],
            &["--config", "m", "--frob"],
            &["--config"],
        ] {
            assert_eq!(p(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
        let e = p(&["--config", "m", "--state", "/x/state.redb"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--state is the directory that holds manager.redb"),
            "{e}"
        );
        assert!(e.contains("e.g. --state /x"), "{e}");
    }
}
