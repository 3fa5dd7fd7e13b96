//! Checks of ServiceRecord and RemoteRegistry: everything the CRD schema and its CEL rules
//! enforce on the API server (so a file-store object is held to the same rules), and the
//! semantic checks beyond them (names, FQDNs, addresses, base64). Every broken rule is reported
//! with its field path.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{FieldViolation, RemoteRegistry, ResourceError, ServiceRecord};
use crate::crd::{IMPORT_RULE_MESSAGE, ImportTarget, RequesterIdentity, Role};
use crate::domains::allowed_domain_errors;
use crate::names::{
    REMOTE_REGISTRY_KIND, SERVICE_RECORD_KIND, canonical_fqdn, is_dns1123_label,
    is_dns1123_subdomain, is_label_value, is_port_name,
};

/// Collects violations in field order.
#[derive(Default)]
struct Violations(Vec<FieldViolation>);

impl Violations {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldViolation {
            path: path.into(),
            message: message.into(),
        });
    }

    fn into_result(self, kind: &'static str, meta: &ObjectMeta) -> Result<(), ResourceError> {
        if self.0.is_empty() {
            return Ok(());
        }
        let name = meta.name.clone().unwrap_or_default();
        let name = match &meta.namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name,
        };
        Err(ResourceError::Invalid {
            kind,
            name,
            violations: self.0,
        })
    }
}

fn check_name(meta: &ObjectMeta, v: &mut Violations) {
    // The namespace becomes part of object names, file names and keys downstream: it must be a
    // namespace name, never a path (`../x`, `/etc`) or an empty string.
    if let Some(ns) = &meta.namespace
        && !is_dns1123_label(ns)
    {
        v.add(
            "metadata.namespace",
            format!(
                "{ns:?} is not a valid namespace name (a DNS-1123 label: 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
            ),
        );
    }
    match meta.name.as_deref() {
        None | Some("") => v.add("metadata.name", "must not be empty"),
        Some(name) if !is_dns1123_subdomain(name) => v.add(
            "metadata.name",
            format!(
                "{name:?} is not a valid DNS-1123 subdomain (at most 253 lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit)"
            ),
        ),
        Some(_) => {}
    }
}

fn check_port(path: String, port: i32, v: &mut Violations) {
    if !(1..=65535).contains(&port) {
        v.add(path, format!("{port} is out of range 1-65535"));
    }
}

impl ServiceRecord {
    /// Check the record: `metadata.name` is a DNS-1123 subdomain, `spec.fqdn` is a DNS name
    /// ([`canonical_fqdn`]), every endpoint has a port in 1-65535 and an IP or DNS-name address,
    /// named ports have valid names (required and unique when several) and ports (and target
    /// ports) in range, allowed requesters are non-empty, and an origin names its object.
    pub fn validate(&self) -> Result<(), ResourceError> {
        let mut v = Violations::default();
        check_name(&self.metadata, &mut v);
        let spec = &self.spec;
        if let Err(e) = canonical_fqdn(&spec.fqdn) {
            v.add("spec.fqdn", e.to_string());
        }
        for (i, endpoint) in spec.endpoints.iter().enumerate() {
            if endpoint.address.parse::<IpAddr>().is_err()
                && let Err(e) = canonical_fqdn(&endpoint.address)
            {
                v.add(
                    format!("spec.endpoints[{i}].address"),
                    format!(
                        "{:?} is neither an IP address nor a DNS name ({e})",
                        endpoint.address
                    ),
                );
            }
            check_port(format!("spec.endpoints[{i}].port"), endpoint.port, &mut v);
        }
        if let Some(requesters) = &spec.allowed_requesters {
            for (i, requester) in requesters.iter().enumerate() {
                if requester.trim().is_empty() {
                    v.add(format!("spec.allowedRequesters[{i}]"), "must not be empty");
                }
            }
        }
        if let Some(ports) = &spec.ports {
            let mut names = BTreeSet::new();
            for (i, port) in ports.iter().enumerate() {
                match &port.name {
                    Some(name) if !is_port_name(name) => v.add(
                        format!("spec.ports[{i}].name"),
                        format!(
                            "{name:?} is not a valid port name (a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
                        ),
                    ),
                    Some(name) if !names.insert(name.as_str()) => {
                        v.add(format!("spec.ports[{i}].name"), format!("duplicate name {name:?}"))
                    }
                    None if ports.len() > 1 => v.add(
                        format!("spec.ports[{i}].name"),
                        "required when more than one port is listed",
                    ),
                    _ => {}
                }
                check_port(format!("spec.ports[{i}].port"), port.port, &mut v);
                if let Some(target) = port.target_port {
                    check_port(format!("spec.ports[{i}].targetPort"), target, &mut v);
                }
            }
        }
        if let Some(origin) = &spec.origin {
            if origin.namespace.is_empty() {
                v.add("spec.origin.namespace", "must not be empty");
            } else if !is_dns1123_label(&origin.namespace) {
                v.add(
                    "spec.origin.namespace",
                    format!(
                        "{:?} is not a valid namespace name (a DNS-1123 label)",
                        origin.namespace
                    ),
                );
            }
            if origin.name.is_empty() {
                v.add("spec.origin.name", "must not be empty");
            } else if !is_dns1123_subdomain(&origin.name) {
                v.add(
                    "spec.origin.name",
                    format!(
                        "{:?} is not a valid object name (a DNS-1123 subdomain)",
                        origin.name
                    ),
                );
            }
            if let Some(cluster) = &origin.cluster
                && !is_dns1123_label(cluster)
            {
                v.add(
                    "spec.origin.cluster",
                    format!("{cluster:?} is not a valid cluster name (a DNS-1123 label)"),
                );
            }
        }
        v.into_result(SERVICE_RECORD_KIND, &self.metadata)
    }
}

/// Why a gRPC target is not `host:port`; each message quotes the address.
#[derive(Debug, thiserror::Error)]
enum AddressError {
    #[error("{0:?} is not host:port")]
    NotHostPort(String),
    #[error("{address:?}: port {port:?} is not a number in 1-65535")]
    Port { address: String, port: String },
    #[error("{address:?}: {inner:?} is not an IPv6 address")]
    Ipv6 { address: String, inner: String },
    #[error("{0:?}: an IPv6 host must be written in brackets, e.g. [::1]:443")]
    UnbracketedIpv6(String),
    #[error("{address:?}: host is neither an IP address nor a DNS name ({source})")]
    Host {
        address: String,
        source: crate::names::FqdnError,
    },
}

/// Check a gRPC target `host:port`: the host is an IPv4 address, a bracketed IPv6 address or a
/// DNS name; the port is a decimal number in 1-65535.
fn check_address(address: &str) -> Result<(), AddressError> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(AddressError::NotHostPort(address.to_string()));
    };
    let port_ok = !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
    if !port_ok {
        return Err(AddressError::Port {
            address: address.to_string(),
            port: port.to_string(),
        });
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner
            .parse::<Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| AddressError::Ipv6 {
                address: address.to_string(),
                inner: inner.to_string(),
            });
    }
    if host.contains(':') {
        return Err(AddressError::UnbracketedIpv6(address.to_string()));
    }
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    canonical_fqdn(host)
        .map(|_| ())
        .map_err(|source| AddressError::Host {
            address: address.to_string(),
            source,
        })
}

/// Check a requester's mesh identity: the namespace is a DNS-1123 label, the service account a
/// DNS-1123 subdomain of at most 63 characters (Cilium matches it as a label value), the trust
/// domain (if set) a DNS name.
fn check_identity(path: &str, id: &RequesterIdentity, v: &mut Violations) {
    if !is_dns1123_label(&id.namespace) {
        v.add(
            format!("{path}.namespace"),
            format!(
                "{:?} is not a valid namespace name (a DNS-1123 label)",
                id.namespace
            ),
        );
    }
    if !is_dns1123_subdomain(&id.service_account) || !is_label_value(&id.service_account) {
        v.add(
            format!("{path}.serviceAccount"),
            format!(
                "{:?} is not a service account name (a DNS-1123 subdomain of at most 63 characters)",
                id.service_account
            ),
        );
    }
    if let Some(td) = &id.trust_domain
        && !is_dns1123_subdomain(td)
    {
        v.add(
            format!("{path}.trustDomain"),
            format!("{td:?} is not a trust domain (a lowercase DNS name)"),
        );
    }
}

impl RemoteRegistry {
    /// Check the registry: `metadata.name` is a DNS-1123 subdomain, `spec.address` is
    /// `host:port`, `spec.tlsConfig.serverName` is set and `serverCA` is base64,
    /// `spec.allowedDomains` passes the XCC v1 rules (messages as in the `Valid` condition), and
    /// every `spec.imports` entry follows the CRD's CEL rule ([`crate::crd::IMPORT_RULE`]), names
    /// a valid FQDN or namespace and object name, and belongs to a `Parent` registry.
    pub fn validate(&self) -> Result<(), ResourceError> {
        let mut v = Violations::default();
        check_name(&self.metadata, &mut v);
        let spec = &self.spec;
        if let Err(e) = check_address(&spec.address) {
            v.add("spec.address", e.to_string());
        }
        if let Err(ResourceError::Base64 { path, source }) = spec.tls_config.server_ca_pem() {
            v.add(path, format!("invalid base64: {source}"));
        }
        if spec.tls_config.server_name.is_empty() {
            v.add("spec.tlsConfig.serverName", "must not be empty");
        }
        if let Some(domains) = &spec.allowed_domains {
            for error in allowed_domain_errors(domains) {
                let body = error.body();
                v.add(error.path, body);
            }
        }
        for (i, import) in spec.imports.iter().flatten().enumerate() {
            let path = format!("spec.imports[{i}]");
            if spec.role() != Role::Parent {
                v.add(path.clone(), "imports need role Parent");
            }
            match import.target() {
                None => v.add(path.clone(), IMPORT_RULE_MESSAGE),
                Some(ImportTarget::Fqdn(fqdn)) => {
                    if let Err(e) = canonical_fqdn(fqdn) {
                        v.add(format!("{path}.fqdn"), e.to_string());
                    }
                }
                Some(ImportTarget::Object { namespace, name }) => {
                    if !is_dns1123_label(namespace) {
                        v.add(
                            format!("{path}.namespace"),
                            format!(
                                "{namespace:?} is not a valid namespace name (a DNS-1123 label)"
                            ),
                        );
                    }
                    if !is_dns1123_subdomain(name) {
                        v.add(
                            format!("{path}.name"),
                            format!("{name:?} is not a valid object name (a DNS-1123 subdomain)"),
                        );
                    }
                }
            }
            if let Some(id) = &import.requester_identity {
                check_identity(&format!("{path}.requesterIdentity"), id, &mut v);
            }
        }
        v.into_result(REMOTE_REGISTRY_KIND, &self.metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Endpoint, Origin, ServiceRecordSpec};

    fn record(namespace: &str) -> ServiceRecord {
        ServiceRecord {
            metadata: ObjectMeta {
                name: Some("api".into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            spec: ServiceRecordSpec {
                fqdn: "api.shop.example".into(),
                endpoints: vec![Endpoint {
                    address: "10.0.0.1".into(),
                    port: 443,
                }],
                ..Default::default()
            },
            status: None,
        }
    }

    /// An export whose namespace is a path reached file names downstream.
    #[test]
    fn a_namespace_must_be_a_dns1123_label() {
        assert_eq!(record("shop").validate().ok(), Some(()));
        assert_eq!(
            record("../../x").validate().unwrap_err().to_string(),
            r#"invalid ServiceRecord "../../x/api": metadata.namespace: "../../x" is not a valid namespace name (a DNS-1123 label: 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit)"#
        );
        for bad in ["/etc", "..", "", "a.b", "Shop", "a/b", &"a".repeat(64)] {
            assert!(record(bad).validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn origin_names_follow_their_rules() {
        let with = |cluster: Option<&str>, namespace: &str, name: &str| {
            let mut r = record("shop");
            r.spec.origin = Some(Origin {
                cluster: cluster.map(str::to_string),
                namespace: namespace.into(),
                name: name.into(),
                kind: None,
            });
            r.validate().map_err(|e| e.to_string())
        };
        assert_eq!(with(Some("west"), "shop", "api.v1"), Ok(()));
        assert!(with(None, "../x", "api").is_err());
        assert!(with(None, "shop", "a/b").is_err());
        assert!(with(Some("west/x"), "shop", "api").is_err());
    }
}
