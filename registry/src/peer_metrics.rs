//! Per-peer metrics, read from the [`PeerTable`] at each scrape: whether each link is up, when it
//! last synchronised, how much it carries and how often it failed, labelled by the direction the
//! records flow (`source_cluster` → `target_cluster`).
//!
//! - A remote registry this registry imports from (or the parent it announces to) is one series
//!   set, `direction="import"`, `remote` = the RemoteRegistry's (or parent's) name,
//!   `source_cluster` = the cluster its certificate named at the last handshake (empty before the
//!   first), `target_cluster` = this cluster.
//! - Hamlet consumers are summed per consumer cluster, `direction="export"`: a consumer connects
//!   with a new source port each time, so one series per connection would churn.
//!
//! Counters restart at 0 when a link's task restarts (a new spec) or a consumer reconnects;
//! Prometheus' `rate()` and `increase()` handle that as any counter reset.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::UNIX_EPOCH;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;

use crate::peers::{PeerKind, PeerState, PeerTable};

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct PeerLabels {
    direction: &'static str,
    remote: String,
    source_cluster: String,
    target_cluster: String,
}

/// One link's values, or several consumer streams' summed.
#[derive(Default, Debug, PartialEq)]
struct PeerValues {
    up: i64,
    streams: i64,
    last_sync: Option<f64>,
    records: u64,
    responses: u64,
    acks: u64,
    nacks: u64,
    reconnects: u64,
}

/// The collector; register it with [`PeerMetrics::register`].
#[derive(Clone)]
pub struct PeerMetrics {
    peers: PeerTable,
    cluster: String,
}

impl std::fmt::Debug for PeerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerMetrics")
            .field("cluster", &self.cluster)
            .finish()
    }
}

impl PeerMetrics {
    pub fn new(peers: PeerTable, cluster: impl Into<String>) -> Self {
        Self {
            peers,
            cluster: cluster.into(),
        }
    }

    /// Register under the `xcc` prefix of `registry`.
    pub fn register(self, registry: &mut prometheus_client::registry::Registry) {
        registry
            .sub_registry_with_prefix("xcc")
            .register_collector(Box::new(self));
    }

    fn snapshot(&self) -> BTreeMap<PeerLabels, PeerValues> {
        let mut out: BTreeMap<PeerLabels, PeerValues> = BTreeMap::new();
        for p in self.peers.list() {
            let (direction, remote, source, target) = match p.kind {
                PeerKind::RemoteRegistry => {
                    ("import", p.name.clone(), p.identity(), self.cluster.clone())
                }
                PeerKind::HamletConsumer => {
                    ("export", String::new(), self.cluster.clone(), p.identity())
                }
            };
            let v = out
                .entry(PeerLabels {
                    direction,
                    remote,
                    source_cluster: source,
                    target_cluster: target,
                })
                .or_default();
            let connected = p.state() == PeerState::Connected;
            v.streams += i64::from(connected);
            v.up = v.up.max(i64::from(connected));
            let synced = p
                .last_sync()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs_f64());
            v.last_sync = match (v.last_sync, synced) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            v.records += p.records.load(Ordering::Relaxed);
            v.responses += p.sent.load(Ordering::Relaxed);
            v.acks += p.acks.load(Ordering::Relaxed);
            v.nacks += p.nacks.load(Ordering::Relaxed);
            v.reconnects += p.reconnects.load(Ordering::Relaxed);
        }
        out
    }
}

/// Encode one gauge family: `value` picks the sample of each label set (`None`: no sample).
fn family_gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    peers: &BTreeMap<PeerLabels, PeerValues>,
    value: impl Fn(&PeerLabels, &PeerValues) -> Option<V>,
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in peers {
        let Some(x) = value(labels, v) else { continue };
        m.encode_family(labels)?.encode_gauge(&x)?;
    }
    Ok(())
}

impl Collector for PeerMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let peers = self.snapshot();
        let import = |l: &PeerLabels| l.direction == "import";
        family_gauge(
            &mut encoder,
            "peer_up",
            "1 while the link to this peer is established (an import stream, a parent link, or at least one consumer stream)",
            &peers,
            |_, v| Some(v.up),
        )?;
        family_gauge(
            &mut encoder,
            "peer_streams",
            "Established Hamlet streams of this consumer cluster",
            &peers,
            |l, v| (!import(l)).then_some(v.streams),
        )?;
        family_gauge(
            &mut encoder,
            "peer_last_sync_timestamp_seconds",
            "When the link last completed a synchronisation (a snapshot applied, or the last ACK of a snapshot sent), Unix seconds",
            &peers,
            |_, v| v.last_sync,
        )?;
        family_gauge(
            &mut encoder,
            "peer_records",
            "Records imported from this remote now",
            &peers,
            |l, v| import(l).then_some(v.records as i64),
        )?;
        family_counter(
            &mut encoder,
            "peer_responses",
            "Hamlet responses sent to this consumer cluster",
            &peers,
            |l, v| (!import(l)).then_some(v.responses),
        )?;
        family_counter(
            &mut encoder,
            "peer_acks",
            "ACKs received from this consumer cluster",
            &peers,
            |l, v| (!import(l)).then_some(v.acks),
        )?;
        family_counter(
            &mut encoder,
            "peer_nacks",
            "NACKs received from this consumer cluster (records it refused)",
            &peers,
            |l, v| (!import(l)).then_some(v.nacks),
        )?;
        family_counter(
            &mut encoder,
            "peer_reconnects",
            "Reconnect attempts of the link to this remote since its task started",
            &peers,
            |l, v| import(l).then_some(v.reconnects),
        )?;
        Ok(())
    }
}

fn family_counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    peers: &BTreeMap<PeerLabels, PeerValues>,
    value: impl Fn(&PeerLabels, &PeerValues) -> Option<u64>,
) -> Result<(), std::fmt::Error> {
    let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in peers {
        let Some(x) = value(labels, v) else { continue };
        m.encode_family(labels)?
            .encode_counter::<PeerLabels, _, f64>(&x, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &PeerMetrics) -> String {
        let mut r = prometheus_client::registry::Registry::default();
        m.clone().register(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).expect("encode");
        out
    }

    #[test]
    fn imports_and_consumers_are_labelled_by_the_direction_records_flow() {
        let table = PeerTable::default();
        let m = PeerMetrics::new(table.clone(), "west");
        let remote = table.register(PeerKind::RemoteRegistry, "east-rr", "", "east:8443");
        // Before the first handshake the remote's cluster is not known.
        let t = text(&m);
        assert!(
            t.contains(r#"xcc_peer_up{direction="import",remote="east-rr",source_cluster="",target_cluster="west"} 0"#),
            "{t}"
        );
        assert!(!t.contains("xcc_peer_last_sync_timestamp_seconds{"), "{t}");

        remote.stats.set_identity("east");
        remote.stats.set_state(PeerState::Connected);
        remote.stats.records.store(7, Ordering::Relaxed);
        remote.stats.reconnects.store(2, Ordering::Relaxed);
        remote.stats.mark_synced();
        let a = table.register(PeerKind::HamletConsumer, "north@10.0.0.1:5000", "north", "");
        let b = table.register(PeerKind::HamletConsumer, "north@10.0.0.1:5001", "north", "");
        for (s, acks) in [(&a, 3), (&b, 4)] {
            s.stats.set_state(PeerState::Connected);
            s.stats.acks.store(acks, Ordering::Relaxed);
            s.stats.sent.store(acks + 1, Ordering::Relaxed);
        }
        b.stats.nacks.store(1, Ordering::Relaxed);

        let t = text(&m);
        let imp =
            r#"{direction="import",remote="east-rr",source_cluster="east",target_cluster="west"}"#;
        let exp = r#"{direction="export",remote="",source_cluster="west",target_cluster="north"}"#;
        for line in [
            format!("xcc_peer_up{imp} 1"),
            format!("xcc_peer_records{imp} 7"),
            format!("xcc_peer_reconnects_total{imp} 2"),
            format!("xcc_peer_up{exp} 1"),
            format!("xcc_peer_streams{exp} 2"),
            format!("xcc_peer_acks_total{exp} 7"),
            format!("xcc_peer_responses_total{exp} 9"),
            format!("xcc_peer_nacks_total{exp} 1"),
        ] {
            assert!(t.contains(&line), "{line} missing in\n{t}");
        }
        assert!(
            t.contains(&format!("xcc_peer_last_sync_timestamp_seconds{imp} ")),
            "{t}"
        );
        // Values that do not belong to a direction are not exported for it.
        assert!(!t.contains(&format!("xcc_peer_records{exp}")), "{t}");
        assert!(!t.contains(&format!("xcc_peer_acks_total{imp}")), "{t}");

        // One consumer stream leaves: the cluster stays up with one stream; both leave: gone.
        drop(a);
        assert!(text(&m).contains(&format!("xcc_peer_streams{exp} 1")));
        drop(b);
        assert!(!text(&m).contains("direction=\"export\""));
        remote.stats.set_state(PeerState::Backoff);
        assert!(text(&m).contains(&format!("xcc_peer_up{imp} 0")));
    }
}
