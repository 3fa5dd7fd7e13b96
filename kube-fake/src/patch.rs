//! Non-apply PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902, via the
//! `json-patch` crate) and strategic merge patch. Each turns the live object into a candidate
//! object that then goes through the normal update pipeline.
//!
//! Strategic merge patch covers what controllers send in practice: it behaves like a merge patch
//! except for lists the resource declares as merged — built-in keyed lists (`spec.ports` of a
//! Service by `port`; pod `containers`, `initContainers`, `ephemeralContainers`, `volumes`,
//! `imagePullSecrets` by `name`; container `env` by `name`, `ports` by `containerPort`,
//! `volumeMounts` by `mountPath`; `status.conditions` by `type`; `metadata.ownerReferences` by
//! `uid`) and the `metadata.finalizers` set. Directives: `$patch: replace|delete|merge` on maps
//! and list items, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` (accepted and
//! ignored: order is kept as stored), `$retainKeys`. Custom resources reject strategic merge
//! patches with 415, as the apiserver does.

use serde_json::{Map, Value};

use crate::resources::{ListKind, Resource};
use crate::status::ApiError;

/// RFC 7386 merge patch.
pub(crate) fn merge_patch(target: &Value, patch: &[u8]) -> Result<Value, ApiError> {
    let patch: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if !patch.is_object() {
        return Err(ApiError::bad_request("merge patch must be a JSON object"));
    }
    let mut out = target.clone();
    json_patch::merge(&mut out, &patch);
    Ok(out)
}

/// RFC 6902 JSON patch. A malformed document is 400; an operation that cannot be applied
/// (missing path, failed `test`) is 422, as in the apiserver.
pub(crate) fn json_patch(target: &Value, patch: &[u8]) -> Result<Value, ApiError> {
    let patch: json_patch::Patch = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut out = target.clone();
    json_patch::patch(&mut out, &patch).map_err(|e| {
        ApiError::unprocessable(format!(
            "the server rejected our request due to an error in our request: {e}"
        ))
    })?;
    Ok(out)
}

/// Strategic merge patch (see the module docs for what is covered).
pub(crate) fn strategic_merge_patch(
    target: &Value,
    patch: &[u8],
    res: &Resource,
) -> Result<Value, ApiError> {
    let patch: Value = serde_json::from_slice(patch)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "strategic merge patch must be a JSON object",
        ));
    }
    let mut out = target.clone();
    smp_map(&mut out, &patch, "", res)?;
    Ok(out)
}

fn join(schema: &str, key: &str) -> String {
    if schema.is_empty() {
        key.to_string()
    } else {
        format!("{schema}.{key}")
    }
}

/// Removes `$` directives recursively from a value that is inserted as-is.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn smp_map(
    target: &mut Value,
    patch: &Value,
    schema: &str,
    res: &Resource,
) -> Result<(), ApiError> {
    let Some(pm) = patch.as_object() else {
        *target = strip(patch);
        return Ok(());
    };
    match pm.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = strip(patch);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other:?}"
            )));
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(tm) = target.as_object_mut() else {
        return Ok(());
    };
    for (k, v) in pm {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let drop: Vec<&Value> = v.as_array().map(|a| a.iter().collect()).unwrap_or_default();
            if let Some(list) = tm.get_mut(field).and_then(Value::as_array_mut) {
                list.retain(|x| !drop.contains(&x));
            }
            continue;
        }
        if k.starts_with('$') {
            // $setElementOrder/..., $retainKeys and $patch are handled elsewhere or ignored.
            continue;
        }
        if v.is_null() {
            tm.remove(k);
            continue;
        }
        let child_schema = join(schema, k);
        match (tm.get_mut(k), v) {
            (Some(tv), Value::Object(_)) if tv.is_object() => smp_map(tv, v, &child_schema, res)?,
            (Some(Value::Array(items)), Value::Array(patch_items)) => {
                smp_list(items, patch_items, &child_schema, res)?;
            }
            (_, Value::Object(_)) => {
                // A new map (or a map replacing a scalar) may still carry directives.
                let mut fresh = Value::Object(Map::new());
                smp_map(&mut fresh, v, &child_schema, res)?;
                tm.insert(k.clone(), fresh);
            }
            _ => {
                tm.insert(k.clone(), strip(v));
            }
        }
    }
    if let Some(keep) = pm.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        tm.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(())
}

fn smp_list(
    items: &mut Vec<Value>,
    patch: &[Value],
    schema: &str,
    res: &Resource,
) -> Result<(), ApiError> {
    match res.list_kind(schema) {
        Some(ListKind::Map {
            smp_key: Some(key), ..
        }) => {
            if patch
                .iter()
                .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
            {
                *items = patch
                    .iter()
                    .filter(|p| p.get("$patch").and_then(Value::as_str) != Some("replace"))
                    .map(strip)
                    .collect();
                return Ok(());
            }
            let item_schema = format!("{schema}[]");
            for p in patch {
                let Some(id) = p.get(key) else {
                    return Err(ApiError::bad_request(format!(
                        "map: {p} does not contain declared merge key: {key}"
                    )));
                };
                let pos = items.iter().position(|it| it.get(key) == Some(id));
                if p.get("$patch").and_then(Value::as_str) == Some("delete") {
                    items.retain(|it| it.get(key) != Some(id));
                    continue;
                }
                match pos {
                    Some(i) => smp_map(&mut items[i], p, &item_schema, res)?,
                    None => items.push(strip(p)),
                }
            }
        }
        Some(ListKind::Set) => {
            for p in patch {
                if !items.contains(p) {
                    items.push(p.clone());
                }
            }
        }
        _ => *items = patch.iter().map(strip).collect(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    fn svc() -> std::sync::Arc<Resource> {
        Registry::with_builtins()
            .find("", "v1", "services")
            .unwrap()
    }

    #[test]
    fn merge_patch_deletes_with_null() {
        let out = merge_patch(
            &json!({"a": {"b": 1, "c": 2}}),
            br#"{"a": {"b": null, "d": 3}}"#,
        )
        .unwrap();
        assert_eq!(out, json!({"a": {"c": 2, "d": 3}}));
        assert_eq!(
            merge_patch(&json!({}), b"[1]").map_err(|e| e.code()),
            Err(400)
        );
    }

    #[test]
    fn json_patch_errors_are_400_or_422() {
        let out = json_patch(
            &json!({"a": 1}),
            br#"[{"op": "replace", "path": "/a", "value": 2}]"#,
        )
        .unwrap();
        assert_eq!(out, json!({"a": 2}));
        assert_eq!(
            json_patch(&json!({}), b"{}").map_err(|e| e.code()),
            Err(400)
        );
        assert_eq!(
            json_patch(&json!({}), br#"[{"op": "remove", "path": "/missing"}]"#)
                .map_err(|e| e.code()),
            Err(422)
        );
    }

    #[test]
    fn strategic_merge_merges_service_ports_by_port() {
        let target = json!({"metadata": {"finalizers": ["a/x"]}, "spec": {"ports": [
            {"port": 80, "targetPort": 8080, "protocol": "TCP"}, {"port": 443, "protocol": "TCP"}]}});
        let patch = br#"{"metadata": {"finalizers": ["b/y"]}, "spec": {"ports": [
            {"port": 80, "targetPort": 9090}, {"port": 443, "$patch": "delete"}, {"port": 8443, "name": "alt"}],
            "$setElementOrder/ports": [{"port": 80}, {"port": 8443}]}}"#;
        let out = strategic_merge_patch(&target, patch, &svc()).unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"finalizers": ["a/x", "b/y"]}, "spec": {"ports": [
                {"port": 80, "targetPort": 9090, "protocol": "TCP"}, {"port": 8443, "name": "alt"}]}})
        );
    }

    #[test]
    fn strategic_merge_replaces_unkeyed_lists_and_honours_directives() {
        let target =
            json!({"spec": {"externalIPs": ["1.1.1.1"], "selector": {"a": "1", "b": "2"}}});
        let patch = br#"{"spec": {"externalIPs": ["2.2.2.2"], "selector": {"$patch": "replace", "c": "3"}}}"#;
        let out = strategic_merge_patch(&target, patch, &svc()).unwrap();
        assert_eq!(
            out,
            json!({"spec": {"externalIPs": ["2.2.2.2"], "selector": {"c": "3"}}})
        );
        let target = json!({"metadata": {"finalizers": ["a/x", "b/y"]}});
        let out = strategic_merge_patch(
            &target,
            br#"{"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/x"]}}"#,
            &svc(),
        )
        .unwrap();
        assert_eq!(out, json!({"metadata": {"finalizers": ["b/y"]}}));
    }
}
