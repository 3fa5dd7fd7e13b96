//! `xcc bench names`: what names held for absent owners cost a level's announcements.
//!
//! For each held count, a fresh level (in this process, no network: the cost measured is the
//! level's own) reads back a name-owner ledger holding that many names for clusters that are
//! away, with its ledger task running (appending what changes to an in-memory store), and
//! one child announces N new services; the time of those announcements is reported (median of
//! `--runs`), and its ratio to the run with no names held.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use xcc_controller::plumbing::lock;
use xcc_proto::xcc::federation::v1 as fed;
use xcc_registry::authz::{Gate, Policies};
use xcc_registry::catalog::Catalog;
use xcc_registry::federation::level::{Level, OwnerStore};
use xcc_registry::federation::queues::DownLink;

#[derive(Args, Debug)]
pub struct NamesArgs {
    /// Names held for absent owners (comma-separated); each is a fresh level.
    #[arg(long, value_delimiter = ',', default_value = "0,500000")]
    pub held: Vec<usize>,
    /// Announcements per run (new services of one child).
    #[arg(long, default_value_t = 5000)]
    pub announcements: usize,
    /// Runs per held count; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// The ledger in memory; every write is counted.
struct MemLedger {
    text: Mutex<String>,
    writes: watch::Sender<u64>,
}

impl OwnerStore for MemLedger {
    fn place(&self) -> String {
        "memory".into()
    }
    fn load(&self) -> BoxFuture<'_, anyhow::Result<Option<String>>> {
        Box::pin(async move { Ok(Some(lock(&self.text).clone())) })
    }
    fn append(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            lock(&self.text).push_str(&text);
            self.writes.send_modify(|n| *n += 1);
            Ok(())
        })
    }
    fn replace(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            *lock(&self.text) = text;
            self.writes.send_modify(|n| *n += 1);
            Ok(())
        })
    }
}

/// A ledger holding `held` names (half FQDNs, half `namespace/name`) for 100 clusters that
/// were present when it was written (a restarted parent): held from the start, and the ledger
/// task's first pass appends when.
fn ledger(held: usize) -> String {
    let mut text = String::with_capacity(held * 64 + 128);
    text.push_str(
        "# xcc name owners v2: + <name> <cluster> <namespace> <service> <held-since|-> / - <name>\n",
    );
    for i in 0..held.div_ceil(2) {
        let (c, ns) = (i % 100, i % 1000);
        text.push_str(&format!(
            "+ svc{i}.held{ns}.svc.clusterset.local gone{c} held{ns} svc{i} -\n+ held{ns}/svc{i} gone{c} held{ns} svc{i} -\n"
        ));
    }
    text
}

/// One run: the seconds `announcements` new services of child `c1` take at a level holding
/// `held` names.
async fn run_once(held: usize, announcements: usize, run: usize) -> anyhow::Result<f64> {
    let policies = Arc::new(RwLock::new(Arc::new(Policies::default_set())));
    let level = Level::new(
        "root",
        None,
        Catalog::new(),
        Gate::new("bench.test", policies),
    );
    let store = Arc::new(MemLedger {
        text: Mutex::new(ledger(held)),
        writes: watch::Sender::new(0),
    });
    let cancel = CancellationToken::new();
    let task = level.keep_owners(store.clone(), cancel.clone()).await?;
    anyhow::ensure!(
        level.held_names().names as usize == held,
        "the level holds {} names, not {held}",
        level.held_names().names
    );
    // The ledger task's first pass (it compares every name once) is over before timing.
    let mut writes = store.writes.subscribe();
    let task = tokio::spawn(task);
    if held > 0 {
        writes.wait_for(|n| *n > 0).await?;
    }
    let (link, mut rx) = DownLink::new(xcc_registry::budget::QueueLimits::FEDERATION);
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    level
        .attach_child(
            "c1",
            "bench".into(),
            &fed::SubtreeMembership {
                clusters: vec!["c1".into()],
                ..Default::default()
            },
            link,
        )
        .context("attaching c1")?;
    let announcing = level.clone();
    // Off the runtime's workers, so the ledger task keeps up alongside, as it does in service.
    let took = tokio::task::spawn_blocking(move || -> anyhow::Result<Duration> {
        let start = Instant::now();
        for i in 0..announcements {
            let ann = fed::ServiceAnnouncement {
                cluster: "c1".into(),
                namespace: format!("ns{}", i % 50),
                name: format!("r{run}-svc{i}"),
                endpoints: vec![format!("10.1.{}.{}:443", i / 250 % 250, i % 250)],
                ..Default::default()
            };
            announcing
                .child_announcement("c1", &ann)
                .map_err(|r| anyhow::anyhow!("announcement {i} refused: {}", r.reason))?;
        }
        Ok(start.elapsed())
    })
    .await??;
    cancel.cancel();
    task.await?;
    drain.abort();
    Ok(took.as_secs_f64())
}

pub async fn run(args: NamesArgs) -> anyhow::Result<()> {
    println!(
        "{:>9} {:>13} {:>10} {:>8}  runs (s)",
        "HELD", "ANNOUNCEMENTS", "MEDIAN s", "RATIO"
    );
    let mut base = None;
    for &held in &args.held {
        let mut times = Vec::new();
        for run in 0..args.runs.max(1) {
            times.push(run_once(held, args.announcements, run).await?);
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let base = *base.get_or_insert(median);
        println!(
            "{held:>9} {:>13} {median:>10.3} {:>8.2}  {}",
            args.announcements,
            median / base,
            times
                .iter()
                .map(|t| format!("{t:.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}
