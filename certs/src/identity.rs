//! Peer identities: a verified X.509 certificate (DER) goes in, an [`Identity`] comes out.
//!
//! xcc certificates carry exactly one SPIFFE-style URI SAN, `spiffe://<trust-domain>/cluster/<name>` for a
//! registry or `spiffe://<trust-domain>/admin/<name>` for an operator. Certificates without any spiffe URI
//! (a third-party Hamlet peer, say) are [`Identity::External`], named by their first DNS SAN or else their
//! subject CN. A spiffe URI of any other shape is an error, never a silent `External`: a malformed xcc
//! certificate must not be mistaken for a foreign one.
//!
//! This module parses; it does not verify signatures. Callers pass certificates that rustls has already
//! verified against the CA bundle.

use std::fmt;

use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

use crate::error::{CertError, IdentityError};

const SPIFFE_SCHEME: &str = "spiffe://";
const CLUSTER_PATH: &str = "cluster";
const ADMIN_PATH: &str = "admin";

/// Who is on the other end of a verified connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// An xcc registry: URI SAN `spiffe://<trust_domain>/cluster/<name>`.
    Cluster {
        /// The SPIFFE trust domain (a DNS name).
        trust_domain: String,
        /// The cluster name (a DNS-1123 label).
        name: String,
    },
    /// An operator or admin client: URI SAN `spiffe://<trust_domain>/admin/<name>`.
    Admin {
        /// The SPIFFE trust domain (a DNS name).
        trust_domain: String,
        /// The admin name (a DNS-1123 label).
        name: String,
    },
    /// A certificate without an xcc identity (e.g. a third-party Hamlet peer): its first DNS SAN, else its
    /// subject CN, exactly as written in the certificate.
    External(String),
}

impl Identity {
    /// The bare name: the cluster or admin name, or the external DNS SAN / CN.
    pub fn name(&self) -> &str {
        match self {
            Identity::Cluster { name, .. } | Identity::Admin { name, .. } => name,
            Identity::External(name) => name,
        }
    }

    /// True for [`Identity::Admin`].
    pub fn is_admin(&self) -> bool {
        matches!(self, Identity::Admin { .. })
    }

    /// True for [`Identity::Cluster`].
    pub fn is_cluster(&self) -> bool {
        matches!(self, Identity::Cluster { .. })
    }

    /// The SPIFFE trust domain, if this is an xcc identity.
    pub fn trust_domain(&self) -> Option<&str> {
        match self {
            Identity::Cluster { trust_domain, .. } | Identity::Admin { trust_domain, .. } => {
                Some(trust_domain)
            }
            Identity::External(_) => None,
        }
    }

    /// The URI SAN that encodes this identity, if it is an xcc identity.
    pub fn spiffe_id(&self) -> Option<String> {
        match self {
            Identity::Cluster { trust_domain, name } => {
                Some(spiffe_uri(trust_domain, Some((CLUSTER_PATH, name))))
            }
            Identity::Admin { trust_domain, name } => {
                Some(spiffe_uri(trust_domain, Some((ADMIN_PATH, name))))
            }
            Identity::External(_) => None,
        }
    }
}

impl fmt::Display for Identity {
    /// `cluster/<name>`, `admin/<name>` or `external/<name>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Cluster { name, .. } => write!(f, "cluster/{name}"),
            Identity::Admin { name, .. } => write!(f, "admin/{name}"),
            Identity::External(name) => write!(f, "external/{name}"),
        }
    }
}

/// Derives the [`Identity`] of a certificate. See the module docs for the rules.
pub fn identity_from_der(cert: &CertificateDer<'_>) -> Result<Identity, CertError> {
    Ok(parse_identity(cert.as_ref())?)
}

/// [`identity_from_der`] with the narrower error type, for callers that add file context.
pub(crate) fn parse_identity(der: &[u8]) -> Result<Identity, IdentityError> {
    let (_, x509) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| IdentityError::Parse(e.to_string()))?;
    let san = x509
        .subject_alternative_name()
        .map_err(|e| IdentityError::Parse(e.to_string()))?;
    let names: &[GeneralName<'_>] = san.map_or(&[], |ext| ext.value.general_names.as_slice());

    let spiffe: Vec<&str> = names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(uri) if has_spiffe_scheme(uri) => Some(*uri),
            _ => None,
        })
        .collect();
    match spiffe.as_slice() {
        [] => {}
        [uri] => return parse_spiffe_id(uri),
        many => return Err(IdentityError::MultipleSpiffeIds(many.len())),
    }

    let dns = names.iter().find_map(|n| match n {
        GeneralName::DNSName(d) if !d.is_empty() => Some(*d),
        _ => None,
    });
    let cn = || {
        x509.subject()
            .iter_common_name()
            .find_map(|cn| cn.as_str().ok())
            .filter(|cn| !cn.is_empty())
    };
    dns.or_else(cn)
        .map(|name| Identity::External(name.to_owned()))
        .ok_or(IdentityError::NoIdentity)
}

/// Case-insensitive scheme check, so `SPIFFE://...` is reported as an invalid xcc identity rather than
/// being ignored and falling through to `External`.
fn has_spiffe_scheme(uri: &str) -> bool {
    uri.get(..SPIFFE_SCHEME.len())
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case(SPIFFE_SCHEME))
}

/// Parses `spiffe://<td>/cluster/<name>` or `spiffe://<td>/admin/<name>`.
pub(crate) fn parse_spiffe_id(uri: &str) -> Result<Identity, IdentityError> {
    let invalid = |reason| IdentityError::InvalidSpiffeId {
        uri: uri.to_owned(),
        reason,
    };
    let rest = uri
        .strip_prefix(SPIFFE_SCHEME)
        .ok_or_else(|| invalid("the scheme must be lowercase \"spiffe\""))?;
    let (trust_domain, path) = rest
        .split_once('/')
        .ok_or_else(|| invalid("no path; expected /cluster/<name> or /admin/<name>"))?;
    if !is_dns_name(trust_domain) {
        return Err(invalid("the trust domain is not a lowercase DNS name"));
    }
    let (kind, name) = path
        .split_once('/')
        .ok_or_else(|| invalid("the path must be /cluster/<name> or /admin/<name>"))?;
    if kind != CLUSTER_PATH && kind != ADMIN_PATH {
        return Err(invalid("the path must be /cluster/<name> or /admin/<name>"));
    }
    if !is_dns1123_label(name) {
        return Err(invalid(
            "the name is not a DNS-1123 label (lowercase alphanumerics and '-', 1-63 characters)",
        ));
    }
    let (trust_domain, name) = (trust_domain.to_owned(), name.to_owned());
    Ok(if kind == CLUSTER_PATH {
        Identity::Cluster { trust_domain, name }
    } else {
        Identity::Admin { trust_domain, name }
    })
}

/// `spiffe://<td>` or `spiffe://<td>/<kind>/<name>`.
pub(crate) fn spiffe_uri(trust_domain: &str, path: Option<(&str, &str)>) -> String {
    match path {
        Some((kind, name)) => format!("{SPIFFE_SCHEME}{trust_domain}/{kind}/{name}"),
        None => format!("{SPIFFE_SCHEME}{trust_domain}"),
    }
}

/// Parses a CA's `spiffe://<td>` URI (no path, or a bare `/`) into its trust domain.
pub(crate) fn parse_trust_domain_uri(uri: &str) -> Option<&str> {
    let rest = uri.strip_prefix(SPIFFE_SCHEME)?;
    let td = rest.strip_suffix('/').unwrap_or(rest);
    is_dns_name(td).then_some(td)
}

/// Path kind for a cluster (`true`) or admin (`false`) identity.
pub(crate) fn path_kind(admin: bool) -> &'static str {
    if admin { ADMIN_PATH } else { CLUSTER_PATH }
}

/// A DNS-1123 label: lowercase ASCII alphanumerics and '-', 1 to 63 characters, starting and ending with an
/// alphanumeric. This is what Kubernetes accepts as a cluster or namespace name.
pub fn is_dns1123_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    // 63: the maximum length of a DNS label (RFC 1035 §2.3.4).
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A lowercase DNS name: dot-separated [DNS-1123 labels](is_dns1123_label), at most 253 characters, no
/// trailing dot.
pub fn is_dns_name(s: &str) -> bool {
    // 253: the maximum length of a domain name in text form (RFC 1035 §2.3.4, minus the trailing dot).
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_labels() {
        for ok in ["a", "west", "eu-west-1", "0", &"a".repeat(63)] {
            assert!(is_dns1123_label(ok), "{ok:?} should be a label");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "West",
            "a_b",
            "a.b",
            "a/b",
            &"a".repeat(64),
            "ü",
        ] {
            assert!(!is_dns1123_label(bad), "{bad:?} should not be a label");
        }
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_name("xcc.example.org"));
        assert!(is_dns_name("local"));
        assert!(!is_dns_name(""));
        assert!(!is_dns_name("xcc..org"));
        assert!(!is_dns_name("xcc.org."));
        assert!(!is_dns_name("Xcc.org"));
        let longest = ["a"; 127].join(".");
        assert_eq!(longest.len(), 253);
        assert!(is_dns_name(&longest), "253 characters is the limit");
        assert!(
            !is_dns_name(&["abc"; 64].join(".")),
            "255 characters is too long"
        );
    }

    #[test]
    fn spiffe_ids() {
        assert_eq!(
            parse_spiffe_id("spiffe://xcc.test/cluster/west"),
            Ok(Identity::Cluster {
                trust_domain: "xcc.test".into(),
                name: "west".into()
            })
        );
        assert_eq!(
            parse_spiffe_id("spiffe://xcc.test/admin/alice"),
            Ok(Identity::Admin {
                trust_domain: "xcc.test".into(),
                name: "alice".into()
            })
        );
        let cases = [
            (
                "SPIFFE://xcc.test/cluster/west",
                "the scheme must be lowercase \"spiffe\"",
            ),
            (
                "spiffe://xcc.test",
                "no path; expected /cluster/<name> or /admin/<name>",
            ),
            (
                "spiffe://Xcc.test/cluster/west",
                "the trust domain is not a lowercase DNS name",
            ),
            (
                "spiffe://xcc.test/cluster",
                "the path must be /cluster/<name> or /admin/<name>",
            ),
            (
                "spiffe://xcc.test/ns/default/sa/x",
                "the path must be /cluster/<name> or /admin/<name>",
            ),
            (
                "spiffe://xcc.test/cluster/west/extra",
                "the name is not a DNS-1123 label (lowercase alphanumerics and '-', 1-63 characters)",
            ),
            (
                "spiffe://xcc.test/cluster/",
                "the name is not a DNS-1123 label (lowercase alphanumerics and '-', 1-63 characters)",
            ),
            (
                "spiffe://xcc.test/cluster/West",
                "the name is not a DNS-1123 label (lowercase alphanumerics and '-', 1-63 characters)",
            ),
            (
                "spiffe://xcc.test/cluster/west?x=1",
                "the name is not a DNS-1123 label (lowercase alphanumerics and '-', 1-63 characters)",
            ),
        ];
        for (uri, reason) in cases {
            assert_eq!(
                parse_spiffe_id(uri),
                Err(IdentityError::InvalidSpiffeId {
                    uri: uri.into(),
                    reason
                }),
                "{uri}"
            );
        }
    }

    #[test]
    fn display_and_accessors() {
        let c = Identity::Cluster {
            trust_domain: "xcc.test".into(),
            name: "west".into(),
        };
        let a = Identity::Admin {
            trust_domain: "xcc.test".into(),
            name: "alice".into(),
        };
        let e = Identity::External("hamlet.example.com".into());
        assert_eq!(
            [c.to_string(), a.to_string(), e.to_string()],
            ["cluster/west", "admin/alice", "external/hamlet.example.com"]
        );
        assert_eq!(
            [c.name(), a.name(), e.name()],
            ["west", "alice", "hamlet.example.com"]
        );
        assert_eq!(
            [c.is_cluster(), a.is_cluster(), e.is_cluster()],
            [true, false, false]
        );
        assert_eq!(
            [c.is_admin(), a.is_admin(), e.is_admin()],
            [false, true, false]
        );
        assert_eq!(
            c.spiffe_id().as_deref(),
            Some("spiffe://xcc.test/cluster/west")
        );
        assert_eq!(
            a.spiffe_id().as_deref(),
            Some("spiffe://xcc.test/admin/alice")
        );
        assert_eq!(e.spiffe_id(), None);
        assert_eq!(c.trust_domain(), Some("xcc.test"));
        assert_eq!(e.trust_domain(), None);
    }

    #[test]
    fn trust_domain_uris() {
        assert_eq!(
            parse_trust_domain_uri("spiffe://xcc.test"),
            Some("xcc.test")
        );
        assert_eq!(
            parse_trust_domain_uri("spiffe://xcc.test/"),
            Some("xcc.test")
        );
        assert_eq!(parse_trust_domain_uri("spiffe://xcc.test/cluster/a"), None);
        assert_eq!(parse_trust_domain_uri("https://xcc.test"), None);
    }
}
