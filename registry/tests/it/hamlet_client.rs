//! The managed Hamlet client over real mTLS on 127.0.0.1: resync after a server restart with
//! stale imports removed, Go-reference servers (lock-step, empty nonces, no marker), backoff,
//! no retry on Unauthenticated, allowedDomains.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::*;
use xcc_registry::catalog::ServiceKey;
use xcc_registry::hamlet::client::Backoff;
use xcc_registry::peers::PeerState;

/// Restart the exporting registry on the same port with a different export set: the importer
/// reconnects with backoff, takes the new snapshot, and drops what the exporter no longer has.
#[tokio::test]
async fn resyncs_after_server_restart_and_removes_stale_imports() {
    let pki = Pki::new("xcc.test");
    let east_files = pki.cluster("east");
    let (east, east_cancel) = start(east_files.clone()).await;
    let addr = east.hamlet_addr;
    for f in ["a.xcc.test", "b.xcc.test", "c.xcc.test"] {
        east.catalog.upsert(export("east", "ns", f, "10.0.0.1"));
    }
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("west"));
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(400),
    };
    let (west, _wc) = start_with(cfg).await;
    west.set_remotes(vec![remote("east", addr, &[])]).await;
    wait_catalog(&west.catalog, "three imports", |c| {
        imported_fqdns(c, "east") == ["a.xcc.test", "b.xcc.test", "c.xcc.test"]
    })
    .await;

    east_cancel.cancel();
    east.shutdown().await.expect("clean shutdown");
    wait_peer(&west, "east", "disconnected", |p| {
        p.state() != PeerState::Connected
    })
    .await;
    // Imports are kept while the remote is away.
    assert_eq!(imported_fqdns(&west.catalog, "east").len(), 3);

    let mut cfg = xcc_registry::RegistryConfig::loopback(east_files);
    cfg.hamlet_listen = addr;
    let (east2, _c2) = start_with(cfg).await;
    east2
        .catalog
        .upsert(export("east", "ns", "a.xcc.test", "10.0.0.1"));
    east2
        .catalog
        .upsert(export("east", "ns", "c.xcc.test", "10.0.0.99"));
    east2
        .catalog
        .upsert(export("east", "ns", "d.xcc.test", "10.0.0.4"));
    wait_catalog(&west.catalog, "resynced imports", |c| {
        imported_fqdns(c, "east") == ["a.xcc.test", "c.xcc.test", "d.xcc.test"]
            && c.get(&ServiceKey::new("east", "", "c.xcc.test"))
                .is_some_and(|e| e.endpoints[0].address == "10.0.0.99")
    })
    .await;
    let peer = west
        .peers
        .list()
        .into_iter()
        .find(|p| p.name == "east")
        .expect("peer");
    assert!(peer.reconnects.load(Ordering::Relaxed) >= 1);
    assert_eq!(west.metrics.client_stale_removed.get(), 1);
}

/// Against a Go-reference server: exactly one ACK per response, echoing the empty nonce with
/// status code 0, nothing extra; stale imports (persisted from an earlier run) are removed after
/// the quiet period because such a server sends no end-of-snapshot marker.
#[tokio::test]
async fn go_reference_server_lock_step_and_quiet_period_sweep() {
    let pki = Pki::new("xcc.test");
    let server = GoLikeServer::default();
    *server.state.lock().expect("lock") = vec![
        fs("x.some.domain", "10.0.0.1"),
        fs("y.some.domain", "10.0.0.2"),
    ];
    let (addr, _sc) = serve_go_like(server.clone(), pki.cluster("go-peer")).await;

    let state = tempfile::tempdir().expect("tempdir");
    // A stale import persisted by an earlier run.
    let sink = xcc_registry::store::file::FileImportSink::new(state.path(), "ns").expect("sink");
    let stale = xcc_registry::hamlet::convert::import_v1alpha1(&prost_types::Any {
        type_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        value: prost::Message::encode_to_vec(&fs("z.some.domain", "10.0.0.3")),
    })
    .expect("valid");
    let mut m = std::collections::BTreeMap::new();
    m.insert(stale.fqdn.clone(), stale);
    xcc_registry::hamlet::client::ImportSink::persist(&sink, "go", &m)
        .await
        .expect("persist");
    std::fs::create_dir_all(state.path().join("remotes")).expect("mkdir");
    std::fs::write(
        state.path().join("remotes/go.yaml"),
        format!(
            "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: RemoteRegistry\nmetadata:\n  name: go\nspec:\n  address: \"{addr}\"\n  tlsConfig:\n    serverCA: \"\"\n    serverName: localhost\n"
        ),
    )
    .expect("write remote");

    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("west"));
    cfg.client.quiet_period = Duration::from_millis(300);
    cfg.store = xcc_registry::StoreConfig::File {
        state_dir: state.path().to_path_buf(),
        poll: Duration::from_secs(60),
    };
    let (west, _wc) = start_with(cfg).await;
    assert_eq!(
        imported_fqdns(&west.catalog, "go"),
        ["z.some.domain"],
        "loaded from disk"
    );
    wait_catalog(&west.catalog, "sweep after quiet period", |c| {
        imported_fqdns(c, "go") == ["x.some.domain", "y.some.domain"]
    })
    .await;
    // The second ACK may still be on the wire when the sweep completes.
    server.wait_requests(3).await;
    let reqs = server.requests.lock().expect("lock").clone();
    assert_eq!(
        reqs.len(),
        3,
        "subscription + one ACK per response: {reqs:?}"
    );
    assert_eq!(
        reqs[0].resource_url,
        xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL
    );
    assert!(reqs[0].status.is_none() && reqs[0].response_nonce.is_empty());
    for ack in &reqs[1..] {
        assert_eq!(ack.resource_url, xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL);
        assert_eq!(ack.response_nonce, "");
        assert_eq!(ack.status.as_ref().map(|s| s.code), Some(0));
    }
    // The persisted file now holds exactly the two live imports.
    let on_disk = sink.load("go").expect("load");
    let mut names: Vec<String> = on_disk.iter().map(|i| i.fqdn.clone()).collect();
    names.sort();
    assert_eq!(names, ["x.some.domain", "y.some.domain"]);
}

/// An unreachable remote gets one connection attempt at a time, with exponentially
/// growing gaps (test-sized floor; the production floor of 1 s is a unit test of `Backoff`).
#[tokio::test]
async fn unreachable_remote_backs_off_one_attempt_at_a_time() {
    let pki = Pki::new("xcc.test");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, usize)>(64);
    let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn({
        let open = open.clone();
        async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let concurrent = open.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = tx.send((Instant::now(), concurrent)).await;
                let open = open.clone();
                // Hold the socket briefly without speaking TLS, then drop it.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    drop(sock);
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        }
    });
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("west"));
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(100),
        max: Duration::from_millis(800),
    };
    let (west, _wc) = start_with(cfg).await;
    west.set_remotes(vec![remote("dead", addr, &[])]).await;
    let mut attempts = Vec::new();
    for _ in 0..5 {
        let (at, concurrent) = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("attempt in time")
            .expect("listener alive");
        assert_eq!(concurrent, 1, "never more than one attempt in flight");
        attempts.push(at);
    }
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    for g in &gaps {
        assert!(
            *g >= Duration::from_millis(100),
            "gap below the floor: {gaps:?}"
        );
    }
    // Attempt n waits at least max(min, min*2^n / 2): the 4th gap is >= 400 ms.
    assert!(
        gaps[3] >= Duration::from_millis(400),
        "not exponential: {gaps:?}"
    );
    let peer = west
        .peers
        .list()
        .into_iter()
        .find(|p| p.name == "dead")
        .expect("peer");
    assert!(peer.reconnects.load(Ordering::Relaxed) >= 4);
    assert!(!peer.last_error().is_empty());
}

/// `Unauthenticated` is final: no retry until the RemoteRegistry changes.
#[tokio::test]
async fn unauthenticated_is_not_retried() {
    let pki = Pki::new("xcc.test");
    let server = GoLikeServer {
        fail_with: Some(tonic::Code::Unauthenticated),
        ..Default::default()
    };
    let (addr, _sc) = serve_go_like(server.clone(), pki.cluster("go-peer")).await;
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("west"));
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(10),
        max: Duration::from_millis(20),
    };
    let (west, _wc) = start_with(cfg).await;
    west.set_remotes(vec![remote("go", addr, &[])]).await;
    wait_peer(&west, "go", "failed", |p| p.state() == PeerState::Failed).await;
    let peer = west
        .peers
        .list()
        .into_iter()
        .find(|p| p.name == "go")
        .expect("peer");
    assert!(
        peer.last_error().starts_with("Unauthenticated"),
        "{}",
        peer.last_error()
    );
    assert_eq!(server.calls.load(Ordering::SeqCst), 1);
    // A spec change is the only thing that makes it try again.
    west.set_remotes(vec![remote("go", addr, &["xcc.test"])])
        .await;
    wait_peer(&west, "go", "second failure", |_| {
        server.calls.load(Ordering::SeqCst) == 2
    })
    .await;
}

/// `allowedDomains` through the real client: the filter applies on import, tightening it
/// removes imports, loosening it brings them back.
#[tokio::test]
async fn allowed_domains_filter_tighten_and_loosen() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = start(pki.cluster("east")).await;
    let all = [
        "some-service.some.domain",
        "other.some.domain",
        "other.somesome.domain",
        "some.other.domain",
        "domain.with.dot.at.end.",
        "domain.WITH.mixed.case",
        "yet.another.domain",
    ];
    for f in all {
        let canonical = f.trim_end_matches('.').to_ascii_lowercase();
        east.catalog
            .upsert(export("east", "ns", &canonical, "10.0.0.1"));
    }
    let (west, _wc) = start(pki.cluster("west")).await;
    west.set_remotes(vec![remote("some-remote-registry", east.hamlet_addr, &[])])
        .await;
    wait_catalog(&west.catalog, "all seven", |c| {
        imported_fqdns(c, "some-remote-registry").len() == 7
    })
    .await;

    west.set_remotes(vec![remote(
        "some-remote-registry",
        east.hamlet_addr,
        &["some.domain"],
    )])
    .await;
    wait_catalog(&west.catalog, "only some.domain", |c| {
        imported_fqdns(c, "some-remote-registry")
            == ["other.some.domain", "some-service.some.domain"]
    })
    .await;

    west.set_remotes(vec![remote(
        "some-remote-registry",
        east.hamlet_addr,
        &[
            "some.domain",
            "some.other.domain",
            "domain.with.dot.at.end.",
            "domain.with.MIXED.case",
        ],
    )])
    .await;
    wait_catalog(&west.catalog, "the five canonical names", |c| {
        imported_fqdns(c, "some-remote-registry")
            == [
                "domain.with.dot.at.end",
                "domain.with.mixed.case",
                "other.some.domain",
                "some-service.some.domain",
                "some.other.domain",
            ]
    })
    .await;

    west.set_remotes(vec![remote("some-remote-registry", east.hamlet_addr, &[])])
        .await;
    wait_catalog(&west.catalog, "all seven again", |c| {
        imported_fqdns(c, "some-remote-registry").len() == 7
    })
    .await;

    // Removing the remote removes exactly its imports.
    west.set_remotes(vec![]).await;
    assert!(imported_fqdns(&west.catalog, "some-remote-registry").is_empty());
}

/// Constructing a client contacts no server.
#[tokio::test]
async fn constructing_a_connector_contacts_no_server() {
    let pki = Pki::new("xcc.test");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tls = xcc_certs::reload::ReloadingTls::load(pki.cluster("west")).expect("tls");
    let connector =
        xcc_certs::client::TlsConnector::new(tls, "localhost".into(), None).expect("connector");
    let _channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_with_connector_lazy(connector.clone());
    assert!(connector.last_peer().is_none());
    assert!(
        tokio::time::timeout(Duration::from_millis(100), listener.accept())
            .await
            .is_err(),
        "no connection may be opened before the first call"
    );
}

/// A sink that fails its first `failures` writes (a full disk), then keeps everything in memory.
struct FlakySink {
    failures: std::sync::atomic::AtomicUsize,
}

impl xcc_registry::hamlet::client::ImportSink for FlakySink {
    fn persist<'a>(
        &'a self,
        _remote: &'a str,
        _imports: &'a std::collections::BTreeMap<String, xcc_registry::hamlet::convert::Imported>,
    ) -> futures::future::BoxFuture<'a, anyhow::Result<()>> {
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        Box::pin(async move {
            if failing {
                anyhow::bail!("No space left on device (os error 28)")
            }
            Ok(())
        })
    }
}

/// A store that cannot write (disk full) holds the ACK and retries with backoff on the
/// same stream — no reconnect, no second download of the snapshot, nothing ACKed before stored.
#[tokio::test]
async fn store_failure_holds_the_ack_and_retries_without_redownloading() {
    let pki = Pki::new("xcc.test");
    let server = GoLikeServer::default();
    *server.state.lock().expect("lock") = vec![
        fs("x.some.domain", "10.0.0.1"),
        fs("y.some.domain", "10.0.0.2"),
    ];
    let (addr, _sc) = serve_go_like(server.clone(), pki.cluster("go-peer")).await;
    let catalog = xcc_registry::Catalog::new();
    let metrics = xcc_registry::metrics::Metrics::default();
    let ctx = xcc_registry::hamlet::client::ClientContext {
        catalog: catalog.clone(),
        peers: Default::default(),
        metrics: metrics.clone(),
        tls: xcc_certs::reload::ReloadingTls::load(pki.cluster("west")).expect("tls"),
        sink: std::sync::Arc::new(FlakySink { failures: 3.into() }),
        config: xcc_registry::hamlet::client::ClientConfig {
            backoff: Backoff {
                min: Duration::from_millis(10),
                max: Duration::from_millis(40),
            },
            ..Default::default()
        },
    };
    let tasks = xcc_controller::tasks::Tasks::new(tokio_util::sync::CancellationToken::new());
    let handle = xcc_registry::hamlet::client::spawn(ctx, remote("go", addr, &[]), tasks.spawner());
    wait_catalog(&catalog, "both imports", |c| {
        imported_fqdns(c, "go") == ["x.some.domain", "y.some.domain"]
    })
    .await;
    server.wait_requests(3).await;
    handle.stop().await;
    assert_eq!(metrics.store_errors.get(), 3);
    assert_eq!(
        server.calls.load(Ordering::SeqCst),
        1,
        "one stream, one snapshot"
    );
    let reqs = server.requests.lock().expect("lock").clone();
    assert_eq!(
        reqs.len(),
        3,
        "subscription + one ACK per response: {reqs:?}"
    );
    for ack in &reqs[1..] {
        assert_eq!(
            ack.status.as_ref().map(|s| s.code),
            Some(0),
            "ACK, not NACK"
        );
    }
}

/// An oversized resource costs only itself — NACKed with RESOURCE_EXHAUSTED and a
/// reason — and the records after it still arrive on the same stream.
#[tokio::test]
async fn oversized_resource_is_nacked_and_the_rest_imported() {
    let pki = Pki::new("xcc.test");
    let server = GoLikeServer::default();
    let mut big = fs("big.some.domain", "10.0.0.9");
    // 5 MiB: over the 4 MiB entry limit, within the 16 MiB the transport still reads.
    big.description = "x".repeat(5 * 1024 * 1024);
    *server.state.lock().expect("lock") = vec![
        fs("a.some.domain", "10.0.0.1"),
        big,
        fs("b.some.domain", "10.0.0.2"),
    ];
    let (addr, _sc) = serve_go_like(server.clone(), pki.cluster("go-peer")).await;
    let (west, _wc) = start(pki.cluster("west")).await;
    west.set_remotes(vec![remote("go", addr, &[])]).await;
    wait_catalog(&west.catalog, "the two normal records", |c| {
        imported_fqdns(c, "go") == ["a.some.domain", "b.some.domain"]
    })
    .await;
    server.wait_requests(4).await;
    let reqs = server.requests.lock().expect("lock").clone();
    let codes: Vec<Option<i32>> = reqs[1..]
        .iter()
        .map(|r| r.status.as_ref().map(|s| s.code))
        .collect();
    assert_eq!(
        codes,
        [
            Some(0),
            Some(tonic::Code::ResourceExhausted as i32),
            Some(0)
        ]
    );
    let reason = &reqs[2].status.as_ref().expect("status").message;
    assert!(
        reason.contains("exceeds the 4194304-byte limit"),
        "{reason}"
    );
    assert_eq!(
        server.calls.load(Ordering::SeqCst),
        1,
        "the stream survived"
    );
}

/// An importer whose CA did not issue the exporter's certificate says so at WARN, once for a
/// storm of retries (the repeats are counted, not printed), and `peers` shows the same sentence
/// instead of "Unknown: transport error"; the exporter logs that its certificate was refused.
#[tokio::test]
async fn a_remote_from_another_ca_is_explained_once_per_storm() {
    let logs = Captured::default();
    let _guard = logs.start();
    let (ours, theirs) = (Pki::new("xcc.test"), Pki::new("other.test"));
    let (east, _ec) = start(theirs.cluster("east")).await;
    let mut cfg = xcc_registry::RegistryConfig::loopback(ours.cluster("west"));
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(10),
        max: Duration::from_millis(20),
    };
    let (west, _wc) = start_with(cfg).await;
    west.set_remotes(vec![remote("east", east.hamlet_addr, &[])])
        .await;
    wait_peer(&west, "east", "three failed attempts", |p| {
        p.reconnects.load(Ordering::Relaxed) >= 3
    })
    .await;
    let refused = format!(
        "refused server 127.0.0.1:{} (verified as localhost): its certificate is not issued by a CA we trust (unknown CA",
        east.hamlet_addr.port()
    );
    let peer = west
        .peers
        .list()
        .into_iter()
        .find(|p| p.name == "east")
        .expect("peer");
    assert!(
        peer.last_error().starts_with(&refused),
        "{}",
        peer.last_error()
    );
    let warned = logs.warnings(&format!("cannot import: {refused}"));
    assert_eq!(warned.len(), 1, "one line for the storm: {warned:?}");
    assert!(warned[0].contains("remote=east"), "{warned:?}");
    let east_side = logs.warnings("refused our certificate: it does not trust the CA");
    assert_eq!(east_side.len(), 1, "{east_side:?}");
    assert!(
        east_side[0].contains("listener=\"Hamlet/federation listener\""),
        "{east_side:?}"
    );
}
