//! What one batch of a Hamlet import stream does to the imports held for a remote, as pure code:
//! each response is checked (a resource, within the size limit, a FederatedService that decodes
//! and validates), applied to the held imports (create and update replace, delete removes, a
//! name outside `allowedDomains` is dropped), and answered with an ACK or a NACK. The client
//! ([`super::client`]) stores, answers and mirrors what this says.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::SystemTime;

use tonic::Code;
use tracing::{debug, warn};
use xcc_proto::federation::resourcediscovery::v1alpha1 as rd1;
use xcc_proto::google::rpc::Status as RpcStatus;
use xcc_proto::{FEDERATED_SERVICE_V1ALPHA1_URL, SNAPSHOT_COMPLETE_URL};

use super::convert::{self, Imported};

/// What a batch is judged against.
pub(crate) struct Rules<'a> {
    /// The remote, for the log.
    pub remote: &'a str,
    /// The largest resource accepted, in bytes.
    pub max_resource_bytes: usize,
    /// The remote's `allowedDomains`.
    pub allowed_domains: &'a [String],
    /// Whether changes arrive live (the snapshot is complete), so their propagation counts.
    pub live: bool,
    /// When the stream started: a snapshot entry stamped after it is a fresh propagation.
    pub started: SystemTime,
}

/// What a batch did.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Applied {
    /// One answer per response, in order.
    pub replies: Vec<rd1::StreamRequest>,
    /// The FQDNs whose import changed (added, replaced or removed).
    pub changed: BTreeSet<String>,
    /// The propagation stamps of fresh changes, to observe.
    pub fresh: Vec<SystemTime>,
    /// The batch held the snapshot-complete marker.
    pub marker_seen: bool,
    /// Resources refused (oversized or invalid).
    pub rejected: u64,
}

/// Apply `batch` to `imports` (the remote's imports by FQDN) and `seen` (the FQDNs sent since
/// the stream started).
pub(crate) fn apply_batch(
    batch: Vec<rd1::StreamResponse>,
    imports: &mut BTreeMap<String, Imported>,
    seen: &mut HashSet<String>,
    rules: &Rules<'_>,
) -> Applied {
    let mut out = Applied {
        replies: Vec::with_capacity(batch.len()),
        ..Applied::default()
    };
    for resp in batch {
        let reply = apply_one(resp, imports, seen, rules, &mut out);
        out.replies.push(reply);
    }
    out
}

/// Apply one response; its answer.
fn apply_one(
    resp: rd1::StreamResponse,
    imports: &mut BTreeMap<String, Imported>,
    seen: &mut HashSet<String>,
    rules: &Rules<'_>,
    out: &mut Applied,
) -> rd1::StreamRequest {
    use rd1::stream_response::Operation;
    let op = Operation::try_from(resp.operation).unwrap_or(Operation::Unknown);
    let Some(any) = resp.resource else {
        return nack(
            resp.nonce,
            Code::InvalidArgument,
            "response carries no resource".into(),
        );
    };
    if any.value.len() > rules.max_resource_bytes {
        out.rejected += 1;
        let error = format!(
            "resource of {} bytes exceeds the {}-byte limit",
            any.value.len(),
            rules.max_resource_bytes
        );
        warn!(remote = %rules.remote, %error, "rejecting an oversized resource");
        return nack(resp.nonce, Code::ResourceExhausted, error);
    }
    if op == Operation::Unknown {
        // The marker, or an operation we do not know: ACK without applying (as Go does).
        if any.type_url == SNAPSHOT_COMPLETE_URL {
            out.marker_seen = true;
        }
        return ack(resp.nonce);
    }
    let mut imported = match convert::import_v1alpha1(&any) {
        Ok(i) => i,
        Err(e) => {
            out.rejected += 1;
            warn!(remote = %rules.remote, error = %e, "rejecting an imported resource");
            return nack(resp.nonce, Code::InvalidArgument, e.to_string());
        }
    };
    let allowed = xcc_proto::domains::fqdn_allowed(&imported.fqdn, rules.allowed_domains);
    // Every name the import would be served under passes allowedDomains, not only its FQDN:
    // the origin pair names `<name>.<ns>.svc.clusterset.local` (and the headless pod names
    // below it), kept only when that name is allowed for this remote.
    if let Some(name) = crate::peer_labels::keep_origin_if(&mut imported.labels, |n| {
        xcc_proto::domains::fqdn_allowed(n, rules.allowed_domains)
    }) {
        debug!(remote = %rules.remote, fqdn = %imported.fqdn, %name, "origin names a clusterset name outside allowedDomains; served under its FQDN only");
    }
    match op {
        Operation::Delete => {
            if imports.remove(&imported.fqdn).is_some() {
                out.changed.insert(imported.fqdn.clone());
            }
            seen.remove(&imported.fqdn);
        }
        _ if !allowed => {
            debug!(remote = %rules.remote, fqdn = %imported.fqdn, "not in allowedDomains; not imported");
            if imports.remove(&imported.fqdn).is_some() {
                out.changed.insert(imported.fqdn.clone());
            }
        }
        _ => {
            seen.insert(imported.fqdn.clone());
            let unchanged = imports
                .get(&imported.fqdn)
                .is_some_and(|held| held.same_but_stamp(&imported));
            if !unchanged {
                if let Some(stamp) = imported.changed_at()
                    && xcc_proto::propagation::is_fresh(stamp, rules.live, rules.started)
                {
                    out.fresh.push(stamp);
                }
                out.changed.insert(imported.fqdn.clone());
                imports.insert(imported.fqdn.clone(), imported);
            }
        }
    }
    ack(resp.nonce)
}

/// The ACK of the response `nonce`.
pub(crate) fn ack(nonce: String) -> rd1::StreamRequest {
    rd1::StreamRequest {
        resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        response_nonce: nonce,
        status: Some(RpcStatus::default()),
    }
}

/// The NACK of the response `nonce`, with why.
pub(crate) fn nack(nonce: String, code: Code, message: String) -> rd1::StreamRequest {
    rd1::StreamRequest {
        resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        response_nonce: nonce,
        status: Some(RpcStatus {
            code: code as i32,
            message,
            details: vec![],
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prost::Message;
    use rd1::stream_response::Operation;
    use xcc_proto::federation::types::v1alpha1::{FederatedService, federated_service};

    use super::*;

    fn resource(fqdn: &str, address: &str) -> prost_types::Any {
        let fs = FederatedService {
            name: fqdn.into(),
            fqdn: fqdn.into(),
            id: fqdn.into(),
            endpoints: vec![federated_service::Endpoint {
                address: address.into(),
                port: 443,
            }],
            ..FederatedService::default()
        };
        prost_types::Any {
            type_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            value: fs.encode_to_vec(),
        }
    }

    fn response(nonce: &str, op: Operation, any: Option<prost_types::Any>) -> rd1::StreamResponse {
        rd1::StreamResponse {
            nonce: nonce.into(),
            resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            resource: any,
            operation: op as i32,
        }
    }

    fn rules(allowed: &[String]) -> Rules<'_> {
        Rules {
            remote: "east",
            max_resource_bytes: 200,
            allowed_domains: allowed,
            live: false,
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000),
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn creates_updates_and_deletes_change_the_imports_and_are_acked_in_order() {
        let (mut imports, mut seen) = (BTreeMap::new(), HashSet::new());
        let out = apply_batch(
            vec![
                response(
                    "1",
                    Operation::Create,
                    Some(resource("a.x.test", "10.0.0.1")),
                ),
                response(
                    "2",
                    Operation::Create,
                    Some(resource("b.x.test", "10.0.0.2")),
                ),
                response(
                    "3",
                    Operation::Update,
                    Some(resource("b.x.test", "10.0.0.3")),
                ),
                response(
                    "4",
                    Operation::Delete,
                    Some(resource("a.x.test", "10.0.0.1")),
                ),
            ],
            &mut imports,
            &mut seen,
            &rules(&[]),
        );
        assert_eq!(
            out,
            Applied {
                replies: vec![
                    ack("1".into()),
                    ack("2".into()),
                    ack("3".into()),
                    ack("4".into())
                ],
                changed: set(&["a.x.test", "b.x.test"]),
                ..Applied::default()
            }
        );
        assert_eq!(imports.keys().collect::<Vec<_>>(), ["b.x.test"]);
        assert_eq!(imports["b.x.test"].endpoints[0].address, "10.0.0.3");
        assert_eq!(seen, HashSet::from(["b.x.test".to_string()]));

        // The same content again changes nothing and is still acknowledged.
        let again = apply_batch(
            vec![response(
                "5",
                Operation::Update,
                Some(resource("b.x.test", "10.0.0.3")),
            )],
            &mut imports,
            &mut seen,
            &rules(&[]),
        );
        assert_eq!(again.replies, [ack("5".into())]);
        assert!(again.changed.is_empty());
    }

    #[test]
    fn bad_responses_are_nacked_with_why_and_change_nothing() {
        let (mut imports, mut seen) = (BTreeMap::new(), HashSet::new());
        let oversized = prost_types::Any {
            type_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            value: vec![0; 201],
        };
        let undecodable = prost_types::Any {
            type_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            value: vec![0xff; 8],
        };
        let out = apply_batch(
            vec![
                response("1", Operation::Create, None),
                response("2", Operation::Create, Some(oversized)),
                response("3", Operation::Create, Some(undecodable)),
            ],
            &mut imports,
            &mut seen,
            &rules(&[]),
        );
        let codes: Vec<(String, i32)> = out
            .replies
            .iter()
            .map(|r| {
                (
                    r.response_nonce.clone(),
                    r.status.as_ref().map_or(0, |s| s.code),
                )
            })
            .collect();
        assert_eq!(
            codes,
            [
                ("1".to_string(), Code::InvalidArgument as i32),
                ("2".to_string(), Code::ResourceExhausted as i32),
                ("3".to_string(), Code::InvalidArgument as i32),
            ]
        );
        assert_eq!(
            out.replies[1].status.as_ref().map(|s| s.message.as_str()),
            Some("resource of 201 bytes exceeds the 200-byte limit")
        );
        // A response without a resource is the sender's slip, not a refused resource.
        assert_eq!(out.rejected, 2);
        assert!(out.changed.is_empty() && imports.is_empty() && seen.is_empty());
    }

    #[test]
    fn the_marker_is_acked_and_noted_without_applying() {
        let (mut imports, mut seen) = (BTreeMap::new(), HashSet::new());
        let marker = prost_types::Any {
            type_url: SNAPSHOT_COMPLETE_URL.into(),
            value: vec![],
        };
        let out = apply_batch(
            vec![response("9", Operation::Unknown, Some(marker))],
            &mut imports,
            &mut seen,
            &rules(&[]),
        );
        assert_eq!(
            out,
            Applied {
                replies: vec![ack("9".into())],
                marker_seen: true,
                ..Applied::default()
            }
        );
    }

    #[test]
    fn a_name_outside_allowed_domains_is_dropped_and_a_new_one_not_counted_as_seen() {
        let allowed = vec!["x.test".to_string()];
        let (mut imports, mut seen) = (BTreeMap::new(), HashSet::new());
        apply_batch(
            vec![response(
                "1",
                Operation::Create,
                Some(resource("a.y.test", "10.0.0.1")),
            )],
            &mut imports,
            &mut seen,
            &rules(&[]),
        );
        assert!(imports.contains_key("a.y.test"));
        let out = apply_batch(
            vec![response(
                "2",
                Operation::Update,
                Some(resource("a.y.test", "10.0.0.1")),
            )],
            &mut imports,
            &mut seen,
            &rules(&allowed),
        );
        assert_eq!(out.replies, [ack("2".into())]);
        assert_eq!(out.changed, set(&["a.y.test"]));
        assert!(imports.is_empty());
        let out = apply_batch(
            vec![response(
                "3",
                Operation::Create,
                Some(resource("b.y.test", "10.0.0.2")),
            )],
            &mut imports,
            &mut seen,
            &rules(&allowed),
        );
        assert_eq!(out.replies, [ack("3".into())]);
        assert!(out.changed.is_empty() && imports.is_empty());
        assert!(!seen.contains("b.y.test"));
    }
}
