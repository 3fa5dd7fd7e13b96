//! Ready-made [`ResourceSpec`]s for the custom resources xcc reads and writes, with validators
//! that enforce what their CRD schemas enforce on a real cluster (required fields, types, port
//! ranges), using the apiserver's OpenAPI validation message style.

use serde_json::Value;

use crate::resources::ResourceSpec;

/// Group of the XCC resources.
pub const XCC_GROUP: &str = "connectivity.tanzu.vmware.com";

/// `connectivity.tanzu.vmware.com/v1alpha1` ServiceRecord (namespaced, `/status`), validated by
/// [`validate_service_record`].
pub fn service_records() -> ResourceSpec {
    ResourceSpec::new(
        XCC_GROUP,
        "v1alpha1",
        "ServiceRecord",
        "servicerecords",
        true,
    )
    .with_status_subresource()
    .with_validator(validate_service_record)
}

/// `connectivity.tanzu.vmware.com/v1alpha1` RemoteRegistry (namespaced, `/status`), validated by
/// [`validate_remote_registry`].
pub fn remote_registries() -> ResourceSpec {
    ResourceSpec::new(
        XCC_GROUP,
        "v1alpha1",
        "RemoteRegistry",
        "remoteregistries",
        true,
    )
    .with_status_subresource()
    .with_validator(validate_remote_registry)
}

/// `cilium.io/v2` CiliumNetworkPolicy.
pub fn cilium_network_policies() -> ResourceSpec {
    ResourceSpec::new(
        "cilium.io",
        "v2",
        "CiliumNetworkPolicy",
        "ciliumnetworkpolicies",
        true,
    )
    .with_status_subresource()
    .with_short_names(&["cnp", "ciliumnp"])
}

/// `security.istio.io/v1` AuthorizationPolicy.
pub fn istio_authorization_policies() -> ResourceSpec {
    ResourceSpec::new(
        "security.istio.io",
        "v1",
        "AuthorizationPolicy",
        "authorizationpolicies",
        true,
    )
    .with_status_subresource()
    .with_short_names(&["ap"])
}

/// `gateway.networking.k8s.io/v1` HTTPRoute.
pub fn gateway_http_routes() -> ResourceSpec {
    ResourceSpec::new(
        "gateway.networking.k8s.io",
        "v1",
        "HTTPRoute",
        "httproutes",
        true,
    )
    .with_status_subresource()
}

/// Every spec in this module.
pub fn all() -> Vec<ResourceSpec> {
    vec![
        service_records(),
        remote_registries(),
        cilium_network_policies(),
        istio_authorization_policies(),
        gateway_http_routes(),
    ]
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Checks that `obj[field]` exists and has JSON type `want`, reporting like the apiserver.
fn typed<'a>(
    obj: &'a Value,
    path: &str,
    field: &str,
    want: &str,
    errs: &mut Vec<String>,
) -> Option<&'a Value> {
    let full = if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    };
    match obj.get(field) {
        None | Some(Value::Null) => {
            errs.push(format!("{full}: Required value"));
            None
        }
        Some(v) if type_name(v) == want || (want == "number" && v.is_number()) => Some(v),
        Some(v) => {
            let got = type_name(v);
            errs.push(format!(
                "{full}: Invalid value: \"{got}\": {full} in body must be of type {want}: \"{got}\""
            ));
            None
        }
    }
}

fn finish(errs: Vec<String>) -> Result<(), Vec<String>> {
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

/// ServiceRecord schema: `spec.fqdn` string, `spec.endpoints[]` of `{address: string, port:
/// integer 1-65535}`, all required (`endpoints` may be empty).
pub fn validate_service_record(obj: &Value) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    let Some(spec) = typed(obj, "", "spec", "object", &mut errs) else {
        return finish(errs);
    };
    typed(spec, "spec", "fqdn", "string", &mut errs);
    if let Some(eps) =
        typed(spec, "spec", "endpoints", "array", &mut errs).and_then(Value::as_array)
    {
        for (i, ep) in eps.iter().enumerate() {
            let path = format!("spec.endpoints[{i}]");
            if !ep.is_object() {
                errs.push(format!("{path}: Invalid value: \"{t}\": {path} in body must be of type object: \"{t}\"", t = type_name(ep)));
                continue;
            }
            typed(ep, &path, "address", "string", &mut errs);
            if let Some(port) =
                typed(ep, &path, "port", "integer", &mut errs).and_then(Value::as_i64)
            {
                let field = format!("{path}.port");
                if port < 1 {
                    errs.push(format!("{field}: Invalid value: {port}: {field} in body should be greater than or equal to 1"));
                } else if port > 65535 {
                    errs.push(format!("{field}: Invalid value: {port}: {field} in body should be less than or equal to 65535"));
                }
            }
        }
    }
    finish(errs)
}

/// RemoteRegistry schema: `spec.address` string, `spec.tlsConfig.{serverCA (base64), serverName}`
/// strings, optional `spec.allowedDomains` list of strings.
pub fn validate_remote_registry(obj: &Value) -> Result<(), Vec<String>> {
    use base64::Engine as _;
    let mut errs = Vec::new();
    let Some(spec) = typed(obj, "", "spec", "object", &mut errs) else {
        return finish(errs);
    };
    typed(spec, "spec", "address", "string", &mut errs);
    if let Some(tls) = typed(spec, "spec", "tlsConfig", "object", &mut errs) {
        if let Some(ca) =
            typed(tls, "spec.tlsConfig", "serverCA", "string", &mut errs).and_then(Value::as_str)
            && base64::engine::general_purpose::STANDARD
                .decode(ca)
                .is_err()
        {
            errs.push("spec.tlsConfig.serverCA: Invalid value: \"string\": spec.tlsConfig.serverCA in body must be of type byte: \"string\"".into());
        }
        typed(tls, "spec.tlsConfig", "serverName", "string", &mut errs);
    }
    if let Some(domains) = spec.get("allowedDomains").filter(|v| !v.is_null()) {
        match domains.as_array() {
            Some(list) => {
                for (i, d) in list.iter().enumerate() {
                    if !d.is_string() {
                        let t = type_name(d);
                        errs.push(format!(
                            "spec.allowedDomains[{i}]: Invalid value: \"{t}\": spec.allowedDomains[{i}] in body must be of type string: \"{t}\""
                        ));
                    }
                }
            }
            None => {
                let t = type_name(domains);
                errs.push(format!(
                    "spec.allowedDomains: Invalid value: \"{t}\": spec.allowedDomains in body must be of type array: \"{t}\""
                ));
            }
        }
    }
    finish(errs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn service_record_schema() {
        assert_eq!(
            validate_service_record(&json!({"spec": {"fqdn": "a.b", "endpoints": []}})),
            Ok(())
        );
        assert_eq!(
            validate_service_record(&json!({"spec": {"endpoints": [{"address": "1.2.3.4", "port": 0}, {"port": "x"}]}})),
            Err(vec![
                "spec.fqdn: Required value".to_string(),
                "spec.endpoints[0].port: Invalid value: 0: spec.endpoints[0].port in body should be greater than or equal to 1".to_string(),
                "spec.endpoints[1].address: Required value".to_string(),
                "spec.endpoints[1].port: Invalid value: \"string\": spec.endpoints[1].port in body must be of type integer: \"string\"".to_string(),
            ])
        );
        assert_eq!(
            validate_service_record(&json!({})),
            Err(vec!["spec: Required value".to_string()])
        );
    }

    #[test]
    fn remote_registry_schema() {
        let ok = json!({"spec": {"address": "r:443", "tlsConfig": {"serverCA": "YQ==", "serverName": "r"}}});
        assert_eq!(validate_remote_registry(&ok), Ok(()));
        let bad = json!({"spec": {"tlsConfig": {"serverCA": "***"}, "allowedDomains": "x"}});
        assert_eq!(validate_remote_registry(&bad).map_err(|e| e.len()), Err(4));
    }
}
