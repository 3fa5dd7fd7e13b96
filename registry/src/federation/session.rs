//! The parent side: `xcc.federation.v1.Federation/Connect`. One session per child; the child's
//! identity is the cluster name in its certificate. The first message must declare the child's
//! subtree; every later message is checked against it. What the child may carry is the
//! parent's decision (Cedar `carry`), not the child's claim. An entry that is refused (a
//! cluster it may not carry, an announcement for a cluster outside its subtree, a name another
//! service owns, an entry over [`ENTRY_LIMIT`]) costs that entry only: the child receives a
//! `Rejection` saying why and the stream goes on. A stream that cannot go on (undecodable
//! bytes, a message over [`MESSAGE_LIMIT`]) ends with a status that says what happened.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};
use xcc_proto::xcc::federation::v1 as fed;

use super::level::{ChildError, Level, Refusal, RefusalCode, SessionAnnouncements};
use super::queues::{Down, DownLink};

/// How long a child may take to declare its subtree.
const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest entry (one announcement, query or membership) accepted. A real announcement is a
/// few hundred bytes (a service with a hundred endpoints stays under 8 KiB); 1 MiB leaves room
/// for anything legitimate and bounds a hostile one. A larger entry is refused on its own.
pub const ENTRY_LIMIT: usize = 1024 * 1024;

/// Largest message the decoder reads at all. Between [`ENTRY_LIMIT`] and this an entry is
/// refused and the stream goes on; past it the gRPC decoder cannot skip the bytes, so the
/// stream ends with `ResourceExhausted`. 16 MiB bounds the memory one child can pin.
pub const MESSAGE_LIMIT: usize = 16 * 1024 * 1024;

#[derive(Clone)]
pub struct FederationService {
    level: Level,
    cancel: CancellationToken,
}

impl FederationService {
    pub fn new(level: Level, cancel: CancellationToken) -> Self {
        Self { level, cancel }
    }

    pub fn into_server(self) -> fed::federation_server::FederationServer<Self> {
        fed::federation_server::FederationServer::new(self).max_decoding_message_size(MESSAGE_LIMIT)
    }
}

type DownStream = Pin<Box<dyn Stream<Item = Down> + Send>>;

fn status_for(e: ChildError) -> Status {
    match e {
        ChildError::Duplicate(_) => Status::already_exists(e.to_string()),
        ChildError::NoMembership => Status::invalid_argument(e.to_string()),
        ChildError::Tree(_) => Status::failed_precondition(e.to_string()),
    }
}

#[tonic::async_trait]
impl fed::federation_server::Federation for FederationService {
    type ConnectStream = DownStream;

    async fn connect(
        &self,
        request: Request<Streaming<fed::ChildMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let peer = xcc_certs::server::peer_info(&request)
            .cloned()
            .ok_or_else(|| Status::unauthenticated("no verified client certificate"))?;
        let child = self.level.gate().cluster_of(&peer.identity).map_err(|e| {
            warn!(peer = %peer.identity, addr = %peer.remote_addr, error = %e, "refusing child");
            Status::from(e)
        })?;
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(MEMBERSHIP_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no subtree membership received"))??
            .ok_or_else(|| Status::cancelled("stream closed before the membership"))?;
        let size = prost::Message::encoded_len(&first);
        if size > ENTRY_LIMIT {
            warn!(%child, size, "refusing child: oversized subtree membership");
            return Err(Status::resource_exhausted(format!(
                "the subtree membership of {size} bytes exceeds the {ENTRY_LIMIT}-byte limit"
            )));
        }
        let Some(fed::child_message::Payload::Subtree(membership)) = first.payload else {
            return Err(status_for(ChildError::NoMembership));
        };
        let (link, rx) = DownLink::for_level(&self.level);
        let down = link.stream(rx);
        let id = self
            .level
            .attach_child(
                &child,
                peer.remote_addr.to_string(),
                &membership,
                link.clone(),
            )
            .map_err(|e| {
                warn!(%child, error = %e, "refusing child");
                status_for(e)
            })?;
        info!(%child, addr = %peer.remote_addr, subtree = ?membership.clusters, "child connected");
        // Before the first announcement is read: everything this session stores is newer.
        let mut reader = ChildReader::new(self.level.clone(), child.clone());
        let level = self.level.clone();
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            let stall = level.queue_stall();
            let end: Result<(), Status> = loop {
                // Back-pressure: what a child's message causes (answers, rejections) is queued
                // for that child, so its next message is read only once its queue is less than
                // half full; a child that stops reading is cut after `stall`, and one that
                // reads slowly is paced, never cut for a burst of its own questions.
                let room = tokio::select! {
                    _ = cancel.cancelled() => break Err(Status::unavailable("registry shutting down")),
                    _ = link.closed() => {
                        if let Some(status) = link.why() {
                            warn!(%child, code = ?status.code(), message = status.message(), "closing child session");
                        }
                        break Ok(());
                    }
                    r = tokio::time::timeout(stall, link.half_empty()) => r.is_ok(),
                };
                if !room {
                    level.overflows().inc();
                    break Err(super::queues::stalled_status(link.limits(), stall));
                }
                let msg = tokio::select! {
                    _ = cancel.cancelled() => break Err(Status::unavailable("registry shutting down")),
                    _ = link.closed() => {
                        // Cut for exceeding its queue's budget (or gone): say which.
                        if let Some(status) = link.why() {
                            warn!(%child, code = ?status.code(), message = status.message(), "closing child session");
                        }
                        break Ok(());
                    }
                    m = inbound.message() => m,
                };
                let msg = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) => break Ok(()),
                    Err(status) => break read_error(&child, status),
                };
                if let Err(status) = reader.on_message(msg) {
                    break Err(status);
                }
            };
            if let Err(status) = end {
                if cancel.is_cancelled() {
                    info!(%child, "closing child session: shutting down");
                } else {
                    warn!(%child, code = ?status.code(), message = status.message(), "closing child session");
                }
                link.close(status);
            }
            // On our own shutdown the child's services still exist: keep them (and every grant
            // on them) rather than revoking answers on the way out.
            if !cancel.is_cancelled() {
                level.detach_child(&child, id);
            }
        });
        Ok(Response::new(Box::pin(down)))
    }
}

/// What the parent does with each message of one child's session (after its membership).
pub struct ChildReader {
    level: Level,
    child: String,
    /// What this pass of the child's snapshot announced, for the sweep at its marker.
    announced: SessionAnnouncements,
}

impl ChildReader {
    /// Start reading `child`'s session, before its first announcement.
    pub fn new(level: Level, child: String) -> Self {
        let announced = level.track_announcements();
        Self {
            level,
            child,
            announced,
        }
    }

    /// Handle one message. A refused entry is answered with a `Rejection` and costs only that
    /// entry; an error ends the session with the status returned.
    pub fn on_message(&mut self, msg: fed::ChildMessage) -> Result<(), Status> {
        use fed::child_message::Payload;
        let (level, child) = (&self.level, self.child.as_str());
        let size = prost::Message::encoded_len(&msg);
        if size > ENTRY_LIMIT {
            let r = oversized(&msg, size, level.cluster());
            warn!(%child, kind = %r.kind, cluster = %r.cluster, size, "refusing an oversized entry");
            level.reject_to_child(child, r);
            return Ok(());
        }
        match msg.payload {
            Some(Payload::Subtree(m)) => {
                level.update_child_subtree(child, &m).map_err(status_for)?;
                // Another pass of the snapshot: its marker drops what it leaves out.
                if m.resync {
                    self.announced = level.track_announcements();
                }
            }
            Some(Payload::ServiceAnnouncement(a)) => match level.child_announcement(child, &a) {
                Ok(()) => self.announced.note(level, child, &a),
                Err(refusal) => level.reject_to_child(
                    child,
                    refusal.to_rejection(
                        "announcement",
                        &a.cluster,
                        &a.namespace,
                        &a.name,
                        &a.fqdn,
                        level.cluster(),
                    ),
                ),
            },
            Some(Payload::SnapshotComplete(m)) => {
                level.child_snapshot_complete(child, &self.announced);
                level.confirm_snapshot(child, m);
            }
            Some(Payload::RouteAck(a)) => level.child_route_ack(child, &a),
            Some(Payload::ServiceQuery(q)) => {
                if let Err(e) = level.check_claim(child, &q.requester_cluster) {
                    warn!(%child, requester = %q.requester_cluster, "refusing a query on behalf of a cluster the child does not carry");
                    level.reject_to_child(
                        child,
                        Refusal::new("subtree", RefusalCode::PermissionDenied, e.to_string())
                            .to_rejection(
                                "query",
                                &q.requester_cluster,
                                &q.namespace,
                                &q.name,
                                &q.fqdn,
                                level.cluster(),
                            ),
                    );
                    return Ok(());
                }
                level.handle_query(q);
            }
            None => {}
        }
        Ok(())
    }
}

/// How a read error ends the session: undecodable bytes and messages past [`MESSAGE_LIMIT`]
/// get a status that says so (logged); a transport error means the child went away.
fn read_error(child: &str, status: Status) -> Result<(), Status> {
    match status.code() {
        tonic::Code::OutOfRange => Err(Status::resource_exhausted(format!(
            "a message exceeds the {MESSAGE_LIMIT}-byte limit of this stream: {}",
            status.message()
        ))),
        tonic::Code::Internal => Err(Status::invalid_argument(format!(
            "malformed message: {}",
            status.message()
        ))),
        _ => {
            info!(%child, code = ?status.code(), message = status.message(), "child stream ended");
            Ok(())
        }
    }
}

/// The rejection of an entry over [`ENTRY_LIMIT`], naming what it was about.
fn oversized(msg: &fed::ChildMessage, size: usize, refused_by: &str) -> fed::Rejection {
    use fed::child_message::Payload;
    let refusal = Refusal::new(
        "size",
        RefusalCode::ResourceExhausted,
        format!("entry of {size} bytes exceeds the {ENTRY_LIMIT}-byte limit"),
    );
    match &msg.payload {
        Some(Payload::ServiceAnnouncement(a)) => refusal.to_rejection(
            "announcement",
            &a.cluster,
            &a.namespace,
            &a.name,
            &a.fqdn,
            refused_by,
        ),
        Some(Payload::ServiceQuery(q)) => refusal.to_rejection(
            "query",
            &q.requester_cluster,
            &q.namespace,
            &q.name,
            &q.fqdn,
            refused_by,
        ),
        Some(Payload::Subtree(_)) => refusal.to_rejection("subtree", "", "", "", "", refused_by),
        _ => refusal.to_rejection("message", "", "", "", "", refused_by),
    }
}
