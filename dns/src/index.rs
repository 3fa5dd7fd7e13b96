//! The DNS index: the feed's state and the snapshots it publishes (pure apart from the `watch`).
//!
//! Feeds — the Kubernetes watches, a static records file, a test — apply Services, pods and
//! namespaces here (`apply` / `delete` / `reset`, linkerd's index pattern). [`DnsIndex::publish`]
//! derives an immutable [`Snapshot`] (zones, pod index, namespace mapping, readiness) and sends it
//! on a `tokio::sync::watch`; the server answers from whatever snapshot is current and never
//! sees a feed. Zones are rebuilt from scratch on publish (O(names)), so feeds apply a batch of
//! events and publish once. The snapshot is ready only after every required source has
//! delivered its first full listing (no NXDOMAIN from a half-filled index after a restart).
//!
//! [`DnsFeed`] is the shared handle feeds use: the index behind a mutex, publishing after each
//! change with the wall clock as the serial source.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use xcc_proto::mapping::NamespaceMapping;

use super::answer::Snapshot;
use super::headless::{self, SliceInfo, SliceKey};
use super::pods::PodIndex;
use super::zone::{ServiceInfo, ServiceKey, ZoneSet};

/// A source of data the index waits for before it is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FeedSource {
    /// Services (Kubernetes watch).
    Services,
    /// Pods, for the source address → namespace index.
    Pods,
    /// Namespaces, for the mapping annotations.
    Namespaces,
    /// The binder's EndpointSlices, for headless imports ([`headless`]).
    EndpointSlices,
    /// The static records file.
    Static,
}

/// What a publish changed, for logs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Whether a new snapshot was sent.
    pub published: bool,
    /// Whether the zones were rebuilt.
    pub zones_rebuilt: bool,
    /// Whether the snapshot is ready.
    pub ready: bool,
}

/// The feed's state and the publisher of snapshots.
#[derive(Debug)]
pub struct DnsIndex {
    apexes: Vec<String>,
    services: BTreeMap<ServiceKey, ServiceInfo>,
    /// The binder's Services with a cluster IP: served only once one of the binder's
    /// EndpointSlices gives them a ready endpoint (an answer before that would name an address
    /// that cannot carry traffic yet).
    awaiting_endpoints: BTreeSet<ServiceKey>,
    slices: BTreeMap<SliceKey, SliceInfo>,
    statics: Vec<ServiceInfo>,
    pods: Arc<PodIndex>,
    mapping: Arc<NamespaceMapping>,
    pending: BTreeSet<FeedSource>,
    zones_dirty: bool,
    dirty: bool,
    current: Arc<Snapshot>,
    tx: watch::Sender<Arc<Snapshot>>,
}

impl DnsIndex {
    /// An index serving the zones `apexes` (canonical names), ready once each of `required`
    /// has delivered a full listing. The first snapshot (empty, not ready) is published at once.
    pub fn new(apexes: Vec<String>, required: impl IntoIterator<Item = FeedSource>) -> Self {
        let pending: BTreeSet<FeedSource> = required.into_iter().collect();
        let current = Arc::new(Snapshot {
            zones: Arc::new(ZoneSet::build(&apexes, [], None, 0)),
            pods: Arc::default(),
            mapping: Arc::default(),
            ready: false,
        });
        let (tx, _) = watch::channel(current.clone());
        Self {
            apexes,
            services: BTreeMap::new(),
            awaiting_endpoints: BTreeSet::new(),
            slices: BTreeMap::new(),
            statics: Vec::new(),
            pods: Arc::default(),
            mapping: Arc::default(),
            pending,
            zones_dirty: true,
            dirty: true,
            current,
            tx,
        }
    }

    /// A receiver of every snapshot published from now on (starting with the current one).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// The last published snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.clone()
    }

    /// The Service stored under `key`, if any.
    pub fn service(&self, key: &ServiceKey) -> Option<&ServiceInfo> {
        self.services.get(key)
    }

    /// Add or replace a Service.
    pub fn apply_service(&mut self, svc: ServiceInfo) {
        if self.services.get(&svc.key) != Some(&svc) {
            self.services.insert(svc.key.clone(), svc);
            self.zones_dirty = true;
        }
    }

    /// Remove a Service (absent keys are fine).
    pub fn delete_service(&mut self, key: &ServiceKey) {
        self.awaiting_endpoints.remove(key);
        if self.services.remove(key).is_some() {
            self.zones_dirty = true;
        }
    }

    /// Whether the Service `key` is one of the binder's with a cluster IP, which answers only
    /// once the binder's EndpointSlices give it a ready endpoint (see [`Self::reset_binder_services`]).
    pub fn set_binder_service(&mut self, key: &ServiceKey, binder: bool) {
        let changed = if binder {
            self.awaiting_endpoints.insert(key.clone())
        } else {
            self.awaiting_endpoints.remove(key)
        };
        if changed {
            self.zones_dirty = true;
        }
    }

    /// Replace the set of the binder's Services (with a full listing of Services): each answers
    /// only once one of the binder's EndpointSlices names it with a ready endpoint, so a name
    /// never points at a Service that has nowhere to send a connection yet.
    pub fn reset_binder_services(&mut self, all: impl IntoIterator<Item = ServiceKey>) {
        let all: BTreeSet<ServiceKey> = all.into_iter().collect();
        if all != self.awaiting_endpoints {
            self.awaiting_endpoints = all;
            self.zones_dirty = true;
        }
    }

    /// Replace every Service with a full listing; completes [`FeedSource::Services`].
    pub fn reset_services(&mut self, all: impl IntoIterator<Item = ServiceInfo>) {
        let all: BTreeMap<ServiceKey, ServiceInfo> =
            all.into_iter().map(|s| (s.key.clone(), s)).collect();
        if all != self.services {
            self.services = all;
            self.zones_dirty = true;
        }
        self.complete(FeedSource::Services);
    }

    /// Add or replace one of the binder's EndpointSlices.
    pub fn apply_slice(&mut self, key: SliceKey, slice: SliceInfo) {
        if self.slices.get(&key) != Some(&slice) {
            self.slices.insert(key, slice);
            self.zones_dirty = true;
        }
    }

    /// Remove an EndpointSlice (absent keys are fine).
    pub fn delete_slice(&mut self, key: &SliceKey) {
        if self.slices.remove(key).is_some() {
            self.zones_dirty = true;
        }
    }

    /// Replace every EndpointSlice with a full listing; completes
    /// [`FeedSource::EndpointSlices`].
    pub fn reset_slices(&mut self, all: impl IntoIterator<Item = (SliceKey, SliceInfo)>) {
        let all: BTreeMap<SliceKey, SliceInfo> = all.into_iter().collect();
        if all != self.slices {
            self.slices = all;
            self.zones_dirty = true;
        }
        self.complete(FeedSource::EndpointSlices);
    }

    /// Replace the static records; completes [`FeedSource::Static`].
    pub fn set_static(&mut self, records: Vec<ServiceInfo>) {
        if records != self.statics {
            self.statics = records;
            self.zones_dirty = true;
        }
        self.complete(FeedSource::Static);
    }

    /// Add or replace pod `namespace/name` with its addresses.
    pub fn apply_pod(&mut self, namespace: &str, name: &str, ips: &[IpAddr]) {
        Arc::make_mut(&mut self.pods).apply(namespace, name, ips);
        self.dirty = true;
    }

    /// Remove pod `namespace/name`.
    pub fn delete_pod(&mut self, namespace: &str, name: &str) {
        Arc::make_mut(&mut self.pods).remove(namespace, name);
        self.dirty = true;
    }

    /// Replace every pod with a full listing of `(namespace, name, addresses)`; completes
    /// [`FeedSource::Pods`].
    pub fn reset_pods(&mut self, all: impl IntoIterator<Item = (String, String, Vec<IpAddr>)>) {
        let mut pods = PodIndex::new();
        for (ns, name, ips) in all {
            pods.apply(&ns, &name, &ips);
        }
        self.pods = Arc::new(pods);
        self.dirty = true;
        self.complete(FeedSource::Pods);
    }

    /// Add or replace namespace `name` with its annotations. Returns the mapping error, if any,
    /// for the caller to report; the namespace then maps to itself.
    pub fn apply_namespace(
        &mut self,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), xcc_proto::mapping::MappingError> {
        let mut mapping = (*self.mapping).clone();
        let result = mapping.apply(name, annotations);
        self.set_mapping(mapping);
        result
    }

    /// Remove namespace `name`.
    pub fn delete_namespace(&mut self, name: &str) {
        let mut mapping = (*self.mapping).clone();
        mapping.remove(name);
        self.set_mapping(mapping);
    }

    /// Replace every namespace with a full listing; completes [`FeedSource::Namespaces`].
    /// Returns the namespaces whose mapping annotation was invalid, with the error.
    pub fn reset_namespaces(
        &mut self,
        all: impl IntoIterator<Item = (String, BTreeMap<String, String>)>,
    ) -> Vec<(String, xcc_proto::mapping::MappingError)> {
        let mut mapping = NamespaceMapping::new();
        let mut errors = Vec::new();
        for (name, annotations) in all {
            if let Err(e) = mapping.apply(&name, &annotations) {
                errors.push((name, e));
            }
        }
        self.set_mapping(mapping);
        self.complete(FeedSource::Namespaces);
        errors
    }

    fn set_mapping(&mut self, mapping: NamespaceMapping) {
        if *self.mapping != mapping {
            self.mapping = Arc::new(mapping);
            self.dirty = true;
        }
    }

    fn complete(&mut self, source: FeedSource) {
        if self.pending.remove(&source) {
            self.dirty = true;
        }
    }

    /// Whether every required source has delivered a full listing.
    pub fn is_ready(&self) -> bool {
        self.pending.is_empty()
    }

    /// Derive and send a new snapshot if anything changed since the last one. `now_unix` is the
    /// serial source for changed zones.
    pub fn publish(&mut self, now_unix: u32) -> PublishReport {
        let mut report = PublishReport {
            ready: self.is_ready(),
            ..PublishReport::default()
        };
        if !(self.dirty || self.zones_dirty) {
            return report;
        }
        let zones = if self.zones_dirty {
            report.zones_rebuilt = true;
            // Headless Services answer with their endpoints (from the binder's slices).
            let (replaced, derived) = headless::derive(&self.services, &self.slices);
            let with_endpoints = headless::with_ready_endpoints(&self.slices);
            let services = self
                .statics
                .iter()
                .chain(self.services.values().filter(|s| {
                    !replaced.contains(&s.key)
                        && (!self.awaiting_endpoints.contains(&s.key)
                            || with_endpoints.contains(&s.key))
                }))
                .chain(derived.iter());
            Arc::new(ZoneSet::build(
                &self.apexes,
                services,
                Some(&self.current.zones),
                now_unix,
            ))
        } else {
            self.current.zones.clone()
        };
        self.current = Arc::new(Snapshot {
            zones,
            pods: self.pods.clone(),
            mapping: self.mapping.clone(),
            ready: report.ready,
        });
        self.tx.send_replace(self.current.clone());
        self.dirty = false;
        self.zones_dirty = false;
        report.published = true;
        report
    }
}

/// Seconds since the Unix epoch, saturated into a `u32` (the SOA serial space).
pub fn unix_now() -> u32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    u32::try_from(secs).unwrap_or(u32::MAX)
}

/// Shared handle on a [`DnsIndex`] for feed tasks: every call publishes (use [`DnsFeed::update`]
/// to apply a batch and publish once).
#[derive(Clone, Debug)]
pub struct DnsFeed {
    index: Arc<Mutex<DnsIndex>>,
}

impl DnsFeed {
    /// Wrap an index.
    pub fn new(index: DnsIndex) -> Self {
        Self {
            index: Arc::new(Mutex::new(index)),
        }
    }

    /// A receiver of the published snapshots.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.with(|i| i.subscribe())
    }

    fn with<T>(&self, f: impl FnOnce(&mut DnsIndex) -> T) -> T {
        // A panic while holding the lock cannot leave the index half-updated in a way that
        // matters: the next publish rebuilds from the stored inputs.
        let mut guard = xcc_controller::plumbing::lock(&self.index);
        f(&mut guard)
    }

    /// Apply `f` to the index, then publish once.
    pub fn update<T>(&self, f: impl FnOnce(&mut DnsIndex) -> T) -> (T, PublishReport) {
        self.with(|i| {
            let out = f(i);
            let report = i.publish(unix_now());
            (out, report)
        })
    }

    /// Add or replace a Service and publish.
    pub fn apply_service(&self, svc: ServiceInfo) -> PublishReport {
        self.update(|i| i.apply_service(svc)).1
    }

    /// Remove a Service and publish.
    pub fn delete_service(&self, key: &ServiceKey) -> PublishReport {
        self.update(|i| i.delete_service(key)).1
    }

    /// Replace every Service and publish.
    pub fn reset_services(&self, all: Vec<ServiceInfo>) -> PublishReport {
        self.update(|i| i.reset_services(all)).1
    }

    /// Replace the static records and publish.
    pub fn set_static(&self, records: Vec<ServiceInfo>) -> PublishReport {
        self.update(|i| i.set_static(records)).1
    }

    /// Add or replace a pod and publish.
    pub fn apply_pod(&self, namespace: &str, name: &str, ips: &[IpAddr]) -> PublishReport {
        self.update(|i| i.apply_pod(namespace, name, ips)).1
    }

    /// Add or replace a namespace and publish. An invalid mapping annotation is returned as
    /// the error; the namespace is still applied (mapping to itself).
    pub fn apply_namespace(
        &self,
        name: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<PublishReport, xcc_proto::mapping::MappingError> {
        let (result, report) = self.update(|i| i.apply_namespace(name, annotations));
        result.map(|()| report)
    }

    /// The last published snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.with(|i| i.snapshot())
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
