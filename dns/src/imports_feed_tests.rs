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
    let mut state = ImportsDir::new(dir.path());
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
            r#"{"put":{"fqdn":"api.xcc.test","endpoints":[{"address":"10.0.0.3","port":8443}]}}"#,
            "\n",
            r#"{"put":{"fqdn":"cut"#,
            "\n"
        ),
    )
    .unwrap();
    let mut state = ImportsDir::new(dir.path());
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
    let mut state = ImportsDir::new(dir.path());
    assert_eq!(state.rescan(), (true, vec![]));
    write(line("a.xcc.test") + &line("b.xcc.test"));
    assert_eq!(state.rescan(), (true, vec![]));
    let fqdns: Vec<String> = state.records()["east"]
        .iter()
        .map(|r| r.spec.fqdn.clone())
        .collect();
    assert_eq!(fqdns, ["a.xcc.test", "b.xcc.test"]);
}
