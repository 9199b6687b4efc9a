// SPDX-License-Identifier: GPL-2.0-only

//! The pools' free and pre-emptible capacity, kept up to date device by device, so a pass
//! can ask "does this shape fit?" and "would pre-emption at priority p make it fit?" without
//! looking at every device.
//!
//! Each healthy device of a whole, partition or hybrid pool has a **level**: the lowest
//! request priority that could have it whole, pre-empting what holds it (0: free; one
//! above the highest priority of its leases when all of them allow pre-emption;
//! `u64::MAX`: never), and each of its VFs one (the VF's own lease, and the device's whole
//! leases). A request of priority p can have `count` of them iff at least `count` levels
//! are at most p. A shape fits the free pool iff enough levels are 0. In a time-slice pool
//! a device is 0 while it has room for another sharer, else `u64::MAX`; pre-emption does not reach those pools.

use std::collections::{BTreeMap, BTreeSet};

/// A multiset of levels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Hist(BTreeMap<u64, usize>);

impl Hist {
    fn add(&mut self, level: u64) {
        *self.0.entry(level).or_default() += 1;
    }

    fn sub(&mut self, level: u64) {
        if let Some(n) = self.0.get_mut(&level) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(&level);
            }
        }
    }

    /// How many levels are <= p (O(distinct levels), at most the priorities in use + 2).
    pub fn at_most(&self, p: u64) -> usize {
        self.0.range(..=p).map(|(_, n)| *n).sum()
    }
}

/// The levels of one pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct PoolCapacity {
    pub devices: Hist,
    pub vfs: Hist,
    pub vfs_by_profile: BTreeMap<String, Hist>,
    /// Free devices (level 0) in device order: where a whole-GPU request goes.
    pub free_devices: BTreeSet<usize>,
    /// Devices without whole leases and with free VFs, in the order VF requests take them
    /// (untouched last, then fewest free VFs, then device order), all and by profile.
    pub vf_order: BTreeSet<(bool, usize, usize)>,
    pub vf_order_by_profile: BTreeMap<String, BTreeSet<(bool, usize, usize)>>,
}

/// One device's contribution (none: unhealthy).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct DeviceLevels {
    pub device: u64,
    pub vfs: Vec<u64>,
    /// No whole leases on it.
    pub whole_free: bool,
}

impl DeviceLevels {
    /// Its place in `vf_order`, if it has one.
    fn vf_key(&self, di: usize) -> Option<(bool, usize, usize)> {
        let nfree = self.vfs.iter().filter(|l| **l == 0).count();
        (self.whole_free && nfree > 0).then_some((nfree == self.vfs.len(), nfree, di))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Capacity {
    pub devices: Vec<Option<DeviceLevels>>,
    pub pools: Vec<PoolCapacity>,
}

impl Capacity {
    pub fn new(pools: usize, devices: usize) -> Self {
        Self {
            devices: vec![None; devices],
            pools: vec![PoolCapacity::default(); pools],
        }
    }

    /// Replaces device `di`'s contribution (of `pool`, VFs of `profile`).
    pub fn set(&mut self, di: usize, pool: usize, profile: &str, new: Option<DeviceLevels>) {
        if self.devices.get(di) == Some(&new) {
            return;
        }
        let Some(p) = self.pools.get_mut(pool) else {
            return;
        };
        if let Some(old) = self.devices.get_mut(di).and_then(|d| d.take()) {
            p.devices.sub(old.device);
            if old.device == 0 {
                p.free_devices.remove(&di);
            }
            if let Some(k) = old.vf_key(di) {
                p.vf_order.remove(&k);
                if let Some(o) = p.vf_order_by_profile.get_mut(profile) {
                    o.remove(&k);
                    if o.is_empty() {
                        p.vf_order_by_profile.remove(profile);
                    }
                }
            }
            for &v in &old.vfs {
                p.vfs.sub(v);
                if let Some(h) = p.vfs_by_profile.get_mut(profile) {
                    h.sub(v);
                    if h.0.is_empty() {
                        p.vfs_by_profile.remove(profile);
                    }
                }
            }
        }
        if let Some(n) = &new {
            p.devices.add(n.device);
            if n.device == 0 {
                p.free_devices.insert(di);
            }
            if let Some(k) = n.vf_key(di) {
                p.vf_order.insert(k);
                p.vf_order_by_profile
                    .entry(profile.to_string())
                    .or_default()
                    .insert(k);
            }
            if !n.vfs.is_empty() && !p.vfs_by_profile.contains_key(profile) {
                p.vfs_by_profile
                    .insert(profile.to_string(), Hist::default());
            }
            let by_profile = p.vfs_by_profile.get_mut(profile);
            if let Some(h) = by_profile {
                for &v in &n.vfs {
                    h.add(v);
                }
            }
            for &v in &n.vfs {
                p.vfs.add(v);
            }
        }
        if let Some(d) = self.devices.get_mut(di) {
            *d = new;
        }
    }
}
