//! Transparent resolution and namespace mapping over real sockets, and relaying to
//! an upstream resolver started by the test.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::dns_common::*;
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::mpsc;
use xcc_dns::answer::Settings;
use xcc_dns::index::{DnsFeed, DnsIndex, FeedSource};
use xcc_dns::server::ServerConfig;
use xcc_dns::wire::Transport;
use xcc_proto::mapping::NAMESPACE_ANNOTATION;

/// Source addresses of the asking pods (loopback aliases).
const POD_FOO: &str = "127.0.0.2";
const POD_BAZ: &str = "127.0.0.3";
const NOT_A_POD: &str = "127.0.0.1";
/// What the stub upstream answers for every A question.
const UPSTREAM_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);

/// A stub upstream resolver on 127.0.0.1 (UDP and TCP, same port): answers every question with
/// one A record and reports the exact bytes it received.
async fn stub_upstream() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
    // UDP and TCP on the same port: the port the kernel picks for UDP may be taken for TCP by
    // another process, so pick again until both bind.
    let mut attempt = 0;
    let (udp, tcp, addr) = loop {
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        match TcpListener::bind(addr).await {
            Ok(tcp) => break (udp, tcp, addr),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && attempt < 50 => attempt += 1,
            Err(e) => panic!("binding TCP {addr}: {e}"),
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let reply = |bytes: &[u8]| {
        let q = Message::from_vec(bytes).unwrap();
        let mut m = Message::response(q.metadata.id, q.metadata.op_code);
        m.metadata.recursion_available = true;
        m.add_queries(q.queries.clone());
        m.add_answer(Record::from_rdata(
            q.queries[0].name().clone(),
            60,
            RData::A(A(UPSTREAM_ANSWER)),
        ));
        m.to_vec().unwrap()
    };
    let utx = tx.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
            utx.send(buf[..n].to_vec()).unwrap();
            udp.send_to(&reply(&buf[..n]), peer).await.unwrap();
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            let mut len = [0u8; 2];
            s.read_exact(&mut len).await.unwrap();
            let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
            s.read_exact(&mut buf).await.unwrap();
            tx.send(buf.clone()).unwrap();
            let r = reply(&buf);
            let mut framed = (r.len() as u16).to_be_bytes().to_vec();
            framed.extend(r);
            s.write_all(&framed).await.unwrap();
        }
    });
    (addr, rx)
}

/// Zones `xcc.test` and `clusterset.local`; `web` exported in clusterset namespaces `bar` and
/// `baz`; a pod in `foo` (annotated `bar`) and one in `baz` (unannotated).
fn example_feed() -> DnsFeed {
    let index = DnsIndex::new(
        vec!["xcc.test".into(), "clusterset.local".into()],
        [
            FeedSource::Services,
            FeedSource::Pods,
            FeedSource::Namespaces,
        ],
    );
    let feed = DnsFeed::new(index);
    feed.update(|i| {
        i.reset_services([
            mcs_svc("bar", "web", &["10.1.0.1"]),
            mcs_svc("baz", "web", &["10.2.0.1"]),
            fqdn_svc("x", "x.xcc.test", &["10.0.0.9"]),
        ]);
        i.reset_pods([
            ("foo".into(), "client".into(), vec![ip(POD_FOO)]),
            ("baz".into(), "client".into(), vec![ip(POD_BAZ)]),
        ]);
        let annotated = BTreeMap::from([(NAMESPACE_ANNOTATION.to_string(), "bar".to_string())]);
        i.reset_namespaces([("foo".into(), annotated), ("baz".into(), BTreeMap::new())])
    });
    feed
}

fn transparent_config(upstream: SocketAddr) -> ServerConfig {
    ServerConfig {
        settings: Settings {
            transparent: true,
            ..Settings::default()
        },
        upstream: Some(upstream),
        ..ServerConfig::default()
    }
}

/// The single A answer (checking the owner echoes the question) or the rcode.
async fn resolve(server: SocketAddr, via: Via, from: &str, name: &str) -> String {
    let m = ask_from(server, via, from, name, RecordType::A).await;
    match m.answers.as_slice() {
        [] => format!("{:?}", m.metadata.response_code),
        [r] => {
            assert_eq!(r.name.to_string(), name);
            r.data.to_string()
        }
        more => panic!("several answers: {more:?}"),
    }
}

#[tokio::test]
async fn namespace_mapping_table_for_mapped_and_unmapped_namespaces() {
    let (upstream, mut received) = stub_upstream().await;
    let h = start(example_feed(), transparent_config(upstream)).await;
    let up = UPSTREAM_ANSWER.to_string();
    let table = [
        // Pods in `foo` (mapped to clusterset namespace `bar`).
        (POD_FOO, "web.", "10.1.0.1"),
        (POD_FOO, "web.foo.", "10.1.0.1"),
        (POD_FOO, "web.foo.svc.clusterset.local.", "10.1.0.1"),
        (POD_FOO, "web.bar.svc.clusterset.local.", "10.1.0.1"),
        (POD_FOO, "Web.Foo.", "10.1.0.1"),
        // Pods in `baz` (unmapped).
        (POD_BAZ, "web.", "10.2.0.1"),
        (POD_BAZ, "web.baz.", "10.2.0.1"),
        (POD_BAZ, "web.baz.svc.clusterset.local.", "10.2.0.1"),
        (POD_BAZ, "web.foo.svc.clusterset.local.", "NXDomain"),
        // Not a known pod: `<svc>` has no namespace to be relative to, so it goes upstream.
        (NOT_A_POD, "web.", up.as_str()),
        (NOT_A_POD, "web.bar.", "10.1.0.1"),
        // Our zones stay authoritative; everything else goes upstream.
        (POD_FOO, "x.xcc.test.", "10.0.0.9"),
        (POD_FOO, "nope.xcc.test.", "NXDomain"),
        (POD_FOO, "example.com.", up.as_str()),
        (
            POD_FOO,
            "kubernetes.default.svc.cluster.local.",
            up.as_str(),
        ),
    ];
    for via in [Via::Udp, Via::Tcp] {
        for (from, name, expected) in table {
            assert_eq!(
                resolve(h.addr, via, from, name).await,
                expected,
                "{name} from {from} over {via:?}"
            );
        }
    }
    // 3 forwarded names per transport; the upstream saw exactly those queries.
    assert_eq!(h.metrics.forwarded_with(Transport::Udp), 3);
    assert_eq!(h.metrics.forwarded_with(Transport::Tcp), 3);
    let mut names = Vec::new();
    while let Ok(bytes) = received.try_recv() {
        names.push(
            Message::from_vec(&bytes).unwrap().queries[0]
                .name()
                .to_string(),
        );
    }
    assert_eq!(names.len(), 6, "{names:?}");
}

#[tokio::test]
async fn forwarded_queries_travel_unchanged_both_ways() {
    let (upstream, mut received) = stub_upstream().await;
    let h = start(example_feed(), transparent_config(upstream)).await;
    let mut q = query(0x4321, "MiXeD.Example.COM.", RecordType::A);
    q.metadata.recursion_desired = true;
    let sent = q.to_vec().unwrap();
    for via in [Via::Udp, Via::Tcp] {
        let raw = match via {
            Via::Udp => udp_raw(h.addr, ip(POD_FOO), &sent).await,
            Via::Tcp => tcp_raw(h.addr, ip(POD_FOO), &sent).await,
        };
        // The upstream got our client's bytes, and the client got the upstream's reply.
        assert_eq!(received.recv().await.unwrap(), sent, "{via:?}");
        let m = Message::from_vec(&raw).unwrap();
        assert_eq!(m.metadata.id, 0x4321);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert!(
            m.metadata.recursion_available,
            "the upstream's flags pass through"
        );
        assert!(!m.metadata.authoritative);
        assert_eq!(
            lines(&m.answers),
            vec![format!("MiXeD.Example.COM. 60 A {UPSTREAM_ANSWER}")]
        );
    }
}

#[tokio::test]
async fn an_unreachable_upstream_gives_servfail() {
    // A port nothing listens on: UDP gets ICMP port unreachable, TCP a reset.
    let closed = {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        s.local_addr().unwrap()
    };
    let h = start(example_feed(), transparent_config(closed)).await;
    for via in [Via::Udp, Via::Tcp] {
        let m = ask_from(h.addr, via, POD_FOO, "example.com.", RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail, "{via:?}");
        assert_eq!(m.queries[0].name().to_string(), "example.com.");
    }
    assert_eq!(h.metrics.forward_failures.get(), 2);
    // Our own names are unaffected.
    assert_eq!(resolve(h.addr, Via::Udp, POD_FOO, "web.").await, "10.1.0.1");
}

#[tokio::test]
async fn a_silent_upstream_times_out_into_servfail() {
    // Bound but never answering.
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let config = ServerConfig {
        forward_timeout: Duration::from_millis(200),
        ..transparent_config(silent.local_addr().unwrap())
    };
    let h = start(example_feed(), config).await;
    let m = ask_from(h.addr, Via::Udp, POD_FOO, "example.com.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    drop(silent);
}

#[tokio::test]
async fn transparent_srv_and_nodata() {
    let (upstream, _received) = stub_upstream().await;
    let h = start(example_feed(), transparent_config(upstream)).await;
    for via in [Via::Udp, Via::Tcp] {
        let m = ask_from(h.addr, via, POD_FOO, "_http._tcp.web.", RecordType::SRV).await;
        assert_eq!(
            lines(&m.answers),
            vec!["_http._tcp.web. 5 SRV 0 100 8080 web.bar.svc.clusterset.local."]
        );
        assert_eq!(
            lines(&m.additionals),
            vec!["web.bar.svc.clusterset.local. 5 A 10.1.0.1"]
        );
        let m = ask_from(h.addr, via, POD_FOO, "web.", RecordType::AAAA).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative && m.answers.is_empty() && m.authorities.is_empty());
    }
}

#[tokio::test]
async fn namespace_changes_apply_to_the_next_query() {
    let (upstream, _received) = stub_upstream().await;
    let feed = example_feed();
    let h = start(feed.clone(), transparent_config(upstream)).await;
    assert_eq!(resolve(h.addr, Via::Udp, POD_FOO, "web.").await, "10.1.0.1");
    // Remove the mapping annotation from `foo`: its pods now resolve in clusterset `foo`, which
    // has no `web`, so the short name goes upstream.
    feed.apply_namespace("foo", &BTreeMap::new()).unwrap();
    assert_eq!(
        resolve(h.addr, Via::Udp, POD_FOO, "web.").await,
        UPSTREAM_ANSWER.to_string()
    );
    // The pod moves to `baz` (same address, new pod).
    feed.update(|i| {
        i.delete_pod("foo", "client");
        i.apply_pod("baz", "client2", &[ip(POD_FOO)]);
    });
    assert_eq!(resolve(h.addr, Via::Tcp, POD_FOO, "web.").await, "10.2.0.1");
}
