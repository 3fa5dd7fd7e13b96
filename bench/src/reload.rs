//! `xcc bench policy-reload`: many Hamlet consumers of one registry while its Cedar policy set
//! is edited.
//!
//! An in-process registry exports S services; N consumers (one cluster identity, each on its own
//! TLS connection, ACKing every response) subscribe under the default policies and receive the
//! snapshot. The set is then swapped to a neutral custom set (a `forbid` matching nothing: every
//! record now goes through Cedar, and nothing flips), and then alternately to one that forbids
//! the services `svc-001NN` (1 % of 10,000) and back. For every edit the bench reports the time
//! from the swap until each consumer has received every record whose decision changed (p50, p99,
//! max over consumers), the records the consumers received for it (counted up to a catalog change
//! made once every consumer has its records) against the decisions that flipped, and the streams
//! that ended (a reconnect), and the CPU the whole process used from the swap until every
//! consumer had the catalog change after it; the run's header states the machine's memory
//! latency then ([`random_read_ns`]). Then a new consumer's whole snapshot, beside the
//! subscribed ones, under the neutral custom set (every record decided by Cedar) and under the
//! default set.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use futures::StreamExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xcc_certs::reload::ReloadingTls;
use xcc_proto::federation::resourcediscovery::v1alpha1 as rd1;
use xcc_registry::authz::{Gate, Policies};
use xcc_registry::catalog::Source;
use xcc_registry::{Registry, RegistryConfig};

use crate::common::{loadavg, process_cpu, random_read_ns};
use crate::hamlet::{
    BenchPki, CONNECT_PARALLELISM, ack, bulk_records, check_fd_limit, connect, entry, hot_record,
    hot_seq, ms, next, read_snapshot, snapshot_once, subscribe,
};

#[derive(Args, Debug)]
pub struct ReloadArgs {
    #[arg(long, default_value_t = 1000)]
    pub consumers: usize,
    /// Exported services (at least 200: the edit forbids `svc-00100` to `svc-00199`).
    #[arg(long, default_value_t = 10_000)]
    pub services: usize,
    /// Policy edits to measure (alternately denying and allowing the 100 services again).
    #[arg(long, default_value_t = 4)]
    pub edits: u32,
    /// Upper bound for any one phase.
    #[arg(long, default_value_t = 300)]
    pub timeout_seconds: u64,
}

/// Services the edit flips: `svc-00100` to `svc-00199`.
const FLIPPED: usize = 100;

fn neutral() -> anyhow::Result<Policies> {
    Ok(Policies::from_sources(&[(
        "bench.cedar".to_string(),
        r#"@id("bench-none") forbid (principal, action == Xcc::Action::"discover", resource) when { resource.name == "no-such-service" };"#.to_string(),
    )])?)
}

fn denying() -> anyhow::Result<Policies> {
    Ok(Policies::from_sources(&[(
        "bench.cedar".to_string(),
        r#"@id("bench-001") forbid (principal, action == Xcc::Action::"discover", resource) when { resource.name like "svc-001*" };"#.to_string(),
    )])?)
}

/// What a consumer tells the measurement. Records are counted by each consumer, not sent one
/// by one: 100,000 events to one task were CPU of the bench's own beside the server's.
enum Event {
    Synced,
    /// The consumer has received as many records (CREATEs or DELETEs of bulk services) since
    /// the last hot change as the edit flips for it (the [`Expected`] count), the last at `at`.
    Done {
        at: Instant,
    },
    /// The hot service changed (`seq`); the records received since the last hot change.
    Hot {
        seq: u32,
        creates: usize,
        deletes: usize,
    },
    Ended {
        error: String,
    },
}

/// The records each consumer is to receive for the edit being measured, set before the edit.
type Expected = std::sync::Arc<std::sync::atomic::AtomicUsize>;

pub async fn run(args: ReloadArgs) -> anyhow::Result<()> {
    if args.services < 200 || args.consumers == 0 || args.edits == 0 {
        bail!("--services must be at least 200, --consumers and --edits positive");
    }
    check_fd_limit(args.consumers)?;
    let timeout = Duration::from_secs(args.timeout_seconds);
    let dir = tempfile::tempdir().context("temporary directory")?;
    let pki = BenchPki::new(dir.path())?;
    let tls = ReloadingTls::load(pki.consumer.clone()).context("consumer TLS")?;
    let cancel = CancellationToken::new();
    let registry = Registry::start(RegistryConfig::loopback(pki.server.clone()), cancel.clone())
        .await
        .context("starting the in-process registry")?;
    let result = measure(&registry, &tls, &args, timeout).await;
    cancel.cancel();
    registry.shutdown().await?;
    result
}

async fn measure(
    registry: &Registry,
    tls: &ReloadingTls,
    args: &ReloadArgs,
    timeout: Duration,
) -> anyhow::Result<()> {
    let services = args.services;
    let consumers = args.consumers;
    let mut entries = Vec::with_capacity(services);
    for sr in bulk_records(services).iter().chain([&hot_record(0)]) {
        entries.push(entry(sr)?);
    }
    registry.catalog.replace_source(&Source::Local, entries);
    let gate = registry.level.gate().clone();

    let addr = registry.hamlet_addr;
    let channels: Vec<anyhow::Result<tonic::transport::Channel>> =
        futures::stream::iter((0..consumers).map(|_| connect(tls, addr)))
            .buffer_unordered(CONNECT_PARALLELISM)
            .collect()
            .await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let expected = Expected::default();
    let mut tasks = tokio::task::JoinSet::new();
    for channel in channels {
        tasks.spawn(consumer(channel?, expected.clone(), tx.clone()));
    }
    drop(tx);
    // Ids are assigned by the consumer tasks in the order they sync.
    let mut synced = 0;
    while synced < consumers {
        match recv(&mut rx, "snapshot", timeout).await? {
            (_, Event::Synced) => synced += 1,
            (_, Event::Ended { error }) => bail!("a consumer ended during the snapshot: {error}"),
            _ => {}
        }
    }
    eprintln!("[reload] {consumers} consumers synced on {services} services");

    // Every record through Cedar from here on; nothing flips, so nothing may be sent.
    let mut sets = vec![("neutral", neutral()?)];
    for i in 0..args.edits {
        sets.push(if i % 2 == 0 {
            ("deny 1 %", denying()?)
        } else {
            ("allow 1 % again", neutral()?)
        });
    }
    let memory_ns = tokio::task::spawn_blocking(|| random_read_ns(64, 1_000_000))
        .await
        .context("the memory probe")?;
    println!(
        "policy reload: {consumers} consumers (one cluster identity) x {services} services; load {}; memory {memory_ns:.0} ns a random read (64 MiB)",
        loadavg()
    );
    println!(
        "{:<16} {:>8} {:>10} {:>10} {:>10} {:>12} {:>10} {:>7} {:>8}",
        "edit", "flipped", "p50 ms", "p99 ms", "max ms", "records", "per flip", "ended", "cpu ms"
    );
    let mut hot = 0u32;
    for (name, policies) in sets {
        let edit = Edit {
            name,
            consumers,
            timeout,
        };
        edit.apply(registry, &gate, policies, &expected, &mut rx, &mut hot)
            .await?;
    }
    snapshots(&gate, tls, addr, services, timeout).await?;
    tasks.shutdown().await;
    Ok(())
}

/// Snapshots a new consumer takes under each set: a custom one decides every record in Cedar,
/// the default one decides none.
const SNAPSHOT_RUNS: usize = 5;

/// A new consumer's whole snapshot (beside the consumers already subscribed) under the neutral
/// custom set and then under the default set: median, min and max of [`SNAPSHOT_RUNS`].
async fn snapshots(
    gate: &Gate,
    tls: &ReloadingTls,
    addr: std::net::SocketAddr,
    services: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    println!(
        "\n{:<16} {:>10} {:>10} {:>10} {:>9}",
        "new snapshot", "median ms", "min ms", "max ms", "records"
    );
    for (name, policies) in [
        ("custom set", neutral()?),
        ("default set", Policies::default_set()),
    ] {
        gate.set_policies(policies);
        let mut times = Vec::with_capacity(SNAPSHOT_RUNS);
        let mut records = 0;
        for _ in 0..SNAPSHOT_RUNS {
            let (elapsed, creates) =
                tokio::time::timeout(timeout, snapshot_once(connect(tls, addr).await?))
                    .await
                    .with_context(|| format!("{name}: no snapshot within {timeout:?}"))??;
            // Every service (the bulk ones and the hot one).
            if creates != services {
                bail!("{name}: a snapshot had {creates} records, not {services}");
            }
            records = creates;
            times.push(elapsed);
        }
        times.sort();
        println!(
            "{:<16} {:>10.1} {:>10.1} {:>10.1} {:>9}",
            name,
            ms(times[SNAPSHOT_RUNS / 2]),
            ms(times[0]),
            ms(times[SNAPSHOT_RUNS - 1]),
            records
        );
    }
    Ok(())
}

/// The next event of any consumer, within `timeout`.
async fn recv(
    rx: &mut mpsc::UnboundedReceiver<(usize, Event)>,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<(usize, Event)> {
    tokio::time::timeout(timeout, rx.recv())
        .await
        .with_context(|| format!("{what}: nothing within {timeout:?}"))?
        .context("every consumer ended")
}

/// One policy edit, measured and printed as a row.
struct Edit {
    name: &'static str,
    consumers: usize,
    timeout: Duration,
}

impl Edit {
    /// Sets `policies`, waits until every consumer has the records whose decision flipped and
    /// then the hot change made after them (one more update of the hot service, `hot`).
    async fn apply(
        &self,
        registry: &Registry,
        gate: &Gate,
        policies: Policies,
        expected: &Expected,
        rx: &mut mpsc::UnboundedReceiver<(usize, Event)>,
        hot: &mut u32,
    ) -> anyhow::Result<()> {
        let Edit {
            name,
            consumers,
            timeout,
        } = *self;
        let expected_each = if name == "neutral" { 0 } else { FLIPPED };
        expected.store(expected_each, std::sync::atomic::Ordering::Relaxed);
        let (t0, cpu0) = (Instant::now(), process_cpu());
        gate.set_policies(policies);
        let mut done_at: Vec<Duration> = Vec::with_capacity(consumers);
        let mut records = 0usize;
        let mut ended = 0usize;
        let mut wrong_op = 0usize;
        let want_delete = name.starts_with("deny");
        // Until each consumer has its records, then until each has seen the hot change made
        // after that (everything the reload sent arrived before it).
        if expected_each > 0 {
            while done_at.len() < consumers {
                match recv(rx, name, timeout).await? {
                    (_, Event::Done { at }) => done_at.push(at.saturating_duration_since(t0)),
                    (_, Event::Ended { .. }) => ended += 1,
                    _ => {}
                }
                if ended > 0 {
                    bail!("{ended} streams ended during the reload");
                }
            }
        }
        *hot += 1;
        registry
            .catalog
            .upsert(entry(&hot_record(*hot))?)
            .context("the hot change changed nothing")?;
        let mut seen_hot = 0;
        while seen_hot < consumers {
            match recv(rx, "hot change", timeout).await? {
                (
                    _,
                    Event::Hot {
                        seq,
                        creates,
                        deletes,
                    },
                ) => {
                    records += creates + deletes;
                    wrong_op += if want_delete { creates } else { deletes };
                    seen_hot += usize::from(seq == *hot);
                }
                (_, Event::Ended { .. }) => ended += 1,
                _ => {}
            }
            if ended > 0 {
                bail!("{ended} streams ended during the reload");
            }
        }
        // The whole process (server, bench consumers and all): from the swap until every
        // consumer had the hot change after the edit's records.
        let cpu = process_cpu().saturating_sub(cpu0);
        let flipped = expected_each * consumers;
        done_at.sort();
        let pct = |p: f64| {
            done_at
                .get(((done_at.len() as f64 * p).ceil() as usize).saturating_sub(1))
                .map_or(0.0, |d| ms(*d))
        };
        println!(
            "{:<16} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>12} {:>10.2} {:>7} {:>8.0}",
            name,
            flipped,
            pct(0.50),
            pct(0.99),
            pct(1.0),
            records,
            if flipped == 0 {
                records as f64
            } else {
                records as f64 / flipped as f64
            },
            ended,
            ms(cpu)
        );
        if wrong_op > 0 {
            bail!("{wrong_op} records had the wrong operation for {name}");
        }
        Ok(())
    }
}

async fn consumer(
    channel: tonic::transport::Channel,
    expected: Expected,
    events: mpsc::UnboundedSender<(usize, Event)>,
) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let mut id = usize::MAX;
    let result: anyhow::Result<()> = async {
        let (acks, mut stream) = subscribe(channel).await?;
        read_snapshot(&acks, &mut stream).await?;
        id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = events.send((id, Event::Synced));
        // Records since the last hot change.
        let (mut creates, mut deletes) = (0, 0);
        loop {
            let msg = next(&mut stream).await?;
            let at = Instant::now();
            ack(&acks, &msg.nonce)?;
            let op = msg.operation;
            // Only the hot service's UPDATE carries a sequence number: the reload's CREATEs and
            // DELETEs are not decoded (100,000 decodes were client CPU beside the server's).
            let hot = (op == rd1::stream_response::Operation::Update as i32)
                .then(|| hot_seq(&msg))
                .flatten();
            if let Some(seq) = hot {
                let ev = Event::Hot {
                    seq,
                    creates,
                    deletes,
                };
                (creates, deletes) = (0, 0);
                let _ = events.send((id, ev));
                continue;
            } else if op == rd1::stream_response::Operation::Delete as i32 {
                deletes += 1;
            } else if op == rd1::stream_response::Operation::Create as i32 {
                creates += 1;
            } else {
                continue;
            }
            if creates + deletes == expected.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = events.send((id, Event::Done { at }));
            }
        }
    }
    .await;
    if let Err(e) = result {
        let _ = events.send((
            id,
            Event::Ended {
                error: format!("{e:#}"),
            },
        ));
    }
}
