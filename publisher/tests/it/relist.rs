//! The publisher controller against the in-process fake API server, for what a real API
//! server cannot be made to do on demand: every watch answered 410 Gone (a compaction) at
//! once. Each watch relists, every source and the owner of every record is reconciled again,
//! nothing is written (the fake counts every write), and changes still flow afterwards.
//! Everything else runs on the real API server (`controller.rs`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use xcc_controller::probes::Health;
use xcc_kube_fake::{FakeApiServer, crds};
use xcc_proto::crd::{Endpoint, ServiceRecord};
use xcc_proto::names::EXPORT_LABEL;
use xcc_publisher::controller::{self, Metrics, Settings};
use xcc_publisher::httpproxy::HTTPProxy;
use xcc_testkube::poll;

const NS: &str = "http-proxy-namespace";
/// The controller's watches, as labelled in its relist metric.
const WATCHES: [&str; 5] = [
    "services",
    "httpproxies",
    "nodes",
    "ingress-service",
    "servicerecords",
];
const TIMEOUT: Duration = Duration::from_secs(15);

fn put_node(server: &FakeApiServer, ip: &str) {
    let mut node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "InternalIP", "address": ip}]},
    });
    if let Some(existing) = server.get("v1", "nodes", None, "node-1") {
        node["metadata"] = existing["metadata"].clone();
    }
    server.put_raw(node).unwrap();
}

fn proxy(name: &str, fqdn: &str) -> HTTPProxy {
    serde_json::from_value(json!({
        "apiVersion": "projectcontour.io/v1", "kind": "HTTPProxy",
        "metadata": {"name": name, "namespace": NS, "labels": {EXPORT_LABEL: ""}},
        "spec": {"virtualhost": {"fqdn": fqdn},
                 "routes": [{"services": [{"name": "foobar", "port": 443}]}]},
    }))
    .unwrap()
}

fn endpoints(server: &FakeApiServer, name: &str) -> Option<Vec<Endpoint>> {
    let record = server.get(
        "connectivity.tanzu.vmware.com/v1alpha1",
        "servicerecords",
        Some(NS),
        name,
    )?;
    Some(
        serde_json::from_value::<ServiceRecord>(record)
            .unwrap()
            .spec
            .endpoints,
    )
}

#[tokio::test]
async fn every_watch_recovers_from_410_gone_without_writing() {
    let server = FakeApiServer::builder()
        .namespace(NS)
        .namespace("projectcontour")
        .resource(crds::service_records())
        .start()
        .await;
    let client = server.client();
    put_node(&server, "10.0.0.1");
    let proxies: Api<HTTPProxy> = Api::namespaced(client.clone(), NS);
    for (name, fqdn) in [("a", "a.some.domain"), ("b", "b.some.domain")] {
        proxies
            .create(&PostParams::default(), &proxy(name, fqdn))
            .await
            .unwrap();
    }
    let cancel = CancellationToken::new();
    let metrics = Metrics::default();
    let health = Health::default();
    let task = tokio::spawn(controller::serve(
        client.clone(),
        Settings::default(),
        metrics.clone(),
        health.clone(),
        None,
        cancel.clone(),
    ));
    tokio::time::timeout(TIMEOUT, health.ready())
        .await
        .expect("timed out waiting for readiness");
    let relists = |watch: &str| {
        metrics
            .relists
            .get_or_create(&vec![("watch".into(), watch.into())])
            .get()
    };
    let ok = || {
        metrics
            .reconciles
            .get_or_create(&vec![("result".into(), "ok".into())])
            .get()
    };

    server.reset_counters();
    let relisted: Vec<u64> = WATCHES.iter().map(|w| relists(w)).collect();
    let before = ok();
    server.compact();
    poll(
        "every watch relisted and the queue drained",
        TIMEOUT,
        || {
            WATCHES.iter().zip(&relisted).all(|(w, n)| relists(w) > *n)
                && metrics.queue_depth.get() == 0
        },
    )
    .await;
    assert!(ok() >= before + 2, "all sources reconciled again");
    let writes = server.writes();
    assert_eq!(writes.total(), 0, "{writes}");

    // After the 410 the watches work again: changes still flow.
    server.compact();
    proxies
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {EXPORT_LABEL: null}}})),
        )
        .await
        .unwrap();
    put_node(&server, "10.0.0.7");
    poll("a removed and b on the new address", TIMEOUT, || {
        endpoints(&server, "a.some.domain").is_none()
            && endpoints(&server, "b.some.domain")
                == Some(vec![Endpoint {
                    address: "10.0.0.7".into(),
                    port: 443,
                }])
    })
    .await;
    cancel.cancel();
    tokio::time::timeout(TIMEOUT, task)
        .await
        .expect("controller did not stop")
        .unwrap()
        .unwrap();
}
