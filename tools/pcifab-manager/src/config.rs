// SPDX-License-Identifier: GPL-2.0-only

//! The manager's configuration file (TOML), described in `Documentation/manager.rst`.

use serde::{Deserialize, Serialize};

/// How a pool shares its devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Whole-device leases only: one host holds the PF, its VFs stay free.
    Whole,
    /// VF leases only: the VFs of one device go to different hosts at once.
    Partition,
    /// Whole-device leases shared in turn: the PF moves between its sharers every `slice_s`.
    TimeSlice,
    /// Whole-device and VF leases from the same devices, decided per request.
    Hybrid,
}

impl Mode {
    /// Whether whole-GPU requests may use this pool.
    pub fn whole(self) -> bool {
        matches!(self, Mode::Whole | Mode::TimeSlice | Mode::Hybrid)
    }
    /// Whether VF requests may use this pool.
    pub fn vfs(self) -> bool {
        matches!(self, Mode::Partition | Mode::Hybrid)
    }
}

/// One device (a PF and its VFs) of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// PDFID of the PF.
    pub pf: u16,
    /// PDFIDs of its VFs; empty: taken from the driver's inventory at start.
    #[serde(default)]
    pub vfs: Vec<u16>,
    /// Profile name its VFs are requested by (`--profile`).
    #[serde(default = "default_profile")]
    pub profile: String,
}

fn default_profile() -> String {
    "default".into()
}

/// A pool of devices with one sharing mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    pub mode: Mode,
    /// Time-slice length (time-slice pools).
    #[serde(default = "default_slice")]
    pub slice_s: u64,
    /// Most leases sharing one device (time-slice pools).
    #[serde(default = "default_sharers")]
    pub max_sharers: usize,
    /// Erase every device (a drive's whole capacity) after each lease on it ends, before
    /// anyone else may have it (whole pools only; `Documentation/manager.rst`, "Scrubbing").
    #[serde(default)]
    pub scrub: bool,
    /// The principals that alone may lease from this pool; a principal named here leases
    /// from no pool that does not name it (`Documentation/manager.rst`, "Reserved pools").
    /// Empty: any principal may, and none is bound to it. Like `[[principals]]`, taken from
    /// the file at every start, never stored with the state.
    #[serde(default, skip_serializing)]
    pub principals: Vec<String>,
    pub devices: Vec<DeviceConfig>,
}

/// The local socket's root user, as a principal (always `admin`; `auth`).
pub const ROOT_PRINCIPAL: &str = "root";

/// Gives the pools of a stored state the `principals` of the configuration's pools of the
/// same name (the reservation is the file's, as the principals are).
pub fn take_pool_principals(stored: &mut [PoolConfig], file: &[PoolConfig]) {
    for p in stored {
        p.principals = file
            .iter()
            .find(|f| f.name == p.name)
            .map(|f| f.principals.clone())
            .unwrap_or_default();
    }
}

fn default_slice() -> u64 {
    60
}
fn default_sharers() -> usize {
    4
}

/// Scheduling rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ManagerConfig {
    /// Hosts (switch partitions) 0..hosts may be given devices.
    pub hosts: u8,
    /// Highest request priority; requests have 0..=max_priority.
    pub max_priority: u32,
    /// Aging: a queued request's effective priority grows by one every `aging_s` seconds it
    /// waits (0 disables aging and with it the starvation bound).
    pub aging_s: u64,
    /// Lease length when a request names none.
    pub default_lease_s: u64,
    /// Longest lease; longer durations are cut to it. Part of the starvation bound.
    pub max_lease_s: u64,
    /// Most queued requests; more are refused.
    pub max_queue: usize,
    /// Most functions one host may hold (a PAX host has four logical downstream ports).
    pub max_functions_per_host: usize,
    /// Fair share: a tenant's recorded use (GPU-seconds) halves every `half_life_s` seconds
    /// (0: use is never forgotten).
    pub half_life_s: u64,
    /// The tenants requests may name (`[[manager.tenants]]`); a request naming none belongs
    /// to `default` (weight 1 unless listed here).
    pub tenants: Vec<TenantConfig>,
    /// The request log keeps at most this many entries (the oldest go first).
    pub log_max_entries: u64,
    /// The request log drops entries older than this many seconds (0: kept whatever their
    /// age, up to `log_max_entries`).
    pub log_max_age_s: u64,
}

/// The name of the tenant of requests that name none.
pub const DEFAULT_TENANT: &str = "default";

/// One tenant of the fair share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Its share relative to the other tenants' weights (at least 1).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Most functions its leases may hold at once; none: no limit but the pool's.
    #[serde(default)]
    pub quota: Option<usize>,
}

fn default_weight() -> u32 {
    1
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            hosts: 2,
            max_priority: 9,
            aging_s: 60,
            default_lease_s: 3600,
            max_lease_s: 86_400,
            max_queue: 10_000,
            max_functions_per_host: 4,
            half_life_s: 86_400,
            tenants: Vec::new(),
            log_max_entries: 100_000,
            log_max_age_s: 0,
        }
    }
}

/// Host failure handling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailoverConfig {
    /// A host that sent heartbeats and then none for this long is declared down (0: never).
    pub host_timeout_s: u64,
    /// Leases of a down host are reclaimed this long after it was declared down.
    pub reclaim_after_s: u64,
    /// Physical port of each host's upstream port, by partition (the driver executor reads
    /// these links as heartbeats); empty: the inventory's host ports in ascending port order
    /// are partitions 0, 1, ...
    pub host_ports: Vec<u8>,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            host_timeout_s: 30,
            reclaim_after_s: 10,
            host_ports: Vec::new(),
        }
    }
}

/// Telemetry thresholds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Seconds between two polls of every function (0: no polling).
    pub interval_s: u64,
    /// A PF at or above this temperature (degrees C) is unhealthy.
    pub max_temp_c: f64,
    /// A PF drawing more than this (mW) is unhealthy (0: no limit).
    pub max_power_mw: u32,
    /// Health flag bits (FUNCTION_TELEMETRY) that make a device unhealthy.
    pub health_mask: u32,
    /// Consecutive bad polls before a device is taken out of the pool.
    pub bad_samples: u32,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            interval_s: 5,
            max_temp_c: 95.0,
            max_power_mw: 0,
            health_mask: 0x7,
            bad_samples: 2,
        }
    }
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub manager: ManagerConfig,
    #[serde(default)]
    pub failover: FailoverConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// The network API; none: only the local socket. Taken from the file at every start,
    /// never stored with the state.
    #[serde(default, skip_serializing)]
    pub api: Option<ApiConfig>,
    /// Who may use the manager, and as what (the `auth` module); like `api`, never stored.
    #[serde(default, skip_serializing)]
    pub principals: Vec<PrincipalConfig>,
    /// High availability on etcd (`[ha]`); none: one manager with its redb database. Like
    /// `api`, never stored.
    #[serde(default, skip_serializing)]
    pub ha: Option<HaConfig>,
}

/// Several managers on one etcd cluster (`[ha]`, Documentation/manager.rst, "High
/// availability").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaConfig {
    /// etcd's client URLs, all `http://HOST:PORT` or all `https://HOST:PORT` (at least
    /// one; every member, best).
    pub endpoints: Vec<String>,
    /// This manager's name, unique among the managers of one fabric.
    pub node: String,
    /// Where clients reach this manager (its API URL or its control socket), shown to
    /// clients by the standbys.
    pub advertise: String,
    /// The leader's etcd lease: a leader that cannot renew it for this long is replaced.
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl_s: u64,
    /// The keys' prefix in etcd: one per fabric.
    #[serde(default = "default_ha_prefix")]
    pub prefix: String,
    /// Longest one etcd request may take before the next endpoint is tried.
    #[serde(default = "default_ha_timeout")]
    pub timeout_ms: u64,
    /// CA certificates (PEM) etcd's certificates must chain to: required by, and only
    /// for, `https://` endpoints.
    #[serde(default)]
    pub ca: Option<String>,
    /// This manager's certificate chain (PEM) for etcd's `--client-cert-auth`; with `key`.
    #[serde(default)]
    pub cert: Option<String>,
    /// The private key (PEM: PKCS#8, SEC1 or PKCS#1) of `cert`.
    #[serde(default)]
    pub key: Option<String>,
    /// An etcd user (etcd's authentication), with `password_file`.
    #[serde(default)]
    pub user: Option<String>,
    /// The file whose first line is the password of `user`.
    #[serde(default)]
    pub password_file: Option<String>,
}

impl HaConfig {
    /// Checks what serde cannot (the configuration's `[ha]`; `migrate --config` checks the
    /// same with the endpoints it was given).
    pub fn check(&self) -> Result<(), String> {
        let h = self;
        if h.endpoints.is_empty() {
            return Err(
                "[ha] endpoints: give etcd's client URLs (http://HOST:PORT or \
                        https://HOST:PORT)"
                    .into(),
            );
        }
        if let Some(e) = h
            .endpoints
            .iter()
            .find(|e| !e.starts_with("http://") && !e.starts_with("https://"))
        {
            return Err(format!(
                "[ha] endpoints: '{e}' is neither http://HOST:PORT nor https://HOST:PORT"
            ));
        }
        let tls = h.endpoints[0].starts_with("https://");
        if let Some(e) = h
            .endpoints
            .iter()
            .find(|e| e.starts_with("https://") != tls)
        {
            return Err(format!(
                "[ha] endpoints: '{e}' and '{}' mix http:// and https://: give every \
                 member of the cluster the same way",
                h.endpoints[0]
            ));
        }
        if tls && h.ca.is_none() {
            return Err(format!(
                "[ha] endpoints: '{}' is etcd over TLS, but [ha] ca is not set: set ca to \
                 the CA file (PEM) etcd's certificates chain to",
                h.endpoints[0]
            ));
        }
        if !tls && (h.ca.is_some() || h.cert.is_some() || h.key.is_some()) {
            return Err(format!(
                "[ha] ca, cert and key are for etcd over TLS, but endpoint '{}' is \
                 http://: give https:// endpoints, or drop these keys",
                h.endpoints[0]
            ));
        }
        if h.user.is_some() != h.password_file.is_some() {
            return Err(
                "[ha] user and password_file go together: set both (an etcd user \
                        and the file of its password) or neither"
                    .into(),
            );
        }
        if h.user.as_deref() == Some("") {
            return Err("[ha] user must not be empty".into());
        }
        if h.cert.is_some() != h.key.is_some() {
            return Err(
                "[ha] cert and key go together: set both (a client certificate \
                        and its key) or neither"
                    .into(),
            );
        }
        if h.node.is_empty() || h.advertise.is_empty() {
            return Err("[ha] node and advertise must not be empty".into());
        }
        if !(2..=3600).contains(&h.lease_ttl_s) {
            return Err("[ha] lease_ttl_s is 2 to 3600".into());
        }
        if !h.prefix.starts_with('/') || h.prefix.ends_with('/') {
            return Err(format!(
                "[ha] prefix '{}' must start with '/' and not end with one",
                h.prefix
            ));
        }
        if h.timeout_ms < 100 {
            return Err("[ha] timeout_ms is at least 100".into());
        }
        // A keepalive may wait out one member that does not answer (timeout_ms) and must
        // still reach another within the lease's TTL.
        let ttl_ms = h.lease_ttl_s.saturating_mul(1000);
        if h.timeout_ms.saturating_mul(2) >= ttl_ms {
            return Err(format!(
                "[ha] timeout_ms ({}) must be less than half of lease_ttl_s ({} s): a \
                 keepalive that waits out an etcd member that does not answer would leave \
                 no time to renew the leader's lease on another; lower timeout_ms to {} \
                 or less, or raise lease_ttl_s to {} or more",
                h.timeout_ms,
                h.lease_ttl_s,
                (ttl_ms - 1) / 2,
                h.timeout_ms.saturating_mul(2) / 1000 + 1
            ));
        }
        Ok(())
    }
}

fn default_lease_ttl() -> u64 {
    5
}
fn default_ha_prefix() -> String {
    "/pcifab".into()
}
fn default_ha_timeout() -> u64 {
    2000
}

/// The HTTPS API (`[api]`, Documentation/manager-api.rst).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// Address and port to listen on, e.g. `"10.0.0.1:8443"` or `"[::]:8443"`.
    pub listen: String,
    /// The server's certificate chain (PEM).
    pub cert: String,
    /// Its private key (PEM: PKCS#8, SEC1 or PKCS#1).
    pub key: String,
    /// CA certificates (PEM) that client certificates must chain to; none: bearer tokens
    /// only.
    #[serde(default)]
    pub client_ca: Option<String>,
    /// Largest request body in bytes (larger: 413).
    #[serde(default = "default_max_body")]
    pub max_body: usize,
    /// Seconds a client may take for the TLS handshake and for each request's head (and
    /// an idle connection may wait for its next request).
    #[serde(default = "default_client_timeout")]
    pub client_timeout_s: u64,
    /// Seconds a client may take to send a request's body, once its head is in.
    #[serde(default = "default_client_timeout")]
    pub body_timeout_s: u64,
    /// Most connections held at once; a new one beyond evicts a stalled one
    /// (the API's `conns` module).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most connections held at once from one peer address.
    #[serde(default = "default_max_connections_per_peer")]
    pub max_connections_per_peer: usize,
    /// The Redfish view's logins (`[api.redfish]`).
    #[serde(default)]
    pub redfish: RedfishConfig,
}

impl ApiConfig {
    /// The settings of `[api]` with `listen`, `cert` and `key` and every other key at its
    /// default.
    pub fn new(listen: &str, cert: &str, key: &str) -> Self {
        Self {
            listen: listen.into(),
            cert: cert.into(),
            key: key.into(),
            client_ca: None,
            max_body: default_max_body(),
            client_timeout_s: default_client_timeout(),
            body_timeout_s: default_client_timeout(),
            max_connections: default_max_connections(),
            max_connections_per_peer: default_max_connections_per_peer(),
            redfish: RedfishConfig::default(),
        }
    }
}

/// Redfish logins (`[api.redfish]`, Documentation/manager-api.rst "Redfish logins").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedfishConfig {
    /// The credentials file (users and their hashed passwords); none: no user may log in
    /// with a password (tokens and certificates still work).
    #[serde(default)]
    pub users: Option<String>,
    /// Seconds a session lives unused (30 to 86400, as Redfish's `SessionTimeout`).
    #[serde(default = "default_session_timeout")]
    pub session_timeout_s: u64,
}

impl Default for RedfishConfig {
    fn default() -> Self {
        Self {
            users: None,
            session_timeout_s: default_session_timeout(),
        }
    }
}

/// Seconds a Redfish session lives unused unless `session_timeout_s` says otherwise.
pub const SESSION_TIMEOUT_S: u64 = 1800;

fn default_session_timeout() -> u64 {
    SESSION_TIMEOUT_S
}

fn default_max_body() -> usize {
    64 * 1024
}
fn default_client_timeout() -> u64 {
    10
}
fn default_max_connections() -> usize {
    256
}
fn default_max_connections_per_peer() -> usize {
    32
}

impl Config {
    /// Parses and checks a configuration; the error names the problem.
    pub fn parse(text: &str) -> Result<Self, String> {
        let c: Config = toml::from_str(text).map_err(|e| format!("bad configuration: {e}"))?;
        c.check()?;
        Ok(c)
    }

    /// Reads and checks a configuration file.
    pub fn load(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read configuration {path}: {e}"))?;
        Self::parse(&text).map_err(|e| format!("{path}: {e}"))
    }

    /// Checks what serde cannot: names, duplicates, ranges.
    pub fn check(&self) -> Result<(), String> {
        if let Some(h) = &self.ha {
            h.check()?;
        }
        let m = &self.manager;
        if m.hosts == 0 {
            return Err("[manager] hosts must be at least 1".into());
        }
        if m.max_lease_s == 0 || m.default_lease_s == 0 {
            return Err("[manager] max_lease_s and default_lease_s must be at least 1".into());
        }
        if m.max_functions_per_host == 0 {
            return Err("[manager] max_functions_per_host must be at least 1".into());
        }
        if m.log_max_entries == 0 {
            return Err("[manager] log_max_entries must be at least 1".into());
        }
        let mut tenants = std::collections::BTreeSet::new();
        for t in &m.tenants {
            if t.name.is_empty() || t.name.len() > 64 {
                return Err("[[manager.tenants]] name must be 1 to 64 bytes".into());
            }
            if !tenants.insert(t.name.as_str()) {
                return Err(format!("tenant '{}' is defined twice", t.name));
            }
            if t.weight == 0 {
                return Err(format!(
                    "tenant '{}': weight must be at least 1 (weights are relative shares)",
                    t.name
                ));
            }
            if t.quota == Some(0) {
                return Err(format!(
                    "tenant '{}': quota must be at least 1 function (leave it out for no limit)",
                    t.name
                ));
            }
        }
        check_principals(
            &self.principals,
            m.hosts,
            &m.tenants.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        )?;
        if let Some(a) = &self.api {
            if a.max_body == 0
                || a.client_timeout_s == 0
                || a.body_timeout_s == 0
                || a.max_connections == 0
                || a.max_connections_per_peer == 0
            {
                return Err(
                    "[api] max_body, client_timeout_s, body_timeout_s, max_connections \
                            and max_connections_per_peer must be at least 1"
                        .into(),
                );
            }
            if !(30..=86400).contains(&a.redfish.session_timeout_s) {
                return Err("[api.redfish] session_timeout_s is 30 to 86400 seconds".into());
            }
        }
        let ports = &self.failover.host_ports;
        if !ports.is_empty() && ports.len() != usize::from(m.hosts) {
            return Err(format!(
                "[failover] host_ports names {} ports for {} hosts; give one per host or none",
                ports.len(),
                m.hosts
            ));
        }
        if ports.iter().any(|p| *p >= 64) {
            return Err("[failover] host_ports: physical ports are 0-63".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut names = std::collections::BTreeSet::new();
        for p in &self.pools {
            if !names.insert(p.name.as_str()) {
                return Err(format!("pool '{}' is defined twice", p.name));
            }
            if p.devices.is_empty() {
                return Err(format!("pool '{}' has no devices", p.name));
            }
            if p.mode == Mode::TimeSlice && (p.slice_s == 0 || p.max_sharers == 0) {
                return Err(format!(
                    "pool '{}': slice_s and max_sharers must be at least 1",
                    p.name
                ));
            }
            for n in &p.principals {
                if n != ROOT_PRINCIPAL && !self.principals.iter().any(|q| q.name == *n) {
                    return Err(format!(
                        "pool '{}': principals names '{n}', who is not one of [[principals]] \
                         (nor '{ROOT_PRINCIPAL}', the local socket's root)",
                        p.name
                    ));
                }
            }
            if p.scrub && p.mode != Mode::Whole {
                return Err(format!(
                    "pool '{}': scrub needs mode = \"whole\" (a device is erased between \
                     holders, so it must have one holder at a time)",
                    p.name
                ));
            }
            for d in &p.devices {
                for f in std::iter::once(&d.pf).chain(&d.vfs) {
                    if !seen.insert(*f) {
                        return Err(format!(
                            "function {f:#06x} appears twice in the pools (pool '{}')",
                            p.name
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

// ---- principals ------------------------------------------------------------------------

/// What a principal may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Admin,
    Tenant,
    Reader,
}

/// One principal of the configuration (`[[principals]]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalConfig {
    /// Its name: a client certificate's common name, and what the log and the leases show.
    pub name: String,
    pub role: Role,
    /// The hosts a tenant may request for (tenants only).
    #[serde(default)]
    pub hosts: Vec<u8>,
    /// The fair-share tenant (`[[manager.tenants]]`) its requests count against; none: a
    /// tenant of the principal's own name when one is configured, else `default`.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The other tenants a tenant principal may name in its requests and compositions
    /// (tenants only): a principal that acts for others, e.g. Slurm's hooks on behalf of the
    /// job's account (Documentation/slurm.rst, "Accounts and tenants"). Empty: its own only.
    #[serde(default)]
    pub acts_for: Vec<String>,
    /// The SHA-256 (hex) of its bearer token; none: no token.
    #[serde(default)]
    pub token_sha256: Option<String>,
    /// When the token stops being accepted (a TOML date-time with its offset, e.g.
    /// `2027-01-31T00:00:00Z`); none: never.
    #[serde(default)]
    pub token_expires: Option<toml::value::Datetime>,
    /// Local users (uids) who are this principal on the control socket.
    #[serde(default)]
    pub uids: Vec<u32>,
}

/// The Unix time of a TOML offset date-time; none for a local date or time without an
/// offset (which names no instant).
pub fn unix_time(d: &toml::value::Datetime) -> Option<u64> {
    let (date, time, offset) = (d.date?, d.time?, d.offset?);
    let (y, m, day) = (
        i64::from(date.year),
        i64::from(date.month),
        i64::from(date.day),
    );
    // Days from the civil date (Howard Hinnant's algorithm), 1970-01-01 being day 0.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let off_min = match offset {
        toml::value::Offset::Z => 0,
        toml::value::Offset::Custom { minutes } => i64::from(minutes),
    };
    let secs = days * 86_400
        + i64::from(time.hour) * 3600
        + i64::from(time.minute) * 60
        + i64::from(time.second.unwrap_or(0))
        - off_min * 60;
    u64::try_from(secs).ok()
}

/// The user id that is always `admin` on the local socket.
pub const ROOT_UID: u32 = 0;

/// Checks the principals of a configuration: unique names, uids and tokens, hosts only for
/// tenants and in range, tokens as 64 hex digits, tenants that exist.
pub fn check_principals(
    list: &[PrincipalConfig],
    hosts: u8,
    tenants: &[String],
) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    let mut uids = std::collections::BTreeSet::new();
    let mut tokens = std::collections::BTreeSet::new();
    for p in list {
        let what = format!("principal '{}'", p.name);
        if p.name.is_empty() || p.name.len() > 64 || p.name.chars().any(char::is_control) {
            return Err(format!("{what}: a name is 1 to 64 printable characters"));
        }
        if !names.insert(p.name.as_str()) {
            return Err(format!("{what} is named twice"));
        }
        match p.role {
            Role::Tenant if p.hosts.is_empty() => {
                return Err(format!(
                    "{what}: a tenant needs `hosts`, the hosts it may request for"
                ))
            }
            Role::Admin | Role::Reader if !p.hosts.is_empty() => {
                return Err(format!(
                    "{what}: `hosts` is for tenants; an {:?} is not bound to hosts",
                    p.role
                )
                .to_lowercase())
            }
            _ => {}
        }
        if let Some(h) = p.hosts.iter().find(|&&h| h >= hosts) {
            return Err(format!(
                "{what}: host {h} is not in this fabric (manager.hosts = {hosts})"
            ));
        }
        if let Some(t) = &p.tenant {
            if t != DEFAULT_TENANT && !tenants.contains(t) {
                return Err(format!(
                    "{what}: tenant '{t}' is not one of [[manager.tenants]]"
                ));
            }
        }
        if !p.acts_for.is_empty() && p.role != Role::Tenant {
            return Err(format!(
                "{what}: `acts_for` is for tenants; an {} may name any tenant already or none",
                match p.role {
                    Role::Admin => "admin",
                    _ => "reader",
                }
            ));
        }
        if let Some(t) = p
            .acts_for
            .iter()
            .find(|t| *t != DEFAULT_TENANT && !tenants.contains(t))
        {
            return Err(format!(
                "{what}: acts_for names tenant '{t}', which is not one of [[manager.tenants]]"
            ));
        }
        if let Some(e) = &p.token_expires {
            if p.token_sha256.is_none() {
                return Err(format!("{what}: token_expires is for a token_sha256"));
            }
            if unix_time(e).is_none() {
                return Err(format!(
                    "{what}: token_expires is a date and time with its offset, e.g. \
                         2027-01-31T00:00:00Z, not '{e}'"
                ));
            }
        }
        if let Some(t) = &p.token_sha256 {
            if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "{what}: token_sha256 is the token's SHA-256 in 64 hex digits \
                         (`printf %s TOKEN | sha256sum`)"
                ));
            }
            if !tokens.insert(t.to_ascii_lowercase()) {
                return Err(format!("{what}: its token is another principal's"));
            }
        }
        for u in &p.uids {
            if *u == ROOT_UID {
                return Err(format!("{what}: uid 0 is always admin on the local socket"));
            }
            if !uids.insert(*u) {
                return Err(format!("{what}: uid {u} is another principal's"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_example() {
        let c = Config::parse(
            r#"
            [manager]
            hosts = 3
            [[pools]]
            name = "gpus"
            mode = "hybrid"
            [[pools.devices]]
            pf = 0x0120
            vfs = [0x0121, 0x0122]
            profile = "half"
            "#,
        )
        .expect("parse");
        assert_eq!(c.manager.hosts, 3);
        assert_eq!(c.manager.aging_s, 60);
        assert_eq!(c.pools[0].mode, Mode::Hybrid);
        assert_eq!(c.pools[0].devices[0].vfs.len(), 2);
    }

    #[test]
    fn rejects_duplicates_and_typos() {
        let dup = r#"
            [[pools]]
            name = "a"
            mode = "whole"
            devices = [{ pf = 1 }, { pf = 1 }]
        "#;
        assert!(Config::parse(dup).unwrap_err().contains("twice"));
        assert!(Config::parse("[manager]\nhostz = 1\n").is_err());
        assert!(Config::parse("[failover]\nhost_ports = [0]\n")
            .unwrap_err()
            .contains("one per host"));
        let c = Config::parse("[failover]\nhost_ports = [8, 0]\n").expect("two hosts");
        assert_eq!(c.failover.host_ports, vec![8, 0]);
        assert!(Config::parse("[[pools]]\nname='a'\nmode='weird'\ndevices=[]\n").is_err());
    }

    #[test]
    fn scrub_is_off_by_default_and_needs_a_whole_pool() {
        let pool = |mode: &str, scrub: &str| {
            Config::parse(&format!(
                "[[pools]]\nname = 'drives'\nmode = '{mode}'\n{scrub}\n\
                 [[pools.devices]]\npf = 0x0500\n"
            ))
        };
        let c = pool("whole", "").expect("no scrub key");
        assert!(!c.pools[0].scrub);
        assert!(c.pools[0].devices[0].vfs.is_empty());
        assert!(pool("whole", "scrub = true").expect("scrub").pools[0].scrub);
        for mode in ["hybrid", "partition", "time-slice"] {
            let e = pool(mode, "scrub = true").unwrap_err();
            assert!(e.contains("scrub needs mode = \"whole\""), "{mode}: {e}");
        }
        assert!(pool("whole", "scrub = 1").is_err());
    }

    #[test]
    fn parses_tenants_and_checks_them() {
        let c = Config::parse(
            r#"
            [manager]
            half_life_s = 3600
            [[manager.tenants]]
            name = "vision"
            weight = 4
            quota = 8
            [[manager.tenants]]
            name = "nlp"
            "#,
        )
        .expect("parse");
        assert_eq!(c.manager.half_life_s, 3600);
        assert_eq!(
            c.manager.tenants,
            vec![
                TenantConfig {
                    name: "vision".into(),
                    weight: 4,
                    quota: Some(8)
                },
                TenantConfig {
                    name: "nlp".into(),
                    weight: 1,
                    quota: None
                }
            ]
        );
        assert_eq!(
            Config::parse("").expect("empty").manager.half_life_s,
            86_400
        );
        let bad = |t: &str| Config::parse(&format!("[[manager.tenants]]\n{t}\n")).unwrap_err();
        assert!(bad("name = 'a'\nweight = 0").contains("weight must be at least 1"));
        assert!(bad("name = 'a'\nquota = 0").contains("quota must be at least 1"));
        assert!(bad("name = ''").contains("1 to 64 bytes"));
        assert!(bad("name = 'a'\nshare = 2").contains("unknown field"));
        assert!(bad("name = 'a'\n[[manager.tenants]]\nname = 'a'").contains("twice"));
    }

    /// `[ha]`: its defaults, and each key's checks.
    #[test]
    fn ha_section_is_checked() {
        let with = |ha: &str| Config::parse(&format!("[manager]\nhosts = 2\n[ha]\n{ha}"));
        let ok = "endpoints = ['http://127.0.0.1:2379']\nnode = 'fm1'\nadvertise = 'x'\n";
        let h = with(ok).expect("minimal [ha]").ha.expect("ha");
        assert_eq!(
            (h.lease_ttl_s, h.prefix.as_str(), h.timeout_ms),
            (5, "/pcifab", 2000)
        );
        assert!(Config::parse("[manager]\nhosts = 2")
            .expect("no ha")
            .ha
            .is_none());
        let bad = |extra: &str, ha: &str| with(&format!("{ha}{extra}")).expect_err(extra);
        assert!(bad("", "endpoints = []\nnode = 'a'\nadvertise = 'x'").contains("endpoints"));
        // TLS: https:// needs a CA; the TLS keys need https://; cert and key go together.
        let tls = "endpoints = ['https://e:2379']\nnode = 'a'\nadvertise = 'x'\n";
        let e = bad("", tls);
        assert!(
            e.contains("'https://e:2379' is etcd over TLS") && e.contains("[ha] ca is not set"),
            "{e}"
        );
        let h = with(&format!("{tls}ca = '/c'\ncert = '/m.crt'\nkey = '/m.key'"))
            .expect("mutual TLS")
            .ha
            .expect("ha");
        assert_eq!(
            (h.ca.as_deref(), h.cert.as_deref(), h.key.as_deref()),
            (Some("/c"), Some("/m.crt"), Some("/m.key"))
        );
        with(&format!("{tls}ca = '/c'")).expect("TLS without a client certificate");
        assert!(bad("cert = '/m.crt'", &format!("{tls}ca = '/c'\n")).contains("go together"));
        assert!(bad("key = '/m.key'", &format!("{tls}ca = '/c'\n")).contains("go together"));
        assert!(bad("ca = '/c'", ok).contains("endpoint 'http://127.0.0.1:2379' is http://"));
        let mixed = "endpoints = ['https://e:2379', 'http://f:2379']\nnode = 'a'\nadvertise = 'x'";
        assert!(bad("", mixed).contains("mix http:// and https://"));
        assert!(bad("", &ok.replace("http://", "unix://")).contains("neither http"));
        // An etcd user: with its password file, over http:// or https://.
        let h = with(&format!("{ok}user = 'fm'\npassword_file = '/p'"))
            .expect("a user")
            .ha
            .expect("ha");
        assert_eq!(
            (h.user.as_deref(), h.password_file.as_deref()),
            (Some("fm"), Some("/p"))
        );
        assert!(bad("user = 'fm'", ok).contains("user and password_file go together"));
        assert!(bad("password_file = '/p'", ok).contains("go together"));
        assert!(bad("user = ''\npassword_file = '/p'", ok).contains("user must not be empty"));
        assert!(bad("lease_ttl_s = 1", ok).contains("lease_ttl_s"));
        assert!(bad("prefix = 'p/'", ok).contains("prefix"));
        assert!(bad("timeout_ms = 10", ok).contains("timeout_ms"));
        // Twice the timeout must fit in the lease's TTL, with room to spare.
        let e = bad("lease_ttl_s = 2\ntimeout_ms = 1000", ok);
        assert!(
            e.contains("timeout_ms (1000)")
                && e.contains("lease_ttl_s (2 s)")
                && e.contains("lower timeout_ms to 999 or less, or raise lease_ttl_s to 3 or more"),
            "{e}"
        );
        assert!(bad("timeout_ms = 2500", ok).contains("raise lease_ttl_s to 6"));
        let h = with(&format!("{ok}lease_ttl_s = 2\ntimeout_ms = 999"))
            .expect("just under half the TTL")
            .ha
            .expect("ha");
        assert_eq!((h.lease_ttl_s, h.timeout_ms), (2, 999));
        assert!(bad("leader = true", ok).contains("unknown field"));
        assert!(bad("", &ok.replace("'fm1'", "''")).contains("node"));
    }

    /// `[[pools]] principals`: names of `[[principals]]` or root; not stored with the state
    /// but taken from the file's pools by name.
    #[test]
    fn pool_principals_are_checked_and_taken_from_the_file() {
        let pool = |p: &str| {
            Config::parse(&format!(
                "[[pools]]\nname = 'slurm'\nmode = 'whole'\nprincipals = {p}\n\
                 [[pools.devices]]\npf = 0x100\n\
                 [[principals]]\nname = 'slurm'\nrole = 'tenant'\nhosts = [1]\n"
            ))
        };
        let c = pool("['slurm', 'root']").expect("known names");
        assert_eq!(c.pools[0].principals, ["slurm", "root"]);
        let e = pool("['slrum']").expect_err("unknown name");
        assert!(
            e.contains("pool 'slurm': principals names 'slrum'")
                && e.contains("not one of [[principals]]"),
            "{e}"
        );
        assert!(pool("[]").expect("empty").pools[0].principals.is_empty());
        let stored: Config = toml::from_str(&toml::to_string(&c).expect("ser")).expect("de");
        let mut pools = stored.pools;
        assert!(pools[0].principals.is_empty(), "stored with the state");
        take_pool_principals(&mut pools, &c.pools);
        assert_eq!(pools, c.pools);
    }
}
