//! `sync_group` on a real API server (`xcc_testkube`, our CRDs installed), as the binder's
//! ServiceAccount with exactly `deploy/overlays/importer`'s RBAC: a record's Service and Endpoints,
//! the VIP, a source removed, end to end, and no write request after the first reconcile of an
//! unchanged group (the API server's audit log counts writes).

#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use xcc_binder::apply::sync_group;
use xcc_binder::desired::{Materialized, group_imported, materialize};
use xcc_proto::crd::ServiceRecord;
use xcc_testkube::{ControlPlane, Turn};

/// A namespace of the shared control plane and the binder's client in it.
struct Env {
    cp: &'static ControlPlane,
    ns: String,
    /// The binder's ServiceAccount (`deploy/overlays/importer`).
    client: Client,
    user: String,
    /// Cluster admin, for what the test itself does.
    admin: Client,
    _turn: Turn,
}

async fn env(test: &str) -> Option<Env> {
    let cp = xcc_testkube::shared(test)?;
    let turn = Turn::shared().await;
    cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
    let ns = cp.namespace("binder-apply").await;
    let id = cp.identity(&ns, "overlays/importer", "xcc-binder").await;
    Some(Env {
        client: id.client().await,
        user: id.user,
        admin: cp.client().await,
        cp,
        ns,
        _turn: turn,
    })
}

impl Env {
    fn assert_no_writes_since(&self, since: std::time::SystemTime) {
        assert_eq!(
            self.cp.writes_since(&self.user, since),
            Vec::<String>::new()
        );
    }
}

async fn create(env: &Env, name: &str, annotations: Value, endpoints: Value) -> ServiceRecord {
    let api: Api<ServiceRecord> = Api::namespaced(env.admin.clone(), &env.ns);
    let sr: ServiceRecord = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": name, "annotations": annotations,
                     "labels": {"connectivity.tanzu.vmware.com/imported": "",
                                "connectivity.tanzu.vmware.com/remote-registry": "rr"}},
        "spec": {"fqdn": "test.some.domain", "endpoints": endpoints},
    }))
    .unwrap();
    api.create(&PostParams::default(), &sr).await.unwrap()
}

/// Materialise the single group from what is stored now.
async fn current(env: &Env) -> Materialized {
    let api: Api<ServiceRecord> = Api::namespaced(env.client.clone(), &env.ns);
    let records = api.list(&ListParams::default()).await.unwrap().items;
    let groups = group_imported(&records);
    assert_eq!(groups.len(), 1);
    let (key, sources) = groups.into_iter().next().unwrap();
    materialize(&key, &sources).unwrap()
}

#[tokio::test]
async fn materialises_then_writes_nothing_while_unchanged() {
    let Some(env) = env("materialises_then_writes_nothing_while_unchanged").await else {
        return;
    };
    let client = env.client.clone();
    let first = create(
        &env,
        "test.some.domain-abcd1234",
        json!({"connectivity.tanzu.vmware.com/service-port": "443",
               "connectivity.tanzu.vmware.com/vip": "1.2.3.4"}),
        json!([{"address": "10.0.0.1", "port": 443}, {"address": "10.0.0.2", "port": 443}]),
    )
    .await;
    create(
        &env,
        "test.some.domain-bcde2345",
        json!({"connectivity.tanzu.vmware.com/service-port": "443",
               "connectivity.tanzu.vmware.com/vip": "1.2.3.4"}),
        json!([{"address": "10.0.0.3", "port": 443}, {"address": "10.0.0.4", "port": 443}]),
    )
    .await;

    let written = sync_group(&client, &env.ns, &current(&env).await)
        .await
        .unwrap();
    assert_eq!(written.applied.len(), 4, "{written:?}");

    let services: Api<Service> = Api::namespaced(env.admin.clone(), &env.ns);
    let svc = services.get("test-some-domain-cc9e50dd").await.unwrap();
    let spec = svc.spec.clone().unwrap();
    assert!(
        spec.cluster_ip.is_some(),
        "the server allocated a cluster IP"
    );
    assert_eq!(spec.ports.unwrap()[0].port, 443);
    // The VIP lands in the load-balancer status.
    let ingress = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap();
    assert_eq!(ingress[0].ip.as_deref(), Some("1.2.3.4"));
    let endpoints: Api<Endpoints> = Api::namespaced(env.admin.clone(), &env.ns);
    let ep = endpoints.get("test-some-domain-cc9e50dd").await.unwrap();
    let ips: Vec<String> = ep.subsets.unwrap()[0]
        .addresses
        .iter()
        .flatten()
        .map(|a| a.ip.clone())
        .collect();
    assert_eq!(ips, ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]);
    let slices: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), &env.ns);
    assert_eq!(
        slices
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Reconciling the unchanged group again sends no write.
    let since = std::time::SystemTime::now();
    for _ in 0..3 {
        let written = sync_group(&client, &env.ns, &current(&env).await)
            .await
            .unwrap();
        assert_eq!(written, Default::default());
    }
    env.assert_no_writes_since(since);

    // One source deleted → owners and addresses shrink, nothing else.
    let records: Api<ServiceRecord> = Api::namespaced(env.admin.clone(), &env.ns);
    records
        .delete(
            first.metadata.name.as_deref().unwrap(),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    sync_group(&client, &env.ns, &current(&env).await)
        .await
        .unwrap();
    let svc = services.get("test-some-domain-cc9e50dd").await.unwrap();
    let owners: Vec<String> = svc
        .metadata
        .owner_references
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();
    assert_eq!(owners, ["test.some.domain-bcde2345"]);
    let ep = endpoints.get("test-some-domain-cc9e50dd").await.unwrap();
    let ips: Vec<String> = ep.subsets.unwrap()[0]
        .addresses
        .iter()
        .flatten()
        .map(|a| a.ip.clone())
        .collect();
    assert_eq!(ips, ["10.0.0.3", "10.0.0.4"]);

    // The VIP annotation goes: the Service becomes a plain ClusterIP without ingress.
    let mut remaining = records.get("test.some.domain-bcde2345").await.unwrap();
    remaining
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("connectivity.tanzu.vmware.com/vip");
    records
        .replace(
            "test.some.domain-bcde2345",
            &PostParams::default(),
            &remaining,
        )
        .await
        .unwrap();
    sync_group(&client, &env.ns, &current(&env).await)
        .await
        .unwrap();
    let svc = services.get("test-some-domain-cc9e50dd").await.unwrap();
    assert_eq!(svc.spec.unwrap().type_.as_deref(), Some("ClusterIP"));
    let ingress = svc
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default();
    assert!(ingress.is_empty(), "{ingress:?}");
    let since = std::time::SystemTime::now();
    let written = sync_group(&client, &env.ns, &current(&env).await)
        .await
        .unwrap();
    assert_eq!(written, Default::default());
    env.assert_no_writes_since(since);
    assert_eq!(env.cp.forbidden(&env.user), Vec::<String>::new());
}

#[tokio::test]
async fn slices_the_group_no_longer_needs_are_deleted() {
    let Some(env) = env("slices_the_group_no_longer_needs_are_deleted").await else {
        return;
    };
    let client = env.client.clone();
    let sr = create(
        &env,
        "test.some.domain-abcd1234",
        json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
        json!([{"address": "10.0.0.1", "port": 443}]),
    )
    .await;
    sync_group(&client, &env.ns, &current(&env).await)
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), &env.ns);
    let before: Vec<String> = slices
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| s.metadata.name.unwrap())
        .collect();
    assert_eq!(before.len(), 1);
    assert!(before[0].contains("-ipv4-"));

    // The endpoints move to IPv6: the IPv4 slice goes, an IPv6 slice comes.
    let api: Api<ServiceRecord> = Api::namespaced(env.admin.clone(), &env.ns);
    let mut changed = api.get(sr.metadata.name.as_deref().unwrap()).await.unwrap();
    changed.spec.endpoints[0].address = "fd00::1".into();
    api.replace(
        sr.metadata.name.as_deref().unwrap(),
        &PostParams::default(),
        &changed,
    )
    .await
    .unwrap();
    let written = sync_group(&client, &env.ns, &current(&env).await)
        .await
        .unwrap();
    assert_eq!(written.deleted, before);
    let after: Vec<EndpointSlice> = slices.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].address_type, "IPv6");
    assert_eq!(env.cp.forbidden(&env.user), Vec::<String>::new());
}

/// A new group's Service is written before its EndpointSlice, so that the node's kube-proxy
/// hears of the Service before xcc dns answers the name (only once the slice exists), and
/// rejects connections to the cluster IP until it has the endpoints rather than letting them
/// leave unrewritten: the API server received the slice's write after it had answered the
/// Service's.
#[tokio::test]
async fn a_new_service_is_stored_before_its_slice() {
    let Some(env) = env("a_new_service_is_stored_before_its_slice").await else {
        return;
    };
    create(
        &env,
        "test.some.domain-abcd1234",
        json!({"connectivity.tanzu.vmware.com/service-port": "443"}),
        json!([{"address": "10.0.0.1", "port": 443}]),
    )
    .await;
    let since = std::time::SystemTime::now();
    let written = sync_group(&env.client, &env.ns, &current(&env).await)
        .await
        .unwrap();
    let kinds: Vec<&str> = written
        .created
        .iter()
        .map(|c| c.split('/').next().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["Service", "EndpointSlice", "Endpoints"],
        "{written:?}"
    );
    env.cp.audit_flushed(&env.client, &env.user, &env.ns).await;
    let writes: Vec<_> = env
        .cp
        .writes(&env.user)
        .into_iter()
        .filter(|w| w.received.is_some_and(|t| t >= since))
        .collect();
    let one = |resource: &str| {
        let of: Vec<_> = writes.iter().filter(|w| w.resource == resource).collect();
        assert_eq!(of.len(), 1, "{resource}: {writes:?}");
        of[0].clone()
    };
    let service = one("services");
    let slice = one("endpointslices");
    assert_eq!((service.code, slice.code), (201, 201), "{writes:?}");
    assert!(
        slice.received.unwrap() >= service.completed.unwrap(),
        "the slice was written before the Service was stored: {service:?} {slice:?}"
    );
}
