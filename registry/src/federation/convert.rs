//! Catalog entries ⇄ federation messages. Pure.

use xcc_proto::names::FqdnError;
use xcc_proto::xcc::federation::v1 as fed;

use super::types::Target;
use crate::authz::{Condition, Decision};
use crate::catalog::{Endpoint, NamedPort, ServiceEntry, ServiceKey, Source};

/// `ip:port`, with brackets for IPv6 (the endpoint string form of a Hamlet record).
pub fn endpoint_string(e: &Endpoint) -> String {
    if e.address.contains(':') {
        format!("[{}]:{}", e.address, e.port)
    } else {
        format!("{}:{}", e.address, e.port)
    }
}

/// Why an endpoint string or an announcement is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnouncementError {
    #[error("endpoint {0:?} is not host:port")]
    EndpointNotHostPort(String),
    #[error("endpoint {0:?}: port must be 1-65535")]
    EndpointPort(String),
    #[error("endpoint {0:?}: host is neither an IP address nor a DNS name")]
    EndpointHost(String),
    #[error("announcement without cluster or name")]
    MissingKey,
    #[error("cluster {0:?} is not a cluster name (DNS-1123 label)")]
    Cluster(String),
    #[error("namespace {0:?} is not a namespace name (DNS-1123 label)")]
    Namespace(String),
    #[error("name {0:?} is not an object name (DNS-1123 subdomain)")]
    Name(String),
    #[error(transparent)]
    Fqdn(#[from] FqdnError),
    #[error("port {0} out of range 1-65535")]
    Port(u32),
}

pub fn parse_endpoint(s: &str) -> Result<Endpoint, AnnouncementError> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| AnnouncementError::EndpointNotHostPort(s.into()))?;
    let port: u32 = port
        .parse()
        .ok()
        .filter(|p| (1..=65535).contains(p))
        .ok_or_else(|| AnnouncementError::EndpointPort(s.into()))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.parse::<std::net::IpAddr>().is_err() && xcc_proto::names::canonical_fqdn(host).is_err()
    {
        return Err(AnnouncementError::EndpointHost(s.into()));
    }
    Ok(Endpoint {
        address: host.into(),
        port,
    })
}

pub fn announcement(e: &ServiceEntry, deleted: bool) -> fed::ServiceAnnouncement {
    fed::ServiceAnnouncement {
        cluster: e.key.cluster.to_string(),
        namespace: e.key.namespace.to_string(),
        name: e.key.name.to_string(),
        endpoints: e.endpoints.iter().map(endpoint_string).collect(),
        allowed_requesters: e.allowed_requesters.clone(),
        deleted,
        fqdn: e.fqdn.to_string(),
        ports: e
            .ports
            .iter()
            .map(|p| fed::Port {
                name: p.name.to_string(),
                port: p.port,
                protocol: p.protocol.to_string(),
                target_port: p.target_port,
            })
            .collect(),
        revision: e.revision,
        labels: e.labels.to_btree_map(),
    }
}

pub fn entry_from_announcement(
    a: &fed::ServiceAnnouncement,
    source: Source,
) -> Result<ServiceEntry, AnnouncementError> {
    if a.cluster.is_empty() || a.name.is_empty() {
        return Err(AnnouncementError::MissingKey);
    }
    // The key's parts reach object names, label values and file names downstream (grants,
    // imports): each must be the Kubernetes name it stands for, never a path.
    if !xcc_proto::names::is_dns1123_label(&a.cluster) {
        return Err(AnnouncementError::Cluster(a.cluster.clone()));
    }
    if !xcc_proto::names::is_dns1123_label(&a.namespace) {
        return Err(AnnouncementError::Namespace(a.namespace.clone()));
    }
    if !xcc_proto::names::is_dns1123_subdomain(&a.name) {
        return Err(AnnouncementError::Name(a.name.clone()));
    }
    // Entries built here are what a parent stores for every service of its subtree, so every
    // buffer gets exactly the capacity it needs (a collected or pushed Vec starts at 4 slots).
    let fqdn = if a.fqdn.is_empty() {
        xcc_proto::names::clusterset_fqdn(&a.name, &a.namespace)
    } else {
        xcc_proto::names::canonical_fqdn(&a.fqdn)?
    };
    let mut endpoints = Vec::with_capacity(a.endpoints.len());
    for s in &a.endpoints {
        endpoints.push(parse_endpoint(s)?);
    }
    let mut ports = Vec::with_capacity(a.ports.len());
    for p in &a.ports {
        if !(1..=65535).contains(&p.port) {
            return Err(AnnouncementError::Port(p.port));
        }
        if p.target_port > 65535 {
            return Err(AnnouncementError::Port(p.target_port));
        }
        ports.push(NamedPort {
            name: p.name.as_str().into(),
            port: p.port,
            protocol: if p.protocol.is_empty() {
                "TCP".into()
            } else {
                p.protocol.as_str().into()
            },
            target_port: p.target_port,
        });
    }
    // What a parent holds of a child's service, serves over Hamlet and sends down in answers:
    // only the annotations an importer keeps (the Hamlet import's allow-list), and the origin
    // pair only when the clusterset name it gives is the FQDN, the name the one-owner rule
    // holds for this service (a second name beside it would be held by no one).
    let mut labels = crate::peer_labels::allowed_of(&a.labels, &endpoints);
    if let Some(name) = crate::peer_labels::keep_origin_in_tree(&mut labels, &fqdn) {
        tracing::debug!(cluster = %a.cluster, %fqdn, %name, "origin labels naming another name than the FQDN dropped");
    }
    let labels = labels.into();
    let mut allowed = a.allowed_requesters.clone();
    allowed.sort();
    allowed.dedup();
    allowed.shrink_to_fit();
    Ok(ServiceEntry {
        key: ServiceKey::new(&a.cluster, &a.namespace, &a.name),
        source,
        fqdn: fqdn.into(),
        endpoints,
        ports,
        labels,
        allowed_requesters: allowed,
        origin: None,
        revision: 0,
    })
}

pub fn target_matches(target: &Target, e: &ServiceEntry) -> bool {
    match target {
        Target::Fqdn(f) => e.fqdn == *f,
        Target::Name { namespace, name } => e.key.namespace == *namespace && e.key.name == *name,
    }
}

fn deny_reason(c: Condition) -> i32 {
    (match c {
        Condition::Granted => fed::DenyReason::Unspecified,
        Condition::NotAllowedByCallee => fed::DenyReason::NotAllowedByCallee,
        Condition::NotRequested => fed::DenyReason::NotRequested,
        Condition::PolicyDenied => fed::DenyReason::PolicyDenied,
    }) as i32
}

/// The answer to `q` about `e` under decision `d`. Endpoints, ports and labels (the
/// allow-listed annotations an importer keeps, [`crate::peer_labels`]) are only disclosed when
/// granted.
pub fn response_for(
    q: &fed::ServiceQuery,
    e: &ServiceEntry,
    d: &Decision,
    resolver: &str,
) -> fed::ServiceQueryResponse {
    fed::ServiceQueryResponse {
        found: true,
        access_allowed: d.allowed,
        owner_cluster: e.key.cluster.to_string(),
        endpoints: if d.allowed {
            e.endpoints.iter().map(endpoint_string).collect()
        } else {
            vec![]
        },
        error: if d.allowed {
            String::new()
        } else {
            d.reason.clone()
        },
        correlation_id: q.correlation_id,
        namespace: e.key.namespace.to_string(),
        name: e.key.name.to_string(),
        fqdn: e.fqdn.to_string(),
        ports: if d.allowed {
            e.ports
                .iter()
                .map(|p| fed::Port {
                    name: p.name.to_string(),
                    port: p.port,
                    protocol: p.protocol.to_string(),
                    target_port: p.target_port,
                })
                .collect()
        } else {
            vec![]
        },
        revision: e.revision,
        labels: if d.allowed {
            let mut labels = crate::peer_labels::allowed(e.labels.iter(), &e.endpoints);
            crate::peer_labels::keep_origin_in_tree(&mut labels, &e.fqdn);
            labels
        } else {
            Default::default()
        },
        deny_reason: deny_reason(d.condition),
        policies: d.policies.clone(),
        revoked: false,
        unavailable: false,
        requester_cluster: q.requester_cluster.clone(),
        requester_service: q.requester_service.clone(),
        resolver_cluster: resolver.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_v4_v6_and_reject_garbage() {
        for (addr, s) in [("10.0.0.1", "10.0.0.1:443"), ("fd00::1", "[fd00::1]:443")] {
            let e = Endpoint {
                address: addr.into(),
                port: 443,
            };
            assert_eq!(endpoint_string(&e), s);
            assert_eq!(parse_endpoint(s).expect("valid"), e);
        }
        use AnnouncementError::*;
        for (s, e) in [
            ("10.0.0.1", EndpointNotHostPort("10.0.0.1".into())),
            ("10.0.0.1:0", EndpointPort("10.0.0.1:0".into())),
            ("10.0.0.1:70000", EndpointPort("10.0.0.1:70000".into())),
            ("not valid:80", EndpointHost("not valid:80".into())),
        ] {
            assert_eq!(parse_endpoint(s), Err(e));
        }
    }

    #[test]
    fn announcement_round_trip() {
        let e = ServiceEntry {
            key: ServiceKey::new("b2", "shop", "api"),
            source: Source::Local,
            fqdn: "api.shop.svc.clusterset.local".into(),
            endpoints: vec![Endpoint {
                address: "10.2.0.1".into(),
                port: 8443,
            }],
            ports: vec![NamedPort {
                name: "https".into(),
                port: 443,
                protocol: "TCP".into(),
                target_port: 8443,
            }],
            labels: Default::default(),
            allowed_requesters: vec!["b1/web".into()],
            origin: None,
            revision: 7,
        };
        let a = announcement(&e, false);
        assert_eq!(a.endpoints, vec!["10.2.0.1:8443"]);
        let back = entry_from_announcement(&a, Source::Child("b".into())).expect("valid");
        assert_eq!(back.key, e.key);
        assert_eq!(back.fqdn, e.fqdn);
        assert_eq!(back.endpoints, e.endpoints);
        assert_eq!(back.ports, e.ports);
        assert_eq!(back.allowed_requesters, e.allowed_requesters);
        // A parent keeps one such entry per service of its subtree: no spare capacity.
        assert_eq!(
            (back.endpoints.capacity(), back.ports.capacity()),
            (1, 1),
            "exact capacities"
        );
        let mut bad = a.clone();
        bad.fqdn = "Bad..Name".into();
        assert!(entry_from_announcement(&bad, Source::Child("b".into())).is_err());
        let mut far = a.clone();
        far.ports[0].target_port = 65_536;
        assert_eq!(
            entry_from_announcement(&far, Source::Child("b".into())).map(|_| ()),
            Err(AnnouncementError::Port(65_536))
        );
    }

    /// A headless export as its owner holds it: the marker, its pods' hostnames, its origin and
    /// port, and annotations no importer keeps (the pod selector, a user's own).
    fn headless_db() -> ServiceEntry {
        use xcc_proto::mcs::{HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION};
        ServiceEntry {
            key: ServiceKey::new("east", "shop", "db.shop.svc.clusterset.local"),
            source: Source::Local,
            fqdn: "db.shop.svc.clusterset.local".into(),
            endpoints: ["10.4.0.1", "10.4.0.2"]
                .map(|a| Endpoint {
                    address: a.into(),
                    port: 15432,
                })
                .to_vec(),
            ports: vec![NamedPort {
                name: "sql".into(),
                port: 5432,
                protocol: "TCP".into(),
                target_port: 15432,
            }],
            labels: [
                (HEADLESS_ANNOTATION, "true"),
                (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0,10.4.0.2=db-1"),
                (xcc_proto::names::SERVICE_PORT_ANNOTATION, "5432"),
                (xcc_proto::mapping::ORIGIN_NAMESPACE_ANNOTATION, "shop"),
                (xcc_proto::mapping::ORIGIN_NAME_ANNOTATION, "db"),
                (xcc_proto::names::WORKLOAD_SELECTOR_ANNOTATION, "app=db"),
                ("connectivity.tanzu.vmware.com/team", "storage"),
            ]
            .into_iter()
            .collect(),
            allowed_requesters: vec![],
            origin: None,
            revision: 3,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What an importer keeps of [`headless_db`].
    fn kept_of_db() -> std::collections::BTreeMap<String, String> {
        use xcc_proto::mcs::{HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION};
        labels(&[
            (HEADLESS_ANNOTATION, "true"),
            (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0,10.4.0.2=db-1"),
            (xcc_proto::names::SERVICE_PORT_ANNOTATION, "5432"),
            (xcc_proto::mapping::ORIGIN_NAMESPACE_ANNOTATION, "shop"),
            (xcc_proto::mapping::ORIGIN_NAME_ANNOTATION, "db"),
            // A policy label travels; the workload selector does not.
            ("connectivity.tanzu.vmware.com/team", "storage"),
        ])
    }

    fn decision(allowed: bool) -> Decision {
        Decision {
            allowed,
            condition: if allowed {
                Condition::Granted
            } else {
                Condition::NotAllowedByCallee
            },
            callee_admits: allowed,
            caller_requested: true,
            policy_permits: true,
            policies: vec!["bilateral".into()],
            reason: if allowed {
                String::new()
            } else {
                "east/shop/db allows [b1/web]; west/ is not among them".into()
            },
        }
    }

    fn query() -> fed::ServiceQuery {
        fed::ServiceQuery {
            fqdn: "db.shop.svc.clusterset.local".into(),
            requester_cluster: "west".into(),
            correlation_id: 9,
            ..Default::default()
        }
    }

    #[test]
    fn a_granted_answer_carries_the_allow_listed_labels_only() {
        let r = response_for(&query(), &headless_db(), &decision(true), "east");
        assert_eq!(r.labels, kept_of_db());
        assert_eq!(r.endpoints, ["10.4.0.1:15432", "10.4.0.2:15432"]);
        assert_eq!(
            r.ports,
            [fed::Port {
                name: "sql".into(),
                port: 5432,
                protocol: "TCP".into(),
                target_port: 15432,
            }]
        );
    }

    #[test]
    fn a_denied_answer_discloses_no_labels_endpoints_or_ports() {
        let denied = response_for(&query(), &headless_db(), &decision(false), "east");
        assert!(!denied.access_allowed);
        assert_eq!(
            (
                denied.labels.len(),
                denied.endpoints.len(),
                denied.ports.len()
            ),
            (0, 0, 0)
        );
        // Exactly what a denial said before labels existed: the same answer for a service
        // without any label.
        let mut bare = headless_db();
        bare.labels = Default::default();
        assert_eq!(
            response_for(&query(), &bare, &decision(false), "east"),
            denied
        );
    }

    #[test]
    fn a_childs_announcement_keeps_only_what_an_importer_keeps() {
        use xcc_proto::mcs::{HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION};
        let a = announcement(&headless_db(), false);
        // The owner sends what it holds; the parent stores the allow-listed part.
        assert_eq!(a.labels, headless_db().labels.to_btree_map());
        let stored = entry_from_announcement(&a, Source::Child("east".into())).expect("valid");
        assert_eq!(stored.labels, kept_of_db());
        // A lying child: hostnames for addresses it does not announce, a marker that is not
        // `true`, a label of its own making.
        let mut lie = a.clone();
        lie.labels = labels(&[
            (HEADLESS_ANNOTATION, "true"),
            (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0,10.9.9.9=elsewhere"),
            ("connectivity.tanzu.vmware.com/vip", "not-an-ip"),
            ("kubernetes.io/service-name", "kube-dns"),
        ]);
        let stored = entry_from_announcement(&lie, Source::Child("east".into())).expect("valid");
        assert_eq!(
            stored.labels,
            labels(&[
                (HEADLESS_ANNOTATION, "true"),
                (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0"),
            ])
        );
        lie.labels = labels(&[
            (HEADLESS_ANNOTATION, "TRUE"),
            (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0"),
        ]);
        let stored = entry_from_announcement(&lie, Source::Child("east".into())).expect("valid");
        assert_eq!(stored.labels, labels(&[]));
        // An origin naming another clusterset name than the FQDN (held by no one's
        // one-owner rule) is dropped at the parent, and so from every answer it gives.
        use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
        lie.labels = labels(&[
            (ORIGIN_NAMESPACE_ANNOTATION, "kube-system"),
            (ORIGIN_NAME_ANNOTATION, "kube-dns"),
            ("connectivity.tanzu.vmware.com/tier", "restricted"),
        ]);
        let stored = entry_from_announcement(&lie, Source::Child("east".into())).expect("valid");
        assert_eq!(
            stored.labels,
            labels(&[("connectivity.tanzu.vmware.com/tier", "restricted")])
        );
        let mut local = headless_db();
        local
            .labels
            .insert(ORIGIN_NAME_ANNOTATION.into(), "api".into());
        let answered = response_for(&query(), &local, &decision(true), "east");
        assert_eq!(answered.labels.get(ORIGIN_NAME_ANNOTATION), None);
        assert_eq!(answered.labels.get(ORIGIN_NAMESPACE_ANNOTATION), None);
    }
}
