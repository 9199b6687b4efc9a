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
/// GFMS_DB_DUMP sections answered at once (FABRIC, PAX general, FAB_PORT): they only read.
const DB_DUMP_SINGLE_SHOT: [u8; 3] = [0, 2, 4];
/// GFMS_DB_DUMP sections fetched in START / GET / FINISH steps (PAX_ALL, HVD, EP_PORT,
/// HVD_DETAIL), the step a `u32` at byte 4: START opens the partition's one dump session
/// (replacing whatever another caller had open) and FINISH closes it; GET reads from it.
const DB_DUMP_CHUNKED: [u8; 4] = [1, 3, 5, 6];
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

/// Whether a GFMS_DB_DUMP `input` only reads: a single-shot section, or the GET step of a
/// chunked one. START, FINISH, unknown steps and unknown sections are not.
fn db_dump_reads(input: &[u8]) -> bool {
    let byte = |at: usize| input.get(at).copied().unwrap_or(0);
    let step = u32::from_le_bytes([byte(4), byte(5), byte(6), byte(7)]);
    DB_DUMP_SINGLE_SHOT.contains(&byte(0))
        || (DB_DUMP_CHUNKED.contains(&byte(0)) && step == gfms::TYPE_GET)
}

/// What an extension command `cmd` (0xF000-0xF0FF) does on firmware that offers `features`.
/// An extension the probe did not discover is a command the driver does not know: PAX
/// firmware has none, and an id the firmware did not advertise may do anything there.
fn ext_effect(cmd: u32, input: &[u8], features: ext::Features) -> Effect {
    if features.bits() == 0 {
        return Effect::Unknown;
    }
    match cmd {
        ext::TELEMETRY_OPCODE if !features.has(ext::TELEMETRY) => Effect::Unknown,
        c if c == p2p::OPCODE && !features.has(ext::P2P_ROUTES) => Effect::Unknown,
        // P2P routes: LIST and GRANT_LIST read; the rest change what a host can reach.
        c if c == p2p::OPCODE && p2p::raw_reads(input) => Effect::Reads,
        c if c == p2p::OPCODE => Effect::Configures,
        ext::FIRST..=EXT_READ_LAST => Effect::Reads,
        EXT_CONFIG_FIRST..=EXT_LAST => Effect::Configures,
        _ => Effect::Unknown,
    }
}

/// What `cmd` with `input` does on firmware that offers the extensions `features`. Missing
/// input bytes read as zero, as the firmware reads them.
pub(crate) fn effect(cmd: u32, input: &[u8], features: ext::Features) -> Effect {
    let dietemp = <sys::DieTempGet as Command>::OPCODE;
    match cmd {
        ECHO => Effect::Reads,
        c if c == <sys::GetPaxId as Command>::OPCODE => Effect::Reads,
        // DIETEMP: SET_CLOCK, SET_MEAS and STOP change the sensor.
        c if c == dietemp && input.get(..4).unwrap_or(&[]) == DIETEMP_GET => Effect::Reads,
        c if c == gfms::OPCODE && db_dump_reads(input) => Effect::Reads,
        // The other DIETEMP sub-commands, the database dump's session steps (START, FINISH)
        // and unknown sub-commands, the topology dump (a session the driver's inventory read
        // uses), the event queue (GET consumes what the driver reads its bindings and unbind
        // requests from; CLEAR empties it), bind/unbind, device management, port
        // configuration and control.
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
        ext::FIRST..=EXT_LAST => ext_effect(cmd, input, features),
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
