//! The Kubernetes objects of XCC ([`ServiceRecord`], [`RemoteRegistry`] of [`crate::crd`]) as
//! text: reading and writing them as multi-document YAML or JSON — the form they take in
//! manifests and in the standalone file store — and the checks every reader applies before use
//! ([`ServiceRecord::validate`], [`RemoteRegistry::validate`]).
//!
//! The types are the custom resources themselves, so a file holds exactly what the API server
//! would: XCC v1's field names and our optional additions. Errors from
//! [`parse_documents`] name the file, the document and the field path; `validate` names the
//! offending field.

use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::crd::{RemoteRegistry, ServiceRecord, TlsConfig};

mod validate;

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

impl TlsConfig {
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

/// Parse every non-empty document of a YAML (or JSON) stream as a `T`. `file` names the origin
/// in errors, which also give the 1-based document number and the field path:
/// `exports/web.yaml: document 1: spec.endpoints[0].port: invalid type: string "x", expected i32`.
/// Each document's `apiVersion` and `kind` must be those of `T`. A document's `status` is not
/// read: a file states what is wanted, the status is what a registry observed.
pub fn parse_documents<T>(text: &str, file: &str) -> Result<Vec<T>, ResourceError>
where
    T: kube::Resource<DynamicType = ()> + DeserializeOwned,
{
    let (api_version, kind) = (T::api_version(&()), T::kind(&()));
    let mut items = Vec::new();
    for (i, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let number = i + 1;
        let error = |path: Option<&str>, message: String| ResourceError::Document {
            file: file.to_string(),
            document: number,
            path: path.map(str::to_string),
            message,
        };
        let mut value =
            yaml_serde::Value::deserialize(document).map_err(|e| error(None, e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let Some(mapping) = value.as_mapping_mut() else {
            return Err(error(None, format!("expected a {kind} object (a mapping)")));
        };
        check_type_field(mapping, "apiVersion", &api_version)
            .map_err(|e| error(Some("apiVersion"), e.to_string()))?;
        check_type_field(mapping, "kind", &kind).map_err(|e| error(Some("kind"), e.to_string()))?;
        mapping.remove("status");
        let item: T = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let path = (path != ".").then_some(path);
            error(path.as_deref(), e.into_inner().to_string())
        })?;
        items.push(item);
    }
    Ok(items)
}

/// Why `apiVersion` or `kind` of a document is not the expected value.
#[derive(Debug, thiserror::Error)]
enum TypeFieldError {
    #[error("missing, expected {0:?}")]
    Missing(String),
    #[error("expected {expected:?}, found {found:?}")]
    Other { expected: String, found: String },
    #[error("expected {0:?}, found a value that is not a string")]
    NotString(String),
}

fn check_type_field(
    mapping: &yaml_serde::Mapping,
    field: &str,
    expected: &str,
) -> Result<(), TypeFieldError> {
    match mapping.get(field) {
        None | Some(yaml_serde::Value::Null) => Err(TypeFieldError::Missing(expected.into())),
        Some(yaml_serde::Value::String(found)) if found == expected => Ok(()),
        Some(yaml_serde::Value::String(found)) => Err(TypeFieldError::Other {
            expected: expected.into(),
            found: found.clone(),
        }),
        Some(_) => Err(TypeFieldError::NotString(expected.into())),
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
