//! `xcc bench hierarchy`: a three-level tree of registries in this one process, every registry
//! with its own Hamlet and admin listeners on 127.0.0.1 and every parent link over real mTLS.
//!
//! Shape: one root, `--mids` mid-level registries under it and `--leaves-per-mid` leaves under
//! each (default 1 + 9 + 990 = 1,000 clusters). `--services` services (`Source::Local`,
//! `svc-NNNNN.ns-NN.svc.clusterset.local`, so the default Cedar policies accept the
//! announcement; no allowed requesters, so every lookup is granted): the first leaf holds
//! `--big-leaf-services` of them (default 20,000, more than any queue on the way), the rest are
//! spread round-robin over the other leaves. Once the root holds them all, it measures:
//!
//! - announce propagation: a new service is upserted at a random leaf; a sample runs from that
//!   `Catalog::upsert` to the Upsert event of the same key in the root's catalog (leaf → mid →
//!   root: two links, two policy checks, three catalog writes);
//! - cold lookup: `Level::query` at a leaf for a service in another mid's subtree that this leaf
//!   never asked for; the root resolves it (leaf → mid → root → mid → leaf);
//! - cached lookup: the same questions again, answered from the leaf's cache, through both
//!   `Level::cached` and `Level::query`;
//! - route-notification delivery: when the owner leaf recorded the route of a cold lookup
//!   (`OwnerRoute::since`, stamped by the owner) against when that lookup was issued and when it
//!   returned;
//! - the root's own resolve step (`Level::explain`: lookup and policy, no network) by name and
//!   by FQDN, as a diagnostic for the cold-lookup figure;
//! - memory: a real root registry in a child process (this executable with a hidden flag), its
//!   VmRSS before and after `--mids` child registries in this process announce `--services`
//!   services to it; a bare `Level` and `Catalog` fed the same announcements in another child
//!   process; and this process's VmRSS with the whole tree idle and loaded, for context;
//! - messages that did not fit a federation queue (`Level::overflows`, summed over every
//!   registry at the end): each would have been a drop before; the target is 0.
//!
//! Every setup wait is event-driven (the level's change feed and the catalog's events) and
//! bounded by `--timeout-seconds`.

// `Target` here is the federation lookup target; a benchmark target is a `Goal`.
use crate::bench_common::{Summary, Target as Goal, loadavg, targets_table};
use std::collections::{BTreeSet, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use xcc_certs::pki::{self, IssueRequest};
use xcc_certs::reload::TlsFiles;
use xcc_proto::xcc::federation::v1 as fed;
use xcc_registry::authz::Policies;
use xcc_registry::catalog::{CatalogEvent, Endpoint, NamedPort, ServiceEntry, Source};
use xcc_registry::federation::link::ParentSpec;
use xcc_registry::federation::{Level, Target};
use xcc_registry::hamlet::client::Backoff;
use xcc_registry::{Catalog, Registry, RegistryConfig};

use crate::args::{Output, table};

const ROOT: &str = "root";
const PROBE_ROOT: &str = "probe-root";
/// The workload every lookup is made for.
const REQUESTER_SERVICE: &str = "svc";
/// Quiet time before reading RSS or starting a timed phase, so trailing work of the previous
/// phase (resolver passes, acknowledgements) does not land in the next one.
const SETTLE: Duration = Duration::from_secs(1);

const TARGET_COLD_P99_MS: f64 = 5.0;
const TARGET_CACHED_US: f64 = 10.0;
const TARGET_PROPAGATION_P99_MS: f64 = 50.0;
const TARGET_ROOT_BYTES_PER_SERVICE: f64 = 768.0;

#[derive(Args, Debug)]
pub struct HierarchyArgs {
    /// Mid-level registries under the root (at least 2: cold lookups cross subtrees).
    #[arg(long, default_value_t = 9)]
    pub mids: usize,
    /// Leaf registries under each mid-level registry.
    #[arg(long, default_value_t = 110)]
    pub leaves_per_mid: usize,
    /// Services: the big leaf's, then the rest spread round-robin over the other leaves.
    #[arg(long, default_value_t = 100_000)]
    pub services: usize,
    /// Services held by the first leaf (at most `--services`).
    #[arg(long, default_value_t = 20_000)]
    pub big_leaf_services: usize,
    /// Namespaces the services are spread over (`ns-00`, `ns-01`, ...).
    #[arg(long, default_value_t = 10)]
    pub namespaces: usize,
    /// New services announced one at a time (propagation samples).
    #[arg(long, default_value_t = 500)]
    pub announces: usize,
    /// Cold lookups (each a new (leaf, service) pair across subtrees).
    #[arg(long, default_value_t = 1000)]
    pub lookups: usize,
    /// Passes over the cold-lookup pairs for the cached-lookup figures.
    #[arg(long, default_value_t = 100)]
    pub cached_rounds: usize,
    /// Seed of the pseudo-random choice of leaves and services.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Skip the two child-process memory probes.
    #[arg(long)]
    pub skip_memory_probe: bool,
    /// Upper bound for any one wait (tree attached, services announced, one sample).
    #[arg(long, default_value_t = 120)]
    pub timeout_seconds: u64,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
    /// Internal: run the root-registry memory probe with the TLS files in this directory,
    /// driven over stdin/stdout by the parent bench.
    #[arg(long, hide = true)]
    pub root_probe: Option<PathBuf>,
    /// Internal: run the bare Level/Catalog memory probe and print its result as JSON.
    #[arg(long, hide = true)]
    pub level_probe: bool,
}

pub async fn run(args: HierarchyArgs) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout_seconds.max(1));
    if let Some(dir) = &args.root_probe {
        return root_probe_main(dir, timeout).await;
    }
    if args.level_probe {
        let shape = Shape::of(&args);
        let probe = level_probe_main(&shape)?;
        println!("{}", serde_json::to_string(&probe)?);
        return Ok(());
    }
    bench(args, timeout).await
}

// ---------------------------------------------------------------------------------------------
// Shape, names and services

#[derive(Clone, Debug, Serialize)]
struct Shape {
    clusters: usize,
    mids: usize,
    leaves_per_mid: usize,
    leaves: usize,
    services: usize,
    big_leaf_services: usize,
    namespaces: usize,
}

impl Shape {
    fn of(args: &HierarchyArgs) -> Self {
        let leaves = args.mids * args.leaves_per_mid;
        Self {
            clusters: 1 + args.mids + leaves,
            mids: args.mids,
            leaves_per_mid: args.leaves_per_mid,
            leaves,
            services: args.services,
            big_leaf_services: args.big_leaf_services.min(args.services),
            namespaces: args.namespaces.max(1),
        }
    }

    /// Index of the mid-level registry above leaf `leaf`.
    fn mid_of(&self, leaf: usize) -> usize {
        leaf / self.leaves_per_mid
    }

    /// Leaf that owns initial service `i`: the first leaf the first `big_leaf_services`, the
    /// other leaves the rest, round-robin (all leaves when there is only one).
    fn leaf_of(&self, i: usize) -> usize {
        match (i.checked_sub(self.big_leaf_services), self.leaves) {
            (None, _) | (_, 1) => 0,
            (Some(rest), leaves) => 1 + rest % (leaves - 1),
        }
    }

    fn leaf_name(&self, leaf: usize) -> String {
        leaf_name(self.mid_of(leaf), leaf % self.leaves_per_mid)
    }

    fn namespace(&self, i: usize) -> String {
        format!("ns-{:02}", i % self.namespaces)
    }

    /// The root's configuration of its children: each mid may carry its own leaves.
    fn carry_policies(&self) -> anyhow::Result<Vec<(String, String)>> {
        (0..self.mids)
            .map(|m| {
                let leaves: Vec<String> =
                    (0..self.leaves_per_mid).map(|l| leaf_name(m, l)).collect();
                let leaves: Vec<&str> = leaves.iter().map(String::as_str).collect();
                let text = xcc_registry::authz::carry_policy(&mid_name(m), &leaves)?;
                Ok((format!("carry-{}.cedar", mid_name(m)), text))
            })
            .collect()
    }
}

fn mid_name(m: usize) -> String {
    format!("mid-{:02}", m + 1)
}

fn leaf_name(m: usize, l: usize) -> String {
    format!("leaf-{:02}-{:02}", m + 1, l + 1)
}

fn service_name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// A service as a leaf exports it: one endpoint (unique per `seq`), one port, the service-port
/// annotation, no allowed requesters.
fn service_entry(cluster: &str, namespace: &str, name: &str, seq: usize) -> ServiceEntry {
    let mut labels = xcc_registry::catalog::Labels::new();
    labels.insert(
        xcc_proto::names::SERVICE_PORT_ANNOTATION.to_string(),
        "443".to_string(),
    );
    ServiceEntry {
        key: xcc_registry::catalog::ServiceKey::new(cluster, namespace, name),
        source: Source::Local,
        fqdn: xcc_proto::names::clusterset_fqdn(name, namespace).into(),
        endpoints: vec![Endpoint {
            address: format!(
                "10.{}.{}.{}",
                (seq >> 16) & 0xff,
                (seq >> 8) & 0xff,
                seq & 0xff
            )
            .into(),
            port: 443,
        }],
        ports: vec![NamedPort {
            name: "https".into(),
            port: 443,
            protocol: "TCP".into(),
            target_port: 0,
        }],
        labels,
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    }
}

/// Initial service `i` as its owner exports it.
fn initial_entry(shape: &Shape, i: usize) -> ServiceEntry {
    service_entry(
        &shape.leaf_name(shape.leaf_of(i)),
        &shape.namespace(i),
        &service_name(i),
        i,
    )
}

/// SplitMix64: reproducible choices without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

// ---------------------------------------------------------------------------------------------
// Results

/// Percentiles of signed nanosecond samples ([`Summary`]).
#[derive(Clone, Debug, Serialize)]
struct Stats {
    count: usize,
    p50_ns: i64,
    p99_ns: i64,
    max_ns: i64,
    min_ns: i64,
    mean_ns: f64,
}

impl Stats {
    fn of(v: Vec<i64>) -> Option<Self> {
        let s = Summary::of(&v)?;
        Some(Stats {
            count: v.len(),
            p50_ns: s.percentile(50.0),
            p99_ns: s.percentile(99.0),
            max_ns: s.max,
            min_ns: s.min,
            mean_ns: s.mean,
        })
    }
}

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `a - b` in nanoseconds, negative when `a` is earlier.
fn signed_ns(a: SystemTime, b: SystemTime) -> i64 {
    match a.duration_since(b) {
        Ok(d) => ns(d),
        Err(e) => -ns(e.duration()),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Probe {
    services: usize,
    rss_before_kib: u64,
    rss_after_kib: u64,
    bytes_per_service: f64,
}

impl Probe {
    fn new(services: usize, before: u64, after: u64) -> Self {
        Self {
            services,
            rss_before_kib: before,
            rss_after_kib: after,
            bytes_per_service: (after as f64 - before as f64) * 1024.0 / services.max(1) as f64,
        }
    }
}

#[derive(Debug, Serialize)]
struct Environment {
    nproc: usize,
    open_file_limit: Option<u64>,
    /// Open descriptors of this process with the whole tree running.
    open_fds_with_tree: Option<usize>,
    /// Threads of this process with the whole tree running.
    threads_with_tree: Option<u64>,
    inotify_max_user_instances: Option<u64>,
}

#[derive(Debug, Default, Serialize)]
struct Setup {
    /// Start every registry (TLS load, listeners bound, links spawned).
    start_s: f64,
    /// From the last start until the root's subtree lists every cluster.
    attach_s: f64,
    /// From the first bulk upsert at the leaves until the root holds every service.
    load_s: f64,
}

#[derive(Debug, Serialize)]
struct Memory {
    /// Child process: a real root registry; its children (in this process) announce the
    /// services.
    root_registry: Option<Probe>,
    /// Child process: a bare Level and Catalog fed the same announcements, no I/O.
    level_only: Option<Probe>,
    /// This process with the tree attached and no service, then with every service at the
    /// root: leaf, mid and root copies plus whatever the transfer left allocated.
    tree: Probe,
}

#[derive(Debug, Serialize)]
struct Report {
    shape: Shape,
    environment: Environment,
    setup: Setup,
    /// Leaf `Catalog::upsert` → Upsert event in the root's catalog.
    propagation: Option<Stats>,
    /// Propagation samples whose event was missed (Lagged) and confirmed by a catalog read.
    propagation_lagged: usize,
    /// `Level::query` at a leaf, first time for that (leaf, service).
    cold: Option<Stats>,
    cold_resolved_by_root: usize,
    cold_not_granted: usize,
    /// `Level::cached` at the leaf for a question answered before.
    cached_via_cached: Option<Stats>,
    /// `Level::query` at the leaf for a question answered before.
    cached_via_query: Option<Stats>,
    cached_misses: usize,
    /// Cold lookup issued → route recorded at the owner (`OwnerRoute::since`).
    route_from_issue: Option<Stats>,
    /// Cold lookup returned → route recorded at the owner (negative: recorded first).
    route_from_return: Option<Stats>,
    routes_before_return: usize,
    /// `Level::explain` at the root (lookup + policy, no network), by name and by FQDN.
    root_resolve_by_name: Option<Stats>,
    root_resolve_by_fqdn: Option<Stats>,
    memory: Memory,
    targets: Vec<Goal>,
    seed: u64,
    loadavg_start: String,
    loadavg_end: String,
    total_s: f64,
}

// ---------------------------------------------------------------------------------------------
// /proc

fn proc_status(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn rss_kib() -> anyhow::Result<u64> {
    proc_status("VmRSS:").context("reading VmRSS from /proc/self/status")
}

fn open_file_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

fn open_fds() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn progress(started: Instant, line: impl std::fmt::Display) {
    eprintln!("[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// Registries

struct TreePki {
    dir: tempfile::TempDir,
    ca: pki::Ca,
}

impl TreePki {
    fn new() -> anyhow::Result<Self> {
        xcc_certs::install_crypto_provider();
        let dir = tempfile::tempdir().context("creating a temporary directory")?;
        let ca = pki::init_ca_dir("xcc.bench", &dir.path().join("ca"))?;
        Ok(Self { dir, ca })
    }

    fn issue(&self, name: &str) -> anyhow::Result<TlsFiles> {
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

async fn start_node(
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
async fn wait_for(
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

fn tree_status(reg: &Registry) -> String {
    format!(
        "{} clusters in the subtree, {} services in the catalog",
        reg.level.subtree().len(),
        reg.catalog.len()
    )
}

/// Stop every registry (their tokens are children of `cancel`).
async fn shutdown_all(cancel: &CancellationToken, regs: Vec<Registry>) {
    cancel.cancel();
    for r in regs {
        let name = r.cluster.clone();
        if let Err(e) = r.shutdown().await {
            eprintln!("warning: {name} stopped with: {e:#}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Driver

async fn bench(args: HierarchyArgs, timeout: Duration) -> anyhow::Result<()> {
    let shape = Shape::of(&args);
    if args.mids < 2 {
        bail!("--mids must be at least 2: cold lookups go to another mid's subtree");
    }
    if args.leaves_per_mid == 0 || args.services == 0 || args.namespaces == 0 {
        bail!("--leaves-per-mid, --services and --namespaces must be positive");
    }
    if args.services > 1 << 24 {
        bail!("--services is at most 16777216 (endpoints are 10.x.y.z)");
    }
    if args.announces == 0 || args.lookups == 0 || args.cached_rounds == 0 {
        bail!("--announces, --lookups and --cached-rounds must be positive");
    }
    let fd_limit = open_file_limit();
    // Per registry: two listeners, the certificate watcher, a parent link and the session it
    // opens at the parent; plus the runtime's own descriptors.
    let fds_needed = shape.clusters as u64 * 8 + 256;
    if let Some(limit) = fd_limit
        && limit < fds_needed
    {
        bail!(
            "the open-file limit is {limit}; {} registries need about {fds_needed}: raise it first (e.g. `ulimit -n 4096`)",
            shape.clusters
        );
    }
    let started = Instant::now();
    let loadavg_start = loadavg();
    let pki = TreePki::new().context("writing the bench PKI")?;

    // Memory probes first, while this process is small and the machine quiet.
    let (root_registry, level_only) = if args.skip_memory_probe {
        (None, None)
    } else {
        progress(
            started,
            format!(
                "memory probe: root registry in a child process, {} services from {} children",
                shape.services, shape.mids
            ),
        );
        let root = root_probe(&shape, &pki, timeout)
            .await
            .context("root-registry memory probe")?;
        progress(
            started,
            format!(
                "          {:.0} bytes per service (VmRSS {} -> {} KiB)",
                root.bytes_per_service, root.rss_before_kib, root.rss_after_kib
            ),
        );
        progress(
            started,
            "memory probe: bare Level and Catalog in a child process",
        );
        let level = level_probe(&args, timeout)
            .await
            .context("Level/Catalog memory probe")?;
        progress(
            started,
            format!(
                "          {:.0} bytes per service (VmRSS {} -> {} KiB)",
                level.bytes_per_service, level.rss_before_kib, level.rss_after_kib
            ),
        );
        (Some(root), Some(level))
    };

    // The tree.
    progress(
        started,
        format!(
            "starting {} registries: 1 root, {} mids, {} leaves",
            shape.clusters, shape.mids, shape.leaves
        ),
    );
    let cancel = CancellationToken::new();
    let mut setup = Setup::default();
    let t = Instant::now();
    let mut regs: Vec<Registry> = Vec::with_capacity(shape.clusters);
    let built = async {
        regs.push(start_node(&pki, ROOT, None, shape.carry_policies()?, &cancel).await?);
        let root_addr = regs[0].hamlet_addr;
        for m in 0..shape.mids {
            regs.push(start_node(&pki, &mid_name(m), Some(root_addr), vec![], &cancel).await?);
        }
        for leaf in 0..shape.leaves {
            let mid_addr = regs[1 + shape.mid_of(leaf)].hamlet_addr;
            regs.push(
                start_node(
                    &pki,
                    &shape.leaf_name(leaf),
                    Some(mid_addr),
                    vec![],
                    &cancel,
                )
                .await?,
            );
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = built {
        shutdown_all(&cancel, regs).await;
        return Err(e);
    }
    setup.start_s = t.elapsed().as_secs_f64();
    let result = measure_tree(&args, &shape, &regs, &mut setup, timeout, started).await;
    progress(started, "stopping the tree");
    shutdown_all(&cancel, regs).await;
    let (tree, environment, m) = result?;

    let memory = Memory {
        root_registry,
        level_only,
        tree,
    };
    let targets = targets(&m, &memory);
    let report = Report {
        shape,
        environment,
        setup,
        propagation: m.propagation,
        propagation_lagged: m.propagation_lagged,
        cold: m.cold,
        cold_resolved_by_root: m.cold_resolved_by_root,
        cold_not_granted: m.cold_not_granted,
        cached_via_cached: m.cached_via_cached,
        cached_via_query: m.cached_via_query,
        cached_misses: m.cached_misses,
        route_from_issue: m.route_from_issue,
        route_from_return: m.route_from_return,
        routes_before_return: m.routes_before_return,
        root_resolve_by_name: m.root_resolve_by_name,
        root_resolve_by_fqdn: m.root_resolve_by_fqdn,
        memory,
        targets,
        seed: args.seed,
        loadavg_start,
        loadavg_end: loadavg(),
        total_s: started.elapsed().as_secs_f64(),
    };
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).context("rendering JSON")?
        ),
        Output::Table => print!("{}", render(&report)),
    }
    Ok(())
}

#[derive(Default)]
struct Measured {
    propagation: Option<Stats>,
    propagation_lagged: usize,
    cold: Option<Stats>,
    cold_resolved_by_root: usize,
    cold_not_granted: usize,
    cached_via_cached: Option<Stats>,
    cached_via_query: Option<Stats>,
    cached_misses: usize,
    route_from_issue: Option<Stats>,
    route_from_return: Option<Stats>,
    routes_before_return: usize,
    root_resolve_by_name: Option<Stats>,
    root_resolve_by_fqdn: Option<Stats>,
    /// Sum of `Level::overflows` over every registry of the tree after the measurements.
    overflows: Option<u64>,
}

async fn measure_tree(
    args: &HierarchyArgs,
    shape: &Shape,
    regs: &[Registry],
    setup: &mut Setup,
    timeout: Duration,
    started: Instant,
) -> anyhow::Result<(Probe, Environment, Measured)> {
    let root = &regs[0];
    let leaves = &regs[1 + shape.mids..];
    let mut m = Measured::default();

    // Attach: the root's subtree lists every cluster.
    let t = Instant::now();
    wait_for(
        root,
        &format!("all {} clusters in the root's subtree", shape.clusters),
        timeout,
        |r| r.level.subtree().len() == shape.clusters,
        tree_status,
    )
    .await?;
    setup.attach_s = t.elapsed().as_secs_f64();
    progress(
        started,
        format!(
            "tree attached ({:.2} s to start, {:.2} s to attach)",
            setup.start_s, setup.attach_s
        ),
    );
    tokio::time::sleep(SETTLE).await;
    let rss_idle = rss_kib()?;

    // Load: every leaf's share in one replace_source; wait for the root to hold them all.
    progress(
        started,
        format!(
            "loading {} services over {} leaves",
            shape.services, shape.leaves
        ),
    );
    let mut per_leaf: Vec<Vec<ServiceEntry>> = vec![Vec::new(); shape.leaves];
    for i in 0..shape.services {
        per_leaf[shape.leaf_of(i)].push(initial_entry(shape, i));
    }
    let t = Instant::now();
    let waited = async {
        wait_for(
            root,
            &format!("all {} services at the root", shape.services),
            timeout,
            |r| r.catalog.len() >= shape.services,
            tree_status,
        )
        .await
    };
    let load = async {
        for (leaf, entries) in leaves.iter().zip(per_leaf) {
            leaf.catalog.replace_source(&Source::Local, entries);
            tokio::task::yield_now().await;
        }
    };
    let (waited, ()) = tokio::join!(waited, load);
    waited?;
    setup.load_s = t.elapsed().as_secs_f64();
    if root.catalog.len() != shape.services {
        bail!(
            "the root holds {} services, expected {}",
            root.catalog.len(),
            shape.services
        );
    }
    progress(
        started,
        format!("root holds every service ({:.2} s)", setup.load_s),
    );
    tokio::time::sleep(SETTLE).await;
    let rss_loaded = rss_kib()?;
    let environment = Environment {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        open_file_limit: open_file_limit(),
        open_fds_with_tree: open_fds(),
        threads_with_tree: proc_status("Threads:"),
        inotify_max_user_instances: read_u64("/proc/sys/fs/inotify/max_user_instances"),
    };
    let tree = Probe::new(shape.services, rss_idle, rss_loaded);

    let mut rng = Rng(args.seed);

    // Announce propagation.
    progress(
        started,
        format!(
            "propagation: {} new services at random leaves, one at a time",
            args.announces
        ),
    );
    let mut samples = Vec::with_capacity(args.announces);
    for k in 0..args.announces {
        let leaf = &leaves[rng.below(leaves.len())];
        let name = format!("new-{k:05}");
        let entry = service_entry(
            &leaf.cluster,
            &shape.namespace(k),
            &name,
            shape.services + k,
        );
        let key = entry.key.clone();
        let mut events = root.catalog.subscribe();
        let t0 = Instant::now();
        if leaf.catalog.upsert(entry).is_none() {
            bail!("the upsert of {key} changed nothing");
        }
        let seen = async {
            loop {
                match events.recv().await {
                    Ok(CatalogEvent::Upsert(e)) if e.key == key => {
                        return Ok((Instant::now(), false));
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => {
                        if root.catalog.get(&key).is_some() {
                            return Ok((Instant::now(), true));
                        }
                    }
                    Err(RecvError::Closed) => bail!("the root's catalog was closed"),
                }
            }
        };
        let (at, lagged) = tokio::time::timeout(timeout, seen)
            .await
            .map_err(|_| anyhow!("{key} did not reach the root within {timeout:?}"))??;
        samples.push(ns(at.saturating_duration_since(t0)));
        m.propagation_lagged += usize::from(lagged);
    }
    m.propagation = Stats::of(samples);
    if let Some(s) = &m.propagation {
        progress(
            started,
            format!(
                "          p50 {:.3} ms, p99 {:.3} ms",
                s.p50_ns as f64 / 1e6,
                s.p99_ns as f64 / 1e6
            ),
        );
    }
    tokio::time::sleep(SETTLE).await;

    // Cold lookups, each followed by the wait for its route at the owner.
    progress(
        started,
        format!(
            "cold lookups: {} new (leaf, service) pairs across subtrees, then the route at the owner",
            args.lookups
        ),
    );
    let mut asked: HashSet<(usize, usize)> = HashSet::new();
    let mut pairs: Vec<(usize, usize, Target)> = Vec::with_capacity(args.lookups);
    let mut cold = Vec::with_capacity(args.lookups);
    let mut from_issue = Vec::with_capacity(args.lookups);
    let mut from_return = Vec::with_capacity(args.lookups);
    for _ in 0..args.lookups {
        let mut pick = None;
        for _ in 0..10_000 {
            let l = rng.below(shape.leaves);
            let s = rng.below(shape.services);
            if shape.mid_of(shape.leaf_of(s)) != shape.mid_of(l) && asked.insert((l, s)) {
                pick = Some((l, s));
                break;
            }
        }
        let (l, s) = pick.context("no unasked (leaf, service) pair found; lower --lookups")?;
        let requester = &leaves[l];
        let owner = &leaves[shape.leaf_of(s)];
        let (namespace, name) = (shape.namespace(s), service_name(s));
        let target = Target::Name {
            namespace: namespace.clone(),
            name: name.clone(),
        };
        let issued = SystemTime::now();
        let t0 = Instant::now();
        let answer = requester
            .level
            .query(target.clone(), REQUESTER_SERVICE, false, timeout)
            .await;
        let elapsed = t0.elapsed();
        let returned = SystemTime::now();
        if answer.unavailable {
            bail!(
                "cold lookup of {namespace}/{name} from {}: {}",
                requester.cluster,
                answer.error
            );
        }
        cold.push(ns(elapsed));
        if !(answer.found && answer.access_allowed) {
            m.cold_not_granted += 1;
            continue;
        }
        m.cold_resolved_by_root += usize::from(answer.resolver_cluster == ROOT);
        pairs.push((l, s, target));
        let since = wait_route(owner, &namespace, &name, &requester.cluster, timeout).await?;
        from_issue.push(signed_ns(since, issued));
        let d = signed_ns(since, returned);
        m.routes_before_return += usize::from(d < 0);
        from_return.push(d);
    }
    m.cold = Stats::of(cold);
    m.route_from_issue = Stats::of(from_issue);
    m.route_from_return = Stats::of(from_return);
    if let Some(s) = &m.cold {
        progress(
            started,
            format!(
                "          cold p50 {:.3} ms, p99 {:.3} ms; {} resolved by the root, {} not granted",
                s.p50_ns as f64 / 1e6,
                s.p99_ns as f64 / 1e6,
                m.cold_resolved_by_root,
                m.cold_not_granted
            ),
        );
    }

    // Cached lookups: the same questions, many passes.
    progress(
        started,
        format!(
            "cached lookups: {} passes over {} answered questions",
            args.cached_rounds,
            pairs.len()
        ),
    );
    let calls = args.cached_rounds * pairs.len();
    let mut via_cached = Vec::with_capacity(calls);
    let mut via_query = Vec::with_capacity(calls);
    for _ in 0..args.cached_rounds {
        for (l, _, target) in &pairs {
            let level = &leaves[*l].level;
            let t0 = Instant::now();
            let hit = level.cached(target, REQUESTER_SERVICE);
            let d = t0.elapsed();
            m.cached_misses += usize::from(hit.is_none());
            std::hint::black_box(hit);
            via_cached.push(ns(d));
        }
        tokio::task::yield_now().await;
    }
    for _ in 0..args.cached_rounds {
        for (l, _, target) in &pairs {
            let level = &leaves[*l].level;
            let target = target.clone();
            let t0 = Instant::now();
            let answer = level.query(target, REQUESTER_SERVICE, false, timeout).await;
            let d = t0.elapsed();
            m.cached_misses += usize::from(!(answer.found && answer.access_allowed));
            std::hint::black_box(answer);
            via_query.push(ns(d));
        }
        tokio::task::yield_now().await;
    }
    m.cached_via_cached = Stats::of(via_cached);
    m.cached_via_query = Stats::of(via_query);

    // The root's resolve step alone, by name and by FQDN.
    let mut by_name = Vec::with_capacity(pairs.len());
    let mut by_fqdn = Vec::with_capacity(pairs.len());
    for (l, s, target) in &pairs {
        let requester = &leaves[*l].cluster;
        let fqdn = Target::Fqdn(xcc_proto::names::clusterset_fqdn(
            &service_name(*s),
            &shape.namespace(*s),
        ));
        for (t, out) in [(target, &mut by_name), (&fqdn, &mut by_fqdn)] {
            let t0 = Instant::now();
            let found = root.level.explain(t, requester, REQUESTER_SERVICE, true);
            let d = t0.elapsed();
            if found.is_none() {
                bail!("the root cannot resolve {t}");
            }
            std::hint::black_box(found);
            out.push(ns(d));
        }
    }
    m.root_resolve_by_name = Stats::of(by_name);
    m.root_resolve_by_fqdn = Stats::of(by_fqdn);
    m.overflows = Some(regs.iter().map(|r| r.level.overflows().get()).sum());
    Ok((tree, environment, m))
}

/// Wait for `owner` to record the route for (`namespace`/`name`, `caller`/svc); returns when
/// the owner stamped it.
async fn wait_route(
    owner: &Registry,
    namespace: &str,
    name: &str,
    caller: &str,
    timeout: Duration,
) -> anyhow::Result<SystemTime> {
    let mut changes = owner.level.subscribe();
    let fut = async {
        loop {
            if let Some(r) = owner.level.owner_routes().into_iter().find(|r| {
                r.target_namespace == namespace
                    && r.target_service == name
                    && r.caller_cluster == caller
                    && r.caller_service == REQUESTER_SERVICE
            }) {
                return Ok(r.since);
            }
            if changes.changed().await.is_err() {
                bail!("the level of {} was dropped", owner.cluster);
            }
        }
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| {
        anyhow!(
            "{} did not record the route for {namespace}/{name} from {caller} within {timeout:?}",
            owner.cluster
        )
    })?
}

// ---------------------------------------------------------------------------------------------
// Memory probes

/// Parent side of the root-registry probe: a child process runs the root; `shape.mids`
/// registries in this process attach to it and announce the services.
async fn root_probe(shape: &Shape, pki: &TreePki, timeout: Duration) -> anyhow::Result<Probe> {
    let files = pki.issue(PROBE_ROOT)?;
    let dir = files
        .cert
        .parent()
        .context("the probe certificate has no directory")?;
    let exe = std::env::current_exe().context("locating the xcc executable")?;
    let mut child = tokio::process::Command::new(&exe)
        .args(["--log", "warn", "bench", "hierarchy", "--timeout-seconds"])
        .arg(timeout.as_secs().to_string())
        .arg("--root-probe")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
    let mut ask = async |cmd: Option<&str>| -> anyhow::Result<String> {
        if let Some(cmd) = cmd {
            stdin.write_all(format!("{cmd}\n").as_bytes()).await?;
            stdin.flush().await?;
        }
        let line = tokio::time::timeout(timeout + Duration::from_secs(5), lines.next_line())
            .await
            .map_err(|_| anyhow!("the probe did not answer {cmd:?} in time"))??
            .ok_or_else(|| anyhow!("the probe exited (asked {cmd:?})"))?;
        if let Some(err) = line.strip_prefix("ERR ") {
            bail!("probe: {err}");
        }
        Ok(line)
    };
    let addr: SocketAddr = ask(None)
        .await?
        .strip_prefix("ADDR ")
        .context("the probe did not print its address")?
        .parse()
        .context("the probe's address")?;

    let cancel = CancellationToken::new();
    let mut children = Vec::with_capacity(shape.mids);
    let clusters = shape.mids + 1;
    let result = async {
        for m in 0..shape.mids {
            children.push(
                start_node(
                    pki,
                    &format!("probe-{:02}", m + 1),
                    Some(addr),
                    vec![],
                    &cancel,
                )
                .await?,
            );
        }
        ask(Some(&format!("wait 0 {clusters}"))).await?;
        tokio::time::sleep(SETTLE).await;
        let before: u64 = parse_rss(&ask(Some("rss")).await?)?;
        let mut per_child: Vec<Vec<ServiceEntry>> = vec![Vec::new(); shape.mids];
        for i in 0..shape.services {
            let c = i % shape.mids;
            let mut e = initial_entry(shape, i);
            e.key.cluster = children[c].cluster.as_str().into();
            per_child[c].push(e);
        }
        for (c, entries) in children.iter().zip(per_child) {
            c.catalog.replace_source(&Source::Local, entries);
        }
        ask(Some(&format!("wait {} {clusters}", shape.services))).await?;
        tokio::time::sleep(SETTLE).await;
        let after = parse_rss(&ask(Some("rss")).await?)?;
        anyhow::Ok(Probe::new(shape.services, before, after))
    }
    .await;
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    shutdown_all(&cancel, children).await;
    result
}

fn parse_rss(line: &str) -> anyhow::Result<u64> {
    line.strip_prefix("RSS ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unexpected probe answer {line:?}"))
}

/// Child side of the root-registry probe. Prints `ADDR <hamlet address>`, then answers one
/// line per command read from stdin: `wait <services> <clusters>` (OK once the catalog holds
/// that many services and the subtree that many clusters), `rss` (`RSS <VmRSS KiB> <VmHWM
/// KiB>`). Stops at end of input.
async fn root_probe_main(dir: &Path, timeout: Duration) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let root = Registry::start(
        RegistryConfig::loopback(TlsFiles::in_dir(dir)),
        cancel.clone(),
    )
    .await
    .context("starting the probe root")?;
    println!("ADDR {}", root.hamlet_addr);
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["wait", services, clusters] => {
                let (Ok(services), Ok(clusters)) =
                    (services.parse::<usize>(), clusters.parse::<usize>())
                else {
                    println!("ERR bad numbers in {line:?}");
                    continue;
                };
                let waited = wait_for(
                    &root,
                    &format!("{services} services and {clusters} clusters"),
                    timeout,
                    |r| r.catalog.len() == services && r.level.subtree().len() == clusters,
                    tree_status,
                )
                .await;
                match waited {
                    Ok(()) => println!("OK"),
                    Err(e) => println!("ERR {e:#}"),
                }
            }
            ["rss"] => println!(
                "RSS {} {}",
                proc_status("VmRSS:").unwrap_or(0),
                proc_status("VmHWM:").unwrap_or(0)
            ),
            _ => println!("ERR unknown command {line:?}"),
        }
    }
    cancel.cancel();
    root.shutdown().await
}

/// Parent side of the bare Level/Catalog probe.
async fn level_probe(args: &HierarchyArgs, timeout: Duration) -> anyhow::Result<Probe> {
    let exe = std::env::current_exe().context("locating the xcc executable")?;
    let out = tokio::process::Command::new(&exe)
        .args(["--log", "warn", "bench", "hierarchy", "--level-probe"])
        .args(["--mids", &args.mids.to_string()])
        .args(["--leaves-per-mid", &args.leaves_per_mid.to_string()])
        .args(["--services", &args.services.to_string()])
        .args(["--namespaces", &args.namespaces.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(timeout, out)
        .await
        .map_err(|_| anyhow!("the probe did not finish within {timeout:?}"))?
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!("the probe failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .with_context(|| format!("parsing the probe's output {text:?}"))
}

/// Child side: a root `Level` with the tree's mids attached, fed every service as the mid of
/// its owner would announce it (policy check included). VmRSS before and after the
/// announcements.
fn level_probe_main(shape: &Shape) -> anyhow::Result<Probe> {
    let catalog = Catalog::new();
    let policies = Policies::from_sources(&shape.carry_policies()?)?;
    let level = Level::new(
        PROBE_ROOT,
        None,
        catalog.clone(),
        xcc_registry::authz::Gate::fixed("xcc.test", policies),
    );
    let mut sessions = Vec::with_capacity(shape.mids);
    for m in 0..shape.mids {
        let mut clusters: BTreeSet<String> =
            (0..shape.leaves_per_mid).map(|l| leaf_name(m, l)).collect();
        clusters.insert(mid_name(m));
        let (tx, rx) = xcc_registry::federation::queues::DownLink::new(
            xcc_registry::budget::QueueLimits::new(
                64,
                xcc_registry::budget::QueueLimits::FEDERATION.bytes,
            ),
        );
        level
            .attach_child(
                &mid_name(m),
                "127.0.0.1:1".into(),
                &fed::SubtreeMembership {
                    clusters: clusters.into_iter().collect(),
                    ..Default::default()
                },
                tx,
            )
            .map_err(|e| anyhow!("attaching {}: {e}", mid_name(m)))?;
        sessions.push(rx);
    }
    let before = rss_kib()?;
    for i in 0..shape.services {
        let entry = initial_entry(shape, i);
        let mid = mid_name(shape.mid_of(shape.leaf_of(i)));
        let ann = xcc_registry::federation::convert::announcement(&entry, false);
        level
            .child_announcement(&mid, &ann)
            .map_err(|e| anyhow!("announcing {}: {e}", entry.key))?;
    }
    let after = rss_kib()?;
    if catalog.len() != shape.services {
        bail!(
            "the Level accepted {} of {} announcements",
            catalog.len(),
            shape.services
        );
    }
    drop(sessions);
    Ok(Probe::new(shape.services, before, after))
}

// ---------------------------------------------------------------------------------------------
// Report

fn targets(m: &Measured, memory: &Memory) -> Vec<Goal> {
    // A target that was not measured is listed as a MISS.
    let goal = |name: String, limit: String, v: Option<(String, bool)>| {
        let (measured, pass) = v.unwrap_or_else(|| ("not measured".into(), false));
        Goal {
            name,
            limit,
            measured,
            pass,
        }
    };
    let mut out = vec![goal(
        "cold lookup p99 (leaf -> root -> leaf)".into(),
        format!("< {TARGET_COLD_P99_MS} ms"),
        m.cold.as_ref().map(|s| {
            let v = s.p99_ns as f64 / 1e6;
            (format!("{v:.3} ms"), v < TARGET_COLD_P99_MS)
        }),
    )];
    for (what, s) in [
        ("Level::cached", &m.cached_via_cached),
        ("Level::query", &m.cached_via_query),
    ] {
        out.push(goal(
            format!("cached lookup p99 ({what})"),
            format!("< {TARGET_CACHED_US} us"),
            s.as_ref().map(|s| {
                let v = s.p99_ns as f64 / 1e3;
                (
                    format!("{v:.2} us"),
                    v < TARGET_CACHED_US && m.cached_misses == 0,
                )
            }),
        ));
    }
    out.push(goal(
        "announce propagation p99 (leaf -> root)".into(),
        format!("< {TARGET_PROPAGATION_P99_MS} ms"),
        m.propagation.as_ref().map(|s| {
            let v = s.p99_ns as f64 / 1e6;
            (format!("{v:.3} ms"), v < TARGET_PROPAGATION_P99_MS)
        }),
    ));
    out.push(goal(
        "root memory per service (root registry process, VmRSS delta)".into(),
        format!("<= {TARGET_ROOT_BYTES_PER_SERVICE} B"),
        memory.root_registry.as_ref().map(|p| {
            (
                format!("{:.0} B", p.bytes_per_service),
                p.bytes_per_service <= TARGET_ROOT_BYTES_PER_SERVICE,
            )
        }),
    ));
    out.push(goal(
        "federation messages dropped (queue overflows, all registries)".into(),
        "= 0".into(),
        m.overflows.map(|n| (n.to_string(), n == 0)),
    ));
    out
}

#[derive(Clone, Copy)]
enum Unit {
    Ms,
    Us,
    Ns,
}

fn fmt(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Ms => format!("{:.3} ms", v / 1e6),
        Unit::Us => format!("{:.2} us", v / 1e3),
        Unit::Ns => format!("{v:.0} ns"),
    }
}

fn stats_row(name: &str, s: &Option<Stats>, unit: Unit) -> Vec<String> {
    match s {
        Some(s) => vec![
            name.to_string(),
            s.count.to_string(),
            fmt(s.p50_ns as f64, unit),
            fmt(s.p99_ns as f64, unit),
            fmt(s.max_ns as f64, unit),
            fmt(s.mean_ns, unit),
        ],
        None => vec![
            name.to_string(),
            "0".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ],
    }
}

fn probe_row(name: &str, p: &Option<Probe>) -> Vec<String> {
    match p {
        Some(p) => vec![
            name.to_string(),
            p.services.to_string(),
            format!("{:.1}", p.rss_before_kib as f64 / 1024.0),
            format!("{:.1}", p.rss_after_kib as f64 / 1024.0),
            format!("{:.0}", p.bytes_per_service),
        ],
        None => vec![
            name.to_string(),
            "-".into(),
            "-".into(),
            "-".into(),
            "skipped".into(),
        ],
    }
}

fn render(r: &Report) -> String {
    let opt = |v: Option<u64>| v.map_or("unknown".to_string(), |v| v.to_string());
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== Tree: {} clusters (1 root, {} mids, {} leaves of {} per mid), {} services in {} namespaces, one process, mTLS on 127.0.0.1",
        r.shape.clusters,
        r.shape.mids,
        r.shape.leaves,
        r.shape.leaves_per_mid,
        r.shape.services,
        r.shape.namespaces
    );
    let _ = writeln!(
        out,
        "start {:.2} s, attach {:.2} s, initial load to the root {:.2} s; nproc {}, open-file limit {}, fds in use with the tree {}, threads {}, inotify max_user_instances {}",
        r.setup.start_s,
        r.setup.attach_s,
        r.setup.load_s,
        r.environment.nproc,
        opt(r.environment.open_file_limit),
        r.environment
            .open_fds_with_tree
            .map_or("unknown".to_string(), |v| v.to_string()),
        opt(r.environment.threads_with_tree),
        opt(r.environment.inotify_max_user_instances),
    );
    let _ = writeln!(out, "\n== Latency");
    let rows = vec![
        stats_row(
            "announce propagation (leaf upsert -> root catalog event)",
            &r.propagation,
            Unit::Ms,
        ),
        stats_row(
            "cold lookup (leaf Level::query, resolved by the root)",
            &r.cold,
            Unit::Ms,
        ),
        stats_row(
            "cached lookup (leaf Level::cached)",
            &r.cached_via_cached,
            Unit::Ns,
        ),
        stats_row(
            "cached lookup (leaf Level::query)",
            &r.cached_via_query,
            Unit::Ns,
        ),
        stats_row(
            "route recorded at the owner, from lookup issue",
            &r.route_from_issue,
            Unit::Ms,
        ),
        stats_row(
            "route recorded at the owner, from lookup return",
            &r.route_from_return,
            Unit::Ms,
        ),
        stats_row(
            "root resolve step by name (Level::explain)",
            &r.root_resolve_by_name,
            Unit::Us,
        ),
        stats_row(
            "root resolve step by FQDN (Level::explain)",
            &r.root_resolve_by_fqdn,
            Unit::Us,
        ),
    ];
    out.push_str(&table(
        &["MEASURE", "SAMPLES", "P50", "P99", "MAX", "MEAN"],
        &rows,
    ));
    let _ = writeln!(
        out,
        "cold lookups resolved by the root: {} (not granted: {}); routes recorded before the answer returned: {}; cached misses: {}; propagation events missed (Lagged): {}",
        r.cold_resolved_by_root,
        r.cold_not_granted,
        r.routes_before_return,
        r.cached_misses,
        r.propagation_lagged
    );
    let _ = writeln!(out, "\n== Memory (VmRSS)");
    let rows = vec![
        probe_row(
            "root registry, child process (children announce over mTLS)",
            &r.memory.root_registry,
        ),
        probe_row(
            "bare Level + Catalog, child process (no I/O)",
            &r.memory.level_only,
        ),
        probe_row(
            "whole tree, this process (leaf + mid + root copies)",
            &Some(r.memory.tree.clone()),
        ),
    ];
    out.push_str(&table(
        &[
            "WHAT",
            "SERVICES",
            "BEFORE MiB",
            "AFTER MiB",
            "BYTES/SERVICE",
        ],
        &rows,
    ));
    let _ = writeln!(out, "\n== Targets");
    out.push_str(&targets_table(&r.targets));
    let _ = writeln!(
        out,
        "\nseed {}; load average {} at start, {} at end; total {:.1} s",
        r.seed, r.loadavg_start, r.loadavg_end, r.total_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            clusters: 100,
            mids: 9,
            leaves_per_mid: 10,
            leaves: 90,
            services: 10_000,
            big_leaf_services: 1_000,
            namespaces: 10,
        }
    }

    #[test]
    fn signed_differences() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        let later = t + Duration::from_micros(3);
        assert_eq!(signed_ns(later, t), 3_000);
        assert_eq!(signed_ns(t, later), -3_000);
    }

    #[test]
    fn services_spread_over_every_leaf_under_the_right_mid() {
        let s = shape();
        let mut per_leaf = vec![0usize; s.leaves];
        for i in 0..s.services {
            per_leaf[s.leaf_of(i)] += 1;
        }
        assert_eq!(per_leaf[0], 1_000);
        assert!(per_leaf[1..].iter().all(|&n| n == 101 || n == 102));
        assert_eq!(per_leaf.iter().sum::<usize>(), 10_000);
        assert_eq!(s.leaf_name(0), "leaf-01-01");
        assert_eq!(s.leaf_name(89), "leaf-09-10");
        assert_eq!(s.mid_of(89), 8);
        assert_eq!(mid_name(8), "mid-09");
    }

    #[test]
    fn entries_are_accepted_by_the_default_policies() {
        let s = shape();
        let policies = Policies::default_set();
        for i in [0, 1, 9_999] {
            let e = initial_entry(&s, i);
            assert_eq!(
                e.fqdn,
                format!("svc-{i:05}.ns-{:02}.svc.clusterset.local", i % 10)
            );
            assert!(policies.announce(&e.key.cluster, &e).allowed, "{e:?}");
            let ann = xcc_registry::federation::convert::announcement(&e, false);
            let back = xcc_registry::federation::convert::entry_from_announcement(
                &ann,
                Source::Child("mid-01".into()),
            )
            .expect("valid announcement");
            assert_eq!(back.endpoints, e.endpoints);
        }
    }

    #[test]
    fn level_probe_accepts_every_announcement() {
        let mut s = shape();
        s.services = 300;
        let p = level_probe_main(&s).expect("probe runs");
        assert_eq!(p.services, 300);
    }

    #[test]
    fn rng_is_reproducible_and_bounded() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        for _ in 0..100 {
            let x = a.below(90);
            assert_eq!(x, b.below(90));
            assert!(x < 90);
        }
    }
}
