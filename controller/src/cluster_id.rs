//! The cluster's name under the Multi-Cluster Services API: the About API's ClusterProperty
//! `cluster.clusterset.k8s.io` (KEP-2149) when the cluster has one, else the configured name.
//! Two sources that disagree are a start-up error, never a silent choice: a registry whose
//! certificate names another cluster, or a publisher configured with another name, would
//! publish under a name the ClusterSet does not know the cluster by.

use anyhow::Context as _;
use kube::api::Api;
use xcc_proto::mcs::{CLUSTER_ID_PROPERTY, ClusterProperty};

/// Whether `name` can be a cluster id: KEP-2149 asks for an RFC 1123 DNS label (1-63 lowercase
/// letters, digits and inner hyphens).
pub fn valid_cluster_id(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

/// The cluster's name from the ClusterProperty's value `property` and the `configured` name
/// (`what` says where that comes from, for the error): the property when set (it must be a
/// valid cluster id and equal `configured` when both are set), else `configured`.
pub fn resolve(
    property: Option<&str>,
    configured: Option<&str>,
    what: &str,
) -> anyhow::Result<Option<String>> {
    match (property, configured) {
        (Some(p), _) if !valid_cluster_id(p) => anyhow::bail!(
            "ClusterProperty {CLUSTER_ID_PROPERTY} has value {p:?}, which is not a cluster id (an RFC 1123 DNS label)"
        ),
        (Some(p), Some(c)) if p != c => anyhow::bail!(
            "ClusterProperty {CLUSTER_ID_PROPERTY} names this cluster {p:?} but {what} names it {c:?}; make them agree"
        ),
        (Some(p), _) => Ok(Some(p.to_string())),
        (None, c) => Ok(c.map(str::to_string)),
    }
}

/// The value of the ClusterProperty `cluster.clusterset.k8s.io`; `None` when there is none or
/// the About API is not installed.
pub async fn cluster_property(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let api: Api<ClusterProperty> = Api::all(client.clone());
    match api.get_opt(CLUSTER_ID_PROPERTY).await {
        Ok(found) => Ok(found.map(|p| p.spec.value)),
        // 404 for the resource itself: the CRD is not installed.
        Err(e) if crate::plumbing::is_not_found(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading ClusterProperty {CLUSTER_ID_PROPERTY}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_property_wins_and_must_agree_with_the_configuration() {
        assert_eq!(
            resolve(Some("east"), None, "--cluster").unwrap().as_deref(),
            Some("east")
        );
        assert_eq!(
            resolve(Some("east"), Some("east"), "--cluster")
                .unwrap()
                .as_deref(),
            Some("east")
        );
        assert_eq!(
            resolve(None, Some("west"), "--cluster").unwrap().as_deref(),
            Some("west")
        );
        assert_eq!(resolve(None, None, "--cluster").unwrap(), None);
        assert_eq!(
            resolve(Some("east"), Some("west"), "the registry certificate")
                .unwrap_err()
                .to_string(),
            "ClusterProperty cluster.clusterset.k8s.io names this cluster \"east\" but the registry certificate names it \"west\"; make them agree"
        );
        assert_eq!(
            resolve(Some("East_1"), None, "--cluster")
                .unwrap_err()
                .to_string(),
            "ClusterProperty cluster.clusterset.k8s.io has value \"East_1\", which is not a cluster id (an RFC 1123 DNS label)"
        );
    }

    #[test]
    fn cluster_ids_are_dns_labels() {
        for ok in ["a", "east-1", &"x".repeat(63)] {
            assert!(valid_cluster_id(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"x".repeat(64)] {
            assert!(!valid_cluster_id(bad), "{bad}");
        }
    }
}
