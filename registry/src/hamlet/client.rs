//! The managed Hamlet client: one long-lived task and one gRPC channel per remote registry.
//!
//! It subscribes to `federation.types.v1alpha1.FederatedService`, writes what it receives to the
//! import sink (one batch at a time, costing what changed), only then sends exactly one ACK (or
//! NACK) per response, as Go servers require, and then mirrors the batch into the catalog.
//! Reconnects use jittered exponential backoff (floor 1 s, cap configurable); `Unauthenticated`
//! is not retried. After every (re)connect the remote's snapshot is applied again and imports the
//! remote no longer has are removed — after the end-of-snapshot marker when the server offers it,
//! else by the timing rule of [`super::sweep`] — touching only this remote's records.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};
use xcc_certs::explain::{Repeats, repeats_suffix};
use xcc_controller::tasks::{Spawner, TaskHandle};
use xcc_proto::federation::resourcediscovery::v1alpha1 as rd1;
use xcc_proto::{FEDERATED_SERVICE_V1ALPHA1_URL, SNAPSHOT_MARKER_METADATA};

use super::batch::{Applied, Rules, apply_batch};
use super::convert::Imported;
use super::sweep::{SweepClock, SweepRule};
use crate::catalog::{Catalog, ServiceEntry, ServiceKey, Source};
use crate::metrics::Metrics;
use crate::peers::{PeerKind, PeerState, PeerStats, PeerTable};

/// What to import from one remote registry (a RemoteRegistry's spec, resolved).
#[derive(Clone)]
pub struct RemoteSpec {
    /// RemoteRegistry name; imports are owned by it.
    pub name: String,
    /// `host:port` of the remote Hamlet server.
    pub address: String,
    /// Name the server certificate must carry (and SNI).
    pub server_name: String,
    /// CA bundle for the server; `None` = this registry's own CA.
    pub roots: Option<Arc<rustls::RootCertStore>>,
    /// Import filter (`allowedDomains`, matched as XCC v1 does); empty = everything.
    pub allowed_domains: Vec<String>,
}

impl PartialEq for RemoteSpec {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.address == other.address
            && self.server_name == other.server_name
            && self.allowed_domains == other.allowed_domains
            && match (&self.roots, &other.roots) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a.roots == b.roots,
                _ => false,
            }
    }
}

/// Client tunables.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub backoff: Backoff,
    /// With a plain Hamlet server (no end-of-snapshot marker): remove stale imports once the
    /// stream has been quiet this long after the last ACK ([`SweepRule`]).
    pub quiet_period: Duration,
    /// ... or at the latest this long after connecting, once the server's snapshot is over,
    /// even if changes keep the stream from ever being quiet ([`SweepRule`]).
    pub max_sweep_delay: Duration,
    /// Largest resource accepted from the remote; a larger one is NACKed with
    /// `RESOURCE_EXHAUSTED` and costs only itself. Messages up to [`TRANSPORT_SLACK`] times this
    /// are still read off the wire so that they can be NACKed; beyond that the stream ends.
    pub max_response_bytes: usize,
    /// Responses applied (and persisted) together before their ACKs are sent.
    pub max_batch: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff {
                // The Hamlet spec's floor for Unavailable retries.
                min: Duration::from_secs(1),
                max: Duration::from_secs(120),
            },
            quiet_period: Duration::from_secs(10),
            // Bounds staleness under churn; three quiet periods, so a snapshot the server sends
            // in bursts still has time to finish (XCC v1 waited 300 s after the first record).
            max_sweep_delay: Duration::from_secs(30),
            // 4 MiB: a FederatedService is a few hundred bytes; this is gRPC's usual default.
            max_response_bytes: 4 * 1024 * 1024,
            max_batch: 512,
        }
    }
}

/// How much larger than `max_response_bytes` a message may be and still be read (and NACKed)
/// rather than end the stream: bounds the memory one response can take at 4x the entry limit.
pub const TRANSPORT_SLACK: usize = 4;

/// Reconnect delays ([`Backoff::jittered`]).
pub use xcc_controller::backoff::Backoff;

/// Where imports are kept durably.
pub trait ImportSink: Send + Sync + 'static {
    /// Store the complete set of this remote's imports; returns once they are stored.
    fn persist<'a>(
        &'a self,
        remote: &'a str,
        imports: &'a BTreeMap<String, Imported>,
    ) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Store a batch: `changed` names the FQDNs that were upserted (present in `imports`) or
    /// removed (absent) since the previous call. A sink that can write only the change does so
    /// (its cost is the batch's, not the whole set's); the default rewrites everything.
    fn persist_changes<'a>(
        &'a self,
        remote: &'a str,
        imports: &'a BTreeMap<String, Imported>,
        changed: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        let _ = changed;
        self.persist(remote, imports)
    }

    /// Put everything stored so far on stable storage now (at an end-of-snapshot marker and on
    /// shutdown). A sink whose stores are durable when they return has nothing to do.
    fn flush<'a>(&'a self, remote: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        let _ = remote;
        async { Ok(()) }.boxed()
    }
}

/// A sink that keeps nothing beyond the catalog (tests, ephemeral registries).
pub struct MemorySink;

impl ImportSink for MemorySink {
    fn persist<'a>(
        &'a self,
        _remote: &'a str,
        _imports: &'a BTreeMap<String, Imported>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        async { Ok(()) }.boxed()
    }
}

/// Shared parts every client needs.
#[derive(Clone)]
pub struct ClientContext {
    pub catalog: Catalog,
    pub peers: PeerTable,
    pub metrics: Metrics,
    pub tls: xcc_certs::reload::ReloadingTls,
    pub sink: Arc<dyn ImportSink>,
    pub config: ClientConfig,
}

/// Handle of a running client: update its spec or stop it.
pub struct ClientHandle {
    spec: watch::Sender<RemoteSpec>,
    task: TaskHandle,
}

impl ClientHandle {
    /// Replace the spec; the client redials only if something changed.
    pub fn update(&self, spec: RemoteSpec) {
        self.spec.send_if_modified(|cur| {
            if *cur == spec {
                false
            } else {
                *cur = spec;
                true
            }
        });
    }

    pub fn spec(&self) -> RemoteSpec {
        self.spec.borrow().clone()
    }

    /// Stop the client and wait for it. Its imports stay (the caller decides about them).
    pub async fn stop(self) {
        self.task.stop().await;
    }
}

/// Start a managed client for `spec`, supervised by `spawner` (it runs until stopped or until
/// the process shuts down), on the import thread ([`super::import_thread`]).
pub fn spawn(ctx: ClientContext, spec: RemoteSpec, spawner: &Spawner) -> ClientHandle {
    let name = format!("import client {}", spec.name);
    let (tx, rx) = watch::channel(spec);
    let task = spawner.spawn_stoppable(name, |cancel| {
        super::import_thread::run(cancel, move |token| run(ctx, rx, token)).map(Ok)
    });
    ClientHandle { spec: tx, task }
}

/// Why a stream ended.
enum End {
    Cancelled,
    Redial,
    /// Retry after backoff; `healthy` resets the backoff (the stream got somewhere).
    Retry {
        error: String,
        healthy: bool,
        /// A TLS or wrong-port failure: logged at WARN, repeats (counted under this key) once a
        /// minute.
        loud: Option<String>,
    },
    /// Do not retry until the spec changes.
    Fatal(String),
}

async fn run(
    ctx: ClientContext,
    mut spec_rx: watch::Receiver<RemoteSpec>,
    cancel: CancellationToken,
) {
    'spec: loop {
        let spec = spec_rx.borrow_and_update().clone();
        let guard = ctx.peers.register(
            PeerKind::RemoteRegistry,
            spec.name.clone(),
            "",
            spec.address.clone(),
        );
        let stats = guard.stats.clone();
        let channel = match build_channel(&ctx, &spec) {
            Ok(c) => c,
            Err(e) => {
                // The reason first: whoever sees the state change sees why.
                stats.set_error(e.to_string());
                stats.set_state(PeerState::Failed);
                warn!(remote = %spec.name, error = %e, "cannot build a channel; waiting for a spec change");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = spec_rx.changed() => { if r.is_err() { return } continue 'spec; }
                }
            }
        };
        let mut delays = ctx.config.backoff.jittered();
        let repeats = Repeats::default();
        loop {
            stats.set_state(PeerState::Connecting);
            let end = tokio::select! {
                _ = cancel.cancelled() => End::Cancelled,
                r = spec_rx.changed() => if r.is_err() { End::Cancelled } else { End::Redial },
                end = stream_once(&ctx, &spec, channel.0.clone(), &channel.1, &stats) => end,
            };
            match end {
                End::Cancelled => {
                    stats.set_state(PeerState::Stopped);
                    flush(&ctx, &spec).await;
                    return;
                }
                End::Redial => {
                    info!(remote = %spec.name, "remote registry spec changed; redialling");
                    continue 'spec;
                }
                End::Fatal(error) => {
                    stats.set_error(error.clone());
                    stats.set_state(PeerState::Failed);
                    warn!(remote = %spec.name, %error, "not retrying until the RemoteRegistry changes");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        r = spec_rx.changed() => { if r.is_err() { return } continue 'spec; }
                    }
                }
                End::Retry {
                    error,
                    healthy,
                    loud,
                } => {
                    if healthy {
                        delays = ctx.config.backoff.jittered();
                    }
                    let delay = delays.next_delay();
                    stats.set_error(error.clone());
                    stats.set_state(PeerState::Backoff);
                    stats.reconnects.fetch_add(1, Ordering::Relaxed);
                    ctx.metrics.client_reconnects.inc();
                    match loud.map(|key| repeats.check(&key)) {
                        None => {
                            info!(remote = %spec.name, %error, ?delay, "import stream ended; reconnecting after backoff")
                        }
                        Some(Some(held)) => {
                            warn!(remote = %spec.name, ?delay, "cannot import: {error}{}; reconnecting after backoff", repeats_suffix(held))
                        }
                        Some(None) => {} // Counted; reported with the next line about it.
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => { stats.set_state(PeerState::Stopped); flush(&ctx, &spec).await; return; }
                        r = spec_rx.changed() => { if r.is_err() { return } continue 'spec; }
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }
}

/// Why the client cannot talk to a remote until its spec changes, or cannot store a batch.
#[derive(Debug, thiserror::Error)]
enum ClientError {
    #[error("TLS setup: {0}")]
    Tls(#[from] xcc_certs::CertError),
    #[error("invalid address {address:?}: {source}")]
    Address {
        address: String,
        source: tonic::transport::Error,
    },
    #[error("persisting imports: {0:#}")]
    Persist(anyhow::Error),
}

fn build_channel(
    ctx: &ClientContext,
    spec: &RemoteSpec,
) -> Result<(Channel, xcc_certs::client::TlsConnector), ClientError> {
    let connector = xcc_certs::client::TlsConnector::new(
        ctx.tls.clone(),
        spec.server_name.clone(),
        spec.roots.clone(),
    )?;
    let endpoint = Endpoint::from_shared(format!("http://{}", spec.address))
        .map_err(|source| ClientError::Address {
            address: spec.address.clone(),
            source,
        })?
        .connect_timeout(Duration::from_secs(10))
        // Go servers enforce a 40 s minimum between client pings (their keepalive policy).
        .http2_keep_alive_interval(Duration::from_secs(60))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    Ok((
        endpoint.connect_with_connector_lazy(connector.clone()),
        connector,
    ))
}

pub(crate) fn entry_for(remote: &str, imported: &Imported) -> ServiceEntry {
    ServiceEntry {
        key: ServiceKey::new(remote, "", imported.fqdn.clone()),
        source: Source::Remote(remote.to_string()),
        fqdn: imported.fqdn.as_str().into(),
        endpoints: imported.endpoints.clone(),
        ports: imported
            .ports
            .iter()
            .map(crate::catalog::NamedPort::of)
            .collect(),
        labels: (&imported.labels).into(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    }
}

/// This remote's imports as the catalog holds them (loaded from the store at start-up).
fn current_imports(catalog: &Catalog, remote: &str) -> BTreeMap<String, Imported> {
    catalog
        .list(&crate::catalog::ListFilter {
            source: Some(Source::Remote(remote.to_string())),
            ..Default::default()
        })
        .into_iter()
        .map(|e| (e.fqdn.to_string(), Imported::of_entry(&e)))
        .collect()
}

/// Subscribe: the request stream (its first request already queued), the response stream and
/// whether the server sends the snapshot-complete marker; the stream's end when that fails.
async fn open(
    ctx: &ClientContext,
    spec: &RemoteSpec,
    channel: Channel,
    connector: &xcc_certs::client::TlsConnector,
    stats: &Arc<PeerStats>,
) -> Result<
    (
        mpsc::Sender<rd1::StreamRequest>,
        tonic::Streaming<rd1::StreamResponse>,
        bool,
    ),
    End,
> {
    let (req_tx, req_rx) = mpsc::channel::<rd1::StreamRequest>(ctx.config.max_batch + 1);
    let _ = req_tx.try_send(rd1::StreamRequest {
        resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        response_nonce: String::new(),
        status: None,
    });
    let mut request = tonic::Request::new(ReceiverStream::new(req_rx));
    request.metadata_mut().insert(
        SNAPSHOT_MARKER_METADATA,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let mut client = rd1::discovery_service_client::DiscoveryServiceClient::new(channel)
        .max_decoding_message_size(
            ctx.config
                .max_response_bytes
                .saturating_mul(TRANSPORT_SLACK),
        );
    let response = match client.establish_stream(request).await {
        Ok(r) => r,
        Err(status) => return Err(end_for(spec, status, false)),
    };
    let marker = response
        .metadata()
        .get(SNAPSHOT_MARKER_METADATA)
        .is_some_and(|v| v.as_bytes() == b"1");
    let stream = response.into_inner();
    if let Some(identity) = connector.last_peer() {
        stats.set_identity(identity.name());
    }
    stats.set_state(PeerState::Connected);
    stats.set_error("");
    info!(remote = %spec.name, marker, "import stream established");
    Ok((req_tx, stream, marker))
}

/// One stream: subscribe, apply batches, ACK, sweep stale imports once per connection.
async fn stream_once(
    ctx: &ClientContext,
    spec: &RemoteSpec,
    channel: Channel,
    connector: &xcc_certs::client::TlsConnector,
    stats: &Arc<PeerStats>,
) -> End {
    let (req_tx, mut stream, marker) = match open(ctx, spec, channel, connector, stats).await {
        Ok(opened) => opened,
        Err(end) => return end,
    };

    let mut imports = current_imports(&ctx.catalog, &spec.name);
    stats.records.store(imports.len() as u64, Ordering::Relaxed);
    let mut seen: HashSet<String> = HashSet::new();
    // Propagation is measured for changes that arrive live (after the snapshot: its marker, or
    // the sweep that stands for it) and for snapshot entries stamped after this stream started;
    // a reconnect's re-sent snapshot is not a fresh propagation.
    let started = std::time::SystemTime::now();
    let mut live = false;
    let mut swept = false;
    let mut healthy = false;
    let mut clock = SweepClock::new(
        SweepRule::new(ctx.config.quiet_period, ctx.config.max_sweep_delay),
        tokio::time::Instant::now(),
    );

    loop {
        let first = tokio::select! {
            m = stream.message() => m,
            _ = tokio::time::sleep_until(clock.deadline()), if !marker && !swept => {
                swept = true;
                live = true;
                healthy = true;
                sweep(ctx, spec, &mut imports, &seen, stats).await;
                continue;
            }
        };
        let mut batch = match first {
            Ok(Some(m)) => vec![m],
            Ok(None) => {
                return End::Retry {
                    error: "remote closed the stream".into(),
                    healthy,
                    loud: None,
                };
            }
            Err(status) => return end_for(spec, status, healthy),
        };
        if marker {
            // A windowed server (one that sends the marker) has more on the way: let the
            // connection read what has arrived, so that the batch holds it (fewer and larger
            // journal appends). A lock-step server sends nothing more before this is ACKed.
            tokio::task::yield_now().await;
        }
        while batch.len() < ctx.config.max_batch {
            match stream.message().now_or_never() {
                Some(Ok(Some(m))) => batch.push(m),
                _ => break,
            }
        }
        clock.on_message(tokio::time::Instant::now());

        let Applied {
            replies,
            changed,
            fresh,
            marker_seen,
            rejected,
        } = apply_batch(
            batch,
            &mut imports,
            &mut seen,
            &Rules {
                remote: &spec.name,
                max_resource_bytes: ctx.config.max_response_bytes,
                allowed_domains: &spec.allowed_domains,
                live,
                started,
            },
        );
        ctx.metrics.client_imports_rejected.inc_by(rejected);
        // Stored, then ACKed, then mirrored into the catalog: a lock-step server prepares its
        // next response while the catalog is updated.
        if store_then_answer(ctx, spec, &imports, &changed, replies, &req_tx, stats)
            .await
            .is_err()
        {
            return End::Retry {
                error: "request stream closed".into(),
                healthy,
                loud: None,
            };
        }
        // Let the ACKs reach the socket before the catalog work below: they are written by the
        // HTTP/2 tasks, which this worker would otherwise run only after the mirror (and after
        // whatever the catalog's change wakes), delaying a lock-step server's next response.
        tokio::task::yield_now().await;
        // Observed as the batch is applied, before the catalog shows it (so whoever sees the
        // import in the catalog also sees its observation).
        observe_propagation(ctx, spec, fresh);
        if !changed.is_empty() {
            mirror(ctx, spec, &imports, &changed, stats);
        }
        if marker_seen && !swept {
            swept = true;
            sweep(ctx, spec, &mut imports, &seen, stats).await;
        }
        if marker_seen {
            // A complete snapshot is on stable storage at once, not within the flush interval.
            flush(ctx, spec).await;
        }
        if marker_seen || swept {
            live = true;
            healthy = true;
            stats.mark_synced();
        }
        clock.on_answered(tokio::time::Instant::now());
    }
}

/// Observe the propagation of a batch's fresh changes, labelled with the RemoteRegistry's name
/// (as the binder labels its own observations of the same imports).
fn observe_propagation(ctx: &ClientContext, spec: &RemoteSpec, fresh: Vec<std::time::SystemTime>) {
    let now = std::time::SystemTime::now();
    for stamp in fresh {
        let l = ctx.metrics.propagation.observe(&spec.name, stamp, now);
        if l.is_skew() {
            debug!(remote = %spec.name, latency = ?l, "propagation stamp off the local clock");
        }
    }
}

/// Put what the sink holds for `spec` on stable storage now (a failure is logged and counted;
/// the sink retries with its next flush).
async fn flush(ctx: &ClientContext, spec: &RemoteSpec) {
    if let Err(e) = ctx.sink.flush(&spec.name).await {
        ctx.metrics.store_errors.inc();
        warn!(remote = %spec.name, error = %format!("{e:#}"), "flushing stored imports failed");
    }
}

/// Persist a batch. This and [`mirror`] cost the size of `changed` (the FQDNs upserted, when in
/// `imports`, or removed), not the size of `imports`.
async fn store(
    ctx: &ClientContext,
    spec: &RemoteSpec,
    imports: &BTreeMap<String, Imported>,
    changed: &BTreeSet<String>,
) -> Result<(), ClientError> {
    ctx.sink
        .persist_changes(&spec.name, imports, changed)
        .await
        .map_err(|e| {
            ctx.metrics.store_errors.inc();
            ClientError::Persist(e)
        })
}

/// Store a batch (when it changed anything), then send its replies: no ACK leaves before the
/// sink holds the batch (the file sink: on stable storage). `Err` when the stream is gone.
async fn store_then_answer(
    ctx: &ClientContext,
    spec: &RemoteSpec,
    imports: &BTreeMap<String, Imported>,
    changed: &BTreeSet<String>,
    replies: Vec<rd1::StreamRequest>,
    req_tx: &mpsc::Sender<rd1::StreamRequest>,
    stats: &PeerStats,
) -> Result<(), mpsc::error::SendError<rd1::StreamRequest>> {
    if !changed.is_empty() {
        store_until_stored(ctx, spec, imports, changed, stats).await;
    }
    for reply in replies {
        req_tx.send(reply).await?;
    }
    Ok(())
}

/// Mirror a stored batch into the catalog.
fn mirror(
    ctx: &ClientContext,
    spec: &RemoteSpec,
    imports: &BTreeMap<String, Imported>,
    changed: &BTreeSet<String>,
    stats: &PeerStats,
) {
    let mut upserts = Vec::new();
    let mut removals = Vec::new();
    for fqdn in changed {
        match imports.get(fqdn) {
            Some(i) => upserts.push(entry_for(&spec.name, i)),
            None => removals.push(ServiceKey::new(&spec.name, "", fqdn.clone())),
        }
    }
    let (up, rm) =
        ctx.catalog
            .update_source(&Source::Remote(spec.name.clone()), upserts, &removals);
    ctx.metrics.client_imports_applied.inc_by((up + rm) as u64);
    stats.records.store(imports.len() as u64, Ordering::Relaxed);
}

/// [`store`] until the store takes the batch. The ACKs wait meanwhile (retried with the client's
/// backoff, logged at WARN): a full disk neither drops the stream nor makes the client download
/// the remote's snapshot again; the server holds the unacknowledged responses (or ends the stream
/// on its ACK timeout, after which the client reconnects as usual).
async fn store_until_stored(
    ctx: &ClientContext,
    spec: &RemoteSpec,
    imports: &BTreeMap<String, Imported>,
    changed: &BTreeSet<String>,
    stats: &PeerStats,
) {
    let mut attempt = 0u32;
    let mut delays = ctx.config.backoff.jittered();
    while let Err(error) = store(ctx, spec, imports, changed).await {
        let delay = delays.next_delay();
        attempt = attempt.saturating_add(1);
        stats.set_error(error.to_string());
        warn!(remote = %spec.name, %error, ?delay, attempt, "cannot store imports; holding the ACKs and retrying");
        tokio::time::sleep(delay).await;
    }
    if attempt > 0 {
        stats.set_error("");
        info!(remote = %spec.name, attempt, "imports stored after retrying");
    }
}

async fn sweep(
    ctx: &ClientContext,
    spec: &RemoteSpec,
    imports: &mut BTreeMap<String, Imported>,
    seen: &HashSet<String>,
    stats: &PeerStats,
) {
    let stale: BTreeSet<String> = imports
        .keys()
        .filter(|fqdn| !seen.contains(*fqdn))
        .cloned()
        .collect();
    if !stale.is_empty() {
        imports.retain(|fqdn, _| seen.contains(fqdn));
        info!(remote = %spec.name, removed = stale.len(), "removing imports the remote no longer exports");
        ctx.metrics.client_stale_removed.inc_by(stale.len() as u64);
        store_until_stored(ctx, spec, imports, &stale, stats).await;
        mirror(ctx, spec, imports, &stale, stats);
    }
}

fn end_for(spec: &RemoteSpec, status: tonic::Status, healthy: bool) -> End {
    // tonic reports a message over the decoding limit as OUT_OF_RANGE; it is a size limit.
    let code = match status.code() {
        Code::OutOfRange if status.message().contains("too large") => Code::ResourceExhausted,
        c => c,
    };
    let peer = format!("remote {} ({})", spec.name, spec.address);
    let (error, loud) = match crate::dial_errors::status_words(&status, &peer, "the Hamlet API") {
        (words, Some(key)) => (words, Some(key)),
        (_, None) => (format!("{code:?}: {}", status.message()), None),
    };
    match status.code() {
        Code::Unauthenticated => End::Fatal(error),
        _ => End::Retry {
            error,
            healthy,
            loud,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hamlet::batch::ack;

    /// A client context around `sink` (TLS material is needed to build one; nothing dials).
    fn context(dir: &std::path::Path, sink: Arc<dyn ImportSink>) -> ClientContext {
        use xcc_certs::pki::{Ca, IssueRequest, write_issued};
        let ca = Ca::generate("xcc.test").expect("CA");
        let issued = ca.issue(&IssueRequest::cluster("west")).expect("issue");
        let files = write_issued(&dir.join("tls"), &ca, &issued).expect("write");
        ClientContext {
            catalog: Catalog::new(),
            peers: Default::default(),
            metrics: Default::default(),
            tls: xcc_certs::reload::ReloadingTls::load(files).expect("tls"),
            sink,
            config: ClientConfig {
                backoff: Backoff {
                    min: Duration::from_millis(1),
                    max: Duration::from_millis(1),
                },
                ..Default::default()
            },
        }
    }

    /// The ACKs of a batch leave once the batch is in the journal (page cache), before any
    /// flush; the flush (an injected syncer, failing once like a full disk) follows within the
    /// flush interval and is retried until it succeeds; the sink's `flush` (the client's, at a
    /// snapshot marker and on shutdown) syncs at once.
    #[tokio::test]
    async fn a_batch_is_acknowledged_once_journaled_and_flushed_within_the_interval() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (req_tx, req_rx) = mpsc::channel::<rd1::StreamRequest>(8);
        let req_rx = Arc::new(std::sync::Mutex::new(req_rx));
        let log = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let (synced_tx, mut synced) = tokio::sync::watch::channel(0usize);
        let journal = dir.path().join("imports/east.journal");
        let (rx, l, path) = (req_rx.clone(), log.clone(), journal.clone());
        let sink = crate::store::file::FileImportSink::new(dir.path(), "ns")
            .expect("sink")
            .with_syncer(move |file| {
                let mut log = l.lock().expect("log");
                while let Ok(reply) = rx.lock().expect("rx").try_recv() {
                    log.push(format!("reply {}", reply.response_nonce));
                }
                let bytes = std::fs::read(&path)?;
                let lines = xcc_proto::import_journal::changes(&bytes).count();
                if !log.iter().any(|l| l.starts_with("sync failed")) {
                    log.push(format!("sync failed ({lines} lines written)"));
                    return Err(std::io::Error::other("No space left on device"));
                }
                log.push(format!("sync ({lines} lines written)"));
                synced_tx.send_modify(|n| *n += 1);
                file.sync_data()
            });
        let sink = Arc::new(sink);
        let ctx = context(dir.path(), sink.clone());
        let spec = RemoteSpec {
            name: "east".into(),
            address: "127.0.0.1:1".into(),
            server_name: "localhost".into(),
            roots: None,
            allowed_domains: vec![],
        };
        let mut imports = BTreeMap::new();
        for fqdn in ["a.x.test", "b.x.test"] {
            imports.insert(
                fqdn.to_string(),
                Imported {
                    fqdn: fqdn.into(),
                    raw_fqdn: fqdn.into(),
                    endpoints: vec![crate::catalog::Endpoint {
                        address: "10.0.0.1".into(),
                        port: 443,
                    }],
                    labels: BTreeMap::new(),
                    cluster: None,
                    ports: vec![],
                },
            );
        }
        let changed: BTreeSet<String> = imports.keys().cloned().collect();
        let guard = ctx.peers.register(
            PeerKind::RemoteRegistry,
            spec.name.clone(),
            "",
            spec.address.clone(),
        );
        let stats = guard.stats.clone();
        store_then_answer(
            &ctx,
            &spec,
            &imports,
            &changed,
            vec![ack("n1".into()), ack("n2".into())],
            &req_tx,
            &stats,
        )
        .await
        .expect("answered");
        // The replies were sent before any flush: the syncer finds them first.
        let drain = || {
            while let Ok(reply) = req_rx.lock().expect("rx").try_recv() {
                log.lock()
                    .expect("log")
                    .push(format!("reply {}", reply.response_nonce));
            }
        };
        drain();
        tokio::time::timeout(Duration::from_secs(30), synced.wait_for(|n| *n == 1))
            .await
            .expect("flushed within the interval (bounded wait)")
            .expect("syncer alive");
        assert_eq!(
            *log.lock().expect("log"),
            [
                "reply n1",
                "reply n2",
                "sync failed (2 lines written)",
                "sync (2 lines written)"
            ]
        );
        // Nothing is written or synced by the flush itself; a pending append is synced by it.
        let mut more = imports.clone();
        let c = more["a.x.test"].clone();
        more.insert(
            "c.x.test".into(),
            Imported {
                fqdn: "c.x.test".into(),
                raw_fqdn: "c.x.test".into(),
                ..c
            },
        );
        let changed: BTreeSet<String> = ["c.x.test".to_string()].into();
        ctx.sink
            .persist_changes(&spec.name, &more, &changed)
            .await
            .expect("stored");
        ctx.sink.flush(&spec.name).await.expect("flushed");
        assert_eq!(
            log.lock().expect("log").last().map(String::as_str),
            Some("sync (3 lines written)")
        );
        assert_eq!(*synced.borrow(), 2);
        assert_eq!(ctx.metrics.store_errors.get(), 0);
    }
}
