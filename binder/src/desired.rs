//! What the binder should write for imported ServiceRecords — pure: records in, desired
//! Kubernetes objects out. No I/O.
//!
//! Imported records (label `connectivity.tanzu.vmware.com/imported`) are grouped per namespace
//! and canonical FQDN ([`group_imported`]); each group becomes ([`materialize`]; XCC v1's binder
//! without its defects):
//! - a selector-less ClusterIP **Service** named [`names::service_name`] with the FQDN
//!   annotation (and the origin annotations the DNS server reads), owned by every record of the
//!   group (owner references sorted by UID); with a VIP it is a LoadBalancer of the inert class
//!   [`VIP_LOAD_BALANCER_CLASS`] and the VIP goes into its load-balancer status; for a headless
//!   export ([`xcc_proto::mcs::HEADLESS_ANNOTATION`]) it is headless (`clusterIP: None`) and
//!   the slices' endpoints carry the exporter's pod hostnames;
//! - **EndpointSlices**, one per source cluster, address family and port set, labelled
//!   `kubernetes.io/service-name` and `endpointslice.kubernetes.io/managed-by: xcc-binder`, and
//!   with the MCS labels `multicluster.kubernetes.io/service-name` (the origin's name: the
//!   ServiceImport's, [`crate::mcs`]) and `multicluster.kubernetes.io/source-cluster`;
//! - legacy **Endpoints**, one subset per port set, with no subsets when nothing is left
//!   (valid, unlike XCC v1's empty subset), labelled so the mirroring controller skips it.
//!
//! Ports come from `spec.ports`, else the `service-port` annotation, else the endpoints. The
//! Service's ports are the union of the records' (KEP-1645); when records define a port
//! differently (one name, another number or protocol; one number under two names; an unnamed
//! port beside others), the oldest export's definition wins (KEP-1645; by the export time the
//! record carries, then the source cluster's name: [`oldest_first`], the same verdict in every
//! cluster and the one the exporters' ServiceExports report), the others' endpoints are left
//! out of that port (of the service, when no port of theirs is left) and the outcome carries a
//! [`Conflict`] (deterministic, reported); records of the other type (headless or not) than
//! the winner's are left out too (MCS `TypeConflict`).
//! Only fields the binder owns are set, so server-side apply compares exactly those (no rewrite
//! for the API server's defaults).
//!
//! [`cilium`] computes the `CiliumGlobalService` materialisation.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, EndpointAddress, EndpointPort as LegacyPort, EndpointSubset, Endpoints,
    Service, ServicePort as KubeServicePort, ServiceSpec, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint as SliceEndpoint, EndpointConditions, EndpointPort, EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use xcc_proto::crd::{
    BINDER_MANAGER, ENDPOINTSLICE_MANAGED_BY_LABEL, ENDPOINTSLICE_SERVICE_NAME_LABEL,
    MANAGED_BY_LABEL, Protocol, ServiceRecord,
};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::mcs::{
    CLIENT_IP, ExportPort, MCS_SERVICE_NAME_LABEL, MCS_SOURCE_CLUSTER_LABEL, ServiceTraits,
    is_headless, merge_ports, oldest_first, record_hostnames, shown_port,
};
use xcc_proto::names::{
    self, FQDN_ANNOTATION, IMPORTED_LABEL, SERVICE_PORT_ANNOTATION, VIP_ANNOTATION,
};
use xcc_proto::ports::RawPort;

pub mod cilium;

/// `spec.loadBalancerClass` of a Service that carries a VIP. The API server accepts
/// `status.loadBalancer.ingress` only on LoadBalancer Services (XCC v1 wrote it on a ClusterIP
/// Service, which current API servers reject); a class no load-balancer controller implements
/// makes the Service a LoadBalancer that no cloud provider acts on, and node ports are not
/// allocated for it.
pub const VIP_LOAD_BALANCER_CLASS: &str = "connectivity.tanzu.vmware.com/vip";

/// Label on legacy Endpoints telling the EndpointSlice mirroring controller not to mirror
/// them: the binder writes its own EndpointSlices.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";

/// One group of imported records: the namespace they live in and their canonical FQDN.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    /// Namespace of the records (and of the objects made for them).
    pub namespace: String,
    /// Canonical FQDN (lowercase, no trailing dot).
    pub fqdn: String,
}

/// A port of the materialised Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Port {
    /// Port name; empty for the single unnamed port.
    pub name: String,
    /// Port clients connect to on the Service.
    pub port: i32,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Port on the endpoints that serves it; `None`: each endpoint's own port (the single-port
    /// case of XCC v1, where the Service port comes from the `service-port` annotation).
    pub target: Option<i32>,
}

/// Why a record's ports cannot be worked out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// The `service-port` annotation is not a port number.
    #[error("annotation {SERVICE_PORT_ANNOTATION} is {0:?}, not a port number in 1-65535")]
    BadAnnotation(String),
    /// No `spec.ports`, no annotation and no endpoints to take a port from.
    #[error(
        "no port: spec.ports, the {SERVICE_PORT_ANNOTATION} annotation and the endpoints are all empty"
    )]
    NoPort,
}

fn annotation<'a>(record: &'a ServiceRecord, key: &str) -> Option<&'a str> {
    record
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn valid_port(p: i32) -> bool {
    (1..=65535).contains(&p)
}

/// The Service ports a record asks for: `spec.ports` when set (those
/// [`xcc_proto::ports::checked`] keeps: a bad port, a second port of a name or number, an unnamed
/// port among several are left out); else one unnamed TCP port from
/// the `service-port` annotation, served on each endpoint's own port; else the endpoints'
/// distinct ports (named `port-<n>` when there are several).
pub fn resolved_ports(record: &ServiceRecord) -> Result<Vec<Port>, PortError> {
    if let Some(ports) = record.spec.ports.as_ref().filter(|p| !p.is_empty()) {
        // The ports a Service and a ServiceImport accept, each bad one dropped on its own.
        let (kept, _) = xcc_proto::ports::checked(ports.iter().map(RawPort::of));
        let mut out: Vec<Port> = kept
            .iter()
            .map(|p| Port {
                name: p.name.clone().unwrap_or_default(),
                port: p.port,
                protocol: p.protocol(),
                target: Some(p.target_port()),
            })
            .collect();
        out.sort();
        if !out.is_empty() {
            return Ok(out);
        }
    }
    if let Some(value) = annotation(record, SERVICE_PORT_ANNOTATION) {
        return match value.trim().parse::<i32>() {
            Ok(port) if valid_port(port) => Ok(vec![Port {
                name: String::new(),
                port,
                protocol: Protocol::Tcp,
                target: None,
            }]),
            _ => Err(PortError::BadAnnotation(value.to_string())),
        };
    }
    let distinct: BTreeSet<i32> = record
        .spec
        .endpoints
        .iter()
        .map(|e| e.port)
        .filter(|p| valid_port(*p))
        .collect();
    match distinct.len() {
        0 => Err(PortError::NoPort),
        1 => Ok(distinct
            .into_iter()
            .map(|port| Port {
                name: String::new(),
                port,
                protocol: Protocol::Tcp,
                target: Some(port),
            })
            .collect()),
        _ => Ok(distinct
            .into_iter()
            .map(|port| Port {
                name: format!("port-{port}"),
                port,
                protocol: Protocol::Tcp,
                target: Some(port),
            })
            .collect()),
    }
}

/// The imported records among `records`, grouped per namespace and canonical FQDN (`Foo.X.`
/// and `foo.x` share a group). Exported records and records whose FQDN is not a DNS name are
/// left out. Within a group, records are sorted oldest export first ([`oldest_first`]).
pub fn group_imported<'a>(
    records: impl IntoIterator<Item = &'a ServiceRecord>,
) -> BTreeMap<GroupKey, Vec<&'a ServiceRecord>> {
    let mut groups: BTreeMap<GroupKey, Vec<&ServiceRecord>> = BTreeMap::new();
    for record in records {
        let imported = record
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(IMPORTED_LABEL));
        let (true, Some(namespace), Ok(fqdn)) = (
            imported,
            record.metadata.namespace.clone(),
            names::canonical_fqdn(&record.spec.fqdn),
        ) else {
            continue;
        };
        groups
            .entry(GroupKey { namespace, fqdn })
            .or_default()
            .push(record);
    }
    for group in groups.values_mut() {
        group.sort_by(|a, b| oldest_first(a, b));
    }
    groups
}

fn uid(record: &ServiceRecord) -> &str {
    record.metadata.uid.as_deref().unwrap_or("")
}

fn name(record: &ServiceRecord) -> &str {
    record.metadata.name.as_deref().unwrap_or("")
}

/// Sources of one FQDN disagree on ports or type; the oldest export ([`oldest_first`]) won.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// Name of the record whose ports were used.
    pub winner: String,
    /// Records left out, with why, oldest export first.
    pub losers: Vec<(String, String)>,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ports of {} used; left out:", self.winner)?;
        for (name, why) in &self.losers {
            write!(f, " {name} ({why});")?;
        }
        Ok(())
    }
}

/// An address that could not be materialised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// Record it came from.
    pub record: String,
    /// The endpoint, `address:port`.
    pub endpoint: String,
    /// Why.
    pub reason: &'static str,
}

/// Everything the binder writes for one group.
#[derive(Clone, Debug, PartialEq)]
pub struct Materialized {
    /// The selector-less ClusterIP Service (spec only; no status).
    pub service: Service,
    /// IP to publish in `status.loadBalancer.ingress` (the VIP annotation), if any.
    pub vip: Option<String>,
    /// EndpointSlices, one per source cluster, address family and port set, sorted by name.
    pub slices: Vec<EndpointSlice>,
    /// Legacy Endpoints of the same name as the Service.
    pub endpoints: Endpoints,
    /// Sources left out because their ports disagree with the winner's.
    pub conflict: Option<Conflict>,
    /// Endpoints that could not be materialised (not an IP, or no port serves them).
    pub dropped: Vec<Dropped>,
}

/// Why a group has nothing to materialise.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    /// The group is empty.
    #[error("no imported records")]
    Empty,
    /// No record of the group has usable ports; one message per record.
    #[error("no record has usable ports: {}", .0.join("; "))]
    NoPorts(Vec<String>),
}

/// Owner reference from a binder object to an imported record (no controller flag: a group
/// has several owners, and the API server's GC removes the objects with the last one).
pub fn owner_reference(record: &ServiceRecord) -> OwnerReference {
    OwnerReference {
        api_version: ServiceRecord::api_version(&()).into_owned(),
        kind: ServiceRecord::kind(&()).into_owned(),
        name: name(record).to_string(),
        uid: uid(record).to_string(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// One served port on the endpoint side: (name, protocol, endpoint port).
type PortEntry = (String, Protocol, i32);
/// A port set on the endpoint side, sorted.
type PortSet = Vec<PortEntry>;

fn port_set_id(set: &PortSet) -> String {
    set.iter()
        .map(|(name, protocol, port)| format!("{name}/{}/{port}", protocol.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn non_empty(name: &str) -> Option<String> {
    (!name.is_empty()).then(|| name.to_string())
}

/// The ports of a Service the binder writes: each port's name (none for the single unnamed
/// port), number and protocol; the endpoint side is its EndpointSlices'.
pub(crate) fn service_ports(ports: &[Port]) -> Vec<KubeServicePort> {
    ports
        .iter()
        .map(|p| KubeServicePort {
            name: non_empty(&p.name),
            port: p.port,
            protocol: Some(p.protocol.as_str().into()),
            ..KubeServicePort::default()
        })
        .collect()
}

/// The exports of one name merged: the winner (the oldest export with usable ports), its type,
/// the union of the ports of the exports of that type, what each of them contributes.
#[derive(Clone, Debug)]
pub(crate) struct Merged<'a> {
    /// The oldest export with usable ports: its type, VIP and origin are the service's.
    pub winner: &'a ServiceRecord,
    /// Whether the winner is a headless export.
    pub headless: bool,
    /// The service's ports: the union of the contributing exports' ports (sorted).
    pub ports: Vec<Port>,
    /// The records whose endpoints count, oldest first, each with its ports that are in the
    /// union (an endpoint serves a port on the record's own target port).
    pub contributing: Vec<(&'a ServiceRecord, Vec<Port>)>,
    /// Records left out or ports of them left out, with why, oldest export first.
    pub losers: Vec<(String, String)>,
}

/// Merge `sources` (any order; [`oldest_first`] orders them): the oldest export with usable
/// ports decides the type (records of the other type are left out: MCS `TypeConflict`); the
/// ports are the union of the others' ([`xcc_proto::mcs::merge_ports`], KEP-1645), a port that
/// clashes with one taken from an older export (same name, other number or protocol: MCS
/// `PortConflict`) left out with the endpoints' service of it, a record left with no port
/// left out altogether.
pub(crate) fn merge<'a>(sources: &[&'a ServiceRecord]) -> Result<Merged<'a>, Skip> {
    if sources.is_empty() {
        return Err(Skip::Empty);
    }
    let mut sources: Vec<&ServiceRecord> = sources.to_vec();
    sources.sort_by(|a, b| oldest_first(a, b));
    let resolved: Vec<(&ServiceRecord, Result<Vec<Port>, PortError>)> =
        sources.iter().map(|r| (*r, resolved_ports(r))).collect();
    let Some(winner) = resolved
        .iter()
        .find_map(|(r, p)| p.as_ref().ok().map(|_| *r))
    else {
        return Err(Skip::NoPorts(
            resolved
                .iter()
                .filter_map(|(r, p)| p.as_ref().err().map(|e| format!("{}: {e}", name(r))))
                .collect(),
        ));
    };
    let headless = is_headless(winner);
    let same_type: Vec<(&ServiceRecord, &Vec<Port>)> = resolved
        .iter()
        .filter(|(r, _)| is_headless(r) == headless)
        .filter_map(|(r, p)| p.as_ref().ok().map(|p| (*r, p)))
        .collect();
    let export_ports: Vec<Vec<ExportPort>> = same_type
        .iter()
        .map(|(_, ports)| {
            ports
                .iter()
                .map(|p| (p.name.clone(), p.port, p.protocol))
                .collect()
        })
        .collect();
    let (union, clashes) = merge_ports(export_ports.iter().map(Vec::as_slice));
    let mut losers = Vec::new();
    let mut contributing = Vec::new();
    let mut ports: BTreeMap<ExportPort, Port> = BTreeMap::new();
    for (record, result) in &resolved {
        let Some(index) = same_type
            .iter()
            .position(|(r, _)| std::ptr::eq(*r, *record))
        else {
            losers.push((
                name(record).to_string(),
                match result {
                    Ok(_) => format!(
                        "{} where the service is {}",
                        kind(!headless),
                        kind(headless)
                    ),
                    Err(e) => e.to_string(),
                },
            ));
            continue;
        };
        let (_, all) = same_type[index];
        let kept: Vec<Port> = all
            .iter()
            .filter(|p| union.contains(&(p.name.clone(), p.port, p.protocol)))
            .cloned()
            .collect();
        let clashed: Vec<String> = clashes
            .iter()
            .filter(|c| c.export == index)
            .map(|c| {
                format!(
                    "port {} left out ({} has {})",
                    shown_port(&c.port),
                    name(same_type[c.kept_from].0),
                    shown_port(&c.kept)
                )
            })
            .collect();
        if kept.is_empty() {
            losers.push((
                name(record).to_string(),
                format!(
                    "ports {} differ",
                    all.iter()
                        .map(|p| format!("{}/{}", p.port, p.protocol.as_str()))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ));
            continue;
        }
        if !clashed.is_empty() {
            losers.push((name(record).to_string(), clashed.join("; ")));
        }
        for p in &kept {
            // The service's port: the first (oldest) record's, without its target.
            ports
                .entry((p.name.clone(), p.port, p.protocol))
                .or_insert_with(|| Port {
                    target: None,
                    ..p.clone()
                });
        }
        contributing.push((*record, kept));
    }
    Ok(Merged {
        winner,
        headless,
        ports: ports.into_values().collect(),
        contributing,
        losers,
    })
}

/// The objects for one group (in any order: they are sorted oldest export first,
/// [`oldest_first`]). The service's ports are the union of the exports' ([`merge`]).
pub fn materialize(key: &GroupKey, sources: &[&ServiceRecord]) -> Result<Materialized, Skip> {
    let Merged {
        winner,
        headless,
        ports,
        contributing,
        losers,
    } = merge(sources)?;
    let mut sources: Vec<&ServiceRecord> = sources.to_vec();
    sources.sort_by(|a, b| oldest_first(a, b));
    let conflict = (!losers.is_empty()).then(|| Conflict {
        winner: name(winner).to_string(),
        losers,
    });
    let Served {
        groups,
        hostnames,
        dropped,
    } = served(&contributing);
    let objects = Objects::of(key, &sources);
    // A headless Service has no address to put a VIP on.
    let vip = annotation(winner, VIP_ANNOTATION)
        .filter(|_| !headless)
        .and_then(|v| v.trim().parse::<IpAddr>().ok())
        .map(|ip| ip.to_string());
    Ok(Materialized {
        service: objects.service(winner, headless, &ports, vip.as_deref()),
        slices: objects.endpoint_slices(winner, &groups, &hostnames),
        endpoints: objects.endpoints(&groups),
        vip,
        conflict,
        dropped,
    })
}

/// (source cluster, family is IPv6, port set) → addresses, sorted.
type Groups = BTreeMap<(String, bool, PortSet), Vec<String>>;
/// (source cluster, address) → the pod's hostname, of headless exports.
type Hostnames = BTreeMap<(String, String), String>;

/// What the contributing exports' endpoints serve.
struct Served {
    /// The addresses, grouped per (source cluster, family, port set).
    groups: Groups,
    /// The pods' hostnames, of headless exports.
    hostnames: Hostnames,
    /// Endpoints left out, with why.
    dropped: Vec<Dropped>,
}

/// The port sets each address of the `contributing` exports serves, grouped per (source
/// cluster, family, port set); an endpoint that is not an IP or serves no port of the service
/// is dropped.
fn served(contributing: &[(&ServiceRecord, Vec<Port>)]) -> Served {
    let mut dropped = Vec::new();
    // (source cluster, address) → (is IPv6, the (name, protocol, endpoint port) entries it
    // serves).
    let mut served: BTreeMap<(String, String), (bool, BTreeSet<PortEntry>)> = BTreeMap::new();
    let mut hostnames: Hostnames = BTreeMap::new();
    for (record, ports) in contributing {
        let cluster = cilium::source_cluster(record).unwrap_or_default();
        for (address, host) in record_hostnames(record) {
            hostnames.entry((cluster.clone(), address)).or_insert(host);
        }
        for endpoint in &record.spec.endpoints {
            let shown = format!("{}:{}", endpoint.address, endpoint.port);
            let Ok(ip) = endpoint.address.parse::<IpAddr>() else {
                dropped.push(Dropped {
                    record: name(record).to_string(),
                    endpoint: shown,
                    reason: "address is not an IP",
                });
                continue;
            };
            let matching: Vec<(String, Protocol, i32)> = ports
                .iter()
                .filter(|p| p.target.is_none_or(|t| t == endpoint.port))
                .map(|p| (p.name.clone(), p.protocol, endpoint.port))
                .collect();
            if matching.is_empty() {
                dropped.push(Dropped {
                    record: name(record).to_string(),
                    endpoint: shown,
                    reason: "no port of the service is served on this endpoint port",
                });
                continue;
            }
            // Canonical text form (e.g. IPv6 compressed), so duplicates merge.
            let entry = served
                .entry((cluster.clone(), ip.to_string()))
                .or_insert_with(|| (ip.is_ipv6(), BTreeSet::new()));
            entry.1.extend(matching);
        }
    }
    let mut groups: Groups = BTreeMap::new();
    for ((cluster, address), (v6, set)) in served {
        groups
            .entry((cluster, v6, set.into_iter().collect()))
            .or_default()
            .push(address);
    }
    Served {
        groups,
        hostnames,
        dropped,
    }
}

/// What every object of a group shares: its FQDN, namespace and Service name, and its owners.
struct Objects<'a> {
    key: &'a GroupKey,
    service_name: String,
    owners: Vec<OwnerReference>,
}

impl<'a> Objects<'a> {
    fn of(key: &'a GroupKey, sources: &[&ServiceRecord]) -> Self {
        // Owners in the objects' namespace only (this cluster's own MCS export lives in the
        // service's namespace, and an owner elsewhere would read as gone to the garbage
        // collector).
        let mut owners: Vec<OwnerReference> = sources
            .iter()
            .filter(|r| r.metadata.namespace.as_deref() == Some(key.namespace.as_str()))
            .map(|r| owner_reference(r))
            .collect();
        owners.sort_by(|a, b| a.uid.cmp(&b.uid));
        Objects {
            key,
            service_name: names::service_name(&key.fqdn),
            owners,
        }
    }

    fn meta(&self, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.key.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(self.owners.clone()),
            ..ObjectMeta::default()
        }
    }

    /// The Service: the winner's type, VIP, origin and session affinity, the union's ports.
    fn service(
        &self,
        winner: &ServiceRecord,
        headless: bool,
        ports: &[Port],
        vip: Option<&str>,
    ) -> Service {
        let mut annotations =
            BTreeMap::from([(FQDN_ANNOTATION.to_string(), self.key.fqdn.clone())]);
        if let Some(origin) = &winner.spec.origin {
            annotations.insert(
                ORIGIN_NAMESPACE_ANNOTATION.to_string(),
                origin.namespace.clone(),
            );
            annotations.insert(ORIGIN_NAME_ANNOTATION.to_string(), origin.name.clone());
        }
        let traits = ServiceTraits::of_record(winner);
        Service {
            metadata: ObjectMeta {
                annotations: Some(annotations),
                ..self.meta(self.service_name.clone(), BTreeMap::from([managed()]))
            },
            spec: Some(ServiceSpec {
                type_: Some(
                    if vip.is_some() {
                        "LoadBalancer"
                    } else {
                        "ClusterIP"
                    }
                    .into(),
                ),
                cluster_ip: headless.then(|| "None".into()),
                // KEP-1645: the oldest export's session affinity, which kube-proxy applies.
                session_affinity: traits.client_ip_timeout.map(|_| CLIENT_IP.into()),
                session_affinity_config: traits.client_ip_timeout.map(|t| SessionAffinityConfig {
                    client_ip: Some(ClientIPConfig {
                        timeout_seconds: Some(t),
                    }),
                }),
                load_balancer_class: vip.map(|_| VIP_LOAD_BALANCER_CLASS.into()),
                allocate_load_balancer_node_ports: vip.map(|_| false),
                ports: Some(service_ports(ports)),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    /// One EndpointSlice per (source cluster, family, port set), sorted by name.
    fn endpoint_slices(
        &self,
        winner: &ServiceRecord,
        groups: &Groups,
        hostnames: &Hostnames,
    ) -> Vec<EndpointSlice> {
        let service_name = &self.service_name;
        let mcs_name = winner.spec.origin.as_ref().map(|o| o.name.clone());
        let mut slices = groups
            .iter()
            .map(|((cluster, v6, set), addresses)| {
                let family = if *v6 { "IPv6" } else { "IPv4" };
                // One slice per source cluster, so each carries the MCS source-cluster label.
                let id = if cluster.is_empty() {
                    port_set_id(set)
                } else {
                    format!("{cluster}/{}", port_set_id(set))
                };
                let slice_name = format!(
                    "{service_name}-{}-{}",
                    family.to_ascii_lowercase(),
                    names::hash8(&id)
                );
                let mut labels = BTreeMap::from([
                    (
                        ENDPOINTSLICE_SERVICE_NAME_LABEL.to_string(),
                        service_name.clone(),
                    ),
                    (
                        ENDPOINTSLICE_MANAGED_BY_LABEL.to_string(),
                        BINDER_MANAGER.to_string(),
                    ),
                    managed(),
                ]);
                if let Some(name) = &mcs_name {
                    labels.insert(MCS_SERVICE_NAME_LABEL.to_string(), name.clone());
                }
                if !cluster.is_empty() {
                    labels.insert(MCS_SOURCE_CLUSTER_LABEL.to_string(), cluster.clone());
                }
                EndpointSlice {
                    metadata: self.meta(slice_name, labels),
                    address_type: family.into(),
                    endpoints: addresses
                        .iter()
                        .map(|a| SliceEndpoint {
                            addresses: vec![a.clone()],
                            hostname: hostnames.get(&(cluster.clone(), a.clone())).cloned(),
                            conditions: Some(EndpointConditions {
                                ready: Some(true),
                                ..EndpointConditions::default()
                            }),
                            ..SliceEndpoint::default()
                        })
                        .collect(),
                    ports: Some(
                        set.iter()
                            .map(|(name, protocol, port)| EndpointPort {
                                name: non_empty(name),
                                port: Some(*port),
                                protocol: Some(protocol.as_str().into()),
                                ..EndpointPort::default()
                            })
                            .collect(),
                    ),
                }
            })
            .collect::<Vec<_>>();
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        slices
    }

    /// Legacy Endpoints: one subset per port set, both families together.
    fn endpoints(&self, groups: &Groups) -> Endpoints {
        let mut subsets: BTreeMap<&PortSet, Vec<String>> = BTreeMap::new();
        for ((_, _, set), addresses) in groups {
            subsets
                .entry(set)
                .or_default()
                .extend(addresses.iter().cloned());
        }
        let subsets: Vec<EndpointSubset> = subsets
            .into_iter()
            .map(|(set, mut addresses)| {
                addresses.sort();
                // Two clusters may list the same address.
                addresses.dedup();
                EndpointSubset {
                    addresses: Some(
                        addresses
                            .into_iter()
                            .map(|ip| EndpointAddress {
                                ip,
                                ..EndpointAddress::default()
                            })
                            .collect(),
                    ),
                    ports: Some(
                        set.iter()
                            .map(|(name, protocol, port)| LegacyPort {
                                name: non_empty(name),
                                port: *port,
                                protocol: Some(protocol.as_str().into()),
                                ..LegacyPort::default()
                            })
                            .collect(),
                    ),
                    ..EndpointSubset::default()
                }
            })
            .collect();
        Endpoints {
            metadata: self.meta(
                self.service_name.clone(),
                BTreeMap::from([
                    managed(),
                    (SKIP_MIRROR_LABEL.to_string(), "true".to_string()),
                ]),
            ),
            subsets: (!subsets.is_empty()).then_some(subsets),
        }
    }
}

/// The label of every object the binder manages.
fn managed() -> (String, String) {
    (MANAGED_BY_LABEL.to_string(), BINDER_MANAGER.to_string())
}

/// The MCS type name of a headless or cluster IP service, for messages.
fn kind(headless: bool) -> &'static str {
    if headless {
        xcc_proto::mcs::TYPE_HEADLESS
    } else {
        xcc_proto::mcs::TYPE_CLUSTER_SET_IP
    }
}

/// Names of the binder's EndpointSlices for `service_name` among `existing` that are not in
/// `desired` — to delete. Slices another controller manages are never listed.
pub fn stale_slices<'a>(
    service_name: &str,
    desired: &[EndpointSlice],
    existing: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Vec<String> {
    let keep: BTreeSet<Option<&String>> =
        desired.iter().map(|s| s.metadata.name.as_ref()).collect();
    let mut stale: Vec<String> = existing
        .into_iter()
        .filter(|s| {
            let labels = s.metadata.labels.as_ref();
            let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
            label(ENDPOINTSLICE_MANAGED_BY_LABEL) == Some(BINDER_MANAGER)
                && label(ENDPOINTSLICE_SERVICE_NAME_LABEL) == Some(service_name)
                && !keep.contains(&s.metadata.name.as_ref())
        })
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    stale.sort();
    stale
}

#[cfg(test)]
mod tests;
