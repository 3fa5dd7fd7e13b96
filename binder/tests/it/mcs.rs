//! The binder in MCS mode on a real API server (`xcc_testkube`, our CRDs and the upstream MCS
//! CRDs of `deploy/mcs/crds` installed), as the binder's ServiceAccount with exactly
//! `deploy/overlays/mcs`'s RBAC (no request may be refused): each imported origin gets a
//! ServiceImport in its namespace (ClusterSetIP, ports, the IP of the binder's Service, the
//! source clusters) beside the Service and the per-cluster EndpointSlices with the MCS labels;
//! a ServiceImport someone else made is never touched; a headless export is a `Headless`
//! ServiceImport without IPs beside a headless Service whose slices carry the pod hostnames;
//! the ServiceImport's EndpointSlices in the service's namespace carry the MCS labels and are
//! owned by it; this cluster's own MCS export gets a ServiceImport too, and a clusterset
//! Service with its endpoints; a restarted binder writes nothing at steady state, with the
//! conflicting, affinity and own exports in place too; a restarted binder rewrites nothing at steady state; hostname changes reach the slice, and
//! an export that stops being headless gets a Service with a cluster IP and a ClusterSetIP
//! ServiceImport; two exports defining a port differently give the union of their ports with
//! the oldest export's definition and its session affinity and traffic policy, in both orders of their export times (KEP-1645); removing
//! the imports removes the
//! binder's ServiceImport and slices. Waits wake on watches, never on time.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use xcc_binder::controller::{Config, Controller, Metrics};
use xcc_controller::probes::Health;
use xcc_proto::crd::ServiceRecord;
use xcc_proto::mcs::{
    EXPORTED_AT_ANNOTATION, EXPORTED_LABELS_ANNOTATION, HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION,
    INTERNAL_TRAFFIC_POLICY_ANNOTATION, MCS_SERVICE_NAME_LABEL, MCS_SOURCE_CLUSTER_LABEL,
    SESSION_AFFINITY_ANNOTATION, SESSION_AFFINITY_TIMEOUT_ANNOTATION, ServiceImport,
};
use xcc_proto::names::{self, IMPORTED_LABEL, REMOTE_REGISTRY_LABEL};
use xcc_testkube::{McsPlane, poll};

const TIMEOUT: Duration = Duration::from_secs(30);

fn imported(
    name: &str,
    fqdn: &str,
    cluster: &str,
    ip: &str,
    shop: &str,
    origin: &str,
) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": name,
                     "labels": {IMPORTED_LABEL: "", REMOTE_REGISTRY_LABEL: format!("{cluster}-registry")}},
        "spec": {"fqdn": fqdn, "endpoints": [{"address": ip, "port": 8080}],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                 "origin": {"cluster": cluster, "namespace": shop, "name": origin}},
    }))
    .unwrap()
}

#[tokio::test]
async fn imports_become_service_imports_beside_the_binders_objects() {
    let test = "imports_become_service_imports_beside_the_binders_objects";
    // The controller in MCS mode watches every namespace: the test runs alone.
    let Some(plane) = McsPlane::start(test, "xcc-binder").await else {
        return;
    };
    let McsPlane {
        cp,
        admin,
        xcc,
        shop,
        id,
        ..
    } = &plane;
    let changes = cp
        .changes(
            None,
            &[
                (
                    "multicluster.x-k8s.io/v1alpha1",
                    "ServiceImport",
                    "serviceimports",
                ),
                ("discovery.k8s.io/v1", "EndpointSlice", "endpointslices"),
                ("v1", "Service", "services"),
            ],
        )
        .await;
    let pp = PostParams::default();
    // Someone else's ServiceImport (Submariner's, say) of an origin imported here too.
    let imports: Api<ServiceImport> = Api::namespaced(admin.clone(), shop);
    let foreign: ServiceImport = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app.kubernetes.io/managed-by": "lighthouse"}},
        "spec": {"type": "Headless", "ports": [{"port": 9}]},
    }))
    .unwrap();
    imports.create(&pp, &foreign).await.unwrap();

    let ar = kube::api::ApiResource::erase::<ServiceRecord>(&());
    let records: Api<DynamicObject> = Api::namespaced_with(admin.clone(), xcc, &ar);
    let fqdn = format!("api.{shop}.svc.clusterset.local");
    let web_fqdn = format!("web.{shop}.svc.clusterset.local");
    for r in [
        imported("api-east", &fqdn, "east", "10.1.0.1", shop, "api"),
        imported("api-west", &fqdn, "west", "10.2.0.1", shop, "api"),
        imported("web-east", &web_fqdn, "east", "10.1.0.2", shop, "web"),
    ] {
        records.create(&pp, &r).await.unwrap();
    }

    let running = Running::start(id, xcc).await;

    // The binder's Service for the FQDN, with its cluster IP: the ServiceImport's IP.
    let services: Api<Service> = Api::namespaced(admin.clone(), xcc);
    let service_name = names::service_name(&fqdn);
    let cluster_ip = changes
        .wait_for(
            "the binder's Service with a cluster IP",
            TIMEOUT,
            async || {
                services
                    .get_opt(&service_name)
                    .await
                    .unwrap()
                    .and_then(|s| s.spec?.cluster_ip)
            },
        )
        .await;
    let api = changes
        .wait_for(
            "ServiceImport api with IP and clusters",
            TIMEOUT,
            async || {
                let i = imports.get_opt("api").await.unwrap()?;
                let clusters = i.status.as_ref()?.clusters.clone()?;
                (i.spec.ips.is_some() && clusters.len() == 2).then_some(i)
            },
        )
        .await;
    let value = serde_json::to_value(&api).unwrap();
    assert_eq!(
        value["spec"],
        json!({"type": "ClusterSetIP", "ips": [cluster_ip], "ipFamilies": ["IPv4"],
               "ports": [{"name": "http", "protocol": "TCP", "port": 80}]})
    );
    assert_eq!(
        value["status"],
        json!({"clusters": [{"cluster": "east"}, {"cluster": "west"}]})
    );
    // One slice per source cluster, labelled for MCS.
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), xcc);
    let mut labelled: Vec<(String, String, Vec<String>)> = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service_name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let l = s.metadata.labels.unwrap();
            (
                l[MCS_SERVICE_NAME_LABEL].clone(),
                l[MCS_SOURCE_CLUSTER_LABEL].clone(),
                s.endpoints
                    .into_iter()
                    .map(|e| e.addresses[0].clone())
                    .collect(),
            )
        })
        .collect();
    labelled.sort();
    assert_eq!(
        labelled,
        [
            ("api".into(), "east".into(), vec!["10.1.0.1".to_string()]),
            ("api".into(), "west".into(), vec!["10.2.0.1".to_string()])
        ]
    );

    // KEP-1645's EndpointSlices of the ServiceImport, in the service's namespace: one per
    // source cluster, the MCS labels, managed by xcc (not Kubernetes' controller), no
    // `kubernetes.io/service-name` (they belong to no Service), owned by the ServiceImport.
    let shop_slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), shop);
    let api_slices =
        |name: &str| ListParams::default().labels(&format!("{MCS_SERVICE_NAME_LABEL}={name}"));
    let mcs_slices = changes
        .wait_for("api's slices in its namespace", TIMEOUT, async || {
            let items = shop_slices.list(&api_slices("api")).await.unwrap().items;
            (items.len() == 2).then_some(items)
        })
        .await;
    // (labels, addresses, ports) per slice.
    type Seen = Vec<(
        std::collections::BTreeMap<String, String>,
        Vec<String>,
        Vec<i32>,
    )>;
    let mut seen: Seen = mcs_slices
        .iter()
        .map(|s| {
            let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.name.as_str(), Some(&owner.uid)),
                ("ServiceImport", "api", api.metadata.uid.as_ref())
            );
            (
                s.metadata.labels.clone().unwrap(),
                s.endpoints.iter().map(|e| e.addresses[0].clone()).collect(),
                s.ports.iter().flatten().filter_map(|p| p.port).collect(),
            )
        })
        .collect();
    seen.sort();
    let labels = |cluster: &str| {
        [
            (MCS_SERVICE_NAME_LABEL, "api"),
            (MCS_SOURCE_CLUSTER_LABEL, cluster),
            ("endpointslice.kubernetes.io/managed-by", "xcc-binder"),
            ("app.kubernetes.io/managed-by", "xcc-binder"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(
        seen,
        [
            (labels("east"), vec!["10.1.0.1".to_string()], vec![8080]),
            (labels("west"), vec!["10.2.0.1".to_string()], vec![8080]),
        ]
    );

    // A headless export: a headless ServiceImport without IPs, a headless Service, and the
    // slice's endpoints carry the exporter's pod hostnames.
    let db_fqdn = format!("db.{shop}.svc.clusterset.local");
    let mut db = imported("db-east", &db_fqdn, "east", "10.1.0.5", shop, "db");
    db.metadata.annotations = Some(
        [
            (HEADLESS_ANNOTATION, "true"),
            (HOSTNAMES_ANNOTATION, "10.1.0.5=db-0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    records.create(&pp, &db).await.unwrap();
    let db_import = changes
        .wait_for("ServiceImport db", TIMEOUT, async || {
            imports.get_opt("db").await.unwrap()
        })
        .await;
    assert_eq!(
        serde_json::to_value(&db_import.spec).unwrap(),
        json!({"type": "Headless", "ipFamilies": ["IPv4"],
               "ports": [{"name": "http", "protocol": "TCP", "port": 80}]})
    );
    let db_service = names::service_name(&db_fqdn);
    let db_slice = changes
        .wait_for("the slice of db", TIMEOUT, async || {
            slices
                .list(
                    &ListParams::default()
                        .labels(&format!("kubernetes.io/service-name={db_service}")),
                )
                .await
                .unwrap()
                .items
                .pop()
        })
        .await;
    assert_eq!(
        db_slice
            .endpoints
            .iter()
            .map(|e| (e.addresses[0].as_str(), e.hostname.as_deref()))
            .collect::<Vec<_>>(),
        [("10.1.0.5", Some("db-0"))]
    );
    let spec = services.get(&db_service).await.unwrap().spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));

    // Steady state: a restarted binder rewrites no ServiceImport and nothing else. A record
    // imported after the restart is written in a full pass, so once its ServiceImport is
    // there every other one has been compared too; only its own objects are written.
    running.stop().await;
    let since = std::time::SystemTime::now();
    let running = Running::start(id, xcc).await;
    let late_fqdn = format!("late.{shop}.svc.clusterset.local");
    records
        .create(
            &pp,
            &imported("late-east", &late_fqdn, "east", "10.1.0.6", shop, "late"),
        )
        .await
        .unwrap();
    changes
        .wait_for("ServiceImport late with its status", TIMEOUT, async || {
            let i = imports.get_opt("late").await.unwrap()?;
            i.status?.clusters.map(|_| ())
        })
        .await;
    cp.audit_flushed(&id.client().await, &id.user, xcc).await;
    let late_service = names::service_name(&late_fqdn);
    let others: Vec<String> = cp
        .writes_since(&id.user, since)
        .into_iter()
        .filter(|w| {
            !w.contains(&late_service)
                && !w.contains("serviceimports")
                && !w.contains(&format!("{shop}/late-"))
        })
        .collect();
    assert_eq!(others, Vec::<String>::new());
    // The new ServiceImport is written once or twice (its IP may come in a second pass).
    let imports_written: Vec<String> = cp
        .writes_since(&id.user, since)
        .into_iter()
        .filter(|w| w.contains("serviceimports") && !w.contains(&format!("{shop}/late ")))
        .collect();
    assert_eq!(imports_written, Vec::<String>::new());

    // A pod's hostname changes: the slice follows. Then the export stops being headless: the
    // Service is made again with a cluster IP, and the ServiceImport becomes ClusterSetIP.
    let annotate = async |annotations: serde_json::Value| {
        records
            .patch(
                "db-east",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .unwrap();
    };
    annotate(json!({HOSTNAMES_ANNOTATION: "10.1.0.5=db-5"})).await;
    changes
        .wait_for(
            "the slice of db with the new hostname",
            TIMEOUT,
            async || {
                let list = slices
                    .list(
                        &ListParams::default()
                            .labels(&format!("kubernetes.io/service-name={db_service}")),
                    )
                    .await
                    .unwrap();
                (list.items.first()?.endpoints[0].hostname.as_deref() == Some("db-5")).then_some(())
            },
        )
        .await;
    annotate(json!({HEADLESS_ANNOTATION: null, HOSTNAMES_ANNOTATION: null})).await;
    let cluster_ip = changes
        .wait_for("db's Service with a cluster IP", TIMEOUT, async || {
            let ip = services
                .get_opt(&db_service)
                .await
                .unwrap()?
                .spec?
                .cluster_ip?;
            (ip != "None").then_some(ip)
        })
        .await;
    changes
        .wait_for("ServiceImport db as ClusterSetIP", TIMEOUT, async || {
            let i = imports.get_opt("db").await.unwrap()?;
            (i.spec.type_ == "ClusterSetIP" && i.spec.ips == Some(vec![cluster_ip.clone()]))
                .then_some(())
        })
        .await;

    // Two exports of `pay` defining `http` differently: the ServiceImport has the union of
    // their ports, the oldest export's `http`; each cluster's slice serves the ports it keeps.
    // Then the other order (west's export the older): the verdict turns.
    let pay_fqdn = format!("pay.{shop}.svc.clusterset.local");
    let pay = |cluster: &str, ip: &str, ports: serde_json::Value, at: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
            "metadata": {"name": format!("pay-{cluster}"),
                         "labels": {IMPORTED_LABEL: "", REMOTE_REGISTRY_LABEL: format!("{cluster}-registry")},
                         // East's Service has ClientIP affinity and a Local policy.
                         "annotations": if cluster == "east" {
                             json!({EXPORTED_AT_ANNOTATION: at,
                                    SESSION_AFFINITY_ANNOTATION: "ClientIP",
                                    SESSION_AFFINITY_TIMEOUT_ANNOTATION: "600",
                                    INTERNAL_TRAFFIC_POLICY_ANNOTATION: "Local",
                                    EXPORTED_LABELS_ANNOTATION: r#"{"team":"pay"}"#})
                         } else {
                             json!({EXPORTED_AT_ANNOTATION: at})
                         }},
            "spec": {"fqdn": pay_fqdn, "endpoints": [{"address": ip, "port": 8080}],
                     "ports": ports,
                     "origin": {"cluster": cluster, "namespace": shop, "name": "pay"}},
        }))
        .unwrap()
    };
    records
        .create(
            &pp,
            &pay(
                "east",
                "10.1.0.7",
                json!([{"name": "http", "port": 80, "targetPort": 8080}]),
                "2026-11-29T07:00:00Z",
            ),
        )
        .await
        .unwrap();
    records
        .create(
            &pp,
            &pay(
                "west",
                "10.2.0.7",
                json!([{"name": "http", "port": 8081, "targetPort": 8080},
                       {"name": "metrics", "port": 9090, "targetPort": 8080}]),
                "2026-11-29T07:00:01Z",
            ),
        )
        .await
        .unwrap();
    let pay_service = names::service_name(&pay_fqdn);
    // (ServiceImport ports, its clusters, each cluster's slice ports, the ServiceImport's and
    // the binder Service's session affinity and the import's traffic policy).
    type PaySlices = Vec<(String, Vec<(String, i32)>)>;
    type PayState = (
        serde_json::Value,
        serde_json::Value,
        PaySlices,
        (Option<String>, Option<String>, Option<String>),
    );
    let pay_state = async || -> Option<PayState> {
        let i = imports.get_opt("pay").await.unwrap()?;
        let service_affinity = services
            .get_opt(&pay_service)
            .await
            .unwrap()?
            .spec?
            .session_affinity;
        let fields = (
            i.spec.session_affinity.clone(),
            service_affinity,
            i.spec.internal_traffic_policy.clone(),
        );
        let mut by_cluster: PaySlices = slices
            .list(
                &ListParams::default().labels(&format!("kubernetes.io/service-name={pay_service}")),
            )
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|s| {
                (
                    s.metadata.labels.unwrap()[MCS_SOURCE_CLUSTER_LABEL].clone(),
                    s.ports
                        .into_iter()
                        .flatten()
                        .map(|p| (p.name.unwrap(), p.port.unwrap()))
                        .collect(),
                )
            })
            .collect();
        by_cluster.sort();
        Some((
            serde_json::to_value(&i.spec.ports).unwrap(),
            serde_json::to_value(&i.status?.clusters).unwrap(),
            by_cluster,
            fields,
        ))
    };
    let east_oldest = (
        json!([{"name": "http", "protocol": "TCP", "port": 80},
               {"name": "metrics", "protocol": "TCP", "port": 9090}]),
        json!([{"cluster": "east"}, {"cluster": "west"}]),
        vec![
            ("east".to_string(), vec![("http".to_string(), 8080)]),
            ("west".to_string(), vec![("metrics".to_string(), 8080)]),
        ],
        (
            Some("ClientIP".to_string()),
            Some("ClientIP".to_string()),
            Some("Local".to_string()),
        ),
    );
    changes
        .wait_for("pay: east's http and west's metrics", TIMEOUT, async || {
            (pay_state().await? == east_oldest).then_some(())
        })
        .await;
    // East's ServiceExport's exported label is on the ServiceImport.
    let pay_import = imports.get("pay").await.unwrap();
    assert_eq!(
        pay_import
            .metadata
            .labels
            .unwrap()
            .get("team")
            .map(String::as_str),
        Some("pay")
    );
    records
        .patch(
            "pay-west",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {EXPORTED_AT_ANNOTATION: "2026-11-29T06:59:59Z"}}}),
            ),
        )
        .await
        .unwrap();
    // West's export is now the oldest: its `http` wins, and east, with no other port, is left
    // out of the service altogether.
    let west_oldest = (
        json!([{"name": "http", "protocol": "TCP", "port": 8081},
               {"name": "metrics", "protocol": "TCP", "port": 9090}]),
        json!([{"cluster": "west"}]),
        vec![(
            "west".to_string(),
            vec![("http".to_string(), 8080), ("metrics".to_string(), 8080)],
        )],
        // West's Service fields, the defaults: no affinity (the API server's `None` on the
        // binder's Service), no policy on the import.
        (None, Some("None".to_string()), None),
    );
    changes
        .wait_for("pay: west's ports only", TIMEOUT, async || {
            (pay_state().await? == west_oldest).then_some(())
        })
        .await;

    // This cluster's own MCS export (the publisher's record, in the service's namespace): the
    // exporting cluster has the ServiceImport too, with its own endpoints in the slices, and
    // the binder's Service (with the export's endpoints) gives it its clusterset IP.
    let shop_records: Api<DynamicObject> = Api::namespaced_with(admin.clone(), shop, &ar);
    let solo: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": format!("solo.{shop}.svc.clusterset.local"),
                     "labels": {"connectivity.tanzu.vmware.com/export": "",
                                "app.kubernetes.io/managed-by": "xcc-publisher"},
                     "annotations": {EXPORTED_AT_ANNOTATION: "2026-11-29T07:00:00Z"}},
        "spec": {"fqdn": format!("solo.{shop}.svc.clusterset.local"),
                 "endpoints": [{"address": "10.3.0.1", "port": 8080}],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                 "origin": {"cluster": "here", "namespace": shop, "name": "solo"}},
    }))
    .unwrap();
    shop_records.create(&pp, &solo).await.unwrap();
    let solo_import = changes
        .wait_for(
            "ServiceImport solo in the exporting cluster",
            TIMEOUT,
            async || {
                let i = imports.get_opt("solo").await.unwrap()?;
                i.status.as_ref()?.clusters.as_ref()?;
                i.spec.ips.as_ref()?;
                Some(i)
            },
        )
        .await;
    let solo_service = names::service_name(&format!("solo.{shop}.svc.clusterset.local"));
    let solo_ip = services
        .get(&solo_service)
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    assert_eq!(
        serde_json::to_value(&solo_import.spec).unwrap(),
        json!({"type": "ClusterSetIP", "ips": [solo_ip], "ipFamilies": ["IPv4"],
               "ports": [{"name": "http", "protocol": "TCP", "port": 80}]})
    );
    // The binder's Service carries this cluster's endpoints (its own slice, owned by nothing:
    // the export lives in another namespace).
    let own_slice = changes
        .wait_for("the binder's slice of solo", TIMEOUT, async || {
            slices
                .list(
                    &ListParams::default()
                        .labels(&format!("kubernetes.io/service-name={solo_service}")),
                )
                .await
                .unwrap()
                .items
                .pop()
        })
        .await;
    assert_eq!(own_slice.endpoints[0].addresses, ["10.3.0.1"]);
    assert_eq!(own_slice.metadata.owner_references, None);
    assert_eq!(
        serde_json::to_value(&solo_import.status).unwrap(),
        json!({"clusters": [{"cluster": "here"}]})
    );
    let solo_slice = changes
        .wait_for("solo's slice", TIMEOUT, async || {
            shop_slices
                .list(&api_slices("solo"))
                .await
                .unwrap()
                .items
                .pop()
        })
        .await;
    assert_eq!(solo_slice.endpoints[0].addresses, ["10.3.0.1"]);
    assert_eq!(
        solo_slice.metadata.labels.unwrap()[MCS_SOURCE_CLUSTER_LABEL],
        "here"
    );

    // Steady state again, now with this cluster's own export, the conflicting `pay` exports,
    // their Service fields and exported labels: a restarted binder writes only the objects of
    // a record imported after the restart (a full pass of both writers).
    running.stop().await;
    let since = std::time::SystemTime::now();
    let running = Running::start(id, xcc).await;
    let later_fqdn = format!("later.{shop}.svc.clusterset.local");
    records
        .create(
            &pp,
            &imported("later-east", &later_fqdn, "east", "10.1.0.9", shop, "later"),
        )
        .await
        .unwrap();
    changes
        .wait_for("ServiceImport later with its slice", TIMEOUT, async || {
            let i = imports.get_opt("later").await.unwrap()?;
            i.status?.clusters?;
            shop_slices
                .list(&api_slices("later"))
                .await
                .unwrap()
                .items
                .pop()
        })
        .await;
    cp.audit_flushed(&id.client().await, &id.user, xcc).await;
    let later_service = names::service_name(&later_fqdn);
    let others: Vec<String> = cp
        .writes_since(&id.user, since)
        .into_iter()
        .filter(|w| {
            !w.contains(&later_service)
                && !w.contains(&format!("{shop}/later"))
                && !w.contains("later-east")
        })
        .collect();
    assert_eq!(others, Vec::<String>::new());
    shop_records
        .delete(
            &format!("solo.{shop}.svc.clusterset.local"),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    changes
        .wait_for(
            "ServiceImport and Service of solo removed with the export",
            TIMEOUT,
            async || {
                let import_gone = imports.get_opt("solo").await.unwrap().is_none();
                let service_gone = services.get_opt(&solo_service).await.unwrap().is_none();
                (import_gone && service_gone).then_some(())
            },
        )
        .await;

    // Removing the imports removes the binder's ServiceImport and slices; the foreign
    // ServiceImport stays as it was.
    for name in [
        "api-east",
        "api-west",
        "web-east",
        "db-east",
        "late-east",
        "pay-east",
        "pay-west",
        "later-east",
    ] {
        records
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    changes
        .wait_for(
            "ServiceImport api and its slices removed",
            TIMEOUT,
            async || {
                let gone = imports.get_opt("api").await.unwrap().is_none();
                let no_slices = slices
                    .list(
                        &ListParams::default()
                            .labels(&format!("kubernetes.io/service-name={service_name}")),
                    )
                    .await
                    .unwrap()
                    .items
                    .is_empty();
                (gone && no_slices).then_some(())
            },
        )
        .await;
    changes
        .wait_for("the ServiceImports' slices removed", TIMEOUT, async || {
            shop_slices
                .list(&ListParams::default().labels("app.kubernetes.io/managed-by=xcc-binder"))
                .await
                .unwrap()
                .items
                .is_empty()
                .then_some(())
        })
        .await;
    let still = imports.get("web").await.unwrap();
    assert_eq!(still.spec.type_, "Headless");
    assert_eq!(still.spec.ports[0].port, 9);
    assert_eq!(
        still
            .metadata
            .managed_fields
            .unwrap()
            .iter()
            .filter(|f| f.manager.as_deref() == Some("xcc-binder"))
            .count(),
        0,
        "the binder never wrote the foreign ServiceImport"
    );
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
    running.stop().await;
}

/// A running binder in MCS mode.
struct Running {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Start it as `id` in `xcc` and wait until it is ready.
    async fn start(id: &xcc_testkube::Identity, xcc: &str) -> Self {
        let cancel = CancellationToken::new();
        let health = Health::default();
        let controller = Controller::new(
            id.client().await,
            Config {
                mcs: true,
                ..Config::new(xcc)
            },
            Metrics::default(),
            health.clone(),
        );
        let task = tokio::spawn(controller.run(cancel.clone()));
        poll("readiness", TIMEOUT, || health.is_ready()).await;
        Self { cancel, task }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap().unwrap();
    }
}
