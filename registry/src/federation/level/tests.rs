//! Level behaviour without a network: child sessions are plain channels.

use std::sync::{Arc, RwLock};

use xcc_proto::xcc::federation::v1 as fed;

use super::*;
use crate::authz::Policies;

fn level(name: &str) -> Level {
    Level::new(
        name,
        None,
        Catalog::new(),
        Arc::new(RwLock::new(Arc::new(Policies::default_set()))),
    )
}

fn membership(c: &[&str]) -> fed::SubtreeMembership {
    fed::SubtreeMembership {
        clusters: c.iter().map(|s| s.to_string()).collect(),
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

fn next_route(rx: &mut mpsc::Receiver<Down>) -> fed::RouteNotification {
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
        fqdn: String::new(),
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
    // The owner accepts routes only for its own exports.
    b2.inner.catalog.upsert(ServiceEntry {
        key: ServiceKey::new("b2", "shop", "api"),
        source: Source::Local,
        fqdn: "api.shop.svc.clusterset.local".into(),
        endpoints: vec![],
        ports: vec![],
        labels: Default::default(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    });
    let n = fed::RouteNotification {
        target_namespace: "shop".into(),
        target_service: "api".into(),
        caller_cluster: "b1".into(),
        caller_service: "web".into(),
        revoked: false,
        route_id: 3,
        target_cluster: "b2".into(),
        resolver_cluster: "b".into(),
    };
    let msg = |n: fed::RouteNotification| fed::ParentMessage {
        payload: Some(fed::parent_message::Payload::RouteNotification(n)),
    };
    b2.on_parent_message(msg(n.clone())).expect("ok");
    b2.on_parent_message(msg(n.clone())).expect("idempotent");
    assert_eq!(b2.owner_routes().len(), 1);
    assert_eq!(b2.owner_routes()[0].resolver_cluster, "b");
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
        .map(|e| e.key.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["changed", "new", "same"]);
    assert_eq!(
        b.catalog().get(&key("changed")).expect("kept").endpoints[0].address,
        "10.2.0.9"
    );
    assert!(b.catalog().get(&key("forgotten")).is_none());
}
