//! The xcc PKI (rcgen): trust domain and names go in, PEM certificates and keys come out.
//!
//! [`Ca`] is a self-signed ECDSA P-256 CA for one trust domain; [`Ca::issue`] signs leaf certificates that
//! carry an xcc [`Identity`](crate::Identity) and work both as TLS server and TLS client certificate. The
//! directory helpers back the CLI (`xcc certs init` / `xcc certs issue`) and write the same layout as a
//! cert-manager Secret (`tls.crt`, `tls.key`, `ca.crt`), each file replaced atomically so a watching
//! [`ReloadingTls`](crate::ReloadingTls) never reads a half-written file.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tempfile::NamedTempFile;
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::GeneralName;

use crate::error::CertError;
use crate::identity::{
    is_dns_name, is_dns1123_label, parse_trust_domain_uri, path_kind, spiffe_uri,
};
use crate::reload::TlsFiles;

/// File names of a CA directory and of a cert-manager style TLS Secret.
pub const CA_CERT_FILE: &str = "ca.crt";
/// The CA private key in a CA directory (mode 0600).
pub const CA_KEY_FILE: &str = "ca.key";
/// The leaf certificate (chain) in a TLS directory.
pub const TLS_CERT_FILE: &str = "tls.crt";
/// The leaf private key in a TLS directory (mode 0600).
pub const TLS_KEY_FILE: &str = "tls.key";

/// CA lifetime: ten years, long enough that CA rotation is a planned event, not a surprise.
const CA_VALIDITY: Duration = Duration::days(3650);
/// Default leaf lifetime: one year (cert-manager deployments usually renew far sooner).
const LEAF_VALIDITY: Duration = Duration::days(365);
/// Backdating of `not_before`, so peers whose clocks run behind still accept a freshly issued certificate.
const CLOCK_SKEW: Duration = Duration::hours(1);

const DNS_RULE: &str = "must be a lowercase DNS name (dot-separated DNS-1123 labels)";
const LABEL_RULE: &str = "must be a DNS-1123 label (lowercase alphanumerics and '-', 1-63 characters, no leading or trailing '-')";

/// A certificate authority for one trust domain.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    trust_domain: String,
    issuer: Issuer<'static, KeyPair>,
}

impl fmt::Debug for Ca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is deliberately left out.
        f.debug_struct("Ca")
            .field("trust_domain", &self.trust_domain)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// Generates a self-signed CA: ECDSA P-256, CN `xcc CA <trust_domain>`, URI SAN
    /// `spiffe://<trust_domain>`, valid for ten years, key usage keyCertSign + cRLSign, BasicConstraints CA.
    pub fn generate(trust_domain: &str) -> Result<Ca, CertError> {
        check_name(
            "trust domain",
            trust_domain,
            is_dns_name(trust_domain),
            DNS_RULE,
        )?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(&format!("xcc CA {trust_domain}"));
        params.subject_alt_names = vec![SanType::URI(spiffe_uri(trust_domain, None).try_into()?)];
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - CLOCK_SKEW;
        params.not_after = now + CA_VALIDITY;
        let cert = params.self_signed(&key)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            trust_domain: trust_domain.to_owned(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads a CA from its PEM certificate and PEM private key. The trust domain is read back from the CA
    /// certificate's `spiffe://<trust-domain>` URI SAN; the key must match the certificate.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, CertError> {
        Self::from_named_pem(cert_pem, "CA certificate PEM", key_pem, "CA key PEM")
    }

    fn from_named_pem(
        cert_pem: &str,
        cert_file: &str,
        key_pem: &str,
        key_file: &str,
    ) -> Result<Ca, CertError> {
        let cert_der = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .next()
            .ok_or_else(|| CertError::NoCertificate {
                file: cert_file.to_owned(),
            })?
            .map_err(|source| CertError::Pem {
                file: cert_file.to_owned(),
                source,
            })?;
        let bad_cert = |detail: String| CertError::BadCertificate {
            file: cert_file.to_owned(),
            detail,
        };
        let (_, x509) =
            x509_parser::parse_x509_certificate(&cert_der).map_err(|e| bad_cert(e.to_string()))?;
        let is_ca = x509
            .basic_constraints()
            .map_err(|e| bad_cert(e.to_string()))?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(CertError::NotCa {
                file: cert_file.to_owned(),
            });
        }
        let trust_domain = x509
            .subject_alternative_name()
            .map_err(|e| bad_cert(e.to_string()))?
            .into_iter()
            .flat_map(|san| san.value.general_names.iter())
            .find_map(|name| match name {
                GeneralName::URI(uri) => parse_trust_domain_uri(uri),
                _ => None,
            })
            .ok_or_else(|| CertError::NoTrustDomain {
                file: cert_file.to_owned(),
            })?
            .to_owned();
        // rcgen panics on a relative distinguished name without attributes; refuse such input first.
        if x509.subject().iter().any(|rdn| rdn.iter().count() != 1) {
            return Err(bad_cert(
                "subject has a multi-valued or empty relative distinguished name".into(),
            ));
        }

        let key_der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| pem_key_error(e, key_file))?;
        let key = KeyPair::try_from(&key_der).map_err(|e| CertError::BadKey {
            file: key_file.to_owned(),
            detail: e.to_string(),
        })?;
        if key.der_bytes() != x509.public_key().subject_public_key.data.as_ref() {
            return Err(CertError::CaKeyMismatch {
                key: key_file.to_owned(),
                cert: cert_file.to_owned(),
            });
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)?;
        Ok(Ca {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            trust_domain,
            issuer,
        })
    }

    /// The SPIFFE trust domain this CA issues identities in.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PEM (PKCS#8). Handle with care; never log it.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issues a leaf certificate: ECDSA P-256, URI SAN `spiffe://<td>/cluster/<name>` (or `/admin/<name>`)
    /// plus the requested DNS and IP SANs, CN = name, extended key usage serverAuth + clientAuth.
    /// Validity defaults to one hour ago .. one year from now.
    pub fn issue(&self, req: &IssueRequest) -> Result<IssuedCert, CertError> {
        let kind = if req.admin {
            "admin name"
        } else {
            "cluster name"
        };
        check_name(kind, &req.name, is_dns1123_label(&req.name), LABEL_RULE)?;
        for dns in &req.dns {
            // A leading "*." is a wildcard SAN; the rest must be an ordinary DNS name.
            let plain = dns.strip_prefix("*.").unwrap_or(dns);
            check_name("DNS SAN", dns, is_dns_name(plain), DNS_RULE)?;
        }
        let now = OffsetDateTime::now_utc();
        let not_before = req.not_before.unwrap_or(now - CLOCK_SKEW);
        let not_after = req.not_after.unwrap_or(now + LEAF_VALIDITY);
        if not_after <= not_before {
            return Err(CertError::InvalidValidity {
                not_before,
                not_after,
            });
        }

        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(&req.name);
        let uri = spiffe_uri(
            &self.trust_domain,
            Some((path_kind(req.admin), req.name.as_str())),
        );
        params.subject_alt_names = std::iter::once(Ok(SanType::URI(uri.try_into()?)))
            .chain(
                req.dns
                    .iter()
                    .map(|d| Ok(SanType::DnsName(d.clone().try_into()?))),
            )
            .chain(req.ips.iter().map(|ip| Ok(SanType::IpAddress(*ip))))
            .collect::<Result<_, rcgen::Error>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = not_before;
        params.not_after = not_after;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// What to put into a leaf certificate. Build one with [`IssueRequest::cluster`] or
/// [`IssueRequest::admin`] and adjust the public fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssueRequest {
    /// Cluster or admin name (a DNS-1123 label); becomes the spiffe path and the CN.
    pub name: String,
    /// Issue an admin identity (`/admin/<name>`) instead of a cluster identity (`/cluster/<name>`).
    pub admin: bool,
    /// Additional DNS SANs (for peers that verify the server by host name).
    pub dns: Vec<String>,
    /// Additional IP SANs.
    pub ips: Vec<IpAddr>,
    /// Start of validity; default: one hour ago.
    pub not_before: Option<OffsetDateTime>,
    /// End of validity; default: one year from now.
    pub not_after: Option<OffsetDateTime>,
}

impl IssueRequest {
    /// A cluster identity request with no extra SANs and default validity.
    pub fn cluster(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            admin: false,
            dns: Vec::new(),
            ips: Vec::new(),
            not_before: None,
            not_after: None,
        }
    }

    /// An admin identity request with no extra SANs and default validity.
    pub fn admin(name: impl Into<String>) -> Self {
        Self {
            admin: true,
            ..Self::cluster(name)
        }
    }
}

/// A freshly issued leaf certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// The leaf certificate, PEM.
    pub cert_pem: String,
    /// The leaf private key, PEM (PKCS#8).
    pub key_pem: String,
}

impl fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Creates a CA for `trust_domain` in `dir` (created if missing): writes `ca.crt` and `ca.key` (mode 0600).
/// Refuses to overwrite an existing `ca.key` ([`CertError::CaExists`]), atomically: two concurrent calls
/// cannot both succeed.
pub fn init_ca_dir(trust_domain: &str, dir: &Path) -> Result<Ca, CertError> {
    let key_path = dir.join(CA_KEY_FILE);
    if key_path.exists() {
        return Err(CertError::CaExists {
            file: display(&key_path),
        });
    }
    let ca = Ca::generate(trust_domain)?;
    create_dir(dir)?;
    // Write the key to a temporary file, then persist it without clobbering: that fails if the
    // name exists, which makes "refuse to overwrite" race-free, and readers never see a partial key.
    let tmp = write_temp(&key_path, ca.key_pem.as_bytes(), KEY_MODE)?;
    match tmp.persist_noclobber(&key_path) {
        Ok(_) => {}
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => {
            return Err(CertError::CaExists {
                file: display(&key_path),
            });
        }
        Err(e) => return Err(io_error(&key_path, e.error)),
    }
    write_atomic(&dir.join(CA_CERT_FILE), ca.cert_pem.as_bytes(), PUBLIC_MODE)?;
    Ok(ca)
}

/// Loads the CA written by [`init_ca_dir`] from `dir/ca.crt` and `dir/ca.key`.
pub fn load_ca_dir(dir: &Path) -> Result<Ca, CertError> {
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    let cert_pem = read_utf8(&cert_path)?;
    let key_pem = read_utf8(&key_path)?;
    Ca::from_named_pem(
        &cert_pem,
        &display(&cert_path),
        &key_pem,
        &display(&key_path),
    )
}

/// Writes an issued certificate in cert-manager Secret layout: `dir/tls.crt`, `dir/tls.key` (mode 0600)
/// and `dir/ca.crt` (the issuing CA). Each file is replaced atomically (temporary file + rename).
pub fn write_issued(dir: &Path, ca: &Ca, cert: &IssuedCert) -> Result<TlsFiles, CertError> {
    create_dir(dir)?;
    let files = TlsFiles::in_dir(dir);
    write_atomic(&files.key, cert.key_pem.as_bytes(), KEY_MODE)?;
    write_atomic(&files.cert, cert.cert_pem.as_bytes(), PUBLIC_MODE)?;
    write_atomic(&files.ca, ca.cert_pem.as_bytes(), PUBLIC_MODE)?;
    Ok(files)
}

/// Writes `dir/tls.key` and `dir/tls.crt` only, keeping the CA bundle `dir/ca.crt` as it is:
/// how a CA rotation reissues a leaf whose bundle already holds both CAs.
pub fn write_leaf(dir: &Path, cert: &IssuedCert) -> Result<TlsFiles, CertError> {
    create_dir(dir)?;
    let files = TlsFiles::in_dir(dir);
    write_atomic(&files.key, cert.key_pem.as_bytes(), KEY_MODE)?;
    write_atomic(&files.cert, cert.cert_pem.as_bytes(), PUBLIC_MODE)?;
    Ok(files)
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

fn check_name(
    kind: &'static str,
    value: &str,
    ok: bool,
    rule: &'static str,
) -> Result<(), CertError> {
    if ok {
        Ok(())
    } else {
        Err(CertError::InvalidName {
            kind,
            value: value.to_owned(),
            rule,
        })
    }
}

/// Maps a PEM error while looking for a private key: "nothing found" gets its own clear message.
pub(crate) fn pem_key_error(e: rustls_pki_types::pem::Error, file: &str) -> CertError {
    match e {
        rustls_pki_types::pem::Error::NoItemsFound => CertError::NoPrivateKey {
            file: file.to_owned(),
        },
        source => CertError::Pem {
            file: file.to_owned(),
            source,
        },
    }
}

pub(crate) fn display(path: &Path) -> String {
    path.display().to_string()
}

pub(crate) fn io_error(path: &Path, source: io::Error) -> CertError {
    CertError::Io {
        file: display(path),
        source,
    }
}

/// Reads a whole file, naming it in the error.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, CertError> {
    fs::read(path).map_err(|e| io_error(path, e))
}

fn read_utf8(path: &Path) -> Result<String, CertError> {
    fs::read_to_string(path).map_err(|e| io_error(path, e))
}

fn create_dir(dir: &Path) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|e| io_error(dir, e))
}

/// Private keys: owner read/write only.
const KEY_MODE: u32 = 0o600;
/// Certificates are public.
const PUBLIC_MODE: u32 = 0o644;

/// Replaces `path` atomically: write a temporary file in the same directory, fsync, rename over `path`.
pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    write_temp(path, contents, mode)?
        .persist(path)
        .map_err(|e| io_error(path, e.error))?;
    Ok(())
}

/// Writes `contents` (fsynced) to a fresh temporary file beside `path`, created with `mode`
/// (less the umask); it is removed unless persisted.
fn write_temp(path: &Path, contents: &[u8], mode: u32) -> Result<NamedTempFile, CertError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut builder = tempfile::Builder::new();
    let prefix = format!(".{name}.tmp-");
    builder.prefix(&prefix);
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(mode));
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = builder.tempfile_in(dir).map_err(|e| io_error(dir, e))?;
    file.write_all(contents)
        .and_then(|()| file.as_file().sync_all())
        .map_err(|e| io_error(file.path(), e))?;
    Ok(file)
}
