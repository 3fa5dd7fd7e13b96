//! The Kubernetes objects of XCC (`ServiceRecord`, `RemoteRegistry`, group
//! `connectivity.tanzu.vmware.com/v1alpha1`) as serde shapes, and reading / writing them as
//! multi-document YAML or JSON — the form they take in manifests and in the standalone file
//! store.
//!
//! The field names are XCC v1's (reference §2.2–2.3), so existing manifests parse unchanged; our
//! additions (allowed requesters, named ports, origin, role, materialisation mode) are optional.
//! The `*Spec` structs stand alone so they can later back kube custom resources. Errors from
//! [`parse_documents`] name the file, the document and the field path; [`ServiceRecord::validate`]
//! and [`RemoteRegistry::validate`] name the offending field.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use thiserror::Error;

use crate::names::{API_VERSION, REMOTE_REGISTRY_KIND, SERVICE_RECORD_KIND};

mod validate;

pub use validate::is_dns1123_subdomain;

/// `spec.role` of a RemoteRegistry that is a flat Hamlet peer (the default).
pub const ROLE_PEER: &str = "Peer";
/// `spec.role` of a RemoteRegistry that is this registry's parent in the hierarchy.
pub const ROLE_PARENT: &str = "Parent";
/// `spec.materialize`: imports become selector-less Services (the default).
pub const MATERIALIZE_SERVICE: &str = "Service";
/// `spec.materialize`: imports become Cilium global Services.
pub const MATERIALIZE_CILIUM_GLOBAL_SERVICE: &str = "CiliumGlobalService";

/// Why a resource could not be read, written or accepted.
#[derive(Debug, Error)]
pub enum ResourceError {
    /// A document of a YAML/JSON stream could not be parsed into the expected object.
    #[error("{file}: document {document}: {}", with_path(.path.as_deref(), .message))]
    Document {
        /// Where the text came from (a file name or another label).
        file: String,
        /// 1-based position of the document in the stream (empty documents count).
        document: usize,
        /// Field path inside the document, e.g. `spec.endpoints[0].port`.
        path: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// The object parsed but breaks a rule; every broken rule is listed.
    #[error("invalid {kind} {name:?}: {}", join_violations(.violations))]
    Invalid {
        /// `ServiceRecord` or `RemoteRegistry`.
        kind: &'static str,
        /// `metadata.name` (namespace-qualified when a namespace is set).
        name: String,
        /// The broken rules, in field order.
        violations: Vec<FieldViolation>,
    },
    /// A base64 (`format: byte`) field does not decode.
    #[error("{path}: invalid base64: {source}")]
    Base64 {
        /// Field path.
        path: &'static str,
        /// The decoder's error.
        source: base64::DecodeError,
    },
    /// An object could not be serialised.
    #[error("serialising document {document}: {source}")]
    Serialize {
        /// 1-based position of the object.
        document: usize,
        /// The serialiser's error.
        source: yaml_serde::Error,
    },
}

fn with_path(path: Option<&str>, message: &str) -> String {
    match path {
        Some(path) => format!("{path}: {message}"),
        None => message.to_string(),
    }
}

fn join_violations(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One broken rule: the field path and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldViolation {
    /// Field path, e.g. `spec.endpoints[1].port`.
    pub path: String,
    /// What is wrong, e.g. `70000 is out of range 1-65535`.
    pub message: String,
}

impl std::fmt::Display for FieldViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Kubernetes-style `null` handling: an explicit `null` reads as the default value.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The part of Kubernetes `metadata` xcc reads and writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Object name.
    #[serde(default)]
    pub name: String,
    /// Namespace; unset means the reader's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
    /// Unique id assigned by the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Spec generation, bumped by the API server on spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Opaque version for optimistic concurrency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// A service reachable through xcc: the FQDN clients use and the endpoints that serve it.
/// Exported records carry the `connectivity.tanzu.vmware.com/export` label, imported ones
/// `connectivity.tanzu.vmware.com/imported`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRecordSpec {
    /// DNS name of the service, e.g. `nginx.xcc.test`.
    pub fqdn: String,
    /// Addresses serving the FQDN (IPs in practice; Hamlet also allows DNS names). May be empty.
    pub endpoints: Vec<Endpoint>,
    /// Clusters allowed to import this service; unset means every authenticated cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_requesters: Option<Vec<String>>,
    /// Named ports of the service; unset means the single port of the endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ServicePort>>,
    /// The in-cluster object this record was published from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
}

/// One address serving a ServiceRecord.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// IP address (or DNS name) of the endpoint.
    pub address: String,
    /// Port, 1-65535.
    pub port: u32,
}

/// A named port of a ServiceRecord.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// IANA service name (required when several ports are listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Port, 1-65535.
    pub port: u32,
    /// `TCP` (default), `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// The object a ServiceRecord was published from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Origin {
    /// Cluster of the object (unset: this cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// Kind of the object, e.g. `Service` or `HTTPProxy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Another registry to import services from (a flat Hamlet peer) or this registry's parent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RemoteRegistrySpec {
    /// gRPC address of the remote registry, `host:port`.
    pub address: String,
    /// How to verify the remote registry's server certificate.
    pub tls_config: RemoteTlsConfig,
    /// Import only FQDNs equal to or under these domains; unset or empty imports everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_domains: Option<Vec<String>>,
    /// `Peer` (default): import over Hamlet. `Parent`: this registry's parent in the hierarchy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// How imports are materialised: `Service` (default) or `CiliumGlobalService`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub materialize: Option<String>,
    /// With `role: Parent`: the services this cluster asks the hierarchy for. Granted answers
    /// become imported ServiceRecords.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imports: Option<Vec<HierarchyImport>>,
}

/// One service requested through the hierarchy: by `namespace` + `name`, or by `fqdn`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct HierarchyImport {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// The workload that will call the service (for the callee's allowed requesters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester_service: Option<String>,
}

/// TLS settings for dialling a remote registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RemoteTlsConfig {
    /// PEM CA bundle that signs the remote server's certificate, base64-encoded. Empty: use this
    /// registry's own CA bundle.
    #[serde(rename = "serverCA", default)]
    pub server_ca: String,
    /// Name to send as SNI and to verify the server certificate against.
    #[serde(rename = "serverName")]
    pub server_name: String,
}

impl RemoteTlsConfig {
    /// The PEM bytes of `serverCA`, or `None` when it is empty. Whitespace (line breaks in a
    /// folded YAML string) is ignored and padding is optional.
    pub fn server_ca_pem(&self) -> Result<Option<Vec<u8>>, ResourceError> {
        let compact: String = self
            .server_ca
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        if compact.is_empty() {
            return Ok(None);
        }
        base64_engine()
            .decode(compact.as_bytes())
            .map(Some)
            .map_err(|source| ResourceError::Base64 {
                path: "spec.tlsConfig.serverCA",
                source,
            })
    }
}

/// Standard alphabet, padding optional (Go writes it, hand-made manifests often drop it).
fn base64_engine() -> base64::engine::GeneralPurpose {
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    )
}

/// A Kubernetes object type of this API group, for the apiVersion/kind checks of
/// [`parse_documents`].
pub trait ResourceKind: Serialize + DeserializeOwned {
    /// The `kind` field value.
    const KIND: &'static str;
    /// The `apiVersion` field value.
    const API_VERSION: &'static str = API_VERSION;
}

/// A `ServiceRecord` object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRecord {
    /// Always `connectivity.tanzu.vmware.com/v1alpha1`.
    pub api_version: String,
    /// Always `ServiceRecord`.
    pub kind: String,
    /// Object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The record.
    pub spec: ServiceRecordSpec,
}

impl ResourceKind for ServiceRecord {
    const KIND: &'static str = SERVICE_RECORD_KIND;
}

impl ServiceRecord {
    /// A ServiceRecord with the right apiVersion and kind.
    pub fn new(metadata: ObjectMeta, spec: ServiceRecordSpec) -> Self {
        ServiceRecord {
            api_version: API_VERSION.to_string(),
            kind: SERVICE_RECORD_KIND.to_string(),
            metadata,
            spec,
        }
    }
}

impl Default for ServiceRecord {
    fn default() -> Self {
        ServiceRecord::new(ObjectMeta::default(), ServiceRecordSpec::default())
    }
}

/// A `RemoteRegistry` object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteRegistry {
    /// Always `connectivity.tanzu.vmware.com/v1alpha1`.
    pub api_version: String,
    /// Always `RemoteRegistry`.
    pub kind: String,
    /// Object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The desired connection.
    pub spec: RemoteRegistrySpec,
    /// Status as read; carried through unchanged, never interpreted here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

impl ResourceKind for RemoteRegistry {
    const KIND: &'static str = REMOTE_REGISTRY_KIND;
}

impl RemoteRegistry {
    /// A RemoteRegistry with the right apiVersion and kind and no status.
    pub fn new(metadata: ObjectMeta, spec: RemoteRegistrySpec) -> Self {
        RemoteRegistry {
            api_version: API_VERSION.to_string(),
            kind: REMOTE_REGISTRY_KIND.to_string(),
            metadata,
            spec,
            status: None,
        }
    }
}

impl Default for RemoteRegistry {
    fn default() -> Self {
        RemoteRegistry::new(ObjectMeta::default(), RemoteRegistrySpec::default())
    }
}

/// Parse every non-empty document of a YAML (or JSON) stream as a `T`. `file` names the origin
/// in errors, which also give the 1-based document number and the field path:
/// `exports/web.yaml: document 1: spec.endpoints[0].port: invalid type: string "x", expected u32`.
/// Each document's `apiVersion` and `kind` must be those of `T`.
pub fn parse_documents<T: ResourceKind>(text: &str, file: &str) -> Result<Vec<T>, ResourceError> {
    parse_documents_of_kind(text, file, T::API_VERSION, T::KIND)
}

/// [`parse_documents`] for any deserialisable `T`, with the expected `apiVersion` and `kind`
/// given explicitly.
pub fn parse_documents_of_kind<T: DeserializeOwned>(
    text: &str,
    file: &str,
    api_version: &str,
    kind: &str,
) -> Result<Vec<T>, ResourceError> {
    let mut items = Vec::new();
    for (i, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let number = i + 1;
        let error = |path: Option<&str>, message: String| ResourceError::Document {
            file: file.to_string(),
            document: number,
            path: path.map(str::to_string),
            message,
        };
        let value =
            yaml_serde::Value::deserialize(document).map_err(|e| error(None, e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let Some(mapping) = value.as_mapping() else {
            return Err(error(None, format!("expected a {kind} object (a mapping)")));
        };
        check_type_field(mapping, "apiVersion", api_version)
            .map_err(|m| error(Some("apiVersion"), m))?;
        check_type_field(mapping, "kind", kind).map_err(|m| error(Some("kind"), m))?;
        let item: T = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let path = (path != ".").then_some(path);
            error(path.as_deref(), e.into_inner().to_string())
        })?;
        items.push(item);
    }
    Ok(items)
}

fn check_type_field(
    mapping: &yaml_serde::Mapping,
    field: &str,
    expected: &str,
) -> Result<(), String> {
    match mapping.get(field) {
        None | Some(yaml_serde::Value::Null) => Err(format!("missing, expected {expected:?}")),
        Some(yaml_serde::Value::String(found)) if found == expected => Ok(()),
        Some(yaml_serde::Value::String(found)) => {
            Err(format!("expected {expected:?}, found {found:?}"))
        }
        Some(_) => Err(format!(
            "expected {expected:?}, found a value that is not a string"
        )),
    }
}

/// Serialise `items` as a multi-document YAML stream, documents separated by `---` lines.
pub fn to_yaml_documents<T: Serialize>(items: &[T]) -> Result<String, ResourceError> {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let text = yaml_serde::to_string(item).map_err(|source| ResourceError::Serialize {
            document: i + 1,
            source,
        })?;
        out.push_str(&text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
