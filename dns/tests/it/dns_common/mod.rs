//! Harness for the server tests: a real `xcc dns` server on 127.0.0.1:0 fed by an in-memory
//! [`DnsFeed`], and UDP/TCP clients speaking raw hickory-proto messages. Timeouts here only
//! bound a failing test; nothing waits for time to pass.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, UdpSocket};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use xcc_dns::index::{DnsFeed, DnsIndex, FeedSource};
use xcc_dns::metrics::DnsMetrics;
use xcc_dns::server::{DnsServer, ServerConfig, ServerError};
use xcc_dns::zone::{NamedPort, PortProtocol, ServiceInfo, ServiceKey};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::names::FQDN_ANNOTATION;

/// Bound on any single exchange, so a broken server fails the test instead of hanging it.
pub const GUARD: Duration = Duration::from_secs(10);

/// A running server.
pub struct Harness {
    pub feed: DnsFeed,
    pub addr: SocketAddr,
    pub metrics: DnsMetrics,
    pub cancel: CancellationToken,
    pub task: JoinHandle<Result<(), ServerError>>,
}

/// Start a server on 127.0.0.1:0 (same port for UDP and TCP) answering from `feed`.
pub async fn start(feed: DnsFeed, config: ServerConfig) -> Harness {
    let server = DnsServer::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = server.udp_addr().unwrap();
    assert_eq!(server.tcp_addr().unwrap(), addr);
    let metrics = DnsMetrics::default();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(server.run(feed.subscribe(), config, metrics.clone(), cancel.clone()));
    Harness {
        feed,
        addr,
        metrics,
        cancel,
        task,
    }
}

/// A feed for `zones` that has completed its Services listing with `services`.
pub fn ready_feed(zones: &[&str], services: Vec<ServiceInfo>) -> DnsFeed {
    let index = DnsIndex::new(
        zones.iter().map(|z| z.to_string()).collect(),
        [FeedSource::Services],
    );
    let feed = DnsFeed::new(index);
    feed.reset_services(services);
    feed
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A Service `ns/name` with the FQDN annotation.
pub fn fqdn_svc(name: &str, fqdn: &str, ips: &[&str]) -> ServiceInfo {
    ServiceInfo {
        key: ServiceKey::new("ns", name),
        annotations: [(FQDN_ANNOTATION.to_string(), fqdn.to_string())]
            .into_iter()
            .collect(),
        cluster_ips: ips.iter().map(|s| ip(s)).collect(),
        ports: Vec::new(),
    }
}

/// An imported Service with origin annotations (MCS name) and a named port `http`.
pub fn mcs_svc(origin_ns: &str, origin: &str, ips: &[&str]) -> ServiceInfo {
    ServiceInfo {
        key: ServiceKey::new("xcc", format!("{origin}-{origin_ns}")),
        annotations: [
            (
                ORIGIN_NAMESPACE_ANNOTATION.to_string(),
                origin_ns.to_string(),
            ),
            (ORIGIN_NAME_ANNOTATION.to_string(), origin.to_string()),
        ]
        .into_iter()
        .collect(),
        cluster_ips: ips.iter().map(|s| ip(s)).collect(),
        ports: vec![NamedPort {
            name: Some("http".into()),
            port: 8080,
            protocol: PortProtocol::Tcp,
        }],
    }
}

pub fn query(id: u16, name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m
}

/// Which transport a client uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Udp,
    Tcp,
}

/// Send raw bytes over UDP from `from` (a loopback address) and return the raw reply.
pub async fn udp_raw(server: SocketAddr, from: IpAddr, bytes: &[u8]) -> Vec<u8> {
    let sock = UdpSocket::bind(SocketAddr::new(from, 0)).await.unwrap();
    sock.send_to(bytes, server).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let (n, _) = tokio::time::timeout(GUARD, sock.recv_from(&mut buf))
        .await
        .expect("no UDP reply")
        .unwrap();
    buf.truncate(n);
    buf
}

/// Send raw bytes over a new TCP connection from `from` and return the raw reply.
pub async fn tcp_raw(server: SocketAddr, from: IpAddr, bytes: &[u8]) -> Vec<u8> {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(from, 0)).unwrap();
    let mut stream = sock.connect(server).await.unwrap();
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    stream.write_all(&framed).await.unwrap();
    let mut len = [0u8; 2];
    tokio::time::timeout(GUARD, stream.read_exact(&mut len))
        .await
        .expect("no TCP reply")
        .unwrap();
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    stream.read_exact(&mut buf).await.unwrap();
    buf
}

/// Ask `name`/`qtype` over `via` from `from`; the decoded reply, checked to match the query.
pub async fn ask_from(
    server: SocketAddr,
    via: Via,
    from: &str,
    name: &str,
    qtype: RecordType,
) -> Message {
    let id = 0x1234;
    let q = query(id, name, qtype).to_vec().unwrap();
    let raw = match via {
        Via::Udp => udp_raw(server, ip(from), &q).await,
        Via::Tcp => tcp_raw(server, ip(from), &q).await,
    };
    let m = Message::from_vec(&raw).unwrap();
    assert_eq!(m.metadata.id, id);
    assert_eq!(m.metadata.message_type, MessageType::Response);
    m
}

/// Ask from 127.0.0.1.
pub async fn ask(server: SocketAddr, via: Via, name: &str, qtype: RecordType) -> Message {
    ask_from(server, via, "127.0.0.1", name, qtype).await
}

/// `owner TTL TYPE rdata` of each record of a section.
pub fn lines(records: &[hickory_proto::rr::Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| format!("{} {} {} {}", r.name, r.ttl, r.record_type(), r.data))
        .collect()
}
