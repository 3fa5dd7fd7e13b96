//! Pure logic of a RemoteRegistry's status: the conditions `Valid`, `Connected` and `Synced`,
//! the imported-record count, the last sync time and `observedGeneration`, computed from what
//! the registry observes. `lastTransitionTime` only moves when a condition's status changes, and
//! times have whole seconds (what the API server stores), so recomputing an unchanged state
//! yields an equal status and no write.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use xcc_proto::crd::{
    CONDITION_CONNECTED, CONDITION_SYNCED, CONDITION_VALID, RemoteRegistryStatus,
};

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
        let status = if status { "True" } else { "False" }.to_string();
        let last_transition_time = self
            .previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| self.now.clone());
        self.out.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            last_transition_time,
            observed_generation: self.generation,
        });
    }
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
    let synced = obs.link.as_ref().is_some_and(|l| {
        l.state == PeerState::Connected
            && matches!((l.last_sync, l.connected_since), (Some(s), Some(c)) if s >= c)
    });
    let (reason, message) = if synced {
        (
            "SnapshotApplied",
            "imports match the remote's complete snapshot",
        )
    } else {
        ("Pending", "waiting for a complete snapshot of the remote")
    };
    conditions.set(CONDITION_SYNCED, synced, reason, message.into());
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
