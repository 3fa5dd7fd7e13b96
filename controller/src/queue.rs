//! A work queue of reconcile keys, in the manner of client-go's: a key is queued at most once,
//! never handed to two workers at the same time (a key added while it is being worked on is
//! queued again when that work is done), and failed keys come back after a per-key exponential
//! backoff. Shared by the publisher and the binder.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::backoff::Delays;

pub use crate::backoff::Backoff;

/// Retry delays of failed keys unless the caller says otherwise: 250 ms after the first failure,
/// doubled per further failure, at most 5 minutes.
pub const DEFAULT_BACKOFF: Backoff = Backoff {
    min: Duration::from_millis(250),
    max: Duration::from_secs(300),
};

struct Inner<K> {
    order: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    dirty: HashSet<K>,
    /// Retry delays of the keys that failed last time.
    failures: HashMap<K, Delays>,
    /// Retries scheduled and not yet due.
    waiting: usize,
}

/// The queue. Share it behind an `Arc`.
pub struct Queue<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
    backoff: Backoff,
    /// Keys queued or being worked on, when exported as a metric.
    depth: Option<Gauge>,
}

impl<K: Clone + Eq + Hash> Default for Queue<K> {
    fn default() -> Self {
        Self::new(DEFAULT_BACKOFF, None)
    }
}

impl<K: Clone + Eq + Hash> Queue<K> {
    /// A queue retrying failed keys after `backoff`, reporting its depth to `depth`.
    pub fn new(backoff: Backoff, depth: Option<Gauge>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                order: VecDeque::new(),
                queued: HashSet::new(),
                active: HashSet::new(),
                dirty: HashSet::new(),
                failures: HashMap::new(),
                waiting: 0,
            }),
            notify: Notify::new(),
            backoff,
            depth,
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Queue<K> {
    fn lock(&self) -> MutexGuard<'_, Inner<K>> {
        crate::plumbing::lock(&self.inner)
    }

    fn set_depth(&self, inner: &Inner<K>) {
        if let Some(depth) = &self.depth {
            depth.set((inner.order.len() + inner.active.len()) as i64);
        }
    }

    /// Queue `key` unless it is queued already; a key being worked on is queued again once
    /// that work is done.
    pub fn add(&self, key: K) {
        let mut inner = self.lock();
        if inner.queued.contains(&key) {
            return;
        }
        if inner.active.contains(&key) {
            inner.dirty.insert(key);
            return;
        }
        inner.queued.insert(key.clone());
        inner.order.push_back(key);
        self.set_depth(&inner);
        drop(inner);
        self.notify.notify_one();
    }

    /// Queue every key of `keys`.
    pub fn add_all(&self, keys: impl IntoIterator<Item = K>) {
        for key in keys {
            self.add(key);
        }
    }

    /// The next key to work on, marked active; `None` once `cancel` fires.
    pub async fn next(&self, cancel: &CancellationToken) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                if let Some(key) = inner.order.pop_front() {
                    inner.queued.remove(&key);
                    inner.active.insert(key.clone());
                    let more = !inner.order.is_empty();
                    drop(inner);
                    if more {
                        // Wake another worker for the rest.
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = &mut notified => {}
            }
        }
    }

    /// Work on `key` finished. A failed key is queued again after its backoff (unless `cancel`
    /// fires first); the delay is returned. A key added while it was active is queued now.
    pub fn done(
        self: &std::sync::Arc<Self>,
        key: K,
        ok: bool,
        cancel: &CancellationToken,
    ) -> Option<Duration> {
        let mut inner = self.lock();
        inner.active.remove(&key);
        self.set_depth(&inner);
        let requeue = inner.dirty.remove(&key);
        let delay = if ok {
            inner.failures.remove(&key);
            None
        } else {
            let backoff = &self.backoff;
            let delays = inner
                .failures
                .entry(key.clone())
                .or_insert_with(|| backoff.delays());
            Some(delays.next_delay())
        };
        if delay.is_some() && !requeue {
            inner.waiting += 1;
        }
        drop(inner);
        if requeue {
            self.add(key);
        } else if let Some(delay) = delay {
            let queue = self.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tokio::time::sleep(delay) => queue.add(key.clone()),
                }
                queue.lock().waiting -= 1;
            });
        }
        delay
    }

    /// Nothing queued, nothing being worked on and no retry pending.
    pub fn is_idle(&self) -> bool {
        let inner = self.lock();
        inner.order.is_empty() && inner.active.is_empty() && inner.waiting == 0
    }

    /// Keys queued (not counting active ones).
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// Whether no key is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn dedups_and_never_hands_out_an_active_key_twice() {
        let q: Arc<Queue<&str>> = Arc::default();
        let cancel = CancellationToken::new();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next(&cancel).await, Some("a"));
        q.add("a"); // while active: remembered, not queued
        assert_eq!(q.len(), 1);
        assert_eq!(q.next(&cancel).await, Some("b"));
        assert!(q.is_empty());
        assert_eq!(q.done("a", true, &cancel), None);
        assert_eq!(q.len(), 1, "re-added once done");
        assert_eq!(q.next(&cancel).await, Some("a"));
        q.done("a", true, &cancel);
        q.done("b", true, &cancel);
        assert!(q.is_idle());
        cancel.cancel();
        assert_eq!(q.next(&cancel).await, None);
    }

    #[tokio::test]
    async fn failures_back_off_per_key() {
        let q: Arc<Queue<&str>> = Arc::default();
        let cancel = CancellationToken::new();
        q.add("a");
        let key = q.next(&cancel).await.unwrap();
        assert_eq!(
            q.done(key, false, &cancel),
            Some(Duration::from_millis(250))
        );
        assert!(!q.is_idle(), "a retry is pending");
        // A key added while active after a failure is queued at once.
        q.add("b");
        let key = q.next(&cancel).await.unwrap();
        q.add("b");
        assert_eq!(
            q.done(key, false, &cancel),
            Some(Duration::from_millis(250))
        );
        assert_eq!(q.len(), 1);
        // Its second failure in a row waits twice as long.
        let key = q.next(&cancel).await.unwrap();
        assert_eq!(
            q.done(key, false, &cancel),
            Some(Duration::from_millis(500))
        );
        cancel.cancel();
    }

    /// A failed key comes back when its retry delay has passed, not a tick before; on paused
    /// time, so the delay is exact and costs no wall-clock time.
    #[tokio::test(start_paused = true)]
    async fn a_failed_key_is_queued_again_when_its_delay_has_passed() {
        let q: Arc<Queue<&str>> = Arc::default();
        let cancel = CancellationToken::new();
        q.add("a");
        let key = q.next(&cancel).await.unwrap();
        let start = tokio::time::Instant::now();
        let delay = q.done(key, false, &cancel).expect("a retry delay");
        let early = tokio::time::timeout(delay - Duration::from_millis(1), q.next(&cancel)).await;
        assert!(early.is_err(), "queued before its delay");
        assert!(!q.is_idle(), "the retry is pending");
        assert_eq!(q.next(&cancel).await, Some("a"));
        assert_eq!(start.elapsed(), delay);
        q.done("a", true, &cancel);
        assert!(q.is_idle());
    }

    /// Cancelling drops a pending retry: the key never comes back and the queue is idle.
    #[tokio::test(start_paused = true)]
    async fn cancelling_drops_a_pending_retry() {
        let q: Arc<Queue<&str>> = Arc::default();
        let cancel = CancellationToken::new();
        q.add("a");
        let key = q.next(&cancel).await.unwrap();
        let delay = q.done(key, false, &cancel).expect("a retry delay");
        cancel.cancel();
        tokio::time::sleep(delay * 2).await;
        assert!(q.is_empty(), "a cancelled retry queued its key");
        assert!(q.is_idle());
    }

    #[tokio::test]
    async fn depth_counts_queued_and_active_keys() {
        let depth = Gauge::default();
        let q: Arc<Queue<&str>> = Arc::new(Queue::new(DEFAULT_BACKOFF, Some(depth.clone())));
        let cancel = CancellationToken::new();
        q.add("a");
        q.add("b");
        assert_eq!(depth.get(), 2);
        let key = q.next(&cancel).await.unwrap();
        assert_eq!(depth.get(), 2, "an active key still counts");
        q.done(key, true, &cancel);
        assert_eq!(depth.get(), 1);
    }
}
