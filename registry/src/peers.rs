//! Who this registry talks to: Hamlet consumers connected to it and the remote registries it
//! imports from, with live counters. Tasks own an `Arc<PeerStats>` and update it lock-free; the
//! admin API reads a consistent-enough copy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;
use xcc_controller::plumbing::lock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    HamletConsumer,
    RemoteRegistry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum PeerState {
    Connecting = 1,
    Connected = 2,
    Backoff = 3,
    Failed = 4,
    Stopped = 5,
}

impl PeerState {
    fn from_u8(v: u8) -> Self {
        match v {
            2 => PeerState::Connected,
            3 => PeerState::Backoff,
            4 => PeerState::Failed,
            5 => PeerState::Stopped,
            _ => PeerState::Connecting,
        }
    }
}

/// Live state of one peer.
pub struct PeerStats {
    pub kind: PeerKind,
    pub name: String,
    pub address: String,
    identity: Mutex<String>,
    state: AtomicU8,
    connected_since: Mutex<Option<SystemTime>>,
    last_sync: Mutex<Option<SystemTime>>,
    last_error: Mutex<String>,
    pub records: AtomicU64,
    pub sent: AtomicU64,
    pub acks: AtomicU64,
    pub nacks: AtomicU64,
    pub reconnects: AtomicU64,
    changes: tokio::sync::watch::Sender<u64>,
}

impl PeerStats {
    fn changed(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn set_state(&self, state: PeerState) {
        let prev = self.state.swap(state as u8, Ordering::Relaxed);
        if state == PeerState::Connected && prev != PeerState::Connected as u8 {
            *lock(&self.connected_since) = Some(SystemTime::now());
        }
        if state != PeerState::Connected {
            *lock(&self.connected_since) = None;
        }
        self.changed();
    }
    pub fn state(&self) -> PeerState {
        PeerState::from_u8(self.state.load(Ordering::Relaxed))
    }
    pub fn set_identity(&self, identity: impl Into<String>) {
        *lock(&self.identity) = identity.into();
    }
    pub fn identity(&self) -> String {
        lock(&self.identity).clone()
    }
    pub fn set_error(&self, error: impl Into<String>) {
        *lock(&self.last_error) = error.into();
        self.changed();
    }
    pub fn last_error(&self) -> String {
        lock(&self.last_error).clone()
    }
    pub fn mark_synced(&self) {
        *lock(&self.last_sync) = Some(SystemTime::now());
        self.changed();
    }
    pub fn last_sync(&self) -> Option<SystemTime> {
        *lock(&self.last_sync)
    }
    pub fn connected_since(&self) -> Option<SystemTime> {
        *lock(&self.connected_since)
    }
}

type PeerMap = BTreeMap<(u8, String), Arc<PeerStats>>;

/// The table of peers; clones share it.
#[derive(Clone)]
pub struct PeerTable {
    peers: Arc<RwLock<PeerMap>>,
    /// Bumped on every state, sync or error change of any peer (and on register/remove).
    changes: tokio::sync::watch::Sender<u64>,
}

impl Default for PeerTable {
    fn default() -> Self {
        Self {
            peers: Arc::default(),
            changes: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// Removes its peer from the table when dropped.
pub struct PeerGuard {
    table: PeerTable,
    key: (u8, String),
    pub stats: Arc<PeerStats>,
}

impl Drop for PeerGuard {
    fn drop(&mut self) {
        let mut peers = xcc_controller::plumbing::write(&self.table.peers);
        if peers
            .get(&self.key)
            .is_some_and(|p| Arc::ptr_eq(p, &self.stats))
        {
            peers.remove(&self.key);
        }
        self.table.changes.send_modify(|v| *v = v.wrapping_add(1));
    }
}

impl PeerTable {
    /// Register a peer; it stays listed while the guard lives.
    pub fn register(
        &self,
        kind: PeerKind,
        name: impl Into<String>,
        identity: impl Into<String>,
        address: impl Into<String>,
    ) -> PeerGuard {
        let name = name.into();
        let stats = Arc::new(PeerStats {
            kind,
            name: name.clone(),
            address: address.into(),
            identity: Mutex::new(identity.into()),
            state: AtomicU8::new(PeerState::Connecting as u8),
            connected_since: Mutex::new(None),
            last_sync: Mutex::new(None),
            last_error: Mutex::new(String::new()),
            records: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            acks: AtomicU64::new(0),
            nacks: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            changes: self.changes.clone(),
        });
        let key = (kind as u8, name);
        xcc_controller::plumbing::write(&self.peers).insert(key.clone(), stats.clone());
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
        PeerGuard {
            table: self.clone(),
            key,
            stats,
        }
    }

    pub fn list(&self) -> Vec<Arc<PeerStats>> {
        xcc_controller::plumbing::read(&self.peers)
            .values()
            .cloned()
            .collect()
    }

    /// A receiver that sees a new value whenever any peer changes state, syncs or fails.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub fn count(&self, kind: PeerKind) -> usize {
        self.list().iter().filter(|p| p.kind == kind).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_removes_only_its_own_entry() {
        let t = PeerTable::default();
        let g1 = t.register(PeerKind::RemoteRegistry, "east", "", "127.0.0.1:1");
        g1.stats.set_state(PeerState::Connected);
        assert!(g1.stats.connected_since().is_some());
        let g2 = t.register(PeerKind::RemoteRegistry, "east", "", "127.0.0.1:2");
        drop(g1);
        assert_eq!(t.list().len(), 1);
        assert_eq!(t.list()[0].address, "127.0.0.1:2");
        drop(g2);
        assert!(t.list().is_empty());
    }
}
