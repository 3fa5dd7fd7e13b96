use std::time::Duration;

use super::*;

fn service(owner: &str, name: &str, source: &str) -> api::Service {
    api::Service {
        owner_cluster: owner.into(),
        namespace: "shop".into(),
        name: name.into(),
        fqdn: format!("{name}.shop.svc.clusterset.local"),
        source: source.into(),
        ..Default::default()
    }
}

fn stamped(mut s: api::Service, at: SystemTime) -> api::Service {
    s.labels.insert(
        propagation::CHANGED_AT_ANNOTATION.into(),
        propagation::format_stamp(at),
    );
    s
}

fn doc(m: &Model, now: SystemTime) -> Value {
    serde_json::from_str(&m.render(now)).expect("the document is JSON")
}

#[test]
fn a_snapshot_replaces_what_is_shown_only_once_complete() {
    let now = SystemTime::now();
    let mut r = RegistryView::new("127.0.0.1:9443");
    r.begin_snapshot();
    r.upsert(service("b1", "web", "local"), now);
    r.upsert(service("b2", "api", "child/b2"), now);
    assert_eq!(
        r.counts(),
        (0, 0),
        "nothing shown before the snapshot completes"
    );
    r.snapshot_complete(now);
    assert_eq!(r.counts(), (1, 1));
    assert_eq!(r.status, Status::Live);
    // A resync: the old rows stay until the new snapshot is complete, then only it is shown.
    r.begin_snapshot();
    r.upsert(service("b1", "cart", "local"), now);
    assert_eq!(r.counts(), (1, 1));
    r.snapshot_complete(now);
    assert_eq!(r.counts(), (1, 0));
    // Live: a service that changes source moves between the lists; a delete removes it.
    r.upsert(service("b1", "cart", "remote/east"), now);
    assert_eq!(r.counts(), (0, 1));
    r.delete(&service("b1", "cart", "remote/east"));
    assert_eq!(r.counts(), (0, 0));
}

#[test]
fn live_imports_with_a_stamp_are_latency_samples_and_snapshots_are_not() {
    let t0 = UNIX_EPOCH + Duration::from_secs(1_790_000_000);
    let mut m = Model::new(&["a:1".to_string()]);
    let r = &mut m.registries[0];
    r.begin_snapshot();
    // Stamped long before the dashboard looked: not a propagation the dashboard saw.
    r.upsert(
        stamped(service("east", "old", "remote/east"), t0),
        t0 + Duration::from_secs(30),
    );
    r.snapshot_complete(t0);
    for (name, ms) in [("a", 120), ("b", 40), ("c", 900)] {
        let s = stamped(service("east", name, "remote/east"), t0);
        r.upsert(s, t0 + Duration::from_millis(ms));
    }
    // Local exports and unstamped imports are not samples.
    r.upsert(
        stamped(service("b1", "web", "local"), t0),
        t0 + Duration::from_secs(5),
    );
    r.upsert(
        service("east", "plain", "remote/east"),
        t0 + Duration::from_secs(5),
    );
    // A stamp two hours old is a clock problem, counted as skew, not a latency.
    r.upsert(
        stamped(service("west", "x", "remote/west"), t0),
        t0 + Duration::from_secs(7200),
    );
    let d = doc(&m, t0);
    assert_eq!(
        d["registries"][0]["propagation"],
        json!([
            {"source": "remote/east", "count": 3, "skewed": 0, "lastMs": 900, "medianMs": 120,
             "maxMs": 900, "window": 3},
            {"source": "remote/west", "count": 0, "skewed": 1, "lastMs": null, "medianMs": null,
             "maxMs": null, "window": 0},
        ])
    );
}

#[test]
fn samples_and_sources_are_bounded() {
    let t0 = UNIX_EPOCH + Duration::from_secs(1_790_000_000);
    let mut r = RegistryView::new("a:1");
    r.snapshot_complete(t0);
    for i in 0..(SAMPLES as u64 + 10) {
        r.upsert(
            stamped(service("east", "a", "remote/east"), t0),
            t0 + Duration::from_millis(i),
        );
    }
    for i in 0..(MAX_SOURCES + 10) {
        r.upsert(
            stamped(service("x", &format!("s{i}"), &format!("remote/{i}")), t0),
            t0,
        );
    }
    assert_eq!(r.propagation.len(), MAX_SOURCES);
    let east = &r.propagation["remote/east"];
    assert_eq!(
        (east.recent.len(), east.count),
        (SAMPLES, SAMPLES as u64 + 10)
    );
    assert_eq!(east.recent.front(), Some(&0.01));
}

#[test]
fn lists_and_strings_sent_to_the_page_are_capped() {
    let now = SystemTime::now();
    let mut m = Model::new(&["a:1".to_string()]);
    let r = &mut m.registries[0];
    r.snapshot_complete(now);
    for i in 0..(MAX_ROWS + 5) {
        r.upsert(service("b1", &format!("svc{i:04}"), "local"), now);
    }
    let long = "é".repeat(MAX_TEXT + 50);
    r.upsert(service(&long, "zz", "remote/east"), now);
    let d = doc(&m, now);
    let exports = &d["registries"][0]["exports"];
    assert_eq!(exports["total"], MAX_ROWS + 5);
    assert_eq!(exports["rows"].as_array().map(Vec::len), Some(MAX_ROWS));
    let owner = d["registries"][0]["imports"]["rows"][0]["owner"]
        .as_str()
        .expect("a string");
    assert_eq!(owner.chars().count(), MAX_TEXT + 1);
    assert!(owner.ends_with('…'));
}

fn tree(cluster: &str, parent: &str, children: &[(&str, &[&str])]) -> api::Tree {
    api::Tree {
        cluster: cluster.into(),
        parent: parent.into(),
        parent_state: if parent.is_empty() { "" } else { "CONNECTED" }.into(),
        children: children
            .iter()
            .map(|(c, sub)| api::Child {
                cluster: c.to_string(),
                subtree: sub.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn names(nodes: &Value) -> Value {
    Value::Array(
        nodes
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| {
                if n["children"].as_array().is_some_and(|c| c.is_empty()) {
                    n["cluster"].clone()
                } else {
                    json!({n["cluster"].as_str().unwrap_or("?"): names(&n["children"])})
                }
            })
            .collect(),
    )
}

#[test]
fn the_federation_tree_is_assembled_from_every_registry_read() {
    // The demo's hierarchy, read at the root, at b and at c1.
    let mut regs = vec![
        RegistryView::new("root"),
        RegistryView::new("b"),
        RegistryView::new("c1"),
    ];
    regs[0].tree = Some(tree(
        "root",
        "",
        &[("b", &["b", "b1", "b2"]), ("c", &["c", "c1"])],
    ));
    regs[1].tree = Some(tree("b", "root", &[("b1", &["b1"]), ("b2", &["b2"])]));
    regs[2].tree = Some(tree("c1", "c", &[]));
    let t = federation(&regs);
    assert_eq!(
        names(&t),
        json!([{"root": [{"b": ["b1", "b2"]}, {"c": ["c1"]}]}])
    );
    assert_eq!(t[0]["shown"], true);
    let c = &t[0]["children"][1];
    assert_eq!(
        (c["cluster"].as_str(), &c["shown"]),
        (Some("c"), &json!(false))
    );
    // c1 is placed by its own registry (parent c), not inferred from c's subtree.
    assert_eq!(c["children"][0]["inferred"], false);

    // Only the root read: the grandchildren are placed under their child, marked inferred.
    let t = federation(&regs[..1]);
    assert_eq!(
        names(&t),
        json!([{"root": [{"b": ["b1", "b2"]}, {"c": ["c1"]}]}])
    );
    assert_eq!(t[0]["children"][0]["children"][0]["inferred"], true);
}

#[test]
fn a_cycle_or_a_hostile_subtree_does_not_hang_or_grow_the_tree_without_bound() {
    let mut regs = vec![RegistryView::new("a"), RegistryView::new("b")];
    regs[0].tree = Some(tree("a", "b", &[]));
    regs[1].tree = Some(tree("b", "a", &[]));
    let t = federation(&regs);
    assert_eq!(names(&t), json!([{"a": ["b"]}]));

    let many: Vec<String> = (0..5000).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let mut hostile = RegistryView::new("x");
    hostile.tree = Some(tree("x", "", &[("evil", &refs)]));
    let t = federation(std::slice::from_ref(&hostile));
    let below = t[0]["children"][0]["children"].as_array().map(Vec::len);
    assert!(below.is_some_and(|n| n < MAX_TREE_NODES), "{below:?}");
}

#[test]
fn refusals_carry_the_failed_check_and_the_policy_ids() {
    let mut m = Model::new(&["c:1".to_string()]);
    let mut t = tree("c", "root", &[]);
    t.refused.push(api::RefusedEntry {
        kind: "announcement".into(),
        cluster: "c".into(),
        namespace: "data".into(),
        name: "db".into(),
        code: "PERMISSION_DENIED".into(),
        reason: "<img src=x onerror=alert(1)>".into(),
        check: "announce".into(),
        policy_ids: vec!["policy0".into(), "forbid-db".into()],
        refused_by: "root".into(),
        ..Default::default()
    });
    m.registries[0].tree = Some(t);
    let d = doc(&m, SystemTime::now());
    assert_eq!(
        d["registries"][0]["refused"]["rows"][0],
        json!({"kind": "announcement", "entry": "c/data/db", "fqdn": "", "code": "PERMISSION_DENIED",
               "check": "announce", "policies": ["policy0", "forbid-db"], "refusedBy": "root",
               "reason": "<img src=x onerror=alert(1)>", "at": null})
    );
}
