//! Patches: JSON merge, JSON (RFC 6902), strategic merge (keyed lists, directives, 415 on custom
//! resources) and server-side apply (create, managed fields, removal of un-applied fields,
//! conflicts with other appliers and updaters, force, status).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use xcc_kube_fake::{FakeApiServer, crds};

fn cm_cfg(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data})
}

fn owners(cm: &ConfigMap) -> Vec<(String, String, Value)> {
    cm.managed_fields()
        .iter()
        .map(|m| {
            let fields = serde_json::to_value(m.fields_v1.as_ref().unwrap()).unwrap();
            (
                m.manager.clone().unwrap(),
                m.operation.clone().unwrap(),
                fields,
            )
        })
        .collect()
}

#[tokio::test]
async fn merge_json_and_strategic_patches() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}})),
    )
    .await
    .unwrap();
    let merged = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": null, "c": "3"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(merged.data).unwrap(),
        json!({"b": "2", "c": "3"})
    );

    let ops = |v: Value| Patch::Json::<()>(serde_json::from_value(v).unwrap());
    let patched = cms
        .patch("c", &PatchParams::default(), &ops(json!([{"op": "test", "path": "/data/b", "value": "2"}, {"op": "add", "path": "/data/d", "value": "4"}])))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["d"], "4");
    let st = status(
        cms.patch(
            "c",
            &PatchParams::default(),
            &ops(json!([{"op": "test", "path": "/data/b", "value": "9"}])),
        )
        .await,
    );
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));

    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    svcs.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "s"}, "spec": {"ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}})),
    )
    .await
    .unwrap();
    let smp = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "$patch": "delete"}, {"name": "dns", "port": 53, "protocol": "UDP"}]}});
    let s = svcs
        .patch("s", &PatchParams::default(), &Patch::Strategic(smp))
        .await
        .unwrap();
    let ports: Vec<(String, i32, String)> = s
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| {
            let target = serde_json::to_value(p.target_port.as_ref().unwrap())
                .unwrap()
                .to_string();
            (p.name.clone().unwrap(), p.port, target)
        })
        .collect();
    assert_eq!(
        ports,
        vec![
            ("http".to_string(), 80, "8080".to_string()),
            ("dns".to_string(), 53, "53".to_string())
        ]
    );

    server.register(crds::service_records()).unwrap();
    let srs: Api<DynamicObject> = Api::default_namespaced_with(client, &service_record_resource());
    srs.create(
        &PostParams::default(),
        &service_record("r", "r.example.com", json!([])),
    )
    .await
    .unwrap();
    let st = status(
        srs.patch(
            "r",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"fqdn": "x.example.com"}})),
        )
        .await,
    );
    assert_eq!((st.code, st.reason.as_str()), (415, "UnsupportedMediaType"));
}

#[tokio::test]
async fn apply_creates_tracks_fields_and_removes_what_is_no_longer_applied() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let pp = PatchParams::apply("alice");
    let created = api
        .patch("c", &pp, &Patch::Apply(cm_cfg(json!({"a": "1", "b": "2"}))))
        .await
        .unwrap();
    assert_eq!(
        owners(&created),
        vec![(
            "alice".to_string(),
            "Apply".to_string(),
            json!({"f:data": {"f:a": {}, "f:b": {}}})
        )]
    );
    let m = &created.managed_fields()[0];
    assert_eq!(
        (m.api_version.as_deref(), m.fields_type.as_deref()),
        (Some("v1"), Some("FieldsV1"))
    );

    let again = api
        .patch("c", &pp, &Patch::Apply(cm_cfg(json!({"a": "1"}))))
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&again.data).unwrap(),
        json!({"a": "1"}),
        "b was applied before and is gone now"
    );
    assert_eq!(rv(&again), rv(&created) + 1);

    // Fields another manager set stay when alice stops applying hers.
    api.patch(
        "c",
        &PatchParams::default().clone(),
        &Patch::Merge(json!({"data": {"x": "9"}})),
    )
    .await
    .unwrap();
    let kept = api
        .patch("c", &pp, &Patch::Apply(cm_cfg(json!({}))))
        .await
        .unwrap();
    assert_eq!(serde_json::to_value(&kept.data).unwrap(), json!({"x": "9"}));
}

#[tokio::test]
async fn apply_conflicts_and_force() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.patch(
        "c",
        &PatchParams::apply("alice"),
        &Patch::Apply(cm_cfg(json!({"k": "1", "mine": "a"}))),
    )
    .await
    .unwrap();

    let st = status(
        api.patch(
            "c",
            &PatchParams::apply("bob"),
            &Patch::Apply(cm_cfg(json!({"k": "2"}))),
        )
        .await,
    );
    assert_eq!((st.code, st.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        st.message,
        "Apply failed with 1 conflict: conflict with \"alice\" using v1: .data.k"
    );
    let cause = &st.details.as_ref().unwrap().causes[0];
    assert_eq!(
        (cause.reason.as_str(), cause.field.as_str()),
        ("FieldManagerConflict", ".data.k")
    );

    // Agreeing on the value is shared ownership, not a conflict.
    let shared = api
        .patch(
            "c",
            &PatchParams::apply("bob"),
            &Patch::Apply(cm_cfg(json!({"k": "1"}))),
        )
        .await
        .unwrap();
    assert_eq!(owners(&shared).len(), 2);

    let forced = api
        .patch(
            "c",
            &PatchParams::apply("bob").force(),
            &Patch::Apply(cm_cfg(json!({"k": "2"}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["k"], "2");
    assert_eq!(
        owners(&forced),
        vec![
            (
                "alice".to_string(),
                "Apply".to_string(),
                json!({"f:data": {"f:mine": {}}})
            ),
            (
                "bob".to_string(),
                "Apply".to_string(),
                json!({"f:data": {"f:k": {}}})
            ),
        ]
    );
    // alice no longer owns k, so dropping it from her config leaves bob's value alone.
    let after = api
        .patch(
            "c",
            &PatchParams::apply("alice"),
            &Patch::Apply(cm_cfg(json!({"mine": "a"}))),
        )
        .await
        .unwrap();
    assert_eq!(after.data.as_ref().unwrap()["k"], "2");
}

#[tokio::test]
async fn apply_conflicts_with_fields_set_by_updates() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let pp = PostParams {
        field_manager: Some("creator".into()),
        ..Default::default()
    };
    let created = api
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "c"}, "data": {"k": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        owners(&created),
        vec![(
            "creator".to_string(),
            "Update".to_string(),
            json!({"f:data": {"f:k": {}}})
        )]
    );
    let st = status(
        api.patch(
            "c",
            &PatchParams::apply("applier"),
            &Patch::Apply(cm_cfg(json!({"k": "2"}))),
        )
        .await,
    );
    assert_eq!(
        st.message,
        "Apply failed with 1 conflict: conflict with \"creator\" using v1: .data.k"
    );
}

#[tokio::test]
async fn apply_merges_keyed_lists_and_requires_a_field_manager() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let api: Api<Service> = Api::default_namespaced(client.clone());
    let cfg = |ports: Value| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": ports}});
    api.patch(
        "s",
        &PatchParams::apply("a"),
        &Patch::Apply(cfg(json!([{"name": "http", "port": 80}]))),
    )
    .await
    .unwrap();
    let both = api
        .patch(
            "s",
            &PatchParams::apply("b"),
            &Patch::Apply(cfg(json!([{"name": "dns", "port": 53, "protocol": "UDP"}]))),
        )
        .await
        .unwrap();
    let names: Vec<String> = both
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.name.clone().unwrap())
        .collect();
    assert_eq!(names, vec!["http", "dns"]);
    let fields = serde_json::to_value(
        both.metadata.managed_fields.unwrap()[1]
            .fields_v1
            .as_ref()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        fields,
        json!({"f:spec": {"f:ports": {"k:{\"port\":53,\"protocol\":\"UDP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}}}}})
    );

    // Without fieldManager the apiserver refuses an apply patch.
    let req = http::Request::patch("/api/v1/namespaces/default/services/s")
        .header("content-type", "application/apply-patch+yaml")
        .body(serde_json::to_vec(&cfg(json!([]))).unwrap())
        .unwrap();
    let err = client.request_text(req).await.unwrap_err();
    match err {
        kube::Error::Api(st) => assert_eq!(
            (st.code, st.message.as_str()),
            (
                422,
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
            )
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn apply_to_status_subresource() {
    let server = FakeApiServer::start().await;
    server.register(crds::remote_registries()).unwrap();
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "connectivity.tanzu.vmware.com",
            "v1alpha1",
            "RemoteRegistry",
        ),
        "remoteregistries",
    );
    let api: Api<DynamicObject> = Api::default_namespaced_with(server.client(), &ar);
    let base = json!({"apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "RemoteRegistry", "metadata": {"name": "r"}});
    let mut spec = base.clone();
    spec["spec"] =
        json!({"address": "r:443", "tlsConfig": {"serverCA": "YQ==", "serverName": "r"}});
    spec["status"] = json!({"observedGeneration": 9});
    let created = api
        .patch("r", &PatchParams::apply("ctl"), &Patch::Apply(&spec))
        .await
        .unwrap();
    assert_eq!(
        created.data.get("status"),
        None,
        "status in a main-resource apply is ignored"
    );

    // The deployed schema requires every condition field, as a real cluster would.
    let mut st = base.clone();
    st["status"] =
        json!({"observedGeneration": 1, "conditions": [{"type": "Valid", "status": "True"}]});
    let refused = status(
        api.patch_status("r", &PatchParams::apply("ctl"), &Patch::Apply(&st))
            .await,
    );
    assert_eq!(
        refused.message,
        "RemoteRegistry.connectivity.tanzu.vmware.com \"r\" is invalid: [status.conditions[0].lastTransitionTime: Required value, status.conditions[0].message: Required value, status.conditions[0].reason: Required value]"
    );
    st["status"]["conditions"][0] = json!({"type": "Valid", "status": "True", "reason": "Accepted",
        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let written = api
        .patch_status("r", &PatchParams::apply("ctl"), &Patch::Apply(&st))
        .await
        .unwrap();
    assert_eq!(written.data["status"]["observedGeneration"], 1);
    let entries: Vec<(String, Option<String>)> = written
        .managed_fields()
        .iter()
        .map(|m| (m.manager.clone().unwrap(), m.subresource.clone()))
        .collect();
    assert_eq!(
        entries,
        vec![
            ("ctl".to_string(), None),
            ("ctl".to_string(), Some("status".to_string()))
        ]
    );
    assert_eq!(written.name_any(), "r");
}
