//! What the owner of a service creates when a caller is granted access (`--grant-mode`): nothing,
//! an Istio AuthorizationPolicy admitting the caller's workload identity, a Gateway API HTTPRoute
//! exposing the service on a configured Gateway, or a CiliumNetworkPolicy admitting the caller's
//! cluster, namespace and service account (Cilium cluster mesh labels). Objects are named
//! `{prefix}{hash8}` (first 8 hex digits of a SHA-256 of their parts) so names are stable, short
//! and collision-free, and carry the service's name in a label for discoverability.
//!
//! Where each field comes from:
//! * the caller: its cluster (bound to the authenticated child session that asked) and its
//!   workload identity ([`WorkloadIdentity`], carried in the query and the route notification);
//!   the identity's trust domain must be the one this registry assigns to the caller's cluster
//!   ([`GrantConfig::trust_domain`]), so a child cannot name workloads of another trust domain;
//! * the service: this registry's own export ([`ExportedService`], from its catalog entry, never
//!   from the wire): FQDN, ports, the exporting Service (the record's origin) and the pod
//!   selector the publisher copied from that Service ([`WORKLOAD_SELECTOR_ANNOTATION`]);
//! * the Gateway an HTTPRoute attaches to: configuration ([`GrantConfig::gateway`]).
//!
//! A grant whose caller sent no workload identity writes no Istio or Cilium object (there is no
//! principal to admit, and admitting a whole namespace or cluster would be a wildcard nobody
//! asked for); an export without a selector writes none either (an ALLOW policy without a
//! selector would apply to every workload of the namespace). Both are reported as the grant's
//! error. Generation is pure; [`GrantSink`] applies or removes the objects (files in file mode).
//!
//! Every field of a route that comes from the wire is held by [`check_route`] to the Kubernetes
//! rule of what it names before it reaches an object, a label or a file name, and
//! [`FileGrants`] checks again that each file it writes or removes is a plain file name directly
//! under `grants/`. Which services may be granted at all (only this cluster's own exports, to
//! callers they admit) is decided by the caller of the sink, the federation level
//! (`owner_check`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use xcc_proto::names::{
    WORKLOAD_SELECTOR_ANNOTATION, is_dns1123_label, is_dns1123_subdomain, is_label_value,
    parse_selector, policy_object_name,
};

pub use super::types::{ExportedService, IdentityError, OwnerRoute, WorkloadIdentity};

/// Why grant settings do not hold, why a grant writes no object, or why its objects could not
/// be written (file mode; kube mode adds its own in `kube_grants`).
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("grant mode {0:?}: use none, istio, gateway or cilium")]
    UnknownMode(String),
    #[error("gateway {0:?}: use <namespace>/<name> of a Gateway (a namespace and an object name)")]
    BadGateway(String),
    #[error("--grant-mode gateway needs --grant-gateway <namespace>/<name>")]
    GatewayFlagMissing,
    #[error(
        "grant trust domain {0:?} is not a DNS name (with {{cluster}} for the caller's cluster)"
    )]
    BadTrustDomain(String),
    /// `caller` is `cluster/service`.
    #[error("{caller} asked without a workload identity: there is no principal to admit")]
    NoIdentity { caller: String },
    #[error(
        "{caller} claims {identity}, but the workloads of cluster {cluster} are in trust domain {expected:?}"
    )]
    ForeignTrustDomain {
        caller: String,
        identity: Box<WorkloadIdentity>,
        cluster: String,
        expected: String,
    },
    #[error(
        "the export {fqdn} has no {WORKLOAD_SELECTOR_ANNOTATION} annotation (the publisher \
         copies a Service's selector; set it on other exports): a policy without a \
         selector would cover every workload of the namespace"
    )]
    NoSelector { fqdn: String },
    #[error("the export {fqdn}: {WORKLOAD_SELECTOR_ANNOTATION}: {reason}")]
    BadSelector {
        fqdn: String,
        reason: xcc_proto::names::SelectorError,
    },
    #[error("no Gateway configured (--grant-gateway)")]
    NoGateway,
    #[error("the export {fqdn} is not a Service: an HTTPRoute needs a Service backend")]
    NotAService { fqdn: String },
    #[error("the export {fqdn} has no TCP port")]
    NoTcpPort { fqdn: String },
    #[error("route {field} {value:?} is not {rule}")]
    BadRouteName {
        field: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("route caller {0}")]
    BadCallerIdentity(IdentityError),
    #[error(
        "grant object {namespace:?}/{name:?}: not a namespace and object name; no file written"
    )]
    BadObjectName { namespace: String, name: String },
    #[error("grant file {} is not directly in {}", path.display(), dir.display())]
    OutsideDir { path: PathBuf, dir: PathBuf },
    #[error(transparent)]
    Yaml(#[from] yaml_serde::Error),
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GrantMode {
    #[default]
    None,
    Istio,
    Gateway,
    Cilium,
}

impl std::str::FromStr for GrantMode {
    type Err = GrantError;
    fn from_str(s: &str) -> Result<Self, GrantError> {
        match s {
            "none" => Ok(GrantMode::None),
            "istio" => Ok(GrantMode::Istio),
            "gateway" => Ok(GrantMode::Gateway),
            "cilium" => Ok(GrantMode::Cilium),
            other => Err(GrantError::UnknownMode(other.into())),
        }
    }
}

/// The Gateway an HTTPRoute attaches to (`--grant-gateway namespace/name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayRef {
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for GatewayRef {
    type Err = GrantError;
    fn from_str(s: &str) -> Result<Self, GrantError> {
        match s.split_once('/') {
            Some((namespace, name))
                if is_dns1123_label(namespace) && is_dns1123_subdomain(name) =>
            {
                Ok(GatewayRef {
                    namespace: namespace.into(),
                    name: name.into(),
                })
            }
            _ => Err(GrantError::BadGateway(s.into())),
        }
    }
}

/// The default of [`GrantConfig::trust_domain`]: Istio's default trust domain, which every
/// cluster of a mesh that shares one root of trust uses.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// How the owner of a service writes grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantConfig {
    pub mode: GrantMode,
    /// Gateway mode: the Gateway every HTTPRoute attaches to (required in that mode).
    pub gateway: Option<GatewayRef>,
    /// The trust domain of a caller cluster's workloads; `{cluster}` stands for the caller's
    /// cluster name (`{cluster}.mesh.example` for a trust domain per cluster). A caller whose
    /// workload identity names another trust domain is refused.
    pub trust_domain: String,
}

impl Default for GrantConfig {
    fn default() -> Self {
        Self {
            mode: GrantMode::None,
            gateway: None,
            trust_domain: DEFAULT_TRUST_DOMAIN.into(),
        }
    }
}

impl GrantConfig {
    pub fn new(mode: GrantMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// Whether the configuration can write what its mode needs (checked at start).
    pub fn check(&self) -> Result<(), GrantError> {
        if self.mode == GrantMode::Gateway && self.gateway.is_none() {
            return Err(GrantError::GatewayFlagMissing);
        }
        let sample = self.trust_domain_of("a");
        if !is_dns1123_subdomain(&sample) {
            return Err(GrantError::BadTrustDomain(self.trust_domain.clone()));
        }
        Ok(())
    }

    /// The trust domain this registry assigns to `cluster`'s workloads.
    pub fn trust_domain_of(&self, cluster: &str) -> String {
        self.trust_domain.replace("{cluster}", cluster)
    }
}

impl ExportedService {
    /// The pod selector of the exporting workload.
    fn selector(&self) -> Result<BTreeMap<String, String>, GrantError> {
        let raw = self
            .selector
            .as_deref()
            .ok_or_else(|| GrantError::NoSelector {
                fqdn: self.fqdn.clone(),
            })?;
        parse_selector(raw).map_err(|reason| GrantError::BadSelector {
            fqdn: self.fqdn.clone(),
            reason,
        })
    }
}

pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "xcc";
pub const SOURCE_NAME_LABEL: &str = "connectivity.tanzu.vmware.com/source-name";
pub const CALLER_ANNOTATION: &str = "connectivity.tanzu.vmware.com/caller";

fn metadata(name: String, r: &OwnerRoute) -> Value {
    json!({
        "name": name,
        "namespace": r.target_namespace,
        "labels": {
            MANAGED_BY_LABEL: MANAGED_BY,
            SOURCE_NAME_LABEL: r.target_service,
        },
        "annotations": {
            CALLER_ANNOTATION: format!("{}/{}", r.caller_cluster, r.caller_service),
        },
    })
}

fn parts(r: &OwnerRoute) -> [&str; 4] {
    [
        &r.target_namespace,
        &r.target_service,
        &r.caller_cluster,
        &r.caller_service,
    ]
}

/// `(apiVersion, kind, name prefix)` of the object `mode` writes.
fn kind_of(mode: GrantMode) -> Option<(&'static str, &'static str, &'static str)> {
    match mode {
        GrantMode::None => None,
        GrantMode::Istio => Some(("security.istio.io/v1", "AuthorizationPolicy", "allow-to-")),
        GrantMode::Gateway => Some(("gateway.networking.k8s.io/v1", "HTTPRoute", "route-")),
        GrantMode::Cilium => Some(("cilium.io/v2", "CiliumNetworkPolicy", "cnp-mesh-")),
    }
}

/// The identity of the caller, checked against the trust domain `cfg` assigns its cluster.
fn caller_identity<'a>(
    cfg: &GrantConfig,
    r: &'a OwnerRoute,
) -> Result<&'a WorkloadIdentity, GrantError> {
    let caller = || format!("{}/{}", r.caller_cluster, r.caller_service);
    let id = r
        .caller_identity
        .as_ref()
        .ok_or_else(|| GrantError::NoIdentity { caller: caller() })?;
    let expected = cfg.trust_domain_of(&r.caller_cluster);
    if id.trust_domain != expected {
        return Err(GrantError::ForeignTrustDomain {
            caller: caller(),
            identity: Box::new(id.clone()),
            cluster: r.caller_cluster.clone(),
            expected,
        });
    }
    Ok(id)
}

/// The objects for `route` under `cfg` (empty for mode `None`), or why none can be written.
pub fn objects(cfg: &GrantConfig, r: &OwnerRoute) -> Result<Vec<Value>, GrantError> {
    let Some((api_version, kind, prefix)) = kind_of(cfg.mode) else {
        return Ok(vec![]);
    };
    let spec = match cfg.mode {
        GrantMode::None => return Ok(vec![]),
        GrantMode::Istio => {
            let id = caller_identity(cfg, r)?;
            json!({
                "selector": {"matchLabels": r.exported.selector()?},
                "action": "ALLOW",
                "rules": [{"from": [{"source": {"principals": [id.principal()]}}]}],
            })
        }
        GrantMode::Gateway => {
            let gateway = cfg.gateway.as_ref().ok_or(GrantError::NoGateway)?;
            let service = r
                .exported
                .service
                .as_deref()
                .ok_or_else(|| GrantError::NotAService {
                    fqdn: r.exported.fqdn.clone(),
                })?;
            // The first TCP port: the one Hamlet peers know as the service's port.
            let port = r
                .exported
                .ports
                .iter()
                .find(|p| p.protocol.eq_ignore_ascii_case("TCP"))
                .ok_or_else(|| GrantError::NoTcpPort {
                    fqdn: r.exported.fqdn.clone(),
                })?;
            json!({
                "parentRefs": [{
                    "group": "gateway.networking.k8s.io",
                    "kind": "Gateway",
                    "namespace": gateway.namespace,
                    "name": gateway.name,
                }],
                "hostnames": [r.exported.fqdn],
                "rules": [{"backendRefs": [{
                    "group": "",
                    "kind": "Service",
                    "name": service,
                    "port": port.port,
                }]}],
            })
        }
        GrantMode::Cilium => {
            let id = caller_identity(cfg, r)?;
            json!({
                "endpointSelector": {"matchLabels": r.exported.selector()?},
                "ingress": [{"fromEndpoints": [{"matchLabels": {
                    "io.cilium.k8s.policy.cluster": r.caller_cluster,
                    "k8s:io.kubernetes.pod.namespace": id.namespace,
                    "io.cilium.k8s.policy.serviceaccount": id.service_account,
                }}]}],
            })
        }
    };
    Ok(vec![json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": metadata(policy_object_name(prefix, &parts(r)), r),
        "spec": spec,
    })])
}

/// The kind, namespace and name of every object `mode` writes for `route`, whatever their
/// content (what a revocation removes, even when the content can no longer be computed).
pub fn object_keys(mode: GrantMode, r: &OwnerRoute) -> Vec<Value> {
    kind_of(mode)
        .map(|(api_version, kind, prefix)| {
            json!({
                "apiVersion": api_version,
                "kind": kind,
                "metadata": {
                    "name": policy_object_name(prefix, &parts(r)),
                    "namespace": r.target_namespace,
                },
            })
        })
        .into_iter()
        .collect()
}

/// Check every name of a route against the Kubernetes rule of what it names, before any of it is
/// used: the target namespace is a namespace (DNS-1123 label); the target service names an
/// exported record (DNS-1123 subdomain) and is written as a label value (at most 63
/// characters); the caller cluster is a cluster name (DNS-1123 label); the caller service is a
/// service account (DNS-1123 subdomain) written as a label value; the caller's workload
/// identity, if any, holds ([`WorkloadIdentity::check`]). The error names the field and quotes
/// the value.
pub fn check_route(r: &OwnerRoute) -> Result<(), GrantError> {
    let bad = |field, value: &str, rule| {
        Err(GrantError::BadRouteName {
            field,
            value: value.into(),
            rule,
        })
    };
    if !is_dns1123_label(&r.target_namespace) {
        return bad(
            "target namespace",
            &r.target_namespace,
            "a namespace name (DNS-1123 label)",
        );
    }
    if !is_dns1123_subdomain(&r.target_service) || !is_label_value(&r.target_service) {
        return bad(
            "target service",
            &r.target_service,
            "a DNS-1123 subdomain of at most 63 characters",
        );
    }
    if !is_dns1123_label(&r.caller_cluster) {
        return bad(
            "caller cluster",
            &r.caller_cluster,
            "a cluster name (DNS-1123 label)",
        );
    }
    if !r.caller_service.is_empty()
        && (!is_dns1123_subdomain(&r.caller_service) || !is_label_value(&r.caller_service))
    {
        return bad(
            "caller service",
            &r.caller_service,
            "a DNS-1123 subdomain of at most 63 characters",
        );
    }
    match &r.caller_identity {
        Some(id) => id.check().map_err(GrantError::BadCallerIdentity),
        None => Ok(()),
    }
}

/// `namespace/name` of an object.
pub fn object_ref(o: &Value) -> String {
    format!(
        "{}/{}/{}",
        o["kind"].as_str().unwrap_or_default(),
        o["metadata"]["namespace"].as_str().unwrap_or_default(),
        o["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Applies and removes grant objects.
pub trait GrantSink: Send + Sync + 'static {
    /// Apply the objects for a new grant; returns their references.
    fn apply(&self, route: &OwnerRoute) -> Result<Vec<String>, GrantError>;
    /// Remove the objects of a revoked grant.
    fn remove(&self, route: &OwnerRoute) -> Result<(), GrantError>;
}

/// Records nothing beyond the route table (grant mode `none`).
pub struct NoGrants;

impl GrantSink for NoGrants {
    fn apply(&self, _route: &OwnerRoute) -> Result<Vec<String>, GrantError> {
        Ok(vec![])
    }
    fn remove(&self, _route: &OwnerRoute) -> Result<(), GrantError> {
        Ok(())
    }
}

/// File mode: one YAML file per object under `<state-dir>/grants/`, for an operator or a GitOps
/// pipeline to apply; removed on revoke.
pub struct FileGrants {
    dir: PathBuf,
    config: GrantConfig,
}

impl FileGrants {
    pub fn new(state_dir: &Path, config: GrantConfig) -> std::io::Result<Self> {
        let dir = state_dir.join("grants");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir, config })
    }

    /// The file of object `o`: `grants/<namespace>.<name>.yaml`. Both parts must be names
    /// (a namespace is a DNS-1123 label, an object name a DNS-1123 subdomain), so the file name
    /// holds no separator and no `..`; the result is checked to lie directly in `grants/`.
    fn path(&self, o: &Value) -> Result<PathBuf, GrantError> {
        let namespace = o["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        if !is_dns1123_label(namespace) || !is_dns1123_subdomain(name) {
            return Err(GrantError::BadObjectName {
                namespace: namespace.into(),
                name: name.into(),
            });
        }
        let path = self.dir.join(format!("{namespace}.{name}.yaml"));
        if path.parent() != Some(self.dir.as_path()) {
            return Err(GrantError::OutsideDir {
                path,
                dir: self.dir.clone(),
            });
        }
        Ok(path)
    }
}

impl GrantSink for FileGrants {
    fn apply(&self, route: &OwnerRoute) -> Result<Vec<String>, GrantError> {
        check_route(route)?;
        let mut refs = vec![];
        for o in objects(&self.config, route)? {
            let text = yaml_serde::to_string(&o)?;
            let path = self.path(&o)?;
            // Atomically: a reader sees the old file or the new one, never a part.
            tempfile::NamedTempFile::new_in(&self.dir)
                .and_then(|mut tmp| {
                    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
                    tmp.as_file().sync_all()?;
                    tmp.persist(&path).map_err(|e| e.error)?;
                    Ok(())
                })
                .map_err(|source| GrantError::File {
                    path: path.clone(),
                    source,
                })?;
            refs.push(object_ref(&o));
        }
        Ok(refs)
    }

    fn remove(&self, route: &OwnerRoute) -> Result<(), GrantError> {
        check_route(route)?;
        for o in object_keys(self.config.mode, route) {
            let path = self.path(&o)?;
            match std::fs::remove_file(&path) {
                Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                    return Err(GrantError::File { path, source });
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
