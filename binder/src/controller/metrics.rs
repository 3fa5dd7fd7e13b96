//! Prometheus metrics of the binder controller (served by `xcc_controller::probes`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// The binder's metrics; clones share the same series.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    reconciles: Family<Labels, Counter>,
    errors: Counter,
    writes: Family<Labels, Counter>,
    managed: Family<Labels, Gauge>,
    relists: Counter,
    propagation: xcc_controller::propagation::PropagationMetrics,
}

impl Metrics {
    /// New metrics registered in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "xcc_binder_reconciles",
            "Reconciles of a group or global service, by result (ok, error)",
            m.reconciles.clone(),
        );
        registry.register(
            "xcc_binder_reconcile_errors",
            "Reconciles that failed and were retried with backoff",
            m.errors.clone(),
        );
        registry.register(
            "xcc_binder_objects_written",
            "API writes by kind and verb (apply, create, delete, status)",
            m.writes.clone(),
        );
        registry.register(
            "xcc_binder_managed_objects",
            "Objects the binder currently manages, by kind",
            m.managed.clone(),
        );
        registry.register(
            "xcc_binder_relists",
            "Watches relisted after the initial list (e.g. after 410 Gone)",
            m.relists.clone(),
        );
        m.propagation.register(
            registry,
            "xcc_binder_propagation_seconds",
            "Seconds from the exporting registry seeing a change until the binder had written \
             the objects for the imported record (the difference of two clocks; see \
             docs/operations.md)",
            "xcc_binder_propagation_clock_skew",
        );
        m
    }

    /// Observe the propagation of a change stamped `stamp`, written at `now`.
    pub fn propagated(
        &self,
        source_cluster: &str,
        stamp: std::time::SystemTime,
        now: std::time::SystemTime,
    ) {
        self.propagation.observe(source_cluster, stamp, now);
    }

    pub(crate) fn reconciled(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&vec![("result".into(), result.into())])
            .inc();
        if !ok {
            self.errors.inc();
        }
    }

    pub(crate) fn wrote(&self, kind: &str, verb: &str) {
        self.writes
            .get_or_create(&vec![
                ("kind".into(), kind.into()),
                ("verb".into(), verb.into()),
            ])
            .inc();
    }

    pub(crate) fn set_managed(&self, kind: &str, n: usize) {
        self.managed
            .get_or_create(&vec![("kind".into(), kind.into())])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub(crate) fn relisted(&self) {
        self.relists.inc();
    }
}
