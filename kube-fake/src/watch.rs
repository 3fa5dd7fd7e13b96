//! WATCH streams: one task per watch request reads the store's event history from the requested
//! resourceVersion, filters it by resource, namespace and selectors (an object moving out of a
//! selector is DELETED for that watcher, moving in is ADDED), and writes newline-delimited JSON
//! events to the response body. It wakes when the store's resourceVersion changes (it sends no
//! BOOKMARKs, which a real server may also omit), ends with an ERROR 410
//! Gone (reason Expired) when its position falls out of the retained history, and stops at
//! `timeoutSeconds`, client disconnect, or server shutdown.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::Shared;
use crate::resources::Resource;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Event, EventType, present};

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// Synthetic ADDED events for the current state, then changes (resourceVersion unset or "0").
    Current,
    /// Changes after this resourceVersion.
    After(u64),
}

/// A parsed watch request.
pub(crate) struct WatchSpec {
    pub res: Arc<Resource>,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub start: Start,
    pub timeout: Duration,
}

impl WatchSpec {
    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The event this watcher sees for a stored change, if any.
    fn filter(&self, ev: &Event) -> Option<(&'static str, Value)> {
        if ev.group != self.res.spec.group || ev.plural != self.res.spec.plural {
            return None;
        }
        if self
            .namespace
            .as_ref()
            .is_some_and(|ns| *ns != ev.namespace)
        {
            return None;
        }
        let now = self.matches(&ev.object);
        let before = ev.prev.as_ref().is_some_and(|p| self.matches(p));
        match ev.ty {
            EventType::Added => now.then(|| ("ADDED", self.show(&ev.object))),
            EventType::Deleted => now.then(|| ("DELETED", self.show(&ev.object))),
            EventType::Modified => match (now, before) {
                (true, true) => Some(("MODIFIED", self.show(&ev.object))),
                (true, false) => Some(("ADDED", self.show(&ev.object))),
                (false, true) => {
                    // Leaving the selector: the previous state, at this event's version.
                    let mut prev = self.show(ev.prev.as_deref().unwrap_or(&ev.object));
                    prev["metadata"]["resourceVersion"] = ev.rv.to_string().into();
                    Some(("DELETED", prev))
                }
                (false, false) => None,
            },
        }
    }

    fn show(&self, obj: &Value) -> Value {
        present(obj, &self.res)
    }
}

fn line(ty: &str, object: Value) -> Bytes {
    let mut s = json!({"type": ty, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

/// Validates the start position and returns the streaming response body.
pub(crate) fn start(shared: Arc<Shared>, spec: WatchSpec) -> Result<Body, ApiError> {
    let (pos, initial) = {
        let store = shared.lock();
        let current = store.resource_version();
        match spec.start {
            Start::After(rv) if rv > current => {
                return Err(ApiError::too_large_resource_version(rv, current));
            }
            Start::After(rv) => (rv, Vec::new()),
            Start::Current => {
                let objs: Vec<Value> = store
                    .list(&spec.res, spec.namespace.as_deref())
                    .filter(|(_, o)| spec.matches(o))
                    .map(|(_, o)| spec.show(o))
                    .collect();
                (current, objs)
            }
        }
    };
    // Subscribe before answering, so nothing signalled after the response starts is missed.
    let changes = shared.changes.subscribe();
    // Small buffer: a slow reader blocks its own task, and falls behind the history if it lags.
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(run(shared, spec, tx, pos, initial, changes));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Ok(Body::from_stream(stream))
}

async fn run(
    shared: Arc<Shared>,
    spec: WatchSpec,
    tx: mpsc::Sender<Bytes>,
    mut pos: u64,
    initial: Vec<Value>,
    mut changes: tokio::sync::watch::Receiver<u64>,
) {
    for obj in initial {
        if tx.send(line("ADDED", obj)).await.is_err() {
            return;
        }
    }
    let deadline = tokio::time::sleep(spec.timeout);
    tokio::pin!(deadline);
    let cancel = shared.shutdown.clone();
    loop {
        changes.borrow_and_update();
        let drained = {
            let store = shared.lock();
            store
                .events_since(pos)
                .map(|evs| (evs, store.resource_version()))
        };
        match drained {
            Err(expired) => {
                let status = ApiError::gone(format!(
                    "too old resource version: {} ({})",
                    expired.requested, expired.oldest
                ));
                let _ = tx.send(line("ERROR", status.to_status())).await;
                return;
            }
            Ok((events, now)) => {
                for ev in &events {
                    if let Some((ty, obj)) = spec.filter(ev)
                        && tx.send(line(ty, obj)).await.is_err()
                    {
                        return;
                    }
                }
                pos = now;
            }
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = &mut deadline => return,
            _ = tx.closed() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}
