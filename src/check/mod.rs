//! `xcc check`: every precondition a working install needs, each ✓ / ! / ✗ with its one-line
//! fix. Run it where the component runs (`kubectl exec deploy/xcc-registry -- xcc check` reads
//! the same `XCC_*` environment and files as the registry), or on a file-mode host with the
//! registry's flags. Exit code 0 when nothing failed (warnings allowed), 1 otherwise.

mod cluster;
mod kube;
mod report;
mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use xcc_proto::crd::{RemoteRegistry, Role, ServiceRecord};
use xcc_registry::store::file::{EXPORTS_DIR, REMOTES_DIR, YamlDir};
use xcc_registry::store::model;

pub use self::kube::Component;
use self::report::{Check, Report};
use crate::args::Store;
use crate::args::TlsArgs;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The component whose preconditions are checked. publisher and binder: the CRDs and their
    /// RBAC (kube store only); registry: its certificate, store, remotes and DNS as well.
    #[arg(long, value_enum, default_value = "registry")]
    pub component: Component,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[arg(long, value_enum, env = "XCC_STORE", default_value = "file")]
    pub store: Store,
    /// Directory holding exports/, remotes/ and imports/ (file store).
    #[arg(long, env = "XCC_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// The component's namespace (kube store: RemoteRegistries, its Role).
    #[arg(long, env = "NAMESPACE", default_value = xcc_proto::names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// The cluster name the certificate must carry (default: not compared).
    #[arg(long)]
    pub cluster: Option<String>,
    /// An `xcc dns` server (host:port) that must answer --dns-zone.
    #[arg(long)]
    pub dns: Option<SocketAddr>,
    /// The zone --dns must be authoritative for (and, kube store, that CoreDNS must forward).
    #[arg(long, default_value = "clusterset.local")]
    pub dns_zone: String,
    /// How long each network probe may take (seconds).
    #[arg(long, default_value_t = 5, value_parser = crate::args::seconds())]
    pub timeout_seconds: u64,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
}

/// Some check failed (the report is printed already); the process exits with 1.
#[derive(Debug, thiserror::Error)]
#[error("{failed} of {total} checks failed")]
pub struct ChecksFailed {
    pub failed: usize,
    pub total: usize,
}

pub async fn run(args: CheckArgs) -> anyhow::Result<()> {
    let report = checks(&args).await;
    match args.output {
        Output::Text => print!("{}", report.text()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    match report.failed() {
        0 => Ok(()),
        failed => Err(ChecksFailed {
            failed,
            total: report.checks.len(),
        }
        .into()),
    }
}

async fn checks(args: &CheckArgs) -> Report {
    let mut report = Report::default();
    let timeout = Duration::from_secs(args.timeout_seconds);
    let registry = args.component == Component::Registry;
    let tls = if registry {
        let mut out = vec![];
        let tls = match args.tls.files() {
            Ok(files) => tls::certificate(
                &files,
                args.cluster.as_deref(),
                time::OffsetDateTime::now_utc(),
                &mut out,
            ),
            Err(e) => {
                out.push(Check::fail(
                    "certificate",
                    e.to_string(),
                    "give --tls-dir (ca.crt, tls.crt, tls.key) or XCC_TLS_DIR, as the registry has",
                ));
                None
            }
        };
        out.into_iter().for_each(|c| report.push(c));
        tls
    } else {
        None
    };
    let cluster = tls.as_ref().map(|t| t.identity().name().to_string());

    let remotes = match args.store {
        Store::File => {
            if !registry {
                report.push(Check::skip(
                    "store",
                    "the publisher and the binder run on Kubernetes only: use --store kube",
                ));
                return report;
            }
            file_store(args.state_dir.as_deref(), cluster.as_deref(), &mut report).await
        }
        Store::Kube => kube_store(args, cluster.as_deref(), &mut report).await,
    };

    if registry {
        match &tls {
            Some(tls) => {
                for rr in &remotes {
                    report.push(remote(tls, rr, timeout).await);
                }
            }
            None => {
                for rr in &remotes {
                    let name = rr.metadata.name.clone().unwrap_or_default();
                    report.push(Check::skip(
                        format!("remote {name}"),
                        "not probed: this registry's certificate did not load",
                    ));
                }
            }
        }
        if let Some(addr) = args.dns {
            report.push(dns(addr, &args.dns_zone, timeout).await);
        }
    }
    report
}

/// The state directory, its files, and the RemoteRegistries they hold.
async fn file_store(
    state_dir: Option<&Path>,
    cluster: Option<&str>,
    report: &mut Report,
) -> Vec<RemoteRegistry> {
    let Some(dir) = state_dir else {
        report.push(Check::fail(
            "state directory",
            "no --state-dir (or XCC_STATE_DIR)",
            "give the registry's --state-dir",
        ));
        return vec![];
    };
    if !dir.is_dir() {
        report.push(Check::fail(
            "state directory",
            format!("{} does not exist", dir.display()),
            "create it (mkdir -p) or fix --state-dir: the registry would start with no exports and no remotes",
        ));
        return vec![];
    }
    let probe = dir.join(".xcc-check-write");
    match std::fs::write(&probe, b"") {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            report.push(Check::ok(
                "state directory",
                format!("{} exists and is writable", dir.display()),
            ));
        }
        Err(e) => report.push(Check::fail(
            "state directory",
            format!("{} is not writable: {e}", dir.display()),
            "the registry writes imports/ and its ledger there: give its user write access",
        )),
    }
    let missing: Vec<&str> = [EXPORTS_DIR, REMOTES_DIR]
        .into_iter()
        .filter(|d| !dir.join(d).is_dir())
        .collect();
    if !missing.is_empty() {
        report.push(Check::warn(
            "state subdirectories",
            format!("{} missing in {}", missing.join("/ and "), dir.display()),
            "the registry creates them empty at start; if it had exports or remotes, --state-dir points at the wrong place",
        ));
    }
    let mut exports = YamlDir::<ServiceRecord>::new(dir.join(EXPORTS_DIR));
    let mut remotes = YamlDir::<RemoteRegistry>::new(dir.join(REMOTES_DIR));
    let cluster = cluster.unwrap_or_default().to_string();
    // Read as the registry reads: a file's rejection applies once the file has read the same
    // for the store's settle time, so read again when the store says a change is due.
    for _ in 0..4 {
        if dir.join(EXPORTS_DIR).is_dir() {
            exports.refresh(|sr| model::export_entry(&cluster, sr).map(|_| ()));
        }
        if dir.join(REMOTES_DIR).is_dir() {
            remotes.refresh(|rr| model::remote_spec(rr).map(|_| ()));
        }
        match exports
            .next_due()
            .into_iter()
            .chain(remotes.next_due())
            .min()
        {
            Some(due) => tokio::time::sleep_until(due.into()).await,
            None => break,
        }
    }
    let errors = [exports.errors(), remotes.errors()].concat();
    if errors.is_empty() {
        report.push(Check::ok(
            "files",
            format!(
                "{} exports and {} remotes, every file valid",
                exports.items().len(),
                remotes.items().len()
            ),
        ));
    } else {
        report.push(Check::fail(
            "files",
            errors.join("; "),
            "fix each file named; while a file is rejected the registry keeps its last good content",
        ));
    }
    remotes.items()
}

/// The CRDs, the component's RBAC and (registry) the RemoteRegistries with their sync state.
async fn kube_store(
    args: &CheckArgs,
    cert_cluster: Option<&str>,
    report: &mut Report,
) -> Vec<RemoteRegistry> {
    let client = match xcc_controller::client().await {
        Ok(c) => c,
        Err(e) => {
            report.push(Check::fail(
                "kubernetes",
                format!("{e:#}"),
                "run it in the component's pod (kubectl exec) or with a KUBECONFIG for its ServiceAccount",
            ));
            return vec![];
        }
    };
    let crds = kube::crds(&client).await;
    let served = crds.status == report::Status::Ok;
    report.push(crds);
    report.push(kube::rbac(&client, args.component, &args.namespace).await);
    if args.component == Component::Registry {
        report.push(cluster::cluster_property(&client, cert_cluster).await);
        report.push(cluster::coredns(&client, &args.dns_zone).await);
    }
    if args.component != Component::Registry || !served {
        return vec![];
    }
    let api: ::kube::Api<RemoteRegistry> = ::kube::Api::namespaced(client.clone(), &args.namespace);
    match api.list(&Default::default()).await {
        Ok(list) => {
            let mut rrs = list.items;
            rrs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            for rr in &rrs {
                report.push(sync_state(rr, time::OffsetDateTime::now_utc()));
            }
            if let Some(parent) = rrs.iter().find(|rr| rr.spec.role() == Role::Parent) {
                report.push(parent_refusals(client.clone(), parent, &args.namespace).await);
            }
            rrs
        }
        Err(e) => {
            report.push(Check::fail(
                "remotes",
                format!("cannot list RemoteRegistries in {}: {e}", args.namespace),
                "see the rbac check",
            ));
            vec![]
        }
    }
}

/// `parent refusals <name>`: the exports and imports the parent refuses, as recorded here.
async fn parent_refusals(
    client: ::kube::Client,
    parent: &RemoteRegistry,
    namespace: &str,
) -> Check {
    let api: ::kube::Api<ServiceRecord> = ::kube::Api::namespaced(client, namespace);
    match api.list(&Default::default()).await {
        Ok(list) => cluster::parent_refusals(parent, &list.items),
        Err(e) => Check::fail(
            format!(
                "parent refusals {}",
                parent.metadata.name.as_deref().unwrap_or_default()
            ),
            format!("cannot list ServiceRecords in {namespace}: {e}"),
            "see the rbac check",
        ),
    }
}

/// `sync <name>`: the RemoteRegistry's Synced condition and how long ago it last changed.
fn sync_state(rr: &RemoteRegistry, now: time::OffsetDateTime) -> Check {
    let name = rr.metadata.name.clone().unwrap_or_default();
    let id = format!("sync {name}");
    let conditions = rr
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let Some(c) = conditions.iter().find(|c| c.type_ == "Synced") else {
        return Check::warn(
            id,
            "no Synced condition yet",
            "the registry has not handled this RemoteRegistry: is it running, and holding the Lease?",
        );
    };
    let age = time::OffsetDateTime::from_unix_timestamp(c.last_transition_time.0.as_second())
        .map(|t| (now - t).whole_seconds())
        .unwrap_or_default();
    if c.status == "True" {
        Check::ok(id, format!("synced; in this state for {age} s"))
    } else {
        Check::fail(
            id,
            format!("not synced for {age} s: {}: {}", c.reason, c.message),
            "see the remote check below and the registry's log",
        )
    }
}

async fn remote(
    tls: &xcc_certs::reload::ReloadingTls,
    rr: &RemoteRegistry,
    timeout: Duration,
) -> Check {
    let name = rr.metadata.name.clone().unwrap_or_default();
    match model::remote_spec(rr) {
        Ok(spec) => tls::remote(tls, &spec, rr.spec.role() == Role::Parent, timeout).await,
        Err(e) => Check::fail(
            format!("remote {name}"),
            format!("invalid spec: {e}"),
            "fix the RemoteRegistry (kubectl describe remoteregistry, or its file)",
        ),
    }
}

/// `dns`: the server answers the zone's SOA.
async fn dns(addr: SocketAddr, zone: &str, timeout: Duration) -> Check {
    use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::{Name, RecordType};
    let ask = async {
        let mut m = Message::new(0x7c3, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(
            Name::from_ascii(format!("{}.", zone.trim_end_matches('.')))?,
            RecordType::SOA,
        ));
        let socket = tokio::net::UdpSocket::bind(if addr.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        })
        .await?;
        socket.send_to(&m.to_vec()?, addr).await?;
        let mut buf = vec![0u8; 4096];
        let (n, _) = socket.recv_from(&mut buf).await?;
        Ok::<_, anyhow::Error>(Message::from_vec(&buf[..n])?)
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(Ok(m))
            if m.metadata.response_code == ResponseCode::NoError
                && m.answers.iter().any(|r| r.record_type() == RecordType::SOA) =>
        {
            Check::ok("dns", format!("{addr} answers the {zone} zone"))
        }
        Ok(Ok(m)) => Check::fail(
            "dns",
            format!(
                "{addr} answered {} with no SOA for {zone}",
                m.metadata.response_code
            ),
            "is it xcc dns, given --zone for this zone?",
        ),
        Ok(Err(e)) => Check::fail(
            "dns",
            format!("asking {addr}: {e:#}"),
            "check that xcc dns runs and listens there (UDP)",
        ),
        Err(_) => Check::fail(
            "dns",
            format!("no answer from {addr} within {timeout:?}"),
            "check that xcc dns runs and listens there (UDP), and the path to it",
        ),
    }
}
