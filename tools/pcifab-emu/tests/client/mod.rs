// SPDX-License-Identifier: GPL-2.0-only
//! A small vfio-user client for the tests, speaking to the emulator the way
//! QEMU's vfio-user-pci does.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const VERSION: u16 = 1;
pub const DMA_MAP: u16 = 2;
pub const DMA_UNMAP: u16 = 3;
pub const GET_INFO: u16 = 4;
pub const GET_REGION_INFO: u16 = 5;
pub const GET_IRQ_INFO: u16 = 7;
pub const SET_IRQS: u16 = 8;
pub const REGION_READ: u16 = 9;
pub const REGION_WRITE: u16 = 10;
pub const DEVICE_RESET: u16 = 13;

pub const NO_REPLY: u32 = 1 << 4;
pub const ERROR: u32 = 1 << 5;

pub const BAR0: u32 = 0;
pub const BAR4: u32 = 4;
pub const CONFIG: u32 = 7;

pub const IRQ_SET_DATA_NONE: u32 = 1;
pub const IRQ_SET_DATA_EVENTFD: u32 = 4;
pub const IRQ_SET_ACTION_TRIGGER: u32 = 32;

#[derive(Debug)]
pub struct Reply {
    pub id: u16,
    pub cmd: u16,
    pub flags: u32,
    pub error: u32,
    pub data: Vec<u8>,
}

impl Reply {
    pub fn ok(self) -> Vec<u8> {
        assert_eq!(
            self.flags & ERROR,
            0,
            "command {} failed with errno {}",
            self.cmd,
            self.error
        );
        self.data
    }

    pub fn errno(&self) -> Option<u32> {
        (self.flags & ERROR != 0).then_some(self.error)
    }

    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.data[at..at + 4].try_into().expect("4 bytes"))
    }

    pub fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.data[at..at + 8].try_into().expect("8 bytes"))
    }
}

pub struct Client {
    sock: UnixStream,
    next_id: u16,
}

pub fn le_words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl Client {
    pub fn connect(path: &Path) -> Client {
        let sock =
            UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Client {
            sock,
            next_id: 0x100,
        }
    }

    /// Send a command with optional SCM_RIGHTS descriptors; returns its id.
    pub fn send(&mut self, cmd: u16, flags: u32, payload: &[u8], fds: &[RawFd]) -> u16 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let mut msg = Vec::new();
        msg.extend_from_slice(&id.to_le_bytes());
        msg.extend_from_slice(&cmd.to_le_bytes());
        msg.extend_from_slice(&((16 + payload.len()) as u32).to_le_bytes());
        msg.extend_from_slice(&flags.to_le_bytes());
        msg.extend_from_slice(&0u32.to_le_bytes());
        msg.extend_from_slice(payload);
        if fds.is_empty() {
            self.sock.write_all(&msg).expect("send");
            return id;
        }
        let mut cbuf = [0u64; 32];
        let fd_bytes = std::mem::size_of_val(fds);
        let mut iov = libc::iovec {
            iov_base: msg.as_mut_ptr().cast(),
            iov_len: msg.len(),
        };
        // SAFETY: builds one SCM_RIGHTS control message in a local buffer
        // large enough for it and sends it with the message.
        unsafe {
            let mut m: libc::msghdr = std::mem::zeroed();
            m.msg_iov = &mut iov;
            m.msg_iovlen = 1;
            m.msg_control = cbuf.as_mut_ptr().cast();
            m.msg_controllen = libc::CMSG_SPACE(fd_bytes as u32) as _;
            let c = libc::CMSG_FIRSTHDR(&m);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), fd_bytes);
            let n = libc::sendmsg(self.sock.as_raw_fd(), &m, 0);
            assert_eq!(n as usize, msg.len(), "sendmsg");
        }
        id
    }

    pub fn recv(&mut self) -> Reply {
        let mut h = [0u8; 16];
        self.sock.read_exact(&mut h).expect("reply header");
        let size = u32::from_le_bytes(h[4..8].try_into().expect("size")) as usize;
        assert!(size >= 16, "reply size {size}");
        let mut data = vec![0u8; size - 16];
        self.sock.read_exact(&mut data).expect("reply body");
        Reply {
            id: u16::from_le_bytes([h[0], h[1]]),
            cmd: u16::from_le_bytes([h[2], h[3]]),
            flags: u32::from_le_bytes(h[8..12].try_into().expect("flags")),
            error: u32::from_le_bytes(h[12..16].try_into().expect("error")),
            data,
        }
    }

    /// Send a command and receive its reply with the descriptor that came
    /// with it (the server sends each reply with one sendmsg).
    pub fn request_get_fd(&mut self, cmd: u16, payload: &[u8]) -> (Reply, Option<OwnedFd>) {
        let id = self.send(cmd, 0, payload, &[]);
        let mut buf = vec![0u8; 4096];
        let mut cbuf = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut fd = None;
        // SAFETY: recvmsg into local buffers; the one SCM_RIGHTS descriptor
        // is owned right away.
        let n = unsafe {
            let mut m: libc::msghdr = std::mem::zeroed();
            m.msg_iov = &mut iov;
            m.msg_iovlen = 1;
            m.msg_control = cbuf.as_mut_ptr().cast();
            m.msg_controllen = std::mem::size_of_val(&cbuf) as _;
            let n = libc::recvmsg(self.sock.as_raw_fd(), &mut m, libc::MSG_CMSG_CLOEXEC);
            let c = libc::CMSG_FIRSTHDR(&m);
            if !c.is_null() && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            n
        };
        assert!(n >= 16, "reply");
        let h = &buf[..16];
        let size = u32::from_le_bytes(h[4..8].try_into().expect("size")) as usize;
        assert_eq!(size, n as usize, "whole reply in one message");
        let r = Reply {
            id: u16::from_le_bytes([h[0], h[1]]),
            cmd: u16::from_le_bytes([h[2], h[3]]),
            flags: u32::from_le_bytes(h[8..12].try_into().expect("flags")),
            error: u32::from_le_bytes(h[12..16].try_into().expect("error")),
            data: buf[16..size].to_vec(),
        };
        assert_eq!((r.id, r.cmd), (id, cmd), "reply matches request");
        (r, fd)
    }

    pub fn request_fds(&mut self, cmd: u16, payload: &[u8], fds: &[RawFd]) -> Reply {
        let id = self.send(cmd, 0, payload, fds);
        let r = self.recv();
        assert_eq!((r.id, r.cmd), (id, cmd), "reply matches request");
        assert_eq!(r.flags & 0xf, 1, "reply type");
        r
    }

    pub fn request(&mut self, cmd: u16, payload: &[u8]) -> Reply {
        self.request_fds(cmd, payload, &[])
    }

    pub fn version(&mut self, minor: u16) -> Reply {
        let mut p = Vec::new();
        p.extend_from_slice(&0u16.to_le_bytes());
        p.extend_from_slice(&minor.to_le_bytes());
        p.extend_from_slice(
            br#"{"capabilities":{"migration":{"pgsize":4096,"max_bitmap_size":268435456},"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535,"write_multiple":true}}"#,
        );
        p.push(0);
        self.request(VERSION, &p)
    }

    fn rw_header(region: u32, off: u64, count: usize) -> Vec<u8> {
        let mut p = off.to_le_bytes().to_vec();
        p.extend_from_slice(&region.to_le_bytes());
        p.extend_from_slice(&(count as u32).to_le_bytes());
        p
    }

    pub fn try_read(&mut self, region: u32, off: u64, count: usize) -> Reply {
        self.request(REGION_READ, &Self::rw_header(region, off, count))
    }

    pub fn read(&mut self, region: u32, off: u64, count: usize) -> Vec<u8> {
        let r = self.try_read(region, off, count).ok();
        assert_eq!(r.len(), 16 + count, "read reply length");
        assert_eq!(
            u32::from_le_bytes(r[12..16].try_into().expect("count")) as usize,
            count
        );
        r[16..].to_vec()
    }

    pub fn read32(&mut self, region: u32, off: u64) -> u32 {
        u32::from_le_bytes(self.read(region, off, 4).try_into().expect("4 bytes"))
    }

    pub fn try_write(&mut self, region: u32, off: u64, data: &[u8]) -> Reply {
        let mut p = Self::rw_header(region, off, data.len());
        p.extend_from_slice(data);
        self.request(REGION_WRITE, &p)
    }

    pub fn write(&mut self, region: u32, off: u64, data: &[u8]) {
        let r = self.try_write(region, off, data).ok();
        assert_eq!(r.len(), 16, "write reply carries offset, region, count");
    }

    pub fn write32(&mut self, region: u32, off: u64, v: u32) {
        self.write(region, off, &v.to_le_bytes());
    }

    /// A posted write: NO_REPLY set, as QEMU sends most MMIO writes.
    pub fn post_write(&mut self, region: u32, off: u64, data: &[u8]) {
        let mut p = Self::rw_header(region, off, data.len());
        p.extend_from_slice(data);
        self.send(REGION_WRITE, NO_REPLY, &p, &[]);
    }

    pub fn set_irq_eventfds(&mut self, index: u32, start: u32, count: u32, fds: &[RawFd]) -> Reply {
        let p = le_words(&[
            20,
            IRQ_SET_DATA_EVENTFD | IRQ_SET_ACTION_TRIGGER,
            index,
            start,
            count,
        ]);
        self.request_fds(SET_IRQS, &p, fds)
    }
}

pub fn eventfd() -> OwnedFd {
    // SAFETY: plain syscall; the fd is owned right away.
    unsafe {
        let fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
        assert!(fd >= 0, "eventfd");
        OwnedFd::from_raw_fd(fd)
    }
}

/// Wait up to `ms` for the eventfd to be signalled; returns its counter.
pub fn wait_eventfd(fd: &OwnedFd, ms: i32) -> Option<u64> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one live pollfd; read 8 bytes into a local u64.
    unsafe {
        if libc::poll(&mut p, 1, ms) != 1 {
            return None;
        }
        let mut v = 0u64;
        let n = libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        (n == 8).then_some(v)
    }
}
