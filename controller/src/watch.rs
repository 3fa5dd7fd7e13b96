//! Following one Kubernetes watch into its reflector store: the loop every controller's watch
//! runs. Each event is applied to the store first and then handed to the caller, who maps it to
//! work (reconcile keys, a wake-up); a watch error is logged and the watcher retries with its
//! backoff; the loop ends when the process stops or the stream ends (which the task supervisor
//! reports, naming the watch).

use std::fmt::Debug;

use futures::{Stream, StreamExt};
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
            Some(Err(e)) => tracing::warn!(watch = what, error = %e, "watch failed; retrying"),
            None => return,
        }
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
