//! `xcc bench hostile-children`: how much memory children that never read can pin in their
//! parent (issue: one child pinned 349–425 MiB through its session queue).
//!
//! The parent is a real `xcc registry --store file` process (this executable), so its VmRSS is
//! the parent's alone. Each child, in this process, opens a federation session over mTLS with
//! an HTTP/2 stream window of 0 (the parent can send it nothing; its connection still answers
//! PINGs), announces one service with `--endpoints` endpoints and asks for it `--queries`
//! times, never reading its stream. The bench waits (on the parent's
//! `xcc_federation_queued_bytes` metric) until every child's queue holds what back-pressure
//! lets it hold, lets the parent settle, and reads its VmRSS; then the children leave, and it
//! waits for the queued bytes to return to 0 and for VmRSS to come back down (the parent's
//! allocator gives freed pages back to the system in the background, within seconds).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use xcc_certs::pki::{self, IssueRequest};
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::xcc::federation::v1 as fed;

use crate::common::{Target, loadavg, targets_table};

#[derive(Args, Debug)]
pub struct HostileArgs {
    /// Hostile children, measured one count after another (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,100")]
    pub children: Vec<usize>,
    /// Endpoints of the service each child announces.
    #[arg(long, default_value_t = 4000)]
    pub endpoints: usize,
    /// Times each child asks for it.
    #[arg(long, default_value_t = 2000)]
    pub queries: u64,
    /// Pause before each VmRSS reading (the parent finishes freeing what it let go).
    #[arg(long, default_value_t = 2.0)]
    pub settle_seconds: f64,
    /// Upper bound of each wait.
    #[arg(long, default_value_t = 120)]
    pub timeout_seconds: u64,
    /// How long VmRSS is followed after the children left (it must be back down within it, and
    /// still be at the end).
    #[arg(long, default_value_t = 30.0)]
    pub reclaim_seconds: f64,
}

/// What the parent may keep, in KiB, once children that made it grow by `grew` KiB have left:
/// a quarter of that growth, or 4 MiB if more (what a departed child leaves behind by design,
/// its held names and grants, plus the allocator's own caches).
fn may_keep_kib(grew: u64) -> u64 {
    (grew / 4).max(4 * 1024)
}

/// Follow the parent's VmRSS for `window`: the allocator returns freed pages on its own
/// schedule (jemalloc's background purge, as they decay) and tells no one, so this re-reads it
/// every 250 ms. When it first was at most `limit` KiB (if it was), and the last reading.
async fn follow_rss(
    pid: u32,
    limit: u64,
    window: Duration,
) -> anyhow::Result<(Option<Duration>, u64)> {
    let started = Instant::now();
    let mut below = None;
    loop {
        let rss = rss_kib(pid)?;
        if rss <= limit && below.is_none() {
            below = Some(started.elapsed());
        }
        if started.elapsed() >= window {
            return Ok((below, rss));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

fn issue(dir: &std::path::Path, ca: &pki::Ca, name: &str) -> anyhow::Result<TlsFiles> {
    let mut req = IssueRequest::cluster(name);
    req.dns = vec!["localhost".into()];
    req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
    let cert = ca.issue(&req).with_context(|| format!("issuing {name}"))?;
    Ok(pki::write_issued(&dir.join(name), ca, &cert)?)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("reading the parent's VmRSS")
}

/// `xcc_federation_queued_bytes` from the parent's metrics endpoint.
async fn queued_bytes(metrics: SocketAddr) -> anyhow::Result<i64> {
    let mut s = tokio::net::TcpStream::connect(metrics).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    body.lines()
        .find(|l| l.starts_with("xcc_federation_queued_bytes "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("no xcc_federation_queued_bytes in the parent's metrics")
}

/// Re-read the metric until `cond` holds. The parent exposes no change feed to this process,
/// so this polls every 100 ms, bounded by `timeout`.
async fn wait_queued(
    metrics: SocketAddr,
    timeout: Duration,
    what: &str,
    cond: impl Fn(i64) -> bool,
) -> anyhow::Result<i64> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(v) = queued_bytes(metrics).await
            && cond(v)
        {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A child that never reads: its session's response stream is held, never polled.
struct Hostile {
    _tx: tokio::sync::mpsc::Sender<fed::ChildMessage>,
    _rx: tonic::Streaming<fed::ParentMessage>,
}

async fn hostile(
    tls: ReloadingTls,
    name: &str,
    addr: SocketAddr,
    args: &HostileArgs,
) -> anyhow::Result<Hostile> {
    let connector = xcc_certs::client::TlsConnector::new(tls, "localhost".into(), None)?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        // Nothing may be sent to this child; its connection still answers PINGs.
        .initial_stream_window_size(0)
        .connect_with_connector(connector)
        .await
        .with_context(|| format!("{name} connecting"))?;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let msg = |p| fed::ChildMessage { payload: Some(p) };
    tx.send(msg(fed::child_message::Payload::Subtree(
        fed::SubtreeMembership {
            clusters: vec![name.into()],
            ..Default::default()
        },
    )))
    .await?;
    let stream = fed::federation_client::FederationClient::new(channel)
        .connect(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|m| (m, rx))
        }))
        .await
        .with_context(|| format!("{name} opening its session"))?
        .into_inner();
    tx.send(msg(fed::child_message::Payload::ServiceAnnouncement(
        fed::ServiceAnnouncement {
            cluster: name.into(),
            namespace: "shop".into(),
            // One name per child: the parent gives a name to one owner only.
            name: format!("big-{name}"),
            fqdn: format!("big-{name}.shop.svc.clusterset.local"),
            endpoints: (0..args.endpoints as u32)
                .map(|i| format!("10.{}.{}.{}:443", i >> 16, (i >> 8) & 255, i & 255))
                .collect(),
            ..Default::default()
        },
    )))
    .await?;
    // The parent stops reading once the child's queue is half full: the rest waits here.
    let queries = tx.clone();
    let (name, n) = (name.to_string(), args.queries);
    tokio::spawn(async move {
        for id in 1..=n {
            let q = fed::ServiceQuery {
                namespace: "shop".into(),
                name: format!("big-{name}"),
                requester_cluster: name.clone(),
                correlation_id: id,
                ..Default::default()
            };
            if queries
                .send(msg(fed::child_message::Payload::ServiceQuery(q)))
                .await
                .is_err()
            {
                break;
            }
        }
    });
    Ok(Hostile {
        _tx: tx,
        _rx: stream,
    })
}

pub async fn run(args: HostileArgs) -> anyhow::Result<()> {
    xcc_certs::install_crypto_provider();
    let timeout = Duration::from_secs(args.timeout_seconds);
    let settle = Duration::from_secs_f64(args.settle_seconds);
    let dir = tempfile::tempdir()?;
    let ca = pki::init_ca_dir("xcc.bench", &dir.path().join("ca"))?;
    let parent_tls = issue(dir.path(), &ca, "root")?;
    let (listen, admin, metrics) = (free_port()?, free_port()?, free_port()?);
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state)?;
    let exe = std::env::current_exe()?;
    let mut parent = tokio::process::Command::new(&exe)
        .args(["--log", "warn", "registry", "--store", "file"])
        .arg("--state-dir")
        .arg(&state)
        .arg("--tls-ca")
        .arg(&parent_tls.ca)
        .arg("--tls-cert")
        .arg(&parent_tls.cert)
        .arg("--tls-key")
        .arg(&parent_tls.key)
        .args(["--listen", &listen.to_string()])
        .args(["--admin-listen", &admin.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        // Children stay attached with full queues for the whole measurement (the worst case).
        .args(["--federation-queue-stall-seconds", "3600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let pid = parent.id().context("the parent has no pid")?;
    wait_queued(metrics, timeout, "the parent's metrics", |v| v == 0).await?;
    tokio::time::sleep(settle).await;
    // Every count is measured against this one reading: what an earlier count left counts too.
    let base = rss_kib(pid)?;
    println!(
        "parent VmRSS at rest: {base} KiB (load {}; {} endpoints, {} questions per child)",
        loadavg(),
        args.endpoints,
        args.queries
    );
    let mut targets = vec![];
    for &n in &args.children {
        let started = Instant::now();
        let mut kids = Vec::with_capacity(n);
        for i in 0..n {
            let name = format!("hostile-{n}-{i:03}");
            let tls = ReloadingTls::load(issue(dir.path(), &ca, &name)?)?;
            kids.push(hostile(tls, &name, listen, &args).await?);
        }
        // Each queue holds at least half the 4 MiB budget once its child is held back.
        let full = wait_queued(metrics, timeout, "every child's queue to fill", |v| {
            v >= (n as i64) * 2 * 1024 * 1024
        })
        .await?;
        tokio::time::sleep(settle).await;
        let held = rss_kib(pid)?;
        let queued = queued_bytes(metrics).await?;
        drop(kids);
        wait_queued(metrics, timeout, "the queues to empty", |v| v == 0).await?;
        let grew = held.saturating_sub(base);
        let keep = may_keep_kib(grew);
        let (below, after) = follow_rss(
            pid,
            base + keep,
            Duration::from_secs_f64(args.reclaim_seconds),
        )
        .await?;
        let kept = after.saturating_sub(base);
        let when = match below {
            Some(t) => format!(
                "down to +{:.1} MiB after {:.1}s",
                mib(keep),
                t.as_secs_f64()
            ),
            None => format!("never down to +{:.1} MiB", mib(keep)),
        };
        println!(
            "{n} children: queued {} MiB (at the first full reading {} MiB); parent VmRSS {held} KiB \
             (+{:.1} MiB) after {:.1}s; after they left: queued 0, VmRSS {when}, {after} KiB \
             (+{:.1} MiB) {}s after the queues emptied",
            queued / (1024 * 1024),
            full / (1024 * 1024),
            mib(grew),
            started.elapsed().as_secs_f64(),
            mib(kept),
            args.reclaim_seconds,
        );
        let limit_mib = if n == 1 { 64 } else { 1024 };
        targets.push(Target {
            name: format!("parent RSS growth, {n} hostile children"),
            limit: format!("< +{limit_mib} MiB"),
            measured: format!("+{:.1} MiB", mib(grew)),
            pass: grew < limit_mib * 1024,
        });
        targets.push(Target {
            name: format!("parent RSS kept after the {n} left"),
            limit: format!(
                "<= +{:.1} MiB within {}s (max(4 MiB, growth / 4))",
                mib(keep),
                args.reclaim_seconds
            ),
            measured: match below {
                Some(t) => format!(
                    "after {:.1}s; +{:.1} MiB at {}s",
                    t.as_secs_f64(),
                    mib(kept),
                    args.reclaim_seconds
                ),
                None => format!("+{:.1} MiB at {}s", mib(kept), args.reclaim_seconds),
            },
            pass: below.is_some() && kept <= keep,
        });
    }
    println!("{}", targets_table(&targets));
    parent.kill().await.ok();
    Ok(())
}
