//! Hierarchical federation over real mTLS on 127.0.0.1: a three-level tree
//! (root; B with B1, B2; C with C1), its end-to-end flow and its failure modes.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use tokio_util::sync::CancellationToken;
use xcc_proto::xcc::federation::v1 as fed;
use xcc_registry::catalog::{ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::link::ParentSpec;
use xcc_registry::federation::{Question, Target};
use xcc_registry::hamlet::client::Backoff;
use xcc_registry::{Registry, RegistryConfig};

const Q: Duration = Duration::from_secs(10);

fn api_target() -> Target {
    Target::Name {
        namespace: "shop".into(),
        name: "api".into(),
    }
}

fn service(cluster: &str, ns: &str, name: &str, ip: &str, allowed: &[&str]) -> ServiceEntry {
    let mut e = export(
        cluster,
        ns,
        &xcc_proto::names::clusterset_fqdn(name, ns),
        ip,
    );
    e.key = ServiceKey::new(cluster, ns, name);
    e.allowed_requesters = allowed.iter().map(|s| s.to_string()).collect();
    e
}

fn parent(addr: SocketAddr) -> ParentSpec {
    ParentSpec {
        name: "parent".into(),
        address: addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
    }
}

async fn node(
    pki: &Pki,
    name: &str,
    up: Option<SocketAddr>,
    listen: Option<SocketAddr>,
) -> (Registry, CancellationToken) {
    let mut cfg = RegistryConfig::loopback(pki.cluster(name));
    if let Some(l) = listen {
        cfg.hamlet_listen = l;
    }
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(200),
    };
    cfg.federation.parent = up.map(parent);
    cfg.federation.policies = tree_policies();
    start_with(cfg).await
}

/// Each parent's configuration of what its children may carry: b carries b1 and b2, c
/// carries c1 (the root's view); every other child carries only itself.
fn tree_policies() -> Vec<(String, String)> {
    [("b", &["b1", "b2"][..]), ("c", &["c1"][..])]
        .into_iter()
        .map(|(child, carried)| {
            (
                format!("carry-{child}.cedar"),
                xcc_registry::authz::carry_policy(child, carried).expect("cluster names"),
            )
        })
        .collect()
}

struct World {
    pki: Pki,
    root: (Registry, CancellationToken),
    b: (Registry, CancellationToken),
    c: (Registry, CancellationToken),
    b1: (Registry, CancellationToken),
    b2: (Registry, CancellationToken),
    c1: (Registry, CancellationToken),
}

async fn world() -> World {
    let pki = Pki::new("xcc.test");
    let root = node(&pki, "root", None, None).await;
    let b = node(&pki, "b", Some(root.0.hamlet_addr), None).await;
    let c = node(&pki, "c", Some(root.0.hamlet_addr), None).await;
    let b1 = node(&pki, "b1", Some(b.0.hamlet_addr), None).await;
    let b2 = node(&pki, "b2", Some(b.0.hamlet_addr), None).await;
    let c1 = node(&pki, "c1", Some(c.0.hamlet_addr), None).await;
    wait_level(&root.0, "whole tree attached", |r| {
        r.level.subtree() == ["b", "b1", "b2", "c", "c1", "root"]
    })
    .await;
    for leaf in [&b1.0, &b2.0, &c1.0] {
        wait_level(leaf, "ancestry known", |r| r.level.ancestors().len() == 2).await;
    }
    World {
        pki,
        root,
        b,
        c,
        b1,
        b2,
        c1,
    }
}

/// The whole flow, step by step: a dependency declared and admitted (1–2), discovered through
/// the tree (3), the answer cached and imported (4), the route notification at the owner (5),
/// the service deleted and everything revoked (6); plus the denied caller.
#[tokio::test]
async fn hierarchy_end_to_end_flow() {
    let w = world().await;
    // 1–2: web in B1 depends on api; api in B2 allows web (from B1).
    w.b2.0
        .catalog
        .upsert(service("b2", "shop", "api", "10.2.0.1", &["b1/web"]));
    wait_level(&w.root.0, "api announced up to the root", |r| {
        r.catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .is_some_and(|e| e.source == Source::Child("b".into()))
    })
    .await;
    assert_eq!(
        w.b.0
            .catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .map(|e| e.source.clone()),
        Some(Source::Child("b2".into()))
    );

    // 3: web discovers api through its parent; B (the lowest level holding it) resolves.
    let answer = w.b1.0.level.query(api_target(), "web", false, Q).await;
    assert!(answer.found && answer.access_allowed, "{answer:?}");
    assert_eq!(
        (
            answer.owner_cluster.as_str(),
            answer.resolver_cluster.as_str()
        ),
        ("b2", "b")
    );
    assert_eq!(answer.endpoints, vec!["10.2.0.1:443"]);
    assert_eq!(answer.policies, vec!["bilateral"]);

    // 4: the caller side holds the answer (cached) — and imports become catalog entries.
    assert!(w.b1.0.level.cached(&api_target(), "web").is_some());
    w.b1.0
        .set_parent(Some((
            parent(w.b.0.hamlet_addr),
            vec![Question::new(api_target(), "web")],
        )))
        .await;
    wait_level(&w.b1.0, "import materialised", |r| {
        r.catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .is_some_and(|e| e.source == Source::Hierarchy("parent".into()))
    })
    .await;

    // 5: the route notification reached the owner.
    wait_level(&w.b2.0, "route recorded at the owner", |r| {
        r.level.owner_routes().iter().any(|x| {
            x.caller_cluster == "b1" && x.caller_service == "web" && x.resolver_cluster == "b"
        })
    })
    .await;
    wait_level(&w.b.0, "route acknowledged hop by hop", |r| {
        r.level
            .children()
            .iter()
            .all(|(_, _, _, _, queued)| *queued == 0)
    })
    .await;

    // A denied caller is told why (resolved at the root for C1).
    let denied = w.c1.0.level.query(api_target(), "batch", false, Q).await;
    assert!(denied.found && !denied.access_allowed);
    assert_eq!(denied.resolver_cluster, "root");
    assert_eq!(
        denied.deny_reason,
        fed::DenyReason::NotAllowedByCallee as i32
    );
    assert_eq!(
        denied.error,
        "b2/shop/api allows [b1/web]; c1/batch is not among them"
    );
    assert!(
        denied.endpoints.is_empty(),
        "no endpoints for a denied caller"
    );

    // 6: delete api → B1's cache cleared and import removed, B2's route revoked.
    w.b2.0.catalog.remove(&ServiceKey::new("b2", "shop", "api"));
    wait_level(&w.b1.0, "import revoked", |r| {
        r.catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .is_none()
            && r.level.cached(&api_target(), "web").is_none()
    })
    .await;
    wait_level(&w.b2.0, "route revoked at the owner", |r| {
        r.level.owner_routes().is_empty()
    })
    .await;
    drop(w.pki);
}

/// Not found anywhere: "not found in hierarchy", never cached as final.
#[tokio::test]
async fn not_found_in_hierarchy_is_not_cached() {
    let w = world().await;
    let t = Target::Fqdn("nothing.ops.svc.clusterset.local".into());
    let a = w.c1.0.level.query(t.clone(), "", false, Q).await;
    assert!(!a.found && !a.unavailable);
    assert_eq!(
        (a.error.as_str(), a.resolver_cluster.as_str()),
        ("service not found in hierarchy", "root")
    );
    assert!(w.c1.0.level.cached(&t, "").is_none());
    // Once it exists, the next query finds it.
    w.b1.0
        .catalog
        .upsert(service("b1", "ops", "nothing", "10.1.0.9", &[]));
    wait_level(&w.root.0, "announced", |r| {
        !r.catalog
            .by_fqdn("nothing.ops.svc.clusterset.local")
            .is_empty()
    })
    .await;
    let a = w.c1.0.level.query(t, "", false, Q).await;
    assert!(a.found && a.access_allowed, "{a:?}");
}

/// The callee drops the caller: the grant is revoked and pushed to the requester.
#[tokio::test]
async fn grant_revoked_when_callee_drops_caller() {
    let w = world().await;
    w.b2.0
        .catalog
        .upsert(service("b2", "shop", "api", "10.2.0.1", &["b1/web"]));
    wait_level(&w.b.0, "announced", |r| {
        r.catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .is_some()
    })
    .await;
    w.b1.0
        .set_parent(Some((
            parent(w.b.0.hamlet_addr),
            vec![Question::new(api_target(), "web")],
        )))
        .await;
    wait_level(&w.b1.0, "granted", |r| {
        r.level.cached(&api_target(), "web").is_some()
    })
    .await;
    // Endpoint changes are pushed to the holder of the answer.
    w.b2.0
        .catalog
        .upsert(service("b2", "shop", "api", "10.2.0.2", &["b1/web"]));
    wait_level(&w.b1.0, "new endpoint pushed", |r| {
        r.level
            .cached(&api_target(), "web")
            .is_some_and(|a| a.endpoints == ["10.2.0.2:443"])
    })
    .await;
    w.b2.0
        .catalog
        .upsert(service("b2", "shop", "api", "10.2.0.2", &["c1/batch"]));
    wait_level(&w.b1.0, "revoked", |r| {
        r.level.cached(&api_target(), "web").is_none()
            && r.catalog
                .get(&ServiceKey::new("b2", "shop", "api"))
                .is_none()
    })
    .await;
    wait_level(&w.b2.0, "route removed", |r| {
        r.level.owner_routes().is_empty()
    })
    .await;
    let tree = w.b1.0.level.subscriptions();
    let (_, _, answer) = &tree[0];
    let answer = answer.as_ref().expect("answer held");
    assert!(answer.revoked && !answer.access_allowed);
    assert_eq!(
        answer.deny_reason,
        fed::DenyReason::NotAllowedByCallee as i32
    );
}

/// `shop/db` of b2 as a headless export (MCS): its pods' addresses as endpoints, the marker and
/// their hostnames, its origin, and two annotations no importer keeps.
fn headless_db(pods: &[(&str, &str)], allowed: &[&str]) -> ServiceEntry {
    let mut e = service("b2", "shop", "db", pods[0].0, allowed);
    e.endpoints = pods
        .iter()
        .map(|(ip, _)| xcc_registry::catalog::Endpoint {
            address: (*ip).into(),
            port: 15432,
        })
        .collect();
    let hostnames: Vec<String> = pods.iter().map(|(ip, h)| format!("{ip}={h}")).collect();
    let mut labels = kept_labels(&hostnames.join(","));
    labels.insert(
        xcc_proto::names::WORKLOAD_SELECTOR_ANNOTATION.into(),
        "app=db".into(),
    );
    labels.insert(
        "connectivity.tanzu.vmware.com/team".into(),
        "storage".into(),
    );
    e.labels = labels.into();
    e
}

/// The labels an importer keeps of [`headless_db`] with `hostnames`.
fn kept_labels(hostnames: &str) -> std::collections::BTreeMap<String, String> {
    [
        (xcc_proto::mcs::HEADLESS_ANNOTATION, "true"),
        (xcc_proto::mcs::HOSTNAMES_ANNOTATION, hostnames),
        (xcc_proto::names::SERVICE_PORT_ANNOTATION, "443"),
        (xcc_proto::mapping::ORIGIN_NAMESPACE_ANNOTATION, "shop"),
        (xcc_proto::mapping::ORIGIN_NAME_ANNOTATION, "db"),
        // A policy label travels too; the workload selector does not.
        ("connectivity.tanzu.vmware.com/team", "storage"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// [`kept_labels`] and the propagation stamp the exporting level (`origin`) set: the stamp travels
/// up and down the tree unchanged.
fn stamped(
    origin: &xcc_registry::Catalog,
    key: &ServiceKey,
    hostnames: &str,
) -> std::collections::BTreeMap<String, String> {
    let stamp = xcc_proto::propagation::CHANGED_AT_ANNOTATION;
    let mut labels = kept_labels(hostnames);
    let entry = origin.get(key).expect("exported");
    labels.insert(
        stamp.to_string(),
        entry.labels.get(stamp).expect("stamped").to_string(),
    );
    labels
}

/// A headless export reached through a hierarchy grant keeps its marker and its pods'
/// hostnames. b2's export is announced up (each level keeps only the allow-listed annotations),
/// c1 imports it as web through c and the root (the resolver) — an intermediate level that only
/// routes the answer — and an endpoint and hostname change is pushed down the same way. A
/// denied requester learns none of it, and a child that lies in its announcement has its
/// labels filtered like a Hamlet peer's.
#[tokio::test]
async fn a_headless_export_keeps_its_marker_and_hostnames_through_a_grant() {
    let w = world().await;
    let db = ServiceKey::new("b2", "shop", "db");
    let db_target = Target::Name {
        namespace: "shop".into(),
        name: "db".into(),
    };
    w.b2.0.catalog.upsert(headless_db(
        &[("10.4.0.1", "db-0"), ("10.4.0.2", "db-1")],
        &["c1/web"],
    ));
    wait_level(&w.root.0, "db announced up to the root", |r| {
        r.catalog.get(&db).is_some()
    })
    .await;
    // What the levels above hold: the allow-listed annotations only.
    for level in [&w.b.0, &w.root.0] {
        assert_eq!(
            level.catalog.get(&db).expect("held").labels,
            stamped(&w.b2.0.catalog, &db, "10.4.0.1=db-0,10.4.0.2=db-1"),
            "at {}",
            level.cluster
        );
    }

    w.c1.0
        .set_parent(Some((
            parent(w.c.0.hamlet_addr),
            vec![Question::new(db_target.clone(), "web")],
        )))
        .await;
    wait_level(&w.c1.0, "db imported through the hierarchy", |r| {
        r.catalog
            .get(&db)
            .is_some_and(|e| e.source == Source::Hierarchy("parent".into()))
    })
    .await;
    let imported = w.c1.0.catalog.get(&db).expect("imported");
    assert_eq!(
        imported.labels,
        stamped(&w.b2.0.catalog, &db, "10.4.0.1=db-0,10.4.0.2=db-1")
    );
    assert_eq!(
        imported
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect::<Vec<_>>(),
        ["10.4.0.1", "10.4.0.2"]
    );
    assert_eq!(
        imported.origin.as_ref().map(|o| o.cluster.as_str()),
        Some("b2")
    );
    let answer = w.c1.0.level.cached(&db_target, "web").expect("cached");
    assert_eq!(answer.resolver_cluster, "root");
    assert_eq!(
        answer.labels,
        stamped(&w.b2.0.catalog, &db, "10.4.0.1=db-0,10.4.0.2=db-1")
    );

    // A pod replaced: its address and hostname change, pushed to the holder of the answer.
    w.b2.0.catalog.upsert(headless_db(
        &[("10.4.0.2", "db-1"), ("10.4.0.3", "db-2")],
        &["c1/web"],
    ));
    wait_level(&w.c1.0, "the change pushed into the import", |r| {
        r.catalog.get(&db).is_some_and(|e| {
            e.labels == stamped(&w.b2.0.catalog, &db, "10.4.0.2=db-1,10.4.0.3=db-2")
        })
    })
    .await;
    assert_eq!(
        w.c1.0
            .catalog
            .get(&db)
            .expect("imported")
            .endpoints
            .iter()
            .map(|e| e.address.to_string())
            .collect::<Vec<_>>(),
        ["10.4.0.2", "10.4.0.3"]
    );

    // A requester db does not admit learns that it exists and why it is denied, nothing more.
    let denied = w.b1.0.level.query(db_target.clone(), "web", false, Q).await;
    assert!(denied.found && !denied.access_allowed, "{denied:?}");
    assert_eq!(
        (
            denied.labels.len(),
            denied.endpoints.len(),
            denied.ports.len()
        ),
        (0, 0, 0)
    );

    // A hostile child: hostnames of addresses it does not announce, a marker that is not
    // `true` on another service, and annotations of its own.
    let rogue = RawChild::connect(
        &w.pki,
        "rogue",
        w.root.0.hamlet_addr,
        membership(&["rogue"]),
    )
    .await;
    for (name, marker) in [("cache", "true"), ("queue", "yes")] {
        rogue
            .send(fed::ChildMessage {
                payload: Some(fed::child_message::Payload::ServiceAnnouncement(
                    fed::ServiceAnnouncement {
                        cluster: "rogue".into(),
                        namespace: "ops".into(),
                        name: name.into(),
                        endpoints: vec!["10.6.0.1:6379".into()],
                        labels: [
                            (xcc_proto::mcs::HEADLESS_ANNOTATION, marker),
                            (
                                xcc_proto::mcs::HOSTNAMES_ANNOTATION,
                                "10.6.0.1=cache-0,10.4.0.2=db-1",
                            ),
                            ("kubernetes.io/service-name", "kube-dns"),
                            ("connectivity.tanzu.vmware.com/vip", "not-an-ip"),
                        ]
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                        ..Default::default()
                    },
                )),
            })
            .await;
    }
    let (cache, queue) = (
        ServiceKey::new("rogue", "ops", "cache"),
        ServiceKey::new("rogue", "ops", "queue"),
    );
    wait_level(&w.root.0, "the rogue's services stored", |r| {
        r.catalog.get(&cache).is_some() && r.catalog.get(&queue).is_some()
    })
    .await;
    let label_pairs = |key: &ServiceKey| -> Vec<(String, String)> {
        w.root
            .0
            .catalog
            .get(key)
            .expect("held")
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        label_pairs(&cache),
        [
            (
                xcc_proto::mcs::HEADLESS_ANNOTATION.to_string(),
                "true".to_string()
            ),
            (
                xcc_proto::mcs::HOSTNAMES_ANNOTATION.to_string(),
                "10.6.0.1=cache-0".to_string()
            ),
        ]
    );
    assert_eq!(label_pairs(&queue), []);
}

/// Parent disconnected: cached answers keep serving, new queries answer "unavailable".
/// Parent restart: children resynchronise; nothing is lost.
#[tokio::test]
async fn parent_down_serves_cache_and_parent_restart_resyncs() {
    let pki = Pki::new("xcc.test");
    let root = node(&pki, "root", None, None).await;
    let root_addr = root.0.hamlet_addr;
    let b = node(&pki, "b", Some(root_addr), None).await;
    let c = node(&pki, "c", Some(root_addr), None).await;
    c.0.catalog
        .upsert(service("c", "db", "pg", "10.3.0.1", &[]));
    wait_level(&root.0, "c's service at root", |r| {
        r.catalog.get(&ServiceKey::new("c", "db", "pg")).is_some()
    })
    .await;
    let pg = Target::Name {
        namespace: "db".into(),
        name: "pg".into(),
    };
    let a = b.0.level.query(pg.clone(), "", false, Q).await;
    assert!(a.access_allowed, "{a:?}");

    root.1.cancel();
    root.0.shutdown().await.expect("root stops");
    wait_level(&b.0, "parent link down", |r| !r.level.parent_is_connected()).await;
    assert!(
        b.0.level.cached(&pg, "").is_some(),
        "cached answer still served"
    );
    let other = Target::Name {
        namespace: "db".into(),
        name: "redis".into(),
    };
    let a = b.0.level.query(other, "", false, Q).await;
    assert!(a.unavailable, "{a:?}");
    assert_eq!(a.error, "parent parent is unavailable; try again later");

    let root2 = node(&pki, "root", None, Some(root_addr)).await;
    wait_level(&root2.0, "children back with their subtrees", |r| {
        r.level.subtree() == ["b", "c", "root"]
            && r.catalog.get(&ServiceKey::new("c", "db", "pg")).is_some()
    })
    .await;
    let a =
        b.0.level
            .query(
                Target::Name {
                    namespace: "db".into(),
                    name: "pg".into(),
                },
                "x",
                false,
                Q,
            )
            .await;
    assert!(a.access_allowed, "{a:?}");
    drop(c);
}

/// Child restart: the parent drops the child's subtree, then restores it.
#[tokio::test]
async fn child_restart_drops_and_restores_its_subtree() {
    let w = world().await;
    w.b2.0
        .catalog
        .upsert(service("b2", "shop", "api", "10.2.0.1", &[]));
    wait_level(&w.root.0, "announced", |r| {
        r.catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .is_some()
    })
    .await;
    let b2_files = w.pki.cluster("b2");
    w.b2.1.cancel();
    w.b2.0.shutdown().await.expect("b2 stops");
    wait_level(&w.root.0, "b2's subtree dropped", |r| {
        r.catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .is_none()
            && !r.level.subtree().contains(&"b2".to_string())
    })
    .await;
    let mut cfg = RegistryConfig::loopback(b2_files);
    cfg.federation.parent = Some(parent(w.b.0.hamlet_addr));
    let (b2, _c) = start_with(cfg).await;
    b2.catalog
        .upsert(service("b2", "shop", "api", "10.2.0.1", &[]));
    wait_level(&w.root.0, "restored", |r| {
        r.catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .is_some()
    })
    .await;
}

/// A hand-driven child session: what it sends, and the parent's messages as they come.
struct RawChild {
    tx: tokio::sync::mpsc::Sender<fed::ChildMessage>,
    rx: tonic::Streaming<fed::ParentMessage>,
}

impl RawChild {
    async fn connect(pki: &Pki, name: &str, addr: SocketAddr, first: fed::ChildMessage) -> Self {
        let tls = xcc_certs::reload::ReloadingTls::load(pki.cluster(name)).expect("tls");
        let ch = channel(&tls, addr).await.expect("channel");
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tx.send(first).await.expect("queue");
        let mut client = fed::federation_client::FederationClient::new(ch);
        let rx = client
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("session opens")
            .into_inner();
        Self { tx, rx }
    }

    async fn send(&self, m: fed::ChildMessage) {
        self.tx.send(m).await.expect("send");
    }

    /// The next rejection from the parent (other messages are skipped).
    async fn rejection(&mut self) -> fed::Rejection {
        loop {
            let m = tokio::time::timeout(WAIT, self.rx.message())
                .await
                .expect("in time")
                .expect("stream open")
                .expect("not closed");
            if let Some(fed::parent_message::Payload::Rejection(r)) = m.payload {
                return r;
            }
        }
    }
}

fn membership(clusters: &[&str]) -> fed::ChildMessage {
    fed::ChildMessage {
        payload: Some(fed::child_message::Payload::Subtree(
            fed::SubtreeMembership {
                clusters: clusters.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        )),
    }
}

/// A spoofed announcement (a cluster outside the sender's subtree) is refused on its own, and
/// a child's claim on a cluster its parent did not configure it to carry (another child's, or
/// an ancestor: a cycle) is refused with a rejection naming it; the tree is unchanged.
#[tokio::test]
async fn spoofing_and_double_claims_are_rejected() {
    let w = world().await;
    let spoof = fed::ChildMessage {
        payload: Some(fed::child_message::Payload::ServiceAnnouncement(
            fed::ServiceAnnouncement {
                cluster: "b2".into(),
                namespace: "shop".into(),
                name: "api".into(),
                endpoints: vec!["6.6.6.6:443".into()],
                ..Default::default()
            },
        )),
    };
    let mut rogue = RawChild::connect(
        &w.pki,
        "rogue",
        w.root.0.hamlet_addr,
        membership(&["rogue"]),
    )
    .await;
    rogue.send(spoof).await;
    let r = rogue.rejection().await;
    assert_eq!(
        (
            r.kind.as_str(),
            r.cluster.as_str(),
            r.code,
            r.reason.as_str()
        ),
        (
            "announcement",
            "b2",
            tonic::Code::PermissionDenied as i32,
            "cluster \"b2\" is not in the subtree of child \"rogue\""
        )
    );
    assert!(
        w.root
            .0
            .catalog
            .get(&ServiceKey::new("b2", "shop", "api"))
            .is_none()
    );

    let mut rogue2 = RawChild::connect(
        &w.pki,
        "rogue2",
        w.root.0.hamlet_addr,
        membership(&["rogue2", "b1"]),
    )
    .await;
    let r = rogue2.rejection().await;
    assert_eq!(
        (r.kind.as_str(), r.cluster.as_str(), r.reason.as_str()),
        (
            "subtree",
            "b1",
            "rogue2 may not carry \"b1\": no Cedar carry permit at root"
        )
    );
    let mut cycle = RawChild::connect(
        &w.pki,
        "loop",
        w.b.0.hamlet_addr,
        membership(&["loop", "root"]),
    )
    .await;
    let r = cycle.rejection().await;
    assert_eq!((r.cluster.as_str(), r.refused_by.as_str()), ("root", "b"));
    // The tree is unchanged but for the two children, each holding only itself.
    wait_level(&w.root.0, "rogues attached as themselves", |r| {
        r.level.subtree() == ["b", "b1", "b2", "c", "c1", "rogue", "rogue2", "root"]
    })
    .await;
    wait_level(&w.b.0, "loop attached as itself", |r| {
        r.level.subtree() == ["b", "b1", "b2", "loop"]
    })
    .await;
    drop((w.c, w.c1));
}

/// A policy file with a syntax error keeps the previous policies; zone limits on announce.
#[tokio::test]
async fn policy_reload_keeps_last_good_and_limits_zones() {
    let pki = Pki::new("xcc.test");
    let dir = tempfile::tempdir().expect("tempdir");
    let forbid = r#"@id("no-c1") forbid (principal in Xcc::Cluster::"c1", action == Xcc::Action::"discover", resource);"#;
    std::fs::write(dir.path().join("10-forbid.cedar"), forbid).expect("write");
    let mut cfg = RegistryConfig::loopback(pki.cluster("root"));
    cfg.federation.policy_dir = Some(dir.path().to_path_buf());
    let root = start_with(cfg).await;
    let b = node(&pki, "b", Some(root.0.hamlet_addr), None).await;
    let c1 = node(&pki, "c1", Some(root.0.hamlet_addr), None).await;
    // Announcing a name outside clusterset.local needs a zone grant: refused by default.
    let mut web = service("c1", "shop", "web", "10.4.0.1", &[]);
    web.fqdn = "web.bank.example".into();
    c1.0.catalog.upsert(web);
    b.0.catalog
        .upsert(service("b", "shop", "cart", "10.4.0.2", &[]));
    wait_level(&root.0, "clusterset name accepted", |r| {
        r.catalog
            .get(&ServiceKey::new("b", "shop", "cart"))
            .is_some()
    })
    .await;
    assert!(
        root.0
            .catalog
            .get(&ServiceKey::new("c1", "shop", "web"))
            .is_none(),
        "zone not granted"
    );

    let cart = Target::Name {
        namespace: "shop".into(),
        name: "cart".into(),
    };
    let a = c1.0.level.query(cart.clone(), "", false, Q).await;
    assert!(a.found && !a.access_allowed, "{a:?}");
    assert_eq!(a.resolver_cluster, "root");
    assert_eq!(a.deny_reason, fed::DenyReason::PolicyDenied as i32);
    assert_eq!(a.policies, vec!["no-c1"]);

    let mut errs = root.0.policy_errors.subscribe();
    std::fs::write(dir.path().join("20-broken.cedar"), "permit(principal,").expect("write");
    tokio::time::timeout(WAIT, async {
        while errs.borrow_and_update().is_empty() {
            errs.changed().await.expect("alive");
        }
    })
    .await
    .expect("rejection reported");
    assert!(
        root.0.policy_errors.get()[0].starts_with("20-broken.cedar: "),
        "{:?}",
        root.0.policy_errors.get()
    );
    let a = c1.0.level.query(cart, "", false, Q).await;
    assert_eq!(
        a.policies,
        vec!["no-c1"],
        "previous policies still in force"
    );
}

/// A child whose subtree is far larger than any queue on the way (8,192 messages) attaches:
/// its snapshot streams at the parent's pace, and the parent ends with every service. Nothing
/// overflowed on either side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_with_50000_services_attaches() {
    const N: usize = 50_000;
    let pki = Pki::new("xcc.test");
    let root = node(&pki, "root", None, None).await;
    let big = node(&pki, "big", Some(root.0.hamlet_addr), None).await;
    let services: Vec<ServiceEntry> = (0..N)
        .map(|i| service("big", "shop", &format!("svc-{i:05}"), "10.0.0.1", &[]))
        .collect();
    big.0.catalog.replace_source(&Source::Local, services);
    // Longer than the common bound: 50,000 announcements, each checked by Cedar, in a debug
    // build on a shared machine.
    let mut changes = root.0.catalog.subscribe();
    tokio::time::timeout(Duration::from_secs(300), async {
        while root.0.catalog.len() < N {
            let _ = changes.recv().await;
        }
    })
    .await
    .expect("the root holds all 50,000 services");
    let keys = |c: &xcc_registry::Catalog| -> Vec<ServiceKey> {
        c.list(&Default::default())
            .iter()
            .map(|e| e.key.clone())
            .collect()
    };
    assert_eq!(keys(&root.0.catalog), keys(&big.0.catalog));
    assert_eq!(root.0.level.overflows().get(), 0);
    assert_eq!(big.0.level.overflows().get(), 0);
    root.1.cancel();
    big.1.cancel();
}

/// A registry below `up` (none: a root) with the Cedar `policies` given in code and those of
/// `policy_dir` (watched).
async fn node_with(
    pki: &Pki,
    name: &str,
    up: Option<SocketAddr>,
    policies: Vec<(String, String)>,
    policy_dir: Option<&std::path::Path>,
) -> (Registry, CancellationToken) {
    let mut cfg = RegistryConfig::loopback(pki.cluster(name));
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(200),
    };
    cfg.federation.parent = up.map(parent);
    cfg.federation.policies = policies;
    cfg.federation.policy_dir = policy_dir.map(std::path::Path::to_path_buf);
    start_with(cfg).await
}

/// A refusal at the root of what a grandchild sent reaches that grandchild (leaf →
/// mid → root over mTLS), which stores it (what `xcc admin` and the kube store show) with the
/// failed check and the Cedar policy id: an announcement the root's policy forbids, and a
/// question asked on behalf of a cluster the root does not let `mid` carry. When the root's
/// policy no longer forbids it, the refusal goes at the leaf too.
#[tokio::test]
async fn a_refusal_at_the_root_reaches_the_grandchild_that_sent_it() {
    let pki = Pki::new("xcc.test");
    let policies = tempfile::tempdir().expect("tempdir");
    let forbid = policies.path().join("no-secret.cedar");
    std::fs::write(
        &forbid,
        r#"@id("no-secret")
forbid (principal, action == Xcc::Action::"announce", resource) when { resource.name == "secret" };"#,
    )
    .expect("policy");
    // The root lets mid carry leaf, not leaf2.
    let carry = vec![(
        "carry-mid.cedar".to_string(),
        xcc_registry::authz::carry_policy("mid", &["leaf"]).expect("names"),
    )];
    let root = node_with(&pki, "root", None, carry, Some(policies.path())).await;
    let mid = node_with(&pki, "mid", Some(root.0.hamlet_addr), vec![], None).await;
    let leaf = node_with(&pki, "leaf", Some(mid.0.hamlet_addr), vec![], None).await;
    let leaf2 = node_with(&pki, "leaf2", Some(mid.0.hamlet_addr), vec![], None).await;
    wait_level(&root.0, "mid carries leaf", |r| {
        r.level.subtree() == ["leaf", "mid", "root"]
    })
    .await;
    wait_level(&mid.0, "both leaves attached", |r| {
        r.level.subtree() == ["leaf", "leaf2", "mid"]
    })
    .await;

    for name in ["api", "secret"] {
        leaf.0
            .catalog
            .upsert(service("leaf", "shop", name, "10.3.0.1", &[]));
    }
    wait_level(&leaf.0, "the root's refusal reached the leaf", |r| {
        r.level.refusal_of("shop", "secret").is_some()
    })
    .await;
    wait_level(&root.0, "api accepted at the root", |r| {
        r.catalog
            .get(&ServiceKey::new("leaf", "shop", "api"))
            .is_some()
    })
    .await;
    let refused: Vec<fed::Rejection> = leaf
        .0
        .level
        .rejections()
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    let fqdn = xcc_proto::names::clusterset_fqdn("secret", "shop");
    assert_eq!(
        refused,
        [fed::Rejection {
            kind: "announcement".into(),
            cluster: "leaf".into(),
            namespace: "shop".into(),
            name: "secret".into(),
            fqdn: fqdn.clone(),
            code: tonic::Code::PermissionDenied as i32,
            reason: format!("leaf may not announce {fqdn}: forbidden by no-secret"),
            refused_by: "root".into(),
            check: "announce".into(),
            policy_ids: vec!["no-secret".into()],
        }]
    );
    // mid, whose subtree it is, holds it too; leaf2 got nothing of it.
    assert!(
        mid.0
            .level
            .rejections()
            .iter()
            .any(|(_, r)| r == &refused[0]),
        "{:?}",
        mid.0.level.rejections()
    );

    // leaf2 asks for something outside mid's subtree: mid sends the question up, and the root
    // refuses it (mid may not speak for leaf2).
    let asking = leaf2.0.level.clone();
    let question = tokio::spawn(async move {
        asking
            .query(
                Target::Name {
                    namespace: "ops".into(),
                    name: "db".into(),
                },
                "batch",
                false,
                Duration::from_secs(60),
            )
            .await
    });
    wait_level(
        &leaf2.0,
        "the root's refusal of the question reached leaf2",
        |r| !r.level.rejections().is_empty(),
    )
    .await;
    question.abort();
    let refused: Vec<(String, String, String, String, String)> = leaf2
        .0
        .level
        .rejections()
        .into_iter()
        .map(|(_, r)| {
            (
                r.kind,
                r.cluster,
                format!("{}/{}", r.namespace, r.name),
                r.check,
                r.refused_by,
            )
        })
        .collect();
    assert_eq!(
        refused,
        [(
            "query".to_string(),
            "leaf2".to_string(),
            "ops/db".to_string(),
            "subtree".to_string(),
            "root".to_string()
        )]
    );

    // The root's policy goes: the root asks mid to resend, lifts the refusal, mid asks leaf to
    // resend, and the leaf's copy goes when mid confirms its snapshot.
    std::fs::remove_file(&forbid).expect("rm policy");
    wait_level(&root.0, "secret accepted at the root", |r| {
        r.catalog
            .get(&ServiceKey::new("leaf", "shop", "secret"))
            .is_some()
    })
    .await;
    wait_level(&leaf.0, "the refusal lifted at the leaf", |r| {
        r.level.refusal_of("shop", "secret").is_none() && r.level.refusals_confirmed()
    })
    .await;
    drop((root, mid, leaf, leaf2, policies));
}

/// A child whose CA did not issue its parent's certificate says so at WARN, once for its
/// retries, with the parent's name and address; the parent's log says its certificate was
/// refused; `peers` shows the sentence.
#[tokio::test]
async fn a_parent_from_another_ca_is_explained_once() {
    let logs = Captured::default();
    let _guard = logs.start();
    let (ours, theirs) = (Pki::new("xcc.test"), Pki::new("other.test"));
    let (root, _rc) = node(&theirs, "root", None, None).await;
    let (leaf, _lc) = node(&ours, "leaf", Some(root.hamlet_addr), None).await;
    wait_peer(&leaf, "parent", "three failed attempts", |p| {
        p.reconnects.load(std::sync::atomic::Ordering::Relaxed) >= 3
    })
    .await;
    let refused = format!(
        "refused server 127.0.0.1:{} (verified as localhost): its certificate is not issued by a CA we trust (unknown CA",
        root.hamlet_addr.port()
    );
    let peer = leaf
        .peers
        .list()
        .into_iter()
        .find(|p| p.name == "parent")
        .expect("peer");
    assert!(
        peer.last_error().starts_with(&refused),
        "{}",
        peer.last_error()
    );
    let warned = logs.warnings(&format!("parent link down: {refused}"));
    assert_eq!(warned.len(), 1, "one line for the retries: {warned:?}");
    assert!(warned[0].contains("parent=\"parent\""), "{warned:?}");
    let root_side = logs.warnings("refused our certificate: it does not trust the CA");
    assert_eq!(root_side.len(), 1, "{root_side:?}");
}
