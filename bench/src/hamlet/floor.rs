//! The transport floor (`xcc bench hamlet --server floor`): a Hamlet server that does the least
//! any server on xcc's transport can do, so that the bench can tell what the transport costs on
//! this machine from what xcc's server adds to it.
//!
//! Same listener as the registry's Hamlet port (rustls mTLS through `tls_incoming_for`, tonic
//! with the same HTTP/2 keepalive), same messages (every record's `FederatedService` encoded
//! once, as xcc's server keeps it), but none of a registry's work: no catalog, no policy
//! decision, no per-consumer state, no window, no ACK timer. A stream sends the prepared
//! snapshot as fast as HTTP/2 takes it, then every update of the hot service; a task of its own
//! reads and drops the consumer's ACKs. Not a Hamlet server anyone should run: it ignores NACKs
//! and a consumer that stops reading pins whatever tonic buffered for it.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;
use tonic::{Request, Response, Status, Streaming};
use xcc_proto::SNAPSHOT_MARKER_METADATA;
use xcc_proto::encoded_any::EncodedAny;
// The registry's server messages: a response's resource is its shared encoding.
use xcc_proto::hamlet_server::v1alpha1 as serve1;

use super::*;

type Responses = Pin<Box<dyn Stream<Item = Result<serve1::StreamResponse, Status>> + Send>>;

/// The responses every consumer gets, built once.
#[derive(Clone)]
struct Floor {
    /// The snapshot: one CREATE per service, then the end-of-snapshot marker.
    snapshot: Arc<[serve1::StreamResponse]>,
    /// Each update of the hot service, as sent.
    updates: broadcast::Sender<Arc<serve1::StreamResponse>>,
}

fn response(
    nonce: String,
    op: serve1::stream_response::Operation,
    sr: &ServiceRecord,
) -> anyhow::Result<serve1::StreamResponse> {
    let resource = xcc_registry::hamlet::convert::any_v1alpha1(&entry(sr)?);
    Ok(serve1::StreamResponse {
        nonce,
        resource_url: resource.type_url.clone(),
        resource: Some(EncodedAny::new(&resource)),
        operation: op as i32,
    })
}

fn marker() -> serve1::StreamResponse {
    use prost::Message as _;
    let resource = prost_types::Any {
        type_url: xcc_proto::SNAPSHOT_COMPLETE_URL.into(),
        value: xcc_proto::xcc::federation::v1::SnapshotComplete { generation: 0 }.encode_to_vec(),
    };
    serve1::StreamResponse {
        nonce: "marker".into(),
        resource_url: resource.type_url.clone(),
        resource: Some(EncodedAny::new(&resource)),
        operation: serve1::stream_response::Operation::Unknown as i32,
    }
}

#[tonic::async_trait]
impl serve1::discovery_service_server::DiscoveryService for Floor {
    type EstablishStreamStream = Responses;

    async fn establish_stream(
        &self,
        request: Request<Streaming<serve1::StreamRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let marker = request
            .metadata()
            .get(SNAPSHOT_MARKER_METADATA)
            .is_some_and(|v| v.as_bytes() == b"1");
        let mut requests = request.into_inner();
        requests
            .message()
            .await?
            .ok_or_else(|| Status::cancelled("stream closed before subscribing"))?;
        // Subscribed before the snapshot is taken: no update is missed.
        let updates = BroadcastStream::new(self.updates.subscribe())
            .filter_map(|u| std::future::ready(u.ok().map(|r| Ok(r.as_ref().clone()))));
        tokio::spawn(async move { while let Ok(Some(_)) = requests.message().await {} });
        let snapshot = self.snapshot.clone();
        let len = snapshot.len() - usize::from(!marker);
        let stream = futures::stream::iter((0..len).map(move |i| Ok(snapshot[i].clone())));
        let mut response = Response::new(Box::pin(stream.chain(updates)) as Responses);
        if marker {
            response.metadata_mut().insert(
                SNAPSHOT_MARKER_METADATA,
                tonic::metadata::MetadataValue::from_static("1"),
            );
        }
        Ok(response)
    }
}

/// A running floor server: its address and the sender of the hot service's updates.
pub(super) struct FloorServer {
    pub(super) addr: SocketAddr,
    updates: broadcast::Sender<Arc<serve1::StreamResponse>>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl FloorServer {
    /// Serves `services` records (the hot one at sequence 0 among them) on `listen`.
    pub(super) async fn start(
        tls: &TlsFiles,
        listen: SocketAddr,
        services: usize,
    ) -> anyhow::Result<Self> {
        let mut snapshot = Vec::with_capacity(services + 1);
        let hot = hot_record(0);
        for (i, sr) in bulk_records(services).iter().chain([&hot]).enumerate() {
            snapshot.push(response(
                i.to_string(),
                serve1::stream_response::Operation::Create,
                sr,
            )?);
        }
        snapshot.push(marker());
        // Consumers read every update before the next is made; a lagging one would miss it
        // and the bench would time out, not measure wrongly.
        let (updates, _) = broadcast::channel(16);
        let floor = Floor {
            snapshot: snapshot.into(),
            updates: updates.clone(),
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr().context("the listener's address")?;
        let tls = ReloadingTls::load(tls.clone()).context("loading the server certificate")?;
        let cancel = CancellationToken::new();
        let incoming =
            xcc_certs::server::tls_incoming_for("floor listener", listener, tls, cancel.clone());
        // The registry's Hamlet listener's transport.
        let router = xcc_registry::hamlet::pieces::hamlet_transport()
            .add_service(serve1::discovery_service_server::DiscoveryServiceServer::new(floor));
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(incoming, stop.cancelled())
                .await
        });
        Ok(Self {
            addr,
            updates,
            cancel,
            task,
        })
    }

    /// Sends the hot service at `seq` to every consumer; returns when the change started.
    pub(super) fn update(&self, seq: u32) -> anyhow::Result<Instant> {
        let resp = Arc::new(response(
            format!("u{seq}"),
            serve1::stream_response::Operation::Update,
            &hot_record(seq),
        )?);
        let t0 = Instant::now();
        // No receiver yet is no error: no consumer is connected.
        let _ = self.updates.send(resp);
        Ok(t0)
    }

    pub(super) async fn stop(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.task
            .await
            .context("the floor server's task")?
            .context("the floor server")
    }
}

/// `xcc bench hamlet-floor-serve`: the floor server as a child process of `xcc bench hamlet
/// --server floor --mode process`. Prints `ready <addr>` once it listens; each line on stdin is
/// the sequence number of an update to send; ends at the end of stdin.
#[derive(clap::Args, Debug)]
pub struct FloorServeArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Directory with the server's `ca.crt`, `tls.crt` and `tls.key`.
    #[arg(long)]
    pub tls_dir: PathBuf,
    /// Services in the snapshot.
    #[arg(long)]
    pub services: usize,
}

pub(crate) async fn serve(args: FloorServeArgs) -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt as _;
    xcc_certs::install_crypto_provider();
    let server =
        FloorServer::start(&TlsFiles::in_dir(&args.tls_dir), args.listen, args.services).await?;
    println!("ready {}", server.addr);
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.context("reading stdin")? {
        let seq: u32 = line
            .trim()
            .parse()
            .with_context(|| format!("not a sequence number: {line:?}"))?;
        server.update(seq)?;
    }
    server.stop().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor serves what the bench's consumers count: every service of the snapshot, the
    /// marker, then each update of the hot service, on a real mTLS connection.
    #[tokio::test]
    async fn the_floor_serves_the_snapshot_and_each_update() {
        // A floor that loses an update would leave the consumer waiting: bounded.
        tokio::time::timeout(
            Duration::from_secs(60),
            serves_the_snapshot_and_each_update(),
        )
        .await
        .expect("the floor answered within 60 s");
    }

    async fn serves_the_snapshot_and_each_update() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let pki = BenchPki::new(dir.path()).expect("bench PKI");
        let tls = ReloadingTls::load(pki.consumer.clone()).expect("consumer certificate");
        let server = FloorServer::start(&pki.server, SocketAddr::from(([127, 0, 0, 1], 0)), 250)
            .await
            .expect("floor server");
        let channel = connect(&tls, server.addr).await.expect("connect");
        let (acks, mut stream) = subscribe(channel).await.expect("subscribe");
        assert_eq!(
            read_snapshot(&acks, &mut stream).await.expect("snapshot"),
            250
        );
        for seq in [1, 2, 300] {
            server.update(seq).expect("update");
            let msg = next(&mut stream).await.expect("the update");
            assert_eq!(
                (msg.operation, hot_seq(&msg)),
                (rd1::stream_response::Operation::Update as i32, Some(seq))
            );
            ack(&acks, &msg.nonce).expect("ACK");
        }
        drop((acks, stream));
        server.stop().await.expect("stops");
    }
}
