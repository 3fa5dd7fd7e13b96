//! The parent's refusals of this cluster's exports, told on the exported ServiceRecords
//! (`--store kube`, while this replica leads: only the leader runs the parent link).
//!
//! When the parent refuses the announcement of an exported record (a Cedar `forbid`, a zone
//! without an `announce` permit, a name another service owns, ...), the record gets the
//! condition `Announced=False` with the failed check as its reason and the parent's reason and
//! Cedar policy ids as its message, and a Warning Event. When the refusal no longer stands (the
//! parent accepted the record after a policy change, or the record changed and is decided
//! again), the condition turns `True` (reason [`ACCEPTED_REASON`]) with a Normal Event. A
//! record that was never refused gets no condition, so the common case costs no write.
//!
//! Nothing is written before the parent confirmed it applied the current session's snapshot
//! ([`Level::refusals_confirmed`]): until then the refusals held are those of an earlier
//! session (or none, after a start), and acting on them would flap conditions at each restart.
//! The condition is server-side applied to the status subresource with the registry's field
//! manager, which owns only that one entry of `status.conditions` (a list keyed by `type`);
//! fields of other owners are never part of the patch. Writes happen only when the condition
//! differs from the record's, waking on the level's changes and the records' watch: no polling.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use xcc_controller::conditions::condition;
use xcc_controller::watch::{Change, Follow};
use xcc_proto::crd::{CONDITION_ANNOUNCED, ImportStatus, ServiceRecord};
use xcc_proto::xcc::federation::v1 as fed;

use super::metrics::{Kind, KubeMetrics, WriteVerb};
use super::records;
use super::sink::FIELD_MANAGER;
use super::status::{IMPORT_PENDING, IMPORT_REFUSED};
use crate::federation::Level;
use crate::federation::level::QUERY_KIND;

/// Reason of `Announced=True` after a refusal: it no longer stands.
pub const ACCEPTED_REASON: &str = "Accepted";
/// Reason of `Announced=False` when the check's name gives none.
pub const REFUSED_REASON: &str = "Refused";
/// Event reasons of the two transitions.
pub const REFUSED_EVENT: &str = "AnnouncementRefused";
pub const ACCEPTED_EVENT: &str = "AnnouncementAccepted";

/// Longest condition message the API server accepts.
const MESSAGE_MAX: usize = 32_768;
/// Longest condition reason kept (the API allows 1,024; checks are short words).
const REASON_MAX: usize = 64;
/// First wait before writing again after a failed write; doubled up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A record by namespace and name.
pub type Key = (String, String);

/// The condition reason for a failed check: the check in CamelCase (`announce` → `Announce`,
/// `name_owner` → `NameOwner`), [`REFUSED_REASON`] if it has no letter to start with. The check
/// comes from the parent: only ASCII letters and digits are kept, so the reason always matches
/// the API's pattern.
pub fn reason_of(check: &str) -> String {
    let mut out = String::new();
    let mut upper = true;
    for c in check.chars() {
        if out.len() >= REASON_MAX {
            break;
        }
        if c.is_ascii_alphanumeric() {
            out.push(if upper { c.to_ascii_uppercase() } else { c });
            upper = false;
        } else {
            upper = true;
        }
    }
    match out.starts_with(|c: char| c.is_ascii_alphabetic()) {
        true => out,
        false => REFUSED_REASON.to_string(),
    }
}

/// The condition message for a refusal: who refused, why, the check and the Cedar policies.
pub fn message_of(r: &fed::Rejection) -> String {
    let mut m = format!(
        "refused by {}: {} (check {}",
        r.refused_by, r.reason, r.check
    );
    if !r.policy_ids.is_empty() {
        m.push_str("; Cedar policies: ");
        m.push_str(&r.policy_ids.join(", "));
    }
    m.push(')');
    if m.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX - '…'.len_utf8();
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
        m.push('…');
    }
    m
}

/// The `Announced` condition to write given the record's current one, the refusal that stands
/// (if any) and the record's generation; `None` when nothing needs writing.
/// `lastTransitionTime` moves only when the status does ([`condition`]).
pub fn next(
    current: Option<&Condition>,
    refusal: Option<&fed::Rejection>,
    generation: Option<i64>,
    now: Time,
) -> Option<Condition> {
    let (status, reason, message) = match (refusal, current) {
        (Some(r), _) => ("False", reason_of(&r.check), message_of(r)),
        (None, Some(_)) => (
            "True",
            ACCEPTED_REASON.to_string(),
            "the parent's refusal no longer stands".to_string(),
        ),
        (None, None) => return None,
    };
    if let Some(c) = current
        && c.status == status
        && c.reason == reason
        && c.message == message
    {
        return None;
    }
    Some(condition(
        current.map(std::slice::from_ref).unwrap_or_default(),
        CONDITION_ANNOUNCED,
        status,
        reason,
        message,
        generation,
        &now,
    ))
}

/// The parent's refusals of `cluster`'s own announcements, by record.
pub fn own_refusals<'a>(
    cluster: &str,
    rejections: impl IntoIterator<Item = &'a fed::Rejection>,
) -> BTreeMap<Key, fed::Rejection> {
    rejections
        .into_iter()
        .filter(|r| r.kind == "announcement" && r.cluster == cluster)
        .map(|r| ((r.namespace.clone(), r.name.clone()), r.clone()))
        .collect()
}

/// `import` as the Parent RemoteRegistry reports it: one still without an answer whose
/// question the parent refused is `Refused`, the failed check as its reason and why (with the
/// Cedar policy ids) as its message. The refusal stands until the question is answered.
pub fn import_status(
    cluster: &str,
    rejections: &[fed::Rejection],
    mut import: ImportStatus,
) -> ImportStatus {
    if import.state != IMPORT_PENDING {
        return import;
    }
    let refused = rejections.iter().find(|r| {
        r.kind == QUERY_KIND
            && r.cluster == cluster
            && match (&import.fqdn, &import.namespace, &import.name) {
                (Some(f), ..) => r.namespace.is_empty() && r.name.is_empty() && r.fqdn == *f,
                (None, Some(ns), Some(n)) => r.namespace == *ns && r.name == *n,
                _ => false,
            }
    });
    if let Some(r) = refused {
        import.state = IMPORT_REFUSED.to_string();
        import.reason = Some(reason_of(&r.check));
        import.message = Some(message_of(r));
    }
    import
}

/// What is kept of one exported record.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub resource_version: Option<String>,
    /// Its `Announced` condition, if it has one.
    pub announced: Option<Condition>,
}

impl Record {
    pub fn of(sr: &ServiceRecord) -> Self {
        Self {
            uid: sr.metadata.uid.clone(),
            generation: sr.metadata.generation,
            resource_version: sr.metadata.resource_version.clone(),
            announced: sr
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_ANNOUNCED))
                .cloned(),
        }
    }

    fn rv(&self) -> Option<u64> {
        self.resource_version.as_deref()?.parse().ok()
    }
}

/// The exported records, and which of them carry an `Announced` condition (so a pass looks at
/// the refused and the marked records only, not at every export).
#[derive(Debug, Default)]
pub struct Records {
    all: BTreeMap<Key, Record>,
    marked: BTreeSet<Key>,
}

impl Records {
    /// Keep `r` unless a newer version of the record is kept (a late watch event must not undo
    /// what a write returned).
    pub fn store(&mut self, key: Key, r: Record) {
        if let Some(cur) = self.all.get(&key)
            && matches!((cur.rv(), r.rv()), (Some(a), Some(b)) if b < a)
        {
            return;
        }
        match r.announced.is_some() {
            true => self.marked.insert(key.clone()),
            false => self.marked.remove(&key),
        };
        self.all.insert(key, r);
    }

    pub fn remove(&mut self, key: &Key) {
        self.all.remove(key);
        self.marked.remove(key);
    }

    pub fn replace(&mut self, all: BTreeMap<Key, Record>) {
        *self = Self::default();
        for (k, r) in all {
            self.store(k, r);
        }
    }

    /// The conditions to write for `refusals` (see [`next`]).
    pub fn plan(
        &self,
        refusals: &BTreeMap<Key, fed::Rejection>,
        now: &Time,
    ) -> Vec<(Key, Condition)> {
        let keys: BTreeSet<&Key> = refusals.keys().chain(self.marked.iter()).collect();
        keys.into_iter()
            .filter_map(|k| {
                let r = self.all.get(k)?;
                let c = next(
                    r.announced.as_ref(),
                    refusals.get(k),
                    r.generation,
                    now.clone(),
                )?;
                Some((k.clone(), c))
            })
            .collect()
    }
}

fn key_of(sr: &ServiceRecord) -> Option<Key> {
    Some((sr.metadata.namespace.clone()?, sr.metadata.name.clone()?))
}

/// Keep the `Announced` condition of this cluster's exported records until `cancel`.
pub async fn run(
    client: Client,
    level: Level,
    metrics: KubeMetrics,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let api: Api<ServiceRecord> = Api::all(client.clone());
    let config = watcher::Config::default().labels(&records::export_selector());
    let mut exports = Follow::new("exported ServiceRecords", api, config);
    let recorder = Recorder::new(client.clone(), FIELD_MANAGER.into());
    let mut changes = level.subscribe();
    let mut records = Records::default();
    let mut listed = false;
    // The refusals the records were last brought in line with (`None`: do a pass).
    let mut done: Option<BTreeMap<Key, fed::Rejection>> = None;
    let mut retry: Option<(tokio::time::Instant, Duration)> = None;
    loop {
        let retry_at = retry.map(|(at, _)| at);
        let retry_due = async move {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            change = exports.next() => {
                let Some(change) = change else { anyhow::bail!("the exported ServiceRecord watch ended") };
                match change {
                    Change::Listed(all) => {
                        records.replace(
                            all.iter()
                                .filter_map(|sr| Some((key_of(sr)?, Record::of(sr))))
                                .collect(),
                        );
                        listed = true;
                        done = None;
                    }
                    Change::Applied(sr) => {
                        if let Some(k) = key_of(&sr) {
                            records.store(k, Record::of(&sr));
                            done = None;
                        }
                    }
                    Change::Deleted(sr) => {
                        if let Some(k) = key_of(&sr) {
                            records.remove(&k);
                        }
                    }
                }
            }
            r = changes.changed() => if r.is_err() { return Ok(()) },
            _ = retry_due => done = None,
        }
        if !listed || !level.refusals_confirmed() {
            continue;
        }
        let refusals = own_refusals(level.cluster(), level.rejections().iter().map(|(_, r)| r));
        if done.as_ref() == Some(&refusals) {
            continue;
        }
        let now = super::status::seconds(std::time::SystemTime::now());
        let mut failed = false;
        for (key, condition) in records.plan(&refusals, &now) {
            match write(&client, &key, &condition).await {
                Ok(written) => {
                    metrics.wrote(Kind::ServiceRecordStatus, WriteVerb::Apply);
                    records.store(key.clone(), Record::of(&written));
                    announce(&recorder, &written, &condition).await;
                }
                Err(e) => {
                    warn!(record = %format!("{}/{}", key.0, key.1), error = %format!("{e:#}"), "cannot write the Announced condition; retrying");
                    failed = true;
                }
            }
        }
        if failed {
            let wait = retry.map_or(RETRY_MIN, |(_, w)| (w * 2).min(RETRY_MAX));
            retry = Some((tokio::time::Instant::now() + wait, wait));
            done = None;
        } else {
            retry = None;
            done = Some(refusals);
        }
    }
}

/// Server-side apply `condition` (and nothing else) to the record's status.
async fn write(client: &Client, key: &Key, condition: &Condition) -> anyhow::Result<ServiceRecord> {
    let (ns, name) = key;
    let api: Api<ServiceRecord> = Api::namespaced(client.clone(), ns);
    let body = serde_json::json!({
        "apiVersion": xcc_proto::names::API_VERSION,
        "kind": xcc_proto::names::SERVICE_RECORD_KIND,
        "metadata": {"name": name, "namespace": ns},
        "status": {"conditions": [condition]},
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .with_context(|| format!("writing the status of ServiceRecord {ns}/{name}"))
}

/// Log the transition and record it as an Event on the record (failing to fails nothing).
async fn announce(recorder: &Recorder, sr: &ServiceRecord, condition: &Condition) {
    let record = format!(
        "{}/{}",
        sr.metadata.namespace.as_deref().unwrap_or_default(),
        sr.metadata.name.as_deref().unwrap_or_default()
    );
    let refused = condition.status == "False";
    if refused {
        warn!(%record, reason = %condition.reason, message = %condition.message, "the parent refused the announcement of an exported record");
    } else {
        info!(%record, "the parent's refusal of an exported record no longer stands");
    }
    let reference = ObjectReference {
        api_version: Some(xcc_proto::names::API_VERSION.to_string()),
        kind: Some(xcc_proto::names::SERVICE_RECORD_KIND.to_string()),
        name: sr.metadata.name.clone(),
        namespace: sr.metadata.namespace.clone(),
        uid: sr.metadata.uid.clone(),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: if refused {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: if refused {
            REFUSED_EVENT
        } else {
            ACCEPTED_EVENT
        }
        .to_string(),
        note: Some(xcc_controller::event_note(condition.message.clone())),
        action: "Announce".to_string(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        warn!(%record, error = %e, "cannot write an Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("time"))
    }

    fn forbid(name: &str) -> fed::Rejection {
        fed::Rejection {
            kind: "announcement".into(),
            cluster: "west".into(),
            namespace: "shop".into(),
            name: name.into(),
            fqdn: format!("{name}.shop.svc.clusterset.local"),
            code: tonic::Code::PermissionDenied as i32,
            reason: format!("west may not announce {name}: forbidden by no-shop"),
            refused_by: "root".into(),
            check: "announce".into(),
            policy_ids: vec!["no-shop".into()],
        }
    }

    fn record(generation: i64, rv: u64, announced: Option<Condition>) -> Record {
        Record {
            uid: Some("u".into()),
            generation: Some(generation),
            resource_version: Some(rv.to_string()),
            announced,
        }
    }

    fn key(name: &str) -> Key {
        ("shop".into(), name.into())
    }

    #[test]
    fn reasons_are_the_check_in_camel_case_and_always_valid() {
        assert_eq!(reason_of("announce"), "Announce");
        assert_eq!(reason_of("name_owner"), "NameOwner");
        // The publisher reads these two as "another service owns the name" (MCS Conflict).
        assert_eq!(reason_of("owner"), xcc_proto::crd::ANNOUNCED_REASON_OWNER);
        assert_eq!(
            reason_of("collision"),
            xcc_proto::crd::ANNOUNCED_REASON_COLLISION
        );
        assert_eq!(reason_of("size"), "Size");
        for hostile in ["", "9lives", "--", "ü-9x"] {
            assert_eq!(reason_of(hostile), "Refused", "{hostile:?}");
        }
        assert_eq!(
            reason_of("ünïx"),
            "NX",
            "only ASCII letters and digits are kept"
        );
        assert_eq!(reason_of(&"a".repeat(5000)).len(), REASON_MAX);
    }

    #[test]
    fn the_message_names_the_refuser_the_check_and_the_policies() {
        assert_eq!(
            message_of(&forbid("api")),
            "refused by root: west may not announce api: forbidden by no-shop (check announce; Cedar policies: no-shop)"
        );
        let plain = fed::Rejection {
            policy_ids: vec![],
            check: "collision".into(),
            reason: "taken".into(),
            ..forbid("api")
        };
        assert_eq!(
            message_of(&plain),
            "refused by root: taken (check collision)"
        );
        let huge = fed::Rejection {
            reason: "é".repeat(40_000),
            ..forbid("api")
        };
        let m = message_of(&huge);
        assert!(m.len() <= MESSAGE_MAX && m.ends_with('…'), "{}", m.len());
    }

    #[test]
    fn refused_then_accepted_flips_the_condition_and_writes_only_on_change() {
        let refusal = forbid("api");
        let c = next(None, Some(&refusal), Some(2), at(100)).expect("refused: written");
        assert_eq!(
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_str(),
                c.observed_generation,
                &c.last_transition_time
            ),
            ("Announced", "False", "Announce", Some(2), &at(100))
        );
        assert!(c.message.contains("no-shop"), "{}", c.message);
        // The same refusal again, later, or for a newer generation: nothing to write.
        assert_eq!(next(Some(&c), Some(&refusal), Some(2), at(200)), None);
        assert_eq!(next(Some(&c), Some(&refusal), Some(3), at(200)), None);
        // Another check refuses it now: rewritten, the transition time kept.
        let other = fed::Rejection {
            check: "collision".into(),
            policy_ids: vec![],
            ..refusal.clone()
        };
        let c2 = next(Some(&c), Some(&other), Some(2), at(300)).expect("changed");
        assert_eq!(
            (c2.reason.as_str(), &c2.last_transition_time),
            ("Collision", &at(100))
        );
        // The refusal no longer stands: True, and then nothing more.
        let ok = next(Some(&c2), None, Some(2), at(400)).expect("flipped back");
        assert_eq!(
            (
                ok.status.as_str(),
                ok.reason.as_str(),
                &ok.last_transition_time
            ),
            ("True", "Accepted", &at(400))
        );
        assert_eq!(next(Some(&ok), None, Some(2), at(500)), None);
        // A record never refused gets no condition.
        assert_eq!(next(None, None, Some(1), at(100)), None);
    }

    #[test]
    fn only_own_announcements_count() {
        let mut child = forbid("cart");
        child.cluster = "west-1".into();
        let mut query = forbid("web");
        query.kind = "query".into();
        let own = own_refusals("west", [&forbid("api"), &child, &query]);
        assert_eq!(own.keys().collect::<Vec<_>>(), [&key("api")]);
    }

    #[test]
    fn an_unanswered_import_whose_question_was_refused_is_refused() {
        let pending = |fqdn: Option<&str>, name: Option<&str>| ImportStatus {
            fqdn: fqdn.map(Into::into),
            namespace: name.map(|_| "shop".into()),
            name: name.map(Into::into),
            state: IMPORT_PENDING.into(),
            ..Default::default()
        };
        let too_big = |name: &str, fqdn: &str| fed::Rejection {
            kind: "query".into(),
            name: name.into(),
            namespace: if name.is_empty() { "" } else { "shop" }.into(),
            fqdn: fqdn.into(),
            check: "size".into(),
            policy_ids: vec![],
            reason: "entry of 70000 bytes exceeds the 65536-byte limit".into(),
            ..forbid("api")
        };
        let refused = [too_big("api", ""), too_big("", "x.example")];
        let by_name = import_status("west", &refused, pending(None, Some("api")));
        assert_eq!(
            (
                by_name.state.as_str(),
                by_name.reason.as_deref(),
                by_name.message.as_deref()
            ),
            (
                "Refused",
                Some("Size"),
                Some(
                    "refused by root: entry of 70000 bytes exceeds the 65536-byte limit (check size)"
                )
            )
        );
        let by_fqdn = import_status("west", &refused, pending(Some("x.example"), None));
        assert_eq!(by_fqdn.state, "Refused");
        // Another question, another cluster's question, or an answered one: as they were.
        for (cluster, import) in [
            ("west", pending(None, Some("web"))),
            ("west", pending(Some("y.example"), None)),
            ("east", pending(None, Some("api"))),
        ] {
            assert_eq!(import_status(cluster, &refused, import.clone()), import);
        }
        let answered = ImportStatus {
            state: "NotFound".into(),
            ..pending(None, Some("api"))
        };
        assert_eq!(import_status("west", &refused, answered.clone()), answered);
    }

    #[test]
    fn a_pass_touches_refused_and_marked_records_only() {
        let mut records = Records::default();
        let refused_before = next(None, Some(&forbid("old")), Some(1), at(10)).expect("c");
        records.replace(BTreeMap::from([
            (key("api"), record(1, 5, None)),
            (key("calm"), record(1, 6, None)),
            (key("old"), record(1, 7, Some(refused_before.clone()))),
        ]));
        let refusals = own_refusals("west", [&forbid("api"), &forbid("gone")]);
        let plan = records.plan(&refusals, &at(50));
        let summary: Vec<(&str, &str)> = plan
            .iter()
            .map(|(k, c)| (k.1.as_str(), c.status.as_str()))
            .collect();
        // api is refused now; old was refused and no longer is; gone has no record; calm has
        // nothing to say.
        assert_eq!(summary, [("api", "False"), ("old", "True")]);
        // What the writes return is kept; a late watch event from before them is ignored.
        for (k, c) in plan {
            records.store(k, record(1, 20, Some(c)));
        }
        records.store(key("old"), record(1, 7, Some(refused_before)));
        assert_eq!(records.plan(&refusals, &at(60)), vec![]);
        records.remove(&key("api"));
        assert_eq!(records.plan(&refusals, &at(60)), vec![]);
    }
}
