// SPDX-License-Identifier: GPL-2.0-only

//! The daemon: the scheduler, its store, an executor, telemetry; the control socket that
//! serves it is in the `socket` module.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::{json, Value};

use crate::{
    auth::{Denied, Principal, Principals},
    config::Config,
    executor::Executor,
    liveness::Liveness,
    protocol::{self, Request},
    scheduler::persist::{self, Image},
    scheduler::{Action, Host, Pdfid, Scheduler, Scrub, Secs},
    scrub::{Report, ScrubError, Scrubber},
    store::{LogEntry, Retention, StateStore},
    telemetry::{Judge, Sample, Source, Verdict},
};

pub use crate::clock::{steady_clock, unix_now, Clock};

/// Telemetry polling: where samples come from and which functions to read.
pub struct Telemetry {
    pub source: Box<dyn Source + Send>,
    /// Every function to poll (the whole inventory, not only the pools).
    pub functions: Vec<Pdfid>,
    pub judge: Judge,
    pub last_poll: Option<Secs>,
    pub samples: BTreeMap<Pdfid, Result<Sample, String>>,
}

pub struct Daemon {
    pub sched: Scheduler,
    pub store: Box<dyn StateStore>,
    /// What the store holds: a commit writes the records that differ from it.
    image: Image,
    pub exec: Box<dyn Executor + Send>,
    pub clock: Clock,
    pub telemetry: Option<Telemetry>,
    /// Failed actions, most recent last (also in the log).
    pub failures: Vec<String>,
    /// The hosts' upstream links, read before every decision (the driver executor's
    /// inventory): up counts as a heartbeat.
    pub liveness: Option<Box<dyn Liveness + Send>>,
    /// The link states last seen, to log changes; the last read error, to log it once.
    links: BTreeMap<Host, bool>,
    link_error: Option<String>,
    /// Erases devices of scrub pools between holders (none: such a device fails its scrub).
    pub scrubber: Option<Arc<dyn Scrubber>>,
    /// Scrubs running, one thread each.
    scrubbing: BTreeMap<Pdfid, std::thread::JoinHandle<Result<Report, ScrubError>>>,
    /// The last scrubs' outcomes, most recent last (the `pool` reply's `scrubs`).
    pub scrubs: Vec<Value>,
    /// Who may do what (the configuration's `[[principals]]`).
    pub principals: Arc<Principals>,
    /// The network API's settings (`[api]`); none: the local socket only.
    pub api: Option<crate::config::ApiConfig>,
    /// Requests served, by operation and outcome, and how long they took (`/metrics`).
    pub stats: crate::stats::Stats,
    /// The network API's replies and connections (`/metrics`), counted by the API.
    pub http: Arc<crate::stats::HttpStats>,
    /// The configuration file, read again for its principals on SIGHUP.
    pub config_path: Option<std::path::PathBuf>,
    /// The scheduler's next notice number as of the last commit: the API's long polls of
    /// `events` wait for it to change ([`Daemon::notices`]).
    notices: tokio::sync::watch::Sender<u64>,
    /// Actions were held back because the executor was not ready (a highly available
    /// manager that could not confirm it still leads): once it is, the fabric is brought to
    /// the scheduler's state as at a start.
    fabric_behind: bool,
    /// A commit that failed may be stored all the same (etcd may still commit a transaction
    /// it did not confirm in time): after one, the state is read again from the store
    /// before the next decision (a highly available manager). Either way a request whose
    /// commit fails leaves the scheduler as it was before it: the client is told it failed,
    /// so it must not be carried out later.
    pub reload_after_failed_commit: bool,
    /// With `reload_after_failed_commit`: a commit failed, and the store may hold it all
    /// the same. Before the next decision the state is read again from the store.
    state_unknown: bool,
    /// For the tests of high availability only (`PCIFAB_MANAGER_TEST_STOP_AFTER_KEYED=N`,
    /// read by `main`): after the Nth request with an idempotency key is committed, and
    /// before it is carried out or answered, the manager says so on stderr and stops itself
    /// with SIGSTOP, so a test can kill it at exactly that point.
    pub stop_after_keyed: Option<u64>,
    keyed_commits: u64,
}

/// Scrub outcomes kept for the `pool` reply.
const SCRUBS_KEPT: usize = 64;

impl Daemon {
    /// Loads the stored state (or starts one from `config`), takes the configuration's
    /// manager, failover and telemetry settings, and brings the fabric to the stored state.
    pub fn start(
        config: Config,
        store: impl StateStore + 'static,
        mut exec: Box<dyn Executor + Send>,
        clock: Clock,
    ) -> Result<Self, String> {
        let principals = Principals::new(
            config.principals.clone(),
            config.manager.hosts,
            config
                .manager
                .tenants
                .iter()
                .map(|t| t.name.clone())
                .collect(),
        )?;
        let api = config.api.clone();
        let (sched, image) = match persist::load(&store)? {
            Some((mut s, image)) => {
                crate::config::take_pool_principals(&mut s.config.pools, &config.pools);
                if image.migrating() {
                    eprintln!(
                        "pcifab-manager: the state is of an older format; it is stored again \
                         as format {} (one record per lease, request, notice...) by the first \
                         commit",
                        persist::FORMAT
                    );
                }
                if s.config.pools != config.pools {
                    eprintln!(
                        "pcifab-manager: the pools in the configuration differ from the stored \
                         state; keeping the stored pools (start with an empty --state directory \
                         to change them)"
                    );
                }
                s.config.manager = config.manager.clone();
                s.config.failover = config.failover.clone();
                s.config.telemetry = config.telemetry.clone();
                (s, image)
            }
            None => (Scheduler::new(config), Image::default()),
        };
        let actual = exec.fabric(&sched.pool_functions())?;
        let fix = sched.reconcile(&actual);
        let mut d = Self {
            sched,
            store: Box::new(store),
            image,
            exec,
            clock,
            telemetry: None,
            failures: Vec::new(),
            liveness: None,
            links: BTreeMap::new(),
            link_error: None,
            scrubber: None,
            scrubbing: BTreeMap::new(),
            scrubs: Vec::new(),
            principals: Arc::new(principals),
            api,
            stats: Default::default(),
            http: Default::default(),
            config_path: None,
            notices: tokio::sync::watch::Sender::new(0),
            fabric_behind: false,
            reload_after_failed_commit: false,
            state_unknown: false,
            stop_after_keyed: None,
            keyed_commits: 0,
        };
        if !fix.is_empty() {
            eprintln!(
                "pcifab-manager: the fabric differs from the stored state; {} action(s) to fix it",
                fix.len()
            );
        }
        d.run_actions(fix);
        d.commit(None)?;
        Ok(d)
    }

    /// Applies actions; a failed one takes its device out of the pool (which may plan more).
    fn run_actions(&mut self, mut actions: Vec<Action>) {
        if self.fabric_behind {
            if self.exec.ready().is_err() {
                return;
            }
            // Whatever was held back and whatever is asked now: the difference between the
            // fabric and the scheduler's state.
            match self.exec.fabric(&self.sched.pool_functions()) {
                Ok(actual) => actions = self.sched.reconcile(&actual),
                Err(e) => {
                    eprintln!("pcifab-manager: cannot read the fabric: {e}");
                    return;
                }
            }
            eprintln!(
                "pcifab-manager: may change the fabric again; {} action(s) to bring it to \
                 the state",
                actions.len()
            );
            self.fabric_behind = false;
        }
        for _round in 0..4 {
            if actions.is_empty() {
                return;
            }
            for a in &actions {
                if let Err(e) = self.exec.ready() {
                    eprintln!(
                        "pcifab-manager: not changing the fabric ({e}); holding back: {}",
                        action_text(a)
                    );
                    self.fabric_behind = true;
                    return;
                }
                let r = self.exec.apply(a);
                if r.is_ok() && self.exec.name() == "driver" {
                    eprintln!("pcifab-manager: done: {}", action_text(a));
                }
                if let Err(e) = r {
                    let pdfid = match a {
                        Action::Bind { pdfid, .. }
                        | Action::Unbind { pdfid, .. }
                        | Action::Move { pdfid, .. } => *pdfid,
                    };
                    let msg = format!("{} executor: {e}", self.exec.name());
                    eprintln!("pcifab-manager: {msg}");
                    self.failures.push(msg.clone());
                    if self.failures.len() > 100 {
                        self.failures.remove(0);
                    }
                    let pf = self
                        .sched
                        .devices
                        .iter()
                        .find(|d| d.pf == pdfid || d.vfs.contains(&pdfid))
                        .filter(|d| d.unhealthy.is_none())
                        .map(|d| d.pf);
                    if let Some(pf) = pf {
                        let now = (self.clock)();
                        let _ = self.sched.set_health(pf, Some(msg), now);
                    }
                }
            }
            actions = self.sched.take_actions();
        }
    }

    /// Commits what changed in the state since the last commit, and the log entry.
    pub(crate) fn commit(&mut self, entry: Option<&LogEntry>) -> Result<(), String> {
        // Notices are served from memory, stored or not: wake whoever waits for one.
        let next = self.sched.next_notice;
        self.notices
            .send_if_modified(|n| std::mem::replace(n, next) != next);
        let delta = self.image.diff(&self.sched)?;
        if entry.is_none() && delta.is_empty() {
            return Ok(());
        }
        let m = &self.sched.config.manager;
        let keep = Retention {
            max_entries: m.log_max_entries,
            max_age_s: m.log_max_age_s,
        };
        if let Err(e) = self.store.commit(&delta.batch, entry, keep) {
            self.state_unknown = self.reload_after_failed_commit;
            return Err(e);
        }
        self.image.accept(delta);
        Ok(())
    }

    /// Reads the state again from the store after a commit of unknown outcome; the fabric
    /// is brought to it before the next action.
    fn reload(&mut self) -> Result<(), String> {
        let Some((mut s, image)) = persist::load(&*self.store)? else {
            return Err("the store holds no state".into());
        };
        crate::config::take_pool_principals(&mut s.config.pools, &self.sched.config.pools);
        s.config.manager = self.sched.config.manager.clone();
        s.config.failover = self.sched.config.failover.clone();
        s.config.telemetry = self.sched.config.telemetry.clone();
        self.sched = s;
        self.image = image;
        self.fabric_behind = true;
        self.state_unknown = false;
        eprintln!(
            "pcifab-manager: the state was read again from the store (a commit's outcome was \
             unknown)"
        );
        Ok(())
    }

    /// Changes whenever notices were added (its value is the next notice's number), so a
    /// long poll of `events` ends as soon as there is one.
    pub fn notices(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notices.subscribe()
    }

    /// Answers one request line.
    pub fn handle_line(&mut self, line: &str) -> Value {
        let req = match protocol::parse(line) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        self.handle(&req)
    }

    /// Serves `req` for principal `p`: checked (crate::auth), answered, and filtered to
    /// what `p` may see. Returns the request as served (with its owner) and the reply.
    pub fn serve(&mut self, p: &Principal, req: Request) -> Result<(Request, Value), Denied> {
        self.serve_keyed(p, req, None)
    }

    /// [`Daemon::serve`] with the client's idempotency key (checked with
    /// [`crate::store::check_key`]): a request that changes something is carried out once
    /// per key and principal; a repeat gets the recorded reply (see [`Daemon::handle_keyed`]).
    pub fn serve_keyed(
        &mut self,
        p: &Principal,
        req: Request,
        key: Option<&str>,
    ) -> Result<(Request, Value), Denied> {
        let t = std::time::Instant::now();
        let req = p.authorize(req, &self.sched)?;
        let key = key.map(|k| crate::store::scoped_key(k, &p.name));
        let reply = self.handle_keyed(&req, key.as_deref());
        let reply = p.filter(&req, reply);
        self.stats.record(&req, &reply, t.elapsed());
        Ok((req, reply))
    }

    /// [`Daemon::serve`] without counting the request in the metrics: for the reads a
    /// Redfish request is made of, counted once as `redfish`.
    pub fn serve_uncounted(
        &mut self,
        p: &Principal,
        req: Request,
    ) -> Result<(Request, Value), Denied> {
        let req = p.authorize(req, &self.sched)?;
        let reply = self.handle(&req);
        Ok((req.clone(), p.filter(&req, reply)))
    }

    /// Answers one request line of principal `p` (the control socket).
    pub fn serve_line(&mut self, p: &Principal, line: &str) -> Value {
        let (req, key) = match protocol::parse_keyed(line) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        match self.serve_keyed(p, req, key.as_deref()) {
            Ok((_, v)) => v,
            Err(d) => {
                eprintln!(
                    "pcifab-manager: socket ({}): refused: {} {}",
                    p.name,
                    d.status(),
                    d.reason()
                );
                json!({"ok": false, "error": d.reason(), "refused": true, "status": d.status()})
            }
        }
    }

    pub fn handle(&mut self, req: &Request) -> Value {
        self.handle_keyed(req, None)
    }

    /// Answers `req`; `key`, the scoped idempotency key ([`crate::store::scoped_key`]) of a
    /// request that changes something, is stored with its log entry and reply in the same
    /// commit. A key the log still holds is not carried out again: the same request gets
    /// the recorded reply with `"replayed": true`, another request under the same key is
    /// refused with status 422.
    pub fn handle_keyed(&mut self, req: &Request, key: Option<&str>) -> Value {
        let key = key.filter(|_| req.mutates());
        // A read while the state cannot be read again: answered from memory, which may not
        // be what the store holds, so nothing of it is committed or carried out.
        let mut unconfirmed = false;
        if self.state_unknown {
            if let Err(e) = self.reload() {
                if req.mutates() {
                    return protocol::error(
                        format!(
                            "{e}; the state cannot be confirmed since a commit failed, so \
                             nothing is decided: retry once the store (etcd) answers"
                        ),
                        false,
                    );
                }
                unconfirmed = true;
            }
        }
        if let Some(k) = key {
            if let Some(reply) = self.recorded_reply(req, k) {
                return reply;
            }
        }
        let before = req.mutates().then(|| self.sched.clone());
        let now = (self.clock)();
        // Time first, so the answer reflects expiry and failover up to now; the links first
        // of all, so a host is not timed out for the time this daemon spent on other work.
        self.observe_links(now);
        self.sched.tick(now);
        let reply = match req {
            Request::Telemetry => {
                let samples: Vec<Value> = self
                    .telemetry
                    .as_ref()
                    .map(|t| {
                        t.samples
                            .iter()
                            .map(|(f, s)| match s {
                                Ok(s) => json!(s),
                                Err(e) => json!({"pdfid": f, "error": e}),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                json!({"ok": true, "samples": samples, "failures": self.failures})
            }
            Request::Log { n } if *n == 0 || *n > protocol::MAX_PAGE => protocol::error(
                format!(
                    "n is 1 to {}: the log is read {} entries at most",
                    protocol::MAX_PAGE,
                    protocol::MAX_PAGE
                ),
                true,
            ),
            Request::Log { n } => match self.store.log_tail(*n) {
                Ok(l) => json!({"ok": true, "log": l}),
                Err(e) => protocol::error(e, false),
            },
            Request::Pool => {
                let mut v = protocol::handle(&mut self.sched, req, now);
                v["scrubs"] = json!(self.scrubs);
                v["scrubbing"] = json!(self
                    .scrubbing
                    .keys()
                    .map(|f| format!("{f:#06x}"))
                    .collect::<Vec<_>>());
                v
            }
            r => protocol::handle(&mut self.sched, r, now),
        };
        if unconfirmed {
            return reply;
        }
        // Commit the decision before acting on it: after a crash the start reconciles the
        // fabric with what was committed.
        let entry = req.mutates().then(|| LogEntry {
            at: now,
            request: serde_json::to_value(req).unwrap_or(Value::Null),
            ok: reply.get("ok").and_then(Value::as_bool).unwrap_or(false),
            summary: reply
                .get("error")
                .and_then(Value::as_str)
                .map(String::from)
                .unwrap_or_else(|| "ok".into()),
            key: key.map(String::from),
            reply: key.map(|_| reply.clone()),
        });
        if let Err(e) = self.commit(entry.as_ref()) {
            // A read is answered all the same (what time changed is committed later).
            if !req.mutates() {
                eprintln!("pcifab-manager: {e}");
            } else {
                if let Some(b) = before {
                    self.sched = b;
                }
                return protocol::error(
                    format!(
                        "{e}; the request was not recorded, or its outcome is unknown if the \
                         store did not answer in time: check the leases and the queue, then \
                         retry once the store (the disk, or etcd) is fixed"
                    ),
                    false,
                );
            }
        }
        if let Some(k) = key {
            self.keyed_commits += 1;
            if self.stop_after_keyed == Some(self.keyed_commits) {
                eprintln!(
                    "pcifab-manager: test hook: request with key {k} committed; stopping \
                     (SIGSTOP) before carrying it out and answering"
                );
                // SAFETY: raise(3) of a signal whose default action stops the process.
                unsafe { libc::raise(libc::SIGSTOP) };
            }
        }
        let actions = self.sched.take_actions();
        self.run_actions(actions);
        if let Err(e) = self.commit(None) {
            eprintln!("pcifab-manager: {e}");
        }
        self.start_scrubs(now);
        reply
    }

    /// The reply to a repeat of idempotency key `key`: the recorded one if `req` is the
    /// request recorded with it, a refusal (422) if it is another, an error if the store
    /// cannot tell; none if the key is new.
    fn recorded_reply(&self, req: &Request, key: &str) -> Option<Value> {
        let client_key = key.rsplit_once('@').map_or(key, |(k, _)| k);
        match self.store.recorded(key) {
            Ok(None) => None,
            Ok(Some(e)) if e.request == serde_json::to_value(req).unwrap_or(Value::Null) => {
                let mut r = e.reply.unwrap_or_else(|| {
                    protocol::error(
                        format!(
                            "the request with idempotency key {client_key} was carried out \
                             before (log: {}) but its reply was not kept",
                            e.summary
                        ),
                        false,
                    )
                });
                r["replayed"] = json!(true);
                Some(r)
            }
            Ok(Some(e)) => {
                let mut r = protocol::error(
                    format!(
                        "the idempotency key {client_key} was already used for another request \
                         ({}); a key names one request: send a new key for a new request",
                        e.request
                    ),
                    true,
                );
                r["status"] = json!(422);
                Some(r)
            }
            Err(e) => Some(protocol::error(
                format!(
                    "{e}; whether the request with idempotency key {client_key} was carried \
                     out before cannot be read, so nothing is decided: retry with the same \
                     key once the store (etcd) answers"
                ),
                false,
            )),
        }
    }

    /// Time passes: expiry, failover, time slices, telemetry.
    pub fn tick(&mut self) {
        if self.state_unknown && self.reload().is_err() {
            return;
        }
        if self.fabric_behind {
            self.run_actions(Vec::new());
        }
        let now = (self.clock)();
        self.observe_links(now);
        self.poll_telemetry(now);
        self.sched.tick(now);
        let actions = self.sched.take_actions();
        if let Err(e) = self.commit(None) {
            eprintln!("pcifab-manager: {e}");
        }
        self.run_actions(actions);
        self.collect_scrubs(now, false);
        if let Err(e) = self.commit(None) {
            eprintln!("pcifab-manager: {e}");
        }
        self.start_scrubs(now);
    }

    /// Starts a scrub thread for every device waiting for one (healthy, none running).
    /// A scrub changes the fabric (it binds the device to this manager's host and erases
    /// it): none starts while the state is unknown or the executor is not ready (a
    /// highly available manager that cannot confirm it still leads must not erase a drive
    /// a new leader may have granted).
    fn start_scrubs(&mut self, now: Secs) {
        // The fence is asked only when a scrub is due (it reads etcd). Not logged: the
        // actions held back are, at every tick.
        if self.sched.scrubs_due().is_empty() || self.state_unknown || self.exec.ready().is_err() {
            return;
        }
        for pf in self.sched.scrubs_due() {
            if self.scrubbing.contains_key(&pf) {
                continue;
            }
            let Some(s) = self.scrubber.clone() else {
                self.scrub_finished(
                    pf,
                    Err("this manager has no scrubber (start it with --executor driver)".into()),
                    now,
                );
                continue;
            };
            eprintln!("pcifab-manager: scrubbing {pf:#06x} before it is granted again");
            // The scrub binds the drive in its thread, later: it asks the fence again right
            // before (a leader deposed meanwhile must not bind it).
            let fence = self.exec.fence();
            let spawned = std::thread::Builder::new()
                .name(format!("scrub-{pf:#06x}"))
                .spawn(move || {
                    let ready = || fence.as_ref().map_or(Ok(()), |f| f.check());
                    s.scrub(pf, &ready)
                });
            match spawned {
                Ok(h) => {
                    self.scrubbing.insert(pf, h);
                }
                Err(e) => self.scrub_finished(pf, Err(format!("cannot start a thread: {e}")), now),
            }
        }
    }

    /// Takes the outcome of every finished scrub (`wait`: of every running one, waiting)
    /// to the scheduler: the device goes back to the pool (and the queue gets it) or leaves
    /// it.
    fn collect_scrubs(&mut self, now: Secs, wait: bool) {
        let done: Vec<Pdfid> = self
            .scrubbing
            .iter()
            .filter(|(_, h)| wait || h.is_finished())
            .map(|(f, _)| *f)
            .collect();
        for pf in done {
            let Some(h) = self.scrubbing.remove(&pf) else {
                continue;
            };
            let r = h
                .join()
                .unwrap_or_else(|_| Err(ScrubError::Failed("the scrub thread panicked".into())));
            match r {
                // Nothing was done: the device still waits, and a scrub starts again once
                // the fence passes.
                Err(ScrubError::NotStarted(e)) => {
                    eprintln!("pcifab-manager: the scrub of {pf:#06x} did not start: {e}");
                }
                r => self.scrub_finished(pf, r.map_err(|e| e.to_string()), now),
            }
        }
    }

    /// Records a scrub's outcome, tells the scheduler and applies what it decides.
    fn scrub_finished(&mut self, pf: Pdfid, r: Result<Report, String>, now: Secs) {
        let entry = match &r {
            Ok(rep) => {
                eprintln!(
                    "pcifab-manager: scrubbed {pf:#06x} in {:.2} s: {} bytes zeroed on {}",
                    rep.secs,
                    rep.bytes,
                    rep.disks.join(" ")
                );
                json!({"pf": format!("{pf:#06x}"), "at": now, "ok": true, "secs": rep.secs,
                       "bytes": rep.bytes, "disks": rep.disks})
            }
            Err(e) => {
                let msg = format!("scrub of {pf:#06x} failed: {e}; it leaves the pool");
                eprintln!("pcifab-manager: {msg}");
                self.failures.push(msg);
                if self.failures.len() > 100 {
                    self.failures.remove(0);
                }
                json!({"pf": format!("{pf:#06x}"), "at": now, "ok": false, "error": e})
            }
        };
        self.scrubs.push(entry);
        if self.scrubs.len() > SCRUBS_KEPT {
            self.scrubs.remove(0);
        }
        if let Err(e) = self.sched.scrub_done(pf, r.map(|_| ()), now) {
            eprintln!("pcifab-manager: {e}");
        }
        let actions = self.sched.take_actions();
        self.run_actions(actions);
    }

    /// Waits for every running scrub and takes its outcome (tests; the daemon's ticks take
    /// them as they finish).
    pub fn wait_scrubs(&mut self) {
        let now = (self.clock)();
        self.collect_scrubs(now, true);
        if let Err(e) = self.commit(None) {
            eprintln!("pcifab-manager: {e}");
        }
    }

    /// Reads the hosts' upstream links and gives the scheduler a heartbeat for every host
    /// whose link is up. Changes and read errors are logged once.
    pub fn observe_links(&mut self, now: Secs) {
        let Some(l) = self.liveness.as_mut() else {
            return;
        };
        match l.links(&self.sched.config.failover.host_ports) {
            Ok(links) => {
                self.link_error = None;
                for (host, up) in links {
                    if host >= self.sched.config.manager.hosts {
                        continue;
                    }
                    if self.links.insert(host, up) != Some(up) {
                        eprintln!(
                            "pcifab-manager: host {host}: upstream link {}",
                            if up { "up" } else { "down" }
                        );
                    }
                    self.sched.link_seen(host, up, now);
                }
            }
            Err(e) => {
                if self.link_error.as_ref() != Some(&e) {
                    eprintln!("pcifab-manager: cannot read the hosts' links: {e}");
                    self.link_error = Some(e);
                }
            }
        }
    }

    /// Reads every function's telemetry when the interval has passed and acts on the
    /// thresholds for pool devices.
    pub fn poll_telemetry(&mut self, now: Secs) {
        let cfg = self.sched.config.telemetry.clone();
        let Some(t) = self.telemetry.as_mut() else {
            return;
        };
        if cfg.interval_s == 0 || t.last_poll.is_some_and(|l| now < l + cfg.interval_s) {
            return;
        }
        t.last_poll = Some(now);
        for &f in &t.functions {
            let s = t.source.read(f);
            t.samples.insert(f, s);
        }
        let mut changes = Vec::new();
        for d in &self.sched.devices {
            let samples: Vec<Result<Sample, String>> = std::iter::once(d.pf)
                .chain(d.vfs.iter().copied())
                .map(|f| {
                    t.samples
                        .get(&f)
                        .cloned()
                        .unwrap_or_else(|| Err(format!("{f:#06x} was not polled")))
                })
                .collect();
            if let Some(v) = t.judge.feed(&cfg, d.pf, &samples, d.unhealthy.is_some()) {
                // A device whose scrub failed stays out until an operator puts it back.
                if v == Verdict::Healthy && d.scrub == Some(Scrub::Failed) {
                    continue;
                }
                changes.push((d.pf, v));
            }
        }
        for (pf, v) in changes {
            let r = match v {
                Verdict::Unhealthy(r) => Some(format!("telemetry: {r}")),
                Verdict::Healthy => None,
            };
            let _ = self.sched.set_health(pf, r, now);
        }
    }
}

/// One action as a log line.
fn action_text(a: &Action) -> String {
    match a {
        Action::Bind { pdfid, host } => format!("bind {pdfid:#06x} to host {host}"),
        Action::Unbind { pdfid, host } => format!("unbind {pdfid:#06x} from host {host}"),
        Action::Move { pdfid, from, to } => format!("move {pdfid:#06x} from host {from} to {to}"),
    }
}
