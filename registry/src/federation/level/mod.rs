//! One level of the hierarchy: what a registry does with announcements, queries, answers and
//! route notifications, whoever sent them. The I/O around it (child sessions, the parent link)
//! hands messages in and takes messages out; the state lives behind one short-held mutex and no
//! lock is held across an await.
//!
//! * Announcements from a child are checked (the child may only speak for its subtree; Cedar
//!   `announce` limits zones) and stored as `Source::Child` entries, which the parent link
//!   announces further up and the Hamlet server serves.
//! * A query is resolved by the first level whose subtree holds the service, else forwarded up;
//!   the root answers "not found in hierarchy". Answers travel down to the requester's cluster.
//! * The resolving level records each grant, routes a `RouteNotification` to the owner
//!   (queued per child, acknowledged hop by hop) and pushes fresh answers or revocations to
//!   requesters whenever the service changes or the grant stops holding.
//!
//! The level holds no transport: it sends plain messages through [`ChildPort`] and
//! [`ParentPort`], which the sessions implement with their bounded queues
//! (`federation::queues`), and it counts every message that did not fit ([`Level::overflows`]).
//!
//! Modules: `children` (sessions, subtrees, announcements), `names` (one owner per name),
//! `parent` (the way up and what the parent sends), `queries` (questions, answers, grants and
//! route notifications), `resolver` (answers kept fresh), `owners` (the name ledger),
//! `reservations` (names held for owners away), `refusal` and `ports` (the values it hands out).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, watch};
use xcc_proto::xcc::federation::v1 as fed;

use super::tree::Tree;
use super::types::WorkloadIdentity;
use crate::authz::{Gate, Policies};
use crate::budget::QueueLimits;
use crate::catalog::{Catalog, ServiceKey, Source};

mod children;
mod names;
mod owners;
mod parent;
mod ports;
mod queries;
mod refusal;
pub(crate) mod reservations;
mod resolver;

pub use super::types::{OwnerRoute, Question, Target};
pub use crate::authz::PolicyHandle;
pub use children::{ChildError, SessionAnnouncements};
pub use owners::{ConfigMapOwners, FileOwners, HeldNames, LedgerError, OwnerStore};
pub use ports::{ChildPort, Overflow, ParentPort, Resync};
pub use refusal::{ANNOUNCEMENT_KIND, Clash, QUERY_KIND, Refusal, RefusalCode};
use refusal::{RefusedKey, refused_key};

/// A child's session as the level knows it: which session, since when, from where, and the
/// way down to it (the session's queue).
struct Session {
    id: u64,
    link: Arc<dyn ChildPort>,
    since: SystemTime,
    address: String,
}

#[derive(Default)]
struct RouteQueue {
    next_id: u64,
    pending: BTreeMap<u64, fed::RouteNotification>,
}

#[derive(Clone, Debug)]
struct Grant {
    correlation_id: u64,
    since: SystemTime,
    /// The workload identity of the latest granted query (carried to the owner).
    identity: Option<WorkloadIdentity>,
}

struct Subscription {
    target: Target,
    requester_service: String,
    /// The asking workload's identity, sent with every (re-)issue of the question.
    identity: Option<WorkloadIdentity>,
    answer: Option<fed::ServiceQueryResponse>,
    waiters: Vec<oneshot::Sender<fed::ServiceQueryResponse>>,
    /// Kept and re-issued after reconnects (imports); one-off admin queries are not.
    persistent: bool,
}

#[derive(Default)]
struct State {
    tree: Tree,
    sessions: BTreeMap<String, Session>,
    route_queues: BTreeMap<String, RouteQueue>,
    grants: BTreeMap<ServiceKey, BTreeMap<(String, String), Grant>>,
    owner_routes: BTreeMap<(String, String, String, String), OwnerRoute>,
    parent_tx: Option<Arc<dyn ParentPort>>,
    subs: HashMap<u64, Subscription>,
    sub_index: HashMap<(Target, String), u64>,
    next_id: u64,
    /// Names (FQDN, and `namespace/name`) of services that went away with their child (it
    /// disconnected, or a cluster left its subtree), held for their owner until it is back and
    /// has resent its snapshot, so nobody takes them meanwhile. Present services hold their
    /// names through the catalog itself: nothing per service is kept here while all is well.
    /// Held names expire after the configured hold (`Level::set_name_hold`).
    reserved: reservations::Reservations,
    /// Clash notices for owners that are away, by owner cluster (see `owners`).
    held_clashes: BTreeMap<String, Vec<fed::NameClash>>,
    /// Refused claims seen here (as the refusing level or as the notified owner), newest last.
    clashes: VecDeque<Clash>,
    /// Entries our parent refused, by entry (kind, cluster, namespace, name; the latest
    /// refusal of each). A refusal stands until its entry changes or the parent, having
    /// applied the snapshot of a later session, did not refuse it again.
    refused: BTreeMap<RefusedKey, (SystemTime, fed::Rejection)>,
    /// Refusals from before the current parent session not yet repeated in it: dropped when
    /// the parent confirms it applied the session's snapshot.
    refused_before: BTreeSet<RefusedKey>,
    /// The parent confirmed it applied a snapshot of the current session: `refused` is what it
    /// decided about everything we announced.
    refusals_confirmed: bool,
    /// Children with an entry refused by a policy in their current session: a policy change
    /// asks them to send their snapshot again, so it is decided anew.
    policy_refused: BTreeSet<String>,
    /// What each child declared (before the carry check), decided again when policies change.
    claimed: BTreeMap<String, fed::SubtreeMembership>,
    /// Queries answered "not found" here (the top), by requester cluster and correlation id:
    /// asked again when a service they name appears, so a first grant does not wait for the
    /// requester's retry. Bounded per requester by [`MAX_UNFOUND_BYTES`].
    unfound: BTreeMap<(String, u64), fed::ServiceQuery>,
    /// Encoded bytes of each requester's `unfound` queries.
    unfound_bytes: HashMap<String, usize>,
}

/// How many bytes of not-found queries are kept per requester cluster; past that a query is
/// answered "not found" and left to the requester's retry.
pub(super) const MAX_UNFOUND_BYTES: usize = 64 * 1024;

/// A level of the hierarchy; clones share it.
#[derive(Clone)]
pub struct Level {
    inner: Arc<Inner>,
}

struct Inner {
    cluster: String,
    parent: RwLock<Option<String>>,
    /// The trust domain of this cluster's own workloads (an import's identity without one).
    trust_domain: RwLock<String>,
    catalog: Catalog,
    gate: Gate,
    state: Mutex<State>,
    /// Bumped on every change an observer may wait for (tree, routes, answers).
    changes: watch::Sender<u64>,
    /// Applies the owner's side of a grant.
    grant_sink: RwLock<Arc<dyn super::grants::GrantSink>>,
    /// One shared copy of each child's name: every entry a child announces names it as its
    /// source, and at the root that is most entries (bounded by the authenticated children).
    child_names: Mutex<std::collections::HashMap<String, Arc<str>>>,
    /// Messages that did not fit a queue of the federation path (each reset its stream).
    overflows: Counter,
    /// The budget of each federation queue (per child session, and up to the parent).
    queue_limits: RwLock<QueueLimits>,
    /// Encoded bytes queued on every federation queue of this level.
    queued_bytes: Gauge,
    /// How long a child's queue may stay over half its budget before the child is cut.
    queue_stall: RwLock<std::time::Duration>,
}

/// How long a child's queue may stay over half its byte budget (the session stops reading the
/// child meanwhile) before the child is cut: a minute, long enough for any child that reads.
pub const QUEUE_STALL: std::time::Duration = std::time::Duration::from_secs(60);

impl Level {
    pub fn new(
        cluster: impl Into<String>,
        parent: Option<String>,
        catalog: Catalog,
        gate: Gate,
    ) -> Self {
        let cluster = cluster.into();
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    tree: Tree::new(cluster.clone()),
                    next_id: 1,
                    ..Default::default()
                }),
                cluster,
                parent: RwLock::new(parent),
                trust_domain: RwLock::new(super::grants::DEFAULT_TRUST_DOMAIN.into()),
                catalog,
                gate,
                changes: watch::Sender::new(0),
                grant_sink: RwLock::new(Arc::new(super::grants::NoGrants)),
                child_names: Mutex::default(),
                overflows: Counter::default(),
                queue_limits: RwLock::new(QueueLimits::FEDERATION),
                queued_bytes: Gauge::default(),
                queue_stall: RwLock::new(QUEUE_STALL),
            }),
        }
    }

    /// Set what applies grants at this registry as an owner.
    pub fn set_grant_sink(&self, sink: Arc<dyn super::grants::GrantSink>) {
        *xcc_controller::plumbing::write(&self.inner.grant_sink) = sink;
    }

    fn grant_sink(&self) -> Arc<dyn super::grants::GrantSink> {
        xcc_controller::plumbing::read(&self.inner.grant_sink).clone()
    }

    pub fn cluster(&self) -> &str {
        &self.inner.cluster
    }

    /// Name of the configured parent link (a RemoteRegistry with role Parent), if any.
    pub fn parent(&self) -> Option<String> {
        xcc_controller::plumbing::read(&self.inner.parent).clone()
    }

    pub fn set_parent(&self, parent: Option<String>) {
        *xcc_controller::plumbing::write(&self.inner.parent) = parent;
        self.bump();
    }

    /// The trust domain of this cluster's workloads, as the grant settings assign it
    /// (`--grant-trust-domain` for this cluster; [`super::grants::DEFAULT_TRUST_DOMAIN`] unless
    /// set): what an import's workload identity names when it gives none.
    pub fn trust_domain(&self) -> String {
        xcc_controller::plumbing::read(&self.inner.trust_domain).clone()
    }

    pub fn set_trust_domain(&self, trust_domain: String) {
        *xcc_controller::plumbing::write(&self.inner.trust_domain) = trust_domain;
    }

    pub fn catalog(&self) -> &Catalog {
        &self.inner.catalog
    }

    pub fn policies(&self) -> Arc<Policies> {
        self.inner.gate.policies()
    }

    /// The decision point this level (and every listener of its registry) asks.
    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        xcc_controller::plumbing::lock(&self.inner.state)
    }

    /// The catalog source of entries announced by `child`, sharing one copy of its name.
    fn child_source(&self, child: &str) -> Source {
        let mut names = xcc_controller::plumbing::lock(&self.inner.child_names);
        let name = names
            .entry(child.to_string())
            .or_insert_with(|| Arc::from(child))
            .clone();
        Source::Child(name)
    }

    /// Messages of the federation path that did not fit a queue (each one reset its stream:
    /// nothing is dropped on its own), and parent refusals past what is kept. Expected to stay 0.
    pub fn overflows(&self) -> Counter {
        self.inner.overflows.clone()
    }

    /// Bound every federation queue opened from now on (a child session, the way up) by
    /// `limits`.
    pub fn set_queue_limits(&self, limits: QueueLimits) {
        *xcc_controller::plumbing::write(&self.inner.queue_limits) = limits;
    }

    /// How long a child's queue may stay over half its budget before the child is cut.
    pub fn set_queue_stall(&self, stall: std::time::Duration) {
        *xcc_controller::plumbing::write(&self.inner.queue_stall) = stall;
    }

    pub fn queue_stall(&self) -> std::time::Duration {
        *xcc_controller::plumbing::read(&self.inner.queue_stall)
    }

    pub fn queue_limits(&self) -> QueueLimits {
        *xcc_controller::plumbing::read(&self.inner.queue_limits)
    }

    /// Encoded bytes queued on this level's federation queues (every child session and the way
    /// up); back to 0 once the peers are gone.
    pub fn queued_bytes(&self) -> Gauge {
        self.inner.queued_bytes.clone()
    }

    /// Queue `p` for a child; what did not fit ended its session and is counted.
    fn down(&self, link: &Arc<dyn ChildPort>, p: fed::parent_message::Payload) {
        if link.send(p).is_err() {
            self.inner.overflows.inc();
        }
    }

    /// Queue `msg` for the parent, if a session is up; what did not fit reset the session and
    /// is counted.
    fn send_up(&self, up: Option<Arc<dyn ParentPort>>, msg: fed::ChildMessage) {
        if up.is_some_and(|up| up.send(msg).is_err()) {
            self.inner.overflows.inc();
        }
    }

    fn bump(&self) {
        self.inner.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A receiver that changes whenever the tree, routes or answers change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    // ---------------------------------------------------------------- views

    pub fn owner_routes(&self) -> Vec<OwnerRoute> {
        self.lock().owner_routes.values().cloned().collect()
    }

    /// Grants recorded here as the resolver: (service, requester cluster, requester service, since).
    pub fn resolver_grants(&self) -> Vec<(ServiceKey, String, String, SystemTime)> {
        let st = self.lock();
        st.grants
            .iter()
            .flat_map(|(k, g)| {
                g.iter()
                    .map(move |((c, s), grant)| (k.clone(), c.clone(), s.clone(), grant.since))
            })
            .collect()
    }

    /// (child, subtree, address, connected since, queued routes).
    pub fn children(&self) -> Vec<(String, Vec<String>, String, SystemTime, usize)> {
        let st = self.lock();
        st.sessions
            .iter()
            .map(|(c, s)| {
                (
                    c.clone(),
                    st.tree
                        .children()
                        .get(c)
                        .map(|set| set.iter().cloned().collect())
                        .unwrap_or_default(),
                    s.address.clone(),
                    s.since,
                    st.route_queues.get(c).map_or(0, |q| q.pending.len()),
                )
            })
            .collect()
    }

    pub fn subtree(&self) -> Vec<String> {
        self.lock().tree.subtree().into_iter().collect()
    }

    pub fn ancestors(&self) -> Vec<String> {
        self.lock().tree.ancestors().to_vec()
    }
}

fn msg_up(p: fed::child_message::Payload) -> fed::ChildMessage {
    fed::ChildMessage { payload: Some(p) }
}

#[cfg(test)]
mod tests;
