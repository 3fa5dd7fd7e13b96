//! What the dashboard knows of each registry, and the JSON document the page draws. Pure: the
//! admin API's messages go in ([`RegistryView`]'s methods), one JSON document comes out
//! ([`Model::render`]); no I/O.
//!
//! Every list the page gets is capped ([`MAX_ROWS`]) and every string shortened
//! ([`MAX_TEXT`]): names come from other clusters, and a registry with 100,000 services must
//! not send the browser 100,000 rows on every change.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use xcc_proto::propagation::{self, Latency};
use xcc_proto::xcc::admin::v1 as api;

/// Rows of one list sent to the page (exports, imports, peers, grants, refusals); the page
/// says how many more there are.
pub const MAX_ROWS: usize = 200;
/// Characters of one string sent to the page; longer ones end in "…".
pub const MAX_TEXT: usize = 256;
/// Propagation latencies kept per source, newest last.
pub const SAMPLES: usize = 64;
/// Sources of propagation samples kept per registry (peers and children are configured, so
/// this is far above any real count; it bounds what a catalog full of odd sources could do).
pub const MAX_SOURCES: usize = 256;
/// Clusters drawn in the federation tree: subtrees are carried by policy, but a hostile one
/// must not make the page unbounded.
pub const MAX_TREE_NODES: usize = 1000;
/// Levels drawn in the federation tree (a real one has a handful).
pub const MAX_TREE_DEPTH: usize = 32;

/// The model shared by the reading tasks and the renderer.
pub fn lock(model: &Arc<Mutex<Model>>) -> MutexGuard<'_, Model> {
    // A task that panicked while holding the lock left a model that is still consistent
    // enough to draw (each method leaves it whole); keep serving it.
    xcc_controller::plumbing::lock(model)
}

/// Every registry the dashboard reads, in `--addr` order.
#[derive(Debug, Default)]
pub struct Model {
    pub registries: Vec<RegistryView>,
}

/// How reading one registry goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Not read yet (or reconnecting after an error, which stays shown until it works).
    Connecting,
    /// The catalog's snapshot arrived and its watch is open.
    Live,
    /// The last attempt failed; what is shown is from before (if anything).
    Failed(String),
}

type ServiceId = (String, String, String);

/// Latencies observed from one source, the recent ones kept.
#[derive(Debug, Default)]
pub struct Samples {
    recent: VecDeque<f64>,
    count: u64,
    skewed: u64,
}

/// One registry as its admin API shows it.
#[derive(Debug)]
pub struct RegistryView {
    pub addr: String,
    pub status: Status,
    /// When the last read succeeded.
    pub read_at: Option<SystemTime>,
    pub tree: Option<api::Tree>,
    pub peers: Vec<api::Peer>,
    pub routes: Vec<api::Route>,
    /// Its own exports (source `local`).
    local: BTreeMap<ServiceId, api::Service>,
    /// Everything else in its catalog: imports and (at a parent) its children's services.
    imported: BTreeMap<ServiceId, api::Service>,
    /// A snapshot being received: shown once complete.
    incoming: Option<(
        BTreeMap<ServiceId, api::Service>,
        BTreeMap<ServiceId, api::Service>,
    )>,
    propagation: BTreeMap<String, Samples>,
}

fn id(s: &api::Service) -> ServiceId {
    (s.owner_cluster.clone(), s.namespace.clone(), s.name.clone())
}

impl RegistryView {
    pub fn new(addr: &str) -> Self {
        Self {
            addr: addr.to_string(),
            status: Status::Connecting,
            read_at: None,
            tree: None,
            peers: Vec::new(),
            routes: Vec::new(),
            local: BTreeMap::new(),
            imported: BTreeMap::new(),
            incoming: None,
            propagation: BTreeMap::new(),
        }
    }

    /// A watch (re)starts with a snapshot: the services shown stay until it is complete.
    pub fn begin_snapshot(&mut self) {
        self.incoming = Some(Default::default());
    }

    /// The snapshot is complete: it replaces what was shown.
    pub fn snapshot_complete(&mut self, now: SystemTime) {
        if let Some((local, imported)) = self.incoming.take() {
            self.local = local;
            self.imported = imported;
        }
        self.status = Status::Live;
        self.read_at = Some(now);
    }

    /// A service added or changed. Live (not in a snapshot), an import with a propagation stamp
    /// is one latency sample: from when its exporter saw the change to `now`, when it reached
    /// this registry's catalog and its watch delivered it.
    pub fn upsert(&mut self, service: api::Service, now: SystemTime) {
        let key = id(&service);
        let local = service.source == "local";
        let (locals, imports) = match &mut self.incoming {
            Some((l, i)) => (l, i),
            None => {
                if !local {
                    self.sample(&service, now);
                }
                (&mut self.local, &mut self.imported)
            }
        };
        // A service may move between the two (an import becomes a local export).
        if local {
            imports.remove(&key);
            locals.insert(key, service);
        } else {
            locals.remove(&key);
            imports.insert(key, service);
        }
    }

    pub fn delete(&mut self, service: &api::Service) {
        let key = id(service);
        let (locals, imports) = match &mut self.incoming {
            Some((l, i)) => (l, i),
            None => (&mut self.local, &mut self.imported),
        };
        locals.remove(&key);
        imports.remove(&key);
    }

    fn sample(&mut self, service: &api::Service, now: SystemTime) {
        let Some(stamp) = service
            .labels
            .get(propagation::CHANGED_AT_ANNOTATION)
            .and_then(|v| propagation::parse_stamp(v).ok())
        else {
            return;
        };
        if !self.propagation.contains_key(&service.source) && self.propagation.len() >= MAX_SOURCES
        {
            return;
        }
        let samples = self.propagation.entry(service.source.clone()).or_default();
        match propagation::latency(stamp, now) {
            Latency::Observe { seconds, clamped } => {
                if samples.recent.len() == SAMPLES {
                    samples.recent.pop_front();
                }
                samples.recent.push_back(seconds);
                samples.count += 1;
                if clamped {
                    samples.skewed += 1;
                }
            }
            Latency::Skewed => samples.skewed += 1,
        }
    }

    /// How many exports and imports are held.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        (self.local.len(), self.imported.len())
    }
}

impl Model {
    pub fn new(addrs: &[String]) -> Self {
        Self {
            registries: addrs.iter().map(|a| RegistryView::new(a)).collect(),
        }
    }

    /// The page's document: the federation tree, then each registry.
    pub fn render(&self, now: SystemTime) -> String {
        json!({
            "now": millis(now),
            "tree": federation(&self.registries),
            "registries": self.registries.iter().map(|r| registry_json(r, now)).collect::<Vec<_>>(),
        })
        .to_string()
    }
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn ts(t: &Option<prost_types::Timestamp>) -> Value {
    match t {
        Some(t) if t.seconds >= 0 => json!(
            t.seconds.saturating_mul(1000) + i64::from(t.nanos.clamp(0, 999_999_999) / 1_000_000)
        ),
        _ => Value::Null,
    }
}

/// `s`, at most [`MAX_TEXT`] characters.
pub fn text(s: &str) -> Value {
    match s.char_indices().nth(MAX_TEXT) {
        None => Value::String(s.to_string()),
        Some((cut, _)) => Value::String(format!("{}…", &s[..cut])),
    }
}

fn texts<'a>(items: impl IntoIterator<Item = &'a String>) -> Value {
    Value::Array(items.into_iter().take(MAX_ROWS).map(|s| text(s)).collect())
}

/// At most [`MAX_ROWS`] of `items`, and how many there are.
fn rows<'a, T: 'a>(items: impl ExactSizeIterator<Item = &'a T>, f: impl Fn(&T) -> Value) -> Value {
    let total = items.len();
    json!({"total": total, "rows": items.take(MAX_ROWS).map(f).collect::<Vec<_>>()})
}

fn service_json(s: &api::Service) -> Value {
    json!({
        "owner": text(&s.owner_cluster),
        "namespace": text(&s.namespace),
        "name": text(&s.name),
        "fqdn": text(&s.fqdn),
        "endpoints": Value::Array(s.endpoints.iter().take(MAX_ROWS).map(|e| text(&format!("{}:{}", e.address, e.port))).collect()),
        "allowed": texts(&s.allowed_requesters),
        "source": text(&s.source),
        "changedAt": s.labels.get(propagation::CHANGED_AT_ANNOTATION)
            .and_then(|v| propagation::parse_stamp(v).ok()).map(millis),
    })
}

fn enum_name<E: TryFrom<i32>>(v: i32, name: impl Fn(E) -> &'static str) -> String {
    E::try_from(v).map(name).unwrap_or("UNKNOWN").to_string()
}

fn peer_json(p: &api::Peer) -> Value {
    json!({
        "kind": enum_name(p.kind, |k: api::peer::Kind| k.as_str_name()),
        "name": text(&p.name),
        "identity": text(&p.identity),
        "address": text(&p.address),
        "state": enum_name(p.state, |s: api::peer::State| s.as_str_name()),
        "connectedSince": ts(&p.connected_since),
        "lastSync": ts(&p.last_sync),
        "records": p.record_count,
        "lastError": text(&p.last_error),
        "acks": p.acks,
        "nacks": p.nacks,
        "reconnects": p.reconnects,
    })
}

fn route_json(r: &api::Route) -> Value {
    json!({
        "role": text(&r.role),
        "target": text(&format!("{}/{}", r.target_namespace, r.target_service)),
        "caller": text(&format!("{}/{}", r.caller_cluster, r.caller_service)),
        "resolver": text(&r.resolver_cluster),
        "since": ts(&r.since),
        "applied": texts(&r.applied_objects),
    })
}

fn refused_json(r: &api::RefusedEntry) -> Value {
    let entry = if r.name.is_empty() {
        r.cluster.clone()
    } else {
        format!("{}/{}/{}", r.cluster, r.namespace, r.name)
    };
    json!({
        "kind": text(&r.kind),
        "entry": text(&entry),
        "fqdn": text(&r.fqdn),
        "code": text(&r.code),
        "check": text(&r.check),
        "policies": texts(&r.policy_ids),
        "refusedBy": text(&r.refused_by),
        "reason": text(&r.reason),
        "at": ts(&r.at),
    })
}

fn import_json(i: &api::ImportStatus) -> Value {
    json!({
        "target": text(&i.target),
        "as": text(&i.requester_service),
        "state": text(&i.state),
        "reason": text(&i.reason),
        "owner": text(&i.owner_cluster),
        "endpoints": Value::Array(i.endpoints.iter().take(MAX_ROWS).map(|e| text(&format!("{}:{}", e.address, e.port))).collect()),
    })
}

fn samples_json(source: &str, s: &Samples) -> Value {
    let mut sorted: Vec<f64> = s.recent.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let ms = |v: Option<&f64>| v.map(|v| (v * 1000.0).round() as u64);
    json!({
        "source": text(source),
        "count": s.count,
        "skewed": s.skewed,
        "lastMs": ms(s.recent.back()),
        "medianMs": ms(sorted.get(sorted.len() / 2)),
        "maxMs": ms(sorted.last()),
        "window": sorted.len(),
    })
}

fn registry_json(r: &RegistryView, now: SystemTime) -> Value {
    let (status, error) = match &r.status {
        Status::Connecting => ("connecting", String::new()),
        Status::Live => ("live", String::new()),
        Status::Failed(e) => ("error", e.clone()),
    };
    let tree = r.tree.clone().unwrap_or_default();
    json!({
        "addr": text(&r.addr),
        "cluster": text(&tree.cluster),
        "status": status,
        "error": text(&error),
        "readAgoMs": r.read_at.and_then(|t| now.duration_since(t).ok()).map(|d| d.as_millis() as u64),
        "parent": text(&tree.parent),
        "parentState": text(&tree.parent_state),
        "subtree": texts(&tree.subtree),
        "children": rows(tree.children.iter(), |c: &api::Child| json!({
            "cluster": text(&c.cluster),
            "subtree": texts(&c.subtree),
            "address": text(&c.address),
            "connectedSince": ts(&c.connected_since),
            "services": c.announced_services,
            "queuedRoutes": c.queued_routes,
        })),
        "exports": rows(r.local.values(), service_json),
        "imports": rows(r.imported.values(), service_json),
        "requested": rows(tree.imports.iter(), import_json),
        "refused": rows(tree.refused.iter(), refused_json),
        "peers": rows(r.peers.iter(), peer_json),
        "grants": rows(r.routes.iter(), route_json),
        "propagation": r.propagation.iter().map(|(k, s)| samples_json(k, s)).collect::<Vec<_>>(),
        "overflows": tree.overflows,
        "heldNames": tree.held_names.as_ref().map(|h| h.names).unwrap_or(0),
    })
}

/// Where a cluster hangs in the tree, and how sure the dashboard is of it.
struct Link {
    parent: String,
    /// 3: the cluster's own registry says so; 2: its parent lists it as a child; 1: it is in
    /// a child's subtree (somewhere below that child).
    certainty: u8,
    state: String,
}

/// The federation as the registries read see it: roots first, each with its children.
pub fn federation(registries: &[RegistryView]) -> Value {
    let mut links: BTreeMap<String, Link> = BTreeMap::new();
    let mut names: BTreeSet<String> = BTreeSet::new();
    let mut shown: BTreeSet<String> = BTreeSet::new();
    let link = |links: &mut BTreeMap<String, Link>,
                child: &str,
                parent: &str,
                certainty: u8,
                state: &str| {
        if child == parent {
            return;
        }
        let better = links.get(child).is_none_or(|l| l.certainty < certainty);
        if better {
            links.insert(
                child.to_string(),
                Link {
                    parent: parent.to_string(),
                    certainty,
                    state: state.to_string(),
                },
            );
        }
    };
    for t in registries.iter().filter_map(|r| r.tree.as_ref()) {
        shown.insert(t.cluster.clone());
        names.insert(t.cluster.clone());
        if !t.parent.is_empty() {
            names.insert(t.parent.clone());
            link(&mut links, &t.cluster, &t.parent, 3, &t.parent_state);
        }
        for c in &t.children {
            names.insert(c.cluster.clone());
            link(&mut links, &c.cluster, &t.cluster, 2, "CONNECTED");
            for m in &c.subtree {
                if names.len() < MAX_TREE_NODES {
                    names.insert(m.clone());
                }
                link(&mut links, m, &c.cluster, 1, "");
            }
        }
        for m in &t.subtree {
            if names.len() < MAX_TREE_NODES {
                names.insert(m.clone());
            }
        }
    }
    names.retain(|n| !n.is_empty());
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut roots = Vec::new();
    for n in &names {
        match links.get(n).filter(|l| names.contains(&l.parent)) {
            Some(l) => children.entry(l.parent.as_str()).or_default().push(n),
            None => roots.push(n.as_str()),
        }
    }
    let mut visited = BTreeSet::new();
    let mut out = Vec::new();
    fn node<'a>(
        n: &'a str,
        children: &BTreeMap<&'a str, Vec<&'a str>>,
        links: &BTreeMap<String, Link>,
        shown: &BTreeSet<String>,
        visited: &mut BTreeSet<&'a str>,
        depth: usize,
    ) -> Value {
        visited.insert(n);
        let below: Vec<&str> = children
            .get(n)
            .into_iter()
            .flatten()
            .filter(|k| !visited.contains(*k))
            .copied()
            .collect();
        // Deeper than any real hierarchy: stop there rather than recurse without bound.
        let kids: Vec<Value> = if depth >= MAX_TREE_DEPTH {
            Vec::new()
        } else {
            below
                .into_iter()
                .map(|k| node(k, children, links, shown, visited, depth + 1))
                .collect()
        };
        let l = links.get(n);
        json!({
            "cluster": text(n),
            "shown": shown.contains(n),
            "link": l.map(|l| text(&l.state)).unwrap_or(Value::Null),
            "inferred": l.is_some_and(|l| l.certainty == 1),
            "children": kids,
        })
    }
    for r in &roots {
        out.push(node(r, &children, &links, &shown, &mut visited, 0));
    }
    // A cycle (two registries naming each other as parent) has no root: draw it from its
    // first cluster, once.
    for n in &names {
        if !visited.contains(n.as_str()) {
            out.push(node(n, &children, &links, &shown, &mut visited, 0));
        }
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests;
