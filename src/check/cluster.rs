//! The cluster's own pieces a registry relies on (kube store): the MCS ClusterProperty
//! `cluster.clusterset.k8s.io` naming the cluster as its certificate does, CoreDNS
//! forwarding the clusterset zone to `xcc dns` (the stanza of
//! `deploy/dns/cluster-dns/coredns-configmap.yaml`), and what the parent refuses.

use k8s_openapi::api::core::v1::ConfigMap;
use xcc_proto::crd::{CONDITION_ANNOUNCED, RemoteRegistry, ServiceRecord};
use xcc_proto::mcs::CLUSTER_ID_PROPERTY;

use super::report::Check;

/// Where CoreDNS keeps its configuration (kubeadm, kind, k3s, EKS, GKE with CoreDNS, ...).
const COREDNS_NAMESPACE: &str = "kube-system";
const COREDNS_CONFIGMAP: &str = "coredns";
const COREFILE_KEY: &str = "Corefile";

/// `cluster property`: the ClusterProperty, when there is one, names the certificate's cluster.
pub async fn cluster_property(client: &kube::Client, cert_cluster: Option<&str>) -> Check {
    const ID: &str = "cluster property";
    let value = match xcc_controller::cluster_id::cluster_property(client).await {
        Ok(Some(v)) => v,
        Ok(None) => {
            return Check::skip(
                ID,
                format!(
                    "no ClusterProperty {CLUSTER_ID_PROPERTY} (the About API is not installed, or the property not set)"
                ),
            );
        }
        Err(e) if forbidden(&e) => {
            return Check::skip(
                ID,
                format!(
                    "not checked: this identity may not read ClusterProperty {CLUSTER_ID_PROPERTY} (the mcs overlay grants it)"
                ),
            );
        }
        Err(e) => {
            return Check::fail(
                ID,
                format!("{e:#}"),
                "see the rbac check, or whether the About API's CRD is served",
            );
        }
    };
    let Some(cert) = cert_cluster else {
        return Check::skip(
            ID,
            format!(
                "{CLUSTER_ID_PROPERTY} is {value:?}; not compared: the certificate did not load"
            ),
        );
    };
    match xcc_controller::cluster_id::resolve(Some(&value), Some(cert), "the certificate") {
        Ok(_) => Check::ok(
            ID,
            format!("{CLUSTER_ID_PROPERTY} is {value:?}, the certificate's cluster name"),
        ),
        Err(e) => Check::fail(
            ID,
            e.to_string(),
            format!(
                "the registry refuses to start so: set the property to the certificate's name \
                 (kubectl patch clusterproperty {CLUSTER_ID_PROPERTY} --type merge -p \
                 '{{\"spec\":{{\"value\":\"{cert}\"}}}}') or issue the certificate for {value:?}"
            ),
        ),
    }
}

/// `cluster dns`: CoreDNS forwards `zone` (with a server block of its own) somewhere.
pub async fn coredns(client: &kube::Client, zone: &str) -> Check {
    const ID: &str = "cluster dns";
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), COREDNS_NAMESPACE);
    let cm = match api.get_opt(COREDNS_CONFIGMAP).await {
        Ok(Some(cm)) => cm,
        Ok(None) => {
            return Check::skip(
                ID,
                format!(
                    "no ConfigMap {COREDNS_NAMESPACE}/{COREDNS_CONFIGMAP}: not CoreDNS; forward {zone} from the cluster's DNS to xcc dns (deploy/dns/README.md)"
                ),
            );
        }
        Err(e) if forbidden_kube(&e) => {
            return Check::skip(
                ID,
                format!(
                    "not checked: this identity may not read {COREDNS_NAMESPACE}/{COREDNS_CONFIGMAP}; run xcc check with a kubeconfig that may"
                ),
            );
        }
        Err(e) => {
            return Check::fail(
                ID,
                format!("reading {COREDNS_NAMESPACE}/{COREDNS_CONFIGMAP}: {e}"),
                "check the API server and this identity's access",
            );
        }
    };
    let corefile = cm
        .data
        .as_ref()
        .and_then(|d| d.get(COREFILE_KEY))
        .map(String::as_str)
        .unwrap_or("");
    let fix = format!(
        "add a server block for {zone} that forwards to the xcc-dns Service's cluster IP \
         (deploy/dns/cluster-dns/coredns-configmap.yaml): kubectl -n {COREDNS_NAMESPACE} edit configmap {COREDNS_CONFIGMAP}"
    );
    match forward_targets(corefile, zone) {
        Forwarding::To(targets) => Check::ok(
            ID,
            format!("CoreDNS forwards {zone} to {}", targets.join(" ")),
        ),
        Forwarding::NoBlock => Check::fail(
            ID,
            format!(
                "the CoreDNS Corefile has no server block for {zone}: pods cannot resolve its names"
            ),
            fix,
        ),
        Forwarding::NoForward => Check::fail(
            ID,
            format!("the CoreDNS server block for {zone} forwards nowhere (no forward line)"),
            fix,
        ),
    }
}

/// `parent refusals <name>`: what the parent refuses of this cluster, as the registry records
/// it: exported ServiceRecords with `Announced=False` (the failed check as the reason, the
/// parent's reason and Cedar policy ids as the message) and the parent RemoteRegistry's
/// imports answered `Denied` or `Refused`. A warning, not a failure: the install works, and the
/// parent's policy decided.
pub fn parent_refusals(parent: &RemoteRegistry, records: &[ServiceRecord]) -> Check {
    let name = parent.metadata.name.clone().unwrap_or_default();
    let id = format!("parent refusals {name}");
    let mut refused: Vec<String> = records
        .iter()
        .filter_map(|r| {
            let c = r
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == CONDITION_ANNOUNCED && c.status == "False")?;
            Some(format!(
                "export {}/{} ({}: {})",
                r.metadata.namespace.as_deref().unwrap_or_default(),
                r.metadata.name.as_deref().unwrap_or_default(),
                c.reason,
                c.message
            ))
        })
        .collect();
    let imports = parent
        .status
        .as_ref()
        .and_then(|s| s.imports.clone())
        .unwrap_or_default();
    refused.extend(
        imports
            .iter()
            .filter(|i| i.state == "Denied" || i.state == "Refused")
            .map(|i| {
                let target = match (&i.fqdn, &i.namespace, &i.name) {
                    (Some(f), _, _) => f.clone(),
                    (None, ns, n) => format!(
                        "{}/{}",
                        ns.as_deref().unwrap_or_default(),
                        n.as_deref().unwrap_or_default()
                    ),
                };
                let mut line = format!("import {target}");
                if let Some(svc) = &i.requester_service {
                    line.push_str(&format!(" as {svc}"));
                }
                line.push_str(&format!(
                    ": {} {}",
                    i.state,
                    i.reason.as_deref().unwrap_or_default()
                ));
                if let Some(m) = i.message.as_deref().filter(|m| !m.is_empty()) {
                    line.push_str(&format!(" ({m})"));
                }
                line
            }),
    );
    if refused.is_empty() {
        return Check::ok(
            id,
            format!(
                "the parent refuses nothing of this cluster ({} records, {} imports asked)",
                records.len(),
                imports.len()
            ),
        );
    }
    Check::warn(
        id,
        format!(
            "the parent refuses {}: {}",
            refused.len(),
            refused.join("; ")
        ),
        "the parent decided (its Cedar policies, each service's allowed requesters): change the \
         export or the import, or ask the parent's operator, whose xcc admin explain-policy names \
         the deciding policy",
    )
}

fn forbidden(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.downcast_ref::<kube::Error>().is_some_and(forbidden_kube))
}

fn forbidden_kube(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// What a Corefile does with a zone.
#[derive(Debug, PartialEq, Eq)]
pub enum Forwarding {
    /// A server block for the zone forwards it to these.
    To(Vec<String>),
    /// No server block names the zone.
    NoBlock,
    /// A server block names it, and has no `forward . <to>` (or `forward <zone> <to>`).
    NoForward,
}

/// A server block's key as a zone: `dns://clusterset.local.:53` → `clusterset.local`.
fn key_zone(key: &str) -> String {
    let key = key.strip_prefix("dns://").unwrap_or(key);
    let host = match key.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => key,
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// How `corefile` handles `zone`: its server blocks (keys, then `{ ... }`), and in the one for
/// the zone the `forward` line. Comments (`#` to the end of a line) are ignored; a Corefile
/// that does not parse as blocks has no block for the zone.
pub fn forward_targets(corefile: &str, zone: &str) -> Forwarding {
    let zone = zone.trim_end_matches('.').to_ascii_lowercase();
    let text: String = corefile
        .lines()
        .map(|l| l.split_once('#').map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = text.as_str();
    let mut found = false;
    while let Some(open) = rest.find('{') {
        let keys = &rest[..open];
        // The block's body: up to the matching brace (plugins nest blocks of their own).
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let body = &rest[open + 1..end];
        rest = &rest[end + 1..];
        if !keys.split_whitespace().any(|k| key_zone(k) == zone) {
            continue;
        }
        found = true;
        for line in body.lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("forward") {
                continue;
            }
            let from = words.next().map(key_zone);
            let to: Vec<String> = words
                .take_while(|w| *w != "{")
                .map(str::to_string)
                .collect();
            // `forward . <to>` (every name of the block) or `forward <zone> <to>`.
            if from.is_some_and(|f| f.is_empty() || f == zone) && !to.is_empty() {
                return Forwarding::To(to);
            }
        }
    }
    if found {
        Forwarding::NoForward
    } else {
        Forwarding::NoBlock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../deploy/dns/cluster-dns/coredns-configmap.yaml");

    #[test]
    fn the_shipped_stanza_forwards_the_clusterset_zone() {
        let doc: k8s_openapi::api::core::v1::ConfigMap =
            yaml_serde::from_str(SHIPPED).expect("the example parses");
        let corefile = &doc.data.expect("data")[COREFILE_KEY];
        assert_eq!(
            forward_targets(corefile, "clusterset.local"),
            Forwarding::To(vec!["XCC_DNS_CLUSTER_IP".into()])
        );
        assert_eq!(
            forward_targets(corefile, "clusterset.local."),
            Forwarding::To(vec!["XCC_DNS_CLUSTER_IP".into()])
        );
    }

    #[test]
    fn a_corefile_without_the_stanza_or_its_forward_is_named_as_such() {
        let default = ".:53 {\n    errors\n    kubernetes cluster.local in-addr.arpa ip6.arpa {\n        pods insecure\n    }\n    forward . /etc/resolv.conf\n}\n";
        assert_eq!(
            forward_targets(default, "clusterset.local"),
            Forwarding::NoBlock
        );
        let commented = "# clusterset.local:53 {\n#   forward . 10.0.0.1\n# }\n";
        assert_eq!(
            forward_targets(commented, "clusterset.local"),
            Forwarding::NoBlock
        );
        let no_forward = "clusterset.local:53 {\n    errors\n    cache 5\n}\n";
        assert_eq!(
            forward_targets(no_forward, "clusterset.local"),
            Forwarding::NoForward
        );
        let other_from = "clusterset.local {\n    forward example.org 10.0.0.1\n}\n";
        assert_eq!(
            forward_targets(other_from, "clusterset.local"),
            Forwarding::NoForward
        );
        let explicit = "dns://Clusterset.Local.:53 {\n    forward clusterset.local 10.0.0.1 10.0.0.2 {\n        max_fails 3\n    }\n}\n";
        assert_eq!(
            forward_targets(explicit, "clusterset.local"),
            Forwarding::To(vec!["10.0.0.1".into(), "10.0.0.2".into()])
        );
        // Unbalanced braces (a half-edited ConfigMap) end the parse, never panic.
        assert_eq!(
            forward_targets(
                "clusterset.local {\n forward . 1.2.3.4\n",
                "clusterset.local"
            ),
            Forwarding::NoBlock
        );
        assert_eq!(
            forward_targets("}}} {", "clusterset.local"),
            Forwarding::NoBlock
        );
    }
}
