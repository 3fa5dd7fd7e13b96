//! Prometheus metrics of the registry (one `prometheus-client` registry; labels from small fixed
//! sets only) and the readiness the plain-HTTP `/metrics`, `/healthz`, `/readyz` endpoint reports.
//! That endpoint carries no catalog data; every federation and admin API is mTLS-only.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum OpLabel {
    Create,
    Update,
    Delete,
    Marker,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: OpLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Api {
    V1alpha1,
    V1alpha2,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    pub api: Api,
}

/// A watched file the registry rejected, and why (the message without the file's name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectedFileLabels {
    pub file: String,
    pub reason: String,
}

/// Every metric the registry exports.
#[derive(Clone, Default)]
pub struct Metrics {
    pub hamlet_streams: Family<ApiLabels, Gauge>,
    pub hamlet_responses: Family<OpLabels, Counter>,
    pub hamlet_acks: Counter,
    pub hamlet_nacks: Counter,
    pub hamlet_unknown_nonces: Counter,
    pub hamlet_ack_timeouts: Counter,
    pub hamlet_resyncs: Counter,
    pub client_reconnects: Counter,
    pub client_imports_applied: Counter,
    pub client_imports_rejected: Counter,
    pub client_stale_removed: Counter,
    pub catalog_services: Gauge,
    pub store_errors: Counter,
    /// 1 for each watched file rejected now (its last good content in force).
    pub rejected_files: Family<RejectedFileLabels, Gauge>,
    /// `xcc_propagation_seconds` and `xcc_propagation_clock_skew_total`: observed when an import
    /// that changed arrives live (or in a snapshot, stamped after the stream started).
    pub propagation: xcc_controller::propagation::PropagationMetrics,
}

impl Metrics {
    /// Record the current rejections (`<file>: <reason>` each, as the file stores report them):
    /// one `xcc_rejected_files` series per rejected file, and `xcc_store_errors_total` counts
    /// each rejection not reported before.
    pub fn set_rejected_files(&self, before: &[String], now: &[String]) {
        let new = now.iter().filter(|e| !before.contains(e)).count();
        self.store_errors.inc_by(new as u64);
        self.rejected_files.clear();
        for e in now {
            let (file, reason) = e.split_once(": ").unwrap_or((e.as_str(), ""));
            // One series per file; a long reason is cut (the log has all of it).
            let reason: String = reason.chars().take(200).collect();
            self.rejected_files
                .get_or_create(&RejectedFileLabels {
                    file: file.to_string(),
                    reason,
                })
                .set(1);
        }
    }
}

impl Metrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("xcc");
        r.register(
            "hamlet_streams",
            "Open Hamlet consumer streams",
            self.hamlet_streams.clone(),
        );
        r.register(
            "hamlet_responses",
            "Hamlet responses sent, by operation",
            self.hamlet_responses.clone(),
        );
        r.register("hamlet_acks", "ACKs received", self.hamlet_acks.clone());
        r.register("hamlet_nacks", "NACKs received", self.hamlet_nacks.clone());
        r.register(
            "hamlet_unknown_nonces",
            "ACKs or NACKs naming no outstanding response",
            self.hamlet_unknown_nonces.clone(),
        );
        r.register(
            "hamlet_ack_timeouts",
            "Streams closed because a response was not acknowledged in time",
            self.hamlet_ack_timeouts.clone(),
        );
        r.register(
            "hamlet_resyncs",
            "Consumers that fell behind the change feed and resynchronised",
            self.hamlet_resyncs.clone(),
        );
        r.register(
            "client_reconnects",
            "Import client reconnect attempts",
            self.client_reconnects.clone(),
        );
        r.register(
            "client_imports_applied",
            "Imported records created, updated or deleted",
            self.client_imports_applied.clone(),
        );
        r.register(
            "client_imports_rejected",
            "Imported records refused as invalid (NACKed)",
            self.client_imports_rejected.clone(),
        );
        r.register(
            "client_stale_removed",
            "Stale imports removed after a complete snapshot or quiet period",
            self.client_stale_removed.clone(),
        );
        r.register(
            "catalog_services",
            "Services in the catalog",
            self.catalog_services.clone(),
        );
        r.register(
            "store_errors",
            "Errors reading or writing the store",
            self.store_errors.clone(),
        );
        r.register(
            "rejected_files",
            "Watched files rejected now (their last good content stays), with the file and the reason",
            self.rejected_files.clone(),
        );
        self.propagation.register(
            r,
            "propagation_seconds",
            "Seconds from the exporting registry seeing a change until this registry applied \
             the import (the difference of two clocks; see docs/operations.md)",
            "propagation_clock_skew",
        );
    }
}

/// Readiness flag shared with the probe endpoint (`/healthz`, `/readyz`, `/metrics`, served by
/// the process runtime): the same for every xcc process.
pub use xcc_controller::probes::Health;

#[cfg(test)]
mod rejected_files_tests {
    use super::*;

    fn text(m: &Metrics) -> String {
        let mut r = Registry::default();
        m.register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encode");
        out
    }

    /// A rejected file was reported in the log only (`xcc_store_errors_total 0`).
    #[test]
    fn rejected_files_are_counted_with_the_file_and_the_reason() {
        let m = Metrics::default();
        let bad =
            "exports/web.yaml: document 1: spec.endpoints[0].port: must be 1-65535".to_string();
        m.set_rejected_files(&[], std::slice::from_ref(&bad));
        let t = text(&m);
        assert!(t.contains("xcc_store_errors_total 1"), "{t}");
        assert!(
            t.contains(r#"xcc_rejected_files{file="exports/web.yaml",reason="document 1: spec.endpoints[0].port: must be 1-65535"} 1"#),
            "{t}"
        );
        // Still rejected: not counted again. Fixed: the series goes.
        m.set_rejected_files(std::slice::from_ref(&bad), std::slice::from_ref(&bad));
        assert!(text(&m).contains("xcc_store_errors_total 1"));
        m.set_rejected_files(std::slice::from_ref(&bad), &[]);
        let t = text(&m);
        assert!(!t.contains("exports/web.yaml"), "{t}");
        assert!(t.contains("xcc_store_errors_total 1"), "{t}");
    }
}
