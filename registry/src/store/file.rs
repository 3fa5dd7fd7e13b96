//! The file store: a registry without Kubernetes.
//!
//! ```text
//! <state-dir>/exports/*.yaml   ServiceRecords to export (written by the operator; watched)
//! <state-dir>/remotes/*.yaml   RemoteRegistries to import from (written by the operator; watched)
//! <state-dir>/imports/<remote>.yaml   imported ServiceRecords (written by xcc, atomically)
//! <state-dir>/imports/<remote>.journal   changes since that file was written ([`imports`])
//! <state-dir>/name-owners   names held for the children's services (written by xcc, atomically;
//!                           `federation::level::owners`)
//! ```
//!
//! Files are re-read when they change (filesystem events, plus a periodic poll for filesystems
//! that deliver none). Each file is parsed and validated on its own: a malformed file is reported
//! with its name and the offending field, and the last good content of that file stays in force,
//! so a typo never wipes state.
//!
//! No way of writing a file drops what it held on the way ([`YamlDir`]): a file that reads as
//! empty keeps its last good content (only deleting it removes), and a change that takes
//! anything away from a file (a record removed or changed, the file rejected or gone) is applied
//! only once the file has read the same for [`SETTLE`]. An in-place rewrite (`cat > f`, which
//! empties the file first), a write caught half-way, an editor's rename over the file, a
//! `kubectl cp` (unlink, then create) or a ConfigMap volume's symlink swap therefore never remove
//! anything for a moment; a change that only adds is applied at once, and so is any change to a
//! file that was renamed into place after it was finished ([`Stamp::renamed_after_write`]:
//! nothing distinguishes a half-written file by its content, but its times do).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use notify::Watcher as _;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use xcc_proto::crd::{self, ServiceRecord};
use xcc_proto::{names, resources};

use crate::catalog::{Catalog, ServiceEntry, ServiceKey, Source};
use crate::hamlet::convert::Imported;
use crate::store::model::{
    ImportedRecordError, export_entry, imported_endpoints, imported_origin, imported_ports,
    namespace_name,
};

mod imports;
pub use crate::files::FileErrors;
pub use imports::FileImportSink;

pub const EXPORTS_DIR: &str = "exports";
pub const REMOTES_DIR: &str = "remotes";
pub const IMPORTS_DIR: &str = "imports";

/// The imported ServiceRecord as XCC names and labels it, with the canonical FQDN (lowercase, no
/// trailing dot) in `spec.fqdn` and the origin the exporter sent ([`imported_origin`]), as the
/// Kubernetes store writes it.
pub fn imported_record(
    remote: &str,
    namespace: &str,
    imported: &Imported,
) -> Result<ServiceRecord, ImportedRecordError> {
    let name = names::imported_record_name(&imported.fqdn, remote)?;
    let mut labels = BTreeMap::new();
    labels.insert(names::IMPORTED_LABEL.to_string(), String::new());
    labels.insert(names::REMOTE_REGISTRY_LABEL.to_string(), remote.to_string());
    Ok(ServiceRecord {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: (!imported.labels.is_empty()).then(|| imported.labels.clone()),
            ..Default::default()
        },
        spec: crd::ServiceRecordSpec {
            fqdn: imported.fqdn.clone(),
            endpoints: imported_endpoints(imported)?,
            ports: imported_ports(imported),
            origin: imported_origin(imported),
            ..Default::default()
        },
        status: None,
    })
}

/// What identifies one version of a file without reading it: size, modification and change
/// times, inode and device. A rewrite, a rename over it or a `touch` changes at least one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: Option<SystemTime>,
    #[cfg(unix)]
    ctime: (i64, i64),
    /// `mtime` as the inode holds it, to compare with `ctime` ([`Stamp::renamed_after_write`]).
    #[cfg(unix)]
    mtime_unix: (i64, i64),
    #[cfg(unix)]
    inode: (u64, u64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt as _;
        Self {
            len: meta.len(),
            mtime: meta.modified().ok(),
            #[cfg(unix)]
            ctime: (meta.ctime(), meta.ctime_nsec()),
            #[cfg(unix)]
            mtime_unix: (meta.mtime(), meta.mtime_nsec()),
            #[cfg(unix)]
            inode: (meta.dev(), meta.ino()),
        }
    }

    /// Whether the last thing done to the file came after its last write: its inode changed
    /// (ctime) later than its data (mtime). Every write and truncation sets both to the same
    /// instant, so a file being written in place always reads `ctime == mtime`; `ctime > mtime`
    /// means it was renamed into place (or had its times set, as `tar`, `cp -p` and `rsync`
    /// do) after its writer finished it. A file renamed in the same timestamp tick
    /// as its last write reads `ctime == mtime` and is treated as possibly unfinished.
    fn renamed_after_write(&self) -> bool {
        #[cfg(unix)]
        {
            self.ctime > self.mtime_unix
        }
        #[cfg(not(unix))]
        {
            false
        }
    }

    /// Whether a later write could leave this stamp unchanged: file times have a coarse
    /// granularity, so a file modified shortly before it was read may be modified again within
    /// the same tick, with the same size. Such a file's bytes are kept and compared instead.
    fn is_racy(&self, read_at: SystemTime) -> bool {
        match self.mtime {
            Some(mtime) => mtime + RACY_WINDOW >= read_at,
            None => true,
        }
    }
}

/// How long after its last modification a file's stamp is not trusted on its own.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// How long a change that takes something away from a file (see the module documentation) must
/// read the same before it is applied: longer than any writer takes between emptying or removing
/// a file and writing it again, short enough for an operator's edit to feel immediate.
pub const SETTLE: Duration = Duration::from_secs(1);

/// A change to one file that waits for [`SETTLE`] before it is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Unsettled {
    /// What the file read as: a hash of its bytes, or `None` when it was gone.
    content: Option<u64>,
    /// When the file was first seen reading so.
    since: Instant,
}

fn bytes_hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

struct LoadedFile<T> {
    stamp: Stamp,
    /// The bytes, kept only while the stamp is racy (see [`Stamp::is_racy`]).
    bytes: Option<Vec<u8>>,
    items: Vec<T>,
    /// [`key_hash`] of every item, so a change can skip the files that cannot hold its keys.
    keys: HashSet<u64>,
}

/// An object kept in a [`YamlDir`]: a resource of this API group, identified by namespace and
/// name.
pub trait Named: kube::Resource<DynamicType = ()> + DeserializeOwned {
    /// Namespace (`default` when unset) and name.
    fn namespace_name(&self) -> (&str, &str) {
        namespace_name(self.meta())
    }
}

impl<T: kube::Resource<DynamicType = ()> + DeserializeOwned> Named for T {}

/// A fixed (unkeyed) hash of a namespace and name, for [`YamlDir::items_holding`]. Collisions
/// only make a file a candidate; callers still compare the real keys.
pub fn key_hash(namespace: &str, name: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (namespace, name).hash(&mut h);
    h.finish()
}

/// Which entries of the watched directories changed, as a directory watcher reported them, kept
/// until the directory's [`YamlDir`] takes them.
///
/// Shared between [`spawn_dir_watcher_with_events`] (which records) and the [`YamlDir`]s of the
/// watched directories (which take). A directory needs a full scan when it is not watched yet,
/// when its watcher reported something it cannot attribute to one entry (a rescan notice after a
/// queue overflow, an error, an event on the directory itself), and on every poll tick.
#[derive(Clone, Default)]
pub struct DirEvents(Arc<std::sync::Mutex<HashMap<PathBuf, Pending>>>);

#[derive(Default)]
struct Pending {
    full: bool,
    paths: BTreeSet<PathBuf>,
}

/// What a refresh has to look at.
#[derive(Debug, PartialEq, Eq)]
enum Scope {
    /// List the directory and `stat` every entry.
    Full,
    /// Only these entries (full paths); an empty set means nothing.
    Paths(BTreeSet<PathBuf>),
}

/// Beyond this many pending paths in one directory, a full scan is cheaper to keep track of.
const MAX_PENDING_PATHS: usize = 4096;

impl DirEvents {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Pending>> {
        // The map stays consistent even if a holder panicked: every update is one insert.
        xcc_controller::plumbing::lock(&self.0)
    }

    /// Start tracking `dir`; its first take is a full scan.
    fn watch(&self, dir: &Path) {
        self.lock().entry(dir.to_path_buf()).or_default().full = true;
    }

    /// Every tracked directory needs a full scan.
    fn all_full(&self) {
        for p in self.lock().values_mut() {
            p.full = true;
            p.paths.clear();
        }
    }

    /// Record the paths of one watcher event. A path that is not an entry of a tracked directory
    /// (or no path at all) makes the directories it may concern need a full scan.
    fn record(&self, paths: &[PathBuf]) {
        if paths.is_empty() {
            return self.all_full();
        }
        let mut map = self.lock();
        for path in paths {
            if let Some(p) = map.get_mut(path.as_path()) {
                // The directory itself (moved, removed, attributes): look at everything.
                p.full = true;
                p.paths.clear();
                continue;
            }
            match path.parent().and_then(|d| map.get_mut(d)) {
                // Not a YAML file: a ConfigMap volume's `..data` symlink swapped, or a
                // directory: what the YAML entries point at may have changed, so look at all.
                Some(p) if !is_yaml(path) => {
                    p.full = true;
                    p.paths.clear();
                }
                Some(p) if !p.full => {
                    p.paths.insert(path.clone());
                    if p.paths.len() > MAX_PENDING_PATHS {
                        p.full = true;
                        p.paths.clear();
                    }
                }
                Some(_) => {}
                None => {
                    for p in map.values_mut() {
                        p.full = true;
                        p.paths.clear();
                    }
                    return;
                }
            }
        }
    }

    /// What `dir` has to look at now; resets its record.
    fn take(&self, dir: &Path) -> Scope {
        match self.lock().get_mut(dir) {
            None => Scope::Full, // Not watched (yet): nothing tells us what changed.
            Some(p) if p.full => {
                p.full = false;
                p.paths.clear();
                Scope::Full
            }
            Some(p) => Scope::Paths(std::mem::take(&mut p.paths)),
        }
    }
}

/// One watched directory of YAML files, each parsed on its own with its last good content kept.
///
/// A full refresh looks at each file's [`Stamp`] and reads only the files whose stamp changed
/// (or whose stamp is too recent to trust), so an idle full refresh is one `stat` per file. With
/// [`YamlDir::with_events`], a refresh looks only at the entries the watcher reported, and does a
/// full one when the watcher asks for it (poll tick, overflow). The files that changed are
/// remembered until [`YamlDir::take_changes`], with the items they had before, so a consumer can
/// apply just those.
pub struct YamlDir<T> {
    dir: PathBuf,
    files: BTreeMap<PathBuf, LoadedFile<T>>,
    errors: BTreeMap<PathBuf, String>,
    /// Files whose accepted content changed since the last `take_changes`, with their previous
    /// items (empty for a new file).
    changed: BTreeMap<PathBuf, Vec<T>>,
    /// Whether `take_changes` was called before (the first one reports a full load).
    taken: bool,
    /// Where the watcher reports changed entries; without it every refresh is a full scan.
    events: Option<DirEvents>,
    /// Changes that take something away from a file, waiting to read the same for `settle`.
    unsettled: BTreeMap<PathBuf, Unsettled>,
    /// [`SETTLE`], unless a test says otherwise.
    settle: Duration,
    /// Files last seen empty while holding content (warned about once per such spell).
    empty: BTreeSet<PathBuf>,
}

/// What changed in a [`YamlDir`] since the previous [`YamlDir::take_changes`].
pub struct DirChanges<T> {
    /// First call: everything is new; apply the whole content rather than the difference.
    pub full: bool,
    /// Each changed file with the items it had before (its new items are in the `YamlDir`).
    pub files: Vec<(PathBuf, Vec<T>)>,
}

impl<T: Named + Clone + PartialEq> YamlDir<T> {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            files: BTreeMap::new(),
            errors: BTreeMap::new(),
            changed: BTreeMap::new(),
            taken: false,
            events: None,
            unsettled: BTreeMap::new(),
            settle: SETTLE,
            empty: BTreeSet::new(),
        }
    }

    /// How long a change that takes something away must read the same ([`SETTLE`] by default).
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// When the earliest change that is waiting to settle may be applied: refresh again then.
    pub fn next_due(&self) -> Option<Instant> {
        self.unsettled.values().map(|u| u.since + self.settle).min()
    }

    /// Whether a change reading as `content` has read so for [`SETTLE`]; if not, it is
    /// remembered (from now, when it reads differently from before) and left unapplied.
    fn settled(&mut self, path: &Path, content: Option<u64>) -> bool {
        let now = Instant::now();
        match self.unsettled.get(path) {
            Some(u) if u.content == content => u.since + self.settle <= now,
            _ => {
                self.unsettled.insert(
                    path.to_path_buf(),
                    Unsettled {
                        content,
                        since: now,
                    },
                );
                self.settle.is_zero()
            }
        }
    }

    /// Refresh only what the watcher fed into `events` reported (see [`DirEvents`]).
    pub fn with_events(mut self, events: DirEvents) -> Self {
        self.events = Some(events);
        self
    }

    /// Re-read what changed in the directory: every entry, or with [`YamlDir::with_events`] only
    /// the entries the watcher reported. `validate` checks each item; any error rejects the
    /// whole file (its previous content stays). Returns whether the effective content changed.
    pub fn refresh<E: std::fmt::Display>(
        &mut self,
        validate: impl Fn(&T) -> Result<(), E>,
    ) -> bool {
        let scope = match &self.events {
            Some(events) => events.take(&self.dir),
            None => Scope::Full,
        };
        match scope {
            Scope::Full => self.refresh_all(&validate),
            Scope::Paths(mut paths) => {
                // Changes waiting to settle are looked at again, reported or not.
                paths.extend(self.unsettled.keys().cloned());
                let mut changed = false;
                for path in paths {
                    changed |= self.refresh_path(path, &validate);
                }
                changed
            }
        }
    }

    fn refresh_all<E: std::fmt::Display>(
        &mut self,
        validate: &dyn Fn(&T) -> Result<(), E>,
    ) -> bool {
        let mut present = BTreeSet::new();
        let mut changed = false;
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                self.errors
                    .insert(self.dir.clone(), format!("{}: {e}", self.dir.display()));
                return false;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            // Follows symlinks, like reading does.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !is_yaml(&path) || !meta.is_file() {
                continue;
            }
            present.insert(path.clone());
            changed |= self.refresh_file(path, &meta, validate);
        }
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !present.contains(*p))
            .cloned()
            .collect();
        let gone_rejected: Vec<PathBuf> = self
            .errors
            .keys()
            .filter(|p| !present.contains(*p) && **p != self.dir && !self.files.contains_key(*p))
            .cloned()
            .collect();
        for p in gone.into_iter().chain(gone_rejected) {
            changed |= self.forget(p);
        }
        changed
    }

    /// Look at one entry the watcher reported: re-read it, or forget it when it is gone or not a
    /// YAML file any more.
    fn refresh_path<E: std::fmt::Display>(
        &mut self,
        path: PathBuf,
        validate: &dyn Fn(&T) -> Result<(), E>,
    ) -> bool {
        match std::fs::metadata(&path) {
            Ok(meta) if is_yaml(&path) && meta.is_file() => {
                self.refresh_file(path, &meta, validate)
            }
            // Gone, not a file, or not YAML. One that cannot be stat'ed at all is forgotten too,
            // as a full scan would.
            _ => self.forget(path),
        }
    }

    /// Drop a file that is gone, once it has been gone for [`SETTLE`] (a writer that unlinks
    /// and then creates the file must not remove its content for a moment); returns whether
    /// accepted content was dropped.
    fn forget(&mut self, path: PathBuf) -> bool {
        if !self.files.contains_key(&path) && !self.errors.contains_key(&path) {
            self.unsettled.remove(&path);
            return false;
        }
        if !self.settled(&path, None) {
            return false;
        }
        self.unsettled.remove(&path);
        self.empty.remove(&path);
        self.errors.remove(&path);
        match self.files.remove(&path) {
            Some(f) => {
                self.changed.entry(path).or_insert(f.items);
                true
            }
            None => false,
        }
    }

    /// Re-read one present file if its stamp says it may have changed; returns whether its
    /// accepted content changed.
    fn refresh_file<E: std::fmt::Display>(
        &mut self,
        path: PathBuf,
        meta: &std::fs::Metadata,
        validate: &dyn Fn(&T) -> Result<(), E>,
    ) -> bool {
        let stamp = Stamp::of(meta);
        let before_read = stamp;
        let rejected = self.errors.contains_key(&path) || self.unsettled.contains_key(&path);
        if !rejected
            && let Some(f) = self.files.get(&path)
            && f.stamp == stamp
            && f.bytes.is_none()
        {
            return false; // Unchanged, and the stamp is old enough to be trusted.
        }
        let read_at = SystemTime::now();
        let Ok(bytes) = std::fs::read(&path) else {
            return false;
        };
        // The stamp of what was read (a write between stat and read changes it).
        let stamp = std::fs::metadata(&path)
            .map(|m| Stamp::of(&m))
            .unwrap_or(stamp);
        let keep = stamp.is_racy(read_at);
        if !rejected
            && let Some(f) = self.files.get_mut(&path)
            && f.bytes.as_deref() == Some(bytes.as_slice())
        {
            f.stamp = stamp;
            f.bytes = keep.then_some(bytes);
            self.unsettled.remove(&path); // Back to what it held: nothing to apply.
            return false;
        }
        let shown = display_name(&self.dir, &path);
        let parsed = std::str::from_utf8(&bytes)
            .map_err(|_| format!("{shown}: not UTF-8"))
            .and_then(|text| {
                resources::parse_documents::<T>(text, &shown).map_err(|e| e.to_string())
            })
            .and_then(|items| {
                for (i, item) in items.iter().enumerate() {
                    validate(item).map_err(|e| format!("{shown}: document {}: {e}", i + 1))?;
                }
                Ok(items)
            });
        let held = self
            .files
            .get(&path)
            .map_or(&[][..], |f| f.items.as_slice());
        // A file that reads as empty while it held content is being written (or was emptied by
        // mistake): keep its content; deleting the file is what removes it.
        if matches!(&parsed, Ok(items) if items.is_empty()) && !held.is_empty() {
            self.unsettled.remove(&path);
            if self.empty.insert(path.clone()) {
                warn!(
                    file = %shown,
                    "file is empty; keeping its last good content (delete the file to remove what it held)"
                );
            }
            return false;
        }
        self.empty.remove(&path);
        // Only adding (every item it held is still there, unchanged) is applied at once, and so
        // is a file that is complete: renamed into place after its last write, and not written
        // to while it was read (a write in between would have changed the stamp, and set
        // mtime = ctime). Anything else waits until the file has read the same for `settle`.
        let adds_only = matches!(&parsed, Ok(items) if held.iter().all(|h| items.contains(h)));
        let complete = stamp == before_read && stamp.renamed_after_write();
        if adds_only || complete {
            self.unsettled.remove(&path);
        } else if !self.settled(&path, Some(bytes_hash(&bytes))) {
            return false;
        } else {
            self.unsettled.remove(&path);
        }
        match parsed {
            Ok(items) => {
                self.errors.remove(&path);
                let keys = items
                    .iter()
                    .map(|item| {
                        let (namespace, name) = item.namespace_name();
                        key_hash(namespace, name)
                    })
                    .collect();
                let loaded = LoadedFile {
                    stamp,
                    bytes: keep.then_some(bytes),
                    items,
                    keys,
                };
                let previous = self
                    .files
                    .insert(path.clone(), loaded)
                    .map(|f| f.items)
                    .unwrap_or_default();
                self.changed.entry(path).or_insert(previous);
                true
            }
            Err(error) => {
                if self.errors.get(&path) != Some(&error) {
                    warn!(%error, "rejected file; keeping its last good content");
                }
                self.errors.insert(path, error);
                false
            }
        }
    }

    /// The files whose accepted content changed since the previous call.
    pub fn take_changes(&mut self) -> DirChanges<T> {
        let full = !self.taken;
        self.taken = true;
        DirChanges {
            full,
            files: std::mem::take(&mut self.changed).into_iter().collect(),
        }
    }

    /// The items of one accepted file (empty when it has none or was removed).
    pub fn file_items(&self, path: &Path) -> &[T] {
        self.files.get(path).map_or(&[], |f| f.items.as_slice())
    }

    /// The items of the accepted files that may hold any of `keys` ([`key_hash`] values), in
    /// file order; files that hold none of them are skipped without looking at their items.
    pub fn items_holding<'a>(&'a self, keys: &'a HashSet<u64>) -> impl Iterator<Item = &'a T> {
        self.files
            .values()
            .filter(move |f| !f.keys.is_disjoint(keys))
            .flat_map(|f| f.items.iter())
    }

    /// Every item of every accepted file, in file order, without copying.
    pub fn iter_items(&self) -> impl Iterator<Item = &T> {
        self.files.values().flat_map(|f| f.items.iter())
    }

    /// Every item of every accepted file, in file order.
    pub fn items(&self) -> Vec<T> {
        self.iter_items().cloned().collect()
    }

    /// Current rejections, one message per file.
    pub fn errors(&self) -> Vec<String> {
        self.errors.values().cloned().collect()
    }
}

fn is_yaml(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

fn display_name(dir: &Path, path: &Path) -> String {
    let parent = dir.file_name().map(|s| s.to_string_lossy().to_string());
    let file = path
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    match parent {
        Some(p) => format!("{p}/{file}"),
        None => file,
    }
}

/// Watch `dirs` and send a unit on `tx` whenever something below them changes, plus every
/// `poll` as a fallback. Ends when `cancel` fires.
pub fn spawn_dir_watcher(
    dirs: Vec<PathBuf>,
    poll: Duration,
    tx: mpsc::Sender<()>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    spawn_dir_watcher_with_events(dirs, poll, tx, cancel, DirEvents::default())
}

/// [`spawn_dir_watcher`], also recording in `events` which entries changed, so the
/// [`YamlDir`]s of `dirs` (built [`YamlDir::with_events`]) look at those only. A rescan notice
/// (the kernel's event queue overflowed), a watcher error and every poll tick ask for a full
/// scan. Each change is recorded before the unit is sent, so the receiver always finds it.
pub fn spawn_dir_watcher_with_events(
    dirs: Vec<PathBuf>,
    poll: Duration,
    tx: mpsc::Sender<()>,
    cancel: CancellationToken,
    events: DirEvents,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Until now nothing watched these: their first refresh after this is a full scan.
        for d in &dirs {
            events.watch(d);
        }
        let (notify_tx, log) = (tx.clone(), events.clone());
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            match res {
                // Our own reads raise open/access events; reacting to them would re-read forever.
                Ok(ev) if matches!(ev.kind, notify::EventKind::Access(_)) => return,
                Ok(ev) if ev.need_rescan() => log.all_full(),
                Ok(ev) => log.record(&ev.paths),
                Err(_) => log.all_full(),
            }
            let _ = notify_tx.try_send(());
        });
        let _watcher = match watcher {
            Ok(mut w) => {
                for d in &dirs {
                    if let Err(e) = w.watch(d, notify::RecursiveMode::NonRecursive) {
                        warn!(dir = %d.display(), error = %e, "cannot watch directory; relying on polling");
                    }
                }
                Some(w)
            }
            Err(e) => {
                warn!(error = %e, "no filesystem watcher; relying on polling");
                None
            }
        };
        // The first tick is immediate: one full scan once the watch is in place covers whatever
        // changed before it.
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {
                    events.all_full();
                    let _ = tx.try_send(());
                }
            }
        }
    })
}

/// Catalog key of an exported ServiceRecord (as [`export_entry`] derives it): namespace, name.
fn export_key(sr: &ServiceRecord) -> (&str, &str) {
    sr.namespace_name()
}

/// Load exports into the catalog; returns whether the local set changed.
///
/// The first call loads everything (`Catalog::replace_source`). Later calls apply only the files
/// that changed: every key those files held before or hold now is resolved against the whole
/// directory (the last record with that key, in file order, wins, as in a full load) and
/// upserted or removed on its own, so a change costs the size of the changed files, not the size
/// of all exports.
pub fn sync_exports(
    catalog: &Catalog,
    cluster: &str,
    exports: &mut YamlDir<ServiceRecord>,
) -> bool {
    let cluster_owned = cluster.to_string();
    let changed =
        exports.refresh(|sr: &ServiceRecord| export_entry(&cluster_owned, sr).map(|_| ()));
    let changes = exports.take_changes();
    if changes.full {
        if !changed {
            return false;
        }
        let entries: Vec<ServiceEntry> = exports
            .iter_items()
            .filter_map(|sr| export_entry(cluster, sr).ok())
            .collect();
        let (up, rm) = catalog.replace_source(&Source::Local, entries);
        info!(upserted = up, removed = rm, "exports loaded");
        return changed;
    }
    if changes.files.is_empty() {
        return changed;
    }
    // Keys touched by the changed files, before and after.
    let mut touched: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for (path, old) in &changes.files {
        for sr in old.iter().chain(exports.file_items(path)) {
            let (ns, name) = export_key(sr);
            touched.entry(name).or_default().insert(ns);
        }
    }
    // Their effective records: the last one in file order, looked for only in the files that
    // hold one of those keys (not in every loaded record).
    let hashes: HashSet<u64> = touched
        .iter()
        .flat_map(|(name, nss)| nss.iter().map(move |ns| key_hash(ns, name)))
        .collect();
    let mut effective: BTreeMap<(&str, &str), &ServiceRecord> = BTreeMap::new();
    for sr in exports.items_holding(&hashes) {
        let (ns, name) = export_key(sr);
        if touched.get(name).is_some_and(|nss| nss.contains(ns)) {
            effective.insert((ns, name), sr);
        }
    }
    let removals: Vec<ServiceKey> = touched
        .iter()
        .flat_map(|(name, nss)| nss.iter().map(move |ns| (*ns, *name)))
        .filter(|k| !effective.contains_key(k))
        .map(|(ns, name)| ServiceKey::new(cluster, ns, name))
        .collect();
    let upserts: Vec<ServiceEntry> = effective
        .values()
        .filter_map(|sr| export_entry(cluster, sr).ok())
        .collect();
    let (up, rm) = catalog.update_source(&Source::Local, upserts, &removals);
    let files: Vec<String> = changes
        .files
        .iter()
        .map(|(p, _)| display_name(&exports.dir, p))
        .collect();
    info!(?files, upserted = up, removed = rm, "exports reloaded");
    changed
}

#[cfg(test)]
mod tests;
