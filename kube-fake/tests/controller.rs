//! A kube-runtime `Controller` end to end against the fake: it owns what it writes with
//! server-side apply, converges, writes nothing at steady state, and its objects are garbage
//! collected with their owner.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use xcc_kube_fake::{FakeApiServer, Verb};

const MANAGER: &str = "mirror-controller";

#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Error(#[from] kube::Error);

/// Mirrors each labelled ConfigMap into a Secret of the same name, owned by the ConfigMap.
async fn reconcile(cm: Arc<ConfigMap>, secrets: Arc<Api<Secret>>) -> Result<Action, Error> {
    let owner = cm.controller_owner_ref(&()).unwrap();
    let desired = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": cm.name_any(), "ownerReferences": [owner]},
        "stringData": cm.data.clone().unwrap_or_default(),
    });
    secrets
        .patch(
            &cm.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&desired),
        )
        .await?;
    Ok(Action::await_change())
}

#[tokio::test]
async fn controller_converges_then_writes_nothing() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let mut secret_events = secrets
        .watch(
            &WatchParams::default().disable_bookmarks(),
            &server.resource_version().to_string(),
        )
        .await
        .unwrap()
        .boxed();

    let mut results = Controller::new(cms.clone(), watcher::Config::default().labels("mirror=yes"))
        .owns(secrets.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_, _: &Error, _| Action::await_change(),
            Arc::new(secrets.clone()),
        )
        .boxed();

    cms.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "cfg", "labels": {"mirror": "yes"}}, "data": {"k": "v"}})),
    )
    .await
    .unwrap();
    // Reconcile of the ConfigMap, then of the Secret it now owns (owner trigger).
    for _ in 0..2 {
        let (obj, _) = within(results.next()).await.unwrap().unwrap();
        assert_eq!(obj.name, "cfg");
    }
    assert_eq!(describe(&next_event(&mut secret_events).await).0, "ADDED");
    let secret = secrets.get("cfg").await.unwrap();
    assert_eq!(secret.data.as_ref().unwrap()["k"].0, b"v");
    assert_eq!(secret.owner_references()[0].name, "cfg");
    assert_eq!(server.requests().get("secrets", Verb::Patch), 2);
    assert_eq!(
        server.writes().get("secrets", Verb::Patch),
        1,
        "the second apply is a no-op"
    );

    // A change to the ConfigMap flows through.
    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    let (obj, _) = within(results.next()).await.unwrap().unwrap();
    assert_eq!(obj.name, "cfg");
    assert_eq!(
        describe(&next_event(&mut secret_events).await).0,
        "MODIFIED"
    );
    assert_eq!(secrets.get("cfg").await.unwrap().data.unwrap()["k"].0, b"w");

    // Deleting the owner collects the Secret.
    cms.delete("cfg", &DeleteParams::default()).await.unwrap();
    assert_eq!(describe(&next_event(&mut secret_events).await).0, "DELETED");
}
