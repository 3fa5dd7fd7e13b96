//! [`KubeImportSink`]: a remote's imports as ServiceRecords in the registry's namespace.
//!
//! `persist` receives a remote's complete import set; it server-side applies the records that
//! are missing or differ, deletes this remote's records that are no longer imported, and returns
//! only after every write succeeded, so the client ACKs durable imports only. Deletions select
//! the imported and remote-registry labels AND the RemoteRegistry's UID: another
//! remote's imports, exported records and records of other owners are never touched. A record
//! of the wanted name that the registry does not own is reported, never taken over.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use anyhow::Context as _;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::{info, warn};
use xcc_proto::crd::ServiceRecord;

use super::metrics::{Kind, KubeMetrics, Target, WriteVerb};
use super::records::{self, Owner};
use crate::catalog::Endpoint;
use crate::hamlet::client::ImportSink;
use crate::hamlet::convert::Imported;
use crate::store::model::ImportedRecordError;
use xcc_controller::plumbing::{is_conflict as conflict, is_not_found as not_found};

/// Field manager of every registry write.
pub const FIELD_MANAGER: &str = "xcc-registry";

/// Imports of a remote that could not be written, as last seen by `persist`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rejections {
    /// Record names taken by records the registry does not own.
    pub conflicts: Vec<String>,
    /// (FQDN, reason) of imports without a valid record.
    pub invalid: Vec<(String, ImportedRecordError)>,
}

impl Rejections {
    /// One line for the RemoteRegistry status, `None` when nothing was rejected.
    pub fn summary(&self) -> Option<String> {
        let mut parts = vec![];
        if !self.conflicts.is_empty() {
            parts.push(format!(
                "not imported, the name is taken by a record the registry does not own: {}",
                self.conflicts.join(", ")
            ));
        }
        if !self.invalid.is_empty() {
            let list: Vec<String> = self
                .invalid
                .iter()
                .map(|(f, why)| format!("{f} ({why})"))
                .collect();
            parts.push(format!("not imported, invalid: {}", list.join(", ")));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The RemoteRegistries whose imports may be written (name → UID), kept by the controller; and
/// what was rejected per remote.
#[derive(Clone, Default)]
pub struct Owners {
    uids: Arc<RwLock<BTreeMap<String, String>>>,
    rejections: Arc<RwLock<BTreeMap<String, Rejections>>>,
}

impl Owners {
    pub fn get(&self, name: &str) -> Option<Owner> {
        let uids = xcc_controller::plumbing::read(&self.uids);
        uids.get(name).map(|uid| Owner {
            name: name.to_string(),
            uid: uid.clone(),
        })
    }
    pub fn set(&self, owner: &Owner) {
        let mut uids = xcc_controller::plumbing::write(&self.uids);
        uids.insert(owner.name.clone(), owner.uid.clone());
    }
    pub fn remove(&self, name: &str) {
        let mut uids = xcc_controller::plumbing::write(&self.uids);
        uids.remove(name);
        let mut rej = xcc_controller::plumbing::write(&self.rejections);
        rej.remove(name);
    }
    pub fn all(&self) -> BTreeMap<String, String> {
        xcc_controller::plumbing::read(&self.uids).clone()
    }
    pub fn rejections(&self, name: &str) -> Rejections {
        let rej = xcc_controller::plumbing::read(&self.rejections);
        rej.get(name).cloned().unwrap_or_default()
    }
    /// Record the rejections of a persist; returns whether they changed.
    fn set_rejections(&self, name: &str, r: Rejections) -> bool {
        let mut rej = xcc_controller::plumbing::write(&self.rejections);
        if rej.get(name).cloned().unwrap_or_default() == r {
            return false;
        }
        rej.insert(name.to_string(), r);
        true
    }
}

/// Writes imports as ServiceRecords in `namespace`.
pub struct KubeImportSink {
    client: Client,
    namespace: String,
    owners: Owners,
    recorder: Recorder,
    metrics: KubeMetrics,
    cache: Cache,
}

/// The ServiceRecords of the namespace by name, kept by a watch ([`KubeImportSink::run_cache`])
/// and by the sink's own writes, so a persist costs no list. An object is only replaced by one
/// with an equal or newer resourceVersion, so a late watch event never undoes a write.
#[derive(Clone)]
struct Cache {
    records: Arc<RwLock<BTreeMap<String, ServiceRecord>>>,
    ready: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            records: Arc::default(),
            ready: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}

fn rv(r: &ServiceRecord) -> Option<u64> {
    r.metadata.resource_version.as_deref()?.parse().ok()
}

impl Cache {
    fn store(&self, r: ServiceRecord) {
        let Some(name) = r.metadata.name.clone() else {
            return;
        };
        let mut m = xcc_controller::plumbing::write(&self.records);
        let older = m
            .get(&name)
            .is_some_and(|cur| matches!((rv(cur), rv(&r)), (Some(a), Some(b)) if b < a));
        if !older {
            m.insert(name, r);
        }
    }
    fn forget(&self, r: &ServiceRecord) {
        let Some(name) = r.metadata.name.as_deref() else {
            return;
        };
        let mut m = xcc_controller::plumbing::write(&self.records);
        let newer_present = m
            .get(name)
            .is_some_and(|cur| matches!((rv(cur), rv(r)), (Some(a), Some(b)) if a > b));
        if !newer_present {
            m.remove(name);
        }
    }
    fn forget_name(&self, name: &str) {
        let mut m = xcc_controller::plumbing::write(&self.records);
        m.remove(name);
    }
    fn replace(&self, all: BTreeMap<String, ServiceRecord>) {
        *xcc_controller::plumbing::write(&self.records) = all;
        self.ready.send_replace(true);
    }
}

/// Applies in flight at once while persisting a large import set.
const APPLY_CONCURRENCY: usize = 16;

impl KubeImportSink {
    pub fn new(
        client: Client,
        namespace: impl Into<String>,
        owners: Owners,
        metrics: KubeMetrics,
    ) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), FIELD_MANAGER.into()),
            client,
            namespace: namespace.into(),
            owners,
            metrics,
            cache: Cache::default(),
        }
    }

    /// Keep the cache of the namespace's ServiceRecords until `cancel`.
    pub async fn run_cache(
        &self,
        cancel: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<()> {
        use kube::runtime::watcher;
        use xcc_controller::watch::{Change, Follow};
        let what = format!("ServiceRecords of {}", self.namespace);
        let mut records = Follow::new(what, self.api(), watcher::Config::default());
        loop {
            let change = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                change = records.next() => change,
            };
            match change {
                None => anyhow::bail!("the ServiceRecord watch of {} ended", self.namespace),
                Some(Change::Listed(all)) => self.cache.replace(
                    all.into_iter()
                        .filter_map(|r| Some((r.metadata.name.clone()?, r)))
                        .collect(),
                ),
                Some(Change::Applied(r)) => self.cache.store(r),
                Some(Change::Deleted(r)) => self.cache.forget(&r),
            }
        }
    }

    /// A Warning Event on the RemoteRegistry; failing to write it fails nothing.
    pub(crate) async fn warn_event(&self, owner: &Owner, reason: &str, note: String) {
        let reference = ObjectReference {
            api_version: Some(xcc_proto::names::API_VERSION.to_string()),
            kind: Some(xcc_proto::names::REMOTE_REGISTRY_KIND.to_string()),
            name: Some(owner.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: Some(owner.uid.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_string(),
            note: Some(xcc_controller::event_note(note)),
            action: "Import".to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            warn!(remote = %owner.name, error = %e, "cannot write an Event");
        }
    }

    fn api(&self) -> Api<ServiceRecord> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The records of `owner` (its labels and UID).
    async fn owned(&self, owner: &Owner) -> anyhow::Result<Vec<ServiceRecord>> {
        let list = self
            .api()
            .list(&ListParams::default().labels(&records::imports_selector(&owner.name)))
            .await
            .with_context(|| {
                format!(
                    "listing the imported ServiceRecords of {} in {}",
                    owner.name, self.namespace
                )
            })?;
        Ok(list
            .items
            .into_iter()
            .filter(|r| records::deletable(r, owner))
            .collect())
    }

    /// The imports persisted for `owner` (start-up: what the client starts from).
    pub async fn load(&self, owner: &Owner) -> anyhow::Result<Vec<Imported>> {
        Ok(self
            .owned(owner)
            .await?
            .into_iter()
            .map(|r| Imported {
                // Read first: the fields below move out of the record.
                cluster: crate::store::model::imported_cluster(&r),
                ports: crate::store::model::stored_ports(&r),
                fqdn: r.spec.fqdn.clone(),
                raw_fqdn: r.spec.fqdn,
                endpoints: r
                    .spec
                    .endpoints
                    .into_iter()
                    .map(|e| Endpoint {
                        address: e.address.into(),
                        port: u32::try_from(e.port).unwrap_or(0),
                    })
                    .collect(),
                labels: r.metadata.annotations.unwrap_or_default(),
            })
            .collect())
    }

    /// Delete every record of `owner` (the RemoteRegistry was removed or became invalid).
    /// Returns how many were deleted.
    pub async fn forget(&self, owner: &Owner) -> anyhow::Result<usize> {
        let mut n = 0;
        for r in self.owned(owner).await? {
            let name = r.metadata.name.clone().unwrap_or_default();
            if self.delete(&name, r.metadata.uid.clone()).await? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Delete one record, only if it still is the object with `uid`. NotFound or a changed
    /// UID (409) means someone else got there first: nothing to do.
    async fn delete(&self, name: &str, uid: Option<String>) -> anyhow::Result<bool> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let res = self.api().delete(name, &params).await;
        if res.is_ok() || res.as_ref().is_err_and(not_found) {
            self.cache.forget_name(name);
        }
        match res {
            Ok(_) => {
                self.metrics.wrote(Kind::ServiceRecord, WriteVerb::Delete);
                Ok(true)
            }
            Err(e) if not_found(&e) || conflict(&e) => Ok(false),
            Err(e) => {
                Err(e).with_context(|| format!("deleting ServiceRecord {}/{name}", self.namespace))
            }
        }
    }

    /// Apply one record; with `check`, first make sure no record of that name appeared since
    /// the cache was read (one the registry does not own is a conflict: `Ok(Some(name))`).
    async fn apply_one(
        &self,
        api: &Api<ServiceRecord>,
        params: &PatchParams,
        record: &ServiceRecord,
        check: bool,
        remote: &str,
    ) -> anyhow::Result<Option<String>> {
        let name = record.metadata.name.clone().unwrap_or_default();
        if check {
            let found = api
                .get_opt(&name)
                .await
                .with_context(|| format!("reading ServiceRecord {}/{name}", self.namespace))?;
            if let Some(existing) = found {
                let foreign = !records::is_import_of(&existing, remote);
                self.cache.store(existing);
                if foreign {
                    return Ok(Some(name));
                }
            }
        }
        let body = serde_json::json!({
            "apiVersion": xcc_proto::names::API_VERSION,
            "kind": xcc_proto::names::SERVICE_RECORD_KIND,
            "metadata": &record.metadata,
            "spec": &record.spec,
        });
        let written = api
            .patch(&name, params, &Patch::Apply(&body))
            .await
            .with_context(|| format!("applying ServiceRecord {}/{name}", self.namespace))?;
        self.cache.store(written);
        self.metrics.wrote(Kind::ServiceRecord, WriteVerb::Apply);
        Ok(None)
    }

    async fn persist_all(
        &self,
        remote: &str,
        imports: &BTreeMap<String, Imported>,
    ) -> anyhow::Result<()> {
        let owner = self.owners.get(remote).with_context(|| {
            format!("RemoteRegistry {remote} is not known (yet); imports not written")
        })?;
        let api = self.api();
        // The namespace's records as of the first list (the watch keeps them current).
        let mut ready = self.cache.ready.subscribe();
        ready
            .wait_for(|r| *r)
            .await
            .context("the ServiceRecord cache stopped")?;
        let mut plan = {
            let current = xcc_controller::plumbing::read(&self.cache.records);
            records::plan(&owner, &self.namespace, imports, &current)
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let pending: Vec<_> = plan
            .apply
            .iter()
            .map(|record| {
                let check = record
                    .metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| plan.unseen.contains(n));
                self.apply_one(&api, &params, record, check, remote)
            })
            .collect();
        let applies = futures::stream::iter(pending)
            .buffer_unordered(APPLY_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        // Every apply ran to its end; any failure fails the persist (nothing is ACKed).
        for conflict in applies
            .into_iter()
            .collect::<anyhow::Result<Vec<Option<String>>>>()?
            .into_iter()
            .flatten()
        {
            plan.imported = plan.imported.saturating_sub(1);
            plan.conflicts.push(conflict);
        }
        plan.conflicts.sort();
        let mut removed = 0;
        for (name, uid) in &plan.delete {
            if self.delete(name, Some(uid.clone())).await? {
                removed += 1;
            }
        }
        if !plan.apply.is_empty() || removed > 0 {
            info!(
                remote,
                written = plan.apply.len(),
                removed,
                imported = plan.imported,
                "imported ServiceRecords updated"
            );
        }
        let rejections = Rejections {
            conflicts: plan.conflicts,
            invalid: plan.invalid,
        };
        if self.owners.set_rejections(remote, rejections.clone())
            && let Some(summary) = rejections.summary()
        {
            warn!(remote, "{summary}");
            let reason = if rejections.conflicts.is_empty() {
                "InvalidImport"
            } else {
                "ImportConflict"
            };
            self.warn_event(&owner, reason, summary).await;
        }
        Ok(())
    }
}

impl ImportSink for KubeImportSink {
    fn persist<'a>(
        &'a self,
        remote: &'a str,
        imports: &'a BTreeMap<String, Imported>,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        async move {
            let res = self.persist_all(remote, imports).await;
            self.metrics.reconciled(Target::Imports, res.is_ok());
            res
        }
        .boxed()
    }
}
