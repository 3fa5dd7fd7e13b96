//! The Kubernetes parts of the hierarchy against the in-process fake API server: grant objects
//! and `status.grants` written by [`KubeGrants`] (applied, unchanged, revoked, ordering, objects
//! we do not own, a resource type that is not served), and Cedar policies from a watched
//! ConfigMap (applied, rejected with the key named, fixed, deleted, 410 Gone).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use xcc_kube_fake::{FakeApiServer, Verb, crds};
use xcc_proto::crd::ServiceRecord;
use xcc_proto::names::{EXPORT_LABEL, policy_object_name};
use xcc_registry::authz::Policies;
use xcc_registry::authz_configmap::spawn_policy_configmap;
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::grants::{
    CALLER_ANNOTATION, GrantMode, GrantSink, MANAGED_BY_LABEL, SOURCE_NAME_LABEL,
};
use xcc_registry::federation::kube_grants::{Backoff, KubeGrants, Progress};
use xcc_registry::federation::level::OwnerRoute;
use xcc_registry::metrics::Metrics;
use xcc_registry::store::file::FileErrors;

const NS: &str = "shop";
const WAIT: Duration = Duration::from_secs(20);
const ISTIO: &str = "security.istio.io/v1";
const AP: &str = "authorizationpolicies";
const AP_RESOURCE: &str = "authorizationpolicies.security.istio.io";
const SR_API: &str = "connectivity.tanzu.vmware.com/v1alpha1";
const SR_STATUS: &str = "servicerecords.connectivity.tanzu.vmware.com/status";

async fn server(with_istio: bool) -> FakeApiServer {
    let mut b = FakeApiServer::builder().namespace(NS).namespace("xcc");
    for spec in crds::all() {
        if with_istio || spec.plural != AP {
            b = b.resource(spec);
        }
    }
    b.start().await
}

fn route(caller: &str) -> OwnerRoute {
    OwnerRoute {
        target_namespace: NS.into(),
        target_service: "api".into(),
        caller_cluster: caller.into(),
        caller_service: "web".into(),
        resolver_cluster: "b".into(),
        since: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        applied: vec![],
    }
}

fn ap_name(caller: &str) -> String {
    policy_object_name("allow-to-", &[NS, "api", caller, "web"])
}

async fn exported_record(client: &Client) {
    let api: Api<ServiceRecord> = Api::namespaced(client.clone(), NS);
    let sr: ServiceRecord = serde_json::from_value(json!({
        "apiVersion": SR_API, "kind": "ServiceRecord",
        "metadata": {"name": "api", "namespace": NS, "labels": {EXPORT_LABEL: ""}},
        "spec": {"fqdn": "api.shop.xcc.test", "endpoints": [{"address": "10.0.0.1", "port": 443}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &sr).await.unwrap();
}

fn sink(server: &FakeApiServer, mode: GrantMode, cancel: &CancellationToken) -> Arc<KubeGrants> {
    KubeGrants::spawn_with(
        server.client(),
        mode,
        Backoff {
            min: Duration::from_millis(20),
            max: Duration::from_millis(200),
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

/// Poll `f` every 20 ms until it holds (a condition on the fake's state).
async fn poll(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status_grants(server: &FakeApiServer) -> Value {
    let sr = server
        .get(SR_API, "servicerecords", Some(NS), "api")
        .unwrap();
    sr["status"]["grants"].clone()
}

#[tokio::test]
async fn istio_grant_applied_unchanged_and_revoked() {
    let server = server(true).await;
    exported_record(&server.client()).await;
    let cancel = CancellationToken::new();
    let g = sink(&server, GrantMode::Istio, &cancel);
    server.reset_counters();

    let refs = g.apply(&route("b1")).unwrap();
    assert_eq!(
        refs,
        [format!("AuthorizationPolicy/{NS}/{}", ap_name("b1"))]
    );
    assert_eq!(settled(&g).await, Progress::default());
    let ap = server
        .get(ISTIO, AP, Some(NS), &ap_name("b1"))
        .expect("AuthorizationPolicy");
    assert_eq!(ap["metadata"]["labels"][MANAGED_BY_LABEL], "xcc-registry");
    assert_eq!(ap["metadata"]["labels"][SOURCE_NAME_LABEL], "api");
    assert_eq!(ap["metadata"]["annotations"][CALLER_ANNOTATION], "b1/web");
    assert_eq!(
        ap["spec"],
        json!({
            "selector": {"matchLabels": {"app": "api"}},
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/b1/sa/web"]}}]}],
        })
    );
    assert_eq!(
        ap["metadata"]["managedFields"][0]["manager"], "xcc-registry",
        "server-side applied by our field manager"
    );
    assert_eq!(
        status_grants(&server),
        json!([{"callerCluster": "b1", "callerService": "web", "since": "2023-11-14T22:13:20Z"}])
    );
    let writes = server.writes();
    assert_eq!(writes.get(AP_RESOURCE, Verb::Patch), 1, "{writes}");
    assert_eq!(writes.get(SR_STATUS, Verb::Patch), 1, "{writes}");
    // An Event on the record tells operators who was granted.
    poll("the Granted event", || {
        server
            .list("events.k8s.io/v1", "events", Some(NS))
            .iter()
            .any(|e| e["reason"] == "Granted" && e["regarding"]["name"] == "api")
    })
    .await;

    // A second caller is added next to the first.
    g.apply(&route("a9")).unwrap();
    settled(&g).await;
    assert_eq!(
        status_grants(&server)
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["callerCluster"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["a9", "b1"]
    );

    // Re-applying an unchanged grant (here, after a restart of the writer) writes nothing.
    cancel.cancel();
    let cancel = CancellationToken::new();
    let g = sink(&server, GrantMode::Istio, &cancel);
    server.reset_counters();
    let mut later = route("b1");
    later.since += Duration::from_secs(3600);
    g.apply(&later).unwrap();
    g.apply(&route("a9")).unwrap();
    settled(&g).await;
    // Not even a no-op request: the writer compares before it writes.
    assert_eq!(server.requests().total(), 0, "{}", server.requests());
    assert_eq!(
        status_grants(&server)[1]["since"],
        "2023-11-14T22:13:20Z",
        "the first since is kept"
    );

    // Revoke: the object goes, the caller leaves the status; the other grant stays.
    g.remove(&route("b1")).unwrap();
    assert_eq!(settled(&g).await, Progress::default());
    assert_eq!(server.get(ISTIO, AP, Some(NS), &ap_name("b1")), None);
    assert!(server.get(ISTIO, AP, Some(NS), &ap_name("a9")).is_some());
    assert_eq!(
        status_grants(&server),
        json!([{"callerCluster": "a9", "callerService": "web", "since": "2023-11-14T22:13:20Z"}])
    );
    g.remove(&route("a9")).unwrap();
    settled(&g).await;
    assert_eq!(server.list(ISTIO, AP, Some(NS)), Vec::<Value>::new());
    assert_eq!(status_grants(&server), Value::Null);
    // Removing again is a no-op.
    server.reset_counters();
    g.remove(&route("a9")).unwrap();
    settled(&g).await;
    assert_eq!(server.requests().total(), 0, "{}", server.requests());
    cancel.cancel();
}

#[tokio::test]
async fn gateway_and_cilium_objects_land_in_their_resources() {
    let server = server(true).await;
    exported_record(&server.client()).await;
    let cancel = CancellationToken::new();
    for (mode, api_version, plural, prefix) in [
        (
            GrantMode::Gateway,
            "gateway.networking.k8s.io/v1",
            "httproutes",
            "route-",
        ),
        (
            GrantMode::Cilium,
            "cilium.io/v2",
            "ciliumnetworkpolicies",
            "cnp-mesh-",
        ),
    ] {
        let g = sink(&server, mode, &cancel);
        let refs = g.apply(&route("b1")).unwrap();
        settled(&g).await;
        let name = policy_object_name(prefix, &[NS, "api", "b1", "web"]);
        assert!(refs[0].ends_with(&format!("/{NS}/{name}")), "{refs:?}");
        let o = server
            .get(api_version, plural, Some(NS), &name)
            .expect(plural);
        assert_eq!(o["metadata"]["labels"][MANAGED_BY_LABEL], "xcc-registry");
        g.remove(&route("b1")).unwrap();
        settled(&g).await;
        assert_eq!(server.get(api_version, plural, Some(NS), &name), None);
    }
    cancel.cancel();
}

#[tokio::test]
async fn an_object_we_do_not_manage_is_never_changed_or_deleted() {
    let server = server(true).await;
    exported_record(&server.client()).await;
    let name = ap_name("b1");
    let theirs = json!({
        "apiVersion": ISTIO, "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": NS, "labels": {"team": "shop"}},
        "spec": {"action": "DENY"},
    });
    server.put_raw(theirs).unwrap();
    let before = server.get(ISTIO, AP, Some(NS), &name).unwrap();
    let cancel = CancellationToken::new();
    let g = sink(&server, GrantMode::Istio, &cancel);
    g.apply(&route("b1")).unwrap();
    let mut rx = g.progress();
    let p = until(&mut rx, "the conflict to be reported", |p| {
        !p.errors.is_empty()
    })
    .await;
    assert_eq!(
        p.errors.values().cloned().collect::<Vec<_>>(),
        [format!(
            "AuthorizationPolicy/{NS}/{name} exists and is not managed by xcc-registry; left alone"
        )]
    );
    assert!(
        g.metrics()
            .errors
            .get_or_create(&kind("AuthorizationPolicy"))
            .get()
            >= 1
    );
    // Reported once on the object itself, however often the grant is retried.
    poll("the conflict event", || {
        server
            .list("events.k8s.io/v1", "events", Some(NS))
            .iter()
            .any(|e| {
                e["type"] == "Warning"
                    && e["reason"] == "GrantConflict"
                    && e["regarding"]["kind"] == "AuthorizationPolicy"
                    && e["regarding"]["name"] == name.as_str()
            })
    })
    .await;
    poll("a retry", || {
        g.metrics()
            .errors
            .get_or_create(&kind("AuthorizationPolicy"))
            .get()
            >= 3
    })
    .await;
    let conflicts: Vec<Value> = server
        .list("events.k8s.io/v1", "events", Some(NS))
        .into_iter()
        .filter(|e| e["reason"] == "GrantConflict")
        .collect();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(
        conflicts[0]["series"],
        Value::Null,
        "not repeated on retries"
    );
    g.remove(&route("b1")).unwrap();
    assert_eq!(settled(&g).await, Progress::default());
    assert_eq!(server.get(ISTIO, AP, Some(NS), &name), Some(before));
    assert_eq!(server.requests().get(AP_RESOURCE, Verb::Delete), 0);
    assert_eq!(server.requests().get(AP_RESOURCE, Verb::Patch), 0);
    cancel.cancel();
}

fn kind(k: &str) -> xcc_registry::federation::kube_grants::KindLabels {
    xcc_registry::federation::kube_grants::KindLabels { kind: k.into() }
}

#[tokio::test]
async fn apply_then_remove_ends_removed_and_the_last_wish_wins() {
    let server = server(true).await;
    exported_record(&server.client()).await;
    let cancel = CancellationToken::new();
    let g = sink(&server, GrantMode::Istio, &cancel);
    g.apply(&route("b1")).unwrap();
    g.remove(&route("b1")).unwrap();
    assert_eq!(settled(&g).await, Progress::default());
    assert_eq!(server.get(ISTIO, AP, Some(NS), &ap_name("b1")), None);
    assert_eq!(status_grants(&server), Value::Null);

    // Interleave with the writer: whatever was in flight, the last call decides.
    for _ in 0..20 {
        g.apply(&route("b1")).unwrap();
        tokio::task::yield_now().await;
        g.remove(&route("b1")).unwrap();
    }
    settled(&g).await;
    assert_eq!(server.get(ISTIO, AP, Some(NS), &ap_name("b1")), None);
    assert_eq!(status_grants(&server), Value::Null);
    for _ in 0..20 {
        g.remove(&route("b1")).unwrap();
        tokio::task::yield_now().await;
        g.apply(&route("b1")).unwrap();
    }
    settled(&g).await;
    assert!(server.get(ISTIO, AP, Some(NS), &ap_name("b1")).is_some());
    assert_eq!(status_grants(&server).as_array().map(Vec::len), Some(1));
    cancel.cancel();
}

#[tokio::test]
async fn a_resource_type_that_is_not_served_is_retried_until_it_is() {
    let server = server(false).await;
    exported_record(&server.client()).await;
    let cancel = CancellationToken::new();
    let store_errors = Counter::default();
    let g = KubeGrants::spawn_with(
        server.client(),
        GrantMode::Istio,
        Backoff {
            min: Duration::from_millis(20),
            max: Duration::from_millis(100),
        },
        store_errors.clone(),
        cancel.clone(),
    );
    g.apply(&route("b1")).unwrap();
    let mut rx = g.progress();
    let p = until(&mut rx, "the missing CRD to be reported", |p| {
        !p.errors.is_empty()
    })
    .await;
    let error = p.errors.get(&format!("{NS}/api <- b1/web")).unwrap();
    assert!(
        error.starts_with(
            "resource authorizationpolicies.security.istio.io (security.istio.io/v1) is not served"
        ),
        "{error}"
    );
    assert_eq!(p.pending, 1);
    // Retried with backoff (more than one attempt), counted, and the process is still fine.
    poll("a retry", || store_errors.get() >= 2).await;
    assert!(
        g.metrics()
            .errors
            .get_or_create(&kind("AuthorizationPolicy"))
            .get()
            >= 2
    );
    // The grant itself is recorded on the record meanwhile.
    assert_eq!(status_grants(&server)[0]["callerCluster"], "b1");

    server
        .register(crds::istio_authorization_policies())
        .unwrap();
    let p = until(&mut rx, "the grant to be applied", |p| p.pending == 0).await;
    assert_eq!(p, Progress::default());
    assert!(server.get(ISTIO, AP, Some(NS), &ap_name("b1")).is_some());
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

fn configmap(data: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": CM, "namespace": "xcc"},
        "data": data.iter().map(|(k, v)| (k.to_string(), Value::from(*v))).collect::<serde_json::Map<_, _>>(),
    }))
    .unwrap()
}

async fn put_configmap(api: &Api<ConfigMap>, data: &[(&str, &str)]) {
    api.patch(
        CM,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&configmap(data)),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn policies_from_a_configmap_applied_rejected_fixed_and_deleted() {
    let server = server(false).await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "xcc");
    let handle: Handle = Arc::new(RwLock::new(Arc::new(Policies::default_set())));
    let errors = FileErrors::default();
    let metrics = Metrics::default();
    let cancel = CancellationToken::new();
    let mut w = spawn_policy_configmap(
        client.clone(),
        "xcc",
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
        &[("deny.cedar", &deny("b1")), ("README", "not a policy")],
    )
    .await;
    poll("the policy to apply", || !allowed(&handle, "b1")).await;
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
        &[("deny.cedar", &deny("b3")), ("broken.cedar", "permit (")],
    )
    .await;
    let reported = until(&mut errs, "the error", |e| !e.is_empty()).await;
    assert_eq!(reported.len(), 1);
    assert!(
        reported[0].starts_with("ConfigMap xcc/xcc-policies: key broken.cedar: "),
        "{reported:?}"
    );
    assert!(!allowed(&handle, "b1"), "previous set kept");
    assert!(
        allowed(&handle, "b3"),
        "the rejected change is not half-applied"
    );
    assert_eq!(metrics.store_errors.get(), 1);
    poll("the Warning event on the ConfigMap", || {
        server
            .list("events.k8s.io/v1", "events", Some("xcc"))
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
    })
    .await;

    // Fixed: applied, error cleared.
    put_configmap(&api, &[("deny.cedar", &deny("b3"))]).await;
    until(&mut errs, "the error to clear", Vec::is_empty).await;
    poll("the fixed policy to apply", || allowed(&handle, "b1")).await;
    assert!(!allowed(&handle, "b3"));
    assert_eq!(metrics.store_errors.get(), 1);

    // Survives a 410 Gone (relist) and keeps following changes.
    server.compact();
    put_configmap(&api, &[("deny.cedar", &deny("b4"))]).await;
    poll("the change after 410 to apply", || !allowed(&handle, "b4")).await;
    assert!(allowed(&handle, "b3"));

    // Deleted: back to the defaults.
    api.delete(CM, &DeleteParams::default()).await.unwrap();
    poll("the defaults", || handle.read().unwrap().is_default_only()).await;
    assert!(allowed(&handle, "b4"));
    assert_eq!(errors.get(), Vec::<String>::new());

    cancel.cancel();
    tokio::time::timeout(WAIT, w.task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_bad_configmap_at_start_keeps_the_defaults_and_another_configmap_is_ignored() {
    let server = server(false).await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "xcc");
    put_configmap(&api, &[("x.cedar", "forbid (")]).await;
    let other: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "unrelated", "namespace": "xcc"},
        "data": {"deny.cedar": deny("b1")},
    }))
    .unwrap();
    api.create(&PostParams::default(), &other).await.unwrap();
    let handle: Handle = Arc::new(RwLock::new(Arc::new(Policies::default_set())));
    let errors = FileErrors::default();
    let cancel = CancellationToken::new();
    let mut w = spawn_policy_configmap(
        client,
        "xcc",
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
        e[0].starts_with("ConfigMap xcc/xcc-policies: key x.cedar: "),
        "{e:?}"
    );
    assert!(handle.read().unwrap().is_default_only());
    assert!(allowed(&handle, "b1"));
    cancel.cancel();
}
