//! Server-side defaulting, allocation and validation of the built-ins controllers write:
//! Services (ClusterIP/NodePort allocation, ports, status), Endpoints, EndpointSlices, Pods.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::net::Ipv4Addr;

use common::*;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use xcc_kube_fake::FakeApiServer;

fn svc(name: &str, spec: Value) -> Service {
    obj(json!({"metadata": {"name": name}, "spec": spec}))
}

fn in_service_range(ip: &str) -> bool {
    let ip: Ipv4Addr = ip.parse().unwrap();
    let n = u32::from(ip);
    (n & 0xfff0_0000) == u32::from(Ipv4Addr::new(10, 96, 0, 0))
}

fn causes(st: &kube::core::Status) -> Vec<(String, String)> {
    st.details
        .as_ref()
        .unwrap()
        .causes
        .iter()
        .map(|c| (c.field.clone(), c.message.clone()))
        .collect()
}

#[tokio::test]
async fn services_are_defaulted_like_a_real_apiserver() {
    let server = FakeApiServer::start().await;
    let api: Api<Service> = Api::default_namespaced(server.client());
    let created = api
        .create(
            &PostParams::default(),
            &svc(
                "web",
                json!({"selector": {"app": "web"}, "ports": [{"port": 80}]}),
            ),
        )
        .await
        .unwrap();
    let v = serde_json::to_value(&created).unwrap();
    let ip = v["spec"]["clusterIP"].as_str().unwrap().to_string();
    assert!(in_service_range(&ip), "{ip}");
    assert_eq!(
        v["spec"],
        json!({
            "type": "ClusterIP",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster",
            "selector": {"app": "web"},
            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}],
        })
    );
    assert_eq!(v["status"], json!({"loadBalancer": {}}));
    assert_eq!(
        v["metadata"].get("generation"),
        None,
        "Services have no generation"
    );

    let mut ips = HashSet::from([ip, "10.96.0.1".to_string()]);
    for i in 0..20 {
        let s = api
            .create(
                &PostParams::default(),
                &svc(&format!("s{i}"), json!({"ports": [{"port": 80}]})),
            )
            .await
            .unwrap();
        assert!(
            ips.insert(s.spec.unwrap().cluster_ip.unwrap()),
            "cluster IPs are unique"
        );
    }
    let k = api.get("kubernetes").await.unwrap().spec.unwrap();
    assert_eq!(k.cluster_ip.as_deref(), Some("10.96.0.1"));
}

#[tokio::test]
async fn explicit_headless_nodeport_and_load_balancer_services() {
    let server = FakeApiServer::start().await;
    let api: Api<Service> = Api::default_namespaced(server.client());
    let pp = PostParams::default();
    let fixed = api
        .create(
            &pp,
            &svc(
                "fixed",
                json!({"clusterIP": "10.100.0.7", "ports": [{"port": 80}]}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        fixed.spec.unwrap().cluster_ips,
        Some(vec!["10.100.0.7".to_string()])
    );
    let st = status(
        api.create(
            &pp,
            &svc(
                "dup",
                json!({"clusterIP": "10.100.0.7", "ports": [{"port": 80}]}),
            ),
        )
        .await,
    );
    assert_eq!(
        causes(&st),
        vec![("spec.clusterIPs[0]".into(), "Invalid value: \"10.100.0.7\": failed to allocate IP 10.100.0.7: provided IP is already allocated".into())]
    );
    let st = status(
        api.create(
            &pp,
            &svc(
                "out",
                json!({"clusterIP": "192.168.0.1", "ports": [{"port": 80}]}),
            ),
        )
        .await,
    );
    assert_eq!(st.code, 422);
    assert!(
        st.message
            .contains("The range of valid IPs is 10.96.0.0/12"),
        "{}",
        st.message
    );

    let v6 = api
        .create(
            &pp,
            &svc(
                "v6",
                json!({"clusterIP": "fd00:10:96::10", "ports": [{"port": 80}]}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(v6.spec.unwrap().ip_families, Some(vec!["IPv6".to_string()]));

    let headless = api
        .create(
            &pp,
            &svc(
                "headless",
                json!({"clusterIP": "None", "selector": {"a": "b"}}),
            ),
        )
        .await
        .unwrap();
    let spec = headless.spec.unwrap();
    assert_eq!(
        (spec.cluster_ips, spec.ports),
        (Some(vec!["None".to_string()]), None)
    );

    let np = api
        .create(&pp, &svc("np", json!({"type": "NodePort", "ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "b"}]})))
        .await
        .unwrap();
    let spec = np.spec.unwrap();
    let node_ports: Vec<i32> = spec
        .ports
        .unwrap()
        .iter()
        .map(|p| p.node_port.unwrap())
        .collect();
    assert!(
        node_ports.iter().all(|p| (30000..=32767).contains(p)) && node_ports[0] != node_ports[1],
        "{node_ports:?}"
    );
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
    let taken = node_ports[0];
    let st = status(
        api.create(
            &pp,
            &svc(
                "np2",
                json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": taken}]}),
            ),
        )
        .await,
    );
    assert_eq!(
        causes(&st)[0].1,
        format!("Invalid value: {taken}: provided port is already allocated")
    );
    let st = status(
        api.create(
            &pp,
            &svc("cip", json!({"ports": [{"port": 80, "nodePort": 30001}]})),
        )
        .await,
    );
    assert_eq!(
        causes(&st),
        vec![(
            "spec.ports[0].nodePort".into(),
            "Forbidden: may not be used when `type` is 'ClusterIP'".into()
        )]
    );

    let lb = api
        .create(
            &pp,
            &svc(
                "lb",
                json!({"type": "LoadBalancer", "ports": [{"port": 443}]}),
            ),
        )
        .await
        .unwrap();
    let spec = lb.spec.unwrap();
    assert_eq!(spec.allocate_load_balancer_node_ports, Some(true));
    assert!(spec.ports.unwrap()[0].node_port.is_some());
    let no_ports = svc(
        "lb-vip",
        json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/vip",
               "allocateLoadBalancerNodePorts": false, "ports": [{"port": 443}]}),
    );
    let vip = api.create(&pp, &no_ports).await.unwrap().spec.unwrap();
    assert_eq!(
        vip.ports.unwrap()[0].node_port,
        None,
        "allocateLoadBalancerNodePorts: false"
    );
    assert_eq!(vip.load_balancer_class.as_deref(), Some("example.com/vip"));
}

#[tokio::test]
async fn service_ports_are_validated() {
    let server = FakeApiServer::start().await;
    let api: Api<Service> = Api::default_namespaced(server.client());
    let pp = PostParams::default();
    let st = status(
        api.create(
            &pp,
            &svc("two", json!({"ports": [{"port": 80}, {"port": 443}]})),
        )
        .await,
    );
    assert_eq!(
        st.message,
        "Service \"two\" is invalid: [spec.ports[0].name: Required value, spec.ports[1].name: Required value]"
    );
    let st = status(
        api.create(
            &pp,
            &svc(
                "dup",
                json!({"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "a"}]}),
            ),
        )
        .await,
    );
    assert_eq!(
        causes(&st),
        vec![("spec.ports[1].name".into(), "Duplicate value: \"a\"".into())]
    );
    let st = status(
        api.create(&pp, &svc("zero", json!({"ports": [{"port": 0}]})))
            .await,
    );
    // targetPort defaults to port, so both are reported, as by a real apiserver.
    let zero = "Invalid value: 0: must be between 1 and 65535, inclusive".to_string();
    assert_eq!(
        causes(&st),
        vec![
            ("spec.ports[0].port".into(), zero.clone()),
            ("spec.ports[0].targetPort".into(), zero)
        ]
    );
    let st = status(api.create(&pp, &svc("none", json!({}))).await);
    assert_eq!(
        causes(&st),
        vec![("spec.ports".into(), "Required value".into())]
    );
    let st = status(
        api.create(
            &pp,
            &svc(
                "proto",
                json!({"ports": [{"port": 80, "protocol": "ICMP"}]}),
            ),
        )
        .await,
    );
    assert_eq!(
        causes(&st)[0].1,
        "Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\""
    );
}

#[tokio::test]
async fn service_updates_keep_allocations_and_refuse_changes() {
    let server = FakeApiServer::start().await;
    let api: Api<Service> = Api::default_namespaced(server.client());
    let created = api
        .create(
            &PostParams::default(),
            &svc("web", json!({"type": "NodePort", "ports": [{"port": 80}]})),
        )
        .await
        .unwrap();
    let ip = created.spec.as_ref().unwrap().cluster_ip.clone();
    let np = created.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port;
    // A PUT that omits allocated values keeps them (what `kubectl apply` relies on).
    let mut bare = svc(
        "web",
        json!({"type": "NodePort", "ports": [{"port": 80, "targetPort": 8080}]}),
    );
    bare.metadata.resource_version = created.metadata.resource_version.clone();
    let updated = api
        .replace("web", &PostParams::default(), &bare)
        .await
        .unwrap();
    let spec = updated.spec.unwrap();
    assert_eq!(
        (spec.cluster_ip, spec.ports.unwrap()[0].node_port),
        (ip, np)
    );

    let st = status(
        api.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": "10.100.1.1"}})),
        )
        .await,
    );
    assert_eq!(
        causes(&st)[0],
        (
            "spec.clusterIPs[0]".to_string(),
            "Invalid value: \"10.100.1.1\": may not change once set".to_string()
        )
    );
    // Switching to ClusterIP drops the node ports the client did not change.
    let switched = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    let spec = switched.spec.unwrap();
    assert_eq!(
        (
            spec.ports.unwrap()[0].node_port,
            spec.external_traffic_policy
        ),
        (None, None)
    );
}

#[tokio::test]
async fn load_balancer_status_only_on_load_balancers() {
    let server = FakeApiServer::start().await;
    let api: Api<Service> = Api::default_namespaced(server.client());
    let pp = PostParams::default();
    api.create(&pp, &svc("cip", json!({"ports": [{"port": 80}]})))
        .await
        .unwrap();
    api.create(
        &pp,
        &svc(
            "lb",
            json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        ),
    )
    .await
    .unwrap();
    let ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}});
    let st = status(
        api.patch_status("cip", &PatchParams::default(), &Patch::Merge(&ingress))
            .await,
    );
    assert_eq!(
        causes(&st),
        vec![(
            "status.loadBalancer.ingress".into(),
            "Forbidden: may only be used when `spec.type` is 'LoadBalancer'".into()
        )]
    );
    let lb = api
        .patch_status("lb", &PatchParams::default(), &Patch::Merge(&ingress))
        .await
        .unwrap();
    let ing = lb.status.unwrap().load_balancer.unwrap().ingress.unwrap();
    assert_eq!(ing[0].ip.as_deref(), Some("192.0.2.10"));
}

#[tokio::test]
async fn endpoints_are_defaulted_and_validated() {
    let server = FakeApiServer::start().await;
    let api: Api<Endpoints> = Api::default_namespaced(server.client());
    let pp = PostParams::default();
    let ep = |name: &str, subsets: Value| -> Endpoints {
        obj(json!({"metadata": {"name": name}, "subsets": subsets}))
    };
    let ok = api
        .create(
            &pp,
            &ep(
                "ok",
                json!([{"addresses": [{"ip": "10.1.0.1"}], "ports": [{"port": 80}]}]),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        ok.subsets.unwrap()[0].ports.as_ref().unwrap()[0]
            .protocol
            .as_deref(),
        Some("TCP")
    );

    let cases = [
        (
            json!([{"ports": [{"port": 80}]}]),
            "subsets[0]",
            "Required value: must specify `addresses` or `notReadyAddresses`",
        ),
        (
            json!([{"addresses": [{"ip": "10.1.0.1"}], "ports": [{"port": 80}, {"port": 81}]}]),
            "subsets[0].ports[0].name",
            "Required value",
        ),
        (
            json!([{"addresses": [{"ip": "10.1.0.1"}], "ports": [{"port": 70000}]}]),
            "subsets[0].ports[0].port",
            "Invalid value: 70000: must be between 1 and 65535, inclusive",
        ),
        (
            json!([{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": 80}]}]),
            "subsets[0].addresses[0].ip",
            "Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
        ),
        (
            json!([{"addresses": [{"ip": "nope"}], "ports": [{"port": 80}]}]),
            "subsets[0].addresses[0].ip",
            "Invalid value: \"nope\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
        ),
    ];
    for (i, (subsets, field, message)) in cases.into_iter().enumerate() {
        let st = status(api.create(&pp, &ep(&format!("bad{i}"), subsets)).await);
        assert_eq!(
            causes(&st)[0],
            (field.to_string(), message.to_string()),
            "case {i}"
        );
    }
    // Loopback endpoints are only for loopback-only setups that opt in.
    let lenient = FakeApiServer::builder()
        .allow_special_endpoint_ips(true)
        .start()
        .await;
    let api: Api<Endpoints> = Api::default_namespaced(lenient.client());
    api.create(
        &pp,
        &ep(
            "lo",
            json!([{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": 80}]}]),
        ),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn endpoint_slices_are_defaulted_validated_and_generationed() {
    let server = FakeApiServer::start().await;
    let api: Api<EndpointSlice> = Api::default_namespaced(server.client());
    let pp = PostParams::default();
    let slice = |name: &str, at: &str, addr: &str| -> EndpointSlice {
        obj(
            json!({"metadata": {"name": name, "labels": {"kubernetes.io/service-name": "web"}}, "addressType": at,
            "endpoints": [{"addresses": [addr]}], "ports": [{"port": 80}]}),
        )
    };
    let created = api
        .create(&pp, &slice("web-1", "IPv4", "10.1.0.1"))
        .await
        .unwrap();
    let port = &created.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.protocol.as_deref()),
        (Some(""), Some("TCP"))
    );
    assert_eq!(created.metadata.generation, Some(1));

    let st = status(
        api.create(&pp, &slice("bad-type", "Bogus", "10.1.0.1"))
            .await,
    );
    assert_eq!(
        causes(&st)[0],
        (
            "addressType".to_string(),
            "Unsupported value: \"Bogus\": supported values: \"FQDN\", \"IPv4\", \"IPv6\""
                .to_string()
        )
    );
    let st = status(api.create(&pp, &slice("bad-addr", "IPv4", "fd00::1")).await);
    assert_eq!(
        causes(&st)[0],
        (
            "endpoints[0].addresses[0]".to_string(),
            "Invalid value: \"fd00::1\": must be a valid IPv4 address".to_string()
        )
    );
    let two_unnamed: EndpointSlice = obj(
        json!({"metadata": {"name": "two"}, "addressType": "IPv4", "endpoints": [], "ports": [{"port": 80}, {"port": 81}]}),
    );
    let st = status(api.create(&pp, &two_unnamed).await);
    assert_eq!(
        causes(&st)[0],
        (
            "ports[1].name".to_string(),
            "Duplicate value: \"\"".to_string()
        )
    );

    let pp2 = PatchParams::default();
    let annotated = api
        .patch(
            "web-1",
            &pp2,
            &Patch::Merge(json!({"metadata": {"annotations": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        annotated.metadata.generation,
        Some(1),
        "annotations do not bump"
    );
    let relabeled = api
        .patch(
            "web-1",
            &pp2,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        relabeled.metadata.generation,
        Some(2),
        "labels do, for EndpointSlices"
    );
    let moved = api
        .patch(
            "web-1",
            &pp2,
            &Patch::Merge(json!({"endpoints": [{"addresses": ["10.1.0.2"]}]})),
        )
        .await
        .unwrap();
    assert_eq!(moved.metadata.generation, Some(3));
    let st = status(
        api.patch("web-1", &pp2, &Patch::Merge(json!({"addressType": "IPv6"})))
            .await,
    );
    assert!(
        st.message
            .contains("addressType: Invalid value: \"IPv6\": field is immutable"),
        "{}",
        st.message
    );
}

#[tokio::test]
async fn pods_start_pending_whatever_the_client_sends() {
    let server = FakeApiServer::start().await;
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let pod: Pod = obj(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]},
        "status": {"phase": "Running"}}),
    );
    let created = api.create(&PostParams::default(), &pod).await.unwrap();
    let status = created.status.unwrap();
    assert_eq!(
        (status.phase.as_deref(), status.qos_class.as_deref()),
        (Some("Pending"), Some("BestEffort"))
    );
    let c = &created.spec.unwrap().containers[0];
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(created.metadata.generation, Some(1));
}
