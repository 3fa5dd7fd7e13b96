//! A CA rotation under load, every kind of connection at once, with no process restarted: a
//! three-level federation tree (root ← mid ← east, and far under the root asking the tree for
//! east's `tick`), a Hamlet consumer (west, file mode, importing from east), `xcc dns` serving
//! west's imports, and an operator's admin calls to every registry, each on a new connection.
//! East's `tick` changes every 20 ms throughout. Through the three steps of docs/operations.md
//! (new CA in every bundle, every leaf reissued from it, old CA removed), at every step and at
//! the end: 0 failed admin calls, 0 failed DNS queries, no record removed anywhere, and the
//! latest change reaches both importers.

#![allow(clippy::unwrap_used)]

use std::io::BufRead;
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use tokio_util::sync::CancellationToken;
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::xcc::admin::v1 as api;
use xcc_registry::catalog::{CatalogEvent, ServiceKey, Source};
use xcc_registry::federation::link::ParentSpec;
use xcc_registry::federation::{Question, Target};
use xcc_registry::hamlet::client::Backoff;
use xcc_registry::{Registry, RegistryConfig, StoreConfig};

use crate::dns_cli::{answers, query, spawn_dns};
use crate::rotation::{entry, issue, ok, port_reaches, reloaded, xcc};

const WAIT: Duration = Duration::from_secs(30);
const REGISTRIES: [&str; 5] = ["root", "mid", "east", "far", "west"];

/// Failures and successes of one kind of request, with the first few failures' reasons.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    reasons: Mutex<Vec<String>>,
}

impl Tally {
    fn record(&self, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.ok.fetch_add(1, Ordering::SeqCst);
            }
            Err(reason) => {
                self.failed.fetch_add(1, Ordering::SeqCst);
                let mut reasons = self.reasons.lock().unwrap();
                if reasons.len() < 5 {
                    reasons.push(reason);
                }
            }
        }
    }

    /// No failure so far, and at least `more` successes after `since`: the load ran through.
    async fn ran_clean(&self, what: &str, label: &str, since: u64, more: u64) {
        let deadline = tokio::time::Instant::now() + WAIT;
        // Polled: the counters are plain atomics; a bounded re-check every 20 ms.
        while self.ok.load(Ordering::SeqCst) < since + more {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{label}: {what} made no progress"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            self.failed.load(Ordering::SeqCst),
            0,
            "{label}: failed {what}: {:?}",
            self.reasons.lock().unwrap()
        );
    }
}

async fn start(
    files: TlsFiles,
    parent: Option<SocketAddr>,
    imports: Vec<Question>,
    state_dir: Option<&Path>,
) -> (Registry, CancellationToken) {
    let mut cfg = RegistryConfig::loopback(files);
    cfg.cert_poll = Duration::from_millis(200);
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(200),
    };
    cfg.federation.parent = parent.map(|addr| ParentSpec {
        name: "parent".into(),
        address: addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
    });
    cfg.federation.imports = imports;
    cfg.federation.import_retry = Duration::from_millis(200);
    // The root's view: mid carries east; every other child carries only itself.
    cfg.federation.policies = vec![(
        "carry-mid.cedar".into(),
        xcc_registry::authz::carry_policy("mid", &["east"]).unwrap(),
    )];
    if let Some(dir) = state_dir {
        cfg.store = StoreConfig::File {
            state_dir: dir.to_path_buf(),
            poll: Duration::from_secs(60),
        };
    }
    let cancel = CancellationToken::new();
    let r = Registry::start(cfg, cancel.clone()).await.unwrap();
    (r, cancel)
}

/// Records every removal `r` applies of one of east's records.
fn watch_removals(r: &Registry, removed: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let mut events = r.catalog.subscribe();
    let name = r.cluster.clone();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(CatalogEvent::Delete(e)) if e.key.namespace == "shop" => {
                    eprintln!("{name} removed {}", e.fqdn);
                    removed.store(true, Ordering::SeqCst);
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
    })
}

/// Wait until `r` holds east's `tick` at `at_least` or later, under any source.
async fn tick_reaches(r: &Registry, at_least: u32) {
    port_reaches(r, "tick.shop.svc.clusterset.local", at_least).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ca_rotation_under_load_fails_no_request_and_loses_no_record() {
    xcc_certs::install_crypto_provider();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let init = |out: &str| {
        ok(
            dir,
            &["certs", "init", "--trust-domain", "xcc.test", "--out", out],
        )
    };
    let issue_admin = |ca: &str| {
        ok(
            dir,
            &[
                "certs",
                "issue",
                "--admin",
                "--ca-dir",
                ca,
                "--cluster",
                "ops",
                "--out",
                "ops",
            ],
        )
    };
    init("pki-a");
    for name in REGISTRIES {
        issue(dir, "pki-a", name);
    }
    issue_admin("pki-a");
    let files = |name: &str| TlsFiles::in_dir(&dir.join(name));

    // The tree: root ← mid ← east; far under the root asks for east's tick as its `web`.
    let (root, _rc) = start(files("root"), None, vec![], None).await;
    let (mid, _mc) = start(files("mid"), Some(root.hamlet_addr), vec![], None).await;
    let (east, _ec) = start(files("east"), Some(mid.hamlet_addr), vec![], None).await;
    east.catalog.upsert(entry("stable", 443));
    let tick_entry = |n: u32| {
        let mut e = entry("tick", n);
        // Under its clusterset name, which east may announce up the tree.
        e.fqdn = "tick.shop.svc.clusterset.local".into();
        e.allowed_requesters = vec!["far/web".into(), "west".into()];
        e
    };
    east.catalog.upsert(tick_entry(1));
    let question = Question::new(
        Target::Name {
            namespace: "shop".into(),
            name: "tick".into(),
        },
        "web",
    );
    let (far, _fc) = start(files("far"), Some(root.hamlet_addr), vec![question], None).await;

    // West: file mode, importing from east over Hamlet; `xcc dns` serves its imports.
    let state = dir.join("west-state");
    std::fs::create_dir_all(state.join("remotes")).unwrap();
    std::fs::create_dir_all(state.join("exports")).unwrap();
    std::fs::write(
        state.join("remotes/east.yaml"),
        format!(
            "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: RemoteRegistry\nmetadata: {{name: east}}\nspec:\n  address: \"{}\"\n  tlsConfig:\n    serverCA: \"\"\n    serverName: localhost\n",
            east.hamlet_addr
        ),
    )
    .unwrap();
    let (west, _wc) = start(files("west"), None, vec![], Some(&state)).await;
    tick_reaches(&west, 1).await;
    tick_reaches(&far, 1).await;
    assert_eq!(
        far.catalog
            .get(&ServiceKey::new("east", "shop", "tick"))
            .map(|e| e.source.clone()),
        Some(Source::Hierarchy("parent".into())),
        "far holds tick through the tree"
    );

    let removed = Arc::new(AtomicBool::new(false));
    let watchers = [
        watch_removals(&west, removed.clone()),
        watch_removals(&far, removed.clone()),
    ];
    let stop = CancellationToken::new();

    // The writer: east's tick changes every 20 ms for the whole rotation.
    let tick = Arc::new(AtomicU32::new(1));
    let writer = {
        let (catalog, tick, stop) = (east.catalog.clone(), tick.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let n = tick.fetch_add(1, Ordering::SeqCst) + 1;
                catalog.upsert(tick_entry(n));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // DNS: `xcc dns --feed imports` on west's imports, asked for `stable` every 20 ms.
    let imports_dir = state.join("imports");
    let (dns, stderr, dns_addr) = spawn_dns(
        None,
        &[
            "--feed".as_ref(),
            "imports".as_ref(),
            "--imports-dir".as_ref(),
            imports_dir.as_os_str(),
        ],
    );
    // Drained so the child never blocks on a full pipe.
    std::thread::spawn(move || stderr.lines().for_each(drop));
    let dns_tally = Arc::new(Tally::default());
    let want = vec!["stable.shop.xcc.test. A 10.0.0.1".to_string()];
    // Before the load: the name is served (the feed's first read of the imports).
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let ask = move |udp: &UdpSocket| -> Result<(), String> {
        udp.send_to(&query("stable.shop.xcc.test.", RecordType::A), dns_addr)
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 1500];
        let n = udp.recv(&mut buf).map_err(|e| e.to_string())?;
        let got = answers(&buf[..n]);
        if got == (ResponseCode::NoError, want.clone()) {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    };
    let deadline = std::time::Instant::now() + WAIT;
    // Bounded re-check: the feed reads the directory on its own schedule.
    while ask(&udp).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "xcc dns never served stable"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let dns_load = {
        let (tally, stop) = (dns_tally.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.is_cancelled() {
                tally.record(ask(&udp));
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // Admin: the operator's identity, followed on disk like every component's; each call on a
    // new connection (so with the material as it is now) to each registry in turn.
    let ops = ReloadingTls::load(files("ops")).unwrap();
    let _ops_watch = ops.spawn_watcher(Duration::from_millis(200), stop.clone());
    let admin_tally = Arc::new(Tally::default());
    let admin_load = {
        let addrs: Vec<String> = [&root, &mid, &east, &far, &west]
            .iter()
            .map(|r| r.admin_addr.to_string())
            .collect();
        let (tally, stop, ops) = (admin_tally.clone(), stop.clone(), ops.clone());
        tokio::spawn(async move {
            for addr in addrs.iter().cycle() {
                if stop.is_cancelled() {
                    break;
                }
                let call = async {
                    let mut client = xcc_registry::admin::connect(ops.clone(), addr, None)
                        .await
                        .map_err(|e| format!("{addr}: {e:#}"))?;
                    client
                        .list_services(api::ListServicesRequest::default())
                        .await
                        .map_err(|e| format!("{addr}: {e}"))?;
                    Ok(())
                };
                tally.record(call.await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // After each step: every registry on the expected material, the latest change at both
    // importers, nothing removed, and both kinds of request ran through the step with no failure.
    let settled = |label: &'static str, generation: u64| {
        let (regs, tick, removed) = (
            [&root, &mid, &east, &far, &west],
            tick.clone(),
            removed.clone(),
        );
        let (admin_tally, dns_tally) = (admin_tally.clone(), dns_tally.clone());
        async move {
            let (admin_before, dns_before) = (
                admin_tally.ok.load(Ordering::SeqCst),
                dns_tally.ok.load(Ordering::SeqCst),
            );
            for r in regs {
                reloaded(r, generation).await;
            }
            let now = tick.load(Ordering::SeqCst);
            tick_reaches(regs[4], now).await;
            tick_reaches(regs[3], now).await;
            assert!(
                !regs[4].catalog.by_fqdn("stable.shop.xcc.test").is_empty(),
                "{label}: west lost stable"
            );
            assert!(
                !removed.load(Ordering::SeqCst),
                "{label}: a record was removed"
            );
            admin_tally
                .ran_clean("admin calls", label, admin_before, 20)
                .await;
            dns_tally
                .ran_clean("DNS queries", label, dns_before, 20)
                .await;
        }
    };
    settled("before", 1).await;

    // Step 1: the new CA added to every bundle (the operator's too).
    init("pki-b");
    for name in REGISTRIES.iter().chain(&["ops"]) {
        ok(
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
    }
    settled("step 1", 2).await;

    // Step 2: every leaf reissued from the new CA.
    for name in REGISTRIES {
        issue(dir, "pki-b", name);
    }
    issue_admin("pki-b");
    settled("step 2", 3).await;

    // Step 3: the old CA removed everywhere.
    for name in REGISTRIES.iter().chain(&["ops"]) {
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
    settled("step 3", 4).await;

    // New connections from the CLI: the operator on the new CA lists east's services; an admin
    // leaf still from the old CA (beside a bundle that trusts both) is refused by east.
    let admin = |tls_dir: &str| {
        xcc(
            dir,
            &[
                "admin",
                "--addr",
                &east.admin_addr.to_string(),
                "--tls-dir",
                tls_dir,
                "services",
            ],
        )
    };
    let (code, out) = admin("ops");
    assert_eq!(code, 0, "the operator on the new CA:\n{out}");
    assert!(out.contains("stable.shop.xcc.test"), "{out}");
    ok(
        dir,
        &[
            "certs",
            "issue",
            "--admin",
            "--ca-dir",
            "pki-a",
            "--cluster",
            "late",
            "--out",
            "late",
        ],
    );
    ok(
        dir,
        &[
            "certs",
            "bundle",
            "add",
            "--bundle",
            "late/ca.crt",
            "--ca",
            "pki-b/ca.crt",
        ],
    );
    let (code, out) = admin("late");
    assert_eq!(code, 1, "an admin leaf of the removed CA:\n{out}");
    assert!(
        out.contains("refused our certificate: it does not trust the CA that issued it"),
        "{out}"
    );

    stop.cancel();
    writer.await.unwrap();
    admin_load.await.unwrap();
    dns_load.join().unwrap();
    tick_reaches(&west, tick.load(Ordering::SeqCst)).await;
    tick_reaches(&far, tick.load(Ordering::SeqCst)).await;
    assert!(
        !removed.load(Ordering::SeqCst),
        "after: a record was removed"
    );
    eprintln!(
        "admin calls: {} ok, {} failed; DNS queries: {} ok, {} failed; tick {}",
        admin_tally.ok.load(Ordering::SeqCst),
        admin_tally.failed.load(Ordering::SeqCst),
        dns_tally.ok.load(Ordering::SeqCst),
        dns_tally.failed.load(Ordering::SeqCst),
        tick.load(Ordering::SeqCst),
    );
    for w in watchers {
        w.abort();
    }
    crate::dns_cli::stop(dns);
}
