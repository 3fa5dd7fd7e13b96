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
use crate::common::{Summary, Target as Goal, loadavg, targets_table};
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

use xcc_output::{Output, table};

mod measure;
mod probes;
mod report;
mod shape;
mod tree;

use measure::*;
use probes::*;
use report::*;
use shape::*;
use tree::*;

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
// Driver

async fn bench(args: HierarchyArgs, timeout: Duration) -> anyhow::Result<()> {
    let shape = Shape::of(&args);
    check(&args, &shape)?;
    let started = Instant::now();
    let loadavg_start = loadavg();
    let pki = TreePki::new().context("writing the bench PKI")?;

    // Memory probes first, while this process is small and the machine quiet.
    let (root_registry, level_only) = if args.skip_memory_probe {
        (None, None)
    } else {
        memory_probes(&args, &shape, &pki, timeout, started).await?
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
    if let Err(e) = start_tree(&shape, &pki, &cancel, &mut regs).await {
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

/// The flags' bounds, and an open-file limit that covers the tree.
fn check(args: &HierarchyArgs, shape: &Shape) -> anyhow::Result<()> {
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
    Ok(())
}

/// The root registry's and the bare level's memory per service, each in a child process.
async fn memory_probes(
    args: &HierarchyArgs,
    shape: &Shape,
    pki: &TreePki,
    timeout: Duration,
    started: Instant,
) -> anyhow::Result<(Option<Probe>, Option<Probe>)> {
    progress(
        started,
        format!(
            "memory probe: root registry in a child process, {} services from {} children",
            shape.services, shape.mids
        ),
    );
    let root = root_probe(shape, pki, timeout)
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
    let level = level_probe(args, timeout)
        .await
        .context("Level/Catalog memory probe")?;
    progress(
        started,
        format!(
            "          {:.0} bytes per service (VmRSS {} -> {} KiB)",
            level.bytes_per_service, level.rss_before_kib, level.rss_after_kib
        ),
    );
    Ok((Some(root), Some(level)))
}

/// Starts the root, the mids under it and the leaves under them, in `regs` in that order
/// (what was started stays there for the caller to shut down, whatever happens).
async fn start_tree(
    shape: &Shape,
    pki: &TreePki,
    cancel: &CancellationToken,
    regs: &mut Vec<Registry>,
) -> anyhow::Result<()> {
    regs.push(start_node(pki, ROOT, None, shape.carry_policies()?, cancel).await?);
    let root_addr = regs[0].hamlet_addr;
    for m in 0..shape.mids {
        regs.push(start_node(pki, &mid_name(m), Some(root_addr), vec![], cancel).await?);
    }
    for leaf in 0..shape.leaves {
        let mid_addr = regs[1 + shape.mid_of(leaf)].hamlet_addr;
        regs.push(start_node(pki, &shape.leaf_name(leaf), Some(mid_addr), vec![], cancel).await?);
    }
    Ok(())
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
