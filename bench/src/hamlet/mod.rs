//! `xcc bench hamlet`: how fast one registry serves Hamlet consumers, and what it costs.
//!
//! For every (services S, consumers N) cell of the matrix a fresh server is started with S
//! exported services and measured:
//!
//! - snapshot time: from the subscription to the end-of-snapshot marker, for one consumer alone
//!   (median of several runs) and for N consumers subscribing at once (p50/p99 over consumers and
//!   the time until the last one finishes);
//! - update fan-out: after an idle pause (`--idle-seconds`, 2 s by default) with N synced
//!   consumers, one service is changed K times (each change starts after the previous one
//!   reached every consumer); a sample is the time from the change to one consumer's receipt of
//!   that UPDATE. The first update, which wakes every connection after the pause, is reported
//!   apart from updates 2..K;
//! - server RSS (child-process mode only): idle after loading, and with N idle synced consumers.
//!
//! Two server modes. `process`: `xcc registry --store file` runs as a child process (so its RSS
//! is its own), exports are YAML files and an update is an atomic rewrite of `exports/hot.yaml`
//! (fan-out latency then includes the file watcher and the re-read of the export directory).
//! `inprocess`: `Registry::start` in this process, memory store, an update is one
//! `Catalog::upsert` (the pure server path; no RSS). Consumers always live in this process, each
//! with its own TLS connection, and ACK every response.
//!
//! `--server floor` runs the same matrix against the transport floor (module `floor`): xcc's
//! listener, TLS and HTTP/2 settings and messages with none of a registry's work, as a child
//! (`xcc bench hamlet-floor-serve`) or in this process. What it measures is what the transport
//! and these consumers cost on this machine; the difference to `--server xcc` is xcc's own.

use crate::common::{Summary, Target, loadavg, targets_table};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use futures::StreamExt as _;
use futures::channel::mpsc as fmpsc;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::crd::{Endpoint, ServiceRecord, ServiceRecordSpec};
use xcc_proto::federation::resourcediscovery::v1alpha1 as rd1;
use xcc_proto::resources;
use xcc_registry::catalog::{ServiceEntry, Source};
use xcc_registry::{Registry, RegistryConfig};

use xcc_output::{Output, table};

mod floor;
mod report;
mod server;
mod stream;

pub use floor::FloorServeArgs;
use floor::FloorServer;
pub(crate) use floor::serve as floor_serve;
use report::*;
use server::*;
use stream::*;

// What the policy-reload benchmark shares with this one.
pub(crate) use report::ms;
pub(crate) use server::{BenchPki, bulk_records, entry, hot_record};
pub(crate) use stream::{ack, connect, hot_seq, next, read_snapshot, snapshot_once, subscribe};

/// Cluster name of the measured registry (its certificate identity).
const SERVER_CLUSTER: &str = "east";
/// Cluster name every bench consumer presents.
const CONSUMER_CLUSTER: &str = "west";
const NAMESPACE: &str = "bench";
const HOT_NAME: &str = "hot";
const HOT_FQDN: &str = "hot.bench.xcc.test";
/// Endpoint addresses of the hot service encode the update sequence number: 10.250.<hi>.<lo>.
const HOT_PREFIX: &str = "10.250.";
/// TLS handshakes in flight while connecting consumers.
pub(crate) const CONNECT_PARALLELISM: usize = 64;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Child `xcc registry --store file` process; updates rewrite an export file.
    Process,
    /// `Registry::start` in this process; updates are `Catalog::upsert` calls.
    Inprocess,
}

/// Which server the consumers measure.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// xcc's registry.
    Xcc,
    /// The transport floor: the same listener and messages with none of a registry's work (no
    /// catalog, policy, window or per-consumer state); what the transport alone costs here.
    Floor,
}

#[derive(Args, Debug)]
pub struct HamletArgs {
    /// The server measured.
    #[arg(long, value_enum, default_value = "xcc")]
    pub server: ServerKind,
    /// Consumer counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    pub consumers: Vec<usize>,
    /// Exported service counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub services: Vec<usize>,
    /// Updates of the hot service per cell (each waits for full fan-out before the next).
    #[arg(long, default_value_t = 50)]
    pub updates: u32,
    /// Server modes to run (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "process,inprocess"
    )]
    pub mode: Vec<Mode>,
    /// Single-consumer snapshot runs per (mode, services); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub snapshot_runs: usize,
    /// Idle pause after the concurrent snapshot, before RSS is read and the first update is
    /// made (lets the server finish the ACK traffic and free transient buffers).
    #[arg(long, default_value_t = 2.0)]
    pub idle_seconds: f64,
    /// Upper bound for any one phase (a concurrent snapshot, one update's fan-out).
    #[arg(long, default_value_t = 300)]
    pub timeout_seconds: u64,
    /// Log filter of the child server (its log goes to a file in the temporary directory).
    #[arg(long, default_value = "warn")]
    pub server_log: String,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
}

// ---------------------------------------------------------------------------------------------
// Driver

pub(crate) async fn run(args: HamletArgs) -> anyhow::Result<()> {
    let plan = check(&args)?;
    let started = Instant::now();
    let loadavg_start = loadavg();

    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let pki = BenchPki::new(dir.path()).context("writing the bench PKI")?;
    let consumer_tls =
        ReloadingTls::load(pki.consumer.clone()).context("loading the consumer certificate")?;
    let bench = Bench {
        args: &args,
        pki: &pki,
        dir: dir.path(),
        tls: &consumer_tls,
        plan,
        started,
    };

    let mut single = Vec::new();
    let mut cells = Vec::new();
    for &mode in &args.mode {
        for &services in &args.services {
            let state_dir = dir.path().join(format!("state-{services}"));
            if mode == Mode::Process && args.server == ServerKind::Xcc {
                write_exports(&state_dir, services)
                    .with_context(|| format!("writing exports under {}", state_dir.display()))?;
            }
            for (i, &consumers) in args.consumers.iter().enumerate() {
                let at = At {
                    mode,
                    services,
                    consumers,
                };
                let (first, cell) = bench.cell(&state_dir, at, i == 0).await?;
                single.extend(first);
                cells.push(cell);
            }
        }
    }

    // The targets are xcc's: the floor is measured beside them, not against them.
    let targets = match args.server {
        ServerKind::Xcc => targets(&single, &cells),
        ServerKind::Floor => Vec::new(),
    };
    let idle = plan.idle;
    let idle_memory = tokio::task::spawn_blocking(move || idle_memory_probe(64, idle))
        .await
        .ok();
    let report = Report {
        server: args.server,
        updates: args.updates,
        idle_s: idle.as_secs_f64(),
        snapshot_runs: args.snapshot_runs,
        single,
        cells,
        targets,
        loadavg_start,
        loadavg_end: loadavg(),
        idle_memory,
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

/// The flags' bounds and an open-file limit that covers the consumers; what each cell does.
fn check(args: &HamletArgs) -> anyhow::Result<Plan> {
    if args.consumers.is_empty() || args.services.is_empty() || args.mode.is_empty() {
        bail!("--consumers, --services and --mode need at least one value each");
    }
    if args.consumers.contains(&0) || args.services.contains(&0) {
        bail!("--consumers and --services must be positive");
    }
    if args.updates > 60_000 {
        bail!("--updates is at most 60000 (the sequence is encoded in an IPv4 address)");
    }
    if args.updates == 0 {
        bail!("--updates must be at least 1");
    }
    let max_consumers = args.consumers.iter().copied().max().unwrap_or(1);
    check_fd_limit(max_consumers)?;
    let timeout = Duration::from_secs(args.timeout_seconds.max(1));
    let idle = Duration::try_from_secs_f64(args.idle_seconds)
        .ok()
        .filter(|d| *d <= Duration::from_secs(3600))
        .context("--idle-seconds must be between 0 and 3600")?;
    Ok(Plan {
        updates: args.updates,
        idle,
        timeout,
    })
}

/// One cell of the matrix.
#[derive(Clone, Copy)]
struct At {
    mode: Mode,
    services: usize,
    consumers: usize,
}

/// What every cell of a run shares.
struct Bench<'a> {
    args: &'a HamletArgs,
    pki: &'a BenchPki,
    dir: &'a Path,
    tls: &'a ReloadingTls,
    plan: Plan,
    started: Instant,
}

impl Bench<'_> {
    /// Starts a fresh server for the cell, measures it (and, for the first cell of a (mode,
    /// services) pair, the single-consumer snapshots before), stops it.
    async fn cell(
        &self,
        state_dir: &Path,
        at: At,
        single_too: bool,
    ) -> anyhow::Result<(Option<SingleSnapshot>, Cell)> {
        let At {
            mode,
            services,
            consumers,
        } = at;
        progress(format!(
            "[{:>6.1}s] {mode:?}: {services} services, {consumers} consumers",
            self.started.elapsed().as_secs_f64()
        ));
        let pki = &self.pki.server;
        let mut server = match (self.args.server, mode) {
            (ServerKind::Xcc, Mode::Process) => {
                Server::spawn_child(pki, state_dir, self.dir, services, &self.args.server_log)?
            }
            (ServerKind::Xcc, Mode::Inprocess) => Server::start_in_process(pki, services).await?,
            (ServerKind::Floor, Mode::Process) => {
                Server::spawn_floor_child(pki, self.dir, services, &self.args.server_log)?
            }
            (ServerKind::Floor, Mode::Inprocess) => {
                Server::start_floor_in_process(pki, services).await?
            }
        };
        server
            .wait_ready(self.tls, services)
            .await
            .context("waiting for the registry to serve its exports")?;
        let cell_start = Instant::now();
        let mut single = None;
        if single_too {
            let s = single_snapshots(
                self.tls,
                server.addr,
                services,
                self.args.snapshot_runs,
                self.plan.timeout,
            )
            .await
            .context("single-consumer snapshots")?;
            progress(format!(
                "          single-consumer snapshot: median {:.1} ms",
                s.median_ms
            ));
            single = Some(SingleSnapshot { mode, ..s });
        }
        let cell = run_cell(&mut server, self.tls, at, self.plan).await;
        let stopped = server.stop().await;
        let mut cell = cell.with_context(|| {
            format!("{mode:?} mode, {services} services, {consumers} consumers")
        })?;
        stopped.context("stopping the registry")?;
        cell.wall_s = cell_start.elapsed().as_secs_f64();
        progress(format!(
            "          snapshot all: p50 {:.1} ms, last {:.1} ms; fan-out p99 {}; rss {}",
            cell.snapshot.p50_ms,
            cell.snapshot.max_ms,
            cell.fanout
                .as_ref()
                .map_or("-".to_string(), |f| format!("{:.1} ms", f.p99_ms)),
            opt_mib(cell.rss_consumers_mib),
        ));
        Ok((single, cell))
    }
}

fn progress(line: String) {
    eprintln!("{line}");
}

/// The open-file limit must cover one socket per consumer (plus the runtime's own descriptors).
pub(crate) fn check_fd_limit(consumers: usize) -> anyhow::Result<()> {
    let limits = std::fs::read_to_string("/proc/self/limits");
    let Ok(limits) = limits else {
        return Ok(()); // Not Linux: let the OS say no if it must.
    };
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok());
    let needed = consumers + 256;
    match soft {
        Some(soft) if soft < needed => bail!(
            "the open-file limit is {soft}; {consumers} consumers need about {needed}: raise it first (e.g. `ulimit -n 4096`)"
        ),
        _ => Ok(()),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn single_snapshots(
    tls: &ReloadingTls,
    addr: SocketAddr,
    services: usize,
    runs: usize,
    timeout: Duration,
) -> anyhow::Result<SingleSnapshot> {
    let mut times = Vec::new();
    for _ in 0..runs.max(1) {
        let channel = connect(tls, addr).await?;
        let (elapsed, creates) = tokio::time::timeout(timeout, snapshot_once(channel))
            .await
            .context("snapshot timed out")??;
        if creates != services {
            bail!("snapshot carried {creates} services, expected {services}");
        }
        times.push(elapsed);
    }
    Ok(SingleSnapshot {
        mode: Mode::Process,
        services,
        runs: times.len(),
        median_ms: ms(median(times.clone())),
        min_ms: times.iter().min().copied().map_or(0.0, ms),
        max_ms: times.iter().max().copied().map_or(0.0, ms),
    })
}

/// What a cell does after the snapshot: idle, then `updates` updates; `timeout` bounds each phase.
#[derive(Clone, Copy)]
struct Plan {
    updates: u32,
    idle: Duration,
    timeout: Duration,
}

async fn run_cell(
    server: &mut Server,
    tls: &ReloadingTls,
    at: At,
    plan: Plan,
) -> anyhow::Result<Cell> {
    let At {
        mode,
        services,
        consumers,
    } = at;
    let Plan { idle, timeout, .. } = plan;
    let rss_idle = server.rss().map(|r| r.rss_mib);
    let cpu_before_snapshot = server.cpu_seconds();

    // Open every connection first: handshakes are not part of the snapshot time.
    let t = Instant::now();
    let addr = server.addr;
    let channels: Vec<anyhow::Result<tonic::transport::Channel>> =
        futures::stream::iter((0..consumers).map(|_| connect(tls, addr)))
            .buffer_unordered(CONNECT_PARALLELISM)
            .collect()
            .await;
    let channels = channels
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()
        .context("connecting consumers")?;
    let connect_ms = ms(t.elapsed());

    let (go_tx, go_rx) = watch::channel(None::<Instant>);
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    for (id, channel) in channels.into_iter().enumerate() {
        tasks.spawn(consumer(id, channel, go_rx.clone(), ev_tx.clone()));
    }
    drop(ev_tx);
    let result = async {
        // All subscribe at once; each measures from this common instant.
        go_tx
            .send(Some(Instant::now()))
            .map_err(|_| anyhow::anyhow!("every consumer task ended before the start"))?;
        let snapshot_times = synced(&mut ev_rx, at, timeout).await?;
        let cpu_after_snapshot = server.cpu_seconds();
        let snapshot = Stats::of(snapshot_times).context("no snapshot samples")?;

        let idle_from = (Instant::now(), server.cpu_seconds());
        tokio::time::sleep(idle).await;
        let idle_cpu = server
            .cpu_seconds()
            .zip(idle_from.1)
            .zip(Some(idle_from.0.elapsed().as_secs_f64()).filter(|&s| s >= 0.5))
            .map(|((b, a), secs)| (b - a) * 100.0 / secs);
        let rss_consumers = server.rss();
        let cpu_before_updates = server.cpu_seconds();

        let (first, fanout) = fan_out(server, &mut ev_rx, consumers, plan).await?;
        let rss_end = server.rss();
        let cpu_end = server.cpu_seconds();
        let snapshot_cpu = cpu_after_snapshot
            .zip(cpu_before_snapshot)
            .map(|(b, a)| b - a);
        Ok(Cell {
            mode,
            services,
            consumers,
            connect_ms,
            snapshot,
            first_update: first,
            fanout,
            rss_idle_mib: rss_idle,
            rss_consumers_mib: rss_consumers.map(|r| r.rss_mib),
            rss_peak_mib: rss_end.map(|r| r.hwm_mib),
            server_cpu_snapshot_s: snapshot_cpu,
            server_cpu_us_per_response: snapshot_cpu
                .map(|c| c * 1e6 / (consumers as f64 * (services as f64 + 1.0))),
            server_cpu_updates_s: cpu_end.zip(cpu_before_updates).map(|(b, a)| b - a),
            server_idle_cpu_pct: idle_cpu,
            wall_s: 0.0,
        })
    }
    .await;
    tasks.shutdown().await;
    result
}

/// Waits for every consumer's end-of-snapshot marker: the time each took.
async fn synced(
    ev_rx: &mut mpsc::UnboundedReceiver<Event>,
    at: At,
    timeout: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let At {
        services,
        consumers,
        ..
    } = at;
    let mut snapshot_times = Vec::with_capacity(consumers);
    let deadline = tokio::time::Instant::now() + timeout;
    while snapshot_times.len() < consumers {
        let ev = tokio::time::timeout_at(deadline, ev_rx.recv())
            .await
            .with_context(|| {
                format!(
                    "{} of {consumers} consumers synced within {timeout:?}",
                    snapshot_times.len()
                )
            })?
            .context("consumer tasks ended")?;
        match ev {
            Event::Synced { creates, .. } if creates != services => {
                bail!("a consumer's snapshot carried {creates} services, expected {services}")
            }
            Event::Synced { elapsed, .. } => snapshot_times.push(elapsed),
            Event::Failed { id, error } => bail!("consumer {id}: {error}"),
            Event::Update { .. } => {}
        }
    }
    Ok(snapshot_times)
}

/// Makes `plan.updates` updates, each once the previous one reached every consumer: the
/// first update's samples, and those of updates 2..=K.
async fn fan_out(
    server: &Server,
    ev_rx: &mut mpsc::UnboundedReceiver<Event>,
    consumers: usize,
    plan: Plan,
) -> anyhow::Result<(Option<Stats>, Option<Stats>)> {
    let Plan {
        updates, timeout, ..
    } = plan;
    let mut samples = Vec::with_capacity(consumers * updates as usize);
    let mut first = None;
    for seq in 1..=updates {
        let t0 = server.update(seq).await?;
        let mut got = 0;
        let deadline = tokio::time::Instant::now() + timeout;
        while got < consumers {
            let ev = tokio::time::timeout_at(deadline, ev_rx.recv())
                .await
                .with_context(|| {
                    format!("update {seq}: {got} of {consumers} consumers received it within {timeout:?}")
                })?
                .context("consumer tasks ended")?;
            match ev {
                Event::Update { seq: s, at, .. } if s == seq => {
                    samples.push(at.saturating_duration_since(t0));
                    got += 1;
                }
                Event::Update { .. } | Event::Synced { .. } => {}
                Event::Failed { id, error } => bail!("consumer {id}: {error}"),
            }
        }
        if seq == 1 {
            first = Stats::of(std::mem::take(&mut samples));
        }
    }
    Ok((first, Stats::of(samples)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_memory_probe_reports_its_parameters() {
        let p = idle_memory_probe(1, Duration::ZERO);
        assert_eq!((p.mib, p.idle_s), (1, 0.0));
        assert!(p.warm_ms.is_finite() && p.warm_ms >= 0.0);
        assert!(p.after_idle_ms.is_finite() && p.after_idle_ms >= 0.0);
        assert!(p.random_read_ns.is_finite() && p.random_read_ns > 0.0);
    }

    #[test]
    fn stats_are_in_milliseconds() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_nanos).collect();
        let s = Stats::of(v).expect("samples");
        let ms = |ns: i64| ns as f64 / 1e6;
        assert_eq!(
            (s.samples, s.p50_ms, s.p99_ms, s.max_ms),
            (100, ms(50), ms(99), ms(100))
        );
        assert!(Stats::of(vec![]).is_none());
    }

    #[test]
    fn hot_sequence_round_trips_through_the_address() {
        for seq in [0, 1, 255, 256, 60_000] {
            let fs = xcc_proto::federation::types::v1alpha1::FederatedService {
                fqdn: HOT_FQDN.into(),
                endpoints: vec![
                    xcc_proto::federation::types::v1alpha1::federated_service::Endpoint {
                        address: hot_address(seq),
                        port: 443,
                    },
                ],
                ..Default::default()
            };
            let msg = rd1::StreamResponse {
                resource: Some(xcc_proto::hamlet::pack_federated_service(&fs)),
                ..Default::default()
            };
            assert_eq!(hot_seq(&msg), Some(seq));
        }
    }

    #[test]
    fn generated_records_are_valid_exports() {
        for sr in bulk_records(600).iter().chain([&hot_record(3)]) {
            sr.validate().expect("valid record");
            entry(sr).expect("maps to a catalog entry");
        }
    }
}
