use super::*;
use crate::catalog::NamedPort;
use std::time::SystemTime;

fn identity() -> WorkloadIdentity {
    WorkloadIdentity {
        trust_domain: "cluster.local".into(),
        namespace: "storefront".into(),
        service_account: "web-sa".into(),
    }
}

fn route() -> OwnerRoute {
    OwnerRoute {
        target_namespace: "shop".into(),
        target_service: "api".into(),
        caller_cluster: "b1".into(),
        caller_service: "web".into(),
        caller_identity: Some(identity()),
        exported: ExportedService {
            fqdn: "api.shop.svc.clusterset.local".into(),
            service: Some("api-svc".into()),
            ports: vec![
                NamedPort {
                    name: "dns".into(),
                    port: 53,
                    protocol: "UDP".into(),
                    target_port: 0,
                },
                NamedPort {
                    name: "http".into(),
                    port: 8080,
                    protocol: "TCP".into(),
                    target_port: 0,
                },
            ],
            selector: Some("app.kubernetes.io/name=api,tier=backend".into()),
        },
        resolver_cluster: "b".into(),
        since: SystemTime::UNIX_EPOCH,
        applied: vec![],
    }
}

fn config(mode: GrantMode) -> GrantConfig {
    GrantConfig {
        mode,
        gateway: Some(GatewayRef {
            namespace: "gateways".into(),
            name: "mesh".into(),
        }),
        trust_domain: DEFAULT_TRUST_DOMAIN.into(),
    }
}

/// The error of `r`, as its message.
fn err<T: std::fmt::Debug>(r: Result<T, GrantError>) -> String {
    r.expect_err("an error").to_string()
}

fn one(mode: GrantMode, r: &OwnerRoute) -> Value {
    let mut objects = objects(&config(mode), r).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(objects.len(), 1);
    objects.remove(0)
}

#[test]
fn names_are_prefix_and_hash8_of_the_parts() {
    let expect = xcc_proto::names::policy_object_name("allow-to-", &["shop", "api", "b1", "web"]);
    assert!(expect.starts_with("allow-to-") && expect.len() == "allow-to-".len() + 8);
    let o = one(GrantMode::Istio, &route());
    assert_eq!(o["metadata"]["name"], expect.as_str());
    assert_eq!(o["metadata"]["namespace"], "shop");
    assert_eq!(o["metadata"]["labels"][SOURCE_NAME_LABEL], "api");
    assert_eq!(o["metadata"]["annotations"][CALLER_ANNOTATION], "b1/web");
    assert_eq!(
        objects(&config(GrantMode::None), &route()).expect("no objects"),
        Vec::<Value>::new()
    );
    // What a revocation removes names exactly the objects a grant writes.
    for mode in [GrantMode::Istio, GrantMode::Gateway, GrantMode::Cilium] {
        let o = one(mode, &route());
        let k = &object_keys(mode, &route())[0];
        assert_eq!(
            (
                &k["apiVersion"],
                &k["kind"],
                &k["metadata"]["name"],
                &k["metadata"]["namespace"]
            ),
            (
                &o["apiVersion"],
                &o["kind"],
                &o["metadata"]["name"],
                &o["metadata"]["namespace"]
            )
        );
    }
    assert!(object_keys(GrantMode::None, &route()).is_empty());
}

#[test]
fn istio_admits_the_callers_workload_identity_on_the_exported_pods() {
    let o = one(GrantMode::Istio, &route());
    assert_eq!(
        (&o["apiVersion"], &o["kind"]),
        (
            &json!("security.istio.io/v1"),
            &json!("AuthorizationPolicy")
        )
    );
    assert_eq!(
        o["spec"],
        json!({
            "selector": {"matchLabels": {"app.kubernetes.io/name": "api", "tier": "backend"}},
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": [
                "cluster.local/ns/storefront/sa/web-sa"
            ]}}]}],
        })
    );
}

#[test]
fn gateway_routes_the_exported_fqdn_to_the_exporting_service_on_the_configured_gateway() {
    let o = one(GrantMode::Gateway, &route());
    assert_eq!(o["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(
        o["spec"],
        json!({
            "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                            "namespace": "gateways", "name": "mesh"}],
            "hostnames": ["api.shop.svc.clusterset.local"],
            "rules": [{"backendRefs": [{"group": "", "kind": "Service", "name": "api-svc", "port": 8080}]}],
        })
    );
    // The route exposes the service; it does not depend on a caller identity.
    let mut anonymous = route();
    anonymous.caller_identity = None;
    assert_eq!(one(GrantMode::Gateway, &anonymous)["spec"], o["spec"]);
    let mut not_a_service = route();
    not_a_service.exported.service = None;
    assert_eq!(
        err(objects(&config(GrantMode::Gateway), &not_a_service)),
        "the export api.shop.svc.clusterset.local is not a Service: an HTTPRoute needs a Service backend"
    );
    let mut udp_only = route();
    udp_only.exported.ports.truncate(1);
    assert_eq!(
        err(objects(&config(GrantMode::Gateway), &udp_only)),
        "the export api.shop.svc.clusterset.local has no TCP port"
    );
    let no_gateway = GrantConfig::new(GrantMode::Gateway);
    assert_eq!(
        err(objects(&no_gateway, &route())),
        "no Gateway configured (--grant-gateway)"
    );
    assert_eq!(
        err(no_gateway.check()),
        "--grant-mode gateway needs --grant-gateway <namespace>/<name>"
    );
}

#[test]
fn cilium_admits_the_callers_cluster_namespace_and_service_account() {
    let o = one(GrantMode::Cilium, &route());
    assert_eq!(o["apiVersion"], "cilium.io/v2");
    assert_eq!(
        o["spec"],
        json!({
            "endpointSelector": {"matchLabels": {"app.kubernetes.io/name": "api", "tier": "backend"}},
            "ingress": [{"fromEndpoints": [{"matchLabels": {
                "io.cilium.k8s.policy.cluster": "b1",
                "k8s:io.kubernetes.pod.namespace": "storefront",
                "io.cilium.k8s.policy.serviceaccount": "web-sa",
            }}]}],
        })
    );
    assert!(object_ref(&o).starts_with("CiliumNetworkPolicy/shop/cnp-mesh-"));
}

#[test]
fn no_identity_no_selector_or_a_foreign_trust_domain_write_nothing() {
    for mode in [GrantMode::Istio, GrantMode::Cilium] {
        let mut anonymous = route();
        anonymous.caller_identity = None;
        assert!(matches!(
            objects(&config(mode), &anonymous),
            Err(GrantError::NoIdentity { caller }) if caller == "b1/web"
        ));
        assert_eq!(
            err(objects(&config(mode), &anonymous)),
            "b1/web asked without a workload identity: there is no principal to admit"
        );
        let mut foreign = route();
        foreign.caller_identity = Some(WorkloadIdentity {
            trust_domain: "a.mesh".into(),
            ..identity()
        });
        assert_eq!(
            err(objects(&config(mode), &foreign)),
            "b1/web claims a.mesh/ns/storefront/sa/web-sa, but the workloads of cluster b1 are in trust domain \"cluster.local\""
        );
        let mut unselected = route();
        unselected.exported.selector = None;
        let e = err(objects(&config(mode), &unselected));
        assert!(
            e.starts_with(
                "the export api.shop.svc.clusterset.local has no \
                     connectivity.tanzu.vmware.com/workload-selector annotation"
            ),
            "{e}"
        );
        unselected.exported.selector = Some("app=api,*=x".into());
        assert_eq!(
            err(objects(&config(mode), &unselected)),
            "the export api.shop.svc.clusterset.local: connectivity.tanzu.vmware.com/workload-selector: \"*=x\" is not a label key and value"
        );
    }
    // A trust domain per cluster: b1's workloads are in b1.mesh.
    let per_cluster = GrantConfig {
        trust_domain: "{cluster}.mesh".into(),
        ..config(GrantMode::Istio)
    };
    per_cluster.check().expect("a DNS name for every cluster");
    let mut r = route();
    assert!(objects(&per_cluster, &r).is_err());
    r.caller_identity = Some(WorkloadIdentity {
        trust_domain: "b1.mesh".into(),
        ..identity()
    });
    let o = &objects(&per_cluster, &r).unwrap_or_default()[0];
    assert_eq!(
        o["spec"]["rules"][0]["from"][0]["source"]["principals"][0],
        "b1.mesh/ns/storefront/sa/web-sa"
    );
    assert!(
        GrantConfig {
            trust_domain: "{cluster}/x".into(),
            ..config(GrantMode::Istio)
        }
        .check()
        .is_err()
    );
}

#[test]
fn workload_identities_from_the_wire_are_checked() {
    assert_eq!(WorkloadIdentity::from_wire("", "", ""), Ok(None));
    assert_eq!(
        WorkloadIdentity::from_wire("cluster.local", "storefront", "web-sa"),
        Ok(Some(identity()))
    );
    assert_eq!(
        WorkloadIdentity::to_wire(Some(&identity())),
        ("cluster.local".into(), "storefront".into(), "web-sa".into())
    );
    assert_eq!(
        WorkloadIdentity::from_wire("", "storefront", "web-sa"),
        Err(IdentityError {
            field: "trust domain",
            value: String::new(),
            rule: "a DNS name"
        })
    );
    assert_eq!(
        WorkloadIdentity::from_wire("", "storefront", "web-sa")
            .expect_err("an empty trust domain")
            .to_string(),
        r#"workload trust domain "" is not a DNS name"#
    );
    let long = "a".repeat(64);
    for (td, ns, sa) in [
        ("cluster.local", "", "web"),
        ("cluster.local", "ns", ""),
        ("Cluster.Local", "ns", "web"),
        ("spiffe://cluster.local", "ns", "web"),
        ("cluster.local/ns/x", "ns", "web"),
        ("*", "ns", "web"),
        ("cluster.local", "a.b", "web"),
        ("cluster.local", "ns", "web/sa/x"),
        ("cluster.local", "ns", "*"),
        ("cluster.local", long.as_str(), "web"),
        ("cluster.local", "ns", long.as_str()),
        (&format!("{}.local", "a.".repeat(130)), "ns", "web"),
    ] {
        assert!(
            WorkloadIdentity::from_wire(td, ns, sa).is_err(),
            "{td:?} {ns:?} {sa:?}"
        );
    }
}

#[test]
fn file_grants_write_the_objects_and_remove_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = FileGrants::new(dir.path(), config(GrantMode::Istio)).expect("sink");
    let refs = sink.apply(&route()).expect("apply");
    let want = one(GrantMode::Istio, &route());
    assert_eq!(refs, [object_ref(&want)]);
    let files: Vec<_> = std::fs::read_dir(dir.path().join("grants"))
        .expect("dir")
        .flatten()
        .collect();
    assert_eq!(files.len(), 1);
    assert_eq!(
        files[0].file_name().to_string_lossy(),
        format!(
            "shop.{}.yaml",
            want["metadata"]["name"].as_str().unwrap_or_default()
        )
    );
    let text = std::fs::read_to_string(files[0].path()).expect("read");
    let written: Value = yaml_serde::from_str(&text).expect("yaml");
    assert_eq!(written, want, "the same object as kube mode computes");
    // Without an identity nothing is written, and the reason is the error.
    let mut anonymous = route();
    anonymous.caller_service = "batch".into();
    anonymous.caller_identity = None;
    assert!(sink.apply(&anonymous).is_err());
    sink.remove(&route()).expect("remove");
    assert_eq!(
        std::fs::read_dir(dir.path().join("grants"))
            .expect("dir")
            .count(),
        0
    );
    sink.remove(&route()).expect("idempotent");
}

#[test]
fn route_names_follow_the_kubernetes_rules() {
    check_route(&route()).expect("a good route");
    let with = |f: &dyn Fn(&mut OwnerRoute)| {
        let mut r = route();
        f(&mut r);
        check_route(&r)
    };
    assert_eq!(
        err(with(&|r| r.target_namespace = "/etc".into())),
        r#"route target namespace "/etc" is not a namespace name (DNS-1123 label)"#
    );
    for bad_ns in ["..", "../x", "a/b", "", "Shop", "a.b", &"a".repeat(64)] {
        assert!(
            with(&|r| r.target_namespace = bad_ns.into()).is_err(),
            "{bad_ns}"
        );
    }
    for bad_service in ["", "..", "a/b", "API", &"a".repeat(64)] {
        assert!(
            with(&|r| r.target_service = bad_service.into()).is_err(),
            "{bad_service}"
        );
    }
    assert!(with(&|r| r.caller_cluster = "b1/x".into()).is_err());
    assert!(with(&|r| r.caller_service = "web\n".into()).is_err());
    with(&|r| r.caller_service.clear()).expect("a cluster-wide grant");
    with(&|r| r.target_service = "api.v2".into()).expect("a dotted service name");
    assert_eq!(
        err(with(&|r| r.caller_identity = Some(WorkloadIdentity {
            namespace: "a/b".into(),
            ..identity()
        }))),
        r#"route caller workload namespace "a/b" is not a namespace name (DNS-1123 label)"#
    );
}

#[test]
fn file_grants_refuse_hostile_names_without_touching_the_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = FileGrants::new(&dir.path().join("state"), config(GrantMode::Istio)).expect("sink");
    let mut r = route();
    r.target_namespace = dir.path().join("abs").display().to_string();
    assert!(sink.apply(&r).is_err());
    r.target_namespace = "../../x".into();
    assert!(sink.apply(&r).is_err());
    assert!(sink.remove(&r).is_err());
    // Only the (empty) grants directory exists.
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    assert_eq!(
        std::fs::read_dir(dir.path().join("state/grants"))
            .expect("dir")
            .count(),
        0
    );
}

#[test]
fn gateway_refs_parse_namespace_and_name() {
    assert_eq!(
        "gateways/mesh".parse::<GatewayRef>().expect("a Gateway"),
        GatewayRef {
            namespace: "gateways".into(),
            name: "mesh".into(),
        }
    );
    assert_eq!(
        err("mesh".parse::<GatewayRef>()),
        r#"gateway "mesh": use <namespace>/<name> of a Gateway (a namespace and an object name)"#
    );
    assert_eq!(
        err("envoy".parse::<GrantMode>()),
        r#"grant mode "envoy": use none, istio, gateway or cilium"#
    );
    for bad in ["mesh", "/mesh", "gateways/", "a/b/c", "A/mesh", "ns/Mesh"] {
        assert!(bad.parse::<GatewayRef>().is_err(), "{bad}");
    }
}
