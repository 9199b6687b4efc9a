// SPDX-License-Identifier: GPL-2.0-only

//! pcifab-manager: the fabric manager for pcifab fabrics. Leases of whole GPUs and VFs,
//! priorities with aging, pre-emption, time-slicing and spatial partitions, telemetry
//! thresholds and host failover, on top of the driver's BIND/UNBIND/MOVE and MRPC ioctls.
//! `Documentation/manager.rst` describes it.

pub mod api;
pub mod auth;
pub mod bench;
pub mod blockdev;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod driver;
pub mod etcd;
pub mod executor;
pub mod liveness;
pub mod metrics;
pub mod notify;
pub mod protocol;
pub mod redfish;
pub mod scheduler;
pub mod scrub;
pub mod socket;
pub mod spool;
pub mod stats;
pub mod store;
pub mod telemetry;
