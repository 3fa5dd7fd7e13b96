//! Certificate rotation: reload on demand, reload by the watcher (plain files and a Kubernetes-style
//! `..data` symlink swap), and a bad reload keeping the last good material.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    TD, ca, cluster, connect, leaf_der, metric, server_cert, server_request, start_server, tls_dir,
    within,
};
use tokio_util::sync::CancellationToken;
use xcc_certs::{CertError, IssueRequest, ReloadingTls, TlsFiles, write_issued};

/// The rotated server certificate: same identity, an extra DNS SAN (and a new key and serial).
fn rotated_request() -> IssueRequest {
    let mut req = server_request();
    req.dns.push("east-v2.xcc.test".into());
    req
}

fn sample(tls: &ReloadingTls, name: &str) -> Option<String> {
    metric(tls, name)
}

#[tokio::test]
async fn reload_now_rotates_without_restarting_the_listener() {
    let ca = ca();
    let (server_dir, server_tls, first) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls.clone()).await;

    let before = connect(server.addr, client_tls.client_config(None))
        .await
        .expect("connect");
    assert_eq!(server_cert(&before), leaf_der(&first.cert_pem));
    server.next_conn().await;
    assert_eq!(server_tls.current().generation, 1);

    let second = ca.issue(&rotated_request()).expect("issue");
    write_issued(server_dir.path(), &ca, &second).expect("write rotated files");
    assert!(server_tls.reload_now().expect("reload"), "files changed");
    assert_eq!(server_tls.current().generation, 2);
    assert!(
        !server_tls.reload_now().expect("reload"),
        "nothing changed since"
    );

    let after = connect(server.addr, client_tls.client_config(None))
        .await
        .expect("connect");
    assert_eq!(server_cert(&after), leaf_der(&second.cert_pem));
    assert_ne!(leaf_der(&first.cert_pem), leaf_der(&second.cert_pem));
    assert_eq!(server.next_conn().await.peer().identity, cluster("west"));

    assert_eq!(
        sample(&server_tls, "xcc_certificate_reloads_total{result=\"ok\"}").as_deref(),
        Some("1")
    );
    assert_eq!(
        sample(
            &server_tls,
            "xcc_certificate_reloads_total{result=\"error\"}"
        )
        .as_deref(),
        Some("0")
    );
    let expiry = server_tls.current().not_after.unix_timestamp().to_string();
    assert_eq!(
        sample(&server_tls, "xcc_certificate_expiry_timestamp_seconds").as_deref(),
        Some(expiry.as_str())
    );
}

#[tokio::test]
async fn watcher_picks_up_replaced_files() {
    let ca = ca();
    let (server_dir, server_tls, _) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls.clone()).await;
    let mut updates = server_tls.subscribe();
    let cancel = CancellationToken::new();
    // An hour-long poll: within this test only filesystem notifications can trigger the reload (the
    // watcher's initial comparison happens before spawn_watcher returns, when nothing has changed yet).
    let watcher = server_tls.spawn_watcher(Duration::from_secs(3600), cancel.clone());

    let second = ca.issue(&rotated_request()).expect("issue");
    write_issued(server_dir.path(), &ca, &second).expect("write rotated files");
    within("the watcher to publish new material", updates.changed())
        .await
        .expect("sender alive");
    let published = updates.borrow_and_update().clone();
    assert_eq!(published.certified_key.cert[0], leaf_der(&second.cert_pem));
    assert!(published.generation >= 2);

    let after = connect(server.addr, client_tls.client_config(None))
        .await
        .expect("connect");
    assert_eq!(server_cert(&after), leaf_der(&second.cert_pem));
    server.next_conn().await;

    cancel.cancel();
    within("the watcher to stop", watcher)
        .await
        .expect("watcher task");
}

#[cfg(unix)]
#[tokio::test]
async fn watcher_polls_when_no_notification_arrives() {
    use std::os::unix::fs::symlink;

    // The watched directory holds symlinks to files in another directory. Replacing the targets raises
    // no event in the watched directory, so only the periodic content comparison can notice.
    let ca = ca();
    let real = tempfile::TempDir::new().expect("temp dir");
    let watched = tempfile::TempDir::new().expect("temp dir");
    let first = ca.issue(&server_request()).expect("issue");
    write_issued(real.path(), &ca, &first).expect("write");
    for file in ["ca.crt", "tls.crt", "tls.key"] {
        symlink(real.path().join(file), watched.path().join(file)).expect("symlink");
    }
    let tls = ReloadingTls::load(TlsFiles::in_dir(watched.path())).expect("load");
    let mut updates = tls.subscribe();
    let cancel = CancellationToken::new();
    let watcher = tls.spawn_watcher(Duration::from_millis(50), cancel.clone());

    let second = ca.issue(&rotated_request()).expect("issue");
    write_issued(real.path(), &ca, &second).expect("write");
    within("the poll to notice", updates.changed())
        .await
        .expect("sender alive");
    assert_eq!(
        updates.borrow_and_update().certified_key.cert[0],
        leaf_der(&second.cert_pem)
    );
    cancel.cancel();
    within("the watcher to stop", watcher)
        .await
        .expect("watcher task");
}

#[cfg(unix)]
#[tokio::test]
async fn watcher_follows_a_kubernetes_secret_symlink_swap() {
    use std::os::unix::fs::symlink;

    // Kubelet layout: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/; an update writes a new
    // timestamped directory and atomically renames a fresh `..data` symlink over the old one.
    let ca = ca();
    let mount = tempfile::TempDir::new().expect("temp dir");
    let root = mount.path();
    let first = ca.issue(&server_request()).expect("issue");
    write_issued(&root.join("..v1"), &ca, &first).expect("write v1");
    symlink("..v1", root.join("..data")).expect("..data");
    for file in ["ca.crt", "tls.crt", "tls.key"] {
        symlink(format!("..data/{file}"), root.join(file)).expect("file symlink");
    }
    let tls = ReloadingTls::load(TlsFiles::in_dir(root)).expect("load");
    let mut updates = tls.subscribe();
    let cancel = CancellationToken::new();
    let watcher = tls.spawn_watcher(Duration::from_secs(3600), cancel.clone());

    let second = ca.issue(&rotated_request()).expect("issue");
    write_issued(&root.join("..v2"), &ca, &second).expect("write v2");
    symlink("..v2", root.join("..data_tmp")).expect("..data_tmp");
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).expect("swap ..data");

    within("the watcher to follow the swap", updates.changed())
        .await
        .expect("sender alive");
    assert_eq!(
        updates.borrow_and_update().certified_key.cert[0],
        leaf_der(&second.cert_pem)
    );
    assert_eq!(tls.identity(), cluster("east"));
    cancel.cancel();
    within("the watcher to stop", watcher)
        .await
        .expect("watcher task");
}

#[tokio::test]
async fn bad_reload_keeps_the_last_good_material() {
    let ca = ca();
    let (server_dir, server_tls, first) = tls_dir(&ca, &server_request());
    let (_cd, client_tls, _) = tls_dir(&ca, &IssueRequest::cluster("west"));
    let mut server = start_server(server_tls.clone()).await;
    let files = server_tls.files().clone();
    let good = server_tls.current();

    // Garbage key.
    std::fs::write(&files.key, "garbage").expect("write garbage");
    let err = server_tls.reload_now().expect_err("garbage key");
    assert!(matches!(err, CertError::NoPrivateKey { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("{}: no private key found", files.key.display())
    );
    assert!(
        Arc::ptr_eq(&server_tls.current(), &good),
        "material unchanged"
    );

    let conn = connect(server.addr, client_tls.client_config(None))
        .await
        .expect("connect");
    assert_eq!(server_cert(&conn), leaf_der(&first.cert_pem));
    server.next_conn().await;

    // A valid key that belongs to another certificate.
    let other = ca.issue(&server_request()).expect("issue");
    std::fs::write(&files.key, &other.key_pem).expect("write key");
    let err = server_tls.reload_now().expect_err("mismatched key");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: private key does not match the certificate in {}",
            files.key.display(),
            files.cert.display()
        )
    );

    // A valid certificate for another identity.
    let west = ca.issue(&IssueRequest::cluster("west")).expect("issue");
    write_issued(server_dir.path(), &ca, &west).expect("write");
    let err = server_tls.reload_now().expect_err("identity change");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: certificate identity changed from spiffe://xcc.test/cluster/east to \
             spiffe://xcc.test/cluster/west; restart to change identity",
            files.cert.display()
        )
    );

    // A certificate and key from another CA.
    let foreign = xcc_certs::Ca::generate(TD).expect("impostor CA");
    let forged = foreign.issue(&server_request()).expect("issue");
    std::fs::write(&files.cert, &forged.cert_pem).expect("write cert");
    std::fs::write(&files.key, &forged.key_pem).expect("write key");
    let err = server_tls.reload_now().expect_err("foreign CA");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: certificate is not signed by any CA in {}",
            files.cert.display(),
            files.ca.display()
        )
    );
    assert!(
        Arc::ptr_eq(&server_tls.current(), &good),
        "material unchanged"
    );
    assert_eq!(
        sample(
            &server_tls,
            "xcc_certificate_reloads_total{result=\"error\"}"
        )
        .as_deref(),
        Some("4")
    );
    assert_eq!(
        sample(&server_tls, "xcc_certificate_reloads_total{result=\"ok\"}").as_deref(),
        Some("0")
    );

    let conn = connect(server.addr, client_tls.client_config(None))
        .await
        .expect("connect");
    assert_eq!(server_cert(&conn), leaf_der(&first.cert_pem));
    server.next_conn().await;

    // Fixing the files recovers.
    let fixed = ca.issue(&rotated_request()).expect("issue");
    write_issued(server_dir.path(), &ca, &fixed).expect("write");
    assert!(server_tls.reload_now().expect("reload"));
    assert_eq!(server_tls.current().generation, 2);
    assert_eq!(
        sample(&server_tls, "xcc_certificate_reloads_total{result=\"ok\"}").as_deref(),
        Some("1")
    );
    let conn = connect(server.addr, client_tls.client_config(None))
        .await
        .expect("connect");
    assert_eq!(server_cert(&conn), leaf_der(&fixed.cert_pem));
}

#[tokio::test]
async fn load_errors_name_the_file() {
    let ca = ca();
    let now = time::OffsetDateTime::now_utc();
    let dir = tempfile::TempDir::new().expect("temp dir");
    let files = TlsFiles::in_dir(dir.path());

    let err = ReloadingTls::load(files.clone())
        .err()
        .expect("missing files");
    assert!(
        matches!(err, CertError::Io { ref file, .. } if *file == files.ca.display().to_string()),
        "{err}"
    );

    let expired = ca
        .issue(&IssueRequest {
            not_before: Some(now - time::Duration::days(2)),
            not_after: Some(now - time::Duration::days(1)),
            ..IssueRequest::cluster("west")
        })
        .expect("issue");
    write_issued(dir.path(), &ca, &expired).expect("write");
    let err = ReloadingTls::load(files.clone()).err().expect("expired");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: certificate is expired or not yet valid",
            files.cert.display()
        )
    );

    let other_ca = xcc_certs::Ca::generate("other.test").expect("CA");
    let foreign = other_ca
        .issue(&IssueRequest::cluster("west"))
        .expect("issue");
    write_issued(dir.path(), &ca, &foreign).expect("write");
    let err = ReloadingTls::load(files.clone()).err().expect("foreign");
    assert!(matches!(err, CertError::NotSignedByCa { .. }), "{err}");

    std::fs::write(&files.ca, "no certificates here").expect("write");
    let err = ReloadingTls::load(files.clone())
        .err()
        .expect("empty CA bundle");
    assert_eq!(
        err.to_string(),
        format!("{}: no certificate found", files.ca.display())
    );
}
