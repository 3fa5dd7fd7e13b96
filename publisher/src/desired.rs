//! The exported ServiceRecord a source object should have — pure: object, nodes and the
//! ingress Service in; the desired record (or why there is none) out. No I/O.
//!
//! Two sources (XCC v1's HTTPProxy publisher, without its defects, and labelled Services):
//! - **HTTPProxy** labelled `connectivity.tanzu.vmware.com/export` with a virtualhost: record
//!   named after the canonical FQDN, endpoints = the ingress Service's LoadBalancer addresses when
//!   it has any, else the InternalIPs of the nodes the ingress DaemonSet can run on, all on the
//!   configured ingress port (443 by default); sorted, so equal inputs give equal records.
//! - **Service** labelled for export: FQDN from `connectivity.tanzu.vmware.com/fqdn`, default
//!   `<name>.<clusterset namespace>.svc.clusterset.local`; endpoints by Service type;
//!   `connectivity.tanzu.vmware.com/clusters` becomes the allowed requesters; origin recorded.
//!
//! Records carry the export label, the publisher's managed-by label and a controller owner
//! reference to their source; [`is_owned_by`] and [`stale_records`] use exactly those, so the
//! controller never deletes or rewrites a record it does not own.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service, ServicePort as KubeServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use xcc_proto::crd::{
    ENDPOINTSLICE_SERVICE_NAME_LABEL, Endpoint, MANAGED_BY_LABEL, Origin, PUBLISHER_MANAGER,
    Protocol, ServicePort, ServiceRecord, ServiceRecordSpec,
};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::mcs::{
    HEADLESS_ANNOTATION, HEADLESS_TRUE, HOSTNAMES_ANNOTATION, format_hostnames, ready_endpoints,
};
use xcc_proto::names::{
    self, CLUSTERS_ANNOTATION, EXPORT_LABEL, FQDN_ANNOTATION, LABEL_PREFIX, NODE_ROLE_MASTER_LABEL,
    SERVICE_PORT_ANNOTATION, WORKLOAD_SELECTOR_ANNOTATION,
};

use crate::httpproxy::HTTPProxy;

/// Port the ingress (Contour's Envoy) serves exported proxies on, as XCC v1 assumed.
pub const DEFAULT_INGRESS_PORT: i32 = 443;

/// Node role labels marking control-plane nodes, where the ingress DaemonSet does not run.
pub const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    NODE_ROLE_MASTER_LABEL,
];

/// Taint keys every DaemonSet pod tolerates (the DaemonSet controller adds these tolerations),
/// so a node carrying only these still runs the ingress. XCC v1's list plus `pid-pressure`.
pub const TOLERATED_TAINTS: [&str; 7] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/network-unavailable",
];

/// Publisher settings that shape records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Port the ingress serves exported HTTPProxies on (XCC v1: 443).
    pub ingress_port: i32,
    /// This cluster's name, recorded as `spec.origin.cluster`.
    pub cluster: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ingress_port: DEFAULT_INGRESS_PORT,
            cluster: None,
        }
    }
}

/// Why a source object has no exported record. For every reason the controller removes the
/// records the object owns (a proxy that lost its label or virtualhost is no longer exported).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The export label is absent.
    NotExported,
    /// An HTTPProxy without `spec.virtualhost` (an included, non-root proxy): skipped, never a
    /// crash.
    NoVirtualHost,
    /// The FQDN is not a DNS name; the message says why.
    InvalidFqdn(String),
    /// A Service without a cluster IP (`clusterIP: None`) and no EndpointSlices to read its
    /// pods from (the publisher reads them in MCS mode only).
    Headless,
    /// An ExternalName Service points elsewhere already.
    ExternalName,
    /// A Service without ports.
    NoPorts,
    /// The object has no name, namespace or uid (never the case for objects read from the API
    /// server).
    IncompleteMetadata,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::NotExported => write!(f, "not labelled {EXPORT_LABEL}"),
            Skip::NoVirtualHost => write!(f, "HTTPProxy has no spec.virtualhost"),
            Skip::InvalidFqdn(why) => write!(f, "{why}"),
            Skip::Headless => write!(
                f,
                "headless Service (clusterIP: None) is exported only in MCS mode"
            ),
            Skip::ExternalName => write!(f, "ExternalName Service cannot be exported"),
            Skip::NoPorts => write!(f, "Service has no ports"),
            Skip::IncompleteMetadata => write!(f, "object has no name, namespace or uid"),
        }
    }
}

/// What a source object should publish.
#[derive(Clone, Debug, PartialEq)]
pub enum Desired {
    /// This record, created or updated in the source's namespace.
    Publish(Box<ServiceRecord>),
    /// Nothing; records the source owns are removed.
    Skip(Skip),
}

impl Desired {
    /// The record, if one is desired.
    pub fn record(&self) -> Option<&ServiceRecord> {
        match self {
            Desired::Publish(record) => Some(record),
            Desired::Skip(_) => None,
        }
    }
}

fn has_label(meta: &ObjectMeta, key: &str) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(key))
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Whether `node` reports condition `Ready=True` (a missing condition is not ready).
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conds| {
            conds
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// Whether the ingress DaemonSet runs on `node`: ready, not a control-plane node, and no taint
/// with effect `NoSchedule` or `NoExecute` except the ones DaemonSets tolerate
/// ([`TOLERATED_TAINTS`]). `PreferNoSchedule` taints do not keep DaemonSet pods away.
pub fn node_runs_ingress(node: &Node) -> bool {
    if !node_is_ready(node) {
        return false;
    }
    if CONTROL_PLANE_LABELS
        .iter()
        .any(|label| has_label(&node.metadata, label))
    {
        return false;
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    !taints.is_some_and(|taints| {
        taints.iter().any(|t| {
            matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
                && !TOLERATED_TAINTS.contains(&t.key.as_str())
        })
    })
}

/// The node's `InternalIP` addresses that parse as IPs (one per family on dual-stack nodes),
/// in the order the node lists them, without duplicates.
pub fn node_internal_ips(node: &Node) -> Vec<String> {
    let mut seen = BTreeSet::new();
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP" && a.address.parse::<IpAddr>().is_ok())
        .filter(|a| seen.insert(a.address.clone()))
        .map(|a| a.address.clone())
        .collect()
}

/// Sort by (address, port) and drop duplicates (equal inputs give byte-equal records, so no
/// spurious update).
fn normalise(mut endpoints: Vec<Endpoint>) -> Vec<Endpoint> {
    endpoints.sort();
    endpoints.dedup();
    endpoints
}

/// Addresses of `status.loadBalancer.ingress` (IP, else hostname).
fn load_balancer_addresses(service: &Service) -> Vec<String> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
        .filter(|a| !a.is_empty())
        .collect()
}

/// Endpoints of the ingress: the ingress Service's LoadBalancer addresses when it has any,
/// else the InternalIPs of every node that runs the ingress; all on `port`; sorted.
pub fn ingress_endpoints(ingress: Option<&Service>, nodes: &[Node], port: i32) -> Vec<Endpoint> {
    let lb = ingress.map(load_balancer_addresses).unwrap_or_default();
    let addresses = if lb.is_empty() {
        nodes
            .iter()
            .filter(|n| node_runs_ingress(n))
            .flat_map(node_internal_ips)
            .collect()
    } else {
        lb
    };
    normalise(
        addresses
            .into_iter()
            .map(|address| Endpoint { address, port })
            .collect(),
    )
}

/// Annotations passed through from the source: keys under `connectivity.tanzu.vmware.com/` (with
/// the slash: `connectivity.tanzu.vmware.comX` is not one), except the ones the publisher consumes
/// itself.
fn passed_annotations(meta: &ObjectMeta) -> BTreeMap<String, String> {
    let prefix = format!("{LABEL_PREFIX}/");
    meta.annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(&prefix))
        .filter(|(k, _)| k.as_str() != FQDN_ANNOTATION && k.as_str() != CLUSTERS_ANNOTATION)
        // Only the publisher says when an export began and what its Service's MCS fields are
        // (from its ServiceExport and Service).
        .filter(|(k, _)| {
            k.as_str() != xcc_proto::mcs::EXPORTED_AT_ANNOTATION
                && !xcc_proto::mcs::TRAIT_KEYS.contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The owner reference a record carries to its source (controller, so the API server's GC
/// removes the record with its source and kube-runtime maps record events to the source).
fn owner_reference<K: Resource<DynamicType = ()>>(obj: &K) -> Option<OwnerReference> {
    let meta = obj.meta();
    Some(OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone()?,
        uid: meta.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: None,
    })
}

fn record(
    name: String,
    namespace: String,
    owner: OwnerReference,
    annotations: BTreeMap<String, String>,
    spec: ServiceRecordSpec,
) -> Desired {
    let labels = BTreeMap::from([
        (EXPORT_LABEL.to_string(), String::new()),
        (MANAGED_BY_LABEL.to_string(), PUBLISHER_MANAGER.to_string()),
    ]);
    Desired::Publish(Box::new(ServiceRecord {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }))
}

/// The exported record of an HTTPProxy (as XCC v1's publisher, without its defects).
///
/// `ingress` is the ingress (Envoy) Service, when configured; `nodes` are all nodes.
pub fn from_httpproxy(
    proxy: &HTTPProxy,
    ingress: Option<&Service>,
    nodes: &[Node],
    config: &Config,
) -> Desired {
    // The label first, then the virtualhost (a proxy without one is normal in Contour); neither
    // dereference can fail.
    if !has_label(&proxy.metadata, EXPORT_LABEL) {
        return Desired::Skip(Skip::NotExported);
    }
    let Some(vhost) = proxy.spec.virtualhost.as_ref() else {
        return Desired::Skip(Skip::NoVirtualHost);
    };
    let fqdn = match names::canonical_fqdn(&vhost.fqdn) {
        Ok(fqdn) => fqdn,
        Err(e) => return Desired::Skip(Skip::InvalidFqdn(e.to_string())),
    };
    let (Some(name), Some(namespace), Some(owner)) = (
        proxy.metadata.name.clone(),
        proxy.metadata.namespace.clone(),
        owner_reference(proxy),
    ) else {
        return Desired::Skip(Skip::IncompleteMetadata);
    };
    let mut annotations = passed_annotations(&proxy.metadata);
    annotations.insert(
        SERVICE_PORT_ANNOTATION.to_string(),
        config.ingress_port.to_string(),
    );
    let spec = ServiceRecordSpec {
        fqdn: fqdn.clone(),
        endpoints: ingress_endpoints(ingress, nodes, config.ingress_port),
        allowed_requesters: None,
        ports: None,
        origin: Some(Origin {
            cluster: config.cluster.clone(),
            namespace: namespace.clone(),
            name,
            kind: Some(HTTPProxy::kind(&()).into_owned()),
        }),
    };
    record(fqdn, namespace, owner, annotations, spec)
}

/// `a, b` → `["a", "b"]`: split on commas, trim, drop empty entries, sort, dedupe. An
/// annotation that lists nobody yields an empty list (nobody may import).
pub fn parse_clusters(value: &str) -> Vec<String> {
    let set: BTreeSet<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    set.into_iter().collect()
}

/// The exported record of a Service labelled for export.
///
/// `clusterset_namespace` is the namespace the Service's namespace maps to (namespace mapping; the
/// Service's own namespace when unmapped): it names the default FQDN and the origin. `nodes`
/// are all nodes (used for NodePort Services).
///
/// Endpoints by type: `LoadBalancer` — each ingress address on each service port (none until
/// the load balancer is provisioned); `NodePort` — each ready node's InternalIPs on each node
/// port (`spec.ports[].targetPort` then names the node port); `ClusterIP` — the cluster IPs on
/// each port, for flat networks; headless (`clusterIP: None`) — see [`from_exported_service`].
pub fn from_service(
    service: &Service,
    clusterset_namespace: &str,
    nodes: &[Node],
    config: &Config,
) -> Desired {
    let by = if has_label(&service.metadata, EXPORT_LABEL) {
        ExportedBy::Label
    } else {
        ExportedBy::Nothing
    };
    from_exported_service(service, by, clusterset_namespace, nodes, None, config)
}

/// The EndpointSlices among `slices` that belong to the Service `namespace/name`.
pub fn slices_of<'a>(
    namespace: &str,
    name: &str,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Vec<&'a EndpointSlice> {
    slices
        .into_iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ENDPOINTSLICE_SERVICE_NAME_LABEL))
                .is_some_and(|n| n == name)
        })
        .collect()
}

/// What a Service exports when its pods are exported, from its EndpointSlices: the ready addresses
/// ([`ready_endpoints`]), their hostnames (address → hostname) and, per slice port name, the
/// port the pods serve it on.
struct Pods {
    addresses: BTreeSet<String>,
    hostnames: BTreeMap<String, String>,
    ports: BTreeMap<String, i32>,
}

fn pods(slices: &[&EndpointSlice]) -> Pods {
    let mut out = Pods {
        addresses: BTreeSet::new(),
        hostnames: BTreeMap::new(),
        ports: BTreeMap::new(),
    };
    for slice in slices {
        for p in slice.ports.iter().flatten() {
            if let Some(port) = p.port.filter(|p| (1..=65535).contains(p)) {
                out.ports
                    .entry(p.name.clone().unwrap_or_default())
                    .or_insert(port);
            }
        }
        for (ip, host) in ready_endpoints(slice) {
            let ip = ip.to_string();
            if let Some(host) = host {
                out.hostnames
                    .entry(ip.clone())
                    .or_insert_with(|| host.to_string());
            }
            out.addresses.insert(ip);
        }
    }
    out
}

/// Why a Service is exported, which decides what its record's endpoints are
/// ([`from_exported_service`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportedBy {
    /// Not exported.
    Nothing,
    /// The XCC v1 export label (a ServiceExport beside it changes no endpoint; the label's
    /// export of a cluster IP is then no MCS export, see `mcs::stamp_export`): the endpoints are
    /// what XCC v1 exports for the Service's type — its cluster IPs, load-balancer addresses
    /// or node addresses (a headless Service's pods in MCS mode).
    Label,
    /// A ServiceExport and no label (MCS mode): the endpoints are the Service's ready pod
    /// addresses on the ports the pods serve, read from its EndpointSlices — on a flat pod
    /// network (the MCS norm) pod addresses reach across clusters, cluster IPs need routed
    /// service CIDRs.
    ServiceExport,
}

impl ExportedBy {
    /// Whether the Service is exported at all.
    pub fn exported(self) -> bool {
        self != ExportedBy::Nothing
    }
}

/// [`from_service`] with the export decision made by the caller: `by` is the export label or,
/// in MCS mode, a ServiceExport of the Service's name ([`crate::mcs::exported`]) — either way
/// one record, whose endpoints `by` decides ([`ExportedBy`]).
///
/// `slices` are the Service's EndpointSlices ([`slices_of`]) when the caller reads them (MCS
/// mode). A headless Service, and any Service exported by a ServiceExport alone
/// ([`ExportedBy::ServiceExport`]), then exports its ready pod addresses on the ports the pods
/// serve (each Service port's number in the slices' port of its name; without one, its numeric
/// `targetPort`, else its port); a headless one is marked with [`HEADLESS_ANNOTATION`] and,
/// for pods with a hostname, [`HOSTNAMES_ANNOTATION`]. Without slices (`None`) a headless
/// Service is not exported ([`Skip::Headless`]) and any other exports by its type.
pub fn from_exported_service(
    service: &Service,
    by: ExportedBy,
    clusterset_namespace: &str,
    nodes: &[Node],
    slices: Option<&[&EndpointSlice]>,
    config: &Config,
) -> Desired {
    if !by.exported() {
        return Desired::Skip(Skip::NotExported);
    }
    let (Some(name), Some(namespace), Some(owner)) = (
        service.metadata.name.clone(),
        service.metadata.namespace.clone(),
        owner_reference(service),
    ) else {
        return Desired::Skip(Skip::IncompleteMetadata);
    };
    let Some(svc_spec) = service.spec.as_ref() else {
        return Desired::Skip(Skip::NoPorts);
    };
    let type_ = svc_spec.type_.as_deref().unwrap_or("ClusterIP");
    if type_ == "ExternalName" {
        return Desired::Skip(Skip::ExternalName);
    }
    let raw_fqdn = annotation(&service.metadata, FQDN_ANNOTATION)
        .map(str::to_string)
        .unwrap_or_else(|| names::clusterset_fqdn(&name, clusterset_namespace));
    let fqdn = match names::canonical_fqdn(&raw_fqdn) {
        Ok(fqdn) => fqdn,
        Err(e) => return Desired::Skip(Skip::InvalidFqdn(e.to_string())),
    };
    let svc_ports = svc_spec.ports.as_deref().unwrap_or_default();
    if svc_ports.is_empty() {
        return Desired::Skip(Skip::NoPorts);
    }
    let headless = svc_spec.cluster_ip.as_deref() == Some("None")
        || svc_spec.cluster_ips.iter().flatten().any(|ip| ip == "None");
    // The pods behind the Service, when they are what it exports.
    let pods = match (headless, by, slices) {
        (true, _, None) => return Desired::Skip(Skip::Headless),
        (true, _, Some(slices)) | (false, ExportedBy::ServiceExport, Some(slices)) => {
            Some(pods(slices))
        }
        (false, _, _) => None,
    };
    let node_port = type_ == "NodePort" && pods.is_none();
    let ports = record_ports(svc_ports, node_port, pods.as_ref());
    let Some(addresses) = addresses(service, svc_spec, pods.as_ref(), nodes) else {
        return Desired::Skip(Skip::Headless);
    };
    let endpoints = normalise(
        addresses
            .iter()
            .flat_map(|address| {
                ports.iter().map(|p| Endpoint {
                    address: address.clone(),
                    port: p.target_port(),
                })
            })
            .collect(),
    );
    let annotations = record_annotations(
        service,
        svc_spec,
        pods.as_ref().filter(|_| headless),
        &ports,
        clusterset_namespace,
        &name,
    );
    let spec = ServiceRecordSpec {
        fqdn: fqdn.clone(),
        endpoints,
        allowed_requesters: annotation(&service.metadata, CLUSTERS_ANNOTATION).map(parse_clusters),
        ports: Some(ports),
        origin: Some(Origin {
            cluster: config.cluster.clone(),
            namespace: clusterset_namespace.to_string(),
            name,
            kind: Some(Service::kind(&()).into_owned()),
        }),
    };
    record(fqdn, namespace, owner, annotations, spec)
}

/// The record's ports: each Service port, on its node port (NodePort Services; one without a
/// node port yet is left out) or on the port the pods serve it on (`pods`).
fn record_ports(
    svc_ports: &[KubeServicePort],
    node_port: bool,
    pods: Option<&Pods>,
) -> Vec<ServicePort> {
    let mut ports = Vec::new();
    for p in svc_ports {
        let protocol = p
            .protocol
            .as_deref()
            .map_or(Some(Protocol::Tcp), Protocol::parse)
            .unwrap_or_default();
        ports.push(ServicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            port: p.port,
            protocol: Some(protocol),
            // A NodePort port without an allocated node port yet has no endpoint port.
            target_port: if node_port {
                Some(p.node_port.unwrap_or(0))
            } else {
                None
            },
        });
    }
    ports.retain(|p| p.target_port != Some(0));
    if let Some(pods) = pods {
        // The pods serve each port on the slice port of its name; without slices yet, on the
        // Service's numeric targetPort, else its port.
        // (`ports` still lines up with `svc_ports`: only NodePort ports were left out.)
        for (p, spec) in ports.iter_mut().zip(svc_ports) {
            let name = p.name.clone().unwrap_or_default();
            p.target_port = pods.ports.get(&name).copied().or(match spec.target_port {
                Some(IntOrString::Int(t)) if (1..=65535).contains(&t) => Some(t),
                _ => None,
            });
        }
    }
    ports
}

/// The addresses the Service is reached on: its pods', its load balancer's, its ready nodes' or
/// its cluster IPs; `None` for a headless Service without pods.
fn addresses(
    service: &Service,
    svc_spec: &ServiceSpec,
    pods: Option<&Pods>,
    nodes: &[Node],
) -> Option<Vec<String>> {
    let type_ = svc_spec.type_.as_deref().unwrap_or("ClusterIP");
    let addresses: Vec<String> = match (type_, pods) {
        (_, Some(pods)) => pods.addresses.iter().cloned().collect(),
        ("LoadBalancer", _) => load_balancer_addresses(service),
        ("NodePort", _) => nodes
            .iter()
            .filter(|n| node_is_ready(n))
            .flat_map(node_internal_ips)
            .collect(),
        _ => {
            let ips: Vec<String> = match &svc_spec.cluster_ips {
                Some(ips) if !ips.is_empty() => ips.clone(),
                _ => svc_spec.cluster_ip.clone().into_iter().collect(),
            };
            if ips.iter().any(|ip| ip == "None") {
                return None;
            }
            ips
        }
    };
    Some(addresses)
}

/// The record's annotations: the Service's passed-through ones, and the publisher's own (the
/// headless pods, the workload selector, the Hamlet port, the origin).
fn record_annotations(
    service: &Service,
    svc_spec: &ServiceSpec,
    headless_pods: Option<&Pods>,
    ports: &[ServicePort],
    clusterset_namespace: &str,
    name: &str,
) -> BTreeMap<String, String> {
    let mut annotations = passed_annotations(&service.metadata);
    // Only the publisher says what is headless: a user's annotation of these keys is dropped.
    annotations.remove(HEADLESS_ANNOTATION);
    annotations.remove(HOSTNAMES_ANNOTATION);
    if let Some(pods) = headless_pods {
        annotations.insert(HEADLESS_ANNOTATION.to_string(), HEADLESS_TRUE.to_string());
        if !pods.hostnames.is_empty() {
            annotations.insert(
                HOSTNAMES_ANNOTATION.to_string(),
                format_hostnames(&pods.hostnames),
            );
        }
    }
    // The pods behind the Service, for grant policies at the registry (which never reads
    // Services). A Service without a selector keeps the one its user annotated, if any.
    if let Some(selector) = svc_spec.selector.as_ref().filter(|s| !s.is_empty()) {
        annotations.insert(
            WORKLOAD_SELECTOR_ANNOTATION.to_string(),
            names::format_selector(selector),
        );
    }
    // Hamlet peers know one port only: the first one.
    if let Some(first) = ports.first() {
        annotations.insert(SERVICE_PORT_ANNOTATION.to_string(), first.port.to_string());
    }
    // The origin travels over Hamlet as these two annotations (FederatedService labels), so
    // importers can name MCS records and Cilium global Services after it.
    annotations.insert(
        ORIGIN_NAMESPACE_ANNOTATION.to_string(),
        clusterset_namespace.to_string(),
    );
    annotations.insert(ORIGIN_NAME_ANNOTATION.to_string(), name.to_string());
    annotations
}

/// Whether the publisher may rewrite or delete `record` on behalf of the source object with
/// uid `owner_uid`: the record has the export label, the publisher's managed-by label and an
/// owner reference with that uid. Anything else was made by someone else and is left alone.
pub fn is_owned_by(record: &ServiceRecord, owner_uid: &str) -> bool {
    let meta = &record.metadata;
    has_label(meta, EXPORT_LABEL)
        && meta
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY_LABEL))
            .is_some_and(|v| v == PUBLISHER_MANAGER)
        && meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == owner_uid)
}

/// The records among `records` that the source with uid `owner_uid` owns but should no longer
/// have: all of them when `keep` is `None` (the source is not exported), else all but the one
/// named `keep` (the FQDN changed). Sorted by name.
pub fn stale_records<'a>(
    owner_uid: &str,
    keep: Option<&str>,
    records: impl IntoIterator<Item = &'a ServiceRecord>,
) -> Vec<&'a ServiceRecord> {
    let mut stale: Vec<&ServiceRecord> = records
        .into_iter()
        .filter(|r| is_owned_by(r, owner_uid))
        .filter(|r| keep.is_none() || r.metadata.name.as_deref() != keep)
        .collect();
    stale.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    stale
}

/// Whether an existing record named like the desired one may be replaced: it does not exist,
/// or the source owns it. A record of the same name owned by something else is a conflict the
/// controller reports instead of overwriting.
pub fn may_write(existing: Option<&ServiceRecord>, owner_uid: &str) -> bool {
    existing.is_none_or(|r| is_owned_by(r, owner_uid))
}

/// The controller owner reference of a record the publisher manages (export and managed-by
/// labels present), or `None` for anything else. Identifies the source a record event concerns.
pub fn publisher_owner(record: &ServiceRecord) -> Option<&OwnerReference> {
    let meta = &record.metadata;
    let managed = has_label(meta, EXPORT_LABEL)
        && meta
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY_LABEL))
            .is_some_and(|v| v == PUBLISHER_MANAGER);
    if !managed {
        return None;
    }
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// The records among `records` that the publisher made for the source `api_version`/`kind`
/// named `name` (in the records' namespace), whatever that source's uid was: what remains to
/// remove once the source is gone or no longer exported. Sorted by name.
pub fn records_of_source<'a>(
    api_version: &str,
    kind: &str,
    name: &str,
    records: impl IntoIterator<Item = &'a ServiceRecord>,
) -> Vec<&'a ServiceRecord> {
    let mut found: Vec<&ServiceRecord> = records
        .into_iter()
        .filter(|r| {
            publisher_owner(r)
                .is_some_and(|o| o.api_version == api_version && o.kind == kind && o.name == name)
        })
        .collect();
    found.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    found
}

#[cfg(test)]
mod tests;
