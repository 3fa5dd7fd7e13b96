//! `--store kube` keeps a level's name-owner ledger in the ConfigMap `xcc-name-owners`
//! (docs/security.md §3). On a real API server (`xcc_testkube`), as the ServiceAccount of
//! `deploy/base`: the ledger is created, replaced and read back with exactly the RBAC the Role
//! grants.

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
    let first = "api.shop.svc.clusterset.local c2 shop api\nshop/api c2 shop api\n";
    store.save(first.to_string()).await.unwrap();
    assert_eq!(store.load().await.unwrap().as_deref(), Some(first));
    let second = "shop/web a9 shop web\n";
    store.save(second.to_string()).await.unwrap();
    assert_eq!(store.load().await.unwrap().as_deref(), Some(second));
    assert_eq!(cp.forbidden(&id.user), Vec::<String>::new());
}
