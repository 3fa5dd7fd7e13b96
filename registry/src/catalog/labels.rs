//! A service's pass-through labels, with the well-known keys interned.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use smol_str::SmolStr;

/// Label keys every entry may carry, allocated once and shared by all entries that use them.
/// A fixed list, so the set of shared keys cannot grow with input.
fn shared_label_key(key: &str) -> Arc<str> {
    static KNOWN: OnceLock<[Arc<str>; 5]> = OnceLock::new();
    let known = KNOWN.get_or_init(|| {
        [
            Arc::from(xcc_proto::names::SERVICE_PORT_ANNOTATION),
            Arc::from(xcc_proto::names::VIP_ANNOTATION),
            Arc::from(xcc_proto::mapping::ORIGIN_NAMESPACE_ANNOTATION),
            Arc::from(xcc_proto::mapping::ORIGIN_NAME_ANNOTATION),
            Arc::from(xcc_proto::propagation::CHANGED_AT_ANNOTATION),
        ]
    });
    known
        .iter()
        .find(|k| ***k == *key)
        .cloned()
        .unwrap_or_else(|| Arc::from(key))
}

/// A service's pass-through labels, stored compactly: a boxed slice of `(key, value)` pairs
/// sorted by key with unique keys (so iteration order is the same as a `BTreeMap`'s), the
/// well-known annotation keys shared between entries, short values inline. No labels allocate
/// nothing.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels(pub(super) Box<[(Arc<str>, SmolStr)]>);

impl Labels {
    pub fn new() -> Self {
        Self::default()
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.position(key).ok().map(|i| &*self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Set `key` to `value`; returns the previous value, as `BTreeMap::insert` does.
    pub fn insert(&mut self, key: String, value: String) -> Option<String> {
        match self.position(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, SmolStr::from(value)).into()),
            Err(i) => {
                let mut pairs = std::mem::take(&mut self.0).into_vec();
                pairs.insert(i, (shared_label_key(&key), SmolStr::from(value)));
                self.0 = pairs.into_boxed_slice();
                None
            }
        }
    }

    /// The pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| &**k)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `self` and `other` hold the same pairs, `key` aside.
    pub fn eq_except(&self, other: &Labels, key: &str) -> bool {
        self.iter()
            .filter(|(k, _)| *k != key)
            .eq(other.iter().filter(|(k, _)| *k != key))
    }

    pub fn to_btree_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    /// Sorted by key; of repeated keys the last value wins (as collecting into a `BTreeMap`).
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut pairs: Vec<(Arc<str>, SmolStr)> = iter
            .into_iter()
            .map(|(k, v)| (shared_label_key(k.as_ref()), SmolStr::new(v)))
            .collect();
        // Stable sort keeps equal keys in input order; keep the last of each run.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut deduped: Vec<(Arc<str>, SmolStr)> = Vec::with_capacity(pairs.len());
        for pair in pairs {
            match deduped.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => deduped.push(pair),
            }
        }
        Self(deduped.into_boxed_slice())
    }
}

impl From<&BTreeMap<String, String>> for Labels {
    fn from(map: &BTreeMap<String, String>) -> Self {
        map.iter().collect()
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self::from(&map)
    }
}

impl From<&Labels> for BTreeMap<String, String> {
    fn from(labels: &Labels) -> Self {
        labels.to_btree_map()
    }
}

impl PartialEq<BTreeMap<String, String>> for Labels {
    fn eq(&self, other: &BTreeMap<String, String>) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .zip(other.iter())
                .all(|((a, b), (c, d))| a == c && b == d)
    }
}
