//! Catalog entries ⇄ Hamlet payloads. Pure functions: what the XCC v1 registry server puts in a
//! `FederatedService` and how an import is read back, with two fixes over XCC v1: the FQDN is
//! canonicalised once (ASCII lowercase, no trailing dot) and only allow-listed annotations are
//! kept.

use std::collections::BTreeMap;

use prost::Message;
use xcc_proto::federation::types::{v1alpha1, v1alpha2};
use xcc_proto::{FEDERATED_SERVICE_V1ALPHA1_URL, FEDERATED_SERVICE_V1ALPHA2_URL};

use tracing::debug;
use xcc_proto::names::canonical_fqdn;
use xcc_proto::ports::{PORTS_LABEL, format_label, parse_label};

use crate::catalog::{Endpoint, NamedPort, ServiceEntry};

/// Annotation keys an importer accepts from a peer ([`crate::peer_labels`]): everything else
/// is dropped.
pub use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
pub use xcc_proto::mcs::{HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION};
pub use xcc_proto::names::{SERVICE_PORT_ANNOTATION, VIP_ANNOTATION};
/// Prefix of the annotations that travel as FederatedService labels (matched with the slash).
pub const LABEL_PASSTHROUGH_PREFIX: &str = "connectivity.tanzu.vmware.com/";

/// Largest resource the server sends: 4 MiB (gRPC's default receive limit, what Go peers and
/// xcc accept) less 64 KiB for the response around it. An entry beyond it is not served: a peer
/// could not decode it, and in a lock-step stream it would block everything sorted after it.
pub const MAX_WIRE_RESOURCE_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;

/// An upper bound of the encoded size of `e` as either FederatedService version: the FQDN is
/// carried three times (name, fqdn, id), every string with up to 16 bytes of tag and length.
pub fn wire_size_bound(e: &ServiceEntry) -> usize {
    const FIELD: usize = 16;
    let labels: usize = e
        .labels
        .iter()
        .map(|(k, v)| k.len() + v.len() + 2 * FIELD)
        .sum();
    let endpoints: usize = e
        .endpoints
        .iter()
        .map(|ep| ep.address.len() + 2 * FIELD)
        .sum();
    // Each port also travels as an item of the JSON ports label (about 60 bytes besides its
    // name and protocol), and the label once.
    let ports: usize = e
        .ports
        .iter()
        .map(|p| 2 * (p.name.len() + p.protocol.len()) + 64 + 3 * FIELD)
        .sum::<usize>()
        + if e.ports.is_empty() {
            0
        } else {
            PORTS_LABEL.len() + 2 * FIELD
        };
    3 * (e.fqdn.len() + FIELD) + labels + endpoints + ports + 16 * FIELD
}

/// Whether `e` can be sent to a Hamlet peer ([`MAX_WIRE_RESOURCE_BYTES`]).
pub fn fits_on_the_wire(e: &ServiceEntry) -> bool {
    wire_size_bound(e) <= MAX_WIRE_RESOURCE_BYTES
}

/// The labels a Hamlet peer gets for `e`: its pass-through labels and, when it has named ports,
/// those ([`xcc_proto::ports::checked`]) as [`PORTS_LABEL`] — the registry's word, never a
/// record's own annotation of that key.
fn hamlet_labels(e: &ServiceEntry) -> BTreeMap<String, String> {
    let mut labels = e.labels.to_btree_map();
    labels.remove(PORTS_LABEL);
    if !e.ports.is_empty() {
        let (ports, _) = xcc_proto::ports::checked(e.ports.iter().map(NamedPort::raw));
        if !ports.is_empty() {
            labels.insert(PORTS_LABEL.to_string(), format_label(&ports));
        }
    }
    labels
}

/// The v1alpha1 payload as the XCC registry server fills it: name = id = fqdn, protocols
/// `["https"]`, labels = the pass-through annotations (and xcc's [`PORTS_LABEL`]), endpoints
/// in order.
pub fn to_v1alpha1(e: &ServiceEntry) -> v1alpha1::FederatedService {
    v1alpha1::FederatedService {
        name: e.fqdn.to_string(),
        description: String::new(),
        tags: vec![],
        labels: hamlet_labels(e),
        fqdn: e.fqdn.to_string(),
        id: e.fqdn.to_string(),
        san: String::new(),
        protocols: vec!["https".into()],
        endpoints: e
            .endpoints
            .iter()
            .map(|ep| v1alpha1::federated_service::Endpoint {
                address: ep.address.to_string(),
                port: ep.port,
            })
            .collect(),
    }
}

/// The v1alpha2 payload: one HTTPS instance whose SNI is the FQDN, associated with all endpoints.
pub fn to_v1alpha2(e: &ServiceEntry) -> v1alpha2::FederatedService {
    let mut metadata = BTreeMap::new();
    metadata.insert("SNI".to_string(), e.fqdn.to_string());
    if let Some(port) = e.labels.get(SERVICE_PORT_ANNOTATION) {
        metadata.insert("PORT".to_string(), port.to_string());
    }
    v1alpha2::FederatedService {
        name: e.fqdn.to_string(),
        description: String::new(),
        tags: vec![],
        labels: hamlet_labels(e),
        fqdn: e.fqdn.to_string(),
        endpoints: e
            .endpoints
            .iter()
            .map(|ep| v1alpha2::federated_service::Endpoint {
                address: ep.address.to_string(),
                port: ep.port,
                labels: vec![],
                description: String::new(),
            })
            .collect(),
        sans: vec![],
        instances: vec![v1alpha2::federated_service::Instance {
            id: "https".into(),
            protocol: "HTTPS".into(),
            metadata,
            endpoint_selector: vec![],
            description: String::new(),
        }],
    }
}

pub fn any_v1alpha1(e: &ServiceEntry) -> prost_types::Any {
    prost_types::Any {
        type_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        value: to_v1alpha1(e).encode_to_vec(),
    }
}

pub fn any_v1alpha2(e: &ServiceEntry) -> prost_types::Any {
    prost_types::Any {
        type_url: FEDERATED_SERVICE_V1ALPHA2_URL.into(),
        value: to_v1alpha2(e).encode_to_vec(),
    }
}

/// Why an imported resource was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImportError {
    #[error("resource type {0:?} is not federation.types.v1alpha1.FederatedService")]
    WrongType(String),
    #[error("resource does not decode as a FederatedService: {0}")]
    Decode(String),
    #[error("invalid fqdn {fqdn:?}: {reason}")]
    Fqdn { fqdn: String, reason: String },
    #[error("endpoint {index}: {reason}")]
    Endpoint { index: usize, reason: String },
}

/// An import as read from a peer: canonical FQDN, validated endpoints, allow-listed labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    pub fqdn: String,
    /// The FQDN as the peer sent it.
    pub raw_fqdn: String,
    pub endpoints: Vec<Endpoint>,
    pub labels: BTreeMap<String, String>,
    /// The cluster that exports it, when the source names one: a hierarchy answer names its
    /// owner; a Hamlet peer names none, and its RemoteRegistry stands for the source. Always a
    /// DNS-1123 label (it names MCS source clusters and `<hostname>.<cluster>.…` DNS names).
    pub cluster: Option<String>,
    /// The service's named ports, checked ([`xcc_proto::ports::checked`]): a hierarchy answer
    /// carries them; a Hamlet peer carries none (its single port travels as the `service-port`
    /// label). They become the imported record's `spec.ports`.
    pub ports: Vec<xcc_proto::crd::ServicePort>,
}

impl Imported {
    /// A catalog entry as an import (its FQDN as it was received is not kept there); the
    /// cluster is its origin's, when that is a DNS-1123 label.
    pub fn of_entry(e: &ServiceEntry) -> Self {
        Self {
            fqdn: e.fqdn.to_string(),
            raw_fqdn: e.fqdn.to_string(),
            endpoints: e.endpoints.clone(),
            labels: e.labels.to_btree_map(),
            cluster: e
                .origin
                .as_ref()
                .map(|o| o.cluster.clone())
                .filter(|c| xcc_proto::names::is_dns1123_label(c)),
            ports: xcc_proto::ports::checked(e.ports.iter().map(NamedPort::raw)).0,
        }
    }

    /// The exporter's propagation stamp, when it carries a valid one.
    pub fn changed_at(&self) -> Option<std::time::SystemTime> {
        let value = self
            .labels
            .get(xcc_proto::propagation::CHANGED_AT_ANNOTATION)?;
        xcc_proto::propagation::parse_stamp(value).ok()
    }

    /// Whether `self` and `other` say the same, their propagation stamps aside (an exporter that
    /// restarted stamps its unchanged records anew; that is no change to import).
    pub fn same_but_stamp(&self, other: &Imported) -> bool {
        let stamp = xcc_proto::propagation::CHANGED_AT_ANNOTATION;
        let labels = |i: &'_ Imported| {
            i.labels
                .iter()
                .filter(|(k, _)| k.as_str() != stamp)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        self.fqdn == other.fqdn
            && self.raw_fqdn == other.raw_fqdn
            && self.endpoints == other.endpoints
            && self.cluster == other.cluster
            && self.ports == other.ports
            && labels(self) == labels(other)
    }
}

/// Decode and validate a v1alpha1 resource (the Go client's type check: the part after the last
/// `/` of the type URL must name the message).
pub fn import_v1alpha1(any: &prost_types::Any) -> Result<Imported, ImportError> {
    let type_name = any.type_url.rsplit('/').next().unwrap_or_default();
    if type_name != "federation.types.v1alpha1.FederatedService" {
        return Err(ImportError::WrongType(any.type_url.clone()));
    }
    let fs = v1alpha1::FederatedService::decode(any.value.as_slice())
        .map_err(|e| ImportError::Decode(e.to_string()))?;
    import_fields(
        &fs.fqdn,
        &fs.labels,
        fs.endpoints.iter().map(|e| (&e.address, e.port)),
    )
}

fn import_fields<'a>(
    raw_fqdn: &str,
    labels: &BTreeMap<String, String>,
    endpoints: impl Iterator<Item = (&'a String, u32)>,
) -> Result<Imported, ImportError> {
    let fqdn = canonical_fqdn(raw_fqdn).map_err(|e| ImportError::Fqdn {
        fqdn: raw_fqdn.to_string(),
        reason: e.to_string(),
    })?;
    let mut eps = Vec::new();
    for (index, (address, port)) in endpoints.enumerate() {
        if !(1..=65535).contains(&port) {
            return Err(ImportError::Endpoint {
                index,
                reason: format!("port {port} is out of range 1-65535"),
            });
        }
        if address.parse::<std::net::IpAddr>().is_err() && canonical_fqdn(address).is_err() {
            return Err(ImportError::Endpoint {
                index,
                reason: format!("address {address:?} is neither an IP address nor a DNS name"),
            });
        }
        eps.push(Endpoint {
            address: address.as_str().into(),
            port,
        });
    }
    // The same allow-list as every other path labels arrive on.
    let kept = crate::peer_labels::allowed_of(labels, &eps);
    // The named ports an xcc exporter sends as a label: a bad port costs only itself, a bad
    // label only the ports (the import keeps its `service-port`).
    let ports = match labels.get(PORTS_LABEL).map(|v| parse_label(v)) {
        None => vec![],
        Some(Ok((ports, dropped))) => {
            for (index, why) in dropped {
                debug!(%fqdn, index, reason = %why, "a port of a Hamlet import was dropped");
            }
            ports
        }
        Some(Err(e)) => {
            debug!(%fqdn, error = %e, "the ports label of a Hamlet import was dropped");
            vec![]
        }
    };
    Ok(Imported {
        fqdn,
        raw_fqdn: raw_fqdn.to_string(),
        endpoints: eps,
        labels: kept,
        cluster: None,
        ports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{ServiceKey, Source};

    fn entry() -> ServiceEntry {
        let mut labels = crate::catalog::Labels::new();
        labels.insert(SERVICE_PORT_ANNOTATION.to_string(), "443".to_string());
        ServiceEntry {
            key: ServiceKey::new("east", "default", "nginx.xcc.test"),
            source: Source::Local,
            fqdn: "nginx.xcc.test".into(),
            endpoints: vec![
                Endpoint {
                    address: "172.17.0.5".into(),
                    port: 443,
                },
                Endpoint {
                    address: "172.17.0.6".into(),
                    port: 443,
                },
            ],
            ports: vec![],
            labels,
            allowed_requesters: vec![],
            origin: None,
            revision: 1,
        }
    }

    /// The encoding must equal the reference vector `fs_v1alpha1_xcc` byte for byte.
    #[test]
    fn v1alpha1_encoding_matches_the_xcc_vector() {
        let hex = "0a0e6e67696e782e7863632e7465737422310a2a636f6e6e65637469766974792e74616e7a752e766d776172652e636f6d2f736572766963652d706f727412033434332a0e6e67696e782e7863632e74657374320e6e67696e782e7863632e74657374420568747470734a0f0a0a3137322e31372e302e3510bb034a0f0a0a3137322e31372e302e3610bb03";
        let bytes = to_v1alpha1(&entry()).encode_to_vec();
        let got: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, hex);
    }

    #[test]
    fn import_round_trip_filters_labels_and_canonicalises() {
        let mut e = entry();
        e.fqdn = "Nginx.XCC.test.".into();
        e.labels.insert(VIP_ANNOTATION.into(), "1.2.3.4".into());
        e.labels.insert("foobar".into(), "x".into());
        e.labels
            .insert("connectivity.tanzu.vmware.com/other".into(), "y".into());
        let got = import_v1alpha1(&any_v1alpha1(&e)).expect("valid");
        assert_eq!(got.fqdn, "nginx.xcc.test");
        assert_eq!(got.raw_fqdn, "Nginx.XCC.test.");
        assert_eq!(
            got.labels.keys().collect::<Vec<_>>(),
            vec![
                "connectivity.tanzu.vmware.com/other",
                SERVICE_PORT_ANNOTATION,
                VIP_ANNOTATION
            ]
        );
        assert_eq!(got.endpoints.len(), 2);
    }

    /// Named ports travel over Hamlet as xcc's ports label and come back as the import's ports,
    /// not as an annotation; a record's own annotation of that key is never sent.
    #[test]
    fn named_ports_travel_as_the_ports_label_and_come_back_as_ports() {
        use xcc_proto::crd::{Protocol, ServicePort};
        use xcc_proto::ports::PORTS_LABEL;
        let mut e = entry();
        e.labels.insert(PORTS_LABEL.into(), "a record's own".into());
        assert_eq!(to_v1alpha1(&e).labels.get(PORTS_LABEL), None);
        assert_eq!(import_v1alpha1(&any_v1alpha1(&e)).expect("valid").ports, []);
        let port = |name: &str, port: u32, protocol: &str, target_port: u32| NamedPort {
            name: name.into(),
            port,
            protocol: protocol.into(),
            target_port,
        };
        e.ports = vec![
            port("https", 443, "TCP", 0),
            port("quic", 443, "UDP", 8443),
            // What a child may announce but no Service takes: not sent.
            port("Bad_Name", 80, "TCP", 0),
        ];
        let sent = to_v1alpha1(&e);
        assert_eq!(
            sent.labels[PORTS_LABEL],
            r#"[{"name":"https","port":443,"protocol":"TCP"},{"name":"quic","port":443,"protocol":"UDP","targetPort":8443}]"#
        );
        assert_eq!(to_v1alpha2(&e).labels, sent.labels);
        assert!(prost::Message::encoded_len(&sent) <= wire_size_bound(&e));
        let got = import_v1alpha1(&any_v1alpha1(&e)).expect("valid");
        assert_eq!(
            got.ports,
            [
                ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    protocol: Some(Protocol::Tcp),
                    target_port: None,
                },
                ServicePort {
                    name: Some("quic".into()),
                    port: 443,
                    protocol: Some(Protocol::Udp),
                    target_port: Some(8443),
                },
            ]
        );
        assert_eq!(
            got.labels.keys().collect::<Vec<_>>(),
            [SERVICE_PORT_ANNOTATION],
            "the label is no annotation of the import"
        );
        // A peer's label that is no list of ports costs the ports, not the import.
        let mut fs = to_v1alpha1(&e);
        fs.labels.insert(PORTS_LABEL.into(), "{not json".into());
        let any = prost_types::Any {
            type_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            value: fs.encode_to_vec(),
        };
        let got = import_v1alpha1(&any).expect("valid");
        assert_eq!((got.ports.len(), got.endpoints.len()), (0, 2));
    }

    #[test]
    fn import_keeps_the_origin_only_as_a_valid_pair() {
        let mut e = entry();
        e.labels
            .insert(ORIGIN_NAMESPACE_ANNOTATION.into(), "shop".into());
        e.labels.insert(ORIGIN_NAME_ANNOTATION.into(), "api".into());
        let got = import_v1alpha1(&any_v1alpha1(&e)).expect("valid");
        assert_eq!(
            got.labels
                .get(ORIGIN_NAMESPACE_ANNOTATION)
                .map(String::as_str),
            Some("shop")
        );
        assert_eq!(
            got.labels.get(ORIGIN_NAME_ANNOTATION).map(String::as_str),
            Some("api")
        );
        // Half a pair, or a value that is not a DNS label, is dropped whole.
        for (ns, name) in [("shop", "Not_A_Label"), ("", "api"), ("a.b", "api")] {
            let mut e = entry();
            e.labels
                .insert(ORIGIN_NAMESPACE_ANNOTATION.into(), ns.into());
            e.labels.insert(ORIGIN_NAME_ANNOTATION.into(), name.into());
            let got = import_v1alpha1(&any_v1alpha1(&e)).expect("valid");
            assert_eq!(
                got.labels.keys().collect::<Vec<_>>(),
                vec![SERVICE_PORT_ANNOTATION],
                "{ns:?}/{name:?}"
            );
        }
        let mut e = entry();
        e.labels.insert(ORIGIN_NAME_ANNOTATION.into(), "api".into());
        let got = import_v1alpha1(&any_v1alpha1(&e)).expect("valid");
        assert_eq!(
            got.labels.keys().collect::<Vec<_>>(),
            vec![SERVICE_PORT_ANNOTATION]
        );
    }

    #[test]
    fn import_keeps_the_headless_marker_and_only_valid_hostnames_of_its_endpoints() {
        let mut e = entry();
        e.labels.insert(HEADLESS_ANNOTATION.into(), "true".into());
        e.labels.insert(
            HOSTNAMES_ANNOTATION.into(),
            "172.17.0.5=web-0,172.17.0.9=elsewhere,172.17.0.6=Bad_Name,junk".into(),
        );
        let got = import_v1alpha1(&any_v1alpha1(&e)).expect("valid");
        assert_eq!(
            got.labels.get(HEADLESS_ANNOTATION).map(String::as_str),
            Some("true")
        );
        assert_eq!(
            got.labels.get(HOSTNAMES_ANNOTATION).map(String::as_str),
            Some("172.17.0.5=web-0")
        );
        assert_eq!(got.endpoints.len(), 2);
        // Hostnames without the marker, or a marker that is not `true`, are dropped.
        for marker in [None, Some("yes")] {
            let mut e = entry();
            if let Some(m) = marker {
                e.labels.insert(HEADLESS_ANNOTATION.into(), m.into());
            }
            e.labels
                .insert(HOSTNAMES_ANNOTATION.into(), "172.17.0.5=web-0".into());
            let got = import_v1alpha1(&any_v1alpha1(&e)).expect("valid");
            assert_eq!(
                got.labels.keys().collect::<Vec<_>>(),
                vec![SERVICE_PORT_ANNOTATION],
                "{marker:?}"
            );
        }
    }

    /// The MCS export time travels as a plain FederatedService label (Hamlet's wire unchanged)
    /// in both Hamlet versions, and comes back as the import's annotation.
    #[test]
    fn the_export_time_travels_as_a_label() {
        use xcc_proto::mcs::EXPORTED_AT_ANNOTATION;
        let mut e = entry();
        e.labels
            .insert(EXPORTED_AT_ANNOTATION.into(), "2026-11-29T07:16:06Z".into());
        assert_eq!(
            to_v1alpha1(&e)
                .labels
                .get(EXPORTED_AT_ANNOTATION)
                .map(String::as_str),
            Some("2026-11-29T07:16:06Z")
        );
        assert_eq!(to_v1alpha2(&e).labels, to_v1alpha1(&e).labels);
        let got = import_v1alpha1(&any_v1alpha1(&e)).expect("valid");
        assert_eq!(
            got.labels.get(EXPORTED_AT_ANNOTATION).map(String::as_str),
            Some("2026-11-29T07:16:06Z")
        );
    }

    #[test]
    fn import_rejects_bad_input_with_reasons() {
        let mut any = any_v1alpha1(&entry());
        any.type_url = "type.googleapis.com/federation.types.v1alpha2.FederatedService".into();
        assert!(matches!(
            import_v1alpha1(&any),
            Err(ImportError::WrongType(_))
        ));
        let any = prost_types::Any {
            type_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            value: vec![0xff, 0xff, 0xff],
        };
        assert!(matches!(import_v1alpha1(&any), Err(ImportError::Decode(_))));
        let mut e = entry();
        e.fqdn = "bad..name".into();
        assert_eq!(
            import_v1alpha1(&any_v1alpha1(&e)),
            Err(ImportError::Fqdn {
                fqdn: "bad..name".into(),
                reason: xcc_proto::names::canonical_fqdn("bad..name")
                    .expect_err("invalid")
                    .to_string(),
            })
        );
        let mut e = entry();
        e.endpoints[1].port = 70000;
        assert_eq!(
            import_v1alpha1(&any_v1alpha1(&e)),
            Err(ImportError::Endpoint {
                index: 1,
                reason: "port 70000 is out of range 1-65535".into()
            })
        );
        let mut e = entry();
        e.endpoints[0].address = "not an address".into();
        assert!(matches!(
            import_v1alpha1(&any_v1alpha1(&e)),
            Err(ImportError::Endpoint { index: 0, .. })
        ));
    }
}
