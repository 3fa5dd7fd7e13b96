//! What a peer may say about a service besides its name, endpoints and ports: the record
//! annotations that travel as labels (Hamlet `FederatedService.labels`, federation
//! `ServiceAnnouncement.labels` and `ServiceQueryResponse.labels`). Pure.
//!
//! Every path on which labels arrive from the wire — a Hamlet import, a child's announcement, a
//! parent's answer — keeps only what [`allowed`] keeps (C6), so no path admits what another
//! refuses: a lying peer can neither inject an arbitrary annotation into an imported record
//! nor mark a service headless with hostnames of addresses it does not serve. A label that is
//! not kept costs that label, never the entry.

use std::collections::BTreeMap;

use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION, validate_namespace};
use xcc_proto::mcs::{HEADLESS_ANNOTATION, HEADLESS_TRUE, HOSTNAMES_ANNOTATION};
use xcc_proto::names::{SERVICE_PORT_ANNOTATION, VIP_ANNOTATION};

use crate::catalog::Endpoint;

/// The keys [`allowed`] may keep, in the order of its rules.
pub const ALLOWED_KEYS: [&str; 6] = [
    SERVICE_PORT_ANNOTATION,
    VIP_ANNOTATION,
    ORIGIN_NAMESPACE_ANNOTATION,
    ORIGIN_NAME_ANNOTATION,
    HEADLESS_ANNOTATION,
    HOSTNAMES_ANNOTATION,
];

/// The labels of a service from a peer (looked up with `get`) that may be kept for it, given
/// its (already validated) `endpoints`:
/// - the service port, only as a port 1-65535; the VIP, only as an IP address;
/// - the origin namespace and name (MCS names, Cilium global Services), only as a pair of
///   DNS-1123 labels;
/// - the headless marker (MCS), only as `true`; with it the pods' hostnames, only the valid
///   `address=hostname` pairs of addresses among `endpoints` (the others are dropped, not the
///   entry), and not at all when none is left.
///
/// Every other key is dropped.
pub fn allowed<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    endpoints: &[Endpoint],
) -> BTreeMap<String, String> {
    let mut kept = BTreeMap::new();
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
    kept
}

/// [`allowed`] of a map.
pub fn allowed_of(
    labels: &BTreeMap<String, String>,
    endpoints: &[Endpoint],
) -> BTreeMap<String, String> {
    allowed(|k| labels.get(k).map(String::as_str), endpoints)
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
        ]);
        assert_eq!(
            allowed_of(&labels, &endpoints(&["10.4.0.1", "10.4.0.2"])),
            labels
        );
        assert_eq!(
            labels.keys().map(String::as_str).collect::<Vec<_>>(),
            {
                let mut k = ALLOWED_KEYS.to_vec();
                k.sort();
                k
            },
            "the test covers every allowed key"
        );
    }

    #[test]
    fn drops_unknown_keys_and_invalid_values() {
        let labels = map(&[
            ("connectivity.tanzu.vmware.com/other", "x"),
            (xcc_proto::names::WORKLOAD_SELECTOR_ANNOTATION, "app=db"),
            ("team", "shop"),
            (SERVICE_PORT_ANNOTATION, "0"),
            (VIP_ANNOTATION, "not-an-ip"),
            (ORIGIN_NAMESPACE_ANNOTATION, "shop"),
            (ORIGIN_NAME_ANNOTATION, "Not_A_Label"),
            (HEADLESS_ANNOTATION, "yes"),
            (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0"),
        ]);
        assert_eq!(
            allowed_of(&labels, &endpoints(&["10.4.0.1"])),
            BTreeMap::new()
        );
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
