//! Watches: resumption from a resourceVersion, selector transitions, 410 Gone after compaction
//! or history overflow (and kube-runtime's watcher relisting), bookmarks, timeouts, reflectors
//! and streaming lists.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use xcc_kube_fake::{FakeApiServer, Verb};

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    obj(json!({"metadata": {"name": name, "labels": labels}}))
}

fn ev(ty: &str, name: &str, rv: u64) -> (String, String, String) {
    (ty.into(), name.into(), rv.to_string())
}

#[tokio::test]
async fn watch_from_resource_version_gets_exactly_the_later_events_in_order() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let pp = PostParams::default();
    let a = api.create(&pp, &cm("a", json!({}))).await.unwrap();
    api.create(&pp, &cm("b", json!({}))).await.unwrap();
    let from = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    let c = api.create(&pp, &cm("c", json!({}))).await.unwrap();
    let a2 = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"x": "y"}})),
        )
        .await
        .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();
    let deleted_at = server.resource_version();

    let mut stream = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(describe(&next_event(&mut stream).await));
    }
    assert_eq!(
        got,
        vec![
            ev("ADDED", "c", rv(&c)),
            ev("MODIFIED", "a", rv(&a2)),
            ev("DELETED", "b", deleted_at)
        ]
    );

    // Resuming from the first object's version also replays b's creation.
    let mut stream = api
        .watch(&WatchParams::default(), &a.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    assert_eq!(describe(&next_event(&mut stream).await).1, "b");

    // Live events keep flowing on an open watch.
    let d = api.create(&pp, &cm("d", json!({}))).await.unwrap();
    let mut live = api
        .watch(&WatchParams::default(), &deleted_at.to_string())
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        describe(&next_event(&mut live).await),
        ev("ADDED", "d", rv(&d))
    );
    let e = api.create(&pp, &cm("e", json!({}))).await.unwrap();
    assert_eq!(
        describe(&next_event(&mut live).await),
        ev("ADDED", "e", rv(&e))
    );
}

#[tokio::test]
async fn resource_version_zero_starts_with_the_current_state() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = api
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        describe(&next_event(&mut stream).await),
        ev("ADDED", "a", rv(&a))
    );
    let b = api
        .create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    assert_eq!(
        describe(&next_event(&mut stream).await),
        ev("ADDED", "b", rv(&b))
    );
}

#[tokio::test]
async fn selector_watch_sees_objects_enter_and_leave() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let from = server.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=x"), &from)
        .await
        .unwrap()
        .boxed();
    let label = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"app": v}}}));
    let pp = PatchParams::default();
    api.create(&PostParams::default(), &cm("o", json!({"app": "y"})))
        .await
        .unwrap();
    let entered = api.patch("o", &pp, &label("x")).await.unwrap();
    let stayed = api
        .patch("o", &pp, &Patch::Merge(json!({"data": {"k": "v"}})))
        .await
        .unwrap();
    let left = api.patch("o", &pp, &label("z")).await.unwrap();
    let other = api
        .create(&PostParams::default(), &cm("p", json!({"app": "x"})))
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(describe(&next_event(&mut stream).await));
    }
    assert_eq!(
        got,
        vec![
            ev("ADDED", "o", rv(&entered)),
            ev("MODIFIED", "o", rv(&stayed)),
            ev("DELETED", "o", rv(&left)),
            ev("ADDED", "p", rv(&other)),
        ]
    );
}

#[tokio::test]
async fn compaction_expires_old_versions_with_410() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = api
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let mut open = api
        .watch(&WatchParams::default(), &a.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();

    server.compact();
    // The open watch ends with an ERROR 410 event...
    match next_event(&mut open).await {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {:?}", describe(&other)),
    }
    assert!(
        within(open.next()).await.is_none(),
        "the watch ends after the error"
    );
    // ...and so does resuming from any version handed out before.
    let mut resumed = api
        .watch(&WatchParams::default(), &a.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    let e = next_event(&mut resumed).await;
    assert_eq!(describe(&e).0, "ERROR");
    // A fresh list gives a version that works again.
    let fresh = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut ok = api
        .watch(&WatchParams::default(), &fresh)
        .await
        .unwrap()
        .boxed();
    let b = api
        .create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    assert_eq!(
        describe(&next_event(&mut ok).await),
        ev("ADDED", "b", rv(&b))
    );
}

#[tokio::test]
async fn bounded_history_expires_lagging_versions() {
    let server = FakeApiServer::builder().history_limit(3).start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let first = api
        .create(&PostParams::default(), &cm("a0", json!({})))
        .await
        .unwrap();
    for i in 1..4 {
        api.create(&PostParams::default(), &cm(&format!("a{i}"), json!({})))
            .await
            .unwrap();
    }
    // Events after a0: a1, a2, a3 — exactly the three retained.
    let mut ok = api
        .watch(&WatchParams::default(), &first.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    assert_eq!(describe(&next_event(&mut ok).await).1, "a1");
    api.create(&PostParams::default(), &cm("a4", json!({})))
        .await
        .unwrap();
    let mut gone = api
        .watch(&WatchParams::default(), &first.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        describe(&next_event(&mut gone).await),
        (
            "ERROR".to_string(),
            "Expired".to_string(),
            "410".to_string()
        )
    );
    // An expired continue token is 410 too.
    let page = api.list(&ListParams::default().limit(1)).await.unwrap();
    for i in 5..9 {
        api.create(&PostParams::default(), &cm(&format!("a{i}"), json!({})))
            .await
            .unwrap();
    }
    let st = status(
        api.list(
            &ListParams::default()
                .limit(1)
                .continue_token(page.metadata.continue_.as_deref().unwrap()),
        )
        .await,
    );
    assert_eq!((st.code, st.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn kube_watcher_relists_after_410() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut next = async || within(events.next()).await.expect("watcher ended");
    assert!(matches!(next().await, Ok(watcher::Event::Init)));
    assert!(matches!(next().await, Ok(watcher::Event::InitDone)));
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    assert!(matches!(next().await, Ok(watcher::Event::Apply(o)) if o.name_any() == "a"));

    server.compact();
    match next().await {
        Err(watcher::Error::WatchError(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 watch error, got {other:?}"),
    }
    assert!(matches!(next().await, Ok(watcher::Event::Init)));
    assert!(matches!(next().await, Ok(watcher::Event::InitApply(o)) if o.name_any() == "a"));
    assert!(matches!(next().await, Ok(watcher::Event::InitDone)));
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    assert!(matches!(next().await, Ok(watcher::Event::Apply(o)) if o.name_any() == "b"));
    assert_eq!(
        server.reads().get("configmaps", Verb::List),
        2,
        "one initial list, one relist"
    );
}

#[tokio::test]
async fn bookmarks_on_demand_and_on_interval() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let from = server.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let a = api
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    assert_eq!(describe(&next_event(&mut stream).await).0, "ADDED");
    server.send_bookmarks();
    match next_event(&mut stream).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.metadata.resource_version, a.resource_version().unwrap());
            assert_eq!(
                (b.types.kind.as_str(), b.types.api_version.as_str()),
                ("ConfigMap", "v1")
            );
        }
        other => panic!("expected a bookmark, got {:?}", describe(&other)),
    }
    // Without allowWatchBookmarks no bookmark is sent: the next event is the next change.
    let mut quiet = api
        .watch(&WatchParams::default().disable_bookmarks(), &from)
        .await
        .unwrap()
        .boxed();
    assert_eq!(describe(&next_event(&mut quiet).await).1, "a");
    server.send_bookmarks();
    let b = api
        .create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    assert_eq!(
        describe(&next_event(&mut quiet).await),
        ev("ADDED", "b", rv(&b))
    );

    let ticking = FakeApiServer::builder()
        .bookmark_interval(Duration::from_millis(20))
        .start()
        .await;
    let api: Api<ConfigMap> = Api::default_namespaced(ticking.client());
    let at = ticking.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default(), &at)
        .await
        .unwrap()
        .boxed();
    assert_eq!(
        describe(&next_event(&mut stream).await),
        ("BOOKMARK".to_string(), String::new(), at)
    );
}

#[tokio::test]
async fn timeout_seconds_ends_the_watch() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let from = server.resource_version().to_string();
    let mut stream = api
        .watch(
            &WatchParams::default().timeout(1).disable_bookmarks(),
            &from,
        )
        .await
        .unwrap()
        .boxed();
    assert!(within(stream.try_next()).await.unwrap().is_none());
}

#[tokio::test]
async fn reflector_follows_the_store() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let (reader, writer) = reflector::store();
    let mut stream = reflector(writer, watcher(api.clone(), watcher::Config::default()))
        .applied_objects()
        .boxed();
    for n in ["a", "b", "c"] {
        api.create(&PostParams::default(), &cm(n, json!({})))
            .await
            .unwrap();
        assert_eq!(
            within(stream.try_next())
                .await
                .unwrap()
                .map(|o| o.name_any()),
            Some(n.to_string())
        );
    }
    api.delete("b", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("d", json!({})))
        .await
        .unwrap();
    assert_eq!(
        within(stream.try_next())
            .await
            .unwrap()
            .map(|o| o.name_any()),
        Some("d".to_string())
    );
    let mut names: Vec<String> = reader.state().iter().map(|o| o.name_any()).collect();
    names.sort();
    assert_eq!(names, vec!["a", "c", "d"]);
}

#[tokio::test]
async fn streaming_lists_send_initial_events_and_an_end_bookmark() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    let mut events = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut next = async || within(events.next()).await.expect("watcher ended").unwrap();
    assert!(matches!(next().await, watcher::Event::Init));
    assert!(matches!(next().await, watcher::Event::InitApply(o) if o.name_any() == "a"));
    assert!(matches!(next().await, watcher::Event::InitDone));
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    assert!(matches!(next().await, watcher::Event::Apply(o) if o.name_any() == "b"));
    assert_eq!(
        server.reads().get("configmaps", Verb::List),
        0,
        "no list call in streaming mode"
    );
}

#[tokio::test]
async fn metadata_only_requests_get_partial_object_metadata() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let a = api
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "a", "labels": {"k": "v"}}, "data": {"big": "x"}})),
        )
        .await
        .unwrap();
    let meta = api.get_metadata("a").await.unwrap();
    let types = meta.types.clone().unwrap();
    assert_eq!(
        (types.kind.as_str(), types.api_version.as_str()),
        ("PartialObjectMetadata", "meta.k8s.io/v1")
    );
    assert_eq!(meta.metadata, a.metadata);
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.types.kind, "PartialObjectMetadataList");
    assert_eq!(
        list.items
            .iter()
            .map(|m| m.metadata.name.clone().unwrap())
            .collect::<Vec<_>>(),
        vec!["a"]
    );

    let metadata_api: Api<kube::core::PartialObjectMeta<ConfigMap>> =
        Api::default_namespaced(server.client());
    let mut events = watcher(metadata_api, watcher::Config::default()).boxed();
    let mut next = async || within(events.next()).await.expect("watcher ended").unwrap();
    assert!(matches!(next().await, watcher::Event::Init));
    assert!(
        matches!(next().await, watcher::Event::InitApply(m) if m.metadata.name.as_deref() == Some("a"))
    );
    assert!(matches!(next().await, watcher::Event::InitDone));
    api.create(&PostParams::default(), &cm("b", json!({})))
        .await
        .unwrap();
    match next().await {
        watcher::Event::Apply(m) => {
            assert_eq!(m.metadata.name.as_deref(), Some("b"));
            assert_eq!(m.types.unwrap().kind, "PartialObjectMetadata");
        }
        other => panic!("{other:?}"),
    }
}
