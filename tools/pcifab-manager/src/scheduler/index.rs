// SPDX-License-Identifier: GPL-2.0-only

//! The queue's indexes, so a scheduling pass looks only at what can change its outcome.
//!
//! Requests are grouped by class: shape (what they ask for and where), priority, tenant and
//! host. Within a class the rank order is the order of `(enqueued, id)`: the older request
//! has the higher (or equal) effective priority and the same fair-share factor. So the best
//! request of any set of classes is the best of their first entries, and the pass needs only
//! those (`Class::heads`), never the whole queue. Promoted requests (aged above every fresh
//! priority) rank first, oldest first: they leave their class for `promoted` when their time
//! comes (`pending`, keyed by that time). `order` keeps each (priority, tenant)'s requests
//! sorted, to count a new request's position by binary search.
//!
//! `ops` counts the entries and tree operations the pass and the index touch: the benchmark
//! and its test measure the cost of a decision with it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use super::{Host, RequestSpec, Secs, Want};

/// What requests of one shape ask for, and where.
/// (what, the pool asked for, the admission class: `Scheduler::admission_class`)
pub(super) type ShapeKey = (Want, Option<String>, Option<String>);

/// Where a queued request is and what it is.
#[derive(Clone, Copy, Debug)]
pub(super) struct Meta {
    /// Its position in `Scheduler::queue`.
    pub pos: usize,
    pub enq: Secs,
    pub prio: u32,
    pub tenant: usize,
    pub shape: usize,
    pub host: Host,
    pub promoted: bool,
    /// Queued again during the pass now running: the pass does not see it (as the full scan
    /// ranks the queue once at the start of a pass).
    pub hidden: bool,
}

/// The requests of one shape, priority and tenant, by host.
#[derive(Clone, Debug, Default)]
pub(super) struct Class {
    pub by_host: BTreeMap<Host, BTreeSet<(Secs, u64)>>,
    /// The first request of each host, in rank order.
    pub heads: BTreeSet<(Secs, u64, Host)>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct QueueIndex {
    /// The settings it was built for.
    pub aging: u64,
    pub max_prio: u32,
    pub tenants: Vec<String>,
    /// The time of the last pass and the newest `enqueued`.
    pub last_now: Secs,
    pub max_enq: Secs,
    pub meta: HashMap<u64, Meta>,
    pub shape_ids: HashMap<ShapeKey, usize>,
    /// One request of each shape (its `want`, `pool` and admission class are the shape).
    pub shape_spec: Vec<RequestSpec>,
    /// The pools each shape may use, in order.
    pub shape_pools: Vec<Vec<usize>>,
    /// Promoted requests by (enqueued, id).
    pub promoted: BTreeSet<(Secs, u64)>,
    /// Requests not yet promoted, by (time of promotion, id).
    pub pending: BTreeSet<(Secs, u64)>,
    /// shape -> (priority, tenant) -> class (promoted requests are not in it).
    pub classes: BTreeMap<usize, BTreeMap<(u32, usize), Class>>,
    /// (priority, tenant) -> all its requests, sorted by (enqueued, id).
    pub order: BTreeMap<(u32, usize), Vec<(Secs, u64)>>,
    /// Entries examined and tree operations.
    pub ops: u64,
}

/// ceil(log2(n + 1)): the comparisons of a binary search or a tree operation on n entries.
fn log_ops(n: usize) -> u64 {
    u64::from(usize::BITS - n.leading_zeros()).max(1)
}

impl QueueIndex {
    pub fn new(aging: u64, max_prio: u32, tenants: Vec<String>) -> Self {
        Self {
            aging,
            max_prio,
            tenants,
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// When a request queued at `enq` with priority `prio` is promoted; none without aging.
    pub fn promote_at(&self, enq: Secs, prio: u32) -> Option<Secs> {
        if self.aging == 0 {
            return None;
        }
        if prio > self.max_prio {
            return Some(0);
        }
        let steps = u64::from(self.max_prio - prio) + 1;
        Some(enq.saturating_add(steps.saturating_mul(self.aging)))
    }

    pub fn shape_id(&mut self, spec: &RequestSpec, class: Option<&str>) -> usize {
        let key = (
            spec.want.clone(),
            spec.pool.clone(),
            class.map(str::to_string),
        );
        if let Some(&s) = self.shape_ids.get(&key) {
            return s;
        }
        let s = self.shape_spec.len();
        self.shape_ids.insert(key, s);
        self.shape_spec.push(spec.clone());
        s
    }

    /// Records a request; a hidden one is placed by `reveal`.
    pub fn insert(&mut self, id: u64, m: Meta) {
        self.max_enq = self.max_enq.max(m.enq);
        self.meta.insert(id, m);
        self.ops += 1;
        if !m.hidden {
            self.place(id);
        }
    }

    /// Puts a request into the structures the pass reads.
    pub fn reveal(&mut self, id: u64) {
        let Some(m) = self.meta.get_mut(&id) else {
            return;
        };
        if m.hidden {
            m.hidden = false;
            self.place(id);
        }
    }

    fn place(&mut self, id: u64) {
        let m = self.meta[&id];
        let v = self.order.entry((m.prio, m.tenant)).or_default();
        let at = v.partition_point(|k| *k < (m.enq, id));
        self.ops += log_ops(v.len());
        v.insert(at, (m.enq, id));
        match self.promote_at(m.enq, m.prio) {
            Some(t) if t <= self.last_now => {
                self.promoted.insert((m.enq, id));
                self.meta.get_mut(&id).expect("just inserted").promoted = true;
            }
            t => {
                self.class_insert(id, &m);
                if let Some(t) = t {
                    self.pending.insert((t, id));
                }
            }
        }
        self.ops += 2;
    }

    /// Forgets a request; returns where it was.
    pub fn remove(&mut self, id: u64) -> Option<Meta> {
        let m = self.meta.remove(&id)?;
        self.ops += 1;
        if m.hidden {
            return Some(m);
        }
        if let Some(v) = self.order.get_mut(&(m.prio, m.tenant)) {
            let at = v.partition_point(|k| *k < (m.enq, id));
            self.ops += log_ops(v.len());
            if v.get(at) == Some(&(m.enq, id)) {
                v.remove(at);
            }
            if v.is_empty() {
                self.order.remove(&(m.prio, m.tenant));
            }
        }
        if m.promoted {
            self.promoted.remove(&(m.enq, id));
        } else {
            self.class_remove(id, &m);
            if let Some(t) = self.promote_at(m.enq, m.prio) {
                self.pending.remove(&(t, id));
            }
        }
        self.ops += 2;
        Some(m)
    }

    /// Promotes what is due at `now`.
    pub fn sweep(&mut self, now: Secs) {
        self.last_now = self.last_now.max(now);
        while let Some(&(t, id)) = self.pending.first() {
            self.ops += 1;
            if t > now {
                break;
            }
            self.pending.pop_first();
            let Some(m) = self.meta.get(&id).copied() else {
                continue;
            };
            self.class_remove(id, &m);
            self.promoted.insert((m.enq, id));
            if let Some(e) = self.meta.get_mut(&id) {
                e.promoted = true;
            }
            self.ops += 2;
        }
    }

    fn class_insert(&mut self, id: u64, m: &Meta) {
        let c = self
            .classes
            .entry(m.shape)
            .or_default()
            .entry((m.prio, m.tenant))
            .or_default();
        let set = c.by_host.entry(m.host).or_default();
        let old = set.first().copied();
        set.insert((m.enq, id));
        let new = set.first().copied();
        if old != new {
            if let Some((e, i)) = old {
                c.heads.remove(&(e, i, m.host));
            }
            if let Some((e, i)) = new {
                c.heads.insert((e, i, m.host));
            }
        }
        self.ops += 3;
    }

    fn class_remove(&mut self, id: u64, m: &Meta) {
        let Some(by_shape) = self.classes.get_mut(&m.shape) else {
            return;
        };
        let Some(c) = by_shape.get_mut(&(m.prio, m.tenant)) else {
            return;
        };
        if let Some(set) = c.by_host.get_mut(&m.host) {
            let old = set.first().copied();
            set.remove(&(m.enq, id));
            let new = set.first().copied();
            if old != new {
                if let Some((e, i)) = old {
                    c.heads.remove(&(e, i, m.host));
                }
                if let Some((e, i)) = new {
                    c.heads.insert((e, i, m.host));
                }
            }
            if set.is_empty() {
                c.by_host.remove(&m.host);
            }
        }
        if c.by_host.is_empty() {
            by_shape.remove(&(m.prio, m.tenant));
        }
        if by_shape.is_empty() {
            self.classes.remove(&m.shape);
        }
        self.ops += 3;
    }

    /// How many queued requests rank before a request of priority `prio` and fair-share
    /// factor `f` queued at `now` after all of them (itself not counted if queued). Needs
    /// every `enqueued` at or before `now`.
    pub fn count_before(&mut self, prio: u32, f: f64, factors: &[f64], now: Secs) -> usize {
        let mut n = 0;
        let mut ops = 0;
        for (&(pp, t), v) in &self.order {
            ops += log_ops(v.len());
            let ft = factors.get(t).copied().unwrap_or(1.0);
            // Equal effective priority ranks first with a factor at least as high (ties: the
            // older first, and all of these are older).
            let k = u64::from(prio) + u64::from(ft.total_cmp(&f) == std::cmp::Ordering::Less);
            let le = |x: Option<Secs>| match x {
                None => 0,
                Some(x) => v.partition_point(|(e, _)| *e <= x),
            };
            if self.aging == 0 {
                if u64::from(pp) >= k {
                    n += v.len();
                }
                continue;
            }
            if pp > self.max_prio {
                n += v.len();
                continue;
            }
            // Effective priority >= k, which includes the promoted (k <= max_prio + 1).
            let ge = if k <= u64::from(pp) {
                v.len()
            } else {
                le(now.checked_sub((k - u64::from(pp)).saturating_mul(self.aging)))
            };
            n += ge;
        }
        self.ops += ops;
        n
    }
}

/// A non-promoted request's place in the rank order: effective priority (higher first),
/// fair-share factor (higher first), enqueued, id.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct RankKey {
    pub e: u64,
    pub f: f64,
    pub enq: Secs,
    pub id: u64,
}

impl RankKey {
    pub fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.e.cmp(&self.e)
            .then(o.f.total_cmp(&self.f))
            .then(self.enq.cmp(&o.enq))
            .then(self.id.cmp(&o.id))
    }
}

/// The first `(enqueued, id)` of class (priority `p`, factor `f`) that ranks after `c`, as
/// a lower bound for a range over the class's sets; none if nothing of it can. Needs every
/// `enqueued` at or before `now`.
pub(super) fn after_bound(
    p: u32,
    f: f64,
    c: &RankKey,
    now: Secs,
    aging: u64,
) -> Option<Bound<(Secs, u64)>> {
    use std::cmp::Ordering::*;
    let p = u64::from(p);
    let fo = f.total_cmp(&c.f);
    let excl = |enq: i128, id: u64| -> Bound<(Secs, u64)> {
        if enq < 0 {
            Bound::Unbounded
        } else {
            Bound::Excluded((enq as Secs, id))
        }
    };
    if aging == 0 {
        return match (p.cmp(&c.e), fo) {
            (Less, _) | (Equal, Less) => Some(Bound::Unbounded),
            (Greater, _) | (Equal, Greater) => None,
            (Equal, Equal) => Some(Bound::Excluded((c.enq, c.id))),
        };
    }
    if c.e < p {
        return None;
    }
    let d = i128::from(c.e - p);
    let (now, aging) = (i128::from(now), i128::from(aging));
    // enq > le_from: effective priority <= c.e; enq > lt_from: below c.e.
    let le_from = now - (d + 1) * aging;
    let lt_from = now - d * aging;
    Some(match fo {
        Less => excl(le_from, u64::MAX),
        Greater => excl(lt_from, u64::MAX),
        Equal => {
            // After: below c.e, or equal to it and after c in (enqueued, id).
            let c_pos = (i128::from(c.enq), c.id).min((lt_from, u64::MAX));
            let (e, i) = (le_from, u64::MAX).max(c_pos);
            excl(e, i)
        }
    })
}
