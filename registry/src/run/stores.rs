//! The store a registry keeps exports, remotes and imports in, wired to the catalog and the
//! [`Remotes`]: nothing (memory: set through the API), YAML files under a state directory, or
//! Kubernetes. Each sets the registry ready once its first load is done.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry as Metrics;
use tokio::sync::{mpsc, watch};
use tracing::warn;
use xcc_controller::tasks::Spawner;
use xcc_proto::crd::{RemoteRegistry, Role, ServiceRecord};

use super::{Core, RegistryConfig, StartError};
use crate::federation::Level;
use crate::federation::grants::GrantMode;
use crate::federation::link::ParentSpec;
use crate::files::FileErrors;
use crate::hamlet::client::{ClientContext, ImportSink, MemorySink, RemoteSpec};
use crate::remote_ca::RemoteCaExpiry;
use crate::remotes::{ParentWanted, Remotes, hierarchy_imports};
use crate::store::file::{self, FileImportSink, YamlDir};
use crate::store::kube::{self, GrantWiring, KubeImportSink, KubeMetrics, Owners};
use crate::store::model;

/// Start the store: its sink, the remotes it wants, and its watches.
pub(super) async fn start(
    config: &RegistryConfig,
    core: &Core,
    level: &Level,
    policy_synced: Option<watch::Receiver<bool>>,
    metrics: &mut Metrics,
    spawner: &Spawner,
) -> Result<(Remotes, FileErrors), StartError> {
    let remotes = |sink: Arc<dyn ImportSink>, file_sink| {
        let ctx = ClientContext {
            catalog: core.catalog.clone(),
            peers: core.peers.clone(),
            metrics: core.metrics.clone(),
            tls: core.tls.clone(),
            sink,
            config: config.client.clone(),
        };
        let retry = config.federation.import_retry;
        Remotes::new(ctx, file_sink, spawner.clone(), level.clone(), retry)
    };
    // The parent given in code (memory store, tests): started before the store's own.
    let parent: ParentWanted = config
        .federation
        .parent
        .clone()
        .map(|p| (p, config.federation.imports.clone()));
    let file_errors = FileErrors::default();
    let ca_expiry = RemoteCaExpiry::default();
    ca_expiry.register(metrics);
    let remotes = match &config.store {
        super::StoreConfig::Memory => {
            let remotes = remotes(Arc::new(MemorySink), None);
            if parent.is_some() {
                remotes.reconcile_parent(parent).await;
            }
            core.health.set_ready(true);
            remotes
        }
        super::StoreConfig::File { state_dir, poll } => {
            let sink = FileImportSink::new(state_dir, config.namespace.clone())
                .map_err(|source| state_dir_error(state_dir, source))?;
            let sink = Arc::new(sink);
            let remotes = remotes(sink.clone(), Some(sink));
            if parent.is_some() {
                remotes.reconcile_parent(parent).await;
            }
            let watch = FileWatch {
                remotes: &remotes,
                errors: &file_errors,
                ca_expiry,
            };
            start_files(state_dir, *poll, core, watch, spawner).await?;
            remotes
        }
        super::StoreConfig::Kube(k) => {
            let (owners, kube_metrics) = (Owners::default(), KubeMetrics::default());
            let sink = Arc::new(KubeImportSink::new(
                k.client.clone(),
                config.namespace.clone(),
                owners.clone(),
                kube_metrics.clone(),
            ));
            let remotes = remotes(sink.clone(), None);
            if parent.is_some() {
                remotes.reconcile_parent(parent).await;
            }
            // Ready once the exports were listed and the policies read (the store sets it).
            kube_metrics.register(metrics);
            let parts = kube::Parts {
                catalog: core.catalog.clone(),
                cluster: core.cluster.clone(),
                namespace: config.namespace.clone(),
                health: core.health.clone(),
                peers: core.peers.clone(),
                remotes: remotes.clone(),
                sink,
                owners,
                metrics: kube_metrics,
                grants: grant_wiring(config, core, level, metrics),
                policy_synced,
                ca_expiry,
            };
            kube::spawn(parts, k.clone(), spawner);
            if let Some(pod) = k.pod.clone() {
                let (client, tls) = (k.client.clone(), core.tls.clone());
                let cancel = spawner.token().clone();
                spawner.spawn_infallible(
                    "certificate events",
                    kube::own_certs::run(client, tls, pod, cancel),
                );
            }
            remotes
        }
    };
    Ok((remotes, file_errors))
}

/// Grant objects are writes: only the leader writes them (the store starts the writer when
/// this replica leads).
fn grant_wiring(
    config: &RegistryConfig,
    core: &Core,
    level: &Level,
    metrics: &mut Metrics,
) -> Option<GrantWiring> {
    (config.federation.grant_mode != GrantMode::None).then(|| {
        let g = GrantWiring {
            config: config.federation.grants(),
            level: level.clone(),
            metrics: Default::default(),
            store_errors: core.metrics.store_errors.clone(),
        };
        g.metrics.register(metrics);
        g
    })
}

fn state_dir_error(dir: &Path, source: std::io::Error) -> StartError {
    StartError::StateDir {
        path: dir.to_path_buf(),
        source,
    }
}

/// What the file store's watch keeps in step with the remote files.
struct FileWatch<'a> {
    remotes: &'a Remotes,
    errors: &'a FileErrors,
    ca_expiry: RemoteCaExpiry,
}

/// `--store file`: load exports and remotes once (then the registry is ready), then follow
/// their directories.
async fn start_files(
    state_dir: &Path,
    poll: Duration,
    core: &Core,
    watch: FileWatch<'_>,
    spawner: &Spawner,
) -> Result<(), StartError> {
    let FileWatch {
        remotes,
        errors,
        ca_expiry,
    } = watch;
    let exports_dir = state_dir.join(file::EXPORTS_DIR);
    let remotes_dir = state_dir.join(file::REMOTES_DIR);
    for d in [&exports_dir, &remotes_dir] {
        std::fs::create_dir_all(d).map_err(|source| state_dir_error(d, source))?;
    }
    // The watcher reports which files changed; a refresh looks at those only.
    let events = file::DirEvents::default();
    let mut exports =
        YamlDir::<ServiceRecord>::new(exports_dir.clone()).with_events(events.clone());
    let mut remote_files =
        YamlDir::<RemoteRegistry>::new(remotes_dir.clone()).with_events(events.clone());
    // First load before serving readiness.
    file::sync_exports(&core.catalog, &core.cluster, &mut exports);
    remote_files.refresh(|rr| model::remote_spec(rr).map(|_| ()));
    let (peers_wanted, parent_wanted) = split_remotes(&remote_files, remotes.level());
    remotes.reconcile(peers_wanted).await;
    remotes.reconcile_parent(parent_wanted).await;
    let mut ca_due = observe_server_cas(&ca_expiry, &remote_files);
    let now = [exports.errors(), remote_files.errors()].concat();
    core.metrics.set_rejected_files(&[], &now);
    errors.set(now);
    core.health.set_ready(true);

    let cancel = spawner.token().clone();
    let (tx, mut rx) = mpsc::channel(1);
    let watcher = file::spawn_dir_watcher_with_events(
        vec![exports_dir, remotes_dir],
        poll,
        tx,
        cancel.clone(),
        events,
    );
    let (core, remotes, errors) = (core.clone(), remotes.clone(), errors.clone());

    spawner.spawn("state directory watch", async move {
        loop {
            // A change that takes something away waits to settle (see `file::SETTLE`): look
            // again when the first one is due, even if no event comes.
            let due = exports
                .next_due()
                .into_iter()
                .chain(remote_files.next_due())
                .min();
            tokio::select! {
                _ = cancel.cancelled() => break,
                got = rx.recv() => if got.is_none() { break },
                _ = sleep_until_due(due) => {}
                // A serverCA entering its warning period or expiring is reported then.
                _ = sleep_until_due(ca_due) => {
                    ca_due = observe_server_cas(&ca_expiry, &remote_files);
                    continue;
                }
            }
            file::sync_exports(&core.catalog, &core.cluster, &mut exports);
            if remote_files.refresh(|rr| model::remote_spec(rr).map(|_| ())) {
                let (peers_wanted, parent_wanted) = split_remotes(&remote_files, remotes.level());
                remotes.reconcile(peers_wanted).await;
                remotes.reconcile_parent(parent_wanted).await;
                ca_due = observe_server_cas(&ca_expiry, &remote_files);
            }
            let now = [exports.errors(), remote_files.errors()].concat();
            core.metrics.set_rejected_files(&errors.get(), &now);
            errors.set(now);
        }
        watcher.abort();
        Ok(())
    });
    Ok(())
}

/// The serverCAs of the remote files into the metric and the log; when to look again.
fn observe_server_cas(
    ca_expiry: &RemoteCaExpiry,
    files: &YamlDir<RemoteRegistry>,
) -> Option<std::time::Instant> {
    let now = time::OffsetDateTime::now_utc();
    let next = ca_expiry.observe(&files.items(), now).next_change;
    crate::remote_ca::until(next, now).map(|d| std::time::Instant::now() + d)
}

/// Resolves at `due`; never without one.
async fn sleep_until_due(due: Option<std::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Peers (Hamlet imports) and the parent (hierarchy) among the RemoteRegistry files. With
/// several parents, the first by name wins and the others are reported.
fn split_remotes(
    files: &YamlDir<RemoteRegistry>,
    level: &Level,
) -> (Vec<RemoteSpec>, ParentWanted) {
    let mut peers = vec![];
    let mut parents = vec![];
    for rr in files.items() {
        let Ok(spec) = model::remote_spec(&rr) else {
            continue;
        };
        if rr.spec.role() == Role::Parent {
            let imports = hierarchy_imports(&rr, &level.trust_domain());
            parents.push((
                ParentSpec {
                    name: spec.name,
                    address: spec.address,
                    server_name: spec.server_name,
                    roots: spec.roots,
                },
                imports,
            ));
        } else {
            peers.push(spec);
        }
    }
    parents.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    if parents.len() > 1 {
        let ignored: Vec<&str> = parents[1..].iter().map(|p| p.0.name.as_str()).collect();
        warn!(using = %parents[0].0.name, ?ignored, "more than one RemoteRegistry has role Parent; only one parent is allowed");
    }
    (peers, parents.into_iter().next())
}
