//! The catalog: a pure in-memory index of every service this registry knows — its own exports,
//! imports from remote registries, announcements from its children and answers granted through the
//! hierarchy. No I/O happens here. Writers (stores, import clients, the federation level) call
//! [`Catalog::upsert`], [`Catalog::remove`] or [`Catalog::replace_source`]; readers (the Hamlet
//! server, the parent link, the admin API) read under a short lock and learn of changes through two
//! broadcast channels: full [`CatalogEvent`]s for watchers, and the FQDNs whose Hamlet view changed
//! for Hamlet consumers.

mod entry;
mod index;
mod labels;
mod view;

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

pub use smol_str::SmolStr;
use tokio::sync::broadcast;
use xcc_proto::propagation::CHANGED_AT_ANNOTATION;

pub use entry::{Endpoint, NamedPort, Origin, ServiceEntry, ServiceKey, Source};
use index::{ByKey, Index};
pub use labels::Labels;
pub use view::{HamletView, ViewItem, ViewPos, ViewVersion};

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

#[derive(Default)]
struct State {
    /// Every entry, in key order.
    entries: BTreeSet<ByKey>,
    /// Every entry by FQDN, and by namespace and name: lookups without scanning. The Hamlet
    /// view serves the subtree entry (local export or child's announcement) with the lowest
    /// key of each FQDN.
    by_fqdn: Index,
    by_name: Index,
    /// What Hamlet consumers are served: the winner of each FQDN.
    hamlet_view: HamletView,
    revision: u64,
}

impl State {
    fn get(&self, key: &ServiceKey) -> Option<&Arc<ServiceEntry>> {
        self.entries.get(key).map(|e| &e.0)
    }

    fn fqdn_hash(&self, fqdn: &str) -> u64 {
        self.by_fqdn.hash(fqdn)
    }

    fn name_hash(&self, key: &ServiceKey) -> u64 {
        self.by_name.hash((&key.namespace, &key.name))
    }

    /// Every entry with this canonical FQDN, in key order.
    fn with_fqdn<'a>(&'a self, fqdn: &'a str) -> impl Iterator<Item = &'a Arc<ServiceEntry>> {
        self.by_fqdn
            .get(self.fqdn_hash(fqdn))
            .iter()
            .filter(move |e| e.fqdn == fqdn)
    }

    fn hamlet_winner(&self, fqdn: &str) -> Option<Arc<ServiceEntry>> {
        self.with_fqdn(fqdn)
            .find(|e| e.source.in_subtree())
            .cloned()
    }

    /// Bring the Hamlet view of `fqdn` up to date; returns its interned key when the served
    /// entry changed (the FQDN to announce to Hamlet consumers).
    fn refresh_view(&mut self, fqdn: &str) -> Option<Arc<str>> {
        let winner = self.hamlet_winner(fqdn);
        let current = self.hamlet_view.get(fqdn);
        let same = match (&winner, current) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if same {
            return None;
        }
        let interned = self.hamlet_view.key(fqdn).cloned();
        let present = winner.is_some();
        self.hamlet_view.set(fqdn, winner);
        if present {
            self.hamlet_view.key(fqdn).cloned()
        } else {
            interned
        }
    }

    /// Stores `e` (replacing the entry with its key) in `entries` and both indexes. `previous`
    /// is the entry it replaces.
    fn store(&mut self, e: &Arc<ServiceEntry>, previous: Option<&Arc<ServiceEntry>>) {
        if let Some(prev) = previous
            && prev.fqdn != e.fqdn
        {
            let hash = self.fqdn_hash(&prev.fqdn);
            self.by_fqdn.remove(hash, &prev.key);
        }
        let hash = self.fqdn_hash(&e.fqdn);
        self.by_fqdn.insert(hash, e);
        // Same key, same namespace and name: a replacement lands in the same bucket.
        let hash = self.name_hash(&e.key);
        self.by_name.insert(hash, e);
        self.entries.replace(ByKey(e.clone()));
    }

    /// Removes the entry with `key` from `entries` and both indexes.
    fn take(&mut self, key: &ServiceKey) -> Option<Arc<ServiceEntry>> {
        let removed = self.entries.take(key)?.0;
        let hash = self.fqdn_hash(&removed.fqdn);
        self.by_fqdn.remove(hash, key);
        let hash = self.name_hash(key);
        self.by_name.remove(hash, key);
        Some(removed)
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
        Self::with_change_capacity(CHANGE_CHANNEL_CAPACITY)
    }

    /// A catalog whose change channels hold `capacity` changes (tests of lagging receivers).
    pub(crate) fn with_change_capacity(capacity: usize) -> Self {
        let (events, _) = broadcast::channel(capacity);
        let (hamlet, _) = broadcast::channel(capacity);
        Self {
            state: Arc::new(RwLock::new(State::default())),
            events,
            hamlet,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        xcc_controller::plumbing::read(&self.state)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        xcc_controller::plumbing::write(&self.state)
    }

    /// Stores `entry` (its revision is assigned here). Returns the new revision, or `None` when
    /// the content was already stored (no event is emitted then). A changed local export is
    /// stamped with the time the catalog accepted it ([`CHANGED_AT_ANNOTATION`], replacing any
    /// stamp it came with): that stamp travels to importers, who measure propagation from it.
    pub fn upsert(&self, entry: ServiceEntry) -> Option<u64> {
        let mut st = self.write();
        self.upsert_locked(&mut st, entry)
    }

    fn upsert_locked(&self, st: &mut State, mut entry: ServiceEntry) -> Option<u64> {
        let previous = st.get(&entry.key).cloned();
        if let Some(prev) = &previous
            && prev.same_content(&entry)
        {
            return None;
        }
        if entry.source == Source::Local {
            entry.labels.insert(
                CHANGED_AT_ANNOTATION.to_string(),
                xcc_proto::propagation::format_stamp(std::time::SystemTime::now()),
            );
        }
        st.revision += 1;
        entry.revision = st.revision;
        let entry = Arc::new(entry);
        st.store(&entry, previous.as_ref());
        let _ = self.events.send(CatalogEvent::Upsert(entry.clone()));
        let mut changed_fqdns: Vec<&str> = Vec::new();
        if let Some(prev) = &previous
            && prev.source.in_subtree()
        {
            changed_fqdns.push(&prev.fqdn);
        }
        if entry.source.in_subtree() && !changed_fqdns.contains(&entry.fqdn.as_str()) {
            changed_fqdns.push(&entry.fqdn);
        }
        for fqdn in changed_fqdns {
            if let Some(key) = st.refresh_view(fqdn) {
                let _ = self.hamlet.send(key);
            }
        }
        Some(st.revision)
    }

    /// Removes `key`; returns the removed entry.
    pub fn remove(&self, key: &ServiceKey) -> Option<Arc<ServiceEntry>> {
        let mut st = self.write();
        self.remove_locked(&mut st, key)
    }

    fn remove_locked(&self, st: &mut State, key: &ServiceKey) -> Option<Arc<ServiceEntry>> {
        let removed = st.take(key)?;
        st.revision += 1;
        // The event carries the revision of the removal, not of the entry's last upsert, so a
        // watcher sees the two apart.
        let mut gone = (*removed).clone();
        gone.revision = st.revision;
        let _ = self.events.send(CatalogEvent::Delete(Arc::new(gone)));
        if removed.source.in_subtree()
            && let Some(key) = st.refresh_view(&removed.fqdn)
        {
            let _ = self.hamlet.send(key);
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
            .iter()
            .filter(|e| e.0.source == *source && !keep.contains(&e.0.key))
            .map(|e| e.0.key.clone())
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

    /// Applies a partial change to the entries of `source` under one lock: upserts `upserts`
    /// (their source is set to `source`) and removes `removals` that belong to `source` (keys of
    /// other sources are left alone). For stores that know which of their entries changed, so a
    /// change costs its own size rather than the size of the whole source. Returns (upserted,
    /// removed) counts.
    pub fn update_source(
        &self,
        source: &Source,
        upserts: Vec<ServiceEntry>,
        removals: &[ServiceKey],
    ) -> (usize, usize) {
        let mut st = self.write();
        let mut upserted = 0;
        for mut entry in upserts {
            entry.source = source.clone();
            if self.upsert_locked(&mut st, entry).is_some() {
                upserted += 1;
            }
        }
        let mut removed = 0;
        for key in removals {
            if st.get(key).is_some_and(|e| e.source == *source) {
                self.remove_locked(&mut st, key);
                removed += 1;
            }
        }
        (upserted, removed)
    }

    pub fn get(&self, key: &ServiceKey) -> Option<Arc<ServiceEntry>> {
        self.read().get(key).cloned()
    }

    /// Every entry with this canonical FQDN, in key order (indexed, no scan).
    pub fn by_fqdn(&self, fqdn: &str) -> Vec<Arc<ServiceEntry>> {
        let fqdn = fqdn.trim_end_matches('.').to_ascii_lowercase();
        self.read().with_fqdn(&fqdn).cloned().collect()
    }

    /// Every entry named `namespace/name`, whichever cluster owns it, in key order (indexed).
    pub fn by_name(&self, namespace: &str, name: &str) -> Vec<Arc<ServiceEntry>> {
        let st = self.read();
        st.by_name
            .get(st.by_name.hash((namespace, name)))
            .iter()
            .filter(|e| e.key.namespace == namespace && e.key.name == name)
            .cloned()
            .collect()
    }

    pub fn list(&self, filter: &ListFilter) -> Vec<Arc<ServiceEntry>> {
        self.read()
            .entries
            .iter()
            .filter(|e| filter.matches(&e.0))
            .map(|e| e.0.clone())
            .collect()
    }

    /// Up to `limit` entries matching `filter` with keys after `after` (from the first with
    /// `None`), in key order: one page of [`Catalog::list`].
    pub fn list_after(
        &self,
        filter: &ListFilter,
        after: Option<&ServiceKey>,
        limit: usize,
    ) -> Vec<Arc<ServiceEntry>> {
        self.page_after(after, limit, |e| filter.matches(e))
    }

    /// Up to `limit` entries of this registry's subtree (local exports and children's
    /// announcements) with keys after `after` (from the first with `None`), in key order: a
    /// cursor over the live catalog that holds no lock and copies nothing between calls.
    pub fn subtree_after(
        &self,
        after: Option<&ServiceKey>,
        limit: usize,
    ) -> Vec<Arc<ServiceEntry>> {
        self.page_after(after, limit, |e| e.source.in_subtree())
    }

    /// Up to `limit` entries that `keep` keeps, with keys after `after`, in key order.
    fn page_after(
        &self,
        after: Option<&ServiceKey>,
        limit: usize,
        keep: impl Fn(&ServiceEntry) -> bool,
    ) -> Vec<Arc<ServiceEntry>> {
        use std::ops::Bound;
        let st = self.read();
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        st.entries
            .range::<ServiceKey, _>((from, Bound::Unbounded))
            .filter(|e| keep(&e.0))
            .take(limit)
            .map(|e| e.0.clone())
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
        self.read().hamlet_view.fqdns()
    }

    /// The current version of the Hamlet view: what [`Catalog::hamlet_get`] answers for every
    /// served FQDN, as one immutable, cheaply shared value. Subscribe with
    /// [`Catalog::subscribe_hamlet`] first so no later change is missed.
    pub fn hamlet_view(&self) -> HamletView {
        self.read().hamlet_view.clone()
    }

    /// Whether `view` is the Hamlet view version the catalog serves now.
    pub fn hamlet_view_is(&self, view: &HamletView) -> bool {
        self.read().hamlet_view.same_version(view)
    }

    /// Whether the Hamlet view is still the version `v` names.
    pub fn hamlet_view_is_version(&self, v: &ViewVersion) -> bool {
        self.read().hamlet_view.is_version(v)
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
        for bucket in st.by_fqdn.buckets.values() {
            let subtree: Vec<&Arc<ServiceEntry>> = bucket
                .as_slice()
                .iter()
                .filter(|e| e.source.in_subtree())
                .collect();
            // In key order: the first entry of each FQDN wins (a bucket may, rarely, hold
            // several FQDNs).
            for (i, e) in subtree.iter().enumerate() {
                if let Some(winner) = subtree[..i].iter().find(|w| w.fqdn == e.fqdn) {
                    out.push((e.key.clone(), winner.key.clone()));
                }
            }
        }
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::index::Bucket;
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
            labels: Labels::new(),
            allowed_requesters: vec![],
            origin: None,
            revision: 0,
        }
    }

    /// A version token names the view it was taken from, keeps none of it, and stops matching
    /// once the catalog changes its view, also when nobody else held that view (the in-place
    /// change moves it to a new allocation while a token is out).
    #[test]
    fn a_view_version_token_stops_matching_at_the_next_change() {
        let c = Catalog::new();
        c.upsert(local("a", "web", "web.xcc.test", "10.0.0.1"));
        let token = c.hamlet_view().version();
        assert!(c.hamlet_view_is_version(&token), "no change yet");
        c.upsert(local("a", "api", "api.xcc.test", "10.0.0.2"));
        assert!(
            !c.hamlet_view_is_version(&token),
            "changed with no handle held"
        );
        let held = c.hamlet_view();
        let token = held.version();
        c.upsert(local("a", "web", "web.xcc.test", "10.0.0.3"));
        assert!(
            !c.hamlet_view_is_version(&token),
            "changed while a handle was held"
        );
        assert!(held.is_version(&token));
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

    /// A changed local export is stamped when the catalog accepts it; an unchanged one keeps its
    /// stamp (and makes no event), whatever stamp it comes with; other sources keep theirs.
    #[test]
    fn local_changes_are_stamped_and_a_stamp_alone_is_no_change() {
        let c = Catalog::new();
        let before = std::time::SystemTime::now();
        c.upsert(local("a", "web", "web.xcc.test", "10.0.0.1"));
        let key = ServiceKey::new("east", "a", "web");
        let first = c.get(&key).expect("stored");
        let stamp = first.changed_at().expect("stamped");
        // Milliseconds: the stamp may round down below `before` by less than one.
        assert!(stamp + std::time::Duration::from_millis(1) > before);
        assert!(stamp <= std::time::SystemTime::now());
        let mut again = local("a", "web", "web.xcc.test", "10.0.0.1");
        again
            .labels
            .insert(CHANGED_AT_ANNOTATION.into(), "1".into());
        assert_eq!(c.upsert(again), None, "a stamp alone is no change");
        assert_eq!(c.get(&key).expect("stored").changed_at(), Some(stamp));
        assert_eq!(
            c.upsert(local("a", "web", "web.xcc.test", "10.0.0.2")),
            Some(2)
        );
        assert!(c.get(&key).expect("stored").changed_at().expect("stamped") >= stamp);
        let mut remote = local("a", "db", "db.xcc.test", "10.0.0.3");
        remote.source = Source::Remote("west".into());
        remote
            .labels
            .insert(CHANGED_AT_ANNOTATION.into(), "1234".into());
        c.upsert(remote);
        let got = c.get(&ServiceKey::new("east", "a", "db")).expect("stored");
        assert_eq!(got.labels.get(CHANGED_AT_ANNOTATION), Some("1234"));
    }

    /// `xcc admin watch` printed the same `rev` for an upsert and the removal after it.
    #[test]
    fn a_removal_event_carries_its_own_revision() {
        let c = Catalog::new();
        let mut rx = c.subscribe();
        c.upsert(local("a", "web", "web.xcc.test", "10.0.0.1"));
        let removed = c
            .remove(&ServiceKey::new("east", "a", "web"))
            .expect("removed");
        assert_eq!(removed.revision, 1, "the entry as it was");
        assert!(matches!(rx.try_recv(), Ok(CatalogEvent::Upsert(e)) if e.revision == 1));
        assert!(matches!(rx.try_recv(), Ok(CatalogEvent::Delete(e)) if e.revision == 2));
        assert_eq!(c.revision(), 2);
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
        let names: Vec<String> = c.list(&f).iter().map(|e| e.key.name.to_string()).collect();
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
    #[test]
    fn the_hamlet_view_key_is_the_entry_own_fqdn_allocation() {
        let c = Catalog::new();
        let fqdn = "a-service-name.some-namespace.svc.clusterset.local";
        c.upsert(local("a", "s", fqdn, "10.0.0.1"));
        let view = c.hamlet_view();
        let (key, entry) = view.iter().next().expect("served");
        assert_eq!(&**key, fqdn);
        assert_eq!(key.as_ptr(), entry.fqdn.as_ptr(), "one allocation for both");
        // A short FQDN is held inline by the entry; the view has its own key.
        c.upsert(local("a", "t", "t.xcc", "10.0.0.1"));
        let view = c.hamlet_view();
        assert_eq!(view.key("t.xcc").map(|k| &**k), Some("t.xcc"));
    }

    #[test]
    fn hamlet_view_versions_share_chunks_and_diff_exactly() {
        let c = Catalog::new();
        for i in 0..1000 {
            c.upsert(local(
                "a",
                &format!("s{i:04}"),
                &format!("s{i:04}.xcc.test"),
                "10.0.0.1",
            ));
        }
        let v1 = c.hamlet_view();
        assert_eq!(v1.len(), 1000);
        assert_eq!(v1.fqdns(), c.hamlet_fqdns());
        let sorted: Vec<&str> = v1.iter().map(|(k, _)| &**k).collect();
        let mut expect = sorted.clone();
        expect.sort();
        assert_eq!(sorted, expect);
        // One change, one removal, one addition: the old version is untouched.
        c.upsert(local("a", "s0500", "s0500.xcc.test", "10.0.0.2"));
        c.remove(&ServiceKey::new("east", "a", "s0007"));
        c.upsert(local("b", "new", "s0999a.xcc.test", "10.0.0.3"));
        let v2 = c.hamlet_view();
        assert_eq!(v1.len(), 1000);
        assert_eq!(
            v1.get("s0500.xcc.test").expect("old").endpoints[0].address,
            "10.0.0.1"
        );
        assert!(v1.get("s0007.xcc.test").is_some());
        assert_eq!(v2.len(), 1000);
        assert_eq!(
            v2.get("s0500.xcc.test").expect("new").endpoints[0].address,
            "10.0.0.2"
        );
        let mut seen = Vec::new();
        v1.diff(&v2, |k, a, b| {
            seen.push((k.to_string(), a.is_some(), b.is_some()))
        });
        assert_eq!(
            seen,
            vec![
                ("s0007.xcc.test".to_string(), true, false),
                ("s0500.xcc.test".to_string(), true, true),
                ("s0999a.xcc.test".to_string(), false, true),
            ]
        );
        // Unchanged chunks are shared between the versions, not copied.
        let shared = v1
            .chunks
            .iter()
            .filter(|a| v2.chunks.iter().any(|b| Arc::ptr_eq(a, b)))
            .count();
        assert!(
            shared + 3 >= v1.chunks.len(),
            "{shared} of {}",
            v1.chunks.len()
        );
        let mut none = 0;
        v2.diff(&c.hamlet_view(), |_, _, _| none += 1);
        assert_eq!(none, 0);
        // Keys are interned: the view's key is the one announced to Hamlet consumers.
        let mut rx = c.subscribe_hamlet();
        c.upsert(local("a", "s0001", "s0001.xcc.test", "10.0.0.9"));
        let announced = rx.try_recv().expect("announced");
        assert!(Arc::ptr_eq(
            &announced,
            c.hamlet_view().key("s0001.xcc.test").expect("key")
        ));
    }

    #[test]
    fn index_buckets_keep_key_order_and_tell_colliding_names_apart() {
        let entry = |cluster: &str, fqdn: &str| {
            let mut e = local("a", "web", fqdn, "10.0.0.1");
            e.key.cluster = cluster.into();
            Arc::new(e)
        };
        let mut st = State::default();
        // Two FQDNs forced into one bucket, as a hash collision would put them.
        for (cluster, fqdn) in [("c", "x.test"), ("a", "y.test"), ("b", "x.test")] {
            st.by_fqdn.insert(7, &entry(cluster, fqdn));
        }
        let order: Vec<String> = st
            .by_fqdn
            .get(7)
            .iter()
            .map(|e| e.key.to_string())
            .collect();
        assert_eq!(order, ["a/a/web", "b/a/web", "c/a/web"]);
        st.by_fqdn.remove(7, &ServiceKey::new("a", "a", "web"));
        st.by_fqdn.remove(7, &ServiceKey::new("b", "a", "web"));
        assert!(matches!(st.by_fqdn.buckets.get(&7), Some(Bucket::One(e)) if e.key.cluster == "c"));
        st.by_fqdn.insert(7, &entry("c", "z.test"));
        assert_eq!(st.by_fqdn.get(7)[0].fqdn, "z.test");
        st.by_fqdn.remove(7, &ServiceKey::new("c", "a", "web"));
        assert!(st.by_fqdn.buckets.is_empty());
        // Readers compare the FQDN itself, not only its hash.
        let c = Catalog::new();
        c.upsert(local("a", "web", "x.test", "10.0.0.1"));
        let mut st = c.write();
        let h = st.fqdn_hash("x.test");
        st.by_fqdn.insert(h, &entry("b", "other.test"));
        assert_eq!(st.with_fqdn("x.test").count(), 1);
        assert_eq!(
            st.hamlet_winner("x.test").expect("served").key.cluster,
            "east"
        );
    }

    #[test]
    fn update_source_applies_only_its_own_keys() {
        let c = Catalog::new();
        c.upsert(local("a", "web", "web.xcc.test", "10.0.0.1"));
        c.upsert(local("a", "db", "db.xcc.test", "10.0.0.1"));
        let mut remote = local("a", "api", "api.xcc.test", "10.1.0.1");
        remote.key.cluster = "west".into();
        remote.source = Source::Remote("west".into());
        c.upsert(remote);
        let (up, rm) = c.update_source(
            &Source::Local,
            vec![
                local("a", "web", "web.xcc.test", "10.0.0.2"),
                local("a", "db", "db.xcc.test", "10.0.0.1"),
            ],
            &[
                ServiceKey::new("west", "a", "api"),
                ServiceKey::new("east", "a", "gone"),
            ],
        );
        assert_eq!((up, rm), (1, 0));
        assert!(c.get(&ServiceKey::new("west", "a", "api")).is_some());
        let (up, rm) = c.update_source(
            &Source::Local,
            vec![],
            &[ServiceKey::new("east", "a", "db")],
        );
        assert_eq!((up, rm), (0, 1));
        assert_eq!(c.hamlet_fqdns(), vec![Arc::<str>::from("web.xcc.test")]);
    }

    #[test]
    fn labels_keep_key_order_last_value_wins_and_share_known_keys() {
        let port = xcc_proto::names::SERVICE_PORT_ANNOTATION;
        let mut l: Labels = [("b", "1"), ("a", "x"), ("b", "2")].into_iter().collect();
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![("a", "x"), ("b", "2")]);
        assert_eq!(l.insert("c".into(), "3".into()), None);
        assert_eq!(l.insert("a".into(), "y".into()), Some("x".to_string()));
        assert_eq!(l.insert(port.into(), "443".into()), None);
        assert_eq!(l.keys().collect::<Vec<_>>(), vec!["a", "b", "c", port]);
        assert_eq!((l.get("a"), l.get("z")), (Some("y"), None));
        assert!(l.contains_key(port) && !l.contains_key("d"));
        let map = l.to_btree_map();
        assert_eq!(l, map);
        assert_eq!(Labels::from(&map), l);
        assert_eq!(format!("{l:?}"), format!("{map:?}"));
        assert!(Labels::new().is_empty() && l.len() == 4);
        // The well-known key is one allocation for every entry that carries it.
        let other: Labels = [(port, "80")].into_iter().collect();
        assert!(Arc::ptr_eq(&l.0[3].0, &other.0[0].0));
        let unknown: Labels = [("a", "1")].into_iter().collect();
        assert!(!Arc::ptr_eq(&l.0[0].0, &unknown.0[0].0));
    }
}
