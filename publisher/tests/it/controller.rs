//! The publisher controller running in-process on a real API server (`xcc_testkube`, Contour's
//! HTTPProxy CRD and ours installed), as the publisher's ServiceAccount with exactly
//! `deploy/overlays/exporter`'s RBAC (a missing rule fails: no request may be refused): XCC v1's
//! publisher cases that need a running controller, a proxy without virtualhost, Services of each
//! type, conflicts, zero writes at steady state and across a restart (the audit log counts writes),
//! and leader election. Waits wake on the watches of the objects they check, never on time.
//! Recovery after 410 Gone needs a compaction on demand: `relist.rs`, on the fake.
//!
//! The publisher watches every namespace and the Nodes, so each of these tests runs alone on
//! the shared control plane ([`Turn::alone`]) and starts from no Nodes and no sources left by
//! the one before.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use xcc_controller::leader::LeaderConfig;
use xcc_controller::probes::Health;
use xcc_proto::crd::{Endpoint, ServiceRecord};
use xcc_proto::names::{CLUSTERS_ANNOTATION, EXPORT_LABEL, FQDN_ANNOTATION};
use xcc_publisher::controller::{self, LEASE_NAME, Metrics, Settings};
use xcc_publisher::desired::Config;
use xcc_publisher::httpproxy::HTTPProxy;
use xcc_testkube::{Changes, ControlPlane, Identity, Turn, poll};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A test's part of the shared control plane: its namespaces, the publisher's identity, and
/// watches that wake its waits.
struct World {
    cp: &'static ControlPlane,
    /// HTTPProxies, the ingress Service `envoy`, and the publisher's Lease.
    ns: String,
    /// Exported Services.
    db: String,
    id: Identity,
    admin: kube::Client,
    changes: Changes,
    _turn: Turn,
}

impl World {
    async fn new(test: &str) -> Option<Self> {
        let cp = xcc_testkube::shared(test)?;
        let turn = Turn::alone().await;
        let contour = xcc_testkube::upstream_crds().join("projectcontour.io_httpproxies.yaml");
        cp.apply(&xcc_testkube::yaml_docs(
            &std::fs::read_to_string(contour).unwrap(),
        ))
        .await;
        cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
        let admin = cp.client().await;
        clear(&admin).await;
        let ns = cp.namespace("pub").await;
        let db = cp.namespace("pub-db").await;
        let id = cp.identity(&ns, "overlays/exporter", "xcc-publisher").await;
        let changes = cp
            .changes(
                None,
                &[
                    (
                        "connectivity.tanzu.vmware.com/v1alpha1",
                        "ServiceRecord",
                        "servicerecords",
                    ),
                    ("events.k8s.io/v1", "Event", "events"),
                    ("coordination.k8s.io/v1", "Lease", "leases"),
                ],
            )
            .await;
        Some(World {
            cp,
            ns,
            db,
            id,
            admin,
            changes,
            _turn: turn,
        })
    }

    /// Wait until `check` (which reads the API server) returns `Some`, re-checking on every
    /// change of records, Events and Leases.
    async fn wait_for<T>(&self, what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
        self.changes.wait_for(what, TIMEOUT, check).await
    }

    fn settings(&self) -> Settings {
        Settings {
            config: Config {
                ingress_port: 443,
                cluster: Some("cluster-a".into()),
            },
            ingress_service: (self.ns.clone(), "envoy".into()),
            ..Settings::default()
        }
    }

    /// Start the controller as the publisher's ServiceAccount and wait until it reports ready.
    async fn start(&self, leader: Option<LeaderConfig>) -> Running {
        let cancel = CancellationToken::new();
        let metrics = Metrics::default();
        let health = Health::default();
        let task = tokio::spawn(controller::serve(
            self.id.client().await,
            self.settings(),
            metrics.clone(),
            health.clone(),
            leader,
            cancel.clone(),
        ));
        tokio::time::timeout(TIMEOUT, health.ready())
            .await
            .expect("timed out waiting for readiness");
        Running {
            cancel,
            task,
            metrics,
            health,
        }
    }

    /// No request of the publisher was refused.
    fn assert_nothing_forbidden(&self) {
        assert_eq!(self.cp.forbidden(&self.id.user), Vec::<String>::new());
    }

    /// Create or update Node `name` (status: readiness and one internal address).
    async fn put_node(&self, name: &str, ip: &str, ready: bool) {
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let node = node_json(name, ip, ready);
        if nodes.get_opt(name).await.unwrap().is_none() {
            let n: Node = serde_json::from_value(node.clone()).unwrap();
            nodes.create(&PostParams::default(), &n).await.unwrap();
        }
        // Status set on create may be dropped; the status subresource is what kubelets write.
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": node["status"]})),
            )
            .await
            .unwrap();
    }

    fn records(&self, ns: &str) -> Api<ServiceRecord> {
        Api::namespaced(self.admin.clone(), ns)
    }

    /// Wait until record `name` in `ns` exists with exactly `endpoints`.
    async fn wait_endpoints(&self, ns: &str, name: &str, endpoints: &[Endpoint]) {
        let api = self.records(ns);
        self.wait_for(
            &format!("{name} with endpoints {endpoints:?}"),
            async || {
                record(&api, name)
                    .await
                    .filter(|r| r.spec.endpoints == endpoints)
                    .map(|_| ())
            },
        )
        .await;
    }

    async fn wait_gone(&self, ns: &str, name: &str) {
        let api = self.records(ns);
        self.wait_for(&format!("{name} removed"), async || {
            record(&api, name).await.is_none().then_some(())
        })
        .await;
    }

    /// Events (events.k8s.io) in `ns` about `name` with `reason`.
    async fn events(&self, ns: &str, name: &str, reason: &str) -> Vec<K8sEvent> {
        Api::<K8sEvent>::namespaced(self.admin.clone(), ns)
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

    async fn wait_event(&self, ns: &str, name: &str, reason: &str) -> K8sEvent {
        self.wait_for(&format!("{reason} Event on {name}"), async || {
            self.events(ns, name, reason).await.into_iter().next()
        })
        .await
    }
}

/// Remove what earlier tests left that the publisher would see: Nodes, HTTPProxies and
/// exported Services (their records go with them, by owner reference).
async fn clear(admin: &kube::Client) {
    let nodes: Api<Node> = Api::all(admin.clone());
    for n in nodes.list(&ListParams::default()).await.unwrap() {
        nodes
            .delete(&n.metadata.name.unwrap(), &DeleteParams::default())
            .await
            .unwrap();
    }
    for p in Api::<HTTPProxy>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        let ns = p.metadata.namespace.unwrap();
        Api::<HTTPProxy>::namespaced(admin.clone(), &ns)
            .delete(&p.metadata.name.unwrap(), &DeleteParams::default())
            .await
            .unwrap();
    }
    for s in Api::<Service>::all(admin.clone())
        .list(&ListParams::default().labels(EXPORT_LABEL))
        .await
        .unwrap()
    {
        let ns = s.metadata.namespace.unwrap();
        Api::<Service>::namespaced(admin.clone(), &ns)
            .delete(&s.metadata.name.unwrap(), &DeleteParams::default())
            .await
            .unwrap();
    }
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

    fn ok_reconciles(&self) -> u64 {
        self.metrics
            .reconciles
            .get_or_create(&vec![("result".into(), "ok".into())])
            .get()
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

fn proxy(ns: &str, name: &str, labelled: bool, fqdn: Option<&str>) -> HTTPProxy {
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
        "metadata": {"name": name, "namespace": ns, "labels": labels},
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
    let Some(w) = World::new("an_exported_proxy_follows_its_label_nodes_ingress_and_fqdn").await
    else {
        return;
    };
    let ns = w.ns.as_str();
    w.put_node("node-1", "10.0.0.1", true).await;
    let running = w.start(None).await;
    let proxies: Api<HTTPProxy> = Api::namespaced(w.admin.clone(), ns);
    let records = w.records(ns);

    // Label an HTTPProxy → its record appears with the node's address on 443.
    let created = proxies
        .create(
            &PostParams::default(),
            &proxy(ns, "test", true, Some("test.some.domain")),
        )
        .await
        .unwrap();
    w.wait_endpoints(ns, "test.some.domain", &[ep("10.0.0.1", 443)])
        .await;
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
    let published = w.wait_event(ns, "test", "Published").await;
    assert_eq!(
        published.reporting_controller.as_deref(),
        Some("xcc-publisher")
    );

    // Through a running controller: the node turns NotReady → no endpoints.
    w.put_node("node-1", "10.0.0.1", false).await;
    w.wait_endpoints(ns, "test.some.domain", &[]).await;
    // Ready again with a new address → the endpoints follow.
    w.put_node("node-1", "10.0.0.9", true).await;
    w.wait_endpoints(ns, "test.some.domain", &[ep("10.0.0.9", 443)])
        .await;
    // A second node joins.
    w.put_node("node-2", "10.0.0.2", true).await;
    w.wait_endpoints(
        ns,
        "test.some.domain",
        &[ep("10.0.0.2", 443), ep("10.0.0.9", 443)],
    )
    .await;

    // The ingress Service gets a LoadBalancer address → endpoints switch to it.
    let services: Api<Service> = Api::namespaced(w.admin.clone(), ns);
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
    w.wait_endpoints(ns, "test.some.domain", &[ep("203.0.113.5", 443)])
        .await;

    // FQDN changed → the old record goes, the new one is there.
    proxies
        .patch(
            "test",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"virtualhost": {"fqdn": "new.some.domain"}}})),
        )
        .await
        .unwrap();
    w.wait_endpoints(ns, "new.some.domain", &[ep("203.0.113.5", 443)])
        .await;
    w.wait_gone(ns, "test.some.domain").await;
    let removed = w.wait_event(ns, "test", "Removed").await;
    assert_eq!(
        removed.note.as_deref(),
        Some("removed ServiceRecord test.some.domain")
    );

    // Label removed → record gone, and a Removed Event.
    set_label(&proxies, "test", false).await;
    w.wait_gone(ns, "new.some.domain").await;
    let note = "no longer exported; removed ServiceRecord new.some.domain";
    w.wait_for("the Removed Event of the unlabelled proxy", async || {
        w.events(ns, "test", "Removed")
            .await
            .iter()
            .any(|e| e.note.as_deref() == Some(note))
            .then_some(())
    })
    .await;

    // Labelled again → back; drift (someone edits the record) is repaired.
    set_label(&proxies, "test", true).await;
    w.wait_endpoints(ns, "new.some.domain", &[ep("203.0.113.5", 443)])
        .await;
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
    w.wait_endpoints(ns, "new.some.domain", &[ep("203.0.113.5", 443)])
        .await;
    // A record deleted behind the publisher's back comes back.
    records
        .delete("new.some.domain", &DeleteParams::default())
        .await
        .unwrap();
    w.wait_endpoints(ns, "new.some.domain", &[ep("203.0.113.5", 443)])
        .await;

    // Proxy deleted → record gone.
    proxies
        .delete("test", &DeleteParams::default())
        .await
        .unwrap();
    w.wait_gone(ns, "new.some.domain").await;
    assert!(running.ok_reconciles() > 0, "reconciles are counted");
    running.stop().await;
    w.assert_nothing_forbidden();
}

#[tokio::test]
async fn services_of_each_type_are_exported_with_allowed_requesters() {
    let Some(w) = World::new("services_of_each_type_are_exported_with_allowed_requesters").await
    else {
        return;
    };
    let db = w.db.as_str();
    w.put_node("node-1", "10.0.0.1", true).await;
    w.put_node("node-2", "10.0.0.2", false).await;
    let running = w.start(None).await;
    let services: Api<Service> = Api::namespaced(w.admin.clone(), db);
    let records = w.records(db);
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
    w.wait_endpoints(db, "cip.db.example", &[ep(&cluster_ip, 3306)])
        .await;
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
    w.wait_endpoints(db, "np.db.example", &[ep("10.0.0.1", node_port)])
        .await;
    // node-2 becomes ready → NodePort endpoints follow the nodes too.
    w.put_node("node-2", "10.0.0.2", true).await;
    w.wait_endpoints(
        db,
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
    w.wait_endpoints(db, "lb.db.example", &[]).await;
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
    w.wait_endpoints(db, "lb.db.example", &[ep("198.51.100.7", 3306)])
        .await;

    // Label removed from a Service → its record goes.
    services
        .patch(
            "cip",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {EXPORT_LABEL: null}}})),
        )
        .await
        .unwrap();
    w.wait_gone(db, "cip.db.example").await;
    // An invalid FQDN is reported as Skipped, with the reason.
    services
        .create(
            &PostParams::default(),
            &svc("bad", "ClusterIP", "-bad-.example"),
        )
        .await
        .unwrap();
    let skipped = w.wait_event(db, "bad", "Skipped").await;
    assert!(
        skipped.note.as_deref().unwrap().contains("-bad-.example"),
        "{skipped:?}"
    );
    assert_eq!(record(&records, "-bad-.example").await.map(|_| ()), None);
    running.stop().await;
    w.assert_nothing_forbidden();
}

#[tokio::test]
async fn a_record_owned_by_someone_else_is_left_alone_with_one_conflict_event() {
    let Some(w) =
        World::new("a_record_owned_by_someone_else_is_left_alone_with_one_conflict_event").await
    else {
        return;
    };
    let ns = w.ns.as_str();
    w.put_node("node-1", "10.0.0.1", true).await;
    let records = w.records(ns);
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
    let running = w.start(None).await;
    let proxies: Api<HTTPProxy> = Api::namespaced(w.admin.clone(), ns);
    proxies
        .create(
            &PostParams::default(),
            &proxy(ns, "test", true, Some("test.some.domain")),
        )
        .await
        .unwrap();
    let conflict = w.wait_event(ns, "test", "Conflict").await;
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
    w.put_node("node-2", "10.0.0.2", true).await;
    poll("the proxy reconciled again", TIMEOUT, || {
        running.ok_reconciles() > reconciles
    })
    .await;
    let all = w.events(ns, "test", "Conflict").await;
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
    // The proxy loses its label; the foreign record stays.
    let reconciles = running.ok_reconciles();
    set_label(&proxies, "test", false).await;
    poll("the unlabelled proxy reconciled", TIMEOUT, || {
        running.ok_reconciles() > reconciles
    })
    .await;
    assert!(record(&records, "test.some.domain").await.is_some());
    running.stop().await;
    w.assert_nothing_forbidden();
}

#[tokio::test]
async fn a_proxy_without_virtualhost_does_nothing_and_the_controller_keeps_running() {
    let Some(w) =
        World::new("a_proxy_without_virtualhost_does_nothing_and_the_controller_keeps_running")
            .await
    else {
        return;
    };
    let ns = w.ns.as_str();
    w.put_node("node-1", "10.0.0.1", true).await;
    let proxies: Api<HTTPProxy> = Api::namespaced(w.admin.clone(), ns);
    // Present before the controller starts, and one created while it runs.
    proxies
        .create(&PostParams::default(), &proxy(ns, "included", true, None))
        .await
        .unwrap();
    let running = w.start(None).await;
    proxies
        .create(&PostParams::default(), &proxy(ns, "included-2", true, None))
        .await
        .unwrap();
    let skipped = w.wait_event(ns, "included-2", "Skipped").await;
    assert_eq!(
        skipped.note.as_deref(),
        Some("HTTPProxy has no spec.virtualhost")
    );
    w.wait_event(ns, "included", "Skipped").await;
    // Still working: a root proxy is published.
    proxies
        .create(
            &PostParams::default(),
            &proxy(ns, "root", true, Some("root.some.domain")),
        )
        .await
        .unwrap();
    let records = w.records(ns);
    w.wait_endpoints(ns, "root.some.domain", &[ep("10.0.0.1", 443)])
        .await;
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
    w.assert_nothing_forbidden();
}

#[tokio::test]
async fn no_writes_at_steady_state_nor_after_a_restart() {
    let Some(w) = World::new("no_writes_at_steady_state_nor_after_a_restart").await else {
        return;
    };
    let (ns, db) = (w.ns.as_str(), w.db.as_str());
    w.put_node("node-1", "10.0.0.1", true).await;
    let proxies: Api<HTTPProxy> = Api::namespaced(w.admin.clone(), ns);
    for (name, fqdn) in [("a", "a.some.domain"), ("b", "b.some.domain")] {
        proxies
            .create(&PostParams::default(), &proxy(ns, name, true, Some(fqdn)))
            .await
            .unwrap();
    }
    let services: Api<Service> = Api::namespaced(w.admin.clone(), db);
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
    let running = w.start(None).await;
    let records = w.records(ns);
    // Ready means the first sync is done: the records are there already.
    assert_eq!(
        record(&records, "a.some.domain")
            .await
            .unwrap()
            .spec
            .endpoints,
        [ep("10.0.0.1", 443)]
    );
    let web = format!("web.{db}.svc.clusterset.local");
    assert!(w.records(db).get_opt(&web).await.unwrap().is_some());

    // Steady state: an exported proxy is annotated (it is reconciled, its record stays as it
    // is), an unrelated Service appears, a node heartbeat changes nothing the records use —
    // and nothing is written.
    let since = SystemTime::now();
    let before = running.ok_reconciles();
    proxies
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"touched": "1"}}})),
        )
        .await
        .unwrap();
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "unrelated"}, "spec": {"ports": [{"port": 81}]}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<Node>::all(w.admin.clone())
        .patch(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"heartbeat": "1"}}})),
        )
        .await
        .unwrap();
    poll(
        "the annotated proxy reconciled and the queue drained",
        TIMEOUT,
        || running.ok_reconciles() > before && running.metrics.queue_depth.get() == 0,
    )
    .await;
    assert_eq!(w.cp.writes_since(&w.id.user, since), Vec::<String>::new());

    // A restarted publisher reconciles every source again and finds nothing to write.
    running.stop().await;
    let since = SystemTime::now();
    let running = w.start(None).await;
    poll(
        "every source reconciled and the queue drained",
        TIMEOUT,
        || running.ok_reconciles() >= 3 && running.metrics.queue_depth.get() == 0,
    )
    .await;
    assert_eq!(w.cp.writes_since(&w.id.user, since), Vec::<String>::new());

    // Changes still flow.
    set_label(&proxies, "a", false).await;
    w.put_node("node-1", "10.0.0.7", true).await;
    w.wait_gone(ns, "a.some.domain").await;
    w.wait_endpoints(ns, "b.some.domain", &[ep("10.0.0.7", 443)])
        .await;
    running.stop().await;
    w.assert_nothing_forbidden();
}

#[tokio::test]
async fn with_leader_election_the_lease_is_held_while_running_and_released_after() {
    let Some(w) =
        World::new("with_leader_election_the_lease_is_held_while_running_and_released_after").await
    else {
        return;
    };
    let ns = w.ns.as_str();
    w.put_node("node-1", "10.0.0.1", true).await;
    let leader = LeaderConfig {
        identity: "publisher-0".into(),
        ..LeaderConfig::new(ns, LEASE_NAME)
    };
    let running = w.start(Some(leader)).await;
    let leases: Api<Lease> = Api::namespaced(w.admin.clone(), ns);
    let holder = async || {
        leases
            .get_opt("xcc-publisher")
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
    };
    w.wait_for("publisher-0 to hold the Lease", async || {
        (holder().await.as_deref() == Some("publisher-0")).then_some(())
    })
    .await;
    let proxies: Api<HTTPProxy> = Api::namespaced(w.admin.clone(), ns);
    proxies
        .create(
            &PostParams::default(),
            &proxy(ns, "test", true, Some("test.some.domain")),
        )
        .await
        .unwrap();
    w.wait_endpoints(ns, "test.some.domain", &[ep("10.0.0.1", 443)])
        .await;
    let health = running.health.clone();
    running.stop().await;
    assert!(!health.is_ready());
    assert_ne!(
        holder().await.as_deref(),
        Some("publisher-0"),
        "released on shutdown"
    );
    w.assert_nothing_forbidden();
}
