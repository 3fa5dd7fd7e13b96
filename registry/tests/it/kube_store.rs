//! `--store kube` on a real API server (`xcc_testkube`), with real registries (mTLS on
//! loopback) as remotes: XCC v1's registry-client cases (status, names, labels and owner
//! references of imports, `allowedDomains` filtering and its validation), its orphan sweep in a
//! fixed form (scoped to one remote's labels and UID, after a snapshot marker or a quiet period),
//! a restart that reconnects, a remote exporting nothing, exports (label removal → DELETE,
//! imported records never exported, annotations passed with the exact prefix), RR in another
//! namespace, RR deletion, zero writes at steady state, restart, leader election.
//!
//! The registry under test runs as the ServiceAccount `xcc-registry` bound exactly to the RBAC
//! rendered from `deploy/base` (`deploy/overlays/grants-istio` for the grant test), with a token
//! from the TokenRequest API, so a missing rule fails a test; every test ends by checking the
//! audit log shows it was refused nothing. Writes are counted from the API server's audit log.
//! Waits on API state are watches; waits on the registry's own state re-check on its catalog
//! or peer events, or poll with a timeout; nothing sleeps to synchronise (the only fixed wait
//! is the quiet period over which writes are counted).
//!
//! The registry reads RemoteRegistries and exported ServiceRecords in every namespace (and
//! reports those RemoteRegistries outside its own), so two registries on one API server would
//! report each other's: these tests share the binary's control plane but each runs alone on it
//! ([`Turn::alone`]), starting from a cluster without RemoteRegistries or ServiceRecords.
//!
//! Two tests stay on the in-process fake (module [`fake`]): they need what a real API server
//! cannot be made to do on demand (410 Gone after compaction; an object's UID changing without
//! a watch event in between).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use futures::StreamExt;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use xcc_proto::crd::{RemoteRegistry, ServiceRecord};
use xcc_registry::hamlet::client::Backoff;
use xcc_registry::store::kube::KubeConfig;
use xcc_registry::{Registry, RegistryConfig, StoreConfig};
use xcc_testkube::{ControlPlane, Identity, Request, Turn};

const RR: &str = "some-remote-registry";
const H: &str = "06df7236"; // fnv1a32("some-remote-registry")
const V: &str = "connectivity.tanzu.vmware.com/v1alpha1";
const IMPORTED: &str = "connectivity.tanzu.vmware.com/imported";
const REMOTE_LABEL: &str = "connectivity.tanzu.vmware.com/remote-registry";
const EXPORT: &str = "connectivity.tanzu.vmware.com/export";

/// Objects of one kind in one namespace, by name, as JSON.
type Objects = BTreeMap<String, Value>;

/// A test's share of the control plane: its turn, the registry's namespace (where `deploy/`
/// installs it) and the registry's ServiceAccount there.
struct Lab {
    cp: &'static ControlPlane,
    admin: kube::Client,
    ns: String,
    id: Identity,
    _turn: Turn,
}

impl Lab {
    /// `None` (after a skip line) without a control plane, unless one is required.
    async fn new(test: &str) -> Option<Self> {
        Self::with_rbac(test, "base").await
    }

    /// The registry bound to the RBAC of the `deploy/` directory `overlay`.
    async fn with_rbac(test: &str, overlay: &str) -> Option<Self> {
        let cp = xcc_testkube::shared(test)?;
        let turn = Turn::alone().await;
        cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
        let admin = cp.client().await;
        // What earlier tests left: their registries are gone, their objects must not be seen.
        for ar in [ar_rr(), ar_sr()] {
            let api: Api<DynamicObject> = Api::all_with(admin.clone(), &ar);
            for o in api.list(&ListParams::default()).await.unwrap() {
                let ns = o.metadata.namespace.clone().unwrap();
                let name = o.metadata.name.clone().unwrap();
                let _ = Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &ar)
                    .delete(&name, &DeleteParams::default())
                    .await;
            }
        }
        let ns = cp.namespace("registry").await;
        let id = cp.identity(&ns, overlay, "xcc-registry").await;
        Some(Self {
            cp,
            admin,
            ns,
            id,
            _turn: turn,
        })
    }

    async fn namespace(&self, prefix: &str) -> String {
        self.cp.namespace(prefix).await
    }

    /// The store as the registry's ServiceAccount.
    async fn kube_config(&self, leader_elect: bool) -> KubeConfig {
        let mut k = KubeConfig::new(self.id.client().await, leader_elect);
        k.status_resync = Duration::from_millis(100);
        k
    }

    /// The importing registry ("west") on the kube store.
    async fn west(&self, pki: &Pki) -> (Registry, tokio_util::sync::CancellationToken) {
        self.west_with(pki, |_| {}).await
    }

    async fn west_with(
        &self,
        pki: &Pki,
        f: impl FnOnce(&mut RegistryConfig),
    ) -> (Registry, tokio_util::sync::CancellationToken) {
        let mut cfg = RegistryConfig::loopback(pki.cluster("west"));
        cfg.namespace = self.ns.clone();
        cfg.store = StoreConfig::Kube(self.kube_config(false).await);
        cfg.client.backoff = Backoff {
            min: Duration::from_millis(50),
            max: Duration::from_millis(400),
        };
        cfg.client.quiet_period = Duration::from_millis(300);
        f(&mut cfg);
        start_with(cfg).await
    }

    fn api(&self, ar: &ApiResource, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.admin.clone(), ns, ar)
    }

    fn srs(&self, ns: &str) -> Api<ServiceRecord> {
        Api::namespaced(self.admin.clone(), ns)
    }

    fn rrs(&self, ns: &str) -> Api<RemoteRegistry> {
        Api::namespaced(self.admin.clone(), ns)
    }

    /// Create `obj` (a ServiceRecord or RemoteRegistry, in its namespace) as the admin;
    /// returns the stored object.
    async fn create(&self, obj: Value) -> Value {
        let ar = if obj["kind"] == "RemoteRegistry" {
            ar_rr()
        } else {
            ar_sr()
        };
        let ns = obj["metadata"]["namespace"].as_str().unwrap().to_string();
        let o: DynamicObject = serde_json::from_value(obj).unwrap();
        let created = self
            .api(&ar, &ns)
            .create(&PostParams::default(), &o)
            .await
            .unwrap_or_else(|e| panic!("create {:?}: {e}", o.metadata.name));
        serde_json::to_value(created).unwrap()
    }

    /// Create a RemoteRegistry for the remote at `addr`; returns its UID.
    async fn create_rr(
        &self,
        name: &str,
        ns: &str,
        addr: std::net::SocketAddr,
        domains: Option<&[&str]>,
    ) -> String {
        let rr = self
            .create(rr_body(name, ns, &addr.to_string(), domains))
            .await;
        rr["metadata"]["uid"].as_str().unwrap().to_string()
    }

    async fn set_domains(&self, name: &str, domains: &[&str]) -> i64 {
        let rr = self
            .rrs(&self.ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"allowedDomains": domains}})),
            )
            .await
            .expect("patch RR");
        rr.metadata.generation.expect("generation")
    }

    async fn records(&self, ns: &str) -> Objects {
        let api = self.api(&ar_sr(), ns);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap(),
                    serde_json::to_value(o).unwrap(),
                )
            })
            .collect()
    }

    async fn sr_names(&self) -> Vec<String> {
        self.records(&self.ns).await.into_keys().collect()
    }

    async fn sr(&self, name: &str) -> Option<Value> {
        self.records(&self.ns).await.remove(name)
    }

    async fn uid_of(&self, name: &str) -> String {
        uid(&self.sr(name).await.expect("record"))
    }

    /// Wait (on a watch) until the registry's namespace holds exactly the records `want`.
    async fn wait_names(&self, want: Vec<String>) -> Objects {
        await_objects(
            self.api(&ar_sr(), &self.ns),
            &format!("records {want:?}"),
            |o| o.keys().eq(want.iter()),
        )
        .await
    }

    /// Wait (on a watch) until `cond` holds for the record `name` (`None`: absent).
    async fn wait_sr(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        cond: impl Fn(Option<&Value>) -> bool,
    ) -> Option<Value> {
        await_objects(self.api(&ar_sr(), ns), what, |o| cond(o.get(name)))
            .await
            .remove(name)
    }

    /// Wait (on a watch) until `cond` holds for the status of the RemoteRegistry `name`.
    async fn wait_rr(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        cond: impl Fn(&Value) -> bool,
    ) -> Value {
        let status = |o: &Objects| o.get(name).map_or(Value::Null, |r| r["status"].clone());
        status(&await_objects(self.api(&ar_rr(), ns), what, |o| cond(&status(o))).await)
    }

    async fn wait_synced(&self, name: &str) -> Value {
        self.wait_rr(&self.ns, name, &format!("{name} Synced=True"), |s| {
            condition(s, "Synced").is_some_and(|c| c.0 == "True")
        })
        .await
    }

    /// The registry's writes so far (audit log).
    fn writes(&self) -> Vec<Request> {
        self.cp.writes(&self.id.user)
    }

    /// ServiceRecords the registry deleted so far.
    fn sr_deletes(&self) -> usize {
        self.sr_writes(|w| w.verb == "delete" && w.code == 200)
    }

    /// ServiceRecords the registry created so far (server-side apply creating is a patch
    /// answered 201).
    fn sr_creates(&self) -> usize {
        self.sr_writes(|w| w.code == 201)
    }

    fn sr_writes(&self, f: impl Fn(&Request) -> bool) -> usize {
        self.writes()
            .iter()
            .filter(|w| w.resource == "servicerecords" && f(w))
            .count()
    }

    /// The audit log is written as each request completes, possibly just after its answer:
    /// wait until `count` reaches `n`, then it must be exactly `n`.
    async fn assert_count(&self, what: &str, count: impl Fn(&Self) -> usize, n: usize) {
        wait_for(what, || count(self), |c| *c >= n).await;
        assert_eq!(count(self), n, "{what}: {:#?}", self.writes());
    }

    /// Nothing the registry asked for was refused (and the audit log did record its requests).
    fn assert_not_forbidden(&self) {
        assert!(
            !self.cp.requests(&self.id.user).is_empty(),
            "no request of {} in the audit log",
            self.id.user
        );
        assert_eq!(self.cp.forbidden(&self.id.user), Vec::<String>::new());
    }
}

fn ar_sr() -> ApiResource {
    ApiResource::erase::<ServiceRecord>(&())
}

fn ar_rr() -> ApiResource {
    ApiResource::erase::<RemoteRegistry>(&())
}

fn uid(o: &Value) -> String {
    o["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Watch `api` until `cond` holds for its objects; panic with `what` and the last state
/// after [`WAIT`].
async fn await_objects(
    api: Api<DynamicObject>,
    what: &str,
    cond: impl Fn(&Objects) -> bool,
) -> Objects {
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut state = Objects::new();
    let mut listing = Objects::new();
    let mut listed = false;
    let entry = |o: DynamicObject| {
        (
            o.metadata.name.clone().unwrap(),
            serde_json::to_value(o).unwrap(),
        )
    };
    loop {
        if listed && cond(&state) {
            return state;
        }
        let ev = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => panic!("timed out waiting for {what}; last state: {state:#?}"),
            Ok(ev) => ev.expect("the watch ended"),
        };
        match ev {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(o)) => {
                listing.extend([entry(o)]);
            }
            Ok(Event::InitDone) => {
                state = std::mem::take(&mut listing);
                listed = true;
            }
            Ok(Event::Apply(o)) => {
                state.extend([entry(o)]);
            }
            Ok(Event::Delete(o)) => {
                state.remove(&entry(o).0);
            }
            Err(e) => panic!("watching for {what}: {e}"),
        }
    }
}

/// Poll every 20 ms until `cond` holds; panic with `what` (and the last state) after [`WAIT`].
/// Only for what nothing reports a change of: the API server's audit log, a file the API
/// server appends to as each request completes (possibly just after its answer).
async fn wait_for<T: std::fmt::Debug>(
    what: &str,
    mut probe: impl FnMut() -> T,
    cond: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = probe();
        if cond(&v) {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}; last state: {v:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until `cond` holds for the registry's peers, re-checking on every peer change.
async fn wait_peers(reg: &Registry, what: &str, cond: impl Fn(&Registry) -> bool) {
    let mut rx = reg.peers.subscribe();
    let fut = async {
        while !cond(reg) {
            rx.changed().await.expect("peer table closed");
        }
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"));
}

fn runs_client(reg: &Registry, name: &str) -> bool {
    reg.peers.list().iter().any(|p| p.name == name)
}

/// An exporting registry ("east", memory store, end-of-snapshot marker on offer).
async fn east(pki: &Pki, fqdns: &[&str]) -> (Registry, tokio_util::sync::CancellationToken) {
    let (reg, c) = start(pki.cluster("east")).await;
    for f in fqdns {
        reg.catalog.upsert(export("east", "ns", f, "10.0.0.1"));
    }
    (reg, c)
}

fn rr_body(name: &str, ns: &str, addr: &str, domains: Option<&[&str]>) -> Value {
    let mut spec = json!({
        "address": addr,
        "tlsConfig": {"serverCA": "", "serverName": "localhost"},
    });
    if let Some(d) = domains {
        spec["allowedDomains"] = json!(d);
    }
    json!({
        "apiVersion": V, "kind": "RemoteRegistry",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    })
}

fn condition(status: &Value, type_: &str) -> Option<(String, String, String)> {
    status["conditions"].as_array()?.iter().find_map(|c| {
        (c["type"] == type_).then(|| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
    })
}

fn condition_types(status: &Value) -> Vec<String> {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn imported_names(fqdns: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = fqdns.iter().map(|f| format!("{f}-{H}")).collect();
    v.sort();
    v
}

/// An import as an earlier run of the registry stored it.
fn import_body(ns: &str, name: &str, fqdn: &str, remote: &str, owner_uid: &str) -> Value {
    json!({
        "apiVersion": V, "kind": "ServiceRecord",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": {IMPORTED: "", REMOTE_LABEL: remote},
            "ownerReferences": [{"apiVersion": V, "kind": "RemoteRegistry", "name": remote, "uid": owner_uid}],
        },
        "spec": {"fqdn": fqdn, "endpoints": [{"address": "10.9.9.9", "port": 443}]},
    })
}

/// A record of someone else's (a user's, or exported).
fn record_body(ns: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": V, "kind": "ServiceRecord",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"fqdn": "user.example.org", "endpoints": []},
    })
}

fn exported_sr(ns: &str, name: &str, fqdn: &str, labels: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": V, "kind": "ServiceRecord",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": {"fqdn": fqdn, "endpoints": [{"address": "10.1.0.1", "port": 443}]},
    })
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

// ----- status, names, labels, owner refs, a 63-letter label, zero writes at steady state -----

#[tokio::test]
async fn valid_rr_imports_named_labelled_owned_then_no_writes() {
    let Some(lab) = Lab::new("valid_rr_imports_named_labelled_owned_then_no_writes").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let long = format!("{}.some.domain", "a".repeat(63));
    let (east, _ec) = east(&pki, &["some-service.some.domain", &long]).await;
    let (west, _wc) = lab
        .west_with(&pki, |c| {
            c.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
        })
        .await;
    let uid = lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;

    lab.wait_names(imported_names(&["some-service.some.domain", &long]))
        .await;
    let status = lab.wait_synced(RR).await;
    // `Valid=True` and `observedGeneration` (plus our Connected/Synced conditions and counters).
    assert_eq!(condition_types(&status), ["Valid", "Connected", "Synced"]);
    assert_eq!(
        condition(&status, "Valid").map(|c| c.0),
        Some("True".to_string())
    );
    assert_eq!(
        condition(&status, "Connected").map(|c| (c.0, c.1)),
        Some(("True".to_string(), "Connected".to_string()))
    );
    assert_eq!(status["observedGeneration"], json!(1));
    assert!(status["lastSyncTime"].is_string(), "{status}");
    lab.wait_rr(&lab.ns, RR, "importedRecords 2", |s| {
        s["importedRecords"] == json!(2)
    })
    .await;
    // The imported record: name, labels, annotations, owner references, spec.
    let r = lab
        .sr(&format!("some-service.some.domain-{H}"))
        .await
        .expect("record");
    assert_eq!(
        r["metadata"]["labels"],
        json!({IMPORTED: "", REMOTE_LABEL: RR})
    );
    // The allow-listed annotations, and the exporter's propagation stamp.
    let mut annotations = r["metadata"]["annotations"].clone();
    let stamp = annotations
        .as_object_mut()
        .and_then(|a| a.remove(xcc_proto::propagation::CHANGED_AT_ANNOTATION))
        .expect("the exporter's stamp");
    assert!(xcc_proto::propagation::parse_stamp(stamp.as_str().unwrap_or_default()).is_ok());
    assert_eq!(
        annotations,
        json!({"connectivity.tanzu.vmware.com/service-port": "443"})
    );
    assert_eq!(
        r["metadata"]["ownerReferences"],
        json!([{"apiVersion": V, "kind": "RemoteRegistry", "name": RR, "uid": uid}])
    );
    assert_eq!(
        r["spec"],
        json!({"fqdn": "some-service.some.domain", "endpoints": [{"address": "10.0.0.1", "port": 443}]})
    );

    // Zero writes at steady state: count over a quiet period that spans many status resyncs
    // (100 ms). (That a relist writes nothing either is shown on the fake: `fake`.)
    let before = lab.writes();
    let st_before = lab.wait_rr(&lab.ns, RR, "status", |_| true).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = lab.writes();
    assert_eq!(
        after[before.len()..],
        [] as [Request; 0],
        "writes at steady state; RemoteRegistry status before {st_before:#}, after {:#}",
        lab.wait_rr(&lab.ns, RR, "status", |_| true).await
    );

    let addr = west.metrics_addr.expect("metrics bound");
    assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
    let metrics = http_get(addr, "/metrics").await;
    for line in [
        "xcc_kube_writes_total{kind=\"ServiceRecord\",verb=\"Apply\"} 2",
        "xcc_kube_imported_records 2",
        "xcc_kube_remote_registries 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(
        !metrics.contains("verb=\"Delete\""),
        "no deletes: {metrics}"
    );
    assert_eq!(lab.sr_deletes(), 0);
    lab.assert_not_forbidden();
}

// ----- allowedDomains: empty, tightened, mixed case and trailing dots, emptied again -----

#[tokio::test]
async fn allowed_domains_tighten_and_loosen() {
    let Some(lab) = Lab::new("allowed_domains_tighten_and_loosen").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let all = [
        "some-service.some.domain",
        "other.some.domain",
        "other.somesome.domain",
        "some.other.domain",
        "domain.with.dot.at.end.",
        "domain.WITH.mixed.case",
        "yet.another.domain",
    ];
    let (east, _ec) = east(&pki, &all).await;
    let (_west, _wc) = lab.west(&pki).await;
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, Some(&[]))
        .await;
    let seven = imported_names(&[
        "some-service.some.domain",
        "other.some.domain",
        "other.somesome.domain",
        "some.other.domain",
        "domain.with.dot.at.end",
        "domain.with.mixed.case",
        "yet.another.domain",
    ]);
    // An empty filter imports all seven.
    let records = lab.wait_names(seven.clone()).await;
    // The canonical FQDN (lowercase, no trailing dot) is stored.
    assert_eq!(
        records[&format!("domain.with.mixed.case-{H}")]["spec"]["fqdn"],
        "domain.with.mixed.case"
    );
    // Tightened to `some.domain`: only its two names stay.
    let g = lab.set_domains(RR, &["some.domain"]).await;
    lab.wait_names(imported_names(&[
        "some-service.some.domain",
        "other.some.domain",
    ]))
    .await;
    lab.wait_rr(&lab.ns, RR, "observedGeneration", |s| {
        s["observedGeneration"] == json!(g)
    })
    .await;
    // Entries with a trailing dot or mixed case match the canonical names: five.
    lab.set_domains(
        RR,
        &[
            "some.domain",
            "some.other.domain",
            "domain.with.dot.at.end.",
            "domain.with.MIXED.case",
        ],
    )
    .await;
    lab.wait_names(imported_names(&[
        "some-service.some.domain",
        "other.some.domain",
        "some.other.domain",
        "domain.with.dot.at.end",
        "domain.with.mixed.case",
    ]))
    .await;
    // Emptied again: all seven come back.
    let g = lab.set_domains(RR, &[]).await;
    lab.wait_names(seven).await;
    lab.wait_rr(&lab.ns, RR, "observedGeneration", |s| {
        s["observedGeneration"] == json!(g)
    })
    .await;
    lab.assert_not_forbidden();
}

// ----- stale imports swept, scoped to one remote; a remote exporting nothing -----

/// Pre-existing records: our stale and live imports (labels + UID), another RemoteRegistry's
/// import, an exported record and an unlabelled record. After the sweep (marker or quiet
/// period) only our stale import is gone; our live import is the same object (updated in
/// place).
async fn stale_imports_removed_scoped(test: &str, marker: bool) {
    let Some(lab) = Lab::new(test).await else {
        return;
    };
    let ns = lab.ns.as_str();
    let pki = Pki::new("xcc.test");
    let live = ["some-service.some.domain", "another-service.some.domain"];
    // The remote stays up until the end of the test.
    let mut _east = None;
    let mut _go = None;
    let addr = if marker {
        let (east, ec) = east(&pki, &live).await;
        let addr = east.hamlet_addr;
        _east = Some((east, ec));
        addr
    } else {
        let server = GoLikeServer::default();
        *server.state.lock().expect("lock") = live.iter().map(|f| fs(f, "10.0.0.1")).collect();
        let (addr, c) = serve_go_like(server, pki.cluster("go-peer")).await;
        _go = Some(c);
        addr
    };
    let rr_uid = lab.create_rr(RR, ns, addr, None).await;
    let closed: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
    let other_uid = lab.create_rr("other", ns, closed, None).await;
    let mut uids = BTreeMap::new();
    for body in [
        import_body(
            ns,
            &format!("some-service.some.domain-{H}"),
            "some-service.some.domain",
            RR,
            &rr_uid,
        ),
        import_body(
            ns,
            &format!("orphaned-service-record-{H}"),
            "orphaned-service-record",
            RR,
            &rr_uid,
        ),
        import_body(ns, "x.other-1", "x.other", "other", &other_uid),
        record_body(ns, "exported", json!({EXPORT: ""})),
        record_body(ns, "unlabelled", json!({})),
    ] {
        let o = lab.create(body).await;
        uids.insert(o["metadata"]["name"].as_str().unwrap().to_string(), uid(&o));
    }
    let (_west, _wc) = lab.west(&pki).await;

    let mut want = vec![
        format!("another-service.some.domain-{H}"),
        "exported".to_string(),
        format!("some-service.some.domain-{H}"),
        "unlabelled".to_string(),
        "x.other-1".to_string(),
    ];
    want.sort();
    lab.wait_names(want).await;
    if marker {
        // A plain Hamlet server sends no marker; the client reports Synced on its next batch.
        lab.wait_synced(RR).await;
    }
    // Updated in place, never re-created.
    let live_name = format!("some-service.some.domain-{H}");
    let r = lab
        .wait_sr(ns, &live_name, "the live import updated", |r| {
            r.is_some_and(|r| {
                r["spec"]["endpoints"] == json!([{"address": "10.0.0.1", "port": 443}])
            })
        })
        .await
        .expect("record");
    assert_eq!(uid(&r), uids[&live_name]);
    for n in ["x.other-1", "exported", "unlabelled"] {
        assert_eq!(lab.uid_of(n).await, uids[n]);
    }
    lab.assert_count("the orphan deleted", Lab::sr_deletes, 1)
        .await;
    lab.assert_not_forbidden();
}

#[tokio::test]
async fn stale_imports_removed_after_the_marker_scoped_to_labels_and_uid() {
    stale_imports_removed_scoped(
        "stale_imports_removed_after_the_marker_scoped_to_labels_and_uid",
        true,
    )
    .await;
}

#[tokio::test]
async fn stale_imports_removed_after_the_quiet_period_against_a_go_server() {
    stale_imports_removed_scoped(
        "stale_imports_removed_after_the_quiet_period_against_a_go_server",
        false,
    )
    .await;
}

/// Two live RemoteRegistries: A's sweep removes A's stale import only.
#[tokio::test]
async fn two_rrs_sweep_leaves_the_other_registrys_imports_alone() {
    let Some(lab) = Lab::new("two_rrs_sweep_leaves_the_other_registrys_imports_alone").await else {
        return;
    };
    let ns = lab.ns.as_str();
    let pki = Pki::new("xcc.test");
    let (a, _ac) = east(&pki, &["a.some.domain"]).await;
    let (b, _bc) = {
        let (reg, c) = start(pki.cluster("north")).await;
        reg.catalog
            .upsert(export("north", "ns", "b.some.domain", "10.0.0.2"));
        (reg, c)
    };
    let uid_a = lab.create_rr("rr-a", ns, a.hamlet_addr, None).await;
    let uid_b = lab.create_rr("rr-b", ns, b.hamlet_addr, None).await;
    let ha = xcc_proto::names::hash8("rr-a");
    let hb = xcc_proto::names::hash8("rr-b");
    lab.create(import_body(
        ns,
        &format!("stale.some.domain-{ha}"),
        "stale.some.domain",
        "rr-a",
        &uid_a,
    ))
    .await;
    let kept = lab
        .create(import_body(
            ns,
            &format!("b.some.domain-{hb}"),
            "b.some.domain",
            "rr-b",
            &uid_b,
        ))
        .await;
    lab.create(record_body(ns, "exported", json!({EXPORT: ""})))
        .await;
    lab.create(record_body(ns, "unlabelled", json!({}))).await;
    let (_west, _wc) = lab.west(&pki).await;
    let mut want = vec![
        format!("a.some.domain-{ha}"),
        format!("b.some.domain-{hb}"),
        "exported".to_string(),
        "unlabelled".to_string(),
    ];
    want.sort();
    lab.wait_names(want).await;
    lab.wait_synced("rr-a").await;
    lab.wait_synced("rr-b").await;
    assert_eq!(lab.uid_of(&format!("b.some.domain-{hb}")).await, uid(&kept));
    lab.assert_count("A's stale import deleted", Lab::sr_deletes, 1)
        .await;
    lab.assert_not_forbidden();
}

/// A remote that exports nothing still gets its stale import removed.
#[tokio::test]
async fn remote_exporting_nothing_stale_import_removed() {
    let Some(lab) = Lab::new("remote_exporting_nothing_stale_import_removed").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (e, _ec) = east(&pki, &[]).await;
    let rr_uid = lab.create_rr(RR, &lab.ns, e.hamlet_addr, None).await;
    lab.create(import_body(
        &lab.ns,
        &format!("gone.some.domain-{H}"),
        "gone.some.domain",
        RR,
        &rr_uid,
    ))
    .await;
    let (_west, _wc) = lab.west(&pki).await;
    lab.wait_names(vec![]).await;
    let status = lab.wait_synced(RR).await;
    assert_eq!(status["importedRecords"], json!(0));
    lab.assert_count("the stale import deleted", Lab::sr_deletes, 1)
        .await;
    lab.assert_not_forbidden();
}

/// Records received on a connection that never completes a snapshot
/// (a plain Hamlet server, quiet period far away) delete nothing; after a reset (redial) to a
/// server that completes its snapshot, the stale record is removed and the live one kept.
#[tokio::test]
async fn no_sweep_before_a_complete_snapshot_then_only_the_stale_record_goes() {
    let Some(lab) =
        Lab::new("no_sweep_before_a_complete_snapshot_then_only_the_stale_record_goes").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let server = GoLikeServer::default();
    *server.state.lock().expect("lock") = vec![fs("some-service.some.domain", "10.0.0.7")];
    let (go_addr, _go) = serve_go_like(server.clone(), pki.cluster("go-peer")).await;
    let (e, _ec) = east(&pki, &["some-service.some.domain"]).await;
    let rr_uid = lab.create_rr(RR, &lab.ns, go_addr, None).await;
    lab.create(import_body(
        &lab.ns,
        &format!("orphaned-service-record-{H}"),
        "orphaned-service-record",
        RR,
        &rr_uid,
    ))
    .await;
    let (_west, _wc) = lab
        .west_with(&pki, |c| {
            c.client.quiet_period = Duration::from_secs(3600);
        })
        .await;
    let live = format!("some-service.some.domain-{H}");
    lab.wait_sr(
        &lab.ns,
        &live,
        "the record from the first connection",
        |r| r.is_some_and(|r| r["spec"]["endpoints"][0]["address"] == "10.0.0.7"),
    )
    .await;
    server.wait_requests(2).await;
    assert_eq!(
        lab.sr_names().await,
        imported_names(&["orphaned-service-record", "some-service.some.domain"]),
        "no sweep without a complete snapshot"
    );
    assert_eq!(lab.sr_deletes(), 0);
    let live_uid = lab.uid_of(&live).await;

    // Reset: the RemoteRegistry now points at a server that completes its snapshot.
    lab.rrs(&lab.ns)
        .patch(
            RR,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"address": e.hamlet_addr.to_string()}})),
        )
        .await
        .expect("patch RR");
    let records = lab
        .wait_names(imported_names(&["some-service.some.domain"]))
        .await;
    let r = lab
        .wait_sr(&lab.ns, &live, "the live record updated", |r| {
            r.is_some_and(|r| {
                r["spec"]["endpoints"] == json!([{"address": "10.0.0.1", "port": 443}])
            })
        })
        .await
        .expect("record");
    assert_eq!(uid(&records[&live]), live_uid, "kept, updated in place");
    assert_eq!(uid(&r), live_uid, "kept, updated in place");
    lab.assert_count("the stale record deleted", Lab::sr_deletes, 1)
        .await;
    lab.assert_not_forbidden();
}

// ----- invalid allowedDomains: `Valid=False`, reason InvalidDomain -----

#[tokio::test]
async fn invalid_domains_nothing_imported_and_reported() {
    let Some(lab) = Lab::new("invalid_domains_nothing_imported_and_reported").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["some-service.some.domain"]).await;
    let (west, _wc) = lab.west(&pki).await;
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, Some(&["invalid..domain"]))
        .await;
    let status = lab
        .wait_rr(&lab.ns, RR, "Valid=False", |s| {
            condition(s, "Valid").is_some_and(|c| c.0 == "False")
        })
        .await;
    let expected =
        xcc_proto::domains::validate_allowed_domains(RR, &["invalid..domain".to_string()])
            .expect_err("invalid")
            .to_string();
    assert!(expected.contains("Invalid domain"), "{expected}");
    assert_eq!(condition_types(&status), ["Valid"]);
    assert_eq!(
        condition(&status, "Valid"),
        Some(("False".into(), "InvalidDomain".into(), expected))
    );
    assert_eq!(status["observedGeneration"], json!(1));
    assert!(lab.sr_names().await.is_empty());
    assert!(!runs_client(&west, RR), "no client");
    lab.assert_not_forbidden();
}

#[tokio::test]
async fn update_to_invalid_domains_stops_the_client_and_removes_imports() {
    let Some(lab) =
        Lab::new("update_to_invalid_domains_stops_the_client_and_removes_imports").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["some-service.some.domain"]).await;
    let (west, _wc) = lab.west(&pki).await;
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, Some(&["some.domain"]))
        .await;
    lab.wait_names(imported_names(&["some-service.some.domain"]))
        .await;
    lab.wait_synced(RR).await;
    let g = lab.set_domains(RR, &["invalid..domain"]).await;
    let status = lab
        .wait_rr(&lab.ns, RR, "Valid=False at the new generation", |s| {
            s["observedGeneration"] == json!(g)
                && condition(s, "Valid").is_some_and(|c| c.0 == "False")
        })
        .await;
    let (_, reason, message) = condition(&status, "Valid").expect("Valid");
    assert_eq!(reason, "InvalidDomain");
    assert!(message.contains("Invalid domain"), "{message}");
    lab.wait_names(vec![]).await;
    // No owner went away: the registry deleted the import itself (no garbage collection).
    lab.assert_count("the import deleted", Lab::sr_deletes, 1)
        .await;
    wait_peers(&west, "client stopped", |w| !runs_client(w, RR)).await;
    assert!(imported_fqdns(&west.catalog, RR).is_empty());
    lab.assert_not_forbidden();
}

// ----- restart: an already observed RemoteRegistry reconnects -----

#[tokio::test]
async fn restart_with_an_observed_rr_reconnects_and_resyncs_without_duplicates() {
    let Some(lab) =
        Lab::new("restart_with_an_observed_rr_reconnects_and_resyncs_without_duplicates").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain", "b.some.domain"]).await;
    let (west1, c1) = lab.west(&pki).await;
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;
    lab.wait_names(imported_names(&["a.some.domain", "b.some.domain"]))
        .await;
    let s = lab.wait_synced(RR).await;
    assert_eq!(s["observedGeneration"], json!(1));
    let uid_a = lab.uid_of(&format!("a.some.domain-{H}")).await;
    c1.cancel();
    west1.shutdown().await.expect("clean shutdown");

    // While west is down: b goes, c comes.
    east.catalog.remove(&xcc_registry::catalog::ServiceKey::new(
        "east",
        "ns",
        "b.some.domain",
    ));
    east.catalog
        .upsert(export("east", "ns", "c.some.domain", "10.0.0.3"));
    let deletes_before = lab.sr_deletes();

    let (west2, _c2) = lab.west(&pki).await;
    lab.wait_names(imported_names(&["a.some.domain", "c.some.domain"]))
        .await;
    wait_peers(&west2, "connected again", |w| {
        w.peers
            .list()
            .iter()
            .any(|p| p.name == RR && p.state() == xcc_registry::peers::PeerState::Connected)
    })
    .await;
    assert_eq!(
        lab.uid_of(&format!("a.some.domain-{H}")).await,
        uid_a,
        "not re-created"
    );
    lab.assert_count("only b deleted", |l| l.sr_deletes() - deletes_before, 1)
        .await;
    // The catalog mirrors an import right after it is stored, so it may trail the API by a step.
    wait_catalog(&west2.catalog, "west's catalog holds a and c", |c| {
        imported_fqdns(c, RR) == ["a.some.domain", "c.some.domain"]
    })
    .await;
    lab.assert_not_forbidden();
}

// ----- RR lifecycle -----

#[tokio::test]
async fn rr_in_another_namespace_is_reported_and_not_handled() {
    let Some(lab) = Lab::new("rr_in_another_namespace_is_reported_and_not_handled").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["some-service.some.domain"]).await;
    let (west, _wc) = lab.west(&pki).await;
    let elsewhere = lab.namespace("elsewhere").await;
    lab.create_rr(RR, &elsewhere, east.hamlet_addr, None).await;
    let status = lab
        .wait_rr(&elsewhere, RR, "WrongNamespace", |s| {
            condition(s, "Valid").is_some()
        })
        .await;
    let (st, reason, message) = condition(&status, "Valid").expect("Valid");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "WrongNamespace"));
    assert!(
        message.contains(&format!("\"{elsewhere}\"")) && message.contains(&lab.ns),
        "{message}"
    );
    let all: Api<DynamicObject> = Api::all_with(lab.admin.clone(), &ar_sr());
    assert!(
        all.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(!runs_client(&west, RR));
    assert_eq!(lab.sr_writes(|_| true), 0);
    lab.assert_not_forbidden();
}

/// On a real cluster the garbage collector removes the imports of a deleted RemoteRegistry
/// too; either way they go and the client stops.
#[tokio::test]
async fn rr_deleted_its_imports_are_removed_and_the_client_stops() {
    let Some(lab) = Lab::new("rr_deleted_its_imports_are_removed_and_the_client_stops").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain"]).await;
    let (west, _wc) = lab.west(&pki).await;
    lab.create(record_body(&lab.ns, "unlabelled", json!({})))
        .await;
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;
    lab.wait_names(vec![format!("a.some.domain-{H}"), "unlabelled".to_string()])
        .await;
    wait_peers(&west, "client running", |w| runs_client(w, RR)).await;
    lab.rrs(&lab.ns)
        .delete(RR, &DeleteParams::default())
        .await
        .expect("delete RR");
    lab.wait_names(vec!["unlabelled".to_string()]).await;
    wait_peers(&west, "client stopped", |w| !runs_client(w, RR)).await;
    wait_catalog(&west.catalog, "imports gone from the catalog", |c| {
        imported_fqdns(c, RR).is_empty()
    })
    .await;
    lab.assert_not_forbidden();
}

#[tokio::test]
async fn foreign_record_of_the_same_name_is_reported_never_taken_over() {
    let Some(lab) = Lab::new("foreign_record_of_the_same_name_is_reported_never_taken_over").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["some-service.some.domain", "b.some.domain"]).await;
    let name = format!("some-service.some.domain-{H}");
    let foreign = lab.create(record_body(&lab.ns, &name, json!({}))).await;
    let (_west, _wc) = lab.west(&pki).await;
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;
    let records = lab
        .wait_names(vec![format!("b.some.domain-{H}"), name.clone()])
        .await;
    let status = lab
        .wait_rr(&lab.ns, RR, "conflict reported", |s| {
            condition(s, "Synced").is_some_and(|c| c.0 == "True" && c.2.contains(&name))
        })
        .await;
    // The conflicting import has no record of ours.
    assert_eq!(status["importedRecords"], json!(1));
    let r = &records[&name];
    assert_eq!(r["metadata"], foreign["metadata"], "not written");
    assert_eq!(r["spec"], foreign["spec"]);
    assert_eq!(r["spec"]["fqdn"], "user.example.org");
    assert!(r["metadata"]["labels"].is_null());
    assert!(r["metadata"]["ownerReferences"].is_null());
    let ar = ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&());
    let events = await_objects(
        lab.api(&ar, &lab.ns),
        "an ImportConflict Event on the RemoteRegistry",
        |evs| evs.values().any(|e| e["reason"] == "ImportConflict"),
    )
    .await;
    let ev = events
        .values()
        .find(|e| e["reason"] == "ImportConflict")
        .expect("event");
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["kind"], "RemoteRegistry");
    assert_eq!(ev["regarding"]["name"], RR);
    assert!(
        ev["note"].as_str().is_some_and(|n| n.contains(&name)),
        "{ev}"
    );
    assert_eq!(
        lab.sr(&name).await.unwrap()["metadata"],
        foreign["metadata"]
    );
    lab.assert_not_forbidden();
}

// ----- exports -----

#[tokio::test]
async fn exports_label_removal_and_deletion_send_deletes_imported_never_exported() {
    let Some(lab) =
        Lab::new("exports_label_removal_and_deletion_send_deletes_imported_never_exported").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let shop = lab.namespace("shop").await;
    lab.create(exported_sr(
        &shop,
        "web.shop.example.org",
        "web.shop.example.org",
        json!({EXPORT: ""}),
        json!({
            "connectivity.tanzu.vmware.com/service-port": "443",
            "connectivity.tanzu.vmware.comX": "no",
            "other": "no",
        }),
    ))
    .await;
    lab.create(exported_sr(
        &shop,
        "imported-too",
        "imp.shop.example.org",
        json!({EXPORT: "", IMPORTED: ""}),
        json!({}),
    ))
    .await;
    lab.create(exported_sr(
        &shop,
        "not-exported",
        "no.shop.example.org",
        json!({}),
        json!({}),
    ))
    .await;
    let (west, _wc) = lab.west(&pki).await;
    tokio::time::timeout(WAIT, west.health.ready())
        .await
        .expect("timed out waiting for ready");
    let fqdns = |c: &xcc_registry::Catalog| -> Vec<String> {
        c.list(&xcc_registry::catalog::ListFilter {
            source: Some(xcc_registry::catalog::Source::Local),
            ..Default::default()
        })
        .iter()
        .map(|e| e.fqdn.to_string())
        .collect()
    };
    assert_eq!(fqdns(&west.catalog), ["web.shop.example.org"]);
    let entry = west
        .catalog
        .get(&xcc_registry::catalog::ServiceKey::new(
            "west",
            &shop,
            "web.shop.example.org",
        ))
        .expect("entry");
    // The export's annotation, and the stamp the catalog set when it accepted it.
    assert!(entry.changed_at().is_some());
    assert_eq!(
        entry
            .labels
            .iter()
            .filter(|(k, _)| *k != xcc_proto::propagation::CHANGED_AT_ANNOTATION)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        BTreeMap::from([(
            "connectivity.tanzu.vmware.com/service-port".to_string(),
            "443".to_string()
        )])
    );

    let tls = xcc_certs::reload::ReloadingTls::load(pki.cluster("east")).expect("tls");
    let mut consumer = Consumer::connect(&tls, west.hamlet_addr, true)
        .await
        .expect("subscribe");
    let first = consumer.next_acked().await;
    assert_eq!(first.fqdn.as_deref(), Some("web.shop.example.org"));

    // The label comes off: consumers get a DELETE.
    let srs = lab.srs(&shop);
    srs.patch(
        "web.shop.example.org",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {EXPORT: null}}})),
    )
    .await
    .expect("unlabel");
    let mut seen = consumer.next_acked().await;
    while seen.op
        == xcc_proto::federation::resourcediscovery::v1alpha1::stream_response::Operation::Unknown
    {
        seen = consumer.next_acked().await;
    }
    assert_eq!(
        (seen.op, seen.fqdn.as_deref()),
        (
            xcc_proto::federation::resourcediscovery::v1alpha1::stream_response::Operation::Delete,
            Some("web.shop.example.org")
        )
    );
    assert!(fqdns(&west.catalog).is_empty());

    // Labelled again, then deleted: CREATE/UPDATE, then DELETE.
    srs.patch(
        "web.shop.example.org",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {EXPORT: ""}}})),
    )
    .await
    .expect("label");
    wait_catalog(&west.catalog, "exported again", |c| fqdns(c).len() == 1).await;
    srs.delete("web.shop.example.org", &DeleteParams::default())
        .await
        .expect("delete");
    wait_catalog(&west.catalog, "export removed", |c| fqdns(c).is_empty()).await;
    // Exports are read, never written.
    assert_eq!(lab.sr_writes(|_| true), 0);
    lab.assert_not_forbidden();
}

#[tokio::test]
async fn leader_election_holds_the_lease_and_imports() {
    let Some(lab) = Lab::new("leader_election_holds_the_lease_and_imports").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain"]).await;
    let store = StoreConfig::Kube(lab.kube_config(true).await);
    let (_west, _wc) = lab.west_with(&pki, |c| c.store = store).await;
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;
    lab.wait_names(imported_names(&["a.some.domain"])).await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(lab.admin.clone(), &lab.ns);
    let lease = leases.get("xcc-registry").await.expect("lease");
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert!(holder.as_ref().is_some_and(|h| !h.is_empty()), "{holder:?}");
    lab.assert_not_forbidden();
}

// ----- hierarchy imports through the same sink -----

/// A `role: Parent` RemoteRegistry: the registry joins the hierarchy and the granted answers
/// of `spec.imports` become imported ServiceRecords like any other import; deleting the
/// RemoteRegistry removes them.
#[tokio::test]
async fn parent_rr_hierarchy_imports_become_imported_records() {
    let Some(lab) = Lab::new("parent_rr_hierarchy_imports_become_imported_records").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (root, _rc) = start(pki.cluster("root")).await;
    let mut ocfg = RegistryConfig::loopback(pki.cluster("owner"));
    ocfg.federation.parent = Some(xcc_registry::federation::link::ParentSpec {
        name: "up".into(),
        address: root.hamlet_addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
    });
    let (owner, _oc) = start_with(ocfg).await;
    let mut api_entry = export(
        "owner",
        "shop",
        &xcc_proto::names::clusterset_fqdn("api", "shop"),
        "10.2.0.1",
    );
    api_entry.key = xcc_registry::catalog::ServiceKey::new("owner", "shop", "api");
    api_entry.allowed_requesters = vec!["west/web".into()];
    owner.catalog.upsert(api_entry);

    let (west, _wc) = lab.west(&pki).await;
    let mut body = rr_body("hier", &lab.ns, &root.hamlet_addr.to_string(), None);
    body["spec"]["role"] = json!("Parent");
    body["spec"]["imports"] =
        json!([{"namespace": "shop", "name": "api", "requesterService": "web"}]);
    let rr = lab.create(body).await;
    let fqdn = xcc_proto::names::clusterset_fqdn("api", "shop");
    let name = xcc_proto::names::imported_record_name(&fqdn, "hier").expect("name");
    let records = lab.wait_names(vec![name.clone()]).await;
    let r = &records[&name];
    assert_eq!(
        r["metadata"]["labels"],
        json!({IMPORTED: "", REMOTE_LABEL: "hier"})
    );
    assert_eq!(
        r["metadata"]["ownerReferences"],
        json!([{"apiVersion": V, "kind": "RemoteRegistry", "name": "hier", "uid": uid(&rr)}])
    );
    assert_eq!(
        r["spec"],
        json!({"fqdn": fqdn, "endpoints": [{"address": "10.2.0.1", "port": 443}]})
    );
    let status = lab
        .wait_rr(&lab.ns, "hier", "parent connected, one import", |s| {
            condition(s, "Connected").is_some_and(|c| c.0 == "True")
                && s["importedRecords"] == json!(1)
        })
        .await;
    assert_eq!(
        condition(&status, "Valid").map(|c| c.0),
        Some("True".to_string())
    );

    lab.rrs(&lab.ns)
        .delete("hier", &DeleteParams::default())
        .await
        .expect("delete RR");
    lab.wait_names(vec![]).await;
    wait_catalog(
        &west.catalog,
        "hierarchy imports gone from the catalog",
        |c| hierarchy_count(c) == 0,
    )
    .await;
    lab.assert_not_forbidden();
}

/// A root on the memory store with the policy `file` (`text`) in its policy directory, which
/// it watches: a file written or removed there is loaded again (`policies_changed`).
async fn root_with_policy(
    pki: &Pki,
    file: &str,
    text: &str,
) -> (
    Registry,
    tokio_util::sync::CancellationToken,
    tempfile::TempDir,
) {
    let policies = tempfile::tempdir().expect("tempdir");
    std::fs::write(policies.path().join(file), text).expect("policy");
    let mut rcfg = RegistryConfig::loopback(pki.cluster("root"));
    rcfg.federation.policy_dir = Some(policies.path().to_path_buf());
    let (root, rc) = start_with(rcfg).await;
    (root, rc, policies)
}

/// A root (memory store, one Cedar policy forbidding `shop/secret`) and an owner below it
/// exporting `shop/api` and `shop/secret` for `west/web` and `shop/other` for someone else.
async fn tree(
    pki: &Pki,
) -> (
    Registry,
    Registry,
    tempfile::TempDir,
    Vec<tokio_util::sync::CancellationToken>,
) {
    let (root, rc, policies) = root_with_policy(
        pki,
        "no-secret.cedar",
        r#"@id("no-secret")
forbid (principal, action == Xcc::Action::"discover", resource) when { resource.name == "secret" };"#,
    )
    .await;
    let mut ocfg = RegistryConfig::loopback(pki.cluster("owner"));
    ocfg.federation.parent = Some(xcc_registry::federation::link::ParentSpec {
        name: "up".into(),
        address: root.hamlet_addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
    });
    let (owner, oc) = start_with(ocfg).await;
    for (name, ip, allowed) in [
        ("api", "10.2.0.1", "west/web"),
        ("secret", "10.2.0.2", "west/web"),
        ("other", "10.2.0.3", "c9/x"),
    ] {
        let mut e = export(
            "owner",
            "shop",
            &xcc_proto::names::clusterset_fqdn(name, "shop"),
            ip,
        );
        e.key = xcc_registry::catalog::ServiceKey::new("owner", "shop", name);
        e.allowed_requesters = vec![allowed.into()];
        owner.catalog.upsert(e);
    }
    (root, owner, policies, vec![rc, oc])
}

fn parent_rr(ns: &str, root: std::net::SocketAddr, imports: Value) -> Value {
    let mut body = rr_body("hier", ns, &root.to_string(), None);
    body["spec"]["role"] = json!("Parent");
    body["spec"]["imports"] = imports;
    body
}

fn hierarchy_count(catalog: &xcc_registry::Catalog) -> usize {
    catalog
        .list(&xcc_registry::catalog::ListFilter {
            source: Some(xcc_registry::catalog::Source::Hierarchy("hier".into())),
            ..Default::default()
        })
        .len()
}

/// `status.imports` reports each import's outcome and `Synced` turns True once every import is
/// answered; a restart keeps the imported record (same UID, no delete, no create).
#[tokio::test]
async fn parent_rr_reports_each_import_and_a_restart_does_not_churn_its_records() {
    let Some(lab) =
        Lab::new("parent_rr_reports_each_import_and_a_restart_does_not_churn_its_records").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (root, _owner, _policies, _cancels) = tree(&pki).await;
    let (west1, c1) = lab.west(&pki).await;
    lab.create(parent_rr(
        &lab.ns,
        root.hamlet_addr,
        json!([
            {"namespace": "shop", "name": "api", "requesterService": "web"},
            {"namespace": "shop", "name": "other", "requesterService": "web"},
            {"namespace": "shop", "name": "secret", "requesterService": "web"},
            {"fqdn": "nope.shop.svc.clusterset.local", "requesterService": "web"},
        ]),
    ))
    .await;
    let fqdn = xcc_proto::names::clusterset_fqdn("api", "shop");
    let name = xcc_proto::names::imported_record_name(&fqdn, "hier").expect("name");
    lab.wait_names(vec![name.clone()]).await;
    let status = lab
        .wait_rr(&lab.ns, "hier", "hier Synced=True with one import", |s| {
            condition(s, "Synced").is_some_and(|c| c.0 == "True")
                && s["importedRecords"] == json!(1)
        })
        .await;
    assert_eq!(
        condition(&status, "Synced").map(|c| (c.1, c.2)),
        Some((
            "ImportsAnswered".to_string(),
            "every import (4) has an answer".to_string()
        ))
    );
    let summary: Vec<(Value, Value, Value)> = status["imports"]
        .as_array()
        .expect("imports")
        .iter()
        .map(|i| {
            (
                i["fqdn"].clone(),
                i["name"].clone(),
                json!([i["state"], i["reason"]]),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (Value::Null, json!("api"), json!(["Granted", Value::Null])),
            (
                Value::Null,
                json!("other"),
                json!(["Denied", "NotAllowedByCallee"])
            ),
            (
                Value::Null,
                json!("secret"),
                json!(["Denied", "PolicyDenied"])
            ),
            (
                json!("nope.shop.svc.clusterset.local"),
                Value::Null,
                json!(["NotFound", Value::Null])
            ),
        ]
    );
    let secret = &status["imports"][2];
    assert!(
        secret["message"]
            .as_str()
            .is_some_and(|m| m.contains("no-secret")),
        "the denying policy is named: {secret}"
    );
    assert_eq!(secret["namespace"], json!("shop"));
    assert_eq!(secret["requesterService"], json!("web"));
    assert_eq!(
        status["imports"][0]["message"],
        json!("granted by root; owner cluster owner")
    );

    // Restart: the stored import is kept while the new process asks again.
    let record_uid = lab.uid_of(&name).await;
    c1.cancel();
    west1.shutdown().await.expect("clean shutdown");
    let deletes = lab.sr_deletes();
    let creates = lab.sr_creates();
    assert_eq!(creates, 1, "{:#?}", lab.writes());
    let (west2, _c2) = lab.west(&pki).await;
    wait_catalog(
        &west2.catalog,
        "the restarted registry imports again",
        |c| hierarchy_count(c) == 1,
    )
    .await;
    assert_eq!(
        lab.uid_of(&name).await,
        record_uid,
        "the record was not re-created"
    );
    assert_eq!(lab.sr_deletes() - deletes, 0);
    assert_eq!(lab.sr_creates() - creates, 0);
    assert_eq!(lab.sr_names().await, [name]);
    lab.assert_not_forbidden();
}

/// With the parent unreachable every import is `Unavailable`, `Synced` stays False, and the
/// stored imports are left alone (nothing is deleted while nothing is known).
#[tokio::test]
async fn parent_unreachable_imports_unavailable_and_stored_records_kept() {
    let Some(lab) =
        Lab::new("parent_unreachable_imports_unavailable_and_stored_records_kept").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let rr = lab
        .create(parent_rr(
            &lab.ns,
            closed,
            json!([{"namespace": "shop", "name": "api", "requesterService": "web"}]),
        ))
        .await;
    let fqdn = xcc_proto::names::clusterset_fqdn("api", "shop");
    let name = xcc_proto::names::imported_record_name(&fqdn, "hier").expect("name");
    // What an earlier run imported.
    let stored = lab
        .create(import_body(&lab.ns, &name, &fqdn, "hier", &uid(&rr)))
        .await;
    let (_west, _wc) = lab.west(&pki).await;
    let status = lab
        .wait_rr(&lab.ns, "hier", "the import reported unavailable", |s| {
            s["imports"][0]["state"] == json!("Unavailable")
        })
        .await;
    assert_eq!(
        condition(&status, "Synced").map(|c| (c.0, c.1)),
        Some(("False".to_string(), "Pending".to_string()))
    );
    assert_eq!(lab.sr_names().await, std::slice::from_ref(&name));
    assert_eq!(lab.uid_of(&name).await, uid(&stored));
    assert_eq!(lab.sr_deletes(), 0);
    lab.assert_not_forbidden();
}

// ----- refusals of the parent (kube mode) -----

/// `--store kube` below a root whose Cedar policy forbids announcing `api`: the exported record
/// `api` gets `Announced=False` (the failed check, the policy id) and a Warning Event, the
/// record `web` nothing. A reconnect with the refusal still standing writes nothing; removing
/// the forbid (the root reloads its policies) turns the condition `True`. Two status writes in
/// all.
#[tokio::test]
async fn a_refused_export_is_told_on_its_record_until_the_parent_accepts_it() {
    let Some(lab) =
        Lab::new("a_refused_export_is_told_on_its_record_until_the_parent_accepts_it").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (root, _rc, policies) = root_with_policy(
        &pki,
        "10-no-api.cedar",
        r#"@id("no-api")
forbid (principal, action == Xcc::Action::"announce", resource) when { resource.name == "api" };"#,
    )
    .await;
    let forbid = policies.path().join("10-no-api.cedar");
    let shop = lab.namespace("shop").await;
    for name in ["api", "web"] {
        let fqdn = xcc_proto::names::clusterset_fqdn(name, &shop);
        lab.create(exported_sr(
            &shop,
            name,
            &fqdn,
            json!({EXPORT: ""}),
            json!({}),
        ))
        .await;
    }
    let (west, wc) = lab.west(&pki).await;
    let mut body = rr_body("hier", &lab.ns, &root.hamlet_addr.to_string(), None);
    body["spec"]["role"] = json!("Parent");
    lab.create(body).await;
    let at_root = |name: &str| {
        root.catalog
            .get(&xcc_registry::catalog::ServiceKey::new("west", &shop, name))
            .is_some()
    };
    wait_catalog(&root.catalog, "web announced at the root", |_| {
        at_root("web")
    })
    .await;
    assert!(!at_root("api"));

    let announced = |o: Option<&Value>| o.and_then(|r| condition(&r["status"], "Announced"));
    let api = lab
        .wait_sr(&shop, "api", "api Announced=False", |o| {
            announced(o).is_some_and(|c| c.0 == "False")
        })
        .await;
    let (_, reason, message) = announced(api.as_ref()).expect("condition");
    assert_eq!(reason, "Announce");
    assert_eq!(
        message,
        format!(
            "refused by root: west may not announce api.{shop}.svc.clusterset.local: forbidden by no-api (check announce; Cedar policies: no-api)"
        )
    );
    let events = |reason: &'static str| {
        let regarding = move |e: &Value| e["regarding"]["name"] == "api" && e["reason"] == reason;
        (
            lab.api(&ar_event(), &shop),
            move |o: &Objects| o.values().any(regarding),
            move |o: &Objects| {
                o.values()
                    .filter(|e| regarding(e))
                    .cloned()
                    .collect::<Vec<_>>()
            },
        )
    };
    let (api_events, seen, all) = events("AnnouncementRefused");
    let refused = all(&await_objects(api_events, "the Warning Event", seen).await);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0]["type"], "Warning");
    assert_eq!(refused[0]["note"], json!(message));
    let web = lab.records(&shop).await.remove("web");
    assert_eq!(announced(web.as_ref()), None, "never refused: no condition");

    // Another policy file: the root asks west to send its snapshot again; api is refused again
    // and its condition stays as it is.
    let since = |r: &Registry| r.level.children().first().map(|c| c.3);
    let first = since(&root).expect("west attached");
    std::fs::write(
        policies.path().join("20-other.cedar"),
        r#"@id("other")
forbid (principal, action == Xcc::Action::"announce", resource) when { resource.name == "none" };"#,
    )
    .expect("policy");
    wait_level(&root, "west attached again", |r| {
        since(r).is_some_and(|s| s > first)
    })
    .await;
    wait_level(&west, "the parent confirmed west's new snapshot", |w| {
        w.level.refusals_confirmed()
    })
    .await;
    assert_eq!(west.level.rejections().len(), 1);
    // A restart: the new process knows no refusal until the parent confirmed its snapshot, and
    // leaves the condition alone meanwhile.
    wc.cancel();
    west.shutdown().await.expect("clean shutdown");
    let (west, _wc) = lab.west(&pki).await;
    wait_level(
        &west,
        "the parent confirmed the restarted west's snapshot",
        |w| w.level.refusals_confirmed(),
    )
    .await;
    assert_eq!(west.level.rejections().len(), 1);

    // The forbid goes: api is announced and its condition turns back.
    std::fs::remove_file(&forbid).expect("remove policy");
    wait_catalog(&root.catalog, "api announced at the root", |_| {
        at_root("api")
    })
    .await;
    let api = lab
        .wait_sr(&shop, "api", "api Announced=True", |o| {
            announced(o).is_some_and(|c| c.0 == "True")
        })
        .await;
    assert_eq!(
        announced(api.as_ref()).map(|c| (c.1, c.2)),
        Some((
            "Accepted".to_string(),
            "the parent's refusal no longer stands".to_string()
        ))
    );
    let (api_events, seen, _) = events("AnnouncementAccepted");
    await_objects(api_events, "the Normal Event", seen).await;
    let status_writes = |l: &Lab, name: &str| {
        l.writes()
            .iter()
            .filter(|w| {
                w.verb == "patch"
                    && w.resource == "servicerecords/status"
                    && w.namespace == shop
                    && w.name == name
            })
            .count()
    };
    lab.assert_count("status writes of api", |l| status_writes(l, "api"), 2)
        .await;
    assert_eq!(status_writes(&lab, "web"), 0);
    lab.assert_not_forbidden();
}

fn ar_event() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&())
}

// ----- serverCA / serverName changes; a serverCA near its end -----

/// A self-signed CA (CN `old CA`) that expires `days` days from now.
fn expiring_ca_pem(days: i64) -> String {
    use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair};
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "old CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(365);
    params.not_after = now + time::Duration::days(days);
    params.self_signed(&key).expect("self-signed").pem()
}

impl Lab {
    /// Set the RemoteRegistry's `serverCA` (PEM, encoded here) and `serverName`.
    async fn set_tls(&self, name: &str, ca_pem: &str, server_name: &str) {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        self.rrs(&self.ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"tlsConfig": {"serverCA": ca, "serverName": server_name}}}),
                ),
            )
            .await
            .expect("patch RR");
    }
}

/// On the real API server: a RemoteRegistry's `serverCA` and `serverName` apply to the next
/// connection and delete no import. Only another CA: `Connected=False` says "unknown CA", the
/// records stay. East's CA plus a CA 5 days from its end: connected again, and
/// `CertificateExpiring=True` (reason `ServerCAExpiresSoon`, naming that CA) with a Warning
/// Event of the same reason on the RemoteRegistry. East's CA alone: the condition goes. No
/// ServiceRecord was deleted at any point.
#[tokio::test]
async fn server_ca_changes_keep_imports_and_an_expiring_server_ca_is_reported() {
    let Some(lab) =
        Lab::new("server_ca_changes_keep_imports_and_an_expiring_server_ca_is_reported").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let other = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain"]).await;
    let (_west, _wc) = lab.west(&pki).await;
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;
    let names = imported_names(&["a.some.domain"]);
    lab.wait_names(names.clone()).await;
    lab.wait_synced(RR).await;

    lab.set_tls(RR, other.ca.cert_pem(), "localhost").await;
    let status = lab
        .wait_rr(&lab.ns, RR, "refused under another CA", |s| {
            condition(s, "Connected")
                .is_some_and(|c| c.0 == "False" && c.2.contains("(unknown CA;"))
        })
        .await;
    assert_eq!(condition(&status, "CertificateExpiring"), None);
    assert_eq!(lab.sr_names().await, names, "only another CA");
    assert_eq!(lab.sr_deletes(), 0, "only another CA");

    let expiring = expiring_ca_pem(5);
    lab.set_tls(RR, &format!("{}{expiring}", pki.ca.cert_pem()), "localhost")
        .await;
    let status = lab
        .wait_rr(&lab.ns, RR, "connected, the old CA reported", |s| {
            condition(s, "Connected").is_some_and(|c| c.0 == "True")
                && condition(s, "CertificateExpiring").is_some()
        })
        .await;
    let (state, reason, message) = condition(&status, "CertificateExpiring").expect("condition");
    assert_eq!(
        (state.as_str(), reason.as_str()),
        ("True", "ServerCAExpiresSoon")
    );
    assert!(
        message.starts_with(&format!(
            "the serverCA of RemoteRegistry {RR} (CN=old CA, serial "
        )) && message.contains("add the remote's new CA to spec.tlsConfig.serverCA"),
        "{message}"
    );
    let regarding =
        |e: &Value| e["regarding"]["name"] == RR && e["reason"] == "ServerCAExpiresSoon";
    let events = await_objects(lab.api(&ar_event(), &lab.ns), "the Warning Event", |o| {
        o.values().any(regarding)
    })
    .await;
    let event: Vec<&Value> = events.values().filter(|e| regarding(e)).collect();
    assert_eq!(event.len(), 1, "{event:#?}");
    assert_eq!(event[0]["type"], "Warning");
    assert_eq!(event[0]["note"], json!(message));

    lab.set_tls(RR, pki.ca.cert_pem(), "localhost").await;
    lab.wait_rr(&lab.ns, RR, "the old CA dropped", |s| {
        condition(s, "CertificateExpiring").is_none()
            && condition(s, "Synced").is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_eq!(lab.sr_names().await, names, "back on east's CA");
    assert_eq!(lab.sr_deletes(), 0, "back on east's CA");
    lab.assert_not_forbidden();
}

/// On the real API server, as the registry's ServiceAccount: a registry whose own certificate
/// has 3 days left writes one Warning Event `CertificateExpiring` on its Pod (named by the
/// downward API; here given directly), saying which certificate and when it ends.
#[tokio::test]
async fn a_registry_whose_certificate_expires_soon_says_so_on_its_pod() {
    let Some(lab) = Lab::new("a_registry_whose_certificate_expires_soon_says_so_on_its_pod").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let now = time::OffsetDateTime::now_utc();
    let mut req = xcc_certs::pki::IssueRequest::cluster("west");
    req.not_before = Some(now - time::Duration::days(87));
    req.not_after = Some(now + time::Duration::days(3));
    let files = pki.issue_req("west-short", req);
    let pod = "xcc-registry-7d9f-abcde";
    let (_west, _wc) = lab
        .west_with(&pki, |cfg| {
            cfg.tls = files;
            if let StoreConfig::Kube(k) = &mut cfg.store {
                k.pod = Some(xcc_registry::store::kube::own_certs::PodRef {
                    name: pod.into(),
                    namespace: lab.ns.clone(),
                    uid: None,
                });
            }
        })
        .await;
    let regarding = |e: &Value| {
        e["regarding"]["kind"] == "Pod"
            && e["regarding"]["name"] == pod
            && e["reason"] == "CertificateExpiring"
    };
    let events = await_objects(lab.api(&ar_event(), &lab.ns), "the Warning Event", |o| {
        o.values().any(regarding)
    })
    .await;
    let event: Vec<&Value> = events.values().filter(|e| regarding(e)).collect();
    assert_eq!(event.len(), 1, "{event:#?}");
    assert_eq!(event[0]["type"], "Warning");
    assert_eq!(event[0]["reportingController"], "xcc-registry");
    let note = event[0]["note"].as_str().expect("note");
    assert!(
        note.starts_with("the serving certificate tls.crt (cluster/west) expires at ")
            && note.ends_with(": renew it before then (docs/operations.md; a CA: Rotating the CA)"),
        "{note}"
    );
    lab.assert_not_forbidden();
}

// ----- grants at the owner (kube mode) -----

/// The owner runs on the kube store with `--grant-mode istio` (and the RBAC of
/// `deploy/overlays/grants-istio`, the upstream Istio CRD installed) below a root; a requester
/// in file mode declares in its `role: Parent` RemoteRegistry an import of the owner's exported
/// ServiceRecord on behalf of the workload `storefront/web` (no trust domain: the requester's
/// own, `west.mesh.test` under `--grant-trust-domain {cluster}.mesh.test`, which the owner
/// assigns to cluster west too). The owner applies the AuthorizationPolicy admitting exactly
/// that identity and records the caller in the record's `status.grants`; when the record stops
/// admitting the caller, the grant is revoked: the policy is deleted and the caller dropped
/// from the status.
#[tokio::test]
async fn granted_hierarchy_query_applies_the_grant_object_and_revocation_removes_it() {
    let kind = GrantKind {
        mode: xcc_registry::federation::grants::GrantMode::Istio,
        overlay: "overlays/grants-istio",
        crd: "security.istio.io_authorizationpolicies.yaml",
        resource: ApiResource {
            group: "security.istio.io".into(),
            version: "v1".into(),
            api_version: "security.istio.io/v1".into(),
            kind: "AuthorizationPolicy".into(),
            plural: "authorizationpolicies".into(),
        },
        prefix: "allow-to-",
    };
    let Some(found) = grant_through_an_import(
        "granted_hierarchy_query_applies_the_grant_object_and_revocation_removes_it",
        kind,
    )
    .await
    else {
        return;
    };
    assert_eq!(
        found["spec"]["rules"][0]["from"][0]["source"]["principals"],
        json!(["west.mesh.test/ns/storefront/sa/web"])
    );
    assert_eq!(
        found["spec"]["selector"]["matchLabels"],
        json!({"app": "api"})
    );
}

/// The same with `--grant-mode cilium` (RBAC of `deploy/overlays/grants-cilium`, the upstream
/// Cilium CRD installed): the CiliumNetworkPolicy admits the import's workload by cluster,
/// namespace and service account.
#[tokio::test]
async fn an_import_with_a_workload_identity_opens_a_cilium_policy_at_the_owner() {
    let kind = GrantKind {
        mode: xcc_registry::federation::grants::GrantMode::Cilium,
        overlay: "overlays/grants-cilium",
        crd: "cilium.io_ciliumnetworkpolicies.yaml",
        resource: ApiResource {
            group: "cilium.io".into(),
            version: "v2".into(),
            api_version: "cilium.io/v2".into(),
            kind: "CiliumNetworkPolicy".into(),
            plural: "ciliumnetworkpolicies".into(),
        },
        prefix: "cnp-mesh-",
    };
    let Some(found) = grant_through_an_import(
        "an_import_with_a_workload_identity_opens_a_cilium_policy_at_the_owner",
        kind,
    )
    .await
    else {
        return;
    };
    assert_eq!(
        found["spec"]["ingress"][0]["fromEndpoints"],
        json!([{"matchLabels": {
            "io.cilium.k8s.policy.cluster": "west",
            "k8s:io.kubernetes.pod.namespace": "storefront",
            "io.cilium.k8s.policy.serviceaccount": "web",
        }}])
    );
    assert_eq!(
        found["spec"]["endpointSelector"]["matchLabels"],
        json!({"app": "api"})
    );
}

/// What one grant mode writes at the owner.
struct GrantKind {
    mode: xcc_registry::federation::grants::GrantMode,
    overlay: &'static str,
    /// The upstream CRD of the object (`../shared/kube/crds/`).
    crd: &'static str,
    resource: ApiResource,
    prefix: &'static str,
}

/// A root, an owner on the kube store writing `kind`'s grant objects, and a requester in file
/// mode whose parent RemoteRegistry imports the owner's `shop/api` for the workload
/// `storefront/web`. Returns the grant object the owner applied (before the revocation, which
/// this checks too); `None` without the real-tier assets.
async fn grant_through_an_import(test: &str, kind: GrantKind) -> Option<Value> {
    let lab = Lab::with_rbac(test, kind.overlay).await?;
    let crd = xcc_testkube::upstream_crds().join(kind.crd);
    lab.cp
        .apply(&xcc_testkube::yaml_docs(
            &std::fs::read_to_string(crd).unwrap(),
        ))
        .await;
    let pki = Pki::new("xcc.test");
    let (root, _rc) = start(pki.cluster("root")).await;
    let shop = lab.namespace("shop").await;
    let fqdn = xcc_proto::names::clusterset_fqdn("api", &shop);
    lab.create(json!({
        "apiVersion": V, "kind": "ServiceRecord",
        "metadata": {"name": "api", "namespace": shop, "labels": {EXPORT: ""},
                     "annotations": {xcc_proto::names::WORKLOAD_SELECTOR_ANNOTATION: "app=api"}},
        "spec": {"fqdn": fqdn, "endpoints": [{"address": "10.2.0.1", "port": 443}],
                 "allowedRequesters": ["west/web"]},
    }))
    .await;
    let trust_domain = "{cluster}.mesh.test".to_string();
    let mut ocfg = RegistryConfig::loopback(pki.cluster("owner"));
    ocfg.namespace = lab.ns.clone();
    ocfg.store = StoreConfig::Kube(lab.kube_config(false).await);
    ocfg.federation.grant_mode = kind.mode;
    ocfg.federation.grant_trust_domain = trust_domain.clone();
    let (_owner, _oc) = start_with(ocfg).await;
    lab.create(parent_rr(&lab.ns, root.hamlet_addr, json!([])))
        .await;
    // The requester asks once the owner is in the tree (a question asked before is answered
    // "not found" and asked again only after `import_retry`, 30 s).
    lab.wait_rr(&lab.ns, "hier", "the owner joined the hierarchy", |s| {
        condition(s, "Connected").is_some_and(|c| c.0 == "True")
    })
    .await;

    // The requester's import, as a file-mode RemoteRegistry declares it.
    let west_dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(west_dir.path().join("remotes")).expect("mkdir");
    std::fs::write(
        west_dir.path().join("remotes/up.yaml"),
        format!(
            r#"apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: RemoteRegistry
metadata:
  name: up
  namespace: cross-cluster-connectivity
spec:
  address: "{}"
  tlsConfig:
    serverCA: ""
    serverName: localhost
  role: Parent
  imports:
  - namespace: {shop}
    name: api
    requesterService: web
    requesterIdentity:
      namespace: storefront
      serviceAccount: web
"#,
            root.hamlet_addr
        ),
    )
    .expect("write the RemoteRegistry");
    let mut wcfg = RegistryConfig::loopback(pki.cluster("west"));
    wcfg.store = StoreConfig::File {
        state_dir: west_dir.path().to_path_buf(),
        poll: Duration::from_secs(60),
    };
    wcfg.federation.grant_trust_domain = trust_domain;
    let (west, _wc) = start_with(wcfg).await;
    wait_catalog(&west.catalog, "the requester imports the service", |c| {
        c.list(&xcc_registry::catalog::ListFilter {
            source: Some(xcc_registry::catalog::Source::Hierarchy("up".into())),
            ..Default::default()
        })
        .len()
            == 1
    })
    .await;

    let name = xcc_proto::names::policy_object_name(kind.prefix, &[&shop, "api", "west", "web"]);
    let found = await_objects(
        lab.api(&kind.resource, &shop),
        "the grant object at the owner",
        |o| o.contains_key(&name),
    )
    .await;
    let object = found[&name].clone();
    assert_eq!(
        object["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        json!("xcc-registry")
    );
    let record = lab
        .wait_sr(&shop, "api", "status.grants on the exported record", |r| {
            r.is_some_and(|r| r["status"]["grants"].is_array())
        })
        .await
        .expect("record");
    let callers: Vec<(Value, Value)> = record["status"]["grants"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| (g["callerCluster"].clone(), g["callerService"].clone()))
        .collect();
    assert_eq!(callers, [(json!("west"), json!("web"))]);

    // Revocation: the record no longer admits west.
    lab.srs(&shop)
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedRequesters": ["c9/x"]}})),
        )
        .await
        .expect("patch record");
    await_objects(
        lab.api(&kind.resource, &shop),
        "the grant object deleted",
        |o| !o.contains_key(&name),
    )
    .await;
    lab.wait_sr(&shop, "api", "the caller dropped from status.grants", |r| {
        r.is_some_and(|r| r["status"]["grants"].as_array().is_none_or(Vec::is_empty))
    })
    .await;
    lab.assert_not_forbidden();
    Some(object)
}

// ----- policies from a ConfigMap (kube mode) -----

/// `--policy-configmap`: the registry is ready only after the ConfigMap was read, so the
/// policies are in force by then; a later change is picked up.
#[tokio::test]
async fn policy_configmap_is_read_before_ready_and_followed() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let Some(lab) = Lab::new("policy_configmap_is_read_before_ready_and_followed").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let cms: Api<ConfigMap> = Api::namespaced(lab.admin.clone(), &lab.ns);
    let cm = |id: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "xcc-policies", "namespace": lab.ns},
            "data": {"p.cedar": format!(
                "@id(\"{id}\")\nforbid (principal, action == Xcc::Action::\"discover\", resource) when {{ resource.name == \"x\" }};"
            )},
        }))
        .expect("configmap")
    };
    cms.create(&PostParams::default(), &cm("first"))
        .await
        .expect("create");
    let (west, _wc) = lab
        .west_with(&pki, |c| {
            c.federation.policy_configmap = Some("xcc-policies".into());
        })
        .await;
    tokio::time::timeout(WAIT, west.health.ready())
        .await
        .expect("timed out waiting for ready");
    assert_eq!(
        west.level.policies().policy_ids(),
        ["announce-clusterset", "bilateral", "carry-self", "first"]
    );
    cms.replace("xcc-policies", &PostParams::default(), &cm("second"))
        .await
        .expect("replace");
    let mut swaps = west.level.gate().subscribe();
    tokio::time::timeout(
        WAIT,
        swaps.wait_for(|_| {
            west.level
                .policies()
                .policy_ids()
                .iter()
                .any(|i| i == "second")
        }),
    )
    .await
    .expect("timed out waiting for the changed policies")
    .expect("the gate is alive");
    assert!(west.policy_errors.get().is_empty());
    lab.assert_not_forbidden();
}

/// A RemoteRegistry deleted and re-created under the same name (new UID): its imports come
/// back owned by the new UID.
#[tokio::test]
async fn recreated_rr_owns_its_imports_again() {
    let Some(lab) = Lab::new("recreated_rr_owns_its_imports_again").await else {
        return;
    };
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain"]).await;
    let (_west, _wc) = lab.west(&pki).await;
    let first = lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;
    let name = format!("a.some.domain-{H}");
    lab.wait_names(vec![name.clone()]).await;
    lab.rrs(&lab.ns)
        .delete(RR, &DeleteParams::default())
        .await
        .expect("delete RR");
    let second = lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;
    assert_ne!(first, second);
    let want = json!([{"apiVersion": V, "kind": "RemoteRegistry", "name": RR, "uid": second}]);
    let records = await_objects(
        lab.api(&ar_sr(), &lab.ns),
        "the import owned by the new RemoteRegistry",
        |o| {
            o.len() == 1
                && o.get(&name)
                    .is_some_and(|r| r["metadata"]["ownerReferences"] == want)
        },
    )
    .await;
    assert_eq!(records.keys().collect::<Vec<_>>(), [&name]);
    lab.assert_not_forbidden();
}

/// The same FQDN exported from two namespaces is two catalog entries; Hamlet serves one
/// (reported as a conflict) and falls over to the other when it goes, so the name stays served.
#[tokio::test]
async fn duplicate_fqdn_across_namespaces_stays_served_until_both_go() {
    let Some(lab) = Lab::new("duplicate_fqdn_across_namespaces_stays_served_until_both_go").await
    else {
        return;
    };
    let pki = Pki::new("xcc.test");
    // Served first: the first namespace by name.
    let elsewhere = lab.namespace("elsewhere").await;
    let shop = lab.namespace("shop").await;
    for ns in [&shop, &elsewhere] {
        lab.create(exported_sr(
            ns,
            "web",
            "web.example.org",
            json!({EXPORT: ""}),
            json!({}),
        ))
        .await;
    }
    let (west, _wc) = lab.west(&pki).await;
    tokio::time::timeout(WAIT, west.health.ready())
        .await
        .expect("timed out waiting for ready");
    let served = |c: &xcc_registry::Catalog| {
        c.hamlet_get("web.example.org")
            .map(|e| e.key.namespace.clone())
    };
    assert_eq!(served(&west.catalog).as_deref(), Some(elsewhere.as_str()));
    assert_eq!(west.catalog.hamlet_conflicts().len(), 1);
    lab.srs(&elsewhere)
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    wait_catalog(&west.catalog, "served from shop", |c| {
        served(c).as_deref() == Some(shop.as_str())
    })
    .await;
    lab.srs(&shop)
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    wait_catalog(&west.catalog, "not served", |c| served(c).is_none()).await;
    lab.assert_not_forbidden();
}

// ----- measurement (not a pass/fail timing; run by hand) -----

/// How long importing N records into the real API server takes, and how many API writes it
/// costs. `XCC_KUBE_IMPORT_N` (default 2000). Run:
/// `cargo test --release -p xcc-registry --test kube_store -- --ignored --nocapture import_throughput`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; prints numbers"]
async fn import_throughput() {
    let Some(lab) = Lab::new("import_throughput").await else {
        return;
    };
    let n: usize = std::env::var("XCC_KUBE_IMPORT_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let pki = Pki::new("xcc.test");
    let fqdns: Vec<String> = (0..n).map(|i| format!("svc-{i}.some.domain")).collect();
    let refs: Vec<&str> = fqdns.iter().map(String::as_str).collect();
    let (east, _ec) = east(&pki, &refs).await;
    let (west, _wc) = lab
        .west_with(&pki, |c| {
            c.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
        })
        .await;
    let t0 = std::time::Instant::now();
    lab.create_rr(RR, &lab.ns, east.hamlet_addr, None).await;
    await_objects(lab.api(&ar_sr(), &lab.ns), "all imported", |o| o.len() == n).await;
    let imported = t0.elapsed();
    lab.wait_synced(RR).await;
    let synced = t0.elapsed();
    let writes = lab.writes();
    let count = |p: &str| writes.iter().filter(|w| w.action() == p).count();
    println!(
        "imported {n} records in {imported:?} (Synced after {synced:?}); applies {}, deletes {}, status writes {}",
        count("patch servicerecords"),
        count("delete servicerecords"),
        count("patch remoteregistries/status"),
    );
    let metrics = http_get(west.metrics_addr.expect("metrics"), "/metrics").await;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("xcc_kube_reconciles_total"))
    {
        println!("{line}");
    }
}

/// What a real API server cannot be made to do on demand, on the in-process fake API server:
///
/// * **410 Gone**: a real server answers a watch with 410 only once etcd was compacted past
///   its resourceVersion *and* the server's watch cache no longer holds it — nothing a test
///   can trigger. The fake's `compact` forces both watches (exports, RemoteRegistries) to
///   relist; a relist at steady state must write nothing, and changes after it are seen.
/// * **A UID changing in one step**: on a real server every deletion reaches an open watch,
///   so the registry always sees a re-created RemoteRegistry's deletion first. The fake stores
///   the new object in place, as a relist that missed the deletion would show it.
mod fake {
    use super::*;
    use xcc_kube_fake::{FakeApiServer, crds};

    const NS: &str = "cross-cluster-connectivity";

    async fn server() -> FakeApiServer {
        FakeApiServer::builder()
            .namespace(NS)
            .namespace("shop")
            .resource(crds::service_records())
            .resource(crds::remote_registries())
            .start()
            .await
    }

    async fn west(
        pki: &Pki,
        api: &FakeApiServer,
    ) -> (Registry, tokio_util::sync::CancellationToken) {
        let mut k = KubeConfig::new(api.client(), false);
        k.status_resync = Duration::from_millis(100);
        let mut cfg = RegistryConfig::loopback(pki.cluster("west"));
        cfg.namespace = NS.into();
        cfg.store = StoreConfig::Kube(k);
        cfg.client.backoff = Backoff {
            min: Duration::from_millis(50),
            max: Duration::from_millis(400),
        };
        cfg.client.quiet_period = Duration::from_millis(300);
        start_with(cfg).await
    }

    async fn create_rr(api: &FakeApiServer, addr: std::net::SocketAddr, domains: Option<&[&str]>) {
        let rr: RemoteRegistry =
            serde_json::from_value(rr_body(RR, NS, &addr.to_string(), domains)).unwrap();
        Api::<RemoteRegistry>::namespaced(api.client(), NS)
            .create(&PostParams::default(), &rr)
            .await
            .expect("create RR");
    }

    fn names(api: &FakeApiServer) -> Vec<String> {
        let mut v: Vec<String> = api
            .list(V, "servicerecords", Some(NS))
            .iter()
            .map(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        v.sort();
        v
    }

    /// Run `probe` (which reads the fake API server) now and after every event of a watch of
    /// its ServiceRecords and RemoteRegistries in the xcc namespace, until `cond` holds; panic
    /// with `what` (and the last state) after [`WAIT`]. The watch is a `kube::runtime`
    /// watcher started by this call: it lists first (so a change made before it started is
    /// seen), and a compaction's 410 Gone makes it re-list, which wakes the probe too.
    async fn wait_fake<T: std::fmt::Debug>(
        api: &FakeApiServer,
        what: &str,
        mut probe: impl FnMut() -> T,
        cond: impl Fn(&T) -> bool,
    ) -> T {
        use kube::runtime::WatchStreamExt as _;
        let records = watcher::watcher(
            Api::<ServiceRecord>::namespaced(api.client(), NS),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(|_| ());
        let rrs = watcher::watcher(
            Api::<RemoteRegistry>::namespaced(api.client(), NS),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(|_| ());
        let mut events = std::pin::pin!(futures::stream::select(records, rrs));
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let v = probe();
            if cond(&v) {
                return v;
            }
            match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Some(())) => {}
                Ok(None) => panic!("the watches ended while waiting for {what}"),
                Err(_) => panic!("timed out waiting for {what}; last state: {v:?}"),
            }
        }
    }

    fn rr_status(api: &FakeApiServer) -> Value {
        api.get(V, "remoteregistries", Some(NS), RR)
            .map(|o| o["status"].clone())
            .unwrap_or(Value::Null)
    }

    #[tokio::test]
    async fn watch_410_gone_relists_write_nothing_at_steady_state_and_miss_no_change() {
        let pki = Pki::new("xcc.test");
        let (east, _ec) = east(&pki, &["a.some.domain", "b.other.domain"]).await;
        let api = server().await;
        let (west, _wc) = west(&pki, &api).await;
        create_rr(&api, east.hamlet_addr, None).await;
        let want = imported_names(&["a.some.domain", "b.other.domain"]);
        wait_fake(&api, "both imports", || names(&api), |n| *n == want).await;
        wait_fake(
            &api,
            "Synced, importedRecords 2",
            || rr_status(&api),
            |s| {
                condition(s, "Synced").is_some_and(|c| c.0 == "True")
                    && s["importedRecords"] == json!(2)
            },
        )
        .await;

        // Zero writes over a quiet period with a forced relist of both watches.
        let before = api.writes();
        let st_before = rr_status(&api);
        api.compact();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            api.writes(),
            before,
            "writes at steady state; RemoteRegistry status before {st_before:#}, after {:#}",
            rr_status(&api)
        );

        // Changes after the compaction are seen by the re-listed watches.
        api.compact();
        let r: ServiceRecord = serde_json::from_value(exported_sr(
            "shop",
            "web",
            "web.shop.example.org",
            json!({EXPORT: ""}),
            json!({}),
        ))
        .unwrap();
        Api::<ServiceRecord>::namespaced(api.client(), "shop")
            .create(&PostParams::default(), &r)
            .await
            .expect("create");
        Api::<RemoteRegistry>::namespaced(api.client(), NS)
            .patch(
                RR,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"allowedDomains": ["some.domain"]}})),
            )
            .await
            .expect("patch RR");
        let want = imported_names(&["a.some.domain"]);
        wait_fake(
            &api,
            "the tightened imports",
            || names(&api),
            |n| *n == want,
        )
        .await;
        wait_catalog(&west.catalog, "export after 410", |c| {
            c.get(&xcc_registry::catalog::ServiceKey::new(
                "west", "shop", "web",
            ))
            .is_some()
        })
        .await;
    }

    /// The UID changes in one step (as after a relist that missed the deletion): the
    /// record is re-pointed at the new owner in place, not deleted and re-created.
    #[tokio::test]
    async fn rr_uid_changing_in_one_step_repoints_the_import_in_place() {
        let pki = Pki::new("xcc.test");
        let (east, _ec) = east(&pki, &["a.some.domain"]).await;
        let api = server().await;
        let (_west, _wc) = west(&pki, &api).await;
        create_rr(&api, east.hamlet_addr, None).await;
        let name = format!("a.some.domain-{H}");
        let want = vec![name.clone()];
        wait_fake(&api, "the import", || names(&api), |n| *n == want).await;
        let record = || {
            api.get(V, "servicerecords", Some(NS), &name)
                .expect("record")
        };
        let record_uid = uid(&record());
        let mut rr = rr_body(RR, NS, &east.hamlet_addr.to_string(), None);
        rr["metadata"]["uid"] = json!("third-uid");
        rr["metadata"]["generation"] = json!(1);
        api.put_raw(rr).expect("put_raw");
        let third =
            json!([{"apiVersion": V, "kind": "RemoteRegistry", "name": RR, "uid": "third-uid"}]);
        wait_fake(
            &api,
            "the import re-pointed at the third UID",
            || record()["metadata"]["ownerReferences"].clone(),
            |o| *o == third,
        )
        .await;
        assert_eq!(uid(&record()), record_uid, "updated in place");
        assert_eq!(names(&api), want);
    }
}
