//! End to end through tonic: a server fed by `tls_incoming`, channels built with `TlsConnector`, and a
//! unary RPC whose handler reads the caller's identity with `peer_info`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::common::{SERVER_NAME, ca, cluster, server_request, tls_dir, within};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::codegen::http;
use tonic::transport::{Endpoint, Server};
use xcc_certs::{IssueRequest, ReloadingTls, TlsConnector, peer_info, tls_incoming};

const WHOAMI_PATH: &str = "/xcc.test.WhoAmI/Get";

/// A unary service `xcc.test.WhoAmI/Get(string) -> string` answering with the caller's identity.
#[derive(Clone)]
struct WhoAmI;

impl tonic::server::NamedService for WhoAmI {
    const NAME: &'static str = "xcc.test.WhoAmI";
}

struct Get;

impl tonic::server::UnaryService<String> for Get {
    type Response = String;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<String>, tonic::Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<String>) -> Self::Future {
        let answer = match peer_info(&request) {
            Some(peer) => Ok(tonic::Response::new(peer.identity.to_string())),
            None => Err(tonic::Status::unauthenticated("no peer identity")),
        };
        Box::pin(async move { answer })
    }
}

impl<B> tower::Service<http::Request<B>> for WhoAmI
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        Box::pin(async move {
            if req.uri().path() != WHOAMI_PATH {
                return Ok(tonic::Status::unimplemented("no such method").into_http());
            }
            let mut grpc =
                tonic::server::Grpc::new(tonic_prost::ProstCodec::<String, String>::default());
            Ok(grpc.unary(Get, req).await)
        })
    }
}

async fn whoami(channel: tonic::transport::Channel) -> Result<String, tonic::Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<String, String>::default();
    let response = client
        .unary(
            tonic::Request::new(String::new()),
            http::uri::PathAndQuery::from_static(WHOAMI_PATH),
            codec,
        )
        .await?;
    Ok(response.into_inner())
}

async fn channel(
    addr: std::net::SocketAddr,
    tls: ReloadingTls,
) -> (tonic::transport::Channel, TlsConnector) {
    let connector = TlsConnector::new(tls, SERVER_NAME.into(), None).expect("connector");
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("endpoint");
    let channel = within(
        "connect",
        endpoint.connect_with_connector(connector.clone()),
    )
    .await
    .expect("channel");
    (channel, connector)
}

#[tokio::test]
async fn handler_sees_the_callers_identity_through_tonic() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let (_cd, west_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let (_ad, admin_tls, _) = tls_dir(&ca, &IssueRequest::admin("alice"));

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cancel = CancellationToken::new();
    let server = tokio::spawn(
        Server::builder()
            .add_service(WhoAmI)
            .serve_with_incoming_shutdown(
                tls_incoming(listener, server_tls, cancel.clone()),
                cancel.clone().cancelled_owned(),
            ),
    );

    let (west, west_connector) = channel(addr, west_tls).await;
    assert_eq!(
        within("RPC", whoami(west.clone())).await.expect("RPC"),
        "cluster/west"
    );
    assert_eq!(west_connector.last_peer(), Some(cluster("east")));

    let (admin, _) = channel(addr, admin_tls).await;
    assert_eq!(
        within("RPC", whoami(admin)).await.expect("RPC"),
        "admin/alice"
    );
    // The first connection still answers with its own identity.
    assert_eq!(
        within("RPC", whoami(west)).await.expect("RPC"),
        "cluster/west"
    );

    cancel.cancel();
    within("server shutdown", server)
        .await
        .expect("server task")
        .expect("server result");
}
