//! The harness itself: the shared control plane enforces RBAC, and an identity made from
//! `deploy/` gets exactly what its Roles grant.

#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Api;
use kube::api::ListParams;

#[tokio::test]
async fn identity_has_exactly_the_deployed_rbac() {
    let Some(cp) = xcc_testkube::shared("identity_has_exactly_the_deployed_rbac") else {
        return;
    };
    let ns = cp.namespace("harness").await;
    let id = cp.identity(&ns, "base", "xcc-binder").await;
    let client = id.client().await;
    // Granted by deploy/base's Role, in its own namespace.
    Api::<Service>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    // Not granted: ConfigMaps.
    let err = Api::<ConfigMap>::namespaced(client, &ns)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );
    let refused = cp.forbidden(&id.user);
    assert_eq!(refused, vec![format!("list /configmaps in \"{ns}\"")]);
}
