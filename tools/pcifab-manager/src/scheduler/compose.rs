// SPDX-License-Identifier: GPL-2.0-only

//! Composition: the functions a host holds set to a named list (`pcifab compose`, the
//! Redfish Zone PATCH). Functions no longer named end with their leases; whole devices newly
//! named are granted now, one lease per pool. Each grant goes through the checks a request
//! does (host, priority, tenant, quota, the host's limit), never overtakes the queue (a pool
//! a waiting request of at least the same priority could use is refused, not granted), and
//! the whole composition is applied or nothing is.

use super::*;

/// What a composition changes: the leases it ends, and per pool the devices it grants.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub release: Vec<u64>,
    pub add: BTreeMap<usize, Vec<Pdfid>>,
}

/// What a composition did: leases ended and leases granted (their ids).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Composed {
    pub released: Vec<u64>,
    pub granted: Vec<u64>,
}

impl Scheduler {
    /// What making `host` hold exactly `functions` would change; the error says why it
    /// cannot.
    pub fn composition_plan(&self, host: Host, functions: &[Pdfid]) -> Result<Plan, Refused> {
        if host >= self.config.manager.hosts {
            return Err(Refused(format!(
                "host {host} is not in this fabric (hosts 0-{})",
                self.config.manager.hosts.saturating_sub(1)
            )));
        }
        let mut wanted = BTreeSet::new();
        for &f in functions {
            if !wanted.insert(f) {
                return Err(Refused(format!("{f:#06x} is named twice")));
            }
        }
        let mut plan = Plan::default();
        let mut held = BTreeSet::new();
        for l in self.leases.values().filter(|l| l.spec.host == host) {
            let kept: Vec<Pdfid> = l
                .units
                .iter()
                .map(|u| u.pdfid)
                .filter(|f| wanted.contains(f))
                .collect();
            if kept.is_empty() {
                plan.release.push(l.id);
            } else if kept.len() < l.units.len() {
                let all: Vec<String> = l
                    .units
                    .iter()
                    .map(|u| format!("{:#06x}", u.pdfid))
                    .collect();
                return Err(Refused(format!(
                    "lease {} holds {} together: name all of them or none",
                    l.id,
                    all.join(" ")
                )));
            }
            held.extend(l.units.iter().map(|u| u.pdfid));
        }
        for f in wanted.difference(&held) {
            let di = match self.device_of(*f) {
                Some(di) => di,
                None if self.devices.iter().any(|d| d.vfs.contains(f)) => {
                    return Err(Refused(format!(
                        "{f:#06x} is a VF: a composition grants whole devices; ask for VFs \
                         with `pcifab request --vfs`"
                    )))
                }
                None => {
                    return Err(Refused(format!(
                        "{f:#06x} is not the PF of a pool device (`pcifab pools` lists them)"
                    )))
                }
            };
            plan.add.entry(self.devices[di].pool).or_default().push(*f);
        }
        Ok(plan)
    }

    /// Makes `host` (`base.host`) hold exactly `functions`; the grants take their priority,
    /// duration, tenant and owner from `base`. All or nothing.
    pub fn compose(
        &mut self,
        base: &RequestSpec,
        functions: &[Pdfid],
        now: Secs,
    ) -> Result<Composed, Refused> {
        super::check_duration(base)?;
        let plan = self.composition_plan(base.host, functions)?;
        if plan.release.is_empty() && plan.add.is_empty() {
            return Ok(Composed::default());
        }
        // Applied to a copy first: a release hands devices to the queue, which may take one
        // the composition names; then the copy is refused and this state is untouched.
        let mut t = self.clone();
        let mut done = Composed::default();
        for &id in &plan.release {
            t.release(id, now)?;
            done.released.push(id);
        }
        for (&pool, pfs) in &plan.add {
            done.granted.push(t.grant_exact(base, pool, pfs, now)?);
        }
        *self = t;
        Ok(done)
    }

    /// Grants `pfs` of `pool` to `base.host` in one lease, now, or says why not.
    fn grant_exact(
        &mut self,
        base: &RequestSpec,
        pool: usize,
        pfs: &[Pdfid],
        now: Secs,
    ) -> Result<u64, Refused> {
        let name = self.config.pools[pool].name.clone();
        if !matches!(self.mode(pool), Mode::Whole | Mode::Hybrid) {
            return Err(Refused(format!(
                "pool '{name}' does not lend whole devices to one host alone (mode {:?}); \
                 ask with `pcifab request`",
                self.mode(pool)
            )));
        }
        let count = u32::try_from(pfs.len())
            .map_err(|_| Refused("too many functions in one composition".into()))?;
        let mut spec = base.clone();
        spec.want = Want::Gpus { count };
        spec.pool = Some(name.clone());
        self.validate(&spec)?;
        if self.host_down(spec.host) {
            return Err(Refused(format!(
                "host {} is down: nothing is granted to it until its agent sends a heartbeat",
                spec.host
            )));
        }
        let mut units = Vec::with_capacity(pfs.len());
        for &pf in pfs {
            let di = self
                .device_of(pf)
                .ok_or_else(|| Refused(format!("{pf:#06x} is not the PF of a pool device")))?;
            let d = &self.devices[di];
            if !d.in_pool() {
                return Err(Refused(format!(
                    "{pf:#06x} is out of the pool ({}); `pcifab pools` says why",
                    d.unhealthy.as_deref().unwrap_or("waiting for its scrub")
                )));
            }
            let users: BTreeSet<u64> = d
                .whole
                .iter()
                .copied()
                .chain(d.vf_lease.iter().flatten().copied())
                .collect();
            if !users.is_empty() {
                let ids: Vec<String> = users.iter().map(u64::to_string).collect();
                return Err(Refused(format!(
                    "{pf:#06x} is not free: lease {} holds it",
                    ids.join(", ")
                )));
            }
            units.push(Unit {
                device: di,
                pdfid: pf,
            });
        }
        if !self.room(&spec, &BTreeSet::new()) {
            return Err(Refused(format!(
                "host {} or tenant '{}' would hold more functions than allowed \
                 (max_functions_per_host, the tenant's quota)",
                spec.host,
                spec.tenant_name()
            )));
        }
        if let Some(q) = self.queue.iter().find(|q| {
            self.pools_for(&q.spec).contains(&pool)
                && self.effective_priority(q, now) >= u64::from(spec.priority)
        }) {
            return Err(Refused(format!(
                "request {} (priority {}) waits for pool '{name}': a composition does not \
                 overtake the queue; ask with `pcifab request` to wait in turn",
                q.id,
                self.effective_priority(q, now)
            )));
        }
        let m = &self.config.manager;
        let duration_s = spec
            .duration_s
            .unwrap_or(m.default_lease_s)
            .clamp(1, m.max_lease_s);
        let id = self.next_id;
        self.next_id += 1;
        self.grant(
            Queued {
                id,
                spec,
                submitted: now,
                enqueued: now,
                duration_s,
            },
            pool,
            units,
            now,
        );
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
[manager]
hosts = 2
max_functions_per_host = 3

[[pools]]
name = "gpus"
mode = "hybrid"
[[pools.devices]]
pf = 0x0100
vfs = [0x0101, 0x0102]
[[pools.devices]]
pf = 0x0200
vfs = [0x0201]
[[pools.devices]]
pf = 0x0300

[[pools]]
name = "shared"
mode = "time-slice"
[[pools.devices]]
pf = 0x0400
"#;

    fn sched() -> Scheduler {
        Scheduler::new(Config::parse(CONFIG).expect("config"))
    }

    fn base(host: Host) -> RequestSpec {
        RequestSpec {
            host,
            want: Want::Gpus { count: 1 },
            priority: 1,
            duration_s: Some(100),
            preemptible_by_higher: false,
            migratable: true,
            pool: None,
            tenant: None,
            owner: Some("ops".into()),
            tag: None,
        }
    }

    fn holds(s: &Scheduler, host: Host) -> Vec<Pdfid> {
        s.holders
            .iter()
            .filter(|(_, &h)| h == host)
            .map(|(&f, _)| f)
            .collect()
    }

    #[test]
    fn composes_adds_and_removes_all_or_nothing() {
        let mut s = sched();
        let c = s.compose(&base(0), &[0x0100, 0x0200], 10).expect("compose");
        assert_eq!(c.released, Vec::<u64>::new());
        assert_eq!(c.granted.len(), 1);
        assert_eq!(holds(&s, 0), vec![0x0100, 0x0200]);
        s.check_invariants().expect("invariants");
        // Both in one lease: naming one alone is refused and changes nothing.
        let before = s.clone();
        let e = s.compose(&base(0), &[0x0100], 11).expect_err("partial");
        assert!(e.0.contains("name all of them or none"), "{e}");
        assert_eq!(s, before);
        // Swap the lease for 0x0300: released and granted in one step.
        let c = s.compose(&base(0), &[0x0300], 12).expect("swap");
        assert_eq!(c.released.len(), 1);
        assert_eq!(holds(&s, 0), vec![0x0300]);
        s.check_invariants().expect("invariants");
        // The same list again changes nothing.
        assert_eq!(
            s.compose(&base(0), &[0x0300], 13).expect("same"),
            Composed::default()
        );
    }

    #[test]
    fn refuses_what_a_request_would_not_get() {
        let mut s = sched();
        s.compose(&base(0), &[0x0100], 10).expect("compose");
        let before = s.clone();
        let refused = |s: &mut Scheduler, host, f: &[Pdfid], what: &str| {
            let e = s.compose(&base(host), f, 11).expect_err(what);
            assert!(e.0.contains(what), "{what}: {e}");
        };
        refused(&mut s, 1, &[0x0100], "not free");
        refused(&mut s, 1, &[0x0101], "is a VF");
        refused(&mut s, 1, &[0x0999], "not the PF");
        refused(&mut s, 1, &[0x0200, 0x0200], "named twice");
        refused(&mut s, 1, &[0x0400], "does not lend whole devices");
        refused(&mut s, 7, &[0x0200], "not in this fabric");
        // Adding 0x0200 is refused because 0x0100 is taken: host 1 gets nothing.
        refused(&mut s, 1, &[0x0200, 0x0100], "not free");
        assert_eq!(s, before);
        // A waiting request of the same priority for the pool keeps its turn.
        let mut spec = base(1);
        spec.want = Want::Gpus { count: 3 };
        let sub = s.submit(spec, 12).expect("submit");
        assert!(!sub.granted);
        let before = s.clone();
        refused(&mut s, 0, &[0x0100, 0x0200], "does not overtake the queue");
        assert_eq!(s, before);
        s.check_invariants().expect("invariants");
    }

    #[test]
    fn a_released_device_goes_to_the_queue_first() {
        let mut s = sched();
        s.compose(&base(0), &[0x0100, 0x0200, 0x0300], 10)
            .expect("compose");
        // Host 1 waits for one GPU.
        let mut spec = base(1);
        spec.priority = 5;
        spec.pool = Some("gpus".into());
        assert!(!s.submit(spec, 11).expect("submit").granted);
        // Host 0 gives its devices back: the waiting request gets one at once.
        let c = s.compose(&base(0), &[], 12).expect("release all");
        assert_eq!(c.released.len(), 1);
        assert_eq!(holds(&s, 0), Vec::<Pdfid>::new());
        assert_eq!(holds(&s, 1).len(), 1);
        assert!(s.queue.is_empty());
        s.check_invariants().expect("invariants");
    }

    #[test]
    fn a_refused_grant_keeps_the_leases_it_would_end() {
        let mut s = sched();
        s.compose(&base(0), &[0x0100], 10).expect("host 0");
        s.compose(&base(1), &[0x0200], 10).expect("host 1");
        let before = s.clone();
        let e = s.compose(&base(0), &[0x0200], 11).expect_err("taken");
        assert!(e.0.contains("not free"), "{e}");
        assert_eq!(s, before);
        assert_eq!(holds(&s, 0), vec![0x0100]);
    }
}
