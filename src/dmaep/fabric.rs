// SPDX-License-Identifier: GPL-2.0-only

//! Fabric mode of the DMA endpoint: the firmware's command path and the buffers this host
//! registered for its peers (`Documentation/design.rst`, "P2P on the DMA endpoint").
//!
//! A command is its input written to the command block (BAR0 0x164000), its number to
//! 0x164800; the firmware writes the output (status, command, return value, output size, up
//! to 1 KiB of reply) into a coherent buffer whose address the control block holds, the
//! status last. [`Fabric::run`] zeroes the status, issues the command and polls the status
//! for [`CMD_TIMEOUT_MS`] (a signal ends the wait for a caller that may be interrupted); every
//! field of the output is device input: the status must be done or error, the command its
//! own, the size at most 1 KiB and exactly what the command's reply is (checked per command
//! with typed payloads), every count and index against the 6 slots. A command that never
//! completes leaves the firmware free to write its output later: no command runs any more
//! (`EIO`) until the endpoint is bound again, and the output buffer is freed only once bus
//! mastering is off ([`Fabric::finish`]).
//!
//! A registration ([`Reg`]) is a user buffer pinned long-term, mapped for the endpoint's
//! device as one range and registered in a free slot of its peer; it belongs to the open
//! file that made it. Its pages are unmapped and unpinned only after the firmware answered
//! the UNREGISTER (done, or refused as not registered): after a timeout, a signal or a reply
//! that does not parse they stay pinned, and the registration stays listed, so that closing
//! the file or unbinding the endpoint tries again. A file closed without an answer leaves
//! it listed as an orphan ([`ORPHAN`]), asked for again at every later REGISTER and close;
//! an endpoint unbound without one turns its bus mastering off, unmaps the buffer and keeps
//! its pages pinned in the registry's limbo ([`Fabric::finish`]), unpinned by the next bind
//! of the endpoint once the firmware's list of the host's buffers is empty
//! ([`Fabric::release_limbo`]). No silence ever lets a page go while the endpoint may
//! write it (`Documentation/design.rst`, "Buffers the firmware does not answer for").

use kernel::{
    device::{Bound, Device},
    dma::Coherent,
    io::{io_read, io_write, Io},
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{ordering::Relaxed, Atomic},
        barrier::{dma_mb, Read},
        Arc,
    },
    time::{Delta, Instant, Monotonic},
    transmute::{AsBytes, FromBytes},
};

use super::{at, DmaBar};
use crate::{
    dmaep_regs::{
        self as r, BufEntry, BufListHead, BufListIn, CmdOut, OwnListHead, OwnListIn, RegisterIn,
        RegisterOut, UnregisterIn, BUFS_PER_PEER, CMD_DATA,
    },
    kext::{dmaep_registry as registry, pci_enable, sleep::usleep_range, user_pages::HeldDma},
};

/// Bound on a fabric command, as Microchip's driver waits.
const CMD_TIMEOUT_MS: i64 = 200;
/// `GET_OWN_BUF_LIST` replies read at most when every own buffer is listed (31 entries fit
/// in one; a host has at most 6 per peer).
const OWN_LIST_PAGES: usize = 8;

/// Owner ids of open files: a registration names the file that made it.
static NEXT_OWNER: Atomic<u64> = Atomic::new(1);

/// The owner of a registration whose file was closed before the firmware answered its
/// UNREGISTER (no file has it: ids start at 1).
const ORPHAN: u64 = 0;

/// Registrations one endpoint holds at most, orphans included: 6 slots for each of the 8
/// peers a PAX's host ports allow. What the firmware leaves unanswered is bounded by it.
const MAX_REGS: usize = 48;

/// A new owner id for an open file.
pub(crate) fn new_owner() -> u64 {
    NEXT_OWNER.fetch_add(1, Relaxed)
}

/// A buffer this host registered for a peer.
pub(super) struct Reg {
    /// The open file it belongs to.
    owner: u64,
    /// The peer's HFID.
    peer: u16,
    slot: u8,
    /// The user pages, mapped for the endpoint's device.
    dma: HeldDma,
}

/// The firmware's answer to a command.
enum Answer {
    /// Done: the reply's size.
    Done(usize),
    /// Refused (status 0xff): the return value.
    Refused(u32),
}

/// Why a registration or an unregistration failed: the error, and the firmware's return
/// value when it refused.
pub(crate) struct FabFail {
    pub(crate) err: Error,
    pub(crate) fw_ret: u32,
}

impl From<Error> for FabFail {
    fn from(err: Error) -> Self {
        FabFail { err, fw_ret: 0 }
    }
}

/// What a copy into a peer's buffer goes through: the owner's bus address of the range,
/// the destination and source DFIDs.
pub(crate) struct PeerRange {
    pub(crate) addr: u64,
    pub(crate) dfid: u16,
    pub(crate) sfid: u16,
}

/// The command path of one endpoint and its registrations.
pub(super) struct Fabric {
    pdev: ARef<kernel::pci::Device>,
    bar: Arc<kernel::pci::DevresBar<{ r::BAR0_SIZE }>>,
    /// The output buffer; the firmware writes it.
    out: Coherent<CmdOut>,
    /// A command never completed: none runs any more.
    hung: bool,
    /// A command whose wait a signal ended, and when it was issued: the next command first
    /// waits out its bound.
    pending: Option<Instant<Monotonic>>,
    /// This host's HFID.
    pub(super) hfid: u16,
    regs: KVec<Reg>,
}

/// Reads a reply of exactly `T`'s size.
fn exact<T: FromBytes>(reply: &[u8], size: usize) -> Result<T> {
    if size != core::mem::size_of::<T>() {
        return Err(EIO);
    }
    T::from_bytes_copy(reply.get(..size).ok_or(EIO)?).ok_or(EIO)
}

impl Fabric {
    /// The command path of the endpoint whose BAR0 is `bar`, with an output buffer for
    /// `dev`; reads this host's HFID.
    pub(super) fn new(
        pdev: &kernel::pci::Device,
        dev: &Device<Bound>,
        bar: Arc<kernel::pci::DevresBar<{ r::BAR0_SIZE }>>,
    ) -> Result<Self> {
        let out = Coherent::<CmdOut>::zeroed(dev, GFP_KERNEL)?;
        let mut this = Self {
            pdev: pdev.into(),
            bar,
            out,
            hung: false,
            pending: None,
            hfid: 0,
            regs: KVec::new(),
        };
        let raw = this.with_bar(|b| b.read(r::FAB_LOCAL_HFID).into_raw())?;
        if raw == u32::MAX {
            return Err(ENODEV);
        }
        this.hfid = this.with_bar(|b| b.read(r::FAB_LOCAL_HFID).hfid().into())?;
        // Events are not used: the driver asks the firmware when it needs a list.
        this.with_bar(|b| b.write(r::FAB_EVENT_ENABLE, r::FAB_EVENT_ENABLE::zeroed()))?;
        Ok(this)
    }

    fn with_bar<R>(&self, f: impl for<'a> FnOnce(&DmaBar<'a>) -> R) -> Result<R> {
        self.bar.try_access_with(f).ok_or(ENODEV)
    }

    /// Runs command `cmd` with `input`, its reply into `reply`. `killable`: a signal ends
    /// the wait (`EINTR`; the command may still complete, and the next one waits out its
    /// bound first).
    fn run(
        &mut self,
        cmd: u32,
        input: &[u8],
        reply: &mut [u8; CMD_DATA],
        killable: bool,
    ) -> Result<Answer> {
        if input.len() > CMD_DATA {
            return Err(EINVAL);
        }
        self.ready(killable)?;
        let out = &self.out;
        io_write!(out, .status, 0u32);
        io_write!(out, .cmd, 0u32);
        io_write!(out, .ret, 0u32);
        io_write!(out, .size, 0u32);
        let addr = out.dma_address();
        self.with_bar(|bar| -> Result {
            bar.write(
                r::FAB_CMD_ADDR_LO,
                r::FAB_CMD_ADDR_LO::zeroed().with_value(addr as u32),
            );
            bar.write(
                r::FAB_CMD_ADDR_HI,
                r::FAB_CMD_ADDR_HI::zeroed().with_value((addr >> 32) as u32),
            );
            for (i, chunk) in input.chunks(4).enumerate() {
                let mut word = [0u8; 4];
                word[..chunk.len()].copy_from_slice(chunk);
                // Checked at run time: whether the compiler proves `i` in range (as
                // `write` needs, else the module fails to link on `rust_build_error`)
                // depends on its version; Debian's DKMS build did not.
                bar.try_write(
                    at::<r::FAB_CMD_INPUT>(i)?,
                    r::FAB_CMD_INPUT::zeroed().with_value(u32::from_le_bytes(word)),
                )?;
            }
            // The MMIO write is ordered after the status's write to coherent memory.
            bar.write(r::FAB_CMD, r::FAB_CMD::zeroed().with_value(cmd));
            // Posted: read back, so the command has reached the endpoint before its bound
            // starts.
            let _ = bar.read(r::FAB_LOCAL_HFID);
            Ok(())
        })??;
        let status = match self.wait_status(Instant::<Monotonic>::now(), killable) {
            Ok(s) => s,
            Err(e) => {
                if e == ETIMEDOUT {
                    dev_warn!(
                        self.pdev,
                        "DMA endpoint: fabric command {} did not complete in {} ms; no more \
                         commands\n",
                        cmd,
                        CMD_TIMEOUT_MS
                    );
                }
                return Err(e);
            }
        };
        // The firmware writes the status last: the fields it guards are read after it.
        dma_mb(Read);
        let (done_cmd, ret, size): (u32, u32, u32) = (
            io_read!(self.out, .cmd),
            io_read!(self.out, .ret),
            io_read!(self.out, .size),
        );
        match status {
            r::CMD_STATUS_DONE => {}
            // A refusal counts only as the refusal of this command: what a refused
            // UNREGISTER releases, another command's answer must not.
            r::CMD_STATUS_ERROR if done_cmd == cmd => return Ok(Answer::Refused(ret)),
            _ => {
                dev_warn!(
                    self.pdev,
                    "DMA endpoint: fabric command {} ended with status {:#x}\n",
                    cmd,
                    status
                );
                return Err(EIO);
            }
        }
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if done_cmd != cmd || size > CMD_DATA {
            dev_warn!(
                self.pdev,
                "DMA endpoint: fabric command {} answered as command {} with {} bytes\n",
                cmd,
                done_cmd,
                size
            );
            return Err(EIO);
        }
        for (i, chunk) in reply.chunks_mut(4).enumerate().take(size.div_ceil(4)) {
            let word: u32 = io_read!(self.out, .data[try: i]);
            chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
        }
        Ok(Answer::Done(size))
    }

    /// Whether a command may be issued now: `EIO` once the path is closed; a command whose
    /// wait a signal ended is waited out first (its errors then, and nothing issued).
    fn ready(&mut self, killable: bool) -> Result {
        if self.hung {
            return Err(EIO);
        }
        if let Some(since) = self.pending.take() {
            self.wait_status(since, killable)?;
        }
        Ok(())
    }

    /// Waits for the status of the command issued at `since` (polled, bounded by
    /// [`CMD_TIMEOUT_MS`] from then). A command that does not complete closes the path
    /// (`ETIMEDOUT`, `EIO` after); a signal, for a `killable` caller, ends the wait with
    /// `EINTR` and leaves the command pending.
    fn wait_status(&mut self, since: Instant<Monotonic>, killable: bool) -> Result<u32> {
        loop {
            let s: u32 = io_read!(self.out, .status);
            if s != 0 {
                return Ok(s);
            }
            if since.elapsed().as_millis() >= CMD_TIMEOUT_MS {
                self.hung = true;
                return Err(ETIMEDOUT);
            }
            if killable && kernel::current!().signal_pending() {
                self.pending = Some(since);
                return Err(EINTR);
            }
            usleep_range(Delta::from_micros(50), Delta::from_micros(50));
        }
    }

    /// The buffers this host registered, as (peer HFID, slot), every reply checked.
    fn own_buffers(&mut self, killable: bool) -> Result<KVec<(u16, u8)>> {
        let mut all = KVec::new();
        let mut reply = [0u8; CMD_DATA];
        for _ in 0..OWN_LIST_PAGES {
            let start = u16::try_from(all.len()).map_err(|_| EIO)?;
            let input = OwnListIn { start, rsvd: 0 };
            let size = match self.run(
                r::CMD_GET_OWN_BUF_LIST,
                input.as_bytes(),
                &mut reply,
                killable,
            )? {
                Answer::Done(size) => size,
                Answer::Refused(_) => return Err(EIO),
            };
            let head_len = core::mem::size_of::<OwnListHead>();
            let head =
                OwnListHead::from_bytes_copy(reply.get(..head_len).ok_or(EIO)?).ok_or(EIO)?;
            let n = usize::from(head.count);
            if head.start != start
                || usize::from(head.total) < usize::from(start) + n
                || size != head_len + n * core::mem::size_of::<BufEntry>()
            {
                return Err(EIO);
            }
            for k in 0..n {
                let at = head_len + k * core::mem::size_of::<BufEntry>();
                let e = BufEntry::from_bytes_copy(
                    reply
                        .get(at..at + core::mem::size_of::<BufEntry>())
                        .ok_or(EIO)?,
                )
                .ok_or(EIO)?;
                if e.index >= BUFS_PER_PEER {
                    return Err(EIO);
                }
                all.push((e.hfid, e.index), GFP_KERNEL)?;
            }
            if all.len() >= usize::from(head.total) {
                return Ok(all);
            }
            if n == 0 {
                return Err(EIO);
            }
        }
        Err(EIO)
    }

    /// Unregisters every buffer the firmware lists as this host's: at probe, none of them
    /// is pcifab's any more (a previous load's pages are no longer pinned).
    pub(super) fn purge(&mut self) -> Result {
        let own = self.own_buffers(false)?;
        for (peer, slot) in own {
            dev_info!(
                self.pdev,
                "DMA endpoint: unregistering buffer {} for HFID {:#06x} left by an earlier load\n",
                slot,
                peer
            );
            self.unregister_fw(peer, slot, false)?;
        }
        Ok(())
    }

    /// UNREGISTER of (peer, slot): `Ok(true)` done, `Ok(false)` refused (not registered).
    fn unregister_fw(&mut self, peer: u16, slot: u8, killable: bool) -> Result<bool> {
        let input = UnregisterIn {
            peer,
            index: slot,
            rsvd: 0,
        };
        let mut reply = [0u8; CMD_DATA];
        match self.run(
            r::CMD_UNREGISTER_BUF,
            input.as_bytes(),
            &mut reply,
            killable,
        )? {
            Answer::Done(0) => Ok(true),
            Answer::Done(_) => Err(EIO),
            Answer::Refused(_) => Ok(false),
        }
    }

    /// Registers `dma` (one range for the endpoint's device) for `peer` in its lowest free
    /// slot, for the file `owner`; returns the slot. On an answer that says nothing
    /// reliable (timeout, signal, a reply that does not parse) the buffer stays listed, for
    /// the file's close or the endpoint's unbind to unregister.
    pub(super) fn register(
        &mut self,
        owner: u64,
        peer: u16,
        dma: HeldDma,
        dev: &Device<Bound>,
    ) -> Result<u8, FabFail> {
        // Orphans first: the slots of those the firmware answers for now come back.
        self.reap(dev);
        let mut segs = dma.segments();
        let (addr, size) = match (segs.next(), segs.next()) {
            (Some(one), None) => one,
            _ => {
                drop(segs);
                dma.release(dev);
                return Err(EINVAL.into());
            }
        };
        drop(segs);
        let free =
            (0..BUFS_PER_PEER).find(|s| !self.regs.iter().any(|g| g.peer == peer && g.slot == *s));
        let Some(slot) = free else {
            dma.release(dev);
            return Err(ENOSPC.into());
        };
        if self.regs.len() >= MAX_REGS {
            dma.release(dev);
            return Err(ENOSPC.into());
        }
        // Nothing issued (the path is closed, or the wait for an earlier command failed):
        // nothing can be registered, so the pages go at once.
        if let Err(e) = self.ready(true) {
            dma.release(dev);
            return Err(e.into());
        }
        if self.regs.reserve(1, GFP_KERNEL).is_err() {
            dma.release(dev);
            return Err(ENOMEM.into());
        }
        let input = RegisterIn {
            peer,
            index: slot,
            rsvd: 0,
            addr_lo: addr as u32,
            addr_hi: (addr >> 32) as u32,
            size_lo: size as u32,
            size_hi: (size >> 32) as u32,
        };
        let mut reply = [0u8; CMD_DATA];
        let answer = self.run(r::CMD_REGISTER_BUF, input.as_bytes(), &mut reply, true);
        let checked = match answer {
            Ok(Answer::Refused(ret)) => {
                dma.release(dev);
                return Err(FabFail {
                    err: EIO,
                    fw_ret: ret,
                });
            }
            Ok(Answer::Done(n)) => exact::<RegisterOut>(&reply, n).and_then(|o| {
                if o.index == slot {
                    Ok(())
                } else {
                    Err(EIO)
                }
            }),
            Err(e) => Err(e),
        };
        // Registered, or perhaps registered: the firmware may let the peer write into it.
        let reg = Reg {
            owner,
            peer,
            slot,
            dma,
        };
        if let Err(e) = self.regs.push_within_capacity(reg) {
            // Reserved above: cannot happen; kept pinned for good rather than released.
            core::mem::forget(e);
            return Err(ENOMEM.into());
        }
        match checked {
            Ok(()) => Ok(slot),
            Err(e) => Err(e.into()),
        }
    }

    /// Unregisters `owner`'s buffer in `slot` of `peer`; its pages go once the firmware
    /// answered.
    pub(super) fn unregister(
        &mut self,
        owner: u64,
        peer: u16,
        slot: u8,
        dev: &Device<Bound>,
    ) -> Result<(), FabFail> {
        let i = self
            .regs
            .iter()
            .position(|g| g.owner == owner && g.peer == peer && g.slot == slot)
            .ok_or(ENOENT)?;
        self.drop_reg(i, dev, true)
    }

    /// Unregisters entry `i` and releases its pages once the firmware answered.
    fn drop_reg(&mut self, i: usize, dev: &Device<Bound>, killable: bool) -> Result<(), FabFail> {
        let (peer, slot) = match self.regs.get(i) {
            Some(g) => (g.peer, g.slot),
            None => return Err(ENOENT.into()),
        };
        let done = self.unregister_fw(peer, slot, killable)?;
        let reg = self.regs.remove(i).map_err(|_| ENOENT)?;
        reg.dma.release(dev);
        if done {
            Ok(())
        } else {
            // Not registered, says the firmware (the peer went away): released all the same.
            Err(ENOENT.into())
        }
    }

    /// Unregisters every buffer of `owner` (its file is closed) and every orphan, or every
    /// buffer with `None` (the endpoint unbinds). Waits are not interrupted: a closing or
    /// unbinding task must not leave them registered. A buffer the firmware does not answer
    /// for stays listed, mapped and pinned: an orphan when its file is closed, for
    /// [`Fabric::finish`] when the endpoint unbinds.
    pub(super) fn release_owner(&mut self, owner: Option<u64>, dev: &Device<Bound>) {
        let mut i = 0;
        while i < self.regs.len() {
            let mine = owner.is_none_or(|o| {
                self.regs
                    .get(i)
                    .is_some_and(|g| g.owner == o || g.owner == ORPHAN)
            });
            if !mine {
                i += 1;
                continue;
            }
            match self.drop_reg(i, dev, false) {
                // Gone from the list (released).
                Ok(()) => {}
                Err(f) if f.err == ENOENT => {}
                Err(_) => {
                    if let Some(g) = self.regs.get_mut(i) {
                        if owner.is_some() && g.owner != ORPHAN {
                            dev_warn!(
                                self.pdev,
                                "DMA endpoint: buffer {} for HFID {:#06x} not unregistered at \
                                 close; kept pinned, asked again later\n",
                                g.slot,
                                g.peer
                            );
                            g.owner = ORPHAN;
                        }
                    }
                    i += 1;
                }
            }
        }
    }

    /// Asks the firmware again to unregister the orphans; each one it answers for (done, or
    /// not registered) is unmapped and unpinned.
    fn reap(&mut self, dev: &Device<Bound>) {
        let mut i = 0;
        while i < self.regs.len() {
            if self.regs.get(i).is_some_and(|g| g.owner == ORPHAN) {
                match self.drop_reg(i, dev, false) {
                    Ok(()) => continue,
                    Err(f) if f.err == ENOENT => continue,
                    Err(_) => {}
                }
            }
            i += 1;
        }
    }

    /// Ends the command path at unbind, after [`Fabric::release_owner`]. What the firmware
    /// may still write (its output, after a command it never answered; the buffers whose
    /// UNREGISTER it did not answer, through which a peer may write) is let go only once the
    /// endpoint can no longer master the bus: the output address cleared, bus mastering
    /// turned off and read back off. Then the output buffer is freed and those buffers are
    /// unmapped, their pages kept pinned in the registry's limbo until a later bind finds
    /// the firmware's list of the host's buffers empty ([`Fabric::release_limbo`]). If
    /// mastering does not read back off, all of it is kept for good.
    pub(super) fn finish(mut self, dev: Option<&Device<Bound>>) {
        if self.regs.is_empty() && !self.hung() {
            return;
        }
        let _ = self.with_bar(|b| {
            b.write(r::FAB_CMD_ADDR_LO, r::FAB_CMD_ADDR_LO::zeroed());
            b.write(r::FAB_CMD_ADDR_HI, r::FAB_CMD_ADDR_HI::zeroed());
            // Posted: read back before mastering goes off.
            let _ = b.read(r::FAB_LOCAL_HFID);
        });
        let dev = match dev {
            Some(d) if pci_enable::stop_mastering(&self.pdev) => d,
            _ => {
                dev_err!(
                    self.pdev,
                    "DMA endpoint: bus mastering does not turn off; the command output and {} \
                     buffers the firmware did not answer for kept for good\n",
                    self.regs.len()
                );
                core::mem::forget(self);
                return;
            }
        };
        for reg in core::mem::take(&mut self.regs) {
            dev_warn!(
                self.pdev,
                "DMA endpoint: buffer {} for HFID {:#06x} ({} bytes) not unregistered: unmapped \
                 with bus mastering off, pinned until the endpoint is bound again\n",
                reg.slot,
                reg.peer,
                reg.dma.bytes()
            );
            // Unmapped for the device it was mapped for (else kept for good). Pages that
            // find no room in the limbo stay pinned for good too: the next bind turns bus
            // mastering on before it can ask the firmware, and a peer may still write them.
            if let Some(pages) = reg.dma.unmap(dev) {
                let mut parked = Some(registry::Parked {
                    dev: dev.into(),
                    pages,
                });
                let _ = registry::with_limbo(|l| {
                    if l.reserve(1, GFP_KERNEL).is_ok() {
                        if let Some(p) = parked.take() {
                            // Room was reserved: cannot fail (and gives them back if it did).
                            if let Err(e) = l.push_within_capacity(p) {
                                parked = Some(e.0);
                            }
                        }
                    }
                });
                if let Some(p) = parked {
                    dev_err!(
                        self.pdev,
                        "DMA endpoint: no memory to park buffer {}'s pages: kept pinned for good\n",
                        reg.slot
                    );
                    core::mem::forget(p);
                }
            }
        }
        // Dropped: the output buffer is freed, which the endpoint can no longer write.
    }

    /// Unpins the pages of the buffers an earlier binding of `dev` left in the limbo, once
    /// the firmware lists none of this host's buffers. Called after [`Fabric::purge`]; the list
    /// is asked for again (only when the limbo holds one of `dev`'s), so that a late answer
    /// to a command of the earlier binding cannot pass for it. `EIO` when the list is not
    /// empty or does not parse: the buffers stay, and the caller offers no fabric mode on
    /// this binding (so the limbo never holds more than one binding's registrations).
    pub(super) fn release_limbo(&mut self, dev: &Device<Bound>) -> Result {
        let waiting = registry::with_limbo(|l| l.iter().any(|p| p.is_for(dev)))?;
        if !waiting {
            return Ok(());
        }
        if !self.own_buffers(false)?.is_empty() {
            return Err(EIO);
        }
        let (n, bytes) = registry::with_limbo(|l| {
            let (mut n, mut bytes) = (0usize, 0usize);
            let mut i = 0;
            while i < l.len() {
                if !l.get(i).is_some_and(|p| p.is_for(dev)) {
                    i += 1;
                    continue;
                }
                match l.remove(i) {
                    // Dropped: unpinned.
                    Ok(p) => {
                        n += 1;
                        bytes = bytes.saturating_add(p.pages.bytes());
                    }
                    Err(_) => i += 1,
                }
            }
            // The list is a static that module exit never drops: its buffer goes with its
            // last entry.
            if l.is_empty() {
                *l = KVec::new();
            }
            (n, bytes)
        })?;
        dev_info!(
            self.pdev,
            "DMA endpoint: {} buffers ({} bytes) an earlier binding kept pinned are no longer \
             registered: unpinned\n",
            n,
            bytes
        );
        Ok(())
    }

    /// Whether the file `owner` has a buffer registered.
    pub(super) fn owns(&self, owner: u64) -> bool {
        self.regs.iter().any(|g| g.owner == owner)
    }

    /// Whether a command may have been left running (its output may still be written).
    pub(super) fn hung(&self) -> bool {
        self.hung || self.pending.is_some()
    }

    /// The range of `peer`'s buffer in `slot` a copy of `len` bytes at `off` goes to, as
    /// the firmware lists it now: `ENOENT` when the peer registered none there for this
    /// host, `EFAULT` when the copy does not lie inside it.
    pub(super) fn peer_range(
        &mut self,
        peer: u16,
        slot: u8,
        off: u64,
        len: u64,
    ) -> Result<PeerRange> {
        if slot >= BUFS_PER_PEER {
            return Err(EINVAL);
        }
        let input = BufListIn {
            owner: peer,
            rsvd: 0,
        };
        let mut reply = [0u8; CMD_DATA];
        let size = match self.run(r::CMD_GET_BUF_LIST, input.as_bytes(), &mut reply, true)? {
            Answer::Done(size) => size,
            // No such peer host.
            Answer::Refused(_) => return Err(ENOENT),
        };
        let head_len = core::mem::size_of::<BufListHead>();
        let entry_len = core::mem::size_of::<BufEntry>();
        let head = BufListHead::from_bytes_copy(reply.get(..head_len).ok_or(EIO)?).ok_or(EIO)?;
        let n = usize::from(head.count);
        if n > usize::from(BUFS_PER_PEER) || size != head_len + n * entry_len {
            dev_warn!(
                self.pdev,
                "DMA endpoint: buffer list of HFID {:#06x}: {} entries in {} bytes\n",
                peer,
                n,
                size
            );
            return Err(EIO);
        }
        let mut found = None;
        for k in 0..n {
            let at = head_len + k * entry_len;
            let e =
                BufEntry::from_bytes_copy(reply.get(at..at + entry_len).ok_or(EIO)?).ok_or(EIO)?;
            if e.hfid != peer || e.index >= BUFS_PER_PEER {
                return Err(EIO);
            }
            if e.index == slot {
                if found.is_some() {
                    return Err(EIO);
                }
                found = Some(e);
            }
        }
        let e = found.ok_or(ENOENT)?;
        let base = u64::from(e.addr_lo) | u64::from(e.addr_hi) << 32;
        let bsize = u64::from(e.size_lo) | u64::from(e.size_hi) << 32;
        let end = off.checked_add(len).ok_or(EFAULT)?;
        if len == 0 || end > bsize {
            return Err(EFAULT);
        }
        let addr = base.checked_add(off).ok_or(EIO)?;
        addr.checked_add(len).ok_or(EIO)?;
        Ok(PeerRange {
            addr,
            dfid: e.remote_dfid,
            sfid: e.local_dfid,
        })
    }
}
