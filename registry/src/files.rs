//! What the file-backed parts share, below the stores and the parts that keep files of their
//! own (the name owners, the policy ConfigMap): a durable atomic write and the errors currently
//! reported for watched sources.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::watch;

/// Write `bytes` as `path` atomically and durably: a temporary file, flushed, renamed over
/// `path`, and the directory flushed so that the rename survives a power loss.
pub fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("replacing {}", path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("flushing {}", dir.display()))?;
    Ok(())
}

/// Errors currently reported for the watched files (shared with the admin/metrics side); a
/// watch channel, so tests and status writers can wait for a change.
#[derive(Clone)]
pub struct FileErrors(Arc<watch::Sender<Vec<String>>>);

impl Default for FileErrors {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(Vec::new())))
    }
}

impl FileErrors {
    pub fn set(&self, errors: Vec<String>) {
        self.0.send_if_modified(|cur| {
            if *cur == errors {
                false
            } else {
                *cur = errors;
                true
            }
        });
    }
    pub fn get(&self) -> Vec<String> {
        self.0.borrow().clone()
    }
    pub fn subscribe(&self) -> watch::Receiver<Vec<String>> {
        self.0.subscribe()
    }
}
