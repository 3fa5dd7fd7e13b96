//! Discovery documents rendered from the registry: `/version`, `/api`, `/api/v1`, `/apis`,
//! `/apis/{group}` and `/apis/{group}/{version}` in the legacy format, and `/api` / `/apis` in the
//! aggregated `apidiscovery.k8s.io/v2` format when the client asks for it in `Accept` (what
//! `kube::Discovery::run_aggregated` and recent kubectl do).

use serde_json::{Value, json};

use crate::resources::{Registry, Resource, api_version, verbs};

/// Media type of aggregated discovery v2 responses.
pub(crate) const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether an `Accept` header asks for aggregated discovery v2.
pub(crate) fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let p: Vec<&str> = part.split(';').map(str::trim).collect();
        p.contains(&"g=apidiscovery.k8s.io")
            && p.contains(&"v=v2")
            && p.contains(&"as=APIGroupDiscoveryList")
    })
}

/// The Kubernetes version the fake claims to be (matching the k8s-openapi feature in use).
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "emulationMajor": "1",
        "emulationMinor": "35",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "34",
        "gitVersion": "v1.35.0-xcc-kube-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn singular(r: &Resource) -> String {
    r.spec.kind.to_ascii_lowercase()
}

fn resource_entries(r: &Resource) -> Vec<Value> {
    let mut main = json!({
        "name": r.spec.plural,
        "singularName": singular(r),
        "namespaced": r.spec.namespaced,
        "kind": r.spec.kind,
        "verbs": verbs(),
    });
    if !r.spec.short_names.is_empty() {
        main["shortNames"] = json!(r.spec.short_names);
    }
    let mut out = vec![main];
    if r.spec.status_subresource {
        out.push(json!({
            "name": format!("{}/status", r.spec.plural),
            "singularName": "",
            "namespaced": r.spec.namespaced,
            "kind": r.spec.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    out
}

/// `APIResourceList` for one group/version, or `None` if nothing is served there.
pub(crate) fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources = reg.in_group_version(group, version);
    if resources.is_empty() {
        return None;
    }
    let entries: Vec<Value> = resources.iter().flat_map(|r| resource_entries(r)).collect();
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": api_version(group, version),
        "resources": entries,
    }))
}

fn group_json(reg: &Registry, group: &str) -> Value {
    let versions: Vec<Value> = reg
        .versions(group)
        .iter()
        .map(|v| json!({"groupVersion": api_version(group, v), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": group, "versions": versions, "preferredVersion": preferred})
}

pub(crate) fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg.groups().iter().map(|g| group_json(reg, g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub(crate) fn group(reg: &Registry, group: &str) -> Option<Value> {
    if reg.versions(group).is_empty() {
        return None;
    }
    let mut g = group_json(reg, group);
    g["kind"] = "APIGroup".into();
    g["apiVersion"] = "v1".into();
    Some(g)
}

fn aggregated_group(reg: &Registry, group: &str) -> Value {
    let versions: Vec<Value> = reg
        .versions(group)
        .iter()
        .map(|v| {
            let resources: Vec<Value> = reg
                .in_group_version(group, v)
                .iter()
                .map(|r| {
                    let kind = json!({"group": group, "version": v, "kind": r.spec.kind});
                    let mut e = json!({
                        "resource": r.spec.plural,
                        "responseKind": kind,
                        "scope": if r.spec.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": singular(r),
                        "verbs": verbs(),
                    });
                    if !r.spec.short_names.is_empty() {
                        e["shortNames"] = json!(r.spec.short_names);
                    }
                    if r.spec.status_subresource {
                        e["subresources"] = json!([{
                            "subresource": "status",
                            "responseKind": kind,
                            "verbs": ["get", "patch", "update"],
                        }]);
                    }
                    e
                })
                .collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    json!({"metadata": {"name": group}, "versions": versions})
}

/// Aggregated discovery for the core group (`/api`) or all named groups (`/apis`).
pub(crate) fn aggregated(reg: &Registry, core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group(reg, "")]
    } else {
        reg.groups()
            .iter()
            .map(|g| aggregated_group(reg, g))
            .collect()
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_header_detection() {
        assert!(wants_aggregated(AGGREGATED_V2));
        assert!(wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated("application/json"));
        assert!(!wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        ));
    }

    #[test]
    fn core_list_has_status_subresources() {
        let reg = Registry::with_builtins();
        let list = resource_list(&reg, "", "v1").unwrap();
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(names.contains(&"services") && names.contains(&"services/status"));
        assert!(!names.contains(&"endpoints/status"));
        assert!(resource_list(&reg, "nope.io", "v1").is_none());
    }
}
