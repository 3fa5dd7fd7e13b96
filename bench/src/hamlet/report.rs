//! What `xcc bench hamlet` reports: the result types, the idle-memory probe, the targets and
//! the table.

use super::*;

#[derive(Clone, Debug, Serialize)]
pub(super) struct Stats {
    pub(super) samples: usize,
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
    pub(super) max_ms: f64,
}

impl Stats {
    pub(super) fn of(v: Vec<Duration>) -> Option<Self> {
        let ns: Vec<i64> = v
            .iter()
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .collect();
        let s = Summary::of(&ns)?;
        let in_ms = |ns: i64| ns as f64 / 1e6;
        Some(Stats {
            samples: v.len(),
            p50_ms: in_ms(s.percentile(50.0)),
            p99_ms: in_ms(s.percentile(99.0)),
            max_ms: in_ms(s.max),
        })
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[derive(Clone, Debug, Serialize)]
pub(super) struct SingleSnapshot {
    pub(super) mode: Mode,
    pub(super) services: usize,
    pub(super) runs: usize,
    pub(super) median_ms: f64,
    pub(super) min_ms: f64,
    pub(super) max_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub(super) struct Cell {
    pub(super) mode: Mode,
    pub(super) services: usize,
    pub(super) consumers: usize,
    /// Wall time to open N TLS connections (CONNECT_PARALLELISM at a time).
    pub(super) connect_ms: f64,
    /// Per consumer: from the common start signal to its end-of-snapshot marker.
    pub(super) snapshot: Stats,
    /// Per consumer, for the first update, which follows the idle pause: from the change to
    /// the receipt of the UPDATE.
    pub(super) first_update: Option<Stats>,
    /// Per (consumer, update) for updates 2..=K, each started as soon as the previous one reached
    /// every consumer: from the change to the receipt of the UPDATE.
    pub(super) fanout: Option<Stats>,
    /// Server VmRSS after loading the exports, before the consumers connect (process mode).
    pub(super) rss_idle_mib: Option<f64>,
    /// Server VmRSS with the N consumers connected, synced and idle (process mode).
    pub(super) rss_consumers_mib: Option<f64>,
    /// Server VmHWM (peak RSS) at the end of the cell (process mode).
    pub(super) rss_peak_mib: Option<f64>,
    /// CPU seconds (user + system) the server used for the concurrent snapshot (process mode).
    pub(super) server_cpu_snapshot_s: Option<f64>,
    /// Server CPU per delivered snapshot response, microseconds (process mode).
    pub(super) server_cpu_us_per_response: Option<f64>,
    /// CPU seconds the server used for all the updates of the cell (process mode).
    pub(super) server_cpu_updates_s: Option<f64>,
    /// Server CPU use while the N consumers are synced and idle, % of one core (process mode).
    pub(super) server_idle_cpu_pct: Option<f64>,
    pub(super) wall_s: f64,
}

/// How this machine treats memory left untouched for a while: the time to read one byte of every
/// page of a buffer right after writing it, and again after it sat idle.
#[derive(Clone, Debug, Serialize)]
pub(super) struct IdleMemoryProbe {
    pub(super) mib: usize,
    pub(super) idle_s: f64,
    pub(super) warm_ms: f64,
    pub(super) after_idle_ms: f64,
    /// Nanoseconds a random read over the same size ([`crate::common::random_read_ns`]).
    pub(super) random_read_ns: f64,
}

/// Write every page of a `mib` MiB buffer, read it back (warm), leave it untouched for `idle`,
/// read it again. On bare metal both reads take about the same time; on a VM whose host reclaims
/// or re-maps idle guest memory the second can be many times slower, and so is the first update
/// after an idle period, which touches every consumer's connection state.
pub(super) fn idle_memory_probe(mib: usize, idle: Duration) -> IdleMemoryProbe {
    pub(super) const PAGE: usize = 4096;
    let mut buf = vec![0u8; mib << 20];
    for b in buf.iter_mut().step_by(PAGE) {
        *b = 1;
    }
    let read = |buf: &[u8]| {
        let t = Instant::now();
        let sum: u64 = buf.iter().step_by(PAGE).map(|&b| u64::from(b)).sum();
        std::hint::black_box(sum);
        ms(t.elapsed())
    };
    let warm_ms = read(std::hint::black_box(&buf));
    std::thread::sleep(idle);
    let after_idle_ms = read(std::hint::black_box(&buf));
    drop(buf);
    IdleMemoryProbe {
        mib,
        idle_s: idle.as_secs_f64(),
        warm_ms,
        after_idle_ms,
        random_read_ns: crate::common::random_read_ns(mib, 1_000_000),
    }
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) server: ServerKind,
    pub(super) updates: u32,
    /// Idle pause before the first update, seconds.
    pub(super) idle_s: f64,
    pub(super) snapshot_runs: usize,
    pub(super) single: Vec<SingleSnapshot>,
    pub(super) cells: Vec<Cell>,
    pub(super) targets: Vec<Target>,
    /// /proc/loadavg at the start and the end of the run (other load skews the numbers).
    pub(super) loadavg_start: String,
    pub(super) loadavg_end: String,
    pub(super) idle_memory: Option<IdleMemoryProbe>,
    pub(super) total_s: f64,
}

pub(super) const TARGET_SNAPSHOT_MS: f64 = 500.0;
pub(super) const TARGET_FANOUT_P99_MS: f64 = 100.0;
pub(super) const TARGET_RSS_MIB: f64 = 200.0;

pub(super) fn targets(single: &[SingleSnapshot], cells: &[Cell]) -> Vec<Target> {
    let mut out = Vec::new();
    for s in single.iter().filter(|s| s.services == 10_000) {
        out.push(Target {
            name: format!("10k-service snapshot, one consumer ({:?})", s.mode),
            limit: format!("< {TARGET_SNAPSHOT_MS} ms"),
            measured: format!("{:.1} ms (median)", s.median_ms),
            pass: s.median_ms < TARGET_SNAPSHOT_MS,
        });
    }
    for c in cells.iter().filter(|c| c.consumers == 1000) {
        if let Some(f) = &c.fanout {
            out.push(Target {
                name: format!(
                    "fan-out p99 (updates 2..K), 1000 consumers, {} services ({:?})",
                    c.services, c.mode
                ),
                limit: format!("< {TARGET_FANOUT_P99_MS} ms"),
                measured: format!("{:.1} ms", f.p99_ms),
                pass: f.p99_ms < TARGET_FANOUT_P99_MS,
            });
        }
    }
    for c in cells.iter().filter(|c| c.consumers == 1000) {
        if let Some(rss) = c.rss_consumers_mib {
            out.push(Target {
                name: format!("server RSS, 1000 idle streams, {} services", c.services),
                limit: format!("< {TARGET_RSS_MIB} MiB"),
                measured: format!("{rss:.1} MiB"),
                pass: rss < TARGET_RSS_MIB,
            });
        }
    }
    out
}

pub(super) fn opt_mib(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.1} MiB"))
}

/// Milliseconds or MiB: two decimals below 10, one above.
pub(super) fn num(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

pub(super) fn render(r: &Report) -> String {
    let mode = |m: Mode| format!("{m:?}").to_lowercase();
    let mut out = String::new();
    if r.server == ServerKind::Floor {
        let _ = writeln!(
            out,
            "== Server: the transport floor (xcc's listener, TLS, HTTP/2 settings and messages; no catalog, policy, window or per-consumer state), not xcc's registry\n"
        );
    }
    let _ = writeln!(
        out,
        "== Snapshot to a single consumer (subscription -> end-of-snapshot marker; {} runs)",
        r.snapshot_runs
    );
    let rows: Vec<Vec<String>> = r
        .single
        .iter()
        .map(|s| {
            vec![
                mode(s.mode),
                s.services.to_string(),
                num(s.median_ms),
                num(s.min_ms),
                num(s.max_ms),
            ]
        })
        .collect();
    out.push_str(&table(
        &["MODE", "SERVICES", "MEDIAN ms", "MIN ms", "MAX ms"],
        &rows,
    ));
    let _ = writeln!(
        out,
        "\n== N consumers subscribe at once (SNAP: start -> marker, per consumer); after {:.1} s idle, {} updates of one service, each as soon as the previous one reached everyone (change -> UPDATE received, per consumer; FIRST: update 1, FANOUT: updates 2..{})",
        r.idle_s, r.updates, r.updates
    );
    out.push_str(&cells_table(&r.cells));
    if let Some(t) = server_table(&r.cells) {
        let _ = writeln!(out, "\n== Server process (the child): memory and CPU");
        out.push_str(&t);
    }
    if let Some(busy) = r
        .cells
        .iter()
        .filter_map(|c| c.server_idle_cpu_pct)
        .reduce(f64::max)
        .filter(|&p| p > 10.0)
    {
        let _ = writeln!(
            out,
            "warning: the server used up to {busy:.0}% of a core while its consumers were idle; every process-mode number above shares the CPU with that work"
        );
    }
    if let Some(p) = &r.idle_memory {
        let _ = writeln!(
            out,
            "\nthis machine: reading one byte per page of {} MiB took {} ms warm and {} ms after {:.0} s untouched; FIRST pays that for every consumer's connection state; a random read over it took {:.0} ns",
            p.mib,
            num(p.warm_ms),
            num(p.after_idle_ms),
            p.idle_s,
            p.random_read_ns
        );
    }
    if !r.targets.is_empty() {
        let _ = writeln!(out, "\n== Targets");
        out.push_str(&targets_table(&r.targets));
    }
    let modes = match r.server {
        ServerKind::Xcc => {
            "process: child `xcc registry --store file`; an update renames a finished exports/hot.yaml into place (mtime set back, so it applies at once), so its fan-out includes the file watcher and the export re-read.\n\
             inprocess: Registry::start in the bench process (memory store); an update is one Catalog::upsert."
        }
        ServerKind::Floor => {
            "process: child `xcc bench hamlet-floor-serve`; an update is a line on its stdin.\n\
             inprocess: the floor server in the bench process; an update is one broadcast of the prepared response."
        }
    };
    let _ = writeln!(
        out,
        "\n{modes}\n\
         Consumers run in the bench process (own TLS connection each, every response ACKed) and share the CPU with the server.\n\
         RSS IDLE: after loading, no consumer; RSS N-IDLE: N synced idle consumers; RSS PEAK: VmHWM at the end of the cell.\n\
         CPU SNAP: server CPU during the concurrent snapshot; CPU UPDATES: during all updates; CPU IDLE: while the N consumers idle.\n\
         load average: {} at start, {} at end; total {:.1} s",
        r.loadavg_start, r.loadavg_end, r.total_s
    );
    out
}

/// The N-consumer cells: snapshot and fan-out, one row per cell.
fn cells_table(cells: &[Cell]) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), num);
    let mode = |m: Mode| format!("{m:?}").to_lowercase();
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|c| {
            vec![
                mode(c.mode),
                c.services.to_string(),
                c.consumers.to_string(),
                format!("{:.0}", c.connect_ms),
                num(c.snapshot.p50_ms),
                num(c.snapshot.p99_ms),
                num(c.snapshot.max_ms),
                f(c.first_update.as_ref().map(|x| x.p50_ms)),
                f(c.first_update.as_ref().map(|x| x.max_ms)),
                f(c.fanout.as_ref().map(|x| x.p50_ms)),
                f(c.fanout.as_ref().map(|x| x.p99_ms)),
                f(c.fanout.as_ref().map(|x| x.max_ms)),
            ]
        })
        .collect();
    table(
        &[
            "MODE",
            "SERVICES",
            "CONSUMERS",
            "CONNECT ms",
            "SNAP p50 ms",
            "SNAP p99 ms",
            "SNAP LAST ms",
            "FIRST p50 ms",
            "FIRST MAX ms",
            "FANOUT p50 ms",
            "FANOUT p99 ms",
            "FANOUT MAX ms",
        ],
        &rows,
    )
}

/// The child registry's memory and CPU, one row per process-mode cell; none without one.
fn server_table(cells: &[Cell]) -> Option<String> {
    let f = |v: Option<f64>| v.map_or("-".to_string(), num);
    let rows: Vec<Vec<String>> = cells
        .iter()
        .filter(|c| c.mode == Mode::Process)
        .map(|c| {
            vec![
                c.services.to_string(),
                c.consumers.to_string(),
                f(c.rss_idle_mib),
                f(c.rss_consumers_mib),
                f(c.rss_peak_mib),
                f(c.server_cpu_snapshot_s),
                f(c.server_cpu_us_per_response),
                f(c.server_cpu_updates_s),
                f(c.server_idle_cpu_pct),
            ]
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(table(
        &[
            "SERVICES",
            "CONSUMERS",
            "RSS IDLE MiB",
            "RSS N-IDLE MiB",
            "RSS PEAK MiB",
            "CPU SNAP s",
            "CPU us/RESP",
            "CPU UPDATES s",
            "CPU IDLE %",
        ],
        &rows,
    ))
}
