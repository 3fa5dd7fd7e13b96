//! The Kubernetes feed against the in-process fake API server, answering over real sockets:
//! the reference's SD-01..03 end to end, readiness after the first listing, and the pod and
//! namespace watches behind namespace mapping.

#![allow(clippy::unwrap_used)]

mod dns_common;

use std::sync::Arc;

use dns_common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use xcc_dns::answer::{Settings, Snapshot};
use xcc_dns::index::{DnsFeed, DnsIndex};
use xcc_dns::kube_feed::{self, KubeFeedConfig};
use xcc_dns::server::ServerConfig;
use xcc_dns::zone::fqdn_name;
use xcc_kube_fake::FakeApiServer;
use xcc_proto::mapping::{
    NAMESPACE_ANNOTATION, ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION,
};
use xcc_proto::names::FQDN_ANNOTATION;

/// Wait (bounded) until the published snapshot satisfies `pred`.
async fn until(rx: &mut watch::Receiver<Arc<Snapshot>>, pred: impl FnMut(&Arc<Snapshot>) -> bool) {
    tokio::time::timeout(GUARD, rx.wait_for(pred))
        .await
        .expect("the feed never got there")
        .unwrap();
}

fn has_name(s: &Snapshot, name: &str) -> bool {
    let n = fqdn_name(name).unwrap();
    s.zones.find_zone(&n).and_then(|z| z.owner(&n)).is_some()
}

/// Start the fake API server, the Kubernetes feed and a DNS server on top of it.
async fn stack(
    zones: &[&str],
    config: KubeFeedConfig,
    settings: Settings,
) -> (FakeApiServer, Harness, CancellationToken) {
    let api = FakeApiServer::start().await;
    let index = DnsIndex::new(
        zones.iter().map(|z| z.to_string()).collect(),
        config.required_sources(),
    );
    let feed = DnsFeed::new(index);
    let cancel = CancellationToken::new();
    tokio::spawn(kube_feed::run(
        api.client(),
        feed.clone(),
        config,
        cancel.clone(),
    ));
    let dns = start(
        feed,
        ServerConfig {
            settings,
            ..ServerConfig::default()
        },
    )
    .await;
    (api, dns, cancel)
}

fn annotated_service(name: &str, annotations: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"ports": [{"name": "https", "port": 443}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn sd_01_to_03_end_to_end() {
    let (api, dns, cancel) = stack(
        &["some.domain"],
        KubeFeedConfig::default(),
        Settings::default(),
    )
    .await;
    api.ensure_namespace("ns");
    let services: Api<Service> = Api::namespaced(api.client(), "ns");
    let pp = PostParams::default();
    // D1: an unannotated Service in the cluster is not served.
    services
        .create(&pp, &annotated_service("plain", json!({})))
        .await
        .unwrap();
    let created = services
        .create(
            &pp,
            &annotated_service(
                "some-service",
                json!({FQDN_ANNOTATION: "some-service.some.domain"}),
            ),
        )
        .await
        .unwrap();
    // The fake allocates the ClusterIP, as a real API server would.
    let cluster_ip = created.spec.unwrap().cluster_ip.unwrap();

    let mut rx = dns.feed.subscribe();
    until(&mut rx, |s| {
        s.ready && has_name(s, "some-service.some.domain")
    })
    .await;
    assert_eq!(
        rx.borrow().zones.record_names(),
        2,
        "the name and its SRV name only"
    );
    // SD-01
    let m = ask(
        dns.addr,
        Via::Udp,
        "some-service.some.domain.",
        RecordType::A,
    )
    .await;
    assert_eq!(
        lines(&m.answers),
        vec![format!("some-service.some.domain. 5 A {cluster_ip}")]
    );
    let m = ask(
        dns.addr,
        Via::Tcp,
        "_https._tcp.some-service.some.domain.",
        RecordType::SRV,
    )
    .await;
    assert_eq!(
        lines(&m.answers),
        vec!["_https._tcp.some-service.some.domain. 5 SRV 0 100 443 some-service.some.domain."]
    );

    // SD-02: the annotation changes.
    services
        .patch(
            "some-service",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {FQDN_ANNOTATION: "some-edited-service.some.domain"}}})),
        )
        .await
        .unwrap();
    until(&mut rx, |s| has_name(s, "some-edited-service.some.domain")).await;
    let m = ask(
        dns.addr,
        Via::Udp,
        "some-edited-service.some.domain.",
        RecordType::A,
    )
    .await;
    assert_eq!(m.answers.len(), 1);
    let m = ask(
        dns.addr,
        Via::Udp,
        "some-service.some.domain.",
        RecordType::A,
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);

    // SD-03: the Service is deleted.
    services
        .delete("some-service", &DeleteParams::default())
        .await
        .unwrap();
    until(&mut rx, |s| s.zones.record_names() == 0).await;
    let m = ask(
        dns.addr,
        Via::Udp,
        "some-edited-service.some.domain.",
        RecordType::A,
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    cancel.cancel();
}

#[tokio::test]
async fn not_ready_until_the_services_are_listed() {
    // A feed whose watch never lists (no API server behind the client) keeps the server in
    // SERVFAIL; the same index becomes ready once a listing is applied.
    let api = FakeApiServer::start().await;
    let client = api.client();
    api.shutdown().await;
    let config = KubeFeedConfig::default();
    let feed = DnsFeed::new(DnsIndex::new(
        vec!["xcc.test".into()],
        config.required_sources(),
    ));
    let cancel = CancellationToken::new();
    tokio::spawn(kube_feed::run(client, feed.clone(), config, cancel.clone()));
    let dns = start(feed.clone(), ServerConfig::default()).await;
    let m = ask(dns.addr, Via::Udp, "a.xcc.test.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(!feed.snapshot().ready);
    feed.reset_services(vec![]);
    let m = ask(dns.addr, Via::Udp, "a.xcc.test.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    cancel.cancel();
}

#[tokio::test]
async fn pods_and_namespaces_drive_namespace_mapping() {
    let config = KubeFeedConfig {
        pods_and_namespaces: true,
        ..KubeFeedConfig::default()
    };
    let settings = Settings {
        transparent: true,
        ..Settings::default()
    };
    let (api, dns, cancel) = stack(&["clusterset.local"], config, settings).await;
    let client = api.client();
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let foo: Namespace = serde_json::from_value(json!({
        "metadata": {"name": "foo", "annotations": {NAMESPACE_ANNOTATION: "bar"}}
    }))
    .unwrap();
    namespaces.create(&pp, &foo).await.unwrap();
    api.ensure_namespace("xcc");
    let services: Api<Service> = Api::namespaced(client.clone(), "xcc");
    let web = services
        .create(
            &pp,
            &annotated_service(
                "web-bar",
                json!({ORIGIN_NAMESPACE_ANNOTATION: "bar", ORIGIN_NAME_ANNOTATION: "web"}),
            ),
        )
        .await
        .unwrap();
    let web_ip = web.spec.unwrap().cluster_ip.unwrap();
    // A pod in `foo` whose address is the loopback alias the test asks from.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "foo");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "client"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}
    }))
    .unwrap();
    pods.create(&pp, &pod).await.unwrap();
    pods.patch_status(
        "client",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "127.0.0.2", "podIPs": [{"ip": "127.0.0.2"}]}})),
    )
    .await
    .unwrap();

    let mut rx = dns.feed.subscribe();
    until(&mut rx, |s| {
        s.ready
            && has_name(s, "web.bar.svc.clusterset.local")
            && s.pods.namespace_of("127.0.0.2".parse().unwrap()) == Some("foo")
            && s.mapping.clusterset_namespace("foo") == "bar"
    })
    .await;
    for name in ["web.", "web.foo.", "web.foo.svc.clusterset.local."] {
        let m = ask_from(dns.addr, Via::Udp, "127.0.0.2", name, RecordType::A).await;
        assert_eq!(
            lines(&m.answers),
            vec![format!("{name} 5 A {web_ip}")],
            "{name}"
        );
    }

    // Dropping the annotation takes `foo` out of `bar`.
    namespaces
        .patch(
            "foo",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {NAMESPACE_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    until(&mut rx, |s| s.mapping.clusterset_namespace("foo") == "foo").await;
    let m = ask_from(
        dns.addr,
        Via::Udp,
        "127.0.0.2",
        "web.foo.svc.clusterset.local.",
        RecordType::A,
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);

    // The pod goes away: its address no longer has a namespace.
    pods.delete("client", &DeleteParams::default())
        .await
        .unwrap();
    until(&mut rx, |s| {
        s.pods.namespace_of("127.0.0.2".parse().unwrap()).is_none()
    })
    .await;
    cancel.cancel();
}
