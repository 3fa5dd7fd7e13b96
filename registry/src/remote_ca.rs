//! The `serverCA` of every RemoteRegistry, watched for its expiry: one
//! `xcc_remote_ca_certificate_expiry_timestamp_seconds{remote,subject,serial}` series per CA, and
//! a WARN (an ERROR once past) when the earliest-expiring CA of a remote enters its warning
//! period ([`xcc_certs::reload::expiry_at`]: under a third of its lifetime or 30 days, and always
//! under 7 days), once per remote, CA and state. The stores call [`RemoteCaExpiry::observe`]
//! with the RemoteRegistries in force whenever they change and when the next state change is
//! due; the Kubernetes store turns what it returns into a condition and a Warning Event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::{error, warn};
use xcc_certs::reload::{CaValidity, Expiry, expiry_at, next_expiry_change, pem_ca_validity};
use xcc_proto::crd::RemoteRegistry;

/// A remote whose `serverCA` holds a CA close to its expiry or past it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expiring {
    pub ca: CaValidity,
    /// [`Expiry::Soon`] or [`Expiry::Expired`].
    pub state: Expiry,
    /// First reported by this call (a Warning Event is due).
    pub new: bool,
}

impl Expiring {
    /// A sentence for a log line, a condition or an Event.
    pub fn message(&self, remote: &str) -> String {
        match self.state {
            Expiry::Expired => format!(
                "the serverCA of RemoteRegistry {remote} ({}, serial {}) expired at {}: the remote's certificate no longer verifies; put the remote's current CA in spec.tlsConfig.serverCA",
                self.ca.subject, self.ca.serial, self.ca.not_after
            ),
            _ => format!(
                "the serverCA of RemoteRegistry {remote} ({}, serial {}) expires at {}: add the remote's new CA to spec.tlsConfig.serverCA before then (docs/operations.md, Rotating the CA)",
                self.ca.subject, self.ca.serial, self.ca.not_after
            ),
        }
    }
}

/// What [`RemoteCaExpiry::observe`] found.
#[derive(Debug, Default)]
pub struct Observation {
    /// Remotes with a CA in its warning period or expired (the earliest-expiring such CA).
    pub expiring: BTreeMap<String, Expiring>,
    /// When the next CA changes state (observe again then).
    pub next_change: Option<time::OffsetDateTime>,
}

/// The metric and what was reported, shared by the store's passes.
#[derive(Clone, Default)]
pub struct RemoteCaExpiry {
    gauge: Family<Vec<(String, String)>, Gauge>,
    /// Per remote: the serial and state last reported (a remote that is fine has none).
    reported: Arc<Mutex<BTreeMap<String, (String, Expiry)>>>,
}

impl RemoteCaExpiry {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "xcc_remote_ca_certificate_expiry_timestamp_seconds",
            "Expiry (notAfter) of each CA of each RemoteRegistry's serverCA, by remote, subject and serial, Unix seconds",
            self.gauge.clone(),
        );
    }

    /// Set the metric from `remotes` (the previous series go), log what is close to its expiry
    /// or past it (once per remote, CA and state) and return it. A remote with an empty
    /// `serverCA` uses this registry's own bundle, watched by [`xcc_certs::reload`].
    pub fn observe<'a>(
        &self,
        remotes: impl IntoIterator<Item = &'a RemoteRegistry>,
        now: time::OffsetDateTime,
    ) -> Observation {
        let mut out = Observation::default();
        let mut series = vec![];
        let mut reported = xcc_controller::plumbing::lock(&self.reported);
        let mut still = BTreeMap::new();
        for rr in remotes {
            let Some(name) = rr.metadata.name.clone() else {
                continue;
            };
            let Ok(Some(pem)) = rr.spec.tls_config.server_ca_pem() else {
                continue;
            };
            let cas = pem_ca_validity(&pem);
            for ca in &cas {
                series.push((name.clone(), ca.clone()));
                if let Some(at) = next_expiry_change(ca.not_before, ca.not_after, now) {
                    out.next_change = Some(out.next_change.map_or(at, |n| n.min(at)));
                }
            }
            let Some(first) = cas.into_iter().min_by_key(|c| c.not_after) else {
                continue;
            };
            let state = expiry_at(first.not_before, first.not_after, now);
            if state == Expiry::Valid {
                continue;
            }
            let this = (first.serial.clone(), state);
            let new = reported.get(&name) != Some(&this);
            still.insert(name.clone(), this);
            let expiring = Expiring {
                ca: first,
                state,
                new,
            };
            if new {
                let message = expiring.message(&name);
                let hours_left = (expiring.ca.not_after - now).whole_hours();
                if state == Expiry::Expired {
                    error!(remote = %name, "{message}");
                } else {
                    warn!(remote = %name, hours_left, "{message}");
                }
            }
            out.expiring.insert(name, expiring);
        }
        *reported = still;
        self.gauge.clear();
        for (remote, ca) in series {
            self.gauge
                .get_or_create(&vec![
                    ("remote".to_string(), remote),
                    ("subject".to_string(), ca.subject),
                    ("serial".to_string(), ca.serial),
                ])
                .set(ca.not_after.unix_timestamp());
        }
        out
    }
}

/// How long from `now` until `at` (a little after it, so the next observation sees the new
/// state; at most a day, after which it is computed again).
pub fn until(
    at: Option<time::OffsetDateTime>,
    now: time::OffsetDateTime,
) -> Option<std::time::Duration> {
    let wait = (at? - now).clamp(time::Duration::ZERO, time::Duration::DAY);
    Some(
        std::time::Duration::try_from(wait).unwrap_or_default()
            + std::time::Duration::from_millis(10),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use xcc_certs::pki::Ca;

    fn rr(name: &str, server_ca_pem: &str) -> RemoteRegistry {
        use base64::Engine;
        serde_json::from_value(serde_json::json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
            "kind": "RemoteRegistry",
            "metadata": {"name": name, "namespace": "xcc"},
            "spec": {
                "address": "east.example:443",
                "tlsConfig": {
                    "serverCA": base64::engine::general_purpose::STANDARD.encode(server_ca_pem),
                    "serverName": "east.example",
                },
            },
        }))
        .expect("a RemoteRegistry")
    }

    /// Each CA of each serverCA is a series; the earliest CA of a remote is reported once per
    /// state as it nears its end and once past it; a remote whose CA is replaced is reported
    /// again for the new one only when that one nears its end.
    #[test]
    fn each_server_ca_is_a_series_and_is_reported_once_per_state() {
        xcc_certs::install_crypto_provider();
        let a = Ca::generate("xcc.test").expect("CA");
        let b = Ca::generate("xcc.test").expect("CA");
        let validity = |ca: &Ca| pem_ca_validity(ca.cert_pem().as_bytes()).remove(0);
        let (va, vb) = (validity(&a), validity(&b));
        let both = format!("{}{}", a.cert_pem(), b.cert_pem());
        let remotes = [rr("east", &both), rr("north", b.cert_pem()), rr("own", "")];
        let watched = RemoteCaExpiry::default();
        let mut registry = Registry::default();
        watched.register(&mut registry);
        let now = va.not_before + time::Duration::days(1);

        let seen = watched.observe(&remotes, now);
        assert!(seen.expiring.is_empty(), "{seen:?}");
        let first = va.not_after.min(vb.not_after);
        assert_eq!(
            seen.next_change,
            Some(first - time::Duration::days(30)),
            "the first CA's warning period"
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("xcc_remote_ca_certificate_expiry_timestamp_seconds{"))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines.contains(&format!(
                "xcc_remote_ca_certificate_expiry_timestamp_seconds{{remote=\"east\",subject=\"{}\",serial=\"{}\"}} {}",
                va.subject, va.serial, va.not_after.unix_timestamp()
            ).as_str()),
            "{text}"
        );

        // Six days before B's end: east (whose earliest CA may be A or B) and north are reported.
        let late = vb.not_after.max(va.not_after) - time::Duration::days(6);
        let seen = watched.observe(&remotes, late);
        assert_eq!(seen.expiring.keys().collect::<Vec<_>>(), ["east", "north"]);
        assert!(
            seen.expiring
                .values()
                .all(|e| e.new && e.state == Expiry::Soon)
        );
        let seen = watched.observe(&remotes, late);
        assert!(seen.expiring.values().all(|e| !e.new), "said once");
        let past = vb.not_after.max(va.not_after);
        let seen = watched.observe(&remotes, past);
        assert!(
            seen.expiring
                .values()
                .all(|e| e.new && e.state == Expiry::Expired),
            "{seen:?}"
        );
        assert_eq!(seen.next_change, None);
        assert!(
            seen.expiring["north"]
                .message("north")
                .contains("expired at")
        );
    }
}
