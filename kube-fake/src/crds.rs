//! The custom resources xcc reads and writes, ready to register.
//!
//! ServiceRecord and RemoteRegistry come from the checked-in CRDs in `deploy/crds` (generated
//! from the Rust types in `xcc-proto` and drift-tested there), so the fake enforces exactly the
//! schemas a real cluster enforces: pruning, defaults, required fields, patterns, bounds, enums,
//! list types. Their one CEL rule is checked by [`validate_remote_registry_imports`] with xcc's own
//! Rust form of it ([`Import::target`], held to the real API server by a test). Istio's
//! AuthorizationPolicy (like Contour's HTTPProxy, which is preloaded) is registered without a
//! schema: any content is accepted and kept.

use serde::Deserialize as _;
use serde_json::Value;
use xcc_proto::crd::{IMPORT_RULE_MESSAGE, Import};

use crate::resources::ResourceSpec;

/// Group of the XCC resources.
pub const XCC_GROUP: &str = "connectivity.tanzu.vmware.com";

/// The ServiceRecord CRD as deployed.
pub const SERVICE_RECORDS_CRD: &str =
    include_str!("../../deploy/crds/servicerecords.connectivity.tanzu.vmware.com.yaml");
/// The RemoteRegistry CRD as deployed.
pub const REMOTE_REGISTRIES_CRD: &str =
    include_str!("../../deploy/crds/remoteregistries.connectivity.tanzu.vmware.com.yaml");

/// The storage version of a checked-in CRD.
///
/// # Panics
/// If the embedded YAML does not parse; a unit test guarantees it does.
fn storage_version(yaml: &str, what: &str) -> ResourceSpec {
    match ResourceSpec::from_crd_yaml(yaml) {
        Ok(versions) => match versions.into_iter().next() {
            Some(v) => v,
            None => panic!("the checked-in {what} CRD serves no version"),
        },
        Err(e) => panic!("the checked-in {what} CRD does not parse: {e}"),
    }
}

/// `connectivity.tanzu.vmware.com/v1alpha1` ServiceRecord with its deployed schema.
pub fn service_records() -> ResourceSpec {
    storage_version(SERVICE_RECORDS_CRD, "ServiceRecord")
}

/// `connectivity.tanzu.vmware.com/v1alpha1` RemoteRegistry with its deployed schema and the
/// `imports` CEL rule.
pub fn remote_registries() -> ResourceSpec {
    storage_version(REMOTE_REGISTRIES_CRD, "RemoteRegistry")
        .with_validator(validate_remote_registry_imports)
}

/// `security.istio.io/v1` AuthorizationPolicy (schemaless).
pub fn istio_authorization_policies() -> ResourceSpec {
    ResourceSpec::new(
        "security.istio.io",
        "v1",
        "AuthorizationPolicy",
        "authorizationpolicies",
        true,
    )
    .with_status_subresource()
}

/// Every spec in this module.
pub fn all() -> Vec<ResourceSpec> {
    vec![
        service_records(),
        remote_registries(),
        istio_authorization_policies(),
    ]
}

/// The RemoteRegistry CEL rule on `spec.imports[]` ([`xcc_proto::crd::IMPORT_RULE`]). An entry
/// that is not an import at all is left to the schema, as the API server does.
pub fn validate_remote_registry_imports(obj: &Value) -> Result<(), Vec<String>> {
    let imports = obj
        .pointer("/spec/imports")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let errs: Vec<String> = imports
        .iter()
        .enumerate()
        .filter(|(_, imp)| Import::deserialize(*imp).is_ok_and(|import| import.target().is_none()))
        .map(|(i, _)| {
            format!("spec.imports[{i}]: Invalid value: \"object\": {IMPORT_RULE_MESSAGE}")
        })
        .collect();
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ListKind;
    use crate::schema::Schema;
    use serde_json::json;

    #[test]
    fn checked_in_crds_parse_with_schemas() {
        for (spec, kind) in [
            (service_records(), "ServiceRecord"),
            (remote_registries(), "RemoteRegistry"),
        ] {
            assert_eq!(
                (
                    spec.group.as_str(),
                    spec.version.as_str(),
                    spec.kind.as_str()
                ),
                (XCC_GROUP, "v1alpha1", kind)
            );
            assert!(spec.namespaced && spec.status_subresource);
            let schema = Schema::compile(spec.schema.as_deref().unwrap()).unwrap();
            assert!(
                schema
                    .list_kinds()
                    .iter()
                    .any(|(p, k)| p == "status.conditions"
                        && matches!(k, ListKind::Map { keys, .. } if keys[0].0 == "type"))
            );
        }
    }

    #[test]
    fn service_record_schema_is_enforced() {
        let schema = Schema::compile(service_records().schema.as_deref().unwrap()).unwrap();
        let ok = json!({"spec": {"fqdn": "web.example.com", "endpoints": [{"address": "10.0.0.1", "port": 443}]}});
        assert_eq!(schema.validate(&ok), vec![]);
        let bad = json!({"spec": {"fqdn": "-bad", "endpoints": [{"address": "", "port": 70000}]}});
        let mut msgs: Vec<String> = schema.validate(&bad).iter().map(|e| e.message()).collect();
        msgs.sort();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert_eq!(
            msgs[0],
            "spec.endpoints[0].address: Invalid value: \"\": spec.endpoints[0].address in body should be at least 1 chars long"
        );
        assert_eq!(
            msgs[1],
            "spec.endpoints[0].port: Invalid value: 70000: spec.endpoints[0].port in body should be less than or equal to 65535"
        );
        assert!(
            msgs[2].starts_with(
                "spec.fqdn: Invalid value: \"-bad\": spec.fqdn in body should match '^"
            ),
            "{}",
            msgs[2]
        );
    }

    #[test]
    fn remote_registry_imports_rule() {
        let imports = |v: Value| json!({"spec": {"imports": v}});
        assert_eq!(
            validate_remote_registry_imports(&imports(
                json!([{"fqdn": "a.b"}, {"namespace": "n", "name": "x"}])
            )),
            Ok(())
        );
        assert_eq!(
            validate_remote_registry_imports(&imports(json!([{"fqdn": "a.b", "name": "x"}, {"name": "x"}]))),
            Err(vec![
                "spec.imports[0]: Invalid value: \"object\": give either fqdn, or namespace and name".to_string(),
                "spec.imports[1]: Invalid value: \"object\": give either fqdn, or namespace and name".to_string(),
            ])
        );
    }
}
