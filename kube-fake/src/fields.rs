//! Field ownership (`metadata.managedFields`): field paths and sets, the `FieldsV1` wire
//! encoding, extraction of the owned leaves of an object (maps are granular, keyed lists are
//! merged per item, everything else is atomic), navigation and removal by path, and the
//! ownership transfer performed by non-apply writes. Server-side apply (`apply`) builds on it.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::resources::{ListKind, Resource};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PathEl {
    /// A map key (`f:name`).
    Field(String),
    /// A keyed list item, as the canonical JSON object of its key fields (`k:{...}`).
    Key(String),
    /// A set item, as canonical JSON (`v:...`).
    Value(String),
    /// A list index (`i:N`); only decoded, never produced.
    Index(usize),
}

pub(crate) type FieldPath = Vec<PathEl>;
pub(crate) type FieldSet = BTreeSet<FieldPath>;

/// Which part of an object a write may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The main resource; `status` is excluded when the resource has a status subresource.
    Main,
    /// The `/status` subresource: only `status`.
    Status,
}

impl Scope {
    pub fn subresource(self) -> Option<&'static str> {
        match self {
            Scope::Main => None,
            Scope::Status => Some("status"),
        }
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl Entry {
    pub fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }
}

fn join(schema: &str, key: &str) -> String {
    if schema.is_empty() {
        key.to_string()
    } else {
        format!("{schema}.{key}")
    }
}

/// Canonical JSON with sorted keys (independent of serde_json's map ordering feature).
pub(crate) fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            let parts: Vec<String> = sorted
                .iter()
                .map(|(k, v)| format!("{}:{}", Value::String((*k).clone()), canonical(v)))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// The canonical key of a keyed-list item, or `None` when a key field is missing without default.
pub(crate) fn item_key(item: &Value, keys: &[(String, Option<Value>)]) -> Option<String> {
    let m = item.as_object()?;
    let mut key = Map::new();
    for (k, default) in keys {
        let v = m.get(k).filter(|v| !v.is_null()).or(default.as_ref())?;
        key.insert(k.clone(), v.clone());
    }
    Some(canonical(&Value::Object(key)))
}

/// Which top-level fields a scope tracks.
fn tracked_top(key: &str, scope: Scope, status_subresource: bool) -> bool {
    match (key, scope) {
        ("apiVersion" | "kind", _) => false,
        ("status", Scope::Status) => true,
        (_, Scope::Status) => false,
        ("status", Scope::Main) => !status_subresource,
        _ => true,
    }
}

/// Metadata fields users own; the rest of `metadata` is system-managed.
const OWNED_METADATA: [&str; 4] = ["labels", "annotations", "ownerReferences", "finalizers"];

/// The owned leaves of `obj` in `scope`. With `strict`, a keyed-list item missing a key (or two
/// items with the same key) is an error, as for apply; otherwise such lists count as atomic.
pub(crate) fn leaves(
    obj: &Value,
    res: &Resource,
    scope: Scope,
    strict: bool,
) -> Result<FieldSet, String> {
    let mut out = FieldSet::new();
    let Some(m) = obj.as_object() else {
        return Ok(out);
    };
    for (k, v) in m {
        if !tracked_top(k, scope, res.spec.status_subresource) {
            continue;
        }
        let mut path = vec![PathEl::Field(k.clone())];
        if k == "metadata" {
            if let Some(meta) = v.as_object() {
                for mk in OWNED_METADATA {
                    if let Some(mv) = meta.get(mk) {
                        path.push(PathEl::Field(mk.to_string()));
                        walk(
                            mv,
                            &mut path,
                            &format!("metadata.{mk}"),
                            res,
                            strict,
                            &mut out,
                        )?;
                        path.pop();
                    }
                }
            }
            continue;
        }
        walk(v, &mut path, k, res, strict, &mut out)?;
    }
    Ok(out)
}

fn walk(
    v: &Value,
    path: &mut FieldPath,
    schema: &str,
    res: &Resource,
    strict: bool,
    out: &mut FieldSet,
) -> Result<(), String> {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(PathEl::Field(k.clone()));
                walk(child, path, &join(schema, k), res, strict, out)?;
                path.pop();
            }
        }
        Value::Array(items) => match res.list_kind(schema) {
            Some(ListKind::Map { keys, .. }) => {
                let mut seen = BTreeSet::new();
                let mut item_paths = Vec::new();
                for item in items {
                    let key = item_key(item, keys);
                    let Some(key) = key.filter(|k| seen.insert(k.clone())) else {
                        if strict {
                            let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
                            return Err(format!(
                                ".{schema}: each element must have unique, non-null key fields {names:?}"
                            ));
                        }
                        out.insert(path.clone());
                        return Ok(());
                    };
                    item_paths.push((key, item));
                }
                for (key, item) in item_paths {
                    path.push(PathEl::Key(key));
                    out.insert(path.clone());
                    if let Some(m) = item.as_object() {
                        for (k, child) in m {
                            path.push(PathEl::Field(k.clone()));
                            walk(
                                child,
                                path,
                                &join(&format!("{schema}[]"), k),
                                res,
                                strict,
                                out,
                            )?;
                            path.pop();
                        }
                    }
                    path.pop();
                }
            }
            Some(ListKind::Set) => {
                for item in items {
                    path.push(PathEl::Value(canonical(item)));
                    out.insert(path.clone());
                    path.pop();
                }
            }
            None => {
                out.insert(path.clone());
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
    Ok(())
}

/// Finds the index of the item a `Key`/`Value`/`Index` element designates.
fn find_item(items: &[Value], el: &PathEl, kind: Option<&ListKind>) -> Option<usize> {
    match (el, kind) {
        (PathEl::Key(k), Some(ListKind::Map { keys, .. })) => items
            .iter()
            .position(|it| item_key(it, keys).as_deref() == Some(k.as_str())),
        (PathEl::Value(v), _) => items.iter().position(|it| canonical(it) == *v),
        (PathEl::Index(i), _) => (*i < items.len()).then_some(*i),
        _ => None,
    }
}

fn step_schema(schema: &str, el: &PathEl) -> String {
    match el {
        PathEl::Field(k) => join(schema, k),
        _ => format!("{schema}[]"),
    }
}

/// The value at `path`, if present.
pub(crate) fn get<'a>(obj: &'a Value, path: &[PathEl], res: &Resource) -> Option<&'a Value> {
    let mut cur = obj;
    let mut schema = String::new();
    for el in path {
        cur = match el {
            PathEl::Field(k) => cur.get(k)?,
            _ => {
                let items = cur.as_array()?;
                &items[find_item(items, el, res.list_kind(&schema))?]
            }
        };
        schema = step_schema(&schema, el);
    }
    Some(cur)
}

/// Removes the field or list item at `path`; returns whether something was removed.
pub(crate) fn remove(obj: &mut Value, path: &[PathEl], res: &Resource) -> bool {
    let Some((last, parent_path)) = path.split_last() else {
        return false;
    };
    let mut cur = obj;
    let mut schema = String::new();
    for el in parent_path {
        let next = match el {
            PathEl::Field(k) => cur.get_mut(k),
            _ => {
                let kind = res.list_kind(&schema);
                match cur.as_array_mut() {
                    Some(items) => match find_item(items, el, kind) {
                        Some(i) => items.get_mut(i),
                        None => None,
                    },
                    None => None,
                }
            }
        };
        let Some(next) = next else { return false };
        cur = next;
        schema = step_schema(&schema, el);
    }
    match last {
        PathEl::Field(k) => cur.as_object_mut().is_some_and(|m| m.remove(k).is_some()),
        el => {
            let kind = res.list_kind(&schema).cloned();
            match cur.as_array_mut() {
                Some(items) => match find_item(items, el, kind.as_ref()) {
                    Some(i) => {
                        items.remove(i);
                        true
                    }
                    None => false,
                },
                None => false,
            }
        }
    }
}

/// `.spec.ports[port=80,protocol="TCP"].targetPort`, the apiserver's field path notation.
pub(crate) fn display(path: &[PathEl]) -> String {
    let mut s = String::new();
    for el in path {
        match el {
            PathEl::Field(k) => {
                s.push('.');
                s.push_str(k);
            }
            PathEl::Key(k) => {
                let parts: Vec<String> = serde_json::from_str::<Map<String, Value>>(k)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                    .unwrap_or_default();
                s.push_str(&format!("[{}]", parts.join(",")));
            }
            PathEl::Value(v) => s.push_str(&format!("[={v}]")),
            PathEl::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

#[derive(Default)]
struct Trie {
    owned: bool,
    children: BTreeMap<String, Trie>,
}

fn el_key(el: &PathEl) -> String {
    match el {
        PathEl::Field(k) => format!("f:{k}"),
        PathEl::Key(k) => format!("k:{k}"),
        PathEl::Value(v) => format!("v:{v}"),
        PathEl::Index(i) => format!("i:{i}"),
    }
}

fn trie_value(t: &Trie) -> Value {
    let mut m = Map::new();
    if t.owned && !t.children.is_empty() {
        m.insert(".".into(), json!({}));
    }
    for (k, c) in &t.children {
        m.insert(k.clone(), trie_value(c));
    }
    Value::Object(m)
}

/// Encodes a field set as `fieldsV1`.
pub(crate) fn encode(set: &FieldSet) -> Value {
    let mut root = Trie::default();
    for path in set {
        let mut node = &mut root;
        for el in path {
            node = node.children.entry(el_key(el)).or_default();
        }
        node.owned = true;
    }
    trie_value(&root)
}

fn decode_into(v: &Value, path: &mut FieldPath, out: &mut FieldSet) {
    let Some(m) = v.as_object() else { return };
    for (k, child) in m {
        if k == "." {
            out.insert(path.clone());
            continue;
        }
        let el = match k.split_at_checked(2) {
            Some(("f:", rest)) => PathEl::Field(rest.to_string()),
            Some(("k:", rest)) => PathEl::Key(rest.to_string()),
            Some(("v:", rest)) => PathEl::Value(rest.to_string()),
            Some(("i:", rest)) => match rest.parse() {
                Ok(i) => PathEl::Index(i),
                Err(_) => continue,
            },
            _ => continue,
        };
        path.push(el);
        if child.as_object().is_some_and(Map::is_empty) {
            out.insert(path.clone());
        } else {
            decode_into(child, path, out);
        }
        path.pop();
    }
}

/// Decodes `fieldsV1` (unknown element prefixes are skipped).
pub(crate) fn decode(v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    decode_into(v, &mut Vec::new(), &mut out);
    out
}

/// Reads `metadata.managedFields` (malformed entries are dropped).
pub(crate) fn read_entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
            Some(Entry {
                manager: s("manager").unwrap_or_default(),
                operation: s("operation")?,
                api_version: s("apiVersion").unwrap_or_default(),
                time: s("time").unwrap_or_default(),
                subresource: s("subresource").filter(|s| !s.is_empty()),
                fields: e.get("fieldsV1").map(decode).unwrap_or_default(),
            })
        })
        .collect()
}

/// Writes `entries` to `metadata.managedFields` (removing it when empty).
pub(crate) fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    if entries.is_empty() {
        meta.remove("managedFields");
        return;
    }
    let list: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("manager".into(), e.manager.clone().into());
            m.insert("operation".into(), e.operation.clone().into());
            m.insert("apiVersion".into(), e.api_version.clone().into());
            m.insert("time".into(), e.time.clone().into());
            m.insert("fieldsType".into(), "FieldsV1".into());
            m.insert("fieldsV1".into(), encode(&e.fields));
            if let Some(sub) = &e.subresource {
                m.insert("subresource".into(), sub.clone().into());
            }
            Value::Object(m)
        })
        .collect();
    meta.insert("managedFields".into(), Value::Array(list));
}

/// Who is writing and when, for ownership bookkeeping.
pub(crate) struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub now: &'a str,
    pub scope: Scope,
}

/// Ownership transfer for a non-apply write (`operation: Update`): the writer takes every field
/// it added or changed, other managers lose those fields, removed fields leave every set.
pub(crate) fn track_update(
    entries: &mut Vec<Entry>,
    old: Option<&Value>,
    new: &Value,
    res: &Resource,
    w: &Writer<'_>,
) {
    let new_leaves = leaves(new, res, w.scope, false).unwrap_or_default();
    let old_leaves = old
        .map(|o| leaves(o, res, w.scope, false).unwrap_or_default())
        .unwrap_or_default();
    let changed: FieldSet = new_leaves
        .iter()
        .filter(|p| match p.last() {
            Some(PathEl::Key(_) | PathEl::Value(_)) => !old_leaves.contains(*p),
            _ => old.and_then(|o| get(o, p, res)) != get(new, p, res),
        })
        .cloned()
        .collect();
    let removed: FieldSet = old_leaves.difference(&new_leaves).cloned().collect();
    let sub = w.scope.subresource();
    for e in entries
        .iter_mut()
        .filter(|e| !e.is(w.manager, "Update", sub))
    {
        e.fields
            .retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    let idx = match entries.iter().position(|e| e.is(w.manager, "Update", sub)) {
        Some(i) => i,
        None => {
            entries.push(Entry {
                manager: w.manager.to_string(),
                operation: "Update".into(),
                api_version: w.api_version.to_string(),
                time: w.now.to_string(),
                subresource: sub.map(str::to_string),
                fields: FieldSet::new(),
            });
            entries.len() - 1
        }
    };
    let target = &mut entries[idx];
    let mut fields: FieldSet = target.fields.difference(&removed).cloned().collect();
    fields.extend(changed);
    if fields != target.fields {
        target.fields = fields;
        target.time = w.now.to_string();
        target.api_version = w.api_version.to_string();
    }
    entries.retain(|e| !e.fields.is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    fn services() -> std::sync::Arc<Resource> {
        Registry::with_builtins()
            .find("", "v1", "services")
            .unwrap()
    }

    #[test]
    fn leaves_are_granular_for_maps_and_keyed_lists() {
        let svc = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "a", "uid": "u", "labels": {"app": "x"}},
            "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}},
            "status": {"loadBalancer": {}}
        });
        let set = leaves(&svc, &services(), Scope::Main, true).unwrap();
        let shown: Vec<String> = set.iter().map(|p| display(p)).collect();
        assert_eq!(
            shown,
            vec![
                ".metadata.labels.app",
                ".spec.ports[port=80,protocol=\"TCP\"]",
                ".spec.ports[port=80,protocol=\"TCP\"].port",
                ".spec.selector.app",
            ]
        );
        let status = leaves(&svc, &services(), Scope::Status, true).unwrap();
        assert_eq!(
            status.iter().map(|p| display(p)).collect::<Vec<_>>(),
            vec![".status.loadBalancer"]
        );
    }

    #[test]
    fn fields_v1_round_trips() {
        let svc = json!({"metadata": {"finalizers": ["a.io/x"]}, "spec": {"ports": [{"port": 80, "protocol": "UDP", "name": "dns"}]}});
        let set = leaves(&svc, &services(), Scope::Main, true).unwrap();
        let enc = encode(&set);
        assert_eq!(
            enc,
            json!({
                "f:metadata": {"f:finalizers": {"v:\"a.io/x\"": {}}},
                "f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"UDP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}}}}
            })
        );
        assert_eq!(decode(&enc), set);
    }

    #[test]
    fn get_and_remove_follow_keys() {
        let res = services();
        let mut svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 53, "protocol": "UDP"}]}});
        let p = vec![
            PathEl::Field("spec".into()),
            PathEl::Field("ports".into()),
            PathEl::Key("{\"port\":80,\"protocol\":\"TCP\"}".into()),
            PathEl::Field("targetPort".into()),
        ];
        assert_eq!(get(&svc, &p, &res), Some(&json!(8080)));
        assert!(remove(&mut svc, &p, &res));
        assert!(remove(&mut svc, &p[..3], &res));
        assert_eq!(
            svc,
            json!({"spec": {"ports": [{"port": 53, "protocol": "UDP"}]}})
        );
    }

    #[test]
    fn update_takes_changed_fields_from_other_managers() {
        let res = services();
        let old = json!({"spec": {"type": "ClusterIP", "selector": {"app": "a"}}});
        let new = json!({"spec": {"type": "ClusterIP", "selector": {"app": "b"}}});
        let mut entries = Vec::new();
        let w1 = Writer {
            manager: "one",
            api_version: "v1",
            now: "t1",
            scope: Scope::Main,
        };
        track_update(&mut entries, None, &old, &res, &w1);
        let w2 = Writer {
            manager: "two",
            api_version: "v1",
            now: "t2",
            scope: Scope::Main,
        };
        track_update(&mut entries, Some(&old), &new, &res, &w2);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0]
                .fields
                .iter()
                .map(|p| display(p))
                .collect::<Vec<_>>(),
            vec![".spec.type"]
        );
        assert_eq!(entries[0].time, "t1");
        assert_eq!(
            entries[1]
                .fields
                .iter()
                .map(|p| display(p))
                .collect::<Vec<_>>(),
            vec![".spec.selector.app"]
        );
        // A no-op write changes nothing, not even timestamps.
        let before = entries.clone();
        let w3 = Writer {
            manager: "two",
            api_version: "v1",
            now: "t3",
            scope: Scope::Main,
        };
        track_update(&mut entries, Some(&new), &new, &res, &w3);
        assert_eq!(entries, before);
    }
}
