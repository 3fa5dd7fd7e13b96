//! Outbound mutual TLS for tonic: a `http::Uri` goes in, a TLS stream to that address comes out, with the
//! server verified against our CA bundle (or given roots) and our current certificate presented.
//!
//! [`TlsConnector`] is a `tower::Service<Uri>` for `tonic::transport::Endpoint::connect_with_connector`
//! (or `_lazy`). Each new connection takes the latest material of [`ReloadingTls`], so reconnects after a
//! rotation present the new certificate. Use an `http://host:port` endpoint URI: TLS is done here, not by
//! tonic; the `https` scheme is accepted too and only changes the default port.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::ALPN_H2;
use crate::error::CertError;
use crate::explain::{Explained, Side};
use crate::identity::{Identity, parse_identity};
use crate::reload::{ReloadingTls, parse_certs, root_store};
use crate::server::HANDSHAKE_TIMEOUT;

/// Connects to xcc (or Hamlet) servers over mutual TLS. Clones share the configuration cache and
/// [`last_peer`](Self::last_peer).
#[derive(Clone)]
pub struct TlsConnector {
    tls: ReloadingTls,
    server_name: ServerName<'static>,
    roots: Option<Arc<RootCertStore>>,
    state: Arc<Mutex<ConnectorState>>,
}

#[derive(Default)]
struct ConnectorState {
    /// Client configuration for explicit roots, built once per material generation.
    config: Option<(u64, Arc<ClientConfig>)>,
    last_peer: Option<Identity>,
}

impl TlsConnector {
    /// A connector that verifies the server as `server_name` (a DNS name or an IP address, also sent as
    /// SNI when it is a DNS name) against `roots`, or against our own CA bundle when `roots` is `None`.
    pub fn new(
        tls: ReloadingTls,
        server_name: String,
        roots: Option<Arc<RootCertStore>>,
    ) -> Result<Self, CertError> {
        let server_name =
            ServerName::try_from(server_name.clone()).map_err(|_| CertError::InvalidName {
                kind: "server name",
                value: server_name,
                rule: "must be a DNS name or an IP address",
            })?;
        Ok(Self {
            tls,
            server_name,
            roots,
            state: Arc::default(),
        })
    }

    /// The identity in the server certificate of the most recent successful handshake.
    pub fn last_peer(&self) -> Option<Identity> {
        self.lock().last_peer.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ConnectorState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn config(&self) -> Arc<ClientConfig> {
        let Some(roots) = &self.roots else {
            return self.tls.client_config(None);
        };
        let generation = self.tls.current().generation;
        let mut state = self.lock();
        match &state.config {
            Some((cached, config)) if *cached == generation => config.clone(),
            _ => {
                let config = self.tls.client_config(Some(roots.clone()));
                state.config = Some((generation, config.clone()));
                config
            }
        }
    }

    async fn connect(self, uri: Uri) -> io::Result<TokioIo<Primed>> {
        let (host, port) = host_port(&uri)?;
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%uri, error = %e, "cannot set TCP_NODELAY");
        }
        let connector = tokio_rustls::TlsConnector::from(self.config());
        let peer = || format!("{host}:{port} (verified as {})", self.server_name.to_str());
        let stream = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            connector.connect(self.server_name.clone(), tcp),
        )
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{}: TLS handshake timed out", peer()),
            )
        })?
        .map_err(|e| explain_handshake_error(e, &peer()))?;
        let conn = stream.get_ref().1;
        if conn.alpn_protocol() != Some(ALPN_H2) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{uri}: server did not negotiate ALPN \"h2\""),
            ));
        }
        let identity = conn
            .peer_certificates()
            .and_then(|certs| certs.first())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "server presented no certificate",
                )
            })
            .and_then(|leaf| {
                parse_identity(leaf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            })?;
        let stream = first_bytes(stream, &peer()).await?;
        tracing::debug!(%uri, server = %identity, "TLS connection established");
        self.lock().last_peer = Some(identity);
        Ok(TokioIo::new(stream))
    }
}

/// How long a new connection waits for the server's first bytes (see [`first_bytes`]).
const FIRST_BYTES_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// With TLS 1.3 the client's side of the handshake ends before the server has verified the
/// client's certificate, so a server that refuses it says so in an alert after the handshake.
/// An HTTP/2 server speaks first (its SETTINGS), so the first read either brings those bytes or
/// that alert: read them here, and a refusal becomes a handshake error with its reason instead
/// of a request that fails with "connection closed". The byte read is replayed to the caller.
/// A server that has said nothing within [`FIRST_BYTES_WAIT`] is used as it is.
async fn first_bytes(mut stream: TlsStream<TcpStream>, peer: &str) -> io::Result<Primed> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(FIRST_BYTES_WAIT, stream.read(&mut first)).await {
        Ok(Ok(1)) => Ok(Primed {
            first: Some(first[0]),
            inner: stream,
        }),
        Ok(Ok(_)) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "server {peer} closed the connection right after the TLS handshake (it may have refused our certificate: see its log)"
            ),
        )),
        Ok(Err(e)) => Err(explain_handshake_error(e, peer)),
        Err(_) => Ok(Primed {
            first: None,
            inner: stream,
        }),
    }
}

/// A client TLS stream whose first byte was already read (by [`first_bytes`]) and is handed out
/// again before anything else.
#[derive(Debug)]
pub struct Primed {
    first: Option<u8>,
    inner: TlsStream<TcpStream>,
}

impl Primed {
    /// The TLS stream underneath (its connection state, the peer's certificates).
    pub fn get_ref(&self) -> &TlsStream<TcpStream> {
        &self.inner
    }
}

impl AsyncRead for Primed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() > 0
            && let Some(byte) = this.first.take()
        {
            buf.put_slice(&[byte]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Primed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A failed handshake as one sentence (see [`crate::explain`]), its kind kept; the rustls error
/// stays reachable as the source.
fn explain_handshake_error(e: io::Error, peer: &str) -> io::Error {
    let kind = e.kind();
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(tls) => io::Error::new(kind, Explained::new(tls.clone(), Side::Client, peer)),
        None if kind == io::ErrorKind::UnexpectedEof => io::Error::new(
            kind,
            format!(
                "server {peer} closed the connection during the TLS handshake (not an xcc TLS port, or it refused us: see its log)"
            ),
        ),
        None => e,
    }
}

impl tower::Service<Uri> for TlsConnector {
    type Response = TokioIo<Primed>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send + 'static>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    /// Connects TCP to the URI's host and port, performs the TLS handshake with the latest client
    /// configuration, and requires ALPN `h2` and a server certificate with an [`Identity`].
    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// Host (IPv6 brackets removed) and port (default by scheme) of a URI.
fn host_port(uri: &Uri) -> io::Result<(String, u16)> {
    let invalid =
        |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {what}"));
    let host = uri.host().ok_or_else(|| invalid("no host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(port), _) => port,
        (None, Some("https")) => 443,
        (None, Some("http")) => 80,
        (None, _) => return Err(invalid("no port")),
    };
    Ok((host, port))
}

/// Builds a root store from a PEM CA bundle (e.g. a `RemoteRegistry`'s `serverCA`). An empty bundle, a
/// malformed PEM section or an unusable certificate is an error: an empty trust store would only turn into
/// handshake failures later (XCC v1 silently accepted invalid PEM this way).
pub fn roots_from_pem(pem: &[u8]) -> Result<Arc<RootCertStore>, CertError> {
    const BUNDLE: &str = "CA bundle";
    let certs = parse_certs(pem, BUNDLE).map_err(|e| match e {
        CertError::NoCertificate { file } => CertError::EmptyBundle { file },
        other => other,
    })?;
    Ok(Arc::new(root_store(&certs, BUNDLE)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_from_uri() {
        let cases = [
            ("http://127.0.0.1:8000", ("127.0.0.1", 8000)),
            ("http://[::1]:9000", ("::1", 9000)),
            ("https://east.example.com", ("east.example.com", 443)),
            ("http://east.example.com", ("east.example.com", 80)),
        ];
        for (uri, (host, port)) in cases {
            let uri: Uri = uri.parse().expect("test URI parses");
            assert_eq!(host_port(&uri).ok(), Some((host.to_owned(), port)), "{uri}");
        }
        let no_port: Uri = "east.example.com".parse().expect("test URI parses");
        let err = host_port(&no_port).err().map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("east.example.com: no port"));
    }
}
