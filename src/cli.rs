//! Command-line surface (clap derive, `env` fallbacks, flattened option groups).

use std::path::PathBuf;

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

/// Certificate files: a directory with `ca.crt`, `tls.crt`, `tls.key` (the layout of a
/// cert-manager Secret and of `xcc certs issue`), or each file by name.
#[derive(Args, Debug, Clone)]
pub struct TlsArgs {
    /// Directory holding `ca.crt`, `tls.crt` and `tls.key` (as `xcc certs issue --out` writes
    /// them); the three flags below override one file each.
    #[arg(long, env = "XCC_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// CA bundle (PEM) that the other side's certificate must chain to.
    #[arg(long, env = "XCC_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This side's certificate chain (PEM), leaf first.
    #[arg(long, env = "XCC_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// This side's private key (PEM).
    #[arg(long, env = "XCC_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    pub fn files(&self) -> anyhow::Result<xcc_certs::reload::TlsFiles> {
        let base = self
            .tls_dir
            .as_ref()
            .map(|d| xcc_certs::reload::TlsFiles::in_dir(d));
        let pick = |explicit: &Option<PathBuf>, from_dir: Option<PathBuf>, what: &str| {
            explicit
                .clone()
                .or(from_dir)
                .ok_or_else(|| anyhow::anyhow!("no {what}: give --tls-dir or --tls-{what}"))
        };
        Ok(xcc_certs::reload::TlsFiles {
            ca: pick(&self.tls_ca, base.as_ref().map(|b| b.ca.clone()), "ca")?,
            cert: pick(
                &self.tls_cert,
                base.as_ref().map(|b| b.cert.clone()),
                "cert",
            )?,
            key: pick(&self.tls_key, base.as_ref().map(|b| b.key.clone()), "key")?,
        })
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
    /// `--features bench` only.
    #[cfg(any(feature = "bench", test))]
    Bench(crate::bench::BenchArgs),
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
        #[cfg(any(feature = "bench", test))]
        Command::Bench(args) => crate::bench::run(args).await,
    }
}

/// The `--metrics-listen` address; empty turns the endpoint off.
pub fn metrics_listen(value: &str) -> anyhow::Result<Option<std::net::SocketAddr>> {
    use anyhow::Context as _;
    if value.is_empty() {
        return Ok(None);
    }
    value
        .parse()
        .map(Some)
        .with_context(|| format!("--metrics-listen {value:?}"))
}

#[cfg(test)]
mod metrics_listen_tests {
    use super::metrics_listen;

    #[test]
    fn empty_turns_the_endpoint_off_and_bad_addresses_are_named() {
        assert_eq!(metrics_listen("").expect("empty"), None);
        assert_eq!(
            metrics_listen("127.0.0.1:9090").expect("address"),
            Some("127.0.0.1:9090".parse().expect("literal"))
        );
        let err = metrics_listen("localhost").expect_err("no port");
        assert_eq!(err.to_string(), "--metrics-listen \"localhost\"");
    }
}

/// Parser of a duration flag in seconds: at most a day. Every such flag becomes a timer or a
/// deadline (`Instant + Duration`), which panics on overflow; no setting needs more than a day.
pub fn seconds() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(..=86_400)
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
