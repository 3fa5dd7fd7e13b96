//! What both stores make of the resources they read and write: an exported ServiceRecord
//! becomes a catalog entry, a RemoteRegistry the spec of a Hamlet client, an import the
//! endpoints of an imported ServiceRecord. The file store and the
//! kube store read the same types (`xcc_proto::crd`) and call these; neither imports the other.

use thiserror::Error;
use xcc_proto::crd::{Endpoint, RemoteRegistry, ServiceRecord};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::names::{self, FqdnError};
use xcc_proto::resources::ResourceError;

use crate::catalog::{self, Labels, NamedPort, Origin, ServiceEntry, ServiceKey, Source};
use crate::hamlet::client::RemoteSpec;
use crate::hamlet::convert::{
    Imported, LABEL_PASSTHROUGH_PREFIX, MAX_WIRE_RESOURCE_BYTES, wire_size_bound,
};

/// Why an exported ServiceRecord has no catalog entry.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The record breaks a rule of [`ServiceRecord::validate`].
    #[error(transparent)]
    Invalid(#[from] ResourceError),
    /// `spec.fqdn` has no canonical form.
    #[error("spec.fqdn: {0}")]
    Fqdn(#[from] FqdnError),
    /// The Hamlet message of the record would be too large for a peer to decode.
    #[error(
        "too large for Hamlet: about {size} bytes, the limit is {MAX_WIRE_RESOURCE_BYTES} bytes"
    )]
    TooLarge {
        /// The bound on the encoded size.
        size: usize,
    },
    /// More policy labels than travel: a policy testing a dropped one would silently stop
    /// matching above this registry.
    #[error("metadata.annotations: {0}")]
    Labels(#[from] crate::peer_labels::PolicyLabelError),
    /// The `service-port` annotation is not a port number.
    #[error(
        "metadata.annotations[{}]: {value:?} is not a port number (1-65535); write the number, e.g. \"443\" (name ports in spec.ports)",
        names::SERVICE_PORT_ANNOTATION
    )]
    ServicePort {
        /// The annotation's value.
        value: String,
    },
}

/// Why a RemoteRegistry cannot be dialled.
#[derive(Debug, Error)]
pub enum RemoteSpecError {
    /// The registry breaks a rule of [`RemoteRegistry::validate`].
    #[error(transparent)]
    Invalid(#[from] ResourceError),
    /// `spec.tlsConfig.serverCA` decodes but holds no usable CA certificate.
    #[error("spec.tlsConfig.serverCA: {0}")]
    Roots(#[from] xcc_certs::CertError),
}

/// Why an import from a remote registry has no ServiceRecord.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ImportedRecordError {
    /// The FQDN yields no record name.
    #[error(transparent)]
    Name(#[from] FqdnError),
    /// An endpoint port outside 1-65535.
    #[error("endpoint {address}: port {port} is out of range 1-65535")]
    Port {
        /// The endpoint's address.
        address: String,
        /// The port.
        port: u32,
    },
}

/// The endpoints of an import as a ServiceRecord holds them.
pub fn imported_endpoints(imported: &Imported) -> Result<Vec<Endpoint>, ImportedRecordError> {
    imported
        .endpoints
        .iter()
        .map(|e| {
            let port = i32::try_from(e.port)
                .ok()
                .filter(|p| (1..=65535).contains(p))
                .ok_or_else(|| ImportedRecordError::Port {
                    address: e.address.to_string(),
                    port: e.port,
                })?;
            Ok(Endpoint {
                address: e.address.to_string(),
                port,
            })
        })
        .collect()
}

/// The `spec.ports` of an import's record: its checked named ports, unset when it has none
/// (the record's port then comes from the `service-port` annotation, as XCC v1's did).
pub fn imported_ports(imported: &Imported) -> Option<Vec<xcc_proto::crd::ServicePort>> {
    (!imported.ports.is_empty()).then(|| imported.ports.clone())
}

/// The ports of a stored imported record, as an [`Imported`] holds them: checked, so a record
/// edited by hand costs only its bad ports.
pub fn stored_ports(sr: &ServiceRecord) -> Vec<xcc_proto::crd::ServicePort> {
    xcc_proto::ports::checked(
        sr.spec
            .ports
            .iter()
            .flatten()
            .map(xcc_proto::ports::RawPort::of),
    )
    .0
}

/// The exported object's clusterset namespace and name, when the exporter sent them (kept only
/// as a valid pair, [`crate::peer_labels`]): the binder names MCS ServiceImports and Cilium
/// global Services after it, and `xcc dns` its MCS names. The cluster is the import's, when its
/// source named one (a hierarchy answer's owner); else unset, and the RemoteRegistry stands for
/// the source.
pub fn imported_origin(imported: &Imported) -> Option<xcc_proto::crd::Origin> {
    Some(xcc_proto::crd::Origin {
        cluster: imported.cluster.clone(),
        namespace: imported.labels.get(ORIGIN_NAMESPACE_ANNOTATION)?.clone(),
        name: imported.labels.get(ORIGIN_NAME_ANNOTATION)?.clone(),
        kind: None,
    })
}

/// The [`Imported::cluster`] a stored imported record says (`spec.origin.cluster`), when it is a
/// DNS-1123 label.
pub fn imported_cluster(sr: &ServiceRecord) -> Option<String> {
    sr.spec
        .origin
        .as_ref()
        .and_then(|o| o.cluster.clone())
        .filter(|c| names::is_dns1123_label(c))
}

/// Namespace of an object (`default` when unset) and its name.
pub fn namespace_name(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// Check an exported ServiceRecord and map it to the catalog entry owned by `cluster` (keyed by
/// namespace and name). Annotations pass through under exactly `connectivity.tanzu.vmware.com/`
/// (with the slash); `allowedRequesters`, else the clusters annotation, lists who may import it.
pub fn export_entry(cluster: &str, sr: &ServiceRecord) -> Result<ServiceEntry, ExportError> {
    sr.validate()?;
    let fqdn = names::canonical_fqdn(&sr.spec.fqdn)?;
    let annotations = sr.metadata.annotations.as_ref();
    if let Some(value) = annotations.and_then(|a| a.get(names::SERVICE_PORT_ANNOTATION))
        && !value.trim().parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(ExportError::ServicePort {
            value: value.clone(),
        });
    }
    let labels: Labels = annotations
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(LABEL_PASSTHROUGH_PREFIX))
        .collect();
    crate::peer_labels::check_export(labels.iter())?;
    let mut allowed: Vec<String> = sr.spec.allowed_requesters.clone().unwrap_or_default();
    if allowed.is_empty()
        && let Some(list) = annotations.and_then(|a| a.get(names::CLUSTERS_ANNOTATION))
    {
        allowed = list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
    }
    allowed.sort();
    allowed.dedup();
    let (namespace, name) = namespace_name(&sr.metadata);
    // `validate` admitted only ports in 1-65535.
    let port = |p: i32| u32::try_from(p).unwrap_or_default();
    let entry = ServiceEntry {
        key: ServiceKey::new(cluster, namespace, name),
        source: Source::Local,
        fqdn: fqdn.into(),
        endpoints: sr
            .spec
            .endpoints
            .iter()
            .map(|e| catalog::Endpoint {
                address: e.address.as_str().into(),
                port: port(e.port),
            })
            .collect(),
        ports: sr
            .spec
            .ports
            .iter()
            .flatten()
            .map(|p| NamedPort {
                name: p.name.as_deref().unwrap_or_default().into(),
                port: port(p.port),
                protocol: p.protocol().as_str().into(),
                // `validate` admitted only target ports in 1-65535; the port's own is no target.
                target_port: p.target_port.filter(|t| *t != p.port).map_or(0, port),
            })
            .collect(),
        labels,
        allowed_requesters: allowed,
        origin: sr.spec.origin.as_ref().map(|o| {
            Box::new(Origin {
                cluster: o.cluster.clone().unwrap_or_else(|| cluster.to_string()),
                namespace: o.namespace.clone(),
                name: o.name.clone(),
                kind: o.kind.clone().unwrap_or_default(),
            })
        }),
        revision: 0,
    };
    // Reported here, per record, rather than found out by a peer that cannot decode it.
    let size = wire_size_bound(&entry);
    if size > MAX_WIRE_RESOURCE_BYTES {
        return Err(ExportError::TooLarge { size });
    }
    Ok(entry)
}

/// Check a RemoteRegistry and resolve it into a client spec.
pub fn remote_spec(rr: &RemoteRegistry) -> Result<RemoteSpec, RemoteSpecError> {
    rr.validate()?;
    let roots = match rr.spec.tls_config.server_ca_pem()? {
        Some(pem) => Some(xcc_certs::client::roots_from_pem(&pem)?),
        None => None,
    };
    Ok(RemoteSpec {
        name: rr.metadata.name.clone().unwrap_or_default(),
        address: rr.spec.address.clone(),
        server_name: rr.spec.tls_config.server_name.clone(),
        roots,
        allowed_domains: rr.spec.allowed_domains.clone().unwrap_or_default(),
    })
}
