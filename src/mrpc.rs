// SPDX-License-Identifier: GPL-2.0-only

//! The MRPC command engine: the firmware's mailbox.
//!
//! One command is in the mailbox at a time; callers queue on [`Mrpc::mailbox`]. A command's
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

use kernel::{
    io::{register::Array, Io},
    new_condvar, new_mutex, new_spinlock_irq,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        CondVar, CondVarTimeoutResult, Mutex, SpinLockIrq,
    },
    time::{msecs_to_jiffies, Instant, Monotonic},
};

use crate::{regs, Mep};

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
    /// [`regs::MRPC_STATUS_DONE`] or the firmware's error status.
    pub(crate) status: u32,
    /// The firmware's return value.
    pub(crate) ret: u32,
}

/// Mailbox bookkeeping, owned by the caller whose command is in the mailbox.
struct Mailbox {
    /// A previous command was abandoned and may still be running.
    stale: bool,
}

/// Counters of the engine, for sysfs and the events ioctl.
#[derive(Clone, Copy, Default)]
pub(crate) struct Stats {
    pub(crate) commands: u64,
    pub(crate) completions: u64,
    pub(crate) timeouts: u64,
    pub(crate) firmware_dead: u64,
}

/// The MRPC engine of one management endpoint.
#[pin_data]
pub(crate) struct Mrpc {
    /// The device is going away: running and new commands fail with `ENODEV`.
    dead: Atomic<bool>,
    /// Callers queue here; the holder owns the mailbox.
    #[pin]
    mailbox: Mutex<Mailbox>,
    /// Counters, readable without waiting for the mailbox.
    commands: Atomic<u64>,
    timeouts: Atomic<u64>,
    firmware_dead: Atomic<u64>,
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
            dead: Atomic::new(false),
            mailbox <- new_mutex!(Mailbox { stale: false }),
            commands: Atomic::new(0),
            timeouts: Atomic::new(0),
            firmware_dead: Atomic::new(0),
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

    /// Fails the running command and every queued one with `ENODEV`; called on unbind.
    pub(crate) fn kill(&self) {
        self.dead.store(true, Relaxed);
        self.completed.notify_all();
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            commands: self.commands.load(Relaxed),
            completions: *self.completions.lock(),
            timeouts: self.timeouts.load(Relaxed),
            firmware_dead: self.firmware_dead.load(Relaxed),
        }
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

        let mut mb = self.mailbox.lock();
        if self.dead.load(Relaxed) {
            return Err(ENODEV);
        }
        if mb.stale {
            // The abandoned command owns the mailbox until the firmware finishes it.
            if !mep.firmware_running()? {
                self.firmware_dead.fetch_add(1, Relaxed);
                return Err(EIO);
            }
            match self.wait_done(mep, i64::from(timeout_ms)) {
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

        let status = match self.wait_done(mep, i64::from(timeout_ms)) {
            // The firmware dropped the command (e.g. it was reset), as the C driver reports it.
            Ok(regs::MRPC_STATUS_INTERRUPTED) => return Err(ENXIO),
            Ok(status) => status,
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

    /// Waits until the mailbox status leaves "in progress"; returns the status.
    ///
    /// A signal ends the wait with `EINTR`.
    fn wait_done(&self, mep: &Mep, timeout_ms: i64) -> Result<u32> {
        let start = Instant::<Monotonic>::now();
        let mut next_watchdog = WATCHDOG_MS;
        loop {
            let seen = *self.completions.lock();
            let status: u32 = mep.with_bar(|bar| bar.read(regs::MRPC_STATUS).value().into())?;
            if status != regs::MRPC_STATUS_INPROGRESS {
                return Ok(status);
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
            if self.dead.load(Relaxed) {
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
