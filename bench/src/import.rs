//! `xcc bench import`: one managed Hamlet client importing N services into a file store — how
//! long until all N are in its catalog (and on disk), and how many bytes the store wrote for it.
//!
//! Two sources:
//! - `xcc`: an in-process xcc registry exporting N services (windowed stream, end-of-snapshot
//!   marker);
//! - `go`: the Go reference server (`hamlet-go-fileserver` from vmware/hamlet: lock-step, one
//!   response per ACK, no marker), found in `--go-reference` / `XCC_HAMLET_REFERENCE` (see
//!   README; `.ci/hamlet.sh` unpacks it). Its queue holds at most 4,096 objects.
//!
//! A run starts just before the client is spawned (TLS handshake included, like the Go client's
//! own `elapsed_ms`) and ends when the client's catalog holds N imports (sampled every
//! millisecond); every batch is written to the store before it reaches the catalog, so the
//! files hold them too. The median of `--runs` runs is reported, each into a fresh state
//! directory.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_registry::catalog::{Catalog, Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::hamlet::client::{self, ClientConfig, ClientContext, RemoteSpec};
use xcc_registry::store::file::FileImportSink;
use xcc_registry::{Registry, RegistryConfig};

use crate::common::{Target, loadavg, localhost_pki, targets_table};
use xcc_output::{Output, table};

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// Service counts to import from an xcc registry (comma-separated; empty: none).
    #[arg(long, value_delimiter = ',', default_value = "1000,4000,10000,100000")]
    pub xcc: Vec<usize>,
    /// Service counts to import from the Go reference server (comma-separated; at most 4096).
    #[arg(long, value_delimiter = ',', default_value = "1000,4000")]
    pub go: Vec<usize>,
    /// Directory holding `hamlet-go-fileserver`; without it the Go rows are skipped.
    #[arg(long, env = "XCC_HAMLET_REFERENCE")]
    pub go_reference: Option<PathBuf>,
    /// Runs per row; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Upper bound for one run.
    #[arg(long, default_value_t = 300)]
    pub timeout_seconds: u64,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
}

#[derive(Clone, Debug, Serialize)]
struct Row {
    source: &'static str,
    services: usize,
    /// Median wall time from spawning the client to N imports, milliseconds.
    median_ms: f64,
    /// All runs, milliseconds.
    runs_ms: Vec<f64>,
    /// Median time per imported service, microseconds.
    us_per_service: f64,
    /// Bytes the store wrote (snapshot rewrites + journal lines), median run.
    bytes_written: u64,
    /// Size of the import files at the end (snapshot + journal), median run.
    bytes_on_disk: u64,
    /// The Go reference client's own time for the same snapshot from the same server (its
    /// `SNAPSHOT … elapsed_ms`, median of `--runs`): on `go` rows the baseline of the import
    /// target, on `xcc` rows (up to [`GO_CLIENT_MAX`] services) the xcc server as the Go client
    /// sees it, beside the Go server.
    go_client_ms: Option<f64>,
}

/// Largest `xcc` row the Go reference client is also run against (it takes its time).
const GO_CLIENT_MAX: usize = 10_000;

#[derive(Serialize)]
struct Report {
    rows: Vec<Row>,
    targets: Vec<Target>,
    loadavg_start: String,
    loadavg_end: String,
}

pub async fn run(args: ImportArgs) -> anyhow::Result<()> {
    xcc_certs::install_crypto_provider();
    let loadavg_start = loadavg();
    let tmp = tempfile::tempdir()?;
    let pki = Pki::new(tmp.path())?;
    let timeout = Duration::from_secs(args.timeout_seconds);
    let runs = args.runs.max(1);
    let mut rows = Vec::new();

    for &n in &args.xcc {
        let cancel = CancellationToken::new();
        let server = Registry::start(RegistryConfig::loopback(pki.server.clone()), cancel.clone())
            .await
            .context("starting the exporting registry")?;
        for i in 0..n {
            server.catalog.upsert(export(i));
        }
        let addr = server.hamlet_addr.to_string();
        let samples = import_runs(&pki, &addr, n, runs, timeout, &tmp.path().join("xcc")).await?;
        let mut r = row("xcc", n, samples);
        // The Go reference client against this (xcc) server too: beside the Go rows, the two
        // servers compared through one client, in the same run.
        if let Some(dir) = args.go_reference.as_deref().filter(|_| n <= GO_CLIENT_MAX) {
            r.go_client_ms = Some(go_client_median(dir, &pki, &addr, n, runs, timeout).await?);
        }
        rows.push(r);
        cancel.cancel();
        server.shutdown().await.ok();
        eprintln!("xcc {n}: done");
    }

    match &args.go_reference {
        None if !args.go.is_empty() => {
            eprintln!("SKIP go rows: no --go-reference / XCC_HAMLET_REFERENCE (see README)")
        }
        None => {}
        Some(dir) => {
            for &n in &args.go {
                if n > 4096 {
                    bail!("the Go reference server's queue holds at most 4096 objects, not {n}");
                }
                let mut server = GoServer::start(dir, &pki.server, n, tmp.path()).await?;
                let addr = format!("127.0.0.1:{}", server.port);
                let samples =
                    import_runs(&pki, &addr, n, runs, timeout, &tmp.path().join("go")).await?;
                let baseline = go_client_median(dir, &pki, &addr, n, runs, timeout).await?;
                server.child.kill().await.ok();
                let mut r = row("go", n, samples);
                r.go_client_ms = Some(baseline);
                rows.push(r);
                eprintln!("go {n}: done");
            }
        }
    }

    let targets = targets(&rows);
    let report = Report {
        rows,
        targets,
        loadavg_start,
        loadavg_end: loadavg(),
    };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        _ => print_table(&report),
    }
    Ok(())
}

/// (elapsed, bytes written, bytes on disk) of one import.
type Sample = (Duration, u64, u64);

/// `runs` imports of `n` services from `addr`, each into a fresh state directory
/// `<under>-<n>-<run>`.
async fn import_runs(
    pki: &Pki,
    addr: &str,
    n: usize,
    runs: usize,
    timeout: Duration,
    under: &Path,
) -> anyhow::Result<Vec<Sample>> {
    let mut samples = Vec::with_capacity(runs);
    for run in 0..runs {
        let state = PathBuf::from(format!("{}-{n}-{run}", under.display()));
        samples.push(import_once(pki, addr, n, timeout, &state).await?);
    }
    Ok(samples)
}

/// The Go reference client's median time over `runs` snapshots of `n` services from `addr`.
async fn go_client_median(
    dir: &Path,
    pki: &Pki,
    addr: &str,
    n: usize,
    runs: usize,
    timeout: Duration,
) -> anyhow::Result<f64> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        times.push(go_client_ms(dir, &pki.client, addr, n, timeout).await?);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

async fn import_once(
    pki: &Pki,
    addr: &str,
    n: usize,
    timeout: Duration,
    state: &Path,
) -> anyhow::Result<Sample> {
    const REMOTE: &str = "bench";
    let sink = Arc::new(FileImportSink::new(state, "ns")?);
    let catalog = Catalog::new();
    let ctx = ClientContext {
        catalog: catalog.clone(),
        peers: Default::default(),
        metrics: Default::default(),
        tls: ReloadingTls::load(pki.client.clone())?,
        sink: sink.clone(),
        config: ClientConfig::default(),
    };
    let spec = RemoteSpec {
        name: REMOTE.into(),
        address: addr.into(),
        server_name: "localhost".into(),
        roots: None,
        allowed_domains: vec![],
    };
    let cancel = CancellationToken::new();
    let start = Instant::now();
    let tasks = xcc_controller::tasks::Tasks::new(cancel.clone());
    let handle = client::spawn(ctx, spec, tasks.spawner());
    // The catalog's size is sampled every millisecond rather than awaited change by change:
    // a bench task woken by every imported record (on the other runtime's threads) took from
    // the client what the bench measures (1.13–1.17× against 0.96–1.01× the Go client's time,
    // docs/benchmarks.md); the sample costs at most 1 ms of resolution.
    let done = tokio::time::timeout(timeout, async {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while catalog.len() < n {
            tick.tick().await;
        }
        anyhow::Ok(())
    })
    .await;
    let elapsed = start.elapsed();
    handle.stop().await;
    // A background compaction may still be writing: count what it writes too.
    sink.settle(REMOTE).await?;
    let written = sink.bytes_written();
    match done {
        Ok(r) => r?,
        Err(_) => bail!("import of {n} from {addr} did not finish within {timeout:?}"),
    }
    let on_disk = [sink.path_for(REMOTE), sink.journal_path_for(REMOTE)]
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    std::fs::remove_dir_all(state).ok();
    Ok((elapsed, written, on_disk))
}

fn row(source: &'static str, services: usize, mut samples: Vec<Sample>) -> Row {
    samples.sort_by_key(|s| s.0);
    let runs_ms = samples.iter().map(|s| ms(s.0)).collect();
    let (median, written, on_disk) = samples[samples.len() / 2];
    Row {
        source,
        services,
        median_ms: ms(median),
        runs_ms,
        us_per_service: median.as_secs_f64() * 1e6 / services.max(1) as f64,
        bytes_written: written,
        bytes_on_disk: on_disk,
        go_client_ms: None,
    }
}

/// The Go reference client's time to hold `n` services from `addr` (TLS included).
async fn go_client_ms(
    dir: &Path,
    files: &TlsFiles,
    addr: &str,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<f64> {
    let program = dir.join("hamlet-go-jsonclient");
    let out = tokio::process::Command::new(&program)
        .arg("-addr")
        .arg(addr)
        .args(go_tls_args(files))
        .arg("-server-name")
        .arg("localhost")
        .arg("-count")
        .arg(n.to_string())
        .arg("-timeout")
        .arg(format!("{}s", timeout.as_secs()))
        .arg("-quiet")
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {}", program.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("SNAPSHOT ")?
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("elapsed_ms="))?
                .parse()
                .ok()
        })
        .with_context(|| format!("the Go client did not report a snapshot: {stdout}"))
}

/// The Go peers' TLS flags for `files`.
fn go_tls_args(files: &TlsFiles) -> [&std::ffi::OsStr; 6] {
    [
        "-ca".as_ref(),
        files.ca.as_os_str(),
        "-cert".as_ref(),
        files.cert.as_os_str(),
        "-key".as_ref(),
        files.key.as_os_str(),
    ]
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

fn targets(rows: &[Row]) -> Vec<Target> {
    let mut t = Vec::new();
    let find = |source: &str, n: usize| rows.iter().find(|r| r.source == source && r.services == n);
    if let Some(r) = find("go", 4000) {
        // The same server, the same 4,000 services, measured in the same run: xcc's client
        // against the Go reference client's own time to receive them.
        match r.go_client_ms {
            Some(go) => t.push(Target {
                name: "import 4,000 from the Go reference server, vs the Go client".into(),
                limit: "<= 1.0x".into(),
                measured: format!("{:.0} / {go:.0} ms = {:.2}x", r.median_ms, r.median_ms / go),
                pass: r.median_ms <= go,
            }),
            None => t.push(Target {
                name: "import 4,000 from the Go reference server".into(),
                limit: "< 1 s".into(),
                measured: format!("{:.0} ms (no Go client time)", r.median_ms),
                pass: r.median_ms < 1000.0,
            }),
        }
    }
    if let Some(r) = find("xcc", 100_000) {
        t.push(Target {
            name: "import 100,000 from an xcc registry".into(),
            limit: "< 2 s".into(),
            measured: format!("{:.0} ms", r.median_ms),
            pass: r.median_ms < 2000.0,
        });
    }
    for r in rows {
        let ratio = r.bytes_written as f64 / r.bytes_on_disk.max(1) as f64;
        let limit = if r.source == "xcc" { 2.0 } else { 3.0 };
        t.push(Target {
            name: format!("bytes written / import files, {} {}", r.source, r.services),
            limit: format!("< {limit}"),
            measured: format!("{ratio:.2}"),
            pass: ratio < limit,
        });
    }
    // Linear growth: the time per service at the largest N is within 2x of that at the
    // smallest N of at least 4,000 (below that, the fixed cost of connecting dominates).
    for source in ["xcc", "go"] {
        let mut of: Vec<&Row> = rows
            .iter()
            .filter(|r| r.source == source && r.services >= 4000)
            .collect();
        of.sort_by_key(|r| r.services);
        if let (Some(lo), Some(hi)) = (of.first(), of.last())
            && lo.services < hi.services
        {
            let ratio = hi.us_per_service / lo.us_per_service.max(f64::MIN_POSITIVE);
            t.push(Target {
                name: format!(
                    "{source}: time per service at {} vs {}",
                    hi.services, lo.services
                ),
                limit: "< 2x (linear)".into(),
                measured: format!("{ratio:.2}x"),
                pass: ratio < 2.0,
            });
        }
    }
    t
}

fn print_table(report: &Report) {
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|r| {
            vec![
                r.source.to_string(),
                r.services.to_string(),
                format!("{:.1}", r.median_ms),
                r.runs_ms
                    .iter()
                    .map(|m| format!("{m:.1}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                format!("{:.1}", r.us_per_service),
                r.bytes_written.to_string(),
                r.bytes_on_disk.to_string(),
                format!(
                    "{:.2}",
                    r.bytes_written as f64 / r.bytes_on_disk.max(1) as f64
                ),
                r.go_client_ms
                    .map(|m| format!("{m:.1}"))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "SOURCE",
                "SERVICES",
                "MEDIAN MS",
                "RUNS MS",
                "US/SERVICE",
                "BYTES WRITTEN",
                "BYTES ON DISK",
                "RATIO",
                "GO CLIENT MS"
            ],
            &rows
        )
    );
    println!("{}", targets_table(&report.targets));
    println!(
        "loadavg: {} (start), {} (end)",
        report.loadavg_start, report.loadavg_end
    );
}

fn fqdn(i: usize) -> String {
    format!("svc-{i:06}.bench.xcc.test")
}

fn address(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

fn export(i: usize) -> ServiceEntry {
    let mut labels = std::collections::BTreeMap::new();
    labels.insert(
        xcc_proto::names::SERVICE_PORT_ANNOTATION.to_string(),
        "443".to_string(),
    );
    ServiceEntry {
        key: ServiceKey::new("exporter", "ns", fqdn(i)),
        source: Source::Local,
        fqdn: fqdn(i).into(),
        endpoints: vec![Endpoint {
            address: address(i).into(),
            port: 443,
        }],
        ports: vec![],
        labels: labels.into(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    }
}

struct Pki {
    server: TlsFiles,
    client: TlsFiles,
}

impl Pki {
    fn new(dir: &Path) -> anyhow::Result<Self> {
        let [server, client] = localhost_pki(dir, ["exporter", "importer"])?;
        Ok(Self { server, client })
    }
}

/// The Go reference server serving N services.
struct GoServer {
    child: tokio::process::Child,
    port: u16,
}

impl GoServer {
    async fn start(dir: &Path, files: &TlsFiles, n: usize, tmp: &Path) -> anyhow::Result<Self> {
        let services: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                serde_json::json!({
                    "name": fqdn(i), "fqdn": fqdn(i), "id": fqdn(i), "protocols": ["https"],
                    "labels": {"connectivity.tanzu.vmware.com/service-port": "443"},
                    "endpoints": [{"address": address(i), "port": 443}],
                })
            })
            .collect();
        let file = tmp.join(format!("go-services-{n}.json"));
        std::fs::write(
            &file,
            serde_json::json!({ "services": services }).to_string(),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let program = dir.join("hamlet-go-fileserver");
        let mut child = tokio::process::Command::new(&program)
            .arg("-port")
            .arg(port.to_string())
            .args(go_tls_args(files))
            .arg("-services")
            .arg(&file)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {}", program.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await? {
                if line.starts_with("READY") {
                    return Ok(true);
                }
            }
            Ok::<_, std::io::Error>(false)
        })
        .await;
        if !matches!(ready, Ok(Ok(true))) {
            bail!("{} did not report READY", program.display());
        }
        // Keep draining its stdout (one line per snapshot served) so it never blocks on a pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self { child, port })
    }
}
