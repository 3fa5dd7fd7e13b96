//! Inbound mutual TLS for tonic: accepted TCP sockets go in, handshaken [`TlsConn`]s carrying the peer's
//! verified [`Identity`] come out, ready for `tonic::transport::Server::serve_with_incoming`.
//!
//! tonic's built-in TLS takes a fixed configuration, so certificate rotation would need a restart. Here
//! TLS is terminated with tokio-rustls and every new connection takes [`ReloadingTls::server_config`], the
//! latest validated material. Because [`TlsConn`] implements tonic's `Connected`, tonic inserts its
//! [`PeerInfo`] into every request's extensions, where handlers read it with [`peer_info`].

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use crate::identity::{Identity, parse_identity};
use crate::reload::ReloadingTls;

/// Longest a TLS handshake may take before the socket is dropped; generous for a cross-region round
/// trip, short enough that stalled sockets do not pile up.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in flight at most; beyond that, accepting pauses and new sockets wait in the kernel backlog.
/// Bounds the memory a flood of idle sockets can pin (each may hold its slot for [`HANDSHAKE_TIMEOUT`]);
/// far above what a registry with a few dozen peers needs.
const MAX_PENDING_HANDSHAKES: usize = 1024;

/// Pause after a non-transient `accept` error (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The verified peer of a connection; tonic hands a clone to every request on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's TCP address.
    pub remote_addr: SocketAddr,
    /// The identity in the peer's verified client certificate.
    pub identity: Identity,
}

/// A server-side TLS connection whose client certificate was verified and yielded an [`Identity`].
pub struct TlsConn {
    stream: TlsStream<TcpStream>,
    peer: PeerInfo,
}

impl TlsConn {
    /// Who is connected.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// The underlying TLS stream (for the negotiated protocol, peer certificates, ...).
    pub fn get_ref(&self) -> &TlsStream<TcpStream> {
        &self.stream
    }

    /// Unwraps the TLS stream.
    pub fn into_inner(self) -> TlsStream<TcpStream> {
        self.stream
    }
}

impl fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConn")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

/// The [`PeerInfo`] of the connection a request arrived on, if it came through [`tls_incoming`].
pub fn peer_info<T>(req: &tonic::Request<T>) -> Option<&PeerInfo> {
    req.extensions().get::<PeerInfo>()
}

/// Accepts connections from `listener` and performs the TLS handshake with the latest server
/// configuration of `tls`; yields only connections whose client certificate verified and yielded an
/// [`Identity`].
///
/// Handshakes run concurrently as separate tasks, each limited to [`HANDSHAKE_TIMEOUT`], so a slow or
/// failing peer never delays others (up to 1024 handshakes in flight; beyond that accepting pauses). Failed handshakes are logged at debug level with the peer address and
/// counted in `xcc_tls_handshake_failures_total`; they are not yielded. Errors from `accept` itself are
/// yielded (transient ones, such as a connection reset before it was accepted, are skipped). The stream
/// ends when `cancel` fires; in-flight handshakes are then abandoned and the listener is closed.
pub fn tls_incoming(
    listener: TcpListener,
    tls: ReloadingTls,
    cancel: CancellationToken,
) -> impl Stream<Item = Result<TlsConn, io::Error>> + Send + 'static {
    let state = Incoming {
        listener,
        tls,
        cancel,
        handshakes: JoinSet::new(),
    };
    futures::stream::unfold(state, |mut st| async move {
        let item = st.next().await?;
        Some((item, st))
    })
}

struct Incoming {
    listener: TcpListener,
    tls: ReloadingTls,
    cancel: CancellationToken,
    /// Dropped with the stream, which aborts handshakes still in flight.
    handshakes: JoinSet<Option<TlsConn>>,
}

impl Incoming {
    async fn next(&mut self) -> Option<Result<TlsConn, io::Error>> {
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                accepted = self.listener.accept(), if self.handshakes.len() < MAX_PENDING_HANDSHAKES => match accepted {
                    Ok((tcp, remote_addr)) => {
                        self.handshakes.spawn(handshake(tcp, remote_addr, self.tls.clone()));
                    }
                    Err(e) if is_transient(&e) => {
                        tracing::debug!(error = %e, "transient accept error");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::select! {
                            _ = self.cancel.cancelled() => return None,
                            _ = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                        }
                        return Some(Err(e));
                    }
                },
                Some(done) = self.handshakes.join_next() => match done {
                    Ok(Some(conn)) => return Some(Ok(conn)),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "TLS handshake task failed"),
                },
            }
        }
    }
}

/// Errors that concern one connection attempt, not the listener.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

async fn handshake(tcp: TcpStream, remote_addr: SocketAddr, tls: ReloadingTls) -> Option<TlsConn> {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(peer = %remote_addr, error = %e, "cannot set TCP_NODELAY");
    }
    let acceptor = TlsAcceptor::from(tls.server_config());
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tracing::debug!(peer = %remote_addr, error = %e, "TLS handshake failed");
            tls.metrics().handshake_failed("tls");
            return None;
        }
        Err(_) => {
            tracing::debug!(peer = %remote_addr, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out");
            tls.metrics().handshake_failed("timeout");
            return None;
        }
    };
    // The server configuration requires a client certificate, so a completed handshake has one; the
    // check stays in case that ever changes.
    let identity = match stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
    {
        Some(leaf) => parse_identity(leaf).map_err(|e| e.to_string()),
        None => Err("no client certificate".to_owned()),
    };
    match identity {
        Ok(identity) => Some(TlsConn {
            stream,
            peer: PeerInfo {
                remote_addr,
                identity,
            },
        }),
        Err(e) => {
            tracing::debug!(peer = %remote_addr, error = %e, "client certificate yields no identity; dropping connection");
            tls.metrics().handshake_failed("no_identity");
            None
        }
    }
}
