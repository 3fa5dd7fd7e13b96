//! Imports through the hierarchy: the persistent questions of a `role: Parent` RemoteRegistry
//! and their granted answers, mirrored into the catalog (`Source::Hierarchy`) and the import
//! sink so the binder materialises them like any other import. Unanswered, denied or not-found
//! questions are asked again periodically; answers change by themselves through pushes.

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

fn granted_entries(level: &Level, parent: &str) -> Vec<ServiceEntry> {
    let mut out: BTreeMap<ServiceKey, ServiceEntry> = BTreeMap::new();
    for (_, _, answer) in level.subscriptions() {
        let Some(a) = answer else { continue };
        if !(a.found && a.access_allowed) || a.revoked {
            continue;
        }
        let key = ServiceKey::new(&a.owner_cluster, &a.namespace, &a.name);
        out.insert(
            key.clone(),
            ServiceEntry {
                key,
                source: Source::Hierarchy(parent.to_string()),
                fqdn: a.fqdn.clone(),
                endpoints: a
                    .endpoints
                    .iter()
                    .filter_map(|e| parse_endpoint(e).ok())
                    .collect(),
                ports: a
                    .ports
                    .iter()
                    .map(|p| crate::catalog::NamedPort {
                        name: p.name.clone(),
                        port: p.port,
                        protocol: p.protocol.clone(),
                    })
                    .collect(),
                labels: Default::default(),
                allowed_requesters: vec![],
                origin: Some(crate::catalog::Origin {
                    cluster: a.owner_cluster.clone(),
                    namespace: a.namespace.clone(),
                    name: a.name.clone(),
                    kind: String::new(),
                }),
                revision: 0,
            },
        );
    }
    out.into_values().collect()
}

/// Keep the catalog and the sink in step with the granted answers until `cancel`.
pub fn spawn(
    level: Level,
    parent: String,
    sink: Arc<dyn ImportSink>,
    retry: Duration,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut changes = level.subscribe();
        let mut tick = tokio::time::interval(retry);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last: Option<Vec<ServiceEntry>> = None;
        loop {
            let entries = granted_entries(&level, &parent);
            if last.as_ref() != Some(&entries) {
                let imports: BTreeMap<String, Imported> = entries
                    .iter()
                    .map(|e| {
                        (
                            e.fqdn.clone(),
                            Imported {
                                fqdn: e.fqdn.clone(),
                                raw_fqdn: e.fqdn.clone(),
                                endpoints: e.endpoints.clone(),
                                labels: e.labels.clone(),
                            },
                        )
                    })
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
    })
}
