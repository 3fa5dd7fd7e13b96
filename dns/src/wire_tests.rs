use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use xcc_proto::names::FQDN_ANNOTATION;

use super::*;
use crate::zone::{ServiceInfo, ServiceKey, ZoneSet};

fn source() -> IpAddr {
    "127.0.0.1".parse().unwrap()
}

fn snapshot() -> Snapshot {
    let many: Vec<IpAddr> = (1..=60).map(|i| IpAddr::from([10, 0, 1, i])).collect();
    let services = [
        ServiceInfo {
            key: ServiceKey::new("ns", "one"),
            annotations: [(FQDN_ANNOTATION, "one.xcc.test")].into_iter().collect(),
            cluster_ips: vec!["10.0.0.1".parse().unwrap()],
            ports: Vec::new(),
        },
        ServiceInfo {
            key: ServiceKey::new("ns", "srv"),
            annotations: [(FQDN_ANNOTATION, "srv.xcc.test")].into_iter().collect(),
            cluster_ips: (1..=60).map(|i| IpAddr::from([10, 0, 2, i])).collect(),
            ports: vec![crate::zone::NamedPort {
                name: Some("http".into()),
                port: 80,
                protocol: crate::zone::PortProtocol::Tcp,
            }],
        },
        ServiceInfo {
            key: ServiceKey::new("ns", "many"),
            annotations: [(FQDN_ANNOTATION, "many.xcc.test")].into_iter().collect(),
            cluster_ips: many,
            ports: Vec::new(),
        },
    ];
    Snapshot {
        zones: Arc::new(ZoneSet::build(&["xcc.test".into()], &services, None, 1)),
        ready: true,
        ..Snapshot::default()
    }
}

fn query(id: u16, name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m
}

fn run(msg: &Message, transport: Transport, s: &Settings) -> Outcome {
    handle(&msg.to_vec().unwrap(), source(), transport, &snapshot(), s)
}

fn reply(outcome: Outcome) -> (Message, ResponseCode) {
    match outcome {
        Outcome::Reply { bytes, rcode } => (Message::from_vec(&bytes).unwrap(), rcode),
        other => panic!("expected a reply, got {other:?}"),
    }
}

#[test]
fn answers_echo_id_question_and_rd_and_set_aa() {
    let (m, rcode) = reply(run(
        &query(4242, "ONE.xcc.test.", RecordType::A),
        Transport::Udp,
        &Settings::default(),
    ));
    assert_eq!(rcode, ResponseCode::NoError);
    assert_eq!(m.metadata.id, 4242);
    assert_eq!(m.metadata.message_type, MessageType::Response);
    assert!(m.metadata.authoritative && m.metadata.recursion_desired);
    assert!(!m.metadata.recursion_available && !m.metadata.truncation);
    assert_eq!(m.queries[0].name().to_string(), "ONE.xcc.test.");
    assert_eq!(m.answers.len(), 1);
    assert!(m.edns.is_none(), "no OPT unless the query had one");
}

#[test]
fn edns_is_answered_and_bad_versions_refused() {
    let mut q = query(1, "one.xcc.test.", RecordType::A);
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    q.set_edns(edns.clone());
    let (m, _) = reply(run(&q, Transport::Udp, &Settings::default()));
    assert_eq!(m.edns.as_ref().map(|e| e.max_payload()), Some(EDNS_PAYLOAD));
    edns.set_version(1);
    q.set_edns(edns);
    let (m, rcode) = reply(run(&q, Transport::Udp, &Settings::default()));
    assert_eq!(rcode, ResponseCode::BADVERS);
    // BADVERS and BADSIG share code 16; hickory decodes it as BADSIG.
    assert_eq!(u16::from(m.metadata.response_code), 16);
    assert!(m.answers.is_empty());
}

#[test]
fn large_udp_answers_are_truncated_and_whole_over_tcp() {
    let q = query(7, "many.xcc.test.", RecordType::A);
    let (m, rcode) = reply(run(&q, Transport::Udp, &Settings::default()));
    assert_eq!(rcode, ResponseCode::NoError);
    assert!(m.metadata.truncation);
    assert!(m.answers.is_empty());
    assert_eq!(m.queries.len(), 1);
    let (m, _) = reply(run(&q, Transport::Tcp, &Settings::default()));
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 60);
    // With EDNS the client's larger buffer (capped at 1232) fits the 60 records.
    let mut q = q;
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    q.set_edns(edns);
    let (m, _) = reply(run(&q, Transport::Udp, &Settings::default()));
    assert_eq!((m.metadata.truncation, m.answers.len()), (false, 60));
}

#[test]
fn opcodes_question_counts_and_garbage() {
    let mut notify = query(9, "one.xcc.test.", RecordType::SOA);
    notify.metadata.op_code = OpCode::Notify;
    assert_eq!(
        reply(run(&notify, Transport::Udp, &Settings::default())).1,
        ResponseCode::NotImp
    );
    let mut two = query(9, "one.xcc.test.", RecordType::A);
    two.add_query(Query::query(
        Name::from_ascii("many.xcc.test.").unwrap(),
        RecordType::A,
    ));
    assert_eq!(
        reply(run(&two, Transport::Udp, &Settings::default())).1,
        ResponseCode::FormErr
    );
    let none = Message::new(9, MessageType::Query, OpCode::Query);
    assert_eq!(
        reply(run(&none, Transport::Udp, &Settings::default())).1,
        ResponseCode::FormErr
    );
    // A header that claims a question it does not carry: FORMERR with the id echoed.
    let mut bytes = query(0xBEEF, "one.xcc.test.", RecordType::A)
        .to_vec()
        .unwrap();
    bytes.truncate(14);
    let (m, rcode) = reply(handle(
        &bytes,
        source(),
        Transport::Udp,
        &snapshot(),
        &Settings::default(),
    ));
    assert_eq!((rcode, m.metadata.id), (ResponseCode::FormErr, 0xBEEF));
    // Shorter than a header, or a response: no reply at all.
    assert_eq!(
        handle(
            &bytes[..11],
            source(),
            Transport::Udp,
            &snapshot(),
            &Settings::default()
        ),
        Outcome::Drop
    );
    let mut response = query(1, "one.xcc.test.", RecordType::A);
    response.metadata.message_type = MessageType::Response;
    assert_eq!(
        run(&response, Transport::Udp, &Settings::default()),
        Outcome::Drop
    );
}

#[test]
fn forward_carries_the_id_and_failures_become_servfail() {
    let s = Settings {
        transparent: true,
        ..Settings::default()
    };
    let q = query(77, "example.com.", RecordType::A);
    assert_eq!(run(&q, Transport::Udp, &s), Outcome::Forward { id: 77 });
    let bytes = error_reply(&q.to_vec().unwrap(), ResponseCode::ServFail).unwrap();
    let m = Message::from_vec(&bytes).unwrap();
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (77, ResponseCode::ServFail)
    );
    assert_eq!(m.queries[0].name().to_string(), "example.com.");
    assert!(is_reply_to(&bytes, 77));
    assert!(!is_reply_to(&bytes, 78));
    assert!(
        !is_reply_to(&q.to_vec().unwrap(), 77),
        "a query is not a reply"
    );
}

/// Deterministic xorshift, so a failure reproduces.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn malformed_input_never_panics() {
    let snap = snapshot();
    let s = Settings {
        transparent: true,
        ..Settings::default()
    };
    let mut state = 0x9E37_79B9_7F4A_7C15;
    // Random garbage of every short length.
    for _ in 0..20_000 {
        let len = (next(&mut state) % 80) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| next(&mut state) as u8).collect();
        let _ = handle(&bytes, source(), Transport::Udp, &snap, &s);
    }
    // Every single-byte corruption of a valid query with EDNS.
    let mut q = query(5, "_http._tcp.one.xcc.test.", RecordType::SRV);
    q.set_edns(Edns::new());
    let valid = q.to_vec().unwrap();
    for i in 0..valid.len() {
        for v in [0u8, 0x3f, 0x40, 0xc0, 0xff] {
            let mut bytes = valid.clone();
            bytes[i] = v;
            let _ = handle(&bytes, source(), Transport::Tcp, &snap, &s);
            let _ = error_reply(&bytes, ResponseCode::ServFail);
        }
    }
}

#[test]
fn the_do_bit_is_echoed() {
    for dnssec_ok in [true, false] {
        let mut q = query(3, "one.xcc.test.", RecordType::A);
        let mut edns = Edns::new();
        edns.set_dnssec_ok(dnssec_ok);
        q.set_edns(edns);
        let (m, _) = reply(run(&q, Transport::Udp, &Settings::default()));
        assert_eq!(m.edns.unwrap().flags().dnssec_ok, dnssec_ok);
    }
}

#[test]
fn only_additionals_overflowing_are_dropped_without_tc() {
    // One SRV answer fits in 512 bytes; the 60 addresses of its target do not.
    let q = query(5, "_http._tcp.srv.xcc.test.", RecordType::SRV);
    let (m, rcode) = reply(run(&q, Transport::Udp, &Settings::default()));
    assert_eq!(rcode, ResponseCode::NoError);
    assert!(
        !m.metadata.truncation,
        "RFC 2181 section 9: no TC for additionals"
    );
    assert_eq!(m.answers.len(), 1);
    assert!(m.additionals.is_empty());
    let (m, _) = reply(run(&q, Transport::Tcp, &Settings::default()));
    assert_eq!((m.answers.len(), m.additionals.len()), (1, 60));
}
