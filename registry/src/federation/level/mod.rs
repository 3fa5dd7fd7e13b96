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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;

use futures::{Stream, StreamExt as _};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use xcc_proto::xcc::federation::v1 as fed;

use super::convert::{announcement, entry_from_announcement};
pub use super::types::{OwnerRoute, Question, Target};
use super::types::WorkloadIdentity;
use super::tree::{Direction, Tree};

mod owners;
mod queries;
pub(crate) mod reservations;
mod resolver;
use crate::authz::{Gate, Policies};
use crate::budget::{Full, QueueLimits, QueueRx, QueueTx, queue};
use crate::catalog::{Catalog, CatalogEvent, ServiceEntry, ServiceKey, Source};
pub use owners::{ConfigMapOwners, FileOwners, HeldNames, LedgerError, OwnerStore};

pub use crate::authz::PolicyHandle;

/// What flows down a child's stream: messages, or the status that closes it.
pub type Down = Result<fed::ParentMessage, tonic::Status>;

struct Session {
    id: u64,
    link: DownLink,
    since: SystemTime,
    address: String,
}

/// The queued messages of one child's session (see [`DownLink`]).
pub type DownQueue = QueueRx<Down>;

/// The way down to one child's session: a queue bounded in messages and in encoded bytes
/// ([`QueueLimits`]), and the switch that ends the stream with a status. A message that does
/// not fit is never dropped on its own: the stream ends with `Unavailable` naming the budget,
/// the child reconnects at once and everything is sent again (its snapshot up, its questions,
/// the pending route notifications down), and the overflow is counted ([`Level::overflows`]).
/// What was queued is freed with the stream (the bytes return to the budget and the
/// process-wide gauge, [`Level::queued_bytes`]).
#[derive(Clone)]
pub struct DownLink {
    tx: QueueTx<Down>,
    end: CancellationToken,
    why: Arc<OnceLock<tonic::Status>>,
    /// The queued messages once [`DownLink::stream`] took them: [`DownLink::close`] drops them
    /// at once, not when the transport next polls the stream (a child that stopped reading
    /// never lets it).
    queued: Arc<Mutex<Option<DownQueue>>>,
}

impl DownLink {
    /// A link bounded by `limits`, and the receiving end for [`DownLink::stream`].
    pub fn new(limits: QueueLimits) -> (Self, DownQueue) {
        Self::with_gauge(limits, None)
    }

    /// Like [`DownLink::new`], also counting the queued bytes on `gauge`.
    pub fn with_gauge(limits: QueueLimits, gauge: Option<Gauge>) -> (Self, DownQueue) {
        let (tx, rx) = queue(limits, gauge);
        let link = Self {
            tx,
            end: CancellationToken::new(),
            why: Arc::default(),
            queued: Arc::default(),
        };
        (link, rx)
    }

    /// Encoded bytes queued and not yet handed to the transport.
    pub fn queued_bytes(&self) -> usize {
        self.tx.queued_bytes()
    }

    /// Resolves once less than half the link's byte budget is queued.
    pub async fn half_empty(&self) {
        self.tx.half_empty().await
    }

    pub fn limits(&self) -> QueueLimits {
        self.tx.limits()
    }

    /// The status the link was closed with, if it was.
    pub fn why(&self) -> Option<tonic::Status> {
        self.why.get().cloned()
    }

    /// End the stream with `status` (the first reason wins); what is still queued is
    /// discarded, the child resynchronises when it reconnects.
    pub fn close(&self, status: tonic::Status) {
        let _ = self.why.set(status);
        self.end.cancel();
        drop(self.queued.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    /// Resolves once the link was closed or its stream dropped (the child went away).
    pub async fn closed(&self) {
        tokio::select! {
            _ = self.end.cancelled() => {}
            _ = self.tx.closed() => {}
        }
    }

    /// The response stream: the queued messages until the link closes, then the status it
    /// closed with (none when every sender is gone).
    pub fn stream(&self, rx: DownQueue) -> impl Stream<Item = Down> + Send + 'static {
        let why = self.why.clone();
        let slot = self.queued.clone();
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(rx);
        if self.end.is_cancelled() {
            // Closed before the stream began: nothing of it is sent.
            drop(slot.lock().unwrap_or_else(|p| p.into_inner()).take());
        }
        let slot = SlotGuard(slot);
        futures::stream::poll_fn(move |cx| {
            match slot.0.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                Some(rx) => rx.poll_recv(cx),
                None => std::task::Poll::Ready(None),
            }
        })
        .take_until(self.end.clone().cancelled_owned())
        .chain(
            futures::stream::once(async move { why.get().cloned() })
                .filter_map(|status| async move { status.map(Err) }),
        )
    }

    /// Queue `p`; on a full queue the stream is reset (never a silent drop).
    fn send(&self, p: fed::parent_message::Payload, overflows: &Counter) {
        // A closing session takes nothing more: the child gets it all again when it is back.
        if self.end.is_cancelled() {
            return;
        }
        let msg = fed::ParentMessage { payload: Some(p) };
        let size = prost::Message::encoded_len(&msg);
        match self.tx.try_send(Ok(msg), size) {
            Ok(()) | Err(Full::Closed) => {}
            Err(full) => {
                overflows.inc();
                let limits = self.tx.limits();
                warn!(budget = %limits, %full, "a child's session is not keeping up; ending it so the child resynchronises");
                self.close(over_budget_status(
                    "the parent's queue to this child",
                    limits,
                    full,
                ));
            }
        }
    }
}

/// Held by a child's response stream: when the transport drops the stream (the child went
/// away), the queue goes with it, so its bytes return and [`DownLink::closed`] resolves.
struct SlotGuard(Arc<Mutex<Option<DownQueue>>>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        drop(self.0.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// The status that cuts a child whose queue stayed over half its budget for `stall`.
pub fn stalled_status(limits: QueueLimits, stall: std::time::Duration) -> tonic::Status {
    tonic::Status::unavailable(format!(
        "the parent's queue to this child stayed over half its budget of {} messages and {} \
         bytes (--federation-queue-messages, --federation-queue-bytes) for {} s \
         (--federation-queue-stall-seconds): the child is not reading; reconnect and \
         resynchronise",
        limits.messages,
        limits.bytes,
        stall.as_secs_f64()
    ))
}

/// The status that cuts a peer whose queue exceeded its budget: names the budget, the flags
/// that set it and what did not fit. `Unavailable`, so a child resynchronises at once.
pub fn over_budget_status(queue: &str, limits: QueueLimits, full: Full) -> tonic::Status {
    tonic::Status::unavailable(format!(
        "{queue} exceeded its budget of {} messages and {} bytes \
         (--federation-queue-messages, --federation-queue-bytes): {full}; \
         reconnect and resynchronise",
        limits.messages, limits.bytes
    ))
}

/// The way up to the parent for what is not a catalog change (subtree membership, queries,
/// route acknowledgements), read by the parent link's stream ([`super::upward::Upward`]).
/// Announcements do not pass here: the stream reads them from the catalog. A message that does
/// not fit resets the parent session (the link reconnects at once) and is counted.
#[derive(Clone)]
pub struct Uplink {
    tx: QueueTx<fed::ChildMessage>,
    reset: CancellationToken,
    why: Arc<OnceLock<String>>,
}

/// The queued control messages of one parent session (see [`Uplink`]).
pub type UpQueue = QueueRx<fed::ChildMessage>;

impl Uplink {
    /// A way up bounded by `limits` (messages and encoded bytes).
    pub fn new(limits: QueueLimits) -> (Self, UpQueue) {
        Self::with_gauge(limits, None)
    }

    /// Like [`Uplink::new`], also counting the queued bytes on `gauge`.
    pub fn with_gauge(limits: QueueLimits, gauge: Option<Gauge>) -> (Self, UpQueue) {
        let (tx, rx) = queue(limits, gauge);
        let link = Self {
            tx,
            reset: CancellationToken::new(),
            why: Arc::default(),
        };
        (link, rx)
    }

    /// Why the session was reset, once it was.
    pub fn why(&self) -> Option<String> {
        self.why.get().cloned()
    }

    /// Encoded bytes queued and not yet handed to the transport.
    pub fn queued_bytes(&self) -> usize {
        self.tx.queued_bytes()
    }

    /// Cancelled when a message did not fit: the session must end and start again.
    pub fn reset(&self) -> &CancellationToken {
        &self.reset
    }
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
    parent_tx: Option<Uplink>,
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

/// How many refused claims are remembered for the admin API (the log has every one; this is
/// the recent window an operator looks at).
const KEEP_REPORTS: usize = 256;

/// Most refused entries kept from the parent: more than any subtree sends in practice, and a
/// bound on what a parent can make us store. Past it a refusal is logged (and counted) only.
const KEEP_REFUSED: usize = 65_536;

/// A refused entry: kind, cluster, namespace and name (a question by FQDN: its FQDN as name).
type RefusedKey = (String, String, String, String);

/// [`fed::Rejection::kind`] of a refused question.
pub const QUERY_KIND: &str = "query";
/// [`fed::Rejection::kind`] of a refused announcement.
pub const ANNOUNCEMENT_KIND: &str = "announcement";

fn refused_key(kind: &str, cluster: &str, namespace: &str, name: &str, fqdn: &str) -> RefusedKey {
    let name = match kind == QUERY_KIND && namespace.is_empty() && name.is_empty() {
        true => fqdn,
        false => name,
    };
    (
        kind.to_string(),
        cluster.to_string(),
        namespace.to_string(),
        name.to_string(),
    )
}

/// A refused claim on a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clash {
    pub at: SystemTime,
    pub fqdn: String,
    pub owner: ServiceKey,
    pub claimant: ServiceKey,
    pub refused_by: String,
}

impl std::fmt::Display for Clash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        write!(
            f,
            "{at} {} claimed {} owned by {}; refused by {}",
            self.claimant, self.fqdn, self.owner, self.refused_by
        )
    }
}

/// Why one entry of a child's stream was refused; sent back to the child as a
/// [`fed::Rejection`] while the stream goes on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {reason}")]
pub struct Refusal {
    pub code: tonic::Code,
    pub reason: String,
    /// The check that failed (see [`fed::Rejection::check`]).
    pub check: &'static str,
    /// The Cedar policies that decided it, if a policy did.
    pub policies: Vec<String>,
}

impl Refusal {
    pub fn new(check: &'static str, code: tonic::Code, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            check,
            policies: vec![],
        }
    }

    pub fn with_policies(self, policies: Vec<String>) -> Self {
        Self { policies, ..self }
    }

    /// The wire form for an entry about `cluster` (and service `namespace/name`, `fqdn`).
    pub fn to_rejection(
        &self,
        kind: &str,
        cluster: &str,
        namespace: &str,
        name: &str,
        fqdn: &str,
        refused_by: &str,
    ) -> fed::Rejection {
        fed::Rejection {
            kind: kind.to_string(),
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            fqdn: fqdn.to_string(),
            code: self.code as i32,
            reason: self.reason.clone(),
            refused_by: refused_by.to_string(),
            check: self.check.to_string(),
            policy_ids: self.policies.clone(),
        }
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, item: T) {
    if q.len() >= KEEP_REPORTS {
        q.pop_front();
    }
    q.push_back(item);
}

/// What one session of a child announced, for the sweep at its end-of-snapshot marker, without
/// a copy of every announced key: every entry the session stores gets a catalog revision above
/// `since` (the catalog's revision when the session attached), so only the keys of entries that
/// were already stored before the session and that it announced again are kept here (normally
/// none: a child's entries are dropped when its previous session ends).
#[derive(Debug)]
pub struct SessionAnnouncements {
    since: u64,
    older: BTreeSet<ServiceKey>,
}

impl SessionAnnouncements {
    /// Record `ann`, after [`Level::child_announcement`] accepted it from `child`.
    pub fn note(&mut self, level: &Level, child: &str, ann: &fed::ServiceAnnouncement) {
        let key = ServiceKey::new(&ann.cluster, &ann.namespace, &ann.name);
        if ann.deleted {
            self.older.remove(&key);
            return;
        }
        if let Some(e) = level.inner.catalog.get(&key)
            && e.revision <= self.since
            && matches!(&e.source, Source::Child(c) if &**c == child)
        {
            self.older.insert(key);
        }
    }

    /// Whether the session announced `e` (an entry of its child's source).
    fn covers(&self, e: &ServiceEntry) -> bool {
        e.revision > self.since || self.older.contains(&e.key)
    }
}

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

/// Why a child's stream is being closed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChildError {
    #[error("{0}")]
    Tree(#[from] super::tree::TreeError),
    #[error("the first message must be the child's subtree membership")]
    NoMembership,
    #[error("a session for {0} is already open")]
    Duplicate(String),
}

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
        *self
            .inner
            .grant_sink
            .write()
            .unwrap_or_else(|p| p.into_inner()) = sink;
    }

    fn grant_sink(&self) -> Arc<dyn super::grants::GrantSink> {
        self.inner
            .grant_sink
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn cluster(&self) -> &str {
        &self.inner.cluster
    }

    /// Name of the configured parent link (a RemoteRegistry with role Parent), if any.
    pub fn parent(&self) -> Option<String> {
        self.inner
            .parent
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_parent(&self, parent: Option<String>) {
        *self.inner.parent.write().unwrap_or_else(|p| p.into_inner()) = parent;
        self.bump();
    }

    /// The trust domain of this cluster's workloads, as the grant settings assign it
    /// (`--grant-trust-domain` for this cluster; [`super::grants::DEFAULT_TRUST_DOMAIN`] unless
    /// set): what an import's workload identity names when it gives none.
    pub fn trust_domain(&self) -> String {
        self.inner
            .trust_domain
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_trust_domain(&self, trust_domain: String) {
        *self
            .inner
            .trust_domain
            .write()
            .unwrap_or_else(|p| p.into_inner()) = trust_domain;
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
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The catalog source of entries announced by `child`, sharing one copy of its name.
    fn child_source(&self, child: &str) -> Source {
        let mut names = self
            .inner
            .child_names
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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
        *self
            .inner
            .queue_limits
            .write()
            .unwrap_or_else(|p| p.into_inner()) = limits;
    }

    /// How long a child's queue may stay over half its budget before the child is cut.
    pub fn set_queue_stall(&self, stall: std::time::Duration) {
        *self
            .inner
            .queue_stall
            .write()
            .unwrap_or_else(|p| p.into_inner()) = stall;
    }

    pub fn queue_stall(&self) -> std::time::Duration {
        *self
            .inner
            .queue_stall
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub fn queue_limits(&self) -> QueueLimits {
        *self
            .inner
            .queue_limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Encoded bytes queued on this level's federation queues (every child session and the way
    /// up); back to 0 once the peers are gone.
    pub fn queued_bytes(&self) -> Gauge {
        self.inner.queued_bytes.clone()
    }

    /// A queue for a child's session, bounded by [`Level::queue_limits`].
    pub fn session_channel(&self) -> (DownLink, DownQueue) {
        DownLink::with_gauge(self.queue_limits(), Some(self.queued_bytes()))
    }

    /// A queue up to the parent, bounded by [`Level::queue_limits`].
    pub fn uplink(&self) -> (Uplink, UpQueue) {
        Uplink::with_gauge(self.queue_limits(), Some(self.queued_bytes()))
    }

    fn down(&self, link: &DownLink, p: fed::parent_message::Payload) {
        link.send(p, &self.inner.overflows);
    }

    /// Queue `msg` for the parent, if a session is up; a full queue resets the session.
    fn send_up(&self, up: Option<Uplink>, msg: fed::ChildMessage) {
        let Some(up) = up else { return };
        let size = prost::Message::encoded_len(&msg);
        match up.tx.try_send(msg, size) {
            Ok(()) | Err(Full::Closed) => {}
            Err(full) => {
                self.inner.overflows.inc();
                let limits = up.tx.limits();
                warn!(budget = %limits, %full, "the parent link is not keeping up; resetting it to resynchronise");
                let _ = up.why.set(
                    over_budget_status("the queue up to the parent", limits, full)
                        .message()
                        .to_string(),
                );
                up.reset.cancel();
            }
        }
    }

    fn bump(&self) {
        self.inner.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A receiver that changes whenever the tree, routes or answers change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    // ---------------------------------------------------------------- children

    /// A child opened a session and declared its subtree.
    pub fn attach_child(
        &self,
        child: &str,
        address: String,
        membership: &fed::SubtreeMembership,
        link: DownLink,
    ) -> Result<u64, ChildError> {
        let (clusters, refused) = self.carried(child, membership);
        let mut st = self.lock();
        if st.sessions.contains_key(child) {
            return Err(ChildError::Duplicate(child.to_string()));
        }
        st.tree.set_child_subtree(child, clusters)?;
        st.claimed.insert(child.to_string(), membership.clone());
        st.policy_refused.remove(child);
        let id = st.next_id;
        st.next_id += 1;
        let mut path = st.tree.ancestors().to_vec();
        path.push(self.inner.cluster.clone());
        self.down(
            &link,
            fed::parent_message::Payload::Ancestry(fed::Ancestry { path }),
        );
        for r in refused {
            self.down(&link, fed::parent_message::Payload::Rejection(r));
        }
        // Deliver what was queued for this child while it was away (or sent in a session that
        // ended before the child acknowledged it).
        if let Some(q) = st.route_queues.get(child) {
            for n in q.pending.values() {
                self.down(
                    &link,
                    fed::parent_message::Payload::RouteNotification(n.clone()),
                );
            }
        }
        st.sessions.insert(
            child.to_string(),
            Session {
                id,
                link,
                since: SystemTime::now(),
                address,
            },
        );
        let membership = self.membership_locked(&st);
        let parent_tx = st.parent_tx.clone();
        drop(st);
        self.deliver_held_clashes(child);
        info!(child, "child attached");
        self.send_up(parent_tx, membership);
        self.bump();
        Ok(id)
    }

    /// A child's session ended: its subtree is dropped until it comes back.
    pub fn detach_child(&self, child: &str, session: u64) {
        let mut st = self.lock();
        if st.sessions.get(child).is_none_or(|s| s.id != session) {
            return;
        }
        st.sessions.remove(child);
        st.tree.remove_child(child);
        st.claimed.remove(child);
        st.policy_refused.remove(child);
        let membership = self.membership_locked(&st);
        let parent_tx = st.parent_tx.clone();
        drop(st);
        let source = self.child_source(child);
        self.reserve_names(
            self.inner
                .catalog
                .list(&crate::catalog::ListFilter {
                    source: Some(source.clone()),
                    ..Default::default()
                })
                .iter()
                .map(|e| &**e),
        );
        let (_, removed) = self.inner.catalog.replace_source(&source, vec![]);
        info!(
            child,
            removed, "child detached; its subtree was dropped (names held for it)"
        );
        self.send_up(parent_tx, membership);
        self.bump();
    }

    /// The child changed its subtree (one of its own children came or went).
    pub fn update_child_subtree(
        &self,
        child: &str,
        membership: &fed::SubtreeMembership,
    ) -> Result<(), ChildError> {
        let (clusters, refused) = self.carried(child, membership);
        let mut st = self.lock();
        st.tree.set_child_subtree(child, clusters)?;
        st.claimed.insert(child.to_string(), membership.clone());
        if let Some(session) = st.sessions.get(child) {
            for r in refused {
                self.down(&session.link, fed::parent_message::Payload::Rejection(r));
            }
        }
        let membership = self.membership_locked(&st);
        let parent_tx = st.parent_tx.clone();
        drop(st);
        // Drop announcements of clusters that left the child's subtree (their names are held).
        let mut gone = self.child_entries(child);
        {
            let st = self.lock();
            gone.retain(|e| st.tree.check_claim(child, &e.key.cluster).is_err());
        }
        self.reserve_names(gone.iter().map(|e| &**e));
        self.remove_child_entries(child, &gone);
        self.send_up(parent_tx, membership);
        self.bump();
        Ok(())
    }

    /// The part of `membership` that `child` may carry (Cedar `carry`, evaluated in this
    /// level's policies: by default a child carries only itself), and a rejection for each
    /// cluster it may not. A child's claim alone never puts a cluster under it.
    fn carried(
        &self,
        child: &str,
        membership: &fed::SubtreeMembership,
    ) -> (BTreeSet<String>, Vec<fed::Rejection>) {
        let policies = self.policies();
        let mut keep = BTreeSet::new();
        let mut refused = vec![];
        for cluster in &membership.clusters {
            // The child itself is always its own (MissingSelf catches its absence).
            let verdict = match cluster == child {
                true => None,
                false => Some(policies.carry(child, cluster)),
            };
            let Some(verdict) = verdict.filter(|v| !v.allowed) else {
                keep.insert(cluster.clone());
                continue;
            };
            warn!(child, %cluster, "refusing a cluster of the child's subtree: no carry permit for it here");
            refused.push(
                Refusal::new(
                    "carry",
                    tonic::Code::PermissionDenied,
                    format!(
                        "{child} may not carry {cluster:?}: no Cedar carry permit at {}",
                        self.inner.cluster
                    ),
                )
                .with_policies(verdict.policies)
                .to_rejection("subtree", cluster, "", "", "", &self.inner.cluster),
            );
        }
        (keep, refused)
    }

    /// An announcement from `child`. A refusal costs that entry only: the caller sends it back
    /// to the child as a [`fed::Rejection`] and reads on.
    pub fn child_announcement(
        &self,
        child: &str,
        ann: &fed::ServiceAnnouncement,
    ) -> Result<(), Refusal> {
        if let Err(e) = self.lock().tree.check_claim(child, &ann.cluster) {
            warn!(child, cluster = %ann.cluster, "refusing an announcement for a cluster the child does not carry");
            return Err(Refusal::new(
                "subtree",
                tonic::Code::PermissionDenied,
                e.to_string(),
            ));
        }
        let source = self.child_source(child);
        if ann.deleted {
            let key = ServiceKey::new(&ann.cluster, &ann.namespace, &ann.name);
            if self
                .inner
                .catalog
                .get(&key)
                .is_some_and(|e| e.source == source)
            {
                self.inner.catalog.remove(&key);
            }
            // The owner withdrew it: whatever was held for it is free.
            self.lock().reserved.release(&key);
            return Ok(());
        }
        let entry = match entry_from_announcement(ann, source.clone()) {
            Ok(e) => e,
            Err(e) => {
                warn!(child, cluster = %ann.cluster, error = %e, "refusing an invalid announcement");
                return Err(Refusal::new(
                    "valid",
                    tonic::Code::InvalidArgument,
                    format!("invalid announcement: {e}"),
                ));
            }
        };
        let verdict = self.policies().announce(&ann.cluster, &entry);
        if !verdict.allowed {
            warn!(child, cluster = %ann.cluster, fqdn = %entry.fqdn, "announcement refused by policy: no permit for this zone");
            self.lock().policy_refused.insert(child.to_string());
            if self
                .inner
                .catalog
                .get(&entry.key)
                .is_some_and(|e| e.source == source)
            {
                self.inner.catalog.remove(&entry.key);
            }
            return Err(Refusal::new(
                "announce",
                tonic::Code::PermissionDenied,
                if verdict.policies.is_empty() {
                    format!(
                        "{} may not announce {}: no Cedar announce permit",
                        ann.cluster, entry.fqdn
                    )
                } else {
                    format!(
                        "{} may not announce {}: forbidden by {}",
                        ann.cluster,
                        entry.fqdn,
                        verdict.policies.join(", ")
                    )
                },
            )
            .with_policies(verdict.policies));
        }
        if let Some(existing) = self.inner.catalog.get(&entry.key)
            && existing.source != source
        {
            warn!(child, key = %entry.key, existing = %existing.source, "announcement collides with an entry from elsewhere; keeping the existing one");
            return Err(Refusal::new(
                "collision",
                tonic::Code::AlreadyExists,
                format!("{} is already held from {}", entry.key, existing.source),
            ));
        }
        self.claim_name(&entry)?;
        self.inner.catalog.upsert(entry);
        Ok(())
    }

    /// One owner per name: the first service to hold an FQDN, or a `namespace/name` (what a
    /// query by name resolves), keeps it; a later claimant with another key is refused, the
    /// clash recorded here and reported to the owner. Sort order plays no part, so a cluster
    /// named `a9` gains nothing over `c2`. The holder is the service in the catalog (this
    /// level's subtree, local exports included) or, while it is away, its reservation.
    fn claim_name(&self, entry: &ServiceEntry) -> Result<(), Refusal> {
        let fqdn = entry.fqdn.as_str();
        let by_name = format!("{}/{}", entry.key.namespace, entry.key.name);
        let other = |e: &Arc<ServiceEntry>| e.source.in_subtree() && e.key != entry.key;
        let fqdn_holder = self
            .inner
            .catalog
            .by_fqdn(fqdn)
            .into_iter()
            .filter(|e| other(e) && e.fqdn == fqdn)
            .map(|e| e.key.clone())
            .min();
        let name_holder = self
            .inner
            .catalog
            .by_name(&entry.key.namespace, &entry.key.name)
            .into_iter()
            .filter(other)
            .map(|e| e.key.clone())
            .min();
        let mut st = self.lock();
        self.expire_locked(&mut st);
        let held = |name: &str| st.reserved.get(name).filter(|k| **k != entry.key).cloned();
        let clash = fqdn_holder
            .or_else(|| held(fqdn))
            .map(|k| (fqdn.to_string(), k))
            .or_else(|| {
                name_holder
                    .or_else(|| held(&by_name))
                    .map(|k| (by_name.clone(), k))
            });
        if let Some((name, owner)) = clash {
            let clash = Clash {
                at: SystemTime::now(),
                fqdn: fqdn.to_string(),
                owner: owner.clone(),
                claimant: entry.key.clone(),
                refused_by: self.inner.cluster.clone(),
            };
            push_bounded(&mut st.clashes, clash);
            drop(st);
            warn!(%name, %owner, claimant = %entry.key, "refusing a claim on a name another service owns");
            self.route_clash(fed::NameClash {
                fqdn: fqdn.to_string(),
                owner_cluster: owner.cluster.to_string(),
                owner_namespace: owner.namespace.to_string(),
                owner_name: owner.name.to_string(),
                claimant_cluster: entry.key.cluster.to_string(),
                claimant_namespace: entry.key.namespace.to_string(),
                claimant_name: entry.key.name.to_string(),
                refused_by: self.inner.cluster.clone(),
            });
            self.bump();
            return Err(Refusal::new(
                "owner",
                tonic::Code::AlreadyExists,
                format!("{name} is owned by {owner}; the first owner keeps a name"),
            ));
        }
        // The owner is back: it holds its names through the catalog again.
        st.reserved.release(&entry.key);
        Ok(())
    }

    /// Hold the names of `entries` (leaving with their child) for their owners.
    fn reserve_names<'a>(&self, entries: impl Iterator<Item = &'a ServiceEntry>) {
        let now = reservations::unix_now();
        let mut st = self.lock();
        for e in entries {
            let by_name = format!("{}/{}", e.key.namespace, e.key.name);
            st.reserved
                .insert(Arc::from(e.fqdn.as_str()), e.key.clone(), now);
            st.reserved
                .insert(Arc::from(by_name.as_str()), e.key.clone(), now);
        }
    }

    /// Deliver a clash notice toward the owner's cluster (recorded there and on the way).
    pub(crate) fn route_clash(&self, n: fed::NameClash) {
        let st = self.lock();
        match st.tree.direction(&n.owner_cluster) {
            Direction::Local => {
                drop(st);
                self.record_clash_notice(&n);
            }
            Direction::Child(child) => {
                let link = st.sessions.get(&child).map(|s| s.link.clone());
                drop(st);
                if let Some(link) = link {
                    self.down(&link, fed::parent_message::Payload::NameClash(n));
                }
            }
            Direction::Up => {
                drop(st);
                self.hold_clash(n);
            }
        }
    }

    fn record_clash_notice(&self, n: &fed::NameClash) {
        warn!(fqdn = %n.fqdn, claimant = %n.claimant_cluster, refused_by = %n.refused_by, "another cluster tried to announce a name this cluster owns; it was refused");
        let clash = Clash {
            at: SystemTime::now(),
            fqdn: n.fqdn.clone(),
            owner: ServiceKey::new(&n.owner_cluster, &n.owner_namespace, &n.owner_name),
            claimant: ServiceKey::new(&n.claimant_cluster, &n.claimant_namespace, &n.claimant_name),
            refused_by: n.refused_by.clone(),
        };
        push_bounded(&mut self.lock().clashes, clash);
        self.bump();
    }

    /// Refused claims on `fqdn` seen here (all of them with `None`), oldest first.
    pub fn clashes(&self, fqdn: Option<&str>) -> Vec<Clash> {
        self.lock()
            .clashes
            .iter()
            .filter(|c| fqdn.is_none_or(|f| c.fqdn == f))
            .cloned()
            .collect()
    }

    /// Entries our parent refused (the latest refusal of each), by kind, cluster, namespace and
    /// name: those refused in the current session, and those refused before that the parent has
    /// not yet decided again.
    pub fn rejections(&self) -> Vec<(SystemTime, fed::Rejection)> {
        self.lock().refused.values().cloned().collect()
    }

    /// Whether the parent confirmed it applied this session's snapshot: from then on
    /// [`Level::rejections`] is what it decided about every entry we announced, and an entry
    /// without a rejection was accepted (or is still being decided after a change).
    pub fn refusals_confirmed(&self) -> bool {
        self.lock().refusals_confirmed
    }

    /// The parent's latest refusal of our announcement of `namespace/name`, if it stands.
    pub fn refusal_of(&self, namespace: &str, name: &str) -> Option<fed::Rejection> {
        let key = (
            ANNOUNCEMENT_KIND.to_string(),
            self.inner.cluster.clone(),
            namespace.to_string(),
            name.to_string(),
        );
        self.lock().refused.get(&key).map(|(_, r)| r.clone())
    }

    /// Send a refusal of one entry back to `child` (the stream goes on).
    pub fn reject_to_child(&self, child: &str, r: fed::Rejection) {
        let link = self.lock().sessions.get(child).map(|s| s.link.clone());
        if let Some(link) = link {
            self.down(&link, fed::parent_message::Payload::Rejection(r));
        }
    }

    /// The policy set changed: decide again what each child carries (from what it declared),
    /// every grant held here, and every question without a granted answer.
    pub fn policies_changed(&self) {
        let claimed: Vec<(String, fed::SubtreeMembership)> = self
            .lock()
            .claimed
            .iter()
            .map(|(c, m)| (c.clone(), m.clone()))
            .collect();
        for (child, membership) in claimed {
            let before = self.lock().tree.children().get(&child).cloned();
            if let Err(e) = self.update_child_subtree(&child, &membership) {
                warn!(%child, error = %e, "the child's subtree no longer holds under the new policies");
                continue;
            }
            let st = self.lock();
            let grew = st
                .tree
                .children()
                .get(&child)
                .is_some_and(|now| before.is_none_or(|b| !now.is_subset(&b)));
            // Entries of the newly carried clusters, and those a policy refused, are decided
            // again when the child sends them again after reconnecting (and the child learns
            // which refusals no longer stand from the confirmation of its snapshot).
            let refused = st.policy_refused.contains(&child);
            if (grew || refused)
                && let Some(session) = st.sessions.get(&child)
            {
                info!(%child, grew, refused, "the policies changed; asking the child to reconnect and resend");
                session.link.close(tonic::Status::unavailable(
                    "the parent's policies changed; reconnect to announce again",
                ));
            }
        }
        self.recheck_grants();
        self.retry_unanswered();
    }

    /// A tracker for what one session of a child announces, started when the session attaches
    /// (before its first announcement).
    pub fn track_announcements(&self) -> SessionAnnouncements {
        SessionAnnouncements {
            since: self.inner.catalog.revision(),
            older: BTreeSet::new(),
        }
    }

    /// What `child`'s subtree has in the catalog now.
    fn child_entries(&self, child: &str) -> Vec<Arc<ServiceEntry>> {
        self.inner.catalog.list(&crate::catalog::ListFilter {
            source: Some(self.child_source(child)),
            ..Default::default()
        })
    }

    /// Remove these entries of `child`'s subtree by key. Only what goes is touched: replacing the
    /// source with copies of what stays cost a transient copy of every entry (a heap the
    /// allocator kept, ~120 B per service at a loaded root). Returns how many were removed.
    fn remove_child_entries(&self, child: &str, gone: &[Arc<ServiceEntry>]) -> usize {
        let keys: Vec<ServiceKey> = gone.iter().map(|e| e.key.clone()).collect();
        let source = self.child_source(child);
        self.inner
            .catalog
            .update_source(&source, Vec::new(), &keys)
            .1
    }

    /// The child finished its snapshot: drop whatever of its subtree it did not announce in
    /// this session.
    pub fn child_snapshot_complete(&self, child: &str, announced: &SessionAnnouncements) {
        let mut stale = self.child_entries(child);
        stale.retain(|e| !announced.covers(e));
        let removed = self.remove_child_entries(child, &stale);
        // The child's snapshot is complete: what it holds now is all its subtree owns, so
        // names held for its clusters and not announced again are free.
        {
            let mut st = self.lock();
            if !st.reserved.is_empty()
                && let Some(carried) = st.tree.children().get(child).cloned()
            {
                st.reserved
                    .release_clusters(carried.iter().map(|c| c.as_str()));
            }
        }
        if removed > 0 {
            info!(
                child,
                removed, "removed stale announcements after the child's snapshot"
            );
        }
        self.bump();
    }

    /// Tell `child` its snapshot up to `marker` was applied: every refusal of what it sent
    /// before the marker was sent before this confirmation.
    pub fn confirm_snapshot(&self, child: &str, marker: fed::SnapshotComplete) {
        let link = self.lock().sessions.get(child).map(|s| s.link.clone());
        if let Some(link) = link {
            self.down(
                &link,
                fed::parent_message::Payload::SnapshotComplete(marker),
            );
        }
    }

    /// May `child` speak for `cluster` (announce it, or ask on its behalf)?
    pub fn check_claim(&self, child: &str, cluster: &str) -> Result<(), super::tree::TreeError> {
        self.lock().tree.check_claim(child, cluster)
    }

    /// A hop-by-hop acknowledgement from `child`.
    pub fn child_route_ack(&self, child: &str, ack: &fed::RouteAck) {
        let mut st = self.lock();
        if let Some(q) = st.route_queues.get_mut(child) {
            q.pending.remove(&ack.route_id);
        }
        drop(st);
        if !ack.error.is_empty() {
            warn!(child, route = ack.route_id, error = %ack.error, "child could not apply a route");
        }
        self.bump();
    }

    // ---------------------------------------------------------------- parent link

    /// A parent session begins: queue the subtree membership on `up` first and make `up` the
    /// way up, so every later membership change, query and acknowledgement follows it. Returns
    /// the persistent questions to re-issue once the snapshot is sent; the snapshot itself is
    /// streamed from the catalog by [`super::upward::Upward`].
    pub fn begin_upward(&self, up: Uplink) -> Vec<fed::ServiceQuery> {
        let mut st = self.lock();
        self.send_up(Some(up.clone()), self.membership_locked(&st));
        st.parent_tx = Some(up);
        // Earlier refusals of what the snapshot holds stand until the parent confirms it
        // without repeating them; a refused question stands until it is answered (it is asked
        // again after the snapshot).
        st.refused_before = st
            .refused
            .keys()
            .filter(|k| k.0 != QUERY_KIND)
            .cloned()
            .collect();
        st.refusals_confirmed = false;
        let queries = st
            .subs
            .iter()
            .filter(|(_, s)| s.persistent)
            .map(|(id, s)| self.query_msg(*id, s))
            .collect();
        drop(st);
        self.bump();
        queries
    }

    pub fn parent_disconnected(&self) {
        self.lock().parent_tx = None;
        self.bump();
    }

    pub fn parent_is_connected(&self) -> bool {
        self.lock().parent_tx.is_some()
    }

    /// The subtree membership message (what a snapshot starts with).
    pub fn membership(&self) -> fed::ChildMessage {
        self.membership_locked(&self.lock())
    }

    /// The upward message for a catalog change, if it concerns our subtree.
    pub fn upward_event(&self, ev: &CatalogEvent) -> Option<fed::ChildMessage> {
        // A changed or withdrawn entry is decided again by the parent: its old refusal goes.
        if ev.entry().source.in_subtree() {
            let mut st = self.lock();
            if !st.refused.is_empty() {
                let k = &ev.entry().key;
                st.refused.remove(&(
                    ANNOUNCEMENT_KIND.to_string(),
                    k.cluster.to_string(),
                    k.namespace.to_string(),
                    k.name.to_string(),
                ));
            }
        }
        match ev {
            CatalogEvent::Upsert(e) if e.source.in_subtree() => Some(msg_up(
                fed::child_message::Payload::ServiceAnnouncement(announcement(e, false)),
            )),
            CatalogEvent::Delete(e) if e.source.in_subtree() => Some(msg_up(
                fed::child_message::Payload::ServiceAnnouncement(announcement(e, true)),
            )),
            _ => None,
        }
    }

    fn membership_locked(&self, st: &State) -> fed::ChildMessage {
        msg_up(fed::child_message::Payload::Subtree(
            fed::SubtreeMembership {
                clusters: st.tree.subtree().into_iter().collect(),
                resync: false,
            },
        ))
    }

    /// A message from the parent.
    pub fn on_parent_message(&self, msg: fed::ParentMessage) -> Result<(), super::tree::TreeError> {
        use fed::parent_message::Payload;
        match msg.payload {
            Some(Payload::Ancestry(a)) => {
                let mut st = self.lock();
                st.tree.set_ancestors(a.path)?;
                // Our children's ancestry changed too.
                let mut path = st.tree.ancestors().to_vec();
                path.push(self.inner.cluster.clone());
                for session in st.sessions.values() {
                    self.down(
                        &session.link,
                        fed::parent_message::Payload::Ancestry(fed::Ancestry {
                            path: path.clone(),
                        }),
                    );
                }
                drop(st);
                self.bump();
            }
            Some(Payload::ServiceQueryResponse(r)) => self.route_answer(r),
            Some(Payload::RouteNotification(n)) => {
                let mine = self.lock().tree.direction(&n.target_cluster) == Direction::Local;
                let error = match mine && !n.revoked {
                    true => self
                        .owner_check(&n)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                    false => String::new(),
                };
                let applied = self.route_notification(n.clone());
                let tx = self.lock().parent_tx.clone();
                self.send_up(
                    tx,
                    msg_up(fed::child_message::Payload::RouteAck(fed::RouteAck {
                        route_id: n.route_id,
                        applied,
                        error,
                    })),
                );
            }
            Some(Payload::Rejection(r)) => {
                warn!(kind = %r.kind, cluster = %r.cluster, namespace = %r.namespace, name = %r.name, code = ?tonic::Code::from_i32(r.code), check = %r.check, policies = ?r.policy_ids, reason = %r.reason, refused_by = %r.refused_by, "the parent refused an entry");
                let key = refused_key(&r.kind, &r.cluster, &r.namespace, &r.name, &r.fqdn);
                let mut st = self.lock();
                // What a cluster below announced or asked: the refusal goes on down to it, so
                // the sender stores and shows it (it is kept here too, as our subtree's).
                if (r.kind == ANNOUNCEMENT_KIND || r.kind == QUERY_KIND)
                    && let Direction::Child(child) = st.tree.direction(&r.cluster)
                    && let Some(session) = st.sessions.get(&child)
                {
                    self.down(
                        &session.link,
                        fed::parent_message::Payload::Rejection(r.clone()),
                    );
                }
                st.refused_before.remove(&key);
                if st.refused.len() < KEEP_REFUSED || st.refused.contains_key(&key) {
                    st.refused.insert(key, (SystemTime::now(), r));
                } else {
                    self.inner.overflows.inc();
                }
                drop(st);
                self.bump();
            }
            Some(Payload::NameClash(n)) => self.route_clash(n),
            Some(Payload::SnapshotComplete(_)) => {
                let mut st = self.lock();
                let lifted = std::mem::take(&mut st.refused_before);
                for k in &lifted {
                    st.refused.remove(k);
                }
                st.refusals_confirmed = true;
                // A lifted refusal of what a cluster below announced was forwarded to it: its
                // child is asked to send its snapshot again, and the refusal goes there when
                // we confirm that snapshot without repeating it.
                let children: BTreeSet<String> = lifted
                    .iter()
                    .filter_map(|k| match st.tree.direction(&k.1) {
                        Direction::Child(child) => Some(child),
                        _ => None,
                    })
                    .collect();
                for child in children {
                    if let Some(session) = st.sessions.get(&child) {
                        info!(%child, "a refusal of the child's subtree was lifted above; asking it to reconnect and resend");
                        session.link.close(tonic::Status::unavailable(
                            "a refusal above was lifted; reconnect to announce again",
                        ));
                    }
                }
                drop(st);
                self.bump();
            }
            Some(Payload::ServiceAnnouncement(_)) | None => {}
        }
        Ok(())
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

/// A child-session queue with the default budget (tests).
#[cfg(test)]
pub(crate) fn session_channel() -> (DownLink, DownQueue) {
    DownLink::new(QueueLimits::FEDERATION)
}

#[cfg(test)]
mod tests;
