//! `deploy/`: every kustomization builds with `kubectl kustomize`, and every object it renders
//! is a valid Kubernetes object — deserialised into its k8s-openapi (or xcc CRD) type with no
//! field left over (a typo or a field of another API version fails) — and follows the house
//! rules: probes on the metrics port, non-root read-only containers without capabilities,
//! least-privilege RBAC that names only objects that exist.
//!
//! On a real API server (`xcc_testkube`, with the upstream CRDs installed), every target is
//! applied with `--dry-run=server` (`kubectl apply -f deploy/crds/` for real), and every grant
//! object the registry writes (Istio, Gateway API, Cilium) is accepted by the upstream schemas.
//!
//! Needs `kubectl` (with its built-in kustomize); without it the tests print a notice and check
//! nothing, unless `XCC_REQUIRE_KUBE=1` (CI), which makes that a failure.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use xcc_proto::crd::{RemoteRegistry, ServiceRecord};

const NAMESPACE: &str = "cross-cluster-connectivity";
/// The image every container runs: `xcc` at the crate's version (the `images:` entry of
/// deploy/base and deploy/dns/server), so one `kustomize edit set image xcc=...` in an overlay
/// replaces them all.
const IMAGE: &str = concat!("xcc:", env!("CARGO_PKG_VERSION"));
/// The image's user (`USER` in the Containerfile, distroless `nonroot`).
const IMAGE_USER: i64 = 65532;
const TARGETS: [&str; 14] = [
    "crds",
    "mcs/crds",
    "base",
    "overlays/exporter",
    "overlays/importer",
    "overlays/cilium",
    "overlays/mcs",
    "cert-manager",
    "examples",
    "dns",
    "dns/transparent",
    "overlays/grants-istio",
    "overlays/grants-gateway",
    "overlays/grants-cilium",
];

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// `kubectl kustomize <dir>` split into documents, or `None` when kubectl is not installed.
fn kustomize(dir: &Path) -> Option<Vec<Value>> {
    let output = match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("running kubectl: {e}"),
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let docs = yaml_serde::Deserializer::from_str(&text)
        .map(|d| {
            let v: yaml_serde::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect();
    Some(docs)
}

/// Paths of fields in `original` that the typed round trip lost: fields the type does not have.
fn lost_fields(original: &Value, round_trip: &Value, path: &str, out: &mut Vec<String>) {
    match (original, round_trip) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    Some(other) => lost_fields(value, other, &here, out),
                    None => out.push(here),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                lost_fields(x, y, &format!("{path}[{i}]"), out);
            }
            if a.len() != b.len() {
                out.push(format!("{path} (length)"));
            }
        }
        _ => {}
    }
}

/// Deserialise `doc` as `T` and fail on any field `T` does not know.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value, what: &str) -> T {
    let object: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: not a valid object: {e}"));
    let mut lost = Vec::new();
    lost_fields(doc, &serde_json::to_value(&object).unwrap(), "", &mut lost);
    assert!(lost.is_empty(), "{what}: unknown fields {lost:?}");
    object
}

fn str_at<'a>(doc: &'a Value, pointer: &str) -> &'a str {
    doc.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Everything a build renders, by kind, after validation.
#[derive(Default)]
struct Rendered {
    kinds: Vec<(String, String)>,
    deployments: Vec<Deployment>,
    service_accounts: BTreeSet<(String, String)>,
    roles: BTreeSet<(String, String)>,
    cluster_roles: BTreeSet<String>,
    role_bindings: Vec<RoleBinding>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    rules: Vec<(String, k8s_openapi::api::rbac::v1::PolicyRule)>,
    services: Vec<Service>,
}

fn validate(target: &str, docs: &[Value]) -> Rendered {
    let mut r = Rendered::default();
    for doc in docs {
        let api_version = str_at(doc, "/apiVersion");
        let kind = str_at(doc, "/kind");
        let name = str_at(doc, "/metadata/name");
        let what = format!("{target}: {kind} {name}");
        r.kinds.push((kind.to_string(), name.to_string()));
        match (api_version, kind) {
            ("v1", "Namespace") => {
                typed::<Namespace>(doc, &what);
            }
            ("v1", "ServiceAccount") => {
                let sa: ServiceAccount = typed(doc, &what);
                let ns = sa.metadata.namespace.clone().unwrap_or_default();
                r.service_accounts.insert((ns, name.to_string()));
            }
            ("v1", "Service") => r.services.push(typed(doc, &what)),
            ("apps/v1", "Deployment") => r.deployments.push(typed(doc, &what)),
            ("rbac.authorization.k8s.io/v1", "Role") => {
                let role: Role = typed(doc, &what);
                let ns = role.metadata.namespace.clone().unwrap_or_default();
                for rule in role.rules.into_iter().flatten() {
                    r.rules.push((what.clone(), rule));
                }
                r.roles.insert((ns, name.to_string()));
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                let role: ClusterRole = typed(doc, &what);
                for rule in role.rules.into_iter().flatten() {
                    r.rules.push((what.clone(), rule));
                }
                r.cluster_roles.insert(name.to_string());
            }
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                r.role_bindings.push(typed(doc, &what));
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                r.cluster_role_bindings.push(typed(doc, &what));
            }
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                typed::<CustomResourceDefinition>(doc, &what);
            }
            ("connectivity.tanzu.vmware.com/v1alpha1", "ServiceRecord") => {
                let sr: ServiceRecord = typed(doc, &what);
                sr.validate().unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            ("connectivity.tanzu.vmware.com/v1alpha1", "RemoteRegistry") => {
                let rr: RemoteRegistry = typed(doc, &what);
                rr.validate().unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            ("projectcontour.io/v1", "HTTPProxy") => {
                let fqdn = str_at(doc, "/spec/virtualhost/fqdn");
                xcc_proto::names::canonical_fqdn(fqdn).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            ("cert-manager.io/v1", "Issuer" | "Certificate") => {
                assert!(doc["spec"].is_object(), "{what}: no spec");
                if kind == "Certificate" {
                    assert!(
                        !str_at(doc, "/spec/secretName").is_empty(),
                        "{what}: no secretName"
                    );
                    assert!(
                        !str_at(doc, "/spec/issuerRef/name").is_empty(),
                        "{what}: no issuerRef"
                    );
                }
            }
            _ => panic!(
                "{what}: apiVersion {api_version:?} kind {kind:?} is not one this test knows"
            ),
        }
    }
    r
}

fn check_deployment(target: &str, d: &Deployment, r: &Rendered) {
    let name = d.metadata.name.clone().unwrap_or_default();
    let what = format!("{target}: Deployment {name}");
    assert_eq!(d.metadata.namespace.as_deref(), Some(NAMESPACE), "{what}");
    let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let sa = pod.service_account_name.clone().unwrap_or_default();
    assert!(
        r.service_accounts
            .contains(&(NAMESPACE.to_string(), sa.clone())),
        "{what}: service account {sa:?} is not rendered"
    );
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true), "{what}: runAsNonRoot");
    assert_eq!(psc.run_as_user, Some(IMAGE_USER), "{what}: runAsUser");
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault"),
        "{what}: seccomp"
    );
    for c in &pod.containers {
        assert_eq!(c.image.as_deref(), Some(IMAGE), "{what}: image");
        let csc = c.security_context.as_ref().unwrap();
        assert_eq!(
            csc.read_only_root_filesystem,
            Some(true),
            "{what}: readOnlyRootFilesystem"
        );
        assert_eq!(
            csc.allow_privilege_escalation,
            Some(false),
            "{what}: privilege escalation"
        );
        let drop = csc
            .capabilities
            .as_ref()
            .and_then(|c| c.drop.clone())
            .unwrap_or_default();
        assert_eq!(drop, ["ALL"], "{what}: capabilities");
        let res = c.resources.as_ref().unwrap();
        assert!(
            res.requests
                .as_ref()
                .is_some_and(|r| r.contains_key("memory")),
            "{what}: requests"
        );
        assert!(
            res.limits
                .as_ref()
                .is_some_and(|l| l.contains_key("memory")),
            "{what}: limits"
        );
        let metrics = c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("metrics"))
            .unwrap_or_else(|| panic!("{what}: no metrics port"));
        assert_eq!(metrics.container_port, 9090, "{what}");
        for (probe, path) in [
            (&c.liveness_probe, "/healthz"),
            (&c.readiness_probe, "/readyz"),
        ] {
            let get = probe.as_ref().and_then(|p| p.http_get.as_ref());
            let get = get.unwrap_or_else(|| panic!("{what}: no {path} probe"));
            assert_eq!(get.path.as_deref(), Some(path), "{what}");
            assert_eq!(
                serde_json::to_value(&get.port).unwrap(),
                Value::from("metrics"),
                "{what}: probe port"
            );
        }
    }
}

fn check_rbac(target: &str, r: &Rendered) {
    for (what, rule) in &r.rules {
        for list in [&rule.verbs, rule.resources.as_ref().unwrap_or(&Vec::new())] {
            assert!(
                !list.iter().any(|v| v == "*"),
                "{target}: {what}: wildcard in {list:?}"
            );
        }
        assert!(
            !rule.api_groups.iter().flatten().any(|g| g == "*"),
            "{target}: {what}: wildcard API group"
        );
    }
    let subjects_exist = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>,
                          what: &str| {
        for s in subjects.iter().flatten() {
            assert_eq!(s.kind, "ServiceAccount", "{what}");
            let key = (s.namespace.clone().unwrap_or_default(), s.name.clone());
            assert!(
                r.service_accounts.contains(&key),
                "{target}: {what}: subject {key:?} is not rendered"
            );
        }
    };
    for b in &r.role_bindings {
        let what = format!("RoleBinding {:?}", b.metadata.name);
        let ns = b.metadata.namespace.clone().unwrap_or_default();
        assert_eq!(b.role_ref.kind, "Role", "{target}: {what}");
        assert!(
            r.roles.contains(&(ns, b.role_ref.name.clone())),
            "{target}: {what}: role not rendered"
        );
        subjects_exist(&b.subjects, &what);
    }
    for b in &r.cluster_role_bindings {
        let what = format!("ClusterRoleBinding {:?}", b.metadata.name);
        assert!(
            r.cluster_roles.contains(&b.role_ref.name),
            "{target}: {what}: role not rendered"
        );
        subjects_exist(&b.subjects, &what);
    }
}

#[test]
fn kustomizations_render_valid_objects() {
    let deploy = deploy_dir();
    let mut checked = 0;
    for target in TARGETS {
        let Some(docs) = kustomize(&deploy.join(target)) else {
            assert!(
                std::env::var(xcc_testkube::REQUIRE_ENV).as_deref() != Ok("1"),
                "kubectl not found and {}=1",
                xcc_testkube::REQUIRE_ENV
            );
            eprintln!(
                "NOTICE: kubectl not found; deploy/ manifests were not checked (install kubectl)"
            );
            return;
        };
        assert!(!docs.is_empty(), "{target} renders nothing");
        let r = validate(target, &docs);
        for d in &r.deployments {
            check_deployment(target, d, &r);
        }
        check_rbac(target, &r);
        checked += docs.len();

        let has = |kind: &str, name: &str| r.kinds.iter().any(|(k, n)| k == kind && n == name);
        match target {
            "base" | "overlays/exporter" | "overlays/importer" | "overlays/cilium" => {
                assert!(has("Namespace", NAMESPACE), "{target}");
                assert!(has(
                    "CustomResourceDefinition",
                    "servicerecords.connectivity.tanzu.vmware.com"
                ));
                assert!(has("Deployment", "xcc-registry"), "{target}");
                let registry = r
                    .services
                    .iter()
                    .find(|s| s.metadata.name.as_deref() == Some("xcc-registry"))
                    .unwrap();
                let port = &registry.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
                assert_eq!(
                    (
                        port.name.as_deref(),
                        port.port,
                        port.app_protocol.as_deref()
                    ),
                    (Some("grpc"), 443, Some("tls"))
                );
                let registry_deploy = r
                    .deployments
                    .iter()
                    .find(|d| d.metadata.name.as_deref() == Some("xcc-registry"))
                    .unwrap();
                let container = &registry_deploy
                    .spec
                    .as_ref()
                    .unwrap()
                    .template
                    .spec
                    .as_ref()
                    .unwrap()
                    .containers[0];
                assert!(
                    container
                        .ports
                        .iter()
                        .flatten()
                        .any(|p| p.name.as_deref() == Some("grpc") && p.container_port == 8443)
                );
                let exporter = target == "overlays/exporter";
                let importer = target == "overlays/importer" || target == "overlays/cilium";
                assert_eq!(
                    has("Deployment", "xcc-publisher"),
                    !importer,
                    "{target}: publisher"
                );
                assert_eq!(
                    has("Deployment", "xcc-binder"),
                    !exporter,
                    "{target}: binder"
                );
                assert_eq!(
                    has("ClusterRole", "xcc-binder-cilium"),
                    target == "overlays/cilium"
                );
                let lb = registry.spec.as_ref().unwrap().type_.as_deref() == Some("LoadBalancer");
                assert_eq!(lb, exporter, "{target}: registry Service type");
            }
            "cert-manager" => {
                let cert = docs
                    .iter()
                    .find(|d| {
                        str_at(d, "/kind") == "Certificate"
                            && str_at(d, "/metadata/name") == "xcc-registry"
                    })
                    .unwrap();
                assert_eq!(str_at(cert, "/spec/secretName"), "xcc-registry-tls");
                assert!(
                    str_at(cert, "/spec/uris/0").starts_with("spiffe://"),
                    "URI SAN"
                );
                assert!(
                    str_at(cert, "/spec/uris/0").contains("/cluster/"),
                    "URI SAN"
                );
            }
            _ => {}
        }
    }
    assert!(checked > 20, "only {checked} objects checked");
}

#[test]
fn lost_fields_finds_unknown_keys() {
    let doc = serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "x", "lables": {"a": "b"}}, "automountServiceAccountToken": false});
    let sa: ServiceAccount = serde_json::from_value(doc.clone()).unwrap();
    let mut lost = Vec::new();
    lost_fields(&doc, &serde_json::to_value(&sa).unwrap(), "", &mut lost);
    assert_eq!(lost, [".metadata.lables"]);
}

/// `kubectl --kubeconfig <admin> args`; panics with its output unless it succeeds.
fn kubectl_ok(cp: &xcc_testkube::ControlPlane, args: &[&str]) -> String {
    let out = cp.kubectl().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {}:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn every_manifest_and_grant_object_is_accepted_by_a_real_api_server() {
    let test = "every_manifest_and_grant_object_is_accepted_by_a_real_api_server";
    let Some(cp) = xcc_testkube::shared(test) else {
        return;
    };
    let _turn = xcc_testkube::Turn::shared().await;
    cp.apply_dir(&xcc_testkube::upstream_crds()).await;
    let deploy = deploy_dir();
    let crds = deploy.join("crds");
    // The README's two ways to install the CRDs (the examples need them for real).
    kubectl_ok(cp, &["apply", "-f", crds.to_str().unwrap()]);
    kubectl_ok(
        cp,
        &["apply", "--dry-run=server", "-k", crds.to_str().unwrap()],
    );
    // Namespaces the manifests put objects into exist, as they would in a cluster.
    let mut namespaces = BTreeSet::new();
    for target in TARGETS {
        for doc in xcc_testkube::render(target) {
            if let Some(ns) = doc["metadata"]["namespace"].as_str() {
                namespaces.insert(ns.to_string());
            }
        }
    }
    let ns_docs: Vec<Value> = namespaces
        .iter()
        .map(|ns| serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
        .collect();
    cp.apply(&ns_docs).await;
    for target in TARGETS {
        let dir = deploy.join(target);
        let out = kubectl_ok(
            cp,
            &["apply", "--dry-run=server", "-k", dir.to_str().unwrap()],
        );
        assert!(out.contains("(server dry run)"), "{target}: {out}");
    }

    // What the registry writes per grant mode, in the namespace of the granted service.
    let client = cp.client().await;
    let shop = cp.namespace("grants").await;
    use xcc_registry::federation::grants::{
        ExportedService, GatewayRef, GrantConfig, GrantMode, WorkloadIdentity,
    };
    let route = xcc_registry::federation::level::OwnerRoute {
        target_namespace: shop.clone(),
        target_service: "api".into(),
        caller_cluster: "cluster-b".into(),
        caller_service: "web".into(),
        caller_identity: Some(WorkloadIdentity {
            trust_domain: "cluster.local".into(),
            namespace: "storefront".into(),
            service_account: "web".into(),
        }),
        exported: ExportedService {
            fqdn: "api.shop.svc.clusterset.local".into(),
            service: Some("api".into()),
            ports: vec![xcc_registry::catalog::NamedPort {
                name: "http".into(),
                port: 8080,
                protocol: "TCP".into(),
                target_port: 0,
            }],
            selector: Some("app.kubernetes.io/name=api".into()),
        },
        resolver_cluster: "cluster-b".into(),
        since: std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
        applied: vec![],
    };
    let mut kinds = Vec::new();
    for mode in [GrantMode::Istio, GrantMode::Gateway, GrantMode::Cilium] {
        let config = GrantConfig {
            gateway: Some(GatewayRef {
                namespace: "gateways".into(),
                name: "mesh".into(),
            }),
            ..GrantConfig::new(mode)
        };
        let objects = xcc_registry::federation::kube_grants::desired_objects(&config, &route)
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert!(!objects.is_empty(), "{mode:?} writes nothing");
        for object in objects {
            let api = xcc_testkube::api_for(&client, &object).await;
            let obj: kube::api::DynamicObject = serde_json::from_value(object.clone()).unwrap();
            let pp = kube::api::PostParams {
                dry_run: true,
                field_manager: None,
            };
            api.create(&pp, &obj)
                .await
                .unwrap_or_else(|e| panic!("{mode:?}: {e}\n{object:#}"));
            kinds.push(object["kind"].as_str().unwrap().to_string());
        }
    }
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        ["AuthorizationPolicy", "CiliumNetworkPolicy", "HTTPRoute"],
        "the grant kinds checked"
    );
}

/// The CRDs' CEL rules (`x-kubernetes-validations`; today the one on `RemoteRegistry
/// spec.imports[]`) and `validate()` decide the same: every row of one table, as JSON, is
/// created on a real API server (dry run) and checked by `RemoteRegistry::validate`, and both
/// must give the row's verdict — rejections for the rule's own reason.
#[tokio::test]
async fn crd_cel_rules_and_validate_agree_on_a_real_api_server() {
    use serde_json::json;
    use xcc_proto::crd::IMPORT_RULE_MESSAGE;

    let test = "crd_cel_rules_and_validate_agree_on_a_real_api_server";
    let Some(cp) = xcc_testkube::shared(test) else {
        return;
    };
    cp.apply_dir(&deploy_dir().join("crds")).await;
    let ns = cp.namespace("cel").await;
    let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        cp.client().await,
        &ns,
        &kube::api::ApiResource::erase::<RemoteRegistry>(&()),
    );
    // (import entry, accepted)
    let table = [
        (json!({"fqdn": "api.shop.example"}), true),
        (json!({"namespace": "shop", "name": "api"}), true),
        (
            json!({"fqdn": "api.shop.example", "requesterService": "web"}),
            true,
        ),
        (
            json!({"namespace": "shop", "name": "api", "requesterService": "web"}),
            true,
        ),
        (
            json!({"namespace": "shop", "name": "api", "requesterService": "web",
                   "requesterIdentity": {"namespace": "storefront", "serviceAccount": "web"}}),
            true,
        ),
        (
            json!({"fqdn": "api.shop.example", "requesterIdentity":
                   {"namespace": "storefront", "serviceAccount": "web",
                    "trustDomain": "west.mesh.example"}}),
            true,
        ),
        (
            json!({"requesterIdentity": {"namespace": "storefront", "serviceAccount": "web"}}),
            false,
        ),
        // An explicit null is no value (the API server prunes it before CEL runs).
        (json!({"fqdn": "api.shop.example", "namespace": null}), true),
        (
            json!({"fqdn": "api.shop.example", "namespace": "shop"}),
            false,
        ),
        (json!({"fqdn": "api.shop.example", "name": "api"}), false),
        (
            json!({"fqdn": "api.shop.example", "namespace": "shop", "name": "api"}),
            false,
        ),
        (json!({"name": "api"}), false),
        (json!({"namespace": "shop"}), false),
        (json!({"requesterService": "web"}), false),
        (json!({}), false),
    ];
    // Gather every disagreement so one run shows them all.
    let mut wrong = Vec::new();
    for (i, (import, accepted)) in table.iter().enumerate() {
        let object = json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
            "kind": "RemoteRegistry",
            "metadata": {"name": format!("row-{i}"), "namespace": ns},
            "spec": {
                "address": "parent.example:443",
                "tlsConfig": {"serverCA": "", "serverName": "parent.example"},
                "role": "Parent",
                "imports": [import],
            },
        });
        let rr: RemoteRegistry = serde_json::from_value(object.clone()).unwrap();
        let rust = match rr.validate() {
            Ok(()) => Ok(()),
            Err(xcc_proto::resources::ResourceError::Invalid { violations, .. }) => Err(violations
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()),
            Err(other) => panic!("row {i}: {other}"),
        };
        let rust_ok = match &rust {
            Ok(()) => true,
            Err(v) if *v == [format!("spec.imports[0]: {IMPORT_RULE_MESSAGE}")] => false,
            Err(v) => panic!("row {i} {import}: validate() rejects for another reason: {v:?}"),
        };
        let pp = kube::api::PostParams {
            dry_run: true,
            field_manager: None,
        };
        let raw: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
        let server = api.create(&pp, &raw).await;
        let server_ok = match server {
            Ok(_) => true,
            Err(kube::Error::Api(status))
                if status.code == 422
                    && status.message.contains(&format!(
                        "spec.imports[0]: Invalid value: \"object\": {IMPORT_RULE_MESSAGE}"
                    )) =>
            {
                false
            }
            Err(e) => panic!("row {i} {import}: the API server rejects for another reason: {e}"),
        };
        if (rust_ok, server_ok) != (*accepted, *accepted) {
            wrong.push(format!(
                "row {i} {import}: expected {accepted}, validate() {rust_ok}, API server {server_ok}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A ServiceRecord's port names follow a Service's (DNS-1123 labels, up to 63 characters, which
/// the publisher copies from the exported Service): the CRD's schema and `validate()` accept and
/// refuse the same names on a real API server (dry run).
#[tokio::test]
async fn service_record_port_names_follow_service_port_names_on_a_real_api_server() {
    use serde_json::json;

    let test = "service_record_port_names_follow_service_port_names_on_a_real_api_server";
    let Some(cp) = xcc_testkube::shared(test) else {
        return;
    };
    cp.apply_dir(&deploy_dir().join("crds")).await;
    let ns = cp.namespace("portnames").await;
    let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        cp.client().await,
        &ns,
        &kube::api::ApiResource::erase::<ServiceRecord>(&()),
    );
    let max = "p".repeat(63);
    let over = "p".repeat(64);
    // (port name, accepted)
    let table = [
        ("https", true),
        // Longer than an IANA service name (15), as Service port names may be.
        ("grpc-metrics-endpoint", true),
        ("123", true),
        ("a--b", true),
        (max.as_str(), true),
        (over.as_str(), false),
        ("Upper", false),
        ("under_score", false),
        ("-lead", false),
        ("trail-", false),
    ];
    let mut wrong = Vec::new();
    for (i, (name, accepted)) in table.iter().enumerate() {
        let object = json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
            "kind": "ServiceRecord",
            "metadata": {"name": format!("row-{i}.example"), "namespace": ns},
            "spec": {
                "fqdn": format!("row-{i}.example"),
                "endpoints": [{"address": "10.0.0.1", "port": 8443}],
                "ports": [{"name": name, "port": 443}],
            },
        });
        let sr: ServiceRecord = serde_json::from_value(object.clone()).unwrap();
        let rust_ok = match sr.validate() {
            Ok(()) => true,
            Err(xcc_proto::resources::ResourceError::Invalid { violations, .. })
                if violations.len() == 1
                    && violations[0]
                        .to_string()
                        .starts_with("spec.ports[0].name: ") =>
            {
                false
            }
            Err(other) => {
                panic!("row {i} {name:?}: validate() rejects for another reason: {other}")
            }
        };
        let pp = kube::api::PostParams {
            dry_run: true,
            field_manager: None,
        };
        let raw: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
        let server_ok = match api.create(&pp, &raw).await {
            Ok(_) => true,
            Err(kube::Error::Api(status))
                if status.code == 422 && status.message.contains("spec.ports[0].name") =>
            {
                false
            }
            Err(e) => panic!("row {i} {name:?}: the API server rejects for another reason: {e}"),
        };
        if (rust_ok, server_ok) != (*accepted, *accepted) {
            wrong.push(format!(
                "row {i} {name:?}: expected {accepted}, validate() {rust_ok}, API server {server_ok}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
