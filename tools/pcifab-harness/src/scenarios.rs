// SPDX-License-Identifier: GPL-2.0-only
//! The scenario registry: every scenario `test` runs, in order, with its name and time
//! budget, and the harness's own checks (`selftest`). The scenarios themselves live in
//! `scenarios/`, one file per area, written with [`crate::checks`]; no area uses another.
//!
//! Each scenario is a plain function over the [`Fabric`]; add one by writing the function
//! in its area's file and listing it in [`all`]. Scenarios set up their own preconditions
//! (module loaded or not), so any one of them can run alone with `--filter`; the Makefile
//! and the documentation filter on the names, so a name is changed only with them.

use std::time::Duration;

use crate::fabric::Fabric;

mod compose;
mod compose_locks;
mod compose_trust;
mod driver_trust;
mod fabric_dma;
mod hotplug;
mod identity;
mod install;
mod mgmt;
mod mgmt_net;
mod nvme;
mod nvme_pool;
mod p2p_trust;
pub mod p2pdma;
mod pax_client;
mod pax_driver;
mod pcifab_dmaep;
mod selftest;
mod slurm;
mod slurm_trace;
mod telemetry;
mod trust;

// `bench` (main.rs, bench_dmaep.rs) measures through these as well.
pub mod dma_endpoint;
pub mod manager;
pub mod p2p;

pub type ScenarioFn = fn(&mut Fabric) -> Result<(), String>;

pub struct Scenario {
    pub name: &'static str,
    /// Time budget for the whole scenario; commands are cut to fit it.
    pub timeout: Duration,
    pub run: ScenarioFn,
}

/// Every scenario, in the order `test` runs them.
pub fn all() -> Vec<Scenario> {
    let soak = crate::soak();
    let s = |name, secs, run| Scenario {
        name,
        timeout: Duration::from_secs(secs),
        run,
    };
    let mut v = vec![
        s("agent answers in every host", 60, identity::agent_answers),
        s("pcifab binds the MEP in every host", 120, identity::pcifab_binds),
        s(
            "sysfs identity matches the emulator config",
            120,
            identity::sysfs_identity,
        ),
        s(
            "identity ioctl matches the emulator config",
            120,
            identity::ioctl_identity,
        ),
        s(
            if soak {
                "50 load/unload cycles leave dmesg clean"
            } else {
                "4 load/unload cycles leave dmesg clean"
            },
            600,
            identity::load_unload_cycles,
        ),
        s(
            "in-tree switchtec driver binds the emulated MEP",
            180,
            identity::switchtec_binds,
        ),
        s(
            "MRPC echo: random sizes, byte exact, in every host",
            600,
            mgmt::echo_random,
        ),
        s(
            "MRPC echo: four processes at once, no mixing or loss",
            300,
            mgmt::echo_concurrent,
        ),
        s(
            "ioctl bad-input table: rejected calls change nothing",
            180,
            mgmt::abi_table,
        ),
        s(
            "unprivileged caller: read-only MRPC only",
            120,
            mgmt::unprivileged,
        ),
        s(
            "fault mrpc-hang: ETIMEDOUT, EINTR, then the mailbox recovers",
            180,
            mgmt::fault_hang,
        ),
        s(
            "fault mrpc-error: status 0xff with the return value",
            120,
            mgmt::fault_error,
        ),
        s(
            "fault drop-irq: the 50 ms poll completes commands",
            120,
            mgmt::fault_drop_irq,
        ),
        s("fault delay: completion after the delay", 120, mgmt::fault_delay),
        s(
            "fault bad-length: oversize length claims pass cleanly",
            120,
            mgmt::fault_bad_length,
        ),
        s("fault firmware-dead: EIO within 1 s", 120, mgmt::fault_dead),
        s(
            "compose: bind GPU0 to h0, ids and BAR2 pattern",
            120,
            compose::compose_bind,
        ),
        s(
            "compose: move GPU0 to h1, memory scrubbed",
            120,
            compose::compose_move,
        ),
        s(
            "compose: gpu1 VFs split between the hosts",
            120,
            compose::compose_vf_split,
        ),
        s(
            "compose: conflicts and policy refused, nothing changes",
            120,
            compose::compose_conflicts,
        ),
        s(
            "compose: h1's bind and unbind reach h0's view by their events",
            180,
            compose::compose_view_events,
        ),
        s(
            "compose: h0's own bind and unbind show in its view at once, no re-read of the fabric",
            120,
            compose::compose_own_view,
        ),
        s(
            "compose: bind to a host that never enumerates: ETIMEDOUT",
            120,
            compose::compose_no_enumerate,
        ),
        s(
            "compose: unbind while BAR2 is mapped goes ahead",
            120,
            compose::compose_unbind_mapped,
        ),
        s(
            "compose: samples move-gpu.sh and move",
            120,
            compose::compose_samples,
        ),
        s(
            "compose: random concurrent requests from both hosts",
            300,
            compose::compose_random,
        ),
        s(
            "compose: an inventory copy stalled in its user buffer holds up no other caller",
            240,
            compose_locks::inventory_stall,
        ),
        s(
            "compose: three 8-function binds waiting on one function all finish",
            240,
            compose_locks::three_binds_no_deadlock,
        ),
        s(
            "compose: a bind waiting for a reservation ends within 1 s of SIGKILL",
            180,
            compose_locks::killed_waiter_ends,
        ),
        s(
            "compose: a bind waiting for a free logical port counts in compose_waiting",
            240,
            compose_locks::free_port_waiter_counted,
        ),
        s(
            "compose trust: MEP unbound while a bind waits: ENODEV at once",
            240,
            compose_trust::unbind_mep_during_bind,
        ),
        s(
            "compose trust: MEP unbound while pciehp removes a function",
            240,
            compose_trust::unbind_mep_during_pciehp_removal,
        ),
        s(
            "compose trust: ACS control of the downstream ports restored at rmmod",
            180,
            compose_trust::acs_restored,
        ),
        s(
            "compose trust: MEP removed while a function's removal waits for pciehp",
            300,
            hotplug::mep_removed_during_removal,
        ),
        s(
            "compose: sysfs unbind and an admin without DAC override remove gracefully",
            180,
            hotplug::unbind_graceful,
        ),
        s(
            "compose trust: pcifab leaves ACS as set, a vfio-pci function stays isolated",
            240,
            hotplug::acs_untouched,
        ),
        s(
            "compose trust: two hosts unbind one function at once, one gets ENOENT",
            420,
            compose_trust::double_unbind,
        ),
        s(
            "sysfs bind and unbind: root without CAP_SYS_ADMIN is refused",
            180,
            compose_trust::sysfs_bind_needs_cap,
        ),
        s(
            "p2p: same-host and cross-host copies, checked through the BARs",
            300,
            p2p::p2p_copies,
        ),
        s(
            "p2p: user buffers 1 byte to 64 MiB, IOMMU on (h0) and off (h1)",
            420,
            p2p::p2p_user_buffers,
        ),
        s(
            "p2p: unmapped IOVA, address beyond RAM, no route: refused, nothing written",
            300,
            p2p::p2p_isolation,
        ),
        s(
            "p2p: route removed and target unbound during a copy",
            300,
            p2p::p2p_races,
        ),
        s(
            "p2p trust: the MEP gone during a copy ends it with ENODEV and unpins its pages",
            300,
            p2p_trust::gone_during_copy,
        ),
        s(
            "p2p trust: user buffers are pinned long-term, out of movable memory",
            420,
            p2p_trust::longterm_pins,
        ),
        s(
            "p2p trust: SIGKILL ends a copier waiting for the DMA engine within 1 s",
            300,
            p2p_trust::killed_waiter,
        ),
        s(
            "p2p trust: a copier signalled under SA_RESTART while it waits for the DMA engine \
             keeps its timeout",
            300,
            p2p_trust::signalled_waiter,
        ),
        s(
            "p2p trust: the DMA engine works again after the MEP's registers were reset",
            240,
            p2p_trust::ring_after_reset,
        ),
        s(
            "sysfs: per-function telemetry in every host follows the firmware",
            120,
            telemetry::sysfs_telemetry,
        ),
        s(
            "sysfs: per-function directories follow the fabric as an endpoint leaves and returns",
            120,
            telemetry::sysfs_dirs_follow_fabric,
        ),
        // The network and TLS material the manager's API is reached through.
        s(
            "mgmt net: every host reaches the manager's host, and only it",
            180,
            mgmt_net::reach_manager_only,
        ),
        s(
            "mgmt net: TLS material in every guest, keys private",
            120,
            mgmt_net::tls_installed,
        ),
        s(
            "mgmt net: a host killed and rebooted gets its link back",
            240,
            mgmt_net::rebooted_host_reconnects,
        ),
        s(
            "manager: four requests at three priorities, queue and hand-overs",
            300,
            manager::four_requests,
        ),
        s(
            "manager: time-sliced GPU visits both hosts, scrubbed between them",
            240,
            manager::time_sliced,
        ),
        s(
            "manager: kill -9 and restart mid-lease lose nothing",
            300,
            manager::kill_9,
        ),
        s(
            "manager: endpoint failure moves the lease to a healthy GPU",
            240,
            manager::endpoint_failure,
        ),
        s(
            "manager: host killed, its GPUs reclaimed for the queue",
            300,
            manager::host_killed,
        ),
        s(
            "manager: h1 requests over the network, each principal held to its role",
            240,
            manager::network_api,
        ),
        // Last of the manager's: it powers h0 off and boots it again.
        s(
            manager::HA_SCENARIO,
            240,
            manager::leader_host_powered_off,
        ),
        // Before `features`: its raw query of an extension PAX lacks is a debug write that
        // taints the kernel, and this scenario needs a kernel no raw write has tainted.
        s(
            "fwctl rules: raw firmware writes need CAP_SYS_RAWIO, taint, obey lockdown",
            240,
            driver_trust::fwctl_rules,
        ),
        s(
            "slurm: a 2-GPU job on a node with none runs once the manager binds two GPUs",
            480,
            slurm::two_gpu_job,
        ),
        s(
            "slurm: a bind that times out requeues the job; one cancelled while its bind waits leaves nothing bound",
            480,
            slurm::bind_failures,
        ),
        s(
            "slurm: a job asking for one VF (--gres=gpuvf:1) gets one SR-IOV VF bound to its node",
            300,
            slurm::vf_job,
        ),
        s(
            "slurm: ten 1-GPU jobs at two priorities share the pool's two GPUs, higher priority first, all finish",
            480,
            slurm::ten_jobs,
        ),
        s(
            "slurm: slurmctld restarted mid-job loses nothing",
            300,
            slurm::ctld_restart,
        ),
        s(
            "slurm: pcifab-manager restarted mid-job loses nothing",
            300,
            slurm::manager_restart,
        ),
        s(
            "slurm: the manager down when a job ends: its GPUs come back once the manager is",
            480,
            slurm::manager_down_at_job_end,
        ),
        // `make bench` only (lane 3 excludes it): figures, not a test.
        s(
            "slurm: bench: sbatch to running on a composed node and on one holding the GPUs; the trace utilisation",
            600,
            slurm::bench_figures,
        ),
        s(
            "slurm: a node killed mid-job is marked down, its GPUs reclaimed, its job requeued and run again",
            480,
            slurm::node_killed,
        ),
        s(
            "features: the driver finds the firmware's extensions, PAX refuses the query",
            120,
            pax_driver::features,
        ),
        s(
            "extensions: EOPNOTSUPP without them, working with them",
            180,
            pax_driver::extensions,
        ),
        s(
            "multi-function bind: three VFs arrive and leave as one device, all or none",
            300,
            pax_driver::multi_bind,
        ),
        s(
            "multi-function bind with pcifab: a list binds all or none",
            300,
            pax_driver::multi_bind_cli,
        ),
        s(
            "multi-function bind: a two-function device leaves whole from a port without a hot-plug slot",
            300,
            compose_locks::multi_fn_no_slot,
        ),
        s(
            "DMA MRPC: host-buffer completions, the mailbox when the firmware withdraws it",
            300,
            pax_driver::dma_mrpc,
        ),
        s(
            "mrpc classes: unprivileged callers cannot drain events or touch dump sessions",
            120,
            driver_trust::mrpc_classes,
        ),
        s(
            "mrpc classes: extensions the firmware lacks and unprivileged timeouts are refused",
            120,
            driver_trust::mrpc_ext_timeouts,
        ),
        s(
            "sysfs: other functions' telemetry is root's, p2p_routes reads are cached",
            120,
            driver_trust::sysfs_tenant_data,
        ),
        s(
            "mrpc: an abandoned command's output never reaches the next caller",
            120,
            driver_trust::abandoned_output,
        ),
        s(
            "mrpc: a caller queued behind a 20 s command ends within 1 s of SIGKILL",
            180,
            driver_trust::queued_caller_killed,
        ),
        s(
            "events: a waiter without timeout gets ENODEV when the MEP is unbound",
            120,
            driver_trust::waiter_enodev,
        ),
        s(
            "p2p grants: a host routes to another's function only while granted",
            300,
            driver_trust::p2p_grants,
        ),
        s(
            if soak {
                "hostile firmware: 5,000 lying replies, no splat or hang, then sane again"
            } else {
                "hostile firmware: 250 lying replies, no splat or hang, then sane again"
            },
            900,
            driver_trust::hostile_firmware,
        ),
        s(
            "firmware lies: bind status, event codes and counts, foreign unbind requests, \
             DMA bytes-done are refused or logged",
            300,
            driver_trust::firmware_lies,
        ),
        s(
            "firmware lies: a bind that binds another function than asked fails with EIO and \
             is undone",
            120,
            driver_trust::firmware_lies_bind_other,
        ),
        s(
            "firmware lies: an unbind request that came after the function left is stale, not \
             a lie",
            120,
            driver_trust::stale_unbind_request,
        ),
        s(
            "events: an interrupt while the MEP reads all ones (surprise removal) is not serviced",
            120,
            driver_trust::gone_irq,
        ),
        s(
            "chardev: the MEP's number comes back: pcifab0 again after each of 10 unbinds",
            180,
            driver_trust::number_comes_back,
        ),
        s(
            "events: a fabric event and mailbox completions interrupt again after the MEP's \
             registers were reset",
            180,
            driver_trust::events_after_reset,
        ),
        // The public PAX client over switchtec.ko, before pcifab goes away.
        s(
            "pax client: switchtec-user list, info, fw-info, status, test, topo-info, gfms-dump",
            600,
            pax_client::dump_and_identify,
        ),
        s(
            "pax client: switchtec-user log-dump, commands for an unreachable PAX (-x 1)",
            300,
            pax_client::log_and_other_pax,
        ),
        s(
            "pax client: switchtec-user gfms-bind two functions, gfms-unbind",
            300,
            pax_client::bind_unbind,
        ),
        // The nvme scenarios run on fabric-nvme.toml only (`Run::scenarios` leaves out every
        // "nvme:" scenario on a fabric without a drive), before the module goes away.
        s(
            if soak {
                "nvme: Linux's nvme driver takes the composed drive; its data follows it host to host (10 round trips)"
            } else {
                "nvme: Linux's nvme driver takes the composed drive; its data follows it host to host (2 round trips)"
            },
            1500,
            nvme::data_follows,
        ),
        s(
            "nvme: unbind with a writer streaming: the writer fails, every acknowledged write is on the image",
            600,
            nvme::unbind_in_flight,
        ),
        s(
            "nvme: move requested by h1 with h0 writing: h0's writer fails, h1 reads every acknowledged write",
            600,
            nvme::move_in_flight,
        ),
        s(
            "nvme: a mounted file system stops unbind and move; --force takes the drive, the kernel stays clean",
            600,
            nvme::mounted_refused,
        ),
        s(
            "nvme: manager queues h1 while h0 holds the drive; h0's release hands it over with its data",
            600,
            nvme_pool::handover_keeps_data,
        ),
        s(
            "nvme: manager scrub pool erases the drive between holders; the next holder reads zeros",
            600,
            nvme_pool::scrub_between_holders,
        ),
        // Linux's P2PDMA between two drives, on fabric-p2pdma.toml only (`Run::scenarios`
        // leaves out every "p2pdma:" scenario on a fabric without a drive with a CMB).
        s(
            "p2pdma: with the IOMMU on (h0) Linux refuses a drive's O_DIRECT read into another's CMB: ACS redirect, host bridge not whitelisted",
            600,
            p2pdma::iommu_on,
        ),
        s(
            "p2pdma: an O_DIRECT read from one fabric drive lands in another's CMB, no CPU copy (IOMMU off, h1)",
            600,
            p2pdma::iommu_off,
        ),
        // What the driver must survive (trust.rs), before the scenarios that unload the
        // module or remove the MEP (they need both).
        s(
            if soak {
                "fuzz: 100,000 hostile calls as an unprivileged user change nothing"
            } else {
                "fuzz: 4,000 hostile calls as an unprivileged user change nothing"
            },
            1800,
            trust::fuzz_unpriv,
        ),
        s(
            if soak {
                "1,000 insmod/rmmod cycles with files open, commands in flight, events pending"
            } else {
                "4 insmod/rmmod cycles with files open, commands in flight, events pending"
            },
            3600,
            trust::unload_cycles,
        ),
        s(
            if soak {
                "fuzz: 100,000 hostile calls as root while h1 binds and unbinds"
            } else {
                "fuzz: 4,000 hostile calls as root while h1 binds and unbinds"
            },
            2700,
            trust::fuzz_root,
        ),
    ];
    v.push(s(
        "probe undoes everything when each of its steps fails (probe_fault_step)",
        600,
        trust::probe_steps,
    ));
    v.push(s(
        if soak {
            "probe undoes everything when any allocation of pcifab's own code fails (sysfs \
             bind, fail-nth within 10 stack frames of the driver, every point on every host)"
        } else {
            "probe undoes everything when pcifab's own allocations fail (sysfs bind, fail-nth \
             within 10 stack frames of the driver, half the point numbers split between the \
             hosts)"
        },
        900,
        trust::probe_faults_own,
    ));
    v.push(s(
        "probe turns off DMA MRPC and the DMA engine a previous kernel left armed",
        240,
        trust::stale_dma,
    ));
    if soak {
        // Soak only: every fault point of a probe through the driver's bind file, and of a
        // whole load (hundreds of points at 1.4-1.5 s each on the sanitizer kernel), and
        // ACPICA and genirq mishandle some of the injected failures themselves
        // (testing-trust.rst).
        v.push(s(
            "probe undoes everything on every error path (sysfs bind, every fault point)",
            1800,
            trust::probe_faults_bind,
        ));
        v.push(s(
            "probe undoes everything on every error path",
            3600,
            trust::probe_faults,
        ));
    }
    v.extend([
        // What the packages set up, before the module goes away.
        s(
            "install: udev rule: group pcifab reads, mutating ioctls still need CAP_SYS_ADMIN",
            180,
            install::group_access,
        ),
        s(
            "install: driver_override hands the MEP from switchtec to pcifab and back",
            240,
            install::driver_override,
        ),
        // pcifab's own driver of the DMA endpoint, before Linux's takes the endpoint over
        // for good (switchtec_dma cannot be unbound, dma_endpoint.rs).
        s(
            "dma endpoint: pcifab binds it and copies through every channel",
            180,
            pcifab_dmaep::pcifab_copies_through_every_channel,
        ),
        s(
            "dma endpoint: pcifab copies between user buffers through it",
            240,
            pcifab_dmaep::pcifab_copies_user_buffers,
        ),
        s(
            "dma endpoint: pcifab fails cleanly on lying completions",
            240,
            pcifab_dmaep::pcifab_fails_cleanly_on_lying_completions,
        ),
        s(
            "dma endpoint: a copier waiting behind a stalled copy can be killed",
            180,
            pcifab_dmaep::copier_waiting_for_channels_can_be_killed,
        ),
        s(
            "dma endpoint: REGISTER and UNREGISTER beside a stalled copy end within 1 s; \
             unbind aborts the copy",
            240,
            pcifab_dmaep::registration_beside_stalled_copy,
        ),
        s(
            "dma endpoint: h0 copies into a buffer h1 registered for it, and nothing once h1 \
             unregisters it",
            240,
            pcifab_dmaep::peer_copies_into_registered_buffer,
        ),
        s(
            "dma endpoint: `pcifab p2p receive` on h1 saves exactly what h0's `pcifab p2p copy \
             --to peer:` sent",
            180,
            pcifab_dmaep::cli_receive_gets_the_peers_copy,
        ),
        // Its name holds "hostile firmware": the debug-pax-2 cell (lane 2) runs it.
        s(
            "dma endpoint: fabric commands under hostile firmware: every reply checked, no \
             pages leaked, no splat",
            180,
            pcifab_dmaep::fabric_commands_under_lying_firmware,
        ),
        s(
            "dma endpoint: Linux's switchtec_dma passes dmatest on every channel",
            900,
            dma_endpoint::linux_driver_passes_dmatest,
        ),
        // `make check-fabric-dma` only (needs --switchtec-dma; a boot of its own, as
        // Microchip's module has the name of Linux's).
        s(
            FABRIC_DMA_SCENARIO,
            900,
            fabric_dma::fabric_client_copies_into_peer_buffers,
        ),
        s("rmmod pcifab in every host", 120, identity::rmmod_pcifab),
        // Before the hot removal: QEMU 11.1 aborts after the device_del of h0's MEP
        // (testing.rst), and a dead guest cannot be scanned.
        s(
            "kmemleak: no leaks in any host",
            900,
            identity::kmemleak_clean,
        ),
    ]);
    if soak {
        // Soak only while QEMU 11.1 aborts a few seconds after the device_del of the MEP,
        // often before the scenario's own checks are done on the slow sanitizer kernel
        // (testing.rst, the notes).
        v.push(s(
            "MEP hot removal by QMP device_del with a command in flight: ENODEV",
            240,
            mgmt::hot_removal,
        ));
    }
    v
}

/// The scenario of Microchip's fabric-mode driver (`--switchtec-dma`).
pub const FABRIC_DMA_SCENARIO: &str =
    "fabric dma: Microchip's fabric_client copies from h0 into h1's buffers on every channel";

/// Checks of the harness and agent themselves (`pcifab-harness selftest`).
/// They need no driver; the last one leaves host 0 unusable on purpose.
pub fn selftest() -> Vec<Scenario> {
    let s = |name, secs, run| Scenario {
        name,
        timeout: Duration::from_secs(secs),
        run,
    };
    vec![
        s(
            "agent reports exit codes and merged output",
            30,
            selftest::st_exit_codes,
        ),
        s(
            "agent output is binary-safe and large",
            60,
            selftest::st_binary,
        ),
        s(
            "agent kills a timed-out command's process group",
            30,
            selftest::st_timeout,
        ),
        s(
            "a stopped guest fails the command and is fenced off",
            60,
            selftest::st_hung_guest,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let all = all();
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| b.name != a.name));
        }
    }
}
