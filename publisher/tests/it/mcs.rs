//! The publisher in MCS mode on a real API server (`xcc_testkube`, our CRDs and the upstream
//! MCS CRDs of `deploy/mcs/crds` installed), as the publisher's ServiceAccount with exactly
//! `deploy/overlays/mcs`'s RBAC (no request may be refused): a ServiceExport exports the
//! Service of its name like the export label, a Service exported both ways is one record, the
//! export's status carries the KEP-1645 conditions (written with server-side apply, next to a
//! condition another controller owns), the record carries the ServiceExport's creation time
//! and the Service's session affinity and internal traffic policy,
//! another cluster's export of the same name defining a port otherwise is a `PortConflict`
//! whose message names the oldest export as the winner (in both orders of the two exports), a headless Service exports its ready pods (from its
//! EndpointSlices) with their hostnames and another cluster's cluster IP export of its name
//! is a `TypeConflict`, a record whose announcement the hierarchy refuses (`Announced=False`,
//! another owner) makes its export not Ready with an `OwnerConflict` until the refusal ends, a
//! restarted publisher writes nothing at steady state, and removing the ServiceExport removes
//! the record. A Service exported by its ServiceExport alone exports its ready pods (from its
//! EndpointSlices, on the pods' port), one carrying the label its cluster IP.
//! Waits wake on watches of the objects they check, never on time.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use xcc_controller::probes::Health;
use xcc_proto::crd::ServiceRecord;
use xcc_proto::mcs::{
    EXPORTED_AT_ANNOTATION, HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION, ServiceExport,
    ServiceTraits, format_exported_at,
};
use xcc_proto::names::{
    EXPORT_LABEL, IMPORTED_LABEL, REMOTE_REGISTRY_LABEL, SERVICE_PORT_ANNOTATION,
};
use xcc_publisher::controller::{self, Metrics, Settings};
use xcc_publisher::desired::Config;
use xcc_testkube::McsPlane;

const TIMEOUT: Duration = Duration::from_secs(30);

fn service(name: &str, labels: Value, port: i32) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": port}]},
    }))
    .unwrap()
}

fn export(name: &str) -> ServiceExport {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

/// `type → (status, reason)` of the export's conditions.
fn conditions(export: &ServiceExport) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = export
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
        .collect();
    out.sort();
    out
}

/// The message of the export's condition `type_`.
fn message(export: &ServiceExport, type_: &str) -> String {
    let conditions = export.status.as_ref().unwrap().conditions.as_ref().unwrap();
    let found = conditions.iter().find(|c| c.type_ == type_).unwrap();
    found.message.clone()
}

fn expect(rows: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = rows
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn service_exports_export_like_the_label_and_carry_mcs_conditions() {
    let test = "service_exports_export_like_the_label_and_carry_mcs_conditions";
    // The controller in MCS mode watches every namespace: the test runs alone.
    let Some(plane) = McsPlane::start(test, "xcc-publisher").await else {
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
                    "connectivity.tanzu.vmware.com/v1alpha1",
                    "ServiceRecord",
                    "servicerecords",
                ),
                (
                    "multicluster.x-k8s.io/v1alpha1",
                    "ServiceExport",
                    "serviceexports",
                ),
            ],
        )
        .await;
    let services: Api<Service> = Api::namespaced(admin.clone(), shop);
    let exports: Api<ServiceExport> = Api::namespaced(admin.clone(), shop);
    let records: Api<ServiceRecord> = Api::namespaced(admin.clone(), shop);
    let pp = PostParams::default();
    services
        .create(&pp, &service("api", json!({}), 80))
        .await
        .unwrap();
    services
        .create(&pp, &service("both", json!({EXPORT_LABEL: ""}), 81))
        .await
        .unwrap();
    services
        .create(&pp, &service("plain", json!({}), 82))
        .await
        .unwrap();
    for name in ["api", "both", "ghost"] {
        exports.create(&pp, &export(name)).await.unwrap();
    }
    // A condition another controller owns stays beside ours.
    exports
        .patch_status(
            "api",
            &PatchParams::apply("someone-else"),
            &Patch::Apply(json!({
                "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
                "status": {"conditions": [{"type": "example.com/Seen", "status": "True",
                    "reason": "Seen", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            })),
        )
        .await
        .unwrap();

    let running = Running::start(id, xcc).await;

    let fqdn = |name: &str| format!("{name}.{shop}.svc.clusterset.local");
    let wait_conditions = async |name: &str, want: Vec<(String, String, String)>| {
        changes
            .wait_for(
                &format!("{name} conditions {want:?}"),
                TIMEOUT,
                async || {
                    let e = exports.get(name).await.unwrap();
                    (conditions(&e) == want).then_some(e)
                },
            )
            .await
    };
    let exported = expect(&[
        ("Valid", "True", "Valid"),
        ("Ready", "True", "Exported"),
        ("Conflict", "False", "NoConflicts"),
        ("example.com/Seen", "True", "Seen"),
    ]);
    let api = wait_conditions("api", exported.clone()).await;
    assert_eq!(
        message(&api, "Ready"),
        format!("exported as ServiceRecord {}", fqdn("api"))
    );
    wait_conditions(
        "ghost",
        expect(&[
            ("Valid", "False", "NoService"),
            ("Ready", "False", "Pending"),
            ("Conflict", "False", "NoConflicts"),
        ]),
    )
    .await;
    let exported_plain = expect(&[
        ("Valid", "True", "Valid"),
        ("Ready", "True", "Exported"),
        ("Conflict", "False", "NoConflicts"),
    ]);
    wait_conditions("both", exported_plain.clone()).await;
    // One record per exported Service, exported both ways or not; none for `plain`.
    let mut names: Vec<String> = records
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| r.metadata.name.unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [fqdn("api"), fqdn("both")]);
    let record = records.get(&fqdn("api")).await.unwrap();
    assert_eq!(record.spec.ports.as_ref().unwrap()[0].port, 80);
    // The export's creation time travels with the record: every cluster orders the exports
    // of a name by it (the oldest wins).
    let api_created = api.metadata.creation_timestamp.clone().unwrap().0;
    let east_at = format_exported_at(api_created);
    assert_eq!(
        record.metadata.annotations.as_ref().unwrap()[EXPORTED_AT_ANNOTATION],
        east_at
    );
    // The Service's session affinity and traffic policy travel with the record too.
    services
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sessionAffinity": "ClientIP",
                                          "internalTrafficPolicy": "Local"}})),
        )
        .await
        .unwrap();
    let record = changes
        .wait_for(
            "api's record with its Service's fields",
            TIMEOUT,
            async || {
                let r = records.get(&fqdn("api")).await.unwrap();
                (ServiceTraits::of_record(&r).client_ip_timeout.is_some()).then_some(r)
            },
        )
        .await;
    assert_eq!(
        ServiceTraits::of_record(&record),
        ServiceTraits {
            client_ip_timeout: Some(10_800),
            internal_local: true,
            traffic_distribution: None,
        }
    );
    // The ServiceExport's exported labels travel with the record.
    exports
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"exportedLabels": {"team": "pay"}}})),
        )
        .await
        .unwrap();
    changes
        .wait_for(
            "api's record with its exported label",
            TIMEOUT,
            async || {
                let r = records.get(&fqdn("api")).await.unwrap();
                let (labels, _) = xcc_proto::mcs::record_exported_metadata(&r);
                (labels.get("team").map(String::as_str) == Some("pay")).then_some(())
            },
        )
        .await;
    // Exported by its ServiceExport alone: its ready pods (none yet), never its cluster IP;
    // `both` carries the label, which keeps XCC v1's cluster IP.
    assert!(record.spec.endpoints.is_empty());
    let both_ip = services.get("both").await.unwrap().spec.unwrap().cluster_ip;
    let both = records.get(&fqdn("both")).await.unwrap();
    assert_eq!(
        both.spec
            .endpoints
            .iter()
            .map(|e| (Some(e.address.clone()), e.port))
            .collect::<Vec<_>>(),
        [(both_ip, 81)]
    );
    // So it is no MCS export: it carries no export time (this cluster's binder would otherwise
    // put the cluster IP among its own clusterset endpoints, where nothing can forward to it),
    // and its ServiceExport says the label decides.
    assert!(
        !both
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(EXPORTED_AT_ANNOTATION)),
        "{:?}",
        both.metadata.annotations
    );
    let both_export = exports.get("both").await.unwrap();
    assert_eq!(
        message(&both_export, "Ready"),
        format!(
            "exported as ServiceRecord {} by the Service's {EXPORT_LABEL} label, which decides: \
             the addresses XCC v1 exports (cluster IP, load balancer or nodes), ranked after \
             every MCS export of the name and not among this cluster's own clusterset \
             endpoints; remove the label to export the Service's ready pods with this \
             ServiceExport",
            fqdn("both")
        )
    );
    // `api`'s pods appear (its slice, on the pods' port): its record's endpoints are the ready
    // ones, on that port.
    let api_pods: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "api-pods", "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.5.0.2"]},
                      {"addresses": ["10.5.0.1"], "conditions": {"ready": true}},
                      {"addresses": ["10.5.0.3"], "conditions": {"ready": false}}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(admin.clone(), shop)
        .create(&pp, &api_pods)
        .await
        .unwrap();
    let record = changes
        .wait_for("api's record with its pods", TIMEOUT, async || {
            let r = records.get(&fqdn("api")).await.unwrap();
            (!r.spec.endpoints.is_empty()).then_some(r)
        })
        .await;
    assert_eq!(
        record
            .spec
            .endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.port))
            .collect::<Vec<_>>(),
        [("10.5.0.1", 8080), ("10.5.0.2", 8080)]
    );
    assert_eq!(
        record.spec.ports.as_ref().unwrap()[0].target_port,
        Some(8080)
    );
    assert_eq!(
        record.metadata.owner_references.unwrap()[0].name,
        "api",
        "owned by the Service, as with the label"
    );

    // Another cluster exports `api` with other ports: this cluster imports that record.
    let imported: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": "api-from-west", "namespace": xcc,
                     "labels": {IMPORTED_LABEL: "", REMOTE_REGISTRY_LABEL: "west-registry"}},
        "spec": {"fqdn": fqdn("api"), "endpoints": [{"address": "10.9.0.1", "port": 8080}],
                 "ports": [{"name": "http", "port": 8080}],
                 "origin": {"cluster": "west", "namespace": shop, "name": "api"}},
    }))
    .unwrap();
    let ar = kube::api::ApiResource::erase::<ServiceRecord>(&());
    Api::<DynamicObject>::namespaced_with(admin.clone(), xcc, &ar)
        .create(&pp, &imported)
        .await
        .unwrap();
    let conflicted = wait_conditions(
        "api",
        expect(&[
            ("Valid", "True", "Valid"),
            ("Ready", "True", "Exported"),
            ("Conflict", "True", "PortConflict"),
            ("example.com/Seen", "True", "Seen"),
        ]),
    )
    .await;
    // West's export says no time (as a label export's): east's, the oldest, keeps `http`.
    assert_eq!(
        message(&conflicted, "Conflict"),
        format!(
            "the exports of this name define a port differently; the service has the union of their ports, the oldest export's definition winning (the oldest export is east (exported {east_at})): west's http:8080/TCP (east's http:80/TCP kept)"
        )
    );
    // The other order: west's export is older than east's. The verdict turns, as it does
    // in every cluster.
    let imported_records = Api::<DynamicObject>::namespaced_with(admin.clone(), xcc, &ar);
    let older = format_exported_at(
        k8s_openapi::jiff::Timestamp::from_second(api_created.as_second() - 3600).unwrap(),
    );
    imported_records
        .patch(
            "api-from-west",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {EXPORTED_AT_ANNOTATION: older}}})),
        )
        .await
        .unwrap();
    let turned = changes
        .wait_for(
            "api's conflict names west the oldest",
            TIMEOUT,
            async || {
                let e = exports.get("api").await.unwrap();
                message(&e, "Conflict")
                    .contains("east's http:80/TCP (west's")
                    .then_some(e)
            },
        )
        .await;
    assert_eq!(
        message(&turned, "Conflict"),
        format!(
            "the exports of this name define a port differently; the service has the union of their ports, the oldest export's definition winning (the oldest export is west (exported {older})): east's http:80/TCP (west's http:8080/TCP kept)"
        )
    );

    // The Service `ghost` appears: its export turns valid.
    services
        .create(&pp, &service("ghost", json!({}), 83))
        .await
        .unwrap();
    wait_conditions(
        "ghost",
        expect(&[
            ("Valid", "True", "Valid"),
            ("Ready", "True", "Exported"),
            ("Conflict", "False", "NoConflicts"),
        ]),
    )
    .await;

    // A headless Service exports its pods, read from its EndpointSlices, with their
    // hostnames; another cluster's cluster IP export of its name is a TypeConflict.
    let headless: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    services.create(&pp, &headless).await.unwrap();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-pods", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.4.0.1"], "hostname": "web-0"},
                      {"addresses": ["10.4.0.2"], "conditions": {"ready": false}}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(admin.clone(), shop)
        .create(&pp, &slice)
        .await
        .unwrap();
    exports.create(&pp, &export("web")).await.unwrap();
    wait_conditions("web", exported_plain.clone()).await;
    let web = records.get(&fqdn("web")).await.unwrap();
    assert_eq!(
        web.spec
            .endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.port))
            .collect::<Vec<_>>(),
        [("10.4.0.1", 8080)]
    );
    let annotations = web.metadata.annotations.unwrap();
    assert_eq!(annotations[HEADLESS_ANNOTATION], "true");
    assert_eq!(annotations[HOSTNAMES_ANNOTATION], "10.4.0.1=web-0");
    let west_web: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
        "metadata": {"name": "web-from-west", "namespace": xcc,
                     "labels": {IMPORTED_LABEL: "", REMOTE_REGISTRY_LABEL: "west-registry"},
                     "annotations": {SERVICE_PORT_ANNOTATION: "80"}},
        "spec": {"fqdn": fqdn("web"), "endpoints": [{"address": "10.9.0.2", "port": 80}],
                 "origin": {"cluster": "west", "namespace": shop, "name": "web"}},
    }))
    .unwrap();
    Api::<DynamicObject>::namespaced_with(admin.clone(), xcc, &ar)
        .create(&pp, &west_web)
        .await
        .unwrap();
    let typed = wait_conditions(
        "web",
        expect(&[
            ("Valid", "True", "Valid"),
            ("Ready", "True", "Exported"),
            ("Conflict", "True", "TypeConflict"),
        ]),
    )
    .await;
    let web_at = format_exported_at(
        exports
            .get("web")
            .await
            .unwrap()
            .metadata
            .creation_timestamp
            .unwrap()
            .0,
    );
    assert_eq!(
        message(&typed, "Conflict"),
        format!(
            "the exports of this name differ in type; the oldest export, east (exported {web_at}), wins: every cluster serves it as Headless and leaves out the endpoints of west (ClusterSetIP)"
        )
    );

    // The hierarchy refuses `api`'s announcement: another cluster owns the name. The registry
    // says so on the record (`Announced=False`, with its field manager); the export turns not
    // Ready, and the refusal is its Conflict, before the port conflict.
    let announced = |status: &str, reason: &str, message: &str| {
        Patch::Apply(json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
            "status": {"conditions": [{"type": "Announced", "status": status, "reason": reason,
                "message": message, "lastTransitionTime": "2026-01-02T00:00:00Z"}]},
        }))
    };
    let owned = format!(
        "refused by root: {} is owned by west/shop/api; the first owner keeps a name (check owner)",
        fqdn("api")
    );
    records
        .patch_status(
            &fqdn("api"),
            &PatchParams::apply("xcc-registry").force(),
            &announced("False", "Owner", &owned),
        )
        .await
        .unwrap();
    let refused = wait_conditions(
        "api",
        expect(&[
            ("Valid", "True", "Valid"),
            ("Ready", "False", "RefusedOwner"),
            ("Conflict", "True", "OwnerConflict"),
            ("example.com/Seen", "True", "Seen"),
        ]),
    )
    .await;
    assert_eq!(
        message(&refused, "Ready"),
        format!(
            "ServiceRecord {} is written, but the hierarchy refuses to announce it: {owned}",
            fqdn("api")
        )
    );
    assert_eq!(
        message(&refused, "Conflict"),
        format!(
            "another service owns this name in the hierarchy, so this export is not announced: {owned}"
        )
    );

    // Steady state: a restarted publisher reconciles every Service again (readiness waits for
    // that) and writes no record and no ServiceExport status, a refused export's included.
    running.stop().await;
    let since = std::time::SystemTime::now();
    let running = Running::start(id, xcc).await;
    cp.audit_flushed(&id.client().await, &id.user, xcc).await;
    let writes: Vec<String> = cp
        .writes_since(&id.user, since)
        .into_iter()
        .filter(|w| !w.contains("coordination.k8s.io/leases"))
        .collect();
    assert_eq!(writes, Vec::<String>::new());

    // The refusal no longer stands (`Announced=True`): `api` is Ready again, and its Conflict
    // is the port conflict once more.
    records
        .patch_status(
            &fqdn("api"),
            &PatchParams::apply("xcc-registry").force(),
            &announced("True", "Accepted", "the parent's refusal no longer stands"),
        )
        .await
        .unwrap();
    let restored = wait_conditions(
        "api",
        expect(&[
            ("Valid", "True", "Valid"),
            ("Ready", "True", "Exported"),
            ("Conflict", "True", "PortConflict"),
            ("example.com/Seen", "True", "Seen"),
        ]),
    )
    .await;
    assert_eq!(
        message(&restored, "Ready"),
        format!("exported as ServiceRecord {}", fqdn("api"))
    );

    // Unexporting: `api`'s record goes with its ServiceExport; `both` keeps its record
    // through the label. `both` is queued first, so it has been reconciled once `api`'s
    // record is gone.
    exports
        .delete("both", &DeleteParams::default())
        .await
        .unwrap();
    exports
        .delete("api", &DeleteParams::default())
        .await
        .unwrap();
    changes
        .wait_for("api's record removed", TIMEOUT, async || {
            records
                .get_opt(&fqdn("api"))
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    assert!(records.get_opt(&fqdn("both")).await.unwrap().is_some());
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
    running.stop().await;
}

/// A running publisher in MCS mode for cluster `east`.
struct Running {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Start it as `id`, and wait until it is ready: every source of its first full sync
    /// reconciled, every ServiceExport's status written or found up to date.
    async fn start(id: &xcc_testkube::Identity, xcc: &str) -> Self {
        let cancel = CancellationToken::new();
        let health = Health::default();
        let settings = Settings {
            config: Config {
                cluster: Some("east".into()),
                ..Config::default()
            },
            ingress_service: (xcc.to_string(), "envoy".into()),
            mcs: true,
            // One worker takes keys in queue order (FIFO), so a key queued before another is
            // reconciled before it: the unexport check relies on that.
            workers: 1,
            ..Settings::default()
        };
        let task = tokio::spawn(controller::run(
            id.client().await,
            settings,
            Metrics::default(),
            health.clone(),
            cancel.clone(),
        ));
        tokio::time::timeout(TIMEOUT, health.ready())
            .await
            .unwrap_or_else(|_| panic!("timed out after {TIMEOUT:?} waiting for readiness"));
        Self { cancel, task }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap().unwrap();
    }
}
