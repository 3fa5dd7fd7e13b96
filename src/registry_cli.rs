//! `xcc registry`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;
use xcc_registry::hamlet::client::{Backoff, ClientConfig};
use xcc_registry::hamlet::server::HamletConfig;
use xcc_registry::{Registry, RegistryConfig, StoreConfig};

use crate::args::{Store, TlsArgs};

#[derive(Args, Debug)]
pub struct RegistryArgs {
    #[command(flatten)]
    pub tls: TlsArgs,
    #[arg(long, value_enum, env = "XCC_STORE", default_value = "file")]
    pub store: Store,
    /// Directory holding exports/, remotes/ and imports/ (file store).
    #[arg(long, env = "XCC_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Hamlet listener (mTLS gRPC).
    #[arg(long, env = "XCC_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Admin API listener (mTLS gRPC, admin identities only).
    #[arg(long, env = "XCC_ADMIN_LISTEN", default_value = "127.0.0.1:9443")]
    pub admin_listen: SocketAddr,
    /// Plain-HTTP /metrics, /healthz, /readyz (no catalog data); empty to disable.
    #[arg(long, env = "XCC_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: String,
    /// Namespace written into imported ServiceRecords (kube store: also where RemoteRegistries
    /// and the Lease live).
    #[arg(long, env = "NAMESPACE", default_value = xcc_proto::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Kube store: import only while holding the Lease `xcc-registry` (the Hamlet server runs
    /// on every replica).
    #[arg(long, env = "XCC_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Plain Hamlet peers send no end-of-snapshot marker: stale imports are removed after the
    /// stream has been quiet this long (seconds).
    #[arg(long, env = "XCC_QUIET_PERIOD_SECONDS", default_value_t = 10, value_parser = crate::args::seconds())]
    pub quiet_period_seconds: u64,
    /// ... or, when changes never leave the stream quiet, at the latest this long after
    /// connecting, once the peer's snapshot is over (seconds; at least the quiet period).
    #[arg(long, env = "XCC_MAX_SWEEP_DELAY_SECONDS", default_value_t = 30, value_parser = crate::args::seconds())]
    pub max_sweep_delay_seconds: u64,
    /// Reconnect backoff cap (seconds); the floor is 1 s.
    #[arg(long, env = "XCC_BACKOFF_MAX_SECONDS", default_value_t = 120, value_parser = crate::args::seconds())]
    pub backoff_max_seconds: u64,
    /// Close a Hamlet stream whose oldest response is unacknowledged this long (seconds). A
    /// consumer that stopped reading (its HTTP/2 window is full) has its whole connection closed
    /// at most 1 s later instead; either way its peer entry is released and it must reconnect.
    #[arg(long, env = "XCC_ACK_TIMEOUT_SECONDS", default_value_t = 120, value_parser = crate::args::seconds())]
    pub ack_timeout_seconds: u64,
    /// On shutdown, how long open streams and connections may take to finish before they are
    /// dropped (seconds). Keep it below the pod's terminationGracePeriodSeconds.
    #[arg(long, env = "XCC_SHUTDOWN_GRACE_SECONDS", default_value_t = 10, value_parser = crate::args::seconds())]
    pub shutdown_grace_seconds: u64,
    /// Responses in flight per Hamlet consumer.
    #[arg(long, env = "XCC_WINDOW", default_value_t = 128)]
    pub window: usize,
    /// Encoded bytes the unacknowledged Hamlet responses of one stream may add up to (default
    /// 8 MiB; one response is always sent): what a consumer that does not ACK can pin.
    #[arg(long, env = "XCC_WINDOW_BYTES", default_value_t = 8 * 1024 * 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub window_bytes: u32,
    /// Poll period for file changes, as a fallback to filesystem events (seconds).
    #[arg(long, env = "XCC_POLL_SECONDS", default_value_t = 5, value_parser = crate::args::seconds())]
    pub poll_seconds: u64,
    /// Directory of extra Cedar policies (`*.cedar`), watched; the default policies always apply.
    #[arg(long, env = "XCC_POLICY_DIR")]
    pub policy_dir: Option<PathBuf>,
    /// Kube store: ConfigMap in --namespace whose `*.cedar` keys are extra Cedar policies,
    /// watched on every replica (absent: the defaults alone); empty to disable. Not read when
    /// --policy-dir is set.
    #[arg(long, env = "XCC_POLICY_CONFIGMAP", default_value = "xcc-policies")]
    pub policy_configmap: String,
    /// What this registry applies when a caller is granted one of its services: none, istio
    /// (AuthorizationPolicy), gateway (HTTPRoute) or cilium (CiliumNetworkPolicy). File store:
    /// written to <state-dir>/grants/; kube store: applied in the service's namespace by the
    /// replica holding the Lease, and recorded in the ServiceRecord's status.grants.
    #[arg(long, env = "XCC_GRANT_MODE", default_value = "none")]
    pub grant_mode: xcc_registry::federation::grants::GrantMode,
    /// --grant-mode gateway: the Gateway (<namespace>/<name>) every HTTPRoute attaches to.
    #[arg(long, env = "XCC_GRANT_GATEWAY")]
    pub grant_gateway: Option<xcc_registry::federation::grants::GatewayRef>,
    /// The mesh trust domain of a caller cluster's workloads, `{cluster}` standing for the
    /// caller's cluster name (e.g. `{cluster}.mesh.example`). A caller's workload identity in
    /// another trust domain is refused; grants admit `<trust domain>/ns/<ns>/sa/<sa>`.
    #[arg(long, env = "XCC_GRANT_TRUST_DOMAIN", default_value = "cluster.local")]
    pub grant_trust_domain: String,
    /// How long the names of a child's service (FQDN and namespace/name) stay held for it after
    /// it went away without withdrawing the service (hours); 0: until it is back. Shown by
    /// `xcc admin tree`.
    #[arg(long, env = "XCC_NAME_HOLD_HOURS", default_value_t = 168)]
    pub name_hold_hours: u64,
    /// How long a hierarchy query waits for its answer (seconds).
    #[arg(long, env = "XCC_QUERY_TIMEOUT_SECONDS", default_value_t = 5, value_parser = crate::args::seconds())]
    pub query_timeout_seconds: u64,
    /// Most messages queued for one federation peer (each child session, and up to the
    /// parent). A peer that falls further behind is cut with `Unavailable` and resynchronises.
    #[arg(long, env = "XCC_FEDERATION_QUEUE_MESSAGES", default_value_t = xcc_registry::budget::QueueLimits::FEDERATION.messages as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub federation_queue_messages: u32,
    /// Most encoded bytes queued for one federation peer (default 4 MiB). A larger single
    /// message still passes alone; a peer that falls further behind is cut with `Unavailable`
    /// naming this budget, and its queue is freed.
    #[arg(long, env = "XCC_FEDERATION_QUEUE_BYTES", default_value_t = xcc_registry::budget::QueueLimits::FEDERATION.bytes as u32, value_parser = clap::value_parser!(u32).range(1..=2_147_483_647))]
    pub federation_queue_bytes: u32,
    /// A child's messages are read only while its queue is less than half full (back-pressure);
    /// a child whose queue stays fuller this long (seconds) is cut with `Unavailable`.
    #[arg(long, env = "XCC_FEDERATION_QUEUE_STALL_SECONDS", default_value_t = 60, value_parser = crate::args::seconds())]
    pub federation_queue_stall_seconds: u64,
    /// Multi-Cluster Services: at start-up, refuse to run when the ClusterProperty
    /// `cluster.clusterset.k8s.io` names this cluster otherwise than the certificate does.
    #[arg(long, env = "XCC_MCS", default_value_t = false, action = clap::ArgAction::Set)]
    pub mcs: bool,
}

pub async fn run(args: RegistryArgs) -> anyhow::Result<()> {
    let store = match args.store {
        Store::File => StoreConfig::File {
            state_dir: args
                .state_dir
                .clone()
                .context("--store file needs --state-dir")?,
            poll: Duration::from_secs(args.poll_seconds.max(1)),
        },
        Store::Kube => StoreConfig::Kube(xcc_registry::store::kube::KubeConfig::new(
            xcc_controller::client().await?,
            args.leader_elect,
        )),
    };
    let metrics_listen = crate::args::metrics_listen(&args.metrics_listen)?;
    let config = RegistryConfig {
        tls: args.tls.files()?,
        namespace: args.namespace,
        hamlet_listen: args.listen,
        admin_listen: args.admin_listen,
        metrics_listen,
        hamlet: HamletConfig {
            window: args.window.max(1),
            window_bytes: args.window_bytes as usize,
            ack_timeout: Duration::from_secs(args.ack_timeout_seconds.max(1)),
            ..HamletConfig::default()
        },
        client: ClientConfig {
            backoff: Backoff {
                min: Duration::from_secs(1),
                max: Duration::from_secs(args.backoff_max_seconds.max(1)),
            },
            quiet_period: Duration::from_secs(args.quiet_period_seconds),
            max_sweep_delay: Duration::from_secs(args.max_sweep_delay_seconds),
            ..ClientConfig::default()
        },
        store,
        cert_poll: Duration::from_secs(30),
        shutdown_grace: Duration::from_secs(args.shutdown_grace_seconds),
        federation: xcc_registry::run::FederationConfig {
            policy_dir: args.policy_dir,
            policy_configmap: Some(args.policy_configmap).filter(|n| !n.is_empty()),
            query_timeout: Duration::from_secs(args.query_timeout_seconds.max(1)),
            grant_mode: args.grant_mode,
            grant_gateway: args.grant_gateway,
            grant_trust_domain: args.grant_trust_domain,
            queue_limits: xcc_registry::budget::QueueLimits::new(
                args.federation_queue_messages as usize,
                args.federation_queue_bytes as usize,
            ),
            queue_stall: Duration::from_secs(args.federation_queue_stall_seconds.max(1)),
            name_hold: Duration::from_secs(args.name_hold_hours.saturating_mul(3600)),
            ..Default::default()
        },
    };
    if args.mcs {
        check_cluster_property(&config.tls).await?;
    }
    // Handlers first: a SIGTERM right after the "registry started" line must stop it gracefully.
    let stop = xcc_controller::runtime::shutdown_signal()?;
    let registry = Registry::start(config, CancellationToken::new()).await?;
    registry.stop_on(stop);
    registry.run().await
}

/// The certificate's cluster name must be the ClusterProperty's, when there is one.
async fn check_cluster_property(tls: &xcc_certs::reload::TlsFiles) -> anyhow::Result<()> {
    xcc_certs::install_crypto_provider();
    let identity = xcc_certs::reload::ReloadingTls::load(tls.clone())
        .context("loading TLS material")?
        .identity();
    let client = xcc_controller::client().await?;
    let property = xcc_controller::cluster_id::cluster_property(&client).await?;
    xcc_controller::cluster_id::resolve(
        property.as_deref(),
        Some(identity.name()),
        "the registry certificate",
    )?;
    Ok(())
}
