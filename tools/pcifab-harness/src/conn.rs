// SPDX-License-Identifier: GPL-2.0-only
//! A buffered Unix-socket connection with deadline-bounded reads, shared by
//! the agent channel and the QMP client. Every wait is sliced so that a
//! signal (Ctrl-C) or a dead QEMU ends it promptly.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::procs;

const SLICE: Duration = Duration::from_millis(100);

pub struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    /// Process that serves the other end (QEMU); its exit ends waits early.
    peer_pid: Option<u32>,
    /// Names the peer in errors, e.g. "h0 agent".
    what: String,
}

impl Conn {
    pub fn new(stream: UnixStream, peer_pid: Option<u32>, what: &str) -> Result<Self, String> {
        stream
            .set_read_timeout(Some(SLICE))
            .map_err(|e| format!("{what}: cannot set socket timeout: {e}"))?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
            peer_pid,
            what: what.to_string(),
        })
    }

    /// Reads more bytes into the buffer, failing at `deadline`.
    fn fill(&mut self, deadline: Instant) -> Result<(), String> {
        let mut tmp = [0u8; 65536];
        loop {
            if procs::interrupted() {
                return Err(procs::INTERRUPTED_MSG.into());
            }
            match self.stream.read(&mut tmp) {
                Ok(0) => {
                    return Err(format!(
                        "{}: connection closed by the other side (QEMU exited or the guest \
                         crashed?)",
                        self.what
                    ))
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(());
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(format!("{}: read failed: {e}", self.what)),
            }
            if let Some(pid) = self.peer_pid {
                if procs::has_exited(pid) {
                    return Err(format!("{}: QEMU (pid {pid}) exited", self.what));
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("{}: timed out", self.what));
            }
        }
    }

    /// One line without its `\n`.
    pub fn read_line(&mut self, deadline: Instant) -> Result<Vec<u8>, String> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                line.pop();
                return Ok(line);
            }
            self.fill(deadline)?;
        }
    }

    pub fn read_exact(&mut self, n: usize, deadline: Instant) -> Result<Vec<u8>, String> {
        while self.buf.len() < n {
            self.fill(deadline)?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    pub fn send(&mut self, data: &[u8]) -> Result<(), String> {
        self.stream
            .write_all(data)
            .map_err(|e| format!("{}: write failed: {e}", self.what))
    }
}
