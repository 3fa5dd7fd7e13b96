use std::net::IpAddr;

use super::*;

fn name(s: &str) -> Name {
    fqdn_name(s).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A Service `ns/n` with the FQDN annotation `fqdn` (if any) and `ips`.
fn svc(ns: &str, n: &str, fqdn: Option<&str>, ips: &[&str]) -> ServiceInfo {
    ServiceInfo {
        key: ServiceKey::new(ns, n),
        annotations: NameAnnotations {
            fqdn: fqdn.map(Into::into),
            ..NameAnnotations::default()
        },
        cluster_ips: ips.iter().map(|s| ip(s)).collect(),
        ports: Vec::new(),
    }
}

fn build(zones: &[&str], services: &[ServiceInfo]) -> ZoneSet {
    let apexes: Vec<String> = zones.iter().map(|z| z.to_string()).collect();
    ZoneSet::build(&apexes, services, None, 1000)
}

fn node<'a>(set: &'a ZoneSet, n: &str) -> Option<Node<'a>> {
    let n = name(n);
    set.find_zone(&n)?.node(&n)
}

#[test]
fn annotated_service_gives_a_record_under_lowercase_key() {
    // A mixed-case annotation is served under its lowercase form, and found in any case.
    let set = build(
        &["xcc.test"],
        &[svc("ns", "a", Some("Foo.XCC.test."), &["10.0.0.1"])],
    );
    for asked in ["foo.xcc.test", "FOO.xcc.TEST"] {
        let n = node(&set, asked).unwrap();
        assert_eq!(
            n.v4,
            vec!["10.0.0.1".parse::<std::net::Ipv4Addr>().unwrap()]
        );
        assert!(n.v6.is_empty());
    }
    let zone = set.find_zone(&name("foo.xcc.test")).unwrap();
    assert_eq!(
        zone.owner(&name("foo.xcc.test")),
        Some(&ServiceKey::new("ns", "a"))
    );
    assert_eq!(zone.apex().to_ascii(), "xcc.test.");
    assert_eq!(set.record_names(), 1);
}

#[test]
fn unannotated_services_are_ignored() {
    // XCC v1 cached every Service, collapsing unannotated ones into a "." entry.
    let set = build(
        &["xcc.test"],
        &[svc("kube-system", "kube-dns", None, &["10.96.0.10"])],
    );
    assert_eq!(set.record_names(), 0);
    assert!(set.rejected().is_empty());
    assert!(set.conflicts().is_empty());
    assert!(set.find_zone(&Name::root()).is_none());
}

#[test]
fn dual_stack_addresses_are_sorted_and_deduplicated() {
    let set = build(
        &["xcc.test"],
        &[svc(
            "ns",
            "a",
            Some("dual.xcc.test"),
            &["fd00::2", "10.0.0.2", "10.0.0.1", "fd00::1", "10.0.0.1"],
        )],
    );
    let n = node(&set, "dual.xcc.test").unwrap();
    assert_eq!(n.v4, vec![ip_v4("10.0.0.1"), ip_v4("10.0.0.2")]);
    assert_eq!(
        n.v6,
        vec![
            "fd00::1".parse::<std::net::Ipv6Addr>().unwrap(),
            "fd00::2".parse().unwrap()
        ]
    );
}

fn ip_v4(s: &str) -> std::net::Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn named_ports_get_srv_records_and_empty_non_terminals() {
    let mut s = svc("ns", "a", Some("web.xcc.test"), &["10.0.0.1"]);
    s.ports = vec![
        NamedPort {
            name: Some("http".into()),
            port: 80,
            protocol: PortProtocol::Tcp,
        },
        NamedPort {
            name: Some("DNS".into()),
            port: 53,
            protocol: PortProtocol::Udp,
        },
        NamedPort {
            name: None,
            port: 9000,
            protocol: PortProtocol::Tcp,
        },
        NamedPort {
            name: Some("bad_name".into()),
            port: 9001,
            protocol: PortProtocol::Tcp,
        },
    ];
    let set = build(&["xcc.test"], &[s]);
    let http = node(&set, "_http._tcp.web.xcc.test").unwrap();
    assert_eq!(
        http.srv(),
        vec![SrvTarget {
            port: 80,
            target: name("web.xcc.test")
        }]
    );
    assert!(http.v4.is_empty());
    let dns = node(&set, "_dns._udp.web.xcc.test").unwrap();
    assert_eq!(dns.srv()[0].port, 53);
    // Empty non-terminals between the SRV names and the service name exist, without records.
    for ent in ["_tcp.web.xcc.test", "_udp.web.xcc.test"] {
        assert!(node(&set, ent).unwrap().is_empty(), "{ent}");
    }
    assert!(node(&set, "_bad_name._tcp.web.xcc.test").is_none());
    assert!(node(&set, "_http._udp.web.xcc.test").is_none());
    // The apex exists (SOA/NS are synthesised from it), records or not.
    assert!(node(&set, "xcc.test").unwrap().is_empty());
    // Names with records: the service name and its two SRV names.
    assert_eq!(set.record_names(), 3);
}

fn origin(ns: &str, n: &str, origin_ns: &str, origin_name: &str, ips: &[&str]) -> ServiceInfo {
    let mut s = svc(ns, n, None, ips);
    s.annotations.origin_namespace = Some(origin_ns.into());
    s.annotations.origin_name = Some(origin_name.into());
    s
}

#[test]
fn imports_with_an_origin_get_their_mcs_name() {
    let mut both = origin("xcc", "web-xcc-test-1", "bar", "web", &["10.0.0.1"]);
    both.annotations.fqdn = Some("web.xcc.test".into());
    let set = build(
        &["xcc.test", "clusterset.local"],
        &[both, origin("xcc", "bad", "Bad_NS", "web", &["10.0.0.2"])],
    );
    assert_eq!(
        node(&set, "web.bar.svc.clusterset.local").unwrap().v4,
        vec![ip_v4("10.0.0.1")]
    );
    assert_eq!(
        node(&set, "web.xcc.test").unwrap().v4,
        vec![ip_v4("10.0.0.1")]
    );
    // Empty non-terminals up to the apex.
    for ent in ["bar.svc.clusterset.local", "svc.clusterset.local"] {
        assert!(node(&set, ent).unwrap().is_empty(), "{ent}");
    }
    assert_eq!(set.rejected().len(), 1);
    assert_eq!(set.rejected()[0].key, ServiceKey::new("xcc", "bad"));
    assert!(
        set.rejected()[0].reason.contains("Bad_NS"),
        "{:?}",
        set.rejected()
    );
}

#[test]
fn duplicate_names_go_to_the_lowest_key_whatever_the_order() {
    // Deterministic ownership instead of last-writer-wins.
    let a = svc("b-ns", "z", Some("dup.xcc.test"), &["10.0.0.2"]);
    let b = svc("a-ns", "z", Some("DUP.xcc.test"), &["10.0.0.1"]);
    let c = svc("a-ns", "y", Some("dup.xcc.test."), &["10.0.0.3"]);
    for order in [
        vec![a.clone(), b.clone(), c.clone()],
        vec![c.clone(), b.clone(), a.clone()],
    ] {
        let set = build(&["xcc.test"], &order);
        assert_eq!(
            node(&set, "dup.xcc.test").unwrap().v4,
            vec![ip_v4("10.0.0.3")]
        );
        assert_eq!(
            set.conflicts(),
            &[Conflict {
                name: "dup.xcc.test".into(),
                winner: ServiceKey::new("a-ns", "y"),
                losers: vec![ServiceKey::new("a-ns", "z"), ServiceKey::new("b-ns", "z")],
            }]
        );
    }
}

#[test]
fn unservable_names_are_reported() {
    let set = build(
        &["xcc.test"],
        &[
            svc("ns", "outside", Some("foo.example.com"), &["10.0.0.1"]),
            svc("ns", "invalid", Some("foo_bar.xcc.test"), &["10.0.0.1"]),
            svc("ns", "headless", Some("headless.xcc.test"), &[]),
        ],
    );
    assert_eq!(set.record_names(), 0);
    let reasons: Vec<(String, String)> = set
        .rejected()
        .iter()
        .map(|r| (r.key.name.to_string(), r.reason.clone()))
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_eq!(
        reasons[0],
        ("outside".into(), "outside every configured zone".into())
    );
    assert!(reasons[1].1.contains("'_' is not allowed"), "{reasons:?}");
    assert_eq!(
        reasons[2],
        ("headless".into(), "the Service has no cluster IP".into())
    );
    // A headless name does not exist at all (NXDOMAIN, not NODATA).
    assert!(node(&set, "headless.xcc.test").is_none());
}

#[test]
fn the_longest_zone_holds_a_name() {
    let set = build(
        &["test", "xcc.test", "xcc.test"],
        &[
            svc("ns", "a", Some("a.xcc.test"), &["10.0.0.1"]),
            svc("ns", "b", Some("b.test"), &["10.0.0.2"]),
        ],
    );
    assert_eq!(set.zones().len(), 2, "duplicate apex collapsed");
    let z = set.find_zone(&name("a.xcc.test")).unwrap();
    assert_eq!(z.apex(), &name("xcc.test"));
    assert!(z.node(&name("a.xcc.test")).is_some());
    let t = set.find_zone(&name("b.test")).unwrap();
    assert_eq!(t.apex(), &name("test"));
    // `xcc.test` is a zone cut: it does not exist as a node of `test`.
    assert!(t.node(&name("xcc.test")).is_none());
}

#[test]
fn in_zone_is_label_wise_and_case_insensitive() {
    assert!(in_zone(&name("a.XCC.test"), &name("xcc.test")));
    assert!(in_zone(&name("xcc.test"), &name("xcc.test")));
    assert!(!in_zone(&name("fooxcc.test"), &name("xcc.test")));
    assert!(!in_zone(&name("test"), &name("xcc.test")));
}

#[test]
fn serial_changes_only_when_records_change() {
    let apexes = vec!["xcc.test".to_string(), "other.test".to_string()];
    let one = [svc("ns", "a", Some("a.xcc.test"), &["10.0.0.1"])];
    let first = ZoneSet::build(&apexes, &one, None, 1000);
    let serial = |set: &ZoneSet, apex: &str| set.find_zone(&name(apex)).unwrap().serial();
    assert_eq!(serial(&first, "xcc.test"), 1000);
    // Same content later: same serial (the reference used the current time on every answer).
    let same = ZoneSet::build(&apexes, &one, Some(&first), 5000);
    assert_eq!(serial(&same, "xcc.test"), 1000);
    // An owner rename alone is not a record change.
    let renamed = [svc("ns", "renamed", Some("a.xcc.test"), &["10.0.0.1"])];
    let same = ZoneSet::build(&apexes, &renamed, Some(&same), 6000);
    assert_eq!(serial(&same, "xcc.test"), 1000);
    // A change: the clock when it is ahead…
    let two = [svc("ns", "a", Some("a.xcc.test"), &["10.0.0.2"])];
    let changed = ZoneSet::build(&apexes, &two, Some(&same), 7000);
    assert_eq!(serial(&changed, "xcc.test"), 7000);
    assert_eq!(
        serial(&changed, "other.test"),
        1000,
        "untouched zone keeps its serial"
    );
    // …previous + 1 when the clock is behind (two changes within a second, or a clock step).
    let back = ZoneSet::build(&apexes, &one, Some(&changed), 10);
    assert_eq!(serial(&back, "xcc.test"), 7001);
}

/// A Service `ns/n` named only by its origin annotations.
fn by_origin(ns: &str, n: &str, origin: (&str, &str), ips: &[&str]) -> ServiceInfo {
    let mut s = svc(ns, n, None, ips);
    s.annotations.origin_namespace = Some(origin.0.into());
    s.annotations.origin_name = Some(origin.1.into());
    s
}

/// A name is decided by how it is claimed, never by the claimant's key. The Service
/// whose FQDN is the name beats one that names it through its origin, however low that one's
/// key; Services that all name it through their origin are one service (MCS): its addresses
/// are theirs together, whatever the order.
#[test]
fn an_fqdn_beats_an_origin_and_origins_are_joined() {
    let owner = svc(
        "xcc",
        "api.shop.svc.clusterset.local-1",
        Some("api.shop.svc.clusterset.local"),
        &["10.2.0.1"],
    );
    let mut hijack = by_origin("", "a", ("shop", "api"), &["6.6.6.6"]);
    hijack.annotations.fqdn = Some("a.shop.svc.clusterset.local".into());
    for order in [
        vec![owner.clone(), hijack.clone()],
        vec![hijack.clone(), owner.clone()],
    ] {
        let set = build(&["clusterset.local"], &order);
        assert_eq!(
            node(&set, "api.shop.svc.clusterset.local").unwrap().v4,
            vec!["10.2.0.1".parse::<std::net::Ipv4Addr>().unwrap()]
        );
        assert_eq!(
            set.conflicts(),
            &[Conflict {
                name: "api.shop.svc.clusterset.local".into(),
                winner: owner.key.clone(),
                losers: vec![hijack.key.clone()],
            }]
        );
        // The loser keeps its own name.
        assert_eq!(
            node(&set, "a.shop.svc.clusterset.local").unwrap().v4,
            vec!["6.6.6.6".parse::<std::net::Ipv4Addr>().unwrap()]
        );
    }
    let east = by_origin("xcc", "east", ("shop", "db"), &["10.1.0.1"]);
    let west = by_origin("xcc", "west", ("shop", "db"), &["10.3.0.1", "10.1.0.1"]);
    for order in [
        vec![east.clone(), west.clone()],
        vec![west.clone(), east.clone()],
    ] {
        let set = build(&["clusterset.local"], &order);
        assert_eq!(
            node(&set, "db.shop.svc.clusterset.local").unwrap().v4,
            ["10.1.0.1", "10.3.0.1"]
                .map(|a| a.parse::<std::net::Ipv4Addr>().unwrap())
                .to_vec()
        );
        assert!(set.conflicts().is_empty(), "{:?}", set.conflicts());
    }
}
