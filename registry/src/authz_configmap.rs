//! Cedar policies from a ConfigMap (`--store kube`): the Kubernetes counterpart of the watched
//! policy directory of file mode.
//!
//! One ConfigMap, watched by name (a field selector on `metadata.name`). Every `data` key ending
//! in `.cedar` is a policy source named by its key; the default policies always apply on top.
//! A change is parsed and validated against the xcc schema ([`Policies::from_sources`]); on
//! success the shared handle is swapped and the reported error cleared; on failure the previous
//! set stays in force, the error (naming the ConfigMap and key) is reported through
//! [`FileErrors`], the store-errors metric is incremented, a warning is logged and a Warning
//! Event is recorded on the ConfigMap. A missing or deleted ConfigMap means the default
//! policies alone. An Event that cannot be written never stops the watch.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource as _};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use xcc_controller::watch::{Change, Follow};

use crate::authz::Gate;
use crate::authz::{Policies, PolicyError};
use crate::files::FileErrors;
use crate::metrics::Metrics;

/// Component name on Events.
const REPORTER: &str = "xcc-registry";
/// Longest Event note the API accepts (events.k8s.io/v1: 1 KiB).
const MAX_NOTE: usize = 1024;

/// The policy sources of a ConfigMap: its `data` keys ending in `.cedar`, sorted by key.
pub fn sources_of(cm: &ConfigMap) -> Vec<(String, String)> {
    // `data` is a BTreeMap: already sorted by key.
    cm.data
        .iter()
        .flatten()
        .filter(|(k, _)| k.ends_with(".cedar"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Why the policies of ConfigMap `what` (`namespace/name`) were refused; the message names the
/// ConfigMap and the offending key(s).
#[derive(Debug, thiserror::Error)]
pub enum ConfigMapPolicyError {
    /// A parse or duplicate error; its message starts with the key.
    #[error("ConfigMap {what}: key {source}")]
    Key { what: String, source: PolicyError },
    /// Policies that fail schema validation, with the keys that fail on their own.
    #[error("ConfigMap {what}: key {}: {source}", .keys.join(", "))]
    Keys {
        what: String,
        keys: Vec<String>,
        source: PolicyError,
    },
    /// A failure no single key causes.
    #[error("ConfigMap {what}: {source}")]
    Whole { what: String, source: PolicyError },
}

/// Parse and validate `sources` from ConfigMap `what` (`namespace/name`).
pub fn load(what: &str, sources: &[(String, String)]) -> Result<Policies, ConfigMapPolicyError> {
    let what = what.to_string();
    Policies::from_sources(sources).map_err(|source| match source {
        PolicyError::Parse { .. } | PolicyError::Duplicate { .. } => {
            ConfigMapPolicyError::Key { what, source }
        }
        // Schema validation reports policy ids; find which keys fail on their own.
        source => {
            let keys: Vec<String> = sources
                .iter()
                .filter(|s| Policies::from_sources(std::slice::from_ref(*s)).is_err())
                .map(|(k, _)| k.clone())
                .collect();
            if keys.is_empty() {
                ConfigMapPolicyError::Whole { what, source }
            } else {
                ConfigMapPolicyError::Keys { what, keys, source }
            }
        }
    })
}

/// The running watch: its task and whether the ConfigMap was read once (for readiness).
pub struct PolicyWatch {
    pub task: JoinHandle<()>,
    /// Becomes `true` once the ConfigMap (or its absence) was listed and applied.
    pub synced: watch::Receiver<bool>,
}

/// Watch ConfigMap `namespace/name` and keep `handle` at its policies until `cancel` fires.
pub fn spawn_policy_configmap(
    client: Client,
    namespace: &str,
    name: &str,
    handle: crate::authz::PolicyHandle,
    errors: FileErrors,
    metrics: Metrics,
    cancel: CancellationToken,
) -> PolicyWatch {
    // Nobody holds decisions of this gate: it only writes into `handle`.
    let gate = Gate::new("", handle);
    spawn_policy_configmap_into(client, namespace, name, gate, errors, metrics, cancel)
}

/// Watch ConfigMap `namespace/name` and keep `gate` at its policies until `cancel` fires; every
/// swap tells the gate's subscribers (open streams, grants, carried clusters).
pub fn spawn_policy_configmap_into(
    client: Client,
    namespace: &str,
    name: &str,
    handle: Gate,
    errors: FileErrors,
    metrics: Metrics,
    cancel: CancellationToken,
) -> PolicyWatch {
    let (synced_tx, synced) = watch::channel(false);
    let source = Source {
        what: format!("{namespace}/{name}"),
        handle,
        errors,
        metrics,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: REPORTER.to_string(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        applied: None,
    };
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let task = tokio::spawn(source.run(api, config, synced_tx, cancel));
    PolicyWatch { task, synced }
}

struct Source {
    what: String,
    handle: Gate,
    errors: FileErrors,
    metrics: Metrics,
    recorder: Recorder,
    /// Sources of the set in force (`Some(vec![])`: defaults because the ConfigMap is absent or
    /// holds no policies); `None` before the first load.
    applied: Option<Vec<(String, String)>>,
}

impl Source {
    async fn run(
        mut self,
        api: Api<ConfigMap>,
        config: watcher::Config,
        synced: watch::Sender<bool>,
        cancel: CancellationToken,
    ) {
        let mut policy_map = Follow::new(format!("policy ConfigMap {}", self.what), api, config);
        loop {
            let change = tokio::select! {
                () = cancel.cancelled() => break,
                change = policy_map.next() => match change {
                    Some(change) => change,
                    None => break,
                },
            };
            match change {
                // The watch selects the one ConfigMap by name: a list holds it or nothing.
                Change::Listed(all) => {
                    match all.last() {
                        Some(cm) => self.apply(cm).await,
                        None => self.absent(),
                    }
                    synced.send_replace(true);
                }
                Change::Applied(cm) => self.apply(&cm).await,
                Change::Deleted(_) => self.absent(),
            }
        }
    }

    fn swap(&mut self, policies: Policies, sources: Vec<(String, String)>) {
        self.handle.set_policies(policies);
        self.applied = Some(sources);
        self.errors.set(vec![]);
    }

    async fn apply(&mut self, cm: &ConfigMap) {
        let sources = sources_of(cm);
        if self.applied.as_ref() == Some(&sources) {
            // Unchanged policies (another key changed, or a resync): a previous error is moot.
            self.errors.set(vec![]);
            return;
        }
        match load(&self.what, &sources) {
            Ok(policies) => {
                let ids = policies.policy_ids();
                info!(configmap = %self.what, keys = ?sources.iter().map(|(k, _)| k).collect::<Vec<_>>(), policies = ?ids, "Cedar policies loaded from the ConfigMap");
                self.swap(policies, sources);
            }
            Err(e) => {
                let message = e.to_string();
                if self.errors.get() == [message.clone()] {
                    return;
                }
                self.metrics.store_errors.inc();
                warn!(configmap = %self.what, error = %message, "rejected policy change; keeping the previous policies");
                self.errors.set(vec![message.clone()]);
                let mut note = message;
                if note.len() > MAX_NOTE {
                    let mut cut = MAX_NOTE - 3;
                    while !note.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    note.truncate(cut);
                    note.push_str("...");
                }
                let event = KubeEvent {
                    type_: EventType::Warning,
                    reason: "InvalidPolicy".to_string(),
                    note: Some(note),
                    action: "LoadPolicies".to_string(),
                    secondary: None,
                };
                if let Err(e) = self.recorder.publish(&event, &cm.object_ref(&())).await {
                    debug!(error = %e, "cannot record the policy event");
                }
            }
        }
    }

    fn absent(&mut self) {
        if self.applied.as_ref().is_some_and(Vec::is_empty) && self.errors.get().is_empty() {
            return;
        }
        info!(configmap = %self.what, "policy ConfigMap absent; the default policies apply");
        self.swap(Policies::default_set(), vec![]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cm(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_cedar_keys_are_sources() {
        let got = sources_of(&cm(&[("b.cedar", "B"), ("README", "x"), ("a.cedar", "A")]));
        assert_eq!(
            got,
            [
                ("a.cedar".to_string(), "A".to_string()),
                ("b.cedar".to_string(), "B".to_string())
            ]
        );
        assert!(sources_of(&ConfigMap::default()).is_empty());
    }

    #[test]
    fn errors_name_the_configmap_and_key() {
        let good =
            r#"@id("deny-all") forbid (principal, action == Xcc::Action::"discover", resource);"#;
        let ok = load("ns/p", &[("good.cedar".into(), good.into())]);
        assert_eq!(
            ok.map(|p| p.policy_ids()).unwrap_or_default(),
            ["announce-clusterset", "bilateral", "carry-self", "deny-all"]
        );
        let syntax = load(
            "ns/p",
            &[
                ("good.cedar".into(), good.into()),
                ("bad.cedar".into(), "permit (".into()),
            ],
        );
        let e = syntax.err().expect("refused");
        assert!(
            matches!(&e, ConfigMapPolicyError::Key { what, source: PolicyError::Parse { file, .. } }
                if what == "ns/p" && file == "bad.cedar"),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(e.starts_with("ConfigMap ns/p: key bad.cedar: "), "{e}");
        let invalid = r#"permit (principal, action == Xcc::Action::"discover", resource) when { resource.nope };"#;
        let e = load(
            "ns/p",
            &[
                ("good.cedar".into(), good.into()),
                ("typo.cedar".into(), invalid.into()),
            ],
        )
        .err()
        .expect("refused");
        assert!(
            matches!(&e, ConfigMapPolicyError::Keys { what, keys, source: PolicyError::Invalid(_) }
                if what == "ns/p" && keys == &["typo.cedar"]),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.starts_with("ConfigMap ns/p: key typo.cedar: policies do not validate"),
            "{e}"
        );
    }
}
