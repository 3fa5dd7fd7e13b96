//! The `Conflict` condition the binder keeps on imported ServiceRecords. Pure: the current
//! conditions and what the binder found in, the condition to write (if any) out.
//!
//! `True` while the record's group cannot be materialised cleanly: its sources disagree on
//! ports (reason [`PORTS_DISAGREE`]) or an object of the name the binder would write is not the
//! binder's (reason [`NOT_MANAGED`]). When that clears, a `True` condition turns `False`
//! (reason [`RESOLVED`]); a record that never had a conflict gets no condition at all, so the
//! common case costs no status write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use xcc_controller::conditions::condition;
use xcc_proto::crd::CONDITION_CONFLICT;

/// Reason: sources of the FQDN disagree on ports.
pub const PORTS_DISAGREE: &str = "PortsDisagree";
/// Reason: an object of the name the binder would write exists and is not the binder's.
pub const NOT_MANAGED: &str = "NotManaged";
/// Reason: the conflict is over.
pub const RESOLVED: &str = "Resolved";

/// A conflict the binder found for a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// [`PORTS_DISAGREE`] or [`NOT_MANAGED`].
    pub reason: &'static str,
    /// Human-readable detail.
    pub message: String,
}

/// The `Conflict` condition to write given the `current` conditions, what was `found` (`None`:
/// no conflict) and the record's `generation`; `None` when nothing needs writing.
/// `lastTransitionTime` changes only when the status does ([`condition`]).
pub fn next(
    current: &[Condition],
    found: Option<&Found>,
    generation: Option<i64>,
    now: Time,
) -> Option<Condition> {
    let existing = current.iter().find(|c| c.type_ == CONDITION_CONFLICT);
    let (status, reason, message) = match (found, existing) {
        (Some(f), _) => ("True", f.reason, f.message.clone()),
        (None, Some(_)) => (
            "False",
            RESOLVED,
            "the sources agree and every object is the binder's".to_string(),
        ),
        (None, None) => return None,
    };
    if let Some(e) = existing
        && e.status == status
        && e.reason == reason
        && e.message == message
        && e.observed_generation == generation
    {
        return None;
    }
    Some(condition(
        existing.map(std::slice::from_ref).unwrap_or_default(),
        CONDITION_CONFLICT,
        status,
        reason,
        message,
        generation,
        &now,
    ))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn written_only_on_change_with_stable_transition_time() {
        let found = Found {
            reason: PORTS_DISAGREE,
            message: "ports of a used".into(),
        };
        assert_eq!(
            next(&[], None, Some(1), at(10)),
            None,
            "no conflict, none before"
        );
        let first = next(&[], Some(&found), Some(1), at(10)).unwrap();
        assert_eq!(first.status, "True");
        assert_eq!(first.reason, PORTS_DISAGREE);
        assert_eq!(first.last_transition_time, at(10));
        let current = vec![first.clone()];
        assert_eq!(next(&current, Some(&found), Some(1), at(20)), None);
        // New message, same status: transition time kept.
        let other = Found {
            message: "ports of b used".into(),
            ..found.clone()
        };
        let changed = next(&current, Some(&other), Some(2), at(20)).unwrap();
        assert_eq!(changed.last_transition_time, at(10));
        assert_eq!(changed.observed_generation, Some(2));
        // Resolved: False with a new transition time; then stable.
        let resolved = next(&[changed], None, Some(2), at(30)).unwrap();
        assert_eq!(resolved.status, "False");
        assert_eq!(resolved.reason, RESOLVED);
        assert_eq!(resolved.last_transition_time, at(30));
        assert_eq!(next(&[resolved], None, Some(2), at(40)), None);
    }
}
