//! Test harness: a throw-away PKI, registries on loopback, and a hand-driven Hamlet consumer
//! whose ACKs the test controls.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use xcc_certs::pki::{self, Ca, IssueRequest};
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::federation::resourcediscovery::v1alpha1 as rd1;
use xcc_proto::federation::types::v1alpha1::FederatedService;
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::{Registry, RegistryConfig};

/// Generous bound for anything that should happen "soon"; tests wait on events, never sleep.
pub const WAIT: Duration = Duration::from_secs(20);

pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
}

impl Pki {
    pub fn new(trust_domain: &str) -> Self {
        xcc_certs::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = pki::init_ca_dir(trust_domain, &dir.path().join("ca")).expect("ca");
        Self { dir, ca }
    }

    pub fn issue_req(&self, dir_name: &str, mut req: IssueRequest) -> TlsFiles {
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let cert = self.ca.issue(&req).expect("issue");
        pki::write_issued(&self.dir.path().join(dir_name), &self.ca, &cert).expect("write")
    }

    pub fn cluster(&self, name: &str) -> TlsFiles {
        self.issue_req(name, IssueRequest::cluster(name))
    }

    pub fn admin(&self, name: &str) -> TlsFiles {
        self.issue_req(name, IssueRequest::admin(name))
    }
}

pub async fn start(files: TlsFiles) -> (Registry, CancellationToken) {
    let cancel = CancellationToken::new();
    let reg = Registry::start(RegistryConfig::loopback(files), cancel.clone())
        .await
        .expect("registry starts");
    (reg, cancel)
}

pub async fn start_with(config: RegistryConfig) -> (Registry, CancellationToken) {
    let cancel = CancellationToken::new();
    let reg = Registry::start(config, cancel.clone())
        .await
        .expect("registry starts");
    (reg, cancel)
}

pub fn export(cluster: &str, ns: &str, fqdn: &str, ip: &str) -> ServiceEntry {
    let mut labels = BTreeMap::new();
    labels.insert(
        "connectivity.tanzu.vmware.com/service-port".to_string(),
        "443".to_string(),
    );
    ServiceEntry {
        key: ServiceKey::new(cluster, ns, fqdn),
        source: Source::Local,
        fqdn: fqdn.into(),
        endpoints: vec![Endpoint {
            address: ip.into(),
            port: 443,
        }],
        ports: vec![],
        labels: labels.into(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    }
}

pub async fn channel(
    tls: &ReloadingTls,
    addr: SocketAddr,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let connector = xcc_certs::client::TlsConnector::new(tls.clone(), "localhost".into(), None)
        .expect("connector");
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_with_connector(connector)
        .await
}

/// One response as the test sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub nonce: String,
    pub op: rd1::stream_response::Operation,
    pub fqdn: Option<String>,
    pub fs: Option<FederatedService>,
}

/// A Hamlet consumer driven by hand.
pub struct Consumer {
    pub tx: mpsc::Sender<rd1::StreamRequest>,
    pub rx: tonic::Streaming<rd1::StreamResponse>,
    pub marker: bool,
}

impl Consumer {
    pub async fn connect(
        tls: &ReloadingTls,
        addr: SocketAddr,
        want_marker: bool,
    ) -> Result<Self, tonic::Status> {
        let ch = channel(tls, addr)
            .await
            .map_err(|e| tonic::Status::unavailable(format!("{e:?}")))?;
        Self::on_channel(ch, want_marker, xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL).await
    }

    pub async fn on_channel(
        ch: tonic::transport::Channel,
        want_marker: bool,
        url: &str,
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(1024);
        tx.send(rd1::StreamRequest {
            resource_url: url.into(),
            response_nonce: String::new(),
            status: None,
        })
        .await
        .expect("queue subscription");
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        if want_marker {
            req.metadata_mut()
                .insert("xcc-snapshot-marker", "1".parse().expect("ascii"));
        }
        let mut client = rd1::discovery_service_client::DiscoveryServiceClient::new(ch);
        let resp = client.establish_stream(req).await?;
        let marker = resp.metadata().get("xcc-snapshot-marker").is_some();
        Ok(Self {
            tx,
            rx: resp.into_inner(),
            marker,
        })
    }

    /// Next response (bounded wait); panics on timeout or stream end.
    pub async fn next(&mut self) -> Seen {
        let msg = tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("response in time")
            .expect("stream ok")
            .expect("stream open");
        decode(msg)
    }

    /// Next item, or the stream's terminal status.
    pub async fn next_or_status(&mut self) -> Result<Option<Seen>, tonic::Status> {
        let msg = tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("response in time")?;
        Ok(msg.map(decode))
    }

    pub async fn ack(&self, nonce: &str) {
        self.tx
            .send(rd1::StreamRequest {
                resource_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
                response_nonce: nonce.into(),
                status: Some(Default::default()),
            })
            .await
            .expect("send ack");
    }

    pub async fn nack(&self, nonce: &str, message: &str) {
        self.tx
            .send(rd1::StreamRequest {
                resource_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
                response_nonce: nonce.into(),
                status: Some(xcc_proto::google::rpc::Status {
                    code: 14,
                    message: message.into(),
                    details: vec![],
                }),
            })
            .await
            .expect("send nack");
    }

    /// Receive and ACK the next response.
    pub async fn next_acked(&mut self) -> Seen {
        let s = self.next().await;
        self.ack(&s.nonce).await;
        s
    }
}

pub fn decode(msg: rd1::StreamResponse) -> Seen {
    use prost::Message;
    let op = rd1::stream_response::Operation::try_from(msg.operation)
        .unwrap_or(rd1::stream_response::Operation::Unknown);
    let fs = msg
        .resource
        .as_ref()
        .filter(|a| a.type_url == xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL)
        .map(|a| FederatedService::decode(a.value.as_slice()).expect("decodes"));
    Seen {
        nonce: msg.nonce,
        op,
        fqdn: fs.as_ref().map(|f| f.fqdn.clone()),
        fs,
    }
}

/// Wait until `cond` holds for the catalog, re-checking on every catalog event.
pub async fn wait_catalog(
    catalog: &xcc_registry::Catalog,
    what: &str,
    cond: impl Fn(&xcc_registry::Catalog) -> bool,
) {
    let mut rx = catalog.subscribe();
    let fut = async {
        loop {
            if cond(catalog) {
                return;
            }
            match rx.recv().await {
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => panic!("catalog closed"),
            }
        }
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for: {what}"));
}

pub fn imported_fqdns(catalog: &xcc_registry::Catalog, remote: &str) -> Vec<String> {
    catalog
        .list(&xcc_registry::catalog::ListFilter {
            source: Some(Source::Remote(remote.into())),
            ..Default::default()
        })
        .iter()
        .map(|e| e.fqdn.to_string())
        .collect()
}

/// A Hamlet server that behaves like the Go reference (hamlet-2020 `pkg/server`): strict
/// lock-step (one response, then block for one request), empty nonces, no marker, CREATE for the
/// snapshot. It records every request it receives. `fail_with` makes it reject streams.
#[derive(Clone, Default)]
pub struct GoLikeServer {
    pub state: std::sync::Arc<std::sync::Mutex<Vec<FederatedService>>>,
    pub requests: std::sync::Arc<std::sync::Mutex<Vec<rd1::StreamRequest>>>,
    pub calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub fail_with: Option<tonic::Code>,
    /// Number of requests recorded so far, observable without polling.
    pub recorded: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
}

impl GoLikeServer {
    fn record(
        requests: &std::sync::Arc<std::sync::Mutex<Vec<rd1::StreamRequest>>>,
        recorded: &tokio::sync::watch::Sender<usize>,
        req: rd1::StreamRequest,
    ) {
        let n = {
            let mut r = requests.lock().expect("lock");
            r.push(req);
            r.len()
        };
        recorded.send_replace(n);
    }

    /// Wait until at least `n` requests were recorded.
    pub async fn wait_requests(&self, n: usize) {
        let mut rx = self.recorded.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|c| *c >= n))
            .await
            .expect("requests in time")
            .expect("server alive");
    }
}

pub fn fs(fqdn: &str, ip: &str) -> FederatedService {
    let mut labels = BTreeMap::new();
    labels.insert(
        "connectivity.tanzu.vmware.com/service-port".to_string(),
        "443".to_string(),
    );
    FederatedService {
        name: fqdn.into(),
        fqdn: fqdn.into(),
        id: fqdn.into(),
        protocols: vec!["https".into()],
        labels,
        endpoints: vec![
            xcc_proto::federation::types::v1alpha1::federated_service::Endpoint {
                address: ip.into(),
                port: 443,
            },
        ],
        ..Default::default()
    }
}

#[tonic::async_trait]
impl rd1::discovery_service_server::DiscoveryService for GoLikeServer {
    type EstablishStreamStream = ReceiverStream<Result<rd1::StreamResponse, tonic::Status>>;

    async fn establish_stream(
        &self,
        request: tonic::Request<tonic::Streaming<rd1::StreamRequest>>,
    ) -> Result<tonic::Response<Self::EstablishStreamStream>, tonic::Status> {
        use prost::Message;
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(code) = self.fail_with {
            return Err(tonic::Status::new(code, "rejected by test server"));
        }
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| tonic::Status::cancelled("eof"))?;
        Self::record(&self.requests, &self.recorded, first);
        let snapshot = self.state.lock().expect("lock").clone();
        let (tx, rx) = mpsc::channel(1);
        let requests = self.requests.clone();
        let recorded = self.recorded.clone();
        tokio::spawn(async move {
            for item in snapshot {
                let resp = rd1::StreamResponse {
                    nonce: String::new(),
                    resource_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
                    resource: Some(prost_types::Any {
                        type_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
                        value: item.encode_to_vec(),
                    }),
                    operation: rd1::stream_response::Operation::Create as i32,
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
                match inbound.message().await {
                    Ok(Some(req)) => Self::record(&requests, &recorded, req),
                    _ => return,
                }
            }
            // Then idle, but keep reading so extra messages would be recorded.
            while let Ok(Some(req)) = inbound.message().await {
                Self::record(&requests, &recorded, req);
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }
}

/// Serve `server` over mTLS on a fresh loopback port.
pub async fn serve_go_like(
    server: GoLikeServer,
    files: TlsFiles,
) -> (SocketAddr, CancellationToken) {
    let tls = ReloadingTls::load(files).expect("tls");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cancel = CancellationToken::new();
    let incoming = xcc_certs::server::tls_incoming(listener, tls, cancel.clone());
    let c = cancel.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(rd1::discovery_service_server::DiscoveryServiceServer::new(
                server,
            ))
            .serve_with_incoming_shutdown(incoming, c.cancelled())
            .await
    });
    (addr, cancel)
}

pub fn remote(
    name: &str,
    addr: SocketAddr,
    domains: &[&str],
) -> xcc_registry::hamlet::client::RemoteSpec {
    xcc_registry::hamlet::client::RemoteSpec {
        name: name.into(),
        address: addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
        allowed_domains: domains.iter().map(|s| s.to_string()).collect(),
    }
}

/// Wait until the named peer satisfies `cond`, re-checking on every peer change. A name ending
/// in `@` matches consumers of that identity (`west@127.0.0.1:port`).
pub async fn wait_peer(
    reg: &Registry,
    name: &str,
    what: &str,
    cond: impl Fn(&xcc_registry::peers::PeerStats) -> bool,
) {
    let mut rx = reg.peers.subscribe();
    let fut = async {
        loop {
            if reg.peers.list().iter().any(|p| {
                (p.name == name || (name.ends_with('@') && p.name.starts_with(name))) && cond(p)
            }) {
                return;
            }
            if rx.changed().await.is_err() {
                panic!("peer table dropped");
            }
        }
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for peer {name}: {what}"));
}

/// Wait until `reg`'s federation level satisfies `cond`, re-checking on every change of the
/// level or the catalog.
pub async fn wait_level(reg: &Registry, what: &str, cond: impl Fn(&Registry) -> bool) {
    let mut level = reg.level.subscribe();
    let mut cat = reg.catalog.subscribe();
    let fut = async {
        loop {
            if cond(reg) {
                return;
            }
            tokio::select! {
                r = level.changed() => { if r.is_err() { panic!("level dropped") } }
                _ = cat.recv() => {}
            }
        }
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out on {}: {what}", reg.cluster));
}

/// Logs written while the guard lives (this thread only: `#[tokio::test]` runs the registry's
/// tasks on it).
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    pub fn start(&self) -> tracing::subscriber::DefaultGuard {
        let me = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || me.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    /// The WARN lines that contain `needle`.
    pub fn warnings(&self, needle: &str) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().expect("log buffer")).to_string();
        text.lines()
            .filter(|l| l.contains(" WARN ") && l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}
