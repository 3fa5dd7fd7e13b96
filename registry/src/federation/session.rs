//! The parent side: `xcc.federation.v1.Federation/Connect`. One session per child; the child's
//! identity is the cluster name in its certificate. The first message must declare the child's
//! subtree; every later message is checked against it, and a child that speaks for a cluster
//! outside its subtree is cut off with `PermissionDenied`.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};
use xcc_proto::xcc::federation::v1 as fed;

use super::level::{ChildError, Down, Level, session_channel};

/// How long a child may take to declare its subtree.
const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(30);

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
        // Announcements are small; 1 MiB bounds a hostile one.
        fed::federation_server::FederationServer::new(self).max_decoding_message_size(1024 * 1024)
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
        if !peer.identity.is_cluster() {
            return Err(Status::permission_denied(format!(
                "{} is not a cluster identity",
                peer.identity
            )));
        }
        let child = peer.identity.name().to_string();
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(MEMBERSHIP_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no subtree membership received"))??
            .ok_or_else(|| Status::cancelled("stream closed before the membership"))?;
        let Some(fed::child_message::Payload::Subtree(membership)) = first.payload else {
            return Err(status_for(ChildError::NoMembership));
        };
        let (tx, rx) = session_channel();
        let id = self
            .level
            .attach_child(
                &child,
                peer.remote_addr.to_string(),
                &membership,
                tx.clone(),
            )
            .map_err(|e| {
                warn!(%child, error = %e, "refusing child");
                status_for(e)
            })?;
        info!(%child, addr = %peer.remote_addr, subtree = ?membership.clusters, "child connected");
        // Before the first announcement is read: everything this session stores is newer.
        let mut announced = self.level.track_announcements();
        let level = self.level.clone();
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            let end: Result<(), Status> = loop {
                let msg = tokio::select! {
                    _ = cancel.cancelled() => break Err(Status::unavailable("registry shutting down")),
                    _ = tx.closed() => break Ok(()),
                    m = inbound.message() => m,
                };
                let msg = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) | Err(_) => break Ok(()),
                };
                use fed::child_message::Payload;
                match msg.payload {
                    Some(Payload::Subtree(m)) => {
                        if let Err(e) = level.update_child_subtree(&child, &m) {
                            break Err(status_for(e));
                        }
                    }
                    Some(Payload::ServiceAnnouncement(a)) => {
                        if let Err(e) = level.child_announcement(&child, &a) {
                            break Err(Status::permission_denied(format!(
                                "spoofed announcement: {e}"
                            )));
                        }
                        announced.note(&level, &child, &a);
                    }
                    Some(Payload::SnapshotComplete(_)) => {
                        level.child_snapshot_complete(&child, &announced);
                    }
                    Some(Payload::RouteAck(a)) => level.child_route_ack(&child, &a),
                    Some(Payload::ServiceQuery(q)) => {
                        if let Err(e) = level.check_claim(&child, &q.requester_cluster) {
                            break Err(Status::permission_denied(format!(
                                "spoofed requester: {e}"
                            )));
                        }
                        level.handle_query(q);
                    }
                    None => {}
                }
            };
            if let Err(status) = end {
                if cancel.is_cancelled() {
                    info!(%child, "closing child session: shutting down");
                } else {
                    warn!(%child, code = ?status.code(), message = status.message(), "closing child session");
                }
                let _ = tx.send(Err(status)).await;
            }
            // On our own shutdown the child's services still exist: keep them (and every grant
            // on them) rather than revoking answers on the way out.
            if !cancel.is_cancelled() {
                level.detach_child(&child, id);
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
