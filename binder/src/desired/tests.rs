//! XCC v1's binder cases (Service and Endpoints per FQDN, VIP, ports, several sources merged,
//! other FQDNs and exported records left out, long names, a source removed) as pure tables, what
//! xcc does beyond it (only owned fields, ports per subset, a deterministic merge, valid names,
//! EndpointSlices, uppercase FQDNs), and the Cilium global service rules.

use serde_json::{Value, json};
use xcc_proto::crd::{Endpoint, Origin, ServicePort as RecordPort, ServiceRecord};

use super::cilium::{self, OriginKey, OrphanDecision};
use super::*;

const NS: &str = "cross-cluster-connectivity";

fn record(
    name: &str,
    uid: &str,
    fqdn: &str,
    annotations: Value,
    endpoints: &[(&str, i32)],
) -> ServiceRecord {
    let mut sr: ServiceRecord = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
        "kind": "ServiceRecord",
        "metadata": {"name": name, "namespace": NS, "uid": uid,
                     "labels": {IMPORTED_LABEL: "", "connectivity.tanzu.vmware.com/remote-registry": "rr"},
                     "annotations": annotations},
        "spec": {"fqdn": fqdn, "endpoints": []},
    }))
    .unwrap();
    sr.spec.endpoints = endpoints
        .iter()
        .map(|(a, p)| Endpoint {
            address: (*a).into(),
            port: *p,
        })
        .collect();
    sr
}

fn port_443() -> Value {
    json!({SERVICE_PORT_ANNOTATION: "443"})
}

fn only_group(records: &[ServiceRecord]) -> (GroupKey, Materialized) {
    let groups = group_imported(records);
    assert_eq!(groups.len(), 1, "{:?}", groups.keys().collect::<Vec<_>>());
    let (key, sources) = groups.into_iter().next().unwrap();
    let m = materialize(&key, &sources).unwrap();
    (key, m)
}

fn group_for(records: &[ServiceRecord], fqdn: &str) -> Materialized {
    let groups = group_imported(records);
    let key = GroupKey {
        namespace: NS.into(),
        fqdn: fqdn.into(),
    };
    materialize(&key, &groups[&key]).unwrap()
}

fn owners(meta: &ObjectMeta) -> Vec<(String, String)> {
    meta.owner_references
        .iter()
        .flatten()
        .map(|o| (o.name.clone(), o.uid.clone()))
        .collect()
}

fn addresses(endpoints: &Endpoints) -> Vec<Vec<String>> {
    endpoints
        .subsets
        .iter()
        .flatten()
        .map(|s| s.addresses.iter().flatten().map(|a| a.ip.clone()).collect())
        .collect()
}

fn subset_ports(endpoints: &Endpoints) -> Vec<Vec<i32>> {
    endpoints
        .subsets
        .iter()
        .flatten()
        .map(|s| s.ports.iter().flatten().map(|p| p.port).collect())
        .collect()
}

fn service_ports(service: &Service) -> Vec<(Option<String>, i32, Option<String>)> {
    service
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.port, p.protocol.clone()))
        .collect()
}

#[test]
fn one_imported_record_becomes_a_service_and_its_endpoints() {
    let (_, m) = only_group(&[record(
        "test.some.domain-abcd1234",
        "1",
        "test.some.domain",
        port_443(),
        &[("10.0.0.1", 443), ("10.0.0.2", 443)],
    )]);
    let service = serde_json::to_value(&m.service).unwrap();
    assert_eq!(
        service,
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "test-some-domain-cc9e50dd",
                "namespace": NS,
                "labels": {"app.kubernetes.io/managed-by": "xcc-binder"},
                "annotations": {FQDN_ANNOTATION: "test.some.domain"},
                "ownerReferences": [{
                    "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
                    "kind": "ServiceRecord",
                    "name": "test.some.domain-abcd1234",
                    "uid": "1",
                }],
            },
            // No selector, no targetPort, no clusterIP: only fields the binder owns.
            "spec": {"type": "ClusterIP", "ports": [{"port": 443, "protocol": "TCP"}]},
        })
    );
    assert_eq!(m.vip, None);
    assert_eq!(
        m.endpoints.metadata.name.as_deref(),
        Some("test-some-domain-cc9e50dd")
    );
    assert_eq!(
        owners(&m.endpoints.metadata),
        [("test.some.domain-abcd1234".into(), "1".into())]
    );
    assert_eq!(addresses(&m.endpoints), [["10.0.0.1", "10.0.0.2"]]);
    assert_eq!(subset_ports(&m.endpoints), [[443]]);
    assert_eq!(
        m.endpoints.metadata.labels.as_ref().unwrap()[SKIP_MIRROR_LABEL],
        "true"
    );
    assert_eq!(m.conflict, None);
    assert_eq!(m.dropped, []);

    let slice = serde_json::to_value(&m.slices).unwrap();
    // One slice per source cluster (here the remote registry `rr`: the record has no origin).
    let name = format!(
        "test-some-domain-cc9e50dd-ipv4-{}",
        names::hash8("rr//TCP/443")
    );
    assert_eq!(
        slice,
        json!([{
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": {
                    "kubernetes.io/service-name": "test-some-domain-cc9e50dd",
                    "endpointslice.kubernetes.io/managed-by": "xcc-binder",
                    "app.kubernetes.io/managed-by": "xcc-binder",
                    "multicluster.kubernetes.io/source-cluster": "rr",
                },
                "ownerReferences": [{
                    "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
                    "kind": "ServiceRecord",
                    "name": "test.some.domain-abcd1234",
                    "uid": "1",
                }],
            },
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
            ],
            "ports": [{"port": 443, "protocol": "TCP"}],
        }])
    );
}

#[test]
fn the_service_carries_the_records_virtual_ip_and_service_port() {
    let (_, m) = only_group(&[record(
        "test.some.domain-abcd1234",
        "1",
        "test.some.domain",
        json!({SERVICE_PORT_ANNOTATION: "443", VIP_ANNOTATION: "1.2.3.4"}),
        &[("10.0.0.1", 443)],
    )]);
    assert_eq!(m.vip.as_deref(), Some("1.2.3.4"));

    let (_, m) = only_group(&[record(
        "test.some.domain-abcd1234",
        "1",
        "test.some.domain",
        json!({SERVICE_PORT_ANNOTATION: "8080", VIP_ANNOTATION: "1.2.3.4"}),
        &[("10.0.0.1", 443), ("10.0.0.2", 443)],
    )]);
    assert_eq!(
        service_ports(&m.service),
        [(None, 8080, Some("TCP".into()))]
    );
    assert_eq!(m.vip.as_deref(), Some("1.2.3.4"));
    assert_eq!(subset_ports(&m.endpoints), [[443]]);
    assert_eq!(m.slices[0].ports.as_ref().unwrap()[0].port, Some(443));
    // The API server accepts a load-balancer status only on LoadBalancer Services: with a VIP
    // the Service is one, of a class no controller implements, without node ports.
    let spec = m.service.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(
        spec.load_balancer_class.as_deref(),
        Some(VIP_LOAD_BALANCER_CLASS)
    );
    assert_eq!(spec.allocate_load_balancer_node_ports, Some(false));
}

fn two_records_of_one_fqdn() -> Vec<ServiceRecord> {
    vec![
        record(
            "test.some.domain-bcde2345",
            "2",
            "test.some.domain",
            port_443(),
            &[("10.0.0.4", 443), ("10.0.0.3", 443)],
        ),
        record(
            "test.some.domain-abcd1234",
            "1",
            "test.some.domain",
            port_443(),
            &[("10.0.0.2", 443), ("10.0.0.1", 443)],
        ),
    ]
}

#[test]
fn records_of_one_fqdn_merge_into_one_service() {
    let (_, m) = only_group(&two_records_of_one_fqdn());
    let expected_owners = vec![
        ("test.some.domain-abcd1234".to_string(), "1".to_string()),
        ("test.some.domain-bcde2345".to_string(), "2".to_string()),
    ];
    assert_eq!(owners(&m.service.metadata), expected_owners);
    assert_eq!(owners(&m.endpoints.metadata), expected_owners);
    assert_eq!(
        addresses(&m.endpoints),
        [["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]]
    );
}

#[test]
fn other_fqdns_and_exported_records_stay_out_of_a_group() {
    let mut records = two_records_of_one_fqdn();
    records.push(record(
        "foobar.some.domain-bcde2345",
        "3",
        "foobar.some.domain",
        port_443(),
        &[("10.0.0.5", 443), ("10.0.0.6", 443)],
    ));
    let m = group_for(&records, "test.some.domain");
    let (_, alone) = only_group(&two_records_of_one_fqdn());
    assert_eq!(m, alone);

    // An exported record with the same FQDN is neither owner nor source.
    let mut exported = record(
        "test.some.domain.shared-services-cls-3",
        "3",
        "test.some.domain",
        port_443(),
        &[("10.0.0.5", 443), ("10.0.0.6", 443)],
    );
    exported.metadata.labels = Some(BTreeMap::from([(
        names::EXPORT_LABEL.into(),
        String::new(),
    )]));
    let records = vec![
        record(
            "a",
            "1",
            "test.some.domain",
            port_443(),
            &[("10.0.0.1", 443), ("10.0.0.3", 443)],
        ),
        record(
            "b",
            "2",
            "test.some.domain",
            port_443(),
            &[("10.0.0.2", 443), ("10.0.0.4", 443)],
        ),
        exported,
    ];
    let (_, m) = only_group(&records);
    assert_eq!(
        owners(&m.service.metadata),
        [("a".into(), "1".into()), ("b".into(), "2".into())]
    );
    assert_eq!(
        addresses(&m.endpoints),
        [["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]]
    );
}

#[test]
fn a_long_fqdn_gets_a_valid_hashed_service_name() {
    let fqdn = format!("{}.some.domain", "a".repeat(62));
    let (_, m) = only_group(&[record(
        "long",
        "1",
        &fqdn,
        json!({SERVICE_PORT_ANNOTATION: "443", VIP_ANNOTATION: "1.2.3.4"}),
        &[("10.0.0.1", 443), ("10.0.0.3", 443)],
    )]);
    let name = format!("{}-c2657973", "a".repeat(54));
    assert_eq!(m.service.metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(m.endpoints.metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(
        m.service.metadata.annotations.as_ref().unwrap()[FQDN_ANNOTATION],
        fqdn
    );
    assert!(
        m.slices[0]
            .metadata
            .name
            .as_ref()
            .unwrap()
            .starts_with(&name)
    );
}

#[test]
fn a_deleted_source_record_leaves_the_rest_of_its_group() {
    let mut records = two_records_of_one_fqdn();
    records.retain(|r| r.metadata.uid.as_deref() != Some("1"));
    let (_, m) = only_group(&records);
    assert_eq!(
        owners(&m.service.metadata),
        [("test.some.domain-bcde2345".into(), "2".into())]
    );
    assert_eq!(service_ports(&m.service), [(None, 443, Some("TCP".into()))]);
    assert_eq!(addresses(&m.endpoints), [["10.0.0.3", "10.0.0.4"]]);
    // The last one gone: nothing to materialise (the API server's GC removes the objects).
    assert!(group_imported(&[]).is_empty());
    assert_eq!(
        materialize(
            &GroupKey {
                namespace: NS.into(),
                fqdn: "x.y".into()
            },
            &[]
        ),
        Err(Skip::Empty)
    );
}

#[test]
fn b2_zero_endpoints_and_several_ports_give_valid_objects() {
    let (_, m) = only_group(&[record("r", "1", "test.some.domain", port_443(), &[])]);
    assert_eq!(m.endpoints.subsets, None);
    assert_eq!(m.slices, []);
    assert_eq!(service_ports(&m.service), [(None, 443, Some("TCP".into()))]);

    // Endpoints on different ports, no annotation: one named Service port each, and a
    // subset (and slice) per port set instead of one subset with several unnamed ports.
    let (_, m) = only_group(&[record(
        "r",
        "1",
        "test.some.domain",
        json!({}),
        &[("10.0.0.1", 443), ("10.0.0.2", 8443), ("10.0.0.3", 443)],
    )]);
    assert_eq!(
        service_ports(&m.service),
        [
            (Some("port-443".into()), 443, Some("TCP".into())),
            (Some("port-8443".into()), 8443, Some("TCP".into()))
        ]
    );
    assert_eq!(
        addresses(&m.endpoints),
        [vec!["10.0.0.1", "10.0.0.3"], vec!["10.0.0.2"]]
    );
    assert_eq!(subset_ports(&m.endpoints), [[443], [8443]]);
    assert_eq!(m.slices.len(), 2);

    // With the annotation, endpoints on different ports all serve the one Service port.
    let (_, m) = only_group(&[record(
        "r",
        "1",
        "test.some.domain",
        port_443(),
        &[("10.0.0.1", 443), ("10.0.0.2", 8443)],
    )]);
    assert_eq!(service_ports(&m.service), [(None, 443, Some("TCP".into()))]);
    assert_eq!(
        addresses(&m.endpoints),
        [vec!["10.0.0.1"], vec!["10.0.0.2"]]
    );
    assert_eq!(subset_ports(&m.endpoints), [[443], [8443]]);
}

#[test]
fn named_ports_with_node_port_targets_and_address_families() {
    let mut sr = record(
        "mysql",
        "1",
        "mysql.db.svc.clusterset.local",
        json!({}),
        &[
            ("10.0.0.1", 30306),
            ("10.0.0.1", 30362),
            ("fd00::1", 30306),
            ("10.0.0.2", 30306),
            ("10.0.0.9", 1),
            ("node.example", 30306),
        ],
    );
    sr.spec.ports = Some(vec![
        RecordPort {
            name: Some("mysql".into()),
            port: 3306,
            protocol: None,
            target_port: Some(30306),
        },
        RecordPort {
            name: Some("admin".into()),
            port: 33062,
            protocol: None,
            target_port: Some(30362),
        },
    ]);
    sr.spec.origin = Some(Origin {
        cluster: Some("west".into()),
        namespace: "db".into(),
        name: "mysql".into(),
        kind: None,
    });
    let (_, m) = only_group(&[sr]);
    assert_eq!(
        service_ports(&m.service),
        [
            (Some("admin".into()), 33062, Some("TCP".into())),
            (Some("mysql".into()), 3306, Some("TCP".into()))
        ]
    );
    let annotations = m.service.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[ORIGIN_NAMESPACE_ANNOTATION], "db");
    assert_eq!(annotations[ORIGIN_NAME_ANNOTATION], "mysql");
    // 10.0.0.1 serves both ports, 10.0.0.2 and fd00::1 only mysql.
    type SliceSummary = (String, Vec<String>, Vec<(Option<String>, Option<i32>)>);
    let mut got: Vec<SliceSummary> = m
        .slices
        .iter()
        .map(|s| {
            (
                s.address_type.clone(),
                s.endpoints.iter().map(|e| e.addresses[0].clone()).collect(),
                s.ports
                    .iter()
                    .flatten()
                    .map(|p| (p.name.clone(), p.port))
                    .collect(),
            )
        })
        .collect();
    let both = vec![
        (Some("admin".into()), Some(30362)),
        (Some("mysql".into()), Some(30306)),
    ];
    let mysql = vec![(Some("mysql".into()), Some(30306))];
    let mut expected: Vec<SliceSummary> = vec![
        ("IPv4".to_string(), vec!["10.0.0.1".to_string()], both),
        (
            "IPv4".to_string(),
            vec!["10.0.0.2".to_string()],
            mysql.clone(),
        ),
        ("IPv6".to_string(), vec!["fd00::1".to_string()], mysql),
    ];
    expected.sort_by_key(|a| (a.0.clone(), a.2.clone()));
    got.sort_by_key(|a| (a.0.clone(), a.2.clone()));
    assert_eq!(got, expected);
    assert_eq!(
        addresses(&m.endpoints),
        [vec!["10.0.0.1"], vec!["10.0.0.2", "fd00::1"]]
    );
    let reasons: Vec<(&str, &str)> = m
        .dropped
        .iter()
        .map(|d| (d.endpoint.as_str(), d.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            (
                "10.0.0.9:1",
                "no port of the service is served on this endpoint port"
            ),
            ("node.example:30306", "address is not an IP"),
        ]
    );
}

#[test]
fn b3_disagreeing_ports_lowest_uid_wins_and_the_conflict_is_reported() {
    let records = vec![
        record(
            "b",
            "uid-b",
            "test.some.domain",
            json!({SERVICE_PORT_ANNOTATION: "8443", VIP_ANNOTATION: "5.6.7.8"}),
            &[("10.0.0.2", 8443)],
        ),
        record(
            "a",
            "uid-a",
            "test.some.domain",
            json!({SERVICE_PORT_ANNOTATION: "443", VIP_ANNOTATION: "1.2.3.4"}),
            &[("10.0.0.1", 443)],
        ),
        record(
            "c",
            "uid-c",
            "test.some.domain",
            json!({SERVICE_PORT_ANNOTATION: "oops"}),
            &[("10.0.0.3", 443)],
        ),
    ];
    let (_, m) = only_group(&records);
    assert_eq!(service_ports(&m.service), [(None, 443, Some("TCP".into()))]);
    assert_eq!(m.vip.as_deref(), Some("1.2.3.4"));
    assert_eq!(addresses(&m.endpoints), [["10.0.0.1"]]);
    let conflict = m.conflict.unwrap();
    assert_eq!(conflict.winner, "a");
    assert_eq!(
        conflict
            .losers
            .iter()
            .map(|l| l.0.as_str())
            .collect::<Vec<_>>(),
        ["b", "c"]
    );
    assert!(
        conflict.to_string().contains("b (ports 8443/TCP differ)"),
        "{conflict}"
    );
    // Owners are every record of the FQDN, so the objects live while any of them does.
    assert_eq!(owners(&m.service.metadata).len(), 3);
    // Input order does not matter.
    let mut reversed = records.clone();
    reversed.reverse();
    assert_eq!(only_group(&reversed).1.service, m.service);

    // No record with usable ports: nothing, with the reasons.
    let bad = [record(
        "c",
        "1",
        "x.y",
        json!({SERVICE_PORT_ANNOTATION: "0"}),
        &[],
    )];
    let groups = group_imported(&bad);
    let (key, sources) = groups.iter().next().unwrap();
    assert!(matches!(materialize(key, sources), Err(Skip::NoPorts(r)) if r[0].contains("\"0\"")));
}

#[test]
fn fqdn_case_and_a_trailing_dot_share_one_service() {
    let records = [
        record(
            "foo.xcc.test-1",
            "1",
            "Foo.XCC.test",
            port_443(),
            &[("10.0.0.1", 443)],
        ),
        record(
            "foo.xcc.test-2",
            "2",
            "foo.xcc.test.",
            port_443(),
            &[("10.0.0.2", 443)],
        ),
    ];
    let (key, m) = only_group(&records);
    assert_eq!(key.fqdn, "foo.xcc.test");
    assert_eq!(
        m.service.metadata.name.as_deref(),
        Some(names::service_name("foo.xcc.test").as_str())
    );
    assert_eq!(
        m.service.metadata.annotations.as_ref().unwrap()[FQDN_ANNOTATION],
        "foo.xcc.test"
    );
    assert_eq!(addresses(&m.endpoints), [["10.0.0.1", "10.0.0.2"]]);
    // An FQDN that is no DNS name is not materialised at all.
    assert!(group_imported(&[record("bad", "3", "not a name", port_443(), &[])]).is_empty());
}

#[test]
fn ipv6_addresses_are_canonical_and_duplicates_merge() {
    let (_, m) = only_group(&[
        record(
            "a",
            "1",
            "t.x",
            port_443(),
            &[("fd00:0:0::1", 443), ("10.0.0.1", 443)],
        ),
        record(
            "b",
            "2",
            "t.x",
            port_443(),
            &[("fd00::1", 443), ("10.0.0.1", 443)],
        ),
    ]);
    assert_eq!(addresses(&m.endpoints), [["10.0.0.1", "fd00::1"]]);
    assert_eq!(
        m.slices
            .iter()
            .map(|s| s.address_type.as_str())
            .collect::<Vec<_>>(),
        ["IPv4", "IPv6"]
    );
}

#[test]
fn stale_slices_are_only_the_binders_own() {
    let (_, m) = only_group(&[record("a", "1", "t.x", port_443(), &[("10.0.0.1", 443)])]);
    let service = m.service.metadata.name.clone().unwrap();
    let mut old = m.slices[0].clone();
    old.metadata.name = Some(format!("{service}-ipv4-00000000"));
    let mut foreign = old.clone();
    foreign.metadata.name = Some("someone-elses".into());
    foreign.metadata.labels.as_mut().unwrap().insert(
        ENDPOINTSLICE_MANAGED_BY_LABEL.into(),
        "endpointslice-controller.k8s.io".into(),
    );
    let existing = [m.slices[0].clone(), old.clone(), foreign];
    assert_eq!(
        stale_slices(&service, &m.slices, &existing),
        [old.metadata.name.unwrap()]
    );
    assert_eq!(
        stale_slices(&service, &m.slices, &m.slices),
        Vec::<String>::new()
    );
}

fn cilium_record(name: &str, uid: &str, cluster: Option<&str>) -> ServiceRecord {
    let mut sr = record(
        name,
        uid,
        "mysql-svc.my-namespace.svc.clusterset.local",
        json!({}),
        &[("10.0.0.1", 3306)],
    );
    sr.spec.ports = Some(vec![RecordPort {
        name: Some("mysql".into()),
        port: 3306,
        protocol: None,
        target_port: None,
    }]);
    sr.spec.origin = Some(Origin {
        cluster: cluster.map(str::to_string),
        namespace: "my-namespace".into(),
        name: "mysql-svc".into(),
        kind: Some("Service".into()),
    });
    sr
}

#[test]
fn cilium_global_service_copies_name_namespace_and_ports() {
    let records = [
        cilium_record("r2", "2", Some("wc-beta-px")),
        cilium_record("r1", "1", None),
    ];
    let (groups, without) = cilium::group_by_origin(&records);
    assert!(without.is_empty());
    let key = OriginKey {
        namespace: "my-namespace".into(),
        name: "mysql-svc".into(),
    };
    let service = cilium::global_service(&key, &groups[&key], "xcc").unwrap();
    assert_eq!(
        serde_json::to_value(&service).unwrap(),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "mysql-svc",
                "namespace": "my-namespace",
                "labels": {"app.kubernetes.io/managed-by": "xcc-binder"},
                "annotations": {
                    "service.cilium.io/global": "true",
                    "service.cilium.io/shared": "false",
                    // r1 has no origin cluster: its remote registry names the source.
                    "connectivity.tanzu.vmware.com/source-cluster": "rr,wc-beta-px",
                    FQDN_ANNOTATION: "mysql-svc.my-namespace.svc.clusterset.local",
                    "binder.xcc/install": "xcc",
                },
            },
            "spec": {"type": "ClusterIP", "ports": [{"name": "mysql", "port": 3306, "protocol": "TCP"}]},
        })
    );
    let mut no_origin = cilium_record("r3", "3", None);
    no_origin.spec.origin = None;
    let both = [records[0].clone(), no_origin];
    let (groups, without) = cilium::group_by_origin(&both);
    assert_eq!(groups.len(), 1);
    assert_eq!(without.len(), 1);
    assert_eq!(
        cilium::global_service(&key, &[], "xcc"),
        Err(cilium::CiliumSkip::Empty)
    );
}

#[test]
fn cilium_namespace_ownership_and_orphans() {
    let ns = cilium::namespace("my-namespace");
    assert!(cilium::is_managed(&ns.metadata));
    let key = OriginKey {
        namespace: "my-namespace".into(),
        name: "mysql-svc".into(),
    };
    let record = cilium_record("r", "1", Some("a"));
    let ours = cilium::global_service(&key, &[&record], "xcc").unwrap();
    let other_install = cilium::global_service(&key, &[&record], "xcc-other").unwrap();
    // Made before the install annotation existed: foreign too.
    let mut unstamped = ours.clone();
    unstamped
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove(cilium::INSTALL_ANNOTATION);
    let mut local = ours.clone();
    local.metadata.labels = None;

    assert!(cilium::may_write(None, "xcc"));
    assert!(cilium::may_write(Some(&ours), "xcc"));
    for (name, service) in [
        ("another install's", &other_install),
        ("an unstamped", &unstamped),
        ("a local", &local),
    ] {
        assert!(
            !cilium::may_write(Some(service), "xcc"),
            "{name} Service is left alone"
        );
    }
    assert!(cilium::may_write(Some(&other_install), "xcc-other"));

    let table = [
        ("ours", &ours, true, 0, OrphanDecision::Keep),
        ("ours", &ours, true, 2, OrphanDecision::Keep),
        ("ours", &ours, false, 0, OrphanDecision::Delete),
        ("ours", &ours, false, 2, OrphanDecision::Keep),
        (
            "other install",
            &other_install,
            true,
            0,
            OrphanDecision::Keep,
        ),
        (
            "other install",
            &other_install,
            true,
            2,
            OrphanDecision::Keep,
        ),
        (
            "other install",
            &other_install,
            false,
            0,
            OrphanDecision::Keep,
        ),
        (
            "other install",
            &other_install,
            false,
            2,
            OrphanDecision::Keep,
        ),
        ("unstamped", &unstamped, true, 0, OrphanDecision::Keep),
        ("unstamped", &unstamped, true, 2, OrphanDecision::Keep),
        ("unstamped", &unstamped, false, 0, OrphanDecision::Keep),
        ("unstamped", &unstamped, false, 2, OrphanDecision::Keep),
        ("local", &local, false, 0, OrphanDecision::Keep),
    ];
    for (name, service, present, local_endpoints, expected) in table {
        assert_eq!(
            cilium::orphan_decision(service, "xcc", present, local_endpoints),
            expected,
            "{name} present={present} local={local_endpoints}"
        );
    }
    // The other install's binder deletes its own orphan, and not ours.
    assert_eq!(
        cilium::orphan_decision(&other_install, "xcc-other", false, 0),
        OrphanDecision::Delete
    );
    assert_eq!(
        cilium::orphan_decision(&ours, "xcc-other", false, 0),
        OrphanDecision::Keep
    );
}

#[test]
fn slices_are_split_per_source_cluster_and_carry_the_mcs_labels() {
    let fqdn = "api.shop.svc.clusterset.local";
    let from = |name: &str, uid: &str, cluster: &str, ip: &str| {
        let mut sr = record(name, uid, fqdn, port_443(), &[(ip, 443)]);
        sr.spec.origin = Some(Origin {
            cluster: Some(cluster.into()),
            namespace: "shop".into(),
            name: "api".into(),
            kind: None,
        });
        sr
    };
    // Both clusters list 10.0.0.9 (e.g. a shared load balancer): one slice each, one
    // legacy address.
    let records = [
        from("e1", "1", "east", "10.0.0.1"),
        from("e2", "2", "east", "10.0.0.9"),
        from("w1", "3", "west", "10.0.0.9"),
    ];
    let m = group_for(&records, fqdn);
    let got: Vec<(String, String, String, Vec<String>)> = m
        .slices
        .iter()
        .map(|s| {
            let l = s.metadata.labels.as_ref().unwrap();
            (
                s.metadata.name.clone().unwrap(),
                l[MCS_SERVICE_NAME_LABEL].clone(),
                l[MCS_SOURCE_CLUSTER_LABEL].clone(),
                s.endpoints.iter().map(|e| e.addresses[0].clone()).collect(),
            )
        })
        .collect();
    let service = names::service_name(fqdn);
    let mut want = vec![
        (
            format!("{service}-ipv4-{}", names::hash8("east//TCP/443")),
            "api".to_string(),
            "east".to_string(),
            vec!["10.0.0.1".to_string(), "10.0.0.9".to_string()],
        ),
        (
            format!("{service}-ipv4-{}", names::hash8("west//TCP/443")),
            "api".to_string(),
            "west".to_string(),
            vec!["10.0.0.9".to_string()],
        ),
    ];
    want.sort();
    assert_eq!(got, want);
    assert_eq!(addresses(&m.endpoints), [["10.0.0.1", "10.0.0.9"]]);
}

#[test]
fn a_headless_export_is_a_headless_service_with_hostnames_and_other_types_lose() {
    use xcc_proto::mcs::{HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION};
    let fqdn = "web.shop.svc.clusterset.local";
    let from = |name: &str, uid: &str, cluster: &str, annotations: Value, ips: &[&str]| {
        let endpoints: Vec<(&str, i32)> = ips.iter().map(|ip| (*ip, 8080)).collect();
        let mut sr = record(name, uid, fqdn, annotations, &endpoints);
        sr.spec.origin = Some(Origin {
            cluster: Some(cluster.into()),
            namespace: "shop".into(),
            name: "web".into(),
            kind: None,
        });
        sr
    };
    let records = [
        from(
            "e",
            "1",
            "east",
            json!({SERVICE_PORT_ANNOTATION: "80", HEADLESS_ANNOTATION: "true",
                   VIP_ANNOTATION: "192.0.2.1",
                   HOSTNAMES_ANNOTATION: "10.0.0.1=web-0,10.0.0.2=web-1"}),
            &["10.0.0.1", "10.0.0.2"],
        ),
        from(
            "w",
            "2",
            "west",
            json!({SERVICE_PORT_ANNOTATION: "80", HEADLESS_ANNOTATION: "true"}),
            &["10.1.0.1"],
        ),
        from(
            "n",
            "3",
            "north",
            json!({SERVICE_PORT_ANNOTATION: "80"}),
            &["10.2.0.1"],
        ),
    ];
    let m = group_for(&records, fqdn);
    let spec = m.service.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(m.vip, None, "a headless Service carries no VIP");
    // Source cluster → its slice's (address, hostname)s.
    type Pods = Vec<(String, Option<String>)>;
    let got: Vec<(String, Pods)> = m
        .slices
        .iter()
        .map(|s| {
            (
                s.metadata.labels.as_ref().unwrap()[MCS_SOURCE_CLUSTER_LABEL].clone(),
                s.endpoints
                    .iter()
                    .map(|e| (e.addresses[0].clone(), e.hostname.clone()))
                    .collect(),
            )
        })
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .collect();
    assert_eq!(
        got,
        [
            (
                "east".to_string(),
                vec![
                    ("10.0.0.1".to_string(), Some("web-0".to_string())),
                    ("10.0.0.2".to_string(), Some("web-1".to_string()))
                ]
            ),
            ("west".to_string(), vec![("10.1.0.1".to_string(), None)]),
        ]
    );
    assert_eq!(
        m.conflict,
        Some(Conflict {
            winner: "e".into(),
            losers: vec![(
                "n".into(),
                "ClusterSetIP where the service is Headless".into()
            )],
        })
    );

    // The same records with the cluster IP export the oldest (the only one that says when it
    // was exported): a ClusterIP Service, no hostnames, the headless exports left out.
    let mut records = records;
    records[2].metadata.annotations.as_mut().unwrap().insert(
        xcc_proto::mcs::EXPORTED_AT_ANNOTATION.into(),
        "2026-11-29T07:00:00Z".into(),
    );
    let m = group_for(&records, fqdn);
    assert_eq!(m.service.spec.as_ref().unwrap().cluster_ip, None);
    assert_eq!(m.slices.len(), 1);
    assert_eq!(m.slices[0].endpoints[0].hostname, None);
    assert_eq!(m.conflict.unwrap().losers.len(), 2);
}

/// A hierarchy import as the registry writes it: the headless marker and the single-port
/// annotation of XCC v1, and the answer's named ports with the pods' target ports.
fn hierarchy_db(ports: Value) -> ServiceRecord {
    use xcc_proto::mcs::{HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION};
    let mut sr = record(
        "db",
        "1",
        "db.shop.svc.clusterset.local",
        json!({SERVICE_PORT_ANNOTATION: "5432", HEADLESS_ANNOTATION: "true",
               HOSTNAMES_ANNOTATION: "10.4.0.1=db-0,10.4.0.2=db-1"}),
        &[
            ("10.4.0.1", 15432),
            ("10.4.0.1", 9187),
            ("10.4.0.2", 15432),
            ("10.4.0.2", 9187),
        ],
    );
    sr.spec.ports = serde_json::from_value(ports).unwrap();
    sr.spec.origin = Some(Origin {
        cluster: Some("east".into()),
        namespace: "shop".into(),
        name: "db".into(),
        kind: None,
    });
    sr
}

type SlicePorts = Vec<(Option<String>, Option<i32>, Option<String>)>;

fn slice_ports(m: &Materialized) -> Vec<(Vec<String>, SlicePorts)> {
    m.slices
        .iter()
        .map(|s| {
            (
                s.endpoints.iter().map(|e| e.addresses[0].clone()).collect(),
                s.ports
                    .iter()
                    .flatten()
                    .map(|p| (p.name.clone(), p.port, p.protocol.clone()))
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn an_imports_named_ports_name_the_service_and_slice_ports_with_their_protocols() {
    let sr = hierarchy_db(json!([
        {"name": "sql", "port": 5432, "protocol": "TCP", "targetPort": 15432},
        {"name": "stats", "port": 9187, "protocol": "UDP"},
    ]));
    let (_, m) = only_group(&[sr]);
    assert_eq!(
        service_ports(&m.service),
        [
            (Some("sql".into()), 5432, Some("TCP".into())),
            (Some("stats".into()), 9187, Some("UDP".into()))
        ]
    );
    assert_eq!(
        slice_ports(&m),
        [(
            vec!["10.4.0.1".to_string(), "10.4.0.2".into()],
            vec![
                (Some("sql".into()), Some(15432), Some("TCP".into())),
                (Some("stats".into()), Some(9187), Some("UDP".into()))
            ]
        )]
    );
    assert_eq!(m.dropped, []);

    // Without `spec.ports` (a flat Hamlet import): today's single unnamed TCP port from the
    // annotation, served on each endpoint's own port.
    let (_, m) = only_group(&[hierarchy_db(Value::Null)]);
    assert_eq!(
        service_ports(&m.service),
        [(None, 5432, Some("TCP".into()))]
    );
    let mut ports: Vec<_> = slice_ports(&m).into_iter().flat_map(|(_, p)| p).collect();
    ports.sort();
    assert_eq!(
        ports,
        [
            (None, Some(9187), Some("TCP".into())),
            (None, Some(15432), Some("TCP".into()))
        ]
    );
}

#[test]
fn bad_record_ports_are_left_out_one_by_one() {
    // A hand-edited record: a second `sql`, a port listed twice, a name no Service takes, an
    // unnamed port among several, a target that is no port. Only `sql` and `stats` stay.
    let sr = hierarchy_db(json!([
        {"name": "sql", "port": 5432, "targetPort": 15432},
        {"name": "sql", "port": 5433},
        {"name": "stats", "port": 9187, "protocol": "UDP"},
        {"name": "again", "port": 9187, "protocol": "UDP"},
        {"name": "Not_A_Name", "port": 7000},
        {"port": 7001},
        {"name": "zero", "port": 7002, "targetPort": 0},
    ]));
    let (_, m) = only_group(&[sr]);
    assert_eq!(
        service_ports(&m.service),
        [
            (Some("sql".into()), 5432, Some("TCP".into())),
            (Some("stats".into()), 9187, Some("UDP".into()))
        ]
    );
    // Every port bad: the record falls back to its annotation.
    let (_, m) = only_group(&[hierarchy_db(json!([
        {"port": 80}, {"port": 81}, {"name": "BAD", "port": 82}
    ]))]);
    assert_eq!(
        service_ports(&m.service),
        [(None, 5432, Some("TCP".into()))]
    );
}
