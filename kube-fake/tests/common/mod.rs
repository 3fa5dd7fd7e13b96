//! Helpers shared by the integration tests: bounded waits (no sleeps), API error extraction and
//! object builders.
#![allow(dead_code, clippy::unwrap_used)]

use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::{ApiResource, DynamicObject, WatchEvent};
use kube::core::{GroupVersionKind, Status};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Upper bound for anything a test waits for.
pub const WAIT: Duration = Duration::from_secs(10);

/// Awaits `f`, failing the test if it takes longer than [`WAIT`].
pub async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("timed out waiting")
}

/// The `metav1.Status` of a failed kube call.
pub fn status<T: std::fmt::Debug>(r: kube::Result<T>) -> Box<Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Builds a typed object from JSON.
pub fn obj<K: DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).unwrap()
}

/// The next event of a raw watch stream.
pub async fn next_event<K, S>(s: &mut S) -> WatchEvent<K>
where
    S: Stream<Item = kube::Result<WatchEvent<K>>> + Unpin,
{
    within(s.next())
        .await
        .expect("watch ended")
        .expect("watch error")
}

/// `(type, name, resourceVersion)` of a watch event, for exact assertions.
pub fn describe<K: kube::Resource>(e: &WatchEvent<K>) -> (String, String, String) {
    let (ty, o) = match e {
        WatchEvent::Added(o) => ("ADDED", o),
        WatchEvent::Modified(o) => ("MODIFIED", o),
        WatchEvent::Deleted(o) => ("DELETED", o),
        WatchEvent::Bookmark(b) => {
            return (
                "BOOKMARK".into(),
                String::new(),
                b.metadata.resource_version.clone(),
            );
        }
        WatchEvent::Error(e) => return ("ERROR".into(), e.reason.clone(), e.code.to_string()),
    };
    let m = o.meta();
    (
        ty.into(),
        m.name.clone().unwrap_or_default(),
        m.resource_version.clone().unwrap_or_default(),
    )
}

/// The ServiceRecord resource as kube sees it.
pub fn service_record_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("connectivity.tanzu.vmware.com", "v1alpha1", "ServiceRecord"),
        "servicerecords",
    )
}

/// A ServiceRecord object.
pub fn service_record(name: &str, fqdn: &str, endpoints: Value) -> DynamicObject {
    obj(serde_json::json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
        "kind": "ServiceRecord",
        "metadata": {"name": name},
        "spec": {"fqdn": fqdn, "endpoints": endpoints},
    }))
}

/// The resourceVersion of an object as a number.
pub fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .unwrap_or_default()
        .parse()
        .unwrap()
}
