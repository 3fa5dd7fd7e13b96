//! `xcc`: one binary for every role. Thin wiring only; the work happens in the crates.

mod admin_cli;
// `xcc bench ...` only with the `bench` feature: not in the production binary. The unit tests
// build it always, so that `cargo test --workspace` runs the benchmarks' own tests too.
#[cfg(any(feature = "bench", test))]
mod bench;
#[cfg(any(feature = "bench", test))]
mod bench_common;
#[cfg(any(feature = "bench", test))]
mod bench_first_grant;
#[cfg(any(feature = "bench", test))]
mod bench_hierarchy;
#[cfg(any(feature = "bench", test))]
mod bench_hostile;
#[cfg(any(feature = "bench", test))]
mod bench_import;
#[cfg(any(feature = "bench", test))]
mod bench_names;
#[cfg(any(feature = "bench", test))]
mod bench_reload;
mod binder_cli;
mod certs_cli;
mod check;
mod cli;
mod crds_cli;
mod demo;
mod dns_cli;
mod publisher_cli;
mod registry_cli;

use clap::Parser;

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
