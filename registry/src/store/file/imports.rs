//! [`FileImportSink`]: each remote's imports on disk, written at the cost of what changed.
//!
//! ```text
//! imports/<remote>.yaml      the imported ServiceRecords as of the last compaction (XCC form)
//! imports/<remote>.journal   one JSON line per change since then: {"put":{..}} or {"del":fqdn}
//! ```
//!
//! A batch from the Hamlet client appends its changes to the journal (bytes ∝ the batch) before
//! the client ACKs, so a killed process loses nothing it acknowledged. The journal is flushed to
//! stable storage (`fdatasync`) at most [`SYNC_INTERVAL`] after a write: a lock-step server
//! (the Go reference) sends one response per ACK, and a flush per response would bound the import
//! rate by the disk's flush latency. A power loss can cost the last [`SYNC_INTERVAL`] of
//! acknowledged changes; the remote resends all of its state on the next stream, and the stale
//! sweep removes what it no longer has. When the journal outgrows the snapshot file, the whole
//! set is written as a new snapshot (temporary file, fsync, rename) and the journal emptied, so
//! the bytes written stay proportional to what was imported. Reading is the snapshot, then the
//! journal in order; a line torn by a crash mid-append is skipped with a warning.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context as _;
use futures::FutureExt;
use futures::future::BoxFuture;
use tracing::warn;
use xcc_proto::import_journal::{Change, Ep, Line, Put};
use xcc_proto::resources::{self, ServiceRecord};

use super::{IMPORTS_DIR, imported_record};
use crate::catalog::Endpoint;
use crate::hamlet::client::ImportSink;
use crate::hamlet::convert::Imported;

/// Longest time an appended change waits for `fdatasync` (see the module docs): short against
/// any reconnect, long against one lock-step round trip (~0.1 ms on loopback).
pub const SYNC_INTERVAL: Duration = Duration::from_millis(50);

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
}

/// One remote's open journal and the sizes that decide when to compact.
struct Journal {
    /// Shared so a flush can run without holding the lock (appends go on meanwhile).
    file: Arc<std::fs::File>,
    bytes: u64,
    base_bytes: u64,
    /// A flush is scheduled and will cover everything appended before it starts.
    flush_pending: bool,
    /// Held by the one compaction of this remote that may run at a time.
    compaction: Arc<tokio::sync::Mutex<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
        }
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
                    let i = Imported {
                        fqdn: sr.spec.fqdn.clone(),
                        raw_fqdn: sr.spec.fqdn,
                        endpoints: sr
                            .spec
                            .endpoints
                            .into_iter()
                            .map(|e| Endpoint {
                                address: e.address,
                                port: e.port,
                            })
                            .collect(),
                        labels: sr.metadata.annotations,
                    };
                    imports.insert(i.fqdn.clone(), i);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
        let jpath = self.journal_path_for(remote);
        match std::fs::read_to_string(&jpath) {
            Ok(text) => replay(&mut imports, &text, &jpath),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", jpath.display())),
        }
        Ok(imports.into_values().collect())
    }

    /// The remote's journal, opened (append mode) on first use.
    fn journal(&self, remote: &str) -> anyhow::Result<Arc<Mutex<Journal>>> {
        let mut all = lock(&self.journals);
        if let Some(j) = all.get(remote) {
            return Ok(j.clone());
        }
        let path = self.journal_path_for(remote);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let bytes = file.metadata()?.len();
        let base_bytes = std::fs::metadata(self.path_for(remote))
            .map(|m| m.len())
            .unwrap_or(0);
        let j = Arc::new(Mutex::new(Journal {
            file: Arc::new(file),
            bytes,
            base_bytes,
            flush_pending: false,
            compaction: Arc::default(),
        }));
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
            j.file.set_len(0)?;
            j.file.sync_all()?;
            j.bytes = 0;
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
            (j.compaction.clone(), j.bytes)
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
                let mut j = lock(&journal);
                let mut tail = Vec::new();
                {
                    use std::io::{Read as _, Seek as _};
                    let mut f = std::fs::File::open(&jpath)?;
                    f.seek(std::io::SeekFrom::Start(covered))?;
                    f.read_to_end(&mut tail)?;
                }
                write_atomic(&dir, &jpath, &tail)?;
                written.fetch_add(tail.len() as u64, Ordering::Relaxed);
                j.file = Arc::new(
                    std::fs::OpenOptions::new()
                        .append(true)
                        .open(&jpath)
                        .with_context(|| format!("reopening {}", jpath.display()))?,
                );
                j.bytes = tail.len() as u64;
                j.base_bytes = text.len() as u64;
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
    Ok(resources::to_yaml_documents(&records)?)
}

/// Apply journal `text` to `imports`. A line that does not parse (torn by a crash mid-append,
/// or edited by hand) is skipped with a warning naming it; the others still apply.
fn replay(imports: &mut BTreeMap<String, Imported>, text: &str, path: &Path) {
    for (n, raw) in text.lines().enumerate() {
        match Line::parse(raw) {
            Ok(Some(Change::Put(p))) => {
                let i = Imported {
                    fqdn: p.fqdn.clone(),
                    raw_fqdn: p.fqdn,
                    endpoints: p
                        .endpoints
                        .into_iter()
                        .map(|e| Endpoint {
                            address: e.address,
                            port: e.port,
                        })
                        .collect(),
                    labels: p.annotations,
                };
                imports.insert(i.fqdn.clone(), i);
            }
            Ok(Some(Change::Del(fqdn))) => {
                imports.remove(&fqdn);
            }
            Ok(None) => {}
            Err(e) => {
                warn!(file = %path.display(), line = n + 1, error = %e, "unreadable journal line (torn by a crash?); skipped")
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
                                address: e.address.clone(),
                                port: e.port,
                            })
                            .collect(),
                        annotations: i.labels.clone(),
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

impl ImportSink for FileImportSink {
    fn persist<'a>(
        &'a self,
        remote: &'a str,
        imports: &'a BTreeMap<String, Imported>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        self.compact(remote, imports).boxed()
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
            // A few hundred bytes per change into the page cache: microseconds, so written here
            // rather than on a blocking thread (a thread hop per lock-step response costs more).
            let schedule_flush = {
                let mut j = lock(&journal);
                (&*j.file).write_all(lines.as_bytes()).with_context(|| {
                    format!("appending to {}", self.journal_path_for(remote).display())
                })?;
                j.bytes += lines.len() as u64;
                self.written
                    .fetch_add(lines.len() as u64, Ordering::Relaxed);
                !std::mem::replace(&mut j.flush_pending, true)
            };
            let compact = {
                let j = lock(&journal);
                j.bytes > (COMPACT_RATIO * j.base_bytes).max(COMPACT_FLOOR)
            };
            if compact {
                self.compact_in_background(remote, &journal, imports);
            }
            if schedule_flush {
                tokio::spawn(flush_later(journal, self.journal_path_for(remote)));
            }
            Ok(())
        }
        .boxed()
    }
}

/// Flush a journal to stable storage [`SYNC_INTERVAL`] after its first unflushed append; the
/// appends made meanwhile ride along. The lock is not held during the flush.
async fn flush_later(journal: Arc<Mutex<Journal>>, path: PathBuf) {
    tokio::time::sleep(SYNC_INTERVAL).await;
    let res = tokio::task::spawn_blocking(move || {
        let file = {
            let mut j = lock(&journal);
            j.flush_pending = false;
            j.file.clone()
        };
        file.sync_data()
    })
    .await;
    match res {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(file = %path.display(), error = %e, "cannot flush the imports journal"),
        Err(e) => warn!(file = %path.display(), error = %e, "journal flush task failed"),
    }
}

/// Replace `path` (in `dir`) with `bytes`: a synced temporary file in `dir`, renamed over it.
pub(crate) fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use xcc_proto::names;

    fn imported(fqdn: &str, ip: &str) -> Imported {
        let mut labels = BTreeMap::new();
        labels.insert(
            names::SERVICE_PORT_ANNOTATION.to_string(),
            "443".to_string(),
        );
        Imported {
            fqdn: fqdn.into(),
            raw_fqdn: fqdn.into(),
            endpoints: vec![Endpoint {
                address: ip.into(),
                port: 443,
            }],
            labels,
        }
    }

    fn loaded(sink: &FileImportSink, remote: &str) -> Vec<(String, String)> {
        sink.load(remote)
            .expect("load")
            .into_iter()
            .map(|i| (i.fqdn, i.endpoints[0].address.clone()))
            .collect()
    }

    #[tokio::test]
    async fn imports_are_written_atomically_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FileImportSink::new(dir.path(), "cross-cluster-connectivity").expect("sink");
        let mut imports = BTreeMap::new();
        imports.insert(
            "foobar.some.domain".to_string(),
            imported("foobar.some.domain", "10.0.0.1"),
        );
        sink.persist("shared-services-cls", &imports)
            .await
            .expect("persist");
        let text = std::fs::read_to_string(sink.path_for("shared-services-cls")).expect("read");
        let records: Vec<ServiceRecord> = resources::parse_documents(&text, "x").expect("parse");
        assert_eq!(records.len(), 1);
        let r = &records[0];
        // P-01's expected object, in file form.
        assert_eq!(r.metadata.name, "foobar.some.domain-6068d556");
        assert_eq!(
            r.metadata.namespace.as_deref(),
            Some("cross-cluster-connectivity")
        );
        assert_eq!(
            r.metadata.labels,
            BTreeMap::from([
                (names::IMPORTED_LABEL.to_string(), String::new()),
                (
                    names::REMOTE_REGISTRY_LABEL.to_string(),
                    "shared-services-cls".to_string()
                ),
            ])
        );
        assert_eq!(r.spec.fqdn, "foobar.some.domain");
        assert_eq!(sink.load("shared-services-cls").expect("load").len(), 1);
        sink.forget("shared-services-cls").expect("forget");
        assert!(sink.load("shared-services-cls").expect("load").is_empty());
    }

    #[tokio::test]
    async fn changes_append_only_their_own_bytes_and_replay_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FileImportSink::new(dir.path(), "ns").expect("sink");
        let mut imports = BTreeMap::new();
        for i in 0..100 {
            let f = format!("s{i:03}.x.test");
            imports.insert(f.clone(), imported(&f, "10.0.0.1"));
        }
        sink.persist("east", &imports).await.expect("snapshot");
        let base = std::fs::metadata(sink.path_for("east"))
            .expect("meta")
            .len();
        let before = sink.bytes_written();

        // One update and one delete: two journal lines, the snapshot untouched.
        imports.insert("s001.x.test".into(), imported("s001.x.test", "10.0.0.9"));
        imports.remove("s002.x.test");
        let changed = BTreeSet::from(["s001.x.test".to_string(), "s002.x.test".to_string()]);
        sink.persist_changes("east", &imports, &changed)
            .await
            .expect("append");
        let journal = std::fs::read_to_string(sink.journal_path_for("east")).expect("journal");
        assert_eq!(journal.lines().count(), 2, "{journal}");
        assert_eq!(sink.bytes_written() - before, journal.len() as u64);
        assert!(
            (journal.len() as u64) < base / 20,
            "a change costs its own size"
        );
        assert_eq!(
            std::fs::metadata(sink.path_for("east"))
                .expect("meta")
                .len(),
            base
        );

        // A fresh sink (a restart) reads the snapshot plus the journal.
        let again = FileImportSink::new(dir.path(), "ns").expect("sink");
        let got = loaded(&again, "east");
        assert_eq!(got.len(), 99);
        assert!(got.contains(&("s001.x.test".into(), "10.0.0.9".into())));
        assert!(!got.iter().any(|(f, _)| f == "s002.x.test"));
    }

    #[tokio::test]
    async fn a_torn_last_line_is_skipped_and_the_rest_applies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FileImportSink::new(dir.path(), "ns").expect("sink");
        let mut imports = BTreeMap::new();
        imports.insert("a.x.test".to_string(), imported("a.x.test", "10.0.0.1"));
        sink.persist_changes("east", &imports, &BTreeSet::from(["a.x.test".to_string()]))
            .await
            .expect("append");
        // A crash in the middle of the next append.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(sink.journal_path_for("east"))
            .expect("open");
        f.write_all(br#"{"put":{"fqdn":"b.x.te"#).expect("write");
        assert_eq!(
            loaded(&sink, "east"),
            [("a.x.test".into(), "10.0.0.1".into())]
        );
    }

    #[tokio::test]
    async fn a_growing_journal_is_compacted_into_the_snapshot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FileImportSink::new(dir.path(), "ns").expect("sink");
        let mut imports = BTreeMap::new();
        // Well past the 1 MiB floor, one change per batch as from a lock-step server.
        for i in 0..12_000 {
            let f = format!("s{i:05}.x.test");
            imports.insert(f.clone(), imported(&f, "10.0.0.1"));
            sink.persist_changes("east", &imports, &BTreeSet::from([f]))
                .await
                .expect("append");
        }
        let appended = sink.bytes_written();
        sink.settle("east").await.expect("settled");
        let base = std::fs::metadata(sink.path_for("east"))
            .expect("snapshot")
            .len();
        let journal = std::fs::metadata(sink.journal_path_for("east"))
            .expect("journal")
            .len();
        assert!(base > 0, "compacted at least once");
        assert!(
            journal < appended / 2,
            "the journal was cut: {journal} of {appended}"
        );
        assert!(
            sink.bytes_written() < 3 * (base + journal),
            "written {} for {} on disk",
            sink.bytes_written(),
            base + journal
        );
        assert_eq!(sink.load("east").expect("load").len(), 12_000);
        // And after a restart, with the appends that raced the compactions kept.
        let again = FileImportSink::new(dir.path(), "ns").expect("sink");
        assert_eq!(again.load("east").expect("load").len(), 12_000);
    }

    #[test]
    fn leftover_temporary_files_are_removed_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let imports = dir.path().join(IMPORTS_DIR);
        std::fs::create_dir_all(&imports).expect("mkdir");
        std::fs::write(imports.join(".tmpAbC123"), "half a file").expect("write");
        std::fs::write(imports.join("east.yaml"), "").expect("write");
        let _sink = FileImportSink::new(dir.path(), "ns").expect("sink");
        let mut left: Vec<String> = std::fs::read_dir(&imports)
            .expect("read")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["east.yaml"]);
    }
}
