//! Garbage collection through ownerReferences (Background, Foreground, Orphan, several owners),
//! finalizers on dependents, and namespace termination.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use xcc_kube_fake::FakeApiServer;

fn owned_by(name: &str, owners: &[&ConfigMap], block: bool) -> ConfigMap {
    let refs: Vec<Value> = owners
        .iter()
        .map(|o| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": o.name_any(), "uid": o.uid().unwrap(), "blockOwnerDeletion": block}))
        .collect();
    obj(json!({"metadata": {"name": name, "ownerReferences": refs}}))
}

async fn make(api: &Api<ConfigMap>, cm: ConfigMap) -> ConfigMap {
    api.create(&PostParams::default(), &cm).await.unwrap()
}

fn plain(name: &str) -> ConfigMap {
    obj(json!({"metadata": {"name": name}}))
}

fn names(server: &FakeApiServer) -> Vec<String> {
    server
        .list("v1", "configmaps", Some("default"))
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn background_deletion_collects_dependents_recursively() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = make(&api, plain("a")).await;
    let b = make(&api, owned_by("b", &[&a], false)).await;
    make(&api, owned_by("c", &[&b], false)).await;
    make(&api, plain("unrelated")).await;
    let from = server.resource_version().to_string();
    let mut watch = api
        .watch(&WatchParams::default().disable_bookmarks(), &from)
        .await
        .unwrap()
        .boxed();
    api.delete("a", &DeleteParams::background()).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        let (ty, name, _) = describe(&next_event(&mut watch).await);
        got.push(format!("{ty} {name}"));
    }
    assert_eq!(got, vec!["DELETED a", "DELETED b", "DELETED c"]);
    assert_eq!(names(&server), vec!["unrelated"]);
}

#[tokio::test]
async fn dependents_with_another_live_owner_only_lose_the_dangling_reference() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = make(&api, plain("a")).await;
    let x = make(&api, plain("x")).await;
    make(&api, owned_by("d", &[&a, &x], false)).await;
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let d = api.get("d").await.unwrap();
    let refs: Vec<String> = d
        .owner_references()
        .iter()
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(refs, vec!["x"]);
    api.delete("x", &DeleteParams::default()).await.unwrap();
    assert_eq!(names(&server), Vec::<String>::new());
}

#[tokio::test]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = make(&api, plain("a")).await;
    let mut held = owned_by("held", &[&a], true);
    held.meta_mut().finalizers = Some(vec!["example.com/hold".into()]);
    make(&api, held).await;
    make(&api, owned_by("free", &[&a], true)).await;

    let marked = api
        .delete("a", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.finalizers(), ["foregroundDeletion"]);
    // "free" is gone, "held" is being deleted, so "a" waits.
    assert_eq!(names(&server), vec!["a", "held"]);
    assert!(
        api.get("held")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(names(&server), Vec::<String>::new());
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = make(&api, plain("a")).await;
    make(&api, owned_by("b", &[&a], false)).await;
    api.delete("a", &DeleteParams::orphan()).await.unwrap();
    let b = api.get("b").await.unwrap();
    assert_eq!(b.metadata.owner_references, None);
    assert_eq!(names(&server), vec!["b"]);
}

#[tokio::test]
async fn services_owned_by_custom_resources_are_collected() {
    let server = FakeApiServer::start().await;
    server
        .register(xcc_kube_fake::crds::service_records())
        .unwrap();
    let client = server.client();
    let srs: Api<kube::api::DynamicObject> =
        Api::default_namespaced_with(client.clone(), &service_record_resource());
    let sr = srs
        .create(
            &PostParams::default(),
            &service_record("r", "r.example.com", json!([])),
        )
        .await
        .unwrap();
    let svcs: Api<Service> = Api::default_namespaced(client);
    let owner = json!([{"apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord", "name": "r", "uid": sr.uid().unwrap()}]);
    svcs.create(&PostParams::default(), &obj(json!({"metadata": {"name": "r", "ownerReferences": owner}, "spec": {"ports": [{"port": 80}]}})))
        .await
        .unwrap();
    let deleted = srs.delete("r", &DeleteParams::default()).await.unwrap();
    assert!(
        deleted.is_right(),
        "custom resources answer a Status once deleted"
    );
    assert_eq!(status(svcs.get("r").await).code, 404);
}

#[tokio::test]
async fn namespace_deletion_terminates_then_removes() {
    let server = FakeApiServer::builder().namespace("team").start().await;
    let client = server.client();
    let nss: Api<Namespace> = Api::all(client.clone());
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    make(&api, plain("plain")).await;
    make(
        &api,
        obj(json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})),
    )
    .await;

    let terminating = nss
        .delete("team", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    assert_eq!(
        server.list("v1", "configmaps", Some("team")).len(),
        1,
        "only the held object remains"
    );
    let st = status(api.create(&PostParams::default(), &plain("new")).await);
    assert_eq!((st.code, st.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        st.message,
        "configmaps \"new\" is forbidden: unable to create new content in namespace team because it is being terminated"
    );

    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(status(nss.get("team").await).code, 404);

    let st = status(nss.delete("default", &DeleteParams::default()).await);
    assert_eq!(
        (st.code, st.message.as_str()),
        (
            403,
            "namespaces \"default\" is forbidden: this namespace may not be deleted"
        )
    );
}

#[tokio::test]
async fn delete_preconditions_and_collections() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = make(
        &api,
        obj(json!({"metadata": {"name": "a", "labels": {"x": "1"}}})),
    )
    .await;
    make(
        &api,
        obj(json!({"metadata": {"name": "b", "labels": {"x": "1"}}})),
    )
    .await;
    make(&api, plain("c")).await;
    let wrong = DeleteParams::default().preconditions(kube::api::Preconditions {
        uid: Some("nope".into()),
        resource_version: None,
    });
    let st = status(api.delete("a", &wrong).await);
    assert_eq!(
        st.message,
        format!(
            "Operation cannot be fulfilled on configmaps \"a\": Precondition failed: UID in precondition: nope, UID in object meta: {}",
            a.uid().unwrap()
        )
    );
    let gone = api
        .delete_collection(
            &DeleteParams::default(),
            &kube::api::ListParams::default().labels("x=1"),
        )
        .await
        .unwrap();
    let items: Vec<String> = gone
        .left()
        .unwrap()
        .items
        .iter()
        .map(|o| o.name_any())
        .collect();
    assert_eq!(items, vec!["a", "b"]);
    assert_eq!(names(&server), vec!["c"]);
}
