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
    let labelled = meta(json!({EXPORT_LABEL: ""}));
    assert_eq!(exported(&labelled, None), ExportedBy::Label);
    // The label decides the endpoints even beside a ServiceExport.
    assert_eq!(exported(&labelled, Some(&export(false))), ExportedBy::Label);
    assert_eq!(exported(&labelled, Some(&export(true))), ExportedBy::Label);
    assert_eq!(
        exported(&meta(json!({})), Some(&export(false))),
        ExportedBy::ServiceExport
    );
    assert_eq!(
        exported(&meta(json!({})), Some(&export(true))),
        ExportedBy::Nothing
    );
    assert_eq!(
        exported(&meta(json!({"other": ""})), None),
        ExportedBy::Nothing
    );
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
    w.iter()
        .map(|w| (w.type_, w.status, w.reason.as_str()))
        .collect()
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

/// `record` as the registry leaves it after deciding its announcement: `Announced` with
/// `status`, `reason` and `message`.
fn announced(mut r: ServiceRecord, status: &str, reason: &str, message: &str) -> ServiceRecord {
    r.status = Some(
        serde_json::from_value(json!({"conditions": [
            {"type": "Announced", "status": status, "reason": reason, "message": message,
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]}))
        .unwrap(),
    );
    r
}

#[test]
fn a_refused_announcement_is_read_from_the_records_announced_condition() {
    let own = record("api.shop.svc.clusterset.local", Some("east"), json!([]));
    assert_eq!(refusal(&own), None, "never refused: no condition");
    let accepted = announced(own.clone(), "True", "Accepted", "no longer stands");
    assert_eq!(refusal(&accepted), None);
    let owner = refusal(&announced(own.clone(), "False", "Owner", "owned by c2")).unwrap();
    assert_eq!(
        (
            owner.check.as_str(),
            owner.message.as_str(),
            owner.owner_conflict()
        ),
        ("Owner", "owned by c2", true)
    );
    assert_eq!(owner.ready_reason(), "RefusedOwner");
    let collision = refusal(&announced(own.clone(), "False", "Collision", "")).unwrap();
    assert!(collision.owner_conflict());
    assert_eq!(collision.ready_reason(), "RefusedCollision");
    let policy = refusal(&announced(own.clone(), "False", "Announce", "forbid")).unwrap();
    assert!(!policy.owner_conflict());
    assert_eq!(policy.ready_reason(), "RefusedAnnounce");
    // The registry's own fallback reason, and reasons that are not one: `Refused` alone.
    for reason in ["Refused", "", "9lives", "--"] {
        let r = refusal(&announced(own.clone(), "False", reason, "")).unwrap();
        assert_eq!(r.ready_reason(), "Refused", "{reason:?}");
        assert!(!r.owner_conflict());
    }
    // Hostile text: only ASCII letters and digits of the reason, at most 64; the message
    // bounded to what a condition holds.
    let hostile = refusal(&announced(
        own.clone(),
        "False",
        &format!("Ow_ner:{}", "x".repeat(5000)),
        &"é".repeat(40_000),
    ))
    .unwrap();
    assert_eq!(hostile.check, format!("Owner{}", "x".repeat(59)));
    assert!(!hostile.owner_conflict());
    assert!(hostile.message.len() <= 32_768 && hostile.message.ends_with('…'));
    let c = conditions(State::Refused(&own, &hostile), &Conflicts::default());
    assert!(c.iter().all(|c| c.message.len() <= 32_768));
}

#[test]
fn a_refused_export_is_not_ready_and_an_owned_name_is_a_conflict() {
    let fqdn = "api.shop.svc.clusterset.local";
    let own = record(fqdn, Some("east"), json!([{"port": 80}]));
    let message = "refused by root: api.shop.svc.clusterset.local is owned by west/shop/api; the first owner keeps a name (check owner)";
    let owner = refusal(&announced(own.clone(), "False", "Owner", message)).unwrap();
    let c = conditions(State::Refused(&own, &owner), &Conflicts::default());
    assert_eq!(
        table(&c),
        [
            ("Valid", "True", "Valid"),
            ("Ready", "False", "RefusedOwner"),
            ("Conflict", "True", "OwnerConflict")
        ]
    );
    assert_eq!(
        c[1].message,
        format!(
            "ServiceRecord {fqdn} is written, but the hierarchy refuses to announce it: {message}"
        )
    );
    assert_eq!(
        c[2].message,
        format!(
            "another service owns this name in the hierarchy, so this export is not announced: {message}"
        )
    );
    // The owner conflict comes before the type and port conflicts the imports show.
    let seen = Conflicts {
        types: vec!["west (Headless)".to_string()],
        ports: vec!["west (8080/TCP)".to_string()],
    };
    assert_eq!(
        table(&conditions(State::Refused(&own, &owner), &seen))[2],
        ("Conflict", "True", "OwnerConflict")
    );
    // Refused by policy: not ready, and the conflicts are what the imports show.
    let policy = refusal(&announced(
        own.clone(),
        "False",
        "Announce",
        "refused by root: east may not announce api.shop.svc.clusterset.local: forbidden by no-shop (check announce; Cedar policies: no-shop)",
    ))
    .unwrap();
    let c = conditions(State::Refused(&own, &policy), &Conflicts::default());
    assert_eq!(
        table(&c),
        [
            ("Valid", "True", "Valid"),
            ("Ready", "False", "RefusedAnnounce"),
            ("Conflict", "False", "NoConflicts")
        ]
    );
    assert!(
        c[1].message
            .ends_with("(check announce; Cedar policies: no-shop)")
    );
    assert_eq!(
        table(&conditions(State::Refused(&own, &policy), &seen))[2],
        ("Conflict", "True", "TypeConflict")
    );
    // The refusal gone, the export is Ready again.
    assert_eq!(
        table(&conditions(State::Published(&own), &Conflicts::default()))[1],
        ("Ready", "True", "Exported")
    );
}

#[test]
fn a_refusal_and_its_end_write_once_each() {
    let then = Time(Timestamp::from_second(1_700_000_000).unwrap());
    let later = Time(Timestamp::from_second(1_750_000_000).unwrap());
    let now = Time(Timestamp::from_second(1_800_000_000).unwrap());
    let own = record("a.b", Some("east"), json!([{"port": 80}]));
    let owner = refusal(&announced(own.clone(), "False", "Owner", "owned")).unwrap();
    let exported = merge(
        &[],
        &conditions(State::Published(&own), &Conflicts::default()),
        Some(1),
        &then,
    );
    let refused = merge(
        &exported,
        &conditions(State::Refused(&own, &owner), &Conflicts::default()),
        Some(1),
        &later,
    );
    assert!(!up_to_date(&exported, &refused));
    let times: Vec<_> = refused
        .iter()
        .map(|c| (c.type_.as_str(), c.last_transition_time.clone()))
        .collect();
    assert_eq!(
        times,
        [
            ("Valid", then.clone()),
            ("Ready", later.clone()),
            ("Conflict", later.clone())
        ]
    );
    // The same refusal again: nothing to write.
    assert!(up_to_date(
        &refused,
        &merge(
            &refused,
            &conditions(State::Refused(&own, &owner), &Conflicts::default()),
            Some(1),
            &now
        )
    ));
    // Cleared: Ready and Conflict turn back, once.
    let cleared = merge(
        &refused,
        &conditions(State::Published(&own), &Conflicts::default()),
        Some(1),
        &now,
    );
    assert!(!up_to_date(&refused, &cleared));
    assert_eq!(
        cleared
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
            .collect::<Vec<_>>(),
        [
            ("Valid", "True", "Valid"),
            ("Ready", "True", "Exported"),
            ("Conflict", "False", "NoConflicts")
        ]
    );
}
