//! What a level refuses and why: the refusal of one entry of a child's stream (sent back to it
//! as a [`fed::Rejection`] while the stream goes on), the key refused entries are kept by, and a
//! refused claim on a name ([`Clash`]).

use std::time::SystemTime;

use xcc_proto::xcc::federation::v1 as fed;

use crate::catalog::ServiceKey;

/// The status code a refusal carries on the wire ([`fed::Rejection::code`]): the gRPC code of
/// the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalCode {
    /// The entry does not hold (an invalid announcement).
    InvalidArgument,
    /// Another service holds the key or the name.
    AlreadyExists,
    /// No permit: the child does not carry the cluster, or a policy forbids the entry.
    PermissionDenied,
    /// The entry is over the size an entry may have.
    ResourceExhausted,
}

impl RefusalCode {
    /// The gRPC code number [`fed::Rejection::code`] holds.
    pub fn wire(self) -> i32 {
        match self {
            RefusalCode::InvalidArgument => 3,
            RefusalCode::AlreadyExists => 6,
            RefusalCode::PermissionDenied => 7,
            RefusalCode::ResourceExhausted => 8,
        }
    }
}

/// A refused entry: kind, cluster, namespace and name (a question by FQDN: its FQDN as name).
pub(super) type RefusedKey = (String, String, String, String);

/// [`fed::Rejection::kind`] of a refused question.
pub const QUERY_KIND: &str = "query";
/// [`fed::Rejection::kind`] of a refused announcement.
pub const ANNOUNCEMENT_KIND: &str = "announcement";

pub(super) fn refused_key(
    kind: &str,
    cluster: &str,
    namespace: &str,
    name: &str,
    fqdn: &str,
) -> RefusedKey {
    let name = match kind == QUERY_KIND && namespace.is_empty() && name.is_empty() {
        true => fqdn,
        false => name,
    };
    (
        kind.to_string(),
        cluster.to_string(),
        namespace.to_string(),
        name.to_string(),
    )
}

/// A refused claim on a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clash {
    pub at: SystemTime,
    pub fqdn: String,
    pub owner: ServiceKey,
    pub claimant: ServiceKey,
    pub refused_by: String,
}

impl std::fmt::Display for Clash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        write!(
            f,
            "{at} {} claimed {} owned by {}; refused by {}",
            self.claimant, self.fqdn, self.owner, self.refused_by
        )
    }
}

/// Why one entry of a child's stream was refused; sent back to the child as a
/// [`fed::Rejection`] while the stream goes on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {reason}")]
pub struct Refusal {
    pub code: RefusalCode,
    pub reason: String,
    /// The check that failed (see [`fed::Rejection::check`]).
    pub check: &'static str,
    /// The Cedar policies that decided it, if a policy did.
    pub policies: Vec<String>,
}

impl Refusal {
    pub fn new(check: &'static str, code: RefusalCode, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            check,
            policies: vec![],
        }
    }

    pub fn with_policies(self, policies: Vec<String>) -> Self {
        Self { policies, ..self }
    }

    /// The wire form for an entry about `cluster` (and service `namespace/name`, `fqdn`).
    pub fn to_rejection(
        &self,
        kind: &str,
        cluster: &str,
        namespace: &str,
        name: &str,
        fqdn: &str,
        refused_by: &str,
    ) -> fed::Rejection {
        fed::Rejection {
            kind: kind.to_string(),
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            fqdn: fqdn.to_string(),
            code: self.code.wire(),
            reason: self.reason.clone(),
            refused_by: refused_by.to_string(),
            check: self.check.to_string(),
            policy_ids: self.policies.clone(),
        }
    }
}
