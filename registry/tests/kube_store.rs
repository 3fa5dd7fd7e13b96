//! `--store kube` against the in-process fake API server, with real registries (mTLS on
//! loopback) as remotes: reference §5.5 RC-01..RC-13, §5.6 OD-01/OD-02 in their fixed form,
//! NEW-01..NEW-03, exports (label removal → DELETE, imported records never exported, S7), RR in
//! another namespace, RR deletion, zero writes at steady state, 410 Gone recovery, leader
//! election. Every wait polls the fake or the catalog with a timeout; nothing sleeps to
//! synchronise (the only fixed waits are the quiet periods over which writes are counted).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use xcc_kube_fake::{FakeApiServer, Verb, crds};
use xcc_proto::crd::RemoteRegistry;
use xcc_registry::hamlet::client::Backoff;
use xcc_registry::store::kube::KubeConfig;
use xcc_registry::{Registry, RegistryConfig, StoreConfig};

const NS: &str = "cross-cluster-connectivity";
const RR: &str = "some-remote-registry";
const H: &str = "06df7236"; // fnv1a32("some-remote-registry")
const V: &str = "connectivity.tanzu.vmware.com/v1alpha1";
const IMPORTED: &str = "connectivity.tanzu.vmware.com/imported";
const REMOTE_LABEL: &str = "connectivity.tanzu.vmware.com/remote-registry";
const EXPORT: &str = "connectivity.tanzu.vmware.com/export";
/// The fake's request-counter name of ServiceRecords.
const SR_RES: &str = "servicerecords.connectivity.tanzu.vmware.com";

async fn fake() -> FakeApiServer {
    let mut b = FakeApiServer::builder()
        .namespace(NS)
        .namespace("elsewhere")
        .namespace("shop");
    for r in crds::all() {
        b = b.resource(r);
    }
    b.start().await
}

fn kube_config(api: &FakeApiServer, leader_elect: bool) -> KubeConfig {
    let mut k = KubeConfig::new(api.client(), leader_elect);
    k.status_resync = Duration::from_millis(100);
    k
}

/// The importing registry ("west") on the kube store.
async fn west(pki: &Pki, api: &FakeApiServer) -> (Registry, tokio_util::sync::CancellationToken) {
    west_with(pki, api, |_| {}).await
}

async fn west_with(
    pki: &Pki,
    api: &FakeApiServer,
    f: impl FnOnce(&mut RegistryConfig),
) -> (Registry, tokio_util::sync::CancellationToken) {
    let mut cfg = RegistryConfig::loopback(pki.cluster("west"));
    cfg.namespace = NS.into();
    cfg.store = StoreConfig::Kube(kube_config(api, false));
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(400),
    };
    cfg.client.quiet_period = Duration::from_millis(300);
    f(&mut cfg);
    start_with(cfg).await
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

async fn create_rr(
    api: &FakeApiServer,
    name: &str,
    ns: &str,
    addr: std::net::SocketAddr,
    domains: Option<&[&str]>,
) -> RemoteRegistry {
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), ns);
    let rr: RemoteRegistry =
        serde_json::from_value(rr_body(name, ns, &addr.to_string(), domains)).expect("rr");
    rrs.create(&PostParams::default(), &rr)
        .await
        .expect("create RR")
}

async fn set_domains(api: &FakeApiServer, name: &str, domains: &[&str]) -> i64 {
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), NS);
    let rr = rrs
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedDomains": domains}})),
        )
        .await
        .expect("patch RR");
    rr.metadata.generation.expect("generation")
}

fn sr_names(api: &FakeApiServer) -> Vec<String> {
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

fn sr(api: &FakeApiServer, name: &str) -> Option<Value> {
    api.get(V, "servicerecords", Some(NS), name)
}

fn rr_status(api: &FakeApiServer, ns: &str, name: &str) -> Value {
    api.get(V, "remoteregistries", Some(ns), name)
        .map(|o| o["status"].clone())
        .unwrap_or(Value::Null)
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

/// Poll `cond` every 20 ms until it holds; panic with `what` (and the last state) after WAIT.
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

async fn wait_names(api: &FakeApiServer, want: Vec<String>) {
    wait_for(
        &format!("records {want:?}"),
        || sr_names(api),
        |n| *n == want,
    )
    .await;
}

async fn wait_synced(api: &FakeApiServer, name: &str) -> Value {
    wait_for(
        &format!("{name} Synced=True"),
        || rr_status(api, NS, name),
        |s| condition(s, "Synced").is_some_and(|c| c.0 == "True"),
    )
    .await
}

/// Store an object as given (fixed UIDs, states clients cannot create).
fn put(api: &FakeApiServer, obj: Value) {
    api.put_raw(obj).expect("put_raw");
}

fn raw_rr(name: &str, uid: &str, addr: &str) -> Value {
    let mut v = rr_body(name, NS, addr, None);
    v["metadata"]["uid"] = json!(uid);
    v["metadata"]["generation"] = json!(1);
    v
}

fn raw_import(name: &str, fqdn: &str, remote: &str, owner_uid: &str) -> Value {
    json!({
        "apiVersion": V, "kind": "ServiceRecord",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "labels": {IMPORTED: "", REMOTE_LABEL: remote},
            "ownerReferences": [{"apiVersion": V, "kind": "RemoteRegistry", "name": remote, "uid": owner_uid}],
        },
        "spec": {"fqdn": fqdn, "endpoints": [{"address": "10.9.9.9", "port": 443}]},
    })
}

fn raw_record(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": V, "kind": "ServiceRecord",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "labels": labels},
        "spec": {"fqdn": "user.example.org", "endpoints": []},
    })
}

fn uid_of(api: &FakeApiServer, name: &str) -> String {
    sr(api, name).expect("record")["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

// ----- RC-01..RC-05, RC-10, zero writes at steady state -----

#[tokio::test]
async fn rc_01_to_05_and_10_valid_rr_imports_named_labelled_owned_then_no_writes() {
    let pki = Pki::new("xcc.test");
    let long = format!("{}.some.domain", "a".repeat(63));
    let (east, _ec) = east(&pki, &["some-service.some.domain", &long]).await;
    let api = fake().await;
    let (west, _wc) = west_with(&pki, &api, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    })
    .await;
    let rr = create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    let uid = rr.metadata.uid.clone().expect("uid");

    wait_names(&api, imported_names(&["some-service.some.domain", &long])).await;
    let status = wait_synced(&api, RR).await;
    // RC-01, RC-02 (plus our Connected/Synced conditions and counters).
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
    wait_for(
        "importedRecords 2",
        || rr_status(&api, NS, RR),
        |s| s["importedRecords"] == json!(2),
    )
    .await;
    // RC-03..RC-05: name, labels, annotations, owner references, spec.
    let r = sr(&api, &format!("some-service.some.domain-{H}")).expect("record");
    assert_eq!(
        r["metadata"]["labels"],
        json!({IMPORTED: "", REMOTE_LABEL: RR})
    );
    assert_eq!(
        r["metadata"]["annotations"],
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
    // (100 ms) and a forced relist of both watches (410 Gone).
    let before = api.writes();
    let st_before = rr_status(&api, NS, RR);
    api.compact();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = api.writes();
    assert_eq!(
        after,
        before,
        "writes at steady state; RemoteRegistry status before {st_before:#}, after {:#}",
        rr_status(&api, NS, RR)
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

// ----- RC-06..RC-09: allowedDomains -----

#[tokio::test]
async fn rc_06_to_09_allowed_domains_tighten_and_loosen() {
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
    let api = fake().await;
    let (_west, _wc) = west(&pki, &api).await;
    create_rr(&api, RR, NS, east.hamlet_addr, Some(&[])).await;
    let seven = imported_names(&[
        "some-service.some.domain",
        "other.some.domain",
        "other.somesome.domain",
        "some.other.domain",
        "domain.with.dot.at.end",
        "domain.with.mixed.case",
        "yet.another.domain",
    ]);
    // RC-06
    wait_names(&api, seven.clone()).await;
    // C7: the canonical FQDN is stored.
    assert_eq!(
        sr(&api, &format!("domain.with.mixed.case-{H}")).expect("r")["spec"]["fqdn"],
        "domain.with.mixed.case"
    );
    // RC-07
    let g = set_domains(&api, RR, &["some.domain"]).await;
    wait_names(
        &api,
        imported_names(&["some-service.some.domain", "other.some.domain"]),
    )
    .await;
    wait_for(
        "observedGeneration",
        || rr_status(&api, NS, RR),
        |s| s["observedGeneration"] == json!(g),
    )
    .await;
    // RC-08
    set_domains(
        &api,
        RR,
        &[
            "some.domain",
            "some.other.domain",
            "domain.with.dot.at.end.",
            "domain.with.MIXED.case",
        ],
    )
    .await;
    wait_names(
        &api,
        imported_names(&[
            "some-service.some.domain",
            "other.some.domain",
            "some.other.domain",
            "domain.with.dot.at.end",
            "domain.with.mixed.case",
        ]),
    )
    .await;
    // RC-09
    let g = set_domains(&api, RR, &[]).await;
    wait_names(&api, seven).await;
    wait_for(
        "observedGeneration",
        || rr_status(&api, NS, RR),
        |s| s["observedGeneration"] == json!(g),
    )
    .await;
}

// ----- RC-11 / OD-01 (fixed form), NEW-02, NEW-03 -----

/// Pre-existing records: our stale and live imports (labels + UID), another RemoteRegistry's
/// import, an exported record and an unlabelled record. After the sweep (marker or quiet period) only our stale import
/// is gone; our live import is the same object (updated in place).
async fn stale_imports_removed_scoped(marker: bool) {
    let pki = Pki::new("xcc.test");
    let api = fake().await;
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
    put(&api, raw_rr(RR, "remote-registry-uid", &addr.to_string()));
    put(&api, raw_rr("other", "other-uid", "127.0.0.1:1"));
    put(
        &api,
        raw_import(
            &format!("some-service.some.domain-{H}"),
            "some-service.some.domain",
            RR,
            "remote-registry-uid",
        ),
    );
    put(
        &api,
        raw_import(
            &format!("orphaned-service-record-{H}"),
            "orphaned-service-record",
            RR,
            "remote-registry-uid",
        ),
    );
    put(
        &api,
        raw_import("x.other-1", "x.other", "other", "other-uid"),
    );
    put(&api, raw_record("exported", json!({EXPORT: ""})));
    put(&api, raw_record("unlabelled", json!({})));
    let (_west, _wc) = west(&pki, &api).await;

    let mut want = vec![
        format!("another-service.some.domain-{H}"),
        "exported".to_string(),
        format!("some-service.some.domain-{H}"),
        "unlabelled".to_string(),
        "x.other-1".to_string(),
    ];
    want.sort();
    wait_names(&api, want).await;
    if marker {
        // A plain Hamlet server sends no marker; the client reports Synced on its next batch.
        wait_synced(&api, RR).await;
    }
    // Updated in place, never re-created.
    assert_eq!(
        uid_of(&api, &format!("some-service.some.domain-{H}")),
        format!("uid-some-service.some.domain-{H}")
    );
    assert_eq!(
        sr(&api, &format!("some-service.some.domain-{H}")).expect("r")["spec"]["endpoints"],
        json!([{"address": "10.0.0.1", "port": 443}])
    );
    for n in ["x.other-1", "exported", "unlabelled"] {
        assert_eq!(uid_of(&api, n), format!("uid-{n}"));
    }
    assert_eq!(
        api.writes().get(SR_RES, Verb::Delete),
        1,
        "only the orphan was deleted"
    );
}

#[tokio::test]
async fn rc_11_od_01_stale_imports_removed_after_the_marker_scoped_to_labels_and_uid() {
    stale_imports_removed_scoped(true).await;
}

#[tokio::test]
async fn od_01_new_02_stale_imports_removed_after_the_quiet_period_against_a_go_server() {
    stale_imports_removed_scoped(false).await;
}

/// NEW-02 with two live RemoteRegistries: A's sweep removes A's stale import only.
#[tokio::test]
async fn new_02_two_rrs_sweep_leaves_the_other_registrys_imports_alone() {
    let pki = Pki::new("xcc.test");
    let api = fake().await;
    let (a, _ac) = east(&pki, &["a.some.domain"]).await;
    let (b, _bc) = {
        let (reg, c) = start(pki.cluster("north")).await;
        reg.catalog
            .upsert(export("north", "ns", "b.some.domain", "10.0.0.2"));
        (reg, c)
    };
    put(&api, raw_rr("rr-a", "uid-a", &a.hamlet_addr.to_string()));
    put(&api, raw_rr("rr-b", "uid-b", &b.hamlet_addr.to_string()));
    let ha = xcc_proto::names::hash8("rr-a");
    let hb = xcc_proto::names::hash8("rr-b");
    put(
        &api,
        raw_import(
            &format!("stale.some.domain-{ha}"),
            "stale.some.domain",
            "rr-a",
            "uid-a",
        ),
    );
    put(
        &api,
        raw_import(
            &format!("b.some.domain-{hb}"),
            "b.some.domain",
            "rr-b",
            "uid-b",
        ),
    );
    put(&api, raw_record("exported", json!({EXPORT: ""})));
    put(&api, raw_record("unlabelled", json!({})));
    let (_west, _wc) = west(&pki, &api).await;
    let mut want = vec![
        format!("a.some.domain-{ha}"),
        format!("b.some.domain-{hb}"),
        "exported".to_string(),
        "unlabelled".to_string(),
    ];
    want.sort();
    wait_names(&api, want).await;
    wait_synced(&api, "rr-a").await;
    wait_synced(&api, "rr-b").await;
    assert_eq!(
        uid_of(&api, &format!("b.some.domain-{hb}")),
        format!("uid-b.some.domain-{hb}")
    );
    assert_eq!(api.writes().get(SR_RES, Verb::Delete), 1);
}

/// NEW-03: a remote that exports nothing still gets its stale import removed.
#[tokio::test]
async fn new_03_remote_exporting_nothing_stale_import_removed() {
    let pki = Pki::new("xcc.test");
    let api = fake().await;
    let (e, _ec) = east(&pki, &[]).await;
    put(
        &api,
        raw_rr(RR, "remote-registry-uid", &e.hamlet_addr.to_string()),
    );
    put(
        &api,
        raw_import(
            &format!("gone.some.domain-{H}"),
            "gone.some.domain",
            RR,
            "remote-registry-uid",
        ),
    );
    let (_west, _wc) = west(&pki, &api).await;
    wait_names(&api, vec![]).await;
    let status = wait_synced(&api, RR).await;
    assert_eq!(status["importedRecords"], json!(0));
}

/// OD-02 (fixed form): records received on a connection that never completes a snapshot
/// (a plain Hamlet server, quiet period far away) delete nothing; after a reset (redial) to a
/// server that completes its snapshot, the stale record is removed and the live one kept.
#[tokio::test]
async fn od_02_no_sweep_before_a_complete_snapshot_then_only_the_stale_record_goes() {
    let pki = Pki::new("xcc.test");
    let api = fake().await;
    let server = GoLikeServer::default();
    *server.state.lock().expect("lock") = vec![fs("some-service.some.domain", "10.0.0.7")];
    let (go_addr, _go) = serve_go_like(server.clone(), pki.cluster("go-peer")).await;
    let (e, _ec) = east(&pki, &["some-service.some.domain"]).await;
    put(
        &api,
        raw_rr(RR, "remote-registry-uid", &go_addr.to_string()),
    );
    put(
        &api,
        raw_import(
            &format!("orphaned-service-record-{H}"),
            "orphaned-service-record",
            RR,
            "remote-registry-uid",
        ),
    );
    let (_west, _wc) = west_with(&pki, &api, |c| {
        c.client.quiet_period = Duration::from_secs(3600);
    })
    .await;
    let live = format!("some-service.some.domain-{H}");
    wait_for(
        "the record from the first connection",
        || sr(&api, &live).map(|r| r["spec"]["endpoints"][0]["address"].clone()),
        |a| a.as_ref().is_some_and(|a| a == "10.0.0.7"),
    )
    .await;
    server.wait_requests(2).await;
    assert_eq!(
        sr_names(&api),
        imported_names(&["orphaned-service-record", "some-service.some.domain"]),
        "no sweep without a complete snapshot"
    );
    let uid = uid_of(&api, &live);

    // Reset: the RemoteRegistry now points at a server that completes its snapshot.
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), NS);
    rrs.patch(
        RR,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"address": e.hamlet_addr.to_string()}})),
    )
    .await
    .expect("patch RR");
    wait_names(&api, imported_names(&["some-service.some.domain"])).await;
    assert_eq!(uid_of(&api, &live), uid, "kept, updated in place");
    assert_eq!(
        sr(&api, &live).expect("r")["spec"]["endpoints"],
        json!([{"address": "10.0.0.1", "port": 443}])
    );
    assert_eq!(api.writes().get(SR_RES, Verb::Delete), 1);
}

// ----- RC-12, RC-13: invalid allowedDomains -----

#[tokio::test]
async fn rc_12_invalid_domains_nothing_imported_and_reported() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["some-service.some.domain"]).await;
    let api = fake().await;
    let (west, _wc) = west(&pki, &api).await;
    create_rr(&api, RR, NS, east.hamlet_addr, Some(&["invalid..domain"])).await;
    let status = wait_for(
        "Valid=False",
        || rr_status(&api, NS, RR),
        |s| condition(s, "Valid").is_some_and(|c| c.0 == "False"),
    )
    .await;
    let expected =
        xcc_proto::domains::validate_allowed_domains(RR, &["invalid..domain".to_string()])
            .expect_err("invalid");
    assert!(expected.contains("Invalid domain"), "{expected}");
    assert_eq!(condition_types(&status), ["Valid"]);
    assert_eq!(
        condition(&status, "Valid"),
        Some(("False".into(), "InvalidDomain".into(), expected))
    );
    assert_eq!(status["observedGeneration"], json!(1));
    assert!(sr_names(&api).is_empty());
    assert!(west.peers.list().iter().all(|p| p.name != RR), "no client");
}

#[tokio::test]
async fn rc_13_c4_update_to_invalid_domains_stops_the_client_and_removes_imports() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["some-service.some.domain"]).await;
    let api = fake().await;
    let (west, _wc) = west(&pki, &api).await;
    create_rr(&api, RR, NS, east.hamlet_addr, Some(&["some.domain"])).await;
    wait_names(&api, imported_names(&["some-service.some.domain"])).await;
    wait_synced(&api, RR).await;
    let g = set_domains(&api, RR, &["invalid..domain"]).await;
    let status = wait_for(
        "Valid=False at the new generation",
        || rr_status(&api, NS, RR),
        |s| {
            s["observedGeneration"] == json!(g)
                && condition(s, "Valid").is_some_and(|c| c.0 == "False")
        },
    )
    .await;
    let (_, reason, message) = condition(&status, "Valid").expect("Valid");
    assert_eq!(reason, "InvalidDomain");
    assert!(message.contains("Invalid domain"), "{message}");
    wait_names(&api, vec![]).await;
    wait_for(
        "client stopped",
        || west.peers.list().iter().any(|p| p.name == RR),
        |running| !running,
    )
    .await;
    assert!(imported_fqdns(&west.catalog, RR).is_empty());
}

// ----- NEW-01: restart -----

#[tokio::test]
async fn new_01_restart_with_an_observed_rr_reconnects_and_resyncs_without_duplicates() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain", "b.some.domain"]).await;
    let api = fake().await;
    let (west1, c1) = west(&pki, &api).await;
    create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    wait_names(&api, imported_names(&["a.some.domain", "b.some.domain"])).await;
    let s = wait_synced(&api, RR).await;
    assert_eq!(s["observedGeneration"], json!(1));
    let uid_a = uid_of(&api, &format!("a.some.domain-{H}"));
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
    let deletes_before = api.writes().get(SR_RES, Verb::Delete);

    let (west2, _c2) = west(&pki, &api).await;
    wait_names(&api, imported_names(&["a.some.domain", "c.some.domain"])).await;
    wait_for(
        "connected again",
        || {
            west2
                .peers
                .list()
                .iter()
                .any(|p| p.name == RR && p.state() == xcc_registry::peers::PeerState::Connected)
        },
        |c| *c,
    )
    .await;
    assert_eq!(
        uid_of(&api, &format!("a.some.domain-{H}")),
        uid_a,
        "not re-created"
    );
    assert_eq!(
        api.writes().get(SR_RES, Verb::Delete) - deletes_before,
        1,
        "only b was deleted"
    );
    // The catalog mirrors an import right after it is stored, so it may trail the API by a step.
    wait_for(
        "west's catalog holds a and c",
        || imported_fqdns(&west2.catalog, RR),
        |f| *f == ["a.some.domain", "c.some.domain"],
    )
    .await;
}

// ----- RR lifecycle -----

#[tokio::test]
async fn c5_rr_in_another_namespace_is_reported_and_not_handled() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["some-service.some.domain"]).await;
    let api = fake().await;
    let (west, _wc) = west(&pki, &api).await;
    create_rr(&api, RR, "elsewhere", east.hamlet_addr, None).await;
    let status = wait_for(
        "WrongNamespace",
        || rr_status(&api, "elsewhere", RR),
        |s| condition(s, "Valid").is_some(),
    )
    .await;
    let (st, reason, message) = condition(&status, "Valid").expect("Valid");
    assert_eq!((st.as_str(), reason.as_str()), ("False", "WrongNamespace"));
    assert!(
        message.contains("\"elsewhere\"") && message.contains(NS),
        "{message}"
    );
    assert!(api.list(V, "servicerecords", None).is_empty());
    assert!(west.peers.list().iter().all(|p| p.name != RR));
}

#[tokio::test]
async fn rr_deleted_its_imports_are_removed_and_the_client_stops() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain"]).await;
    let api = fake().await;
    let (west, _wc) = west(&pki, &api).await;
    put(&api, raw_record("unlabelled", json!({})));
    create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    wait_names(
        &api,
        vec![format!("a.some.domain-{H}"), "unlabelled".to_string()],
    )
    .await;
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), NS);
    rrs.delete(RR, &DeleteParams::default())
        .await
        .expect("delete RR");
    wait_names(&api, vec!["unlabelled".to_string()]).await;
    wait_for(
        "client stopped",
        || west.peers.list().iter().any(|p| p.name == RR),
        |running| !running,
    )
    .await;
    assert!(imported_fqdns(&west.catalog, RR).is_empty());
}

#[tokio::test]
async fn c9_foreign_record_of_the_same_name_is_reported_never_taken_over() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["some-service.some.domain", "b.some.domain"]).await;
    let api = fake().await;
    let name = format!("some-service.some.domain-{H}");
    put(&api, raw_record(&name, json!({})));
    let (_west, _wc) = west(&pki, &api).await;
    create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    wait_names(&api, vec![format!("b.some.domain-{H}"), name.clone()]).await;
    let status = wait_for(
        "conflict reported",
        || rr_status(&api, NS, RR),
        |s| condition(s, "Synced").is_some_and(|c| c.0 == "True" && c.2.contains(&name)),
    )
    .await;
    // The conflicting import has no record of ours.
    assert_eq!(status["importedRecords"], json!(1));
    let r = sr(&api, &name).expect("record");
    assert_eq!(r["metadata"]["uid"], json!(format!("uid-{name}")));
    assert_eq!(r["metadata"]["labels"], json!({}));
    assert_eq!(r["spec"]["fqdn"], "user.example.org");
    assert!(r["metadata"]["ownerReferences"].is_null());
    let events = wait_for(
        "an ImportConflict Event on the RemoteRegistry",
        || api.list("events.k8s.io/v1", "events", Some(NS)),
        |evs| evs.iter().any(|e| e["reason"] == "ImportConflict"),
    )
    .await;
    let ev = events
        .iter()
        .find(|e| e["reason"] == "ImportConflict")
        .expect("event");
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["kind"], "RemoteRegistry");
    assert_eq!(ev["regarding"]["name"], RR);
    assert!(
        ev["note"].as_str().is_some_and(|n| n.contains(&name)),
        "{ev}"
    );
}

// ----- exports -----

fn exported_sr(ns: &str, name: &str, fqdn: &str, labels: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": V, "kind": "ServiceRecord",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": {"fqdn": fqdn, "endpoints": [{"address": "10.1.0.1", "port": 443}]},
    })
}

#[tokio::test]
async fn exports_label_removal_and_deletion_send_deletes_imported_never_exported() {
    let pki = Pki::new("xcc.test");
    let api = fake().await;
    let srs: Api<xcc_proto::crd::ServiceRecord> = Api::namespaced(api.client(), "shop");
    let create = |v: Value| {
        let srs = srs.clone();
        async move {
            let r: xcc_proto::crd::ServiceRecord = serde_json::from_value(v).expect("sr");
            srs.create(&PostParams::default(), &r)
                .await
                .expect("create");
        }
    };
    create(exported_sr(
        "shop",
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
    create(exported_sr(
        "shop",
        "imported-too",
        "imp.shop.example.org",
        json!({EXPORT: "", IMPORTED: ""}),
        json!({}),
    ))
    .await;
    create(exported_sr(
        "shop",
        "not-exported",
        "no.shop.example.org",
        json!({}),
        json!({}),
    ))
    .await;
    let (west, _wc) = west(&pki, &api).await;
    wait_for("ready", || west.health.is_ready(), |r| *r).await;
    let fqdns = || -> Vec<String> {
        west.catalog
            .list(&xcc_registry::catalog::ListFilter {
                source: Some(xcc_registry::catalog::Source::Local),
                ..Default::default()
            })
            .iter()
            .map(|e| e.fqdn.clone())
            .collect()
    };
    assert_eq!(fqdns(), ["web.shop.example.org"]);
    let entry = west
        .catalog
        .get(&xcc_registry::catalog::ServiceKey::new(
            "west",
            "shop",
            "web.shop.example.org",
        ))
        .expect("entry");
    assert_eq!(
        entry.labels,
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

    // The label comes off: consumers get a DELETE (S1).
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
    assert!(fqdns().is_empty());

    // Labelled again, then deleted: CREATE/UPDATE, then DELETE.
    srs.patch(
        "web.shop.example.org",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {EXPORT: ""}}})),
    )
    .await
    .expect("label");
    wait_for("exported again", fqdns, |f| f.len() == 1).await;
    srs.delete("web.shop.example.org", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("export removed", fqdns, |f| f.is_empty()).await;
}

#[tokio::test]
async fn watch_410_gone_recovery_exports_and_remote_registries() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain", "b.other.domain"]).await;
    let api = fake().await;
    let (west, _wc) = west(&pki, &api).await;
    create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    wait_names(&api, imported_names(&["a.some.domain", "b.other.domain"])).await;
    wait_synced(&api, RR).await;

    api.compact();
    // Changes after the compaction are seen by the re-listed watches.
    let srs: Api<xcc_proto::crd::ServiceRecord> = Api::namespaced(api.client(), "shop");
    let r: xcc_proto::crd::ServiceRecord = serde_json::from_value(exported_sr(
        "shop",
        "web",
        "web.shop.example.org",
        json!({EXPORT: ""}),
        json!({}),
    ))
    .expect("sr");
    srs.create(&PostParams::default(), &r)
        .await
        .expect("create");
    set_domains(&api, RR, &["some.domain"]).await;
    wait_names(&api, imported_names(&["a.some.domain"])).await;
    wait_for(
        "export after 410",
        || {
            west.catalog
                .get(&xcc_registry::catalog::ServiceKey::new(
                    "west", "shop", "web",
                ))
                .is_some()
        },
        |b| *b,
    )
    .await;
}

#[tokio::test]
async fn leader_election_holds_the_lease_and_imports() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain"]).await;
    let api = fake().await;
    let (_west, _wc) = west_with(&pki, &api, |c| {
        c.store = StoreConfig::Kube(kube_config(&api, true));
    })
    .await;
    create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    wait_names(&api, imported_names(&["a.some.domain"])).await;
    let lease = api
        .get("coordination.k8s.io/v1", "leases", Some(NS), "xcc-registry")
        .expect("lease");
    assert!(
        lease["spec"]["holderIdentity"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{lease}"
    );
}

// ----- hierarchy imports through the same sink -----

/// A `role: Parent` RemoteRegistry: the registry joins the hierarchy and the granted answers
/// of `spec.imports` become imported ServiceRecords like any other import; deleting the
/// RemoteRegistry removes them.
#[tokio::test]
async fn parent_rr_hierarchy_imports_become_imported_records() {
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

    let api = fake().await;
    let (west, _wc) = west(&pki, &api).await;
    let mut body = rr_body("hier", NS, &root.hamlet_addr.to_string(), None);
    body["spec"]["role"] = json!("Parent");
    body["spec"]["imports"] =
        json!([{"namespace": "shop", "name": "api", "requesterService": "web"}]);
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), NS);
    let rr: RemoteRegistry = serde_json::from_value(body).expect("rr");
    let rr = rrs
        .create(&PostParams::default(), &rr)
        .await
        .expect("create RR");
    let fqdn = xcc_proto::names::clusterset_fqdn("api", "shop");
    let name = xcc_proto::names::imported_record_name(&fqdn, "hier").expect("name");
    wait_names(&api, vec![name.clone()]).await;
    let r = sr(&api, &name).expect("record");
    assert_eq!(
        r["metadata"]["labels"],
        json!({IMPORTED: "", REMOTE_LABEL: "hier"})
    );
    assert_eq!(
        r["metadata"]["ownerReferences"],
        json!([{"apiVersion": V, "kind": "RemoteRegistry", "name": "hier", "uid": rr.metadata.uid.clone().expect("uid")}])
    );
    assert_eq!(
        r["spec"],
        json!({"fqdn": fqdn, "endpoints": [{"address": "10.2.0.1", "port": 443}]})
    );
    let status = wait_for(
        "parent connected, one import",
        || rr_status(&api, NS, "hier"),
        |s| {
            condition(s, "Connected").is_some_and(|c| c.0 == "True")
                && s["importedRecords"] == json!(1)
        },
    )
    .await;
    assert_eq!(
        condition(&status, "Valid").map(|c| c.0),
        Some("True".to_string())
    );

    rrs.delete("hier", &DeleteParams::default())
        .await
        .expect("delete RR");
    wait_names(&api, vec![]).await;
    wait_for(
        "hierarchy imports gone from the catalog",
        || {
            west.catalog
                .list(&xcc_registry::catalog::ListFilter {
                    source: Some(xcc_registry::catalog::Source::Hierarchy("hier".into())),
                    ..Default::default()
                })
                .len()
        },
        |n| *n == 0,
    )
    .await;
}

// ----- measurement (not a pass/fail timing; run by hand) -----

/// How long importing N records into the fake API server takes, and how many API writes it
/// costs. `XCC_KUBE_IMPORT_N` (default 2000). Run:
/// `cargo test --release -p xcc-registry --test kube_store -- --ignored --nocapture import_throughput`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; prints numbers"]
async fn import_throughput() {
    let n: usize = std::env::var("XCC_KUBE_IMPORT_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let pki = Pki::new("xcc.test");
    let fqdns: Vec<String> = (0..n).map(|i| format!("svc-{i}.some.domain")).collect();
    let refs: Vec<&str> = fqdns.iter().map(String::as_str).collect();
    let (east, _ec) = east(&pki, &refs).await;
    let api = fake().await;
    let (west, _wc) = west_with(&pki, &api, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().expect("addr"));
    })
    .await;
    let t0 = std::time::Instant::now();
    create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    wait_for(
        "all imported",
        || api.list(V, "servicerecords", Some(NS)).len(),
        |c| *c == n,
    )
    .await;
    let imported = t0.elapsed();
    wait_synced(&api, RR).await;
    let synced = t0.elapsed();
    let writes = api.writes();
    println!(
        "imported {n} records in {imported:?} (Synced after {synced:?}); applies {}, deletes {}, status writes {}",
        writes.get(SR_RES, Verb::Patch),
        writes.get(SR_RES, Verb::Delete),
        writes.get(
            "remoteregistries.connectivity.tanzu.vmware.com/status",
            Verb::Patch
        ),
    );
    let metrics = http_get(west.metrics_addr.expect("metrics"), "/metrics").await;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("xcc_kube_reconciles_total"))
    {
        println!("{line}");
    }
}

/// C9: a RemoteRegistry deleted and re-created under the same name (new UID): its imports come
/// back owned by the new UID.
#[tokio::test]
async fn c9_recreated_rr_owns_its_imports_again() {
    let pki = Pki::new("xcc.test");
    let (east, _ec) = east(&pki, &["a.some.domain"]).await;
    let api = fake().await;
    let (_west, _wc) = west(&pki, &api).await;
    let first = create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    let name = format!("a.some.domain-{H}");
    wait_names(&api, vec![name.clone()]).await;
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), NS);
    rrs.delete(RR, &DeleteParams::default())
        .await
        .expect("delete RR");
    let second = create_rr(&api, RR, NS, east.hamlet_addr, None).await;
    let new_uid = second.metadata.uid.clone().expect("uid");
    assert_ne!(first.metadata.uid, second.metadata.uid);
    wait_for(
        "the import owned by the new RemoteRegistry",
        || sr(&api, &name).map(|r| r["metadata"]["ownerReferences"].clone()),
        |o| {
            o.as_ref().is_some_and(|o| {
                *o == json!([{"apiVersion": V, "kind": "RemoteRegistry", "name": RR, "uid": new_uid}])
            })
        },
    )
    .await;
    assert_eq!(sr_names(&api), std::slice::from_ref(&name));

    // The UID changes in one step (as after a relist that missed the deletion): the record is
    // re-pointed at the new owner in place, not deleted and re-created.
    let record_uid = uid_of(&api, &name);
    put(
        &api,
        raw_rr(
            "some-remote-registry",
            "third-uid",
            &east.hamlet_addr.to_string(),
        ),
    );
    wait_for(
        "the import re-pointed at the third UID",
        || sr(&api, &name).map(|r| r["metadata"]["ownerReferences"].clone()),
        |o| {
            o.as_ref().is_some_and(|o| {
                *o == json!([{"apiVersion": V, "kind": "RemoteRegistry", "name": RR, "uid": "third-uid"}])
            })
        },
    )
    .await;
    assert_eq!(uid_of(&api, &name), record_uid, "updated in place");
}

/// S5: the same FQDN exported from two namespaces is two catalog entries; Hamlet serves one
/// (reported as a conflict) and falls over to the other when it goes, so the name stays served.
#[tokio::test]
async fn s5_duplicate_fqdn_across_namespaces_stays_served_until_both_go() {
    let pki = Pki::new("xcc.test");
    let api = fake().await;
    for ns in ["shop", "elsewhere"] {
        let srs: Api<xcc_proto::crd::ServiceRecord> = Api::namespaced(api.client(), ns);
        let r: xcc_proto::crd::ServiceRecord = serde_json::from_value(exported_sr(
            ns,
            "web",
            "web.example.org",
            json!({EXPORT: ""}),
            json!({}),
        ))
        .expect("sr");
        srs.create(&PostParams::default(), &r)
            .await
            .expect("create");
    }
    let (west, _wc) = west(&pki, &api).await;
    wait_for("ready", || west.health.is_ready(), |r| *r).await;
    let served = |w: &Registry| {
        w.catalog
            .hamlet_get("web.example.org")
            .map(|e| e.key.namespace.clone())
    };
    assert_eq!(served(&west).as_deref(), Some("elsewhere"));
    assert_eq!(west.catalog.hamlet_conflicts().len(), 1);
    let srs: Api<xcc_proto::crd::ServiceRecord> = Api::namespaced(api.client(), "elsewhere");
    srs.delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for(
        "served from shop",
        || served(&west),
        |s| s.as_deref() == Some("shop"),
    )
    .await;
    let srs: Api<xcc_proto::crd::ServiceRecord> = Api::namespaced(api.client(), "shop");
    srs.delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("not served", || served(&west), |s| s.is_none()).await;
}

// ----- hierarchy: per-import status, restart without churn -----

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
    let policies = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        policies.path().join("no-secret.cedar"),
        r#"@id("no-secret")
forbid (principal, action == Xcc::Action::"discover", resource) when { resource.name == "secret" };"#,
    )
    .expect("policy");
    let mut rcfg = RegistryConfig::loopback(pki.cluster("root"));
    rcfg.federation.policy_dir = Some(policies.path().to_path_buf());
    let (root, rc) = start_with(rcfg).await;
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

fn parent_rr(root: std::net::SocketAddr, imports: Value) -> RemoteRegistry {
    let mut body = rr_body("hier", NS, &root.to_string(), None);
    body["spec"]["role"] = json!("Parent");
    body["spec"]["imports"] = imports;
    serde_json::from_value(body).expect("rr")
}

fn hierarchy_count(reg: &Registry) -> usize {
    reg.catalog
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
    let pki = Pki::new("xcc.test");
    let (root, _owner, _policies, _cancels) = tree(&pki).await;
    let api = fake().await;
    let (west1, c1) = west(&pki, &api).await;
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), NS);
    rrs.create(
        &PostParams::default(),
        &parent_rr(
            root.hamlet_addr,
            json!([
                {"namespace": "shop", "name": "api", "requesterService": "web"},
                {"namespace": "shop", "name": "other", "requesterService": "web"},
                {"namespace": "shop", "name": "secret", "requesterService": "web"},
                {"fqdn": "nope.shop.svc.clusterset.local", "requesterService": "web"},
            ]),
        ),
    )
    .await
    .expect("create RR");
    let fqdn = xcc_proto::names::clusterset_fqdn("api", "shop");
    let name = xcc_proto::names::imported_record_name(&fqdn, "hier").expect("name");
    wait_names(&api, vec![name.clone()]).await;
    let status = wait_for(
        "hier Synced=True with one import",
        || rr_status(&api, NS, "hier"),
        |s| {
            condition(s, "Synced").is_some_and(|c| c.0 == "True")
                && s["importedRecords"] == json!(1)
        },
    )
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
    let uid = uid_of(&api, &name);
    c1.cancel();
    west1.shutdown().await.expect("clean shutdown");
    let deletes = api.writes().get(SR_RES, Verb::Delete);
    let creates = api.writes().get(SR_RES, Verb::Create);
    let (west2, _c2) = west(&pki, &api).await;
    wait_for(
        "the restarted registry imports again",
        || hierarchy_count(&west2),
        |n| *n == 1,
    )
    .await;
    assert_eq!(uid_of(&api, &name), uid, "the record was not re-created");
    assert_eq!(api.writes().get(SR_RES, Verb::Delete) - deletes, 0);
    assert_eq!(api.writes().get(SR_RES, Verb::Create) - creates, 0);
    assert_eq!(sr_names(&api), [name]);
}

/// With the parent unreachable every import is `Unavailable`, `Synced` stays False, and the
/// stored imports are left alone (nothing is deleted while nothing is known).
#[tokio::test]
async fn parent_unreachable_imports_unavailable_and_stored_records_kept() {
    let pki = Pki::new("xcc.test");
    let api = fake().await;
    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let rr = parent_rr(
        closed,
        json!([{"namespace": "shop", "name": "api", "requesterService": "web"}]),
    );
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), NS);
    let rr = rrs
        .create(&PostParams::default(), &rr)
        .await
        .expect("create RR");
    let fqdn = xcc_proto::names::clusterset_fqdn("api", "shop");
    let name = xcc_proto::names::imported_record_name(&fqdn, "hier").expect("name");
    // What an earlier run imported.
    put(
        &api,
        raw_import(
            &name,
            &fqdn,
            "hier",
            rr.metadata.uid.as_deref().expect("uid"),
        ),
    );
    let (_west, _wc) = west(&pki, &api).await;
    let status = wait_for(
        "the import reported unavailable",
        || rr_status(&api, NS, "hier"),
        |s| s["imports"][0]["state"] == json!("Unavailable"),
    )
    .await;
    assert_eq!(
        condition(&status, "Synced").map(|c| (c.0, c.1)),
        Some(("False".to_string(), "Pending".to_string()))
    );
    assert_eq!(sr_names(&api), [name]);
    assert_eq!(api.writes().get(SR_RES, Verb::Delete), 0);
}

// ----- grants at the owner (kube mode) -----

/// The owner runs on the kube store with `--grant-mode istio` below a root; a requester asks
/// the hierarchy for the owner's exported ServiceRecord. The owner applies the
/// AuthorizationPolicy and records the caller in the record's `status.grants`; when the record
/// stops admitting the caller, the grant is revoked: the policy is deleted and the caller
/// dropped from the status.
#[tokio::test]
async fn granted_hierarchy_query_applies_the_grant_object_and_revocation_removes_it() {
    use xcc_registry::federation::Target;
    let pki = Pki::new("xcc.test");
    let (root, _rc) = start(pki.cluster("root")).await;
    let api = fake().await;
    let fqdn = xcc_proto::names::clusterset_fqdn("api", "shop");
    put(
        &api,
        json!({
            "apiVersion": V, "kind": "ServiceRecord",
            "metadata": {"name": "api", "namespace": "shop", "uid": "uid-api", "labels": {EXPORT: ""}},
            "spec": {"fqdn": fqdn, "endpoints": [{"address": "10.2.0.1", "port": 443}],
                     "allowedRequesters": ["west/web"]},
        }),
    );
    let mut ocfg = RegistryConfig::loopback(pki.cluster("owner"));
    ocfg.namespace = NS.into();
    ocfg.store = StoreConfig::Kube(kube_config(&api, false));
    ocfg.federation.grant_mode = xcc_registry::federation::grants::GrantMode::Istio;
    let (_owner, _oc) = start_with(ocfg).await;
    let rrs: Api<RemoteRegistry> = Api::namespaced(api.client(), NS);
    rrs.create(
        &PostParams::default(),
        &parent_rr(root.hamlet_addr, json!([])),
    )
    .await
    .expect("create RR");

    let mut wcfg = RegistryConfig::loopback(pki.cluster("west"));
    wcfg.federation.parent = Some(xcc_registry::federation::link::ParentSpec {
        name: "up".into(),
        address: root.hamlet_addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
    });
    wcfg.federation.imports = vec![(
        Target::Name {
            namespace: "shop".into(),
            name: "api".into(),
        },
        "web".into(),
    )];
    let (west, _wc) = start_with(wcfg).await;

    let ap = xcc_proto::names::policy_object_name("allow-to-", &["shop", "api", "west", "web"]);
    let policy = wait_for(
        "the AuthorizationPolicy at the owner",
        || {
            api.get(
                "security.istio.io/v1",
                "authorizationpolicies",
                Some("shop"),
                &ap,
            )
        },
        Option::is_some,
    )
    .await
    .expect("policy");
    assert_eq!(
        policy["spec"]["rules"][0]["from"][0]["source"]["principals"],
        json!(["cluster.local/ns/west/sa/web"])
    );
    assert_eq!(
        policy["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        json!("xcc-registry")
    );
    let grants = wait_for(
        "status.grants on the exported record",
        || {
            api.get(V, "servicerecords", Some("shop"), "api")
                .map(|o| o["status"]["grants"].clone())
                .unwrap_or(Value::Null)
        },
        |g| g.is_array(),
    )
    .await;
    let callers: Vec<(Value, Value)> = grants
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| (g["callerCluster"].clone(), g["callerService"].clone()))
        .collect();
    assert_eq!(callers, [(json!("west"), json!("web"))]);
    wait_for(
        "the requester imports the service",
        || {
            west.catalog
                .list(&xcc_registry::catalog::ListFilter {
                    source: Some(xcc_registry::catalog::Source::Hierarchy("up".into())),
                    ..Default::default()
                })
                .len()
        },
        |n| *n == 1,
    )
    .await;

    // Revocation: the record no longer admits west.
    let srs: Api<xcc_proto::crd::ServiceRecord> = Api::namespaced(api.client(), "shop");
    srs.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"allowedRequesters": ["c9/x"]}})),
    )
    .await
    .expect("patch record");
    wait_for(
        "the AuthorizationPolicy deleted",
        || {
            api.get(
                "security.istio.io/v1",
                "authorizationpolicies",
                Some("shop"),
                &ap,
            )
        },
        Option::is_none,
    )
    .await;
    wait_for(
        "the caller dropped from status.grants",
        || {
            api.get(V, "servicerecords", Some("shop"), "api")
                .map(|o| o["status"]["grants"].clone())
                .unwrap_or(Value::Null)
        },
        |g| g.as_array().is_none_or(Vec::is_empty),
    )
    .await;
}

// ----- policies from a ConfigMap (kube mode) -----

/// `--policy-configmap`: the registry is ready only after the ConfigMap was read, so the
/// policies are in force by then; a later change is picked up.
#[tokio::test]
async fn policy_configmap_is_read_before_ready_and_followed() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let pki = Pki::new("xcc.test");
    let api = fake().await;
    let cms: Api<ConfigMap> = Api::namespaced(api.client(), NS);
    let cm = |id: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "xcc-policies", "namespace": NS},
            "data": {"p.cedar": format!(
                "@id(\"{id}\")\nforbid (principal, action == Xcc::Action::\"discover\", resource) when {{ resource.name == \"x\" }};"
            )},
        }))
        .expect("configmap")
    };
    cms.create(&PostParams::default(), &cm("first"))
        .await
        .expect("create");
    let (west, _wc) = west_with(&pki, &api, |c| {
        c.federation.policy_configmap = Some("xcc-policies".into());
    })
    .await;
    wait_for("ready", || west.health.is_ready(), |r| *r).await;
    assert_eq!(
        west.level.policies().policy_ids(),
        ["announce-clusterset", "bilateral", "carry-self", "first"]
    );
    cms.replace("xcc-policies", &PostParams::default(), &cm("second"))
        .await
        .expect("replace");
    wait_for(
        "the changed policies",
        || west.level.policies().policy_ids(),
        |ids| ids.iter().any(|i| i == "second"),
    )
    .await;
    assert!(west.policy_errors.get().is_empty());
}
