//! `xcc dns` over real sockets: every answer rule over UDP and TCP, XCC v1's DNS cases,
//! updates, readiness, truncation, malformed input and shutdown.

#![allow(clippy::unwrap_used)]

use crate::dns_common::*;
use hickory_proto::op::{Edns, Message, ResponseCode};
use hickory_proto::rr::{DNSClass, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use xcc_dns::answer::Settings;
use xcc_dns::index::{DnsFeed, DnsIndex, FeedSource};
use xcc_dns::metrics::{self, DnsMetrics};
use xcc_dns::server::{ServerConfig, udp_thread_name};
use xcc_dns::wire::Transport;
use xcc_dns::zone::ServiceKey;

fn services() -> Vec<xcc_dns::zone::ServiceInfo> {
    vec![
        fqdn_svc("some-service", "some-service.some.domain", &["1.2.3.4"]),
        fqdn_svc(
            "another-service",
            "another-service.some.domain",
            &["2.3.4.5"],
        ),
        fqdn_svc("dual", "dual.xcc.test", &["10.0.0.1", "fd00::1"]),
        mcs_svc("bar", "web", &["10.1.0.1"]),
    ]
}

/// (name, type, rcode, answers, the authority record's prefix)
type Case = (
    &'static str,
    RecordType,
    ResponseCode,
    Vec<String>,
    Option<String>,
);

async fn server() -> Harness {
    let feed = ready_feed(&["some.domain", "xcc.test", "clusterset.local"], services());
    start(feed, ServerConfig::default()).await
}

#[tokio::test]
async fn every_answer_rule_over_udp_and_tcp() {
    let h = server().await;
    let soa = |zone: &str| format!("{zone} 5 SOA ns.dns.{zone} hostmaster.{zone}");
    // (name, type, rcode, answers, authority starts with)
    let cases: Vec<Case> = vec![
        ("dual.xcc.test.", RecordType::A, ResponseCode::NoError, vec!["dual.xcc.test. 5 A 10.0.0.1".into()], None),
        ("dual.xcc.test.", RecordType::AAAA, ResponseCode::NoError, vec!["dual.xcc.test. 5 AAAA fd00::1".into()], None),
        ("DUAL.Xcc.Test.", RecordType::A, ResponseCode::NoError, vec!["DUAL.Xcc.Test. 5 A 10.0.0.1".into()], None),
        (
            "web.bar.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::NoError,
            vec!["web.bar.svc.clusterset.local. 5 A 10.1.0.1".into()],
            None,
        ),
        (
            "_http._tcp.web.bar.svc.clusterset.local.",
            RecordType::SRV,
            ResponseCode::NoError,
            vec!["_http._tcp.web.bar.svc.clusterset.local. 5 SRV 0 100 8080 web.bar.svc.clusterset.local.".into()],
            None,
        ),
        ("xcc.test.", RecordType::NS, ResponseCode::NoError, vec!["xcc.test. 5 NS ns.dns.xcc.test.".into()], None),
        // AAAA on an IPv4-only name: NODATA.
        ("some-service.some.domain.", RecordType::AAAA, ResponseCode::NoError, vec![], Some(soa("some.domain."))),
        ("some-service.some.domain.", RecordType::TXT, ResponseCode::NoError, vec![], Some(soa("some.domain."))),
        ("svc.clusterset.local.", RecordType::A, ResponseCode::NoError, vec![], Some(soa("clusterset.local."))),
        ("nope.xcc.test.", RecordType::A, ResponseCode::NXDomain, vec![], Some(soa("xcc.test."))),
        ("example.com.", RecordType::A, ResponseCode::Refused, vec![], None),
    ];
    for via in [Via::Udp, Via::Tcp] {
        for (name, qtype, rcode, answers, authority) in &cases {
            let m = ask(h.addr, via, name, *qtype).await;
            let what = format!("{name} {qtype} over {via:?}");
            assert_eq!(m.metadata.response_code, *rcode, "{what}");
            assert_eq!(
                m.metadata.authoritative,
                *rcode != ResponseCode::Refused,
                "{what}"
            );
            assert_eq!(lines(&m.answers), *answers, "{what}");
            match authority {
                None => assert!(m.authorities.is_empty(), "{what}"),
                Some(prefix) => {
                    assert_eq!(m.authorities.len(), 1, "{what}");
                    assert!(
                        lines(&m.authorities)[0].starts_with(prefix.as_str()),
                        "{what}: {:?}",
                        lines(&m.authorities)
                    );
                }
            }
        }
        let m = ask(h.addr, via, "xcc.test.", RecordType::SOA).await;
        assert!(
            lines(&m.answers)[0]
                .starts_with("xcc.test. 5 SOA ns.dns.xcc.test. hostmaster.xcc.test. ")
        );
        let m = ask(
            h.addr,
            via,
            "_http._tcp.web.bar.svc.clusterset.local.",
            RecordType::SRV,
        )
        .await;
        assert_eq!(
            lines(&m.additionals),
            vec!["web.bar.svc.clusterset.local. 5 A 10.1.0.1"]
        );
    }
    // Counted by rcode and transport: 11 cases + SOA + SRV, each over both transports.
    for t in [Transport::Udp, Transport::Tcp] {
        assert_eq!(
            h.metrics.queries_with(t, ResponseCode::NoError),
            11,
            "{t:?}"
        );
        assert_eq!(
            h.metrics.queries_with(t, ResponseCode::NXDomain),
            1,
            "{t:?}"
        );
        assert_eq!(h.metrics.queries_with(t, ResponseCode::Refused), 1, "{t:?}");
    }
}

#[tokio::test]
async fn fqdn_names_answer_a_nxdomain_and_nodata_over_udp_and_tcp() {
    let feed = ready_feed(
        &["some.domain"],
        vec![
            fqdn_svc("a", "some-service.some.domain", &["1.2.3.4"]),
            fqdn_svc("b", "another-service.some.domain", &["2.3.4.5"]),
        ],
    );
    let h = start(feed, ServerConfig::default()).await;
    let one_a = |m: &Message, owner: &str, addr: &str| {
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1);
        let r = &m.answers[0];
        assert_eq!(r.record_type(), RecordType::A);
        assert_eq!(r.dns_class, DNSClass::IN);
        // The reference's TTL was 30; ours is the configured value (default 5).
        assert_eq!(r.ttl, 5);
        assert_eq!(r.name.to_string(), owner);
        assert_eq!(r.data.to_string(), addr);
    };
    // A: one answer, TTL 30.
    let m = ask(h.addr, Via::Udp, "some-service.some.domain.", RecordType::A).await;
    one_a(&m, "some-service.some.domain.", "1.2.3.4");
    // The other name of the zone.
    let m = ask(
        h.addr,
        Via::Udp,
        "another-service.some.domain.",
        RecordType::A,
    )
    .await;
    one_a(&m, "another-service.some.domain.", "2.3.4.5");
    // The owner name is the query name as asked.
    let m = ask(
        h.addr,
        Via::Udp,
        "ANOTHER-SERVICE.some.domain.",
        RecordType::A,
    )
    .await;
    one_a(&m, "ANOTHER-SERVICE.some.domain.", "2.3.4.5");
    // A missing name: NXDOMAIN.
    let m = ask(h.addr, Via::Udp, "not-exists.some.domain.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    // AAAA of a name with only an IPv4 address: NODATA (XCC v1 said NXDOMAIN).
    let m = ask(
        h.addr,
        Via::Udp,
        "some-service.some.domain.",
        RecordType::AAAA,
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty());
    assert_eq!(m.authorities.len(), 1);
    assert_eq!(m.authorities[0].record_type(), RecordType::SOA);
}

#[tokio::test]
async fn the_configured_ttl_is_served() {
    let feed = ready_feed(&["xcc.test"], services());
    let config = ServerConfig {
        settings: Settings {
            ttl: 30,
            ..Settings::default()
        },
        ..ServerConfig::default()
    };
    let h = start(feed, config).await;
    let m = ask(h.addr, Via::Tcp, "dual.xcc.test.", RecordType::A).await;
    assert_eq!(m.answers[0].ttl, 30);
    let m = ask(h.addr, Via::Udp, "nope.xcc.test.", RecordType::A).await;
    assert_eq!(m.authorities[0].ttl, 30);
}

fn soa_serial(m: &Message) -> u32 {
    match &m.answers[0].data {
        hickory_proto::rr::RData::SOA(soa) => soa.serial,
        other => panic!("not an SOA: {other:?}"),
    }
}

#[tokio::test]
async fn a_feed_change_is_visible_in_the_next_answer() {
    let h = server().await;
    let name = "late.xcc.test.";
    let m = ask(h.addr, Via::Udp, name, RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    let serial0 = soa_serial(&ask(h.addr, Via::Udp, "xcc.test.", RecordType::SOA).await);
    // The feed publishes synchronously; the server reads the newest snapshot per query.
    h.feed
        .apply_service(fqdn_svc("late", "late.xcc.test", &["10.9.0.1"]));
    let m = ask(h.addr, Via::Udp, name, RecordType::A).await;
    assert_eq!(lines(&m.answers), vec!["late.xcc.test. 5 A 10.9.0.1"]);
    let serial1 = soa_serial(&ask(h.addr, Via::Tcp, "xcc.test.", RecordType::SOA).await);
    assert!(serial1 > serial0, "{serial1} > {serial0}");
    // A cluster IP change, then a delete.
    h.feed
        .apply_service(fqdn_svc("late", "late.xcc.test", &["10.9.0.2"]));
    let m = ask(h.addr, Via::Tcp, name, RecordType::A).await;
    assert_eq!(lines(&m.answers), vec!["late.xcc.test. 5 A 10.9.0.2"]);
    h.feed.delete_service(&ServiceKey::new("ns", "late"));
    let m = ask(h.addr, Via::Udp, name, RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    // Unrelated zones keep their serial.
    let some = ask(h.addr, Via::Udp, "some.domain.", RecordType::SOA).await;
    let again = ask(h.addr, Via::Udp, "some.domain.", RecordType::SOA).await;
    assert_eq!(soa_serial(&some), soa_serial(&again));
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: dns\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(GUARD, s.read_to_string(&mut out))
        .await
        .expect("no HTTP reply")
        .unwrap();
    out
}

#[tokio::test]
async fn not_ready_before_the_first_sync() {
    let index = DnsIndex::new(vec!["xcc.test".into()], [FeedSource::Services]);
    let feed = DnsFeed::new(index);
    let h = start(feed.clone(), ServerConfig::default()).await;
    let mut registry = prometheus_client::registry::Registry::default();
    h.metrics.register(&mut registry);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(xcc_controller::probes::serve(
        listener,
        metrics::probes(registry, feed.subscribe()),
        cancel.clone(),
    ));
    tokio::spawn(metrics::observe_snapshots(
        feed.subscribe(),
        h.metrics.clone(),
        cancel.clone(),
    ));

    // An event before the first full listing does not make the server ready.
    feed.apply_service(fqdn_svc("a", "a.xcc.test", &["10.0.0.1"]));
    for via in [Via::Udp, Via::Tcp] {
        let m = ask(h.addr, via, "a.xcc.test.", RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail, "{via:?}");
        assert!(m.answers.is_empty());
    }
    assert!(http_get(http, "/readyz").await.starts_with("HTTP/1.1 503"));

    feed.reset_services(vec![fqdn_svc("a", "a.xcc.test", &["10.0.0.1"])]);
    let m = ask(h.addr, Via::Udp, "a.xcc.test.", RecordType::A).await;
    assert_eq!(lines(&m.answers), vec!["a.xcc.test. 5 A 10.0.0.1"]);
    assert!(http_get(http, "/readyz").await.starts_with("HTTP/1.1 200"));
    assert!(http_get(http, "/healthz").await.starts_with("HTTP/1.1 200"));
    let body = http_get(http, "/metrics").await;
    assert!(
        body.contains("xcc_dns_queries_total{rcode=\"servfail\",transport=\"udp\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("xcc_dns_queries_total{rcode=\"noerror\",transport=\"udp\"} 1"),
        "{body}"
    );
    cancel.cancel();
}

#[tokio::test]
async fn large_answers_truncate_over_udp_and_complete_over_tcp() {
    let ips: Vec<String> = (1..=60).map(|i| format!("10.3.0.{i}")).collect();
    let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
    let feed = ready_feed(&["xcc.test"], vec![fqdn_svc("big", "big.xcc.test", &ips)]);
    let h = start(feed, ServerConfig::default()).await;
    let m = ask(h.addr, Via::Udp, "big.xcc.test.", RecordType::A).await;
    assert!(m.metadata.truncation);
    assert!(m.answers.is_empty());
    let m = ask(h.addr, Via::Tcp, "big.xcc.test.", RecordType::A).await;
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 60);
    // With EDNS (buffer 1232) it fits in one datagram.
    let mut q = query(1, "big.xcc.test.", RecordType::A);
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    q.set_edns(edns);
    let raw = udp_raw(h.addr, ip("127.0.0.1"), &q.to_vec().unwrap()).await;
    let m = Message::from_vec(&raw).unwrap();
    assert_eq!((m.metadata.truncation, m.answers.len()), (false, 60));
    assert!(raw.len() <= 1232);
}

#[tokio::test]
async fn malformed_queries_never_stop_the_server() {
    let h = server().await;
    let valid = query(9, "dual.xcc.test.", RecordType::A).to_vec().unwrap();
    // Garbage with a valid header: FORMERR with the id echoed.
    let mut bad = valid.clone();
    bad.truncate(15);
    let reply = Message::from_vec(&udp_raw(h.addr, ip("127.0.0.1"), &bad).await).unwrap();
    assert_eq!(
        (reply.metadata.id, reply.metadata.response_code),
        (9, ResponseCode::FormErr)
    );
    let reply = Message::from_vec(&tcp_raw(h.addr, ip("127.0.0.1"), &bad).await).unwrap();
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
    // Things that get no answer at all: a runt datagram, a truncated TCP frame, a response.
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&[1, 2, 3], h.addr).await.unwrap();
    let mut stream = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    stream.write_all(&[0x01, 0x00, 0xAB]).await.unwrap();
    drop(stream);
    let mut response = query(3, "dual.xcc.test.", RecordType::A);
    response.metadata.message_type = hickory_proto::op::MessageType::Response;
    sock.send_to(&response.to_vec().unwrap(), h.addr)
        .await
        .unwrap();
    // Every single-byte corruption of a valid query, over UDP.
    for i in 0..valid.len() {
        let mut b = valid.clone();
        b[i] ^= 0xFF;
        sock.send_to(&b, h.addr).await.unwrap();
    }
    // Still serving, on both transports.
    for via in [Via::Udp, Via::Tcp] {
        let m = ask(h.addr, via, "dual.xcc.test.", RecordType::A).await;
        assert_eq!(m.answers.len(), 1, "{via:?}");
    }
    assert!(h.metrics.dropped.get() >= 1);
}

#[tokio::test]
async fn a_datagram_longer_than_a_receive_slot_gets_formerr_and_bursts_get_every_answer() {
    let h = server().await;
    // A valid query followed by padding up to past a slot: what is left after the cut must not
    // be answered as if it were the query.
    let mut long = query(21, "dual.xcc.test.", RecordType::A).to_vec().unwrap();
    long.resize(xcc_dns::udp::UDP_SLOT + 1, 0);
    let reply = Message::from_vec(&udp_raw(h.addr, ip("127.0.0.1"), &long).await).unwrap();
    assert_eq!(
        (
            reply.metadata.id,
            reply.metadata.response_code,
            reply.answers.len()
        ),
        (21, ResponseCode::FormErr, 0)
    );
    // More queries at once than one batch takes: every one is answered, each with its own id.
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let burst = 3 * xcc_dns::udp::UDP_BATCH + 1;
    for id in 0..burst {
        let q = query(id as u16, "dual.xcc.test.", RecordType::A);
        sock.send_to(&q.to_vec().unwrap(), h.addr).await.unwrap();
    }
    let mut ids = Vec::new();
    let mut buf = vec![0u8; 4096];
    while ids.len() < burst {
        let n = tokio::time::timeout(GUARD, sock.recv(&mut buf))
            .await
            .expect("an answer of the burst is missing")
            .unwrap();
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(lines(&m.answers), ["dual.xcc.test. 5 A 10.0.0.1"]);
        ids.push(m.metadata.id as usize);
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..burst).collect::<Vec<_>>());
}

#[tokio::test]
async fn shutdown_is_graceful() {
    let h = server().await;
    // An idle TCP connection must not hold shutdown up.
    let _idle = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let m = ask(h.addr, Via::Udp, "dual.xcc.test.", RecordType::A).await;
    assert_eq!(m.answers.len(), 1);
    h.cancel.cancel();
    let result = tokio::time::timeout(GUARD, h.task)
        .await
        .expect("server did not stop");
    assert!(result.unwrap().is_ok());
}

/// Names of this process's threads (`/proc/self/task/*/comm`).
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .map(|n| n.trim_end().to_string())
        .collect()
}

#[tokio::test]
async fn every_udp_worker_thread_answers_and_all_end_at_shutdown() {
    let config = ServerConfig {
        udp_workers: 3,
        ..ServerConfig::default()
    };
    let h = start(ready_feed(&["xcc.test"], services()), config).await;
    let port = h.addr.port();
    let ours = |names: Vec<String>| {
        let mut mine: Vec<String> = names
            .into_iter()
            .filter(|n| n.starts_with(&format!("dns-udp{port}.")))
            .collect();
        mine.sort();
        mine
    };
    let expected: Vec<String> = (0..3).map(|i| udp_thread_name(port, i)).collect();
    // `run` accepts TCP only once every UDP worker thread runs (and so carries its name): a
    // TCP answer proves all three are up. (A UDP answer proves only that one of them is.)
    ask(h.addr, Via::Tcp, "dual.xcc.test.", RecordType::A).await;
    assert_eq!(ours(thread_names()), expected);
    // On port 0 the three threads share one socket (see `DnsServer::bind`): whichever is free
    // takes the next query.
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..48 {
        let addr = h.addr;
        clients.spawn(async move { ask(addr, Via::Udp, "dual.xcc.test.", RecordType::A).await });
    }
    let mut answered = 0;
    while let Some(m) = clients.join_next().await {
        assert_eq!(lines(&m.unwrap().answers), ["dual.xcc.test. 5 A 10.0.0.1"]);
        answered += 1;
    }
    assert_eq!(answered, 48);
    h.cancel.cancel();
    let result = tokio::time::timeout(GUARD, h.task)
        .await
        .expect("server did not stop");
    // `run` returns only after joining its threads: a worker that missed the cancellation
    // would hold it past the guard.
    assert!(result.unwrap().is_ok());
}

#[tokio::test]
async fn metrics_register_and_count() {
    let metrics = DnsMetrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    metrics.query(Transport::Tcp, ResponseCode::Refused);
    metrics.forward(Transport::Udp);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    assert!(out.contains("xcc_dns_queries_total{rcode=\"refused\",transport=\"tcp\"} 1"));
    assert!(out.contains("xcc_dns_forwarded_total{transport=\"udp\"} 1"));
    assert_eq!(metrics.forwarded_with(Transport::Udp), 1);
}

/// One query over a new TCP connection: `Some(reply)`, or `None` when the server closed the
/// connection without answering (it was refused).
async fn try_tcp(server: std::net::SocketAddr, from: &str) -> Option<Message> {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(std::net::SocketAddr::new(ip(from), 0)).unwrap();
    let mut stream = sock.connect(server).await.unwrap();
    exchange(&mut stream).await
}

/// Ask `dual.xcc.test. A` on an open connection; `None` if the server closed it instead.
async fn exchange(stream: &mut tokio::net::TcpStream) -> Option<Message> {
    let q = query(9, "dual.xcc.test.", RecordType::A).to_vec().unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    // A refused connection may already be reset when we write.
    stream.write_all(&framed).await.ok()?;
    let mut len = [0u8; 2];
    match tokio::time::timeout(GUARD, stream.read_exact(&mut len))
        .await
        .expect("the server neither answered nor closed the connection")
    {
        Ok(_) => {}
        Err(_) => return None,
    }
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await.ok()?;
    Some(Message::from_vec(&buf).unwrap())
}

/// Poll (bounded by `GUARD`) until a new TCP connection from 127.0.0.1 is answered.
async fn until_tcp_answered(server: std::net::SocketAddr) -> Message {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        if let Some(m) = try_tcp(server, "127.0.0.1").await {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no TCP connection was answered within {GUARD:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_loses_its_connection() {
    // Answers of ~1 kB (60 addresses) fill the hostile client's small receive window and the
    // server's send buffer after a few thousand queries.
    let many: Vec<String> = (1..=60).map(|i| format!("10.0.1.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let mut svcs = services();
    svcs.push(fqdn_svc("many", "many.xcc.test", &many));
    let config = ServerConfig {
        max_tcp_connections: 1,
        tcp_idle_timeout: std::time::Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let h = start(ready_feed(&["xcc.test"], svcs), config).await;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut hostile = sock.connect(h.addr).await.unwrap();
    // The only slot is taken once this connection has been answered once.
    assert!(exchange(&mut hostile).await.is_some());
    let q = query(1, "many.xcc.test.", RecordType::A).to_vec().unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    // Queries, never reading an answer: at most 50,000 (~2 MB out, ~50 MB of answers due).
    let writer = tokio::spawn(async move {
        for _ in 0..50_000 {
            if hostile.write_all(&framed).await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await;
    });
    let m = until_tcp_answered(h.addr).await;
    assert_eq!(lines(&m.answers), vec!["dual.xcc.test. 5 A 10.0.0.1"]);
    assert_eq!(h.metrics.tcp_write_timeouts.get(), 1);
    writer.abort();
}

#[tokio::test]
async fn one_source_cannot_take_every_tcp_slot() {
    let config = ServerConfig {
        max_tcp_connections: 8,
        max_tcp_per_client: 2,
        tcp_idle_timeout: std::time::Duration::from_secs(60),
        ..ServerConfig::default()
    };
    let h = start(ready_feed(&["xcc.test"], services()), config).await;
    let connect = || async {
        let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
        assert!(exchange(&mut s).await.is_some(), "first two are served");
        s
    };
    let first = connect().await;
    let _second = connect().await;
    assert!(
        try_tcp(h.addr, "127.0.0.1").await.is_none(),
        "a third connection from 127.0.0.1 is refused"
    );
    assert_eq!(h.metrics.tcp_rejected.get(), 1);
    // Another source still gets in: the total limit is not what refused the third.
    assert!(try_tcp(h.addr, "127.0.0.2").await.is_some());
    // The slot comes back when a connection closes.
    drop(first);
    until_tcp_answered(h.addr).await;
}
