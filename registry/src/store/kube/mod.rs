//! The Kubernetes store: `xcc registry --store kube`.
//!
//! Two halves:
//!
//! * **Exports** (every replica, active-active): a watch on ServiceRecords carrying the export
//!   label and not the imported label, in all namespaces, applied to the catalog one event at a
//!   time (`Source::Local`, keyed by cluster, namespace and name). Events of one watch arrive in
//!   order and are applied in that order, so a key's updates and its removal never swap (no deleted
//!   service comes back). Removing the export label is a removal (the API server reports an object
//!   leaving a label selector as DELETED), so Hamlet consumers get a DELETE. Two exported records
//!   with the same FQDN in different namespaces are both kept in the catalog; Hamlet serves one of
//!   them per FQDN (the catalog's rule: the first by namespace and name, reported as a conflict)
//!   and falls over to the other when it goes, so consumers see an UPDATE rather than a DELETE
//!   while any source remains. A record the registry cannot map keeps its last good entry. The
//!   registry is ready once the exports were listed and the policy ConfigMap (when one is
//!   configured; watched on every replica, see [`crate::authz_configmap`]) was read.
//! * **Imports** (only while this replica holds the Lease `xcc-registry`): a watch on
//!   RemoteRegistries. Those in the registry's namespace are validated and handed to the managed
//!   clients (peers) or the parent link (`role: Parent`), deciding from the running clients — never
//!   from `observedGeneration`, so a restart reconnects every one. An invalid spec stops that
//!   registry's client and removes its imports. Registries in other namespaces are only reported
//!   (an owner reference across namespaces is invalid). Every RemoteRegistry's status is written
//!   through the status subresource when it differs from what is stored; a `role: Parent` one also
//!   reports each of its imports (`status.imports`: granted, denied and why, not found,
//!   unavailable) and is `Synced` once the parent link is up and every import has an answer.
//!   Imports are written by [`KubeImportSink`].
//! * **Refusals** (only while leading: the leader runs the parent link): an exported record
//!   whose announcement the parent refuses gets `Announced=False` (the failed check, the Cedar
//!   policy ids) and a Warning Event, turned back when the refusal no longer stands; see
//!   [`refusals`].
//! * **Grants** (`--grant-mode` other than none; only while leading, they are writes): the
//!   grant objects and `status.grants` of this cluster's exported records, written by
//!   [`KubeGrants`]; routes recorded before this replica led are applied when it starts to.

pub mod metrics;
pub mod own_certs;
pub mod records;
pub mod refusals;
pub mod sink;
pub mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use xcc_controller::tasks::Spawner;
use xcc_controller::watch::{Change, Follow};
use xcc_proto::crd::{RemoteRegistry, RemoteRegistryStatus, Role, ServiceRecord};

use crate::catalog::{Catalog, ListFilter, ServiceEntry, Source};
use crate::federation::kube_grants::KubeGrants;
use crate::federation::link::ParentSpec;
use crate::hamlet::client::{RemoteSpec, entry_for};
use crate::metrics::Health;
use crate::peers::{PeerKind, PeerTable};
use crate::remotes::{ParentWanted, Remotes};
use crate::store::model::{self, export_entry};
pub use metrics::KubeMetrics;
pub use records::Owner;
pub use sink::{FIELD_MANAGER, KubeImportSink, Owners};
use status::{Link, Observed, Validity};

/// Name of the Lease the import half runs under.
pub const LEASE_NAME: &str = "xcc-registry";

/// `--store kube` settings.
#[derive(Clone)]
pub struct KubeConfig {
    pub client: Client,
    /// Run the import half only while holding the Lease [`LEASE_NAME`] in the namespace.
    pub leader_elect: bool,
    /// Status recomputation period (a safety net; changes are picked up as they happen).
    pub status_resync: Duration,
    /// The Pod this registry runs in, for Events about its own certificates
    /// ([`own_certs`]); from the downward API by default.
    pub pod: Option<own_certs::PodRef>,
}

impl KubeConfig {
    pub fn new(client: Client, leader_elect: bool) -> Self {
        Self {
            client,
            leader_elect,
            status_resync: Duration::from_secs(10),
            pod: own_certs::PodRef::from_env(),
        }
    }
}

impl std::fmt::Debug for KubeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeConfig")
            .field("leader_elect", &self.leader_elect)
            .field("status_resync", &self.status_resync)
            .field("pod", &self.pod)
            .finish_non_exhaustive()
    }
}

/// What the store's tasks share with the rest of the registry.
pub(crate) struct Parts {
    pub catalog: Catalog,
    pub cluster: String,
    pub namespace: String,
    pub health: Health,
    pub peers: PeerTable,
    pub remotes: Remotes,
    pub sink: std::sync::Arc<KubeImportSink>,
    pub owners: Owners,
    pub metrics: KubeMetrics,
    /// `--grant-mode` other than none: grant objects written while this replica leads.
    pub grants: Option<GrantWiring>,
    /// The policy ConfigMap watch's first list (readiness waits for it too).
    pub policy_synced: Option<watch::Receiver<bool>>,
    /// The RemoteRegistries' serverCAs, watched for their expiry.
    pub ca_expiry: crate::remote_ca::RemoteCaExpiry,
}

/// What the leader needs to write grant objects ([`KubeGrants`]).
pub(crate) struct GrantWiring {
    pub config: crate::federation::grants::GrantConfig,
    pub level: crate::federation::Level,
    pub metrics: crate::federation::kube_grants::GrantMetrics,
    pub store_errors: prometheus_client::metrics::counter::Counter,
}

impl GrantWiring {
    /// Start the grant writer under `token` (the leader's) and make it the level's grant sink.
    /// Routes recorded before (by a replica that did not lead yet) are applied now; one removed
    /// meanwhile is removed again, so the writer's last wish matches the level.
    fn start(&self, client: Client, token: CancellationToken) {
        use crate::federation::grants::GrantSink as _;
        let grants = KubeGrants::spawn_shared(
            client,
            self.config.clone(),
            crate::federation::kube_grants::DEFAULT_BACKOFF,
            self.metrics.clone(),
            self.store_errors.clone(),
            token,
        );
        self.level.set_grant_sink(grants.clone());
        let before = self.level.owner_routes();
        for r in &before {
            if let Err(e) = grants.apply(r) {
                warn!(error = %e, "cannot apply the objects of a grant");
            }
        }
        let now = self.level.owner_routes();
        let key = |r: &crate::federation::level::OwnerRoute| {
            (
                r.target_namespace.clone(),
                r.target_service.clone(),
                r.caller_cluster.clone(),
                r.caller_service.clone(),
            )
        };
        let still: BTreeSet<_> = now.iter().map(key).collect();
        for r in before.iter().filter(|r| !still.contains(&key(r))) {
            if let Err(e) = grants.remove(r) {
                warn!(error = %e, "cannot remove the objects of a revoked grant");
            }
        }
        info!(mode = ?self.config.mode, routes = now.len(), "grant writer started");
    }
}

/// Start both halves on `spawner`'s task set.
pub(crate) fn spawn(parts: Parts, config: KubeConfig, spawner: &Spawner) {
    let cancel = spawner.token().clone();
    let (listed_tx, listed) = watch::channel(false);
    let mut exports_listed = listed.clone();
    {
        let (client, catalog, cluster, c) = (
            config.client.clone(),
            parts.catalog.clone(),
            parts.cluster.clone(),
            cancel.clone(),
        );
        spawner.spawn("ServiceRecord export watch", async move {
            run_exports(client, catalog, cluster, listed_tx, c).await
        });
        // Ready once the exports were listed and the policy ConfigMap (if any) was read.
        let (health, policy, c) = (
            parts.health.clone(),
            parts.policy_synced.clone(),
            cancel.clone(),
        );
        spawner.spawn("kube store readiness", async move {
            let all = async {
                let mut listed = listed;
                listed.wait_for(|l| *l).await.ok()?;
                if let Some(mut p) = policy {
                    p.wait_for(|s| *s).await.ok()?;
                }
                Some(())
            };
            tokio::select! {
                _ = c.cancelled() => return Ok(()),
                r = all => if r.is_some() {
                    health.set_ready(true);
                    info!("ready: exports listed, policies read");
                },
            }
            c.cancelled().await;
            Ok(())
        });
    }
    {
        // The record cache the sink plans against (cheap; kept on every replica so a new
        // leader starts warm).
        let (sink, c) = (parts.sink.clone(), cancel.clone());
        spawner.spawn(
            "import record cache",
            async move { sink.run_cache(c).await },
        );
    }
    let leader = config
        .leader_elect
        .then(|| xcc_controller::leader::LeaderConfig::new(&parts.namespace, LEASE_NAME));
    let client = config.client.clone();
    spawner.spawn("kube import half", async move {
        xcc_controller::leader::run_as_leader(
            client,
            leader,
            cancel,
            |leading| info!(leading, "import half leadership"),
            move |token| async move {
                if let Some(g) = &parts.grants {
                    g.start(config.client.clone(), token.clone());
                }
                // The parent link's snapshot holds every export (else the parent drops those it
                // missed until they come, and refusals would be decided on a partial set).
                let listed = async { exports_listed.wait_for(|l| *l).await.is_ok() };
                tokio::select! {
                    _ = token.cancelled() => return Ok(()),
                    ok = listed => if !ok { return Ok(()) },
                }
                let refusals = refusals::run(
                    config.client.clone(),
                    parts.remotes.level().clone(),
                    parts.metrics.clone(),
                    token.clone(),
                );
                let mut ctl = Controller::new(parts, config);
                tokio::try_join!(ctl.run(token), refusals).map(|_| ())
            },
        )
        .await
    });
}

// ----- exports -----

async fn run_exports(
    client: Client,
    catalog: Catalog,
    cluster: String,
    listed: watch::Sender<bool>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let api: Api<ServiceRecord> = Api::all(client);
    let config = watcher::Config::default().labels(&records::export_selector());
    let mut exports = Follow::new("exported ServiceRecords", api, config);
    loop {
        let change = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            change = exports.next() => change,
        };
        let Some(change) = change else {
            anyhow::bail!("the ServiceRecord watch ended");
        };
        match change {
            Change::Listed(all) => {
                let entries = all
                    .iter()
                    .filter_map(|sr| export_or_last_good(&catalog, &cluster, sr))
                    .collect();
                let (up, rm) = catalog.replace_source(&Source::Local, entries);
                info!(
                    upserted = up,
                    removed = rm,
                    "exported ServiceRecords listed"
                );
                listed.send_replace(true);
            }
            Change::Applied(sr) => {
                if !records::is_export(&sr) {
                    remove_export(&catalog, &cluster, &sr);
                } else if let Some(entry) = export_or_last_good(&catalog, &cluster, &sr) {
                    catalog.upsert(entry);
                }
            }
            Change::Deleted(sr) => remove_export(&catalog, &cluster, &sr),
        }
    }
}

/// The record's catalog entry; for a record that cannot be mapped, the entry it had (if any).
fn export_or_last_good(
    catalog: &Catalog,
    cluster: &str,
    sr: &ServiceRecord,
) -> Option<ServiceEntry> {
    match export_entry(cluster, sr) {
        Ok(e) => Some(e),
        Err(error) => {
            let key = export_key(cluster, sr);
            warn!(record = %key, %error, "exported ServiceRecord rejected; keeping its last good content");
            catalog
                .get(&key)
                .filter(|e| e.source == Source::Local)
                .map(|e| (*e).clone())
        }
    }
}

fn export_key(cluster: &str, sr: &ServiceRecord) -> crate::catalog::ServiceKey {
    crate::catalog::ServiceKey::new(
        cluster,
        sr.namespace().unwrap_or_else(|| "default".into()),
        sr.name_any(),
    )
}

fn remove_export(catalog: &Catalog, cluster: &str, sr: &ServiceRecord) {
    let key = export_key(cluster, sr);
    if catalog.get(&key).is_some_and(|e| e.source == Source::Local) {
        catalog.remove(&key);
        debug!(record = %key, "export removed");
    }
}

// ----- RemoteRegistries -----

/// A RemoteRegistry as the controller classified it.
struct Classified {
    rr: RemoteRegistry,
    validity: Validity,
    /// Valid and in the namespace: what to run.
    run: Option<Wanted>,
}

enum Wanted {
    Peer(RemoteSpec),
    Parent(ParentSpec, Vec<crate::federation::Question>),
}

struct Controller {
    parts: Parts,
    config: KubeConfig,
    /// RemoteRegistries by (namespace, name).
    rrs: BTreeMap<(String, String), RemoteRegistry>,
    /// Statuses written whose own watch event has not arrived yet: the resourceVersion the write
    /// returned, and what was written. Events older than it still carry an older status; they
    /// must not make the next pass write the same status again.
    written: BTreeMap<(String, String), (String, RemoteRegistryStatus)>,
    /// Owners whose imports the registry handles now (name → UID).
    handled: BTreeMap<String, String>,
    /// Removing some retired owner's imports failed: reconcile again on the next tick.
    retry: bool,
}

fn validity_of(
    rr: &RemoteRegistry,
    namespace: &str,
    trust_domain: &str,
) -> (Validity, Option<Wanted>) {
    let invalid = |reason: &str, message: String| {
        (
            Validity::Invalid {
                reason: reason.into(),
                message,
            },
            None,
        )
    };
    let ns = rr.namespace().unwrap_or_default();
    if ns != namespace {
        return invalid(
            status::WRONG_NAMESPACE_REASON,
            format!(
                "RemoteRegistries are only read in namespace {namespace:?} (the registry's); this one is in {ns:?} and is ignored"
            ),
        );
    }
    let name = rr.name_any();
    if let Err(e) = xcc_proto::domains::validate_allowed_domains(
        &name,
        rr.spec.allowed_domains.as_deref().unwrap_or(&[]),
    ) {
        return invalid(xcc_proto::names::INVALID_DOMAIN_REASON, e.to_string());
    }
    let spec = match model::remote_spec(rr) {
        Ok(s) => s,
        Err(e) => return invalid(status::INVALID_SPEC_REASON, e.to_string()),
    };
    let wanted = match rr.spec.role() {
        Role::Peer => Wanted::Peer(spec),
        Role::Parent => Wanted::Parent(
            ParentSpec {
                name: spec.name,
                address: spec.address,
                server_name: spec.server_name,
                roots: spec.roots,
            },
            crate::remotes::hierarchy_imports(rr, trust_domain),
        ),
    };
    (Validity::Valid, Some(wanted))
}

impl Controller {
    fn new(parts: Parts, config: KubeConfig) -> Self {
        Self {
            parts,
            config,
            rrs: BTreeMap::new(),
            written: BTreeMap::new(),
            handled: BTreeMap::new(),
            retry: false,
        }
    }

    /// Take in a change of the RemoteRegistries; whether a spec changed (the clients follow the
    /// specs). A status this controller wrote is kept over an event older than the write.
    fn remote_registry_changed(&mut self, change: Change<RemoteRegistry>) -> bool {
        match change {
            Change::Listed(all) => {
                self.rrs = all.into_iter().map(|rr| (key(&rr), rr)).collect();
                // A fresh list is at least as new as every write that completed.
                self.written.clear();
                true
            }
            Change::Applied(mut rr) => {
                let k = key(&rr);
                let specs_changed = self
                    .rrs
                    .get(&k)
                    .is_none_or(|old| old.spec != rr.spec || old.metadata.uid != rr.metadata.uid);
                if let Some((rv, status)) = self.written.get(&k) {
                    if rr.metadata.resource_version.as_ref() == Some(rv) {
                        self.written.remove(&k);
                    } else {
                        // An event from before our last write: keep what we wrote.
                        rr.status = Some(status.clone());
                    }
                }
                self.rrs.insert(k, rr);
                specs_changed
            }
            Change::Deleted(rr) => {
                self.written.remove(&key(&rr));
                self.rrs.remove(&key(&rr));
                true
            }
        }
    }

    async fn run(&mut self, cancel: CancellationToken) -> anyhow::Result<()> {
        let api = self.remote_registries().await;
        let mut remote_registries =
            Follow::new("RemoteRegistries", api, watcher::Config::default());
        let mut peers = self.parts.peers.subscribe();
        // Hierarchy answers change the parent's status (imports, Synced).
        let mut answers = self.parts.remotes.level().subscribe();
        let mut tick = tokio::time::interval(self.config.status_resync);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut listed = false;
        loop {
            let mut specs_changed = false;
            tokio::select! {
                _ = cancel.cancelled() => break,
                change = remote_registries.next() => {
                    let Some(change) = change else { anyhow::bail!("the RemoteRegistry watch ended") };
                    listed |= matches!(change, Change::Listed(_));
                    specs_changed = self.remote_registry_changed(change);
                }
                r = peers.changed() => if r.is_err() { break },
                r = answers.changed() => if r.is_err() { break },
                _ = tick.tick() => {}
            }
            if !listed {
                continue;
            }
            let classified = self.classify();
            if specs_changed || self.retry {
                self.reconcile_clients(&classified).await;
            }
            self.write_statuses(&classified).await;
        }
        Ok(())
    }

    /// RemoteRegistries in every namespace (so those outside the registry's namespace can be
    /// reported), or only in the namespace when RBAC does not allow more.
    async fn remote_registries(&self) -> Api<RemoteRegistry> {
        let client = self.config.client.clone();
        let all: Api<RemoteRegistry> = Api::all(client.clone());
        match all.list(&kube::api::ListParams::default().limit(1)).await {
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(
                    namespace = %self.parts.namespace,
                    "not allowed to list RemoteRegistries in all namespaces; those outside the registry's namespace are not reported"
                );
                Api::namespaced(client, &self.parts.namespace)
            }
            _ => all,
        }
    }

    fn classify(&self) -> Vec<Classified> {
        let trust_domain = self.parts.remotes.level().trust_domain();
        let mut out: Vec<Classified> = self
            .rrs
            .values()
            .map(|rr| {
                let (validity, run) = validity_of(rr, &self.parts.namespace, &trust_domain);
                Classified {
                    rr: rr.clone(),
                    validity,
                    run,
                }
            })
            .collect();
        // One parent: the first by name; the others are reported.
        let mut first_parent: Option<String> = None;
        for c in &mut out {
            if matches!(c.run, Some(Wanted::Parent(..))) {
                match &first_parent {
                    None => first_parent = Some(c.rr.name_any()),
                    Some(p) => {
                        c.run = None;
                        c.validity = Validity::Invalid {
                            reason: status::SECOND_PARENT_REASON.into(),
                            message: format!(
                                "only one RemoteRegistry may have role Parent; {p} is the parent"
                            ),
                        };
                    }
                }
            }
        }
        out
    }

    /// Make the running clients and the parent link match the valid RemoteRegistries in the
    /// namespace; remove the imports of those that went away or became invalid.
    async fn reconcile_clients(&mut self, classified: &[Classified]) {
        let mut peers = vec![];
        let mut parent: ParentWanted = None;
        let mut wanted: BTreeMap<String, String> = BTreeMap::new();
        for c in classified {
            let Some(run) = &c.run else { continue };
            let name = c.rr.name_any();
            wanted.insert(name, c.rr.uid().unwrap_or_default());
            match run {
                Wanted::Peer(spec) => peers.push(spec.clone()),
                Wanted::Parent(spec, imports) => parent = Some((spec.clone(), imports.clone())),
            }
        }
        let (running, running_parent) = self.parts.remotes.running().await;
        // A RemoteRegistry re-created under the same name (new UID) restarts its client, so its
        // imports are written again with the new owner reference.
        let recreated: BTreeSet<String> = wanted
            .iter()
            .filter(|(n, uid)| self.handled.get(*n).is_some_and(|old| old != *uid))
            .map(|(n, _)| n.clone())
            .collect();
        // Retire what is no longer wanted (or re-created) first.
        let gone: Vec<(String, String)> = self
            .handled
            .iter()
            .filter(|(n, _)| !wanted.contains_key(*n) || recreated.contains(*n))
            .map(|(n, u)| (n.clone(), u.clone()))
            .collect();
        self.retry = false;
        if !gone.is_empty() {
            let keep_peers: Vec<RemoteSpec> = peers
                .iter()
                .filter(|s| !recreated.contains(&s.name) && running.contains(&s.name))
                .cloned()
                .collect();
            self.parts.remotes.reconcile(keep_peers).await;
            let keep_parent = parent.clone().filter(|(p, _)| {
                !recreated.contains(&p.name) && running_parent.as_ref() == Some(&p.name)
            });
            self.parts.remotes.reconcile_parent(keep_parent).await;
            for (name, uid) in gone {
                let owner = Owner { name, uid };
                self.parts.owners.remove(&owner.name);
                if recreated.contains(&owner.name) {
                    // Its records are taken over by the new RemoteRegistry (the restarted
                    // client re-applies them with the new owner reference); those it no longer
                    // imports still point at the old UID and go with it (garbage collection).
                    self.handled.remove(&owner.name);
                    continue;
                }
                match self.parts.sink.forget(&owner).await {
                    Ok(n) => {
                        info!(remote = %owner.name, removed = n, "RemoteRegistry gone or invalid; its imports were removed");
                        self.handled.remove(&owner.name);
                    }
                    Err(e) => {
                        warn!(remote = %owner.name, error = %format!("{e:#}"), "cannot remove the imports of a removed RemoteRegistry; retrying");
                        self.retry = true;
                    }
                }
            }
        }
        let (running, running_parent) = self.parts.remotes.running().await;
        // Owners first, so the sink can write as soon as a client starts; then start clients
        // from the imports already stored (so a restart resyncs without deleting and
        // re-creating anything).
        for (name, uid) in &wanted {
            let owner = Owner {
                name: name.clone(),
                uid: uid.clone(),
            };
            self.parts.owners.set(&owner);
            let is_parent = parent.as_ref().is_some_and(|(p, _)| &p.name == name);
            let starting = if is_parent {
                running_parent.as_ref() != Some(name)
            } else {
                !running.contains(name)
            };
            if starting && !is_parent {
                match self.parts.sink.load(&owner).await {
                    Ok(imports) => {
                        let entries = imports.iter().map(|i| entry_for(name, i)).collect();
                        self.parts
                            .catalog
                            .replace_source(&Source::Remote(name.clone()), entries);
                    }
                    Err(e) => {
                        warn!(remote = %name, error = %format!("{e:#}"), "cannot read stored imports")
                    }
                }
            }
            self.handled.insert(name.clone(), uid.clone());
        }
        self.parts.remotes.reconcile(peers).await;
        self.parts.remotes.reconcile_parent(parent).await;
    }

    async fn write_statuses(&mut self, classified: &[Classified]) {
        let stats = self.parts.peers.list();
        let mut total = 0;
        // Every pass (at least every status_resync): a CA entering its warning period is
        // noticed within one.
        let cas = self.parts.ca_expiry.observe(
            classified.iter().filter(|c| c.run.is_some()).map(|c| &c.rr),
            time::OffsetDateTime::now_utc(),
        );
        for c in classified {
            let name = c.rr.name_any();
            let ns = c.rr.namespace().unwrap_or_default();
            if let Some(e) = cas.expiring.get(&name).filter(|e| e.new) {
                let owner = Owner {
                    name: name.clone(),
                    uid: c.rr.uid().unwrap_or_default(),
                };
                let reason = expiring_reason(e);
                self.parts
                    .sink
                    .warn_event(&owner, reason, e.message(&name))
                    .await;
            }
            let rejections = self.parts.owners.rejections(&name);
            let obs = self.observe(c, &name, &stats, &rejections);
            total += obs.imported;
            let mut want = status::desired(c.rr.status.as_ref(), &obs, SystemTime::now());
            status::set_certificate_expiring(
                &mut want,
                c.rr.status.as_ref(),
                cas.expiring
                    .get(&name)
                    .map(|e| (expiring_reason(e), e.message(&name))),
                SystemTime::now(),
            );
            if c.run.is_some()
                && let Some(summary) = rejections.summary()
                && let Some(synced) = want
                    .conditions
                    .iter_mut()
                    .find(|c| c.type_ == xcc_proto::crd::CONDITION_SYNCED)
            {
                synced.message = format!("{}; {summary}", synced.message);
            }
            if c.rr.status.as_ref() == Some(&want) {
                continue;
            }
            self.apply_status(&ns, &name, want).await;
        }
        self.parts.metrics.imported_records.set(total as i64);
        self.parts
            .metrics
            .remote_registries
            .set(self.handled.len() as i64);
    }

    /// What the registry observes of the remote `c` (named `name`): its link from the peer
    /// table (`stats`), the imports it brought that have a record of ours (those `rejections`
    /// names do not count) and, for a parent, the hierarchy's answers.
    fn observe(
        &self,
        c: &Classified,
        name: &str,
        stats: &[std::sync::Arc<crate::peers::PeerStats>],
        rejections: &sink::Rejections,
    ) -> Observed {
        let link = match &c.run {
            Some(_) => stats
                .iter()
                .find(|p| p.kind == PeerKind::RemoteRegistry && p.name == name)
                .map(|p| Link {
                    state: p.state(),
                    last_error: p.last_error(),
                    connected_since: p.connected_since(),
                    last_sync: p.last_sync(),
                }),
            None => None,
        };
        let source = match &c.run {
            Some(Wanted::Parent(..)) => Source::Hierarchy(name.to_string()),
            _ => Source::Remote(name.to_string()),
        };
        // Imports without a record of ours (conflicts, invalid names) do not count.
        let imported = if c.run.is_some() {
            self.parts
                .catalog
                .list(&ListFilter {
                    source: Some(source),
                    ..Default::default()
                })
                .len()
                .saturating_sub(rejections.conflicts.len() + rejections.invalid.len())
        } else {
            0
        };
        let hierarchy = match &c.run {
            Some(Wanted::Parent(..)) => {
                let level = self.parts.remotes.level();
                let refused: Vec<_> = level.rejections().into_iter().map(|(_, r)| r).collect();
                Some(
                    level
                        .subscriptions()
                        .iter()
                        .map(|(t, svc, a)| status::import_status(t, svc, a.as_ref()))
                        .map(|i| refusals::import_status(level.cluster(), &refused, i))
                        .collect(),
                )
            }
            _ => None,
        };
        Observed {
            generation: c.rr.metadata.generation,
            validity: c.validity.clone(),
            link,
            imported,
            hierarchy,
        }
    }

    /// Write `want` as the status of RemoteRegistry `ns/name`, and remember it until the watch
    /// delivers it; a failure is logged and retried with the next pass.
    async fn apply_status(&mut self, ns: &str, name: &str, want: RemoteRegistryStatus) {
        let res = self.write_status(ns, name, &want).await;
        self.parts
            .metrics
            .reconciled(metrics::Target::RemoteRegistries, res.is_ok());
        match res {
            // Until the watch delivers it, compare against what was written.
            Ok(rv) => {
                self.parts.metrics.wrote(
                    metrics::Kind::RemoteRegistryStatus,
                    metrics::WriteVerb::Apply,
                );
                let k = (ns.to_string(), name.to_string());
                if let Some(rr) = self.rrs.get_mut(&k) {
                    rr.status = Some(want.clone());
                }
                if let Some(rv) = rv {
                    self.written.insert(k, (rv, want));
                }
            }
            Err(e) => {
                warn!(remote = %name, namespace = %ns, error = %format!("{e:#}"), "cannot write RemoteRegistry status; retrying later")
            }
        }
    }

    async fn write_status(
        &self,
        ns: &str,
        name: &str,
        status: &RemoteRegistryStatus,
    ) -> anyhow::Result<Option<String>> {
        let api: Api<RemoteRegistry> = Api::namespaced(self.config.client.clone(), ns);
        let body = serde_json::json!({
            "apiVersion": xcc_proto::names::API_VERSION,
            "kind": xcc_proto::names::REMOTE_REGISTRY_KIND,
            "metadata": {"name": name, "namespace": ns},
            "status": status,
        });
        let written = api
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .with_context(|| format!("writing the status of RemoteRegistry {ns}/{name}"))?;
        Ok(written.metadata.resource_version)
    }
}

/// The reason of the `CertificateExpiring` condition and Event for `e`.
fn expiring_reason(e: &crate::remote_ca::Expiring) -> &'static str {
    match e.state {
        xcc_certs::reload::Expiry::Expired => "ServerCAExpired",
        _ => "ServerCAExpiresSoon",
    }
}

fn key(rr: &RemoteRegistry) -> (String, String) {
    (rr.namespace().unwrap_or_default(), rr.name_any())
}
