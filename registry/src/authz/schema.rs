//! The Cedar schema of xcc's entities and actions, the policies always in force, and the
//! entities a decision is made over (a service record, a requesting cluster or workload).

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::LazyLock;

use cedar_policy::{Entity, EntityTypeName, EntityUid, RestrictedExpression};

use super::{Policies, PolicyError};
use crate::catalog::ServiceEntry;

/// The Cedar schema of xcc's entities and actions.
pub const SCHEMA: &str = r#"
namespace Xcc {
  // A registry's cluster.
  entity Cluster = { name: String };
  // A workload (service) inside a cluster, the finer-grained requester.
  entity Workload in [Cluster] = { cluster: String, name: String };
  // An operator holding an admin certificate.
  entity Admin;
  // A service in the catalog.
  entity Service = {
    owner: String,
    namespace: String,
    name: String,
    fqdn: String,
    // Every label-wise suffix of the FQDN: "a.b.c" -> {"a.b.c", "b.c", "c"}.
    zones: Set<String>,
    // "name=value" for every policy label: the service's annotation
    // `connectivity.tanzu.vmware.com/<name>: <value>`, with a Kubernetes label name and value
    // and a name xcc does not use itself; at most 32 (registry/src/peer_labels.rs). The same
    // set at every level: they travel with the service, and only they do.
    labels: Set<String>,
    allowedRequesters: Set<String>,
  };
  type Bilateral = { calleeAdmits: Bool, callerRequested: Bool };
  action announce appliesTo { principal: [Cluster], resource: [Service] };
  action discover appliesTo { principal: [Cluster, Workload], resource: [Service], context: Bilateral };
  action import appliesTo { principal: [Cluster, Workload], resource: [Service], context: Bilateral };
  action admin appliesTo { principal: [Admin], resource: [Cluster] };
  // May the child (principal) carry the cluster (resource) in its subtree, i.e. speak for it?
  action carry appliesTo { principal: [Cluster], resource: [Cluster] };
}
"#;

/// Policies always in force; a policy directory adds to them.
pub const DEFAULT_POLICIES: &str = r#"
@id("bilateral")
permit (
  principal,
  action in [Xcc::Action::"discover", Xcc::Action::"import"],
  resource
) when { context.calleeAdmits && context.callerRequested };

@id("carry-self")
permit (principal, action == Xcc::Action::"carry", resource)
when { principal == resource };

@id("announce-clusterset")
permit (principal, action == Xcc::Action::"announce", resource)
when { resource.fqdn like "*.svc.clusterset.local" };
"#;

/// The schema's entity types, parsed once: Cedar parses a type name with its policy parser,
/// and a reload names one service per record.
static TYPES: LazyLock<Vec<(&'static str, EntityTypeName)>> = LazyLock::new(|| {
    [
        "Xcc::Service",
        "Xcc::Cluster",
        "Xcc::Workload",
        "Xcc::Action",
    ]
    .into_iter()
    .filter_map(|ty| Some((ty, EntityTypeName::from_str(ty).ok()?)))
    .collect()
});

pub(super) fn uid(ty: &str, id: &str) -> Result<EntityUid, PolicyError> {
    let ty = match TYPES.iter().find(|(name, _)| *name == ty) {
        Some((_, parsed)) => parsed.clone(),
        None => EntityTypeName::from_str(ty).map_err(|e| PolicyError::Internal(e.to_string()))?,
    };
    Ok(EntityUid::from_type_name_and_id(
        ty,
        cedar_policy::EntityId::new(id),
    ))
}

fn str_set(items: impl IntoIterator<Item = String>) -> RestrictedExpression {
    RestrictedExpression::new_set(items.into_iter().map(RestrictedExpression::new_string))
}

/// Every label-wise suffix of an FQDN.
pub fn zones_of(fqdn: &str) -> Vec<String> {
    let fqdn = fqdn.trim_end_matches('.').to_ascii_lowercase();
    let mut out = vec![];
    let mut rest = fqdn.as_str();
    loop {
        if !rest.is_empty() {
            out.push(rest.to_string());
        }
        match rest.split_once('.') {
            Some((_, tail)) => rest = tail,
            None => break,
        }
    }
    out
}

/// The Cedar entity of a service record: what a policy sees as `resource`. It depends on the
/// entry alone (not on the policies), so a caller may keep it with the entry's version.
pub fn service_entity(e: &ServiceEntry) -> Result<Entity, PolicyError> {
    let attrs = HashMap::from([
        (
            "owner".to_string(),
            RestrictedExpression::new_string(e.key.cluster.to_string()),
        ),
        (
            "namespace".to_string(),
            RestrictedExpression::new_string(e.key.namespace.to_string()),
        ),
        (
            "name".to_string(),
            RestrictedExpression::new_string(e.key.name.to_string()),
        ),
        (
            "fqdn".to_string(),
            RestrictedExpression::new_string(e.fqdn.to_string()),
        ),
        ("zones".to_string(), str_set(zones_of(&e.fqdn))),
        (
            "labels".to_string(),
            str_set(
                crate::peer_labels::policy_labels(e.labels.iter())
                    .map(|(name, value)| format!("{name}={value}")),
            ),
        ),
        (
            "allowedRequesters".to_string(),
            str_set(e.allowed_requesters.iter().cloned()),
        ),
    ]);
    Entity::new(
        uid("Xcc::Service", &e.key.to_string())?,
        attrs,
        HashSet::new(),
    )
    .map_err(|err| PolicyError::Internal(err.to_string()))
}

impl Policies {
    pub(super) fn principal(
        &self,
        cluster: &str,
        service: &str,
    ) -> Result<(EntityUid, Vec<Entity>), PolicyError> {
        let cluster_uid = uid("Xcc::Cluster", cluster)?;
        let cluster_entity = Entity::new(
            cluster_uid.clone(),
            HashMap::from([(
                "name".to_string(),
                RestrictedExpression::new_string(cluster.to_string()),
            )]),
            HashSet::new(),
        )
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
        if service.is_empty() {
            return Ok((cluster_uid, vec![cluster_entity]));
        }
        let workload_uid = uid("Xcc::Workload", &format!("{cluster}/{service}"))?;
        let workload = Entity::new(
            workload_uid.clone(),
            HashMap::from([
                (
                    "cluster".to_string(),
                    RestrictedExpression::new_string(cluster.to_string()),
                ),
                (
                    "name".to_string(),
                    RestrictedExpression::new_string(service.to_string()),
                ),
            ]),
            HashSet::from([cluster_uid]),
        )
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
        Ok((workload_uid, vec![cluster_entity, workload]))
    }
}
