//! The status-condition rule every xcc controller follows: a condition's `lastTransitionTime`
//! is the time its status last changed, so rewriting a condition with the same status (a new
//! reason, message or generation) keeps the time it had.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition `type_` with `status`, `reason` and `message` for the object's `generation`;
/// its `lastTransitionTime` is that of the first condition in `previous` of the same type and
/// status, else `now`.
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: impl Into<String>,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn ready(previous: &[Condition], status: &str, reason: &str, now: i64) -> Condition {
        condition(
            previous,
            "Ready",
            status,
            reason,
            format!("{reason}!"),
            Some(2),
            &at(now),
        )
    }

    #[test]
    fn a_new_condition_starts_now() {
        let c = ready(&[], "True", "Up", 10);
        assert_eq!(
            c,
            Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "Up".into(),
                message: "Up!".into(),
                observed_generation: Some(2),
                last_transition_time: at(10),
            }
        );
    }

    #[test]
    fn the_same_status_keeps_its_time_whatever_else_changes() {
        let first = ready(&[], "True", "Up", 10);
        let again = ready(std::slice::from_ref(&first), "True", "StillUp", 20);
        assert_eq!(again.last_transition_time, at(10));
        assert_eq!(again.reason, "StillUp");
        assert_eq!(again.message, "StillUp!");
    }

    #[test]
    fn a_changed_status_moves_the_time() {
        let first = ready(&[], "True", "Up", 10);
        let down = ready(std::slice::from_ref(&first), "False", "Down", 20);
        assert_eq!(down.last_transition_time, at(20));
        let up = ready(std::slice::from_ref(&down), "True", "Up", 30);
        assert_eq!(up.last_transition_time, at(30));
    }

    #[test]
    fn only_a_condition_of_the_same_type_counts() {
        let other = condition(&[], "Valid", "True", "Ok", String::new(), None, &at(5));
        let c = ready(&[other], "True", "Up", 10);
        assert_eq!(c.last_transition_time, at(10));
    }
}
