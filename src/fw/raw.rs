// SPDX-License-Identifier: GPL-2.0-only

//! Commands a caller sends through the raw pass-through (`PCIFAB_IOCTL_MRPC`), read from
//! their opcode and sub-command: what each does to the firmware's state, which the
//! pass-through's privilege classes ([`crate::chardev`]) and its bookkeeping rest on.
//! `Documentation/uapi.rst` lists the same table.

use super::{bind, event, ext, gfms, p2p, sys, topo, Command};

/// ECHO (switchtec-user `MRPC_ECHO`): the firmware returns the input inverted.
const ECHO: u32 = 0x41;
/// GFMS_DEVICE_MANAGE, PORT_CONFIG and PORT_CONTROL: PAX configuration commands the driver
/// never sends itself.
const DEVICE_MANAGE: u32 = 0x85;
const PORT_CONFIG: u32 = 0x88;
const PORT_CONTROL: u32 = 0x8d;
/// DIETEMP's GET sub-command (Gen4), the one that only reads.
const DIETEMP_GET: [u8; 4] = 2u32.to_le_bytes();
/// GFMS_DB_DUMP sub-commands up to this one (FABRIC, PAX_ALL, PAX general, HVD, FAB_PORT,
/// EP_PORT, HVD_DETAIL) are answered at once; the later ones are the chunked steps that own
/// a dump session in the firmware.
const DB_DUMP_SINGLE_SHOT_LAST: u8 = 6;
/// pcifab's extensions that only read, then those that change state.
const EXT_READ_LAST: u32 = 0xf07f;
const EXT_CONFIG_FIRST: u32 = 0xf080;
const EXT_LAST: u32 = 0xf0ff;

/// What a raw command does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Effect {
    /// Reads state and changes nothing, not even a session or a queue.
    Reads,
    /// Changes the fabric's configuration or firmware state the driver relies on (event
    /// queues, dump sessions, bindings, routes).
    Configures,
    /// A command the driver does not know: it may do anything.
    Unknown,
}

/// What `cmd` with `input` does. Missing input bytes read as zero, as the firmware reads
/// them.
pub(crate) fn effect(cmd: u32, input: &[u8]) -> Effect {
    let byte = |at: usize| input.get(at).copied().unwrap_or(0);
    let dietemp = <sys::DieTempGet as Command>::OPCODE;
    match cmd {
        ECHO => Effect::Reads,
        c if c == <sys::GetPaxId as Command>::OPCODE => Effect::Reads,
        // DIETEMP: SET_CLOCK, SET_MEAS and STOP change the sensor.
        c if c == dietemp && input.get(..4).unwrap_or(&[]) == DIETEMP_GET => Effect::Reads,
        c if c == gfms::OPCODE && byte(0) <= DB_DUMP_SINGLE_SHOT_LAST => Effect::Reads,
        // The other DIETEMP and database-dump sub-commands, the topology dump (a session the
        // driver's inventory read uses), the event queue (GET consumes what the driver reads
        // its bindings and unbind requests from; CLEAR empties it), bind/unbind, device
        // management, port configuration and control.
        c if c == dietemp
            || c == topo::OPCODE
            || c == gfms::OPCODE
            || c == bind::OPCODE
            || c == event::OPCODE
            || c == DEVICE_MANAGE
            || c == PORT_CONFIG
            || c == PORT_CONTROL =>
        {
            Effect::Configures
        }
        // P2P routes: LIST and GRANT_LIST read; the rest change what a host can reach.
        c if c == p2p::OPCODE && p2p::raw_reads(input) => Effect::Reads,
        c if c == p2p::OPCODE => Effect::Configures,
        ext::FIRST..=EXT_READ_LAST => Effect::Reads,
        EXT_CONFIG_FIRST..=EXT_LAST => Effect::Configures,
        _ => Effect::Unknown,
    }
}

/// Whether `cmd` is a step of a dump session (the topology dump or the database dump), which
/// must not land inside the driver's own session.
pub(crate) fn dump_session(cmd: u32) -> bool {
    cmd == topo::OPCODE || cmd == gfms::OPCODE
}

/// Whether `cmd` reads or clears the firmware's fabric-event queue.
pub(crate) fn event_queue(cmd: u32) -> bool {
    cmd == event::OPCODE
}

/// Whether `cmd` is the P2P route extension (its low 16 bits are the opcode).
pub(crate) fn p2p_routes(cmd: u32) -> bool {
    cmd & 0xffff == p2p::OPCODE
}
