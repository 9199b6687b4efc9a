// SPDX-License-Identifier: GPL-2.0-only
//! pcifab-emu: stands in for the firmware of a Microchip Switchtec PAX switch.
//!
//! Serves one management endpoint (MEP) per host to QEMU's vfio-user-pci
//! device, plus a control socket for tests. See Documentation/emulator.rst.

#[macro_use]
mod log;
mod config;
mod control;
mod dma;
mod dmaep;
mod dmafab;
mod ep;
mod fabric;
#[cfg(test)]
mod fabric_tests;
mod function;
mod gas;
mod hostile;
mod irq;
mod mep;
mod model;
mod mrpc;
mod nvme;
mod p2p;
mod pci;
mod qmp;
mod regs;
mod vfio_user;

use config::Config;
use fabric::Fabric;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The command line (Documentation/emulator.rst).
#[derive(clap::Parser, Debug)]
#[command(
    name = "pcifab-emu",
    version,
    about = "Emulates the management endpoint of a Switchtec PAX switch",
    long_about = "Emulates the management endpoint of a Switchtec PAX switch for each host \
                  in --config, each on a vfio-user socket DIR/mep-<host>.sock for QEMU's \
                  vfio-user-pci device (and, with dma_endpoint_channels set, the switch's DMA \
                  endpoint on DIR/dmaep-<host>.sock), and answers test requests on \
                  DIR/control.sock (Documentation/emulator.rst).",
    after_help = "Exit status: 0 stopped, 1 failure, 2 bad command line."
)]
struct Args {
    /// Fabric description (TOML; see tools/pcifab-harness/fabric.toml)
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Directory for the sockets (created if missing)
    #[arg(long, value_name = "DIR")]
    run_dir: PathBuf,
    /// QMP socket of HOST's QEMU, for hot-plugging bound functions (repeatable)
    #[arg(long, value_name = "HOST=PATH", value_parser = qmp_arg)]
    qmp: Vec<(String, PathBuf)>,
    /// Firmware dialect, pax or extended (overrides the configuration's `dialect` key)
    #[arg(long, value_name = "D", value_parser = config::Dialect::parse)]
    dialect: Option<config::Dialect>,
    /// Also log debug messages
    #[arg(long)]
    verbose: bool,
}

/// `--qmp HOST=PATH`.
fn qmp_arg(v: &str) -> Result<(String, PathBuf), String> {
    let (h, p) = v
        .split_once('=')
        .filter(|(h, p)| !h.is_empty() && !p.is_empty())
        .ok_or_else(|| format!("'{v}' is not HOST=PATH"))?;
    Ok((h.to_owned(), PathBuf::from(p)))
}

fn main() {
    // Bad usage exits with status 2, --help and --version with 0.
    let args = <Args as clap::Parser>::parse();
    if let Err(e) = run(args) {
        eprintln!("pcifab-emu: error: {e}");
        std::process::exit(1);
    }
}

/// Bind a listening socket, replacing a stale socket file but nothing else.
fn listen(path: &Path) -> Result<UnixListener, String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!(
                "{} exists and is not a socket; move it away",
                path.display()
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    UnixListener::bind(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))
}

/// Raises the soft limit of open files to `need` (at most the hard limit) when it is lower;
/// a fabric of a thousand functions passes the usual 1024.
fn raise_fd_limit(need: u64) -> Result<(), String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system call filling a local struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Ok(());
    }
    if lim.rlim_cur >= need {
        return Ok(());
    }
    if lim.rlim_max < need {
        return Err(format!(
            "the fabric needs about {need} open files (a socket per host and per function) \
             but RLIMIT_NOFILE allows at most {}; raise the hard limit (ulimit -Hn) or use \
             fewer functions",
            lim.rlim_max
        ));
    }
    lim.rlim_cur = need;
    // SAFETY: plain system call with a local struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(format!(
            "cannot raise RLIMIT_NOFILE to {need}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

fn run(args: Args) -> Result<(), String> {
    log::set_verbose(args.verbose);
    let mut config = Config::load(&args.config)?;
    if let Some(d) = args.dialect {
        config.dialect = d;
    }
    info!(
        "dialect {}, DMA MRPC {}",
        config.dialect.name(),
        if config.dma_mrpc { "on" } else { "off" }
    );
    std::fs::create_dir_all(&args.run_dir)
        .map_err(|e| format!("cannot create run dir {}: {e}", args.run_dir.display()))?;

    // Block SIGTERM/SIGINT in every thread; the main thread waits for them.
    let set = signal_set();
    // SAFETY: changes this thread's mask before any other thread exists.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(format!("pthread_sigmask failed: error {rc}"));
    }

    let fabric = Arc::new(Fabric::with(config, args.run_dir.clone(), &args.qmp)?);
    // A listening socket per MEP and per function, a connection on each that is in use,
    // the device memory and the DMA maps QEMU passes: room for all of them.
    raise_fd_limit(
        2 * (fabric.meps.len() + fabric.dmaeps.len() + fabric.functions.len()) as u64 + 256,
    )?;
    fabric.start()?;
    for (i, q) in fabric.qmp.iter().enumerate() {
        if q.is_none() {
            note!(
                "{}: no --qmp given: binds to this host will fail with HOTPLUG_FAILED",
                fabric.meps[i].name
            );
        }
    }
    let mut sockets = Vec::new();
    let mut listeners = Vec::new();
    for m in &fabric.meps {
        let path = args.run_dir.join(format!("mep-{}.sock", m.name));
        listeners.push((listen(&path)?, Arc::clone(m)));
        sockets.push(path);
    }
    let mut dma_listeners = Vec::new();
    for d in &fabric.dmaeps {
        let path = args.run_dir.join(format!("{}.sock", d.name));
        dma_listeners.push((listen(&path)?, Arc::clone(d)));
        sockets.push(path);
    }
    let mut fn_listeners = Vec::new();
    for f in &fabric.functions {
        if fabric.nvme(f.pdfid).is_some() {
            // QEMU's own nvme device: nothing is served here.
            continue;
        }
        let path = fabric.fn_socket(f.pdfid);
        fn_listeners.push((listen(&path)?, Arc::clone(f)));
        sockets.push(path);
    }
    let control_path = args.run_dir.join("control.sock");
    let control = listen(&control_path)?;
    sockets.push(control_path);

    for (listener, m) in listeners {
        std::thread::Builder::new()
            .name(format!("mep-{}", m.name))
            .spawn(move || vfio_user::serve(listener, m))
            .map_err(|e| format!("cannot start thread: {e}"))?;
    }
    for (listener, d) in dma_listeners {
        std::thread::Builder::new()
            .name(d.name.clone())
            .spawn(move || vfio_user::serve(listener, d))
            .map_err(|e| format!("cannot start thread: {e}"))?;
    }
    for (listener, f) in fn_listeners {
        std::thread::Builder::new()
            .name(f.name.clone())
            .spawn(move || vfio_user::serve(listener, f))
            .map_err(|e| format!("cannot start thread: {e}"))?;
    }
    fabric.attach_initial();
    let f = Arc::clone(&fabric);
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || control::serve(control, f))
        .map_err(|e| format!("cannot start thread: {e}"))?;

    for m in &fabric.meps {
        info!(
            "{}: partition {} on {}",
            m.name,
            m.partition,
            args.run_dir.join(format!("mep-{}.sock", m.name)).display()
        );
    }
    eprintln!("pcifab-emu: ready");

    let mut sig: libc::c_int = 0;
    // SAFETY: waits on the signals blocked above.
    let rc = unsafe { libc::sigwait(&set, &mut sig) };
    if rc != 0 {
        return Err(format!("sigwait failed: error {rc}"));
    }
    info!("signal {sig} received, shutting down");
    for path in &sockets {
        if let Err(e) = std::fs::remove_file(path) {
            error!("cannot remove {}: {e}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn parse(a: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("pcifab-emu").chain(a.iter().copied()))
    }

    #[test]
    fn arguments() {
        Args::command().debug_assert();
        let a = parse(&["--config", "f.toml", "--run-dir=/r", "--verbose"]).expect("valid");
        assert_eq!(a.config, PathBuf::from("f.toml"));
        assert_eq!(a.run_dir, PathBuf::from("/r"));
        assert!(a.verbose);
        assert_eq!(
            parse(&["--help"]).unwrap_err().kind(),
            clap::error::ErrorKind::DisplayHelp
        );
        let usage = |a: &[&str], says: &str| {
            let e = parse(a).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{a:?}");
            assert!(e.to_string().contains(says), "{a:?}: {e}");
        };
        usage(&["--config"], "a value is required");
        usage(&["--config", "f"], "--run-dir");
        usage(&["--bogus"], "--bogus");
        usage(
            &["--config", "f", "--run-dir", "r", "--verbose=1"],
            "--verbose",
        );
        let a = parse(&[
            "--config=c",
            "--run-dir=r",
            "--qmp",
            "h0=/q0",
            "--qmp=h1=/q1",
            "--dialect",
            "pax",
        ])
        .expect("--qmp rejected");
        assert_eq!(
            a.qmp,
            [
                ("h0".into(), PathBuf::from("/q0")),
                ("h1".into(), PathBuf::from("/q1"))
            ]
        );
        assert_eq!(a.dialect, Some(config::Dialect::Pax));
        usage(
            &["--config", "c", "--run-dir", "r", "--qmp", "h0"],
            "HOST=PATH",
        );
        usage(
            &["--config", "c", "--run-dir", "r", "--dialect", "gen3"],
            "pax or extended",
        );
    }
}
