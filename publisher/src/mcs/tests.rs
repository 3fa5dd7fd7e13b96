use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use xcc_proto::names::REMOTE_REGISTRY_LABEL;

use super::*;

fn record(fqdn: &str, cluster: Option<&str>, ports: serde_json::Value) -> ServiceRecord {
    serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": fqdn, "namespace": "xcc", "labels": {REMOTE_REGISTRY_LABEL: "via-registry"}},
        "spec": {"fqdn": fqdn, "endpoints": [], "ports": ports,
                 "origin": {"cluster": cluster, "namespace": "shop", "name": "api"}},
    }))
    .unwrap()
}

fn export(deleting: bool) -> ServiceExport {
    serde_json::from_value(json!({
        "metadata": {"name": "api", "namespace": "shop",
                     "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z")},
    }))
    .unwrap()
}

fn meta(labels: serde_json::Value) -> ObjectMeta {
    serde_json::from_value(json!({"name": "api", "namespace": "shop", "labels": labels})).unwrap()
}

#[test]
fn a_service_is_exported_by_the_label_or_a_live_service_export() {
    assert!(exported(&meta(json!({EXPORT_LABEL: ""})), None));
    assert!(exported(&meta(json!({})), Some(&export(false))));
    assert!(exported(
        &meta(json!({EXPORT_LABEL: ""})),
        Some(&export(true))
    ));
    assert!(!exported(&meta(json!({})), Some(&export(true))));
    assert!(!exported(&meta(json!({"other": ""})), None));
}

#[test]
fn port_sets_come_from_spec_ports_else_the_annotation() {
    let r = record(
        "api.shop.svc.clusterset.local",
        Some("east"),
        json!([{"name": "http", "port": 80}, {"port": 53, "protocol": "UDP"}]),
    );
    assert_eq!(
        port_set(&r).into_iter().collect::<Vec<_>>(),
        ["53/UDP", "http:80/TCP"]
    );
    let mut bare = record("a.b", None, serde_json::Value::Null);
    assert!(port_set(&bare).is_empty());
    bare.metadata.annotations = Some(BTreeMap::from([(
        SERVICE_PORT_ANNOTATION.to_string(),
        "8443".to_string(),
    )]));
    assert_eq!(
        port_set(&bare).into_iter().collect::<Vec<_>>(),
        ["8443/TCP"]
    );
}

#[test]
fn only_other_clusters_exports_of_the_same_name_with_other_ports_conflict() {
    let fqdn = "api.shop.svc.clusterset.local";
    let own = record(fqdn, Some("east"), json!([{"name": "http", "port": 80}]));
    let same = record(fqdn, Some("west"), json!([{"name": "http", "port": 80}]));
    let other_ports = record(
        "API.shop.svc.clusterset.local.",
        Some("west"),
        json!([{"port": 8080}]),
    );
    let other_name = record(
        "web.shop.svc.clusterset.local",
        Some("north"),
        json!([{"port": 1}]),
    );
    let own_cluster = record(fqdn, Some("east"), json!([{"port": 9}]));
    let no_ports = record(fqdn, Some("south"), serde_json::Value::Null);
    let mut via_registry = record(fqdn, None, json!([{"port": 7, "protocol": "UDP"}]));
    via_registry.spec.origin = None;
    let all = [
        &same,
        &other_ports,
        &other_name,
        &own_cluster,
        &no_ports,
        &via_registry,
    ];
    assert_eq!(
        conflicts(&own, Some("east"), all),
        Conflicts {
            types: vec![],
            ports: vec![
                "via-registry (7/UDP)".to_string(),
                "west (8080/TCP)".to_string()
            ],
        }
    );
    assert_eq!(conflicts(&own, Some("east"), [&same]), Conflicts::default());
}

fn headless(mut r: ServiceRecord) -> ServiceRecord {
    r.metadata.annotations = Some(BTreeMap::from([(
        xcc_proto::mcs::HEADLESS_ANNOTATION.to_string(),
        xcc_proto::mcs::HEADLESS_TRUE.to_string(),
    )]));
    r
}

#[test]
fn other_clusters_exports_of_the_other_type_conflict_before_ports() {
    let fqdn = "api.shop.svc.clusterset.local";
    let ports = || json!([{"name": "http", "port": 80}]);
    let own = record(fqdn, Some("east"), ports());
    let west_headless = headless(record(fqdn, Some("west"), ports()));
    let north_ip = record(fqdn, Some("north"), json!([{"port": 81}]));
    let own_headless_elsewhere = headless(record(fqdn, Some("east"), ports()));
    let found = conflicts(
        &own,
        Some("east"),
        [&west_headless, &north_ip, &own_headless_elsewhere],
    );
    assert_eq!(
        found,
        Conflicts {
            types: vec!["west (Headless)".to_string()],
            ports: vec!["north (81/TCP)".to_string()],
        }
    );
    let c = conditions(State::Published(&own), &found);
    assert_eq!(table(&c)[2], ("Conflict", "True", "TypeConflict"));
    assert_eq!(
        c[2].message,
        "exported here as ClusterSetIP, by west (Headless); importers serve one type and leave the other clusters' endpoints out"
    );
    // Seen from a headless export, the cluster IP export is the other type.
    let own = headless(record(fqdn, Some("east"), ports()));
    let west_ip = record(fqdn, Some("west"), ports());
    let found = conflicts(&own, Some("east"), [&west_ip, &west_headless]);
    assert_eq!(found.types, ["west (ClusterSetIP)"]);
    assert!(found.ports.is_empty());
    assert_eq!(
        conditions(State::Published(&own), &found)[2].message,
        "exported here as Headless, by west (ClusterSetIP); importers serve one type and leave the other clusters' endpoints out"
    );
}

fn table(w: &[Wanted; 3]) -> Vec<(&str, &str, &str)> {
    w.iter().map(|w| (w.type_, w.status, w.reason)).collect()
}

#[test]
fn conditions_follow_the_kep_reasons() {
    assert_eq!(
        table(&conditions(State::NoService, &Conflicts::default())),
        [
            ("Valid", "False", "NoService"),
            ("Ready", "False", "Pending"),
            ("Conflict", "False", "NoConflicts")
        ]
    );
    assert_eq!(
        table(&conditions(
            State::Skipped(&Skip::ExternalName),
            &Conflicts::default()
        )),
        [
            ("Valid", "False", "InvalidServiceType"),
            ("Ready", "False", "Pending"),
            ("Conflict", "False", "NoConflicts")
        ]
    );
    assert_eq!(
        table(&conditions(
            State::Skipped(&Skip::Headless),
            &Conflicts::default()
        ))[0],
        ("Valid", "False", "InvalidServiceType")
    );
    assert_eq!(
        table(&conditions(
            State::Skipped(&Skip::NoPorts),
            &Conflicts::default()
        ))[0],
        ("Valid", "False", "NoPorts")
    );
    assert_eq!(
        table(&conditions(
            State::RecordTaken("api.example"),
            &Conflicts::default()
        )),
        [
            ("Valid", "True", "Valid"),
            ("Ready", "False", "Failed"),
            ("Conflict", "False", "NoConflicts")
        ]
    );
    let own = record(
        "api.shop.svc.clusterset.local",
        Some("east"),
        json!([{"port": 80}]),
    );
    let published = conditions(State::Published(&own), &Conflicts::default());
    assert_eq!(
        table(&published),
        [
            ("Valid", "True", "Valid"),
            ("Ready", "True", "Exported"),
            ("Conflict", "False", "NoConflicts")
        ]
    );
    assert_eq!(
        published[1].message,
        "exported as ServiceRecord api.shop.svc.clusterset.local"
    );
    let conflicted = conditions(
        State::Published(&own),
        &Conflicts {
            types: vec![],
            ports: vec!["west (8080/TCP)".to_string()],
        },
    );
    assert_eq!(table(&conflicted)[2], ("Conflict", "True", "PortConflict"));
    assert_eq!(
        conflicted[2].message,
        "ports here (80/TCP) differ from west (8080/TCP); importers serve one port set and leave the other clusters' endpoints out"
    );
}

#[test]
fn merging_keeps_transition_times_while_the_status_holds() {
    let then = Time(Timestamp::from_second(1_700_000_000).unwrap());
    let now = Time(Timestamp::from_second(1_800_000_000).unwrap());
    let own = record("a.b", Some("east"), json!([{"port": 80}]));
    let first = merge(
        &[],
        &conditions(State::NoService, &Conflicts::default()),
        Some(1),
        &then,
    );
    assert!(first.iter().all(|c| c.last_transition_time == then));
    assert!(up_to_date(
        &first,
        &merge(
            &first,
            &conditions(State::NoService, &Conflicts::default()),
            Some(1),
            &now
        )
    ));

    let second = merge(
        &first,
        &conditions(State::Published(&own), &Conflicts::default()),
        Some(1),
        &now,
    );
    let times: Vec<_> = second
        .iter()
        .map(|c| (c.type_.as_str(), c.last_transition_time.clone()))
        .collect();
    // Valid and Ready turned True; Conflict stayed False.
    assert_eq!(
        times,
        [
            ("Valid", now.clone()),
            ("Ready", now.clone()),
            ("Conflict", then.clone())
        ]
    );
    assert!(!up_to_date(&first, &second));
    // A new generation is a change too.
    assert!(!up_to_date(
        &second,
        &merge(
            &second,
            &conditions(State::Published(&own), &Conflicts::default()),
            Some(2),
            &now
        )
    ));
}
