//! Leader election on a real API server (`xcc_testkube`), as the publisher's ServiceAccount
//! with exactly `deploy/base`'s RBAC: one of two replicas leads, the other waits; when the
//! leader shuts down it releases the Lease and the standby takes over. Without leader election
//! nothing is written (the API server's audit log counts the writes).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xcc_controller::leader::{LeaderConfig, run_as_leader};
use xcc_testkube::Identity;

/// The ServiceAccount whose Role grants the Lease (`deploy/base`).
const ACCOUNT: &str = "xcc-publisher";

fn config(ns: &str, identity: &str) -> LeaderConfig {
    LeaderConfig {
        namespace: ns.into(),
        lease_name: ACCOUNT.into(),
        identity: identity.into(),
        lease_seconds: 2,
        renew_margin_seconds: 1,
    }
}

/// Start one contender; its work reports `(identity, started)` and runs until cancelled.
async fn contender(
    id: &Identity,
    ns: &str,
    identity: &'static str,
    events: mpsc::UnboundedSender<(&'static str, bool)>,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let cancel = CancellationToken::new();
    let client = id.client().await;
    let config = config(ns, identity);
    let c = cancel.clone();
    let task = tokio::spawn(async move {
        run_as_leader(
            client,
            Some(config),
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
    let test = "one_leads_and_the_standby_takes_over_after_release";
    let Some(cp) = xcc_testkube::shared(test) else {
        return;
    };
    let ns = cp.namespace("leader").await;
    let id = cp.identity(&ns, "base", ACCOUNT).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (cancel_a, task_a) = contender(&id, &ns, "a", tx.clone()).await;
    assert_eq!(next(&mut rx).await, ("a", true));
    let (cancel_b, task_b) = contender(&id, &ns, "b", tx).await;

    let leases: kube::Api<Lease> = kube::Api::namespaced(cp.client().await, &ns);
    let lease = leases.get(ACCOUNT).await.unwrap();
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
    let lease = leases.get(ACCOUNT).await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some("b"));

    cancel_b.cancel();
    assert_eq!(next(&mut rx).await, ("b", false));
    task_b.await.unwrap().unwrap();
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
}

#[tokio::test]
async fn without_leader_election_the_work_runs_at_once() {
    let Some(cp) = xcc_testkube::shared("without_leader_election_the_work_runs_at_once") else {
        return;
    };
    let ns = cp.namespace("no-leader").await;
    let id = cp.identity(&ns, "base", ACCOUNT).await;
    let since = std::time::SystemTime::now();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let ran = run_as_leader(
        id.client().await,
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
    assert_eq!(
        cp.writes_since(&id.user, since),
        Vec::<String>::new(),
        "no Lease is written"
    );
}
