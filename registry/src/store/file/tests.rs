use super::*;

const GOOD: &str = r#"
apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: ServiceRecord
metadata:
  name: web.xcc.test
  namespace: shop
  annotations:
    connectivity.tanzu.vmware.com/service-port: "443"
    connectivity.tanzu.vmware.com/clusters: "west, north"
    unrelated: "x"
spec:
  fqdn: Web.XCC.test
  endpoints:
  - address: 10.0.0.1
    port: 443
"#;

#[test]
fn export_entry_maps_annotations_and_requesters() {
    let sr: Vec<ServiceRecord> = resources::parse_documents(GOOD, "t.yaml").expect("parse");
    let e = export_entry("east", &sr[0]).expect("valid");
    assert_eq!(e.key, ServiceKey::new("east", "shop", "web.xcc.test"));
    assert_eq!(e.fqdn, "web.xcc.test");
    assert_eq!(e.allowed_requesters, vec!["north", "west"]);
    assert_eq!(
        e.labels.keys().collect::<Vec<_>>(),
        vec![
            "connectivity.tanzu.vmware.com/clusters",
            "connectivity.tanzu.vmware.com/service-port"
        ]
    );
}

#[test]
fn malformed_file_keeps_last_good_content_and_names_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(&exports).expect("mkdir");
    std::fs::write(exports.join("web.yaml"), GOOD).expect("write");
    let catalog = Catalog::new();
    let mut yd = YamlDir::new(exports.clone()).with_settle(Duration::ZERO);
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(catalog.len(), 1);
    let bad = GOOD.replace("port: 443", "port: 70000");
    std::fs::write(exports.join("web.yaml"), bad).expect("write");
    assert!(!sync_exports(&catalog, "east", &mut yd));
    assert_eq!(catalog.len(), 1, "state kept");
    let errors = yd.errors();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("exports/web.yaml") && errors[0].contains("spec.endpoints[0].port"),
        "{errors:?}"
    );
    std::fs::remove_file(exports.join("web.yaml")).expect("rm");
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert!(catalog.is_empty());
    assert!(yd.errors().is_empty());
}

#[test]
fn a_service_port_that_is_not_a_number_is_rejected_with_the_fix() {
    let mut sr: Vec<ServiceRecord> = resources::parse_documents(GOOD, "t.yaml").expect("parse");
    for bad in ["https", "0", "70000", ""] {
        sr[0]
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(names::SERVICE_PORT_ANNOTATION.into(), bad.into());
        let err = export_entry("east", &sr[0]).expect_err(bad).to_string();
        assert_eq!(
            err,
            format!(
                "metadata.annotations[connectivity.tanzu.vmware.com/service-port]: {bad:?} is not a port number (1-65535); write the number, e.g. \"443\" (name ports in spec.ports)"
            )
        );
    }
}

#[test]
fn an_export_too_large_for_hamlet_is_rejected_with_its_size() {
    let mut sr = ServiceRecord::default();
    sr.metadata.name = Some("big".into());
    sr.spec.fqdn = "big.xcc.test".into();
    sr.metadata.annotations = Some(BTreeMap::from([(
        "connectivity.tanzu.vmware.com/blob".into(),
        "x".repeat(5 * 1024 * 1024),
    )]));
    let err = export_entry("east", &sr)
        .expect_err("too large")
        .to_string();
    assert!(err.starts_with("too large for Hamlet: about "), "{err}");
    sr.metadata.annotations = None;
    assert!(export_entry("east", &sr).is_ok());
}

fn record(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: ServiceRecord\nmetadata:\n  name: {name}\n  namespace: shop\nspec:\n  fqdn: {name}.xcc.test\n  endpoints:\n  - address: {ip}\n    port: 443\n"
    )
}

fn addresses(catalog: &Catalog) -> Vec<(String, String)> {
    catalog
        .list(&Default::default())
        .iter()
        .map(|e| (e.key.name.to_string(), e.endpoints[0].address.to_string()))
        .collect()
}

#[test]
fn incremental_sync_applies_changed_files_only_and_keeps_last_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(&exports).expect("mkdir");
    let write = |file: &str, text: &str| std::fs::write(exports.join(file), text).expect("write");
    write(
        "a.yaml",
        &format!(
            "{}---\n{}",
            record("one", "10.0.0.1"),
            record("two", "10.0.0.2")
        ),
    );
    write("b.yaml", &record("three", "10.0.0.3"));
    let catalog = Catalog::new();
    let mut yd = YamlDir::new(exports.clone()).with_settle(Duration::ZERO);
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(catalog.len(), 3);
    let rev = catalog.revision();
    assert!(!sync_exports(&catalog, "east", &mut yd), "nothing changed");
    assert_eq!(catalog.revision(), rev);
    // b.yaml also defines "two": the later file wins, as in a full load.
    write(
        "b.yaml",
        &format!(
            "{}---\n{}",
            record("three", "10.0.0.3"),
            record("two", "10.9.9.9")
        ),
    );
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        [
            ("one", "10.0.0.1"),
            ("three", "10.0.0.3"),
            ("two", "10.9.9.9")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(
        catalog.revision(),
        rev + 1,
        "only the changed record was stored"
    );
    // Removing it from b.yaml falls back to a.yaml's record instead of deleting it.
    write("b.yaml", &record("three", "10.0.0.3"));
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog)[2],
        ("two".to_string(), "10.0.0.2".to_string())
    );
    // A removed file removes exactly its records.
    std::fs::remove_file(exports.join("a.yaml")).expect("rm");
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        vec![("three".to_string(), "10.0.0.3".to_string())]
    );
}

#[test]
fn items_holding_reads_only_the_files_with_those_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(&exports).expect("mkdir");
    let write = |file: &str, text: &str| std::fs::write(exports.join(file), text).expect("write");
    write(
        "a.yaml",
        &format!(
            "{}---\n{}",
            record("one", "10.0.0.1"),
            record("two", "10.0.0.2")
        ),
    );
    write("b.yaml", &record("three", "10.0.0.3"));
    write("c.yaml", &record("two", "10.0.0.4"));
    let mut yd: YamlDir<ServiceRecord> = YamlDir::new(exports.clone()).with_settle(Duration::ZERO);
    yd.refresh(|_| Ok::<_, std::convert::Infallible>(()));
    let names = |keys: &[&str]| -> Vec<String> {
        let hashes: HashSet<u64> = keys.iter().map(|n| key_hash("shop", n)).collect();
        yd.items_holding(&hashes)
            .map(|sr| format!("{}={}", sr.namespace_name().1, sr.spec.endpoints[0].address))
            .collect()
    };
    // Every item of each candidate file, in file order; b.yaml is skipped.
    assert_eq!(
        names(&["two"]),
        ["one=10.0.0.1", "two=10.0.0.2", "two=10.0.0.4"]
    );
    assert_eq!(names(&["three"]), ["three=10.0.0.3"]);
    assert!(names(&["four"]).is_empty());
    assert!(names(&[]).is_empty());
}

#[test]
fn same_size_rewrite_within_the_timestamp_tick_is_seen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(&exports).expect("mkdir");
    let path = exports.join("a.yaml");
    std::fs::write(&path, record("one", "10.0.0.1")).expect("write");
    let catalog = Catalog::new();
    let mut yd = YamlDir::new(exports.clone()).with_settle(Duration::ZERO);
    assert!(sync_exports(&catalog, "east", &mut yd));
    // Same length, written in place, and the modification time put back: only the content
    // (and ctime) differ.
    let mtime = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("mtime");
    std::fs::write(&path, record("one", "10.0.0.2")).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(mtime))
        .expect("set mtime");
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        vec![("one".to_string(), "10.0.0.2".to_string())]
    );
}

/// A directory fed by `DirEvents`, as if watched: its first refresh is the full load.
fn watched(exports: &Path) -> (YamlDir<ServiceRecord>, DirEvents) {
    let events = DirEvents::default();
    events.watch(exports);
    let yd = YamlDir::new(exports.to_path_buf())
        .with_events(events.clone())
        .with_settle(Duration::ZERO);
    (yd, events)
}

#[test]
fn watched_refresh_reads_only_the_reported_files_and_full_scans_on_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(&exports).expect("mkdir");
    let write = |file: &str, text: &str| std::fs::write(exports.join(file), text).expect("write");
    write("a.yaml", &record("one", "10.0.0.1"));
    write("b.yaml", &record("two", "10.0.0.2"));
    let catalog = Catalog::new();
    let (mut yd, events) = watched(&exports);
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(catalog.len(), 2);
    assert_eq!(events.take(&exports), Scope::Paths(BTreeSet::new()));

    // Both change on disk, only a.yaml is reported: only a.yaml is read.
    write("a.yaml", &record("one", "10.1.1.1"));
    write("b.yaml", &record("two", "10.2.2.2"));
    events.record(&[exports.join("a.yaml")]);
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        [("one", "10.1.1.1"), ("two", "10.0.0.2")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
    // Nothing reported: nothing read.
    assert!(!sync_exports(&catalog, "east", &mut yd));
    // A rescan notice (or a poll tick) finds b.yaml.
    events.all_full();
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog)[1],
        ("two".to_string(), "10.2.2.2".to_string())
    );

    // A reported deletion removes exactly that file's records; a reported non-YAML file is
    // ignored.
    std::fs::remove_file(exports.join("a.yaml")).expect("rm");
    write("notes.txt", "not yaml");
    events.record(&[exports.join("a.yaml"), exports.join("notes.txt")]);
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        vec![("two".to_string(), "10.2.2.2".to_string())]
    );

    // An event on the directory itself, or on a path outside it, asks for a full scan.
    events.record(std::slice::from_ref(&exports));
    assert_eq!(events.take(&exports), Scope::Full);
    events.record(&[dir.path().join("elsewhere.yaml")]);
    assert_eq!(events.take(&exports), Scope::Full);
    events.record(&[]);
    assert_eq!(events.take(&exports), Scope::Full);
    // Too many pending paths collapse into a full scan.
    let many: Vec<PathBuf> = (0..=MAX_PENDING_PATHS)
        .map(|i| exports.join(format!("f{i}.yaml")))
        .collect();
    events.record(&many);
    assert_eq!(events.take(&exports), Scope::Full);
    // A directory nobody watches is always scanned in full.
    assert_eq!(events.take(dir.path()), Scope::Full);
}

#[test]
fn watched_refresh_keeps_per_file_guarantees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(&exports).expect("mkdir");
    let a = exports.join("a.yaml");
    let b = exports.join("b.yaml");
    std::fs::write(&a, record("one", "10.0.0.1")).expect("write");
    let catalog = Catalog::new();
    let (mut yd, events) = watched(&exports);
    assert!(sync_exports(&catalog, "east", &mut yd));

    // A malformed rewrite is rejected with the file's name; the last good content stays.
    std::fs::write(
        &a,
        record("one", "10.0.0.1").replace("port: 443", "port: 70000"),
    )
    .expect("write");
    events.record(std::slice::from_ref(&a));
    assert!(!sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        vec![("one".to_string(), "10.0.0.1".to_string())]
    );
    let errors = yd.errors();
    assert!(
        errors.len() == 1 && errors[0].starts_with("exports/a.yaml"),
        "{errors:?}"
    );

    // Fixed again, with a same-size rewrite in place and the mtime put back.
    let mtime = std::fs::metadata(&a)
        .and_then(|m| m.modified())
        .expect("mtime");
    std::fs::write(&a, record("one", "10.0.0.2")).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&a)
        .and_then(|f| f.set_modified(mtime))
        .expect("set mtime");
    events.record(std::slice::from_ref(&a));
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert!(yd.errors().is_empty());
    let mtime = std::fs::metadata(&a)
        .and_then(|m| m.modified())
        .expect("mtime");
    std::fs::write(&a, record("one", "10.0.0.3")).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&a)
        .and_then(|f| f.set_modified(mtime))
        .expect("set mtime");
    events.record(std::slice::from_ref(&a));
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        vec![("one".to_string(), "10.0.0.3".to_string())]
    );

    // A record defined in two files: the later file wins; deleting it falls back.
    std::fs::write(&b, record("one", "10.9.9.9")).expect("write");
    events.record(std::slice::from_ref(&b));
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        vec![("one".to_string(), "10.9.9.9".to_string())]
    );
    std::fs::remove_file(&b).expect("rm");
    events.record(std::slice::from_ref(&b));
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        vec![("one".to_string(), "10.0.0.3".to_string())]
    );
}

/// Each writer's intermediate states, held still (the settle time is an hour): nothing the
/// file held is ever removed or changed; what only adds is applied at once; once settled,
/// a rewrite and a deletion apply.
#[test]
fn no_intermediate_state_of_any_writer_takes_anything_away() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(&exports).expect("mkdir");
    let a = exports.join("a.yaml");
    let one = record("one", "10.0.0.1");
    let both = format!("{one}---\n{}", record("two", "10.0.0.2"));
    std::fs::write(&a, &one).expect("write");
    let catalog = Catalog::new();
    let events = DirEvents::default();
    events.watch(&exports);
    let mut yd = YamlDir::new(exports.clone())
        .with_events(events.clone())
        .with_settle(Duration::from_secs(3600));
    assert!(sync_exports(&catalog, "east", &mut yd));
    let only_one = vec![("one".to_string(), "10.0.0.1".to_string())];
    let step = |what: &str, yd: &mut YamlDir<ServiceRecord>| {
        events.record(std::slice::from_ref(&a));
        sync_exports(&catalog, "east", yd);
        let got = addresses(&catalog);
        assert!(got.starts_with(&only_one), "{what}: {got:?}");
        got.len()
    };
    // In place: emptied, then a part of it, then a part that parses but lacks the record.
    std::fs::write(&a, "").expect("truncate");
    assert_eq!(step("emptied", &mut yd), 1);
    std::fs::write(&a, "   \n# comment\n").expect("blank");
    assert_eq!(step("blank", &mut yd), 1);
    std::fs::write(&a, &one[..one.len() / 2]).expect("half");
    assert_eq!(step("half written", &mut yd), 1);
    std::fs::write(&a, one.replace("10.0.0.1", "10.0.0")).expect("cut address");
    assert_eq!(step("cut in a value", &mut yd), 1);
    std::fs::write(&a, record("two", "10.0.0.2")).expect("other");
    assert_eq!(step("a record replaced", &mut yd), 1);
    // Gone (`kubectl cp` unlinks first), then created empty, then written with more.
    std::fs::remove_file(&a).expect("unlink");
    assert_eq!(step("unlinked", &mut yd), 1);
    events.all_full();
    assert_eq!(step("unlinked, full scan", &mut yd), 1);
    std::fs::write(&a, "").expect("create");
    assert_eq!(step("created empty", &mut yd), 1);
    // Only adding: applied at once.
    std::fs::write(&a, &both).expect("write");
    assert_eq!(step("written with one more", &mut yd), 2);
    // Rewritten in place, back to one record: waits (a write sets mtime = ctime, so it is
    // never taken for a finished file; a rename is `a_file_renamed_into_place_...`).
    std::fs::write(&a, &one).expect("rewrite");
    assert_eq!(step("rewritten with one less", &mut yd), 2);
    assert!(yd.next_due().is_some());

    // Settled: the rewrite applies, and so does a deletion.
    let mut yd = yd.with_settle(Duration::ZERO);
    assert_eq!(step("settled", &mut yd), 1);
    assert!(yd.next_due().is_none());
    std::fs::remove_file(&a).expect("rm");
    events.record(std::slice::from_ref(&a));
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert!(catalog.is_empty());
}

/// A file renamed into place after it was finished (its mtime older than the rename, as
/// after `mv` of a saved file, `tar`, `cp -p`) is complete: a change that takes something
/// away applies at once, without the settle time. Written in place afterwards (even
/// half-way), it waits again.
#[test]
fn a_file_renamed_into_place_after_it_was_written_applies_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(&exports).expect("mkdir");
    let a = exports.join("a.yaml");
    let both = format!(
        "{}---\n{}",
        record("one", "10.0.0.1"),
        record("two", "10.0.0.2")
    );
    std::fs::write(&a, &both).expect("write");
    let catalog = Catalog::new();
    let events = DirEvents::default();
    events.watch(&exports);
    let mut yd = YamlDir::new(exports.clone())
        .with_events(events.clone())
        .with_settle(Duration::from_secs(3600));
    assert!(sync_exports(&catalog, "east", &mut yd));
    let refresh = |yd: &mut YamlDir<ServiceRecord>| {
        events.record(std::slice::from_ref(&a));
        sync_exports(&catalog, "east", yd);
        addresses(&catalog)
    };
    let pair = |n: &str, ip: &str| (n.to_string(), ip.to_string());

    // Finished in a temporary file (its mtime a second back, so the rename is surely in a
    // later timestamp tick), then renamed over the file: one record changed, one removed.
    let tmp = dir.path().join("a.yaml.tmp");
    std::fs::write(&tmp, record("one", "10.0.0.9")).expect("tmp");
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .and_then(|f| f.set_modified(SystemTime::now() - Duration::from_secs(1)))
        .expect("set mtime");
    std::fs::rename(&tmp, &a).expect("mv");
    assert_eq!(refresh(&mut yd), vec![pair("one", "10.0.0.9")]);
    assert!(yd.next_due().is_none());

    // Written in place after that: half of it, then all of another change: both wait.
    let next = record("one", "10.0.0.7");
    std::fs::write(&a, &next[..next.len() - 4]).expect("half");
    assert_eq!(refresh(&mut yd), vec![pair("one", "10.0.0.9")]);
    std::fs::write(&a, &next).expect("in place");
    assert_eq!(refresh(&mut yd), vec![pair("one", "10.0.0.9")]);
    assert!(yd.next_due().is_some());
}

/// A ConfigMap volume's update swaps the `..data` symlink; the watcher reports only that
/// entry, and the YAML files that point through it are read again.
#[test]
fn a_configmap_symlink_swap_is_seen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exports = dir.path().join(EXPORTS_DIR);
    std::fs::create_dir_all(exports.join("..v1")).expect("mkdir");
    std::fs::write(exports.join("..v1/a.yaml"), record("one", "10.0.0.1")).expect("write");
    std::os::unix::fs::symlink("..v1", exports.join("..data")).expect("symlink");
    std::os::unix::fs::symlink("..data/a.yaml", exports.join("a.yaml")).expect("symlink");
    let catalog = Catalog::new();
    let (mut yd, events) = watched(&exports);
    assert!(sync_exports(&catalog, "east", &mut yd));
    std::fs::create_dir_all(exports.join("..v2")).expect("mkdir");
    std::fs::write(exports.join("..v2/a.yaml"), record("one", "10.0.0.9")).expect("write");
    std::os::unix::fs::symlink("..v2", exports.join("..data_tmp")).expect("symlink");
    std::fs::rename(exports.join("..data_tmp"), exports.join("..data")).expect("swap");
    events.record(&[exports.join("..data_tmp"), exports.join("..data")]);
    assert!(sync_exports(&catalog, "east", &mut yd));
    assert_eq!(
        addresses(&catalog),
        vec![("one".to_string(), "10.0.0.9".to_string())]
    );
}
