//! Queries: resolving here or forwarding up, routing answers and route notifications down,
//! and the requester side (cached answers, persistent questions for imports).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tracing::{debug, info, warn};
use xcc_proto::xcc::federation::v1 as fed;

use super::super::convert::{response_for, target_matches};
use super::super::grants::check_route;
use super::super::tree::Direction;
use super::super::types::{ExportedService, WorkloadIdentity};
use super::{Grant, Level, OwnerRoute, Subscription, Target, msg_up};
use crate::catalog::{ServiceEntry, Source};

/// Why the owner refuses a route grant ([`Level::owner_check`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnerCheckError {
    #[error("{namespace}/{service} is not exported by {owner}")]
    NotExported {
        namespace: String,
        service: String,
        owner: String,
    },
    #[error("{key} does not admit {caller_cluster}/{caller_service}")]
    NotAdmitted {
        key: String,
        caller_cluster: String,
        caller_service: String,
    },
}

impl Level {
    // ---------------------------------------------------------------- queries

    pub(super) fn lookup(&self, target: &Target) -> Option<Arc<ServiceEntry>> {
        let candidates = match target {
            Target::Fqdn(f) => self.inner.catalog.by_fqdn(f),
            Target::Name { namespace, name } => self.inner.catalog.by_name(namespace, name),
        };
        candidates
            .into_iter()
            .filter(|e| e.source.in_subtree() && target_matches(target, e))
            .min_by(|a, b| a.key.cmp(&b.key))
    }

    /// A query from a child (or ourselves): resolve here, or forward up.
    pub fn handle_query(&self, q: fed::ServiceQuery) {
        let target = Target::from_query(&q);
        // The identity is hostile input like every field: a malformed one costs this query.
        let identity = match WorkloadIdentity::from_wire(
            &q.requester_trust_domain,
            &q.requester_namespace,
            &q.requester_service_account,
        ) {
            Ok(identity) => identity,
            Err(e) => {
                warn!(requester = %q.requester_cluster, %target, error = %e, "query refused");
                self.route_answer(fed::ServiceQueryResponse {
                    correlation_id: q.correlation_id,
                    requester_cluster: q.requester_cluster.clone(),
                    requester_service: q.requester_service.clone(),
                    resolver_cluster: self.inner.cluster.clone(),
                    error: format!("invalid query: {e}"),
                    ..Default::default()
                });
                return;
            }
        };
        if let Some(entry) = self.lookup(&target) {
            let decision =
                self.gate()
                    .discover(&entry, &q.requester_cluster, &q.requester_service, true);
            let resp = response_for(&q, &entry, &decision, &self.inner.cluster);
            if decision.allowed {
                self.grant(&entry, &q, identity);
            }
            debug!(requester = %q.requester_cluster, %target, allowed = decision.allowed, "resolved");
            self.route_answer(resp);
            return;
        }
        let parent_tx = self.lock().parent_tx.clone();
        match (parent_tx, self.parent()) {
            (Some(tx), _) => self.send_up(
                Some(tx),
                msg_up(fed::child_message::Payload::ServiceQuery(q)),
            ),
            (None, Some(parent)) => self.route_answer(fed::ServiceQueryResponse {
                correlation_id: q.correlation_id,
                requester_cluster: q.requester_cluster.clone(),
                requester_service: q.requester_service.clone(),
                resolver_cluster: self.inner.cluster.clone(),
                unavailable: true,
                error: format!("parent {parent} is unavailable; try again later"),
                ..Default::default()
            }),
            (None, None) => {
                let resp = fed::ServiceQueryResponse {
                    correlation_id: q.correlation_id,
                    requester_cluster: q.requester_cluster.clone(),
                    requester_service: q.requester_service.clone(),
                    resolver_cluster: self.inner.cluster.clone(),
                    error: "service not found in hierarchy".into(),
                    ..Default::default()
                };
                self.remember_unfound(q);
                self.route_answer(resp);
            }
        }
    }

    /// Keep a query answered "not found" at the top, to answer it again when its service
    /// appears ([`Level::answer_unfound`]); within the requester's byte bound.
    fn remember_unfound(&self, q: fed::ServiceQuery) {
        use prost::Message as _;
        let size = q.encoded_len();
        let key = (q.requester_cluster.clone(), q.correlation_id);
        let mut st = self.lock();
        let st = &mut *st;
        if let Some(old) = st.unfound.remove(&key)
            && let Some(b) = st.unfound_bytes.get_mut(&key.0)
        {
            *b = b.saturating_sub(old.encoded_len());
        }
        let used = st.unfound_bytes.entry(key.0.clone()).or_default();
        if *used + size > super::MAX_UNFOUND_BYTES {
            debug!(requester = %key.0, "too many unanswered queries kept; this one waits for the requester's retry");
            return;
        }
        *used += size;
        st.unfound.insert(key, q);
    }

    /// Ask again the queries answered "not found" that `entry` (a service of this subtree) or,
    /// with `None`, anything now in the catalog answers: the requester gets its answer (a first
    /// grant) as soon as the name reaches this level.
    pub(super) fn answer_unfound(&self, entry: Option<&ServiceEntry>) {
        use prost::Message as _;
        let ready: Vec<fed::ServiceQuery> = {
            let mut st = self.lock();
            let st = &mut *st;
            if st.unfound.is_empty() {
                return;
            }
            let keys: Vec<(String, u64)> = st
                .unfound
                .iter()
                .filter(|(_, q)| {
                    let target = Target::from_query(q);
                    match entry {
                        Some(e) => target_matches(&target, e),
                        None => true,
                    }
                })
                .map(|(k, _)| k.clone())
                .collect();
            let mut out = vec![];
            for k in keys {
                if let Some(q) = st.unfound.remove(&k) {
                    if let Some(b) = st.unfound_bytes.get_mut(&k.0) {
                        *b = b.saturating_sub(q.encoded_len());
                        if *b == 0 {
                            st.unfound_bytes.remove(&k.0);
                        }
                    }
                    out.push(q);
                }
            }
            out
        };
        // Resolved afresh: still unknown ones are remembered again.
        for q in ready {
            if entry.is_none() && self.lookup(&Target::from_query(&q)).is_none() {
                self.remember_unfound(q);
                continue;
            }
            self.handle_query(q);
        }
    }

    /// Record the grant of `entry` to the asker of `q` (workload `identity`, from `q`, checked)
    /// and route it to the owner.
    pub(super) fn grant(
        &self,
        entry: &ServiceEntry,
        q: &fed::ServiceQuery,
        identity: Option<WorkloadIdentity>,
    ) {
        let key = (q.requester_cluster.clone(), q.requester_service.clone());
        let new = {
            let mut st = self.lock();
            let grants = st.grants.entry(entry.key.clone()).or_default();
            let new = !grants.contains_key(&key);
            grants.insert(
                key,
                Grant {
                    correlation_id: q.correlation_id,
                    since: SystemTime::now(),
                    identity: identity.clone(),
                },
            );
            new
        };
        // Re-sent on every granted query: delivery is idempotent at the owner, and a re-issued
        // query after a restart is how a lost grant is rebuilt.
        let _ = new;
        let (caller_trust_domain, caller_namespace, caller_service_account) =
            WorkloadIdentity::to_wire(identity.as_ref());
        self.route_notification(fed::RouteNotification {
            target_namespace: entry.key.namespace.to_string(),
            target_service: entry.key.name.to_string(),
            caller_cluster: q.requester_cluster.clone(),
            caller_service: q.requester_service.clone(),
            revoked: false,
            route_id: 0,
            target_cluster: entry.key.cluster.to_string(),
            resolver_cluster: self.inner.cluster.clone(),
            caller_trust_domain,
            caller_namespace,
            caller_service_account,
        });
    }

    /// Deliver a route notification toward its target cluster. Returns true when applied here.
    pub(super) fn route_notification(&self, n: fed::RouteNotification) -> bool {
        let mut st = self.lock();
        match st.tree.direction(&n.target_cluster) {
            Direction::Local => {
                // What is granted is our own export as we hold it, never the wire's idea of it;
                // a revocation needs only the names.
                let exported = match self.owner_check(&n) {
                    Ok(entry) => ExportedService::of(&entry),
                    Err(_) if n.revoked => ExportedService::default(),
                    Err(e) => {
                        drop(st);
                        warn!(error = %e, resolver = %n.resolver_cluster, "refusing a route grant");
                        return false;
                    }
                };
                let caller_identity = match WorkloadIdentity::from_wire(
                    &n.caller_trust_domain,
                    &n.caller_namespace,
                    &n.caller_service_account,
                ) {
                    Ok(id) => id,
                    Err(e) => {
                        drop(st);
                        warn!(caller = %n.caller_cluster, resolver = %n.resolver_cluster, error = %e, "route notification refused");
                        return false;
                    }
                };
                let key = (
                    n.target_namespace.clone(),
                    n.target_service.clone(),
                    n.caller_cluster.clone(),
                    n.caller_service.clone(),
                );
                let route = OwnerRoute {
                    target_namespace: n.target_namespace.clone(),
                    target_service: n.target_service.clone(),
                    caller_cluster: n.caller_cluster.clone(),
                    caller_service: n.caller_service.clone(),
                    caller_identity,
                    exported,
                    resolver_cluster: n.resolver_cluster.clone(),
                    since: SystemTime::now(),
                    applied: vec![],
                };
                // Every name is checked before it reaches a file or an object; whether the
                // grant is for one of our own exports, to a caller it admits, was decided above.
                if let Err(reason) = check_route(&route) {
                    warn!(caller = %n.caller_cluster, resolver = %n.resolver_cluster, %reason, "route notification refused");
                    return false;
                }
                let changed = if n.revoked {
                    st.owner_routes.remove(&key).is_some()
                } else {
                    match st.owner_routes.entry(key.clone()) {
                        std::collections::btree_map::Entry::Vacant(slot) => {
                            slot.insert(route.clone());
                            true
                        }
                        // A new caller identity or a changed export (ports, selector) is
                        // applied again; the grant keeps its first `since`.
                        std::collections::btree_map::Entry::Occupied(mut slot) => {
                            let held = slot.get_mut();
                            let changed = held.caller_identity != route.caller_identity
                                || held.exported != route.exported;
                            if changed {
                                held.caller_identity = route.caller_identity.clone();
                                held.exported = route.exported.clone();
                            }
                            changed
                        }
                    }
                };
                drop(st);
                if changed {
                    // Apply outside the lock: the sink may do I/O.
                    let sink = self.grant_sink();
                    if n.revoked {
                        if let Err(e) = sink.remove(&route) {
                            warn!(error = %e, "cannot remove the objects of a revoked grant");
                        }
                    } else {
                        match sink.apply(&route) {
                            Ok(applied) => {
                                if let Some(r) = self.lock().owner_routes.get_mut(&key) {
                                    r.applied = applied;
                                }
                            }
                            Err(e) => warn!(error = %e, "cannot apply the objects of a grant"),
                        }
                    }
                    info!(service = %format!("{}/{}", n.target_namespace, n.target_service), caller = %format!("{}/{}", n.caller_cluster, n.caller_service), revoked = n.revoked, "route grant recorded");
                    self.bump();
                }
                true
            }
            Direction::Child(child) => {
                let q = st.route_queues.entry(child.clone()).or_default();
                q.next_id += 1;
                let mut n = n;
                n.route_id = q.next_id;
                q.pending.insert(n.route_id, n.clone());
                let link = st.sessions.get(&child).map(|s| s.link.clone());
                drop(st);
                // Kept in the queue until the child acknowledges it, and sent again in every
                // session of the child until then.
                if let Some(link) = link {
                    self.down(&link, fed::parent_message::Payload::RouteNotification(n));
                }
                self.bump();
                false
            }
            Direction::Up => {
                warn!(target = %n.target_cluster, "route notification for a cluster outside this subtree dropped");
                false
            }
        }
    }

    /// Whether this registry, as the owner, accepts a grant: the target must be one of its own
    /// exports and that export's allowed requesters must admit the caller. A level above can
    /// forge a notification; it cannot make the owner open a service it never exported
    /// (`kube-system/coredns`) or to a caller the service itself does not admit. Revocations
    /// are always accepted.
    pub(crate) fn owner_check(
        &self,
        n: &fed::RouteNotification,
    ) -> Result<Arc<ServiceEntry>, OwnerCheckError> {
        let key = crate::catalog::ServiceKey::new(
            &self.inner.cluster,
            &n.target_namespace,
            &n.target_service,
        );
        let Some(entry) = self
            .inner
            .catalog
            .get(&key)
            .filter(|e| e.source == Source::Local)
        else {
            return Err(OwnerCheckError::NotExported {
                namespace: n.target_namespace.clone(),
                service: n.target_service.clone(),
                owner: self.inner.cluster.clone(),
            });
        };
        if !crate::authz::admits(&entry, &n.caller_cluster, &n.caller_service) {
            return Err(OwnerCheckError::NotAdmitted {
                key: key.to_string(),
                caller_cluster: n.caller_cluster.clone(),
                caller_service: n.caller_service.clone(),
            });
        }
        Ok(entry)
    }

    /// Send an answer (or push) toward its requester.
    pub(super) fn route_answer(&self, resp: fed::ServiceQueryResponse) {
        let st = self.lock();
        match st.tree.direction(&resp.requester_cluster) {
            Direction::Local => {
                drop(st);
                self.deliver_local(resp);
            }
            Direction::Child(child) => {
                let link = st.sessions.get(&child).map(|s| s.link.clone());
                drop(st);
                if let Some(link) = link {
                    self.down(
                        &link,
                        fed::parent_message::Payload::ServiceQueryResponse(resp),
                    );
                }
            }
            Direction::Up => {
                debug!(requester = %resp.requester_cluster, "answer for a requester outside this subtree dropped");
            }
        }
    }

    pub(super) fn deliver_local(&self, resp: fed::ServiceQueryResponse) {
        let mut st = self.lock();
        let Some(sub) = st.subs.get_mut(&resp.correlation_id) else {
            return;
        };
        // Answered: a refusal of the question no longer stands.
        let (namespace, name, fqdn) = match &sub.target {
            Target::Name { namespace, name } => (namespace.as_str(), name.as_str(), ""),
            Target::Fqdn(f) => ("", "", f.as_str()),
        };
        let refused = super::refused_key(
            super::QUERY_KIND,
            &self.inner.cluster,
            namespace,
            name,
            fqdn,
        );
        for w in sub.waiters.drain(..) {
            let _ = w.send(resp.clone());
        }
        // Not-found and unavailable answers are never cached as final.
        let keep = resp.found && !resp.revoked;
        let persistent = sub.persistent;
        if keep || persistent {
            sub.answer = Some(resp);
        } else {
            let key = (sub.target.clone(), sub.requester_service.clone());
            st.subs.remove(&resp.correlation_id);
            st.sub_index.remove(&key);
        }
        st.refused.remove(&refused);
        drop(st);
        self.bump();
    }

    /// The wire form of question `id`.
    pub(super) fn query_msg(&self, id: u64, s: &Subscription) -> fed::ServiceQuery {
        let (namespace, name, fqdn) = match &s.target {
            Target::Name { namespace, name } => (namespace.clone(), name.clone(), String::new()),
            Target::Fqdn(f) => (String::new(), String::new(), f.clone()),
        };
        let (requester_trust_domain, requester_namespace, requester_service_account) =
            WorkloadIdentity::to_wire(s.identity.as_ref());
        fed::ServiceQuery {
            namespace,
            name,
            requester_cluster: self.inner.cluster.clone(),
            requester_service: s.requester_service.clone(),
            correlation_id: id,
            fqdn,
            requester_trust_domain,
            requester_namespace,
            requester_service_account,
        }
    }

    /// The identity the question (`target`, `requester_service`) is asked with, if it is held.
    fn held_identity(
        &self,
        target: &Target,
        requester_service: &str,
    ) -> Option<Option<WorkloadIdentity>> {
        let st = self.lock();
        let id = st
            .sub_index
            .get(&(target.clone(), requester_service.to_string()))?;
        st.subs.get(id).map(|s| s.identity.clone())
    }

    /// The cached answer for (`target`, `requester_service`), if one is held.
    pub fn cached(
        &self,
        target: &Target,
        requester_service: &str,
    ) -> Option<fed::ServiceQueryResponse> {
        let st = self.lock();
        let id = st
            .sub_index
            .get(&(target.clone(), requester_service.to_string()))?;
        st.subs
            .get(id)
            .and_then(|s| s.answer.clone())
            .filter(|a| a.found && !a.revoked)
    }

    /// Ask as this cluster: the cache if it holds an answer, else through the hierarchy.
    /// `persistent` keeps the question registered (re-issued after reconnects, updated by pushes).
    pub async fn query(
        &self,
        target: Target,
        requester_service: &str,
        persistent: bool,
        timeout: Duration,
    ) -> fed::ServiceQueryResponse {
        self.query_as(target, requester_service, None, persistent, timeout)
            .await
    }

    /// [`Level::query`] on behalf of the workload `identity` (what a grant admits). A question
    /// already held for (`target`, `requester_service`) is asked again when the identity differs.
    pub async fn query_as(
        &self,
        target: Target,
        requester_service: &str,
        identity: Option<WorkloadIdentity>,
        persistent: bool,
        timeout: Duration,
    ) -> fed::ServiceQueryResponse {
        if let Some(hit) = self
            .cached(&target, requester_service)
            .filter(|_| self.held_identity(&target, requester_service) == Some(identity.clone()))
        {
            return hit;
        }
        let (tx, rx) = oneshot::channel();
        let q = {
            let mut st = self.lock();
            let key = (target.clone(), requester_service.to_string());
            let id = match st.sub_index.get(&key) {
                Some(id) => *id,
                None => {
                    let id = st.next_id;
                    st.next_id += 1;
                    st.sub_index.insert(key, id);
                    id
                }
            };
            let s = st.subs.entry(id).or_insert_with(|| Subscription {
                target: target.clone(),
                requester_service: requester_service.to_string(),
                identity: None,
                answer: None,
                waiters: vec![],
                persistent,
            });
            s.persistent |= persistent;
            s.identity = identity;
            s.waiters.push(tx);
            self.query_msg(id, s)
        };
        let id = q.correlation_id;
        self.handle_query(q);
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => answer,
            _ => {
                let mut st = self.lock();
                if let Some(s) = st.subs.get(&id)
                    && !s.persistent
                {
                    st.subs.remove(&id);
                    st.sub_index
                        .remove(&(target.clone(), requester_service.to_string()));
                }
                fed::ServiceQueryResponse {
                    correlation_id: id,
                    requester_cluster: self.inner.cluster.clone(),
                    requester_service: requester_service.to_string(),
                    unavailable: true,
                    error: format!("no answer within {timeout:?}"),
                    ..Default::default()
                }
            }
        }
    }

    /// Make exactly `imports` the persistent questions: new ones are asked now, dropped ones
    /// are forgotten, and a held one whose workload identity changed is asked again with it.
    pub fn set_imports(&self, imports: &[super::Question]) {
        let mut ask = vec![];
        {
            let mut st = self.lock();
            let wanted: std::collections::HashSet<(Target, String)> = imports
                .iter()
                .map(|q| (q.target.clone(), q.requester_service.clone()))
                .collect();
            let dropped: Vec<u64> = st
                .subs
                .iter()
                .filter(|(_, s)| {
                    s.persistent
                        && !wanted.contains(&(s.target.clone(), s.requester_service.clone()))
                })
                .map(|(id, _)| *id)
                .collect();
            for id in dropped {
                if let Some(s) = st.subs.remove(&id) {
                    st.sub_index.remove(&(s.target, s.requester_service));
                }
            }
            for q in imports {
                let key = (q.target.clone(), q.requester_service.clone());
                if let Some(id) = st.sub_index.get(&key).copied() {
                    if let Some(s) = st.subs.get_mut(&id) {
                        s.persistent = true;
                        if s.identity != q.identity {
                            s.identity = q.identity.clone();
                            ask.push(self.query_msg(id, s));
                        }
                    }
                    continue;
                }
                let id = st.next_id;
                st.next_id += 1;
                st.sub_index.insert(key, id);
                let s = Subscription {
                    target: q.target.clone(),
                    requester_service: q.requester_service.clone(),
                    identity: q.identity.clone(),
                    answer: None,
                    waiters: vec![],
                    persistent: true,
                };
                ask.push(self.query_msg(id, &s));
                st.subs.insert(id, s);
            }
        }
        for q in ask {
            self.handle_query(q);
        }
        self.bump();
    }

    /// Ask again every persistent question without a granted answer (not-found and unavailable
    /// answers are never final; a denial may change with policies).
    pub fn retry_unanswered(&self) {
        let ask: Vec<fed::ServiceQuery> = {
            let st = self.lock();
            st.subs
                .iter()
                .filter(|(_, s)| {
                    s.persistent
                        && s.answer
                            .as_ref()
                            .is_none_or(|a| !(a.found && a.access_allowed) || a.revoked)
                })
                .map(|(id, s)| self.query_msg(*id, s))
                .collect()
        };
        for q in ask {
            self.handle_query(q);
        }
    }

    /// Every persistent question and its latest answer.
    pub fn subscriptions(&self) -> Vec<(Target, String, Option<fed::ServiceQueryResponse>)> {
        let st = self.lock();
        let mut out: Vec<_> = st
            .subs
            .values()
            .filter(|s| s.persistent)
            .map(|s| {
                (
                    s.target.clone(),
                    s.requester_service.clone(),
                    s.answer.clone(),
                )
            })
            .collect();
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }

    /// Evaluate locally (no forwarding, no grant).
    pub fn explain(
        &self,
        target: &Target,
        requester_cluster: &str,
        requester_service: &str,
        requested: bool,
    ) -> Option<(Arc<ServiceEntry>, crate::authz::Decision)> {
        let entry = self.lookup(target)?;
        let d = self
            .gate()
            .discover(&entry, requester_cluster, requester_service, requested);
        Some((entry, d))
    }
}
