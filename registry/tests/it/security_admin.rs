//! mTLS at the registry's listeners (missing, foreign and expired client certificates; rotation
//! without restart) and the admin API (admin identity required, listing, lookup, peers, watch).

use crate::common::*;
use xcc_certs::pki::IssueRequest;
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::xcc::admin::v1 as api;

/// A raw TLS client: trusts `ca`, presents `client` (chain and key PEM files) if given, and
/// returns the TLS error the server's verdict produces (with TLS 1.3 it arrives on first read).
async fn raw_handshake(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
    client: Option<(&std::path::Path, &std::path::Path)>,
) -> Option<rustls::Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).expect("ca") {
        roots.add(c.expect("cert")).expect("add");
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .expect("chain")
                    .map(|c| c.expect("cert"))
                    .collect(),
                PrivateKeyDer::from_pem_file(key).expect("key"),
            )
            .expect("client auth"),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let result = async {
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        let mut buf = [0u8; 16];
        tls.read(&mut buf).await
    }
    .await;
    result.err().and_then(|e| {
        e.get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .cloned()
    })
}

#[tokio::test]
async fn missing_foreign_and_expired_client_certificates_are_rejected() {
    let pki = Pki::new("xcc.test");
    let files = pki.cluster("east");
    let (east, _c) = start(files.clone()).await;
    use rustls::{AlertDescription, Error};

    assert_eq!(
        raw_handshake(east.hamlet_addr, &files.ca, None).await,
        Some(Error::AlertReceived(AlertDescription::CertificateRequired))
    );

    // A certificate from an unrelated CA.
    let other = Pki::new("other.test");
    let foreign = other.cluster("west");
    assert_eq!(
        raw_handshake(
            east.hamlet_addr,
            &files.ca,
            Some((&foreign.cert, &foreign.key))
        )
        .await,
        Some(Error::AlertReceived(AlertDescription::UnknownCA))
    );
    // A forged CA with the same name as ours: the chain is found by name, its signature fails.
    let forged = Pki::new("xcc.test");
    let spoof = forged.cluster("west");
    assert_eq!(
        raw_handshake(east.hamlet_addr, &files.ca, Some((&spoof.cert, &spoof.key))).await,
        Some(Error::AlertReceived(AlertDescription::DecryptError))
    );

    let mut req = IssueRequest::cluster("west");
    req.not_before = Some(time::OffsetDateTime::now_utc() - time::Duration::days(10));
    req.not_after = Some(time::OffsetDateTime::now_utc() - time::Duration::days(1));
    let cert = pki.ca.issue(&req).expect("issue");
    let expired = xcc_certs::pki::write_issued(&pki.dir.path().join("expired"), &pki.ca, &cert)
        .expect("write");
    assert_eq!(
        raw_handshake(
            east.hamlet_addr,
            &files.ca,
            Some((&expired.cert, &expired.key))
        )
        .await,
        Some(Error::AlertReceived(AlertDescription::CertificateExpired))
    );
    // The admin listener is just as strict.
    assert_eq!(
        raw_handshake(east.admin_addr, &files.ca, None).await,
        Some(Error::AlertReceived(AlertDescription::CertificateRequired))
    );
    // And a valid certificate passes the same path.
    let west = pki.cluster("west");
    assert_eq!(
        raw_handshake(east.hamlet_addr, &files.ca, Some((&west.cert, &west.key))).await,
        None
    );
    assert_eq!(east.peers.list().len(), 0, "no consumer was admitted");
}

/// A certificate rotated on disk is served on the next connection, without restart.
#[tokio::test]
async fn rotated_server_certificate_is_served_without_restart() {
    let pki = Pki::new("xcc.test");
    let files = pki.cluster("east");
    let (east, _c) = start(files.clone()).await;
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let before = std::fs::read(&files.cert).expect("read");
    let mut changes = east.tls.subscribe();
    // Re-issue east with an extra DNS name, atomically replacing the files.
    let mut req = IssueRequest::cluster("east");
    req.dns = vec!["localhost".into(), "east.rotated.test".into()];
    req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
    let cert = pki.ca.issue(&req).expect("issue");
    xcc_certs::pki::write_issued(files.cert.parent().expect("dir"), &pki.ca, &cert).expect("write");
    assert_ne!(before, std::fs::read(&files.cert).expect("read"));
    tokio::time::timeout(WAIT, changes.changed())
        .await
        .expect("reload observed in time")
        .expect("watch alive");
    // A new connection verifying the *new* name succeeds: the new certificate is served.
    let connector = xcc_certs::client::TlsConnector::new(west, "east.rotated.test".into(), None)
        .expect("connector");
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", east.hamlet_addr))
        .expect("uri")
        .connect_with_connector(connector)
        .await
        .expect("connects with the rotated certificate");
    Consumer::on_channel(ch, false, xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL)
        .await
        .expect("subscribe");
}

async fn admin_client(
    pki: &Pki,
    reg: &xcc_registry::Registry,
    name: &str,
    admin: bool,
) -> api::admin_client::AdminClient<tonic::transport::Channel> {
    let files = if admin {
        pki.admin(name)
    } else {
        pki.cluster(name)
    };
    let tls = ReloadingTls::load(files).expect("tls");
    xcc_registry::admin::connect(tls, &reg.admin_addr.to_string(), None)
        .await
        .expect("connect")
}

#[tokio::test]
async fn admin_api_requires_an_admin_identity() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    let mut not_admin = admin_client(&pki, &east, "west", false).await;
    let err = not_admin
        .list_services(api::ListServicesRequest::default())
        .await
        .expect_err("denied");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert_eq!(err.message(), "cluster/west is not an admin identity");
}

#[tokio::test]
async fn admin_lists_gets_peers_and_watches() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    let mut restricted = export("east", "shop", "api.shop.xcc.test", "10.0.0.2");
    restricted.allowed_requesters = vec!["north".into()];
    east.catalog.upsert(restricted);
    east.catalog
        .upsert(export("east", "shop", "web.shop.xcc.test", "10.0.0.1"));
    east.catalog
        .upsert(export("east", "ops", "grafana.ops.example", "10.0.0.3"));
    let mut admin = admin_client(&pki, &east, "alice", true).await;

    let all = admin
        .list_services(api::ListServicesRequest::default())
        .await
        .expect("list")
        .into_inner()
        .services;
    assert_eq!(all.len(), 3);
    let shop = admin
        .list_services(api::ListServicesRequest {
            fqdn_suffix: "XCC.test".into(),
            namespace: "shop".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .services;
    let fqdns: Vec<&str> = shop.iter().map(|s| s.fqdn.as_str()).collect();
    assert_eq!(fqdns, ["api.shop.xcc.test", "web.shop.xcc.test"]);

    let one = admin
        .get_service(api::GetServiceRequest {
            fqdn: "API.shop.xcc.test.".into(),
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(
        (
            one.owner_cluster.as_str(),
            one.namespace.as_str(),
            one.source.as_str()
        ),
        ("east", "shop", "local")
    );
    assert_eq!(one.allowed_requesters, ["north"]);
    let missing = admin
        .get_service(api::GetServiceRequest {
            fqdn: "nope.xcc.test".into(),
            ..Default::default()
        })
        .await
        .expect_err("not found");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    let bad = admin
        .get_service(api::GetServiceRequest::default())
        .await
        .expect_err("invalid");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    // A consumer shows up in ListPeers with its certificate identity and record count.
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut c = Consumer::connect(&west, east.hamlet_addr, true)
        .await
        .expect("subscribe");
    for _ in 0..3 {
        c.next_acked().await; // two visible services + marker
    }
    // Counted before each response is handed to the transport, so all three are visible now.
    let peers = admin
        .list_peers(api::ListPeersRequest {})
        .await
        .expect("peers")
        .into_inner()
        .peers;
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].kind, api::peer::Kind::HamletConsumer as i32);
    assert_eq!(peers[0].identity, "west");
    assert_eq!(peers[0].state, api::peer::State::Connected as i32);
    assert_eq!(peers[0].responses_sent, 3);

    // Watch: snapshot, marker, then live events.
    let mut watch = admin
        .watch(api::WatchRequest { snapshot: true })
        .await
        .expect("watch")
        .into_inner();
    let mut kinds = vec![];
    for _ in 0..4 {
        let ev = tokio::time::timeout(WAIT, watch.message())
            .await
            .expect("in time")
            .expect("ok")
            .expect("open");
        kinds.push(ev.kind);
    }
    use api::catalog_event::Kind;
    assert_eq!(
        kinds,
        [
            Kind::Upsert as i32,
            Kind::Upsert as i32,
            Kind::Upsert as i32,
            Kind::SnapshotComplete as i32
        ]
    );
    east.catalog.remove(&xcc_registry::catalog::ServiceKey::new(
        "east",
        "ops",
        "grafana.ops.example",
    ));
    let ev = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("open");
    assert_eq!(ev.kind, Kind::Delete as i32);
    assert_eq!(ev.service.expect("service").fqdn, "grafana.ops.example");
}

/// A catalog whose listing is larger than a gRPC message may be (4 MiB): the old one-message
/// answer cannot be decoded, the paged listing returns every service once, in key order, each
/// page under the limit; a filter pages the same way; a forged token is refused.
#[tokio::test]
async fn the_admin_listing_pages_a_catalog_larger_than_a_message() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    for i in 0..5_000u32 {
        let ns = if i % 2 == 0 { "shop" } else { "ops" };
        let mut e = export("east", ns, &format!("svc-{i:05}.{ns}.xcc.test"), "10.0.0.1");
        e.endpoints = (0..60u32)
            .map(|j| xcc_registry::catalog::Endpoint {
                address: format!("10.{}.{}.{}", i >> 8, i & 255, j).into(),
                port: 443,
            })
            .collect();
        east.catalog.upsert(e);
    }
    let mut admin = admin_client(&pki, &east, "alice", true).await;
    let err = admin
        .list_services(api::ListServicesRequest::default())
        .await
        .expect_err("one message is too large");
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
    assert!(
        err.message()
            .starts_with("Error, decoded message length too large"),
        "{}",
        err.message()
    );

    let first = admin
        .list_services(api::ListServicesRequest {
            page_size: 10_000,
            ..Default::default()
        })
        .await
        .expect("first page")
        .into_inner();
    let size = prost::Message::encoded_len(&first);
    assert!(
        size <= 2 * 1024 * 1024 && !first.next_page_token.is_empty(),
        "{size} bytes, {} services",
        first.services.len()
    );

    let keys = |s: &[api::Service]| -> Vec<(String, String, String)> {
        s.iter()
            .map(|s| (s.owner_cluster.clone(), s.namespace.clone(), s.name.clone()))
            .collect()
    };
    let want = |ns: Option<&str>| -> Vec<(String, String, String)> {
        east.catalog
            .list(&Default::default())
            .iter()
            .filter(|e| ns.is_none_or(|ns| e.key.namespace == ns))
            .map(|e| {
                (
                    e.key.cluster.to_string(),
                    e.key.namespace.to_string(),
                    e.key.name.to_string(),
                )
            })
            .collect()
    };
    let all = xcc_registry::admin::list_all_services(&mut admin, Default::default())
        .await
        .expect("paged");
    assert_eq!(all.len(), 5_000);
    assert_eq!(keys(&all), want(None));
    assert!(all.iter().all(|s| s.endpoints.len() == 60));
    let shop = xcc_registry::admin::list_all_services(
        &mut admin,
        api::ListServicesRequest {
            namespace: "shop".into(),
            page_size: 7,
            ..Default::default()
        },
    )
    .await
    .expect("paged");
    assert_eq!(shop.len(), 2_500);
    assert_eq!(keys(&shop), want(Some("shop")));

    let err = admin
        .list_services(api::ListServicesRequest {
            page_size: 10,
            page_token: "east/shop/x".into(),
            ..Default::default()
        })
        .await
        .expect_err("forged token");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        err.message(),
        "page_token is not one this server handed out"
    );
}

/// An admin client with `files`, its error (or none) as the CLI prints it.
async fn admin_error(
    files: TlsFiles,
    addr: std::net::SocketAddr,
    server_name: &str,
) -> Option<String> {
    let tls = ReloadingTls::load(files).expect("client TLS");
    let addr = addr.to_string();
    let result = async {
        let mut client =
            xcc_registry::admin::connect(tls, &addr, Some(server_name.to_owned())).await?;
        client.list_peers(api::ListPeersRequest {}).await?;
        anyhow::Ok(())
    }
    .await;
    result
        .err()
        .map(|e| format!("{:#}", xcc_registry::admin::call_error(e, &addr)))
}

/// Each refusal is explained on both ends: the client's error names who refused whom and the
/// fix, the server logs one WARN sentence for it, and a storm of identical refusals from one
/// address is one line (counted), not one per attempt. A client at the Hamlet port, and
/// plaintext at a TLS port, are named as such.
#[tokio::test]
async fn tls_refusals_are_explained_on_both_sides_once() {
    let logs = Captured::default();
    let _guard = logs.start();
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    let admin = pki.admin("alice");

    // An admin certificate from another PKI (its client trusts east's CA too): east refuses it.
    let other = Pki::new("other.test");
    let foreign = other.admin("mallory");
    let both = pki.dir.path().join("both-cas.crt");
    let bundle = [
        std::fs::read(&admin.ca).expect("ca"),
        std::fs::read(&foreign.ca).expect("ca"),
    ]
    .concat();
    std::fs::write(&both, bundle).expect("bundle");
    let foreign = TlsFiles {
        ca: both,
        ..foreign
    };
    let addr = east.admin_addr;
    for attempt in 0..3 {
        let err = admin_error(foreign.clone(), addr, "localhost").await;
        let err = err.expect("refused");
        assert!(
            err.starts_with(&format!(
                "admin API at {addr}: server {addr} (verified as localhost) refused our certificate: it does not trust the CA that issued it (unknown CA"
            )),
            "attempt {attempt}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let refused = logs.warnings("its certificate is not issued by a CA in our ca.crt");
    assert_eq!(refused.len(), 1, "one line for three refusals: {refused:?}");
    assert!(
        refused[0].contains("listener=\"admin listener\"")
            && refused[0].contains("refused client 127.0.0.1:"),
        "{refused:?}"
    );

    // A client of another PKI altogether: it refuses east's certificate (and says so), and east
    // logs that its own certificate was refused.
    let err = admin_error(other.admin("bob"), addr, "localhost")
        .await
        .expect("refused");
    assert!(
        err.contains("refused server 127.0.0.1:")
            && err.contains("its certificate is not issued by a CA we trust (unknown CA"),
        "{err}"
    );
    // East reads the client's alert after the client has returned its error, and nothing but
    // the log line shows it did: re-check (bounded, yielding to east's tasks) until it is there.
    let theirs = "refused our certificate: it does not trust the CA that issued it";
    for _ in 0..500 {
        if !logs.warnings(theirs).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let theirs = logs.warnings(theirs);
    assert!(
        theirs.len() == 1
            && theirs[0].contains("client 127.0.0.1:")
            && theirs[0].contains("listener=\"admin listener\""),
        "east logs that its certificate was refused: {theirs:?}"
    );

    // The name on east's certificate is not the one asked for.
    let err = admin_error(admin.clone(), addr, "west.example.org")
        .await
        .expect("refused");
    assert!(
        err.contains("(verified as west.example.org)")
            && err.contains("its certificate does not carry the name we asked for (name mismatch)"),
        "{err}"
    );

    // The admin CLI pointed at the Hamlet port.
    let err = admin_error(admin.clone(), east.hamlet_addr, "localhost")
        .await
        .expect("not the admin API");
    assert!(
        err.starts_with(&format!(
            "admin API at {0}: {0} answers gRPC over TLS but does not offer the admin API",
            east.hamlet_addr
        )),
        "{err}"
    );

    // The admin CLI pointed at a plaintext port (metrics, say): it says so.
    let plain_port = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let plain_addr = plain_port.local_addr().expect("addr");
    let http = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut tcp, _) = plain_port.accept().await.expect("accept");
        let mut buf = [0u8; 512];
        let _ = tcp.read(&mut buf).await;
        let _ = tcp
            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .await;
    });
    let err = admin_error(admin.clone(), plain_addr, "localhost")
        .await
        .expect("not TLS");
    assert!(
        err.starts_with(&format!(
            "admin API at {plain_addr}: server {plain_addr} (verified as localhost) does not answer TLS: is it a plaintext port"
        )),
        "{err}"
    );
    http.await.expect("plain server");

    // Plaintext HTTP at the TLS port: east says what arrived.
    {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut tcp = tokio::net::TcpStream::connect(east.hamlet_addr)
            .await
            .expect("tcp");
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = vec![];
        let _ = tcp.read_to_end(&mut buf).await;
    }
    let plain = logs.warnings("does not speak TLS: plaintext");
    assert!(
        plain.len() == 1 && plain[0].contains("listener=\"Hamlet/federation listener\""),
        "{plain:?}"
    );

    // And a good client is not reported.
    assert_eq!(admin_error(admin, addr, "localhost").await, None);
}
