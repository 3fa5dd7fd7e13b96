//! The Kubernetes feed of `xcc dns`: watches Services and the binder's EndpointSlices (always:
//! headless imports answer with their endpoints, [`crate::headless`]), and Pods and Namespaces
//! (when transparent resolution or namespace mapping needs them), and applies what they say to
//! the [`DnsIndex`] through a [`DnsFeed`].
//!
//! Each watch is a `kube::runtime::watcher` (list, then watch from the list's resourceVersion,
//! relisting after 410 Gone, with kube's default backoff on errors). The index is the cache, so
//! no separate `reflector` store is kept: a listing (`Init` … `InitDone`) replaces that source's
//! contents in one step — which is also what marks it synced for readiness — and individual
//! events apply or delete single objects. Events that arrive together are applied as one batch
//! and published once.
//!
//! The conversions from Kubernetes objects are pure and tested on their own: a Service counts only
//! when it carries the FQDN annotation or both origin annotations (never every Service of the
//! cluster), and only those annotations are kept, so unrelated annotation churn (`kubectl apply`'s
//! last-applied configuration, for instance) never rebuilds the zones. Host-network pods (whose
//! address is the node's) and finished pods (whose address may already be reused) are not indexed.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::net::IpAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use xcc_controller::watch::{Change, Follow};
use xcc_proto::crd::{
    BINDER_MANAGER, CILIUM_GLOBAL_ANNOTATION, ENDPOINTSLICE_MANAGED_BY_LABEL, MANAGED_BY_LABEL,
};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::names::FQDN_ANNOTATION;

use super::headless::slice_info;
use super::index::{DnsFeed, DnsIndex, FeedSource};
use super::zone::{NameAnnotations, NamedPort, PortProtocol, ServiceInfo, ServiceKey};

/// Events applied in one batch at most (one publish each); bounds the time the index is locked.
const BATCH: usize = 512;

/// Why no Kubernetes client could be made.
#[derive(Debug, Error)]
pub enum KubeClientError {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// The cause.
        source: kube::config::KubeconfigError,
    },
    /// Neither in-cluster configuration nor `$KUBECONFIG` / `~/.kube/config` works.
    #[error("no Kubernetes configuration (in-cluster or kubeconfig): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The configuration was read but no client could be built from it.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A client from `kubeconfig`, or inferred (in-cluster, then `$KUBECONFIG` / `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| KubeClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

/// What the Kubernetes feed watches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeFeedConfig {
    /// Watch Services (and the binder's EndpointSlices) in this namespace only (all
    /// namespaces when `None`).
    pub service_namespace: Option<String>,
    /// Watch Pods and Namespaces for the source address index and the namespace mapping.
    pub pods_and_namespaces: bool,
}

impl KubeFeedConfig {
    /// The sources the index must see listed before it is ready.
    pub fn required_sources(&self) -> Vec<FeedSource> {
        let mut out = vec![FeedSource::Services, FeedSource::EndpointSlices];
        if self.pods_and_namespaces {
            out.extend([FeedSource::Pods, FeedSource::Namespaces]);
        }
        out
    }
}

/// The DNS view of a Service, or `None` when it carries none of our annotations.
pub fn service_info(svc: &Service) -> Option<ServiceInfo> {
    let all = svc.metadata.annotations.as_ref()?;
    let annotations: NameAnnotations = [
        FQDN_ANNOTATION,
        ORIGIN_NAMESPACE_ANNOTATION,
        ORIGIN_NAME_ANNOTATION,
    ]
    .into_iter()
    .filter_map(|k| all.get(k).map(|v| (k, v.clone())))
    .collect();
    let has_fqdn = annotations.fqdn.is_some();
    let has_origin = annotations.origin_namespace.is_some() && annotations.origin_name.is_some();
    if !(has_fqdn || has_origin) {
        return None;
    }
    let spec = svc.spec.as_ref();
    let raw_ips: Vec<&String> = match spec.and_then(|s| s.cluster_ips.as_ref()) {
        Some(ips) if !ips.is_empty() => ips.iter().collect(),
        _ => spec
            .and_then(|s| s.cluster_ip.as_ref())
            .into_iter()
            .collect(),
    };
    // "None" (headless) and "" (ExternalName) do not parse and are skipped.
    let cluster_ips = raw_ips.iter().filter_map(|s| s.parse().ok()).collect();
    let ports = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some(NamedPort {
                name: p.name.clone().filter(|n| !n.is_empty()),
                port: u16::try_from(p.port).ok()?,
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => PortProtocol::Udp,
                    Some("SCTP") => PortProtocol::Sctp,
                    _ => PortProtocol::Tcp,
                },
            })
        })
        .collect();
    Some(ServiceInfo {
        key: ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any()),
        annotations,
        cluster_ips,
        ports,
    })
}

/// `(namespace, name, addresses)` of a pod to index, or `None` for host-network and finished
/// pods and pods without an address yet.
pub fn pod_addresses(pod: &Pod) -> Option<(String, String, Vec<IpAddr>)> {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
    {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(
            status
                .pod_ip
                .as_ref()
                .and_then(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    if ips.is_empty() {
        return None;
    }
    Some((pod.namespace().unwrap_or_default(), pod.name_any(), ips))
}

/// `(name, annotations)` of a Namespace.
pub fn namespace_entry(ns: &Namespace) -> (String, BTreeMap<String, String>) {
    (ns.name_any(), ns.annotations().clone())
}

/// Follow Services (and Pods and Namespaces, when configured) into `feed` until `cancel`.
pub async fn run(client: Client, feed: DnsFeed, config: KubeFeedConfig, cancel: CancellationToken) {
    let services: Api<Service> = match &config.service_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let slices: Api<EndpointSlice> = match &config.service_namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let all = watcher::Config::default;
    let services = follow(services, all(), &feed, &cancel, apply_services);
    let binders = format!("{ENDPOINTSLICE_MANAGED_BY_LABEL}={BINDER_MANAGER}");
    let slices = follow(slices, all().labels(&binders), &feed, &cancel, apply_slices);
    if config.pods_and_namespaces {
        let pods = follow(
            Api::<Pod>::all(client.clone()),
            all(),
            &feed,
            &cancel,
            apply_pods,
        );
        let namespaces = follow(
            Api::<Namespace>::all(client),
            all(),
            &feed,
            &cancel,
            apply_namespaces,
        );
        tokio::join!(services, slices, pods, namespaces);
    } else {
        tokio::join!(services, slices);
    }
}

fn apply_slices(index: &mut DnsIndex, change: Change<EndpointSlice>) {
    let key = |s: &EndpointSlice| (s.namespace().unwrap_or_default(), s.name_any());
    match change {
        Change::Listed(all) => index.reset_slices(all.iter().filter_map(slice_info)),
        Change::Applied(slice) => match slice_info(&slice) {
            Some((key, info)) => index.apply_slice(key, info),
            None => index.delete_slice(&key(&slice)),
        },
        Change::Deleted(slice) => index.delete_slice(&key(&slice)),
    }
}

/// Whether `svc` is one of the binder's Services that carry traffic through its EndpointSlices:
/// labelled by the binder, with a cluster IP (headless ones answer with their slices' endpoints
/// anyway), and not a Cilium global Service (whose endpoints Cilium provides).
pub fn is_binder_service(svc: &Service) -> bool {
    let binder = svc
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == BINDER_MANAGER);
    let cilium = svc
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CILIUM_GLOBAL_ANNOTATION));
    let headless = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_none_or(|ip| ip == "None" || ip.is_empty());
    binder && !cilium && !headless
}

fn apply_services(index: &mut DnsIndex, change: Change<Service>) {
    match change {
        Change::Listed(all) => {
            index.reset_binder_services(
                all.iter().filter(|svc| is_binder_service(svc)).map(|svc| {
                    ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any())
                }),
            );
            index.reset_services(all.iter().filter_map(service_info))
        }
        Change::Applied(svc) => match service_info(&svc) {
            Some(info) => {
                index.set_binder_service(&info.key, is_binder_service(&svc));
                index.apply_service(info)
            }
            // The annotations were removed: the Service no longer names anything.
            None => index.delete_service(&ServiceKey::new(
                svc.namespace().unwrap_or_default(),
                svc.name_any(),
            )),
        },
        Change::Deleted(svc) => index.delete_service(&ServiceKey::new(
            svc.namespace().unwrap_or_default(),
            svc.name_any(),
        )),
    }
}

fn apply_pods(index: &mut DnsIndex, change: Change<Pod>) {
    match change {
        Change::Listed(all) => index.reset_pods(all.iter().filter_map(pod_addresses)),
        Change::Applied(pod) => match pod_addresses(&pod) {
            Some((ns, name, ips)) => index.apply_pod(&ns, &name, &ips),
            None => index.delete_pod(&pod.namespace().unwrap_or_default(), &pod.name_any()),
        },
        Change::Deleted(pod) => {
            index.delete_pod(&pod.namespace().unwrap_or_default(), &pod.name_any())
        }
    }
}

fn apply_namespaces(index: &mut DnsIndex, change: Change<Namespace>) {
    match change {
        Change::Listed(all) => {
            for (ns, e) in index.reset_namespaces(all.iter().map(namespace_entry)) {
                tracing::warn!(namespace = %ns, "ignoring namespace mapping: {e}");
            }
        }
        Change::Applied(ns) => {
            let (name, annotations) = namespace_entry(&ns);
            if let Err(e) = index.apply_namespace(&name, &annotations) {
                tracing::warn!(namespace = %name, "ignoring namespace mapping: {e}");
            }
        }
        Change::Deleted(ns) => index.delete_namespace(&ns.name_any()),
    }
}

/// Watch `api` (as `config` selects) until `cancel`, applying its [`Change`]s to the index in
/// batches (the changes of the events ready at once, at most [`BATCH`] events).
async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    feed: &DnsFeed,
    cancel: &CancellationToken,
    apply: fn(&mut DnsIndex, Change<K>),
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let kind = K::kind(&()).to_string();
    // A watch error: the watcher retries with backoff; the index keeps serving what it has.
    let mut watch = Follow::new(kind.clone(), api, config);
    loop {
        let batch = tokio::select! {
            _ = cancel.cancelled() => return,
            b = watch.next_ready(BATCH) => match b {
                Some(b) => b,
                None => return,
            },
        };
        let (_, report) = feed.update(|index| {
            for change in batch {
                apply(index, change);
            }
        });
        tracing::debug!(%kind, zones_rebuilt = report.zones_rebuilt, ready = report.ready, "applied watch events");
    }
}

#[cfg(test)]
#[path = "kube_feed_tests.rs"]
mod tests;
