//! Following one Kubernetes watch: the loop every xcc watch runs, in two shapes.
//!
//! - Into a reflector store ([`follow`]): each event is applied to the store first and then
//!   handed to the caller, who maps it to work (reconcile keys, a wake-up).
//! - As changes ([`Follow`]): the objects of a (re)list handed over at once when it is complete
//!   ([`Change::Listed`]), then each object applied or deleted; for a caller that keeps its own
//!   view (the catalog, a DNS index, the policy in force) or waits on other things too.
//!
//! Either way a watch error is logged and the watcher retries with its backoff; the loop ends
//! when the process stops or the stream ends (which the caller or the task supervisor reports,
//! naming the watch).

use std::fmt::Debug;

use futures::stream::{BoxStream, Fuse};
use futures::{FutureExt as _, Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// The watch of `api` as `config` selects, retried with the watcher's default backoff.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher::watcher(api, config).default_backoff()
}

/// Drive `stream` into its store (`writer`), calling `on_event` after each event is applied;
/// returns when `stop` fires or the stream ends. `what` names the watch in the log.
pub async fn follow<K, F>(
    what: &str,
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    mut writer: Writer<K>,
    stop: CancellationToken,
    mut on_event: F,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
    F: FnMut(&Event<K>),
{
    tokio::pin!(stream);
    loop {
        let next = tokio::select! {
            next = stream.next() => next,
            _ = stop.cancelled() => return,
        };
        match next {
            Some(Ok(event)) => {
                writer.apply_watcher_event(&event);
                on_event(&event);
            }
            Some(Err(e)) => log_error(what, &e),
            None => return,
        }
    }
}

/// A watch error: logged, and passed over (the watcher retries with its backoff).
fn log_error(what: &str, e: &watcher::Error) {
    tracing::warn!(watch = what, error = %e, "watch failed; retrying");
}

/// What a watch changed, for a caller that keeps its own view of the objects.
#[derive(Clone, Debug, PartialEq)]
pub enum Change<K> {
    /// The complete list of a (re)list: every object the view holds; any other is gone.
    Listed(Vec<K>),
    /// An object was created or changed.
    Applied(K),
    /// An object was deleted.
    Deleted(K),
}

/// Watcher events turned into [`Change`]s: the objects of a (re)list are collected and handed
/// over once the list is complete; errors are logged and passed over.
#[derive(Debug)]
pub struct Changes<K> {
    what: String,
    listing: Vec<K>,
}

impl<K> Changes<K> {
    /// `what` names the watch in the log.
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            listing: Vec::new(),
        }
    }

    /// The change `event` completes, if any.
    pub fn on_event(&mut self, event: Result<Event<K>, watcher::Error>) -> Option<Change<K>> {
        match event {
            Ok(Event::Init) => {
                self.listing.clear();
                None
            }
            Ok(Event::InitApply(o)) => {
                self.listing.push(o);
                None
            }
            Ok(Event::InitDone) => Some(Change::Listed(std::mem::take(&mut self.listing))),
            Ok(Event::Apply(o)) => Some(Change::Applied(o)),
            Ok(Event::Delete(o)) => Some(Change::Deleted(o)),
            Err(e) => {
                log_error(&self.what, &e);
                None
            }
        }
    }
}

/// One watch followed as [`Change`]s. [`Follow::next`] and [`Follow::next_ready`] are
/// cancel-safe (a change is never half taken), so a caller can wait on them in a `select!`
/// beside its other wake-ups.
pub struct Follow<K> {
    stream: Fuse<BoxStream<'static, Result<Event<K>, watcher::Error>>>,
    changes: Changes<K>,
}

impl<K> Follow<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    /// Follow the watch of `api` as `config` selects ([`watch`]); `what` names it in the log.
    pub fn new(what: impl Into<String>, api: Api<K>, config: watcher::Config) -> Self {
        Self::of_stream(what, watch(api, config))
    }
}

impl<K: Send + 'static> Follow<K> {
    /// Follow `stream` (watcher events); `what` names it in the log.
    pub fn of_stream(
        what: impl Into<String>,
        stream: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    ) -> Self {
        Self {
            stream: stream.boxed().fuse(),
            changes: Changes::new(what),
        }
    }

    /// The next change; None once the watch has ended.
    pub async fn next(&mut self) -> Option<Change<K>> {
        loop {
            let event = self.stream.next().await?;
            if let Some(change) = self.changes.on_event(event) {
                return Some(change);
            }
        }
    }

    /// The changes of the events ready now, waiting for the first event (at most `max` events
    /// read, so a burst is applied in bounded batches); None once the watch has ended. The list
    /// may be empty (events that only continue a relist).
    pub async fn next_ready(&mut self, max: usize) -> Option<Vec<Change<K>>> {
        let first = self.stream.next().await?;
        let mut changes: Vec<Change<K>> = self.changes.on_event(first).into_iter().collect();
        for _ in 1..max {
            match self.stream.next().now_or_never() {
                Some(Some(event)) => changes.extend(self.changes.on_event(event)),
                // Ended (reported by the next call) or nothing ready.
                Some(None) | None => break,
            }
        }
        Some(changes)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector;

    use super::*;

    fn map(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    /// Every event reaches the store before the caller sees it, errors included in the
    /// sequence do not stop the watch, and the end of the stream ends the loop.
    #[tokio::test]
    async fn events_reach_the_store_before_the_caller_and_errors_are_passed_over() {
        let (store, writer) = reflector::store::<ConfigMap>();
        let events = futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply(map("a"))),
            Ok(Event::InitApply(map("b"))),
            Ok(Event::InitDone),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::Delete(map("a"))),
        ]);
        let mut seen = Vec::new();
        let view = store.clone();
        follow(
            "configmaps",
            events,
            writer,
            CancellationToken::new(),
            |e| {
                let listed: Vec<String> = view
                    .state()
                    .iter()
                    .map(|m| m.metadata.name.clone().unwrap())
                    .collect();
                let what = match e {
                    Event::Init => "init",
                    Event::InitApply(_) => "init-apply",
                    Event::InitDone => "init-done",
                    Event::Apply(_) => "apply",
                    Event::Delete(_) => "delete",
                };
                let mut listed = listed;
                listed.sort();
                seen.push((what, listed));
            },
        )
        .await;
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            seen,
            vec![
                ("init", names(&[])),
                ("init-apply", names(&[])),
                ("init-apply", names(&[])),
                ("init-done", names(&["a", "b"])),
                ("delete", names(&["b"])),
            ]
        );
        assert_eq!(store.state().len(), 1);
    }

    /// A relist is handed over complete, once, and replaces what came before; applies and
    /// deletes pass one by one; errors are passed over; the end of the stream is None.
    #[tokio::test]
    async fn changes_hand_over_whole_lists_and_single_objects() {
        let events = futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply(map("a"))),
            Err(watcher::Error::NoResourceVersion),
            Ok(Event::InitApply(map("b"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(map("c"))),
            Ok(Event::Delete(map("a"))),
            // A relist that starts over: what the first, broken one collected is dropped.
            Ok(Event::Init),
            Ok(Event::InitApply(map("x"))),
            Ok(Event::Init),
            Ok(Event::InitApply(map("c"))),
            Ok(Event::InitDone),
        ]);
        let mut follow = Follow::of_stream("configmaps", events);
        assert_eq!(
            follow.next().await,
            Some(Change::Listed(vec![map("a"), map("b")]))
        );
        assert_eq!(follow.next().await, Some(Change::Applied(map("c"))));
        assert_eq!(follow.next().await, Some(Change::Deleted(map("a"))));
        assert_eq!(follow.next().await, Some(Change::Listed(vec![map("c")])));
        assert_eq!(follow.next().await, None);
        assert_eq!(follow.next().await, None);
    }

    /// `next_ready` takes the events ready now, at most `max`, and the changes they complete.
    #[tokio::test]
    async fn ready_changes_come_in_bounded_batches() {
        let events = futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply(map("a"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(map("b"))),
            Ok(Event::Delete(map("a"))),
        ]);
        let mut follow = Follow::of_stream("configmaps", events);
        assert_eq!(follow.next_ready(2).await, Some(vec![]));
        assert_eq!(
            follow.next_ready(2).await,
            Some(vec![
                Change::Listed(vec![map("a")]),
                Change::Applied(map("b"))
            ])
        );
        assert_eq!(
            follow.next_ready(2).await,
            Some(vec![Change::Deleted(map("a"))])
        );
        assert_eq!(follow.next_ready(2).await, None);
    }

    /// A watch still open when `stop` fires ends without another event.
    #[tokio::test]
    async fn an_open_watch_ends_when_stopped() {
        let (_, writer) = reflector::store::<ConfigMap>();
        let stop = CancellationToken::new();
        stop.cancel();
        let calls = AtomicUsize::new(0);
        follow(
            "configmaps",
            futures::stream::pending(),
            writer,
            stop,
            |_| {
                calls.fetch_add(1, Ordering::Relaxed);
            },
        )
        .await;
        assert_eq!(calls.load(Ordering::Relaxed), 0);
    }
}
