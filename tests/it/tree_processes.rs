//! Multi-process hierarchy on loopback with real mTLS: three `xcc registry --store file`
//! processes (root; b1 and b2 under it), configured only through YAML files the way an operator
//! would. b2 exports `shop/api` for `b1/web` with `--grant-mode istio`; b1 asks for it through a
//! `role: Parent` RemoteRegistry. Readiness and progress are observed from the processes' logs,
//! the filesystem and the admin API — never by sleeping.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use xcc_certs::pki::{self, IssueRequest};

const WAIT: Duration = Duration::from_secs(30);

struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Lines read but not yet returned by [`Proc::wait_log`], in order.
    backlog: std::cell::RefCell<Vec<String>>,
    name: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// The first log line not returned before that contains `needle`, waiting for it if none
    /// has been read yet (bounded). Lines read while waiting are kept, not dropped: a process
    /// may log what a later wait asks for before what an earlier one does (a parent link can
    /// come up before "registry started" is printed). On a timeout the lines read so far are
    /// printed, so a failure says what the process did instead.
    fn wait_log(&self, needle: &str) -> String {
        let mut backlog = self.backlog.borrow_mut();
        if let Some(i) = backlog.iter().position(|l| l.contains(needle)) {
            return backlog.remove(i);
        }
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => backlog.push(line),
                Err(_) => panic!(
                    "{}: no log line containing {needle:?} in time; its log not yet matched:\n{}",
                    self.name,
                    backlog.join("\n")
                ),
            }
        }
    }
}

fn free_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], xcc_testkube::free_port()))
}

fn issue(ca: &pki::Ca, root: &Path, name: &str, admin: bool) -> PathBuf {
    let mut req = if admin {
        IssueRequest::admin(name)
    } else {
        IssueRequest::cluster(name)
    };
    req.dns = vec!["localhost".into()];
    req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
    let dir = root.join(name).join("tls");
    pki::write_issued(&dir, ca, &ca.issue(&req).expect("issue")).expect("write");
    dir
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn start(name: &str, root: &Path, listen: SocketAddr, admin: SocketAddr, extra: &[&str]) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xcc"))
        .args(["registry", "--store", "file", "--metrics-listen", ""])
        .arg("--state-dir")
        .arg(root.join(name).join("state"))
        .arg("--tls-dir")
        .arg(root.join(name).join("tls"))
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--admin-listen")
        .arg(admin.to_string())
        .args(extra)
        .env("XCC_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xcc registry");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let p = Proc {
        child,
        lines: rx,
        backlog: Default::default(),
        name: name.into(),
    };
    p.wait_log("registry started");
    p
}

fn parent_rr(addr: SocketAddr, imports: &str) -> String {
    format!(
        "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: RemoteRegistry\nmetadata:\n  name: parent\nspec:\n  address: \"{addr}\"\n  role: Parent\n  tlsConfig:\n    serverCA: \"\"\n    serverName: localhost\n{imports}"
    )
}

#[test]
fn file_configured_tree_grants_and_revokes_across_processes() {
    let _turn = xcc_testkube::Turn::shared_blocking();
    xcc_certs::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let root_dir = dir.path();
    let ca = pki::init_ca_dir("xcc.test", &root_dir.join("ca")).expect("ca");
    for n in ["root", "b1", "b2"] {
        issue(&ca, root_dir, n, false);
    }
    let admin_tls = issue(&ca, root_dir, "operator", true);

    let (root_addr, b1_addr, b2_addr) = (free_port(), free_port(), free_port());
    let b1_admin = free_port();
    let _root = start("root", root_dir, root_addr, free_port(), &[]);

    // b2 exports shop/api for b1/web and applies Istio policies for its grants.
    write(
        &root_dir.join("b2/state/exports/api.yaml"),
        "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: ServiceRecord\nmetadata:\n  name: api\n  namespace: shop\nspec:\n  fqdn: api.shop.svc.clusterset.local\n  allowedRequesters: [b1/web]\n  endpoints:\n  - {address: 10.2.0.1, port: 8443}\n",
    );
    write(
        &root_dir.join("b2/state/remotes/parent.yaml"),
        &parent_rr(root_addr, ""),
    );
    let b2 = start(
        "b2",
        root_dir,
        b2_addr,
        free_port(),
        &["--grant-mode", "istio"],
    );
    b2.wait_log("parent link established");

    // b1 asks the hierarchy for shop/api as its workload web.
    write(
        &root_dir.join("b1/state/remotes/parent.yaml"),
        &parent_rr(
            root_addr,
            "  imports:\n  - {namespace: shop, name: api, requesterService: web}\n",
        ),
    );
    let b1 = start("b1", root_dir, b1_addr, b1_admin, &[]);
    b1.wait_log("parent link established");

    // The grant reaches b2. The import asks as the cluster, without a workload identity, so
    // there is no principal to admit: b2 records the grant and writes no AuthorizationPolicy.
    let refused = b2.wait_log("cannot apply the objects of a grant");
    assert!(
        refused
            .contains("b1/web asked without a workload identity: there is no principal to admit"),
        "{refused}"
    );
    let line = b2.wait_log("route grant recorded");
    assert!(line.contains("revoked=false"), "{line}");
    assert_eq!(
        std::fs::read_dir(root_dir.join("b2/state/grants"))
            .expect("grants dir")
            .count(),
        0,
        "no policy without a workload identity"
    );

    // b1 materialised the import as an XCC-shaped ServiceRecord, and its admin API says so.
    let import_file = root_dir.join("b1/state/imports/parent.yaml");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let tls = xcc_certs::reload::ReloadingTls::load(xcc_certs::reload::TlsFiles::in_dir(&admin_tls))
            .expect("admin tls");
        let mut admin = xcc_registry::admin::connect(tls, &b1_admin.to_string(), None)
            .await
            .expect("admin");
        let mut watch = admin
            .watch(xcc_proto::xcc::admin::v1::WatchRequest { snapshot: true })
            .await
            .expect("watch")
            .into_inner();
        loop {
            let ev = tokio::time::timeout(WAIT, watch.message())
                .await
                .expect("event in time")
                .expect("ok")
                .expect("open");
            if ev
                .service
                .as_ref()
                .is_some_and(|s| s.source == "hierarchy/parent" && s.name == "api")
            {
                break;
            }
        }
        let tree = admin
            .get_tree(xcc_proto::xcc::admin::v1::GetTreeRequest {})
            .await
            .expect("tree")
            .into_inner();
        assert_eq!(tree.parent, "parent");
        assert_eq!(tree.imports.len(), 1);
        assert_eq!(tree.imports[0].state, "Granted");
        assert_eq!(tree.imports[0].owner_cluster, "b2");

        let text = std::fs::read_to_string(&import_file).expect("import file");
        assert!(text.contains("name: api.shop.svc.clusterset.local-"), "{text}");
        assert!(text.contains("connectivity.tanzu.vmware.com/remote-registry: parent"), "{text}");
        assert!(text.contains("address: 10.2.0.1"), "{text}");

        // b2 stops allowing web: the grant is revoked end to end.
        write(
            &root_dir.join("b2/state/exports/api.yaml"),
            "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: ServiceRecord\nmetadata:\n  name: api\n  namespace: shop\nspec:\n  fqdn: api.shop.svc.clusterset.local\n  allowedRequesters: [c1/batch]\n  endpoints:\n  - {address: 10.2.0.1, port: 8443}\n",
        );
        loop {
            let ev = tokio::time::timeout(WAIT, watch.message())
                .await
                .expect("event in time")
                .expect("ok")
                .expect("open");
            if ev.kind == xcc_proto::xcc::admin::v1::catalog_event::Kind::Delete as i32
                && ev.service.as_ref().is_some_and(|s| s.source == "hierarchy/parent")
            {
                break;
            }
        }
        let tree = admin
            .get_tree(xcc_proto::xcc::admin::v1::GetTreeRequest {})
            .await
            .expect("tree")
            .into_inner();
        assert_eq!(tree.imports[0].state, "Denied");
        assert_eq!(
            tree.imports[0].reason,
            "b2/shop/api allows [c1/batch]; b1/web is not among them"
        );
    });
    let line = b2.wait_log("route grant recorded");
    assert!(line.contains("revoked=true"), "{line}");
    assert_eq!(
        std::fs::read_dir(root_dir.join("b2/state/grants"))
            .expect("dir")
            .count(),
        0,
        "still no policy"
    );
    assert!(
        !std::fs::read_to_string(&import_file)
            .expect("import file")
            .contains("10.2.0.1")
    );
}
