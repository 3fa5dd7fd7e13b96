//! Test helpers shared by the integration tests: a CA, TLS directories, a server driven by
//! `tls_incoming`, raw rustls clients and metric scraping.
//!
//! Tests run on Tokio's default current-thread runtime. That makes "the server task finished handling a
//! failed handshake before the client saw the alert" a guarantee, not a race: the server writes the alert
//! and records the failure within one poll of its task, and the client task only runs afterwards.
#![allow(dead_code)] // Not every helper is used by a test today.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use prometheus_client::registry::Registry;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tempfile::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;
use xcc_certs::{Ca, IssueRequest, IssuedCert, ReloadingTls, TlsConn, tls_incoming, write_issued};

/// Trust domain of the test CA.
pub const TD: &str = "xcc.test";
/// DNS name in the test server's certificate.
pub const SERVER_NAME: &str = "east.xcc.test";
/// Upper bound for anything a test waits on; generous so a loaded CI machine does not flake.
pub const WAIT: Duration = Duration::from_secs(20);

/// Awaits `f`, failing the test if it takes longer than [`WAIT`].
pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

pub fn cluster(name: &str) -> xcc_certs::Identity {
    xcc_certs::Identity::Cluster {
        trust_domain: TD.into(),
        name: name.into(),
    }
}

pub fn ca() -> Ca {
    Ca::generate(TD).expect("generate CA")
}

/// The server certificate request: cluster "east", DNS SAN `east.xcc.test`, IP SAN 127.0.0.1.
pub fn server_request() -> IssueRequest {
    IssueRequest {
        dns: vec![SERVER_NAME.into()],
        ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        ..IssueRequest::cluster("east")
    }
}

/// Issues `req` from `ca`, writes it to a fresh directory and loads it.
pub fn tls_dir(ca: &Ca, req: &IssueRequest) -> (TempDir, ReloadingTls, IssuedCert) {
    let dir = TempDir::new().expect("temp dir");
    let issued = ca.issue(req).expect("issue");
    let files = write_issued(dir.path(), ca, &issued).expect("write issued");
    let tls = ReloadingTls::load(files).expect("load TLS material");
    (dir, tls, issued)
}

pub fn leaf_der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("certificate PEM")
}

pub fn key_der(pem: &str) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).expect("key PEM")
}

pub fn roots_of(ca: &Ca) -> Arc<RootCertStore> {
    xcc_certs::roots_from_pem(ca.cert_pem().as_bytes()).expect("CA roots")
}

/// A server running `tls_incoming`, drained by a task into `conns`.
pub struct Server {
    pub addr: SocketAddr,
    pub conns: mpsc::UnboundedReceiver<io::Result<TlsConn>>,
    pub cancel: CancellationToken,
}

pub async fn start_server(tls: ReloadingTls) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let cancel = CancellationToken::new();
    let mut incoming = Box::pin(tls_incoming(listener, tls, cancel.clone()));
    let (tx, conns) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(conn) = incoming.next().await {
            if tx.send(conn).is_err() {
                break;
            }
        }
    });
    Server {
        addr,
        conns,
        cancel,
    }
}

impl Server {
    /// The next connection the server yielded.
    pub async fn next_conn(&mut self) -> TlsConn {
        within("a server connection", self.conns.recv())
            .await
            .expect("server stream ended")
            .expect("server stream yielded an error")
    }

    /// Asserts that the server has yielded nothing since the last `next_conn`.
    pub fn assert_nothing_yielded(&mut self) {
        match self.conns.try_recv() {
            Err(mpsc::error::TryRecvError::Empty) => {}
            Ok(Ok(conn)) => panic!("server yielded an unexpected connection: {conn:?}"),
            Ok(Err(e)) => panic!("server yielded an unexpected error: {e}"),
            Err(mpsc::error::TryRecvError::Disconnected) => panic!("server stream ended"),
        }
    }
}

/// A rustls client configuration built by hand, for certificates `ReloadingTls` would refuse to load.
pub fn raw_client_config(
    roots: Arc<RootCertStore>,
    client_cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Arc<ClientConfig> {
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
    let mut config = match client_cert {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

pub async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(SERVER_NAME).expect("server name");
    within(
        "a TLS handshake",
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
}

/// Connects and reads; returns the error the client observes on its first read. With TLS 1.3 the client
/// completes its side of the handshake before the server has verified the client certificate, so a
/// rejection arrives as a fatal alert on the first read, not from `connect`. A handshake error fails the
/// test (it would mean the server refused before seeing the client certificate).
pub async fn client_error(addr: SocketAddr, config: Arc<ClientConfig>) -> io::Error {
    use tokio::io::AsyncReadExt;
    let mut stream = match connect(addr, config).await {
        Ok(stream) => stream,
        Err(e) => panic!("expected the client handshake to complete, got: {e}"),
    };
    assert_eq!(
        stream.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    let mut buf = [0u8; 1];
    match within("the first read", stream.read(&mut buf)).await {
        Ok(n) => panic!("expected the connection to be rejected, read {n} bytes"),
        Err(e) => e,
    }
}

/// The rustls error inside an I/O error from tokio-rustls.
pub fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    let inner = e.get_ref()?;
    inner.downcast_ref::<rustls::Error>().or_else(|| {
        inner
            .downcast_ref::<xcc_certs::explain::Explained>()
            .map(|x| x.tls_error())
    })
}

/// The certificate the server presented on a client connection.
pub fn server_cert(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .expect("server certificate")
        .clone()
        .into_owned()
}

/// The value of one sample (`name{labels}`) in the OpenMetrics text of `tls`'s metrics.
pub fn metric(tls: &ReloadingTls, sample: &str) -> Option<String> {
    let mut registry = Registry::default();
    tls.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode metrics");
    text.lines().find_map(|line| {
        line.strip_prefix(sample)?
            .strip_prefix(' ')
            .map(str::to_owned)
    })
}
