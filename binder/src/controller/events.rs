//! Which keys a watch event concerns: imported records (both keys, and those they had before),
//! RemoteRegistries (a change of `spec.materialize`), the objects the binder manages (drift);
//! and [`follow`], which runs one watch with its mapping and reconciles every key after a relist.

use super::*;

/// Maps one watch's events to keys.
pub(super) trait OnEvent<K>: Send + 'static {
    fn on_event(&mut self, ctx: &Ctx, event: &watcher::Event<K>);
}

/// Imported records: both keys of the record, and the keys it had before (an FQDN or origin
/// change leaves a group that must be reconciled too).
#[derive(Default)]
pub(super) struct RecordEvents {
    last: HashMap<String, Vec<Key>>,
    listing: HashMap<String, Vec<Key>>,
    /// The watch of this cluster's own MCS exports ([`Ctx::local_keys`]).
    local: bool,
}

impl RecordEvents {
    /// The handler of the watch of this cluster's own MCS exports.
    pub(super) fn local() -> Self {
        RecordEvents {
            local: true,
            ..RecordEvents::default()
        }
    }

    fn keys(&self, ctx: &Ctx, r: &ServiceRecord) -> Vec<Key> {
        if self.local {
            ctx.local_keys(r)
        } else {
            keys::record_keys(r)
        }
    }
}

pub(super) fn uid_of<K: Resource>(o: &K) -> String {
    o.meta().uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            o.meta().namespace.as_deref().unwrap_or(""),
            o.meta().name.as_deref().unwrap_or("")
        )
    })
}

impl OnEvent<ServiceRecord> for RecordEvents {
    fn on_event(&mut self, ctx: &Ctx, event: &watcher::Event<ServiceRecord>) {
        match event {
            watcher::Event::Apply(r) => {
                let keys = self.keys(ctx, r);
                if let Some(old) = self.last.insert(uid_of(r), keys.clone()) {
                    ctx.queue.add_all(old);
                }
                ctx.queue.add_all(keys);
            }
            watcher::Event::Delete(r) => {
                lock(&ctx.propagated).remove(&uid_of(r));
                if let Some(old) = self.last.remove(&uid_of(r)) {
                    ctx.queue.add_all(old);
                }
                ctx.queue.add_all(self.keys(ctx, r));
            }
            watcher::Event::Init => self.listing.clear(),
            watcher::Event::InitApply(r) => {
                let keys = self.keys(ctx, r);
                self.listing.insert(uid_of(r), keys);
            }
            watcher::Event::InitDone => {
                let old = std::mem::replace(&mut self.last, std::mem::take(&mut self.listing));
                ctx.prune_propagated(&self.last);
                if ctx.listed_before() {
                    // Records deleted while the watch was down have no Delete event.
                    ctx.queue.add_all(old.into_values().flatten());
                }
            }
        }
    }
}

/// RemoteRegistries: a change of `spec.materialize` moves its records between keys.
#[derive(Default)]
pub(super) struct RegistryEvents(keys::Modes);

impl OnEvent<RemoteRegistry> for RegistryEvents {
    fn on_event(&mut self, ctx: &Ctx, event: &watcher::Event<RemoteRegistry>) {
        if let Some(name) = self.0.changed(event) {
            ctx.queue.add_all(
                ctx.records
                    .state()
                    .iter()
                    .filter(|r| keys::remote_registry(r) == Some(name.as_str()))
                    .flat_map(|r| keys::record_keys(r)),
            );
        }
    }
}

/// Objects the binder manages: drift (edits, deletions by someone else) reconciles their key.
pub(super) struct ManagedEvents;

pub(super) trait Managed: Resource<DynamicType = ()> + Clone {
    fn key(&self, ctx: &Ctx) -> Option<Key>;
}

impl Managed for Service {
    fn key(&self, ctx: &Ctx) -> Option<Key> {
        keys::service_key(self, &ctx.config.namespace)
    }
}

impl Managed for EndpointSlice {
    fn key(&self, ctx: &Ctx) -> Option<Key> {
        ctx.key_of_service_name(
            self.metadata.namespace.as_deref()?,
            keys::slice_service_name(&self.metadata)?,
        )
    }
}

impl Managed for Endpoints {
    fn key(&self, ctx: &Ctx) -> Option<Key> {
        ctx.key_of_service_name(
            self.metadata.namespace.as_deref()?,
            self.metadata.name.as_deref()?,
        )
    }
}

impl<K: Managed + Send + Sync + 'static> OnEvent<K> for ManagedEvents {
    fn on_event(&mut self, ctx: &Ctx, event: &watcher::Event<K>) {
        if let watcher::Event::Apply(o) | watcher::Event::Delete(o) = event
            && let Some(key) = o.key(ctx)
        {
            ctx.queue.add(key);
        }
    }
}

/// Run one reflector-backed watch until `stop` ([`watch::follow`]), mapping events to keys.
/// After a relist (every listing but the first) all keys are reconciled again.
pub(super) async fn follow<K, H>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    ctx: Arc<Ctx>,
    stop: CancellationToken,
    mut handler: H,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    H: OnEvent<K>,
{
    let kind = K::kind(&()).to_string();
    let mut listed = false;
    watch::follow(&kind, watch::watch(api, config), writer, stop, |event| {
        handler.on_event(&ctx, event);
        if matches!(event, watcher::Event::InitDone) {
            if listed {
                tracing::info!(%kind, "relisted; reconciling every key");
                if ctx.listed_before() {
                    ctx.queue.add_all(ctx.all_keys());
                }
                // Counted after the keys are queued, so a test that saw the count and then an
                // idle queue knows the relist was handled.
                ctx.relists.fetch_add(1, Ordering::SeqCst);
                ctx.metrics.relisted();
            }
            listed = true;
        }
    })
    .await;
}
