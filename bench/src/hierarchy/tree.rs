//! The tree's registries: their PKI, start, waits and shutdown; this process's /proc figures.

use super::*;

pub(super) fn proc_status(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub(super) fn rss_kib() -> anyhow::Result<u64> {
    proc_status("VmRSS:").context("reading VmRSS from /proc/self/status")
}

pub(super) fn open_file_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

pub(super) fn open_fds() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

pub(super) fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub(super) fn progress(started: Instant, line: impl std::fmt::Display) {
    eprintln!("[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// Registries

pub(super) struct TreePki {
    pub(super) dir: tempfile::TempDir,
    pub(super) ca: pki::Ca,
}

impl TreePki {
    pub(super) fn new() -> anyhow::Result<Self> {
        xcc_certs::install_crypto_provider();
        let dir = tempfile::tempdir().context("creating a temporary directory")?;
        let ca = pki::init_ca_dir("xcc.bench", &dir.path().join("ca"))?;
        Ok(Self { dir, ca })
    }

    pub(super) fn issue(&self, name: &str) -> anyhow::Result<TlsFiles> {
        let mut req = IssueRequest::cluster(name);
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let cert = self
            .ca
            .issue(&req)
            .with_context(|| format!("issuing {name}"))?;
        Ok(pki::write_issued(
            &self.dir.path().join(name),
            &self.ca,
            &cert,
        )?)
    }
}

pub(super) async fn start_node(
    pki: &TreePki,
    name: &str,
    parent: Option<SocketAddr>,
    policies: Vec<(String, String)>,
    cancel: &CancellationToken,
) -> anyhow::Result<Registry> {
    let mut cfg = RegistryConfig::loopback(pki.issue(name)?);
    cfg.federation.policies = policies;
    // Reconnect quickly should a link start before its parent listens.
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
    Registry::start(cfg, cancel.child_token())
        .await
        .with_context(|| format!("starting registry {name}"))
}

/// Wait until `cond` holds for `reg`, re-checking on every change of its level or catalog.
pub(super) async fn wait_for(
    reg: &Registry,
    what: &str,
    timeout: Duration,
    cond: impl Fn(&Registry) -> bool,
    status: impl Fn(&Registry) -> String,
) -> anyhow::Result<()> {
    let mut level = reg.level.subscribe();
    let mut catalog = reg.catalog.subscribe();
    let fut = async {
        loop {
            if cond(reg) {
                return Ok(());
            }
            tokio::select! {
                r = level.changed() => if r.is_err() { bail!("the level of {} was dropped", reg.cluster) },
                r = catalog.recv() => if let Err(RecvError::Closed) = r { bail!("the catalog of {} was closed", reg.cluster) },
            }
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => bail!(
            "timed out after {timeout:?} waiting on {} for {what}; now: {}",
            reg.cluster,
            status(reg)
        ),
    }
}

pub(super) fn tree_status(reg: &Registry) -> String {
    format!(
        "{} clusters in the subtree, {} services in the catalog",
        reg.level.subtree().len(),
        reg.catalog.len()
    )
}

/// Stop every registry (their tokens are children of `cancel`).
pub(super) async fn shutdown_all(cancel: &CancellationToken, regs: Vec<Registry>) {
    cancel.cancel();
    for r in regs {
        let name = r.cluster.clone();
        if let Err(e) = r.shutdown().await {
            eprintln!("warning: {name} stopped with: {e:#}");
        }
    }
}
