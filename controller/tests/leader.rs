//! Leader election against the in-process fake API server: one of two replicas leads, the
//! other waits; when the leader shuts down it releases the Lease and the standby takes over.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xcc_controller::leader::{LeaderConfig, run_as_leader};
use xcc_kube_fake::FakeApiServer;

fn config(identity: &str) -> LeaderConfig {
    LeaderConfig {
        namespace: "xcc".into(),
        lease_name: "xcc-test".into(),
        identity: identity.into(),
        lease_seconds: 2,
        renew_margin_seconds: 1,
    }
}

/// Start one contender; its work reports `(identity, started)` and runs until cancelled.
fn contender(
    server: &FakeApiServer,
    identity: &'static str,
    events: mpsc::UnboundedSender<(&'static str, bool)>,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let cancel = CancellationToken::new();
    let client = server.client();
    let c = cancel.clone();
    let task = tokio::spawn(async move {
        run_as_leader(
            client,
            Some(config(identity)),
            c,
            |_| {},
            move |token| async move {
                events.send((identity, true)).unwrap();
                token.cancelled().await;
                events.send((identity, false)).unwrap();
                Ok(())
            },
        )
        .await
    });
    (cancel, task)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<(&'static str, bool)>) -> (&'static str, bool) {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("no leadership change within 30 s")
        .unwrap()
}

#[tokio::test]
async fn one_leads_and_the_standby_takes_over_after_release() {
    let server = FakeApiServer::builder().namespace("xcc").start().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (cancel_a, task_a) = contender(&server, "a", tx.clone());
    assert_eq!(next(&mut rx).await, ("a", true));
    let (cancel_b, task_b) = contender(&server, "b", tx);

    let leases: kube::Api<Lease> = kube::Api::namespaced(server.client(), "xcc");
    let lease = leases.get("xcc-test").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("a"),
        "the first contender holds the Lease"
    );

    cancel_a.cancel();
    assert_eq!(next(&mut rx).await, ("a", false));
    task_a.await.unwrap().unwrap();
    // b only starts after a stopped: the events arrive in this order.
    assert_eq!(next(&mut rx).await, ("b", true));
    let lease = leases.get("xcc-test").await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("b"));

    cancel_b.cancel();
    assert_eq!(next(&mut rx).await, ("b", false));
    task_b.await.unwrap().unwrap();
}

#[tokio::test]
async fn without_leader_election_the_work_runs_at_once() {
    let server = FakeApiServer::start().await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let ran = run_as_leader(
        server.client(),
        None,
        cancel,
        |_| {},
        |token| async move {
            token.cancelled().await;
            Ok(())
        },
    )
    .await;
    assert!(ran.is_ok());
    assert_eq!(server.writes().total(), 0, "no Lease is written");
}
