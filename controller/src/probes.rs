//! `/healthz`, `/readyz` and `/metrics` over plain HTTP for the kubelet and Prometheus.
//! Readiness is explicit: a controller reports ready only after its first full sync.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Readiness flag plus the reason shown while not ready.
#[derive(Clone, Debug, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// What the endpoint serves: the metrics, the readiness answer and a refresh run before each
/// scrape.
pub struct Probes {
    registry: Arc<Registry>,
    ready: Arc<dyn Fn() -> bool + Send + Sync>,
    on_scrape: Arc<dyn Fn() + Send + Sync>,
}

impl Probes {
    /// `registry`'s metrics, ready while `health` says so.
    pub fn new(registry: Registry, health: Health) -> Self {
        Self::ready_when(registry, move || health.is_ready())
    }

    /// Readiness computed by `ready` (for components whose readiness lives elsewhere, e.g. the
    /// DNS server's published snapshot).
    pub fn ready_when(
        registry: Registry,
        ready: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            registry: Arc::new(registry),
            ready: Arc::new(ready),
            on_scrape: Arc::new(|| {}),
        }
    }

    /// Run `refresh` before each scrape (to update gauges).
    pub fn on_scrape(mut self, refresh: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_scrape = Arc::new(refresh);
        self
    }
}

/// Serve the probes and metrics on `listener` until `cancel` fires.
pub async fn serve(
    listener: tokio::net::TcpListener,
    probes: Probes,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let Probes {
        registry,
        ready,
        on_scrape,
    } = probes;
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ready")
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "not ready: first sync pending",
                        )
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                on_scrape();
                let mut body = String::new();
                let result = prometheus_client::encoding::text::encode(&mut body, &registry);
                async move {
                    match result {
                        Ok(()) => (
                            StatusCode::OK,
                            [(
                                header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            body,
                        ),
                        Err(_) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(header::CONTENT_TYPE, "text/plain")],
                            "encoding failed".to_string(),
                        ),
                    }
                }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}
