//! The child's stream to its parent as one state machine, driven by the transport's polls (as
//! the Hamlet server's consumer streams are): a message is produced only when the parent's
//! HTTP/2 window has room for it, so a slow parent slows the stream and nothing piles up.
//!
//! Order of a session: the subtree membership (queued by [`Level::begin_upward`]), every entry
//! of the subtree read from the live catalog with a key cursor (a batch at a time, no lock held
//! between batches and no copy of the subtree), the end-of-snapshot marker, then the persistent
//! questions. Catalog changes and control messages (membership changes, queries, route
//! acknowledgements) interleave as they come; a change for a key the cursor has not reached yet
//! is simply sent twice, the second time with the same current content.
//!
//! If the catalog's change feed overflows while the parent is not reading (more changes than
//! the feed holds), the stream sends the snapshot again in the same session: at once, or, if a
//! pass is running, right after it (a pass is never restarted, so each one completes however
//! fast the catalog changes). A pass sent again starts with a membership marked `resync` (the
//! parent then tracks what it announces) and ends with the marker, at which the parent removes
//! whatever the pass did not mention (deletions the feed lost).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use xcc_proto::xcc::federation::v1 as fed;

use super::convert::announcement;
use super::level::Level;
use crate::catalog::{CatalogEvent, ServiceEntry, ServiceKey};

/// Entries read from the catalog per cursor step.
const BATCH: usize = 256;

/// Progress of one pass over the subtree.
#[derive(Default)]
struct Cursor {
    /// Last key handed out; the next batch starts after it.
    after: Option<ServiceKey>,
    batch: VecDeque<Arc<ServiceEntry>>,
    /// Sent after the marker (the persistent questions, on the first pass).
    then: Vec<fed::ServiceQuery>,
}

/// The upward stream of one parent session.
pub struct Upward {
    level: Level,
    control: super::queues::UpQueue,
    events: BroadcastStream<CatalogEvent>,
    cursor: Option<Cursor>,
    /// Messages due before anything else but control messages: a change read while checking
    /// for control messages, the questions that follow the marker.
    pending: VecDeque<fed::ChildMessage>,
    /// The change feed overflowed during the running pass: send another after it.
    again: bool,
}

impl Upward {
    /// `control`: the receiving end of the [`super::queues::Uplink`] given to
    /// [`Level::begin_upward`]; `events`: the catalog's change feed, subscribed before that
    /// call; `queries`: what it returned.
    pub fn new(
        level: Level,
        control: super::queues::UpQueue,
        events: tokio::sync::broadcast::Receiver<CatalogEvent>,
        queries: Vec<fed::ServiceQuery>,
    ) -> Self {
        Self {
            level,
            control,
            events: BroadcastStream::new(events),
            cursor: Some(Cursor {
                then: queries,
                ..Default::default()
            }),
            pending: VecDeque::new(),
            again: false,
        }
    }

    /// The next message of the current pass, if one is running.
    fn next_snapshot(&mut self) -> Option<fed::ChildMessage> {
        let cursor = self.cursor.as_mut()?;
        let catalog = self.level.catalog();
        loop {
            if cursor.batch.is_empty() {
                cursor.batch = catalog.subtree_after(cursor.after.as_ref(), BATCH).into();
                if cursor.batch.is_empty() {
                    break;
                }
            }
            while let Some(e) = cursor.batch.pop_front() {
                cursor.after = Some(e.key.clone());
                // Read again as it is sent: a change since the batch was read may already
                // have gone up, and an older copy must not follow it.
                if let Some(e) = catalog.get(&e.key).filter(|e| e.source.in_subtree()) {
                    return Some(up(fed::child_message::Payload::ServiceAnnouncement(
                        announcement(&e, false),
                    )));
                }
            }
        }
        let then = self.cursor.take().map(|c| c.then).unwrap_or_default();
        self.pending.extend(
            then.into_iter()
                .map(|q| up(fed::child_message::Payload::ServiceQuery(q))),
        );
        if std::mem::take(&mut self.again) {
            let m = self.start_pass();
            self.pending.push_back(m);
        }
        Some(up(fed::child_message::Payload::SnapshotComplete(
            fed::SnapshotComplete {
                generation: self.level.catalog().revision(),
            },
        )))
    }

    /// Start another pass; returns the membership that opens it.
    fn start_pass(&mut self) -> fed::ChildMessage {
        self.cursor = Some(Cursor::default());
        let mut m = self.level.membership();
        if let Some(fed::child_message::Payload::Subtree(s)) = &mut m.payload {
            s.resync = true;
        }
        m
    }

    /// A control message if one is queued; `Err` once the level let go of the session's
    /// [`super::queues::Uplink`] (the link is down): the stream ends.
    fn poll_control(&mut self, cx: &mut Context<'_>) -> Result<Option<fed::ChildMessage>, ()> {
        match self.control.poll_recv(cx) {
            Poll::Ready(Some(m)) => Ok(Some(m)),
            Poll::Ready(None) => Err(()),
            Poll::Pending => Ok(None),
        }
    }
}

impl Stream for Upward {
    type Item = fed::ChildMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.poll_control(cx) {
            Ok(Some(m)) => return Poll::Ready(Some(m)),
            Ok(None) => {}
            Err(()) => return Poll::Ready(None),
        }
        if let Some(m) = this.pending.pop_front() {
            return Poll::Ready(Some(m));
        }
        loop {
            match Pin::new(&mut this.events).poll_next(cx) {
                Poll::Ready(Some(Ok(ev))) => {
                    let Some(m) = this.level.upward_event(&ev) else {
                        continue;
                    };
                    // A control message queued before this change (a membership that now
                    // carries its cluster) goes first.
                    if let Ok(Some(c)) = this.poll_control(cx) {
                        this.pending.push_front(m);
                        return Poll::Ready(Some(c));
                    }
                    return Poll::Ready(Some(m));
                }
                Poll::Ready(Some(Err(BroadcastStreamRecvError::Lagged(missed)))) => {
                    tracing::info!(
                        missed,
                        "catalog changes outran the parent; sending the subtree again"
                    );
                    if this.cursor.is_some() {
                        this.again = true;
                        continue;
                    }
                    return Poll::Ready(Some(this.start_pass()));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => break,
            }
        }
        match this.next_snapshot() {
            Some(m) => Poll::Ready(Some(m)),
            None => Poll::Pending,
        }
    }
}

fn up(p: fed::child_message::Payload) -> fed::ChildMessage {
    fed::ChildMessage { payload: Some(p) }
}
