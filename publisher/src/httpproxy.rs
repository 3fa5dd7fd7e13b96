//! Contour's `HTTPProxy` (`projectcontour.io/v1`), reduced to the fields the publisher reads.
//! Unknown fields are ignored when reading, so any real HTTPProxy deserialises; this type is
//! never written back, and its CRD belongs to Contour (no schema is generated here).

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The part of an HTTPProxy's spec the publisher reads.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[kube(
    group = "projectcontour.io",
    version = "v1",
    kind = "HTTPProxy",
    plural = "httpproxies",
    namespaced,
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct HTTPProxySpec {
    /// Present on root proxies only; included (non-root) proxies have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtualhost: Option<VirtualHost>,
}

/// `spec.virtualhost` of a root HTTPProxy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualHost {
    /// The host name the proxy serves.
    #[serde(default)]
    pub fqdn: String,
}
