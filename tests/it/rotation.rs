//! A CA rotation as docs/operations.md prints it, with `xcc certs` on the files of running
//! registries and no restart: (1) the new CA added to every bundle, (2) every leaf reissued from
//! it, (3) the old CA removed. East exports while a writer keeps changing one of its records;
//! west imports from east. At every step: west never loses a record (no removal is ever seen),
//! the latest change reaches west, and a new connection (`xcc check` from another cluster's
//! files: TLS both ways and a Hamlet stream) works with the current material. South never gets
//! a new leaf: it works through step 2, its bundle refuses to drop the old CA, and after step 3
//! east refuses it with the reason.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use xcc_certs::reload::TlsFiles;
use xcc_registry::catalog::{CatalogEvent, Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::hamlet::client::{Backoff, RemoteSpec};
use xcc_registry::{Registry, RegistryConfig};

const WAIT: Duration = Duration::from_secs(30);

/// `xcc <args>` in `dir`; its exit code and stdout + stderr.
pub(crate) fn xcc(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_xcc"))
        .args(args)
        .current_dir(dir)
        .env("XCC_LOG", "error")
        .env_remove("XCC_TLS_DIR")
        .env_remove("XCC_STORE")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap(), text)
}

pub(crate) fn ok(dir: &Path, args: &[&str]) -> String {
    let (code, out) = xcc(dir, args);
    assert_eq!(code, 0, "xcc {args:?}:\n{out}");
    out
}

pub(crate) fn issue(dir: &Path, ca: &str, name: &str) {
    ok(
        dir,
        &[
            "certs",
            "issue",
            "--ca-dir",
            ca,
            "--cluster",
            name,
            "--dns",
            "localhost",
            "--ip",
            "127.0.0.1",
            "--out",
            name,
        ],
    );
}

pub(crate) fn entry(name: &str, port: u32) -> ServiceEntry {
    ServiceEntry {
        key: ServiceKey::new("east", "shop", name),
        source: Source::Local,
        fqdn: format!("{name}.shop.xcc.test").into(),
        endpoints: vec![Endpoint {
            address: "10.0.0.1".into(),
            port,
        }],
        ports: vec![],
        labels: Default::default(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    }
}

async fn start(files: TlsFiles) -> (Registry, CancellationToken) {
    let mut cfg = RegistryConfig::loopback(files);
    cfg.cert_poll = Duration::from_millis(200);
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(200),
    };
    let cancel = CancellationToken::new();
    let r = Registry::start(cfg, cancel.clone()).await.unwrap();
    (r, cancel)
}

/// Wait until `r` serves material of generation `generation` or later.
pub(crate) async fn reloaded(r: &Registry, generation: u64) {
    let mut rx = r.tls.subscribe();
    tokio::time::timeout(WAIT, rx.wait_for(|m| m.generation >= generation))
        .await
        .unwrap_or_else(|_| panic!("{} never reloaded to generation {generation}", r.cluster))
        .unwrap();
}

/// Wait until `r` holds `fqdn` with a first endpoint port of `at_least` or more (the tests'
/// changing `tick` record carries its counter as the port).
pub(crate) async fn port_reaches(r: &Registry, fqdn: &str, at_least: u32) {
    let mut rx = r.catalog.subscribe();
    let seen = || {
        r.catalog
            .by_fqdn(fqdn)
            .iter()
            .any(|e| e.endpoints.first().is_some_and(|ep| ep.port >= at_least))
    };
    tokio::time::timeout(WAIT, async {
        while !seen() {
            match rx.recv().await {
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("catalog events ended: {e}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} never saw {fqdn} at {at_least}", r.cluster));
}

/// The port of west's import of `tick`, once it is at least `at_least`.
async fn tick_reaches(west: &Registry, at_least: u32) {
    port_reaches(west, "tick.shop.xcc.test", at_least).await;
}

/// A state directory whose one RemoteRegistry is east, for `xcc check` from `name`'s files.
fn check_state(dir: &Path, name: &str, east: std::net::SocketAddr) -> PathBuf {
    let state = dir.join(format!("{name}-check"));
    std::fs::create_dir_all(state.join("exports")).unwrap();
    std::fs::create_dir_all(state.join("remotes")).unwrap();
    std::fs::write(
        state.join("remotes/east.yaml"),
        format!(
            "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: RemoteRegistry\nmetadata: {{name: east}}\nspec:\n  address: {east}\n  tlsConfig:\n    serverCA: \"\"\n    serverName: localhost\n"
        ),
    )
    .unwrap();
    state
}

/// `xcc check` as `name` against east: a new connection with the files as they are now.
fn check_from(dir: &Path, name: &str, east: std::net::SocketAddr) -> (i32, String) {
    let state = check_state(dir, name, east);
    xcc(
        dir,
        &[
            "check",
            "--tls-dir",
            name,
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_with_no_restart_loses_nothing() {
    xcc_certs::install_crypto_provider();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    ok(
        dir,
        &[
            "certs",
            "init",
            "--trust-domain",
            "xcc.test",
            "--out",
            "pki-a",
        ],
    );
    for name in ["east", "west", "south"] {
        issue(dir, "pki-a", name);
    }
    let files = |name: &str| TlsFiles::in_dir(&dir.join(name));
    let (east, _ec) = start(files("east")).await;
    let (west, _wc) = start(files("west")).await;
    east.catalog.upsert(entry("stable", 443));
    east.catalog.upsert(entry("tick", 1));

    // West never loses a record: every removal it applies is recorded.
    let removed = Arc::new(AtomicBool::new(false));
    let mut events = west.catalog.subscribe();
    let flag = removed.clone();
    let watcher = tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(CatalogEvent::Delete(e)) => {
                    eprintln!("west removed {}", e.fqdn);
                    flag.store(true, Ordering::SeqCst);
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
    });
    west.set_remotes(vec![RemoteSpec {
        name: "east".into(),
        address: east.hamlet_addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
        allowed_domains: vec![],
    }])
    .await;

    // The writer: east's `tick` changes every 20 ms for the whole rotation.
    let tick = Arc::new(AtomicU32::new(1));
    let stop = CancellationToken::new();
    let writer = {
        let (catalog, tick, stop) = (east.catalog.clone(), tick.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let n = tick.fetch_add(1, Ordering::SeqCst) + 1;
                catalog.upsert(entry("tick", n));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Each step: the latest change reaches west, new connections work as stated.
    let settled = |label: &'static str| {
        let (west, tick, removed) = (&west, tick.clone(), removed.clone());
        async move {
            tick_reaches(west, tick.load(Ordering::SeqCst)).await;
            assert!(
                !west.catalog.by_fqdn("stable.shop.xcc.test").is_empty(),
                "{label}: west lost stable"
            );
            assert!(
                !removed.load(Ordering::SeqCst),
                "{label}: west removed a record"
            );
        }
    };
    settled("before").await;
    let east_addr = east.hamlet_addr;
    assert_eq!(check_from(dir, "west", east_addr).0, 0);

    // Step 1: a new CA, added to every bundle. Before that, a leaf from it is refused beside a
    // bundle that does not hold it.
    ok(
        dir,
        &[
            "certs",
            "init",
            "--trust-domain",
            "xcc.test",
            "--out",
            "pki-b",
        ],
    );
    let (code, out) = xcc(
        dir,
        &[
            "certs",
            "issue",
            "--ca-dir",
            "pki-b",
            "--cluster",
            "east",
            "--out",
            "east",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        out.contains("east/ca.crt does not hold the CA of pki-b: a certificate from it would not be trusted beside that bundle"),
        "{out}"
    );
    for name in ["east", "west", "south"] {
        let out = ok(
            dir,
            &[
                "certs",
                "bundle",
                "add",
                "--bundle",
                &format!("{name}/ca.crt"),
                "--ca",
                "pki-b/ca.crt",
            ],
        );
        assert_eq!(out.trim(), format!("added 1 CA to {name}/ca.crt"));
    }
    reloaded(&east, 2).await;
    reloaded(&west, 2).await;
    settled("step 1").await;
    // North is issued by the new CA: east trusts it now.
    issue(dir, "pki-b", "north");
    std::fs::copy(dir.join("east/ca.crt"), dir.join("north/ca.crt")).unwrap();
    let (code, out) = check_from(dir, "north", east_addr);
    assert_eq!(code, 0, "step 1, north (new CA):\n{out}");

    // Step 2: east and west reissued from the new CA; their bundles are kept.
    for name in ["east", "west"] {
        issue(dir, "pki-b", name);
        let listed = ok(
            dir,
            &[
                "certs",
                "bundle",
                "list",
                "--bundle",
                &format!("{name}/ca.crt"),
            ],
        );
        assert_eq!(
            listed.lines().count(),
            2,
            "{name} keeps both CAs:\n{listed}"
        );
    }
    reloaded(&east, 3).await;
    reloaded(&west, 3).await;
    settled("step 2").await;
    for name in ["west", "north", "south"] {
        let (code, out) = check_from(dir, name, east_addr);
        assert_eq!(code, 0, "step 2, {name}:\n{out}");
    }

    // Step 3: the old CA removed. South's bundle refuses: its leaf is still the old CA's.
    for name in ["east", "west"] {
        ok(
            dir,
            &[
                "certs",
                "bundle",
                "remove",
                "--bundle",
                &format!("{name}/ca.crt"),
                "--ca",
                "pki-a/ca.crt",
            ],
        );
    }
    let (code, out) = xcc(
        dir,
        &[
            "certs",
            "bundle",
            "remove",
            "--bundle",
            "south/ca.crt",
            "--ca",
            "pki-a/ca.crt",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        out.contains("south/tls.crt is issued by the CA being removed from south/ca.crt: reissue it from the new CA first (step 2)"),
        "{out}"
    );
    reloaded(&east, 4).await;
    reloaded(&west, 4).await;
    settled("step 3").await;
    for name in ["west", "north"] {
        let (code, out) = check_from(dir, name, east_addr);
        assert_eq!(code, 0, "step 3, {name}:\n{out}");
    }
    let (code, out) = check_from(dir, "south", east_addr);
    assert_eq!(code, 1, "step 3, south (old CA) must be refused:\n{out}");
    assert!(
        out.contains("✗ remote east: the remote refused this registry's certificate (TLS alert"),
        "{out}"
    );

    stop.cancel();
    writer.await.unwrap();
    settled("after").await;
    watcher.abort();
}
