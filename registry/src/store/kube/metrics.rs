//! Metrics of the Kubernetes store (`xcc_kube_*`), served with the registry's other metrics.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The object written.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Kind {
    ServiceRecord,
    RemoteRegistryStatus,
    ServiceRecordStatus,
}

/// The write.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum WriteVerb {
    Apply,
    Delete,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: Kind,
    pub verb: WriteVerb,
}

/// What was reconciled: a remote's import set (sink) or the RemoteRegistries (controller).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Target {
    Imports,
    RemoteRegistries,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    Ok,
    Error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub target: Target,
    pub result: Outcome,
}

/// Every metric of the Kubernetes store.
#[derive(Clone, Default)]
pub struct KubeMetrics {
    pub writes: Family<WriteLabels, Counter>,
    pub reconciles: Family<ReconcileLabels, Counter>,
    pub imported_records: Gauge,
    pub remote_registries: Gauge,
}

impl KubeMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("xcc_kube");
        r.register(
            "writes",
            "API writes that the store made, by kind and verb",
            self.writes.clone(),
        );
        r.register(
            "reconciles",
            "Reconciles of import sets and RemoteRegistries, by result",
            self.reconciles.clone(),
        );
        r.register(
            "imported_records",
            "Imported ServiceRecords currently managed (all RemoteRegistries)",
            self.imported_records.clone(),
        );
        r.register(
            "remote_registries",
            "RemoteRegistries currently handled (valid, in the registry's namespace)",
            self.remote_registries.clone(),
        );
    }

    pub fn wrote(&self, kind: Kind, verb: WriteVerb) {
        self.writes.get_or_create(&WriteLabels { kind, verb }).inc();
    }

    pub fn reconciled(&self, target: Target, ok: bool) {
        let result = if ok { Outcome::Ok } else { Outcome::Error };
        self.reconciles
            .get_or_create(&ReconcileLabels { target, result })
            .inc();
    }
}
