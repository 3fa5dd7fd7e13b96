//! Command-line surface (clap derive, `env` fallbacks, flattened option groups).

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "xcc",
    version,
    about = "Cross-cluster service discovery (Hamlet-compatible)"
)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug)]
pub struct LogArgs {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "XCC_LOG", default_value = "info", global = true)]
    pub log: String,
    /// Log as JSON lines.
    #[arg(long, env = "XCC_LOG_JSON", global = true)]
    pub log_json: bool,
}

pub fn init_logging(args: &LogArgs) {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal; pipes and pod logs get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a registry: serve this cluster's exports over Hamlet, import from remote registries.
    Registry(crate::registry_cli::RegistryArgs),
    /// Publish labelled HTTPProxies and Services as exported ServiceRecords.
    Publisher(crate::publisher_cli::PublisherArgs),
    /// Turn imported ServiceRecords into Services with EndpointSlices (or Cilium global Services).
    Binder(crate::binder_cli::BinderArgs),
    /// Create a CA and issue registry and admin certificates.
    #[command(subcommand)]
    Certs(crate::certs_cli::CertsCommand),
    /// Print the CustomResourceDefinitions (or write them with --dir).
    Crds(crate::crds_cli::CrdsArgs),
    /// Serve DNS for imported services: FQDN zones and clusterset names (authoritative).
    Dns(crate::dns_cli::DnsArgs),
    /// Inspect a registry through its admin API.
    ///
    /// Exit codes: 0 done (for resolve, explain and explain-policy: ALLOW); 1 an error (the
    /// message names it); 2 a usage error; 3 the decision is DENY (printed with its reason).
    Admin(crate::admin_cli::AdminArgs),
    /// Check every precondition of a working install, each with its fix.
    ///
    /// Exit codes: 0 nothing failed (warnings allowed); 1 a check failed (the report says
    /// which, and how to fix it); 2 a usage error.
    Check(crate::check::CheckArgs),
    /// Serve a read-only web page of the federation on loopback, read live through the admin
    /// API with the operator's admin certificate (the TLS flags of `xcc admin`).
    Dashboard(crate::dashboard::DashboardArgs),
    /// Run a two-registry federation on loopback and print what it did.
    Demo,
    /// Measure a registry under load (snapshot time, update fan-out, memory). Built with
    /// `--features bench` only (crate `xcc-bench`).
    #[cfg(feature = "bench")]
    Bench(xcc_bench::BenchArgs),
}

pub async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Registry(args) => crate::registry_cli::run(args).await,
        Command::Publisher(args) => crate::publisher_cli::run(args).await,
        Command::Binder(args) => crate::binder_cli::run(args).await,
        Command::Certs(cmd) => crate::certs_cli::run(cmd),
        Command::Crds(args) => crate::crds_cli::run(args),
        Command::Admin(args) => crate::admin_cli::run(args).await,
        Command::Dns(args) => crate::dns_cli::run(args).await,
        Command::Check(args) => crate::check::run(args).await,
        Command::Dashboard(args) => crate::dashboard::run(args).await,
        Command::Demo => crate::demo::run().await,
        #[cfg(feature = "bench")]
        Command::Bench(args) => xcc_bench::run(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_flags_refuse_more_than_a_day_instead_of_overflowing_a_deadline() {
        let parse = |v: &str| Cli::try_parse_from(["xcc", "registry", "--ack-timeout-seconds", v]);
        let err = parse("18446744073709551615").expect_err("out of range");
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(parse("86400").is_ok());
    }
}
