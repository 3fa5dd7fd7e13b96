use std::collections::BTreeMap;
use std::net::IpAddr;

use hickory_proto::rr::RData;
use xcc_proto::mapping::{
    NAMESPACE_ANNOTATION, ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION,
};
use xcc_proto::names::FQDN_ANNOTATION;

use super::*;
use crate::zone::{NamedPort, PortProtocol, ServiceInfo, ServiceKey};

const POD_FOO: &str = "192.168.1.10";
const POD_BAZ: &str = "192.168.1.20";
const NOT_A_POD: &str = "192.168.9.9";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn n(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

fn fqdn_svc(name: &str, fqdn: &str, ips: &[&str]) -> ServiceInfo {
    ServiceInfo {
        key: ServiceKey::new("ns", name),
        annotations: [(FQDN_ANNOTATION.to_string(), fqdn.to_string())]
            .into_iter()
            .collect(),
        cluster_ips: ips.iter().map(|s| ip(s)).collect(),
        ports: Vec::new(),
    }
}

fn mcs_svc(origin_ns: &str, origin: &str, ips: &[&str]) -> ServiceInfo {
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

/// Zones `some.domain`, `xcc.test`, `clusterset.local`; XCC v1's two test names, a
/// dual-stack and a v6-only name, `web` exported in clusterset namespaces `bar` and `baz`; pods
/// in `foo` (annotated `bar`: namespace mapping) and `baz` (unannotated).
fn snapshot() -> Snapshot {
    let apexes: Vec<String> = ["some.domain", "xcc.test", "clusterset.local"]
        .map(String::from)
        .to_vec();
    let services = [
        fqdn_svc("s1", "some-service.some.domain", &["1.2.3.4"]),
        fqdn_svc("s2", "another-service.some.domain", &["2.3.4.5"]),
        fqdn_svc("s3", "dual.xcc.test", &["10.0.0.1", "fd00::1"]),
        fqdn_svc("s4", "six.xcc.test", &["fd00::6"]),
        mcs_svc("bar", "web", &["10.1.0.1"]),
        mcs_svc("baz", "web", &["10.2.0.1"]),
    ];
    let mut pods = PodIndex::new();
    pods.apply("foo", "client", &[ip(POD_FOO)]);
    pods.apply("baz", "client", &[ip(POD_BAZ)]);
    let mut mapping = NamespaceMapping::new();
    let annotated = BTreeMap::from([(NAMESPACE_ANNOTATION.to_string(), "bar".to_string())]);
    mapping.apply("foo", &annotated).unwrap();
    mapping.apply("baz", &BTreeMap::new()).unwrap();
    Snapshot {
        zones: Arc::new(ZoneSet::build(&apexes, &services, None, 42)),
        pods: Arc::new(pods),
        mapping: Arc::new(mapping),
        ready: true,
    }
}

fn settings() -> Settings {
    Settings::default()
}

fn transparent() -> Settings {
    Settings {
        transparent: true,
        ..Settings::default()
    }
}

fn ask_from(snap: &Snapshot, name: &str, qtype: RecordType, from: &str, s: &Settings) -> Answer {
    answer(snap, &n(name), qtype, DNSClass::IN, ip(from), s)
}

fn response(a: Answer) -> Response {
    match a {
        Answer::Response(r) => r,
        Answer::Forward => panic!("expected a response, got Forward"),
    }
}

fn ask(snap: &Snapshot, name: &str, qtype: RecordType) -> Response {
    response(ask_from(snap, name, qtype, NOT_A_POD, &settings()))
}

/// `owner TTL TYPE rdata` of each record.
fn lines(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            assert_eq!(r.dns_class, DNSClass::IN);
            format!("{} {} {} {}", r.name, r.ttl, r.record_type(), r.data)
        })
        .collect()
}

fn soa_line(apex: &str, ttl: u32) -> String {
    format!("{apex} {ttl} SOA ns.dns.{apex} hostmaster.{apex} 42 7200 1800 86400 {ttl}")
}

#[test]
fn a_records_with_the_configured_ttl() {
    let snap = snapshot();
    for (name, addr) in [
        ("some-service.some.domain.", "1.2.3.4"),
        ("another-service.some.domain.", "2.3.4.5"),
    ] {
        let r = ask(&snap, name, RecordType::A);
        assert_eq!(r.rcode, ResponseCode::NoError);
        assert!(r.authoritative);
        // The reference's TTL was 30; ours is the configured one (default 5).
        assert_eq!(lines(&r.answers), vec![format!("{name} 5 A {addr}")]);
        assert!(r.authorities.is_empty());
    }
    let r = response(ask_from(
        &snap,
        "some-service.some.domain.",
        RecordType::A,
        NOT_A_POD,
        &Settings {
            ttl: 30,
            ..Settings::default()
        },
    ));
    assert_eq!(
        lines(&r.answers),
        vec!["some-service.some.domain. 30 A 1.2.3.4"]
    );
}

#[test]
fn mixed_case_is_found_and_echoed_as_asked() {
    let snap = snapshot();
    let r = ask(&snap, "ANOTHER-SERVICE.some.domain.", RecordType::A);
    assert_eq!(
        lines(&r.answers),
        vec!["ANOTHER-SERVICE.some.domain. 5 A 2.3.4.5"]
    );
    let r = ask(&snap, "DuAl.XCC.Test.", RecordType::AAAA);
    assert_eq!(lines(&r.answers), vec!["DuAl.XCC.Test. 5 AAAA fd00::1"]);
}

#[test]
fn missing_name_is_nxdomain_with_the_soa() {
    let r = ask(&snapshot(), "not-exists.some.domain.", RecordType::A);
    assert_eq!(r.rcode, ResponseCode::NXDomain);
    assert!(r.authoritative);
    assert!(r.answers.is_empty());
    assert_eq!(lines(&r.authorities), vec![soa_line("some.domain.", 5)]);
}

#[test]
fn aaaa_on_an_ipv4_only_name_is_nodata() {
    // XCC v1 answered NXDOMAIN; NODATA is NOERROR, no answers, SOA in authority.
    let r = ask(&snapshot(), "some-service.some.domain.", RecordType::AAAA);
    assert_eq!(r.rcode, ResponseCode::NoError);
    assert!(r.authoritative);
    assert!(r.answers.is_empty());
    assert_eq!(lines(&r.authorities), vec![soa_line("some.domain.", 5)]);
}

#[test]
fn dual_stack_and_v6_only_names() {
    let snap = snapshot();
    let r = ask(&snap, "dual.xcc.test.", RecordType::A);
    assert_eq!(lines(&r.answers), vec!["dual.xcc.test. 5 A 10.0.0.1"]);
    let r = ask(&snap, "six.xcc.test.", RecordType::AAAA);
    assert_eq!(lines(&r.answers), vec!["six.xcc.test. 5 AAAA fd00::6"]);
    let r = ask(&snap, "six.xcc.test.", RecordType::A);
    assert_eq!((r.rcode, r.answers.len()), (ResponseCode::NoError, 0));
    assert_eq!(lines(&r.authorities), vec![soa_line("xcc.test.", 5)]);
}

#[test]
fn other_types_on_existing_names_are_nodata() {
    let snap = snapshot();
    for qtype in [
        RecordType::TXT,
        RecordType::MX,
        RecordType::CNAME,
        RecordType::SRV,
    ] {
        let r = ask(&snap, "some-service.some.domain.", qtype);
        assert_eq!(r.rcode, ResponseCode::NoError, "{qtype}");
        assert!(r.answers.is_empty(), "{qtype}");
        assert_eq!(r.authorities.len(), 1, "{qtype}");
    }
    // SOA below the apex: NODATA too (the reference returned the apex SOA for any name).
    let r = ask(&snap, "some-service.some.domain.", RecordType::SOA);
    assert!(r.answers.is_empty());
    assert_eq!(lines(&r.authorities), vec![soa_line("some.domain.", 5)]);
    // An empty non-terminal exists: NODATA, not NXDOMAIN (RFC 8020).
    let r = ask(&snap, "svc.clusterset.local.", RecordType::A);
    assert_eq!((r.rcode, r.answers.len()), (ResponseCode::NoError, 0));
}

#[test]
fn soa_and_ns_at_the_apex() {
    let snap = snapshot();
    let r = ask(&snap, "Some.Domain.", RecordType::SOA);
    assert_eq!(
        lines(&r.answers),
        vec!["Some.Domain. 5 SOA ns.dns.some.domain. hostmaster.some.domain. 42 7200 1800 86400 5"]
    );
    let r = ask(&snap, "some.domain.", RecordType::NS);
    assert_eq!(
        lines(&r.answers),
        vec!["some.domain. 5 NS ns.dns.some.domain."]
    );
    let r = ask(&snap, "some.domain.", RecordType::A);
    assert_eq!(
        (r.rcode, r.answers.len(), r.authorities.len()),
        (ResponseCode::NoError, 0, 1)
    );
    let r = ask(&snap, "some.domain.", RecordType::ANY);
    assert_eq!(r.answers.len(), 2);
    let r = ask(&snap, "dual.xcc.test.", RecordType::ANY);
    assert_eq!(
        lines(&r.answers),
        vec![
            "dual.xcc.test. 5 A 10.0.0.1",
            "dual.xcc.test. 5 AAAA fd00::1"
        ]
    );
}

#[test]
fn srv_for_named_ports_with_target_addresses() {
    let snap = snapshot();
    let r = ask(
        &snap,
        "_HTTP._tcp.web.bar.svc.clusterset.local.",
        RecordType::SRV,
    );
    assert_eq!(
        lines(&r.answers),
        vec![
            "_HTTP._tcp.web.bar.svc.clusterset.local. 5 SRV 0 100 8080 web.bar.svc.clusterset.local."
        ]
    );
    assert_eq!(
        lines(&r.additionals),
        vec!["web.bar.svc.clusterset.local. 5 A 10.1.0.1"]
    );
    let r = ask(
        &snap,
        "_http._udp.web.bar.svc.clusterset.local.",
        RecordType::SRV,
    );
    assert_eq!(r.rcode, ResponseCode::NXDomain);
    let r = ask(&snap, "_tcp.web.bar.svc.clusterset.local.", RecordType::SRV);
    assert_eq!((r.rcode, r.answers.len()), (ResponseCode::NoError, 0));
}

#[test]
fn outside_the_zones_and_other_classes_are_refused() {
    let snap = snapshot();
    for name in ["example.com.", "domain.", "web.", "."] {
        let r = ask(&snap, name, RecordType::A);
        assert_eq!(r.rcode, ResponseCode::Refused, "{name}");
        assert!(!r.authoritative && r.answers.is_empty() && r.authorities.is_empty());
    }
    let chaos = answer(
        &snap,
        &n("version.bind."),
        RecordType::TXT,
        DNSClass::CH,
        ip(NOT_A_POD),
        &settings(),
    );
    assert_eq!(response(chaos).rcode, ResponseCode::Refused);
    let any_class = answer(
        &snap,
        &n("dual.xcc.test."),
        RecordType::A,
        DNSClass::ANY,
        ip(NOT_A_POD),
        &settings(),
    );
    assert_eq!(response(any_class).answers.len(), 1);
}

#[test]
fn not_ready_is_servfail_for_everything() {
    let snap = Snapshot {
        ready: false,
        ..snapshot()
    };
    for (name, s) in [
        ("some-service.some.domain.", settings()),
        ("example.com.", transparent()),
    ] {
        let r = response(ask_from(&snap, name, RecordType::A, POD_FOO, &s));
        assert_eq!(r.rcode, ResponseCode::ServFail, "{name}");
        assert!(r.answers.is_empty() && !r.authoritative);
    }
}

/// The A answer's address for `name` asked from `from`, or the rcode / "forward".
fn resolve(snap: &Snapshot, name: &str, from: &str, s: &Settings) -> String {
    match ask_from(snap, name, RecordType::A, from, s) {
        Answer::Forward => "forward".into(),
        Answer::Response(r) => match r.answers.as_slice() {
            [] => format!("{:?}", r.rcode),
            [rec] => {
                assert_eq!(rec.name.to_string(), name, "owner echoes the question");
                match &rec.data {
                    RData::A(a) => a.to_string(),
                    other => panic!("unexpected {other:?}"),
                }
            }
            more => panic!("several answers {more:?}"),
        },
    }
}

#[test]
fn namespace_mapping_resolution_table() {
    let snap = snapshot();
    let t = transparent();
    // (asked from, name, expected): `foo` is mapped to clusterset namespace `bar`, `baz` is not.
    let table = [
        (POD_FOO, "web.", "10.1.0.1"),
        (POD_FOO, "web.foo.", "10.1.0.1"),
        (POD_FOO, "web.foo.svc.clusterset.local.", "10.1.0.1"),
        (POD_FOO, "web.bar.svc.clusterset.local.", "10.1.0.1"),
        (POD_FOO, "web.baz.", "10.2.0.1"),
        (POD_FOO, "WEB.Foo.", "10.1.0.1"),
        (POD_BAZ, "web.", "10.2.0.1"),
        (POD_BAZ, "web.baz.", "10.2.0.1"),
        (POD_BAZ, "web.baz.svc.clusterset.local.", "10.2.0.1"),
        // A pod in `baz` naming local namespace `foo` means what `foo` is mapped to.
        (POD_BAZ, "web.foo.", "10.1.0.1"),
        // Clusterset namespace `foo` does not exist; only pods in `foo` are redirected.
        (POD_BAZ, "web.foo.svc.clusterset.local.", "NXDomain"),
        (POD_BAZ, "web.bar.svc.clusterset.local.", "10.1.0.1"),
        // Unknown source: no namespace to be relative to.
        (NOT_A_POD, "web.", "forward"),
        (NOT_A_POD, "web.bar.", "10.1.0.1"),
        // Names we do not hold go upstream unchanged.
        (POD_FOO, "missing.", "forward"),
        (POD_FOO, "example.com.", "forward"),
        (POD_FOO, "a.b.example.com.", "forward"),
        // In our zones we stay authoritative.
        (POD_FOO, "missing.foo.svc.clusterset.local.", "NXDomain"),
        (POD_FOO, "missing.xcc.test.", "NXDomain"),
    ];
    for (from, name, expected) in table {
        assert_eq!(
            resolve(&snap, name, from, &t),
            expected,
            "{name} from {from}"
        );
    }
}

#[test]
fn without_transparent_mode_short_names_are_refused_but_mapping_applies() {
    let snap = snapshot();
    let s = settings();
    assert_eq!(resolve(&snap, "web.", POD_FOO, &s), "Refused");
    assert_eq!(resolve(&snap, "web.foo.", POD_FOO, &s), "Refused");
    assert_eq!(
        resolve(&snap, "web.foo.svc.clusterset.local.", POD_FOO, &s),
        "10.1.0.1"
    );
}

#[test]
fn transparent_answers_srv_and_nodata_without_soa() {
    let snap = snapshot();
    let r = response(ask_from(
        &snap,
        "_http._tcp.web.",
        RecordType::SRV,
        POD_FOO,
        &transparent(),
    ));
    assert_eq!(
        lines(&r.answers),
        vec!["_http._tcp.web. 5 SRV 0 100 8080 web.bar.svc.clusterset.local."]
    );
    assert_eq!(
        lines(&r.additionals),
        vec!["web.bar.svc.clusterset.local. 5 A 10.1.0.1"]
    );
    let r = response(ask_from(
        &snap,
        "web.",
        RecordType::AAAA,
        POD_FOO,
        &transparent(),
    ));
    assert_eq!((r.rcode, r.authoritative), (ResponseCode::NoError, true));
    assert!(r.answers.is_empty() && r.authorities.is_empty());
    // A name we do not hold under an SRV prefix is forwarded like any other.
    let a = ask_from(
        &snap,
        "_x._tcp.web.",
        RecordType::SRV,
        POD_FOO,
        &transparent(),
    );
    assert_eq!(a, Answer::Forward);
}

#[test]
fn zone_transfers_are_refused() {
    let snap = snapshot();
    for qtype in [RecordType::AXFR, RecordType::IXFR] {
        for name in ["xcc.test.", "dual.xcc.test.", "example.com."] {
            let r = ask(&snap, name, qtype);
            assert_eq!(r.rcode, ResponseCode::Refused, "{qtype} {name}");
            assert!(r.answers.is_empty() && r.authorities.is_empty());
        }
    }
}

#[test]
fn the_ns_target_has_the_servers_addresses() {
    let snap = snapshot();
    let s = Settings {
        ns_addresses: vec![ip("127.0.0.53"), ip("::1")],
        ..Settings::default()
    };
    let ask_s = |name: &str, qtype| response(ask_from(&snap, name, qtype, NOT_A_POD, &s));
    let r = ask_s("NS.dns.xcc.test.", RecordType::A);
    assert_eq!((r.rcode, r.authoritative), (ResponseCode::NoError, true));
    assert_eq!(lines(&r.answers), vec!["NS.dns.xcc.test. 5 A 127.0.0.53"]);
    let r = ask_s("ns.dns.xcc.test.", RecordType::AAAA);
    assert_eq!(lines(&r.answers), vec!["ns.dns.xcc.test. 5 AAAA ::1"]);
    let r = ask_s("xcc.test.", RecordType::NS);
    assert_eq!(lines(&r.answers), vec!["xcc.test. 5 NS ns.dns.xcc.test."]);
    assert_eq!(
        lines(&r.additionals),
        vec![
            "ns.dns.xcc.test. 5 A 127.0.0.53",
            "ns.dns.xcc.test. 5 AAAA ::1"
        ]
    );
    // Without configured addresses the name exists but has no records: NODATA, not NXDOMAIN.
    let r = ask(&snap, "ns.dns.xcc.test.", RecordType::A);
    assert_eq!(r.rcode, ResponseCode::NoError);
    assert!(r.answers.is_empty());
    assert_eq!(lines(&r.authorities), vec![soa_line("xcc.test.", 5)]);
}

/// A service with the given ports and cluster IPs (or pods, when headless) at its MCS name
/// `api.shop.svc.clusterset.local`, plus `extra` services.
fn srv_snapshot(ips: &[&str], ports: &[(Option<&str>, u16)], extra: Vec<ServiceInfo>) -> Snapshot {
    let mut svc = mcs_svc("shop", "api", ips);
    svc.key = ServiceKey::new("xcc", "api-shop");
    svc.ports = ports
        .iter()
        .map(|(name, port)| NamedPort {
            name: name.map(str::to_string),
            port: *port,
            protocol: PortProtocol::Tcp,
        })
        .collect();
    let mut services = vec![svc, fqdn_svc("s1", "other.xcc.test", &["1.2.3.4"])];
    services[1].ports = vec![NamedPort {
        name: None,
        port: 80,
        protocol: PortProtocol::Tcp,
    }];
    services.extend(extra);
    let apexes: Vec<String> = ["xcc.test", "clusterset.local"].map(String::from).to_vec();
    Snapshot {
        zones: Arc::new(ZoneSet::build(&apexes, &services, None, 42)),
        ready: true,
        ..Snapshot::default()
    }
}

#[test]
fn a_clusterset_names_bare_srv_has_one_record_per_port() {
    let snap = srv_snapshot(
        &["10.96.0.1"],
        &[(Some("http"), 80), (Some("dns"), 53), (None, 9000)],
        Vec::new(),
    );
    let r = ask(&snap, "api.shop.svc.clusterset.local.", RecordType::SRV);
    assert_eq!(
        lines(&r.answers),
        vec![
            "api.shop.svc.clusterset.local. 5 SRV 0 100 53 api.shop.svc.clusterset.local.",
            "api.shop.svc.clusterset.local. 5 SRV 0 100 80 api.shop.svc.clusterset.local.",
            "api.shop.svc.clusterset.local. 5 SRV 0 100 9000 api.shop.svc.clusterset.local.",
        ]
    );
    assert!(
        lines(&r.additionals)
            .iter()
            .all(|l| l == "api.shop.svc.clusterset.local. 5 A 10.96.0.1")
    );
    // The A answer is unchanged.
    let r = ask(&snap, "api.shop.svc.clusterset.local.", RecordType::A);
    assert_eq!(
        lines(&r.answers),
        vec!["api.shop.svc.clusterset.local. 5 A 10.96.0.1"]
    );
    // Names outside the clusterset zone keep XCC v1's records: no SRV at the bare name.
    let r = ask(&snap, "other.xcc.test.", RecordType::SRV);
    assert_eq!((r.rcode, r.answers.len()), (ResponseCode::NoError, 0));
}

#[test]
fn a_headless_names_bare_srv_has_one_record_per_pod_and_port_with_the_pods_name() {
    let key = ServiceKey::new("xcc", "api-shop");
    let annotations: crate::zone::NameAnnotations = [
        (ORIGIN_NAMESPACE_ANNOTATION.to_string(), "shop".to_string()),
        (ORIGIN_NAME_ANNOTATION.to_string(), "api".to_string()),
    ]
    .into_iter()
    .collect();
    let pods = crate::headless::pod_names(
        &key,
        &annotations,
        [
            ("east", ip("10.4.0.1"), "db-0"),
            ("west", ip("10.5.0.1"), "db-0"),
        ],
    );
    let snap = srv_snapshot(
        &["10.4.0.1", "10.5.0.1"],
        &[(Some("sql"), 5432), (Some("stats"), 9187)],
        pods,
    );
    let r = ask(&snap, "api.shop.svc.clusterset.local.", RecordType::SRV);
    assert_eq!(
        lines(&r.answers),
        vec![
            "api.shop.svc.clusterset.local. 5 SRV 0 100 5432 db-0.east.api.shop.svc.clusterset.local.",
            "api.shop.svc.clusterset.local. 5 SRV 0 100 5432 db-0.west.api.shop.svc.clusterset.local.",
            "api.shop.svc.clusterset.local. 5 SRV 0 100 9187 db-0.east.api.shop.svc.clusterset.local.",
            "api.shop.svc.clusterset.local. 5 SRV 0 100 9187 db-0.west.api.shop.svc.clusterset.local.",
        ]
    );
    let mut additionals = lines(&r.additionals);
    additionals.sort();
    additionals.dedup();
    assert_eq!(
        additionals,
        vec![
            "db-0.east.api.shop.svc.clusterset.local. 5 A 10.4.0.1",
            "db-0.west.api.shop.svc.clusterset.local. 5 A 10.5.0.1",
        ]
    );
    // The pods' names have no ports, so no SRV of their own.
    let r = ask(
        &snap,
        "db-0.east.api.shop.svc.clusterset.local.",
        RecordType::SRV,
    );
    assert_eq!((r.rcode, r.answers.len()), (ResponseCode::NoError, 0));
}
