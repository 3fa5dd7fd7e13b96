//! The propagation stamp: when the exporting registry saw a change of one of its own records. It
//! travels with the record as the label (and, on an imported ServiceRecord, the annotation)
//! [`CHANGED_AT_ANNOTATION`], whose value is the exporter's wall clock in milliseconds since the
//! Unix epoch. Pure.
//!
//! The importing registry and the binder subtract the stamp from their own clock, so a latency is
//! the difference of two clocks (NTP is assumed). [`latency`] bounds what a skewed clock — or a
//! lying peer — can do: a stamp up to [`MAX_AHEAD`] in the future is observed as 0; one further
//! ahead, or older than [`MAX_AGE`], is not observed at all. Both are reported as
//! [`Latency::Skewed`], which the callers count in their clock-skew counter. A stamp that does not
//! parse ([`parse_stamp`]) costs only itself: the label is dropped by the allow-list.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The label / annotation carrying the stamp (milliseconds since the Unix epoch, decimal).
/// Peers that do not know it (XCC v1, Go Hamlet) carry it as any other label and ignore it.
pub const CHANGED_AT_ANNOTATION: &str = "connectivity.tanzu.vmware.com/changed-at";

/// A stamp is at most this many decimal digits: `u64::MAX` has 20; 16 digits reach the year
/// 318857, so no honest stamp is longer and a 100 KB value is refused before it is read.
pub const MAX_STAMP_DIGITS: usize = 16;

/// A stamp this far ahead of the local clock is taken as clock skew and observed as 0 (NTP keeps
/// honest clocks within milliseconds; a minute leaves room for a badly kept one).
pub const MAX_AHEAD: Duration = Duration::from_secs(60);

/// A latency above this is not observed: no propagation path of ours takes an hour without a
/// stream being restarted, so the exporter's clock is wrong (or lying).
pub const MAX_AGE: Duration = Duration::from_secs(3600);

/// Why a stamp value is not a stamp.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    #[error("a propagation stamp is 1-{MAX_STAMP_DIGITS} decimal digits, not {0} bytes")]
    Length(usize),
    #[error("a propagation stamp is decimal digits (milliseconds since the Unix epoch)")]
    NotDigits,
}

/// The stamp value of `t` (clamped to the epoch if before it).
pub fn format_stamp(t: SystemTime) -> String {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    ms.to_string()
}

/// The time a stamp value names.
pub fn parse_stamp(value: &str) -> Result<SystemTime, StampError> {
    if value.is_empty() || value.len() > MAX_STAMP_DIGITS {
        return Err(StampError::Length(value.len()));
    }
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(StampError::NotDigits);
    }
    // At most 16 digits: fits a u64 and, as milliseconds, a SystemTime.
    let ms: u64 = value.parse().map_err(|_| StampError::NotDigits)?;
    Ok(UNIX_EPOCH + Duration::from_millis(ms))
}

/// What a receiver observes for a stamp at its `now`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Latency {
    /// Observe this (0 when the stamp was at most [`MAX_AHEAD`] in the future: `clamped`).
    Observe { seconds: f64, clamped: bool },
    /// Do not observe: the stamp is more than [`MAX_AHEAD`] ahead or [`MAX_AGE`] behind.
    Skewed,
}

impl Latency {
    /// Whether the clock-skew counter counts this stamp.
    pub fn is_skew(&self) -> bool {
        matches!(
            self,
            Latency::Skewed | Latency::Observe { clamped: true, .. }
        )
    }
}

/// The latency from `stamp` to `now`, bounded as the module says.
pub fn latency(stamp: SystemTime, now: SystemTime) -> Latency {
    match now.duration_since(stamp) {
        Ok(age) if age <= MAX_AGE => Latency::Observe {
            seconds: age.as_secs_f64(),
            clamped: false,
        },
        Ok(_) => Latency::Skewed,
        Err(ahead) if ahead.duration() <= MAX_AHEAD => Latency::Observe {
            seconds: 0.0,
            clamped: true,
        },
        Err(_) => Latency::Skewed,
    }
}

/// Whether a stamp counts as a fresh propagation on a stream that started at `stream_start`:
/// every change that arrives live does; an entry of the initial snapshot only when its stamp is
/// newer than the stream's start (it changed while the snapshot was being sent), so a
/// reconnect's re-sent snapshot is not counted again.
pub fn is_fresh(stamp: SystemTime, live: bool, stream_start: SystemTime) -> bool {
    live || stamp > stream_start
}

/// Histogram buckets for propagation latencies, in seconds: 10 ms to 60 s.
pub const BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn stamps_round_trip_in_milliseconds() {
        let t = at(1_790_000_000_123);
        assert_eq!(format_stamp(t), "1790000000123");
        assert_eq!(parse_stamp("1790000000123"), Ok(t));
        assert_eq!(format_stamp(UNIX_EPOCH - Duration::from_secs(5)), "0");
    }

    #[test]
    fn hostile_stamps_are_refused_before_they_are_read() {
        assert_eq!(parse_stamp(""), Err(StampError::Length(0)));
        assert_eq!(
            parse_stamp(&"1".repeat(100 * 1024)),
            Err(StampError::Length(100 * 1024))
        );
        assert_eq!(
            parse_stamp("99999999999999999"),
            Err(StampError::Length(17))
        );
        assert_eq!(parse_stamp("-1"), Err(StampError::NotDigits));
        assert_eq!(parse_stamp("12.5"), Err(StampError::NotDigits));
        assert_eq!(parse_stamp("+123"), Err(StampError::NotDigits));
        assert_eq!(
            parse_stamp("2026-11-29T08:00:00Z"),
            Err(StampError::Length(20))
        );
        assert_eq!(parse_stamp("１２"), Err(StampError::NotDigits));
        // The largest accepted stamp is a valid time (year ~318857), observed as skew.
        let far = parse_stamp("9999999999999999").unwrap();
        assert_eq!(latency(far, at(1_790_000_000_000)), Latency::Skewed);
    }

    #[test]
    fn latency_is_clamped_or_refused_never_negative_or_huge() {
        let now = at(1_790_000_000_000);
        assert_eq!(
            latency(at(1_789_999_999_750), now),
            Latency::Observe {
                seconds: 0.25,
                clamped: false
            }
        );
        // Slightly ahead: 0, counted as skew.
        let ahead = latency(at(1_790_000_000_500), now);
        assert_eq!(
            ahead,
            Latency::Observe {
                seconds: 0.0,
                clamped: true
            }
        );
        assert!(ahead.is_skew());
        // Exactly at the bounds: still observed.
        assert_eq!(
            latency(now + MAX_AHEAD, now),
            Latency::Observe {
                seconds: 0.0,
                clamped: true
            }
        );
        assert_eq!(
            latency(now - MAX_AGE, now),
            Latency::Observe {
                seconds: 3600.0,
                clamped: false
            }
        );
        // Beyond them: not observed.
        assert_eq!(
            latency(now + MAX_AHEAD + Duration::from_millis(1), now),
            Latency::Skewed
        );
        assert_eq!(
            latency(now - MAX_AGE - Duration::from_millis(1), now),
            Latency::Skewed
        );
        assert_eq!(latency(UNIX_EPOCH, now), Latency::Skewed);
        assert!(!latency(now, now).is_skew());
    }

    #[test]
    fn a_snapshot_entry_is_fresh_only_when_stamped_after_the_stream_started() {
        let start = at(1_000);
        assert!(is_fresh(at(500), true, start));
        assert!(!is_fresh(at(500), false, start));
        assert!(!is_fresh(at(1_000), false, start));
        assert!(is_fresh(at(1_001), false, start));
    }
}
