//! The binder controller against the in-process fake API server, for what a real API server cannot
//! be made to do on demand: every watch answered 410 Gone (a compaction) at once. No writes at
//! steady state across the forced relist: each of the five watches relists, every key is reconciled
//! again, nothing is written (the fake counts every write), and changes still flow afterwards.
//! Everything else runs on the real API server (`controller.rs`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use xcc_binder::controller::{Config, Controller, Metrics};
use xcc_controller::probes::Health;
use xcc_kube_fake::{FakeApiServer, crds};
use xcc_proto::crd::ServiceRecord;
use xcc_proto::names::service_name;
use xcc_testkube::poll;

const NS: &str = "cross-cluster-connectivity";
const TIMEOUT: Duration = Duration::from_secs(15);

async fn import(records: &Api<ServiceRecord>, fqdn: &str, address: &str) {
    let sr: ServiceRecord = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": format!("{fqdn}-rr"),
                     "annotations": {"connectivity.tanzu.vmware.com/service-port": "443"},
                     "labels": {"connectivity.tanzu.vmware.com/imported": "",
                                "connectivity.tanzu.vmware.com/remote-registry": "rr"}},
        "spec": {"fqdn": fqdn, "endpoints": [{"address": address, "port": 443}]},
    }))
    .unwrap();
    records.create(&PostParams::default(), &sr).await.unwrap();
}

#[tokio::test]
async fn no_writes_across_a_forced_relist() {
    let mut b = FakeApiServer::builder().namespace(NS);
    for spec in crds::all() {
        b = b.resource(spec);
    }
    let server = b.start().await;
    let records: Api<ServiceRecord> = Api::namespaced(server.client(), NS);
    import(&records, "a.some.domain", "10.0.0.1").await;
    import(&records, "b.some.domain", "10.0.0.2").await;
    let controller = Controller::new(
        server.client(),
        Config::new(NS),
        Metrics::default(),
        Health::default(),
    );
    let handle = controller.handle();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(controller.run(cancel.clone()));
    poll("first sync", TIMEOUT, || {
        handle.is_ready() && handle.is_idle()
    })
    .await;
    let endpoints = |fqdn: &str| server.get("v1", "endpoints", Some(NS), &service_name(fqdn));
    assert!(endpoints("a.some.domain").is_some());

    server.reset_counters();
    let (relists, reconciles) = (handle.relists(), handle.reconciles());
    server.compact();
    poll("five relists, every key reconciled", TIMEOUT, || {
        handle.relists() >= relists + 5 && handle.reconciles() >= reconciles + 2 && handle.is_idle()
    })
    .await;
    assert_eq!(server.writes().total(), 0, "{:?}", server.writes());

    // The watches work again: a new import is materialised.
    import(&records, "c.some.domain", "10.0.0.3").await;
    poll("the new import's Endpoints", TIMEOUT, || {
        endpoints("c.some.domain").is_some()
    })
    .await;
    cancel.cancel();
    tokio::time::timeout(TIMEOUT, task)
        .await
        .expect("the controller stops on cancel")
        .unwrap()
        .unwrap();
}
