//! Propagation-latency metrics, shared by the registry (`xcc_propagation_seconds`, at import) and
//! the binder (`xcc_binder_propagation_seconds`, once it has written the objects): a histogram
//! per source cluster and a counter of stamps the local clock could not take at face value
//! ([`xcc_proto::propagation::latency`] decides which).

use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use xcc_proto::propagation::{BUCKETS, Latency, latency};

/// The label of every propagation series: the cluster the change came from (a RemoteRegistry's
/// peer, from a small fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceCluster {
    pub source_cluster: String,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The histogram and the skew counter; clones share the same series.
#[derive(Clone, Debug)]
pub struct PropagationMetrics {
    seconds: Family<SourceCluster, Histogram, fn() -> Histogram>,
    skew: Family<SourceCluster, Counter>,
}

impl Default for PropagationMetrics {
    fn default() -> Self {
        Self {
            seconds: Family::new_with_constructor(histogram),
            skew: Family::default(),
        }
    }
}

impl PropagationMetrics {
    /// Register as `<seconds_name>` (a histogram in seconds) and `<skew_name>` (a counter; the
    /// `_total` suffix is added by the encoder) in `registry`.
    pub fn register(
        &self,
        registry: &mut Registry,
        seconds_name: &str,
        seconds_help: &str,
        skew_name: &str,
    ) {
        registry.register(seconds_name, seconds_help, self.seconds.clone());
        registry.register(
            skew_name,
            "Propagation stamps ahead of the local clock (observed as 0 up to 60 s ahead) or \
             too far off to observe (more than 60 s ahead or an hour behind)",
            self.skew.clone(),
        );
    }

    /// Observe the propagation of a change stamped `stamp` from `source_cluster`, at `now`.
    /// Returns what was done (for logs and tests).
    pub fn observe(&self, source_cluster: &str, stamp: SystemTime, now: SystemTime) -> Latency {
        let label = SourceCluster {
            source_cluster: source_cluster.to_string(),
        };
        let l = latency(stamp, now);
        if l.is_skew() {
            self.skew.get_or_create(&label).inc();
        }
        if let Latency::Observe { seconds, .. } = l {
            self.seconds.get_or_create(&label).observe(seconds);
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn scrape(m: &PropagationMetrics) -> String {
        let mut r = Registry::default();
        m.register(&mut r, "t_seconds", "test", "t_skew");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encodes");
        out
    }

    #[test]
    fn observations_are_bounded_and_skew_counted() {
        let m = PropagationMetrics::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        m.observe("west", now - Duration::from_millis(200), now);
        m.observe("west", now + Duration::from_secs(5), now);
        m.observe("west", now + Duration::from_secs(3600 * 24 * 365), now);
        m.observe("west", now - Duration::from_secs(7200), now);
        let text = scrape(&m);
        assert!(
            text.contains("t_seconds_count{source_cluster=\"west\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("t_seconds_sum{source_cluster=\"west\"} 0.2\n"),
            "{text}"
        );
        assert!(
            text.contains("t_seconds_bucket{le=\"0.25\",source_cluster=\"west\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("t_skew_total{source_cluster=\"west\"} 3\n"),
            "{text}"
        );
    }
}
