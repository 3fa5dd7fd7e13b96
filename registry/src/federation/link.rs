//! The child side: one long-lived link to the parent registry. On every (re)connect it sends the
//! subtree membership, every subtree entry and the end-of-snapshot marker, re-issues the
//! persistent queries, then streams catalog changes up; messages from the parent go to the
//! [`Level`]. Reconnects use the same jittered exponential backoff as the Hamlet client.

use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tracing::{info, warn};
use xcc_proto::xcc::federation::v1 as fed;

use super::level::Level;
use crate::hamlet::client::Backoff;
use crate::peers::{PeerKind, PeerState, PeerTable};

/// Where the parent is.
#[derive(Clone)]
pub struct ParentSpec {
    /// Name of the RemoteRegistry (role Parent) that configured it.
    pub name: String,
    pub address: String,
    pub server_name: String,
    pub roots: Option<Arc<rustls::RootCertStore>>,
}

impl std::fmt::Debug for ParentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParentSpec")
            .field("name", &self.name)
            .field("address", &self.address)
            .field("server_name", &self.server_name)
            .field("custom_roots", &self.roots.is_some())
            .finish()
    }
}

/// Upward queue capacity; overflowing it forces a resynchronisation.
const UP_QUEUE: usize = 8192;

pub fn spawn(
    level: Level,
    tls: xcc_certs::reload::ReloadingTls,
    spec: ParentSpec,
    backoff: Backoff,
    peers: PeerTable,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(level, tls, spec, backoff, peers, cancel))
}

async fn run(
    level: Level,
    tls: xcc_certs::reload::ReloadingTls,
    spec: ParentSpec,
    backoff: Backoff,
    peers: PeerTable,
    cancel: CancellationToken,
) {
    let guard = peers.register(
        PeerKind::RemoteRegistry,
        spec.name.clone(),
        "",
        spec.address.clone(),
    );
    let stats = guard.stats.clone();
    let connector = match xcc_certs::client::TlsConnector::new(
        tls,
        spec.server_name.clone(),
        spec.roots.clone(),
    ) {
        Ok(c) => c,
        Err(e) => {
            stats.set_state(PeerState::Failed);
            stats.set_error(format!("TLS setup: {e}"));
            warn!(parent = %spec.name, error = %e, "cannot build the parent link");
            return;
        }
    };
    let channel = match Endpoint::from_shared(format!("http://{}", spec.address)) {
        Ok(e) => e
            .connect_timeout(Duration::from_secs(10))
            .http2_keep_alive_interval(Duration::from_secs(60))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true)
            .connect_with_connector_lazy(connector.clone()),
        Err(e) => {
            stats.set_state(PeerState::Failed);
            stats.set_error(format!("invalid address {:?}: {e}", spec.address));
            return;
        }
    };
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut attempt = 0u32;
    loop {
        stats.set_state(PeerState::Connecting);
        let (healthy, error, fatal) = tokio::select! {
            _ = cancel.cancelled() => break,
            r = session(&level, channel.clone(), &connector, &stats) => r,
        };
        level.parent_disconnected();
        if healthy {
            attempt = 0;
        }
        stats.set_error(error.clone());
        if fatal {
            stats.set_state(PeerState::Failed);
            warn!(parent = %spec.name, %error, "parent link stopped; fix the configuration and restart");
            break;
        }
        let delay = backoff.delay(attempt, &mut rng);
        attempt = attempt.saturating_add(1);
        stats.set_state(PeerState::Backoff);
        stats
            .reconnects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        info!(parent = %spec.name, %error, ?delay, "parent link down; reconnecting after backoff");
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    level.parent_disconnected();
    stats.set_state(PeerState::Stopped);
}

/// One connection. Returns (got far enough to reset the backoff, why it ended, fatal).
async fn session(
    level: &Level,
    channel: tonic::transport::Channel,
    connector: &xcc_certs::client::TlsConnector,
    stats: &crate::peers::PeerStats,
) -> (bool, String, bool) {
    let (up_tx, up_rx) = mpsc::channel::<fed::ChildMessage>(UP_QUEUE);
    // Subscribe before taking the snapshot so no change falls between them.
    let mut events = level.catalog().subscribe();
    if !level.begin_upward(up_tx.clone()) {
        return (
            false,
            "subtree snapshot larger than the upward queue".into(),
            false,
        );
    }
    let mut client = fed::federation_client::FederationClient::new(channel)
        .max_decoding_message_size(4 * 1024 * 1024);
    let mut inbound = match client.connect(ReceiverStream::new(up_rx)).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            // As with Hamlet: only Unauthenticated is final; a refused membership (cycle, a
            // cluster claimed twice) may be fixed on the other side, so keep retrying with backoff.
            let fatal = s.code() == tonic::Code::Unauthenticated;
            return (false, format!("{:?}: {}", s.code(), s.message()), fatal);
        }
    };
    if let Some(id) = connector.last_peer() {
        stats.set_identity(id.name());
    }
    stats.set_state(PeerState::Connected);
    stats.set_error("");
    stats.mark_synced();
    info!(cluster = %level.cluster(), "parent link established");
    loop {
        tokio::select! {
            m = inbound.message() => match m {
                Ok(Some(msg)) => {
                    if let Err(e) = level.on_parent_message(msg) {
                        return (false, e.to_string(), false);
                    }
                }
                Ok(None) => return (true, "parent closed the stream".into(), false),
                Err(s) => {
                    let fatal = s.code() == tonic::Code::Unauthenticated;
                    return (true, format!("{:?}: {}", s.code(), s.message()), fatal);
                }
            },
            ev = events.recv() => match ev {
                Ok(ev) => {
                    if let Some(m) = level.upward_event(&ev)
                        && up_tx.try_send(m).is_err()
                    {
                        return (true, "upward queue full; resynchronising".into(), false);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Missed changes: send the whole subtree again; the parent prunes stale
                    // entries at the end-of-snapshot marker.
                    for m in level.upward_snapshot() {
                        if up_tx.try_send(m).is_err() {
                            return (true, "upward queue full; resynchronising".into(), false);
                        }
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return (true, "catalog closed".into(), false),
            },
        }
    }
}
