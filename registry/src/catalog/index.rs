//! The catalog's indexes: entries ordered by key, and entries by a hash of a name.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

use super::{ServiceEntry, ServiceKey};

/// An entry ordered and looked up by its key, so the key is stored once: in the entry.
#[derive(Clone)]
pub(super) struct ByKey(pub(super) Arc<ServiceEntry>);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl PartialOrd for ByKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&other.0.key)
    }
}

impl Borrow<ServiceKey> for ByKey {
    fn borrow(&self) -> &ServiceKey {
        &self.0.key
    }
}

/// The entries of one index bucket, sorted by key. Almost always one, held inline.
pub(super) enum Bucket {
    One(Arc<ServiceEntry>),
    Many(Box<[Arc<ServiceEntry>]>),
}

impl Bucket {
    pub(super) fn as_slice(&self) -> &[Arc<ServiceEntry>] {
        match self {
            Bucket::One(e) => std::slice::from_ref(e),
            Bucket::Many(v) => v,
        }
    }

    /// Adds `e`, or replaces the entry with the same key.
    fn insert(&mut self, e: &Arc<ServiceEntry>) {
        let slice = self.as_slice();
        match slice.binary_search_by(|x| x.key.cmp(&e.key)) {
            Ok(at) => match self {
                Bucket::One(x) => *x = e.clone(),
                Bucket::Many(v) => v[at] = e.clone(),
            },
            Err(at) => {
                let mut v = Vec::with_capacity(slice.len() + 1);
                v.extend_from_slice(&slice[..at]);
                v.push(e.clone());
                v.extend_from_slice(&slice[at..]);
                *self = Bucket::Many(v.into_boxed_slice());
            }
        }
    }

    /// Removes the entry with `key`; returns whether the bucket is now empty.
    fn remove(&mut self, key: &ServiceKey) -> bool {
        let slice = self.as_slice();
        let Ok(at) = slice.binary_search_by(|x| x.key.cmp(key)) else {
            return false;
        };
        if slice.len() == 1 {
            return true;
        }
        let rest: Vec<Arc<ServiceEntry>> = slice
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != at)
            .map(|(_, e)| e.clone())
            .collect();
        *self = match <[_; 1]>::try_from(rest) {
            Ok([one]) => Bucket::One(one),
            Err(rest) => Bucket::Many(rest.into_boxed_slice()),
        };
        false
    }
}

/// Entries by a hash of one of their names (the FQDN, or the namespace and name): the name is
/// not stored again, the entries hold it. Different names can share a bucket (a hash
/// collision), so readers compare the name itself. The hash is keyed per catalog.
#[derive(Default)]
pub(super) struct Index {
    hasher: RandomState,
    pub(super) buckets: HashMap<u64, Bucket>,
}

impl Index {
    pub(super) fn hash(&self, name: impl std::hash::Hash) -> u64 {
        self.hasher.hash_one(name)
    }

    pub(super) fn get(&self, hash: u64) -> &[Arc<ServiceEntry>] {
        self.buckets.get(&hash).map(Bucket::as_slice).unwrap_or(&[])
    }

    pub(super) fn insert(&mut self, hash: u64, e: &Arc<ServiceEntry>) {
        match self.buckets.get_mut(&hash) {
            Some(bucket) => bucket.insert(e),
            None => {
                self.buckets.insert(hash, Bucket::One(e.clone()));
            }
        }
    }

    pub(super) fn remove(&mut self, hash: u64, key: &ServiceKey) {
        if self.buckets.get_mut(&hash).is_some_and(|b| b.remove(key)) {
            self.buckets.remove(&hash);
        }
    }
}
