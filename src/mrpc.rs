// SPDX-License-Identifier: GPL-2.0-only

//! The MRPC command engine: the firmware's mailbox.
//!
//! One command is in the mailbox at a time; callers queue for their turn (a [`TurnLock`],
//! interrupted by any signal, so a caller behind a command that takes up to a minute can be
//! killed), then hold [`Mrpc::mailbox`]. A command's
//! input goes into the input buffer, writing its id to `MRPC_CMD` starts it, and the firmware
//! sets `MRPC_STATUS` to done or error when it has written the output and the return value.
//! Completion is signalled by the MRPC-completion event interrupt ([`Mrpc::complete`]); the
//! waiter also re-reads the status every [`POLL_MS`] in case an interrupt is lost.
//!
//! A watchdog tells a slow firmware from a dead one as the C switchtec driver does: every
//! [`WATCHDOG_MS`] while a command runs, the system-information device id must still equal
//! the endpoint's PCI device id; if it does not, the firmware is not running and the caller
//! gets `EIO` at once. A firmware that is alive but slow gets until the caller's timeout
//! (`ETIMEDOUT`). A command left unfinished (timeout, dead firmware, signal) marks the mailbox
//! stale. As in the C driver, the mailbox is not used again until the firmware finished that
//! command: the next caller waits for it (within its own timeout, and failing at once with
//! `EIO` while the firmware is not running) and never sees its output or its completion,
//! since that caller may be less privileged than the one who gave up.
//!
//! DMA MRPC: Gen4 firmware that reports a non-zero `dma_ver` writes a command's status,
//! return code and output into a host buffer ([`DmaOut`], `struct dma_mrpc_output` of
//! Linux's `include/linux/switchtec.h`) and raises its own vector, as the C driver uses it.
//! pcifab uses it when offered ([`Mrpc::dma_init`]); before every command it checks that the
//! firmware still has it enabled, arms it again if a firmware reset cleared it while
//! `dma_ver` still offers it, and falls back to the mailbox registers while it is withdrawn.

use kernel::{
    device::{Bound, Device},
    dma::Coherent,
    io::{io_read, io_write, register::Array, Io},
    new_condvar, new_mutex, new_spinlock_irq,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        barrier::{dma_mb, Read},
        CondVar, CondVarTimeoutResult, Mutex, SpinLockIrq,
    },
    time::{msecs_to_jiffies, Instant, Monotonic},
};

use crate::{regs, turn::TurnLock, Mep};

/// Largest input or output of one command.
pub(crate) const PAYLOAD: usize = regs::MRPC_PAYLOAD;
/// MRPC status of a finished command.
pub(crate) const STATUS_DONE: u32 = 2;
/// Default time a caller waits for its command.
pub(crate) const DEFAULT_TIMEOUT_MS: u32 = 5_000;
/// Longest time a caller may ask to wait.
pub(crate) const MAX_TIMEOUT_MS: u32 = 60_000;
/// Status re-read interval while waiting (the lost-interrupt fallback).
const POLL_MS: u32 = 50;
/// Firmware liveness check interval while a command runs.
const WATCHDOG_MS: i64 = 500;

/// Outcome of a command the firmware finished.
#[derive(Clone, Copy)]
pub(crate) struct Reply {
    /// done (2) or the firmware's error status, as `MRPC_STATUS` has it.
    pub(crate) status: u32,
    /// The firmware's return value.
    pub(crate) ret: u32,
}

crate::payload::payload! {
    /// `struct dma_mrpc_output`: where DMA MRPC firmware writes a command's completion.
    pub(crate) struct DmaOut[1040] {
        status: u32,
        cmd_id: u32,
        rtn_code: u32,
        output_size: u32,
        data: [u32; 256],
    }
}

/// Mailbox bookkeeping, owned by the caller whose command is in the mailbox.
struct Mailbox {
    /// A previous command was abandoned and may still be running.
    stale: bool,
    /// The DMA MRPC buffer, if the firmware offered DMA MRPC at probe.
    dma: Option<Coherent<DmaOut>>,
}

/// A caller counted in [`Mrpc::callers`] while it lives.
struct Caller<'a>(&'a Atomic<u32>);

impl Drop for Caller<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Counters of the engine, for sysfs and the events ioctl.
#[derive(Clone, Copy, Default)]
pub(crate) struct Stats {
    pub(crate) commands: u64,
    pub(crate) completions: u64,
    pub(crate) timeouts: u64,
    pub(crate) firmware_dead: u64,
    /// Commands that completed through DMA MRPC.
    pub(crate) dma_commands: u64,
}

/// The MRPC engine of one management endpoint.
#[pin_data]
pub(crate) struct Mrpc {
    /// The caller whose command is in the mailbox has the turn; the others wait for it,
    /// interrupted by any signal: the command ahead may take up to [`MAX_TIMEOUT_MS`], and
    /// those queued before it as long each. Closed when the device is going away
    /// ([`Mrpc::kill`]): running and new commands fail with `ENODEV`.
    #[pin]
    turn: TurnLock,
    /// The holder owns the mailbox: the caller with the turn, or probe and unbind, which
    /// take it for a moment without one.
    #[pin]
    mailbox: Mutex<Mailbox>,
    /// Counters, readable without waiting for the mailbox.
    commands: Atomic<u64>,
    timeouts: Atomic<u64>,
    firmware_dead: Atomic<u64>,
    dma_commands: Atomic<u64>,
    /// Callers inside [`Mrpc::run`] now (the one in the mailbox and those queued for it),
    /// and the most there were at once since the last reset (sysfs `mrpc_callers_max`).
    callers: Atomic<u32>,
    callers_max: Atomic<u32>,
    /// The last command went through DMA MRPC (set when DMA MRPC is armed at probe).
    dma_active: Atomic<bool>,
    /// Events are on: the MRPC-completion event interrupts while commands complete in the
    /// mailbox ([`Mrpc::set_completion_irq`]).
    events_on: Atomic<bool>,
    /// Number of MRPC completions the interrupt handler has seen.
    #[pin]
    completions: SpinLockIrq<u64>,
    /// Woken on every completion and on removal.
    #[pin]
    completed: CondVar,
}

impl Mrpc {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            turn <- TurnLock::new(),
            mailbox <- new_mutex!(Mailbox {
                stale: false,
                dma: None
            }),
            commands: Atomic::new(0),
            timeouts: Atomic::new(0),
            firmware_dead: Atomic::new(0),
            dma_commands: Atomic::new(0),
            callers: Atomic::new(0),
            callers_max: Atomic::new(0),
            dma_active: Atomic::new(false),
            events_on: Atomic::new(false),
            completions <- new_spinlock_irq!(0),
            completed <- new_condvar!(),
        })
    }

    /// Called from the interrupt handler when the MRPC completion event occurred.
    pub(crate) fn complete(&self) {
        {
            let mut n = self.completions.lock();
            *n = n.wrapping_add(1);
        }
        self.completed.notify_all();
    }

    /// Turns the MRPC-completion event's interrupt on with the other events, or off: on only
    /// while commands complete in the mailbox. With DMA MRPC its own vector signals every
    /// completion, and the event vector on top would cost each command a pass of the event
    /// handler over every event header (a dozen register reads). Follows DMA MRPC when the
    /// firmware withdraws or restores it ([`Mrpc::dma_path`]).
    pub(crate) fn set_completion_irq(&self, mep: &Mep, events_on: bool) -> Result {
        self.events_on.store(events_on, Relaxed);
        completion_hdr(mep, events_on && !self.dma_active())
    }

    /// Whether the events are on ([`Mrpc::set_completion_irq`]).
    pub(crate) fn events_on(&self) -> bool {
        self.events_on.load(Relaxed)
    }

    /// Fails the running command and every queued one with `ENODEV`; called on unbind.
    pub(crate) fn kill(&self) {
        self.turn.close();
        self.completed.notify_all();
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            commands: self.commands.load(Relaxed),
            completions: *self.completions.lock(),
            timeouts: self.timeouts.load(Relaxed),
            firmware_dead: self.firmware_dead.load(Relaxed),
            dma_commands: self.dma_commands.load(Relaxed),
        }
    }

    /// The most callers that were inside [`Mrpc::run`] at once since the last
    /// [`Mrpc::reset_callers_max`].
    pub(crate) fn callers_max(&self) -> u32 {
        self.callers_max.load(Relaxed)
    }

    /// Starts [`Mrpc::callers_max`] again from the callers inside now.
    pub(crate) fn reset_callers_max(&self) {
        self.callers_max.store(self.callers.load(Relaxed), Relaxed);
    }

    /// Counts a caller in until the returned guard drops, raising the high-water mark.
    fn enter(&self) -> Caller<'_> {
        let now = self.callers.fetch_add(1, Relaxed).saturating_add(1);
        let mut max = self.callers_max.load(Relaxed);
        while now > max {
            match self.callers_max.cmpxchg(max, now, Relaxed) {
                Ok(_) => break,
                Err(seen) => max = seen,
            }
        }
        Caller(&self.callers)
    }

    /// Whether the last command went through DMA MRPC.
    pub(crate) fn dma_active(&self) -> bool {
        self.dma_active.load(Relaxed)
    }

    /// Sets DMA MRPC up if the firmware offers it; returns the vector its completions raise.
    ///
    /// A vector beyond the `nvecs` the endpoint got leaves DMA MRPC off.
    pub(crate) fn dma_init(
        &self,
        mep: &Mep,
        dev: &Device<Bound>,
        nvecs: usize,
    ) -> Result<Option<usize>> {
        let (ver, vector) = mep.with_bar(|bar| {
            let ver: u32 = bar.read(regs::MRPC_DMA_VER).version().into();
            let vector: u16 = bar.read(regs::MRPC_DMA_VECTOR).vector().into();
            (ver, vector)
        })?;
        if ver == 0 {
            return Ok(None);
        }
        if usize::from(vector) >= nvecs {
            dev_warn!(
                mep.pdev,
                "DMA MRPC vector {} beyond the {} allocated: using the mailbox\n",
                vector,
                nvecs
            );
            return Ok(None);
        }
        let buf = Coherent::<DmaOut>::zeroed(dev, GFP_KERNEL)?;
        let mut mb = self.mailbox.lock();
        arm(mep, &buf)?;
        mb.dma = Some(buf);
        self.dma_active.store(true, Relaxed);
        dev_info!(mep.pdev, "DMA MRPC on\n");
        Ok(Some(usize::from(vector)))
    }

    /// Turns off a DMA MRPC this driver did not arm: one a previous kernel (kexec) or a probe
    /// that failed left pointing at memory that is no longer its. Called at probe before the
    /// first command, so no completion is written there. The write is harmless on firmware
    /// without DMA MRPC (`dma_en` is then read-only).
    pub(crate) fn disarm_stale(&self, mep: &Mep) -> Result {
        let _mb = self.mailbox.lock();
        let was_on = mep.with_bar(|bar| {
            let on = bar.read(regs::MRPC_DMA_EN).enabled();
            disarm(bar);
            on
        })?;
        if was_on {
            dev_notice!(mep.pdev, "DMA MRPC found armed at probe: turned off\n");
        }
        Ok(())
    }

    /// Stops DMA MRPC and frees its buffer. Called on unbind.
    ///
    /// The buffer is freed here, not with the endpoint: open files may keep the endpoint
    /// for longer than the device stays bound, and DMA memory must not outlive the binding.
    /// Called after [`Mrpc::kill`], so the caller holding the mailbox returns at once.
    pub(crate) fn dma_shut_down(&self, mep: &Mep) {
        let mut mb = self.mailbox.lock();
        if let Some(buf) = mb.dma.take() {
            let _ = mep.with_bar(disarm);
            drop(buf);
        }
        self.dma_active.store(false, Relaxed);
    }

    /// The DMA MRPC buffer to use for the next command, if DMA MRPC is on: arms it again when
    /// a firmware reset turned it off but the firmware still offers it.
    fn dma_path<'a>(&self, mep: &Mep, mb: &'a Mailbox) -> Result<Option<&'a Coherent<DmaOut>>> {
        let Some(buf) = mb.dma.as_ref() else {
            return Ok(None);
        };
        let (on, ver) = mep.with_bar(|bar| {
            let on = bar.read(regs::MRPC_DMA_EN).enabled();
            let ver: u32 = bar.read(regs::MRPC_DMA_VER).version().into();
            (on, ver)
        })?;
        let usable = if on {
            true
        } else if ver != 0 {
            arm(mep, buf)?;
            true
        } else {
            false
        };
        if usable != self.dma_active.xchg(usable, Relaxed) {
            if self.events_on.load(Relaxed) {
                completion_hdr(mep, !usable)?;
            }
            dev_info!(
                mep.pdev,
                "DMA MRPC {}\n",
                if usable {
                    "on"
                } else {
                    "withdrawn by the firmware: using the mailbox"
                }
            );
        }
        Ok(usable.then_some(buf))
    }

    /// Runs one command: `input` into the mailbox, the firmware's output into `output`.
    ///
    /// # Errors
    ///
    /// `EINVAL` for oversized buffers or timeout, `ENXIO` if the firmware dropped the command, `ETIMEDOUT` if the firmware did not finish in
    /// `timeout_ms`, `EIO` if the firmware stopped running, `EINTR` if a signal arrived while
    /// waiting, `ENODEV` if the device went away. The firmware's own error status is not an
    /// error here: it is in the [`Reply`].
    pub(crate) fn run(
        &self,
        mep: &Mep,
        cmd: u32,
        input: &[u8],
        output: &mut [u8],
        timeout_ms: u32,
    ) -> Result<Reply> {
        if input.len() > PAYLOAD || output.len() > PAYLOAD || timeout_ms > MAX_TIMEOUT_MS {
            return Err(EINVAL);
        }
        let timeout_ms = if timeout_ms == 0 {
            DEFAULT_TIMEOUT_MS
        } else {
            timeout_ms
        };

        let _caller = self.enter();
        let _turn = self.turn.take()?;
        let mut mb = self.mailbox.lock();
        if self.turn.is_closed() {
            return Err(ENODEV);
        }
        if mb.stale {
            // The abandoned command owns the mailbox until the firmware finishes it.
            if !mep.firmware_running()? {
                self.firmware_dead.fetch_add(1, Relaxed);
                return Err(EIO);
            }
            let dma = self.dma_path(mep, &mb)?;
            match self.wait_done(mep, i64::from(timeout_ms), dma) {
                Ok(_) => mb.stale = false,
                Err(e) => {
                    if e == ETIMEDOUT {
                        self.timeouts.fetch_add(1, Relaxed);
                    } else if e == EIO {
                        self.firmware_dead.fetch_add(1, Relaxed);
                    }
                    return Err(e);
                }
            }
        }

        let dma = self.dma_path(mep, &mb)?;
        if let Some(buf) = dma {
            io_write!(buf, .status, regs::MrpcState::InProgress as u32);
            io_write!(buf, .rtn_code, 0u32);
            io_write!(buf, .output_size, 0u32);
        }
        mep.with_bar(|bar| -> Result {
            for (i, chunk) in input.chunks(4).enumerate() {
                let mut word = [0u8; 4];
                word[..chunk.len()].copy_from_slice(chunk);
                let loc = regs::MRPC_INPUT::try_at(i).ok_or(EINVAL)?;
                bar.write(
                    loc,
                    regs::MRPC_INPUT::zeroed().with_value(u32::from_le_bytes(word)),
                );
            }
            bar.write_reg(regs::MRPC_CMD::zeroed().with_value(cmd));
            Ok(())
        })??;
        self.commands.fetch_add(1, Relaxed);

        let (status, via_dma) = match self.wait_done(mep, i64::from(timeout_ms), dma) {
            // The firmware dropped the command (e.g. it was reset), as the C driver reports it.
            Ok((s, _)) if regs::MrpcState::of(s) == Some(regs::MrpcState::Interrupted) => {
                return Err(ENXIO)
            }
            Ok(done) => done,
            Err(e) => {
                mb.stale = true;
                if e == ETIMEDOUT {
                    self.timeouts.fetch_add(1, Relaxed);
                } else if e == EIO {
                    self.firmware_dead.fetch_add(1, Relaxed);
                }
                return Err(e);
            }
        };

        // The output is where the completion came from: a firmware that withdrew DMA MRPC
        // while the command ran completed it in the mailbox only, and the buffer still holds
        // an earlier command's output.
        if let Some(buf) = dma.filter(|_| via_dma) {
            // The firmware writes the status last: nothing it guards may be read before it.
            dma_mb(Read);
            for (i, chunk) in output.chunks_mut(4).enumerate() {
                let word: u32 = io_read!(buf, .data[try: i]);
                chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
            }
            self.dma_commands.fetch_add(1, Relaxed);
            return Ok(Reply {
                status,
                ret: io_read!(buf, .rtn_code),
            });
        }
        mep.with_bar(|bar| -> Result<Reply> {
            for (i, chunk) in output.chunks_mut(4).enumerate() {
                let loc = regs::MRPC_OUTPUT::try_at(i).ok_or(EINVAL)?;
                let word: u32 = bar.read(loc).value().into();
                chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
            }
            Ok(Reply {
                status,
                ret: bar.read(regs::MRPC_RET_VALUE).value().into(),
            })
        })?
    }

    /// Waits until the mailbox status leaves "in progress"; returns the status and whether
    /// it came from the DMA MRPC buffer (so the output is there too).
    ///
    /// A signal ends the wait with `EINTR`.
    ///
    /// With DMA MRPC the status is the one the firmware wrote into the buffer, unless the
    /// firmware withdrew DMA MRPC meanwhile (a reset): then it is the mailbox register's.
    fn wait_done(
        &self,
        mep: &Mep,
        timeout_ms: i64,
        dma: Option<&Coherent<DmaOut>>,
    ) -> Result<(u32, bool)> {
        let start = Instant::<Monotonic>::now();
        let mut next_watchdog = WATCHDOG_MS;
        loop {
            let seen = *self.completions.lock();
            // A status the firmware wrote into the buffer (reset to "in progress" before the
            // command) ends the wait without a register read, each a round trip to the device.
            if let Some(buf) = dma {
                let raw = io_read!(buf, .status);
                if regs::MrpcState::of(raw) != Some(regs::MrpcState::InProgress) {
                    return Ok((raw, true));
                }
            }
            let (reg, on) = mep.with_bar(|bar| {
                let status = bar.read(regs::MRPC_STATUS);
                (
                    (u32::from(status.value()), status.state().ok()),
                    bar.read(regs::MRPC_DMA_EN).enabled(),
                )
            })?;
            let ((status, state), via_dma) = match dma {
                Some(buf) if on => {
                    let raw = io_read!(buf, .status);
                    ((raw, regs::MrpcState::of(raw)), true)
                }
                _ => (reg, false),
            };
            if state != Some(regs::MrpcState::InProgress) {
                return Ok((status, via_dma));
            }
            let elapsed = start.elapsed().as_millis();
            if elapsed >= timeout_ms {
                return Err(ETIMEDOUT);
            }
            if elapsed >= next_watchdog {
                next_watchdog += WATCHDOG_MS;
                if !mep.firmware_running()? {
                    return Err(EIO);
                }
            }
            if self.turn.is_closed() {
                return Err(ENODEV);
            }

            let wait = (timeout_ms - elapsed).clamp(1, i64::from(POLL_MS));
            let mut guard = self.completions.lock();
            if *guard == seen {
                // `wait` is at most `POLL_MS`, so the cast is lossless.
                let jiffies = msecs_to_jiffies(wait as u32);
                if let CondVarTimeoutResult::Signal { .. } = self
                    .completed
                    .wait_interruptible_timeout(&mut guard, jiffies)
                {
                    return Err(EINTR);
                }
            }
        }
    }
}

/// Writes the MRPC-completion event header: its interrupt on or off, "occurred" cleared.
fn completion_hdr(mep: &Mep, irq: bool) -> Result {
    mep.with_bar(|bar| -> Result {
        let loc = regs::PART_MRPC_COMP_HDR::try_at(mep.partition).ok_or(EINVAL)?;
        bar.write(
            loc,
            regs::PART_MRPC_COMP_HDR::zeroed()
                .with_occurred(true)
                .with_irq_enable(irq),
        );
        Ok(())
    })?
}

/// Turns DMA MRPC off and clears its address.
fn disarm(bar: &crate::Bar0<'_>) {
    bar.write_reg(regs::MRPC_DMA_EN::zeroed());
    bar.write_reg(regs::MRPC_DMA_ADDR_LO::zeroed());
    bar.write_reg(regs::MRPC_DMA_ADDR_HI::zeroed());
    // Memory writes are posted: the read returns after the firmware took them, so a command
    // it finishes from now on cannot write into a buffer freed after this.
    let _ = bar.read(regs::MRPC_DMA_EN);
}

/// Points the firmware at `buf` and turns DMA MRPC on.
fn arm(mep: &Mep, buf: &Coherent<DmaOut>) -> Result {
    let addr = buf.dma_address();
    mep.with_bar(|bar| {
        bar.write_reg(regs::MRPC_DMA_ADDR_LO::zeroed().with_value(addr as u32));
        bar.write_reg(regs::MRPC_DMA_ADDR_HI::zeroed().with_value((addr >> 32) as u32));
        bar.write_reg(regs::MRPC_DMA_EN::zeroed().with_enabled(true));
    })
}

/// The handler of DMA MRPC's own vector: a completion was written.
pub(crate) struct DmaHandler {
    pub(crate) mep: kernel::sync::Arc<Mep>,
}

impl kernel::irq::Handler for DmaHandler {
    fn handle(&self) -> kernel::irq::IrqReturn {
        self.mep.mrpc.complete();
        kernel::irq::IrqReturn::Handled
    }
}
