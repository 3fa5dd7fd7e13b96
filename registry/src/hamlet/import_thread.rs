//! The thread the managed Hamlet clients run on: one current-thread runtime per process.
//!
//! A lock-step Hamlet server (the Go reference) sends its next response only once the previous
//! one is ACKed, so an import's speed is the latency of one round: response read, batch stored,
//! ACK written. On the registry's multi-thread runtime every round crossed between worker
//! threads (the HTTP/2 connection task, the client and the request-body task woke each other
//! on different cores), and the import took 1.13–1.17× the Go client's own time; on one thread
//! of its own it takes 0.96–1.01× (docs/benchmarks.md, issue 28). It also keeps imports off the
//! threads that serve Hamlet consumers, and theirs off it.
//!
//! The clients share the thread: their work is small per change (a snapshot costs a few
//! microseconds a record), and a process holds one such thread however many remotes it
//! imports from. Should the thread not start, clients run on the caller's runtime.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber as _;
use tracing::warn;

/// The import thread's runtime, started on first use; None if it could not start.
fn handle() -> Option<&'static Handle> {
    static HANDLE: OnceLock<Option<Handle>> = OnceLock::new();
    HANDLE.get_or_init(start).as_ref()
}

fn start() -> Option<Handle> {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("xcc-imports")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            warn!(error = %e, "cannot build the import runtime; imports share the main one");
            return None;
        }
    };
    let handle = runtime.handle().clone();
    // The thread drives the runtime for as long as the process lives.
    let started = std::thread::Builder::new()
        .name("xcc-imports".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()));
    match started {
        Ok(_) => Some(handle),
        Err(e) => {
            warn!(error = %e, "cannot start the import thread; imports share the main one");
            None
        }
    }
}

/// Runs `task(token)` on the import thread and waits for it. `token` is a child of `cancel`
/// that is also cancelled when this future is dropped, so a client never outlives the task
/// that supervises it. A panic of the task is resumed here.
pub(super) async fn run<F, Fut>(cancel: CancellationToken, task: F)
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let token = cancel.child_token();
    let _stop_with_this = token.clone().drop_guard();
    let Some(handle) = handle() else {
        return task(token).await;
    };
    // The caller's tracing subscriber goes along (the process-wide one anyway; a scoped one,
    // as tests set, too).
    if let Err(e) = handle.spawn(task(token).with_current_subscriber()).await
        && e.is_panic()
    {
        std::panic::resume_unwind(e.into_panic());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The task runs on the import thread, and whoever awaits `run` gets its end.
    #[tokio::test]
    async fn the_task_runs_on_the_import_thread() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        run(CancellationToken::new(), |_| async move {
            let name = std::thread::current().name().map(str::to_string);
            let _ = tx.send(name);
        })
        .await;
        assert_eq!(rx.await.expect("ran"), Some("xcc-imports".to_string()));
    }

    /// Cancelling the parent token and dropping the supervising future both cancel the task's
    /// token: a client never outlives its supervisor.
    #[tokio::test]
    async fn the_task_stops_with_its_token_or_its_supervisor() {
        let parent = CancellationToken::new();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel();
        let supervisor = tokio::spawn(run(parent.clone(), |token| async move {
            let _ = started_tx.send(());
            token.cancelled().await;
            let _ = stopped_tx.send(());
        }));
        started_rx.await.expect("started");
        parent.cancel();
        stopped(stopped_rx).await;
        supervisor.await.expect("run returned");

        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel();
        let supervisor = tokio::spawn(run(CancellationToken::new(), |token| async move {
            let _ = started_tx.send(());
            token.cancelled().await;
            let _ = stopped_tx.send(());
        }));
        started_rx.await.expect("started");
        supervisor.abort();
        assert!(supervisor.await.expect_err("aborted").is_cancelled());
        stopped(stopped_rx).await;
    }

    /// Waits for the task's stop signal; a task that is never stopped fails the test.
    async fn stopped(rx: tokio::sync::oneshot::Receiver<()>) {
        tokio::time::timeout(std::time::Duration::from_secs(10), rx)
            .await
            .expect("the task was not stopped within 10 s")
            .expect("stop signal");
    }

    /// A panic of the task reaches the supervisor (which reports the client as panicked).
    #[tokio::test]
    async fn a_panic_of_the_task_reaches_the_caller() {
        let joined = tokio::spawn(run(CancellationToken::new(), |_| async {
            panic!("boom");
        }))
        .await;
        let panic = joined.expect_err("panicked").into_panic();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"boom"));
    }
}
