//! How the admin API shows what the registry holds: catalog entries, authorization decisions,
//! the hierarchy's answers and refusals, as the `xcc.admin.v1` messages.

use std::time::SystemTime;

use xcc_proto::xcc::admin::v1 as api;

use crate::authz::Condition as AuthzCondition;
use crate::catalog::ServiceEntry;
use crate::federation::Target;

pub fn to_api(e: &ServiceEntry) -> api::Service {
    api::Service {
        owner_cluster: e.key.cluster.to_string(),
        namespace: e.key.namespace.to_string(),
        name: e.key.name.to_string(),
        fqdn: e.fqdn.to_string(),
        endpoints: e
            .endpoints
            .iter()
            .map(|ep| api::Endpoint {
                address: ep.address.to_string(),
                port: ep.port,
            })
            .collect(),
        ports: e
            .ports
            .iter()
            .map(|p| api::Port {
                name: p.name.to_string(),
                port: p.port,
                protocol: p.protocol.to_string(),
            })
            .collect(),
        labels: e.labels.to_btree_map(),
        allowed_requesters: e.allowed_requesters.clone(),
        origin: e.origin.as_ref().map(|o| api::Origin {
            cluster: o.cluster.clone(),
            namespace: o.namespace.clone(),
            name: o.name.clone(),
            kind: o.kind.clone(),
        }),
        revision: e.revision,
        source: e.source.to_string(),
    }
}

pub(super) fn timestamp(t: Option<SystemTime>) -> Option<prost_types::Timestamp> {
    t.map(prost_types::Timestamp::from)
}

pub(super) fn condition(c: AuthzCondition) -> i32 {
    (match c {
        AuthzCondition::Granted => api::Condition::Granted,
        AuthzCondition::NotAllowedByCallee => api::Condition::NotAllowedByCallee,
        AuthzCondition::NotRequested => api::Condition::NotRequested,
        AuthzCondition::PolicyDenied => api::Condition::PolicyDenied,
    }) as i32
}

pub(super) fn decision_from_answer(
    a: &xcc_proto::xcc::federation::v1::ServiceQueryResponse,
) -> api::Decision {
    use xcc_proto::xcc::federation::v1::DenyReason;
    let cond = if a.unavailable {
        api::Condition::Unavailable
    } else if !a.found {
        api::Condition::NotFound
    } else if a.access_allowed {
        api::Condition::Granted
    } else {
        match DenyReason::try_from(a.deny_reason).unwrap_or(DenyReason::Unspecified) {
            DenyReason::NotAllowedByCallee => api::Condition::NotAllowedByCallee,
            DenyReason::NotRequested => api::Condition::NotRequested,
            DenyReason::PolicyDenied => api::Condition::PolicyDenied,
            DenyReason::Unspecified => api::Condition::Unspecified,
        }
    };
    api::Decision {
        found: a.found,
        allowed: a.found && a.access_allowed,
        condition: cond as i32,
        reason: if a.error.is_empty() && a.access_allowed {
            format!("granted by {}", a.policies.join(", "))
        } else {
            a.error.clone()
        },
        policies: a.policies.clone(),
        owner_cluster: a.owner_cluster.clone(),
        resolver_cluster: a.resolver_cluster.clone(),
        service: a.found.then(|| api::Service {
            owner_cluster: a.owner_cluster.clone(),
            namespace: a.namespace.clone(),
            name: a.name.clone(),
            fqdn: a.fqdn.clone(),
            endpoints: a
                .endpoints
                .iter()
                .filter_map(|e| crate::federation::convert::parse_endpoint(e).ok())
                .map(|e| api::Endpoint {
                    address: e.address.into(),
                    port: e.port,
                })
                .collect(),
            revision: a.revision,
            ..Default::default()
        }),
        callee_admits: a.found && a.deny_reason != DenyReason::NotAllowedByCallee as i32,
        caller_requested: a.found
            && a.deny_reason != DenyReason::NotRequested as i32
            && a.deny_reason != DenyReason::NotAllowedByCallee as i32,
        policy_permits: a.found && a.access_allowed,
        name_clashes: vec![],
    }
}

/// The import status of `target` for `requester_service` as the admin API shows it: pending
/// until the hierarchy answers, then the answer's condition, reason, owner and endpoints.
pub(super) fn import_status(
    target: &Target,
    requester_service: String,
    answer: Option<&xcc_proto::xcc::federation::v1::ServiceQueryResponse>,
) -> api::ImportStatus {
    let (state, reason, owner, endpoints) = match answer {
        None => ("Pending".to_string(), String::new(), String::new(), vec![]),
        Some(a) => {
            let d = decision_from_answer(a);
            let state = match api::Condition::try_from(d.condition)
                .unwrap_or(api::Condition::Unspecified)
            {
                api::Condition::Granted => "Granted",
                api::Condition::NotFound => "NotFound",
                api::Condition::Unavailable => "Unavailable",
                _ => "Denied",
            };
            (
                state.to_string(),
                d.reason.clone(),
                d.owner_cluster.clone(),
                d.service.map(|s| s.endpoints).unwrap_or_default(),
            )
        }
    };
    api::ImportStatus {
        target: target.to_string(),
        requester_service,
        state,
        reason,
        owner_cluster: owner,
        endpoints,
    }
}

/// A refusal from the parent as one line of text.
pub(super) fn rejection_line(r: &xcc_proto::xcc::federation::v1::Rejection) -> String {
    format!(
        "{} {}/{}/{}: {:?}: {} (refused by {})",
        r.kind,
        r.cluster,
        r.namespace,
        r.name,
        tonic::Code::from_i32(r.code),
        r.reason,
        r.refused_by
    )
}

/// A refusal from the parent, received `at`, as the admin API shows it.
pub(super) fn refused_entry(
    at: SystemTime,
    r: xcc_proto::xcc::federation::v1::Rejection,
) -> api::RefusedEntry {
    api::RefusedEntry {
        code: code_name(tonic::Code::from_i32(r.code)).to_string(),
        kind: r.kind,
        cluster: r.cluster,
        namespace: r.namespace,
        name: r.name,
        fqdn: r.fqdn,
        reason: r.reason,
        check: r.check,
        policy_ids: r.policy_ids,
        refused_by: r.refused_by,
        at: timestamp(Some(at)),
    }
}

/// A gRPC status code's canonical name, as `RefusedEntry.code` carries it (`PERMISSION_DENIED`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
