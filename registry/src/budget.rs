//! Byte budgets for what is queued per peer. A queue bounded only in messages lets one peer
//! pin as many bytes as its messages can carry (8,192 answers of 1 MiB each); every per-peer
//! queue is therefore bounded in messages *and* in encoded bytes.
//!
//! * [`ByteBudget`] hands out a [`Charge`] per queued item; the charge returns its bytes when
//!   it is dropped, wherever that happens (the item was sent, or the queue was dropped with the
//!   peer's session), so the accounting goes back to zero by construction when a peer leaves.
//!   [`ByteBudget::try_charge`] refuses what does not fit (the caller cuts the peer);
//!   [`ByteBudget::charge`] waits for room (back-pressure, for streams that can wait).
//! * [`queue`] is a bounded channel charged against both budgets, for the federation sessions.
//!
//! An item larger than the whole budget is charged the whole budget: it fits alone in an empty
//! queue, so a legitimate large message is never refused by a budget smaller than it.

use std::sync::Arc;
use std::task::{Context, Poll};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};

/// The two bounds of one per-peer queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    /// Queued messages (at least 1).
    pub messages: usize,
    /// Encoded bytes of the queued messages (at least 1).
    pub bytes: usize,
}

impl QueueLimits {
    /// The federation's default per-peer budget: 8,192 messages (a burst of small answers and
    /// route notifications) and 4 MiB (four of the largest entries a peer may send, see
    /// `federation::session::ENTRY_LIMIT`; 100 children that all stop reading pin at most
    /// 400 MiB of queues).
    pub const FEDERATION: Self = Self {
        messages: 8192,
        bytes: 4 * 1024 * 1024,
    };

    pub fn new(messages: usize, bytes: usize) -> Self {
        Self { messages, bytes }
    }
}

impl Default for QueueLimits {
    fn default() -> Self {
        Self::FEDERATION
    }
}

impl std::fmt::Display for QueueLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} messages, {} bytes", self.messages, self.bytes)
    }
}

/// A budget of bytes shared by the items of one queue; clones share it.
#[derive(Clone, Debug)]
pub struct ByteBudget {
    limit: usize,
    room: Arc<Semaphore>,
    /// Woken whenever a charge returns its bytes ([`ByteBudget::below`]).
    freed: Arc<Notify>,
    /// Bytes charged, summed over every budget given the same gauge.
    gauge: Option<Gauge>,
}

/// The bytes of one queued item, returned to their [`ByteBudget`] (and gauge) on drop.
#[derive(Debug)]
pub struct Charge {
    permit: Option<OwnedSemaphorePermit>,
    bytes: usize,
    gauge: Option<Gauge>,
    freed: Arc<Notify>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        // Return the bytes before waking whoever waits for them.
        drop(self.permit.take());
        self.freed.notify_waiters();
        if let Some(g) = &self.gauge {
            g.dec_by(i64::try_from(self.bytes).unwrap_or(i64::MAX));
        }
    }
}

/// An item did not fit its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{wanted} bytes do not fit: {queued} of {limit} bytes are queued")]
pub struct OverBudget {
    pub wanted: usize,
    pub queued: usize,
    pub limit: usize,
}

impl ByteBudget {
    /// A budget of `limit` bytes (at least 1; at most what a semaphore can count, ~2 GiB).
    pub fn new(limit: usize) -> Self {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Self {
            limit,
            room: Arc::new(Semaphore::new(limit)),
            freed: Arc::default(),
            gauge: None,
        }
    }

    /// Also count the charged bytes on `gauge` (shared by many budgets: a process total).
    pub fn with_gauge(mut self, gauge: Gauge) -> Self {
        self.gauge = Some(gauge);
        self
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes charged and not yet returned.
    pub fn queued(&self) -> usize {
        self.limit - self.room.available_permits()
    }

    fn cost(&self, bytes: usize) -> u32 {
        // `limit` fits a u32 (see `new`).
        u32::try_from(bytes.min(self.limit)).unwrap_or(u32::MAX)
    }

    fn charged(&self, permit: OwnedSemaphorePermit) -> Charge {
        let bytes = permit.num_permits();
        if let Some(g) = &self.gauge {
            g.inc_by(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        Charge {
            permit: Some(permit),
            bytes,
            gauge: self.gauge.clone(),
            freed: self.freed.clone(),
        }
    }

    /// Charge `bytes` if they fit now.
    pub fn try_charge(&self, bytes: usize) -> Result<Charge, OverBudget> {
        match self.room.clone().try_acquire_many_owned(self.cost(bytes)) {
            Ok(p) => Ok(self.charged(p)),
            Err(_) => Err(OverBudget {
                wanted: bytes,
                queued: self.queued(),
                limit: self.limit,
            }),
        }
    }

    /// Resolves once fewer than `bytes` are charged.
    pub async fn below(&self, bytes: usize) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a return in between is not missed.
            freed.as_mut().enable();
            if self.queued() < bytes {
                return;
            }
            freed.await;
        }
    }

    /// Charge `bytes` once they fit (earlier waiters first).
    pub async fn charge(&self, bytes: usize) -> Charge {
        let cost = self.cost(bytes);
        loop {
            // The semaphore is never closed, so this only returns `Ok`; a closed one is
            // retried rather than trusted with an `expect`.
            if let Ok(p) = self.room.clone().acquire_many_owned(cost).await {
                return self.charged(p);
            }
            tokio::task::yield_now().await;
        }
    }
}

/// Why [`QueueTx::try_send`] refused an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    #[error("{0} messages are queued")]
    Messages(usize),
    #[error(transparent)]
    Bytes(#[from] OverBudget),
    /// The receiving end is gone (nothing to bound any more).
    #[error("the queue's reader is gone")]
    Closed,
}

/// The sending side of a [`queue`]; clones share the budgets.
#[derive(Debug)]
pub struct QueueTx<T> {
    tx: mpsc::Sender<(T, Charge)>,
    bytes: ByteBudget,
    limits: QueueLimits,
}

impl<T> Clone for QueueTx<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            bytes: self.bytes.clone(),
            limits: self.limits,
        }
    }
}

/// The receiving side of a [`queue`]: an item's bytes return to the budget when it is taken
/// out, or when this is dropped with the items still in it.
#[derive(Debug)]
pub struct QueueRx<T> {
    rx: mpsc::Receiver<(T, Charge)>,
}

/// A queue of at most `limits.messages` items and `limits.bytes` encoded bytes; the sizes are
/// the caller's (`prost::Message::encoded_len`). `gauge` sums the queued bytes of many queues.
pub fn queue<T>(limits: QueueLimits, gauge: Option<Gauge>) -> (QueueTx<T>, QueueRx<T>) {
    let (tx, rx) = mpsc::channel(limits.messages.max(1));
    let mut bytes = ByteBudget::new(limits.bytes);
    if let Some(g) = gauge {
        bytes = bytes.with_gauge(g);
    }
    (QueueTx { tx, bytes, limits }, QueueRx { rx })
}

impl<T> QueueTx<T> {
    /// Queue `item` of `size` encoded bytes if it fits both bounds.
    pub fn try_send(&self, item: T, size: usize) -> Result<(), Full> {
        let permit = match self.tx.try_reserve() {
            Ok(p) => p,
            Err(mpsc::error::TrySendError::Full(())) => {
                return Err(Full::Messages(self.limits.messages));
            }
            Err(mpsc::error::TrySendError::Closed(())) => return Err(Full::Closed),
        };
        let charge = self.bytes.try_charge(size)?;
        permit.send((item, charge));
        Ok(())
    }

    /// Resolves once the receiving end is dropped.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// Bytes queued and not yet taken out.
    pub fn queued_bytes(&self) -> usize {
        self.bytes.queued()
    }

    /// Resolves once fewer than half the byte budget is queued: room for what the next
    /// message read from the peer may cause.
    pub async fn half_empty(&self) {
        self.bytes.below(self.bytes.limit().div_ceil(2)).await
    }
}

impl<T> QueueRx<T> {
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.rx.poll_recv(cx).map(|o| o.map(|(item, _charge)| item))
    }

    pub async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await.map(|(item, _charge)| item)
    }

    pub fn try_recv(&mut self) -> Result<T, mpsc::error::TryRecvError> {
        self.rx.try_recv().map(|(item, _charge)| item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_return_their_bytes_when_dropped() {
        let gauge = Gauge::default();
        let b = ByteBudget::new(100).with_gauge(gauge.clone());
        let c1 = b.try_charge(60).expect("fits");
        assert_eq!(
            b.try_charge(41).map(|_| ()),
            Err(OverBudget {
                wanted: 41,
                queued: 60,
                limit: 100
            })
        );
        let c2 = b.try_charge(40).expect("fits exactly");
        assert_eq!((b.queued(), gauge.get()), (100, 100));
        drop(c1);
        assert_eq!((b.queued(), gauge.get()), (40, 40));
        drop(c2);
        assert_eq!((b.queued(), gauge.get()), (0, 0));
    }

    #[test]
    fn an_item_larger_than_the_budget_fits_alone() {
        let b = ByteBudget::new(100);
        let big = b.try_charge(1_000).expect("alone");
        assert_eq!(b.queued(), 100);
        assert_eq!(
            b.try_charge(0).map(|_| ()),
            Ok(()),
            "an empty item always fits"
        );
        assert!(b.try_charge(1).is_err());
        drop(big);
        assert_eq!(b.queued(), 0);
    }

    #[tokio::test]
    async fn charge_waits_for_room() {
        let b = ByteBudget::new(10);
        let first = b.try_charge(8).expect("fits");
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move { b.charge(5).await.bytes })
        };
        // The waiter cannot be charged before `first` returns its bytes.
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(first);
        assert_eq!(waiting.await.expect("task"), 5);
        assert_eq!(b.queued(), 0);
    }

    #[tokio::test]
    async fn below_waits_until_bytes_return() {
        let b = ByteBudget::new(10);
        let c = b.try_charge(6).expect("fits");
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move { b.below(5).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(c);
        waiting.await.expect("resolves once the bytes are back");
    }

    #[test]
    fn a_queue_is_bounded_in_messages_and_bytes_and_returns_its_bytes() {
        let gauge = Gauge::default();
        let (tx, mut rx) = queue::<u32>(QueueLimits::new(3, 100), Some(gauge.clone()));
        tx.try_send(1, 50).expect("fits");
        tx.try_send(2, 50).expect("fits");
        assert_eq!(
            tx.try_send(3, 1),
            Err(Full::Bytes(OverBudget {
                wanted: 1,
                queued: 100,
                limit: 100
            }))
        );
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!((tx.queued_bytes(), gauge.get()), (50, 50));
        tx.try_send(4, 0).expect("fits");
        tx.try_send(5, 0).expect("fits");
        assert_eq!(tx.try_send(6, 0), Err(Full::Messages(3)));
        // Dropping the reader returns what it still held.
        drop(rx);
        assert_eq!((tx.queued_bytes(), gauge.get()), (0, 0));
        assert_eq!(tx.try_send(7, 0), Err(Full::Closed));
    }
}
