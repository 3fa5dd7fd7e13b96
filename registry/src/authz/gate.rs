//! The one decision point every listener asks: binds a peer certificate to a requester and
//! decides with the policy set in force, swapped on reload.

use std::sync::{Arc, RwLock};

use xcc_certs::identity::Identity;

use super::{Decision, Policies, PolicyHandle, Verdict};
use crate::catalog::ServiceEntry;

/// Why a certificate is not accepted as a requester.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityRefused {
    #[error("{0} is not a cluster identity")]
    NotACluster(String),
    #[error("{0} is not an admin identity")]
    NotAnAdmin(String),
    #[error("{identity} belongs to trust domain {found:?}, not {expected:?}")]
    ForeignTrustDomain {
        identity: String,
        found: String,
        expected: String,
    },
}

impl From<IdentityRefused> for tonic::Status {
    fn from(e: IdentityRefused) -> Self {
        tonic::Status::permission_denied(e.to_string())
    }
}

/// The one authorization decision point. Every listener binds its peer's certificate with
/// [`Gate::cluster_of`] / [`Gate::admin_of`] and decides each service with [`Gate::discover`];
/// the federation level decides what a child may carry and announce with [`Gate::carry`] and
/// [`Policies::announce`]. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    trust_domain: Arc<str>,
    policies: PolicyHandle,
    /// Bumped whenever [`Gate::set_policies`] swaps the set: decisions already handed out
    /// (open Hamlet streams, grants, carried clusters) must be made again. Hamlet streams stay
    /// open and send each consumer only the records whose decision changed.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Gate {
    /// `trust_domain`: this registry's own (from its certificate); peers of any other are refused.
    pub fn new(trust_domain: impl Into<Arc<str>>, policies: PolicyHandle) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            policies,
            generation: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Put `policies` in force and tell every holder of an earlier decision.
    /// A set built from the same sources as the one in force changes nothing (file watchers
    /// re-read on every poll).
    pub fn set_policies(&self, policies: Policies) {
        let mut current = xcc_controller::plumbing::write(&self.policies);
        if current.same_sources(&policies) {
            return;
        }
        *current = Arc::new(policies);
        drop(current);
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Changes whenever the policy set is swapped.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// A gate over a fixed policy set (tests, benches).
    pub fn fixed(trust_domain: &str, policies: Policies) -> Self {
        Self::new(trust_domain, Arc::new(RwLock::new(Arc::new(policies))))
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn policy_handle(&self) -> &PolicyHandle {
        &self.policies
    }

    /// The policy set in force now.
    pub fn policies(&self) -> Arc<Policies> {
        xcc_controller::plumbing::read(&self.policies).clone()
    }

    fn same_domain(&self, id: &Identity) -> Result<(), IdentityRefused> {
        match id.trust_domain() {
            Some(td) if td == &*self.trust_domain => Ok(()),
            Some(td) => Err(IdentityRefused::ForeignTrustDomain {
                identity: id.spiffe_id().unwrap_or_else(|| id.to_string()),
                found: td.to_string(),
                expected: self.trust_domain.to_string(),
            }),
            None => Err(IdentityRefused::NotACluster(id.to_string())),
        }
    }

    /// The cluster a peer certificate speaks for: a cluster identity of this trust domain.
    /// Admin certificates, certificates without an xcc identity (DNS SAN or CN only) and
    /// identities of another trust domain are refused, whatever their name.
    pub fn cluster_of(&self, id: &Identity) -> Result<String, IdentityRefused> {
        match id {
            Identity::Cluster { name, .. } => {
                self.same_domain(id)?;
                Ok(name.clone())
            }
            _ => Err(IdentityRefused::NotACluster(id.to_string())),
        }
    }

    /// The operator an admin certificate names: an admin identity of this trust domain.
    pub fn admin_of(&self, id: &Identity) -> Result<String, IdentityRefused> {
        match id {
            Identity::Admin { name, .. } => {
                self.same_domain(id)?;
                Ok(name.clone())
            }
            _ => Err(IdentityRefused::NotAnAdmin(id.to_string())),
        }
    }

    /// The bilateral decision for `cluster` (already bound by [`Gate::cluster_of`] or vouched
    /// for by the federation tree) and optional `service` asking for `entry`.
    pub fn discover(
        &self,
        entry: &ServiceEntry,
        cluster: &str,
        service: &str,
        requested: bool,
    ) -> Decision {
        self.policies().discover(entry, cluster, service, requested)
    }

    /// May `child` carry `cluster` in its subtree?
    pub fn carry(&self, child: &str, cluster: &str) -> Verdict {
        self.policies().carry(child, cluster)
    }

    /// May `cluster` announce `entry`?
    pub fn announce(&self, cluster: &str, entry: &ServiceEntry) -> Verdict {
        self.policies().announce(cluster, entry)
    }
}
