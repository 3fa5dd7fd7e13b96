//! Error types: every failure to read, parse, validate or issue certificate material becomes a
//! [`CertError`] whose message names the file involved; identity extraction failures are [`IdentityError`].
//!
//! Messages never contain key material: they carry file names, PEM/DER structure errors and X.509 facts.

use std::io;

/// Everything that can go wrong while loading, validating or issuing certificates.
///
/// `file` fields hold the path as given (for in-memory input a short description such as
/// "CA certificate PEM"), so messages read like `tls.key: no private key found`.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file could not be read or written.
    #[error("{file}: {source}")]
    Io {
        /// The file involved.
        file: String,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The input is not well-formed PEM.
    #[error("{file}: invalid PEM: {source}")]
    Pem {
        /// The file involved.
        file: String,
        /// What the PEM parser rejected.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// No `CERTIFICATE` section was found.
    #[error("{file}: no certificate found")]
    NoCertificate {
        /// The file involved.
        file: String,
    },
    /// No private key section (PKCS#8, SEC1 or PKCS#1) was found.
    #[error("{file}: no private key found")]
    NoPrivateKey {
        /// The file involved.
        file: String,
    },
    /// A private key was found but cannot be used (unsupported algorithm or malformed).
    #[error("{file}: unusable private key: {detail}")]
    BadKey {
        /// The file involved.
        file: String,
        /// Why the key was rejected.
        detail: String,
    },
    /// A certificate is not parsable X.509.
    #[error("{file}: invalid certificate: {detail}")]
    BadCertificate {
        /// The file involved.
        file: String,
        /// What the parser rejected.
        detail: String,
    },
    /// The private key does not belong to the (first) certificate.
    #[error("{key}: private key does not match the certificate in {cert}")]
    KeyMismatch {
        /// The key file.
        key: String,
        /// The certificate file.
        cert: String,
    },
    /// The leaf certificate does not chain to any CA of the bundle.
    #[error("{cert}: certificate is not signed by any CA in {ca}")]
    NotSignedByCa {
        /// The certificate file.
        cert: String,
        /// The CA bundle file.
        ca: String,
    },
    /// The leaf certificate is outside its validity period.
    #[error("{cert}: certificate is expired or not yet valid")]
    NotValidNow {
        /// The certificate file.
        cert: String,
    },
    /// The leaf certificate chains to the bundle but is unusable for another reason (e.g. wrong extended
    /// key usage).
    #[error("{cert}: certificate rejected when verified against {ca}: {source}")]
    Untrusted {
        /// The certificate file.
        cert: String,
        /// The CA bundle file.
        ca: String,
        /// The verifier's verdict.
        #[source]
        source: rustls::Error,
    },
    /// A CA certificate in a trust bundle cannot be used as a trust anchor.
    #[error("{file}: unusable CA certificate: {source}")]
    BadCaCertificate {
        /// The bundle file.
        file: String,
        /// Why the certificate was rejected.
        #[source]
        source: rustls::Error,
    },
    /// A certificate meant to be a CA lacks `BasicConstraints CA:TRUE`.
    #[error("{file}: certificate is not a CA (BasicConstraints CA:TRUE missing)")]
    NotCa {
        /// The file involved.
        file: String,
    },
    /// The CA certificate carries no `spiffe://<trust-domain>` URI SAN.
    #[error("{file}: CA certificate has no spiffe://<trust-domain> URI SAN")]
    NoTrustDomain {
        /// The file involved.
        file: String,
    },
    /// The leaf certificate carries no usable identity.
    #[error("{file}: {source}")]
    FileIdentity {
        /// The certificate file.
        file: String,
        /// Why no identity could be derived.
        #[source]
        source: IdentityError,
    },
    /// A reload would change our own identity. The process's identity is fixed at start-up (peers match
    /// the names we claim against it), so this needs a restart.
    #[error("{file}: certificate identity changed from {from} to {to}; restart to change identity")]
    IdentityChanged {
        /// The certificate file.
        file: String,
        /// The identity in service (spiffe ID, or `external/<name>`).
        from: String,
        /// The identity in the new certificate.
        to: String,
    },
    /// Identity extraction from a DER certificate failed.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// A name given to the PKI (trust domain, cluster name, DNS SAN) is malformed.
    #[error("invalid {kind} {value:?}: {rule}")]
    InvalidName {
        /// What the name is for ("trust domain", "cluster name", "DNS SAN", "server name").
        kind: &'static str,
        /// The rejected value.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// `not_after` is not later than `not_before`.
    #[error(
        "invalid validity period: not_after ({not_after}) must be later than not_before ({not_before})"
    )]
    InvalidValidity {
        /// Requested start.
        not_before: time::OffsetDateTime,
        /// Requested end.
        not_after: time::OffsetDateTime,
    },
    /// `init_ca_dir` found an existing CA key.
    #[error("{file} already exists; refusing to overwrite an existing CA key")]
    CaExists {
        /// The existing key file.
        file: String,
    },
    /// The CA key does not belong to the CA certificate.
    #[error("{key}: CA key does not match the CA certificate in {cert}")]
    CaKeyMismatch {
        /// The key file.
        key: String,
        /// The certificate file.
        cert: String,
    },
    /// A PEM bundle contained no CA certificate.
    #[error("{file}: no CA certificate found in bundle")]
    EmptyBundle {
        /// The bundle (or its description).
        file: String,
    },
    /// rcgen refused to build or sign a certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A rustls configuration could not be built.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Why a certificate yields no xcc [`Identity`](crate::Identity).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The DER is not a parsable X.509 certificate.
    #[error("certificate is not valid X.509: {0}")]
    Parse(String),
    /// Neither a spiffe URI SAN, a DNS SAN nor a subject CN is present.
    #[error("certificate has no xcc identity and no DNS SAN or CN")]
    NoIdentity,
    /// More than one spiffe URI SAN (SPIFFE allows exactly one).
    #[error("certificate carries {0} spiffe URI SANs; exactly one is allowed")]
    MultipleSpiffeIds(usize),
    /// A spiffe URI SAN that is not a valid xcc identity.
    #[error("certificate carries an invalid xcc identity {uri:?}: {reason}")]
    InvalidSpiffeId {
        /// The URI as found in the certificate.
        uri: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}
