//! Two clusters end to end: real control planes A and B (`xcc_testkube`), the real `xcc` binary
//! as processes (A: registry + publisher under `deploy/overlays/exporter`'s RBAC; B: registry +
//! binder under `deploy/overlays/importer`'s, then `overlays/cilium`'s for the Cilium steps),
//! real mTLS between the registries.
//!
//! Label an HTTPProxy in A → a Service with EndpointSlices at A's node addresses in B; remove
//! the label → gone in B; a labelled Service in A → its cluster IP in B; B's registry restarted
//! while an export disappears → the stale import is removed, the rest keeps its identity
//! (nothing lost, nothing duplicated); the RemoteRegistry switched to `CiliumGlobalService` →
//! global Services with the origins' names and namespaces, removed with their export label and
//! kept across another registry restart; the RemoteRegistry deleted → every import and what
//! the binder made of it gone (owner references, collected by the real garbage collector). At
//! the end no request of any xcc process was refused (403), each sent an `xcc/` User-Agent, and
//! the binder's reconciles listed no EndpointSlices (they read by name and use the watch).
//! Every step waits on API state, never on time.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common::clusters::{
    Cluster, NS, World, exported_service, httpproxy, node, remote_registry, slice_addresses,
    slice_ports, wait_for,
};
use serde_json::{Value, json};
use xcc_proto::names::{API_VERSION, EXPORT_LABEL, service_name};

const WAIT: Duration = Duration::from_secs(60);
const LOG: &str = "info,kube=warn,tower=warn,hyper=warn,h2=warn";

fn logs(a: &Cluster, b: &Cluster) -> String {
    format!("== cluster a\n{}== cluster b\n{}", a.logs(), b.logs())
}

async fn service(cluster: &Cluster, ns: &str, name: &str) -> Option<Value> {
    cluster.get("v1", "services", Some(ns), name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_in_a_is_reachable_by_name_in_b() {
    let _turn = xcc_testkube::Turn::shared().await;
    let world = World::new();
    let Some(mut a) = world
        .cluster("cluster-a", &["web", "shop"], "overlays/exporter")
        .await
    else {
        return;
    };
    let Some(mut b) = world.cluster("cluster-b", &[], "overlays/importer").await else {
        return;
    };
    a.create("nodes", node("node-1", "10.0.0.1")).await;
    a.create("nodes", node("node-2", "10.0.0.2")).await;

    a.start_registry(LOG).await;
    a.start_publisher(LOG).await;
    b.start_registry(LOG).await;
    b.start_binder(LOG).await;
    b.apply(
        "remoteregistries",
        remote_registry(&world, "cluster-a", &a, None),
    )
    .await;

    // 1. A labelled HTTPProxy in A becomes a Service + EndpointSlices in B.
    let fqdn = "nginx.xcc.test";
    a.apply("httpproxies", httpproxy("web", "nginx", fqdn, true))
        .await;
    let svc = service_name(fqdn);
    wait_for(
        "the HTTPProxy's Service and EndpointSlices in B",
        WAIT,
        &[&b],
        async || {
            (service(&b, NS, &svc).await.is_some()
                && slice_addresses(&b, NS, &svc).await == ["10.0.0.1", "10.0.0.2"]
                && slice_ports(&b, NS, &svc).await == [443])
            .then_some(())
        },
        || logs(&a, &b),
    )
    .await;
    let s = service(&b, NS, &svc).await.unwrap();
    assert_eq!(
        s["metadata"]["annotations"]["connectivity.tanzu.vmware.com/fqdn"],
        fqdn
    );
    assert!(s["spec"].get("selector").is_none(), "selector-less: {s}");
    assert_eq!(b.imported().await.keys().collect::<Vec<_>>(), [fqdn]);

    // 2. Removing the label removes it from B.
    a.merge(
        "projectcontour.io/v1",
        "HTTPProxy",
        "httpproxies",
        Some("web"),
        "nginx",
        json!({"metadata": {"labels": {EXPORT_LABEL: null}}}),
    )
    .await;
    wait_for(
        "the Service to leave B after the label was removed",
        WAIT,
        &[&b],
        async || {
            (service(&b, NS, &svc).await.is_none() && b.imported().await.is_empty()).then_some(())
        },
        || logs(&a, &b),
    )
    .await;
    assert!(slice_addresses(&b, NS, &svc).await.is_empty());

    // 3. Label it again, and export a plain Service too.
    a.apply("httpproxies", httpproxy("web", "nginx", fqdn, true))
        .await;
    a.apply("services", exported_service("shop", "api", 8080))
        .await;
    let api_fqdn = "api.shop.svc.clusterset.local";
    let api_svc = service_name(api_fqdn);
    let cluster_ip = wait_for(
        "A's api Service to get a cluster IP",
        WAIT,
        &[&a],
        async || {
            service(&a, "shop", "api")
                .await
                .and_then(|s| s["spec"]["clusterIP"].as_str().map(str::to_string))
        },
        || logs(&a, &b),
    )
    .await;
    wait_for(
        "both exports in B",
        WAIT,
        &[&b],
        async || {
            (service(&b, NS, &svc).await.is_some()
                && slice_addresses(&b, NS, &api_svc).await == [cluster_ip.clone()]
                && slice_ports(&b, NS, &api_svc).await == [8080])
            .then_some(())
        },
        || logs(&a, &b),
    )
    .await;

    // 4. B's registry restarts; while it is down the HTTPProxy stops being exported.
    let before = b.imported().await;
    let api_service_uid = service(&b, NS, &api_svc).await.unwrap()["metadata"]["uid"].clone();
    let registry = b.registry.take().unwrap();
    assert!(
        registry.terminate(),
        "B's registry exits cleanly on SIGTERM"
    );
    a.merge(
        "projectcontour.io/v1",
        "HTTPProxy",
        "httpproxies",
        Some("web"),
        "nginx",
        json!({"metadata": {"labels": {EXPORT_LABEL: null}}}),
    )
    .await;
    wait_for(
        "A's exported record for the proxy to be removed",
        WAIT,
        &[&a],
        async || {
            a.list(API_VERSION, "servicerecords", Some("web"))
                .await
                .is_empty()
                .then_some(())
        },
        || logs(&a, &b),
    )
    .await;
    b.start_registry(LOG).await;
    a.apply("services", exported_service("shop", "cart", 9090))
        .await;
    let cart_fqdn = "cart.shop.svc.clusterset.local";
    wait_for(
        "B to import cart and drop the stale nginx import after its restart",
        WAIT,
        &[&b],
        async || {
            let now = b.imported().await;
            (now.contains_key(cart_fqdn) && !now.contains_key(fqdn)).then_some(())
        },
        || logs(&a, &b),
    )
    .await;
    let after = b.imported().await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        [api_fqdn, cart_fqdn],
        "exactly the current exports"
    );
    assert_eq!(
        after[api_fqdn], before[api_fqdn],
        "the api import kept its name and uid across the restart"
    );
    wait_for(
        "the binder to drop the stale Service",
        WAIT,
        &[&b],
        async || service(&b, NS, &svc).await.is_none().then_some(()),
        || logs(&a, &b),
    )
    .await;
    assert_eq!(
        service(&b, NS, &api_svc).await.unwrap()["metadata"]["uid"],
        api_service_uid,
        "the api Service was not recreated"
    );

    // 5. Cilium global services: the same remote, materialised with the origin's name, once
    // B has the Cilium overlay's RBAC.
    b.switch_overlay("overlays/cilium").await;
    b.apply(
        "remoteregistries",
        remote_registry(&world, "cluster-a", &a, Some("CiliumGlobalService")),
    )
    .await;
    let global = wait_for(
        "a Cilium global Service shop/api in B",
        WAIT,
        &[&b],
        async || service(&b, "shop", "api").await,
        || logs(&a, &b),
    )
    .await;
    let annotations = &global["metadata"]["annotations"];
    assert_eq!(annotations["service.cilium.io/global"], "true", "{global}");
    assert_eq!(annotations["service.cilium.io/shared"], "false", "{global}");
    assert!(global["spec"].get("selector").is_none(), "{global}");
    assert_eq!(global["spec"]["ports"][0]["port"], 8080, "{global}");
    wait_for(
        "the Service-mode objects to go once the remote is materialised by Cilium",
        WAIT,
        &[&b],
        async || service(&b, NS, &api_svc).await.is_none().then_some(()),
        || logs(&a, &b),
    )
    .await;

    // The same journey in Cilium mode: cart is there too; its label removed in A → gone in B,
    // api untouched.
    let api_global_uid = global["metadata"]["uid"].clone();
    wait_for(
        "a Cilium global Service shop/cart in B",
        WAIT,
        &[&b],
        async || service(&b, "shop", "cart").await,
        || logs(&a, &b),
    )
    .await;
    a.merge(
        "v1",
        "Service",
        "services",
        Some("shop"),
        "cart",
        json!({"metadata": {"labels": {EXPORT_LABEL: null}}}),
    )
    .await;
    wait_for(
        "shop/cart to leave B once its export label is removed in A",
        WAIT,
        &[&b],
        async || {
            (service(&b, "shop", "cart").await.is_none()
                && !b.imported().await.contains_key(cart_fqdn))
            .then_some(())
        },
        || logs(&a, &b),
    )
    .await;
    assert_eq!(
        service(&b, "shop", "api").await.unwrap()["metadata"]["uid"],
        api_global_uid
    );

    // B's registry restarts in Cilium mode: a new export arrives, nothing else changes.
    let registry = b.registry.take().unwrap();
    assert!(
        registry.terminate(),
        "B's registry exits cleanly on SIGTERM"
    );
    b.start_registry(LOG).await;
    a.apply("services", exported_service("shop", "orders", 7070))
        .await;
    wait_for(
        "a Cilium global Service shop/orders in B after the restart",
        WAIT,
        &[&b],
        async || service(&b, "shop", "orders").await,
        || logs(&a, &b),
    )
    .await;
    assert_eq!(
        service(&b, "shop", "api").await.unwrap()["metadata"]["uid"],
        api_global_uid,
        "the api global Service survived the restart untouched"
    );
    assert_eq!(
        b.imported().await.keys().collect::<Vec<_>>(),
        [api_fqdn, "orders.shop.svc.clusterset.local"],
        "exactly the current exports, none duplicated"
    );

    // 6. Deleting the RemoteRegistry removes every import and what was made of it.
    b.delete(
        API_VERSION,
        "RemoteRegistry",
        "remoteregistries",
        Some(NS),
        "cluster-a",
    )
    .await;
    wait_for(
        "imports and their Services to leave B",
        WAIT,
        &[&b],
        async || {
            (b.imported().await.is_empty()
                && service(&b, "shop", "api").await.is_none()
                && service(&b, "shop", "orders").await.is_none())
            .then_some(())
        },
        || logs(&a, &b),
    )
    .await;

    for p in [
        a.publisher.take(),
        a.registry.take(),
        b.binder.take(),
        b.registry.take(),
    ]
    .into_iter()
    .flatten()
    {
        let name = p.name.clone();
        assert!(p.terminate(), "{name} exits cleanly on SIGTERM");
    }

    // Everything above ran under the RBAC of deploy/: nothing was refused, and every request
    // said who made it.
    for c in [&a, &b] {
        assert_eq!(c.refused(), Vec::<String>::new(), "{}: 403s", c.name);
        let agents = c.user_agents();
        assert!(
            !agents.is_empty() && agents.iter().all(|ua| ua.starts_with("xcc/")),
            "{}: User-Agents {agents:?}",
            c.name
        );
    }
    // The binder reads what it writes by name and knows its EndpointSlices from its watch: no
    // reconcile lists them (a list is a consistent read on a real API server, tens of
    // milliseconds on every reconcile). Its lists in the namespace are its watches' own.
    let binder = format!("system:serviceaccount:{NS}:xcc-binder");
    let listed: Vec<String> =
        b.cp.audit()
            .iter()
            .filter(|e| {
                e["user"]["username"] == binder.as_str()
                    && e["verb"] == "list"
                    && e["objectRef"]["resource"] == "endpointslices"
                    && e["objectRef"]["namespace"] == NS
            })
            .map(|e| e["requestURI"].as_str().unwrap_or_default().to_string())
            .filter(|uri| uri.contains("kubernetes.io%2Fservice-name"))
            .collect();
    assert_eq!(
        listed,
        Vec::<String>::new(),
        "EndpointSlice lists per reconcile"
    );
}
