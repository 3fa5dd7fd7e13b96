//! Headless imports (MCS DNS, KEP-1645), pure: the binder writes a headless Service
//! (`clusterIP: None`) for a headless export and EndpointSlices per source cluster whose
//! endpoints carry the exporter's pod hostnames. From those slices ([`slice_info`]) the index
//! derives ([`derive`]):
//! - the headless Service with the ready endpoint addresses as its addresses, so its names
//!   (`<svc>.<ns>.svc.clusterset.local`, the FQDN) answer with the pods;
//! - for each endpoint with a hostname in a slice naming its source cluster, the name
//!   `<hostname>.<cluster>.<svc>.<ns>.svc.clusterset.local` answering with that endpoint.
//!
//! Both are ordinary [`ServiceInfo`]s, so the zone claims, orders and reports them like any
//! other name. Only the binder's slices are read (its managed-by label). The per-hostname names
//! are [`pod_names`], which the imports feed (file mode, no slices) calls with the imported
//! records' hostnames.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use xcc_proto::crd::{
    BINDER_MANAGER, ENDPOINTSLICE_MANAGED_BY_LABEL, ENDPOINTSLICE_SERVICE_NAME_LABEL,
};
use xcc_proto::mapping::validate_namespace;
use xcc_proto::mcs::{MCS_SOURCE_CLUSTER_LABEL, ready_endpoints};
use xcc_proto::names::clusterset_fqdn;

use super::zone::{NameAnnotations, ServiceInfo, ServiceKey};

/// `namespace/name` of an EndpointSlice.
pub type SliceKey = (String, String);

/// What `xcc dns` keeps of one of the binder's EndpointSlices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceInfo {
    /// The Service it belongs to (same namespace).
    pub service: String,
    /// Its source cluster (a DNS label), when labelled with one.
    pub cluster: Option<String>,
    /// Its ready endpoints: address and, when it is a DNS label, hostname.
    pub endpoints: Vec<(IpAddr, Option<String>)>,
}

/// The key and DNS view of `slice`, or `None` when it is not the binder's or names no
/// Service; its endpoints are the [`ready_endpoints`].
pub fn slice_info(slice: &EndpointSlice) -> Option<(SliceKey, SliceInfo)> {
    let labels = slice.metadata.labels.as_ref()?;
    if labels
        .get(ENDPOINTSLICE_MANAGED_BY_LABEL)
        .map(String::as_str)
        != Some(BINDER_MANAGER)
    {
        return None;
    }
    let service = labels.get(ENDPOINTSLICE_SERVICE_NAME_LABEL)?.clone();
    let cluster = labels
        .get(MCS_SOURCE_CLUSTER_LABEL)
        .filter(|c| validate_namespace(c).is_ok())
        .cloned();
    let endpoints = ready_endpoints(slice)
        .into_iter()
        .map(|(ip, hostname)| (ip, hostname.map(str::to_string)))
        .collect();
    let key = (
        slice.metadata.namespace.clone()?,
        slice.metadata.name.clone()?,
    );
    Some((
        key,
        SliceInfo {
            service,
            cluster,
            endpoints,
        },
    ))
}

/// The Services that `slices` make headless answers of: (the keys of the Services replaced,
/// the replacements and the per-hostname names). Only Services without cluster IPs that have
/// ready endpoints are replaced; hostname names need the Service's origin annotations (its MCS
/// name) and the slice's source cluster.
pub fn derive(
    services: &BTreeMap<ServiceKey, ServiceInfo>,
    slices: &BTreeMap<SliceKey, SliceInfo>,
) -> (BTreeSet<ServiceKey>, Vec<ServiceInfo>) {
    // Service key → its slices.
    let mut by_service: BTreeMap<ServiceKey, Vec<&SliceInfo>> = BTreeMap::new();
    for ((namespace, _), slice) in slices {
        by_service
            .entry(ServiceKey::new(namespace.clone(), slice.service.clone()))
            .or_default()
            .push(slice);
    }
    let mut replaced = BTreeSet::new();
    let mut derived = Vec::new();
    for (key, slices) in by_service {
        let Some(svc) = services.get(&key).filter(|s| s.cluster_ips.is_empty()) else {
            continue;
        };
        let ips: BTreeSet<IpAddr> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter().map(|(ip, _)| *ip))
            .collect();
        if ips.is_empty() {
            continue;
        }
        replaced.insert(key.clone());
        derived.push(ServiceInfo {
            cluster_ips: ips.into_iter().collect(),
            ..svc.clone()
        });
        // Each slice's endpoints with a hostname, under the slice's source cluster.
        let pods = slices.iter().flat_map(|slice| {
            slice.cluster.as_deref().into_iter().flat_map(|cluster| {
                slice
                    .endpoints
                    .iter()
                    .filter_map(move |(ip, hostname)| Some((cluster, *ip, hostname.as_deref()?)))
            })
        });
        derived.extend(pod_names(&key, &svc.annotations, pods));
    }
    (replaced, derived)
}

/// The Services that `slices` give at least one ready endpoint.
pub fn with_ready_endpoints(slices: &BTreeMap<SliceKey, SliceInfo>) -> BTreeSet<ServiceKey> {
    slices
        .iter()
        .filter(|(_, slice)| !slice.endpoints.is_empty())
        .map(|((namespace, _), slice)| ServiceKey::new(namespace.clone(), slice.service.clone()))
        .collect()
}

/// The MCS names of a headless service's pods: for each `(cluster, address, hostname)` in
/// `pods` whose cluster and hostname are DNS-1123 labels, the name
/// `<hostname>.<cluster>.<name>.<namespace>.svc.clusterset.local` (the service's MCS name from
/// its origin `annotations`) answering with the addresses of that pair (one per family, or
/// several pods that share a hostname). None when the service has no valid origin pair. Each
/// name is a [`ServiceInfo`] keyed `<key.name>/<hostname>.<cluster>` in `key`'s namespace.
/// Shared by the kube feed ([`derive`], from the binder's slices) and the imports feed (from
/// the imported records' hostnames annotation).
pub fn pod_names<'a>(
    key: &ServiceKey,
    annotations: &NameAnnotations,
    pods: impl IntoIterator<Item = (&'a str, IpAddr, &'a str)>,
) -> Vec<ServiceInfo> {
    let origin = match (&annotations.origin_namespace, &annotations.origin_name) {
        (Some(ns), Some(name))
            if validate_namespace(ns).is_ok() && validate_namespace(name).is_ok() =>
        {
            clusterset_fqdn(name, ns)
        }
        _ => return Vec::new(),
    };
    let mut hosts: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for (cluster, ip, hostname) in pods {
        if validate_namespace(cluster).is_ok() && validate_namespace(hostname).is_ok() {
            hosts
                .entry(format!("{hostname}.{cluster}"))
                .or_default()
                .insert(ip);
        }
    }
    hosts
        .into_iter()
        .map(|(host, ips)| ServiceInfo {
            key: ServiceKey::new(key.namespace.clone(), format!("{}/{host}", key.name)),
            annotations: NameAnnotations {
                fqdn: Some(format!("{host}.{origin}").into()),
                ..NameAnnotations::default()
            },
            cluster_ips: ips.into_iter().collect(),
            ports: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
#[path = "headless_tests.rs"]
mod tests;
