//! `CiliumGlobalService` materialisation: an imported service appears as a Cilium
//! global Service with the **origin's name and namespace** — Cilium's cluster mesh pairs global
//! services by name and namespace and load-balances to the remote cluster's endpoints — with no
//! selector and no local endpoints (`service.cilium.io/shared: "false"`).
//!
//! Pure: imported records in, desired Service / Namespace and orphan decisions out. The Service has
//! no owner reference: its lifetime follows the orphan rule ([`orphan_decision`]: gone with its
//! source, unless it has local endpoints), tracked by the managed label and the source-cluster
//! annotation.
//!
//! Global Services live outside the binder's namespace, where another xcc install may have
//! made some too. Each carries the install that made it ([`INSTALL_ANNOTATION`]: the binder's
//! namespace); a binder writes and deletes only its own. Any other global Service, one without
//! the annotation included, is foreign: never written, never deleted.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Namespace, Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use xcc_proto::crd::{
    BINDER_MANAGER, CILIUM_GLOBAL_ANNOTATION, CILIUM_SHARED_ANNOTATION, MANAGED_BY_LABEL,
    SOURCE_CLUSTER_ANNOTATION, ServiceRecord,
};
use xcc_proto::names::FQDN_ANNOTATION;

use super::{Port, PortError, resolved_ports, service_ports};

/// The xcc install that made a global Service: the namespace of its binder. Not an XCC
/// annotation (XCC has no Cilium mode); global Services without it are never touched.
pub const INSTALL_ANNOTATION: &str = "binder.xcc/install";

/// The origin object a group of imported records stands for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OriginKey {
    /// Namespace of the origin (its clusterset namespace): the Service's namespace here.
    pub namespace: String,
    /// Name of the origin: the Service's name here.
    pub name: String,
}

/// Why no Cilium global Service can be made for a group.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CiliumSkip {
    /// The group is empty.
    #[error("no imported records")]
    Empty,
    /// No record has usable ports.
    #[error("no record has usable ports: {0}")]
    NoPorts(PortError),
}

/// Imported records grouped by their origin (namespace, name), oldest export first
/// ([`xcc_proto::mcs::oldest_first`]); records without an origin cannot be materialised this way
/// and are returned apart, sorted by name.
pub fn group_by_origin<'a>(
    records: impl IntoIterator<Item = &'a ServiceRecord>,
) -> (
    BTreeMap<OriginKey, Vec<&'a ServiceRecord>>,
    Vec<&'a ServiceRecord>,
) {
    let mut groups: BTreeMap<OriginKey, Vec<&ServiceRecord>> = BTreeMap::new();
    let mut without = Vec::new();
    for record in records {
        match &record.spec.origin {
            Some(origin) => groups
                .entry(OriginKey {
                    namespace: origin.namespace.clone(),
                    name: origin.name.clone(),
                })
                .or_default()
                .push(record),
            None => without.push(record),
        }
    }
    for group in groups.values_mut() {
        group.sort_by(|a, b| xcc_proto::mcs::oldest_first(a, b));
    }
    without.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    (groups, without)
}

/// The cluster a record comes from: `spec.origin.cluster`, else its remote registry.
pub(crate) fn source_cluster(record: &ServiceRecord) -> Option<String> {
    xcc_proto::mcs::source_cluster(record).map(str::to_string)
}

/// The global Service for one origin: name and namespace of the origin, annotations
/// `service.cilium.io/global: "true"`, `service.cilium.io/shared: "false"`, the source
/// cluster(s) (sorted, comma-separated), the FQDN and `install` ([`INSTALL_ANNOTATION`]); ports
/// from the oldest export ([`xcc_proto::mcs::oldest_first`]) with usable ports; no selector;
/// the managed label.
pub fn global_service(
    key: &OriginKey,
    records: &[&ServiceRecord],
    install: &str,
) -> Result<Service, CiliumSkip> {
    let mut records = records.to_vec();
    records.sort_by(|a, b| xcc_proto::mcs::oldest_first(a, b));
    let Some(first) = records.first() else {
        return Err(CiliumSkip::Empty);
    };
    let ports: Vec<Port> = match records.iter().find_map(|r| resolved_ports(r).ok()) {
        Some(ports) => ports,
        None => {
            return Err(CiliumSkip::NoPorts(
                resolved_ports(first).err().unwrap_or(PortError::NoPort),
            ));
        }
    };
    let clusters: BTreeSet<String> = records.iter().filter_map(|r| source_cluster(r)).collect();
    let mut annotations = BTreeMap::from([
        (CILIUM_GLOBAL_ANNOTATION.to_string(), "true".to_string()),
        (CILIUM_SHARED_ANNOTATION.to_string(), "false".to_string()),
        (
            FQDN_ANNOTATION.to_string(),
            xcc_proto::names::canonical_fqdn(&first.spec.fqdn)
                .unwrap_or_else(|_| first.spec.fqdn.clone()),
        ),
        (INSTALL_ANNOTATION.to_string(), install.to_string()),
    ]);
    if !clusters.is_empty() {
        annotations.insert(
            SOURCE_CLUSTER_ANNOTATION.to_string(),
            clusters.into_iter().collect::<Vec<_>>().join(","),
        );
    }
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            labels: Some(managed_labels()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            ports: Some(service_ports(&ports)),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

fn managed_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY_LABEL.to_string(), BINDER_MANAGER.to_string())])
}

/// Whether `labels` carry the binder's managed label.
pub fn is_managed(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == BINDER_MANAGER)
}

/// The Namespace to create when the origin's namespace does not exist here, labelled as
/// managed (it is never deleted by the binder).
pub fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(managed_labels()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    }
}

/// Whether a binder made this object, and the binder of `install` at that: the managed label
/// and [`INSTALL_ANNOTATION`] `= install`.
pub fn is_ours(meta: &ObjectMeta, install: &str) -> bool {
    is_managed(meta)
        && meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(INSTALL_ANNOTATION))
            .is_some_and(|v| v == install)
}

/// Whether the binder of `install` may write the global Service over `existing`: nothing is
/// there, or it made it. A Service of the same name it did not make — another install's, or
/// nobody's — is left alone.
pub fn may_write(existing: Option<&Service>, install: &str) -> bool {
    existing.is_none_or(|s| is_ours(&s.metadata, install))
}

/// What to do with a managed global Service during the orphan check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrphanDecision {
    /// Leave it.
    Keep,
    /// Delete it.
    Delete,
}

/// The orphan rule for a Service (a copy whose source is gone goes, unless this cluster took it
/// over; docs/architecture.md, "What an importer may delete"): only those `install` made are considered; one whose
/// source still exists is kept; one whose source is gone is deleted unless it has local
/// endpoints (someone started serving it in this cluster).
pub fn orphan_decision(
    service: &Service,
    install: &str,
    source_present: bool,
    local_endpoints: usize,
) -> OrphanDecision {
    if !is_ours(&service.metadata, install) || source_present || local_endpoints > 0 {
        OrphanDecision::Keep
    } else {
        OrphanDecision::Delete
    }
}
