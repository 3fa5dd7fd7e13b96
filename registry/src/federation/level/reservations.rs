//! Names held for owners that are away, indexed so that a claim costs O(1) whatever is held:
//! by name (is this name held, for whom), by owner key (release what a service held), by
//! cluster (release what a subtree held) and by age (expire the oldest).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use smol_str::SmolStr;

use crate::catalog::ServiceKey;

/// Seconds since the Unix epoch (0 for a clock before it).
pub fn unix_now() -> u64 {
    unix(SystemTime::now())
}

pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One owner's reservation: since when (Unix seconds) and which names.
#[derive(Debug)]
struct Held {
    since: u64,
    names: Vec<Arc<str>>,
}

/// The reserved names of a level, with what changed since the ledger last looked.
#[derive(Debug, Default)]
pub struct Reservations {
    names: HashMap<Arc<str>, ServiceKey>,
    keys: HashMap<ServiceKey, Held>,
    clusters: HashMap<SmolStr, HashSet<ServiceKey>>,
    by_age: BTreeSet<(u64, ServiceKey)>,
    /// Names whose holding changed since [`Reservations::take_changed`] (kept only once a
    /// ledger takes them: without one nothing would ever drain it).
    changed: Vec<Arc<str>>,
    track: bool,
    /// How long a name is held for an owner that stays away; zero: until it is back.
    hold: Duration,
}

impl Reservations {
    pub fn set_hold(&mut self, hold: Duration) {
        self.hold = hold;
    }

    pub fn hold(&self) -> Duration {
        self.hold
    }

    /// How many names are held.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Who `name` is held for.
    pub fn get(&self, name: &str) -> Option<&ServiceKey> {
        self.names.get(name)
    }

    /// Who `name` is held for, and since when.
    pub fn holding(&self, name: &str) -> Option<(&ServiceKey, u64)> {
        let key = self.names.get(name)?;
        Some((key, self.keys.get(key).map_or(0, |h| h.since)))
    }

    /// Is any name held for a service of `cluster`?
    pub fn holds_cluster(&self, cluster: &str) -> bool {
        self.clusters.contains_key(cluster)
    }

    /// Since when the oldest reservation is held (Unix seconds).
    pub fn oldest(&self) -> Option<u64> {
        self.by_age.first().map(|(since, _)| *since)
    }

    /// When the oldest reservation expires (Unix seconds); `None` when nothing is held or
    /// names are held until their owner is back.
    pub fn next_expiry(&self) -> Option<u64> {
        (!self.hold.is_zero())
            .then(|| self.oldest())
            .flatten()
            .map(|since| since.saturating_add(self.hold.as_secs()))
    }

    /// Hold `name` for `key` (since `since`, or earlier if the key already holds names).
    pub fn insert(&mut self, name: Arc<str>, key: ServiceKey, since: u64) {
        if let Some(previous) = self.names.get(&name) {
            if *previous == key {
                return;
            }
            let previous = previous.clone();
            self.forget_name(&name, &previous);
        }
        self.names.insert(name.clone(), key.clone());
        if self.track {
            self.changed.push(name.clone());
        }
        match self.keys.get_mut(&key) {
            Some(held) => {
                held.names.push(name);
                if since < held.since {
                    self.by_age.remove(&(held.since, key.clone()));
                    held.since = since;
                    self.by_age.insert((since, key));
                }
            }
            None => {
                self.clusters
                    .entry(key.cluster.clone())
                    .or_default()
                    .insert(key.clone());
                self.by_age.insert((since, key.clone()));
                self.keys.insert(
                    key,
                    Held {
                        since,
                        names: vec![name],
                    },
                );
            }
        }
    }

    /// `name` no longer held for `key` (the name moves to another owner).
    fn forget_name(&mut self, name: &str, key: &ServiceKey) {
        let empty = match self.keys.get_mut(key) {
            Some(held) => {
                held.names.retain(|n| &**n != name);
                held.names.is_empty()
            }
            None => false,
        };
        if empty {
            self.release(key);
        }
    }

    /// Free every name held for `key`. Returns how many.
    pub fn release(&mut self, key: &ServiceKey) -> usize {
        let Some(held) = self.keys.remove(key) else {
            return 0;
        };
        self.by_age.remove(&(held.since, key.clone()));
        if let Some(keys) = self.clusters.get_mut(key.cluster.as_str()) {
            keys.remove(key);
            if keys.is_empty() {
                self.clusters.remove(key.cluster.as_str());
            }
        }
        let n = held.names.len();
        for name in held.names {
            if self.names.get(&name) == Some(key) {
                self.names.remove(&name);
            }
            if self.track {
                self.changed.push(name);
            }
        }
        n
    }

    /// Free every name held for a service of one of `clusters`.
    pub fn release_clusters<'a>(&mut self, clusters: impl IntoIterator<Item = &'a str>) {
        for cluster in clusters {
            for key in self.clusters.remove(cluster).unwrap_or_default() {
                self.release(&key);
            }
        }
    }

    /// Free what has been held longer than the hold (at `now`, Unix seconds). Returns the
    /// owners whose names were freed. Costs O(log n) when nothing expires.
    pub fn expire(&mut self, now: u64) -> Vec<ServiceKey> {
        if self.hold.is_zero() {
            return Vec::new();
        }
        let cutoff = now.saturating_sub(self.hold.as_secs());
        let mut gone = Vec::new();
        while let Some((since, key)) = self.by_age.first().cloned() {
            if since > cutoff {
                break;
            }
            self.release(&key);
            gone.push(key);
        }
        gone
    }

    /// Every held name with its owner and since when.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &ServiceKey, u64)> {
        self.names
            .iter()
            .map(|(n, k)| (n, k, self.keys.get(k).map_or(0, |h| h.since)))
    }

    /// Record the names whose holding changes, for [`Reservations::take_changed`].
    pub fn track_changes(&mut self) {
        self.track = true;
    }

    /// Names whose holding changed since the last call.
    pub fn take_changed(&mut self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: &str, n: &str) -> ServiceKey {
        ServiceKey::new(c, "shop", n)
    }

    #[test]
    fn names_are_released_by_owner_by_cluster_and_by_age() {
        let mut r = Reservations::default();
        r.track_changes();
        r.set_hold(Duration::from_secs(100));
        r.insert("shop/api".into(), key("c2", "api"), 1000);
        r.insert("api.example".into(), key("c2", "api"), 1000);
        r.insert("shop/web".into(), key("c2", "web"), 1050);
        r.insert("shop/db".into(), key("c3", "db"), 1010);
        assert_eq!(r.len(), 4);
        assert_eq!(r.oldest(), Some(1000));
        assert_eq!(r.next_expiry(), Some(1100));
        assert!(r.holds_cluster("c3"));
        assert_eq!(r.take_changed().len(), 4);

        // Nothing is due before the hold is over.
        assert_eq!(r.expire(1099), vec![]);
        assert_eq!(r.expire(1100), vec![key("c2", "api")]);
        assert_eq!(r.get("shop/api"), None);
        assert_eq!(r.get("api.example"), None);
        let mut changed = r.take_changed();
        changed.sort();
        assert_eq!(
            changed,
            vec![Arc::from("api.example"), Arc::from("shop/api")]
        );

        r.release_clusters(["c2"]);
        assert_eq!(r.get("shop/web"), None);
        assert_eq!(r.get("shop/db"), Some(&key("c3", "db")));
        assert_eq!(r.release(&key("c3", "db")), 1);
        assert!(r.is_empty() && !r.holds_cluster("c3") && r.oldest().is_none());
    }

    #[test]
    fn a_name_moves_to_its_new_holder_and_a_zero_hold_never_expires() {
        let mut r = Reservations::default();
        r.insert("shop/api".into(), key("c2", "api"), 5);
        r.insert("shop/api".into(), key("c3", "api"), 7);
        assert_eq!(r.get("shop/api"), Some(&key("c3", "api")));
        // c2 held nothing else: its reservation is gone entirely.
        assert_eq!(r.release(&key("c2", "api")), 0);
        assert_eq!(r.oldest(), Some(7));
        assert_eq!(r.next_expiry(), None);
        assert_eq!(r.expire(u64::MAX), vec![]);
        assert_eq!(r.holding("shop/api"), Some((&key("c3", "api"), 7)));
        // Untracked, changes are not kept.
        assert!(r.take_changed().is_empty());
    }
}
