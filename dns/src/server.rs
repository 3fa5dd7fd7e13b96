//! The DNS server: UDP and TCP listeners on tokio, answering from the latest published
//! [`Snapshot`] through the pure [`wire::handle`], relaying queries upstream when transparent
//! resolution says so.
//!
//! The transport is ours rather than `hickory-server`'s: the hot path is a recv → answer → send
//! loop per worker on a shared UDP socket, with no task spawned per packet and no per-query log
//! line, and the snapshot is re-read only when the `watch` says it changed. hickory-proto does
//! every encode and decode. TCP takes one task per connection (RFC 7766 framing, pipelined
//! queries answered in order), a connection limit and an idle timeout. Relayed queries run in
//! their own tasks, bounded by a permit count; when none is free, or the upstream fails or times
//! out, the client gets SERVFAIL.
//!
//! Shutdown: when the token fires the listeners stop, open connections close after their current
//! query, and [`DnsServer::run`] returns once relayed queries have finished.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{Semaphore, watch};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::answer::{Settings, Snapshot};
use super::metrics::DnsMetrics;
use super::wire::{self, Outcome, Transport};

/// Largest DNS message (TCP length prefix is 16 bits; a UDP datagram cannot exceed it either).
const MAX_MESSAGE: usize = 65535;
/// Attempts at finding a port free for both UDP and TCP when binding port 0.
const BIND_ATTEMPTS: usize = 20;

/// Server errors.
#[derive(Debug, Error)]
pub enum ServerError {
    /// A listener could not be bound.
    #[error("cannot bind DNS {transport} listener on {addr}: {source}")]
    Bind {
        /// `UDP` or `TCP`.
        transport: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// A bound socket failed.
    #[error("DNS socket error: {0}")]
    Io(#[from] io::Error),
}

/// Why relaying a query upstream failed.
#[derive(Debug, Error)]
enum ForwardError {
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    #[error("upstream I/O: {0}")]
    Io(#[from] io::Error),
    #[error("upstream reply does not match the query")]
    Mismatch,
}

/// Tunables of the server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How answers are shaped.
    pub settings: Settings,
    /// Upstream resolver for names we do not hold (transparent mode).
    pub upstream: Option<SocketAddr>,
    /// Tasks receiving on the UDP socket (one per core is right).
    pub udp_workers: usize,
    /// A TCP connection idle this long is closed (RFC 7766 suggests seconds).
    pub tcp_idle_timeout: Duration,
    /// Open TCP connections at most; further ones are closed at once.
    pub max_tcp_connections: usize,
    /// A relayed query unanswered this long gets SERVFAIL.
    pub forward_timeout: Duration,
    /// Relayed queries in flight at most; beyond it, SERVFAIL.
    pub max_forwards: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            settings: Settings::default(),
            upstream: None,
            udp_workers: 1,
            tcp_idle_timeout: Duration::from_secs(10),
            max_tcp_connections: 1024,
            forward_timeout: Duration::from_secs(2),
            max_forwards: 1024,
        }
    }
}

/// Bound UDP and TCP listeners, ready to [`run`](DnsServer::run).
#[derive(Debug)]
pub struct DnsServer {
    udp: Arc<UdpSocket>,
    tcp: TcpListener,
}

impl DnsServer {
    /// Bind UDP and TCP on `addr`. With port 0, both get the same free port.
    pub async fn bind(addr: SocketAddr) -> Result<Self, ServerError> {
        let attempts = if addr.port() == 0 { BIND_ATTEMPTS } else { 1 };
        let mut last = None;
        for _ in 0..attempts {
            let udp = UdpSocket::bind(addr)
                .await
                .map_err(|source| ServerError::Bind {
                    transport: "UDP",
                    addr,
                    source,
                })?;
            let bound = udp.local_addr()?;
            match TcpListener::bind(bound).await {
                Ok(tcp) => return Ok(Self::from_sockets(udp, tcp)),
                Err(source) => {
                    last = Some(ServerError::Bind {
                        transport: "TCP",
                        addr: bound,
                        source,
                    })
                }
            }
        }
        Err(last.unwrap_or_else(|| ServerError::Io(io::ErrorKind::AddrInUse.into())))
    }

    /// Use sockets bound elsewhere.
    pub fn from_sockets(udp: UdpSocket, tcp: TcpListener) -> Self {
        Self {
            udp: Arc::new(udp),
            tcp,
        }
    }

    /// Address of the UDP socket.
    pub fn udp_addr(&self) -> io::Result<SocketAddr> {
        self.udp.local_addr()
    }

    /// Address of the TCP listener.
    pub fn tcp_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Serve until `cancel` fires, then drain.
    pub async fn run(
        self,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        config: ServerConfig,
        metrics: DnsMetrics,
        cancel: CancellationToken,
    ) -> Result<(), ServerError> {
        let ctx = Arc::new(Context {
            forwards: Arc::new(Semaphore::new(config.max_forwards.max(1))),
            connections: Arc::new(Semaphore::new(config.max_tcp_connections.max(1))),
            tracker: TaskTracker::new(),
            config,
            metrics,
            cancel,
        });
        for _ in 0..ctx.config.udp_workers.max(1) {
            ctx.tracker
                .spawn(udp_worker(self.udp.clone(), snapshots.clone(), ctx.clone()));
        }
        tcp_accept(self.tcp, snapshots, ctx.clone()).await;
        ctx.tracker.close();
        ctx.tracker.wait().await;
        Ok(())
    }
}

struct Context {
    config: ServerConfig,
    metrics: DnsMetrics,
    forwards: Arc<Semaphore>,
    connections: Arc<Semaphore>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

/// The latest snapshot, refreshed only when the watch has a new one (an atomic load per query).
struct Current {
    rx: watch::Receiver<Arc<Snapshot>>,
    snapshot: Arc<Snapshot>,
}

impl Current {
    fn new(mut rx: watch::Receiver<Arc<Snapshot>>) -> Self {
        let snapshot = rx.borrow_and_update().clone();
        Self { rx, snapshot }
    }

    fn get(&mut self) -> &Snapshot {
        if self.rx.has_changed().unwrap_or(false) {
            self.snapshot = self.rx.borrow_and_update().clone();
        }
        &self.snapshot
    }
}

async fn udp_worker(
    socket: Arc<UdpSocket>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    ctx: Arc<Context>,
) {
    let mut current = Current::new(snapshots);
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let received = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return,
            r = socket.recv_from(&mut buf) => r,
        };
        let (len, peer) = match received {
            Ok(r) => r,
            Err(e) => {
                // Per-datagram errors (e.g. ICMP feedback) do not end the socket.
                tracing::debug!(error = %e, "DNS UDP receive error");
                continue;
            }
        };
        let query = &buf[..len];
        let outcome = wire::handle(
            query,
            peer.ip(),
            Transport::Udp,
            current.get(),
            &ctx.config.settings,
        );
        match outcome {
            Outcome::Reply { bytes, rcode } => {
                ctx.metrics.query(Transport::Udp, rcode);
                if let Err(e) = socket.send_to(&bytes, peer).await {
                    tracing::debug!(error = %e, %peer, "DNS UDP send error");
                }
            }
            Outcome::Forward { id } => forward_udp(&socket, query, id, peer, &ctx).await,
            Outcome::Drop => {
                ctx.metrics.dropped.inc();
            }
        }
    }
}

/// Relay a UDP query in its own task, or answer SERVFAIL if that is impossible.
async fn forward_udp(
    socket: &Arc<UdpSocket>,
    query: &[u8],
    id: u16,
    peer: SocketAddr,
    ctx: &Arc<Context>,
) {
    let permit = ctx.forwards.clone().try_acquire_owned().ok();
    let (Some(upstream), Some(permit)) = (ctx.config.upstream, permit) else {
        fail_forward(socket, query, peer, ctx).await;
        return;
    };
    let (socket, query, task_ctx) = (socket.clone(), query.to_vec(), ctx.clone());
    ctx.tracker.spawn(async move {
        let _permit = permit;
        let ctx = task_ctx;
        let limit = ctx.config.forward_timeout;
        match timeout(limit, relay_udp(&query, id, upstream))
            .await
            .unwrap_or(Err(ForwardError::Timeout(limit)))
        {
            Ok(reply) => {
                ctx.metrics.forward(Transport::Udp);
                if let Err(e) = socket.send_to(&reply, peer).await {
                    tracing::debug!(error = %e, %peer, "DNS UDP send error");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, %upstream, "DNS relay over UDP failed");
                fail_forward(&socket, &query, peer, &ctx).await;
            }
        }
    });
}

async fn fail_forward(socket: &UdpSocket, query: &[u8], peer: SocketAddr, ctx: &Context) {
    ctx.metrics.forward_failures.inc();
    if let Some(bytes) = wire::error_reply(query, ResponseCode::ServFail) {
        ctx.metrics.query(Transport::Udp, ResponseCode::ServFail);
        let _ = socket.send_to(&bytes, peer).await;
    }
}

/// An unspecified local address of the upstream's family.
fn local_for(upstream: SocketAddr) -> SocketAddr {
    if upstream.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    }
}

async fn relay_udp(query: &[u8], id: u16, upstream: SocketAddr) -> Result<Vec<u8>, ForwardError> {
    // A fresh socket per query: a random source port, and replies can only come from `upstream`.
    let sock = UdpSocket::bind(local_for(upstream)).await?;
    sock.connect(upstream).await?;
    sock.send(query).await?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let n = sock.recv(&mut buf).await?;
        if wire::is_reply_to(&buf[..n], id) {
            buf.truncate(n);
            return Ok(buf);
        }
        // Anything else on this port is not our reply; keep waiting (bounded by the timeout).
    }
}

async fn relay_tcp(query: &[u8], id: u16, upstream: SocketAddr) -> Result<Vec<u8>, ForwardError> {
    let mut stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    write_framed(&mut stream, query).await?;
    let reply = read_framed(&mut stream).await?;
    if wire::is_reply_to(&reply, id) {
        Ok(reply)
    } else {
        Err(ForwardError::Mismatch)
    }
}

async fn read_framed<R: AsyncReadExt + Unpin>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    r.read_exact(&mut len).await?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}

async fn write_framed<W: AsyncWriteExt + Unpin>(w: &mut W, msg: &[u8]) -> io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| io::Error::other("DNS message too long"))?;
    let mut framed = Vec::with_capacity(msg.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    w.write_all(&framed).await
}

async fn tcp_accept(
    listener: TcpListener,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    ctx: Arc<Context>,
) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Typically EMFILE or a connection reset before accept; the listener survives.
                tracing::debug!(error = %e, "DNS TCP accept error");
                continue;
            }
        };
        let Ok(permit) = ctx.connections.clone().try_acquire_owned() else {
            ctx.metrics.tcp_rejected.inc();
            continue;
        };
        let (rx, conn_ctx) = (snapshots.clone(), ctx.clone());
        ctx.tracker.spawn(async move {
            let _permit = permit;
            tcp_connection(stream, peer, rx, conn_ctx).await;
        });
    }
}

async fn tcp_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    ctx: Arc<Context>,
) {
    let _ = stream.set_nodelay(true);
    let mut current = Current::new(snapshots);
    let idle = ctx.config.tcp_idle_timeout;
    loop {
        let read = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return,
            r = timeout(idle, read_framed(&mut stream)) => r,
        };
        let Ok(Ok(query)) = read else {
            return; // idle, closed, or a broken frame: end the connection
        };
        let outcome = wire::handle(
            &query,
            peer.ip(),
            Transport::Tcp,
            current.get(),
            &ctx.config.settings,
        );
        let reply = match outcome {
            Outcome::Reply { bytes, rcode } => {
                ctx.metrics.query(Transport::Tcp, rcode);
                bytes
            }
            Outcome::Forward { id } => match forward_tcp(&query, id, &ctx).await {
                Some(bytes) => bytes,
                None => continue,
            },
            Outcome::Drop => {
                ctx.metrics.dropped.inc();
                continue;
            }
        };
        if write_framed(&mut stream, &reply).await.is_err() {
            return;
        }
    }
}

/// Relay a TCP query (inline: TCP answers go back in order on this connection).
async fn forward_tcp(query: &[u8], id: u16, ctx: &Context) -> Option<Vec<u8>> {
    let permit = ctx.forwards.try_acquire().ok();
    let result = match (ctx.config.upstream, &permit) {
        (Some(upstream), Some(_)) => {
            let limit = ctx.config.forward_timeout;
            timeout(limit, relay_tcp(query, id, upstream))
                .await
                .unwrap_or(Err(ForwardError::Timeout(limit)))
        }
        _ => Err(ForwardError::Io(io::Error::other("no upstream capacity"))),
    };
    match result {
        Ok(reply) => {
            ctx.metrics.forward(Transport::Tcp);
            Some(reply)
        }
        Err(e) => {
            tracing::debug!(error = %e, "DNS relay over TCP failed");
            ctx.metrics.forward_failures.inc();
            ctx.metrics.query(Transport::Tcp, ResponseCode::ServFail);
            wire::error_reply(query, ResponseCode::ServFail)
        }
    }
}
