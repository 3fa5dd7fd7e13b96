//! Name ownership that survives a restart. A level holds each name (FQDN and `namespace/name`)
//! of its children's services for the service that holds it first; while its owner is away the
//! name is reserved (`State::reserved`), for at most the configured hold
//! (`--name-hold-hours`). Both would be lost when the registry restarts, and the first child to
//! reconnect could take any name. So the level keeps a ledger of every name its children's
//! services hold or have reserved in an [`OwnerStore`] (a file in the state directory, or a
//! ConfigMap), reads it back as reservations before the first child attaches, and appends what
//! changed (at most once per [`PACE`], and once more on shutdown). The ledger is a log: a line
//! per change, replayed in order; it is rewritten whole (compacted) only when it has grown to
//! twice what it describes. A reservation read back is released exactly like one made in memory:
//! when the owner announces the service again, withdraws it, finishes a snapshot without it, or
//! the hold is over.
//!
//! A ledger that cannot be read whole (empty: xcc always writes a header; cut short in a line;
//! a line that does not parse) could have held any name, so the registry refuses to start on
//! it ([`LedgerError`]) rather than hand names to whoever claims them first.
//!
//! Clash notices for an owner that is away are kept (a few per cluster) and delivered when a
//! child carrying it attaches, so the owner learns of a claim refused while it was down.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use tokio::sync::broadcast::error::TryRecvError;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use xcc_proto::names::{canonical_fqdn, is_dns1123_label, is_dns1123_subdomain};
use xcc_proto::xcc::federation::v1 as fed;

use super::reservations::unix_now;
use super::{Level, State};
use crate::catalog::{CatalogEvent, ListFilter, ServiceEntry, ServiceKey, Source};

/// The shortest time between two writes of the ledger.
pub const PACE: Duration = Duration::from_secs(1);

/// The ledger's file under the state directory (file store).
pub const OWNERS_FILE: &str = "name-owners";

/// The ConfigMap holding the ledger (kube store): the compacted ledger under [`OWNERS_KEY`],
/// each later append under its own key `log-<sequence>`.
pub const OWNERS_CONFIGMAP: &str = "xcc-name-owners";
const OWNERS_KEY: &str = "owners";

/// What the kube ledger may take of a ConfigMap (the API refuses one over 1 MiB).
pub const CONFIGMAP_BUDGET: usize = 1000 * 1000;
/// Appends kept as separate ConfigMap keys before the ledger is compacted into one.
const CONFIGMAP_LOG_KEYS: usize = 128;

/// How many clash notices are kept per absent owner cluster.
const HELD_NOTICES: usize = 16;

/// Lines the log may carry beyond twice what it describes before it is compacted.
const COMPACT_SLACK: usize = 1024;

/// The first line of every ledger xcc writes (format 2: a log of changes).
pub(super) const HEADER: &str =
    "# xcc name owners v2: + <name> <cluster> <namespace> <service> <held-since|-> / - <name>";
/// Format 1 (one line per name, rewritten whole), still read.
const HEADER_V1: &str = "# xcc name owners v1: <name> <cluster> <namespace> <service>";

/// A ledger that cannot be read whole. The registry does not start on it: any name could be
/// one it held.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LedgerError {
    #[error(
        "the name-owner ledger {place} is empty (xcc always writes a header line), so it is damaged and could have held any name; refusing to start rather than hand names to whoever claims them first. Restore it, or remove it to free every name it held, and start again"
    )]
    Empty { place: String },
    #[error(
        "the name-owner ledger {place} is cut short in line {line} (no line end), so it is damaged and could have held more names; refusing to start rather than hand names to whoever claims them first. Restore it, or complete or drop that line (or remove the ledger to free every name), and start again"
    )]
    Truncated { place: String, line: usize },
    #[error(
        "the name-owner ledger {place} cannot be read: line {line}: {reason}; it could have held any name, so refusing to start rather than hand names to whoever claims them first. Restore it, or correct that line (or remove the ledger to free every name), and start again"
    )]
    Unparsable {
        place: String,
        line: usize,
        reason: String,
    },
}

/// Where a level's ledger lives: a log, read whole at start, appended to, and now and then
/// replaced whole by its compaction.
pub trait OwnerStore: Send + Sync + 'static {
    /// What an operator is told the ledger is ("file /var/lib/xcc/name-owners").
    fn place(&self) -> String;
    /// The stored ledger, `None` when there is none yet.
    fn load(&self) -> BoxFuture<'_, anyhow::Result<Option<String>>>;
    /// Add `text` (whole lines) at the end.
    fn append(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>>;
    /// Replace the ledger with `text` (a header and whole lines).
    fn replace(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>>;
    /// The store wants the next write to be a compaction (e.g. it is running out of room).
    fn wants_compaction(&self) -> bool {
        false
    }
}

/// `<state-dir>/name-owners`: appended to (and synced), replaced atomically on compaction.
pub struct FileOwners {
    dir: PathBuf,
    path: PathBuf,
}

impl FileOwners {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.to_path_buf(),
            path: state_dir.join(OWNERS_FILE),
        }
    }
}

impl OwnerStore for FileOwners {
    fn place(&self) -> String {
        format!("file {}", self.path.display())
    }

    fn load(&self) -> BoxFuture<'_, anyhow::Result<Option<String>>> {
        Box::pin(async move {
            match tokio::fs::read(&self.path).await {
                // Not UTF-8 is for `parse` to report, like any other garbage.
                Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(anyhow::anyhow!("reading {}: {e}", self.path.display())),
            }
        })
    }

    fn append(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let path = self.path.clone();
            tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                // One write of whole lines: a crash leaves at most the last line cut short,
                // which the next start reports (`LedgerError::Truncated`).
                let mut f = std::fs::OpenOptions::new().append(true).open(&path)?;
                f.write_all(text.as_bytes())?;
                f.sync_data()?;
                Ok(())
            })
            .await?
        })
    }

    fn replace(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let (dir, path) = (self.dir.clone(), self.path.clone());
            tokio::task::spawn_blocking(move || {
                crate::files::write_atomic(&dir, &path, text.as_bytes())
            })
            .await?
        })
    }
}

/// The ConfigMap [`OWNERS_CONFIGMAP`] in the registry's namespace. A ConfigMap cannot be
/// appended to, so each append is a new key (`log-<sequence>`, a JSON merge patch carrying
/// only that key); compaction writes the whole ledger under `owners` and deletes the log
/// keys in the same patch. The whole stays within [`CONFIGMAP_BUDGET`] bytes: an append that
/// would pass it asks for a compaction, and a compacted ledger over it is not written (an
/// error, logged on each try; the file store has no such bound).
pub struct ConfigMapOwners {
    api: kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
    namespace: String,
    /// The log keys written so far, the next sequence number and the bytes stored.
    log: Mutex<ConfigMapLog>,
}

#[derive(Default)]
struct ConfigMapLog {
    keys: Vec<String>,
    next: u64,
    bytes: usize,
}

impl ConfigMapOwners {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            api: kube::Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            log: Mutex::default(),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, ConfigMapLog> {
        xcc_controller::plumbing::lock(&self.log)
    }

    /// Merge `data` into the ConfigMap (`null` deletes a key), creating it if it is missing.
    async fn patch(&self, data: serde_json::Map<String, serde_json::Value>) -> anyhow::Result<()> {
        let patch = serde_json::json!({ "data": data });
        match self
            .api
            .patch(
                OWNERS_CONFIGMAP,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if xcc_controller::plumbing::is_not_found(&e) => {
                let data = data
                    .into_iter()
                    .filter_map(|(k, v)| Some((k, v.as_str()?.to_string())))
                    .collect();
                let cm = k8s_openapi::api::core::v1::ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(OWNERS_CONFIGMAP.into()),
                        labels: Some(
                            [(
                                "app.kubernetes.io/managed-by".to_string(),
                                "xcc-registry".to_string(),
                            )]
                            .into(),
                        ),
                        ..Default::default()
                    },
                    data: Some(data),
                    ..Default::default()
                };
                self.api
                    .create(&kube::api::PostParams::default(), &cm)
                    .await?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn log_key(n: u64) -> String {
    format!("log-{n:010}")
}

impl OwnerStore for ConfigMapOwners {
    fn place(&self) -> String {
        format!(
            "ConfigMap {}/{OWNERS_CONFIGMAP} (keys {OWNERS_KEY} and log-*)",
            self.namespace
        )
    }

    fn load(&self) -> BoxFuture<'_, anyhow::Result<Option<String>>> {
        Box::pin(async move {
            let Some(data) = self
                .api
                .get_opt(OWNERS_CONFIGMAP)
                .await?
                .and_then(|cm| cm.data)
            else {
                return Ok(None);
            };
            // The base, then the appends in order (the keys sort by sequence).
            let mut text = data.get(OWNERS_KEY).cloned().unwrap_or_default();
            let mut log = ConfigMapLog::default();
            for (k, v) in data.range("log-".to_string()..) {
                let Some(n) = k.strip_prefix("log-") else {
                    break;
                };
                if let Ok(n) = n.parse::<u64>() {
                    log.next = log.next.max(n + 1);
                }
                log.keys.push(k.clone());
                text.push_str(v);
            }
            log.bytes = text.len();
            *self.log() = log;
            Ok(Some(text))
        })
    }

    fn append(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let key = {
                let log = self.log();
                if log.bytes + text.len() > CONFIGMAP_BUDGET {
                    anyhow::bail!(
                        "the ConfigMap {OWNERS_CONFIGMAP} would pass {CONFIGMAP_BUDGET} bytes; compacting it"
                    );
                }
                log_key(log.next)
            };
            let len = text.len();
            self.patch([(key.clone(), text.into())].into_iter().collect())
                .await?;
            let mut log = self.log();
            log.keys.push(key);
            log.next += 1;
            log.bytes += len;
            Ok(())
        })
    }

    fn replace(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            if text.len() > CONFIGMAP_BUDGET {
                anyhow::bail!(
                    "the name-owner ledger needs {} bytes, more than the {CONFIGMAP_BUDGET} a ConfigMap holds; names held since the last write that fitted are not kept across a restart (the file store has no such bound)",
                    text.len()
                );
            }
            let keys = self.log().keys.clone();
            let mut data: serde_json::Map<String, serde_json::Value> = keys
                .iter()
                .map(|k| (k.clone(), serde_json::Value::Null))
                .collect();
            let len = text.len();
            data.insert(OWNERS_KEY.into(), text.into());
            self.patch(data).await?;
            let mut log = self.log();
            log.keys.retain(|k| !keys.contains(k));
            log.bytes = len;
            Ok(())
        })
    }

    fn wants_compaction(&self) -> bool {
        self.log().keys.len() >= CONFIGMAP_LOG_KEYS
    }
}

/// What the ledger says of a name: its owner, and since when it is held for it (Unix
/// seconds), `None` while the owner is present.
pub(super) type Holding = (ServiceKey, Option<u64>);

/// A ledger read back: each name's last holding, and how many lines the log has.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Ledger {
    pub(super) names: HashMap<Arc<str>, Holding>,
    pub(super) lines: usize,
    /// Format 1: rewritten in format 2 before anything is appended.
    v1: bool,
}

fn render_line(out: &mut String, name: &str, holding: Option<&Holding>) {
    use std::fmt::Write as _;
    let _ = match holding {
        Some((k, since)) => writeln!(
            out,
            "+ {name} {} {} {} {}",
            k.cluster,
            k.namespace,
            k.name,
            since.map_or("-".to_string(), |s| s.to_string())
        ),
        None => writeln!(out, "- {name}"),
    };
}

/// A compacted ledger: the header and one line per name, sorted.
fn render(names: &HashMap<Arc<str>, Holding>) -> String {
    let mut sorted: Vec<_> = names.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut text = String::with_capacity(64 * (sorted.len() + 1));
    text.push_str(HEADER);
    text.push('\n');
    for (name, holding) in sorted {
        render_line(&mut text, name, Some(holding));
    }
    text
}

/// Read a ledger back, all or nothing: the file or ConfigMap is input like any other, and one
/// that cannot be read whole is reported (see [`LedgerError`]), never half used.
pub(super) fn parse(text: &str, place: &str) -> Result<Ledger, LedgerError> {
    let place = place.to_string();
    if text.is_empty() {
        return Err(LedgerError::Empty { place });
    }
    if !text.ends_with('\n') {
        return Err(LedgerError::Truncated {
            place,
            line: text.lines().count(),
        });
    }
    let bad = |line: usize, reason: &str| LedgerError::Unparsable {
        place: place.clone(),
        line,
        reason: reason.to_string(),
    };
    let mut lines = text.split_terminator('\n');
    let v1 = match lines.next() {
        Some(HEADER) => false,
        Some(HEADER_V1) => true,
        _ => return Err(bad(1, "not an xcc name-owner ledger header")),
    };
    let mut ledger = Ledger {
        v1,
        ..Default::default()
    };
    for (n, line) in lines.enumerate() {
        let n = n + 2;
        if line.is_empty() {
            continue;
        }
        ledger.lines += 1;
        if v1 {
            let (name, key) = parse_v1_line(line)
                .ok_or_else(|| bad(n, "not `<name> <cluster> <namespace> <service>`"))?;
            ledger.names.insert(name.into(), (key, None));
            continue;
        }
        match line.split_once(' ') {
            Some(("+", rest)) => {
                let (name, holding) = parse_hold(rest).ok_or_else(|| {
                    bad(
                        n,
                        "not `+ <name> <cluster> <namespace> <service> <held-since|->` with valid names",
                    )
                })?;
                ledger.names.insert(name.into(), holding);
            }
            Some(("-", name)) if valid_name(name) => {
                ledger.names.remove(name);
            }
            _ => {
                return Err(bad(
                    n,
                    "neither `+ <name> ...` nor `- <name>` with a valid name",
                ));
            }
        }
    }
    Ok(ledger)
}

/// A held name: an FQDN as xcc writes it, or `namespace/name`.
fn valid_name(name: &str) -> bool {
    match name.split_once('/') {
        Some((ns, n)) => is_dns1123_label(ns) && is_dns1123_subdomain(n),
        None => canonical_fqdn(name).is_ok_and(|f| f == name),
    }
}

/// An owner key as an announcement is held to (`convert::entry_from_announcement`).
fn owner_key(cluster: &str, namespace: &str, service: &str) -> Option<ServiceKey> {
    (is_dns1123_label(cluster) && is_dns1123_label(namespace) && is_dns1123_subdomain(service))
        .then(|| ServiceKey::new(cluster, namespace, service))
}

fn parse_hold(rest: &str) -> Option<(&str, Holding)> {
    let f: Vec<&str> = rest.split(' ').collect();
    let [name, cluster, namespace, service, since] = f[..] else {
        return None;
    };
    let since = match since {
        "-" => None,
        s if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => Some(s.parse().ok()?),
        _ => return None,
    };
    valid_name(name).then_some(())?;
    Some((name, (owner_key(cluster, namespace, service)?, since)))
}

fn parse_v1_line(line: &str) -> Option<(&str, ServiceKey)> {
    let f: Vec<&str> = line.split(' ').collect();
    let [name, cluster, namespace, service] = f[..] else {
        return None;
    };
    valid_name(name).then_some(())?;
    Some((name, owner_key(cluster, namespace, service)?))
}

/// What `xcc admin tree` shows of the names held for owners that are away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldNames {
    pub names: u64,
    pub oldest_since: Option<SystemTime>,
    /// When the oldest expires; `None` when nothing is held or names are held until their
    /// owner is back.
    pub oldest_expires: Option<SystemTime>,
    /// Zero: held until the owner is back.
    pub hold: Duration,
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

impl Level {
    /// How long a name stays held for an owner that is away (zero: until it is back).
    pub fn set_name_hold(&self, hold: Duration) {
        self.lock().reserved.set_hold(hold);
    }

    /// The names held for owners that are away (expired ones freed first).
    pub fn held_names(&self) -> HeldNames {
        let mut st = self.lock();
        self.expire_locked(&mut st);
        HeldNames {
            names: st.reserved.len() as u64,
            oldest_since: st.reserved.oldest().map(at),
            oldest_expires: st.reserved.next_expiry().map(at),
            hold: st.reserved.hold(),
        }
    }

    /// Free the names whose hold is over.
    pub(super) fn expire_locked(&self, st: &mut State) {
        for key in st.reserved.expire(unix_now()) {
            info!(owner = %key, hold_secs = st.reserved.hold().as_secs(), "names held for an owner that stayed away longer than the hold are free again");
        }
    }

    /// A present service of a child's subtree holding `name`.
    fn present_holder(&self, name: &str) -> Option<ServiceKey> {
        let child = |e: &Arc<ServiceEntry>| matches!(e.source, Source::Child(_));
        let found = match name.split_once('/') {
            Some((ns, n)) => self.inner.catalog.by_name(ns, n),
            None => self.inner.catalog.by_fqdn(name),
        };
        found
            .into_iter()
            .filter(|e| child(e) && (name.contains('/') || e.fqdn.as_str() == name))
            .map(|e| e.key.clone())
            .min()
    }

    /// What the ledger should say of `name` now.
    fn holding_now(&self, name: &str) -> Option<Holding> {
        if let Some((key, since)) = self.lock().reserved.holding(name) {
            return Some((key.clone(), Some(since)));
        }
        self.present_holder(name).map(|k| (k, None))
    }

    /// Every name held here for a service of the children's subtrees, present or reserved.
    fn owned_names(&self) -> HashMap<Arc<str>, Holding> {
        let mut out: HashMap<Arc<str>, Holding> = HashMap::new();
        for e in self.inner.catalog.list(&ListFilter::default()) {
            if matches!(e.source, Source::Child(_)) {
                out.insert(e.fqdn.as_str().into(), (e.key.clone(), None));
                out.insert(
                    format!("{}/{}", e.key.namespace, e.key.name).into(),
                    (e.key.clone(), None),
                );
            }
        }
        let st = self.lock();
        for (name, key, since) in st.reserved.iter() {
            out.insert(name.clone(), (key.clone(), Some(since)));
        }
        out
    }

    /// Read the ledger back as reservations (call it before any child can attach); the
    /// returned task appends every change to the ledger until `cancel`, with a last write on
    /// the way out. A damaged ledger is an error ([`LedgerError`], logged): the registry must
    /// not start on it.
    pub async fn keep_owners(
        &self,
        store: Arc<dyn OwnerStore>,
        cancel: CancellationToken,
    ) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
        let loaded = store.load().await?;
        let ledger = match &loaded {
            None => Ledger::default(),
            Some(text) => parse(text, &store.place()).inspect_err(|e| {
                error!(error = %e, "the name-owner ledger is damaged; not starting");
            })?,
        };
        if !ledger.names.is_empty() {
            info!(
                names = ledger.names.len(),
                "names held for their owners since before the restart"
            );
        }
        // Names whose owner was present are held from now on.
        let now = unix_now();
        {
            let mut st = self.lock();
            st.reserved.track_changes();
            for (name, (key, since)) in &ledger.names {
                st.reserved
                    .insert(name.clone(), key.clone(), since.unwrap_or(now));
            }
            self.expire_locked(&mut st);
        }
        let level = self.clone();
        let mut events = level.inner.catalog.subscribe();
        let mut changes = level.subscribe();
        Ok(async move {
            let mut writer = Writer {
                store,
                must_replace: loaded.is_none() || ledger.v1,
                log_lines: ledger.lines,
                written: ledger.names,
                dirty: HashSet::new(),
                resync: true,
            };
            loop {
                // Cancelled before this pass: it is the last, and it sees every change made
                // up to the cancellation (one made during a write is taken by the next pass).
                let last = cancel.is_cancelled();
                writer.collect(&level, &mut events);
                writer.write(&level).await;
                if last {
                    break;
                }
                tokio::select! {
                    _ = cancel.cancelled() => continue,
                    r = changes.changed() => if r.is_err() { break },
                    ev = events.recv() => writer.note(ev),
                }
                // Gather what else changes for a while, so a burst is one write.
                let pace = tokio::time::sleep(PACE);
                tokio::pin!(pace);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = &mut pace => break,
                        ev = events.recv() => writer.note(ev),
                    }
                }
            }
        })
    }

    /// A clash notice for an owner that is not connected: kept until a child carrying the
    /// owner's cluster attaches.
    pub(super) fn hold_clash(&self, n: fed::NameClash) {
        let mut st = self.lock();
        // Only for a cluster a name is held for here (which bounds what is kept).
        if !st.reserved.holds_cluster(&n.owner_cluster) {
            return;
        }
        let held = st.held_clashes.entry(n.owner_cluster.clone()).or_default();
        if held.len() >= HELD_NOTICES {
            held.remove(0);
        }
        held.push(n);
    }

    /// Deliver the notices kept for the clusters `child` now carries.
    pub(super) fn deliver_held_clashes(&self, child: &str) {
        let mut st = self.lock();
        let Some(carried) = st.tree.children().get(child).cloned() else {
            return;
        };
        let Some(link) = st.sessions.get(child).map(|s| s.link.clone()) else {
            return;
        };
        for cluster in carried {
            for n in st.held_clashes.remove(&cluster).unwrap_or_default() {
                self.down(&link, fed::parent_message::Payload::NameClash(n));
            }
        }
    }
}

/// The ledger task's state: what the log says now, and what changed since.
struct Writer {
    store: Arc<dyn OwnerStore>,
    /// The next write must be a whole ledger (there is none yet, it is in format 1, or an
    /// append failed and the log may lack lines).
    must_replace: bool,
    /// Lines in the log (what a compaction would shrink).
    log_lines: usize,
    /// What the log says of each name.
    written: HashMap<Arc<str>, Holding>,
    /// Names that may have changed.
    dirty: HashSet<Arc<str>>,
    /// Compare every name (at start, and when the catalog feed was missed).
    resync: bool,
}

impl Writer {
    fn note(&mut self, ev: Result<CatalogEvent, tokio::sync::broadcast::error::RecvError>) {
        match ev {
            Ok(CatalogEvent::Upsert(e) | CatalogEvent::Delete(e)) => {
                if matches!(e.source, Source::Child(_)) {
                    self.dirty.insert(e.fqdn.as_str().into());
                    self.dirty
                        .insert(format!("{}/{}", e.key.namespace, e.key.name).into());
                }
            }
            // Changes were missed: compare everything once.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => self.resync = true,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {}
        }
    }

    fn collect(
        &mut self,
        level: &Level,
        events: &mut tokio::sync::broadcast::Receiver<CatalogEvent>,
    ) {
        loop {
            match events.try_recv() {
                Ok(ev) => self.note(Ok(ev)),
                Err(TryRecvError::Lagged(_)) => self.resync = true,
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        let changed = level.lock().reserved.take_changed();
        self.dirty.extend(changed);
    }

    /// Append what changed (or compact), at most one store write.
    async fn write(&mut self, level: &Level) {
        let mut delta = String::new();
        let mut lines = 0;
        if self.resync {
            self.resync = false;
            self.dirty.clear();
            let now = level.owned_names();
            for (name, holding) in &now {
                if self.written.get(name) != Some(holding) {
                    render_line(&mut delta, name, Some(holding));
                    lines += 1;
                }
            }
            for name in self.written.keys() {
                if !now.contains_key(name) {
                    render_line(&mut delta, name, None);
                    lines += 1;
                }
            }
            self.written = now;
        } else {
            for name in std::mem::take(&mut self.dirty) {
                let holding = level.holding_now(&name);
                if self.written.get(&name) != holding.as_ref() {
                    render_line(&mut delta, &name, holding.as_ref());
                    lines += 1;
                    match holding {
                        Some(h) => self.written.insert(name, h),
                        None => self.written.remove(&name),
                    };
                }
            }
        }
        let compact = self.must_replace
            || self.store.wants_compaction()
            || self.log_lines + lines > 2 * self.written.len() + COMPACT_SLACK;
        if compact {
            let text = render(&self.written);
            match self.store.replace(text).await {
                Ok(()) => {
                    self.must_replace = false;
                    self.log_lines = self.written.len();
                }
                Err(e) => {
                    self.must_replace = true;
                    warn!(error = %format!("{e:#}"), "cannot write the name-owner ledger; trying again on the next change");
                }
            }
        } else if lines > 0 {
            match self.store.append(delta).await {
                Ok(()) => self.log_lines += lines,
                Err(e) => {
                    // The log may now lack these lines: write it whole next time.
                    self.must_replace = true;
                    warn!(error = %format!("{e:#}"), "cannot append to the name-owner ledger; rewriting it on the next change");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(c: &str, n: &str) -> ServiceKey {
        ServiceKey::new(c, "shop", n)
    }

    #[test]
    fn the_ledger_replays_its_log_and_reads_back_what_it_wrote() {
        let names: HashMap<Arc<str>, Holding> = [
            (
                "api.shop.svc.clusterset.local".into(),
                (k("c2", "api"), None),
            ),
            ("shop/api".into(), (k("c2", "api"), Some(1_700_000_000))),
            ("shop/v1.api".into(), (k("c2", "v1.api"), None)),
        ]
        .into_iter()
        .collect();
        let text = render(&names);
        let read = parse(&text, "test").expect("valid");
        assert_eq!((read.names, read.lines, read.v1), (names.clone(), 3, false));

        let log = format!("{text}- shop/api\n+ shop/web c3 shop web 12\n\n- nothing.example\n");
        let read = parse(&log, "test").expect("valid");
        let mut expected = names;
        expected.remove("shop/api");
        expected.insert("shop/web".into(), (k("c3", "web"), Some(12)));
        assert_eq!((read.names, read.lines), (expected, 6));

        let v1 = format!("{HEADER_V1}\nshop/api c2 shop api\n");
        let read = parse(&v1, "test").expect("format 1");
        assert!(read.v1);
        assert_eq!(read.names.get("shop/api"), Some(&(k("c2", "api"), None)));
    }

    /// Each kind of damage is refused whole, with where and what.
    #[test]
    fn a_damaged_ledger_is_refused_whole() {
        let place = "file /state/name-owners";
        assert_eq!(
            parse("", place),
            Err(LedgerError::Empty {
                place: place.into()
            })
        );
        let good = format!("{HEADER}\n+ shop/api c2 shop api -\n");
        assert_eq!(
            parse(&format!("{good}+ shop/web c3 sh"), place),
            Err(LedgerError::Truncated {
                place: place.into(),
                line: 3
            })
        );
        assert_eq!(
            parse(HEADER, place),
            Err(LedgerError::Truncated {
                place: place.into(),
                line: 1
            })
        );
        let unparsable = |text: &str| match parse(text, place) {
            Err(LedgerError::Unparsable { line, .. }) => line,
            other => panic!("{text:?}: {other:?}"),
        };
        assert_eq!(unparsable("\u{0}\u{7}garbage\n"), 1);
        assert_eq!(unparsable("shop/api c2 shop api\n"), 1);
        for bad in [
            "+ ../x c2 shop api -",
            "+ shop/api ../c2 shop api -",
            "+ API.example c2 shop api -",
            "+ a.b c2 shop api - extra",
            "+ shop/api c2 shop -",
            "+ shop/x c2 Shop x -",
            "+ shop/x c2 shop x 12x",
            "+ shop/x c2 shop x",
            "- ../x",
            "* shop/x",
            "shop/x c2 shop x",
        ] {
            assert_eq!(unparsable(&format!("{good}{bad}\n")), 3, "{bad}");
        }
        assert_eq!(
            unparsable(&format!("{HEADER_V1}\n+ shop/x c2 shop x -\n")),
            2
        );
        let e = parse("", "file /state/name-owners").expect_err("empty");
        assert_eq!(
            e.to_string(),
            "the name-owner ledger file /state/name-owners is empty (xcc always writes a header line), so it is damaged and could have held any name; refusing to start rather than hand names to whoever claims them first. Restore it, or remove it to free every name it held, and start again"
        );
    }
}
