use serde_json::json;

use super::*;

fn service(v: serde_json::Value) -> Service {
    serde_json::from_value(v).unwrap()
}

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

#[test]
fn only_annotated_services_count_and_only_our_annotations_are_kept() {
    let plain = service(json!({
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "annotations": {"x": "y"}},
        "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"]}
    }));
    assert_eq!(service_info(&plain), None);
    let no_annotations = service(json!({"metadata": {"name": "a", "namespace": "b"}}));
    assert_eq!(service_info(&no_annotations), None);
    // One origin annotation alone is not enough.
    let half = service(json!({
        "metadata": {"name": "a", "namespace": "b", "annotations": {ORIGIN_NAME_ANNOTATION: "web"}}
    }));
    assert_eq!(service_info(&half), None);

    let svc = service(json!({
        "metadata": {
            "name": "web-xcc-test-1234abcd",
            "namespace": "cross-cluster-connectivity",
            "annotations": {
                FQDN_ANNOTATION: "web.xcc.test",
                ORIGIN_NAMESPACE_ANNOTATION: "bar",
                ORIGIN_NAME_ANNOTATION: "web",
                "kubectl.kubernetes.io/last-applied-configuration": "{…}"
            }
        },
        "spec": {
            "clusterIP": "10.96.1.1",
            "clusterIPs": ["10.96.1.1", "fd00::1"],
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "", "port": 9000},
                {"port": 70000}
            ]
        }
    }));
    let info = service_info(&svc).unwrap();
    assert_eq!(
        info.key,
        ServiceKey::new("cross-cluster-connectivity", "web-xcc-test-1234abcd")
    );
    assert_eq!(
        info.annotations,
        NameAnnotations {
            fqdn: Some("web.xcc.test".into()),
            origin_namespace: Some("bar".into()),
            origin_name: Some("web".into()),
        }
    );
    assert_eq!(
        info.cluster_ips,
        vec![
            "10.96.1.1".parse::<IpAddr>().unwrap(),
            "fd00::1".parse().unwrap()
        ]
    );
    assert_eq!(
        info.ports,
        vec![
            NamedPort {
                name: Some("http".into()),
                port: 80,
                protocol: PortProtocol::Tcp
            },
            NamedPort {
                name: Some("dns".into()),
                port: 53,
                protocol: PortProtocol::Udp
            },
            NamedPort {
                name: None,
                port: 9000,
                protocol: PortProtocol::Tcp
            },
        ]
    );
}

#[test]
fn cluster_ip_fallbacks_and_headless_services() {
    let single = service(json!({
        "metadata": {"name": "a", "namespace": "n", "annotations": {FQDN_ANNOTATION: "a.xcc.test"}},
        "spec": {"clusterIP": "10.0.0.1"}
    }));
    assert_eq!(service_info(&single).unwrap().cluster_ips.len(), 1);
    let headless = service(json!({
        "metadata": {"name": "a", "namespace": "n", "annotations": {FQDN_ANNOTATION: "a.xcc.test"}},
        "spec": {"clusterIP": "None", "clusterIPs": ["None"]}
    }));
    // Kept (so the zone build reports it), with no address.
    assert!(service_info(&headless).unwrap().cluster_ips.is_empty());
}

#[test]
fn pods_are_indexed_by_their_addresses_unless_host_network_or_finished() {
    let running = pod(json!({
        "metadata": {"name": "p", "namespace": "foo"},
        "spec": {"containers": []},
        "status": {"phase": "Running", "podIP": "10.244.0.5",
                   "podIPs": [{"ip": "10.244.0.5"}, {"ip": "fd00:10:244::5"}]}
    }));
    let (ns, name, ips) = pod_addresses(&running).unwrap();
    assert_eq!((ns.as_str(), name.as_str(), ips.len()), ("foo", "p", 2));
    let only_pod_ip = pod(json!({
        "metadata": {"name": "p", "namespace": "foo"},
        "status": {"phase": "Running", "podIP": "10.244.0.6"}
    }));
    assert_eq!(
        pod_addresses(&only_pod_ip).unwrap().2,
        vec!["10.244.0.6".parse::<IpAddr>().unwrap()]
    );
    let host = pod(json!({
        "metadata": {"name": "p", "namespace": "kube-system"},
        "spec": {"hostNetwork": true, "containers": []},
        "status": {"phase": "Running", "podIP": "172.18.0.2"}
    }));
    assert_eq!(pod_addresses(&host), None);
    for phase in ["Succeeded", "Failed"] {
        let done = pod(json!({
            "metadata": {"name": "p", "namespace": "foo"},
            "status": {"phase": phase, "podIP": "10.244.0.7"}
        }));
        assert_eq!(pod_addresses(&done), None, "{phase}");
    }
    let pending =
        pod(json!({"metadata": {"name": "p", "namespace": "foo"}, "status": {"phase": "Pending"}}));
    assert_eq!(pod_addresses(&pending), None);
}

#[test]
fn namespaces_and_required_sources() {
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": "foo", "annotations": {"multicluster.kubernetes.io/namespace": "bar"}}
    }))
    .unwrap();
    let (name, annotations) = namespace_entry(&ns);
    assert_eq!(name, "foo");
    assert_eq!(annotations["multicluster.kubernetes.io/namespace"], "bar");
    assert_eq!(
        KubeFeedConfig::default().required_sources(),
        vec![FeedSource::Services, FeedSource::EndpointSlices]
    );
    let all = KubeFeedConfig {
        pods_and_namespaces: true,
        ..KubeFeedConfig::default()
    };
    assert_eq!(
        all.required_sources(),
        vec![
            FeedSource::Services,
            FeedSource::EndpointSlices,
            FeedSource::Pods,
            FeedSource::Namespaces
        ]
    );
}

#[test]
fn binder_services_with_a_cluster_ip_wait_for_their_endpoints() {
    let binder = |annotations: serde_json::Value, cluster_ip: &str| {
        service(json!({
            "metadata": {"name": "web-x", "namespace": "xcc",
                         "labels": {MANAGED_BY_LABEL: BINDER_MANAGER},
                         "annotations": annotations},
            "spec": {"clusterIP": cluster_ip},
        }))
    };
    let fqdn = json!({FQDN_ANNOTATION: "web.xcc.test"});
    assert!(is_binder_service(&binder(fqdn.clone(), "10.97.0.7")));
    // Headless: answered with its slices' endpoints anyway.
    assert!(!is_binder_service(&binder(fqdn.clone(), "None")));
    // Cilium global Services get their endpoints from Cilium.
    assert!(!is_binder_service(&binder(
        json!({FQDN_ANNOTATION: "web.xcc.test", CILIUM_GLOBAL_ANNOTATION: "true"}),
        "10.97.0.7"
    )));
    // Not the binder's: a user's Service with our annotation answers as before.
    let users = service(json!({
        "metadata": {"name": "web-x", "namespace": "xcc", "annotations": fqdn},
        "spec": {"clusterIP": "10.97.0.7"},
    }));
    assert!(!is_binder_service(&users));
}
