use std::collections::BTreeMap;
use std::sync::Arc;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::{EdnsCode, EdnsOption};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use xcc_proto::mapping::{
    NAMESPACE_ANNOTATION, NamespaceMapping, ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION,
};
use xcc_proto::names::FQDN_ANNOTATION;

use super::*;
use crate::pods::PodIndex;
use crate::wire::handle_decoded;
use crate::zone::{ServiceInfo, ServiceKey, ZoneSet};

const CLIENT: &str = "10.9.0.1";
/// A pod in namespace `foo`, which is mapped to clusterset namespace `bar`.
const MAPPED_POD: &str = "10.244.0.5";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn svc(name: &str, fqdn: &str, ips: &[&str]) -> ServiceInfo {
    ServiceInfo {
        key: ServiceKey::new("ns", name),
        annotations: [(FQDN_ANNOTATION, fqdn)].into_iter().collect(),
        cluster_ips: ips.iter().map(|s| ip(s)).collect(),
        ports: Vec::new(),
    }
}

/// Zones `xcc.test`, `sub.xcc.test` and `clusterset.local`: a v4, a dual-stack, a v6-only name,
/// one with 60 addresses, a name in the sub-zone and an MCS name; a pod in a mapped namespace.
fn snapshot() -> Snapshot {
    let apexes = ["xcc.test", "sub.xcc.test", "clusterset.local"].map(String::from);
    let many: Vec<String> = (1..=60).map(|i| format!("10.0.1.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let mut web = svc("web", "web.xcc.test", &["10.1.0.1"]);
    web.annotations = [
        (ORIGIN_NAMESPACE_ANNOTATION, "bar"),
        (ORIGIN_NAME_ANNOTATION, "web"),
    ]
    .into_iter()
    .collect();
    let services = [
        svc("one", "one.xcc.test", &["10.0.0.1"]),
        svc(
            "dual",
            "dual.deep.xcc.test",
            &["10.0.0.2", "fd00::2", "fd00::3"],
        ),
        svc("six", "six.xcc.test", &["fd00::6"]),
        svc("many", "many.xcc.test", &many),
        svc("sub", "a.sub.xcc.test", &["10.0.0.9"]),
        web,
    ];
    let mut pods = PodIndex::new();
    pods.apply("foo", "client", &[ip(MAPPED_POD)]);
    let mut mapping = NamespaceMapping::new();
    let annotated = BTreeMap::from([(NAMESPACE_ANNOTATION.to_string(), "bar".to_string())]);
    mapping.apply("foo", &annotated).unwrap();
    Snapshot {
        zones: Arc::new(ZoneSet::build(&apexes, &services, None, 77)),
        pods: Arc::new(pods),
        mapping: Arc::new(mapping),
        ready: true,
    }
}

fn settings() -> Settings {
    Settings {
        ttl: 30,
        ..Settings::default()
    }
}

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m
}

fn with_edns(mut m: Message, payload: u16, dnssec_ok: bool) -> Message {
    let mut edns = Edns::new();
    edns.set_max_payload(payload);
    edns.set_dnssec_ok(dnssec_ok);
    m.set_edns(edns);
    m
}

fn fast(bytes: &[u8], from: &str, transport: Transport, snap: &Snapshot) -> Option<Outcome> {
    answer(bytes, ip(from), transport, snap, &settings())
}

fn decoded(outcome: &Outcome) -> Message {
    match outcome {
        Outcome::Reply { bytes, .. } => Message::from_vec(bytes).unwrap(),
        other => panic!("expected a reply, got {other:?}"),
    }
}

/// Every question the fast path takes gets the response the general path gives (same rcode,
/// flags, sections, TTLs and OPT record).
#[test]
fn the_fast_path_answers_exactly_as_the_general_path() {
    let snap = snapshot();
    let names = [
        "one.xcc.test.",
        "ONE.Xcc.TEST.",
        "dual.deep.xcc.test.",
        "deep.xcc.test.",
        "six.xcc.test.",
        "xcc.test.",
        "missing.xcc.test.",
        "below.one.xcc.test.",
        "a.sub.xcc.test.",
        "sub.xcc.test.",
        "b.sub.xcc.test.",
        "web.bar.svc.clusterset.local.",
        "svc.clusterset.local.",
        "web.foo.svc.clusterset.local.",
        "dns.xcc.test.",
    ];
    let mut taken = 0;
    for name in names {
        for qtype in [RecordType::A, RecordType::AAAA] {
            let plain = query(name, qtype);
            let mut checking = query(name, qtype);
            checking.metadata.recursion_desired = false;
            checking.metadata.checking_disabled = true;
            let variants = [
                plain.clone(),
                checking,
                with_edns(plain.clone(), 1232, false),
                with_edns(plain.clone(), 4096, true),
                with_edns(plain.clone(), 100, true),
            ];
            for m in variants {
                let bytes = m.to_vec().unwrap();
                for transport in [Transport::Udp, Transport::Tcp] {
                    let got = fast(&bytes, CLIENT, transport, &snap)
                        .unwrap_or_else(|| panic!("{name} {qtype} not taken"));
                    let want = handle_decoded(&bytes, ip(CLIENT), transport, &snap, &settings());
                    assert_eq!(
                        decoded(&got),
                        decoded(&want),
                        "{name} {qtype} {transport:?}"
                    );
                    let (Outcome::Reply { rcode: a, .. }, Outcome::Reply { rcode: b, .. }) =
                        (&got, &want)
                    else {
                        unreachable!()
                    };
                    assert_eq!(a, b);
                    taken += 1;
                }
            }
        }
    }
    assert_eq!(taken, names.len() * 2 * 5 * 2);
}

#[test]
fn exact_bytes_of_an_answer_and_of_nxdomain() {
    let snap = snapshot();
    let q = with_edns(query("One.xcc.test.", RecordType::A), 1232, true)
        .to_vec()
        .unwrap();
    let Some(Outcome::Reply { bytes, rcode }) = fast(&q, CLIENT, Transport::Udp, &snap) else {
        panic!("not answered");
    };
    assert_eq!(rcode, ResponseCode::NoError);
    let question = b"\x03One\x03xcc\x04test\x00\x00\x01\x00\x01";
    let mut want = vec![0x12, 0x34, 0x85, 0x00, 0, 1, 0, 1, 0, 0, 0, 1];
    want.extend_from_slice(question);
    // Answer: pointer to the question, A, IN, TTL 30, 4 bytes, 10.0.0.1.
    want.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 0, 0, 1]);
    // OPT: root, payload 1232, version 0, DO set, no options.
    want.extend_from_slice(&[0, 0, 41, 0x04, 0xD0, 0, 0, 0x80, 0, 0, 0]);
    assert_eq!(bytes, want);

    let q = query("no.xcc.test.", RecordType::AAAA).to_vec().unwrap();
    let Some(Outcome::Reply { bytes, rcode }) = fast(&q, CLIENT, Transport::Udp, &snap) else {
        panic!("not answered");
    };
    assert_eq!(rcode, ResponseCode::NXDomain);
    let mut want = vec![0x12, 0x34, 0x85, 0x03, 0, 1, 0, 0, 0, 1, 0, 0];
    want.extend_from_slice(b"\x02no\x03xcc\x04test\x00\x00\x1c\x00\x01");
    // SOA owned by the apex inside the question (offset 15), TTL 30, 42 bytes of RDATA.
    want.extend_from_slice(&[0xC0, 15, 0, 6, 0, 1, 0, 0, 0, 30, 0, 42]);
    want.extend_from_slice(b"\x02ns\x03dns\xC0\x0f\x0ahostmaster\xC0\x0f");
    for v in [77u32, 7200, 1800, 86400, 30] {
        want.extend_from_slice(&v.to_be_bytes());
    }
    assert_eq!(bytes, want);
}

#[test]
fn everything_else_takes_the_general_path() {
    let snap = snapshot();
    let mut not_ready = snapshot();
    not_ready.ready = false;
    let bytes = |m: Message| m.to_vec().unwrap();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("TXT", bytes(query("one.xcc.test.", RecordType::TXT))),
        ("SRV", bytes(query("one.xcc.test.", RecordType::SRV))),
        ("SOA", bytes(query("xcc.test.", RecordType::SOA))),
        ("ANY", bytes(query("one.xcc.test.", RecordType::ANY))),
        ("AXFR", bytes(query("xcc.test.", RecordType::AXFR))),
        ("outside", bytes(query("one.example.com.", RecordType::A))),
        ("NS target", bytes(query("ns.dns.xcc.test.", RecordType::A))),
        ("over 512", bytes(query("many.xcc.test.", RecordType::A))),
        (
            "EDNS version 1",
            bytes({
                let mut m = with_edns(query("one.xcc.test.", RecordType::A), 1232, false);
                m.edns.as_mut().unwrap().set_version(1);
                m
            }),
        ),
        (
            "EDNS option",
            bytes({
                let mut m = with_edns(query("one.xcc.test.", RecordType::A), 1232, false);
                m.edns
                    .as_mut()
                    .unwrap()
                    .options_mut()
                    .insert(EdnsOption::Unknown(u16::from(EdnsCode::Cookie), vec![1; 8]));
                m
            }),
        ),
        (
            "two questions",
            bytes({
                let mut m = query("one.xcc.test.", RecordType::A);
                m.add_query(Query::query(
                    Name::from_ascii("six.xcc.test.").unwrap(),
                    RecordType::A,
                ));
                m
            }),
        ),
        (
            "notify",
            bytes({
                let mut m = query("one.xcc.test.", RecordType::A);
                m.metadata.op_code = OpCode::Notify;
                m
            }),
        ),
        (
            "response",
            bytes({
                let mut m = query("one.xcc.test.", RecordType::A);
                m.metadata.message_type = MessageType::Response;
                m
            }),
        ),
    ];
    let mut chaos = query("one.xcc.test.", RecordType::A);
    chaos.queries[0].set_query_class(DNSClass::CH);
    cases.push(("class CH", bytes(chaos)));
    let plain = bytes(query("one.xcc.test.", RecordType::A));
    let mut trailing = plain.clone();
    trailing.push(0);
    cases.push(("trailing byte", trailing));
    // A compression pointer in the question.
    let mut pointer = plain[..12].to_vec();
    pointer.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1]);
    cases.push(("pointer", pointer));
    cases.push(("truncated", plain[..plain.len() - 1].to_vec()));
    for (what, q) in &cases {
        assert!(fast(q, CLIENT, Transport::Udp, &snap).is_none(), "{what}");
    }
    // The 60 addresses fit over TCP.
    let many = &cases[7].1;
    assert!(fast(many, CLIENT, Transport::Tcp, &snap).is_some());
    assert!(
        fast(&plain, CLIENT, Transport::Udp, &not_ready).is_none(),
        "not ready"
    );
    // A pod in a mapped namespace may be asking for a rewritten name.
    assert!(
        fast(&plain, MAPPED_POD, Transport::Udp, &snap).is_none(),
        "mapped pod"
    );
    assert!(fast(&plain, CLIENT, Transport::Udp, &snap).is_some());
}
