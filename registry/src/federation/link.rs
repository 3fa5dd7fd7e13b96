//! The child side: one long-lived link to the parent registry. On every (re)connect it sends the
//! subtree membership, every subtree entry and the end-of-snapshot marker, re-issues the
//! persistent queries, then streams catalog changes up ([`Upward`], paced by the parent's
//! reading: no subtree is too large to attach); messages from the parent go to the [`Level`].
//! Reconnects use the same jittered exponential backoff as the Hamlet client; a session reset
//! (a control message did not fit a queue, the parent's policies changed) reconnects at once if
//! the session had stayed up for [`STABLE_SESSION`], and backs off like any other end if not, so
//! a parent that keeps resetting sessions is not redialled in a tight loop.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tracing::{info, warn};
use xcc_certs::explain::repeats_suffix;
use xcc_proto::xcc::federation::v1 as fed;

use super::level::Level;
use super::queues::Uplink;
use super::upward::Upward;
use crate::hamlet::client::Backoff;
use crate::peers::{PeerKind, PeerState, PeerStats, PeerTable};

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

/// A session that stayed up this long went well: the backoff starts again from its floor, and a
/// reset that ends it reconnects at once.
const STABLE_SESSION: Duration = Duration::from_secs(30);

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
    let peer = format!("parent {} ({})", spec.name, spec.address);
    reconnect(&spec.name, backoff, &stats, &cancel, || async {
        let end = session(&level, channel.clone(), &connector, &stats, &peer).await;
        level.parent_disconnected();
        end
    })
    .await;
    level.parent_disconnected();
    stats.set_state(PeerState::Stopped);
}

/// Runs `session` again and again, waiting per `backoff` between two, until `cancel` fires or a
/// session ends fatally.
async fn reconnect<S, F>(
    parent: &str,
    backoff: Backoff,
    stats: &PeerStats,
    cancel: &CancellationToken,
    mut session: S,
) where
    S: FnMut() -> F,
    F: Future<Output = End>,
{
    let mut delays = backoff.jittered();
    let repeats = xcc_certs::explain::Repeats::default();
    loop {
        stats.set_state(PeerState::Connecting);
        let started = tokio::time::Instant::now();
        let End {
            healthy,
            error,
            fatal,
            reset,
            loud,
        } = tokio::select! {
            _ = cancel.cancelled() => break,
            r = session() => r,
        };
        let stable = healthy && started.elapsed() >= STABLE_SESSION;
        if stable {
            delays = backoff.jittered();
        }
        stats.set_error(error.clone());
        if fatal {
            stats.set_state(PeerState::Failed);
            warn!(parent, %error, "parent link stopped; fix the configuration and restart");
            break;
        }
        stats
            .reconnects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if reset && stable {
            info!(parent, %error, "parent session reset; reconnecting now");
            continue;
        }
        let delay = delays.next_delay();
        stats.set_state(PeerState::Backoff);
        match loud.map(|key| repeats.check(&key)) {
            None => info!(parent, %error, ?delay, "parent link down; reconnecting after backoff"),
            Some(Some(held)) => warn!(
                parent,
                ?delay,
                "parent link down: {error}{}; reconnecting after backoff",
                repeats_suffix(held)
            ),
            Some(None) => {} // Counted; reported with the next line about it.
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// How a session ended.
struct End {
    /// Connected: once the session has also stayed up for [`STABLE_SESSION`], the backoff is
    /// reset.
    healthy: bool,
    error: String,
    /// Unrecoverable without a configuration change.
    fatal: bool,
    /// Ended to be resent from scratch (a queue overflowed, the parent's policies changed):
    /// reconnect at once after a [`STABLE_SESSION`].
    reset: bool,
    /// A TLS or wrong-port failure: logged at WARN, repeats (counted under this key) once a
    /// minute.
    loud: Option<String>,
}

impl End {
    fn new(healthy: bool, error: impl Into<String>, fatal: bool) -> Self {
        Self {
            healthy,
            error: error.into(),
            fatal,
            reset: false,
            loud: None,
        }
    }
}

/// One connection.
async fn session(
    level: &Level,
    channel: tonic::transport::Channel,
    connector: &xcc_certs::client::TlsConnector,
    stats: &crate::peers::PeerStats,
    peer: &str,
) -> End {
    // Room for control messages (membership, queries, route acknowledgements) on the way up,
    // bounded in messages and bytes (`Level::queue_limits`); overflowing it resets the session.
    let (up, control) = Uplink::for_level(level);
    let reset = up.reset().clone();
    let why = up.clone();
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
            let (error, loud) = crate::dial_errors::status_words(&s, peer, "the federation API");
            return End {
                loud,
                ..End::new(false, error, fatal)
            };
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
                    ..End::new(
                        true,
                        why.why().unwrap_or_else(|| "the upward queue overflowed; resynchronising".into()),
                        false,
                    )
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
                        // overflowed, or its policies changed).
                        reset: s.code() == tonic::Code::Unavailable,
                        ..End::new(true, format!("{:?}: {}", s.code(), s.message()), fatal)
                    };
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    const BACKOFF: Backoff = Backoff {
        min: Duration::from_secs(1),
        max: Duration::from_secs(8),
    };

    /// Runs [`reconnect`] over scripted sessions (each stays up for its duration, then ends as
    /// given) on paused time; returns when each session started, after the first.
    async fn starts(script: Vec<(Duration, End)>) -> Vec<Duration> {
        tokio::time::pause();
        let peers = PeerTable::default();
        let guard = peers.register(PeerKind::RemoteRegistry, "root", "", "a:1");
        let cancel = CancellationToken::new();
        let script = Mutex::new(script.into_iter());
        let started = Mutex::new(Vec::new());
        let t0 = Instant::now();
        reconnect("root", BACKOFF, &guard.stats, &cancel, || async {
            started.lock().expect("lock").push(Instant::now() - t0);
            let next = script.lock().expect("lock").next();
            match next {
                Some((up, end)) => {
                    tokio::time::sleep(up).await;
                    end
                }
                None => {
                    cancel.cancel();
                    std::future::pending().await
                }
            }
        })
        .await;
        started.into_inner().expect("lock")
    }

    fn reset() -> End {
        End {
            reset: true,
            ..End::new(true, "Unavailable: resend", false)
        }
    }

    #[tokio::test]
    async fn a_parent_that_keeps_resetting_sessions_is_redialled_with_backoff() {
        let short = Duration::from_millis(100);
        let t = starts((0..5).map(|_| (short, reset())).collect()).await;
        // Each session lives 100 ms; the waits after them are jittered in [d, 2d] with d = 1, 2,
        // 4, 4, 4 s (max 8 s: d stops at 4 s).
        let waits: Vec<u128> = t
            .windows(2)
            .map(|w| (w[1] - w[0] - short).as_millis())
            .collect();
        assert_eq!(waits.len(), 5, "{t:?}");
        for (wait, d) in waits.iter().zip([1000, 2000, 4000, 4000, 4000]) {
            assert!(*wait >= d && *wait <= 2 * d, "waits {waits:?}");
        }
    }

    #[tokio::test]
    async fn a_reset_after_a_stable_session_reconnects_at_once_and_resets_the_backoff() {
        let short = Duration::from_millis(100);
        let t = starts(vec![
            (short, End::new(true, "parent closed the stream", false)),
            (short, End::new(true, "parent closed the stream", false)),
            (STABLE_SESSION, reset()),
            (short, End::new(false, "Unavailable: refused", false)),
        ])
        .await;
        assert_eq!(t.len(), 5, "{t:?}");
        let wait_ms = |i: usize| (t[i + 1] - t[i] - short).as_millis();
        // Two short sessions back off 1..2 s, then 2..4 s.
        assert!((1000..=2000).contains(&wait_ms(0)), "{t:?}");
        assert!((2000..=4000).contains(&wait_ms(1)), "{t:?}");
        // After the stable session: no wait at all (beyond the timer's 1 ms resolution, with
        // which the session's own 30 s end).
        assert!(
            t[3] - t[2] - STABLE_SESSION <= Duration::from_millis(1),
            "{t:?}"
        );
        // The next failure waits the first delay again (1..2 s), not the third (4..8 s).
        assert!((1000..=2000).contains(&wait_ms(3)), "{t:?}");
    }

    #[tokio::test]
    async fn a_fatal_end_stops_the_link() {
        let t = starts(vec![(
            Duration::ZERO,
            End::new(false, "Unauthenticated: who are you", true),
        )])
        .await;
        assert_eq!(t, [Duration::ZERO]);
    }
}
