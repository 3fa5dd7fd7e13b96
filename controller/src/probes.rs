//! `/healthz`, `/readyz` and `/metrics` over plain HTTP for the kubelet and Prometheus.
//! Readiness is explicit: a controller reports ready only after its first full sync.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Readiness flag, on a watch so that waiters wake when it changes.
#[derive(Clone, Debug)]
pub struct Health {
    ready: Arc<watch::Sender<bool>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            ready: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }
    /// Wait until ready (at once when ready now).
    pub async fn ready(&self) {
        let mut rx = self.ready.subscribe();
        // `self` holds the sender, so the channel stays open while this waits.
        rx.wait_for(|r| *r).await.ok();
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    #[test]
    fn a_waiter_wakes_when_readiness_turns_true_and_not_before() {
        let health = Health::default();
        let mut waiter = Box::pin(health.ready());
        assert!((&mut waiter).now_or_never().is_none(), "not ready yet");
        health.set_ready(false);
        assert!((&mut waiter).now_or_never().is_none(), "still not ready");
        health.clone().set_ready(true);
        assert!(health.is_ready());
        assert_eq!(waiter.now_or_never(), Some(()));
        assert_eq!(
            health.ready().now_or_never(),
            Some(()),
            "ready now: at once"
        );
        health.set_ready(false);
        assert!(!health.is_ready());
        assert!(health.ready().now_or_never().is_none());
    }
}
