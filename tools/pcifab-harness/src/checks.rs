// SPDX-License-Identifier: GPL-2.0-only
//! The checks library the scenarios are written with: every helper two scenario areas share
//! (commands in the guests and what they print, waits and polls, the MEP and its driver in
//! sysfs, the emulator's state, faults, the fabric as every side sees it, the manager
//! daemon, the management network). It builds on the lower layers only (`fabric`,
//! `config`, `tls`, the crate root's `say`/`soak`) and never on a scenario.
//!
//! The parts build on one another in this order, never the other way: `expect`, then
//! `guest` and `cli`, then `faults` and `world`, then `manager`; `net` stands alone.

pub mod cli;
pub mod expect;
pub mod faults;
pub mod guest;
pub mod manager;
pub mod net;
pub mod world;

pub use cli::{
    json_line, num_field, one_mrpc, pcifab_cmd, pcifab_ok, selftest_json, selftest_ok, stats,
    stats_field, CMD_TIMEOUT_SHORT,
};
pub use expect::{expect_eq, Checks};
pub use faults::{recovered, with_fault, ClearFault};
pub use guest::{
    back_to_pcifab, begin, callers_met, check_bound_pcifab, check_mep_driver, check_sysfs_identity,
    debug_kernel_checks, dmesg_clean, driver_of, ensure_pcifab, find_mep, module_loaded,
    pinned_pages, wait_for, wait_or_dmesg, KMEMLEAK, NO_DRIVER, PCIFAB_KO, SWITCHTEC_KO,
};
pub use manager::{ask, manager_log, run_with_manager, start_manager, stop_manager, LOG, PIDFILE};
pub use net::{h0_end, host_end, TlsFiles};
pub use world::{
    bar_pattern, bind_here, check_bindings, check_invariants, check_world, check_world_except,
    compose_begin, configured, drive, emu_owners, emu_scrubs, fns_seen, free_all, held_by,
    list_owners, listed_owners, owners, owners_text, refused_by_firmware,
    refused_without_extensions, settled_owners, two_hosts, wait_owners, Owners, GPU0, MIB,
};
