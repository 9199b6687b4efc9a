// SPDX-License-Identifier: GPL-2.0-only
//! The whole emulated switch: one MEP per host, the endpoint functions and
//! the fabric model they share, each MEP's firmware worker (MRPC commands)
//! and DMA engine thread, and the binds and unbinds that hot-plug functions
//! into the hosts' QEMUs over QMP.

use crate::config::Config;
use crate::dmaep::DmaEp;
use crate::ep;
use crate::function::{FnDevice, Memory};
use crate::hostile::{self, Stream};
use crate::mep::{Job, Mep};
use crate::model::{self, Model, Notice, Request, Requester};
use crate::mrpc::{mrpc_name, Exec, MrpcOutcome};
use crate::nvme;
use crate::p2p;
use crate::pci::FunctionIds;
use crate::qmp::{Qmp, QmpError};
use crate::regs::GasFeatures;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Create (or check) the image of every nvme endpoint; its absolute path
/// per endpoint, None for gpu endpoints. Two endpoints may not share one.
fn prepare_images(
    config: &Config,
    run_dir: &std::path::Path,
) -> Result<Vec<Option<PathBuf>>, String> {
    let mut images: Vec<Option<PathBuf>> = Vec::new();
    let mut real: Vec<(PathBuf, usize)> = Vec::new();
    for (i, ep) in config.endpoints.iter().enumerate() {
        if !ep.is_nvme() {
            images.push(None);
            continue;
        }
        let who = format!("endpoints[{i}] ('{}')", ep.name);
        let path = nvme::absolute(&ep.image_path(run_dir))?;
        if nvme::prepare_image(&path, ep.capacity_bytes(), &who)? {
            info!(
                "{}: image {} created ({} bytes, sparse)",
                ep.name,
                path.display(),
                ep.capacity_bytes()
            );
        }
        let canon = std::fs::canonicalize(&path)
            .map_err(|e| format!("{who}: cannot resolve image {}: {e}", path.display()))?;
        if let Some((_, j)) = real.iter().find(|(p, _)| *p == canon) {
            return Err(format!(
                "{who}: image {} is also the image of endpoints[{j}]; give every nvme endpoint its own image",
                path.display()
            ));
        }
        real.push((canon, i));
        images.push(Some(path));
    }
    Ok(images)
}

/// How long `blockdev-del` of an nvme node is retried while QEMU says the node is in use.
const BLOCKDEV_DEL_WAIT: Duration = Duration::from_secs(5);

/// The whole emulated switch: one MEP per host and the shared fabric model.
pub struct Fabric {
    pub config: Config,
    pub meps: Vec<Arc<Mep>>,
    /// Each host's DMA endpoint, in host order; empty when `dma_endpoint_channels` is 0.
    pub dmaeps: Vec<Arc<DmaEp>>,
    model: Arc<Mutex<Model>>,
    /// Every endpoint function, in pdfid order.
    pub functions: Vec<Arc<FnDevice>>,
    /// QMP client of each host (None: no --qmp for it).
    pub qmp: Vec<Option<Arc<Qmp>>>,
    /// Where the function sockets are (fn-XXXX.sock).
    pub run_dir: PathBuf,
    /// What the MEPs' P2P windows and DMA engines reach.
    pub p2p: Arc<p2p::Shared>,
    /// The absolute image path of each endpoint (in config order); None for gpu.
    pub images: Vec<Option<PathBuf>>,
}

impl Fabric {
    #[cfg(test)]
    pub fn new(config: Config) -> Fabric {
        Self::with(config, PathBuf::from("."), &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The fabric, with QMP sockets `(host, path)` and the run directory.
    pub fn with(
        config: Config,
        run_dir: PathBuf,
        qmp: &[(String, PathBuf)],
    ) -> Result<Fabric, String> {
        let n = config.hosts.len() as u32;
        let images = prepare_images(&config, &run_dir)?;
        let model = Arc::new(Mutex::new(Model::new(&config)));
        let mut functions = Vec::new();
        for ep in &config.endpoints {
            let pf = u64::from(ep.pf_mem_mib()) << 20;
            let pf_dev = u64::from(ep.pf_dev_mem_mib()) << 20;
            let vf = u64::from(ep.vf_mem()) << 20;
            let total = pf_dev + vf * u64::from(ep.vfs);
            let mem = Arc::new(Memory::new(&format!("pcifab-{}", ep.name), total as usize)?);
            for f in 0..=ep.vfs {
                let ids = FunctionIds {
                    vid: ep.vid(),
                    did: if f == 0 { ep.did() } else { ep.vf_did() },
                    class: ep.class_code(),
                    total_vfs: if f == 0 { ep.vfs } else { 0 },
                    vf_did: ep.vf_did(),
                    mem_size: if f == 0 { pf } else { vf },
                };
                let (off, dev) = if f == 0 {
                    (0, pf_dev)
                } else {
                    (pf_dev + vf * u64::from(f - 1), vf)
                };
                functions.push(Arc::new(FnDevice::new(
                    model::pdfid(ep.port, f),
                    ids,
                    Arc::clone(&mem),
                    off,
                    dev,
                    Arc::clone(&model),
                )));
            }
        }
        functions.sort_by_key(|f| f.pdfid);
        let shared = Arc::new(p2p::Shared::new(
            Arc::clone(&model),
            functions.clone(),
            u64::from(config.p2p_window_mib) << 20,
        ));
        let meps = config
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                Arc::new(Mep::new(
                    &h.name,
                    &config.firmware,
                    i as u32,
                    n,
                    Arc::clone(&shared),
                    GasFeatures {
                        ext: config.dialect.extended(),
                        dma_mrpc: config.dma_mrpc,
                    },
                ))
            })
            .collect();
        for m in &meps {
            let m: &Arc<Mep> = m;
            m.set_faults(|f| f.completion_us = config.mrpc_completion_us);
        }
        let dmaeps = if config.dma_endpoint_channels == 0 {
            Vec::new()
        } else {
            // One fabric-mode firmware for all endpoints: copies cross between hosts.
            let hub = crate::dmafab::Hub::new(
                (0..config.hosts.len())
                    .map(|i| config.host_port(i))
                    .collect(),
                config.dma_endpoint_channels,
            );
            config
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    Arc::new(DmaEp::in_fabric(
                        &format!("dmaep-{}", h.name),
                        i as u32,
                        &config.firmware,
                        config.dma_endpoint_channels,
                        Arc::clone(&hub),
                    ))
                })
                .collect()
        };
        let mut qmps = vec![None; config.hosts.len()];
        for (host, path) in qmp {
            let i = config
                .hosts
                .iter()
                .position(|h| h.name == *host)
                .ok_or_else(|| {
                    format!("--qmp names host '{host}', which is not in the configuration")
                })?;
            qmps[i] = Some(Qmp::new(host, path.clone()));
        }
        Ok(Fabric {
            config,
            meps,
            dmaeps,
            model,
            functions,
            qmp: qmps,
            run_dir,
            p2p: shared,
            images,
        })
    }

    /// The image and serial number of function `pdfid` when it is an nvme function.
    /// Takes no lock: the configuration says which endpoint owns `pdfid`.
    pub fn nvme(&self, pdfid: u16) -> Option<(PathBuf, String, Option<u32>)> {
        let e = self
            .config
            .endpoints
            .iter()
            .position(|ep| (0..=ep.vfs).any(|f| model::pdfid(ep.port, f) == pdfid))?;
        let image = self.images.get(e)?.clone()?;
        let ep = &self.config.endpoints[e];
        Some((image, ep.nvme_serial(), ep.cmb_mib))
    }

    pub fn function_dev(&self, pdfid: u16) -> Option<&Arc<FnDevice>> {
        self.functions.iter().find(|f| f.pdfid == pdfid)
    }

    /// How long an unbind waits for QEMU's DEVICE_DELETED (config `unbind_timeout_ms`).
    fn unbind_timeout(&self) -> Duration {
        Duration::from_millis(self.config.unbind_timeout_ms)
    }

    pub fn fn_socket(&self, pdfid: u16) -> PathBuf {
        self.run_dir.join(format!("fn-{pdfid:04x}.sock"))
    }

    fn requester_name(&self, r: Requester) -> String {
        match r {
            Requester::Host(h) => self.meps.get(h).map_or("?".into(), |m| m.name.clone()),
            Requester::Control => "control".into(),
        }
    }

    /// Carry out a checked bind or unbind of one logical port's functions
    /// (QMP, scrub, model, events): all of them or none. Returns 0 or the
    /// return code. Blocks: never call it on a vfio-user socket thread.
    pub fn execute(&self, reqs: Vec<Request>) -> u32 {
        let Some(&first) = reqs.first() else {
            return 0;
        };
        let start = Instant::now();
        let host = self.meps[first.host].name.clone();
        let qmp = self.qmp.get(first.host).cloned().flatten();
        let mut phantom = false;
        let mut why = String::new();
        let ret = if first.bind {
            if self.meps[first.host].take_no_enumerate() {
                phantom = true;
                why = "fault no-enumerate: no device_add".into();
                0
            } else if let Some(q) = qmp {
                self.hot_add(&q, &reqs, &mut why)
            } else {
                why = format!("no --qmp socket for host {host}");
                model::PCIFAB_ERR_HOTPLUG_FAILED
            }
        } else {
            let (queued, pending, all_phantom) = {
                let mut m = self.model();
                let mut queued = false;
                for r in &reqs {
                    queued |= m.unbind_request(r);
                }
                let ph = reqs
                    .iter()
                    .all(|r| m.function(r.pdfid).is_some_and(|f| f.phantom));
                (queued, m.pending(), ph)
            };
            if queued {
                self.meps[first.host].signal(
                    &[Notice {
                        gfms: true,
                        ..Notice::default()
                    }],
                    pending.get(first.host).copied().unwrap_or(0),
                );
            }
            if all_phantom {
                why = "no device in QEMU (no-enumerate or not added)".into();
                0
            } else if let Some(q) = qmp {
                self.hot_remove(&q, &reqs, &mut why)
            } else {
                why = format!("no --qmp socket for host {host}");
                model::PCIFAB_ERR_HOTPLUG_FAILED
            }
        };
        let mut lost = Vec::new();
        if !first.bind && ret == 0 {
            // No route may reach a function once it is scrubbed: drop its
            // routes and wait for copies already past their route check.
            {
                let mut m = self.model();
                for r in &reqs {
                    lost.extend(m.drop_routes_to(r.pdfid));
                }
            }
            self.p2p.quiesce();
            for r in &reqs {
                if let Some(f) = self.function_dev(r.pdfid) {
                    if let Err(e) = f.scrub() {
                        error!("fn-{:04x}: scrub failed: {e}", r.pdfid);
                    }
                }
            }
        }
        let (notices, violations) = {
            let mut m = self.model();
            let mut notices = Vec::new();
            for r in &reqs {
                if let Some(n) = m.finish(r, ret == 0, phantom) {
                    notices.push(n);
                }
                if !r.bind && ret == 0 {
                    if let Some(f) = m.functions.iter_mut().find(|f| f.pdfid == r.pdfid) {
                        f.scrubs += 1;
                    }
                }
            }
            // `fault <host> late-unbind-request`: one more request for what just left, after
            // its UNBIND (the finish's notice signals the queue).
            if !first.bind && ret == 0 && self.meps[first.host].take_late_unbind_request() {
                for r in &reqs {
                    m.unbind_request(r);
                }
            }
            (notices, m.invariants())
        };
        let ids: Vec<String> = reqs.iter().map(|r| format!("{:#06x}", r.pdfid)).collect();
        info_or_note!(
            ret != 0,
            "{} {} {} {host} logical port {} requested by {}: {} ({:#x}) in {} ms{}",
            if first.bind { "bind" } else { "unbind" },
            ids.join(","),
            if first.bind { "to" } else { "from" },
            first.log_port,
            self.requester_name(first.requester),
            model::ret_name(ret),
            ret,
            start.elapsed().as_millis(),
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({why})")
            }
        );
        for v in &violations {
            error!("INVARIANT VIOLATED: {v}");
        }
        if !notices.is_empty() {
            let mut n = Notice::default();
            for x in notices {
                n.gfms |= x.gfms;
                n.pffs.extend(x.pffs);
                n.routes_lost.extend(x.routes_lost);
            }
            n.routes_lost.extend(lost);
            n.routes_lost.sort_unstable();
            n.routes_lost.dedup();
            self.notify(&[n]);
        }
        ret
    }

    /// device_add the functions of one logical port as one device: the
    /// non-zero functions first, function 0 (multifunction=on when there are
    /// others) last, as QEMU hot-adds a multi-function device. On a failure
    /// the ones already added are removed again.
    fn hot_add(&self, q: &Arc<Qmp>, reqs: &[Request], why: &mut String) -> u32 {
        let multi = reqs.len() > 1;
        let mut order: Vec<&Request> = reqs.iter().filter(|r| r.devfn != 0).collect();
        order.extend(reqs.iter().filter(|r| r.devfn == 0));
        let mut added: Vec<u16> = Vec::new();
        for r in order {
            let bus = format!("dsp{}", r.log_port);
            let addr = format!("0.{}", r.devfn);
            if let Err(e) = self.add_function(q, r.pdfid, &bus, Some(&addr), multi && r.devfn == 0)
            {
                *why = e;
                for &a in added.iter().rev() {
                    let id = format!("fn-{a:04x}");
                    match q.device_del_wait(&id, self.unbind_timeout()) {
                        Ok(()) => {
                            if self.nvme(a).is_some() {
                                self.blockdev_del(q, a);
                            }
                        }
                        Err(e) => {
                            error!("{id}: not removed after a failed multi-function bind: {e}")
                        }
                    }
                }
                return model::PCIFAB_ERR_HOTPLUG_FAILED;
            }
            added.push(r.pdfid);
        }
        0
    }

    /// Add function `pdfid` to `q`'s QEMU on `bus` (at `addr` when given):
    /// a vfio-user-pci device on its function socket, or for an nvme
    /// function `blockdev-add` of its image and QEMU's `nvme` device on it
    /// (the node is deleted again when the device_add fails).
    fn add_function(
        &self,
        q: &Arc<Qmp>,
        pdfid: u16,
        bus: &str,
        addr: Option<&str>,
        multifunction: bool,
    ) -> Result<(), String> {
        let id = format!("fn-{pdfid:04x}");
        let nvme = self.nvme(pdfid);
        let mut args = match &nvme {
            Some((image, serial, cmb_mib)) => {
                q.execute("blockdev-add", nvme::blockdev_add_args(pdfid, image))
                    .map_err(|e| format!("blockdev-add {}: {e}", nvme::node_name(pdfid)))?;
                nvme::device_add_args(pdfid, bus, addr, serial, *cmb_mib)
            }
            None => {
                let mut a = serde_json::json!({
                    "driver": "vfio-user-pci",
                    "id": id,
                    "bus": bus,
                    "socket": {"type": "unix", "path": self.fn_socket(pdfid).to_string_lossy()},
                });
                if let Some(addr) = addr {
                    a["addr"] = serde_json::Value::String(addr.to_owned());
                }
                a
            }
        };
        if multifunction {
            args["multifunction"] = serde_json::Value::Bool(true);
        }
        q.forget_deleted(&id);
        if let Err(e) = q.execute("device_add", args) {
            if nvme.is_some() {
                self.blockdev_del(q, pdfid);
            }
            return Err(format!("device_add {id}: {e}"));
        }
        Ok(())
    }

    /// `blockdev-del` of nvme function `pdfid`'s image node in `q`'s QEMU,
    /// which closes the image there. A failure is an error (the image stays
    /// open and the node name taken) but changes nothing else.
    fn blockdev_del(&self, q: &Arc<Qmp>, pdfid: u16) {
        let node = nvme::node_name(pdfid);
        // QEMU may report DEVICE_DELETED before the device let go of its node (a slot the
        // guest powered off detaches the device at once; the drive is released when the
        // device is finalized, a moment later): "in use" is waited out, briefly.
        let deadline = Instant::now() + BLOCKDEV_DEL_WAIT;
        loop {
            match q.execute("blockdev-del", serde_json::json!({ "node-name": node })) {
                Ok(_) => {
                    debug!("{}: blockdev-del {node} done", q.host);
                    return;
                }
                Err(QmpError::Failed(e))
                    if e.contains("is in use") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    error!(
                        "{}: blockdev-del {node} failed: {e}; its image stays open in that QEMU",
                        q.host
                    );
                    return;
                }
            }
        }
    }

    /// device_del the device on one logical port (function 0: QEMU takes
    /// every function of the slot with it) and wait for every function's
    /// DEVICE_DELETED.
    fn hot_remove(&self, q: &Arc<Qmp>, reqs: &[Request], why: &mut String) -> u32 {
        let host = reqs[0].host;
        let deadline = Instant::now() + self.unbind_timeout();
        let main = reqs.iter().find(|r| r.devfn == 0).unwrap_or(&reqs[0]);
        let id = format!("fn-{:04x}", main.pdfid);
        let mut res = q.device_del_wait(&id, self.unbind_timeout());
        if res.is_ok() {
            for r in reqs.iter().filter(|r| r.pdfid != main.pdfid) {
                let other = format!("fn-{:04x}", r.pdfid);
                res = q.wait_deleted(&other, deadline);
                if res.is_err() {
                    break;
                }
            }
        }
        match res {
            Ok(()) => {
                // Every function's DEVICE_DELETED arrived: QEMU let go of the
                // nvme images' nodes; close them so another QEMU may open them.
                for r in reqs {
                    if self.nvme(r.pdfid).is_some() {
                        self.blockdev_del(q, r.pdfid);
                    }
                }
                0
            }
            Err(QmpError::Unreachable(e)) if !self.meps[host].connected.load(Ordering::Relaxed) => {
                // The host's QEMU is gone (its MEP client disconnected and its QMP
                // does not answer): nothing is left to remove the device from.
                *why = format!(
                    "{}'s QEMU is gone (MEP disconnected; {e}): treated as removed",
                    self.meps[host].name
                );
                0
            }
            Err(QmpError::Timeout) => {
                *why = "no DEVICE_DELETED in time".into();
                model::PCIFAB_ERR_UNBIND_TIMEOUT
            }
            Err(e) => {
                *why = format!("device_del: {e}");
                model::PCIFAB_ERR_HOTPLUG_FAILED
            }
        }
    }

    /// Bring the configuration's initial bindings into QEMU: for every host
    /// with a QMP socket, device_add its bound functions once its QEMU
    /// answers (retrying for two minutes).
    pub fn attach_initial(self: &Arc<Self>) {
        for (h, q) in self.qmp.iter().enumerate() {
            let Some(q) = q.clone() else { continue };
            let bound: Vec<(u16, u8)> = self
                .model()
                .functions
                .iter()
                .filter_map(|f| f.binding.filter(|b| b.0 == h).map(|b| (f.pdfid, b.1)))
                .collect();
            if bound.is_empty() {
                continue;
            }
            let me = Arc::clone(self);
            let _ = std::thread::Builder::new()
                .name(format!("attach-{}", q.host))
                .spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(120);
                    for (pdfid, l) in bound {
                        let id = format!("fn-{pdfid:04x}");
                        loop {
                            match me.add_function(&q, pdfid, &format!("dsp{l}"), None, false) {
                                Ok(()) => {
                                    info!("{}: initial binding {id} added on dsp{l}", q.host);
                                    let mut m = me.model();
                                    if let Some(f) =
                                        m.functions.iter_mut().find(|f| f.pdfid == pdfid)
                                    {
                                        f.phantom = false;
                                    }
                                    break;
                                }
                                Err(e) if Instant::now() < deadline => {
                                    debug!("{}: initial binding {id}: {e}; retrying", q.host);
                                    std::thread::sleep(Duration::from_millis(500));
                                }
                                Err(e) => {
                                    error!("{}: initial binding {id} not added: {e}", q.host);
                                    break;
                                }
                            }
                        }
                    }
                });
        }
    }

    pub fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host's QEMU connected to its MEP (`up`) or went away: the host's upstream port
    /// link follows, with the events of a `link` control request.
    pub fn host_link(&self, host: usize, up: bool) {
        let Some(port) = self.model().hosts.get(host).map(|h| h.port) else {
            return;
        };
        let name = &self.meps[host].name;
        match self.set_link(port, up) {
            Ok(true) => info!(
                "{name}: MEP client {}: upstream port {port} link {}",
                if up { "connected" } else { "gone" },
                if up { "up" } else { "down" }
            ),
            Ok(false) => {}
            Err(e) => error!("{name}: cannot set upstream port {port} link: {e}"),
        }
    }

    /// Start one MRPC worker thread per MEP.
    pub fn start(self: &Arc<Self>) -> Result<(), String> {
        for (i, m) in self.meps.iter().enumerate() {
            let weak = Arc::downgrade(self);
            m.set_link_hook(Box::new(move |up| {
                if let Some(f) = weak.upgrade() {
                    f.host_link(i, up);
                }
            }));
            let (tx, rx) = mpsc::channel();
            m.set_worker(tx);
            let fabric = Arc::clone(self);
            std::thread::Builder::new()
                .name(format!("mrpc-{}", m.name))
                .spawn(move || fabric.worker(i, rx))
                .map_err(|e| format!("cannot start thread: {e}"))?;
            let mep = Arc::clone(m);
            std::thread::Builder::new()
                .name(format!("dma-{}", m.name))
                .spawn(move || p2p::engine(&*mep))
                .map_err(|e| format!("cannot start thread: {e}"))?;
        }
        Ok(())
    }

    /// The firmware of MEP `idx`: executes its commands one at a time.
    fn worker(&self, idx: usize, rx: Receiver<Job>) {
        let mep = &self.meps[idx];
        for job in rx {
            let f = mep.faults();
            if f.hang || f.dead {
                mep.note_hung(&job);
                note!(
                    "{}: MRPC cmd {:#x} ({}) never completes (fault {})",
                    mep.name,
                    job.cmd,
                    mrpc_name(job.cmd),
                    if f.dead { "firmware-dead" } else { "mrpc-hang" }
                );
                continue;
            }
            if f.delay_ms > 0 {
                std::thread::sleep(Duration::from_millis(f.delay_ms));
            }
            // A bind-other lie changes the bind request itself; it counts as told once the
            // bind it made succeeded.
            let mut bind_other = None;
            let (mut outcome, notices, deferred, access) = match f.error {
                Some(ret) => (MrpcOutcome::error(ret), Vec::new(), None, None),
                None => {
                    let mut model = self.model();
                    if f.lie == Some(hostile::Lie::BindOther) {
                        bind_other = hostile::bind_other_input(&model, job.cmd, &job.input);
                    }
                    let mut x = Exec {
                        model: &mut model,
                        partition: idx,
                        bad_length: f.bad_length,
                        notices: Vec::new(),
                        deferred: None,
                        ep_access: None,
                    };
                    let outcome = x.run(job.cmd, bind_other.as_deref().unwrap_or(&job.input));
                    (outcome, x.notices, x.deferred, x.ep_access)
                }
            };
            if let Some(acc) = access {
                // The model lock is released: the function's BAR0 takes it.
                outcome = match ep::perform(&self.p2p, idx, &acc) {
                    Ok(out) => MrpcOutcome::done(out),
                    Err(ret) => MrpcOutcome::error(ret),
                };
            }
            if notices.iter().any(|n| !n.routes_lost.is_empty()) {
                // A REVOKE removed routes: complete only once no copy that
                // passed its check on one of them is still running.
                self.p2p.quiesce();
            }
            if let Some(req) = deferred {
                // Acknowledge the write of `cmd` now (status INPROGRESS);
                // the hot-plug may take seconds and needs QEMU's main loop.
                mep.mark_done(job.seq);
                let ret = self.execute(req);
                if ret != 0 {
                    outcome = MrpcOutcome::error(ret);
                }
            }
            if f.hostile.is_some() && hostile::targeted(job.cmd) {
                if let Some(mut rng) = mep.hostile_rng(Stream::Mrpc) {
                    if hostile::corrupt_reply(&mut rng, job.cmd, &job.input, &mut outcome) {
                        mep.hostile_count(|c| c.mrpc_replies += 1);
                    }
                }
            }
            if bind_other.is_some() && outcome.status == crate::gas::MRPC_STATUS_DONE {
                if let Some(lie) = mep.take_lie(|l| l == hostile::Lie::BindOther) {
                    mep.lie_told(lie);
                }
            }
            if f.lie.is_some() {
                if let Some(lie) = mep.take_lie(|l| l.fits(job.cmd, &job.input)) {
                    let usp = self.model().hosts[idx].port;
                    if hostile::tell(lie, &job.input, &mut outcome, usp) {
                        mep.lie_told(lie);
                    } else {
                        // Not told (the reply failed or had no room): keep it for the next.
                        mep.set_faults(|f| f.lie = Some(lie));
                    }
                }
            }
            if f.completion_us > 0 {
                let at = job.written + Duration::from_micros(f.completion_us);
                let left = at.saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    std::thread::sleep(left);
                }
            }
            mep.complete(&job, &outcome, f.drop_irq);
            self.notify(&notices);
            mep.mark_done(job.seq);
        }
    }

    /// Show fabric changes on every MEP.
    pub fn notify(&self, notices: &[Notice]) {
        if notices.is_empty() {
            return;
        }
        let pending = self.model().pending();
        for (i, m) in self.meps.iter().enumerate() {
            m.signal(notices, pending.get(i).copied().unwrap_or(0));
        }
    }

    /// Change a port's link state (control request `link`). Ok(false) when
    /// it already was in that state.
    pub fn set_link(&self, port: u8, up: bool) -> Result<bool, String> {
        let notice = self.model().set_link(port, up)?;
        match notice {
            Some(n) => {
                self.notify(&[n]);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// A fabric database change (control request `fabric-change`).
    pub fn fabric_change(&self) -> u32 {
        let (n, generation) = {
            let mut m = self.model();
            let n = m.fabric_change();
            (n, m.generation)
        };
        self.notify(&[n]);
        generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's QEMU going away takes its upstream port link down (events on the other
    /// MEPs), and an unbind of a function it held completes without QEMU.
    #[test]
    fn host_gone_link_down_and_unbind_without_qemu() {
        use crate::vfio_user::Device;
        let cfg = Config::parse(
            "[[hosts]]\nname = \"a\"\n[[hosts]]\nname = \"b\"\nusp_port = 8\n\
             [[endpoints]]\nname = \"g\"\nport = 16\nvendor_id = 0x10de\n\
             device_id = 0x2330\nclass = 0x030200\n\
             [[bindings]]\nendpoint = \"g\"\nhost = \"b\"\nlogical_port = 0\n",
        )
        .expect("config");
        let dir = std::env::temp_dir().join(format!("pcifab-emu-gone-{}", std::process::id()));
        let qmp = [("b".to_string(), dir.join("no-such-qmp.sock"))];
        let f = Arc::new(Fabric::with(cfg, dir, &qmp).expect("fabric"));
        f.start().expect("start");
        let gen0 = f.model().generation;
        Device::set_connected(&*f.meps[1], true);
        assert!(f.model().link_up(8));
        assert_eq!(f.model().generation, gen0, "already up: no change");
        Device::disconnect(&*f.meps[1]);
        assert!(!f.model().link_up(8), "b's upstream link follows its QEMU");
        assert_ne!(f.model().generation, gen0);
        assert!(f.model().pending()[0] > 0, "a got the HOST_LINK_DOWN event");
        // The function b holds was really added to its QEMU; QEMU is gone now.
        let pdfid = 0x0300;
        let req = {
            let mut m = f.model();
            if let Some(x) = m.functions.iter_mut().find(|x| x.pdfid == pdfid) {
                x.phantom = false;
            }
            m.begin_unbind(Requester::Host(0), 1, 0, pdfid)
                .expect("unbind accepted")
        };
        assert_eq!(f.execute(req), 0, "unbind from a gone host completes");
        assert_eq!(f.model().function(pdfid).and_then(|x| x.binding), None);
        Device::set_connected(&*f.meps[1], true);
        assert!(f.model().link_up(8), "a new QEMU brings the link back");
    }
}
