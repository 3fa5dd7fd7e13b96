//! Plumbing every xcc controller process shares: Lease-based leader election ([`leader`]),
//! the `/healthz`, `/readyz` and `/metrics` endpoint ([`probes`]), the work queue of reconcile
//! keys ([`queue`]) and the Kubernetes client ([`client`]). Nothing here knows about ServiceRecords; the publisher, the binder and the
//! registry's Kubernetes store build on it.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod leader;
pub mod probes;
pub mod queue;

/// A Kubernetes client from the environment: `KUBECONFIG` / `~/.kube/config` when present,
/// otherwise the in-cluster service account.
pub async fn client() -> anyhow::Result<kube::Client> {
    use anyhow::Context as _;
    let config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration (neither KUBECONFIG nor in-cluster)")?;
    kube::Client::try_from(config).context("building the Kubernetes client")
}
