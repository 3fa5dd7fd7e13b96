//! A real Kubernetes control plane for tests: etcd, kube-apiserver (RBAC on, audit log of every
//! ServiceAccount request) and kube-controller-manager (garbage collector, namespace deletion),
//! started from the binaries in the directory named by `KUBEBUILDER_ASSETS` (envtest's
//! convention: `etcd`, `kube-apiserver`, `kube-controller-manager`, optionally `kubectl`).
//!
//! [`shared`] starts one control plane per test binary, on first use; tests share it, each in
//! its own namespace ([`ControlPlane::namespace`]) and on a [`Turn`]. [`ControlPlane::start`]
//! starts a separate one (a second "cluster"). Without the variable a test prints a skip line
//! and checks nothing, unless `XCC_REQUIRE_KUBE=1` (set by CI), which turns the skip into a
//! failure.
//!
//! Every server runs under `sh` that kills it when its stdin — a pipe this process holds open
//! until it exits — reaches end of file, so no server outlives the test binary, even when it
//! is killed.
//!
//! [`ControlPlane::identity`] is how xcc runs in these tests: a ServiceAccount bound exactly
//! to the RBAC that `kubectl kustomize` renders from a `deploy/` overlay, with a token from the
//! TokenRequest API, as a kubeconfig file (for an `xcc` process) or a client (in-process).

#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

mod deploy;
pub use deploy::{api_for, deploy_dir, kubectl, render, upstream_crds, yaml_docs};
use deploy::{apply, ar, rbac_for};

/// The variable naming the directory with `etcd` and `kube-apiserver` (as envtest's).
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";
/// Set to `1` (CI does) to make a missing control plane a failure instead of a skip.
pub const REQUIRE_ENV: &str = "XCC_REQUIRE_KUBE";
/// The variable naming a directory of upstream CRDs (see [`upstream_crds`]).
pub const UPSTREAM_CRDS_ENV: &str = "XCC_UPSTREAM_CRDS";
/// The namespace the manifests in `deploy/` install xcc into.
pub const DEPLOY_NS: &str = "cross-cluster-connectivity";
/// Field manager of the harness's own writes.
const MANAGER: &str = "testkube";
/// Generous bound for the API server to become ready: 5-15 s on a quiet machine, more when
/// other builds share the cores.
const STARTUP: Duration = Duration::from_secs(120);

/// One running control plane; its servers stop when this process exits.
pub struct ControlPlane {
    /// Removed by a wrapper once the servers are gone (etcd preallocates ~60 MB).
    dir: PathBuf,
    kubeconfig: PathBuf,
    server: String,
    ca_pem: String,
    /// The servers' wrappers, by server name, whose stdin we hold open: they kill their server
    /// at end of file, and exit when it exits.
    wrappers: Mutex<Vec<(&'static str, Child)>>,
}

/// The shared control plane of this test binary, started on first use; `None` (after a skip
/// line naming `test`) when `KUBEBUILDER_ASSETS` is unset and `XCC_REQUIRE_KUBE` is not `1`.
pub fn shared(test: &str) -> Option<&'static ControlPlane> {
    static SHARED: OnceLock<Option<ControlPlane>> = OnceLock::new();
    let cp = SHARED.get_or_init(ControlPlane::start_quiet).as_ref();
    if cp.is_none() {
        skip(test);
    }
    cp
}

/// Turns on the control planes of this test binary (see [`Turn`]).
static TURNS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A test's turn on this binary's control planes, held for the test's duration. Tests of one
/// binary (every integration test of a crate) share its control plane: most each take their
/// own namespaces and run side by side ([`Turn::shared`]); a test whose code under test sees
/// every namespace, or which clears the cluster first, runs alone ([`Turn::alone`]). In a
/// binary where one test runs alone, every test on the shared control plane takes one or the
/// other, so that a test running alone meets no other test's objects. (A test whose program
/// has deadlines of its own, such as `xcc demo`, runs alone too: not while control planes
/// boot next to it.)
pub struct Turn {
    _guard: Box<dyn std::any::Any + Send + Sync>,
}

impl Turn {
    /// Side by side with other tests that take this turn; never while one runs alone.
    pub async fn shared() -> Self {
        Self {
            _guard: Box::new(TURNS.read().await),
        }
    }

    /// No other test that takes a turn runs meanwhile.
    pub async fn alone() -> Self {
        Self {
            _guard: Box::new(TURNS.write().await),
        }
    }

    /// [`Turn::shared`] for a test without a runtime.
    pub fn shared_blocking() -> Self {
        Self {
            _guard: Box::new(TURNS.blocking_read()),
        }
    }

    /// [`Turn::alone`] for a test without a runtime.
    pub fn alone_blocking() -> Self {
        Self {
            _guard: Box::new(TURNS.blocking_write()),
        }
    }
}

/// A shared control plane set up for a controller in MCS mode that sees every namespace: the
/// test runs alone ([`Turn::alone`]), our CRDs and the upstream MCS CRDs (`deploy/mcs/crds`)
/// are installed, and there are two fresh namespaces (`xcc-…` for the controller, `shop-…`
/// for the exported and imported services) and the ServiceAccount `account` in the first,
/// bound to `deploy/overlays/mcs`'s RBAC.
pub struct McsPlane {
    /// The control plane.
    pub cp: &'static ControlPlane,
    /// A cluster-admin client.
    pub admin: kube::Client,
    /// The controller's namespace.
    pub xcc: String,
    /// The namespace of the services.
    pub shop: String,
    /// The controller's ServiceAccount.
    pub id: Identity,
    _turn: Turn,
}

impl McsPlane {
    /// The plane for `test` (`None`, after a skip line, without a control plane), the
    /// controller running as `account`.
    pub async fn start(test: &str, account: &str) -> Option<Self> {
        let cp = shared(test)?;
        let turn = Turn::alone().await;
        cp.apply_dir(&deploy_dir().join("crds")).await;
        cp.apply_dir(&deploy_dir().join("mcs/crds")).await;
        let admin = cp.client().await;
        let xcc = cp.namespace("xcc").await;
        let shop = cp.namespace("shop").await;
        let id = cp.identity(&xcc, "overlays/mcs", account).await;
        Some(Self {
            cp,
            admin,
            xcc,
            shop,
            id,
            _turn: turn,
        })
    }
}

fn skip(test: &str) {
    eprintln!(
        "SKIP {test}: needs a real Kubernetes control plane; set {ASSETS_ENV} to a directory \
         with etcd, kube-apiserver and kube-controller-manager (see README, \"Kubernetes tests\")"
    );
}

/// The assets directory, or `None`; panics when required but missing.
fn assets() -> Option<PathBuf> {
    let dir = std::env::var_os(ASSETS_ENV).filter(|d| !d.is_empty());
    let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1");
    match dir {
        Some(d) => {
            let d = PathBuf::from(d);
            for bin in ["etcd", "kube-apiserver", "kube-controller-manager"] {
                assert!(
                    d.join(bin).is_file(),
                    "{ASSETS_ENV}={}: no {bin} there",
                    d.display()
                );
            }
            Some(d)
        }
        None if required => panic!("{REQUIRE_ENV}=1 but {ASSETS_ENV} is not set"),
        None => None,
    }
}

/// Ports [`free_port`] picks from: below Linux's ephemeral range (32768-60999, where `bind(0)`
/// and every outgoing connection take their ports) and below the NodePort range (30000-32767).
const PICKED_PORTS: std::ops::Range<u16> = 20000..30000;

/// A loopback port that was free a moment ago, for a server started next (which binds it
/// itself). Picked at random outside the ephemeral range: a port from `bind(0)` is the kind
/// the next outgoing connection of any test may take as its source port before the server
/// binds it (seen in CI: kube-apiserver failed with "address already in use"). What remains is
/// another pick of the same port in between, which [`ControlPlane`]'s boot survives by trying
/// again.
pub fn free_port() -> u16 {
    for _ in 0..200 {
        let port = rand::random_range(PICKED_PORTS);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl ControlPlane {
    /// A control plane of its own (e.g. a second cluster); `None` after a skip line when the
    /// assets are not configured.
    pub fn start(test: &str) -> Option<Self> {
        let cp = Self::start_quiet();
        if cp.is_none() {
            skip(test);
        }
        cp
    }

    fn start_quiet() -> Option<Self> {
        let bin = assets()?;
        // Readiness is polled with a kube client, which needs a runtime; a thread of its own
        // lets this run from inside any test's runtime.
        Some(
            std::thread::spawn(move || Self::boot(&bin))
                .join()
                .unwrap_or_else(|_| panic!("starting the control plane failed")),
        )
    }

    /// Starts a control plane; again, on new ports and in a new directory, when a server exits
    /// while it starts (a port taken in between, see [`free_port`]).
    fn boot(bin: &Path) -> Self {
        xcc_certs::install_crypto_provider();
        const ATTEMPTS: u32 = 3;
        for _ in 1..ATTEMPTS {
            match Self::try_boot(bin, false) {
                Ok(cp) => return cp,
                Err(why) => eprintln!("testkube: {why}; starting again on new ports"),
            }
        }
        Self::try_boot(bin, true).unwrap_or_else(|why| panic!("{why}"))
    }

    /// One start; on failure its servers stop and, unless `keep_logs`, its directory goes.
    fn try_boot(bin: &Path, keep_logs: bool) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("testkube-")
            .tempdir()
            .unwrap()
            .keep();
        let d = dir.clone();
        let ca = xcc_certs::pki::Ca::generate("testkube.local").unwrap();
        let mut req = xcc_certs::pki::IssueRequest::cluster("kube-apiserver");
        req.dns = vec!["localhost".into(), "kubernetes.default.svc".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let serving = ca.issue(&req).unwrap();
        // ServiceAccount tokens are signed with this key (ES256) and checked with its public half.
        let sa = rcgen::KeyPair::generate().unwrap();
        let token = format!("{:032x}", rand::random::<u128>());
        let files = [
            ("ca.crt", ca.cert_pem().to_string()),
            ("ca.key", ca.key_pem().to_string()),
            ("apiserver.crt", serving.cert_pem.clone()),
            ("apiserver.key", serving.key_pem.clone()),
            ("sa.key", sa.serialize_pem()),
            ("sa.pub", sa.public_key_pem()),
            (
                "tokens.csv",
                format!("{token},admin,admin-uid,system:masters\n"),
            ),
            // Only ServiceAccounts (xcc under test) are audited: the log shows what they were
            // refused and which User-Agent they sent.
            (
                "audit.yaml",
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
                 rules:\n- level: Metadata\n  userGroups: [\"system:serviceaccounts\"]\n\
                 - level: None\n"
                    .to_string(),
            ),
        ];
        for (name, text) in &files {
            std::fs::write(d.join(name), text).unwrap();
        }
        let port = free_port();
        let server = format!("https://127.0.0.1:{port}");
        let kubeconfig = d.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, ca.cert_pem(), &token);
        let cp = Self {
            kubeconfig,
            server,
            ca_pem: ca.cert_pem().to_string(),
            wrappers: Mutex::default(),
            dir,
        };
        let p = |name: &str| d.join(name).display().to_string();
        let etcd_port = free_port();
        cp.spawn(
            &bin.join("etcd"),
            &[p("etcd"), etcd_port.to_string(), free_port().to_string()],
            "etcd",
        );
        cp.spawn(
            &bin.join("kube-apiserver"),
            &[
                format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                "--endpoint-reconciler-type=none".into(),
                "--authorization-mode=RBAC".into(),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                format!("--token-auth-file={}", p("tokens.csv")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                "--allow-privileged=true".into(),
                "--profiling=false".into(),
                format!("--cert-dir={}", p("pki")),
                format!("--audit-policy-file={}", p("audit.yaml")),
                format!("--audit-log-path={}", p("audit.log")),
                "--v=1".into(),
            ],
            "kube-apiserver",
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        if let Err(why) = rt.block_on(cp.wait_ready()) {
            if !keep_logs {
                // Removed once the servers, stopped as `cp` is dropped, have gone.
                cp.cleanup();
            }
            return Err(why);
        }
        cp.spawn(
            &bin.join("kube-controller-manager"),
            &[
                format!("--kubeconfig={}", p("kubeconfig")),
                "--controllers=*,-node-lifecycle-controller".into(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                format!("--cluster-signing-cert-file={}", p("ca.crt")),
                format!("--cluster-signing-key-file={}", p("ca.key")),
                "--use-service-account-credentials=false".into(),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--v=1".into(),
            ],
            "kube-controller-manager",
        );
        cp.cleanup();
        Ok(cp)
    }

    /// Once every server has stopped (after this process exits), remove the directory.
    fn cleanup(&self) {
        let pids: Vec<String> = self
            .wrappers
            .lock()
            .unwrap()
            .iter_mut()
            // A wrapper that has exited (and been reaped) may see its pid reused.
            .filter_map(|(_, c)| matches!(c.try_wait(), Ok(None)).then(|| c.id().to_string()))
            .collect();
        let child = Command::new("sh")
            .arg("-c")
            .arg(
                r#"dir=$1; shift; cat >/dev/null
                for p in "$@"; do while kill -0 "$p" 2>/dev/null; do sleep 0.2; done; done
                rm -rf "$dir""#,
            )
            .arg("testkube-cleanup")
            .arg(&self.dir)
            .args(pids)
            .stdin(Stdio::piped())
            .spawn();
        if let Ok(child) = child {
            self.wrappers.lock().unwrap().push(("cleanup", child));
        }
    }

    /// Start `bin args` under a wrapper that kills it when our end of its stdin closes and exits
    /// when it exits. (A background job's stdin is /dev/null in `sh`: the pipe is passed to the
    /// job that waits for its end as fd 3.)
    fn spawn(&self, bin: &Path, args: &[String], log: &'static str) {
        let out = std::fs::File::create(self.dir.as_path().join(format!("{log}.log"))).unwrap();
        let child = Command::new("sh")
            .arg("-c")
            .arg(
                r#"exec 3<&0; "$@" 3<&- & child=$!
                { cat <&3 >/dev/null; kill "$child" 2>/dev/null; } &
                exec 3<&-; wait "$child""#,
            )
            .arg("testkube-guard")
            .arg(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        self.wrappers.lock().unwrap().push((log, child));
    }

    /// Until the API server answers ready; an error when a server exited or after [`STARTUP`].
    async fn wait_ready(&self) -> Result<(), String> {
        let client = self.client().await;
        let deadline = Instant::now() + STARTUP;
        let dir = self.dir.as_path().display();
        loop {
            let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
            if client.request_text(req).await.is_ok_and(|t| t == "ok") {
                return Ok(());
            }
            for (name, wrapper) in self.wrappers.lock().unwrap().iter_mut() {
                if let Ok(Some(status)) = wrapper.try_wait() {
                    return Err(format!("{name} exited ({status}); logs in {dir}"));
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "kube-apiserver not ready after {STARTUP:?}; logs in {dir}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The admin (system:masters) kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A scratch directory that lives as long as the control plane.
    pub fn dir(&self) -> &Path {
        self.dir.as_path()
    }

    /// An admin client (build one per test: a client belongs to the runtime that made it).
    pub async fn client(&self) -> kube::Client {
        client_from(&self.kubeconfig).await
    }

    /// `kubectl` (from the assets directory, else `PATH`) with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut cmd = kubectl();
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    /// A fresh namespace named `<prefix>-<n>`.
    pub async fn namespace(&self, prefix: &str) -> String {
        let api: Api<DynamicObject> =
            Api::all_with(self.client().await, &ar("v1", "Namespace", "namespaces"));
        let ns: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"generateName": format!("{prefix}-")},
        }))
        .unwrap();
        let created = api.create(&PostParams::default(), &ns).await.unwrap();
        created.metadata.name.unwrap()
    }

    /// Server-side apply every document of `docs` (any kind the server knows), as `kubectl
    /// apply --server-side` would; CRDs are waited for until established.
    pub async fn apply(&self, docs: &[Value]) {
        let client = self.client().await;
        for doc in docs {
            apply(&client, doc).await;
        }
    }

    /// Apply the YAML files under `dir` (e.g. upstream CRDs), then wait for the CRDs to serve.
    pub async fn apply_dir(&self, dir: &Path) {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        let docs: Vec<Value> = files
            .iter()
            .flat_map(|f| yaml_docs(&std::fs::read_to_string(f).unwrap()))
            .collect();
        self.apply(&docs).await;
    }

    /// A ServiceAccount `account` in `ns`, bound to exactly the RBAC of `overlay` (a directory
    /// under `deploy/`, rendered by `kubectl kustomize`), moved into `ns`: Roles and bindings
    /// in the xcc namespace go to `ns`; cluster-scoped ones get `-<ns>` appended so tests do
    /// not share them. Returns its kubeconfig (token from the TokenRequest API).
    pub async fn identity(&self, ns: &str, overlay: &str, account: &str) -> Identity {
        let client = self.client().await;
        let docs = rbac_for(&render(overlay), ns);
        assert!(
            docs.iter()
                .any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == account),
            "deploy/{overlay} has no ServiceAccount {account}"
        );
        for doc in &docs {
            apply(&client, doc).await;
        }
        let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client, ns);
        let request = k8s_openapi::api::authentication::v1::TokenRequest {
            spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
                // One hour outlives every test; the API server's minimum is ten minutes.
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let issued: k8s_openapi::api::authentication::v1::TokenRequest = api
            .create_subresource("token", account, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("TokenRequest for {ns}/{account}: {e}"));
        let token = issued.status.unwrap().token;
        let kubeconfig = self
            .dir
            .as_path()
            .join(format!("kubeconfig-{ns}-{account}"));
        write_kubeconfig(&kubeconfig, &self.server, &self.ca_pem, &token);
        Identity {
            kubeconfig,
            user: format!("system:serviceaccount:{ns}:{account}"),
        }
    }

    /// Audit events (level Metadata) of ServiceAccount requests so far.
    pub fn audit(&self) -> Vec<Value> {
        let text =
            std::fs::read_to_string(self.dir.as_path().join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Completed requests of `user` so far, in the order the audit log has them.
    pub fn requests(&self, user: &str) -> Vec<Request> {
        self.audit()
            .iter()
            .filter(|e| e["user"]["username"] == user && e["stage"] == "ResponseComplete")
            .map(Request::of)
            .collect()
    }

    /// Write requests (create, update, patch, delete, deletecollection) of `user` so far.
    pub fn writes(&self, user: &str) -> Vec<Request> {
        let mut requests = self.requests(user);
        requests.retain(Request::is_write);
        requests
    }

    /// Write requests of `user` the API server received at or after `since` (the audit
    /// event's `requestReceivedTimestamp`, so a write sent before `since` but logged later
    /// does not count), each as `verb group/resource namespace/name code`.
    pub fn writes_since(&self, user: &str, since: std::time::SystemTime) -> Vec<String> {
        self.writes(user)
            .iter()
            .filter(|w| w.received.is_some_and(|t| t >= since))
            .map(Request::to_string)
            .collect()
    }

    /// Wait until every request `client` (authenticated as `user`) has made so far is in the
    /// audit log: an event is written as its request completes, possibly just after the
    /// answer. Sends one more request (a read of a ConfigMap that need not exist, in `ns`) and
    /// polls the log until it is there; the log is a file, with nothing to await.
    pub async fn audit_flushed(&self, client: &kube::Client, user: &str, ns: &str) {
        static MARKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let marker = format!(
            "{AUDIT_MARKER}{}",
            MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let _ = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
            .get_opt(&marker)
            .await;
        poll("the marker request in the audit log", STARTUP, || {
            self.requests(user)
                .iter()
                .any(|r| r.resource == "configmaps" && r.name == marker)
        })
        .await;
    }

    /// Watches of `kinds` (`(apiVersion, kind, plural)`) in `ns` (all namespaces when `None`)
    /// whose every event wakes [`Changes::wait_for`]; returns once each has listed.
    pub async fn changes(&self, ns: Option<&str>, kinds: &[(&str, &str, &str)]) -> Changes {
        use futures::StreamExt as _;
        use kube::runtime::{WatchStreamExt as _, watcher};
        let client = self.client().await;
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let mut tasks = Vec::new();
        for (api_version, kind, plural) in kinds {
            let resource = ar(api_version, kind, plural);
            let api: Api<DynamicObject> = match ns {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            let (listed_tx, listed) = tokio::sync::oneshot::channel();
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                let mut listed_tx = Some(listed_tx);
                let mut events = std::pin::pin!(
                    watcher::watcher(api, watcher::Config::default()).default_backoff()
                );
                while let Some(event) = events.next().await {
                    if matches!(event, Ok(watcher::Event::InitDone))
                        && let Some(t) = listed_tx.take()
                    {
                        let _ = t.send(());
                    }
                    tx.send_modify(|n| *n += 1);
                }
            }));
            tokio::time::timeout(STARTUP, listed)
                .await
                .unwrap_or_else(|_| panic!("watch of {plural} never listed"))
                .unwrap();
        }
        Changes { rx, tasks }
    }

    /// Requests of `user` the API server refused with 403 Forbidden: `verb group/resource in
    /// namespace` for each. The reads of [`ControlPlane::audit_flushed`] (which a
    /// ServiceAccount may have no right to) do not count.
    pub fn forbidden(&self, user: &str) -> Vec<String> {
        self.requests(user)
            .iter()
            .filter(|r| r.code == 403 && !r.name.starts_with(AUDIT_MARKER))
            .map(|r| {
                let ns = if r.namespace.is_empty() {
                    "(cluster)"
                } else {
                    &r.namespace
                };
                format!("{} {}/{} in {ns:?}", r.verb, r.group, r.resource)
            })
            .collect()
    }
}

/// Name prefix of the ConfigMaps [`ControlPlane::audit_flushed`] reads.
const AUDIT_MARKER: &str = "audit-marker-";

/// Poll in-process state (a controller's readiness or counters, which no watch reports) every
/// 20 ms until `check` holds; fail naming `what` after `timeout`.
pub async fn poll(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Watches that wake waiters on every change (see [`ControlPlane::changes`]); they stop when
/// this is dropped.
pub struct Changes {
    rx: tokio::sync::watch::Receiver<u64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Changes {
    /// A receiver whose value changes on every event the watches see (for waiting on several
    /// control planes at once).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.rx.clone()
    }

    /// Run `check` now and after every change the watches see, until it returns `Some`; fail
    /// naming `what` after `timeout`. Checks read the API server, so they see the state
    /// after the change that woke them.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        let mut rx = self.rx.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::timeout_at(deadline, rx.changed())
                .await
                .unwrap_or_else(|_| panic!("timed out after {timeout:?} waiting for {what}"))
                .unwrap();
        }
    }
}

impl Drop for Changes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// One completed request of a ServiceAccount, from the API server's audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub verb: String,
    /// The API group; empty for the core group.
    pub group: String,
    /// The resource, with its subresource if any: `servicerecords/status`.
    pub resource: String,
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    /// Empty for a list or a collection.
    pub name: String,
    /// The response's status code.
    pub code: i64,
    /// When the API server received it.
    pub received: Option<std::time::SystemTime>,
    /// When the API server had answered it (the event's `stageTimestamp`, at
    /// `ResponseComplete`).
    pub completed: Option<std::time::SystemTime>,
}

/// An audit event's RFC 3339 timestamp.
fn timestamp(v: &Value) -> Option<std::time::SystemTime> {
    v.as_str().and_then(|t| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .ok()
            .map(Into::into)
    })
}

impl Request {
    fn of(e: &Value) -> Self {
        let o = &e["objectRef"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let mut resource = text(&o["resource"]);
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        Self {
            verb: text(&e["verb"]),
            group: text(&o["apiGroup"]),
            resource,
            namespace: text(&o["namespace"]),
            name: text(&o["name"]),
            code: e["responseStatus"]["code"].as_i64().unwrap_or_default(),
            received: timestamp(&e["requestReceivedTimestamp"]),
            completed: timestamp(&e["stageTimestamp"]),
        }
    }

    /// create, update, patch, delete or deletecollection.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// `verb resource`, e.g. `patch servicerecords/status`.
    pub fn action(&self) -> String {
        format!("{} {}", self.verb, self.resource)
    }
}

/// `verb group/resource namespace/name code`.
impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{} {}/{} {}",
            self.verb, self.group, self.resource, self.namespace, self.name, self.code
        )
    }
}

/// How xcc is run in a test: a ServiceAccount's kubeconfig.
pub struct Identity {
    /// A kubeconfig with the ServiceAccount's token (for `KUBECONFIG`).
    pub kubeconfig: PathBuf,
    /// `system:serviceaccount:<ns>:<name>`, as the audit log names it.
    pub user: String,
}

impl Identity {
    /// A client acting as this ServiceAccount.
    pub async fn client(&self) -> kube::Client {
        client_from(&self.kubeconfig).await
    }
}

async fn client_from(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn write_kubeconfig(path: &Path, server: &str, ca_pem: &str, token: &str) {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"{server}\", \
         certificate-authority-data: {ca}}}\nusers:\n- name: user\n  user: {{token: {token}}}\n\
         contexts:\n- name: test\n  context: {{cluster: test, user: user}}\ncurrent-context: test\n"
    );
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}
