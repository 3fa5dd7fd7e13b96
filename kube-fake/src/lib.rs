//! An in-process fake Kubernetes API server, kept only for what a real API server cannot be
//! made to do on demand in a test.
//!
//! Tests of API-server behaviour run against the real control plane (`xcc-testkube`). This fake
//! remains for the few tests that need:
//!
//! * [`FakeApiServer::compact`]: every open watch, and every resume from an older
//!   `resourceVersion`, answered 410 Gone (reason Expired), forcing clients to relist;
//! * [`FakeApiServer::writes`] / [`FakeApiServer::reset_counters`]: a count of the writes that
//!   changed stored state, so a test can assert that a relist wrote nothing;
//! * [`FakeApiServer::put_raw`]: storing a state clients cannot create (e.g. an object whose UID
//!   changes in one step, as a relist that missed the deletion shows it);
//! * [`FakeApiServer::register`]: a resource type that starts being served while clients run.
//!
//! It serves plain HTTP on `127.0.0.1:0` to kube-rs clients ([`FakeApiServer::client`]) with one
//! global `resourceVersion`, optimistic concurrency, no-op writes that are not written, the
//! patch types and server-side apply the product uses, defaulting and validation of the built-in
//! resources the product writes, and the checked-in XCC CRD schemas ([`crds`]). It has no
//! authentication, admission, garbage collection, finalizers or namespace termination: deletes
//! remove the object at once (after checking preconditions).

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod apply;
mod counters;
pub mod crds;
mod defaults;
mod delete;
mod fields;
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

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use counters::{Counts, Verb};
pub use resources::{RegisterError, ResourceSpec, Validator};

use crate::fields::Scope;
use crate::resources::{Registry, split_api_version};
use crate::store::{Store, key, present};
use crate::write::WriteReq;

/// Watch history kept: enough for any test.
const HISTORY: usize = 10_000;
/// Namespaces every cluster starts with.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// State shared by the HTTP handlers, watch tasks and the test-facing handle.
pub(crate) struct Shared {
    store: Mutex<Store>,
    /// The store's latest resourceVersion; watchers wake on change.
    changes: tokio::sync::watch::Sender<u64>,
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

/// Why [`FakeApiServer::put_raw`] refused an object.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("put_raw: {0}")]
pub struct RawWriteError(String);

/// Configures a [`FakeApiServer`] before it starts.
#[derive(Debug, Default)]
pub struct Builder {
    namespaces: Vec<String>,
    resources: Vec<ResourceSpec>,
}

impl Builder {
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
    /// If `127.0.0.1:0` cannot be bound or a resource is refused (test setup errors).
    pub async fn start(self) -> FakeApiServer {
        let mut registry = Registry::with_builtins();
        for spec in self.resources {
            if let Err(e) = registry.register(spec) {
                panic!("fake API server: {e}");
            }
        }
        let bound = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await;
        let Ok((listener, addr)) = bound.and_then(|l| l.local_addr().map(|a| (l, a))) else {
            panic!("fake API server: cannot bind 127.0.0.1:0");
        };
        let mut store = Store::new(registry, HISTORY);
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
            shutdown: CancellationToken::new(),
            addr,
        });
        let app = axum::Router::new()
            .fallback(routes::handle)
            .with_state(shared.clone());
        let token = shared.shutdown.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "fake API server stopped");
            }
        });
        FakeApiServer { shared }
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

/// A running fake API server. Dropping it stops serving and ends every open watch.
pub struct FakeApiServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// A builder: namespaces and custom resources to start with.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A kube client talking to this server (no authentication, namespace `default`).
    ///
    /// # Panics
    /// If kube cannot build a client for a plain-HTTP loopback URL (a kube/TLS setup bug).
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.shared.addr);
        let config = kube::Config::new(url.parse().unwrap_or_default());
        match kube::Client::try_from(config) {
            Ok(c) => c,
            Err(e) => panic!("building a kube client for {url}: {e}"),
        }
    }

    /// Registers (or re-registers) a custom resource; served immediately.
    pub fn register(&self, spec: ResourceSpec) -> Result<(), RegisterError> {
        self.shared.lock().registry.register(spec)
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

    /// Mutating requests that changed stored state, per (resource, verb). A failed or no-op
    /// request is not counted, nor is [`FakeApiServer::put_raw`].
    pub fn writes(&self) -> Counts {
        self.shared.lock().writes.clone()
    }

    /// Zeroes the write counters.
    pub fn reset_counters(&self) {
        self.shared.lock().writes = Counts::default();
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}
