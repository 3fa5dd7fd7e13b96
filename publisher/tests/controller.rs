//! The publisher controller running in-process against the fake API server: reference §5.4
//! PUB-* cases that need a running controller, NEW-05, Services, conflicts, zero writes at steady
//! state, recovery after 410 Gone and leader election. Every wait polls the fake's state with a
//! timeout; nothing sleeps for synchronisation.

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use xcc_controller::leader::LeaderConfig;
use xcc_controller::probes::Health;
use xcc_kube_fake::{FakeApiServer, Verb, crds};
use xcc_proto::crd::{Endpoint, ServiceRecord};
use xcc_proto::names::{CLUSTERS_ANNOTATION, EXPORT_LABEL, FQDN_ANNOTATION};
use xcc_publisher::controller::{self, LEASE_NAME, Metrics, Settings};
use xcc_publisher::desired::Config;
use xcc_publisher::httpproxy::HTTPProxy;

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

/// Poll `check` every 20 ms until it returns `Some`, or fail after [`TIMEOUT`].
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn server() -> FakeApiServer {
    FakeApiServer::builder()
        .namespace(NS)
        .namespace("db")
        .namespace("projectcontour")
        .namespace("xcc")
        .resource(crds::service_records())
        .start()
        .await
}

struct Running {
    cancel: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
    metrics: Metrics,
    health: Health,
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(TIMEOUT, self.task)
            .await
            .expect("controller did not stop")
            .unwrap()
            .unwrap();
    }

    fn relists(&self, watch: &str) -> u64 {
        self.metrics
            .relists
            .get_or_create(&vec![("watch".into(), watch.into())])
            .get()
    }

    fn ok_reconciles(&self) -> u64 {
        self.metrics
            .reconciles
            .get_or_create(&vec![("result".into(), "ok".into())])
            .get()
    }
}

fn settings() -> Settings {
    Settings {
        config: Config {
            ingress_port: 443,
            cluster: Some("cluster-a".into()),
        },
        ..Settings::default()
    }
}

/// Start the controller and wait until it reports ready.
async fn start(server: &FakeApiServer, leader: Option<LeaderConfig>) -> Running {
    let cancel = CancellationToken::new();
    let metrics = Metrics::default();
    let health = Health::default();
    let task = tokio::spawn(controller::serve(
        server.client(),
        settings(),
        metrics.clone(),
        health.clone(),
        leader,
        cancel.clone(),
    ));
    let h = health.clone();
    wait_for("readiness", || {
        let ready = h.is_ready();
        async move { ready.then_some(()) }
    })
    .await;
    Running {
        cancel,
        task,
        metrics,
        health,
    }
}

fn node_json(name: &str, ip: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                   "addresses": [{"type": "InternalIP", "address": ip}]},
    })
}

fn put_node(server: &FakeApiServer, name: &str, ip: &str, ready: bool) {
    let mut node = node_json(name, ip, ready);
    if let Some(existing) = server.get("v1", "nodes", None, name) {
        node["metadata"] = existing["metadata"].clone();
    }
    server.put_raw(node).unwrap();
}

fn proxy(name: &str, labelled: bool, fqdn: Option<&str>) -> HTTPProxy {
    let labels = if labelled {
        json!({EXPORT_LABEL: ""})
    } else {
        json!({})
    };
    let spec = match fqdn {
        Some(fqdn) => json!({"virtualhost": {"fqdn": fqdn},
                             "routes": [{"services": [{"name": "foobar", "port": 443}]}]}),
        None => json!({"routes": [{"services": [{"name": "foobar", "port": 443}]}]}),
    };
    serde_json::from_value(json!({
        "apiVersion": "projectcontour.io/v1", "kind": "HTTPProxy",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": spec,
    }))
    .unwrap()
}

fn ep(address: &str, port: i32) -> Endpoint {
    Endpoint {
        address: address.into(),
        port,
    }
}

async fn record(api: &Api<ServiceRecord>, name: &str) -> Option<ServiceRecord> {
    api.get_opt(name).await.unwrap()
}

/// Wait until record `name` exists with exactly `endpoints`.
async fn wait_endpoints(api: &Api<ServiceRecord>, name: &str, endpoints: &[Endpoint]) {
    wait_for(&format!("{name} with endpoints {endpoints:?}"), || async {
        record(api, name)
            .await
            .filter(|r| r.spec.endpoints == endpoints)
            .map(|_| ())
    })
    .await;
}

async fn wait_gone(api: &Api<ServiceRecord>, name: &str) {
    wait_for(&format!("{name} removed"), || async {
        record(api, name).await.is_none().then_some(())
    })
    .await;
}

/// Events (events.k8s.io) about `name` with `reason`, in any namespace.
async fn events(server: &FakeApiServer, name: &str, reason: &str) -> Vec<K8sEvent> {
    Api::<K8sEvent>::all(server.client())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
}

async fn wait_event(server: &FakeApiServer, name: &str, reason: &str) -> K8sEvent {
    wait_for(&format!("{reason} Event on {name}"), || async {
        events(server, name, reason).await.into_iter().next()
    })
    .await
}

async fn set_label(proxies: &Api<HTTPProxy>, name: &str, labelled: bool) {
    let labels = if labelled {
        json!({EXPORT_LABEL: ""})
    } else {
        json!({EXPORT_LABEL: null})
    };
    proxies
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn an_exported_proxy_follows_its_label_nodes_ingress_and_fqdn() {
    let server = server().await;
    let client = server.client();
    put_node(&server, "node-1", "10.0.0.1", true);
    let running = start(&server, None).await;
    let proxies: Api<HTTPProxy> = Api::namespaced(client.clone(), NS);
    let records: Api<ServiceRecord> = Api::namespaced(client.clone(), NS);

    // PUB-01: label an HTTPProxy → its record appears with the node's address on 443.
    let created = proxies
        .create(
            &PostParams::default(),
            &proxy("test", true, Some("test.some.domain")),
        )
        .await
        .unwrap();
    wait_endpoints(&records, "test.some.domain", &[ep("10.0.0.1", 443)]).await;
    let sr = record(&records, "test.some.domain").await.unwrap();
    let owner = &sr.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            Some(owner.uid.as_str())
        ),
        ("HTTPProxy", "test", created.metadata.uid.as_deref())
    );
    let origin = sr.spec.origin.as_ref().unwrap();
    assert_eq!(origin.cluster.as_deref(), Some("cluster-a"));
    assert_eq!(
        sr.metadata.annotations.as_ref().unwrap()["connectivity.tanzu.vmware.com/service-port"],
        "443"
    );
    let published = wait_event(&server, "test", "Published").await;
    assert_eq!(
        published.reporting_controller.as_deref(),
        Some("xcc-publisher")
    );

    // PUB-04 through a running controller: the node turns NotReady → no endpoints.
    put_node(&server, "node-1", "10.0.0.1", false);
    wait_endpoints(&records, "test.some.domain", &[]).await;
    // Ready again with a new address → the endpoints follow.
    put_node(&server, "node-1", "10.0.0.9", true);
    wait_endpoints(&records, "test.some.domain", &[ep("10.0.0.9", 443)]).await;
    // A second node joins.
    put_node(&server, "node-2", "10.0.0.2", true);
    wait_endpoints(
        &records,
        "test.some.domain",
        &[ep("10.0.0.2", 443), ep("10.0.0.9", 443)],
    )
    .await;

    // The ingress Service gets a LoadBalancer address → endpoints switch to it.
    let services: Api<Service> = Api::namespaced(client.clone(), "projectcontour");
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "envoy"},
                "spec": {"type": "LoadBalancer", "ports": [{"name": "https", "port": 443}]},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    services
        .patch_status(
            "envoy",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.5"}]}}}),
            ),
        )
        .await
        .unwrap();
    wait_endpoints(&records, "test.some.domain", &[ep("203.0.113.5", 443)]).await;

    // FQDN changed → the old record goes, the new one is there.
    proxies
        .patch(
            "test",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"virtualhost": {"fqdn": "new.some.domain"}}})),
        )
        .await
        .unwrap();
    wait_endpoints(&records, "new.some.domain", &[ep("203.0.113.5", 443)]).await;
    wait_gone(&records, "test.some.domain").await;
    let removed = wait_event(&server, "test", "Removed").await;
    assert_eq!(
        removed.note.as_deref(),
        Some("removed ServiceRecord test.some.domain")
    );

    // PUB-07: label removed → record gone, and a Removed Event.
    set_label(&proxies, "test", false).await;
    wait_gone(&records, "new.some.domain").await;
    let note = "no longer exported; removed ServiceRecord new.some.domain";
    wait_for("the Removed Event of the unlabelled proxy", || async {
        events(&server, "test", "Removed")
            .await
            .iter()
            .any(|e| e.note.as_deref() == Some(note))
            .then_some(())
    })
    .await;

    // Labelled again → back; drift (someone edits the record) is repaired.
    set_label(&proxies, "test", true).await;
    wait_endpoints(&records, "new.some.domain", &[ep("203.0.113.5", 443)]).await;
    records
        .patch(
            "new.some.domain",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(json!({
                "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
                "spec": {"fqdn": "new.some.domain", "endpoints": [{"address": "192.0.2.66", "port": 443}]},
            })),
        )
        .await
        .unwrap();
    wait_endpoints(&records, "new.some.domain", &[ep("203.0.113.5", 443)]).await;
    // A record deleted behind the publisher's back comes back.
    records
        .delete("new.some.domain", &DeleteParams::default())
        .await
        .unwrap();
    wait_endpoints(&records, "new.some.domain", &[ep("203.0.113.5", 443)]).await;

    // PUB-09: proxy deleted → record gone.
    proxies
        .delete("test", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&records, "new.some.domain").await;
    assert!(running.ok_reconciles() > 0, "reconciles are counted");
    running.stop().await;
}

#[tokio::test]
async fn services_of_each_type_are_exported_with_allowed_requesters() {
    let server = server().await;
    let client = server.client();
    put_node(&server, "node-1", "10.0.0.1", true);
    put_node(&server, "node-2", "10.0.0.2", false);
    let running = start(&server, None).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "db");
    let records: Api<ServiceRecord> = Api::namespaced(client.clone(), "db");
    let svc = |name: &str, type_: &str, fqdn: &str| -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {EXPORT_LABEL: ""},
                         "annotations": {FQDN_ANNOTATION: fqdn, CLUSTERS_ANNOTATION: "beta, alpha"}},
            "spec": {"type": type_, "selector": {"app": name},
                     "ports": [{"name": "mysql", "port": 3306, "protocol": "TCP"}]},
        }))
        .unwrap()
    };

    // ClusterIP: the allocated cluster IP on the service port.
    let cip = services
        .create(
            &PostParams::default(),
            &svc("cip", "ClusterIP", "cip.db.example"),
        )
        .await
        .unwrap();
    let cluster_ip = cip.spec.unwrap().cluster_ip.unwrap();
    wait_endpoints(&records, "cip.db.example", &[ep(&cluster_ip, 3306)]).await;
    let sr = record(&records, "cip.db.example").await.unwrap();
    assert_eq!(
        sr.spec.allowed_requesters,
        Some(vec!["alpha".to_string(), "beta".to_string()])
    );
    assert_eq!(
        sr.spec.origin.as_ref().unwrap().kind.as_deref(),
        Some("Service")
    );

    // NodePort: each ready node on the allocated node port.
    let np = services
        .create(
            &PostParams::default(),
            &svc("np", "NodePort", "np.db.example"),
        )
        .await
        .unwrap();
    let node_port = np.spec.unwrap().ports.unwrap()[0].node_port.unwrap();
    wait_endpoints(&records, "np.db.example", &[ep("10.0.0.1", node_port)]).await;
    // node-2 becomes ready → NodePort endpoints follow the nodes too.
    put_node(&server, "node-2", "10.0.0.2", true);
    wait_endpoints(
        &records,
        "np.db.example",
        &[ep("10.0.0.1", node_port), ep("10.0.0.2", node_port)],
    )
    .await;

    // LoadBalancer: no endpoints until provisioned, then the ingress address.
    services
        .create(
            &PostParams::default(),
            &svc("lb", "LoadBalancer", "lb.db.example"),
        )
        .await
        .unwrap();
    wait_endpoints(&records, "lb.db.example", &[]).await;
    services
        .patch_status(
            "lb",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}}),
            ),
        )
        .await
        .unwrap();
    wait_endpoints(&records, "lb.db.example", &[ep("198.51.100.7", 3306)]).await;

    // Label removed from a Service → its record goes.
    services
        .patch(
            "cip",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {EXPORT_LABEL: null}}})),
        )
        .await
        .unwrap();
    wait_gone(&records, "cip.db.example").await;
    // An invalid FQDN is reported as Skipped, with the reason.
    services
        .create(
            &PostParams::default(),
            &svc("bad", "ClusterIP", "-bad-.example"),
        )
        .await
        .unwrap();
    let skipped = wait_event(&server, "bad", "Skipped").await;
    assert!(
        skipped.note.as_deref().unwrap().contains("-bad-.example"),
        "{skipped:?}"
    );
    assert_eq!(record(&records, "-bad-.example").await.map(|_| ()), None);
    running.stop().await;
}

#[tokio::test]
async fn a_record_owned_by_someone_else_is_left_alone_with_one_conflict_event() {
    let server = server().await;
    let client = server.client();
    put_node(&server, "node-1", "10.0.0.1", true);
    let records: Api<ServiceRecord> = Api::namespaced(client.clone(), NS);
    let foreign: ServiceRecord = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": "test.some.domain", "labels": {EXPORT_LABEL: ""}},
        "spec": {"fqdn": "test.some.domain", "endpoints": [{"address": "192.0.2.1", "port": 443}]},
    }))
    .unwrap();
    let before = records
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let running = start(&server, None).await;
    let proxies: Api<HTTPProxy> = Api::namespaced(client.clone(), NS);
    proxies
        .create(
            &PostParams::default(),
            &proxy("test", true, Some("test.some.domain")),
        )
        .await
        .unwrap();
    let conflict = wait_event(&server, "test", "Conflict").await;
    assert_eq!(conflict.type_.as_deref(), Some("Warning"));
    let after = record(&records, "test.some.domain").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(after.spec.endpoints, [ep("192.0.2.1", 443)]);

    // A node change re-reconciles the proxy: still a conflict, still untouched, and no second
    // Event for the same lasting condition.
    let reconciles = running.ok_reconciles();
    put_node(&server, "node-2", "10.0.0.2", true);
    wait_for("the proxy reconciled again", || {
        let n = running.ok_reconciles();
        async move { (n > reconciles).then_some(()) }
    })
    .await;
    let all = events(&server, "test", "Conflict").await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].series, None, "reported once, not repeated");
    assert_eq!(
        record(&records, "test.some.domain")
            .await
            .unwrap()
            .metadata
            .resource_version,
        before.metadata.resource_version
    );
    // PUB-08-like: the proxy loses its label; the foreign record stays.
    let reconciles = running.ok_reconciles();
    set_label(&proxies, "test", false).await;
    wait_for("the unlabelled proxy reconciled", || {
        let n = running.ok_reconciles();
        async move { (n > reconciles).then_some(()) }
    })
    .await;
    assert!(record(&records, "test.some.domain").await.is_some());
    running.stop().await;
}

#[tokio::test]
async fn new_05_a_proxy_without_virtualhost_does_nothing_and_the_controller_keeps_running() {
    let server = server().await;
    let client = server.client();
    put_node(&server, "node-1", "10.0.0.1", true);
    let proxies: Api<HTTPProxy> = Api::namespaced(client.clone(), NS);
    // Present before the controller starts, and one created while it runs.
    proxies
        .create(&PostParams::default(), &proxy("included", true, None))
        .await
        .unwrap();
    let running = start(&server, None).await;
    proxies
        .create(&PostParams::default(), &proxy("included-2", true, None))
        .await
        .unwrap();
    let skipped = wait_event(&server, "included-2", "Skipped").await;
    assert_eq!(
        skipped.note.as_deref(),
        Some("HTTPProxy has no spec.virtualhost")
    );
    wait_event(&server, "included", "Skipped").await;
    // Still working: a root proxy is published.
    proxies
        .create(
            &PostParams::default(),
            &proxy("root", true, Some("root.some.domain")),
        )
        .await
        .unwrap();
    let records: Api<ServiceRecord> = Api::namespaced(client.clone(), NS);
    wait_endpoints(&records, "root.some.domain", &[ep("10.0.0.1", 443)]).await;
    let names: Vec<String> = records
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| r.metadata.name.unwrap())
        .collect();
    assert_eq!(names, ["root.some.domain"]);
    assert!(!running.task.is_finished());
    running.stop().await;
}

#[tokio::test]
async fn no_writes_at_steady_state_and_recovery_after_410_gone() {
    let server = server().await;
    let client = server.client();
    put_node(&server, "node-1", "10.0.0.1", true);
    let proxies: Api<HTTPProxy> = Api::namespaced(client.clone(), NS);
    for (name, fqdn) in [("a", "a.some.domain"), ("b", "b.some.domain")] {
        proxies
            .create(&PostParams::default(), &proxy(name, true, Some(fqdn)))
            .await
            .unwrap();
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "db");
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web", "labels": {EXPORT_LABEL: ""}},
                "spec": {"ports": [{"port": 80}]},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let running = start(&server, None).await;
    let records: Api<ServiceRecord> = Api::namespaced(client.clone(), NS);
    // Ready means the first sync is done: the records are there already.
    assert_eq!(
        record(&records, "a.some.domain")
            .await
            .unwrap()
            .spec
            .endpoints,
        [ep("10.0.0.1", 443)]
    );
    assert!(
        Api::<ServiceRecord>::namespaced(client.clone(), "db")
            .get_opt("web.db.svc.clusterset.local")
            .await
            .unwrap()
            .is_some()
    );

    // Steady state: an unrelated object changes, a node heartbeat changes nothing the records
    // use, and every watch is forced to relist (410 Gone), which re-reconciles every source and
    // the owner of every record — and nothing is written.
    server.reset_counters();
    Api::<Service>::namespaced(client.clone(), "db")
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "unrelated"}, "spec": {"ports": [{"port": 81}]}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let mut node = server.get("v1", "nodes", None, "node-1").unwrap();
    node["metadata"]["annotations"] = json!({"heartbeat": "1"});
    server.put_raw(node).unwrap();
    let relisted: Vec<u64> = WATCHES.iter().map(|w| running.relists(w)).collect();
    let before = running.ok_reconciles();
    server.compact();
    wait_for("every watch relisted and the queue drained", || {
        let all = WATCHES
            .iter()
            .zip(&relisted)
            .all(|(w, n)| running.relists(w) > *n);
        let idle = running.metrics.queue_depth.get() == 0;
        async move { (all && idle).then_some(()) }
    })
    .await;
    assert!(
        running.ok_reconciles() >= before + 3,
        "all sources reconciled again"
    );
    let writes = server.writes();
    assert_eq!(
        writes.total(),
        1,
        "only the test's own Service create: {writes}"
    );
    assert_eq!(writes.get("services", Verb::Create), 1);

    // After the 410 the watches work again: changes still flow.
    server.compact();
    set_label(&proxies, "a", false).await;
    put_node(&server, "node-1", "10.0.0.7", true);
    wait_gone(&records, "a.some.domain").await;
    wait_endpoints(&records, "b.some.domain", &[ep("10.0.0.7", 443)]).await;
    running.stop().await;
}

#[tokio::test]
async fn with_leader_election_the_lease_is_held_while_running_and_released_after() {
    let server = server().await;
    let client = server.client();
    put_node(&server, "node-1", "10.0.0.1", true);
    let leader = LeaderConfig {
        identity: "publisher-0".into(),
        ..LeaderConfig::new("xcc", LEASE_NAME)
    };
    let running = start(&server, Some(leader)).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "xcc");
    let lease = leases.get("xcc-publisher").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("publisher-0")
    );
    let proxies: Api<HTTPProxy> = Api::namespaced(client.clone(), NS);
    proxies
        .create(
            &PostParams::default(),
            &proxy("test", true, Some("test.some.domain")),
        )
        .await
        .unwrap();
    let records: Api<ServiceRecord> = Api::namespaced(client.clone(), NS);
    wait_endpoints(&records, "test.some.domain", &[ep("10.0.0.1", 443)]).await;
    let health = running.health.clone();
    running.stop().await;
    assert!(!health.is_ready());
    let lease = leases.get("xcc-publisher").await.unwrap();
    assert_ne!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("publisher-0"),
        "released on shutdown"
    );
}
