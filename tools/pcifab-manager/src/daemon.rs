// SPDX-License-Identifier: GPL-2.0-only

//! The daemon: the scheduler, its store, an executor, telemetry, and the control socket.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    os::unix::net::{UnixListener, UnixStream},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Value};

use crate::{
    auth::{Denied, Principal, Principals},
    config::Config,
    executor::Executor,
    liveness::Liveness,
    protocol::{self, Request},
    scheduler::{Action, Host, Pdfid, Scheduler, Scrub, Secs},
    scrub::{Report, Scrubber},
    store::{LogEntry, Store},
    telemetry::{Judge, Sample, Source, Verdict},
};

/// The clock: seconds since the Unix epoch in the daemon, anything in tests.
pub type Clock = Box<dyn Fn() -> Secs + Send>;

/// The Unix time in seconds.
pub fn unix_now() -> Secs {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The daemon's clock: the Unix time at start, advanced by the monotonic clock, so a step
/// of the wall clock while the daemon runs (NTP, an operator) moves no lease's expiry, slice
/// or time-out. Stored times stay Unix times, so a restart picks up the wall clock again.
pub fn steady_clock() -> Clock {
    let base = unix_now();
    let start = std::time::Instant::now();
    Box::new(move || base.saturating_add(start.elapsed().as_secs()))
}

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
    pub store: Store,
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
    saved: Vec<u8>,
    /// Erases devices of scrub pools between holders (none: such a device fails its scrub).
    pub scrubber: Option<Arc<dyn Scrubber>>,
    /// Scrubs running, one thread each.
    scrubbing: BTreeMap<Pdfid, std::thread::JoinHandle<Result<Report, String>>>,
    /// The last scrubs' outcomes, most recent last (the `pool` reply's `scrubs`).
    pub scrubs: Vec<Value>,
    /// Who may do what (the configuration's `[[principals]]`).
    pub principals: Arc<Principals>,
    /// The network API's settings (`[api]`); none: the local socket only.
    pub api: Option<crate::config::ApiConfig>,
    /// Requests served, by operation and outcome, and how long they took (`/metrics`).
    pub stats: crate::metrics::Stats,
    /// The network API's replies and connections (`/metrics`), counted by the API.
    pub http: Arc<crate::metrics::HttpStats>,
    /// The configuration file, read again for its principals on SIGHUP.
    pub config_path: Option<std::path::PathBuf>,
    /// The scheduler's next notice number as of the last commit: the API's long polls of
    /// `events` wait for it to change ([`Daemon::notices`]).
    notices: tokio::sync::watch::Sender<u64>,
}

/// Scrub outcomes kept for the `pool` reply.
const SCRUBS_KEPT: usize = 64;

impl Daemon {
    /// Loads the stored state (or starts one from `config`), takes the configuration's
    /// manager, failover and telemetry settings, and brings the fabric to the stored state.
    pub fn start(
        config: Config,
        store: Store,
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
        let sched = match store.load()? {
            Some(mut s) => {
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
                s
            }
            None => Scheduler::new(config),
        };
        let actual = exec.fabric(&sched.pool_functions())?;
        let fix = sched.reconcile(&actual);
        let mut d = Self {
            sched,
            store,
            exec,
            clock,
            telemetry: None,
            failures: Vec::new(),
            liveness: None,
            links: BTreeMap::new(),
            link_error: None,
            saved: Vec::new(),
            scrubber: None,
            scrubbing: BTreeMap::new(),
            scrubs: Vec::new(),
            principals: Arc::new(principals),
            api,
            stats: Default::default(),
            http: Default::default(),
            config_path: None,
            notices: tokio::sync::watch::Sender::new(0),
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
        for _round in 0..4 {
            if actions.is_empty() {
                return;
            }
            for a in &actions {
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

    /// Commits the state (if it changed) and the log entry.
    fn commit(&mut self, entry: Option<&LogEntry>) -> Result<(), String> {
        // Notices are served from memory, stored or not: wake whoever waits for one.
        let next = self.sched.next_notice;
        self.notices
            .send_if_modified(|n| std::mem::replace(n, next) != next);
        let bytes = serde_json::to_vec(&self.sched).map_err(|e| e.to_string())?;
        if entry.is_none() && bytes == self.saved {
            return Ok(());
        }
        self.store.save(&self.sched, entry)?;
        self.saved = bytes;
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
        let t = std::time::Instant::now();
        let (req, reply) = self.serve_uncounted(p, req)?;
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
        let req = match protocol::parse(line) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        match self.serve(p, req) {
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
        });
        if let Err(e) = self.commit(entry.as_ref()) {
            return protocol::error(
                format!("{e}; the request was not recorded, retry once the disk is fixed"),
                false,
            );
        }
        let actions = self.sched.take_actions();
        self.run_actions(actions);
        if let Err(e) = self.commit(None) {
            eprintln!("pcifab-manager: {e}");
        }
        self.start_scrubs(now);
        reply
    }

    /// Time passes: expiry, failover, time slices, telemetry.
    pub fn tick(&mut self) {
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
    fn start_scrubs(&mut self, now: Secs) {
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
            let spawned = std::thread::Builder::new()
                .name(format!("scrub-{pf:#06x}"))
                .spawn(move || s.scrub(pf));
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
                .unwrap_or_else(|_| Err("the scrub thread panicked".into()));
            self.scrub_finished(pf, r, now);
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

/// Serves the control socket until the process is killed; ticks once a second.
pub fn serve(daemon: Daemon, socket: &Path) -> Result<(), String> {
    if socket.exists() {
        if UnixStream::connect(socket).is_ok() {
            return Err(format!(
                "another manager answers on {}; stop it or use another --socket",
                socket.display()
            ));
        }
        std::fs::remove_file(socket)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", socket.display()))?;
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let listener = match UnixListener::bind(socket) {
        Ok(l) => Some(l),
        Err(e) if crate::spool::no_unix_sockets(&e) => None,
        Err(e) => return Err(format!("cannot listen on {}: {e}", socket.display())),
    };
    // SIGTERM, SIGINT and SIGHUP are taken by one thread (sigwait), so every thread spawned
    // from here on has them blocked.
    let signals = block_stop_signals()?;
    let api = daemon.api.clone();
    let principals = daemon.principals.clone();
    let d = Arc::new(Mutex::new(daemon));
    {
        let d = d.clone();
        let socket = socket.to_path_buf();
        std::thread::spawn(move || stop_on_signal(signals, &d, &socket));
    }
    if let Some(cfg) = &api {
        crate::api::spawn(d.clone(), cfg, principals)?;
    }
    {
        let d = d.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            match d.lock() {
                Ok(mut d) => {
                    d.tick();
                    crate::notify::watchdog();
                }
                Err(_) => return,
            }
        });
    }
    crate::notify::ready();
    let Some(listener) = listener else {
        return crate::spool::serve(d, &crate::spool::dir_for(socket));
    };
    eprintln!("pcifab-manager: listening on {}", socket.display());
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let d = d.clone();
        std::thread::spawn(move || serve_conn(d, conn));
    }
    Ok(())
}

/// Serves one connection of the control socket until it closes: request lines in, reply
/// lines out, as the peer's principal. Public for the tests, which drive it over a socket
/// pair.
pub fn serve_conn(d: Arc<Mutex<Daemon>>, conn: UnixStream) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    // The peer's user id, from the kernel (SO_PEERCRED), names its principal.
    let principal = match peer_uid(&conn) {
        Ok(uid) => match d.lock() {
            Ok(d) => d.principals.by_uid(uid),
            Err(_) => return,
        },
        Err(e) => Err(Denied::Forbidden(format!(
            "cannot tell who is on the socket's other end: {e}"
        ))),
    };
    let reader = BufReader::new(conn);
    // Made on the first `events` line with a `wait`: it waits for the daemon's notices.
    let mut rt = None;
    for line in reader.lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match protocol::take_wait(&line) {
            Ok((line, 0)) => serve_once(&d, &principal, &line),
            Ok((line, wait)) => serve_waiting(&d, &principal, &line, wait, &mut rt),
            Err(reply) => reply,
        };
        if writeln!(out, "{reply}").is_err() {
            return;
        }
    }
}

fn serve_once(d: &Mutex<Daemon>, principal: &Result<Principal, Denied>, line: &str) -> Value {
    match (principal, d.lock()) {
        (Ok(p), Ok(mut d)) => d.serve_line(p, line),
        (Err(denied), _) => {
            eprintln!("pcifab-manager: socket: refused: {}", denied.reason());
            json!({"ok": false, "error": denied.reason(), "refused": true,
                   "status": denied.status()})
        }
        (_, Err(_)) => protocol::error("the manager failed internally; restart it", false),
    }
}

/// An `events` line with a `wait`: answered once it has notices, or empty after `wait_s`
/// seconds. The wait holds no lock; any notice the daemon adds wakes it to look again.
fn serve_waiting(
    d: &Mutex<Daemon>,
    principal: &Result<Principal, Denied>,
    line: &str,
    wait_s: u64,
    rt: &mut Option<tokio::runtime::Runtime>,
) -> Value {
    let Ok(mut notices) = d.lock().map(|d| d.notices()) else {
        return protocol::error("the manager failed internally; restart it", false);
    };
    let deadline = Instant::now() + Duration::from_secs(wait_s);
    loop {
        // Seen before the daemon is asked: a notice added after this ends the wait below.
        notices.borrow_and_update();
        let reply = serve_once(d, principal, line);
        let now = Instant::now();
        if !protocol::no_events(&reply) || now >= deadline {
            return reply;
        }
        let rt = match rt {
            Some(rt) => rt,
            None => match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(r) => rt.insert(r),
                Err(e) => {
                    eprintln!("pcifab-manager: socket: cannot wait for notices: {e}");
                    return reply;
                }
            },
        };
        // The timer is made inside the runtime, whose time driver it needs.
        let left = deadline - now;
        let woke = rt.block_on(async { tokio::time::timeout(left, notices.changed()).await });
        if let Ok(Err(_)) = woke {
            // The daemon is gone: nothing more will come.
            return reply;
        }
    }
}

/// The user id of the process on the other end of a UNIX socket (SO_PEERCRED).
fn peer_uid(s: &UnixStream) -> Result<u32, String> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is open for the life of `s`; `cred` and `len` are valid for writes of
    // the size passed, which is what SO_PEERCRED writes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(cred.uid)
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread (and the threads it starts); returns
/// the set.
fn block_stop_signals() -> Result<libc::sigset_t, String> {
    // SAFETY: `set` is a valid sigset_t for sigemptyset/sigaddset to fill in; the mask
    // change affects only the calling thread and the threads created after it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(format!(
                "cannot block SIGTERM: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        Ok(set)
    }
}

/// Reads the configuration file again and takes its principals (names, roles, tokens,
/// expiries, uids) in place of the running ones, for the API and the socket alike; the
/// rest of the file is not reloaded. On an error the running principals stay.
pub fn reload_principals(d: &Mutex<Daemon>) -> Result<Vec<String>, String> {
    let (path, principals, hosts, tenants) = {
        let d = d
            .lock()
            .map_err(|_| "the daemon's lock is poisoned".to_string())?;
        let m = &d.sched.config.manager;
        (
            d.config_path.clone(),
            d.principals.clone(),
            m.hosts,
            m.tenants.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        )
    };
    let path = path.ok_or("this manager was started without a configuration file")?;
    let c = Config::load(&path.display().to_string())?;
    let new = Principals::new(c.principals, hosts, tenants)?;
    let names = new.names();
    principals.replace(new);
    Ok(names)
}

/// Waits for SIGTERM or SIGINT, then stops cleanly: takes the daemon's lock (so the request
/// being served finishes and nothing is half-applied), commits the state, tells systemd,
/// removes the socket and exits 0. SIGHUP reloads the principals and waits on.
fn stop_on_signal(set: libc::sigset_t, d: &Arc<Mutex<Daemon>>, socket: &Path) {
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: `set` holds signals this thread has blocked; `sig` is valid for writing.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        if rc != 0 {
            eprintln!("pcifab-manager: sigwait failed ({rc}); SIGTERM will not stop it cleanly");
            return;
        }
        if sig != libc::SIGHUP {
            break;
        }
        crate::notify::reloading();
        match reload_principals(d) {
            Ok(names) => eprintln!(
                "pcifab-manager: SIGHUP: principals reloaded: {}",
                names.join(", ")
            ),
            Err(e) => eprintln!(
                "pcifab-manager: SIGHUP: principals not reloaded, the running ones stay: {e}"
            ),
        }
        crate::notify::ready();
    }
    crate::notify::stopping();
    let name = if sig == libc::SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    eprintln!("pcifab-manager: {name}: finishing the request in hand and stopping");
    let code = match d.lock() {
        Ok(mut d) => match d.commit(None) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("pcifab-manager: the last commit failed: {e}");
                1
            }
        },
        Err(_) => 1,
    };
    let _ = std::fs::remove_file(socket);
    eprintln!("pcifab-manager: stopped");
    std::process::exit(code);
}
