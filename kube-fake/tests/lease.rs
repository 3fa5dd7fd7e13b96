//! Leader election over coordination.k8s.io/v1 Leases. kube 5 ships no lease helper, so this
//! drives the protocol every elector uses (client-go's `leaderelection`): create to acquire, and
//! replace with the read resourceVersion to renew or take over, losing races with 409s.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use serde_json::json;
use xcc_kube_fake::{FakeApiServer, Verb};

fn lease(holder: &str, renew: &str, transitions: i32) -> Lease {
    obj(json!({
        "metadata": {"name": "xcc-leader"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": renew, "renewTime": renew, "leaseTransitions": transitions},
    }))
}

/// One election round for `me`: acquire if absent, renew if held, take over if `expired`.
async fn try_acquire(api: &Api<Lease>, me: &str, now: &str, expired: bool) -> kube::Result<bool> {
    let Some(current) = api.get_opt("xcc-leader").await? else {
        return match api.create(&PostParams::default(), &lease(me, now, 0)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = current.spec.clone().unwrap_or_default();
    let mine = spec.holder_identity.as_deref() == Some(me);
    if !mine && !expired {
        return Ok(false);
    }
    let mut next = current.clone();
    let s = next.spec.get_or_insert_with(Default::default);
    s.renew_time = Some(MicroTime(now.parse().unwrap()));
    if !mine {
        s.holder_identity = Some(me.to_string());
        s.acquire_time = s.renew_time.clone();
        s.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    match api
        .replace("xcc-leader", &PostParams::default(), &next)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[tokio::test]
async fn lease_election_is_decided_by_conflicts() {
    let server = FakeApiServer::start().await;
    let api: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    let t0 = "2026-01-01T00:00:00.000000Z";
    assert!(try_acquire(&api, "a", t0, false).await.unwrap());
    // A second create loses with AlreadyExists.
    let st = status(api.create(&PostParams::default(), &lease("b", t0, 0)).await);
    assert_eq!((st.code, st.reason.as_str()), (409, "AlreadyExists"));
    assert!(
        !try_acquire(&api, "b", t0, false).await.unwrap(),
        "b sees a valid lease held by a"
    );

    // Both read the lease; a renews first, so b's takeover carries a stale resourceVersion.
    let seen_by_b = api.get("xcc-leader").await.unwrap();
    assert!(
        try_acquire(&api, "a", "2026-01-01T00:00:05.000000Z", false)
            .await
            .unwrap()
    );
    let mut takeover = seen_by_b.clone();
    takeover.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let st = status(
        api.replace("xcc-leader", &PostParams::default(), &takeover)
            .await,
    );
    assert_eq!((st.code, st.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        st.message,
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"xcc-leader\": the object has been modified; please apply your changes to the latest version and try again"
    );

    // Once b judges the lease expired, a fresh read wins.
    assert!(
        try_acquire(&api, "b", "2026-01-01T00:01:00.000000Z", true)
            .await
            .unwrap()
    );
    let spec = api.get("xcc-leader").await.unwrap().spec.unwrap();
    assert_eq!(
        (spec.holder_identity.as_deref(), spec.lease_transitions),
        (Some("b"), Some(1))
    );
    assert!(
        !try_acquire(&api, "a", "2026-01-01T00:01:01.000000Z", false)
            .await
            .unwrap()
    );
    assert_eq!(
        server
            .requests()
            .get("leases.coordination.k8s.io", Verb::Update),
        3
    );
    assert_eq!(
        server
            .writes()
            .get("leases.coordination.k8s.io", Verb::Update),
        2
    );

    let bad: Lease = obj(json!({"metadata": {"name": "bad"}, "spec": {"leaseDurationSeconds": 0}}));
    let st = status(api.create(&PostParams::default(), &bad).await);
    assert_eq!(
        st.details.unwrap().causes[0].message,
        "Invalid value: 0: must be greater than 0"
    );
}
