//! The value types the federation modules share: what a requester asks for ([`Target`],
//! [`Question`]), who asks ([`WorkloadIdentity`]), what an owner exports ([`ExportedService`])
//! and the route it holds for a caller ([`OwnerRoute`]). This module depends on no other module
//! of `federation`: `convert`, `grants` and `level` use it, and the sessions above them.

use std::time::SystemTime;

use xcc_proto::names::{
    WORKLOAD_SELECTOR_ANNOTATION, is_dns1123_label, is_dns1123_subdomain, is_label_value,
};
use xcc_proto::xcc::federation::v1 as fed;

use crate::catalog::{NamedPort, ServiceEntry};

/// What a requester asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    Name { namespace: String, name: String },
    Fqdn(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Name { namespace, name } => write!(f, "{namespace}/{name}"),
            Target::Fqdn(fqdn) => f.write_str(fqdn),
        }
    }
}

impl Target {
    pub fn from_query(q: &fed::ServiceQuery) -> Self {
        if q.fqdn.is_empty() {
            Target::Name {
                namespace: q.namespace.clone(),
                name: q.name.clone(),
            }
        } else {
            Target::Fqdn(q.fqdn.trim_end_matches('.').to_ascii_lowercase())
        }
    }
}

/// A persistent question asked through the parent (an import): what is asked for, by which
/// service, and on behalf of which workload (the identity the owner's grant admits).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Question {
    pub target: Target,
    pub requester_service: String,
    pub identity: Option<WorkloadIdentity>,
}

impl Question {
    /// Asked as the cluster, with no workload identity.
    pub fn new(target: Target, requester_service: impl Into<String>) -> Self {
        Self {
            target,
            requester_service: requester_service.into(),
            identity: None,
        }
    }
}

/// A workload identity field that does not hold: the field, the value (quoted) and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("workload {field} {value:?} is not {rule}")]
pub struct IdentityError {
    pub field: &'static str,
    pub value: String,
    pub rule: &'static str,
}

/// A calling workload as the mesh names it: `<trust domain>/ns/<namespace>/sa/<service account>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadIdentity {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

impl WorkloadIdentity {
    /// The identity of three wire fields: all empty is no identity; otherwise each must hold
    /// (see [`WorkloadIdentity::check`]).
    pub fn from_wire(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Option<Self>, IdentityError> {
        if trust_domain.is_empty() && namespace.is_empty() && service_account.is_empty() {
            return Ok(None);
        }
        let id = Self {
            trust_domain: trust_domain.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
        };
        id.check().map(|()| Some(id))
    }

    /// The trust domain is a DNS name (lowercase, at most 253 characters: stricter than SPIFFE,
    /// which also allows `_`), the namespace a DNS-1123 label, the service account a DNS-1123
    /// subdomain of at most 63 characters (Cilium matches it as a label value). The error
    /// names the field and quotes the value.
    pub fn check(&self) -> Result<(), IdentityError> {
        let bad = |field, value: &str, rule| {
            Err(IdentityError {
                field,
                value: value.into(),
                rule,
            })
        };
        if !is_dns1123_subdomain(&self.trust_domain) {
            return bad("trust domain", &self.trust_domain, "a DNS name");
        }
        if !is_dns1123_label(&self.namespace) {
            return bad(
                "namespace",
                &self.namespace,
                "a namespace name (DNS-1123 label)",
            );
        }
        if !is_dns1123_subdomain(&self.service_account) || !is_label_value(&self.service_account) {
            return bad(
                "service account",
                &self.service_account,
                "a DNS-1123 subdomain of at most 63 characters",
            );
        }
        Ok(())
    }

    /// The three wire fields of an optional identity (empty for none).
    pub fn to_wire(id: Option<&Self>) -> (String, String, String) {
        id.map(|i| {
            (
                i.trust_domain.clone(),
                i.namespace.clone(),
                i.service_account.clone(),
            )
        })
        .unwrap_or_default()
    }

    /// The principal Istio matches (`source.principals`): the SPIFFE ID without `spiffe://`.
    pub fn principal(&self) -> String {
        format!(
            "{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl std::fmt::Display for WorkloadIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.principal())
    }
}

/// What a grant needs to know of the granted service: this registry's own export, as its
/// catalog entry holds it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ExportedService {
    pub fqdn: String,
    /// The exporting Service's name, when the export's origin is a Service.
    pub service: Option<String>,
    pub ports: Vec<NamedPort>,
    /// The exporting Service's pod selector, as the publisher wrote it
    /// ([`WORKLOAD_SELECTOR_ANNOTATION`], `key=value,...`), unparsed.
    pub selector: Option<String>,
}

impl ExportedService {
    pub fn of(entry: &ServiceEntry) -> Self {
        Self {
            fqdn: entry.fqdn.to_string(),
            service: entry
                .origin
                .as_ref()
                .filter(|o| o.kind == "Service")
                .map(|o| o.name.clone()),
            ports: entry.ports.clone(),
            selector: entry
                .labels
                .get(WORKLOAD_SELECTOR_ANNOTATION)
                .map(str::to_string),
        }
    }
}

/// A route this registry holds as the owner of the target service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRoute {
    pub target_namespace: String,
    pub target_service: String,
    pub caller_cluster: String,
    pub caller_service: String,
    /// The caller's workload identity from its query, if it sent one.
    pub caller_identity: Option<WorkloadIdentity>,
    /// The granted service as this registry (its owner) exports it.
    pub exported: ExportedService,
    pub resolver_cluster: String,
    pub since: SystemTime,
    /// Objects applied for the grant (per `--grant-mode`), as `Kind/namespace/name`.
    pub applied: Vec<String>,
}
