//! Registries in file mode (`--store file`): XCC v1's peering cases between two registries,
//! watched export and remote files, malformed files that lose nothing, probes and metrics.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use xcc_proto::crd::ServiceRecord;
use xcc_registry::StoreConfig;
use xcc_registry::store::file::FileImportSink;

fn file_config(files: xcc_certs::reload::TlsFiles, dir: &Path) -> xcc_registry::RegistryConfig {
    let mut cfg = xcc_registry::RegistryConfig::loopback(files);
    cfg.store = StoreConfig::File {
        state_dir: dir.to_path_buf(),
        // Filesystem events drive the tests; the poll is only a fallback.
        poll: Duration::from_secs(60),
    };
    cfg
}

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, &path).expect("rename");
}

fn exported_sr(annotations: &str) -> String {
    format!(
        r#"apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: ServiceRecord
metadata:
  name: foobar.some.domain
  namespace: cross-cluster-connectivity
  labels:
    connectivity.tanzu.vmware.com/export: ""
  annotations:
{annotations}
spec:
  fqdn: foobar.some.domain
  endpoints:
  - address: 10.0.0.1
    port: 443
"#
    )
}

fn remote_rr(addr: std::net::SocketAddr) -> String {
    format!(
        r#"apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: RemoteRegistry
metadata:
  name: shared-services-cls
  namespace: cross-cluster-connectivity
spec:
  address: "{addr}"
  tlsConfig:
    serverCA: ""
    serverName: localhost
"#
    )
}

async fn imported_records(west_dir: &Path, west: &xcc_registry::Registry) -> Vec<ServiceRecord> {
    wait_catalog(&west.catalog, "import present", |c| {
        imported_fqdns(c, "shared-services-cls") == ["foobar.some.domain"]
    })
    .await;
    // The import files (snapshot + journal) are written before the catalog is updated.
    FileImportSink::reader(west_dir, "cross-cluster-connectivity")
        .records("shared-services-cls")
        .expect("import files readable")
}

/// An imported record's annotations without the exporter's propagation stamp, which every
/// import carries (checked here: a valid stamp).
fn without_stamp(
    annotations: &Option<BTreeMap<String, String>>,
) -> Option<BTreeMap<String, String>> {
    let mut a = annotations.clone()?;
    let stamp = a
        .remove(xcc_proto::propagation::CHANGED_AT_ANNOTATION)
        .expect("the import carries the exporter's stamp");
    xcc_proto::propagation::parse_stamp(&stamp).expect("a valid stamp");
    Some(a)
}

/// XCC v1's peering cases in one run (the imported record; the VIP travels; an unprefixed
/// annotation does not): the exporter's annotations change, the importer's record follows.
#[tokio::test]
async fn p01_p02_p03_imported_record_shape() {
    let pki = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    write(
        east_dir.path(),
        "exports/foobar.yaml",
        &exported_sr("    connectivity.tanzu.vmware.com/service-port: \"443\""),
    );
    let (east, _ec) = start_with(file_config(pki.cluster("east"), east_dir.path())).await;
    assert_eq!(east.catalog.len(), 1, "exports loaded before start returns");
    write(
        west_dir.path(),
        "remotes/shared-services-cls.yaml",
        &remote_rr(east.hamlet_addr),
    );
    let (west, _wc) = start_with(file_config(pki.cluster("west"), west_dir.path())).await;

    // The imported record: name, labels, annotations, owner, spec.
    let records = imported_records(west_dir.path(), &west).await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
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
            (
                "connectivity.tanzu.vmware.com/imported".to_string(),
                String::new()
            ),
            (
                "connectivity.tanzu.vmware.com/remote-registry".to_string(),
                "shared-services-cls".to_string()
            ),
        ]))
    );
    assert_eq!(
        without_stamp(&r.metadata.annotations),
        Some(BTreeMap::from([(
            "connectivity.tanzu.vmware.com/service-port".to_string(),
            "443".to_string()
        )]))
    );
    assert_eq!(r.spec.fqdn, "foobar.some.domain");
    assert_eq!(r.spec.endpoints.len(), 1);
    assert_eq!(
        (
            r.spec.endpoints[0].address.as_str(),
            r.spec.endpoints[0].port
        ),
        ("10.0.0.1", 443)
    );

    // Add the VIP and an unprefixed annotation on the exporter.
    write(
        east_dir.path(),
        "exports/foobar.yaml",
        &exported_sr(
            "    connectivity.tanzu.vmware.com/service-port: \"443\"\n    connectivity.tanzu.vmware.com/vip: \"1.2.3.4\"\n    foobar: \"\"",
        ),
    );
    wait_catalog(&west.catalog, "vip imported", |c| {
        c.by_fqdn("foobar.some.domain")
            .iter()
            .any(|e| e.labels.contains_key("connectivity.tanzu.vmware.com/vip"))
    })
    .await;
    let records = FileImportSink::reader(west_dir.path(), "cross-cluster-connectivity")
        .records("shared-services-cls")
        .expect("read");
    assert_eq!(
        without_stamp(&records[0].metadata.annotations),
        Some(BTreeMap::from([
            (
                "connectivity.tanzu.vmware.com/service-port".to_string(),
                "443".to_string()
            ),
            (
                "connectivity.tanzu.vmware.com/vip".to_string(),
                "1.2.3.4".to_string()
            ),
        ]))
    );
}

/// A malformed export file is reported with its name and field and changes nothing; fixing it
/// applies; deleting it removes the export. Removing the remote file removes its imports.
#[tokio::test]
async fn malformed_files_lose_nothing_and_removal_cleans_up() {
    let pki = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    let good = exported_sr("    connectivity.tanzu.vmware.com/service-port: \"443\"");
    write(east_dir.path(), "exports/foobar.yaml", &good);
    let (east, _ec) = start_with(file_config(pki.cluster("east"), east_dir.path())).await;
    write(
        west_dir.path(),
        "remotes/shared-services-cls.yaml",
        &remote_rr(east.hamlet_addr),
    );
    let (west, _wc) = start_with(file_config(pki.cluster("west"), west_dir.path())).await;
    imported_records(west_dir.path(), &west).await;

    let mut errors_rx = east.catalog.subscribe();
    write(
        east_dir.path(),
        "exports/foobar.yaml",
        &good.replace("port: 443", "port: \"x\""),
    );
    // Wait for the rejection to be recorded (no catalog event will come).
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut fs_events = east.file_errors.subscribe();
    while east.file_errors.get().is_empty() {
        tokio::time::timeout_at(deadline, fs_events.changed())
            .await
            .expect("rejection reported in time")
            .expect("alive");
    }
    let errors = east.file_errors.get();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("exports/foobar.yaml")
            && errors[0].contains("spec.endpoints[0].port"),
        "{errors:?}"
    );
    assert_eq!(east.catalog.len(), 1, "the last good export stays");
    assert!(errors_rx.try_recv().is_err(), "no catalog change");
    assert_eq!(
        imported_fqdns(&west.catalog, "shared-services-cls"),
        ["foobar.some.domain"]
    );

    std::fs::remove_file(east_dir.path().join("exports/foobar.yaml")).expect("rm");
    wait_catalog(&west.catalog, "import removed", |c| {
        imported_fqdns(c, "shared-services-cls").is_empty()
    })
    .await;
    assert!(east.file_errors.get().is_empty());

    write(east_dir.path(), "exports/foobar.yaml", &good);
    wait_catalog(&west.catalog, "import back", |c| {
        imported_fqdns(c, "shared-services-cls").len() == 1
    })
    .await;
    std::fs::remove_file(west_dir.path().join("remotes/shared-services-cls.yaml")).expect("rm");
    wait_catalog(&west.catalog, "remote removed", |c| {
        imported_fqdns(c, "shared-services-cls").is_empty()
    })
    .await;
    for file in ["shared-services-cls.yaml", "shared-services-cls.journal"] {
        assert!(
            !west_dir.path().join("imports").join(file).exists(),
            "{file}"
        );
    }
}

/// Restarting the importer loses nothing: imports come back from disk immediately and are
/// confirmed by the next snapshot.
#[tokio::test]
async fn importer_restart_keeps_imports() {
    let pki = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    write(
        east_dir.path(),
        "exports/foobar.yaml",
        &exported_sr("    connectivity.tanzu.vmware.com/service-port: \"443\""),
    );
    let (east, _ec) = start_with(file_config(pki.cluster("east"), east_dir.path())).await;
    write(
        west_dir.path(),
        "remotes/shared-services-cls.yaml",
        &remote_rr(east.hamlet_addr),
    );
    let west_files = pki.cluster("west");
    let (west, wc) = start_with(file_config(west_files.clone(), west_dir.path())).await;
    imported_records(west_dir.path(), &west).await;
    wc.cancel();
    west.shutdown().await.expect("clean shutdown");

    let (west2, _wc2) = start_with(file_config(west_files, west_dir.path())).await;
    assert_eq!(
        imported_fqdns(&west2.catalog, "shared-services-cls"),
        ["foobar.some.domain"],
        "loaded from disk before any connection"
    );
    wait_peer(&west2, "shared-services-cls", "synced", |p| {
        p.last_sync().is_some()
    })
    .await;
    assert_eq!(
        imported_fqdns(&west2.catalog, "shared-services-cls"),
        ["foobar.some.domain"]
    );
}

/// `/healthz`, `/readyz` and `/metrics` on the plain-HTTP probe listener.
#[tokio::test]
async fn probes_and_metrics() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new("xcc.test");
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("east"));
    cfg.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let (east, _c) = start_with(cfg).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    let addr = east.metrics_addr.expect("metrics bound");
    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }
    assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    let metrics = get(addr, "/metrics").await;
    assert!(metrics.contains("xcc_catalog_services 1"), "{metrics}");
    assert!(
        metrics.contains("xcc_certificate_reloads_total"),
        "{metrics}"
    );
}

/// An export named `name` (FQDN `<name>.some.domain`).
fn named_sr(name: &str) -> String {
    exported_sr("    connectivity.tanzu.vmware.com/service-port: \"443\"")
        .replace("foobar.some.domain", &format!("{name}.some.domain"))
}

/// A power loss takes the journal's unflushed tail (simulated by cutting the journal after its
/// first line once the importer stopped): the lost lines are two imports and a removal. The next
/// session loads what is left, then the server's snapshot restores what was lost and the sweep
/// removes only what the server no longer has.
#[tokio::test]
async fn a_lost_journal_tail_is_restored_by_the_next_snapshot() {
    let pki = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    for name in ["a", "b", "c"] {
        write(
            east_dir.path(),
            &format!("exports/{name}.yaml"),
            &named_sr(name),
        );
    }
    let (east, _ec) = start_with(file_config(pki.cluster("east"), east_dir.path())).await;
    write(
        west_dir.path(),
        "remotes/shared-services-cls.yaml",
        &remote_rr(east.hamlet_addr),
    );
    let west_files = pki.cluster("west");
    let (west, wc) = start_with(file_config(west_files.clone(), west_dir.path())).await;
    let fqdns = |names: &[&str]| -> Vec<String> {
        names.iter().map(|n| format!("{n}.some.domain")).collect()
    };
    wait_catalog(&west.catalog, "a, b, c imported", |c| {
        imported_fqdns(c, "shared-services-cls") == fqdns(&["a", "b", "c"])
    })
    .await;
    std::fs::remove_file(east_dir.path().join("exports/c.yaml")).expect("rm");
    wait_catalog(&west.catalog, "c removed", |c| {
        imported_fqdns(c, "shared-services-cls") == fqdns(&["a", "b"])
    })
    .await;
    wc.cancel();
    west.shutdown().await.expect("clean shutdown");

    // Keep the journal's first line only: the puts of b and c and the removal of c are lost.
    let sink = FileImportSink::reader(west_dir.path(), "cross-cluster-connectivity");
    let journal = sink.journal_path_for("shared-services-cls");
    let bytes = std::fs::read(&journal).expect("journal");
    let text =
        String::from_utf8_lossy(&bytes[..xcc_proto::import_journal::end(&bytes)]).to_string();
    assert_eq!(
        text.lines().count(),
        4,
        "put a, b, c and del c in the journal: {text}"
    );
    let first = text.find('\n').expect("a line") + 1;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .expect("open")
        .set_len(first as u64)
        .expect("truncate");
    let names = |sink: &FileImportSink| -> Vec<String> {
        let mut v: Vec<String> = sink
            .load("shared-services-cls")
            .expect("load")
            .into_iter()
            .map(|i| i.fqdn)
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&sink), fqdns(&["a"]), "the tail is gone");

    let (west2, _wc2) = start_with(file_config(west_files, west_dir.path())).await;
    assert_eq!(
        imported_fqdns(&west2.catalog, "shared-services-cls"),
        fqdns(&["a"]),
        "loaded from disk before any connection"
    );
    wait_peer(&west2, "shared-services-cls", "synced", |p| {
        p.last_sync().is_some()
    })
    .await;
    assert_eq!(
        imported_fqdns(&west2.catalog, "shared-services-cls"),
        fqdns(&["a", "b"])
    );
    assert_eq!(names(&sink), fqdns(&["a", "b"]), "restored on disk too");
}

/// Every `Delete` the catalog announced since `rx` subscribed (events it had to drop count as
/// unknown, so they fail the test too).
fn deletes(
    rx: &mut tokio::sync::broadcast::Receiver<xcc_registry::catalog::CatalogEvent>,
) -> Vec<String> {
    let mut out = vec![];
    loop {
        match rx.try_recv() {
            Ok(xcc_registry::catalog::CatalogEvent::Delete(e)) => out.push(format!("{:?}", e.key)),
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::TryRecvError::Empty) => return out,
            Err(e) => {
                out.push(format!("events lost: {e}"));
                return out;
            }
        }
    }
}

/// Write `exports/marker-<n>.yaml` (atomically) and wait until the catalog holds it, twice: the
/// watch loop reads every pending change of both directories in one pass, so once the second
/// marker is in, the pass that saw the state written before the first one is complete.
async fn wait_seen(dir: &Path, reg: &xcc_registry::Registry, n: &mut u32) {
    for _ in 0..2 {
        *n += 1;
        let name = format!("marker-{n}.some.domain");
        write(
            dir,
            &format!("exports/marker-{n}.yaml"),
            &exported_sr("    a: b").replace("foobar.some.domain", &name),
        );
        wait_catalog(&reg.catalog, "marker loaded", |c| {
            c.list(&Default::default())
                .iter()
                .any(|e| e.key.name.as_str() == name)
        })
        .await;
    }
}

type Events = tokio::sync::broadcast::Receiver<xcc_registry::catalog::CatalogEvent>;

fn check(
    west: &xcc_registry::Registry,
    step: &str,
    east_events: &mut Events,
    west_events: &mut Events,
) {
    assert_eq!(
        deletes(east_events),
        Vec::<String>::new(),
        "{step}: exporter"
    );
    assert_eq!(
        deletes(west_events),
        Vec::<String>::new(),
        "{step}: importer"
    );
    let imported = imported_fqdns(&west.catalog, "shared-services-cls");
    assert!(
        imported.iter().any(|f| f == "foobar.some.domain"),
        "{step}: {imported:?}"
    );
}

/// No way of writing a watched file removes what it held for a moment: in place (`cat > f`,
/// which empties it first, and a write caught half-way), truncate then write, an editor's
/// temporary file renamed over it, a `kubectl cp` (unlink, then create), a ConfigMap volume's
/// symlink swap, and an invalid rewrite. Neither the exporter's nor the importer's catalog ever
/// announces a removal, and the importer's journal never records one; deleting a file still
/// removes.
#[tokio::test]
async fn no_writer_pattern_removes_anything_for_a_moment() {
    let pki = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    let good = exported_sr("    connectivity.tanzu.vmware.com/service-port: \"443\"");
    write(east_dir.path(), "exports/foobar.yaml", &good);
    let (east, _ec) = start_with(file_config(pki.cluster("east"), east_dir.path())).await;
    let remote = remote_rr(east.hamlet_addr);
    let remotes = west_dir.path().join("remotes");
    write(west_dir.path(), "remotes/shared-services-cls.yaml", &remote);
    let (west, _wc) = start_with(file_config(pki.cluster("west"), west_dir.path())).await;
    imported_records(west_dir.path(), &west).await;
    let mut east_events = east.catalog.subscribe();
    let mut west_events = west.catalog.subscribe();
    let (mut en, mut wn) = (0, 0);
    let export = east_dir.path().join("exports/foobar.yaml");
    // In place: emptied (`cat > f` opens with O_TRUNC), then half written, then finished.
    std::fs::File::create(&export).expect("truncate");
    wait_seen(east_dir.path(), &east, &mut en).await;
    check(
        &west,
        "emptied in place",
        &mut east_events,
        &mut west_events,
    );
    std::fs::write(&export, &good[..good.len() / 2]).expect("half");
    wait_seen(east_dir.path(), &east, &mut en).await;
    check(&west, "half written", &mut east_events, &mut west_events);
    std::fs::write(&export, &good).expect("write");
    wait_seen(east_dir.path(), &east, &mut en).await;
    check(
        &west,
        "rewritten in place",
        &mut east_events,
        &mut west_events,
    );

    // Truncate, then write into the same open file.
    {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&export)
            .expect("open");
        f.set_len(0).expect("truncate");
        f.sync_all().expect("sync");
        wait_seen(east_dir.path(), &east, &mut en).await;
        check(&west, "truncated", &mut east_events, &mut west_events);
        f.write_all(good.as_bytes()).expect("write");
    }
    wait_seen(east_dir.path(), &east, &mut en).await;
    check(
        &west,
        "truncated then written",
        &mut east_events,
        &mut west_events,
    );

    // An editor's save: a temporary file renamed over the original.
    std::fs::write(east_dir.path().join("exports/.foobar.yaml.swp"), &good).expect("tmp");
    std::fs::rename(east_dir.path().join("exports/.foobar.yaml.swp"), &export).expect("mv");
    wait_seen(east_dir.path(), &east, &mut en).await;
    check(&west, "editor save", &mut east_events, &mut west_events);

    // `kubectl cp` (tar): unlink, then create and write. (Whether the registry looks while the
    // file is gone depends on timing; the unit tests hold that state still.)
    std::fs::remove_file(&export).expect("unlink");
    std::fs::File::create(&export).expect("create");
    wait_seen(east_dir.path(), &east, &mut en).await;
    check(&west, "created empty", &mut east_events, &mut west_events);
    std::fs::write(&export, &good).expect("write");
    wait_seen(east_dir.path(), &east, &mut en).await;
    check(&west, "copied", &mut east_events, &mut west_events);

    // The importer's remote, in place: emptied, then an invalid version (the last good one stays
    // and its remote connected).
    let remote_file = remotes.join("shared-services-cls.yaml");
    std::fs::File::create(&remote_file).expect("truncate");
    wait_seen(west_dir.path(), &west, &mut wn).await;
    check(
        &west,
        "remote emptied in place",
        &mut east_events,
        &mut west_events,
    );
    let typo = remote.replace("address:", "adress:");
    std::fs::write(&remote_file, &typo).expect("typo");
    let mut errors = west.file_errors.subscribe();
    let deadline = tokio::time::Instant::now() + WAIT;
    while west.file_errors.get().is_empty() {
        tokio::time::timeout_at(deadline, errors.changed())
            .await
            .expect("rejection reported in time")
            .expect("alive");
    }
    let errs = west.file_errors.get();
    assert!(
        errs.len() == 1 && errs[0].starts_with("remotes/shared-services-cls.yaml"),
        "{errs:?}"
    );
    check(&west, "remote invalid", &mut east_events, &mut west_events);

    // Now as a ConfigMap volume lays it out (`r.yaml -> ..data/r.yaml`, `..data -> ..v1`), still
    // invalid; then the kubelet's swap of `..data` to a fixed version clears the rejection.
    std::fs::create_dir_all(remotes.join("..v1")).expect("mkdir");
    std::fs::write(remotes.join("..v1/shared-services-cls.yaml"), &typo).expect("write");
    std::os::unix::fs::symlink("..v1", remotes.join("..data")).expect("symlink");
    std::os::unix::fs::symlink("..data/shared-services-cls.yaml", remotes.join("link.tmp"))
        .expect("symlink");
    std::fs::rename(remotes.join("link.tmp"), &remote_file).expect("link over the file");
    std::fs::create_dir_all(remotes.join("..v2")).expect("mkdir");
    std::fs::write(remotes.join("..v2/shared-services-cls.yaml"), &remote).expect("write");
    std::os::unix::fs::symlink("..v2", remotes.join("..data_tmp")).expect("symlink");
    std::fs::rename(remotes.join("..data_tmp"), remotes.join("..data")).expect("swap");
    std::fs::remove_dir_all(remotes.join("..v1")).expect("rm old");
    while !west.file_errors.get().is_empty() {
        tokio::time::timeout_at(deadline, errors.changed())
            .await
            .expect("swapped-in remote read in time")
            .expect("alive");
    }
    wait_seen(west_dir.path(), &west, &mut wn).await;
    check(&west, "ConfigMap swap", &mut east_events, &mut west_events);

    // The importer's journal never recorded a removal.
    let journal = std::fs::read(west_dir.path().join("imports/shared-services-cls.journal"))
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&journal);
    assert!(!text.contains("\"del\""), "{text}");

    // Deleting the file is what removes.
    std::fs::remove_file(&export).expect("rm");
    wait_catalog(&west.catalog, "import removed", |c| {
        !imported_fqdns(c, "shared-services-cls")
            .iter()
            .any(|f| f == "foobar.some.domain")
    })
    .await;
}

/// A `--state-dir` that does not exist is created, with a WARN saying so (a typo in the path
/// would otherwise run an empty registry without a word); an existing one is not reported.
#[tokio::test]
async fn a_missing_state_dir_is_created_with_a_warning() {
    let logs = Captured::default();
    let _guard = logs.start();
    let pki = Pki::new("xcc.test");
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("typo/state");
    let needle = "--state-dir did not exist; created it empty (no exports, no remotes)";
    let (east, cancel) = start_with(file_config(pki.cluster("east"), &state)).await;
    assert!(state.join("exports").is_dir() && state.join("remotes").is_dir());
    let warned = logs.warnings(needle);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("typo/state"), "{warned:?}");
    let existing = dir.path().join("west");
    std::fs::create_dir_all(&existing).expect("mkdir");
    let (_west, _wc) = start_with(file_config(pki.cluster("west"), &existing)).await;
    assert_eq!(
        logs.warnings(needle).len(),
        1,
        "an existing --state-dir is not reported"
    );
    drop((east, cancel));
}

/// `xcc admin explain` on a record the registry imported says where it came from (the remote,
/// its address, the server's identity) and who decided (the exporter's checks), instead of
/// "not in the subtree"; a name it holds neither way is still NOT_FOUND.
#[tokio::test]
async fn admin_explain_knows_imports() {
    use xcc_proto::xcc::admin::v1 as api;
    let pki = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    write(
        east_dir.path(),
        "exports/foobar.yaml",
        &exported_sr("    connectivity.tanzu.vmware.com/service-port: \"443\""),
    );
    let (east, _ec) = start_with(file_config(pki.cluster("east"), east_dir.path())).await;
    write(
        west_dir.path(),
        "remotes/shared-services-cls.yaml",
        &remote_rr(east.hamlet_addr),
    );
    let (west, _wc) = start_with(file_config(pki.cluster("west"), west_dir.path())).await;
    imported_records(west_dir.path(), &west).await;
    let tls = xcc_certs::reload::ReloadingTls::load(pki.admin("alice")).expect("admin TLS");
    let mut admin =
        xcc_registry::admin::connect(tls, &west.admin_addr.to_string(), Some("localhost".into()))
            .await
            .expect("admin API");
    let ask = |fqdn: &str| api::ResolveRequest {
        fqdn: fqdn.into(),
        ..Default::default()
    };
    let d = admin
        .explain(ask("foobar.some.domain"))
        .await
        .expect("explain")
        .into_inner();
    assert!(d.found && d.allowed, "{d:?}");
    assert_eq!(d.condition, api::Condition::Granted as i32);
    // A flat import is keyed by the remote it came through.
    assert_eq!(d.owner_cluster, "shared-services-cls");
    assert_eq!(d.resolver_cluster, "shared-services-cls");
    assert!(
        d.reason.starts_with(&format!(
            "imported from remote/shared-services-cls via RemoteRegistry shared-services-cls ({}, Connected, server identity east): shared-services-cls's Hamlet server sent it to west",
            east.hamlet_addr
        )),
        "{}",
        d.reason
    );
    let d = admin
        .explain(ask("nothing.some.domain"))
        .await
        .expect("explain")
        .into_inner();
    assert!(!d.found && !d.allowed, "{d:?}");
    assert_eq!(d.condition, api::Condition::NotFound as i32);
}

/// Per-peer metrics on both ends of an import: west's link to east and east's consumer west,
/// each labelled with the direction the records flow.
#[tokio::test]
async fn per_peer_metrics_on_both_ends() {
    let pki = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    write(
        east_dir.path(),
        "exports/foobar.yaml",
        &exported_sr("    connectivity.tanzu.vmware.com/service-port: \"443\""),
    );
    let mut east_cfg = file_config(pki.cluster("east"), east_dir.path());
    east_cfg.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let (east, _ec) = start_with(east_cfg).await;
    write(
        west_dir.path(),
        "remotes/shared-services-cls.yaml",
        &remote_rr(east.hamlet_addr),
    );
    let mut west_cfg = file_config(pki.cluster("west"), west_dir.path());
    west_cfg.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let (west, _wc) = start_with(west_cfg).await;
    imported_records(west_dir.path(), &west).await;
    wait_peer(&west, "shared-services-cls", "synced", |p| {
        p.last_sync().is_some()
    })
    .await;

    let w = http_get(west.metrics_addr.expect("west metrics"), "/metrics").await;
    let imp = r#"{direction="import",remote="shared-services-cls",source_cluster="east",target_cluster="west"}"#;
    assert!(w.contains(&format!("xcc_peer_up{imp} 1")), "{w}");
    assert!(w.contains(&format!("xcc_peer_records{imp} 1")), "{w}");
    assert!(
        w.contains(&format!("xcc_peer_last_sync_timestamp_seconds{imp} ")),
        "{w}"
    );
    let e = http_get(east.metrics_addr.expect("east metrics"), "/metrics").await;
    let exp = r#"{direction="export",remote="",source_cluster="east",target_cluster="west"}"#;
    assert!(e.contains(&format!("xcc_peer_up{exp} 1")), "{e}");
    assert!(e.contains(&format!("xcc_peer_streams{exp} 1")), "{e}");
}

/// A plain HTTP/1.1 GET of the probe listener (no TLS: it carries no catalog data).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

/// `remote_rr` with `serverCA` holding `ca_pem` (base64, as the CRD wants it) and `server_name`.
fn remote_rr_with_ca(addr: std::net::SocketAddr, ca_pem: &str, server_name: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    remote_rr(addr)
        .replace("serverCA: \"\"", &format!("serverCA: \"{ca}\""))
        .replace(
            "serverName: localhost",
            &format!("serverName: {server_name}"),
        )
}

/// A RemoteRegistry's `serverCA` and `serverName` apply to the next connection, and no change of
/// them removes an import: east serves a certificate of CA A. West trusts A (its own bundle),
/// then only B (the new connection is refused: unknown issuer), then A and B under a name east's
/// certificate does not carry (refused: wrong name), then a `serverCA` that is no certificate at
/// all (the file is rejected, the last good spec stays), then A again under the right name
/// (connected and synced, and a change on east arrives). Neither catalog announces a removal at
/// any step and west's import files keep the record.
#[tokio::test]
async fn a_server_ca_or_name_change_applies_to_the_next_connection_and_keeps_imports() {
    let pki = Pki::new("xcc.test");
    let other = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    write(
        east_dir.path(),
        "exports/foobar.yaml",
        &exported_sr("    connectivity.tanzu.vmware.com/service-port: \"443\""),
    );
    let (east, _ec) = start_with(file_config(pki.cluster("east"), east_dir.path())).await;
    let rr = "remotes/shared-services-cls.yaml";
    write(west_dir.path(), rr, &remote_rr(east.hamlet_addr));
    let mut west_cfg = file_config(pki.cluster("west"), west_dir.path());
    west_cfg.client.backoff = xcc_registry::hamlet::client::Backoff {
        min: Duration::from_millis(20),
        max: Duration::from_millis(100),
    };
    let (west, _wc) = start_with(west_cfg).await;
    imported_records(west_dir.path(), &west).await;
    wait_peer(&west, "shared-services-cls", "synced", |p| {
        p.last_sync().is_some()
    })
    .await;
    let mut east_events = east.catalog.subscribe();
    let mut west_events = west.catalog.subscribe();
    let on_disk = || {
        FileImportSink::reader(west_dir.path(), "cross-cluster-connectivity")
            .records("shared-services-cls")
            .expect("import files readable")
            .iter()
            .map(|r| r.spec.fqdn.clone())
            .collect::<Vec<_>>()
    };
    let refused = |west: &xcc_registry::Registry| {
        west.peers
            .list()
            .into_iter()
            .find(|p| p.name == "shared-services-cls")
            .map(|p| p.last_error())
            .unwrap_or_default()
    };

    // Only B: the next connection verifies east against B and fails.
    write(
        west_dir.path(),
        rr,
        &remote_rr_with_ca(east.hamlet_addr, other.ca.cert_pem(), "localhost"),
    );
    wait_peer(&west, "shared-services-cls", "refused under B", |p| {
        !p.last_error().is_empty()
    })
    .await;
    let error = refused(&west);
    assert!(
        error.starts_with(&format!("refused server {}", east.hamlet_addr))
            && error.contains("(unknown CA;"),
        "{error}"
    );
    check(&west, "only B", &mut east_events, &mut west_events);
    assert_eq!(on_disk(), ["foobar.some.domain"], "only B");

    // A and B, under a name east's certificate does not carry.
    let both = format!("{}{}", pki.ca.cert_pem(), other.ca.cert_pem());
    write(
        west_dir.path(),
        rr,
        &remote_rr_with_ca(east.hamlet_addr, &both, "east.elsewhere.test"),
    );
    wait_peer(&west, "shared-services-cls", "refused by name", |p| {
        p.last_error().contains("(name mismatch)")
    })
    .await;
    check(&west, "wrong name", &mut east_events, &mut west_events);
    assert_eq!(on_disk(), ["foobar.some.domain"], "wrong name");

    // A serverCA that holds no certificate: rejected with the file's name, nothing changes.
    write(
        west_dir.path(),
        rr,
        &remote_rr_with_ca(east.hamlet_addr, "not a certificate", "localhost"),
    );
    let mut fs_events = west.file_errors.subscribe();
    tokio::time::timeout(WAIT, async {
        while west.file_errors.get().is_empty() {
            fs_events.changed().await.expect("alive");
        }
    })
    .await
    .expect("rejection reported in time");
    let errors = west.file_errors.get();
    assert!(
        errors.len() == 1
            && errors[0].starts_with(rr)
            && errors[0].contains("spec.tlsConfig.serverCA"),
        "{errors:?}"
    );
    check(&west, "bad serverCA", &mut east_events, &mut west_events);

    // A under the right name: connected, resynced, and east's next change arrives.
    write(
        west_dir.path(),
        rr,
        &remote_rr_with_ca(east.hamlet_addr, pki.ca.cert_pem(), "localhost"),
    );
    wait_peer(&west, "shared-services-cls", "connected under A", |p| {
        p.last_error().is_empty() && p.state() == xcc_registry::peers::PeerState::Connected
    })
    .await;
    assert!(west.file_errors.get().is_empty());
    write(east_dir.path(), "exports/second.yaml", &named_sr("second"));
    wait_catalog(&west.catalog, "second imported", |c| {
        imported_fqdns(c, "shared-services-cls").len() == 2
    })
    .await;
    check(&west, "back on A", &mut east_events, &mut west_events);
    assert_eq!(
        on_disk(),
        ["foobar.some.domain", "second.some.domain"],
        "back on A"
    );
    assert_eq!(west.metrics.client_stale_removed.get(), 0);
}

/// `xcc_propagation_seconds_count` for the remote `shared-services-cls` (0 when absent).
fn propagation_count(metrics: &str) -> u64 {
    let series = "xcc_propagation_seconds_count{source_cluster=\"shared-services-cls\"} ";
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

/// The import of `foobar.some.domain` at `west` has endpoint `address`.
async fn import_has(west: &xcc_registry::Registry, address: &str) {
    wait_catalog(&west.catalog, address, |c| {
        c.by_fqdn("foobar.some.domain")
            .iter()
            .any(|e| e.endpoints.iter().any(|ep| ep.address == address))
    })
    .await;
}

/// The exporter stamps each change; the importer observes `xcc_propagation_seconds` once per
/// change that arrives live — not for the snapshot it started with, not for the snapshot the
/// exporter re-sends after a restart (which stamps its unchanged record anew).
#[tokio::test]
async fn propagation_latency_counts_live_changes_only() {
    let pki = Pki::new("xcc.test");
    let east_dir = tempfile::tempdir().expect("tempdir");
    let west_dir = tempfile::tempdir().expect("tempdir");
    let port = "    connectivity.tanzu.vmware.com/service-port: \"443\"";
    write(east_dir.path(), "exports/foobar.yaml", &exported_sr(port));
    let east_files = pki.cluster("east");
    let (east, ec) = start_with(file_config(east_files.clone(), east_dir.path())).await;
    let east_addr = east.hamlet_addr;
    write(
        west_dir.path(),
        "remotes/shared-services-cls.yaml",
        &remote_rr(east_addr),
    );
    let mut west_cfg = file_config(pki.cluster("west"), west_dir.path());
    west_cfg.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    let (west, _wc) = start_with(west_cfg).await;
    let metrics = west.metrics_addr.expect("west metrics");
    let records = imported_records(west_dir.path(), &west).await;
    wait_peer(&west, "shared-services-cls", "synced", |p| {
        p.last_sync().is_some()
    })
    .await;

    // The stamp travelled as the record's annotation, exactly as the exporter set it.
    let stamp = xcc_proto::propagation::CHANGED_AT_ANNOTATION;
    let exported = east.catalog.by_fqdn("foobar.some.domain");
    let sent = exported[0]
        .labels
        .get(stamp)
        .expect("the export is stamped");
    let annotations = records[0].metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(stamp).map(String::as_str), Some(sent));
    // The initial snapshot is no propagation.
    let m = http_get(metrics, "/metrics").await;
    assert_eq!(propagation_count(&m), 0, "{m}");

    // Two live changes: two observations.
    for (n, address) in ["10.0.0.2", "10.0.0.3"].into_iter().enumerate() {
        write(
            east_dir.path(),
            "exports/foobar.yaml",
            &exported_sr(port).replace("10.0.0.1", address),
        );
        import_has(&west, address).await;
        let m = http_get(metrics, "/metrics").await;
        assert_eq!(propagation_count(&m), n as u64 + 1, "{m}");
    }
    let m = http_get(metrics, "/metrics").await;
    assert!(
        m.contains(
            "xcc_propagation_seconds_bucket{le=\"60.0\",source_cluster=\"shared-services-cls\"} 2"
        ),
        "both within a minute: {m}"
    );
    assert!(
        !m.contains("xcc_propagation_clock_skew_total{source_cluster=\"shared-services-cls\"}"),
        "one clock, no skew: {m}"
    );

    // The exporter restarts on the same address: its unchanged record is stamped anew and sent
    // in the snapshot of the new stream. Nothing changed, nothing is observed.
    ec.cancel();
    east.shutdown().await.expect("clean shutdown");
    let mut east_cfg = file_config(east_files, east_dir.path());
    east_cfg.hamlet_listen = east_addr;
    // A connection made from here on is to the new exporter. (Not "a sync later than the
    // last one": the client marks every live batch synced, and it runs on its own thread, so
    // the mark of the last change above may land after the test read it.)
    let restarting = std::time::SystemTime::now();
    let (east2, _ec2) = start_with(east_cfg).await;
    let restamped = east2.catalog.by_fqdn("foobar.some.domain")[0]
        .labels
        .get(stamp)
        .expect("stamped")
        .to_string();
    wait_peer(
        &west,
        "shared-services-cls",
        "synced with the new exporter",
        |p| {
            p.connected_since()
                .is_some_and(|c| c > restarting && p.last_sync().is_some_and(|t| t >= c))
        },
    )
    .await;
    let m = http_get(metrics, "/metrics").await;
    assert_eq!(
        propagation_count(&m),
        2,
        "a re-sent snapshot is no propagation: {m}"
    );
    let held = west
        .catalog
        .by_fqdn("foobar.some.domain")
        .iter()
        .find_map(|e| e.labels.get(stamp).map(str::to_string));
    assert_ne!(
        held.as_deref(),
        Some(restamped.as_str()),
        "a new stamp alone does not rewrite the import"
    );

    // The stream after the reconnect carries live changes again.
    write(
        east_dir.path(),
        "exports/foobar.yaml",
        &exported_sr(port).replace("10.0.0.1", "10.0.0.4"),
    );
    import_has(&west, "10.0.0.4").await;
    let m = http_get(metrics, "/metrics").await;
    assert_eq!(propagation_count(&m), 3, "{m}");
}
