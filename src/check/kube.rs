//! The Kubernetes checks of `xcc check`: the CRDs a component reads are served, and the
//! component's identity may do exactly what `deploy/base` grants it (one
//! SelfSubjectAccessReview per verb and resource of its Role and ClusterRole, which are compiled
//! in from `deploy/base`, so the check cannot drift from what is shipped).

use std::collections::BTreeSet;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use serde_json::Value;

use super::report::Check;

/// A component whose RBAC `deploy/base` ships.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Component {
    Registry,
    Publisher,
    Binder,
}

impl Component {
    fn manifest(self) -> &'static str {
        match self {
            Component::Registry => include_str!("../../deploy/base/registry.yaml"),
            Component::Publisher => include_str!("../../deploy/base/publisher.yaml"),
            Component::Binder => include_str!("../../deploy/base/binder.yaml"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Component::Registry => "xcc-registry",
            Component::Publisher => "xcc-publisher",
            Component::Binder => "xcc-binder",
        }
    }
}

/// One permission: a verb on a resource (`group`, `resource`, optional subresource and name),
/// in the component's namespace or (`cluster_wide`) in all namespaces.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub cluster_wide: bool,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub verb: String,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {}/{}", self.verb, group, self.resource)?;
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        if !self.name.is_empty() {
            write!(f, " {}", self.name)?;
        }
        if self.cluster_wide {
            write!(f, " (all namespaces)")?;
        }
        Ok(())
    }
}

/// The permissions of `component`'s Role and ClusterRole in `deploy/base`.
pub fn permissions(component: Component) -> Vec<Permission> {
    let mut out = BTreeSet::new();
    for doc in yaml_serde::Deserializer::from_str(component.manifest()) {
        let Ok(v) = <yaml_serde::Value as serde::Deserialize>::deserialize(doc) else {
            continue;
        };
        let Ok(v) = serde_json::to_value(v) else {
            continue;
        };
        let cluster_wide = match v["kind"].as_str() {
            Some("ClusterRole") => true,
            Some("Role") => false,
            _ => continue,
        };
        if v["metadata"]["name"] != component.name() {
            continue;
        }
        for rule in v["rules"].as_array().into_iter().flatten() {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            };
            let names = {
                let n = list("resourceNames");
                if n.is_empty() { vec![String::new()] } else { n }
            };
            for group in list("apiGroups") {
                for res in list("resources") {
                    let (resource, sub) = res.split_once('/').unwrap_or((&res, ""));
                    for verb in list("verbs") {
                        for name in &names {
                            out.insert(Permission {
                                cluster_wide,
                                group: group.clone(),
                                resource: resource.to_string(),
                                subresource: sub.to_string(),
                                name: name.clone(),
                                verb: verb.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    out.into_iter().collect()
}

/// `rbac`: every permission of `component`, asked of the API server as this client's identity.
pub async fn rbac(client: &kube::Client, component: Component, namespace: &str) -> Check {
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client.clone());
    let wanted = permissions(component);
    let mut missing = vec![];
    for p in &wanted {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(p.group.clone()),
                    resource: Some(p.resource.clone()),
                    subresource: (!p.subresource.is_empty()).then(|| p.subresource.clone()),
                    name: (!p.name.is_empty()).then(|| p.name.clone()),
                    namespace: (!p.cluster_wide).then(|| namespace.to_string()),
                    verb: Some(p.verb.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &review).await {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => missing.push(p.to_string()),
            Err(e) => {
                return Check::fail(
                    "rbac",
                    format!("cannot ask the API server: {e}"),
                    "check the kubeconfig or the pod's ServiceAccount token",
                );
            }
        }
    }
    if missing.is_empty() {
        Check::ok(
            "rbac",
            format!(
                "all {} permissions of {} in deploy/base are granted",
                wanted.len(),
                component.name()
            ),
        )
    } else {
        Check::fail(
            "rbac",
            format!("{} may not: {}", component.name(), missing.join("; ")),
            format!(
                "apply deploy/base (kubectl apply -k deploy/base): its Role and ClusterRole {} grant these, bound to the ServiceAccount {}",
                component.name(),
                component.name()
            ),
        )
    }
}

/// A resource the component reads: API group/version, plural.
const CRDS: [(&str, &str); 2] = [
    ("connectivity.tanzu.vmware.com/v1alpha1", "servicerecords"),
    ("connectivity.tanzu.vmware.com/v1alpha1", "remoteregistries"),
];

/// `crds`: the resources xcc's objects live in are served (with their status subresources).
pub async fn crds(client: &kube::Client) -> Check {
    let mut missing = vec![];
    for (gv, plural) in CRDS {
        match client.list_api_group_resources(gv).await {
            Ok(list) => {
                for want in [plural.to_string(), format!("{plural}/status")] {
                    if !list.resources.iter().any(|r| r.name == want) {
                        missing.push(format!("{gv} {want}"));
                    }
                }
            }
            Err(e) if xcc_controller::plumbing::is_not_found(&e) => {
                missing.push(format!("{gv} {plural}"));
            }
            Err(e) => {
                return Check::fail(
                    "crds",
                    format!("cannot read the API server's discovery: {e}"),
                    "check the kubeconfig or the pod's ServiceAccount token",
                );
            }
        }
    }
    if missing.is_empty() {
        Check::ok(
            "crds",
            "ServiceRecord and RemoteRegistry (connectivity.tanzu.vmware.com/v1alpha1) are served",
        )
    } else {
        Check::fail(
            "crds",
            format!("not served: {}", missing.join(", ")),
            "install the CRDs: kubectl apply -k deploy/crds",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_are_read_from_deploy_base() {
        let p = permissions(Component::Registry);
        let has = |s: &str| p.iter().any(|x| x.to_string() == s);
        assert!(
            has("list connectivity.tanzu.vmware.com/remoteregistries"),
            "{p:?}"
        );
        assert!(has(
            "patch connectivity.tanzu.vmware.com/remoteregistries/status"
        ));
        assert!(has("patch core/configmaps xcc-name-owners"));
        assert!(has(
            "watch connectivity.tanzu.vmware.com/servicerecords (all namespaces)"
        ));
        // Only the registry's own roles: nothing of the publisher's.
        assert!(!has("list projectcontour.io/httpproxies (all namespaces)"));
        let publisher = permissions(Component::Publisher);
        assert!(
            publisher
                .iter()
                .any(|x| x.to_string() == "list projectcontour.io/httpproxies (all namespaces)")
        );
        assert!(permissions(Component::Binder).len() > 20);
    }
}
