//! What `xcc bench hierarchy` reports: the result types, the targets and the table.

use super::*;

/// Percentiles of signed nanosecond samples ([`Summary`]).
#[derive(Clone, Debug, Serialize)]
pub(super) struct Stats {
    pub(super) count: usize,
    pub(super) p50_ns: i64,
    pub(super) p99_ns: i64,
    pub(super) max_ns: i64,
    pub(super) min_ns: i64,
    pub(super) mean_ns: f64,
}

impl Stats {
    pub(super) fn of(v: Vec<i64>) -> Option<Self> {
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

pub(super) fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `a - b` in nanoseconds, negative when `a` is earlier.
pub(super) fn signed_ns(a: SystemTime, b: SystemTime) -> i64 {
    match a.duration_since(b) {
        Ok(d) => ns(d),
        Err(e) => -ns(e.duration()),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Probe {
    pub(super) services: usize,
    pub(super) rss_before_kib: u64,
    pub(super) rss_after_kib: u64,
    pub(super) bytes_per_service: f64,
}

impl Probe {
    pub(super) fn new(services: usize, before: u64, after: u64) -> Self {
        Self {
            services,
            rss_before_kib: before,
            rss_after_kib: after,
            bytes_per_service: (after as f64 - before as f64) * 1024.0 / services.max(1) as f64,
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct Environment {
    pub(super) nproc: usize,
    pub(super) open_file_limit: Option<u64>,
    /// Open descriptors of this process with the whole tree running.
    pub(super) open_fds_with_tree: Option<usize>,
    /// Threads of this process with the whole tree running.
    pub(super) threads_with_tree: Option<u64>,
    pub(super) inotify_max_user_instances: Option<u64>,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct Setup {
    /// Start every registry (TLS load, listeners bound, links spawned).
    pub(super) start_s: f64,
    /// From the last start until the root's subtree lists every cluster.
    pub(super) attach_s: f64,
    /// From the first bulk upsert at the leaves until the root holds every service.
    pub(super) load_s: f64,
}

#[derive(Debug, Serialize)]
pub(super) struct Memory {
    /// Child process: a real root registry; its children (in this process) announce the
    /// services.
    pub(super) root_registry: Option<Probe>,
    /// Child process: a bare Level and Catalog fed the same announcements, no I/O.
    pub(super) level_only: Option<Probe>,
    /// This process with the tree attached and no service, then with every service at the
    /// root: leaf, mid and root copies plus whatever the transfer left allocated.
    pub(super) tree: Probe,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) shape: Shape,
    pub(super) environment: Environment,
    pub(super) setup: Setup,
    /// Leaf `Catalog::upsert` → Upsert event in the root's catalog.
    pub(super) propagation: Option<Stats>,
    /// Propagation samples whose event was missed (Lagged) and confirmed by a catalog read.
    pub(super) propagation_lagged: usize,
    /// `Level::query` at a leaf, first time for that (leaf, service).
    pub(super) cold: Option<Stats>,
    pub(super) cold_resolved_by_root: usize,
    pub(super) cold_not_granted: usize,
    /// `Level::cached` at the leaf for a question answered before.
    pub(super) cached_via_cached: Option<Stats>,
    /// `Level::query` at the leaf for a question answered before.
    pub(super) cached_via_query: Option<Stats>,
    pub(super) cached_misses: usize,
    /// Cold lookup issued → route recorded at the owner (`OwnerRoute::since`).
    pub(super) route_from_issue: Option<Stats>,
    /// Cold lookup returned → route recorded at the owner (negative: recorded first).
    pub(super) route_from_return: Option<Stats>,
    pub(super) routes_before_return: usize,
    /// `Level::explain` at the root (lookup + policy, no network), by name and by FQDN.
    pub(super) root_resolve_by_name: Option<Stats>,
    pub(super) root_resolve_by_fqdn: Option<Stats>,
    pub(super) memory: Memory,
    pub(super) targets: Vec<Goal>,
    pub(super) seed: u64,
    pub(super) loadavg_start: String,
    pub(super) loadavg_end: String,
    pub(super) total_s: f64,
}

pub(super) fn targets(m: &Measured, memory: &Memory) -> Vec<Goal> {
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
pub(super) enum Unit {
    Ms,
    Us,
    Ns,
}

pub(super) fn fmt(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Ms => format!("{:.3} ms", v / 1e6),
        Unit::Us => format!("{:.2} us", v / 1e3),
        Unit::Ns => format!("{v:.0} ns"),
    }
}

pub(super) fn stats_row(name: &str, s: &Option<Stats>, unit: Unit) -> Vec<String> {
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

pub(super) fn probe_row(name: &str, p: &Option<Probe>) -> Vec<String> {
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

pub(super) fn render(r: &Report) -> String {
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
