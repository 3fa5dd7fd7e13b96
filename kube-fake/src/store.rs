//! The object store: every stored object keyed by (group, plural, namespace, name), one global
//! monotonically increasing resourceVersion (like an etcd revision), a bounded history of watch
//! events, the Service IP/port allocator and the write counters. All mutation funnels through
//! [`Store::put`] and [`Store::take`], which bump the resourceVersion and append exactly one
//! event; the write pipelines (`write`, `delete`) decide whether a write happens at all.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;

use crate::counters::Counts;
use crate::defaults::Allocator;
use crate::meta;
use crate::resources::{Builtin, Registry, Resource};

/// (group, plural, namespace or "", name). Sorting by it lists objects the way etcd keys do:
/// by namespace, then name.
pub(crate) type ObjKey = (String, String, String, String);

/// The kind of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as retained for watchers.
#[derive(Debug, PartialEq)]
pub(crate) struct Event {
    pub rv: u64,
    pub ty: EventType,
    pub group: String,
    pub plural: String,
    pub namespace: String,
    /// The object after the change (for deletes: its last state, at the deletion's version).
    pub object: Arc<Value>,
    /// The object before the change (absent for ADDED).
    pub prev: Option<Arc<Value>>,
}

/// A watcher asked for events older than the retained history.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Expired {
    pub requested: u64,
    pub oldest: u64,
}

pub(crate) struct Store {
    pub registry: Registry,
    objects: BTreeMap<ObjKey, Arc<Value>>,
    rv: u64,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// Every event with a resourceVersion above this is retained.
    compacted_through: u64,
    pub alloc: Allocator,
    pub writes: Counts,
}

pub(crate) fn key(res: &Resource, namespace: &str, name: &str) -> ObjKey {
    (
        res.spec.group.clone(),
        res.spec.plural.clone(),
        namespace.to_string(),
        name.to_string(),
    )
}

/// The object as served at the resource's (request) version.
pub(crate) fn present(obj: &Value, res: &Resource) -> Value {
    let mut out = obj.clone();
    if let Some(m) = out.as_object_mut() {
        m.insert("apiVersion".into(), res.api_version().into());
        m.insert("kind".into(), res.spec.kind.clone().into());
    }
    out
}

impl Store {
    pub fn new(registry: Registry, history_limit: usize) -> Self {
        Self {
            registry,
            objects: BTreeMap::new(),
            rv: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted_through: 0,
            alloc: Allocator::default(),
            writes: Counts::default(),
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn compacted_through(&self) -> u64 {
        self.compacted_through
    }

    pub fn get(&self, k: &ObjKey) -> Option<&Arc<Value>> {
        self.objects.get(k)
    }

    /// Objects of one resource (all namespaces when `namespace` is `None`), in key order.
    pub fn list<'a>(
        &'a self,
        res: &Resource,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Arc<Value>)> + 'a {
        let (g, p) = (res.spec.group.clone(), res.spec.plural.clone());
        let start: ObjKey = (
            g.clone(),
            p.clone(),
            namespace.unwrap_or_default().to_string(),
            String::new(),
        );
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.0 == g && k.1 == p && namespace.is_none_or(|ns| k.2 == ns))
    }

    fn push_event(&mut self, ev: Event) {
        self.history.push_back(Arc::new(ev));
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_through = old.rv;
            }
        }
    }

    /// Stores `obj` under `k` at the next resourceVersion and records ADDED or MODIFIED.
    pub fn put(&mut self, res: &Resource, k: ObjKey, mut obj: Value) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta::set_meta(&mut obj, "resourceVersion", Some(rv.to_string().into()));
        if let Some(m) = obj.as_object_mut() {
            m.insert("apiVersion".into(), res.storage_api_version().into());
            m.insert("kind".into(), res.spec.kind.clone().into());
        }
        let obj = Arc::new(obj);
        let prev = self.objects.insert(k.clone(), obj.clone());
        if res.is(Builtin::Service) {
            if let Some(p) = &prev {
                self.alloc.release(p);
            }
            self.alloc.reserve(&obj);
        }
        let ty = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.push_event(Event {
            rv,
            ty,
            group: k.0,
            plural: k.1,
            namespace: k.2,
            object: obj.clone(),
            prev,
        });
        obj
    }

    /// Removes the object under `k` at the next resourceVersion and records DELETED. `last` is
    /// the final state to report (defaults to the stored object).
    pub fn take(&mut self, res: &Resource, k: &ObjKey, last: Option<Value>) -> Option<Arc<Value>> {
        let prev = self.objects.remove(k)?;
        if res.is(Builtin::Service) {
            self.alloc.release(&prev);
        }
        self.rv += 1;
        let mut last = last.unwrap_or_else(|| (*prev).clone());
        meta::set_meta(
            &mut last,
            "resourceVersion",
            Some(self.rv.to_string().into()),
        );
        if let Some(m) = last.as_object_mut() {
            m.insert("apiVersion".into(), res.storage_api_version().into());
        }
        let last = Arc::new(last);
        self.push_event(Event {
            rv: self.rv,
            ty: EventType::Deleted,
            group: k.0.clone(),
            plural: k.1.clone(),
            namespace: k.2.clone(),
            object: last.clone(),
            prev: Some(prev),
        });
        Some(last)
    }

    /// Drops the whole watch history and expires every resourceVersion handed out so far.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.history.clear();
        self.compacted_through = self.rv;
    }

    /// Events after `from` (exclusive), or [`Expired`] if some of them are no longer retained.
    pub fn events_since(&self, from: u64) -> Result<Vec<Arc<Event>>, Expired> {
        if from < self.compacted_through {
            return Err(Expired {
                requested: from,
                oldest: self.compacted_through,
            });
        }
        let start = self.history.partition_point(|e| e.rv <= from);
        Ok(self.history.range(start..).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn history_is_bounded_and_expires_old_versions() {
        let reg = Registry::with_builtins();
        let cm = reg.find("", "v1", "configmaps").unwrap();
        let mut s = Store::new(reg, 2);
        for n in ["a", "b", "c"] {
            s.put(
                &cm,
                key(&cm, "ns", n),
                json!({"metadata": {"name": n, "uid": n}}),
            );
        }
        assert_eq!(s.resource_version(), 3);
        assert_eq!(
            s.events_since(0),
            Err(Expired {
                requested: 0,
                oldest: 1
            })
        );
        let evs = s.events_since(1).unwrap();
        assert_eq!(evs.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![2, 3]);
        assert!(s.events_since(3).unwrap().is_empty());
        let gone = s.take(&cm, &key(&cm, "ns", "a"), None).unwrap();
        assert_eq!(gone["metadata"]["resourceVersion"], "4");
        s.compact();
        assert_eq!(s.events_since(4).map_err(|e| e.oldest), Err(5));
        assert!(s.events_since(5).unwrap().is_empty());
    }

    #[test]
    fn list_is_scoped_and_ordered() {
        let reg = Registry::with_builtins();
        let cm = reg.find("", "v1", "configmaps").unwrap();
        let svc = reg.find("", "v1", "services").unwrap();
        let mut s = Store::new(reg, 10);
        for (ns, n) in [("b", "x"), ("a", "y"), ("a", "x")] {
            s.put(&cm, key(&cm, ns, n), json!({"metadata": {"name": n}}));
        }
        s.put(
            &svc,
            key(&svc, "a", "x"),
            json!({"metadata": {"name": "x"}}),
        );
        let all: Vec<String> = s
            .list(&cm, None)
            .map(|(k, _)| format!("{}/{}", k.2, k.3))
            .collect();
        assert_eq!(all, vec!["a/x", "a/y", "b/x"]);
        assert_eq!(s.list(&cm, Some("a")).count(), 2);
        assert_eq!(s.list(&svc, None).count(), 1);
    }
}
