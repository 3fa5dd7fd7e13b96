//! Validation a real apiserver performs and controllers can trip on: object metadata (names,
//! labels, annotations, owner references, finalizers) for every resource, the built-in specs the
//! fake knows (Service, Endpoints, EndpointSlice, ConfigMap, events.k8s.io Event),
//! and the pluggable custom resource validator. Objects arrive here after defaulting; the result
//! is a list of [`FieldError`]s that the write pipeline turns into a 422 Invalid.

use std::net::IpAddr;

use serde_json::Value;

use crate::resources::{Builtin, NameRule, Resource};
use crate::status::FieldError;

mod network;

pub(crate) use network::validate_service_status;

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
pub(crate) const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";
pub(crate) const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];
/// Real limit on the total size of annotations (`TotalAnnotationSizeLimitB`).
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

fn is_label_1123(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

pub(crate) fn dns1123_label_errors(s: &str) -> Vec<String> {
    let mut e = Vec::new();
    if s.len() > 63 {
        e.push("must be no more than 63 characters".into());
    }
    if !is_label_1123(s) {
        e.push(DNS1123_LABEL_MSG.into());
    }
    e
}

pub(crate) fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut e = Vec::new();
    if s.len() > 253 {
        e.push("must be no more than 253 characters".into());
    }
    if s.is_empty() || !s.split('.').all(is_label_1123) {
        e.push(DNS1123_SUBDOMAIN_MSG.into());
    }
    e
}

pub(crate) fn dns1035_label_errors(s: &str) -> Vec<String> {
    let mut e = Vec::new();
    if s.len() > 63 {
        e.push("must be no more than 63 characters".into());
    }
    if !is_label_1123(s) || !s.as_bytes()[0].is_ascii_lowercase() {
        e.push(DNS1035_LABEL_MSG.into());
    }
    e
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// `IsQualifiedName`: `[prefix/]name` with a DNS subdomain prefix and a 63-character name part.
pub(crate) fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut e = Vec::new();
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            e.push("prefix part must be non-empty".into());
        } else {
            e.extend(
                dns1123_subdomain_errors(p)
                    .into_iter()
                    .map(|m| format!("prefix part {m}")),
            );
        }
        if name.contains('/') {
            e.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character with an optional DNS subdomain prefix and '/'".into());
            return e;
        }
    }
    if name.is_empty() {
        e.push("name part must be non-empty".into());
    } else {
        if name.len() > 63 {
            e.push("name part must be no more than 63 characters".into());
        }
        if !is_name_part(name) {
            e.push(QUALIFIED_NAME_MSG.into());
        }
    }
    e
}

pub(crate) fn label_value_errors(s: &str) -> Vec<String> {
    let mut e = Vec::new();
    if s.len() > 63 {
        e.push("must be no more than 63 characters".into());
    }
    if !s.is_empty() && !is_name_part(s) {
        e.push(LABEL_VALUE_MSG.into());
    }
    e
}

/// `IsValidPortName` (IANA_SVC_NAME), used for named target ports.
pub(crate) fn port_name_errors(s: &str) -> Vec<String> {
    let mut e = Vec::new();
    if s.len() > 15 {
        e.push("must be no more than 15 characters".into());
    }
    if !s
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        e.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if s.contains("--") {
        e.push("must not contain consecutive hyphens".into());
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        e.push("must contain at least one letter (a-z)".into());
    }
    if s.starts_with('-') || s.ends_with('-') {
        e.push("must not begin or end with a hyphen".into());
    }
    e
}

pub(crate) fn name_errors(rule: NameRule, name: &str) -> Vec<String> {
    match rule {
        NameRule::Subdomain => dns1123_subdomain_errors(name),
        NameRule::Label1123 => dns1123_label_errors(name),
        NameRule::Label1035 => dns1035_label_errors(name),
    }
}

pub(crate) fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

pub(crate) fn arr<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

pub(crate) fn validate_label_map(map: Option<&Value>, path: &str, errs: &mut Vec<FieldError>) {
    let Some(map) = map else { return };
    let Some(map) = map.as_object() else {
        errs.push(FieldError::invalid(
            path,
            map.clone(),
            "must be a map of string keys to string values",
        ));
        return;
    };
    for (k, v) in map {
        for m in qualified_name_errors(k) {
            errs.push(FieldError::invalid(path, k.as_str(), m));
        }
        match v.as_str() {
            Some(s) => {
                for m in label_value_errors(s) {
                    errs.push(FieldError::invalid(path, s, m));
                }
            }
            None => errs.push(FieldError::invalid(path, v.clone(), "must be a string")),
        }
    }
}

pub(crate) fn non_special_ip(ip: IpAddr, field: &str, raw: &str, errs: &mut Vec<FieldError>) {
    if ip.is_unspecified() {
        errs.push(FieldError::invalid(
            field,
            raw,
            format!("may not be unspecified ({raw})"),
        ));
    }
    if ip.is_loopback() {
        errs.push(FieldError::invalid(
            field,
            raw,
            "may not be in the loopback range (127.0.0.0/8, ::1/128)",
        ));
    }
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    if link_local {
        errs.push(FieldError::invalid(
            field,
            raw,
            "may not be in the link-local range (169.254.0.0/16, fe80::/10)",
        ));
    }
    let ll_multicast = match ip {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => (v6.segments()[0] & 0xff0f) == 0xff02,
    };
    if ll_multicast {
        errs.push(FieldError::invalid(
            field,
            raw,
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)",
        ));
    }
}

/// Validates metadata and the resource-specific shape of `obj`; `old` is set for updates.
pub(crate) fn validate(res: &Resource, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(res, obj, &mut errs);
    match res.builtin {
        Some(Builtin::Service) => network::validate_service(obj, &mut errs),
        Some(Builtin::Endpoints) => network::validate_endpoints(obj, &mut errs),
        Some(Builtin::EndpointSlice) => network::validate_endpoint_slice(obj, old, &mut errs),
        Some(Builtin::ConfigMap) => validate_config_map(obj, &mut errs),
        Some(Builtin::Event) if old.is_none() => validate_event(obj, &mut errs),
        _ => {}
    }
    if let Some(schema) = &res.schema {
        errs.extend(schema.validate(obj));
    }
    if let Some(f) = &res.spec.validator
        && let Err(messages) = f(obj)
    {
        for m in messages {
            errs.push(custom_error(&m));
        }
    }
    errs
}

/// Splits `"spec.a[0].b: detail"` into field and message when the prefix looks like a path.
fn custom_error(m: &str) -> FieldError {
    if let Some((field, rest)) = m.split_once(": ")
        && !field.is_empty()
        && field
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._[]-/".contains(c))
    {
        return FieldError::custom(field, rest);
    }
    FieldError::custom("", m)
}

fn validate_meta(res: &Resource, obj: &Value, errs: &mut Vec<FieldError>) {
    let name = str_at(obj, "/metadata/name");
    for m in name_errors(res.behavior.name_rule, name) {
        errs.push(FieldError::invalid("metadata.name", name, m));
    }
    validate_label_map(obj.pointer("/metadata/labels"), "metadata.labels", errs);
    if let Some(ann) = obj.pointer("/metadata/annotations") {
        match ann.as_object() {
            Some(map) => {
                let mut total = 0;
                for (k, v) in map {
                    for m in qualified_name_errors(&k.to_ascii_lowercase()) {
                        errs.push(FieldError::invalid("metadata.annotations", k.as_str(), m));
                    }
                    total += k.len() + v.as_str().map_or(0, str::len);
                    if !v.is_string() {
                        errs.push(FieldError::invalid(
                            "metadata.annotations",
                            v.clone(),
                            "must be a string",
                        ));
                    }
                }
                if total > ANNOTATIONS_MAX_BYTES {
                    errs.push(FieldError::too_long(
                        "metadata.annotations",
                        ANNOTATIONS_MAX_BYTES,
                    ));
                }
            }
            None => errs.push(FieldError::invalid(
                "metadata.annotations",
                ann.clone(),
                "must be a map",
            )),
        }
    }
    let refs = arr(obj, "/metadata/ownerReferences");
    let mut controllers = Vec::new();
    for r in refs {
        for (f, what) in [
            ("apiVersion", "version"),
            ("kind", "kind"),
            ("name", "name"),
            ("uid", "uid"),
        ] {
            if str_at(r, &format!("/{f}")).is_empty() {
                errs.push(FieldError::invalid(
                    format!("metadata.ownerReferences.{f}"),
                    r.get(f).cloned().unwrap_or(Value::from("")),
                    format!("{what} must not be empty"),
                ));
            }
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers.push(format!("{}/{}", str_at(r, "/kind"), str_at(r, "/name")));
        }
    }
    if controllers.len() > 1 {
        errs.push(FieldError::invalid(
            "metadata.ownerReferences",
            Value::Array(refs.to_vec()),
            format!(
                "Only one reference can have Controller set to true. Found \"true\" in references for {}",
                controllers.join(" and ")
            ),
        ));
    }
    for (i, f) in arr(obj, "/metadata/finalizers").iter().enumerate() {
        let path = format!("metadata.finalizers[{i}]");
        let Some(f) = f.as_str() else {
            errs.push(FieldError::invalid(path, f.clone(), "must be a string"));
            continue;
        };
        for m in qualified_name_errors(f) {
            errs.push(FieldError::invalid(&path, f, m));
        }
        // For built-in resources (not custom resources) the apiserver also insists on a domain.
        if res.builtin.is_some()
            && !f.contains('/')
            && !["kubernetes", "orphan", "foregroundDeletion"].contains(&f)
        {
            errs.push(FieldError::invalid(
                &path,
                f,
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
}

fn config_key_errors(k: &str) -> Vec<String> {
    let mut e = Vec::new();
    if k.len() > 253 {
        e.push("must be no more than 253 characters".into());
    }
    if k.is_empty()
        || !k
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        e.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".into());
    }
    if k == "." || k == ".." || k.starts_with("..") {
        e.push("must not be '.' or '..' or start with '..'".into());
    }
    e
}

fn validate_data_keys(obj: &Value, field: &str, errs: &mut Vec<FieldError>) {
    if let Some(map) = obj.get(field).and_then(Value::as_object) {
        for k in map.keys() {
            for m in config_key_errors(k) {
                errs.push(FieldError::invalid(format!("{field}[{k}]"), k.as_str(), m));
            }
        }
    }
}

fn validate_config_map(obj: &Value, errs: &mut Vec<FieldError>) {
    validate_data_keys(obj, "data", errs);
    validate_data_keys(obj, "binaryData", errs);
    if let (Some(d), Some(b)) = (
        obj.get("data").and_then(Value::as_object),
        obj.get("binaryData").and_then(Value::as_object),
    ) {
        for k in d.keys().filter(|k| b.contains_key(*k)) {
            errs.push(FieldError::invalid(
                format!("data[{k}]"),
                k.as_str(),
                "duplicate of key present in binaryData",
            ));
        }
    }
}

/// events.k8s.io/v1 create validation (`ValidateEventCreate` for the v1 group).
fn validate_event(obj: &Value, errs: &mut Vec<FieldError>) {
    for f in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if obj
            .get(f)
            .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
        {
            errs.push(FieldError::required(f, ""));
        }
    }
    for (f, max) in [
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
        ("note", 1024),
    ] {
        if obj
            .get(f)
            .and_then(Value::as_str)
            .is_some_and(|s| s.len() > max)
        {
            errs.push(FieldError::too_long(f, max));
        }
    }
    let ty = str_at(obj, "/type");
    if !["Normal", "Warning"].contains(&ty) {
        errs.push(FieldError::not_supported(
            "type",
            ty,
            &["Normal", "Warning"],
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(dns1123_subdomain_errors("a.b-c.d").is_empty());
        assert!(!dns1123_subdomain_errors("A").is_empty());
        assert!(!dns1123_subdomain_errors("a..b").is_empty());
        assert!(!dns1123_subdomain_errors(&"a".repeat(254)).is_empty());
        assert!(dns1123_label_errors("1abc").is_empty());
        assert!(!dns1123_label_errors("a.b").is_empty());
        assert!(!dns1035_label_errors("1abc").is_empty());
        assert!(dns1035_label_errors("abc-1").is_empty());
        assert!(qualified_name_errors("example.com/my_key.1").is_empty());
        assert!(!qualified_name_errors("example.com/").is_empty());
        assert!(!qualified_name_errors("/x").is_empty());
        assert!(!qualified_name_errors("a/b/c").is_empty());
        assert!(label_value_errors("").is_empty());
        assert!(!label_value_errors(&"x".repeat(64)).is_empty());
        assert!(port_name_errors("http").is_empty());
        assert!(!port_name_errors("8080").is_empty());
    }

    #[test]
    fn custom_messages_split_into_field_and_detail() {
        let e = custom_error(
            "spec.endpoints[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
        );
        assert_eq!(e.field, "spec.endpoints[0].port");
        assert_eq!(
            e.message(),
            "spec.endpoints[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"
        );
        let e = custom_error("something is wrong: badly");
        assert_eq!(e.field, "");
    }
}
