//! The process runtime of `xcc registry`, `publisher`, `binder` and `dns`: one cancellation
//! token that SIGTERM and Ctrl-C fire, the probes and metrics listener, work under the leader
//! Lease, all on one supervised task set ([`crate::tasks`]): a task that stops on its own,
//! fails or panics stops the process with an error naming it.
//!
//! A process's wiring is: build its parts, hand them to a [`Runtime`], [`Runtime::run`].
//!
//! Why not `kubert`: its runtime (admin server, signals, lease) is the same idea, but its
//! current release is built on kube 1.1, k8s-openapi 0.25 and prometheus-client 0.23, and we
//! are on kube 5, k8s-openapi 0.29 and prometheus-client 0.24 (one k8s-openapi version per build
//! graph); its probes are `/live` and `/ready` where our manifests probe `/healthz` and
//! `/readyz`; and it does not supervise tasks. The probes keep today's posture: plain HTTP
//! carrying no catalog data, every API listener mTLS-only.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::leader::{LeaderConfig, run_as_ready_leader};
use crate::probes::{Health, Probes};
use crate::tasks::{Spawner, TaskError, Tasks};

/// The probes and metrics listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("binding the metrics listener on {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// One process's runtime.
pub struct Runtime {
    tasks: Tasks,
}

impl Runtime {
    /// A runtime under `cancel` (shutdown waits for every task).
    pub fn new(cancel: CancellationToken) -> Self {
        Self {
            tasks: Tasks::new(cancel),
        }
    }

    /// On shutdown, abort tasks still running after `grace`.
    pub fn with_grace(self, grace: std::time::Duration) -> Self {
        Self {
            tasks: self.tasks.with_grace(grace),
        }
    }

    pub fn spawner(&self) -> &Spawner {
        self.tasks.spawner()
    }

    /// The process's token: cancelled on a signal, on shutdown or when a task fails.
    pub fn token(&self) -> &CancellationToken {
        self.tasks.token()
    }

    /// Start a task that runs until shutdown (see [`Spawner::spawn`]).
    pub fn spawn<F>(&self, name: impl Into<String>, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.spawner().spawn(name, task);
    }

    /// Shut down gracefully on SIGTERM or Ctrl-C. The handlers are installed now, so a signal
    /// that follows a "started" line is always handled.
    pub fn stop_on_signals(&self) -> anyhow::Result<()> {
        self.stop_on(shutdown_signal()?);
        Ok(())
    }

    /// Shut down gracefully when `signal` completes (see [`shutdown_signal`]).
    pub fn stop_on(&self, signal: impl Future<Output = ()> + Send + 'static) {
        let cancel = self.token().clone();
        self.spawn("signals", async move {
            tokio::select! {
                _ = signal => {
                    info!("shutdown requested");
                    cancel.cancel();
                }
                _ = cancel.cancelled() => {}
            }
            Ok(())
        });
    }

    /// Bind `addr` now and serve `/healthz`, `/readyz` and `/metrics` on it until shutdown.
    /// Returns the bound address (port 0 picks a free one).
    pub async fn serve_probes(
        &self,
        addr: SocketAddr,
        probes: Probes,
    ) -> Result<SocketAddr, BindError> {
        let bind = async {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let bound = listener.local_addr()?;
            Ok((listener, bound))
        };
        let (listener, bound) = bind.await.map_err(|source| BindError { addr, source })?;
        info!(addr = %bound, "serving /healthz, /readyz, /metrics");
        let cancel = self.token().clone();
        self.spawn("metrics listener", async move {
            crate::probes::serve(listener, probes, cancel)
                .await
                .context("serving probes and metrics")
        });
        Ok(bound)
    }

    /// Run `work` while this replica holds the Lease `config` names (`None`: at once), as
    /// the task `name`, with readiness in `health` following the leader's rules
    /// ([`run_as_ready_leader`]); losing the Lease stops the process.
    pub fn spawn_leader<F, Fut>(
        &self,
        name: impl Into<String>,
        client: kube::Client,
        config: Option<LeaderConfig>,
        health: Health,
        work: F,
    ) where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let cancel = self.token().clone();
        self.spawn(
            name,
            run_as_ready_leader(client, config, cancel, health, work),
        );
    }

    /// Run until shutdown or until a task stops the process; then drain.
    pub async fn run(self) -> Result<(), TaskError> {
        self.tasks.run().await
    }

    /// Shut down now and drain.
    pub async fn shutdown(self) -> Result<(), TaskError> {
        self.tasks.shutdown().await
    }
}

/// Registers SIGTERM (and Ctrl-C) now; the returned future completes on either.
pub fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        Ok(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async move {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn probes_answer_until_shutdown_and_readiness_follows_health() {
        let rt = Runtime::new(CancellationToken::new());
        let health = Health::default();
        let addr = rt
            .serve_probes(
                "127.0.0.1:0".parse().unwrap(),
                Probes::new(Default::default(), health.clone()),
            )
            .await
            .unwrap();
        let run = tokio::spawn(rt.run());
        assert_eq!(get(addr, "/healthz").await, (200, "ok".to_string()));
        assert_eq!(get(addr, "/readyz").await.0, 503);
        health.set_ready(true);
        assert_eq!(get(addr, "/readyz").await, (200, "ready".to_string()));
        // Nothing stopped the process: it runs until cancelled.
        assert!(!run.is_finished());
        run.abort();
    }

    #[tokio::test]
    async fn leader_work_that_ends_on_its_own_stops_the_process() {
        let rt = Runtime::new(CancellationToken::new());
        let cancel = rt.token().clone();
        rt.spawn("steady", async move {
            cancel.cancelled().await;
            Ok(())
        });
        let work = Arc::new(tokio::sync::Notify::new());
        let w = work.clone();
        rt.spawn_leader(
            "controller",
            // Never contacted: no Lease without a config.
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap(),
            None,
            Health::default(),
            move |_token| async move {
                w.notified().await;
                Ok(())
            },
        );
        work.notify_one();
        let err = rt.run().await.unwrap_err();
        assert_eq!(err.to_string(), "task `controller` stopped before shutdown");
    }

    /// A minimal HTTP/1.0 GET: status and body.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        (status, body)
    }
}
