//! Retry delays, computed by `backon`: the one policy shape behind every retry loop in xcc (the
//! work queue, the Hamlet client, the parent link, grant writes, NACKed resources).

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};

/// Exponential backoff settings: delays double from `min` and stay at `max` once they reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Backoff {
    /// `min`, `2·min`, `4·min`, … then `max` without end. For per-key retries, which the keys
    /// themselves spread out.
    pub fn delays(&self) -> Delays {
        self.sequence(ExponentialBuilder::new().with_max_delay(self.max))
    }

    /// Randomised delays for reconnecting clients, so that many of them do not come back in
    /// step: retry n waits a random time in `[d, 2d)` with `d = min(min·2^n, max/2)`, so never
    /// less than `min` nor more than `max`.
    pub fn jittered(&self) -> Delays {
        self.sequence(
            ExponentialBuilder::new()
                .with_jitter()
                .with_max_delay((self.max / 2).max(self.min)),
        )
    }

    fn sequence(&self, builder: ExponentialBuilder) -> Delays {
        Delays {
            delays: builder.with_min_delay(self.min).without_max_times().build(),
            max: self.max,
        }
    }
}

/// An endless sequence of retry delays; start a new one ([`Backoff::delays`]) to reset it.
#[derive(Debug)]
pub struct Delays {
    delays: ExponentialBackoff,
    max: Duration,
}

impl Delays {
    /// The delay before the next retry.
    pub fn next_delay(&mut self) -> Duration {
        // Without a retry limit the sequence never ends; `max` bounds the jitter's rounding.
        self.delays.next().unwrap_or(self.max).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_min_to_max_and_stay() {
        let b = Backoff {
            min: Duration::from_millis(250),
            max: Duration::from_secs(2),
        };
        let mut d = b.delays();
        let got: Vec<u128> = (0..7).map(|_| d.next_delay().as_millis()).collect();
        assert_eq!(got, [250, 500, 1000, 2000, 2000, 2000, 2000]);
        // A new sequence starts again from `min`.
        assert_eq!(b.delays().next_delay(), b.min);
    }

    #[test]
    fn a_max_below_min_caps_every_delay() {
        let b = Backoff {
            min: Duration::from_secs(2),
            max: Duration::from_secs(1),
        };
        assert_eq!(b.delays().next_delay(), b.max);
        assert_eq!(b.jittered().next_delay(), b.max);
    }

    #[test]
    fn jittered_delays_grow_within_min_and_max() {
        let b = Backoff {
            min: Duration::from_millis(125),
            max: Duration::from_secs(2),
        };
        for _ in 0..50 {
            let mut d = b.jittered();
            let got: Vec<Duration> = (0..10).map(|_| d.next_delay()).collect();
            // Retry n: [d, 2d] with d = min(125 ms·2^n, 1 s).
            for (n, delay) in got.iter().enumerate() {
                let floor = (b.min * (1 << n)).min(b.max / 2);
                assert!(
                    *delay >= floor && *delay <= (floor * 2).min(b.max),
                    "retry {n}: {delay:?}"
                );
            }
        }
    }
}
