//! The Hamlet `DiscoveryService` (v1alpha1 and v1alpha2) over the catalog's local exports.
//!
//! Each consumer's response stream drives a [`ConsumerState`]: the snapshot is computed from the
//! catalog at subscription time (no size cap), changes arrive as FQDNs on a broadcast channel and
//! are coalesced, a window of unacknowledged responses keeps fast consumers busy and a consumer
//! that never ACKs stalls only itself (and is closed with `Unavailable` after the ACK timeout).
//! A consumer that stopped reading altogether (its HTTP/2 window is full, so the stream is no
//! longer polled) is caught by a watchdog task per stream, which closes its connection once the
//! ACK timeout plus [`STALL_GRACE`] has passed.
//! Every response carries a real nonce; the empty-nonce ACKs Go peers send are accepted.
//! Only services the registry's decision point ([`crate::authz::Gate`]) grants to the consumer's
//! certificate identity are streamed; a certificate that is not a cluster of this trust domain
//! is refused with `PermissionDenied`.
//!
//! A policy reload keeps every stream open. Each record is decided again under the new set once
//! per consumer identity (shared by all that identity's streams, see [`Reloads`]), and each
//! consumer is sent only the records whose decision changed: a CREATE for one newly allowed, a
//! DELETE for one newly denied, all queued at once.

use std::collections::HashMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::{BroadcastStream, WatchStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};
use xcc_certs::server::ConnectionCloser;
use xcc_proto::SNAPSHOT_MARKER_METADATA;
// The servers' own messages: a response's resource is its shared encoding.
use xcc_proto::hamlet_server::{v1alpha1 as rd1, v1alpha2 as rd2};

use super::consumer::{ConsumerState, Op, Reply};
use super::convert;
use super::wire::{Encoded, Incoming, W1, W2, Wire, inbound_error};
use crate::authz::{Discoverer, Gate, Policies};
use crate::catalog::{Catalog, ServiceEntry, ViewVersion};
use crate::metrics::{ApiLabels, Metrics, OpLabel, OpLabels};
use crate::peers::{PeerGuard, PeerKind, PeerState, PeerStats, PeerTable};

/// Tunables of the Hamlet server.
#[derive(Clone, Debug)]
pub struct HamletConfig {
    /// Responses that may await an ACK on one stream.
    pub window: usize,
    /// Encoded bytes those responses may add up to (one response always fits): what a
    /// consumer that does not ACK can pin.
    pub window_bytes: usize,
    /// A stream whose oldest response stays unacknowledged this long is closed (`Unavailable`);
    /// if its consumer stopped reading, its connection is closed [`STALL_GRACE`] later.
    pub ack_timeout: Duration,
    /// How long a consumer may take to send its subscription after opening the stream.
    pub subscribe_timeout: Duration,
    /// Largest request message accepted (requests are tiny; anything bigger is hostile).
    pub max_request_bytes: usize,
}

impl Default for HamletConfig {
    fn default() -> Self {
        Self {
            window: 128,
            // 8 MiB: two of the largest resources; 128 ordinary ones (a few KiB each) fit.
            window_bytes: 8 * 1024 * 1024,
            ack_timeout: Duration::from_secs(120),
            subscribe_timeout: Duration::from_secs(30),
            // 64 KiB: a subscription or ACK is well under 1 KiB even with a long NACK message.
            max_request_bytes: 64 * 1024,
        }
    }
}

/// Encoded bytes (gRPC frame headers included) a stream hands to the encoder in one go before
/// yielding; the encoder then passes them to HTTP/2 as one chunk (one DATA frame, one TLS
/// record, one write). The window (unacknowledged responses) is separate and larger.
///
/// tonic's encode buffer (8 KiB as first allocated) grows to the largest chunk and stays with
/// the stream while it idles, so the burst trades idle memory for fewer, larger writes. At
/// 16 KiB, with the consumers' ACK frames cut into pieces ([`super::pieces`]), 1,000 idle
/// consumers × 10k services pin 140 MiB (4 KiB bursts: 132 MiB) and a 10k snapshot takes about
/// a quarter less time and server CPU (docs/benchmarks.md, issue 28, session 18). A larger
/// response goes alone.
const BURST_BYTES: usize = 16 * 1024;

/// The gRPC frame header tonic puts before each message.
const GRPC_HEADER: usize = 5;

/// How long after its ACK deadline a stream that HTTP/2 no longer polls (the consumer stopped
/// reading) loses its connection. A polled stream ends itself with `Unavailable` right at the
/// deadline; the grace keeps the watchdog from racing it (it only has to exceed a task wake-up,
/// and one second is small next to any sensible ACK timeout).
pub const STALL_GRACE: Duration = Duration::from_secs(1);

/// Shared state of both API versions.
#[derive(Clone)]
pub struct HamletServer {
    catalog: Catalog,
    gate: Gate,
    peers: PeerTable,
    metrics: Metrics,
    config: HamletConfig,
    cancel: CancellationToken,
    reloads: Arc<Mutex<Reloads>>,
    encoded: Arc<Encoded>,
}

/// Records whose decision for one consumer identity a policy reload changed: FQDN → (the entry
/// decided, allowed under the new set). Entries whose decision stayed are absent.
struct Redecided {
    flipped: HashMap<Arc<str>, (Arc<ServiceEntry>, bool)>,
    /// The view decided (a token: the entries are not kept): while the catalog still serves
    /// it, each entry above is the one served.
    view: ViewVersion,
}

/// The decisions a policy reload changed, per (set before, set after, consumer identity), so
/// that 1,000 streams of one cluster evaluate each record twice in all, not twice each.
/// Only reloads to the set in force are kept; the entries held are at most the records whose
/// decision flipped.
#[derive(Default)]
struct Reloads {
    #[allow(clippy::type_complexity)]
    done: Vec<(
        Arc<Policies>,
        Arc<Policies>,
        String,
        Arc<OnceLock<Arc<Redecided>>>,
    )>,
}

impl HamletServer {
    pub fn new(
        catalog: Catalog,
        gate: Gate,
        peers: PeerTable,
        metrics: Metrics,
        config: HamletConfig,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            catalog,
            gate,
            peers,
            metrics,
            config,
            cancel,
            reloads: Arc::default(),
            encoded: Arc::default(),
        }
    }

    /// The records of the current Hamlet view whose decision for `identity` differs between
    /// `from` and `to` (computed once per reload and identity, then shared).
    fn redecided(
        &self,
        from: &Arc<Policies>,
        to: &Arc<Policies>,
        identity: &str,
    ) -> Arc<Redecided> {
        let cell = {
            let mut reloads = xcc_controller::plumbing::lock(&self.reloads);
            reloads.done.retain(|(_, t, _, _)| Arc::ptr_eq(t, to));
            match reloads
                .done
                .iter()
                .find(|(f, _, id, _)| Arc::ptr_eq(f, from) && id == identity)
            {
                Some((_, _, _, cell)) => cell.clone(),
                None => {
                    let cell = Arc::new(OnceLock::new());
                    reloads.done.push((
                        from.clone(),
                        to.clone(),
                        identity.to_string(),
                        cell.clone(),
                    ));
                    cell
                }
            }
        };
        cell.get_or_init(|| {
            let started = Instant::now();
            let view = self.catalog.hamlet_view();
            let served: Vec<(&Arc<str>, &Arc<ServiceEntry>)> = view
                .iter()
                .filter(|(_, e)| convert::fits_on_the_wire(e))
                .collect();
            let entries: Vec<&Arc<ServiceEntry>> = served.iter().map(|(_, e)| *e).collect();
            let entity = |e: &Arc<ServiceEntry>| self.encoded.entity(e);
            let decided = crate::authz::flipped_all(from, to, &entries, identity, &entity);
            let flipped: HashMap<_, _> = served
                .into_iter()
                .zip(decided)
                .filter_map(|((fqdn, entry), after)| {
                    after.map(|after| (fqdn.clone(), (entry.clone(), after)))
                })
                .collect();
            info!(consumer = identity, records = view.len(), flipped = flipped.len(), elapsed = ?started.elapsed(), "policies reloaded: records decided again");
            Arc::new(Redecided {
                flipped,
                view: view.version(),
            })
        })
        .clone()
    }

    /// The tonic service for `federation.resourcediscovery.v1alpha1.DiscoveryService`.
    pub fn v1alpha1(&self) -> rd1::discovery_service_server::DiscoveryServiceServer<V1alpha1> {
        rd1::discovery_service_server::DiscoveryServiceServer::new(V1alpha1(self.clone()))
            .max_decoding_message_size(self.config.max_request_bytes)
    }

    /// The tonic service for `federation.resourcediscovery.v1alpha2.DiscoveryService`.
    pub fn v1alpha2(&self) -> rd2::discovery_service_server::DiscoveryServiceServer<V1alpha2> {
        rd2::discovery_service_server::DiscoveryServiceServer::new(V1alpha2(self.clone()))
            .max_decoding_message_size(self.config.max_request_bytes)
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

pub struct V1alpha1(HamletServer);
pub struct V1alpha2(HamletServer);

#[tonic::async_trait]
impl rd1::discovery_service_server::DiscoveryService for V1alpha1 {
    type EstablishStreamStream = BoxStream<rd1::StreamResponse>;

    async fn establish_stream(
        &self,
        request: Request<Streaming<rd1::StreamRequest>>,
    ) -> Result<Response<Self::EstablishStreamStream>, Status> {
        establish::<W1>(&self.0, request).await
    }
}

#[tonic::async_trait]
impl rd2::discovery_service_server::DiscoveryService for V1alpha2 {
    type EstablishStreamStream = BoxStream<rd2::BidirectionalStream>;

    async fn establish_stream(
        &self,
        request: Request<Streaming<rd2::BidirectionalStream>>,
    ) -> Result<Response<Self::EstablishStreamStream>, Status> {
        establish::<W2>(&self.0, request).await
    }
}

async fn establish<W: Wire>(
    server: &HamletServer,
    request: Request<Streaming<W::Req>>,
) -> Result<Response<BoxStream<W::Resp>>, Status> {
    let peer = xcc_certs::server::peer_info(&request)
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no verified client certificate"))?;
    // Lets the stream's watchdog close the connection of a consumer that stopped reading.
    let closer = xcc_certs::server::connection_closer(&request).cloned();
    // Kind and trust domain first: an admin certificate, a DNS-SAN-only one or a foreign trust
    // domain never stands for a cluster, whatever its name.
    let identity = server.gate.cluster_of(&peer.identity).map_err(|e| {
        warn!(consumer = %peer.identity, addr = %peer.remote_addr, error = %e, "refusing hamlet consumer");
        Status::from(e)
    })?;
    let marker = request
        .metadata()
        .get(SNAPSHOT_MARKER_METADATA)
        .is_some_and(|v| v.as_bytes() == b"1");
    let mut requests = request.into_inner();
    let first = tokio::time::timeout(server.config.subscribe_timeout, requests.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no subscription request received"))??
        .ok_or_else(|| Status::cancelled("stream closed before subscribing"))?;
    let (url, context) = W::subscription(&first)?;
    if !W::serves(&url) {
        return Err(Status::invalid_argument(format!(
            "unsupported resource_url {url:?}; this service serves {:?}",
            W::RESOURCE_URL
        )));
    }
    info!(consumer = %peer.identity, addr = %peer.remote_addr, api = ?W::API, marker, "hamlet consumer subscribed");
    let stream = ConsumerStream::<W>::new(
        server.clone(),
        identity,
        peer.remote_addr.to_string(),
        marker,
        context,
        requests,
        closer,
    );
    let mut response = Response::new(Box::pin(stream) as BoxStream<W::Resp>);
    if marker {
        response.metadata_mut().insert(
            SNAPSHOT_MARKER_METADATA,
            tonic::metadata::MetadataValue::from_static("1"),
        );
    }
    Ok(response)
}

/// One consumer's stream: the response stream tonic sends from, which also reads the
/// consumer's ACKs and NACKs, follows the catalog's changes and runs the ACK and retry timers.
///
/// It is polled by the HTTP/2 stream's own task (no channel, and no task of its own but an
/// idle watchdog), so a change reaches the wire with one task wake-up per consumer and an ACK
/// is handled with one more; a response is rendered only when HTTP/2 flow control has room for it. While the consumer's
/// flow-control window is closed the stream is not polled at all: ACKs and retries wait until
/// the consumer reads again, and its own ACK timer cannot fire. So the stream publishes its ACK
/// deadline on a watch channel to a [`watchdog`] task, which closes the connection once the
/// deadline plus [`STALL_GRACE`] has passed; the stream, its peer entry and its gauge go with
/// it. The HTTP/2 keepalive closes a connection whose peer is gone.
struct ConsumerStream<W: Wire> {
    server: HamletServer,
    identity: String,
    context: String,
    requests: Streaming<W::Req>,
    changes: BroadcastStream<Arc<str>>,
    /// Ticks when the gate swaps its policy set.
    policy_changes: WatchStream<u64>,
    /// The policy set every record the consumer holds was decided under.
    decided_under: Arc<Policies>,
    /// The decisions the last reload changed, while their records are queued.
    redecided: Option<Arc<Redecided>>,
    /// Decides the records sent under the set in force (built again when the set changes).
    discoverer: Option<Discoverer>,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    st: ConsumerState,
    stats: Arc<PeerStats>,
    stream_gauge: Gauge,
    /// `hamlet_responses` by operation, looked up once per stream rather than per response.
    responses: [Counter; 4],
    synced: bool,
    ack_timer: Pin<Box<Sleep>>,
    ack_armed: Option<Instant>,
    retry_timer: Pin<Box<Sleep>>,
    retry_armed: Option<Instant>,
    /// Encoded bytes returned since the stream last yielded (see [`BURST_BYTES`]).
    burst: usize,
    /// A response rendered that did not fit in the burst: the first of the next one.
    held: Option<W::Resp>,
    /// The ACK deadline (oldest unacknowledged response plus the ACK timeout) for the
    /// [`watchdog`]. Updates are silent (the watchdog reads the value when its timer fires, so
    /// an ACK costs no wake-up); dropping the sender ends the watchdog.
    deadline: watch::Sender<Option<Instant>>,
    /// Set once the stream has ended (an error was returned or the consumer went away).
    done: bool,
    /// Keeps the consumer listed in the peer table while the stream lives.
    _guard: PeerGuard,
}

impl<W: Wire> ConsumerStream<W> {
    fn new(
        server: HamletServer,
        identity: String,
        address: String,
        marker: bool,
        context: String,
        requests: Streaming<W::Req>,
        closer: Option<ConnectionCloser>,
    ) -> Self {
        let stream_gauge = server
            .metrics
            .hamlet_streams
            .get_or_create(&ApiLabels { api: W::API })
            .clone();
        stream_gauge.inc();
        let guard = server.peers.register(
            PeerKind::HamletConsumer,
            format!("{identity}@{address}"),
            identity.clone(),
            address,
        );
        let stats = guard.stats.clone();
        stats.set_state(PeerState::Connected);
        // Subscribe before taking the view so no change between the two is missed.
        let changes = BroadcastStream::new(server.catalog.subscribe_hamlet());
        // Watch before reading the set in force, so a swap in between is not missed.
        let policy_changes = WatchStream::from_changes(server.gate.subscribe());
        let decided_under = server.gate.policies();
        let mut st = ConsumerState::for_requester(server.config.window, identity.clone())
            .with_window_bytes(server.config.window_bytes);
        st.start_snapshot(server.catalog.hamlet_view(), marker);
        let synced = st.snapshot_sent();
        if synced {
            stats.mark_synced();
        }
        let cancelled = Box::pin(server.cancel.clone().cancelled_owned());
        let (deadline, deadline_rx) = watch::channel(None);
        // Without a closer (a connection not from `tls_incoming`) there is nothing to close;
        // the stream's own ACK timer still works while it is polled.
        if let Some(closer) = closer {
            tokio::spawn(watchdog(
                deadline_rx,
                server.config.ack_timeout,
                closer,
                identity.clone(),
                server.metrics.hamlet_ack_timeouts.clone(),
            ));
        }
        let responses = [
            OpLabel::Create,
            OpLabel::Update,
            OpLabel::Delete,
            OpLabel::Marker,
        ]
        .map(|op| {
            server
                .metrics
                .hamlet_responses
                .get_or_create(&OpLabels { op })
                .clone()
        });
        Self {
            identity,
            context,
            requests,
            changes,
            policy_changes,
            decided_under,
            redecided: None,
            discoverer: None,
            cancelled,
            st,
            stats,
            stream_gauge,
            responses,
            synced,
            ack_timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            ack_armed: None,
            retry_timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            retry_armed: None,
            burst: 0,
            held: None,
            deadline,
            done: false,
            _guard: guard,
            server,
        }
    }

    /// End the stream: with `Err`, the consumer receives that status.
    fn finish(&mut self, end: Result<(), Status>) -> Poll<Option<Result<W::Resp, Status>>> {
        self.done = true;
        // Ending by itself: the watchdog has nothing left to do.
        self.deadline.send_if_modified(|d| {
            *d = None;
            false
        });
        self.stats.set_state(PeerState::Stopped);
        match end {
            Err(status) => {
                info!(consumer = %self.identity, code = ?status.code(), message = status.message(), "closing hamlet stream");
                Poll::Ready(Some(Err(status)))
            }
            Ok(()) => {
                info!(consumer = %self.identity, "hamlet consumer disconnected");
                Poll::Ready(None)
            }
        }
    }

    /// Handle one consumer message; `Err` ends the stream with that status.
    fn on_request(&mut self, req: W::Req) -> Result<(), Status> {
        let metrics = &self.server.metrics;
        match W::incoming(req)? {
            Incoming::Reply { nonce, nack: None } => match self.st.on_ack(&nonce) {
                Reply::UnknownNonce => {
                    metrics.hamlet_unknown_nonces.inc();
                    debug!(consumer = %self.identity, nonce, "ACK for no outstanding response");
                }
                _ => {
                    metrics.hamlet_acks.inc();
                    self.stats.acks.fetch_add(1, Ordering::Relaxed);
                }
            },
            Incoming::Reply {
                nonce,
                nack: Some(error),
            } => match self.st.on_nack(&nonce, Instant::now()) {
                Reply::UnknownNonce => {
                    metrics.hamlet_unknown_nonces.inc();
                }
                reply => {
                    metrics.hamlet_nacks.inc();
                    self.stats.nacks.fetch_add(1, Ordering::Relaxed);
                    self.stats.set_error(format!("NACK: {error}"));
                    warn!(consumer = %self.identity, nonce, error, ?reply, "consumer rejected a resource; resending after backoff");
                }
            },
        }
        Ok(())
    }

    /// The gate swapped its policy set: queue exactly the records whose decision for this
    /// consumer changed (the stream stays open).
    fn on_policy_change(&mut self) {
        let now = self.server.gate.policies();
        if Arc::ptr_eq(&now, &self.decided_under) {
            return;
        }
        let redecided = self
            .server
            .redecided(&self.decided_under, &now, &self.identity);
        self.decided_under = now;
        for fqdn in redecided.flipped.keys() {
            self.st.mark_dirty(fqdn.clone());
        }
        self.redecided = (!redecided.flipped.is_empty()).then_some(redecided);
    }

    /// The next response the consumer should get, if any is due and the window has room.
    fn next_response(&mut self) -> Option<W::Resp> {
        if !self.st.can_send() {
            return None;
        }
        let catalog = &self.server.catalog;
        let identity = &self.identity;
        let policies = self.server.gate.policies();
        // Decisions of the last reload, while they are for the set in force (a newer swap not
        // yet seen by this stream makes them stale: decide afresh).
        let redecided = self
            .redecided
            .as_deref()
            .filter(|_| Arc::ptr_eq(&policies, &self.decided_under));
        // A Hamlet subscription asks for every record (condition (b) holds); the gate decides
        // the callee's list and Cedar.
        // While the catalog still serves the consumer's base version, the base's entry (handed
        // over at the snapshot cursor) is the one served: no search for it.
        let fresh = catalog.hamlet_view_is(self.st.base());
        // The stream's decider for the set in force, built when a record first needs it (after
        // a reload, whose records are already decided, none may).
        let discoverer = std::cell::OnceCell::new();
        if let Some(d) = self.discoverer.take().filter(|d| d.is_for(&policies)) {
            let _ = discoverer.set(d);
        }
        let encoded = &self.server.encoded;
        let entity = |e: &Arc<ServiceEntry>| encoded.entity(e);
        // While the catalog serves the view the reload decided, its entries need no search.
        let redecided_fresh = redecided.is_some_and(|r| catalog.hamlet_view_is_version(&r.view));
        let lookup = |fqdn: &str, base: Option<&Arc<ServiceEntry>>| -> Option<Arc<ServiceEntry>> {
            let flipped = redecided.and_then(|r| r.flipped.get(fqdn));
            if redecided_fresh && let Some((decided, allowed)) = flipped {
                return allowed.then(|| decided.clone());
            }
            let e = match base {
                Some(e) if fresh => e.clone(),
                _ => catalog.hamlet_get(fqdn)?,
            };
            if let Some((decided, allowed)) = flipped
                && Arc::ptr_eq(decided, &e)
            {
                return allowed.then_some(e);
            }
            discoverer
                .get_or_init(|| Discoverer::new(policies.clone(), identity, ""))
                .allows(&e, &entity)
                .then_some(e)
        };
        let out = self.st.next_with(Instant::now(), lookup);
        self.discoverer = discoverer.into_inner();
        if self.redecided.is_some() && self.st.queued() == 0 {
            self.redecided = None;
        }
        self.publish_deadline();
        self.stats
            .records
            .store(self.st.held() as u64, Ordering::Relaxed);
        if !self.synced && self.st.snapshot_sent() {
            self.synced = true;
            self.stats.mark_synced();
        }
        let out = out?;
        self.responses[match out.op {
            Op::Create => 0,
            Op::Update => 1,
            Op::Delete => 2,
            Op::SnapshotComplete => 3,
        }]
        .inc();
        self.stats.sent.fetch_add(1, Ordering::Relaxed);
        Some(W::render(&out, &self.context, &self.server.encoded))
    }

    /// Store the current ACK deadline for the watchdog (silently: see [`Self::deadline`]).
    fn publish_deadline(&self) {
        let at = self
            .st
            .oldest_unacked()
            .map(|t| t + self.server.config.ack_timeout);
        self.deadline.send_if_modified(|d| {
            *d = at;
            false
        });
    }

    /// Move the timers to the state's current deadlines. True when a timer was re-armed (it
    /// must be polled once to register for its new deadline).
    fn arm_timers(&mut self) -> bool {
        let mut rearmed = false;
        match self
            .st
            .oldest_unacked()
            .map(|t| t + self.server.config.ack_timeout)
        {
            None => self.ack_armed = None,
            Some(at) => {
                if self.ack_armed.is_none_or(|armed| at < armed) {
                    self.ack_timer.as_mut().reset(at.into());
                    self.ack_armed = Some(at);
                    rearmed = true;
                }
            }
        }
        match self.st.next_retry_at() {
            None => self.retry_armed = None,
            Some(at) => {
                if self.retry_armed.is_none_or(|armed| at < armed) {
                    self.retry_timer.as_mut().reset(at.into());
                    self.retry_armed = Some(at);
                    rearmed = true;
                }
            }
        }
        rearmed
    }

    /// Take in what the stream's sources hold, registering the task's waker with each: the
    /// registry's shutdown, the consumer's ACKs and NACKs, a new policy set, the catalog's
    /// changes and the timers. `Some` is what `poll_next` returns when the stream ends.
    #[allow(clippy::type_complexity)]
    fn poll_sources(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Option<Poll<Option<Result<W::Resp, Status>>>> {
        if self.cancelled.as_mut().poll(cx).is_ready() {
            return Some(self.finish(Err(Status::unavailable("registry shutting down"))));
        }
        // ACKs and NACKs first: they open the window.
        loop {
            match Pin::new(&mut self.requests).poll_next(cx) {
                Poll::Ready(Some(Ok(req))) => {
                    if let Err(status) = self.on_request(req) {
                        return Some(self.finish(Err(status)));
                    }
                    self.publish_deadline();
                }
                Poll::Ready(Some(Err(status))) => {
                    // Never a silent OK: the consumer learns why its stream ended.
                    debug!(consumer = %self.identity, %status, "consumer stream failed");
                    return Some(self.finish(Err(inbound_error(status))));
                }
                Poll::Ready(None) => return Some(self.finish(Ok(()))),
                Poll::Pending => break,
            }
        }
        // A new policy set before catalog changes: its records are queued first.
        while let Poll::Ready(Some(_)) = Pin::new(&mut self.policy_changes).poll_next(cx) {
            self.on_policy_change();
        }
        loop {
            match Pin::new(&mut self.changes).poll_next(cx) {
                Poll::Ready(Some(Ok(fqdn))) => {
                    self.st.mark_dirty(fqdn);
                    if self.st.wants_rebase() {
                        self.st.rebase(self.server.catalog.hamlet_view());
                    }
                }
                Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(missed)))) => {
                    self.server.metrics.hamlet_resyncs.inc();
                    debug!(consumer = %self.identity, missed, "change feed lagged; resynchronising from current state");
                    self.st.mark_all_dirty(&self.server.catalog.hamlet_view());
                }
                Poll::Ready(None) => return Some(self.finish(Ok(()))),
                Poll::Pending => break,
            }
        }
        if self.retry_armed.is_some() && self.retry_timer.as_mut().poll(cx).is_ready() {
            self.retry_armed = None;
            self.st.run_due_retries(Instant::now());
        }
        if self.ack_armed.is_some() && self.ack_timer.as_mut().poll(cx).is_ready() {
            self.ack_armed = None;
            let ack_timeout = self.server.config.ack_timeout;
            if self
                .st
                .oldest_unacked()
                .is_some_and(|t| t + ack_timeout <= Instant::now())
            {
                self.server.metrics.hamlet_ack_timeouts.inc();
                return Some(self.finish(Err(Status::unavailable(format!(
                    "no ACK within {ack_timeout:?}; reconnect to resynchronise"
                )))));
            }
        }
        None
    }
}

impl<W: Wire> Stream for ConsumerStream<W> {
    type Item = Result<W::Resp, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            // Within a burst the sources are not polled again for every response: they were
            // polled when it began and hold this task's waker, so what they bring meanwhile is
            // taken in when the next burst begins (tonic polls the stream once per response, and
            // each poll of the ACK stream and the change feed takes a lock shared with others).
            if this.burst == 0
                && let Some(end) = this.poll_sources(cx)
            {
                return end;
            }
            if let Some(resp) = this.held.take().or_else(|| this.next_response()) {
                let size = W::encoded_len(&resp) + GRPC_HEADER;
                if this.burst > 0 && this.burst + size > BURST_BYTES {
                    // Let the encoder flush the burst; this response starts the next one.
                    this.held = Some(resp);
                    this.burst = 0;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                this.burst += size;
                return Poll::Ready(Some(Ok(resp)));
            }
            if this.burst > 0 {
                // Nothing more to send before the sources are heard (ACKs open the window).
                this.burst = 0;
                continue;
            }
            if !this.arm_timers() {
                return Poll::Pending;
            }
        }
    }
}

/// Closes the connection of a consumer whose ACK deadline is [`STALL_GRACE`] past due: the
/// stream was not polled to end itself, so HTTP/2 flow control holds it (the consumer stopped
/// reading). Ends when the stream is dropped.
///
/// It sleeps until the deadline it last read plus the grace, then reads it again. A deadline
/// only ever moves later (responses are queued in the order they are sent, and a fresh one
/// after an empty window is stamped now), so one that has passed its grace when read has been
/// overdue that long. With no response outstanding it looks again one ACK timeout later: a
/// response sent meanwhile is due no earlier than that.
async fn watchdog(
    mut deadline: watch::Receiver<Option<Instant>>,
    ack_timeout: Duration,
    closer: ConnectionCloser,
    identity: String,
    ack_timeouts: Counter,
) {
    loop {
        let current = *deadline.borrow_and_update();
        let now = Instant::now();
        let wake_at = match current {
            Some(at) if at + STALL_GRACE <= now => {
                ack_timeouts.inc();
                warn!(consumer = %identity, "hamlet consumer stopped reading and its ACK timeout passed; closing its connection");
                closer.close();
                return;
            }
            Some(at) => at + STALL_GRACE,
            None => now + ack_timeout,
        };
        tokio::select! {
            changed = deadline.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep_until(wake_at.into()) => {}
        }
    }
}

impl<W: Wire> Drop for ConsumerStream<W> {
    fn drop(&mut self) {
        if !self.done {
            info!(consumer = %self.identity, "hamlet consumer stream closed");
            self.stats.set_state(PeerState::Stopped);
        }
        self.stream_gauge.dec();
    }
}
