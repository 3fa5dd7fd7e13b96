//! Imports through the hierarchy: the persistent questions of a `role: Parent` RemoteRegistry
//! and their granted answers, mirrored into the catalog (`Source::Hierarchy`) and the import
//! sink so the binder materialises them like any other import. Unanswered, denied or not-found
//! questions are asked again periodically; answers change by themselves through pushes.
//!
//! Nothing is persisted until every question has a deciding answer (granted, denied, not
//! found): right after a (re)start the questions are pending or answered "unavailable" while
//! the parent link comes up, and persisting that empty set would delete the imported records
//! only to re-create them moments later. Until then what is stored stays as it is. With no
//! questions at all the (empty) set is decided at once, so removed imports do go. The caller
//! sets the questions ([`Level::set_imports`]) before spawning the sync.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::convert::parse_endpoint;
use super::level::Level;
use crate::catalog::{ServiceEntry, ServiceKey, Source};
use crate::hamlet::client::ImportSink;
use crate::hamlet::convert::Imported;
use xcc_proto::xcc::federation::v1::ServiceQueryResponse;

/// A question: what is asked for, and by which service.
type Question = (super::level::Target, String);

fn entry_of(a: &ServiceQueryResponse, parent: &str) -> ServiceEntry {
    let key = ServiceKey::new(&a.owner_cluster, &a.namespace, &a.name);
    ServiceEntry {
        key,
        source: Source::Hierarchy(parent.to_string()),
        fqdn: a.fqdn.as_str().into(),
        endpoints: a
            .endpoints
            .iter()
            .filter_map(|e| parse_endpoint(e).ok())
            .collect(),
        ports: a
            .ports
            .iter()
            .map(|p| crate::catalog::NamedPort {
                name: p.name.as_str().into(),
                port: p.port,
                protocol: p.protocol.as_str().into(),
            })
            .collect(),
        labels: Default::default(),
        allowed_requesters: vec![],
        origin: Some(Box::new(crate::catalog::Origin {
            cluster: a.owner_cluster.clone(),
            namespace: a.namespace.clone(),
            name: a.name.clone(),
            kind: String::new(),
        })),
        revision: 0,
    }
}

/// The granted services among `subs`. A question whose answer does not decide it (pending, or
/// "unavailable" because a level above cannot be reached) keeps its entry from `remembered`
/// (the cached answer is served, seed 000). Returns the entries and the new memory.
fn granted_entries(
    subs: &[(super::level::Target, String, Option<ServiceQueryResponse>)],
    remembered: &BTreeMap<Question, ServiceEntry>,
    parent: &str,
) -> (Vec<ServiceEntry>, BTreeMap<Question, ServiceEntry>) {
    let mut out: BTreeMap<ServiceKey, ServiceEntry> = BTreeMap::new();
    let mut memory = BTreeMap::new();
    for (target, service, answer) in subs {
        let question = (target.clone(), service.clone());
        let entry = match answer {
            Some(a) if decided(Some(a)) => {
                if !(a.found && a.access_allowed) || a.revoked {
                    continue;
                }
                entry_of(a, parent)
            }
            _ => match remembered.get(&question) {
                Some(e) => e.clone(),
                None => continue,
            },
        };
        memory.insert(question, entry.clone());
        out.insert(entry.key.clone(), entry);
    }
    (out.into_values().collect(), memory)
}

/// Whether an answer decides its question: granted, denied or not found — not "unavailable"
/// (the parent, or a level above it, could not be reached).
pub fn decided(answer: Option<&ServiceQueryResponse>) -> bool {
    answer.is_some_and(|a| !a.unavailable)
}

/// Whether every persistent question of `level` has a deciding answer (true with none).
pub fn all_decided(level: &Level) -> bool {
    level
        .subscriptions()
        .iter()
        .all(|(_, _, a)| decided(a.as_ref()))
}

/// Keep the catalog and the sink in step with the granted answers until `cancel`.
pub async fn run(
    level: Level,
    parent: String,
    sink: Arc<dyn ImportSink>,
    retry: Duration,
    cancel: CancellationToken,
) {
    let mut changes = level.subscribe();
    let mut tick = tokio::time::interval(retry);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Vec<ServiceEntry>> = None;
    let mut remembered: BTreeMap<Question, ServiceEntry> = BTreeMap::new();
    loop {
        // Before the first persist, wait until every question is decided (see the module
        // docs); afterwards a granted answer stays until it is revoked or denied.
        let subs = level.subscriptions();
        let ready = last.is_some() || subs.iter().all(|(_, _, a)| decided(a.as_ref()));
        let (entries, memory) = granted_entries(&subs, &remembered, &parent);
        remembered = memory;
        if ready && last.as_ref() != Some(&entries) {
            let imports: BTreeMap<String, Imported> = entries
                .iter()
                .map(|e| (e.fqdn.to_string(), Imported::of_entry(e)))
                .collect();
            match sink.persist(&parent, &imports).await {
                Ok(()) => {
                    level
                        .catalog()
                        .replace_source(&Source::Hierarchy(parent.clone()), entries.clone());
                    last = Some(entries);
                }
                Err(e) => {
                    warn!(%parent, error = %format!("{e:#}"), "cannot persist hierarchy imports; retrying")
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
            _ = tick.tick() => level.retry_unanswered(),
        }
    }
}
