//! Inbound mutual TLS for tonic: accepted TCP sockets go in, handshaken [`TlsConn`]s carrying the peer's
//! verified [`Identity`] come out, ready for `tonic::transport::Server::serve_with_incoming`.
//!
//! tonic's built-in TLS takes a fixed configuration, so certificate rotation would need a restart. Here
//! TLS is terminated with tokio-rustls and every new connection takes [`ReloadingTls::server_config`], the
//! latest validated material. Because [`TlsConn`] implements tonic's `Connected`, tonic inserts its
//! [`ConnInfo`] into every request's extensions, where handlers read the [`PeerInfo`] with [`peer_info`]
//! and the connection's [`ConnectionCloser`] with [`connection_closer`]: a handler that finds its peer
//! stuck (e.g. a stream HTTP/2 no longer polls because the peer stopped reading) can drop the whole
//! connection from outside the request.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use crate::explain::{Repeats, Side, cause, explain, find_tls_error, repeats_suffix};
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

/// Closes one connection from outside its I/O: after [`ConnectionCloser::close`], every read, write,
/// flush or shutdown on the [`TlsConn`] fails with `ConnectionAborted`, and the one pending is woken.
/// The HTTP/2 server then ends the connection and drops every stream on it.
#[derive(Clone, Default)]
pub struct ConnectionCloser(Arc<CloserInner>);

#[derive(Default)]
struct CloserInner {
    closed: AtomicBool,
    /// The connection task waiting to read, and the one waiting to write (the same task under
    /// hyper, but read and write may be pending at once).
    read: AtomicWaker,
    write: AtomicWaker,
}

impl ConnectionCloser {
    /// Make the connection fail from its next (or pending) I/O on.
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.read.wake();
        self.0.write.wake();
    }

    /// Whether [`Self::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    /// Register the waker first so a `close` racing with this check still wakes the task.
    fn check(&self, slot: &AtomicWaker, cx: &Context<'_>) -> io::Result<()> {
        slot.register(cx.waker());
        if self.is_closed() {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection closed by the server",
            ))
        } else {
            Ok(())
        }
    }

    fn check_read(&self, cx: &Context<'_>) -> io::Result<()> {
        self.check(&self.0.read, cx)
    }

    fn check_write(&self, cx: &Context<'_>) -> io::Result<()> {
        self.check(&self.0.write, cx)
    }
}

impl fmt::Debug for ConnectionCloser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionCloser")
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// What tonic stores in the extensions of every request on a [`TlsConn`].
#[derive(Clone, Debug)]
pub struct ConnInfo {
    /// Who is connected.
    pub peer: PeerInfo,
    /// Closes this connection.
    pub closer: ConnectionCloser,
}

/// A server-side TLS connection whose client certificate was verified and yielded an [`Identity`].
pub struct TlsConn {
    stream: TlsStream<TcpStream>,
    peer: PeerInfo,
    closer: ConnectionCloser,
}

impl TlsConn {
    /// Who is connected.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// The handle that closes this connection.
    pub fn closer(&self) -> &ConnectionCloser {
        &self.closer
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
        let this = self.get_mut();
        this.closer.check_read(cx)?;
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.closer.check_write(cx)?;
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.closer.check_write(cx)?;
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.closer.check_write(cx)?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.closer.check_write(cx)?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

impl Connected for TlsConn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            peer: self.peer.clone(),
            closer: self.closer.clone(),
        }
    }
}

/// The [`PeerInfo`] of the connection a request arrived on, if it came through [`tls_incoming`].
pub fn peer_info<T>(req: &tonic::Request<T>) -> Option<&PeerInfo> {
    req.extensions().get::<ConnInfo>().map(|c| &c.peer)
}

/// The [`ConnectionCloser`] of the connection a request arrived on, if it came through
/// [`tls_incoming`].
pub fn connection_closer<T>(req: &tonic::Request<T>) -> Option<&ConnectionCloser> {
    req.extensions().get::<ConnInfo>().map(|c| &c.closer)
}

/// Accepts connections from `listener` and performs the TLS handshake with the latest server
/// configuration of `tls`; yields only connections whose client certificate verified and yielded an
/// [`Identity`].
///
/// Handshakes run concurrently as separate tasks, each limited to [`HANDSHAKE_TIMEOUT`], so a slow or
/// failing peer never delays others (up to 1024 handshakes in flight; beyond that accepting pauses). Failed handshakes are logged (see [`tls_incoming_for`]) and
/// counted in `xcc_tls_handshake_failures_total`; they are not yielded. Errors from `accept` itself are
/// yielded (transient ones, such as a connection reset before it was accepted, are skipped). The stream
/// ends when `cancel` fires; in-flight handshakes are then abandoned and the listener is closed.
pub fn tls_incoming(
    listener: TcpListener,
    tls: ReloadingTls,
    cancel: CancellationToken,
) -> impl Stream<Item = Result<TlsConn, io::Error>> + Send + 'static {
    tls_incoming_for("TLS listener", listener, tls, cancel)
}

/// [`tls_incoming`] for the listener called `what` (e.g. "admin listener"), the name its
/// handshake failures are logged with.
///
/// A handshake that fails for a TLS reason (a certificate refused by either side, plaintext sent
/// to this port) is logged at WARN as one sentence saying who refused whom, why and what to
/// change ([`crate::explain`]); identical failures from the same address are counted and logged
/// again at most once a minute with their count. A connection closed before it said anything (a
/// TCP probe) and a handshake timeout stay at debug level.
pub fn tls_incoming_for(
    what: &'static str,
    listener: TcpListener,
    tls: ReloadingTls,
    cancel: CancellationToken,
) -> impl Stream<Item = Result<TlsConn, io::Error>> + Send + 'static {
    let state = Incoming {
        what,
        listener,
        tls,
        cancel,
        handshakes: JoinSet::new(),
        repeats: Arc::default(),
    };
    futures::stream::unfold(state, |mut st| async move {
        let item = st.next().await?;
        Some((item, st))
    })
}

struct Incoming {
    what: &'static str,
    /// Handshake failures already logged, shared by the handshake tasks.
    repeats: Arc<Repeats>,
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
                        self.handshakes.spawn(handshake(
                            tcp,
                            remote_addr,
                            self.tls.clone(),
                            Failures { what: self.what, repeats: self.repeats.clone() },
                        ));
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

/// Where a listener's handshake failures are reported.
struct Failures {
    what: &'static str,
    repeats: Arc<Repeats>,
}

impl Failures {
    /// Log a failed handshake: explained at WARN (once per minute per address and cause) when
    /// TLS says why, at debug otherwise (a probe that connects and closes, a reset).
    fn report(&self, remote_addr: SocketAddr, e: &io::Error) {
        match find_tls_error(e) {
            Some(tls_error) => {
                let key = format!("{}|{:?}", remote_addr.ip(), cause(&tls_error));
                if let Some(held) = self.repeats.check(&key) {
                    tracing::warn!(
                        listener = self.what,
                        "{}{}",
                        explain(&tls_error, Side::Server, &remote_addr.to_string()),
                        repeats_suffix(held)
                    );
                }
            }
            None => {
                tracing::debug!(listener = self.what, peer = %remote_addr, error = %e, "TLS handshake failed");
            }
        }
    }
}

async fn handshake(
    tcp: TcpStream,
    remote_addr: SocketAddr,
    tls: ReloadingTls,
    failures: Failures,
) -> Option<TlsConn> {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(peer = %remote_addr, error = %e, "cannot set TCP_NODELAY");
    }
    let acceptor = TlsAcceptor::from(tls.server_config());
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            failures.report(remote_addr, &e);
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
            closer: ConnectionCloser::default(),
        }),
        Err(e) => {
            tracing::debug!(peer = %remote_addr, error = %e, "client certificate yields no identity; dropping connection");
            tls.metrics().handshake_failed("no_identity");
            None
        }
    }
}
