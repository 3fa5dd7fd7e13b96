//! Pieces of the command line that several commands share: the certificate flags, the
//! `--store` choice, duration and metrics-address flags, and table / JSON output. Commands use
//! these; this module uses no command (`cli.rs` dispatches to the commands, none looks back).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

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

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Store {
    /// Exports, remotes and imports in YAML files under --state-dir.
    File,
    /// Kubernetes: exports are ServiceRecords with the export label (all namespaces),
    /// RemoteRegistries and imported ServiceRecords live in --namespace.
    Kube,
}

// The `--output` choice and the table renderer live in `xcc-output`, which the benchmarks
// (`xcc-bench`) share.
pub use xcc_output::{Output, table};

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

/// Parser of a duration flag in seconds: at most a day. Every such flag becomes a timer or a
/// deadline (`Instant + Duration`), which panics on overflow; no setting needs more than a day.
pub fn seconds() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(..=86_400)
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
