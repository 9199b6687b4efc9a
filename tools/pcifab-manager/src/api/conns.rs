// SPDX-License-Identifier: GPL-2.0-only

//! The API's connection table: how many connections it holds, from whom, and which may be
//! dropped to make room (Documentation/manager-api.rst, "Connections").
//!
//! A connection is *stalled* while it has no request being served: in its TLS handshake,
//! sending a request head or body, or idle between requests. Stalled connections cannot
//! hold the places:
//!
//! - a new connection when `[api] max_connections` are held evicts (closes) the
//!   longest-stalled connection of the peer address that holds the most; a connection
//!   serving a request is never evicted;
//! - a peer holding `[api] max_connections_per_peer` connections gets no more: its new ones
//!   wait until one of its own ends (its stalled ones end at their time-outs), so one peer
//!   cannot take the places of others, while a burst of one client's requests queues as
//!   it did in the listen queue.
//!
//! A connection not admitted yet waits, as a task holding only its socket, up to
//! [`PENDING_WAIT`]; at most [`Conns::max_pending`] wait at once, more are closed at once.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{atomic::Ordering, Arc, Mutex},
    time::Instant,
};

use tokio::sync::Notify;

/// Longest a connection waits to be admitted before it is closed.
pub const PENDING_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

use crate::metrics::HttpStats;

struct Entry {
    peer: IpAddr,
    /// Since when it has been stalled (none: a request is being served).
    stalled_since: Option<Instant>,
    evict: Arc<Notify>,
}

/// The connections held.
pub struct Conns {
    max: usize,
    per_peer: usize,
    /// Most connections waiting to be admitted at once.
    pub max_pending: usize,
    pending: std::sync::atomic::AtomicUsize,
    /// Notified when a place may have come free.
    pub freed: Notify,
    table: Mutex<(u64, HashMap<u64, Entry>)>,
    stats: Arc<HttpStats>,
}

/// One admitted connection; dropping it gives its place back.
pub struct Slot {
    conns: Arc<Conns>,
    id: u64,
    /// Notified when the connection is evicted: its task drops it.
    pub evicted: Arc<Notify>,
}

impl Conns {
    pub fn new(max: usize, per_peer: usize, stats: Arc<HttpStats>) -> Arc<Self> {
        Arc::new(Self {
            max,
            per_peer,
            max_pending: max.saturating_mul(4),
            pending: Default::default(),
            freed: Notify::new(),
            table: Mutex::new((0, HashMap::new())),
            stats,
        })
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.table.lock().map(|t| t.1.len()).unwrap_or(0)
    }

    /// Counts a connection closed because no place came free in time.
    pub fn refused(&self) {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection waiting to be admitted until the guard is dropped; none when
    /// [`Conns::max_pending`] wait already.
    pub fn pend(self: &Arc<Self>) -> Option<Pending> {
        let n = self.pending.fetch_add(1, Ordering::Relaxed);
        let p = Pending(self.clone());
        (n < self.max_pending).then_some(p)
    }

    /// Admits a connection from `peer` once there is a place, within [`PENDING_WAIT`].
    pub async fn admit_waiting(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let since = Instant::now();
        loop {
            if let Some(s) = self.admit(peer) {
                return Some(s);
            }
            if since.elapsed() >= PENDING_WAIT {
                self.refused();
                return None;
            }
            // A place comes free when a connection ends or finishes a request; the time
            // bound covers a notice sent between the look and the wait.
            let _ =
                tokio::time::timeout(std::time::Duration::from_millis(50), self.freed.notified())
                    .await;
        }
    }

    /// Admits a new connection from `peer`, evicting a stalled one when all places are
    /// taken; none when the peer holds its most or no connection may go.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let Ok(mut guard) = self.table.lock() else {
            return None;
        };
        let (next, table) = &mut *guard;
        if table.values().filter(|e| e.peer == peer).count() >= self.per_peer {
            return None;
        }
        if table.len() >= self.max {
            // The peer holding the most connections (with a stalled one) gives up its
            // longest-stalled one; among peers holding as many, the longest-stalled goes.
            let mut counts: HashMap<IpAddr, usize> = HashMap::new();
            for e in table.values() {
                *counts.entry(e.peer).or_default() += 1;
            }
            let victim = table
                .iter()
                .filter_map(|(id, e)| {
                    let since = e.stalled_since?;
                    let n = counts.get(&e.peer).copied().unwrap_or(0);
                    Some((n, std::cmp::Reverse(since), *id))
                })
                .max()
                .map(|(_, _, id)| id)?;
            if let Some(e) = table.remove(&victim) {
                e.evict.notify_one();
                self.stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let id = *next;
        *next += 1;
        let evicted = Arc::new(Notify::new());
        table.insert(
            id,
            Entry {
                peer,
                stalled_since: Some(Instant::now()),
                evict: evicted.clone(),
            },
        );
        self.stats.connections.store(table.len(), Ordering::Relaxed);
        Some(Slot {
            conns: self.clone(),
            id,
            evicted,
        })
    }

    fn set_serving(&self, id: u64, serving: bool) {
        if let Ok(mut t) = self.table.lock() {
            if let Some(e) = t.1.get_mut(&id) {
                e.stalled_since = if serving { None } else { Some(Instant::now()) };
            }
        }
        if !serving {
            self.freed.notify_waiters();
        }
    }
}

impl Slot {
    /// Marks the connection as serving a request until the guard is dropped: it cannot be
    /// evicted meanwhile.
    pub fn serving(&self) -> Serving<'_> {
        self.conns.set_serving(self.id, true);
        Serving(self)
    }
}

/// See [`Conns::pend`].
pub struct Pending(Arc<Conns>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

/// See [`Slot::serving`].
pub struct Serving<'a>(&'a Slot);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.conns.set_serving(self.0.id, false);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut t) = self.conns.table.lock() {
            t.1.remove(&self.id);
            self.conns
                .stats
                .connections
                .store(t.1.len(), Ordering::Relaxed);
        }
        self.conns.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn stalled_connections_make_room_and_serving_ones_do_not() {
        let c = Conns::new(4, 2, Arc::default());
        let a1 = c.admit(ip("10.0.0.1")).expect("a1");
        let a2 = c.admit(ip("10.0.0.1")).expect("a2");
        // The per-peer limit: a gets no third, and takes nobody's place.
        assert!(c.admit(ip("10.0.0.1")).is_none());
        let b1 = c.admit(ip("10.0.0.2")).expect("b1");
        let _b2 = c.admit(ip("10.0.0.2")).expect("b2");
        assert_eq!(c.held(), 4);
        // Full: a newcomer evicts the longest-stalled connection of a heaviest peer; a's
        // serve requests, so b1 goes.
        let s1 = a1.serving();
        let _s2 = a2.serving();
        let d1 = c.admit(ip("10.0.0.4")).expect("d1");
        assert_eq!(c.held(), 4, "one evicted for the newcomer");
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 1);
        // Then b2 (b and d hold one each now, b2 stalled longest), then d1.
        let _e1 = c.admit(ip("10.0.0.5")).expect("e1");
        let _f1 = c.admit(ip("10.0.0.6")).expect("f1");
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 3);
        // Only a's (serving) and e1, f1 are left; with a1 idle again, it is the oldest
        // stalled of the heaviest peer.
        drop(s1);
        let _g1 = c.admit(ip("10.0.0.7")).expect("g1");
        assert_eq!(c.stats.evicted.load(Ordering::Relaxed), 4);
        // Dropping an evicted slot changes nothing; dropping a held one frees its place.
        drop(b1);
        drop(d1);
        assert_eq!(c.held(), 4);
        drop(a1);
        assert_eq!(c.held(), 4, "a1 was evicted already");
        drop(_e1);
        assert_eq!(c.held(), 3);
        assert_eq!(c.stats.connections.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn all_serving_means_no_place() {
        let c = Conns::new(1, 1, Arc::default());
        let a = c.admit(ip("10.0.0.1")).expect("a");
        let _s = a.serving();
        assert!(c.admit(ip("10.0.0.2")).is_none());
        assert_eq!(c.held(), 1);
        // Waiting connections are bounded.
        let pending: Vec<_> = (0..4).map(|_| c.pend().expect("pending")).collect();
        assert!(c.pend().is_none(), "a fifth waits beyond max_pending");
        drop(pending);
        assert!(c.pend().is_some());
    }
}
