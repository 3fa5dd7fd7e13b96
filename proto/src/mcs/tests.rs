use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};

use super::*;

/// ServiceExport's shape as a derived custom resource, for its schema only (the real type is
/// written by hand; see [`ServiceExport`]).
#[derive(CustomResource, Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ServiceExport",
    root = "ServiceExportShape",
    namespaced,
    status = "ServiceExportStatus"
)]
struct ShapeSpec {
    #[serde(flatten)]
    spec: ServiceExportSpec,
}

/// The upstream CRDs as shipped in `deploy/mcs/crds/`.
const UPSTREAM: [(&str, &str); 3] = [
    (
        "multicluster.x-k8s.io_serviceexports.yaml",
        include_str!("../../../deploy/mcs/crds/multicluster.x-k8s.io_serviceexports.yaml"),
    ),
    (
        "multicluster.x-k8s.io_serviceimports.yaml",
        include_str!("../../../deploy/mcs/crds/multicluster.x-k8s.io_serviceimports.yaml"),
    ),
    (
        "about.k8s.io_clusterproperties.yaml",
        include_str!("../../../deploy/mcs/crds/about.k8s.io_clusterproperties.yaml"),
    ),
];

fn upstream(kind: &str) -> CustomResourceDefinition {
    UPSTREAM
        .iter()
        .map(|(_, text)| yaml_serde::from_str::<CustomResourceDefinition>(text).unwrap())
        .find(|crd| crd.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no upstream CRD of kind {kind}"))
}

/// The OpenAPI schema of `version` in `crd`.
fn schema(crd: &CustomResourceDefinition, version: &str) -> Value {
    let v = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == version)
        .unwrap_or_else(|| panic!("{} serves no {version}", crd.spec.names.kind));
    serde_json::to_value(
        v.schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

/// Every property path under `schema` (`.spec.ports[].port`) with its type and, for objects,
/// their required properties. The object root's `apiVersion`, `kind` and `metadata` are left
/// out (the API server owns them).
fn fields(schema: &Value) -> BTreeMap<String, (Option<String>, BTreeSet<String>)> {
    fn walk(
        schema: &Value,
        path: String,
        out: &mut BTreeMap<String, (Option<String>, BTreeSet<String>)>,
    ) {
        let required: BTreeSet<String> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str().map(str::to_string))
            .collect();
        let type_ = schema["type"].as_str().map(str::to_string);
        if !path.is_empty() {
            out.insert(path.clone(), (type_, required));
        }
        if let Some(props) = schema["properties"].as_object() {
            for (name, sub) in props {
                if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
                    continue;
                }
                walk(sub, format!("{path}.{name}"), out);
            }
        }
        if schema["items"].is_object() {
            walk(&schema["items"], format!("{path}[]"), out);
        }
    }
    let mut out = BTreeMap::new();
    walk(schema, String::new(), &mut out);
    out
}

/// Differences between our type's schema and the upstream one: fields we have that upstream
/// lacks or types differently, upstream fields neither modelled nor in `not_modelled`, and
/// objects whose required fields differ.
fn drift(ours: &Value, theirs: &Value, not_modelled: &[&str]) -> Vec<String> {
    let ours = fields(ours);
    let theirs = fields(theirs);
    let mut out = Vec::new();
    for (path, (type_, required)) in &ours {
        match theirs.get(path) {
            None => out.push(format!("{path}: not in the upstream schema")),
            Some((t, _)) if t != type_ => {
                out.push(format!("{path}: type {type_:?} here, {t:?} upstream"))
            }
            Some((_, r)) => {
                // Upstream required fields must be required here too, unless left out.
                let modelled: BTreeSet<String> = r
                    .iter()
                    .filter(|f| !not_modelled.contains(&format!("{path}.{f}").as_str()))
                    .cloned()
                    .collect();
                if &modelled != required {
                    out.push(format!(
                        "{path}: required {required:?} here, {modelled:?} upstream"
                    ));
                }
            }
        }
    }
    for path in theirs.keys() {
        let left_out = not_modelled.iter().any(|n| {
            path == n || path.starts_with(&format!("{n}.")) || path.starts_with(&format!("{n}[]"))
        });
        if !ours.contains_key(path) && !left_out {
            out.push(format!("{path}: upstream field not modelled"));
        }
    }
    for n in not_modelled {
        if !theirs.contains_key(*n) {
            out.push(format!("{n}: listed as not modelled but not upstream"));
        }
    }
    out
}

fn not_modelled(kind: &str) -> &'static [&'static str] {
    NOT_MODELLED.iter().find(|(k, _)| *k == kind).unwrap().1
}

#[test]
fn types_match_the_upstream_schemas() {
    for (kind, ours) in [
        ("ServiceExport", ServiceExportShape::crd()),
        ("ServiceImport", ServiceImport::crd()),
        ("ClusterProperty", ClusterProperty::crd()),
    ] {
        let theirs = upstream(kind);
        assert_eq!(ours.spec.group, theirs.spec.group, "{kind}");
        assert_eq!(ours.spec.names.plural, theirs.spec.names.plural, "{kind}");
        assert_eq!(ours.spec.scope, theirs.spec.scope, "{kind}");
        let version = &ours.spec.versions[0].name;
        let found = drift(
            &schema(&ours, version),
            &schema(&theirs, version),
            not_modelled(kind),
        );
        assert_eq!(found, Vec::<String>::new(), "{kind} {version}");
        // Both versions are served with the same schema (no conversion webhook), so either
        // may be used; a schema change in one of them is drift too.
        for other in &theirs.spec.versions {
            assert!(other.served, "{kind} {} not served", other.name);
            if kind != "ClusterProperty" {
                assert_eq!(
                    schema(&theirs, &other.name),
                    schema(&theirs, version),
                    "{kind}"
                );
            }
        }
    }
}

#[test]
fn drift_finds_missing_extra_retyped_and_required_fields() {
    let theirs = json!({"type": "object", "properties": {"spec": {"type": "object",
        "required": ["a"],
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "string"}}}}});
    let ours = json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {"a": {"type": "integer"}, "d": {"type": "string"}}}}});
    assert_eq!(
        drift(&ours, &theirs, &[".spec.c", ".spec.e"]),
        [
            ".spec: required {} here, {\"a\"} upstream",
            ".spec.a: type Some(\"integer\") here, Some(\"string\") upstream",
            ".spec.d: not in the upstream schema",
            ".spec.b: upstream field not modelled",
            ".spec.e: listed as not modelled but not upstream",
        ]
    );
}

#[test]
fn shipped_crds_are_the_upstream_files() {
    // The shared folder beside the repository (CI's layout); XCC_UPSTREAM_CRDS overrides it.
    let dir = std::env::var_os("XCC_UPSTREAM_CRDS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/kube/crds")
        });
    if !dir.is_dir() {
        assert_ne!(
            std::env::var("XCC_REQUIRE_KUBE").as_deref(),
            Ok("1"),
            "no upstream CRDs at {}",
            dir.display()
        );
        eprintln!("SKIP: no upstream CRDs at {}", dir.display());
        return;
    }
    for (file, shipped) in UPSTREAM {
        let original = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(
            original == shipped,
            "deploy/mcs/crds/{file} differs from upstream"
        );
    }
}

#[test]
fn manifests_of_other_implementations_parse() {
    // As Submariner's and Cilium's documentation show them.
    let export: ServiceExport = yaml_serde::from_str(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {name: nginx, namespace: demo}\n",
    )
    .unwrap();
    assert_eq!(export.spec, ServiceExportSpec::default());
    assert_eq!(
        serde_json::to_value(&export).unwrap(),
        json!({"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
               "metadata": {"name": "nginx", "namespace": "demo"}, "spec": {}})
    );
    let import: ServiceImport = yaml_serde::from_str(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceImport\nmetadata: {name: nginx, namespace: demo}\n\
         spec: {type: ClusterSetIP, ips: [10.1.2.3], ports: [{name: http, protocol: TCP, port: 80}], ipFamilies: [IPv4]}\n\
         status: {clusters: [{cluster: east}]}\n",
    )
    .unwrap();
    assert_eq!(import.spec.type_, TYPE_CLUSTER_SET_IP);
    assert_eq!(import.spec.ips, Some(vec!["10.1.2.3".to_string()]));
    assert_eq!(
        import.status.unwrap().clusters,
        Some(vec![ClusterStatus {
            cluster: "east".into()
        }])
    );
    let id: ClusterProperty = yaml_serde::from_str(
        "apiVersion: about.k8s.io/v1alpha1\nkind: ClusterProperty\nmetadata: {name: cluster.clusterset.k8s.io}\nspec: {value: east}\n",
    )
    .unwrap();
    assert_eq!(id.spec.value, "east");
}

#[test]
fn hostnames_round_trip_and_bad_pairs_are_left_out() {
    let hostnames = BTreeMap::from([
        ("10.0.0.1".to_string(), "web-0".to_string()),
        ("10.0.0.2".to_string(), "web-1".to_string()),
    ]);
    let value = format_hostnames(&hostnames);
    assert_eq!(value, "10.0.0.1=web-0,10.0.0.2=web-1");
    assert_eq!(parse_hostnames(&value), (hostnames, 0));
    let (parsed, bad) = parse_hostnames(
        "fd00:0:0::1=a,10.0.0.1=UPPER,nonsense,10.0.0.3=ok,10.0.0.3=second,not-an-ip=x,10.0.0.4=",
    );
    assert_eq!(
        parsed,
        BTreeMap::from([
            ("fd00::1".to_string(), "a".to_string()),
            ("10.0.0.3".to_string(), "ok".to_string()),
        ])
    );
    assert_eq!(bad, 4);
    assert_eq!(parse_hostnames(""), (BTreeMap::new(), 0));
}

#[test]
fn hostnames_count_only_on_headless_records() {
    let mut record = crate::crd::ServiceRecord::default();
    record.metadata.annotations = Some(BTreeMap::from([(
        HOSTNAMES_ANNOTATION.to_string(),
        "10.0.0.1=web-0".to_string(),
    )]));
    assert!(!is_headless(&record));
    assert!(record_hostnames(&record).is_empty());
    record
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(HEADLESS_ANNOTATION.to_string(), HEADLESS_TRUE.to_string());
    assert!(is_headless(&record));
    assert_eq!(
        record_hostnames(&record),
        BTreeMap::from([("10.0.0.1".to_string(), "web-0".to_string())])
    );
}

/// A record of `cluster`'s export, with `at` as its export time when given.
fn export_record(cluster: &str, at: Option<&str>, uid: &str) -> crate::crd::ServiceRecord {
    let mut record = crate::crd::ServiceRecord::default();
    record.metadata.uid = Some(uid.to_string());
    record.metadata.name = Some(format!("api-{cluster}"));
    record.metadata.annotations =
        at.map(|at| BTreeMap::from([(EXPORTED_AT_ANNOTATION.to_string(), at.to_string())]));
    record.spec.origin = Some(crate::crd::Origin {
        cluster: Some(cluster.to_string()),
        namespace: "shop".into(),
        name: "api".into(),
        kind: None,
    });
    record
}

#[test]
fn exported_at_is_rfc3339_utc_seconds_and_bad_values_say_nothing() {
    let at = Timestamp::from_second(1_700_000_000).unwrap();
    assert_eq!(format_exported_at(at), "2023-11-14T22:13:20Z");
    let fraction = Timestamp::new(1_700_000_000, 500_000_000).unwrap();
    assert_eq!(format_exported_at(fraction), "2023-11-14T22:13:20Z");
    assert_eq!(parse_exported_at("2023-11-14T22:13:20Z"), Some(at));
    // Another offset and a fraction name the same second.
    assert_eq!(parse_exported_at("2023-11-15T00:13:20.9+02:00"), Some(at));
    for bad in ["", "yesterday", "2023-13-01T00:00:00Z", &"9".repeat(65)] {
        assert_eq!(parse_exported_at(bad), None, "{bad:?}");
    }
    let record = export_record("east", Some("not a time"), "u1");
    assert_eq!(exported_at(&record), None);
}

/// KEP-1645: the oldest export wins, ties by cluster name, in whichever order the exports
/// were made or are seen; a record that does not say when it was exported comes last.
#[test]
fn the_oldest_export_comes_first_whatever_the_order_seen() {
    let older = "2026-11-29T07:00:00Z";
    let newer = "2026-11-29T07:00:01Z";
    // Both orders of creation: east first, then west first. UIDs favour the loser each time,
    // so the UID (which differs per cluster) never decides.
    for (east_at, west_at, first) in [(older, newer, "east"), (newer, older, "west")] {
        let east = export_record("east", Some(east_at), "z");
        let west = export_record("west", Some(west_at), "a");
        for mut seen in [vec![&east, &west], vec![&west, &east]] {
            seen.sort_by(|a, b| oldest_first(a, b));
            assert_eq!(
                source_cluster(seen[0]),
                Some(first),
                "east {east_at}, west {west_at}"
            );
        }
    }
    // The same second: the cluster name decides.
    let east = export_record("east", Some(older), "z");
    let west = export_record("west", Some(older), "a");
    assert_eq!(oldest_first(&east, &west), std::cmp::Ordering::Less);
    assert_eq!(oldest_first(&west, &east), std::cmp::Ordering::Greater);
    // No time: after any record with one, however old the cluster's name sorts.
    let unknown = export_record("aaa", None, "0");
    assert_eq!(oldest_first(&west, &unknown), std::cmp::Ordering::Less);
    assert_eq!(shown_export(&east), "east (exported 2026-11-29T07:00:00Z)");
    assert_eq!(shown_export(&unknown), "aaa (export time unknown)");
}

#[test]
fn ports_merge_as_the_union_and_the_oldest_definition_of_a_port_wins() {
    use crate::crd::Protocol::{Tcp, Udp};
    let p = |name: &str, port: i32, protocol| (name.to_string(), port, protocol);
    let oldest = [p("http", 80, Tcp), p("dns", 53, Udp)];
    let later = [
        p("http", 80, Tcp),   // the same port: merged once
        p("http", 8080, Tcp), // same name, other number: PortConflict
        p("metrics", 9090, Tcp),
        p("web", 80, Tcp), // same number and protocol, other name
        p("dns", 53, Tcp), // same name, other protocol
        p("", 7000, Tcp),  // unnamed beside others
    ];
    let (merged, clashes) = merge_ports([&oldest[..], &later[..]]);
    assert_eq!(
        merged.iter().map(shown_port).collect::<Vec<_>>(),
        ["dns:53/UDP", "http:80/TCP", "metrics:9090/TCP"]
    );
    assert_eq!(
        clashes
            .iter()
            .map(|c| (
                c.export,
                shown_port(&c.port),
                shown_port(&c.kept),
                c.kept_from
            ))
            .collect::<Vec<_>>(),
        [
            (1, "http:8080/TCP".to_string(), "http:80/TCP".to_string(), 0),
            (1, "web:80/TCP".to_string(), "http:80/TCP".to_string(), 0),
            (1, "dns:53/TCP".to_string(), "dns:53/UDP".to_string(), 0),
            (1, "7000/TCP".to_string(), "http:80/TCP".to_string(), 0),
        ]
    );
    // In the other order the other definitions win.
    let (merged, clashes) = merge_ports([&later[..], &oldest[..]]);
    assert_eq!(
        merged.iter().map(shown_port).collect::<Vec<_>>(),
        ["dns:53/TCP", "http:80/TCP", "metrics:9090/TCP"]
    );
    assert_eq!(
        clashes
            .iter()
            .map(|c| (c.export, shown_port(&c.port)))
            .collect::<Vec<_>>(),
        [
            (0, "http:8080/TCP".to_string()),
            (0, "web:80/TCP".to_string()),
            (0, "7000/TCP".to_string()),
            (1, "dns:53/UDP".to_string()),
        ]
    );
    // Two single unnamed ports: one port, the oldest's number.
    let (merged, clashes) = merge_ports([&[p("", 80, Tcp)][..], &[p("", 81, Tcp)][..]]);
    assert_eq!(merged, [p("", 80, Tcp)]);
    assert_eq!(clashes.len(), 1);
}
