//! `xcc`: one binary for every role. Thin wiring only; the work happens in the crates.

mod admin_cli;
mod args;
mod binder_cli;
mod certs_cli;
mod check;
mod cli;
mod crds_cli;
mod dashboard;
mod demo;
mod dns_cli;
mod publisher_cli;
mod registry_cli;

use clap::Parser;

/// jemalloc, with its background thread purging freed pages (within [`DIRTY_DECAY_MS`]): a
/// peer that leaves gives back what its session held. glibc's malloc kept those pages in its
/// per-thread arenas (100 hostile children: +750 MiB held, +750 MiB still after they left; see
/// docs/benchmarks.md), and returning them there would take `malloc_trim`, an unsafe call.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How long jemalloc keeps a freed page for reuse before its background thread gives it back
/// (jemalloc's default: 10 s). One second still serves a burst from its own pages, and what a
/// load leaves (a zone file parsed, 100k records decoded) is gone soon after: `xcc dns` with
/// 100k names holds 34 MiB anonymous 2 s after loading, 52 MiB with the default.
#[cfg(not(target_env = "msvc"))]
const DIRTY_DECAY_MS: isize = 1000;

/// Sets [`DIRTY_DECAY_MS`] for every arena jemalloc has and will create.
#[cfg(not(target_env = "msvc"))]
fn tune_allocator() -> Result<(), tikv_jemalloc_ctl::Error> {
    use tikv_jemalloc_ctl::{Access as _, AsName as _};
    b"arenas.dirty_decay_ms\0".name().write(DIRTY_DECAY_MS)?;
    let arenas: u32 = b"arenas.narenas\0".name().read()?;
    for i in 0..arenas {
        // An arena not created yet refuses; it starts with the default set above.
        let _ = format!("arena.{i}.dirty_decay_ms\0")
            .name()
            .write(DIRTY_DECAY_MS);
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let mut cli = cli::Cli::parse();
    // The demo prints a report on stdout; keep its logs to warnings unless asked otherwise.
    // The admin client prints its answer on stdout too; its own log (TLS material loaded, ...)
    // is noise there unless something is wrong.
    if matches!(cli.command, cli::Command::Demo | cli::Command::Admin(_))
        && std::env::var_os("XCC_LOG").is_none()
    {
        cli.log.log = "warn".into();
    }
    // `xcc check` reports what it finds itself; the store's own warnings would say it twice.
    if matches!(cli.command, cli::Command::Check(_)) && std::env::var_os("XCC_LOG").is_none() {
        cli.log.log = "error".into();
    }
    cli::init_logging(&cli.log);
    #[cfg(not(target_env = "msvc"))]
    if let Err(e) = tune_allocator() {
        tracing::warn!(error = %e, "jemalloc keeps freed pages for its default 10 s");
    }
    xcc_certs::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::dispatch(cli.command)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The decision is printed already; the exit code says DENY.
        Err(e) if e.downcast_ref::<admin_cli::Denied>().is_some() => {
            std::process::ExitCode::from(admin_cli::DENIED_EXIT)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(all(test, not(target_env = "msvc")))]
mod allocator_tests {
    use std::time::{Duration, Instant};

    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .expect("reading /proc/self/status")
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("a VmRSS line")
    }

    #[test]
    fn the_allocator_purges_in_the_background() {
        // The binary's allocator is jemalloc, with its purge thread on from the start (the
        // `background_threads` feature), not only when something asks for it.
        assert!(tikv_jemalloc_ctl::background_thread::read().expect("jemalloc answers"));
        assert!(tikv_jemalloc_ctl::max_background_threads::read().expect("jemalloc answers") >= 1);
    }

    #[test]
    fn tuning_sets_the_decay_of_every_arena() {
        use tikv_jemalloc_ctl::{Access as _, AsName as _};
        super::tune_allocator().expect("jemalloc takes the setting");
        let new: isize = b"arenas.dirty_decay_ms\0"
            .name()
            .read()
            .expect("jemalloc answers");
        assert_eq!(new, super::DIRTY_DECAY_MS);
        // Arena 0 existed before (this thread's allocations may use another).
        let first: isize = b"arena.0.dirty_decay_ms\0"
            .name()
            .read()
            .expect("jemalloc answers");
        assert_eq!(first, super::DIRTY_DECAY_MS);
    }

    #[test]
    fn freed_small_allocations_go_back_to_the_system() {
        // What a departed peer's queue looks like to the allocator: many small strings (one per
        // endpoint), ~96 MiB of them, touched, then freed, among allocations that stay (one in
        // 4,096 here: the rest of the process). glibc's malloc gave back only the top of its
        // heaps, which what stays pins; jemalloc purges every page left empty.
        let before = rss_kib();
        let mut held: Vec<String> = (0..1_500_000u32)
            .map(|i| {
                format!(
                    "10.{}.{}.{}:443 and some padding",
                    i >> 16,
                    (i >> 8) & 255,
                    i & 255
                )
            })
            .collect();
        let peak = rss_kib();
        assert!(
            peak > before + 64 * 1024,
            "the strings should have made the process grow by more than 64 MiB: {before} KiB -> {peak} KiB"
        );
        let stays: Vec<String> = held.iter_mut().step_by(4096).map(std::mem::take).collect();
        drop(held);
        // jemalloc's background thread returns the freed pages as they decay (within 10 s,
        // jemalloc's default, or 1 s once a test here has tuned it) and tells no one: re-read VmRSS every 100 ms, for at most 60 s. Three
        // quarters of the growth must go (under glibc a third would: the vector's own block,
        // which it unmaps at once); not all, as other tests of this binary run meanwhile.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut now = rss_kib();
        while now > before + (peak - before) / 4 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            now = rss_kib();
        }
        assert!(
            now <= before + (peak - before) / 4,
            "VmRSS did not come back down: {before} KiB before, {peak} KiB while held, {now} KiB 60 s after the free"
        );
        assert_eq!(stays.len(), 1_500_000usize.div_ceil(4096));
    }
}
