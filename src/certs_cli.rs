//! `xcc certs init` and `xcc certs issue`.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Subcommand;
use xcc_certs::pki::{self, IssueRequest};

#[derive(Subcommand, Debug)]
pub enum CertsCommand {
    /// Create a CA (ca.crt, ca.key) for a trust domain.
    Init {
        #[arg(long)]
        trust_domain: String,
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a key pair (tls.crt, tls.key, ca.crt) usable as server and client certificate.
    Issue {
        /// Directory holding ca.crt and ca.key.
        #[arg(long)]
        ca_dir: PathBuf,
        /// Cluster (or, with --admin, operator) name carried in the URI SAN.
        #[arg(long)]
        cluster: String,
        #[arg(long)]
        dns: Vec<String>,
        #[arg(long)]
        ip: Vec<IpAddr>,
        /// Issue an admin identity (spiffe://<td>/admin/<name>) for the admin API.
        #[arg(long)]
        admin: bool,
        /// Output directory (default: <ca-dir>/<name>).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

pub fn run(cmd: CertsCommand) -> anyhow::Result<()> {
    match cmd {
        CertsCommand::Init { trust_domain, out } => {
            let ca = pki::init_ca_dir(&trust_domain, &out)?;
            println!(
                "created CA for trust domain {} in {}",
                ca.trust_domain(),
                out.display()
            );
        }
        CertsCommand::Issue {
            ca_dir,
            cluster,
            dns,
            ip,
            admin,
            out,
        } => {
            let ca = pki::load_ca_dir(&ca_dir)?;
            let mut req = if admin {
                IssueRequest::admin(&cluster)
            } else {
                IssueRequest::cluster(&cluster)
            };
            req.dns = dns;
            req.ips = ip;
            let issued = ca.issue(&req)?;
            let out = out.unwrap_or_else(|| ca_dir.join(&cluster));
            let files = pki::write_issued(&out, &ca, &issued)?;
            let kind = if admin { "admin" } else { "cluster" };
            println!(
                "issued spiffe://{}/{kind}/{cluster}: {}, {}, {}",
                ca.trust_domain(),
                files.cert.display(),
                files.key.display(),
                files.ca.display()
            );
        }
    }
    Ok(())
}
