//! The running binder: watches imported ServiceRecords and RemoteRegistries in its namespace
//! and the objects it manages, and keeps each group's objects equal to what
//! [`crate::desired`] computes, writing with [`crate::apply`].
//!
//! Keys ([`keys::Key`]): an FQDN group (`Service` materialisation) or an origin
//! (`CiliumGlobalService` materialisation, chosen by the record's RemoteRegistry
//! `spec.materialize`). Every watch event maps to the keys it concerns; a record maps to both of
//! its keys, so a record that changes mode is removed from one and added to the other. Five
//! reflectors hold the state (imported records, RemoteRegistries, managed Services in every
//! namespace, managed EndpointSlices and Endpoints in the namespace); reconciles read them and
//! are level-triggered and idempotent. Keys go through a work queue ([`xcc_controller::queue`]) with per-key
//! exponential backoff; after every relist (410 Gone) and every `resync` period all keys are
//! reconciled again — with no write when nothing differs.
//!
//! A group whose last record is gone has its objects removed (the API server's garbage
//! collector does it through the owner references too; an explicit delete that finds nothing is
//! fine). A global Service whose sources are gone follows the orphan rule of Cilium mode: removed,
//! unless local endpoints exist; when the binder may not count them (403), it is kept, with a
//! Warning Event once and retries with backoff. Objects of the same name the binder does not
//! manage — global Services of another install (another namespace's binder) or without the
//! install annotation ([`crate::desired::cilium::INSTALL_ANNOTATION`]) included — are never
//! touched: the records get a `Conflict` condition and a Warning Event instead, as they do
//! when the sources of one FQDN disagree on ports.
//!
//! In MCS mode a group also takes this cluster's own MCS exports of its FQDN (the publisher's
//! records, watched in every namespace; KEP-1645: the exporting cluster has the service too, its
//! endpoints beside the imported ones). They own nothing (they live in other namespaces) and get
//! no condition.
//!
//! Ready ([`Handle::is_ready`], `/readyz`) once every watch has listed and every key found then
//! has been reconciled once.

pub mod conditions;
mod events;
pub mod keys;
pub mod metrics;
mod reconcile;

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use xcc_controller::plumbing::lock;

use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use xcc_controller::probes::Health;
use xcc_controller::queue;
use xcc_controller::tasks::{Spawner, Tasks};
use xcc_controller::watch;
use xcc_proto::crd::{
    BINDER_MANAGER, ENDPOINTSLICE_MANAGED_BY_LABEL, ENDPOINTSLICE_SERVICE_NAME_LABEL,
    MANAGED_BY_LABEL, Materialize, RemoteRegistry, ServiceRecord,
};
use xcc_proto::names::{self, IMPORTED_LABEL};
use xcc_proto::propagation;

use crate::apply::{self, ApplyError, FIELD_MANAGER, SyncError, Written};
use crate::desired::cilium::{self, CiliumSkip, OriginKey, OrphanDecision};
use crate::desired::{GroupKey, Skip, materialize};
use conditions::Found;
use events::{Managed as _, ManagedEvents, RecordEvents, RegistryEvents, follow, uid_of};
use keys::Key;
pub use metrics::Metrics;

/// Name of the leader-election Lease, and the Event reporter.
pub const COMPONENT: &str = "xcc-binder";

/// Settings of the controller.
#[derive(Clone, Debug)]
pub struct Config {
    /// Namespace of the deployment: imported records, RemoteRegistries, the Services made; also
    /// the install's identity on the global Services it makes in other namespaces.
    pub namespace: String,
    /// Reconciles running at once (different keys).
    pub workers: usize,
    /// Every key is reconciled again this often (the orphan check of global Services with
    /// local endpoints relies on it).
    pub resync: Duration,
    /// Also write a ServiceImport per import (the Multi-Cluster Services API,
    /// [`crate::mcs_run`]; needs the MCS CRDs and the RBAC of `deploy/overlays/mcs`).
    pub mcs: bool,
}

impl Config {
    /// Defaults for `namespace`: 4 workers, a resync every 10 minutes.
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            workers: 4,
            resync: Duration::from_secs(600),
            mcs: false,
        }
    }
}

/// Why a reconcile failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Reading or writing an object failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// An object of the name the binder would write is someone else's; the records carry a
    /// `Conflict` condition, and the key is retried with backoff until the object is gone
    /// (objects the binder does not manage are not watched).
    #[error(transparent)]
    NotManaged(ApplyError),
    /// Writing a record's status failed.
    #[error("writing the status of ServiceRecord {name}: {source}")]
    Status {
        /// The record.
        name: String,
        /// The client's error.
        source: kube::Error,
    },
}

struct Writers {
    records: reflector::store::Writer<ServiceRecord>,
    local: reflector::store::Writer<ServiceRecord>,
    registries: reflector::store::Writer<RemoteRegistry>,
    services: reflector::store::Writer<Service>,
    slices: reflector::store::Writer<EndpointSlice>,
    endpoints: reflector::store::Writer<Endpoints>,
}

struct Ctx {
    client: Client,
    config: Config,
    records: Store<ServiceRecord>,
    /// This cluster's own MCS exports (the publisher's records, every namespace; MCS mode
    /// only): KEP-1645 gives the exporting cluster the service too, its endpoints among the
    /// imports'.
    local: Store<ServiceRecord>,
    registries: Store<RemoteRegistry>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    endpoints: Store<Endpoints>,
    queue: Arc<queue::Queue<Key>>,
    recorder: Recorder,
    metrics: Metrics,
    health: Health,
    /// Keys of the first full sync not reconciled yet; `None` once it is done.
    initial: Mutex<Option<HashSet<Key>>>,
    /// Last warning (reason, message) sent per key, so a resync repeats no Event.
    warned: Mutex<HashMap<String, String>>,
    reconciles: AtomicU64,
    relists: AtomicU64,
    /// Set once every store has listed (the first full sync starts then). Kept as a flag: polling
    /// a store's readiness future from here would replace the waker of the task waiting for it
    /// (kube-runtime's `wait_until_ready` wakes only its last poller), and that task would
    /// never learn that the store became ready.
    listed: AtomicBool,
    /// The propagation stamp last observed per imported record (by UID), so a resync or a
    /// relist observes no change twice; pruned to the listed records at each relist.
    propagated: Mutex<HashMap<String, SystemTime>>,
    /// Records stamped before the binder started changed while it was not watching: their
    /// latency would measure the binder's downtime, not propagation, and is not observed.
    started: SystemTime,
}

/// The binder controller, before it runs.
pub struct Controller {
    ctx: Arc<Ctx>,
    writers: Writers,
}

/// A view of a running controller, for probes and tests.
#[derive(Clone)]
pub struct Handle {
    ctx: Arc<Ctx>,
}

impl Handle {
    /// The first full sync is done.
    pub fn is_ready(&self) -> bool {
        self.ctx.health.is_ready()
    }
    /// Reconciles finished so far (either result).
    pub fn reconciles(&self) -> u64 {
        self.ctx.reconciles.load(Ordering::SeqCst)
    }
    /// Relists seen after the initial lists (one per watch per 410 Gone).
    pub fn relists(&self) -> u64 {
        self.ctx.relists.load(Ordering::SeqCst)
    }
    /// No key queued, none being reconciled, no retry pending.
    pub fn is_idle(&self) -> bool {
        self.ctx.queue.is_idle()
    }
    /// Queue every key now, as the periodic resync does.
    pub fn resync_now(&self) {
        self.ctx.queue.add_all(self.ctx.all_keys());
    }
    /// Refresh the managed-object gauges (call before a metrics scrape).
    pub fn refresh_gauges(&self) {
        let c = &self.ctx;
        c.metrics.set_managed("Service", c.services.state().len());
        c.metrics
            .set_managed("EndpointSlice", c.slices.state().len());
        c.metrics
            .set_managed("Endpoints", c.endpoints.state().len());
    }
}

impl Controller {
    /// A controller for `config`; nothing runs until [`Controller::run`].
    pub fn new(client: Client, config: Config, metrics: Metrics, health: Health) -> Self {
        let (records, records_w) = reflector::store();
        let (local, local_w) = reflector::store();
        let (registries, registries_w) = reflector::store();
        let (services, services_w) = reflector::store();
        let (slices, slices_w) = reflector::store();
        let (endpoints, endpoints_w) = reflector::store();
        let reporter = Reporter {
            controller: COMPONENT.to_string(),
            instance: std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()),
        };
        let ctx = Arc::new(Ctx {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            records,
            local,
            registries,
            services,
            slices,
            endpoints,
            queue: Arc::default(),
            metrics,
            health,
            initial: Mutex::new(None),
            warned: Mutex::default(),
            reconciles: AtomicU64::new(0),
            relists: AtomicU64::new(0),
            listed: AtomicBool::new(false),
            propagated: Mutex::default(),
            started: SystemTime::now(),
        });
        Self {
            ctx,
            writers: Writers {
                records: records_w,
                local: local_w,
                registries: registries_w,
                services: services_w,
                slices: slices_w,
                endpoints: endpoints_w,
            },
        }
    }

    /// A handle to observe the controller while it runs.
    pub fn handle(&self) -> Handle {
        Handle {
            ctx: self.ctx.clone(),
        }
    }

    /// Watch and reconcile until `cancel` fires; in-flight reconciles finish first. Every watch,
    /// worker and the resync are supervised for as long as the binder runs: one that stops on
    /// its own or panics stops the binder with an error naming it.
    pub async fn run(self, cancel: CancellationToken) -> anyhow::Result<()> {
        let ctx = self.ctx;
        let w = self.writers;
        let ns = ctx.config.namespace.clone();
        let client = ctx.client.clone();
        let managed = format!("{MANAGED_BY_LABEL}={BINDER_MANAGER}");
        let tasks = Tasks::new(cancel.child_token());
        let spawner = tasks.spawner().clone();
        let stop = spawner.token().clone();

        spawner.spawn_infallible(
            "ServiceRecord watch",
            follow(
                Api::<ServiceRecord>::namespaced(client.clone(), &ns),
                watcher::Config::default().labels(IMPORTED_LABEL),
                w.records,
                ctx.clone(),
                stop.clone(),
                RecordEvents::default(),
            ),
        );
        if ctx.config.mcs {
            spawner.spawn_infallible(
                "local MCS export watch",
                follow(
                    Api::<ServiceRecord>::all(client.clone()),
                    watcher::Config::default().labels(&crate::mcs::local_export_selector()),
                    w.local,
                    ctx.clone(),
                    stop.clone(),
                    RecordEvents::local(),
                ),
            );
        }
        spawner.spawn_infallible(
            "RemoteRegistry watch",
            follow(
                Api::<RemoteRegistry>::namespaced(client.clone(), &ns),
                watcher::Config::default(),
                w.registries,
                ctx.clone(),
                stop.clone(),
                RegistryEvents::default(),
            ),
        );
        spawner.spawn_infallible(
            "Service watch",
            follow(
                Api::<Service>::all(client.clone()),
                watcher::Config::default().labels(&managed),
                w.services,
                ctx.clone(),
                stop.clone(),
                ManagedEvents,
            ),
        );
        spawner.spawn_infallible(
            "EndpointSlice watch",
            follow(
                Api::<EndpointSlice>::namespaced(client.clone(), &ns),
                watcher::Config::default().labels(&format!(
                    "{ENDPOINTSLICE_MANAGED_BY_LABEL}={BINDER_MANAGER}"
                )),
                w.slices,
                ctx.clone(),
                stop.clone(),
                ManagedEvents,
            ),
        );
        spawner.spawn_infallible(
            "Endpoints watch",
            follow(
                Api::<Endpoints>::namespaced(client.clone(), &ns),
                watcher::Config::default().labels(&managed),
                w.endpoints,
                ctx.clone(),
                stop.clone(),
                ManagedEvents,
            ),
        );
        if ctx.config.mcs {
            spawner.spawn_infallible(
                "ServiceImport sync",
                crate::mcs_run::run(client.clone(), ns.clone(), stop.clone()),
            );
        }
        let s = spawner.clone();
        spawner.spawn("binder start-up", start_up(ctx.clone(), s));

        let result = tasks.run().await;
        ctx.health.set_ready(false);
        tracing::info!("binder stopped");
        Ok(result?)
    }
}

/// Once every store holds a complete listing, queue every key and start the workers and the
/// resync; then wait for shutdown.
async fn start_up(ctx: Arc<Ctx>, spawner: Spawner) -> anyhow::Result<()> {
    let stop = spawner.token().clone();
    // Reconcile nothing before every store holds a complete listing: a half-listed store would
    // make present objects look orphaned.
    let listed = async {
        ctx.records.wait_until_ready().await?;
        if ctx.config.mcs {
            ctx.local.wait_until_ready().await?;
        }
        ctx.registries.wait_until_ready().await?;
        ctx.services.wait_until_ready().await?;
        ctx.slices.wait_until_ready().await?;
        ctx.endpoints.wait_until_ready().await
    };
    tokio::select! {
        _ = stop.cancelled() => return Ok(()),
        r = listed => r.map_err(|_| anyhow::anyhow!("a watch of the binder stopped before listing"))?,
    }
    ctx.listed.store(true, Ordering::SeqCst);
    let initial: HashSet<Key> = ctx.all_keys().into_iter().collect();
    tracing::info!(
        namespace = %ctx.config.namespace,
        keys = initial.len(),
        "binder watches listed; reconciling"
    );
    if initial.is_empty() {
        ctx.health.set_ready(true);
    } else {
        *lock(&ctx.initial) = Some(initial.clone());
        ctx.queue.add_all(initial);
    }
    for i in 0..ctx.config.workers.max(1) {
        spawner.spawn_infallible(
            format!("binder worker {i}"),
            work(ctx.clone(), stop.clone()),
        );
    }
    let resync = ctx.config.resync;
    let (resync_ctx, resync_stop) = (ctx.clone(), stop.clone());
    spawner.spawn("binder resync", async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
        loop {
            tokio::select! {
                _ = resync_stop.cancelled() => return Ok(()),
                _ = tick.tick() => resync_ctx.queue.add_all(resync_ctx.all_keys()),
            }
        }
    });
    stop.cancelled().await;
    Ok(())
}

async fn work(ctx: Arc<Ctx>, stop: CancellationToken) {
    while let Some(key) = ctx.queue.next(&stop).await {
        let result = ctx.reconcile(&key).await;
        let ok = result.is_ok();
        if let Err(e) = &result {
            tracing::warn!(%key, error = %e, "reconcile failed; retrying with backoff");
        }
        ctx.metrics.reconciled(ok);
        ctx.reconciles.fetch_add(1, Ordering::SeqCst);
        ctx.queue.done(key.clone(), ok, &stop);
        let mut initial = lock(&ctx.initial);
        if let Some(pending) = initial.as_mut() {
            pending.remove(&key);
            if pending.is_empty() {
                *initial = None;
                ctx.health.set_ready(true);
                tracing::info!("binder first sync done; ready");
            }
        }
    }
}

fn object_ref<K: Resource<DynamicType = ()>>(o: &K) -> ObjectReference {
    o.object_ref(&())
}

impl Ctx {
    /// Whether the first full sync has started (keys are queued from then on).
    fn listed_before(&self) -> bool {
        self.listed.load(Ordering::SeqCst)
    }

    /// Every key the stores know of: those of the imported records and of managed objects.
    fn all_keys(&self) -> Vec<Key> {
        let mut keys: HashSet<Key> = HashSet::new();
        for r in self.records.state() {
            keys.extend(keys::record_keys(&r));
        }
        for r in self.local.state() {
            keys.extend(self.local_keys(&r));
        }
        for s in self.services.state() {
            keys.extend(s.key(self));
        }
        for s in self.slices.state() {
            keys.extend(s.key(self));
        }
        for e in self.endpoints.state() {
            keys.extend(e.key(self));
        }
        let mut keys: Vec<Key> = keys.into_iter().collect();
        keys.sort();
        keys
    }

    /// The group whose Service is `namespace/name`: from the managed Service when it exists,
    /// else from the imported records.
    fn key_of_service_name(&self, namespace: &str, name: &str) -> Option<Key> {
        if namespace != self.config.namespace {
            return None;
        }
        if let Some(svc) = self.services.get(&ObjectRef::new(name).within(namespace))
            && let Some(key) = svc.key(self)
        {
            return Some(key);
        }
        self.records
            .state()
            .iter()
            .filter_map(|r| keys::group_key(r))
            .find(|g| g.namespace == namespace && names::service_name(&g.fqdn) == name)
            .map(Key::Group)
    }

    /// How an imported record is materialised: its RemoteRegistry's `spec.materialize`;
    /// `Service` when the registry is unknown.
    fn mode(&self, record: &ServiceRecord) -> Materialize {
        keys::remote_registry(record)
            .and_then(|rr| {
                self.registries
                    .get(&ObjectRef::new(rr).within(&self.config.namespace))
            })
            .map(|rr| rr.spec.materialize())
            .unwrap_or_default()
    }

    /// The group of this cluster's own MCS export `r` (its FQDN, in the binder's namespace):
    /// none for a record that is no MCS export.
    fn local_keys(&self, r: &ServiceRecord) -> Vec<Key> {
        if !crate::mcs::is_local_mcs_export(r) {
            return Vec::new();
        }
        names::canonical_fqdn(&r.spec.fqdn)
            .map(|fqdn| {
                Key::Group(GroupKey {
                    namespace: self.config.namespace.clone(),
                    fqdn,
                })
            })
            .into_iter()
            .collect()
    }

    /// The imported records that contribute to `key`, and (MCS mode) this cluster's own MCS
    /// exports of its group, sorted by UID.
    fn sources(&self, key: &Key) -> Vec<Arc<ServiceRecord>> {
        let mut sources: Vec<Arc<ServiceRecord>> = self
            .records
            .state()
            .into_iter()
            .filter(|r| {
                r.metadata.namespace.as_deref() == Some(self.config.namespace.as_str())
                    && keys::contributes(r, self.mode(r), key)
            })
            .collect();
        sources.extend(
            self.local
                .state()
                .into_iter()
                .filter(|r| self.local_keys(r).contains(key)),
        );
        sources.sort_by(|a, b| a.metadata.uid.cmp(&b.metadata.uid));
        sources
    }

    /// The objects for `records` are written: observe `xcc_binder_propagation_seconds` for each
    /// record whose propagation stamp is new since the last observation and since the binder
    /// started (labelled with its RemoteRegistry).
    fn observe_propagation(&self, records: &[&ServiceRecord]) {
        let now = SystemTime::now();
        let mut seen = lock(&self.propagated);
        for r in records {
            let Some(stamp) = r
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(propagation::CHANGED_AT_ANNOTATION))
                .and_then(|v| propagation::parse_stamp(v).ok())
            else {
                continue;
            };
            if seen.insert(uid_of(*r), stamp) == Some(stamp)
                || !propagation::is_fresh(stamp, false, self.started)
            {
                continue;
            }
            let source = r
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(names::REMOTE_REGISTRY_LABEL))
                .map_or("", String::as_str);
            self.metrics.propagated(source, stamp, now);
        }
    }

    /// Forget the stamps of records no longer listed (`uids`: those that are).
    fn prune_propagated(&self, uids: &HashMap<String, Vec<Key>>) {
        lock(&self.propagated).retain(|uid, _| uids.contains_key(uid));
    }

    async fn count_written(&self, written: &Written, namespace: &str) {
        for applied in &written.applied {
            let kind = applied.split('/').next().unwrap_or_default();
            let verb = if applied.ends_with("/status") {
                "status"
            } else {
                "apply"
            };
            self.metrics.wrote(kind, verb);
        }
        for _ in &written.deleted {
            self.metrics.wrote("EndpointSlice", "delete");
        }
        for created in &written.created {
            let (kind, name) = created.split_once('/').unwrap_or(("", created));
            if kind != "Service" && kind != "Namespace" {
                continue;
            }
            let (api_version, namespace) =
                ("v1", (kind == "Service").then(|| namespace.to_string()));
            self.event(
                ObjectReference {
                    api_version: Some(api_version.into()),
                    kind: Some(kind.into()),
                    name: Some(name.into()),
                    namespace,
                    ..ObjectReference::default()
                },
                EventType::Normal,
                "Created",
                "Materialize",
                format!("{kind} {name} created for imported ServiceRecords"),
            )
            .await;
        }
    }

    /// Record that `subject` (a key, or a record) has the warning `reason: note`; true when it
    /// is new (send an Event). Kept in memory, so a store that trails the API server never
    /// repeats an Event.
    fn note_warning(&self, subject: &impl std::fmt::Display, reason: &str, note: &str) -> bool {
        let text = format!("{reason}: {note}");
        lock(&self.warned).insert(subject.to_string(), text.clone()) != Some(text)
    }

    fn forget_warning(&self, subject: &impl std::fmt::Display) {
        lock(&self.warned).remove(&subject.to_string());
    }

    /// A Warning Event on each record, once per distinct warning of the key.
    async fn warn_once(&self, key: &Key, records: &[&ServiceRecord], reason: &str, note: &str) {
        tracing::warn!(%key, reason, note, "cannot materialise");
        if self.note_warning(key, reason, note) {
            for record in records {
                self.event(
                    object_ref(*record),
                    EventType::Warning,
                    reason,
                    "Materialize",
                    note.to_string(),
                )
                .await;
            }
        }
    }

    /// Publish an Event; failures are logged, never fail the reconcile.
    async fn event(
        &self,
        regarding: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(xcc_controller::event_note(note)),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &regarding).await {
            tracing::warn!(reason, error = %e, "could not write an Event");
        }
    }
}
