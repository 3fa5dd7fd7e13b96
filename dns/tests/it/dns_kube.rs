//! The Kubernetes feed on a real API server (`xcc_testkube`), as the DNS server's ServiceAccount
//! with exactly the RBAC of `deploy/dns/server` (`deploy/dns/transparent` for namespace mapping),
//! answering over real sockets: an annotated Service appearing, its annotation changing and the
//! Service deleted, end to end, readiness after the first listing, and the pod and namespace
//! watches behind namespace mapping, and the MCS names of ClusterSetIP and headless imports (the
//! binder's EndpointSlices). No request of the feed may be refused.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::dns_common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use xcc_dns::answer::{Settings, Snapshot};
use xcc_dns::index::{DnsFeed, DnsIndex};
use xcc_dns::kube_feed::{self, KubeFeedConfig};
use xcc_dns::server::ServerConfig;
use xcc_dns::zone::fqdn_name;
use xcc_proto::mapping::{
    NAMESPACE_ANNOTATION, ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION,
};
use xcc_proto::names::FQDN_ANNOTATION;
use xcc_testkube::{ControlPlane, Identity};

/// Bound on the feed following the API server (which shares the machine's cores).
const WAIT: Duration = Duration::from_secs(30);

/// Wait (bounded) until the published snapshot satisfies `pred`.
async fn until(rx: &mut watch::Receiver<Arc<Snapshot>>, pred: impl FnMut(&Arc<Snapshot>) -> bool) {
    tokio::time::timeout(WAIT, rx.wait_for(pred))
        .await
        .expect("the feed never got there")
        .unwrap();
}

fn has_name(s: &Snapshot, name: &str) -> bool {
    let n = fqdn_name(name).unwrap();
    s.zones.find_zone(&n).and_then(|z| z.owner(&n)).is_some()
}

/// The DNS server's identity (`deploy/<overlay>`) in a fresh namespace, the Kubernetes feed
/// running as it, and a DNS server on top.
async fn stack(
    cp: &ControlPlane,
    overlay: &str,
    zones: &[&str],
    config: KubeFeedConfig,
    settings: Settings,
) -> (Identity, Harness, CancellationToken) {
    let ns = cp.namespace("dns").await;
    let id = cp.identity(&ns, overlay, "xcc-dns").await;
    let index = DnsIndex::new(
        zones.iter().map(|z| z.to_string()).collect(),
        config.required_sources(),
    );
    let feed = DnsFeed::new(index);
    let cancel = CancellationToken::new();
    tokio::spawn(kube_feed::run(
        id.client().await,
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
    (id, dns, cancel)
}

fn annotated_service(name: &str, annotations: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"ports": [{"name": "https", "port": 443}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn annotated_services_answer_end_to_end() {
    let Some(cp) = xcc_testkube::shared("annotated_services_answer_end_to_end") else {
        return;
    };
    let (id, dns, cancel) = stack(
        cp,
        "dns/server",
        &["some.domain"],
        KubeFeedConfig::default(),
        Settings::default(),
    )
    .await;
    let ns = cp.namespace("sd").await;
    let services: Api<Service> = Api::namespaced(cp.client().await, &ns);
    let pp = PostParams::default();
    // An unannotated Service in the cluster is not served.
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
    // An annotated Service appears.
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

    // The annotation changes.
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

    // The Service is deleted.
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
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
}

#[tokio::test]
async fn not_ready_until_the_services_are_listed() {
    // A feed whose watch never lists (no API server behind the client: a port nothing listens
    // on) keeps the server in SERVFAIL; the same index becomes ready once a listing of
    // Services and of EndpointSlices is applied.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", closed.local_addr().unwrap());
    drop(closed);
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
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
    assert_eq!(
        m.metadata.response_code,
        ResponseCode::ServFail,
        "EndpointSlices not listed yet"
    );
    feed.update(|i| i.reset_slices([]));
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
    let Some(cp) = xcc_testkube::shared("pods_and_namespaces_drive_namespace_mapping") else {
        return;
    };
    let (id, dns, cancel) = stack(
        cp,
        "dns/transparent",
        &["clusterset.local"],
        config,
        settings,
    )
    .await;
    let client = cp.client().await;
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let foo = cp.namespace("foo").await;
    namespaces
        .patch(
            &foo,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {NAMESPACE_ANNOTATION: "bar"}}})),
        )
        .await
        .unwrap();
    let xcc = cp.namespace("xcc").await;
    let services: Api<Service> = Api::namespaced(client.clone(), &xcc);
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
    // A pod in `foo` whose address is the loopback alias the test asks from (admitted once
    // the controller-manager made the namespace's default ServiceAccount).
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &foo);
    let changes = cp
        .changes(Some(&foo), &[("v1", "ServiceAccount", "serviceaccounts")])
        .await;
    changes
        .wait_for("the default ServiceAccount", WAIT, async || {
            accounts.get_opt("default").await.unwrap()
        })
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &foo);
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
            && s.pods.namespace_of("127.0.0.2".parse().unwrap()) == Some(foo.as_str())
            && s.mapping.clusterset_namespace(&foo) == "bar"
    })
    .await;
    for name in [
        "web.".to_string(),
        format!("web.{foo}."),
        format!("web.{foo}.svc.clusterset.local."),
    ] {
        let name = name.as_str();
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
            &foo,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {NAMESPACE_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    until(&mut rx, |s| s.mapping.clusterset_namespace(&foo) == foo).await;
    let m = ask_from(
        dns.addr,
        Via::Udp,
        "127.0.0.2",
        &format!("web.{foo}.svc.clusterset.local."),
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
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
}

/// The MCS names through a running DNS server fed from the API server: a ClusterSetIP
/// import answers with its VIP (the cluster IP of the binder's Service); a headless import
/// (the binder's headless Service and its per-cluster EndpointSlices) answers with the ready
/// endpoints, and `<hostname>.<cluster>.<svc>.<ns>.svc.clusterset.local` with the endpoint of
/// that hostname in that cluster. Slices the binder did not write are not read.
#[tokio::test]
async fn mcs_names_of_cluster_set_ip_and_headless_imports() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use xcc_proto::crd::{
        BINDER_MANAGER, ENDPOINTSLICE_MANAGED_BY_LABEL, ENDPOINTSLICE_SERVICE_NAME_LABEL,
    };
    use xcc_proto::mcs::MCS_SOURCE_CLUSTER_LABEL;

    let Some(cp) = xcc_testkube::shared("mcs_names_of_cluster_set_ip_and_headless_imports") else {
        return;
    };
    let (id, dns, cancel) = stack(
        cp,
        "dns/server",
        &["clusterset.local"],
        KubeFeedConfig::default(),
        Settings::default(),
    )
    .await;
    // The origin namespace is this test's own namespace, so names of other tests never clash.
    let ns = cp.namespace("mcs").await;
    let admin = cp.client().await;
    let services: Api<Service> = Api::namespaced(admin.clone(), &ns);
    let pp = PostParams::default();
    let origin =
        |name: &str| json!({ORIGIN_NAMESPACE_ANNOTATION: ns, ORIGIN_NAME_ANNOTATION: name});
    let vip = services
        .create(&pp, &annotated_service("api-import", origin("api")))
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let headless: Service = serde_json::from_value(json!({
        "metadata": {"name": "db-import", "annotations": origin("db")},
        "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}
    }))
    .unwrap();
    services.create(&pp, &headless).await.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(admin, &ns);
    let slice = |name: &str, managed_by: &str, cluster: &str, endpoints: serde_json::Value| {
        serde_json::from_value::<EndpointSlice>(json!({
            "metadata": {"name": name, "labels": {
                ENDPOINTSLICE_MANAGED_BY_LABEL: managed_by,
                ENDPOINTSLICE_SERVICE_NAME_LABEL: "db-import",
                MCS_SOURCE_CLUSTER_LABEL: cluster}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": endpoints,
        }))
        .unwrap()
    };
    for s in [
        slice(
            "db-east",
            BINDER_MANAGER,
            "east",
            json!([{"addresses": ["10.0.0.1"], "hostname": "db-0"},
                   {"addresses": ["10.0.0.2"]},
                   {"addresses": ["10.0.0.3"], "hostname": "db-2", "conditions": {"ready": false}}]),
        ),
        slice(
            "db-west",
            BINDER_MANAGER,
            "west",
            json!([{"addresses": ["10.1.0.1"], "hostname": "db-0"}]),
        ),
        slice(
            "db-other",
            "endpointslice-controller.k8s.io",
            "north",
            json!([{"addresses": ["10.2.0.1"], "hostname": "db-9"}]),
        ),
    ] {
        slices.create(&pp, &s).await.unwrap();
    }
    let name = |host: &str| format!("{host}.{ns}.svc.clusterset.local.");
    let mut rx = dns.feed.subscribe();
    until(&mut rx, |s| {
        s.ready
            && has_name(s, &name("api"))
            && has_name(s, &name("db-0.east.db"))
            && has_name(s, &name("db-0.west.db"))
    })
    .await;

    let a = async |n: &str| lines(&ask(dns.addr, Via::Udp, n, RecordType::A).await.answers);
    assert_eq!(
        a(&name("api")).await,
        [format!("{} 5 A {vip}", name("api"))]
    );
    assert_eq!(
        a(&name("db")).await,
        ["10.0.0.1", "10.0.0.2", "10.1.0.1"].map(|ip| format!("{} 5 A {ip}", name("db")))
    );
    for (host, ip) in [("db-0.east.db", "10.0.0.1"), ("db-0.west.db", "10.1.0.1")] {
        assert_eq!(a(&name(host)).await, [format!("{} 5 A {ip}", name(host))]);
    }
    for absent in ["db-2.east.db", "db-9.north.db"] {
        let m = ask(dns.addr, Via::Udp, &name(absent), RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{absent}");
    }

    // The west slice goes: so do its endpoint and its hostname's name.
    slices
        .delete("db-west", &DeleteParams::default())
        .await
        .unwrap();
    until(&mut rx, |s| !has_name(s, &name("db-0.west.db"))).await;
    assert_eq!(
        a(&name("db")).await,
        ["10.0.0.1", "10.0.0.2"].map(|ip| format!("{} 5 A {ip}", name("db")))
    );
    cancel.cancel();
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
}
