//! Interop with the original Go Hamlet peers (vmware/hamlet `pkg/server` and `pkg/client`, as the
//! programs in `../shared/hamlet-reference`), both directions, over mTLS on 127.0.0.1 with
//! certificates from xcc's own PKI (what `xcc certs` writes).
//!
//! The peers are found through `XCC_HAMLET_REFERENCE` (a directory holding the decompressed
//! `hamlet-go-fileserver` and `hamlet-go-jsonclient`; `.ci/hamlet.sh` prepares it). Without the
//! variable each test prints a SKIP line and passes; with it, a peer that cannot run fails the test.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use xcc_certs::reload::TlsFiles;
use xcc_registry::catalog::ServiceKey;
use xcc_registry::hamlet::client::Backoff;

const ENV: &str = "XCC_HAMLET_REFERENCE";

/// The directory with the reference peers, or `None` (after a SKIP line) when not configured.
fn reference_dir(test: &str) -> Option<PathBuf> {
    match std::env::var_os(ENV) {
        Some(d) => Some(PathBuf::from(d)),
        None => {
            eprintln!(
                "SKIP {test}: {ENV} is not set (run `source .ci/hamlet.sh` to unpack the Go \
                 reference peers from ../shared/hamlet-reference; see README)"
            );
            None
        }
    }
}

/// A running reference program and the lines it prints on stdout.
struct Peer {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Peer {
    fn spawn(program: PathBuf, args: &[String]) -> Self {
        let mut child = Command::new(&program)
            .args(args)
            .stdout(Stdio::piped())
            // The peers' own diagnostics land in the test's output.
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{} cannot run: {e}", program.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The first line for which `pick` returns something (bounded wait); earlier lines are
    /// dropped. Panics on timeout or when the program ends first.
    async fn wait_line<T>(&mut self, what: &str, mut pick: impl FnMut(&str) -> Option<T>) -> T {
        let mut seen = Vec::new();
        let fut = async {
            while let Some(line) = self.lines.recv().await {
                if let Some(t) = pick(&line) {
                    return t;
                }
                seen.push(line);
            }
            panic!("peer exited before: {what}; it printed {seen:#?}");
        };
        tokio::time::timeout(WAIT, fut)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
    }

    /// Kill the program and wait until it is gone, so its port is free again (dropping only
    /// sends the signal: a restart on the same port could find the old listener still open).
    async fn stop(mut self) {
        self.child.kill().await.expect("kill the peer");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running");
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }
}

fn services_json(services: &[(String, String)]) -> String {
    let list: Vec<serde_json::Value> = services
        .iter()
        .map(|(fqdn, ip)| {
            serde_json::json!({
                "name": fqdn, "fqdn": fqdn, "id": fqdn, "protocols": ["https"],
                "labels": {"connectivity.tanzu.vmware.com/service-port": "443"},
                "endpoints": [{"address": ip, "port": 443}],
            })
        })
        .collect();
    serde_json::json!({ "services": list }).to_string()
}

fn svc(fqdn: &str, ip: &str) -> (String, String) {
    (fqdn.to_string(), ip.to_string())
}

/// The reference server serving `file` on `port`; returns once it printed READY.
async fn go_server(dir: &Path, files: &TlsFiles, file: &Path, port: u16) -> Peer {
    let args: Vec<String> = vec![
        "-port".into(),
        port.to_string(),
        "-ca".into(),
        files.ca.display().to_string(),
        "-cert".into(),
        files.cert.display().to_string(),
        "-key".into(),
        files.key.display().to_string(),
        "-services".into(),
        file.display().to_string(),
    ];
    let mut peer = Peer::spawn(dir.join("hamlet-go-fileserver"), &args);
    peer.wait_line("server READY", |l| l.starts_with("READY").then_some(()))
        .await;
    peer
}

fn go_client(
    dir: &Path,
    files: &TlsFiles,
    addr: std::net::SocketAddr,
    count: usize,
    api: &str,
) -> Peer {
    let args: Vec<String> = vec![
        "-addr".into(),
        addr.to_string(),
        "-ca".into(),
        files.ca.display().to_string(),
        "-cert".into(),
        files.cert.display().to_string(),
        "-key".into(),
        files.key.display().to_string(),
        "-server-name".into(),
        "localhost".into(),
        "-count".into(),
        count.to_string(),
        "-api".into(),
        api.into(),
        // Keep watching after the snapshot: the test ends the client by dropping it.
        "-linger".into(),
        "10m".into(),
        "-timeout".into(),
        "10m".into(),
    ];
    Peer::spawn(dir.join("hamlet-go-jsonclient"), &args)
}

/// One event line of the Go client: (op, fqdn, first endpoint address).
fn event(line: &str) -> Option<(String, String, String)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let op = v.get("op")?.as_str()?.to_string();
    let fqdn = v.get("fqdn")?.as_str()?.to_string();
    let address = v
        .pointer("/resource/endpoints/0/address")
        .and_then(|a| a.as_str())
        .unwrap_or_default()
        .to_string();
    Some((op, fqdn, address))
}

/// The Go client subscribes to an xcc registry and sees the snapshot as CREATEs, then an UPDATE
/// and a DELETE as the catalog changes.
async fn go_client_follows_xcc(api: &str) {
    let Some(dir) = reference_dir(&format!("go_client_follows_xcc_{api}")) else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = start(pki.cluster("east")).await;
    for (f, ip) in [
        ("a.xcc.test", "10.0.0.1"),
        ("b.xcc.test", "10.0.0.2"),
        ("c.xcc.test", "10.0.0.3"),
    ] {
        east.catalog.upsert(export("east", "ns", f, ip));
    }
    let mut client = go_client(&dir, &pki.cluster("west"), east.hamlet_addr, 3, api);
    let mut created = Vec::new();
    client
        .wait_line("snapshot of 3", |l| {
            if let Some((op, fqdn, ip)) = event(l) {
                assert_eq!(op, "CREATE", "{l}");
                created.push((fqdn, ip));
            }
            l.starts_with("SNAPSHOT count=3").then_some(())
        })
        .await;
    created.sort();
    assert_eq!(
        created,
        [
            svc("a.xcc.test", "10.0.0.1"),
            svc("b.xcc.test", "10.0.0.2"),
            svc("c.xcc.test", "10.0.0.3")
        ]
    );

    east.catalog
        .upsert(export("east", "ns", "b.xcc.test", "10.0.0.22"));
    let update = client.wait_line("UPDATE of b", event).await;
    assert_eq!(
        update,
        (
            "UPDATE".to_string(),
            "b.xcc.test".to_string(),
            "10.0.0.22".to_string()
        )
    );
    east.catalog
        .remove(&ServiceKey::new("east", "ns", "c.xcc.test"));
    let delete = client.wait_line("DELETE of c", event).await;
    assert_eq!(
        (delete.0.as_str(), delete.1.as_str()),
        ("DELETE", "c.xcc.test")
    );
}

#[tokio::test]
async fn go_client_follows_xcc_v1alpha1() {
    go_client_follows_xcc("v1alpha1").await;
}

/// The Go client's v1alpha2 watch: the v1alpha2 type over the v1alpha1 service, as the Go
/// reference server offers it.
#[tokio::test]
async fn go_client_follows_xcc_v1alpha2() {
    go_client_follows_xcc("v1alpha2").await;
}

/// xcc imports from the Go server, follows its CREATE/UPDATE/DELETE, survives its restart and,
/// as the Go server sends no end-of-snapshot marker, removes what the restarted server no longer
/// has after the quiet period.
#[tokio::test]
async fn xcc_imports_from_go_server_through_changes_and_restart() {
    let Some(dir) = reference_dir("xcc_imports_from_go_server_through_changes_and_restart") else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let server_files = pki.cluster("go-peer");
    let work = tempfile::tempdir().expect("tempdir");
    let file = work.path().join("services.json");
    std::fs::write(
        &file,
        services_json(&[
            svc("a.go.test", "10.1.0.1"),
            svc("b.go.test", "10.1.0.2"),
            svc("c.go.test", "10.1.0.3"),
        ]),
    )
    .expect("write");
    let port = xcc_testkube::free_port();
    let server = go_server(&dir, &server_files, &file, port).await;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();

    let state = tempfile::tempdir().expect("tempdir");
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("west"));
    cfg.client.quiet_period = Duration::from_millis(300);
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(400),
    };
    cfg.store = xcc_registry::StoreConfig::File {
        state_dir: state.path().to_path_buf(),
        poll: Duration::from_secs(60),
    };
    let (west, _wc) = start_with(cfg).await;
    west.set_remotes(vec![remote("go", addr, &[])]).await;
    wait_catalog(&west.catalog, "the snapshot", |c| {
        imported_fqdns(c, "go") == ["a.go.test", "b.go.test", "c.go.test"]
    })
    .await;

    // Changes published by the library: b updated, c deleted, d created.
    std::fs::write(
        &file,
        services_json(&[
            svc("a.go.test", "10.1.0.1"),
            svc("b.go.test", "10.1.0.22"),
            svc("d.go.test", "10.1.0.4"),
        ]),
    )
    .expect("write");
    server.signal("-HUP");
    wait_catalog(&west.catalog, "create, update, delete", |c| {
        imported_fqdns(c, "go") == ["a.go.test", "b.go.test", "d.go.test"]
            && c.get(&ServiceKey::new("go", "", "b.go.test"))
                .is_some_and(|e| e.endpoints[0].address == "10.1.0.22")
    })
    .await;

    // Restart with a different set: d vanished while nobody was streaming.
    server.stop().await;
    std::fs::write(
        &file,
        services_json(&[svc("a.go.test", "10.1.0.1"), svc("e.go.test", "10.1.0.5")]),
    )
    .expect("write");
    let _server = go_server(&dir, &server_files, &file, port).await;
    wait_catalog(&west.catalog, "resync with stale records removed", |c| {
        imported_fqdns(c, "go") == ["a.go.test", "e.go.test"]
    })
    .await;
    assert!(
        west.metrics.client_stale_removed.get() >= 2,
        "b and d swept"
    );
    let sink = xcc_registry::store::file::FileImportSink::new(state.path(), "ns").expect("sink");
    let mut on_disk: Vec<String> = sink
        .load("go")
        .expect("load")
        .into_iter()
        .map(|i| i.fqdn)
        .collect();
    on_disk.sort();
    assert_eq!(on_disk, ["a.go.test", "e.go.test"]);
}

/// The Go server's largest snapshot (its queue holds 4,096 objects) arrives whole, lock-step.
#[tokio::test]
async fn snapshot_of_4096_from_go_server() {
    let Some(dir) = reference_dir("snapshot_of_4096_from_go_server") else {
        return;
    };
    const N: usize = 4096;
    let pki = Pki::new("xcc.test");
    let work = tempfile::tempdir().expect("tempdir");
    let file = work.path().join("services.json");
    let services: Vec<(String, String)> = (0..N)
        .map(|i| {
            svc(
                &format!("s{i:05}.go.test"),
                &format!("10.2.{}.{}", i / 256, i % 256),
            )
        })
        .collect();
    std::fs::write(&file, services_json(&services)).expect("write");
    let port = xcc_testkube::free_port();
    let _server = go_server(&dir, &pki.cluster("go-peer"), &file, port).await;

    let state = tempfile::tempdir().expect("tempdir");
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("west"));
    cfg.store = xcc_registry::StoreConfig::File {
        state_dir: state.path().to_path_buf(),
        poll: Duration::from_secs(60),
    };
    let (west, _wc) = start_with(cfg).await;
    west.set_remotes(vec![remote("go", ([127, 0, 0, 1], port).into(), &[])])
        .await;
    wait_catalog(&west.catalog, "4096 imports", |c| c.len() == N).await;
    let sink = xcc_registry::store::file::FileImportSink::new(state.path(), "ns").expect("sink");
    assert_eq!(sink.load("go").expect("load").len(), N);
}

/// Bounded staleness with the real server: a stale import (persisted by an earlier run) goes
/// away while the Go server keeps publishing changes faster than the quiet period, because the
/// sweep is due at most `max_sweep_delay` after connecting. (The full 60 s rule is a unit test
/// of `hamlet::sweep`.)
#[tokio::test]
async fn stale_import_removed_under_continuous_churn() {
    let Some(dir) = reference_dir("stale_import_removed_under_continuous_churn") else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let work = tempfile::tempdir().expect("tempdir");
    let file = work.path().join("services.json");
    std::fs::write(&file, services_json(&[svc("a.go.test", "10.3.0.0")])).expect("write");
    let port = xcc_testkube::free_port();
    let server = go_server(&dir, &pki.cluster("go-peer"), &file, port).await;

    let state = tempfile::tempdir().expect("tempdir");
    let sink = xcc_registry::store::file::FileImportSink::new(state.path(), "ns").expect("sink");
    let stale = xcc_registry::hamlet::convert::import_v1alpha1(&prost_types::Any {
        type_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        value: prost::Message::encode_to_vec(&fs("z.go.test", "10.3.9.9")),
    })
    .expect("valid");
    let m = std::collections::BTreeMap::from([(stale.fqdn.clone(), stale)]);
    xcc_registry::hamlet::client::ImportSink::persist(&sink, "go", &m)
        .await
        .expect("persist");
    drop(sink);
    std::fs::create_dir_all(state.path().join("remotes")).expect("mkdir");
    std::fs::write(
        state.path().join("remotes/go.yaml"),
        format!(
            "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: RemoteRegistry\nmetadata:\n  name: go\nspec:\n  address: \"127.0.0.1:{port}\"\n  tlsConfig:\n    serverCA: \"\"\n    serverName: localhost\n"
        ),
    )
    .expect("write remote");
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("west"));
    // A change every 200 ms never leaves the stream quiet for 1 s; the cap is 2 s.
    cfg.client.quiet_period = Duration::from_secs(1);
    cfg.client.max_sweep_delay = Duration::from_secs(2);
    cfg.store = xcc_registry::StoreConfig::File {
        state_dir: state.path().to_path_buf(),
        poll: Duration::from_secs(60),
    };
    let (west, _wc) = start_with(cfg).await;
    assert_eq!(
        imported_fqdns(&west.catalog, "go"),
        ["z.go.test"],
        "loaded from disk"
    );

    let churn = async {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        for n in 1u32.. {
            tick.tick().await;
            let ip = format!("10.3.0.{}", n % 250);
            std::fs::write(&file, services_json(&[svc("a.go.test", &ip)])).expect("write");
            server.signal("-HUP");
        }
    };
    tokio::select! {
        _ = churn => unreachable!("the churn never ends"),
        _ = wait_catalog(&west.catalog, "stale import swept during churn", |c| {
            imported_fqdns(c, "go") == ["a.go.test"]
        }) => {}
    }
    assert_eq!(west.metrics.client_stale_removed.get(), 1);
}
