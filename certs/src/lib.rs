//! xcc-certs: the PKI and mutual-TLS layer every xcc process shares.
//!
//! What flows through this crate: PEM files on disk (a CA directory for the CLI, or a cert-manager style
//! Secret mount with `ca.crt`, `tls.crt`, `tls.key`) become validated [`TlsMaterial`], published on a
//! `tokio::sync::watch` channel by [`ReloadingTls`]. Every new TLS connection (server side via
//! [`tls_incoming`], client side via [`TlsConnector`]) takes the latest material, so certificate rotation
//! needs no restart. The verified peer certificate is turned into an [`Identity`] and reaches tonic handlers
//! as [`PeerInfo`] (see [`peer_info`]).
//!
//! Trust model: one CA bundle per process; both directions require a certificate chaining to it (fail
//! closed: no certificate, no handshake). Identities are SPIFFE-style URI SANs
//! (`spiffe://<trust-domain>/cluster/<name>`, `.../admin/<name>`), see [`identity`].
//!
//! All rustls configurations are built with the `ring` provider explicitly, so this crate works whether or
//! not a process-wide default provider has been installed; binaries still call [`install_crypto_provider`]
//! once in `main` for any other rustls user in the process.

pub mod bundle;
pub mod client;
mod error;
pub mod explain;
pub mod identity;
pub mod pki;
pub mod reload;
pub mod server;

use std::sync::{Arc, OnceLock};

pub use client::{TlsConnector, roots_from_pem};
pub use error::{CertError, IdentityError};
pub use identity::{Identity, identity_from_der};
pub use pki::{Ca, IssueRequest, IssuedCert, init_ca_dir, load_ca_dir, write_issued};
pub use reload::{ReloadingTls, TlsFiles, TlsMaterial};
pub use server::{
    ConnInfo, ConnectionCloser, PeerInfo, TlsConn, connection_closer, peer_info, tls_incoming,
    tls_incoming_for,
};

/// Installs rustls' `ring` crypto provider as the process-wide default.
///
/// Idempotent: if a default provider is already installed (by an earlier call or by another component),
/// this does nothing.
pub fn install_crypto_provider() {
    // `install_default` only fails when a provider is already installed, which is exactly the state we want.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

/// The crypto provider every configuration in this crate is built with (ring, independent of the process
/// default).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// ALPN protocol ids offered and required on every xcc connection: gRPC runs over HTTP/2 only.
pub(crate) const ALPN_H2: &[u8] = b"h2";
