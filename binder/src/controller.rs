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
pub mod keys;
pub mod metrics;

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
                    RecordEvents {
                        local: true,
                        ..RecordEvents::default()
                    },
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

/// Maps one watch's events to keys.
trait OnEvent<K>: Send + 'static {
    fn on_event(&mut self, ctx: &Ctx, event: &watcher::Event<K>);
}

/// Imported records: both keys of the record, and the keys it had before (an FQDN or origin
/// change leaves a group that must be reconciled too).
#[derive(Default)]
struct RecordEvents {
    last: HashMap<String, Vec<Key>>,
    listing: HashMap<String, Vec<Key>>,
    /// The watch of this cluster's own MCS exports ([`Ctx::local_keys`]).
    local: bool,
}

impl RecordEvents {
    fn keys(&self, ctx: &Ctx, r: &ServiceRecord) -> Vec<Key> {
        if self.local {
            ctx.local_keys(r)
        } else {
            keys::record_keys(r)
        }
    }
}

fn uid_of<K: Resource>(o: &K) -> String {
    o.meta().uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            o.meta().namespace.as_deref().unwrap_or(""),
            o.meta().name.as_deref().unwrap_or("")
        )
    })
}

impl OnEvent<ServiceRecord> for RecordEvents {
    fn on_event(&mut self, ctx: &Ctx, event: &watcher::Event<ServiceRecord>) {
        match event {
            watcher::Event::Apply(r) => {
                let keys = self.keys(ctx, r);
                if let Some(old) = self.last.insert(uid_of(r), keys.clone()) {
                    ctx.queue.add_all(old);
                }
                ctx.queue.add_all(keys);
            }
            watcher::Event::Delete(r) => {
                lock(&ctx.propagated).remove(&uid_of(r));
                if let Some(old) = self.last.remove(&uid_of(r)) {
                    ctx.queue.add_all(old);
                }
                ctx.queue.add_all(self.keys(ctx, r));
            }
            watcher::Event::Init => self.listing.clear(),
            watcher::Event::InitApply(r) => {
                let keys = self.keys(ctx, r);
                self.listing.insert(uid_of(r), keys);
            }
            watcher::Event::InitDone => {
                let old = std::mem::replace(&mut self.last, std::mem::take(&mut self.listing));
                ctx.prune_propagated(&self.last);
                if ctx.listed_before() {
                    // Records deleted while the watch was down have no Delete event.
                    ctx.queue.add_all(old.into_values().flatten());
                }
            }
        }
    }
}

/// RemoteRegistries: a change of `spec.materialize` moves its records between keys.
#[derive(Default)]
struct RegistryEvents(keys::Modes);

impl OnEvent<RemoteRegistry> for RegistryEvents {
    fn on_event(&mut self, ctx: &Ctx, event: &watcher::Event<RemoteRegistry>) {
        if let Some(name) = self.0.changed(event) {
            ctx.queue.add_all(
                ctx.records
                    .state()
                    .iter()
                    .filter(|r| keys::remote_registry(r) == Some(name.as_str()))
                    .flat_map(|r| keys::record_keys(r)),
            );
        }
    }
}

/// Objects the binder manages: drift (edits, deletions by someone else) reconciles their key.
struct ManagedEvents;

trait Managed: Resource<DynamicType = ()> + Clone {
    fn key(&self, ctx: &Ctx) -> Option<Key>;
}

impl Managed for Service {
    fn key(&self, ctx: &Ctx) -> Option<Key> {
        keys::service_key(self, &ctx.config.namespace)
    }
}

impl Managed for EndpointSlice {
    fn key(&self, ctx: &Ctx) -> Option<Key> {
        ctx.key_of_service_name(
            self.metadata.namespace.as_deref()?,
            keys::slice_service_name(&self.metadata)?,
        )
    }
}

impl Managed for Endpoints {
    fn key(&self, ctx: &Ctx) -> Option<Key> {
        ctx.key_of_service_name(
            self.metadata.namespace.as_deref()?,
            self.metadata.name.as_deref()?,
        )
    }
}

impl<K: Managed + Send + Sync + 'static> OnEvent<K> for ManagedEvents {
    fn on_event(&mut self, ctx: &Ctx, event: &watcher::Event<K>) {
        if let watcher::Event::Apply(o) | watcher::Event::Delete(o) = event
            && let Some(key) = o.key(ctx)
        {
            ctx.queue.add(key);
        }
    }
}

/// Run one reflector-backed watch until `stop` ([`watch::follow`]), mapping events to keys.
/// After a relist (every listing but the first) all keys are reconciled again.
async fn follow<K, H>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    ctx: Arc<Ctx>,
    stop: CancellationToken,
    mut handler: H,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    H: OnEvent<K>,
{
    let kind = K::kind(&()).to_string();
    let mut listed = false;
    watch::follow(&kind, watch::watch(api, config), writer, stop, |event| {
        handler.on_event(&ctx, event);
        if matches!(event, watcher::Event::InitDone) {
            if listed {
                tracing::info!(%kind, "relisted; reconciling every key");
                if ctx.listed_before() {
                    ctx.queue.add_all(ctx.all_keys());
                }
                // Counted after the keys are queued, so a test that saw the count and then an
                // idle queue knows the relist was handled.
                ctx.relists.fetch_add(1, Ordering::SeqCst);
                ctx.metrics.relisted();
            }
            listed = true;
        }
    })
    .await;
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

    async fn reconcile(&self, key: &Key) -> Result<(), ReconcileError> {
        match key {
            Key::Group(g) => self.reconcile_group(key, g).await,
            Key::Global(o) => self.reconcile_global(key, o).await,
        }
    }

    async fn reconcile_group(&self, key: &Key, group: &GroupKey) -> Result<(), ReconcileError> {
        self.warn_without_origin(group).await;
        let sources = self.sources(key);
        if sources.is_empty() {
            self.forget_warning(key);
            return self.remove_group(group).await;
        }
        let all: Vec<&ServiceRecord> = sources.iter().map(AsRef::as_ref).collect();
        // Conditions and Events go on the imported records only: this cluster's own exports
        // are the publisher's, in other namespaces.
        let refs: Vec<&ServiceRecord> = all
            .iter()
            .copied()
            .filter(|r| r.metadata.namespace.as_deref() == Some(self.config.namespace.as_str()))
            .collect();
        let m = match materialize(group, &all) {
            Ok(m) => m,
            Err(Skip::Empty) => return self.remove_group(group).await,
            Err(e @ Skip::NoPorts(_)) => {
                // Nothing valid to write; what exists stays until a record changes.
                self.warn_once(key, &refs, "NoPorts", &e.to_string()).await;
                return Ok(());
            }
        };
        self.forget_warning(key);
        for d in &m.dropped {
            tracing::debug!(record = %d.record, endpoint = %d.endpoint, reason = d.reason, "endpoint left out");
        }
        let known = self.slices.state();
        let found = match apply::sync_group_known(
            &self.client,
            &group.namespace,
            &m,
            known.iter().map(AsRef::as_ref),
        )
        .await
        {
            Ok(written) => {
                self.count_written(&written, &group.namespace).await;
                self.observe_propagation(&refs);
                m.conflict.as_ref().map(|c| Found {
                    reason: conditions::PORTS_DISAGREE,
                    message: c.to_string(),
                })
            }
            Err(ApplyError::Api(e)) => return Err(e.into()),
            Err(e @ ApplyError::NotManaged { .. }) => {
                return Err(self.not_managed(&refs, e).await);
            }
        };
        self.set_conflicts(&refs, found.as_ref()).await
    }

    async fn reconcile_global(&self, key: &Key, origin: &OriginKey) -> Result<(), ReconcileError> {
        let sources = self.sources(key);
        if sources.is_empty() {
            return self.orphan_check(key, origin).await;
        }
        let refs: Vec<&ServiceRecord> = sources.iter().map(AsRef::as_ref).collect();
        let install = self.config.namespace.as_str();
        let desired = match cilium::global_service(origin, &refs, install) {
            Ok(s) => s,
            Err(CiliumSkip::Empty) => return self.orphan_check(key, origin).await,
            Err(e @ CiliumSkip::NoPorts(_)) => {
                self.warn_once(key, &refs, "NoPorts", &e.to_string()).await;
                return Ok(());
            }
        };
        self.forget_warning(key);
        let found = match apply::sync_global_service(&self.client, &desired, install).await {
            Ok(written) => {
                self.count_written(&written, &origin.namespace).await;
                self.observe_propagation(&refs);
                None
            }
            Err(ApplyError::Api(e)) => return Err(e.into()),
            Err(e @ ApplyError::NotManaged { .. }) => {
                return Err(self.not_managed(&refs, e).await);
            }
        };
        self.set_conflicts(&refs, found.as_ref()).await
    }

    /// Records of this FQDN group that ask for a Cilium global Service but name no origin
    /// cannot be materialised at all: a Warning Event on them (once).
    async fn warn_without_origin(&self, group: &GroupKey) {
        let stuck: Vec<Arc<ServiceRecord>> = self
            .records
            .state()
            .into_iter()
            .filter(|r| {
                r.spec.origin.is_none()
                    && keys::group_key(r).as_ref() == Some(group)
                    && self.mode(r) == Materialize::CiliumGlobalService
            })
            .collect();
        let marker = Key::Global(OriginKey {
            namespace: group.namespace.clone(),
            name: format!("<no origin: {}>", group.fqdn),
        });
        if stuck.is_empty() {
            self.forget_warning(&marker);
            return;
        }
        let refs: Vec<&ServiceRecord> = stuck.iter().map(AsRef::as_ref).collect();
        self.warn_once(
            &marker,
            &refs,
            "NoOrigin",
            "its RemoteRegistry materialises CiliumGlobalService, which needs spec.origin; none is set",
        )
        .await;
    }

    /// The group has no source left: delete the binder's objects of it (normally the garbage
    /// collector has already, through the owner references).
    async fn remove_group(&self, group: &GroupKey) -> Result<(), ReconcileError> {
        let ns = group.namespace.as_str();
        let name = names::service_name(&group.fqdn);
        let want = Some(Key::Group(group.clone()));
        if let Some(svc) = self.services.get(&ObjectRef::new(&name).within(ns))
            && svc.key(self) == want
        {
            let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
            if apply::delete_exact(&api, "Service", ns, &name, &uid_of(svc.as_ref())).await? {
                self.metrics.wrote("Service", "delete");
                self.event(
                    object_ref(svc.as_ref()),
                    EventType::Normal,
                    "Removed",
                    "Delete",
                    format!("no imported ServiceRecord for {} is left", group.fqdn),
                )
                .await;
            }
        }
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
        for slice in self.slices.state() {
            if slice.metadata.namespace.as_deref() == Some(ns)
                && keys::slice_service_name(&slice.metadata) == Some(name.as_str())
                && apply::delete_exact(
                    &api,
                    "EndpointSlice",
                    ns,
                    &slice.name_any(),
                    &uid_of(slice.as_ref()),
                )
                .await?
            {
                self.metrics.wrote("EndpointSlice", "delete");
            }
        }
        if let Some(ep) = self.endpoints.get(&ObjectRef::new(&name).within(ns)) {
            let api: Api<Endpoints> = Api::namespaced(self.client.clone(), ns);
            if apply::delete_exact(&api, "Endpoints", ns, &name, &uid_of(ep.as_ref())).await? {
                self.metrics.wrote("Endpoints", "delete");
            }
        }
        Ok(())
    }

    /// Seed 004's orphan rule for a global Service whose sources are gone. Its warnings (kept,
    /// check refused) are sent once, not again at every resync or retry.
    async fn orphan_check(&self, key: &Key, origin: &OriginKey) -> Result<(), ReconcileError> {
        let install = self.config.namespace.as_str();
        let Some(svc) = self
            .services
            .get(&ObjectRef::new(&origin.name).within(&origin.namespace))
            .filter(|svc| keys::is_global_service(svc, install))
        else {
            self.forget_warning(key);
            return Ok(());
        };
        let local = match self.local_endpoints(origin).await {
            Ok(local) => local,
            Err(e) => return Err(self.orphan_check_failed(key, &svc, e).await),
        };
        match cilium::orphan_decision(&svc, install, false, local) {
            OrphanDecision::Delete => {
                let api: Api<Service> = Api::namespaced(self.client.clone(), &origin.namespace);
                if apply::delete_exact(
                    &api,
                    "Service",
                    &origin.namespace,
                    &origin.name,
                    &uid_of(svc.as_ref()),
                )
                .await?
                {
                    self.metrics.wrote("Service", "delete");
                    self.event(
                        object_ref(svc.as_ref()),
                        EventType::Normal,
                        "Removed",
                        "Delete",
                        "no imported ServiceRecord for this global service is left".to_string(),
                    )
                    .await;
                }
            }
            OrphanDecision::Keep => {
                let note = format!(
                    "no imported ServiceRecord for this global service is left, but it has {local} local endpoint(s); kept"
                );
                if self.note_warning(key, "OrphanKept", &note) {
                    self.event(
                        object_ref(svc.as_ref()),
                        EventType::Normal,
                        "OrphanKept",
                        "Keep",
                        note,
                    )
                    .await;
                }
            }
        }
        Ok(())
    }

    /// The local endpoints of an orphaned global Service could not be counted: it is kept, and
    /// the key retried with backoff. A refusal (403: e.g. the binder runs under
    /// `overlays/importer` now, after it made the Service under `overlays/cilium`) will not mend
    /// itself: a Warning Event on the Service and an error in the log, once.
    async fn orphan_check_failed(&self, key: &Key, svc: &Service, e: SyncError) -> ReconcileError {
        if matches!(&e.source, kube::Error::Api(s) if s.code == 403) {
            let note = format!(
                "no imported ServiceRecord for this global service is left, but its local endpoints cannot be counted ({e}); kept. Grant the binder deploy/overlays/cilium's rights, or delete the Service"
            );
            if self.note_warning(key, "OrphanCheckForbidden", &note) {
                tracing::error!(%key, %note, "orphan check refused");
                self.event(
                    object_ref(svc),
                    EventType::Warning,
                    "OrphanCheckForbidden",
                    "Delete",
                    note,
                )
                .await;
            }
        }
        e.into()
    }

    /// Endpoints of the Service `origin` that the binder did not write (EndpointSlices of
    /// other controllers).
    async fn local_endpoints(&self, origin: &OriginKey) -> Result<usize, SyncError> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &origin.namespace);
        let slices = api
            .list(&ListParams::default().labels(&format!(
                "{ENDPOINTSLICE_SERVICE_NAME_LABEL}={}",
                origin.name
            )))
            .await
            .map_err(|source| SyncError {
                action: "list",
                kind: "EndpointSlice",
                namespace: origin.namespace.clone(),
                name: origin.name.clone(),
                source,
            })?;
        Ok(slices
            .items
            .iter()
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ENDPOINTSLICE_MANAGED_BY_LABEL))
                    .is_none_or(|v| v != BINDER_MANAGER)
            })
            .map(|s| s.endpoints.len())
            .sum())
    }

    /// Write each record's `Conflict` condition where it changed; a Warning Event on each
    /// record whose condition becomes `True` or changes reason.
    /// An object in the way is not ours: report it on the records, then fail the reconcile.
    async fn not_managed(&self, records: &[&ServiceRecord], e: ApplyError) -> ReconcileError {
        let found = Found {
            reason: conditions::NOT_MANAGED,
            message: e.to_string(),
        };
        match self.set_conflicts(records, Some(&found)).await {
            Ok(()) => ReconcileError::NotManaged(e),
            Err(reporting) => reporting,
        }
    }

    async fn set_conflicts(
        &self,
        records: &[&ServiceRecord],
        found: Option<&Found>,
    ) -> Result<(), ReconcileError> {
        let api: Api<ServiceRecord> = Api::namespaced(self.client.clone(), &self.config.namespace);
        for record in records {
            let current = record
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let Some(next) = conditions::next(current, found, record.metadata.generation, now)
            else {
                continue;
            };
            let name = record.name_any();
            let before = current
                .iter()
                .find(|c| c.type_ == next.type_)
                .map(|c| (c.status.clone(), c.reason.clone()));
            let patch = json!({
                "apiVersion": ServiceRecord::api_version(&()),
                "kind": ServiceRecord::kind(&()),
                "metadata": {"name": name},
                "status": {"conditions": [next]},
            });
            api.patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|source| ReconcileError::Status {
                name: name.clone(),
                source,
            })?;
            self.metrics.wrote("ServiceRecord", "status");
            let subject = format!("ServiceRecord {}", uid_of(*record));
            if next.status != "True" {
                self.forget_warning(&subject);
            } else if before != Some((next.status.clone(), next.reason.clone()))
                && self.note_warning(&subject, &next.reason, &next.message)
            {
                self.event(
                    object_ref(*record),
                    EventType::Warning,
                    "Conflict",
                    "Materialize",
                    next.message.clone(),
                )
                .await;
            }
        }
        Ok(())
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
