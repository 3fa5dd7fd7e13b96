//! Writing one FQDN group's objects to the API server: the I/O half of a binder reconcile.
//!
//! [`sync_group`] server-side-applies the Service, its load-balancer status (the VIP), the
//! EndpointSlices and the legacy Endpoints computed by [`crate::desired::materialize`] under the
//! [`FIELD_MANAGER`] field manager, and deletes the binder's EndpointSlices the group no longer
//! needs. Each object is first compared with what is stored on **the fields the binder owns only**
//! — defaults a real API server adds (target ports, cluster IPs, protocols, session affinity, ...)
//! are not ours and are ignored — so a reconcile of an unchanged group sends no write at all (XCC
//! v1 rewrote both objects every 30 s, as defaults never compared equal). Objects of the same name
//! the binder does not manage are never taken over.
//!
//! [`sync_global_service`] does the same for a Cilium global Service, and
//! [`delete_exact`] removes an object only while it is still the one the binder saw.

use std::collections::BTreeMap;

use futures::TryFutureExt as _;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;
use xcc_controller::plumbing::{is_conflict, is_not_found};
use xcc_proto::crd::{
    BINDER_MANAGER, ENDPOINTSLICE_MANAGED_BY_LABEL, ENDPOINTSLICE_SERVICE_NAME_LABEL,
    MANAGED_BY_LABEL,
};

use crate::desired::{Materialized, stale_slices};

/// Field manager of every binder write (server-side apply).
pub const FIELD_MANAGER: &str = "xcc-binder";

/// A failed API call of a reconcile.
#[derive(Debug, thiserror::Error)]
#[error("{action} {kind} {namespace}/{name}: {source}")]
pub struct SyncError {
    /// What was attempted.
    pub action: &'static str,
    /// Kind of the object.
    pub kind: &'static str,
    /// Namespace.
    pub namespace: String,
    /// Object name.
    pub name: String,
    /// The client's error.
    #[source]
    pub source: kube::Error,
}

/// Why a sync did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// An API call failed (retry with backoff).
    #[error(transparent)]
    Api(#[from] SyncError),
    /// An object of the name the binder would write exists and is not the binder's: it is
    /// left alone (never taken over), and nothing of the group is written.
    #[error("{kind} {namespace}/{name} exists and is not managed by {BINDER_MANAGER}; left alone")]
    NotManaged {
        /// Kind of the object.
        kind: &'static str,
        /// Namespace (empty for cluster-scoped objects).
        namespace: String,
        /// Name.
        name: String,
    },
}

/// What a sync wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Objects applied, as `Kind/name`, in write order.
    pub applied: Vec<String>,
    /// Of those, the ones that did not exist before, as `Kind/name`.
    pub created: Vec<String>,
    /// EndpointSlices deleted.
    pub deleted: Vec<String>,
}

fn label_is(meta: &ObjectMeta, key: &str, value: &str) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .is_some_and(|v| v == value)
}

/// Whether an object carries the binder's `app.kubernetes.io/managed-by` label.
pub fn managed(meta: &ObjectMeta) -> bool {
    label_is(meta, MANAGED_BY_LABEL, BINDER_MANAGER)
}

/// Whether an EndpointSlice is the binder's slice of the Service `service_name` (both labels).
fn slice_of(slice: &EndpointSlice, service_name: &str) -> bool {
    label_is(
        &slice.metadata,
        ENDPOINTSLICE_MANAGED_BY_LABEL,
        BINDER_MANAGER,
    ) && label_is(
        &slice.metadata,
        ENDPOINTSLICE_SERVICE_NAME_LABEL,
        service_name,
    )
}

fn not_managed(kind: &'static str, namespace: &str, name: &str) -> ApplyError {
    ApplyError::NotManaged {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

fn sorted_owners(meta: &ObjectMeta) -> Vec<(String, String, String, String)> {
    let mut owners: Vec<_> = meta
        .owner_references
        .iter()
        .flatten()
        .map(|o: &OwnerReference| {
            (
                o.uid.clone(),
                o.api_version.clone(),
                o.kind.clone(),
                o.name.clone(),
            )
        })
        .collect();
    owners.sort();
    owners
}

/// Desired labels and annotations present with the same values, and exactly the desired
/// owners.
fn meta_up_to_date(current: &ObjectMeta, desired: &ObjectMeta) -> bool {
    let contains = |have: &Option<BTreeMap<String, String>>,
                    want: &Option<BTreeMap<String, String>>| {
        want.iter()
            .flatten()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    contains(&current.labels, &desired.labels)
        && contains(&current.annotations, &desired.annotations)
        && sorted_owners(current) == sorted_owners(desired)
}

fn protocol(p: &Option<String>) -> &str {
    p.as_deref().unwrap_or("TCP")
}

fn name(n: &Option<String>) -> &str {
    n.as_deref().unwrap_or("")
}

fn type_of(spec: Option<&ServiceSpec>) -> &str {
    spec.and_then(|s| s.type_.as_deref()).unwrap_or("ClusterIP")
}

/// Whether a Service is headless (`clusterIP: None`).
fn headless(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// Whether the stored Service matches the desired one on the binder's fields: metadata, type,
/// headless or not, and load-balancer class, no selector, each port's name, number and
/// protocol, and the `ClientIP` session affinity's timeout.
pub fn service_up_to_date(current: &Service, desired: &Service) -> bool {
    let ports = service_ports;
    let spec = current.spec.as_ref();
    meta_up_to_date(&current.metadata, &desired.metadata)
        && type_of(spec) == type_of(desired.spec.as_ref())
        && headless(current) == headless(desired)
        && spec.and_then(|s| s.load_balancer_class.as_ref())
            == desired
                .spec
                .as_ref()
                .and_then(|s| s.load_balancer_class.as_ref())
        && spec
            .and_then(|s| s.selector.as_ref())
            .is_none_or(|s| s.is_empty())
        && ports(current) == ports(desired)
        && affinity(current) == affinity(desired)
}

/// A Service's `ClientIP` affinity timeout (`None`: no affinity), as the binder sets it.
fn affinity(service: &Service) -> Option<i32> {
    let spec = service.spec.as_ref()?;
    if spec.session_affinity.as_deref() != Some("ClientIP") {
        return None;
    }
    spec.session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds)
}

fn ingress_ips(service: &Service) -> Vec<String> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .collect()
}

/// Whether the stored EndpointSlice matches the desired one on the binder's fields.
pub fn slice_up_to_date(current: &EndpointSlice, desired: &EndpointSlice) -> bool {
    let endpoints = |s: &EndpointSlice| -> Vec<(Vec<String>, bool, Option<String>)> {
        s.endpoints
            .iter()
            .map(|e| {
                let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                (e.addresses.clone(), ready, e.hostname.clone())
            })
            .collect()
    };
    let ports = |s: &EndpointSlice| -> Vec<(String, Option<i32>, String)> {
        s.ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    name(&p.name).to_string(),
                    p.port,
                    protocol(&p.protocol).to_string(),
                )
            })
            .collect()
    };
    meta_up_to_date(&current.metadata, &desired.metadata)
        && current.address_type == desired.address_type
        && endpoints(current) == endpoints(desired)
        && ports(current) == ports(desired)
}

/// Whether the stored Endpoints match the desired ones on the binder's fields.
pub fn endpoints_up_to_date(current: &Endpoints, desired: &Endpoints) -> bool {
    type Subset = (Vec<String>, Vec<(String, i32, String)>);
    let subsets = |e: &Endpoints| -> Vec<Subset> {
        e.subsets
            .iter()
            .flatten()
            .map(|s| {
                (
                    s.addresses.iter().flatten().map(|a| a.ip.clone()).collect(),
                    s.ports
                        .iter()
                        .flatten()
                        .map(|p| {
                            (
                                name(&p.name).to_string(),
                                p.port,
                                protocol(&p.protocol).to_string(),
                            )
                        })
                        .collect(),
                )
            })
            .collect()
    };
    meta_up_to_date(&current.metadata, &desired.metadata) && subsets(current) == subsets(desired)
}

fn error<'a>(
    action: &'static str,
    kind: &'static str,
    ns: &'a str,
    name: &'a str,
) -> impl FnOnce(kube::Error) -> SyncError + 'a {
    move |source| SyncError {
        action,
        kind,
        namespace: ns.to_string(),
        name: name.to_string(),
        source,
    }
}

/// Apply `m` in `namespace`, writing only what differs on the binder's fields, and delete the
/// binder's EndpointSlices of this Service that `m` no longer has.
///
/// A Service, Endpoints or EndpointSlice of the same name that the binder does not manage is
/// never taken over: every object of the group is read and checked before anything is written,
/// so the sync stops with [`ApplyError::NotManaged`] without a write. The objects are then
/// written concurrently (their owners are the records, not one another), except that a Service
/// being created is written before its EndpointSlices and Endpoints (for kube-proxy, see
/// there), so a new group costs one round trip more than a changed one, rather than one per
/// object. Lists the Service's EndpointSlices to find stale ones; a controller with a watch
/// cache of them uses [`sync_group_known`] instead.
pub async fn sync_group(
    client: &Client,
    namespace: &str,
    m: &Materialized,
) -> Result<Written, ApplyError> {
    let service_name = m.service.name_any();
    let selector = format!(
        "{ENDPOINTSLICE_SERVICE_NAME_LABEL}={service_name},{ENDPOINTSLICE_MANAGED_BY_LABEL}={BINDER_MANAGER}"
    );
    let existing = Api::<EndpointSlice>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(error("list", "EndpointSlice", namespace, &service_name))?;
    sync_group_known(client, namespace, m, existing.items.iter()).await
}

/// [`sync_group`] with the binder's EndpointSlices in `namespace` given (from a watch cache),
/// so a reconcile costs no list: on a real API server a list is a consistent read that waits
/// for the watch cache to catch up with etcd, tens of milliseconds where a get by name takes
/// one or two. Each desired object is still read by name before it is written (the cache may
/// not hold a slice written a moment ago, and one someone else created is never taken over);
/// only the stale slices come from `known`: one the cache does not show yet is deleted when
/// its watch event reconciles the group again.
pub async fn sync_group_known<'a>(
    client: &Client,
    namespace: &str,
    m: &Materialized,
    known: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Result<Written, ApplyError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let service_name = m.service.name_any();
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), namespace);

    let (service, stored_slices, stored_endpoints) =
        read_group(&services, &slices, &endpoints, namespace, m).await?;

    // A Service that does not exist yet (or is made again, see below) is written before its
    // EndpointSlices, so that the node's kube-proxy hears of the Service first. A sync of it
    // before the slices' gives the cluster IP a REJECT rule: a connection made then has its SYN
    // rejected, and TCP's retransmission a second later goes through. Written together, the
    // slice's watch event may start a sync that cannot program the Service, and the next one
    // can be held back by kube-proxy's minSyncPeriod (1 s by default): a connection made then
    // leaves the node with the cluster IP unrewritten, and conntrack sends every retransmission
    // of it the same way, until the client gives up (docs/benchmarks.md, "Real nodes"). xcc
    // dns answers only once the slices exist.
    let service_first = service
        .as_ref()
        .is_none_or(|c| headless(c) != headless(&m.service));
    // Otherwise the objects do not depend on one another (the owners are the records): written
    // at once.
    let service_writes = write_service(&services, &params, namespace, m, service);
    let (slices, params) = (&slices, &params);
    let slice_writes = futures::future::try_join_all(m.slices.iter().zip(&stored_slices).map(
        |(slice, stored)| async move {
            let slice_name = slice.name_any();
            if stored.as_ref().is_some_and(|s| slice_up_to_date(s, slice)) {
                return Ok(None);
            }
            slices
                .patch(&slice_name, params, &Patch::Apply(slice))
                .await
                .map_err(error("apply", "EndpointSlice", namespace, &slice_name))?;
            Ok::<_, SyncError>(Some((slice_name, stored.is_some())))
        },
    ));
    let endpoints_write = async {
        if stored_endpoints
            .as_ref()
            .is_some_and(|c| endpoints_up_to_date(c, &m.endpoints))
        {
            return Ok(false);
        }
        endpoints
            .patch(&service_name, params, &Patch::Apply(&m.endpoints))
            .await
            .map_err(error("apply", "Endpoints", namespace, &service_name))?;
        Ok::<_, SyncError>(true)
    };
    let ((service_applied, service_existed), slices_applied, endpoints_applied) = if service_first {
        let service = service_writes.await?;
        let (slices, endpoints) = futures::try_join!(slice_writes, endpoints_write)?;
        (service, slices, endpoints)
    } else {
        futures::try_join!(service_writes, slice_writes, endpoints_write)?
    };

    // Reported in a fixed order: Service, EndpointSlices, Endpoints.
    let mut written = Written::default();
    if !service_existed && !service_applied.is_empty() {
        written.created.push(format!("Service/{service_name}"));
    }
    written.applied = service_applied;
    for (slice_name, existed) in slices_applied.into_iter().flatten() {
        written.applied.push(format!("EndpointSlice/{slice_name}"));
        if !existed {
            written.created.push(format!("EndpointSlice/{slice_name}"));
        }
    }
    for stale in stale_slices(&service_name, &m.slices, known) {
        match slices.delete(&stale, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(error("delete", "EndpointSlice", namespace, &stale)(e).into()),
        }
        written.deleted.push(stale);
    }
    if endpoints_applied {
        written.applied.push(format!("Endpoints/{service_name}"));
        if stored_endpoints.is_none() {
            written.created.push(format!("Endpoints/{service_name}"));
        }
    }
    Ok(written)
}

/// A group's objects as stored: its Service, each desired EndpointSlice, its Endpoints.
type Stored = (
    Option<Service>,
    Vec<Option<EndpointSlice>>,
    Option<Endpoints>,
);

/// The group's objects as stored (Service, each desired EndpointSlice, Endpoints), read at once;
/// [`ApplyError::NotManaged`] when any of them is someone else's.
async fn read_group(
    services: &Api<Service>,
    slices: &Api<EndpointSlice>,
    endpoints: &Api<Endpoints>,
    namespace: &str,
    m: &Materialized,
) -> Result<Stored, ApplyError> {
    let service_name = m.service.name_any();
    // Every object of the group is read at once, and checked before anything is written.
    let (service, stored_slices, stored_endpoints) = futures::try_join!(
        services
            .get_opt(&service_name)
            .map_err(error("get", "Service", namespace, &service_name)),
        futures::future::try_join_all(m.slices.iter().map(|slice| {
            let slice_name = slice.name_any();
            async move {
                slices.get_opt(&slice_name).await.map_err(error(
                    "get",
                    "EndpointSlice",
                    namespace,
                    &slice_name,
                ))
            }
        })),
        endpoints.get_opt(&service_name).map_err(error(
            "get",
            "Endpoints",
            namespace,
            &service_name
        )),
    )?;
    if service.as_ref().is_some_and(|c| !managed(&c.metadata)) {
        return Err(not_managed("Service", namespace, &service_name));
    }
    for (slice, stored) in m.slices.iter().zip(&stored_slices) {
        // A slice of this name without the binder's labels: someone else's.
        if stored.as_ref().is_some_and(|s| !slice_of(s, &service_name)) {
            return Err(not_managed("EndpointSlice", namespace, &slice.name_any()));
        }
    }
    if stored_endpoints
        .as_ref()
        .is_some_and(|c| !managed(&c.metadata))
    {
        return Err(not_managed("Endpoints", namespace, &service_name));
    }

    Ok((service, stored_slices, stored_endpoints))
}

/// Bring the group's Service to `m` (`service`: as stored): applied unless up to date, made
/// again when it turns headless or back, its ports taken back from other managers, and its
/// load-balancer status set to the VIP. What was written, and whether the Service existed.
async fn write_service(
    services: &Api<Service>,
    params: &PatchParams,
    namespace: &str,
    m: &Materialized,
    service: Option<Service>,
) -> Result<(Vec<String>, bool), SyncError> {
    let service_name = m.service.name_any();
    let mut applied = vec![];
    let existed = service.is_some();
    let current = match service {
        Some(c) if service_up_to_date(&c, &m.service) => c,
        _ => {
            // A cluster IP cannot be added to or taken from a Service: one that turns
            // headless or back (its export changed type) is made again.
            let service = match service {
                Some(c) if headless(&c) != headless(&m.service) => {
                    let uid = c.metadata.uid.clone().unwrap_or_default();
                    delete_exact(services, "Service", namespace, &service_name, &uid).await?;
                    applied.push(format!("Service/{service_name} (deleted: type changed)"));
                    None
                }
                other => other,
            };
            if let Some(c) = &service {
                let mut taken = Written::default();
                take_back_ports(services, c, &m.service, &mut taken).await?;
                applied.extend(taken.applied);
            }
            let stored = services
                .patch(&service_name, params, &Patch::Apply(&m.service))
                .await
                .map_err(error("apply", "Service", namespace, &service_name))?;
            applied.push(format!("Service/{service_name}"));
            stored
        }
    };
    let want_ips: Vec<String> = m.vip.iter().cloned().collect();
    if ingress_ips(&current) != want_ips {
        let ingress: Vec<_> = want_ips.iter().map(|ip| json!({"ip": ip})).collect();
        let status = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": service_name},
            "status": {"loadBalancer": {"ingress": ingress}},
        });
        services
            .patch_status(&service_name, params, &Patch::Apply(&status))
            .await
            .map_err(error("apply status", "Service", namespace, &service_name))?;
        applied.push(format!("Service/{service_name}/status"));
    }
    Ok((applied, existed))
}

/// Apply a Cilium global Service (from [`crate::desired::cilium::global_service`]):
/// its namespace is created when missing (labelled as managed; an existing namespace is never
/// touched), a Service of that name the binder of `install` did not make (another install's
/// global Service included) is left alone ([`ApplyError::NotManaged`]), and the Service is
/// applied only when the binder's fields differ.
pub async fn sync_global_service(
    client: &Client,
    desired: &Service,
    install: &str,
) -> Result<Written, ApplyError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut written = Written::default();
    let namespace = desired.namespace().unwrap_or_default();
    let name = desired.name_any();

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns =
        namespaces
            .get_opt(&namespace)
            .await
            .map_err(error("get", "Namespace", "", &namespace))?;
    if ns.is_none() {
        let post = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match namespaces
            .create(&post, &crate::desired::cilium::namespace(&namespace))
            .await
        {
            Ok(_) => {
                written.applied.push(format!("Namespace/{namespace}"));
                written.created.push(format!("Namespace/{namespace}"));
            }
            // Made by someone else in the meantime: fine, it exists.
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(error("create", "Namespace", "", &namespace)(e).into()),
        }
    }

    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let current = services
        .get_opt(&name)
        .await
        .map_err(error("get", "Service", &namespace, &name))?;
    match &current {
        Some(c) if !crate::desired::cilium::may_write(Some(c), install) => {
            return Err(not_managed("Service", &namespace, &name));
        }
        Some(c) if service_up_to_date(c, desired) => {}
        _ => {
            if let Some(c) = &current {
                take_back_ports(&services, c, desired, &mut written).await?;
            }
            services
                .patch(&name, &params, &Patch::Apply(desired))
                .await
                .map_err(error("apply", "Service", &namespace, &name))?;
            written.applied.push(format!("Service/{name}"));
            if current.is_none() {
                written.created.push(format!("Service/{name}"));
            }
        }
    }
    Ok(written)
}

fn service_ports(s: &Service) -> Vec<(String, i32, String)> {
    s.spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| {
            (
                name(&p.name).to_string(),
                p.port,
                protocol(&p.protocol).to_string(),
            )
        })
        .collect()
}

/// Server-side apply cannot remove what another field manager owns: a port someone added to
/// the Service by hand (ports are a map keyed by port and protocol) would survive the apply, and
/// merged with ours make an invalid Service (several unnamed ports); a selector someone set
/// would stay. When the stored ports or selector differ from the binder's, they are first
/// replaced with a merge patch (lists are replaced whole), then the apply takes them over.
async fn take_back_ports(
    services: &Api<Service>,
    current: &Service,
    desired: &Service,
    written: &mut Written,
) -> Result<(), SyncError> {
    let selector = current
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .is_some_and(|s| !s.is_empty());
    if !selector && service_ports(current) == service_ports(desired) {
        return Ok(());
    }
    let name = current.name_any();
    let namespace = current.namespace().unwrap_or_default();
    let ports = desired.spec.as_ref().and_then(|s| s.ports.clone());
    let patch = json!({"spec": {"ports": ports, "selector": null}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    services
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(error("patch ports of", "Service", &namespace, &name))?;
    written.applied.push(format!("Service/{name}"));
    Ok(())
}

/// Delete `kind` `namespace/name` if it is still the object with `uid` (a delete precondition,
/// so an object recreated by someone else under the same name is never removed). Returns
/// whether this call deleted it: `false` when it was already gone or is another object now.
pub async fn delete_exact<K>(
    api: &Api<K>,
    kind: &'static str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<bool, SyncError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(false),
        Err(e) => Err(error("delete", kind, namespace, name)(e)),
    }
}
