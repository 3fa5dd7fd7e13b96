//! XCC v1's DNS cache and Service-controller cases, adapted: the cache is
//! now an index of Services whose names are derived on publish, so "lookup by FQDN" is a zone
//! lookup and "lookup by key" is the Service's ownership of that name.

use std::collections::BTreeMap;
use std::net::IpAddr;

use xcc_proto::mapping::NAMESPACE_ANNOTATION;
use xcc_proto::names::FQDN_ANNOTATION;

use super::*;
use crate::zone::fqdn_name;

fn svc(name: &str, fqdn: Option<&str>, ip: &str) -> ServiceInfo {
    ServiceInfo {
        key: ServiceKey::new("ns", name),
        annotations: fqdn
            .map(|f| [(FQDN_ANNOTATION, f)].into_iter().collect())
            .unwrap_or_default(),
        cluster_ips: vec![ip.parse().unwrap()],
        ports: Vec::new(),
    }
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("ns", name)
}

/// Address served at `name` and the Service owning it, in the last published snapshot.
fn lookup(index: &DnsIndex, name: &str) -> Option<(String, ServiceKey)> {
    let snap = index.snapshot();
    let n = fqdn_name(name).unwrap();
    let zone = snap.zones.find_zone(&n)?;
    let node = zone.node(&n)?;
    let owner = zone.owner(&n)?.clone();
    Some((node.v4.first()?.to_string(), owner))
}

fn index() -> DnsIndex {
    let mut i = DnsIndex::new(vec!["b.c".into(), "c.d".into()], [FeedSource::Services]);
    i.reset_services([]);
    i.publish(100);
    i
}

#[test]
fn apply_then_lookup_by_name_and_key() {
    let mut i = index();
    assert_eq!(lookup(&i, "a.b.c"), None);
    assert!(i.service(&key("12345-abc")).is_none());
    i.apply_service(svc("12345-abc", Some("a.b.c"), "1.2.3.4"));
    i.publish(101);
    assert_eq!(
        lookup(&i, "a.b.c"),
        Some(("1.2.3.4".into(), key("12345-abc")))
    );
    assert_eq!(
        i.service(&key("12345-abc")).unwrap().cluster_ips[0].to_string(),
        "1.2.3.4"
    );
}

#[test]
fn same_name_from_another_service_goes_to_the_lowest_key() {
    // XCC v1: last writer wins. Here the lowest namespace/name owns the name whatever
    // the order, and the other Service is reported as a conflict.
    let mut i = index();
    i.apply_service(svc("12345-abc-old", Some("a.b.c"), "1.2.3.4"));
    i.apply_service(svc("12345-abc", Some("a.b.c"), "4.5.6.7"));
    i.publish(101);
    assert_eq!(
        lookup(&i, "a.b.c"),
        Some(("4.5.6.7".into(), key("12345-abc")))
    );
    let snap = i.snapshot();
    assert_eq!(snap.zones.conflicts().len(), 1);
    assert_eq!(snap.zones.conflicts()[0].losers, vec![key("12345-abc-old")]);
}

#[test]
fn a_service_moving_to_another_name_leaves_the_old_one() {
    let mut i = index();
    i.apply_service(svc("12345-abc", Some("a.b.c"), "1.2.3.4"));
    i.publish(101);
    i.apply_service(svc("12345-abc", Some("b.c.d"), "4.5.6.7"));
    i.publish(102);
    assert_eq!(lookup(&i, "a.b.c"), None);
    assert_eq!(
        lookup(&i, "b.c.d"),
        Some(("4.5.6.7".into(), key("12345-abc")))
    );
}

#[test]
fn moving_away_does_not_delete_another_owners_name() {
    // Reference quirk: a Service leaving a name deleted it even if another Service held it.
    let mut i = index();
    i.apply_service(svc("a", Some("a.b.c"), "1.1.1.1"));
    i.apply_service(svc("b", Some("a.b.c"), "2.2.2.2"));
    i.apply_service(svc("b", Some("b.c.d"), "2.2.2.2"));
    i.publish(101);
    assert_eq!(lookup(&i, "a.b.c"), Some(("1.1.1.1".into(), key("a"))));
}

#[test]
fn removing_the_annotation_removes_the_name() {
    let mut i = index();
    i.apply_service(svc("12345-abc-old", Some("a.b.c"), "1.2.3.4"));
    i.publish(101);
    i.apply_service(svc("12345-abc-old", None, "1.2.3.4"));
    i.publish(102);
    assert_eq!(lookup(&i, "a.b.c"), None);
    assert_eq!(i.snapshot().zones.record_names(), 0);
}

#[test]
fn deleting_what_is_absent_is_fine_and_publishes_nothing() {
    let mut i = index();
    let rx = i.subscribe();
    i.delete_service(&key("12345-abc-foo"));
    let report = i.publish(101);
    assert!(!report.published);
    assert!(!rx.has_changed().unwrap());
}

#[test]
fn delete_by_key() {
    let mut i = index();
    i.apply_service(svc("12345-abc-old", Some("a.b.c"), "1.2.3.4"));
    i.publish(101);
    i.delete_service(&key("12345-abc-old"));
    i.publish(102);
    assert_eq!(lookup(&i, "a.b.c"), None);
    assert!(i.service(&key("12345-abc-old")).is_none());
}

#[test]
fn ready_only_after_every_required_source_listed() {
    let mut i = DnsIndex::new(
        vec!["b.c".into()],
        [
            FeedSource::Services,
            FeedSource::Pods,
            FeedSource::Namespaces,
        ],
    );
    assert!(!i.is_ready());
    assert!(!i.snapshot().ready);
    // Individual events before the first listing do not make it ready.
    i.apply_service(svc("x", Some("x.b.c"), "1.1.1.1"));
    i.publish(1);
    assert!(!i.snapshot().ready);
    i.reset_services([svc("x", Some("x.b.c"), "1.1.1.1")]);
    i.reset_pods([]);
    assert!(!i.publish(2).ready);
    i.reset_namespaces([]);
    let report = i.publish(3);
    assert!(report.ready && report.published);
    assert!(i.snapshot().ready);
}

#[test]
fn services_through_the_shared_feed() {
    let mut idx = DnsIndex::new(vec!["some.domain".into()], [FeedSource::Services]);
    idx.reset_services([]);
    let feed = DnsFeed::new(idx);
    let mut rx = feed.subscribe();
    let a_of = |rx: &mut watch::Receiver<Arc<Snapshot>>, name: &str| {
        let snap = rx.borrow_and_update().clone();
        let n = fqdn_name(name).unwrap();
        snap.zones
            .find_zone(&n)
            .and_then(|z| z.node(&n))
            .and_then(|node| node.v4.first().map(ToString::to_string))
    };
    // An annotated Service appears.
    feed.apply_service(svc(
        "some-service",
        Some("some-service.some.domain"),
        "1.2.3.4",
    ));
    assert!(rx.has_changed().unwrap());
    assert_eq!(
        a_of(&mut rx, "some-service.some.domain").as_deref(),
        Some("1.2.3.4")
    );
    // The annotation changes.
    feed.apply_service(svc(
        "some-service",
        Some("some-edited-service.some.domain"),
        "1.2.3.4",
    ));
    assert_eq!(
        a_of(&mut rx, "some-edited-service.some.domain").as_deref(),
        Some("1.2.3.4")
    );
    assert_eq!(a_of(&mut rx, "some-service.some.domain"), None);
    // The Service is deleted.
    feed.delete_service(&key("some-service"));
    assert_eq!(a_of(&mut rx, "some-edited-service.some.domain"), None);
    assert_eq!(feed.snapshot().zones.record_names(), 0);
}

#[test]
fn pods_and_namespaces_do_not_rebuild_zones_or_touch_the_serial() {
    let mut i = DnsIndex::new(
        vec!["b.c".into()],
        [
            FeedSource::Services,
            FeedSource::Pods,
            FeedSource::Namespaces,
        ],
    );
    i.reset_services([svc("a", Some("a.b.c"), "1.1.1.1")]);
    i.reset_pods([(
        "foo".into(),
        "p".into(),
        vec!["10.0.0.1".parse::<IpAddr>().unwrap()],
    )]);
    i.reset_namespaces([]);
    i.publish(100);
    let before = i.snapshot();
    i.apply_pod("foo", "q", &["10.0.0.2".parse().unwrap()]);
    let annotated = BTreeMap::from([(NAMESPACE_ANNOTATION.to_string(), "bar".to_string())]);
    i.apply_namespace("foo", &annotated).unwrap();
    let report = i.publish(200);
    assert!(report.published && !report.zones_rebuilt);
    let after = i.snapshot();
    assert!(Arc::ptr_eq(&before.zones, &after.zones));
    assert_eq!(
        after.pods.namespace_of("10.0.0.2".parse().unwrap()),
        Some("foo")
    );
    assert_eq!(after.mapping.clusterset_namespace("foo"), "bar");
    i.delete_pod("foo", "q");
    i.delete_namespace("foo");
    i.publish(300);
    assert_eq!(
        i.snapshot().pods.namespace_of("10.0.0.2".parse().unwrap()),
        None
    );
    assert_eq!(i.snapshot().mapping.clusterset_namespace("foo"), "foo");
}

#[test]
fn invalid_mapping_annotations_are_returned() {
    let mut i = DnsIndex::new(vec!["b.c".into()], [FeedSource::Namespaces]);
    let bad = BTreeMap::from([(NAMESPACE_ANNOTATION.to_string(), "Not Valid".to_string())]);
    let errors = i.reset_namespaces([("foo".to_string(), bad.clone())]);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].0, "foo");
    assert!(i.apply_namespace("foo", &bad).is_err());
    let feed = DnsFeed::new(i);
    assert!(feed.apply_namespace("foo", &bad).is_err());
    assert!(feed.apply_namespace("foo", &BTreeMap::new()).is_ok());
}

#[test]
fn static_records_and_services_share_the_zones() {
    let mut i = DnsIndex::new(
        vec!["b.c".into()],
        [FeedSource::Static, FeedSource::Services],
    );
    let mut stat = svc("s.b.c", Some("s.b.c"), "9.9.9.9");
    stat.key = ServiceKey::new("", "s.b.c");
    i.set_static(vec![stat]);
    i.reset_services([
        svc("k", Some("k.b.c"), "8.8.8.8"),
        svc("s", Some("s.b.c"), "7.7.7.7"),
    ]);
    i.publish(1);
    assert!(i.snapshot().ready);
    // Static keys have an empty namespace, so they win conflicts: the operator's file rules.
    assert_eq!(
        lookup(&i, "s.b.c"),
        Some(("9.9.9.9".into(), ServiceKey::new("", "s.b.c")))
    );
    assert_eq!(lookup(&i, "k.b.c").unwrap().0, "8.8.8.8");
}

fn ready_slice(service: &str, ips: &[&str]) -> SliceInfo {
    SliceInfo {
        service: service.into(),
        cluster: None,
        endpoints: ips.iter().map(|ip| (ip.parse().unwrap(), None)).collect(),
    }
}

#[test]
fn a_binder_service_answers_only_once_a_slice_gives_it_a_ready_endpoint() {
    let mut i = index();
    i.set_binder_service(&key("web-b-c"), true);
    i.apply_service(svc("web-b-c", Some("web.b.c"), "10.97.0.7"));
    i.apply_service(svc("other", Some("other.b.c"), "10.97.0.8"));
    i.publish(101);
    // The binder's Service has no endpoint yet; a Service that is not the binder's answers.
    assert_eq!(lookup(&i, "web.b.c"), None);
    assert_eq!(
        lookup(&i, "other.b.c"),
        Some(("10.97.0.8".into(), key("other")))
    );
    // A slice of it without a ready endpoint changes nothing.
    let slice_key = ("ns".to_string(), "web-b-c-1".to_string());
    i.apply_slice(slice_key.clone(), ready_slice("web-b-c", &[]));
    i.publish(102);
    assert_eq!(lookup(&i, "web.b.c"), None);
    i.apply_slice(slice_key.clone(), ready_slice("web-b-c", &["10.250.1.2"]));
    i.publish(103);
    assert_eq!(
        lookup(&i, "web.b.c"),
        Some(("10.97.0.7".into(), key("web-b-c")))
    );
    // Its last ready endpoint gone: the name goes with it.
    i.delete_slice(&slice_key);
    i.publish(104);
    assert_eq!(lookup(&i, "web.b.c"), None);
    // A full listing that no longer calls it the binder's serves it again.
    i.reset_binder_services([]);
    i.publish(105);
    assert_eq!(
        lookup(&i, "web.b.c"),
        Some(("10.97.0.7".into(), key("web-b-c")))
    );
    // Deleted, it is forgotten, also as the binder's.
    i.delete_service(&key("web-b-c"));
    i.set_binder_service(&key("web-b-c"), true);
    i.delete_service(&key("web-b-c"));
    i.apply_service(svc("web-b-c", Some("web.b.c"), "10.97.0.7"));
    i.publish(106);
    assert_eq!(
        lookup(&i, "web.b.c"),
        Some(("10.97.0.7".into(), key("web-b-c")))
    );
}
