//! The running binder controller on a real API server (`xcc_testkube`, our CRDs installed), as the
//! binder's ServiceAccount with exactly the RBAC of `deploy/overlays/importer` (Cilium mode:
//! `overlays/cilium`), so a missing rule fails (no request may be refused): XCC v1's binder cases
//! through watches and reconciles, no writes at steady state across a resync and a restart (the
//! audit log counts writes), uppercase FQDNs, port conflicts, drift repair, foreign objects, the
//! Cilium global-service mode, other installs' global Services, a refused orphan check and
//! readiness. A forced relist (410 Gone) cannot be had from a real server on demand: `relist.rs`,
//! on the fake.
//!
//! No sleeps: waits on API state wake on the watches of what they check; only in-process
//! state (readiness, counters) is polled.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Endpoints, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use xcc_binder::controller::{Config, Controller, Handle, Metrics};
use xcc_controller::probes::Health;
use xcc_proto::crd::ServiceRecord;
use xcc_proto::names;
use xcc_testkube::{Changes, ControlPlane, Identity, Turn};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The `deploy/` overlay the binder's identity comes from, and whether the test runs alone.
/// Every binder watches its managed Services in all namespaces: a Cilium-mode binder writes
/// and removes global Services there, and the managed-object gauges count them all. Other
/// tests share the control plane, each in its namespace.
#[derive(Clone, Copy)]
struct Setup {
    overlay: &'static str,
    alone: bool,
}

const IMPORTER: Setup = Setup {
    overlay: "overlays/importer",
    alone: false,
};
const IMPORTER_ALONE: Setup = Setup {
    overlay: "overlays/importer",
    alone: true,
};
const CILIUM: Setup = Setup {
    overlay: "overlays/cilium",
    alone: true,
};

struct Env {
    cp: &'static ControlPlane,
    /// The binder's namespace (records, Services, Lease).
    ns: String,
    /// The binder's ServiceAccount.
    id: Identity,
    /// Cluster admin, for what the test itself does.
    client: Client,
    changes: Changes,
    handle: Handle,
    cancel: CancellationToken,
    /// Built and not started yet.
    pending: Option<Controller>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    _turn: Turn,
}

async fn controller(id: &Identity, ns: &str) -> Controller {
    Controller::new(
        id.client().await,
        Config {
            namespace: ns.into(),
            workers: 2,
            resync: Duration::from_secs(3600),
            mcs: false,
        },
        Metrics::default(),
        Health::default(),
    )
}

impl Env {
    /// A namespace of the shared control plane, the binder's identity from `overlay`, and a
    /// controller that is not running yet; `None` when the control plane is not configured.
    async fn new(test: &str, setup: Setup) -> Option<Self> {
        let cp = xcc_testkube::shared(test)?;
        let turn = if setup.alone {
            Turn::alone().await
        } else {
            Turn::shared().await
        };
        cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
        let ns = cp.namespace("binder").await;
        let id = cp.identity(&ns, setup.overlay, "xcc-binder").await;
        let changes = cp
            .changes(
                None,
                &[
                    ("v1", "Service", "services"),
                    ("v1", "Endpoints", "endpoints"),
                    ("discovery.k8s.io/v1", "EndpointSlice", "endpointslices"),
                    ("events.k8s.io/v1", "Event", "events"),
                    (
                        "connectivity.tanzu.vmware.com/v1alpha1",
                        "ServiceRecord",
                        "servicerecords",
                    ),
                ],
            )
            .await;
        let pending = controller(&id, &ns).await;
        Some(Env {
            cp,
            handle: pending.handle(),
            client: cp.client().await,
            ns,
            id,
            changes,
            cancel: CancellationToken::new(),
            pending: Some(pending),
            task: None,
            _turn: turn,
        })
    }

    /// [`Env::new`] with a running controller that finished its first sync.
    async fn start(test: &str, setup: Setup) -> Option<Self> {
        let mut env = Self::new(test, setup).await?;
        env.run().await;
        env.poll("first sync", |e| e.handle.is_ready()).await;
        Some(env)
    }

    /// Start the pending controller, or a new one.
    async fn run(&mut self) {
        let controller = match self.pending.take() {
            Some(c) => c,
            None => controller(&self.id, &self.ns).await,
        };
        self.handle = controller.handle();
        self.task = Some(tokio::spawn(controller.run(self.cancel.clone())));
    }

    async fn stop(mut self) {
        self.cancel.cancel();
        let result = tokio::time::timeout(TIMEOUT, self.task.take().unwrap())
            .await
            .expect("the controller stops on cancel");
        result.unwrap().unwrap();
        self.assert_nothing_forbidden();
    }

    fn assert_nothing_forbidden(&self) {
        assert_eq!(self.cp.forbidden(&self.id.user), Vec::<String>::new());
    }

    fn assert_no_writes_since(&self, since: SystemTime) {
        assert_eq!(
            self.cp.writes_since(&self.id.user, since),
            Vec::<String>::new()
        );
    }

    /// Wait until `check` (which reads the API server) holds, re-checking on every change of
    /// Services, Endpoints, EndpointSlices, Events and records.
    async fn wait_for(&self, what: &str, mut check: impl AsyncFnMut(&Self) -> bool) {
        self.changes
            .wait_for(what, TIMEOUT, async || check(self).await.then_some(()))
            .await;
    }

    /// Poll in-process state (readiness, counters) every 20 ms until `check` holds.
    async fn poll(&self, what: &str, mut check: impl FnMut(&Self) -> bool) {
        xcc_testkube::poll(what, TIMEOUT, || check(self)).await;
    }

    /// Reconcile every key once more and wait until that is done.
    async fn resync_round(&self) {
        let before = self.handle.reconciles();
        self.handle.resync_now();
        self.poll("resync round", |e| {
            e.handle.reconciles() > before && e.handle.is_idle()
        })
        .await;
    }

    async fn get(&self, api_version: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, ""), plural);
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &resource);
        let found = api.get_opt(name).await.unwrap();
        found.map(|o| serde_json::to_value(o).unwrap())
    }

    async fn service(&self, name: &str) -> Option<Value> {
        self.get("v1", "services", &self.ns, name).await
    }

    async fn endpoints(&self, name: &str) -> Option<Value> {
        self.get("v1", "endpoints", &self.ns, name).await
    }

    async fn slices(&self, service: &str) -> Vec<Value> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
        let selector = format!("kubernetes.io/service-name={service}");
        api.list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|s| serde_json::to_value(s).unwrap())
            .collect()
    }

    async fn events(&self, ns: &str, reason: &str) -> Vec<Value> {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), ns);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    }

    async fn namespace(&self, name: &str) -> Option<Namespace> {
        Api::<Namespace>::all(self.client.clone())
            .get_opt(name)
            .await
            .unwrap()
    }

    fn records(&self) -> Api<ServiceRecord> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Wait until each of `names` has the Conflict condition `(status, reason)`; returns the
    /// records as they are then.
    async fn wait_condition(
        &self,
        names: &[&str],
        status: &str,
        reason: &str,
    ) -> Vec<ServiceRecord> {
        let want = Some((status.to_string(), reason.to_string()));
        let what = format!("Conflict condition {status}/{reason} on {names:?}");
        self.changes
            .wait_for(&what, TIMEOUT, async || {
                let mut found = Vec::new();
                for name in names {
                    let r = self.records().get(name).await.unwrap();
                    if conflict_condition(&r) != want {
                        return None;
                    }
                    found.push(r);
                }
                Some(found)
            })
            .await
    }

    async fn create_record(&self, body: Value) -> ServiceRecord {
        let sr: ServiceRecord = serde_json::from_value(body).unwrap();
        self.records()
            .create(&PostParams::default(), &sr)
            .await
            .unwrap()
    }

    async fn delete_record(&self, name: &str) {
        self.records()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    async fn annotate_record(&self, name: &str, annotations: Value) {
        self.records()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .unwrap();
    }
}

/// An imported record through RemoteRegistry `rr`.
fn imported(name: &str, fqdn: &str, annotations: Value, endpoints: Value) -> Value {
    json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": name, "annotations": annotations,
                     "labels": {"connectivity.tanzu.vmware.com/imported": "",
                                "connectivity.tanzu.vmware.com/remote-registry": "rr"}},
        "spec": {"fqdn": fqdn, "endpoints": endpoints},
    })
}

fn eps(addresses: &[&str], port: i64) -> Value {
    Value::Array(
        addresses
            .iter()
            .map(|a| json!({"address": a, "port": port}))
            .collect(),
    )
}

fn endpoint_ips(ep: &Value) -> Vec<String> {
    ep["subsets"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["addresses"].as_array().cloned().unwrap_or_default())
        .map(|a| a["ip"].as_str().unwrap().to_string())
        .collect()
}

fn endpoint_ports(ep: &Value) -> Vec<i64> {
    ep["subsets"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| p["port"].as_i64().unwrap())
        .collect()
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| o["uid"].as_str().unwrap().to_string())
        .collect()
}

fn service_ports(svc: &Value) -> Vec<(i64, String)> {
    svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["port"].as_i64().unwrap(),
                p["protocol"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn ingress(svc: &Value) -> Vec<String> {
    svc["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| i["ip"].as_str().unwrap().to_string())
        .collect()
}

fn uid(r: &ServiceRecord) -> String {
    r.metadata.uid.clone().unwrap()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

const SVC: &str = "test-some-domain-cc9e50dd";

#[tokio::test]
async fn xcc_v1_binder_cases_through_the_running_controller() {
    let Some(env) = Env::start(
        "xcc_v1_binder_cases_through_the_running_controller",
        IMPORTER,
    )
    .await
    else {
        return;
    };

    // One record → Service and Endpoints, owned by it; no load-balancer status.
    let r1 = env
        .create_record(imported(
            "test.some.domain-abcd1234",
            "test.some.domain",
            json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
            eps(&["10.0.0.1", "10.0.0.2"], 443),
        ))
        .await;
    // The group's Service, EndpointSlices and Endpoints are written at once: wait for all three.
    env.wait_for("Endpoints of one record", async |e| {
        e.endpoints(SVC)
            .await
            .is_some_and(|ep| endpoint_ips(&ep) == ["10.0.0.1", "10.0.0.2"])
            && e.service(SVC).await.is_some()
            && e.slices(SVC).await.len() == 1
    })
    .await;
    let svc = env.service(SVC).await.unwrap();
    assert_eq!(owner_uids(&svc), [uid(&r1)]);
    assert_eq!(service_ports(&svc), [(443, "TCP".to_string())]);
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert!(svc["spec"].get("selector").is_none());
    assert_eq!(
        svc["metadata"]["annotations"]["connectivity.tanzu.vmware.com/fqdn"],
        "test.some.domain"
    );
    assert_eq!(
        svc["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "xcc-binder"
    );
    assert!(ingress(&svc).is_empty());
    let ep = env.endpoints(SVC).await.unwrap();
    assert_eq!(owner_uids(&ep), [uid(&r1)]);
    assert_eq!(endpoint_ports(&ep), [443]);
    let slices = env.slices(SVC).await;
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0]["addressType"], "IPv4");
    assert_eq!(owner_uids(&slices[0]), [uid(&r1)]);
    assert_eq!(
        slices[0]["endpoints"],
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
               {"addresses": ["10.0.0.2"], "conditions": {"ready": true}}])
    );
    assert_eq!(
        slices[0]["ports"],
        json!([{"name": "", "port": 443, "protocol": "TCP"}])
    );
    env.wait_for("one Created Event, for the Service", async |e| {
        let created = e.events(&e.ns, "Created").await;
        created.len() == 1 && created[0]["regarding"]["name"] == SVC
    })
    .await;

    // The VIP annotation → load-balancer ingress.
    env.annotate_record(
        "test.some.domain-abcd1234",
        json!({"connectivity.tanzu.vmware.com/vip": "1.2.3.4"}),
    )
    .await;
    env.wait_for("VIP", async |e| {
        e.service(SVC)
            .await
            .is_some_and(|s| ingress(&s) == ["1.2.3.4"])
    })
    .await;
    let svc = env.service(SVC).await.unwrap();
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    assert_eq!(
        svc["spec"]["loadBalancerClass"],
        "connectivity.tanzu.vmware.com/vip"
    );

    // service-port 8080 with endpoints on 443.
    env.annotate_record(
        "test.some.domain-abcd1234",
        json!({"connectivity.tanzu.vmware.com/service-port": "8080"}),
    )
    .await;
    env.wait_for("service port", async |e| {
        e.service(SVC)
            .await
            .is_some_and(|s| service_ports(&s) == [(8080, "TCP".to_string())])
    })
    .await;
    assert_eq!(ingress(&env.service(SVC).await.unwrap()), ["1.2.3.4"]);
    assert_eq!(endpoint_ports(&env.endpoints(SVC).await.unwrap()), [443]);
    env.annotate_record(
        "test.some.domain-abcd1234",
        json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
    )
    .await;

    // A second record of the same FQDN.
    let r2 = env
        .create_record(imported(
            "test.some.domain-bcde2345",
            "test.some.domain",
            json!({"connectivity.tanzu.vmware.com/service-port": "443",
                   "connectivity.tanzu.vmware.com/vip": "1.2.3.4"}),
            eps(&["10.0.0.3", "10.0.0.4"], 443),
        ))
        .await;
    let both = sorted(vec![uid(&r1), uid(&r2)]);
    env.wait_for("four addresses", async |e| {
        e.endpoints(SVC).await.is_some_and(|ep| {
            endpoint_ips(&ep) == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
                && sorted(owner_uids(&ep)) == both
        }) && e
            .service(SVC)
            .await
            .is_some_and(|s| sorted(owner_uids(&s)) == both)
    })
    .await;
    let svc = env.service(SVC).await.unwrap();
    // Both owners (server-side apply keeps the stored order and appends).
    assert_eq!(sorted(owner_uids(&svc)), both);
    assert_eq!(service_ports(&svc), [(443, "TCP".to_string())]);
    let sb04 = (
        env.service(SVC).await.unwrap(),
        env.endpoints(SVC).await.unwrap(),
    );

    // Another FQDN does not leak in.
    env.create_record(imported(
        "foobar.some.domain-bcde2345",
        "foobar.some.domain",
        json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
        eps(&["10.0.0.5", "10.0.0.6"], 443),
    ))
    .await;
    let foobar = names::service_name("foobar.some.domain");
    env.wait_for("foobar", async |e| {
        e.endpoints(&foobar)
            .await
            .is_some_and(|ep| endpoint_ips(&ep) == ["10.0.0.5", "10.0.0.6"])
    })
    .await;
    // An exported record of the same FQDN is ignored.
    env.create_record(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": "test.some.domain.shared-services-cls-3",
                     "annotations": {"connectivity.tanzu.vmware.com/service-port": "443"},
                     "labels": {"connectivity.tanzu.vmware.com/export": ""}},
        "spec": {"fqdn": "test.some.domain", "endpoints": eps(&["10.0.0.5", "10.0.0.6"], 443)},
    }))
    .await;
    env.resync_round().await;
    assert_eq!(
        env.service(SVC).await.unwrap(),
        sb04.0,
        "another FQDN and an exported record: Service as with two records"
    );
    assert_eq!(
        env.endpoints(SVC).await.unwrap(),
        sb04.1,
        "another FQDN and an exported record: Endpoints as with two records"
    );

    // No write at steady state, across a resync (a forced relist: `relist.rs`).
    let since = SystemTime::now();
    env.resync_round().await;
    env.assert_no_writes_since(since);

    // A 62-letter first label.
    let long = format!("{}.some.domain", "a".repeat(62));
    env.create_record(imported(
        "long-abcd1234",
        &long,
        json!({"connectivity.tanzu.vmware.com/service-port": "443",
               "connectivity.tanzu.vmware.com/vip": "1.2.3.4"}),
        eps(&["10.0.0.1", "10.0.0.3"], 443),
    ))
    .await;
    let long_name = format!("{}-c2657973", "a".repeat(54));
    env.wait_for("62-letter label", async |e| {
        e.endpoints(&long_name)
            .await
            .is_some_and(|ep| endpoint_ips(&ep) == ["10.0.0.1", "10.0.0.3"])
            && e.service(&long_name).await.is_some()
    })
    .await;
    assert_eq!(
        env.service(&long_name).await.unwrap()["metadata"]["annotations"]["connectivity.tanzu.vmware.com/fqdn"],
        long.as_str()
    );

    // Deleting one source shrinks owners and addresses only.
    env.delete_record("test.some.domain-abcd1234").await;
    env.wait_for("one source deleted", async |e| {
        e.endpoints(SVC).await.is_some_and(|ep| {
            endpoint_ips(&ep) == ["10.0.0.3", "10.0.0.4"] && owner_uids(&ep) == [uid(&r2)]
        }) && e
            .service(SVC)
            .await
            .is_some_and(|s| owner_uids(&s) == [uid(&r2)])
    })
    .await;
    let svc = env.service(SVC).await.unwrap();
    assert_eq!(owner_uids(&svc), [uid(&r2)]);
    assert_eq!(service_ports(&svc), [(443, "TCP".to_string())]);
    assert_eq!(ingress(&svc), ["1.2.3.4"]);
    assert_eq!(svc["metadata"]["uid"], sb04.0["metadata"]["uid"]);

    // The last source goes: Service, slices and Endpoints go.
    env.delete_record("test.some.domain-bcde2345").await;
    env.wait_for("group removed", async |e| {
        e.service(SVC).await.is_none()
            && e.endpoints(SVC).await.is_none()
            && e.slices(SVC).await.is_empty()
    })
    .await;
    assert!(env.service(&foobar).await.is_some(), "other groups stay");
    env.stop().await;
}

#[tokio::test]
async fn an_uppercase_fqdn_is_lowercased() {
    let Some(env) = Env::start("an_uppercase_fqdn_is_lowercased", IMPORTER).await else {
        return;
    };
    env.create_record(imported(
        "foo.xcc.test-rr",
        "Foo.XCC.test",
        json!({"connectivity.tanzu.vmware.com/service-port": "80"}),
        eps(&["10.1.0.1"], 80),
    ))
    .await;
    let name = names::service_name("foo.xcc.test");
    assert_eq!(name, names::service_name("Foo.XCC.test."));
    assert!(name.starts_with("foo-xcc-test-"), "{name}");
    env.wait_for("Service", async |e| e.service(&name).await.is_some())
        .await;
    assert_eq!(
        env.service(&name).await.unwrap()["metadata"]["annotations"]["connectivity.tanzu.vmware.com/fqdn"],
        "foo.xcc.test"
    );
    env.stop().await;
}

fn conflict_condition(r: &ServiceRecord) -> Option<(String, String)> {
    r.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Conflict")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn port_conflict_has_a_deterministic_winner_and_is_reported() {
    let Some(env) = Env::start(
        "port_conflict_has_a_deterministic_winner_and_is_reported",
        IMPORTER,
    )
    .await
    else {
        return;
    };
    let a = env
        .create_record(imported(
            "test.some.domain-a",
            "test.some.domain",
            json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
            eps(&["10.0.0.1"], 443),
        ))
        .await;
    let b = env
        .create_record(imported(
            "test.some.domain-b",
            "test.some.domain",
            json!({"connectivity.tanzu.vmware.com/service-port": "8443"}),
            eps(&["10.0.0.2"], 8443),
        ))
        .await;
    // The lowest UID wins.
    let (winner, win_port, win_ip) = if uid(&a) < uid(&b) {
        (&a, 443, "10.0.0.1")
    } else {
        (&b, 8443, "10.0.0.2")
    };
    let records = env.records();
    let both = ["test.some.domain-a", "test.some.domain-b"];
    let ra = env
        .wait_condition(&both, "True", "PortsDisagree")
        .await
        .remove(0);
    let cond = ra.status.unwrap().conditions[0].clone();
    assert!(
        cond.message
            .starts_with(&format!("ports of {} used", winner.name_any())),
        "{}",
        cond.message
    );
    assert_eq!(cond.observed_generation, ra.metadata.generation);
    let svc = env.service(SVC).await.unwrap();
    assert_eq!(service_ports(&svc), [(win_port, "TCP".to_string())]);
    assert_eq!(endpoint_ips(&env.endpoints(SVC).await.unwrap()), [win_ip]);
    let conflicts = env.events(&env.ns, "Conflict").await;
    let mut regarding: Vec<String> = conflicts
        .iter()
        .map(|e| e["regarding"]["name"].as_str().unwrap().to_string())
        .collect();
    regarding.sort();
    assert_eq!(regarding, ["test.some.domain-a", "test.some.domain-b"]);
    assert!(conflicts.iter().all(|e| e["type"] == "Warning"));

    // Steady state: no more status writes or Events.
    let since = SystemTime::now();
    env.resync_round().await;
    env.assert_no_writes_since(since);

    // The loser comes round: both contribute, the condition turns False.
    let loser = if winner.name_any() == "test.some.domain-a" {
        "test.some.domain-b"
    } else {
        "test.some.domain-a"
    };
    let mut fixed = records.get(loser).await.unwrap();
    fixed.metadata.annotations.as_mut().unwrap().insert(
        "connectivity.tanzu.vmware.com/service-port".into(),
        win_port.to_string(),
    );
    for e in &mut fixed.spec.endpoints {
        e.port = i32::try_from(win_port).unwrap();
    }
    records
        .replace(loser, &PostParams::default(), &fixed)
        .await
        .unwrap();
    env.wait_for("both contribute", async |e| {
        e.endpoints(SVC)
            .await
            .is_some_and(|ep| endpoint_ips(&ep) == ["10.0.0.1", "10.0.0.2"])
    })
    .await;
    env.wait_condition(&both, "False", "Resolved").await;
    env.stop().await;
}

#[tokio::test]
async fn drift_is_repaired_and_foreign_services_are_left_alone() {
    let Some(env) = Env::start(
        "drift_is_repaired_and_foreign_services_are_left_alone",
        IMPORTER,
    )
    .await
    else {
        return;
    };
    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.ns);

    // A Service of the group's name that someone else made.
    let foreign: Service = serde_json::from_value(json!({
        "metadata": {"name": SVC, "labels": {"app": "mine"}},
        "spec": {"ports": [{"port": 9999}]},
    }))
    .unwrap();
    let foreign = services
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    env.create_record(imported(
        "test.some.domain-abcd1234",
        "test.some.domain",
        json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
        eps(&["10.0.0.1"], 443),
    ))
    .await;
    env.wait_condition(&["test.some.domain-abcd1234"], "True", "NotManaged")
        .await;
    let now = services.get(SVC).await.unwrap();
    assert_eq!(
        now.metadata.resource_version,
        foreign.metadata.resource_version
    );
    assert!(
        env.endpoints(SVC).await.is_none(),
        "nothing of the group written"
    );
    assert!(env.slices(SVC).await.is_empty());
    assert_eq!(env.events(&env.ns, "Conflict").await.len(), 1);

    // The foreign Service goes: the binder makes its own, the condition clears.
    services
        .delete(SVC, &DeleteParams::default())
        .await
        .unwrap();
    env.wait_for("binder's Service", async |e| {
        e.service(SVC).await.is_some_and(|s| {
            s["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "xcc-binder"
        }) && e.endpoints(SVC).await.is_some()
    })
    .await;
    let first_uid = env.service(SVC).await.unwrap()["metadata"]["uid"].clone();

    // Deleted by hand → recreated.
    services
        .delete(SVC, &DeleteParams::default())
        .await
        .unwrap();
    env.wait_for("recreated", async |e| {
        e.service(SVC)
            .await
            .is_some_and(|s| s["metadata"]["uid"] != first_uid)
    })
    .await;
    // Port edited by hand → put back.
    services
        .patch(
            SVC,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"port": 1234, "protocol": "TCP"}]}})),
        )
        .await
        .unwrap();
    env.wait_for("port repaired", async |e| {
        e.service(SVC)
            .await
            .is_some_and(|s| service_ports(&s) == [(443, "TCP".to_string())])
    })
    .await;
    // Endpoints deleted by hand → recreated; a slice deleted → recreated.
    let endpoints: Api<Endpoints> = Api::namespaced(env.client.clone(), &env.ns);
    endpoints
        .delete(SVC, &DeleteParams::default())
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(env.client.clone(), &env.ns);
    let slice = env.slices(SVC).await[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    slices
        .delete(&slice, &DeleteParams::default())
        .await
        .unwrap();
    env.wait_for("Endpoints and slice recreated", async |e| {
        e.endpoints(SVC)
            .await
            .is_some_and(|ep| endpoint_ips(&ep) == ["10.0.0.1"])
            && e.slices(SVC).await.len() == 1
    })
    .await;
    env.wait_condition(&["test.some.domain-abcd1234"], "False", "Resolved")
        .await;
    env.stop().await;
}

async fn remote_registry(env: &Env, name: &str, materialize: &str) {
    let api: Api<xcc_proto::crd::RemoteRegistry> = Api::namespaced(env.client.clone(), &env.ns);
    let rr = json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "RemoteRegistry",
        "metadata": {"name": name},
        "spec": {"address": "east.example.org:8443",
                 "tlsConfig": {"serverCA": "", "serverName": "east.example.org"},
                 "materialize": materialize},
    });
    api.patch(
        name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&rr),
    )
    .await
    .unwrap();
}

fn global_record(name: &str, rr: &str) -> Value {
    json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": name,
                     "labels": {"connectivity.tanzu.vmware.com/imported": "",
                                "connectivity.tanzu.vmware.com/remote-registry": rr}},
        "spec": {"fqdn": "mysql.shop.example.org",
                 "endpoints": [{"address": "10.9.0.1", "port": 3306}],
                 "ports": [{"name": "mysql", "port": 3306}],
                 "origin": {"namespace": "shop", "name": "mysql-svc"}},
    })
}

#[tokio::test]
async fn cilium_global_services_follow_their_records() {
    let Some(env) = Env::start("cilium_global_services_follow_their_records", CILIUM).await else {
        return;
    };
    remote_registry(&env, "east", "CiliumGlobalService").await;
    env.create_record(global_record("mysql.shop.example.org-east", "east"))
        .await;
    async fn global(e: &Env) -> Option<Value> {
        e.get("v1", "services", "shop", "mysql-svc").await
    }
    env.wait_for("global Service", async |e| global(e).await.is_some())
        .await;
    let svc = global(&env).await.unwrap();
    assert_eq!(
        svc["metadata"]["annotations"],
        json!({"service.cilium.io/global": "true", "service.cilium.io/shared": "false",
               "connectivity.tanzu.vmware.com/fqdn": "mysql.shop.example.org",
               "connectivity.tanzu.vmware.com/source-cluster": "east",
               "binder.xcc/install": env.ns})
    );
    assert_eq!(
        svc["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "xcc-binder"})
    );
    assert!(svc["metadata"].get("ownerReferences").is_none());
    assert_eq!(service_ports(&svc), [(3306, "TCP".to_string())]);
    assert!(svc["spec"].get("selector").is_none());
    let ns = env.namespace("shop").await.unwrap();
    assert_eq!(
        ns.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("xcc-binder")
    );
    let group = names::service_name("mysql.shop.example.org");
    // No Service-mode objects. The binder may have seen the record before the RemoteRegistry
    // that sets the mode (two watches), and made the group's objects for a moment: their
    // removal ends before the steady state is measured.
    env.wait_for("no Service-mode objects", async |e| {
        e.service(&group).await.is_none() && e.slices(&group).await.is_empty()
    })
    .await;
    env.wait_for(
        "Created Events for the Namespace and the Service",
        async |e| {
            e.events("shop", "Created").await.len() == 1
                && e.events("default", "Created").await.len() == 1
        },
    )
    .await;

    // Steady state.
    let since = SystemTime::now();
    env.resync_round().await;
    env.assert_no_writes_since(since);

    // Mode switch: the registry materialises Services now → the global Service goes, the
    // group's objects come; and back.
    remote_registry(&env, "east", "Service").await;
    env.wait_for("switched to Service", async |e| {
        global(e).await.is_none()
            && e.endpoints(&group).await.is_some()
            && e.service(&group).await.is_some()
    })
    .await;
    remote_registry(&env, "east", "CiliumGlobalService").await;
    env.wait_for("switched back", async |e| {
        global(e).await.is_some()
            && e.service(&group).await.is_none()
            && e.endpoints(&group).await.is_none()
            && e.slices(&group).await.is_empty()
    })
    .await;

    // Source gone, no local endpoints → removed.
    env.delete_record("mysql.shop.example.org-east").await;
    env.wait_for("orphan removed", async |e| global(e).await.is_none())
        .await;
    assert!(env.namespace("shop").await.is_some(), "the namespace stays");

    // Source gone with local endpoints → kept.
    env.create_record(global_record("mysql.shop.example.org-east", "east"))
        .await;
    env.wait_for("global Service again", async |e| global(e).await.is_some())
        .await;
    let slices: Api<EndpointSlice> = Api::namespaced(env.client.clone(), "shop");
    let local: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "mysql-svc-local",
                     "labels": {"kubernetes.io/service-name": "mysql-svc",
                                "endpointslice.kubernetes.io/managed-by": "someone-else"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.2.0.7"]}],
        "ports": [{"port": 3306}],
    }))
    .unwrap();
    slices.create(&PostParams::default(), &local).await.unwrap();
    env.delete_record("mysql.shop.example.org-east").await;
    env.wait_for("OrphanKept Event", async |e| {
        !e.events("shop", "OrphanKept").await.is_empty()
    })
    .await;
    assert!(global(&env).await.is_some(), "kept: it has local endpoints");

    // A record without an origin cannot be a global Service: a Warning Event, nothing else.
    let mut no_origin = global_record("plain.shop.example.org-east", "east");
    no_origin["spec"].as_object_mut().unwrap().remove("origin");
    no_origin["spec"]["fqdn"] = json!("plain.shop.example.org");
    env.create_record(no_origin).await;
    env.wait_for("NoOrigin Event", async |e| {
        e.events(&e.ns, "NoOrigin")
            .await
            .iter()
            .any(|ev| ev["regarding"]["name"] == "plain.shop.example.org-east")
    })
    .await;
    assert!(
        env.service(&names::service_name("plain.shop.example.org"))
            .await
            .is_none()
    );

    // An unmanaged Service of the origin's name is never taken over.
    let services: Api<Service> = Api::namespaced(env.client.clone(), "shop");
    let theirs: Service = serde_json::from_value(json!({
        "metadata": {"name": "other-svc"}, "spec": {"ports": [{"port": 1}]},
    }))
    .unwrap();
    let theirs = services
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let mut rec = global_record("other.shop.example.org-east", "east");
    rec["spec"]["origin"]["name"] = json!("other-svc");
    rec["spec"]["fqdn"] = json!("other.shop.example.org");
    env.create_record(rec).await;
    env.wait_condition(&["other.shop.example.org-east"], "True", "NotManaged")
        .await;
    assert_eq!(
        services
            .get("other-svc")
            .await
            .unwrap()
            .metadata
            .resource_version,
        theirs.metadata.resource_version
    );
    env.delete_record("other.shop.example.org-east").await;

    // Another install's global Service (and one made before the install annotation existed):
    // never taken over, and not deleted as an orphan although it has no local endpoints.
    for (name, install) in [
        ("theirs-svc", Some("xcc-elsewhere")),
        ("unstamped-svc", None),
    ] {
        let theirs = services
            .create(&PostParams::default(), &made_global(name, install))
            .await
            .unwrap();
        let record = format!("{name}.shop.example.org-east");
        let mut rec = global_record(&record, "east");
        rec["spec"]["origin"]["name"] = json!(name);
        rec["spec"]["fqdn"] = json!(format!("{name}.shop.example.org"));
        env.create_record(rec).await;
        env.wait_condition(&[&record], "True", "NotManaged").await;
        let before = env.handle.reconciles();
        env.delete_record(&record).await;
        // Idle again only once a reconcile succeeded, i.e. without the record.
        env.poll("reconciled without the record", |e| {
            e.handle.reconciles() > before && e.handle.is_idle()
        })
        .await;
        assert_eq!(
            services.get(name).await.unwrap().metadata.resource_version,
            theirs.metadata.resource_version,
            "{name} untouched"
        );
    }
    // The kept global Service stays for the next tests: their binders are other installs.
    env.stop().await;
}

/// A Cilium global Service as the binder of the install `install` (its namespace) makes it, or
/// as one made before the install annotation existed (`None`).
fn made_global(name: &str, install: Option<&str>) -> Service {
    let mut svc = json!({
        "metadata": {"name": name,
                     "labels": {"app.kubernetes.io/managed-by": "xcc-binder"},
                     "annotations": {"service.cilium.io/global": "true",
                                     "service.cilium.io/shared": "false",
                                     "connectivity.tanzu.vmware.com/fqdn": format!("{name}.example.org")}},
        "spec": {"ports": [{"port": 3306}]},
    });
    if let Some(install) = install {
        svc["metadata"]["annotations"]["binder.xcc/install"] = json!(install);
    }
    serde_json::from_value(svc).unwrap()
}

#[tokio::test]
async fn service_mode_binders_leave_other_installs_global_services_alone() {
    let Some(mut env) = Env::new(
        "service_mode_binders_leave_other_installs_global_services_alone",
        IMPORTER,
    )
    .await
    else {
        return;
    };
    // Left by a Cilium-mode binder of another install, or of none we can tell: this binder,
    // under overlays/importer, may not even read what their orphan check needs.
    let elsewhere = env.cp.namespace("shop").await;
    let services: Api<Service> = Api::namespaced(env.client.clone(), &elsewhere);
    let mut made = Vec::new();
    for (name, install) in [
        ("theirs-svc", Some("xcc-elsewhere")),
        ("unstamped-svc", None),
    ] {
        made.push(
            services
                .create(&PostParams::default(), &made_global(name, install))
                .await
                .unwrap(),
        );
    }
    let since = SystemTime::now();
    env.run().await;
    env.poll("ready and idle", |e| {
        e.handle.is_ready() && e.handle.is_idle()
    })
    .await;
    for svc in made {
        assert_eq!(
            services
                .get(&svc.name_any())
                .await
                .unwrap()
                .metadata
                .resource_version,
            svc.metadata.resource_version
        );
    }
    env.assert_no_writes_since(since);
    env.stop().await;
}

#[tokio::test]
async fn a_refused_orphan_check_keeps_the_service_and_warns_once() {
    let Some(mut env) = Env::new(
        "a_refused_orphan_check_keeps_the_service_and_warns_once",
        IMPORTER,
    )
    .await
    else {
        return;
    };
    // This install made it in Cilium mode, and runs under overlays/importer now: the orphan
    // check may not list the EndpointSlices there.
    let shop = env.cp.namespace("shop").await;
    let services: Api<Service> = Api::namespaced(env.client.clone(), &shop);
    let ours = services
        .create(
            &PostParams::default(),
            &made_global("mysql-svc", Some(env.ns.as_str())),
        )
        .await
        .unwrap();
    env.run().await;
    let list = format!("list discovery.k8s.io/endpointslices in {shop:?}");
    let event = format!("create events.k8s.io/events in {shop:?}");
    // The audit log is no watch: polled. Retried with backoff, warned once.
    env.poll("the orphan check retried", |e| {
        e.cp.forbidden(&e.id.user)
            .iter()
            .filter(|f| **f == list)
            .count()
            >= 2
    })
    .await;
    assert!(!env.handle.is_idle(), "a retry is pending");
    let mut refused = env.cp.forbidden(&env.id.user);
    refused.retain(|f| *f != list);
    assert_eq!(
        refused,
        [event],
        "one Warning Event (refused as well here), nothing else"
    );
    assert_eq!(
        services
            .get("mysql-svc")
            .await
            .unwrap()
            .metadata
            .resource_version,
        ours.metadata.resource_version,
        "kept"
    );
    env.cancel.cancel();
    env.task.take().unwrap().await.unwrap().unwrap();
}

#[tokio::test]
async fn ready_only_after_the_first_sync() {
    let Some(mut env) = Env::new("ready_only_after_the_first_sync", IMPORTER_ALONE).await else {
        return;
    };
    env.create_record(imported(
        "test.some.domain-abcd1234",
        "test.some.domain",
        json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
        eps(&["10.0.0.1", "10.0.0.2"], 443),
    ))
    .await;
    env.create_record(imported(
        "foobar.some.domain-abcd1234",
        "foobar.some.domain",
        json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
        eps(&["10.0.0.5"], 443),
    ))
    .await;
    assert!(!env.handle.is_ready());
    // This run with metrics registered, as `xcc binder` does.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let controller = Controller::new(
        env.id.client().await,
        Config::new(&env.ns),
        metrics,
        Health::default(),
    );
    env.pending = Some(controller);
    env.run().await;
    assert!(!env.handle.is_ready(), "not ready before the first sync");
    env.poll("ready", |e| e.handle.is_ready()).await;
    // Ready means reconciled: the objects are there the moment it says so.
    assert_eq!(
        endpoint_ips(&env.endpoints(SVC).await.unwrap()),
        ["10.0.0.1", "10.0.0.2"]
    );
    assert!(
        env.endpoints(&names::service_name("foobar.some.domain"))
            .await
            .is_some()
    );

    let scrape = |h: &Handle| {
        h.refresh_gauges();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };
    // The gauges follow the watches, which may trail the writes a little. The Service watch
    // spans all namespaces (Cilium global Services): it counts what earlier tests' binders
    // left too, which stays put while this test runs alone.
    let managed = Api::<Service>::all(env.client.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=xcc-binder"))
        .await
        .unwrap()
        .items;
    let here = managed
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(env.ns.as_str()))
        .count();
    assert_eq!(here, 2);
    let service_gauge = format!(
        "xcc_binder_managed_objects{{kind=\"Service\"}} {}\n",
        managed.len()
    );
    env.poll("managed gauges", |e| {
        let text = scrape(&e.handle);
        text.contains(&service_gauge)
            && text.contains("xcc_binder_managed_objects{kind=\"Endpoints\"} 2\n")
            && text.contains("xcc_binder_managed_objects{kind=\"EndpointSlice\"} 2\n")
    })
    .await;
    let text = scrape(&env.handle);
    for line in [
        "xcc_binder_objects_written_total{kind=\"Service\",verb=\"apply\"} 2",
        "xcc_binder_objects_written_total{kind=\"Endpoints\",verb=\"apply\"} 2",
        "xcc_binder_objects_written_total{kind=\"EndpointSlice\",verb=\"apply\"} 2",
        "xcc_binder_reconcile_errors_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
    let ok: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("xcc_binder_reconciles_total{result=\"ok\"} "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(ok >= 2, "{ok}");

    // A restarted controller finds everything in place and writes nothing.
    env.cancel.cancel();
    env.task.take().unwrap().await.unwrap().unwrap();
    env.cancel = CancellationToken::new();
    let since = SystemTime::now();
    env.run().await;
    env.poll("ready again", |e| e.handle.is_ready() && e.handle.is_idle())
        .await;
    env.assert_no_writes_since(since);
    env.stop().await;
}

#[tokio::test]
async fn runs_under_the_xcc_binder_lease_and_stops_cleanly() {
    use k8s_openapi::api::coordination::v1::Lease;
    use xcc_controller::leader::{LeaderConfig, run_as_leader};

    let Some(mut env) = Env::new(
        "runs_under_the_xcc_binder_lease_and_stops_cleanly",
        IMPORTER,
    )
    .await
    else {
        return;
    };
    let controller = env.pending.take().unwrap();
    let handle = controller.handle();
    let mut leader = LeaderConfig::new(&env.ns, xcc_binder::controller::COMPONENT);
    leader.identity = "binder-0".into();
    let (client, cancel) = (env.id.client().await, env.cancel.clone());
    let task = tokio::spawn(async move {
        run_as_leader(
            client,
            Some(leader),
            cancel,
            |_| {},
            |token| controller.run(token),
        )
        .await
    });
    env.poll("ready under the Lease", |_| handle.is_ready())
        .await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let lease = leases.get("xcc-binder").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("binder-0")
    );
    env.cancel.cancel();
    tokio::time::timeout(TIMEOUT, task)
        .await
        .expect("stops on cancel")
        .unwrap()
        .unwrap();
    assert!(!handle.is_ready(), "not ready once stopped");
    env.assert_nothing_forbidden();
}

/// The binder observes `xcc_binder_propagation_seconds` once per propagation stamp, after it has
/// written the objects: not for a record stamped before it started, not again on a resync; a
/// stamp far ahead of its clock is counted as skew, not observed.
#[tokio::test]
async fn propagation_is_observed_once_per_stamp_after_the_write() {
    let Some(mut env) = Env::new(
        "propagation_is_observed_once_per_stamp_after_the_write",
        IMPORTER,
    )
    .await
    else {
        return;
    };
    use xcc_proto::propagation::{CHANGED_AT_ANNOTATION, format_stamp};
    let stamp_at = |t: SystemTime| {
        json!({"connectivity.tanzu.vmware.com/service-port": "443",
               CHANGED_AT_ANNOTATION: format_stamp(t)})
    };
    // Changed while the binder was not running: its latency would be the binder's downtime.
    env.create_record(imported(
        "foobar.some.domain-abcd1234",
        "foobar.some.domain",
        stamp_at(SystemTime::now() - Duration::from_secs(10)),
        eps(&["10.0.0.5"], 443),
    ))
    .await;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    env.pending = Some(Controller::new(
        env.id.client().await,
        Config::new(&env.ns),
        metrics,
        Health::default(),
    ));
    env.run().await;
    env.poll("ready", |e| e.handle.is_ready()).await;
    let scrape = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };
    let value = |text: &str, series: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    let count = "xcc_binder_propagation_seconds_count{source_cluster=\"rr\"} ";
    let skew = "xcc_binder_propagation_clock_skew_total{source_cluster=\"rr\"} ";
    assert_eq!(value(&scrape(), count), 0, "{}", scrape());

    // A change after the start: observed once its objects are written.
    env.create_record(imported(
        "test.some.domain-abcd1234",
        "test.some.domain",
        stamp_at(SystemTime::now()),
        eps(&["10.0.0.1"], 443),
    ))
    .await;
    env.wait_for("Endpoints written", async |e| {
        e.endpoints(SVC)
            .await
            .is_some_and(|ep| endpoint_ips(&ep) == ["10.0.0.1"])
    })
    .await;
    // Observed right after the writes, in the same reconcile: poll the in-process registry.
    env.poll("observed", |_| value(&scrape(), count) == 1).await;
    env.resync_round().await;
    assert_eq!(
        value(&scrape(), count),
        1,
        "a resync observes nothing again"
    );

    // The next change, stamped anew.
    env.annotate_record(
        "test.some.domain-abcd1234",
        json!({CHANGED_AT_ANNOTATION: format_stamp(SystemTime::now())}),
    )
    .await;
    env.poll("observed again", |_| value(&scrape(), count) == 2)
        .await;
    // A stamp a day ahead of this clock: counted as skew, not observed.
    env.annotate_record(
        "test.some.domain-abcd1234",
        json!({CHANGED_AT_ANNOTATION: format_stamp(SystemTime::now() + Duration::from_secs(86400))}),
    )
    .await;
    env.poll("skew counted", |_| value(&scrape(), skew) == 1)
        .await;
    let text = scrape();
    assert_eq!(value(&text, count), 2, "{text}");
    assert_eq!(
        value(
            &text,
            "xcc_binder_propagation_seconds_bucket{le=\"60.0\",source_cluster=\"rr\"} "
        ),
        2,
        "{text}"
    );
    env.stop().await;
}
