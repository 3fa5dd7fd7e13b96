//! `--store kube` keeps a level's name-owner ledger in the ConfigMap `xcc-name-owners`
//! (docs/security.md §3). On a real API server (`xcc_testkube`), as the ServiceAccount of
//! `deploy/base`: the ledger is created, appended to (a key per append), compacted and read
//! back with exactly the RBAC the Role grants.

#![allow(clippy::unwrap_used)]

use xcc_registry::federation::level::{ConfigMapOwners, OwnerStore};

#[tokio::test]
async fn the_ledger_configmap_is_written_and_read_back_with_the_deployed_rbac() {
    let Some(cp) = xcc_testkube::shared(
        "the_ledger_configmap_is_written_and_read_back_with_the_deployed_rbac",
    ) else {
        return;
    };
    let _turn = xcc_testkube::Turn::shared().await;
    let ns = cp.namespace("owners").await;
    let id = cp.identity(&ns, "base", "xcc-registry").await;
    let store = ConfigMapOwners::new(id.client().await, &ns);

    assert_eq!(store.load().await.unwrap(), None);
    // The first write creates it; appends add a key each (a patch carrying only that key).
    let header = "# xcc name owners v2: + <name> <cluster> <namespace> <service> <held-since|-> / - <name>\n";
    let first = format!("{header}+ shop/api c2 shop api -\n");
    store.replace(first.clone()).await.unwrap();
    assert_eq!(store.load().await.unwrap(), Some(first.clone()));
    store.append("- shop/api\n".into()).await.unwrap();
    store
        .append("+ shop/web a9 shop web 17\n".into())
        .await
        .unwrap();
    let logged = format!("{first}- shop/api\n+ shop/web a9 shop web 17\n");
    assert_eq!(
        store.load().await.unwrap().as_deref(),
        Some(logged.as_str())
    );
    // A store read back appends after what it read.
    let again = ConfigMapOwners::new(id.client().await, &ns);
    assert_eq!(
        again.load().await.unwrap().as_deref(),
        Some(logged.as_str())
    );
    again.append("- shop/web\n".into()).await.unwrap();
    let cm: k8s_openapi::api::core::v1::ConfigMap = kube::Api::namespaced(id.client().await, &ns)
        .get("xcc-name-owners")
        .await
        .unwrap();
    assert_eq!(
        cm.data.unwrap().keys().cloned().collect::<Vec<_>>(),
        [
            "log-0000000000",
            "log-0000000001",
            "log-0000000002",
            "owners"
        ]
    );
    // Compaction replaces the base and drops the log keys in one patch.
    let compacted = format!("{header}+ shop/db c3 shop db 9\n");
    again.replace(compacted.clone()).await.unwrap();
    assert_eq!(store.load().await.unwrap(), Some(compacted));
    assert!(!store.wants_compaction());
    // Past what a ConfigMap holds: refused with a clear error, the stored ledger untouched.
    let big = format!("{header}{}", "+ shop/x c3 shop x 9\n".repeat(60_000));
    let err = store.replace(big).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("more than the 1000000 a ConfigMap holds"),
        "{err}"
    );
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
}
