//! `xcc check` (file mode), run as a user runs it, against real registries on loopback with
//! real mTLS: a healthy install passes, then each precondition is broken in turn and the exact
//! failing check and its fix are asserted.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use xcc_certs::pki::{self, Ca, IssueRequest};
use xcc_certs::reload::TlsFiles;
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::{Registry, RegistryConfig};

/// Two CAs: `a` issues east and west, `b` issues strangers.
struct Pki {
    dir: tempfile::TempDir,
    a: Ca,
    b: Ca,
}

impl Pki {
    fn new() -> Self {
        xcc_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let a = pki::init_ca_dir("xcc.test", &dir.path().join("ca-a")).unwrap();
        let b = pki::init_ca_dir("xcc.test", &dir.path().join("ca-b")).unwrap();
        Self { dir, a, b }
    }

    /// `name`'s files issued by `ca`, valid until `not_after` (default: a year).
    fn issue(&self, ca: &Ca, name: &str, not_after: Option<time::OffsetDateTime>) -> TlsFiles {
        let mut req = IssueRequest::cluster(name);
        req.dns = vec![format!("{name}.xcc.test")];
        req.not_after = not_after;
        let cert = ca.issue(&req).unwrap();
        pki::write_issued(&self.dir.path().join(name), ca, &cert).unwrap()
    }

    fn ca_pem(&self, which: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(which).join("ca.crt")).unwrap()
    }
}

async fn start(files: TlsFiles) -> (Registry, CancellationToken) {
    let cancel = CancellationToken::new();
    let r = Registry::start(RegistryConfig::loopback(files), cancel.clone())
        .await
        .unwrap();
    r.catalog.upsert(ServiceEntry {
        key: ServiceKey::new("east", "shop", "web"),
        source: Source::Local,
        fqdn: "web.shop.xcc.test".into(),
        endpoints: vec![Endpoint {
            address: "10.0.0.1".into(),
            port: 443,
        }],
        ports: vec![],
        labels: Default::default(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    });
    (r, cancel)
}

/// A state directory with exports/ and one RemoteRegistry file per `(name, address, server name)`.
fn state(dir: &Path, remotes: &[(&str, SocketAddr, &str)]) -> PathBuf {
    let state = dir.join("state");
    std::fs::create_dir_all(state.join("exports")).unwrap();
    std::fs::create_dir_all(state.join("remotes")).unwrap();
    for (name, addr, server_name) in remotes {
        std::fs::write(
            state.join("remotes").join(format!("{name}.yaml")),
            format!(
                "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: RemoteRegistry\n\
                 metadata: {{name: {name}}}\nspec:\n  address: {addr}\n  tlsConfig:\n    \
                 serverCA: \"\"\n    serverName: {server_name}\n"
            ),
        )
        .unwrap();
    }
    state
}

/// `xcc check -o json` with `args`: the exit code and the checks by id.
async fn check(tls: &TlsFiles, state: &Path, args: &[&str]) -> (i32, Vec<Value>) {
    check_env(tls, state, args, &[]).await
}

/// [`check`] with extra environment variables.
async fn check_env(
    tls: &TlsFiles,
    state: &Path,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> (i32, Vec<Value>) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_xcc"))
        .arg("check")
        .arg("--tls-ca")
        .arg(&tls.ca)
        .arg("--tls-cert")
        .arg(&tls.cert)
        .arg("--tls-key")
        .arg(&tls.key)
        .arg("--state-dir")
        .arg(state)
        .args(["-o", "json"])
        .args(args)
        .env_remove("XCC_LOG")
        .env_remove("XCC_STORE")
        .env_remove("XCC_TLS_DIR")
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        out.status.code().unwrap(),
        report["checks"].as_array().unwrap().clone(),
    )
}

fn by_id<'a>(checks: &'a [Value], id: &str) -> &'a Value {
    checks
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {checks:#?}"))
}

/// The status of every check, in order: `id=status`.
fn statuses(checks: &[Value]) -> Vec<String> {
    checks
        .iter()
        .map(|c| {
            format!(
                "{}={}",
                c["id"].as_str().unwrap(),
                c["status"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn a_healthy_install_passes_every_check() {
    let pki = Pki::new();
    let (east, _c) = start(pki.issue(&pki.a, "east", None)).await;
    let work = tempfile::tempdir().unwrap();
    let state = state(work.path(), &[("east", east.hamlet_addr, "east.xcc.test")]);
    let west = pki.issue(&pki.a, "west", None);
    let (code, checks) = check(&west, &state, &["--cluster", "west"]).await;
    assert_eq!(
        statuses(&checks),
        [
            "certificate=ok",
            "certificate expiry=ok",
            "ca expiry=ok",
            "state directory=ok",
            "files=ok",
            "remote east=ok"
        ],
        "{checks:#?}"
    );
    assert_eq!(code, 0);
    let remote = by_id(&checks, "remote east")["detail"].as_str().unwrap();
    assert!(
        remote.contains("is spiffe://xcc.test/cluster/east; Hamlet stream open; clock skew"),
        "{remote}"
    );
    assert_eq!(
        by_id(&checks, "files")["detail"],
        "0 exports and 1 remotes, every file valid"
    );
}

#[tokio::test]
async fn each_broken_precondition_names_its_check_and_fix() {
    let pki = Pki::new();
    let (east, _c) = start(pki.issue(&pki.a, "east", None)).await;
    let (stranger, _s) = start(pki.issue(&pki.b, "stranger", None)).await;
    let work = tempfile::tempdir().unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let state = state(
        work.path(),
        &[
            ("a-closed", closed, "east.xcc.test"),
            ("b-wrong-name", east.hamlet_addr, "nope.xcc.test"),
            ("c-stranger", stranger.hamlet_addr, "stranger.xcc.test"),
        ],
    );
    let west = pki.issue(&pki.a, "west", None);
    let (code, checks) = check(&west, &state, &["--cluster", "south"]).await;
    assert_eq!(code, 1);
    assert_eq!(
        statuses(&checks),
        [
            "certificate=fail",
            "certificate expiry=ok",
            "ca expiry=ok",
            "state directory=ok",
            "files=ok",
            "remote a-closed=fail",
            "remote b-wrong-name=fail",
            "remote c-stranger=fail"
        ],
        "{checks:#?}"
    );
    let c = by_id(&checks, "certificate");
    assert_eq!(
        c["detail"],
        "spiffe://xcc.test/cluster/west names cluster \"west\", expected \"south\""
    );
    let c = by_id(&checks, "remote a-closed");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("cannot reach {closed}:")),
        "{c}"
    );
    assert!(
        c["hint"]
            .as_str()
            .unwrap()
            .starts_with("check spec.address"),
        "{c}"
    );
    let c = by_id(&checks, "remote b-wrong-name");
    assert_eq!(
        c["detail"],
        "this registry refused the remote's certificate: it does not name \"nope.xcc.test\""
    );
    // Both CAs are named after the trust domain: the trusted one has the issuer's name but
    // did not sign the stranger's certificate; that is the same refusal.
    let c = by_id(&checks, "remote c-stranger");
    assert_eq!(
        c["detail"],
        "this registry refused the remote's certificate: it is not issued by a CA it trusts"
    );
    assert_eq!(
        c["hint"],
        "put the remote's current CA into this registry's ca.crt (spec.tlsConfig.serverCA is empty)"
    );
}

/// The remote does not trust this registry's CA: the handshake completes on this side (TLS 1.3)
/// and the remote's alert arrives with the first request.
#[tokio::test]
async fn a_remote_that_refuses_this_registry_is_named_as_the_side_that_refused() {
    let pki = Pki::new();
    let (east, _c) = start(pki.issue(&pki.a, "east", None)).await;
    let work = tempfile::tempdir().unwrap();
    let state = state(work.path(), &[("east", east.hamlet_addr, "east.xcc.test")]);
    // West's certificate is from CA b; its bundle trusts a (east) and b (itself).
    let west = pki.issue(&pki.b, "west", None);
    std::fs::write(&west.ca, pki.ca_pem("ca-a") + &pki.ca_pem("ca-b")).unwrap();
    let (code, checks) = check(&west, &state, &[]).await;
    assert_eq!(code, 1);
    let c = by_id(&checks, "remote east");
    assert_eq!(c["status"], "fail");
    let detail = c["detail"].as_str().unwrap();
    assert!(
        detail.contains("the remote refused this registry's certificate (TLS alert"),
        "{detail}"
    );
    assert!(
        c["hint"]
            .as_str()
            .unwrap()
            .contains("add it to the remote's CA bundle"),
        "{c}"
    );
}

#[tokio::test]
async fn files_and_certificates_that_are_wrong_on_disk() {
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let state = state(work.path(), &[]);
    std::fs::write(
        state.join("remotes/broken.yaml"),
        "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: RemoteRegistry\nmetadata: {name: broken}\nspec:\n  address: 127.0.0.1:1\n  tlsConfig: {serverName: x}\n",
    )
    .unwrap();
    // Expires in 10 days: a warning, not a failure.
    let soon = pki.issue(
        &pki.a,
        "west",
        Some(time::OffsetDateTime::now_utc() + time::Duration::days(10)),
    );
    let (code, checks) = check(&soon, &state, &[]).await;
    assert_eq!(
        statuses(&checks),
        [
            "certificate=ok",
            "certificate expiry=warn",
            "ca expiry=ok",
            "state directory=ok",
            "files=fail"
        ],
        "{checks:#?}"
    );
    assert_eq!(code, 1);
    assert_eq!(
        by_id(&checks, "files")["detail"],
        "remotes/broken.yaml: document 1: spec.tlsConfig: missing field `serverCA`"
    );
    let expiry = by_id(&checks, "certificate expiry");
    assert!(
        expiry["detail"]
            .as_str()
            .unwrap()
            .starts_with("expires in 9 days")
            || expiry["detail"]
                .as_str()
                .unwrap()
                .starts_with("expires in 10 days"),
        "{expiry}"
    );

    // A certificate whose CA is not in the bundle; a state directory that is not there.
    let mut foreign = pki.issue(&pki.b, "west", None);
    foreign.ca = pki.dir.path().join("ca-a/ca.crt");
    let (code, checks) = check(&foreign, &work.path().join("nowhere"), &[]).await;
    assert_eq!(code, 1);
    assert_eq!(
        statuses(&checks),
        [
            "certificate=fail",
            "certificate expiry=skip",
            "ca expiry=skip",
            "state directory=fail"
        ],
        "{checks:#?}"
    );
    assert!(
        by_id(&checks, "certificate")["hint"]
            .as_str()
            .unwrap()
            .starts_with("put the CA that issued tls.crt into ca.crt"),
    );
    assert!(
        by_id(&checks, "state directory")["detail"]
            .as_str()
            .unwrap()
            .ends_with("nowhere does not exist")
    );
}

/// `xcc dns` serving a zone passes; a socket that never answers fails.
#[tokio::test]
async fn dns_answers_the_zone_or_the_check_fails() {
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let state = state(work.path(), &[]);
    // A bound UDP socket that never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let west = pki.issue(&pki.a, "west", None);
    let (code, checks) = check(&west, &state, &["--dns", &addr, "--timeout-seconds", "1"]).await;
    assert_eq!(code, 1);
    let c = by_id(&checks, "dns");
    assert_eq!(c["status"], "fail");
    assert_eq!(c["detail"], format!("no answer from {addr} within 1s"));

    let records = work.path().join("records.yaml");
    std::fs::write(&records, "- fqdn: web.xcc.test\n  addresses: [10.0.0.1]\n").unwrap();
    let mut dns = std::process::Command::new(env!("CARGO_BIN_EXE_xcc"))
        .args(["dns", "--listen", "127.0.0.1:0", "--zone", "xcc.test"])
        .args(["--feed", "static", "--metrics-listen", ""])
        .arg("--static-records")
        .arg(&records)
        .env("XCC_LOG", "info")
        .env_remove("XCC_LOG_JSON")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The "serving" line is logged once both sockets are bound; it carries the UDP address.
    let mut stderr = std::io::BufReader::new(dns.stderr.take().unwrap());
    let served = loop {
        let mut line = String::new();
        use std::io::BufRead as _;
        assert!(stderr.read_line(&mut line).unwrap() > 0, "xcc dns exited");
        if let Some(rest) = line.split("udp=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let (code, checks) = check(&west, &state, &["--dns", &served, "--dns-zone", "xcc.test"]).await;
    let _ = dns.kill();
    let _ = dns.wait();
    assert_eq!(
        by_id(&checks, "dns")["detail"],
        format!("{served} answers the xcc.test zone")
    );
    assert_eq!(code, 0, "{checks:#?}");
}

// ----- kube store, on a real API server -----

const NS: &str = "cross-cluster-connectivity";

/// `xcc check --store kube` as the registry's ServiceAccount (deploy/base's RBAC): without the
/// CRDs, with them, with its RoleBinding gone, and with a RemoteRegistry nobody serves.
#[tokio::test]
async fn kube_store_checks_crds_rbac_and_remotes_as_the_registry() {
    let Some(cp) = xcc_testkube::ControlPlane::start("check-kube") else {
        return;
    };
    cp.apply(&[serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}
    })])
    .await;
    let id = cp.identity(NS, "base", "xcc-registry").await;
    let pki = Pki::new();
    let tls = pki.issue(&pki.a, "west", None);
    let work = tempfile::tempdir().unwrap();
    let kube = |extra: &'static [&'static str]| {
        let (tls, kubeconfig, state) = (
            tls.clone(),
            id.kubeconfig.clone(),
            work.path().to_path_buf(),
        );
        async move {
            let mut args = vec!["--store", "kube", "--namespace", NS];
            args.extend_from_slice(extra);
            check_env(
                &tls,
                &state,
                &args,
                &[("KUBECONFIG", kubeconfig.as_os_str())],
            )
            .await
        }
    };

    let (code, checks) = kube(&[]).await;
    assert_eq!(code, 1);
    assert_eq!(
        statuses(&checks),
        [
            "certificate=ok",
            "certificate expiry=ok",
            "ca expiry=ok",
            "crds=fail",
            "rbac=ok",
            "cluster property=skip",
            "cluster dns=skip"
        ],
        "{checks:#?}"
    );
    let crds = by_id(&checks, "crds");
    assert!(
        crds["detail"]
            .as_str()
            .unwrap()
            .starts_with("not served: connectivity.tanzu.vmware.com/v1alpha1 servicerecords"),
        "{crds}"
    );
    assert_eq!(
        crds["hint"],
        "install the CRDs: kubectl apply -k deploy/crds"
    );

    cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
    cp.apply(&[serde_json::json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
        "kind": "RemoteRegistry",
        "metadata": {"name": "east", "namespace": NS},
        "spec": {"address": "127.0.0.1:1", "tlsConfig": {"serverCA": "", "serverName": "east.xcc.test"}}
    })])
    .await;
    let (code, checks) = kube(&[]).await;
    assert_eq!(
        statuses(&checks),
        [
            "certificate=ok",
            "certificate expiry=ok",
            "ca expiry=ok",
            "crds=ok",
            "rbac=ok",
            "cluster property=skip",
            "cluster dns=skip",
            "sync east=warn",
            "remote east=fail"
        ],
        "{checks:#?}"
    );
    assert_eq!(code, 1);
    assert!(
        by_id(&checks, "rbac")["detail"]
            .as_str()
            .unwrap()
            .ends_with("permissions of xcc-registry in deploy/base are granted")
    );

    // The Role's binding removed: every namespaced permission is reported missing.
    let client = cp.client().await;
    let bindings: kube::Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        kube::Api::namespaced(client, NS);
    bindings
        .delete("xcc-registry", &Default::default())
        .await
        .unwrap();
    let (code, checks) = kube(&[]).await;
    assert_eq!(code, 1);
    let rbac = by_id(&checks, "rbac");
    assert_eq!(rbac["status"], "fail");
    let detail = rbac["detail"].as_str().unwrap();
    assert!(detail.starts_with("xcc-registry may not: "), "{detail}");
    assert!(
        detail.contains("patch core/configmaps xcc-name-owners"),
        "{detail}"
    );
    assert!(
        detail.contains("create connectivity.tanzu.vmware.com/servicerecords;"),
        "{detail}"
    );
    // The ClusterRole's permissions are still bound.
    assert!(!detail.contains("(all namespaces)"), "{detail}");
}

/// The cluster's own pieces, each broken and then fixed, read with the control plane's admin
/// kubeconfig (the registry's own identity may read neither: see the test above): the MCS
/// ClusterProperty naming another cluster than the certificate, and CoreDNS without the stanza
/// that forwards the clusterset zone to xcc dns.
#[tokio::test]
async fn kube_store_checks_the_cluster_property_and_the_coredns_stanza() {
    let Some(cp) = xcc_testkube::ControlPlane::start("check-cluster") else {
        return;
    };
    let pki = Pki::new();
    let tls = pki.issue(&pki.a, "west", None);
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = cp.kubeconfig().to_path_buf();
    let check = || {
        let (tls, kubeconfig, state) = (tls.clone(), kubeconfig.clone(), work.path().to_path_buf());
        async move {
            let (_, checks) = check_env(
                &tls,
                &state,
                &["--store", "kube", "--namespace", NS],
                &[("KUBECONFIG", kubeconfig.as_os_str())],
            )
            .await;
            let get = |id: &str| {
                let c = by_id(&checks, id);
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["detail"].as_str().unwrap().to_string(),
                    c["hint"].as_str().unwrap_or("").to_string(),
                )
            };
            (get("cluster property"), get("cluster dns"))
        }
    };

    let (property, dns) = check().await;
    assert_eq!(
        property,
        (
            "skip".to_string(),
            "no ClusterProperty cluster.clusterset.k8s.io (the About API is not installed, or the property not set)".to_string(),
            String::new()
        )
    );
    assert_eq!(
        dns,
        (
            "skip".to_string(),
            "no ConfigMap kube-system/coredns: not CoreDNS; forward clusterset.local from the cluster's DNS to xcc dns (deploy/dns/README.md)".to_string(),
            String::new()
        )
    );

    // Broken: the property names another cluster; CoreDNS has no block for the zone.
    cp.apply_dir(&xcc_testkube::deploy_dir().join("mcs/crds"))
        .await;
    let property = |value: &str| {
        serde_json::json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
            "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": value}})
    };
    let coredns = |corefile: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "data": {"Corefile": corefile}})
    };
    cp.apply(&[
        property("east"),
        coredns(".:53 {\n    errors\n    forward . /etc/resolv.conf\n    cache 30\n}\n"),
    ])
    .await;
    let (property_check, dns) = check().await;
    assert_eq!(
        property_check,
        (
            "fail".to_string(),
            "ClusterProperty cluster.clusterset.k8s.io names this cluster \"east\" but the certificate names it \"west\"; make them agree".to_string(),
            "the registry refuses to start so: set the property to the certificate's name (kubectl patch clusterproperty cluster.clusterset.k8s.io --type merge -p '{\"spec\":{\"value\":\"west\"}}') or issue the certificate for \"east\"".to_string()
        )
    );
    let fix = "add a server block for clusterset.local that forwards to the xcc-dns Service's cluster IP (deploy/dns/cluster-dns/coredns-configmap.yaml): kubectl -n kube-system edit configmap coredns";
    assert_eq!(
        dns,
        (
            "fail".to_string(),
            "the CoreDNS Corefile has no server block for clusterset.local: pods cannot resolve its names".to_string(),
            fix.to_string()
        )
    );
    // Half fixed: the block is there, without its forward line.
    cp.apply(&[coredns(
        "clusterset.local:53 {\n    errors\n}\n.:53 {\n    forward . /etc/resolv.conf\n}\n",
    )])
    .await;
    let (_, dns) = check().await;
    assert_eq!(
        dns,
        (
            "fail".to_string(),
            "the CoreDNS server block for clusterset.local forwards nowhere (no forward line)"
                .to_string(),
            fix.to_string()
        )
    );

    // Fixed.
    cp.apply(&[
        property("west"),
        coredns("xcc.test:53 clusterset.local:53 {\n    cache 5\n    forward . 10.96.0.53\n}\n.:53 {\n    forward . /etc/resolv.conf\n}\n"),
    ])
    .await;
    let (property_check, dns) = check().await;
    assert_eq!(
        property_check,
        (
            "ok".to_string(),
            "cluster.clusterset.k8s.io is \"west\", the certificate's cluster name".to_string(),
            String::new()
        )
    );
    assert_eq!(
        dns,
        (
            "ok".to_string(),
            "CoreDNS forwards clusterset.local to 10.96.0.53".to_string(),
            String::new()
        )
    );
}

/// What the parent refuses, as the registry records it: an export's `Announced=False` and the
/// parent RemoteRegistry's imports answered `Denied`. Each is written here as the registry
/// writes it (status subresource), then withdrawn.
#[tokio::test]
async fn kube_store_reports_what_the_parent_refuses() {
    let Some(cp) = xcc_testkube::ControlPlane::start("check-parent") else {
        return;
    };
    cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
    cp.apply(&[
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        serde_json::json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
            "kind": "RemoteRegistry",
            "metadata": {"name": "root", "namespace": NS},
            "spec": {"address": "127.0.0.1:1", "role": "Parent",
                     "tlsConfig": {"serverCA": "", "serverName": "root.xcc.test"}}
        }),
        serde_json::json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
            "kind": "ServiceRecord",
            "metadata": {"name": "secret", "namespace": NS},
            "spec": {"fqdn": "secret.data.svc.clusterset.local",
                     "endpoints": [{"address": "10.3.0.11", "port": 443}]}
        }),
    ])
    .await;
    let id = cp.identity(NS, "base", "xcc-registry").await;
    let pki = Pki::new();
    let tls = pki.issue(&pki.a, "c1", None);
    let work = tempfile::tempdir().unwrap();
    let check = || {
        let (tls, kubeconfig, state) = (
            tls.clone(),
            id.kubeconfig.clone(),
            work.path().to_path_buf(),
        );
        async move {
            let (_, checks) = check_env(
                &tls,
                &state,
                &["--store", "kube", "--namespace", NS],
                &[("KUBECONFIG", kubeconfig.as_os_str())],
            )
            .await;
            by_id(&checks, "parent refusals root").clone()
        }
    };
    let c = check().await;
    assert_eq!(c["status"], "ok", "{c}");
    assert_eq!(
        c["detail"],
        "the parent refuses nothing of this cluster (1 records, 0 imports asked)"
    );

    // Refused: as the registry records it when root's policy `no-secret` forbids the export
    // and b2 does not admit c1/batch.
    let client = cp.client().await;
    let records: kube::Api<xcc_proto::crd::ServiceRecord> =
        kube::Api::namespaced(client.clone(), NS);
    let remotes: kube::Api<xcc_proto::crd::RemoteRegistry> = kube::Api::namespaced(client, NS);
    let merge = |v: Value| kube::api::Patch::Merge(v);
    records
        .patch_status(
            "secret",
            &Default::default(),
            &merge(serde_json::json!({"status": {"conditions": [{
                "type": "Announced", "status": "False", "reason": "Announce",
                "message": "c1 may not announce secret.data.svc.clusterset.local: forbidden by no-secret (policies: no-secret)",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
    remotes
        .patch_status(
            "root",
            &Default::default(),
            &merge(serde_json::json!({"status": {"imports": [
                {"namespace": "shop", "name": "api", "requesterService": "batch",
                 "state": "Denied", "reason": "NotAllowedByCallee",
                 "message": "b2/shop/api allows [b1/web]; c1/batch is not among them"},
                {"namespace": "shop", "name": "web", "state": "Granted"}]}})),
        )
        .await
        .unwrap();
    let c = check().await;
    assert_eq!(c["status"], "warn", "{c}");
    assert_eq!(
        c["detail"],
        "the parent refuses 2: export cross-cluster-connectivity/secret (Announce: c1 may not announce \
         secret.data.svc.clusterset.local: forbidden by no-secret (policies: no-secret)); import \
         shop/api as batch: Denied NotAllowedByCallee (b2/shop/api allows [b1/web]; c1/batch is not among them)"
    );
    assert_eq!(
        c["hint"],
        "the parent decided (its Cedar policies, each service's allowed requesters): change the \
         export or the import, or ask the parent's operator, whose xcc admin explain-policy names \
         the deciding policy"
    );

    // Withdrawn: the parent accepts the export again and grants the import.
    records
        .patch_status(
            "secret",
            &Default::default(),
            &merge(serde_json::json!({"status": {"conditions": [{
                "type": "Announced", "status": "True", "reason": "Accepted", "message": "",
                "lastTransitionTime": "2026-01-01T00:01:00Z"}]}})),
        )
        .await
        .unwrap();
    remotes
        .patch_status(
            "root",
            &Default::default(),
            &merge(serde_json::json!({"status": {"imports": [
                {"namespace": "shop", "name": "api", "requesterService": "batch", "state": "Granted"}]}})),
        )
        .await
        .unwrap();
    let c = check().await;
    assert_eq!(c["status"], "ok", "{c}");
    assert_eq!(
        c["detail"],
        "the parent refuses nothing of this cluster (1 records, 1 imports asked)"
    );
}
