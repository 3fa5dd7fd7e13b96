//! XCC v1's publisher cases (endpoints from ready nodes and their taints, the vip annotation,
//! records gone with the label or the proxy, a proxy without virtualhost) as pure tables, plus
//! what xcc does beyond it (taint effects, role labels, sorted endpoints, others' records kept).

use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{Value, json};
use xcc_proto::crd::{Endpoint, Protocol, ServicePort, ServiceRecord};

use super::*;
use crate::httpproxy::HTTPProxy;

fn proxy(labels: Value, annotations: Value, spec: Value) -> HTTPProxy {
    serde_json::from_value(json!({
        "apiVersion": "projectcontour.io/v1",
        "kind": "HTTPProxy",
        "metadata": {
            "name": "test",
            "namespace": "http-proxy-namespace",
            "uid": "http-proxy-uid",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }))
    .unwrap()
}

fn exported_proxy() -> HTTPProxy {
    proxy(
        json!({EXPORT_LABEL: ""}),
        json!({}),
        json!({"virtualhost": {"fqdn": "test.some.domain"},
               "routes": [{"services": [{"name": "foobar", "port": 443}]}]}),
    )
}

fn node(name: &str, ip: &str, ready: bool, taints: Value, labels: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}],
        },
    }))
    .unwrap()
}

fn ready(name: &str, ip: &str) -> Node {
    node(name, ip, true, json!([]), json!({}))
}

fn ep(address: &str, port: i32) -> Endpoint {
    Endpoint {
        address: address.into(),
        port,
    }
}

fn published(desired: Desired) -> ServiceRecord {
    match desired {
        Desired::Publish(record) => *record,
        Desired::Skip(skip) => panic!("expected a record, got Skip({skip:?})"),
    }
}

fn endpoints_for(nodes: &[Node]) -> Vec<Endpoint> {
    published(from_httpproxy(
        &exported_proxy(),
        None,
        nodes,
        &Config::default(),
    ))
    .spec
    .endpoints
}

#[test]
fn one_ready_node() {
    let record = published(from_httpproxy(
        &exported_proxy(),
        None,
        &[ready("node-01", "10.0.0.1")],
        &Config::default(),
    ));
    let value = serde_json::to_value(&record).unwrap();
    assert_eq!(
        value["metadata"],
        json!({
            "name": "test.some.domain",
            "namespace": "http-proxy-namespace",
            "labels": {EXPORT_LABEL: "", "app.kubernetes.io/managed-by": "xcc-publisher"},
            "annotations": {SERVICE_PORT_ANNOTATION: "443"},
            "ownerReferences": [{
                "apiVersion": "projectcontour.io/v1",
                "kind": "HTTPProxy",
                "name": "test",
                "uid": "http-proxy-uid",
                "controller": true,
            }],
        })
    );
    assert_eq!(record.spec.fqdn, "test.some.domain");
    assert_eq!(record.spec.endpoints, [ep("10.0.0.1", 443)]);
    assert_eq!(
        record.spec.origin,
        Some(Origin {
            cluster: None,
            namespace: "http-proxy-namespace".into(),
            name: "test".into(),
            kind: Some("HTTPProxy".into()),
        })
    );
}

#[test]
fn vip_annotation_passes_through_and_unprefixed_ones_do_not() {
    let p = proxy(
        json!({EXPORT_LABEL: ""}),
        json!({
            "connectivity.tanzu.vmware.com/vip": "1.2.3.4",
            SERVICE_PORT_ANNOTATION: "8080",
            "connectivity.tanzu.vmware.comX": "no slash",
            "foobar": "",
        }),
        json!({"virtualhost": {"fqdn": "test.some.domain"}}),
    );
    let record = published(from_httpproxy(
        &p,
        None,
        &[ready("n", "10.0.0.1")],
        &Config::default(),
    ));
    assert_eq!(
        record.metadata.annotations.unwrap(),
        BTreeMap::from([
            (SERVICE_PORT_ANNOTATION.to_string(), "443".to_string()),
            (
                "connectivity.tanzu.vmware.com/vip".to_string(),
                "1.2.3.4".to_string()
            ),
        ])
    );
}

#[test]
fn node_eligibility() {
    let not_ready_taint = json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]);
    let cases: Vec<(&str, Vec<Node>, Vec<Endpoint>)> = vec![
        (
            "two ready nodes, listed out of order",
            vec![ready("node-02", "10.0.0.2"), ready("node-01", "10.0.0.1")],
            vec![ep("10.0.0.1", 443), ep("10.0.0.2", 443)],
        ),
        (
            "only node not ready",
            vec![node("node-01", "10.0.0.1", false, json!([]), json!({}))],
            vec![],
        ),
        (
            "ready node tainted not-ready:NoExecute",
            vec![node(
                "node-01",
                "10.0.0.1",
                true,
                not_ready_taint.clone(),
                json!({}),
            )],
            vec![ep("10.0.0.1", 443)],
        ),
        (
            "unknown NoSchedule taint excludes, not-ready taint does not",
            vec![
                node(
                    "node-01",
                    "10.0.0.1",
                    true,
                    json!([{"key": "TaintKeyNotExist", "effect": "NoSchedule"}]),
                    json!({}),
                ),
                node("node-02", "10.0.0.2", true, not_ready_taint, json!({})),
            ],
            vec![ep("10.0.0.2", 443)],
        ),
        (
            "PreferNoSchedule does not keep DaemonSet pods away",
            vec![node(
                "n",
                "10.0.0.1",
                true,
                json!([{"key": "dedicated", "effect": "PreferNoSchedule"}]),
                json!({}),
            )],
            vec![ep("10.0.0.1", 443)],
        ),
        (
            "pid-pressure is tolerated by DaemonSets",
            vec![node(
                "n",
                "10.0.0.1",
                true,
                json!([{"key": "node.kubernetes.io/pid-pressure", "effect": "NoSchedule"}]),
                json!({}),
            )],
            vec![ep("10.0.0.1", 443)],
        ),
        (
            "control-plane and master role labels are skipped",
            vec![
                node(
                    "cp",
                    "10.0.0.1",
                    true,
                    json!([]),
                    json!({"node-role.kubernetes.io/control-plane": ""}),
                ),
                node(
                    "m",
                    "10.0.0.2",
                    true,
                    json!([]),
                    json!({"node-role.kubernetes.io/master": "true"}),
                ),
                ready("w", "10.0.0.3"),
            ],
            vec![ep("10.0.0.3", 443)],
        ),
    ];
    for (name, nodes, expected) in cases {
        assert_eq!(endpoints_for(&nodes), expected, "{name}");
    }
}

#[test]
fn nodes_without_conditions_or_internal_ips_are_skipped_and_dual_stack_gives_both() {
    let no_conditions: Node =
        serde_json::from_value(json!({"metadata": {"name": "x"}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.9"}]}}))
            .unwrap();
    let external_only: Node = serde_json::from_value(json!({
        "metadata": {"name": "e"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "ExternalIP", "address": "203.0.113.1"}]}
    }))
    .unwrap();
    let dual: Node = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.5"},
                                 {"type": "InternalIP", "address": "fd00::5"},
                                 {"type": "InternalIP", "address": "10.0.0.5"}]}
    }))
    .unwrap();
    assert_eq!(
        endpoints_for(&[no_conditions, external_only, dual]),
        [ep("10.0.0.5", 443), ep("fd00::5", 443)]
    );
}

#[test]
fn load_balancer_ingress_of_the_envoy_service_wins_and_the_port_is_configurable() {
    let envoy: Service = serde_json::from_value(json!({
        "metadata": {"name": "envoy", "namespace": "projectcontour"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.20"}, {"hostname": "lb.example"}, {"ip": "192.0.2.10"}]}}
    }))
    .unwrap();
    let config = Config {
        ingress_port: 8443,
        cluster: Some("west".into()),
    };
    let record = published(from_httpproxy(
        &exported_proxy(),
        Some(&envoy),
        &[ready("n", "10.0.0.1")],
        &config,
    ));
    assert_eq!(
        record.spec.endpoints,
        [
            ep("192.0.2.10", 8443),
            ep("192.0.2.20", 8443),
            ep("lb.example", 8443)
        ]
    );
    assert_eq!(
        record.metadata.annotations.unwrap()[SERVICE_PORT_ANNOTATION],
        "8443"
    );
    assert_eq!(record.spec.origin.unwrap().cluster.as_deref(), Some("west"));

    // Without ingress addresses the nodes are used.
    let pending: Service =
        serde_json::from_value(json!({"spec": {"type": "LoadBalancer"}})).unwrap();
    let record = published(from_httpproxy(
        &exported_proxy(),
        Some(&pending),
        &[ready("n", "10.0.0.1")],
        &Config::default(),
    ));
    assert_eq!(record.spec.endpoints, [ep("10.0.0.1", 443)]);
}

#[test]
fn proxies_that_are_skipped() {
    let unlabelled = proxy(
        json!({}),
        json!({}),
        json!({"virtualhost": {"fqdn": "test.some.domain"}}),
    );
    assert_eq!(
        from_httpproxy(&unlabelled, None, &[], &Config::default()),
        Desired::Skip(Skip::NotExported)
    );
    // No virtualhost (an included proxy), with and without the label: no record, no panic.
    for labels in [json!({EXPORT_LABEL: ""}), json!({})] {
        let included = proxy(labels, json!({}), json!({"routes": []}));
        assert!(matches!(
            from_httpproxy(&included, None, &[], &Config::default()),
            Desired::Skip(Skip::NotExported | Skip::NoVirtualHost)
        ));
    }
    let included = proxy(json!({EXPORT_LABEL: ""}), json!({}), json!({}));
    assert_eq!(
        from_httpproxy(&included, None, &[], &Config::default()),
        Desired::Skip(Skip::NoVirtualHost)
    );
    let bad = proxy(
        json!({EXPORT_LABEL: ""}),
        json!({}),
        json!({"virtualhost": {"fqdn": "not a name"}}),
    );
    assert!(matches!(
        from_httpproxy(&bad, None, &[], &Config::default()),
        Desired::Skip(Skip::InvalidFqdn(msg)) if msg.contains("not a name")
    ));
}

#[test]
fn fqdn_is_canonicalised_for_name_and_spec() {
    let p = proxy(
        json!({EXPORT_LABEL: ""}),
        json!({}),
        json!({"virtualhost": {"fqdn": "Foo.XCC.test."}}),
    );
    let record = published(from_httpproxy(&p, None, &[], &Config::default()));
    assert_eq!(record.metadata.name.as_deref(), Some("foo.xcc.test"));
    assert_eq!(record.spec.fqdn, "foo.xcc.test");
    assert_eq!(record.spec.endpoints, []);
}

#[test]
fn ownership_decides_what_is_removed() {
    let owned = published(from_httpproxy(
        &exported_proxy(),
        None,
        &[],
        &Config::default(),
    ));
    // The label is removed → the proxy's records are stale.
    assert_eq!(
        stale_records("http-proxy-uid", None, [&owned]),
        vec![&owned]
    );
    // The record is garbage-collected with its proxy through the controller owner ref.
    let owner = &owned.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        ("http-proxy-uid", Some(true))
    );

    // A record of the same name made by someone else is never removed or rewritten.
    let mut foreign = owned.clone();
    foreign.metadata.labels = Some(BTreeMap::from([(EXPORT_LABEL.into(), String::new())]));
    assert!(stale_records("http-proxy-uid", None, [&foreign]).is_empty());
    assert!(!may_write(Some(&foreign), "http-proxy-uid"));
    let mut other_owner = owned.clone();
    other_owner.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
    assert!(stale_records("http-proxy-uid", None, [&other_owner]).is_empty());
    assert!(may_write(Some(&owned), "http-proxy-uid"));
    assert!(may_write(None, "http-proxy-uid"));

    // FQDN changed: the old record is stale, the new one kept.
    let mut renamed = owned.clone();
    renamed.metadata.name = Some("new.some.domain".into());
    assert_eq!(
        stale_records(
            "http-proxy-uid",
            Some("new.some.domain"),
            [&renamed, &owned]
        ),
        vec![&owned]
    );
}

#[test]
fn records_of_a_gone_source_are_found_by_owner_kind_and_name() {
    let owned = published(from_httpproxy(
        &exported_proxy(),
        None,
        &[],
        &Config::default(),
    ));
    assert_eq!(
        publisher_owner(&owned).map(|o| o.name.as_str()),
        Some("test")
    );
    // Any uid: a source deleted and re-created unlabelled still loses the old records.
    let mut older = owned.clone();
    older.metadata.name = Some("old.some.domain".into());
    older.metadata.owner_references.as_mut().unwrap()[0].uid = "older-uid".into();
    assert_eq!(
        records_of_source(
            "projectcontour.io/v1",
            "HTTPProxy",
            "test",
            [&owned, &older]
        ),
        vec![&older, &owned]
    );
    // Another source's name or kind, or a record without the publisher's labels: not ours.
    assert!(records_of_source("projectcontour.io/v1", "HTTPProxy", "other", [&owned]).is_empty());
    assert!(records_of_source("v1", "Service", "test", [&owned]).is_empty());
    let mut foreign = owned.clone();
    foreign.metadata.labels = Some(BTreeMap::from([(EXPORT_LABEL.into(), String::new())]));
    assert_eq!(publisher_owner(&foreign), None);
    assert!(records_of_source("projectcontour.io/v1", "HTTPProxy", "test", [&foreign]).is_empty());
    // A plain (non-controller) owner reference is not the publisher's link.
    let mut plain = owned.clone();
    plain.metadata.owner_references.as_mut().unwrap()[0].controller = None;
    assert_eq!(publisher_owner(&plain), None);
}

fn service(name: &str, labels: Value, annotations: Value, spec: Value, status: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "db", "uid": "svc-uid",
                     "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": status,
    }))
    .unwrap()
}

fn mysql_ports() -> Value {
    json!([{"name": "mysql", "port": 3306, "protocol": "TCP", "targetPort": 3306, "nodePort": 30306},
           {"name": "admin", "port": 33062, "nodePort": 30362}])
}

fn exported() -> Value {
    json!({EXPORT_LABEL: ""})
}

#[test]
fn cluster_ip_service_exports_its_cluster_ips_under_the_clusterset_name() {
    let svc = service(
        "mysql",
        exported(),
        json!({CLUSTERS_ANNOTATION: "wc-beta-px, wc-beta-hq,,wc-beta-hq",
               "connectivity.tanzu.vmware.com/vip": "1.2.3.4"}),
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10"],
               "ports": mysql_ports(), "selector": {"tier": "db", "app.kubernetes.io/name": "mysql"}}),
        json!({}),
    );
    let config = Config {
        cluster: Some("west".into()),
        ..Config::default()
    };
    let record = published(from_service(&svc, "shared-db", &[], &config));
    assert_eq!(
        record.metadata.name.as_deref(),
        Some("mysql.shared-db.svc.clusterset.local")
    );
    assert_eq!(record.metadata.namespace.as_deref(), Some("db"));
    assert_eq!(record.spec.fqdn, "mysql.shared-db.svc.clusterset.local");
    assert_eq!(
        record.spec.endpoints,
        [
            ep("10.96.0.10", 3306),
            ep("10.96.0.10", 33062),
            ep("fd00::10", 3306),
            ep("fd00::10", 33062)
        ]
    );
    assert_eq!(
        record.spec.ports,
        Some(vec![
            ServicePort {
                name: Some("mysql".into()),
                port: 3306,
                protocol: Some(Protocol::Tcp),
                target_port: None
            },
            ServicePort {
                name: Some("admin".into()),
                port: 33062,
                protocol: Some(Protocol::Tcp),
                target_port: None
            },
        ])
    );
    assert_eq!(
        record.spec.allowed_requesters,
        Some(vec!["wc-beta-hq".to_string(), "wc-beta-px".to_string()])
    );
    assert_eq!(
        record.spec.origin,
        Some(Origin {
            cluster: Some("west".into()),
            namespace: "shared-db".into(),
            name: "mysql".into(),
            kind: Some("Service".into()),
        })
    );
    let annotations = record.metadata.annotations.unwrap();
    assert_eq!(
        annotations.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "connectivity.tanzu.vmware.com/origin-name",
            "connectivity.tanzu.vmware.com/origin-namespace",
            SERVICE_PORT_ANNOTATION,
            "connectivity.tanzu.vmware.com/vip",
            WORKLOAD_SELECTOR_ANNOTATION,
        ],
        "the clusters annotation is consumed, the origin and the selector are added"
    );
    // The Service's pods, for the owner's grant policies.
    assert_eq!(
        annotations[WORKLOAD_SELECTOR_ANNOTATION],
        "app.kubernetes.io/name=mysql,tier=db"
    );
    assert_eq!(annotations[SERVICE_PORT_ANNOTATION], "3306");
    assert_eq!(annotations["connectivity.tanzu.vmware.com/vip"], "1.2.3.4");
    assert_eq!(
        annotations["connectivity.tanzu.vmware.com/origin-namespace"],
        "shared-db"
    );
    assert_eq!(
        annotations["connectivity.tanzu.vmware.com/origin-name"],
        "mysql"
    );
    assert!(!annotations.contains_key(CLUSTERS_ANNOTATION));
    let owner = &record.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.uid.as_str()
        ),
        ("v1", "Service", "svc-uid")
    );
}

#[test]
fn node_port_service_exports_ready_node_ips_on_node_ports() {
    let svc = service(
        "mysql",
        exported(),
        json!({FQDN_ANNOTATION: "MySQL.example.com"}),
        json!({"type": "NodePort", "clusterIP": "10.96.0.10", "ports": mysql_ports()}),
        json!({}),
    );
    let nodes = [
        ready("a", "10.0.0.2"),
        node("b", "10.0.0.3", false, json!([]), json!({})),
        node(
            "cp",
            "10.0.0.1",
            true,
            json!([]),
            json!({"node-role.kubernetes.io/control-plane": ""}),
        ),
    ];
    let record = published(from_service(&svc, "db", &nodes, &Config::default()));
    assert_eq!(record.spec.fqdn, "mysql.example.com");
    assert_eq!(
        record.spec.endpoints,
        [
            ep("10.0.0.1", 30306),
            ep("10.0.0.1", 30362),
            ep("10.0.0.2", 30306),
            ep("10.0.0.2", 30362)
        ]
    );
    let ports = record.spec.ports.unwrap();
    assert_eq!((ports[0].port, ports[0].target_port()), (3306, 30306));
    assert_eq!((ports[1].port, ports[1].target_port()), (33062, 30362));
    assert_eq!(record.spec.allowed_requesters, None);
}

#[test]
fn load_balancer_service_exports_ingress_addresses_on_service_ports() {
    let spec = json!({"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                      "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]});
    let svc = service(
        "dns",
        exported(),
        json!({}),
        spec.clone(),
        json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}),
    );
    let record = published(from_service(
        &svc,
        "db",
        &[ready("a", "10.0.0.2")],
        &Config::default(),
    ));
    assert_eq!(record.spec.endpoints, [ep("192.0.2.1", 53)]);
    assert_eq!(record.spec.ports.unwrap()[0].protocol, Some(Protocol::Udp));
    // Not provisioned yet: published without endpoints.
    let pending = service("dns", exported(), json!({}), spec, json!({}));
    let record = published(from_service(&pending, "db", &[], &Config::default()));
    assert_eq!(record.spec.endpoints, []);
}

#[test]
fn services_that_cannot_be_exported() {
    let cases = [
        (
            json!({}),
            json!({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}),
            Skip::NotExported,
        ),
        (
            exported(),
            json!({"clusterIP": "None", "ports": [{"port": 80}]}),
            Skip::Headless,
        ),
        (
            exported(),
            json!({"type": "ExternalName", "externalName": "x.example"}),
            Skip::ExternalName,
        ),
        (exported(), json!({"clusterIP": "10.0.0.1"}), Skip::NoPorts),
    ];
    for (labels, spec, expected) in cases {
        let svc = service("s", labels, json!({}), spec.clone(), json!({}));
        assert_eq!(
            from_service(&svc, "db", &[], &Config::default()),
            Desired::Skip(expected),
            "{spec}"
        );
    }
    let svc = service(
        "s",
        exported(),
        json!({FQDN_ANNOTATION: "bad..name"}),
        json!({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}),
        json!({}),
    );
    assert!(matches!(
        from_service(&svc, "db", &[], &Config::default()),
        Desired::Skip(Skip::InvalidFqdn(_))
    ));
}

#[test]
fn equal_inputs_give_equal_records() {
    let nodes_a = [ready("b", "10.0.0.2"), ready("a", "10.0.0.1")];
    let nodes_b = [ready("a", "10.0.0.1"), ready("b", "10.0.0.2")];
    assert_eq!(endpoints_for(&nodes_a), endpoints_for(&nodes_b));
}

#[test]
fn clusters_annotation_parsing() {
    assert_eq!(parse_clusters("a, b"), ["a", "b"]);
    assert_eq!(parse_clusters(" b ,a,b, "), ["a", "b"]);
    assert!(parse_clusters(" , ").is_empty());
}

fn slice(service: &str, namespace: &str, address_type: &str, endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-x"), "namespace": namespace,
                     "labels": {ENDPOINTSLICE_SERVICE_NAME_LABEL: service}},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{"name": "web", "port": 8080}, {"name": "metrics", "port": 0}],
    }))
    .unwrap()
}

#[test]
fn headless_service_exports_its_ready_pods_with_their_hostnames_in_mcs_mode() {
    let svc = service(
        "web",
        exported(),
        json!({HEADLESS_ANNOTATION: "spoofed", HOSTNAMES_ANNOTATION: "10.9.9.9=evil"}),
        json!({"clusterIP": "None", "ports": [{"name": "web", "port": 80}]}),
        json!({}),
    );
    let slices = [
        slice(
            "web",
            "db",
            "IPv4",
            json!([
                {"addresses": ["10.0.0.2"], "hostname": "web-1"},
                {"addresses": ["10.0.0.1"], "hostname": "web-0", "conditions": {"ready": true}},
                {"addresses": ["10.0.0.3"], "hostname": "web-2", "conditions": {"ready": false}},
                {"addresses": ["10.0.0.4"], "hostname": "Not_A_Label"},
            ]),
        ),
        slice("web", "db", "FQDN", json!([{"addresses": ["pod.example"]}])),
        slice("web", "other", "IPv4", json!([{"addresses": ["10.1.0.1"]}])),
        slice("api", "db", "IPv4", json!([{"addresses": ["10.2.0.1"]}])),
    ];
    let mine = slices_of("db", "web", slices.iter());
    assert_eq!(mine.len(), 2);
    let config = Config {
        cluster: Some("east".into()),
        ..Config::default()
    };
    let record = published(from_exported_service(
        &svc,
        ExportedBy::Label,
        "db",
        &[],
        Some(&mine),
        &config,
    ));
    assert_eq!(
        record.spec.endpoints,
        [
            ep("10.0.0.1", 8080),
            ep("10.0.0.2", 8080),
            ep("10.0.0.4", 8080)
        ]
    );
    assert_eq!(
        record.spec.ports,
        Some(vec![ServicePort {
            name: Some("web".into()),
            port: 80,
            protocol: Some(Protocol::Tcp),
            target_port: Some(8080),
        }])
    );
    let annotations = record.metadata.annotations.unwrap();
    assert_eq!(annotations[HEADLESS_ANNOTATION], "true");
    assert_eq!(
        annotations[HOSTNAMES_ANNOTATION],
        "10.0.0.1=web-0,10.0.0.2=web-1"
    );
    assert_eq!(annotations[SERVICE_PORT_ANNOTATION], "80");

    // Without slices yet: exported with no endpoints, on the numeric targetPort.
    let pending = service(
        "web",
        exported(),
        json!({}),
        json!({"clusterIP": "None", "ports": [{"port": 80, "targetPort": 8081}]}),
        json!({}),
    );
    let record = published(from_exported_service(
        &pending,
        ExportedBy::Label,
        "db",
        &[],
        Some(&[]),
        &config,
    ));
    assert!(record.spec.endpoints.is_empty());
    assert_eq!(record.spec.ports.unwrap()[0].target_port, Some(8081));
    let annotations = record.metadata.annotations.unwrap();
    assert_eq!(annotations[HEADLESS_ANNOTATION], "true");
    assert!(!annotations.contains_key(HOSTNAMES_ANNOTATION));

    // Outside MCS mode (no slices read) a headless Service is not exported.
    assert_eq!(
        from_exported_service(&pending, ExportedBy::Label, "db", &[], None, &config),
        Desired::Skip(Skip::Headless)
    );
}

#[test]
fn a_cluster_ip_service_never_carries_the_headless_annotations() {
    let svc = service(
        "web",
        exported(),
        json!({HEADLESS_ANNOTATION: "true", HOSTNAMES_ANNOTATION: "10.0.0.1=web-0"}),
        json!({"clusterIP": "10.96.0.9", "ports": [{"port": 80}]}),
        json!({}),
    );
    let record = published(from_exported_service(
        &svc,
        ExportedBy::Label,
        "db",
        &[],
        Some(&[]),
        &Config::default(),
    ));
    assert_eq!(record.spec.endpoints, [ep("10.96.0.9", 80)]);
    let annotations = record.metadata.annotations.unwrap();
    assert!(!annotations.contains_key(HEADLESS_ANNOTATION));
    assert!(!annotations.contains_key(HOSTNAMES_ANNOTATION));
}

/// EndpointSlice of `service` in `db` with the given ports and endpoints.
fn slice_with_ports(service: &str, ports: Value, endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{service}-{}", ports.to_string().len()), "namespace": "db",
                     "labels": {ENDPOINTSLICE_SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }))
    .unwrap()
}

#[test]
fn a_service_export_alone_exports_the_ready_pods_on_their_target_ports() {
    let ports = json!([{"name": "http", "port": 80, "targetPort": "web"},
                       {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353},
                       {"name": "admin", "port": 9000}]);
    let slices = [
        slice_with_ports(
            "api",
            json!([{"name": "http", "port": 8080}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
            json!([
                {"addresses": ["10.0.0.2"]},
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
            ]),
        ),
        slice_with_ports(
            "other",
            json!([{"name": "http", "port": 8081}]),
            json!([{"addresses": ["10.1.0.1"]}]),
        ),
    ];
    let mine = slices_of("db", "api", slices.iter());
    assert_eq!(mine.len(), 1);
    let config = Config {
        cluster: Some("east".into()),
        ..Config::default()
    };
    let expected_ports = Some(vec![
        ServicePort {
            name: Some("http".into()),
            port: 80,
            protocol: Some(Protocol::Tcp),
            target_port: Some(8080),
        },
        ServicePort {
            name: Some("dns".into()),
            port: 53,
            protocol: Some(Protocol::Udp),
            target_port: Some(5353),
        },
        // No slice port of its name: its port.
        ServicePort {
            name: Some("admin".into()),
            port: 9000,
            protocol: Some(Protocol::Tcp),
            target_port: None,
        },
    ]);
    let expected_endpoints = [
        ep("10.0.0.1", 5353),
        ep("10.0.0.1", 8080),
        ep("10.0.0.1", 9000),
        ep("10.0.0.2", 5353),
        ep("10.0.0.2", 8080),
        ep("10.0.0.2", 9000),
    ];
    // Every type but ExternalName: the pods, never the cluster IP, load balancer or nodes.
    for spec in [
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.9", "ports": ports}),
        json!({"type": "LoadBalancer", "clusterIP": "10.96.0.9", "ports": ports}),
        json!({"type": "NodePort", "clusterIP": "10.96.0.9", "ports": ports}),
    ] {
        let svc = service(
            "api",
            json!({}),
            json!({}),
            spec.clone(),
            json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}),
        );
        let record = published(from_exported_service(
            &svc,
            ExportedBy::ServiceExport,
            "db",
            &[ready("n1", "172.18.0.2")],
            Some(&mine),
            &config,
        ));
        assert_eq!(record.spec.endpoints, expected_endpoints, "{spec}");
        assert_eq!(record.spec.ports, expected_ports, "{spec}");
        // Not headless: no headless marker, no hostnames.
        let annotations = record.metadata.annotations.unwrap();
        assert!(!annotations.contains_key(HEADLESS_ANNOTATION));
        assert!(!annotations.contains_key(HOSTNAMES_ANNOTATION));
        assert_eq!(annotations[SERVICE_PORT_ANNOTATION], "80");
    }

    let svc = service(
        "api",
        json!({}),
        json!({}),
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.9", "ports": ports}),
        json!({}),
    );
    // No ready pod (or no slice yet): exported with no endpoints, not with the cluster IP.
    let record = published(from_exported_service(
        &svc,
        ExportedBy::ServiceExport,
        "db",
        &[],
        Some(&[]),
        &config,
    ));
    assert!(record.spec.endpoints.is_empty());
    assert_eq!(record.spec.ports.unwrap()[1].target_port, Some(5353));
    // The XCC v1 label (with or without a ServiceExport) keeps the cluster IP.
    let record = published(from_exported_service(
        &svc,
        ExportedBy::Label,
        "db",
        &[],
        Some(&mine),
        &config,
    ));
    assert_eq!(
        record.spec.endpoints,
        [
            ep("10.96.0.9", 53),
            ep("10.96.0.9", 80),
            ep("10.96.0.9", 9000)
        ]
    );
    assert_eq!(
        from_exported_service(&svc, ExportedBy::Nothing, "db", &[], Some(&mine), &config),
        Desired::Skip(Skip::NotExported)
    );
}
