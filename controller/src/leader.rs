//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas of a controller never
//! write the same objects at once.
//!
//! [`run_as_leader`] waits until this replica holds the Lease, runs the work with a token that
//! is cancelled when leadership is lost, and releases the Lease on shutdown so a standby takes
//! over without waiting for expiry. Losing the Lease while working is an error: the process
//! should exit and restart from a clean state rather than keep acting on stale assumptions.

use std::future::Future;

use anyhow::Context as _;
use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::probes::Health;

/// Which Lease to contend for, and as whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease (the controller's own namespace).
    pub namespace: String,
    /// Lease name, one per controller kind (`xcc-publisher`, `xcc-binder`, ...).
    pub lease_name: String,
    /// This replica's identity (the pod name, made unique).
    pub identity: String,
    /// Seconds a holder's claim stays valid without renewal.
    pub lease_seconds: u64,
    /// Seconds before expiry at which the holder renews; must be below `lease_seconds`.
    pub renew_margin_seconds: u64,
}

impl LeaderConfig {
    /// Defaults: a 15 s lease renewed 5 s before it expires, identity from `POD_NAME` (else the
    /// host name) plus a random suffix, so a restarted pod never impersonates its predecessor.
    pub fn new(namespace: &str, lease_name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            lease_name: lease_name.to_string(),
            identity: default_identity(),
            lease_seconds: 15,
            renew_margin_seconds: 5,
        }
    }

    /// Check the timing parameters (the lease library panics on bad ones).
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.lease_seconds == 0 || self.renew_margin_seconds == 0 {
            anyhow::bail!("leader election: lease and renew margin must be at least 1 s");
        }
        if self.renew_margin_seconds >= self.lease_seconds {
            anyhow::bail!(
                "leader election: renew margin ({} s) must be shorter than the lease ({} s)",
                self.renew_margin_seconds,
                self.lease_seconds
            );
        }
        if self.lease_name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            anyhow::bail!("leader election: namespace, lease name and identity must be set");
        }
        Ok(())
    }
}

fn default_identity() -> String {
    use rand::Rng as _;
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "xcc".to_string());
    let suffix: u32 = rand::rng().random();
    format!("{host}-{suffix:08x}")
}

/// Run `work` while this replica leads. `None` runs it directly (leader election disabled).
///
/// Returns `Ok` when `cancel` fires (after `work` finished and the Lease was released), the
/// result of `work` when it ends on its own, and an error when leadership is lost.
pub async fn run_as_leader<F, Fut>(
    client: kube::Client,
    config: Option<LeaderConfig>,
    cancel: CancellationToken,
    on_leading: impl Fn(bool),
    work: F,
) -> anyhow::Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let Some(config) = config else {
        on_leading(true);
        return work(cancel.child_token()).await;
    };
    config.validate()?;
    let manager = LeaseManagerBuilder::new(client, &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(config.lease_seconds)
        .with_grace(config.renew_margin_seconds)
        .with_field_manager(format!("xcc-leader-{}", config.identity))
        .with_create_mode(LeaseCreateMode::AutoCreate)
        .build()
        .await
        .with_context(|| {
            format!(
                "preparing Lease {}/{} for leader election",
                config.namespace, config.lease_name
            )
        })?;
    let (mut leading, task) = manager.watch().await;
    let lease = format!("{}/{}", config.namespace, config.lease_name);
    info!(%lease, identity = %config.identity, "waiting to become leader");

    // Wait for leadership (or shutdown).
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            _ = cancel.cancelled() => {
                drop(leading);
                return finish(task, &lease).await;
            }
            changed = leading.changed() => if changed.is_err() {
                return match task.await {
                    Ok(Err(e)) => Err(anyhow::Error::from(e).context(format!("leader election on Lease {lease}"))),
                    Ok(Ok(_)) | Err(_) => Err(anyhow::anyhow!("leader election on Lease {lease} stopped")),
                };
            }
        }
    }
    info!(%lease, identity = %config.identity, "became leader");
    on_leading(true);

    let child = cancel.child_token();
    let work = work(child.clone());
    tokio::pin!(work);
    let result = tokio::select! {
        r = &mut work => r,
        _ = lost(&mut leading) => {
            warn!(%lease, "leadership lost; stopping work");
            child.cancel();
            let _ = work.await;
            on_leading(false);
            Err(anyhow::anyhow!("lost leadership of Lease {lease}"))
        }
    };
    on_leading(false);
    drop(leading);
    let released = finish(task, &lease).await;
    result.and(released)
}

/// [`run_as_leader`] for a controller whose readiness is `health`. A standby replica reports
/// ready: it is healthy and ready to take over, so a rolling update (new pod ready before the
/// old one stops and releases the Lease) never stalls. The leader is not ready from the moment
/// it leads until its work says so (after its first sync), nor once leadership ends.
pub async fn run_as_ready_leader<F, Fut>(
    client: kube::Client,
    config: Option<LeaderConfig>,
    cancel: CancellationToken,
    health: Health,
    work: F,
) -> anyhow::Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    if config.is_some() {
        health.set_ready(true);
    }
    run_as_leader(
        client,
        config,
        cancel,
        move |_| health.set_ready(false),
        work,
    )
    .await
}

/// Resolves when the watch says we are no longer the leader (or the watcher died).
async fn lost(leading: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if leading.changed().await.is_err() {
            return;
        }
        if !*leading.borrow_and_update() {
            return;
        }
    }
}

/// Wait for the lease task, which releases the Lease once its channel is closed.
async fn finish(
    task: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    lease: &str,
) -> anyhow::Result<()> {
    match task.await {
        Ok(Ok(_)) => {
            info!(%lease, "leader election stopped; Lease released");
            Ok(())
        }
        Ok(Err(e)) => {
            warn!(%lease, error = %e, "could not release the Lease; it will expire");
            Ok(())
        }
        Err(e) => Err(anyhow::Error::from(e).context("leader election task failed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_bad_timing() {
        let mut c = LeaderConfig::new("ns", "lease");
        assert!(c.validate().is_ok());
        c.renew_margin_seconds = 15;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "leader election: renew margin (15 s) must be shorter than the lease (15 s)"
        );
        c.renew_margin_seconds = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn identities_are_unique() {
        let a = LeaderConfig::new("ns", "l").identity;
        let b = LeaderConfig::new("ns", "l").identity;
        assert_ne!(a, b);
    }
}
