//! The running publisher: watches, a work queue of source objects, reconciles, Events,
//! metrics and readiness.
//!
//! Watches (kube-runtime watchers feeding reflector stores, all namespaces):
//! - exported HTTPProxies and exported Services (label selector on the export label). A source
//!   that loses its label leaves the watched set like a deleted one, and both mean the same
//!   thing: its records go;
//! - every Node (node readiness, roles, taints and addresses feed the endpoints, so a node
//!   change re-reconciles the exports);
//! - the ingress (Envoy) Service, by name;
//! - the ServiceRecords the publisher manages (managed-by label): a change or deletion of one
//!   re-reconciles its owner, which repairs drift.
//!
//! A work queue holds source keys (kind, namespace, name): each key is reconciled by at most one
//! worker at a time, a key added while it is being reconciled runs again afterwards, and a
//! failed reconcile is retried with per-key exponential backoff. Reconciles are level-triggered:
//! they read the current stores and bring the source's records to what [`crate::desired`] says,
//! with [`crate::apply`] writing only what differs. Nothing is written at steady state.
//!
//! In MCS mode ([`Settings::mcs`]) every Service is watched, a ServiceExport exports the Service
//! of its name like the label does ([`crate::mcs`]; its ready pods are the endpoints unless the
//! label exports it too), imported ServiceRecords are watched for other clusters' exports of
//! the same name, EndpointSlices are watched for the pods that a headless Service (or one a
//! ServiceExport alone exports) exports, and each ServiceExport's status conditions are written with
//! server-side apply after its Service is reconciled.
//!
//! Clusters without Contour are normal: when the HTTPProxy API is not served, Services are
//! still exported, and the API is looked up again every [`Settings::discovery_retry`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;
use xcc_controller::plumbing::lock;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use xcc_controller::probes::Health;
use xcc_controller::queue::{Backoff, Queue};
use xcc_controller::tasks::{Spawner, Tasks};
use xcc_proto::crd::ServiceRecord;
use xcc_proto::mcs::ServiceExport;

use crate::apply::{self, FIELD_MANAGER, Outcome, SyncError};
use crate::desired::{self, Config, Desired, Skip};
use crate::httpproxy::HTTPProxy;
use crate::mcs;

mod watches;
use watches::spawn_watches;

/// Name of the leader-election Lease and the Events' reporting controller.
pub const LEASE_NAME: &str = "xcc-publisher";

/// Where Contour's Envoy Service lives by default.
pub const DEFAULT_INGRESS_SERVICE: &str = "projectcontour/envoy";

/// Controller settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// What shapes records (ingress port, cluster name).
    pub config: Config,
    /// Namespace and name of the ingress (Envoy) Service.
    pub ingress_service: (String, String),
    /// How often the HTTPProxy API is looked up again while it is not served.
    pub discovery_retry: Duration,
    /// Sources reconciled at the same time.
    pub workers: usize,
    /// Retry delays of a failed reconcile: doubling per failure, up to a cap.
    pub backoff: Backoff,
    /// Reporting instance of Events (the pod name).
    pub instance: Option<String>,
    /// Speak the Multi-Cluster Services API: ServiceExports export their Services and get
    /// status conditions (needs the MCS CRDs and the RBAC of `deploy/overlays/mcs`).
    pub mcs: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            config: Config::default(),
            ingress_service: ("projectcontour".into(), "envoy".into()),
            discovery_retry: Duration::from_secs(30),
            workers: 4,
            backoff: Backoff {
                min: Duration::from_millis(100),
                max: Duration::from_secs(300),
            },
            instance: None,
            mcs: false,
        }
    }
}

/// A value that is not `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not namespace/name")]
pub struct NotNamespacedName(pub String);

/// `namespace/name` → (namespace, name); both parts must be non-empty.
pub fn parse_namespaced_name(value: &str) -> Result<(String, String), NotNamespacedName> {
    match value.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(NotNamespacedName(value.to_string())),
    }
}

/// The kind of a source object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    /// `projectcontour.io/v1` HTTPProxy.
    HTTPProxy,
    /// `v1` Service.
    Service,
}

impl SourceKind {
    /// `apiVersion` of the kind.
    pub fn api_version(self) -> &'static str {
        match self {
            SourceKind::HTTPProxy => "projectcontour.io/v1",
            SourceKind::Service => "v1",
        }
    }
    /// `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            SourceKind::HTTPProxy => "HTTPProxy",
            SourceKind::Service => "Service",
        }
    }
    fn from_owner(api_version: &str, kind: &str) -> Option<Self> {
        [SourceKind::HTTPProxy, SourceKind::Service]
            .into_iter()
            .find(|k| k.api_version() == api_version && k.kind() == kind)
    }
}

/// A source object, the unit of work.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    /// Its kind.
    pub kind: SourceKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl SourceKey {
    fn of<K: Resource>(kind: SourceKind, obj: &K) -> Option<Self> {
        Some(SourceKey {
            kind,
            namespace: obj.meta().namespace.clone()?,
            name: obj.meta().name.clone()?,
        })
    }

    /// The source a record the publisher manages belongs to.
    fn owning(record: &ServiceRecord) -> Option<Self> {
        let owner = desired::publisher_owner(record)?;
        Some(SourceKey {
            kind: SourceKind::from_owner(&owner.api_version, &owner.kind)?,
            namespace: record.metadata.namespace.clone()?,
            name: owner.name.clone(),
        })
    }
}

impl std::fmt::Display for SourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.kind(), self.namespace, self.name)
    }
}

/// Prometheus metrics of the publisher.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Reconciles by result (`ok`, `error`).
    pub reconciles: Family<Vec<(String, String)>, Counter>,
    /// Failed reconciles.
    pub reconcile_errors: Counter,
    /// API writes that changed something, by kind and verb.
    pub writes: Family<Vec<(String, String)>, Counter>,
    /// ServiceRecords the publisher currently manages.
    pub managed: Gauge,
    /// Source objects waiting to be reconciled or being reconciled.
    pub queue_depth: Gauge,
    /// Complete (re)lists per watch (`watch` label): the first sync, and each recovery from a
    /// broken watch or 410 Gone.
    pub relists: Family<Vec<(String, String)>, Counter>,
}

impl Metrics {
    /// Register under the `xcc_publisher` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("xcc_publisher");
        r.register(
            "reconciles",
            "Reconciles of source objects, by result",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconciles that failed (retried with backoff)",
            self.reconcile_errors.clone(),
        );
        r.register(
            "object_writes",
            "API writes that changed an object, by kind and verb",
            self.writes.clone(),
        );
        r.register(
            "managed_objects",
            "ServiceRecords managed by the publisher",
            self.managed.clone(),
        );
        r.register(
            "queue_depth",
            "Source objects waiting to be reconciled or being reconciled",
            self.queue_depth.clone(),
        );
        r.register(
            "watch_relists",
            "Complete lists per watch (first sync and recoveries)",
            self.relists.clone(),
        );
    }

    fn reconciled(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&vec![("result".into(), result.into())])
            .inc();
        if !ok {
            self.reconcile_errors.inc();
        }
    }

    fn wrote(&self, kind: &str, verb: &str, n: usize) {
        if n > 0 {
            self.writes
                .get_or_create(&vec![
                    ("kind".into(), kind.into()),
                    ("verb".into(), verb.into()),
                ])
                .inc_by(n as u64);
        }
    }
}

/// Whether the HTTPProxy API is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProxyApi {
    /// Not known yet.
    Unknown,
    /// Not served (no Contour); looked up again periodically.
    Absent,
    /// Served and the proxy store has been listed.
    Synced,
}

/// What the last reconcile of a source reported through a Warning Event, so a lasting
/// condition is reported once, not on every reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reported {
    Skipped(String),
    Conflict(String),
}

struct Shared {
    client: Client,
    settings: Settings,
    metrics: Metrics,
    reporter: Reporter,
    /// Keys to reconcile: each at most once in the queue and at most once in flight.
    queue: Arc<Queue<SourceKey>>,
    proxies: Store<HTTPProxy>,
    services: Store<Service>,
    ingress: Store<Service>,
    nodes: Store<Node>,
    records: Store<ServiceRecord>,
    /// ServiceExports (MCS mode; empty otherwise).
    exports: Store<ServiceExport>,
    /// Imported ServiceRecords, for other clusters' exports of the same name (MCS mode).
    imported: Store<ServiceRecord>,
    /// EndpointSlices of Services, the pods a headless Service exports (MCS mode).
    slices: Store<EndpointSlice>,
    proxy_api: tokio::sync::watch::Sender<ProxyApi>,
    reported: Mutex<HashMap<SourceKey, Reported>>,
    /// Keys of the first full sync not reconciled yet; `None` once ready.
    initial: Mutex<Option<HashSet<SourceKey>>>,
    health: Health,
    reconciles: AtomicU64,
}

impl Shared {
    fn proxy_keys(&self) -> Vec<SourceKey> {
        self.proxies
            .state()
            .iter()
            .filter_map(|p| SourceKey::of(SourceKind::HTTPProxy, p.as_ref()))
            .collect()
    }

    fn service_keys(&self, only_node_port: bool) -> Vec<SourceKey> {
        self.services
            .state()
            .iter()
            .filter(|s| {
                !only_node_port
                    || s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("NodePort")
            })
            .filter_map(|s| SourceKey::of(SourceKind::Service, s.as_ref()))
            .collect()
    }

    fn owner_keys(&self, kind: Option<SourceKind>) -> Vec<SourceKey> {
        self.records
            .state()
            .iter()
            .filter_map(|r| SourceKey::owning(r))
            .filter(|k| kind.is_none_or(|kind| k.kind == kind))
            .collect()
    }

    /// The ServiceExport named like the Service `key`, in MCS mode.
    fn export_of(&self, key: &SourceKey) -> Option<Arc<ServiceExport>> {
        if key.kind != SourceKind::Service {
            return None;
        }
        self.exports
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
    }

    fn ingress_service(&self) -> Option<Arc<Service>> {
        let (ns, name) = &self.settings.ingress_service;
        self.ingress.get(&ObjectRef::new(name).within(ns))
    }

    /// The publisher's records in `namespace`, from the watch cache.
    fn records_in(&self, namespace: &str) -> Vec<Arc<ServiceRecord>> {
        self.records
            .state()
            .into_iter()
            .filter(|r| r.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }

    fn nodes(&self) -> Vec<Node> {
        let mut nodes: Vec<Node> = self.nodes.state().iter().map(|n| (**n).clone()).collect();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        nodes
    }

    /// Record an Event on a source object, `record` naming the ServiceRecord it concerns.
    ///
    /// Events are only emitted when something changed (a write, or a new Warning condition), so
    /// each gets its own Event object: kube-runtime's `Recorder` folds events with the same
    /// reason and objects into one series and keeps the first note, which would hide what
    /// happened the second time.
    async fn event(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
        record: Option<&str>,
    ) {
        let secondary = record.map(|name| ObjectReference {
            api_version: Some(ServiceRecord::api_version(&()).into_owned()),
            kind: Some(ServiceRecord::kind(&()).into_owned()),
            namespace: reference.namespace.clone(),
            name: Some(name.to_string()),
            ..ObjectReference::default()
        });
        let ev = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(xcc_controller::event_note(note)),
            action: "Publish".into(),
            secondary,
        };
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        match recorder.publish(&ev, reference).await {
            Ok(()) => self.metrics.wrote("Event", "publish", 1),
            Err(e) => warn!(error = %e, reason, object = ?reference.name, "could not record Event"),
        }
    }

    /// Report a lasting Warning condition once per change of condition.
    fn newly_reported(&self, key: &SourceKey, now: Option<Reported>) -> bool {
        let mut reported = lock(&self.reported);
        match now {
            None => {
                reported.remove(key);
                false
            }
            Some(now) => reported.insert(key.clone(), now.clone()).as_ref() != Some(&now),
        }
    }
}

fn reference(key: &SourceKey, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some(key.kind.api_version().into()),
        kind: Some(key.kind.kind().into()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        uid,
        ..ObjectReference::default()
    }
}

/// Reconcile one source: publish what it should publish, remove what it no longer should.
async fn reconcile(shared: &Shared, key: &SourceKey) -> Result<(), SyncError> {
    let present = match key.kind {
        SourceKind::HTTPProxy => {
            if *shared.proxy_api.borrow() != ProxyApi::Synced {
                // No HTTPProxy API (yet): nothing can be known about proxies; touch nothing.
                return Ok(());
            }
            desired_of_proxy(shared, key)
        }
        SourceKind::Service => desired_of_service(shared, key),
    };
    let Some((uid, desired)) = present else {
        remove_records(shared, key).await?;
        write_export_status(shared, key, mcs::State::NoService).await?;
        return Ok(());
    };
    let known = shared.records_in(&key.namespace);
    let outcome = apply::sync_source_known(
        &shared.client,
        &key.namespace,
        &uid,
        &desired,
        known.iter().map(|r| r.as_ref()),
    )
    .await?;
    report(shared, key, &uid, &desired, &outcome).await;
    // The hierarchy's word on the written record: its `Announced` condition, as last watched.
    let refusal = desired
        .record()
        .and_then(|r| r.metadata.name.as_deref())
        .and_then(|name| {
            shared
                .records
                .get(&ObjectRef::new(name).within(&key.namespace))
        })
        .and_then(|stored| mcs::refusal(&stored));
    let state = match (&outcome.conflict, &outcome.skipped, desired.record()) {
        (Some(name), _, _) => mcs::State::RecordTaken(name),
        (None, Some(skip), _) => mcs::State::Skipped(skip),
        (None, None, Some(record)) => match &refusal {
            Some(refusal) => mcs::State::Refused(record, refusal),
            // Not stamped as an MCS export beside a ServiceExport: the label decided.
            None if shared.settings.mcs && xcc_proto::mcs::exported_at(record).is_none() => {
                mcs::State::ByLabel(record)
            }
            None => mcs::State::Published(record),
        },
        (None, None, None) => return Ok(()),
    };
    write_export_status(shared, key, state).await?;
    Ok(())
}

/// The HTTPProxy `key`'s uid and what it should publish; `None` when it is gone.
fn desired_of_proxy(shared: &Shared, key: &SourceKey) -> Option<(String, Desired)> {
    let nodes = shared.nodes();
    let proxy = shared
        .proxies
        .get(&ObjectRef::new(&key.name).within(&key.namespace));
    proxy.and_then(|p| {
        let uid = p.metadata.uid.clone()?;
        let ingress = shared.ingress_service();
        Some((
            uid,
            desired::from_httpproxy(&p, ingress.as_deref(), &nodes, &shared.settings.config),
        ))
    })
}

/// The Service `key`'s uid and what it should publish; `None` when it is gone.
fn desired_of_service(shared: &Shared, key: &SourceKey) -> Option<(String, Desired)> {
    let nodes = shared.nodes();
    let service = shared
        .services
        .get(&ObjectRef::new(&key.name).within(&key.namespace));
    let export = shared.export_of(key);
    service.and_then(|s| {
        let uid = s.metadata.uid.clone()?;
        let by = mcs::exported(&s.metadata, export.as_deref());
        // Only a headless Service, or one a ServiceExport alone exports, exports its
        // pods from its slices (read in MCS mode only).
        let headless = s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None");
        let all_slices = if headless || by == desired::ExportedBy::ServiceExport {
            shared.slices.state()
        } else {
            Vec::new()
        };
        let slices = shared.settings.mcs.then(|| {
            desired::slices_of(
                &key.namespace,
                &key.name,
                all_slices.iter().map(|s| s.as_ref()),
            )
        });
        // The clusterset namespace is the Service's own (no namespace mapping here).
        let mut desired = desired::from_exported_service(
            &s,
            by,
            &key.namespace,
            &nodes,
            slices.as_deref(),
            &shared.settings.config,
        );
        // Only an export of pods says what an MCS export carries: a labelled Service that is not
        // headless is exported as XCC v1 exports it (its cluster IP, load balancer or nodes),
        // and a cluster IP is no endpoint for a clusterset Service in the cluster that owns
        // it, so the record must not count as this cluster's own MCS export.
        if headless || by == desired::ExportedBy::ServiceExport {
            mcs::stamp_export(&mut desired, export.as_deref(), s.spec.as_ref());
        }
        Some((uid, desired))
    })
}

/// The source `key` is deleted, or no longer labelled for export: its records go.
async fn remove_records(shared: &Shared, key: &SourceKey) -> Result<(), SyncError> {
    // Deleted, or no longer labelled for export: its records go.
    let known = shared.records_in(&key.namespace);
    let removal = apply::remove_source_records_known(
        &shared.client,
        &key.namespace,
        key.kind.api_version(),
        key.kind.kind(),
        &key.name,
        known.iter().map(|r| r.as_ref()),
    )
    .await?;
    shared.newly_reported(key, None);
    if !removal.removed.is_empty() {
        shared
            .metrics
            .wrote("ServiceRecord", "delete", removal.removed.len());
        info!(source = %key, records = ?removal.removed, "removed ServiceRecords of a source no longer exported");
        shared
            .event(
                &reference(key, removal.owner_uid),
                EventType::Normal,
                "Removed",
                format!(
                    "no longer exported; removed ServiceRecord {}",
                    removal.removed.join(", ")
                ),
                removal.removed.first().map(String::as_str),
            )
            .await;
    }
    Ok(())
}

/// In MCS mode, bring the status conditions of the ServiceExport named like the Service `key`
/// (if there is one) to what `state` says, with server-side apply on the status subresource;
/// no write when they already say it.
async fn write_export_status(
    shared: &Shared,
    key: &SourceKey,
    state: mcs::State<'_>,
) -> Result<(), SyncError> {
    if key.kind != SourceKind::Service {
        return Ok(());
    }
    let Some(export) = shared.export_of(key) else {
        return Ok(());
    };
    if export.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let conflicts = match state.record() {
        Some(record) => mcs::conflicts(
            record,
            shared.settings.config.cluster.as_deref(),
            shared.imported.state().iter().map(|r| r.as_ref()),
        ),
        None => mcs::Conflicts::default(),
    };
    let existing = export
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let conditions = mcs::merge(
        &existing,
        &mcs::conditions(state, &conflicts),
        export.metadata.generation,
        &now,
    );
    if mcs::up_to_date(&existing, &conditions) {
        return Ok(());
    }
    apply::write_export_status(&shared.client, &key.namespace, &key.name, &conditions).await?;
    shared.metrics.wrote("ServiceExport", "apply-status", 1);
    info!(source = %key, "ServiceExport status written");
    Ok(())
}

async fn report(shared: &Shared, key: &SourceKey, uid: &str, desired: &Desired, outcome: &Outcome) {
    let reference = reference(key, Some(uid.to_string()));
    if let Some((name, true)) = &outcome.published {
        shared.metrics.wrote("ServiceRecord", "apply", 1);
        let endpoints = desired.record().map_or(0, |r| r.spec.endpoints.len());
        info!(source = %key, record = %name, endpoints, "published ServiceRecord");
        shared
            .event(
                &reference,
                EventType::Normal,
                "Published",
                format!("ServiceRecord {name} published with {endpoints} endpoint(s)"),
                Some(name),
            )
            .await;
    }
    if !outcome.removed.is_empty() {
        shared
            .metrics
            .wrote("ServiceRecord", "delete", outcome.removed.len());
        info!(source = %key, records = ?outcome.removed, "removed stale ServiceRecords");
        shared
            .event(
                &reference,
                EventType::Normal,
                "Removed",
                format!("removed ServiceRecord {}", outcome.removed.join(", ")),
                outcome.removed.first().map(String::as_str),
            )
            .await;
    }
    let condition = match (&outcome.skipped, &outcome.conflict) {
        (_, Some(name)) => Some(Reported::Conflict(name.clone())),
        (Some(Skip::NotExported), None) | (None, None) => None,
        (Some(skip), None) => Some(Reported::Skipped(skip.to_string())),
    };
    if shared.newly_reported(key, condition.clone()) {
        match condition {
            Some(Reported::Conflict(name)) => {
                warn!(source = %key, record = %name, "a ServiceRecord of that name belongs to someone else");
                shared
                    .event(
                        &reference,
                        EventType::Warning,
                        "Conflict",
                        format!(
                            "ServiceRecord {name} exists and is not managed by {FIELD_MANAGER} for this object; left unchanged"
                        ),
                        Some(&name),
                    )
                    .await;
            }
            Some(Reported::Skipped(why)) => {
                info!(source = %key, reason = %why, "not published");
                shared
                    .event(&reference, EventType::Warning, "Skipped", why, None)
                    .await;
            }
            None => {}
        }
    }
}

async fn worker(shared: Arc<Shared>, cancel: CancellationToken) {
    while let Some(key) = shared.queue.next(&cancel).await {
        let result = reconcile(&shared, &key).await;
        shared.reconciles.fetch_add(1, Ordering::Relaxed);
        shared.metrics.reconciled(result.is_ok());
        let retry_in = shared.queue.done(key.clone(), result.is_ok(), &cancel);
        if let Err(e) = result {
            warn!(source = %key, error = %e, ?retry_in, "reconcile failed");
        }
        shared.metrics.managed.set(shared.records.len() as i64);
        let ready_now = {
            let mut initial = lock(&shared.initial);
            match initial.as_mut() {
                Some(set) => {
                    set.remove(&key);
                    if set.is_empty() {
                        *initial = None;
                        true
                    } else {
                        false
                    }
                }
                None => false,
            }
        };
        if ready_now {
            info!("first sync complete; ready");
            shared.health.set_ready(true);
        }
    }
}

/// Run the publisher until `cancel` fires. `health` turns ready after the first full sync.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    health: Health,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    if settings.workers == 0 {
        anyhow::bail!("the publisher needs at least one worker");
    }
    let (shared, writers) = Shared::new(client, settings, metrics, health.clone());
    health.set_ready(false);
    // Every watch and worker runs until shutdown: one that ends early, fails or panics stops the
    // publisher with an error naming it, and the others are told to stop.
    let tasks = Tasks::new(cancel.child_token());
    let spawner = tasks.spawner().clone();
    spawn_watches(&spawner, &shared, writers);
    let mut supervised = std::pin::pin!(tasks.run());
    // The first sync, unless the tasks stop before it (shutdown, or one that failed).
    let first = tokio::select! {
        r = first_sync(&shared) => Ok(r),
        outcome = &mut supervised => Err(outcome),
    };
    let outcome = match first {
        Err(outcome) => outcome,
        Ok(result) => {
            result?;
            start_reconciling(&shared, &spawner);
            supervised.await
        }
    };
    health.set_ready(false);
    outcome.context("publisher task failed")?;
    info!(
        reconciles = shared.reconciles.load(Ordering::Relaxed),
        "publisher stopped"
    );
    Ok(())
}

/// The first full sync: every store listed, the HTTPProxy API found or known absent.
async fn first_sync(shared: &Shared) -> anyhow::Result<()> {
    let mut proxy_api = shared.proxy_api.subscribe();
    let stores = async {
        shared.services.wait_until_ready().await?;
        shared.ingress.wait_until_ready().await?;
        shared.nodes.wait_until_ready().await?;
        if shared.settings.mcs {
            shared.exports.wait_until_ready().await?;
            shared.imported.wait_until_ready().await?;
            shared.slices.wait_until_ready().await?;
        }
        shared.records.wait_until_ready().await
    };
    // Map the borrowed value away at once: it must not be held across an await.
    let proxies = async {
        proxy_api
            .wait_for(|s| *s != ProxyApi::Unknown)
            .await
            .map(|_| ())
    };
    let (stores, proxies) = tokio::join!(stores, proxies);
    stores.map_err(|e| anyhow::anyhow!("{e}"))?;
    proxies.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// After the first sync: queue every source and owner (ready at once when there are none) and
/// start the workers.
fn start_reconciling(shared: &Arc<Shared>, spawner: &Spawner) {
    let mut keys: HashSet<SourceKey> = shared.service_keys(false).into_iter().collect();
    if *shared.proxy_api.borrow() == ProxyApi::Synced {
        keys.extend(shared.proxy_keys());
    }
    keys.extend(shared.owner_keys(Some(SourceKind::Service)));
    if *shared.proxy_api.borrow() == ProxyApi::Synced {
        keys.extend(shared.owner_keys(Some(SourceKind::HTTPProxy)));
    }
    info!(sources = keys.len(), "watches listed; reconciling");
    if keys.is_empty() {
        *lock(&shared.initial) = None;
        info!("first sync complete; ready");
        shared.health.set_ready(true);
    } else {
        *lock(&shared.initial) = Some(keys.clone());
        shared.queue.add_all(keys);
    }
    let cancel = spawner.token();
    for i in 0..shared.settings.workers {
        spawner.spawn_infallible(
            format!("worker {i}"),
            worker(shared.clone(), cancel.clone()),
        );
    }
}

/// [`run`] under leader election on the `xcc-publisher` Lease (`leader: None` runs at once).
/// Not ready while not leading; returns when `cancel` fires (after releasing the Lease), and
/// fails when leadership is lost or the controller fails.
pub async fn serve(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    health: Health,
    leader: Option<xcc_controller::leader::LeaderConfig>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    xcc_controller::leader::run_as_ready_leader(
        client.clone(),
        leader,
        cancel,
        health.clone(),
        move |token| run(client, settings, metrics, health, token),
    )
    .await
}

#[cfg(test)]
mod tests;
