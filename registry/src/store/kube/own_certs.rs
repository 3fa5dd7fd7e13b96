//! Warning Events about the registry's own certificates, on its own Pod: the registry has no
//! custom object of its own, and the Pod is where `kubectl describe` and an events dashboard
//! look for a component's trouble. The leaf (`tls.crt`) and the first CA of the bundle to
//! expire are each reported once per state (expiring soon, expired) and certificate, when the
//! material is loaded or reloaded and at the moment a state is reached. The Pod is named by the
//! downward API (`POD_NAME`, `POD_UID`, `NAMESPACE` as `deploy/base/registry.yaml` sets them);
//! without `POD_NAME` nothing is written (the log and the metrics still say it).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use xcc_certs::reload::{
    Expiry, ReloadingTls, TlsMaterial, ca_validity, expiry_at, next_expiry_change,
};

/// Reason of the Event for a certificate within its warning period.
pub const EXPIRING_REASON: &str = "CertificateExpiring";
/// Reason of the Event for a certificate past its end.
pub const EXPIRED_REASON: &str = "CertificateExpired";

/// The Pod this process runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: Option<String>,
}

impl PodRef {
    /// From the downward API: `POD_NAME`, `NAMESPACE` (or `POD_NAMESPACE`), `POD_UID`; `None`
    /// without a name or namespace (not in a Pod, or a manifest without them).
    pub fn from_env() -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Some(Self {
            name: var("POD_NAME")?,
            namespace: var("NAMESPACE").or_else(|| var("POD_NAMESPACE"))?,
            uid: var("POD_UID"),
        })
    }

    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: self.uid.clone(),
            ..ObjectReference::default()
        }
    }
}

/// One certificate of the material that is not [`Expiry::Valid`] at a moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// `tls.crt`, or `ca.crt` with the CA's subject.
    pub certificate: String,
    pub state: Expiry,
    pub not_after: OffsetDateTime,
}

impl Finding {
    pub fn reason(&self) -> &'static str {
        match self.state {
            Expiry::Expired => EXPIRED_REASON,
            _ => EXPIRING_REASON,
        }
    }

    pub fn note(&self) -> String {
        match self.state {
            Expiry::Expired => format!(
                "{} expired at {}: peers refuse what it signs or identifies; renew it (docs/operations.md)",
                self.certificate, self.not_after
            ),
            _ => format!(
                "{} expires at {}: renew it before then (docs/operations.md; a CA: Rotating the CA)",
                self.certificate, self.not_after
            ),
        }
    }

    /// What makes this finding new: the certificate, its end and its state.
    fn key(&self) -> (String, i64, bool) {
        (
            self.certificate.clone(),
            self.not_after.unix_timestamp(),
            self.state == Expiry::Expired,
        )
    }
}

/// The leaf and the first CA of the bundle to expire, where they are not valid at `now`.
pub fn findings(material: &TlsMaterial, now: OffsetDateTime) -> Vec<Finding> {
    let mut out = Vec::new();
    let leaf = expiry_at(material.not_before, material.not_after, now);
    if leaf != Expiry::Valid {
        out.push(Finding {
            certificate: format!("the serving certificate tls.crt ({})", material.identity),
            state: leaf,
            not_after: material.not_after,
        });
    }
    if let Some(ca) = ca_validity(&material.ca_certs)
        .into_iter()
        .min_by_key(|c| c.not_after)
    {
        let state = expiry_at(ca.not_before, ca.not_after, now);
        if state != Expiry::Valid {
            out.push(Finding {
                certificate: format!("the CA {} of ca.crt", ca.subject),
                state,
                not_after: ca.not_after,
            });
        }
    }
    out
}

/// How long from `now` until a certificate of `material` changes state (a little after, so the
/// next look sees it), at most a day.
fn next_look(material: &TlsMaterial, now: OffsetDateTime) -> Duration {
    let next = ca_validity(&material.ca_certs)
        .into_iter()
        .map(|c| (c.not_before, c.not_after))
        .chain([(material.not_before, material.not_after)])
        .filter_map(|(from, to)| next_expiry_change(from, to, now))
        .min();
    let wait = next.map_or(time::Duration::DAY, |at| {
        (at - now).clamp(time::Duration::ZERO, time::Duration::DAY)
    });
    Duration::try_from(wait).unwrap_or_default() + Duration::from_millis(10)
}

/// Writes an Event on `pod` for every new [`Finding`] until `cancel` fires.
pub async fn run(client: Client, tls: ReloadingTls, pod: PodRef, cancel: CancellationToken) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "xcc-registry".into(),
            instance: Some(pod.name.clone()),
        },
    );
    let reference = pod.reference();
    let mut changes = tls.subscribe();
    let mut reported = BTreeSet::new();
    loop {
        let material = tls.current();
        let now = OffsetDateTime::now_utc();
        for finding in findings(&material, now) {
            if !reported.insert(finding.key()) {
                continue;
            }
            let event = Event {
                type_: EventType::Warning,
                reason: finding.reason().into(),
                note: Some(xcc_controller::event_note(finding.note())),
                action: "CheckCertificates".into(),
                secondary: None,
            };
            match recorder.publish(&event, &reference).await {
                Ok(()) => {
                    debug!(pod = %pod.name, reason = finding.reason(), "certificate Event written")
                }
                Err(e) => {
                    warn!(pod = %pod.name, error = %e, "cannot write an Event about this registry's certificates")
                }
            }
        }
        let wait = next_look(&material, now);
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xcc_certs::pki::{self, IssueRequest};
    use xcc_certs::reload::TlsFiles;

    fn material(
        days_left: i64,
        lifetime_days: i64,
    ) -> (tempfile::TempDir, std::sync::Arc<TlsMaterial>) {
        xcc_certs::install_crypto_provider();
        let dir = tempfile::tempdir().expect("dir");
        let ca = pki::init_ca_dir("xcc.test", &dir.path().join("ca")).expect("ca");
        let now = OffsetDateTime::now_utc();
        let mut req = IssueRequest::cluster("east");
        req.not_after = Some(now + time::Duration::days(days_left));
        req.not_before = Some(now + time::Duration::days(days_left - lifetime_days));
        let cert = ca.issue(&req).expect("issue");
        let files: TlsFiles =
            pki::write_issued(&dir.path().join("east"), &ca, &cert).expect("write");
        let tls = ReloadingTls::load(files).expect("load");
        (dir, tls.current())
    }

    #[test]
    fn a_leaf_with_three_days_left_is_expiring_and_past_its_end_expired() {
        let (_d, m) = material(3, 90);
        let now = OffsetDateTime::now_utc();
        let found = findings(&m, now);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].state, Expiry::Soon);
        assert_eq!(found[0].reason(), "CertificateExpiring");
        assert_eq!(
            found[0].certificate,
            "the serving certificate tls.crt (cluster/east)"
        );
        let later = findings(&m, now + time::Duration::days(4));
        assert_eq!(later[0].state, Expiry::Expired);
        assert_eq!(later[0].reason(), "CertificateExpired");
        assert_ne!(later[0].key(), found[0].key(), "a new state is a new Event");
        // Looked at again at least daily, and at the moment the leaf expires.
        assert_eq!(next_look(&m, now), Duration::from_millis(86_400_010));
        let wait = next_look(&m, now + time::Duration::hours(60));
        let twelve_hours = Duration::from_secs(12 * 3_600);
        assert!(
            wait <= twelve_hours + Duration::from_millis(10)
                && wait >= twelve_hours - Duration::from_secs(60),
            "{wait:?}"
        );
    }

    #[test]
    fn a_leaf_far_from_its_end_says_nothing() {
        let (_d, m) = material(80, 90);
        assert_eq!(findings(&m, OffsetDateTime::now_utc()), vec![]);
    }
}
