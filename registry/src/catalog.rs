//! The catalog: a pure in-memory index of every service this registry knows — its own exports,
//! imports from remote registries and (later) announcements from its subtree. No I/O happens
//! here. Writers (stores, import clients) call [`Catalog::upsert`], [`Catalog::remove`] or
//! [`Catalog::replace_source`]; readers (the Hamlet server, the admin API) read under a short
//! lock and learn of changes through two broadcast channels: full [`CatalogEvent`]s for watchers,
//! and the FQDNs whose Hamlet view changed for Hamlet consumers.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use std::fmt;
use std::sync::{Arc, RwLock};

use tokio::sync::broadcast;

/// Identity of a service in the catalog.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Cluster that owns the service: this registry's cluster name for its own exports, the
    /// RemoteRegistry name for flat Hamlet imports.
    pub cluster: String,
    pub namespace: String,
    pub name: String,
}

impl ServiceKey {
    pub fn new(
        cluster: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.cluster, self.namespace, self.name)
    }
}

/// Where an entry came from; decides who may replace or remove it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// This registry's own exports (exported ServiceRecords, export files).
    Local,
    /// Imported through the RemoteRegistry of that name.
    Remote(String),
    /// Announced by the direct child of that name (its subtree).
    Child(String),
    /// Granted through the hierarchy (a query answered by an ancestor) via that parent link.
    Hierarchy(String),
}

impl Source {
    /// Served to Hamlet consumers and announced to the parent: this registry's subtree.
    pub fn in_subtree(&self) -> bool {
        matches!(self, Source::Local | Source::Child(_))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Local => f.write_str("local"),
            Source::Remote(name) => write!(f, "remote/{name}"),
            Source::Child(name) => write!(f, "child/{name}"),
            Source::Hierarchy(name) => write!(f, "hierarchy/{name}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub address: String,
    pub port: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    pub name: String,
    pub port: u32,
    pub protocol: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Origin {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    pub kind: String,
}

/// One service as the catalog holds it. `fqdn` is canonical (lowercase, no trailing dot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntry {
    pub key: ServiceKey,
    pub source: Source,
    pub fqdn: String,
    pub endpoints: Vec<Endpoint>,
    pub ports: Vec<NamedPort>,
    /// Pass-through labels (XCC: the `connectivity.tanzu.vmware.com/` annotations).
    pub labels: BTreeMap<String, String>,
    /// Clusters allowed to see the service; empty = every authenticated cluster.
    pub allowed_requesters: Vec<String>,
    pub origin: Option<Origin>,
    /// Catalog revision at which this content was stored (set by the catalog).
    pub revision: u64,
}

impl ServiceEntry {
    /// Whether `requester` (a cluster name, or `cluster/workload`) may see this service.
    pub fn admits(&self, requester: &str) -> bool {
        if self.allowed_requesters.is_empty() {
            return true;
        }
        let cluster = requester.split('/').next().unwrap_or(requester);
        self.allowed_requesters.iter().any(|allowed| {
            allowed == requester
                || allowed == cluster
                || allowed
                    .strip_prefix(cluster)
                    .is_some_and(|rest| rest.starts_with('/') && requester == cluster)
        })
    }

    fn same_content(&self, other: &ServiceEntry) -> bool {
        self.key == other.key
            && self.source == other.source
            && self.fqdn == other.fqdn
            && self.endpoints == other.endpoints
            && self.ports == other.ports
            && self.labels == other.labels
            && self.allowed_requesters == other.allowed_requesters
            && self.origin == other.origin
    }
}

/// A change, as watchers (admin `Watch`) see it.
#[derive(Clone, Debug)]
pub enum CatalogEvent {
    Upsert(Arc<ServiceEntry>),
    Delete(Arc<ServiceEntry>),
}

impl CatalogEvent {
    pub fn entry(&self) -> &Arc<ServiceEntry> {
        match self {
            CatalogEvent::Upsert(e) | CatalogEvent::Delete(e) => e,
        }
    }
}

/// Filter for [`Catalog::list`].
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    /// Label-wise FQDN suffix, case-insensitive.
    pub fqdn_suffix: Option<String>,
    pub source: Option<Source>,
}

impl ListFilter {
    fn matches(&self, e: &ServiceEntry) -> bool {
        if self.cluster.as_ref().is_some_and(|c| *c != e.key.cluster) {
            return false;
        }
        if self
            .namespace
            .as_ref()
            .is_some_and(|n| *n != e.key.namespace)
        {
            return false;
        }
        if self.source.as_ref().is_some_and(|s| *s != e.source) {
            return false;
        }
        if let Some(suffix) = &self.fqdn_suffix {
            return fqdn_has_suffix(&e.fqdn, suffix);
        }
        true
    }
}

/// `a.b.c` has suffixes `a.b.c`, `b.c`, `c` and `` (label-wise, case-insensitive).
pub fn fqdn_has_suffix(fqdn: &str, suffix: &str) -> bool {
    let fqdn = fqdn.trim_end_matches('.').to_ascii_lowercase();
    let suffix = suffix.trim_end_matches('.').to_ascii_lowercase();
    if suffix.is_empty() || fqdn == suffix {
        return true;
    }
    fqdn.len() > suffix.len()
        && fqdn.ends_with(&suffix)
        && fqdn.as_bytes()[fqdn.len() - suffix.len() - 1] == b'.'
}

/// A small sorted set of keys: almost always one element, so a Vec beats a BTreeSet node.
type Keys = Vec<ServiceKey>;

fn keys_insert(keys: &mut Keys, key: &ServiceKey) {
    if let Err(at) = keys.binary_search(key) {
        keys.insert(at, key.clone());
    }
}

fn keys_remove(index: &mut HashMap<String, Keys>, bucket: &str, key: &ServiceKey) {
    if let Some(keys) = index.get_mut(bucket) {
        if let Ok(at) = keys.binary_search(key) {
            keys.remove(at);
        }
        if keys.is_empty() {
            index.remove(bucket);
        }
    }
}

#[derive(Default)]
struct State {
    entries: BTreeMap<ServiceKey, Arc<ServiceEntry>>,
    /// Subtree entries (local exports and children's announcements) by FQDN: the Hamlet view
    /// picks the lowest key of each set.
    local_by_fqdn: HashMap<String, Keys>,
    /// Every entry by FQDN, and by `namespace/name`: lookups without scanning.
    by_fqdn: HashMap<String, Keys>,
    by_name: HashMap<String, Keys>,
    revision: u64,
}

fn name_bucket(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl State {
    fn hamlet_winner(&self, fqdn: &str) -> Option<Arc<ServiceEntry>> {
        let key = self.local_by_fqdn.get(fqdn)?.first()?;
        self.entries.get(key).cloned()
    }

    fn index(&mut self, e: &ServiceEntry) {
        keys_insert(self.by_fqdn.entry(e.fqdn.clone()).or_default(), &e.key);
        keys_insert(
            self.by_name
                .entry(name_bucket(&e.key.namespace, &e.key.name))
                .or_default(),
            &e.key,
        );
    }

    fn unindex(&mut self, e: &ServiceEntry) {
        keys_remove(&mut self.by_fqdn, &e.fqdn, &e.key);
        keys_remove(
            &mut self.by_name,
            &name_bucket(&e.key.namespace, &e.key.name),
            &e.key,
        );
    }

    fn resolve(&self, keys: Option<&Keys>) -> Vec<Arc<ServiceEntry>> {
        keys.map(|keys| {
            keys.iter()
                .filter_map(|k| self.entries.get(k).cloned())
                .collect()
        })
        .unwrap_or_default()
    }
}

/// Capacity of the change channels. A receiver that falls further behind gets `Lagged` and
/// resynchronises from current state, so this bounds memory, not correctness.
const CHANGE_CHANNEL_CAPACITY: usize = 4096;

/// The shared, cheaply clonable catalog handle.
#[derive(Clone)]
pub struct Catalog {
    state: Arc<RwLock<State>>,
    events: broadcast::Sender<CatalogEvent>,
    hamlet: broadcast::Sender<Arc<str>>,
}

impl Default for Catalog {
    fn default() -> Self {
        Self::new()
    }
}

impl Catalog {
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(CHANGE_CHANNEL_CAPACITY);
        let (hamlet, _) = broadcast::channel(CHANGE_CHANNEL_CAPACITY);
        Self {
            state: Arc::new(RwLock::new(State::default())),
            events,
            hamlet,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `entry` (its revision is assigned here). Returns the new revision, or `None` when
    /// the content was already stored (no event is emitted then).
    pub fn upsert(&self, entry: ServiceEntry) -> Option<u64> {
        let mut st = self.write();
        self.upsert_locked(&mut st, entry)
    }

    fn upsert_locked(&self, st: &mut State, mut entry: ServiceEntry) -> Option<u64> {
        let previous = st.entries.get(&entry.key).cloned();
        if let Some(prev) = &previous
            && prev.same_content(&entry)
        {
            return None;
        }
        st.revision += 1;
        entry.revision = st.revision;
        let entry = Arc::new(entry);
        let mut changed_fqdns: Vec<String> = Vec::new();
        if let Some(prev) = &previous {
            st.unindex(prev);
            if prev.source.in_subtree() {
                remove_local_index(st, prev);
                changed_fqdns.push(prev.fqdn.clone());
            }
        }
        st.index(&entry);
        if entry.source.in_subtree() {
            keys_insert(
                st.local_by_fqdn.entry(entry.fqdn.clone()).or_default(),
                &entry.key,
            );
            if !changed_fqdns.contains(&entry.fqdn) {
                changed_fqdns.push(entry.fqdn.clone());
            }
        }
        st.entries.insert(entry.key.clone(), entry.clone());
        let rev = st.revision;
        let _ = self.events.send(CatalogEvent::Upsert(entry));
        for fqdn in changed_fqdns {
            let _ = self.hamlet.send(Arc::from(fqdn));
        }
        Some(rev)
    }

    /// Removes `key`; returns the removed entry.
    pub fn remove(&self, key: &ServiceKey) -> Option<Arc<ServiceEntry>> {
        let mut st = self.write();
        self.remove_locked(&mut st, key)
    }

    fn remove_locked(&self, st: &mut State, key: &ServiceKey) -> Option<Arc<ServiceEntry>> {
        let removed = st.entries.remove(key)?;
        st.revision += 1;
        st.unindex(&removed);
        if removed.source.in_subtree() {
            remove_local_index(st, &removed);
        }
        let _ = self.events.send(CatalogEvent::Delete(removed.clone()));
        if removed.source.in_subtree() {
            let _ = self.hamlet.send(Arc::from(removed.fqdn.as_str()));
        }
        Some(removed)
    }

    /// Makes the entries of `source` exactly `entries`: upserts each and removes every other
    /// entry of that source. Entries of other sources are never touched. Returns
    /// (upserted, removed) counts.
    pub fn replace_source(&self, source: &Source, entries: Vec<ServiceEntry>) -> (usize, usize) {
        let mut st = self.write();
        let keep: BTreeSet<ServiceKey> = entries.iter().map(|e| e.key.clone()).collect();
        let stale: Vec<ServiceKey> = st
            .entries
            .values()
            .filter(|e| e.source == *source && !keep.contains(&e.key))
            .map(|e| e.key.clone())
            .collect();
        let mut upserted = 0;
        for mut entry in entries {
            entry.source = source.clone();
            if self.upsert_locked(&mut st, entry).is_some() {
                upserted += 1;
            }
        }
        for key in &stale {
            self.remove_locked(&mut st, key);
        }
        (upserted, stale.len())
    }

    pub fn get(&self, key: &ServiceKey) -> Option<Arc<ServiceEntry>> {
        self.read().entries.get(key).cloned()
    }

    /// Every entry with this canonical FQDN, in key order (indexed, no scan).
    pub fn by_fqdn(&self, fqdn: &str) -> Vec<Arc<ServiceEntry>> {
        let fqdn = fqdn.trim_end_matches('.').to_ascii_lowercase();
        let st = self.read();
        st.resolve(st.by_fqdn.get(&fqdn))
    }

    /// Every entry named `namespace/name`, whichever cluster owns it, in key order (indexed).
    pub fn by_name(&self, namespace: &str, name: &str) -> Vec<Arc<ServiceEntry>> {
        let st = self.read();
        st.resolve(st.by_name.get(&name_bucket(namespace, name)))
    }

    pub fn list(&self, filter: &ListFilter) -> Vec<Arc<ServiceEntry>> {
        self.read()
            .entries
            .values()
            .filter(|e| filter.matches(e))
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn revision(&self) -> u64 {
        self.read().revision
    }

    /// Subscribe to full change events (admin `Watch`).
    pub fn subscribe(&self) -> broadcast::Receiver<CatalogEvent> {
        self.events.subscribe()
    }

    /// Subscribe to Hamlet-view changes: each item is an FQDN whose served record may have
    /// changed. Subscribe before reading [`Catalog::hamlet_fqdns`] so nothing is missed.
    pub fn subscribe_hamlet(&self) -> broadcast::Receiver<Arc<str>> {
        self.hamlet.subscribe()
    }

    /// The FQDNs currently served over Hamlet (this registry's subtree), sorted.
    pub fn hamlet_fqdns(&self) -> Vec<Arc<str>> {
        let st = self.read();
        let mut v: Vec<Arc<str>> = st
            .local_by_fqdn
            .iter()
            .filter(|(_, keys)| !keys.is_empty())
            .map(|(f, _)| Arc::from(f.as_str()))
            .collect();
        v.sort();
        v
    }

    /// The record served over Hamlet for `fqdn`: the subtree entry with the lowest key when
    /// several export the same FQDN (deterministic; the others are reported as conflicts by
    /// [`Catalog::hamlet_conflicts`]).
    pub fn hamlet_get(&self, fqdn: &str) -> Option<Arc<ServiceEntry>> {
        self.read().hamlet_winner(fqdn)
    }

    /// Subtree entries shadowed by another entry with the same FQDN.
    pub fn hamlet_conflicts(&self) -> Vec<(ServiceKey, ServiceKey)> {
        let st = self.read();
        let mut out = Vec::new();
        for keys in st.local_by_fqdn.values() {
            let mut it = keys.iter();
            if let Some(winner) = it.next() {
                for loser in it {
                    out.push((loser.clone(), winner.clone()));
                }
            }
        }
        out.sort();
        out
    }
}

fn remove_local_index(st: &mut State, entry: &ServiceEntry) {
    keys_remove(&mut st.local_by_fqdn, &entry.fqdn, &entry.key);
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn local(ns: &str, name: &str, fqdn: &str, ip: &str) -> ServiceEntry {
        ServiceEntry {
            key: ServiceKey::new("east", ns, name),
            source: Source::Local,
            fqdn: fqdn.into(),
            endpoints: vec![Endpoint {
                address: ip.into(),
                port: 443,
            }],
            ports: vec![],
            labels: BTreeMap::new(),
            allowed_requesters: vec![],
            origin: None,
            revision: 0,
        }
    }

    #[test]
    fn upsert_assigns_revisions_and_skips_identical_content() {
        let c = Catalog::new();
        let mut rx = c.subscribe();
        assert_eq!(
            c.upsert(local("a", "web", "web.xcc.test", "10.0.0.1")),
            Some(1)
        );
        assert_eq!(
            c.upsert(local("a", "web", "web.xcc.test", "10.0.0.1")),
            None
        );
        assert_eq!(
            c.upsert(local("a", "web", "web.xcc.test", "10.0.0.2")),
            Some(2)
        );
        let e = c.get(&ServiceKey::new("east", "a", "web")).expect("stored");
        assert_eq!(e.revision, 2);
        assert_eq!(e.endpoints[0].address, "10.0.0.2");
        assert!(matches!(rx.try_recv(), Ok(CatalogEvent::Upsert(e)) if e.revision == 1));
        assert!(matches!(rx.try_recv(), Ok(CatalogEvent::Upsert(e)) if e.revision == 2));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn hamlet_view_picks_lowest_key_and_reports_conflicts() {
        let c = Catalog::new();
        let mut rx = c.subscribe_hamlet();
        c.upsert(local("b", "web", "web.xcc.test", "10.0.0.2"));
        c.upsert(local("a", "web", "web.xcc.test", "10.0.0.1"));
        assert_eq!(
            c.hamlet_get("web.xcc.test").expect("served").key.namespace,
            "a"
        );
        assert_eq!(
            c.hamlet_conflicts(),
            vec![(
                ServiceKey::new("east", "b", "web"),
                ServiceKey::new("east", "a", "web")
            )]
        );
        c.remove(&ServiceKey::new("east", "a", "web"));
        assert_eq!(
            c.hamlet_get("web.xcc.test").expect("served").key.namespace,
            "b"
        );
        let seen: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|f| f.to_string())
            .collect();
        assert_eq!(seen, vec!["web.xcc.test"; 3]);
    }

    #[test]
    fn fqdn_change_notifies_old_and_new_names() {
        let c = Catalog::new();
        c.upsert(local("a", "web", "old.xcc.test", "10.0.0.1"));
        let mut rx = c.subscribe_hamlet();
        c.upsert(local("a", "web", "new.xcc.test", "10.0.0.1"));
        let seen: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|f| f.to_string())
            .collect();
        assert_eq!(seen, vec!["old.xcc.test", "new.xcc.test"]);
        assert!(c.hamlet_get("old.xcc.test").is_none());
        assert_eq!(c.hamlet_fqdns(), vec![Arc::<str>::from("new.xcc.test")]);
    }

    #[test]
    fn replace_source_touches_only_that_source() {
        let c = Catalog::new();
        c.upsert(local("a", "web", "web.xcc.test", "10.0.0.1"));
        let remote = |name: &str| ServiceEntry {
            key: ServiceKey::new("rr1", "", name),
            source: Source::Remote("rr1".into()),
            ..local("", name, name, "10.1.0.1")
        };
        let mut other = remote("x.other");
        other.key.cluster = "rr2".into();
        other.source = Source::Remote("rr2".into());
        c.upsert(other);
        c.upsert(remote("stale.xcc.test"));
        let (up, rm) = c.replace_source(
            &Source::Remote("rr1".into()),
            vec![remote("a.xcc.test"), remote("b.xcc.test")],
        );
        assert_eq!((up, rm), (2, 1));
        let names: Vec<String> = c
            .list(&ListFilter::default())
            .iter()
            .map(|e| e.key.to_string())
            .collect();
        assert_eq!(
            names,
            vec![
                "east/a/web",
                "rr1//a.xcc.test",
                "rr1//b.xcc.test",
                "rr2//x.other"
            ]
        );
        // Imports are not served over Hamlet.
        assert_eq!(c.hamlet_fqdns(), vec![Arc::<str>::from("web.xcc.test")]);
    }

    #[test]
    fn list_filters_by_suffix_label_wise() {
        let c = Catalog::new();
        c.upsert(local("a", "one", "one.some.domain", "10.0.0.1"));
        c.upsert(local("a", "two", "two.somesome.domain", "10.0.0.1"));
        c.upsert(local("b", "three", "some.domain", "10.0.0.1"));
        let f = ListFilter {
            fqdn_suffix: Some("Some.Domain.".into()),
            ..Default::default()
        };
        let names: Vec<String> = c.list(&f).iter().map(|e| e.key.name.clone()).collect();
        assert_eq!(names, vec!["one", "three"]);
        let f = ListFilter {
            namespace: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(c.list(&f).len(), 1);
    }

    #[test]
    fn fqdn_and_name_indexes_follow_changes() {
        let c = Catalog::new();
        c.upsert(local("a", "web", "old.xcc.test", "10.0.0.1"));
        let mut other = local("a", "web", "old.xcc.test", "10.0.0.2");
        other.key.cluster = "west".into();
        other.source = Source::Remote("west".into());
        c.upsert(other);
        let keys = |v: Vec<Arc<ServiceEntry>>| -> Vec<String> {
            v.iter().map(|e| e.key.to_string()).collect()
        };
        assert_eq!(
            keys(c.by_fqdn("OLD.xcc.test.")),
            ["east/a/web", "west/a/web"]
        );
        assert_eq!(keys(c.by_name("a", "web")), ["east/a/web", "west/a/web"]);
        // FQDN change moves the entry between buckets.
        c.upsert(local("a", "web", "new.xcc.test", "10.0.0.1"));
        assert_eq!(keys(c.by_fqdn("old.xcc.test")), ["west/a/web"]);
        assert_eq!(keys(c.by_fqdn("new.xcc.test")), ["east/a/web"]);
        c.remove(&ServiceKey::new("west", "a", "web"));
        assert!(c.by_fqdn("old.xcc.test").is_empty());
        assert_eq!(keys(c.by_name("a", "web")), ["east/a/web"]);
        assert!(c.by_name("b", "web").is_empty());
        c.replace_source(&Source::Local, vec![]);
        assert!(c.by_name("a", "web").is_empty() && c.by_fqdn("new.xcc.test").is_empty());
    }

    #[test]
    fn admits_clusters_and_workloads() {
        let mut e = local("a", "web", "web.xcc.test", "10.0.0.1");
        assert!(e.admits("anyone"));
        e.allowed_requesters = vec!["west".into(), "north/frontend".into()];
        assert!(e.admits("west"));
        assert!(e.admits("west/anything"));
        assert!(e.admits("north/frontend"));
        assert!(!e.admits("north/backend"));
        // A cluster as a whole (a Hamlet consumer) sees what any of its workloads may call.
        assert!(e.admits("north"));
        assert!(!e.admits("south"));
        assert!(!e.admits("wes"));
    }
}
