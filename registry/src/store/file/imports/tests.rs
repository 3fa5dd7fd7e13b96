use super::*;
use xcc_proto::names;

fn imported(fqdn: &str, ip: &str) -> Imported {
    let mut labels = BTreeMap::new();
    labels.insert(
        names::SERVICE_PORT_ANNOTATION.to_string(),
        "443".to_string(),
    );
    Imported {
        fqdn: fqdn.into(),
        raw_fqdn: fqdn.into(),
        endpoints: vec![Endpoint {
            address: ip.into(),
            port: 443,
        }],
        labels,
        cluster: None,
        ports: vec![],
    }
}

fn loaded(sink: &FileImportSink, remote: &str) -> Vec<(String, String)> {
    sink.load(remote)
        .expect("load")
        .into_iter()
        .map(|i| (i.fqdn, i.endpoints[0].address.to_string()))
        .collect()
}

#[tokio::test]
async fn imports_are_written_atomically_and_read_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = FileImportSink::new(dir.path(), "cross-cluster-connectivity").expect("sink");
    let mut imports = BTreeMap::new();
    imports.insert(
        "foobar.some.domain".to_string(),
        imported("foobar.some.domain", "10.0.0.1"),
    );
    sink.persist("shared-services-cls", &imports)
        .await
        .expect("persist");
    let text = std::fs::read_to_string(sink.path_for("shared-services-cls")).expect("read");
    let records: Vec<ServiceRecord> = resources::parse_documents(&text, "x").expect("parse");
    assert_eq!(records.len(), 1);
    let r = &records[0];
    // XCC v1's imported object (name, labels, annotations, owner), in file form.
    assert_eq!(
        r.metadata.name.as_deref(),
        Some("foobar.some.domain-6068d556")
    );
    assert_eq!(
        r.metadata.namespace.as_deref(),
        Some("cross-cluster-connectivity")
    );
    assert_eq!(
        r.metadata.labels,
        Some(BTreeMap::from([
            (names::IMPORTED_LABEL.to_string(), String::new()),
            (
                names::REMOTE_REGISTRY_LABEL.to_string(),
                "shared-services-cls".to_string()
            ),
        ]))
    );
    assert_eq!(r.spec.fqdn, "foobar.some.domain");
    assert_eq!(sink.load("shared-services-cls").expect("load").len(), 1);
    sink.forget("shared-services-cls").expect("forget");
    assert!(sink.load("shared-services-cls").expect("load").is_empty());
}

/// A hierarchy import names its owner cluster: the snapshot keeps it as the record's
/// `spec.origin.cluster` (with the origin's namespace and name), the journal as its own
/// field, and both read back the same; a Hamlet import names none.
#[tokio::test]
async fn the_owner_cluster_and_named_ports_survive_the_snapshot_and_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = FileImportSink::new(dir.path(), "ns").expect("sink");
    let with_owner = |fqdn: &str, ip: &str| {
        let mut i = imported(fqdn, ip);
        i.labels.insert(
            xcc_proto::mapping::ORIGIN_NAMESPACE_ANNOTATION.into(),
            "shop".into(),
        );
        i.labels.insert(
            xcc_proto::mapping::ORIGIN_NAME_ANNOTATION.into(),
            "db".into(),
        );
        i.cluster = Some("east".into());
        i.ports = crate::federation::imports::tests::sql_ports();
        i
    };
    let mut imports = BTreeMap::new();
    imports.insert("db.x.test".to_string(), with_owner("db.x.test", "10.4.0.1"));
    imports.insert("web.x.test".to_string(), imported("web.x.test", "10.4.0.9"));
    sink.persist("parent", &imports).await.expect("snapshot");
    let text = std::fs::read_to_string(sink.path_for("parent")).expect("read");
    let records: Vec<ServiceRecord> = resources::parse_documents(&text, "x").expect("parse");
    let origins: Vec<_> = records.iter().map(|r| r.spec.origin.clone()).collect();
    assert_eq!(
        origins,
        [
            Some(xcc_proto::crd::Origin {
                cluster: Some("east".into()),
                namespace: "shop".into(),
                name: "db".into(),
                kind: None,
            }),
            None
        ]
    );
    let ports: Vec<_> = records.iter().map(|r| r.spec.ports.clone()).collect();
    assert_eq!(
        ports,
        [Some(crate::federation::imports::tests::sql_ports()), None]
    );
    imports.insert(
        "db2.x.test".to_string(),
        with_owner("db2.x.test", "10.4.0.2"),
    );
    sink.persist_changes(
        "parent",
        &imports,
        &BTreeSet::from(["db2.x.test".to_string()]),
    )
    .await
    .expect("append");
    let again = FileImportSink::new(dir.path(), "ns").expect("sink");
    let mut got: Vec<Imported> = again.load("parent").expect("load");
    got.sort_by(|a, b| a.fqdn.cmp(&b.fqdn));
    assert_eq!(got, imports.into_values().collect::<Vec<_>>());
}

#[tokio::test]
async fn changes_append_only_their_own_bytes_and_replay_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = FileImportSink::new(dir.path(), "ns").expect("sink");
    let mut imports = BTreeMap::new();
    for i in 0..100 {
        let f = format!("s{i:03}.x.test");
        imports.insert(f.clone(), imported(&f, "10.0.0.1"));
    }
    sink.persist("east", &imports).await.expect("snapshot");
    let base = std::fs::metadata(sink.path_for("east"))
        .expect("meta")
        .len();
    let before = sink.bytes_written();

    // One update and one delete: two journal lines, the snapshot untouched.
    imports.insert("s001.x.test".into(), imported("s001.x.test", "10.0.0.9"));
    imports.remove("s002.x.test");
    let changed = BTreeSet::from(["s001.x.test".to_string(), "s002.x.test".to_string()]);
    sink.persist_changes("east", &imports, &changed)
        .await
        .expect("append");
    // The two lines, then zeros to the first GROW boundary (flushed with the file's size).
    let file = std::fs::read(sink.journal_path_for("east")).expect("journal");
    let lines = &file[..import_journal::end(&file)];
    assert_eq!(import_journal::changes(&file).count(), 2);
    assert_eq!(file.len() as u64, GROW);
    assert!(file[lines.len()..].iter().all(|b| *b == 0));
    assert_eq!(sink.bytes_written() - before, GROW);
    assert!(
        (lines.len() as u64) < base / 20,
        "a change costs its own size"
    );
    // The next change overwrites zeros: its own bytes only, the file's length unchanged.
    let before = sink.bytes_written();
    imports.insert("s003.x.test".into(), imported("s003.x.test", "10.0.0.8"));
    sink.persist_changes(
        "east",
        &imports,
        &BTreeSet::from(["s003.x.test".to_string()]),
    )
    .await
    .expect("append");
    let file = std::fs::read(sink.journal_path_for("east")).expect("journal");
    assert_eq!(file.len() as u64, GROW);
    assert_eq!(
        sink.bytes_written() - before,
        (import_journal::end(&file) - lines.len()) as u64
    );
    assert_eq!(
        std::fs::metadata(sink.path_for("east"))
            .expect("meta")
            .len(),
        base
    );

    // A fresh sink (a restart) reads the snapshot plus the journal.
    let again = FileImportSink::new(dir.path(), "ns").expect("sink");
    let got = loaded(&again, "east");
    assert_eq!(got.len(), 99);
    assert!(got.contains(&("s001.x.test".into(), "10.0.0.9".into())));
    assert!(got.contains(&("s003.x.test".into(), "10.0.0.8".into())));
    assert!(!got.iter().any(|(f, _)| f == "s002.x.test"));
}

/// `persist_changes` returns once the batch is in the journal: a second process reading the
/// directory (a registry restarted after kill -9: the page cache outlives the process) loads
/// every batch, whether or not a flush ran. `flush` then syncs once, covering both batches,
/// and a `flush` with nothing appended since syncs nothing.
#[tokio::test]
async fn a_batch_is_readable_when_persist_changes_returns_and_flush_covers_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let synced = Arc::new(Mutex::new(Vec::new()));
    let (log, path) = (synced.clone(), dir.path().join("imports/east.journal"));
    let sink = FileImportSink::new(dir.path(), "ns")
        .expect("sink")
        .with_syncer(move |file| {
            let bytes = std::fs::read(&path)?;
            lock(&log).push(import_journal::changes(&bytes).count());
            file.sync_data()
        });
    let mut imports = BTreeMap::new();
    let mut want = Vec::new();
    for f in ["a.x.test", "b.x.test"] {
        imports.insert(f.to_string(), imported(f, "10.0.0.1"));
        sink.persist_changes("east", &imports, &BTreeSet::from([f.to_string()]))
            .await
            .expect("append");
        want.push((f.to_string(), "10.0.0.1".to_string()));
        let restarted = FileImportSink::reader(dir.path(), "ns");
        assert_eq!(loaded(&restarted, "east"), want);
    }
    sink.flush("east").await.expect("flush");
    // The timer's flush may have run before (covering one or both batches); the last sync
    // covers both.
    let syncs = lock(&synced).clone();
    assert_eq!(syncs.last(), Some(&2), "{syncs:?}");
    sink.flush("east").await.expect("flush");
    assert_eq!(*lock(&synced), syncs, "nothing appended: no sync");
}

/// A crash in the middle of an append leaves part of a line, or a later block of it without
/// the earlier one: readers stop there, and the next writer cuts it so that nothing of it can
/// reappear after a later, shorter append.
#[tokio::test]
async fn a_torn_tail_ends_the_journal_and_is_cut_before_the_next_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = FileImportSink::new(dir.path(), "ns").expect("sink");
    let mut imports = BTreeMap::new();
    imports.insert("a.x.test".to_string(), imported("a.x.test", "10.0.0.1"));
    sink.persist_changes("east", &imports, &BTreeSet::from(["a.x.test".to_string()]))
        .await
        .expect("append");
    let path = sink.journal_path_for("east");
    let end = import_journal::end(&std::fs::read(&path).expect("read")) as u64;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    // Part of a line at the end; a gap of zeros; the end of a line and a whole one that
    // deletes `a` (a later block of the same append that reached the disk).
    file.write_all_at(br#"{"put":{"fqdn":"b.x.te"#, end)
        .expect("write");
    let mut later = vec![b'x'; 400];
    later.extend(b"\n{\"del\":\"a.x.test\"}\n");
    file.write_all_at(&later, end + 100).expect("write");
    drop(file);
    assert_eq!(
        loaded(&sink, "east"),
        [("a.x.test".into(), "10.0.0.1".into())]
    );

    // A restart, and one change shorter than what the crash left.
    drop(sink);
    let again = FileImportSink::new(dir.path(), "ns").expect("sink");
    imports.insert("c.x.test".to_string(), imported("c.x.test", "10.0.0.3"));
    again
        .persist_changes("east", &imports, &BTreeSet::from(["c.x.test".to_string()]))
        .await
        .expect("append");
    let bytes = std::fs::read(&path).expect("read");
    let end = import_journal::end(&bytes);
    assert!(bytes[end..].iter().all(|b| *b == 0), "the tail was cut");
    assert_eq!(
        loaded(&again, "east"),
        [
            ("a.x.test".into(), "10.0.0.1".into()),
            ("c.x.test".into(), "10.0.0.3".into())
        ]
    );
}

#[tokio::test]
async fn a_growing_journal_is_compacted_into_the_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Bytes, not flushes, are under test here: 12,000 real flushes would take seconds.
    let sink = FileImportSink::new(dir.path(), "ns")
        .expect("sink")
        .with_syncer(|_| Ok(()));
    let mut imports = BTreeMap::new();
    // Well past the 1 MiB floor, one change per batch as from a lock-step server.
    for i in 0..12_000 {
        let f = format!("s{i:05}.x.test");
        imports.insert(f.clone(), imported(&f, "10.0.0.1"));
        sink.persist_changes("east", &imports, &BTreeSet::from([f]))
            .await
            .expect("append");
    }
    let appended = sink.bytes_written();
    sink.settle("east").await.expect("settled");
    let base = std::fs::metadata(sink.path_for("east"))
        .expect("snapshot")
        .len();
    let journal = std::fs::metadata(sink.journal_path_for("east"))
        .expect("journal")
        .len();
    assert!(base > 0, "compacted at least once");
    assert!(
        journal < appended / 2,
        "the journal was cut: {journal} of {appended}"
    );
    assert!(
        sink.bytes_written() < 3 * (base + journal),
        "written {} for {} on disk",
        sink.bytes_written(),
        base + journal
    );
    assert_eq!(sink.load("east").expect("load").len(), 12_000);
    // And after a restart, with the appends that raced the compactions kept.
    let again = FileImportSink::new(dir.path(), "ns").expect("sink");
    assert_eq!(again.load("east").expect("load").len(), 12_000);
}

#[test]
fn leftover_temporary_files_are_removed_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let imports = dir.path().join(IMPORTS_DIR);
    std::fs::create_dir_all(&imports).expect("mkdir");
    std::fs::write(imports.join(".tmpAbC123"), "half a file").expect("write");
    std::fs::write(imports.join("east.yaml"), "").expect("write");
    let _sink = FileImportSink::new(dir.path(), "ns").expect("sink");
    let mut left: Vec<String> = std::fs::read_dir(&imports)
        .expect("read")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["east.yaml"]);
}
