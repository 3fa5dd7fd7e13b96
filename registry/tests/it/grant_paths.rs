//! Hostile route notifications at the owner: a notification from the parent
//! link names the namespace and service a grant is written for, so a hostile or compromised
//! parent could aim a grant file anywhere. Each attack goes through the same handler a parent
//! session feeds (`Level::on_parent_message`) with file-mode grants in a temporary state
//! directory; the test then lists every file under that directory. No network is involved.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use xcc_proto::names::{WORKLOAD_SELECTOR_ANNOTATION, policy_object_name};
use xcc_proto::xcc::federation::v1 as fed;
use xcc_registry::Catalog;
use xcc_registry::authz::{Gate, Policies};
use xcc_registry::catalog::{ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::Level;
use xcc_registry::federation::grants::{FileGrants, GrantConfig, GrantMode};

/// The owner `b2`, exporting `shop/api`, writing Istio grants under `state/grants/`.
fn owner(state: &Path) -> Level {
    let catalog = Catalog::new();
    catalog.upsert(ServiceEntry {
        key: ServiceKey::new("b2", "shop", "api"),
        source: Source::Local,
        fqdn: "api.shop.svc.clusterset.local".into(),
        endpoints: vec![],
        ports: vec![],
        labels: [(WORKLOAD_SELECTOR_ANNOTATION, "app=api")]
            .into_iter()
            .collect(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    });
    let level = Level::new(
        "b2",
        None,
        catalog,
        Gate::new(
            "xcc.test",
            Arc::new(RwLock::new(Arc::new(Policies::default_set()))),
        ),
    );
    level.set_grant_sink(Arc::new(
        FileGrants::new(state, GrantConfig::new(GrantMode::Istio)).expect("grants dir"),
    ));
    level
}

fn notification(namespace: &str, service: &str) -> fed::ParentMessage {
    fed::ParentMessage {
        payload: Some(fed::parent_message::Payload::RouteNotification(
            fed::RouteNotification {
                target_namespace: namespace.into(),
                target_service: service.into(),
                caller_cluster: "b1".into(),
                caller_service: "web".into(),
                revoked: false,
                route_id: 1,
                target_cluster: "b2".into(),
                resolver_cluster: "b".into(),
                caller_trust_domain: "cluster.local".into(),
                caller_namespace: "storefront".into(),
                caller_service_account: "web".into(),
            },
        )),
    }
}

/// Every regular file below `dir`, relative to it, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path.strip_prefix(dir).expect("below").to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_grant_for_an_own_export_is_written_under_grants() {
    let root = tempfile::tempdir().expect("tempdir");
    let state = root.path().join("state");
    let b2 = owner(&state);
    b2.on_parent_message(notification("shop", "api"))
        .expect("handled");
    assert_eq!(b2.owner_routes().len(), 1);
    let files = files_under(root.path());
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with("state/grants"), "{files:?}");
}

#[test]
fn hostile_namespaces_and_unexported_services_write_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let state = root.path().join("state");
    let b2 = owner(&state);
    let outside = root.path().join("outside");
    let attacks = [
        // An absolute namespace: the joined path would leave grants/ entirely.
        (outside.display().to_string(), "api".to_string()),
        // Relative escapes out of grants/ and out of the state directory.
        ("../../outside".to_string(), "api".to_string()),
        ("..".to_string(), "api".to_string()),
        ("shop/../..".to_string(), "api".to_string()),
        // A hostile service name (it becomes a label value and part of the object name hash).
        ("shop".to_string(), "../api".to_string()),
        ("shop".to_string(), String::new()),
        // Services this cluster never exported: valid names, but not ours to grant.
        ("kube-system".to_string(), "coredns".to_string()),
        ("shop".to_string(), "cart".to_string()),
    ];
    for (namespace, service) in &attacks {
        b2.on_parent_message(notification(namespace, service))
            .expect("handled without error for the session");
    }
    assert!(
        b2.owner_routes().is_empty(),
        "no route recorded: {:?}",
        b2.owner_routes()
    );
    assert_eq!(files_under(root.path()), Vec::<PathBuf>::new());
    assert!(!outside.exists());
    // The link stays usable: a legitimate grant after the attacks is written.
    b2.on_parent_message(notification("shop", "api"))
        .expect("handled");
    assert_eq!(b2.owner_routes().len(), 1);
    assert_eq!(files_under(&state.join("grants")).len(), 1);
}

#[test]
fn a_hostile_revocation_removes_nothing_outside_grants() {
    let root = tempfile::tempdir().expect("tempdir");
    let state = root.path().join("state");
    let b2 = owner(&state);
    // The file an unchecked `grants/<namespace>.<name>.yaml` would resolve to for namespace
    // `../x`: `state/x.<name>.yaml`, one level above grants/.
    let name = policy_object_name("allow-to-", &["../x", "api", "b1", "web"]);
    let victim = state.join(format!("x.{name}.yaml"));
    std::fs::write(&victim, "keep").expect("write");
    let mut msg = notification("../x", "api");
    if let Some(fed::parent_message::Payload::RouteNotification(n)) = &mut msg.payload {
        n.revoked = true;
    }
    b2.on_parent_message(msg).expect("handled");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("still there"),
        "keep"
    );
}

/// A child's announcement carries the key of the entry a parent stores (and later routes grants
/// for): each part must be the Kubernetes name it stands for.
#[test]
fn announcements_with_path_like_names_are_refused() {
    use xcc_registry::federation::convert::entry_from_announcement;
    let good = fed::ServiceAnnouncement {
        cluster: "b1".into(),
        namespace: "shop".into(),
        name: "api".into(),
        endpoints: vec!["10.0.0.1:443".into()],
        ..Default::default()
    };
    let source = || Source::Child("b1".into());
    assert!(entry_from_announcement(&good, source()).is_ok());
    let with = |f: &dyn Fn(&mut fed::ServiceAnnouncement)| {
        let mut a = good.clone();
        f(&mut a);
        entry_from_announcement(&a, source()).map_err(|e| e.to_string())
    };
    assert_eq!(
        with(&|a| a.namespace = "../../x".into()).err().as_deref(),
        Some(r#"namespace "../../x" is not a namespace name (DNS-1123 label)"#)
    );
    assert_eq!(
        with(&|a| a.name = "/etc/passwd".into()).err().as_deref(),
        Some(r#"name "/etc/passwd" is not an object name (DNS-1123 subdomain)"#)
    );
    assert_eq!(
        with(&|a| a.cluster = "b1/../b2".into()).err().as_deref(),
        Some(r#"cluster "b1/../b2" is not a cluster name (DNS-1123 label)"#)
    );
    assert!(with(&|a| a.namespace = String::new()).is_err());
}
