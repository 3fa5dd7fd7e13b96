//! The child side: one long-lived link to the parent registry. On every (re)connect it sends the
//! subtree membership, every subtree entry and the end-of-snapshot marker, re-issues the
//! persistent queries, then streams catalog changes up ([`Upward`], paced by the parent's
//! reading: no subtree is too large to attach); messages from the parent go to the [`Level`].
//! Reconnects use the same jittered exponential backoff as the Hamlet client; a session reset
//! because a control message did not fit its queue reconnects at once.

use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tracing::{info, warn};
use xcc_proto::xcc::federation::v1 as fed;

use super::level::{Level, Uplink};
use super::upward::Upward;
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

/// Room for control messages (membership, queries, route acknowledgements) on the way up;
/// overflowing it resets the session, which reconnects at once.
const UP_QUEUE: usize = 8192;

/// Keep the link to the parent `spec` up until `cancel`.
pub async fn run(
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
        let End {
            healthy,
            error,
            fatal,
            reset,
        } = tokio::select! {
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
        stats
            .reconnects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if reset {
            info!(parent = %spec.name, %error, "parent session reset; reconnecting now");
            continue;
        }
        let delay = backoff.delay(attempt, &mut rng);
        attempt = attempt.saturating_add(1);
        stats.set_state(PeerState::Backoff);
        info!(parent = %spec.name, %error, ?delay, "parent link down; reconnecting after backoff");
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    level.parent_disconnected();
    stats.set_state(PeerState::Stopped);
}

/// How a session ended.
struct End {
    /// Got far enough to reset the backoff.
    healthy: bool,
    error: String,
    /// Unrecoverable without a configuration change.
    fatal: bool,
    /// A message did not fit the upward queue: reconnect at once, without backoff.
    reset: bool,
}

impl End {
    fn new(healthy: bool, error: impl Into<String>, fatal: bool) -> Self {
        Self {
            healthy,
            error: error.into(),
            fatal,
            reset: false,
        }
    }
}

/// One connection.
async fn session(
    level: &Level,
    channel: tonic::transport::Channel,
    connector: &xcc_certs::client::TlsConnector,
    stats: &crate::peers::PeerStats,
) -> End {
    let (up, control) = Uplink::new(UP_QUEUE);
    let reset = up.reset().clone();
    // Subscribe before the stream reads the catalog so no change falls between them.
    let events = level.catalog().subscribe();
    let queries = level.begin_upward(up);
    let upward = Upward::new(level.clone(), control, events, queries);
    let mut client = fed::federation_client::FederationClient::new(channel)
        .max_decoding_message_size(4 * 1024 * 1024);
    let mut inbound = match client.connect(upward).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            // As with Hamlet: only Unauthenticated is final; a refused membership (cycle, a
            // cluster claimed twice) may be fixed on the other side, so keep retrying with backoff.
            let fatal = s.code() == tonic::Code::Unauthenticated;
            return End::new(false, format!("{:?}: {}", s.code(), s.message()), fatal);
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
            _ = reset.cancelled() => {
                return End {
                    reset: true,
                    ..End::new(true, "the upward queue overflowed; resynchronising", false)
                };
            }
            m = inbound.message() => match m {
                Ok(Some(msg)) => {
                    if let Err(e) = level.on_parent_message(msg) {
                        return End::new(false, e.to_string(), false);
                    }
                }
                Ok(None) => return End::new(true, "parent closed the stream", false),
                Err(s) => {
                    let fatal = s.code() == tonic::Code::Unauthenticated;
                    return End {
                        // The parent ended the session to have it resent (its queue to us
                        // overflowed, or its policies changed): at once.
                        reset: s.code() == tonic::Code::Unavailable,
                        ..End::new(true, format!("{:?}: {}", s.code(), s.message()), fatal)
                    };
                }
            },
        }
    }
}
