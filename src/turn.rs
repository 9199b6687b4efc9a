// SPDX-License-Identifier: GPL-2.0-only

//! A turn at a device queue that serves one caller at a time, waited for killably.
//!
//! The MRPC mailbox, the MEP's DMA engine and the DMA endpoint's channels each run one
//! command or one copy at a time, and that one may keep them for up to its own timeout (a
//! minute or more). Callers queued behind it on a plain [`Mutex`] would sleep uninterruptibly
//! through it and through every caller ahead of them: not even `SIGKILL` would end the wait.
//!
//! A [`TurnLock`] is a flag under a mutex that is held only to test and set it, and a
//! condition variable. A waiter sleeps interruptibly: any signal ends the wait with `EINTR`
//! (never `ERESTARTSYS`: a restarted call would start a new deadline, so a caller signalled
//! more often than the queue frees up, by a timer or a profiler under `SA_RESTART`, would wait
//! for ever), its own deadline with `ETIMEDOUT`, and the device going away
//! ([`TurnLock::close`]) with `ENODEV`. The [`Turn`] a caller gets gives the turn back, and
//! wakes every waiter, when it is dropped.
//!
//! Unbind closes the lock and then waits for the turn itself ([`TurnLock::close_and_take`]),
//! uninterruptibly: the holder sees [`TurnLock::is_closed`] at its next look at the device and
//! gives the turn back, and no waiter goes ahead of unbind.

use kernel::{
    new_condvar, new_mutex,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        CondVar, CondVarTimeoutResult, Mutex,
    },
    time::{msecs_to_jiffies, Instant, Monotonic},
};

/// One turn at a time, waited for interruptibly; see the module documentation.
#[pin_data]
pub(crate) struct TurnLock {
    /// Whether a [`Turn`] is out. Held only to look at or change the flag, and by waiters
    /// between their look and their sleep, so no wake-up is lost.
    #[pin]
    busy: Mutex<bool>,
    /// Signalled when the turn is given back and when the lock is closed.
    #[pin]
    free: CondVar,
    /// The device is going away: no waiter gets the turn any more (`ENODEV`), and the holder
    /// stops at its next look.
    closed: Atomic<bool>,
}

/// The turn of a [`TurnLock`]; given back, and every waiter woken, on drop.
pub(crate) struct Turn<'a>(&'a TurnLock);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.0.busy.lock() = false;
        // Every waiter: one woken that then takes a signal must not leave the others asleep.
        self.0.free.notify_all();
    }
}

impl TurnLock {
    /// A lock whose turn is free and which is not closed.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            busy <- new_mutex!(false, "pcifab::TurnLock::busy"),
            free <- new_condvar!("pcifab::TurnLock::free"),
            closed: Atomic::new(false),
        })
    }

    /// Waits for the turn with no bound but the caller's signals.
    ///
    /// # Errors
    ///
    /// `EINTR` when a signal arrives first, `ENODEV` once the lock is closed.
    pub(crate) fn take(&self) -> Result<Turn<'_>> {
        self.wait(None)
    }

    /// Waits for the turn no longer than what is left of `timeout_ms` since `start`.
    ///
    /// # Errors
    ///
    /// `EINTR` when a signal arrives first, `ETIMEDOUT` when the deadline passes while the
    /// turn is out, `ENODEV` once the lock is closed.
    pub(crate) fn take_within(
        &self,
        start: Instant<Monotonic>,
        timeout_ms: u32,
    ) -> Result<Turn<'_>> {
        self.wait(Some((start, timeout_ms)))
    }

    fn wait(&self, deadline: Option<(Instant<Monotonic>, u32)>) -> Result<Turn<'_>> {
        let mut busy = self.busy.lock();
        loop {
            // Unbind closed the lock (and may be waiting for the turn): no caller goes
            // ahead of it.
            if self.closed.load(Relaxed) {
                return Err(ENODEV);
            }
            if !*busy {
                break;
            }
            let signalled = match deadline {
                None => self.free.wait_interruptible(&mut busy),
                Some((start, timeout_ms)) => {
                    let left = i64::from(timeout_ms).saturating_sub(start.elapsed().as_millis());
                    let Ok(left @ 1..) = u32::try_from(left) else {
                        return Err(ETIMEDOUT);
                    };
                    matches!(
                        self.free
                            .wait_interruptible_timeout(&mut busy, msecs_to_jiffies(left)),
                        CondVarTimeoutResult::Signal { .. }
                    )
                }
            };
            if signalled {
                return Err(EINTR);
            }
        }
        *busy = true;
        Ok(Turn(self))
    }

    /// Closes the lock: every waiter ends with `ENODEV` now, every later caller at once, and
    /// [`TurnLock::is_closed`] tells the holder to stop.
    pub(crate) fn close(&self) {
        self.closed.store(true, Relaxed);
        // Under the lock a waiter looks at `closed` under, so none goes to sleep after this
        // without seeing it.
        drop(self.busy.lock());
        self.free.notify_all();
    }

    /// Closes the lock and waits, uninterruptibly, for the holder to give the turn back
    /// (unbind, which must not free what the holder uses before it is done).
    pub(crate) fn close_and_take(&self) -> Turn<'_> {
        self.close();
        let mut busy = self.busy.lock();
        while *busy {
            self.free.wait(&mut busy);
        }
        *busy = true;
        Turn(self)
    }

    /// Whether the lock was closed: the holder of the turn stops at its next look.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }
}
