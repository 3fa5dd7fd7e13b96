//! Pure logic of a RemoteRegistry's status: the conditions `Valid`, `Connected` and `Synced`,
//! the imported-record count, the last sync time and `observedGeneration`, computed from what
//! the registry observes. `lastTransitionTime` only moves when a condition's status changes, and
//! times have whole seconds (what the API server stores), so recomputing an unchanged state
//! yields an equal status and no write.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use xcc_controller::conditions::condition;
use xcc_proto::crd::{
    CONDITION_CONNECTED, CONDITION_SYNCED, CONDITION_VALID, ImportStatus, RemoteRegistryStatus,
};
use xcc_proto::xcc::federation::v1::{DenyReason, ServiceQueryResponse};

use crate::federation::Target;

use crate::peers::PeerState;

/// Reason of `Valid=False` for a RemoteRegistry outside the registry's namespace.
pub const WRONG_NAMESPACE_REASON: &str = "WrongNamespace";
/// Reason of `Valid=False` for a spec that fails validation other than `allowedDomains`.
pub const INVALID_SPEC_REASON: &str = "InvalidSpec";
/// Reason of `Valid=False` for a second `role: Parent` RemoteRegistry.
pub const SECOND_PARENT_REASON: &str = "SecondParent";

/// What the registry decided about a RemoteRegistry's spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validity {
    Valid,
    Invalid { reason: String, message: String },
}

/// The client's state as the status reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub state: PeerState,
    pub last_error: String,
    pub connected_since: Option<SystemTime>,
    pub last_sync: Option<SystemTime>,
}

/// Everything the status is computed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub generation: Option<i64>,
    pub validity: Validity,
    /// `None`: no client is running for it (yet).
    pub link: Option<Link>,
    pub imported: usize,
    /// `role: Parent`: the hierarchy imports and their answers (`Some` even when empty).
    pub hierarchy: Option<Vec<ImportStatus>>,
}

/// `ImportStatus.state` of an answered, granted import.
pub const IMPORT_GRANTED: &str = "Granted";
pub const IMPORT_DENIED: &str = "Denied";
pub const IMPORT_NOT_FOUND: &str = "NotFound";
pub const IMPORT_UNAVAILABLE: &str = "Unavailable";
pub const IMPORT_REVOKED: &str = "Revoked";
pub const IMPORT_PENDING: &str = "Pending";
/// The parent refused the question (see [`super::refusals::import_status`]).
pub const IMPORT_REFUSED: &str = "Refused";

/// Whether an import state decides its question (the parent-link `Synced` waits for all).
pub fn import_decided(state: &str) -> bool {
    !matches!(state, IMPORT_UNAVAILABLE | IMPORT_PENDING)
}

/// The status of one hierarchy import from its latest answer.
pub fn import_status(
    target: &Target,
    requester_service: &str,
    answer: Option<&ServiceQueryResponse>,
) -> ImportStatus {
    let (fqdn, namespace, name) = match target {
        Target::Fqdn(f) => (Some(f.clone()), None, None),
        Target::Name { namespace, name } => (None, Some(namespace.clone()), Some(name.clone())),
    };
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let (state, reason, message) = match answer {
        None => (
            IMPORT_PENDING,
            None,
            Some("waiting for an answer from the hierarchy".to_string()),
        ),
        Some(a) if a.unavailable => (IMPORT_UNAVAILABLE, None, some(&a.error)),
        Some(a) if a.revoked => (IMPORT_REVOKED, None, some(&a.error)),
        Some(a) if !a.found => (
            IMPORT_NOT_FOUND,
            None,
            Some(if a.error.is_empty() {
                "service not found in hierarchy".to_string()
            } else {
                a.error.clone()
            }),
        ),
        Some(a) if a.access_allowed => (
            IMPORT_GRANTED,
            None,
            Some(format!(
                "granted by {}; owner cluster {}",
                a.resolver_cluster, a.owner_cluster
            )),
        ),
        Some(a) => {
            let reason =
                match DenyReason::try_from(a.deny_reason).unwrap_or(DenyReason::Unspecified) {
                    DenyReason::NotAllowedByCallee => "NotAllowedByCallee",
                    DenyReason::NotRequested => "NotRequested",
                    DenyReason::PolicyDenied => "PolicyDenied",
                    DenyReason::Unspecified => "Denied",
                };
            let mut message = a.error.clone();
            if !a.policies.is_empty() {
                let policies = format!("policies: {}", a.policies.join(", "));
                message = if message.is_empty() {
                    policies
                } else {
                    format!("{message}; {policies}")
                };
            }
            (IMPORT_DENIED, Some(reason.to_string()), some(&message))
        }
    };
    ImportStatus {
        fqdn,
        namespace,
        name,
        requester_service: some(requester_service),
        state: state.to_string(),
        reason,
        message,
    }
}

/// A time with whole seconds.
pub fn seconds(t: SystemTime) -> Time {
    let ts = Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH);
    Time(Timestamp::from_second(ts.as_second()).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Conditions being built against the previous ones.
struct Conditions<'a> {
    previous: &'a [Condition],
    generation: Option<i64>,
    now: Time,
    out: Vec<Condition>,
}

impl Conditions<'_> {
    /// Add a condition, keeping `lastTransitionTime` when the status is unchanged.
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: String) {
        let status = if status { "True" } else { "False" };
        self.out.push(condition(
            self.previous,
            type_,
            status,
            reason,
            message,
            self.generation,
            &self.now,
        ));
    }
}

/// Condition on a RemoteRegistry whose `serverCA` holds a CA close to its expiry (reason
/// `ServerCAExpiresSoon`) or past it (`ServerCAExpired`); absent while every CA is fine.
pub const CONDITION_CERTIFICATE_EXPIRING: &str = "CertificateExpiring";

/// Add `CertificateExpiring=True` to `status` (whose conditions were set from `previous`) when
/// `expiring` says so: `(reason, message)`.
pub fn set_certificate_expiring(
    status: &mut RemoteRegistryStatus,
    previous: Option<&RemoteRegistryStatus>,
    expiring: Option<(&str, String)>,
    now: SystemTime,
) {
    let Some((reason, message)) = expiring else {
        return;
    };
    let mut conditions = Conditions {
        previous: previous.map(|s| s.conditions.as_slice()).unwrap_or(&[]),
        generation: status.observed_generation,
        now: seconds(now),
        out: vec![],
    };
    conditions.set(CONDITION_CERTIFICATE_EXPIRING, true, reason, message);
    status.conditions.extend(conditions.out);
}

/// The status the RemoteRegistry should have. An invalid (or foreign-namespace) registry has
/// only `Valid=False`: nothing runs for it, so there is no connection or sync to report.
pub fn desired(
    previous: Option<&RemoteRegistryStatus>,
    obs: &Observed,
    now: SystemTime,
) -> RemoteRegistryStatus {
    let g = obs.generation;
    let mut conditions = Conditions {
        previous: previous.map(|s| s.conditions.as_slice()).unwrap_or(&[]),
        generation: g,
        now: seconds(now),
        out: Vec::with_capacity(3),
    };
    match &obs.validity {
        Validity::Invalid { reason, message } => {
            conditions.set(CONDITION_VALID, false, reason, message.clone());
            return RemoteRegistryStatus {
                conditions: conditions.out,
                observed_generation: g,
                imported_records: None,
                last_sync_time: None,
                imports: None,
            };
        }
        Validity::Valid => conditions.set(
            CONDITION_VALID,
            true,
            "Accepted",
            "the spec is valid".into(),
        ),
    }
    let (connected, reason, message) = match &obs.link {
        None => (
            false,
            "NotStarted",
            "no import client is running yet".to_string(),
        ),
        Some(l) => match l.state {
            PeerState::Connected => (true, "Connected", "import stream established".into()),
            PeerState::Failed => (false, "Failed", l.last_error.clone()),
            PeerState::Stopped => (false, "Stopped", "import client stopped".into()),
            PeerState::Connecting | PeerState::Backoff => {
                let msg = if l.last_error.is_empty() {
                    "connecting".to_string()
                } else {
                    l.last_error.clone()
                };
                (false, "Disconnected", msg)
            }
        },
    };
    conditions.set(CONDITION_CONNECTED, connected, reason, message);
    let connected = obs
        .link
        .as_ref()
        .is_some_and(|l| l.state == PeerState::Connected);
    match &obs.hierarchy {
        Some(imports) => {
            // A parent: synced once the link is up and every import has a deciding answer.
            let open = imports.iter().filter(|i| !import_decided(&i.state)).count();
            let synced = connected && open == 0;
            let (reason, message) = if synced {
                (
                    "ImportsAnswered",
                    format!("every import ({}) has an answer", imports.len()),
                )
            } else if !connected {
                ("Pending", "waiting for the parent link".to_string())
            } else {
                (
                    "Pending",
                    format!("{open} of {} imports without an answer", imports.len()),
                )
            };
            conditions.set(CONDITION_SYNCED, synced, reason, message);
        }
        None => {
            let synced = connected
                && obs.link.as_ref().is_some_and(
                    |l| matches!((l.last_sync, l.connected_since), (Some(s), Some(c)) if s >= c),
                );
            let (reason, message) = if synced {
                (
                    "SnapshotApplied",
                    "imports match the remote's complete snapshot",
                )
            } else {
                ("Pending", "waiting for a complete snapshot of the remote")
            };
            conditions.set(CONDITION_SYNCED, synced, reason, message.into());
        }
    }
    RemoteRegistryStatus {
        conditions: conditions.out,
        observed_generation: g,
        imported_records: Some(i32::try_from(obs.imported).unwrap_or(i32::MAX)),
        last_sync_time: obs
            .link
            .as_ref()
            .and_then(|l| l.last_sync)
            .map(seconds)
            // Keep the last known sync time across reconnects.
            .or_else(|| previous.and_then(|p| p.last_sync_time.clone())),
        imports: obs.hierarchy.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn valid(link: Option<Link>, imported: usize) -> Observed {
        Observed {
            generation: Some(1),
            validity: Validity::Valid,
            link,
            imported,
            hierarchy: None,
        }
    }

    #[test]
    fn recomputing_an_unchanged_state_gives_an_equal_status() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_500);
        let link = Link {
            state: PeerState::Connected,
            last_error: String::new(),
            connected_since: Some(t0),
            last_sync: Some(t0 + Duration::from_millis(300)),
        };
        let first = desired(None, &valid(Some(link.clone()), 3), t0);
        let types: Vec<(&str, &str)> = first
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [("Valid", "True"), ("Connected", "True"), ("Synced", "True")]
        );
        assert_eq!(first.imported_records, Some(3));
        assert_eq!(first.observed_generation, Some(1));
        let later = desired(
            Some(&first),
            &valid(Some(link), 3),
            t0 + Duration::from_secs(3600),
        );
        assert_eq!(later, first);
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let down = Link {
            state: PeerState::Backoff,
            last_error: "Unavailable: connection refused".into(),
            connected_since: None,
            last_sync: None,
        };
        let s1 = desired(None, &valid(Some(down.clone()), 0), t0);
        let c = &s1.conditions[1];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "Disconnected", "Unavailable: connection refused")
        );
        let mut connecting = down.clone();
        connecting.state = PeerState::Connecting;
        // Retrying with the same error is the same condition: no write.
        let s2 = desired(
            Some(&s1),
            &valid(Some(connecting), 0),
            t0 + Duration::from_secs(5),
        );
        assert_eq!(s2, s1);
        let up = Link {
            state: PeerState::Connected,
            last_error: String::new(),
            connected_since: Some(t0 + Duration::from_secs(9)),
            last_sync: None,
        };
        let s3 = desired(Some(&s2), &valid(Some(up), 0), t0 + Duration::from_secs(10));
        assert_eq!(s3.conditions[0].last_transition_time, seconds(t0));
        assert_eq!(
            s3.conditions[1].last_transition_time,
            seconds(t0 + Duration::from_secs(10))
        );
        assert_eq!(s3.conditions[2].status, "False");
    }

    #[test]
    fn parent_synced_needs_the_link_and_every_import_decided() {
        use xcc_proto::xcc::federation::v1::ServiceQueryResponse;
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let target = Target::Name {
            namespace: "shop".into(),
            name: "api".into(),
        };
        let denied = ServiceQueryResponse {
            found: true,
            deny_reason: DenyReason::PolicyDenied as i32,
            policies: vec!["no-secret".into()],
            error: "forbidden".into(),
            ..Default::default()
        };
        let d = import_status(&target, "web", Some(&denied));
        assert_eq!(
            (d.state.as_str(), d.reason.as_deref(), d.message.as_deref()),
            (
                "Denied",
                Some("PolicyDenied"),
                Some("forbidden; policies: no-secret")
            )
        );
        assert_eq!(
            (d.namespace.as_deref(), d.name.as_deref(), d.fqdn.as_deref()),
            (Some("shop"), Some("api"), None)
        );
        let pending = import_status(&Target::Fqdn("a.b".into()), "", None);
        assert_eq!(
            (
                pending.state.as_str(),
                pending.requester_service.as_deref(),
                pending.fqdn.as_deref()
            ),
            ("Pending", None, Some("a.b"))
        );
        let up = Link {
            state: PeerState::Connected,
            last_error: String::new(),
            connected_since: Some(t0),
            last_sync: None,
        };
        let parent = |imports: Vec<ImportStatus>| Observed {
            hierarchy: Some(imports),
            ..valid(Some(up.clone()), 0)
        };
        let synced = |s: &RemoteRegistryStatus| {
            let c = &s.conditions[2];
            (c.status.clone(), c.reason.clone(), c.message.clone())
        };
        let s = desired(None, &parent(vec![d.clone(), pending.clone()]), t0);
        assert_eq!(
            synced(&s),
            (
                "False".to_string(),
                "Pending".to_string(),
                "1 of 2 imports without an answer".to_string()
            )
        );
        let s = desired(Some(&s), &parent(vec![d.clone()]), t0);
        assert_eq!(
            synced(&s),
            (
                "True".to_string(),
                "ImportsAnswered".to_string(),
                "every import (1) has an answer".to_string()
            )
        );
        assert_eq!(s.imports, Some(vec![d.clone()]));
        let down = Observed {
            link: None,
            ..parent(vec![d])
        };
        assert_eq!(desired(Some(&s), &down, t0).conditions[2].status, "False");
    }

    #[test]
    fn invalid_has_only_the_valid_condition() {
        let s = desired(
            None,
            &Observed {
                generation: Some(42),
                validity: Validity::Invalid {
                    reason: "InvalidDomain".into(),
                    message: "x: Invalid domain".into(),
                },
                link: None,
                imported: 0,
                hierarchy: None,
            },
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(s.conditions.len(), 1);
        assert_eq!(
            (
                s.conditions[0].type_.as_str(),
                s.conditions[0].status.as_str(),
                s.conditions[0].reason.as_str()
            ),
            ("Valid", "False", "InvalidDomain")
        );
        assert_eq!(s.observed_generation, Some(42));
        assert_eq!(s.imported_records, None);
    }
}
