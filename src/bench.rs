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

use crate::bench_common::{Summary, Target, loadavg, targets_table};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand, ValueEnum};
use futures::StreamExt as _;
use futures::channel::mpsc as fmpsc;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use xcc_certs::pki::{self, IssueRequest};
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::crd::{Endpoint, ServiceRecord, ServiceRecordSpec};
use xcc_proto::federation::resourcediscovery::v1alpha1 as rd1;
use xcc_proto::resources;
use xcc_registry::catalog::{ServiceEntry, Source};
use xcc_registry::{Registry, RegistryConfig};

use crate::args::{Output, table};

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

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// One registry, many Hamlet consumers: snapshot time, update fan-out latency, server RSS.
    Hamlet(HamletArgs),
    /// A 3-level tree of registries: propagation, cold and cached lookups, routes, root memory.
    Hierarchy(crate::bench_hierarchy::HierarchyArgs),
    /// A first hierarchy grant for a question asked before the service existed: time from the
    /// owner's announcement reaching the root to the caller's import.
    FirstGrant(crate::bench_first_grant::FirstGrantArgs),
    /// One managed Hamlet client importing N services (from xcc and the Go reference server):
    /// time and bytes written.
    Import(crate::bench_import::ImportArgs),
    /// Children that never read (HTTP/2 window 0) asking for a large service again and again:
    /// the parent registry's RSS growth, and after they leave.
    HostileChildren(crate::bench_hostile::HostileArgs),
    /// Many Hamlet consumers while the policy set is edited: time until each has the records
    /// whose decision changed, records sent, streams ended.
    PolicyReload(crate::bench_reload::ReloadArgs),
    /// One level holding N names for absent owners: the time of M new announcements, against
    /// a level holding none.
    Names(crate::bench_names::NamesArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Child `xcc registry --store file` process; updates rewrite an export file.
    Process,
    /// `Registry::start` in this process; updates are `Catalog::upsert` calls.
    Inprocess,
}

#[derive(Args, Debug)]
pub struct HamletArgs {
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
    /// Log filter of the child registry (its log goes to a file in the temporary directory).
    #[arg(long, default_value = "warn")]
    pub server_log: String,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Hamlet(args) => hamlet(args).await,
        BenchCommand::Hierarchy(args) => crate::bench_hierarchy::run(args).await,
        BenchCommand::Import(args) => crate::bench_import::run(args).await,
        BenchCommand::HostileChildren(args) => crate::bench_hostile::run(args).await,
        BenchCommand::PolicyReload(args) => crate::bench_reload::run(args).await,
        BenchCommand::FirstGrant(args) => crate::bench_first_grant::run(args).await,
        BenchCommand::Names(args) => crate::bench_names::run(args).await,
    }
}

// ---------------------------------------------------------------------------------------------
// Results

#[derive(Clone, Debug, Serialize)]
struct Stats {
    samples: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Stats {
    fn of(v: Vec<Duration>) -> Option<Self> {
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
struct SingleSnapshot {
    mode: Mode,
    services: usize,
    runs: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
struct Cell {
    mode: Mode,
    services: usize,
    consumers: usize,
    /// Wall time to open N TLS connections (CONNECT_PARALLELISM at a time).
    connect_ms: f64,
    /// Per consumer: from the common start signal to its end-of-snapshot marker.
    snapshot: Stats,
    /// Per consumer, for the first update, which follows the idle pause: from the change to
    /// the receipt of the UPDATE.
    first_update: Option<Stats>,
    /// Per (consumer, update) for updates 2..=K, each started as soon as the previous one reached
    /// every consumer: from the change to the receipt of the UPDATE.
    fanout: Option<Stats>,
    /// Server VmRSS after loading the exports, before the consumers connect (process mode).
    rss_idle_mib: Option<f64>,
    /// Server VmRSS with the N consumers connected, synced and idle (process mode).
    rss_consumers_mib: Option<f64>,
    /// Server VmHWM (peak RSS) at the end of the cell (process mode).
    rss_peak_mib: Option<f64>,
    /// CPU seconds (user + system) the server used for the concurrent snapshot (process mode).
    server_cpu_snapshot_s: Option<f64>,
    /// Server CPU per delivered snapshot response, microseconds (process mode).
    server_cpu_us_per_response: Option<f64>,
    /// CPU seconds the server used for all the updates of the cell (process mode).
    server_cpu_updates_s: Option<f64>,
    /// Server CPU use while the N consumers are synced and idle, % of one core (process mode).
    server_idle_cpu_pct: Option<f64>,
    wall_s: f64,
}

/// How this machine treats memory left untouched for a while: the time to read one byte of every
/// page of a buffer right after writing it, and again after it sat idle.
#[derive(Clone, Debug, Serialize)]
struct IdleMemoryProbe {
    mib: usize,
    idle_s: f64,
    warm_ms: f64,
    after_idle_ms: f64,
}

/// Write every page of a `mib` MiB buffer, read it back (warm), leave it untouched for `idle`,
/// read it again. On bare metal both reads take about the same time; on a VM whose host reclaims
/// or re-maps idle guest memory the second can be many times slower, and so is the first update
/// after an idle period, which touches every consumer's connection state.
fn idle_memory_probe(mib: usize, idle: Duration) -> IdleMemoryProbe {
    const PAGE: usize = 4096;
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
    IdleMemoryProbe {
        mib,
        idle_s: idle.as_secs_f64(),
        warm_ms,
        after_idle_ms,
    }
}

#[derive(Debug, Serialize)]
struct Report {
    updates: u32,
    /// Idle pause before the first update, seconds.
    idle_s: f64,
    snapshot_runs: usize,
    single: Vec<SingleSnapshot>,
    cells: Vec<Cell>,
    targets: Vec<Target>,
    /// /proc/loadavg at the start and the end of the run (other load skews the numbers).
    loadavg_start: String,
    loadavg_end: String,
    idle_memory: Option<IdleMemoryProbe>,
    total_s: f64,
}

// ---------------------------------------------------------------------------------------------
// Driver

async fn hamlet(args: HamletArgs) -> anyhow::Result<()> {
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
    let started = Instant::now();
    let loadavg_start = loadavg();

    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let pki = BenchPki::new(dir.path()).context("writing the bench PKI")?;
    let consumer_tls =
        ReloadingTls::load(pki.consumer.clone()).context("loading the consumer certificate")?;

    let mut single = Vec::new();
    let mut cells = Vec::new();
    for &mode in &args.mode {
        for &services in &args.services {
            let state_dir = dir.path().join(format!("state-{services}"));
            if mode == Mode::Process {
                write_exports(&state_dir, services)
                    .with_context(|| format!("writing exports under {}", state_dir.display()))?;
            }
            for (i, &consumers) in args.consumers.iter().enumerate() {
                progress(format!(
                    "[{:>6.1}s] {mode:?}: {services} services, {consumers} consumers",
                    started.elapsed().as_secs_f64()
                ));
                let mut server = match mode {
                    Mode::Process => Server::spawn_child(
                        &pki.server,
                        &state_dir,
                        dir.path(),
                        services,
                        &args.server_log,
                    )?,
                    Mode::Inprocess => Server::start_in_process(&pki.server, services).await?,
                };
                server
                    .wait_ready(&consumer_tls, services)
                    .await
                    .context("waiting for the registry to serve its exports")?;
                let cell_start = Instant::now();
                if i == 0 {
                    let s = single_snapshots(
                        &consumer_tls,
                        server.addr,
                        services,
                        args.snapshot_runs,
                        timeout,
                    )
                    .await
                    .context("single-consumer snapshots")?;
                    progress(format!(
                        "          single-consumer snapshot: median {:.1} ms",
                        s.median_ms
                    ));
                    single.push(SingleSnapshot { mode, ..s });
                }
                let cell = run_cell(
                    &mut server,
                    &consumer_tls,
                    mode,
                    services,
                    consumers,
                    Plan {
                        updates: args.updates,
                        idle,
                        timeout,
                    },
                )
                .await;
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
                cells.push(cell);
            }
        }
    }

    let targets = targets(&single, &cells);
    let idle_memory = tokio::task::spawn_blocking(move || idle_memory_probe(64, idle))
        .await
        .ok();
    let report = Report {
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
    mode: Mode,
    services: usize,
    consumers: usize,
    plan: Plan,
) -> anyhow::Result<Cell> {
    let Plan {
        updates,
        idle,
        timeout,
    } = plan;
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
            fanout: Stats::of(samples),
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

// ---------------------------------------------------------------------------------------------
// Consumers

enum Event {
    Synced { elapsed: Duration, creates: usize },
    Update { seq: u32, at: Instant },
    Failed { id: usize, error: String },
}

pub(crate) async fn connect(
    tls: &ReloadingTls,
    addr: SocketAddr,
) -> anyhow::Result<tonic::transport::Channel> {
    let connector = xcc_certs::client::TlsConnector::new(tls.clone(), "localhost".into(), None)
        .context("building the TLS connector")?;
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .context("endpoint URI")?
        .connect_with_connector(connector)
        .await
        .with_context(|| format!("connecting to {addr}"))
}

pub(crate) type Acks = fmpsc::UnboundedSender<rd1::StreamRequest>;

/// Open the Hamlet stream with the end-of-snapshot marker requested.
pub(crate) async fn subscribe(
    channel: tonic::transport::Channel,
) -> anyhow::Result<(Acks, tonic::Streaming<rd1::StreamResponse>)> {
    let (tx, rx) = fmpsc::unbounded();
    tx.unbounded_send(rd1::StreamRequest {
        resource_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        response_nonce: String::new(),
        status: None,
    })
    .context("queueing the subscription")?;
    let mut req = tonic::Request::new(rx);
    req.metadata_mut().insert(
        xcc_proto::SNAPSHOT_MARKER_METADATA,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let mut client = rd1::discovery_service_client::DiscoveryServiceClient::new(channel);
    let resp = client
        .establish_stream(req)
        .await
        .context("EstablishStream")?;
    if resp
        .metadata()
        .get(xcc_proto::SNAPSHOT_MARKER_METADATA)
        .is_none()
    {
        bail!("the server did not agree to send the end-of-snapshot marker");
    }
    Ok((tx, resp.into_inner()))
}

pub(crate) fn ack(acks: &Acks, nonce: &str) -> anyhow::Result<()> {
    acks.unbounded_send(rd1::StreamRequest {
        resource_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        response_nonce: nonce.to_string(),
        status: Some(Default::default()),
    })
    .context("sending an ACK: request stream closed")
}

pub(crate) async fn next(
    stream: &mut tonic::Streaming<rd1::StreamResponse>,
) -> anyhow::Result<rd1::StreamResponse> {
    stream
        .message()
        .await
        .context("receiving")?
        .context("the server closed the stream")
}

fn is_marker(msg: &rd1::StreamResponse) -> bool {
    msg.operation == rd1::stream_response::Operation::Unknown as i32
        && msg
            .resource
            .as_ref()
            .is_some_and(|r| r.type_url == xcc_proto::SNAPSHOT_COMPLETE_URL)
}

/// Receive (and ACK) the snapshot up to the marker. Returns the number of CREATEs before it.
pub(crate) async fn read_snapshot(
    acks: &Acks,
    stream: &mut tonic::Streaming<rd1::StreamResponse>,
) -> anyhow::Result<usize> {
    let mut creates = 0;
    loop {
        let msg = next(stream).await?;
        ack(acks, &msg.nonce)?;
        if is_marker(&msg) {
            return Ok(creates);
        }
        if msg.operation == rd1::stream_response::Operation::Create as i32 {
            creates += 1;
        }
    }
}

/// One subscription on an open channel: time to the marker and services received.
async fn snapshot_once(channel: tonic::transport::Channel) -> anyhow::Result<(Duration, usize)> {
    let t0 = Instant::now();
    let (acks, mut stream) = subscribe(channel).await?;
    let creates = read_snapshot(&acks, &mut stream).await?;
    Ok((t0.elapsed(), creates))
}

async fn consumer(
    id: usize,
    channel: tonic::transport::Channel,
    go: watch::Receiver<Option<Instant>>,
    events: mpsc::UnboundedSender<Event>,
) {
    if let Err(e) = consumer_inner(channel, go, &events).await {
        let _ = events.send(Event::Failed {
            id,
            error: format!("{e:#}"),
        });
    }
}

async fn consumer_inner(
    channel: tonic::transport::Channel,
    mut go: watch::Receiver<Option<Instant>>,
    events: &mpsc::UnboundedSender<Event>,
) -> anyhow::Result<()> {
    let start = go
        .wait_for(Option::is_some)
        .await
        .context("start signal dropped")?
        .unwrap_or_else(Instant::now);
    let (acks, mut stream) = subscribe(channel).await?;
    let creates = read_snapshot(&acks, &mut stream).await?;
    let _ = events.send(Event::Synced {
        elapsed: start.elapsed(),
        creates,
    });
    loop {
        let msg = next(&mut stream).await?;
        let at = Instant::now();
        ack(&acks, &msg.nonce)?;
        if msg.operation == rd1::stream_response::Operation::Update as i32
            && let Some(seq) = hot_seq(&msg)
        {
            let _ = events.send(Event::Update { seq, at });
        }
    }
}

/// The update sequence number carried by an UPDATE of the hot service.
pub(crate) fn hot_seq(msg: &rd1::StreamResponse) -> Option<u32> {
    let fs = xcc_proto::hamlet::unpack_federated_service(msg.resource.as_ref()?).ok()?;
    if fs.fqdn != HOT_FQDN {
        return None;
    }
    let rest = fs.endpoints.first()?.address.strip_prefix(HOT_PREFIX)?;
    let (hi, lo) = rest.split_once('.')?;
    Some(hi.parse::<u32>().ok()? * 256 + lo.parse::<u32>().ok()?)
}

fn hot_address(seq: u32) -> String {
    format!("{HOT_PREFIX}{}.{}", seq / 256, seq % 256)
}

// ---------------------------------------------------------------------------------------------
// Servers

pub(crate) struct BenchPki {
    pub(crate) server: TlsFiles,
    pub(crate) consumer: TlsFiles,
}

impl BenchPki {
    pub(crate) fn new(dir: &Path) -> anyhow::Result<Self> {
        xcc_certs::install_crypto_provider();
        let ca = pki::init_ca_dir("xcc.bench", &dir.join("ca"))?;
        let issue = |name: &str| -> anyhow::Result<TlsFiles> {
            let mut req = IssueRequest::cluster(name);
            req.dns = vec!["localhost".into()];
            req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
            let cert = ca.issue(&req)?;
            Ok(pki::write_issued(&dir.join(name), &ca, &cert)?)
        };
        Ok(Self {
            server: issue(SERVER_CLUSTER)?,
            consumer: issue(CONSUMER_CLUSTER)?,
        })
    }
}

fn record(name: &str, fqdn: &str, addresses: &[String]) -> ServiceRecord {
    let mut annotations = BTreeMap::new();
    annotations.insert(
        xcc_proto::names::SERVICE_PORT_ANNOTATION.to_string(),
        "443".to_string(),
    );
    ServiceRecord {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: ServiceRecordSpec {
            fqdn: fqdn.into(),
            endpoints: addresses
                .iter()
                .map(|a| Endpoint {
                    address: a.clone(),
                    port: 443,
                })
                .collect(),
            ..Default::default()
        },
        status: None,
    }
}

/// `services - 1` ordinary services (two endpoints each), in one file's worth of records.
pub(crate) fn bulk_records(services: usize) -> Vec<ServiceRecord> {
    (1..services)
        .map(|i| {
            let name = format!("svc-{i:05}");
            let (hi, lo) = (i / 250, i % 250 + 1);
            // 250 per /24, 256 /24s per pair of /16s (10.1 and 10.2, then 10.3 and 10.4, ...):
            // valid addresses past 64,000 services.
            let (a, b) = (1 + 2 * (hi / 256), hi % 256);
            record(
                &name,
                &format!("{name}.{NAMESPACE}.xcc.test"),
                &[format!("10.{a}.{b}.{lo}"), format!("10.{}.{b}.{lo}", a + 1)],
            )
        })
        .collect()
}

pub(crate) fn hot_record(seq: u32) -> ServiceRecord {
    record(HOT_NAME, HOT_FQDN, &[hot_address(seq)])
}

fn write_exports(state_dir: &Path, services: usize) -> anyhow::Result<()> {
    let exports = state_dir.join("exports");
    std::fs::create_dir_all(&exports).with_context(|| format!("creating {}", exports.display()))?;
    std::fs::create_dir_all(state_dir.join("tmp")).context("creating tmp/")?;
    let bulk = resources::to_yaml_documents(&bulk_records(services))?;
    let path = exports.join("bulk.yaml");
    std::fs::write(&path, bulk).with_context(|| format!("writing {}", path.display()))?;
    write_hot(state_dir, 0)?;
    Ok(())
}

/// Atomically replace `exports/hot.yaml` (temporary file outside the watched directory, its
/// mtime set a second back as `tar` or `cp -p` would, then rename): the registry sees a file
/// renamed into place after it was finished and applies the change at once, without the file
/// store's settle time. Returns the instant just before the rename.
fn write_hot(state_dir: &Path, seq: u32) -> anyhow::Result<Instant> {
    let text = resources::to_yaml_documents(&[hot_record(seq)])?;
    let tmp = state_dir.join("tmp").join("hot.yaml");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .and_then(|f| f.set_modified(std::time::SystemTime::now() - Duration::from_secs(1)))
        .with_context(|| format!("setting the mtime of {}", tmp.display()))?;
    let dest = state_dir.join("exports").join("hot.yaml");
    let t0 = Instant::now();
    std::fs::rename(&tmp, &dest).with_context(|| format!("renaming onto {}", dest.display()))?;
    Ok(t0)
}

/// Kills the child registry when dropped (also on error paths).
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

enum Backend {
    Child {
        child: ChildGuard,
        state_dir: PathBuf,
        log: PathBuf,
    },
    InProcess {
        registry: Box<Registry>,
        cancel: CancellationToken,
    },
}

struct Server {
    addr: SocketAddr,
    backend: Backend,
}

struct Rss {
    rss_mib: f64,
    hwm_mib: f64,
}

impl Server {
    fn spawn_child(
        tls: &TlsFiles,
        state_dir: &Path,
        work_dir: &Path,
        services: usize,
        log_filter: &str,
    ) -> anyhow::Result<Self> {
        write_hot(state_dir, 0)?;
        // A free port: bind, read, release. The child binds it a moment later.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port")?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let tls_dir = tls
            .cert
            .parent()
            .context("the server certificate has no directory")?;
        let log = work_dir.join(format!("registry-{services}-{port}.log"));
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let exe = std::env::current_exe().context("locating the xcc executable")?;
        let child = Command::new(&exe)
            .arg("--log")
            .arg(log_filter)
            .arg("registry")
            .arg("--store")
            .arg("file")
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--tls-dir")
            .arg(tls_dir)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--admin-listen")
            .arg("127.0.0.1:0")
            .arg("--metrics-listen")
            .arg("")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .spawn()
            .with_context(|| format!("starting {} registry", exe.display()))?;
        Ok(Self {
            addr,
            backend: Backend::Child {
                child: ChildGuard(child),
                state_dir: state_dir.to_path_buf(),
                log,
            },
        })
    }

    async fn start_in_process(tls: &TlsFiles, services: usize) -> anyhow::Result<Self> {
        let cancel = CancellationToken::new();
        let registry = Registry::start(RegistryConfig::loopback(tls.clone()), cancel.clone())
            .await
            .context("starting the in-process registry")?;
        let mut entries = Vec::with_capacity(services);
        for sr in bulk_records(services).iter().chain([&hot_record(0)]) {
            entries.push(entry(sr)?);
        }
        registry.catalog.replace_source(&Source::Local, entries);
        Ok(Self {
            addr: registry.hamlet_addr,
            backend: Backend::InProcess {
                registry: Box::new(registry),
                cancel,
            },
        })
    }

    /// Connect a probe consumer until it receives the full snapshot (bounded attempts).
    async fn wait_ready(&mut self, tls: &ReloadingTls, services: usize) -> anyhow::Result<()> {
        const ATTEMPTS: usize = 150;
        let mut last = String::from("no attempt made");
        for _ in 0..ATTEMPTS {
            if let Backend::Child { child, log, .. } = &mut self.backend
                && let Some(status) = child.0.try_wait().context("checking the child")?
            {
                bail!(
                    "the registry exited ({status}); its log:\n{}",
                    tail(log, 20)
                );
            }
            let attempt = async {
                let channel = connect(tls, self.addr).await?;
                tokio::time::timeout(Duration::from_secs(60), snapshot_once(channel))
                    .await
                    .context("probe snapshot timed out")?
            };
            match attempt.await {
                Ok((_, n)) if n == services => return Ok(()),
                Ok((_, n)) => last = format!("probe snapshot had {n} of {services} services"),
                Err(e) => last = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("not ready after {ATTEMPTS} attempts: {last}")
    }

    /// Change the hot service to carry `seq`; returns when the change started.
    async fn update(&self, seq: u32) -> anyhow::Result<Instant> {
        match &self.backend {
            Backend::Child { state_dir, .. } => write_hot(state_dir, seq),
            Backend::InProcess { registry, .. } => {
                let e = entry(&hot_record(seq))?;
                let t0 = Instant::now();
                registry
                    .catalog
                    .upsert(e)
                    .context("the upsert changed nothing")?;
                Ok(t0)
            }
        }
    }

    fn rss(&self) -> Option<Rss> {
        let Backend::Child { child, .. } = &self.backend else {
            return None;
        };
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).ok()?;
        let field = |name: &str| -> Option<f64> {
            let kb: f64 = status
                .lines()
                .find(|l| l.starts_with(name))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(kb / 1024.0)
        };
        Some(Rss {
            rss_mib: field("VmRSS:")?,
            hwm_mib: field("VmHWM:")?,
        })
    }

    /// User + system CPU seconds of the child so far, from /proc/<pid>/stat (USER_HZ = 100, as on
    /// every Linux architecture xcc targets).
    fn cpu_seconds(&self) -> Option<f64> {
        let Backend::Child { child, .. } = &self.backend else {
            return None;
        };
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.0.id())).ok()?;
        // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let mut fields = rest.split_whitespace().skip(11);
        let utime: f64 = fields.next()?.parse().ok()?;
        let stime: f64 = fields.next()?.parse().ok()?;
        Some((utime + stime) / 100.0)
    }

    async fn stop(self) -> anyhow::Result<()> {
        match self.backend {
            Backend::Child { child, .. } => {
                drop(child);
                Ok(())
            }
            Backend::InProcess { registry, cancel } => {
                cancel.cancel();
                registry.shutdown().await
            }
        }
    }
}

pub(crate) fn entry(sr: &ServiceRecord) -> anyhow::Result<ServiceEntry> {
    xcc_registry::store::model::export_entry(SERVER_CLUSTER, sr)
        .map_err(|e| anyhow::anyhow!("{}: {e}", sr.metadata.name.as_deref().unwrap_or_default()))
}

fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

// ---------------------------------------------------------------------------------------------
// Report

const TARGET_SNAPSHOT_MS: f64 = 500.0;
const TARGET_FANOUT_P99_MS: f64 = 100.0;
const TARGET_RSS_MIB: f64 = 200.0;

fn targets(single: &[SingleSnapshot], cells: &[Cell]) -> Vec<Target> {
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

fn opt_mib(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.1} MiB"))
}

/// Milliseconds or MiB: two decimals below 10, one above.
fn num(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

fn render(r: &Report) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), num);
    let mode = |m: Mode| format!("{m:?}").to_lowercase();
    let mut out = String::new();
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
    let rows: Vec<Vec<String>> = r
        .cells
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
    out.push_str(&table(
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
    ));
    let rows: Vec<Vec<String>> = r
        .cells
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
    if !rows.is_empty() {
        let _ = writeln!(out, "\n== Server process (child registry): memory and CPU");
        out.push_str(&table(
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
        ));
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
            "\nthis machine: reading one byte per page of {} MiB took {} ms warm and {} ms after {:.0} s untouched; FIRST pays that for every consumer's connection state",
            p.mib,
            num(p.warm_ms),
            num(p.after_idle_ms),
            p.idle_s
        );
    }
    let _ = writeln!(out, "\n== Targets");
    out.push_str(&targets_table(&r.targets));
    let _ = writeln!(
        out,
        "\nprocess: child `xcc registry --store file`; an update renames a finished exports/hot.yaml into place (mtime set back, so it applies at once), so its fan-out includes the file watcher and the export re-read.\n\
         inprocess: Registry::start in the bench process (memory store); an update is one Catalog::upsert.\n\
         Consumers run in the bench process (own TLS connection each, every response ACKed) and share the CPU with the server.\n\
         RSS IDLE: after loading, no consumer; RSS N-IDLE: N synced idle consumers; RSS PEAK: VmHWM at the end of the cell.\n\
         CPU SNAP: server CPU during the concurrent snapshot; CPU UPDATES: during all updates; CPU IDLE: while the N consumers idle.\n\
         load average: {} at start, {} at end; total {:.1} s",
        r.loadavg_start, r.loadavg_end, r.total_s
    );
    out
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
