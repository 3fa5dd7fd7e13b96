//! `sync_source` on a real API server (`xcc_testkube`, Contour's HTTPProxy CRD and ours
//! installed), as the publisher's ServiceAccount with exactly `deploy/overlays/exporter`'s
//! RBAC: a labelled proxy's record written, removed with the label, never for an unlabelled
//! proxy; no write when nothing changed (the audit log counts writes), FQDN changes, records the
//! publisher does not own, and the record gone with its proxy through the real garbage collector.

#![allow(clippy::unwrap_used)]

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use xcc_proto::crd::ServiceRecord;
use xcc_proto::names::EXPORT_LABEL;
use xcc_publisher::apply::sync_source;
use xcc_publisher::desired::{Config, Desired, Skip, from_httpproxy};
use xcc_publisher::httpproxy::HTTPProxy;
use xcc_testkube::{ControlPlane, Turn};

/// A namespace of the shared control plane and the publisher's client in it.
struct Env {
    cp: &'static ControlPlane,
    ns: String,
    /// The publisher's ServiceAccount (`deploy/overlays/exporter`).
    client: kube::Client,
    user: String,
    /// Cluster admin, for what the test itself does.
    admin: kube::Client,
    _turn: Turn,
}

async fn env(test: &str) -> Option<Env> {
    let cp = xcc_testkube::shared(test)?;
    let turn = Turn::shared().await;
    install_crds(cp).await;
    let ns = cp.namespace("pub-apply").await;
    let id = cp.identity(&ns, "overlays/exporter", "xcc-publisher").await;
    Some(Env {
        client: id.client().await,
        user: id.user,
        admin: cp.client().await,
        cp,
        ns,
        _turn: turn,
    })
}

/// Contour's HTTPProxy CRD and ours.
async fn install_crds(cp: &ControlPlane) {
    let contour = xcc_testkube::upstream_crds().join("projectcontour.io_httpproxies.yaml");
    cp.apply(&xcc_testkube::yaml_docs(
        &std::fs::read_to_string(contour).unwrap(),
    ))
    .await;
    cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
}

fn proxy(ns: &str, labelled: bool, fqdn: &str) -> HTTPProxy {
    let labels = if labelled {
        json!({EXPORT_LABEL: ""})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "apiVersion": "projectcontour.io/v1", "kind": "HTTPProxy",
        "metadata": {"name": "test", "namespace": ns, "uid": "http-proxy-uid", "labels": labels},
        "spec": {"virtualhost": {"fqdn": fqdn}},
    }))
    .unwrap()
}

fn node(ip: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{ip}")},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "InternalIP", "address": ip}]},
    }))
    .unwrap()
}

/// Store the proxy (so the owner the garbage collector checks exists) and return the uid the
/// server gave it.
async fn stored_proxy(env: &Env) -> String {
    let api: Api<HTTPProxy> = Api::namespaced(env.admin.clone(), &env.ns);
    let mut p = proxy(&env.ns, true, "test.some.domain");
    p.metadata.uid = None;
    api.create(&PostParams::default(), &p)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

fn desired(env: &Env, uid: &str, labelled: bool, fqdn: &str, ips: &[&str]) -> Desired {
    let nodes: Vec<Node> = ips.iter().map(|ip| node(ip)).collect();
    let mut p = proxy(&env.ns, labelled, fqdn);
    p.metadata.uid = Some(uid.to_string());
    from_httpproxy(&p, None, &nodes, &Config::default())
}

fn names(list: &kube::core::ObjectList<ServiceRecord>) -> Vec<String> {
    list.items
        .iter()
        .map(|r| r.metadata.name.clone().unwrap())
        .collect()
}

#[tokio::test]
async fn publish_update_and_unpublish_with_no_write_when_unchanged() {
    let Some(env) = env("publish_update_and_unpublish_with_no_write_when_unchanged").await else {
        return;
    };
    let client = env.client.clone();
    let api: Api<ServiceRecord> = Api::namespaced(env.admin.clone(), &env.ns);
    let uid = stored_proxy(&env).await;

    // A labelled proxy gets its record.
    let outcome = sync_source(
        &client,
        &env.ns,
        &uid,
        &desired(&env, &uid, true, "test.some.domain", &["10.0.0.1"]),
    )
    .await
    .unwrap();
    assert_eq!(outcome.published, Some(("test.some.domain".into(), true)));
    let sr = api.get("test.some.domain").await.unwrap();
    assert_eq!(sr.spec.endpoints.len(), 1);
    assert_eq!(sr.spec.endpoints[0].address, "10.0.0.1");
    assert!(sr.metadata.labels.unwrap().contains_key(EXPORT_LABEL));

    // Unchanged: no write at all.
    let since = std::time::SystemTime::now();
    let outcome = sync_source(
        &client,
        &env.ns,
        &uid,
        &desired(&env, &uid, true, "test.some.domain", &["10.0.0.1"]),
    )
    .await
    .unwrap();
    assert_eq!(outcome.published, Some(("test.some.domain".into(), false)));
    assert_eq!(env.cp.writes_since(&env.user, since), Vec::<String>::new());

    // A node joins: one apply.
    sync_source(
        &client,
        &env.ns,
        &uid,
        &desired(
            &env,
            &uid,
            true,
            "test.some.domain",
            &["10.0.0.2", "10.0.0.1"],
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        api.get("test.some.domain")
            .await
            .unwrap()
            .spec
            .endpoints
            .len(),
        2
    );
    assert_eq!(
        env.cp.writes_since(&env.user, since),
        [format!(
            "patch connectivity.tanzu.vmware.com/servicerecords {}/test.some.domain 200",
            env.ns
        )],
        "one apply"
    );

    // FQDN changed: new record, old one removed.
    let outcome = sync_source(
        &client,
        &env.ns,
        &uid,
        &desired(&env, &uid, true, "new.some.domain", &["10.0.0.1"]),
    )
    .await
    .unwrap();
    assert_eq!(outcome.removed, ["test.some.domain"]);
    assert_eq!(
        names(&api.list(&Default::default()).await.unwrap()),
        ["new.some.domain"]
    );

    // Label removed → the record goes.
    let outcome = sync_source(
        &client,
        &env.ns,
        &uid,
        &desired(&env, &uid, false, "new.some.domain", &["10.0.0.1"]),
    )
    .await
    .unwrap();
    assert_eq!(outcome.skipped, Some(Skip::NotExported));
    assert_eq!(outcome.removed, ["new.some.domain"]);
    assert!(
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn records_the_publisher_does_not_own_are_left_alone() {
    let Some(env) = env("records_the_publisher_does_not_own_are_left_alone").await else {
        return;
    };
    let client = env.client.clone();
    let api: Api<ServiceRecord> = Api::namespaced(env.admin.clone(), &env.ns);
    let foreign: ServiceRecord = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": "test.some.domain", "labels": {EXPORT_LABEL: ""}},
        "spec": {"fqdn": "test.some.domain", "endpoints": [{"address": "192.0.2.1", "port": 443}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &foreign).await.unwrap();
    let uid = stored_proxy(&env).await;

    // Same name, someone else's: reported, not overwritten.
    let outcome = sync_source(
        &client,
        &env.ns,
        &uid,
        &desired(&env, &uid, true, "test.some.domain", &["10.0.0.1"]),
    )
    .await
    .unwrap();
    assert_eq!(outcome.conflict.as_deref(), Some("test.some.domain"));
    assert_eq!(
        api.get("test.some.domain").await.unwrap().spec.endpoints[0].address,
        "192.0.2.1"
    );

    // XCC v1 quirk fixed: an unlabelled proxy never deletes a record it does not own.
    let outcome = sync_source(
        &client,
        &env.ns,
        &uid,
        &desired(&env, &uid, false, "test.some.domain", &[]),
    )
    .await
    .unwrap();
    assert!(outcome.removed.is_empty());
    assert!(api.get_opt("test.some.domain").await.unwrap().is_some());
    assert_eq!(env.cp.forbidden(&env.user), Vec::<String>::new());
}

#[tokio::test]
async fn deleting_the_proxy_removes_its_record() {
    let Some(env) = env("deleting_the_proxy_removes_its_record").await else {
        return;
    };
    let client = env.client.clone();
    let api: Api<ServiceRecord> = Api::namespaced(env.admin.clone(), &env.ns);
    let uid = stored_proxy(&env).await;
    sync_source(
        &client,
        &env.ns,
        &uid,
        &desired(&env, &uid, true, "test.some.domain", &["10.0.0.1"]),
    )
    .await
    .unwrap();
    assert!(api.get_opt("test.some.domain").await.unwrap().is_some());

    // The proxy goes; the real garbage collector follows the controller owner reference. Watch
    // from the record's current version, so the deletion cannot be missed. The collector may
    // only start watching a CRD it just discovered at its next discovery round (30 s).
    let rv = api
        .get("test.some.domain")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(
            &kube::api::WatchParams::default().fields("metadata.name=test.some.domain"),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let proxies: Api<HTTPProxy> = Api::namespaced(env.admin.clone(), &env.ns);
    proxies.delete("test", &Default::default()).await.unwrap();
    let deleted = tokio::time::timeout(std::time::Duration::from_secs(90), async {
        while let Some(event) = events.next().await {
            if matches!(event.unwrap(), kube::api::WatchEvent::Deleted(_)) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(deleted, "record not garbage-collected");
    assert!(api.get_opt("test.some.domain").await.unwrap().is_none());
    // A late reconcile of the deleted proxy (NotFound) is not an error.
    let outcome = sync_source(&client, &env.ns, &uid, &Desired::Skip(Skip::NotExported))
        .await
        .unwrap();
    assert!(outcome.removed.is_empty());
    assert_eq!(env.cp.forbidden(&env.user), Vec::<String>::new());
}
