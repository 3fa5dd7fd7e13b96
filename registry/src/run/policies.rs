//! The registry's Cedar policies: the defaults plus those given in code, a watched directory or
//! (kube store) a watched ConfigMap, held by one [`Gate`]. A rejected change keeps the set in
//! force and is reported in the policy errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};
use xcc_controller::tasks::Spawner;

use super::{RegistryConfig, StartError, StoreConfig};
use crate::authz::{Gate, Policies};
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
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                got = rx.recv() => if got.is_none() { break },
            }
            reload(&dir, &inline, &gate, &errors, &metrics, &mut last_ids);
        }
        watcher.abort();
        Ok(())
    });
}

fn reload(
    dir: &Path,
    inline: &[(String, String)],
    gate: &Gate,
    errors: &FileErrors,
    metrics: &Metrics,
    last_ids: &mut Vec<String>,
) {
    match Policies::from_dir_and(dir, inline) {
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
