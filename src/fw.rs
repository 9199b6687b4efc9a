// SPDX-License-Identifier: GPL-2.0-only

//! The firmware's management protocol (MRPC) as types.
//!
//! Every command the driver sends is a [`Command`]: a `#[repr(C)]` request that knows its
//! opcode and the type of its reply. Requests and replies are declared with [`payload!`],
//! which checks at compile time that a payload has the size the public record gives it
//! (switchtec-user's `inc/switchtec/*.h` and `lib/*.c`, Gen4) and no padding, and makes it
//! [`FromBytes`] and [`AsBytes`]. Replies are copied out of the mailbox with
//! [`FromBytes::from_bytes_copy_prefix`], so no reply is ever read past its end; the files of
//! this folder are the only ones that know a payload's layout.
//!
//! - [`sys`] - ECHO, DIETEMP, GET_PAX_ID.
//! - [`topo`] - TOPO_INFO_DUMP (the physical ports).
//! - [`gfms`] - GFMS_DB_DUMP (the fabric database: hosts, endpoints, functions).
//! - [`bind`] - GFMS_BIND_UNBIND.
//! - [`event`] - GFMS_EVENT.
//! - [`ext`] - pcifab's extensions, present only when [`ext::Features`] says so.
//! - [`p2p`] - P2P_ROUTE, pcifab's route and grant extension.
//! - [`raw`] - what a command sent through the raw pass-through does.

use kernel::{
    new_spinlock,
    prelude::*,
    sync::{
        atomic::{ordering::Relaxed, Atomic},
        SpinLock,
    },
    time::{Instant, Monotonic},
    transmute::{AsBytes, FromBytes},
};

use crate::{mrpc, Mep};

pub(crate) mod bind;
pub(crate) mod event;
pub(crate) mod ext;
pub(crate) mod gfms;
pub(crate) mod p2p;
pub(crate) mod raw;
pub(crate) mod sys;
pub(crate) mod topo;

#[cfg(target_endian = "big")]
compile_error!("firmware payloads are little-endian and read natively");

/// Return codes every PAX command may give (switchtec-user `inc/switchtec/errors.h`).
pub(crate) const ERR_SUBCMD_INVALID: u32 = 0x64004;
pub(crate) const ERR_CMD_INVALID: u32 = 0x64005;
pub(crate) const ERR_PARAM_INVALID: u32 = 0x64006;
pub(crate) const ERR_MRPC_DENIED: u32 = 0x64010;

pub(crate) use crate::payload::{payload, Zeroed};

/// A failed firmware operation: the errno for the caller and, when the firmware refused, its
/// return code.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Failure {
    pub(crate) err: Error,
    pub(crate) fw_ret: u32,
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Self { err, fw_ret: 0 }
    }
}

impl From<kernel::alloc::AllocError> for Failure {
    fn from(_: kernel::alloc::AllocError) -> Self {
        ENOMEM.into()
    }
}

impl From<Failure> for Error {
    fn from(f: Failure) -> Self {
        f.err
    }
}

/// A command: its request is `Self`, its fixed-size reply `Reply`.
pub(crate) trait Command: AsBytes {
    const OPCODE: u32;
    type Reply: FromBytes + Zeroed;

    /// The errno for a firmware refusal of this command.
    fn errno(_ret: u32) -> Error {
        EIO
    }
}

/// Runs `cmd` and copies at most `out.len()` bytes of the reply into `out`.
///
/// A firmware refusal is a [`Failure`] with the firmware's code and `C::errno` of it.
pub(crate) fn call_raw<C: Command>(
    mep: &Mep,
    cmd: &C,
    out: &mut [u8],
    timeout_ms: u32,
) -> Result<(), Failure> {
    let reply = mep
        .mrpc
        .run(mep, C::OPCODE, cmd.as_bytes(), out, timeout_ms)?;
    if reply.status != mrpc::STATUS_DONE {
        return Err(Failure {
            err: C::errno(reply.ret),
            fw_ret: reply.ret,
        });
    }
    Ok(())
}

/// Runs `cmd` and returns its reply.
pub(crate) fn call<C: Command>(mep: &Mep, cmd: &C) -> Result<C::Reply, Failure> {
    call_timeout(mep, cmd, 0)
}

/// Runs `cmd` with a timeout (0: the default) and returns its reply.
pub(crate) fn call_timeout<C: Command>(
    mep: &Mep,
    cmd: &C,
    timeout_ms: u32,
) -> Result<C::Reply, Failure> {
    let mut out = [0u8; mrpc::PAYLOAD];
    let size = core::mem::size_of::<C::Reply>();
    let buf = out.get_mut(..size).ok_or(EINVAL)?;
    call_raw(mep, cmd, buf, timeout_ms)?;
    let (reply, _) = C::Reply::from_bytes_copy_prefix(buf).ok_or(EIO)?;
    Ok(reply)
}

/// Runs a command the driver needs for its own view; a refusal is logged and is `EIO`.
pub(crate) fn query<C: Command>(mep: &Mep, cmd: &C) -> Result<C::Reply> {
    call(mep, cmd).map_err(|f| refused(mep, C::OPCODE, f))
}

/// Logs a refusal of a command the driver sent on its own and returns `EIO` (or the error
/// that was not the firmware's).
pub(crate) fn refused(mep: &Mep, opcode: u32, f: Failure) -> Error {
    if f.fw_ret == 0 {
        return f.err;
    }
    dev_warn!(
        mep.pdev,
        "firmware refused command {:#x}: return {:#x}\n",
        opcode,
        f.fw_ret
    );
    EIO
}

/// Reads a `T` at `at` of `bytes`, or `EIO` if it does not fit.
pub(crate) fn read_at<T: FromBytes>(bytes: &[u8], at: usize) -> Result<T> {
    let tail = bytes.get(at..).ok_or(EIO)?;
    T::from_bytes_copy_prefix(tail).map(|(t, _)| t).ok_or(EIO)
}

/// Messages [`Lies`] logs per [`LIE_INTERVAL_MS`] at most, as `dev_warn_ratelimited` does
/// (the kernel's default burst and interval).
const LIE_BURST: u32 = 10;
const LIE_INTERVAL_MS: i64 = 5_000;

/// The firmware's lies this driver caught: answers that cannot be true (an unknown status, a
/// function that was not asked for, an impossible count, more bytes done than asked). Each is
/// counted and logged as `firmware lie #N: ...`, N the count since probe, at most
/// [`LIE_BURST`] lines per [`LIE_INTERVAL_MS`]; how many went unlogged is said when logging
/// resumes. A reader of the log learns the count from the last N.
#[pin_data]
pub(crate) struct Lies {
    count: Atomic<u64>,
    /// The current interval's start, the lines logged in it, and the lies not logged.
    #[pin]
    window: SpinLock<(Option<Instant<Monotonic>>, u32, u64)>,
}

impl Lies {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            count: Atomic::new(0),
            window <- new_spinlock!((None, 0, 0)),
        })
    }

    /// Counts one lie; returns its number and, if it is to be logged, how many before it were
    /// not.
    fn note(&self) -> (u64, Option<u64>) {
        let n = self.count.fetch_add(1, Relaxed).wrapping_add(1);
        let mut w = self.window.lock();
        let fresh =
            w.0.is_none_or(|start| start.elapsed().as_millis() >= LIE_INTERVAL_MS);
        if fresh {
            w.0 = Some(Instant::<Monotonic>::now());
            w.1 = 0;
        }
        if w.1 >= LIE_BURST {
            w.2 = w.2.wrapping_add(1);
            return (n, None);
        }
        w.1 += 1;
        let skipped = core::mem::take(&mut w.2);
        (n, Some(skipped))
    }
}

/// Counts an unbind request that came after its function left this host (one that raced the
/// function's unbind: normal, not a lie) and logs it at info level, rate-limited as lies are:
/// `stale(mep, format_args!(...))`.
pub(crate) fn stale(mep: &Mep, what: core::fmt::Arguments<'_>) {
    let (n, log) = mep.stale_requests.note();
    if let Some(skipped) = log {
        if skipped != 0 {
            dev_info!(mep.pdev, "{} stale unbind requests not logged\n", skipped);
        }
        dev_info!(mep.pdev, "stale unbind request #{}: {}\n", n, what);
    }
}

/// Counts a firmware lie and logs it, rate-limited ([`Lies`]): `lie(mep, format_args!(...))`.
pub(crate) fn lie(mep: &Mep, what: core::fmt::Arguments<'_>) {
    let (n, log) = mep.lies.note();
    if let Some(skipped) = log {
        if skipped != 0 {
            dev_warn!(mep.pdev, "{} firmware lies not logged\n", skipped);
        }
        dev_warn!(mep.pdev, "firmware lie #{}: {}\n", n, what);
    }
}
