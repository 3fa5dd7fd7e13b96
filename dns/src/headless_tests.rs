use serde_json::json;
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::names::FQDN_ANNOTATION;

use super::*;
use crate::index::{DnsIndex, FeedSource};
use crate::zone::fqdn_name;

fn slice(name: &str, labels: serde_json::Value, endpoints: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "xcc", "labels": labels},
        "addressType": "IPv4",
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn binders(cluster: &str) -> serde_json::Value {
    json!({ENDPOINTSLICE_MANAGED_BY_LABEL: BINDER_MANAGER,
           ENDPOINTSLICE_SERVICE_NAME_LABEL: "db-svc",
           MCS_SOURCE_CLUSTER_LABEL: cluster})
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The binder's headless Service for origin `shop/db`.
fn headless_service() -> ServiceInfo {
    ServiceInfo {
        key: ServiceKey::new("xcc", "db-svc"),
        annotations: [
            (FQDN_ANNOTATION, "db.shop.svc.clusterset.local"),
            (ORIGIN_NAMESPACE_ANNOTATION, "shop"),
            (ORIGIN_NAME_ANNOTATION, "db"),
        ]
        .into_iter()
        .collect(),
        cluster_ips: Vec::new(),
        ports: Vec::new(),
    }
}

#[test]
fn only_the_binders_slices_count_with_their_ready_endpoints_and_valid_hostnames() {
    let (key, info) = slice_info(&slice(
        "db-east",
        binders("east"),
        json!([
            {"addresses": ["10.0.0.1"], "hostname": "db-0"},
            {"addresses": ["10.0.0.2"], "hostname": "Bad_Name", "conditions": {"ready": true}},
            {"addresses": ["10.0.0.3"], "hostname": "db-2", "conditions": {"ready": false}},
            {"addresses": ["not-an-ip"]},
        ]),
    ))
    .unwrap();
    assert_eq!(key, ("xcc".to_string(), "db-east".to_string()));
    assert_eq!(
        info,
        SliceInfo {
            service: "db-svc".into(),
            cluster: Some("east".into()),
            endpoints: vec![
                (ip("10.0.0.1"), Some("db-0".into())),
                (ip("10.0.0.2"), None)
            ],
        }
    );
    let mut other = binders("east");
    other[ENDPOINTSLICE_MANAGED_BY_LABEL] = json!("endpointslice-controller.k8s.io");
    assert_eq!(slice_info(&slice("x", other, json!([]))), None);
    let mut bad_cluster = binders("east");
    bad_cluster[MCS_SOURCE_CLUSTER_LABEL] = json!("East_1");
    assert_eq!(
        slice_info(&slice("x", bad_cluster, json!([])))
            .unwrap()
            .1
            .cluster,
        None
    );
}

#[test]
fn a_headless_service_answers_with_its_endpoints_and_hostnames_under_its_mcs_name() {
    let mut index = DnsIndex::new(
        vec!["clusterset.local".into()],
        [FeedSource::Services, FeedSource::EndpointSlices],
    );
    index.reset_services([headless_service()]);
    index.reset_slices(
        [
            slice(
                "db-east",
                binders("east"),
                json!([{"addresses": ["10.0.0.1"], "hostname": "db-0"},
                       {"addresses": ["10.0.0.2"]}]),
            ),
            slice(
                "db-west",
                binders("west"),
                json!([{"addresses": ["10.1.0.1"], "hostname": "db-0"}]),
            ),
        ]
        .iter()
        .filter_map(slice_info),
    );
    index.publish(1);
    let snap = index.snapshot();
    assert!(snap.ready);
    let a = |name: &str| -> Option<Vec<String>> {
        let n = fqdn_name(name).unwrap();
        let node = snap.zones.find_zone(&n)?.node(&n)?;
        Some(node.v4.iter().map(ToString::to_string).collect())
    };
    assert_eq!(
        a("db.shop.svc.clusterset.local"),
        Some(vec![
            "10.0.0.1".into(),
            "10.0.0.2".into(),
            "10.1.0.1".into()
        ])
    );
    assert_eq!(
        a("db-0.east.db.shop.svc.clusterset.local"),
        Some(vec!["10.0.0.1".into()])
    );
    assert_eq!(
        a("db-0.west.db.shop.svc.clusterset.local"),
        Some(vec!["10.1.0.1".into()])
    );
    // The cluster level is an empty non-terminal, not a name of its own.
    assert_eq!(a("east.db.shop.svc.clusterset.local"), Some(vec![]));
    assert!(
        snap.zones.rejected().is_empty(),
        "{:?}",
        snap.zones.rejected()
    );

    // The last ready endpoint gone: the names go with it.
    index.delete_slice(&("xcc".into(), "db-west".into()));
    index.delete_slice(&("xcc".into(), "db-east".into()));
    index.publish(2);
    let snap = index.snapshot();
    let n = fqdn_name("db-0.east.db.shop.svc.clusterset.local").unwrap();
    assert!(snap.zones.find_zone(&n).unwrap().node(&n).is_none());
}

#[test]
fn services_with_cluster_ips_and_services_without_origin_are_not_given_hostnames() {
    let mut with_ip = headless_service();
    with_ip.cluster_ips = vec![ip("10.96.0.1")];
    let services = BTreeMap::from([(with_ip.key.clone(), with_ip)]);
    let slices: BTreeMap<SliceKey, SliceInfo> = [slice(
        "db-east",
        binders("east"),
        json!([{"addresses": ["10.0.0.1"], "hostname": "db-0"}]),
    )]
    .iter()
    .filter_map(slice_info)
    .collect();
    assert_eq!(derive(&services, &slices), (BTreeSet::new(), Vec::new()));

    let mut no_origin = headless_service();
    no_origin.annotations.origin_name = None;
    let services = BTreeMap::from([(no_origin.key.clone(), no_origin.clone())]);
    let (replaced, derived) = derive(&services, &slices);
    assert_eq!(replaced, BTreeSet::from([no_origin.key.clone()]));
    assert_eq!(
        derived,
        [ServiceInfo {
            cluster_ips: vec![ip("10.0.0.1")],
            ..no_origin
        }]
    );
}
