// SPDX-License-Identifier: GPL-2.0-only
//! pcifab-harness: boots the emulated fabric (pcifab-emu + one QEMU per host)
//! and runs scenarios in the guests through `pcifab-agent`.
//! See Documentation/testing.rst.

mod bench;
mod bench_dmaep;
mod charts;
mod checks;
mod config;
mod conn;
mod fabric;
mod initramfs;
mod procs;
mod qmp;
mod scale;
mod scenarios;
mod splat;
mod tls;

/// Whether scenario `name` matches the lower-case `--filter` value: it contains one of its
/// '|'-separated alternatives.
fn filter_matches(filter: &str, name: &str) -> bool {
    let name = name.to_lowercase();
    filter
        .split('|')
        .any(|alt| !alt.is_empty() && name.contains(alt))
}

/// The parts of `bench`, in the order they run; `--filter` picks some of them.
const BENCH_PARTS: [&str; 5] = ["mrpc", "compose", "p2p", "manager", "dmaep"];
/// The parts that run on one firmware dialect only.
const BENCH_PART_DIALECT: [(&str, config::Dialect); 1] = [("dmaep", config::Dialect::Pax)];

/// The parts a `bench` run on `dialect` makes with the lower-case `--filter` value, and a
/// note for each part left out because it needs another dialect. A filter that names such
/// a part is an error: nothing would measure it.
fn bench_parts(
    filter: Option<&str>,
    dialect: config::Dialect,
) -> Result<(Vec<&'static str>, Vec<String>), String> {
    let needs = |p: &str| {
        BENCH_PART_DIALECT
            .iter()
            .find(|(q, _)| *q == p)
            .map(|(_, d)| *d)
    };
    let (mut parts, mut notes) = (Vec::new(), Vec::new());
    for p in BENCH_PARTS {
        let named = filter.is_some_and(|f| filter_matches(f, p));
        if filter.is_some() && !named {
            continue;
        }
        match needs(p) {
            Some(d) if d != dialect && named => {
                return Err(format!(
                    "--filter names the {p} part, which runs on the {} dialect only (this run: \
                     {}); run it alone: pcifab-harness bench --dialect {} --filter {p}",
                    d.name(),
                    dialect.name(),
                    d.name()
                ))
            }
            Some(d) if d != dialect => notes.push(format!(
                "# the {p} part is not in this run: it runs on the {} dialect (pcifab-harness \
                 bench --dialect {} --filter {p}; make bench runs it so)",
                d.name(),
                d.name()
            )),
            _ => parts.push(p),
        }
    }
    Ok((parts, notes))
}

/// `--soak`: the trust scenarios at the full counts (`make soak`), not the shorter ones of
/// `make test` (Documentation/testing-trust.rst).
static SOAK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this run is a soak run (`--soak`).
pub(crate) fn soak() -> bool {
    SOAK.load(std::sync::atomic::Ordering::Relaxed)
}

use std::fs::File;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use config::Expected;
use fabric::{CmdLog, Fabric, TempDir};
use procs::Children;

/// The command line (Documentation/testing.rst, "The harness").
#[derive(clap::Parser, Debug)]
#[command(
    name = "pcifab-harness",
    version,
    about = "Boots the emulated fabric under QEMU and runs scenarios in its guests",
    after_help = "Exit status: 0 all passed, 1 a scenario failed, 2 bad command line or inputs."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Boot the fabric, run the scenarios, print `N passed, N failed`
    Test(RunArgs),
    /// Boot the fabric, load pcifab in every host, print `pcifab info`
    Demo(RunArgs),
    /// Boot h0 and h1, measure h0 alone (MRPC echo through pcifab and switchtec,
    /// bind/unbind, P2P), then requests made on h1 to the manager
    Bench(RunArgs),
    /// Fabric scale: per size (--sizes 64,256,1024 functions) a generated 48-partition
    /// config (no --emu-config), h0 and h1 booted; h0's inventory read, one bind event's
    /// MRPC cost, the view's memory, `pcifab list`
    BenchScale(RunArgs),
    /// Print the scenario names and exit
    List(RunArgs),
    /// Boot the fabric and check the harness and agent themselves
    Selftest(RunArgs),
    /// Read DIR/summary.json of several runs, print `<cell>: N passed, N failed` per run
    /// (the cell is `KERNEL x DIALECT`, with the folder's name when two runs share it) and
    /// the overall `N passed, N failed`; exit 1 if any failed
    Summary {
        /// Results folders of runs
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<String>,
    },
}

/// The options of the modes that boot a fabric; which are required depends on the mode.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The guest kernel (bzImage)
    #[arg(long, value_name = "BZIMAGE")]
    kernel: Option<PathBuf>,
    /// pcifab.ko built for --kernel
    #[arg(long, value_name = "PCIFAB_KO")]
    module: Option<PathBuf>,
    /// The in-tree C driver built with the same kernel (the C-peer scenarios and the MRPC
    /// benchmark load it); without it they fail and `bench` measures only pcifab's side
    /// (Debian's kernel has no switchtec.ko)
    #[arg(long, value_name = "SWITCHTEC_KO")]
    switchtec: Option<PathBuf>,
    /// Directory of static guest binaries (pcifab, pcifab-agent, pcifab-selftest); every
    /// file in it goes to the guest's /bin
    #[arg(long, value_name = "DIR")]
    guest_bin: Option<PathBuf>,
    /// The emulator (pcifab-emu)
    #[arg(long, value_name = "EMU_BIN")]
    emu: Option<PathBuf>,
    /// The fabric's configuration (TOML)
    #[arg(long, value_name = "TOML")]
    emu_config: Option<PathBuf>,
    /// The Debian trixie tree of QEMU and the guests' userland (tools/scripts/deps.sh)
    #[arg(long, value_name = "TRIXIE_DIR")]
    qemu_root: Option<PathBuf>,
    /// Where the logs and summary.json go
    #[arg(long, value_name = "DIR")]
    results: Option<PathBuf>,
    /// Boot the first N hosts of the config (default: all)
    #[arg(long, value_name = "N", value_parser = hosts_arg)]
    hosts: Option<usize>,
    /// Run only scenarios whose name contains S (case-insensitive); S may list
    /// alternatives separated by '|'. With bench: only the parts it names (mrpc,
    /// compose, p2p, manager; dmaep, on the pax dialect only)
    #[arg(long, value_name = "S")]
    filter: Option<String>,
    /// Leave out the scenarios whose name contains S (as --filter; both may be given: the
    /// scenarios --filter picks, less those --exclude names)
    #[arg(long, value_name = "S")]
    exclude: Option<String>,
    /// Run every scenario even after a failure (default: stop)
    #[arg(long)]
    keep_going: bool,
    /// The kernel is the sanitizer (debug) kernel: require its checks (KASAN, lockdep,
    /// kmemleak, ...) in every guest, give the guests 1 GiB and the kernel parameters
    /// those checks need
    #[arg(long)]
    debug_kernel: bool,
    /// The trust scenarios at the full counts (`make soak`), not the shorter ones of
    /// `make test` (Documentation/testing-trust.rst)
    #[arg(long)]
    soak: bool,
    /// Static busybox for the guest
    #[arg(long, value_name = "PATH", default_value = "/bin/busybox")]
    busybox: PathBuf,
    /// Development aid: no emulator, a pci-testdev stands in for the MEP
    #[arg(long)]
    no_emu: bool,
    /// The emulator's firmware dialect for the whole run (default: the config's `dialect`
    /// key, else extended); written to RESULTS/summary.json
    #[arg(long, value_name = "pax|extended", value_parser = config::Dialect::parse)]
    dialect: Option<config::Dialect>,
    /// Static switchtec-user CLI (tools/scripts/switchtec-user.sh builds it); it goes to
    /// the guest's /bin/switchtec for the `pax client` scenarios
    #[arg(long, value_name = "PATH")]
    switchtec_user: Option<PathBuf>,
    /// The kernel's module tree (/lib/modules/RELEASE): virtio_net.ko (the management
    /// network), vfio-pci.ko and, with an nvme drive, nvme.ko, with their dependencies, are
    /// loaded from there at boot (Debian's kernel has them as modules; the test kernels
    /// built in)
    #[arg(long, value_name = "DIR")]
    kernel_modules: Option<PathBuf>,
    /// bench-scale: the function counts, e.g. 64,256,1024
    #[arg(long, value_name = "N,N,...")]
    sizes: Option<String>,
    /// Virtual CPUs per guest (1 to 8); with N > 1 QEMU runs multi-threaded TCG (`-accel
    /// tcg,thread=multi`), so guest CPUs really run at once, and set-up checks that every
    /// guest sees N CPUs online
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = smp_arg)]
    smp: u32,
    /// The kernel's name in this run's cell, written to RESULTS/summary.json (default:
    /// `debug` with --debug-kernel, else the kernel file's name)
    #[arg(long, value_name = "NAME")]
    cell: Option<String>,
    /// Debian's Slurm and MUNGE for the guests (tools/scripts/slurm.sh makes it); added to
    /// the guests only when a `slurm:` scenario is selected
    #[arg(long, value_name = "DIR")]
    slurm: Option<PathBuf>,
    /// Microchip's fabric-mode DMA modules as a guest tree (tools/scripts/switchtec-dma.sh
    /// makes it); added to the guests only when the `fabric dma:` scenario is selected
    #[arg(long, value_name = "DIR")]
    switchtec_dma: Option<PathBuf>,
    /// etcd's server binary (tools/scripts/etcd.sh prints it); it goes to the guests'
    /// /usr/bin/etcd, with the libraries it links to, only when the manager's
    /// high-availability scenario is selected
    #[arg(long, value_name = "PATH")]
    etcd: Option<PathBuf>,
}

/// `--hosts N`: at least one.
fn hosts_arg(v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| "expected a number >= 1".into())
}

/// `--smp N`: 1 to 8.
fn smp_arg(v: &str) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|n| (1..=8).contains(n))
        .ok_or_else(|| "expected a number from 1 to 8".into())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Test,
    Demo,
    Bench,
    BenchScale,
    List,
    Selftest,
}

#[derive(Debug)]
pub struct Opts {
    pub mode: Mode,
    pub kernel: PathBuf,
    pub module: PathBuf,
    pub switchtec: Option<PathBuf>,
    pub guest_bin: PathBuf,
    pub emu: PathBuf,
    pub emu_config: PathBuf,
    pub qemu_root: PathBuf,
    pub results: PathBuf,
    pub busybox: PathBuf,
    pub hosts: Option<usize>,
    pub filter: Option<String>,
    /// `--exclude`: scenarios whose name matches are left out.
    pub exclude: Option<String>,
    pub keep_going: bool,
    pub no_emu: bool,
    pub debug_kernel: bool,
    /// `--dialect`: overrides the config's `dialect` key.
    pub dialect: Option<config::Dialect>,
    /// `--switchtec-user`: the static switchtec-user CLI for the guests.
    pub switchtec_user: Option<PathBuf>,
    /// `--kernel-modules DIR`: the kernel's module tree, for the modules the fabric's
    /// devices need (virtio_net and vfio_pci always, nvme for a drive) when the kernel has them as
    /// modules.
    pub kernel_modules: Option<PathBuf>,
    /// `--sizes N,N,...`: the function counts of `bench-scale`.
    pub sizes: Option<String>,
    /// `--smp N`: virtual CPUs per guest (multi-threaded TCG when more than one).
    pub smp: u32,
    /// `--cell NAME`: the kernel's name in the cell line of `summary`.
    pub cell: Option<String>,
    /// `--slurm DIR`: the guests' Slurm tree (`tools/scripts/slurm.sh`).
    pub slurm: Option<PathBuf>,
    /// `--switchtec-dma DIR`: Microchip's fabric-mode DMA modules as a guest tree
    /// (`tools/scripts/switchtec-dma.sh`).
    pub switchtec_dma: Option<PathBuf>,
    /// `--etcd PATH`: etcd's server binary for the guests (the manager's HA scenario).
    pub etcd: Option<PathBuf>,
}

/// The command line: `Ok(Err(summary folders))` for `summary`; `Err` is clap's error (exit
/// status 2 for bad usage, 0 for --help and --version).
fn parse_cli(
    args: impl IntoIterator<Item = String>,
) -> Result<Result<Opts, Vec<String>>, clap::Error> {
    use clap::{error::ErrorKind, CommandFactory, Parser};
    let cli = Cli::try_parse_from(std::iter::once("pcifab-harness".to_string()).chain(args))?;
    let (mode, r) = match cli.cmd {
        Cmd::Test(r) => (Mode::Test, r),
        Cmd::Demo(r) => (Mode::Demo, r),
        Cmd::Bench(r) => (Mode::Bench, r),
        Cmd::BenchScale(r) => (Mode::BenchScale, r),
        Cmd::List(r) => (Mode::List, r),
        Cmd::Selftest(r) => (Mode::Selftest, r),
        Cmd::Summary { dirs } => return Ok(Err(dirs)),
    };
    opts(mode, r)
        .map(Ok)
        .map_err(|e| Cli::command().error(ErrorKind::MissingRequiredArgument, e))
}

/// The options of `mode`, with the paths that mode needs present.
fn opts(mode: Mode, r: RunArgs) -> Result<Opts, String> {
    if r.soak {
        SOAK.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let no_emu = r.no_emu;
    let path = |v: Option<PathBuf>, k: &str| -> Result<PathBuf, String> {
        match v {
            Some(v) => Ok(v),
            None if mode == Mode::List => Ok(PathBuf::new()),
            None if no_emu && (k == "emu" || k == "emu-config") => Ok(PathBuf::new()),
            // bench-scale generates its configuration per size.
            None if mode == Mode::BenchScale && k == "emu-config" => Ok(PathBuf::new()),
            None => Err(format!("--{k} is required for {}", mode_name(mode))),
        }
    };
    Ok(Opts {
        mode,
        kernel: path(r.kernel, "kernel")?,
        module: path(r.module, "module")?,
        switchtec: r.switchtec,
        guest_bin: path(r.guest_bin, "guest-bin")?,
        emu: path(r.emu, "emu")?,
        emu_config: path(r.emu_config, "emu-config")?,
        qemu_root: path(r.qemu_root, "qemu-root")?,
        results: path(r.results, "results")?,
        busybox: r.busybox,
        // The benchmark boots h0 and h1; h1 is stopped while h0 is measured alone and
        // started again for the manager requests it makes.
        hosts: if mode == Mode::Bench {
            Some(2)
        } else {
            r.hosts
        },
        filter: r.filter,
        exclude: r.exclude,
        keep_going: r.keep_going,
        no_emu,
        debug_kernel: r.debug_kernel,
        dialect: r.dialect,
        switchtec_user: r.switchtec_user,
        kernel_modules: r.kernel_modules,
        sizes: r.sizes,
        smp: r.smp,
        cell: r.cell,
        slurm: r.slurm,
        switchtec_dma: r.switchtec_dma,
        etcd: r.etcd,
    })
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Test => "test",
        Mode::Demo => "demo",
        Mode::Bench => "bench",
        Mode::BenchScale => "bench-scale",
        Mode::List => "list",
        Mode::Selftest => "selftest",
    }
}

#[cfg(test)]
fn parse_args(args: &[String]) -> Result<Opts, String> {
    match parse_cli(args.iter().cloned()) {
        Ok(Ok(o)) => Ok(o),
        Ok(Err(_)) => Err("summary".into()),
        Err(e) => Err(e.to_string()),
    }
}

static HARNESS_LOG: OnceLock<Mutex<File>> = OnceLock::new();

/// The MRPC table's lines (`bench::mrpc`; Documentation/benchmarks.rst).
fn say_mrpc(points: &[bench::Point], paths: &bench::Paths) -> Result<(), String> {
    say(&format!(
        "# MRPC echo, one guest (TCG): per completion delay, {} alternations of pcifab's ioctl \
         then switchtec.ko's /dev/switchtec0, {} round trips per point and alternation after a \
         warm-up ({} per point and driver); the emulated firmware completes each command \
         <delay> us after the command-register write; [95 % intervals over the alternations]; \
         mmio: the host's BAR reads + writes per round trip, counted by the emulator",
        bench::ALTERNATIONS,
        bench::POINT_COUNT,
        bench::ALTERNATIONS as u64 * bench::POINT_COUNT
    ));
    say(&format!(
        "# completion path: pcifab {}; switchtec {}",
        paths.pcifab, paths.switchtec
    ));
    say("# delay_us  bytes  callers | pcifab rate/s  p50_us  p99_us | switchtec rate/s  p50_us  p99_us | rate_ratio [95 %]  p99_ratio [95 %] | mmio pcifab  switchtec | verdict");
    let ci = |(lo, hi): (f64, f64)| format!("[{lo:.3}-{hi:.3}]");
    let mut met = 0;
    for p in points {
        let verdict = if p.meets_goal() { "ok" } else { "MISSED" };
        if p.meets_goal() {
            met += 1;
        }
        say(&format!(
            "bench mrpc {:>5} {:>6} {:>3} | {:>9.1} {:>7.0} {:>7.0} | {:>9.1} {:>7.0} {:>7.0} | {:>6.3} {} {:>6.3} {} | {:>6.2} {:>6.2} | {verdict}",
            p.delay_us,
            p.size,
            p.callers,
            p.pcifab.rate(),
            p.pcifab.p50_us(),
            p.pcifab.p99_us(),
            p.switchtec.rate(),
            p.switchtec.p50_us(),
            p.switchtec.p99_us(),
            p.rate_ratio(),
            ci(p.rate_ratio_ci()),
            p.p99_ratio(),
            ci(p.p99_ratio_ci()),
            p.pcifab.mmio_per_echo(),
            p.switchtec.mmio_per_echo(),
        ));
    }
    say(&format!(
        "bench mrpc_points_meeting_goal {met} of {}",
        points.len()
    ));
    say("# MMIO per MRPC command: the host's reads + writes of the MEP's BARs per echo round trip (reads, writes), 1 caller; commands: MRPC commands the emulator picked up per round trip");
    let mut mmio_met = 0;
    for p in points {
        let v = if p.mmio_meets_goal() { "ok" } else { "MISSED" };
        if p.mmio_meets_goal() {
            mmio_met += 1;
        }
        if p.callers != 1 {
            continue;
        }
        let side = |s: &bench::Side| {
            format!(
                "{:>6.2} ({:.2} reads, {:.2} writes; commands {:.3})",
                s.mmio_per_echo(),
                s.reads_per_echo(),
                s.writes_per_echo(),
                s.commands_per_echo()
            )
        };
        say(&format!(
            "bench mrpc_mmio_per_command {:>5} {:>6} | pcifab {} | switchtec {} | {v}",
            p.delay_us,
            p.size,
            side(&p.pcifab),
            side(&p.switchtec)
        ));
    }
    say(&format!(
        "bench mrpc_mmio_points_meeting_goal {mmio_met} of {}",
        points.len()
    ));
    let head = points
        .iter()
        .find(|p| p.delay_us == 20 && p.size == 64 && p.callers == 1)
        .ok_or("MRPC bench: no 20 us, 64 B, 1 caller point")?;
    let (rl, rh) = head.rate_ratio_ci();
    let (pl, ph) = head.p99_ratio_ci();
    say(&format!(
        "bench mrpc_echo_ratio_vs_switchtec_irq {:.3}",
        head.rate_ratio()
    ));
    say(&format!(
        "bench mrpc_echo_ratio_vs_switchtec_irq_ci95_low {rl:.3}"
    ));
    say(&format!(
        "bench mrpc_echo_ratio_vs_switchtec_irq_ci95_high {rh:.3}"
    ));
    say(&format!(
        "bench mrpc_echo_p99_ratio_vs_switchtec_irq {:.3}",
        head.p99_ratio()
    ));
    say(&format!(
        "bench mrpc_echo_p99_ratio_vs_switchtec_irq_ci95_low {pl:.3}"
    ));
    say(&format!(
        "bench mrpc_echo_p99_ratio_vs_switchtec_irq_ci95_high {ph:.3}"
    ));
    for size in bench::SIZES {
        let p = points
            .iter()
            .find(|p| p.delay_us == 20 && p.size == size && p.callers == 1)
            .ok_or_else(|| format!("MRPC bench: no 20 us, {size} B, 1 caller point"))?;
        say(&format!(
            "bench mrpc_mmio_per_command_{size}_pcifab {:.2}",
            p.pcifab.mmio_per_echo()
        ));
        say(&format!(
            "bench mrpc_mmio_per_command_{size}_switchtec {:.2}",
            p.switchtec.mmio_per_echo()
        ));
    }
    Ok(())
}

/// Prints a line and copies it to RESULTS/harness.log.
pub(crate) fn say(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
    if let Some(f) = HARNESS_LOG.get() {
        if let Ok(mut f) = f.lock() {
            let _ = writeln!(f, "{line}");
        }
    }
}

fn check_file(p: &Path, flag: &str, hint: &str) -> Result<(), String> {
    if p.is_file() {
        Ok(())
    } else {
        Err(format!("{flag} {}: no such file; {hint}", p.display()))
    }
}

fn check_inputs(o: &Opts) -> Result<(), String> {
    check_file(
        &o.kernel,
        "--kernel",
        "build it with tools/scripts/kernel.sh",
    )?;
    check_file(
        &o.module,
        "--module",
        "build it with `make` in the project root",
    )?;
    if let Some(sw) = &o.switchtec {
        check_file(
            sw,
            "--switchtec",
            "it is drivers/pci/switch/switchtec.ko of the kernel build (PCI_SW_SWITCHTEC=m)",
        )?;
    }
    let hint =
        "build the guest tools with `cargo build --release --target x86_64-unknown-linux-musl`";
    check_file(&o.guest_bin.join("pcifab"), "--guest-bin", hint)?;
    check_file(&o.guest_bin.join("pcifab-agent"), "--guest-bin", hint)?;
    check_file(
        &o.guest_bin.join("pcifab-selftest"),
        "--guest-bin",
        "build it with the agent (`make tools` copies it there)",
    )?;
    check_file(&o.busybox, "--busybox", "install Debian's busybox-static")?;
    if let Some(p) = &o.switchtec_user {
        check_file(
            p,
            "--switchtec-user",
            "build it with tools/scripts/switchtec-user.sh",
        )?;
    }
    if !o.no_emu {
        check_file(
            &o.emu,
            "--emu",
            "build it with `cargo build --release -p pcifab-emu`",
        )?;
        check_file(
            &o.emu_config,
            "--emu-config",
            "see tools/pcifab-emu/fabric.toml",
        )?;
    }
    if !o.qemu_root.is_dir() {
        return Err(format!(
            "--qemu-root {}: no such directory; run tools/scripts/deps.sh",
            o.qemu_root.display()
        ));
    }
    Ok(())
}

/// Everything that happens between argument parsing and the summary.
struct Run {
    opts: Opts,
    expected: Expected,
    log: Arc<CmdLog>,
    passed: usize,
    failed: usize,
    /// (scenario name, passed) of every scenario that ran, for summary.json.
    outcomes: Vec<(String, bool)>,
}

impl Run {
    fn setup(&mut self, children: &mut Children, run_dir: &Path) -> Result<Fabric, String> {
        let o = &self.opts;
        // The management network needs virtio_net, a drive in the fabric the nvme driver,
        // the ACS scenario vfio-pci; a kernel that has them as modules gets them (and what they depend on) loaded at
        // boot.
        let drives = self.expected.endpoints.iter().any(|e| e.kind == "nvme");
        let extra_modules = match &o.kernel_modules {
            Some(dir) => {
                // vfio_pci: the ACS scenario passes a function through with it.
                let mut names = vec!["virtio_net", "vfio_pci"];
                if drives {
                    names.push("nvme");
                }
                initramfs::modules_from_tree(dir, &names)?
            }
            None => Vec::new(),
        };
        // Slurm goes into the guests only for a run that selects a `slurm:` scenario.
        let slurm = if self.selected().iter().any(|n| n.starts_with("slurm:")) {
            o.slurm.as_deref()
        } else {
            None
        };
        // Microchip's DMA modules likewise, for the fabric dma scenario.
        let fabric_dma = if self.selected().contains(&scenarios::FABRIC_DMA_SCENARIO) {
            o.switchtec_dma.as_deref()
        } else {
            None
        };
        // etcd (and the libraries it links to) for the manager's high-availability scenario.
        let etcd = if self.selected().contains(&scenarios::manager::HA_SCENARIO) {
            o.etcd.as_deref()
        } else {
            None
        };
        if slurm.is_some() && fabric_dma.is_some() {
            return Err(
                "select the slurm: scenarios and the fabric dma one in separate runs (each \
                 adds a tree of its own to the guests)"
                    .into(),
            );
        }
        let initrd = initramfs::build(
            &initramfs::Inputs {
                busybox: &o.busybox,
                guest_bin: &o.guest_bin,
                pcifab_ko: &o.module,
                switchtec_ko: o.switchtec.as_deref(),
                switchtec_user: o.switchtec_user.as_deref(),
                extra_modules,
                overlay: slurm.or(fabric_dma),
                etcd,
            },
            &o.results.join("initramfs.cpio"),
        )?;
        let n = o.hosts.unwrap_or(self.expected.hosts.len());
        if n > self.expected.hosts.len() {
            return Err(format!(
                "--hosts {n}: the config {} has only {} [[hosts]]",
                o.emu_config.display(),
                self.expected.hosts.len()
            ));
        }
        let names = &self.expected.hosts[..n];
        let mut emu_pid = None;
        if !o.no_emu {
            let t = Instant::now();
            emu_pid = Some(fabric::start_emulator(o, children, run_dir, names)?);
            self.log.write(&format!(
                "emulator ready in {:.2} s",
                t.elapsed().as_secs_f64()
            ));
            match fabric::emu_control(run_dir, "ping") {
                Ok(r) => self.log.write(&format!("control ping -> {r}")),
                Err(e) => say(&format!("# warning: emulator control socket: {e}")),
            }
            for name in names {
                let sock = run_dir.join(format!("mep-{name}.sock"));
                if !sock.exists() {
                    return Err(format!(
                        "the emulator is ready but {} does not exist; host names in {} must \
                         match what the emulator serves",
                        sock.display(),
                        o.emu_config.display()
                    ));
                }
            }
        }
        let mut hosts = fabric::boot_hosts(o, children, run_dir, &initrd, names, &self.log)?;
        for h in &hosts {
            say(&format!("{}: kernel {}", h.name, h.kernel_release));
            say(&format!(
                "{}: agent ready in {:.1} s",
                h.name,
                h.boot_time.as_secs_f64()
            ));
        }
        if o.switchtec.is_none() {
            say("# no --switchtec: the scenarios that load switchtec.ko fail");
        }
        if o.smp > 1 {
            let mut errors = Vec::new();
            for h in &mut hosts {
                match checks::guest::online_cpus(h) {
                    Ok(n) if n == o.smp => match vcpu_threads(h) {
                        Ok(t) if t == n as usize => say(&format!(
                            "{}: {n} CPUs online, each in its own QEMU thread (multi-threaded TCG)",
                            h.name
                        )),
                        Ok(t) => errors.push(format!(
                            "{}: --smp {n}: QEMU runs the {n} CPUs in {t} thread(s), not \
                             multi-threaded TCG",
                            h.name
                        )),
                        Err(e) => errors.push(e),
                    },
                    Ok(n) => errors.push(format!(
                        "{}: --smp {}: the guest has {n} CPU(s) online",
                        h.name, o.smp
                    )),
                    Err(e) => errors.push(e),
                }
            }
            if !errors.is_empty() {
                return Err(errors.join("\n"));
            }
        }
        if o.debug_kernel {
            let mut errors = Vec::new();
            for h in &mut hosts {
                match checks::debug_kernel_checks(h) {
                    Ok(how) => say(&format!("{}: debug kernel checks present ({how})", h.name)),
                    Err(e) => errors.push(e),
                }
            }
            if !errors.is_empty() {
                return Err(format!(
                    "--debug-kernel was given, but the guests do not run the debug kernel:\n{}",
                    errors.join("\n")
                ));
            }
        }
        let mut fabric = Fabric::new(
            hosts,
            self.expected.clone(),
            run_dir.to_path_buf(),
            o.results.clone(),
            o.debug_kernel,
            !o.no_emu,
        );
        fabric.guest_bin = o.guest_bin.clone();
        fabric.emu_pid = emu_pid;
        fabric.slurm = slurm.is_some();
        fabric.etcd = etcd.is_some();
        Ok(fabric)
    }

    /// The names of the scenarios `--filter` and `--exclude` select (test mode).
    fn selected(&self) -> Vec<&'static str> {
        let filter = self.opts.filter.as_deref().map(str::to_lowercase);
        let exclude = self.opts.exclude.as_deref().map(str::to_lowercase);
        scenarios::all()
            .into_iter()
            .map(|s| s.name)
            .filter(|n| filter.as_deref().is_none_or(|f| filter_matches(f, n)))
            .filter(|n| exclude.as_deref().is_none_or(|x| !filter_matches(x, n)))
            .collect()
    }

    fn scenarios(&mut self, fabric: &mut Fabric) {
        let filter = self.opts.filter.as_deref().map(str::to_lowercase);
        let all = if self.opts.mode == Mode::Selftest {
            scenarios::selftest()
        } else {
            scenarios::all()
        };
        // The nvme scenarios need a drive in the fabric (fabric-nvme.toml); on a fabric
        // without one they are not part of the run, and the run says so.
        let drives = self.expected.endpoints.iter().any(|e| e.kind == "nvme");
        // The p2pdma scenarios need two drives, one with a CMB (fabric-p2pdma.toml).
        let cmb = self
            .expected
            .endpoints
            .iter()
            .any(|e| e.kind == "nvme" && e.cmb_mib > 0);
        let (all, absent): (Vec<_>, Vec<_>) = all.into_iter().partition(|s| {
            (drives || !s.name.starts_with("nvme:")) && (cmb || !s.name.starts_with("p2pdma:"))
        });
        if !absent.is_empty() && self.opts.mode != Mode::Selftest {
            say(&format!(
                "# {} nvme or p2pdma scenarios are not in this run: the fabric configuration \
                 declares no endpoint of kind \"nvme\" (or none with cmb_mib) (they run on \
                 tools/pcifab-harness/fabric-nvme.toml, fabric-p2pdma.toml)",
                absent.len()
            ));
        }
        let exclude = self.opts.exclude.as_deref().map(str::to_lowercase);
        let list: Vec<_> = all
            .into_iter()
            .filter(|s| filter.as_deref().is_none_or(|f| filter_matches(f, s.name)))
            .filter(|s| {
                exclude
                    .as_deref()
                    .is_none_or(|x| !filter_matches(x, s.name))
            })
            .collect();
        // The plan counts the log check at the end of the run as one more test.
        say(&format!("1..{}", list.len() + 1));
        let mut stop: Option<&str> = None;
        for (i, s) in list.iter().enumerate() {
            let n = i + 1;
            if procs::interrupted() {
                stop = Some("interrupted");
            }
            if let Some(why) = stop {
                say(&format!("ok {n} - {} # SKIP not run: {why}", s.name));
                continue;
            }
            self.log.write(&format!("=== scenario {n}: {}", s.name));
            let t = Instant::now();
            let cpu0 = guests_cpu(fabric);
            fabric.begin_scenario();
            fabric.set_deadline(Some(t + s.timeout));
            let r = catch_unwind(AssertUnwindSafe(|| (s.run)(fabric)))
                .unwrap_or_else(|_| Err("scenario panicked (harness bug)".into()));
            fabric.set_deadline(None);
            // Kernel splats and emulator errors that appeared during the scenario fail it.
            let logs = if procs::interrupted() {
                Ok(())
            } else {
                fabric.check_logs(&format!("scenario {n} ({})", s.name), false)
            };
            let r = match (r, logs) {
                (Ok(()), logs) => logs,
                (Err(e), Ok(())) => Err(e),
                (Err(e), Err(l)) => Err(format!("{e}\n{l}")),
            };
            if r.is_err() && fabric.emu_log.is_some() {
                // A scenario that failed half-way may leave a fault injected: the
                // scenarios after it start from a healthy firmware all the same.
                if let Err(e) = fabric.emu().request("fault clear all") {
                    self.log
                        .write(&format!("after the failure: `fault clear all`: {e}"));
                }
            }
            let skip = fabric.take_skip();
            let secs = t.elapsed().as_secs_f64();
            // A scenario that could only see a refusal says so in its name.
            let shown = match fabric.take_refusal_only() {
                Some(what) => format!("{} -- refusal only: {what}", s.name),
                None => s.name.to_string(),
            };
            if skip.is_none() || r.is_err() {
                self.outcomes.push((shown.clone(), r.is_ok()));
            }
            if !self.report(n, &shown, r, skip.as_deref()) && !self.opts.keep_going {
                stop = Some("an earlier scenario failed (use --keep-going)");
            }
            // The guests' QEMU processes' CPU time over the scenario (a host rebooted in
            // it counts from its new QEMU's start), for the cost tables of testing.rst.
            let cpu1 = guests_cpu(fabric);
            let cpu: f64 = cpu1
                .iter()
                .map(|(pid, c)| c - cpu0.iter().find(|(p, _)| p == pid).map_or(0.0, |x| x.1))
                .sum();
            say(&format!(
                "# {}: {secs:.1} s, guests' CPU {cpu:.1} s",
                s.name
            ));
            self.log
                .write(&format!("=== scenario {n} done in {secs:.1} s"));
        }
        // What the guests and the emulator wrote after the last scenario's check, up to now.
        let n = list.len() + 1;
        let name = "end of run: no kernel splat or emulator error after the last scenario";
        if procs::interrupted() {
            say(&format!("ok {n} - {name} # SKIP not run: interrupted"));
        } else {
            let r = fabric.check_logs("the end of the run", true);
            self.outcomes.push((name.to_string(), r.is_ok()));
            self.report(n, name, r, None);
        }
    }

    /// The kernel's name in this run's cell: `--cell`, else `debug` for the sanitizer
    /// kernel, else the kernel file's name.
    fn cell_kernel(&self) -> String {
        if let Some(c) = &self.opts.cell {
            return c.clone();
        }
        if self.opts.debug_kernel {
            return "debug".into();
        }
        folder_name(&self.opts.kernel)
    }

    /// RESULTS/summary.json: the dialect, the kernel, the counts and every scenario.
    fn write_summary(&self) -> Result<(), String> {
        let dialect = self.expected.dialect.name();
        let v = serde_json::json!({
            "dialect": dialect,
            "cell": self.cell_kernel(),
            "smp": self.opts.smp,
            "kernel": self.opts.kernel.display().to_string(),
            "passed": self.passed,
            "failed": self.failed,
            "scenarios": self
                .outcomes
                .iter()
                .map(|(name, passed)| serde_json::json!({
                    "name": name,
                    "dialect": dialect,
                    "passed": passed,
                }))
                .collect::<Vec<_>>(),
        });
        let path = self.opts.results.join("summary.json");
        std::fs::write(&path, format!("{v:#}\n"))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Prints the KTAP line of test `n` and counts it; returns false for a failure.
    fn report(&mut self, n: usize, name: &str, r: Result<(), String>, skip: Option<&str>) -> bool {
        match r {
            Ok(()) => {
                if let Some(why) = skip {
                    say(&format!("ok {n} - {name} # SKIP {why}"));
                } else {
                    self.passed += 1;
                    say(&format!("ok {n} - {name}"));
                }
                true
            }
            Err(e) => {
                self.failed += 1;
                // Keep the KTAP line one line; details follow as comments.
                let mut lines = e.lines();
                say(&format!(
                    "not ok {n} - {name}: {}",
                    lines.next().unwrap_or("")
                ));
                for l in lines {
                    say(&format!("#   {l}"));
                }
                false
            }
        }
    }

    fn bench(&mut self, fabric: &mut Fabric) -> Result<(), String> {
        let filter = self.opts.filter.as_deref().map(str::to_lowercase);
        let (parts, notes) = bench_parts(filter.as_deref(), fabric.expected.dialect)?;
        for n in &notes {
            say(n);
        }
        // h0's MRPC and bind figures are taken alone: h1's QEMU would take CPU time from it
        // under TCG. (The dmaep part, the last, uses both hosts.)
        if parts.iter().any(|p| *p != "dmaep") {
            if let Some(h1) = fabric.hosts.get_mut(1) {
                h1.kill_qemu()?;
            }
        }
        // A chart that cannot be written fails the run at its end, after every figure.
        let mut chart_errors = Vec::new();
        let want = |part: &str| parts.contains(&part);
        if want("mrpc") {
            fabric.set_deadline(Some(Instant::now() + std::time::Duration::from_secs(3600)));
            let r = bench::mrpc(fabric);
            fabric.set_deadline(None);
            let (points, paths) = r?;
            say_mrpc(&points, &paths)?;
            self.chart(
                "bench-mrpc-echo.svg",
                "MRPC echo rate against payload size: pcifab vs switchtec.ko (TCG, one guest)",
                &bench::mrpc_panels(&points),
                &mut chart_errors,
            );
        }
        if want("compose") {
            fabric.set_deadline(Some(Instant::now() + std::time::Duration::from_secs(600)));
            let r = bench::compose(fabric);
            fabric.set_deadline(None);
            let c = r?;
            let m = bench::median;
            let fmt = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            say(&format!(
                "# {} binds and unbinds of 0x0300 on logical port 1, through pcifab and raw (ms, \
                 median of: pcifab bind {}; of it the bind ioctl {}, {} ms after pcifab's \
                 power-off of the slot; sysfs bind {}; raw device_add {}; pcifab unbind {}; of \
                 it the unbind ioctl {}; raw sysfs power-off + device_del {})",
                bench::COMPOSE_N,
                fmt(&c.bind_ms),
                fmt(&c.bind_cmd_ms),
                fmt(&c.since_poweroff_ms),
                fmt(&c.bind_sysfs_ms),
                fmt(&c.raw_add_ms),
                fmt(&c.unbind_ms),
                fmt(&c.unbind_cmd_ms),
                fmt(&c.raw_del_ms)
            ));
            say(&format!(
                "bench bind_latency_ms_pcifab {:.0}",
                m(&c.bind_ms)
            ));
            say(&format!(
                "bench bind_latency_ms_raw_hotplug {:.0}",
                m(&c.raw_add_ms)
            ));
            say(&format!(
                "bench unbind_latency_ms_pcifab {:.0}",
                m(&c.unbind_ms)
            ));
            say(&format!(
                "bench unbind_latency_ms_raw_poweroff {:.0}",
                m(&c.raw_del_ms)
            ));
            say(&format!(
                "bench bind_latency_ratio_vs_raw_hotplug {:.3}",
                m(&c.bind_ms) / m(&c.raw_add_ms)
            ));
            say(&format!(
                "bench unbind_latency_ratio_vs_raw_poweroff {:.3}",
                m(&c.unbind_ms) / m(&c.raw_del_ms)
            ));
            // The floor: what pcifab adds to QEMU's and pciehp's own hot-plug (host clock on
            // both sides).
            say(&format!(
                "bench bind_overhead_ms_pcifab_vs_raw_hotplug {:.0}",
                m(&c.bind_ms) - m(&c.raw_add_ms)
            ));
            say(&format!(
                "bench unbind_overhead_ms_pcifab_vs_raw_poweroff {:.0}",
                m(&c.unbind_ms) - m(&c.raw_del_ms)
            ));
            // The driver's share alone: the same bind without starting the CLI.
            say(&format!(
                "bench bind_sysfs_latency_ms_pcifab {:.0}",
                m(&c.bind_sysfs_ms)
            ));
            say(&format!(
                "bench bind_sysfs_latency_ratio_vs_raw_hotplug {:.3}",
                m(&c.bind_sysfs_ms) / m(&c.raw_add_ms)
            ));
            // What starting a request in a guest costs the pcifab side (the raw side's
            // request comes from the host, its reader's dispatch overlaps pciehp's waits).
            say(&format!(
                "# the test world's share (ms, median of {}): the agent's round trip to a guest \
                 shell running one built-in {:.1}; the same running pcifab --version {:.1}",
                bench::COMPOSE_N,
                m(&c.agent_rt_ms),
                m(&c.cli_rt_ms)
            ));
            fabric.set_deadline(Some(Instant::now() + std::time::Duration::from_secs(900)));
            let r = bench::peer(fabric);
            fabric.set_deadline(None);
            let rounds = r?;
            Self::say_peer(&rounds);
            self.chart(
                "bench-bind-unbind.svg",
                "Bind and unbind of 0x0300: pcifab vs switchtec.ko + switchtec-user, per alternation (TCG, guest clock)",
                &bench::peer_panels(&rounds),
                &mut chart_errors,
            );
        }
        if want("p2p") {
            // The P2P set-up unbinds every host's functions first: h1 runs again (idle) from here.
            if fabric.hosts.len() > 1 {
                scenarios::manager::start_again(fabric, 1)?;
            }
            fabric.set_deadline(Some(Instant::now() + std::time::Duration::from_secs(900)));
            let r = scenarios::p2p::bench_p2p(fabric);
            fabric.set_deadline(None);
            let p2p = r?;
            say("# P2P copy 0x0300:0 -> 0x0400:0 in one guest, best of 3 (MiB/s): the DMA engine");
            say("# through the fabric vs a CPU bounce (read BAR2 of one, write BAR2 of the other)");
            say(&format!(
                "# memcpy: the emulator's own copy of the same bytes from 0x0300's memory to \
                 0x0400's, best of {}; efficiency = fabric / memcpy",
                scenarios::p2p::MEMCPY_REPS
            ));
            say("#      bytes     fabric     bounce    ratio     memcpy  efficiency");
            for r in &p2p.rows {
                say(&format!(
                    "# {:>10} {:>10.1} {:>10.1} {:>8.2} {:>10.1} {:>11.4}",
                    r.bytes,
                    r.fabric,
                    r.bounce,
                    r.ratio,
                    r.memcpy,
                    r.efficiency()
                ));
            }
            let at16 = p2p
                .rows
                .iter()
                .find(|r| r.bytes == 16 << 20)
                .ok_or("p2p bench: no 16 MiB row")?;
            say(&format!(
                "bench p2p_throughput_ratio_vs_bounce {:.3}",
                at16.ratio
            ));
            say(&format!(
                "bench p2p_efficiency_vs_memcpy {:.3}",
                at16.efficiency()
            ));
            let l = &p2p.lat;
            let (lo, hi) = bench::ratio_t_interval(&l.round_ratios());
            let kib = scenarios::p2p::LAT_BYTES / 1024;
            say(&format!(
                "# {kib} KiB latency in {}, guest clock, {} rounds of {} each, copy by copy \
                 alternating: fabric copy 0x0300:0 -> 0x0400:0 (one ioctl) p50 per round {:?} us, \
                 p99 of all {:.1} us; CPU bounce (read BAR2 of 0x0300, write BAR2 of 0x0400) p50 \
                 per round {:?} us",
                fabric.hosts[0].name,
                l.rounds.len(),
                l.count,
                l.rounds,
                l.p99_us,
                l.bounce_rounds
            ));
            say(&format!("bench p2p_4k_latency_us {:.2}", l.p50_us));
            say(&format!(
                "bench p2p_4k_bounce_latency_us {:.2}",
                l.bounce_p50_us
            ));
            say(&format!(
                "bench p2p_4k_latency_ratio_vs_bounce {:.3}",
                l.p50_us / l.bounce_p50_us
            ));
            say(&format!(
                "bench p2p_4k_latency_ratio_vs_bounce_ci95_low {lo:.3}"
            ));
            say(&format!(
                "bench p2p_4k_latency_ratio_vs_bounce_ci95_high {hi:.3}"
            ));
            self.chart(
                "bench-p2p-throughput.svg",
                "P2P throughput against copy size: fabric, emulator memcpy, CPU bounce (TCG)",
                &bench::p2p_panels(&p2p.rows),
                &mut chart_errors,
            );
        }
        if want("manager") {
            // The requests come from h1 (nothing to do if the P2P part started it already).
            if fabric.hosts.len() > 1 {
                scenarios::manager::start_again(fabric, 1)?;
            }
            fabric.set_deadline(Some(Instant::now() + std::time::Duration::from_secs(900)));
            let r = scenarios::manager::bench_requests(fabric);
            fabric.set_deadline(None);
            let (mut t, first) = r?;
            t.sort_by(f64::total_cmp);
            say(&format!(
                "# the first request after the manager's start, not in the figures: {first:.3} ms"
            ));
            let pct = |q: f64| t[((t.len() - 1) as f64 * q).round() as usize];
            say(&format!(
                "# {} GPU requests made on h1 with pcifab --manager over the management network \
                 (TLS 1.3, client certificate), command start to exit with the grant (h1's \
                 monotonic clock, us), ms: min {:.3}, max {:.3}",
                t.len(),
                t[0],
                t[t.len() - 1]
            ));
            say(&format!(
                "bench manager_request_p50_ms_from_h1 {:.3}",
                pct(0.5)
            ));
            say(&format!(
                "bench manager_request_p99_ms_from_h1 {:.3}",
                pct(0.99)
            ));
        }
        if want("dmaep") {
            // h1 copies, h0 lends it a buffer: both run from here.
            if fabric.hosts.len() > 1 {
                scenarios::manager::start_again(fabric, 1)?;
            }
            fabric.set_deadline(Some(Instant::now() + std::time::Duration::from_secs(900)));
            let r = bench_dmaep::bench(fabric);
            fabric.set_deadline(None);
            for l in bench_dmaep::report(&r?) {
                say(&l);
            }
        }
        if chart_errors.is_empty() {
            Ok(())
        } else {
            Err(chart_errors.join("\n"))
        }
    }

    /// The figures of pcifab against switchtec.ko with switchtec-user (`bench::peer`).
    fn say_peer(rounds: &[bench::PeerRound]) {
        let m = bench::median;
        let col = |f: &dyn Fn(&bench::PeerRound) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
        let opt = |f: &dyn Fn(&bench::PeerRound) -> Option<f64>| {
            let v: Vec<f64> = rounds.iter().filter_map(f).collect();
            if v.len() == rounds.len() {
                format!("{:.1}", m(&v))
            } else {
                format!("- (in {} of {})", v.len(), rounds.len())
            }
        };
        let fmt = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let pb = col(&|r| r.pcifab_bind.total_ms);
        let sb = col(&|r| r.peer_bind.total_ms);
        let pu = col(&|r| r.pcifab_unbind.total_ms);
        let su = col(&|r| r.peer_unbind.total_ms);
        say(&format!(
            "# {} alternations pcifab / switchtec.ko + switchtec-user, 0x0300 on logical port 1, \
             guest clock (ms): pcifab bind {}; gfms-bind to usable {}; pcifab unbind {}; \
             power-off + gfms-unbind {}",
            rounds.len(),
            fmt(&pb),
            fmt(&sb),
            fmt(&pu),
            fmt(&su)
        ));
        say(&format!(
            "# where the time goes (ms since the start, median): pcifab bind: pciehp sees the \
             card {}, pcifab returned {} (its ioctl {:.1}), usable {:.1}; gfms-bind: pciehp \
             sees the card {}, switchtec returned {}, usable {:.1}; from pciehp's first \
             message to usable: pcifab {}, switchtec-user {}",
            opt(&|r| r.pcifab_bind.card_ms),
            opt(&|r| r.pcifab_bind.cmd_ms),
            m(&col(&|r| r.pcifab_bind_ioctl_ms)),
            m(&pb),
            opt(&|r| r.peer_bind.card_ms),
            opt(&|r| r.peer_bind.cmd_ms),
            m(&sb),
            opt(&|r| r.pcifab_bind.card_ms.map(|c| r.pcifab_bind.total_ms - c)),
            opt(&|r| r.peer_bind.card_ms.map(|c| r.peer_bind.total_ms - c))
        ));
        say(&format!(
            "# where the time goes (ms since the start, median): pcifab unbind {:.1} (its \
             ioctl {:.1}); power-off {}, then gfms-unbind, {:.1} in all",
            m(&pu),
            m(&col(&|r| r.pcifab_unbind_ioctl_ms)),
            opt(&|r| r.peer_unbind.cmd_ms),
            m(&su)
        ));
        say(&format!(
            "# MRPC commands of the host per operation (median): pcifab bind {:.0}, unbind \
             {:.0}; gfms-bind {:.0}, power-off + gfms-unbind {:.0}",
            m(&col(&|r| r.pcifab_bind.mrpc as f64)),
            m(&col(&|r| r.pcifab_unbind.mrpc as f64)),
            m(&col(&|r| r.peer_bind.mrpc as f64)),
            m(&col(&|r| r.peer_unbind.mrpc as f64))
        ));
        for (what, a, b) in [("bind", &pb, &sb), ("unbind", &pu, &su)] {
            let (lo, hi) = bench::ratio_interval(a, b);
            say(&format!(
                "bench {what}_latency_ms_pcifab_guest_clock {:.1}",
                m(a)
            ));
            say(&format!(
                "bench {what}_latency_ms_switchtec_user {:.1}",
                m(b)
            ));
            say(&format!(
                "bench {what}_latency_ratio_vs_switchtec_user {:.3}",
                m(a) / m(b)
            ));
            say(&format!(
                "bench {what}_latency_ratio_vs_switchtec_user_ci95_low {lo:.3}"
            ));
            say(&format!(
                "bench {what}_latency_ratio_vs_switchtec_user_ci95_high {hi:.3}"
            ));
        }
    }

    /// Writes one chart of the benchmark into the results directory and says where; a
    /// failure is noted in `errors`.
    fn chart(&self, file: &str, title: &str, panels: &[charts::Panel], errors: &mut Vec<String>) {
        let path = self.opts.results.join(file);
        match charts::write_svg(&path, title, panels) {
            Ok(()) => say(&format!("# chart: {}", path.display())),
            Err(e) => {
                say(&format!("# chart not written: {e}"));
                errors.push(e);
            }
        }
    }

    fn demo(&mut self, fabric: &mut Fabric) -> Result<(), String> {
        // What each host sees, then a composition story told from inside the hosts.
        let mut errors = Vec::new();
        for h in &mut fabric.hosts {
            let r = checks::ensure_pcifab(h).and_then(|()| h.run_ok("pcifab info"));
            match r {
                Ok(out) => show(&h.name, &out),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("\n"));
        }
        if fabric.hosts.len() < 2 {
            return Ok(());
        }
        if fabric
            .expected
            .endpoints
            .iter()
            .any(|e| e.kind == "nvme" && e.cmb_mib > 0)
        {
            return scenarios::p2pdma::demo(fabric);
        }
        if let Some(ssd) = fabric.expected.endpoints.iter().find(|e| e.kind == "nvme") {
            return demo_drive(fabric, ssd.pdfid(0));
        }
        // Lists the GPU-like functions the host has enumerated, waiting up to 10 s for one.
        const GPUS: &str = "i=0; until grep -qs 0x10de /sys/bus/pci/devices/*/vendor || \
             [ $i -ge 100 ]; do sleep 0.1; i=$((i+1)); done; \
             for d in /sys/bus/pci/devices/*; do [ $(cat $d/vendor) = 0x10de ] && \
             echo \"$(basename $d) $(cat $d/vendor):$(cat $d/device)\"; done; true";
        let steps: [(usize, &str, &str); 8] = [
            (0, "the pool, as host 0 sees it", "pcifab list"),
            (
                0,
                "host 0 (the manager) takes GPU0",
                "pcifab bind 0x0300 --host 0",
            ),
            (0, "GPU0 is a PCI device of host 0 now", GPUS),
            (
                0,
                "host 0 hands GPU0 to host 1",
                "pcifab move 0x0300 --host 1",
            ),
            (1, "host 1 sees it", GPUS),
            (
                0,
                "GPU1's VF 1 goes to host 0",
                "pcifab bind 0x0401 --host 0",
            ),
            (
                1,
                "and its VF 2 to host 1, requested by host 1 itself",
                "pcifab bind 0x0402 --host 1",
            ),
            (1, "the fabric now, from host 1", "pcifab list"),
        ];
        run_steps(fabric, &steps)?;
        demo_peer_copy(fabric)?;
        if fabric.expected.dialect == config::Dialect::Pax {
            say(
                "--- (pcifab's firmware extensions, P2P routes through a host's window onto \
                 another host's GPU, are not in PAX firmware: `make demo DIALECT=extended` \
                 shows them on the emulator)",
            );
            return Ok(());
        }
        let steps: [(usize, &str, &str); 4] = [
            (
                0,
                "[pcifab firmware extension, emulator only] host 0 routes its P2P window to \
                 VF 1 (its own) and, once granted, to GPU0 (on host 1)",
                "pcifab p2p route add 0x0401 --size 1M && pcifab p2p grant 0x0300 --host 0 && \
                 pcifab p2p route add 0x0300 --size 1M",
            ),
            (
                0,
                "[pcifab firmware extension, emulator only] host 0's routes",
                "pcifab p2p route list",
            ),
            (
                0,
                "[pcifab firmware extension, emulator only] host 0 copies 1 MiB from GPU0 on \
                 host 1 into its VF 1, through the fabric",
                "pcifab p2p copy --from 0x0300:0 --to 0x0401:0 --len 1M",
            ),
            (
                0,
                "how the data travelled",
                "pcifab p2p distance 0x0300 0x0401",
            ),
        ];
        run_steps(fabric, &steps)
    }
}

/// Runs the demo's steps, each on its host, showing what it printed.
fn run_steps(fabric: &mut Fabric, steps: &[(usize, &str, &str)]) -> Result<(), String> {
    for &(host, what, cmd) in steps {
        let h = &mut fabric.hosts[host];
        if cmd.starts_with("pcifab") {
            say(&format!("--- {what} (on {}: {cmd})", h.name));
        } else {
            say(&format!("--- {what} (on {})", h.name));
        }
        let out = h.run_ok(cmd)?;
        show(&h.name, &out);
    }
    Ok(())
}

/// The demo's copy from one host's memory into another's through the switch's DMA endpoint
/// (fabric mode, as PAX parts have it): host 1 lends host 0 a buffer with `pcifab p2p
/// receive`, host 0 copies 4 KiB of random bytes into it with `pcifab p2p copy --to peer:`,
/// and host 1 saves what arrived; the two files must be equal.
fn demo_peer_copy(fabric: &mut Fabric) -> Result<(), String> {
    const HFID: &str = "cat /sys/bus/pci/drivers/pcifab_dmaep/*/pcifab/hfid | head -n1";
    let hfid = |h: &mut fabric::Host| -> Result<u16, String> {
        let out = h.run_ok(HFID)?;
        let t = out.trim();
        u16::from_str_radix(t.trim_start_matches("0x"), 16)
            .map_err(|_| format!("{}: the DMA endpoint's hfid reads '{t}'", h.name))
    };
    let hfid0 = hfid(&mut fabric.hosts[0])?;
    let hfid1 = hfid(&mut fabric.hosts[1])?;
    let h1 = &mut fabric.hosts[1];
    let recv =
        format!("pcifab p2p receive --from {hfid0:#06x} --len 4k --out /tmp/demo-rx --wait 120");
    say(&format!(
        "--- host 1 lends host 0 a 4 KiB buffer through the switch's DMA endpoint (on {}: \
         {recv})",
        h1.name
    ));
    h1.run_ok(&format!(
        "rm -f /tmp/demo-rx.out; ({recv} </dev/null >/tmp/demo-rx.out 2>&1 & echo $! \
         >/tmp/demo-rx.pid); i=0; until grep -q lent /tmp/demo-rx.out || [ $i -ge 300 ] || \
         [ ! -e /proc/$(cat /tmp/demo-rx.pid) ]; do sleep 0.1; i=$((i+1)); done"
    ))?;
    let out = h1.run_ok("cat /tmp/demo-rx.out")?;
    show(&h1.name, &out);
    let slot = out
        .split("in slot ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u8>().ok())
        .ok_or_else(|| {
            format!(
                "{}: `{recv}` did not lend its buffer: {}",
                h1.name,
                out.trim()
            )
        })?;
    let h0 = &mut fabric.hosts[0];
    let copy = format!(
        "head -c 4096 /dev/urandom >/tmp/demo-tx && pcifab p2p copy --from file:/tmp/demo-tx \
         --to peer:{hfid1:#06x}:{slot}:0 --len 4k"
    );
    say(&format!(
        "--- host 0 copies 4 KiB of its memory into host 1's buffer: host 1's CPU is not \
         involved (on {}: {copy})",
        h0.name
    ));
    let out = h0.run_ok(&copy)?;
    show(&h0.name, &out);
    const HEX: &str = "od -An -v -tx1";
    let sent = h0.run_ok(&format!("{HEX} /tmp/demo-tx"))?;
    let h1 = &mut fabric.hosts[1];
    say(&format!(
        "--- host 1 ends its wait and saves the buffer (on {})",
        h1.name
    ));
    h1.run_ok(
        "kill -INT $(cat /tmp/demo-rx.pid); i=0; while [ -e /proc/$(cat /tmp/demo-rx.pid) ] \
         && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; [ ! -e /proc/$(cat \
         /tmp/demo-rx.pid) ]",
    )?;
    let out = h1.run_ok("tail -n1 /tmp/demo-rx.out")?;
    show(&h1.name, &out);
    let got = h1.run_ok(&format!("{HEX} /tmp/demo-rx"))?;
    if got != sent {
        return Err(format!(
            "{}: /tmp/demo-rx differs from what host 0 sent",
            h1.name
        ));
    }
    say(&format!(
        "--- the 4 KiB host 1 saved are the 4 KiB host 0 sent (first line: {})",
        got.lines().next().unwrap_or("").trim()
    ));
    Ok(())
}

/// The demo on a fabric with an NVMe drive (fabric-nvme.toml): Linux's own nvme driver
/// takes the drive in host 0, which writes a pattern on it; host 1 asks for the drive and
/// reads the same blocks back.
fn demo_drive(fabric: &mut Fabric, pdfid: u16) -> Result<(), String> {
    let seed = 0xd3_0000 + u64::from(std::process::id() & 0xffff);
    let bind = format!("pcifab bind {pdfid:#06x} --host 0");
    let steps: [(usize, &str, String); 6] = [
        (0, "the fabric, as host 0 sees it", "pcifab list".into()),
        (
            0,
            "host 0 takes the drive; Linux's nvme driver binds it",
            bind,
        ),
        (
            0,
            "host 0 writes a seeded pattern over the whole drive (direct I/O)",
            format!("pcifab-selftest blk-write --dev /dev/nvme0n1 --seed {seed}"),
        ),
        (
            1,
            "host 1 asks for the drive: host 0's kernel gives it up, host 1's takes it",
            format!("pcifab move {pdfid:#06x} --host 1"),
        ),
        (
            1,
            "host 1 reads every block back: each must be the one host 0 wrote",
            format!("pcifab-selftest blk-verify --dev /dev/nvme0n1 --seed {seed}"),
        ),
        (1, "the fabric now, from host 1", "pcifab list".into()),
    ];
    for (host, what, cmd) in steps {
        let h = &mut fabric.hosts[host];
        say(&format!("--- {what} (on {}: {cmd})", h.name));
        let out = h.run_ok_timeout(&cmd, std::time::Duration::from_secs(180))?;
        show(&h.name, &out);
    }
    Ok(())
}

/// How many distinct host threads run `h`'s virtual CPUs (QMP `query-cpus-fast`): one per
/// CPU under multi-threaded TCG, one for all of them otherwise.
fn vcpu_threads(h: &fabric::Host) -> Result<usize, String> {
    let cpus = h.qmp()?.execute("query-cpus-fast", None)?;
    let mut ids: Vec<u64> = cpus
        .as_array()
        .ok_or_else(|| format!("{}: query-cpus-fast: expected a list, got {cpus}", h.name))?
        .iter()
        .map(|c| {
            c.get("thread-id")
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| format!("{}: query-cpus-fast: a CPU without thread-id: {c}", h.name))
        })
        .collect::<Result<_, _>>()?;
    ids.sort_unstable();
    ids.dedup();
    Ok(ids.len())
}

/// Prints a command's output, each line prefixed by the host's name.
fn show(host: &str, out: &str) {
    for l in out.trim_end().lines() {
        say(&format!("{host}: {l}"));
    }
}

/// One run's summary.json, as `summary` reads it.
#[derive(Debug, PartialEq)]
struct RunSummary {
    /// The run's results folder's name (tells apart two runs of one cell).
    folder: String,
    /// The kernel's name in the cell (`cell` in summary.json; older files have none).
    kernel: Option<String>,
    dialect: String,
    passed: u64,
    failed: u64,
}

impl RunSummary {
    /// `KERNEL x DIALECT`, or the dialect alone for a run that named no kernel.
    fn cell(&self) -> String {
        match &self.kernel {
            Some(k) => format!("{k} x {}", self.dialect),
            None => self.dialect.clone(),
        }
    }
}

fn read_summary(dir: &Path) -> Result<RunSummary, String> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "cannot read {}: {e}; is {} the --results folder of a `pcifab-harness test` run?",
            path.display(),
            dir.display()
        )
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let field = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| format!("{}: no number `{k}`", path.display()))
    };
    let dialect = v
        .get("dialect")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| format!("{}: no string `dialect`", path.display()))?;
    Ok(RunSummary {
        folder: folder_name(dir),
        kernel: v
            .get("cell")
            .and_then(serde_json::Value::as_str)
            .map(String::from),
        dialect: dialect.to_string(),
        passed: field("passed")?,
        failed: field("failed")?,
    })
}

/// The last component of a results folder, for the summary's lines.
fn folder_name(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The lines `summary` prints: one per run, `KERNEL x DIALECT: N passed, N failed` in the
/// order given (with the folder's name after the cell when two runs share a cell), then
/// the total.
fn summary_lines(runs: &[RunSummary]) -> Vec<String> {
    let mut lines = Vec::new();
    for r in runs {
        let cell = r.cell();
        let shared = runs.iter().filter(|o| o.cell() == cell).count() > 1;
        let label = if shared {
            format!("{cell} ({})", r.folder)
        } else {
            cell
        };
        lines.push(format!("{label}: {} passed, {} failed", r.passed, r.failed));
    }
    let (p, f) = runs
        .iter()
        .fold((0, 0), |(p, f), r| (p + r.passed, f + r.failed));
    lines.push(format!("{p} passed, {f} failed"));
    lines
}

/// `pcifab-harness summary DIR...`.
fn summary(dirs: &[String]) -> ExitCode {
    let mut runs = Vec::new();
    for d in dirs {
        match read_summary(Path::new(d)) {
            Ok(r) => runs.push(r),
            Err(e) => {
                // A run that left no summary (it could not boot, or never started) is one
                // failure of its own, so the total still says something went wrong.
                println!("not ok - {d}: no results: {e}");
                runs.push(RunSummary {
                    folder: folder_name(Path::new(d)),
                    kernel: None,
                    dialect: format!("{} (no results)", folder_name(Path::new(d))),
                    passed: 0,
                    failed: 1,
                });
            }
        }
    }
    for l in summary_lines(&runs) {
        println!("{l}");
    }
    if runs.iter().any(|r| r.failed > 0) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn main() -> ExitCode {
    let opts = match parse_cli(std::env::args().skip(1)) {
        Ok(Ok(o)) => o,
        Ok(Err(dirs)) => return summary(&dirs),
        // Usage errors exit with status 2, --help and --version with 0.
        Err(e) => e.exit(),
    };
    if opts.mode == Mode::List {
        for s in scenarios::all() {
            println!("{}", s.name);
        }
        return ExitCode::SUCCESS;
    }
    if opts.mode == Mode::BenchScale {
        return scale::main(opts);
    }
    if let Some(f) = &opts.filter {
        let f = f.to_lowercase();
        if opts.mode == Mode::Bench {
            if !BENCH_PARTS.iter().any(|p| filter_matches(&f, p)) {
                eprintln!(
                    "pcifab-harness: --filter {f:?} matches no part of the benchmark; the \
                     parts are {}",
                    BENCH_PARTS.join(", ")
                );
                return ExitCode::from(2);
            }
        } else if !scenarios::all()
            .iter()
            .chain(scenarios::selftest().iter())
            .any(|s| filter_matches(&f, s.name))
        {
            eprintln!(
                "pcifab-harness: --filter {f:?} matches no scenario; `pcifab-harness list` \
                 shows the names"
            );
            return ExitCode::from(2);
        }
    }
    if let Err(e) = check_inputs(&opts) {
        eprintln!("pcifab-harness: {e}");
        return ExitCode::from(2);
    }
    let expected = if opts.no_emu {
        let n = opts.hosts.unwrap_or(1);
        let text: String = (0..n)
            .map(|i| format!("[[hosts]]\nname = \"h{i}\"\n"))
            .collect();
        Expected::parse(&text)
    } else {
        Expected::load(&opts.emu_config)
    };
    let expected = match expected {
        Ok(mut e) => {
            if let Some(d) = opts.dialect {
                e.dialect = d;
            }
            e
        }
        Err(e) => {
            eprintln!("pcifab-harness: {e}");
            return ExitCode::from(2);
        }
    };
    if opts.mode == Mode::Bench {
        let f = opts.filter.as_deref().map(str::to_lowercase);
        if let Err(e) = bench_parts(f.as_deref(), expected.dialect) {
            eprintln!("pcifab-harness: {e}");
            return ExitCode::from(2);
        }
    }
    if let Err(e) = std::fs::create_dir_all(&opts.results) {
        eprintln!(
            "pcifab-harness: cannot create results directory {}: {e}",
            opts.results.display()
        );
        return ExitCode::from(2);
    }
    if let Ok(f) = File::create(opts.results.join("harness.log")) {
        let _ = HARNESS_LOG.set(Mutex::new(f));
    }
    let log = match CmdLog::create(&opts.results.join("commands.log")) {
        Ok(l) => Arc::new(l),
        Err(e) => {
            eprintln!("pcifab-harness: {e}");
            return ExitCode::from(2);
        }
    };
    procs::install_signal_handlers();

    let start = Instant::now();
    let mode = opts.mode;
    let mut run = Run {
        opts,
        expected,
        log,
        passed: 0,
        failed: 0,
        outcomes: Vec::new(),
    };
    say(&format!(
        "# dialect: {} (emulator firmware for the whole run)",
        run.expected.dialect.name()
    ));
    // Declared before the fabric so it is dropped (killing children) after it.
    let mut children = Children::default();
    let run_dir = match TempDir::new() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pcifab-harness: {e}");
            return ExitCode::from(2);
        }
    };
    let mut demo_failed = false;
    let hosts_for_shutdown;
    match run.setup(&mut children, &run_dir.0) {
        Err(e) => {
            run.failed += 1;
            let mut lines = e.lines();
            say(&format!("not ok 1 - setup: {}", lines.next().unwrap_or("")));
            for l in lines {
                say(&format!("#   {l}"));
            }
            hosts_for_shutdown = run
                .expected
                .hosts
                .iter()
                .map(|n| (n.clone(), 0, run_dir.0.join(format!("qmp-{n}.sock"))))
                .collect::<Vec<_>>();
        }
        Ok(mut fabric) => {
            hosts_for_shutdown = fabric
                .hosts
                .iter()
                .map(|h| (h.name.clone(), h.qemu_pid, h.qmp_path.clone()))
                .collect();
            match mode {
                Mode::Demo => {
                    if let Err(e) = run.demo(&mut fabric) {
                        say(&format!("demo failed: {e}"));
                        demo_failed = true;
                    }
                }
                Mode::Bench => {
                    if let Err(e) = run.bench(&mut fabric) {
                        say(&format!("bench failed: {e}"));
                        demo_failed = true;
                    }
                }
                _ => run.scenarios(&mut fabric),
            }
        }
    }
    let problems = fabric::shutdown(
        &mut children,
        &hosts_for_shutdown,
        &run_dir.0,
        &run.opts.results,
        &run.log,
        !run.opts.no_emu,
    );
    for p in problems {
        say(&format!("# warning: {p}"));
    }
    drop(children);
    say(&format!(
        "# total {:.1} s; logs in {}",
        start.elapsed().as_secs_f64(),
        run.opts.results.display()
    ));
    if procs::interrupted() {
        say(&format!(
            "{} passed, {} failed",
            run.passed,
            run.failed.max(1)
        ));
        return ExitCode::from(130);
    }
    match mode {
        Mode::Demo | Mode::Bench => {
            if demo_failed || run.failed > 0 {
                ExitCode::FAILURE
            } else {
                say(if mode == Mode::Demo {
                    "demo: done"
                } else {
                    "bench: done"
                });
                ExitCode::SUCCESS
            }
        }
        _ => {
            if let Err(e) = run.write_summary() {
                say(&format!("# warning: {e}"));
            }
            say(&format!("{} passed, {} failed", run.passed, run.failed));
            if run.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// (QEMU pid, CPU seconds so far) of every host of the fabric still running.
fn guests_cpu(fabric: &Fabric) -> Vec<(u32, f64)> {
    fabric
        .hosts
        .iter()
        .filter_map(|h| procs::cpu_seconds(h.qemu_pid).map(|c| (h.qemu_pid, c)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn bench_parts_follow_the_filter_and_the_dialect() {
        use config::Dialect::{Extended, Pax};
        // Unfiltered: the dmaep part only on pax, and a note says where it went.
        let (parts, notes) = bench_parts(None, Extended).unwrap();
        assert_eq!(parts, ["mrpc", "compose", "p2p", "manager"]);
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("--dialect pax --filter dmaep"),
            "{}",
            notes[0]
        );
        let (parts, notes) = bench_parts(None, Pax).unwrap();
        assert_eq!(parts, BENCH_PARTS);
        assert!(notes.is_empty());
        assert_eq!(bench_parts(Some("dmaep"), Pax).unwrap().0, ["dmaep"]);
        assert_eq!(
            bench_parts(Some("compose|p2p"), Extended).unwrap().0,
            ["compose", "p2p"]
        );
        // Named on another dialect: refused, not skipped.
        let e = bench_parts(Some("p2p|dmaep"), Extended).unwrap_err();
        assert!(e.contains("--dialect pax --filter dmaep"), "{e}");
    }

    #[test]
    fn args() {
        let o = parse_args(&v(&[
            "test",
            "--kernel",
            "k",
            "--module",
            "m",
            "--switchtec",
            "s",
            "--guest-bin",
            "g",
            "--emu",
            "e",
            "--emu-config",
            "c",
            "--qemu-root",
            "q",
            "--results",
            "r",
            "--hosts",
            "2",
            "--keep-going",
            "--debug-kernel",
        ]))
        .unwrap();
        assert_eq!(o.mode, Mode::Test);
        assert_eq!(o.hosts, Some(2));
        assert!(o.keep_going);
        assert!(o.debug_kernel);
        assert_eq!(o.switchtec, Some(PathBuf::from("s")));
        // --switchtec is optional: Debian's kernel has no switchtec.ko.
        let o = parse_args(&v(&[
            "test",
            "--kernel",
            "k",
            "--module",
            "m",
            "--guest-bin",
            "g",
            "--emu",
            "e",
            "--emu-config",
            "c",
            "--qemu-root",
            "q",
            "--results",
            "r",
        ]))
        .unwrap();
        assert_eq!(o.switchtec, None);
        assert_eq!(
            (o.smp, o.cell.as_deref(), o.exclude.as_deref()),
            (1, None, None)
        );
        let base = [
            "test",
            "--kernel",
            "k",
            "--module",
            "m",
            "--guest-bin",
            "g",
            "--emu",
            "e",
            "--emu-config",
            "c",
            "--qemu-root",
            "q",
            "--results",
            "r",
        ];
        let mut a = base.to_vec();
        a.extend(["--smp", "2", "--cell", "debian", "--exclude", "p2p:|nvme:"]);
        let o = parse_args(&v(&a)).unwrap();
        assert_eq!(
            (o.smp, o.cell.as_deref(), o.exclude.as_deref()),
            (2, Some("debian"), Some("p2p:|nvme:"))
        );
        for bad in ["0", "9", "x"] {
            let mut a = base.to_vec();
            a.extend(["--smp", bad]);
            assert!(parse_args(&v(&a)).unwrap_err().contains("--smp"));
        }
        assert_eq!(fabric::tcg_accel(1), "tcg");
        assert_eq!(fabric::tcg_accel(2), "tcg,thread=multi");
        assert!(parse_args(&v(&["test", "--kernel"])).is_err());
        assert!(parse_args(&v(&["test", "--kernel", "k"])).is_err());
        assert!(parse_args(&v(&["bogus"])).is_err());
        use clap::CommandFactory;
        Cli::command().debug_assert();
        // `list` needs no paths; `summary` at least one folder.
        assert_eq!(parse_args(&v(&["list"])).unwrap().mode, Mode::List);
        assert_eq!(
            parse_cli(v(&["summary", "a", "b"])).unwrap().unwrap_err(),
            ["a", "b"]
        );
        assert_eq!(parse_cli(v(&["summary"])).unwrap_err().exit_code(), 2);
        let e = parse_cli(v(&["demo", "--kernel", "k"])).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().contains("--module is required for demo"),
            "{e}"
        );
    }

    #[test]
    fn dialect_and_client_flags() {
        let base = [
            "test",
            "--kernel",
            "k",
            "--module",
            "m",
            "--switchtec",
            "s",
            "--guest-bin",
            "g",
            "--emu",
            "e",
            "--emu-config",
            "c",
            "--qemu-root",
            "q",
            "--results",
            "r",
        ];
        let o = parse_args(&v(&base)).unwrap();
        assert_eq!((o.dialect, o.switchtec_user), (None, None));
        let mut a = base.to_vec();
        a.extend(["--dialect", "pax", "--switchtec-user", "/x/switchtec"]);
        let o = parse_args(&v(&a)).unwrap();
        assert_eq!(o.dialect, Some(config::Dialect::Pax));
        assert_eq!(o.switchtec_user, Some(PathBuf::from("/x/switchtec")));
        let mut a = base.to_vec();
        a.extend(["--dialect", "gen3"]);
        assert!(parse_args(&v(&a)).unwrap_err().contains("pax or extended"));
    }

    #[test]
    fn summary_of_several_runs() {
        let dir = std::env::temp_dir().join(format!("pcifab-summary-{}", std::process::id()));
        let run = |name: &str, json: &str| {
            let d = dir.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("summary.json"), json).unwrap();
            d
        };
        let a = run(
            "a",
            r#"{"dialect":"extended","cell":"debug","kernel":"k","passed":40,"failed":1,"scenarios":[]}"#,
        );
        let b = run(
            "b",
            r#"{"dialect":"pax","cell":"debug","kernel":"k","passed":38,"failed":0,"scenarios":[]}"#,
        );
        let b2 = run(
            "b2",
            r#"{"dialect":"pax","cell":"debug","kernel":"k","passed":10,"failed":0,"scenarios":[]}"#,
        );
        let old = run(
            "old",
            r#"{"dialect":"pax","kernel":"k","passed":3,"failed":0,"scenarios":[]}"#,
        );
        let runs: Vec<_> = [&a, &b, &b2, &old]
            .iter()
            .map(|d| read_summary(d).unwrap())
            .collect();
        assert_eq!(
            summary_lines(&runs),
            [
                "debug x extended: 40 passed, 1 failed",
                "debug x pax (b): 38 passed, 0 failed",
                "debug x pax (b2): 10 passed, 0 failed",
                "pax: 3 passed, 0 failed",
                "91 passed, 1 failed"
            ]
        );
        let bad = run("c", r#"{"dialect":"pax","passed":"x"}"#);
        assert!(read_summary(&bad)
            .unwrap_err()
            .contains("no number `passed`"));
        assert!(read_summary(&dir.join("none"))
            .unwrap_err()
            .contains("cannot read"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
