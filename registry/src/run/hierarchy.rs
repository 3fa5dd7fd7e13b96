//! The registry's place in the hierarchy: its [`Level`] with the grant sink of a file store, the
//! name-owner ledger read back before any child can attach, and the two tasks that decide again
//! when the policies or the catalog change.

use std::sync::Arc;

use prometheus_client::registry::Registry as Metrics;
use tracing::debug;
use xcc_controller::tasks::Spawner;

use super::{Core, RegistryConfig, StartError, StoreConfig};
use crate::authz::Gate;
use crate::federation::Level;
use crate::federation::grants::{FileGrants, GrantMode};
use crate::federation::level::{ConfigMapOwners, FileOwners, OwnerStore};

/// Build the level and start its tasks.
pub(super) async fn start(
    config: &RegistryConfig,
    core: &Core,
    gate: &Gate,
    metrics: &mut Metrics,
    spawner: &Spawner,
) -> Result<Level, StartError> {
    config
        .federation
        .grants()
        .check()
        .map_err(StartError::Grants)?;
    let level = Level::new(
        core.cluster.clone(),
        None,
        core.catalog.clone(),
        gate.clone(),
    );
    level.set_trust_domain(config.federation.grants().trust_domain_of(&core.cluster));
    metrics.sub_registry_with_prefix("xcc").register(
        "federation_queue_overflows",
        "Federation messages that did not fit a queue (each reset its session); expected 0",
        level.overflows(),
    );
    level.set_queue_limits(config.federation.queue_limits);
    level.set_queue_stall(config.federation.queue_stall);
    metrics.sub_registry_with_prefix("xcc").register(
        "federation_queued_bytes",
        "Encoded bytes queued on the federation sessions (to children and up to the parent)",
        level.queued_bytes(),
    );
    if let StoreConfig::File { state_dir, .. } = &config.store
        && config.federation.grant_mode != GrantMode::None
    {
        let grants = FileGrants::new(state_dir, config.federation.grants()).map_err(|source| {
            StartError::StateDir {
                path: state_dir.join("grants"),
                source,
            }
        })?;
        level.set_grant_sink(Arc::new(grants));
    }
    level.set_name_hold(config.federation.name_hold);
    // Names held for their owners are read back before any child can attach.
    let owners: Option<Arc<dyn OwnerStore>> = match &config.store {
        StoreConfig::Memory => None,
        StoreConfig::File { state_dir, .. } => Some(Arc::new(FileOwners::new(state_dir))),
        StoreConfig::Kube(k) => Some(Arc::new(ConfigMapOwners::new(
            k.client.clone(),
            &config.namespace,
        ))),
    };
    if let Some(store) = owners {
        let keep = level
            .keep_owners(store, spawner.token().clone())
            .await
            .map_err(StartError::Owners)?;
        spawner.spawn_infallible("name-owner ledger", keep);
    }
    on_policy_change(&level, gate, spawner);
    resolve_on_catalog_change(&level, core, spawner);
    Ok(level)
}

/// A new policy set: what children carry, grants and denied questions are decided again (open
/// Hamlet streams send their consumers the records whose decision changed, see
/// `hamlet::server`).
fn on_policy_change(level: &Level, gate: &Gate, spawner: &Spawner) {
    let (level, cancel, mut changes) = (level.clone(), spawner.token().clone(), gate.subscribe());
    spawner.spawn("policy change", async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                r = changes.changed() => if r.is_err() { break },
            }
            level.policies_changed();
        }
        Ok(())
    });
}

/// The resolver: re-evaluate grants whenever a service changes.
fn resolve_on_catalog_change(level: &Level, core: &Core, spawner: &Spawner) {
    let (level, cancel) = (level.clone(), spawner.token().clone());
    let mut events = core.catalog.subscribe();
    spawner.spawn("resolver", async move {
        loop {
            let ev = tokio::select! {
                _ = cancel.cancelled() => break,
                ev = events.recv() => ev,
            };
            match ev {
                Ok(ev) => level.on_catalog_event(&ev),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    // Bulk loads can outrun the feed: re-check every grant instead.
                    debug!(
                        missed = n,
                        "resolver fell behind the catalog; re-checking every grant"
                    );
                    level.recheck_grants();
                }
                Err(_) => break,
            }
        }
        Ok(())
    });
}
