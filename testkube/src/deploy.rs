//! The repository's `deploy/` as the tests use it: kubectl, rendering an overlay, the RBAC a
//! ServiceAccount is bound to, applying documents through discovery.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::{ASSETS_ENV, DEPLOY_NS, MANAGER, UPSTREAM_CRDS_ENV};

/// `kubectl`: from the assets directory when it has one (envtest ships it), else `PATH`.
pub fn kubectl() -> Command {
    match std::env::var_os(ASSETS_ENV).map(|d| PathBuf::from(d).join("kubectl")) {
        Some(k) if k.is_file() => Command::new(k),
        _ => Command::new("kubectl"),
    }
}

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Upstream CRDs of the APIs xcc reads or writes (Contour HTTPProxy, Istio, Gateway API,
/// Cilium, ...): `XCC_UPSTREAM_CRDS`, else `shared/kube/crds` beside the repository (CI's layout).
pub fn upstream_crds() -> PathBuf {
    let dir = std::env::var_os(UPSTREAM_CRDS_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/kube/crds"));
    assert!(
        dir.is_dir(),
        "no upstream CRDs at {}: set {UPSTREAM_CRDS_ENV} to a directory of CRD YAML files",
        dir.display()
    );
    dir
}

/// `kubectl kustomize deploy/<overlay>` as JSON documents.
pub fn render(overlay: &str) -> Vec<Value> {
    let dir = deploy_dir().join(overlay);
    let out = kubectl()
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("running kubectl (install it, e.g. Debian's kubectl): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_docs(&String::from_utf8(out.stdout).unwrap())
}

/// The documents of a multi-document YAML text.
pub fn yaml_docs(text: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(text)
        .map(|d| {
            let v: yaml_serde::Value = serde::Deserialize::deserialize(d).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .filter(|v| v.is_object())
        .collect()
}

/// The ServiceAccounts and RBAC objects of `docs`, moved from the xcc namespace into `ns`.
pub(crate) fn rbac_for(docs: &[Value], ns: &str) -> Vec<Value> {
    let kinds = [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    ];
    docs.iter()
        .filter(|d| kinds.iter().any(|k| d["kind"] == *k))
        .cloned()
        .map(|mut d| {
            let meta = &mut d["metadata"];
            if meta["namespace"] == DEPLOY_NS {
                meta["namespace"] = json!(ns);
            }
            if d["kind"].as_str().is_some_and(|k| k.starts_with("Cluster")) {
                let name = format!("{}-{ns}", d["metadata"]["name"].as_str().unwrap());
                d["metadata"]["name"] = json!(name);
            }
            if d["roleRef"]["kind"] == "ClusterRole" {
                let name = format!("{}-{ns}", d["roleRef"]["name"].as_str().unwrap());
                d["roleRef"]["name"] = json!(name);
            }
            if let Some(subjects) = d.get_mut("subjects").and_then(Value::as_array_mut) {
                for s in subjects {
                    if s["namespace"] == DEPLOY_NS {
                        s["namespace"] = json!(ns);
                    }
                }
            }
            d
        })
        .collect()
}

pub(crate) fn ar(api_version: &str, kind: &str, plural: &str) -> kube::api::ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    kube::api::ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The API of `doc`'s kind (discovered: CRDs just created may take a moment to serve).
pub async fn api_for(client: &kube::Client, doc: &Value) -> Api<DynamicObject> {
    let api_version = doc["apiVersion"].as_str().unwrap();
    let kind = doc["kind"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (resource, caps) = loop {
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => break found,
            Err(e) if Instant::now() >= deadline => panic!("discovering {api_version} {kind}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    match (caps.scope, doc["metadata"]["namespace"].as_str()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    }
}

pub(crate) async fn apply(client: &kube::Client, doc: &Value) {
    let api = api_for(client, doc).await;
    let name = doc["metadata"]["name"].as_str().unwrap();
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(doc),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {} {name}: {e}", doc["kind"]));
    if doc["kind"] == "CustomResourceDefinition" {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let crd = api.get(name).await.unwrap();
            let established = crd.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Established" && c["status"] == "True");
            if established {
                break;
            }
            assert!(Instant::now() < deadline, "CRD {name} not established");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
