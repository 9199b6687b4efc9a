// SPDX-License-Identifier: GPL-2.0-only

//! The ioctl calls on an open `/dev/pcifabN`, shared by every tool that talks to the driver.

use std::{fs::File, io, os::fd::AsRawFd};

use crate::{Arg, Function, Inventory, Mrpc, Port};

/// Issues `cmd` with `arg`.
///
/// # Safety
///
/// Every user pointer inside `arg` must address a buffer at least as long as `arg` says,
/// alive for the call.
pub unsafe fn ioctl<T: Arg>(dev: &File, cmd: u32, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is a live `repr(C)` struct of this ABI whose `size` bounds what the kernel
    // reads and writes; the caller vouches for the pointers inside it.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), cmd as _, arg as *mut T) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Runs one firmware command (`PCIFAB_IOCTL_MRPC`); returns its status and return value.
pub fn mrpc(
    dev: &File,
    cmd: u32,
    input: &[u8],
    output: &mut [u8],
    timeout_ms: u32,
) -> io::Result<(u32, u32)> {
    let mut m = Mrpc::new();
    m.cmd = cmd;
    m.in_len = u32::try_from(input.len()).unwrap_or(u32::MAX);
    m.out_len = u32::try_from(output.len()).unwrap_or(u32::MAX);
    m.timeout_ms = timeout_ms;
    m.in_ptr = input.as_ptr() as u64;
    m.out_ptr = output.as_mut_ptr() as u64;
    // SAFETY: the pointers and lengths come from the two slices, which outlive the call.
    unsafe { ioctl(dev, crate::PCIFAB_IOCTL_MRPC, &mut m) }?;
    Ok((m.status, m.ret_value))
}

/// The whole fabric (`PCIFAB_IOCTL_INVENTORY`), growing the arrays until they hold it.
///
/// Fails with `EAGAIN` if the fabric keeps growing between calls.
pub fn inventory(dev: &File) -> io::Result<(Inventory, Vec<Port>, Vec<Function>)> {
    let (mut nports, mut nfns) = (64usize, 256usize);
    for _ in 0..4 {
        let mut ports = vec![Port::default(); nports];
        let mut functions = vec![Function::default(); nfns];
        let mut inv = Inventory::new();
        inv.nr_ports = nports as u32;
        inv.nr_functions = nfns as u32;
        inv.port_size = std::mem::size_of::<Port>() as u32;
        inv.function_size = std::mem::size_of::<Function>() as u32;
        inv.ports_ptr = ports.as_mut_ptr() as u64;
        inv.functions_ptr = functions.as_mut_ptr() as u64;
        // SAFETY: `inv` points at `ports` and `functions`, which hold as many entries of the
        // sizes it states and outlive the call.
        unsafe { ioctl(dev, crate::PCIFAB_IOCTL_INVENTORY, &mut inv) }?;
        if inv.nr_ports as usize <= nports && inv.nr_functions as usize <= nfns {
            ports.truncate(inv.nr_ports as usize);
            functions.truncate(inv.nr_functions as usize);
            return Ok((inv, ports, functions));
        }
        nports = inv.nr_ports as usize;
        nfns = inv.nr_functions as usize;
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}
