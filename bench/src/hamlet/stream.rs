//! The consumers: TLS connections, the Hamlet stream with its ACKs, the snapshot and the hot
//! service's updates.

use super::*;

pub(super) enum Event {
    Synced { elapsed: Duration, creates: usize },
    Update { seq: u32, at: Instant },
    Failed { id: usize, error: String },
}

pub(crate) async fn connect(
    tls: &ReloadingTls,
    addr: SocketAddr,
) -> anyhow::Result<tonic::transport::Channel> {
    let connector = xcc_certs::client::TlsConnector::new(tls.clone(), "localhost".into(), None)
        .context("building the TLS connector")?;
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .context("endpoint URI")?
        .connect_with_connector(connector)
        .await
        .with_context(|| format!("connecting to {addr}"))
}

pub(crate) type Acks = fmpsc::UnboundedSender<rd1::StreamRequest>;

/// Open the Hamlet stream with the end-of-snapshot marker requested.
pub(crate) async fn subscribe(
    channel: tonic::transport::Channel,
) -> anyhow::Result<(Acks, tonic::Streaming<rd1::StreamResponse>)> {
    let (tx, rx) = fmpsc::unbounded();
    tx.unbounded_send(rd1::StreamRequest {
        resource_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        response_nonce: String::new(),
        status: None,
    })
    .context("queueing the subscription")?;
    let mut req = tonic::Request::new(rx);
    req.metadata_mut().insert(
        xcc_proto::SNAPSHOT_MARKER_METADATA,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    let mut client = rd1::discovery_service_client::DiscoveryServiceClient::new(channel);
    let resp = client
        .establish_stream(req)
        .await
        .context("EstablishStream")?;
    if resp
        .metadata()
        .get(xcc_proto::SNAPSHOT_MARKER_METADATA)
        .is_none()
    {
        bail!("the server did not agree to send the end-of-snapshot marker");
    }
    Ok((tx, resp.into_inner()))
}

pub(crate) fn ack(acks: &Acks, nonce: &str) -> anyhow::Result<()> {
    acks.unbounded_send(rd1::StreamRequest {
        resource_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        response_nonce: nonce.to_string(),
        status: Some(Default::default()),
    })
    .context("sending an ACK: request stream closed")
}

pub(crate) async fn next(
    stream: &mut tonic::Streaming<rd1::StreamResponse>,
) -> anyhow::Result<rd1::StreamResponse> {
    stream
        .message()
        .await
        .context("receiving")?
        .context("the server closed the stream")
}

pub(super) fn is_marker(msg: &rd1::StreamResponse) -> bool {
    msg.operation == rd1::stream_response::Operation::Unknown as i32
        && msg
            .resource
            .as_ref()
            .is_some_and(|r| r.type_url == xcc_proto::SNAPSHOT_COMPLETE_URL)
}

/// Receive (and ACK) the snapshot up to the marker. Returns the number of CREATEs before it.
pub(crate) async fn read_snapshot(
    acks: &Acks,
    stream: &mut tonic::Streaming<rd1::StreamResponse>,
) -> anyhow::Result<usize> {
    let mut creates = 0;
    loop {
        let msg = next(stream).await?;
        ack(acks, &msg.nonce)?;
        if is_marker(&msg) {
            return Ok(creates);
        }
        if msg.operation == rd1::stream_response::Operation::Create as i32 {
            creates += 1;
        }
    }
}

/// One subscription on an open channel: time to the marker and services received.
pub(crate) async fn snapshot_once(
    channel: tonic::transport::Channel,
) -> anyhow::Result<(Duration, usize)> {
    let t0 = Instant::now();
    let (acks, mut stream) = subscribe(channel).await?;
    let creates = read_snapshot(&acks, &mut stream).await?;
    Ok((t0.elapsed(), creates))
}

pub(super) async fn consumer(
    id: usize,
    channel: tonic::transport::Channel,
    go: watch::Receiver<Option<Instant>>,
    events: mpsc::UnboundedSender<Event>,
) {
    if let Err(e) = consumer_inner(channel, go, &events).await {
        let _ = events.send(Event::Failed {
            id,
            error: format!("{e:#}"),
        });
    }
}

pub(super) async fn consumer_inner(
    channel: tonic::transport::Channel,
    mut go: watch::Receiver<Option<Instant>>,
    events: &mpsc::UnboundedSender<Event>,
) -> anyhow::Result<()> {
    let start = go
        .wait_for(Option::is_some)
        .await
        .context("start signal dropped")?
        .unwrap_or_else(Instant::now);
    let (acks, mut stream) = subscribe(channel).await?;
    let creates = read_snapshot(&acks, &mut stream).await?;
    let _ = events.send(Event::Synced {
        elapsed: start.elapsed(),
        creates,
    });
    loop {
        let msg = next(&mut stream).await?;
        let at = Instant::now();
        ack(&acks, &msg.nonce)?;
        if msg.operation == rd1::stream_response::Operation::Update as i32
            && let Some(seq) = hot_seq(&msg)
        {
            let _ = events.send(Event::Update { seq, at });
        }
    }
}

/// The update sequence number carried by an UPDATE of the hot service.
pub(crate) fn hot_seq(msg: &rd1::StreamResponse) -> Option<u32> {
    let fs = xcc_proto::hamlet::unpack_federated_service(msg.resource.as_ref()?).ok()?;
    if fs.fqdn != HOT_FQDN {
        return None;
    }
    let rest = fs.endpoints.first()?.address.strip_prefix(HOT_PREFIX)?;
    let (hi, lo) = rest.split_once('.')?;
    Some(hi.parse::<u32>().ok()? * 256 + lo.parse::<u32>().ok()?)
}

pub(super) fn hot_address(seq: u32) -> String {
    format!("{HOT_PREFIX}{}.{}", seq / 256, seq % 256)
}
