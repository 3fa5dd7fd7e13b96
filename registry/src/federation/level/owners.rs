//! Name ownership that survives a restart. A level holds each name (FQDN and `namespace/name`)
//! of its children's services for the service that holds it first; while its owner is away the
//! name is reserved (`State::reserved`). Both would be lost when the registry restarts, and the
//! first child to reconnect could take any name. So the level keeps a ledger of every name its
//! children's services hold or have reserved in an [`OwnerStore`] (a file in the state
//! directory, or a ConfigMap), reads it back as reservations before the first child attaches,
//! and rewrites it (at most once per [`PACE`], and once more on shutdown) when it changes. A
//! reservation read back is released exactly like one made in memory: when the owner announces
//! the service again, withdraws it, or finishes a snapshot without it.
//!
//! Clash notices for an owner that is away are kept (a few per cluster) and delivered when a
//! child carrying it attaches, so the owner learns of a claim refused while it was down.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use xcc_proto::names::{canonical_fqdn, is_dns1123_label, is_dns1123_subdomain};
use xcc_proto::xcc::federation::v1 as fed;

use super::Level;
use crate::catalog::{ListFilter, ServiceKey, Source};

/// The shortest time between two writes of the ledger.
pub const PACE: Duration = Duration::from_secs(1);

/// The ledger's file under the state directory (file store).
pub const OWNERS_FILE: &str = "name-owners";

/// The ConfigMap (and its key) holding the ledger (kube store).
pub const OWNERS_CONFIGMAP: &str = "xcc-name-owners";
const OWNERS_KEY: &str = "owners";

/// How many clash notices are kept per absent owner cluster.
const HELD_NOTICES: usize = 16;

const HEADER: &str = "# xcc name owners v1: <name> <cluster> <namespace> <service>";

/// Where a level's ledger lives: one text blob, read at start and replaced whole.
pub trait OwnerStore: Send + Sync + 'static {
    /// The stored ledger, `None` when there is none yet.
    fn load(&self) -> BoxFuture<'_, anyhow::Result<Option<String>>>;
    fn save(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>>;
}

/// `<state-dir>/name-owners`, replaced atomically.
pub struct FileOwners {
    dir: PathBuf,
    path: PathBuf,
}

impl FileOwners {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.to_path_buf(),
            path: state_dir.join(OWNERS_FILE),
        }
    }
}

impl OwnerStore for FileOwners {
    fn load(&self) -> BoxFuture<'_, anyhow::Result<Option<String>>> {
        Box::pin(async move {
            match tokio::fs::read_to_string(&self.path).await {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(anyhow::anyhow!("reading {}: {e}", self.path.display())),
            }
        })
    }

    fn save(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let (dir, path) = (self.dir.clone(), self.path.clone());
            tokio::task::spawn_blocking(move || {
                crate::files::write_atomic(&dir, &path, text.as_bytes())
            })
            .await?
        })
    }
}

/// The ConfigMap [`OWNERS_CONFIGMAP`] in the registry's namespace (server-side apply).
pub struct ConfigMapOwners {
    api: kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
}

impl ConfigMapOwners {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            api: kube::Api::namespaced(client, namespace),
        }
    }
}

impl OwnerStore for ConfigMapOwners {
    fn load(&self) -> BoxFuture<'_, anyhow::Result<Option<String>>> {
        Box::pin(async move {
            let cm = self.api.get_opt(OWNERS_CONFIGMAP).await?;
            Ok(cm.and_then(|cm| cm.data?.remove(OWNERS_KEY)))
        })
    }

    fn save(&self, text: String) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let cm = serde_json::json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": OWNERS_CONFIGMAP,
                    "labels": { "app.kubernetes.io/managed-by": "xcc-registry" },
                },
                "data": { OWNERS_KEY: text },
            });
            self.api
                .patch(
                    OWNERS_CONFIGMAP,
                    &kube::api::PatchParams::apply("xcc-registry").force(),
                    &kube::api::Patch::Apply(cm),
                )
                .await?;
            Ok(())
        })
    }
}

/// The ledger's text: one line per name, sorted.
fn render(owners: &BTreeMap<String, ServiceKey>) -> String {
    let mut text = String::from(HEADER);
    text.push('\n');
    for (name, k) in owners {
        text.push_str(&format!(
            "{name} {} {} {}\n",
            k.cluster, k.namespace, k.name
        ));
    }
    text
}

/// Read a ledger back. The file or ConfigMap is input like any other: a line that does not
/// hold a valid name and a valid owner key is skipped with a warning, the rest still counts.
fn parse(text: &str) -> BTreeMap<String, ServiceKey> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Some((name, key)) => {
                out.insert(name, key);
            }
            None => warn!(
                line = n + 1,
                "skipping an invalid line of the name-owner ledger"
            ),
        }
    }
    out
}

fn parse_line(line: &str) -> Option<(String, ServiceKey)> {
    let mut fields = line.split(' ');
    let (name, cluster, namespace, service) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    // What an announcement is held to (`convert::entry_from_announcement`).
    if fields.next().is_some()
        || !is_dns1123_label(cluster)
        || !is_dns1123_label(namespace)
        || !is_dns1123_subdomain(service)
    {
        return None;
    }
    let valid_name = match name.split_once('/') {
        Some((ns, n)) => is_dns1123_label(ns) && is_dns1123_subdomain(n),
        None => canonical_fqdn(name).is_ok_and(|f| f == name),
    };
    valid_name.then(|| {
        (
            name.to_string(),
            ServiceKey::new(cluster, namespace, service),
        )
    })
}

impl Level {
    /// Every name held here for a service of the children's subtrees, present or reserved.
    fn owned_names(&self) -> BTreeMap<String, ServiceKey> {
        let mut out: BTreeMap<String, ServiceKey> = self
            .lock()
            .reserved
            .iter()
            .map(|(name, key)| (name.to_string(), key.clone()))
            .collect();
        for e in self.inner.catalog.list(&ListFilter::default()) {
            if matches!(e.source, Source::Child(_)) {
                out.insert(e.fqdn.to_string(), e.key.clone());
                out.insert(format!("{}/{}", e.key.namespace, e.key.name), e.key.clone());
            }
        }
        out
    }

    /// Read the ledger back as reservations (call it before any child can attach); the
    /// returned task keeps the ledger up to date until `cancel`, with a last write on the way
    /// out.
    pub async fn keep_owners(
        &self,
        store: Arc<dyn OwnerStore>,
        cancel: CancellationToken,
    ) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
        // No ledger yet reads as an empty one (nothing to write until a name is held).
        let loaded = store
            .load()
            .await?
            .unwrap_or_else(|| render(&BTreeMap::new()));
        let held = parse(&loaded);
        if !held.is_empty() {
            info!(
                names = held.len(),
                "names held for their owners since before the restart"
            );
        }
        self.lock().reserved.extend(
            held.into_iter()
                .map(|(name, key)| (Arc::<str>::from(name), key)),
        );
        let level = self.clone();
        Ok(async move {
            let mut written = loaded;
            let mut changes = level.subscribe();
            let mut events = level.inner.catalog.subscribe();
            loop {
                let text = render(&level.owned_names());
                if text != written {
                    match store.save(text.clone()).await {
                        Ok(()) => written = text,
                        Err(e) => {
                            warn!(error = %format!("{e:#}"), "cannot write the name-owner ledger; trying again on the next change")
                        }
                    }
                }
                if cancel.is_cancelled() {
                    break;
                }
                tokio::select! {
                    _ = cancel.cancelled() => continue,
                    r = changes.changed() => if r.is_err() { break },
                    _ = events.recv() => {}
                }
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tokio::time::sleep(PACE) => {}
                }
                events = events.resubscribe();
            }
        })
    }

    /// A clash notice for an owner that is not connected: kept until a child carrying the
    /// owner's cluster attaches.
    pub(super) fn hold_clash(&self, n: fed::NameClash) {
        let mut st = self.lock();
        // Only for a cluster a name is held for here (which bounds what is kept).
        if !st.reserved.values().any(|k| k.cluster == n.owner_cluster) {
            return;
        }
        let held = st.held_clashes.entry(n.owner_cluster.clone()).or_default();
        if held.len() >= HELD_NOTICES {
            held.remove(0);
        }
        held.push(n);
    }

    /// Deliver the notices kept for the clusters `child` now carries.
    pub(super) fn deliver_held_clashes(&self, child: &str) {
        let mut st = self.lock();
        let Some(carried) = st.tree.children().get(child).cloned() else {
            return;
        };
        let Some(link) = st.sessions.get(child).map(|s| s.link.clone()) else {
            return;
        };
        for cluster in carried {
            for n in st.held_clashes.remove(&cluster).unwrap_or_default() {
                self.down(&link, fed::parent_message::Payload::NameClash(n));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_reads_back_what_it_wrote_and_skips_bad_lines() {
        let owners = BTreeMap::from([
            (
                "api.shop.svc.clusterset.local".to_string(),
                ServiceKey::new("c2", "shop", "api"),
            ),
            ("shop/api".to_string(), ServiceKey::new("c2", "shop", "api")),
            (
                "shop/v1.api".to_string(),
                ServiceKey::new("c2", "shop", "v1.api"),
            ),
        ]);
        let text = render(&owners);
        assert_eq!(parse(&text), owners);
        let hostile = format!(
            "{text}../x c2 shop api\nshop/api ../c2 shop api\nAPI.example c2 shop api\n\
             a.b c2 shop api extra\nshop/api c2 shop\nshop/x c2 Shop x\nb.example c9 shop web\n"
        );
        let mut expected = owners.clone();
        expected.insert("b.example".into(), ServiceKey::new("c9", "shop", "web"));
        assert_eq!(parse(&hostile), expected);
    }
}
