//! Two (or more) Kubernetes clusters driven by the real `xcc` binary: a real control plane per
//! cluster (etcd, kube-apiserver, kube-controller-manager; `xcc_testkube`), `xcc registry --store
//! kube`, `xcc publisher` and `xcc binder` as child processes, each with the token of its own
//! ServiceAccount bound to exactly the RBAC that `deploy/` renders for the cluster's overlay,
//! and real mTLS between the registries. Shared by `tests/it/two_clusters.rs` and
//! `benches/two_clusters.rs`.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use xcc_certs::pki::{self, IssueRequest};
use xcc_testkube::{ControlPlane, Identity};

/// The namespace the xcc components run in.
pub const NS: &str = "cross-cluster-connectivity";
/// A child process whose stderr is kept (the last lines are printed if a wait fails).
pub struct Proc {
    pub name: String,
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log lines so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Stop with SIGTERM (graceful shutdown) and wait; returns whether it exited successfully.
    pub fn terminate(mut self) -> bool {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return false;
                }
            }
        }
    }

    /// Still running?
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One cluster: its control plane, an admin client and the processes running against it.
pub struct Cluster {
    pub name: String,
    pub cp: ControlPlane,
    client: kube::Client,
    /// Watches of the objects the tests' checks read; every event wakes [`wait_for`].
    changes: xcc_testkube::Changes,
    /// The `deploy/` directory whose RBAC the processes run under.
    overlay: String,
    /// The identities the processes ran as (for the audit log).
    users: Mutex<Vec<String>>,
    pub tls: PathBuf,
    pub hamlet: SocketAddr,
    pub admin: SocketAddr,
    pub registry: Option<Proc>,
    pub publisher: Option<Proc>,
    pub binder: Option<Proc>,
    /// Start the processes with `--mcs true` (the Multi-Cluster Services API).
    pub mcs: bool,
}

/// The kinds (`(apiVersion, kind, plural)`) whose changes, in every namespace, wake
/// [`wait_for`]: everything the checks of the two-cluster tests and bench read.
const WATCHED: &[(&str, &str, &str)] = &[
    ("v1", "Service", "services"),
    ("v1", "Endpoints", "endpoints"),
    ("events.k8s.io/v1", "Event", "events"),
    ("discovery.k8s.io/v1", "EndpointSlice", "endpointslices"),
    (
        xcc_proto::names::API_VERSION,
        "ServiceRecord",
        "servicerecords",
    ),
    (
        "multicluster.x-k8s.io/v1alpha1",
        "ServiceExport",
        "serviceexports",
    ),
    (
        "multicluster.x-k8s.io/v1alpha1",
        "ServiceImport",
        "serviceimports",
    ),
];

/// A PKI and a scratch directory for a set of clusters.
pub struct World {
    pub dir: tempfile::TempDir,
    pub ca: pki::Ca,
    pub ca_pem: String,
}

pub fn free_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], xcc_testkube::free_port()))
}

impl World {
    pub fn new() -> Self {
        xcc_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let ca = pki::init_ca_dir("xcc.test", &dir.path().join("ca")).unwrap();
        let ca_pem = std::fs::read_to_string(dir.path().join("ca").join("ca.crt")).unwrap();
        Self { dir, ca, ca_pem }
    }

    /// A cluster named `name` (a control plane of its own) with the xcc CRDs, the upstream CRDs
    /// (HTTPProxy, ...), the xcc namespace and `namespaces`; its processes run under the RBAC of
    /// `deploy/<overlay>`. `None` (after a skip line) without a control plane.
    pub async fn cluster(&self, name: &str, namespaces: &[&str], overlay: &str) -> Option<Cluster> {
        let cp = ControlPlane::start(name)?;
        let client = cp.client().await;
        cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
        cp.apply_dir(&xcc_testkube::upstream_crds()).await;
        let namespaces: Vec<Value> = std::iter::once(&NS)
            .chain(namespaces)
            .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .collect();
        cp.apply(&namespaces).await;
        let changes = cp.changes(None, WATCHED).await;
        let root = self.dir.path().join(name);
        std::fs::create_dir_all(&root).unwrap();
        let mut req = IssueRequest::cluster(name);
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let tls = root.join("tls");
        pki::write_issued(&tls, &self.ca, &self.ca.issue(&req).unwrap()).unwrap();
        Some(Cluster {
            name: name.to_string(),
            cp,
            client,
            changes,
            overlay: overlay.to_string(),
            users: Mutex::default(),
            tls,
            hamlet: free_port(),
            admin: free_port(),
            registry: None,
            publisher: None,
            binder: None,
            mcs: false,
        })
    }

    /// The base64 CA bundle for `spec.tlsConfig.serverCA`.
    pub fn server_ca(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes())
    }
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

fn spawn(name: String, kubeconfig: &Path, args: &[String], log_filter: &str) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xcc"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("NAMESPACE", NS)
        .env("XCC_LOG", log_filter)
        .env("XCC_METRICS_LISTEN", "")
        .env_remove("XCC_LOG_JSON")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    let stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    Proc { name, child, log }
}

impl Cluster {
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The ServiceAccount `account` of the overlay, with a fresh token.
    async fn identity(&self, account: &str) -> Identity {
        let id = self.cp.identity(NS, &self.overlay, account).await;
        self.users.lock().unwrap().push(id.user.clone());
        id
    }

    pub async fn start_registry(&mut self, log: &str) {
        let id = self.identity("xcc-registry").await;
        let args = vec![
            "registry".to_string(),
            "--store".into(),
            "kube".into(),
            "--tls-dir".into(),
            self.tls.display().to_string(),
            "--listen".into(),
            self.hamlet.to_string(),
            "--admin-listen".into(),
            self.admin.to_string(),
            "--metrics-listen".into(),
            String::new(),
            "--mcs".into(),
            self.mcs.to_string(),
        ];
        self.registry = Some(spawn(
            format!("{}/registry", self.name),
            &id.kubeconfig,
            &args,
            log,
        ));
    }

    pub async fn start_publisher(&mut self, log: &str) {
        let id = self.identity("xcc-publisher").await;
        let args = vec![
            "publisher".to_string(),
            "--cluster".into(),
            self.name.clone(),
            "--mcs".into(),
            self.mcs.to_string(),
        ];
        self.publisher = Some(spawn(
            format!("{}/publisher", self.name),
            &id.kubeconfig,
            &args,
            log,
        ));
    }

    pub async fn start_binder(&mut self, log: &str) {
        let id = self.identity("xcc-binder").await;
        self.binder = Some(spawn(
            format!("{}/binder", self.name),
            &id.kubeconfig,
            &["binder".to_string(), "--mcs".into(), self.mcs.to_string()],
            log,
        ));
    }

    /// `xcc dns` serving `clusterset.local` from this cluster's API server, as the
    /// ServiceAccount of `deploy/dns/server`; returns once it serves, with its UDP address.
    pub async fn start_dns(&self, log: &str) -> (Proc, SocketAddr) {
        let id = self.cp.identity(NS, "dns/server", "xcc-dns").await;
        self.users.lock().unwrap().push(id.user.clone());
        let args = [
            "dns",
            "--listen",
            "127.0.0.1:0",
            "--zone",
            "clusterset.local",
            "--metrics-listen",
            "",
        ]
        .map(String::from);
        let dns = spawn(format!("{}/dns", self.name), &id.kubeconfig, &args, log);
        // The serving line is in the process's log, which no watch reports: a bounded retry.
        let udp = retry_for(
            "xcc dns serving",
            Duration::from_secs(30),
            async || {
                dns.log().iter().find_map(|l| {
                    let after = l.split_once("xcc dns serving")?.1;
                    after
                        .split("udp=")
                        .nth(1)?
                        .split_whitespace()
                        .next()?
                        .parse()
                        .ok()
                })
            },
            || dns.log().join("\n"),
        )
        .await;
        (dns, udp)
    }

    /// Switch to the RBAC of `deploy/<overlay>`, as an operator applying it would (the running
    /// processes keep their tokens; their rights change at once).
    pub async fn switch_overlay(&mut self, overlay: &str) {
        self.overlay = overlay.to_string();
        for account in ["xcc-registry", "xcc-binder"] {
            self.identity(account).await;
        }
    }

    /// Requests of this cluster's xcc processes that the API server refused (403).
    pub fn refused(&self) -> Vec<String> {
        let users = self.users.lock().unwrap().clone();
        users.iter().flat_map(|u| self.cp.forbidden(u)).collect()
    }

    /// The User-Agents this cluster's xcc processes sent (deduplicated).
    pub fn user_agents(&self) -> Vec<String> {
        let users = self.users.lock().unwrap().clone();
        let mut out: Vec<String> = self
            .cp
            .audit()
            .iter()
            .filter(|e| users.iter().any(|u| e["user"]["username"] == *u))
            .map(|e| e["userAgent"].as_str().unwrap_or_default().to_string())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Logs of every process of this cluster (for failure messages).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for p in [&self.registry, &self.publisher, &self.binder]
            .into_iter()
            .flatten()
        {
            let lines = p.log();
            let tail = &lines[lines.len().saturating_sub(40)..];
            out.push_str(&format!("--- {} (last {} lines)\n", p.name, tail.len()));
            for l in tail {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// Create `object` as an administrator would (status included where the API allows it on
    /// create, as for Nodes).
    pub async fn create(&self, plural: &str, object: Value) {
        let api = dynamic_api(
            self.client(),
            object["apiVersion"].as_str().unwrap(),
            object["kind"].as_str().unwrap(),
            plural,
            object["metadata"]["namespace"].as_str(),
        );
        let obj: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
        api.create(&kube::api::PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{}: create: {e}", self.name));
    }

    pub async fn get(
        &self,
        api_version: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let api = dynamic_api(self.client(), api_version, "", plural, ns);
        let found = api
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("{}: get {plural} {name}: {e}", self.name));
        found.map(|o| serde_json::to_value(o).unwrap())
    }

    pub async fn list(&self, api_version: &str, plural: &str, ns: Option<&str>) -> Vec<Value> {
        let api = dynamic_api(self.client(), api_version, "", plural, ns);
        let list = api
            .list(&kube::api::ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("{}: list {plural}: {e}", self.name));
        list.items
            .into_iter()
            .map(|o| serde_json::to_value(o).unwrap())
            .collect()
    }
}

/// A Ready node with one InternalIP.
pub fn node(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": ip}],
        },
    })
}

/// An HTTPProxy with a virtualhost, labelled for export or not.
pub fn httpproxy(ns: &str, name: &str, fqdn: &str, exported: bool) -> Value {
    let labels = if exported {
        json!({xcc_proto::names::EXPORT_LABEL: ""})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "projectcontour.io/v1", "kind": "HTTPProxy",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"virtualhost": {"fqdn": fqdn}, "routes": [{"services": [{"name": "web", "port": 80}]}]},
    })
}

/// A RemoteRegistry in the xcc namespace pointing at `remote`.
pub fn remote_registry(
    world: &World,
    name: &str,
    remote: &Cluster,
    materialize: Option<&str>,
) -> Value {
    let mut spec = json!({
        "address": remote.hamlet.to_string(),
        "tlsConfig": {"serverCA": world.server_ca(), "serverName": "localhost"},
    });
    if let Some(m) = materialize {
        spec["materialize"] = json!(m);
    }
    json!({
        "apiVersion": xcc_proto::names::API_VERSION, "kind": "RemoteRegistry",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    })
}

/// Run `check` (which reads the API servers of `clusters`) now and again after every change
/// their watches see (see [`WATCHED`]), until it returns `Some` (bounded by `timeout`); the
/// failure message carries `context()` (e.g. process logs).
pub async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    clusters: &[&Cluster],
    mut check: impl AsyncFnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let mut changes: Vec<_> = clusters.iter().map(|c| c.changes.subscribe()).collect();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        for rx in &mut changes {
            rx.borrow_and_update();
        }
        if let Some(v) = check().await {
            return v;
        }
        let changed =
            futures::future::select_all(changes.iter_mut().map(|rx| Box::pin(rx.changed())));
        match tokio::time::timeout_at(deadline, changed).await {
            Ok((changed, _, _)) => changed.unwrap(),
            Err(_) => panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            ),
        }
    }
}

/// Retry `check` every 20 ms until it returns `Some` (bounded by `timeout`); the failure
/// message carries `context()`. Only for checks of something no watch reports (a process's
/// exit or log lines, a DNS answer over UDP): there is no change signal to wait on. Checks of
/// Kubernetes objects use [`wait_for`].
pub async fn retry_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `metadata.name → metadata.uid` of a list.
pub fn uids(objects: &[Value]) -> BTreeMap<String, String> {
    objects
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                o["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// Addresses of every endpoint of the EndpointSlices labelled for `service` in `ns`, sorted.
pub async fn slice_addresses(cluster: &Cluster, ns: &str, service: &str) -> Vec<String> {
    let mut out: Vec<String> = cluster
        .list("discovery.k8s.io/v1", "endpointslices", Some(ns))
        .await
        .iter()
        .filter(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == service)
        .flat_map(|s| {
            s["endpoints"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out
}

/// Ports of the EndpointSlices labelled for `service` in `ns` (sorted, deduplicated).
pub async fn slice_ports(cluster: &Cluster, ns: &str, service: &str) -> Vec<i64> {
    let mut out: Vec<i64> = cluster
        .list("discovery.k8s.io/v1", "endpointslices", Some(ns))
        .await
        .iter()
        .filter(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == service)
        .flat_map(|s| {
            s["ports"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| p["port"].as_i64())
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn api_resource(api_version: &str, kind: &str, plural: &str) -> kube::api::ApiResource {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), api_version.to_string()),
    };
    kube::api::ApiResource {
        group,
        version,
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        plural: plural.to_string(),
    }
}

fn dynamic_api(
    client: kube::Client,
    api_version: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> kube::Api<kube::api::DynamicObject> {
    let ar = api_resource(api_version, kind, plural);
    match ns {
        Some(ns) => kube::Api::namespaced_with(client, ns, &ar),
        None => kube::Api::all_with(client, &ar),
    }
}

impl Cluster {
    /// Server-side apply `object` as a user would (`kubectl apply --server-side`).
    pub async fn apply(&self, plural: &str, object: Value) {
        let api_version = object["apiVersion"].as_str().unwrap().to_string();
        let kind = object["kind"].as_str().unwrap().to_string();
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
        let api = dynamic_api(self.client(), &api_version, &kind, plural, ns.as_deref());
        api.patch(
            &name,
            &kube::api::PatchParams::apply("e2e-user").force(),
            &kube::api::Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: apply {kind} {name}: {e}", self.name));
    }

    /// JSON merge patch (e.g. removing a label with `null`).
    pub async fn merge(
        &self,
        api_version: &str,
        kind: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
        patch: Value,
    ) {
        let api = dynamic_api(self.client(), api_version, kind, plural, ns);
        api.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: patch {kind} {name}: {e}", self.name));
    }

    /// Delete through the API (garbage collection of dependents follows).
    pub async fn delete(
        &self,
        api_version: &str,
        kind: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
    ) {
        let api = dynamic_api(self.client(), api_version, kind, plural, ns);
        api.delete(name, &kube::api::DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("{}: delete {kind} {name}: {e}", self.name));
    }

    /// Imported ServiceRecords in the xcc namespace: `spec.fqdn → (name, uid)`.
    pub async fn imported(&self) -> BTreeMap<String, (String, String)> {
        self.list(xcc_proto::names::API_VERSION, "servicerecords", Some(NS))
            .await
            .iter()
            .filter(|r| {
                r["metadata"]["labels"]
                    .get(xcc_proto::names::IMPORTED_LABEL)
                    .is_some()
            })
            .map(|r| {
                (
                    r["spec"]["fqdn"].as_str().unwrap_or_default().to_string(),
                    (
                        r["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        r["metadata"]["uid"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ),
                )
            })
            .collect()
    }
}

/// A Service labelled for export (ClusterIP allocated by the API server).
pub fn exported_service(ns: &str, name: &str, port: i64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": {xcc_proto::names::EXPORT_LABEL: ""}},
        "spec": {"ports": [{"name": "http", "port": port}], "selector": {"app": name}},
    })
}
