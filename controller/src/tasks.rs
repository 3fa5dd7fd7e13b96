//! Supervision of a process's long-lived tasks: every task has a name and runs under a
//! cancellation token (the process's, or a child of it for tasks stopped one by one). A task
//! that ends while its token is not cancelled, fails, or panics is a failure of the process:
//! [`Tasks::run`] logs an error naming it, cancels the rest, waits for them to drain and returns
//! the [`TaskError`], so the binary exits non-zero. Nothing is awaited and dropped unseen.
//!
//! Tasks are started at once by a cloneable [`Spawner`] (so parts started before the process
//! runs, e.g. one import client per remote, are supervised too); their outcomes travel to the
//! supervisor on a channel.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::plumbing::lock;

/// Why the process stopped: the task named, and what happened to it.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("task `{task}` stopped before shutdown")]
    Returned { task: String },
    #[error("task `{task}` failed")]
    Failed {
        task: String,
        #[source]
        source: anyhow::Error,
    },
    #[error("task `{task}` panicked: {message}")]
    Panicked { task: String, message: String },
}

impl TaskError {
    /// The name of the task that stopped the process.
    pub fn task(&self) -> &str {
        match self {
            Self::Returned { task } | Self::Failed { task, .. } | Self::Panicked { task, .. } => {
                task
            }
        }
    }
}

/// A task's end as reported to the supervisor: `None` when it stopped because it was asked to.
struct Ended(Option<TaskError>);

struct Live {
    name: String,
    abort: AbortHandle,
}

/// Starts supervised tasks; clone it freely.
#[derive(Clone)]
pub struct Spawner {
    cancel: CancellationToken,
    tracker: TaskTracker,
    ended: mpsc::UnboundedSender<Ended>,
    live: Arc<Mutex<BTreeMap<u64, Live>>>,
    next_id: Arc<AtomicU64>,
}

impl Spawner {
    /// The process's token: cancelled on shutdown or when a task fails.
    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Start `task`, which must run until the process shuts down.
    pub fn spawn<F>(&self, name: impl Into<String>, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.start(name.into(), self.cancel.clone(), task);
    }

    /// [`Spawner::spawn`] for a task without errors of its own (it can still end too early or
    /// panic).
    pub fn spawn_infallible<F>(&self, name: impl Into<String>, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn(name, task.map(Ok));
    }

    /// Supervise `task`, started elsewhere, which must run until the process shuts down.
    pub fn watch(&self, name: impl Into<String>, task: JoinHandle<()>) {
        self.spawn(name, async move {
            match task.await {
                Ok(()) => Ok(()),
                // Re-raised here, so it is reported as this task's panic.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => Err(anyhow::Error::from(e)),
            }
        });
    }

    /// Start a task that can be stopped on its own (its token is a child of the process's);
    /// it must run until then, or until the process shuts down.
    pub fn spawn_stoppable<F, Fut>(&self, name: impl Into<String>, task: F) -> TaskHandle
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let token = self.cancel.child_token();
        let join = self.start(name.into(), token.clone(), task(token.clone()));
        TaskHandle { token, join }
    }

    fn start<F>(&self, name: String, token: CancellationToken, task: F) -> JoinHandle<()>
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (live, ended) = (self.live.clone(), self.ended.clone());
        let task_name = name.clone();
        let wrapped = async move {
            let outcome = AssertUnwindSafe(task).catch_unwind().await;
            lock(&live).remove(&id);
            let task = task_name;
            let error = match outcome {
                Ok(Ok(())) if token.is_cancelled() => None,
                Ok(Ok(())) => Some(TaskError::Returned { task }),
                Ok(Err(source)) => Some(TaskError::Failed { task, source }),
                Err(panic) => Some(TaskError::Panicked {
                    task,
                    message: panic_message(panic.as_ref()),
                }),
            };
            // Nobody listens once the supervisor is gone (the process is ending).
            ended.send(Ended(error)).ok();
        };
        // Held across the spawn, so a task that ends at once finds its entry to remove.
        let mut live = lock(&self.live);
        let join = self.tracker.spawn(wrapped);
        live.insert(
            id,
            Live {
                name,
                abort: join.abort_handle(),
            },
        );
        join
    }
}

/// A task started with [`Spawner::spawn_stoppable`].
pub struct TaskHandle {
    token: CancellationToken,
    join: JoinHandle<()>,
}

impl TaskHandle {
    /// Stop the task and wait until it has ended. Its outcome went to the supervisor; the join
    /// fails only when the supervisor aborted it at the end of the shutdown grace period.
    pub async fn stop(self) {
        self.token.cancel();
        if let Err(e) = self.join.await {
            debug_assert!(e.is_cancelled(), "the wrapper catches panics");
        }
    }
}

/// The supervisor of one process's tasks.
pub struct Tasks {
    spawner: Spawner,
    ended: mpsc::UnboundedReceiver<Ended>,
    grace: Option<Duration>,
}

impl Tasks {
    /// Tasks under `cancel`; shutdown waits for every task to end.
    pub fn new(cancel: CancellationToken) -> Self {
        let (tx, ended) = mpsc::unbounded_channel();
        Self {
            spawner: Spawner {
                cancel,
                tracker: TaskTracker::new(),
                ended: tx,
                live: Arc::default(),
                next_id: Arc::default(),
            },
            ended,
            grace: None,
        }
    }

    /// On shutdown, abort the tasks still running after `grace` (a listener waits for its
    /// connections, and a stream whose peer stopped reading never ends by itself).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    pub fn spawner(&self) -> &Spawner {
        &self.spawner
    }

    /// The process's token.
    pub fn token(&self) -> &CancellationToken {
        &self.spawner.cancel
    }

    /// Run until the token is cancelled or a task stops the process (see the module docs);
    /// then drain. Returns the first failure, during the run or the drain.
    pub async fn run(mut self) -> Result<(), TaskError> {
        let cancel = self.spawner.cancel.clone();
        let mut failure = None;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(Ended(error)) = self.ended.recv() => if let Some(e) = error {
                    error!(task = %e.task(), error = %format!("{e:#}"), "a supervised task stopped; stopping the others");
                    failure = Some(e);
                    cancel.cancel();
                    break;
                },
            }
        }
        self.drain(failure).await
    }

    /// Cancel every task and wait for them (within the grace period, if any).
    pub async fn shutdown(self) -> Result<(), TaskError> {
        self.spawner.cancel.cancel();
        self.drain(None).await
    }

    async fn drain(mut self, mut failure: Option<TaskError>) -> Result<(), TaskError> {
        let tracker = self.spawner.tracker.clone();
        tracker.close();
        let drained = match self.grace {
            Some(grace) => tokio::time::timeout(grace, tracker.wait()).await.is_ok(),
            None => {
                tracker.wait().await;
                true
            }
        };
        if !drained {
            let live = std::mem::take(&mut *lock(&self.spawner.live));
            let names: Vec<&str> = live.values().map(|l| l.name.as_str()).collect();
            warn!(tasks = ?names, grace = ?self.grace, "tasks still running after the shutdown grace period; aborting them");
            for l in live.values() {
                l.abort.abort();
            }
            tracker.wait().await;
        }
        while let Ok(Ended(error)) = self.ended.try_recv() {
            if let Some(e) = error
                && failure.is_none()
            {
                error!(task = %e.task(), error = %format!("{e:#}"), "a task failed while stopping");
                failure = Some(e);
            }
        }
        match failure {
            Some(e) => Err(e),
            None => {
                info!("every task stopped");
                Ok(())
            }
        }
    }
}

impl Drop for Tasks {
    /// A task set dropped without being run or shut down (a start-up that failed half-way)
    /// tells its tasks to stop.
    fn drop(&mut self) {
        self.spawner.cancel.cancel();
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    /// A task that runs until the process's token fires.
    fn until_cancelled(s: &Spawner) -> impl Future<Output = anyhow::Result<()>> + use<> {
        let c = s.token().clone();
        async move {
            c.cancelled().await;
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_task_that_returns_stops_the_process_and_is_named() {
        let tasks = Tasks::new(CancellationToken::new());
        let s = tasks.spawner().clone();
        s.spawn("steady", until_cancelled(&s));
        s.spawn("quitter", async { Ok(()) });
        let err = tasks.run().await.unwrap_err();
        assert_eq!(err.to_string(), "task `quitter` stopped before shutdown");
        assert!(s.token().is_cancelled(), "the others were told to stop");
    }

    #[tokio::test]
    async fn a_failing_task_is_reported_with_its_cause() {
        let tasks = Tasks::new(CancellationToken::new());
        let s = tasks.spawner().clone();
        s.spawn("steady", until_cancelled(&s));
        s.spawn("listener", async { Err(anyhow::anyhow!("address in use")) });
        let err = tasks.run().await.unwrap_err();
        assert_eq!(
            format!("{:#}", anyhow::Error::from(err)),
            "task `listener` failed: address in use"
        );
    }

    #[tokio::test]
    async fn a_panicking_task_is_reported_with_its_message() {
        let tasks = Tasks::new(CancellationToken::new());
        let s = tasks.spawner().clone();
        s.spawn("steady", until_cancelled(&s));
        s.spawn("watcher", async { panic!("watch state corrupt") });
        let err = tasks.run().await.unwrap_err();
        assert!(matches!(err, TaskError::Panicked { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "task `watcher` panicked: watch state corrupt"
        );
    }

    #[tokio::test]
    async fn cancellation_drains_every_task_gracefully() {
        let tasks = Tasks::new(CancellationToken::new());
        let s = tasks.spawner().clone();
        let (cleaned_tx, mut cleaned) = mpsc::unbounded_channel();
        for name in ["a", "b"] {
            let (c, tx) = (s.token().clone(), cleaned_tx.clone());
            s.spawn(name, async move {
                c.cancelled().await;
                // Work after the signal (flushing, releasing a Lease) finishes before `run`.
                tokio::task::yield_now().await;
                tx.send(name)?;
                Ok(())
            });
        }
        drop(cleaned_tx);
        let run = tokio::spawn(tasks.run());
        s.token().cancel();
        run.await.unwrap().unwrap();
        // Only what was done before `run` returned counts.
        let mut done = vec![];
        while let Ok(n) = cleaned.try_recv() {
            done.push(n);
        }
        done.sort();
        assert_eq!(done, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_failure_while_draining_is_returned() {
        let tasks = Tasks::new(CancellationToken::new());
        let s = tasks.spawner().clone();
        let c = s.token().clone();
        s.spawn("flusher", async move {
            c.cancelled().await;
            Err(anyhow::anyhow!("cannot flush"))
        });
        s.token().cancel();
        let err = tasks.run().await.unwrap_err();
        assert_eq!(err.to_string(), "task `flusher` failed");
    }

    #[tokio::test]
    async fn a_task_set_dropped_before_running_stops_its_tasks() {
        let tasks = Tasks::new(CancellationToken::new());
        let s = tasks.spawner().clone();
        let (stopped_tx, stopped) = oneshot::channel();
        let c = s.token().clone();
        s.spawn("listener", async move {
            c.cancelled().await;
            stopped_tx.send(()).ok();
            Ok(())
        });
        drop(tasks);
        stopped.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_ignoring_shutdown_are_aborted_after_the_grace_period() {
        let tasks = Tasks::new(CancellationToken::new()).with_grace(Duration::from_secs(10));
        let s = tasks.spawner().clone();
        let (dropped_tx, dropped) = oneshot::channel::<()>();
        s.spawn("stuck", async move {
            let _dropped_when_aborted = dropped_tx;
            std::future::pending::<()>().await;
            Ok(())
        });
        let start = tokio::time::Instant::now();
        tasks.shutdown().await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert!(dropped.await.is_err(), "the stuck task was aborted");
    }

    #[tokio::test]
    async fn a_stoppable_task_may_end_alone_but_its_panic_still_stops_the_process() {
        let tasks = Tasks::new(CancellationToken::new());
        let s = tasks.spawner().clone();
        s.spawn("steady", until_cancelled(&s));
        let client = s.spawn_stoppable("client east", |token| async move {
            token.cancelled().await;
            Ok(())
        });
        client.stop().await;
        assert!(
            !s.token().is_cancelled(),
            "stopping one task is not a failure"
        );
        let (go_tx, go) = oneshot::channel::<()>();
        let _west = s.spawn_stoppable("client west", |_| async move {
            go.await?;
            panic!("bad state");
        });
        go_tx.send(()).unwrap();
        let err = tasks.run().await.unwrap_err();
        assert_eq!(err.to_string(), "task `client west` panicked: bad state");
    }
}
