//! `xcc binder`: wiring only (the controller lives in `xcc_binder::controller`).

use clap::Args;
use tokio_util::sync::CancellationToken;
use xcc_binder::controller::{COMPONENT, Config, Controller, Metrics};
use xcc_controller::leader::LeaderConfig;
use xcc_controller::probes::{Health, Probes};
use xcc_controller::runtime::Runtime;

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
    let metrics_addr = crate::args::metrics_listen(&args.metrics_listen)?;
    let client = xcc_controller::client().await?;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let health = Health::default();
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

    let runtime = Runtime::new(CancellationToken::new());
    if let Some(addr) = metrics_addr {
        let probes =
            Probes::new(registry, health.clone()).on_scrape(move || handle.refresh_gauges());
        runtime.serve_probes(addr, probes).await?;
    }
    runtime.stop_on_signals()?;
    let leader = args
        .leader_elect
        .then(|| LeaderConfig::new(&args.namespace, COMPONENT));
    tracing::info!(namespace = %args.namespace, leader_elect = args.leader_elect, "xcc binder starting");
    runtime.spawn_leader("binder", client, leader, health, |token| {
        controller.run(token)
    });
    Ok(runtime.run().await?)
}
