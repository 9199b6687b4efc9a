// SPDX-License-Identifier: GPL-2.0-only
//! Interrupt eventfds handed over by the client with SET_IRQS.

use std::os::fd::{AsRawFd, OwnedFd};

// vfio_pci IRQ indices.
pub const INTX: usize = 0;
pub const MSI: usize = 1;
pub const MSIX: usize = 2;
pub const ERR: usize = 3;
pub const REQ: usize = 4;
pub const NUM_IRQS: usize = 5;

/// Vectors per index: INTx, MSI (no capability), MSI-X, ERR, REQ.
pub const COUNTS: [u32; NUM_IRQS] = [1, 0, crate::pci::MSIX_VECTORS as u32, 1, 1];

pub fn index_name(index: usize) -> &'static str {
    ["INTx", "MSI", "MSI-X", "ERR", "REQ"]
        .get(index)
        .copied()
        .unwrap_or("?")
}

#[derive(Default)]
pub struct Irqs {
    fds: [Vec<Option<OwnedFd>>; NUM_IRQS],
}

impl Irqs {
    pub fn new() -> Self {
        Self::with_msix(COUNTS[MSIX])
    }

    /// Room for `msix` MSI-X vectors (a device whose table is not the MEP's size).
    pub fn with_msix(msix: u32) -> Self {
        let mut irqs = Irqs::default();
        for (i, v) in irqs.fds.iter_mut().enumerate() {
            let n = if i == MSIX { msix } else { COUNTS[i] };
            v.resize_with(n as usize, || None);
        }
        irqs
    }

    /// Install (Some) or remove (None) the eventfd of one vector.
    pub fn set(&mut self, index: usize, vector: usize, fd: Option<OwnedFd>) {
        if let Some(slot) = self.fds.get_mut(index).and_then(|v| v.get_mut(vector)) {
            *slot = fd;
        }
    }

    pub fn disable_all(&mut self, index: usize) {
        if let Some(v) = self.fds.get_mut(index) {
            v.iter_mut().for_each(|s| *s = None);
        }
    }

    pub fn clear(&mut self) {
        (0..NUM_IRQS).for_each(|i| self.disable_all(i));
    }

    pub fn has_any(&self, index: usize) -> bool {
        self.fds
            .get(index)
            .is_some_and(|v| v.iter().any(|s| s.is_some()))
    }

    /// Signal a vector's eventfd. Errors say why nothing was signalled.
    pub fn fire(&self, index: usize, vector: usize) -> Result<(), String> {
        let fd = self
            .fds
            .get(index)
            .and_then(|v| v.get(vector))
            .and_then(|s| s.as_ref())
            .ok_or_else(|| format!("{} vector {vector} has no eventfd", index_name(index)))?;
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an fd we own.
        let n = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if n == 8 {
            Ok(())
        } else {
            Err(format!(
                "writing {} vector {vector} eventfd: {}",
                index_name(index),
                std::io::Error::last_os_error()
            ))
        }
    }
}
