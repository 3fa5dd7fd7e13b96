//! Metrics of `xcc dns` (`prometheus-client`, labels from small fixed sets) and its plain-HTTP
//! `/metrics`, `/healthz`, `/readyz` endpoint. Readiness follows the published snapshot: false
//! until every feed source has delivered its first full listing.

use std::collections::BTreeSet;
use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use xcc_controller::probes::Probes;

use super::answer::Snapshot;
use super::wire::Transport;

/// Response code label (the codes we send; anything else is `other`), rendered lowercase.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RcodeLabel {
    /// NOERROR (answers and NODATA).
    Noerror,
    /// FORMERR.
    Formerr,
    /// SERVFAIL (not ready, upstream failure).
    Servfail,
    /// NXDOMAIN.
    Nxdomain,
    /// NOTIMP.
    Notimp,
    /// REFUSED.
    Refused,
    /// BADVERS.
    Badvers,
    /// Anything else.
    Other,
}

const RCODES: [RcodeLabel; 8] = [
    RcodeLabel::Noerror,
    RcodeLabel::Formerr,
    RcodeLabel::Servfail,
    RcodeLabel::Nxdomain,
    RcodeLabel::Notimp,
    RcodeLabel::Refused,
    RcodeLabel::Badvers,
    RcodeLabel::Other,
];

impl RcodeLabel {
    fn as_str(self) -> &'static str {
        match self {
            Self::Noerror => "noerror",
            Self::Formerr => "formerr",
            Self::Servfail => "servfail",
            Self::Nxdomain => "nxdomain",
            Self::Notimp => "notimp",
            Self::Refused => "refused",
            Self::Badvers => "badvers",
            Self::Other => "other",
        }
    }
}

impl EncodeLabelValue for RcodeLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

impl From<ResponseCode> for RcodeLabel {
    fn from(code: ResponseCode) -> Self {
        match code {
            ResponseCode::NoError => Self::Noerror,
            ResponseCode::FormErr => Self::Formerr,
            ResponseCode::ServFail => Self::Servfail,
            ResponseCode::NXDomain => Self::Nxdomain,
            ResponseCode::NotImp => Self::Notimp,
            ResponseCode::Refused => Self::Refused,
            ResponseCode::BADVERS => Self::Badvers,
            _ => Self::Other,
        }
    }
}

/// Transport label, rendered lowercase.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum TransportLabel {
    /// UDP.
    Udp,
    /// TCP.
    Tcp,
}

impl EncodeLabelValue for TransportLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        let s = match self {
            Self::Udp => "udp",
            Self::Tcp => "tcp",
        };
        EncodeLabelValue::encode(&s, encoder)
    }
}

impl From<Transport> for TransportLabel {
    fn from(t: Transport) -> Self {
        match t {
            Transport::Udp => Self::Udp,
            Transport::Tcp => Self::Tcp,
        }
    }
}

/// Labels of the query counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    /// Response code sent.
    pub rcode: RcodeLabel,
    /// Transport.
    pub transport: TransportLabel,
}

/// Labels of the forward counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabels {
    /// Transport.
    pub transport: TransportLabel,
}

/// Every metric `xcc dns` exports. Cloning shares the underlying values.
#[derive(Clone, Debug)]
pub struct DnsMetrics {
    queries: Family<QueryLabels, Counter>,
    /// Counters of `queries` resolved once, indexed by transport then rcode: the hot path
    /// increments an atomic without the family's lock and hash.
    hot: Arc<[Counter; 16]>,
    forwarded: Family<TransportLabels, Counter>,
    /// Forwarded queries that failed (timeout, upstream unreachable, bad reply) → SERVFAIL.
    pub forward_failures: Counter,
    /// Messages dropped without a reply (too short, or responses).
    pub dropped: Counter,
    /// TCP connections closed at once because the total or per-source limit was reached.
    pub tcp_rejected: Counter,
    /// TCP connections closed because the client did not read an answer in time.
    pub tcp_write_timeouts: Counter,
    /// Names with records in the current snapshot.
    pub names: Gauge,
    /// Names claimed by more than one Service.
    pub conflicts: Gauge,
    /// Service names that could not be served (invalid, outside the zones, no cluster IP).
    pub rejected: Gauge,
    /// 1 once the first full sync is published.
    pub ready: Gauge,
}

impl Default for DnsMetrics {
    fn default() -> Self {
        let queries: Family<QueryLabels, Counter> = Family::default();
        let hot: [Counter; 16] = std::array::from_fn(|i| {
            let transport = if i < 8 {
                TransportLabel::Udp
            } else {
                TransportLabel::Tcp
            };
            queries
                .get_or_create(&QueryLabels {
                    rcode: RCODES[i % 8],
                    transport,
                })
                .clone()
        });
        Self {
            queries,
            hot: Arc::new(hot),
            forwarded: Family::default(),
            forward_failures: Counter::default(),
            dropped: Counter::default(),
            tcp_rejected: Counter::default(),
            tcp_write_timeouts: Counter::default(),
            names: Gauge::default(),
            conflicts: Gauge::default(),
            rejected: Gauge::default(),
            ready: Gauge::default(),
        }
    }
}

impl DnsMetrics {
    /// Register every metric under the `xcc_dns` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("xcc_dns");
        r.register(
            "queries",
            "Queries answered by this server, by response code and transport",
            self.queries.clone(),
        );
        r.register(
            "forwarded",
            "Queries relayed to the upstream resolver (transparent mode)",
            self.forwarded.clone(),
        );
        r.register(
            "forward_failures",
            "Relayed queries that failed and were answered SERVFAIL",
            self.forward_failures.clone(),
        );
        r.register(
            "dropped",
            "Messages dropped without a reply (truncated headers, responses)",
            self.dropped.clone(),
        );
        r.register(
            "tcp_rejected",
            "TCP connections closed because the total or per-source connection limit was reached",
            self.tcp_rejected.clone(),
        );
        r.register(
            "tcp_write_timeouts",
            "TCP connections closed because the client did not read an answer within the idle timeout",
            self.tcp_write_timeouts.clone(),
        );
        r.register("names", "Names with records", self.names.clone());
        r.register(
            "conflicts",
            "Names claimed by more than one Service (lowest namespace/name wins)",
            self.conflicts.clone(),
        );
        r.register(
            "rejected_names",
            "Service names not served (invalid, outside the zones, no cluster IP)",
            self.rejected.clone(),
        );
        r.register(
            "ready",
            "1 once the first full sync is served",
            self.ready.clone(),
        );
    }

    /// Count one answered query.
    pub fn query(&self, transport: Transport, rcode: ResponseCode) {
        let base = match transport {
            Transport::Udp => 0,
            Transport::Tcp => 8,
        };
        let label = RcodeLabel::from(rcode);
        let i = RCODES.iter().position(|r| *r == label).unwrap_or(7);
        self.hot[base + i].inc();
    }

    /// Count one relayed query.
    pub fn forward(&self, transport: Transport) {
        self.forwarded
            .get_or_create(&TransportLabels {
                transport: transport.into(),
            })
            .inc();
    }

    /// Count of answered queries with this code and transport (for tests and reports).
    pub fn queries_with(&self, transport: Transport, rcode: ResponseCode) -> u64 {
        let label = QueryLabels {
            rcode: rcode.into(),
            transport: transport.into(),
        };
        self.queries.get(&label).map(|c| c.get()).unwrap_or(0)
    }

    /// Count of relayed queries on `transport`.
    pub fn forwarded_with(&self, transport: Transport) -> u64 {
        let label = TransportLabels {
            transport: transport.into(),
        };
        self.forwarded.get(&label).map(|c| c.get()).unwrap_or(0)
    }
}

/// Turns snapshots into gauge values and log lines, remembering what it already reported so
/// that a conflict or a rejected name is logged once when it appears, not on every publish.
#[derive(Debug, Default)]
pub struct SnapshotObserver {
    conflicts: BTreeSet<String>,
    rejected: BTreeSet<String>,
}

impl SnapshotObserver {
    /// Update the gauges from `snap`; return the problems not reported before.
    pub fn observe(&mut self, snap: &Snapshot, metrics: &DnsMetrics) -> Vec<String> {
        let zones = &snap.zones;
        metrics.names.set(gauge_value(zones.record_names()));
        metrics.conflicts.set(gauge_value(zones.conflicts().len()));
        metrics.rejected.set(gauge_value(zones.rejected().len()));
        metrics.ready.set(i64::from(snap.ready));
        let conflicts: BTreeSet<String> = zones
            .conflicts()
            .iter()
            .map(|c| {
                let losers: Vec<String> = c.losers.iter().map(ToString::to_string).collect();
                format!(
                    "{} is claimed by {} and {}; {} serves it",
                    c.name,
                    c.winner,
                    losers.join(", "),
                    c.winner
                )
            })
            .collect();
        let rejected: BTreeSet<String> = zones
            .rejected()
            .iter()
            .map(|r| format!("{} from {} is not served: {}", r.name, r.key, r.reason))
            .collect();
        let new: Vec<String> = conflicts
            .difference(&self.conflicts)
            .chain(rejected.difference(&self.rejected))
            .cloned()
            .collect();
        self.conflicts = conflicts;
        self.rejected = rejected;
        new
    }
}

/// Follow the published snapshots until `cancel`: update the gauges, and log each conflict and
/// rejected name once when it appears.
pub async fn observe_snapshots(
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    metrics: DnsMetrics,
    cancel: CancellationToken,
) {
    let mut observer = SnapshotObserver::default();
    loop {
        let snap = snapshots.borrow_and_update().clone();
        for line in observer.observe(&snap, &metrics) {
            tracing::warn!("DNS: {line}");
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = snapshots.changed() => if changed.is_err() { return },
        }
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// What `/metrics`, `/healthz` and `/readyz` serve: ready once the index has published a
/// snapshot built from every feed.
pub fn probes(registry: Registry, snapshots: watch::Receiver<Arc<Snapshot>>) -> Probes {
    Probes::ready_when(registry, move || snapshots.borrow().ready)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::zone::{ServiceInfo, ServiceKey, ZoneSet};

    fn svc(ns: &str, fqdn: &str) -> ServiceInfo {
        ServiceInfo {
            key: ServiceKey::new(ns, "s"),
            annotations: [(
                xcc_proto::names::FQDN_ANNOTATION.to_string(),
                fqdn.to_string(),
            )]
            .into_iter()
            .collect(),
            cluster_ips: vec!["10.0.0.1".parse().unwrap()],
            ports: Vec::new(),
        }
    }

    fn snap(services: &[ServiceInfo]) -> Snapshot {
        Snapshot {
            zones: Arc::new(ZoneSet::build(&["xcc.test".into()], services, None, 1)),
            ready: true,
            ..Snapshot::default()
        }
    }

    #[test]
    fn problems_are_reported_once_and_gauges_follow() {
        let metrics = DnsMetrics::default();
        let mut observer = SnapshotObserver::default();
        let first = snap(&[
            svc("a", "dup.xcc.test"),
            svc("b", "dup.xcc.test"),
            svc("c", "x.example.com"),
        ]);
        let lines = observer.observe(&first, &metrics);
        assert_eq!(
            lines,
            vec![
                "dup.xcc.test is claimed by a/s and b/s; a/s serves it",
                "x.example.com from c/s is not served: outside every configured zone",
            ]
        );
        assert_eq!(
            (
                metrics.names.get(),
                metrics.conflicts.get(),
                metrics.rejected.get()
            ),
            (1, 1, 1)
        );
        assert_eq!(metrics.ready.get(), 1);
        assert!(
            observer.observe(&first, &metrics).is_empty(),
            "reported once"
        );
        let fixed = snap(&[svc("a", "dup.xcc.test")]);
        assert!(observer.observe(&fixed, &metrics).is_empty());
        assert_eq!((metrics.conflicts.get(), metrics.rejected.get()), (0, 0));
        // A problem that comes back is reported again.
        assert_eq!(observer.observe(&first, &metrics).len(), 2);
    }

    #[test]
    fn rcode_labels_and_hot_counters() {
        let m = DnsMetrics::default();
        m.query(Transport::Udp, ResponseCode::NXDomain);
        m.query(Transport::Udp, ResponseCode::NXDomain);
        m.query(Transport::Tcp, ResponseCode::YXDomain);
        assert_eq!(m.queries_with(Transport::Udp, ResponseCode::NXDomain), 2);
        assert_eq!(m.queries_with(Transport::Tcp, ResponseCode::NXDomain), 0);
        assert_eq!(
            m.queries_with(Transport::Tcp, ResponseCode::NotZone),
            1,
            "other"
        );
    }
}
