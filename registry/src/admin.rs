//! `xcc.admin.v1.Admin`: catalog listing and lookup, peers, and a catalog event watch. Served on
//! its own mTLS listener; every call must come from a certificate with an admin identity.

use std::pin::Pin;
use std::time::SystemTime;

use futures::Stream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use xcc_proto::xcc::admin::v1 as api;

use crate::catalog::{Catalog, CatalogEvent, ListFilter, ServiceEntry, ServiceKey};
use crate::peers::{PeerKind, PeerState, PeerTable};

#[derive(Clone)]
pub struct AdminService {
    catalog: Catalog,
    peers: PeerTable,
    cancel: CancellationToken,
}

impl AdminService {
    pub fn new(catalog: Catalog, peers: PeerTable, cancel: CancellationToken) -> Self {
        Self {
            catalog,
            peers,
            cancel,
        }
    }

    pub fn into_server(self) -> api::admin_server::AdminServer<Self> {
        // Admin requests are small; 1 MiB is far above any legitimate one.
        api::admin_server::AdminServer::new(self).max_decoding_message_size(1024 * 1024)
    }
}

/// Only admin identities may use this API.
fn authorize<T>(req: &Request<T>) -> Result<(), Status> {
    match xcc_certs::server::peer_info(req) {
        Some(p) if p.identity.is_admin() => Ok(()),
        Some(p) => Err(Status::permission_denied(format!(
            "{} is not an admin identity",
            p.identity
        ))),
        None => Err(Status::unauthenticated("no verified client certificate")),
    }
}

pub fn to_api(e: &ServiceEntry) -> api::Service {
    api::Service {
        owner_cluster: e.key.cluster.clone(),
        namespace: e.key.namespace.clone(),
        name: e.key.name.clone(),
        fqdn: e.fqdn.clone(),
        endpoints: e
            .endpoints
            .iter()
            .map(|ep| api::Endpoint {
                address: ep.address.clone(),
                port: ep.port,
            })
            .collect(),
        ports: e
            .ports
            .iter()
            .map(|p| api::Port {
                name: p.name.clone(),
                port: p.port,
                protocol: p.protocol.clone(),
            })
            .collect(),
        labels: e.labels.clone(),
        allowed_requesters: e.allowed_requesters.clone(),
        origin: e.origin.as_ref().map(|o| api::Origin {
            cluster: o.cluster.clone(),
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            kind: o.kind.clone(),
        }),
        revision: e.revision,
        source: e.source.to_string(),
    }
}

fn timestamp(t: Option<SystemTime>) -> Option<prost_types::Timestamp> {
    t.map(prost_types::Timestamp::from)
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<api::CatalogEvent, Status>> + Send>>;

#[tonic::async_trait]
impl api::admin_server::Admin for AdminService {
    async fn list_services(
        &self,
        request: Request<api::ListServicesRequest>,
    ) -> Result<Response<api::ListServicesResponse>, Status> {
        authorize(&request)?;
        let r = request.into_inner();
        let filter = ListFilter {
            cluster: non_empty(&r.owner_cluster),
            namespace: non_empty(&r.namespace),
            fqdn_suffix: non_empty(&r.fqdn_suffix),
            source: None,
        };
        let services = self
            .catalog
            .list(&filter)
            .iter()
            .map(|e| to_api(e))
            .collect();
        Ok(Response::new(api::ListServicesResponse { services }))
    }

    async fn get_service(
        &self,
        request: Request<api::GetServiceRequest>,
    ) -> Result<Response<api::Service>, Status> {
        authorize(&request)?;
        let r = request.into_inner();
        let found = if !r.fqdn.is_empty() {
            if !r.owner_cluster.is_empty() || !r.namespace.is_empty() || !r.name.is_empty() {
                return Err(Status::invalid_argument(
                    "give either fqdn or owner_cluster/namespace/name, not both",
                ));
            }
            let mut all = self.catalog.by_fqdn(&r.fqdn);
            // Prefer our own export, then the lowest key.
            all.sort_by_key(|e| (e.source != crate::catalog::Source::Local, e.key.clone()));
            all.into_iter().next()
        } else if !r.owner_cluster.is_empty() && !r.name.is_empty() {
            self.catalog
                .get(&ServiceKey::new(r.owner_cluster, r.namespace, r.name))
        } else {
            return Err(Status::invalid_argument(
                "give fqdn, or owner_cluster and name (and namespace)",
            ));
        };
        found
            .map(|e| Response::new(to_api(&e)))
            .ok_or_else(|| Status::not_found("no such service"))
    }

    async fn list_peers(
        &self,
        request: Request<api::ListPeersRequest>,
    ) -> Result<Response<api::ListPeersResponse>, Status> {
        authorize(&request)?;
        let peers = self
            .peers
            .list()
            .iter()
            .map(|p| api::Peer {
                kind: match p.kind {
                    PeerKind::HamletConsumer => api::peer::Kind::HamletConsumer,
                    PeerKind::RemoteRegistry => api::peer::Kind::RemoteRegistry,
                } as i32,
                name: p.name.clone(),
                identity: p.identity(),
                address: p.address.clone(),
                state: match p.state() {
                    PeerState::Connecting => api::peer::State::Connecting,
                    PeerState::Connected => api::peer::State::Connected,
                    PeerState::Backoff => api::peer::State::Backoff,
                    PeerState::Failed => api::peer::State::Failed,
                    PeerState::Stopped => api::peer::State::Stopped,
                } as i32,
                connected_since: timestamp(p.connected_since()),
                last_sync: timestamp(p.last_sync()),
                record_count: p.records.load(std::sync::atomic::Ordering::Relaxed),
                last_error: p.last_error(),
                responses_sent: p.sent.load(std::sync::atomic::Ordering::Relaxed),
                acks: p.acks.load(std::sync::atomic::Ordering::Relaxed),
                nacks: p.nacks.load(std::sync::atomic::Ordering::Relaxed),
                reconnects: p.reconnects.load(std::sync::atomic::Ordering::Relaxed),
            })
            .collect();
        Ok(Response::new(api::ListPeersResponse { peers }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<api::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        authorize(&request)?;
        let snapshot = request.into_inner().snapshot;
        let mut events = self.catalog.subscribe();
        let (tx, rx) = mpsc::channel(256);
        let catalog = self.catalog.clone();
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            if snapshot {
                for e in catalog.list(&ListFilter::default()) {
                    let ev = api::CatalogEvent {
                        kind: api::catalog_event::Kind::Upsert as i32,
                        revision: e.revision,
                        service: Some(to_api(&e)),
                    };
                    if tx.send(Ok(ev)).await.is_err() {
                        return;
                    }
                }
                let done = api::CatalogEvent {
                    kind: api::catalog_event::Kind::SnapshotComplete as i32,
                    revision: catalog.revision(),
                    service: None,
                };
                if tx.send(Ok(done)).await.is_err() {
                    return;
                }
            }
            loop {
                let ev = tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tx.closed() => return,
                    ev = events.recv() => ev,
                };
                let msg = match ev {
                    Ok(CatalogEvent::Upsert(e)) => api::CatalogEvent {
                        kind: api::catalog_event::Kind::Upsert as i32,
                        revision: e.revision,
                        service: Some(to_api(&e)),
                    },
                    Ok(CatalogEvent::Delete(e)) => api::CatalogEvent {
                        kind: api::catalog_event::Kind::Delete as i32,
                        revision: e.revision,
                        service: Some(to_api(&e)),
                    },
                    Err(broadcast::error::RecvError::Lagged(_)) => api::CatalogEvent {
                        kind: api::catalog_event::Kind::Resync as i32,
                        revision: catalog.revision(),
                        service: None,
                    },
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Connect an admin client to `addr` (`host:port`) with the caller's certificate (which must
/// carry an admin identity). `server_name` defaults to the host part of `addr`.
pub async fn connect(
    tls: xcc_certs::reload::ReloadingTls,
    addr: &str,
    server_name: Option<String>,
) -> anyhow::Result<api::admin_client::AdminClient<tonic::transport::Channel>> {
    use anyhow::Context as _;
    let host = addr
        .rsplit_once(':')
        .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').to_string())
        .unwrap_or_else(|| addr.to_string());
    let connector = xcc_certs::client::TlsConnector::new(tls, server_name.unwrap_or(host), None)?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .with_context(|| format!("invalid admin address {addr:?}"))?
        .connect_timeout(std::time::Duration::from_secs(10))
        .connect_with_connector(connector)
        .await
        .with_context(|| format!("connecting to the admin API at {addr}"))?;
    Ok(api::admin_client::AdminClient::new(channel))
}
