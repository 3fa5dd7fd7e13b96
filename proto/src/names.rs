//! Names XCC objects are known by: the label/annotation keys and other constants of XCC v1,
//! and the derivations that turn an FQDN and a RemoteRegistry name into object names, exactly
//! as XCC v1 derives them (FNV-1a suffixes, DNS-1035 Service names).
//!
//! Inputs are FQDNs received from peers and names read from the API server or from files, so
//! nothing here panics on odd input: [`canonical_fqdn`] rejects what is not a DNS name with an
//! error that names the rule and quotes the input, and [`service_name`] always yields a valid
//! DNS-1035 label.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use thiserror::Error;

/// Prefix of every XCC label and annotation key (no slash). The reference server passes through
/// annotations whose key starts with this string.
pub const LABEL_PREFIX: &str = "connectivity.tanzu.vmware.com";
/// Label marking an exported ServiceRecord (and, on an HTTPProxy, the user's intent to export).
/// Its presence matters; its value is `""`.
pub const EXPORT_LABEL: &str = "connectivity.tanzu.vmware.com/export";
/// Label marking a ServiceRecord created by the importer; presence matters, value `""`.
pub const IMPORTED_LABEL: &str = "connectivity.tanzu.vmware.com/imported";
/// Label on imported ServiceRecords; value = the RemoteRegistry's `metadata.name` (unhashed).
pub const REMOTE_REGISTRY_LABEL: &str = "connectivity.tanzu.vmware.com/remote-registry";
/// ServiceRecord annotation: decimal port of the importer's Service. Travels as a Hamlet label.
pub const SERVICE_PORT_ANNOTATION: &str = "connectivity.tanzu.vmware.com/service-port";
/// ServiceRecord annotation (xcc addition): the pod selector of the exported workload as
/// `key=value,...` (sorted), copied by the publisher from the exporting Service's
/// `spec.selector`; on other exports (an HTTPProxy) the user sets it on the source. Grant
/// policies (`--grant-mode istio|cilium`) select the workload with it.
pub const WORKLOAD_SELECTOR_ANNOTATION: &str = "connectivity.tanzu.vmware.com/workload-selector";
/// Optional ServiceRecord annotation: a load-balancer VIP the binder writes into the Service's
/// `status.loadBalancer.ingress[0].ip`.
pub const VIP_ANNOTATION: &str = "connectivity.tanzu.vmware.com/vip";
/// Annotation on binder-created Services naming the FQDN they serve; read by the DNS server.
pub const FQDN_ANNOTATION: &str = "connectivity.tanzu.vmware.com/fqdn";
/// Defined by XCC v1, unused there.
pub const CLUSTER_NAME_LABEL: &str = "connectivity.tanzu.vmware.com/cluster-name";
/// Defined by XCC v1, unused there.
pub const CLUSTER_NAMESPACE_LABEL: &str = "connectivity.tanzu.vmware.com/cluster-namespace";
/// Annotation listing the clusters allowed to request a service (comma-separated cluster names).
pub const CLUSTERS_ANNOTATION: &str = "connectivity.tanzu.vmware.com/clusters";
/// Namespace XCC is deployed in and imports into (the registry's `NAMESPACE` default).
pub const DEFAULT_NAMESPACE: &str = "cross-cluster-connectivity";
/// Kubernetes API group of ServiceRecord and RemoteRegistry.
pub const API_GROUP: &str = "connectivity.tanzu.vmware.com";
/// The only served version of [`API_GROUP`].
pub const API_GROUP_VERSION: &str = "v1alpha1";
/// `apiVersion` of ServiceRecord and RemoteRegistry objects.
pub const API_VERSION: &str = "connectivity.tanzu.vmware.com/v1alpha1";
/// `kind` of a ServiceRecord.
pub const SERVICE_RECORD_KIND: &str = "ServiceRecord";
/// `kind` of a RemoteRegistry.
pub const REMOTE_REGISTRY_KIND: &str = "RemoteRegistry";
/// DNS zone of multi-cluster service names (`<svc>.<ns>.svc.clusterset.local`).
pub const CLUSTERSET_ZONE: &str = "clusterset.local";
/// The RemoteRegistry status condition type.
pub const VALID_CONDITION: &str = "Valid";
/// Reason of a `Valid=False` RemoteRegistry condition caused by `spec.allowedDomains`.
pub const INVALID_DOMAIN_REASON: &str = "InvalidDomain";
/// The only protocol XCC puts in `FederatedService.protocols`.
pub const HAMLET_PROTOCOL_HTTPS: &str = "https";
/// Node role label whose nodes the publisher skips.
pub const NODE_ROLE_MASTER_LABEL: &str = "node-role.kubernetes.io/master";

/// Longest DNS name in text form, without the trailing dot (RFC 1035: 255 octets on the wire).
pub const MAX_FQDN_LEN: usize = 253;
/// Longest DNS label (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;
/// Bytes of the dashed FQDN kept in a binder Service name: 54 + `-` + 8 hex digits = 63, the
/// DNS-1035 label limit (XCC v1's rule).
pub const SERVICE_NAME_BASE_LEN: usize = 54;

/// Whether `name` is a Kubernetes DNS-1123 label (the rule for namespace and cluster names):
/// 1 to 63 characters of `[a-z0-9-]`, starting and ending with a letter or digit. No dot and no
/// slash, so a label is always one safe path component.
pub fn is_dns1123_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=MAX_LABEL_LEN).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Longest port name of a ServiceRecord (a DNS-1123 label).
pub const MAX_PORT_NAME_LEN: usize = MAX_LABEL_LEN;

/// Whether `name` is a port name as Kubernetes checks the port names of a Service and of an
/// EndpointSlice, and as the ServiceRecord CRD bounds `spec.ports[].name`: a
/// [DNS-1123 label](is_dns1123_label). (Container port names are IANA service names, at most 15
/// characters; a Service's port names, which an export carries, are not held to that.)
pub fn is_port_name(name: &str) -> bool {
    is_dns1123_label(name)
}

/// Whether `name` is a Kubernetes DNS-1123 subdomain (the rule for most object names, e.g. a
/// ServiceRecord or a service account): at most 253 characters, dot-separated
/// [labels](is_dns1123_label) of `[a-z0-9-]`. Parts are never empty, so `.` and `..` are not
/// subdomains and a subdomain is always one safe path component.
pub fn is_dns1123_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_FQDN_LEN
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// Whether `value` is a valid Kubernetes label value: at most 63 characters of
/// `[A-Za-z0-9-_.]`, empty or starting and ending with a letter or digit.
pub fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.is_empty()
        || (bytes.len() <= MAX_LABEL_LEN
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric))
}

/// Why an FQDN was rejected. Every message quotes the input as given.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum FqdnError {
    /// Nothing left after stripping one trailing dot.
    #[error("invalid FQDN {input:?}: must not be empty")]
    Empty {
        /// The input as given.
        input: String,
    },
    /// Longer than [`MAX_FQDN_LEN`] characters without the trailing dot.
    #[error("invalid FQDN {input:?}: {len} characters, at most 253 are allowed")]
    TooLong {
        /// The input as given.
        input: String,
        /// Length of the canonical form.
        len: usize,
    },
    /// Two consecutive dots, or a leading dot.
    #[error("invalid FQDN {input:?}: label {index} is empty")]
    EmptyLabel {
        /// The input as given.
        input: String,
        /// 1-based position of the label.
        index: usize,
    },
    /// A label longer than [`MAX_LABEL_LEN`].
    #[error("invalid FQDN {input:?}: label {label:?} has {len} characters, at most 63 are allowed")]
    LabelTooLong {
        /// The input as given.
        input: String,
        /// The offending label (lowercased).
        label: String,
        /// Its length.
        len: usize,
    },
    /// A character other than `a-z`, `0-9`, `-` (after ASCII lowercasing) or `.`.
    #[error(
        "invalid FQDN {input:?}: character {character:?} is not allowed (only letters, digits, '-' and '.')"
    )]
    InvalidCharacter {
        /// The input as given.
        input: String,
        /// The first offending character.
        character: char,
    },
    /// A label starting or ending with `-`.
    #[error("invalid FQDN {input:?}: label {label:?} starts or ends with '-'")]
    Hyphen {
        /// The input as given.
        input: String,
        /// The offending label (lowercased).
        label: String,
    },
    /// The last label is all digits.
    #[error("invalid FQDN {input:?}: top-level label {label:?} is all-numeric")]
    NumericTld {
        /// The input as given.
        input: String,
        /// The top-level label.
        label: String,
    },
    /// A derived object name exceeds [`MAX_FQDN_LEN`].
    #[error(
        "FQDN {input:?} is too long for an imported record name: {name:?} has {len} characters, at most 253 are allowed"
    )]
    NameTooLong {
        /// The FQDN as given.
        input: String,
        /// The derived name.
        name: String,
        /// Its length.
        len: usize,
    },
}

/// 32-bit FNV-1a over the UTF-8 bytes of `s` (offset basis `0x811c9dc5`, prime `0x01000193`).
pub fn fnv1a32(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// [`fnv1a32`] as 8 lowercase hex digits, zero-padded: the name suffix of XCC v1's derived names.
pub fn hash8(s: &str) -> String {
    format!("{:08x}", fnv1a32(s))
}

/// ASCII-lowercase `raw` and strip one trailing dot, without validating anything.
fn lowercase_without_dot(raw: &str) -> String {
    raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase()
}

/// The canonical form of an FQDN: ASCII-lowercased, one trailing dot stripped, and checked to be
/// a DNS host name — 1 to 253 characters, labels of 1 to 63 characters from `[a-z0-9-]` that
/// neither start nor end with `-`, and a top-level label that is not all digits.
pub fn canonical_fqdn(raw: &str) -> Result<String, FqdnError> {
    let input = || raw.to_string();
    let name = lowercase_without_dot(raw);
    if name.is_empty() {
        return Err(FqdnError::Empty { input: input() });
    }
    if let Some(character) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(FqdnError::InvalidCharacter {
            input: input(),
            character,
        });
    }
    if name.len() > MAX_FQDN_LEN {
        return Err(FqdnError::TooLong {
            input: input(),
            len: name.len(),
        });
    }
    let mut last = "";
    for (i, label) in name.split('.').enumerate() {
        if label.is_empty() {
            return Err(FqdnError::EmptyLabel {
                input: input(),
                index: i + 1,
            });
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(FqdnError::LabelTooLong {
                input: input(),
                label: label.to_string(),
                len: label.len(),
            });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(FqdnError::Hyphen {
                input: input(),
                label: label.to_string(),
            });
        }
        last = label;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FqdnError::NumericTld {
            input: input(),
            label: last.to_string(),
        });
    }
    Ok(name)
}

/// Name of the ServiceRecord the importer creates for `fqdn` received from the RemoteRegistry
/// named `remote_registry` (XCC v1's rule): `canonical_fqdn(fqdn) + "-" + hash8(remote_registry)`.
///
/// Fails when the FQDN is not a DNS name or the result exceeds 253 characters (FQDNs longer than
/// 244 characters).
pub fn imported_record_name(fqdn: &str, remote_registry: &str) -> Result<String, FqdnError> {
    let name = format!("{}-{}", canonical_fqdn(fqdn)?, hash8(remote_registry));
    if name.len() > MAX_FQDN_LEN {
        return Err(FqdnError::NameTooLong {
            input: fqdn.to_string(),
            len: name.len(),
            name,
        });
    }
    Ok(name)
}

/// Name of the binder's Service / Endpoints for `fqdn` (XCC v1's rule), always a DNS-1035 label of
/// at most 63 characters.
///
/// For a canonical FQDN that starts with a letter this equals XCC v1: dots become dashes, the first
/// 54 bytes are kept, and `-` + [`hash8`] of the FQDN is appended. Fixes over v1 (whose names came
/// from the raw FQDN, so uppercase or a leading digit gave invalid names): the FQDN is
/// canonicalised first (ASCII lowercase, one trailing dot stripped) and the hash is taken over that
/// form, so `Foo.Example.` and `foo.example` share a Service; characters outside `[a-z0-9-]` become
/// `-`; dashes left at the end of the truncated base are stripped; and a base that does not start
/// with a letter gets an `x` prefix (keeping 53 bytes of it).
pub fn service_name(fqdn: &str) -> String {
    let canonical = lowercase_without_dot(fqdn);
    let dashed: String = canonical
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    // `dashed` is ASCII, so byte truncation cannot split a character.
    let starts_with_letter = dashed.starts_with(|c: char| c.is_ascii_lowercase());
    let (prefix, keep) = if starts_with_letter {
        ("", SERVICE_NAME_BASE_LEN)
    } else {
        ("x", SERVICE_NAME_BASE_LEN - 1)
    };
    let base = dashed[..dashed.len().min(keep)].trim_end_matches('-');
    format!("{prefix}{base}-{}", hash8(&canonical))
}

/// Name of an object xcc generates (network / authorization policies): `prefix`
/// followed by the first 8 hex digits of the SHA-256 of `parts` joined by `/`.
pub fn policy_object_name(prefix: &str, parts: &[&str]) -> String {
    let digest = Sha256::digest(parts.join("/").as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// Most entries a workload selector may have.
pub const MAX_SELECTOR_LABELS: usize = 32;

/// Whether `key` is a Kubernetes label key: an optional DNS-1123 subdomain prefix and `/`, then
/// a name of 1 to 63 characters of `[A-Za-z0-9-_.]` starting and ending with a letter or digit.
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    prefix.is_none_or(is_dns1123_subdomain) && !name.is_empty() && is_label_value(name)
}

/// Why [`parse_selector`] refused a selector; the entry variants quote the offending entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("{0:?} is not key=value")]
    NotKeyValue(String),
    #[error("{0:?} is not a label key and value")]
    NotLabel(String),
    #[error("key {0:?} given twice")]
    KeyTwice(String),
    #[error("more than {MAX_SELECTOR_LABELS} entries")]
    TooMany,
}

/// A selector written as `key=value,...` (as [`format_selector`] writes it): at least one and at
/// most [`MAX_SELECTOR_LABELS`] entries, each key a [label key](is_label_key) given once, each
/// value a [label value](is_label_value).
pub fn parse_selector(raw: &str) -> Result<BTreeMap<String, String>, SelectorError> {
    let mut out = BTreeMap::new();
    for item in raw.split(',') {
        let Some((key, value)) = item.split_once('=') else {
            return Err(SelectorError::NotKeyValue(item.to_string()));
        };
        if !is_label_key(key) || !is_label_value(value) {
            return Err(SelectorError::NotLabel(item.to_string()));
        }
        if out.insert(key.to_string(), value.to_string()).is_some() {
            return Err(SelectorError::KeyTwice(key.to_string()));
        }
        if out.len() > MAX_SELECTOR_LABELS {
            return Err(SelectorError::TooMany);
        }
    }
    Ok(out)
}

/// `key=value,...` of a selector, sorted by key (what [`parse_selector`] reads).
pub fn format_selector(selector: &BTreeMap<String, String>) -> String {
    selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The multi-cluster name of a Service: `<service>.<namespace>.svc.clusterset.local`.
pub fn clusterset_fqdn(service: &str, namespace: &str) -> String {
    format!("{service}.{namespace}.svc.{CLUSTERSET_ZONE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(n: usize) -> String {
        "a".repeat(n)
    }

    #[test]
    fn hash_vectors_of_reference_2_7() {
        let table = [
            ("shared-services-cls", "6068d556"),
            ("some-remote-registry", "06df7236"),
            ("shared-services-registry", "a8ccffed"),
            ("workloads-registry", "4052d497"),
            ("test.some.domain", "cc9e50dd"),
            ("nginx.xcc.test", "7f232f67"),
            ("", "811c9dc5"),
        ];
        for (input, expected) in table {
            assert_eq!(hash8(input), expected, "hash8({input:?})");
        }
        assert_eq!(hash8(&format!("{}.some.domain", a(62))), "c2657973");
        assert_eq!(fnv1a32(""), 0x811c_9dc5);
        assert_eq!(fnv1a32("some-remote-registry"), 0x06df_7236);
    }

    #[test]
    fn hash8_is_zero_padded() {
        // 0x06df7236 has a leading zero nibble.
        assert_eq!(hash8("some-remote-registry").len(), 8);
        assert!(hash8("some-remote-registry").starts_with('0'));
    }

    #[test]
    fn canonical_fqdn_accepts_and_normalises() {
        assert_eq!(canonical_fqdn("nginx.xcc.test").unwrap(), "nginx.xcc.test");
        assert_eq!(
            canonical_fqdn("Domain.WITH.Mixed.Case").unwrap(),
            "domain.with.mixed.case"
        );
        assert_eq!(canonical_fqdn("with.dot.").unwrap(), "with.dot");
        assert_eq!(canonical_fqdn("tld").unwrap(), "tld");
        assert_eq!(canonical_fqdn("123.local").unwrap(), "123.local");
        assert_eq!(canonical_fqdn("xn--6qq79v.com").unwrap(), "xn--6qq79v.com");
        let long_label = format!("{}.some.domain", a(63));
        assert_eq!(canonical_fqdn(&long_label).unwrap(), long_label);
        // 4 × 63 + 3 dots = 255 > 253; 3 × 63 + 61 + 3 dots = 253.
        let max = format!("{0}.{0}.{0}.{1}", a(63), a(61));
        assert_eq!(max.len(), 253);
        assert_eq!(canonical_fqdn(&format!("{max}.")).unwrap(), max);
    }

    #[test]
    fn canonical_fqdn_rejects_with_rule_and_input() {
        let mut cases: Vec<(String, String)> = vec![
            ("".into(), r#"invalid FQDN "": must not be empty"#.into()),
            (".".into(), r#"invalid FQDN ".": must not be empty"#.into()),
            ("a..".into(), r#"invalid FQDN "a..": label 2 is empty"#.into()),
            ("example..com".into(), r#"invalid FQDN "example..com": label 2 is empty"#.into()),
            (".com".into(), r#"invalid FQDN ".com": label 1 is empty"#.into()),
            (
                "foo_bar.com".into(),
                r#"invalid FQDN "foo_bar.com": character '_' is not allowed (only letters, digits, '-' and '.')"#.into(),
            ),
            (
                "你好.com".into(),
                r#"invalid FQDN "你好.com": character '你' is not allowed (only letters, digits, '-' and '.')"#.into(),
            ),
            (
                "a b.com".into(),
                r#"invalid FQDN "a b.com": character ' ' is not allowed (only letters, digits, '-' and '.')"#.into(),
            ),
            (
                "example.-domain.com".into(),
                r#"invalid FQDN "example.-domain.com": label "-domain" starts or ends with '-'"#.into(),
            ),
            (
                "Example-.com".into(),
                r#"invalid FQDN "Example-.com": label "example-" starts or ends with '-'"#.into(),
            ),
            ("example.123".into(), r#"invalid FQDN "example.123": top-level label "123" is all-numeric"#.into()),
            ("10.0.0.1".into(), r#"invalid FQDN "10.0.0.1": top-level label "1" is all-numeric"#.into()),
        ];
        cases.push((
            format!("{}.com", a(64)),
            format!(
                "invalid FQDN \"{0}.com\": label \"{0}\" has 64 characters, at most 63 are allowed",
                a(64)
            ),
        ));
        for (input, expected) in cases {
            assert_eq!(
                canonical_fqdn(&input).unwrap_err().to_string(),
                expected,
                "input {input:?}"
            );
        }
        let too_long = format!("{0}.{0}.{0}.{1}", a(63), a(62));
        assert_eq!(
            canonical_fqdn(&too_long).unwrap_err(),
            FqdnError::TooLong {
                input: too_long.clone(),
                len: 254
            }
        );
    }

    #[test]
    fn canonical_fqdn_strips_only_one_dot() {
        assert_eq!(
            canonical_fqdn("a.b..").unwrap_err(),
            FqdnError::EmptyLabel {
                input: "a.b..".into(),
                index: 3
            }
        );
    }

    #[test]
    fn imported_record_names() {
        let cases = [
            (
                "some-service.some.domain",
                "some-remote-registry",
                "some-service.some.domain-06df7236",
            ),
            (
                "foobar.some.domain",
                "shared-services-cls",
                "foobar.some.domain-6068d556",
            ),
            (
                "domain.WITH.mixed.case",
                "some-remote-registry",
                "domain.with.mixed.case-06df7236",
            ),
            (
                "domain.with.dot.at.end.",
                "some-remote-registry",
                "domain.with.dot.at.end-06df7236",
            ),
        ];
        for (fqdn, rr, expected) in cases {
            assert_eq!(imported_record_name(fqdn, rr).unwrap(), expected);
        }
        let long = format!("{}.some.domain", a(63));
        assert_eq!(
            imported_record_name(&long, "some-remote-registry").unwrap(),
            format!("{long}-06df7236")
        );
    }

    #[test]
    fn imported_record_name_length_limit() {
        // 244-character FQDN + 9 = 253: accepted; 245 + 9 = 254: rejected.
        let ok = format!("{0}.{0}.{0}.{1}", a(60), a(61));
        assert_eq!(ok.len(), 244);
        assert_eq!(imported_record_name(&ok, "rr").unwrap().len(), 253);
        let too_long = format!("{0}.{0}.{0}.{1}", a(60), a(62));
        let err = imported_record_name(&too_long, "rr").unwrap_err();
        assert_eq!(
            err,
            FqdnError::NameTooLong {
                input: too_long.clone(),
                name: format!("{too_long}-{}", hash8("rr")),
                len: 254
            }
        );
        assert!(
            err.to_string()
                .starts_with(&format!("FQDN \"{too_long}\" is too long"))
        );
        assert_eq!(
            imported_record_name("", "rr").unwrap_err(),
            FqdnError::Empty {
                input: String::new()
            }
        );
    }

    #[test]
    fn service_names_keep_parity_for_canonical_input() {
        assert_eq!(
            service_name("test.some.domain"),
            "test-some-domain-cc9e50dd"
        );
        assert_eq!(service_name("nginx.xcc.test"), "nginx-xcc-test-7f232f67");
        let long = format!("{}.some.domain", a(62));
        assert_eq!(service_name(&long), format!("{}-c2657973", a(54)));
    }

    #[test]
    fn service_names_canonicalise_first() {
        assert_eq!(
            service_name("Test.Some.Domain."),
            "test-some-domain-cc9e50dd"
        );
        assert_eq!(
            service_name("NGINX.xcc.test"),
            service_name("nginx.xcc.test")
        );
    }

    #[test]
    fn service_names_are_dns_1035_labels() {
        let digits = "123.example.com";
        assert_eq!(
            service_name(digits),
            format!("x123-example-com-{}", hash8(digits))
        );
        let long_digits = format!("9{}.example.com", a(70));
        let name = service_name(&long_digits);
        assert_eq!(name, format!("x9{}-{}", a(52), hash8(&long_digits)));
        assert_eq!(name.len(), 63);
        assert_eq!(service_name(""), "x-811c9dc5");
        assert_eq!(
            service_name("_srv.foo"),
            format!("x-srv-foo-{}", hash8("_srv.foo"))
        );
        // Truncation lands right after a dot: the dangling dash is stripped.
        let dotted = format!("{}.tail.example", a(53));
        assert_eq!(
            service_name(&dotted),
            format!("{}-{}", a(53), hash8(&dotted))
        );
        for input in [
            "Ünïcode.example",
            "a.b",
            "-lead.example",
            &format!("{}.x", "9".repeat(80)),
        ] {
            let name = service_name(input);
            assert!(name.len() <= 63, "{name}");
            assert!(name.starts_with(|c: char| c.is_ascii_lowercase()), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
            assert!(!name.ends_with('-'), "{name}");
        }
        assert_eq!(
            service_name("Ünïcode.example"),
            format!("x-n-code-example-{}", hash8("Ünïcode.example"))
        );
    }

    #[test]
    fn policy_object_names() {
        // SHA-256("a/b") = c14cddc033f64b9dea80ea675cf280a015e672516090a5626781153dc68fea11
        assert_eq!(
            policy_object_name("xcc-allow-", &["a", "b"]),
            "xcc-allow-c14cddc0"
        );
        // SHA-256("") = e3b0c442...
        assert_eq!(policy_object_name("p-", &[]), "p-e3b0c442");
        assert_ne!(
            policy_object_name("p-", &["a/b"]),
            policy_object_name("p-", &["a", "c"]),
        );
    }

    #[test]
    fn clusterset_names() {
        assert_eq!(
            clusterset_fqdn("web", "shop"),
            "web.shop.svc.clusterset.local"
        );
    }

    #[test]
    fn selectors_round_trip_and_refuse_what_is_not_a_label() {
        let sel = BTreeMap::from([
            ("app.kubernetes.io/name".to_string(), "api".to_string()),
            ("tier".to_string(), "".to_string()),
        ]);
        let text = format_selector(&sel);
        assert_eq!(text, "app.kubernetes.io/name=api,tier=");
        assert_eq!(parse_selector(&text), Ok(sel));
        let not_key_value = parse_selector("app").unwrap_err();
        assert_eq!(not_key_value, SelectorError::NotKeyValue("app".into()));
        assert_eq!(not_key_value.to_string(), r#""app" is not key=value"#);
        let twice = parse_selector("a=1,a=2").unwrap_err();
        assert_eq!(twice, SelectorError::KeyTwice("a".into()));
        assert_eq!(twice.to_string(), r#"key "a" given twice"#);
        let not_label = parse_selector("a b=c").unwrap_err();
        assert_eq!(not_label, SelectorError::NotLabel("a b=c".into()));
        assert_eq!(
            not_label.to_string(),
            r#""a b=c" is not a label key and value"#
        );
        for bad in [
            "",
            "=x",
            "a b=c",
            "Bad_/x=1",
            "a=b c",
            "a/b/c=1",
            "-a=1",
            &format!("a={}", "x".repeat(64)),
        ] {
            assert!(parse_selector(bad).is_err(), "{bad:?}");
        }
        let many: Vec<String> = (0..=MAX_SELECTOR_LABELS)
            .map(|i| format!("k{i}=v"))
            .collect();
        let too_many = parse_selector(&many.join(",")).unwrap_err();
        assert_eq!(too_many, SelectorError::TooMany);
        assert_eq!(
            too_many.to_string(),
            format!("more than {MAX_SELECTOR_LABELS} entries")
        );
    }
}
