//! An in-process fake Kubernetes API server for tests.
//!
//! [`FakeApiServer::start`] serves plain HTTP on `127.0.0.1:0`. kube-rs clients connect through
//! [`FakeApiServer::client`]. Tests can also read and write the store directly
//! ([`FakeApiServer::get`], [`FakeApiServer::list`], [`FakeApiServer::put_raw`]), count requests
//! ([`FakeApiServer::requests`], [`FakeApiServer::writes`]) and expire the watch history
//! ([`FakeApiServer::compact`]) to exercise 410 Gone recovery.
//!
//! The fake aims to be faithful wherever controllers depend on behaviour, and strict rather than
//! lenient, because the product also runs against real apiservers:
//!
//! * one global, monotonically increasing `resourceVersion` (like an etcd revision); lists carry
//!   it; watches resume from it and answer 410 Gone (reason Expired) once it leaves the bounded
//!   history; BOOKMARKs; `timeoutSeconds`; `sendInitialEvents`;
//! * create/replace/patch (merge, JSON, strategic merge, server-side apply with managed fields
//!   and conflicts)/delete with the apiserver's status codes and `metav1.Status` bodies;
//!   optimistic concurrency (409 on a stale `resourceVersion`), CRs refuse unconditional PUTs;
//! * no-op writes are not written: same `resourceVersion`, no watch event;
//! * `metadata.generation` per resource strategy (custom resources, pods, EndpointSlices; not
//!   Services or ConfigMaps); `/status` subresource isolation;
//! * defaulting and validation of Services (ClusterIP and NodePort allocation), Endpoints,
//!   EndpointSlices and more, metadata validation; custom resources registered from their CRD
//!   get structural-schema pruning, defaulting and validation, plus pluggable validators;
//! * finalizers, garbage collection through ownerReferences (Background, Foreground, Orphan),
//!   namespace termination; namespaces must exist.
//!
//! Known simplifications (none of them make the fake more permissive about input a real server
//! rejects, except where noted): no authentication or authorization; no admission webhooks; CEL
//! rules of CRDs are not evaluated (reimplement them as validators), and resources registered
//! without a schema keep unknown fields (more lenient);
//! lists and continue tokens always read the latest state (no historical snapshots; an `Exact`
//! list at an older version answers 410); `events.k8s.io` and core events are stored separately;
//! graceful pod deletion is immediate (no kubelet); garbage collection runs synchronously after
//! each delete; strategic merge patch and server-side apply know the list keys listed in `patch`
//! and `resources`, not the full OpenAPI schema; no protobuf, no table output, no OpenAPI
//! documents, no `/log`, `/exec`, `/scale` or other subresources besides `/status`.

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod apply;
mod counters;
pub mod crds;
mod defaults;
mod fields;
mod gc;
mod meta;
mod patch;
mod resources;
mod routes;
mod schema;
mod selector;
mod status;
mod store;
mod validation;
mod watch;
mod write;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use counters::{Counts, Verb};
pub use resources::{ListMapKeys, RegisterError, ResourceSpec, Validator};

use crate::fields::Scope;
use crate::resources::{Registry, split_api_version};
use crate::store::{Store, key, present};
use crate::validation::Options;
use crate::write::WriteReq;

/// Watch history kept by default: enough for any test, small enough to force 410 with a burst.
const DEFAULT_HISTORY: usize = 10_000;
/// Bookmark period by default (a real apiserver sends one about every minute).
const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);
/// Namespaces every cluster starts with.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// State shared by the HTTP handlers, watch tasks and the test-facing handle.
pub(crate) struct Shared {
    store: Mutex<Store>,
    /// The store's latest resourceVersion; watchers wake on change.
    changes: tokio::sync::watch::Sender<u64>,
    /// Incremented by [`FakeApiServer::send_bookmarks`].
    bookmarks: tokio::sync::watch::Sender<u64>,
    bookmark_interval: Duration,
    shutdown: CancellationToken,
    addr: SocketAddr,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
    pub(crate) fn notify(&self, rv: u64) {
        self.changes.send_replace(rv);
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Binding `127.0.0.1:0` failed.
    #[error("binding 127.0.0.1:0: {0}")]
    Bind(#[from] std::io::Error),
    /// A resource passed to [`Builder::resource`] was refused.
    #[error(transparent)]
    Register(#[from] RegisterError),
}

/// Why [`FakeApiServer::put_raw`] refused an object.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("put_raw: {0}")]
pub struct RawWriteError(String);

/// Configures a [`FakeApiServer`] before it starts.
#[derive(Debug)]
pub struct Builder {
    history_limit: usize,
    bookmark_interval: Duration,
    allow_special_endpoint_ips: bool,
    namespaces: Vec<String>,
    resources: Vec<ResourceSpec>,
}

impl Default for Builder {
    fn default() -> Self {
        Self {
            history_limit: DEFAULT_HISTORY,
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            allow_special_endpoint_ips: false,
            namespaces: Vec::new(),
            resources: Vec::new(),
        }
    }
}

impl Builder {
    /// How many watch events are retained (at least 1). Watches and continue tokens older than
    /// the retained history get 410 Gone.
    pub fn history_limit(mut self, events: usize) -> Self {
        self.history_limit = events;
        self
    }
    /// How often open watches that allow bookmarks receive one.
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }
    /// Accept loopback, link-local and unspecified addresses in Endpoints and EndpointSlices.
    /// A real apiserver rejects them; enable only for loopback-only multi-process setups, and
    /// know that the same objects will be refused by a real cluster.
    pub fn allow_special_endpoint_ips(mut self, allow: bool) -> Self {
        self.allow_special_endpoint_ips = allow;
        self
    }
    /// Creates this namespace at start (besides default, kube-system, kube-public,
    /// kube-node-lease).
    pub fn namespace(mut self, name: &str) -> Self {
        self.namespaces.push(name.to_string());
        self
    }
    /// Registers a custom resource at start.
    pub fn resource(mut self, spec: ResourceSpec) -> Self {
        self.resources.push(spec);
        self
    }

    /// Starts the server.
    ///
    /// # Panics
    /// If `127.0.0.1:0` cannot be bound or a registered resource is refused (test setup errors).
    pub async fn start(self) -> FakeApiServer {
        match self.try_start().await {
            Ok(s) => s,
            Err(e) => panic!("fake API server failed to start: {e}"),
        }
    }

    /// Starts the server, reporting setup errors.
    pub async fn try_start(self) -> Result<FakeApiServer, StartError> {
        let mut registry = Registry::with_builtins();
        for spec in self.resources {
            registry.register(spec)?;
        }
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let opts = Options {
            allow_special_endpoint_ips: self.allow_special_endpoint_ips,
        };
        let mut store = Store::new(registry, self.history_limit, opts);
        for ns in INITIAL_NAMESPACES
            .iter()
            .copied()
            .chain(self.namespaces.iter().map(String::as_str))
        {
            store.ensure_namespace(ns);
        }
        create_kubernetes_service(&mut store);
        let rv = store.resource_version();
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            changes: tokio::sync::watch::Sender::new(rv),
            bookmarks: tokio::sync::watch::Sender::new(0),
            bookmark_interval: self.bookmark_interval,
            shutdown: CancellationToken::new(),
            addr,
        });
        let app = axum::Router::new()
            .fallback(routes::handle)
            .with_state(shared.clone());
        let token = shared.shutdown.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "fake API server stopped");
            }
        });
        Ok(FakeApiServer {
            shared,
            task: Some(task),
        })
    }
}

/// The `kubernetes` Service every cluster has in `default`.
fn create_kubernetes_service(store: &mut Store) {
    let Some(svc) = store.registry.find("", "v1", "services") else {
        return;
    };
    let req = WriteReq {
        res: &svc,
        namespace: "default",
        name: "",
        scope: Scope::Main,
        manager: "kube-apiserver",
        dry_run: false,
    };
    let body = json!({
        "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {
            "clusterIP": defaults::KUBERNETES_SERVICE_IP,
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}],
        },
    });
    if let Err(e) = store.create(&req, body, None) {
        tracing::error!(error = %e, "could not create the kubernetes Service");
    }
}

/// A running fake API server. Dropping it (or [`FakeApiServer::shutdown`]) stops serving and
/// ends every open watch.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// Starts a server with default settings.
    ///
    /// # Panics
    /// If `127.0.0.1:0` cannot be bound.
    pub async fn start() -> Self {
        Builder::default().start().await
    }

    /// A builder for non-default settings.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A kube client configuration for this server (no authentication, namespace `default`).
    pub fn kube_config(&self) -> kube::Config {
        let uri = self.url().parse().unwrap_or_default();
        kube::Config::new(uri)
    }

    /// A kube client talking to this server.
    ///
    /// # Panics
    /// If kube cannot build a client for a plain-HTTP loopback URL (a kube/TLS setup bug).
    pub fn client(&self) -> kube::Client {
        match kube::Client::try_from(self.kube_config()) {
            Ok(c) => c,
            Err(e) => panic!("building a kube client for {}: {e}", self.url()),
        }
    }

    /// Registers (or re-registers) a custom resource; served immediately.
    pub fn register(&self, spec: ResourceSpec) -> Result<(), RegisterError> {
        self.shared.lock().registry.register(spec)
    }

    /// Creates a namespace if it does not exist (as `kube-apiserver`, through validation).
    pub fn ensure_namespace(&self, name: &str) {
        let rv = {
            let mut s = self.shared.lock();
            s.ensure_namespace(name);
            s.resource_version()
        };
        self.shared.notify(rv);
    }

    /// The stored object, as served at `api_version` (e.g. `v1`, `discovery.k8s.io/v1`).
    pub fn get(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let (g, v) = split_api_version(api_version);
        let s = self.shared.lock();
        let res = s.registry.find(g, v, plural)?;
        s.get(&key(&res, namespace.unwrap_or_default(), name))
            .map(|o| present(o, &res))
    }

    /// Stored objects of a resource (all namespaces when `namespace` is `None`), ordered by
    /// namespace and name.
    pub fn list(&self, api_version: &str, plural: &str, namespace: Option<&str>) -> Vec<Value> {
        let (g, v) = split_api_version(api_version);
        let s = self.shared.lock();
        let Some(res) = s.registry.find(g, v, plural) else {
            return Vec::new();
        };
        s.list(&res, namespace)
            .map(|(_, o)| present(o, &res))
            .collect()
    }

    /// Stores an object as given, bypassing defaulting, validation, preconditions and managed
    /// fields (uid and creationTimestamp are filled in if absent). It still gets the next
    /// resourceVersion and a watch event. Use it to set up states clients cannot create.
    pub fn put_raw(&self, object: Value) -> Result<Value, RawWriteError> {
        let (out, rv) = {
            let mut s = self.shared.lock();
            let out = s.put_raw(object).map_err(RawWriteError)?;
            (out, s.resource_version())
        };
        self.shared.notify(rv);
        Ok(out)
    }

    /// The latest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version()
    }

    /// Simulates an apiserver restart that lost its watch cache (or an etcd compaction): the
    /// history is dropped and every resourceVersion handed out so far becomes too old. Open
    /// watches receive an ERROR 410 (Expired) and end; resuming from any earlier version, or
    /// continuing an earlier paginated list, is answered with 410 Gone, so clients must relist.
    pub fn compact(&self) {
        let rv = {
            let mut s = self.shared.lock();
            s.compact();
            s.resource_version()
        };
        self.shared.notify(rv);
    }

    /// Sends a BOOKMARK now to every open watch that allows bookmarks.
    pub fn send_bookmarks(&self) {
        self.shared.bookmarks.send_modify(|n| *n += 1);
    }

    /// Mutating requests (POST/PUT/PATCH/DELETE) received, per (resource, verb), whether or not
    /// they succeeded or changed anything.
    pub fn requests(&self) -> Counts {
        self.shared.lock().counters.requests.clone()
    }

    /// Mutating requests that changed stored state, per (resource, verb). A no-op update or
    /// patch counts in [`FakeApiServer::requests`] but not here.
    pub fn writes(&self) -> Counts {
        self.shared.lock().counters.writes.clone()
    }

    /// GET, LIST and WATCH requests received, per (resource, verb).
    pub fn reads(&self) -> Counts {
        self.shared.lock().counters.reads.clone()
    }

    /// Zeroes all request counters.
    pub fn reset_counters(&self) {
        self.shared.lock().counters = Default::default();
    }

    /// Stops serving, ends open watches and waits for the server task.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
        {
            tracing::error!(error = %e, "fake API server task failed");
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}
