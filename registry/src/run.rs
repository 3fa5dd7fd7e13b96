//! Wiring of one registry process: TLS material, the Hamlet and admin listeners (mTLS only, each
//! with gRPC health and reflection), the store, one managed client per remote, metrics and
//! probes, all under one cancellation token. Every long-lived task is supervised: if one fails,
//! the registry stops and reports it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::resources::{RemoteRegistry, ServiceRecord};

use crate::admin::AdminService;
use crate::catalog::{Catalog, Source};
use crate::hamlet::client::{
    self, ClientConfig, ClientContext, ClientHandle, ImportSink, RemoteSpec,
};
use crate::hamlet::server::{HamletConfig, HamletServer};
use crate::metrics::{Health, Metrics};
use crate::peers::PeerTable;
use crate::store::file::{self, FileErrors, FileImportSink, YamlDir};

/// Where exports, remotes and imports live.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// Nothing persisted; exports and remotes are set through the API (tests, demo).
    Memory,
    /// `xcc registry --store file --state-dir DIR`.
    File { state_dir: PathBuf, poll: Duration },
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
    remotes: Remotes,
    cancel: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

/// The managed clients, keyed by RemoteRegistry name.
#[derive(Clone)]
struct Remotes {
    ctx: ClientContext,
    clients: Arc<Mutex<BTreeMap<String, ClientHandle>>>,
    file_sink: Option<Arc<FileImportSink>>,
    cancel: CancellationToken,
}

impl Remotes {
    /// Make the running clients match `desired`: start new ones, update changed ones, stop and
    /// forget removed ones (their imports are ours and go with them).
    async fn reconcile(&self, desired: Vec<RemoteSpec>) {
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
        let catalog = Catalog::new();
        let peers = PeerTable::default();
        let metrics = Metrics::default();
        let health = Health::default();
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        tls.register_metrics(&mut registry);
        let mut tasks = JoinSet::new();

        let watcher = tls.spawn_watcher(config.cert_poll, cancel.clone());
        tasks.spawn(async move {
            watcher.await.context("certificate watcher panicked")?;
            Ok(())
        });

        let hamlet = HamletServer::new(
            catalog.clone(),
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
            let admin = AdminService::new(catalog.clone(), peers.clone(), cancel.clone());
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
            StoreConfig::Memory => None,
        };
        let sink: Arc<dyn ImportSink> = match &file_sink {
            Some(s) => s.clone(),
            None => Arc::new(client::MemorySink),
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
        };

        let file_errors = FileErrors::default();
        match &config.store {
            StoreConfig::Memory => health.set_ready(true),
            StoreConfig::File { state_dir, poll } => {
                let exports_dir = state_dir.join(file::EXPORTS_DIR);
                let remotes_dir = state_dir.join(file::REMOTES_DIR);
                for d in [&exports_dir, &remotes_dir] {
                    std::fs::create_dir_all(d)
                        .with_context(|| format!("creating {}", d.display()))?;
                }
                let mut exports = YamlDir::<ServiceRecord>::new(exports_dir.clone());
                let mut remote_files = YamlDir::<RemoteRegistry>::new(remotes_dir.clone());
                // First load before serving readiness.
                file::sync_exports(&catalog, &cluster, &mut exports);
                remote_files.refresh(|rr| file::remote_spec(rr).map(|_| ()));
                remotes.reconcile(specs(&remote_files)).await;
                file_errors.set([exports.errors(), remote_files.errors()].concat());
                health.set_ready(true);

                let (tx, mut rx) = mpsc::channel(1);
                let watcher = file::spawn_dir_watcher(
                    vec![exports_dir, remotes_dir],
                    *poll,
                    tx,
                    cancel.clone(),
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
                        if remote_files.refresh(|rr| file::remote_spec(rr).map(|_| ())) {
                            rem.reconcile(specs(&remote_files)).await;
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
            remotes,
            cancel,
            tasks,
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
        while let Some(res) = self.tasks.join_next().await {
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

fn specs(files: &YamlDir<RemoteRegistry>) -> Vec<RemoteSpec> {
    files
        .items()
        .iter()
        .filter_map(|rr| file::remote_spec(rr).ok())
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
