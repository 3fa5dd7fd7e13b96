//! What the owner of a service creates when a caller is granted access (`--grant-mode`):
//! nothing, an Istio AuthorizationPolicy admitting the caller's identity, a Gateway API
//! HTTPRoute exposing the service (seed 000), or a CiliumNetworkPolicy admitting the caller's
//! cluster and service account (Cilium cluster mesh labels). Objects are named
//! `{prefix}{hash8}` (seed 002) so names are stable, short and collision-free, and carry the
//! service's name in a label for discoverability.
//!
//! Generation is pure; [`GrantSink`] applies or removes the objects (files in file mode).
//!
//! Every field of a route comes from the wire (a route notification relayed by the parent), so
//! [`check_route`] holds each one to the Kubernetes rule of what it names before it reaches an
//! object, a label or a file name, and [`FileGrants`] checks again that each file it writes or
//! removes is a plain file name directly under `grants/`. Which services may be granted at all
//! (only this cluster's own exports, to callers they admit) is decided by the caller of the sink,
//! the federation level (`owner_check`).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use xcc_proto::names::{
    is_dns1123_label, is_dns1123_subdomain, is_label_value, policy_object_name,
};

use super::level::OwnerRoute;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GrantMode {
    #[default]
    None,
    Istio,
    Gateway,
    Cilium,
}

impl std::str::FromStr for GrantMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(GrantMode::None),
            "istio" => Ok(GrantMode::Istio),
            "gateway" => Ok(GrantMode::Gateway),
            "cilium" => Ok(GrantMode::Cilium),
            other => Err(format!(
                "grant mode {other:?}: use none, istio, gateway or cilium"
            )),
        }
    }
}

pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "xcc";
pub const SOURCE_NAME_LABEL: &str = "connectivity.tanzu.vmware.com/source-name";
pub const CALLER_ANNOTATION: &str = "connectivity.tanzu.vmware.com/caller";

fn metadata(name: String, r: &OwnerRoute) -> Value {
    json!({
        "name": name,
        "namespace": r.target_namespace,
        "labels": {
            MANAGED_BY_LABEL: MANAGED_BY,
            SOURCE_NAME_LABEL: r.target_service,
        },
        "annotations": {
            CALLER_ANNOTATION: format!("{}/{}", r.caller_cluster, r.caller_service),
        },
    })
}

fn parts(r: &OwnerRoute) -> [&str; 4] {
    [
        &r.target_namespace,
        &r.target_service,
        &r.caller_cluster,
        &r.caller_service,
    ]
}

/// The objects for `route` in `mode` (empty for `None`).
pub fn objects(mode: GrantMode, r: &OwnerRoute) -> Vec<Value> {
    match mode {
        GrantMode::None => vec![],
        GrantMode::Istio => vec![json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": metadata(policy_object_name("allow-to-", &parts(r)), r),
            "spec": {
                "selector": {"matchLabels": {"app": r.target_service}},
                "action": "ALLOW",
                "rules": [{
                    "from": [{"source": {"principals": [
                        // The caller's workload identity as seed 000 spells it.
                        format!("cluster.local/ns/{}/sa/{}", r.caller_cluster, r.caller_service)
                    ]}}]
                }],
            },
        })],
        GrantMode::Gateway => vec![json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": metadata(policy_object_name("route-", &parts(r)), r),
            "spec": {
                "parentRefs": [{"name": "mesh-gateway"}],
                "hostnames": [format!("{}.{}.global", r.target_service, r.target_namespace)],
                "rules": [{"backendRefs": [{"name": r.target_service, "port": 80}]}],
            },
        })],
        GrantMode::Cilium => vec![json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNetworkPolicy",
            "metadata": metadata(policy_object_name("cnp-mesh-", &parts(r)), r),
            "spec": {
                "endpointSelector": {"matchLabels": {"app": r.target_service}},
                "ingress": [{"fromEndpoints": [{"matchLabels": {
                    "io.cilium.k8s.policy.cluster": r.caller_cluster,
                    "io.cilium.k8s.policy.serviceaccount": r.caller_service,
                }}]}],
            },
        })],
    }
}

/// Check every name of a route against the Kubernetes rule of what it names, before any of it is
/// used: the target namespace is a namespace (DNS-1123 label); the target service names an
/// exported record (DNS-1123 subdomain) and is written as the `app` label value (at most 63
/// characters); the caller cluster is a cluster name (DNS-1123 label); the caller service is a
/// service account (DNS-1123 subdomain) written as a label value. The error names the field and
/// quotes the value.
pub fn check_route(r: &OwnerRoute) -> Result<(), String> {
    let bad = |field: &str, value: &str, rule: &str| {
        Err(format!("route {field} {value:?} is not {rule}"))
    };
    if !is_dns1123_label(&r.target_namespace) {
        return bad(
            "target namespace",
            &r.target_namespace,
            "a namespace name (DNS-1123 label)",
        );
    }
    if !is_dns1123_subdomain(&r.target_service) || !is_label_value(&r.target_service) {
        return bad(
            "target service",
            &r.target_service,
            "a DNS-1123 subdomain of at most 63 characters",
        );
    }
    if !is_dns1123_label(&r.caller_cluster) {
        return bad(
            "caller cluster",
            &r.caller_cluster,
            "a cluster name (DNS-1123 label)",
        );
    }
    if !is_dns1123_subdomain(&r.caller_service) || !is_label_value(&r.caller_service) {
        return bad(
            "caller service",
            &r.caller_service,
            "a DNS-1123 subdomain of at most 63 characters",
        );
    }
    Ok(())
}

/// `namespace/name` of an object.
pub fn object_ref(o: &Value) -> String {
    format!(
        "{}/{}/{}",
        o["kind"].as_str().unwrap_or_default(),
        o["metadata"]["namespace"].as_str().unwrap_or_default(),
        o["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Applies and removes grant objects.
pub trait GrantSink: Send + Sync + 'static {
    /// Apply the objects for a new grant; returns their references.
    fn apply(&self, route: &OwnerRoute) -> Result<Vec<String>, String>;
    /// Remove the objects of a revoked grant.
    fn remove(&self, route: &OwnerRoute) -> Result<(), String>;
}

/// Records nothing beyond the route table (grant mode `none`).
pub struct NoGrants;

impl GrantSink for NoGrants {
    fn apply(&self, _route: &OwnerRoute) -> Result<Vec<String>, String> {
        Ok(vec![])
    }
    fn remove(&self, _route: &OwnerRoute) -> Result<(), String> {
        Ok(())
    }
}

/// File mode: one YAML file per object under `<state-dir>/grants/`, for an operator or a GitOps
/// pipeline to apply; removed on revoke.
pub struct FileGrants {
    dir: PathBuf,
    mode: GrantMode,
}

impl FileGrants {
    pub fn new(state_dir: &Path, mode: GrantMode) -> std::io::Result<Self> {
        let dir = state_dir.join("grants");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir, mode })
    }

    /// The file of object `o`: `grants/<namespace>.<name>.yaml`. Both parts must be names
    /// (a namespace is a DNS-1123 label, an object name a DNS-1123 subdomain), so the file name
    /// holds no separator and no `..`; the result is checked to lie directly in `grants/`.
    fn path(&self, o: &Value) -> Result<PathBuf, String> {
        let namespace = o["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        if !is_dns1123_label(namespace) || !is_dns1123_subdomain(name) {
            return Err(format!(
                "grant object {namespace:?}/{name:?}: not a namespace and object name; no file written"
            ));
        }
        let path = self.dir.join(format!("{namespace}.{name}.yaml"));
        if path.parent() != Some(self.dir.as_path()) {
            return Err(format!(
                "grant file {} is not directly in {}",
                path.display(),
                self.dir.display()
            ));
        }
        Ok(path)
    }
}

impl GrantSink for FileGrants {
    fn apply(&self, route: &OwnerRoute) -> Result<Vec<String>, String> {
        check_route(route)?;
        let mut refs = vec![];
        for o in objects(self.mode, route) {
            let text = serde_yaml::to_string(&o).map_err(|e| e.to_string())?;
            let path = self.path(&o)?;
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text)
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            refs.push(object_ref(&o));
        }
        Ok(refs)
    }

    fn remove(&self, route: &OwnerRoute) -> Result<(), String> {
        check_route(route)?;
        for o in objects(self.mode, route) {
            let path = self.path(&o)?;
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!("{}: {e}", path.display()));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn route() -> OwnerRoute {
        OwnerRoute {
            target_namespace: "shop".into(),
            target_service: "api".into(),
            caller_cluster: "b1".into(),
            caller_service: "web".into(),
            resolver_cluster: "b".into(),
            since: SystemTime::UNIX_EPOCH,
            applied: vec![],
        }
    }

    #[test]
    fn names_are_prefix_and_hash8_of_the_parts() {
        let expect =
            xcc_proto::names::policy_object_name("allow-to-", &["shop", "api", "b1", "web"]);
        assert!(expect.starts_with("allow-to-") && expect.len() == "allow-to-".len() + 8);
        let o = &objects(GrantMode::Istio, &route())[0];
        assert_eq!(o["metadata"]["name"], expect.as_str());
        assert_eq!(o["metadata"]["namespace"], "shop");
        assert_eq!(o["metadata"]["labels"][SOURCE_NAME_LABEL], "api");
        assert_eq!(
            o["spec"]["rules"][0]["from"][0]["source"]["principals"][0],
            "cluster.local/ns/b1/sa/web"
        );
        assert!(objects(GrantMode::None, &route()).is_empty());
    }

    #[test]
    fn gateway_and_cilium_shapes() {
        let g = &objects(GrantMode::Gateway, &route())[0];
        assert_eq!(
            (g["kind"].as_str(), g["spec"]["hostnames"][0].as_str()),
            (Some("HTTPRoute"), Some("api.shop.global"))
        );
        let c = &objects(GrantMode::Cilium, &route())[0];
        assert_eq!(c["apiVersion"], "cilium.io/v2");
        assert_eq!(
            c["spec"]["ingress"][0]["fromEndpoints"][0]["matchLabels"]["io.cilium.k8s.policy.cluster"],
            "b1"
        );
        assert!(object_ref(c).starts_with("CiliumNetworkPolicy/shop/cnp-mesh-"));
    }

    #[test]
    fn file_grants_write_and_remove() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FileGrants::new(dir.path(), GrantMode::Istio).expect("sink");
        let refs = sink.apply(&route()).expect("apply");
        assert_eq!(refs.len(), 1);
        let files: Vec<_> = std::fs::read_dir(dir.path().join("grants"))
            .expect("dir")
            .flatten()
            .collect();
        assert_eq!(files.len(), 1);
        let text = std::fs::read_to_string(files[0].path()).expect("read");
        assert!(text.contains("kind: AuthorizationPolicy"), "{text}");
        sink.remove(&route()).expect("remove");
        assert_eq!(
            std::fs::read_dir(dir.path().join("grants"))
                .expect("dir")
                .count(),
            0
        );
        sink.remove(&route()).expect("idempotent");
    }

    #[test]
    fn route_names_follow_the_kubernetes_rules() {
        assert_eq!(check_route(&route()), Ok(()));
        let with = |f: &dyn Fn(&mut OwnerRoute)| {
            let mut r = route();
            f(&mut r);
            check_route(&r)
        };
        assert_eq!(
            with(&|r| r.target_namespace = "/etc".into()),
            Err(r#"route target namespace "/etc" is not a namespace name (DNS-1123 label)"#.into())
        );
        for bad_ns in ["..", "../x", "a/b", "", "Shop", "a.b", &"a".repeat(64)] {
            assert!(
                with(&|r| r.target_namespace = bad_ns.into()).is_err(),
                "{bad_ns}"
            );
        }
        for bad_service in ["", "..", "a/b", "API", &"a".repeat(64)] {
            assert!(
                with(&|r| r.target_service = bad_service.into()).is_err(),
                "{bad_service}"
            );
        }
        assert!(with(&|r| r.caller_cluster = "b1/x".into()).is_err());
        assert!(with(&|r| r.caller_service = "web\n".into()).is_err());
        assert_eq!(with(&|r| r.target_service = "api.v2".into()), Ok(()));
    }

    #[test]
    fn file_grants_refuse_hostile_names_without_touching_the_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FileGrants::new(&dir.path().join("state"), GrantMode::Istio).expect("sink");
        let mut r = route();
        r.target_namespace = dir.path().join("abs").display().to_string();
        assert!(sink.apply(&r).is_err());
        r.target_namespace = "../../x".into();
        assert!(sink.apply(&r).is_err());
        assert!(sink.remove(&r).is_err());
        // Only the (empty) grants directory exists.
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
        assert_eq!(
            std::fs::read_dir(dir.path().join("state/grants"))
                .expect("dir")
                .count(),
            0
        );
    }
}
