//! The Multi-Cluster Services side of the publisher (KEP-1645), pure: a `ServiceExport` named
//! like a Service in the same namespace exports that Service as the XCC export label does
//! ([`exported`]: label or export, one record either way) — except its endpoints, which are the
//! ready pods when a ServiceExport alone exports it ([`crate::desired::ExportedBy`]) — and the
//! export's status carries the MCS conditions ([`conditions`]):
//! - `Valid`: `Valid`, or `NoService` / `InvalidServiceType` (ExternalName; headless
//!   Services outside MCS mode) / `NoPorts` / `InvalidFqdn`;
//! - `Ready`: `Exported` once the ServiceRecord is written, `Pending` while the export is not
//!   valid, `Failed` when a ServiceRecord of that name belongs to someone else, and
//!   `Refused<check>` (xcc's own, [`REASON_REFUSED_PREFIX`]) while the hierarchy refuses to
//!   announce the record — its `Announced` condition is `False` ([`refusal`]), the message
//!   says why;
//! - `Conflict`: `OwnerConflict` (xcc's own, [`REASON_OWNER_CONFLICT`]) while that refusal is
//!   because another service owns the name (checks `owner` and `collision`), the message naming
//!   the owner; else `TypeConflict` when the exports of the name differ in type (headless or
//!   not), else `PortConflict` when they define a port differently (one name, another number or
//!   protocol) — seen in this cluster's export and the imported ServiceRecords of that name
//!   ([`conflicts`]), so only in a cluster that also imports the name; else
//!   `SessionAffinityConflict`, `SessionAffinityConfigConflict`, `InternalTrafficPolicyConflict`
//!   or `TrafficDistributionConflict` ([`TRAIT_REASONS`]) when they set that Service field
//!   otherwise, else `LabelsConflict` / `AnnotationsConflict` when they export one label or
//!   annotation with different values; else `NoConflicts`. The
//!   oldest export wins (KEP-1645; [`oldest_first`], by the export time each record carries,
//!   [`stamp_export`], then the cluster name), the verdict every binder reaches too, and
//!   every export of the name reports the same conflict naming it. Other ports are no
//!   conflict: the service has the union of the exports' ports.
//!
//! [`merge`] keeps each condition's `lastTransitionTime` while its status holds, so a reconcile
//! that changes nothing writes nothing ([`up_to_date`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ServiceSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use xcc_controller::conditions::condition;
use xcc_proto::crd::{
    ANNOUNCED_REASON_COLLISION, ANNOUNCED_REASON_OWNER, CONDITION_ANNOUNCED, Protocol,
    ServiceRecord,
};
use xcc_proto::mcs::{
    CONDITION_CONFLICT, CONDITION_READY, CONDITION_VALID, REASON_EXPORTED, REASON_FAILED,
    REASON_INVALID_SERVICE_TYPE, REASON_NO_CONFLICTS, REASON_NO_SERVICE, REASON_OWNER_CONFLICT,
    REASON_PENDING, REASON_PORT_CONFLICT, REASON_REFUSED_PREFIX, REASON_TYPE_CONFLICT,
    REASON_VALID, ServiceExport, is_headless,
};
use xcc_proto::mcs::{
    EXPORTED_ANNOTATIONS_ANNOTATION, EXPORTED_AT_ANNOTATION, EXPORTED_LABELS_ANNOTATION,
    ExportPort, ServiceTraits, merge_ports, oldest_first, record_exported_metadata, shown_port,
};
use xcc_proto::names::{self, EXPORT_LABEL, SERVICE_PORT_ANNOTATION};

use crate::desired::{Desired, ExportedBy, Skip};

/// Whether and how a Service is exported: by the XCC export label (with or without a
/// ServiceExport), else by a ServiceExport of its name in its namespace that is not being
/// deleted, else not.
pub fn exported(service: &ObjectMeta, export: Option<&ServiceExport>) -> ExportedBy {
    let labelled = service
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXPORT_LABEL));
    if labelled {
        ExportedBy::Label
    } else if export.is_some_and(|e| e.metadata.deletion_timestamp.is_none()) {
        ExportedBy::ServiceExport
    } else {
        ExportedBy::Nothing
    }
}

/// Mark the record `desired` publishes for a Service with what an MCS export carries, when a
/// ServiceExport (not being deleted) names the Service: the time its export began
/// ([`EXPORTED_AT_ANNOTATION`], the ServiceExport's `creationTimestamp`; it travels with the
/// record, so every cluster orders the exports of one name the same, [`oldest_first`]) and the
/// Service fields the ServiceImport carries ([`ServiceTraits`] of `service`: session affinity,
/// internal traffic policy, traffic distribution) and the ServiceExport's `exportedLabels` and
/// `exportedAnnotations` (the entries a ServiceImport may carry). The caller stamps only an
/// export of pods (a ServiceExport alone, or a headless Service): a label export of a cluster IP
/// (with or without a ServiceExport) says neither, ranks after every MCS export of its name
/// and is not this cluster's own MCS export.
pub fn stamp_export(
    desired: &mut Desired,
    export: Option<&ServiceExport>,
    service: Option<&ServiceSpec>,
) {
    let Desired::Publish(record) = desired else {
        return;
    };
    let Some(export) = export.filter(|e| e.metadata.deletion_timestamp.is_none()) else {
        return;
    };
    let annotations = record
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if let Some(at) = export.metadata.creation_timestamp.as_ref() {
        annotations.insert(
            EXPORTED_AT_ANNOTATION.to_string(),
            xcc_proto::mcs::format_exported_at(at.0),
        );
    }
    if let Some(spec) = service {
        annotations.extend(ServiceTraits::of_service(spec).annotations());
    }
    // The labels and annotations the ServiceExport asks the ServiceImports to carry.
    for (key, map, labels) in [
        (
            EXPORTED_LABELS_ANNOTATION,
            &export.spec.exported_labels,
            true,
        ),
        (
            EXPORTED_ANNOTATIONS_ANNOTATION,
            &export.spec.exported_annotations,
            false,
        ),
    ] {
        let kept = map
            .as_ref()
            .map(|m| xcc_proto::mcs::exported_metadata(m, labels))
            .unwrap_or_default();
        if let Some(value) = xcc_proto::mcs::format_exported_metadata(&kept) {
            annotations.insert(key.to_string(), value);
        }
    }
}

/// Where the export of one Service stands after a reconcile.
#[derive(Clone, Copy, Debug)]
pub enum State<'a> {
    /// No Service of the export's name in its namespace.
    NoService,
    /// The Service is not exported; why.
    Skipped(&'a Skip),
    /// A ServiceRecord of the desired name belongs to someone else.
    RecordTaken(&'a str),
    /// The Service's record is written.
    Published(&'a ServiceRecord),
    /// The Service's record is written, and the hierarchy refuses to announce it.
    Refused(&'a ServiceRecord, &'a Refusal),
    /// The Service's record is written as its export label decides, beside the ServiceExport:
    /// the addresses XCC v1 exports, not its pods, so not an MCS export ([`stamp_export`]).
    ByLabel(&'a ServiceRecord),
}

impl<'a> State<'a> {
    /// The written record, when there is one.
    pub fn record(&self) -> Option<&'a ServiceRecord> {
        match self {
            State::Published(r) | State::Refused(r, _) | State::ByLabel(r) => Some(r),
            _ => None,
        }
    }
}

/// Longest condition message the API server accepts (bytes).
const MESSAGE_MAX: usize = 32_768;
/// Longest check name kept from an `Announced` reason (the registry keeps as many).
const CHECK_MAX: usize = 64;

/// The hierarchy's refusal of a written record, read from the record's `Announced=False`
/// condition (which the registry writes, [`xcc_proto::crd::CONDITION_ANNOUNCED`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The failed check as the condition's reason gives it (`Owner`, `Announce`, ...): ASCII
    /// letters and digits only, starting with a letter, at most 64; empty when it names none.
    pub check: String,
    /// The registry's message: who refused it, why, the Cedar policies.
    pub message: String,
}

impl Refusal {
    /// Whether the refusal is because another service owns the name (checks `owner`,
    /// `collision`).
    pub fn owner_conflict(&self) -> bool {
        self.check == ANNOUNCED_REASON_OWNER || self.check == ANNOUNCED_REASON_COLLISION
    }

    /// The `Ready=False` reason: `Refused<check>`, or `Refused` alone without a check.
    pub fn ready_reason(&self) -> String {
        if self.check == REASON_REFUSED_PREFIX {
            return self.check.clone();
        }
        format!("{REASON_REFUSED_PREFIX}{}", self.check)
    }
}

/// The refusal a stored record carries: its `Announced` condition when that is `False`. The
/// condition is written by the registry, but read as untrusted text: the reason keeps only
/// ASCII letters and digits (so the derived reason always matches the API's pattern) and the
/// message is bounded.
pub fn refusal(record: &ServiceRecord) -> Option<Refusal> {
    let announced = record
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_ANNOUNCED)?;
    if announced.status != "False" {
        return None;
    }
    let mut check: String = announced
        .reason
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(CHECK_MAX)
        .collect();
    if !check.starts_with(|c: char| c.is_ascii_alphabetic()) {
        check.clear();
    }
    Some(Refusal {
        check,
        message: bounded(announced.message.clone()),
    })
}

/// `message` cut to what a condition may hold, ending in `…` when cut.
fn bounded(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX - '…'.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

/// One condition the publisher wants on a ServiceExport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// Condition type.
    pub type_: &'static str,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// CamelCase reason.
    pub reason: String,
    /// For people.
    pub message: String,
}

fn wanted(type_: &'static str, status: bool, reason: impl Into<String>, message: String) -> Wanted {
    Wanted {
        type_,
        status: if status { "True" } else { "False" },
        reason: reason.into(),
        message: bounded(message),
    }
}

/// The ports of a record as importers see them, sorted: `spec.ports`, else the
/// `service-port` annotation (one TCP port); empty when neither says.
pub fn export_ports(record: &ServiceRecord) -> Vec<ExportPort> {
    let mut out: Vec<ExportPort> = match record.spec.ports.as_ref().filter(|p| !p.is_empty()) {
        Some(ports) => ports
            .iter()
            .map(|p| (p.name.clone().unwrap_or_default(), p.port, p.protocol()))
            .collect(),
        None => record
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SERVICE_PORT_ANNOTATION))
            .and_then(|v| v.trim().parse::<u16>().ok())
            .map(|p| (String::new(), i32::from(p), Protocol::Tcp))
            .into_iter()
            .collect(),
    };
    out.sort();
    out.dedup();
    out
}

fn kind(headless: bool) -> &'static str {
    if headless { "Headless" } else { "ClusterSetIP" }
}

/// How the exports of this cluster's name disagree, and which one's definition wins — the
/// verdict every cluster that sees the same exports reaches ([`oldest_first`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conflicts {
    /// The export whose definition wins, the oldest ([`xcc_proto::mcs::shown_export`]), when
    /// there is a conflict; else empty.
    pub winner: String,
    /// The winner's type (`Headless` or `ClusterSetIP`) when there is a type conflict.
    pub winner_type: &'static str,
    /// Exports of the other type than the winner's, whose endpoints every cluster leaves out:
    /// `cluster (Headless)` / `cluster (ClusterSetIP)`, sorted.
    pub types: Vec<String>,
    /// Ports of later exports that the union of ports cannot hold (a port name with another
    /// number or protocol, ...): `west's http:8080/TCP (east's http:80/TCP kept)`, oldest
    /// export first.
    pub ports: Vec<String>,
    /// Service fields a later export sets otherwise than the oldest (whose value the
    /// ServiceImport has): (KEP-1645 reason, `west: ClientIP (east: None)`), in the order of
    /// [`TRAIT_REASONS`], each field's exports oldest first; then exported labels and
    /// annotations set to another value than an older export's ([`REASON_LABELS_CONFLICT`],
    /// [`REASON_ANNOTATIONS_CONFLICT`]: `west: team=b (east: team=a)`).
    pub traits: Vec<(&'static str, String)>,
}

/// The `Conflict` reasons of the Service fields a ServiceImport carries, in the order they are
/// reported.
pub const TRAIT_REASONS: [&str; 4] = [
    "SessionAffinityConflict",
    "SessionAffinityConfigConflict",
    "InternalTrafficPolicyConflict",
    "TrafficDistributionConflict",
];

/// `Conflict=True`: exporters set one exported label to different values (KEP-1645).
pub const REASON_LABELS_CONFLICT: &str = "LabelsConflict";
/// `Conflict=True`: exporters set one exported annotation to different values (KEP-1645).
pub const REASON_ANNOTATIONS_CONFLICT: &str = "AnnotationsConflict";

type Map = BTreeMap<String, String>;

/// The fields of `traits` as compared, one per [`TRAIT_REASONS`] entry, shown.
fn trait_values(traits: &ServiceTraits) -> [String; 4] {
    [
        traits.session_affinity().to_string(),
        traits
            .client_ip_timeout
            .map_or_else(|| "none".to_string(), |t| format!("timeoutSeconds {t}")),
        traits.internal_traffic_policy().to_string(),
        traits
            .traffic_distribution
            .clone()
            .unwrap_or_else(|| "unset".to_string()),
    ]
}

/// What the exports of `own`'s FQDN disagree about: `own` and the other clusters' exports among
/// the imported records `imported` (records of this cluster or of other names are not
/// compared), ordered oldest first ([`oldest_first`], KEP-1645: the oldest export wins). Exports
/// of the other type than the oldest's conflict (`TypeConflict`); of the rest, the ports are
/// merged into their union ([`merge_ports`]) and a port that cannot join it is a
/// `PortConflict`. Every export of the name reports the same conflicts (KEP-1645 sets the
/// condition on all of them). Records without ports add no ports.
pub fn conflicts<'a>(
    own: &ServiceRecord,
    cluster: Option<&str>,
    imported: impl IntoIterator<Item = &'a ServiceRecord>,
) -> Conflicts {
    let Ok(fqdn) = names::canonical_fqdn(&own.spec.fqdn) else {
        return Conflicts::default();
    };
    let mut exports: Vec<&ServiceRecord> = vec![own];
    for record in imported {
        if names::canonical_fqdn(&record.spec.fqdn).as_deref() != Ok(fqdn.as_str()) {
            continue;
        }
        let from = xcc_proto::mcs::source_cluster(record);
        if from.is_some() && cluster == from {
            continue;
        }
        exports.push(record);
    }
    exports.sort_by(|a, b| oldest_first(a, b));
    let Some(winner) = exports.first().copied() else {
        return Conflicts::default();
    };
    let headless = is_headless(winner);
    let cluster_of = |r: &ServiceRecord| {
        xcc_proto::mcs::source_cluster(r)
            .or(if std::ptr::eq(r, own) { cluster } else { None })
            .unwrap_or("an unnamed cluster")
            .to_string()
    };
    let types: BTreeSet<String> = exports
        .iter()
        .filter(|r| is_headless(r) != headless)
        .map(|r| format!("{} ({})", cluster_of(r), kind(!headless)))
        .collect();
    let same_type: Vec<&ServiceRecord> = exports
        .iter()
        .copied()
        .filter(|r| is_headless(r) == headless)
        .collect();
    let ports: Vec<Vec<ExportPort>> = same_type.iter().map(|r| export_ports(r)).collect();
    let (_, clashes) = merge_ports(ports.iter().map(Vec::as_slice));
    let ports: Vec<String> = clashes
        .iter()
        .map(|c| {
            format!(
                "{}'s {} ({}'s {} kept)",
                cluster_of(same_type[c.export]),
                shown_port(&c.port),
                cluster_of(same_type[c.kept_from]),
                shown_port(&c.kept)
            )
        })
        .collect();
    let mut traits = field_conflicts(&same_type, &cluster_of);
    traits.extend(metadata_conflicts(&same_type, &cluster_of));
    if types.is_empty() && ports.is_empty() && traits.is_empty() {
        return Conflicts::default();
    }
    Conflicts {
        winner: xcc_proto::mcs::shown_export(winner),
        winner_type: if types.is_empty() { "" } else { kind(headless) },
        types: types.into_iter().collect(),
        ports,
        traits,
    }
}

/// The Service fields of the same-type exports (oldest first): the oldest export's hold;
/// another value is a conflict (session affinity's timeout only between two ClientIP exports).
fn field_conflicts(
    same_type: &[&ServiceRecord],
    cluster_of: &dyn Fn(&ServiceRecord) -> String,
) -> Vec<(&'static str, String)> {
    let theirs: Vec<[String; 4]> = same_type
        .iter()
        .map(|r| trait_values(&ServiceTraits::of_record(r)))
        .collect();
    let mut traits = Vec::new();
    for (field, reason) in TRAIT_REASONS.iter().enumerate() {
        for (r, values) in same_type.iter().zip(&theirs).skip(1) {
            let (mine, oldest) = (&values[field], &theirs[0][field]);
            let comparable = field != 1 || (values[0] == theirs[0][0]);
            if comparable && mine != oldest {
                traits.push((
                    *reason,
                    format!(
                        "{}: {mine} ({}: {oldest})",
                        cluster_of(r),
                        cluster_of(same_type[0])
                    ),
                ));
            }
        }
    }
    traits
}

/// Exported labels and annotations of the same-type exports (oldest first): the union, the
/// oldest export's value of a key holding; another value of a key is a conflict.
fn metadata_conflicts(
    same_type: &[&ServiceRecord],
    cluster_of: &dyn Fn(&ServiceRecord) -> String,
) -> Vec<(&'static str, String)> {
    let mut traits = Vec::new();
    let metadata: Vec<_> = same_type
        .iter()
        .map(|r| record_exported_metadata(r))
        .collect();
    for (reason, pick) in [
        (
            REASON_LABELS_CONFLICT,
            (|m: &(Map, Map)| &m.0) as fn(&(Map, Map)) -> &Map,
        ),
        (REASON_ANNOTATIONS_CONFLICT, |m: &(Map, Map)| &m.1),
    ] {
        let mut held: BTreeMap<&String, (&String, usize)> = BTreeMap::new();
        for (index, m) in metadata.iter().enumerate() {
            for (key, value) in pick(m) {
                match held.get(key) {
                    Some((v, from)) if *v != value => traits.push((
                        reason,
                        format!(
                            "{}: {key}={value} ({}: {key}={v})",
                            cluster_of(same_type[index]),
                            cluster_of(same_type[*from])
                        ),
                    )),
                    Some(_) => {}
                    None => {
                        held.insert(key, (value, index));
                    }
                }
            }
        }
    }
    traits
}

/// The `Valid`, `Ready` and `Conflict` conditions for `state`; `conflicts` is what
/// [`conflicts`] found for the published record (a type conflict is reported before a port
/// conflict, as KEP-1645 orders them).
pub fn conditions(state: State<'_>, conflicts: &Conflicts) -> [Wanted; 3] {
    match state {
        State::NoService => invalid(
            REASON_NO_SERVICE,
            "no Service of this name in this namespace".into(),
        ),
        State::Skipped(skip) => {
            let reason = match skip {
                Skip::ExternalName | Skip::Headless => REASON_INVALID_SERVICE_TYPE,
                Skip::NoPorts => "NoPorts",
                Skip::InvalidFqdn(_) => "InvalidFqdn",
                // Not reachable for an exported Service; reported as what it says.
                Skip::NotExported | Skip::NoVirtualHost | Skip::IncompleteMetadata => {
                    "NotExportable"
                }
            };
            invalid(reason, skip.to_string())
        }
        State::RecordTaken(name) => [
            wanted(CONDITION_VALID, true, REASON_VALID, String::new()),
            wanted(
                CONDITION_READY,
                false,
                REASON_FAILED,
                format!("ServiceRecord {name} exists and is not this Service's; left unchanged"),
            ),
            no_conflict("not exported"),
        ],
        State::ByLabel(record) => {
            let name = record.metadata.name.as_deref().unwrap_or_default();
            [
                wanted(CONDITION_VALID, true, REASON_VALID, String::new()),
                wanted(
                    CONDITION_READY,
                    true,
                    REASON_EXPORTED,
                    format!(
                        "exported as ServiceRecord {name} by the Service's {EXPORT_LABEL} label, \
                         which decides: the addresses XCC v1 exports (cluster IP, load balancer \
                         or nodes), ranked after every MCS export of the name and not among this \
                         cluster's own clusterset endpoints; remove the label to export the \
                         Service's ready pods with this ServiceExport"
                    ),
                ),
                conflict_condition(None, conflicts),
            ]
        }
        State::Published(record) | State::Refused(record, _) => {
            let name = record.metadata.name.as_deref().unwrap_or_default();
            let refused = match state {
                State::Refused(_, r) => Some(r),
                _ => None,
            };
            let ready = match refused {
                Some(r) => wanted(
                    CONDITION_READY,
                    false,
                    r.ready_reason(),
                    format!(
                        "ServiceRecord {name} is written, but the hierarchy refuses to announce it: {}",
                        r.message
                    ),
                ),
                None => wanted(
                    CONDITION_READY,
                    true,
                    REASON_EXPORTED,
                    format!("exported as ServiceRecord {name}"),
                ),
            };
            [
                wanted(CONDITION_VALID, true, REASON_VALID, String::new()),
                ready,
                conflict_condition(refused, conflicts),
            ]
        }
    }
}

/// `Conflict=False` with why.
fn no_conflict(why: &str) -> Wanted {
    wanted(
        CONDITION_CONFLICT,
        false,
        REASON_NO_CONFLICTS,
        why.to_string(),
    )
}

/// The three conditions of an export that is not exported: `Valid=False` with `reason`.
fn invalid(reason: &'static str, why: String) -> [Wanted; 3] {
    [
        wanted(CONDITION_VALID, false, reason, why.clone()),
        wanted(
            CONDITION_READY,
            false,
            REASON_PENDING,
            format!("not exported: {why}"),
        ),
        no_conflict("not exported"),
    ]
}

/// The Conflict condition of a written record: another owner of the name in the hierarchy
/// first, then a type conflict, then ports, then the other Service fields, labels and
/// annotations.
fn conflict_condition(refused: Option<&Refusal>, conflicts: &Conflicts) -> Wanted {
    if let Some(r) = refused.filter(|r| r.owner_conflict()) {
        wanted(
            CONDITION_CONFLICT,
            true,
            REASON_OWNER_CONFLICT,
            format!(
                "another service owns this name in the hierarchy, so this export is not announced: {}",
                r.message
            ),
        )
    } else if !conflicts.types.is_empty() {
        wanted(
            CONDITION_CONFLICT,
            true,
            REASON_TYPE_CONFLICT,
            format!(
                "the exports of this name differ in type; the oldest export, {}, wins: every cluster serves it as {} and leaves out the endpoints of {}",
                conflicts.winner,
                conflicts.winner_type,
                conflicts.types.join(", ")
            ),
        )
    } else if !conflicts.ports.is_empty() {
        wanted(
            CONDITION_CONFLICT,
            true,
            REASON_PORT_CONFLICT,
            format!(
                "the exports of this name define a port differently; the service has the union of their ports, the oldest export's definition winning (the oldest export is {}): {}",
                conflicts.winner,
                conflicts.ports.join(", ")
            ),
        )
    } else {
        match conflicts.traits.first() {
            Some((reason, _)) => wanted(
                CONDITION_CONFLICT,
                true,
                *reason,
                format!(
                    "the exports of this name set a Service field, exported label or exported annotation differently; the oldest export's value holds (the oldest export is {}): {}",
                    conflicts.winner,
                    conflicts
                        .traits
                        .iter()
                        .map(|(reason, what)| format!("{reason} {what}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            None => no_conflict("no export of this name differs"),
        }
    }
}

/// The conditions to apply: `wanted`, each keeping the `lastTransitionTime` of the condition
/// of its type in `existing` when the status is unchanged, else `now`.
pub fn merge(
    existing: &[Condition],
    wanted: &[Wanted],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    wanted
        .iter()
        .map(|w| {
            condition(
                existing,
                w.type_,
                w.status,
                w.reason.as_str(),
                w.message.clone(),
                generation,
                now,
            )
        })
        .collect()
}

/// Whether every condition of `ours` is already in `existing`, as is.
pub fn up_to_date(existing: &[Condition], ours: &[Condition]) -> bool {
    ours.iter().all(|c| existing.contains(c))
}

#[cfg(test)]
mod tests;
