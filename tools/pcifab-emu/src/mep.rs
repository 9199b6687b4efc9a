// SPDX-License-Identifier: GPL-2.0-only
//! The management endpoint: the device one host's QEMU sees over vfio-user.
//! Its regions (BAR0 with the GAS in `regs`, BAR2 the P2P window of `p2p`,
//! BAR4 with the MSI-X table and PBA, config space), the injected faults and
//! hostile mode, its MRPC mailbox (commands handed to the firmware worker
//! that `fabric` runs) and the interrupts and DMA mappings the client set up.

use crate::config::Firmware;
use crate::dma::DmaTable;
use crate::gas::*;
use crate::hostile::{self, Stream};
use crate::irq::{self, Irqs};
use crate::model::Notice;
use crate::mrpc::{mrpc_name, MrpcOutcome};
use crate::p2p;
use crate::pci::{self, ConfigSpace};
use crate::regs::{Gas, GasFeatures, MepState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

// vfio_pci region indices.
pub const REGION_BAR0: u32 = 0;
pub const REGION_BAR4: u32 = 4;
pub const REGION_ROM: u32 = 6;
pub const REGION_CONFIG: u32 = 7;
pub const REGION_VGA: u32 = 8;

pub const REGION_BAR2: u32 = 2;

/// Size of a region; 0 for the ones the MEP does not have. `window` is the
/// size of the P2P window (BAR2).
pub fn region_size(index: u32, window: u64) -> u64 {
    match index {
        REGION_BAR0 => pci::BAR0_SIZE,
        REGION_BAR2 => window,
        REGION_BAR4 => pci::BAR4_SIZE,
        REGION_CONFIG => pci::CONFIG_SIZE as u64,
        // BAR1/3/5 are upper halves; no ROM, no VGA.
        REGION_ROM | REGION_VGA => 0,
        _ => 0,
    }
}

pub fn status_name(status: u32) -> &'static str {
    match status {
        MRPC_STATUS_INPROGRESS => "INPROGRESS",
        MRPC_STATUS_DONE => "DONE",
        MRPC_STATUS_ERROR => "ERROR",
        MRPC_STATUS_INTERRUPTED => "INTERRUPTED",
        _ => "?",
    }
}

fn new_bar4() -> Vec<u8> {
    let mut bar4 = vec![0u8; pci::BAR4_SIZE as usize];
    // MSI-X table entries start masked (vector control bit 0).
    for v in 0..usize::from(pci::MSIX_VECTORS) {
        bar4[pci::MSIX_TABLE_OFFSET as usize + 16 * v + 12] = 1;
    }
    bar4
}

/// Faults injected into one MEP's firmware (control request `fault`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Commands never complete.
    pub hang: bool,
    /// Commands fail with this return value.
    pub error: Option<u32>,
    /// Interrupts are not raised (registers still update).
    pub drop_irq: bool,
    /// Commands complete after this many milliseconds.
    pub delay_ms: u64,
    /// Dump and list replies claim more than the output buffer.
    pub bad_length: bool,
    /// sys_info.device_id reads 0 and commands never complete.
    pub dead: bool,
    /// The next bind to this host adds no device to QEMU but reports DONE.
    pub no_enumerate: bool,
    /// The next unbind of a function of this host that succeeds queues one more
    /// UNBIND_REQUEST for it after it is gone (a request that reached the host late).
    pub late_unbind_request: bool,
    /// The DMA engine sleeps this long before every chunk it copies.
    pub dma_delay_ms: u64,
    /// Hostile firmware with this seed: replies, event registers and DMA
    /// write-backs lie (see `hostile`).
    pub hostile: Option<u64>,
    /// Commands complete this many microseconds after the write of the
    /// command register (config `mrpc_completion_us`; kept by `fault clear`).
    pub completion_us: u64,
    /// The next reply (or DMA write-back) this fits lies this way, once.
    pub lie: Option<hostile::Lie>,
    /// The MEP is gone from the bus (surprise removal): BAR0 reads all ones and drops
    /// writes.
    pub gone: bool,
}

impl Faults {
    /// The active faults as JSON strings.
    pub fn names(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.hang {
            v.push("mrpc-hang".to_owned());
        }
        if let Some(r) = self.error {
            v.push(format!("mrpc-error {r:#x}"));
        }
        if self.drop_irq {
            v.push("drop-irq".to_owned());
        }
        if self.delay_ms > 0 {
            v.push(format!("delay {}", self.delay_ms));
        }
        if self.bad_length {
            v.push("bad-length".to_owned());
        }
        if self.dead {
            v.push("firmware-dead".to_owned());
        }
        if self.no_enumerate {
            v.push("no-enumerate".to_owned());
        }
        if self.late_unbind_request {
            v.push("late-unbind-request".to_owned());
        }
        if self.dma_delay_ms > 0 {
            v.push(format!("dma-delay {}", self.dma_delay_ms));
        }
        if let Some(seed) = self.hostile {
            v.push(format!("hostile {seed}"));
        }
        if self.completion_us > 0 {
            v.push(format!("completion-delay {}", self.completion_us));
        }
        if let Some(l) = self.lie {
            v.push(format!("lie {}", l.name()));
        }
        if self.gone {
            v.push("gone".to_owned());
        }
        v
    }
}

/// A command handed to the MEP's worker thread.
#[derive(Clone)]
pub struct Job {
    /// Its number: `Mep::mark_done` with it acknowledges the command write.
    pub seq: u64,
    epoch: u64,
    pub cmd: u32,
    pub input: Vec<u8>,
    /// When the host wrote the command register.
    pub written: Instant,
}

/// How long a write of the command register waits for a command without an
/// injected delay to complete before acknowledging the write anyway.
const SYNC_WAIT: Duration = Duration::from_secs(2);

/// One host's management endpoint.
pub struct Mep {
    pub name: String,
    pub partition: u32,
    partitions: u32,
    fw: Firmware,
    /// What the firmware offers after a reset (`fault dma-mrpc` changes it).
    features: Mutex<GasFeatures>,
    inner: Mutex<MepState>,
    pub connected: AtomicBool,
    pub mrpc_commands: AtomicU64,
    pub irqs_fired: AtomicU64,
    /// Host reads and writes of the extension register block while the firmware has none
    /// (the PAX dialect): a driver that speaks PAX never makes one.
    pub ext_block_accesses: AtomicU64,
    /// The host's reads and writes of the MEP's BARs (0, 2 and 4; not its config space) that
    /// reached the emulator, whatever they touched: what a driver's MMIO costs, counted in
    /// accesses rather than time (`pcifab-harness bench`'s `mrpc_mmio_per_command`).
    pub bar_reads: AtomicU64,
    pub bar_writes: AtomicU64,
    pub faults: Mutex<Faults>,
    /// The command an `mrpc-hang` or `firmware-dead` fault swallowed, still INPROGRESS.
    hung: Mutex<Option<Job>>,
    /// The hostile mode's streams and counts.
    hostile: Mutex<hostile::State>,
    /// Lies told (`fault <host> lie <kind>`), per kind in [`hostile::Lie::ALL`]'s order.
    lies_told: Mutex<[u64; 6]>,
    /// BAR0 writes dropped while the MEP was gone (`fault <host> gone`).
    pub gone_writes: AtomicU64,
    jobs: Mutex<Option<Sender<Job>>>,
    next_seq: AtomicU64,
    done: Mutex<u64>,
    done_cv: Condvar,
    /// What the P2P window and the DMA engine reach.
    pub p2p: Arc<p2p::Shared>,
    /// The DMA engine has been kicked and not yet looked.
    dma_kick: Mutex<bool>,
    dma_cv: Condvar,
    /// Called with true when a vfio-user client (the host's QEMU) connects and with false
    /// when it goes away: the fabric follows with the host's upstream port link.
    link_hook: LinkHook,
}

/// What [`Mep::set_link_hook`] installs.
type LinkHook = Mutex<Option<Box<dyn Fn(bool) + Send + Sync>>>;

impl Mep {
    pub fn new(
        name: &str,
        fw: &Firmware,
        partition: u32,
        partitions: u32,
        p2p: Arc<p2p::Shared>,
        features: GasFeatures,
    ) -> Mep {
        Mep {
            features: Mutex::new(features),
            name: name.to_owned(),
            partition,
            partitions,
            fw: fw.clone(),
            inner: Mutex::new(MepState {
                cfg: ConfigSpace::new(fw, p2p.window),
                gas: Gas::new(fw, partition, partitions, p2p.window_mib(), features),
                bar4: new_bar4(),
                irqs: Irqs::new(),
                dma: DmaTable::default(),
                epoch: 0,
                dma_epoch: 0,
            }),
            connected: AtomicBool::new(false),
            mrpc_commands: AtomicU64::new(0),
            irqs_fired: AtomicU64::new(0),
            ext_block_accesses: AtomicU64::new(0),
            bar_reads: AtomicU64::new(0),
            bar_writes: AtomicU64::new(0),
            faults: Mutex::new(Faults::default()),
            hung: Mutex::new(None),
            hostile: Mutex::new(hostile::State::default()),
            lies_told: Mutex::new([0; 6]),
            gone_writes: AtomicU64::new(0),
            jobs: Mutex::new(None),
            next_seq: AtomicU64::new(0),
            done: Mutex::new(0),
            done_cv: Condvar::new(),
            p2p,
            dma_kick: Mutex::new(false),
            dma_cv: Condvar::new(),
            link_hook: Mutex::new(None),
        }
    }

    /// Hands the commands the host writes to a worker (the firmware) from now on.
    pub fn set_worker(&self, jobs: Sender<Job>) {
        *self.jobs.lock().unwrap_or_else(|e| e.into_inner()) = Some(jobs);
    }

    /// Installs what runs when the host's QEMU connects (true) or disconnects (false).
    pub fn set_link_hook(&self, hook: Box<dyn Fn(bool) + Send + Sync>) {
        *self.link_hook.lock().unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    fn run_link_hook(&self, up: bool) {
        let hook = self.link_hook.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = hook.as_ref() {
            h(up);
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, MepState> {
        // A panic elsewhere must not take the device down with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn faults(&self) -> Faults {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_faults(&self, f: impl FnOnce(&mut Faults)) {
        let recovered = {
            let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
            let stuck = faults.hang || faults.dead;
            f(&mut faults);
            stuck && !faults.hang && !faults.dead
        };
        if recovered {
            self.release_hung();
        }
    }

    /// The worker swallowed `job` because of a hang or dead fault.
    pub fn note_hung(&self, job: &Job) {
        *self.hung.lock().unwrap_or_else(|e| e.into_inner()) = Some(job.clone());
    }

    /// The firmware recovered from a hang or crash: like a firmware reset, it reports the
    /// command it swallowed as INTERRUPTED (`MRPC_STATUS_INTERRUPTED`, which the C driver
    /// turns into ENXIO), so the mailbox is free again. A driver must not reuse the mailbox
    /// before that (Documentation/emulator.rst).
    fn release_hung(&self) {
        let job = self.hung.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            let outcome = MrpcOutcome {
                status: MRPC_STATUS_INTERRUPTED,
                ret: 0,
                output: Vec::new(),
            };
            let drop_irq = self.faults().drop_irq;
            self.complete(&job, &outcome, drop_irq);
            self.mark_done(job.seq);
        }
    }

    fn hostile_state(&self) -> MutexGuard<'_, hostile::State> {
        self.hostile.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hostile mode was set with `seed`: its streams and counts start over.
    pub fn arm_hostile(&self, seed: u64) {
        self.hostile_state().arm(seed);
    }

    /// The hostile mode's seed (None: never set) and counts.
    /// Takes the armed one-shot lie if `fits` says this is where it is told.
    pub fn take_lie(&self, fits: impl FnOnce(hostile::Lie) -> bool) -> Option<hostile::Lie> {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let lie = f.lie.filter(|&l| fits(l))?;
        f.lie = None;
        Some(lie)
    }

    /// Counts a lie told.
    pub fn lie_told(&self, lie: hostile::Lie) {
        let i = hostile::Lie::ALL
            .iter()
            .position(|&l| l == lie)
            .unwrap_or(0);
        self.lies_told.lock().unwrap_or_else(|e| e.into_inner())[i] += 1;
        info!("{}: lied once: {}", self.name, lie.name());
    }

    /// Lies told since start, per kind in [`hostile::Lie::ALL`]'s order.
    pub fn lies_told(&self) -> [u64; 6] {
        *self.lies_told.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `fault <host> gone`: raise the partition's event vector as a device that is gone
    /// would leave a pending interrupt; the handler finds BAR0 reading all ones.
    pub fn raise_gone(&self) {
        let inner = self.lock();
        let v = inner.gas.vep_vector();
        self.raise(&inner, v, "nothing (the MEP is gone)", false);
    }

    pub fn hostile_report(&self) -> hostile::State {
        self.hostile_state().clone()
    }

    /// The generator for the next event of `stream`, when the mode is on.
    pub fn hostile_rng(&self, stream: Stream) -> Option<hostile::Rng> {
        self.faults().hostile?;
        Some(self.hostile_state().rng(self.partition, stream))
    }

    /// Count something the hostile mode corrupted.
    pub fn hostile_count(&self, f: impl FnOnce(&mut hostile::Counts)) {
        f(&mut self.hostile_state().counts);
    }

    /// Counts an access to the extension register block the firmware does not have.
    fn note_ext_block(&self, region: u32, off: u64) {
        let in_block = region == REGION_BAR0 && (P2P..P2P + P2P_SIZE).contains(&off);
        if in_block && !self.features.lock().unwrap_or_else(|e| e.into_inner()).ext {
            self.ext_block_accesses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a host access of one of the BARs in [`Mep::bar_reads`] or [`Mep::bar_writes`].
    fn note_bar_access(&self, region: u32, write: bool) {
        if matches!(region, REGION_BAR0 | REGION_BAR2 | REGION_BAR4) {
            let c = if write {
                &self.bar_writes
            } else {
                &self.bar_reads
            };
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn region_read(&self, region: u32, off: u64, buf: &mut [u8]) -> Result<(), String> {
        self.note_ext_block(region, off);
        self.note_bar_access(region, false);
        let inner = self.lock();
        match region {
            REGION_BAR0 => {
                if self.faults().gone {
                    // Nothing answers: the root port completes the read with all ones.
                    buf.fill(0xff);
                    return Ok(());
                }
                inner.gas.read(off, buf)?;
                if let Some(mut rng) = self.hostile_rng(Stream::Register) {
                    if hostile::corrupt_read(&mut rng, self.partitions, off, buf) {
                        self.hostile_count(|c| c.register_reads += 1);
                    }
                }
                if self.faults().dead {
                    // A crashed firmware: sys_info.device_id reads 0.
                    let id = SYS_INFO + SI_DEVICE_ID;
                    for (i, b) in buf.iter_mut().enumerate() {
                        if (id..id + 4).contains(&(off + i as u64)) {
                            *b = 0;
                        }
                    }
                }
                Ok(())
            }
            // Gone from the bus: config reads complete with all ones too, as the kernel's
            // `pci_device_is_present()` sees a surprise-removed device.
            REGION_CONFIG if self.faults().gone => {
                buf.fill(0xff);
                Ok(())
            }
            REGION_CONFIG => inner.cfg.read(to_usize(off)?, buf),
            REGION_BAR2 => {
                drop(inner);
                p2p::window_read(self, off, buf)
            }
            REGION_BAR4 => {
                let o = to_usize(off)?;
                let src = inner
                    .bar4
                    .get(o..o.saturating_add(buf.len()))
                    .ok_or_else(|| bar4_range(off, buf.len()))?;
                buf.copy_from_slice(src);
                Ok(())
            }
            _ => Err(format!("region {region} has no space")),
        }
    }

    pub fn region_write(&self, region: u32, off: u64, data: &[u8]) -> Result<(), String> {
        self.note_ext_block(region, off);
        self.note_bar_access(region, true);
        if region == REGION_BAR2 {
            return p2p::window_write(self, off, data);
        }
        if (region == REGION_BAR0 || region == REGION_CONFIG) && self.faults().gone {
            if region == REGION_BAR0 {
                self.gone_writes.fetch_add(1, Ordering::Relaxed);
            }
            note!(
                "{}: {} write of {} bytes at {off:#x} while gone: dropped",
                self.name,
                if region == REGION_BAR0 {
                    "BAR0"
                } else {
                    "config"
                },
                data.len()
            );
            return Ok(());
        }
        if region == REGION_BAR0 {
            let job = {
                let mut inner = self.lock();
                let w = inner.gas.write(off, data)?;
                if w.dma_reset {
                    inner.dma_epoch += 1;
                    info!("{}: DMA engine reset", self.name);
                }
                if w.dma_kick {
                    self.kick_dma();
                }
                if !w.mrpc {
                    return Ok(());
                }
                let (cmd, input) = inner.gas.start_mrpc();
                Job {
                    seq: self.next_seq.fetch_add(1, Ordering::Relaxed) + 1,
                    epoch: inner.epoch,
                    cmd,
                    input,
                    written: Instant::now(),
                }
            };
            self.mrpc_commands.fetch_add(1, Ordering::Relaxed);
            self.submit(job);
            return Ok(());
        }
        let mut inner = self.lock();
        match region {
            REGION_CONFIG => inner.cfg.write(to_usize(off)?, data),
            REGION_BAR4 => {
                let o = to_usize(off)?;
                let end = o
                    .checked_add(data.len())
                    .filter(|&e| e <= inner.bar4.len())
                    .ok_or_else(|| bar4_range(off, data.len()))?;
                let table_end =
                    pci::MSIX_TABLE_OFFSET as usize + 16 * usize::from(pci::MSIX_VECTORS);
                if end <= table_end {
                    inner.bar4[o..end].copy_from_slice(data);
                } else {
                    debug!(
                        "{}: BAR4 write at {off:#x} outside the MSI-X table ignored",
                        self.name
                    );
                }
                Ok(())
            }
            _ => Err(format!("region {region} has no space")),
        }
    }

    /// Hand a command to the worker. Without an injected delay or hang,
    /// wait until it completed, so the host's next access sees the result.
    fn submit(&self, job: Job) {
        let seq = job.seq;
        let sent = {
            let tx = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            tx.as_ref().is_some_and(|tx| tx.send(job).is_ok())
        };
        if !sent {
            error!("{}: no MRPC worker; command stays INPROGRESS", self.name);
            return;
        }
        let f = self.faults();
        if f.hang || f.dead || f.delay_ms > 0 || f.completion_us > 0 {
            return;
        }
        let deadline = Instant::now() + SYNC_WAIT;
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while *done < seq {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                note!(
                    "{}: MRPC command {seq} still running after {} s; write acknowledged",
                    self.name,
                    SYNC_WAIT.as_secs()
                );
                break;
            }
            done = match self.done_cv.wait_timeout(done, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// Command `seq` (and every one before it) is done: a write of the command
    /// register waiting for it returns.
    pub fn mark_done(&self, seq: u64) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        *done = (*done).max(seq);
        self.done_cv.notify_all();
    }

    /// The firmware finished a command: registers, completion event, IRQ.
    pub fn complete(&self, job: &Job, outcome: &MrpcOutcome, drop_irq: bool) {
        let mut inner = self.lock();
        if inner.epoch != job.epoch {
            note!(
                "{}: MRPC cmd {:#x} finished after a device reset; result discarded",
                self.name,
                job.cmd
            );
            return;
        }
        let vector = inner.gas.finish_mrpc(outcome);
        let dma_vector = inner.gas.dma_mrpc_target().and_then(|addr| {
            let mut out = vec![0u8; DMA_MRPC_OUTPUT_SIZE];
            let n = if outcome.status == MRPC_STATUS_DONE {
                outcome.output.len().min(MRPC_PAYLOAD_SIZE as usize)
            } else {
                0
            };
            out[4..8].copy_from_slice(&job.cmd.to_le_bytes());
            out[8..12].copy_from_slice(&outcome.ret.to_le_bytes());
            out[12..16].copy_from_slice(&(n as u32).to_le_bytes());
            out[16..16 + n].copy_from_slice(&outcome.output[..n]);
            // Everything but the status first: the host polls the status.
            let res = inner
                .dma
                .write(addr + 4, &out[4..])
                .and_then(|()| inner.dma.write(addr, &outcome.status.to_le_bytes()));
            match res {
                Ok(()) => Some(DMA_MRPC_VECTOR as u16),
                Err(e) => {
                    note!(
                        "{}: DMA MRPC output to {addr:#x} not written: {e}",
                        self.name
                    );
                    None
                }
            }
        });
        info_or_note!(
            outcome.status != MRPC_STATUS_DONE,
            "{}: MRPC cmd {:#x} ({}) input {} bytes -> status {} ret {:#x}",
            self.name,
            job.cmd,
            mrpc_name(job.cmd),
            job.input.len(),
            status_name(outcome.status),
            outcome.ret
        );
        if let Some(v) = dma_vector {
            self.raise(&inner, v, "DMA MRPC completion", drop_irq);
        }
        if let Some(v) = vector {
            self.raise(&inner, v, "MRPC completion", drop_irq);
        }
        if let Some(mut rng) = self.hostile_rng(Stream::Irq) {
            if rng.chance(1, 3) {
                let v = rng.below(u64::from(pci::MSIX_VECTORS)) as u16;
                self.hostile_count(|c| c.spurious_irqs += 1);
                self.raise(&inner, v, "nothing (hostile: spurious)", drop_irq);
            }
        }
    }

    /// Wake the DMA engine thread.
    pub fn kick_dma(&self) {
        *self.dma_kick.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.dma_cv.notify_all();
    }

    /// Wait until the DMA engine is kicked (and consume the kick).
    fn wait_dma_kick(&self) {
        let mut k = self.dma_kick.lock().unwrap_or_else(|e| e.into_inner());
        while !*k {
            k = self.dma_cv.wait(k).unwrap_or_else(|e| e.into_inner());
        }
        *k = false;
    }

    /// Set P2P event bits and interrupt if that is enabled.
    pub fn raise_p2p(&self, inner: &mut MepState, bits: u32, why: &str) {
        if let Some(v) = inner.gas.raise_p2p(bits) {
            let drop_irq = self.faults().drop_irq;
            self.raise(inner, v, why, drop_irq);
        }
    }

    /// Consume a `no-enumerate` fault.
    pub fn take_no_enumerate(&self) -> bool {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut f.no_enumerate)
    }

    /// Consume a `late-unbind-request` fault.
    pub fn take_late_unbind_request(&self) -> bool {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut f.late_unbind_request)
    }

    /// Show fabric changes in this MEP's registers and interrupt.
    pub fn signal(&self, notices: &[Notice], pending: u32) {
        let drop_irq = self.faults().drop_irq;
        let mut inner = self.lock();
        for n in notices {
            let mut irq = false;
            for &pff in &n.pffs {
                irq |= inner.gas.raise_link(pff);
            }
            if n.gfms {
                irq |= inner.gas.raise_gfms(pending);
            }
            if irq {
                let v = inner.gas.vep_vector();
                self.raise(&inner, v, "fabric event", drop_irq);
            }
            if n.routes_lost.contains(&(self.partition as usize)) {
                info!(
                    "{}: P2P routes removed (target unbound or grant revoked)",
                    self.name
                );
                self.raise_p2p(&mut inner, EV_ROUTES_CHANGED, "P2P routes changed");
            }
        }
    }

    /// Interrupt the host: the MSI-X vector when MSI-X is set up, else INTx.
    fn raise(&self, inner: &MepState, vector: u16, why: &str, drop_irq: bool) {
        if drop_irq {
            note!(
                "{}: interrupt for {why} dropped (fault drop-irq)",
                self.name
            );
            return;
        }
        let (index, vec) = if inner.irqs.has_any(irq::MSIX) || !inner.irqs.has_any(irq::INTX) {
            (irq::MSIX, usize::from(vector))
        } else {
            (irq::INTX, 0)
        };
        match inner.irqs.fire(index, vec) {
            Ok(()) => {
                self.irqs_fired.fetch_add(1, Ordering::Relaxed);
                info!(
                    "{}: {} vector {vec} fired ({why})",
                    self.name,
                    irq::index_name(index)
                );
            }
            Err(e) => note!("{}: interrupt for {why} not delivered: {e}", self.name),
        }
    }

    /// Function reset: registers and config space back to power-on values.
    /// Interrupt and DMA setup belong to the client and stay.
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.cfg = ConfigSpace::new(&self.fw, self.p2p.window);
        let features = *self.features.lock().unwrap_or_else(|e| e.into_inner());
        inner.gas = Gas::new(
            &self.fw,
            self.partition,
            self.partitions,
            self.p2p.window_mib(),
            features,
        );
        inner.bar4 = new_bar4();
        inner.epoch += 1;
        inner.dma_epoch += 1;
        info!("{}: device reset", self.name);
    }

    /// Registers back to power-on values as a function-level or secondary bus reset leaves
    /// them, with config space and the MSI-X table as the host's PCI core restores them
    /// after one (control request `reset-regs`).
    pub fn reset_regs(&self) {
        let mut inner = self.lock();
        let features = *self.features.lock().unwrap_or_else(|e| e.into_inner());
        inner.gas = Gas::new(
            &self.fw,
            self.partition,
            self.partitions,
            self.p2p.window_mib(),
            features,
        );
        inner.epoch += 1;
        inner.dma_epoch += 1;
        info!("{}: registers reset (config space kept)", self.name);
    }

    /// `fault <host> dma-mrpc off|on`: the firmware withdraws DMA MRPC (or
    /// offers it again), now and after later resets.
    pub fn set_dma_mrpc(&self, on: bool) {
        self.features
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dma_mrpc = on;
        self.lock().gas.set_dma_mrpc(on);
        info!(
            "{}: DMA MRPC {}",
            self.name,
            if on { "offered" } else { "withdrawn" }
        );
    }

    /// The client went away: drop its eventfds and DMA mappings; the host's upstream port
    /// link goes down (the host is gone as far as the fabric can tell).
    pub fn disconnect(&self) {
        {
            let mut inner = self.lock();
            inner.irqs.clear();
            inner.dma.clear();
            self.connected.store(false, Ordering::Relaxed);
        }
        self.run_link_hook(false);
    }
}

impl crate::vfio_user::Device for Mep {
    fn name(&self) -> &str {
        &self.name
    }
    fn region_size(&self, index: u32) -> u64 {
        region_size(index, self.p2p.window)
    }
    fn region_read(&self, region: u32, off: u64, buf: &mut [u8]) -> Result<(), String> {
        Mep::region_read(self, region, off, buf)
    }
    fn region_write(&self, region: u32, off: u64, data: &[u8]) -> Result<(), String> {
        Mep::region_write(self, region, off, data)
    }
    fn reset(&self) {
        Mep::reset(self)
    }
    fn irqs(&self, f: &mut dyn FnMut(&mut Irqs)) {
        f(&mut self.lock().irqs)
    }
    fn dma(&self, f: &mut dyn FnMut(&mut DmaTable)) {
        f(&mut self.lock().dma)
    }
    fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::Relaxed);
        if on {
            self.run_link_hook(true);
        }
    }
    fn disconnect(&self) {
        Mep::disconnect(self)
    }
}

impl p2p::MepPort for Mep {
    fn name(&self) -> &str {
        &self.name
    }
    fn partition(&self) -> usize {
        self.partition as usize
    }
    fn shared(&self) -> &p2p::Shared {
        &self.p2p
    }
    fn lock(&self) -> MutexGuard<'_, MepState> {
        Mep::lock(self)
    }
    fn raise_p2p(&self, state: &mut MepState, bits: u32, why: &str) {
        Mep::raise_p2p(self, state, bits, why)
    }
    fn dma_delay_ms(&self) -> u64 {
        self.faults().dma_delay_ms
    }
    fn dma_writeback(&self, len: u64, done: u64, status: u32) -> (u64, u32) {
        if let Some(lie) = self.take_lie(|l| l == hostile::Lie::DmaDone) {
            self.lie_told(lie);
            return hostile::overdone(len);
        }
        // A hostile firmware lies in the write-back only; the engine's own
        // registers stay true.
        match self.hostile_rng(Stream::Dma) {
            Some(mut rng) => {
                self.hostile_count(|c| c.dma_writebacks += 1);
                hostile::corrupt_writeback(&mut rng, len, done, status)
            }
            None => (done, status),
        }
    }
    fn wait_dma_kick(&self) {
        Mep::wait_dma_kick(self)
    }
    fn gone(&self) -> bool {
        self.faults().gone
    }
}

fn to_usize(off: u64) -> Result<usize, String> {
    usize::try_from(off).map_err(|_| format!("offset {off:#x} too large"))
}

fn bar4_range(off: u64, len: usize) -> String {
    format!(
        "BAR4 access of {len} bytes at {off:#x} is outside its {:#x} bytes",
        pci::BAR4_SIZE
    )
}
