//! The Kubernetes side of the hierarchy's grants, on a real API server (`xcc_testkube`) with the
//! upstream CRDs of Istio, the Gateway API and Cilium installed: [`KubeGrants`] runs as the
//! registry's ServiceAccount bound to exactly the RBAC of `deploy/overlays/grants-<mode>`, and
//! the tests read back what the server stored — each kind is accepted by its real schema
//! (`security.istio.io/v1`, `gateway.networking.k8s.io/v1`, `cilium.io/v2`), carries the
//! caller's workload identity and the exported service's own selector, FQDN and port, and
//! `status.grants` of the exported ServiceRecord records the callers. Also: unchanged grants
//! cost no write (from the API server's audit log), objects we do not own are left alone, and
//! the last wish wins.
//!
//! A resource type that is not served and becomes served runs on a control plane of its own (the
//! shared one serves the Istio API for the other tests). Only a watch answered `410 Gone` after
//! compaction (Cedar policies from a ConfigMap) runs on the in-process fake: the real server
//! compacts on its own schedule, not on demand.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use xcc_kube_fake::{FakeApiServer, crds};
use xcc_proto::crd::ServiceRecord;
use xcc_proto::names::{EXPORT_LABEL, WORKLOAD_SELECTOR_ANNOTATION, policy_object_name};
use xcc_registry::authz::Policies;
use xcc_registry::authz_configmap::spawn_policy_configmap;
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::grants::{
    CALLER_ANNOTATION, ExportedService, GatewayRef, GrantConfig, GrantMode, GrantSink,
    MANAGED_BY_LABEL, SOURCE_NAME_LABEL, WorkloadIdentity,
};
use xcc_registry::federation::kube_grants::{Backoff, KubeGrants, Progress};
use xcc_registry::federation::level::OwnerRoute;
use xcc_registry::metrics::Metrics;
use xcc_registry::store::file::FileErrors;
use xcc_testkube::{ControlPlane, Request, Turn, poll};

const WAIT: Duration = Duration::from_secs(30);
const ISTIO: &str = "security.istio.io/v1";
const SR_API: &str = "connectivity.tanzu.vmware.com/v1alpha1";
/// Watched by waits on Events and on ServiceRecords ([`ControlPlane::changes`]).
const EVENTS: (&str, &str, &str) = ("events.k8s.io/v1", "Event", "events");
const SERVICE_RECORDS: (&str, &str, &str) = (SR_API, "ServiceRecord", "servicerecords");
const FQDN: &str = "api.shop.xcc.test";
/// The exported record's name (records are named after their FQDN).
const RECORD: &str = FQDN;

/// The shared control plane with xcc's and the upstream CRDs installed, a fresh namespace, the
/// registry's identity there under `deploy/overlays/grants-<mode>`, and the test's turn.
async fn setup(
    test: &str,
    mode: &str,
) -> Option<(&'static ControlPlane, String, Client, Client, String, Turn)> {
    let cp = xcc_testkube::shared(test)?;
    let turn = Turn::shared().await;
    cp.apply_dir(&xcc_testkube::upstream_crds()).await;
    cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
    let ns = cp.namespace("grants").await;
    let id = cp
        .identity(&ns, &format!("overlays/grants-{mode}"), "xcc-registry")
        .await;
    Some((
        cp,
        ns.clone(),
        cp.client().await,
        id.client().await,
        id.user,
        turn,
    ))
}

/// The exported record of a Service `api-svc` (ports 53/UDP and 8080/TCP, selector
/// `app.kubernetes.io/name=api`), as the publisher writes it; returns what the owner grants.
async fn exported_record(admin: &Client, ns: &str) -> ExportedService {
    let api: Api<ServiceRecord> = Api::namespaced(admin.clone(), ns);
    let sr: ServiceRecord = serde_json::from_value(json!({
        "apiVersion": SR_API, "kind": "ServiceRecord",
        "metadata": {
            "name": RECORD, "namespace": ns,
            "labels": {EXPORT_LABEL: ""},
            "annotations": {WORKLOAD_SELECTOR_ANNOTATION: "app.kubernetes.io/name=api"},
        },
        "spec": {
            "fqdn": FQDN,
            "endpoints": [{"address": "10.0.0.1", "port": 8080}],
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "http", "port": 8080}],
            "origin": {"namespace": ns, "name": "api-svc", "kind": "Service"},
        },
    }))
    .unwrap();
    let stored = api.create(&PostParams::default(), &sr).await.unwrap();
    let entry = xcc_registry::store::model::export_entry("b2", &stored).unwrap();
    ExportedService::of(&entry)
}

fn identity(namespace: &str) -> WorkloadIdentity {
    WorkloadIdentity {
        trust_domain: "cluster.local".into(),
        namespace: namespace.into(),
        service_account: "web-sa".into(),
    }
}

fn route(ns: &str, caller: &str, exported: &ExportedService) -> OwnerRoute {
    OwnerRoute {
        target_namespace: ns.into(),
        target_service: RECORD.into(),
        caller_cluster: caller.into(),
        caller_service: "web".into(),
        caller_identity: Some(identity("storefront")),
        exported: exported.clone(),
        resolver_cluster: "b".into(),
        since: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        applied: vec![],
    }
}

fn config(mode: GrantMode) -> GrantConfig {
    GrantConfig {
        gateway: Some(GatewayRef {
            namespace: "gateways".into(),
            name: "mesh".into(),
        }),
        ..GrantConfig::new(mode)
    }
}

fn name(prefix: &str, ns: &str, caller: &str) -> String {
    policy_object_name(prefix, &[ns, RECORD, caller, "web"])
}

fn sink(client: Client, mode: GrantMode, cancel: &CancellationToken) -> Arc<KubeGrants> {
    KubeGrants::spawn_with(
        client,
        config(mode),
        Backoff {
            min: Duration::from_millis(50),
            max: Duration::from_millis(400),
        },
        Counter::default(),
        cancel.clone(),
    )
}

async fn until<T: Clone + std::fmt::Debug>(
    rx: &mut watch::Receiver<T>,
    what: &str,
    f: impl FnMut(&T) -> bool,
) -> T {
    let got = tokio::time::timeout(WAIT, rx.wait_for(f))
        .await
        .map(|r| r.map(|v| v.clone()));
    match got {
        Ok(Ok(v)) => v,
        _ => panic!("timed out waiting for {what}; last: {:?}", *rx.borrow()),
    }
}

async fn settled(g: &KubeGrants) -> Progress {
    let mut rx = g.progress();
    until(&mut rx, "the grant writer to settle", |p| p.pending == 0).await
}

fn dynamic(
    client: &Client,
    ns: &str,
    api_version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap();
    let ar = kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn aps(admin: &Client, ns: &str) -> Api<DynamicObject> {
    dynamic(
        admin,
        ns,
        ISTIO,
        "AuthorizationPolicy",
        "authorizationpolicies",
    )
}

async fn get(api: &Api<DynamicObject>, name: &str) -> Option<Value> {
    api.get_opt(name)
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

async fn status_grants(admin: &Client, ns: &str) -> Value {
    let api: Api<ServiceRecord> = Api::namespaced(admin.clone(), ns);
    let sr = serde_json::to_value(api.get(RECORD).await.unwrap()).unwrap();
    sr["status"]["grants"].clone()
}

async fn events(admin: &Client, ns: &str) -> Vec<Value> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), ns);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect()
}

/// The write requests (`verb resource`) `user` sent so far, from the audit log.
async fn writes_of(cp: &ControlPlane, user_client: &Client, user: &str, ns: &str) -> Vec<String> {
    cp.audit_flushed(user_client, user, ns).await;
    cp.writes(user).iter().map(Request::action).collect()
}

#[tokio::test]
async fn istio_grant_applied_unchanged_and_revoked() {
    let Some((cp, ns, admin, client, user, _turn)) =
        setup("istio_grant_applied_unchanged_and_revoked", "istio").await
    else {
        return;
    };
    let exported = exported_record(&admin, &ns).await;
    let cancel = CancellationToken::new();
    let g = sink(client.clone(), GrantMode::Istio, &cancel);

    let refs = g.apply(&route(&ns, "b1", &exported)).unwrap();
    assert_eq!(
        refs,
        [format!(
            "AuthorizationPolicy/{ns}/{}",
            name("allow-to-", &ns, "b1")
        )]
    );
    assert_eq!(settled(&g).await, Progress::default());
    let ap = get(&aps(&admin, &ns), &name("allow-to-", &ns, "b1"))
        .await
        .expect("AuthorizationPolicy stored");
    assert_eq!(ap["metadata"]["labels"][MANAGED_BY_LABEL], "xcc-registry");
    assert_eq!(ap["metadata"]["labels"][SOURCE_NAME_LABEL], RECORD);
    assert_eq!(ap["metadata"]["annotations"][CALLER_ANNOTATION], "b1/web");
    assert_eq!(
        ap["spec"],
        json!({
            "selector": {"matchLabels": {"app.kubernetes.io/name": "api"}},
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/storefront/sa/web-sa"]}}]}],
        }),
        "exactly what the server stored"
    );
    assert_eq!(
        ap["metadata"]["managedFields"][0]["manager"], "xcc-registry",
        "server-side applied by our field manager"
    );
    assert_eq!(
        status_grants(&admin, &ns).await,
        json!([{"callerCluster": "b1", "callerService": "web", "since": "2023-11-14T22:13:20Z"}])
    );
    // An Event on the record tells operators who was granted.
    let changes = cp.changes(Some(&ns), &[EVENTS]).await;
    changes
        .wait_for("the Granted event", WAIT, async || {
            events(&admin, &ns)
                .await
                .iter()
                .any(|e| e["reason"] == "Granted" && e["regarding"]["name"] == RECORD)
                .then_some(())
        })
        .await;

    // A second caller is added next to the first.
    g.apply(&route(&ns, "a9", &exported)).unwrap();
    settled(&g).await;
    assert_eq!(
        status_grants(&admin, &ns)
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["callerCluster"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["a9", "b1"]
    );

    // Re-applying an unchanged grant (here, after a restart of the writer) writes nothing.
    cancel.cancel();
    let before = writes_of(cp, &client, &user, &ns).await;
    for write in [
        "patch authorizationpolicies",
        "patch servicerecords/status",
        "create events",
    ] {
        assert!(before.iter().any(|w| w == write), "{write} in {before:?}");
    }
    let cancel = CancellationToken::new();
    let g = sink(client.clone(), GrantMode::Istio, &cancel);
    let mut later = route(&ns, "b1", &exported);
    later.since += Duration::from_secs(3600);
    g.apply(&later).unwrap();
    g.apply(&route(&ns, "a9", &exported)).unwrap();
    settled(&g).await;
    let after = writes_of(cp, &client, &user, &ns).await;
    assert_eq!(
        after[before.len()..],
        [] as [String; 0],
        "no write for unchanged grants"
    );
    assert_eq!(
        status_grants(&admin, &ns).await[1]["since"],
        "2023-11-14T22:13:20Z",
        "the first since is kept"
    );

    // A new workload identity of the same caller changes the object in place.
    let mut moved = route(&ns, "b1", &exported);
    moved.caller_identity = Some(identity("checkout"));
    g.apply(&moved).unwrap();
    assert_eq!(settled(&g).await, Progress::default());
    let ap = get(&aps(&admin, &ns), &name("allow-to-", &ns, "b1"))
        .await
        .unwrap();
    assert_eq!(
        ap["spec"]["rules"][0]["from"][0]["source"]["principals"],
        json!(["cluster.local/ns/checkout/sa/web-sa"])
    );

    // Revoke: the object goes, the caller leaves the status; the other grant stays.
    g.remove(&moved).unwrap();
    assert_eq!(settled(&g).await, Progress::default());
    assert_eq!(
        get(&aps(&admin, &ns), &name("allow-to-", &ns, "b1")).await,
        None
    );
    assert!(
        get(&aps(&admin, &ns), &name("allow-to-", &ns, "a9"))
            .await
            .is_some()
    );
    assert_eq!(
        status_grants(&admin, &ns).await,
        json!([{"callerCluster": "a9", "callerService": "web", "since": "2023-11-14T22:13:20Z"}])
    );
    g.remove(&route(&ns, "a9", &exported)).unwrap();
    settled(&g).await;
    assert!(
        aps(&admin, &ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert_eq!(status_grants(&admin, &ns).await, Value::Null);
    // Removing again is a no-op.
    let before = writes_of(cp, &client, &user, &ns).await;
    g.remove(&route(&ns, "a9", &exported)).unwrap();
    settled(&g).await;
    let after = writes_of(cp, &client, &user, &ns).await;
    assert_eq!(after[before.len()..], [] as [String; 0]);
    assert_eq!(cp.forbidden(&user), Vec::<String>::new());
    cancel.cancel();
}

#[tokio::test]
async fn gateway_and_cilium_objects_are_accepted_by_their_real_schemas() {
    let test = "gateway_and_cilium_objects_are_accepted_by_their_real_schemas";
    for (mode, overlay, api_version, kind, plural, prefix, spec) in [
        (
            GrantMode::Gateway,
            "gateway",
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "httproutes",
            "route-",
            json!({
                "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                "namespace": "gateways", "name": "mesh"}],
                "hostnames": [FQDN],
                "rules": [{"backendRefs": [{"group": "", "kind": "Service", "name": "api-svc",
                                            "port": 8080, "weight": 1}],
                           "matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}],
            }),
        ),
        (
            GrantMode::Cilium,
            "cilium",
            "cilium.io/v2",
            "CiliumNetworkPolicy",
            "ciliumnetworkpolicies",
            "cnp-mesh-",
            json!({
                "endpointSelector": {"matchLabels": {"app.kubernetes.io/name": "api"}},
                "ingress": [{"fromEndpoints": [{"matchLabels": {
                    "io.cilium.k8s.policy.cluster": "b1",
                    "k8s:io.kubernetes.pod.namespace": "storefront",
                    "io.cilium.k8s.policy.serviceaccount": "web-sa",
                }}]}],
            }),
        ),
    ] {
        let Some((cp, ns, admin, client, user, _turn)) = setup(test, overlay).await else {
            return;
        };
        let exported = exported_record(&admin, &ns).await;
        let cancel = CancellationToken::new();
        let g = sink(client, mode, &cancel);
        let refs = g.apply(&route(&ns, "b1", &exported)).unwrap();
        assert_eq!(settled(&g).await, Progress::default(), "{kind} accepted");
        let object_name = name(prefix, &ns, "b1");
        assert_eq!(refs, [format!("{kind}/{ns}/{object_name}")]);
        let api = dynamic(&admin, &ns, api_version, kind, plural);
        let o = get(&api, &object_name).await.expect(plural);
        assert_eq!(o["metadata"]["labels"][MANAGED_BY_LABEL], "xcc-registry");
        // Exactly what the server stored (with the defaults its schema adds).
        assert_eq!(o["spec"], spec, "{kind}");
        g.remove(&route(&ns, "b1", &exported)).unwrap();
        settled(&g).await;
        assert_eq!(get(&api, &object_name).await, None);
        assert_eq!(cp.forbidden(&user), Vec::<String>::new());
        cancel.cancel();
    }
}

#[tokio::test]
async fn an_object_we_do_not_manage_is_never_changed_or_deleted() {
    let Some((cp, ns, admin, client, user, _turn)) = setup(
        "an_object_we_do_not_manage_is_never_changed_or_deleted",
        "istio",
    )
    .await
    else {
        return;
    };
    let exported = exported_record(&admin, &ns).await;
    let object_name = name("allow-to-", &ns, "b1");
    let theirs: DynamicObject = serde_json::from_value(json!({
        "apiVersion": ISTIO, "kind": "AuthorizationPolicy",
        "metadata": {"name": object_name, "namespace": ns, "labels": {"team": "shop"}},
        "spec": {"action": "DENY"},
    }))
    .unwrap();
    aps(&admin, &ns)
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let before = get(&aps(&admin, &ns), &object_name).await.unwrap();
    let cancel = CancellationToken::new();
    let g = sink(client.clone(), GrantMode::Istio, &cancel);
    g.apply(&route(&ns, "b1", &exported)).unwrap();
    let mut rx = g.progress();
    let p = until(&mut rx, "the conflict to be reported", |p| {
        !p.errors.is_empty()
    })
    .await;
    assert_eq!(
        p.errors.values().cloned().collect::<Vec<_>>(),
        [format!(
            "AuthorizationPolicy/{ns}/{object_name} exists and is not managed by xcc-registry; left alone"
        )]
    );
    // Reported once on the object itself, however often the grant is retried.
    let changes = cp.changes(Some(&ns), &[EVENTS]).await;
    changes
        .wait_for("the conflict event", WAIT, async || {
            events(&admin, &ns)
                .await
                .iter()
                .any(|e| {
                    e["type"] == "Warning"
                        && e["reason"] == "GrantConflict"
                        && e["regarding"]["kind"] == "AuthorizationPolicy"
                        && e["regarding"]["name"] == object_name.as_str()
                })
                .then_some(())
        })
        .await;
    poll("retries", WAIT, || {
        g.metrics()
            .errors
            .get_or_create(&kind("AuthorizationPolicy"))
            .get()
            >= 3
    })
    .await;
    let conflicts: Vec<Value> = events(&admin, &ns)
        .await
        .into_iter()
        .filter(|e| e["reason"] == "GrantConflict")
        .collect();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(
        conflicts[0]["series"],
        Value::Null,
        "not repeated on retries"
    );
    g.remove(&route(&ns, "b1", &exported)).unwrap();
    assert_eq!(settled(&g).await, Progress::default());
    assert_eq!(get(&aps(&admin, &ns), &object_name).await, Some(before));
    let writes = writes_of(cp, &client, &user, &ns).await;
    assert!(
        !writes.iter().any(|w| w.ends_with(" authorizationpolicies")),
        "{writes:?}"
    );
    cancel.cancel();
}

fn kind(k: &str) -> xcc_registry::federation::kube_grants::KindLabels {
    xcc_registry::federation::kube_grants::KindLabels { kind: k.into() }
}

#[tokio::test]
async fn apply_then_remove_ends_removed_and_the_last_wish_wins() {
    let Some((_cp, ns, admin, client, _user, _turn)) = setup(
        "apply_then_remove_ends_removed_and_the_last_wish_wins",
        "istio",
    )
    .await
    else {
        return;
    };
    let exported = exported_record(&admin, &ns).await;
    let r = route(&ns, "b1", &exported);
    let object_name = name("allow-to-", &ns, "b1");
    let cancel = CancellationToken::new();
    let g = sink(client, GrantMode::Istio, &cancel);
    g.apply(&r).unwrap();
    g.remove(&r).unwrap();
    assert_eq!(settled(&g).await, Progress::default());
    assert_eq!(get(&aps(&admin, &ns), &object_name).await, None);
    assert_eq!(status_grants(&admin, &ns).await, Value::Null);

    // Interleave with the writer: whatever was in flight, the last call decides.
    for _ in 0..20 {
        g.apply(&r).unwrap();
        tokio::task::yield_now().await;
        g.remove(&r).unwrap();
    }
    settled(&g).await;
    assert_eq!(get(&aps(&admin, &ns), &object_name).await, None);
    assert_eq!(status_grants(&admin, &ns).await, Value::Null);
    for _ in 0..20 {
        g.remove(&r).unwrap();
        tokio::task::yield_now().await;
        g.apply(&r).unwrap();
    }
    settled(&g).await;
    assert!(get(&aps(&admin, &ns), &object_name).await.is_some());
    assert_eq!(
        status_grants(&admin, &ns).await.as_array().map(Vec::len),
        Some(1)
    );
    cancel.cancel();
}

const NS: &str = "shop";

/// A resource type that is not served is retried until it is — on a control plane of its own,
/// since the shared one serves the Istio API for the other tests: the grant is reported and
/// retried with backoff while `security.istio.io/v1` is not served, recorded on the exported
/// record meanwhile, and applied once the upstream CRD is installed.
#[tokio::test]
async fn a_resource_type_that_is_not_served_is_retried_until_it_is() {
    let Some(cp) = ControlPlane::start("a_resource_type_that_is_not_served_is_retried_until_it_is")
    else {
        return;
    };
    cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
    let ns = cp.namespace("grants").await;
    let id = cp
        .identity(&ns, "overlays/grants-istio", "xcc-registry")
        .await;
    let admin = cp.client().await;
    let exported = exported_record(&admin, &ns).await;
    let r = route(&ns, "b1", &exported);
    let cancel = CancellationToken::new();
    let store_errors = Counter::default();
    let g = KubeGrants::spawn_with(
        id.client().await,
        config(GrantMode::Istio),
        Backoff {
            min: Duration::from_millis(20),
            max: Duration::from_millis(100),
        },
        store_errors.clone(),
        cancel.clone(),
    );
    g.apply(&r).unwrap();
    let mut rx = g.progress();
    let p = until(&mut rx, "the missing CRD to be reported", |p| {
        !p.errors.is_empty()
    })
    .await;
    let error = p.errors.get(&format!("{ns}/{RECORD} <- b1/web")).unwrap();
    assert!(
        error.starts_with(
            "resource authorizationpolicies.security.istio.io (security.istio.io/v1) is not served"
        ),
        "{error}"
    );
    assert_eq!(p.pending, 1);
    // Retried with backoff (more than one attempt), counted, and the process is still fine.
    poll("a retry", WAIT, || store_errors.get() >= 2).await;
    assert!(
        g.metrics()
            .errors
            .get_or_create(&kind("AuthorizationPolicy"))
            .get()
            >= 2
    );
    // The grant itself is recorded on the record meanwhile.
    let changes = cp.changes(Some(&ns), &[SERVICE_RECORDS]).await;
    changes
        .wait_for("the caller in status.grants", WAIT, async || {
            (status_grants(&admin, &ns).await[0]["callerCluster"] == "b1").then_some(())
        })
        .await;

    let istio = xcc_testkube::upstream_crds().join("security.istio.io_authorizationpolicies.yaml");
    cp.apply(&xcc_testkube::yaml_docs(
        &std::fs::read_to_string(istio).unwrap(),
    ))
    .await;
    let p = until(&mut rx, "the grant to be applied", |p| p.pending == 0).await;
    assert_eq!(p, Progress::default());
    assert!(
        get(&aps(&admin, &ns), &name("allow-to-", &ns, "b1"))
            .await
            .is_some()
    );
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
    cancel.cancel();
}

// ----- Cedar policies from a ConfigMap -----

const CM: &str = "xcc-policies";

fn entry() -> ServiceEntry {
    ServiceEntry {
        key: ServiceKey::new("b2", NS, "api"),
        source: Source::Local,
        fqdn: "api.shop.svc.clusterset.local".into(),
        endpoints: vec![Endpoint {
            address: "10.2.0.1".into(),
            port: 443,
        }],
        ports: vec![],
        labels: Default::default(),
        allowed_requesters: vec![],
        origin: None,
        revision: 1,
    }
}

type Handle = Arc<RwLock<Arc<Policies>>>;

fn allowed(h: &Handle, cluster: &str) -> bool {
    let p = h.read().unwrap().clone();
    p.discover(&entry(), cluster, "", true).allowed
}

fn deny(cluster: &str) -> String {
    format!(
        r#"@id("deny-{cluster}") forbid (principal == Xcc::Cluster::"{cluster}", action == Xcc::Action::"discover", resource);"#
    )
}

fn configmap(ns: &str, data: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": CM, "namespace": ns},
        "data": data.iter().map(|(k, v)| (k.to_string(), Value::from(*v))).collect::<serde_json::Map<_, _>>(),
    }))
    .unwrap()
}

async fn put_configmap(api: &Api<ConfigMap>, ns: &str, data: &[(&str, &str)]) {
    api.patch(
        CM,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&configmap(ns, data)),
    )
    .await
    .unwrap();
}

/// Wait until the policies in `handle` satisfy `f` (the watch swaps them in; nothing to await).
async fn policies_until(handle: &Handle, what: &'static str, f: impl Fn(&Handle) -> bool) {
    poll(what, WAIT, || f(handle)).await;
}

#[tokio::test]
async fn policies_from_a_configmap_applied_rejected_fixed_and_deleted() {
    let test = "policies_from_a_configmap_applied_rejected_fixed_and_deleted";
    let Some(cp) = xcc_testkube::shared(test) else {
        return;
    };
    let _turn = Turn::shared().await;
    let ns = cp.namespace("policies").await;
    let id = cp.identity(&ns, "base", "xcc-registry").await;
    let admin = cp.client().await;
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let handle: Handle = Arc::new(RwLock::new(Arc::new(Policies::default_set())));
    let errors = FileErrors::default();
    let metrics = Metrics::default();
    let cancel = CancellationToken::new();
    let mut w = spawn_policy_configmap(
        id.client().await,
        &ns,
        CM,
        handle.clone(),
        errors.clone(),
        metrics.clone(),
        cancel.clone(),
    );
    until(&mut w.synced, "the first sync", |s| *s).await;
    assert!(handle.read().unwrap().is_default_only());
    assert!(allowed(&handle, "b1"));

    // A valid policy: the decision changes.
    put_configmap(
        &api,
        &ns,
        &[("deny.cedar", &deny("b1")), ("README", "not a policy")],
    )
    .await;
    policies_until(&handle, "the policy to apply", |h| !allowed(h, "b1")).await;
    assert!(allowed(&handle, "b3"));
    assert_eq!(
        handle.read().unwrap().policy_ids(),
        ["announce-clusterset", "bilateral", "carry-self", "deny-b1"]
    );
    assert_eq!(errors.get(), Vec::<String>::new());

    // A syntax error in another key: the previous set stays, the error names the key.
    let mut errs = errors.subscribe();
    put_configmap(
        &api,
        &ns,
        &[("deny.cedar", &deny("b3")), ("broken.cedar", "permit (")],
    )
    .await;
    let reported = until(&mut errs, "the error", |e| !e.is_empty()).await;
    assert_eq!(reported.len(), 1);
    assert!(
        reported[0].starts_with(&format!("ConfigMap {ns}/xcc-policies: key broken.cedar: ")),
        "{reported:?}"
    );
    assert!(!allowed(&handle, "b1"), "previous set kept");
    assert!(
        allowed(&handle, "b3"),
        "the rejected change is not half-applied"
    );
    assert_eq!(metrics.store_errors.get(), 1);
    let changes = cp.changes(Some(&ns), &[EVENTS]).await;
    changes
        .wait_for("the Warning event on the ConfigMap", WAIT, async || {
            events(&admin, &ns)
                .await
                .iter()
                .any(|e| {
                    e["type"] == "Warning"
                        && e["reason"] == "InvalidPolicy"
                        && e["regarding"]["kind"] == "ConfigMap"
                        && e["regarding"]["name"] == CM
                        && e["note"]
                            .as_str()
                            .is_some_and(|n| n.contains("broken.cedar"))
                })
                .then_some(())
        })
        .await;

    // Fixed: applied, error cleared.
    put_configmap(&api, &ns, &[("deny.cedar", &deny("b3"))]).await;
    until(&mut errs, "the error to clear", Vec::is_empty).await;
    policies_until(&handle, "the fixed policy to apply", |h| allowed(h, "b1")).await;
    assert!(!allowed(&handle, "b3"));
    assert_eq!(metrics.store_errors.get(), 1);

    // Deleted: back to the defaults.
    api.delete(CM, &DeleteParams::default()).await.unwrap();
    policies_until(&handle, "the defaults", |h| {
        h.read().unwrap().is_default_only()
    })
    .await;
    assert!(allowed(&handle, "b3"));
    assert_eq!(errors.get(), Vec::<String>::new());
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());

    cancel.cancel();
    tokio::time::timeout(WAIT, w.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_bad_configmap_at_start_keeps_the_defaults_and_another_configmap_is_ignored() {
    let test = "a_bad_configmap_at_start_keeps_the_defaults_and_another_configmap_is_ignored";
    let Some(cp) = xcc_testkube::shared(test) else {
        return;
    };
    let _turn = Turn::shared().await;
    let ns = cp.namespace("policies").await;
    let id = cp.identity(&ns, "base", "xcc-registry").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await, &ns);
    put_configmap(&api, &ns, &[("x.cedar", "forbid (")]).await;
    let other: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "unrelated", "namespace": ns},
        "data": {"deny.cedar": deny("b1")},
    }))
    .unwrap();
    api.create(&PostParams::default(), &other).await.unwrap();
    let handle: Handle = Arc::new(RwLock::new(Arc::new(Policies::default_set())));
    let errors = FileErrors::default();
    let cancel = CancellationToken::new();
    let mut w = spawn_policy_configmap(
        id.client().await,
        &ns,
        CM,
        handle.clone(),
        errors.clone(),
        Metrics::default(),
        cancel.clone(),
    );
    until(&mut w.synced, "the first sync", |s| *s).await;
    let e = errors.get();
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with(&format!("ConfigMap {ns}/xcc-policies: key x.cedar: ")),
        "{e:?}"
    );
    assert!(handle.read().unwrap().is_default_only());
    assert!(allowed(&handle, "b1"));
    cancel.cancel();
}

// ----- on the in-process fake -----

async fn server() -> FakeApiServer {
    let mut b = FakeApiServer::builder().namespace(NS).namespace("xcc");
    for spec in crds::all() {
        b = b.resource(spec);
    }
    b.start().await
}

/// On the fake: the real server compacts on its own schedule, not on demand.
#[tokio::test]
async fn the_policy_watch_survives_410_gone() {
    let server = server().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "xcc");
    let handle: Handle = Arc::new(RwLock::new(Arc::new(Policies::default_set())));
    let cancel = CancellationToken::new();
    let mut w = spawn_policy_configmap(
        client,
        "xcc",
        CM,
        handle.clone(),
        FileErrors::default(),
        Metrics::default(),
        cancel.clone(),
    );
    until(&mut w.synced, "the first sync", |s| *s).await;
    put_configmap(&api, "xcc", &[("deny.cedar", &deny("b1"))]).await;
    poll("the policy to apply", WAIT, || !allowed(&handle, "b1")).await;
    // The watch is answered 410 Gone: it lists again and keeps following changes.
    server.compact();
    put_configmap(&api, "xcc", &[("deny.cedar", &deny("b4"))]).await;
    poll("the change after 410 to apply", WAIT, || {
        !allowed(&handle, "b4")
    })
    .await;
    assert!(allowed(&handle, "b1"));
    cancel.cancel();
    tokio::time::timeout(WAIT, w.task).await.unwrap().unwrap();
}
