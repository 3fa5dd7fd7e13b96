//! Structural OpenAPI v3 schemas of custom resources, applied the way the apiextensions
//! apiserver does on every create and update: unknown fields are pruned (and `null`s of
//! non-nullable fields dropped), `default`s are filled in, then the object is validated (types,
//! required, enum, pattern, lengths, bounds, item counts, `byte`/`date-time` formats,
//! `x-kubernetes-list-type` uniqueness). The schema's `x-kubernetes-list-type: map|set` lists also
//! drive server-side apply merging. CEL rules (`x-kubernetes-validations`) are not evaluated:
//! express them with a [`crate::Validator`].

use std::collections::HashMap;
use std::collections::HashSet;

use base64::Engine as _;
use regex::Regex;
use serde_json::Value;

use crate::fields::{canonical, item_key};
use crate::resources::ListKind;
use crate::status::FieldError;

/// A compiled `openAPIV3Schema`.
#[derive(Debug)]
pub(crate) struct Schema {
    root: Value,
    patterns: HashMap<String, Regex>,
}

fn collect_patterns(s: &Value, out: &mut HashMap<String, Regex>) -> Result<(), String> {
    match s {
        Value::Object(m) => {
            if let Some(p) = m.get("pattern").and_then(Value::as_str)
                && !out.contains_key(p)
            {
                let re = Regex::new(p).map_err(|e| format!("pattern {p:?}: {e}"))?;
                out.insert(p.to_string(), re);
            }
            for v in m.values() {
                collect_patterns(v, out)?;
            }
        }
        Value::Array(a) => {
            for v in a {
                collect_patterns(v, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
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

/// Go's `%v` of a float bound: `1` rather than `1.0`.
fn bound(n: &Value) -> String {
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => n.to_string(),
    }
}

fn flag(s: &Value, key: &str) -> bool {
    s.get(key).and_then(Value::as_bool) == Some(true)
}

/// The list merge behaviour declared by a schema for each list path (`a.b`, `a.b[].c`).
fn collect_lists(s: &Value, path: &str, out: &mut Vec<(String, ListKind)>) {
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, ps) in props {
            collect_lists(ps, &join(path, k), out);
        }
    }
    if let Some(items) = s.get("items") {
        match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("map") => {
                let keys = s
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|ks| {
                        ks.iter()
                            .filter_map(Value::as_str)
                            .map(|k| {
                                (
                                    k.to_string(),
                                    items.pointer(&format!("/properties/{k}/default")).cloned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((path.to_string(), ListKind::Map { keys }));
            }
            Some("set") => out.push((path.to_string(), ListKind::Set)),
            _ => {}
        }
        collect_lists(items, &format!("{path}[]"), out);
    }
}

impl Schema {
    pub fn compile(root: &Value) -> Result<Self, String> {
        if !root.is_object() {
            return Err("openAPIV3Schema must be an object".into());
        }
        let mut patterns = HashMap::new();
        collect_patterns(root, &mut patterns)?;
        Ok(Self {
            root: root.clone(),
            patterns,
        })
    }

    /// Keyed and set lists, for server-side apply.
    pub fn list_kinds(&self) -> Vec<(String, ListKind)> {
        let mut out = Vec::new();
        collect_lists(&self.root, "", &mut out);
        out
    }

    /// Drops unknown fields and `null`s of non-nullable fields; keeps `apiVersion`, `kind` and
    /// `metadata` at the root and in embedded resources.
    pub fn prune(&self, obj: &mut Value) {
        prune(&self.root, obj, true);
    }

    /// Fills in `default`s of absent fields under present parents.
    pub fn apply_defaults(&self, obj: &mut Value) {
        defaults(&self.root, obj);
    }

    pub fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        if let (Some(props), Some(m)) = (
            self.root.get("properties").and_then(Value::as_object),
            obj.as_object(),
        ) {
            for (k, v) in m {
                if k == "metadata" || k == "apiVersion" || k == "kind" {
                    continue;
                }
                if let Some(ps) = props.get(k) {
                    self.check(ps, v, k, &mut errs);
                }
            }
        }
        for r in self
            .root
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(r) = r.as_str()
                && obj.get(r).is_none()
            {
                errs.push(FieldError::required(r, ""));
            }
        }
        // Object keys iterate sorted or in insertion order depending on whether some crate in
        // the build enables serde_json's `preserve_order`; sort by field so the message is the
        // same in every build.
        errs.sort_by(|a, b| a.field.cmp(&b.field));
        errs
    }

    fn check(&self, s: &Value, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
        if v.is_null() {
            if !flag(s, "nullable") && s.get("type").is_some() {
                let want = s.get("type").and_then(Value::as_str).unwrap_or_default();
                errs.push(FieldError::invalid(
                    path,
                    "null",
                    format!("{path} in body must be of type {want}: \"null\""),
                ));
            }
            return;
        }
        let int_or_string = flag(s, "x-kubernetes-int-or-string");
        if let Some(want) = s.get("type").and_then(Value::as_str) {
            let got = type_name(v);
            let ok = got == want || (want == "number" && got == "integer");
            if !ok && !(int_or_string && (got == "integer" || got == "string")) {
                errs.push(FieldError::invalid(
                    path,
                    got,
                    format!("{path} in body must be of type {want}: \"{got}\""),
                ));
                return;
            }
        }
        if let Some(options) = s.get("enum").and_then(Value::as_array)
            && !options.contains(v)
        {
            let supported: Vec<String> = options
                .iter()
                .map(|o| {
                    o.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| o.to_string())
                })
                .collect();
            let refs: Vec<&str> = supported.iter().map(String::as_str).collect();
            errs.push(FieldError::not_supported(path, v.clone(), &refs));
        }
        match v {
            Value::String(text) => self.check_string(s, text, path, errs),
            Value::Number(_) => check_number(s, v, path, errs),
            Value::Array(items) => {
                let n = items.len();
                if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
                    && n as u64 > max
                {
                    errs.push(FieldError::too_many(path, n, max as usize));
                }
                if let Some(min) = s.get("minItems").and_then(Value::as_u64)
                    && (n as u64) < min
                {
                    errs.push(FieldError::invalid(
                        path,
                        n,
                        format!("{path} in body should have at least {min} items"),
                    ));
                }
                check_list_uniqueness(s, items, path, errs);
                if let Some(is) = s.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.check(is, item, &format!("{path}[{i}]"), errs);
                    }
                }
            }
            Value::Object(m) => {
                for r in s
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(r) = r.as_str()
                        && m.get(r).is_none()
                    {
                        errs.push(FieldError::required(join(path, r), ""));
                    }
                }
                let props = s.get("properties").and_then(Value::as_object);
                for (k, child) in m {
                    if let Some(ps) = props.and_then(|p| p.get(k)) {
                        self.check(ps, child, &join(path, k), errs);
                    } else if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object())
                    {
                        self.check(ap, child, &format!("{path}[{k}]"), errs);
                    }
                }
            }
            _ => {}
        }
        for sub in s
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.check(sub, v, path, errs);
        }
    }

    fn check_string(&self, s: &Value, text: &str, path: &str, errs: &mut Vec<FieldError>) {
        let len = text.chars().count() as u64;
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
            && len > max
        {
            errs.push(FieldError::custom(
                path,
                format!("Too long: may not be more than {max} bytes"),
            ));
        }
        if let Some(min) = s.get("minLength").and_then(Value::as_u64)
            && len < min
        {
            errs.push(FieldError::invalid(
                path,
                text,
                format!("{path} in body should be at least {min} chars long"),
            ));
        }
        if let Some(p) = s.get("pattern").and_then(Value::as_str)
            && self.patterns.get(p).is_some_and(|re| !re.is_match(text))
        {
            errs.push(FieldError::invalid(
                path,
                text,
                format!("{path} in body should match '{p}'"),
            ));
        }
        let bad_format = match s.get("format").and_then(Value::as_str) {
            Some("byte") => base64::engine::general_purpose::STANDARD
                .decode(text)
                .is_err(),
            Some("date-time") => {
                time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                    .is_err()
            }
            _ => false,
        };
        if bad_format {
            let f = s.get("format").and_then(Value::as_str).unwrap_or_default();
            errs.push(FieldError::invalid(
                path,
                text,
                format!("{path} in body must be of type {f}: {text:?}"),
            ));
        }
    }
}

fn check_number(s: &Value, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(x) = v.as_f64() else { return };
    if let Some(min) = s.get("minimum") {
        let m = min.as_f64().unwrap_or(f64::MIN);
        let exclusive = flag(s, "exclusiveMinimum");
        if x < m || (exclusive && x == m) {
            let rel = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errs.push(FieldError::invalid(
                path,
                v.clone(),
                format!("{path} in body should be {rel} {}", bound(min)),
            ));
        }
    }
    if let Some(max) = s.get("maximum") {
        let m = max.as_f64().unwrap_or(f64::MAX);
        let exclusive = flag(s, "exclusiveMaximum");
        if x > m || (exclusive && x == m) {
            let rel = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            errs.push(FieldError::invalid(
                path,
                v.clone(),
                format!("{path} in body should be {rel} {}", bound(max)),
            ));
        }
    }
    if s.get("format").and_then(Value::as_str) == Some("int32")
        && v.as_i64().is_some_and(|n| i32::try_from(n).is_err())
    {
        errs.push(FieldError::invalid(
            path,
            v.clone(),
            format!("{path} in body must be of type int32: \"{v}\""),
        ));
    }
}

fn check_list_uniqueness(s: &Value, items: &[Value], path: &str, errs: &mut Vec<FieldError>) {
    match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("map") => {
            let keys: Vec<(String, Option<Value>)> = s
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|ks| {
                    ks.iter()
                        .filter_map(Value::as_str)
                        .map(|k| (k.to_string(), None))
                        .collect()
                })
                .unwrap_or_default();
            let mut seen = HashSet::new();
            for (i, item) in items.iter().enumerate() {
                if let Some(k) = item_key(item, &keys)
                    && !seen.insert(k.clone())
                {
                    errs.push(FieldError::duplicate(
                        format!("{path}[{i}]"),
                        Value::String(k),
                    ));
                }
            }
        }
        Some("set") => {
            let mut seen = HashSet::new();
            for (i, item) in items.iter().enumerate() {
                if !seen.insert(canonical(item)) {
                    errs.push(FieldError::duplicate(format!("{path}[{i}]"), item.clone()));
                }
            }
        }
        _ => {}
    }
}

fn prune(s: &Value, v: &mut Value, root: bool) {
    match v {
        Value::Object(m) => {
            let preserve = flag(s, "x-kubernetes-preserve-unknown-fields");
            let embedded = root || flag(s, "x-kubernetes-embedded-resource");
            let props = s.get("properties").and_then(Value::as_object);
            let additional = s.get("additionalProperties");
            let mut drop = Vec::new();
            for (k, child) in m.iter_mut() {
                if embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (props.and_then(|p| p.get(k)), additional) {
                    (Some(ps), _) => {
                        if child.is_null() && !flag(ps, "nullable") {
                            drop.push(k.clone());
                        } else {
                            prune(ps, child, false);
                        }
                    }
                    (None, Some(ap)) if ap.is_object() => prune(ap, child, false),
                    (None, Some(Value::Bool(true))) => {}
                    (None, _) if preserve => {}
                    (None, _) => drop.push(k.clone()),
                }
            }
            for k in drop {
                m.remove(&k);
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for item in items {
                    prune(is, item, false);
                }
            }
        }
        _ => {}
    }
}

fn defaults(s: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (k, ps) in props {
                    if let Some(d) = ps.get("default")
                        && m.get(k).is_none()
                    {
                        m.insert(k.clone(), d.clone());
                    }
                    if let Some(child) = m.get_mut(k) {
                        defaults(ps, child);
                    }
                }
            }
            if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object()) {
                for child in m.values_mut() {
                    defaults(ap, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for item in items {
                    defaults(is, item);
                }
            }
        }
        _ => {}
    }
}

/// Parses a `CustomResourceDefinition` (apiextensions.k8s.io/v1, as JSON or YAML value) into
/// one spec per served version, the storage version first.
pub(crate) fn specs_from_crd(crd: &Value) -> Result<Vec<crate::ResourceSpec>, String> {
    let spec = crd.get("spec").ok_or("CRD has no spec")?;
    let s = |p: &str| {
        spec.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (group, kind, plural) = (s("/group"), s("/names/kind"), s("/names/plural"));
    let namespaced = match s("/scope").as_str() {
        "Namespaced" => true,
        "Cluster" => false,
        other => return Err(format!("unknown scope {other:?}")),
    };
    let mut out = Vec::new();
    for v in spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("CRD has no versions")?
    {
        if v.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or("version without name")?;
        let schema = v
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .ok_or_else(|| format!("version {name} has no schema"))?;
        let status = v.pointer("/subresources/status").is_some();
        let mut rs = crate::ResourceSpec::new(&group, name, &kind, &plural, namespaced);
        rs.status_subresource = status;
        rs.schema = Some(std::sync::Arc::new(schema));
        let storage = v.get("storage").and_then(Value::as_bool) == Some(true);
        if storage {
            out.insert(0, rs)
        } else {
            out.push(rs)
        }
    }
    if out.is_empty() {
        return Err("CRD serves no version".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::compile(&json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {"type": "object", "required": ["fqdn"], "properties": {
                    "fqdn": {"type": "string", "minLength": 1, "maxLength": 10, "pattern": "^[a-z.]+$"},
                    "port": {"type": "integer", "minimum": 1.0, "maximum": 65535.0, "default": 80},
                    "mode": {"type": "string", "enum": ["A", "B"], "nullable": true},
                    "ca": {"type": "string", "format": "byte"},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "conds": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                              "items": {"type": "object", "properties": {"type": {"type": "string"}}}}
                }},
                "status": {"type": "object", "properties": {"n": {"type": "integer"}}}
            }
        }))
        .unwrap()
    }

    #[test]
    fn prunes_unknown_fields_and_non_nullable_nulls() {
        let s = schema();
        let mut o = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "whatever": 1},
            "spec": {"fqdn": "a", "unknown": 1, "mode": null, "port": null, "free": {"x": {"y": 1}}, "labels": {"k": "v"}},
            "status": {"n": 1, "gone": true}, "extra": 1});
        s.prune(&mut o);
        assert_eq!(
            o,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "whatever": 1},
            "spec": {"fqdn": "a", "mode": null, "free": {"x": {"y": 1}}, "labels": {"k": "v"}}, "status": {"n": 1}})
        );
        s.apply_defaults(&mut o);
        assert_eq!(o["spec"]["port"], 80);
    }

    #[test]
    fn validates_like_the_apiextensions_server() {
        let s = schema();
        let o = json!({"spec": {"fqdn": "A_B_C_D_E_F", "port": 0, "mode": "C", "ca": "***", "labels": {"k": 1},
            "conds": [{"type": "x"}, {"type": "x"}]}});
        let mut msgs: Vec<String> = s.validate(&o).iter().map(|e| e.message()).collect();
        msgs.sort();
        assert_eq!(
            msgs,
            vec![
                "spec.ca: Invalid value: \"***\": spec.ca in body must be of type byte: \"***\"",
                "spec.conds[1]: Duplicate value: \"{\\\"type\\\":\\\"x\\\"}\"",
                "spec.fqdn: Invalid value: \"A_B_C_D_E_F\": spec.fqdn in body should match '^[a-z.]+$'",
                "spec.fqdn: Too long: may not be more than 10 bytes",
                "spec.labels[k]: Invalid value: \"integer\": spec.labels[k] in body must be of type string: \"integer\"",
                "spec.mode: Unsupported value: \"C\": supported values: \"A\", \"B\"",
                "spec.port: Invalid value: 0: spec.port in body should be greater than or equal to 1",
            ]
        );
        assert_eq!(
            s.validate(&json!({}))
                .iter()
                .map(|e| e.message())
                .collect::<Vec<_>>(),
            vec!["spec: Required value"]
        );
        assert_eq!(
            s.list_kinds(),
            vec![(
                "spec.conds".to_string(),
                ListKind::Map {
                    keys: vec![("type".to_string(), None)],
                }
            )]
        );
    }
}
