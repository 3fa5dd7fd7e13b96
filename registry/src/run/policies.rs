//! The registry's Cedar policies: the defaults plus those given in code, a watched directory or
//! (kube store) a watched ConfigMap, held by one [`Gate`]. A rejected change keeps the set in
//! force and is reported in the policy errors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};
use xcc_controller::tasks::Spawner;

use super::{RegistryConfig, StartError, StoreConfig};
use crate::authz::{Gate, Policies, PolicyError};
use crate::files::FileErrors;
use crate::metrics::Metrics;
use crate::store::file;

/// The policies in force and where their reload errors and first read are reported.
pub(super) struct PolicyPart {
    pub gate: Gate,
    /// Reload errors (empty when the set in force is the latest).
    pub errors: FileErrors,
    /// The policy ConfigMap's first read (readiness waits for it).
    pub synced: Option<watch::Receiver<bool>>,
}

/// Load the policies and start watching their sources.
pub(super) fn start(
    config: &RegistryConfig,
    trust_domain: String,
    metrics: &Metrics,
    spawner: &Spawner,
) -> Result<PolicyPart, StartError> {
    let inline = config.federation.policies.clone();
    let policies = match &config.federation.policy_dir {
        Some(dir) => Policies::from_dir_and(dir, &inline),
        None => Policies::from_sources(&inline),
    }
    .map_err(StartError::Policies)?;
    info!(policies = ?policies.policy_ids(), "Cedar policies loaded");
    let gate = Gate::new(
        trust_domain,
        Arc::new(std::sync::RwLock::new(Arc::new(policies))),
    );
    let errors = FileErrors::default();
    if let Some(dir) = config.federation.policy_dir.clone() {
        watch_dir(dir, inline, &gate, &errors, metrics, spawner);
    }
    let mut synced = None;
    if let StoreConfig::Kube(k) = &config.store
        && let Some(name) = config
            .federation
            .policy_configmap
            .as_deref()
            .filter(|n| !n.is_empty())
    {
        if config.federation.policy_dir.is_some() {
            warn!(configmap = %name, "--policy-dir is set: the policy ConfigMap is not read");
        } else {
            // Every replica answers queries, so every replica reads the policies.
            let watch = crate::authz_configmap::spawn_policy_configmap_into(
                k.client.clone(),
                &config.namespace,
                name,
                gate.clone(),
                errors.clone(),
                metrics.clone(),
                spawner.token().clone(),
            );
            synced = Some(watch.synced);
            spawner.watch("policy ConfigMap watch", watch.task);
        }
    }
    Ok(PolicyPart {
        gate,
        errors,
        synced,
    })
}

/// Reload the policies of `dir` (with `inline`) whenever its files change.
fn watch_dir(
    dir: PathBuf,
    inline: Vec<(String, String)>,
    gate: &Gate,
    errors: &FileErrors,
    metrics: &Metrics,
    spawner: &Spawner,
) {
    let cancel = spawner.token().clone();
    let (tx, mut rx) = mpsc::channel(1);
    let watcher = file::spawn_dir_watcher(
        vec![dir.clone()],
        Duration::from_secs(5),
        tx,
        cancel.clone(),
    );
    let (gate, errors, metrics) = (gate.clone(), errors.clone(), metrics.clone());
    spawner.spawn("policy directory watch", async move {
        let mut last_ids: Vec<String> = vec![];
        // What start-up loaded is what is in force.
        let mut files = PolicyFiles::new(dir.clone(), file::SETTLE);
        // Start-up already reported an error reading the directory.
        let _ = files.effective();
        loop {
            let due = files.next_due();
            tokio::select! {
                _ = cancel.cancelled() => break,
                got = rx.recv() => if got.is_none() { break },
                _ = async {
                    match due {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            reload(&mut files, &inline, &gate, &errors, &metrics, &mut last_ids);
        }
        watcher.abort();
        Ok(())
    });
}

/// The policy files as they are applied: a file that reads as empty keeps its last good text
/// (only deleting it removes its policies), and a change to a file that is in force (rewritten,
/// removed) is applied once the file has read the same for a settle time, so an in-place rewrite,
/// a write caught half-way or a `kubectl cp` never drops a policy (a `forbid` above all) for a
/// moment. A new file is applied at once.
pub(super) struct PolicyFiles {
    dir: PathBuf,
    settle: Duration,
    /// File name → text in force.
    applied: BTreeMap<String, String>,
    /// File name → (what it reads as now: `None` when gone, since when).
    unsettled: BTreeMap<String, (Option<String>, Instant)>,
    /// Files that read as empty (warned about once).
    empty: BTreeSet<String>,
}

impl PolicyFiles {
    pub(super) fn new(dir: PathBuf, settle: Duration) -> Self {
        Self {
            dir,
            settle,
            applied: BTreeMap::new(),
            unsettled: BTreeMap::new(),
            empty: BTreeSet::new(),
        }
    }

    /// When a change waiting to settle is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.unsettled
            .values()
            .map(|(_, since)| *since + self.settle)
            .min()
    }

    /// The sources to apply now, by file name in name order.
    pub(super) fn effective(&mut self) -> Result<Vec<(String, String)>, PolicyError> {
        let now = Instant::now();
        let mut current: BTreeMap<String, String> =
            Policies::dir_sources(&self.dir)?.into_iter().collect();
        let names: BTreeSet<String> = current.keys().chain(self.applied.keys()).cloned().collect();
        for name in names {
            let now_text = current.remove(&name);
            let Some(held) = self.applied.get(&name) else {
                // New: applied at once.
                self.unsettled.remove(&name);
                if let Some(text) = now_text {
                    self.applied.insert(name, text);
                }
                continue;
            };
            if now_text.as_deref() == Some(held.as_str()) {
                self.unsettled.remove(&name);
                self.empty.remove(&name);
                continue;
            }
            if let Some(text) = &now_text
                && text.trim().is_empty()
                && !held.trim().is_empty()
            {
                self.unsettled.remove(&name);
                if self.empty.insert(name.clone()) {
                    warn!(file = %name, "policy file is empty; keeping its last good policies (delete the file to remove them)");
                }
                continue;
            }
            self.empty.remove(&name);
            let settled = match self.unsettled.get(&name) {
                Some((seen, since)) if *seen == now_text => *since + self.settle <= now,
                _ => {
                    self.unsettled.insert(name.clone(), (now_text.clone(), now));
                    self.settle.is_zero()
                }
            };
            if settled {
                self.unsettled.remove(&name);
                match now_text {
                    Some(text) => self.applied.insert(name, text),
                    None => self.applied.remove(&name),
                };
            }
        }
        Ok(self
            .applied
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect())
    }
}

fn reload(
    files: &mut PolicyFiles,
    inline: &[(String, String)],
    gate: &Gate,
    errors: &FileErrors,
    metrics: &Metrics,
    last_ids: &mut Vec<String>,
) {
    let built = files.effective().and_then(|from_dir| {
        let mut sources = inline.to_vec();
        sources.extend(from_dir);
        Policies::from_sources(&sources)
    });
    match built {
        Ok(p) => {
            let ids = p.policy_ids();
            if ids != *last_ids || !errors.get().is_empty() {
                info!(policies = ?ids, "Cedar policies reloaded");
            }
            *last_ids = ids;
            gate.set_policies(p);
            errors.set(vec![]);
        }
        Err(e) => {
            let msg = e.to_string();
            if errors.get() != vec![msg.clone()] {
                metrics.store_errors.inc();
                warn!(error = %msg, "rejected policy change; keeping the previous policies");
            }
            errors.set(vec![msg]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORBID: &str = r#"
@id("no-restricted-for-c")
forbid (principal in Xcc::Cluster::"c1", action == Xcc::Action::"discover", resource)
when { resource.labels.contains("tier=restricted") };
"#;

    fn names(files: &mut PolicyFiles) -> Vec<String> {
        let sources = files.effective().expect("readable");
        Policies::from_sources(&sources)
            .expect("valid")
            .policy_ids()
            .into_iter()
            .filter(|id| id == "no-restricted-for-c" || id == "other")
            .collect()
    }

    /// A policy file emptied in place, caught half-way, unlinked for a copy or rewritten never
    /// drops its policies for a moment (the settle time is an hour, so each state is held still);
    /// a new file applies at once; once settled, a rewrite and a deletion apply.
    #[test]
    fn no_intermediate_state_of_a_policy_file_drops_a_policy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("forbid.cedar");
        std::fs::write(&f, FORBID).expect("write");
        let mut files = PolicyFiles::new(dir.path().to_path_buf(), Duration::from_secs(3600));
        assert_eq!(names(&mut files), ["no-restricted-for-c"]);
        std::fs::write(&f, "").expect("truncate");
        assert_eq!(names(&mut files), ["no-restricted-for-c"], "emptied");
        std::fs::write(&f, &FORBID[..FORBID.len() / 2]).expect("half");
        assert_eq!(names(&mut files), ["no-restricted-for-c"], "half written");
        std::fs::remove_file(&f).expect("unlink");
        assert_eq!(names(&mut files), ["no-restricted-for-c"], "unlinked");
        assert!(files.next_due().is_some());
        std::fs::write(&f, FORBID).expect("back");
        assert_eq!(names(&mut files), ["no-restricted-for-c"]);
        assert!(files.next_due().is_none());
        let other = FORBID.replace("no-restricted-for-c", "other");
        std::fs::write(dir.path().join("other.cedar"), &other).expect("new");
        assert_eq!(
            names(&mut files),
            ["no-restricted-for-c", "other"],
            "new: at once"
        );
        std::fs::write(&f, "// nothing\n").expect("rewrite");
        assert_eq!(
            names(&mut files),
            ["no-restricted-for-c", "other"],
            "rewrite waits"
        );

        files.settle = Duration::ZERO;
        assert_eq!(names(&mut files), ["other"], "settled");
        std::fs::remove_file(dir.path().join("other.cedar")).expect("rm");
        assert!(names(&mut files).is_empty());
    }
}
