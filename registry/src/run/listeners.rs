//! The registry's two gRPC listeners, mTLS only, each with gRPC health and reflection: Hamlet
//! (both API versions) with the federation service, and the admin API.

use std::net::SocketAddr;

use xcc_controller::tasks::Spawner;
use xcc_proto::hamlet_server::v1alpha1::discovery_service_server::DiscoveryServiceServer;
use xcc_proto::xcc::admin::v1::admin_server::AdminServer;

use super::{Core, RegistryConfig, StartError};
use crate::admin::AdminService;
use crate::authz::Gate;
use crate::federation::Level;
use crate::federation::session::FederationService;
use crate::hamlet::pieces::hamlet_transport;
use crate::hamlet::server::{HamletServer, V1alpha1};

/// Bind the Hamlet listener and serve on it until shutdown.
pub(super) async fn serve_hamlet(
    config: &RegistryConfig,
    core: &Core,
    gate: &Gate,
    level: &Level,
    spawner: &Spawner,
) -> Result<SocketAddr, StartError> {
    let cancel = spawner.token().clone();
    let hamlet = HamletServer::new(
        core.catalog.clone(),
        gate.clone(),
        core.peers.clone(),
        core.metrics.clone(),
        config.hamlet.clone(),
        cancel.clone(),
    );
    let (listener, addr) = bind(config.hamlet_listen, "hamlet").await?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<DiscoveryServiceServer<V1alpha1>>()
        .await;
    let reflection = reflection()?;
    let incoming = xcc_certs::server::tls_incoming_for(
        "Hamlet/federation listener",
        listener,
        core.tls.clone(),
        cancel.clone(),
    );
    let router = hamlet_transport()
        .add_service(hamlet.v1alpha1())
        .add_service(hamlet.v1alpha2())
        .add_service(FederationService::new(level.clone(), cancel.clone()).into_server())
        .add_service(health)
        .add_service(reflection);
    spawner.spawn("hamlet listener", async move {
        Ok(router
            .serve_with_incoming_shutdown(incoming, cancel.cancelled())
            .await?)
    });
    Ok(addr)
}

/// Bind the admin listener and serve on it until shutdown.
pub(super) async fn serve_admin(
    config: &RegistryConfig,
    core: &Core,
    level: &Level,
    spawner: &Spawner,
) -> Result<SocketAddr, StartError> {
    let cancel = spawner.token().clone();
    let (listener, addr) = bind(config.admin_listen, "admin").await?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<AdminServer<AdminService>>().await;
    let admin = AdminService::new(
        core.catalog.clone(),
        core.peers.clone(),
        level.clone(),
        cancel.clone(),
        config.federation.query_timeout,
    );
    let incoming = xcc_certs::server::tls_incoming_for(
        "admin listener",
        listener,
        core.tls.clone(),
        cancel.clone(),
    );
    let router = tonic::transport::Server::builder()
        .add_service(admin.into_server())
        .add_service(health)
        .add_service(reflection()?);
    spawner.spawn("admin listener", async move {
        Ok(router
            .serve_with_incoming_shutdown(incoming, cancel.cancelled())
            .await?)
    });
    Ok(addr)
}

async fn bind(
    addr: SocketAddr,
    what: &'static str,
) -> Result<(tokio::net::TcpListener, SocketAddr), StartError> {
    let bind = async {
        let l = tokio::net::TcpListener::bind(addr).await?;
        let a = l.local_addr()?;
        Ok((l, a))
    };
    bind.await
        .map_err(|source| StartError::Bind { what, addr, source })
}

fn reflection() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    StartError,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(xcc_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(StartError::Reflection)
}
