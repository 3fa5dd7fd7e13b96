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
fn export_ports_come_from_spec_ports_else_the_annotation() {
    let r = record(
        "api.shop.svc.clusterset.local",
        Some("east"),
        json!([{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]),
    );
    assert_eq!(
        export_ports(&r).iter().map(shown_port).collect::<Vec<_>>(),
        ["dns:53/UDP", "http:80/TCP"]
    );
    let mut bare = record("a.b", None, serde_json::Value::Null);
    assert!(export_ports(&bare).is_empty());
    bare.metadata.annotations = Some(BTreeMap::from([(
        SERVICE_PORT_ANNOTATION.to_string(),
        "8443".to_string(),
    )]));
    assert_eq!(
        export_ports(&bare)
            .iter()
            .map(shown_port)
            .collect::<Vec<_>>(),
        ["8443/TCP"]
    );
}

/// `record` exported at `at` (RFC 3339).
fn at(mut r: ServiceRecord, at: &str) -> ServiceRecord {
    r.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(EXPORTED_AT_ANNOTATION.to_string(), at.to_string());
    r
}

const T1: &str = "2026-11-29T07:00:00Z";
const T2: &str = "2026-11-29T07:00:05Z";

#[test]
fn ports_of_other_exports_join_the_union_and_only_a_port_defined_otherwise_conflicts() {
    let fqdn = "api.shop.svc.clusterset.local";
    let own = at(
        record(fqdn, Some("east"), json!([{"name": "http", "port": 80}])),
        T1,
    );
    let same = record(fqdn, Some("west"), json!([{"name": "http", "port": 80}]));
    let more = record(
        fqdn,
        Some("west"),
        json!([{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}]),
    );
    let other_name = record(
        "web.shop.svc.clusterset.local",
        Some("north"),
        json!([{"name": "http", "port": 1}]),
    );
    let own_cluster = record(fqdn, Some("east"), json!([{"name": "http", "port": 9}]));
    let no_ports = record(fqdn, Some("south"), serde_json::Value::Null);
    // More ports elsewhere is no conflict: the service has their union.
    for others in [
        vec![&same],
        vec![&more, &other_name, &own_cluster, &no_ports],
    ] {
        assert_eq!(conflicts(&own, Some("east"), others), Conflicts::default());
    }
    // `http` with another number is, wherever the export is seen from.
    let renumbered = record(
        "API.shop.svc.clusterset.local.",
        Some("west"),
        json!([{"name": "http", "port": 8080}]),
    );
    let found = conflicts(&own, Some("east"), [&renumbered, &more]);
    assert_eq!(
        found,
        Conflicts {
            winner: "east (exported 2026-11-29T07:00:00Z)".into(),
            winner_type: "",
            types: vec![],
            ports: vec!["west's http:8080/TCP (east's http:80/TCP kept)".into()],
            traits: vec![],
        }
    );
    let c = conditions(State::Published(&own), &found);
    assert_eq!(table(&c)[2], ("Conflict", "True", "PortConflict"));
    assert_eq!(
        c[2].message,
        "the exports of this name define a port differently; the service has the union of their ports, the oldest export's definition winning (the oldest export is east (exported 2026-11-29T07:00:00Z)): west's http:8080/TCP (east's http:80/TCP kept)"
    );
}

/// KEP-1645: the oldest export wins, and each exporter says so the same way — tested with the
/// two exports made in both orders, seen from both clusters.
#[test]
fn the_oldest_export_wins_in_both_orders_and_both_clusters_say_the_same() {
    let fqdn = "api.shop.svc.clusterset.local";
    let ports = |n: i32| json!([{"name": "http", "port": n}]);
    for (east_at, west_at, winner) in [
        (T1, T2, "east (exported 2026-11-29T07:00:00Z)"),
        (T2, T1, "west (exported 2026-11-29T07:00:00Z)"),
        // The same second: the cluster name decides.
        (T1, T1, "east (exported 2026-11-29T07:00:00Z)"),
    ] {
        let east = at(record(fqdn, Some("east"), ports(80)), east_at);
        let west = at(record(fqdn, Some("west"), ports(8080)), west_at);
        let at_east = conflicts(&east, Some("east"), [&west]);
        let at_west = conflicts(&west, Some("west"), [&east]);
        assert_eq!(at_east, at_west, "east {east_at}, west {west_at}");
        assert_eq!(at_east.winner, winner);
        let (kept, lost) = if winner.starts_with("east") {
            ("east's http:80/TCP", "west's http:8080/TCP")
        } else {
            ("west's http:8080/TCP", "east's http:80/TCP")
        };
        assert_eq!(at_east.ports, [format!("{lost} ({kept} kept)")]);
        assert_eq!(
            conditions(State::Published(&east), &at_east)[2],
            conditions(State::Published(&west), &at_west)[2],
            "both ServiceExports carry the same Conflict"
        );
    }
    // A label export (no time) loses to the MCS export, whatever the cluster names.
    let east = record(fqdn, Some("east"), ports(80));
    let west = at(record(fqdn, Some("west"), ports(8080)), T2);
    assert_eq!(
        conflicts(&east, Some("east"), [&west]).winner,
        "west (exported 2026-11-29T07:00:05Z)"
    );
}

#[test]
fn stamping_takes_the_service_exports_creation_time_and_the_services_traits() {
    let own = record("a.b", Some("east"), json!([{"port": 80}]));
    let mut live = export(false);
    live.metadata.creation_timestamp = Some(Time(Timestamp::new(1_700_000_000, 250).unwrap()));
    let spec: ServiceSpec = serde_json::from_value(json!({
        "sessionAffinity": "ClientIP", "internalTrafficPolicy": "Local",
        "trafficDistribution": "PreferClose"}))
    .unwrap();
    let mut desired = Desired::Publish(Box::new(own.clone()));
    stamp_export(&mut desired, Some(&live), Some(&spec));
    let record = desired.record().unwrap();
    assert_eq!(exported_at_of(record), Some("2023-11-14T22:13:20Z"));
    assert_eq!(
        ServiceTraits::of_record(record),
        ServiceTraits {
            client_ip_timeout: Some(10_800),
            internal_local: true,
            traffic_distribution: Some("PreferClose".into()),
        }
    );
    // No ServiceExport, or one being deleted: no time.
    let mut deleting = export(true);
    deleting.metadata.creation_timestamp = live.metadata.creation_timestamp.clone();
    for export in [None, Some(&deleting)] {
        let mut desired = Desired::Publish(Box::new(own.clone()));
        stamp_export(&mut desired, export, Some(&spec));
        assert_eq!(exported_at_of(desired.record().unwrap()), None);
        assert_eq!(
            ServiceTraits::of_record(desired.record().unwrap()),
            ServiceTraits::default()
        );
    }
}

fn exported_at_of(r: &ServiceRecord) -> Option<&str> {
    r.metadata
        .annotations
        .as_ref()?
        .get(EXPORTED_AT_ANNOTATION)
        .map(String::as_str)
}

fn headless(mut r: ServiceRecord) -> ServiceRecord {
    r.metadata.annotations = Some(BTreeMap::from([(
        xcc_proto::mcs::HEADLESS_ANNOTATION.to_string(),
        xcc_proto::mcs::HEADLESS_TRUE.to_string(),
    )]));
    r
}

#[test]
fn exports_of_another_type_than_the_oldest_conflict_before_ports() {
    let fqdn = "api.shop.svc.clusterset.local";
    let ports = || json!([{"name": "http", "port": 80}]);
    let own = at(record(fqdn, Some("east"), ports()), T1);
    let west_headless = at(headless(record(fqdn, Some("west"), ports())), T2);
    let north_ip = at(
        record(fqdn, Some("north"), json!([{"name": "http", "port": 81}])),
        T2,
    );
    let own_headless_elsewhere = headless(record(fqdn, Some("east"), ports()));
    let found = conflicts(
        &own,
        Some("east"),
        [&west_headless, &north_ip, &own_headless_elsewhere],
    );
    assert_eq!(
        found,
        Conflicts {
            winner: "east (exported 2026-11-29T07:00:00Z)".into(),
            winner_type: "ClusterSetIP",
            types: vec!["west (Headless)".to_string()],
            ports: vec!["north's http:81/TCP (east's http:80/TCP kept)".to_string()],
            traits: vec![],
        }
    );
    let c = conditions(State::Published(&own), &found);
    assert_eq!(table(&c)[2], ("Conflict", "True", "TypeConflict"));
    assert_eq!(
        c[2].message,
        "the exports of this name differ in type; the oldest export, east (exported 2026-11-29T07:00:00Z), wins: every cluster serves it as ClusterSetIP and leaves out the endpoints of west (Headless)"
    );
    // Seen from the headless export, which is younger: the same verdict, its own endpoints out.
    let found = conflicts(&west_headless, Some("west"), [&own]);
    assert_eq!(found.types, ["west (Headless)"]);
    assert_eq!(found.winner_type, "ClusterSetIP");
    // When the headless export is the older, the cluster IP export is left out.
    let own = at(record(fqdn, Some("east"), ports()), T2);
    let west_headless = at(headless(record(fqdn, Some("west"), ports())), T1);
    let found = conflicts(&own, Some("east"), [&west_headless]);
    assert_eq!(found.types, ["east (ClusterSetIP)"]);
    assert!(found.ports.is_empty());
    assert_eq!(
        conditions(State::Published(&own), &found)[2].message,
        "the exports of this name differ in type; the oldest export, west (exported 2026-11-29T07:00:00Z), wins: every cluster serves it as Headless and leaves out the endpoints of east (ClusterSetIP)"
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
    // Beside a ServiceExport, the label decided: exported, and the message says how.
    let by_label = conditions(State::ByLabel(&own), &Conflicts::default());
    assert_eq!(table(&by_label), table(&published));
    assert!(
        by_label[1].message.starts_with(
            "exported as ServiceRecord api.shop.svc.clusterset.local by the Service's \
             connectivity.tanzu.vmware.com/export label, which decides: "
        ) && by_label[1].message.ends_with(
            "remove the label to export the Service's ready pods with this ServiceExport"
        ),
        "{}",
        by_label[1].message
    );
    let conflicted = conditions(
        State::Published(&own),
        &Conflicts {
            winner: "west (exported 2026-11-29T07:00:00Z)".into(),
            winner_type: "",
            types: vec![],
            ports: vec!["east's 80/TCP (west's 8080/TCP kept)".to_string()],
            traits: vec![],
        },
    );
    assert_eq!(table(&conflicted)[2], ("Conflict", "True", "PortConflict"));
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
        winner: "west (exported 2026-11-29T07:00:00Z)".into(),
        winner_type: "Headless",
        types: vec!["east (ClusterSetIP)".to_string()],
        ports: vec![],
        traits: vec![],
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

/// KEP-1645 / issue 26 point 3: the Service fields the ServiceImport carries are the oldest
/// export's; another value is a Conflict of that field's reason, in both orders.
#[test]
fn service_fields_set_otherwise_than_the_oldest_export_conflict() {
    let fqdn = "api.shop.svc.clusterset.local";
    let ports = || json!([{"name": "http", "port": 80}]);
    let with = |r: ServiceRecord, traits: &ServiceTraits| {
        let mut r = r;
        r.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(traits.annotations());
        r
    };
    let sticky = ServiceTraits {
        client_ip_timeout: Some(600),
        internal_local: true,
        traffic_distribution: Some("PreferClose".into()),
    };
    let plain = ServiceTraits::default();
    for (east_at, west_at, oldest) in [(T1, T2, "east"), (T2, T1, "west")] {
        let east = with(at(record(fqdn, Some("east"), ports()), east_at), &sticky);
        let west = with(at(record(fqdn, Some("west"), ports()), west_at), &plain);
        let found = conflicts(&east, Some("east"), [&west]);
        assert_eq!(found, conflicts(&west, Some("west"), [&east]));
        let shown: Vec<(&str, String)> = found.traits.clone();
        let want: Vec<(&str, String)> = if oldest == "east" {
            vec![
                (
                    "SessionAffinityConflict",
                    "west: None (east: ClientIP)".into(),
                ),
                (
                    "InternalTrafficPolicyConflict",
                    "west: Cluster (east: Local)".into(),
                ),
                (
                    "TrafficDistributionConflict",
                    "west: unset (east: PreferClose)".into(),
                ),
            ]
        } else {
            vec![
                (
                    "SessionAffinityConflict",
                    "east: ClientIP (west: None)".into(),
                ),
                (
                    "InternalTrafficPolicyConflict",
                    "east: Local (west: Cluster)".into(),
                ),
                (
                    "TrafficDistributionConflict",
                    "east: PreferClose (west: unset)".into(),
                ),
            ]
        };
        assert_eq!(shown, want);
        assert_eq!(
            table(&conditions(State::Published(&east), &found))[2],
            ("Conflict", "True", "SessionAffinityConflict")
        );
    }
    // Two ClientIP exports with other timeouts: the config conflicts, not the affinity.
    let short = ServiceTraits {
        client_ip_timeout: Some(60),
        ..sticky.clone()
    };
    let east = with(at(record(fqdn, Some("east"), ports()), T1), &sticky);
    let west = with(at(record(fqdn, Some("west"), ports()), T2), &short);
    let found = conflicts(&east, Some("east"), [&west]);
    assert_eq!(
        found.traits,
        [(
            "SessionAffinityConfigConflict",
            "west: timeoutSeconds 60 (east: timeoutSeconds 600)".to_string()
        )]
    );
    let same = with(at(record(fqdn, Some("west"), ports()), T2), &sticky);
    assert_eq!(
        conflicts(&east, Some("east"), [&same]),
        Conflicts::default()
    );
}

/// A ServiceExport's exported labels and annotations travel with its record
/// (only what a ServiceImport may carry); one key exported with two values is a conflict, the
/// oldest export's value holding.
#[test]
fn exported_labels_and_annotations_travel_and_disagreeing_values_conflict() {
    let own = record(
        "api.shop.svc.clusterset.local",
        Some("east"),
        json!([{"port": 80}]),
    );
    let mut live: ServiceExport = serde_json::from_value(json!({
        "metadata": {"name": "api", "namespace": "shop",
                     "creationTimestamp": "2026-11-29T07:00:00Z"},
        "spec": {"exportedLabels": {"team": "pay", "bad": "not a label value"},
                 "exportedAnnotations": {"example.com/doc": "see the runbook",
                                         "connectivity.tanzu.vmware.com/vip": "1.2.3.4"}},
    }))
    .unwrap();
    let mut desired = Desired::Publish(Box::new(own.clone()));
    stamp_export(&mut desired, Some(&live), None);
    let east = desired.record().unwrap().clone();
    let (labels, annotations) = xcc_proto::mcs::record_exported_metadata(&east);
    assert_eq!(
        labels,
        BTreeMap::from([("team".to_string(), "pay".to_string())])
    );
    assert_eq!(
        annotations,
        BTreeMap::from([("example.com/doc".to_string(), "see the runbook".to_string())])
    );
    // West exports `team: ops` a second later: a LabelsConflict, east's value holding.
    live.spec.exported_labels = Some(BTreeMap::from([("team".into(), "ops".into())]));
    live.spec.exported_annotations = None;
    live.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_795_935_601).unwrap()));
    let mut desired = Desired::Publish(Box::new(record(
        "api.shop.svc.clusterset.local",
        Some("west"),
        json!([{"port": 80}]),
    )));
    stamp_export(&mut desired, Some(&live), None);
    let west = desired.record().unwrap().clone();
    let found = conflicts(&east, Some("east"), [&west]);
    assert_eq!(found, conflicts(&west, Some("west"), [&east]));
    assert_eq!(
        found.traits,
        [(
            REASON_LABELS_CONFLICT,
            "west: team=ops (east: team=pay)".to_string()
        )]
    );
    assert_eq!(
        table(&conditions(State::Published(&east), &found))[2],
        ("Conflict", "True", "LabelsConflict")
    );
}
