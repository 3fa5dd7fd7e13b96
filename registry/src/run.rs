//! Wiring of one registry process: TLS material, the Hamlet and admin listeners (mTLS only, each
//! with gRPC health and reflection), the store, one managed client per remote, metrics and
//! probes, all under one cancellation token. Every long-lived task is supervised: if one fails,
//! the registry stops and reports it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::crd::{RemoteRegistry, Role, ServiceRecord};

use crate::admin::AdminService;
use crate::authz::Policies;
use crate::catalog::{Catalog, Source};
use crate::federation::link::ParentSpec;
use crate::federation::{Level, Target};
use crate::hamlet::client::{
    self, ClientConfig, ClientContext, ClientHandle, ImportSink, RemoteSpec,
};
use crate::hamlet::server::{HamletConfig, HamletServer};
use crate::metrics::{Health, Metrics};
use crate::peers::PeerTable;
use crate::store::file::{self, FileErrors, FileImportSink, YamlDir};
use crate::store::model;

/// Where exports, remotes and imports live.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// Nothing persisted; exports and remotes are set through the API (tests, demo).
    Memory,
    /// `xcc registry --store file --state-dir DIR`.
    File { state_dir: PathBuf, poll: Duration },
    /// `xcc registry --store kube`: ServiceRecords and RemoteRegistries in Kubernetes.
    Kube(crate::store::kube::KubeConfig),
}

/// Hierarchy settings.
#[derive(Clone, Debug)]
pub struct FederationConfig {
    /// The parent (memory store; in file mode a RemoteRegistry with `role: Parent`).
    pub parent: Option<ParentSpec>,
    /// Services to ask the hierarchy for (with `parent`).
    pub imports: Vec<(Target, String)>,
    /// Extra Cedar policies (`*.cedar`), watched and reloaded; the defaults always apply.
    pub policy_dir: Option<PathBuf>,
    /// Cedar policies given in code (the embedded demo, tests and the hierarchy bench use them
    /// to say which clusters each child may carry), in force with the defaults and `policy_dir`.
    /// Not combined with `policy_configmap`.
    pub policies: Vec<(String, String)>,
    /// `--store kube`: Cedar policies from this ConfigMap in the namespace (every `*.cedar`
    /// key), watched on every replica; the defaults always apply. Ignored with `policy_dir`.
    pub policy_configmap: Option<String>,
    /// How long a query waits for its answer.
    pub query_timeout: Duration,
    /// How often unanswered, denied or not-found imports are asked again.
    pub import_retry: Duration,
    /// What the owner of a service applies when a caller is granted.
    pub grant_mode: crate::federation::grants::GrantMode,
    /// `--grant-mode gateway`: the Gateway every HTTPRoute attaches to.
    pub grant_gateway: Option<crate::federation::grants::GatewayRef>,
    /// The trust domain of a caller cluster's workloads (`{cluster}` = its name).
    pub grant_trust_domain: String,
}

impl FederationConfig {
    /// The grant settings together.
    pub fn grants(&self) -> crate::federation::grants::GrantConfig {
        crate::federation::grants::GrantConfig {
            mode: self.grant_mode,
            gateway: self.grant_gateway.clone(),
            trust_domain: self.grant_trust_domain.clone(),
        }
    }
}

impl Default for FederationConfig {
    fn default() -> Self {
        Self {
            parent: None,
            imports: vec![],
            policy_dir: None,
            policies: vec![],
            policy_configmap: None,
            query_timeout: Duration::from_secs(5),
            import_retry: Duration::from_secs(30),
            grant_mode: Default::default(),
            grant_gateway: None,
            grant_trust_domain: crate::federation::grants::DEFAULT_TRUST_DOMAIN.into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct RegistryConfig {
    pub tls: TlsFiles,
    /// Namespace written into imported records.
    pub namespace: String,
    pub hamlet_listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub hamlet: HamletConfig,
    pub client: ClientConfig,
    pub store: StoreConfig,
    /// Fallback poll period for certificate files (filesystem events are used too).
    pub cert_poll: Duration,
    pub federation: FederationConfig,
    /// How long shutdown waits for open streams and connections to finish before it drops them.
    pub shutdown_grace: Duration,
}

impl RegistryConfig {
    /// Loopback listeners on free ports, memory store: for tests and the demo.
    pub fn loopback(tls: TlsFiles) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            tls,
            namespace: xcc_proto::names::DEFAULT_NAMESPACE.to_string(),
            hamlet_listen: any,
            admin_listen: any,
            metrics_listen: None,
            hamlet: HamletConfig::default(),
            client: ClientConfig::default(),
            store: StoreConfig::Memory,
            cert_poll: Duration::from_secs(30),
            federation: FederationConfig::default(),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// A running registry.
pub struct Registry {
    pub cluster: String,
    pub hamlet_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub catalog: Catalog,
    pub peers: PeerTable,
    pub metrics: Metrics,
    pub health: Health,
    pub tls: ReloadingTls,
    pub file_errors: FileErrors,
    /// Policy reload errors (empty when the loaded set is the latest on disk).
    pub policy_errors: FileErrors,
    pub level: Level,
    remotes: Remotes,
    cancel: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
    shutdown_grace: Duration,
}

/// The managed clients, keyed by RemoteRegistry name.
#[derive(Clone)]
pub(crate) struct Remotes {
    ctx: ClientContext,
    clients: Arc<Mutex<BTreeMap<String, ClientHandle>>>,
    file_sink: Option<Arc<FileImportSink>>,
    cancel: CancellationToken,
    level: Level,
    parent: Arc<Mutex<Option<ParentLink>>>,
    import_retry: Duration,
}

/// The running parent link and its import sync.
struct ParentLink {
    spec: ParentSpec,
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn same_parent(a: &ParentSpec, b: &ParentSpec) -> bool {
    a.name == b.name
        && a.address == b.address
        && a.server_name == b.server_name
        && match (&a.roots, &b.roots) {
            (None, None) => true,
            (Some(x), Some(y)) => Arc::ptr_eq(x, y) || x.roots == y.roots,
            _ => false,
        }
}

impl Remotes {
    /// The hierarchy level the parent link and its imports run on.
    pub(crate) fn level(&self) -> &Level {
        &self.level
    }

    /// Names of the running clients and of the running parent link.
    pub(crate) async fn running(&self) -> (BTreeSet<String>, Option<String>) {
        let clients = self.clients.lock().await.keys().cloned().collect();
        let parent = self
            .parent
            .lock()
            .await
            .as_ref()
            .map(|p| p.spec.name.clone());
        (clients, parent)
    }

    /// Make the parent link match `parent` (with its imports).
    pub(crate) async fn reconcile_parent(&self, parent: ParentWanted) {
        let imports = parent.as_ref().map(|(_, i)| i.clone()).unwrap_or_default();
        let mut current = self.parent.lock().await;
        let keep = matches!((&*current, &parent), (Some(cur), Some((want, _))) if same_parent(&cur.spec, want));
        if !keep {
            if let Some(old) = current.take() {
                old.cancel.cancel();
                for t in old.tasks {
                    let _ = t.await;
                }
                self.level.set_imports(&[]);
                self.ctx
                    .catalog
                    .replace_source(&Source::Hierarchy(old.spec.name.clone()), vec![]);
                if let Some(sink) = &self.file_sink
                    && let Err(e) = sink.forget(&old.spec.name)
                {
                    warn!(parent = %old.spec.name, error = %e, "cannot remove the import file");
                }
                info!(parent = %old.spec.name, "parent link stopped");
            }
            self.level
                .set_parent(parent.as_ref().map(|(p, _)| p.name.clone()));
            if let Some((spec, _)) = &parent {
                // The questions first: the import sync must never see the empty set of a link
                // that has not been told its imports yet (it would persist it).
                self.level.set_imports(&imports);
                let cancel = self.cancel.child_token();
                let link = crate::federation::link::spawn(
                    self.level.clone(),
                    self.ctx.tls.clone(),
                    spec.clone(),
                    self.ctx.config.backoff.clone(),
                    self.ctx.peers.clone(),
                    cancel.clone(),
                );
                let sync = crate::federation::imports::spawn(
                    self.level.clone(),
                    spec.name.clone(),
                    self.ctx.sink.clone(),
                    self.import_retry,
                    cancel.clone(),
                );
                info!(parent = %spec.name, address = %spec.address, "parent link started");
                *current = Some(ParentLink {
                    spec: spec.clone(),
                    cancel,
                    tasks: vec![link, sync],
                });
            }
        }
        self.level.set_imports(&imports);
    }

    /// Make the running clients match `desired`: start new ones, update changed ones, stop and
    /// forget removed ones (their imports are ours and go with them).
    pub(crate) async fn reconcile(&self, desired: Vec<RemoteSpec>) {
        let mut clients = self.clients.lock().await;
        let wanted: BTreeMap<String, RemoteSpec> =
            desired.into_iter().map(|s| (s.name.clone(), s)).collect();
        let removed: Vec<String> = clients
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for name in removed {
            if let Some(handle) = clients.remove(&name) {
                handle.stop().await;
            }
            self.ctx
                .catalog
                .replace_source(&Source::Remote(name.clone()), vec![]);
            if let Some(sink) = &self.file_sink
                && let Err(e) = sink.forget(&name)
            {
                warn!(remote = %name, error = %e, "cannot remove the import file");
            }
            info!(remote = %name, "remote registry removed; its imports were removed");
        }
        for (name, spec) in wanted {
            match clients.get(&name) {
                Some(handle) => handle.update(spec),
                None => {
                    if let Some(sink) = &self.file_sink {
                        match sink.load(&name) {
                            Ok(imports) => {
                                let entries = imports
                                    .iter()
                                    .map(|i| client::entry_for(&name, i))
                                    .collect();
                                self.ctx
                                    .catalog
                                    .replace_source(&Source::Remote(name.clone()), entries);
                            }
                            Err(e) => {
                                warn!(remote = %name, error = %format!("{e:#}"), "cannot read persisted imports")
                            }
                        }
                    }
                    info!(remote = %name, address = %spec.address, "starting import client");
                    let handle = client::spawn(self.ctx.clone(), spec, self.cancel.clone());
                    clients.insert(name, handle);
                }
            }
        }
    }
}

impl Registry {
    /// Load TLS, bind every listener and start every task. Returns once the listeners are bound.
    pub async fn start(config: RegistryConfig, cancel: CancellationToken) -> anyhow::Result<Self> {
        xcc_certs::install_crypto_provider();
        let tls = ReloadingTls::load(config.tls.clone()).context("loading TLS material")?;
        let identity = tls.identity();
        if !identity.is_cluster() {
            anyhow::bail!(
                "the registry certificate must carry a cluster identity (spiffe://<trust-domain>/cluster/<name>); it has {identity}"
            );
        }
        let cluster = identity.name().to_string();
        let trust_domain = identity.trust_domain().unwrap_or_default().to_string();
        let catalog = Catalog::new();
        let peers = PeerTable::default();
        let metrics = Metrics::default();
        let health = Health::default();
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        tls.register_metrics(&mut registry);
        let mut tasks = JoinSet::new();

        let inline = config.federation.policies.clone();
        let policies = match &config.federation.policy_dir {
            Some(dir) => Policies::from_dir_and(dir, &inline).context("loading Cedar policies")?,
            None => Policies::from_sources(&inline).context("loading Cedar policies")?,
        };
        info!(policies = ?policies.policy_ids(), "Cedar policies loaded");
        let gate = crate::authz::Gate::new(
            trust_domain,
            Arc::new(std::sync::RwLock::new(Arc::new(policies))),
        );
        let policy_errors = FileErrors::default();
        if let Some(dir) = config.federation.policy_dir.clone() {
            let (tx, mut rx) = mpsc::channel(1);
            let watcher = file::spawn_dir_watcher(
                vec![dir.clone()],
                Duration::from_secs(5),
                tx,
                cancel.clone(),
            );
            let (handle, errs, c, m) = (
                gate.clone(),
                policy_errors.clone(),
                cancel.clone(),
                metrics.clone(),
            );
            tasks.spawn(async move {
                let mut last_ids: Vec<String> = vec![];
                loop {
                    tokio::select! {
                        _ = c.cancelled() => break,
                        got = rx.recv() => if got.is_none() { break },
                    }
                    match Policies::from_dir_and(&dir, &inline) {
                        Ok(p) => {
                            let ids = p.policy_ids();
                            if ids != last_ids || !errs.get().is_empty() {
                                info!(policies = ?ids, "Cedar policies reloaded");
                            }
                            last_ids = ids;
                            handle.set_policies(p);
                            errs.set(vec![]);
                        }
                        Err(e) => {
                            let msg = e.to_string();
                            if errs.get() != vec![msg.clone()] {
                                m.store_errors.inc();
                                warn!(error = %msg, "rejected policy change; keeping the previous policies");
                            }
                            errs.set(vec![msg]);
                        }
                    }
                }
                watcher.abort();
                Ok(())
            });
        }
        let mut policy_synced = None;
        if let StoreConfig::Kube(k) = &config.store
            && let Some(name) = config
                .federation
                .policy_configmap
                .as_deref()
                .filter(|n| !n.is_empty())
        {
            if config.federation.policy_dir.is_some() {
                warn!(configmap = %name, "--policy-dir is set: the policy ConfigMap is not read");
            } else {
                // Every replica answers queries, so every replica reads the policies.
                let watch = crate::authz_configmap::spawn_policy_configmap_into(
                    k.client.clone(),
                    &config.namespace,
                    name,
                    gate.clone(),
                    policy_errors.clone(),
                    metrics.clone(),
                    cancel.clone(),
                );
                policy_synced = Some(watch.synced);
                let task = watch.task;
                tasks.spawn(async move {
                    task.await.context("the policy ConfigMap watch panicked")?;
                    Ok(())
                });
            }
        }
        config
            .federation
            .grants()
            .check()
            .map_err(anyhow::Error::msg)?;
        let level = Level::new(cluster.clone(), None, catalog.clone(), gate.clone());
        registry.sub_registry_with_prefix("xcc").register(
            "federation_queue_overflows",
            "Federation messages that did not fit a queue (each reset its session); expected 0",
            level.overflows(),
        );
        if let StoreConfig::File { state_dir, .. } = &config.store
            && config.federation.grant_mode != crate::federation::grants::GrantMode::None
        {
            level.set_grant_sink(Arc::new(
                crate::federation::grants::FileGrants::new(state_dir, config.federation.grants())
                    .with_context(|| format!("preparing {}/grants", state_dir.display()))?,
            ));
        }
        // Names held for their owners are read back before any child can attach.
        let owners: Option<Arc<dyn crate::federation::level::OwnerStore>> = match &config.store {
            StoreConfig::Memory => None,
            StoreConfig::File { state_dir, .. } => Some(Arc::new(
                crate::federation::level::FileOwners::new(state_dir),
            )),
            StoreConfig::Kube(k) => Some(Arc::new(crate::federation::level::ConfigMapOwners::new(
                k.client.clone(),
                &config.namespace,
            ))),
        };
        if let Some(store) = owners {
            let keep = level
                .keep_owners(store, cancel.clone())
                .await
                .context("reading the name-owner ledger")?;
            tasks.spawn(async move {
                keep.await;
                Ok(())
            });
        }
        {
            // A new policy set: what children carry, grants and denied questions are decided
            // again (open Hamlet streams end themselves, see `Gate::until_policies_change`).
            let (lvl, c, mut changes) = (level.clone(), cancel.clone(), gate.subscribe());
            tasks.spawn(async move {
                loop {
                    tokio::select! {
                        _ = c.cancelled() => break,
                        r = changes.changed() => if r.is_err() { break },
                    }
                    lvl.policies_changed();
                }
                Ok(())
            });
        }
        {
            // The resolver: re-evaluate grants whenever a service changes.
            let (lvl, c) = (level.clone(), cancel.clone());
            let mut events = catalog.subscribe();
            tasks.spawn(async move {
                loop {
                    let ev = tokio::select! {
                        _ = c.cancelled() => break,
                        ev = events.recv() => ev,
                    };
                    match ev {
                        Ok(ev) => lvl.on_catalog_event(&ev),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            // Bulk loads can outrun the feed: re-check every grant instead.
                            debug!(
                                missed = n,
                                "resolver fell behind the catalog; re-checking every grant"
                            );
                            lvl.recheck_grants();
                        }
                        Err(_) => break,
                    }
                }
                Ok(())
            });
        }

        let watcher = tls.spawn_watcher(config.cert_poll, cancel.clone());
        tasks.spawn(async move {
            watcher.await.context("certificate watcher panicked")?;
            Ok(())
        });

        let hamlet = HamletServer::new(
            catalog.clone(),
            gate.clone(),
            peers.clone(),
            metrics.clone(),
            config.hamlet.clone(),
            cancel.clone(),
        );
        let (hamlet_listener, hamlet_addr) = bind(config.hamlet_listen, "hamlet").await?;
        let (admin_listener, admin_addr) = bind(config.admin_listen, "admin").await?;

        {
            let (reporter, health_svc) = tonic_health::server::health_reporter();
            reporter
                .set_serving::<xcc_proto::federation::resourcediscovery::v1alpha1::discovery_service_server::DiscoveryServiceServer<crate::hamlet::server::V1alpha1>>()
                .await;
            let reflection = reflection()?;
            let incoming =
                xcc_certs::server::tls_incoming(hamlet_listener, tls.clone(), cancel.clone());
            let router = tonic::transport::Server::builder()
                // Keep idle streams alive through middleboxes; hyper does not police client
                // pings, so Go peers' 20 s pings are accepted (reference §1.9).
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .http2_keepalive_timeout(Some(Duration::from_secs(20)))
                .add_service(hamlet.v1alpha1())
                .add_service(hamlet.v1alpha2())
                .add_service(
                    crate::federation::session::FederationService::new(
                        level.clone(),
                        cancel.clone(),
                    )
                    .into_server(),
                )
                .add_service(health_svc)
                .add_service(reflection);
            let c = cancel.clone();
            tasks.spawn(async move {
                router
                    .serve_with_incoming_shutdown(incoming, c.cancelled())
                    .await
                    .context("hamlet listener failed")
            });
        }
        {
            let (reporter, health_svc) = tonic_health::server::health_reporter();
            reporter
                .set_serving::<xcc_proto::xcc::admin::v1::admin_server::AdminServer<AdminService>>()
                .await;
            let admin = AdminService::new(
                catalog.clone(),
                peers.clone(),
                level.clone(),
                cancel.clone(),
                config.federation.query_timeout,
            );
            let incoming =
                xcc_certs::server::tls_incoming(admin_listener, tls.clone(), cancel.clone());
            let router = tonic::transport::Server::builder()
                .add_service(admin.into_server())
                .add_service(health_svc)
                .add_service(reflection()?);
            let c = cancel.clone();
            tasks.spawn(async move {
                router
                    .serve_with_incoming_shutdown(incoming, c.cancelled())
                    .await
                    .context("admin listener failed")
            });
        }

        let file_sink = match &config.store {
            StoreConfig::File { state_dir, .. } => Some(Arc::new(
                FileImportSink::new(state_dir, config.namespace.clone())
                    .with_context(|| format!("preparing {}", state_dir.display()))?,
            )),
            StoreConfig::Memory | StoreConfig::Kube(_) => None,
        };
        let kube_owners = crate::store::kube::Owners::default();
        let kube_metrics = crate::store::kube::KubeMetrics::default();
        let kube_sink = match &config.store {
            StoreConfig::Kube(k) => Some(Arc::new(crate::store::kube::KubeImportSink::new(
                k.client.clone(),
                config.namespace.clone(),
                kube_owners.clone(),
                kube_metrics.clone(),
            ))),
            _ => None,
        };
        let sink: Arc<dyn ImportSink> = match (&file_sink, &kube_sink) {
            (Some(s), _) => s.clone(),
            (None, Some(s)) => s.clone(),
            (None, None) => Arc::new(client::MemorySink),
        };
        let remotes = Remotes {
            ctx: ClientContext {
                catalog: catalog.clone(),
                peers: peers.clone(),
                metrics: metrics.clone(),
                tls: tls.clone(),
                sink,
                config: config.client.clone(),
            },
            clients: Arc::new(Mutex::new(BTreeMap::new())),
            file_sink,
            cancel: cancel.clone(),
            level: level.clone(),
            parent: Arc::new(Mutex::new(None)),
            import_retry: config.federation.import_retry,
        };
        if let Some(parent) = config.federation.parent.clone() {
            remotes
                .reconcile_parent(Some((parent, config.federation.imports.clone())))
                .await;
        }

        let file_errors = FileErrors::default();
        match &config.store {
            StoreConfig::Memory => health.set_ready(true),
            StoreConfig::Kube(k) => {
                let Some(sink) = kube_sink.clone() else {
                    anyhow::bail!("kube store without its sink");
                };
                // Ready once the exports were listed and the policies read (the store sets it).
                kube_metrics.register(&mut registry);
                // Grant objects are writes: only the leader writes them (the store starts the
                // writer when this replica leads).
                let grants = (config.federation.grant_mode
                    != crate::federation::grants::GrantMode::None)
                    .then(|| {
                        let g = crate::store::kube::GrantWiring {
                            config: config.federation.grants(),
                            level: level.clone(),
                            metrics: Default::default(),
                            store_errors: metrics.store_errors.clone(),
                        };
                        g.metrics.register(&mut registry);
                        g
                    });
                crate::store::kube::spawn(
                    crate::store::kube::Parts {
                        catalog: catalog.clone(),
                        cluster: cluster.clone(),
                        namespace: config.namespace.clone(),
                        health: health.clone(),
                        peers: peers.clone(),
                        remotes: remotes.clone(),
                        sink,
                        owners: kube_owners.clone(),
                        metrics: kube_metrics.clone(),
                        grants,
                        policy_synced: policy_synced.clone(),
                    },
                    k.clone(),
                    cancel.clone(),
                    &mut tasks,
                );
            }
            StoreConfig::File { state_dir, poll } => {
                let exports_dir = state_dir.join(file::EXPORTS_DIR);
                let remotes_dir = state_dir.join(file::REMOTES_DIR);
                for d in [&exports_dir, &remotes_dir] {
                    std::fs::create_dir_all(d)
                        .with_context(|| format!("creating {}", d.display()))?;
                }
                // The watcher reports which files changed; a refresh looks at those only.
                let events = file::DirEvents::default();
                let mut exports =
                    YamlDir::<ServiceRecord>::new(exports_dir.clone()).with_events(events.clone());
                let mut remote_files =
                    YamlDir::<RemoteRegistry>::new(remotes_dir.clone()).with_events(events.clone());
                // First load before serving readiness.
                file::sync_exports(&catalog, &cluster, &mut exports);
                remote_files.refresh(|rr| model::remote_spec(rr).map(|_| ()));
                let (peers_wanted, parent_wanted) = split_remotes(&remote_files);
                remotes.reconcile(peers_wanted).await;
                remotes.reconcile_parent(parent_wanted).await;
                file_errors.set([exports.errors(), remote_files.errors()].concat());
                health.set_ready(true);

                let (tx, mut rx) = mpsc::channel(1);
                let watcher = file::spawn_dir_watcher_with_events(
                    vec![exports_dir, remotes_dir],
                    *poll,
                    tx,
                    cancel.clone(),
                    events,
                );
                let (cat, cl, rem, errs, c) = (
                    catalog.clone(),
                    cluster.clone(),
                    remotes.clone(),
                    file_errors.clone(),
                    cancel.clone(),
                );
                tasks.spawn(async move {
                    loop {
                        tokio::select! {
                            _ = c.cancelled() => break,
                            got = rx.recv() => if got.is_none() { break },
                        }
                        file::sync_exports(&cat, &cl, &mut exports);
                        if remote_files.refresh(|rr| model::remote_spec(rr).map(|_| ())) {
                            let (peers_wanted, parent_wanted) = split_remotes(&remote_files);
                            rem.reconcile(peers_wanted).await;
                            rem.reconcile_parent(parent_wanted).await;
                        }
                        errs.set([exports.errors(), remote_files.errors()].concat());
                    }
                    watcher.abort();
                    Ok(())
                });
            }
        }

        let metrics_addr = match config.metrics_listen {
            Some(addr) => {
                let (listener, addr) = bind(addr, "metrics").await?;
                let registry = Arc::new(registry);
                let (m, cat) = (metrics.clone(), catalog.clone());
                let on_scrape: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                    m.catalog_services.set(cat.len() as i64);
                });
                let (h, c) = (health.clone(), cancel.clone());
                tasks.spawn(async move {
                    crate::metrics::serve_http(listener, registry, h, on_scrape, c)
                        .await
                        .context("metrics listener failed")
                });
                Some(addr)
            }
            None => None,
        };

        info!(%cluster, %hamlet_addr, %admin_addr, ?metrics_addr, "registry started");
        Ok(Self {
            cluster,
            hamlet_addr,
            admin_addr,
            metrics_addr,
            catalog,
            peers,
            metrics,
            health,
            tls,
            file_errors,
            policy_errors,
            level,
            remotes,
            cancel,
            tasks,
            shutdown_grace: config.shutdown_grace,
        })
    }

    /// Replace the set of remote registries (memory store; the file store watches its files).
    pub async fn set_remotes(&self, specs: Vec<RemoteSpec>) {
        self.remotes.reconcile(specs).await;
    }

    /// Stop everything and wait for the tasks.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.stop_clients().await;
        let mut first_error = None;
        let deadline = tokio::time::Instant::now() + self.shutdown_grace;
        loop {
            let res = match tokio::time::timeout_at(deadline, self.tasks.join_next()).await {
                Ok(Some(res)) => res,
                Ok(None) => break,
                Err(_) => {
                    // A listener waits for its connections to close, and a stream whose consumer
                    // stopped reading never does; do not let that hold the process.
                    warn!(
                        tasks = self.tasks.len(),
                        grace = ?self.shutdown_grace,
                        "open connections did not finish within the shutdown grace period; dropping them"
                    );
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    break;
                }
            };
            if let Ok(Err(e)) | Err(e) = res.map_err(anyhow::Error::from) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn stop_clients(&self) {
        let mut clients = self.remotes.clients.lock().await;
        for (_, handle) in std::mem::take(&mut *clients) {
            handle.stop().await;
        }
        if let Some(link) = self.remotes.parent.lock().await.take() {
            link.cancel.cancel();
            for t in link.tasks {
                let _ = t.await;
            }
        }
    }

    /// Replace the parent link (memory store; the file store watches its files).
    pub async fn set_parent(&self, parent: ParentWanted) {
        self.remotes.reconcile_parent(parent).await;
    }

    /// Run until `cancel` fires or a supervised task fails (then stop the rest and return the
    /// failure).
    pub async fn run(mut self) -> anyhow::Result<()> {
        let failure = tokio::select! {
            _ = self.cancel.cancelled() => None,
            res = self.tasks.join_next() => match res {
                Some(Ok(Ok(()))) if self.cancel.is_cancelled() => None,
                Some(Ok(Ok(()))) => Some(anyhow::anyhow!("a registry task stopped unexpectedly")),
                Some(Ok(Err(e))) => Some(e),
                Some(Err(e)) => Some(anyhow::Error::from(e).context("a registry task panicked")),
                None => None,
            },
        };
        if let Some(e) = &failure {
            error!(error = %format!("{e:#}"), "stopping the registry");
        }
        let rest = self.shutdown().await;
        match failure {
            Some(e) => Err(e),
            None => rest,
        }
    }
}

/// A parent link and the imports asked through it.
pub(crate) type ParentWanted = Option<(ParentSpec, Vec<(Target, String)>)>;

/// Peers (Hamlet imports) and the parent (hierarchy) among the RemoteRegistry files. With
/// several parents, the first by name wins and the others are reported.
fn split_remotes(files: &YamlDir<RemoteRegistry>) -> (Vec<RemoteSpec>, ParentWanted) {
    let mut peers = vec![];
    let mut parents = vec![];
    for rr in files.items() {
        let Ok(spec) = model::remote_spec(&rr) else {
            continue;
        };
        if rr.spec.role() == Role::Parent {
            let imports = hierarchy_imports(&rr);
            parents.push((
                ParentSpec {
                    name: spec.name,
                    address: spec.address,
                    server_name: spec.server_name,
                    roots: spec.roots,
                },
                imports,
            ));
        } else {
            peers.push(spec);
        }
    }
    parents.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    if parents.len() > 1 {
        let ignored: Vec<&str> = parents[1..].iter().map(|p| p.0.name.as_str()).collect();
        warn!(using = %parents[0].0.name, ?ignored, "more than one RemoteRegistry has role Parent; only one parent is allowed");
    }
    (peers, parents.into_iter().next())
}

/// The services a `role: Parent` RemoteRegistry asks the hierarchy for.
pub(crate) fn hierarchy_imports(rr: &RemoteRegistry) -> Vec<(Target, String)> {
    rr.spec
        .imports
        .iter()
        .flatten()
        .filter_map(|i| {
            let service = i.requester_service.clone().unwrap_or_default();
            match (&i.fqdn, &i.namespace, &i.name) {
                (Some(f), _, _) => xcc_proto::names::canonical_fqdn(f)
                    .ok()
                    .map(|f| (Target::Fqdn(f), service)),
                (None, Some(ns), Some(n)) => Some((
                    Target::Name {
                        namespace: ns.clone(),
                        name: n.clone(),
                    },
                    service,
                )),
                _ => None,
            }
        })
        .collect()
}

async fn bind(
    addr: SocketAddr,
    what: &str,
) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the {what} listener on {addr}"))?;
    let a = l.local_addr()?;
    Ok((l, a))
}

fn reflection() -> anyhow::Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(xcc_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building gRPC reflection")
}
