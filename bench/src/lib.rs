//! `xcc bench ...`: the load benchmarks of docs/benchmarks.md. The `xcc` binary carries them
//! only when built with its `bench` feature (`cargo build --release --features bench`), which
//! makes this crate a dependency; the production binary and the container image carry none.
//! Benchmarks that need a registry of their own as a process run the `xcc` executable they were
//! started from (`std::env::current_exe`).

use clap::{Args, Subcommand};

mod common;
mod first_grant;
mod hamlet;
mod hierarchy;
mod hostile;
mod import;
mod names;
mod reload;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// One registry, many Hamlet consumers: snapshot time, update fan-out latency, server RSS.
    Hamlet(hamlet::HamletArgs),
    /// A 3-level tree of registries: propagation, cold and cached lookups, routes, root memory.
    Hierarchy(hierarchy::HierarchyArgs),
    /// A first hierarchy grant for a question asked before the service existed: time from the
    /// owner's announcement reaching the root to the caller's import.
    FirstGrant(first_grant::FirstGrantArgs),
    /// One managed Hamlet client importing N services (from xcc and the Go reference server):
    /// time and bytes written.
    Import(import::ImportArgs),
    /// Children that never read (HTTP/2 window 0) asking for a large service again and again:
    /// the parent registry's RSS growth, and after they leave.
    HostileChildren(hostile::HostileArgs),
    /// Many Hamlet consumers while the policy set is edited: time until each has the records
    /// whose decision changed, records sent, streams ended.
    PolicyReload(reload::ReloadArgs),
    /// One level holding N names for absent owners: the time of M new announcements, against
    /// a level holding none.
    Names(names::NamesArgs),
    /// The transport floor of `bench hamlet --server floor --mode process`, as its child.
    #[command(hide = true)]
    HamletFloorServe(hamlet::FloorServeArgs),
}

/// Runs the chosen benchmark as a task of the runtime, so that its measuring code (the
/// single-consumer snapshots, the import's wait for the catalog, every driver loop) runs on a
/// runtime worker like the consumers it measures: on the thread that blocks on the CLI, each
/// message it waited for was a hand-off between threads, and on two cores a third busy thread.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    tokio::spawn(dispatch(args))
        .await
        .map_err(|e| anyhow::anyhow!("the benchmark task failed: {e}"))?
}

async fn dispatch(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Hamlet(args) => hamlet::run(args).await,
        BenchCommand::Hierarchy(args) => hierarchy::run(args).await,
        BenchCommand::Import(args) => import::run(args).await,
        BenchCommand::HostileChildren(args) => hostile::run(args).await,
        BenchCommand::PolicyReload(args) => reload::run(args).await,
        BenchCommand::FirstGrant(args) => first_grant::run(args).await,
        BenchCommand::Names(args) => names::run(args).await,
        BenchCommand::HamletFloorServe(args) => hamlet::floor_serve(args).await,
    }
}
