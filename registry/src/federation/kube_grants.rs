//! [`KubeGrants`]: the owner's side of a grant in `--store kube` (`--grant-mode istio|gateway|cilium`).
//!
//! When a caller is granted one of this cluster's services, the grant objects of
//! [`super::grants::objects`] are server-side applied (field manager [`FIELD_MANAGER`]) in the
//! service's namespace, labelled `app.kubernetes.io/managed-by: xcc-registry`, and the caller is
//! recorded in `status.grants` of the exported ServiceRecord the grant is about (exports are
//! catalog entries keyed by the record's namespace and name, so the route's target namespace and
//! service name the record). A revoked grant deletes the objects — only those carrying our
//! managed-by label, and only the object that was read (UID precondition) — and drops the
//! caller from the status.
//!
//! [`GrantSink`] is synchronous, so `apply` and `remove` only record what is wanted for the
//! grant and wake a background task ([`KubeGrants::spawn`]); `apply` returns the deterministic
//! object references at once. The task is level-triggered: per grant it keeps the latest wish
//! (present or absent) with a generation, so an apply followed by a remove of the same grant
//! always ends removed, whatever was in flight. Failures (an API server error, a resource type
//! that is not served because Istio or the Gateway API is not installed, an object of the same
//! name that we do not own) are logged, counted and retried with exponential backoff; nothing
//! here panics on input. Writes happen only when what we own differs: an unchanged grant costs
//! reads, never a write.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    Preconditions,
};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Client, Resource as _};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use xcc_proto::crd::{Grant, ServiceRecord};
use xcc_proto::names::{EXPORT_LABEL, IMPORTED_LABEL};

use super::grants::{
    GrantConfig, GrantError, GrantSink, MANAGED_BY_LABEL, check_route, object_keys, object_ref,
    objects,
};
use super::types::OwnerRoute;

/// Why one step of writing a grant in kube mode failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeGrantError {
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error("no resource known for kind {0:?}")]
    UnknownKind(String),
    #[error("{0} without an apiVersion")]
    NoApiVersion(String),
    /// `what` is the object's reference (`Kind/namespace/name`, or `ServiceRecord ns/name`).
    #[error("reading {what}: {source}")]
    Read { what: String, source: kube::Error },
    #[error(
        "resource {}.{} ({}) is not served — is its CRD installed? ({source})",
        resource.plural, resource.group, resource.api_version
    )]
    NotServed {
        resource: Box<ApiResource>,
        source: kube::Error,
    },
    #[error("{reference} exists and is not managed by {MANAGER}; left alone")]
    NotOurs { reference: String },
    #[error("applying {reference}: {source}")]
    Apply {
        reference: String,
        source: kube::Error,
    },
    #[error("deleting {reference}: {source}")]
    Delete {
        reference: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("writing the status of {what}: {source}")]
    WriteStatus { what: String, source: kube::Error },
}

/// Field manager of every grant write.
pub const FIELD_MANAGER: &str = "xcc-registry";
/// Value of `app.kubernetes.io/managed-by` on grant objects written in kube mode.
pub const MANAGER: &str = "xcc-registry";

/// The plural (resource name) of a grant object's kind.
pub fn plural_of(kind: &str) -> Option<&'static str> {
    match kind {
        "AuthorizationPolicy" => Some("authorizationpolicies"),
        "HTTPRoute" => Some("httproutes"),
        "CiliumNetworkPolicy" => Some("ciliumnetworkpolicies"),
        _ => None,
    }
}

/// The API resource of a grant object (from its `apiVersion` and `kind`).
pub fn api_resource(object: &Value) -> Result<ApiResource, KubeGrantError> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let plural = plural_of(kind).ok_or_else(|| KubeGrantError::UnknownKind(kind.into()))?;
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    if version.is_empty() {
        return Err(KubeGrantError::NoApiVersion(kind.into()));
    }
    Ok(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        plural,
    ))
}

/// The objects of `route` as written in kube mode: [`objects`] with our managed-by value.
pub fn desired_objects(config: &GrantConfig, route: &OwnerRoute) -> Result<Vec<Value>, GrantError> {
    Ok(objects(config, route)?
        .into_iter()
        .map(|mut o| {
            o["metadata"]["labels"][MANAGED_BY_LABEL] = Value::String(MANAGER.to_string());
            o
        })
        .collect())
}

/// Whether an object carries our managed-by label (the only objects we change or delete).
pub fn is_ours(object: &Value) -> bool {
    object["metadata"]["labels"][MANAGED_BY_LABEL].as_str() == Some(MANAGER)
}

/// Whether `current` already holds everything we own in `desired`: the spec, and every desired
/// label and annotation (others' labels and annotations are not ours to compare).
pub fn up_to_date(current: &Value, desired: &Value) -> bool {
    let subset = |field: &str| {
        desired["metadata"][field].as_object().is_none_or(|want| {
            want.iter()
                .all(|(k, v)| current["metadata"][field].get(k) == Some(v))
        })
    };
    current["spec"] == desired["spec"] && subset("labels") && subset("annotations")
}

/// A `Time` at the second precision the API stores.
fn k8s_time(t: SystemTime) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let secs = i64::try_from(secs).unwrap_or_default();
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default(),
    )
}

fn caller_service(route: &OwnerRoute) -> Option<String> {
    (!route.caller_service.is_empty()).then(|| route.caller_service.clone())
}

/// `current` with the caller of `route` added (`present`) or removed; `None` when unchanged.
/// An existing entry keeps its `since`. The result is sorted by caller.
pub fn merged_grants(current: &[Grant], route: &OwnerRoute, present: bool) -> Option<Vec<Grant>> {
    let service = caller_service(route);
    let is_this =
        |g: &Grant| g.caller_cluster == route.caller_cluster && g.caller_service == service;
    let has = current.iter().any(is_this);
    if has == present {
        return None;
    }
    let mut out: Vec<Grant> = current.iter().filter(|g| !is_this(g)).cloned().collect();
    if present {
        out.push(Grant {
            caller_cluster: route.caller_cluster.clone(),
            caller_service: service,
            since: k8s_time(route.since),
        });
    }
    out.sort_by(|a, b| {
        (&a.caller_cluster, &a.caller_service).cmp(&(&b.caller_cluster, &b.caller_service))
    });
    Some(out)
}

/// Retry settings of failed grant writes ([`Backoff::delays`]).
pub use xcc_controller::backoff::Backoff;
use xcc_controller::backoff::Delays;

/// The retry settings of [`KubeGrants::spawn`].
pub const DEFAULT_BACKOFF: Backoff = Backoff {
    min: Duration::from_millis(500),
    max: Duration::from_secs(60),
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: String,
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// Metrics of the grant writer (`xcc_grant_*`).
#[derive(Clone, Default)]
pub struct GrantMetrics {
    /// API writes that were sent, by kind (`AuthorizationPolicy`, ..., `ServiceRecord`) and verb
    /// (`apply`, `delete`, `status`).
    pub writes: Family<WriteLabels, Counter>,
    /// Failed attempts, by kind.
    pub errors: Family<KindLabels, Counter>,
    /// Grants whose latest change is not yet applied.
    pub pending: Gauge,
}

impl GrantMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let r = registry.sub_registry_with_prefix("xcc");
        r.register(
            "grant_writes",
            "Grant objects and ServiceRecord statuses written, by kind and verb",
            self.writes.clone(),
        );
        r.register(
            "grant_errors",
            "Failed attempts to apply or remove a grant, by kind",
            self.errors.clone(),
        );
        r.register(
            "grant_pending",
            "Grants whose latest change is not yet applied",
            self.pending.clone(),
        );
    }

    fn write(&self, kind: &str, verb: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                kind: kind.to_string(),
                verb: verb.to_string(),
            })
            .inc();
    }

    fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .inc();
    }
}

/// (target namespace, target service, caller cluster, caller service).
type GrantKey = (String, String, String, String);

fn key_of(r: &OwnerRoute) -> GrantKey {
    (
        r.target_namespace.clone(),
        r.target_service.clone(),
        r.caller_cluster.clone(),
        r.caller_service.clone(),
    )
}

fn key_name(k: &GrantKey) -> String {
    format!("{}/{} <- {}/{}", k.0, k.1, k.2, k.3)
}

struct Want {
    route: OwnerRoute,
    present: bool,
    generation: u64,
    done: Option<u64>,
    /// Delays of the retries since the last success or change.
    retries: Option<Delays>,
    retry_at: Option<Instant>,
    error: Option<String>,
}

#[derive(Default)]
struct Inner {
    wants: BTreeMap<GrantKey, Want>,
    next_generation: u64,
}

/// What the writer has left to do, for readiness and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Grants whose latest change is not applied yet.
    pub pending: usize,
    /// The last error per grant still failing (`ns/service <- cluster/service` → message).
    pub errors: BTreeMap<String, String>,
}

struct Shared {
    config: GrantConfig,
    metrics: GrantMetrics,
    inner: Mutex<Inner>,
    wake: Notify,
    progress: watch::Sender<Progress>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        xcc_controller::plumbing::lock(&self.inner)
    }

    fn want(&self, route: &OwnerRoute, present: bool) {
        {
            let mut inner = self.lock();
            inner.next_generation += 1;
            let generation = inner.next_generation;
            let slot = inner.wants.entry(key_of(route)).or_insert_with(|| Want {
                route: route.clone(),
                present,
                generation,
                done: None,
                retries: None,
                retry_at: None,
                error: None,
            });
            // A grant that is still wanted keeps its first `since` (and takes the caller's
            // identity and the export as they are now); a new one starts now.
            if present {
                let since = if slot.present {
                    slot.route.since
                } else {
                    route.since
                };
                slot.route = OwnerRoute {
                    since,
                    ..route.clone()
                };
            }
            slot.present = present;
            slot.generation = generation;
            slot.retries = None;
            slot.retry_at = None;
            self.publish(&inner);
        }
        self.wake.notify_one();
    }

    fn publish(&self, inner: &Inner) {
        let mut p = Progress::default();
        for (k, w) in &inner.wants {
            if w.done != Some(w.generation) {
                p.pending += 1;
            }
            if let Some(e) = &w.error {
                p.errors.insert(key_name(k), e.clone());
            }
        }
        self.metrics
            .pending
            .set(i64::try_from(p.pending).unwrap_or(i64::MAX));
        self.progress.send_if_modified(|cur| {
            if *cur == p {
                false
            } else {
                *cur = p;
                true
            }
        });
    }
}

/// The kube-mode [`GrantSink`]. Build it with [`KubeGrants::spawn`] and hand it to
/// `Level::set_grant_sink`.
pub struct KubeGrants {
    shared: Arc<Shared>,
    metrics: GrantMetrics,
}

impl KubeGrants {
    /// Start the writer task (it ends when `cancel` fires) with the default backoff.
    pub fn spawn(
        client: Client,
        config: GrantConfig,
        store_errors: Counter,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Self::spawn_with(client, config, DEFAULT_BACKOFF, store_errors, cancel)
    }

    /// [`KubeGrants::spawn`] with explicit retry settings.
    pub fn spawn_with(
        client: Client,
        config: GrantConfig,
        backoff: Backoff,
        store_errors: Counter,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Self::spawn_shared(
            client,
            config,
            backoff,
            GrantMetrics::default(),
            store_errors,
            cancel,
        )
    }

    /// [`KubeGrants::spawn_with`] counting into `metrics` (registered beforehand, e.g. before
    /// this replica became the leader).
    pub fn spawn_shared(
        client: Client,
        config: GrantConfig,
        backoff: Backoff,
        metrics: GrantMetrics,
        store_errors: Counter,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let shared = Arc::new(Shared {
            config,
            metrics: metrics.clone(),
            inner: Mutex::new(Inner::default()),
            wake: Notify::new(),
            progress: watch::Sender::new(Progress::default()),
        });
        let worker = Worker {
            shared: shared.clone(),
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: MANAGER.to_string(),
                    instance: std::env::var("POD_NAME").ok(),
                },
            ),
            client,
            metrics: metrics.clone(),
            store_errors,
            backoff,
            conflicts_reported: Mutex::new(Default::default()),
        };
        tokio::spawn(worker.run(cancel));
        Arc::new(Self { shared, metrics })
    }

    /// The writer's metrics (register them once with [`GrantMetrics::register`]).
    pub fn metrics(&self) -> &GrantMetrics {
        &self.metrics
    }

    /// Follow the writer's progress (pending grants and errors).
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.shared.progress.subscribe()
    }
}

impl GrantSink for KubeGrants {
    fn apply(&self, route: &OwnerRoute) -> Result<Vec<String>, GrantError> {
        // Names from the wire are checked before they reach an object, a label or a request
        // path; which services may be granted at all is decided by the federation level.
        check_route(route)?;
        let refs = desired_objects(&self.shared.config, route)?
            .iter()
            .map(object_ref)
            .collect();
        self.shared.want(route, true);
        Ok(refs)
    }

    fn remove(&self, route: &OwnerRoute) -> Result<(), GrantError> {
        check_route(route)?;
        self.shared.want(route, false);
        Ok(())
    }
}

/// A failed step of a grant, with the kind it concerned (for the metric).
struct StepError {
    kind: String,
    error: KubeGrantError,
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

struct Worker {
    shared: Arc<Shared>,
    client: Client,
    recorder: Recorder,
    metrics: GrantMetrics,
    store_errors: Counter,
    backoff: Backoff,
    /// Objects (by UID) a conflict Event was recorded on, so retries do not repeat it.
    conflicts_reported: Mutex<std::collections::BTreeSet<String>>,
}

impl Worker {
    async fn run(self, cancel: CancellationToken) {
        loop {
            let now = Instant::now();
            let (due, next) = {
                let inner = self.shared.lock();
                let mut due = vec![];
                let mut next: Option<Instant> = None;
                for (k, w) in &inner.wants {
                    if w.done == Some(w.generation) {
                        continue;
                    }
                    match w.retry_at {
                        Some(t) if t > now => next = Some(next.map_or(t, |n| n.min(t))),
                        _ => due.push((k.clone(), w.route.clone(), w.present, w.generation)),
                    }
                }
                (due, next)
            };
            if due.is_empty() {
                let sleep = async {
                    match next {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = self.shared.wake.notified() => {}
                    () = sleep => {}
                }
                continue;
            }
            for (key, route, present, generation) in due {
                if cancel.is_cancelled() {
                    return;
                }
                let result = self.reconcile(&route, present).await;
                let mut inner = self.shared.lock();
                let gone = match inner.wants.get_mut(&key) {
                    None => false,
                    Some(w) => match result {
                        Ok(()) => {
                            if w.error.take().is_some() {
                                info!(grant = %key_name(&key), "grant applied after earlier failures");
                            }
                            w.retries = None;
                            w.retry_at = None;
                            if w.generation == generation {
                                w.done = Some(generation);
                                !present
                            } else {
                                false
                            }
                        }
                        Err(errors) => {
                            let message = errors
                                .iter()
                                .map(|e| e.error.to_string())
                                .collect::<Vec<_>>()
                                .join("; ");
                            for e in &errors {
                                self.metrics.error(&e.kind);
                            }
                            self.store_errors.inc();
                            if w.generation == generation {
                                let backoff = &self.backoff;
                                let delay = w
                                    .retries
                                    .get_or_insert_with(|| backoff.delays())
                                    .next_delay();
                                w.retry_at = Some(Instant::now() + delay);
                                warn!(grant = %key_name(&key), error = %message, retry_in = ?delay, "grant not applied; retrying");
                            }
                            w.error = Some(message);
                            false
                        }
                    },
                };
                if gone {
                    inner.wants.remove(&key);
                }
                self.shared.publish(&inner);
            }
        }
    }

    /// Bring one grant's objects and status entry to `present`. Every step is attempted; the
    /// failures are returned together.
    async fn reconcile(&self, route: &OwnerRoute, present: bool) -> Result<(), Vec<StepError>> {
        let mut errors = vec![];
        let objects = if present {
            desired_objects(&self.shared.config, route)
        } else {
            Ok(object_keys(self.shared.config.mode, route))
        };
        let objects = objects.unwrap_or_else(|e| {
            errors.push(StepError {
                kind: "grant".to_string(),
                error: e.into(),
            });
            vec![]
        });
        for object in objects {
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let result = if present {
                self.ensure_object(&object).await
            } else {
                self.delete_object(&object).await
            };
            if let Err(error) = result {
                errors.push(StepError { kind, error });
            }
        }
        if let Err(error) = self.record_status(route, present).await {
            errors.push(StepError {
                kind: "ServiceRecord".to_string(),
                error,
            });
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    fn dynamic_api(
        &self,
        object: &Value,
    ) -> Result<(Api<DynamicObject>, ApiResource), KubeGrantError> {
        let ar = api_resource(object)?;
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
        Ok((
            Api::namespaced_with(self.client.clone(), namespace, &ar),
            ar,
        ))
    }

    async fn ensure_object(&self, desired: &Value) -> Result<(), KubeGrantError> {
        let (api, ar) = self.dynamic_api(desired)?;
        let reference = object_ref(desired);
        let name = desired["metadata"]["name"].as_str().unwrap_or_default();
        let current = api.get_opt(name).await.map_err(|source| {
            if api_code(&source) == Some(404) {
                not_served(&ar, source)
            } else {
                KubeGrantError::Read {
                    what: reference.clone(),
                    source,
                }
            }
        })?;
        if let Some(current_object) = current {
            let current = serde_json::to_value(&current_object).unwrap_or_default();
            if !is_ours(&current) {
                let error = KubeGrantError::NotOurs { reference };
                self.report_conflict(&current_object, &ar, &error.to_string())
                    .await;
                return Err(error);
            }
            if up_to_date(&current, desired) {
                return Ok(());
            }
        }
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.metrics.write(&ar.kind, "apply");
        match api.patch(name, &params, &Patch::Apply(desired)).await {
            Ok(_) => {
                info!(object = %reference, "grant object applied");
                Ok(())
            }
            Err(e) if api_code(&e) == Some(404) => Err(not_served(&ar, e)),
            Err(source) => Err(KubeGrantError::Apply { reference, source }),
        }
    }

    /// A Warning Event on an object of a grant's name that we do not own (once per object).
    async fn report_conflict(&self, object: &DynamicObject, ar: &ApiResource, message: &str) {
        let uid = object.metadata.uid.clone().unwrap_or_default();
        let first = xcc_controller::plumbing::lock(&self.conflicts_reported).insert(uid);
        if !first {
            return;
        }
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: "GrantConflict".to_string(),
            note: Some(message.to_string()),
            action: "Grant".to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &object.object_ref(ar)).await {
            debug!(error = %e, "cannot record the conflict event");
        }
    }

    async fn delete_object(&self, desired: &Value) -> Result<(), KubeGrantError> {
        let (api, ar) = self.dynamic_api(desired)?;
        let reference = object_ref(desired);
        let name = desired["metadata"]["name"].as_str().unwrap_or_default();
        let current = match api.get_opt(name).await {
            Ok(Some(c)) => c,
            // Absent, or the resource type is not served: nothing of ours exists.
            Ok(None) => return Ok(()),
            Err(e) if api_code(&e) == Some(404) => return Ok(()),
            Err(source) => {
                return Err(KubeGrantError::Read {
                    what: reference,
                    source,
                });
            }
        };
        if !is_ours(&serde_json::to_value(&current).unwrap_or_default()) {
            info!(object = %reference, "not deleting an object {MANAGER} does not manage");
            return Ok(());
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: current.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.metrics.write(&ar.kind, "delete");
        match api.delete(name, &params).await {
            Ok(_) => {
                info!(object = %reference, "grant object deleted");
                Ok(())
            }
            // Gone already, or replaced by another object since we read it (UID changed).
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(()),
            Err(source) => Err(KubeGrantError::Delete { reference, source }),
        }
    }

    /// Add or remove the caller in `status.grants` of the exported record the grant is about.
    async fn record_status(&self, route: &OwnerRoute, present: bool) -> Result<(), KubeGrantError> {
        let api: Api<ServiceRecord> = Api::namespaced(self.client.clone(), &route.target_namespace);
        let what = format!(
            "ServiceRecord {}/{}",
            route.target_namespace, route.target_service
        );
        let Some(record) =
            api.get_opt(&route.target_service)
                .await
                .map_err(|source| KubeGrantError::Read {
                    what: what.clone(),
                    source,
                })?
        else {
            debug!(record = %what, "no exported record to record the grant on");
            return Ok(());
        };
        let labels = record.metadata.labels.clone().unwrap_or_default();
        if !labels.contains_key(EXPORT_LABEL) || labels.contains_key(IMPORTED_LABEL) {
            debug!(record = %what, "not an exported record; grant not recorded on it");
            return Ok(());
        }
        let current = record
            .status
            .as_ref()
            .map(|s| s.grants.clone())
            .unwrap_or_default();
        let Some(grants) = merged_grants(&current, route, present) else {
            return Ok(());
        };
        let grants_value = if grants.is_empty() {
            Value::Null
        } else {
            serde_json::to_value(&grants)?
        };
        // The resourceVersion makes the patch conditional: a concurrent status change (409) is
        // retried from a fresh read instead of being overwritten.
        let patch = json!({
            "metadata": {"resourceVersion": record.metadata.resource_version},
            "status": {"grants": grants_value},
        });
        self.metrics.write("ServiceRecord", "status");
        api.patch_status(
            &route.target_service,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| KubeGrantError::WriteStatus {
            what: what.clone(),
            source,
        })?;
        let caller = format!("{}/{}", route.caller_cluster, route.caller_service);
        info!(record = %what, %caller, granted = present, "grant recorded in status");
        let event = KubeEvent {
            type_: EventType::Normal,
            reason: if present { "Granted" } else { "Revoked" }.to_string(),
            note: Some(if present {
                format!(
                    "{caller} was granted access through {}",
                    route.resolver_cluster
                )
            } else {
                format!("the grant of {caller} was revoked")
            }),
            action: if present { "Grant" } else { "Revoke" }.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &record.object_ref(&())).await {
            debug!(error = %e, "cannot record the grant event");
        }
        Ok(())
    }
}

fn not_served(ar: &ApiResource, source: kube::Error) -> KubeGrantError {
    KubeGrantError::NotServed {
        resource: Box::new(ar.clone()),
        source,
    }
}

#[cfg(test)]
mod tests;
