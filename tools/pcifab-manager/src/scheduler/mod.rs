// SPDX-License-Identifier: GPL-2.0-only

//! The scheduler: pure and deterministic, no I/O, the clock passed in (`now`, seconds).
//!
//! It keeps the pool, the leases, the queue and the fabric as it wants it (`holders`: which
//! host each function is bound to). Every operation changes that state and queues the
//! [`Action`]s (bind, unbind, move) that bring the fabric there; the daemon takes them with
//! [`Scheduler::take_actions`] and hands them to an executor. The rules (ranking, aging and its
//! starvation bound, fair share, pre-emption, sharing modes, failover) are in
//! `Documentation/manager.rst`.
//!
//! A scheduling pass is incremental (`index.rs`): it looks at the first request of each class
//! that can be granted or pre-empt, in rank order, not at the whole queue. The full scan it
//! replaces ([`Scheduler::pass_full_scan`]) stays as the reference the randomized test
//! compares it with, and as the fallback while the clock is behind a queued request.
//!
//! The leases to pre-empt come from an ordered index of the pre-emptible leases and the
//! capacity counts (`preempt.rs`), not from a walk over the leases and the pool's devices;
//! that walk ([`Scheduler::victims_walk`]) stays as the reference, as the full scan does.

mod capacity;
mod compose;
mod fairshare;
mod index;
pub mod persist;
mod preempt;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use crate::config::{Config, Mode, DEFAULT_TENANT};
use capacity::{Capacity, DeviceLevels};
pub use compose::{Composed, Plan};
pub use fairshare::Usage;
use index::{after_bound, Meta, QueueIndex, RankKey};
use preempt::PreemptKey;

pub type Host = u8;
pub type Pdfid = u16;
/// Seconds (the daemon uses the Unix time; tests any clock).
pub type Secs = u64;

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Want {
    /// `count` whole devices: a PF whose VFs are all free.
    Gpus { count: u32 },
    /// `count` VFs, of devices of `profile` if given.
    Vfs {
        count: u32,
        #[serde(default)]
        profile: Option<String>,
    },
}

/// A request as a client makes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    pub host: Host,
    pub want: Want,
    pub priority: u32,
    /// Lease length; none: the configured default. Cut to `max_lease_s`.
    #[serde(default)]
    pub duration_s: Option<u64>,
    /// The lease may be pre-empted by a request of higher priority.
    #[serde(default)]
    pub preemptible_by_higher: bool,
    /// The lease may be moved to another device when its device fails (default yes).
    #[serde(default = "yes")]
    pub migratable: bool,
    /// Only this pool; none: the first pool whose mode fits.
    #[serde(default)]
    pub pool: Option<String>,
    /// The tenant (`[[manager.tenants]]`) whose fair share and quota the request counts
    /// against; none: the tenant `default`.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The client's label for the request (e.g. `slurm-job-42`, the job it is for): shown
    /// with its queue entry and lease, so a client finds what it asked for without the id.
    /// 1 to 128 characters of `A-Z a-z 0-9 . _ : -`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The principal that asked (set by the manager from the caller's credentials, never
    /// taken from the caller); none in states stored before principals existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl RequestSpec {
    /// The tenant's name (`default` for none).
    pub fn tenant_name(&self) -> &str {
        self.tenant.as_deref().unwrap_or(DEFAULT_TENANT)
    }
}

fn yes() -> bool {
    true
}

/// Whether `t` is a request's tag: 1 to 128 characters of `A-Z a-z 0-9 . _ : -`.
pub fn valid_tag(t: &str) -> bool {
    (1..=128).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// A queued request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    pub id: u64,
    pub spec: RequestSpec,
    /// When the client asked.
    pub submitted: Secs,
    /// Where its wait (and aging) counts from: `submitted`, or when it was queued again
    /// after losing a lease.
    pub enqueued: Secs,
    /// Seconds of lease it still needs.
    pub duration_s: u64,
}

/// One function a lease holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Unit {
    /// Index into [`Scheduler::devices`].
    pub device: usize,
    /// The PF (whole-device leases) or the VF.
    pub pdfid: Pdfid,
}

/// A granted request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The request's id.
    pub id: u64,
    pub spec: RequestSpec,
    pub pool: usize,
    pub submitted: Secs,
    pub granted_at: Secs,
    pub expires_at: Secs,
    pub units: Vec<Unit>,
    /// A time-sliced lease: its devices rotate between their sharers.
    pub sliced: bool,
}

/// One device of a pool, as the scheduler tracks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub pool: usize,
    pub pf: Pdfid,
    pub vfs: Vec<Pdfid>,
    pub profile: String,
    /// None: in the pool; Some(reason): taken out.
    pub unhealthy: Option<String>,
    /// Leases holding the whole device: at most one, or the sharers of a time-sliced device.
    pub whole: Vec<u64>,
    /// The lease holding each VF.
    pub vf_lease: Vec<Option<u64>>,
    /// Time slicing: the sharer whose host holds the PF now, and since when.
    pub resident: Option<u64>,
    pub slice_start: Secs,
    /// A scrub pool's device whose last lease ended: it is out of the pool until the daemon
    /// has erased it (`pending`), or for good when that failed (`failed`, see `unhealthy`).
    #[serde(default)]
    pub scrub: Option<Scrub>,
}

/// Where a device of a scrub pool is between two holders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scrub {
    /// To be erased before it is granted again.
    Pending,
    /// Erasing it failed: out of the pool until an operator puts it back (`set-health`
    /// healthy), which erases it again first.
    Failed,
}

impl Device {
    fn vf_used(&self) -> usize {
        self.vf_lease.iter().filter(|l| l.is_some()).count()
    }

    /// Whether it may be granted: healthy and not waiting for (or failed) its scrub.
    pub fn in_pool(&self) -> bool {
        self.unhealthy.is_none() && self.scrub.is_none()
    }
}

/// A change of the fabric for an executor to apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    Bind { pdfid: Pdfid, host: Host },
    Unbind { pdfid: Pdfid, host: Host },
    Move { pdfid: Pdfid, from: Host, to: Host },
}

/// Something a host should know about its leases (read with the `events` request).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub seq: u64,
    pub at: Secs,
    pub host: Host,
    pub lease: u64,
    /// granted, released, expired, preempted, moved, revoked, reclaimed, slice-in, slice-out,
    /// cancelled.
    pub kind: String,
    pub message: String,
}

/// Per-host failover state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    /// Last heartbeat; none: the host never sent one (it is never timed out).
    pub last_seen: Option<Secs>,
    /// Declared down at.
    pub down_since: Option<Secs>,
    /// Declared down by a `host-down` request (not by a heartbeat time-out): the host's link
    /// being up does not cancel it, only a heartbeat from its agent does.
    #[serde(default)]
    pub declared: bool,
}

/// A request the scheduler will not take, with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What became of a submitted request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    pub id: u64,
    /// Granted at once (its lease has the same id).
    pub granted: bool,
    /// Position in the queue (0 first) when not granted.
    pub position: Option<usize>,
}

/// A hash of what a request asks for and where (requests of one shape fit alike).
/// The hosts and tenants (those with a quota) of promoted requests passed over in a pass
/// because their own host or tenant is full: nothing later in the pass is granted to them
/// (or pre-empts for them), so the room those requests wait for only grows.
#[derive(Default)]
struct Holds {
    hosts: BTreeSet<Host>,
    tenants: BTreeSet<String>,
}

impl Holds {
    /// Holds `host`, and `tenant` if it has a quota (without one it never lacks room).
    fn hold(&mut self, host: Host, tenant: &str, has_quota: bool) {
        self.hosts.insert(host);
        if has_quota {
            self.tenants.insert(tenant.to_string());
        }
    }

    fn holds(&self, host: Host, tenant: &str) -> bool {
        self.hosts.contains(&host) || self.tenants.contains(tenant)
    }
}

fn shape_of(spec: &RequestSpec, class: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    spec.want.hash(&mut h);
    spec.pool.hash(&mut h);
    class.hash(&mut h);
    h.finish()
}

/// Most notices kept.
const MAX_NOTICES: usize = 4096;

/// The scheduler's whole state; serialisable, so the daemon can store it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scheduler {
    pub config: Config,
    pub devices: Vec<Device>,
    /// The fabric as the scheduler wants it: function -> host.
    pub holders: BTreeMap<Pdfid, Host>,
    pub leases: BTreeMap<u64, Lease>,
    pub queue: Vec<Queued>,
    pub hosts: BTreeMap<Host, HostState>,
    /// The last `MAX_NOTICES` notices (a ring: dropping the oldest is O(1)).
    pub notices: VecDeque<Notice>,
    pub next_id: u64,
    pub next_notice: u64,
    /// Scheduling passes run (statistics, not stored) and requests granted.
    #[serde(skip)]
    pub passes: u64,
    pub grants: u64,
    /// Each tenant's use, for the fair share and the quotas.
    #[serde(default)]
    pub usage: BTreeMap<String, Usage>,
    #[serde(skip)]
    actions: Vec<Action>,
    /// Indexes and counters derived from the state (rebuilt after loading).
    #[serde(skip)]
    derived: Derived,
    /// Tests: every pass is the full scan (the reference model).
    #[cfg(test)]
    #[serde(skip)]
    pub(crate) full_scan: bool,
}

/// What the scheduler derives from its state to decide fast: the queue's indexes and the
/// functions each host holds. Not stored; equal whatever it holds (it is a cache).
#[derive(Clone, Debug, Default)]
struct Derived {
    built: bool,
    /// A pass is running: requests queued again now are hidden from it.
    in_pass: bool,
    hidden: Vec<u64>,
    /// Functions held per host (index: host).
    held: Vec<usize>,
    index: QueueIndex,
    /// Free and pre-emptible capacity per pool.
    capacity: Capacity,
    /// The running leases that allow pre-emption, in the order victims are chosen in
    /// (`preempt.rs`).
    preemptible: BTreeSet<PreemptKey>,
    /// What each pool holds, healthy or not (its devices do not change).
    sizes: Vec<PoolSize>,
    /// Entries examined and tree operations, over the scheduler's life (see `ops`).
    ops: u64,
}

/// A pool's devices and VFs (all, and by profile).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PoolSize {
    devices: usize,
    vfs: usize,
    vfs_by_profile: BTreeMap<String, usize>,
}

impl PartialEq for Derived {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Scheduler {
    /// A scheduler with every pool device free and healthy.
    pub fn new(config: Config) -> Self {
        let mut devices = Vec::new();
        for (pi, p) in config.pools.iter().enumerate() {
            for d in &p.devices {
                devices.push(Device {
                    pool: pi,
                    pf: d.pf,
                    vfs: d.vfs.clone(),
                    profile: d.profile.clone(),
                    unhealthy: None,
                    whole: Vec::new(),
                    vf_lease: vec![None; d.vfs.len()],
                    resident: None,
                    slice_start: 0,
                    scrub: None,
                });
            }
        }
        Self {
            config,
            devices,
            holders: BTreeMap::new(),
            leases: BTreeMap::new(),
            queue: Vec::new(),
            hosts: BTreeMap::new(),
            notices: VecDeque::new(),
            next_id: 1,
            next_notice: 1,
            passes: 0,
            grants: 0,
            usage: BTreeMap::new(),
            actions: Vec::new(),
            derived: Derived::default(),
            #[cfg(test)]
            full_scan: false,
        }
    }

    /// Entries examined and tree operations of the incremental passes and the queue's
    /// indexes so far: the cost measure of `pcifab-manager-bench` and its test.
    pub fn ops(&self) -> u64 {
        self.derived.ops + self.derived.index.ops
    }

    // ---- tenants ----------------------------------------------------------------------

    /// The tenants: the configured ones in order, then `default` if not configured.
    pub fn tenant_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .config
            .manager
            .tenants
            .iter()
            .map(|t| t.name.clone())
            .collect();
        if !v.iter().any(|n| n == DEFAULT_TENANT) {
            v.push(DEFAULT_TENANT.into());
        }
        v
    }

    fn tenant_config(&self, name: &str) -> Option<&crate::config::TenantConfig> {
        self.config.manager.tenants.iter().find(|t| t.name == name)
    }

    /// Each tenant's fair-share factor at `now`, in `tenant_names` order.
    pub fn fair_share_factors(&self, now: Secs) -> Vec<f64> {
        if self.derived.built && self.tenants_are(&self.derived.index.tenants) {
            return self.factors_of(&self.derived.index.tenants, now);
        }
        self.factors_of(&self.tenant_names(), now)
    }

    /// Whether `names` is `tenant_names()` (without building it).
    fn tenants_are(&self, names: &[String]) -> bool {
        let conf = &self.config.manager.tenants;
        let has_default = conf.iter().any(|t| t.name == DEFAULT_TENANT);
        names.len() == conf.len() + usize::from(!has_default)
            && conf.iter().zip(names).all(|(t, n)| t.name == *n)
            && (has_default || names.last().is_some_and(|n| n == DEFAULT_TENANT))
    }

    fn factors_of(&self, names: &[String], now: Secs) -> Vec<f64> {
        let hl = self.config.manager.half_life_s;
        let weights: Vec<u32> = names
            .iter()
            .map(|n| self.tenant_config(n).map_or(1, |t| t.weight))
            .collect();
        let used: Vec<f64> = names
            .iter()
            .map(|n| self.usage.get(n).map_or(0.0, |u| u.decayed_at(now, hl)))
            .collect();
        fairshare::factors(&weights, &used)
    }

    fn tenant_index(names: &[String], spec: &RequestSpec) -> usize {
        let n = spec.tenant_name();
        names
            .iter()
            .position(|t| t == n)
            .or_else(|| names.iter().position(|t| t == DEFAULT_TENANT))
            .unwrap_or(0)
    }

    /// GPUs a unit counts for: a whole device 1, a VF 1/VFs of its device.
    fn unit_gpus(&self, u: Unit) -> f64 {
        let d = &self.devices[u.device];
        if u.pdfid == d.pf || d.vfs.is_empty() {
            1.0
        } else {
            1.0 / d.vfs.len() as f64
        }
    }

    /// A lease of `host` and `tenant` now holds `units` more (`sign` 1) or fewer (-1).
    fn account(&mut self, host: Host, tenant: &str, units: &[Unit], sign: isize, now: Secs) {
        let gpus: f64 = units.iter().map(|u| self.unit_gpus(*u)).sum();
        let n = units.len();
        if self.derived.built {
            let h = &mut self.derived.held[usize::from(host)];
            *h = if sign > 0 {
                *h + n
            } else {
                h.saturating_sub(n)
            };
        }
        let hl = self.config.manager.half_life_s;
        self.usage.entry(tenant.to_string()).or_default().charge(
            now,
            hl,
            sign as f64 * gpus,
            sign * n as isize,
        );
    }

    /// Functions the leases of `tenant` not in `ignore` hold.
    fn tenant_units(&self, tenant: &str, ignore: &BTreeSet<u64>) -> usize {
        let held = self.usage.get(tenant).map_or(0, |u| u.functions);
        let gone: usize = ignore
            .iter()
            .filter_map(|id| self.leases.get(id))
            .filter(|l| l.spec.tenant_name() == tenant)
            .map(|l| l.units.len())
            .sum();
        held.saturating_sub(gone)
    }

    /// Whether the request's host and tenant may hold it (leases in `ignore` counted gone).
    fn room(&self, spec: &RequestSpec, ignore: &BTreeSet<u64>) -> bool {
        let need = Self::need(spec);
        if self.host_units(spec.host, ignore) + need > self.config.manager.max_functions_per_host {
            return false;
        }
        let t = spec.tenant_name();
        self.tenant_config(t)
            .and_then(|c| c.quota)
            .is_none_or(|q| self.tenant_units(t, ignore) + need <= q)
    }

    // ---- the queue --------------------------------------------------------------------

    /// Builds the indexes from the state, if they are missing or stale.
    fn sync(&mut self, now: Secs) {
        let m = &self.config.manager;
        let idx = &self.derived.index;
        let fresh = self.derived.built
            && idx.aging == m.aging_s
            && idx.max_prio == m.max_priority
            && self.tenants_are(&idx.tenants)
            && now >= idx.last_now
            && idx.len() == self.queue.len();
        if !fresh {
            let names = self.tenant_names();
            let ops = self.ops();
            let mut d = Derived {
                built: true,
                held: vec![0; 256],
                index: QueueIndex::new(m.aging_s, m.max_priority, names),
                ..Derived::default()
            };
            d.index.last_now = now;
            for l in self.leases.values() {
                d.held[usize::from(l.spec.host)] += l.units.len();
            }
            for (pos, q) in self.queue.iter().enumerate() {
                let m = self.meta_of(&mut d.index, q, pos, false);
                d.index.insert(q.id, m);
            }
            d.capacity = self.capacity_scan();
            d.preemptible = self.preemptible_scan();
            d.sizes = self.sizes_scan();
            d.ops = ops;
            self.derived = d;
        }
        self.derived.index.sweep(now);
    }

    fn meta_of(&self, index: &mut QueueIndex, q: &Queued, pos: usize, hidden: bool) -> Meta {
        let shape = index.shape_id(&q.spec, self.admission_class(q.spec.owner.as_deref()));
        if index.shape_pools.len() <= shape {
            index.shape_pools.push(self.pools_for(&q.spec));
        }
        Meta {
            pos,
            enq: q.enqueued,
            prio: q.spec.priority,
            tenant: Self::tenant_index(&index.tenants, &q.spec),
            shape,
            host: q.spec.host,
            promoted: false,
            hidden,
        }
    }

    /// Adds a request to the queue (and its indexes).
    fn enqueue(&mut self, q: Queued) {
        if self.derived.built {
            let hidden = self.derived.in_pass;
            let mut index = std::mem::take(&mut self.derived.index);
            let m = self.meta_of(&mut index, &q, self.queue.len(), hidden);
            index.insert(q.id, m);
            self.derived.index = index;
            if hidden {
                self.derived.hidden.push(q.id);
            }
        }
        self.queue.push(q);
    }

    /// Takes a request out of the queue (and its indexes).
    fn dequeue(&mut self, id: u64) -> Option<Queued> {
        if !self.derived.built {
            let i = self.queue.iter().position(|q| q.id == id)?;
            return Some(self.queue.remove(i));
        }
        let m = self.derived.index.remove(id)?;
        let q = self.queue.swap_remove(m.pos);
        if let Some(moved) = self.queue.get(m.pos) {
            if let Some(mm) = self.derived.index.meta.get_mut(&moved.id) {
                mm.pos = m.pos;
            }
        }
        Some(q)
    }

    /// The fabric changes decided since the last call, in the order to apply them.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    fn mode(&self, pool: usize) -> Mode {
        self.config.pools[pool].mode
    }

    fn notice(&mut self, now: Secs, host: Host, lease: u64, kind: &str, message: String) {
        self.notices.push_back(Notice {
            seq: self.next_notice,
            at: now,
            host,
            lease,
            kind: kind.into(),
            message,
        });
        self.next_notice += 1;
        while self.notices.len() > MAX_NOTICES {
            self.notices.pop_front();
        }
    }

    /// Notices for `host` (all hosts if none) with a sequence number above `since`.
    pub fn notices_for(&self, host: Option<Host>, since: u64) -> Vec<Notice> {
        self.notices
            .iter()
            .filter(|n| n.seq > since && host.is_none_or(|h| n.host == h))
            .cloned()
            .collect()
    }

    // ---- the fabric -------------------------------------------------------------------

    fn bind(&mut self, pdfid: Pdfid, host: Host) {
        self.holders.insert(pdfid, host);
        self.actions.push(Action::Bind { pdfid, host });
    }

    fn unbind(&mut self, pdfid: Pdfid) {
        if let Some(host) = self.holders.remove(&pdfid) {
            self.actions.push(Action::Unbind { pdfid, host });
        }
    }

    fn move_to(&mut self, pdfid: Pdfid, to: Host) {
        match self.holders.insert(pdfid, to) {
            Some(from) if from == to => {}
            Some(from) => self.actions.push(Action::Move { pdfid, from, to }),
            None => self.actions.push(Action::Bind { pdfid, host: to }),
        }
    }

    // ---- requests ---------------------------------------------------------------------

    /// Whether pool `p` admits requests of principal `owner` (`[[pools]] principals`): a
    /// pool that names principals admits only them; a principal named by any pool leases
    /// only from the pools that name it. No owner is no principal.
    fn admits(&self, p: &crate::config::PoolConfig, owner: Option<&str>) -> bool {
        if !p.principals.is_empty() {
            return owner.is_some_and(|o| p.principals.iter().any(|n| n == o));
        }
        self.admission_class(owner).is_none()
    }

    /// The principal `owner` if some pool names it (then it may use only those pools), else
    /// none: what besides the request's shape decides which pools it may use.
    fn admission_class<'a>(&self, owner: Option<&'a str>) -> Option<&'a str> {
        owner.filter(|o| {
            self.config
                .pools
                .iter()
                .any(|p| p.principals.iter().any(|n| n == o))
        })
    }

    /// Pools a request may use, in configuration order.
    fn pools_for(&self, spec: &RequestSpec) -> Vec<usize> {
        self.pools_iter(spec).collect()
    }

    /// [`Self::pools_for`] without collecting them.
    fn pools_iter<'a>(&'a self, spec: &'a RequestSpec) -> impl Iterator<Item = usize> + 'a {
        self.config
            .pools
            .iter()
            .enumerate()
            .filter(|(_, p)| spec.pool.as_ref().is_none_or(|n| *n == p.name))
            .filter(|(_, p)| self.admits(p, spec.owner.as_deref()))
            .filter(|(_, p)| match spec.want {
                Want::Gpus { .. } => p.mode.whole(),
                Want::Vfs { .. } => p.mode.vfs(),
            })
            .map(|(i, _)| i)
    }

    /// Units of `spec`'s kind pool `p` has, healthy or not: its devices, or its VFs (of the
    /// profile asked for).
    fn pool_size(&self, p: usize, spec: &RequestSpec) -> usize {
        if self.derived.built {
            if let Some(size) = self.derived.sizes.get(p) {
                return match &spec.want {
                    Want::Gpus { .. } => size.devices,
                    Want::Vfs {
                        profile: Some(prof),
                        ..
                    } => size.vfs_by_profile.get(prof).copied().unwrap_or(0),
                    Want::Vfs { profile: None, .. } => size.vfs,
                };
            }
        }
        let devs = self
            .devices
            .iter()
            .filter(|d| d.pool == p && Self::profile_ok(d, spec));
        match spec.want {
            Want::Gpus { .. } => devs.count(),
            Want::Vfs { .. } => devs.map(|d| d.vfs.len()).sum(),
        }
    }

    /// Every pool's size (what [`Self::pool_size`] counts) from the devices.
    fn sizes_scan(&self) -> Vec<PoolSize> {
        let mut v = vec![PoolSize::default(); self.config.pools.len()];
        for d in &self.devices {
            if let Some(size) = v.get_mut(d.pool) {
                size.devices += 1;
                size.vfs += d.vfs.len();
                *size.vfs_by_profile.entry(d.profile.clone()).or_default() += d.vfs.len();
            }
        }
        v
    }

    /// Units a request needs.
    fn need(spec: &RequestSpec) -> usize {
        match spec.want {
            Want::Gpus { count } | Want::Vfs { count, .. } => count as usize,
        }
    }

    fn profile_ok(d: &Device, spec: &RequestSpec) -> bool {
        match &spec.want {
            Want::Vfs {
                profile: Some(p), ..
            } => d.profile == *p,
            _ => true,
        }
    }

    /// Checks a request; the error says why it can never be granted.
    fn validate(&self, spec: &RequestSpec) -> Result<(), Refused> {
        let m = &self.config.manager;
        let need = Self::need(spec);
        if need == 0 {
            return Err(Refused("a request needs at least one GPU or VF".into()));
        }
        if spec.host >= m.hosts {
            return Err(Refused(format!(
                "host {} is not in this fabric (hosts 0-{})",
                spec.host,
                m.hosts - 1
            )));
        }
        check_duration(spec)?;
        if spec.priority > m.max_priority {
            return Err(Refused(format!(
                "priority {} is above the highest, {}",
                spec.priority, m.max_priority
            )));
        }
        if need > m.max_functions_per_host {
            return Err(Refused(format!(
                "a host holds at most {} functions; ask for fewer",
                m.max_functions_per_host
            )));
        }
        if let Some(t) = &spec.tag {
            if !valid_tag(t) {
                return Err(Refused(format!(
                    "tag '{}' is not 1 to 128 characters of A-Z a-z 0-9 . _ : -",
                    t.escape_debug()
                )));
            }
        }
        if let Some(t) = &spec.tenant {
            if !self.tenant_names().contains(t) {
                return Err(Refused(format!(
                    "no tenant named '{t}'; [[manager.tenants]] in the configuration lists them \
                     (a request without a tenant belongs to '{DEFAULT_TENANT}')"
                )));
            }
        }
        if let Some(q) = self.tenant_config(spec.tenant_name()).and_then(|t| t.quota) {
            if need > q {
                return Err(Refused(format!(
                    "tenant '{}' may hold at most {q} functions; ask for fewer",
                    spec.tenant_name()
                )));
            }
        }
        let who = spec.owner.as_deref();
        if let Some(p) = &spec.pool {
            let Some(c) = self.config.pools.iter().find(|c| c.name == *p) else {
                return Err(Refused(format!("no pool named '{p}'")));
            };
            if !self.admits(c, who) {
                let who = who.map_or("a request without a principal".into(), |o| format!("'{o}'"));
                return Err(Refused(if c.principals.is_empty() {
                    format!(
                        "{who} leases only from the pools reserved to it ([[pools]] principals \
                         names it), and pool '{p}' is not one of them"
                    )
                } else {
                    format!(
                        "pool '{p}' is reserved to principals {:?} ([[pools]] principals): \
                         {who} may not lease from it; ask another pool",
                        c.principals
                    )
                }));
            }
        }
        if self.pools_iter(spec).next().is_none() {
            let what = match spec.want {
                Want::Gpus { .. } => "whole GPUs (mode whole, time-slice or hybrid)",
                Want::Vfs { .. } => "VFs (mode partition or hybrid)",
            };
            let reserved = self.config.pools.iter().any(|p| !p.principals.is_empty());
            return Err(Refused(if reserved {
                format!(
                    "no pool that {} may lease from gives {what} (some pools are reserved: \
                     [[pools]] principals)",
                    who.map_or("a request without a principal".into(), |o| format!("'{o}'"))
                )
            } else {
                format!("no pool gives {what}")
            }));
        }
        let fits_somewhere = self
            .pools_iter(spec)
            .any(|p| self.pool_size(p, spec) >= need);
        if !fits_somewhere {
            return Err(Refused(format!(
                "no pool has {need} {} of that kind; ask for fewer",
                match spec.want {
                    Want::Gpus { .. } => "devices",
                    Want::Vfs { .. } => "VFs",
                }
            )));
        }
        if self.queue.len() >= m.max_queue {
            return Err(Refused(format!(
                "the queue is full ({} requests); try later",
                m.max_queue
            )));
        }
        Ok(())
    }

    /// Takes a request: granted at once if it fits, else queued.
    pub fn submit(&mut self, spec: RequestSpec, now: Secs) -> Result<Submitted, Refused> {
        self.validate(&spec)?;
        let m = &self.config.manager;
        let duration_s = spec
            .duration_s
            .unwrap_or(m.default_lease_s)
            .clamp(1, m.max_lease_s);
        let id = self.next_id;
        self.next_id += 1;
        let prio = spec.priority;
        self.enqueue(Queued {
            id,
            spec,
            submitted: now,
            enqueued: now,
            duration_s,
        });
        self.schedule(now);
        let granted = self.leases.contains_key(&id);
        let indexed = self
            .derived
            .index
            .meta
            .get(&id)
            .map(|m| m.tenant)
            .filter(|_| self.derived.built && now >= self.derived.index.max_enq);
        let position = if granted {
            None
        } else if let Some(t) = indexed {
            // Counted in the indexes: the requests of higher effective priority, and of
            // equal one with a fair-share factor at least as high (all older).
            let f = self.fair_share_factors(now);
            let n = self.derived.index.count_before(prio, f[t], &f, now);
            Some(n.saturating_sub(1))
        } else {
            self.ranked(now)
                .iter()
                .position(|&i| self.queue[i].id == id)
        };
        Ok(Submitted {
            id,
            granted,
            position,
        })
    }

    /// Ends a lease or cancels a queued request.
    pub fn release(&mut self, id: u64, now: Secs) -> Result<(), Refused> {
        if self.leases.contains_key(&id) {
            self.end_lease(id, now, "released", "released by request".into());
            self.schedule(now);
            return Ok(());
        }
        if let Some(q) = self.dequeue(id) {
            self.notice(
                now,
                q.spec.host,
                id,
                "cancelled",
                "queued request cancelled".into(),
            );
            return Ok(());
        }
        Err(Refused(format!(
            "no lease or queued request {id}; `pcifab leases` and `pcifab queue` list them"
        )))
    }

    // ---- ranking ----------------------------------------------------------------------

    /// Effective priority: `priority + floor(wait / aging_s)`.
    pub fn effective_priority(&self, q: &Queued, now: Secs) -> u64 {
        let aging = self.config.manager.aging_s;
        let bonus = now
            .saturating_sub(q.enqueued)
            .checked_div(aging)
            .unwrap_or(0);
        u64::from(q.spec.priority) + bonus
    }

    /// A request aged above every possible fresh request: it ranks first-come first-served
    /// among its kind and nothing behind it is granted while it waits.
    pub fn promoted(&self, q: &Queued, now: Secs) -> bool {
        self.config.manager.aging_s != 0
            && self.effective_priority(q, now) > u64::from(self.config.manager.max_priority)
    }

    /// Queue indices in the order requests are considered: promoted requests oldest first,
    /// then by effective priority, fair-share factor of the tenant, enqueued, id.
    pub fn ranked(&self, now: Secs) -> Vec<usize> {
        let names = self.tenant_names();
        let factors = self.fair_share_factors(now);
        let mut keys: Vec<(u8, u64, f64, Secs, u64, usize)> = self
            .queue
            .iter()
            .enumerate()
            .map(|(i, q)| {
                if self.promoted(q, now) {
                    (0, 0, 0.0, q.enqueued, q.id, i)
                } else {
                    let e = self.effective_priority(q, now);
                    let f = factors[Self::tenant_index(&names, &q.spec)];
                    (1, u64::MAX - e, f, q.enqueued, q.id, i)
                }
            })
            .collect();
        keys.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then(b.2.total_cmp(&a.2))
                .then(a.3.cmp(&b.3))
                .then(a.4.cmp(&b.4))
        });
        keys.into_iter().map(|k| k.5).collect()
    }

    // ---- placement --------------------------------------------------------------------

    /// Functions `host` holds through leases not in `ignore`.
    fn host_units(&self, host: Host, ignore: &BTreeSet<u64>) -> usize {
        if !self.derived.built {
            return self.host_units_scan(host, ignore);
        }
        let gone: usize = ignore
            .iter()
            .filter_map(|id| self.leases.get(id))
            .filter(|l| l.spec.host == host)
            .map(|l| l.units.len())
            .sum();
        self.derived.held[usize::from(host)].saturating_sub(gone)
    }

    fn host_units_scan(&self, host: Host, ignore: &BTreeSet<u64>) -> usize {
        self.leases
            .values()
            .filter(|l| l.spec.host == host && !ignore.contains(&l.id))
            .map(|l| l.units.len())
            .sum()
    }

    /// Where a request would go in `pool`, counting the leases in `ignore` as gone;
    /// `avoid`: devices not to use.
    fn fit(
        &self,
        pool: usize,
        spec: &RequestSpec,
        need: usize,
        ignore: &BTreeSet<u64>,
        avoid: &BTreeSet<usize>,
    ) -> Option<Vec<Unit>> {
        if self.derived.built && ignore.is_empty() && avoid.is_empty() {
            if let Some(r) = self.fit_indexed(pool, spec, need) {
                return r;
            }
        }
        let free = |l: &Option<u64>| l.is_none_or(|id| ignore.contains(&id));
        let whole_free = |d: &Device| d.whole.iter().all(|id| ignore.contains(id));
        let mode = self.mode(pool);
        let cands = self
            .devices
            .iter()
            .enumerate()
            .filter(|(i, d)| d.pool == pool && d.in_pool() && !avoid.contains(i));
        let mut units = Vec::with_capacity(need);
        match spec.want {
            Want::Gpus { .. } if mode == Mode::TimeSlice => {
                // Fewest sharers first.
                let max = self.config.pools[pool].max_sharers;
                let mut c: Vec<(usize, usize)> = cands
                    .map(|(i, d)| {
                        let n = d.whole.iter().filter(|id| !ignore.contains(id)).count();
                        (n, i)
                    })
                    .filter(|(n, _)| *n < max)
                    .collect();
                c.sort_unstable();
                units.extend(c.into_iter().take(need).map(|(_, i)| Unit {
                    device: i,
                    pdfid: self.devices[i].pf,
                }));
            }
            Want::Gpus { .. } => {
                units.extend(
                    cands
                        .filter(|(_, d)| whole_free(d) && d.vf_lease.iter().all(free))
                        .take(need)
                        .map(|(i, d)| Unit {
                            device: i,
                            pdfid: d.pf,
                        }),
                );
            }
            Want::Vfs { .. } => {
                // Best fit: devices already partitioned first (fewest free VFs first), so
                // whole devices stay free for whole-device requests.
                let mut c: Vec<(usize, usize, usize)> = cands
                    .filter(|(_, d)| whole_free(d) && Self::profile_ok(d, spec))
                    .map(|(i, d)| {
                        let nfree = d.vf_lease.iter().filter(|l| free(l)).count();
                        let untouched = usize::from(nfree == d.vfs.len());
                        (untouched, nfree, i)
                    })
                    .filter(|(_, nfree, _)| *nfree > 0)
                    .collect();
                c.sort_unstable();
                'outer: for (_, _, i) in c {
                    let d = &self.devices[i];
                    for (k, l) in d.vf_lease.iter().enumerate() {
                        if units.len() == need {
                            break 'outer;
                        }
                        if free(l) {
                            units.push(Unit {
                                device: i,
                                pdfid: d.vfs[k],
                            });
                        }
                    }
                }
            }
        }
        (units.len() == need).then_some(units)
    }

    /// `fit` from the capacity index, for nothing ignored or avoided (the same units: free
    /// devices in device order; VFs by (untouched, free VFs, device)); none for time-slice
    /// pools, which it does not index.
    fn fit_indexed(
        &self,
        pool: usize,
        spec: &RequestSpec,
        need: usize,
    ) -> Option<Option<Vec<Unit>>> {
        if self.mode(pool) == Mode::TimeSlice {
            return None;
        }
        let pc = self.derived.capacity.pools.get(pool)?;
        let mut units = Vec::with_capacity(need);
        match &spec.want {
            Want::Gpus { .. } => {
                units.extend(pc.free_devices.iter().take(need).map(|&i| Unit {
                    device: i,
                    pdfid: self.devices[i].pf,
                }));
            }
            Want::Vfs { profile, .. } => {
                let order = match profile {
                    Some(p) => pc.vf_order_by_profile.get(p),
                    None => Some(&pc.vf_order),
                };
                'outer: for &(_, _, i) in order.into_iter().flatten() {
                    let d = &self.devices[i];
                    for (k, l) in d.vf_lease.iter().enumerate() {
                        if units.len() == need {
                            break 'outer;
                        }
                        if l.is_none() {
                            units.push(Unit {
                                device: i,
                                pdfid: d.vfs[k],
                            });
                        }
                    }
                }
            }
        }
        Some((units.len() == need).then_some(units))
    }

    /// Where a request would go (pool, units), counting `ignore` as gone.
    fn place(&self, spec: &RequestSpec, ignore: &BTreeSet<u64>) -> Option<(usize, Vec<Unit>)> {
        let need = Self::need(spec);
        if !self.room(spec, ignore) {
            return None;
        }
        let none = BTreeSet::new();
        self.pools_iter(spec)
            .find_map(|p| self.fit(p, spec, need, ignore, &none).map(|u| (p, u)))
    }

    /// Records a lease on its units and binds what it holds now.
    fn install(&mut self, lease: Lease, now: Secs) {
        let host = lease.spec.host;
        self.account(host, lease.spec.tenant_name(), &lease.units, 1, now);
        for u in &lease.units {
            let d = &mut self.devices[u.device];
            if lease.sliced {
                d.whole.push(lease.id);
                if d.resident.is_none() {
                    d.resident = Some(lease.id);
                    d.slice_start = now;
                    self.bind(u.pdfid, host);
                }
            } else if u.pdfid == d.pf {
                d.whole.push(lease.id);
                self.bind(u.pdfid, host);
            } else if let Some(k) = d.vfs.iter().position(|v| *v == u.pdfid) {
                d.vf_lease[k] = Some(lease.id);
                self.bind(u.pdfid, host);
            }
        }
        let mut touched: Vec<usize> = lease.units.iter().map(|u| u.device).collect();
        touched.dedup();
        if self.derived.built {
            if let Some(k) = self.preempt_key(&lease) {
                self.derived.preemptible.insert(k);
            }
        }
        self.leases.insert(lease.id, lease);
        for di in touched {
            self.touch(di);
        }
    }

    /// Takes a unit back from a lease: unbinds it, or hands a time-sliced device on.
    /// The caller re-reads the device's levels (`touch`).
    fn uninstall_unit_only(&mut self, id: u64, u: Unit, now: Secs) {
        let d = &mut self.devices[u.device];
        if let Some(k) = d.vfs.iter().position(|v| *v == u.pdfid) {
            if d.vf_lease[k] == Some(id) {
                d.vf_lease[k] = None;
                self.unbind(u.pdfid);
            }
            return;
        }
        let Some(pos) = d.whole.iter().position(|l| *l == id) else {
            return;
        };
        d.whole.remove(pos);
        if d.resident == Some(id) {
            // The next sharer (now at `pos`) gets the device at once.
            let next = if d.whole.is_empty() {
                None
            } else {
                Some(d.whole[pos % d.whole.len()])
            };
            d.resident = next;
            d.slice_start = now;
            let pf = d.pf;
            match next.and_then(|n| self.leases.get(&n)).map(|l| l.spec.host) {
                Some(h) => self.move_to(pf, h),
                None => self.unbind(pf),
            }
        } else if d.whole.is_empty() {
            let pf = d.pf;
            self.unbind(pf);
            self.dirty(u.device);
        }
    }

    /// A device's last lease ended: in a scrub pool it waits for its scrub.
    fn dirty(&mut self, di: usize) {
        if self.config.pools[self.devices[di].pool].scrub {
            self.devices[di].scrub = Some(Scrub::Pending);
        }
    }

    fn end_lease(&mut self, id: u64, now: Secs, kind: &str, message: String) -> Option<Lease> {
        let lease = self.leases.remove(&id)?;
        if self.derived.built {
            if let Some(k) = self.preempt_key(&lease) {
                self.derived.preemptible.remove(&k);
            }
        }
        self.account(
            lease.spec.host,
            lease.spec.tenant_name(),
            &lease.units,
            -1,
            now,
        );
        for u in &lease.units {
            self.uninstall_unit_only(id, *u, now);
        }
        let mut touched: Vec<usize> = lease.units.iter().map(|u| u.device).collect();
        touched.dedup();
        for di in touched {
            self.touch(di);
        }
        self.notice(now, lease.spec.host, id, kind, message);
        Some(lease)
    }

    /// Puts a lease's request back in the queue for the time it had left.
    fn requeue(&mut self, lease: Lease, now: Secs) {
        let left = lease.expires_at.saturating_sub(now).max(1);
        self.enqueue(Queued {
            id: lease.id,
            spec: lease.spec,
            submitted: lease.submitted,
            enqueued: now,
            duration_s: left,
        });
    }

    /// Turns a queued request into a lease (the caller takes it out of the queue).
    fn grant(&mut self, q: Queued, pool: usize, units: Vec<Unit>, now: Secs) {
        let sliced = self.mode(pool) == Mode::TimeSlice;
        let lease = Lease {
            id: q.id,
            pool,
            submitted: q.submitted,
            granted_at: now,
            expires_at: now + q.duration_s,
            units,
            sliced,
            spec: q.spec,
        };
        let mut fns = String::new();
        for (i, u) in lease.units.iter().enumerate() {
            if i > 0 {
                fns.push(' ');
            }
            let _ = write!(fns, "{:#06x}", u.pdfid);
        }
        let msg = format!(
            "granted {fns} in pool '{}' until {}{}",
            self.config.pools[pool].name,
            lease.expires_at,
            if sliced { " (time-sliced)" } else { "" }
        );
        let (host, id) = (lease.spec.host, lease.id);
        self.install(lease, now);
        self.grants += 1;
        self.notice(now, host, id, "granted", msg);
    }

    fn host_down(&self, host: Host) -> bool {
        self.hosts
            .get(&host)
            .is_some_and(|h| h.down_since.is_some())
    }

    /// One scheduling pass: grants what fits, in rank order; returns the grants made.
    pub fn schedule(&mut self, now: Secs) -> usize {
        self.passes += 1;
        let (granted, preempted) = self.pass(now, true);
        if preempted {
            // Victims were queued again; they may fit elsewhere.
            granted + self.pass(now, false).0
        } else {
            granted
        }
    }

    /// One pass: the incremental one, or the full scan while the clock is behind a queued
    /// request (both give the same grants in the same order).
    fn pass(&mut self, now: Secs, allow_preempt: bool) -> (usize, bool) {
        #[cfg(test)]
        if self.full_scan {
            return self.pass_full_scan(now, allow_preempt);
        }
        self.sync(now);
        if now < self.derived.index.max_enq {
            // The clock went back behind a queued request: ranks are not monotone in the
            // enqueue time there. Rebuilt at the next pass.
            self.derived.built = false;
            return self.pass_full_scan(now, allow_preempt);
        }
        self.pass_incremental(now, allow_preempt)
    }

    /// The reference pass: considers every queued request once, in rank order. Returns the
    /// grants made and whether leases were pre-empted.
    pub(crate) fn pass_full_scan(&mut self, now: Secs, allow_preempt: bool) -> (usize, bool) {
        let order = self.ranked(now);
        let n = self.queue.len();
        let mut taken = vec![false; n];
        let mut granted = 0;
        let mut preempted = false;
        // Within a pass free capacity only shrinks (until a pre-emption), so a shape that did
        // not fit will not fit later in the pass.
        let mut no_fit: BTreeSet<(u64, Host, String)> = BTreeSet::new();
        let mut no_victims: BTreeSet<(u64, u32)> = BTreeSet::new();
        let mut holds = Holds::default();
        for qi in order {
            let spec = &self.queue[qi].spec;
            if self.host_down(spec.host) || holds.holds(spec.host, spec.tenant_name()) {
                continue;
            }
            let key = (
                shape_of(spec, self.admission_class(spec.owner.as_deref())),
                spec.host,
                spec.tenant_name().to_string(),
            );
            if !no_fit.contains(&key) {
                let spec = spec.clone();
                if let Some((pool, units)) = self.place(&spec, &BTreeSet::new()) {
                    self.grant(self.queue[qi].clone(), pool, units, now);
                    taken[qi] = true;
                    granted += 1;
                    continue;
                }
                no_fit.insert(key.clone());
            }
            let spec = self.queue[qi].spec.clone();
            // Pre-emption frees other hosts' devices, never room under a host's own limit
            // (or a tenant's quota).
            let room = self.room(&spec, &BTreeSet::new());
            let vkey = (key.0, spec.priority);
            if allow_preempt && room && !no_victims.contains(&vkey) {
                match self.victims(&spec) {
                    Some(victims) => {
                        let id = self.queue[qi].id;
                        for v in victims {
                            if let Some(l) = self.end_lease(
                                v,
                                now,
                                "preempted",
                                format!(
                                    "pre-empted by request {id} (priority {}); queued again",
                                    spec.priority
                                ),
                            ) {
                                self.requeue(l, now);
                            }
                        }
                        preempted = true;
                        no_fit.clear();
                        no_victims.clear();
                        if let Some((pool, units)) = self.place(&spec, &BTreeSet::new()) {
                            self.grant(self.queue[qi].clone(), pool, units, now);
                            taken[qi] = true;
                            granted += 1;
                            continue;
                        }
                    }
                    None => {
                        no_victims.insert(vkey);
                    }
                }
            }
            if self.promoted(&self.queue[qi], now) {
                let spec = &self.queue[qi].spec;
                if self.room(spec, &BTreeSet::new()) {
                    // Reserve: nothing behind a promoted request may take what it waits for.
                    break;
                }
                // Its own host or tenant is full: the pool cannot help it. It is passed
                // over, and nothing behind it may take room from its host or tenant.
                let quota = self.tenant_config(spec.tenant_name()).and_then(|c| c.quota);
                holds.hold(spec.host, spec.tenant_name(), quota.is_some());
            }
        }
        let mut i = 0;
        self.queue.retain(|_| {
            let keep = i >= n || !taken[i];
            i += 1;
            keep
        });
        (granted, preempted)
    }

    /// The incremental pass: the same decisions as [`Self::pass_full_scan`], looking only at
    /// the requests that can be granted or pre-empt (`index.rs` says why that suffices).
    ///
    /// 1. Promoted requests, oldest first: each is granted (placed, or by pre-emption) or
    ///    ends the pass (the reservation of the starvation bound); a down host's are skipped.
    /// 2. Then, repeatedly, the best-ranked request among the first request of every class
    ///    (shape, priority, tenant, host) whose host and tenant have room and whose shape
    ///    fits the free pool, or may pre-empt (a lease of lower priority allows it and the
    ///    levels of `Levels` say it would free enough). Free capacity, room and those levels
    ///    only shrink while nothing is pre-empted, so a request passed over stays passed
    ///    over; after a pre-emption the search continues strictly after the last request
    ///    considered, as the full scan does.
    fn pass_incremental(&mut self, now: Secs, allow_preempt: bool) -> (usize, bool) {
        self.sync(now);
        self.derived.in_pass = true;
        let factors = self.fair_share_factors(now);
        let mut tried: BTreeSet<(usize, u32)> = BTreeSet::new();
        let (mut granted, mut preempted) = (0, false);
        let mut after: Option<(Secs, u64)> = None;
        let mut stopped = false;
        let mut holds = Holds::default();
        // 1. Promoted requests.
        loop {
            let mut ops = 0;
            let next = {
                let idx = &self.derived.index;
                let range = match after {
                    None => idx.promoted.range(..),
                    Some(k) => idx.promoted.range((Bound::Excluded(k), Bound::Unbounded)),
                };
                let mut found = None;
                for &(enq, id) in range {
                    ops += 1;
                    let m = &idx.meta[&id];
                    if !self.host_down(m.host) && !holds.holds(m.host, &idx.tenants[m.tenant]) {
                        found = Some((enq, id));
                        break;
                    }
                }
                found
            };
            self.derived.ops += ops + 1;
            let Some(k) = next else { break };
            after = Some(k);
            if self.consider(k.1, now, allow_preempt, &mut tried, &mut preempted) {
                granted += 1;
                continue;
            }
            let Some(m) = self.derived.index.meta.get(&k.1).copied() else {
                continue;
            };
            let spec = &self.queue[m.pos].spec;
            if self.room(spec, &BTreeSet::new()) {
                stopped = true;
                break;
            }
            let quota = self.tenant_config(spec.tenant_name()).and_then(|c| c.quota);
            holds.hold(spec.host, spec.tenant_name(), quota.is_some());
        }
        // 2. The others.
        if !stopped {
            let mut cursor: Option<RankKey> = None;
            while let Some((key, id)) = self.best_candidate(
                now,
                &factors,
                allow_preempt,
                &tried,
                &holds,
                cursor.as_ref(),
            ) {
                let ok = self.consider(id, now, allow_preempt, &mut tried, &mut preempted);
                if ok {
                    granted += 1;
                }
                if preempted || !ok {
                    cursor = Some(key);
                }
            }
        }
        self.derived.in_pass = false;
        for id in std::mem::take(&mut self.derived.hidden) {
            self.derived.index.reveal(id);
        }
        (granted, preempted)
    }

    /// What the full scan does with one request: grant it if it fits, else pre-empt for it
    /// if it may (once per shape and priority until something is pre-empted). Returns
    /// whether it was granted.
    fn consider(
        &mut self,
        id: u64,
        now: Secs,
        allow_preempt: bool,
        tried: &mut BTreeSet<(usize, u32)>,
        preempted: &mut bool,
    ) -> bool {
        let Some(m) = self.derived.index.meta.get(&id).copied() else {
            return false;
        };
        // The request stays at `m.pos` until it is dequeued (pre-empted leases are queued
        // after it), so its spec is read there rather than cloned.
        let none = BTreeSet::new();
        if let Some((pool, units)) = self.place(&self.queue[m.pos].spec, &none) {
            if let Some(q) = self.dequeue(id) {
                self.grant(q, pool, units, now);
                return true;
            }
            return false;
        }
        let priority = self.queue[m.pos].spec.priority;
        let vkey = (m.shape, priority);
        if allow_preempt && self.room(&self.queue[m.pos].spec, &none) && !tried.contains(&vkey) {
            match self.victims(&self.queue[m.pos].spec) {
                Some(victims) => {
                    for v in victims {
                        if let Some(l) = self.end_lease(
                            v,
                            now,
                            "preempted",
                            format!(
                                "pre-empted by request {id} (priority {priority}); queued again"
                            ),
                        ) {
                            self.requeue(l, now);
                        }
                    }
                    *preempted = true;
                    tried.clear();
                    if let Some((pool, units)) = self.place(&self.queue[m.pos].spec, &none) {
                        if let Some(q) = self.dequeue(id) {
                            self.grant(q, pool, units, now);
                            return true;
                        }
                    }
                }
                None => {
                    tried.insert(vkey);
                }
            }
        }
        false
    }

    /// Device `di`'s levels (see `capacity.rs`); none if it is out of the pool.
    fn device_levels(&self, di: usize) -> Option<DeviceLevels> {
        let d = &self.devices[di];
        if !d.in_pool() {
            return None;
        }
        let pool = &self.config.pools[d.pool];
        if pool.mode == Mode::TimeSlice {
            let open = d.whole.len() < pool.max_sharers;
            return Some(DeviceLevels {
                device: if open { 0 } else { u64::MAX },
                vfs: Vec::new(),
                whole_free: false,
            });
        }
        let level = |id: &u64| -> u64 {
            self.leases.get(id).map_or(u64::MAX, |l| {
                if l.spec.preemptible_by_higher && !l.sliced && !pool.scrub {
                    u64::from(l.spec.priority) + 1
                } else {
                    u64::MAX
                }
            })
        };
        let whole = d.whole.iter().map(level).max().unwrap_or(0);
        let vfs: Vec<u64> = d
            .vf_lease
            .iter()
            .map(|l| whole.max(l.as_ref().map_or(0, level)))
            .collect();
        let device = vfs.iter().copied().fold(whole, u64::max);
        Some(DeviceLevels {
            device,
            vfs,
            whole_free: d.whole.is_empty(),
        })
    }

    /// The capacity from scratch.
    fn capacity_scan(&self) -> Capacity {
        let mut c = Capacity::new(self.config.pools.len(), self.devices.len());
        for (di, d) in self.devices.iter().enumerate() {
            c.set(di, d.pool, &d.profile, self.device_levels(di));
        }
        c
    }

    /// Device `di` changed (its leases or its health): its levels again.
    fn touch(&mut self, di: usize) {
        if !self.derived.built || di >= self.devices.len() {
            return;
        }
        let new = self.device_levels(di);
        let d = &self.devices[di];
        self.derived.capacity.set(di, d.pool, &d.profile, new);
        self.derived.ops += 1;
    }

    /// Whether `spec` (a shape) could have its units in one of `pools` at priority `p`:
    /// p = 0, from the free pool (exactly when `fit` finds them); p > 0, by pre-empting every
    /// lease that allows it and has a priority below p (exactly when `victims` finds a set,
    /// the request's room aside).
    fn capacity_allows(&self, pools: &[usize], spec: &RequestSpec, p: u64) -> bool {
        let need = Self::need(spec);
        pools.iter().any(|&pool| {
            let Some(pc) = self.derived.capacity.pools.get(pool) else {
                return false;
            };
            if self.mode(pool) == Mode::TimeSlice {
                return p == 0 && pc.devices.at_most(0) >= need;
            }
            match &spec.want {
                Want::Gpus { .. } => pc.devices.at_most(p) >= need,
                Want::Vfs {
                    profile: Some(prof),
                    ..
                } => pc
                    .vfs_by_profile
                    .get(prof)
                    .is_some_and(|h| h.at_most(p) >= need),
                Want::Vfs { profile: None, .. } => pc.vfs.at_most(p) >= need,
            }
        })
    }

    /// The best-ranked request that the pass would grant or pre-empt for now (after
    /// `cursor` if given), with its rank.
    #[allow(clippy::too_many_arguments)]
    fn best_candidate(
        &mut self,
        now: Secs,
        factors: &[f64],
        allow_preempt: bool,
        tried: &BTreeSet<(usize, u32)>,
        holds: &Holds,
        cursor: Option<&RankKey>,
    ) -> Option<(RankKey, u64)> {
        let aging = self.config.manager.aging_s;
        let max_units = self.config.manager.max_functions_per_host;
        let idx = &self.derived.index;
        let mut best: Option<(RankKey, u64)> = None;
        let mut ops = 0u64;
        for (&s, classes) in &idx.classes {
            let spec = &idx.shape_spec[s];
            let pools = &idx.shape_pools[s];
            let fit = self.capacity_allows(pools, spec, 0);
            let need = Self::need(spec);
            for (&(p, t), class) in classes {
                ops += 1;
                let candidate = fit
                    || (allow_preempt
                        && !tried.contains(&(s, p))
                        && self.capacity_allows(pools, spec, u64::from(p)));
                if !candidate {
                    continue;
                }
                let tenant = &idx.tenants[t];
                if holds.tenants.contains(tenant.as_str()) {
                    continue;
                }
                let quota_ok = self
                    .tenant_config(tenant)
                    .and_then(|c| c.quota)
                    .is_none_or(|q| self.usage.get(tenant).map_or(0, |u| u.functions) + need <= q);
                if !quota_ok {
                    continue;
                }
                let f = factors.get(t).copied().unwrap_or(1.0);
                let host_ok = |h: Host| {
                    !self.host_down(h)
                        && !holds.hosts.contains(&h)
                        && self.derived.held[usize::from(h)] + need <= max_units
                };
                let rank = |enq: Secs, id: u64| RankKey {
                    e: u64::from(p) + now.saturating_sub(enq).checked_div(aging).unwrap_or(0),
                    f,
                    enq,
                    id,
                };
                let mut consider = |k: RankKey| {
                    if best.is_none_or(|b| k.cmp(&b.0).is_lt()) {
                        best = Some((k, k.id));
                    }
                };
                match cursor {
                    None => {
                        // The first head with room is the class's best.
                        for &(enq, id, h) in &class.heads {
                            ops += 1;
                            if host_ok(h) {
                                consider(rank(enq, id));
                                break;
                            }
                        }
                    }
                    Some(c) => {
                        let Some(lo) = after_bound(p, f, c, now, aging) else {
                            continue;
                        };
                        for (&h, set) in &class.by_host {
                            ops += 1;
                            if !host_ok(h) {
                                continue;
                            }
                            if let Some(&(enq, id)) = set.range((lo, Bound::Unbounded)).next() {
                                ops += 1;
                                consider(rank(enq, id));
                            }
                        }
                    }
                }
            }
        }
        self.derived.ops += ops;
        best
    }

    // ---- time -------------------------------------------------------------------------

    /// Everything time does: expiry, host time-outs and reclaim, time slices, then a pass.
    pub fn tick(&mut self, now: Secs) {
        let expired: Vec<u64> = self
            .leases
            .values()
            .filter(|l| l.expires_at <= now)
            .map(|l| l.id)
            .collect();
        for id in expired {
            self.end_lease(id, now, "expired", "lease expired".into());
        }
        self.failover(now);
        self.rotate(now);
        self.schedule(now);
    }

    /// Hands time-sliced devices to their next sharer when the slice is over.
    fn rotate(&mut self, now: Secs) {
        for di in 0..self.devices.len() {
            let d = &self.devices[di];
            let pool = d.pool;
            if self.mode(pool) != Mode::TimeSlice || d.whole.len() < 2 {
                continue;
            }
            let slice = self.config.pools[pool].slice_s;
            if now < d.slice_start + slice {
                continue;
            }
            let cur = d
                .resident
                .and_then(|r| d.whole.iter().position(|l| *l == r))
                .unwrap_or(0);
            let next = d.whole[(cur + 1) % d.whole.len()];
            let prev = d.resident;
            let pf = d.pf;
            let Some(to) = self.leases.get(&next).map(|l| l.spec.host) else {
                continue;
            };
            let d = &mut self.devices[di];
            d.resident = Some(next);
            d.slice_start = now;
            self.move_to(pf, to);
            if let Some(p) = prev
                .and_then(|p| self.leases.get(&p))
                .map(|l| (l.id, l.spec.host))
            {
                self.notice(now, p.1, p.0, "slice-out", format!("{pf:#06x} handed on"));
            }
            self.notice(now, to, next, "slice-in", format!("{pf:#06x} is yours"));
        }
    }

    // ---- failover ---------------------------------------------------------------------

    /// A heartbeat from a host's agent: it is alive (again).
    pub fn heartbeat(&mut self, host: Host, now: Secs) {
        let h = self.hosts.entry(host).or_default();
        h.last_seen = Some(now);
        h.down_since = None;
        h.declared = false;
    }

    /// The host's upstream port link as the fabric reports it (the daemon reads it with the
    /// driver executor): up counts as a heartbeat, down as none. It does not cancel a
    /// `host-down` an operator declared.
    pub fn link_seen(&mut self, host: Host, up: bool, now: Secs) {
        if !up || host >= self.config.manager.hosts {
            return;
        }
        let h = self.hosts.entry(host).or_default();
        if h.down_since.is_some() && h.declared {
            return;
        }
        h.last_seen = Some(now);
        h.down_since = None;
    }

    /// Declares a host down; its leases are reclaimed `reclaim_after_s` later.
    pub fn declare_down(&mut self, host: Host, now: Secs) {
        let h = self.hosts.entry(host).or_default();
        if h.down_since.is_none() {
            h.down_since = Some(now);
            h.declared = true;
        }
    }

    fn failover(&mut self, now: Secs) {
        let f = self.config.failover.clone();
        let mut reclaim = Vec::new();
        for (&host, h) in self.hosts.iter_mut() {
            if h.down_since.is_none() && f.host_timeout_s > 0 {
                if let Some(seen) = h.last_seen {
                    if now >= seen + f.host_timeout_s {
                        h.down_since = Some(now);
                    }
                }
            }
            if let Some(since) = h.down_since {
                if now >= since + f.reclaim_after_s {
                    reclaim.push(host);
                }
            }
        }
        for host in reclaim {
            let ids: Vec<u64> = self
                .leases
                .values()
                .filter(|l| l.spec.host == host)
                .map(|l| l.id)
                .collect();
            for id in ids {
                self.end_lease(
                    id,
                    now,
                    "reclaimed",
                    format!("host {host} is down; its devices went back to the pool"),
                );
            }
        }
    }

    // ---- health -----------------------------------------------------------------------

    /// Device index of a PF.
    pub fn device_of(&self, pf: Pdfid) -> Option<usize> {
        self.devices.iter().position(|d| d.pf == pf)
    }

    /// Takes a device out of the pool (`Some(reason)`) or puts it back (`None`). Its leases
    /// move to healthy devices where their request allows, else go back to the queue.
    pub fn set_health(
        &mut self,
        pf: Pdfid,
        unhealthy: Option<String>,
        now: Secs,
    ) -> Result<(), Refused> {
        let di = self
            .device_of(pf)
            .ok_or_else(|| Refused(format!("{pf:#06x} is not the PF of a pool device")))?;
        let was = self.devices[di].unhealthy.is_some();
        self.devices[di].unhealthy = unhealthy.clone();
        self.touch(di);
        match (was, unhealthy) {
            (false, Some(reason)) => self.evacuate(di, &reason, now),
            (true, None) => {
                self.schedule(now);
            }
            _ => {}
        }
        Ok(())
    }

    /// The daemon erased (`Ok`) a device waiting for its scrub, or failed to (`Err`): the
    /// device goes back to the pool, or leaves it (unhealthy, the reason says why) until an
    /// operator puts it back.
    pub fn scrub_done(
        &mut self,
        pf: Pdfid,
        result: Result<(), String>,
        now: Secs,
    ) -> Result<(), Refused> {
        let di = self
            .device_of(pf)
            .ok_or_else(|| Refused(format!("{pf:#06x} is not the PF of a pool device")))?;
        if self.devices[di].scrub != Some(Scrub::Pending) {
            return Err(Refused(format!("{pf:#06x} is not waiting for a scrub")));
        }
        match result {
            Ok(()) => {
                self.devices[di].scrub = None;
                self.touch(di);
                self.schedule(now);
                Ok(())
            }
            Err(e) => {
                self.devices[di].scrub = Some(Scrub::Failed);
                self.touch(di);
                self.set_health(pf, Some(format!("scrub failed: {e}")), now)
            }
        }
    }

    /// An operator puts a device back (`set-health` healthy): a device whose scrub failed
    /// is erased again before anyone may have it.
    pub fn readmit(&mut self, pf: Pdfid, now: Secs) -> Result<(), Refused> {
        let di = self
            .device_of(pf)
            .ok_or_else(|| Refused(format!("{pf:#06x} is not the PF of a pool device")))?;
        if self.devices[di].scrub == Some(Scrub::Failed) {
            self.devices[di].scrub = Some(Scrub::Pending);
        }
        self.set_health(pf, None, now)
    }

    /// Devices waiting for their scrub that the daemon may erase now (healthy ones).
    pub fn scrubs_due(&self) -> Vec<Pdfid> {
        self.devices
            .iter()
            .filter(|d| d.scrub == Some(Scrub::Pending) && d.unhealthy.is_none())
            .map(|d| d.pf)
            .collect()
    }

    fn evacuate(&mut self, di: usize, reason: &str, now: Secs) {
        let mut ids: Vec<u64> = self.devices[di].whole.clone();
        ids.extend(self.devices[di].vf_lease.iter().flatten());
        ids.sort_unstable();
        ids.dedup();
        if !ids.is_empty() {
            // Whatever its holders left on it is erased before it is granted again.
            self.dirty(di);
        }
        // First nothing stays bound on a device out of the pool.
        let d = &mut self.devices[di];
        d.whole.clear();
        d.resident = None;
        d.vf_lease.iter_mut().for_each(|l| *l = None);
        let pf = d.pf;
        let fns: Vec<Pdfid> = std::iter::once(d.pf).chain(d.vfs.iter().copied()).collect();
        self.touch(di);
        for f in fns {
            self.unbind(f);
        }
        for id in ids {
            let Some(mut lease) = self.leases.remove(&id) else {
                continue;
            };
            let lost: Vec<Unit> = lease
                .units
                .iter()
                .copied()
                .filter(|u| u.device == di)
                .collect();
            lease.units.retain(|u| u.device != di);
            let tenant = lease.spec.tenant_name().to_string();
            self.account(lease.spec.host, &tenant, &lost, -1, now);
            // Whole devices must be other devices than the lease has; VFs may share one.
            let avoid: BTreeSet<usize> = match lease.spec.want {
                Want::Gpus { .. } => lease.units.iter().map(|u| u.device).collect(),
                Want::Vfs { .. } => BTreeSet::new(),
            };
            let repl = if lease.spec.migratable {
                self.fit(
                    lease.pool,
                    &lease.spec,
                    lost.len(),
                    &BTreeSet::new(),
                    &avoid,
                )
            } else {
                None
            };
            let host = lease.spec.host;
            match repl {
                Some(new) => {
                    let moved: Vec<String> = lost
                        .iter()
                        .zip(&new)
                        .map(|(a, b)| format!("{:#06x} -> {:#06x}", a.pdfid, b.pdfid))
                        .collect();
                    // Install only the new units, then keep the lease with all of them.
                    let part = Lease {
                        units: new.clone(),
                        ..lease.clone()
                    };
                    self.install(part, now);
                    lease.units.extend(new);
                    lease.units.sort_unstable();
                    self.leases.insert(id, lease);
                    self.notice(
                        now,
                        host,
                        id,
                        "moved",
                        format!(
                            "device {pf:#06x} is unhealthy ({reason}): {}",
                            moved.join(", ")
                        ),
                    );
                }
                None => {
                    let why = if lease.spec.migratable {
                        "no healthy replacement is free"
                    } else {
                        "the request does not allow moving"
                    };
                    self.leases.insert(id, lease);
                    if let Some(l) = self.end_lease(
                        id,
                        now,
                        "revoked",
                        format!("device {pf:#06x} is unhealthy ({reason}); {why}; queued again"),
                    ) {
                        self.requeue(l, now);
                    }
                }
            }
        }
        self.schedule(now);
    }

    /// Every function the pools manage.
    pub fn pool_functions(&self) -> Vec<Pdfid> {
        self.devices
            .iter()
            .flat_map(|d| std::iter::once(d.pf).chain(d.vfs.iter().copied()))
            .collect()
    }

    /// The actions that bring a fabric found as `actual` (function -> host, pool functions
    /// only) to what the scheduler wants: unbinds first, then moves, then binds, so the PF/VF
    /// rule holds at every step. Used at start, after a crash between commit and apply.
    pub fn reconcile(&self, actual: &BTreeMap<Pdfid, Host>) -> Vec<Action> {
        let (mut unbinds, mut moves, mut binds) = (Vec::new(), Vec::new(), Vec::new());
        for f in self.pool_functions() {
            match (actual.get(&f), self.holders.get(&f)) {
                (Some(&h), None) => unbinds.push(Action::Unbind { pdfid: f, host: h }),
                (None, Some(&h)) => binds.push(Action::Bind { pdfid: f, host: h }),
                (Some(&a), Some(&w)) if a != w => moves.push(Action::Move {
                    pdfid: f,
                    from: a,
                    to: w,
                }),
                _ => {}
            }
        }
        unbinds.extend(moves);
        unbinds.extend(binds);
        unbinds
    }

    // ---- checks -----------------------------------------------------------------------

    /// The fabric invariants and the scheduler's own consistency; the error names the first
    /// broken one.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut claims: BTreeMap<Pdfid, u64> = BTreeMap::new();
        for l in self.leases.values() {
            for u in &l.units {
                let d = self
                    .devices
                    .get(u.device)
                    .ok_or(format!("lease {} names device {}", l.id, u.device))?;
                if !d.in_pool() {
                    return Err(format!(
                        "lease {} holds unhealthy or unscrubbed device {:#06x}",
                        l.id, d.pf
                    ));
                }
                if !l.sliced {
                    if let Some(other) = claims.insert(u.pdfid, l.id) {
                        return Err(format!(
                            "{:#06x} is claimed by leases {other} and {}",
                            u.pdfid, l.id
                        ));
                    }
                }
                if u.pdfid == d.pf {
                    if !d.whole.contains(&l.id) {
                        return Err(format!("device {:#06x} lost lease {}", d.pf, l.id));
                    }
                } else {
                    let k = d
                        .vfs
                        .iter()
                        .position(|v| *v == u.pdfid)
                        .ok_or(format!("{:#06x} is not a VF of {:#06x}", u.pdfid, d.pf))?;
                    if d.vf_lease[k] != Some(l.id) {
                        return Err(format!(
                            "VF {:#06x} does not record lease {}",
                            u.pdfid, l.id
                        ));
                    }
                }
                let want = if l.sliced {
                    (d.resident == Some(l.id)).then_some(l.spec.host)
                } else {
                    Some(l.spec.host)
                };
                if let Some(h) = want {
                    if self.holders.get(&u.pdfid) != Some(&h) {
                        return Err(format!(
                            "lease {} says {:#06x} is on host {h}, the fabric says {:?}",
                            l.id,
                            u.pdfid,
                            self.holders.get(&u.pdfid)
                        ));
                    }
                }
            }
        }
        for d in &self.devices {
            let sliced = self.mode(d.pool) == Mode::TimeSlice;
            if !d.whole.is_empty() && d.vf_used() > 0 {
                return Err(format!("device {:#06x} is leased whole and by VF", d.pf));
            }
            if !sliced && d.whole.len() > 1 {
                return Err(format!(
                    "device {:#06x} has {} whole leases",
                    d.pf,
                    d.whole.len()
                ));
            }
            if sliced && d.whole.len() > self.config.pools[d.pool].max_sharers {
                return Err(format!("device {:#06x} has too many sharers", d.pf));
            }
            if d.resident.is_some() != (sliced && !d.whole.is_empty()) {
                return Err(format!(
                    "device {:#06x}: resident {:?} with sharers {:?}",
                    d.pf, d.resident, d.whole
                ));
            }
            for id in d.whole.iter().chain(d.vf_lease.iter().flatten()) {
                if !self.leases.contains_key(id) {
                    return Err(format!("device {:#06x} records ended lease {id}", d.pf));
                }
            }
            let pf_bound = self.holders.contains_key(&d.pf);
            let vf_bound = d.vfs.iter().any(|v| self.holders.contains_key(v));
            if pf_bound && vf_bound {
                return Err(format!("PF {:#06x} is bound together with VFs of it", d.pf));
            }
            if d.unhealthy.is_some() && (pf_bound || vf_bound) {
                return Err(format!("unhealthy device {:#06x} is still bound", d.pf));
            }
            if d.scrub.is_some() && (pf_bound || vf_bound || !d.whole.is_empty()) {
                return Err(format!(
                    "device {:#06x} waits for its scrub but is leased or bound",
                    d.pf
                ));
            }
            if d.scrub.is_some() && !self.config.pools[d.pool].scrub {
                return Err(format!(
                    "device {:#06x} waits for a scrub outside a scrub pool",
                    d.pf
                ));
            }
        }
        for (&f, &h) in &self.holders {
            let ok = self.leases.values().any(|l| {
                l.spec.host == h
                    && l.units.iter().any(|u| {
                        u.pdfid == f && (!l.sliced || self.devices[u.device].resident == Some(l.id))
                    })
            });
            if !ok {
                return Err(format!("{f:#06x} is bound to host {h} without a lease"));
            }
        }
        for q in &self.queue {
            if self.leases.contains_key(&q.id) {
                return Err(format!("request {} is both queued and leased", q.id));
            }
        }
        for h in 0..self.config.manager.hosts {
            let n = self.host_units_scan(h, &BTreeSet::new());
            if n > self.config.manager.max_functions_per_host {
                return Err(format!("host {h} holds {n} functions"));
            }
            if self.derived.built && self.derived.held[usize::from(h)] != n {
                return Err(format!(
                    "host {h} holds {n} functions, the counter says {}",
                    self.derived.held[usize::from(h)]
                ));
            }
        }
        let mut by_tenant: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
        for l in self.leases.values() {
            let e = by_tenant.entry(l.spec.tenant_name()).or_default();
            e.0 += l.units.len();
            e.1 += l.units.iter().map(|u| self.unit_gpus(*u)).sum::<f64>();
        }
        for (t, u) in &self.usage {
            let (n, g) = by_tenant.remove(t.as_str()).unwrap_or_default();
            if u.functions != n || (u.rate - g).abs() > 1e-6 {
                return Err(format!(
                    "tenant {t} holds {n} functions ({g} GPUs), its use says {} ({})",
                    u.functions, u.rate
                ));
            }
            if let Some(q) = self.tenant_config(t).and_then(|c| c.quota) {
                if n > q {
                    return Err(format!("tenant {t} holds {n} functions, quota {q}"));
                }
            }
        }
        if let Some((t, _)) = by_tenant.into_iter().find(|(_, v)| v.0 > 0) {
            return Err(format!(
                "tenant {t} holds functions its use does not record"
            ));
        }
        if self.derived.built {
            if self.derived.capacity != self.capacity_scan() {
                return Err("the capacity index differs from the devices".into());
            }
            if self.derived.preemptible != self.preemptible_scan() {
                return Err("the pre-emption index differs from the leases".into());
            }
            if self.derived.sizes != self.sizes_scan() {
                return Err("the pool sizes differ from the devices".into());
            }
            let idx = &self.derived.index;
            if idx.len() != self.queue.len() {
                return Err(format!(
                    "the index has {} requests, the queue {}",
                    idx.len(),
                    self.queue.len()
                ));
            }
            for (i, q) in self.queue.iter().enumerate() {
                if idx.meta.get(&q.id).map(|m| m.pos) != Some(i) {
                    return Err(format!("request {} is not indexed at {i}", q.id));
                }
            }
        }
        Ok(())
    }

    /// The starvation bound of `Documentation/manager.rst` for a request of priority `p` that
    /// found `queued_before` requests in the queue: it is granted within this many seconds
    /// (healthy devices, the hosts of it and of the requests ahead of it up, scheduling
    /// passes at least once a second).
    ///
    /// Every request ahead is promoted by the promotion time of a priority-0 request (the
    /// request's own when nothing is ahead); from then on, each of them and the request
    /// itself is granted within `2 · max_lease_s + 1` of the previous grant: one lease
    /// length for its own host and tenant to free (a passed-over request holds them), one
    /// for the pool (a request with room that does not fit ends the pass).
    pub fn starvation_bound(&self, p: u32, queued_before: usize) -> Option<Secs> {
        let m = &self.config.manager;
        if m.aging_s == 0 {
            return None;
        }
        let lowest = if queued_before == 0 { p } else { 0 };
        let promote = u64::from(m.max_priority + 1 - lowest.min(m.max_priority)) * m.aging_s;
        Some(promote + (queued_before as u64 + 1) * (2 * m.max_lease_s + 1))
    }
}

/// A lease of no time is no lease: `duration_s` is left out (the default) or at least 1.
pub fn check_duration(spec: &RequestSpec) -> Result<(), Refused> {
    if spec.duration_s == Some(0) {
        return Err(Refused(
            "duration_s must be at least 1 (leave it out for the default lease length)".into(),
        ));
    }
    Ok(())
}
