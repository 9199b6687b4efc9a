// SPDX-License-Identifier: GPL-2.0-only

//! Choosing the leases to pre-empt for a request without walking the pool.
//!
//! The rule (`Scheduler::victims_walk`, the reference): the candidates are the running
//! leases that allow pre-emption, of a priority below the request's, not time-sliced and
//! not in a scrub pool, ordered lowest priority first, then the newest lease (`granted_at`
//! later first), then the id. The victims are the shortest prefix of that order whose
//! leases, gone, make room for the request, less those of its leases that turn out not to
//! be needed (tried newest-ranked first); none if even all candidates together would not do.
//!
//! Here the same set comes from an ordered index and counts:
//!
//! - `Derived::preemptible` holds every lease that allows pre-emption (not time-sliced,
//!   not in a scrub pool) by exactly that order's key, so the candidates of a request of
//!   priority p are the index's range below p, in order: no walk over the leases.
//! - Whether all of them would do is the capacity index's question at level p
//!   (`capacity.rs`): O(distinct levels).
//! - Whether a set of leases would do is counted, not placed: the request fits a pool iff
//!   the pool's free devices (or VFs of its profile) plus those the set frees reach what it
//!   needs. [`Freed`] keeps what the set frees per pool as leases join or leave it, looking
//!   only at the devices of those leases, never at the pool.
//!
//! Fitting only grows with the set (more leases gone never make less room), so the walk
//! along the order that stops at the first prefix that fits finds the prefix the
//! reference's binary search finds, and the dropping pass is the reference's, with each
//! `place` replaced by the count. The request's own room (host limit, quota) is checked
//! before (the pass pre-empts only for a request with room, and gone leases only add
//! room); without it, or without the indexes, the reference runs. The randomized test
//! `indexed_victims_match_the_walk` compares both on many seeded states.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::{Lease, Mode, RequestSpec, Scheduler, Secs, Want};

/// A lease's place in the order victims are chosen in: priority, newest first, id.
pub(super) type PreemptKey = (u32, Reverse<Secs>, u64);

/// What pre-empting a set of leases frees for one request, per pool: devices it could have
/// whole (in a time-slice pool: devices with room for a sharer) and VFs of its profile.
struct Freed<'a> {
    s: &'a Scheduler,
    spec: &'a RequestSpec,
    set: BTreeSet<u64>,
    /// Per pool: (devices, VFs) freed by `set`.
    gained: Vec<(isize, isize)>,
    /// The request's pools with what they have free now: (pool, free units of its kind).
    targets: Vec<(usize, isize)>,
    need: isize,
    /// The devices of the lease joining or leaving, with their gain before (reused).
    scratch: Vec<(usize, (isize, isize))>,
}

impl<'a> Freed<'a> {
    fn new(s: &'a Scheduler, spec: &'a RequestSpec) -> Self {
        let targets = s
            .pools_iter(spec)
            .map(|p| (p, s.free_units(p, spec, 0) as isize))
            .collect();
        Self {
            s,
            spec,
            set: BTreeSet::new(),
            gained: vec![(0, 0); s.config.pools.len()],
            targets,
            need: Scheduler::need(spec) as isize,
            scratch: Vec::new(),
        }
    }

    /// Whether the request fits once the set is gone (its room aside).
    fn fits(&self) -> bool {
        let vfs = matches!(self.spec.want, Want::Vfs { .. });
        self.targets.iter().any(|&(p, free)| {
            let (dev, vf) = self.gained[p];
            free + if vfs { vf } else { dev } >= self.need
        })
    }

    /// Device `di`'s share of what the set frees: (usable whole, usable VFs).
    fn device_gain(&self, di: usize) -> (isize, isize) {
        let s = self.s;
        let d = &s.devices[di];
        if !d.in_pool() {
            return (0, 0);
        }
        let pool = &s.config.pools[d.pool];
        let gone = |id: &u64| self.set.contains(id);
        if pool.mode == Mode::TimeSlice {
            let sharers = d.whole.iter().filter(|id| !gone(id)).count();
            return (isize::from(sharers < pool.max_sharers), 0);
        }
        if !d.whole.iter().all(gone) {
            return (0, 0);
        }
        let nfree = d
            .vf_lease
            .iter()
            .filter(|l| l.as_ref().is_none_or(gone))
            .count();
        let whole = isize::from(nfree == d.vf_lease.len());
        let vfs = if Scheduler::profile_ok(d, self.spec) {
            nfree as isize
        } else {
            0
        };
        (whole, vfs)
    }

    /// Lease `id` joins the set (`add`) or leaves it.
    fn change(&mut self, id: u64, add: bool) {
        let Some(l) = self.s.leases.get(&id) else {
            return;
        };
        let mut before = std::mem::take(&mut self.scratch);
        before.clear();
        before.extend(l.units.iter().map(|u| (u.device, (0, 0))));
        // Each device once.
        before.sort_unstable_by_key(|&(di, _)| di);
        before.dedup_by_key(|&mut (di, _)| di);
        for e in before.iter_mut() {
            e.1 = self.device_gain(e.0);
        }
        if add {
            self.set.insert(id);
        } else {
            self.set.remove(&id);
        }
        for &(di, (d0, v0)) in &before {
            let (d1, v1) = self.device_gain(di);
            let g = &mut self.gained[self.s.devices[di].pool];
            g.0 += d1 - d0;
            g.1 += v1 - v0;
        }
        self.scratch = before;
    }
}

impl Scheduler {
    /// A lease's key in the pre-emption index; none if it can never be pre-empted.
    pub(super) fn preempt_key(&self, l: &Lease) -> Option<PreemptKey> {
        let scrub = self.config.pools.get(l.pool).is_none_or(|p| p.scrub);
        (l.spec.preemptible_by_higher && !l.sliced && !scrub).then_some((
            l.spec.priority,
            Reverse(l.granted_at),
            l.id,
        ))
    }

    /// The pre-emption index from scratch.
    pub(super) fn preemptible_scan(&self) -> BTreeSet<PreemptKey> {
        self.leases
            .values()
            .filter_map(|l| self.preempt_key(l))
            .collect()
    }

    /// Units of `spec`'s kind that pool `p` has at level `level` or below (`capacity.rs`;
    /// 0: free now). A time-slice pool's devices are never pre-empted: its free ones.
    pub(super) fn free_units(&self, p: usize, spec: &RequestSpec, level: u64) -> usize {
        let Some(pc) = self.derived.capacity.pools.get(p) else {
            return 0;
        };
        if self.mode(p) == Mode::TimeSlice {
            return match spec.want {
                Want::Gpus { .. } => pc.devices.at_most(0),
                Want::Vfs { .. } => 0,
            };
        }
        match &spec.want {
            Want::Gpus { .. } => pc.devices.at_most(level),
            Want::Vfs {
                profile: Some(prof),
                ..
            } => pc.vfs_by_profile.get(prof).map_or(0, |h| h.at_most(level)),
            Want::Vfs { profile: None, .. } => pc.vfs.at_most(level),
        }
    }

    /// Pre-emptible leases that would make room for `spec`, fewest first; none if no set
    /// does. The same set as [`Self::victims_walk`], from the indexes (see above).
    pub(super) fn victims(&self, spec: &RequestSpec) -> Option<Vec<u64>> {
        if !self.derived.built || !self.room(spec, &BTreeSet::new()) {
            return self.victims_walk(spec);
        }
        let below = (spec.priority, Reverse(Secs::MAX), 0);
        let mut cands = self
            .derived
            .preemptible
            .range(..below)
            .map(|&(_, _, id)| id)
            .peekable();
        cands.peek()?;
        // Not even all of them together would do.
        let need = Self::need(spec);
        let level = u64::from(spec.priority);
        if !self
            .pools_iter(spec)
            .any(|p| self.free_units(p, spec, level) >= need)
        {
            return None;
        }
        // The shortest prefix that makes room.
        let mut freed = Freed::new(self, spec);
        let mut order = Vec::new();
        for id in cands {
            order.push(id);
            freed.change(id, true);
            if freed.fits() {
                break;
            }
        }
        if !freed.fits() {
            // The indexes disagree with the leases (never, `check_invariants` says so).
            return self.victims_walk(spec);
        }
        // Drop victims that turn out not to be needed.
        for &id in order.iter().rev() {
            freed.change(id, false);
            if !freed.fits() {
                freed.change(id, true);
            }
        }
        Some(freed.set.into_iter().collect())
    }

    /// The reference choice of victims: every lease looked at, and each candidate set
    /// placed over the pool's devices. Used while the indexes are not built (and by the
    /// full scan of the tests).
    pub(super) fn victims_walk(&self, spec: &RequestSpec) -> Option<Vec<u64>> {
        let mut cands: Vec<&Lease> = self
            .leases
            .values()
            .filter(|l| {
                l.spec.preemptible_by_higher
                    && l.spec.priority < spec.priority
                    && !l.sliced
                    && !self.config.pools[l.pool].scrub
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
        // The shortest prefix of that order that makes room (more victims never make less
        // room, so a binary search finds the prefix the one-by-one walk would).
        let order: Vec<u64> = cands.iter().map(|l| l.id).collect();
        let fits = |m: usize| {
            self.place(spec, &order[..m].iter().copied().collect())
                .is_some()
        };
        let (mut lo, mut hi) = (1, order.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let order = &order[..lo];
        let mut set: BTreeSet<u64> = order.iter().copied().collect();
        // Drop victims that turn out not to be needed.
        for &id in order.iter().rev() {
            set.remove(&id);
            if self.place(spec, &set).is_none() {
                set.insert(id);
            }
        }
        Some(set.into_iter().collect())
    }
}
