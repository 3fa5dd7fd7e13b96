use super::*;

use crate::federation::grants::{ExportedService, GatewayRef, GrantMode, WorkloadIdentity};

fn route(caller: &str) -> OwnerRoute {
    OwnerRoute {
        target_namespace: "shop".into(),
        target_service: "api".into(),
        caller_cluster: caller.into(),
        caller_service: "web".into(),
        caller_identity: Some(WorkloadIdentity {
            trust_domain: "cluster.local".into(),
            namespace: "web".into(),
            service_account: "web".into(),
        }),
        exported: ExportedService {
            fqdn: "api.shop.svc.clusterset.local".into(),
            service: Some("api".into()),
            ports: vec![crate::catalog::NamedPort {
                name: "http".into(),
                port: 80,
                protocol: "TCP".into(),
                target_port: 0,
            }],
            selector: Some("app=api".into()),
        },
        resolver_cluster: "b".into(),
        since: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
        applied: vec![],
    }
}

fn config(mode: GrantMode) -> GrantConfig {
    GrantConfig {
        gateway: Some(GatewayRef {
            namespace: "gw".into(),
            name: "mesh".into(),
        }),
        ..GrantConfig::new(mode)
    }
}

fn desired(mode: GrantMode) -> Value {
    desired_objects(&config(mode), &route("b1"))
        .unwrap_or_default()
        .remove(0)
}

#[test]
fn resources_of_every_mode() {
    let got: Vec<(String, String, String)> =
        [GrantMode::Istio, GrantMode::Gateway, GrantMode::Cilium]
            .into_iter()
            .map(|m| {
                let ar = api_resource(&desired(m)).unwrap_or_else(|e| panic!("{e}"));
                (ar.group, ar.version, ar.plural)
            })
            .collect();
    let want = [
        ("security.istio.io", "v1", "authorizationpolicies"),
        ("gateway.networking.k8s.io", "v1", "httproutes"),
        ("cilium.io", "v2", "ciliumnetworkpolicies"),
    ]
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(got, want);
    assert_eq!(
        desired_objects(&config(GrantMode::None), &route("b1")).expect("no objects"),
        Vec::<Value>::new()
    );
    let pod = api_resource(&json!({"apiVersion": "v1", "kind": "Pod"}));
    assert!(matches!(&pod, Err(KubeGrantError::UnknownKind(k)) if k == "Pod"));
    assert_eq!(
        pod.expect_err("not a grant kind").to_string(),
        "no resource known for kind \"Pod\""
    );
}

#[test]
fn objects_carry_our_label_and_compare_on_owned_fields() {
    let o = &desired(GrantMode::Istio);
    assert!(is_ours(o));
    assert!(!is_ours(
        &objects(&config(GrantMode::Istio), &route("b1")).unwrap_or_default()[0]
    ));
    let mut current = o.clone();
    current["metadata"]["labels"]["extra"] = json!("x");
    current["metadata"]["resourceVersion"] = json!("7");
    assert!(up_to_date(&current, o));
    current["spec"]["action"] = json!("DENY");
    assert!(!up_to_date(&current, o));
    let mut relabelled = o.clone();
    relabelled["metadata"]["labels"][MANAGED_BY_LABEL] = json!("someone");
    assert!(!up_to_date(&relabelled, o));
}

#[test]
fn grants_merge_keeps_since_and_order() {
    let added = merged_grants(&[], &route("b2"), true).unwrap_or_default();
    assert_eq!(added.len(), 1);
    assert_eq!(
        serde_json::to_value(&added[0]).unwrap_or_default(),
        json!({"callerCluster": "b2", "callerService": "web", "since": "2023-11-14T22:13:20Z"})
    );
    let mut later = route("b1");
    later.since += Duration::from_secs(3600);
    let both = merged_grants(&added, &later, true).unwrap_or_default();
    let callers: Vec<&str> = both.iter().map(|g| g.caller_cluster.as_str()).collect();
    assert_eq!(callers, ["b1", "b2"]);
    assert_eq!(merged_grants(&both, &later, true), None);
    let mut again = route("b2");
    again.since += Duration::from_secs(60);
    assert_eq!(merged_grants(&both, &again, true), None, "since is kept");
    let left = merged_grants(&both, &route("b2"), false).unwrap_or_default();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].caller_cluster, "b1");
    assert_eq!(merged_grants(&left, &route("b2"), false), None);
    let mut cluster_wide = route("b1");
    cluster_wide.caller_service.clear();
    let three = merged_grants(&left, &cluster_wide, true).unwrap_or_default();
    assert_eq!(three[0].caller_service, None);
    assert_eq!(three.len(), 2);
}
