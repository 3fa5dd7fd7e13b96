//! PKI: CA generation, issuance, identity extraction, CA directory handling and CA bundles.

use std::net::{IpAddr, Ipv4Addr};

use crate::common::{TD, ca, cluster, leaf_der};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};
use xcc_certs::{
    Ca, CertError, Identity, IdentityError, IssueRequest, ReloadingTls, TlsFiles,
    identity_from_der, init_ca_dir, load_ca_dir, roots_from_pem, write_issued,
};

/// A leaf signed by a throwaway rcgen CA, with arbitrary SANs and CN (things `Ca::issue` refuses to make).
fn raw_cert(sans: Vec<SanType>, cn: Option<&str>) -> rustls::pki_types::CertificateDer<'static> {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = Issuer::new(ca_params, ca_key);
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans;
    params.distinguished_name = DistinguishedName::new();
    if let Some(cn) = cn {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    let key = KeyPair::generate().expect("key");
    params.signed_by(&key, &issuer).expect("sign").der().clone()
}

fn uri(s: &str) -> SanType {
    SanType::URI(s.try_into().expect("ia5"))
}

fn dns(s: &str) -> SanType {
    SanType::DnsName(s.try_into().expect("ia5"))
}

fn close_to(actual: OffsetDateTime, expected: OffsetDateTime) -> bool {
    // Certificates store whole seconds and the test takes a moment to run.
    (actual - expected).abs() < Duration::minutes(1)
}

#[test]
fn ca_certificate_has_the_specified_shape() {
    let ca = ca();
    assert_eq!(ca.trust_domain(), TD);
    let der = leaf_der(ca.cert_pem());
    let (_, x509) = X509Certificate::from_der(&der).expect("parse CA");
    let cn: Vec<_> = x509
        .subject()
        .iter_common_name()
        .map(|cn| cn.as_str().ok())
        .collect();
    assert_eq!(cn, [Some("xcc CA xcc.test")]);
    assert_eq!(
        x509.basic_constraints().expect("bc").map(|bc| bc.value.ca),
        Some(true)
    );
    let ku = x509
        .key_usage()
        .expect("ku")
        .expect("key usage present")
        .value;
    assert!(ku.key_cert_sign() && ku.crl_sign(), "key usage {ku}");
    let sans: Vec<_> = x509
        .subject_alternative_name()
        .expect("san")
        .expect("SAN present")
        .value
        .general_names
        .clone();
    assert_eq!(sans, [GeneralName::URI("spiffe://xcc.test")]);
    let now = OffsetDateTime::now_utc();
    assert!(close_to(
        x509.validity().not_after.to_datetime(),
        now + Duration::days(3650)
    ));
    assert!(close_to(
        x509.validity().not_before.to_datetime(),
        now - Duration::hours(1)
    ));
    assert_eq!(
        x509.public_key().algorithm.algorithm,
        x509_parser::oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY
    );
}

#[test]
fn issued_leaf_carries_identity_sans_and_usages() {
    let ca = ca();
    let req = IssueRequest {
        dns: vec!["west.xcc.test".into()],
        ips: vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))],
        ..IssueRequest::cluster("west")
    };
    let issued = ca.issue(&req).expect("issue");
    let der = leaf_der(&issued.cert_pem);
    assert_eq!(identity_from_der(&der).expect("identity"), cluster("west"));

    let (_, x509) = X509Certificate::from_der(&der).expect("parse leaf");
    let cn: Vec<_> = x509
        .subject()
        .iter_common_name()
        .map(|cn| cn.as_str().ok())
        .collect();
    assert_eq!(cn, [Some("west")]);
    let sans = x509
        .subject_alternative_name()
        .expect("san")
        .expect("SAN present")
        .value
        .general_names
        .clone();
    assert_eq!(
        sans,
        [
            GeneralName::URI("spiffe://xcc.test/cluster/west"),
            GeneralName::DNSName("west.xcc.test"),
            GeneralName::IPAddress(&[10, 0, 0, 1]),
        ]
    );
    let eku = x509
        .extended_key_usage()
        .expect("eku")
        .expect("EKU present")
        .value;
    assert!(eku.server_auth && eku.client_auth && !eku.any, "{eku:?}");
    assert_eq!(
        x509.basic_constraints().expect("bc").map(|bc| bc.value.ca),
        Some(false)
    );
    let now = OffsetDateTime::now_utc();
    assert!(close_to(
        x509.validity().not_before.to_datetime(),
        now - Duration::hours(1)
    ));
    assert!(close_to(
        x509.validity().not_after.to_datetime(),
        now + Duration::days(365)
    ));
    let ca_der = leaf_der(ca.cert_pem());
    let (_, ca_x509) = X509Certificate::from_der(&ca_der).expect("parse CA");
    assert_eq!(x509.issuer().as_raw(), ca_x509.subject().as_raw());
}

#[test]
fn admin_identity() {
    let issued = ca().issue(&IssueRequest::admin("alice")).expect("issue");
    let identity = identity_from_der(&leaf_der(&issued.cert_pem)).expect("identity");
    assert_eq!(
        identity,
        Identity::Admin {
            trust_domain: TD.into(),
            name: "alice".into()
        }
    );
    assert_eq!(identity.to_string(), "admin/alice");
}

#[test]
fn explicit_validity_is_honoured_and_checked() {
    let ca = ca();
    let not_before = OffsetDateTime::now_utc() - Duration::days(10);
    let not_after = not_before + Duration::days(2);
    let req = IssueRequest {
        not_before: Some(not_before),
        not_after: Some(not_after),
        ..IssueRequest::cluster("west")
    };
    let issued = ca.issue(&req).expect("issue");
    let der = leaf_der(&issued.cert_pem);
    let (_, x509) = X509Certificate::from_der(&der).expect("parse leaf");
    assert_eq!(
        x509.validity().not_before.timestamp(),
        not_before.unix_timestamp()
    );
    assert_eq!(
        x509.validity().not_after.timestamp(),
        not_after.unix_timestamp()
    );

    let backwards = IssueRequest {
        not_before: Some(not_after),
        not_after: Some(not_before),
        ..IssueRequest::cluster("west")
    };
    assert!(matches!(
        ca.issue(&backwards),
        Err(CertError::InvalidValidity { .. })
    ));
}

#[test]
fn invalid_names_are_refused() {
    let ca = ca();
    let err = ca
        .issue(&IssueRequest::cluster("West"))
        .expect_err("uppercase name");
    assert_eq!(
        err.to_string(),
        "invalid cluster name \"West\": must be a DNS-1123 label (lowercase alphanumerics and '-', 1-63 characters, no leading or trailing '-')"
    );
    let err = ca
        .issue(&IssueRequest {
            dns: vec!["bad_host".into()],
            ..IssueRequest::cluster("west")
        })
        .expect_err("bad DNS SAN");
    assert_eq!(
        err.to_string(),
        "invalid DNS SAN \"bad_host\": must be a lowercase DNS name (dot-separated DNS-1123 labels)"
    );
    let wildcard = IssueRequest {
        dns: vec!["*.west.xcc.test".into()],
        ..IssueRequest::cluster("west")
    };
    assert!(ca.issue(&wildcard).is_ok(), "wildcard DNS SANs are allowed");
    assert!(matches!(
        Ca::generate("Not A Domain"),
        Err(CertError::InvalidName {
            kind: "trust domain",
            ..
        })
    ));
}

#[test]
fn external_identity_from_dns_san_then_cn() {
    let with_dns = raw_cert(
        vec![dns("hamlet.example.com"), dns("other.example.com")],
        Some("cn-ignored"),
    );
    assert_eq!(
        identity_from_der(&with_dns).expect("identity"),
        Identity::External("hamlet.example.com".into())
    );
    // A non-spiffe URI does not count as an xcc identity either.
    let cn_only = raw_cert(vec![uri("https://example.com/peer")], Some("legacy-peer"));
    let identity = identity_from_der(&cn_only).expect("identity");
    assert_eq!(identity, Identity::External("legacy-peer".into()));
    assert_eq!(identity.to_string(), "external/legacy-peer");
    assert_eq!(identity.name(), "legacy-peer");
    assert!(!identity.is_admin() && !identity.is_cluster());
}

#[test]
fn certificate_without_any_name_has_no_identity() {
    let anonymous = raw_cert(vec![], None);
    let err = identity_from_der(&anonymous).expect_err("no identity");
    assert!(matches!(
        err,
        CertError::Identity(IdentityError::NoIdentity)
    ));
    assert_eq!(
        err.to_string(),
        "certificate has no xcc identity and no DNS SAN or CN"
    );
}

#[test]
fn malformed_spiffe_ids_are_errors_not_external() {
    let cases = [
        (
            "spiffe://xcc.test/ns/default/sa/west",
            "the path must be /cluster/<name> or /admin/<name>",
        ),
        (
            "spiffe://xcc.test/cluster/West",
            "the name is not a DNS-1123 label (lowercase alphanumerics and '-', 1-63 characters)",
        ),
        (
            "spiffe://xcc.test",
            "no path; expected /cluster/<name> or /admin/<name>",
        ),
        (
            "SPIFFE://xcc.test/cluster/west",
            "the scheme must be lowercase \"spiffe\"",
        ),
    ];
    for (id, reason) in cases {
        // A DNS SAN and CN are present, so falling back to External would have been possible.
        let cert = raw_cert(vec![uri(id), dns("west.example.com")], Some("west"));
        let err = identity_from_der(&cert).expect_err(id);
        assert!(
            matches!(
                &err,
                CertError::Identity(IdentityError::InvalidSpiffeId { uri, reason: r }) if uri == id && *r == reason
            ),
            "{id}: {err}"
        );
    }
    let two = raw_cert(
        vec![
            uri("spiffe://xcc.test/cluster/a"),
            uri("spiffe://xcc.test/cluster/b"),
        ],
        None,
    );
    assert!(matches!(
        identity_from_der(&two),
        Err(CertError::Identity(IdentityError::MultipleSpiffeIds(2)))
    ));
}

#[test]
fn garbage_der_is_a_parse_error() {
    let garbage = rustls::pki_types::CertificateDer::from(vec![0x30, 0x03, 0x01, 0x02, 0x03]);
    assert!(matches!(
        identity_from_der(&garbage),
        Err(CertError::Identity(IdentityError::Parse(_)))
    ));
}

#[test]
fn ca_from_pem_round_trip_keeps_trust_domain_and_issues_verifiable_certs() {
    let original = Ca::generate("round-trip.example").expect("generate");
    let reloaded = Ca::from_pem(original.cert_pem(), original.key_pem()).expect("from_pem");
    assert_eq!(reloaded.trust_domain(), "round-trip.example");
    assert_eq!(reloaded.cert_pem(), original.cert_pem());

    // A leaf issued by the reloaded CA must verify against the original CA certificate.
    let dir = tempfile::TempDir::new().expect("temp dir");
    let issued = reloaded
        .issue(&IssueRequest::cluster("west"))
        .expect("issue");
    let files = write_issued(dir.path(), &original, &issued).expect("write");
    let tls = ReloadingTls::load(files).expect("leaf from reloaded CA verifies");
    assert_eq!(
        tls.identity(),
        Identity::Cluster {
            trust_domain: "round-trip.example".into(),
            name: "west".into()
        }
    );
}

#[test]
fn ca_from_pem_rejects_mismatched_key_and_non_ca_certificates() {
    let a = ca();
    let b = ca();
    let err = Ca::from_pem(a.cert_pem(), b.key_pem()).expect_err("key of another CA");
    assert_eq!(
        err.to_string(),
        "CA key PEM: CA key does not match the CA certificate in CA certificate PEM"
    );
    let leaf = a.issue(&IssueRequest::cluster("west")).expect("issue");
    let err = Ca::from_pem(&leaf.cert_pem, &leaf.key_pem).expect_err("leaf is not a CA");
    assert!(matches!(err, CertError::NotCa { .. }), "{err}");
    let err = Ca::from_pem("not pem", a.key_pem()).expect_err("no certificate");
    assert_eq!(err.to_string(), "CA certificate PEM: no certificate found");
    let err = Ca::from_pem(a.cert_pem(), "not pem").expect_err("no key");
    assert_eq!(err.to_string(), "CA key PEM: no private key found");

    // A CA certificate without a spiffe trust domain URI.
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let cert = params.self_signed(&key).expect("self-signed");
    let err = Ca::from_pem(&cert.pem(), &key.serialize_pem()).expect_err("no trust domain");
    assert!(matches!(err, CertError::NoTrustDomain { .. }), "{err}");
}

#[test]
fn init_ca_dir_writes_files_and_refuses_to_overwrite() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let ca_dir = dir.path().join("ca");
    let ca = init_ca_dir(TD, &ca_dir).expect("init");
    assert_eq!(
        std::fs::read_to_string(ca_dir.join("ca.crt")).expect("ca.crt"),
        ca.cert_pem()
    );
    assert_eq!(
        std::fs::read_to_string(ca_dir.join("ca.key")).expect("ca.key"),
        ca.key_pem()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(ca_dir.join("ca.key"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let err = init_ca_dir(TD, &ca_dir).expect_err("second init");
    assert_eq!(
        err.to_string(),
        format!(
            "{} already exists; refusing to overwrite an existing CA key",
            ca_dir.join("ca.key").display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(ca_dir.join("ca.key")).expect("ca.key"),
        ca.key_pem(),
        "the existing key is untouched"
    );

    let loaded = load_ca_dir(&ca_dir).expect("load");
    assert_eq!(loaded.trust_domain(), TD);
    assert_eq!(loaded.cert_pem(), ca.cert_pem());
    let leftovers: Vec<_> = std::fs::read_dir(&ca_dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert_eq!(
        leftovers,
        Vec::<String>::new(),
        "no temporary files left behind"
    );
}

#[test]
fn load_ca_dir_names_the_missing_file() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let err = load_ca_dir(dir.path()).expect_err("empty dir");
    let expected_prefix = format!("{}: ", dir.path().join("ca.crt").display());
    assert!(matches!(err, CertError::Io { .. }));
    assert!(err.to_string().starts_with(&expected_prefix), "{err}");
}

#[test]
fn write_issued_uses_secret_layout() {
    let ca = ca();
    let dir = tempfile::TempDir::new().expect("temp dir");
    let out = dir.path().join("west");
    let issued = ca.issue(&IssueRequest::cluster("west")).expect("issue");
    let files = write_issued(&out, &ca, &issued).expect("write");
    assert_eq!(files, TlsFiles::in_dir(&out));
    assert_eq!(files.cert, out.join("tls.crt"));
    assert_eq!(
        std::fs::read_to_string(&files.cert).expect("tls.crt"),
        issued.cert_pem
    );
    assert_eq!(
        std::fs::read_to_string(&files.key).expect("tls.key"),
        issued.key_pem
    );
    assert_eq!(
        std::fs::read_to_string(&files.ca).expect("ca.crt"),
        ca.cert_pem()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&files.key)
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert!(
        !format!("{issued:?}").contains("PRIVATE KEY"),
        "Debug redacts the key"
    );
}

#[test]
fn roots_from_pem_rejects_garbage_and_accepts_a_bundle() {
    let err = roots_from_pem(b"this is not a certificate").expect_err("garbage");
    assert!(matches!(err, CertError::EmptyBundle { .. }));
    assert_eq!(
        err.to_string(),
        "CA bundle: no CA certificate found in bundle"
    );

    let err = roots_from_pem(b"").expect_err("empty");
    assert!(matches!(err, CertError::EmptyBundle { .. }));

    let bad_base64 = b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
    let err = roots_from_pem(bad_base64).expect_err("bad base64");
    assert!(matches!(err, CertError::Pem { .. }), "{err}");

    let not_x509 = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let err = roots_from_pem(not_x509).expect_err("not X.509");
    assert!(matches!(err, CertError::BadCaCertificate { .. }), "{err}");

    let (a, b) = (ca(), ca());
    let bundle = format!("{}{}", a.cert_pem(), b.cert_pem());
    let roots = roots_from_pem(bundle.as_bytes()).expect("bundle");
    assert_eq!(roots.len(), 2);
}
