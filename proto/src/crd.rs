//! The Kubernetes custom resources of xcc — `ServiceRecord` and `RemoteRegistry` in group
//! `connectivity.tanzu.vmware.com`, version `v1alpha1` — as kube-rs types, and the
//! CustomResourceDefinitions generated from them (`xcc crds`, `deploy/crds/*.yaml`).
//!
//! The schema keeps XCC v1's fields, types and required-ness exactly, so
//! XCC manifests apply unchanged; every addition is optional. What flows through here: the
//! publisher writes exported records, the registry writes imported records and RemoteRegistry
//! status, the binder reads imported records. The doc comments on fields are what `kubectl
//! explain` shows, so they are written for operators.
//!
//! The same types are what the standalone file store reads and writes ([`crate::resources`]
//! has the YAML documents and the checks beyond the schema).

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Condition type on a RemoteRegistry: the spec passed validation (`allowedDomains` rules of
/// XCC v1, address, TLS settings).
pub const CONDITION_VALID: &str = crate::names::VALID_CONDITION;
/// Condition type on a RemoteRegistry: a stream to the remote registry is established.
pub const CONDITION_CONNECTED: &str = "Connected";
/// Condition type on a RemoteRegistry: the imported records match the remote's latest snapshot.
pub const CONDITION_SYNCED: &str = "Synced";
/// Condition type on a ServiceRecord: the binder materialised it without a conflict.
pub const CONDITION_CONFLICT: &str = "Conflict";
/// Condition type on an exported ServiceRecord: `False` while the registry's parent refuses its
/// announcement (reason: the failed check; message: why, and the Cedar policy ids), `True` once
/// a refusal no longer stands. Absent on records that were never refused.
pub const CONDITION_ANNOUNCED: &str = "Announced";
/// `Announced=False` reason (the registry's check `owner`): a name of the record — its FQDN,
/// or its `namespace/name` — belongs to another service in the hierarchy (the first owner keeps
/// a name); the message names that owner.
pub const ANNOUNCED_REASON_OWNER: &str = "Owner";
/// `Announced=False` reason (the registry's check `collision`): the record's key (cluster,
/// namespace, name) is already held from elsewhere in the hierarchy; the message names where.
pub const ANNOUNCED_REASON_COLLISION: &str = "Collision";

/// Label the binder and publisher put on objects they manage (value: the component name).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// EndpointSlice label naming the controller that owns the slice.
pub const ENDPOINTSLICE_MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// EndpointSlice label naming the Service the slice belongs to.
pub const ENDPOINTSLICE_SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Value of [`ENDPOINTSLICE_MANAGED_BY_LABEL`] and [`MANAGED_BY_LABEL`] on binder objects.
pub const BINDER_MANAGER: &str = "xcc-binder";
/// Value of [`MANAGED_BY_LABEL`] on publisher objects.
pub const PUBLISHER_MANAGER: &str = "xcc-publisher";
/// Cilium: the Service is a global service (load-balanced across the cluster mesh).
pub const CILIUM_GLOBAL_ANNOTATION: &str = "service.cilium.io/global";
/// Cilium: whether this cluster shares its own endpoints of a global service.
pub const CILIUM_SHARED_ANNOTATION: &str = "service.cilium.io/shared";
/// Annotation on a binder-made Cilium global Service: the cluster its source lives in.
pub const SOURCE_CLUSTER_ANNOTATION: &str = "connectivity.tanzu.vmware.com/source-cluster";

/// A service reachable from other clusters: the DNS name clients use and the endpoints that
/// serve it.
///
/// Exported records carry the label `connectivity.tanzu.vmware.com/export` and live next to
/// the object they were published from; imported records carry
/// `connectivity.tanzu.vmware.com/imported` and `connectivity.tanzu.vmware.com/remote-registry`
/// and live in the registry's namespace. The annotation `connectivity.tanzu.vmware.com/service-port`
/// (decimal) gives the importer's Service port when `spec.ports` is unset.
#[derive(
    CustomResource, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default,
)]
#[kube(
    group = "connectivity.tanzu.vmware.com",
    version = "v1alpha1",
    kind = "ServiceRecord",
    namespaced,
    status = "ServiceRecordStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "xcc",
    doc = "A service reachable from other clusters: its DNS name and the endpoints serving it.",
    printcolumn = r#"{"name":"FQDN","type":"string","jsonPath":".spec.fqdn"}"#,
    printcolumn = r#"{"name":"Endpoints","type":"string","description":"Addresses of the endpoints","jsonPath":".spec.endpoints[*].address"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRecordSpec {
    /// DNS name of the service, e.g. `nginx.xcc.test`. Letters, digits, `-` and `.`; one
    /// trailing dot allowed; compared case-insensitively.
    #[schemars(length(min = 1, max = 254), regex(pattern = FQDN_PATTERN))]
    pub fqdn: String,
    /// Addresses serving the FQDN (IP addresses in practice). May be empty.
    pub endpoints: Vec<Endpoint>,
    /// Clusters allowed to import this service, by cluster name. Unset: every authenticated
    /// cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_requesters: Option<Vec<String>>,
    /// Ports of the service as importers should expose them. Unset: the single port of the
    /// `connectivity.tanzu.vmware.com/service-port` annotation, else of the endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ServicePort>>,
    /// The Kubernetes object this record was published from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
}

/// RE2 (the API server's regex dialect) pattern of `spec.fqdn`: dot-separated labels of 1-63
/// letters, digits and inner hyphens, with an optional trailing dot. Length is checked by
/// `maxLength`.
const FQDN_PATTERN: &str = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$";

/// RE2 pattern of `spec.ports[].name`: a DNS-1123 label (length by `maxLength`), the rule of
/// [`is_port_name`](crate::names::is_port_name).
const PORT_NAME_PATTERN: &str = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$";

/// One address serving a ServiceRecord.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// IP address of the endpoint (a DNS name is accepted but not materialised by the binder).
    #[schemars(length(min = 1))]
    pub address: String,
    /// Port on that address, 1-65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// Transport protocol of the port: `TCP` (default), `UDP` or `SCTP`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    Default,
)]
pub enum Protocol {
    /// TCP (the default).
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// The Kubernetes spelling: `TCP`, `UDP` or `SCTP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// Parse the Kubernetes spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// A named port of a ServiceRecord.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Name of the port, a DNS-1123 label as a Service's port names are (required when several
    /// ports are listed), e.g. `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = PORT_NAME_PATTERN))]
    pub name: Option<String>,
    /// Port number, 1-65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Transport protocol, `TCP` when unset. (`kubectl explain` shows [`Protocol`]'s text.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// Port on the endpoints that serves this port, when it differs from `port` (e.g. the
    /// node port of a NodePort Service). Unset: `port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub target_port: Option<i32>,
}

impl ServicePort {
    /// The protocol, `TCP` when unset.
    pub fn protocol(&self) -> Protocol {
        self.protocol.unwrap_or_default()
    }

    /// The port on the endpoints: `targetPort`, else `port`.
    pub fn target_port(&self) -> i32 {
        self.target_port.unwrap_or(self.port)
    }
}

/// The Kubernetes object a ServiceRecord was published from.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Origin {
    /// Cluster of the object. Unset: the cluster holding this record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Namespace of the object.
    #[schemars(length(min = 1))]
    pub namespace: String,
    /// Name of the object.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Kind of the object, e.g. `Service` or `HTTPProxy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Observed state of a ServiceRecord.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRecordStatus {
    /// Latest observations, e.g. `Conflict` when sources of the same FQDN disagree on ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` these observations are about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Callers granted access to this (exported) service through the hierarchy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
}

/// A caller granted access to an exported service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// Cluster of the caller.
    pub caller_cluster: String,
    /// Workload (service) of the caller inside its cluster, when the grant is that narrow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_service: Option<String>,
    /// When the grant was first made.
    pub since: Time,
}

/// Another registry: a flat Hamlet peer to import services from, or this registry's parent
/// in the hierarchy.
#[derive(
    CustomResource, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default,
)]
#[kube(
    group = "connectivity.tanzu.vmware.com",
    version = "v1alpha1",
    kind = "RemoteRegistry",
    namespaced,
    status = "RemoteRegistryStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "xcc",
    doc = "Another registry to import services from (a Hamlet peer) or this registry's parent.",
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Connected","type":"string","jsonPath":".status.conditions[?(@.type==\"Connected\")].status"}"#,
    printcolumn = r#"{"name":"Synced","type":"string","jsonPath":".status.conditions[?(@.type==\"Synced\")].status"}"#,
    printcolumn = r#"{"name":"Imported","type":"integer","jsonPath":".status.importedRecords"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RemoteRegistrySpec {
    /// gRPC address of the remote registry, `host:port`.
    #[schemars(length(min = 1))]
    pub address: String,
    /// How to verify the remote registry's server certificate.
    pub tls_config: TlsConfig,
    /// Import only FQDNs equal to or under these domains. Unset or empty: import everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_domains: Option<Vec<String>>,
    /// `Peer` when unset. (`kubectl explain` shows [`Role`]'s text: kube lifts an optional
    /// enum's own description onto the field.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// `Service` when unset. (`kubectl explain` shows [`Materialize`]'s text.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub materialize: Option<Materialize>,
    /// Services to request through a `Parent` registry, by namespace and name or by FQDN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imports: Option<Vec<Import>>,
}

impl RemoteRegistrySpec {
    /// `spec.role`, `Peer` when unset.
    pub fn role(&self) -> Role {
        self.role.unwrap_or_default()
    }

    /// `spec.materialize`, `Service` when unset.
    pub fn materialize(&self) -> Materialize {
        self.materialize.unwrap_or_default()
    }
}

/// TLS settings for dialling a remote registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub struct TlsConfig {
    /// PEM bundle of the CA(s) that sign the remote server's certificate, base64-encoded.
    /// Empty: use this registry's own CA bundle.
    // Not `format: byte` (XCC v1's schema): the API server refuses "" as a byte string, so the
    // empty value could not be written. The registry decodes it and reports a bad value in the
    // `Valid` condition.
    #[serde(rename = "serverCA")]
    pub server_ca: String,
    /// Name sent as SNI and checked against the server certificate.
    #[serde(rename = "serverName")]
    pub server_name: String,
}

/// `Peer` (default): a flat Hamlet peer; import everything its allowed domains admit.
/// `Parent`: this registry's parent in the hierarchy; announce exports to it and resolve
/// `imports` through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
pub enum Role {
    /// A flat Hamlet peer (the default).
    #[default]
    Peer,
    /// This registry's parent in the hierarchy.
    Parent,
}

/// How imported services appear in this cluster. `Service` (default): a selector-less ClusterIP
/// Service named after the FQDN, in the registry's namespace, with EndpointSlices.
/// `CiliumGlobalService`: a Cilium global Service with the origin's name and namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
pub enum Materialize {
    /// A selector-less ClusterIP Service plus EndpointSlices (the default).
    #[default]
    Service,
    /// A Cilium global Service with the origin's name and namespace.
    CiliumGlobalService,
}

/// The CRD's CEL rule on each `spec.imports[]` entry of a RemoteRegistry. [`Import::target`] is
/// the same rule in Rust (a test holds the two to the same table on a real API server).
pub const IMPORT_RULE: &str = "has(self.fqdn) ? !has(self.namespace) && !has(self.name) : has(self.namespace) && has(self.name)";
/// What the API server (and `RemoteRegistry::validate`) says when [`IMPORT_RULE`] is broken.
pub const IMPORT_RULE_MESSAGE: &str = "give either fqdn, or namespace and name";

/// A service requested through a parent registry: either `namespace` and `name` of the
/// exported object, or its `fqdn`.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema, Default,
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": IMPORT_RULE,
    "message": IMPORT_RULE_MESSAGE
}]))]
pub struct Import {
    /// FQDN of the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// Namespace of the exported object (with `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the exported object (with `namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Workload in this cluster that will call the service, when the grant should be that
    /// narrow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester_service: Option<String>,
    /// The calling workload's mesh identity, sent with the question: the owner's grant (an
    /// Istio AuthorizationPolicy, a CiliumNetworkPolicy) admits exactly this identity. Without
    /// it those grant modes open nothing for the import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester_identity: Option<RequesterIdentity>,
}

/// The mesh identity of the workload an [`Import`] is for:
/// `<trustDomain>/ns/<namespace>/sa/<serviceAccount>`.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema, Default,
)]
#[serde(rename_all = "camelCase")]
pub struct RequesterIdentity {
    /// Namespace of the calling workload.
    #[schemars(length(min = 1))]
    pub namespace: String,
    /// Service account of the calling workload.
    #[schemars(length(min = 1))]
    pub service_account: String,
    /// Trust domain of the calling workload. Unset: the one this registry's grant settings
    /// assign to its own cluster (`--grant-trust-domain`, `cluster.local` by default); the
    /// owner refuses any other than the one it assigns to this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
}

/// What an [`Import`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportTarget<'a> {
    /// By FQDN.
    Fqdn(&'a str),
    /// By namespace and name of the exported object.
    Object {
        /// Namespace.
        namespace: &'a str,
        /// Name.
        name: &'a str,
    },
}

impl Import {
    /// The target, or `None` when the fields do not name exactly one: [`IMPORT_RULE`] (the CRD
    /// rejects that).
    pub fn target(&self) -> Option<ImportTarget<'_>> {
        match (&self.fqdn, &self.namespace, &self.name) {
            (Some(fqdn), None, None) => Some(ImportTarget::Fqdn(fqdn)),
            (None, Some(namespace), Some(name)) => Some(ImportTarget::Object { namespace, name }),
            _ => None,
        }
    }
}

/// Observed state of a RemoteRegistry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RemoteRegistryStatus {
    /// `Valid` (spec accepted; reason `InvalidDomain` with XCC's message when
    /// `allowedDomains` is not), `Connected` (stream established) and `Synced` (imports match
    /// the remote's latest snapshot).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` these observations are about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Number of ServiceRecords currently imported from this registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_records: Option<i32>,
    /// When the imports last matched a complete snapshot of the remote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// `Parent` registries: the outcome of each `spec.imports` entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imports: Option<Vec<ImportStatus>>,
}

/// The outcome of one `spec.imports` entry of a `Parent` RemoteRegistry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ImportStatus {
    /// The FQDN asked for (when the import names an FQDN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// Namespace of the exported object asked for (with `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the exported object asked for (with `namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The requesting workload, as in the import.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester_service: Option<String>,
    /// `Granted`, `Denied`, `NotFound`, `Unavailable`, `Revoked`, `Pending` or `Refused`.
    pub state: String,
    /// Why (`Denied`: `NotAllowedByCallee`, `NotRequested` or `PolicyDenied`; `Refused`: the failed check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable detail (the deciding Cedar policies for `PolicyDenied`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The CustomResourceDefinitions of this API group, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![ServiceRecord::crd(), RemoteRegistry::crd()]
}

/// Header of every generated CRD file.
const GENERATED_HEADER: &str =
    "# Generated from proto/src/crd.rs by `xcc crds --dir deploy/crds`. Do not edit.\n";

/// Why the CRD YAML could not be produced.
#[derive(Debug, Error)]
#[error("serialising CRD {name}: {source}")]
pub struct CrdYamlError {
    name: String,
    source: yaml_serde::Error,
}

/// Each CRD as a YAML document with the generated-file header, keyed by file name
/// (`<crd name>.yaml`, e.g. `servicerecords.connectivity.tanzu.vmware.com.yaml`).
pub fn crd_files() -> Result<BTreeMap<String, String>, CrdYamlError> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let yaml = yaml_serde::to_string(&crd).map_err(|source| CrdYamlError {
                name: name.clone(),
                source,
            })?;
            Ok((format!("{name}.yaml"), format!("{GENERATED_HEADER}{yaml}")))
        })
        .collect()
}

/// Every CRD as one multi-document YAML stream (what `xcc crds` prints).
pub fn crds_yaml() -> Result<String, CrdYamlError> {
    Ok(crd_files()?
        .into_values()
        .map(|doc| format!("---\n{doc}"))
        .collect())
}

#[cfg(test)]
mod tests;
