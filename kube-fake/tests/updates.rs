//! Update semantics: no-op writes keep the resourceVersion and emit nothing, generation rules
//! per resource, `/status` subresource isolation, finalizers holding deletion.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, WatchParams};
use serde_json::json;
use xcc_kube_fake::{FakeApiServer, Verb, crds};

#[tokio::test]
async fn no_op_writes_keep_the_resource_version_and_emit_nothing() {
    let server = FakeApiServer::start().await;
    let api: Api<Service> = Api::default_namespaced(server.client());
    let svc: Service = obj(
        json!({"metadata": {"name": "web", "labels": {"a": "b"}}, "spec": {"ports": [{"port": 80}]}}),
    );
    let ssa = PatchParams::apply("xcc-test");
    let apply_cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80, "name": "http"}]}});
    let created = api
        .patch("web", &ssa, &Patch::Apply(&apply_cfg))
        .await
        .unwrap();
    let _ = svc;
    let start = rv(&created);
    let mut watch = api
        .watch(
            &WatchParams::default().disable_bookmarks(),
            &start.to_string(),
        )
        .await
        .unwrap()
        .boxed();
    server.reset_counters();

    // PUT of the unchanged object, PUT without the server-allocated clusterIP, a merge patch with
    // values already set, a strategic patch re-stating a port, and the same apply again.
    let same = api
        .replace("web", &PostParams::default(), &created)
        .await
        .unwrap();
    let mut stripped = created.clone();
    stripped.spec.as_mut().unwrap().cluster_ip = None;
    stripped.spec.as_mut().unwrap().cluster_ips = None;
    let same2 = api
        .replace("web", &PostParams::default(), &stripped)
        .await
        .unwrap();
    let same3 = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    let same4 = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ports": [{"port": 80, "protocol": "TCP"}]}})),
        )
        .await
        .unwrap();
    let same5 = api
        .patch("web", &ssa, &Patch::Apply(&apply_cfg))
        .await
        .unwrap();
    for s in [&same, &same2, &same3, &same4, &same5] {
        assert_eq!(rv(s), start);
        assert_eq!(s, &created);
    }
    assert_eq!(server.resource_version(), start);
    assert_eq!(server.requests().total(), 5);
    assert_eq!(server.writes().total(), 0, "{}", server.writes());

    // The first event the watch sees is the first real change.
    let changed = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"c": "d"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        describe(&next_event(&mut watch).await),
        (
            "MODIFIED".to_string(),
            "web".to_string(),
            (start + 1).to_string()
        )
    );
    assert_eq!(rv(&changed), start + 1);
    assert_eq!(server.writes().get("services", Verb::Patch), 1);
}

#[tokio::test]
async fn generation_follows_each_resource_strategy() {
    let server = FakeApiServer::start().await;
    server.register(crds::service_records()).unwrap();
    let srs: Api<DynamicObject> =
        Api::default_namespaced_with(server.client(), &service_record_resource());
    let pp = PatchParams::default();
    let sr = srs
        .create(
            &PostParams::default(),
            &service_record("web", "web.example.com", json!([])),
        )
        .await
        .unwrap();
    assert_eq!(sr.metadata.generation, Some(1));
    let labeled = srs
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        labeled.metadata.generation,
        Some(1),
        "metadata changes do not bump"
    );
    let spec = srs
        .patch(
            "web",
            &pp,
            &Patch::Merge(json!({"spec": {"fqdn": "x.example.com"}})),
        )
        .await
        .unwrap();
    assert_eq!(spec.metadata.generation, Some(2));
    let status = srs
        .patch_status(
            "web",
            &pp,
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                "reason": "Published", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        status.metadata.generation,
        Some(2),
        "status writes never bump"
    );
    assert_eq!(status.data["status"]["conditions"][0]["type"], "Ready");

    let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
    cms.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "c"}, "data": {"a": "1"}})),
    )
    .await
    .unwrap();
    let c = cms
        .patch("c", &pp, &Patch::Merge(json!({"data": {"a": "2"}})))
        .await
        .unwrap();
    assert_eq!(c.metadata.generation, None, "ConfigMaps have no generation");
}

#[tokio::test]
async fn status_subresource_isolates_spec_and_status() {
    let server = FakeApiServer::start().await;
    server.register(crds::service_records()).unwrap();
    let srs: Api<DynamicObject> =
        Api::default_namespaced_with(server.client(), &service_record_resource());
    let mut with_status = service_record("web", "web.example.com", json!([]));
    with_status.data["status"] = json!({"observedGeneration": 7});
    let created = srs
        .create(&PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(
        created.data.get("status"),
        None,
        "status is dropped on create"
    );

    // Status through the main resource is ignored: this PUT changes nothing.
    let mut main = created.clone();
    main.data["status"] = json!({"observedGeneration": 1});
    let same = srs
        .replace("web", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!((rv(&same), same.data.get("status")), (rv(&created), None));

    // Spec through /status is ignored; status is written.
    let mut via_status = created.clone();
    via_status.data["spec"]["fqdn"] = "other.example.com".into();
    via_status.data["status"] = json!({"observedGeneration": 1});
    let written = srs
        .replace_status("web", &PostParams::default(), &via_status)
        .await
        .unwrap();
    assert_eq!(written.data["spec"]["fqdn"], "web.example.com");
    assert_eq!(written.data["status"], json!({"observedGeneration": 1}));
    assert_eq!(
        server.writes().get(
            "servicerecords.connectivity.tanzu.vmware.com/status",
            Verb::Update
        ),
        1
    );

    let svcs: Api<Service> = Api::default_namespaced(server.client());
    let svc = svcs
        .create(&PostParams::default(), &obj(json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})))
        .await
        .unwrap();
    let mut lb = svc.clone();
    lb.status = Some(obj(
        json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}),
    ));
    let ignored = svcs
        .replace("lb", &PostParams::default(), &lb)
        .await
        .unwrap();
    assert_eq!(ignored.status, svc.status);
    let set = svcs
        .replace_status("lb", &PostParams::default(), &lb)
        .await
        .unwrap();
    assert_eq!(set.status, lb.status);
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let created = api
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "f", "finalizers": ["example.com/cleanup"]}})),
        )
        .await
        .unwrap();
    let mut watch = api
        .watch(
            &WatchParams::default().disable_bookmarks(),
            &created.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();

    let marked = api
        .delete("f", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("still there: the object");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(describe(&next_event(&mut watch).await).0, "MODIFIED");
    assert_eq!(
        api.get("f").await.unwrap().finalizers(),
        ["example.com/cleanup"]
    );

    let st = status(
        api.patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": ["example.com/cleanup", "example.com/more"]}}),
            ),
        )
        .await,
    );
    assert_eq!(
        st.message,
        "ConfigMap \"f\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"
    );
    // Other updates are still allowed while deleting.
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    assert_eq!(describe(&next_event(&mut watch).await).0, "MODIFIED");

    let last = api
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert!(last.finalizers().is_empty());
    assert_eq!(describe(&next_event(&mut watch).await).0, "DELETED");
    assert_eq!(status(api.get("f").await).code, 404);
    // Unqualified finalizers are refused on built-ins.
    let st = status(
        api.create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "g", "finalizers": ["cleanup"]}})),
        )
        .await,
    );
    assert_eq!(
        st.details.unwrap().causes[0].message,
        "Invalid value: \"cleanup\": name is neither a standard finalizer name nor is it fully qualified"
    );
}
