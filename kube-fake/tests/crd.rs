//! Custom resources registered from a CustomResourceDefinition: pruning, defaults, schema
//! validation, list-map merging by server-side apply, several served versions on one storage.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use xcc_kube_fake::{FakeApiServer, ResourceSpec, crds};

fn widget_crd() -> Value {
    let schema = json!({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1},
                "color": {"type": "string", "default": "blue", "enum": ["blue", "red"]},
                "rules": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "value": {"type": "string"}}}}
            }},
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
        }
    });
    let version = |name: &str, storage: bool| json!({"name": name, "served": true, "storage": storage, "schema": {"openAPIV3Schema": schema}, "subresources": {"status": {}}});
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "shortNames": ["wd"]},
            "scope": "Namespaced",
            "versions": [version("v1beta1", false), version("v1", true)],
        }
    })
}

/// Every served version of the widget CRD (storage version first).
fn register_widgets(server: &FakeApiServer) {
    for spec in ResourceSpec::from_crd(&widget_crd()).unwrap() {
        server.register(spec).unwrap();
    }
}

fn widgets(server: &FakeApiServer, version: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", version, "Widget"),
        "widgets",
    );
    Api::default_namespaced_with(server.client(), &ar)
}

fn widget(version: &str, spec: Value) -> DynamicObject {
    obj(
        json!({"apiVersion": format!("example.com/{version}"), "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}),
    )
}

#[tokio::test]
async fn crd_schema_prunes_defaults_and_validates() {
    let server = FakeApiServer::start().await;
    register_widgets(&server);
    let api = widgets(&server, "v1");
    let created = api
        .create(
            &PostParams::default(),
            &widget("v1", json!({"size": 2, "shape": "round"})),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"size": 2, "color": "blue"}),
        "unknown field pruned, default applied"
    );

    let st = status(
        api.create(
            &PostParams::default(),
            &obj(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "bad"}, "spec": {"size": 0, "color": "green"}})),
        )
        .await,
    );
    assert_eq!(
        st.message,
        "Widget.example.com \"bad\" is invalid: [spec.color: Unsupported value: \"green\": supported values: \"blue\", \"red\", spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1]"
    );
    let dup = json!({"spec": {"rules": [{"name": "a"}, {"name": "a"}]}});
    let st = status(
        api.patch("w", &PatchParams::default(), &Patch::Merge(dup))
            .await,
    );
    assert_eq!(st.details.unwrap().causes[0].field, "spec.rules[1]");
}

#[tokio::test]
async fn apply_merges_schema_list_maps_by_key() {
    let server = FakeApiServer::start().await;
    register_widgets(&server);
    let api = widgets(&server, "v1");
    let cfg = |rules: Value| json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1, "rules": rules}});
    api.patch(
        "w",
        &PatchParams::apply("a"),
        &Patch::Apply(cfg(json!([{"name": "x", "value": "1"}]))),
    )
    .await
    .unwrap();
    let both = api
        .patch(
            "w",
            &PatchParams::apply("b"),
            &Patch::Apply(cfg(json!([{"name": "y", "value": "2"}]))),
        )
        .await
        .unwrap();
    assert_eq!(
        both.data["spec"]["rules"],
        json!([{"name": "x", "value": "1"}, {"name": "y", "value": "2"}])
    );
    let only_a = api
        .patch("w", &PatchParams::apply("b"), &Patch::Apply(cfg(json!([]))))
        .await
        .unwrap();
    assert_eq!(
        only_a.data["spec"]["rules"],
        json!([{"name": "x", "value": "1"}])
    );
}

#[tokio::test]
async fn served_versions_share_storage() {
    let server = FakeApiServer::start().await;
    register_widgets(&server);
    let beta = widgets(&server, "v1beta1");
    beta.create(
        &PostParams::default(),
        &widget("v1beta1", json!({"size": 3})),
    )
    .await
    .unwrap();
    let v1 = widgets(&server, "v1").get("w").await.unwrap();
    assert_eq!(v1.types.unwrap().api_version, "example.com/v1");
    assert_eq!(v1.data["spec"]["size"], 3);
    let stored = server
        .get("example.com/v1beta1", "widgets", Some("default"), "w")
        .unwrap();
    assert_eq!(stored["apiVersion"], "example.com/v1beta1");
}

#[tokio::test]
async fn checked_in_xcc_crds_are_served_with_their_schemas() {
    let server = FakeApiServer::builder()
        .resource(crds::service_records())
        .resource(crds::remote_registries())
        .start()
        .await;
    let srs: Api<DynamicObject> =
        Api::default_namespaced_with(server.client(), &service_record_resource());
    let mut sr = service_record(
        "web",
        "web.example.com",
        json!([{"address": "10.0.0.1", "port": 443}]),
    );
    sr.data["spec"]["notInSchema"] = json!(true);
    let created = srs.create(&PostParams::default(), &sr).await.unwrap();
    assert_eq!(created.data["spec"].get("notInSchema"), None);
    let st = status(
        srs.create(
            &PostParams::default(),
            &service_record("bad", "-bad-", json!([])),
        )
        .await,
    );
    assert_eq!(st.details.unwrap().causes[0].field, "spec.fqdn");

    let rr = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(crds::XCC_GROUP, "v1alpha1", "RemoteRegistry"),
        "remoteregistries",
    );
    let rrs: Api<DynamicObject> = Api::default_namespaced_with(server.client(), &rr);
    let reg: DynamicObject = obj(
        json!({"apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "RemoteRegistry",
        "metadata": {"name": "r"}, "spec": {"address": "r:443", "tlsConfig": {"serverCA": "YQ==", "serverName": "r"},
        "imports": [{"fqdn": "a.example.com", "name": "x"}]}}),
    );
    let st = status(rrs.create(&PostParams::default(), &reg).await);
    assert_eq!(
        st.message,
        "RemoteRegistry.connectivity.tanzu.vmware.com \"r\" is invalid: spec.imports[0]: Invalid value: \"object\": give either fqdn, or namespace and name"
    );
    assert!(ResourceSpec::from_crd(&json!({"spec": {}})).is_err());
}
