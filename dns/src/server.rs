//! The DNS server: UDP and TCP listeners on tokio, answering from the latest published
//! [`Snapshot`] through the pure [`wire::handle`], relaying queries upstream when transparent
//! resolution says so.
//!
//! The transport is ours rather than `hickory-server`'s. UDP: a blocking loop on dedicated OS
//! threads, one per worker, each taking a batch of queued queries with one `recvmmsg` and
//! sending their answers with one `sendmmsg` ([`udp`](super::udp)); by default each worker has
//! its own `SO_REUSEPORT` socket bound to the same address (the kernel spreads clients over
//! them, as over Knot's UDP workers), or they share one ([`DnsServer::bind_with`]; always on an
//! automatic port). No task is spawned per packet and there is no per-query log line; the
//! snapshot is re-read only when the `watch` says it changed. hickory-proto does every
//! encode and decode. TCP takes one task per connection (RFC 7766 framing, pipelined queries
//! answered in order: queries that arrive together are read with one system call and their
//! answers written with one) with three limits against clients that hold connections open: a
//! total (clamped below the process's open-file limit, so a flood is refused rather than left
//! in the accept backlog), one per source address (RFC 7766 §10), and an idle timeout that
//! bounds both waiting for a query and writing answers to a client that stopped reading. An
//! accept error (EMFILE) pauses the accept loop briefly instead of spinning on it. Relayed
//! queries run in their own tasks, bounded by a permit count; when none is free, or the
//! upstream fails or times out, the client gets SERVFAIL.
//!
//! Shutdown: when the token fires the listeners stop (a UDP worker notices within
//! [`UDP_CANCEL_POLL`], its socket's read timeout), open connections close after their current
//! query, and [`DnsServer::run`] returns once the UDP threads have ended and relayed queries
//! have finished.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use socket2::{Domain, Protocol, Socket, Type};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use xcc_controller::plumbing::lock;

use super::answer::{Settings, Snapshot};
use super::metrics::DnsMetrics;
use super::udp::Batch;
use super::wire::{self, Outcome, Transport};

/// Largest DNS message (TCP length prefix is 16 bits; a UDP datagram cannot exceed it either).
const MAX_MESSAGE: usize = 65535;
/// Attempts at finding a port free for both UDP and TCP when binding port 0.
const BIND_ATTEMPTS: usize = 20;
/// Pause after a failed accept: long enough that a full file table (EMFILE) costs no CPU, short
/// enough that service resumes promptly once descriptors free up (hyper pauses for 1 s; a DNS
/// client retries sooner than that).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Open files kept out of the TCP connection budget: stdio, the listeners and UDP socket, the
/// runtime's epoll and wake-up descriptors, the metrics listener and a feed's file watch.
const FD_RESERVE: usize = 32;
/// Read buffer of a TCP connection: pipelined queries that arrived together are read with one
/// system call.
const TCP_READ_BUFFER: usize = 4096;
/// Answers held back for one write at most (bytes).
pub const TCP_WRITE_BATCH: usize = 16 * 1024;
/// Read timeout of the UDP workers' sockets: how often an idle worker looks at the cancellation
/// token, so shutdown never waits longer than this for a blocked receive.
pub const UDP_CANCEL_POLL: Duration = Duration::from_millis(100);

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
    /// Threads receiving UDP (one per core is right).
    pub udp_workers: usize,
    /// A TCP connection idle this long is closed (RFC 7766 suggests seconds).
    pub tcp_idle_timeout: Duration,
    /// Open TCP connections at most; further ones are closed at once. Lowered at run time to
    /// fit under the process's open-file limit.
    pub max_tcp_connections: usize,
    /// Open TCP connections from one source address at most (RFC 7766 §10).
    pub max_tcp_per_client: usize,
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
            // A node-local cache or a NAT gateway may carry many clients on one address; 64
            // leaves them room while 16 such sources are needed to fill the default total.
            max_tcp_per_client: 64,
            forward_timeout: Duration::from_secs(2),
            max_forwards: 1024,
        }
    }
}

/// Bound UDP and TCP listeners, ready to [`run`](DnsServer::run).
#[derive(Debug)]
pub struct DnsServer {
    udp: std::net::UdpSocket,
    tcp: TcpListener,
}

impl DnsServer {
    /// Bind UDP and TCP on `addr`, a UDP socket per worker. With port 0, both get the same
    /// free port.
    pub async fn bind(addr: SocketAddr) -> Result<Self, ServerError> {
        Self::bind_with(addr, true).await
    }

    /// [`Self::bind`], choosing whether the UDP workers get a socket each (`per_worker`: bound
    /// with `SO_REUSEPORT`, the kernel spreads sources over them) or share one (whichever
    /// worker is free takes the next query).
    pub async fn bind_with(addr: SocketAddr, per_worker: bool) -> Result<Self, ServerError> {
        let attempts = if addr.port() == 0 { BIND_ATTEMPTS } else { 1 };
        let mut last = None;
        for _ in 0..attempts {
            // Port 0 (tests, the demo) gets a port of its own: an automatic port may be one
            // that another `SO_REUSEPORT` socket of this user holds, which the option would join.
            let reuse_port = per_worker && addr.port() != 0;
            let udp = bind_udp(addr, reuse_port).map_err(|source| ServerError::Bind {
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

    /// Use sockets bound elsewhere. Without `SO_REUSEPORT` on `udp`, the UDP workers share it.
    pub fn from_sockets(udp: std::net::UdpSocket, tcp: TcpListener) -> Self {
        Self { udp, tcp }
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
        let max_tcp = tcp_budget(config.max_tcp_connections, open_files_limit());
        if max_tcp < config.max_tcp_connections {
            tracing::warn!(
                asked = config.max_tcp_connections,
                allowed = max_tcp,
                "the open-file limit is too low for the TCP connection limit; lowering it"
            );
        }
        let ctx = Arc::new(Context {
            forwards: Arc::new(Semaphore::new(config.max_forwards.max(1))),
            connections: Arc::new(Semaphore::new(max_tcp)),
            per_client: Mutex::default(),
            tracker: TaskTracker::new(),
            config,
            metrics,
            stop_udp: cancel.child_token(),
            cancel,
        });
        // The UDP threads stop when `run` ends, and also when it is dropped before that.
        let _stop_udp = ctx.stop_udp.clone().drop_guard();
        let runtime = Handle::current();
        let port = self.udp.local_addr()?.port();
        let mut threads = Vec::new();
        let mut started = Vec::new();
        for (i, socket) in udp_sockets(self.udp, ctx.config.udp_workers.max(1))?
            .into_iter()
            .enumerate()
        {
            let (rx, worker_ctx, rt) = (snapshots.clone(), ctx.clone(), runtime.clone());
            let (up, up_rx) = oneshot::channel::<()>();
            let spawned = std::thread::Builder::new()
                .name(udp_thread_name(port, i))
                .spawn(move || {
                    // Running (and named): `run` serves TCP only once every worker says so.
                    let _ = up.send(());
                    udp_worker(&Arc::new(socket), rx, &worker_ctx, &rt)
                });
            match spawned {
                Ok(t) => {
                    threads.push(t);
                    started.push(up_rx);
                }
                Err(e) => {
                    // Stop the threads already started before reporting.
                    ctx.stop_udp.cancel();
                    join_all(threads).await;
                    return Err(e.into());
                }
            }
        }
        for up in started {
            // An error is a worker that ended before it said so; `join_all` reports it below.
            let _ = up.await;
        }
        tcp_accept(self.tcp, snapshots, ctx.clone()).await;
        join_all(threads).await;
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
    /// Open TCP connections per source address (entries removed at zero).
    per_client: Mutex<HashMap<IpAddr, usize>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    /// Fires with `cancel`, or when `run` ends or is dropped: the UDP threads watch it.
    stop_udp: CancellationToken,
}

impl Context {
    /// Count a connection from `ip`, unless that source is at its limit.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let mut open = lock(&self.per_client);
        let n = open.entry(ip).or_insert(0);
        if *n >= self.config.max_tcp_per_client.max(1) {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            ctx: self.clone(),
            ip,
        })
    }
}

/// One source address's share of the TCP connections, given back on drop.
struct ClientSlot {
    ctx: Arc<Context>,
    ip: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = lock(&self.ctx.per_client);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// TCP connections allowed: `asked`, but no more than the open-file limit minus [`FD_RESERVE`]
/// (accepting past the limit fails with EMFILE and leaves clients hanging in the backlog, where
/// a refusal at least tells them to go elsewhere); at least one.
pub fn tcp_budget(asked: usize, open_files: Option<u64>) -> usize {
    let cap = open_files
        .and_then(|n| usize::try_from(n).ok())
        .map_or(usize::MAX, |n| n.saturating_sub(FD_RESERVE));
    asked.min(cap).max(1)
}

/// The soft open-file limit of this process (`/proc/self/limits`; `None` where there is none or
/// it is unlimited).
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files_limit(&text)
}

/// The soft value of the `Max open files` row of a `/proc/<pid>/limits` text.
pub fn parse_open_files_limit(limits: &str) -> Option<u64> {
    let row = limits.lines().find(|l| l.starts_with("Max open files"))?;
    row["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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

/// Name of UDP worker thread `i` serving `port` (under Linux's 15 bytes for `port` < 100,000
/// and `i` < 10; longer names are cut, which only blurs what `top -H` shows).
pub fn udp_thread_name(port: u16, i: usize) -> String {
    format!("dns-udp{port}.{i}")
}

/// Wait for the UDP worker threads to end (they notice cancellation within
/// [`UDP_CANCEL_POLL`]), without blocking the runtime.
async fn join_all(threads: Vec<std::thread::JoinHandle<()>>) {
    let joined = tokio::task::spawn_blocking(move || {
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a DNS UDP worker thread panicked");
            }
        }
    })
    .await;
    if let Err(e) = joined {
        tracing::error!(error = %e, "joining the DNS UDP worker threads failed");
    }
}

/// A UDP socket on `addr`; with `reuse_port`, `SO_REUSEPORT` lets the workers bind more on its
/// address.
fn bind_udp(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(reuse_port)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// `count` blocking sockets for the UDP workers: `first`, plus sockets bound with
/// `SO_REUSEPORT` on its address; where that is refused (`first` came without the option),
/// handles of `first` itself, which the workers then share. Each has [`UDP_CANCEL_POLL`] as
/// read timeout.
pub fn udp_sockets(
    first: std::net::UdpSocket,
    count: usize,
) -> io::Result<Vec<std::net::UdpSocket>> {
    let addr = first.local_addr()?;
    let mut sockets = Vec::with_capacity(count);
    for _ in 1..count {
        sockets.push(match bind_udp(addr, true) {
            Ok(s) => s,
            Err(_) => first.try_clone()?,
        });
    }
    sockets.insert(0, first);
    for s in &sockets {
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(UDP_CANCEL_POLL))?;
    }
    Ok(sockets)
}

/// One UDP worker thread: receive a batch, answer it, send the answers, until the token fires.
fn udp_worker(
    socket: &Arc<std::net::UdpSocket>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    ctx: &Arc<Context>,
    runtime: &Handle,
) {
    let mut current = Current::new(snapshots);
    let mut batch = Batch::new();
    while !ctx.stop_udp.is_cancelled() {
        let received = match batch.receive(socket) {
            Ok(n) => n,
            // The read timeout: look at the token again.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => {
                // Per-datagram errors (e.g. ICMP feedback) do not end the socket.
                tracing::debug!(error = %e, "DNS UDP receive error");
                continue;
            }
        };
        let snapshot = current.get();
        for i in 0..received {
            let (query, meta) = batch.get(i);
            let Some(peer) = meta.peer() else {
                ctx.metrics.dropped.inc();
                continue;
            };
            let outcome = if meta.truncated {
                wire::malformed(query)
            } else {
                wire::handle(
                    query,
                    peer.ip(),
                    Transport::Udp,
                    snapshot,
                    &ctx.config.settings,
                )
            };
            let reply = match outcome {
                Outcome::Reply { bytes, rcode } => {
                    ctx.metrics.query(Transport::Udp, rcode);
                    bytes
                }
                Outcome::Forward { id } => {
                    forward_udp(socket, query, id, peer, ctx, runtime);
                    continue;
                }
                Outcome::Drop => {
                    ctx.metrics.dropped.inc();
                    continue;
                }
            };
            batch.answer(reply, peer);
        }
        let failed = batch.flush(socket);
        if failed > 0 {
            tracing::debug!(failed, "DNS UDP answers the kernel refused to send");
        }
    }
}

/// Relay a UDP query in its own task on the runtime, or answer SERVFAIL if that is impossible.
fn forward_udp(
    socket: &Arc<std::net::UdpSocket>,
    query: &[u8],
    id: u16,
    peer: SocketAddr,
    ctx: &Arc<Context>,
    runtime: &Handle,
) {
    let permit = ctx.forwards.clone().try_acquire_owned().ok();
    let (Some(upstream), Some(permit)) = (ctx.config.upstream, permit) else {
        fail_forward(socket, query, peer, ctx);
        return;
    };
    let (socket, query, task_ctx) = (socket.clone(), query.to_vec(), ctx.clone());
    let relay = async move {
        let _permit = permit;
        let ctx = task_ctx;
        let limit = ctx.config.forward_timeout;
        match timeout(limit, relay_udp(&query, id, upstream))
            .await
            .unwrap_or(Err(ForwardError::Timeout(limit)))
        {
            Ok(reply) => {
                ctx.metrics.forward(Transport::Udp);
                // A blocking socket, but a UDP send waits only while the kernel's send buffer
                // is full.
                if let Err(e) = socket.send_to(&reply, peer) {
                    tracing::debug!(error = %e, %peer, "DNS UDP send error");
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, %upstream, "DNS relay over UDP failed");
                fail_forward(&socket, &query, peer, &ctx);
            }
        }
    };
    ctx.tracker.spawn_on(relay, runtime);
}

fn fail_forward(socket: &std::net::UdpSocket, query: &[u8], peer: SocketAddr, ctx: &Context) {
    ctx.metrics.forward_failures.inc();
    if let Some(bytes) = wire::error_reply(query, ResponseCode::ServFail) {
        ctx.metrics.query(Transport::Udp, ResponseCode::ServFail);
        let _ = socket.send_to(&bytes, peer);
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
    let mut framed = Vec::with_capacity(msg.len() + 2);
    push_framed(&mut framed, msg)?;
    w.write_all(&framed).await
}

/// Append `msg` to `out` with its 16-bit length prefix (RFC 1035 §4.2.2).
fn push_framed(out: &mut Vec<u8>, msg: &[u8]) -> io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| io::Error::other("DNS message too long"))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(msg);
    Ok(())
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
                // Retrying at once would spin: the pending connection stays in the backlog.
                tracing::debug!(error = %e, "DNS TCP accept error");
                tokio::select! {
                    _ = ctx.cancel.cancelled() => return,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
                continue;
            }
        };
        let Ok(permit) = ctx.connections.clone().try_acquire_owned() else {
            ctx.metrics.tcp_rejected.inc();
            continue;
        };
        let Some(slot) = ctx.admit(peer.ip()) else {
            ctx.metrics.tcp_rejected.inc();
            continue;
        };
        let (rx, conn_ctx) = (snapshots.clone(), ctx.clone());
        ctx.tracker.spawn(async move {
            let _permit = (permit, slot);
            tcp_connection(stream, peer, rx, conn_ctx).await;
        });
    }
}

async fn tcp_connection(
    stream: TcpStream,
    peer: SocketAddr,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    ctx: Arc<Context>,
) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::with_capacity(TCP_READ_BUFFER, read);
    // Framed answers not yet written.
    let mut out = Vec::new();
    let mut current = Current::new(snapshots);
    let idle = ctx.config.tcp_idle_timeout;
    loop {
        if flush_due(&out, reader.buffer()) {
            // A client that stops reading must not hold the connection: the write gets the
            // same bound as the wait for a query.
            let written = tokio::select! {
                biased;
                _ = ctx.cancel.cancelled() => return,
                w = timeout(idle, write.write_all(&out)) => w,
            };
            match written {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return,
                Err(_) => {
                    ctx.metrics.tcp_write_timeouts.inc();
                    return;
                }
            }
            out.clear();
            out.shrink_to(TCP_WRITE_BATCH);
        }
        let read = tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return,
            r = timeout(idle, read_framed(&mut reader)) => r,
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
        if push_framed(&mut out, &reply).is_err() {
            return;
        }
    }
}

/// Whether the answers in `out` are written now: when there are some and either they reach
/// [`TCP_WRITE_BATCH`] or the read buffer holds no whole query to answer first (pipelined
/// queries that arrived together get their answers in one write; a client waiting for an
/// answer never waits on another query).
pub fn flush_due(out: &[u8], buffered: &[u8]) -> bool {
    !out.is_empty() && (out.len() >= TCP_WRITE_BATCH || !holds_whole_frame(buffered))
}

/// Whether `buffered` starts with a whole length-prefixed DNS message.
fn holds_whole_frame(buffered: &[u8]) -> bool {
    match buffered {
        [hi, lo, rest @ ..] => rest.len() >= usize::from(u16::from_be_bytes([*hi, *lo])),
        _ => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tcp_budget_stays_under_the_open_file_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63432                63432                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_open_files_limit(limits), Some(1024));
        assert_eq!(
            parse_open_files_limit(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
        assert_eq!(tcp_budget(1024, Some(1024)), 1024 - FD_RESERVE);
        assert_eq!(tcp_budget(100, Some(1024)), 100);
        assert_eq!(tcp_budget(1024, None), 1024);
        assert_eq!(tcp_budget(1024, Some(10)), 1, "always at least one");
    }

    #[test]
    fn udp_workers_get_reuseport_sockets_on_one_address_or_share_one_without_the_option() {
        // With the option on the first socket every worker binds its own; without it they
        // share handles of the first (none has the option).
        for reuse_port in [true, false] {
            let first = bind_udp("127.0.0.1:0".parse().unwrap(), reuse_port).unwrap();
            let addr = first.local_addr().unwrap();
            let sockets = udp_sockets(first, 3).unwrap();
            assert_eq!(sockets.len(), 3);
            for s in &sockets {
                assert_eq!(s.local_addr().unwrap(), addr);
                assert_eq!(socket2::SockRef::from(s).reuse_port().unwrap(), reuse_port);
                assert_eq!(s.read_timeout().unwrap(), Some(UDP_CANCEL_POLL));
            }
        }
    }

    #[test]
    fn pipelined_answers_wait_only_for_whole_buffered_queries() {
        let answer = [0u8; 14];
        // Nothing to write.
        assert!(!flush_due(&[], &[]));
        assert!(!flush_due(&[], &[0, 2, 1, 2]));
        // Nothing buffered, or only part of the next query: write now.
        assert!(flush_due(&answer, &[]));
        assert!(flush_due(&answer, &[0]));
        assert!(flush_due(&answer, &[0, 3, 1, 2]));
        // A whole query is buffered: answer it first.
        assert!(!flush_due(&answer, &[0, 2, 1, 2]));
        assert!(!flush_due(&answer, &[0, 0]));
        assert!(!flush_due(&answer, &[0, 2, 1, 2, 0, 9]));
        // Unless the batch is full.
        assert!(flush_due(&vec![0u8; TCP_WRITE_BATCH], &[0, 2, 1, 2]));
        let mut out = Vec::new();
        push_framed(&mut out, &[7, 8, 9]).unwrap();
        assert_eq!(out, [0, 3, 7, 8, 9]);
        assert!(push_framed(&mut out, &vec![0u8; 65536]).is_err());
    }

    #[test]
    fn udp_thread_names_fit_linux_limit() {
        assert_eq!(udp_thread_name(65535, 9), "dns-udp65535.9");
        assert!(udp_thread_name(65535, 9).len() <= 15);
    }
}
