//! Semantic checks of ServiceRecord and RemoteRegistry beyond their schema: names, FQDNs,
//! addresses, port ranges and enumerations. Every broken rule is reported with its field path.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};

use super::{
    FieldViolation, MATERIALIZE_CILIUM_GLOBAL_SERVICE, MATERIALIZE_SERVICE, ObjectMeta,
    ROLE_PARENT, ROLE_PEER, RemoteRegistry, ResourceError, ServiceRecord,
};
use crate::domains::allowed_domain_errors;
use crate::names::{REMOTE_REGISTRY_KIND, SERVICE_RECORD_KIND, canonical_fqdn, is_dns1123_label};

/// Longest IANA service name (a Kubernetes port name).
const MAX_PORT_NAME_LEN: usize = 15;
/// Port protocols Kubernetes Services accept.
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

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
        let name = match &meta.namespace {
            Some(ns) => format!("{ns}/{}", meta.name),
            None => meta.name.clone(),
        };
        Err(ResourceError::Invalid {
            kind,
            name,
            violations: self.0,
        })
    }
}

pub use crate::names::is_dns1123_subdomain;

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
    if meta.name.is_empty() {
        v.add("metadata.name", "must not be empty");
    } else if !is_dns1123_subdomain(&meta.name) {
        v.add(
            "metadata.name",
            format!(
                "{:?} is not a valid DNS-1123 subdomain (at most 253 lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit)",
                meta.name
            ),
        );
    }
}

fn check_port(path: String, port: u32, v: &mut Violations) {
    if !(1..=65535).contains(&port) {
        v.add(path, format!("{port} is out of range 1-65535"));
    }
}

/// IANA service name (RFC 6335) as Kubernetes checks port names.
fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_PORT_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

impl ServiceRecord {
    /// Check the record: `metadata.name` is a DNS-1123 subdomain, `spec.fqdn` is a DNS name
    /// ([`canonical_fqdn`]), every endpoint has a port in 1-65535 and an IP or DNS-name address,
    /// named ports have valid names (required and unique when several), ports and protocols
    /// (`TCP`, `UDP`, `SCTP`), allowed requesters are non-empty, and an origin names its object.
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
                            "{name:?} is not a valid port name (at most 15 lowercase letters, digits and '-', at least one letter, no leading, trailing or double '-')"
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
                if let Some(protocol) = &port.protocol
                    && !PROTOCOLS.contains(&protocol.as_str())
                {
                    v.add(
                        format!("spec.ports[{i}].protocol"),
                        format!("{protocol:?} is not one of TCP, UDP, SCTP"),
                    );
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

/// Check a gRPC target `host:port`: the host is an IPv4 address, a bracketed IPv6 address or a
/// DNS name; the port is a decimal number in 1-65535.
fn check_address(address: &str) -> Result<(), String> {
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!("{address:?} is not host:port"));
    };
    let port_ok = !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
    if !port_ok {
        return Err(format!(
            "{address:?}: port {port:?} is not a number in 1-65535"
        ));
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner
            .parse::<Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| format!("{address:?}: {inner:?} is not an IPv6 address"));
    }
    if host.contains(':') {
        return Err(format!(
            "{address:?}: an IPv6 host must be written in brackets, e.g. [::1]:443"
        ));
    }
    if host.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    canonical_fqdn(host)
        .map(|_| ())
        .map_err(|e| format!("{address:?}: host is neither an IP address nor a DNS name ({e})"))
}

impl RemoteRegistry {
    /// Check the registry: `metadata.name` is a DNS-1123 subdomain, `spec.address` is
    /// `host:port`, `spec.tlsConfig.serverName` is set and `serverCA` is base64,
    /// `spec.allowedDomains` passes the XCC v1 rules (messages as in the `Valid` condition),
    /// `spec.role` is `Peer` or `Parent`, `spec.materialize` is `Service` or
    /// `CiliumGlobalService`.
    pub fn validate(&self) -> Result<(), ResourceError> {
        let mut v = Violations::default();
        check_name(&self.metadata, &mut v);
        let spec = &self.spec;
        if let Err(message) = check_address(&spec.address) {
            v.add("spec.address", message);
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
        if let Some(role) = &spec.role
            && role != ROLE_PEER
            && role != ROLE_PARENT
        {
            v.add("spec.role", format!("{role:?} is not one of Peer, Parent"));
        }
        if let Some(mode) = &spec.materialize
            && mode != MATERIALIZE_SERVICE
            && mode != MATERIALIZE_CILIUM_GLOBAL_SERVICE
        {
            v.add(
                "spec.materialize",
                format!("{mode:?} is not one of Service, CiliumGlobalService"),
            );
        }
        for (i, import) in spec.imports.iter().flatten().enumerate() {
            let path = format!("spec.imports[{i}]");
            if spec.role.as_deref() != Some(ROLE_PARENT) {
                v.add(path.clone(), "imports need role Parent");
            }
            match (&import.fqdn, &import.name) {
                (Some(f), None) => {
                    if let Err(e) = crate::names::canonical_fqdn(f) {
                        v.add(format!("{path}.fqdn"), e.to_string());
                    }
                }
                (None, Some(n)) if !n.is_empty() => {
                    if import.namespace.as_deref().is_none_or(str::is_empty) {
                        v.add(format!("{path}.namespace"), "required with name");
                    }
                }
                _ => v.add(path.clone(), "give either fqdn, or namespace and name"),
            }
        }
        v.into_result(REMOTE_REGISTRY_KIND, &self.metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Endpoint, Origin, ServiceRecordSpec};
    use super::*;

    fn record(namespace: &str) -> ServiceRecord {
        ServiceRecord::new(
            ObjectMeta {
                name: "api".into(),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            ServiceRecordSpec {
                fqdn: "api.shop.example".into(),
                endpoints: vec![Endpoint {
                    address: "10.0.0.1".into(),
                    port: 443,
                }],
                ..Default::default()
            },
        )
    }

    /// Issue 10: an export whose namespace is a path reached file names downstream.
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
