//! The registry's outgoing links: one managed Hamlet client per remote registry and at most one
//! parent link (with its import sync), kept in step with what a store wants ([`Remotes`]). The
//! stores (memory through the API, files, Kubernetes) decide what they want; this module runs
//! it. Every link is a supervised task of the process: one that panics stops the registry.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tracing::{info, warn};
use xcc_controller::tasks::{Spawner, TaskHandle};
use xcc_proto::crd::RemoteRegistry;

use crate::catalog::Source;
use crate::federation::grants::WorkloadIdentity;
use crate::federation::link::ParentSpec;
use crate::federation::{Level, Question, Target};
use crate::hamlet::client::{self, ClientContext, ClientHandle, RemoteSpec};
use crate::hamlet::convert::Imported;

/// Imports a store keeps beyond the process (the file store's import files): read back when a
/// remote's client starts, removed with the remote.
pub trait PersistedImports: Send + Sync {
    /// The imports last stored for `remote` (none when nothing was stored).
    fn load(&self, remote: &str) -> anyhow::Result<Vec<Imported>>;
    /// Remove what is stored for `remote`.
    fn forget(&self, remote: &str) -> std::io::Result<()>;
}

/// A parent link and the imports asked through it.
pub type ParentWanted = Option<(ParentSpec, Vec<Question>)>;

/// The managed clients, keyed by RemoteRegistry name, and the parent link.
#[derive(Clone)]
pub struct Remotes {
    ctx: ClientContext,
    clients: Arc<Mutex<BTreeMap<String, ClientHandle>>>,
    file_sink: Option<Arc<dyn PersistedImports>>,
    spawner: Spawner,
    level: Level,
    parent: Arc<Mutex<Option<ParentLink>>>,
    import_retry: Duration,
}

/// The running parent link and its import sync.
struct ParentLink {
    spec: ParentSpec,
    task: TaskHandle,
}

fn same_parent(a: &ParentSpec, b: &ParentSpec) -> bool {
    a.name == b.name
        && a.address == b.address
        && a.server_name == b.server_name
        && match (&a.roots, &b.roots) {
            (None, None) => true,
            (Some(x), Some(y)) => Arc::ptr_eq(x, y) || x.roots == y.roots,
            _ => false,
        }
}

impl Remotes {
    /// Nothing running yet. A file store's imports are read back from `file_sink` when a
    /// client starts; the parent link's imports are asked again every `import_retry`.
    pub fn new(
        ctx: ClientContext,
        file_sink: Option<Arc<dyn PersistedImports>>,
        spawner: Spawner,
        level: Level,
        import_retry: Duration,
    ) -> Self {
        Self {
            ctx,
            clients: Arc::default(),
            file_sink,
            spawner,
            level,
            parent: Arc::default(),
            import_retry,
        }
    }

    /// The hierarchy level the parent link and its imports run on.
    pub fn level(&self) -> &Level {
        &self.level
    }

    /// Names of the running clients and of the running parent link.
    pub async fn running(&self) -> (BTreeSet<String>, Option<String>) {
        let clients = self.clients.lock().await.keys().cloned().collect();
        let parent = self
            .parent
            .lock()
            .await
            .as_ref()
            .map(|p| p.spec.name.clone());
        (clients, parent)
    }

    /// Make the parent link match `parent` (with its imports).
    pub async fn reconcile_parent(&self, parent: ParentWanted) {
        let imports = parent.as_ref().map(|(_, i)| i.clone()).unwrap_or_default();
        let mut current = self.parent.lock().await;
        let keep = matches!((&*current, &parent), (Some(cur), Some((want, _))) if same_parent(&cur.spec, want));
        if !keep {
            if let Some(old) = current.take() {
                old.task.stop().await;
                self.level.set_imports(&[]);
                self.ctx
                    .catalog
                    .replace_source(&Source::Hierarchy(old.spec.name.clone()), vec![]);
                if let Some(sink) = &self.file_sink
                    && let Err(e) = sink.forget(&old.spec.name)
                {
                    warn!(parent = %old.spec.name, error = %e, "cannot remove the import file");
                }
                info!(parent = %old.spec.name, "parent link stopped");
            }
            self.level
                .set_parent(parent.as_ref().map(|(p, _)| p.name.clone()));
            if let Some((spec, _)) = &parent {
                // The questions first: the import sync must never see the empty set of a link
                // that has not been told its imports yet (it would persist it).
                self.level.set_imports(&imports);
                let task = self.spawn_parent_link(spec.clone());
                info!(parent = %spec.name, address = %spec.address, "parent link started");
                *current = Some(ParentLink {
                    spec: spec.clone(),
                    task,
                });
            }
        }
        self.level.set_imports(&imports);
    }

    /// The link to `spec` and the sync of its imports, as one task.
    fn spawn_parent_link(&self, spec: ParentSpec) -> TaskHandle {
        let (level, tls, backoff, peers) = (
            self.level.clone(),
            self.ctx.tls.clone(),
            self.ctx.config.backoff.clone(),
            self.ctx.peers.clone(),
        );
        let (sink, retry) = (self.ctx.sink.clone(), self.import_retry);
        let name = format!("parent link {}", spec.name);
        self.spawner
            .spawn_stoppable(name, move |cancel| async move {
                let parent = spec.name.clone();
                tokio::join!(
                    crate::federation::link::run(
                        level.clone(),
                        tls,
                        spec,
                        backoff,
                        peers,
                        cancel.clone()
                    ),
                    crate::federation::imports::run(level, parent, sink, retry, cancel),
                );
                Ok(())
            })
    }

    /// Make the running clients match `desired`: start new ones, update changed ones, stop and
    /// forget removed ones (their imports are ours and go with them).
    pub async fn reconcile(&self, desired: Vec<RemoteSpec>) {
        let mut clients = self.clients.lock().await;
        let wanted: BTreeMap<String, RemoteSpec> =
            desired.into_iter().map(|s| (s.name.clone(), s)).collect();
        let removed: Vec<String> = clients
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for name in removed {
            if let Some(handle) = clients.remove(&name) {
                handle.stop().await;
            }
            self.ctx
                .catalog
                .replace_source(&Source::Remote(name.clone()), vec![]);
            if let Some(sink) = &self.file_sink
                && let Err(e) = sink.forget(&name)
            {
                warn!(remote = %name, error = %e, "cannot remove the import file");
            }
            info!(remote = %name, "remote registry removed; its imports were removed");
        }
        for (name, spec) in wanted {
            match clients.get(&name) {
                Some(handle) => handle.update(spec),
                None => {
                    if let Some(sink) = &self.file_sink {
                        match sink.load(&name) {
                            Ok(imports) => {
                                let entries = imports
                                    .iter()
                                    .map(|i| client::entry_for(&name, i))
                                    .collect();
                                self.ctx
                                    .catalog
                                    .replace_source(&Source::Remote(name.clone()), entries);
                            }
                            Err(e) => {
                                warn!(remote = %name, error = %format!("{e:#}"), "cannot read persisted imports")
                            }
                        }
                    }
                    info!(remote = %name, address = %spec.address, "starting import client");
                    let handle = client::spawn(self.ctx.clone(), spec, &self.spawner);
                    clients.insert(name, handle);
                }
            }
        }
    }
}

/// The services a `role: Parent` RemoteRegistry asks the hierarchy for, each on behalf of its
/// requester identity (`trust_domain` is this cluster's, for an identity that names none). An
/// import that does not hold (the RemoteRegistry is validated before it gets here) is left out.
pub fn hierarchy_imports(rr: &RemoteRegistry, trust_domain: &str) -> Vec<Question> {
    rr.spec
        .imports
        .iter()
        .flatten()
        .filter_map(|i| {
            let target = match (&i.fqdn, &i.namespace, &i.name) {
                (Some(f), _, _) => Target::Fqdn(xcc_proto::names::canonical_fqdn(f).ok()?),
                (None, Some(ns), Some(n)) => Target::Name {
                    namespace: ns.clone(),
                    name: n.clone(),
                },
                _ => return None,
            };
            let identity = match &i.requester_identity {
                None => None,
                Some(id) => {
                    let id = WorkloadIdentity {
                        trust_domain: id.trust_domain.as_deref().unwrap_or(trust_domain).into(),
                        namespace: id.namespace.clone(),
                        service_account: id.service_account.clone(),
                    };
                    id.check().ok()?;
                    Some(id)
                }
            };
            Some(Question {
                target,
                requester_service: i.requester_service.clone().unwrap_or_default(),
                identity,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each import is asked on behalf of its requester identity, in this cluster's trust domain
    /// unless it names one; one whose identity does not hold is left out.
    #[test]
    fn hierarchy_imports_carry_the_requester_identity() {
        let rr: RemoteRegistry = serde_json::from_value(serde_json::json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
            "kind": "RemoteRegistry",
            "metadata": {"name": "up", "namespace": "xcc"},
            "spec": {
                "address": "root.example:443",
                "tlsConfig": {"serverCA": "", "serverName": "root.example"},
                "role": "Parent",
                "imports": [
                    {"namespace": "shop", "name": "api"},
                    {"fqdn": "API.shop.example.", "requesterService": "web",
                     "requesterIdentity": {"namespace": "storefront", "serviceAccount": "web"}},
                    {"namespace": "shop", "name": "cart", "requesterService": "web",
                     "requesterIdentity": {"namespace": "storefront", "serviceAccount": "web",
                                           "trustDomain": "other.example"}},
                    {"namespace": "shop", "name": "bad",
                     "requesterIdentity": {"namespace": "../x", "serviceAccount": "web"}},
                ],
            },
        }))
        .expect("a RemoteRegistry");
        let identity = |trust_domain: &str| {
            Some(WorkloadIdentity {
                trust_domain: trust_domain.into(),
                namespace: "storefront".into(),
                service_account: "web".into(),
            })
        };
        let name = |name: &str| Target::Name {
            namespace: "shop".into(),
            name: name.into(),
        };
        assert_eq!(
            hierarchy_imports(&rr, "west.mesh.example"),
            [
                Question::new(name("api"), ""),
                Question {
                    identity: identity("west.mesh.example"),
                    ..Question::new(Target::Fqdn("api.shop.example".into()), "web")
                },
                Question {
                    identity: identity("other.example"),
                    ..Question::new(name("cart"), "web")
                },
            ]
        );
    }
}
