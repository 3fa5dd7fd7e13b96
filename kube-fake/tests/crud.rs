//! Create, read, list, replace and delete through kube-rs typed and dynamic clients: status
//! bodies, conflicts, namespaces, names, selectors, pagination, counters.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use xcc_kube_fake::{FakeApiServer, Verb, crds};

fn cm(name: &str, labels: serde_json::Value, data: serde_json::Value) -> ConfigMap {
    obj(json!({"metadata": {"name": name, "labels": labels}, "data": data}))
}

#[tokio::test]
async fn configmap_lifecycle_with_exact_status_bodies() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());

    let created = api
        .create(
            &PostParams::default(),
            &cm("a", json!({}), json!({"k": "1"})),
        )
        .await
        .unwrap();
    assert_eq!(rv(&created), server.resource_version());
    assert_eq!(created.uid().map(|u| u.len()), Some(36));
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(
        created.metadata.generation, None,
        "ConfigMaps have no generation"
    );
    assert_eq!(created.namespace().as_deref(), Some("default"));
    assert_eq!(api.get("a").await.unwrap(), created);

    let mut changed = created.clone();
    changed.data = Some([("k".to_string(), "2".to_string())].into());
    let replaced = api
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(rv(&replaced), rv(&created) + 1);
    assert_eq!(replaced.data.unwrap()["k"], "2");

    let deleted = api.delete("a", &DeleteParams::default()).await.unwrap();
    let st = deleted
        .right()
        .expect("ConfigMap deletion returns a Status");
    assert_eq!(
        st.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    let details = st.details.unwrap();
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("a", "configmaps")
    );
    assert_eq!(Some(details.uid), created.uid());

    let nf = status(api.get("a").await);
    assert_eq!(
        (nf.code, nf.reason.as_str(), nf.message.as_str()),
        (404, "NotFound", "configmaps \"a\" not found")
    );
    let nf = status(api.delete("a", &DeleteParams::default()).await);
    assert_eq!(nf.code, 404);
}

#[tokio::test]
async fn stale_resource_version_is_a_conflict() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    let v1 = api
        .create(
            &PostParams::default(),
            &cm("a", json!({}), json!({"k": "1"})),
        )
        .await
        .unwrap();
    let mut v2 = v1.clone();
    v2.data = Some([("k".to_string(), "2".to_string())].into());
    api.replace("a", &PostParams::default(), &v2).await.unwrap();

    let mut stale = v1.clone();
    stale.data = Some([("k".to_string(), "3".to_string())].into());
    let st = status(api.replace("a", &PostParams::default(), &stale).await);
    assert_eq!((st.code, st.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        st.message,
        "Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // A merge patch carrying the stale version is conditional too.
    let p = json!({"metadata": {"resourceVersion": v1.resource_version()}, "data": {"k": "4"}});
    let st = status(
        api.patch("a", &PatchParams::default(), &Patch::Merge(&p))
            .await,
    );
    assert_eq!(st.code, 409);
    assert_eq!(api.get("a").await.unwrap().data.unwrap()["k"], "2");
}

#[tokio::test]
async fn already_exists_and_generate_name() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    api.create(&PostParams::default(), &cm("a", json!({}), json!({})))
        .await
        .unwrap();
    let st = status(
        api.create(&PostParams::default(), &cm("a", json!({}), json!({})))
            .await,
    );
    assert_eq!(
        (st.code, st.reason.as_str(), st.message.as_str()),
        (409, "AlreadyExists", "configmaps \"a\" already exists")
    );

    let generated: ConfigMap = obj(json!({"metadata": {"generateName": "web-"}}));
    let made = api
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    let name = made.name_any();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");

    let nameless: ConfigMap = obj(json!({"metadata": {}}));
    let st = status(api.create(&PostParams::default(), &nameless).await);
    assert_eq!(st.code, 422);
    assert_eq!(
        st.message,
        "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );
}

#[tokio::test]
async fn namespaces_must_exist_and_are_defaulted() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let in_nope: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let st = status(
        in_nope
            .create(&PostParams::default(), &cm("a", json!({}), json!({})))
            .await,
    );
    assert_eq!(
        (st.code, st.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );
    assert_eq!(
        st.details.as_ref().map(|d| d.kind.as_str()),
        Some("namespaces")
    );

    let nss: Api<Namespace> = Api::all(client.clone());
    let ns = nss
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "nope"}})),
        )
        .await
        .unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));
    assert_eq!(
        ns.spec.unwrap().finalizers,
        Some(vec!["kubernetes".to_string()])
    );
    assert_eq!(
        ns.metadata.labels.unwrap()["kubernetes.io/metadata.name"],
        "nope"
    );
    in_nope
        .create(&PostParams::default(), &cm("a", json!({}), json!({})))
        .await
        .unwrap();

    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert_eq!(
        names,
        vec![
            "default",
            "kube-node-lease",
            "kube-public",
            "kube-system",
            "nope"
        ]
    );
    let bad = status(
        nss.create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "a.b"}})),
        )
        .await,
    );
    assert_eq!(bad.code, 422, "namespace names are DNS-1123 labels");
}

#[tokio::test]
async fn names_are_validated_per_resource() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let st = status(
        cms.create(
            &PostParams::default(),
            &cm("Bad_Name", json!({}), json!({})),
        )
        .await,
    );
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
    let causes = st.details.unwrap().causes;
    assert_eq!(causes.len(), 1);
    assert_eq!(
        (causes[0].field.as_str(), causes[0].reason.as_str()),
        ("metadata.name", "FieldValueInvalid")
    );
    // Subdomains allow a leading digit; Service names are DNS-1035 labels and do not.
    cms.create(&PostParams::default(), &cm("1abc", json!({}), json!({})))
        .await
        .unwrap();
    let svcs: Api<Service> = Api::default_namespaced(client);
    let svc: Service =
        obj(json!({"metadata": {"name": "1abc"}, "spec": {"ports": [{"port": 80}]}}));
    let st = status(svcs.create(&PostParams::default(), &svc).await);
    assert_eq!(st.code, 422);
    assert!(
        st.message.starts_with(
            "Service \"1abc\" is invalid: metadata.name: Invalid value: \"1abc\": a DNS-1035 label"
        ),
        "{}",
        st.message
    );
    let bad_label = cm("ok", json!({"app": "-x-"}), json!({}));
    assert_eq!(
        status(cms.create(&PostParams::default(), &bad_label).await)
            .details
            .unwrap()
            .causes[0]
            .field,
        "metadata.labels"
    );
}

#[tokio::test]
async fn custom_resources_refuse_unconditional_put_and_validate() {
    let server = FakeApiServer::start().await;
    server.register(crds::service_records()).unwrap();
    let api: Api<DynamicObject> =
        Api::default_namespaced_with(server.client(), &service_record_resource());
    let sr = service_record(
        "web",
        "web.example.com",
        json!([{"address": "10.0.0.1", "port": 80}]),
    );
    let created = api.create(&PostParams::default(), &sr).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));

    let mut no_rv = created.clone();
    no_rv.metadata.resource_version = None;
    no_rv.data["spec"]["fqdn"] = "other.example.com".into();
    let st = status(api.replace("web", &PostParams::default(), &no_rv).await);
    assert_eq!(st.code, 422);
    assert_eq!(
        st.message,
        "ServiceRecord.connectivity.tanzu.vmware.com \"web\" is invalid: metadata.resourceVersion: Invalid value: \"0x0\": must be specified for an update"
    );
    let mut with_rv = created.clone();
    with_rv.data["spec"]["fqdn"] = "other.example.com".into();
    let replaced = api
        .replace("web", &PostParams::default(), &with_rv)
        .await
        .unwrap();
    assert_eq!(replaced.metadata.generation, Some(2));

    let bad = service_record(
        "bad",
        "b.example.com",
        json!([{"address": "10.0.0.1", "port": 0}]),
    );
    let st = status(api.create(&PostParams::default(), &bad).await);
    assert_eq!(st.code, 422);
    let causes = st.details.unwrap().causes;
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].field, "spec.endpoints[0].port");
    assert_eq!(
        causes[0].message,
        "Invalid value: 0: spec.endpoints[0].port in body should be greater than or equal to 1"
    );
}

#[tokio::test]
async fn unknown_resources_are_404_status() {
    let server = FakeApiServer::start().await;
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("nope.io", "v1", "Nope"),
        "nopes",
    );
    let api: Api<DynamicObject> = Api::default_namespaced_with(server.client(), &ar);
    let st = status(api.list(&ListParams::default()).await);
    assert_eq!(
        (st.code, st.reason.as_str(), st.message.as_str()),
        (
            404,
            "NotFound",
            "the server could not find the requested resource"
        )
    );
}

#[tokio::test]
async fn list_selectors_pagination_and_cross_namespace() {
    let server = FakeApiServer::builder().namespace("other").start().await;
    let client = server.client();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "front"})),
        ("b", json!({"app": "web"})),
        ("c", json!({"app": "db"})),
        ("d", json!({})),
        ("e", json!({"app": "cache"})),
    ] {
        api.create(&PostParams::default(), &cm(name, labels, json!({})))
            .await
            .unwrap();
    }
    Api::<ConfigMap>::namespaced(client.clone(), "other")
        .create(
            &PostParams::default(),
            &cm("z", json!({"app": "web"}), json!({})),
        )
        .await
        .unwrap();
    let names = |l: kube::core::ObjectList<ConfigMap>| {
        l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    };
    for (sel, want) in [
        ("app=web", vec!["a", "b"]),
        ("app==web,tier=front", vec!["a"]),
        ("app!=web", vec!["c", "d", "e"]),
        ("app in (db,cache)", vec!["c", "e"]),
        ("app notin (web)", vec!["c", "d", "e"]),
        ("app", vec!["a", "b", "c", "e"]),
        ("!app", vec!["d"]),
    ] {
        assert_eq!(
            names(api.list(&ListParams::default().labels(sel)).await.unwrap()),
            want,
            "{sel}"
        );
    }
    assert_eq!(
        names(
            api.list(&ListParams::default().fields("metadata.name=c"))
                .await
                .unwrap()
        ),
        vec!["c"]
    );
    assert_eq!(
        names(
            api.list(
                &ListParams::default()
                    .fields("metadata.name!=c,metadata.namespace=default")
                    .labels("app")
            )
            .await
            .unwrap()
        ),
        vec!["a", "b", "e"]
    );
    let all: Api<ConfigMap> = Api::all(client.clone());
    let everywhere = all
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap();
    assert_eq!(
        everywhere
            .iter()
            .map(|c| format!("{}/{}", c.namespace().unwrap(), c.name_any()))
            .collect::<Vec<_>>(),
        vec!["default/a", "default/b", "other/z"]
    );
    assert_eq!(
        everywhere.metadata.resource_version,
        Some(server.resource_version().to_string())
    );

    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let token = first.metadata.continue_.clone().unwrap();
    let second = api
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    let token2 = second.metadata.continue_.clone().unwrap();
    let third = api
        .list(&ListParams::default().limit(2).continue_token(&token2))
        .await
        .unwrap();
    assert_eq!(third.metadata.continue_, None);
    assert_eq!(
        [names(first), names(second), names(third)].concat(),
        vec!["a", "b", "c", "d", "e"]
    );

    let st = status(api.list(&ListParams::default().labels("app in (")).await);
    assert_eq!(st.code, 400);
    let st = status(api.list(&ListParams::default().fields("spec.foo=x")).await);
    assert_eq!(
        (st.code, st.message.as_str()),
        (400, "field label not supported: spec.foo")
    );
}

#[tokio::test]
async fn counters_separate_requests_from_effective_writes() {
    let server = FakeApiServer::start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(server.client());
    server.reset_counters();
    let a = api
        .create(
            &PostParams::default(),
            &cm("a", json!({}), json!({"k": "1"})),
        )
        .await
        .unwrap();
    api.replace("a", &PostParams::default(), &a).await.unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "1"}})),
    )
    .await
    .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    status(api.create(&PostParams::default(), &a).await);
    api.get("a").await.unwrap();

    let req = server.requests();
    assert_eq!(
        (
            req.get("configmaps", Verb::Create),
            req.get("configmaps", Verb::Update),
            req.get("configmaps", Verb::Patch)
        ),
        (2, 1, 2)
    );
    let writes = server.writes();
    assert_eq!(
        writes.to_string(),
        "create configmaps: 1, patch configmaps: 1"
    );
    assert_eq!(server.reads().get("configmaps", Verb::Get), 1);
    server.reset_counters();
    assert_eq!((server.requests().total(), server.writes().total()), (0, 0));
}

#[tokio::test]
async fn service_deletion_returns_the_object() {
    let server = FakeApiServer::start().await;
    let api: Api<Service> = Api::default_namespaced(server.client());
    let svc: Service = obj(json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}));
    api.create(&PostParams::default(), &svc).await.unwrap();
    let gone = api.delete("web", &DeleteParams::default()).await.unwrap();
    assert_eq!(gone.left().map(|s| s.name_any()), Some("web".to_string()));
    assert_eq!(server.get("v1", "services", Some("default"), "web"), None);
}

#[tokio::test]
async fn kube_runtime_event_recorder_creates_then_patches_a_series() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let server = FakeApiServer::start().await;
    let client = server.client();
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let svc = svcs
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})),
        )
        .await
        .unwrap();
    let reporter = Reporter {
        controller: "xcc-binder".into(),
        instance: Some("binder-0".into()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let ev = Event {
        type_: EventType::Normal,
        reason: "Bound".into(),
        note: Some("materialised".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let reference = svc.object_ref(&());
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events: Vec<K8sEvent> = Api::<K8sEvent>::default_namespaced(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(
        (e.reason.as_deref(), e.reporting_controller.as_deref()),
        (Some("Bound"), Some("xcc-binder"))
    );
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("web")
    );
    assert_eq!(
        server.requests().get("events.events.k8s.io", Verb::Create),
        1
    );
    assert_eq!(
        server.requests().get("events.events.k8s.io", Verb::Patch),
        1
    );
}
