//! What the fake is kept for: compaction answers every watch with 410 Gone, and only writes
//! that changed stored state are counted.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use xcc_kube_fake::FakeApiServer;

const WAIT: Duration = Duration::from_secs(10);

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": value}})).unwrap()
}

/// `(type, name or reason, code)` of the next event, for exact assertions.
async fn next<S>(s: &mut S) -> (String, String, u16)
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    let e = tokio::time::timeout(WAIT, s.next())
        .await
        .expect("timed out")
        .expect("watch ended")
        .expect("watch error");
    match e {
        WatchEvent::Added(o) => ("ADDED".into(), o.metadata.name.unwrap(), 0),
        WatchEvent::Error(e) => ("ERROR".into(), e.reason, e.code),
        other => panic!("unexpected event {other:?}"),
    }
}

#[tokio::test]
async fn compaction_answers_open_and_resumed_watches_with_410_until_a_relist() {
    let server = FakeApiServer::builder().start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = api
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let old = a.metadata.resource_version.unwrap();
    let mut open = api
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();

    server.compact();
    let gone = ("ERROR".to_string(), "Expired".to_string(), 410);
    assert_eq!(next(&mut open).await, gone);
    let end = tokio::time::timeout(WAIT, open.next()).await.unwrap();
    assert!(end.is_none(), "the watch ends after the error");
    let mut resumed = api
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    assert_eq!(next(&mut resumed).await, gone);

    let fresh = api.list(&ListParams::default()).await.unwrap();
    let fresh = fresh.metadata.resource_version.unwrap();
    let mut ok = api
        .watch(&WatchParams::default(), &fresh)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("b", "1"))
        .await
        .unwrap();
    assert_eq!(
        next(&mut ok).await,
        ("ADDED".to_string(), "b".to_string(), 0)
    );
}

#[tokio::test]
async fn only_writes_that_change_state_are_counted() {
    let server = FakeApiServer::builder().start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    server.reset_counters();
    let a = api
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let merge = |v: &str| Patch::Merge(json!({"data": {"k": v}}));
    api.replace("a", &PostParams::default(), &a).await.unwrap();
    api.patch("a", &PatchParams::default(), &merge("1"))
        .await
        .unwrap();
    api.patch("a", &PatchParams::default(), &merge("2"))
        .await
        .unwrap();
    let refused = api.create(&PostParams::default(), &cm("a", "3")).await;
    assert!(matches!(refused, Err(kube::Error::Api(s)) if s.code == 409));
    api.get("a").await.unwrap();

    assert_eq!(
        server.writes().to_string(),
        "create configmaps: 1, patch configmaps: 1"
    );
    let stored = server
        .get("v1", "configmaps", Some("default"), "a")
        .unwrap();
    assert_eq!(stored["data"], json!({"k": "2"}));
    server.reset_counters();
    assert_eq!(server.writes().total(), 0);
    assert_eq!(server.list("v1", "configmaps", None).len(), 1);
    let _: Value = server
        .put_raw(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "raw", "namespace": "default"}}))
        .unwrap();
    assert_eq!(server.writes().total(), 0, "put_raw is not a request");
}
