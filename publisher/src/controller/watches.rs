//! The publisher's watches: each a supervised task that follows one kind into its store and
//! queues the sources an event concerns ([`spawn_watches`]), and the state they fill
//! ([`Shared::new`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use futures::Stream;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use xcc_controller::plumbing::is_not_found;
use xcc_controller::probes::Health;
use xcc_controller::queue::Queue;
use xcc_controller::tasks::Spawner;
use xcc_controller::watch;
use xcc_proto::crd::{
    ENDPOINTSLICE_SERVICE_NAME_LABEL, MANAGED_BY_LABEL, PUBLISHER_MANAGER, ServiceRecord,
};
use xcc_proto::mcs::ServiceExport;
use xcc_proto::names::{EXPORT_LABEL, IMPORTED_LABEL};

use super::{LEASE_NAME, Metrics, ProxyApi, Settings, Shared, SourceKey, SourceKind};
use crate::desired;
use crate::httpproxy::HTTPProxy;

/// Start [`drive`] as the supervised task `watch <what>`, stopped with the process; a stream
/// that ends before then stops the process, naming the watch.
pub(super) fn spawn_watch<K, F>(
    spawner: &Spawner,
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    writer: reflector::store::Writer<K>,
    what: &'static str,
    metrics: Metrics,
    on_event: F,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: FnMut(&Event<K>) + Send + 'static,
{
    let cancel = spawner.token().clone();
    spawner.spawn_infallible(
        format!("watch {what}"),
        drive(stream, writer, what, metrics, cancel, on_event),
    );
}

/// Follow one watch into its store ([`watch::follow`]), calling `on_event` after each event is
/// applied and counting its listings; returns when `cancel` fires or the stream ends.
async fn drive<K, F>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    writer: reflector::store::Writer<K>,
    what: &'static str,
    metrics: Metrics,
    cancel: CancellationToken,
    mut on_event: F,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
    F: FnMut(&Event<K>),
{
    let relists = metrics
        .relists
        .get_or_create(&vec![("watch".into(), what.into())])
        .clone();
    watch::follow(what, stream, writer, cancel, |event| {
        on_event(event);
        // Counted after the relist's keys are queued, so a relist that is counted has its
        // work visible in the queue depth.
        if matches!(event, Event::InitDone) {
            relists.inc();
        }
    })
    .await;
}

/// For a source watch: on a relist, also reconcile the keys that were there before (a deletion
/// during a watch gap shows up only as absence) and the owners of existing records.
fn source_events<K>(shared: Arc<Shared>, kind: SourceKind, store: Store<K>) -> impl FnMut(&Event<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut before: Vec<SourceKey> = Vec::new();
    move |event| match event {
        Event::Apply(obj) | Event::Delete(obj) => {
            if let Some(key) = SourceKey::of(kind, obj) {
                shared.queue.add(key);
            }
        }
        Event::Init => {
            before = store
                .state()
                .iter()
                .filter_map(|o| SourceKey::of(kind, o.as_ref()))
                .collect();
        }
        Event::InitApply(_) => {}
        Event::InitDone => {
            let now = store
                .state()
                .iter()
                .filter_map(|o| SourceKey::of(kind, o.as_ref()))
                .collect::<Vec<_>>();
            shared.queue.add_all(std::mem::take(&mut before));
            shared.queue.add_all(now);
            shared.queue.add_all(shared.owner_keys(Some(kind)));
        }
    }
}

/// What of the nodes feeds records: per node, readiness, whether it runs the ingress, and its
/// InternalIPs. Node heartbeats change none of it.
fn node_fingerprint(nodes: &[Node]) -> BTreeMap<String, (bool, bool, Vec<String>)> {
    nodes
        .iter()
        .map(|n| {
            (
                n.name_any(),
                (
                    desired::node_is_ready(n),
                    desired::node_runs_ingress(n),
                    desired::node_internal_ips(n),
                ),
            )
        })
        .collect()
}

/// Whether `projectcontour.io/v1` serves `httpproxies`.
async fn proxy_api_served(client: &Client) -> Result<bool, kube::Error> {
    match client
        .list_api_group_resources(HTTPProxy::api_version(&()).as_ref())
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "httpproxies")),
        Err(e) if is_not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Look for the HTTPProxy API until it is served, then watch proxies.
async fn watch_proxies(
    shared: Arc<Shared>,
    writer: reflector::store::Writer<HTTPProxy>,
    cancel: CancellationToken,
) {
    let mut logged_absent = false;
    loop {
        match proxy_api_served(&shared.client).await {
            Ok(true) => break,
            Ok(false) => {
                if !logged_absent {
                    info!(
                        retry = ?shared.settings.discovery_retry,
                        "HTTPProxy API (projectcontour.io/v1) not served; exporting Services only until it is"
                    );
                    logged_absent = true;
                }
                shared.proxy_api.send_replace(ProxyApi::Absent);
            }
            Err(e) => warn!(error = %e, "looking up the HTTPProxy API failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.settings.discovery_retry) => {}
            _ = cancel.cancelled() => return,
        }
    }
    if logged_absent {
        info!("HTTPProxy API now served; watching HTTPProxies");
    }
    let api: Api<HTTPProxy> = Api::all(shared.client.clone());
    let config = watcher::Config::default().labels(EXPORT_LABEL);
    let mut on_source = source_events(
        shared.clone(),
        SourceKind::HTTPProxy,
        shared.proxies.clone(),
    );
    let s = shared.clone();
    drive(
        watch::watch(api, config),
        writer,
        "httpproxies",
        shared.metrics.clone(),
        cancel,
        move |event| {
            if matches!(event, Event::InitDone) {
                s.proxy_api.send_replace(ProxyApi::Synced);
            }
            on_source(event);
        },
    )
    .await;
}

/// The store writers of the publisher's watches, handed to each watch when it starts.
pub(super) struct Writers {
    proxies: reflector::store::Writer<HTTPProxy>,
    services: reflector::store::Writer<Service>,
    ingress: reflector::store::Writer<Service>,
    nodes: reflector::store::Writer<Node>,
    records: reflector::store::Writer<ServiceRecord>,
    exports: reflector::store::Writer<ServiceExport>,
    imported: reflector::store::Writer<ServiceRecord>,
    slices: reflector::store::Writer<EndpointSlice>,
}

impl Shared {
    /// The publisher's state with every store empty, and the writers that fill the stores.
    pub(super) fn new(
        client: Client,
        settings: Settings,
        metrics: Metrics,
        health: Health,
    ) -> (Arc<Self>, Writers) {
        let (proxies, proxy_writer) = reflector::store::<HTTPProxy>();
        let (services, service_writer) = reflector::store::<Service>();
        let (ingress, ingress_writer) = reflector::store::<Service>();
        let (nodes, node_writer) = reflector::store::<Node>();
        let (records, record_writer) = reflector::store::<ServiceRecord>();
        let (exports, export_writer) = reflector::store::<ServiceExport>();
        let (imported, imported_writer) = reflector::store::<ServiceRecord>();
        let (slices, slice_writer) = reflector::store::<EndpointSlice>();
        let reporter = Reporter {
            controller: LEASE_NAME.into(),
            instance: settings.instance.clone(),
        };
        let shared = Arc::new(Shared {
            reporter,
            client,
            queue: Arc::new(Queue::new(
                settings.backoff.clone(),
                Some(metrics.queue_depth.clone()),
            )),
            metrics,
            proxies,
            services,
            ingress,
            nodes,
            records,
            exports,
            imported,
            slices,
            proxy_api: tokio::sync::watch::Sender::new(ProxyApi::Unknown),
            reported: Mutex::default(),
            initial: Mutex::new(Some(HashSet::new())),
            health,
            reconciles: AtomicU64::new(0),
            settings,
        });
        let writers = Writers {
            proxies: proxy_writer,
            services: service_writer,
            ingress: ingress_writer,
            nodes: node_writer,
            records: record_writer,
            exports: export_writer,
            imported: imported_writer,
            slices: slice_writer,
        };
        (shared, writers)
    }
}

/// Start every watch of the publisher, each a supervised task.
pub(super) fn spawn_watches(spawner: &Spawner, shared: &Arc<Shared>, writers: Writers) {
    watch_services(spawner, shared, writers.services);
    if shared.settings.mcs {
        watch_exports(spawner, shared, writers.exports);
        watch_endpoint_slices(spawner, shared, writers.slices);
        watch_imported(spawner, shared, writers.imported);
    }
    // HTTPProxies, once their API is served.
    spawner.spawn_infallible(
        "watch httpproxies",
        watch_proxies(shared.clone(), writers.proxies, spawner.token().clone()),
    );
    watch_nodes(spawner, shared, writers.nodes);
    watch_ingress_service(spawner, shared, writers.ingress);
    watch_own_records(spawner, shared, writers.records);
}

/// Exported Services; every Service in MCS mode (a ServiceExport may name any).
fn watch_services(
    spawner: &Spawner,
    shared: &Arc<Shared>,
    writer: reflector::store::Writer<Service>,
) {
    let api: Api<Service> = Api::all(shared.client.clone());
    let config = if shared.settings.mcs {
        watcher::Config::default()
    } else {
        watcher::Config::default().labels(EXPORT_LABEL)
    };
    let on = source_events(shared.clone(), SourceKind::Service, shared.services.clone());
    spawn_watch(
        spawner,
        watch::watch(api, config),
        writer,
        "services",
        shared.metrics.clone(),
        on,
    );
}

/// ServiceExports: each stands for the Service of its name.
fn watch_exports(
    spawner: &Spawner,
    shared: &Arc<Shared>,
    writer: reflector::store::Writer<ServiceExport>,
) {
    let api: Api<ServiceExport> = Api::all(shared.client.clone());
    let s = shared.clone();
    spawn_watch(
        spawner,
        watch::watch(api, watcher::Config::default()),
        writer,
        "serviceexports",
        shared.metrics.clone(),
        move |event| match event {
            Event::Apply(e) | Event::Delete(e) | Event::InitApply(e) => {
                if let Some(key) = SourceKey::of(SourceKind::Service, e) {
                    s.queue.add(key);
                }
            }
            Event::Init | Event::InitDone => {}
        },
    );
}

/// EndpointSlices: a headless Service exports its pods.
fn watch_endpoint_slices(
    spawner: &Spawner,
    shared: &Arc<Shared>,
    writer: reflector::store::Writer<EndpointSlice>,
) {
    let api: Api<EndpointSlice> = Api::all(shared.client.clone());
    let s = shared.clone();
    spawn_watch(
        spawner,
        watch::watch(
            api,
            watcher::Config::default().labels(ENDPOINTSLICE_SERVICE_NAME_LABEL),
        ),
        writer,
        "endpointslices",
        shared.metrics.clone(),
        move |event| {
            if let Event::Apply(e) | Event::Delete(e) | Event::InitApply(e) = event
                && let (Some(namespace), Some(name)) = (
                    e.metadata.namespace.as_ref(),
                    e.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(ENDPOINTSLICE_SERVICE_NAME_LABEL)),
                )
            {
                s.queue.add(SourceKey {
                    kind: SourceKind::Service,
                    namespace: namespace.clone(),
                    name: name.clone(),
                });
            }
        },
    );
}

/// Imported records: another cluster's export of a name exported here may conflict.
fn watch_imported(
    spawner: &Spawner,
    shared: &Arc<Shared>,
    writer: reflector::store::Writer<ServiceRecord>,
) {
    let api: Api<ServiceRecord> = Api::all(shared.client.clone());
    let s = shared.clone();
    spawn_watch(
        spawner,
        watch::watch(api, watcher::Config::default().labels(IMPORTED_LABEL)),
        writer,
        "imported-servicerecords",
        shared.metrics.clone(),
        move |event| {
            if let Event::Apply(r) | Event::Delete(r) | Event::InitApply(r) = event
                && let Some(origin) = &r.spec.origin
            {
                s.queue.add(SourceKey {
                    kind: SourceKind::Service,
                    namespace: origin.namespace.clone(),
                    name: origin.name.clone(),
                });
            }
        },
    );
}

/// Nodes: fan out to proxies and NodePort Services when what feeds records changes.
fn watch_nodes(spawner: &Spawner, shared: &Arc<Shared>, writer: reflector::store::Writer<Node>) {
    let api: Api<Node> = Api::all(shared.client.clone());
    let s = shared.clone();
    let mut last = None;
    spawn_watch(
        spawner,
        watch::watch(api, watcher::Config::default()),
        writer,
        "nodes",
        shared.metrics.clone(),
        move |event| {
            if matches!(event, Event::Init | Event::InitApply(_)) {
                return;
            }
            let now = node_fingerprint(&s.nodes());
            if last.as_ref() != Some(&now) {
                debug!(nodes = now.len(), "node inputs changed");
                last = Some(now);
                s.queue.add_all(s.proxy_keys());
                s.queue.add_all(s.service_keys(true));
            }
        },
    );
}

/// The ingress Service: its LoadBalancer addresses become every proxy's endpoints.
fn watch_ingress_service(
    spawner: &Spawner,
    shared: &Arc<Shared>,
    writer: reflector::store::Writer<Service>,
) {
    let (ns, name) = shared.settings.ingress_service.clone();
    let api: Api<Service> = Api::namespaced(shared.client.clone(), &ns);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let s = shared.clone();
    let mut last = None;
    spawn_watch(
        spawner,
        watch::watch(api, config),
        writer,
        "ingress-service",
        shared.metrics.clone(),
        move |event| {
            if matches!(event, Event::Init | Event::InitApply(_)) {
                return;
            }
            let svc = s.ingress_service();
            let now = desired::ingress_endpoints(svc.as_deref(), &[], 0);
            if last.as_ref() != Some(&now) {
                last = Some(now);
                s.queue.add_all(s.proxy_keys());
            }
        },
    );
}

/// The publisher's own records: drift repair and removal follow their owner.
fn watch_own_records(
    spawner: &Spawner,
    shared: &Arc<Shared>,
    writer: reflector::store::Writer<ServiceRecord>,
) {
    let api: Api<ServiceRecord> = Api::all(shared.client.clone());
    let config =
        watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={PUBLISHER_MANAGER}"));
    let s = shared.clone();
    let store = shared.records.clone();
    let mut before: Vec<SourceKey> = Vec::new();
    spawn_watch(
        spawner,
        watch::watch(api, config),
        writer,
        "servicerecords",
        shared.metrics.clone(),
        move |event| match event {
            Event::Apply(r) | Event::Delete(r) => {
                if let Some(key) = SourceKey::owning(r) {
                    s.queue.add(key);
                }
            }
            Event::Init => {
                before = store
                    .state()
                    .iter()
                    .filter_map(|r| SourceKey::owning(r))
                    .collect();
            }
            Event::InitApply(_) => {}
            Event::InitDone => {
                s.queue.add_all(std::mem::take(&mut before));
                s.queue.add_all(s.owner_keys(None));
            }
        },
    );
}
