//! Server-side apply (`application/apply-patch+yaml`): merges an applied configuration into the
//! live object (maps recursively, keyed lists by key, sets by value, everything else replaced),
//! detects conflicts with fields other managers own (409 unless `force`, which transfers
//! ownership), removes fields the manager applied before but no longer applies (unless another
//! manager owns them), and returns the merged object with its new `managedFields` entries. The
//! write pipeline then defaults, validates and commits the result like any other update.

use serde_json::{Map, Value, json};

use crate::fields::{self, Entry, FieldPath, FieldSet, PathEl, Scope, Writer};
use crate::resources::{ListKind, Resource};
use crate::status::ApiError;

/// Metadata fields an applied configuration cannot set (they are server-managed).
const SYSTEM_METADATA: [&str; 8] = [
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// The merged object and its managed fields.
pub(crate) struct Applied {
    pub object: Value,
    pub entries: Vec<Entry>,
}

/// Keeps only what `scope` may change and strips server-managed metadata.
fn normalize(cfg: &Value, res: &Resource, scope: Scope) -> Value {
    let mut out = cfg.clone();
    if let Some(m) = out.as_object_mut() {
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in SYSTEM_METADATA {
                meta.remove(f);
            }
        }
        match scope {
            Scope::Main if res.spec.status_subresource => {
                m.remove("status");
            }
            Scope::Main => {}
            Scope::Status => {
                m.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"))
            }
        }
        if scope == Scope::Status
            && let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut)
        {
            meta.retain(|k, _| k == "name" || k == "namespace");
        }
    }
    out
}

fn join(schema: &str, key: &str) -> String {
    if schema.is_empty() {
        key.to_string()
    } else {
        format!("{schema}.{key}")
    }
}

/// Merges `cfg` into `live` following the resource's list semantics.
pub(crate) fn merge(live: &mut Value, cfg: &Value, schema: &str, res: &Resource) {
    match cfg {
        Value::Object(c) if live.is_object() => {
            if let Value::Object(l) = live {
                for (k, cv) in c {
                    if cv.is_null() {
                        l.remove(k);
                        continue;
                    }
                    match l.get_mut(k) {
                        Some(lv) => merge(lv, cv, &join(schema, k), res),
                        None => {
                            l.insert(k.clone(), cv.clone());
                        }
                    }
                }
            }
        }
        Value::Array(c) if live.is_array() && res.list_kind(schema).is_some() => {
            let kind = res.list_kind(schema).cloned();
            if let Value::Array(l) = live {
                for item in c {
                    match &kind {
                        Some(ListKind::Map { keys, .. }) => {
                            let key = fields::item_key(item, keys);
                            match key.and_then(|k| {
                                l.iter()
                                    .position(|x| fields::item_key(x, keys).as_ref() == Some(&k))
                            }) {
                                Some(i) => merge(&mut l[i], item, &format!("{schema}[]"), res),
                                None => l.push(item.clone()),
                            }
                        }
                        _ => {
                            if !l.contains(item) {
                                l.push(item.clone());
                            }
                        }
                    }
                }
            }
        }
        other => *live = other.clone(),
    }
}

/// Removes maps left empty under `path` (but never top-level fields).
fn prune_empty_parents(obj: &mut Value, path: &[PathEl], res: &Resource, owned: &FieldSet) {
    let mut end = path.len();
    while end > 2 {
        end -= 1;
        let parent = &path[..end];
        if !matches!(parent.last(), Some(PathEl::Field(_))) || owned.contains(parent) {
            return;
        }
        let empty = fields::get(obj, parent, res)
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty);
        if !empty || !fields::remove(obj, parent, res) {
            return;
        }
    }
}

/// Runs server-side apply of `cfg` by `w.manager` onto `live` (absent when creating).
pub(crate) fn apply(
    live: Option<&Value>,
    cfg: &Value,
    res: &Resource,
    w: &Writer<'_>,
    force: bool,
    name: &str,
) -> Result<Applied, ApiError> {
    if !cfg.is_object() {
        return Err(ApiError::bad_request(
            "apply configuration must be an object",
        ));
    }
    let kind = cfg.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = cfg
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind.is_empty() || api_version.is_empty() {
        return Err(ApiError::bad_request(
            "error decoding YAML: Object 'Kind' is missing or apiVersion is not set",
        ));
    }
    if kind != res.spec.kind || api_version != res.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) or kind ({kind}) does not match the expected {} {}",
            res.api_version(),
            res.spec.kind
        )));
    }
    let cfg = normalize(cfg, res, w.scope);
    let new_set = fields::leaves(&cfg, res, w.scope, true).map_err(ApiError::unprocessable)?;
    let sub = w.scope.subresource();
    let mut entries = live.map(fields::read_entries).unwrap_or_default();

    let mut conflicts: Vec<(String, String, String)> = Vec::new();
    let mut forced: Vec<(usize, FieldPath)> = Vec::new();
    for p in &new_set {
        if matches!(p.last(), Some(PathEl::Key(_) | PathEl::Value(_))) {
            continue;
        }
        let live_v = live.and_then(|l| fields::get(l, p, res));
        if live_v.is_none() || live_v == fields::get(&cfg, p, res) {
            continue;
        }
        for (i, e) in entries.iter().enumerate() {
            if !e.is(w.manager, "Apply", sub) && e.fields.contains(p) {
                conflicts.push((e.manager.clone(), e.api_version.clone(), fields::display(p)));
                forced.push((i, p.clone()));
            }
        }
    }
    if !conflicts.is_empty() {
        if !force {
            conflicts.sort();
            conflicts.dedup();
            return Err(ApiError::apply_conflict(res.subject(name), &conflicts));
        }
        for (i, p) in forced {
            entries[i].fields.remove(&p);
        }
    }

    let mut merged = match live {
        Some(l) => l.clone(),
        None => json!({"apiVersion": api_version, "kind": kind, "metadata": {}}),
    };
    merge(&mut merged, &cfg, "", res);

    let old_set = entries
        .iter()
        .find(|e| e.is(w.manager, "Apply", sub))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: FieldSet = entries
        .iter()
        .filter(|e| !e.is(w.manager, "Apply", sub))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    for p in old_set.difference(&new_set) {
        let shared = others.iter().any(|q| q.starts_with(p));
        if shared || fields::get(&cfg, p, res).is_some() {
            continue;
        }
        if fields::remove(&mut merged, p, res) {
            prune_empty_parents(&mut merged, p, res, &others);
        }
    }

    match entries.iter_mut().find(|e| e.is(w.manager, "Apply", sub)) {
        Some(e) if e.fields == new_set => {}
        Some(e) => {
            e.fields = new_set;
            e.time = w.now.to_string();
            e.api_version = w.api_version.to_string();
        }
        None => entries.push(Entry {
            manager: w.manager.to_string(),
            operation: "Apply".into(),
            api_version: w.api_version.to_string(),
            time: w.now.to_string(),
            subresource: sub.map(str::to_string),
            fields: new_set,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    Ok(Applied {
        object: merged,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use std::sync::Arc;

    fn res(plural: &str) -> Arc<Resource> {
        Registry::with_builtins().find("", "v1", plural).unwrap()
    }

    fn w<'a>(manager: &'a str) -> Writer<'a> {
        Writer {
            manager,
            api_version: "v1",
            now: "t",
            scope: Scope::Main,
        }
    }

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data})
    }

    #[test]
    fn reapply_removes_fields_no_longer_applied() {
        let r = res("configmaps");
        let first = apply(
            None,
            &cm(json!({"a": "1", "b": "2"})),
            &r,
            &w("m"),
            false,
            "c",
        )
        .unwrap();
        let mut live = first.object.clone();
        fields::write_entries(&mut live, &first.entries);
        let second = apply(Some(&live), &cm(json!({"a": "1"})), &r, &w("m"), false, "c").unwrap();
        assert_eq!(second.object["data"], json!({"a": "1"}));
    }

    #[test]
    fn conflicting_value_is_409_unless_forced() {
        let r = res("configmaps");
        let first = apply(None, &cm(json!({"a": "1"})), &r, &w("one"), false, "c").unwrap();
        let mut live = first.object.clone();
        fields::write_entries(&mut live, &first.entries);
        let err = apply(
            Some(&live),
            &cm(json!({"a": "2"})),
            &r,
            &w("two"),
            false,
            "c",
        )
        .err()
        .unwrap();
        assert_eq!(err.code(), 409);
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"one\" using v1: .data.a"
        );
        // Same value: shared ownership, no conflict.
        let shared = apply(
            Some(&live),
            &cm(json!({"a": "1"})),
            &r,
            &w("two"),
            false,
            "c",
        )
        .unwrap();
        assert_eq!(shared.entries.len(), 2);
        let forced = apply(
            Some(&live),
            &cm(json!({"a": "2"})),
            &r,
            &w("two"),
            true,
            "c",
        )
        .unwrap();
        assert_eq!(forced.object["data"]["a"], "2");
        assert_eq!(
            forced
                .entries
                .iter()
                .map(|e| e.manager.as_str())
                .collect::<Vec<_>>(),
            vec!["two"]
        );
    }

    #[test]
    fn keyed_lists_merge_by_key_with_defaulted_protocol() {
        let r = res("services");
        let live = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}, {"port": 53, "protocol": "UDP"}]}});
        let cfg = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"ports": [{"port": 80, "name": "http"}]}});
        let out = apply(Some(&live), &cfg, &r, &w("m"), false, "s").unwrap();
        assert_eq!(
            out.object["spec"]["ports"],
            json!([{"port": 80, "protocol": "TCP", "targetPort": 8080, "name": "http"}, {"port": 53, "protocol": "UDP"}])
        );
    }
}
