//! The imports feed: `xcc dns` without Kubernetes, serving what a file-mode registry imported.
//!
//! `xcc registry --store file` writes each remote's imports to `<state-dir>/imports/<remote>.yaml`
//! (ServiceRecords, replaced atomically). This feed watches that directory (filesystem events,
//! plus a slow poll for filesystems that deliver none), parses each changed file with
//! [`xcc_proto::resources`], and hands the index a full Services listing built by the pure
//! [`services_from_records`]: one name per imported FQDN with the endpoint addresses as its A /
//! AAAA records (there is no cluster IP without Kubernetes), and the MCS name
//! `<origin-name>.<origin-namespace>.svc.clusterset.local` when the record carries the origin
//! annotations.
//!
//! A file that does not parse is reported with its name and the last good content of that file
//! stays served, so a half-edited file never empties the zone. A removed file removes its names.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use notify::Watcher as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::names::{FQDN_ANNOTATION, canonical_fqdn};
use xcc_proto::resources::{self, ServiceRecord};

use super::index::DnsFeed;
use super::zone::{NamedPort, PortProtocol, ServiceInfo, ServiceKey};

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
/// (one service imported from two remotes) merge: their addresses are unioned, and the first
/// record in file order gives the key and the origin.
pub fn services_from_records(
    files: &BTreeMap<String, Vec<ServiceRecord>>,
) -> (Vec<ServiceInfo>, Vec<Skipped>) {
    let mut by_fqdn: BTreeMap<String, ServiceInfo> = BTreeMap::new();
    let mut addresses: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    let mut skipped = Vec::new();
    for (file, records) in files {
        for sr in records {
            let skip = |reason: String| Skipped {
                file: file.clone(),
                record: format!(
                    "{}/{}",
                    sr.metadata.namespace.as_deref().unwrap_or(""),
                    sr.metadata.name
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
            addresses.entry(fqdn.clone()).or_default().extend(ips);
            let info = by_fqdn.entry(fqdn.clone()).or_insert_with(|| ServiceInfo {
                key: ServiceKey::new(
                    sr.metadata.namespace.clone().unwrap_or_default(),
                    sr.metadata.name.clone(),
                ),
                annotations: origin_annotations(sr),
                cluster_ips: Vec::new(),
                ports: Vec::new(),
            });
            info.annotations
                .insert(FQDN_ANNOTATION.to_string(), fqdn.clone());
            for p in sr.spec.ports.iter().flatten() {
                if let Some(port) = named_port(p)
                    && !info.ports.contains(&port)
                {
                    info.ports.push(port);
                }
            }
        }
    }
    let services = by_fqdn
        .into_iter()
        .map(|(fqdn, mut info)| {
            info.cluster_ips = addresses
                .remove(&fqdn)
                .unwrap_or_default()
                .into_iter()
                .collect();
            info
        })
        .collect();
    (services, skipped)
}

/// The origin annotations, only as a pair (one alone names nothing).
fn origin_annotations(sr: &ServiceRecord) -> BTreeMap<String, String> {
    let a = &sr.metadata.annotations;
    match (
        a.get(ORIGIN_NAMESPACE_ANNOTATION),
        a.get(ORIGIN_NAME_ANNOTATION),
    ) {
        (Some(ns), Some(name)) => BTreeMap::from([
            (ORIGIN_NAMESPACE_ANNOTATION.to_string(), ns.clone()),
            (ORIGIN_NAME_ANNOTATION.to_string(), name.clone()),
        ]),
        _ => BTreeMap::new(),
    }
}

fn named_port(p: &resources::ServicePort) -> Option<NamedPort> {
    let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
        "TCP" => PortProtocol::Tcp,
        "UDP" => PortProtocol::Udp,
        "SCTP" => PortProtocol::Sctp,
        _ => return None,
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

/// The directory's files as last read: stamp and last good records of each.
#[derive(Debug, Default)]
pub struct ImportsDir {
    dir: PathBuf,
    files: BTreeMap<String, (Option<Stamp>, Vec<ServiceRecord>)>,
}

impl ImportsDir {
    /// A reader of `dir` that has read nothing yet.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
        }
    }

    /// Re-read changed `*.yaml` files and forget removed ones. Returns whether anything changed,
    /// and one message per file that could not be read (its last good content stays).
    pub fn rescan(&mut self) -> (bool, Vec<String>) {
        let mut errors = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                errors.push(format!("cannot list {}: {e}", self.dir.display()));
                return (false, errors);
            }
        };
        let mut seen = BTreeSet::new();
        let mut changed = false;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = yaml_name(&path) else {
                continue;
            };
            seen.insert(name.clone());
            let stamp = entry.metadata().ok().map(|m| Stamp {
                len: m.len(),
                modified: m.modified().ok(),
                inode: std::os::unix::fs::MetadataExt::ino(&m),
            });
            if stamp.is_some() && self.files.get(&name).is_some_and(|(s, _)| *s == stamp) {
                continue;
            }
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| {
                    resources::parse_documents::<ServiceRecord>(&text, &path.display().to_string())
                        .map_err(|e| e.to_string())
                });
            match parsed {
                Ok(records) => {
                    let slot = self.files.entry(name).or_default();
                    changed |= slot.1 != records;
                    *slot = (stamp, records);
                }
                Err(e) => {
                    // Keep the last good records; remember the stamp so a broken file is
                    // reported once per version, not on every poll.
                    errors.push(e);
                    self.files.entry(name).or_default().0 = stamp;
                }
            }
        }
        let before = self.files.len();
        self.files.retain(|name, _| seen.contains(name));
        changed |= self.files.len() != before;
        (changed, errors)
    }

    /// The records of every file, by file name.
    pub fn records(&self) -> BTreeMap<String, Vec<ServiceRecord>> {
        self.files
            .iter()
            .map(|(name, (_, records))| (name.clone(), records.clone()))
            .collect()
    }
}

fn yaml_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    // The registry writes through hidden temporary files; only finished `*.yaml` count.
    (!name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml")))
        .then(|| name.to_string())
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
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot create the imports directory");
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
        tokio::select! {
            _ = cancel.cancelled() => return,
            Some(()) = rx.recv() => {}
            _ = tick.tick() => {}
        }
        load_once(&mut state, &feed, false);
    }
}

#[cfg(test)]
#[path = "imports_feed_tests.rs"]
mod tests;
