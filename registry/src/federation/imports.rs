//! Imports through the hierarchy: the persistent questions of a `role: Parent` RemoteRegistry
//! and their granted answers, mirrored into the catalog (`Source::Hierarchy`) and the import
//! sink so the binder materialises them like any other import. Unanswered, denied or not-found
//! questions are asked again periodically; answers change by themselves through pushes.
//!
//! Nothing is persisted until every question has a deciding answer (granted, denied, not
//! found): right after a (re)start the questions are pending or answered "unavailable" while
//! the parent link comes up, and persisting that empty set would delete the imported records
//! only to re-create them moments later. Until then what is stored stays as it is. With no
//! questions at all the (empty) set is decided at once, so removed imports do go. The caller
//! sets the questions ([`Level::set_imports`]) before spawning the sync.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::convert::parse_endpoint;
use super::level::Level;
use crate::catalog::{NamedPort, ServiceEntry, ServiceKey, Source};
use crate::hamlet::client::ImportSink;
use crate::hamlet::convert::Imported;
use xcc_proto::ports::RawPort;
use xcc_proto::xcc::federation::v1::ServiceQueryResponse;

/// A question: what is asked for, and by which service.
type Question = (super::level::Target, String);

/// The answer's ports as [`xcc_proto::ports::checked`] takes them.
fn raw_ports(a: &ServiceQueryResponse) -> impl Iterator<Item = RawPort<'_>> {
    a.ports.iter().map(|p| RawPort {
        name: &p.name,
        port: p.port,
        protocol: &p.protocol,
        target_port: p.target_port,
    })
}

/// The catalog entry of a granted answer. Like everything from the wire the answer is hostile
/// input: endpoints that do not parse are left out, of its labels only what a Hamlet import
/// keeps ([`crate::peer_labels`]: the headless marker, hostnames of its own endpoints, ...), and
/// of its ports those a ServiceRecord, a Service and a ServiceImport accept
/// ([`xcc_proto::ports::checked`]; [`run`] logs why each other one was dropped).
pub(crate) fn entry_of(a: &ServiceQueryResponse, parent: &str) -> ServiceEntry {
    let key = ServiceKey::new(&a.owner_cluster, &a.namespace, &a.name);
    let endpoints: Vec<_> = a
        .endpoints
        .iter()
        .filter_map(|e| parse_endpoint(e).ok())
        .collect();
    let mut labels = crate::peer_labels::allowed_of(&a.labels, &endpoints);
    // The tree's rule for the clusterset name, as every level applies it (a parent that breaks
    // it still gives this importer no second name for a service).
    let fqdn = xcc_proto::names::canonical_fqdn(&a.fqdn).unwrap_or_else(|_| a.fqdn.clone());
    crate::peer_labels::keep_origin_in_tree(&mut labels, &fqdn);
    let labels = labels.into();
    ServiceEntry {
        key,
        source: Source::Hierarchy(parent.to_string()),
        fqdn: a.fqdn.as_str().into(),
        endpoints,
        ports: xcc_proto::ports::checked(raw_ports(a))
            .0
            .iter()
            .map(NamedPort::of)
            .collect(),
        labels,
        allowed_requesters: vec![],
        origin: Some(Box::new(crate::catalog::Origin {
            cluster: a.owner_cluster.clone(),
            namespace: a.namespace.clone(),
            name: a.name.clone(),
            kind: String::new(),
        })),
        revision: 0,
    }
}

/// The granted services among `subs`. A question whose answer does not decide it (pending, or
/// "unavailable" because a level above cannot be reached) keeps its entry from `remembered` (a
/// level keeps serving its cached answer while the one above is away). Returns the entries and the
/// new memory.
fn granted_entries(
    subs: &[(super::level::Target, String, Option<ServiceQueryResponse>)],
    remembered: &BTreeMap<Question, ServiceEntry>,
    parent: &str,
) -> (Vec<ServiceEntry>, BTreeMap<Question, ServiceEntry>) {
    let mut out: BTreeMap<ServiceKey, ServiceEntry> = BTreeMap::new();
    let mut memory = BTreeMap::new();
    for (target, service, answer) in subs {
        let question = (target.clone(), service.clone());
        let entry = match answer {
            Some(a) if decided(Some(a)) => {
                if !(a.found && a.access_allowed) || a.revoked {
                    continue;
                }
                entry_of(a, parent)
            }
            _ => match remembered.get(&question) {
                Some(e) => e.clone(),
                None => continue,
            },
        };
        memory.insert(question, entry.clone());
        out.insert(entry.key.clone(), entry);
    }
    (out.into_values().collect(), memory)
}

/// Whether an answer decides its question: granted, denied or not found — not "unavailable"
/// (the parent, or a level above it, could not be reached).
pub fn decided(answer: Option<&ServiceQueryResponse>) -> bool {
    answer.is_some_and(|a| !a.unavailable)
}

/// Whether every persistent question of `level` has a deciding answer (true with none).
pub fn all_decided(level: &Level) -> bool {
    level
        .subscriptions()
        .iter()
        .all(|(_, _, a)| decided(a.as_ref()))
}

/// Keep the catalog and the sink in step with the granted answers until `cancel`.
pub async fn run(
    level: Level,
    parent: String,
    sink: Arc<dyn ImportSink>,
    retry: Duration,
    cancel: CancellationToken,
) {
    let mut changes = level.subscribe();
    let mut tick = tokio::time::interval(retry);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Vec<ServiceEntry>> = None;
    let mut remembered: BTreeMap<Question, ServiceEntry> = BTreeMap::new();
    loop {
        // Before the first persist, wait until every question is decided (see the module
        // docs); afterwards a granted answer stays until it is revoked or denied.
        let subs = level.subscriptions();
        let ready = last.is_some() || subs.iter().all(|(_, _, a)| decided(a.as_ref()));
        let (entries, memory) = granted_entries(&subs, &remembered, &parent);
        remembered = memory;
        if ready && last.as_ref() != Some(&entries) {
            for (_, _, answer) in &subs {
                let Some(a) = answer.as_ref().filter(|a| a.access_allowed) else {
                    continue;
                };
                for (index, why) in xcc_proto::ports::checked(raw_ports(a)).1 {
                    warn!(%parent, fqdn = %a.fqdn, owner = %a.owner_cluster, index, reason = %why, "a port of a granted answer was dropped; the import keeps its other ports");
                }
            }
            let imports: BTreeMap<String, Imported> = entries
                .iter()
                .map(|e| (e.fqdn.to_string(), Imported::of_entry(e)))
                .collect();
            match sink.persist(&parent, &imports).await {
                Ok(()) => {
                    level
                        .catalog()
                        .replace_source(&Source::Hierarchy(parent.clone()), entries.clone());
                    last = Some(entries);
                }
                Err(e) => {
                    warn!(%parent, error = %format!("{e:#}"), "cannot persist hierarchy imports; retrying")
                }
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
            _ = tick.tick() => level.retry_unanswered(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use xcc_proto::crd::{Protocol, ServicePort};
    use xcc_proto::mcs::{HEADLESS_ANNOTATION, HOSTNAMES_ANNOTATION};
    use xcc_proto::xcc::federation::v1 as fed;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn granted(labels: BTreeMap<String, String>) -> ServiceQueryResponse {
        ServiceQueryResponse {
            found: true,
            access_allowed: true,
            owner_cluster: "east".into(),
            namespace: "shop".into(),
            name: "db.shop.svc.clusterset.local".into(),
            fqdn: "db.shop.svc.clusterset.local".into(),
            endpoints: vec!["10.4.0.1:15432".into(), "10.4.0.2:15432".into()],
            labels,
            ..Default::default()
        }
    }

    #[test]
    fn a_granted_headless_answer_imports_its_marker_hostnames_and_owner() {
        let sent = labels(&[
            (HEADLESS_ANNOTATION, "true"),
            (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0,10.4.0.2=db-1"),
            (xcc_proto::mapping::ORIGIN_NAMESPACE_ANNOTATION, "shop"),
            (xcc_proto::mapping::ORIGIN_NAME_ANNOTATION, "db"),
            (xcc_proto::names::SERVICE_PORT_ANNOTATION, "5432"),
        ]);
        let e = entry_of(&granted(sent.clone()), "parent");
        assert_eq!(e.labels, sent);
        let imported = Imported::of_entry(&e);
        assert_eq!(imported.labels, sent);
        assert_eq!(imported.cluster.as_deref(), Some("east"));
    }

    /// A lying parent: annotations no importer keeps, hostnames of addresses the answer does
    /// not carry, an owner that is no cluster name. What is kept is what a Hamlet import keeps.
    #[test]
    fn a_lying_parent_cannot_inject_labels_or_foreign_hostnames() {
        let mut a = granted(labels(&[
            (HEADLESS_ANNOTATION, "true"),
            (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0,10.9.9.9=elsewhere"),
            ("connectivity.tanzu.vmware.com/workload-selector", "app=x"),
            ("kubernetes.io/service-name", "kube-dns"),
            (xcc_proto::names::VIP_ANNOTATION, "not-an-ip"),
        ]));
        a.owner_cluster = "../etc".into();
        let e = entry_of(&a, "parent");
        assert_eq!(
            e.labels,
            labels(&[
                (HEADLESS_ANNOTATION, "true"),
                (HOSTNAMES_ANNOTATION, "10.4.0.1=db-0"),
            ])
        );
        assert_eq!(Imported::of_entry(&e).cluster, None);
        // The same labels over Hamlet are kept the same way.
        let mut fs = xcc_proto::federation::types::v1alpha1::FederatedService {
            fqdn: a.fqdn.clone(),
            labels: a.labels.clone(),
            ..Default::default()
        };
        for ep in &e.endpoints {
            fs.endpoints.push(
                xcc_proto::federation::types::v1alpha1::federated_service::Endpoint {
                    address: ep.address.to_string(),
                    port: ep.port,
                },
            );
        }
        let any = prost_types::Any {
            type_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            value: prost::Message::encode_to_vec(&fs),
        };
        let over_hamlet = crate::hamlet::convert::import_v1alpha1(&any).expect("valid");
        assert_eq!(e.labels, over_hamlet.labels);
    }

    fn port(name: &str, port: u32, protocol: &str, target_port: u32) -> fed::Port {
        fed::Port {
            name: name.into(),
            port,
            protocol: protocol.into(),
            target_port,
        }
    }

    /// A granted answer's ports reach the import — names, protocols, the pods' target ports —
    /// as the record's `spec.ports`, in both stores.
    /// The named ports of the tests' headless database: `sql` 5432 → 15432/TCP, `stats` 9187/UDP.
    pub(crate) fn sql_ports() -> Vec<ServicePort> {
        vec![
            ServicePort {
                name: Some("sql".into()),
                port: 5432,
                protocol: Some(Protocol::Tcp),
                target_port: Some(15432),
            },
            ServicePort {
                name: Some("stats".into()),
                port: 9187,
                protocol: Some(Protocol::Udp),
                target_port: None,
            },
        ]
    }

    #[test]
    fn a_granted_answers_ports_become_the_imports_named_ports() {
        let mut a = granted(labels(&[(HEADLESS_ANNOTATION, "true")]));
        a.ports = vec![
            port("sql", 5432, "TCP", 15432),
            port("stats", 9187, "UDP", 0),
        ];
        let e = entry_of(&a, "parent");
        let imported = Imported::of_entry(&e);
        let want = sql_ports();
        assert_eq!(imported.ports, want);
        let owner = crate::store::kube::records::Owner {
            name: "parent".into(),
            uid: "u".into(),
        };
        let kube = crate::store::kube::records::imported_record(&owner, "xcc", &imported)
            .expect("a record");
        assert_eq!(kube.spec.ports.as_ref(), Some(&want));
        let file =
            crate::store::file::imported_record("parent", "xcc", &imported).expect("a record");
        assert_eq!(file.spec, kube.spec);
        // What the stores read back is what they wrote.
        assert_eq!(crate::store::model::stored_ports(&kube), want);
        // No ports: no `spec.ports` (the record keeps XCC v1's single port annotation).
        a.ports.clear();
        let bare = Imported::of_entry(&entry_of(&a, "parent"));
        let kube =
            crate::store::kube::records::imported_record(&owner, "xcc", &bare).expect("a record");
        assert_eq!(kube.spec.ports, None);
    }

    /// A lying parent's bad ports cost only themselves: the import and its good ports stay.
    #[test]
    fn bad_ports_of_an_answer_are_dropped_one_by_one() {
        let mut a = granted(labels(&[]));
        a.ports = vec![
            port("sql", 5432, "TCP", 15432),
            port("zero", 0, "TCP", 0),
            port("far", 80, "TCP", 70_000),
            port("quic", 443, "QUIC", 0),
            port("../etc", 444, "TCP", 0),
            port("sql", 5433, "TCP", 0),
            port("alt", 5432, "TCP", 0),
            port("", 8080, "TCP", 0),
        ];
        a.ports
            .extend((0..200).map(|i| port(&format!("p{i}"), 10_000 + i, "UDP", 0)));
        let imported = Imported::of_entry(&entry_of(&a, "parent"));
        assert_eq!(imported.ports.len(), xcc_proto::ports::MAX_PORTS);
        assert_eq!(
            imported.ports[0],
            ServicePort {
                name: Some("sql".into()),
                port: 5432,
                protocol: Some(Protocol::Tcp),
                target_port: Some(15432),
            }
        );
        assert_eq!(
            imported.ports[1..]
                .iter()
                .map(|p| (p.name.as_deref().unwrap_or_default(), p.port, p.protocol()))
                .collect::<Vec<_>>(),
            (0..99)
                .map(|i| (format!("p{i}"), 10_000 + i, Protocol::Udp))
                .collect::<Vec<_>>()
                .iter()
                .map(|(n, p, pr)| (n.as_str(), *p, *pr))
                .collect::<Vec<_>>()
        );
        assert_eq!(imported.endpoints.len(), 2, "the import itself stays");
        let dropped: Vec<usize> = xcc_proto::ports::checked(raw_ports(&a))
            .1
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(dropped[..7], [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(dropped.len(), 7 + 101);
    }

    /// Only granted answers become entries: a denial (which carries no labels) and a
    /// revocation import nothing.
    #[test]
    fn denied_or_revoked_answers_import_nothing() {
        let target = super::super::level::Target::Fqdn("db.shop.svc.clusterset.local".into());
        let mut denied = granted(labels(&[(HEADLESS_ANNOTATION, "true")]));
        denied.access_allowed = false;
        let mut revoked = granted(labels(&[(HEADLESS_ANNOTATION, "true")]));
        revoked.revoked = true;
        for answer in [denied, revoked] {
            let subs = vec![(target.clone(), String::new(), Some(answer))];
            let (entries, memory) = granted_entries(&subs, &BTreeMap::new(), "parent");
            assert_eq!((entries.len(), memory.len()), (0, 0));
        }
    }
}
