use xcc_proto::names::FQDN_ANNOTATION;

use super::*;

fn record(ns: &str, name: &str, fqdn: &str, ips: &[&str], origin: Option<(&str, &str)>) -> String {
    let mut annotations = String::new();
    if let Some((ons, oname)) = origin {
        annotations = format!(
            "  annotations:\n    {ORIGIN_NAMESPACE_ANNOTATION}: {ons}\n    {ORIGIN_NAME_ANNOTATION}: {oname}\n"
        );
    }
    let endpoints: String = ips
        .iter()
        .map(|ip| format!("  - address: \"{ip}\"\n    port: 443\n"))
        .collect();
    format!(
        "apiVersion: {}\nkind: ServiceRecord\nmetadata:\n  name: {name}\n  namespace: {ns}\n{annotations}spec:\n  fqdn: {fqdn}\n  endpoints:\n{endpoints}",
        xcc_proto::names::API_VERSION
    )
}

fn parse(text: &str) -> Vec<ServiceRecord> {
    resources::parse_documents(text, "test").unwrap()
}

#[test]
fn records_become_names_with_endpoint_addresses_and_mcs_names() {
    let east = parse(&format!(
        "{}---\n{}",
        record(
            "xcc",
            "web-east",
            "WEB.shop.xcc.test",
            &["10.0.1.10", "fd00::1"],
            Some(("shop", "web"))
        ),
        record("xcc", "bad-east", "a_b.xcc.test", &["10.0.0.1"], None),
    ));
    let north = parse(&record(
        "xcc",
        "web-north",
        "web.shop.xcc.test",
        &["10.0.1.10", "10.0.9.9", "web.example"],
        None,
    ));
    let dns_only = parse(&record(
        "xcc",
        "named-north",
        "named.xcc.test",
        &["web.example"],
        None,
    ));
    let files = BTreeMap::from([
        ("east.yaml".to_string(), east),
        ("north.yaml".to_string(), [north, dns_only].concat()),
    ]);
    let (services, skipped) = services_from_records(&files);
    assert_eq!(
        services,
        vec![ServiceInfo {
            key: ServiceKey::new("xcc", "web-east"),
            annotations: [
                (FQDN_ANNOTATION.to_string(), "web.shop.xcc.test".to_string()),
                (ORIGIN_NAMESPACE_ANNOTATION.to_string(), "shop".to_string()),
                (ORIGIN_NAME_ANNOTATION.to_string(), "web".to_string()),
            ]
            .into_iter()
            .collect(),
            cluster_ips: ["10.0.1.10", "10.0.9.9", "fd00::1"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect(),
            ports: Vec::new(),
        }]
    );
    let reasons: Vec<(String, String)> = skipped
        .iter()
        .map(|s| (s.record.clone(), s.reason.clone()))
        .collect();
    assert_eq!(reasons.len(), 2, "{skipped:?}");
    assert_eq!(reasons[0].0, "xcc/bad-east");
    assert!(reasons[0].1.starts_with("spec.fqdn: "), "{reasons:?}");
    assert_eq!(
        reasons[1],
        (
            "xcc/named-north".to_string(),
            "no endpoint is an IP address".to_string()
        )
    );
}

#[test]
fn a_broken_file_keeps_its_last_good_content_and_a_removed_file_its_names_go() {
    let dir = tempfile::tempdir().unwrap();
    let east = dir.path().join("east.yaml");
    std::fs::write(
        &east,
        record("xcc", "web-east", "web.xcc.test", &["10.0.0.1"], None),
    )
    .unwrap();
    std::fs::write(dir.path().join(".tmp123"), "not yaml: [").unwrap();
    let mut state = ImportsDir::new(dir.path()).with_settle(Duration::ZERO);
    assert_eq!(state.rescan(), (true, vec![]));
    assert_eq!(state.records()["east"].len(), 1);
    assert_eq!(state.rescan(), (false, vec![]), "nothing changed");

    std::fs::write(&east, "kind: [").unwrap();
    let (changed, errors) = state.rescan();
    assert!(!changed);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("east.yaml"), "{errors:?}");
    assert_eq!(state.records()["east"][0].spec.fqdn, "web.xcc.test");

    std::fs::remove_file(&east).unwrap();
    assert_eq!(state.rescan(), (true, vec![]));
    assert!(state.records().is_empty());
}

#[test]
fn a_remote_is_its_snapshot_with_its_journal_replayed_in_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("east.yaml"),
        format!(
            "{}---\n{}",
            record("xcc", "web-east", "web.xcc.test", &["10.0.0.1"], None),
            record("xcc", "db-east", "db.xcc.test", &["10.0.0.2"], None)
        ),
    )
    .unwrap();
    // What the registry appends after the snapshot: web moves, db goes, api arrives; then a
    // line torn by a crash, which is skipped and reported.
    std::fs::write(
        dir.path().join("east.journal"),
        concat!(
            r#"{"put":{"fqdn":"web.xcc.test","endpoints":[{"address":"10.0.0.9","port":443}]}}"#,
            "\n",
            r#"{"del":"db.xcc.test"}"#,
            "\n",
            r#"{"put":{"fqdn":"api.xcc.test","endpoints":[{"address":"10.0.0.3","port":8443}],"#,
            r#""ports":[{"name":"https","port":443,"protocol":"TCP","targetPort":8443}]}}"#,
            "\n",
            r#"{"put":{"fqdn":"cut"#,
            "\n"
        ),
    )
    .unwrap();
    let mut state = ImportsDir::new(dir.path()).with_settle(Duration::ZERO);
    let (changed, errors) = state.rescan();
    assert!(changed);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("east.journal line 4"), "{errors:?}");
    let records = &state.records()["east"];
    let got: Vec<(&str, Vec<&str>, Option<&str>)> = records
        .iter()
        .map(|r| {
            (
                r.spec.fqdn.as_str(),
                r.spec
                    .endpoints
                    .iter()
                    .map(|e| e.address.as_str())
                    .collect(),
                r.metadata.namespace.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("api.xcc.test", vec!["10.0.0.3"], Some("xcc")),
            ("web.xcc.test", vec!["10.0.0.9"], Some("xcc")),
        ]
    );
    assert_eq!(
        records[0].metadata.name,
        Some(xcc_proto::names::imported_record_name("api.xcc.test", "east").unwrap())
    );
    // A journal line's named ports are the record's, as in a snapshot.
    assert_eq!(
        serde_json::to_value(&records[0].spec.ports).unwrap(),
        serde_json::json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443}])
    );
    assert_eq!(records[1].spec.ports, None);

    // A journal alone (the first batch before any snapshot) is a remote too.
    std::fs::write(
        dir.path().join("west.journal"),
        concat!(
            r#"{"put":{"fqdn":"web.west.test","endpoints":[{"address":"10.1.0.1","port":443}]}}"#,
            "\n"
        ),
    )
    .unwrap();
    let (changed, _) = state.rescan();
    assert!(changed);
    assert_eq!(state.records()["west"][0].spec.fqdn, "web.west.test");
}

/// The registry appends to its journal in place (zeros ahead of the appends, so the length stays
/// the same) and two appends can carry the same coarse modification time: a journal modified
/// shortly before it was read is read again, so the second append is not missed.
#[test]
fn an_append_in_place_with_the_same_stamp_is_still_seen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("east.journal");
    let line = |fqdn: &str| {
        format!(
            r#"{{"put":{{"fqdn":"{fqdn}","endpoints":[{{"address":"10.0.0.1","port":443}}]}}}}"#
        ) + "\n"
    };
    let mtime = SystemTime::now() + Duration::from_secs(60);
    let write = |text: String| {
        let mut bytes = text.into_bytes();
        bytes.resize(4096, 0);
        std::fs::write(&path, bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    };
    write(line("a.xcc.test"));
    let mut state = ImportsDir::new(dir.path()).with_settle(Duration::ZERO);
    assert_eq!(state.rescan(), (true, vec![]));
    write(line("a.xcc.test") + &line("b.xcc.test"));
    assert_eq!(state.rescan(), (true, vec![]));
    let fqdns: Vec<String> = state.records()["east"]
        .iter()
        .map(|r| r.spec.fqdn.clone())
        .collect();
    assert_eq!(fqdns, ["a.xcc.test", "b.xcc.test"]);
}

/// A headless import as `xcc registry --store file` writes it to `imports/<remote>.yaml`: the
/// marker, the pods' hostnames (one of an address the record does not carry), the origin pair
/// and, for a hierarchy import, the owner as `spec.origin.cluster`.
fn headless_record(
    remote: &str,
    (fqdn, origin_name): (&str, &str),
    ips: &[&str],
    hostnames: &str,
    owner: Option<&str>,
) -> String {
    use xcc_proto::mcs::{HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION};
    let endpoints: String = ips
        .iter()
        .map(|ip| format!("  - address: \"{ip}\"\n    port: 15432\n"))
        .collect();
    let origin = owner
        .map(|c| {
            format!("  origin:\n    cluster: {c}\n    namespace: shop\n    name: {origin_name}\n")
        })
        .unwrap_or_default();
    format!(
        "apiVersion: {}\nkind: ServiceRecord\nmetadata:\n  name: {fqdn}-x\n  namespace: xcc\n  labels:\n    {IMPORTED_LABEL}: \"\"\n    {REMOTE_REGISTRY_LABEL}: {remote}\n  annotations:\n    {HEADLESS_ANNOTATION}: \"true\"\n    {HOSTNAMES_ANNOTATION}: \"{hostnames}\"\n    {ORIGIN_NAMESPACE_ANNOTATION}: shop\n    {ORIGIN_NAME_ANNOTATION}: {origin_name}\nspec:\n  fqdn: {fqdn}\n  endpoints:\n{endpoints}{origin}",
        xcc_proto::names::API_VERSION
    )
}

/// The names `services` serve and their addresses, sorted.
fn names(services: &[ServiceInfo]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = services
        .iter()
        .map(|s| {
            (
                s.annotations
                    .fqdn
                    .as_deref()
                    .unwrap_or_default()
                    .to_string(),
                s.cluster_ips.iter().map(|ip| ip.to_string()).collect(),
            )
        })
        .collect();
    out.sort();
    out
}

/// A headless import with pod hostnames gets the MCS pod names
/// `<hostname>.<cluster>.db.shop.svc.clusterset.local`, the cluster being the owner a hierarchy
/// import names (here east, imported through the RemoteRegistry `parent`), else the remote;
/// only hostnames of the record's own addresses count, and the journal's changes (including
/// its `cluster`) apply like the snapshot's.
#[test]
fn headless_imports_serve_their_pods_hostname_names() {
    let fqdn = "db.shop.svc.clusterset.local";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("parent.yaml"),
        headless_record(
            "parent",
            (fqdn, "db"),
            &["10.4.0.1", "10.4.0.2"],
            "10.4.0.1=db-0,10.4.0.2=db-1,10.9.9.9=elsewhere",
            Some("east"),
        ),
    )
    .unwrap();
    // A flat import of another headless service, its pods named under the remote; and one
    // whose hostnames annotation comes without the marker: no pod names.
    let plain = record(
        "xcc",
        "web-x",
        "web.xcc.test",
        &["10.5.0.1"],
        Some(("shop", "web")),
    )
    .replace(
        "  annotations:\n",
        &format!(
            "  annotations:\n    {}: \"10.5.0.1=web-0\"\n",
            xcc_proto::mcs::HOSTNAMES_ANNOTATION
        ),
    );
    std::fs::write(
        dir.path().join("west.yaml"),
        format!(
            "{}---\n{plain}",
            headless_record(
                "west",
                ("cache.west.test", "cache"),
                &["10.6.0.1"],
                "10.6.0.1=cache-0",
                None
            )
        ),
    )
    .unwrap();
    let mut state = ImportsDir::new(dir.path()).with_settle(Duration::ZERO);
    assert_eq!(state.rescan(), (true, vec![]));
    let (services, skipped) = services_from_records(&state.records());
    assert_eq!(skipped, []);
    let ip = |s: &str| vec![s.to_string()];
    assert_eq!(
        names(&services),
        [
            (
                "cache-0.west.cache.shop.svc.clusterset.local".to_string(),
                ip("10.6.0.1")
            ),
            ("cache.west.test".to_string(), ip("10.6.0.1")),
            (
                "db-0.east.db.shop.svc.clusterset.local".to_string(),
                ip("10.4.0.1")
            ),
            (
                "db-1.east.db.shop.svc.clusterset.local".to_string(),
                ip("10.4.0.2")
            ),
            (fqdn.to_string(), vec!["10.4.0.1".into(), "10.4.0.2".into()]),
            ("web.xcc.test".to_string(), ip("10.5.0.1")),
        ]
    );

    // A pod replaced, as the registry journals a pushed answer.
    std::fs::write(
        dir.path().join("parent.journal"),
        format!(
            concat!(
                r#"{{"put":{{"fqdn":"{}","endpoints":[{{"address":"10.4.0.2","port":15432}},{{"address":"10.4.0.3","port":15432}}],"#,
                r#""annotations":{{"{}":"true","{}":"10.4.0.2=db-1,10.4.0.3=db-2","{}":"shop","{}":"db"}},"cluster":"east"}}}}"#,
                "\n"
            ),
            fqdn,
            xcc_proto::mcs::HEADLESS_ANNOTATION,
            xcc_proto::mcs::HOSTNAMES_ANNOTATION,
            ORIGIN_NAMESPACE_ANNOTATION,
            ORIGIN_NAME_ANNOTATION,
        ),
    )
    .unwrap();
    assert_eq!(state.rescan(), (true, vec![]));
    let (services, _) = services_from_records(&state.records());
    let db: Vec<_> = names(&services)
        .into_iter()
        .filter(|(name, _)| name.ends_with(fqdn))
        .collect();
    assert_eq!(
        db,
        [
            (
                "db-1.east.db.shop.svc.clusterset.local".to_string(),
                ip("10.4.0.2")
            ),
            (
                "db-2.east.db.shop.svc.clusterset.local".to_string(),
                ip("10.4.0.3")
            ),
            (fqdn.to_string(), vec!["10.4.0.2".into(), "10.4.0.3".into()]),
        ]
    );
}

/// A record read only from a journal gets the directory's namespace, never the
/// empty one that static records hold; records merged under one FQDN take the lowest key and
/// the origin that names the FQDN itself, in whatever order the files come.
#[test]
fn journal_records_get_a_namespace_and_merges_do_not_depend_on_file_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("east.yaml"),
        record("xcc", "other", "other.xcc.test", &["10.0.0.1"], None),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("a-west.journal"),
        concat!(
            r#"{"put":{"fqdn":"api.shop.svc.clusterset.local","endpoints":[{"address":"6.6.6.6","port":443}],"annotations":{"connectivity.tanzu.vmware.com/origin-namespace":"kube-system","connectivity.tanzu.vmware.com/origin-name":"kube-dns"}}}"#,
            "\n"
        ),
    )
    .unwrap();
    let mut state = ImportsDir::new(dir.path().to_path_buf());
    state.rescan();
    let files = state.records();
    let (services, _) = services_from_records(&files);
    let api = services
        .iter()
        .find(|s| s.annotations.fqdn.as_deref() == Some("api.shop.svc.clusterset.local"))
        .unwrap();
    assert_eq!(&*api.key.namespace, "xcc");

    let east = parse(&record(
        "xcc",
        "z-east",
        "api.shop.svc.clusterset.local",
        &["10.2.0.1"],
        Some(("shop", "api")),
    ));
    let west = parse(&record(
        "xcc",
        "a-west",
        "api.shop.svc.clusterset.local",
        &["10.3.0.1"],
        Some(("kube-system", "kube-dns")),
    ));
    let one = BTreeMap::from([
        ("a.yaml".to_string(), east.clone()),
        ("b.yaml".to_string(), west.clone()),
    ]);
    let other = BTreeMap::from([("a.yaml".to_string(), west), ("b.yaml".to_string(), east)]);
    let (first, _) = services_from_records(&one);
    let (second, _) = services_from_records(&other);
    assert_eq!(first, second);
    assert_eq!(first[0].key, ServiceKey::new("xcc", "a-west"));
    assert_eq!(first[0].annotations.origin_name.as_deref(), Some("api"));
    assert_eq!(
        first[0].annotations.origin_namespace.as_deref(),
        Some("shop")
    );
}

/// A snapshot rewritten in place (emptied, then caught half-way), replaced by unlinking it first
/// (`kubectl cp`), or rewritten with fewer records never removes a name for a moment (the
/// settle time is an hour here, so each state is held still); an added record is served at once;
/// once settled, a removal applies.
#[test]
fn no_intermediate_state_of_a_snapshot_writer_removes_a_name() {
    let dir = tempfile::tempdir().unwrap();
    let east = dir.path().join("east.yaml");
    let web = record("xcc", "web-east", "web.xcc.test", &["10.0.0.1"], None);
    let db = record("xcc", "db-east", "db.xcc.test", &["10.0.0.2"], None);
    std::fs::write(&east, &web).unwrap();
    let mut state = ImportsDir::new(dir.path()).with_settle(Duration::from_secs(3600));
    assert_eq!(state.rescan(), (true, vec![]));
    let served = |state: &ImportsDir| -> Vec<String> {
        let mut f: Vec<String> = state
            .records()
            .values()
            .flatten()
            .map(|r| r.spec.fqdn.clone())
            .collect();
        f.sort();
        f
    };
    std::fs::write(&east, "").unwrap();
    assert!(!state.rescan().0, "emptied in place");
    assert_eq!(served(&state), ["web.xcc.test"]);
    std::fs::write(&east, &web[..web.find("spec:").unwrap()]).unwrap();
    state.rescan();
    assert_eq!(served(&state), ["web.xcc.test"], "half written");
    std::fs::remove_file(&east).unwrap();
    assert!(!state.rescan().0, "unlinked");
    assert_eq!(served(&state), ["web.xcc.test"]);
    std::fs::write(&east, format!("{web}---\n{db}")).unwrap();
    assert!(state.rescan().0, "one more: at once");
    assert_eq!(served(&state), ["db.xcc.test", "web.xcc.test"]);
    std::fs::write(&east, &db).unwrap();
    state.rescan();
    assert_eq!(
        served(&state),
        ["db.xcc.test", "web.xcc.test"],
        "one less: waits"
    );
    assert!(state.next_due().is_some());
    let mut state = state.with_settle(Duration::ZERO);
    assert!(state.rescan().0, "settled");
    assert_eq!(served(&state), ["db.xcc.test"]);
    std::fs::remove_file(&east).unwrap();
    assert!(state.rescan().0);
    assert!(served(&state).is_empty());
}
