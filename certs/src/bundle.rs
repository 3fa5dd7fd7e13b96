//! CA bundles during a CA rotation: add the new CA to a bundle, remove the old one, and refuse a
//! bundle that would no longer verify the certificate beside it. Every write replaces the file
//! atomically (temporary file + rename), so a reloading process reads the old bundle or the new
//! one, never a mix.
//!
//! The three steps, each applied to every registry's files while they run:
//! 1. `add` the new CA to every bundle (peers now trust leaves of either CA);
//! 2. reissue every leaf from the new CA (its bundle already holds that CA);
//! 3. `remove` the old CA from every bundle (refused while a leaf beside it is still the old CA's).

use std::path::Path;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;

use crate::CertError;
use crate::pki::{display, read_file, write_atomic};
use crate::reload::{parse_certs, root_store};

/// The mode of a public file (a bundle): readable by everyone.
const PUBLIC_MODE: u32 = 0o644;

/// One CA of a bundle, for listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleEntry {
    pub subject: String,
    pub not_after: time::OffsetDateTime,
    /// The serial number, hex (random per CA: tells two CAs of one name apart).
    pub serial: String,
}

/// The CAs of `pem`, in order.
pub fn entries(pem: &[u8], file: &str) -> Result<Vec<BundleEntry>, CertError> {
    parse_certs(pem, file)?
        .iter()
        .map(|der| {
            let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| {
                CertError::BadCertificate {
                    file: file.to_owned(),
                    detail: e.to_string(),
                }
            })?;
            Ok(BundleEntry {
                subject: cert.subject().to_string(),
                not_after: cert.validity().not_after.to_datetime(),
                serial: cert.raw_serial_as_string().replace(':', ""),
            })
        })
        .collect()
}

/// Refuses a certificate that is not a CA (no `BasicConstraints CA:TRUE`): a leaf in a bundle
/// would be taken as a trust anchor.
fn check_ca(der: &CertificateDer<'_>, file: &str) -> Result<(), CertError> {
    let bad = |detail: String| CertError::BadCertificate {
        file: file.to_owned(),
        detail,
    };
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| bad(e.to_string()))?;
    let is_ca = cert
        .basic_constraints()
        .map_err(|e| bad(e.to_string()))?
        .is_some_and(|bc| bc.value.ca);
    if is_ca {
        Ok(())
    } else {
        Err(CertError::NotCa {
            file: file.to_owned(),
        })
    }
}

/// PEM text of `certs`, one block each.
fn encode(certs: &[CertificateDer<'_>]) -> String {
    use base64::Engine as _;
    let mut out = String::new();
    for c in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

/// `bundle` with every CA of `add` appended (those already in it are kept once). Returns the new
/// PEM and how many CAs were added.
pub fn add(
    bundle: &[u8],
    bundle_file: &str,
    add: &[u8],
    add_file: &str,
) -> Result<(String, usize), CertError> {
    let mut certs = parse_certs(bundle, bundle_file)?;
    let new = parse_certs(add, add_file)?;
    // Each must be a CA, usable as a trust anchor, before it goes in.
    for c in &new {
        check_ca(c, add_file)?;
    }
    root_store(&new, add_file)?;
    let mut added = 0;
    for c in new {
        if !certs.contains(&c) {
            certs.push(c);
            added += 1;
        }
    }
    Ok((encode(&certs), added))
}

/// Why a CA cannot be removed from a bundle.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("{bundle} does not hold the CA of {ca}")]
    NotInBundle { bundle: String, ca: String },
    #[error("{bundle} would be empty without the CA of {ca}")]
    WouldBeEmpty { bundle: String, ca: String },
    #[error(
        "{cert} is issued by the CA being removed from {bundle}: reissue it from the new CA first (step 2), or this registry could not prove who it is"
    )]
    LeafStillOld { cert: String, bundle: String },
}

/// `bundle` without the CAs of `remove`; refused when `leaf` (the certificate beside the bundle,
/// when there is one) would no longer chain to what remains.
pub fn remove(
    bundle: &[u8],
    bundle_file: &str,
    remove: &[u8],
    remove_file: &str,
    leaf: Option<(&[u8], &str)>,
) -> Result<String, RemoveError> {
    let certs = parse_certs(bundle, bundle_file)?;
    let gone = parse_certs(remove, remove_file)?;
    if !gone.iter().any(|g| certs.contains(g)) {
        return Err(RemoveError::NotInBundle {
            bundle: bundle_file.to_owned(),
            ca: remove_file.to_owned(),
        });
    }
    let kept: Vec<_> = certs.into_iter().filter(|c| !gone.contains(c)).collect();
    if kept.is_empty() {
        return Err(RemoveError::WouldBeEmpty {
            bundle: bundle_file.to_owned(),
            ca: remove_file.to_owned(),
        });
    }
    if let Some((pem, file)) = leaf
        && !verifies(&kept, bundle_file, pem, file)?
    {
        return Err(RemoveError::LeafStillOld {
            cert: file.to_owned(),
            bundle: bundle_file.to_owned(),
        });
    }
    Ok(encode(&kept))
}

/// Whether the chain in `leaf_pem` verifies against `roots` (as a client certificate, the use
/// every xcc certificate has).
fn verifies(
    roots: &[CertificateDer<'static>],
    roots_file: &str,
    leaf_pem: &[u8],
    leaf_file: &str,
) -> Result<bool, CertError> {
    let chain = parse_certs(leaf_pem, leaf_file)?;
    let store = std::sync::Arc::new(root_store(roots, roots_file)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(store, crate::provider())
        .build()
        .map_err(|e| CertError::Config(e.to_string()))?;
    let (leaf, rest) = chain
        .split_first()
        .ok_or_else(|| CertError::NoCertificate {
            file: leaf_file.to_owned(),
        })?;
    Ok(verifier
        .verify_client_cert(leaf, rest, UnixTime::now())
        .is_ok())
}

/// Whether the bundle in `bundle_file` holds every CA of `ca_file`.
pub fn holds(bundle_file: &Path, ca_file: &Path) -> Result<bool, CertError> {
    let bundle = parse_certs(&read_file(bundle_file)?, &display(bundle_file))?;
    let ca = parse_certs(&read_file(ca_file)?, &display(ca_file))?;
    Ok(ca.iter().all(|c| bundle.contains(c)))
}

/// [`add`] on files: `bundle_file` gets `ca_file`'s CAs. Returns how many were added.
pub fn add_file(bundle_file: &Path, ca_file: &Path) -> Result<usize, CertError> {
    let (pem, added) = add(
        &read_file(bundle_file)?,
        &display(bundle_file),
        &read_file(ca_file)?,
        &display(ca_file),
    )?;
    if added > 0 {
        write_atomic(bundle_file, pem.as_bytes(), PUBLIC_MODE)?;
    }
    Ok(added)
}

/// [`remove`] on files, checking `cert_file` when it exists.
pub fn remove_file(
    bundle_file: &Path,
    ca_file: &Path,
    cert_file: Option<&Path>,
) -> Result<(), RemoveError> {
    let leaf = match cert_file {
        Some(f) if f.exists() => Some((read_file(f)?, display(f))),
        _ => None,
    };
    let pem = remove(
        &read_file(bundle_file)?,
        &display(bundle_file),
        &read_file(ca_file)?,
        &display(ca_file),
        leaf.as_ref().map(|(p, f)| (p.as_slice(), f.as_str())),
    )?;
    write_atomic(bundle_file, pem.as_bytes(), PUBLIC_MODE)?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pki::{Ca, IssueRequest};

    fn ca() -> Ca {
        Ca::generate("xcc.test").unwrap()
    }

    #[test]
    fn add_appends_once_and_remove_takes_it_out_again() {
        let (old, new) = (ca(), ca());
        let (both, added) = add(
            old.cert_pem().as_bytes(),
            "b",
            new.cert_pem().as_bytes(),
            "n",
        )
        .unwrap();
        assert_eq!(added, 1);
        assert_eq!(entries(both.as_bytes(), "b").unwrap().len(), 2);
        let (again, added) = add(both.as_bytes(), "b", new.cert_pem().as_bytes(), "n").unwrap();
        assert_eq!(
            (added, entries(again.as_bytes(), "b").unwrap().len()),
            (0, 2)
        );

        // The leaf beside the bundle is the new CA's: the old one may go.
        let leaf = new.issue(&IssueRequest::cluster("east")).unwrap();
        let only_new = remove(
            both.as_bytes(),
            "b",
            old.cert_pem().as_bytes(),
            "o",
            Some((leaf.cert_pem.as_bytes(), "tls.crt")),
        )
        .unwrap();
        let left = entries(only_new.as_bytes(), "b").unwrap();
        assert_eq!(left, entries(new.cert_pem().as_bytes(), "n").unwrap());
    }

    #[test]
    fn remove_refuses_what_would_strand_the_leaf_or_empty_the_bundle() {
        let (old, new) = (ca(), ca());
        let (both, _) = add(
            old.cert_pem().as_bytes(),
            "b",
            new.cert_pem().as_bytes(),
            "n",
        )
        .unwrap();
        let old_leaf = old.issue(&IssueRequest::cluster("east")).unwrap();
        let e = remove(
            both.as_bytes(),
            "east/ca.crt",
            old.cert_pem().as_bytes(),
            "pki/ca.crt",
            Some((old_leaf.cert_pem.as_bytes(), "east/tls.crt")),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "east/tls.crt is issued by the CA being removed from east/ca.crt: reissue it from the new CA first (step 2), or this registry could not prove who it is"
        );
        let e = remove(
            old.cert_pem().as_bytes(),
            "b",
            old.cert_pem().as_bytes(),
            "o",
            None,
        )
        .unwrap_err();
        assert!(matches!(e, RemoveError::WouldBeEmpty { .. }), "{e}");
        let e = remove(
            old.cert_pem().as_bytes(),
            "b",
            new.cert_pem().as_bytes(),
            "n",
            None,
        )
        .unwrap_err();
        assert!(matches!(e, RemoveError::NotInBundle { .. }), "{e}");
    }

    #[test]
    fn a_leaf_certificate_is_not_added_as_a_ca() {
        let c = ca();
        let leaf = c.issue(&IssueRequest::cluster("east")).unwrap();
        let e = add(
            c.cert_pem().as_bytes(),
            "b",
            leaf.cert_pem.as_bytes(),
            "tls.crt",
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("tls.crt:"), "{e}");
    }
}
