//! The imports feed: `xcc dns` without Kubernetes, serving what a file-mode registry imported.
//!
//! `xcc registry --store file` keeps each remote's imports as a snapshot,
//! `<state-dir>/imports/<remote>.yaml` (ServiceRecords, replaced atomically), and a journal of the
//! changes since, `<remote>.journal` ([`xcc_proto::import_journal`]). This feed watches that
//! directory (filesystem events, plus a slow poll for filesystems that deliver none), reads each
//! changed remote as the registry does (snapshot, then the journal replayed), and hands the index a full Services listing built by the pure
//! [`services_from_records`]: one name per imported FQDN with the endpoint addresses as its A /
//! AAAA records (there is no cluster IP without Kubernetes), and the MCS name
//! `<origin-name>.<origin-namespace>.svc.clusterset.local` when the record carries the origin
//! annotations. A headless import ([`xcc_proto::mcs::HEADLESS_ANNOTATION`]) with pod hostnames
//! ([`xcc_proto::mcs::HOSTNAMES_ANNOTATION`]) also gets the MCS pod names
//! `<hostname>.<cluster>.<origin-name>.<origin-namespace>.svc.clusterset.local`, built by the
//! kube feed's own [`headless::pod_names`]: the cluster is the record's source (its
//! `spec.origin.cluster` — a hierarchy import's owner — else its RemoteRegistry, else the
//! remote the file belongs to), and only hostnames of the record's own endpoint addresses count.
//!
//! A file that does not parse is reported with its name and the last good content of that file
//! stays served, so a half-edited file never empties the zone. A removed file removes its names.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xcc_proto::crd::{self, ServiceRecord};
use xcc_proto::import_journal::{self, Change, Put};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::names::{
    IMPORTED_LABEL, REMOTE_REGISTRY_LABEL, canonical_fqdn, imported_record_name,
};
use xcc_proto::resources;

use super::headless;
use super::index::DnsFeed;
use super::zone::{NameAnnotations, NamedPort, PortProtocol, ServiceInfo, ServiceKey};

/// Fallback re-scan period when no filesystem event arrives (network filesystems, missed events).
/// Unchanged files are recognised by their metadata and not re-read.
pub const POLL: Duration = Duration::from_secs(5);

/// An imported record that could not be served, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The file it came from.
    pub file: String,
    /// `namespace/name` of the record.
    pub record: String,
    /// Why.
    pub reason: String,
}

/// Build the Services listing from every file's records (pure). Records naming the same FQDN
/// (one service imported from two remotes) merge: their addresses are unioned; the key is the
/// lowest of their keys and the origin the best of theirs ([`better_origin`]), so neither file
/// order nor a record's name decides. A record without a namespace (a journal read before any
/// snapshot) gets the namespace of the directory's other records, else the registry's default:
/// never the empty namespace, which is the static records' (and wins every tie).
pub fn services_from_records(
    files: &BTreeMap<String, Vec<ServiceRecord>>,
) -> (Vec<ServiceInfo>, Vec<Skipped>) {
    let namespace: Arc<str> = files
        .values()
        .flatten()
        .filter_map(|r| r.metadata.namespace.as_deref())
        .find(|n| !n.is_empty())
        .unwrap_or(xcc_proto::names::DEFAULT_NAMESPACE)
        .into();
    let mut by_fqdn: BTreeMap<String, ServiceInfo> = BTreeMap::new();
    let mut addresses: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    // FQDN → the (cluster, address, hostname) of its headless records' pods.
    let mut pods: BTreeMap<String, Vec<(String, IpAddr, String)>> = BTreeMap::new();
    let mut skipped = Vec::new();
    for (file, records) in files {
        for sr in records {
            let skip = |reason: String| Skipped {
                file: file.clone(),
                record: format!(
                    "{}/{}",
                    sr.metadata.namespace.as_deref().unwrap_or(""),
                    sr.metadata.name.as_deref().unwrap_or("")
                ),
                reason,
            };
            let fqdn = match canonical_fqdn(&sr.spec.fqdn) {
                Ok(f) => f,
                Err(e) => {
                    skipped.push(skip(format!("spec.fqdn: {e}")));
                    continue;
                }
            };
            let ips: Vec<IpAddr> = sr
                .spec
                .endpoints
                .iter()
                .filter_map(|e| e.address.parse().ok())
                .collect();
            if ips.is_empty() {
                skipped.push(skip("no endpoint is an IP address".into()));
                continue;
            }
            if let Some(cluster) = xcc_proto::mcs::source_cluster(sr).or(Some(file.as_str())) {
                // Only hostnames of this record's own endpoints (a file is not trusted to name
                // addresses the service does not serve); `record_hostnames` is empty unless the
                // record is headless.
                pods.entry(fqdn.clone()).or_default().extend(
                    xcc_proto::mcs::record_hostnames(sr).into_iter().filter_map(
                        |(address, hostname)| {
                            let ip: IpAddr = address.parse().ok()?;
                            ips.contains(&ip)
                                .then(|| (cluster.to_string(), ip, hostname))
                        },
                    ),
                );
            }
            addresses.entry(fqdn.clone()).or_default().extend(ips);
            let key = ServiceKey::new(
                match sr.metadata.namespace.as_deref() {
                    Some(ns) if !ns.is_empty() => Arc::from(ns),
                    _ => namespace.clone(),
                },
                sr.metadata.name.clone().unwrap_or_default(),
            );
            let mut annotations = origin_annotations(sr);
            annotations.fqdn = Some(fqdn.as_str().into());
            let info = by_fqdn.entry(fqdn.clone()).or_insert_with(|| ServiceInfo {
                key: key.clone(),
                annotations: annotations.clone(),
                cluster_ips: Vec::new(),
                ports: Vec::new(),
            });
            if key < info.key {
                info.key = key;
            }
            if better_origin(&fqdn, &annotations, &info.annotations) {
                info.annotations = annotations;
            }
            for p in sr.spec.ports.iter().flatten() {
                if let Some(port) = named_port(p)
                    && !info.ports.contains(&port)
                {
                    info.ports.push(port);
                }
            }
        }
    }
    let mut services = Vec::with_capacity(by_fqdn.len());
    for (fqdn, mut info) in by_fqdn {
        info.cluster_ips = addresses
            .remove(&fqdn)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let pod_names = headless::pod_names(
            &info.key,
            &info.annotations,
            pods.get(&fqdn)
                .into_iter()
                .flatten()
                .map(|(cluster, ip, hostname)| (cluster.as_str(), *ip, hostname.as_str())),
        );
        services.push(info);
        services.extend(pod_names);
    }
    (services, skipped)
}

/// Whether `a`'s origin should stand for a merged FQDN rather than `b`'s: an origin whose MCS
/// name is the FQDN itself first, then any origin over none, then the lower pair — decided by
/// the records' content, never by the order they were read in.
fn better_origin(fqdn: &str, a: &NameAnnotations, b: &NameAnnotations) -> bool {
    let rank = |n: &NameAnnotations| match (&n.origin_namespace, &n.origin_name) {
        (Some(ns), Some(name)) => (
            u8::from(xcc_proto::names::clusterset_fqdn(name, ns) != fqdn),
            Some((ns.clone(), name.clone())),
        ),
        _ => (2, None),
    };
    rank(a) < rank(b)
}

/// The origin annotations, only as a pair (one alone names nothing).
fn origin_annotations(sr: &ServiceRecord) -> NameAnnotations {
    let Some(a) = &sr.metadata.annotations else {
        return NameAnnotations::default();
    };
    match (
        a.get(ORIGIN_NAMESPACE_ANNOTATION),
        a.get(ORIGIN_NAME_ANNOTATION),
    ) {
        (Some(ns), Some(name)) => NameAnnotations {
            origin_namespace: Some(ns.as_str().into()),
            origin_name: Some(name.as_str().into()),
            ..NameAnnotations::default()
        },
        _ => NameAnnotations::default(),
    }
}

fn named_port(p: &crd::ServicePort) -> Option<NamedPort> {
    let protocol = match p.protocol() {
        crd::Protocol::Tcp => PortProtocol::Tcp,
        crd::Protocol::Udp => PortProtocol::Udp,
        crd::Protocol::Sctp => PortProtocol::Sctp,
    };
    Some(NamedPort {
        name: p.name.clone(),
        port: u16::try_from(p.port).ok().filter(|p| *p > 0)?,
        protocol,
    })
}

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    /// A rename over the file (how the registry replaces it) changes the inode.
    inode: u64,
}

/// One remote's files: its snapshot (`<remote>.yaml`) and its journal (`<remote>.journal`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Stamps {
    snapshot: Option<Stamp>,
    journal: Option<Stamp>,
    /// A file was modified less than [`RACY`] before it was read: equal stamps prove nothing.
    racy: bool,
}

/// The registry appends to a journal in place (its length stays the same) and file timestamps
/// are coarse, so a file modified this shortly before it was read may change again without its
/// stamp changing: such a remote is read again on the next scan.
const RACY: Duration = Duration::from_secs(2);

impl Stamps {
    /// These stamps as remembered after a read that started at `read_at`.
    fn read_at(mut self, read_at: SystemTime) -> Self {
        self.racy = [self.snapshot, self.journal]
            .into_iter()
            .flatten()
            .any(|s| s.modified.is_none_or(|m| m + RACY > read_at));
        self
    }
}

/// How long a remote's snapshot rewrite that takes records away (or a remote's files being
/// gone) must read the same before it is applied: a snapshot written in place or caught half-way,
/// or replaced by unlinking it first, never removes names for a moment. The registry itself
/// replaces snapshots atomically and removes through its journal, which applies at once.
pub const SETTLE: Duration = Duration::from_secs(1);

/// The directory as last read: per remote, the stamps of its files and the last good records.
#[derive(Debug)]
pub struct ImportsDir {
    dir: PathBuf,
    files: BTreeMap<String, (Stamps, Vec<ServiceRecord>)>,
    /// Remotes whose snapshot reads as taking records away (`None`: whose files are gone), and
    /// since when, until they have read so for `settle`.
    unsettled: BTreeMap<String, (Option<Vec<ServiceRecord>>, Instant)>,
    settle: Duration,
    /// Remotes whose snapshot last read as empty (warned about once).
    empty: BTreeSet<String>,
}

impl ImportsDir {
    /// A reader of `dir` that has read nothing yet.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
            unsettled: BTreeMap::new(),
            settle: SETTLE,
            empty: BTreeSet::new(),
        }
    }

    /// [`SETTLE`] unless a test says otherwise.
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// When a change waiting to settle may be applied: rescan then.
    pub fn next_due(&self) -> Option<Instant> {
        self.unsettled
            .values()
            .map(|(_, since)| *since + self.settle)
            .min()
    }

    /// Whether `remote` has read as `now` for `settle`; remembers it from now otherwise.
    fn settled(&mut self, remote: &str, now: Option<&Vec<ServiceRecord>>) -> bool {
        let at = Instant::now();
        match self.unsettled.get(remote) {
            Some((seen, since)) if seen.as_ref() == now => *since + self.settle <= at,
            _ => {
                self.unsettled
                    .insert(remote.to_string(), (now.cloned(), at));
                self.settle.is_zero()
            }
        }
    }

    /// Re-read the remotes whose snapshot or journal changed and forget removed ones. Returns
    /// whether anything changed, and one message per remote whose snapshot could not be read
    /// (its last good content stays) or journal line that was skipped.
    pub fn rescan(&mut self) -> (bool, Vec<String>) {
        let mut errors = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                errors.push(format!("cannot list {}: {e}", self.dir.display()));
                return (false, errors);
            }
        };
        let mut seen: BTreeMap<String, (Stamps, Option<PathBuf>, Option<PathBuf>)> =
            BTreeMap::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some((remote, part)) = remote_file(&path) else {
                continue;
            };
            let stamp = entry.metadata().ok().map(|m| Stamp {
                len: m.len(),
                modified: m.modified().ok(),
                inode: std::os::unix::fs::MetadataExt::ino(&m),
            });
            let slot = seen.entry(remote).or_default();
            match part {
                Part::Snapshot => (slot.0.snapshot, slot.1) = (stamp, Some(path)),
                Part::Journal => (slot.0.journal, slot.2) = (stamp, Some(path)),
            }
        }
        let mut changed = false;
        for (remote, (stamps, snapshot, journal)) in &seen {
            if matches!(self.unsettled.get(remote), Some((None, _))) {
                self.unsettled.remove(remote); // Back after being gone for a moment.
            }
            if self.files.get(remote).is_some_and(|(s, _)| s == stamps)
                && !self.unsettled.contains_key(remote)
            {
                continue;
            }
            let read_at = SystemTime::now();
            match read_remote(remote, snapshot.as_deref(), journal.as_deref(), &mut errors) {
                Ok(records) => {
                    let held = self.files.get(remote);
                    let held_records = held.map_or(&[][..], |(_, r)| r.as_slice());
                    let snapshot_empty = stamps.snapshot.is_some_and(|s| s.len == 0);
                    if snapshot_empty && records.is_empty() && !held_records.is_empty() {
                        // Being written (the registry never writes an empty file): keep.
                        self.unsettled.remove(remote);
                        if self.empty.insert(remote.clone()) {
                            tracing::warn!(remote = %remote, "imports snapshot is empty; keeping its last good content (delete the remote's files to remove it)");
                        }
                        continue;
                    }
                    self.empty.remove(remote);
                    let rewritten = held.is_some_and(|(s, _)| s.snapshot != stamps.snapshot);
                    let takes_away = !held_records.iter().all(|h| records.contains(h));
                    if rewritten && takes_away && !self.settled(remote, Some(&records)) {
                        continue;
                    }
                    self.unsettled.remove(remote);
                    let slot = self.files.entry(remote.clone()).or_default();
                    changed |= slot.1 != records;
                    *slot = (stamps.read_at(read_at), records);
                }
                Err(e) => {
                    // Keep the last good records; remember the stamps so a broken file is
                    // reported once per version, not on every poll.
                    errors.push(e.to_string());
                    self.files.entry(remote.clone()).or_default().0 = *stamps;
                }
            }
        }
        // A remote whose files are gone is removed once they have been gone for `settle`.
        let gone: Vec<String> = self
            .files
            .keys()
            .filter(|remote| !seen.contains_key(*remote))
            .cloned()
            .collect();
        for remote in gone {
            if self.settled(&remote, None) {
                self.unsettled.remove(&remote);
                self.empty.remove(&remote);
                self.files.remove(&remote);
                changed = true;
            }
        }
        (changed, errors)
    }

    /// The records of every remote, by remote name.
    pub fn records(&self) -> BTreeMap<String, Vec<ServiceRecord>> {
        self.files
            .iter()
            .map(|(name, (_, records))| (name.clone(), records.clone()))
            .collect()
    }
}

enum Part {
    Snapshot,
    Journal,
}

/// `<remote>.yaml` / `.yml` (the snapshot) or `<remote>.journal`; the registry writes through
/// hidden temporary files, which never count.
fn remote_file(path: &Path) -> Option<(String, Part)> {
    let name = path.file_name()?.to_str()?;
    if name.starts_with('.') {
        return None;
    }
    for (suffix, part) in [
        (".yaml", Part::Snapshot),
        (".yml", Part::Snapshot),
        (".journal", Part::Journal),
    ] {
        if let Some(remote) = name.strip_suffix(suffix) {
            return Some((remote.to_string(), part));
        }
    }
    None
}

/// Why a remote's snapshot or journal could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Parse(#[from] resources::ResourceError),
}

/// A remote's imports: the snapshot's records, then the journal's changes replayed in order (as
/// the registry itself reads them at start-up). A snapshot that does not parse is an error; a
/// journal line that does not is skipped and reported in `errors` (a line torn by a crash).
fn read_remote(
    remote: &str,
    snapshot: Option<&Path>,
    journal: Option<&Path>,
    errors: &mut Vec<String>,
) -> Result<Vec<ServiceRecord>, ReadError> {
    let mut by_fqdn: BTreeMap<String, ServiceRecord> = BTreeMap::new();
    if let Some(path) = snapshot {
        let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let records =
            resources::parse_documents::<ServiceRecord>(&text, &path.display().to_string())?;
        by_fqdn.extend(records.into_iter().map(|r| (r.spec.fqdn.clone(), r)));
    }
    let Some(path) = journal else {
        return Ok(by_fqdn.into_values().collect());
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        // Compacted away between the listing and this read: the snapshot holds it all.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(source) => {
            return Err(ReadError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let namespace = by_fqdn.values().find_map(|r| r.metadata.namespace.clone());
    for (n, change) in import_journal::changes(&bytes) {
        match change {
            Ok(Change::Put(p)) => {
                let record = journal_record(remote, namespace.clone(), p);
                by_fqdn.insert(record.spec.fqdn.clone(), record);
            }
            Ok(Change::Del(fqdn)) => {
                by_fqdn.remove(&fqdn);
            }
            Err(e) => errors.push(format!("{} line {n}: {e}; skipped", path.display())),
        }
    }
    Ok(by_fqdn.into_values().collect())
}

/// The ServiceRecord a journal `put` stands for (named, labelled and given its origin as the
/// registry's snapshot holds an import).
fn journal_record(remote: &str, namespace: Option<String>, p: Put) -> ServiceRecord {
    let origin = match (
        p.cluster,
        p.annotations.get(ORIGIN_NAMESPACE_ANNOTATION),
        p.annotations.get(ORIGIN_NAME_ANNOTATION),
    ) {
        (Some(cluster), Some(namespace), Some(name)) => Some(crd::Origin {
            cluster: Some(cluster),
            namespace: namespace.clone(),
            name: name.clone(),
            kind: None,
        }),
        _ => None,
    };
    ServiceRecord {
        metadata: ObjectMeta {
            name: Some(imported_record_name(&p.fqdn, remote).unwrap_or_else(|_| p.fqdn.clone())),
            namespace,
            labels: Some(BTreeMap::from([
                (IMPORTED_LABEL.to_string(), String::new()),
                (REMOTE_REGISTRY_LABEL.to_string(), remote.to_string()),
            ])),
            annotations: Some(p.annotations),
            ..Default::default()
        },
        spec: crd::ServiceRecordSpec {
            origin,
            fqdn: p.fqdn,
            // Only the addresses are served (as A/AAAA answers); the ports are carried as read.
            endpoints: p
                .endpoints
                .into_iter()
                .map(|e| crd::Endpoint {
                    address: e.address,
                    port: i32::try_from(e.port).unwrap_or_default(),
                })
                .collect(),
            // Named ports (a hierarchy import's) give SRV records, as the snapshot's do.
            ports: (!p.ports.is_empty()).then_some(p.ports),
            ..Default::default()
        },
        status: None,
    }
}

/// Read `dir` once and publish it as the full Services listing.
pub fn load_once(dir: &mut ImportsDir, feed: &DnsFeed, first: bool) {
    let (changed, errors) = dir.rescan();
    for e in &errors {
        tracing::warn!(error = %e, "imports file not read; its last good content stays");
    }
    if !(changed || first) {
        return;
    }
    let (services, skipped) = services_from_records(&dir.records());
    for s in &skipped {
        tracing::warn!(
            file = %s.file,
            record = %s.record,
            reason = %s.reason,
            "imported record not served"
        );
    }
    tracing::info!(names = services.len(), "imports loaded");
    feed.reset_services(services);
}

/// Follow `dir` until `cancel` fires.
pub async fn run(dir: PathBuf, feed: DnsFeed, poll: Duration, cancel: CancellationToken) {
    if !dir.is_dir() {
        // Most likely a wrong path: a file-mode registry creates `<state-dir>/imports` itself.
        match std::fs::create_dir_all(&dir) {
            Ok(()) => tracing::warn!(
                dir = %dir.display(),
                "--imports-dir did not exist; created it empty, so no names are served until a registry writes there (it should be the registry's <state-dir>/imports)"
            ),
            Err(e) => tracing::error!(
                dir = %dir.display(),
                error = %e,
                "--imports-dir does not exist and cannot be created; no names are served (give the registry's <state-dir>/imports)"
            ),
        }
    }
    // One pending wake-up is enough: every wake-up re-scans the whole directory.
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok_and(|ev| !matches!(ev.kind, notify::EventKind::Access(_))) {
            let _ = tx.try_send(());
        }
    })
    .and_then(|mut w| {
        w.watch(&dir, notify::RecursiveMode::NonRecursive)
            .map(|()| w)
    });
    let _watcher = match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "no filesystem events; polling only");
            None
        }
    };
    let mut state = ImportsDir::new(dir);
    load_once(&mut state, &feed, true);
    let mut tick = tokio::time::interval(poll);
    tick.tick().await;
    loop {
        let due = state.next_due();
        tokio::select! {
            _ = cancel.cancelled() => return,
            Some(()) = rx.recv() => {}
            _ = tick.tick() => {}
            // A change waiting to settle is looked at again when due.
            _ = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        load_once(&mut state, &feed, false);
    }
}

#[cfg(test)]
#[path = "imports_feed_tests.rs"]
mod tests;
