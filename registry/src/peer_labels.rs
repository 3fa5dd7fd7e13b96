//! What a peer may say about a service besides its name, endpoints and ports: the record
//! annotations that travel as labels (Hamlet `FederatedService.labels`, federation
//! `ServiceAnnouncement.labels` and `ServiceQueryResponse.labels`). Pure.
//!
//! Every path on which labels arrive from the wire — a Hamlet import, a child's announcement, a
//! parent's answer — keeps only what [`allowed`] keeps (an allow-list, values checked), so no path
//! admits what another refuses: a lying peer can neither inject an arbitrary annotation into an
//! imported record nor mark a service headless with hostnames of addresses it does not serve. A
//! label that is not kept costs that label, never the entry.
//!
//! Two kinds travel:
//! - *control labels* ([`CONTROL_KEYS`]), each with its own rule (a port, an IP, a pair of
//!   DNS-1123 labels, ...). The origin pair names a DNS name, `<name>.<ns>.svc.clusterset.local`
//!   (and the headless pod names below it); [`keep_origin_if`] drops it unless that name passes
//!   the same check as the record's FQDN at the receiver (its `allowedDomains` on a Hamlet
//!   import; in a tree, that it *is* the FQDN, the name the parent's one-owner rule holds).
//! - *policy labels* ([`policy_labels`]): `connectivity.tanzu.vmware.com/<name>: <value>` with a
//!   Kubernetes label name and value and a name no xcc key uses, at most [`MAX_POLICY_LABELS`]
//!   of them. They name nothing (no DNS name, no address, no Kubernetes object); Cedar policies
//!   see them as `resource.labels` (`"<name>=<value>"`), identically at every level, because
//!   every level keeps exactly the same ones.

use std::collections::BTreeMap;

use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION, validate_namespace};
use xcc_proto::mcs::{
    EXPORTED_ANNOTATIONS_ANNOTATION, EXPORTED_AT_ANNOTATION, EXPORTED_LABELS_ANNOTATION,
    HEADLESS_ANNOTATION, HEADLESS_TRUE, HOSTNAMES_ANNOTATION, ServiceTraits, TRAIT_KEYS,
    format_exported_metadata, parse_exported_metadata,
};
use xcc_proto::names::{
    CLUSTER_NAME_LABEL, CLUSTER_NAMESPACE_LABEL, CLUSTERS_ANNOTATION, EXPORT_LABEL,
    FQDN_ANNOTATION, IMPORTED_LABEL, REMOTE_REGISTRY_LABEL, SERVICE_PORT_ANNOTATION,
    VIP_ANNOTATION, WORKLOAD_SELECTOR_ANNOTATION,
};

use xcc_proto::propagation::CHANGED_AT_ANNOTATION;

use crate::catalog::Endpoint;

/// The control keys [`allowed`] may keep, in the order of its rules.
pub const CONTROL_KEYS: [&str; 14] = [
    SERVICE_PORT_ANNOTATION,
    VIP_ANNOTATION,
    ORIGIN_NAMESPACE_ANNOTATION,
    ORIGIN_NAME_ANNOTATION,
    HEADLESS_ANNOTATION,
    HOSTNAMES_ANNOTATION,
    EXPORTED_AT_ANNOTATION,
    TRAIT_KEYS[0],
    TRAIT_KEYS[1],
    TRAIT_KEYS[2],
    TRAIT_KEYS[3],
    EXPORTED_LABELS_ANNOTATION,
    EXPORTED_ANNOTATIONS_ANNOTATION,
    CHANGED_AT_ANNOTATION,
];

/// The prefix of every label that travels (XCC's pass-through annotations, matched with the
/// slash).
pub const PREFIX: &str = "connectivity.tanzu.vmware.com/";

/// Keys under [`PREFIX`] that xcc itself uses besides the [`CONTROL_KEYS`]: with those, never
/// policy labels, whatever their value (the control keys travel by their own rules, these stay
/// where they were written).
pub const OTHER_RESERVED_KEYS: [&str; 11] = [
    xcc_proto::ports::PORTS_LABEL,
    WORKLOAD_SELECTOR_ANNOTATION,
    FQDN_ANNOTATION,
    CLUSTERS_ANNOTATION,
    xcc_proto::crd::SOURCE_CLUSTER_ANNOTATION,
    EXPORT_LABEL,
    IMPORTED_LABEL,
    REMOTE_REGISTRY_LABEL,
    CLUSTER_NAME_LABEL,
    CLUSTER_NAMESPACE_LABEL,
    "connectivity.tanzu.vmware.com/managed-by",
];

/// Whether `key` is one xcc itself uses (a control key or another of its own).
pub fn is_reserved(key: &str) -> bool {
    CONTROL_KEYS.contains(&key) || OTHER_RESERVED_KEYS.contains(&key)
}

/// At most this many policy labels per service (a Kubernetes object rarely carries more; with
/// names and values of at most 63 bytes they cost at most ~5 KiB per service at every level).
/// An export with more is refused at its own registry ([`check_export`]), so no level ever has
/// to drop one a policy could test; from a peer, the first ones by name are kept.
pub const MAX_POLICY_LABELS: usize = 32;

/// The longest policy label name and value (a Kubernetes label name and value).
pub const MAX_POLICY_LABEL_LEN: usize = 63;

/// Why a label is not a policy label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyLabelError {
    #[error("{0:?} is a key xcc uses itself, not a policy label")]
    Reserved(String),
    #[error(
        "label name {0:?} is not a Kubernetes label name (1-63 of [A-Za-z0-9._-], starting and ending alphanumeric)"
    )]
    Name(String),
    #[error(
        "label value {0:?} is not a Kubernetes label value (0-63 of [A-Za-z0-9._-], starting and ending alphanumeric)"
    )]
    Value(String),
    #[error("{count} policy labels; at most {MAX_POLICY_LABELS} travel")]
    TooMany { count: usize },
}

/// A Kubernetes label name without prefix, or (`may_be_empty`) a label value.
fn is_label_text(s: &str, may_be_empty: bool) -> bool {
    if s.is_empty() {
        return may_be_empty;
    }
    let b = s.as_bytes();
    b.len() <= MAX_POLICY_LABEL_LEN
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// The policy label `key: value` stands for (`name`, `value`), or why it is none. `None` when
/// the key is not under [`PREFIX`] at all (not a travelling label).
pub fn policy_label<'a>(
    key: &'a str,
    value: &'a str,
) -> Option<Result<(&'a str, &'a str), PolicyLabelError>> {
    let name = key.strip_prefix(PREFIX)?;
    Some(if is_reserved(key) {
        Err(PolicyLabelError::Reserved(key.to_string()))
    } else if !is_label_text(name, false) {
        Err(PolicyLabelError::Name(name.to_string()))
    } else if !is_label_text(value, true) {
        Err(PolicyLabelError::Value(value.to_string()))
    } else {
        Ok((name, value))
    })
}

/// Whether `text` is a `name=value` Cedar's `resource.labels` can ever hold.
pub fn check_policy_text(text: &str) -> Result<(), PolicyLabelError> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| PolicyLabelError::Name(text.to_string()))?;
    let key = format!("{PREFIX}{name}");
    match policy_label(&key, value) {
        Some(Err(e)) => Err(e),
        _ if name.contains('/') => Err(PolicyLabelError::Name(name.to_string())),
        _ => Ok(()),
    }
}

/// The policy labels among `labels` (sorted by key), as (`name`, `value`), at most
/// [`MAX_POLICY_LABELS`]: what travels and what Cedar sees.
pub fn policy_labels<'a>(
    labels: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> impl Iterator<Item = (&'a str, &'a str)> {
    labels
        .into_iter()
        .filter_map(|(k, v)| policy_label(k, v).and_then(Result::ok))
        .take(MAX_POLICY_LABELS)
}

/// An export's labels checked at its own registry: more policy labels than travel is an error
/// (a policy testing one that is dropped would silently stop matching). Keys under [`PREFIX`]
/// that are no valid policy label are not refused (XCC v1 passes any such annotation through);
/// they do not travel beyond the peers that keep everything and no policy can test them (a
/// policy naming one is refused at load, [`check_policy_text`]).
pub fn check_export<'a>(
    labels: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), PolicyLabelError> {
    let count = labels
        .into_iter()
        .filter(|(k, v)| policy_label(k, v).is_some_and(|r| r.is_ok()))
        .count();
    if count > MAX_POLICY_LABELS {
        return Err(PolicyLabelError::TooMany { count });
    }
    Ok(())
}

/// The clusterset name the origin labels give a service, `<name>.<ns>.svc.clusterset.local`,
/// when both are there.
pub fn origin_name(labels: &BTreeMap<String, String>) -> Option<String> {
    let ns = labels.get(ORIGIN_NAMESPACE_ANNOTATION)?;
    let name = labels.get(ORIGIN_NAME_ANNOTATION)?;
    Some(xcc_proto::names::clusterset_fqdn(name, ns))
}

/// Drop the origin pair from `labels` unless the name it gives passes `may_serve` (the check
/// the receiver applies to the FQDN); the pod names of a headless service live below that
/// name, so they go with it. Returns the name dropped, if any, for the receiver to log.
pub fn keep_origin_if(
    labels: &mut BTreeMap<String, String>,
    may_serve: impl Fn(&str) -> bool,
) -> Option<String> {
    let name = origin_name(labels)?;
    if may_serve(&name) {
        return None;
    }
    labels.remove(ORIGIN_NAMESPACE_ANNOTATION);
    labels.remove(ORIGIN_NAME_ANNOTATION);
    Some(name)
}

/// [`keep_origin_if`] with the rule of a tree: the clusterset name must be the service's FQDN
/// (the name the parent's one-owner rule gave it), never a second name beside it.
pub fn keep_origin_in_tree(labels: &mut BTreeMap<String, String>, fqdn: &str) -> Option<String> {
    keep_origin_if(labels, |name| name == fqdn)
}

/// The labels of a service from a peer (looked up with `get`) that may be kept for it, given
/// its (already validated) `endpoints`:
/// - the service port, only as a port 1-65535; the VIP, only as an IP address;
/// - the origin namespace and name (MCS names, Cilium global Services), only as a pair of
///   DNS-1123 labels;
/// - the headless marker (MCS), only as `true`; with it the pods' hostnames, only the valid
///   `address=hostname` pairs of addresses among `endpoints` (the others are dropped, not the
///   entry), and not at all when none is left;
/// - the export's start time (MCS, [`EXPORTED_AT_ANNOTATION`]: the oldest export of a name
///   wins), only as an RFC 3339 time, rewritten in its canonical form (UTC, whole seconds);
/// - the Service fields a ServiceImport carries ([`ServiceTraits`]: `ClientIP` affinity and its
///   timeout, `Local` internal traffic policy, the traffic distribution), only as values of
///   those fields, in their canonical form;
/// - the ServiceExport's exported labels and annotations (MCS), only as JSON objects of
///   strings, each entry only with a Kubernetes key xcc does not set itself (and a label value
///   for a label), at most 16 KiB;
/// - the policy labels ([`policy_labels`]).
///
/// Every other key is dropped. `keys` lists the labels' keys in order (to find the policy
/// labels without knowing the map).
pub fn allowed<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
    endpoints: &[Endpoint],
) -> BTreeMap<String, String> {
    let get = |key: &str| {
        pairs
            .clone()
            .into_iter()
            .find_map(|(k, v)| (k == key).then_some(v))
    };
    let mut kept: BTreeMap<String, String> = policy_labels(pairs.clone())
        .map(|(name, value)| (format!("{PREFIX}{name}"), value.to_string()))
        .collect();
    if let Some(port) = get(SERVICE_PORT_ANNOTATION)
        && port.parse::<u16>().is_ok_and(|p| p > 0)
    {
        kept.insert(SERVICE_PORT_ANNOTATION.to_string(), port.to_string());
    }
    if let Some(vip) = get(VIP_ANNOTATION)
        && vip.parse::<std::net::IpAddr>().is_ok()
    {
        kept.insert(VIP_ANNOTATION.to_string(), vip.to_string());
    }
    if let (Some(ns), Some(name)) = (
        get(ORIGIN_NAMESPACE_ANNOTATION),
        get(ORIGIN_NAME_ANNOTATION),
    ) && validate_namespace(ns).is_ok()
        && validate_namespace(name).is_ok()
    {
        kept.insert(ORIGIN_NAMESPACE_ANNOTATION.to_string(), ns.to_string());
        kept.insert(ORIGIN_NAME_ANNOTATION.to_string(), name.to_string());
    }
    // The exporter's propagation stamp: milliseconds, at most 16 digits; anything else (garbage,
    // a 100 KB value) costs only the label. How far off the receiver's clock it may be is the
    // observer's business (`xcc_proto::propagation::latency`), not the allow-list's.
    if let Some(stamp) = get(CHANGED_AT_ANNOTATION)
        && xcc_proto::propagation::parse_stamp(stamp).is_ok()
    {
        kept.insert(CHANGED_AT_ANNOTATION.to_string(), stamp.to_string());
    }
    if get(HEADLESS_ANNOTATION) == Some(HEADLESS_TRUE) {
        kept.insert(HEADLESS_ANNOTATION.to_string(), HEADLESS_TRUE.to_string());
        if let Some(value) = get(HOSTNAMES_ANNOTATION) {
            let (mut hostnames, _) = xcc_proto::mcs::parse_hostnames(value);
            hostnames.retain(|address, _| endpoints.iter().any(|e| e.address == *address));
            if !hostnames.is_empty() {
                kept.insert(
                    HOSTNAMES_ANNOTATION.to_string(),
                    xcc_proto::mcs::format_hostnames(&hostnames),
                );
            }
        }
    }
    // The Service fields an MCS ServiceImport carries, each only as one of its values.
    kept.extend(ServiceTraits::of(get).annotations());
    // The ServiceExport's exported labels and annotations, only the entries a ServiceImport
    // may carry.
    for (key, labels) in [
        (EXPORTED_LABELS_ANNOTATION, true),
        (EXPORTED_ANNOTATIONS_ANNOTATION, false),
    ] {
        if let Some(value) = get(key)
            .map(|v| parse_exported_metadata(v, labels))
            .and_then(|m| format_exported_metadata(&m))
        {
            kept.insert(key.to_string(), value);
        }
    }
    if let Some(at) = get(EXPORTED_AT_ANNOTATION).and_then(xcc_proto::mcs::parse_exported_at) {
        kept.insert(
            EXPORTED_AT_ANNOTATION.to_string(),
            xcc_proto::mcs::format_exported_at(at),
        );
    }
    kept
}

/// [`allowed`] of a map.
pub fn allowed_of(
    labels: &BTreeMap<String, String>,
    endpoints: &[Endpoint],
) -> BTreeMap<String, String> {
    allowed(
        labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        endpoints,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(addresses: &[&str]) -> Vec<Endpoint> {
        addresses
            .iter()
            .map(|a| Endpoint {
                address: (*a).into(),
                port: 443,
            })
            .collect()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn keeps_every_allowed_key_with_a_valid_value() {
        let labels = map(&[
            (SERVICE_PORT_ANNOTATION, "5432"),
            (VIP_ANNOTATION, "fd00::10"),
            (ORIGIN_NAMESPACE_ANNOTATION, "shop"),
            (ORIGIN_NAME_ANNOTATION, "db"),
            (HEADLESS_ANNOTATION, "true"),
            (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0,10.4.0.2=db-1"),
            (EXPORTED_AT_ANNOTATION, "2026-11-29T07:16:06Z"),
            (TRAIT_KEYS[0], "ClientIP"),
            (TRAIT_KEYS[1], "600"),
            (TRAIT_KEYS[2], "Local"),
            (TRAIT_KEYS[3], "PreferClose"),
            (EXPORTED_LABELS_ANNOTATION, r#"{"team":"pay"}"#),
            (
                EXPORTED_ANNOTATIONS_ANNOTATION,
                r#"{"example.com/doc":"any text, even this"}"#,
            ),
            (CHANGED_AT_ANNOTATION, "1790000000123"),
        ]);
        assert_eq!(
            allowed_of(&labels, &endpoints(&["10.4.0.1", "10.4.0.2"])),
            labels
        );
        assert_eq!(
            labels.keys().map(String::as_str).collect::<Vec<_>>(),
            {
                let mut k = CONTROL_KEYS.to_vec();
                k.sort();
                k
            },
            "the test covers every allowed key"
        );
    }

    /// A hostile propagation stamp costs only itself: garbage, a negative number, a 100 KB value
    /// are dropped, the entry's other labels kept. (A far-future stamp is a valid number and is
    /// kept; the observer refuses to observe it, `xcc_proto::propagation::latency`.)
    #[test]
    fn a_hostile_propagation_stamp_costs_only_itself() {
        let huge = "9".repeat(100 * 1024);
        for bad in ["", "soon", "-5", "1.5", "0x10", huge.as_str()] {
            let labels = map(&[
                (SERVICE_PORT_ANNOTATION, "443"),
                (CHANGED_AT_ANNOTATION, bad),
            ]);
            assert_eq!(
                allowed_of(&labels, &[]),
                map(&[(SERVICE_PORT_ANNOTATION, "443")]),
                "{:.20}",
                bad
            );
        }
        // Never a policy label either.
        assert!(matches!(
            policy_label(CHANGED_AT_ANNOTATION, "123"),
            Some(Err(PolicyLabelError::Reserved(_)))
        ));
    }

    #[test]
    fn drops_unknown_keys_and_invalid_values() {
        let labels = map(&[
            ("connectivity.tanzu.vmware.com/other", "not a label value"),
            (xcc_proto::names::WORKLOAD_SELECTOR_ANNOTATION, "app=db"),
            ("team", "shop"),
            (SERVICE_PORT_ANNOTATION, "0"),
            (VIP_ANNOTATION, "not-an-ip"),
            (ORIGIN_NAMESPACE_ANNOTATION, "shop"),
            (ORIGIN_NAME_ANNOTATION, "Not_A_Label"),
            (HEADLESS_ANNOTATION, "yes"),
            (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0"),
            (EXPORTED_AT_ANNOTATION, "last tuesday"),
            (TRAIT_KEYS[0], "Sticky"),
            (TRAIT_KEYS[1], "600"),
            (TRAIT_KEYS[2], "Cluster"),
            (TRAIT_KEYS[3], "Prefer Close!"),
            (
                EXPORTED_LABELS_ANNOTATION,
                r#"{"team":"not a label value","Bad Key":"x"}"#,
            ),
            (
                EXPORTED_ANNOTATIONS_ANNOTATION,
                r#"{"app.kubernetes.io/managed-by":"me","connectivity.tanzu.vmware.com/vip":"1.2.3.4"}"#,
            ),
        ]);
        assert_eq!(
            allowed_of(&labels, &endpoints(&["10.4.0.1"])),
            BTreeMap::new()
        );
    }

    /// The export time every importer orders exports by (the oldest wins) is kept in one
    /// spelling, whatever offset or fraction the peer wrote it with, so two importers hearing
    /// the same time from different paths compare the same value.
    #[test]
    fn the_export_time_is_kept_in_its_canonical_form() {
        let labels = map(&[(EXPORTED_AT_ANNOTATION, "2026-11-29T09:16:06.75+02:00")]);
        assert_eq!(
            allowed_of(&labels, &[]),
            map(&[(EXPORTED_AT_ANNOTATION, "2026-11-29T07:16:06Z")])
        );
        assert_eq!(
            policy_label(EXPORTED_AT_ANNOTATION, "x"),
            Some(Err(PolicyLabelError::Reserved(
                EXPORTED_AT_ANNOTATION.into()
            )))
        );
    }

    /// Policy labels travel (valid, not reserved, bounded) so a label-based
    /// `forbid` sees at the root what the owner wrote; nothing else rides along with them.
    #[test]
    fn policy_labels_travel_valid_unreserved_and_bounded() {
        let labels = map(&[
            ("connectivity.tanzu.vmware.com/tier", "restricted"),
            ("connectivity.tanzu.vmware.com/team.name", ""),
            ("connectivity.tanzu.vmware.com/Bad Name", "x"),
            ("connectivity.tanzu.vmware.com/note", "has spaces"),
            ("connectivity.tanzu.vmware.com/clusters", "west"),
            (xcc_proto::names::WORKLOAD_SELECTOR_ANNOTATION, "app=db"),
            (xcc_proto::ports::PORTS_LABEL, "x"),
            ("tier", "public"),
        ]);
        assert_eq!(
            allowed_of(&labels, &[]),
            map(&[
                ("connectivity.tanzu.vmware.com/team.name", ""),
                ("connectivity.tanzu.vmware.com/tier", "restricted"),
            ])
        );
        // More than travel: the first MAX_POLICY_LABELS by name, and the export is refused at
        // its own registry so no policy tests a label a level dropped.
        let many: BTreeMap<String, String> = (0..MAX_POLICY_LABELS + 3)
            .map(|i| (format!("{PREFIX}l{i:03}"), "v".to_string()))
            .collect();
        let kept = allowed_of(&many, &[]);
        assert_eq!(kept.len(), MAX_POLICY_LABELS);
        assert_eq!(
            kept.keys().next_back().map(String::as_str),
            Some("connectivity.tanzu.vmware.com/l031")
        );
        assert_eq!(
            check_export(many.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            Err(PolicyLabelError::TooMany {
                count: MAX_POLICY_LABELS + 3
            })
        );
        assert_eq!(
            check_export(kept.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            Ok(())
        );
    }

    /// The origin pair names a clusterset name; it stays only when the
    /// receiver's check admits that name (in a tree: it is the FQDN).
    #[test]
    fn the_origin_stays_only_where_its_name_passes_the_fqdns_check() {
        let origin = |ns: &str, name: &str| {
            map(&[
                (ORIGIN_NAMESPACE_ANNOTATION, ns),
                (ORIGIN_NAME_ANNOTATION, name),
                (HEADLESS_ANNOTATION, "true"),
            ])
        };
        let mut hijack = origin("kube-system", "kube-dns");
        assert_eq!(
            keep_origin_in_tree(&mut hijack, "a.evil.example.org"),
            Some("kube-dns.kube-system.svc.clusterset.local".to_string())
        );
        assert_eq!(hijack, map(&[(HEADLESS_ANNOTATION, "true")]));
        let mut own = origin("shop", "api");
        assert_eq!(
            keep_origin_in_tree(&mut own, "api.shop.svc.clusterset.local"),
            None
        );
        assert_eq!(own, origin("shop", "api"));
        let allowed = ["shop.svc.clusterset.local".to_string()];
        let by_domains = |n: &str| xcc_proto::domains::fqdn_allowed(n, &allowed);
        let mut ok = origin("shop", "api");
        assert_eq!(keep_origin_if(&mut ok, by_domains), None);
        let mut other = origin("kube-system", "kube-dns");
        assert!(keep_origin_if(&mut other, by_domains).is_some());
        assert_eq!(other, map(&[(HEADLESS_ANNOTATION, "true")]));
    }

    #[test]
    fn hostnames_only_with_the_marker_and_only_of_the_entrys_own_valid_pairs() {
        let labels = map(&[
            (HEADLESS_ANNOTATION, "true"),
            (
                HOSTNAMES_ANNOTATION,
                "10.4.0.1=db-0,10.9.9.9=elsewhere,10.4.0.2=Bad_Name,junk",
            ),
        ]);
        assert_eq!(
            allowed_of(&labels, &endpoints(&["10.4.0.1", "10.4.0.2"])),
            map(&[
                (HEADLESS_ANNOTATION, "true"),
                (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0"),
            ])
        );
        // None of its own: the marker stays, the hostnames go.
        assert_eq!(
            allowed_of(&labels, &endpoints(&["10.5.0.1"])),
            map(&[(HEADLESS_ANNOTATION, "true")])
        );
    }
}
