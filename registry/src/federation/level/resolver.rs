//! The resolver's pushes: when a granted service changes, re-evaluate every grant on it and
//! push fresh answers, revocations and route notifications.

use tracing::info;
use xcc_proto::xcc::federation::v1 as fed;

use super::super::convert::response_for;
use super::super::types::WorkloadIdentity;
use super::{Grant, Level};
use crate::catalog::CatalogEvent;

impl Level {
    /// The change feed was lost: re-evaluate every grant against the current catalog.
    pub fn recheck_grants(&self) {
        self.answer_unfound(None);
        let keys: Vec<crate::catalog::ServiceKey> = self.lock().grants.keys().cloned().collect();
        for key in keys {
            let ev = match self.inner.catalog.get(&key) {
                Some(e) if e.source.in_subtree() => CatalogEvent::Upsert(e),
                _ => CatalogEvent::Delete(std::sync::Arc::new(crate::catalog::ServiceEntry {
                    key: key.clone(),
                    source: crate::catalog::Source::Local,
                    fqdn: Default::default(),
                    endpoints: vec![],
                    ports: vec![],
                    labels: Default::default(),
                    allowed_requesters: vec![],
                    origin: None,
                    revision: 0,
                })),
            };
            self.on_catalog_event(&ev);
        }
    }

    // ---------------------------------------------------------------- resolver pushes

    /// Re-evaluate the grants on a changed service and push fresh answers or revocations.
    /// Queries answered "not found" that the service answers now are asked again (after the
    /// grants it had, so a new grant is not pushed twice).
    pub fn on_catalog_event(&self, ev: &CatalogEvent) {
        if !ev.entry().source.in_subtree() {
            return;
        }
        self.push_grants(ev);
        if let CatalogEvent::Upsert(e) = ev {
            self.answer_unfound(Some(e));
        }
    }

    fn push_grants(&self, ev: &CatalogEvent) {
        let key = ev.entry().key.clone();
        let grants: Vec<((String, String), Grant)> = {
            let st = self.lock();
            match st.grants.get(&key) {
                Some(g) => g.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                None => return,
            }
        };
        let current = match ev {
            CatalogEvent::Upsert(e) if e.source.in_subtree() => Some(e.clone()),
            _ => None,
        };
        for ((cluster, service), grant) in grants {
            let (caller_trust_domain, caller_namespace, caller_service_account) =
                WorkloadIdentity::to_wire(grant.identity.as_ref());
            let q = fed::ServiceQuery {
                namespace: key.namespace.to_string(),
                name: key.name.to_string(),
                requester_cluster: cluster.clone(),
                requester_service: service.clone(),
                correlation_id: grant.correlation_id,
                ..Default::default()
            };
            let (resp, still, gone) = match &current {
                Some(e) => {
                    let d = self.gate().discover(e, &cluster, &service, true);
                    let mut r = response_for(&q, e, &d, &self.inner.cluster);
                    r.revoked = !d.allowed;
                    (r, d.allowed, false)
                }
                None => (
                    fed::ServiceQueryResponse {
                        found: false,
                        revoked: true,
                        owner_cluster: key.cluster.to_string(),
                        namespace: key.namespace.to_string(),
                        name: key.name.to_string(),
                        fqdn: ev.entry().fqdn.to_string(),
                        correlation_id: grant.correlation_id,
                        requester_cluster: cluster.clone(),
                        requester_service: service.clone(),
                        resolver_cluster: self.inner.cluster.clone(),
                        error: "service deleted".into(),
                        ..Default::default()
                    },
                    false,
                    true,
                ),
            };
            if still {
                // (Re-)granted: make sure the owner has the route (idempotent there).
                self.route_notification(fed::RouteNotification {
                    target_namespace: key.namespace.to_string(),
                    target_service: key.name.to_string(),
                    caller_cluster: cluster.clone(),
                    caller_service: service.clone(),
                    revoked: false,
                    route_id: 0,
                    target_cluster: key.cluster.to_string(),
                    resolver_cluster: self.inner.cluster.clone(),
                    caller_trust_domain,
                    caller_namespace,
                    caller_service_account,
                });
            } else {
                if !gone {
                    // Denied now: the grant is over. A service that merely went away keeps its
                    // grants dormant, so its return restores the answer at once.
                    let mut st = self.lock();
                    if let Some(g) = st.grants.get_mut(&key) {
                        g.remove(&(cluster.clone(), service.clone()));
                        if g.is_empty() {
                            st.grants.remove(&key);
                        }
                    }
                }
                info!(service = %key, requester = %format!("{cluster}/{service}"), gone, "grant revoked");
                self.route_notification(fed::RouteNotification {
                    target_namespace: key.namespace.to_string(),
                    target_service: key.name.to_string(),
                    caller_cluster: cluster.clone(),
                    caller_service: service.clone(),
                    revoked: true,
                    route_id: 0,
                    target_cluster: key.cluster.to_string(),
                    resolver_cluster: self.inner.cluster.clone(),
                    caller_trust_domain,
                    caller_namespace,
                    caller_service_account,
                });
            }
            self.route_answer(resp);
        }
    }
}
