//! One registry read through its admin API: the catalog from `Watch` (a snapshot, then live
//! events), the tree, peers and grants re-read after catalog changes (at most every
//! [`MIN_REFRESH_GAP`]) and every `--refresh-seconds` (the admin API has no watch for them).
//! Every change is written into the model and announced on `changed`. A failure is shown on the
//! page and retried with a capped backoff; what was read before stays shown, marked stale.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use xcc_proto::xcc::admin::v1 as api;

use super::model::{self, Model, RegistryView, Status};

type Client = api::admin_client::AdminClient<tonic::transport::Channel>;

/// The shortest pause between two re-reads of the tree, peers and grants after catalog
/// changes: a burst of exports costs one re-read, not one per export.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(250);
/// Each re-read's deadline: a registry that accepts the call and never answers is a failure.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Retry delays after a failure: from the first to the cap, doubling.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(10);

pub struct Source {
    /// This registry's place in the model.
    pub index: usize,
    pub addr: String,
    pub server_name: Option<String>,
    pub tls: xcc_certs::reload::ReloadingTls,
    pub refresh: Duration,
    pub model: Arc<Mutex<Model>>,
    pub changed: Arc<tokio::sync::Notify>,
}

impl Source {
    fn update(&self, f: impl FnOnce(&mut RegistryView)) {
        if let Some(view) = model::lock(&self.model).registries.get_mut(self.index) {
            f(view);
        }
        self.changed.notify_one();
    }
}

/// Read the registry until `cancel`, reconnecting after failures.
pub async fn run(source: Source, cancel: CancellationToken) {
    let mut retry = RETRY_FIRST;
    loop {
        let result = session(&source, &cancel, &mut retry).await;
        if cancel.is_cancelled() {
            return;
        }
        let message = match result {
            Ok(()) => "the registry closed the watch stream".to_string(),
            Err(e) => format!("{:#}", xcc_registry::admin::call_error(e, &source.addr)),
        };
        tracing::warn!(addr = %source.addr, error = %message, "dashboard: reading the registry failed; retrying");
        source.update(|v| v.status = Status::Failed(message));
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(RETRY_MAX);
    }
}

/// One connection: Ok when the registry ended the stream, Err on a failure.
async fn session(
    source: &Source,
    cancel: &CancellationToken,
    retry: &mut Duration,
) -> anyhow::Result<()> {
    let mut client =
        xcc_registry::admin::connect(source.tls.clone(), &source.addr, source.server_name.clone())
            .await?;
    refresh(source, &mut client).await?;
    let mut stream = watch(source, &mut client).await?;
    let mut refreshed = Instant::now();
    let mut dirty = false;
    let mut tick = tokio::time::interval_at(Instant::now() + source.refresh, source.refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            message = stream.message() => {
                let Some(event) = message? else { return Ok(()) };
                use api::catalog_event::Kind;
                let now = SystemTime::now();
                match Kind::try_from(event.kind) {
                    Ok(Kind::Upsert) => {
                        if let Some(s) = event.service {
                            source.update(|v| v.upsert(s, now));
                        }
                    }
                    Ok(Kind::Delete) => {
                        if let Some(s) = event.service {
                            source.update(|v| v.delete(&s));
                        }
                    }
                    Ok(Kind::SnapshotComplete) => {
                        source.update(|v| v.snapshot_complete(now));
                        // Live again: the next failure starts its retries from the first delay.
                        *retry = RETRY_FIRST;
                    }
                    // The watch fell behind: start over with a fresh snapshot.
                    Ok(Kind::Resync) => stream = watch(source, &mut client).await?,
                    // A kind this build does not know: nothing to draw.
                    Ok(Kind::Unspecified) | Err(_) => {}
                }
                dirty = true;
            }
            _ = tokio::time::sleep_until(refreshed + MIN_REFRESH_GAP), if dirty => {
                refresh(source, &mut client).await?;
                (refreshed, dirty) = (Instant::now(), false);
            }
            _ = tick.tick() => {
                refresh(source, &mut client).await?;
                (refreshed, dirty) = (Instant::now(), false);
            }
        }
    }
}

async fn watch(
    source: &Source,
    client: &mut Client,
) -> anyhow::Result<tonic::Streaming<api::CatalogEvent>> {
    let stream = client
        .watch(api::WatchRequest { snapshot: true })
        .await?
        .into_inner();
    source.update(RegistryView::begin_snapshot);
    Ok(stream)
}

/// Re-read the tree, the peers and the grants.
async fn refresh(source: &Source, client: &mut Client) -> anyhow::Result<()> {
    let read = async {
        let tree = client.get_tree(api::GetTreeRequest {}).await?.into_inner();
        let peers = client
            .list_peers(api::ListPeersRequest {})
            .await?
            .into_inner()
            .peers;
        let routes = client
            .list_routes(api::ListRoutesRequest {})
            .await?
            .into_inner()
            .routes;
        Ok::<_, tonic::Status>((tree, peers, routes))
    };
    let (tree, peers, routes) =
        tokio::time::timeout(CALL_TIMEOUT, read)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "the admin API did not answer within {} s",
                    CALL_TIMEOUT.as_secs()
                )
            })??;
    let now = SystemTime::now();
    source.update(|v| {
        v.tree = Some(tree);
        v.peers = peers;
        v.routes = routes;
        v.read_at = Some(now);
    });
    Ok(())
}
