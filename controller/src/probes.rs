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

/// Serve the probes and metrics on `listener` until `cancel` fires. `on_scrape` runs before each
/// scrape to refresh gauges.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    health: Health,
    on_scrape: Arc<dyn Fn() + Send + Sync>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    serve_with(
        listener,
        registry,
        Arc::new(move || health.is_ready()),
        on_scrape,
        cancel,
    )
    .await
}

/// [`serve`] with readiness computed by `ready` (for components whose readiness lives elsewhere,
/// e.g. the DNS server's published snapshot).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    ready: Arc<dyn Fn() -> bool + Send + Sync>,
    on_scrape: Arc<dyn Fn() + Send + Sync>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
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
