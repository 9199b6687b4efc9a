// SPDX-License-Identifier: GPL-2.0-only
//! vfio-user server (protocol version 0.x) for one MEP on one UNIX socket.
//!
//! Every message starts with a 16-byte header {u16 id, u16 command, u32 size
//! including the header, u32 flags, u32 error}; all fields little-endian.
//! File descriptors (eventfds, DMA memory) arrive as SCM_RIGHTS with the
//! first bytes of their message.

use crate::dma::DmaTable;
use crate::irq::{self, Irqs};
use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

/// Number of vfio_pci regions every device reports (BAR0-5, ROM, config, VGA).
pub const NUM_REGIONS: u32 = 9;

/// What the vfio-user server needs from a device model (the MEP, an
/// endpoint function).
pub trait Device: Send + Sync {
    fn name(&self) -> &str;
    /// Size of region `index`; 0 when the device does not have it.
    fn region_size(&self, index: u32) -> u64;
    /// A descriptor and file offset the client may mmap the whole region
    /// from, for regions served with the MMAP flag.
    fn region_mmap(&self, _index: u32) -> Option<(OwnedFd, u64)> {
        None
    }
    fn region_read(&self, region: u32, off: u64, buf: &mut [u8]) -> Result<(), String>;
    fn region_write(&self, region: u32, off: u64, data: &[u8]) -> Result<(), String>;
    fn reset(&self);
    fn irqs(&self, f: &mut dyn FnMut(&mut Irqs));
    fn dma(&self, f: &mut dyn FnMut(&mut DmaTable));
    /// Vectors of IRQ index `index` (the MEP's counts unless the device says otherwise).
    fn irq_count(&self, index: usize) -> u32 {
        irq::COUNTS.get(index).copied().unwrap_or(0)
    }
    fn set_connected(&self, on: bool);
    /// The client went away: drop its eventfds and DMA mappings.
    fn disconnect(&self);
}

pub const HDR_SIZE: usize = 16;

pub const CMD_VERSION: u16 = 1;
pub const CMD_DMA_MAP: u16 = 2;
pub const CMD_DMA_UNMAP: u16 = 3;
pub const CMD_DEVICE_GET_INFO: u16 = 4;
pub const CMD_DEVICE_GET_REGION_INFO: u16 = 5;
pub const CMD_DEVICE_GET_IRQ_INFO: u16 = 7;
pub const CMD_DEVICE_SET_IRQS: u16 = 8;
pub const CMD_REGION_READ: u16 = 9;
pub const CMD_REGION_WRITE: u16 = 10;
pub const CMD_DEVICE_RESET: u16 = 13;

pub const FLAG_TYPE_MASK: u32 = 0xf;
pub const FLAG_COMMAND: u32 = 0;
pub const FLAG_REPLY: u32 = 1;
pub const FLAG_NO_REPLY: u32 = 1 << 4;
pub const FLAG_ERROR: u32 = 1 << 5;

pub const MAX_MSG_FDS: usize = 8;
pub const MAX_DATA_XFER: usize = 1 << 20;
/// Largest message accepted: a full data transfer plus its fixed fields.
const MAX_MSG_SIZE: usize = MAX_DATA_XFER + 4096;

// Protocol version: we implement 0.1 and answer with the lower of that and
// the client's minor (QEMU 10/11 speaks 0.0 and rejects a higher minor).
const VERSION_MAJOR: u16 = 0;
const VERSION_MINOR: u16 = 1;

// struct vfio_device_info / vfio_region_info / vfio_irq_info / vfio_irq_set.
const DEVICE_FLAGS_RESET: u32 = 1 << 0;
const DEVICE_FLAGS_PCI: u32 = 1 << 1;
const REGION_FLAG_READ: u32 = 1 << 0;
const REGION_FLAG_WRITE: u32 = 1 << 1;
const REGION_FLAG_MMAP: u32 = 1 << 2;
const IRQ_INFO_EVENTFD: u32 = 1 << 0;
const IRQ_INFO_MASKABLE: u32 = 1 << 1;
const IRQ_INFO_AUTOMASKED: u32 = 1 << 2;
const IRQ_INFO_NORESIZE: u32 = 1 << 3;
const IRQ_SET_DATA_NONE: u32 = 1 << 0;
const IRQ_SET_DATA_BOOL: u32 = 1 << 1;
const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const IRQ_SET_ACTION_MASK: u32 = 1 << 3;
const IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
const DMA_UNMAP_FLAG_GET_DIRTY_BITMAP: u32 = 1 << 0;
const DMA_UNMAP_FLAG_ALL: u32 = 1 << 1;

#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub id: u16,
    pub cmd: u16,
    pub size: u32,
    pub flags: u32,
    pub error: u32,
}

impl Header {
    pub fn parse(b: &[u8; HDR_SIZE]) -> Header {
        Header {
            id: u16::from_le_bytes([b[0], b[1]]),
            cmd: u16::from_le_bytes([b[2], b[3]]),
            size: le32(b, 4),
            flags: le32(b, 8),
            error: le32(b, 12),
        }
    }

    pub fn encode(&self) -> [u8; HDR_SIZE] {
        let mut b = [0u8; HDR_SIZE];
        b[0..2].copy_from_slice(&self.id.to_le_bytes());
        b[2..4].copy_from_slice(&self.cmd.to_le_bytes());
        b[4..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.error.to_le_bytes());
        b
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// Receive into `buf` with recvmsg, collecting SCM_RIGHTS descriptors.
/// Returns the byte count (0 at end of stream).
pub fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    const CMSG_FDS: usize = 16;
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut cbuf = [0u64; 64];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let cspace = unsafe { libc::CMSG_SPACE((CMSG_FDS * size_of::<libc::c_int>()) as u32) } as usize;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is a valid "empty" value; fields set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = cspace.min(size_of_val(&cbuf)) as _;
    let n = loop {
        // SAFETY: msg points at live buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: walking the control messages the kernel filled in, within
    // msg_controllen, with the libc CMSG helpers.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / size_of::<libc::c_int>() {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("file descriptors were truncated"));
    }
    Ok(n)
}

/// A received message: header, payload after the header, descriptors.
pub type Message = (Header, Vec<u8>, Vec<OwnedFd>);

/// Read one whole message. Ok(None) at a clean end of stream.
pub fn read_message(sock: &mut UnixStream) -> io::Result<Option<Message>> {
    let mut hdr = [0u8; HDR_SIZE];
    let mut fds = Vec::new();
    let mut got = 0;
    while got < HDR_SIZE {
        let n = recv_with_fds(sock, &mut hdr[got..], &mut fds)?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short header"));
        }
        got += n;
    }
    let h = Header::parse(&hdr);
    let size = h.size as usize;
    if !(HDR_SIZE..=MAX_MSG_SIZE).contains(&size) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message size {size} outside {HDR_SIZE}..={MAX_MSG_SIZE}"),
        ));
    }
    let mut body = vec![0u8; size - HDR_SIZE];
    sock.read_exact(&mut body)?;
    Ok(Some((h, body, fds)))
}

type Reply = Result<Vec<u8>, (i32, String)>;

fn einval(msg: String) -> (i32, String) {
    (libc::EINVAL, msg)
}

fn need(body: &[u8], len: usize, what: &str) -> Result<(), (i32, String)> {
    if body.len() < len {
        return Err(einval(format!(
            "{what} payload is {} bytes, needs {len}",
            body.len()
        )));
    }
    Ok(())
}

/// Send `data` with one descriptor as SCM_RIGHTS.
fn send_with_fd(sock: &UnixStream, data: &[u8], fd: &OwnedFd) -> io::Result<()> {
    let mut cbuf = [0u64; 8];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let cspace = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: zeroed msghdr is a valid "empty" value; fields set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = cspace as _;
    // SAFETY: the control buffer is large enough for one descriptor and
    // aligned for cmsghdr; CMSG_FIRSTHDR points into it.
    let n = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, fd.as_raw_fd());
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n < data.len() {
        (&*sock).write_all(&data[n..])?;
    }
    Ok(())
}

/// Accept clients one after another for as long as the process lives.
pub fn serve<D: Device + ?Sized>(listener: UnixListener, dev: Arc<D>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                dev.set_connected(true);
                info!("{}: client connected", dev.name());
                let result = Connection {
                    dev: &*dev,
                    reply_fd: RefCell::new(None),
                }
                .run(stream);
                dev.disconnect();
                match result {
                    Ok(()) => info!("{}: client disconnected", dev.name()),
                    Err(e) => note!("{}: client disconnected: {e}", dev.name()),
                }
            }
            Err(e) => {
                error!("{}: accept failed: {e}", dev.name());
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}

struct Connection<'a, D: Device + ?Sized> {
    dev: &'a D,
    /// A descriptor to send with the next reply (region info of an
    /// mmap-able region).
    reply_fd: RefCell<Option<OwnedFd>>,
}

impl<D: Device + ?Sized> Connection<'_, D> {
    fn run(&self, mut sock: UnixStream) -> io::Result<()> {
        while let Some((h, body, fds)) = read_message(&mut sock)? {
            if h.flags & FLAG_TYPE_MASK != FLAG_COMMAND {
                error!(
                    "{}: ignoring message id {} cmd {} of type {} (expected a command)",
                    self.dev.name(),
                    h.id,
                    h.cmd,
                    h.flags & FLAG_TYPE_MASK
                );
                continue;
            }
            let reply = self.dispatch(&h, &body, fds);
            if let Err((errno, why)) = &reply {
                error!(
                    "{}: command {} (id {}) failed: {why} (errno {errno})",
                    self.dev.name(),
                    h.cmd,
                    h.id
                );
            }
            if h.flags & FLAG_NO_REPLY != 0 {
                continue;
            }
            let (flags, error, payload) = match reply {
                Ok(p) => (FLAG_REPLY, 0, p),
                Err((errno, _)) => (FLAG_REPLY | FLAG_ERROR, errno as u32, Vec::new()),
            };
            let rh = Header {
                id: h.id,
                cmd: h.cmd,
                size: (HDR_SIZE + payload.len()) as u32,
                flags,
                error,
            };
            let mut out = Vec::with_capacity(HDR_SIZE + payload.len());
            out.extend_from_slice(&rh.encode());
            out.extend_from_slice(&payload);
            match self.reply_fd.borrow_mut().take() {
                Some(fd) if error == 0 => send_with_fd(&sock, &out, &fd)?,
                _ => sock.write_all(&out)?,
            }
        }
        Ok(())
    }

    fn dispatch(&self, h: &Header, body: &[u8], fds: Vec<OwnedFd>) -> Reply {
        if !fds.is_empty() && !matches!(h.cmd, CMD_DMA_MAP | CMD_DEVICE_SET_IRQS) {
            return Err(einval(format!(
                "command {} does not take file descriptors ({} sent)",
                h.cmd,
                fds.len()
            )));
        }
        match h.cmd {
            CMD_VERSION => self.version(body),
            CMD_DMA_MAP => self.dma_map(body, fds),
            CMD_DMA_UNMAP => self.dma_unmap(body),
            CMD_DEVICE_GET_INFO => self.device_info(body),
            CMD_DEVICE_GET_REGION_INFO => self.region_info(body),
            CMD_DEVICE_GET_IRQ_INFO => self.irq_info(body),
            CMD_DEVICE_SET_IRQS => self.set_irqs(body, fds),
            CMD_REGION_READ => self.region_read(body),
            CMD_REGION_WRITE => self.region_write(body),
            CMD_DEVICE_RESET => {
                self.dev.reset();
                Ok(Vec::new())
            }
            other => Err((libc::ENOSYS, format!("command {other} is not implemented"))),
        }
    }

    fn version(&self, body: &[u8]) -> Reply {
        need(body, 4, "VERSION")?;
        let major = u16::from_le_bytes([body[0], body[1]]);
        let minor = u16::from_le_bytes([body[2], body[3]]);
        if major != VERSION_MAJOR {
            return Err((
                libc::ENOTSUP,
                format!("client speaks vfio-user {major}.{minor}, we speak {VERSION_MAJOR}.x"),
            ));
        }
        let caps = String::from_utf8_lossy(&body[4..]);
        debug!(
            "{}: client vfio-user {major}.{minor} capabilities {}",
            self.dev.name(),
            caps.trim_end_matches('\0')
        );
        let json = format!(
            "{{\"capabilities\":{{\"max_msg_fds\":{MAX_MSG_FDS},\"max_data_xfer_size\":{MAX_DATA_XFER}}}}}"
        );
        let mut out = Vec::new();
        out.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
        out.extend_from_slice(&minor.min(VERSION_MINOR).to_le_bytes());
        out.extend_from_slice(json.as_bytes());
        out.push(0);
        Ok(out)
    }

    fn dma_map(&self, body: &[u8], mut fds: Vec<OwnedFd>) -> Reply {
        need(body, 32, "DMA_MAP")?;
        let flags = le32(body, 4);
        let (offset, iova, size) = (le64(body, 8), le64(body, 16), le64(body, 24));
        if fds.len() > 1 {
            return Err(einval(format!("DMA_MAP with {} fds, at most 1", fds.len())));
        }
        let fd = fds.pop();
        let has_fd = fd.is_some();
        let mut fd = fd;
        let mut res = Ok(0);
        self.dev.dma(&mut |t| {
            res = t
                .map(iova, size, offset, flags, fd.take())
                .map(|()| t.len());
        });
        let n = res?;
        debug!(
            "{}: DMA map {iova:#x}+{size:#x} flags {flags:#x}{} ({n} mappings)",
            self.dev.name(),
            if has_fd { ", mmap'ed" } else { "" }
        );
        Ok(Vec::new())
    }

    fn dma_unmap(&self, body: &[u8]) -> Reply {
        need(body, 24, "DMA_UNMAP")?;
        let flags = le32(body, 4);
        let (iova, size) = (le64(body, 8), le64(body, 16));
        if flags & DMA_UNMAP_FLAG_GET_DIRTY_BITMAP != 0 {
            return Err((libc::ENOTSUP, "dirty page tracking is not supported".into()));
        }
        let mut res = Ok(0);
        self.dev.dma(&mut |t| {
            res = t.unmap(iova, size, flags & DMA_UNMAP_FLAG_ALL != 0);
        });
        let n = res?;
        debug!(
            "{}: DMA unmap {iova:#x}+{size:#x}: {n} mappings",
            self.dev.name()
        );
        Ok(body[..24].to_vec())
    }

    fn device_info(&self, body: &[u8]) -> Reply {
        need(body, 4, "DEVICE_GET_INFO")?;
        if le32(body, 0) < 16 {
            return Err(einval(format!(
                "DEVICE_GET_INFO argsz {} < 16",
                le32(body, 0)
            )));
        }
        Ok(words(&[
            16,
            DEVICE_FLAGS_PCI | DEVICE_FLAGS_RESET,
            NUM_REGIONS,
            irq::NUM_IRQS as u32,
        ]))
    }

    fn region_info(&self, body: &[u8]) -> Reply {
        need(body, 32, "DEVICE_GET_REGION_INFO")?;
        let (argsz, index) = (le32(body, 0), le32(body, 8));
        if argsz < 32 {
            return Err(einval(format!("DEVICE_GET_REGION_INFO argsz {argsz} < 32")));
        }
        if index >= NUM_REGIONS {
            return Err(einval(format!("no region {index}")));
        }
        let size = self.dev.region_size(index);
        let mut flags = if size > 0 {
            REGION_FLAG_READ | REGION_FLAG_WRITE
        } else {
            0
        };
        let mut offset = 0;
        if let Some((fd, off)) = self.dev.region_mmap(index) {
            flags |= REGION_FLAG_MMAP;
            offset = off;
            *self.reply_fd.borrow_mut() = Some(fd);
        }
        let mut out = words(&[32, flags, index, 0]);
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        Ok(out)
    }

    fn irq_info(&self, body: &[u8]) -> Reply {
        need(body, 16, "DEVICE_GET_IRQ_INFO")?;
        let (argsz, index) = (le32(body, 0), le32(body, 8) as usize);
        if argsz < 16 {
            return Err(einval(format!("DEVICE_GET_IRQ_INFO argsz {argsz} < 16")));
        }
        let flags = match index {
            irq::INTX => IRQ_INFO_EVENTFD | IRQ_INFO_MASKABLE | IRQ_INFO_AUTOMASKED,
            irq::MSI => IRQ_INFO_EVENTFD | IRQ_INFO_NORESIZE,
            irq::MSIX | irq::ERR | irq::REQ => IRQ_INFO_EVENTFD,
            _ => return Err(einval(format!("no IRQ index {index}"))),
        };
        Ok(words(&[16, flags, index as u32, self.dev.irq_count(index)]))
    }

    fn set_irqs(&self, body: &[u8], fds: Vec<OwnedFd>) -> Reply {
        need(body, 20, "DEVICE_SET_IRQS")?;
        let (flags, index) = (le32(body, 4), le32(body, 8) as usize);
        let (start, count) = (le32(body, 12), le32(body, 16));
        let data = flags & (IRQ_SET_DATA_NONE | IRQ_SET_DATA_BOOL | IRQ_SET_DATA_EVENTFD);
        let action = flags & (IRQ_SET_ACTION_MASK | IRQ_SET_ACTION_UNMASK | IRQ_SET_ACTION_TRIGGER);
        if data.count_ones() != 1 || action.count_ones() != 1 {
            return Err(einval(format!(
                "SET_IRQS flags {flags:#x} need exactly one DATA_ and one ACTION_ flag"
            )));
        }
        if index >= irq::NUM_IRQS {
            return Err(einval(format!("no IRQ index {index}")));
        }
        let max = self.dev.irq_count(index);
        let end = start.checked_add(count).filter(|&e| e <= max);
        if end.is_none() || (count > 0 && max == 0) {
            return Err(einval(format!(
                "{} vectors {start}+{count} outside its {max}",
                irq::index_name(index)
            )));
        }
        if fds.len() > count as usize {
            return Err(einval(format!("{} fds for {count} vectors", fds.len())));
        }
        if data != IRQ_SET_DATA_EVENTFD && !fds.is_empty() {
            return Err(einval("fds sent without DATA_EVENTFD".into()));
        }
        let name = &self.dev.name();
        let iname = irq::index_name(index);
        if action != IRQ_SET_ACTION_TRIGGER {
            // Masking is QEMU's business for MSI-X; INTx is never asserted
            // for long enough to need it. Accept and drop any resample fds.
            debug!("{name}: {iname} mask/unmask {start}+{count} accepted");
            return Ok(Vec::new());
        }
        match data {
            IRQ_SET_DATA_EVENTFD => {
                let mut fds = fds.into_iter();
                self.dev.irqs(&mut |irqs| {
                    for v in start..start + count {
                        irqs.set(index, v as usize, fds.next());
                    }
                });
                debug!("{name}: {iname} eventfds set for {start}+{count}");
            }
            IRQ_SET_DATA_NONE if count == 0 => {
                self.dev.irqs(&mut |irqs| irqs.disable_all(index));
                debug!("{name}: {iname} disabled");
            }
            _ => {
                let fire: Vec<u32> = if data == IRQ_SET_DATA_BOOL {
                    need(&body[20..], count as usize, "SET_IRQS bool data")?;
                    (0..count).filter(|&i| body[20 + i as usize] != 0).collect()
                } else {
                    (0..count).collect()
                };
                let mut res = Ok(());
                self.dev.irqs(&mut |irqs| {
                    res = fire
                        .iter()
                        .try_for_each(|&i| irqs.fire(index, (start + i) as usize));
                });
                res.map_err(einval)?;
            }
        }
        Ok(Vec::new())
    }

    fn rw_args(body: &[u8], what: &str) -> Result<(u64, u32, usize), (i32, String)> {
        need(body, 16, what)?;
        let (offset, region, count) = (le64(body, 0), le32(body, 8), le32(body, 12) as usize);
        if count > MAX_DATA_XFER {
            return Err(einval(format!(
                "{what} of {count} bytes exceeds {MAX_DATA_XFER}"
            )));
        }
        Ok((offset, region, count))
    }

    fn region_read(&self, body: &[u8]) -> Reply {
        let (offset, region, count) = Self::rw_args(body, "REGION_READ")?;
        let mut out = body[..16].to_vec();
        out.resize(16 + count, 0);
        self.dev
            .region_read(region, offset, &mut out[16..])
            .map_err(einval)?;
        Ok(out)
    }

    fn region_write(&self, body: &[u8]) -> Reply {
        let (offset, region, count) = Self::rw_args(body, "REGION_WRITE")?;
        if body.len() - 16 != count {
            return Err(einval(format!(
                "REGION_WRITE count {count} but {} data bytes",
                body.len() - 16
            )));
        }
        self.dev
            .region_write(region, offset, &body[16..])
            .map_err(einval)?;
        Ok(body[..16].to_vec())
    }
}

fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}
