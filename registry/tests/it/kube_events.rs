//! `--store kube` on a real API server (`xcc_testkube`), as the ServiceAccount of
//! `deploy/base`: a remote whose exports cannot be imported (FQDNs too long for a record name,
//! which the remote chooses) gets a Warning Event on its RemoteRegistry — cut to the API's
//! 1 kB note limit, not refused.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use crate::common::*;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use xcc_proto::crd::RemoteRegistry;
use xcc_registry::store::kube::KubeConfig;
use xcc_registry::{RegistryConfig, StoreConfig};

const RR: &str = "long-names";

/// A valid FQDN of 246 characters: its imported record name (`<fqdn>-<hash8>`) exceeds 253.
fn long_fqdn(i: usize) -> String {
    let label = |c: char, n: usize| std::iter::repeat_n(c, n).collect::<String>();
    format!(
        "x{i}{}.{}.{}.{}.xcc",
        label('a', 61),
        label('b', 63),
        label('c', 63),
        label('d', 50)
    )
}

/// Status codes of `user`'s Event writes, from the audit log.
fn event_writes(cp: &xcc_testkube::ControlPlane, user: &str) -> Vec<i64> {
    cp.requests(user)
        .iter()
        .filter(|r| r.resource == "events")
        .map(|r| r.code)
        .collect()
}

#[tokio::test]
async fn warning_events_longer_than_the_api_limit_are_cut_not_lost() {
    let Some(cp) =
        xcc_testkube::shared("warning_events_longer_than_the_api_limit_are_cut_not_lost")
    else {
        return;
    };
    let _turn = xcc_testkube::Turn::shared().await;
    cp.apply_dir(&xcc_testkube::deploy_dir().join("crds")).await;
    let ns = cp.namespace("events").await;
    let id = cp.identity(&ns, "base", "xcc-registry").await;

    let pki = Pki::new("xcc.test");
    let fqdns: Vec<String> = (0..4).map(long_fqdn).collect();
    let (east, _ec) = start(pki.cluster("east")).await;
    for f in &fqdns {
        east.catalog.upsert(export("east", "ns", f, "10.0.0.1"));
    }
    let mut cfg = RegistryConfig::loopback(pki.cluster("west"));
    cfg.namespace = ns.clone();
    cfg.store = StoreConfig::Kube(KubeConfig::new(id.client().await, false));
    let (_west, _wc) = start_with(cfg).await;

    let admin = cp.client().await;
    let rr: RemoteRegistry = serde_json::from_value(json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "RemoteRegistry",
        "metadata": {"name": RR, "namespace": ns},
        "spec": {
            "address": east.hamlet_addr.to_string(),
            "tlsConfig": {"serverCA": "", "serverName": "localhost"},
        },
    }))
    .unwrap();
    Api::<RemoteRegistry>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &rr)
        .await
        .unwrap();

    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin, &ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    let event = loop {
        let found = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("InvalidImport")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(RR)
            });
        if let Some(e) = found {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "no InvalidImport Event on {ns}/{RR}; responses to the registry's Event writes: {:?}",
            event_writes(cp, &id.user)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(note.len() <= 1024, "{} bytes", note.len());
    assert!(note.starts_with("not imported, invalid: "), "{note}");
    assert!(note.contains(&fqdns[0]), "{note}");
    assert!(note.ends_with('…'), "cut: {note}");
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
    assert!(
        event_writes(cp, &id.user).iter().all(|c| *c < 300),
        "{:?}",
        event_writes(cp, &id.user)
    );
}
