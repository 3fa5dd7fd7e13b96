//! `xcc certs init`, `xcc certs issue` and `xcc certs bundle` (CA rotation).

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
        /// Output directory (default: <ca-dir>/<name>). When it already holds a ca.crt bundle
        /// with this CA (a CA rotation, step 2), only tls.crt and tls.key are replaced; a bundle
        /// without this CA is refused (run `xcc certs bundle add` first).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Change a CA bundle (ca.crt) in place, for a CA rotation: add the new CA to every bundle,
    /// reissue every certificate, remove the old CA. Running processes pick each change up.
    #[command(subcommand)]
    Bundle(BundleCommand),
}

#[derive(Subcommand, Debug)]
pub enum BundleCommand {
    /// Add the CA(s) of --ca to the bundle (kept once if already there).
    Add {
        /// The bundle to change (e.g. east/tls/ca.crt).
        #[arg(long)]
        bundle: PathBuf,
        /// The CA certificate to add (e.g. pki-2/ca.crt).
        #[arg(long)]
        ca: PathBuf,
    },
    /// Remove the CA(s) of --ca from the bundle. Refused when the certificate beside the bundle
    /// (tls.crt in the same directory, or --cert) is still issued by it.
    Remove {
        #[arg(long)]
        bundle: PathBuf,
        /// The CA certificate to remove (e.g. pki/ca.crt).
        #[arg(long)]
        ca: PathBuf,
        /// The certificate that must still verify (default: tls.crt beside the bundle).
        #[arg(long)]
        cert: Option<PathBuf>,
    },
    /// List the CAs of a bundle: subject, serial, expiry.
    List {
        #[arg(long)]
        bundle: PathBuf,
    },
}

fn bundle(cmd: BundleCommand) -> anyhow::Result<()> {
    use xcc_certs::bundle;
    match cmd {
        BundleCommand::Add { bundle: b, ca } => {
            let added = bundle::add_file(&b, &ca)?;
            match added {
                0 => println!("{} already holds the CA of {}", b.display(), ca.display()),
                n => println!("added {n} CA to {}", b.display()),
            }
        }
        BundleCommand::Remove {
            bundle: b,
            ca,
            cert,
        } => {
            let cert = cert.or_else(|| b.parent().map(|d| d.join(pki::TLS_CERT_FILE)));
            bundle::remove_file(&b, &ca, cert.as_deref())?;
            println!("removed the CA of {} from {}", ca.display(), b.display());
        }
        BundleCommand::List { bundle: b } => {
            let pem = std::fs::read(&b).map_err(|e| anyhow::anyhow!("{}: {e}", b.display()))?;
            for e in bundle::entries(&pem, &b.display().to_string())? {
                println!(
                    "{}  serial {}  expires {}",
                    e.subject, e.serial, e.not_after
                );
            }
        }
    }
    Ok(())
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
            let bundle = out.join(pki::CA_CERT_FILE);
            let files = if bundle.exists() {
                if !xcc_certs::bundle::holds(&bundle, &ca_dir.join(pki::CA_CERT_FILE))? {
                    anyhow::bail!(
                        "{} does not hold the CA of {}: a certificate from it would not be trusted beside that bundle; add the CA to every bundle first (xcc certs bundle add --bundle {} --ca {}), or issue into a new directory",
                        bundle.display(),
                        ca_dir.display(),
                        bundle.display(),
                        ca_dir.join(pki::CA_CERT_FILE).display()
                    );
                }
                pki::write_leaf(&out, &issued)?
            } else {
                pki::write_issued(&out, &ca, &issued)?
            };
            let kind = if admin { "admin" } else { "cluster" };
            println!(
                "issued spiffe://{}/{kind}/{cluster}: {}, {}, {}",
                ca.trust_domain(),
                files.cert.display(),
                files.key.display(),
                files.ca.display()
            );
        }
        CertsCommand::Bundle(cmd) => bundle(cmd)?,
    }
    Ok(())
}
