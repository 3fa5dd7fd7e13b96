//! `xcc publisher`: wiring only (the controller lives in `xcc-publisher`). Flags → settings →
//! the probes/metrics endpoint and the controller under leader election, on the process runtime.

use clap::Args;
use tokio_util::sync::CancellationToken;
use xcc_controller::leader::LeaderConfig;
use xcc_controller::probes::{Health, Probes};
use xcc_controller::runtime::Runtime;
use xcc_publisher::controller::{self, LEASE_NAME, Metrics, Settings};
use xcc_publisher::desired::Config;

#[derive(Args, Debug)]
pub struct PublisherArgs {
    /// Namespace of this deployment (leader-election Lease).
    #[arg(long, env = "NAMESPACE", default_value = xcc_proto::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// This cluster's name, recorded in exported records as spec.origin.cluster.
    #[arg(long, env = "XCC_CLUSTER_NAME")]
    pub cluster: Option<String>,
    /// The ingress (Contour Envoy) Service as namespace/name: its LoadBalancer addresses, else
    /// the nodes that run it, are the endpoints of exported HTTPProxies.
    #[arg(long, env = "XCC_INGRESS_SERVICE", default_value = controller::DEFAULT_INGRESS_SERVICE,
          value_parser = controller::parse_namespaced_name)]
    pub ingress_service: (String, String),
    /// Port the ingress serves exported HTTPProxies on.
    #[arg(long, env = "XCC_INGRESS_PORT", default_value_t = 443,
          value_parser = clap::value_parser!(i32).range(1..=65535))]
    pub ingress_port: i32,
    /// Plain-HTTP /healthz, /readyz and /metrics; empty to disable.
    #[arg(long, env = "XCC_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: String,
    /// Run only while holding the Lease `xcc-publisher` in --namespace.
    #[arg(long, env = "XCC_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Speak the Multi-Cluster Services API: a ServiceExport exports the Service of its name
    /// and gets Valid/Ready/Conflict conditions (needs the MCS CRDs and deploy/overlays/mcs).
    #[arg(long, env = "XCC_MCS", default_value_t = false, action = clap::ArgAction::Set)]
    pub mcs: bool,
}

pub async fn run(args: PublisherArgs) -> anyhow::Result<()> {
    let metrics_addr = crate::args::metrics_listen(&args.metrics_listen)?;
    let client = xcc_controller::client().await?;
    let leader = args
        .leader_elect
        .then(|| LeaderConfig::new(&args.namespace, LEASE_NAME));
    let mut cluster = args.cluster.clone().filter(|c| !c.is_empty());
    if args.mcs {
        let property = xcc_controller::cluster_id::cluster_property(&client).await?;
        cluster = xcc_controller::cluster_id::resolve(
            property.as_deref(),
            cluster.as_deref(),
            "--cluster (XCC_CLUSTER_NAME)",
        )?;
    }
    let settings = Settings {
        config: Config {
            ingress_port: args.ingress_port,
            cluster,
        },
        ingress_service: args.ingress_service.clone(),
        instance: leader.as_ref().map(|l| l.identity.clone()),
        mcs: args.mcs,
        ..Settings::default()
    };
    let metrics = Metrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let health = Health::default();

    let runtime = Runtime::new(CancellationToken::new());
    if let Some(addr) = metrics_addr {
        runtime
            .serve_probes(addr, Probes::new(registry, health.clone()))
            .await?;
    }
    // Signal handlers before starting work, so an early SIGTERM is handled gracefully.
    runtime.stop_on_signals()?;
    tracing::info!(
        namespace = %args.namespace,
        cluster = ?settings.config.cluster,
        ingress = %format!("{}/{}", settings.ingress_service.0, settings.ingress_service.1),
        ingress_port = settings.config.ingress_port,
        leader_elect = args.leader_elect,
        "xcc publisher starting"
    );
    let cancel = runtime.token().clone();
    runtime.spawn(
        "publisher",
        controller::serve(client, settings, metrics, health, leader, cancel),
    );
    Ok(runtime.run().await?)
}
