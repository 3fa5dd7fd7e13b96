//! Writing one source's desired record to the API server: the I/O half of a publisher
//! reconcile. Given what [`crate::desired`] computed for a source object, [`sync_source`]
//! server-side-applies the record under the [`FIELD_MANAGER`] field manager — only when the
//! fields the publisher owns differ, so an unchanged source costs no write — and deletes the
//! records the source owns but should no longer have (label removed, FQDN changed). A record
//! of the same name that the source does not own is reported, never touched.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use xcc_proto::crd::{MANAGED_BY_LABEL, PUBLISHER_MANAGER, ServiceRecord};
use xcc_proto::mcs::ServiceExport;
use xcc_proto::names::{EXPORT_LABEL, LABEL_PREFIX};

use crate::desired::{Desired, Skip, may_write, records_of_source, stale_records};
// A 409 on a delete with a uid precondition means the name now belongs to another object.
use xcc_controller::plumbing::{is_conflict as precondition_failed, is_not_found as not_found};

/// Field manager of every publisher write (server-side apply).
pub const FIELD_MANAGER: &str = "xcc-publisher";

/// A failed API call of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The API server refused or could not be reached.
    #[error("{action} {kind} {namespace}/{name}: {source}")]
    Kube {
        /// What was attempted (`list`, `get`, `apply`, `delete`).
        action: &'static str,
        /// The kind of object (`ServiceRecord`, `ServiceExport`).
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Record name (empty for a list).
        name: String,
        /// The client's error.
        source: kube::Error,
    },
}

/// What a sync did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The desired record's name and whether it was written (`false`: already up to date).
    pub published: Option<(String, bool)>,
    /// Why nothing is published, when nothing is.
    pub skipped: Option<Skip>,
    /// A record of the desired name exists and belongs to someone else; left alone.
    pub conflict: Option<String>,
    /// Records the source owned and no longer should, deleted (sorted).
    pub removed: Vec<String>,
}

/// Whether `current` already carries everything the publisher owns in `desired`: the spec,
/// every desired label, exactly the desired `connectivity.tanzu.vmware.com/` annotations (user
/// annotations under other prefixes are not ours), and the owner references.
pub fn up_to_date(current: &ServiceRecord, desired: &ServiceRecord) -> bool {
    let prefix = format!("{LABEL_PREFIX}/");
    let ours = |r: &ServiceRecord| -> Vec<(String, String)> {
        r.annotations()
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let labels_present = desired
        .labels()
        .iter()
        .all(|(k, v)| current.labels().get(k) == Some(v));
    let owners_present = desired
        .owner_references()
        .iter()
        .all(|o| current.owner_references().contains(o));
    current.spec == desired.spec
        && labels_present
        && ours(current) == ours(desired)
        && owners_present
}

fn kube_error(
    action: &'static str,
    namespace: &str,
    name: &str,
) -> impl FnOnce(kube::Error) -> SyncError {
    let (namespace, name) = (namespace.to_string(), name.to_string());
    move |source| SyncError::Kube {
        action,
        kind: "ServiceRecord",
        namespace,
        name,
        source,
    }
}

/// Delete the record `name` only if it is still the object with `uid`. True when it was deleted
/// now; false when it is already gone or the name belongs to another object.
async fn delete_if_same(
    api: &Api<ServiceRecord>,
    namespace: &str,
    name: &str,
    uid: Option<String>,
) -> Result<bool, SyncError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(e) if not_found(&e) || precondition_failed(&e) => Ok(false),
        Err(e) => Err(kube_error("delete", namespace, name)(e)),
    }
}

/// Bring the records of the source with uid `owner_uid` in `namespace` to `desired`.
/// Idempotent and level-triggered: call it on every change of the source, its nodes or its
/// records. NotFound on delete counts as done (the garbage collector may have been first).
/// Lists the publisher's records in the namespace to find stale ones; a controller with a
/// watch cache of them uses [`sync_source_known`] instead.
pub async fn sync_source(
    client: &Client,
    namespace: &str,
    owner_uid: &str,
    desired: &Desired,
) -> Result<Outcome, SyncError> {
    let api: Api<ServiceRecord> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{EXPORT_LABEL},{MANAGED_BY_LABEL}={PUBLISHER_MANAGER}");
    let records = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_error("list", namespace, ""))?;
    sync_source_known(client, namespace, owner_uid, desired, records.items.iter()).await
}

/// [`sync_source`] with the publisher's records in `namespace` given (from a watch cache), so
/// a reconcile costs no list: the cost of a namespace with many exported sources stays
/// constant per source. The desired record itself is still read from the API before it is
/// written (a record someone else created a moment ago is never taken over), and each stale
/// record is deleted with its uid as a precondition (a stale cache never removes a record
/// re-created under the same name); a stale record the cache does not show yet is removed
/// when its watch event re-triggers the owner.
pub async fn sync_source_known<'a>(
    client: &Client,
    namespace: &str,
    owner_uid: &str,
    desired: &Desired,
    known: impl IntoIterator<Item = &'a ServiceRecord>,
) -> Result<Outcome, SyncError> {
    let api: Api<ServiceRecord> = Api::namespaced(client.clone(), namespace);
    let mut outcome = Outcome {
        published: None,
        skipped: None,
        conflict: None,
        removed: Vec::new(),
    };
    let keep = desired.record().map(|r| r.name_any());
    let stale: Vec<(String, Option<String>)> = stale_records(owner_uid, keep.as_deref(), known)
        .into_iter()
        .map(|r| (r.name_any(), r.metadata.uid.clone()))
        .collect();
    match desired {
        Desired::Skip(skip) => outcome.skipped = Some(skip.clone()),
        Desired::Publish(record) => {
            let name = record.name_any();
            let current = api
                .get_opt(&name)
                .await
                .map_err(kube_error("get", namespace, &name))?;
            if !may_write(current.as_ref(), owner_uid) {
                outcome.conflict = Some(name.clone());
            } else if current.as_ref().is_some_and(|c| up_to_date(c, record)) {
                outcome.published = Some((name.clone(), false));
            } else {
                let params = PatchParams::apply(FIELD_MANAGER).force();
                api.patch(&name, &params, &Patch::Apply(record.as_ref()))
                    .await
                    .map_err(kube_error("apply", namespace, &name))?;
                outcome.published = Some((name.clone(), true));
            }
        }
    }
    for (name, uid) in stale {
        if delete_if_same(&api, namespace, &name, uid).await? {
            outcome.removed.push(name);
        }
    }
    Ok(outcome)
}

/// Server-side apply `conditions` to the status of the ServiceExport `namespace/name` under
/// [`FIELD_MANAGER`]: the conditions of other types, owned by other managers, stay.
pub async fn write_export_status(
    client: &Client,
    namespace: &str,
    name: &str,
    conditions: &[Condition],
) -> Result<(), SyncError> {
    let api: Api<ServiceExport> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({
        "apiVersion": ServiceExport::api_version(&()),
        "kind": ServiceExport::kind(&()),
        "status": {"conditions": conditions},
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|source| SyncError::Kube {
        action: "apply status of",
        kind: "ServiceExport",
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    })?;
    Ok(())
}

/// Records removed for a source that is gone or no longer exported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removal {
    /// Names of the records deleted (sorted).
    pub removed: Vec<String>,
    /// The uid the source had, from the removed records' owner reference (for the Event).
    pub owner_uid: Option<String>,
}

/// Delete every record in `namespace` the publisher made for the source `api_version`/`kind`
/// named `name`, whatever its uid: call it when that source is no longer in the set of
/// exported objects (deleted, or its export label removed). Each delete carries the record's
/// uid as a precondition, so a record re-created under the same name by someone else in the
/// meantime is never removed; NotFound counts as done (the garbage collector was first).
pub async fn remove_source_records(
    client: &Client,
    namespace: &str,
    api_version: &str,
    kind: &str,
    name: &str,
) -> Result<Removal, SyncError> {
    let api: Api<ServiceRecord> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{EXPORT_LABEL},{MANAGED_BY_LABEL}={PUBLISHER_MANAGER}");
    let records = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_error("list", namespace, ""))?;
    remove_source_records_known(
        client,
        namespace,
        api_version,
        kind,
        name,
        records.items.iter(),
    )
    .await
}

/// [`remove_source_records`] with the publisher's records in `namespace` given (from a watch
/// cache): no list per reconcile.
pub async fn remove_source_records_known<'a>(
    client: &Client,
    namespace: &str,
    api_version: &str,
    kind: &str,
    name: &str,
    known: impl IntoIterator<Item = &'a ServiceRecord>,
) -> Result<Removal, SyncError> {
    let api: Api<ServiceRecord> = Api::namespaced(client.clone(), namespace);
    let mut removal = Removal::default();
    let found: Vec<(String, Option<String>, Option<String>)> =
        records_of_source(api_version, kind, name, known)
            .into_iter()
            .map(|record| {
                let owner = record
                    .owner_references()
                    .iter()
                    .find(|o| o.controller == Some(true))
                    .map(|o| o.uid.clone());
                (record.name_any(), record.metadata.uid.clone(), owner)
            })
            .collect();
    for (record_name, uid, owner) in found {
        if delete_if_same(&api, namespace, &record_name, uid).await? {
            removal.removed.push(record_name);
        }
        if removal.owner_uid.is_none() {
            removal.owner_uid = owner;
        }
    }
    Ok(removal)
}
