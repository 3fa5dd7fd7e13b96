use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use xcc_proto::crd::{MANAGED_BY_LABEL, PUBLISHER_MANAGER};
use xcc_proto::names::EXPORT_LABEL;

use super::watches::spawn_watch;
use super::*;

#[test]
fn namespaced_names_parse() {
    assert_eq!(
        parse_namespaced_name("projectcontour/envoy"),
        Ok(("projectcontour".into(), "envoy".into()))
    );
    for bad in ["envoy", "/envoy", "projectcontour/", "a/b/c", ""] {
        assert_eq!(
            parse_namespaced_name(bad),
            Err(NotNamespacedName(bad.into())),
            "{bad}"
        );
    }
    assert_eq!(
        NotNamespacedName("envoy".into()).to_string(),
        r#""envoy" is not namespace/name"#
    );
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let mut d = Settings::default().backoff.delays();
    let got: Vec<u128> = (0..13).map(|_| d.next_delay().as_millis()).collect();
    assert_eq!(
        got,
        [
            100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 51200, 102400, 204800, 300000
        ]
    );
}

#[test]
fn records_map_to_their_source() {
    let record: ServiceRecord = serde_json::from_value(serde_json::json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": "a.b", "namespace": "ns",
            "labels": {EXPORT_LABEL: "", MANAGED_BY_LABEL: PUBLISHER_MANAGER},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web",
                                 "uid": "u", "controller": true}]},
        "spec": {"fqdn": "a.b", "endpoints": []},
    }))
    .unwrap();
    assert_eq!(
        SourceKey::owning(&record),
        Some(SourceKey {
            kind: SourceKind::Service,
            namespace: "ns".into(),
            name: "web".into()
        })
    );
}

fn service(name: &str) -> Service {
    Service {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A watch whose stream ends while the publisher runs stops it, naming the watch, and the
/// other tasks are told to stop; what it delivered before was applied.
#[tokio::test]
async fn a_watch_that_ends_early_stops_the_publisher_naming_it() {
    let tasks = Tasks::new(CancellationToken::new());
    let spawner = tasks.spawner().clone();
    let (services, writer) = reflector::store::<Service>();
    let events = futures::stream::iter([
        Ok(Event::Init),
        Ok(Event::InitApply(service("web"))),
        Ok(Event::InitDone),
    ]);
    let seen = Arc::new(AtomicU64::new(0));
    let count = seen.clone();
    spawn_watch(
        &spawner,
        events,
        writer,
        "services",
        Metrics::default(),
        move |_| {
            count.fetch_add(1, Ordering::Relaxed);
        },
    );
    let (_, nodes) = reflector::store::<Node>();
    spawn_watch(
        &spawner,
        futures::stream::pending(),
        nodes,
        "nodes",
        Metrics::default(),
        |_| {},
    );
    let err = tasks
        .run()
        .await
        .expect_err("the ended watch stops the run");
    assert!(
        matches!(&err, xcc_controller::tasks::TaskError::Returned { task } if task == "watch services"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "task `watch services` stopped before shutdown"
    );
    assert!(
        spawner.token().is_cancelled(),
        "the other watch was told to stop"
    );
    assert_eq!(seen.load(Ordering::Relaxed), 3);
    assert_eq!(services.state().len(), 1);
}

/// Watches that are still open when the process shuts down end without an error.
#[tokio::test]
async fn open_watches_end_quietly_on_shutdown() {
    let cancel = CancellationToken::new();
    let tasks = Tasks::new(cancel.clone());
    let (_, writer) = reflector::store::<Service>();
    spawn_watch(
        tasks.spawner(),
        futures::stream::pending(),
        writer,
        "services",
        Metrics::default(),
        |_| {},
    );
    cancel.cancel();
    assert!(tasks.run().await.is_ok());
}
