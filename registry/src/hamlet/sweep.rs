//! When the managed client may remove the imports a marker-less Hamlet server (the Go reference,
//! every XCC v1 registry) did not resend after a (re)connect. Such a server never says that its
//! snapshot is complete, so the client infers it from timing; this module is that rule, as pure
//! code over instants (the client feeds it the times of messages and ACKs).
//!
//! The sweep is due at the earlier of:
//! - **quiet**: no message for `quiet` after the client last answered (the gap is measured from
//!   the ACK, so a slow store never eats the quiet period), and
//! - **cap**: `max_wait` after the stream was established, once the server has been seen idle
//!   for `settle` after an answer. A lock-step server sends its queued snapshot within a round
//!   trip of each ACK; a gap of `settle` means the queue ran dry at least once, so what follows
//!   is churn, not snapshot. Without such a gap (a snapshot still streaming) only quiet applies.
//!
//! So under continuous churn (a change every second never leaves the stream quiet) a stale
//! import disappears at most `max_wait` after the connection was made.

use std::time::Duration;

use tokio::time::Instant;

/// The timing rule (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SweepRule {
    pub quiet: Duration,
    pub max_wait: Duration,
    pub settle: Duration,
}

impl SweepRule {
    /// `settle` as 1/20 of `quiet`: 500 ms for the default 10 s, far above a loopback or WAN
    /// round trip (what a lock-step snapshot costs per item) and far below a human's change rate.
    pub fn new(quiet: Duration, max_wait: Duration) -> Self {
        Self {
            quiet,
            max_wait: max_wait.max(quiet),
            settle: quiet / 20,
        }
    }
}

/// One stream's sweep timing.
#[derive(Clone, Debug)]
pub struct SweepClock {
    rule: SweepRule,
    connected: Instant,
    /// When the client last finished answering (or connected).
    idle_since: Instant,
    answered_once: bool,
    settled: bool,
}

impl SweepClock {
    pub fn new(rule: SweepRule, connected: Instant) -> Self {
        Self {
            rule,
            connected,
            idle_since: connected,
            answered_once: false,
            settled: false,
        }
    }

    /// A message arrived at `now`.
    pub fn on_message(&mut self, now: Instant) {
        // The wait for the very first message is the server preparing its snapshot, not idling.
        if self.answered_once && now.saturating_duration_since(self.idle_since) >= self.rule.settle
        {
            self.settled = true;
        }
    }

    /// The client finished answering (its ACKs are sent) at `now`.
    pub fn on_answered(&mut self, now: Instant) {
        self.idle_since = now;
        self.answered_once = true;
    }

    /// When the sweep is due.
    pub fn deadline(&self) -> Instant {
        let quiet = self.idle_since + self.rule.quiet;
        if self.settled {
            quiet.min(self.connected + self.rule.max_wait)
        } else {
            quiet
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn rule() -> SweepRule {
        SweepRule::new(10 * S, 30 * S)
    }

    /// Drive the clock through message arrivals at the given offsets (each answered 1 ms
    /// later) and return the offset at which the sweep runs: the first deadline that passes
    /// before the next message.
    fn sweep_at(arrivals: &[Duration]) -> Duration {
        let t0 = Instant::now();
        let mut clock = SweepClock::new(rule(), t0);
        for &at in arrivals {
            let now = t0 + at;
            if clock.deadline() <= now {
                return clock.deadline() - t0;
            }
            clock.on_message(now);
            clock.on_answered(now + Duration::from_millis(1));
        }
        clock.deadline() - t0
    }

    #[test]
    fn a_change_every_second_for_sixty_seconds_sweeps_at_the_cap() {
        // A 1,000-item lock-step snapshot (1 ms per item), then a change every second for 60 s.
        let mut arrivals: Vec<Duration> = (0..1000).map(Duration::from_millis).collect();
        arrivals.extend((2..=61).map(|s| s * S));
        assert_eq!(sweep_at(&arrivals), 30 * S);
    }

    #[test]
    fn a_quiet_stream_sweeps_after_the_quiet_period() {
        let arrivals: Vec<Duration> = (0..100).map(Duration::from_millis).collect();
        // Last message at 99 ms, answered at 100 ms.
        assert_eq!(sweep_at(&arrivals), Duration::from_millis(100) + 10 * S);
    }

    #[test]
    fn a_server_that_sends_nothing_is_swept_after_the_quiet_period() {
        assert_eq!(sweep_at(&[]), 10 * S);
    }

    #[test]
    fn a_snapshot_still_streaming_past_the_cap_is_not_cut_short() {
        // 45 s of back-to-back snapshot items (10 ms each): no idle gap, so only quiet applies.
        let arrivals: Vec<Duration> = (0..4500).map(|i| Duration::from_millis(10 * i)).collect();
        let last_answer = Duration::from_millis(10 * 4499 + 1);
        assert_eq!(sweep_at(&arrivals), last_answer + 10 * S);
    }

    #[test]
    fn a_slow_first_message_does_not_count_as_idle() {
        // The server takes 5 s to prepare its snapshot, then streams it for 40 s.
        let arrivals: Vec<Duration> = (0..4000)
            .map(|i| 5 * S + Duration::from_millis(10 * i))
            .collect();
        let last_answer = 5 * S + Duration::from_millis(10 * 3999 + 1);
        assert_eq!(sweep_at(&arrivals), last_answer + 10 * S);
    }

    #[test]
    fn the_cap_is_never_below_the_quiet_period() {
        let r = SweepRule::new(10 * S, 2 * S);
        assert_eq!(r.max_wait, 10 * S);
        assert_eq!(r.settle, Duration::from_millis(500));
    }
}
