//! Mutual TLS over real sockets: `tls_incoming` on the server side, `TlsConnector` or hand-built rustls
//! clients on the other.

use crate::common::{
    SERVER_NAME, Server, TD, ca, client_error, cluster, connect, key_der, leaf_der, metric,
    raw_client_config, roots_of, rustls_error, server_request, start_server, tls_dir, within,
};
use rustls::AlertDescription;
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower::{Service, ServiceExt};
use xcc_certs::{Ca, IssueRequest, TlsConnector};

fn uri(server: &Server) -> http::Uri {
    format!("http://{}", server.addr).parse().expect("uri")
}

#[tokio::test]
async fn mutual_tls_success_reports_both_identities() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls).await;

    let mut connector = TlsConnector::new(client_tls, SERVER_NAME.into(), None).expect("connector");
    assert_eq!(connector.last_peer(), None);
    let io = within(
        "connect",
        connector.ready().await.expect("ready").call(uri(&server)),
    )
    .await
    .expect("mTLS connection");
    let conn = server.next_conn().await;

    assert_eq!(conn.peer().identity, cluster("west"));
    let client_addr = io
        .inner()
        .get_ref()
        .get_ref()
        .0
        .local_addr()
        .expect("client addr");
    assert_eq!(conn.peer().remote_addr, client_addr);
    assert_eq!(conn.get_ref().get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(connector.last_peer(), Some(cluster("east")));
}

#[tokio::test]
async fn connector_with_explicit_roots_and_ip_server_name() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls).await;

    // The server certificate has IP SAN 127.0.0.1, so an IP address works as the verified name.
    let mut connector =
        TlsConnector::new(client_tls.clone(), "127.0.0.1".into(), Some(roots_of(&ca)))
            .expect("connector");
    within("connect", connector.call(uri(&server)))
        .await
        .expect("mTLS connection via IP SAN");
    assert_eq!(server.next_conn().await.peer().identity, cluster("west"));

    // Roots of another CA: the client refuses the server.
    let mut wrong_roots =
        TlsConnector::new(client_tls, SERVER_NAME.into(), Some(roots_of(&ca_other())))
            .expect("connector");
    let err = within("connect", wrong_roots.call(uri(&server)))
        .await
        .expect_err("server from an untrusted CA");
    assert_eq!(
        rustls_error(&err),
        Some(&rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer
        ))
    );
    // And says so in words: who refused whom, why, and what to give it.
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "refused server {}:{} (verified as {SERVER_NAME}): its certificate is not issued by a CA we trust (unknown CA",
            server.addr.ip(),
            server.addr.port()
        )),
        "{text}"
    );
    assert_eq!(wrong_roots.last_peer(), None);
}

fn ca_other() -> Ca {
    Ca::generate("other.test").expect("other CA")
}

#[tokio::test]
async fn connector_rejects_invalid_server_name() {
    let ca = ca();
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let err = TlsConnector::new(client_tls, "not a name!".into(), None)
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("invalid server name \"not a name!\": must be a DNS name or an IP address")
    );
}

#[tokio::test]
async fn rejected_clients_see_exact_alerts_and_are_never_yielded() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let mut server = start_server(server_tls.clone()).await;
    let failures = |tls: &xcc_certs::ReloadingTls| {
        metric(tls, "xcc_tls_handshake_failures_total{reason=\"tls\"}")
    };
    assert_eq!(failures(&server_tls).as_deref(), Some("0"));

    // 1. No client certificate.
    let err = client_error(server.addr, raw_client_config(roots_of(&ca), None)).await;
    assert_eq!(
        rustls_error(&err),
        Some(&rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
        )),
        "{err}"
    );
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    assert_eq!(err.to_string(), "received fatal alert: CertificateRequired");
    server.assert_nothing_yielded();
    assert_eq!(failures(&server_tls).as_deref(), Some("1"));

    // 2. A certificate from another CA (different trust domain).
    let foreign = ca_other()
        .issue(&IssueRequest::cluster("west"))
        .expect("issue");
    let config = raw_client_config(
        roots_of(&ca),
        Some((vec![leaf_der(&foreign.cert_pem)], key_der(&foreign.key_pem))),
    );
    let err = client_error(server.addr, config).await;
    assert_eq!(
        rustls_error(&err),
        Some(&rustls::Error::AlertReceived(AlertDescription::UnknownCA)),
        "{err}"
    );
    server.assert_nothing_yielded();
    assert_eq!(failures(&server_tls).as_deref(), Some("2"));

    // 3. A certificate from an impostor CA with the same trust domain: same issuer name, other key.
    // webpki finds the issuer by name, the signature check fails (BadSignature), and rustls maps that to
    // a decrypt_error alert rather than unknown_ca.
    let impostor = Ca::generate(TD).expect("impostor CA");
    let forged = impostor
        .issue(&IssueRequest::cluster("west"))
        .expect("issue");
    let config = raw_client_config(
        roots_of(&ca),
        Some((vec![leaf_der(&forged.cert_pem)], key_der(&forged.key_pem))),
    );
    let err = client_error(server.addr, config).await;
    assert_eq!(
        rustls_error(&err),
        Some(&rustls::Error::AlertReceived(
            AlertDescription::DecryptError
        )),
        "{err}"
    );
    server.assert_nothing_yielded();
    assert_eq!(failures(&server_tls).as_deref(), Some("3"));

    // 4. An expired certificate from the right CA.
    let now = OffsetDateTime::now_utc();
    let expired = ca
        .issue(&IssueRequest {
            not_before: Some(now - time::Duration::days(2)),
            not_after: Some(now - time::Duration::days(1)),
            ..IssueRequest::cluster("west")
        })
        .expect("issue");
    let config = raw_client_config(
        roots_of(&ca),
        Some((vec![leaf_der(&expired.cert_pem)], key_der(&expired.key_pem))),
    );
    let err = client_error(server.addr, config).await;
    assert_eq!(
        rustls_error(&err),
        Some(&rustls::Error::AlertReceived(
            AlertDescription::CertificateExpired
        )),
        "{err}"
    );
    server.assert_nothing_yielded();
    assert_eq!(failures(&server_tls).as_deref(), Some("4"));

    // The listener is unaffected: the next connection the server yields is a good client's.
    let good = ca.issue(&IssueRequest::cluster("west")).expect("issue");
    let config = raw_client_config(
        roots_of(&ca),
        Some((vec![leaf_der(&good.cert_pem)], key_der(&good.key_pem))),
    );
    let stream = connect(server.addr, config).await.expect("good client");
    let conn = server.next_conn().await;
    assert_eq!(conn.peer().identity, cluster("west"));
    assert_eq!(
        conn.peer().remote_addr,
        stream.get_ref().0.local_addr().expect("client addr")
    );
    assert_eq!(failures(&server_tls).as_deref(), Some("4"));
}

#[tokio::test]
async fn verified_certificate_without_identity_is_dropped() {
    // A CA we control with rcgen directly, so it can sign a leaf `Ca::issue` would refuse to make.
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    ca_params.subject_alt_names = vec![rcgen::SanType::URI(
        "spiffe://xcc.test".try_into().expect("uri"),
    )];
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA");
    let ca = Ca::from_pem(&ca_cert.pem(), &ca_key.serialize_pem()).expect("xcc CA");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let mut leaf_params = rcgen::CertificateParams::default();
    leaf_params.subject_alt_names = vec![rcgen::SanType::URI(
        "spiffe://xcc.test/ns/default/sa/west"
            .try_into()
            .expect("uri"),
    )];
    leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_key = rcgen::KeyPair::generate().expect("key");
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).expect("leaf");

    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let mut server = start_server(server_tls.clone()).await;
    let config = raw_client_config(
        roots_of(&ca),
        Some((vec![leaf.der().clone()], key_der(&leaf_key.serialize_pem()))),
    );
    // The handshake succeeds (the certificate is valid), then the server closes without a word.
    let err = client_error(server.addr, config).await;
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
    server.assert_nothing_yielded();
    assert_eq!(
        metric(
            &server_tls,
            "xcc_tls_handshake_failures_total{reason=\"no_identity\"}"
        )
        .as_deref(),
        Some("1")
    );
}

#[tokio::test]
async fn stalled_handshake_does_not_block_other_connections() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls).await;

    // A peer that connects and then says nothing keeps its handshake pending for up to 10 s.
    let mut silent = TcpStream::connect(server.addr).await.expect("tcp");
    let stream = connect(server.addr, client_tls.client_config(None))
        .await
        .expect("client behind the silent one");
    let conn = server.next_conn().await;
    assert_eq!(
        conn.peer().remote_addr,
        stream.get_ref().0.local_addr().expect("addr")
    );
    // The silent socket is still open (not yet timed out) and still sent nothing.
    silent.write_all(b"").await.expect("silent socket open");
    server.assert_nothing_yielded();
}

#[tokio::test]
async fn cancel_ends_the_stream_and_closes_the_listener() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let mut server = start_server(server_tls).await;
    server.cancel.cancel();
    assert!(
        within("the stream to end", server.conns.recv())
            .await
            .is_none(),
        "stream ended without yielding"
    );
    let err = TcpStream::connect(server.addr)
        .await
        .expect_err("listener closed");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[tokio::test]
async fn data_flows_both_ways_over_the_yielded_connection() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls).await;
    let mut client = connect(server.addr, client_tls.client_config(None))
        .await
        .expect("connect");
    let mut conn = server.next_conn().await;

    client.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    within("server read", conn.read_exact(&mut buf))
        .await
        .expect("read");
    assert_eq!(&buf, b"ping");
    conn.write_all(b"pong").await.expect("write");
    conn.flush().await.expect("flush");
    within("client read", client.read_exact(&mut buf))
        .await
        .expect("read");
    assert_eq!(&buf, b"pong");
}

#[tokio::test]
async fn connector_requires_alpn_h2() {
    let ca = ca();
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let issued = ca.issue(&server_request()).expect("issue");
    // A plain TLS server (no ALPN, no client auth) with a valid certificate.
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![leaf_der(&issued.cert_pem)], key_der(&issued.key_pem))
    .expect("server config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        acceptor.accept(tcp).await.map(|_| ())
    });

    let mut connector = TlsConnector::new(client_tls, SERVER_NAME.into(), None).expect("connector");
    let uri: http::Uri = format!("http://{addr}").parse().expect("uri");
    let err = within("connect", connector.call(uri))
        .await
        .expect_err("no h2");
    assert_eq!(
        err.to_string(),
        format!("http://{addr}/: server did not negotiate ALPN \"h2\"")
    );
    assert_eq!(connector.last_peer(), None);
    within("server", server)
        .await
        .expect("task")
        .expect("server handshake");
}

/// Closing a connection through its `ConnectionCloser` wakes a read that is waiting for the peer
/// and fails it with `ConnectionAborted`; later writes fail the same way.
#[tokio::test]
async fn closer_fails_pending_and_later_io() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls).await;
    let mut connector = TlsConnector::new(client_tls, SERVER_NAME.into(), None).expect("connector");
    // The client stays connected and silent: the server's read can only end through the closer.
    let _client = within(
        "connect",
        connector.ready().await.expect("ready").call(uri(&server)),
    )
    .await
    .expect("mTLS connection");
    let mut conn = server.next_conn().await;
    let closer = conn.closer().clone();
    assert!(!closer.is_closed());

    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 16];
        // The first poll registers the reader before the test closes the connection.
        let read = conn.read(&mut buf);
        tokio::pin!(read);
        let first = futures::poll!(read.as_mut());
        assert!(first.is_pending(), "silent client: nothing to read yet");
        started_tx.send(()).expect("test waits");
        let err = read.await.expect_err("read fails once closed");
        let write_err = conn.write_all(b"x").await.expect_err("write fails too");
        (err.kind(), write_err.kind())
    });
    within("the reader's first poll", started_rx)
        .await
        .expect("reader started");
    closer.close();
    assert!(closer.is_closed());
    let kinds = within("the woken read", reader).await.expect("reader task");
    assert_eq!(
        kinds,
        (
            std::io::ErrorKind::ConnectionAborted,
            std::io::ErrorKind::ConnectionAborted
        )
    );
}

/// A server that refuses the client's certificate says so after the client's side of the TLS 1.3
/// handshake has ended: the connector waits for the server's first bytes, so the refusal is the
/// connection's error, with its reason, not a later request's "connection closed".
#[tokio::test]
async fn connector_reports_a_refusal_that_comes_after_the_handshake() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let mut server = start_server(server_tls).await;
    // The client trusts the server's CA, but its own certificate is another CA's.
    let other = ca_other();
    let (_cd, client_tls, _) = tls_dir(&other, &IssueRequest::cluster("west"));
    let mut connector =
        TlsConnector::new(client_tls, SERVER_NAME.into(), Some(roots_of(&ca))).expect("connector");
    let err = within(
        "connect",
        connector.ready().await.expect("ready").call(uri(&server)),
    )
    .await
    .expect_err("refused by the server");
    let text = err.to_string();
    assert!(
        text.contains("refused our certificate: it does not trust the CA that issued it"),
        "{text}"
    );
    server.assert_nothing_yielded();
}

/// The byte the connector reads to see the server speak first is handed to the caller first.
#[tokio::test]
async fn the_servers_first_bytes_reach_the_caller_whole() {
    let ca = ca();
    let (_sd, server_tls, _) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls).await;
    let mut connector = TlsConnector::new(client_tls, SERVER_NAME.into(), None).expect("connector");
    let target = uri(&server);
    let connecting =
        tokio::spawn(async move { connector.ready().await.expect("ready").call(target).await });
    let mut conn = server.next_conn().await;
    conn.write_all(b"hello").await.expect("write");
    conn.flush().await.expect("flush");
    let io = within("connect", connecting)
        .await
        .expect("join")
        .expect("connected");
    let mut stream = io.into_inner();
    let mut buf = [0u8; 5];
    within("client read", stream.read_exact(&mut buf))
        .await
        .expect("read");
    assert_eq!(&buf, b"hello");
}
