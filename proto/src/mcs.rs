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
use k8s_openapi::jiff::Timestamp;
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

/// Record annotation (travels over Hamlet as a FederatedService label): when the export of the
/// service began — the `creationTimestamp` of the ServiceExport that exports it — in RFC 3339,
/// UTC, to the second (`2026-11-29T07:16:06Z`, [`format_exported_at`]). KEP-1645 resolves
/// conflicts between the exports of one name by age, the oldest winning; carrying the time with
/// the record lets every cluster, exporters and importers, reach the same verdict
/// ([`oldest_first`]). A record without it (an XCC label export, a plain Hamlet peer's) ranks
/// after every record with it.
pub const EXPORTED_AT_ANNOTATION: &str = "connectivity.tanzu.vmware.com/exported-at";

/// Longest [`EXPORTED_AT_ANNOTATION`] value read (an RFC 3339 time with nanoseconds and an
/// offset is 35 bytes).
const EXPORTED_AT_MAX: usize = 64;

/// The [`EXPORTED_AT_ANNOTATION`] value of `at`: RFC 3339 in UTC, whole seconds (as Kubernetes
/// keeps `creationTimestamp`).
pub fn format_exported_at(at: Timestamp) -> String {
    let second = Timestamp::from_second(at.as_second()).unwrap_or(at);
    second.to_string()
}

/// The time an [`EXPORTED_AT_ANNOTATION`] value gives, cut to whole seconds; `None` when it is
/// no RFC 3339 time (or longer than any is).
pub fn parse_exported_at(value: &str) -> Option<Timestamp> {
    if value.len() > EXPORTED_AT_MAX {
        return None;
    }
    let at: Timestamp = value.trim().parse().ok()?;
    Timestamp::from_second(at.as_second()).ok()
}

/// When the export of `record` began ([`EXPORTED_AT_ANNOTATION`]), if it says (and says it
/// well).
pub fn exported_at(record: &crate::crd::ServiceRecord) -> Option<Timestamp> {
    record
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPORTED_AT_ANNOTATION))
        .and_then(|v| parse_exported_at(v))
}

/// The order of the exports of one name, first the one whose definition wins (KEP-1645's
/// conflict resolution: the oldest export wins): by [`exported_at`], a record without it after
/// every record with it; ties by source cluster name ([`source_cluster`], none last). Only these
/// two travel with a record, so every cluster that sees the same exports orders them the same.
/// Two records equal in both (which two clusters never make: cluster names are unique in a
/// ClusterSet) are then ordered by UID and name, so the order is total in any one cluster.
pub fn oldest_first(
    a: &crate::crd::ServiceRecord,
    b: &crate::crd::ServiceRecord,
) -> std::cmp::Ordering {
    fn rank(r: &crate::crd::ServiceRecord) -> (bool, Option<Timestamp>, bool, Option<&str>) {
        let at = exported_at(r);
        let cluster = source_cluster(r);
        (at.is_none(), at, cluster.is_none(), cluster)
    }
    rank(a)
        .cmp(&rank(b))
        .then_with(|| a.metadata.uid.cmp(&b.metadata.uid))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// Who an export is, for people: `east (exported 2026-11-29T07:16:06Z)`, or the cluster alone
/// when the time is unknown.
pub fn shown_export(record: &crate::crd::ServiceRecord) -> String {
    let cluster = source_cluster(record).unwrap_or("an unnamed cluster");
    match exported_at(record) {
        Some(at) => format!("{cluster} (exported {})", format_exported_at(at)),
        None => format!("{cluster} (export time unknown)"),
    }
}

/// One port of an export, as the ports of the exports of one name are merged: (name, empty
/// when unnamed; port; protocol).
pub type ExportPort = (String, i32, crate::crd::Protocol);

/// `name:port/PROTOCOL`, or `port/PROTOCOL` for an unnamed port.
pub fn shown_port(p: &ExportPort) -> String {
    let (name, port, protocol) = p;
    if name.is_empty() {
        format!("{port}/{}", protocol.as_str())
    } else {
        format!("{name}:{port}/{}", protocol.as_str())
    }
}

/// A port of a later export that the merged ports cannot hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortClash {
    /// Index of the export (in the order given) whose port it is.
    pub export: usize,
    /// The port left out.
    pub port: ExportPort,
    /// The port already merged that it clashes with.
    pub kept: ExportPort,
    /// Index of the export that port came from.
    pub kept_from: usize,
}

/// The ports of the exports of one name merged (KEP-1645: the service's ports are the union of
/// its exporters' ports), `exports` in [`oldest_first`] order. A port is taken unless one already
/// taken clashes with it — the same name with another number or protocol (`PortConflict`), the
/// same number and protocol under another name, or an unnamed port beside any other (a
/// Service allows an unnamed port only alone) — so the oldest export's definition of a port
/// wins. Returns the merged ports, sorted, and the clashes in the order found.
pub fn merge_ports<'a>(
    exports: impl IntoIterator<Item = &'a [ExportPort]>,
) -> (Vec<ExportPort>, Vec<PortClash>) {
    let mut merged: Vec<(ExportPort, usize)> = Vec::new();
    let mut clashes = Vec::new();
    for (index, ports) in exports.into_iter().enumerate() {
        for port in ports {
            let (name, number, protocol) = port;
            let clash = merged.iter().find(|((n, p, proto), _)| {
                if n == name {
                    p != number || proto != protocol
                } else {
                    (p == number && proto == protocol) || n.is_empty() || name.is_empty()
                }
            });
            match clash {
                Some((kept, from)) => clashes.push(PortClash {
                    export: index,
                    port: port.clone(),
                    kept: kept.clone(),
                    kept_from: *from,
                }),
                None if merged.iter().any(|(p, _)| p == port) => {}
                None => merged.push((port.clone(), index)),
            }
        }
    }
    let mut ports: Vec<ExportPort> = merged.into_iter().map(|(p, _)| p).collect();
    ports.sort();
    (ports, clashes)
}

/// Record annotation (travels as a FederatedService label) of an MCS export: the Service's
/// `sessionAffinity` when it is `ClientIP` (absent: `None`), for the ServiceImport
/// ([`ServiceTraits`]).
pub const SESSION_AFFINITY_ANNOTATION: &str = "connectivity.tanzu.vmware.com/session-affinity";
/// Record annotation of an MCS export with `ClientIP` affinity: its
/// `sessionAffinityConfig.clientIP.timeoutSeconds` (1-86400).
pub const SESSION_AFFINITY_TIMEOUT_ANNOTATION: &str =
    "connectivity.tanzu.vmware.com/session-affinity-timeout";
/// Record annotation of an MCS export: the Service's `internalTrafficPolicy` when it is not the
/// default `Cluster` (so `Local`).
pub const INTERNAL_TRAFFIC_POLICY_ANNOTATION: &str =
    "connectivity.tanzu.vmware.com/internal-traffic-policy";
/// Record annotation of an MCS export: the Service's `trafficDistribution`, when set.
pub const TRAFFIC_DISTRIBUTION_ANNOTATION: &str =
    "connectivity.tanzu.vmware.com/traffic-distribution";

/// The keys of [`ServiceTraits`] on a record.
pub const TRAIT_KEYS: [&str; 4] = [
    SESSION_AFFINITY_ANNOTATION,
    SESSION_AFFINITY_TIMEOUT_ANNOTATION,
    INTERNAL_TRAFFIC_POLICY_ANNOTATION,
    TRAFFIC_DISTRIBUTION_ANNOTATION,
];

/// `sessionAffinity` value that needs carrying.
pub const CLIENT_IP: &str = "ClientIP";
/// The `timeoutSeconds` Kubernetes gives `ClientIP` affinity when none is set.
pub const DEFAULT_AFFINITY_TIMEOUT: i32 = 10_800;

/// The Service fields KEP-1645 carries to the ServiceImport besides type and ports, as an MCS
/// export's record carries them ([`TRAIT_KEYS`]), each in its canonical form: a default value
/// (`None` affinity, `Cluster` policy, no distribution) is absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceTraits {
    /// `Some(timeoutSeconds)` for `ClientIP` affinity; `None` for none.
    pub client_ip_timeout: Option<i32>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `trafficDistribution`, e.g. `PreferClose`.
    pub traffic_distribution: Option<String>,
}

/// Whether `v` may be a `trafficDistribution` value: 1-63 ASCII letters and digits, starting
/// with a letter (every value Kubernetes defines is so).
fn is_distribution(v: &str) -> bool {
    (1..=63).contains(&v.len())
        && v.starts_with(|c: char| c.is_ascii_alphabetic())
        && v.chars().all(|c| c.is_ascii_alphanumeric())
}

impl ServiceTraits {
    /// The traits of a Service's spec.
    pub fn of_service(spec: &k8s_openapi::api::core::v1::ServiceSpec) -> Self {
        let client_ip = spec.session_affinity.as_deref() == Some(CLIENT_IP);
        Self {
            client_ip_timeout: client_ip.then(|| {
                spec.session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds)
                    .filter(|t| (1..=86_400).contains(t))
                    .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
            }),
            internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            traffic_distribution: spec
                .traffic_distribution
                .clone()
                .filter(|v| is_distribution(v)),
        }
    }

    /// The traits `get` (a record's annotations, a peer's labels) gives, each checked: a value
    /// that is not one of its field's is left out (it reads as the default).
    pub fn of<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Self {
        let client_ip = get(SESSION_AFFINITY_ANNOTATION) == Some(CLIENT_IP);
        Self {
            client_ip_timeout: client_ip.then(|| {
                get(SESSION_AFFINITY_TIMEOUT_ANNOTATION)
                    .and_then(|t| t.parse::<i32>().ok())
                    .filter(|t| (1..=86_400).contains(t))
                    .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
            }),
            internal_local: get(INTERNAL_TRAFFIC_POLICY_ANNOTATION) == Some("Local"),
            traffic_distribution: get(TRAFFIC_DISTRIBUTION_ANNOTATION)
                .filter(|v| is_distribution(v))
                .map(str::to_string),
        }
    }

    /// The traits a record carries.
    pub fn of_record(record: &crate::crd::ServiceRecord) -> Self {
        let annotations = record.metadata.annotations.as_ref();
        Self::of(|k| annotations.and_then(|a| a.get(k)).map(String::as_str))
    }

    /// The record annotations of these traits (none for the defaults).
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Some(timeout) = self.client_ip_timeout {
            out.insert(
                SESSION_AFFINITY_ANNOTATION.to_string(),
                CLIENT_IP.to_string(),
            );
            out.insert(
                SESSION_AFFINITY_TIMEOUT_ANNOTATION.to_string(),
                timeout.to_string(),
            );
        }
        if self.internal_local {
            out.insert(
                INTERNAL_TRAFFIC_POLICY_ANNOTATION.to_string(),
                "Local".to_string(),
            );
        }
        if let Some(d) = &self.traffic_distribution {
            out.insert(TRAFFIC_DISTRIBUTION_ANNOTATION.to_string(), d.clone());
        }
        out
    }

    /// `sessionAffinity` for a ServiceImport or Service: `ClientIP` or `None`.
    pub fn session_affinity(&self) -> &'static str {
        if self.client_ip_timeout.is_some() {
            CLIENT_IP
        } else {
            "None"
        }
    }

    /// `internalTrafficPolicy`: `Local` or `Cluster`.
    pub fn internal_traffic_policy(&self) -> &'static str {
        if self.internal_local {
            "Local"
        } else {
            "Cluster"
        }
    }
}

/// Record annotation (travels as a FederatedService label) of an MCS export: the ServiceExport's
/// `spec.exportedLabels`, for the ServiceImport's labels, as a JSON object of strings
/// ([`exported_metadata`]).
pub const EXPORTED_LABELS_ANNOTATION: &str = "connectivity.tanzu.vmware.com/exported-labels";
/// Record annotation of an MCS export: the ServiceExport's `spec.exportedAnnotations`, for the
/// ServiceImport's annotations, as a JSON object of strings.
pub const EXPORTED_ANNOTATIONS_ANNOTATION: &str =
    "connectivity.tanzu.vmware.com/exported-annotations";

/// Longest [`EXPORTED_LABELS_ANNOTATION`] / [`EXPORTED_ANNOTATIONS_ANNOTATION`] value read or
/// written (bytes); a larger one is dropped whole.
pub const EXPORTED_METADATA_MAX: usize = 16 * 1024;

/// Whether `key` is a Kubernetes qualified name (a label or annotation key): an optional
/// DNS-1123 subdomain prefix and `/`, then 1-63 of `[A-Za-z0-9._-]` starting and ending
/// alphanumeric.
fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    prefix.is_none_or(crate::names::is_dns1123_subdomain)
        && !name.is_empty()
        && crate::names::is_label_value(name)
}

/// Whether a ServiceImport may carry the exported key `key`: not one xcc sets itself (the
/// managed-by label, `connectivity.tanzu.vmware.com/…`, the binder's install annotation).
fn exportable_key(key: &str) -> bool {
    key != crate::crd::MANAGED_BY_LABEL
        && !key.starts_with("connectivity.tanzu.vmware.com/")
        && !key.starts_with("binder.xcc/")
}

/// The exported labels (`labels`) or annotations of a ServiceExport as a ServiceImport may carry
/// them: entries whose key is a qualified name xcc does not set itself and, for labels, whose
/// value is a label value; the others are left out one by one.
pub fn exported_metadata(map: &BTreeMap<String, String>, labels: bool) -> BTreeMap<String, String> {
    map.iter()
        .filter(|(k, v)| {
            is_qualified_name(k)
                && exportable_key(k)
                && (!labels || crate::names::is_label_value(v))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The record annotation value of exported labels or annotations (a JSON object, keys sorted);
/// `None` when there is nothing or it is larger than [`EXPORTED_METADATA_MAX`].
pub fn format_exported_metadata(map: &BTreeMap<String, String>) -> Option<String> {
    let value = serde_json::to_string(map).ok()?;
    (!map.is_empty() && value.len() <= EXPORTED_METADATA_MAX).then_some(value)
}

/// The exported labels (`labels`) or annotations a record annotation value gives, checked as
/// [`exported_metadata`] does; empty when it is no JSON object of strings or too large.
pub fn parse_exported_metadata(value: &str, labels: bool) -> BTreeMap<String, String> {
    if value.len() > EXPORTED_METADATA_MAX {
        return BTreeMap::new();
    }
    serde_json::from_str::<BTreeMap<String, String>>(value)
        .map(|m| exported_metadata(&m, labels))
        .unwrap_or_default()
}

/// The exported (labels, annotations) a record carries.
pub fn record_exported_metadata(
    record: &crate::crd::ServiceRecord,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let get = |key: &str, labels: bool| {
        record
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(|v| parse_exported_metadata(v, labels))
            .unwrap_or_default()
    };
    (
        get(EXPORTED_LABELS_ANNOTATION, true),
        get(EXPORTED_ANNOTATIONS_ANNOTATION, false),
    )
}

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
    /// Labels the importers' ServiceImport should carry ([`EXPORTED_LABELS_ANNOTATION`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_labels: Option<BTreeMap<String, String>>,
    /// Annotations the importers' ServiceImport should carry
    /// ([`EXPORTED_ANNOTATIONS_ANNOTATION`]).
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
    /// The `ClientIP` affinity's timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `Cluster` or `Local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<String>,
    /// How traffic is distributed to the endpoints (`PreferClose`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<String>,
}

/// `sessionAffinityConfig` of a ServiceImport.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinityConfig {
    /// The `ClientIP` affinity's settings.
    #[serde(default, rename = "clientIP", skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<ClientIpConfig>,
}

/// `sessionAffinityConfig.clientIP` of a ServiceImport.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    /// Seconds a client sticks to one endpoint (1-86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
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
    ("ServiceImport", &[".status.conditions"]),
    ("ClusterProperty", &[]),
];

#[cfg(test)]
mod tests;
