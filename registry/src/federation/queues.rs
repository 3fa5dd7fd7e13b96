//! The queues between a level and its peers' streams: what a session owns. [`DownLink`] is the
//! way down to one child's `Connect` stream and [`Uplink`] the way up to the parent for
//! control messages; both are bounded in messages and in encoded bytes ([`QueueLimits`]) and
//! count their bytes on the level's gauge. The level hands them plain messages through
//! [`ChildPort`] and [`ParentPort`] and counts what did not fit ([`Level::overflows`]); the
//! statuses that end a stream are written here.

use std::sync::{Arc, Mutex, OnceLock};

use futures::{Stream, StreamExt as _};
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use xcc_proto::xcc::federation::v1 as fed;

use super::level::{ChildPort, Level, Overflow, ParentPort, Resync};
use crate::budget::{Full, QueueLimits, QueueRx, QueueTx, queue};

/// What flows down a child's stream: messages, or the status that closes it.
pub type Down = Result<fed::ParentMessage, tonic::Status>;

/// The queued messages of one child's session (see [`DownLink`]).
pub type DownQueue = QueueRx<Down>;

/// The way down to one child's session: a queue bounded in messages and in encoded bytes
/// ([`QueueLimits`]), and the switch that ends the stream with a status. A message that does
/// not fit is never dropped on its own: the stream ends with `Unavailable` naming the budget,
/// the child reconnects at once and everything is sent again (its snapshot up, its questions,
/// the pending route notifications down), and the overflow is counted ([`Level::overflows`]).
/// What was queued is freed with the stream (the bytes return to the budget and the
/// process-wide gauge, [`Level::queued_bytes`]).
#[derive(Clone)]
pub struct DownLink {
    tx: QueueTx<Down>,
    end: CancellationToken,
    why: Arc<OnceLock<tonic::Status>>,
    /// The queued messages once [`DownLink::stream`] took them: [`DownLink::close`] drops them
    /// at once, not when the transport next polls the stream (a child that stopped reading
    /// never lets it).
    queued: Arc<Mutex<Option<DownQueue>>>,
}

impl DownLink {
    /// A link bounded by `limits`, and the receiving end for [`DownLink::stream`].
    pub fn new(limits: QueueLimits) -> (Self, DownQueue) {
        Self::with_gauge(limits, None)
    }

    /// Like [`DownLink::new`], also counting the queued bytes on `gauge`.
    pub fn with_gauge(limits: QueueLimits, gauge: Option<Gauge>) -> (Self, DownQueue) {
        let (tx, rx) = queue(limits, gauge);
        let link = Self {
            tx,
            end: CancellationToken::new(),
            why: Arc::default(),
            queued: Arc::default(),
        };
        (link, rx)
    }

    /// A link for a child's session of `level`: bounded by [`Level::queue_limits`], its bytes
    /// counted on [`Level::queued_bytes`].
    pub fn for_level(level: &Level) -> (Self, DownQueue) {
        Self::with_gauge(level.queue_limits(), Some(level.queued_bytes()))
    }

    /// Encoded bytes queued and not yet handed to the transport.
    pub fn queued_bytes(&self) -> usize {
        self.tx.queued_bytes()
    }

    /// Resolves once less than half the link's byte budget is queued.
    pub async fn half_empty(&self) {
        self.tx.half_empty().await
    }

    pub fn limits(&self) -> QueueLimits {
        self.tx.limits()
    }

    /// The status the link was closed with, if it was.
    pub fn why(&self) -> Option<tonic::Status> {
        self.why.get().cloned()
    }

    /// End the stream with `status` (the first reason wins); what is still queued is
    /// discarded, the child resynchronises when it reconnects.
    pub fn close(&self, status: tonic::Status) {
        let _ = self.why.set(status);
        self.end.cancel();
        drop(xcc_controller::plumbing::lock(&self.queued).take());
    }

    /// Whether the link was closed (by [`DownLink::close`]).
    pub fn is_closed(&self) -> bool {
        self.end.is_cancelled()
    }

    /// Resolves once the link was closed or its stream dropped (the child went away).
    pub async fn closed(&self) {
        tokio::select! {
            _ = self.end.cancelled() => {}
            _ = self.tx.closed() => {}
        }
    }

    /// The response stream: the queued messages until the link closes, then the status it
    /// closed with (none when every sender is gone).
    pub fn stream(&self, rx: DownQueue) -> impl Stream<Item = Down> + Send + 'static {
        let why = self.why.clone();
        let slot = self.queued.clone();
        *xcc_controller::plumbing::lock(&slot) = Some(rx);
        if self.end.is_cancelled() {
            // Closed before the stream began: nothing of it is sent.
            drop(xcc_controller::plumbing::lock(&slot).take());
        }
        let slot = SlotGuard(slot);
        futures::stream::poll_fn(
            move |cx| match xcc_controller::plumbing::lock(&slot.0).as_mut() {
                Some(rx) => rx.poll_recv(cx),
                None => std::task::Poll::Ready(None),
            },
        )
        .take_until(self.end.clone().cancelled_owned())
        .chain(
            futures::stream::once(async move { why.get().cloned() })
                .filter_map(|status| async move { status.map(Err) }),
        )
    }
}

impl ChildPort for DownLink {
    /// Queue `p`; on a full queue the stream is reset (never a silent drop) and the overflow
    /// reported to the level, which counts it.
    fn send(&self, p: fed::parent_message::Payload) -> Result<(), Overflow> {
        // A closing session takes nothing more: the child gets it all again when it is back.
        if self.end.is_cancelled() {
            return Ok(());
        }
        let msg = fed::ParentMessage { payload: Some(p) };
        let size = prost::Message::encoded_len(&msg);
        match self.tx.try_send(Ok(msg), size) {
            Ok(()) | Err(Full::Closed) => Ok(()),
            Err(full) => {
                let limits = self.tx.limits();
                warn!(budget = %limits, %full, "a child's session is not keeping up; ending it so the child resynchronises");
                self.close(over_budget_status(
                    "the parent's queue to this child",
                    limits,
                    full,
                ));
                Err(Overflow)
            }
        }
    }

    /// End the stream with `Unavailable` saying why: the child reconnects and resends.
    fn resync(&self, why: Resync) {
        self.close(tonic::Status::unavailable(why.to_string()));
    }
}

/// Held by a child's response stream: when the transport drops the stream (the child went
/// away), the queue goes with it, so its bytes return and [`DownLink::closed`] resolves.
struct SlotGuard(Arc<Mutex<Option<DownQueue>>>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        drop(xcc_controller::plumbing::lock(&self.0).take());
    }
}

/// The status that cuts a child whose queue stayed over half its budget for `stall`.
pub fn stalled_status(limits: QueueLimits, stall: std::time::Duration) -> tonic::Status {
    tonic::Status::unavailable(format!(
        "the parent's queue to this child stayed over half its budget of {} messages and {} \
         bytes (--federation-queue-messages, --federation-queue-bytes) for {} s \
         (--federation-queue-stall-seconds): the child is not reading; reconnect and \
         resynchronise",
        limits.messages,
        limits.bytes,
        stall.as_secs_f64()
    ))
}

/// The status that cuts a peer whose queue exceeded its budget: names the budget, the flags
/// that set it and what did not fit. `Unavailable`, so a child resynchronises at once.
pub fn over_budget_status(queue: &str, limits: QueueLimits, full: Full) -> tonic::Status {
    tonic::Status::unavailable(format!(
        "{queue} exceeded its budget of {} messages and {} bytes \
         (--federation-queue-messages, --federation-queue-bytes): {full}; \
         reconnect and resynchronise",
        limits.messages, limits.bytes
    ))
}

/// The way up to the parent for what is not a catalog change (subtree membership, queries,
/// route acknowledgements), read by the parent link's stream (`federation::upward`).
/// Announcements do not pass here: the stream reads them from the catalog. A message that does
/// not fit resets the parent session (the link reconnects at once) and is counted.
#[derive(Clone)]
pub struct Uplink {
    tx: QueueTx<fed::ChildMessage>,
    reset: CancellationToken,
    why: Arc<OnceLock<String>>,
}

/// The queued control messages of one parent session (see [`Uplink`]).
pub type UpQueue = QueueRx<fed::ChildMessage>;

impl Uplink {
    /// A way up bounded by `limits` (messages and encoded bytes).
    pub fn new(limits: QueueLimits) -> (Self, UpQueue) {
        Self::with_gauge(limits, None)
    }

    /// Like [`Uplink::new`], also counting the queued bytes on `gauge`.
    pub fn with_gauge(limits: QueueLimits, gauge: Option<Gauge>) -> (Self, UpQueue) {
        let (tx, rx) = queue(limits, gauge);
        let link = Self {
            tx,
            reset: CancellationToken::new(),
            why: Arc::default(),
        };
        (link, rx)
    }

    /// The way up of a parent session of `level`: bounded by [`Level::queue_limits`], its bytes
    /// counted on [`Level::queued_bytes`].
    pub fn for_level(level: &Level) -> (Self, UpQueue) {
        Self::with_gauge(level.queue_limits(), Some(level.queued_bytes()))
    }

    /// Why the session was reset, once it was.
    pub fn why(&self) -> Option<String> {
        self.why.get().cloned()
    }

    /// Encoded bytes queued and not yet handed to the transport.
    pub fn queued_bytes(&self) -> usize {
        self.tx.queued_bytes()
    }

    /// Cancelled when a message did not fit: the session must end and start again.
    pub fn reset(&self) -> &CancellationToken {
        &self.reset
    }
}

impl ParentPort for Uplink {
    /// Queue `msg` for the parent; a full queue resets the session (the link reconnects at
    /// once) and the overflow is reported to the level, which counts it.
    fn send(&self, msg: fed::ChildMessage) -> Result<(), Overflow> {
        let size = prost::Message::encoded_len(&msg);
        match self.tx.try_send(msg, size) {
            Ok(()) | Err(Full::Closed) => Ok(()),
            Err(full) => {
                let limits = self.tx.limits();
                warn!(budget = %limits, %full, "the parent link is not keeping up; resetting it to resynchronise");
                let _ = self.why.set(
                    over_budget_status("the queue up to the parent", limits, full)
                        .message()
                        .to_string(),
                );
                self.reset.cancel();
                Err(Overflow)
            }
        }
    }
}
