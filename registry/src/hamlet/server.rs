//! The Hamlet `DiscoveryService` (v1alpha1 and v1alpha2) over the catalog's local exports.
//!
//! One task per consumer stream drives a [`ConsumerState`]: the snapshot is computed from the
//! catalog at subscription time (no size cap), changes arrive as FQDNs on a broadcast channel and
//! are coalesced, a window of unacknowledged responses keeps fast consumers busy and a consumer
//! that never ACKs stalls only itself (and is closed with `Unavailable` after the ACK timeout).
//! Every response carries a real nonce; the empty-nonce ACKs Go peers send are accepted.
//! Only services whose allowed requesters admit the consumer's certificate identity are streamed.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};
use xcc_proto::federation::resourcediscovery::{v1alpha1 as rd1, v1alpha2 as rd2};
use xcc_proto::{
    FEDERATED_SERVICE_V1ALPHA1_URL, FEDERATED_SERVICE_V1ALPHA2_URL, SNAPSHOT_COMPLETE_URL,
    SNAPSHOT_MARKER_METADATA,
};

use super::consumer::{ConsumerState, Op, Outgoing, Reply};
use super::convert;
use crate::catalog::{Catalog, ServiceEntry};
use crate::metrics::{Api, ApiLabels, Metrics, OpLabel};
use crate::peers::{PeerKind, PeerState, PeerTable};

/// Tunables of the Hamlet server.
#[derive(Clone, Debug)]
pub struct HamletConfig {
    /// Responses that may await an ACK on one stream.
    pub window: usize,
    /// A stream whose oldest response stays unacknowledged this long is closed (`Unavailable`).
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
            ack_timeout: Duration::from_secs(120),
            subscribe_timeout: Duration::from_secs(30),
            // 64 KiB: a subscription or ACK is well under 1 KiB even with a long NACK message.
            max_request_bytes: 64 * 1024,
        }
    }
}

/// Responses buffered between a consumer's task and its HTTP/2 stream. The window
/// (unacknowledged responses) is separate and larger; this only keeps the encoder fed. Buffered
/// responses are not yet rendered (a nonce and a shared entry each). The size bounds how much a
/// stream pushes into the HTTP/2 and TLS layers at once: with 1,000 concurrent snapshots, 32
/// left the server at 214 MiB RSS after the burst (10k services), 8 at about 165 MiB, at the
/// price of slower concurrent snapshots (docs/benchmarks.md, Hamlet).
const RESPONSE_BUFFER: usize = 8;

/// Shared state of both API versions.
#[derive(Clone)]
pub struct HamletServer {
    catalog: Catalog,
    peers: PeerTable,
    metrics: Metrics,
    config: HamletConfig,
    cancel: CancellationToken,
}

impl HamletServer {
    pub fn new(
        catalog: Catalog,
        peers: PeerTable,
        metrics: Metrics,
        config: HamletConfig,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            catalog,
            peers,
            metrics,
            config,
            cancel,
        }
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

/// What a consumer message means, whatever the API version.
enum Incoming {
    Reply { nonce: String, nack: Option<String> },
}

/// Per-version encoding of requests and responses.
trait Wire: Send + 'static {
    type Req: Send + 'static;
    type Resp: Send + 'static;
    const API: Api;
    const RESOURCE_URL: &'static str;
    /// The subscription: resource URL and (v1alpha2) context.
    fn subscription(req: &Self::Req) -> Result<(String, String), Status>;
    fn incoming(req: Self::Req) -> Result<Incoming, Status>;
    fn render(out: &Outgoing, context: &str) -> Self::Resp;
}

struct W1;
impl Wire for W1 {
    type Req = rd1::StreamRequest;
    type Resp = rd1::StreamResponse;
    const API: Api = Api::V1alpha1;
    const RESOURCE_URL: &'static str = FEDERATED_SERVICE_V1ALPHA1_URL;

    fn subscription(req: &Self::Req) -> Result<(String, String), Status> {
        Ok((req.resource_url.clone(), String::new()))
    }

    fn incoming(req: Self::Req) -> Result<Incoming, Status> {
        check_url(&req.resource_url, Self::RESOURCE_URL)?;
        Ok(reply(req.response_nonce, req.status))
    }

    fn render(out: &Outgoing, _context: &str) -> Self::Resp {
        let (operation, resource) = match (out.op, &out.entry) {
            (Op::SnapshotComplete, _) | (_, None) => {
                (rd1::stream_response::Operation::Unknown, marker_any(out))
            }
            (op, Some(e)) => (
                match op {
                    Op::Create => rd1::stream_response::Operation::Create,
                    Op::Update => rd1::stream_response::Operation::Update,
                    _ => rd1::stream_response::Operation::Delete,
                },
                convert::any_v1alpha1(e),
            ),
        };
        rd1::StreamResponse {
            nonce: out.nonce.clone(),
            resource_url: resource.type_url.clone(),
            resource: Some(resource),
            operation: operation as i32,
        }
    }
}

struct W2;
impl Wire for W2 {
    type Req = rd2::BidirectionalStream;
    type Resp = rd2::BidirectionalStream;
    const API: Api = Api::V1alpha2;
    const RESOURCE_URL: &'static str = FEDERATED_SERVICE_V1ALPHA2_URL;

    fn subscription(req: &Self::Req) -> Result<(String, String), Status> {
        let r = req.request.as_ref().ok_or_else(|| {
            Status::invalid_argument("the first message must carry a StreamRequest")
        })?;
        Ok((r.resource_url.clone(), r.context.clone()))
    }

    fn incoming(req: Self::Req) -> Result<Incoming, Status> {
        let r = req
            .request
            .ok_or_else(|| Status::invalid_argument("expected a StreamRequest (ACK or NACK)"))?;
        check_url(&r.resource_url, Self::RESOURCE_URL)?;
        Ok(reply(r.response_nonce, r.status))
    }

    fn render(out: &Outgoing, context: &str) -> Self::Resp {
        let (operation, resource, id) = match (out.op, &out.entry) {
            (Op::SnapshotComplete, _) | (_, None) => (
                rd2::stream_response::Operation::Unknown,
                marker_any(out),
                String::new(),
            ),
            (op, Some(e)) => (
                if op == Op::Delete {
                    rd2::stream_response::Operation::Delete
                } else {
                    rd2::stream_response::Operation::Upsert
                },
                convert::any_v1alpha2(e),
                e.fqdn.clone(),
            ),
        };
        rd2::BidirectionalStream {
            request: None,
            response: Some(rd2::StreamResponse {
                nonce: out.nonce.clone(),
                resource_url: resource.type_url.clone(),
                resource_id: id,
                resource: Some(resource),
                operation: operation as i32,
                context: context.to_string(),
            }),
        }
    }
}

fn marker_any(out: &Outgoing) -> prost_types::Any {
    use prost::Message;
    prost_types::Any {
        type_url: SNAPSHOT_COMPLETE_URL.into(),
        value: xcc_proto::xcc::federation::v1::SnapshotComplete {
            generation: out.nonce.parse().unwrap_or(0),
        }
        .encode_to_vec(),
    }
}

fn check_url(got: &str, want: &str) -> Result<(), Status> {
    if got.is_empty() || got == want {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "resource_url {got:?} differs from the subscription {want:?}"
        )))
    }
}

fn reply(nonce: String, status: Option<xcc_proto::google::rpc::Status>) -> Incoming {
    let nack = status.filter(|s| s.code != 0).map(|s| {
        if s.message.is_empty() {
            format!("code {}", s.code)
        } else {
            format!("code {}: {}", s.code, s.message)
        }
    });
    Incoming::Reply { nonce, nack }
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
    let identity = peer.identity.name().to_string();
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
    if url != W::RESOURCE_URL {
        return Err(Status::invalid_argument(format!(
            "unsupported resource_url {url:?}; this service serves {:?}",
            W::RESOURCE_URL
        )));
    }
    let (tx, rx) = mpsc::channel(server.config.window.clamp(1, RESPONSE_BUFFER));
    let task = ConsumerTask {
        server: server.clone(),
        identity: identity.clone(),
        address: peer.remote_addr.to_string(),
        marker,
    };
    info!(consumer = %peer.identity, addr = %peer.remote_addr, api = ?W::API, marker, "hamlet consumer subscribed");
    tokio::spawn(task.run::<W>(requests, tx));
    // Render (and encode) each response only when the HTTP/2 stream takes it.
    let responses = ReceiverStream::new(rx).map(move |item| match item {
        Ok(out) => Ok(W::render(&out, &context)),
        Err(status) => Err(*status),
    });
    let mut response = Response::new(Box::pin(responses) as BoxStream<W::Resp>);
    if marker {
        response.metadata_mut().insert(
            SNAPSHOT_MARKER_METADATA,
            tonic::metadata::MetadataValue::from_static("1"),
        );
    }
    Ok(response)
}

struct ConsumerTask {
    server: HamletServer,
    identity: String,
    address: String,
    marker: bool,
}

impl ConsumerTask {
    async fn run<W: Wire>(
        self,
        mut requests: Streaming<W::Req>,
        tx: mpsc::Sender<Result<Outgoing, Box<Status>>>,
    ) {
        let server = &self.server;
        let catalog = &server.catalog;
        let metrics = &server.metrics;
        let stream_gauge = metrics
            .hamlet_streams
            .get_or_create(&ApiLabels { api: W::API })
            .clone();
        stream_gauge.inc();
        let guard = server.peers.register(
            PeerKind::HamletConsumer,
            format!("{}@{}", self.identity, self.address),
            self.identity.clone(),
            self.address.clone(),
        );
        let stats = guard.stats.clone();
        stats.set_state(PeerState::Connected);

        // Subscribe before listing so no change between the two is missed.
        let mut changes = catalog.subscribe_hamlet();
        let mut st = ConsumerState::for_requester(server.config.window, self.identity.clone());
        st.start_snapshot(catalog.hamlet_view(), self.marker);
        let identity = self.identity.clone();
        let lookup = |fqdn: &str| -> Option<Arc<ServiceEntry>> {
            catalog.hamlet_get(fqdn).filter(|e| e.admits(&identity))
        };
        let mut synced = st.snapshot_sent();
        if synced {
            stats.mark_synced();
        }

        // Two long-lived timers, re-armed only when a deadline moves earlier or one fires (a
        // fired timer re-checks its condition), rather than a new timer per loop turn.
        let ack_timeout = server.config.ack_timeout;
        let ack_timer = tokio::time::sleep(Duration::ZERO);
        let retry_timer = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(ack_timer, retry_timer);
        let mut ack_armed: Option<Instant> = None;
        let mut retry_armed: Option<Instant> = None;

        let end: Result<(), Status> = loop {
            match st.oldest_unacked().map(|t| t + ack_timeout) {
                None => ack_armed = None,
                Some(at) => {
                    if ack_armed.is_none_or(|armed| at < armed) {
                        ack_timer.as_mut().reset(at.into());
                        ack_armed = Some(at);
                    }
                }
            }
            match st.next_retry_at() {
                None => retry_armed = None,
                Some(at) => {
                    if retry_armed.is_none_or(|armed| at < armed) {
                        retry_timer.as_mut().reset(at.into());
                        retry_armed = Some(at);
                    }
                }
            }
            tokio::select! {
                biased;
                _ = server.cancel.cancelled() => {
                    break Err(Status::unavailable("registry shutting down"));
                }
                msg = requests.message() => match msg {
                    Ok(Some(req)) => match W::incoming(req) {
                        Ok(Incoming::Reply { nonce, nack: None }) => match st.on_ack(&nonce) {
                            Reply::UnknownNonce => {
                                metrics.hamlet_unknown_nonces.inc();
                                debug!(consumer = %self.identity, nonce, "ACK for no outstanding response");
                            }
                            _ => {
                                metrics.hamlet_acks.inc();
                                stats.acks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        },
                        Ok(Incoming::Reply { nonce, nack: Some(error) }) => {
                            match st.on_nack(&nonce, Instant::now()) {
                                Reply::UnknownNonce => {
                                    metrics.hamlet_unknown_nonces.inc();
                                }
                                reply => {
                                    metrics.hamlet_nacks.inc();
                                    stats.nacks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    stats.set_error(format!("NACK: {error}"));
                                    warn!(consumer = %self.identity, nonce, error, ?reply, "consumer rejected a resource; resending after backoff");
                                }
                            }
                        }
                        Err(status) => break Err(status),
                    },
                    Ok(None) => break Ok(()),
                    Err(status) => {
                        debug!(consumer = %self.identity, %status, "consumer stream ended");
                        break Ok(());
                    }
                },
                change = changes.recv() => match change {
                    Ok(fqdn) => {
                        st.mark_dirty(fqdn);
                        if st.wants_rebase() {
                            st.rebase(catalog.hamlet_view());
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        metrics.hamlet_resyncs.inc();
                        debug!(consumer = %self.identity, missed, "change feed lagged; resynchronising from current state");
                        st.mark_all_dirty(&catalog.hamlet_view());
                    }
                    Err(broadcast::error::RecvError::Closed) => break Ok(()),
                },
                _ = &mut retry_timer, if retry_armed.is_some() => {
                    retry_armed = None;
                    st.run_due_retries(Instant::now());
                }
                _ = &mut ack_timer, if ack_armed.is_some() => {
                    ack_armed = None;
                    if st.oldest_unacked().is_some_and(|t| t + ack_timeout <= Instant::now()) {
                        metrics.hamlet_ack_timeouts.inc();
                        break Err(Status::unavailable(format!(
                            "no ACK within {ack_timeout:?}; reconnect to resynchronise"
                        )));
                    }
                }
                permit = tx.reserve(), if st.can_send() => {
                    let Ok(permit) = permit else { break Ok(()) };
                    // Fill what the buffer has room for in one turn.
                    let mut permit = Some(permit);
                    while let Some(p) = permit.take() {
                        let Some(out) = st.next(Instant::now(), lookup) else { break };
                        metrics.response(match out.op {
                            Op::Create => OpLabel::Create,
                            Op::Update => OpLabel::Update,
                            Op::Delete => OpLabel::Delete,
                            Op::SnapshotComplete => OpLabel::Marker,
                        });
                        stats.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        p.send(Ok(out));
                        if st.can_send() {
                            permit = tx.try_reserve().ok();
                        }
                    }
                    stats.records.store(st.held() as u64, std::sync::atomic::Ordering::Relaxed);
                    if !synced && st.snapshot_sent() {
                        synced = true;
                        stats.mark_synced();
                    }
                }
            }
        };
        if let Err(status) = end {
            info!(consumer = %self.identity, code = ?status.code(), message = status.message(), "closing hamlet stream");
            let _ = tx.send(Err(Box::new(status))).await;
        } else {
            info!(consumer = %self.identity, "hamlet consumer disconnected");
        }
        stats.set_state(PeerState::Stopped);
        stream_gauge.dec();
        drop(guard);
    }
}
