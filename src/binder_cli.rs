//! `xcc binder`: wiring only (the controller lives in `xcc_binder::controller`).

use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;
use xcc_binder::controller::{COMPONENT, Config, Controller, Metrics};
use xcc_controller::leader::{LeaderConfig, run_as_leader};
use xcc_controller::probes::{Health, serve};

#[derive(Args, Debug)]
pub struct BinderArgs {
    /// Namespace of this deployment: imported ServiceRecords and the Services made from them.
    #[arg(long, env = "NAMESPACE", default_value = xcc_proto::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Address for /healthz, /readyz and /metrics; empty disables them.
    #[arg(long, env = "XCC_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: String,
    /// Run only while holding the `xcc-binder` Lease in the namespace.
    #[arg(long, env = "XCC_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Also write a ServiceImport per import (the Multi-Cluster Services API; needs the MCS
    /// CRDs and deploy/overlays/mcs).
    #[arg(long, env = "XCC_MCS", default_value_t = false, action = clap::ArgAction::Set)]
    pub mcs: bool,
}

pub async fn run(args: BinderArgs) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let stop = crate::cli::shutdown_signal()?;
    let client = xcc_controller::client().await?;

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = Health::default();
    let health_flag = health.clone();
    let controller = Controller::new(
        client.clone(),
        Config {
            mcs: args.mcs,
            ..Config::new(&args.namespace)
        },
        metrics,
        health.clone(),
    );
    let handle = controller.handle();
    let probes = if args.metrics_listen.is_empty() {
        None
    } else {
        let listener = tokio::net::TcpListener::bind(&args.metrics_listen)
            .await
            .with_context(|| format!("binding the metrics listener {}", args.metrics_listen))?;
        tracing::info!(addr = %args.metrics_listen, "serving /healthz, /readyz, /metrics");
        let on_scrape: Arc<dyn Fn() + Send + Sync> = Arc::new(move || handle.refresh_gauges());
        Some(tokio::spawn(serve(
            listener,
            Arc::new(registry),
            health,
            on_scrape,
            cancel.clone(),
        )))
    };
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        stop.await;
        tracing::info!("shutdown requested");
        on_signal.cancel();
    });

    let leader = args
        .leader_elect
        .then(|| LeaderConfig::new(&args.namespace, COMPONENT));
    tracing::info!(namespace = %args.namespace, leader_elect = args.leader_elect, "xcc binder starting");
    // A standby replica is healthy and ready to take over: it reports ready, so a rolling update
    // (new pod ready before the old one stops and releases the Lease) never stalls. The leader is
    // ready once its first sync is done.
    let standby = leader.is_some();
    health_flag.set_ready(standby);
    let result = run_as_leader(
        client,
        leader,
        cancel.clone(),
        move |leading| {
            if leading {
                health_flag.set_ready(false);
            }
        },
        |token| controller.run(token),
    )
    .await;
    cancel.cancel();
    if let Some(probes) = probes {
        match probes.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "probe server failed"),
            Err(e) => tracing::warn!(error = %e, "probe server task failed"),
        }
    }
    result
}
