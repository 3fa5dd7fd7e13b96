use serde_json::{Value, json};
use xcc_proto::mcs::TYPE_CLUSTER_SET_IP;
use xcc_proto::names::{IMPORTED_LABEL, REMOTE_REGISTRY_LABEL};

use super::*;

const NS: &str = "xcc";

fn record(name: &str, uid: &str, cluster: &str, ports: Value, annotations: Value) -> ServiceRecord {
    serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "annotations": annotations,
                     "labels": {IMPORTED_LABEL: "", REMOTE_REGISTRY_LABEL: "registry"}},
        "spec": {"fqdn": "api.shop.svc.clusterset.local",
                 "endpoints": [{"address": "10.0.0.1", "port": 8080}],
                 "ports": ports,
                 "origin": {"cluster": cluster, "namespace": "shop", "name": "api"}},
    }))
    .unwrap()
}

fn binder_service(cluster_ip: &str, vip: Option<&str>) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": names::service_name("api.shop.svc.clusterset.local"), "namespace": NS},
        "spec": {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip]},
        "status": {"loadBalancer": {"ingress": vip.map(|ip| vec![json!({"ip": ip})])}},
    }))
    .unwrap()
}

fn services(s: &Service) -> BTreeMap<(String, String), &Service> {
    BTreeMap::from([(
        (
            s.metadata.namespace.clone().unwrap(),
            s.metadata.name.clone().unwrap(),
        ),
        s,
    )])
}

#[test]
fn one_import_per_origin_with_ports_ips_and_clusters() {
    let east = record(
        "a",
        "1",
        "east",
        json!([{"name": "http", "port": 80, "targetPort": 8080}]),
        json!({}),
    );
    let west = record(
        "b",
        "2",
        "west",
        json!([{"name": "http", "port": 80, "targetPort": 8080}]),
        json!({}),
    );
    let svc = binder_service("10.96.0.10", None);
    let (imports, skipped) = desired(&[&west, &east], &services(&svc), "xcc-system");
    assert_eq!(skipped, []);
    let got = serde_json::to_value(&imports).unwrap();
    assert_eq!(
        got,
        json!([{
            "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
            "metadata": {
                "name": "api", "namespace": "shop",
                "labels": {MANAGED_BY_LABEL: BINDER_MANAGER},
                "annotations": {FQDN_ANNOTATION: "api.shop.svc.clusterset.local",
                                INSTALL_ANNOTATION: "xcc-system"},
            },
            "spec": {"type": TYPE_CLUSTER_SET_IP, "ips": ["10.96.0.10"], "ipFamilies": ["IPv4"],
                     "ports": [{"name": "http", "protocol": "TCP", "port": 80}]},
            "status": {"clusters": [{"cluster": "east"}, {"cluster": "west"}]},
        }])
    );
}

#[test]
fn ips_are_the_cluster_ips_of_the_binders_service_once_allocated() {
    let r = record("a", "1", "east", json!([{"port": 80}]), json!({}));
    let svc = binder_service("10.96.0.10", Some("192.0.2.7"));
    let (imports, _) = desired(&[&r], &services(&svc), "i");
    assert_eq!(imports[0].spec.ips, Some(vec!["10.96.0.10".to_string()]));
    let (imports, _) = desired(&[&r], &BTreeMap::new(), "i");
    assert_eq!(
        imports[0].spec.ips, None,
        "no IP before the API server allocates one"
    );
}

#[test]
fn an_origin_without_usable_ports_is_skipped_with_a_reason() {
    let mut r = record("a", "1", "east", Value::Null, json!({}));
    r.spec.endpoints.clear();
    let (imports, skipped) = desired(&[&r], &BTreeMap::new(), "i");
    assert_eq!(imports, []);
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].origin.name, "api");
    assert_eq!(skipped[0].reason, "no record has usable ports");
}

fn existing(name: &str, labels: Value, annotations: Value) -> ServiceImport {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "labels": labels, "annotations": annotations},
        "spec": {"type": "ClusterSetIP", "ports": [{"port": 80}]},
    }))
    .unwrap()
}

#[test]
fn only_this_installs_imports_are_written_or_deleted() {
    let ours = existing(
        "old",
        json!({MANAGED_BY_LABEL: BINDER_MANAGER}),
        json!({INSTALL_ANNOTATION: "i"}),
    );
    let other_install = existing(
        "x",
        json!({MANAGED_BY_LABEL: BINDER_MANAGER}),
        json!({INSTALL_ANNOTATION: "j"}),
    );
    let submariner = existing(
        "api",
        json!({"app.kubernetes.io/managed-by": "lighthouse"}),
        json!({}),
    );
    assert!(may_write(None, "i"));
    assert!(may_write(Some(&ours), "i"));
    assert!(!may_write(Some(&other_install), "i"));
    assert!(!may_write(Some(&submariner), "i"));

    let r = record("a", "1", "east", json!([{"port": 80}]), json!({}));
    let (want, _) = desired(&[&r], &BTreeMap::new(), "i");
    let kept = existing(
        "api",
        json!({MANAGED_BY_LABEL: BINDER_MANAGER}),
        json!({INSTALL_ANNOTATION: "i"}),
    );
    let gone: Vec<_> = stale([&ours, &other_install, &submariner, &kept], &want, "i")
        .into_iter()
        .map(|e| e.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(gone, ["old"]);
    // Nothing desired: all of ours go, nothing else.
    assert_eq!(
        stale([&ours, &other_install, &submariner], &[], "i").len(),
        1
    );
}

#[test]
fn differs_compares_what_the_binder_owns() {
    let r = record("a", "1", "east", json!([{"port": 80}]), json!({}));
    let (want, _) = desired(&[&r], &BTreeMap::new(), "i");
    let want = &want[0];
    assert_eq!(differs(None, want), (true, true));
    let mut same = want.clone();
    same.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("user".into(), "x".into());
    assert_eq!(
        differs(Some(&same), want),
        (false, false),
        "extra labels are not ours"
    );
    let mut other_status = want.clone();
    other_status.status = None;
    assert_eq!(differs(Some(&other_status), want), (false, true));
    let mut other_spec = want.clone();
    other_spec.spec.ports[0].port = 81;
    assert_eq!(differs(Some(&other_spec), want), (true, false));
}

#[test]
fn a_headless_export_is_a_headless_import_without_ips() {
    let r = record(
        "a",
        "1",
        "east",
        json!([{"port": 80}]),
        json!({xcc_proto::mcs::HEADLESS_ANNOTATION: "true"}),
    );
    let mut svc = binder_service("None", None);
    // The API server gives a headless selector-less Service both families: not what counts.
    svc.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
    let (imports, _) = desired(&[&r], &services(&svc), "i");
    assert_eq!(imports[0].spec.type_, xcc_proto::mcs::TYPE_HEADLESS);
    assert_eq!(imports[0].spec.ips, None);
    // The families of the endpoints' addresses, IPv4 first.
    assert_eq!(imports[0].spec.ip_families, Some(vec!["IPv4".to_string()]));
    let mut dual = r.clone();
    dual.spec.endpoints = vec![
        xcc_proto::crd::Endpoint {
            address: "fd00::5".into(),
            port: 8080,
        },
        xcc_proto::crd::Endpoint {
            address: "10.0.0.5".into(),
            port: 8080,
        },
    ];
    let (imports, _) = desired(&[&dual], &services(&svc), "i");
    assert_eq!(
        imports[0].spec.ip_families,
        Some(vec!["IPv4".to_string(), "IPv6".to_string()])
    );
    dual.spec.endpoints.clear();
    let (imports, _) = desired(&[&dual], &services(&svc), "i");
    assert_eq!(imports[0].spec.ip_families, None, "no endpoint, no family");
}

#[test]
fn ip_families_follow_the_ips_one_per_family_in_order() {
    let r = record("a", "1", "east", json!([{"port": 80}]), json!({}));
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": names::service_name("api.shop.svc.clusterset.local"), "namespace": NS},
        "spec": {"clusterIP": "fd00::a", "clusterIPs": ["fd00::a", "10.96.0.10"],
                 "ipFamilies": ["IPv6", "IPv4"]},
    }))
    .unwrap();
    let (imports, _) = desired(&[&r], &services(&svc), "i");
    assert_eq!(
        imports[0].spec.ips,
        Some(vec!["fd00::a".to_string(), "10.96.0.10".to_string()])
    );
    assert_eq!(
        imports[0].spec.ip_families,
        Some(vec!["IPv6".to_string(), "IPv4".to_string()])
    );
    let (imports, _) = desired(&[&r], &BTreeMap::new(), "i");
    assert_eq!(imports[0].spec.ip_families, None, "no IP, no family");
}

#[test]
fn an_imports_named_ports_with_their_protocols_are_the_service_imports_ports() {
    let r = record(
        "a",
        "1",
        "east",
        json!([
            {"name": "sql", "port": 5432, "protocol": "TCP", "targetPort": 15432},
            {"name": "stats", "port": 9187, "protocol": "UDP"},
        ]),
        json!({xcc_proto::mcs::HEADLESS_ANNOTATION: "true"}),
    );
    let (imports, skipped) = desired(&[&r], &BTreeMap::new(), "xcc-system");
    assert_eq!(skipped, []);
    assert_eq!(
        serde_json::to_value(&imports[0].spec).unwrap(),
        json!({"type": "Headless", "ipFamilies": ["IPv4"], "ports": [
            {"name": "sql", "protocol": "TCP", "port": 5432},
            {"name": "stats", "protocol": "UDP", "port": 9187},
        ]})
    );
}

/// KEP-1645 / issue 26: a headless and a ClusterSetIP export of one name — the oldest export
/// decides the type of the import and the Service, in both orders of creation, whatever the
/// UIDs (which differ per cluster) and the order the records are seen in.
#[test]
fn the_oldest_export_decides_the_type_in_both_orders() {
    use crate::desired::{GroupKey, materialize};
    use xcc_proto::mcs::{EXPORTED_AT_ANNOTATION, HEADLESS_ANNOTATION, TYPE_HEADLESS};
    let ports = || json!([{"name": "http", "port": 80, "targetPort": 8080}]);
    let svc = binder_service("10.96.0.10", None);
    let key = GroupKey {
        namespace: NS.into(),
        fqdn: "api.shop.svc.clusterset.local".into(),
    };
    for (east_at, west_at, want) in [
        (
            "2026-11-29T07:00:00Z",
            "2026-11-29T07:00:01Z",
            TYPE_HEADLESS,
        ),
        (
            "2026-11-29T07:00:01Z",
            "2026-11-29T07:00:00Z",
            TYPE_CLUSTER_SET_IP,
        ),
        // The same second: east's name sorts first.
        (
            "2026-11-29T07:00:00Z",
            "2026-11-29T07:00:00Z",
            TYPE_HEADLESS,
        ),
    ] {
        // east headless, west with a cluster IP; the UIDs favour the other one each time.
        let east = record(
            "e",
            if want == TYPE_HEADLESS { "9" } else { "1" },
            "east",
            ports(),
            json!({HEADLESS_ANNOTATION: "true", EXPORTED_AT_ANNOTATION: east_at}),
        );
        let west = record(
            "w",
            if want == TYPE_HEADLESS { "1" } else { "9" },
            "west",
            ports(),
            json!({EXPORTED_AT_ANNOTATION: west_at}),
        );
        for seen in [[&east, &west], [&west, &east]] {
            let (imports, _) = desired(&seen, &services(&svc), "xcc-system");
            assert_eq!(
                imports[0].spec.type_, want,
                "east {east_at}, west {west_at}"
            );
            let m = materialize(&key, &seen).unwrap();
            let headless = m.service.spec.as_ref().unwrap().cluster_ip.as_deref() == Some("None");
            assert_eq!(headless, want == TYPE_HEADLESS);
            let conflict = m.conflict.unwrap();
            let loser = if headless { "w" } else { "e" };
            assert_eq!(conflict.losers.len(), 1);
            assert_eq!(conflict.losers[0].0, loser);
        }
    }
}

/// KEP-1645 / issue 26: the service's ports are the union of the exporters' ports; a port
/// name defined otherwise by a younger export is left out of that export's endpoints, which
/// still serve its other ports.
#[test]
fn ports_are_the_union_of_the_exports_and_the_oldest_defines_a_port() {
    use crate::desired::{GroupKey, materialize};
    use xcc_proto::mcs::{EXPORTED_AT_ANNOTATION, MCS_SOURCE_CLUSTER_LABEL};
    let east = record(
        "e",
        "9",
        "east",
        json!([{"name": "http", "port": 80, "targetPort": 8080},
               {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]),
        json!({EXPORTED_AT_ANNOTATION: "2026-11-29T07:00:00Z"}),
    );
    let mut west = record(
        "w",
        "1",
        "west",
        json!([{"name": "http", "port": 8081, "targetPort": 8080},
               {"name": "metrics", "port": 9090, "targetPort": 8080}]),
        json!({EXPORTED_AT_ANNOTATION: "2026-11-29T07:00:01Z"}),
    );
    west.spec.endpoints[0].address = "10.1.0.1".into();
    let svc = binder_service("10.96.0.10", None);
    let (imports, _) = desired(&[&west, &east], &services(&svc), "xcc-system");
    assert_eq!(
        serde_json::to_value(&imports[0].spec.ports).unwrap(),
        json!([{"name": "dns", "protocol": "UDP", "port": 53},
               {"name": "http", "protocol": "TCP", "port": 80},
               {"name": "metrics", "protocol": "TCP", "port": 9090}])
    );
    let key = GroupKey {
        namespace: NS.into(),
        fqdn: "api.shop.svc.clusterset.local".into(),
    };
    let m = materialize(&key, &[&west, &east]).unwrap();
    let service_ports: Vec<(Option<String>, i32)> = m
        .service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name, p.port))
        .collect();
    assert_eq!(
        service_ports,
        [
            (Some("dns".into()), 53),
            (Some("http".into()), 80),
            (Some("metrics".into()), 9090)
        ]
    );
    // Each cluster's slice serves that cluster's ports: west's pods only `metrics`.
    // (source cluster, addresses, (port name, number)s) per slice.
    type Slices = Vec<(String, Vec<String>, Vec<(String, i32)>)>;
    let mut slices: Slices = m
        .slices
        .iter()
        .map(|s| {
            (
                s.metadata.labels.as_ref().unwrap()[MCS_SOURCE_CLUSTER_LABEL].clone(),
                s.endpoints.iter().map(|e| e.addresses[0].clone()).collect(),
                s.ports
                    .iter()
                    .flatten()
                    .map(|p| (p.name.clone().unwrap(), p.port.unwrap()))
                    .collect(),
            )
        })
        .collect();
    slices.sort();
    assert_eq!(
        slices,
        [
            (
                "east".to_string(),
                vec!["10.0.0.1".to_string()],
                vec![("http".to_string(), 8080)]
            ),
            (
                "west".to_string(),
                vec!["10.1.0.1".to_string()],
                vec![("metrics".to_string(), 8080)]
            ),
        ]
    );
    assert_eq!(
        m.conflict.unwrap().losers,
        [(
            "w".to_string(),
            "port http:8081/TCP left out (e has http:80/TCP)".to_string()
        )]
    );
}

/// KEP-1645 / issue 26 point 6: a ServiceImport's EndpointSlices live in the service's
/// namespace, one per source cluster, with the MCS labels and xcc as the manager, and belong
/// to no Service; only this install's are ever stale.
#[test]
fn import_slices_live_in_the_services_namespace_with_the_mcs_labels() {
    let ports = || json!([{"name": "http", "port": 80, "targetPort": 8080}]);
    let east = record("a", "1", "east", ports(), json!({}));
    let mut west = record("b", "2", "west", ports(), json!({}));
    west.spec.endpoints[0].address = "10.2.0.1".into();
    let slices = import_slices(&[&east, &west], "xcc-system");
    let mut api = slices[&("shop".to_string(), "api".to_string())].clone();
    api.sort_by_key(|s| s.metadata.labels.as_ref().unwrap()[MCS_SOURCE_CLUSTER_LABEL].clone());
    assert_eq!(api.len(), 2);
    for (slice, (cluster, ip)) in api.iter().zip([("east", "10.0.0.1"), ("west", "10.2.0.1")]) {
        assert_eq!(slice.metadata.namespace.as_deref(), Some("shop"));
        assert!(
            slice
                .metadata
                .name
                .as_ref()
                .unwrap()
                .starts_with("api-ipv4-")
        );
        assert_eq!(
            slice.metadata.labels,
            Some(BTreeMap::from([
                (MCS_SERVICE_NAME_LABEL.to_string(), "api".to_string()),
                (MCS_SOURCE_CLUSTER_LABEL.to_string(), cluster.to_string()),
                (
                    ENDPOINTSLICE_MANAGED_BY_LABEL.to_string(),
                    BINDER_MANAGER.to_string()
                ),
                (MANAGED_BY_LABEL.to_string(), BINDER_MANAGER.to_string()),
            ]))
        );
        assert_eq!(slice.endpoints[0].addresses, [ip]);
        assert!(is_our_import_slice(slice, "xcc-system"));
        assert!(!is_our_import_slice(slice, "other-install"));
    }
    // Owned by the stored ServiceImport.
    let mut import = ServiceImport::default();
    import.metadata.name = Some("api".into());
    import.metadata.uid = Some("u-1".into());
    let owned = owned_by(api[0].clone(), &import).unwrap();
    let owner = &owned.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("ServiceImport", "u-1")
    );
    // West's export gone: its slice is stale, east's is not; another install's never is.
    let now = import_slices(&[&east], "xcc-system");
    let mut foreign = api[1].clone();
    foreign
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(INSTALL_ANNOTATION.into(), "other-install".into());
    let stale = stale_import_slices([&api[0], &api[1], &foreign], &now, "xcc-system");
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0].metadata.name, api[1].metadata.name);
    assert_eq!(
        import_slice_selector(),
        "app.kubernetes.io/managed-by=xcc-binder,multicluster.kubernetes.io/service-name,!kubernetes.io/service-name"
    );
}

/// The ServiceImport (and the binder's Service, for kube-proxy's affinity)
/// carry the oldest export's session affinity, internal traffic policy and traffic
/// distribution, in both orders.
#[test]
fn the_oldest_exports_service_fields_are_the_imports() {
    use crate::desired::{GroupKey, materialize};
    use xcc_proto::mcs::EXPORTED_AT_ANNOTATION;
    let sticky = ServiceTraits {
        client_ip_timeout: Some(600),
        internal_local: true,
        traffic_distribution: Some("PreferClose".into()),
    };
    let ports = || json!([{"name": "http", "port": 80, "targetPort": 8080}]);
    let svc = binder_service("10.96.0.10", None);
    let key = GroupKey {
        namespace: NS.into(),
        fqdn: "api.shop.svc.clusterset.local".into(),
    };
    for (east_at, west_at, sticky_wins) in [
        ("2026-11-29T07:00:00Z", "2026-11-29T07:00:01Z", true),
        ("2026-11-29T07:00:01Z", "2026-11-29T07:00:00Z", false),
    ] {
        let mut annotations = sticky.annotations();
        annotations.insert(EXPORTED_AT_ANNOTATION.into(), east_at.into());
        let east = record("e", "1", "east", ports(), json!(annotations));
        let west = record(
            "w",
            "2",
            "west",
            ports(),
            json!({EXPORTED_AT_ANNOTATION: west_at}),
        );
        let (imports, _) = desired(&[&west, &east], &services(&svc), "xcc-system");
        let spec = serde_json::to_value(&imports[0].spec).unwrap();
        let service = materialize(&key, &[&west, &east]).unwrap().service;
        let service = serde_json::to_value(service.spec.unwrap()).unwrap();
        if sticky_wins {
            assert_eq!(spec["sessionAffinity"], "ClientIP");
            assert_eq!(
                spec["sessionAffinityConfig"],
                json!({"clientIP": {"timeoutSeconds": 600}})
            );
            assert_eq!(spec["internalTrafficPolicy"], "Local");
            assert_eq!(spec["trafficDistribution"], "PreferClose");
            assert_eq!(service["sessionAffinity"], "ClientIP");
            assert_eq!(
                service["sessionAffinityConfig"],
                json!({"clientIP": {"timeoutSeconds": 600}})
            );
        } else {
            for field in [
                "sessionAffinity",
                "sessionAffinityConfig",
                "internalTrafficPolicy",
                "trafficDistribution",
            ] {
                assert_eq!(spec.get(field), None, "{field}");
            }
            assert_eq!(service.get("sessionAffinity"), None);
        }
    }
}

/// The ServiceImport carries the exported labels and annotations, the oldest
/// export's value of a key holding, in both orders; xcc's own keys stay xcc's.
#[test]
fn exported_labels_and_annotations_are_the_imports_the_oldest_value_holding() {
    use xcc_proto::mcs::{
        EXPORTED_ANNOTATIONS_ANNOTATION, EXPORTED_AT_ANNOTATION, EXPORTED_LABELS_ANNOTATION,
    };
    let ports = || json!([{"name": "http", "port": 80}]);
    let svc = binder_service("10.96.0.10", None);
    for (east_at, west_at, team) in [
        ("2026-11-29T07:00:00Z", "2026-11-29T07:00:01Z", "pay"),
        ("2026-11-29T07:00:01Z", "2026-11-29T07:00:00Z", "ops"),
    ] {
        let east = record(
            "e",
            "1",
            "east",
            ports(),
            json!({EXPORTED_AT_ANNOTATION: east_at,
                   EXPORTED_LABELS_ANNOTATION: r#"{"team":"pay","tier":"gold"}"#,
                   EXPORTED_ANNOTATIONS_ANNOTATION: r#"{"example.com/doc":"runbook"}"#}),
        );
        let west = record(
            "w",
            "2",
            "west",
            ports(),
            json!({EXPORTED_AT_ANNOTATION: west_at,
                   EXPORTED_LABELS_ANNOTATION: r#"{"team":"ops","app.kubernetes.io/managed-by":"me"}"#}),
        );
        let (imports, _) = desired(&[&east, &west], &services(&svc), "xcc-system");
        assert_eq!(
            imports[0].metadata.labels,
            Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), BINDER_MANAGER.to_string()),
                ("team".to_string(), team.to_string()),
                ("tier".to_string(), "gold".to_string()),
            ]))
        );
        assert_eq!(
            imports[0].metadata.annotations.as_ref().unwrap()["example.com/doc"],
            "runbook"
        );
    }
}

/// This cluster's own MCS export (the publisher's record, in the service's
/// namespace) counts beside the imports: the exporting cluster has the ServiceImport, and its
/// endpoints are among the slices; a label export (no export time) does not count.
#[test]
fn this_clusters_own_export_is_part_of_the_import() {
    use xcc_proto::mcs::EXPORTED_AT_ANNOTATION;
    use xcc_proto::names::EXPORT_LABEL;
    let ports = || json!([{"name": "http", "port": 80, "targetPort": 8080}]);
    let own = |annotations: Value| -> ServiceRecord {
        serde_json::from_value(json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
            "metadata": {"name": "api.shop.svc.clusterset.local", "namespace": "shop",
                         "annotations": annotations,
                         "labels": {EXPORT_LABEL: "", MANAGED_BY_LABEL: "xcc-publisher"}},
            "spec": {"fqdn": "api.shop.svc.clusterset.local",
                     "endpoints": [{"address": "10.3.0.1", "port": 8080}],
                     "ports": ports(),
                     "origin": {"cluster": "here", "namespace": "shop", "name": "api"}},
        }))
        .unwrap()
    };
    let mcs_export = own(json!({EXPORTED_AT_ANNOTATION: "2026-11-29T07:00:00Z"}));
    let label_export = own(json!({}));
    assert!(is_local_mcs_export(&mcs_export));
    assert!(!is_local_mcs_export(&label_export));
    let east = record("a", "1", "east", ports(), json!({}));
    assert!(!is_local_mcs_export(&east));
    let svc = binder_service("10.96.0.10", None);
    // Exported here and imported from east: both clusters, the binder Service's IP.
    let (imports, _) = desired(&[&east, &mcs_export], &services(&svc), "xcc-system");
    let value = serde_json::to_value(&imports[0]).unwrap();
    assert_eq!(value["spec"]["ips"], json!(["10.96.0.10"]));
    assert_eq!(
        value["status"],
        json!({"clusters": [{"cluster": "east"}, {"cluster": "here"}]})
    );
    let slices = import_slices(&[&east, &mcs_export], "xcc-system");
    let mut by_cluster: Vec<(String, String)> = slices[&("shop".to_string(), "api".to_string())]
        .iter()
        .map(|s| {
            (
                s.metadata.labels.as_ref().unwrap()[MCS_SOURCE_CLUSTER_LABEL].clone(),
                s.endpoints[0].addresses[0].clone(),
            )
        })
        .collect();
    by_cluster.sort();
    assert_eq!(
        by_cluster,
        [
            ("east".to_string(), "10.0.0.1".to_string()),
            ("here".to_string(), "10.3.0.1".to_string())
        ]
    );
    // Exported here only: the ServiceImport, with the IP of the binder's Service (in the
    // binder's namespace), which the binder makes for this cluster's own export too.
    let (imports, _) = desired(&[&mcs_export], &services(&svc), NS);
    assert_eq!(imports[0].spec.ips, Some(vec!["10.96.0.10".to_string()]));
    assert_eq!(
        imports[0].status.as_ref().unwrap().clusters,
        Some(vec![ClusterStatus {
            cluster: "here".into()
        }])
    );
}
