//! Level behaviour without a network: child sessions are plain channels.

use std::sync::{Arc, RwLock};

use tokio_util::sync::CancellationToken;
use xcc_proto::xcc::federation::v1 as fed;

use super::*;
use crate::authz::Policies;
use crate::catalog::ServiceEntry;
use crate::federation::convert::entry_from_announcement;
use crate::federation::grants::WorkloadIdentity;
use crate::federation::queues::{Down, DownLink, DownQueue, UpQueue, Uplink};

/// A child-session queue with the default budget.
fn session_channel() -> (DownLink, DownQueue) {
    DownLink::new(QueueLimits::FEDERATION)
}

/// A level whose policies let `b` carry `b1` and `b2` (the parent's configuration of its
/// children); nobody else carries anything but itself.
fn level(name: &str) -> Level {
    let carry = crate::authz::carry_policy("b", &["b1", "b2"]).expect("names");
    let policies = Policies::from_sources(&[("carry.cedar".into(), carry)]).expect("valid");
    Level::new(
        name,
        None,
        Catalog::new(),
        crate::authz::Gate::new("xcc.test", Arc::new(RwLock::new(Arc::new(policies)))),
    )
}

/// Every message queued on a child's session so far.
fn drain(rx: &mut DownQueue) -> Vec<fed::parent_message::Payload> {
    let mut out = vec![];
    while let Ok(Ok(fed::ParentMessage { payload: Some(p) })) = rx.try_recv() {
        out.push(p);
    }
    out
}

fn rejections(rx: &mut DownQueue) -> Vec<fed::Rejection> {
    drain(rx)
        .into_iter()
        .filter_map(|p| match p {
            fed::parent_message::Payload::Rejection(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// The status a closed session's stream ends with.
fn closing_status(link: &DownLink, rx: DownQueue) -> tonic::Status {
    let items: Vec<Down> =
        futures::executor::block_on(futures::StreamExt::collect(link.stream(rx)));
    items
        .last()
        .expect("an item")
        .as_ref()
        .expect_err("a status")
        .clone()
}

fn membership(c: &[&str]) -> fed::SubtreeMembership {
    fed::SubtreeMembership {
        clusters: c.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn api_announcement() -> fed::ServiceAnnouncement {
    fed::ServiceAnnouncement {
        cluster: "b2".into(),
        namespace: "shop".into(),
        name: "api".into(),
        endpoints: vec!["10.2.0.1:443".into()],
        ..Default::default()
    }
}

fn next_route(rx: &mut DownQueue) -> fed::RouteNotification {
    loop {
        match rx.try_recv() {
            Ok(Ok(fed::ParentMessage {
                payload: Some(fed::parent_message::Payload::RouteNotification(n)),
            })) => return n,
            Ok(_) => continue,
            Err(e) => panic!("no route notification queued: {e:?}"),
        }
    }
}

#[test]
fn route_notifications_wait_for_an_absent_child_and_are_acked_hop_by_hop() {
    let b = level("b");
    let (tx, mut rx) = session_channel();
    let session = b
        .attach_child("b2", "127.0.0.1:1".into(), &membership(&["b2"]), tx)
        .expect("attach");
    b.child_announcement("b2", &api_announcement())
        .expect("own subtree");
    // A query from b itself for shop/api: resolved here, granted, route sent down to b2.
    b.handle_query(fed::ServiceQuery {
        namespace: "shop".into(),
        name: "api".into(),
        requester_cluster: "b".into(),
        requester_service: "web".into(),
        correlation_id: 7,
        requester_trust_domain: "cluster.local".into(),
        requester_namespace: "storefront".into(),
        requester_service_account: "web-sa".into(),
        ..Default::default()
    });
    let n = next_route(&mut rx);
    assert_eq!(
        (
            n.route_id,
            n.target_cluster.as_str(),
            n.caller_cluster.as_str(),
            n.caller_service.as_str()
        ),
        (1, "b2", "b", "web")
    );
    // The caller's workload identity travels with the grant to the owner.
    assert_eq!(
        (
            n.caller_trust_domain.as_str(),
            n.caller_namespace.as_str(),
            n.caller_service_account.as_str()
        ),
        ("cluster.local", "storefront", "web-sa")
    );
    assert_eq!(b.children()[0].4, 1, "queued until acknowledged");

    // b2 goes away before acknowledging; on its return the notification is delivered again.
    b.detach_child("b2", session);
    assert!(b.children().is_empty());
    let (tx2, mut rx2) = session_channel();
    b.attach_child("b2", "127.0.0.1:2".into(), &membership(&["b2"]), tx2)
        .expect("reattach");
    let again = next_route(&mut rx2);
    assert_eq!((again.route_id, again.target_service.as_str()), (1, "api"));
    b.child_route_ack(
        "b2",
        &fed::RouteAck {
            route_id: 1,
            applied: true,
            error: String::new(),
        },
    );
    assert_eq!(b.children()[0].4, 0);
}

#[test]
fn a_duplicate_session_and_a_spoofed_requester_are_refused() {
    let root = level("root");
    let (tx, _rx) = session_channel();
    root.attach_child("b", "a".into(), &membership(&["b", "b1"]), tx.clone())
        .expect("attach");
    assert_eq!(
        root.attach_child("b", "a".into(), &membership(&["b"]), tx),
        Err(ChildError::Duplicate("b".into()))
    );
    assert!(root.check_claim("b", "b1").is_ok());
    assert!(root.check_claim("b", "c1").is_err());
}

#[test]
fn the_owner_records_a_route_once_and_drops_it_on_revoke() {
    let b2 = level("b2");
    b2.catalog().upsert(local_api(&["b1/web"]));
    let n = fed::RouteNotification {
        target_namespace: "shop".into(),
        target_service: "api".into(),
        caller_cluster: "b1".into(),
        caller_service: "web".into(),
        revoked: false,
        route_id: 3,
        target_cluster: "b2".into(),
        resolver_cluster: "b".into(),
        ..Default::default()
    };
    let msg = |n: fed::RouteNotification| fed::ParentMessage {
        payload: Some(fed::parent_message::Payload::RouteNotification(n)),
    };
    b2.on_parent_message(msg(n.clone())).expect("ok");
    b2.on_parent_message(msg(n.clone())).expect("idempotent");
    assert_eq!(b2.owner_routes().len(), 1);
    let held = &b2.owner_routes()[0];
    assert_eq!(held.resolver_cluster, "b");
    assert_eq!(held.caller_identity, None);
    // What is granted is the owner's own export, not anything the notification says.
    assert_eq!(held.exported.fqdn, local_api(&[]).fqdn);
    assert_eq!(held.exported.ports, local_api(&[]).ports);
    // A new identity for the same caller replaces the held one (and is applied again).
    let with_identity = fed::RouteNotification {
        caller_trust_domain: "cluster.local".into(),
        caller_namespace: "storefront".into(),
        caller_service_account: "web-sa".into(),
        ..n.clone()
    };
    b2.on_parent_message(msg(with_identity.clone()))
        .expect("ok");
    assert_eq!(b2.owner_routes().len(), 1);
    assert_eq!(
        b2.owner_routes()[0]
            .caller_identity
            .as_ref()
            .map(|i| i.principal()),
        Some("cluster.local/ns/storefront/sa/web-sa".to_string())
    );
    // A malformed identity costs the notification, and the held grant stays as it was.
    b2.on_parent_message(msg(fed::RouteNotification {
        caller_namespace: "../kube-system".into(),
        ..with_identity
    }))
    .expect("ok");
    assert_eq!(
        b2.owner_routes()[0]
            .caller_identity
            .as_ref()
            .map(|i| i.namespace.as_str()),
        Some("storefront")
    );
    b2.on_parent_message(msg(fed::RouteNotification { revoked: true, ..n }))
        .expect("ok");
    assert!(b2.owner_routes().is_empty());
}

#[test]
fn end_of_snapshot_keeps_exactly_what_the_session_announced() {
    let b = level("b");
    let ann = |name: &str, ep: &str| fed::ServiceAnnouncement {
        name: name.into(),
        endpoints: vec![ep.into()],
        ..api_announcement()
    };
    let key = |name: &str| ServiceKey::new("b2", "shop", name);
    // Entries of b2 left over from before this session (as if its last session's cleanup had
    // not run): one it announces again unchanged, one it announces changed, one it forgets.
    let (tx, _rx) = session_channel();
    let first = b
        .attach_child("b2", "127.0.0.1:1".into(), &membership(&["b2"]), tx)
        .expect("attach");
    for name in ["same", "changed", "forgotten", "deleted-again"] {
        b.child_announcement("b2", &ann(name, "10.2.0.1:443"))
            .expect("own subtree");
    }
    let mut leftovers = b.catalog().list(&Default::default());
    b.detach_child("b2", first);
    assert!(
        b.catalog().is_empty(),
        "detaching drops the child's entries"
    );
    for e in leftovers.drain(..) {
        b.catalog().upsert((*e).clone());
    }
    assert_eq!(b.catalog().len(), 4);

    let (tx, _rx) = session_channel();
    b.attach_child("b2", "127.0.0.1:1".into(), &membership(&["b2"]), tx)
        .expect("attach again");
    let mut session = b.track_announcements();
    let mut announce = |a: fed::ServiceAnnouncement| {
        b.child_announcement("b2", &a).expect("own subtree");
        session.note(&b, "b2", &a);
    };
    announce(ann("same", "10.2.0.1:443"));
    announce(ann("changed", "10.2.0.9:443"));
    announce(ann("new", "10.2.0.2:443"));
    announce(ann("deleted-again", "10.2.0.1:443"));
    announce(fed::ServiceAnnouncement {
        deleted: true,
        ..ann("deleted-again", "10.2.0.1:443")
    });
    b.child_snapshot_complete("b2", &session);

    let mut names: Vec<String> = b
        .catalog()
        .list(&Default::default())
        .iter()
        .map(|e| e.key.name.to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["changed", "new", "same"]);
    assert_eq!(
        b.catalog().get(&key("changed")).expect("kept").endpoints[0].address,
        "10.2.0.9"
    );
    assert!(b.catalog().get(&key("forgotten")).is_none());
}

/// With c2 away, c3 declares `[c3, c2]` and announces `(c2, shop, api)`. The
/// parent never configured c3 to carry c2, so c2 stays out of c3's subtree, the announcement is
/// refused (that entry only) and the real c2 attaches afterwards. A never-seen c9 fares the same.
#[test]
fn a_child_carries_only_what_its_parent_permits() {
    let root = level("root");
    let (tx3, mut rx3) = session_channel();
    root.attach_child("c3", "a".into(), &membership(&["c3", "c2", "c9"]), tx3)
        .expect("attach: the refused part is dropped, not the session");
    assert_eq!(root.subtree(), ["c3", "root"]);
    let refused = rejections(&mut rx3);
    assert_eq!(
        refused
            .iter()
            .map(|r| (r.kind.as_str(), r.cluster.as_str(), r.code))
            .collect::<Vec<_>>(),
        [
            ("subtree", "c2", tonic::Code::PermissionDenied as i32),
            ("subtree", "c9", tonic::Code::PermissionDenied as i32)
        ]
    );
    assert_eq!(
        refused[0].reason,
        "c3 may not carry \"c2\": no Cedar carry permit at root"
    );
    for cluster in ["c2", "c9"] {
        let spoof = fed::ServiceAnnouncement {
            cluster: cluster.into(),
            endpoints: vec!["6.6.6.6:443".into()],
            ..api_announcement()
        };
        let err = root.child_announcement("c3", &spoof).expect_err("spoofed");
        assert_eq!(err.code, RefusalCode::PermissionDenied);
        assert_eq!(
            err.reason,
            format!("cluster \"{cluster}\" is not in the subtree of child \"c3\"")
        );
    }
    assert!(root.catalog().is_empty());
    // A later membership update cannot sneak c2 in either.
    root.update_child_subtree("c3", &membership(&["c3", "c2"]))
        .expect("update");
    assert_eq!(root.subtree(), ["c3", "root"]);
    // The real c2 attaches and speaks for itself.
    let (tx2, _rx2) = session_channel();
    root.attach_child("c2", "b".into(), &membership(&["c2"]), tx2)
        .expect("the real c2 is not refused");
    root.child_announcement(
        "c2",
        &fed::ServiceAnnouncement {
            cluster: "c2".into(),
            ..api_announcement()
        },
    )
    .expect("own");
    assert_eq!(root.subtree(), ["c2", "c3", "root"]);
    // What the parent configures does hold: b carries b1 and b2.
    let (txb, mut rxb) = session_channel();
    root.attach_child("b", "c".into(), &membership(&["b", "b1", "b2"]), txb)
        .expect("attach b");
    assert!(rejections(&mut rxb).is_empty());
    assert!(root.check_claim("b", "b2").is_ok());
}

/// `a9` announcing `shop/api` (the same FQDN, or the same namespace/name under
/// another FQDN) does not take the name from its first owner, whatever the sort order; the
/// refused announcer is told, the owner gets a notice and both are recorded for explain. The
/// owner keeps the name while it is away.
#[test]
fn the_first_owner_keeps_a_name() {
    let root = level("root");
    let (tx2, mut rx2) = session_channel();
    let c2 = root
        .attach_child("c2", "a".into(), &membership(&["c2"]), tx2)
        .expect("attach c2");
    let (tx9, _rx9) = session_channel();
    root.attach_child("a9", "b".into(), &membership(&["a9"]), tx9)
        .expect("attach a9");
    let ann = |cluster: &str, fqdn: &str| fed::ServiceAnnouncement {
        cluster: cluster.into(),
        fqdn: fqdn.into(),
        ..api_announcement()
    };
    root.child_announcement("c2", &ann("c2", "api.shop.svc.clusterset.local"))
        .expect("first owner");
    drain(&mut rx2);
    let err = root
        .child_announcement("a9", &ann("a9", "api.shop.svc.clusterset.local"))
        .expect_err("shadowing");
    assert_eq!(err.code, RefusalCode::AlreadyExists);
    assert_eq!(
        err.reason,
        "api.shop.svc.clusterset.local is owned by c2/shop/api; the first owner keeps a name"
    );
    let err = root
        .child_announcement("a9", &ann("a9", "api.shop.a9.svc.clusterset.local"))
        .expect_err("same namespace/name under another FQDN");
    assert_eq!(
        err.reason,
        "shop/api is owned by c2/shop/api; the first owner keeps a name"
    );
    let served = root
        .catalog()
        .hamlet_get("api.shop.svc.clusterset.local")
        .expect("served");
    assert_eq!(served.key, ServiceKey::new("c2", "shop", "api"));
    let clashes = root.clashes(Some("api.shop.svc.clusterset.local"));
    assert_eq!(clashes.len(), 1);
    assert_eq!(clashes[0].claimant, ServiceKey::new("a9", "shop", "api"));
    assert_eq!(clashes[0].refused_by, "root");
    // The owner was told.
    let notices: Vec<fed::NameClash> = drain(&mut rx2)
        .into_iter()
        .filter_map(|p| match p {
            fed::parent_message::Payload::NameClash(n) => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(notices.len(), 2);
    assert_eq!(
        (
            notices[0].owner_cluster.as_str(),
            notices[0].claimant_cluster.as_str()
        ),
        ("c2", "a9")
    );
    // The owner's level records the notice it receives.
    let owner = level("c2");
    owner
        .on_parent_message(fed::ParentMessage {
            payload: Some(fed::parent_message::Payload::NameClash(notices[0].clone())),
        })
        .expect("ok");
    assert_eq!(
        owner.clashes(None)[0]
            .to_string()
            .split_once(' ')
            .map(|x| x.1),
        Some(
            "a9/shop/api claimed api.shop.svc.clusterset.local owned by c2/shop/api; refused by root"
        )
    );
    // c2 goes away: the name stays reserved for it.
    root.detach_child("c2", c2);
    assert!(
        root.child_announcement("a9", &ann("a9", "api.shop.svc.clusterset.local"))
            .is_err()
    );
    // The owner withdraws the service: the name is free.
    let (tx2, _rx2) = session_channel();
    root.attach_child("c2", "a".into(), &membership(&["c2"]), tx2)
        .expect("back");
    root.child_announcement(
        "c2",
        &fed::ServiceAnnouncement {
            deleted: true,
            ..ann("c2", "api.shop.svc.clusterset.local")
        },
    )
    .expect("withdraw");
    root.child_announcement("a9", &ann("a9", "api.shop.svc.clusterset.local"))
        .expect("a free name may be taken");
}

/// A refusal from the parent is stored (and logged) by the child.
#[test]
fn the_child_stores_what_its_parent_refused() {
    let b = level("b");
    let r = Refusal::new("size", RefusalCode::ResourceExhausted, "too big").to_rejection(
        "announcement",
        "b",
        "shop",
        "api",
        "",
        "root",
    );
    b.on_parent_message(fed::ParentMessage {
        payload: Some(fed::parent_message::Payload::Rejection(r.clone())),
    })
    .expect("ok");
    assert_eq!(b.rejections().len(), 1);
    assert_eq!(b.rejections()[0].1, r);
}

/// A refusal of what a cluster below announced or asked goes on down to its child (and is
/// kept here too); one of our own entries, or of another kind, is not sent down. When the
/// parent lifts a forwarded refusal (it confirms a snapshot without repeating it), the child
/// holding it is asked to reconnect, so that its copy is decided again.
#[test]
fn a_refusal_of_a_grandchilds_entry_is_sent_down_to_it() {
    let b = level("b");
    let (tx, mut rx) = session_channel();
    b.attach_child("b1", "a".into(), &membership(&["b1"]), tx.clone())
        .expect("attach");
    drain(&mut rx);
    let (up, _up_rx) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    b.begin_upward(up);
    let from_parent = |r: fed::Rejection| {
        b.on_parent_message(fed::ParentMessage {
            payload: Some(fed::parent_message::Payload::Rejection(r)),
        })
        .expect("ok")
    };
    let forbidden = Refusal::new("announce", RefusalCode::PermissionDenied, "forbidden")
        .with_policies(vec!["no-secret".into()]);
    let announced = forbidden.to_rejection("announcement", "b1", "shop", "secret", "", "root");
    let asked = Refusal::new("subtree", RefusalCode::PermissionDenied, "not carried")
        .to_rejection("query", "b1", "ops", "db", "", "root");
    let own = forbidden.to_rejection("announcement", "b", "shop", "mine", "", "root");
    let carried = forbidden.to_rejection("subtree", "b1", "", "", "", "root");
    for r in [&announced, &asked, &own, &carried] {
        from_parent(r.clone());
    }
    assert_eq!(rejections(&mut rx), [announced.clone(), asked]);
    assert_eq!(b.rejections().len(), 4, "all kept here");

    // A new parent session in which the parent no longer refuses b1's entry.
    let (up, _up_rx) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    b.begin_upward(up);
    from_parent(own);
    assert!(!tx.is_closed());
    b.on_parent_message(fed::ParentMessage {
        payload: Some(fed::parent_message::Payload::SnapshotComplete(
            fed::SnapshotComplete::default(),
        )),
    })
    .expect("ok");
    assert!(
        !b.rejections().iter().any(|(_, r)| r == &announced),
        "lifted here"
    );
    assert_eq!(
        closing_status(&tx, rx).message(),
        "a refusal above was lifted; reconnect to announce again"
    );
}

/// A refusal stands across a reconnect: it goes only when the parent, having applied the new
/// session's snapshot (its confirmation), did not repeat it.
#[test]
fn a_refusal_stands_until_the_parent_confirms_a_snapshot_without_it() {
    let b = level("b");
    let refusal = |name: &str| {
        Refusal::new("announce", RefusalCode::PermissionDenied, "forbidden")
            .with_policies(vec!["no-shop".into()])
            .to_rejection("announcement", "b", "shop", name, "", "root")
    };
    let from_parent = |p: fed::parent_message::Payload| {
        b.on_parent_message(fed::ParentMessage { payload: Some(p) })
            .expect("ok")
    };
    let refused = || -> Vec<String> { b.rejections().into_iter().map(|(_, r)| r.name).collect() };
    let (up, _rx) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    b.begin_upward(up);
    from_parent(fed::parent_message::Payload::Rejection(refusal("api")));
    from_parent(fed::parent_message::Payload::Rejection(refusal("cart")));
    assert!(!b.refusals_confirmed());
    from_parent(fed::parent_message::Payload::SnapshotComplete(
        fed::SnapshotComplete { generation: 3 },
    ));
    assert!(b.refusals_confirmed());
    assert_eq!(refused(), ["api", "cart"]);
    // A new session: both still stand while the snapshot is sent again.
    let (up, _rx) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    b.begin_upward(up);
    assert!(!b.refusals_confirmed());
    assert_eq!(refused(), ["api", "cart"]);
    from_parent(fed::parent_message::Payload::Rejection(refusal("cart")));
    from_parent(fed::parent_message::Payload::SnapshotComplete(
        fed::SnapshotComplete { generation: 9 },
    ));
    assert_eq!(refused(), ["cart"], "api was accepted this time");
    assert_eq!(b.refusal_of("shop", "cart"), Some(refusal("cart")));
}

/// An import's question carries its workload identity up, on every re-issue; a changed
/// identity asks again at once, an unchanged set of imports asks nothing.
#[test]
fn an_import_asks_with_its_workload_identity() {
    let b = level("b");
    let (up, mut rx) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    b.begin_upward(up);
    let asked = |rx: &mut UpQueue| -> Vec<(String, String, String)> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .filter_map(|m| match m.payload {
                Some(fed::child_message::Payload::ServiceQuery(q)) => Some((
                    q.requester_trust_domain,
                    q.requester_namespace,
                    q.requester_service_account,
                )),
                _ => None,
            })
            .collect()
    };
    assert_eq!(asked(&mut rx), [], "no import yet");
    let identity = |namespace: &str| WorkloadIdentity {
        trust_domain: "b.mesh.test".into(),
        namespace: namespace.into(),
        service_account: "web".into(),
    };
    let import = |namespace: &str| Question {
        identity: Some(identity(namespace)),
        ..Question::new(
            Target::Name {
                namespace: "shop".into(),
                name: "api".into(),
            },
            "web",
        )
    };
    let wire = |namespace: &str| {
        (
            "b.mesh.test".to_string(),
            namespace.to_string(),
            "web".to_string(),
        )
    };
    b.set_imports(&[import("storefront")]);
    assert_eq!(asked(&mut rx), [wire("storefront")]);
    b.set_imports(&[import("storefront")]);
    assert_eq!(asked(&mut rx), [], "nothing changed");
    b.set_imports(&[import("checkout")]);
    assert_eq!(asked(&mut rx), [wire("checkout")]);
    // Re-issued with the parent session's questions.
    let (up, _rx) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    let again = b.begin_upward(up);
    assert_eq!(
        again
            .into_iter()
            .map(|q| (
                q.requester_trust_domain,
                q.requester_namespace,
                q.requester_service_account
            ))
            .collect::<Vec<_>>(),
        [wire("checkout")]
    );
}

/// A refused question stands across a confirmed snapshot (it is asked again after it) and goes
/// once the question is answered.
#[test]
fn a_refused_question_stands_until_it_is_answered() {
    let b = level("b");
    let (up, mut rx) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    b.begin_upward(up);
    let api = Target::Name {
        namespace: "shop".into(),
        name: "api".into(),
    };
    b.set_imports(&[Question::new(api, "web")]);
    let asked = std::iter::from_fn(|| rx.try_recv().ok())
        .find_map(|m| match m.payload {
            Some(fed::child_message::Payload::ServiceQuery(q)) => Some(q),
            _ => None,
        })
        .expect("the question went up");
    let from_parent = |p: fed::parent_message::Payload| {
        b.on_parent_message(fed::ParentMessage { payload: Some(p) })
            .expect("ok")
    };
    let refusal = Refusal::new("size", RefusalCode::ResourceExhausted, "too big")
        .to_rejection("query", "b", "shop", "api", "", "root");
    from_parent(fed::parent_message::Payload::Rejection(refusal.clone()));
    let (up, _rx) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    b.begin_upward(up);
    from_parent(fed::parent_message::Payload::SnapshotComplete(
        fed::SnapshotComplete::default(),
    ));
    assert_eq!(b.rejections().len(), 1, "not decided by the snapshot");
    from_parent(fed::parent_message::Payload::ServiceQueryResponse(
        fed::ServiceQueryResponse {
            correlation_id: asked.correlation_id,
            requester_cluster: "b".into(),
            ..Default::default()
        },
    ));
    assert_eq!(b.rejections(), vec![]);
}

/// The parent confirms a child's snapshot once applied; an announcement a policy refused makes
/// the next policy change ask the child to reconnect, so it is decided again.
#[test]
fn a_policy_refusal_is_decided_again_when_policies_change() {
    let root = level("root");
    let (tx, mut rx) = session_channel();
    root.attach_child("c3", "a".into(), &membership(&["c3"]), tx.clone())
        .expect("attach");
    drain(&mut rx);
    let zoned = fed::ServiceAnnouncement {
        cluster: "c3".into(),
        fqdn: "api.bank.example".into(),
        ..api_announcement()
    };
    let refusal = root
        .child_announcement("c3", &zoned)
        .expect_err("no announce permit for the zone");
    assert_eq!(refusal.check, "announce");
    let announced = root.track_announcements();
    root.child_snapshot_complete("c3", &announced);
    root.confirm_snapshot("c3", fed::SnapshotComplete { generation: 4 });
    assert_eq!(
        drain(&mut rx),
        [fed::parent_message::Payload::SnapshotComplete(
            fed::SnapshotComplete { generation: 4 }
        )]
    );
    root.policies_changed();
    assert_eq!(closing_status(&tx, rx).code(), tonic::Code::Unavailable);
    // A child without such a refusal is left alone.
    let (tx, rx) = session_channel();
    root.attach_child("c4", "b".into(), &membership(&["c4"]), tx.clone())
        .expect("attach");
    root.policies_changed();
    assert!(!tx.is_closed());
    drop(rx);
}

/// A carry permit added later takes effect from what the child declared; the child is asked to
/// reconnect so it announces the newly carried clusters again. Removing it shrinks the subtree.
#[test]
fn carry_is_decided_again_when_policies_change() {
    let root = level("root");
    let (tx, mut rx) = session_channel();
    root.attach_child("c3", "a".into(), &membership(&["c3", "c2"]), tx.clone())
        .expect("attach");
    assert_eq!(root.subtree(), ["c3", "root"]);
    drain(&mut rx);
    let carry = crate::authz::carry_policy("c3", &["c2"]).expect("names");
    root.gate()
        .set_policies(Policies::from_sources(&[("c.cedar".into(), carry)]).expect("valid"));
    root.policies_changed();
    assert_eq!(root.subtree(), ["c2", "c3", "root"]);
    // The session's stream ends with the request to reconnect.
    assert_eq!(closing_status(&tx, rx).code(), tonic::Code::Unavailable);
    root.gate().set_policies(Policies::default_set());
    root.policies_changed();
    assert_eq!(root.subtree(), ["c3", "root"]);
}

/// b2's own export of shop/api, admitting `allowed`.
fn local_api(allowed: &[&str]) -> ServiceEntry {
    let mut e = entry_from_announcement(
        &fed::ServiceAnnouncement {
            allowed_requesters: allowed.iter().map(|s| s.to_string()).collect(),
            ..api_announcement()
        },
        Source::Local,
    )
    .expect("valid");
    e.source = Source::Local;
    e
}

/// A level above can forge a route notification; the owner applies a grant only for its own
/// export and a caller that export admits, and says why in the acknowledgement.
#[test]
fn the_owner_grants_only_its_own_exports_to_callers_they_admit() {
    let b2 = level("b2");
    b2.catalog().upsert(local_api(&["b1/web"]));
    let (tx, mut up) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    b2.begin_upward(tx);
    while up.try_recv().is_ok() {}
    let forged = |ns: &str, name: &str, caller: &str| fed::ParentMessage {
        payload: Some(fed::parent_message::Payload::RouteNotification(
            fed::RouteNotification {
                target_namespace: ns.into(),
                target_service: name.into(),
                caller_cluster: caller.into(),
                caller_service: "web".into(),
                route_id: 9,
                target_cluster: "b2".into(),
                resolver_cluster: "b".into(),
                ..Default::default()
            },
        )),
    };
    let ack = |up: &mut UpQueue| loop {
        match up.try_recv() {
            Ok(fed::ChildMessage {
                payload: Some(fed::child_message::Payload::RouteAck(a)),
            }) => return a,
            Ok(_) => continue,
            Err(e) => panic!("no ack: {e:?}"),
        }
    };
    b2.on_parent_message(forged("kube-system", "coredns", "b1"))
        .expect("ok");
    let a = ack(&mut up);
    assert_eq!(
        (a.applied, a.error.as_str()),
        (false, "kube-system/coredns is not exported by b2")
    );
    b2.on_parent_message(forged("shop", "api", "evil"))
        .expect("ok");
    let a = ack(&mut up);
    assert_eq!(
        (a.applied, a.error.as_str()),
        (false, "b2/shop/api does not admit evil/web")
    );
    assert!(b2.owner_routes().is_empty());
    b2.on_parent_message(forged("shop", "api", "b1"))
        .expect("ok");
    assert_eq!((ack(&mut up).applied, b2.owner_routes().len()), (true, 1));
}

/// A grandchild that goes away (its parent's subtree shrinks) keeps its names too; when it is
/// back under the same child it holds them again.
#[test]
fn a_grandchild_away_keeps_its_names() {
    let root = level("root");
    let (txb, _rxb) = session_channel();
    root.attach_child("b", "a".into(), &membership(&["b", "b1", "b2"]), txb)
        .expect("attach b");
    let (tx9, _rx9) = session_channel();
    root.attach_child("a9", "c".into(), &membership(&["a9"]), tx9)
        .expect("attach a9");
    root.child_announcement("b", &api_announcement())
        .expect("b2's service, through b");
    root.update_child_subtree("b", &membership(&["b", "b1"]))
        .expect("b2 went away");
    assert!(root.catalog().is_empty());
    let shadow = fed::ServiceAnnouncement {
        cluster: "a9".into(),
        ..api_announcement()
    };
    let err = root
        .child_announcement("a9", &shadow)
        .expect_err("held for b2");
    assert_eq!(err.code, RefusalCode::AlreadyExists);
    root.update_child_subtree("b", &membership(&["b", "b1", "b2"]))
        .expect("b2 is back");
    root.child_announcement("b", &api_announcement())
        .expect("the owner holds its name again");
    assert!(root.child_announcement("a9", &shadow).is_err());
}

/// A workload identity is hostile input: a malformed one costs the query (answered with the
/// reason, no grant recorded); a valid one is recorded with the grant.
#[tokio::test]
async fn a_malformed_workload_identity_costs_the_query() {
    let b = level("b");
    b.catalog().upsert(local_api(&[]));
    let target = Target::Name {
        namespace: "shop".into(),
        name: "api".into(),
    };
    let timeout = std::time::Duration::from_secs(5);
    let bad = WorkloadIdentity {
        trust_domain: "cluster.local".into(),
        namespace: "storefront".into(),
        service_account: "*".into(),
    };
    let answer = b
        .query_as(target.clone(), "web", Some(bad.clone()), false, timeout)
        .await;
    assert!(!answer.found && !answer.access_allowed);
    assert_eq!(
        answer.error,
        r#"invalid query: workload service account "*" is not a DNS-1123 subdomain of at most 63 characters"#
    );
    assert!(b.resolver_grants().is_empty());
    let good = WorkloadIdentity {
        service_account: "web-sa".into(),
        ..bad
    };
    let answer = b.query_as(target, "web", Some(good), false, timeout).await;
    assert!(answer.access_allowed, "{answer:?}");
    assert_eq!(b.resolver_grants().len(), 1);
}

/// b2's own export `shop/svc-<i>`.
fn local_service(i: usize) -> ServiceEntry {
    let mut e = local_api(&[]);
    let name = format!("svc-{i:05}");
    e.fqdn = xcc_proto::names::clusterset_fqdn(&name, "shop").into();
    e.key = ServiceKey::new("b2", "shop", name);
    e
}

fn child_keys(level: &Level, child: &str) -> BTreeSet<ServiceKey> {
    level
        .catalog()
        .list(&crate::catalog::ListFilter {
            source: Some(level.child_source(child)),
            ..Default::default()
        })
        .iter()
        .map(|e| e.key.clone())
        .collect()
}

fn local_keys(level: &Level) -> BTreeSet<ServiceKey> {
    level
        .catalog()
        .list(&Default::default())
        .iter()
        .map(|e| e.key.clone())
        .collect()
}

/// The parent reads `n` messages of the child's upward stream (all that are ready with `None`);
/// returns how many it read and how many started another pass of the snapshot.
fn read_up(
    stream: &mut crate::federation::upward::Upward,
    reader: &mut crate::federation::session::ChildReader,
    n: Option<usize>,
) -> (usize, usize) {
    use futures::{FutureExt as _, StreamExt as _};
    let (mut read, mut passes) = (0, 0);
    while n.is_none_or(|n| read < n) {
        let Some(Some(msg)) = stream.next().now_or_never() else {
            break;
        };
        if let Some(fed::child_message::Payload::Subtree(m)) = &msg.payload
            && m.resync
        {
            passes += 1;
        }
        reader.on_message(msg).expect("the session goes on");
        read += 1;
    }
    (read, passes)
}

/// A parent that stops reading while its child changes more than the change feed holds: the
/// child's stream waits (nothing is queued for it), starts the snapshot again when it is read
/// once more, and the parent ends with exactly the child's services; nothing overflowed.
#[test]
fn a_slow_parent_loses_nothing() {
    let root = level("root");
    // A change feed of 256 changes, so a few hundred changes outrun it.
    let b2 = Level::new(
        "b2",
        None,
        Catalog::with_change_capacity(256),
        root.gate().clone(),
    );
    b2.catalog()
        .replace_source(&Source::Local, (0..1_200).map(local_service).collect());
    let (down, _down_rx) = session_channel();
    root.attach_child("b2", "127.0.0.1:1".into(), &membership(&["b2"]), down)
        .expect("attach");
    let mut reader = crate::federation::session::ChildReader::new(root.clone(), "b2".into());
    let (up, control) = Uplink::new(QueueLimits::new(16, QueueLimits::FEDERATION.bytes));
    let events = b2.catalog().subscribe();
    let queries = b2.begin_upward(up);
    let mut stream = crate::federation::upward::Upward::new(b2.clone(), control, events, queries);

    // Part of the snapshot is read, then the parent stops reading.
    assert_eq!(read_up(&mut stream, &mut reader, Some(300)), (300, 0));
    // Meanwhile the child deletes services on both sides of the cursor, changes others and
    // adds new ones: 900 changes, more than the feed holds.
    for i in (0..1_200).step_by(4) {
        b2.catalog().remove(&local_service(i).key);
    }
    for i in (1..1_200).step_by(4) {
        let mut e = local_service(i);
        e.endpoints[0].port = 8443;
        b2.catalog().upsert(e);
    }
    for i in 1_200..1_500 {
        b2.catalog().upsert(local_service(i));
    }
    let (_, passes) = read_up(&mut stream, &mut reader, None);
    assert_eq!(passes, 1, "one more pass of the snapshot");
    assert_eq!(child_keys(&root, "b2"), local_keys(&b2));
    assert_eq!(child_keys(&root, "b2").len(), 1_200);
    let changed = ServiceKey::new("b2", "shop", "svc-00001");
    assert_eq!(
        root.catalog().get(&changed).expect("present").endpoints[0].port,
        8443
    );
    assert_eq!(root.overflows().get(), 0);
    assert_eq!(b2.overflows().get(), 0);
}

/// A child that does not read: the message that does not fit ends its session (counted), and
/// the route notifications it had not acknowledged are sent again when it is back.
#[test]
fn a_full_child_queue_resets_the_session_and_routes_are_sent_again() {
    use futures::StreamExt as _;
    let b = level("b");
    let (link, rx) = DownLink::new(QueueLimits::new(2, QueueLimits::FEDERATION.bytes));
    let session = b
        .attach_child(
            "b2",
            "127.0.0.1:1".into(),
            &membership(&["b2"]),
            link.clone(),
        )
        .expect("attach");
    for caller in ["c1", "c2", "c3"] {
        b.route_notification(fed::RouteNotification {
            target_namespace: "shop".into(),
            target_service: "api".into(),
            caller_cluster: caller.into(),
            caller_service: "web".into(),
            target_cluster: "b2".into(),
            resolver_cluster: "b".into(),
            ..Default::default()
        });
    }
    assert_eq!(b.overflows().get(), 1);
    // The stream ends with the reason (what was still queued is discarded).
    let items: Vec<Down> = futures::executor::block_on(link.stream(rx).collect());
    let status = items
        .last()
        .expect("an item")
        .as_ref()
        .expect_err("ends with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    futures::executor::block_on(link.closed());
    b.detach_child("b2", session);
    let (tx, mut rx) = session_channel();
    b.attach_child("b2", "127.0.0.1:2".into(), &membership(&["b2"]), tx)
        .expect("attach again");
    let routes: Vec<String> = drain(&mut rx)
        .into_iter()
        .filter_map(|p| match p {
            fed::parent_message::Payload::RouteNotification(n) => Some(n.caller_cluster),
            _ => None,
        })
        .collect();
    assert_eq!(routes, ["c1", "c2", "c3"]);
}

/// A child that stops reading while large messages pile up for it is cut once their encoded
/// bytes exceed the queue's byte budget (long before its message budget), with a status that
/// names the budget and what did not fit; what was queued is freed at the cut, and the bytes
/// accounted for the child (its link's and the level's total) are back to zero.
#[test]
fn a_child_queue_is_cut_at_its_byte_budget_and_its_bytes_return() {
    use futures::StreamExt as _;
    use prost::Message as _;
    let b = level("b");
    let limits = QueueLimits::new(8192, 64 * 1024);
    b.set_queue_limits(limits);
    let (link, rx) = DownLink::for_level(&b);
    let session = b
        .attach_child(
            "b2",
            "127.0.0.1:1".into(),
            &membership(&["b2"]),
            link.clone(),
        )
        .expect("attach");
    let stream = link.stream(rx);
    let ancestry = fed::ParentMessage {
        payload: Some(fed::parent_message::Payload::Ancestry(fed::Ancestry {
            path: vec!["b".into()],
        })),
    }
    .encoded_len();
    assert_eq!(link.queued_bytes(), ancestry);
    let rejection = fed::Rejection {
        kind: "announcement".into(),
        cluster: "b2".into(),
        reason: "x".repeat(10_000),
        ..Default::default()
    };
    let size = fed::ParentMessage {
        payload: Some(fed::parent_message::Payload::Rejection(rejection.clone())),
    }
    .encoded_len();
    let fit = (limits.bytes - ancestry) / size;
    for _ in 0..fit {
        b.reject_to_child("b2", rejection.clone());
    }
    assert_eq!(b.overflows().get(), 0);
    assert_eq!(link.queued_bytes(), ancestry + fit * size);
    assert_eq!(b.queued_bytes().get(), (ancestry + fit * size) as i64);
    // The next one does not fit: the session is cut, and what was queued is dropped at once.
    b.reject_to_child("b2", rejection.clone());
    assert_eq!(b.overflows().get(), 1);
    assert_eq!(link.queued_bytes(), 0);
    assert_eq!(b.queued_bytes().get(), 0);
    let items: Vec<Down> = futures::executor::block_on(stream.collect());
    assert_eq!(items.len(), 1, "only the status: {items:?}");
    let status = items[0].as_ref().expect_err("a status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(
        status.message(),
        format!(
            "the parent's queue to this child exceeded its budget of 8192 messages and 65536 \
             bytes (--federation-queue-messages, --federation-queue-bytes): {size} bytes do not \
             fit: {} of 65536 bytes are queued; reconnect and resynchronise",
            ancestry + fit * size
        )
    );
    // Later messages for the cut session are not queued (nor counted again).
    b.reject_to_child("b2", rejection);
    assert_eq!((b.overflows().get(), link.queued_bytes()), (1, 0));
    b.detach_child("b2", session);
    assert!(b.children().is_empty());
    assert_eq!(b.queued_bytes().get(), 0);
}

/// When the transport drops a child's response stream (the child went away), its queue goes
/// with it: the bytes return and the session sees the link closed.
#[test]
fn a_dropped_child_stream_frees_its_queue_and_closes_the_link() {
    let b = level("b");
    let (link, rx) = DownLink::for_level(&b);
    b.attach_child(
        "b2",
        "127.0.0.1:1".into(),
        &membership(&["b2"]),
        link.clone(),
    )
    .expect("attach");
    let stream = link.stream(rx);
    assert!(link.queued_bytes() > 0, "the ancestry is queued");
    drop(stream);
    assert_eq!(link.queued_bytes(), 0);
    assert_eq!(b.queued_bytes().get(), 0);
    futures::executor::block_on(link.closed());
    assert!(link.why().is_none(), "gone, not cut");
}

/// A query that reaches the top before the owner's announcement is answered "not found", and
/// answered again — granted, the route sent to the owner — as soon as the announcement arrives,
/// not when the requester next retries.
#[test]
fn a_query_before_the_announcement_is_granted_when_the_name_appears() {
    let b = level("b");
    let (tx1, mut rx1) = session_channel();
    let (tx2, mut rx2) = session_channel();
    b.attach_child("b1", "127.0.0.1:1".into(), &membership(&["b1"]), tx1)
        .expect("attach b1");
    b.attach_child("b2", "127.0.0.1:2".into(), &membership(&["b2"]), tx2)
        .expect("attach b2");
    let answers = |rx: &mut DownQueue| -> Vec<fed::ServiceQueryResponse> {
        drain(rx)
            .into_iter()
            .filter_map(|p| match p {
                fed::parent_message::Payload::ServiceQueryResponse(r) => Some(r),
                _ => None,
            })
            .collect()
    };
    b.handle_query(fed::ServiceQuery {
        namespace: "shop".into(),
        name: "api".into(),
        requester_cluster: "b1".into(),
        requester_service: "web".into(),
        correlation_id: 7,
        ..Default::default()
    });
    let first = answers(&mut rx1);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].error, "service not found in hierarchy");

    let mut events = b.catalog().subscribe();
    b.child_announcement("b2", &api_announcement())
        .expect("own subtree");
    while let Ok(ev) = events.try_recv() {
        b.on_catalog_event(&ev);
    }
    let granted = answers(&mut rx1);
    assert_eq!(granted.len(), 1, "{granted:?}");
    assert!(
        granted[0].found && granted[0].access_allowed && granted[0].correlation_id == 7,
        "{:?}",
        granted[0]
    );
    let n = next_route(&mut rx2);
    assert_eq!(
        (
            n.target_cluster.as_str(),
            n.caller_cluster.as_str(),
            n.caller_service.as_str()
        ),
        ("b2", "b1", "web")
    );
    // Answered once: a later change of the service re-evaluates the grant, not the old query.
    assert!(b.lock().unfound.is_empty());
}

/// A ledger kept in memory, counting appends and replacements.
#[derive(Default)]
struct MemOwners {
    text: std::sync::Mutex<Option<String>>,
    writes: watch::Sender<(usize, usize)>,
}

impl OwnerStore for MemOwners {
    fn place(&self) -> String {
        "memory".into()
    }
    fn load(&self) -> futures::future::BoxFuture<'_, anyhow::Result<Option<String>>> {
        Box::pin(async move { Ok(self.text.lock().expect("lock").clone()) })
    }
    fn append(&self, text: String) -> futures::future::BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            self.text
                .lock()
                .expect("lock")
                .get_or_insert_default()
                .push_str(&text);
            self.writes.send_modify(|w| w.0 += 1);
            Ok(())
        })
    }
    fn replace(&self, text: String) -> futures::future::BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            *self.text.lock().expect("lock") = Some(text);
            self.writes.send_modify(|w| w.1 += 1);
            Ok(())
        })
    }
}

/// A ledger read back is held (an owner long away is free after the hold),
/// and what changes is appended to the log, not rewritten.
#[tokio::test]
async fn held_names_expire_and_the_ledger_is_appended_to() {
    let root = level("root");
    root.set_name_hold(std::time::Duration::from_secs(3600));
    let store = Arc::new(MemOwners::default());
    let start = format!(
        "{}\n+ shop/old c9 shop old 1000\n+ old.shop.svc.clusterset.local c9 shop old 1000\n\
         + shop/api c2 shop api -\n+ api.shop.svc.clusterset.local c2 shop api -\n",
        owners::HEADER
    );
    *store.text.lock().expect("lock") = Some(start.clone());
    let cancel = CancellationToken::new();
    let task = root
        .keep_owners(store.clone(), cancel.clone())
        .await
        .expect("a valid ledger");
    // c9 has been away since 1970: its names are free; c2's are held from now on.
    let held = root.held_names();
    assert_eq!(held.names, 2);
    assert_eq!(held.hold, std::time::Duration::from_secs(3600));
    let since = held.oldest_since.expect("held");
    assert_eq!(
        held.oldest_expires,
        Some(since + std::time::Duration::from_secs(3600))
    );
    let (tx9, _rx9) = session_channel();
    root.attach_child("a9", "b".into(), &membership(&["a9"]), tx9)
        .expect("attach a9");
    let ann = |name: &str| fed::ServiceAnnouncement {
        cluster: "a9".into(),
        name: name.into(),
        ..api_announcement()
    };
    root.child_announcement("a9", &ann("old"))
        .expect("an expired hold frees the name");
    let err = root
        .child_announcement("a9", &ann("api"))
        .expect_err("held for c2");
    assert_eq!(err.code, RefusalCode::AlreadyExists);

    let mut writes = store.writes.subscribe();
    let task = tokio::spawn(task);
    writes
        .wait_for(|w| w.0 > 0)
        .await
        .expect("the ledger is written");
    cancel.cancel();
    task.await.expect("the ledger task ends");
    assert_eq!(*store.writes.borrow(), (1, 0), "(appends, replacements)");
    let text = store.text.lock().expect("lock").clone().expect("a ledger");
    assert!(text.starts_with(&start), "appended: {text}");
    let read = owners::parse(&text, "memory").expect("valid");
    let since = crate::federation::level::reservations::unix(since);
    let expected: HashMap<Arc<str>, owners::Holding> = [
        (
            "shop/api".into(),
            (ServiceKey::new("c2", "shop", "api"), Some(since)),
        ),
        (
            "api.shop.svc.clusterset.local".into(),
            (ServiceKey::new("c2", "shop", "api"), Some(since)),
        ),
        (
            "shop/old".into(),
            (ServiceKey::new("a9", "shop", "old"), None),
        ),
        (
            "old.shop.svc.clusterset.local".into(),
            (ServiceKey::new("a9", "shop", "old"), None),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(read.names, expected);
    assert_eq!(read.lines, 8);
}

/// A log grown well past what it describes is compacted: replaced whole, once.
#[tokio::test]
async fn a_long_log_is_compacted() {
    let root = level("root");
    let store = Arc::new(MemOwners::default());
    let mut start = format!("{}\n", owners::HEADER);
    for _ in 0..1000 {
        start.push_str("+ shop/api c2 shop api 5\n- shop/api\n");
    }
    start.push_str("+ shop/api c2 shop api 5\n");
    *store.text.lock().expect("lock") = Some(start);
    let cancel = CancellationToken::new();
    let task = root
        .keep_owners(store.clone(), cancel.clone())
        .await
        .expect("a valid ledger");
    let mut writes = store.writes.subscribe();
    let task = tokio::spawn(task);
    writes.wait_for(|w| w.1 > 0).await.expect("compacted");
    cancel.cancel();
    task.await.expect("the ledger task ends");
    assert_eq!(*store.writes.borrow(), (0, 1), "(appends, replacements)");
    assert_eq!(
        store.text.lock().expect("lock").as_deref(),
        Some(format!("{}\n+ shop/api c2 shop api 5\n", owners::HEADER).as_str())
    );
}

/// A refusal's code is, on the wire, the gRPC code of the same name.
#[test]
fn refusal_codes_are_the_grpc_codes_of_the_same_name() {
    let codes = [
        (RefusalCode::InvalidArgument, tonic::Code::InvalidArgument),
        (RefusalCode::AlreadyExists, tonic::Code::AlreadyExists),
        (RefusalCode::PermissionDenied, tonic::Code::PermissionDenied),
        (
            RefusalCode::ResourceExhausted,
            tonic::Code::ResourceExhausted,
        ),
    ];
    for (ours, grpc) in codes {
        assert_eq!(ours.wire(), grpc as i32, "{ours:?}");
        assert_eq!(format!("{ours:?}"), format!("{grpc:?}"));
    }
}

/// What a level hands one child's session, as plain values.
#[derive(Clone, Default)]
struct Recorder {
    sent: Arc<std::sync::Mutex<Vec<fed::parent_message::Payload>>>,
    resyncs: Arc<std::sync::Mutex<Vec<Resync>>>,
    /// Refuse every message from now on (as a full queue would).
    full: Arc<std::sync::atomic::AtomicBool>,
}

impl ChildPort for Recorder {
    fn send(&self, msg: fed::parent_message::Payload) -> Result<(), Overflow> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Overflow);
        }
        self.sent.lock().expect("lock").push(msg);
        Ok(())
    }

    fn resync(&self, why: Resync) {
        self.resyncs.lock().expect("lock").push(why);
    }
}

/// The level needs no transport: a child's port receives its ancestry, then the refusals of
/// its entries, as plain messages; a policy change asks it to resynchronise with a typed
/// reason; and every message its port could not take is counted as an overflow.
#[test]
fn a_child_port_receives_plain_messages_typed_resyncs_and_overflows_are_counted() {
    let root = level("root");
    let port = Recorder::default();
    root.attach_child("c3", "a".into(), &membership(&["c3"]), port.clone())
        .expect("attach");
    let zoned = fed::ServiceAnnouncement {
        cluster: "c3".into(),
        fqdn: "api.bank.example".into(),
        ..api_announcement()
    };
    let refusal = root
        .child_announcement("c3", &zoned)
        .expect_err("no announce permit for the zone");
    let rejection = refusal.to_rejection("announcement", "c3", "shop", "api", "", "root");
    root.reject_to_child("c3", rejection.clone());
    assert_eq!(
        *port.sent.lock().expect("lock"),
        [
            fed::parent_message::Payload::Ancestry(fed::Ancestry {
                path: vec!["root".into()]
            }),
            fed::parent_message::Payload::Rejection(rejection.clone()),
        ]
    );
    assert_eq!(rejection.code, tonic::Code::PermissionDenied as i32);
    root.policies_changed();
    assert_eq!(
        *port.resyncs.lock().expect("lock"),
        [Resync::PoliciesChanged]
    );
    assert_eq!(root.overflows().get(), 0);
    port.full.store(true, std::sync::atomic::Ordering::SeqCst);
    root.reject_to_child("c3", rejection.clone());
    root.confirm_snapshot("c3", fed::SnapshotComplete { generation: 1 });
    assert_eq!(root.overflows().get(), 2);
    assert_eq!(port.sent.lock().expect("lock").len(), 2);
}
