//! The Multi-Cluster Services side of the binder (KEP-1645), pure: for each service imported
//! here or exported from here by a ServiceExport (KEP-1645: every cluster of the clusterset,
//! exporters included, has the ServiceImport; its endpoints are all exporters'), a `ServiceImport` named like its origin in the origin's namespace (namespace
//! sameness), beside the Service and EndpointSlices the binder already writes ([`desired`]):
//! - `spec.type: ClusterSetIP`, or `Headless` when that record is a headless export
//!   ([`xcc_proto::mcs::HEADLESS_ANNOTATION`]) — of the oldest export
//!   ([`xcc_proto::mcs::oldest_first`]) with usable ports, the verdict every cluster reaches —,
//!   `spec.ports` the union of the ports of the exports of that type (as the Service's,
//!   [`crate::desired::materialize`]), `spec.ips` (ClusterSetIP only): the cluster IPs of the
//!   binder's Service for the FQDN — what `xcc dns` answers for
//!   `<name>.<namespace>.svc.clusterset.local` (none until the API server allocated them);
//!   `spec.ipFamilies`: the family of each of those IPs, in their order (of a Headless import:
//!   the families of the endpoints' addresses, IPv4 first);
//! - `sessionAffinity` (and its config), `internalTrafficPolicy`, `trafficDistribution`: the
//!   oldest export's ([`xcc_proto::mcs::ServiceTraits`]), the defaults left unset;
//! - the labels and annotations the ServiceExports export
//!   ([`xcc_proto::mcs::EXPORTED_LABELS_ANNOTATION`], ...), the oldest export's value of a key
//!   holding, beside the binder's own (a label an export stops exporting stays until the
//!   ServiceImport is written for another reason: what is written is compared by inclusion);
//! - `status.clusters`: the source clusters of the records whose endpoints it has (an export a
//!   conflict leaves out altogether is not one), sorted;
//! - its EndpointSlices in the same namespace, with the MCS labels and owned by it
//!   ([`import_slices`]);
//! - the managed label and the install annotation of Cilium mode ([`cilium::INSTALL_ANNOTATION`]),
//!   so a binder writes and deletes only its own ServiceImports: one that Submariner, Cilium or
//!   another install made under the same name is never touched ([`may_write`], [`stale`]).
//!
//! [`crate::mcs_run`] applies the result.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use xcc_proto::crd::{
    BINDER_MANAGER, ENDPOINTSLICE_MANAGED_BY_LABEL, ENDPOINTSLICE_SERVICE_NAME_LABEL,
    MANAGED_BY_LABEL, PUBLISHER_MANAGER, ServiceRecord,
};
use xcc_proto::mcs::{
    CLIENT_IP, ClientIpConfig, ClusterStatus, MCS_SERVICE_NAME_LABEL, MCS_SOURCE_CLUSTER_LABEL,
    McsServicePort, ServiceImport, ServiceImportSpec, ServiceImportStatus, ServiceTraits,
    SessionAffinityConfig, TYPE_CLUSTER_SET_IP, TYPE_HEADLESS, is_headless,
    record_exported_metadata,
};
use xcc_proto::names::{self, EXPORT_LABEL, FQDN_ANNOTATION, IMPORTED_LABEL};

use crate::desired::cilium::{self, INSTALL_ANNOTATION, OriginKey};
use crate::desired::{GroupKey, Merged, materialize, merge, non_empty};

/// Why an origin gets no ServiceImport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The origin.
    pub origin: OriginKey,
    /// Why.
    pub reason: String,
}

/// The IPs clients of an import connect to: the cluster IPs of the binder's Service, the
/// addresses `xcc dns` answers for the import's `clusterset.local` name; empty before the API
/// server allocated them.
fn service_ips(service: Option<&Service>) -> Vec<String> {
    let spec = service.and_then(|s| s.spec.as_ref());
    match spec.and_then(|s| s.cluster_ips.clone()) {
        Some(ips) if !ips.is_empty() => ips,
        _ => spec
            .and_then(|s| s.cluster_ip.clone())
            .into_iter()
            .collect(),
    }
    .into_iter()
    .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
    .collect()
}

/// `IPv4` or `IPv6`: the family of `ip`, `None` when it is not an IP.
fn family(ip: &str) -> Option<String> {
    match ip.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(_) => Some("IPv4".into()),
        std::net::IpAddr::V6(_) => Some("IPv6".into()),
    }
}

/// The IP families of the records' endpoint addresses (what a headless name answers with),
/// `IPv4` before `IPv6`; the API server gives a headless selector-less Service both families
/// whatever its endpoints are, so its own say nothing.
fn endpoint_families(records: &[&ServiceRecord]) -> Vec<String> {
    let addresses = || records.iter().flat_map(|r| &r.spec.endpoints);
    let mut out = Vec::new();
    for (v6, name) in [(false, "IPv4"), (true, "IPv6")] {
        if addresses().any(|e| {
            e.address
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_ipv6() == v6)
        }) {
            out.push(name.to_string());
        }
    }
    out
}

/// The label selector of this cluster's exported ServiceRecords (the publisher's), which the
/// MCS writer reads for [`is_local_mcs_export`].
pub fn local_export_selector() -> String {
    format!("{MANAGED_BY_LABEL}={PUBLISHER_MANAGER},{EXPORT_LABEL}")
}

/// Whether `record` is this cluster's own MCS export (KEP-1645 gives the exporting cluster the
/// ServiceImport too, its endpoints among the others'): written by the publisher for a
/// ServiceExport (it carries the export's time, [`xcc_proto::mcs::EXPORTED_AT_ANNOTATION`]),
/// with an origin, not imported, not being deleted.
pub fn is_local_mcs_export(record: &ServiceRecord) -> bool {
    let labels = record.metadata.labels.as_ref();
    labels.is_some_and(|l| {
        l.get(MANAGED_BY_LABEL).map(String::as_str) == Some(PUBLISHER_MANAGER)
            && l.contains_key(EXPORT_LABEL)
            && !l.contains_key(IMPORTED_LABEL)
    }) && record.spec.origin.is_some()
        && record.metadata.deletion_timestamp.is_none()
        && xcc_proto::mcs::exported_at(record).is_some()
}

/// The ServiceImports the imported `records` (in the binder's namespace) and this cluster's own
/// MCS exports among them ([`is_local_mcs_export`]) call for, sorted by
/// namespace and name, and the origins that get none. `services` are the binder's Services
/// (looked up by namespace and name for their IPs); `install` is the binder's namespace.
pub fn desired(
    records: &[&ServiceRecord],
    services: &BTreeMap<(String, String), &Service>,
    install: &str,
) -> (Vec<ServiceImport>, Vec<Skipped>) {
    let (groups, _without_origin) = cilium::group_by_origin(records.iter().copied());
    let mut imports = Vec::new();
    let mut skipped = Vec::new();
    for (origin, group) in groups {
        // The same merge as the Service's: the oldest export's type, the union of the ports.
        let Ok(Merged {
            winner,
            ports,
            contributing,
            ..
        }) = merge(&group)
        else {
            skipped.push(Skipped {
                origin,
                reason: "no record has usable ports".into(),
            });
            continue;
        };
        let fqdn = names::canonical_fqdn(&winner.spec.fqdn).unwrap_or_default();
        // The binder's Service lives beside the imported records, in the binder's namespace
        // (this cluster's own export lives in the service's).
        let service = group
            .iter()
            .find(|r| !is_local_mcs_export(r))
            .and_then(|r| r.metadata.namespace.clone())
            .or_else(|| Some(install.to_string()))
            .and_then(|ns| services.get(&(ns, names::service_name(&fqdn))).copied());
        let headless = is_headless(winner);
        let traits = ServiceTraits::of_record(winner);
        let ips = if headless {
            Vec::new()
        } else {
            service_ips(service)
        };
        let members: Vec<&ServiceRecord> = contributing.iter().map(|(r, _)| *r).collect();
        let families = if headless {
            endpoint_families(&members)
        } else {
            ips.iter().filter_map(|ip| family(ip)).collect()
        };
        // The clusters whose endpoints the service has (not those a conflict left out).
        let clusters: BTreeSet<String> = members
            .iter()
            .filter_map(|r| cilium::source_cluster(r))
            .collect();
        let mut mcs_ports: Vec<McsServicePort> = ports
            .iter()
            .map(|p| McsServicePort {
                name: non_empty(&p.name),
                protocol: Some(p.protocol.as_str().into()),
                app_protocol: None,
                port: p.port,
            })
            .collect();
        mcs_ports.sort();
        // The exported labels and annotations of the exports whose endpoints it has, the
        // oldest export's value of a key holding; xcc's own keys over them.
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        let mut annotations: BTreeMap<String, String> = BTreeMap::new();
        for record in &members {
            let (l, a) = record_exported_metadata(record);
            for (k, v) in l {
                labels.entry(k).or_insert(v);
            }
            for (k, v) in a {
                annotations.entry(k).or_insert(v);
            }
        }
        labels.insert(MANAGED_BY_LABEL.to_string(), BINDER_MANAGER.to_string());
        annotations.insert(FQDN_ANNOTATION.to_string(), fqdn);
        annotations.insert(INSTALL_ANNOTATION.to_string(), install.to_string());
        imports.push(ServiceImport {
            metadata: ObjectMeta {
                name: Some(origin.name.clone()),
                namespace: Some(origin.namespace.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: ServiceImportSpec {
                ports: mcs_ports,
                type_: if headless {
                    TYPE_HEADLESS
                } else {
                    TYPE_CLUSTER_SET_IP
                }
                .into(),
                ips: (!ips.is_empty()).then_some(ips),
                ip_families: (!families.is_empty()).then_some(families),
                // The oldest export's Service fields; the defaults are left unset.
                session_affinity: traits.client_ip_timeout.map(|_| CLIENT_IP.to_string()),
                session_affinity_config: traits.client_ip_timeout.map(|t| SessionAffinityConfig {
                    client_ip: Some(ClientIpConfig {
                        timeout_seconds: Some(t),
                    }),
                }),
                internal_traffic_policy: traits.internal_local.then(|| "Local".to_string()),
                traffic_distribution: traits.traffic_distribution.clone(),
            },
            status: Some(ServiceImportStatus {
                clusters: Some(
                    clusters
                        .into_iter()
                        .map(|cluster| ClusterStatus { cluster })
                        .collect(),
                ),
            }),
        });
    }
    (imports, skipped)
}

/// The label selector of the ServiceImports' EndpointSlices ([`import_slices`]): the binder's,
/// with the MCS service-name label and without Kubernetes' (which the slices of the binder's
/// own Services carry).
pub fn import_slice_selector() -> String {
    format!(
        "{MANAGED_BY_LABEL}={BINDER_MANAGER},{MCS_SERVICE_NAME_LABEL},!{ENDPOINTSLICE_SERVICE_NAME_LABEL}"
    )
}

/// The EndpointSlices of each ServiceImport the imported `records` call for (KEP-1645), keyed
/// by the import's namespace and name: in the service's namespace, beside the ServiceImport,
/// one per source cluster, address family and port set with the endpoints the binder's
/// Service has ([`crate::desired::materialize`], the same merge), labelled
/// `multicluster.kubernetes.io/service-name` (the import's name),
/// `multicluster.kubernetes.io/source-cluster` and `endpointslice.kubernetes.io/managed-by:
/// xcc-binder` (not Kubernetes' controller), with the managed label and the install
/// annotation, and without `kubernetes.io/service-name`: they belong to no Service, so
/// kube-proxy and the EndpointSlice controllers leave them alone (traffic to the clusterset IP
/// goes through the binder's Service and its own slices). Their owner, the ServiceImport, is
/// set when it is written ([`owned_by`]). Origins with no ServiceImport get none.
pub fn import_slices(
    records: &[&ServiceRecord],
    install: &str,
) -> BTreeMap<(String, String), Vec<EndpointSlice>> {
    let (groups, _without_origin) = cilium::group_by_origin(records.iter().copied());
    let mut out = BTreeMap::new();
    for (origin, group) in groups {
        let Some(first) = group.first() else {
            continue;
        };
        let key = GroupKey {
            namespace: first.metadata.namespace.clone().unwrap_or_default(),
            fqdn: names::canonical_fqdn(&first.spec.fqdn).unwrap_or_default(),
        };
        let Ok(m) = materialize(&key, &group) else {
            continue;
        };
        let service_name = names::service_name(&key.fqdn);
        let slices = m
            .slices
            .into_iter()
            .map(|slice| {
                // `<service>-<family>-<hash8>` → `<origin>-<family>-<hash8>`.
                let own = slice.metadata.name.clone().unwrap_or_default();
                let suffix = own
                    .strip_prefix(&format!("{service_name}-"))
                    .unwrap_or(&own);
                let mut labels = BTreeMap::from([
                    (MCS_SERVICE_NAME_LABEL.to_string(), origin.name.clone()),
                    (
                        ENDPOINTSLICE_MANAGED_BY_LABEL.to_string(),
                        BINDER_MANAGER.to_string(),
                    ),
                    (MANAGED_BY_LABEL.to_string(), BINDER_MANAGER.to_string()),
                ]);
                if let Some(cluster) = slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(MCS_SOURCE_CLUSTER_LABEL))
                {
                    labels.insert(MCS_SOURCE_CLUSTER_LABEL.to_string(), cluster.clone());
                }
                EndpointSlice {
                    metadata: ObjectMeta {
                        name: Some(format!("{}-{suffix}", origin.name)),
                        namespace: Some(origin.namespace.clone()),
                        labels: Some(labels),
                        annotations: Some(BTreeMap::from([(
                            INSTALL_ANNOTATION.to_string(),
                            install.to_string(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    ..slice
                }
            })
            .collect();
        out.insert((origin.namespace, origin.name), slices);
    }
    out
}

/// `slice` owned by the ServiceImport `import` (as it is stored: with its UID), so the API
/// server's garbage collector removes the slices with it.
pub fn owned_by(mut slice: EndpointSlice, import: &ServiceImport) -> Option<EndpointSlice> {
    slice.metadata.owner_references = Some(vec![OwnerReference {
        api_version: ServiceImport::api_version(&()).into_owned(),
        kind: ServiceImport::kind(&()).into_owned(),
        name: import.metadata.name.clone()?,
        uid: import.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    Some(slice)
}

/// Whether a ServiceImport's EndpointSlice in the service's namespace is the binder of
/// `install`'s ([`import_slices`]).
pub fn is_our_import_slice(slice: &EndpointSlice, install: &str) -> bool {
    let labels = slice.metadata.labels.as_ref();
    cilium::is_ours(&slice.metadata, install)
        && labels.is_some_and(|l| {
            l.contains_key(MCS_SERVICE_NAME_LABEL)
                && !l.contains_key(ENDPOINTSLICE_SERVICE_NAME_LABEL)
                && l.get(ENDPOINTSLICE_MANAGED_BY_LABEL).map(String::as_str) == Some(BINDER_MANAGER)
        })
}

/// The binder's ServiceImport slices among `existing` (of `install`) that `desired` no longer
/// has, sorted by namespace and name.
pub fn stale_import_slices<'a>(
    existing: impl IntoIterator<Item = &'a EndpointSlice>,
    desired: &BTreeMap<(String, String), Vec<EndpointSlice>>,
    install: &str,
) -> Vec<&'a EndpointSlice> {
    let keep: BTreeSet<(Option<&String>, Option<&String>)> = desired
        .values()
        .flatten()
        .map(|d| (d.metadata.namespace.as_ref(), d.metadata.name.as_ref()))
        .collect();
    let mut out: Vec<&EndpointSlice> = existing
        .into_iter()
        .filter(|e| is_our_import_slice(e, install))
        .filter(|e| !keep.contains(&(e.metadata.namespace.as_ref(), e.metadata.name.as_ref())))
        .collect();
    out.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    out
}

/// Whether the binder of `install` may write over `existing`: nothing there, or its own.
pub fn may_write(existing: Option<&ServiceImport>, install: &str) -> bool {
    existing.is_none_or(|e| cilium::is_ours(&e.metadata, install))
}

/// What of `desired` differs in `existing`: (spec, labels or annotations differ; status
/// differs).
pub fn differs(existing: Option<&ServiceImport>, desired: &ServiceImport) -> (bool, bool) {
    let Some(existing) = existing else {
        return (true, true);
    };
    let contains = |have: &Option<BTreeMap<String, String>>,
                    want: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    let meta_ok = contains(&existing.metadata.labels, &desired.metadata.labels)
        && contains(
            &existing.metadata.annotations,
            &desired.metadata.annotations,
        );
    (
        !meta_ok || existing.spec != desired.spec,
        existing.status.as_ref().and_then(|s| s.clusters.as_ref())
            != desired.status.as_ref().and_then(|s| s.clusters.as_ref()),
    )
}

/// The binder's own ServiceImports among `existing` (of `install`) that `desired` no longer
/// has, sorted by namespace and name.
pub fn stale<'a>(
    existing: impl IntoIterator<Item = &'a ServiceImport>,
    desired: &[ServiceImport],
    install: &str,
) -> Vec<&'a ServiceImport> {
    let keep: BTreeSet<(Option<&String>, Option<&String>)> = desired
        .iter()
        .map(|d| (d.metadata.namespace.as_ref(), d.metadata.name.as_ref()))
        .collect();
    let mut out: Vec<&ServiceImport> = existing
        .into_iter()
        .filter(|e| cilium::is_ours(&e.metadata, install))
        .filter(|e| !keep.contains(&(e.metadata.namespace.as_ref(), e.metadata.name.as_ref())))
        .collect();
    out.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    out
}

#[cfg(test)]
mod tests;
