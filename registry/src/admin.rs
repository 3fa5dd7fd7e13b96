//! `xcc.admin.v1.Admin`: catalog listing and lookup, peers, and a catalog event watch. Served on
//! its own mTLS listener behind one authorization layer ([`AdminOnly`]): every call must come
//! from a certificate with an admin identity.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};
use xcc_proto::xcc::admin::v1 as api;

use crate::budget::{ByteBudget, Charge};
use crate::catalog::{Catalog, CatalogEvent, ListFilter, ServiceEntry, ServiceKey};
use crate::federation::{Level, Target};
use crate::peers::{PeerKind, PeerState, PeerTable};

mod client;
mod view;
pub use client::{call_error, connect, list_all_services};
pub use view::{code_name, to_api};
use view::{
    condition, decision_from_answer, import_status, refused_entry, rejection_line, timestamp,
};

#[derive(Clone)]
pub struct AdminService {
    catalog: Catalog,
    peers: PeerTable,
    level: Level,
    cancel: CancellationToken,
    query_timeout: std::time::Duration,
}

impl AdminService {
    /// How many services the child `cluster` announces (its entries in the catalog).
    fn announced_by(&self, cluster: &str) -> u64 {
        self.catalog
            .list(&ListFilter {
                source: Some(crate::catalog::Source::Child(cluster.into())),
                ..Default::default()
            })
            .len() as u64
    }

    pub fn new(
        catalog: Catalog,
        peers: PeerTable,
        level: Level,
        cancel: CancellationToken,
        query_timeout: std::time::Duration,
    ) -> Self {
        Self {
            catalog,
            peers,
            level,
            cancel,
            query_timeout,
        }
    }

    /// Evaluate at this level only: no forwarding, no grant recorded.
    fn explain_locally(&self, r: &api::ResolveRequest) -> Result<api::Decision, Status> {
        let target = target_of(r)?;
        let requester = if r.requester_cluster.is_empty() {
            self.level.cluster().to_string()
        } else {
            r.requester_cluster.clone()
        };
        Ok(
            match self
                .level
                .explain(&target, &requester, &r.requester_service, true)
            {
                Some((entry, d)) => api::Decision {
                    found: true,
                    allowed: d.allowed,
                    condition: condition(d.condition),
                    reason: d.reason.clone(),
                    policies: d.policies.clone(),
                    owner_cluster: entry.key.cluster.to_string(),
                    resolver_cluster: self.level.cluster().to_string(),
                    service: Some(to_api(&entry)),
                    callee_admits: d.callee_admits,
                    caller_requested: d.caller_requested,
                    policy_permits: d.policy_permits,
                    name_clashes: self.clashes_on(&entry.fqdn),
                },
                None if requester == self.level.cluster() => match self.explain_import(&target) {
                    Some(d) => d,
                    None => self.not_found(&target),
                },
                None => self.not_found(&target),
            },
        )
    }

    /// Not in the subtree (nor, for this registry itself, imported).
    fn not_found(&self, target: &Target) -> api::Decision {
        api::Decision {
            found: false,
            condition: api::Condition::NotFound as i32,
            reason: format!("{target} is not in the subtree of {}", self.level.cluster()),
            resolver_cluster: self.level.cluster().to_string(),
            name_clashes: match target {
                Target::Fqdn(f) => self.clashes_on(f),
                Target::Name { .. } => vec![],
            },
            ..Default::default()
        }
    }

    /// A record this registry imported (not in its subtree, so `Level::explain` does not know
    /// it): where it came from, over which link, and who decided. The checks that admitted it
    /// (allowed requesters, the Cedar policies) ran at the registry that sent it; this registry
    /// only filtered it by the RemoteRegistry's allowed domains.
    fn explain_import(&self, target: &Target) -> Option<api::Decision> {
        let mut found: Vec<Arc<crate::catalog::ServiceEntry>> = match target {
            Target::Fqdn(f) => self.catalog.by_fqdn(f),
            Target::Name { namespace, name } => self.catalog.by_name(namespace, name),
        };
        found.retain(|e| {
            matches!(
                e.source,
                crate::catalog::Source::Remote(_) | crate::catalog::Source::Hierarchy(_)
            )
        });
        found.sort_by_key(|e| e.key.clone());
        let entry = found.into_iter().next()?;
        let me = self.level.cluster();
        let (link, sender, how) = match &entry.source {
            crate::catalog::Source::Remote(remote) => (
                format!("RemoteRegistry {remote}"),
                remote.clone(),
                format!(
                    "{remote}'s Hamlet server sent it to {me} (the service's allowed requesters admit {me} and {remote}'s policies permit it: checked there, see `xcc admin explain` on {remote}), and it is within the allowedDomains of RemoteRegistry {remote}"
                ),
            ),
            crate::catalog::Source::Hierarchy(parent) => (
                format!("parent link {parent}"),
                parent.clone(),
                format!(
                    "granted through the hierarchy: the resolving level checked the bilateral rule (allowed requesters, {me}'s request, the policies) and answered through the parent {parent} (see `xcc admin routes`)"
                ),
            ),
            _ => return None,
        };
        let peer = self
            .peers
            .list()
            .into_iter()
            .find(|p| p.name == sender)
            .map(|p| {
                let identity = p.identity();
                format!(
                    "{}, {:?}{}",
                    p.address,
                    p.state(),
                    if identity.is_empty() {
                        String::new()
                    } else {
                        format!(", server identity {identity}")
                    }
                )
            })
            .unwrap_or_else(|| "not connected now".to_owned());
        Some(api::Decision {
            found: true,
            allowed: true,
            condition: api::Condition::Granted as i32,
            reason: format!("imported from {} via {link} ({peer}): {how}", entry.source),
            policies: vec![],
            owner_cluster: entry.key.cluster.to_string(),
            resolver_cluster: sender,
            service: Some(to_api(&entry)),
            callee_admits: entry.admits(me),
            caller_requested: true,
            policy_permits: true,
            name_clashes: self.clashes_on(&entry.fqdn),
        })
    }

    /// Refused claims on `fqdn` seen at this registry, for `explain`.
    fn clashes_on(&self, fqdn: &str) -> Vec<String> {
        self.level
            .clashes(Some(fqdn))
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The service behind its authorization layer ([`AdminOnly`]).
    pub fn into_server(
        self,
    ) -> InterceptedService<api::admin_server::AdminServer<Self>, AdminOnly> {
        let layer = AdminOnly {
            level: self.level.clone(),
        };
        // Admin requests are small; 1 MiB is far above any legitimate one.
        let server =
            api::admin_server::AdminServer::new(self).max_decoding_message_size(1024 * 1024);
        InterceptedService::new(server, layer)
    }
}

/// The admin API's one authorization layer, run on every call's headers before its message is
/// read: only admin identities of this trust domain may use the API (the decision point binds
/// kind and trust domain, as for every other listener).
#[derive(Clone)]
pub struct AdminOnly {
    level: Level,
}

impl tonic::service::Interceptor for AdminOnly {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(peer) = xcc_certs::server::peer_info(&req) else {
            return Err(Status::unauthenticated("no verified client certificate"));
        };
        self.level.gate().admin_of(&peer.identity)?;
        Ok(req)
    }
}

/// Most services in one `ListServices` page, whatever the client asks for.
const MAX_PAGE_SERVICES: usize = 10_000;

/// Most encoded bytes of services in one `ListServices` page: half of tonic's default 4 MiB
/// decoding limit, so a page always decodes (a single larger service is still sent alone).
const MAX_PAGE_BYTES: usize = 2 * 1024 * 1024;

/// Services a client asks for per `ListServices` page ([`list_all_services`]).
pub const PAGE_SIZE: u32 = 1000;

/// The opaque token of the page after `key`: its parts as a JSON array.
fn page_token(key: &ServiceKey) -> String {
    serde_json::json!([
        key.cluster.as_str(),
        key.namespace.as_str(),
        key.name.as_str()
    ])
    .to_string()
}

fn page_key(token: &str) -> Option<ServiceKey> {
    let [c, ns, n]: [String; 3] = serde_json::from_str(token).ok()?;
    Some(ServiceKey::new(c, ns, n))
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<api::CatalogEvent, Status>> + Send>>;

fn target_of(r: &api::ResolveRequest) -> Result<Target, Status> {
    match (r.fqdn.is_empty(), r.name.is_empty()) {
        (false, true) => Ok(Target::Fqdn(
            xcc_proto::names::canonical_fqdn(&r.fqdn)
                .map_err(|e| Status::invalid_argument(format!("fqdn: {e}")))?,
        )),
        (true, false) => Ok(Target::Name {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        }),
        _ => Err(Status::invalid_argument(
            "give either fqdn, or namespace and name",
        )),
    }
}

#[tonic::async_trait]
impl api::admin_server::Admin for AdminService {
    async fn list_services(
        &self,
        request: Request<api::ListServicesRequest>,
    ) -> Result<Response<api::ListServicesResponse>, Status> {
        let r = request.into_inner();
        let filter = ListFilter {
            cluster: non_empty(&r.owner_cluster),
            namespace: non_empty(&r.namespace),
            fqdn_suffix: non_empty(&r.fqdn_suffix),
            source: None,
        };
        if r.page_size == 0 {
            // A client from before paging: everything at once, as it expects.
            let services = self
                .catalog
                .list(&filter)
                .iter()
                .map(|e| to_api(e))
                .collect();
            return Ok(Response::new(api::ListServicesResponse {
                services,
                next_page_token: String::new(),
            }));
        }
        let after = if r.page_token.is_empty() {
            None
        } else {
            Some(page_key(&r.page_token).ok_or_else(|| {
                Status::invalid_argument("page_token is not one this server handed out")
            })?)
        };
        let limit = (r.page_size as usize).min(MAX_PAGE_SERVICES);
        // One more than the page, to know whether another follows.
        let mut found = self.catalog.list_after(&filter, after.as_ref(), limit + 1);
        let mut more = found.len() > limit;
        found.truncate(limit);
        let mut services = Vec::with_capacity(found.len());
        let mut bytes = 0;
        let mut last = None;
        for e in &found {
            let s = to_api(e);
            // The service, its length and its field tag in the response.
            let len = prost::Message::encoded_len(&s);
            let size = len + prost::length_delimiter_len(len) + 1;
            // Always at least one service, so a page makes progress whatever its size.
            if !services.is_empty() && bytes + size > MAX_PAGE_BYTES {
                more = true;
                break;
            }
            bytes += size;
            last = Some(&e.key);
            services.push(s);
        }
        let next_page_token = match last {
            Some(k) if more => page_token(k),
            _ => String::new(),
        };
        Ok(Response::new(api::ListServicesResponse {
            services,
            next_page_token,
        }))
    }

    async fn get_service(
        &self,
        request: Request<api::GetServiceRequest>,
    ) -> Result<Response<api::Service>, Status> {
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
        _request: Request<api::ListPeersRequest>,
    ) -> Result<Response<api::ListPeersResponse>, Status> {
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

    async fn resolve(
        &self,
        request: Request<api::ResolveRequest>,
    ) -> Result<Response<api::Decision>, Status> {
        let r = request.into_inner();
        let target = target_of(&r)?;
        if !r.requester_cluster.is_empty() && r.requester_cluster != self.level.cluster() {
            // Answers are routed to the requester's cluster, so asking the hierarchy on another
            // cluster's behalf is not possible from here: evaluate locally instead.
            return Ok(Response::new(self.explain_locally(&r)?));
        }
        let identity = crate::federation::grants::WorkloadIdentity::from_wire(
            &r.requester_trust_domain,
            &r.requester_namespace,
            &r.requester_service_account,
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let answer = self
            .level
            .query_as(
                target,
                &r.requester_service,
                identity,
                false,
                self.query_timeout,
            )
            .await;
        Ok(Response::new(decision_from_answer(&answer)))
    }

    async fn explain(
        &self,
        request: Request<api::ResolveRequest>,
    ) -> Result<Response<api::Decision>, Status> {
        Ok(Response::new(self.explain_locally(request.get_ref())?))
    }

    async fn explain_policy(
        &self,
        request: Request<api::ExplainPolicyRequest>,
    ) -> Result<Response<api::Decision>, Status> {
        let r = request.into_inner();
        let entry = ServiceEntry {
            key: ServiceKey::new(
                r.principal_cluster.clone(),
                r.namespace.clone(),
                r.name.clone(),
            ),
            source: crate::catalog::Source::Local,
            fqdn: r.fqdn.as_str().into(),
            endpoints: vec![],
            ports: vec![],
            labels: Default::default(),
            allowed_requesters: vec![],
            origin: None,
            revision: 0,
        };
        let policies = self.level.policies();
        let verdict = match r.action.as_str() {
            "announce" => policies.announce(&r.principal_cluster, &entry),
            "carry" => policies.carry(&r.principal_cluster, &r.name),
            "discover" => {
                let d = policies.discover(&entry, &r.principal_cluster, &r.principal_service, true);
                crate::authz::Verdict {
                    allowed: d.policy_permits,
                    policies: d.policies,
                    errors: vec![],
                }
            }
            other => {
                return Err(Status::invalid_argument(format!(
                    "action {other:?}: use announce, discover or carry"
                )));
            }
        };
        Ok(Response::new(api::Decision {
            found: true,
            allowed: verdict.allowed,
            condition: if verdict.allowed {
                api::Condition::Granted
            } else {
                api::Condition::PolicyDenied
            } as i32,
            reason: if verdict.errors.is_empty() {
                if verdict.allowed {
                    format!("permitted by {}", verdict.policies.join(", "))
                } else if verdict.policies.is_empty() {
                    "no policy permits it".into()
                } else {
                    format!("forbidden by {}", verdict.policies.join(", "))
                }
            } else {
                verdict.errors.join("; ")
            },
            policies: verdict.policies,
            policy_permits: verdict.allowed,
            resolver_cluster: self.level.cluster().to_string(),
            ..Default::default()
        }))
    }

    async fn list_routes(
        &self,
        _request: Request<api::ListRoutesRequest>,
    ) -> Result<Response<api::ListRoutesResponse>, Status> {
        let mut routes: Vec<api::Route> = self
            .level
            .owner_routes()
            .into_iter()
            .map(|r| api::Route {
                target_namespace: r.target_namespace,
                target_service: r.target_service,
                caller_cluster: r.caller_cluster,
                caller_service: r.caller_service,
                resolver_cluster: r.resolver_cluster,
                since: timestamp(Some(r.since)),
                role: "owner".into(),
                applied_objects: r.applied,
            })
            .collect();
        routes.extend(self.level.resolver_grants().into_iter().map(
            |(key, cluster, service, since)| api::Route {
                target_namespace: key.namespace.into(),
                target_service: key.name.into(),
                caller_cluster: cluster,
                caller_service: service,
                resolver_cluster: self.level.cluster().to_string(),
                since: timestamp(Some(since)),
                role: "resolver".into(),
                applied_objects: vec![],
            },
        ));
        Ok(Response::new(api::ListRoutesResponse { routes }))
    }

    async fn get_tree(
        &self,
        _request: Request<api::GetTreeRequest>,
    ) -> Result<Response<api::Tree>, Status> {
        let parent_state = self
            .level
            .parent()
            .and_then(|p| {
                self.peers
                    .list()
                    .into_iter()
                    .find(|s| s.kind == PeerKind::RemoteRegistry && s.name == *p)
            })
            .map(|s| format!("{:?}", s.state()).to_uppercase())
            .unwrap_or_default();
        let children = self
            .level
            .children()
            .into_iter()
            .map(|(cluster, subtree, address, since, queued)| {
                let announced = self.announced_by(&cluster);
                api::Child {
                    cluster,
                    subtree,
                    address,
                    connected_since: timestamp(Some(since)),
                    announced_services: announced,
                    queued_routes: queued as u64,
                }
            })
            .collect();
        let imports = self
            .level
            .subscriptions()
            .into_iter()
            .map(|(target, service, answer)| import_status(&target, service, answer.as_ref()))
            .collect();
        Ok(Response::new(api::Tree {
            cluster: self.level.cluster().to_string(),
            parent: self.level.parent().unwrap_or_default(),
            parent_state,
            children,
            subtree: self.level.subtree(),
            imports,
            rejections: self
                .level
                .rejections()
                .iter()
                .map(|(_, r)| rejection_line(r))
                .collect(),
            refused: self
                .level
                .rejections()
                .into_iter()
                .map(|(at, r)| refused_entry(at, r))
                .collect(),
            overflows: self.level.overflows().get(),
            held_names: Some({
                let held = self.level.held_names();
                api::HeldNames {
                    names: held.names,
                    oldest_since: timestamp(held.oldest_since),
                    oldest_expires: timestamp(held.oldest_expires),
                    hold_seconds: held.hold.as_secs(),
                }
            }),
        }))
    }

    async fn watch(
        &self,
        request: Request<api::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let snapshot = request.into_inner().snapshot;
        let mut events = self.catalog.subscribe();
        // Bounded in events and in bytes: a watcher that stops reading holds up the task (the
        // catalog's feed then lags, and it gets a Resync when it reads again), never memory.
        let (tx, rx) = mpsc::channel::<(Result<api::CatalogEvent, Status>, Charge)>(256);
        let budget = ByteBudget::new(WATCH_QUEUE_BYTES);
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
                    if !send_charged(&tx, &budget, ev).await {
                        return;
                    }
                }
                let done = api::CatalogEvent {
                    kind: api::catalog_event::Kind::SnapshotComplete as i32,
                    revision: catalog.revision(),
                    service: None,
                };
                if !send_charged(&tx, &budget, done).await {
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
                if !send_charged(&tx, &budget, msg).await {
                    return;
                }
            }
        });
        let events = ReceiverStream::new(rx).map(|(ev, _charge)| ev);
        Ok(Response::new(Box::pin(events)))
    }
}

/// Encoded bytes of catalog events queued for one `Watch` stream: a few of the largest
/// services, or thousands of ordinary ones.
const WATCH_QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// Queue `ev` for a watcher once its bytes fit [`WATCH_QUEUE_BYTES`]; false once the watcher
/// is gone.
async fn send_charged(
    tx: &mpsc::Sender<(Result<api::CatalogEvent, Status>, Charge)>,
    budget: &ByteBudget,
    ev: api::CatalogEvent,
) -> bool {
    let charge = tokio::select! {
        c = budget.charge(prost::Message::encoded_len(&ev)) => c,
        _ = tx.closed() => return false,
    };
    tx.send((Ok(ev), charge)).await.is_ok()
}
