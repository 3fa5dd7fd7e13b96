//! [`FileImportSink`]: each remote's imports on disk, written at the cost of what changed.
//!
//! ```text
//! imports/<remote>.yaml      the imported ServiceRecords as of the last compaction (XCC form)
//! imports/<remote>.journal   one JSON line per change since then: {"put":{..}} or {"del":fqdn}
//! ```
//!
//! A batch from the Hamlet client is appended to the journal (bytes ∝ the batch) before
//! [`ImportSink::persist_changes`] returns, and the client ACKs after that: the bytes are in the
//! kernel's page cache, so a killed process loses nothing acknowledged. They reach stable storage
//! (`fdatasync`) within [`FLUSH_WITHIN`] of the append, at once when the client asks
//! ([`ImportSink::flush`]: at each end-of-snapshot marker and on shutdown), and with every
//! compaction. A power loss can take at most the appends of the last [`FLUSH_WITHIN`]: the
//! server still has them and sends them again in the snapshot of the next session (a Hamlet
//! client always resubscribes with a full snapshot), so nothing is lost for good. A lock-step
//! server (the Go reference) waits for each ACK, which therefore waits for no disk. The journal
//! is extended ahead of the appends with written zeros ([`GROW`] at a time), so an append
//! overwrites blocks that already exist and a flush writes those blocks and little metadata. Readers stop at the zero tail and
//! ignore a torn last line ([`xcc_proto::import_journal::end`]); on opening, the writer cuts a
//! torn tail so that a later append cannot leave part of it behind its own end.
//!
//! When the journal outgrows the snapshot file, the whole set is written in the background as a
//! new snapshot (temporary file, fsync, rename, directory fsync) and the journal replaced by what
//! was appended meanwhile, so the bytes written stay proportional to what was imported. Reading
//! is the snapshot, then the journal in order; a complete line that does not parse is skipped
//! with a warning.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use futures::FutureExt;
use futures::future::BoxFuture;
use tracing::warn;
use xcc_proto::crd::ServiceRecord;
use xcc_proto::import_journal::{self, Change, Ep, Line, Put};
use xcc_proto::resources;

use super::{IMPORTS_DIR, imported_record};
use crate::catalog::Endpoint;
use crate::files::write_atomic;
use crate::hamlet::client::ImportSink;
use crate::hamlet::convert::Imported;
use crate::remotes::PersistedImports;
use crate::store::model::imported_cluster;
use xcc_controller::plumbing::lock;

/// The journal file is extended in steps of this many bytes, written as zeros and flushed with
/// the new size: the appends that fill them then flush only their own blocks.
const GROW: u64 = 64 * 1024;
/// Appends reach stable storage at most this long after they were written (see the module docs).
pub const FLUSH_WITHIN: std::time::Duration = std::time::Duration::from_millis(50);
/// An append at least this large that does not fit extends the file with its own bytes: its
/// flush costs enough that the metadata is noise, and no zeros are written for it.
const APPEND_DIRECT: usize = 16 * 1024;

/// The journal is compacted once it is larger than this many times the snapshot file, and at
/// least [`COMPACT_FLOOR`]: each compaction then writes at most a constant factor of what the
/// journal took, so bytes written stay proportional to the import.
const COMPACT_RATIO: u64 = 2;
/// Below 1 MiB (a few thousand changes) the journal is never compacted: replaying it is cheap.
const COMPACT_FLOOR: u64 = 1024 * 1024;

/// Name prefix of the temporary files a write leaves behind if the process dies before the
/// rename (the `tempfile` crate's default).
const TEMP_PREFIX: &str = ".tmp";

/// Persists each remote's imports under `imports/` (see the module docs).
pub struct FileImportSink {
    dir: PathBuf,
    namespace: String,
    journals: Mutex<HashMap<String, Arc<Mutex<Journal>>>>,
    written: Arc<AtomicU64>,
    sync: Syncer,
}

/// Flushes an appended journal to stable storage (`fdatasync`; tests record the order).
type Syncer = Arc<dyn Fn(&std::fs::File) -> std::io::Result<()> + Send + Sync>;

/// One remote's open journal and the sizes that decide when to compact.
struct Journal {
    file: std::fs::File,
    /// Where the next append goes: everything before it is flushed, `[end, len)` is zeros.
    end: u64,
    /// The file's length.
    len: u64,
    /// An append failed part-way: what it left after `end` is cut before the next one.
    torn: bool,
    /// Appended since the last flush to stable storage.
    dirty: bool,
    /// A flush is due within [`FLUSH_WITHIN`] (a task waits for it).
    flush_due: bool,
    base_bytes: u64,
    /// Held by the one compaction of this remote that may run at a time.
    compaction: Arc<tokio::sync::Mutex<()>>,
}

impl Journal {
    /// Open a journal for appending (creating it), cutting a torn tail (see the module docs).
    fn open(path: &Path, base_bytes: u64) -> std::io::Result<Self> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let end = import_journal::end(&bytes) as u64;
        let mut j = Self {
            file,
            end,
            len: bytes.len() as u64,
            torn: bytes[end as usize..].iter().any(|b| *b != 0),
            dirty: false,
            flush_due: false,
            base_bytes,
            compaction: Arc::default(),
        };
        if j.torn {
            warn!(file = %path.display(), bytes = j.len - end, "cutting the torn tail of an import journal (an append interrupted by a crash, never acknowledged)");
            j.cut()?;
        }
        Ok(j)
    }

    /// Cut the file at `end`, durably (retried by the next append if this fails).
    fn cut(&mut self) -> std::io::Result<()> {
        self.torn = true;
        self.file.set_len(self.end)?;
        self.file.sync_all()?;
        self.len = self.end;
        self.torn = false;
        Ok(())
    }

    /// Append `bytes` (to the page cache: [`FileImportSink`] flushes within [`FLUSH_WITHIN`]).
    /// Returns the bytes written, zeros included. On error nothing counts as appended; the next
    /// append writes at the same place.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<u64> {
        if self.torn {
            self.cut()?;
        }
        self.torn = true;
        let new_end = self.end + bytes.len() as u64;
        self.file.write_all_at(bytes, self.end)?;
        let mut written = bytes.len() as u64;
        if new_end > self.len {
            let new_len = if bytes.len() >= APPEND_DIRECT {
                new_end
            } else {
                (new_end / GROW + 1) * GROW
            };
            write_zeros(&self.file, new_end, new_len)?;
            written += new_len - new_end;
            self.len = new_len;
        }
        self.end = new_end;
        self.torn = false;
        self.dirty = true;
        Ok(written)
    }

    /// What a flush must sync, if anything was appended since the last one: a handle on the
    /// file (synced without holding the journal's lock, so appends go on meanwhile). Appends
    /// made after this call mark the journal dirty again.
    fn take_dirty(&mut self) -> std::io::Result<Option<std::fs::File>> {
        if !self.dirty {
            return Ok(None);
        }
        let file = self.file.try_clone()?;
        self.dirty = false;
        Ok(Some(file))
    }
}

/// Write zeros over `[from, to)` of `file`.
fn write_zeros(file: &std::fs::File, from: u64, to: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 8192] = [0; 8192];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

/// Flush what was appended to `journal` to stable storage (on a blocking thread). On failure the
/// journal stays dirty, so the next flush tries again.
async fn flush_journal(journal: Arc<Mutex<Journal>>, sync: Syncer) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || {
        let Some(file) = lock(&journal).take_dirty()? else {
            return Ok(());
        };
        if let Err(e) = sync(&file) {
            lock(&journal).dirty = true;
            return Err(e);
        }
        Ok(())
    })
    .await
    .context("journal flush task failed")?
    .context("fdatasync of an import journal")
}

impl FileImportSink {
    /// Opens `<state_dir>/imports` for the registry that owns it, removing temporary files an
    /// interrupted write left there.
    pub fn new(state_dir: &Path, namespace: impl Into<String>) -> std::io::Result<Self> {
        let sink = Self::reader(state_dir, namespace);
        std::fs::create_dir_all(&sink.dir)?;
        for entry in std::fs::read_dir(&sink.dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => {
                        warn!(file = %entry.path().display(), "removed a temporary file left by an interrupted write")
                    }
                    Err(e) => {
                        warn!(file = %entry.path().display(), error = %e, "cannot remove a leftover temporary file")
                    }
                }
            }
        }
        Ok(sink)
    }

    /// A view of `<state_dir>/imports` for reading ([`Self::load`], [`Self::records`]) while
    /// another sink owns it: touches nothing on disk.
    pub fn reader(state_dir: &Path, namespace: impl Into<String>) -> Self {
        Self {
            dir: state_dir.join(IMPORTS_DIR),
            namespace: namespace.into(),
            journals: Mutex::default(),
            written: Arc::default(),
            sync: Arc::new(std::fs::File::sync_data),
        }
    }

    /// The same sink flushing its journals with `sync` (tests record when it runs).
    #[cfg(test)]
    pub(crate) fn with_syncer(
        mut self,
        sync: impl Fn(&std::fs::File) -> std::io::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.sync = Arc::new(sync);
        self
    }

    /// A remote's imports as the ServiceRecords XCC would create (names, labels, annotations).
    pub fn records(&self, remote: &str) -> anyhow::Result<Vec<ServiceRecord>> {
        Ok(self
            .load(remote)?
            .iter()
            .filter_map(|i| imported_record(remote, &self.namespace, i).ok())
            .collect())
    }

    pub fn path_for(&self, remote: &str) -> PathBuf {
        self.dir.join(format!("{remote}.yaml"))
    }

    pub fn journal_path_for(&self, remote: &str) -> PathBuf {
        self.dir.join(format!("{remote}.journal"))
    }

    /// Bytes this sink has written (snapshots and journal lines) since it was created.
    pub fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Remove a remote's import files (the remote was removed from configuration).
    pub fn forget(&self, remote: &str) -> std::io::Result<()> {
        lock(&self.journals).remove(remote);
        for path in [self.path_for(remote), self.journal_path_for(remote)] {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Load a remote's persisted imports (start-up): the snapshot, then the journal.
    pub fn load(&self, remote: &str) -> anyhow::Result<Vec<Imported>> {
        let path = self.path_for(remote);
        let mut imports: BTreeMap<String, Imported> = BTreeMap::new();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let records: Vec<ServiceRecord> =
                    resources::parse_documents(&text, &path.display().to_string())?;
                for sr in records {
                    let cluster = imported_cluster(&sr);
                    let ports = crate::store::model::stored_ports(&sr);
                    let mut endpoints = Vec::with_capacity(sr.spec.endpoints.len());
                    for e in sr.spec.endpoints {
                        let port = u32::try_from(e.port)
                            .ok()
                            .filter(|p| (1..=65535).contains(p))
                            .with_context(|| {
                                format!(
                                    "{}: {}: port {} is out of range 1-65535",
                                    path.display(),
                                    sr.spec.fqdn,
                                    e.port
                                )
                            })?;
                        endpoints.push(Endpoint {
                            address: e.address.into(),
                            port,
                        });
                    }
                    let i = Imported {
                        cluster,
                        fqdn: sr.spec.fqdn.clone(),
                        raw_fqdn: sr.spec.fqdn,
                        endpoints,
                        labels: sr.metadata.annotations.unwrap_or_default(),
                        ports,
                    };
                    imports.insert(i.fqdn.clone(), i);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
        let jpath = self.journal_path_for(remote);
        match std::fs::read(&jpath) {
            Ok(bytes) => replay(&mut imports, &bytes, &jpath),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", jpath.display())),
        }
        Ok(imports.into_values().collect())
    }

    /// The remote's journal, opened on first use.
    fn journal(&self, remote: &str) -> anyhow::Result<Arc<Mutex<Journal>>> {
        let mut all = lock(&self.journals);
        if let Some(j) = all.get(remote) {
            return Ok(j.clone());
        }
        let path = self.journal_path_for(remote);
        let base_bytes = std::fs::metadata(self.path_for(remote))
            .map(|m| m.len())
            .unwrap_or(0);
        let j = Arc::new(Mutex::new(
            Journal::open(&path, base_bytes)
                .with_context(|| format!("opening {}", path.display()))?,
        ));
        all.insert(remote.to_string(), j.clone());
        Ok(j)
    }

    /// Wait until no compaction of `remote` is running (tests and benchmarks read the files
    /// after this).
    pub async fn settle(&self, remote: &str) -> anyhow::Result<()> {
        let journal = self.journal(remote)?;
        let compaction = lock(&journal).compaction.clone();
        drop(compaction.lock().await);
        Ok(())
    }

    /// Write the whole set as the new snapshot and empty the journal (the full-set persist).
    async fn compact(
        &self,
        remote: &str,
        imports: &BTreeMap<String, Imported>,
    ) -> anyhow::Result<()> {
        let journal = self.journal(remote)?;
        let compaction = lock(&journal).compaction.clone();
        let _running = compaction.lock_owned().await;
        let text = snapshot_text(remote, &self.namespace, imports)?;
        let dir = self.dir.clone();
        let path = self.path_for(remote);
        let written = self.written.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut j = lock(&journal);
            write_atomic(&dir, &path, text.as_bytes())?;
            // The snapshot holds everything the journal did; replaying a journal over it would
            // be harmless, so a crash between these two steps loses nothing.
            j.end = 0;
            j.cut()?;
            j.dirty = false;
            j.base_bytes = text.len() as u64;
            written.fetch_add(text.len() as u64, Ordering::Relaxed);
            Ok(())
        })
        .await
        .context("writer task failed")?
    }

    /// Start compacting in the background unless one is running: the set as of now (`imports`,
    /// whose changes are all in the journal's first `covered` bytes) becomes the snapshot, and
    /// the journal keeps only what was appended after. The client's ACKs do not wait for it.
    fn compact_in_background(
        &self,
        remote: &str,
        journal: &Arc<Mutex<Journal>>,
        imports: &BTreeMap<String, Imported>,
    ) {
        let (compaction, covered) = {
            let j = lock(journal);
            (j.compaction.clone(), j.end)
        };
        let Ok(running) = compaction.try_lock_owned() else {
            return;
        };
        let copy = imports.clone();
        let (dir, base, jpath) = (
            self.dir.clone(),
            self.path_for(remote),
            self.journal_path_for(remote),
        );
        let (remote, namespace) = (remote.to_string(), self.namespace.clone());
        let (journal, written) = (journal.clone(), self.written.clone());
        tokio::spawn(async move {
            let _running = running;
            let res = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                let text = snapshot_text(&remote, &namespace, &copy)?;
                write_atomic(&dir, &base, text.as_bytes())?;
                written.fetch_add(text.len() as u64, Ordering::Relaxed);
                // A crash here leaves the new snapshot and the whole journal: replaying the
                // covered part over the snapshot yields the snapshot again, so nothing is lost.
                // The new journal: what was appended meanwhile, then zeros to append into.
                let mut j = lock(&journal);
                let tail_len = j.end - covered;
                let mut next = vec![0; ((tail_len / GROW + 1) * GROW) as usize];
                j.file
                    .read_exact_at(&mut next[..tail_len as usize], covered)?;
                write_atomic(&dir, &jpath, &next)?;
                written.fetch_add(next.len() as u64, Ordering::Relaxed);
                *j = Journal {
                    base_bytes: text.len() as u64,
                    compaction: j.compaction.clone(),
                    flush_due: j.flush_due,
                    ..Journal::open(&jpath, 0)
                        .with_context(|| format!("reopening {}", jpath.display()))?
                };
                Ok(())
            })
            .await;
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    warn!(error = %format!("{e:#}"), "compacting imports failed; the journal keeps everything")
                }
                Err(e) => warn!(error = %e, "compaction task failed; the journal keeps everything"),
            }
        });
    }
}

fn snapshot_text(
    remote: &str,
    namespace: &str,
    imports: &BTreeMap<String, Imported>,
) -> anyhow::Result<String> {
    let mut records = Vec::with_capacity(imports.len());
    for i in imports.values() {
        match imported_record(remote, namespace, i) {
            Ok(r) => records.push(r),
            Err(e) => {
                warn!(remote, fqdn = %i.fqdn, error = %e, "import has no valid record name; not persisted")
            }
        }
    }
    if records.is_empty() {
        // Not an empty file: readers take an empty snapshot for one being written and keep what
        // it held (`xcc dns --imports-dir`).
        return Ok(format!("# nothing imported from {remote}\n"));
    }
    Ok(resources::to_yaml_documents(&records)?)
}

/// Apply a journal's content to `imports`. A complete line that does not parse (edited by hand)
/// is skipped with a warning naming it; the others still apply.
fn replay(imports: &mut BTreeMap<String, Imported>, bytes: &[u8], path: &Path) {
    for (n, change) in import_journal::changes(bytes) {
        match change {
            Ok(Change::Put(p)) => {
                let i = Imported {
                    fqdn: p.fqdn.clone(),
                    raw_fqdn: p.fqdn,
                    endpoints: p
                        .endpoints
                        .into_iter()
                        .map(|e| Endpoint {
                            address: e.address.into(),
                            port: e.port,
                        })
                        .collect(),
                    labels: p.annotations,
                    cluster: p.cluster.filter(|c| xcc_proto::names::is_dns1123_label(c)),
                    ports: xcc_proto::ports::checked(
                        p.ports.iter().map(xcc_proto::ports::RawPort::of),
                    )
                    .0,
                };
                imports.insert(i.fqdn.clone(), i);
            }
            Ok(Change::Del(fqdn)) => {
                imports.remove(&fqdn);
            }
            Err(e) => {
                warn!(file = %path.display(), line = n, error = %e, "unreadable journal line; skipped")
            }
        }
    }
}

fn journal_lines(
    remote: &str,
    namespace: &str,
    imports: &BTreeMap<String, Imported>,
    changed: &BTreeSet<String>,
) -> anyhow::Result<String> {
    let mut out = String::new();
    for fqdn in changed {
        let line = match imports.get(fqdn) {
            Some(i) => {
                // Same rule as the snapshot: an import without a valid record name is not kept.
                if let Err(e) = imported_record(remote, namespace, i) {
                    warn!(remote, %fqdn, error = %e, "import has no valid record name; not persisted");
                    continue;
                }
                Line {
                    put: Some(Put {
                        fqdn: i.fqdn.clone(),
                        endpoints: i
                            .endpoints
                            .iter()
                            .map(|e| Ep {
                                address: e.address.to_string(),
                                port: e.port,
                            })
                            .collect(),
                        annotations: i.labels.clone(),
                        cluster: i.cluster.clone(),
                        ports: i.ports.clone(),
                    }),
                    del: None,
                }
            }
            None => Line {
                put: None,
                del: Some(fqdn.clone()),
            },
        };
        out.push_str(&serde_json::to_string(&line)?);
        out.push('\n');
    }
    Ok(out)
}

impl PersistedImports for FileImportSink {
    fn load(&self, remote: &str) -> anyhow::Result<Vec<Imported>> {
        FileImportSink::load(self, remote)
    }

    fn forget(&self, remote: &str) -> std::io::Result<()> {
        FileImportSink::forget(self, remote)
    }
}

impl ImportSink for FileImportSink {
    fn persist<'a>(
        &'a self,
        remote: &'a str,
        imports: &'a BTreeMap<String, Imported>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        self.compact(remote, imports).boxed()
    }

    fn flush<'a>(&'a self, remote: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        async move {
            let journal = match lock(&self.journals).get(remote) {
                Some(j) => j.clone(),
                None => return Ok(()),
            };
            flush_journal(journal, self.sync.clone()).await
        }
        .boxed()
    }

    fn persist_changes<'a>(
        &'a self,
        remote: &'a str,
        imports: &'a BTreeMap<String, Imported>,
        changed: &'a BTreeSet<String>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        async move {
            let lines = journal_lines(remote, &self.namespace, imports, changed)?;
            let journal = self.journal(remote)?;
            let (j, sync, path) = (
                journal.clone(),
                self.sync.clone(),
                self.journal_path_for(remote),
            );
            // In the page cache before this returns (the client ACKs after); on stable storage
            // within FLUSH_WITHIN: see the module docs. Appending is a copy into the page
            // cache, done inline unless a compaction holds the journal.
            let appended = move |j: &mut Journal| {
                let written = j
                    .append(lines.as_bytes())
                    .with_context(|| format!("appending to {}", path.display()))?;
                let schedule = !std::mem::replace(&mut j.flush_due, true);
                anyhow::Ok((
                    written,
                    j.end > (COMPACT_RATIO * j.base_bytes).max(COMPACT_FLOOR),
                    schedule,
                ))
            };
            let inline = match j.try_lock() {
                Ok(mut guard) => Some(appended(&mut guard)),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(appended(&mut p.into_inner())),
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            let (written, compact, schedule) = match inline {
                Some(r) => r?,
                None => tokio::task::spawn_blocking(move || appended(&mut lock(&j)))
                    .await
                    .context("journal writer task failed")??,
            };
            if schedule {
                let (journal, sync) = (journal.clone(), sync.clone());
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(FLUSH_WITHIN).await;
                        // Appends from here on schedule their own flush.
                        lock(&journal).flush_due = false;
                        match flush_journal(journal.clone(), sync.clone()).await {
                            Ok(()) => return,
                            Err(e) => {
                                warn!(error = %format!("{e:#}"), "flushing an import journal failed; trying again");
                                if std::mem::replace(&mut lock(&journal).flush_due, true) {
                                    return; // A later append's flush is due already.
                                }
                            }
                        }
                    }
                });
            }
            self.written.fetch_add(written, Ordering::Relaxed);
            if compact {
                self.compact_in_background(remote, &journal, imports);
            }
            Ok(())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests;
