// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab`'s command line (clap derive): commands, their options, the value parsers, and
//! which global option applies to which command. Documentation/cli.rst describes it.

use std::{fmt, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

/// What `--help` ends with: the exit codes (the same as every release before clap).
pub const EXIT_CODES: &str = "\
Exit codes: 0 success, 1 the operation failed, 2 the command line is wrong,
3 the fabric or the manager refused it (conflict, policy, unknown function).
With --json every result and every error is one JSON object on stdout
(Documentation/cli.rst, schemas in Documentation/json/).";

/// Look at and compose a multi-host PCIe switch fabric through /dev/pcifabN.
#[derive(Debug, Parser)]
#[command(
    name = "pcifab",
    version,
    after_help = EXIT_CODES,
    propagate_version = true,
    disable_help_subcommand = true,
    max_term_width = 100
)]
pub struct Cli {
    /// Character device of the switch's management endpoint.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        default_value = "/dev/pcifab0",
        help_heading = "Global options"
    )]
    pub device: String,
    /// Print one JSON object per result (errors too) on stdout instead of text.
    #[arg(long, global = true, help_heading = "Global options")]
    pub json: bool,
    /// The fabric manager's control socket (request, release, queue, leases).
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        default_value = "/run/pcifab-manager.sock",
        help_heading = "Global options"
    )]
    pub manager_socket: String,
    /// The fabric manager's network API, https://HOST:PORT (instead of the local socket;
    /// also PCIFAB_MANAGER or `manager` in /etc/pcifab/client.toml); several managers of a
    /// highly available fabric, comma-separated: the leader among them is asked.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "PCIFAB_MANAGER",
        help_heading = "Global options"
    )]
    pub manager: Option<String>,
    /// CA certificates (PEM) the manager's certificate must chain to (with --manager).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "PCIFAB_CA",
        help_heading = "Global options"
    )]
    pub ca: Option<PathBuf>,
    /// This host's client certificate (PEM) for the manager (with --manager and --key).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "PCIFAB_CERT",
        help_heading = "Global options"
    )]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "PCIFAB_KEY",
        help_heading = "Global options"
    )]
    pub key: Option<PathBuf>,
    /// A file holding a bearer token for the manager (with --manager).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "PCIFAB_TOKEN_FILE",
        help_heading = "Global options"
    )]
    pub token_file: Option<PathBuf>,
    /// How long to wait, in milliseconds (bind, unbind, move, watch, mrpc, p2p copy; 0: the
    /// driver's default).
    #[arg(long, global = true, value_name = "MS", value_parser = ms, help_heading = "Global options")]
    pub timeout: Option<u32>,
    /// Stop after N reports (watch, top; default: until interrupted).
    #[arg(long, global = true, value_name = "N", value_parser = count, help_heading = "Global options")]
    pub count: Option<u32>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Identity of the switch and of the driver's uAPI.
    Info,
    /// The fabric: ports, endpoint functions (PFs, VFs), who holds what.
    List,
    /// One function in detail, with its telemetry.
    Show {
        /// The function (PDFID, e.g. 0x0300).
        #[arg(value_parser = pdfid)]
        pdfid: u16,
    },
    /// Bind a function, or up to 8 together as one multi-function device, to a host (needs
    /// CAP_SYS_ADMIN).
    Bind(BindArgs),
    /// Take a function away from the host holding it (needs CAP_SYS_ADMIN).
    Unbind {
        /// The function (PDFID, e.g. 0x0300).
        #[arg(value_parser = pdfid)]
        pdfid: u16,
        /// Unbind it from this host even if its block devices are mounted, swap or held.
        #[arg(long)]
        force: bool,
    },
    /// Unbind a function where it is and bind it to another host (back where it was on
    /// failure; needs CAP_SYS_ADMIN).
    Move(MoveArgs),
    /// Print events as they arrive (--count N stops after N reports).
    Watch,
    /// Counters of the management endpoint (MRPC, interrupts), or one telemetry snapshot.
    Stats {
        /// One telemetry snapshot of every function instead (like one refresh of `top`).
        #[arg(long)]
        telemetry: bool,
    },
    /// Run one firmware command; prints status, return value and output.
    Mrpc {
        /// The command id, e.g. 0x41.
        #[arg(value_parser = number)]
        cmd: u32,
        /// Input bytes in hex ("0a0b0c"; spaces and colons allowed).
        #[arg(value_parser = hex_bytes)]
        input: Option<HexBytes>,
        /// Bytes of output to read (at most 1024).
        #[arg(long, value_name = "N", default_value = "0", value_parser = out_len)]
        out_len: u32,
    },
    /// Peer-to-peer: routes of this host's P2P window, DMA copies, distances, grants.
    #[command(subcommand)]
    P2p(P2p),
    /// Ask the fabric manager for devices for a host.
    Request(RequestArgs),
    /// End a lease or cancel a queued request.
    Release {
        /// The lease or request id.
        #[arg(value_parser = number)]
        id: u32,
    },
    /// The manager's queued requests, in the order they will be served.
    Queue,
    /// The manager's leases.
    Leases,
    /// The manager's pools: devices, health, holders.
    Pools,
    /// The hosts as the manager sees them: up or down, what each holds.
    Hosts,
    /// The manager's notices (grants, pre-emptions, moves, expiry).
    Events {
        /// Only this host's notices.
        #[arg(long, value_name = "N", value_parser = host_u8)]
        host: Option<u8>,
        /// Only notices after this sequence number.
        #[arg(long, value_name = "SEQ", default_value = "0")]
        since: u64,
        /// Keep waiting for new notices (until interrupted or --count of them).
        #[arg(long)]
        follow: bool,
    },
    /// Make a host hold exactly these whole devices: leases of functions not named end,
    /// devices newly named are granted now (or the whole composition is refused).
    Compose {
        /// The host (switch partition).
        #[arg(value_parser = host_u8)]
        host: u8,
        /// The PFs the host is to hold; none: give everything back.
        #[arg(value_parser = pdfid, value_name = "PF")]
        functions: Vec<u16>,
        /// Priority of the new leases (a waiting request of at least this priority for
        /// the same pool keeps its turn).
        #[arg(long, default_value = "0")]
        priority: u32,
        /// Lease length in seconds (default: the manager's default_lease_s).
        #[arg(long, value_name = "S")]
        duration: Option<u64>,
        /// The tenant the new leases count against.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Declare a host down: its leases are reclaimed after the manager's reclaim_after_s.
    HostDown {
        #[arg(value_parser = host_u8)]
        host: u8,
    },
    /// Tell the manager a host is alive.
    Heartbeat {
        #[arg(value_parser = host_u8)]
        host: u8,
    },
    /// Take a pool device out of the pool (`bad REASON`) or put it back (`ok`).
    Health {
        /// The device's PF.
        #[arg(value_parser = pdfid)]
        pf: u16,
        /// ok or bad.
        #[arg(value_enum)]
        state: HealthState,
        /// Why it is out (bad only).
        reason: Option<String>,
    },
    /// The manager's telemetry samples of every function (JSON).
    ManagerTelemetry,
    /// The manager's whole scheduler state (JSON).
    ManagerState,
    /// The last entries of the manager's request log (JSON).
    ManagerLog {
        /// How many.
        #[arg(short = 'n', long = "lines", value_name = "N", default_value = "20")]
        n: u64,
    },
    /// Live telemetry of every function (q quits, s changes the sort key).
    Top {
        /// Seconds between refreshes (0.1 to 3600).
        #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = interval)]
        interval: f64,
        /// The column rows are sorted by.
        #[arg(long, value_enum, default_value_t = SortKey::Pdfid)]
        sort: SortKey,
    },
}

/// The arguments of `bind`.
#[derive(Debug, Args)]
pub struct BindArgs {
    /// The function (PDFID, e.g. 0x0300), or up to 8 bound together as one multi-function
    /// device, all or none; the first one is function 0 (the primary).
    #[arg(value_parser = pdfid, value_name = "PDFID", required = true, num_args = 1..)]
    pub pdfids: Vec<u16>,
    #[command(flatten)]
    pub target: Target,
}

impl BindArgs {
    /// The primary function: the first one named, function 0 on the host.
    pub fn primary(&self) -> u16 {
        self.pdfids.first().copied().unwrap_or_default()
    }
}

/// The options of `move`.
#[derive(Debug, Args)]
pub struct Compose {
    /// The function (PDFID, e.g. 0x0300).
    #[arg(value_parser = pdfid)]
    pub pdfid: u16,
    #[command(flatten)]
    pub target: Target,
}

/// Where `bind` and `move` put functions.
#[derive(Debug, Args)]
pub struct Target {
    /// The host (partition number) to bind it to.
    #[arg(long, value_name = "H", value_parser = host_u8)]
    pub host: u8,
    /// On this logical port of the host (default: the first free one).
    #[arg(long, value_name = "P", value_parser = host_u8)]
    pub port: Option<u8>,
    /// Return when the fabric bound it; do not wait for the host to see it (bind only).
    #[arg(long)]
    pub no_wait: bool,
    /// Wait up to SECS seconds for the block device of a mass-storage function bound to
    /// this host (0: do not wait).
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = block_secs)]
    pub block_timeout: u32,
}

/// The options of `move`.
#[derive(Debug, Args)]
pub struct MoveArgs {
    #[command(flatten)]
    pub to: Compose,
    /// Move it away from this host even if its block devices are mounted, swap or held.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("want").required(true).args(["gpus", "vfs"]))]
pub struct RequestArgs {
    /// N whole GPUs.
    #[arg(long, value_name = "N", value_parser = number)]
    pub gpus: Option<u32>,
    /// N VFs.
    #[arg(long, value_name = "N", value_parser = number)]
    pub vfs: Option<u32>,
    /// VFs of devices of this profile (with --vfs).
    #[arg(long, value_name = "P", requires = "vfs", conflicts_with = "gpus")]
    pub profile: Option<String>,
    /// For host H.
    #[arg(long, value_name = "H", value_parser = number)]
    pub host: u32,
    /// Priority P (0 lowest).
    #[arg(long, value_name = "P", value_parser = number)]
    pub priority: u32,
    /// Lease length in seconds (default: the manager's).
    #[arg(long, value_name = "S", value_parser = number)]
    pub duration: Option<u32>,
    /// The lease may be pre-empted by requests of higher priority.
    #[arg(long)]
    pub preemptible_by_higher: bool,
    /// Only from this pool.
    #[arg(long, value_name = "NAME")]
    pub pool: Option<String>,
    /// Count it against this fair-share tenant (default: the caller's own).
    #[arg(long, value_name = "T")]
    pub tenant: Option<String>,
    /// Label the request (and its lease) with TAG, e.g. the job it is for.
    #[arg(long, value_name = "TAG")]
    pub tag: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum P2p {
    /// The routes of this host's P2P window onto functions' device memory.
    #[command(subcommand)]
    Route(Route),
    /// Copy bytes with the management endpoint's DMA engine (needs CAP_SYS_ADMIN).
    Copy {
        /// Source: PDFID:OFF (device memory, through a route), file:PATH or iova:ADDR.
        #[arg(long, value_name = "END", value_parser = end)]
        from: End,
        /// Destination: PDFID:OFF, file:PATH, iova:ADDR (an iova end needs CAP_SYS_RAWIO) or
        /// peer:HFID:SLOT:OFF (a buffer a peer host registered for this one).
        #[arg(long, value_name = "END", value_parser = end)]
        to: End,
        /// Bytes to copy (1 byte to 1G; 16M, 0x1000, 4k).
        #[arg(long, value_name = "N", value_parser = size)]
        len: u64,
    },
    /// Lend a peer host a buffer of this host's memory to copy into, through the switch's
    /// DMA endpoint (fabric mode; needs CAP_SYS_ADMIN); when the wait ends, save what it
    /// holds and take the buffer back.
    Receive {
        /// The peer host that may write: its HFID (the `hfid` file of its DMA endpoint).
        #[arg(long, value_name = "HFID", value_parser = pdfid)]
        from: u16,
        /// Buffer size (1 byte to 4k without an IOMMU, more where one maps it as one range).
        #[arg(long, value_name = "N", value_parser = size)]
        len: u64,
        /// File that gets the buffer's bytes when the wait ends.
        #[arg(long, value_name = "PATH")]
        out: std::path::PathBuf,
        /// Seconds to wait for the peer's copies (1 to 86400); SIGINT or SIGTERM ends the
        /// wait earlier.
        #[arg(long, value_name = "S", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
        wait: u64,
    },
    /// How data would travel between two functions.
    Distance {
        #[arg(value_parser = pdfid)]
        a: u16,
        #[arg(value_parser = pdfid)]
        b: u16,
    },
    /// Let host N route to a function this host holds (the fabric-manager host may grant any
    /// bound function).
    Grant(GrantArgs),
    /// Take a grant back; host N's routes to the function go too.
    Revoke(GrantArgs),
    /// The grants on functions this host holds or was granted.
    Grants,
}

#[derive(Debug, Args)]
pub struct GrantArgs {
    /// The function (PDFID).
    #[arg(value_parser = pdfid)]
    pub pdfid: u16,
    /// The host (partition) that may route to it.
    #[arg(long, value_name = "N", value_parser = host_u8)]
    pub host: u8,
}

#[derive(Debug, Subcommand)]
pub enum Route {
    /// Route N bytes of this host's P2P window to a function's device memory.
    Add {
        /// The function (PDFID).
        #[arg(value_parser = pdfid)]
        pdfid: u16,
        /// Bytes to route: a multiple of 4k (16M, 0x1000, 4k).
        #[arg(long, value_name = "N", value_parser = size)]
        size: u64,
        /// From this offset of the device memory (multiple of 4k; default 0).
        #[arg(long, value_name = "N", value_parser = size)]
        target_off: Option<u64>,
        /// At this window offset (multiple of 4k), or 'any' (the lowest free one, default).
        #[arg(long, value_name = "N", value_parser = window_off)]
        window_off: Option<u64>,
    },
    /// Delete the route that starts at window offset OFF.
    Del {
        #[arg(value_parser = size)]
        off: u64,
    },
    /// The routes of this host's P2P window.
    List,
}

/// Columns `top` sorts by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SortKey {
    Pdfid,
    Host,
    Temp,
    Power,
    Util,
    Health,
}

impl SortKey {
    /// The next key (`s` in `top`).
    pub fn next(self) -> Self {
        match self {
            SortKey::Pdfid => SortKey::Host,
            SortKey::Host => SortKey::Temp,
            SortKey::Temp => SortKey::Power,
            SortKey::Power => SortKey::Util,
            SortKey::Util => SortKey::Health,
            SortKey::Health => SortKey::Pdfid,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SortKey::Pdfid => "pdfid",
            SortKey::Host => "host",
            SortKey::Temp => "temp",
            SortKey::Power => "power",
            SortKey::Util => "util",
            SortKey::Health => "health",
        }
    }
}

impl Command {
    /// The command's name as the JSON schemas spell it (`pcifab/<name>/v1`).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Info => "info",
            Command::List => "list",
            Command::Show { .. } => "show",
            Command::Bind(_) => "bind",
            Command::Unbind { .. } => "unbind",
            Command::Move(_) => "move",
            Command::Watch => "watch",
            Command::Stats { telemetry: false } => "stats",
            Command::Stats { telemetry: true } => "stats-telemetry",
            Command::Mrpc { .. } => "mrpc",
            Command::P2p(P2p::Route(Route::Add { .. })) => "p2p-route-add",
            Command::P2p(P2p::Route(Route::Del { .. })) => "p2p-route-del",
            Command::P2p(P2p::Route(Route::List)) => "p2p-route-list",
            Command::P2p(P2p::Copy { .. }) => "p2p-copy",
            Command::P2p(P2p::Distance { .. }) => "p2p-distance",
            Command::P2p(P2p::Receive { .. }) => "p2p-receive",
            Command::P2p(P2p::Grant(_)) => "p2p-grant",
            Command::P2p(P2p::Revoke(_)) => "p2p-revoke",
            Command::P2p(P2p::Grants) => "p2p-grants",
            Command::Request(_) => "request",
            Command::Release { .. } => "release",
            Command::Queue => "queue",
            Command::Leases => "leases",
            Command::Pools => "pools",
            Command::Hosts => "hosts",
            Command::Events { .. } => "events",
            Command::Compose { .. } => "compose",
            Command::HostDown { .. } => "host-down",
            Command::Heartbeat { .. } => "heartbeat",
            Command::Health { .. } => "health",
            Command::ManagerTelemetry => "manager-telemetry",
            Command::ManagerState => "manager-state",
            Command::ManagerLog { .. } => "manager-log",
            Command::Top { .. } => "top",
        }
    }

    /// Whether it talks to the manager's socket rather than the device.
    pub fn uses_manager(&self) -> bool {
        matches!(
            self,
            Command::Request(_)
                | Command::Release { .. }
                | Command::Queue
                | Command::Leases
                | Command::Pools
                | Command::Hosts
                | Command::Events { .. }
                | Command::Compose { .. }
                | Command::HostDown { .. }
                | Command::Heartbeat { .. }
                | Command::Health { .. }
                | Command::ManagerTelemetry
                | Command::ManagerState
                | Command::ManagerLog { .. }
        )
    }

    /// The global options (beyond --json) this command takes.
    pub fn takes(&self) -> &'static [&'static str] {
        match self {
            Command::Events { .. } => &MANAGER_OPTIONS_COUNT,
            c if c.uses_manager() => &MANAGER_OPTIONS,
            Command::Bind(_)
            | Command::Unbind { .. }
            | Command::Move(_)
            | Command::Mrpc { .. }
            | Command::P2p(P2p::Copy { .. }) => &["device", "timeout"],
            Command::Watch => &["device", "timeout", "count"],
            Command::Top { .. } => &TOP_OPTIONS,
            _ => &["device"],
        }
    }
}

/// `top`'s global options: the driver's, or the manager's when a URL is given.
const TOP_OPTIONS: [&str; 8] = [
    "device",
    "count",
    "manager-socket",
    "manager",
    "ca",
    "cert",
    "key",
    "token-file",
];

/// The global options of the manager's commands.
const MANAGER_OPTIONS: [&str; 6] = [
    "manager-socket",
    "manager",
    "ca",
    "cert",
    "key",
    "token-file",
];
const MANAGER_OPTIONS_COUNT: [&str; 7] = [
    "manager-socket",
    "manager",
    "ca",
    "cert",
    "key",
    "token-file",
    "count",
];

/// Whether a pool device is in service (`pcifab health`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HealthState {
    Ok,
    Bad,
}

/// The global options that some commands do not take, as clap ids and option names.
pub const SCOPED_GLOBALS: [(&str, &str); 9] = [
    ("device", "--device"),
    ("manager_socket", "--manager-socket"),
    ("manager", "--manager"),
    ("ca", "--ca"),
    ("cert", "--cert"),
    ("key", "--key"),
    ("token_file", "--token-file"),
    ("timeout", "--timeout"),
    ("count", "--count"),
];

/// Input bytes of `mrpc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HexBytes(pub Vec<u8>);

/// Parses a number written in decimal or as 0x-prefixed hexadecimal.
pub fn number(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    v.map_err(|_| format!("'{s}' is not a number (decimal or 0x...)"))
}

fn ms(s: &str) -> Result<u32, String> {
    number(s)
}

fn count(s: &str) -> Result<u32, String> {
    number(s)
}

/// Longest `--block-timeout`, in seconds.
pub const MAX_BLOCK_TIMEOUT_S: u32 = 3600;

fn block_secs(s: &str) -> Result<u32, String> {
    let n = number(s)?;
    if n > MAX_BLOCK_TIMEOUT_S {
        return Err(format!("{n} s is more than {MAX_BLOCK_TIMEOUT_S} s"));
    }
    Ok(n)
}

fn out_len(s: &str) -> Result<u32, String> {
    let n = number(s)?;
    if n as usize > pcifab_uapi::MRPC_MAX_DATA {
        return Err(format!(
            "{n} is more than {} bytes",
            pcifab_uapi::MRPC_MAX_DATA
        ));
    }
    Ok(n)
}

fn interval(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds (e.g. 1, 0.5)"))?;
    if !(0.1..=3600.0).contains(&v) {
        return Err(format!("{s} s is outside 0.1 to 3600 s"));
    }
    Ok(v)
}

/// A host or port number: 0 to 254 (255 means "any" in the uAPI).
pub fn host_u8(s: &str) -> Result<u8, String> {
    u8::try_from(number(s)?)
        .ok()
        .filter(|n| *n < 0xff)
        .ok_or_else(|| format!("'{s}' is out of range (0 to 254)"))
}

/// Parses a function id (PDFID): a number up to 0xffff, decimal or 0x hex.
pub fn pdfid(s: &str) -> Result<u16, String> {
    u16::try_from(number(s).map_err(|e| format!("PDFID {e}"))?)
        .map_err(|_| format!("PDFID '{s}' is larger than 0xffff"))
}

/// Checks the functions of one `bind`: 1 to [`pcifab_uapi::BIND_MAX_PDFIDS`], none twice.
pub fn bind_list(pdfids: &[u16]) -> Result<(), String> {
    let max = pcifab_uapi::BIND_MAX_PDFIDS;
    if pdfids.is_empty() {
        return Err("name the function to bind (a PDFID, e.g. 0x0300)".into());
    }
    if pdfids.len() > max {
        return Err(format!(
            "{} functions named: at most {max} bind together as one multi-function device",
            pdfids.len()
        ));
    }
    for (i, p) in pdfids.iter().enumerate() {
        if pdfids[..i].contains(p) {
            return Err(format!(
                "function {p:#06x} is named twice: each function of the list binds once"
            ));
        }
    }
    Ok(())
}

/// Parses hex bytes ("0a0b0c", spaces and colons allowed).
pub fn hex_bytes(s: &str) -> Result<HexBytes, String> {
    let digits: Vec<u8> = s.bytes().filter(|b| !matches!(b, b' ' | b':')).collect();
    if digits.len() % 2 != 0 {
        return Err(format!("'{s}' has an odd number of hex digits"));
    }
    let bytes = digits
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("'{s}' is not hex bytes"))
        })
        .collect::<Result<Vec<u8>, String>>()?;
    if bytes.len() > pcifab_uapi::MRPC_MAX_DATA {
        return Err(format!(
            "{} bytes of input, at most {}",
            bytes.len(),
            pcifab_uapi::MRPC_MAX_DATA
        ));
    }
    Ok(HexBytes(bytes))
}

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Parses a size, offset or address: decimal or 0x hex, optionally with a binary K, M or G
/// suffix (`16M`, `0x1000`, `4k`).
pub fn size(s: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "'{s}' is not a size (decimal or 0x hex, optionally with K, M or G: 16M, 0x1000, 4k)"
        )
    };
    let (digits, unit) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], KIB),
        Some(b'm' | b'M') => (&s[..s.len() - 1], MIB),
        Some(b'g' | b'G') => (&s[..s.len() - 1], GIB),
        _ => (s, 1),
    };
    let n = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(hex, 16).map_err(|_| bad())?
        }
        Some(_) => return Err(bad()),
        None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            digits.parse::<u64>().map_err(|_| bad())?
        }
        None => return Err(bad()),
    };
    n.checked_mul(unit)
        .ok_or_else(|| format!("'{s}' does not fit in 64 bits"))
}

fn window_off(s: &str) -> Result<u64, String> {
    if s.eq_ignore_ascii_case("any") {
        Ok(pcifab_uapi::ROUTE_ANY_WINDOW)
    } else {
        size(s)
    }
}

/// One end of a copy, as the command line names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// `PDFID:OFF`: the function's device memory at OFF, through a route.
    Function { pdfid: u16, off: u64 },
    /// `file:PATH`: host memory, read from or written to PATH.
    File(PathBuf),
    /// `iova:ADDR`: a raw bus address.
    Iova(u64),
    /// `peer:HFID:SLOT:OFF`: the buffer peer host HFID registered for this host in SLOT, at
    /// OFF (a destination only; through the switch's DMA endpoint).
    Peer { hfid: u16, slot: u8, off: u64 },
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Function { pdfid, off } => write!(f, "{pdfid:#06x}:{off:#x}"),
            End::File(p) => write!(f, "file:{}", p.display()),
            End::Iova(a) => write!(f, "iova:{a:#x}"),
            End::Peer { hfid, slot, off } => write!(f, "peer:{hfid:#06x}:{slot}:{off:#x}"),
        }
    }
}

/// Parses an end of a copy: `PDFID:OFF`, `file:PATH`, `iova:ADDR` or `peer:HFID:SLOT:OFF`.
pub fn end(s: &str) -> Result<End, String> {
    let context = |e: String| format!("'{s}': {e}");
    if let Some(rest) = s.strip_prefix("peer:") {
        let parts: Vec<&str> = rest.split(':').collect();
        let [h, sl, off] = parts[..] else {
            return Err(format!(
                "'{s}': write peer:HFID:SLOT:OFF (the peer host's HFID, the slot it registered \
                 the buffer in, the offset in it), e.g. peer:0x0a02:0:0"
            ));
        };
        let hfid = u16::try_from(size(h).map_err(context)?)
            .map_err(|_| context(format!("HFID {h} is larger than 0xffff")))?;
        let slot = match size(sl).map_err(context)? {
            n if n < u64::from(pcifab_uapi::P2P_PEER_SLOTS) => n as u8,
            n => return Err(context(format!("slot {n}: a peer has slots 0 to 5"))),
        };
        return Ok(End::Peer {
            hfid,
            slot,
            off: size(off).map_err(context)?,
        });
    }
    if let Some(path) = s.strip_prefix("file:") {
        if path.is_empty() {
            return Err(format!("'{s}' needs a path after 'file:'"));
        }
        return Ok(End::File(PathBuf::from(path)));
    }
    if let Some(addr) = s.strip_prefix("iova:") {
        return Ok(End::Iova(size(addr).map_err(context)?));
    }
    let (f, off) = s.split_once(':').ok_or_else(|| {
        format!(
            "'{s}' is not an end: write PDFID:OFF (device memory, e.g. 0x0300:0), file:PATH or \
             iova:ADDR"
        )
    })?;
    Ok(End::Function {
        pdfid: pdfid(f).map_err(context)?,
        off: size(off).map_err(context)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes() {
        assert_eq!(size("16M").ok(), Some(16 << 20));
        assert_eq!(size("0x1000").ok(), Some(0x1000));
        assert_eq!(size("4k").ok(), Some(4096));
        assert_eq!(size("1g").ok(), Some(1 << 30));
        assert_eq!(size("0x10M").ok(), Some(16 << 20));
        assert_eq!(size("0").ok(), Some(0));
        assert_eq!(size("0XFF").ok(), Some(255));
        for bad in [
            "",
            "k",
            "0x",
            "0xk",
            "-1",
            "1.5M",
            "16 M",
            "16MB",
            "+4",
            "1T",
            "99999999999999999999",
            "17179869184G",
        ] {
            assert!(size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ends() {
        assert_eq!(
            end("0x0300:16M").ok(),
            Some(End::Function {
                pdfid: 0x300,
                off: 16 << 20
            })
        );
        assert_eq!(
            end("file:/tmp/a:b").ok(),
            Some(End::File(PathBuf::from("/tmp/a:b")))
        );
        assert_eq!(end("iova:0x80000000").ok(), Some(End::Iova(0x8000_0000)));
        assert_eq!(
            end("peer:0x0a02:5:0x100").ok(),
            Some(End::Peer {
                hfid: 0x0a02,
                slot: 5,
                off: 0x100
            })
        );
        for bad in [
            "peer:",
            "peer:0x0a02:6:0",
            "peer:0x10000:0:0",
            "peer:0x0a02:0",
            "peer:x:0:0",
        ] {
            assert!(end(bad).is_err(), "{bad}");
        }
        for bad in [
            "0x0300",
            "file:",
            "iova:",
            "iova:zz",
            "0x10000:0",
            "0x0300:",
            "gpu:0",
            ":0x1000",
        ] {
            let e = end(bad).err().unwrap_or_else(|| panic!("{bad:?}"));
            assert!(e.contains(bad), "{bad}: {e}");
        }
        for s in ["0x0300:0x1000", "file:/tmp/x", "iova:0x80000000"] {
            assert_eq!(end(s).ok().map(|e| e.to_string()).as_deref(), Some(s));
        }
    }

    #[test]
    fn hex_and_numbers() {
        assert_eq!(hex_bytes("0a:0b 0c").ok(), Some(HexBytes(vec![10, 11, 12])));
        assert!(hex_bytes("abc").is_err());
        assert!(hex_bytes("zz").is_err());
        assert_eq!(number("0x41").ok(), Some(0x41));
        assert_eq!(number("65").ok(), Some(65));
        assert_eq!(pdfid("0x0300").ok(), Some(0x300));
        assert!(pdfid("0x10000").is_err());
        assert!(host_u8("255").is_err());
        assert!(interval("0").is_err() && interval("0.5").is_ok());
    }

    #[test]
    fn bind_lists() {
        assert!(bind_list(&[0x300]).is_ok());
        assert!(bind_list(&[0x401, 0x402, 0x403, 0x404, 0x405, 0x406, 0x407, 0x408]).is_ok());
        let e = bind_list(&[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap_err();
        assert!(e.contains("9 functions") && e.contains("at most 8"), "{e}");
        let e = bind_list(&[0x401, 0x402, 0x401]).unwrap_err();
        assert!(e.contains("0x0401 is named twice"), "{e}");
        assert!(bind_list(&[]).is_err());
    }
}
