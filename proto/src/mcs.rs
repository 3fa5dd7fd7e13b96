//! The Kubernetes Multi-Cluster Services API (KEP-1645, `multicluster.x-k8s.io/v1alpha1`
//! `ServiceExport` / `ServiceImport`) and the About API's `ClusterProperty` (KEP-2149,
//! `about.k8s.io/v1alpha1`), as kube-rs types for what xcc reads and writes.
//!
//! These are not xcc's APIs: their CRDs are the upstream files, shipped unchanged under
//! `deploy/mcs/crds/` (mcs-api v0.5.0, about-api), never generated from these types. A test
//! checks these types against those schemas field by field ([`NOT_MODELLED`] lists the
//! upstream fields xcc neither reads nor writes), so an upstream change that these types miss
//! fails the build's tests. v1alpha1 is the version the tools users migrate from (Submariner /
//! Lighthouse, Cilium) speak; the upstream CRDs serve it beside v1beta1 with the same schema.
//!
//! What flows through here: the publisher reads ServiceExports and writes their status
//! conditions; the binder writes ServiceImports; the registry, publisher and binder read the
//! `cluster.clusterset.k8s.io` ClusterProperty as the cluster's name.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::{CustomResource, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of ServiceExport and ServiceImport.
pub const MCS_GROUP: &str = "multicluster.x-k8s.io";
/// API group of ClusterProperty.
pub const ABOUT_GROUP: &str = "about.k8s.io";
/// Name of the ClusterProperty holding this cluster's name within its ClusterSet (KEP-2149).
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";
/// Name of the ClusterProperty holding the ClusterSet's name (KEP-2149).
pub const CLUSTERSET_PROPERTY: &str = "clusterset.k8s.io";

/// EndpointSlice label: the ServiceImport (same namespace) the slice belongs to (KEP-1645).
pub const MCS_SERVICE_NAME_LABEL: &str = "multicluster.kubernetes.io/service-name";
/// EndpointSlice label: the cluster the slice's endpoints live in (KEP-1645).
pub const MCS_SOURCE_CLUSTER_LABEL: &str = "multicluster.kubernetes.io/source-cluster";

/// ServiceExport condition: the export is valid (reasons [`REASON_VALID`], [`REASON_NO_SERVICE`],
/// [`REASON_INVALID_SERVICE_TYPE`]).
pub const CONDITION_VALID: &str = "Valid";
/// ServiceExport condition: the service is exported (reasons [`REASON_EXPORTED`],
/// [`REASON_PENDING`], [`REASON_FAILED`], and `Refused<check>` ([`REASON_REFUSED_PREFIX`])
/// when the hierarchy refused it).
pub const CONDITION_READY: &str = "Ready";
/// ServiceExport condition: another cluster's export of the same name disagrees (reasons
/// [`REASON_PORT_CONFLICT`], [`REASON_TYPE_CONFLICT`], [`REASON_OWNER_CONFLICT`],
/// [`REASON_NO_CONFLICTS`]).
pub const CONDITION_CONFLICT: &str = "Conflict";
/// `Valid=True`.
pub const REASON_VALID: &str = "Valid";
/// `Valid=False`: no Service of the export's name in its namespace.
pub const REASON_NO_SERVICE: &str = "NoService";
/// `Valid=False`: the Service's type cannot be exported (ExternalName).
pub const REASON_INVALID_SERVICE_TYPE: &str = "InvalidServiceType";
/// `Ready=True`: exported to the registry.
pub const REASON_EXPORTED: &str = "Exported";
/// `Ready=False`/`Unknown`: not exported yet.
pub const REASON_PENDING: &str = "Pending";
/// `Ready=False`: the export failed; the message says why.
pub const REASON_FAILED: &str = "Failed";
/// `Conflict=True`: ports differ from another cluster's export.
pub const REASON_PORT_CONFLICT: &str = "PortConflict";
/// `Conflict=True`: type (headless or not) differs from another cluster's export.
pub const REASON_TYPE_CONFLICT: &str = "TypeConflict";
/// `Conflict=False`.
pub const REASON_NO_CONFLICTS: &str = "NoConflicts";
/// `Conflict=True` (xcc's own; KEP-1645 has no reason for it): the hierarchy refused to announce
/// the export because another service owns its name (the ServiceRecord's `Announced=False` with
/// reason [`crate::crd::ANNOUNCED_REASON_OWNER`] or [`crate::crd::ANNOUNCED_REASON_COLLISION`]);
/// the message names the owner. Where KEP-1645 merges the exports of one name, a hierarchy keeps
/// the first owner's.
pub const REASON_OWNER_CONFLICT: &str = "OwnerConflict";
/// `Ready=False` (xcc's own, in place of KEP-1645's unspecific `Failed`): the hierarchy refused
/// to announce the export; the reason is this prefix followed by the ServiceRecord's
/// `Announced` reason, which is the failed check (`RefusedOwner`, `RefusedCollision`,
/// `RefusedAnnounce`, `RefusedSubtree`, `RefusedSize`, ...), or this prefix alone when that
/// names none. The message carries the registry's explanation and the Cedar policy ids.
pub const REASON_REFUSED_PREFIX: &str = "Refused";

/// Record annotation (travels over Hamlet as a FederatedService label): the exported Service
/// is headless (`clusterIP: None`), its endpoints are the ready pod addresses, and importers
/// answer its name with them (ServiceImport `type: Headless`). Value [`HEADLESS_TRUE`].
pub const HEADLESS_ANNOTATION: &str = "connectivity.tanzu.vmware.com/headless";
/// The only value of [`HEADLESS_ANNOTATION`].
pub const HEADLESS_TRUE: &str = "true";
/// Record annotation of a headless export: the hostnames of its endpoints that have one, as
/// `address=hostname` pairs joined by `,`, sorted by address ([`format_hostnames`],
/// [`parse_hostnames`]). The MCS DNS name of such an endpoint is
/// `<hostname>.<cluster>.<service>.<namespace>.svc.clusterset.local`.
pub const HOSTNAMES_ANNOTATION: &str = "connectivity.tanzu.vmware.com/hostnames";

/// Whether a record is a headless export ([`HEADLESS_ANNOTATION`] is `true`).
pub fn is_headless(record: &crate::crd::ServiceRecord) -> bool {
    record
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HEADLESS_ANNOTATION))
        .is_some_and(|v| v == HEADLESS_TRUE)
}

/// The [`HOSTNAMES_ANNOTATION`] value of `hostnames` (address → hostname): the
/// `key=value,...` form of selectors.
pub fn format_hostnames(hostnames: &BTreeMap<String, String>) -> String {
    crate::names::format_selector(hostnames)
}

/// The address → hostname pairs of a [`HOSTNAMES_ANNOTATION`] value, addresses in canonical
/// text form. A pair whose address is not an IP or whose hostname is not a DNS-1123 label is
/// left out (counted in the second value); for an address listed twice the first pair counts.
pub fn parse_hostnames(value: &str) -> (BTreeMap<String, String>, usize) {
    let mut out = BTreeMap::new();
    let mut bad = 0;
    for pair in value.split(',').filter(|p| !p.is_empty()) {
        let parsed = pair.split_once('=').and_then(|(address, host)| {
            let ip = address.parse::<std::net::IpAddr>().ok()?;
            crate::mapping::validate_namespace(host).ok()?;
            Some((ip.to_string(), host.to_string()))
        });
        match parsed {
            Some((address, host)) => {
                out.entry(address).or_insert(host);
            }
            None => bad += 1,
        }
    }
    (out, bad)
}

/// The ready endpoints of an EndpointSlice, as (address, hostname) per address: IPv4 and IPv6
/// slices only; an endpoint whose `ready` condition is false is left out (unset counts as
/// ready, as in Kubernetes), so are addresses that are not IPs; a hostname only when it is a
/// DNS-1123 label.
pub fn ready_endpoints(
    slice: &k8s_openapi::api::discovery::v1::EndpointSlice,
) -> Vec<(std::net::IpAddr, Option<&str>)> {
    if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
        return Vec::new();
    }
    let mut out = Vec::new();
    for e in &slice.endpoints {
        if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
            continue;
        }
        let hostname = e
            .hostname
            .as_deref()
            .filter(|h| crate::mapping::validate_namespace(h).is_ok());
        for address in &e.addresses {
            if let Ok(ip) = address.parse() {
                out.push((ip, hostname));
            }
        }
    }
    out
}

/// The hostnames of a record's endpoints ([`parse_hostnames`] of its [`HOSTNAMES_ANNOTATION`],
/// invalid pairs left out); empty for a record that is not headless.
pub fn record_hostnames(record: &crate::crd::ServiceRecord) -> BTreeMap<String, String> {
    if !is_headless(record) {
        return BTreeMap::new();
    }
    record
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HOSTNAMES_ANNOTATION))
        .map(|v| parse_hostnames(v).0)
        .unwrap_or_default()
}

/// The cluster an imported ServiceRecord comes from (its MCS source cluster):
/// `spec.origin.cluster`, else the remote registry it was imported through.
pub fn source_cluster(record: &crate::crd::ServiceRecord) -> Option<&str> {
    record
        .spec
        .origin
        .as_ref()
        .and_then(|o| o.cluster.as_deref())
        .or_else(|| {
            record
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::names::REMOTE_REGISTRY_LABEL))
                .map(String::as_str)
        })
}

/// `ServiceExport`: the Service of the same name and namespace is exported to the ClusterSet.
///
/// Written by hand rather than derived: upstream makes `spec` optional and the usual
/// ServiceExport has none, which kube-rs' derived types cannot read. Serialised with its
/// `apiVersion` and `kind`, as the API server needs.
#[derive(Clone, Debug, PartialEq, Deserialize, Default)]
pub struct ServiceExport {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The spec, empty when the object has none.
    #[serde(default)]
    pub spec: ServiceExportSpec,
    /// The status the publisher writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ServiceExportStatus>,
}

impl Serialize for ServiceExport {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut obj = ser.serialize_struct("ServiceExport", 5)?;
        obj.serialize_field("apiVersion", &Self::api_version(&()))?;
        obj.serialize_field("kind", &Self::kind(&()))?;
        obj.serialize_field("metadata", &self.metadata)?;
        obj.serialize_field("spec", &self.spec)?;
        if let Some(status) = &self.status {
            obj.serialize_field("status", status)?;
        }
        obj.end()
    }
}

impl Resource for ServiceExport {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ServiceExport".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        MCS_GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "serviceexports".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Spec of a ServiceExport.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServiceExportSpec {
    /// Labels the importers' ServiceImport should carry (optional for implementations; xcc
    /// does not carry them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_labels: Option<BTreeMap<String, String>>,
    /// Annotations the importers' ServiceImport should carry (optional; not carried by xcc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_annotations: Option<BTreeMap<String, String>>,
}

/// Status of a ServiceExport: the `Valid`, `Ready` and `Conflict` conditions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServiceExportStatus {
    /// Conditions, a list map keyed by `type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// `ServiceImport`: a service imported from the clusters of the ClusterSet.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[kube(
    group = "multicluster.x-k8s.io",
    version = "v1alpha1",
    kind = "ServiceImport",
    namespaced,
    status = "ServiceImportStatus",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportSpec {
    /// Ports of the imported service.
    pub ports: Vec<McsServicePort>,
    /// [`TYPE_CLUSTER_SET_IP`] or [`TYPE_HEADLESS`].
    #[serde(rename = "type")]
    pub type_: String,
    /// The VIP (one per family) when the type is ClusterSetIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<String>>,
    /// The IP families of the service (`IPv4`, `IPv6`), in the order of `ips`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_families: Option<Vec<String>>,
    /// `ClientIP` or `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<String>,
}

/// `spec.type` of a ServiceImport with a VIP.
pub const TYPE_CLUSTER_SET_IP: &str = "ClusterSetIP";
/// `spec.type` of a ServiceImport whose DNS name answers with the endpoints.
pub const TYPE_HEADLESS: &str = "Headless";

/// A port of a ServiceImport.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McsServicePort {
    /// Port name (a DNS label), optional when there is one port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Application protocol hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    /// The port clients connect to.
    pub port: i32,
}

/// Status of a ServiceImport: the exporting clusters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportStatus {
    /// The clusters the service is imported from, a list map keyed by `cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<Vec<ClusterStatus>>,
}

/// One exporting cluster of a ServiceImport.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct ClusterStatus {
    /// The cluster's name (an RFC 1123 DNS label).
    pub cluster: String,
}

/// `ClusterProperty` (cluster-scoped): one named property of this cluster, e.g.
/// [`CLUSTER_ID_PROPERTY`].
#[derive(
    CustomResource, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default,
)]
#[kube(
    group = "about.k8s.io",
    version = "v1alpha1",
    kind = "ClusterProperty",
    derive = "PartialEq",
    derive = "Default"
)]
pub struct ClusterPropertySpec {
    /// The property's value.
    pub value: String,
}

/// Upstream schema fields (JSON paths from the object root, `[]` for list items) that these
/// types deliberately leave out, per kind: xcc neither reads nor writes them, and server-side
/// apply leaves them to whoever does.
pub const NOT_MODELLED: [(&str, &[&str]); 3] = [
    ("ServiceExport", &[]),
    (
        "ServiceImport",
        &[
            ".spec.internalTrafficPolicy",
            ".spec.sessionAffinityConfig",
            ".spec.trafficDistribution",
            ".status.conditions",
        ],
    ),
    ("ClusterProperty", &[]),
];

#[cfg(test)]
mod tests;
