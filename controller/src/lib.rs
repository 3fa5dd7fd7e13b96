//! Plumbing every xcc process shares: the process [`runtime`] (signals, probes, leader Lease and
//! supervised tasks, [`tasks`]), Lease-based leader election ([`leader`]), the `/healthz`,
//! `/readyz` and `/metrics` endpoint ([`probes`]), the work queue of reconcile keys ([`queue`])
//! the Kubernetes client ([`client`]), the watch → store loop ([`watch`]), the
//! condition-transition rule ([`conditions`]) and the API-error predicates ([`plumbing`]). Nothing here knows about ServiceRecords; the registry,
//! the publisher, the binder and the DNS server build on it.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod backoff;
pub mod cluster_id;
pub mod conditions;
pub mod leader;
pub mod plumbing;
pub mod probes;
pub mod propagation;
pub mod queue;
pub mod runtime;
pub mod tasks;
pub mod watch;

/// What xcc's requests say they come from (the API server's audit log and managed fields show
/// it): `xcc/<version>`.
pub const USER_AGENT: &str = concat!("xcc/", env!("CARGO_PKG_VERSION"));

/// The API server's limit on an Event's note (`events.k8s.io/v1`: at most 1 kB); a longer
/// note is refused with 422 and the Event lost.
pub const EVENT_NOTE_MAX: usize = 1024;

/// A Kubernetes client from the environment: `KUBECONFIG` / `~/.kube/config` when present,
/// otherwise the in-cluster service account. Every request carries [`USER_AGENT`].
pub async fn client() -> anyhow::Result<kube::Client> {
    use anyhow::Context as _;
    let mut config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration (neither KUBECONFIG nor in-cluster)")?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// `note` cut to fit an Event ([`EVENT_NOTE_MAX`] bytes, on a character boundary, ending in
/// `…` when cut): what goes into a note may come from a remote (FQDNs), so its length is not
/// ours to choose.
pub fn event_note(mut note: String) -> String {
    const MORE: &str = "…";
    if note.len() > EVENT_NOTE_MAX {
        let mut end = EVENT_NOTE_MAX - MORE.len();
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str(MORE);
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_fit_the_api_limit_and_keep_whole_characters() {
        assert_eq!(event_note("short".into()), "short");
        let exact = "a".repeat(EVENT_NOTE_MAX);
        assert_eq!(event_note(exact.clone()), exact);
        let long = event_note("é".repeat(EVENT_NOTE_MAX));
        assert!(long.len() <= EVENT_NOTE_MAX, "{}", long.len());
        assert!(long.ends_with('…'));
        assert_eq!(
            long.trim_end_matches('…').chars().count(),
            (EVENT_NOTE_MAX - 3) / 2
        );
    }
}
