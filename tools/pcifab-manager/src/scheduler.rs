// SPDX-License-Identifier: GPL-2.0-only

//! The scheduler: pure and deterministic, no I/O, the clock passed in (`now`, seconds).
//!
//! It keeps the pool, the leases, the queue and the fabric as it wants it (`holders`: which
//! host each function is bound to). Every operation changes that state and queues the
//! [`Action`]s (bind, unbind, move) that bring the fabric there; the daemon takes them with
//! [`Scheduler::take_actions`] and hands them to an executor. The rules (ranking, aging and its
//! starvation bound, pre-emption, sharing modes, failover) are in `Documentation/manager.rst`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::config::{Config, Mode};

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
}

fn yes() -> bool {
    true
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
}

impl Device {
    fn vf_used(&self) -> usize {
        self.vf_lease.iter().filter(|l| l.is_some()).count()
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
fn shape_of(spec: &RequestSpec) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    spec.want.hash(&mut h);
    spec.pool.hash(&mut h);
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
    pub notices: Vec<Notice>,
    pub next_id: u64,
    pub next_notice: u64,
    /// Scheduling passes run (statistics, not stored) and requests granted.
    #[serde(skip)]
    pub passes: u64,
    pub grants: u64,
    #[serde(skip)]
    actions: Vec<Action>,
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
            notices: Vec::new(),
            next_id: 1,
            next_notice: 1,
            passes: 0,
            grants: 0,
            actions: Vec::new(),
        }
    }

    /// The fabric changes decided since the last call, in the order to apply them.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    fn mode(&self, pool: usize) -> Mode {
        self.config.pools[pool].mode
    }

    fn notice(&mut self, now: Secs, host: Host, lease: u64, kind: &str, message: String) {
        self.notices.push(Notice {
            seq: self.next_notice,
            at: now,
            host,
            lease,
            kind: kind.into(),
            message,
        });
        self.next_notice += 1;
        if self.notices.len() > MAX_NOTICES {
            let extra = self.notices.len() - MAX_NOTICES;
            self.notices.drain(..extra);
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

    /// Pools a request may use, in configuration order.
    fn pools_for(&self, spec: &RequestSpec) -> Vec<usize> {
        self.config
            .pools
            .iter()
            .enumerate()
            .filter(|(_, p)| spec.pool.as_ref().is_none_or(|n| *n == p.name))
            .filter(|(_, p)| match spec.want {
                Want::Gpus { .. } => p.mode.whole(),
                Want::Vfs { .. } => p.mode.vfs(),
            })
            .map(|(i, _)| i)
            .collect()
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
        if let Some(p) = &spec.pool {
            if !self.config.pools.iter().any(|c| c.name == *p) {
                return Err(Refused(format!("no pool named '{p}'")));
            }
        }
        let pools = self.pools_for(spec);
        if pools.is_empty() {
            let what = match spec.want {
                Want::Gpus { .. } => "whole GPUs (mode whole, time-slice or hybrid)",
                Want::Vfs { .. } => "VFs (mode partition or hybrid)",
            };
            return Err(Refused(format!("no pool gives {what}")));
        }
        let fits_somewhere = pools.iter().any(|&p| {
            let devs = self
                .devices
                .iter()
                .filter(|d| d.pool == p && Self::profile_ok(d, spec));
            let cap: usize = match spec.want {
                Want::Gpus { .. } => devs.count(),
                Want::Vfs { .. } => devs.map(|d| d.vfs.len()).sum(),
            };
            cap >= need
        });
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
        self.queue.push(Queued {
            id,
            spec,
            submitted: now,
            enqueued: now,
            duration_s,
        });
        self.schedule(now);
        let granted = self.leases.contains_key(&id);
        let position = if granted {
            None
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
        if let Some(i) = self.queue.iter().position(|q| q.id == id) {
            let q = self.queue.remove(i);
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

    /// Queue indices in the order requests are considered.
    pub fn ranked(&self, now: Secs) -> Vec<usize> {
        let mut keys: Vec<(u8, u64, Secs, u64, usize)> = self
            .queue
            .iter()
            .enumerate()
            .map(|(i, q)| {
                if self.promoted(q, now) {
                    (0, 0, q.enqueued, q.id, i)
                } else {
                    let e = self.effective_priority(q, now);
                    (1, u64::MAX - e, q.enqueued, q.id, i)
                }
            })
            .collect();
        keys.sort_unstable();
        keys.into_iter().map(|k| k.4).collect()
    }

    // ---- placement --------------------------------------------------------------------

    /// Functions `host` holds through leases not in `ignore`.
    fn host_units(&self, host: Host, ignore: &BTreeSet<u64>) -> usize {
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
        let free = |l: &Option<u64>| l.is_none_or(|id| ignore.contains(&id));
        let whole_free = |d: &Device| d.whole.iter().all(|id| ignore.contains(id));
        let mode = self.mode(pool);
        let cands = self
            .devices
            .iter()
            .enumerate()
            .filter(|(i, d)| d.pool == pool && d.unhealthy.is_none() && !avoid.contains(i));
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

    /// Where a request would go (pool, units), counting `ignore` as gone.
    fn place(&self, spec: &RequestSpec, ignore: &BTreeSet<u64>) -> Option<(usize, Vec<Unit>)> {
        let need = Self::need(spec);
        if self.host_units(spec.host, ignore) + need > self.config.manager.max_functions_per_host {
            return None;
        }
        let none = BTreeSet::new();
        self.pools_for(spec)
            .into_iter()
            .find_map(|p| self.fit(p, spec, need, ignore, &none).map(|u| (p, u)))
    }

    /// Records a lease on its units and binds what it holds now.
    fn install(&mut self, lease: Lease, now: Secs) {
        let host = lease.spec.host;
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
        self.leases.insert(lease.id, lease);
    }

    /// Takes a unit back from a lease: unbinds it, or hands a time-sliced device on.
    fn uninstall_unit(&mut self, id: u64, u: Unit, now: Secs) {
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
        }
    }

    fn end_lease(&mut self, id: u64, now: Secs, kind: &str, message: String) -> Option<Lease> {
        let lease = self.leases.remove(&id)?;
        for u in lease.units.clone() {
            self.uninstall_unit(id, u, now);
        }
        self.notice(now, lease.spec.host, id, kind, message);
        Some(lease)
    }

    /// Puts a lease's request back in the queue for the time it had left.
    fn requeue(&mut self, lease: Lease, now: Secs) {
        let left = lease.expires_at.saturating_sub(now).max(1);
        self.queue.push(Queued {
            id: lease.id,
            spec: lease.spec,
            submitted: lease.submitted,
            enqueued: now,
            duration_s: left,
        });
    }

    /// Turns queue entry `qi` into a lease (the entry stays until the pass removes it).
    fn grant(&mut self, qi: usize, pool: usize, units: Vec<Unit>, now: Secs) {
        let q = self.queue[qi].clone();
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
        let fns: Vec<String> = lease
            .units
            .iter()
            .map(|u| format!("{:#06x}", u.pdfid))
            .collect();
        let msg = format!(
            "granted {} in pool '{}' until {}{}",
            fns.join(" "),
            self.config.pools[pool].name,
            lease.expires_at,
            if sliced { " (time-sliced)" } else { "" }
        );
        let (host, id) = (lease.spec.host, lease.id);
        self.install(lease, now);
        self.grants += 1;
        self.notice(now, host, id, "granted", msg);
    }

    /// Pre-emptible leases that would make room for `q`, fewest first; none if no set does.
    fn victims(&self, spec: &RequestSpec) -> Option<Vec<u64>> {
        let mut cands: Vec<&Lease> = self
            .leases
            .values()
            .filter(|l| {
                l.spec.preemptible_by_higher && l.spec.priority < spec.priority && !l.sliced
            })
            .collect();
        if cands.is_empty() {
            return None;
        }
        // Cheap check first: not even all of them together would do.
        let all: BTreeSet<u64> = cands.iter().map(|l| l.id).collect();
        self.place(spec, &all)?;
        // Lowest priority first, then the youngest lease.
        cands.sort_by_key(|l| (l.spec.priority, std::cmp::Reverse(l.granted_at), l.id));
        let mut set = BTreeSet::new();
        let mut order = Vec::new();
        for l in cands {
            set.insert(l.id);
            order.push(l.id);
            if self.place(spec, &set).is_some() {
                // Drop victims that turn out not to be needed.
                for id in order.clone().into_iter().rev() {
                    set.remove(&id);
                    if self.place(spec, &set).is_none() {
                        set.insert(id);
                    }
                }
                return Some(set.into_iter().collect());
            }
        }
        None
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

    /// Considers every queued request once, in rank order. Returns the grants made and
    /// whether leases were pre-empted.
    fn pass(&mut self, now: Secs, allow_preempt: bool) -> (usize, bool) {
        let order = self.ranked(now);
        let n = self.queue.len();
        let mut taken = vec![false; n];
        let mut granted = 0;
        let mut preempted = false;
        // Within a pass free capacity only shrinks (until a pre-emption), so a shape that did
        // not fit will not fit later in the pass.
        let mut no_fit: BTreeSet<(u64, Host)> = BTreeSet::new();
        let mut no_victims: BTreeSet<(u64, u32)> = BTreeSet::new();
        let max_units = self.config.manager.max_functions_per_host;
        for qi in order {
            let spec = &self.queue[qi].spec;
            if self.host_down(spec.host) {
                continue;
            }
            let key = (shape_of(spec), spec.host);
            if !no_fit.contains(&key) {
                let spec = spec.clone();
                if let Some((pool, units)) = self.place(&spec, &BTreeSet::new()) {
                    self.grant(qi, pool, units, now);
                    taken[qi] = true;
                    granted += 1;
                    continue;
                }
                no_fit.insert(key);
            }
            let spec = self.queue[qi].spec.clone();
            // Pre-emption frees other hosts' devices, never room under a host's own limit.
            let room =
                self.host_units(spec.host, &BTreeSet::new()) + Self::need(&spec) <= max_units;
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
                            self.grant(qi, pool, units, now);
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
                // Reserve: nothing behind a promoted request may take what it waits for.
                break;
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
        match (was, unhealthy) {
            (false, Some(reason)) => self.evacuate(di, &reason, now),
            (true, None) => {
                self.schedule(now);
            }
            _ => {}
        }
        Ok(())
    }

    fn evacuate(&mut self, di: usize, reason: &str, now: Secs) {
        let mut ids: Vec<u64> = self.devices[di].whole.clone();
        ids.extend(self.devices[di].vf_lease.iter().flatten());
        ids.sort_unstable();
        ids.dedup();
        // First nothing stays bound on a device out of the pool.
        let d = &mut self.devices[di];
        d.whole.clear();
        d.resident = None;
        d.vf_lease.iter_mut().for_each(|l| *l = None);
        let pf = d.pf;
        let fns: Vec<Pdfid> = std::iter::once(d.pf).chain(d.vfs.iter().copied()).collect();
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
                if d.unhealthy.is_some() {
                    return Err(format!(
                        "lease {} holds unhealthy device {:#06x}",
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
            let n = self.host_units(h, &BTreeSet::new());
            if n > self.config.manager.max_functions_per_host {
                return Err(format!("host {h} holds {n} functions"));
            }
        }
        Ok(())
    }

    /// The starvation bound of `Documentation/manager.rst` for a request of priority `p` that
    /// found `queued_before` requests in the queue: it is granted within this many seconds
    /// (healthy devices, its host up, scheduling passes at least once a second).
    pub fn starvation_bound(&self, p: u32, queued_before: usize) -> Option<Secs> {
        let m = &self.config.manager;
        if m.aging_s == 0 {
            return None;
        }
        let promote = u64::from(m.max_priority + 1 - p.min(m.max_priority)) * m.aging_s;
        Some(promote + (queued_before as u64 + 1) * m.max_lease_s + 1)
    }
}
