//! Wiring of one registry process: a short composition of named parts, all on one supervised
//! task set (the process [`Runtime`]): the TLS identity, the Cedar policies ([`policies`]), the
//! hierarchy level ([`hierarchy`]), the Hamlet and admin listeners (mTLS only, [`listeners`]),
//! the store and the links to remote registries ([`stores`], [`crate::remotes`]), certificate
//! reload and the probes/metrics endpoint. If any long-lived task stops, fails or panics, the
//! registry stops and reports it by name.

mod config;
mod hierarchy;
mod listeners;
mod policies;
mod stores;

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;
use tracing::info;
use xcc_certs::reload::ReloadingTls;
use xcc_controller::probes::Probes;
use xcc_controller::runtime::Runtime;

pub use self::config::{FederationConfig, RegistryConfig, StoreConfig};
use crate::catalog::Catalog;
use crate::federation::Level;
use crate::files::FileErrors;
use crate::hamlet::client::RemoteSpec;
use crate::metrics::{Health, Metrics};
use crate::peers::PeerTable;
use crate::remotes::{ParentWanted, Remotes};

/// Why a registry could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("loading TLS material")]
    Tls(#[source] xcc_certs::CertError),
    #[error(
        "the registry certificate must carry a cluster identity (spiffe://<trust-domain>/cluster/<name>); it has {0}"
    )]
    NotACluster(String),
    #[error("loading Cedar policies")]
    Policies(#[source] crate::authz::PolicyError),
    #[error("{0}")]
    Grants(crate::federation::grants::GrantError),
    #[error("reading the name-owner ledger")]
    Owners(#[source] anyhow::Error),
    #[error("preparing {}", path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("binding the {what} listener on {addr}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Metrics(#[from] xcc_controller::runtime::BindError),
    #[error("building gRPC reflection")]
    Reflection(#[source] tonic_reflection::server::Error),
}

/// What the parts of a registry share.
#[derive(Clone)]
struct Core {
    cluster: String,
    catalog: Catalog,
    peers: PeerTable,
    metrics: Metrics,
    health: Health,
    tls: ReloadingTls,
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
    runtime: Runtime,
}

impl Registry {
    /// Load TLS, bind every listener and start every task under `cancel`. Returns once the
    /// listeners are bound.
    pub async fn start(
        config: RegistryConfig,
        cancel: CancellationToken,
    ) -> Result<Self, StartError> {
        xcc_certs::install_crypto_provider();
        // Before anything writes below it (grants, name owners, imports all create their files).
        if let StoreConfig::File { state_dir, .. } = &config.store
            && !state_dir.is_dir()
        {
            std::fs::create_dir_all(state_dir).map_err(|source| StartError::StateDir {
                path: state_dir.clone(),
                source,
            })?;
            tracing::warn!(
                state_dir = %state_dir.display(),
                "--state-dir did not exist; created it empty (no exports, no remotes): check the path if this registry had state"
            );
        }
        let runtime = Runtime::new(cancel).with_grace(config.shutdown_grace);
        let spawner = runtime.spawner();
        let (tls, trust_domain) = load_identity(&config)?;
        let core = Core {
            cluster: tls.identity().name().to_string(),
            catalog: Catalog::new(),
            peers: PeerTable::default(),
            metrics: Metrics::default(),
            health: Health::default(),
            tls,
        };
        let mut prometheus = prometheus_client::registry::Registry::default();
        core.metrics.register(&mut prometheus);
        core.tls.register_metrics(&mut prometheus);
        crate::peer_metrics::PeerMetrics::new(core.peers.clone(), core.cluster.clone())
            .register(&mut prometheus);

        let policies = policies::start(&config, trust_domain, &core.metrics, spawner)?;
        let level =
            hierarchy::start(&config, &core, &policies.gate, &mut prometheus, spawner).await?;
        spawner.watch(
            "certificate watcher",
            core.tls
                .spawn_watcher(config.cert_poll, spawner.token().clone()),
        );
        let hamlet_addr =
            listeners::serve_hamlet(&config, &core, &policies.gate, &level, spawner).await?;
        let admin_addr = listeners::serve_admin(&config, &core, &level, spawner).await?;
        let (remotes, file_errors) = stores::start(
            &config,
            &core,
            &level,
            policies.synced,
            &mut prometheus,
            spawner,
        )
        .await?;
        let metrics_addr = match config.metrics_listen {
            Some(addr) => Some(serve_probes(&runtime, addr, &core, prometheus).await?),
            None => None,
        };

        let cluster = core.cluster.clone();
        info!(%cluster, %hamlet_addr, %admin_addr, ?metrics_addr, "registry started");
        Ok(Self {
            cluster,
            hamlet_addr,
            admin_addr,
            metrics_addr,
            catalog: core.catalog,
            peers: core.peers,
            metrics: core.metrics,
            health: core.health,
            tls: core.tls,
            file_errors,
            policy_errors: policies.errors,
            level,
            remotes,
            runtime,
        })
    }

    /// Shut down gracefully when `signal` completes (SIGTERM or Ctrl-C, see
    /// [`xcc_controller::runtime::shutdown_signal`]).
    pub fn stop_on(&self, signal: impl std::future::Future<Output = ()> + Send + 'static) {
        self.runtime.stop_on(signal);
    }

    /// Replace the set of remote registries (memory store; the file store watches its files).
    pub async fn set_remotes(&self, specs: Vec<RemoteSpec>) {
        self.remotes.reconcile(specs).await;
    }

    /// Replace the parent link (memory store; the file store watches its files).
    pub async fn set_parent(&self, parent: ParentWanted) {
        self.remotes.reconcile_parent(parent).await;
    }

    /// Stop everything and wait for the tasks (open connections get the shutdown grace period).
    /// Fails with the [`TaskError`](xcc_controller::tasks::TaskError) of a task that failed while stopping.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        Ok(self.runtime.shutdown().await?)
    }

    /// Run until the token is cancelled or a supervised task stops (then stop the rest and
    /// return that failure, a [`TaskError`](xcc_controller::tasks::TaskError) naming the task).
    pub async fn run(self) -> anyhow::Result<()> {
        Ok(self.runtime.run().await?)
    }
}

/// The TLS material, checked to name a cluster, and its trust domain.
fn load_identity(config: &RegistryConfig) -> Result<(ReloadingTls, String), StartError> {
    let tls = ReloadingTls::load(config.tls.clone()).map_err(StartError::Tls)?;
    let identity = tls.identity();
    if !identity.is_cluster() {
        return Err(StartError::NotACluster(identity.to_string()));
    }
    let trust_domain = identity.trust_domain().unwrap_or_default().to_string();
    Ok((tls, trust_domain))
}

/// `/healthz`, `/readyz` and `/metrics` (the catalog size refreshed on each scrape).
async fn serve_probes(
    runtime: &Runtime,
    addr: SocketAddr,
    core: &Core,
    prometheus: prometheus_client::registry::Registry,
) -> Result<SocketAddr, StartError> {
    let (metrics, catalog) = (core.metrics.clone(), core.catalog.clone());
    let probes = Probes::new(prometheus, core.health.clone()).on_scrape(move || {
        metrics.catalog_services.set(catalog.len() as i64);
    });
    Ok(runtime.serve_probes(addr, probes).await?)
}
