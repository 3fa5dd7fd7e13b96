//! `xcc bench first-grant`: how long a first grant takes when the question was asked before the
//! service existed (a caller deployed before the service it calls).
//!
//! Three registries in this process, over real mTLS on 127.0.0.1: `root`, and under it `b1` and
//! `b2`. `b1` imports `shop/api-0 … api-<N-1>` as its workload `web` from the start; they do
//! not exist yet, so the root answers each "not found". Then, one at a time, `b2` exports
//! `api-<i>` (admitting `b1/web`); a sample runs from the root's catalog holding it (the owner's
//! announcement reached the tree) to `b1`'s catalog holding the granted import. Every wait is
//! event-driven (catalog events) and bounded by `--timeout-seconds`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use xcc_certs::pki::{self, IssueRequest};
use xcc_registry::catalog::{CatalogEvent, Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::link::ParentSpec;
use xcc_registry::federation::{Question, Target};
use xcc_registry::hamlet::client::Backoff;
use xcc_registry::{Registry, RegistryConfig};

use crate::common::{Summary, loadavg};

#[derive(Args, Debug)]
pub struct FirstGrantArgs {
    /// Services asked for before they exist (one sample each).
    #[arg(long, default_value_t = 20)]
    pub services: usize,
    /// Upper bound for any one wait (tree attached, one sample).
    #[arg(long, default_value_t = 60)]
    pub timeout_seconds: u64,
}

async fn start(
    dir: &std::path::Path,
    ca: &pki::Ca,
    name: &str,
    parent: Option<std::net::SocketAddr>,
    imports: Vec<Question>,
    cancel: &CancellationToken,
) -> anyhow::Result<Registry> {
    let mut req = IssueRequest::cluster(name);
    req.dns = vec!["localhost".into()];
    req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
    let tls = pki::write_issued(&dir.join(name), ca, &ca.issue(&req)?)?;
    let mut cfg = RegistryConfig::loopback(tls);
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_secs(1),
    };
    cfg.federation.parent = parent.map(|addr| ParentSpec {
        name: "parent".into(),
        address: addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
    });
    cfg.federation.imports = imports;
    Registry::start(cfg, cancel.child_token())
        .await
        .with_context(|| format!("starting registry {name}"))
}

/// Wait for an Upsert that `matches`, bounded.
async fn upserted(
    rx: &mut broadcast::Receiver<CatalogEvent>,
    timeout: Duration,
    what: &str,
    matches: impl Fn(&ServiceEntry) -> bool,
) -> anyhow::Result<Instant> {
    let fut = async {
        loop {
            match rx.recv().await {
                Ok(CatalogEvent::Upsert(e)) if matches(&e) => return Ok(Instant::now()),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    bail!("events lost waiting for {what}")
                }
                Err(broadcast::error::RecvError::Closed) => {
                    bail!("catalog closed waiting for {what}")
                }
            }
        }
    };
    tokio::time::timeout(timeout, fut)
        .await
        .with_context(|| format!("timed out waiting for {what}"))?
}

pub async fn run(args: FirstGrantArgs) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout_seconds);
    xcc_certs::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let ca = pki::init_ca_dir("xcc.bench", &dir.path().join("ca"))?;
    let cancel = CancellationToken::new();
    let root = start(dir.path(), &ca, "root", None, vec![], &cancel).await?;
    let questions: Vec<Question> = (0..args.services)
        .map(|i| {
            Question::new(
                Target::Name {
                    namespace: "shop".into(),
                    name: format!("api-{i}"),
                },
                "web",
            )
        })
        .collect();
    let b1 = start(
        dir.path(),
        &ca,
        "b1",
        Some(root.hamlet_addr),
        questions,
        &cancel,
    )
    .await?;
    let b2 = start(
        dir.path(),
        &ca,
        "b2",
        Some(root.hamlet_addr),
        vec![],
        &cancel,
    )
    .await?;
    // Until b1's questions are all answered (not found) and b2 is attached.
    let mut level = b1.level.subscribe();
    tokio::time::timeout(timeout, async {
        while !(xcc_registry::federation::imports::all_decided(&b1.level)
            && root.level.subtree().len() == 3)
        {
            if level.changed().await.is_err() {
                return;
            }
        }
    })
    .await
    .context("the tree did not form in time")?;
    let (mut root_rx, mut b1_rx) = (root.catalog.subscribe(), b1.catalog.subscribe());
    let mut samples = vec![];
    for i in 0..args.services {
        let name = format!("api-{i}");
        b2.catalog.upsert(ServiceEntry {
            key: ServiceKey::new("b2", "shop", name.as_str()),
            source: Source::Local,
            fqdn: format!("{name}.shop.svc.clusterset.local").into(),
            endpoints: vec![Endpoint {
                address: "10.2.0.1".into(),
                port: 8443,
            }],
            ports: vec![],
            labels: Default::default(),
            allowed_requesters: vec!["b1/web".into()],
            origin: None,
            revision: 0,
        });
        let at_root = upserted(&mut root_rx, timeout, "the announcement at the root", |e| {
            e.key.name.as_str() == name
        })
        .await?;
        let granted = upserted(&mut b1_rx, timeout, "the grant at b1", |e| {
            e.key.name.as_str() == name && matches!(e.source, Source::Hierarchy(_))
        })
        .await?;
        samples.push(granted.duration_since(at_root).as_micros() as i64);
    }
    cancel.cancel();
    let s = Summary::of(&samples).context("no samples")?;
    println!(
        "first grant after the announcement reached the root (query asked before), {} samples: min {:.1} ms, median {:.1} ms, p99 {:.1} ms, max {:.1} ms (load average {})",
        samples.len(),
        s.min as f64 / 1000.0,
        s.percentile(50.0) as f64 / 1000.0,
        s.percentile(99.0) as f64 / 1000.0,
        s.max as f64 / 1000.0,
        loadavg()
    );
    Ok(())
}
