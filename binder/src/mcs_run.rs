//! The binder's ServiceImport writer (MCS mode, [`crate::controller::Config::mcs`]): the I/O
//! half of [`crate::mcs`]. Watches the imported ServiceRecords and the binder's Services in its
//! namespace, this cluster's own exported ServiceRecords and its own ServiceImports everywhere; after any change it brings every
//! ServiceImport to what [`crate::mcs::desired`] says — spec and metadata, then status, each
//! with server-side apply and only when it differs — and its EndpointSlices in the same
//! namespace to what [`crate::mcs::import_slices`] says (owned by it; watched in every namespace
//! by [`crate::mcs::import_slice_selector`], written only when they differ), and deletes its own
//! ServiceImports and slices no import calls for any more (uid precondition: one re-created meanwhile by someone else
//! stays). A ServiceImport of the same name it did not make is reported and left alone, and
//! one in a namespace that does not exist here is skipped (the binder creates no namespaces
//! for imports). Failed passes are retried with doubling delays.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::time::Duration;
use xcc_controller::plumbing::{is_conflict as conflict, is_not_found as not_found};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use xcc_controller::backoff::Backoff;
use xcc_controller::watch;
use xcc_proto::crd::{BINDER_MANAGER, MANAGED_BY_LABEL, ServiceRecord};
use xcc_proto::mcs::ServiceImport;
use xcc_proto::names::IMPORTED_LABEL;

use crate::apply::FIELD_MANAGER;
use crate::mcs;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// ServiceImports whose spec or status was written, `namespace/name`.
    pub written: Vec<String>,
    /// ServiceImports deleted.
    pub deleted: Vec<String>,
    /// ServiceImports not written, with why (someone else's, namespace missing, no ports).
    pub skipped: Vec<String>,
    /// ServiceImports' EndpointSlices written, `namespace/name`.
    pub slices_written: Vec<String>,
    /// ServiceImports' EndpointSlices deleted.
    pub slices_deleted: Vec<String>,
}

/// One pass: bring the ServiceImports to what the stores say.
pub async fn sync(
    client: &Client,
    install: &str,
    records: &[Arc<ServiceRecord>],
    services: &[Arc<Service>],
    existing: &[Arc<ServiceImport>],
    existing_slices: &[Arc<EndpointSlice>],
) -> Result<Pass, kube::Error> {
    let records: Vec<&ServiceRecord> = records.iter().map(|r| r.as_ref()).collect();
    let services: BTreeMap<(String, String), &Service> = services
        .iter()
        .filter_map(|s| {
            Some((
                (s.metadata.namespace.clone()?, s.metadata.name.clone()?),
                s.as_ref(),
            ))
        })
        .collect();
    let (desired, skipped) = mcs::desired(&records, &services, install);
    let desired_slices = mcs::import_slices(&records, install);
    let known_slices: BTreeMap<(Option<&String>, Option<&String>), &EndpointSlice> =
        existing_slices
            .iter()
            .map(|e| {
                (
                    (e.metadata.namespace.as_ref(), e.metadata.name.as_ref()),
                    e.as_ref(),
                )
            })
            .collect();
    let mut pass = Pass {
        skipped: skipped
            .into_iter()
            .map(|s| format!("{}/{}: {}", s.origin.namespace, s.origin.name, s.reason))
            .collect(),
        ..Pass::default()
    };
    let ours: BTreeMap<(Option<&String>, Option<&String>), &ServiceImport> = existing
        .iter()
        .map(|e| {
            (
                (e.metadata.namespace.as_ref(), e.metadata.name.as_ref()),
                e.as_ref(),
            )
        })
        .collect();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for want in &desired {
        write_import(
            client,
            install,
            want,
            &ours,
            &desired_slices,
            &known_slices,
            &params,
            &mut pass,
        )
        .await?;
    }
    for old in mcs::stale_import_slices(
        existing_slices.iter().map(|e| e.as_ref()),
        &desired_slices,
        install,
    ) {
        if let Some(gone) = delete_if_same::<EndpointSlice>(client, &old.metadata).await? {
            pass.slices_deleted.push(gone);
        }
    }
    for old in mcs::stale(existing.iter().map(|e| e.as_ref()), &desired, install) {
        if let Some(gone) = delete_if_same::<ServiceImport>(client, &old.metadata).await? {
            pass.deleted.push(gone);
        }
    }
    Ok(pass)
}

/// Bring one ServiceImport to `want` (spec and metadata, then status, each only when it
/// differs) and its EndpointSlices to `desired_slices`; one of the name that is not this
/// binder's, or in a namespace that does not exist here, is skipped.
#[allow(clippy::too_many_arguments)]
async fn write_import(
    client: &Client,
    install: &str,
    want: &ServiceImport,
    ours: &BTreeMap<(Option<&String>, Option<&String>), &ServiceImport>,
    desired_slices: &BTreeMap<(String, String), Vec<EndpointSlice>>,
    known_slices: &BTreeMap<(Option<&String>, Option<&String>), &EndpointSlice>,
    params: &PatchParams,
    pass: &mut Pass,
) -> Result<(), kube::Error> {
    let (Some(ns), Some(name)) = (&want.metadata.namespace, &want.metadata.name) else {
        return Ok(());
    };
    let shown = format!("{ns}/{name}");
    let api: Api<ServiceImport> = Api::namespaced(client.clone(), ns);
    // The watch sees only the binder's own; anything else of the name is read first, so
    // a ServiceImport another implementation made is never taken over.
    let current = match ours.get(&(Some(ns), Some(name))) {
        Some(c) => Some((*c).clone()),
        None => api.get_opt(name).await?,
    };
    if !mcs::may_write(current.as_ref(), install) {
        pass.skipped.push(format!(
            "{shown}: exists and is not this binder's; left unchanged"
        ));
        return Ok(());
    }
    let (spec_differs, status_differs) = mcs::differs(current.as_ref(), want);
    // The stored ServiceImport, for its UID (its slices' owner).
    let mut stored = current.clone();
    if spec_differs {
        let body = json!({
            "apiVersion": ServiceImport::api_version(&()),
            "kind": ServiceImport::kind(&()),
            "metadata": {
                "name": name, "namespace": ns,
                "labels": want.metadata.labels, "annotations": want.metadata.annotations,
            },
            "spec": want.spec,
        });
        match api.patch(name, params, &Patch::Apply(&body)).await {
            Ok(written) => stored = Some(written),
            Err(e) if not_found(&e) => {
                pass.skipped
                    .push(format!("{shown}: namespace {ns} does not exist here"));
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
    if status_differs || spec_differs {
        let body = json!({
            "apiVersion": ServiceImport::api_version(&()),
            "kind": ServiceImport::kind(&()),
            "status": want.status,
        });
        api.patch_status(name, params, &Patch::Apply(&body)).await?;
    }
    if spec_differs || status_differs {
        pass.written.push(shown);
    }
    let Some(stored) = stored else {
        return Ok(());
    };
    for slice in desired_slices
        .get(&(ns.clone(), name.clone()))
        .into_iter()
        .flatten()
    {
        let Some(slice) = mcs::owned_by(slice.clone(), &stored) else {
            continue;
        };
        write_slice(client, install, slice, known_slices, params, pass).await?;
    }
    Ok(())
}

/// Delete the object `meta` names only if it is still that object (its UID): `Some("ns/name")`
/// when it was deleted now, `None` when it is gone already or the name is someone else's.
async fn delete_if_same<K>(
    client: &Client,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<Option<String>, kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
        return Ok(None);
    };
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match Api::<K>::namespaced(client.clone(), ns)
        .delete(name, &dp)
        .await
    {
        Ok(_) => Ok(Some(format!("{ns}/{name}"))),
        Err(e) if not_found(&e) || conflict(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Bring one of a ServiceImport's EndpointSlices to `want` (server-side apply), unless it is up
/// to date in `known` (the watch cache) or a slice of its name is someone else's.
async fn write_slice(
    client: &Client,
    install: &str,
    want: EndpointSlice,
    known: &BTreeMap<(Option<&String>, Option<&String>), &EndpointSlice>,
    params: &PatchParams,
    pass: &mut Pass,
) -> Result<(), kube::Error> {
    let (Some(ns), Some(name)) = (want.metadata.namespace.clone(), want.metadata.name.clone())
    else {
        return Ok(());
    };
    let shown = format!("{ns}/{name}");
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
    // The watch sees only the binder's own; anything else of the name is read first.
    let current = match known.get(&(Some(&ns), Some(&name))) {
        Some(c) => Some((*c).clone()),
        None => api.get_opt(&name).await?,
    };
    if let Some(current) = &current {
        if !mcs::is_our_import_slice(current, install) {
            pass.skipped.push(format!(
                "EndpointSlice {shown}: exists and is not this binder's; left unchanged"
            ));
            return Ok(());
        }
        if crate::apply::slice_up_to_date(current, &want) {
            return Ok(());
        }
    }
    let mut body = serde_json::to_value(&want).unwrap_or_default();
    if let Some(obj) = body.as_object_mut() {
        obj.insert("apiVersion".into(), json!(EndpointSlice::api_version(&())));
        obj.insert("kind".into(), json!(EndpointSlice::kind(&())));
    }
    api.patch(&name, params, &Patch::Apply(&body)).await?;
    pass.slices_written.push(shown);
    Ok(())
}

/// Feed a watch into its store ([`watch::follow`]) and wake `changed` on every event.
async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    changed: Arc<Notify>,
    stop: CancellationToken,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let what = format!("MCS {}", K::kind(&()));
    watch::follow(&what, watch::watch(api, config), writer, stop, |_| {
        changed.notify_one()
    })
    .await;
}

/// Run until `stop` fires: the binder in `namespace` keeps the ServiceImports of its imports.
pub async fn run(client: Client, namespace: String, stop: CancellationToken) {
    let (records, records_w) = reflector::store::<ServiceRecord>();
    let (local, local_w) = reflector::store::<ServiceRecord>();
    let (services, services_w) = reflector::store::<Service>();
    let (imports, imports_w) = reflector::store::<ServiceImport>();
    let (slices, slices_w) = reflector::store::<EndpointSlice>();
    let changed = Arc::new(Notify::new());
    let managed = format!("{MANAGED_BY_LABEL}={BINDER_MANAGER}");
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(follow(
        Api::<ServiceRecord>::namespaced(client.clone(), &namespace),
        watcher::Config::default().labels(IMPORTED_LABEL),
        records_w,
        changed.clone(),
        stop.clone(),
    ));
    // This cluster's own exports, in every namespace: the exporting cluster has the
    // ServiceImport too.
    tasks.spawn(follow(
        Api::<ServiceRecord>::all(client.clone()),
        watcher::Config::default().labels(&mcs::local_export_selector()),
        local_w,
        changed.clone(),
        stop.clone(),
    ));
    tasks.spawn(follow(
        Api::<Service>::namespaced(client.clone(), &namespace),
        watcher::Config::default().labels(&managed),
        services_w,
        changed.clone(),
        stop.clone(),
    ));
    tasks.spawn(follow(
        Api::<ServiceImport>::all(client.clone()),
        watcher::Config::default().labels(&managed),
        imports_w,
        changed.clone(),
        stop.clone(),
    ));
    tasks.spawn(follow(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default().labels(&mcs::import_slice_selector()),
        slices_w,
        changed.clone(),
        stop.clone(),
    ));
    let ready = async {
        records.wait_until_ready().await?;
        local.wait_until_ready().await?;
        services.wait_until_ready().await?;
        imports.wait_until_ready().await?;
        slices.wait_until_ready().await
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        r = ready => {
            if r.is_ok() {
                let stores = Stores { records, local, services, imports, slices };
                passes(&client, &namespace, &stores, &changed, &stop).await;
            }
        }
    }
    stop.cancel();
    while tasks.join_next().await.is_some() {}
}

/// Retries of a failed pass: 100 ms doubling to 5 minutes.
const RETRY: Backoff = Backoff {
    min: Duration::from_millis(100),
    max: Duration::from_secs(300),
};

/// The watch caches a pass reads.
struct Stores {
    records: Store<ServiceRecord>,
    local: Store<ServiceRecord>,
    services: Store<Service>,
    imports: Store<ServiceImport>,
    slices: Store<EndpointSlice>,
}

async fn passes(
    client: &Client,
    install: &str,
    stores: &Stores,
    changed: &Notify,
    stop: &CancellationToken,
) {
    let mut retries = RETRY.delays();
    loop {
        let mut records = stores.records.state();
        records.extend(
            stores
                .local
                .state()
                .into_iter()
                .filter(|r| mcs::is_local_mcs_export(r)),
        );
        match sync(
            client,
            install,
            &records,
            &stores.services.state(),
            &stores.imports.state(),
            &stores.slices.state(),
        )
        .await
        {
            Ok(pass) => {
                retries = RETRY.delays();
                if !pass.written.is_empty() || !pass.deleted.is_empty() {
                    tracing::info!(written = ?pass.written, deleted = ?pass.deleted, "ServiceImports updated");
                }
                if !pass.slices_written.is_empty() || !pass.slices_deleted.is_empty() {
                    tracing::info!(written = ?pass.slices_written, deleted = ?pass.slices_deleted, "ServiceImports' EndpointSlices updated");
                }
                for why in &pass.skipped {
                    tracing::debug!(%why, "ServiceImport not written");
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = changed.notified() => {}
                }
            }
            Err(e) => {
                let delay = retries.next_delay();
                tracing::warn!(error = %e, ?delay, "writing ServiceImports failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
