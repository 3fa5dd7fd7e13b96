//! Authorization: the bilateral rule and Cedar policies. Pure: no I/O except reading a policy
//! directory in [`Policies::from_dir`].
//!
//! A requester R (cluster, optionally `cluster/service`) gets service S only if
//! (a) S's allowed requesters admit R (empty = every authenticated cluster),
//! (b) R asked for S, and
//! (c) the Cedar policy set permits `discover` for R on S.
//! The three are evaluated separately so the answer can say which one failed. The default policy
//! set permits `discover` exactly when (a) and (b) hold (passed in the request context), and
//! permits `announce` of MCS names (`*.svc.clusterset.local`); any other zone must be granted
//! to a cluster by a policy in the policy directory, so a compromised leaf cannot claim names.
//!
//! [`Gate`] is the one decision point every listener asks: the Hamlet server (per consumer and
//! per record), federation answers, admin Resolve/Explain and therefore the imports the DNS
//! server ends up serving. It binds a certificate [`Identity`](xcc_certs::identity::Identity) to a requesting cluster (kind
//! and trust domain checked) and then evaluates (a), (b) and (c) above. `carry` (may a child
//! speak for a cluster of its subtree) is decided here too.
//!
//! The parts: [`schema`] (the Cedar schema, the default policies and the entities built from a
//! record and a requester), [`load`] (a policy set from sources or a directory, validated),
//! [`decide`] (one decision: `discover`, `announce`, `carry`), [`flip`] (what a policy reload
//! changes for a consumer: [`flipped`], [`flipped_all`]) and [`gate`] (the [`Gate`] every
//! listener asks, binding certificates to requesters). Policies from a ConfigMap are
//! [`crate::authz_configmap`].

use std::sync::{Arc, RwLock};

use crate::catalog::ServiceEntry;

pub mod decide;
pub mod flip;
pub mod gate;
pub mod load;
pub mod schema;

pub use decide::Discoverer;
pub use flip::{EntityOf, flipped, flipped_all};
pub use gate::{Gate, IdentityRefused};
pub use load::{BaseError, LabelTestError, Policies, carry_policy};
pub use schema::{DEFAULT_POLICIES, SCHEMA, service_entity, zones_of};

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: policy {id:?} is defined twice")]
    Duplicate { file: String, id: String },
    #[error("policies do not validate against the xcc schema: {0}")]
    Invalid(String),
    /// A policy tests a label no service can carry to it, so it would never match.
    #[error(transparent)]
    Label(Box<LabelTestError>),
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("internal: {0}")]
    Internal(String),
    /// The built-in schema or default policies do not load (a defect of this build).
    #[error("internal: {0}")]
    Base(&'static BaseError),
}

/// Outcome of one Cedar evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// Policies that determined the decision (permits when allowed, forbids when denied by one).
    pub policies: Vec<String>,
    pub errors: Vec<String>,
}

/// Which bilateral condition decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    Granted,
    NotAllowedByCallee,
    NotRequested,
    PolicyDenied,
}

impl Condition {
    /// The reason names used in statuses (RemoteRegistry import conditions).
    pub fn reason(self) -> &'static str {
        match self {
            Condition::Granted => "Granted",
            Condition::NotAllowedByCallee => "NotAllowedByCallee",
            Condition::NotRequested => "NotRequested",
            Condition::PolicyDenied => "PolicyDenied",
        }
    }
}

/// The full decision on one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub condition: Condition,
    pub callee_admits: bool,
    pub caller_requested: bool,
    pub policy_permits: bool,
    pub policies: Vec<String>,
    pub reason: String,
}

/// Shared handle on the loaded policy set (swapped on reload).
pub type PolicyHandle = Arc<RwLock<Arc<Policies>>>;

/// Condition (a): `allowed_requesters` empty, or naming the cluster, or `cluster/service`.
pub fn admits(entry: &ServiceEntry, cluster: &str, service: &str) -> bool {
    if service.is_empty() {
        entry.admits(cluster)
    } else {
        entry.admits(&format!("{cluster}/{service}"))
    }
}

#[cfg(test)]
mod tests {
    use xcc_certs::identity::Identity;

    use super::*;
    use crate::catalog::{Endpoint, ServiceKey, Source};

    fn api(allowed: &[&str]) -> ServiceEntry {
        ServiceEntry {
            key: ServiceKey::new("b2", "shop", "api"),
            source: Source::Local,
            fqdn: "api.shop.svc.clusterset.local".into(),
            endpoints: vec![Endpoint {
                address: "10.2.0.1".into(),
                port: 443,
            }],
            ports: vec![],
            // What the README tells an owner to write; the bare key `tier` is no policy label.
            labels: [
                ("connectivity.tanzu.vmware.com/tier", "restricted"),
                ("tier", "public"),
                ("connectivity.tanzu.vmware.com/service-port", "443"),
            ]
            .into_iter()
            .collect(),
            allowed_requesters: allowed.iter().map(|s| s.to_string()).collect(),
            origin: None,
            revision: 1,
        }
    }

    /// `flipped_all` answers what `flipped` answers for each record, across chunks and
    /// threads, for every pair of sets: default only, a custom forbid, that forbid edited in
    /// place (same id, other text), the same text again under another file and id, and a set
    /// with a permit that changes nothing; records the consumer is not admitted to never flip.
    #[test]
    fn flipped_all_decides_each_record_as_flipped_does() {
        let forbid = |id: &str, like: &str| {
            format!(
                r#"@id("{id}") forbid (principal, action == Xcc::Action::"discover", resource) when {{ resource.name like "{like}" }};"#
            )
        };
        let set = |file: &str, text: String| {
            Policies::from_sources(&[(file.to_string(), text)]).expect("valid")
        };
        let sets = [
            Policies::default_set(),
            set("a.cedar", forbid("x", "svc-1*")),
            set("a.cedar", forbid("x", "svc-2*")),
            set("b.cedar", forbid("y", "svc-1*")),
            set(
                "c.cedar",
                r#"@id("p") permit (principal, action == Xcc::Action::"discover", resource) when { resource.name like "svc-3*" };"#.to_string(),
            ),
        ];
        let entries: Vec<Arc<ServiceEntry>> = (0..700)
            .map(|i| {
                let name = format!("svc-{i:03}");
                let mut e = api(if i % 7 == 0 { &["c9"] } else { &[] });
                e.key = ServiceKey::new("b2", "shop", &name);
                e.fqdn = format!("{name}.shop.svc.clusterset.local").into();
                Arc::new(e)
            })
            .collect();
        let refs: Vec<&Arc<ServiceEntry>> = entries.iter().collect();
        let entity: EntityOf<'_> = &|e| service_entity(e);
        for from in &sets {
            for to in &sets {
                let one_by_one: Vec<Option<bool>> =
                    refs.iter().map(|e| flipped(from, to, e, "c1")).collect();
                assert_eq!(flipped_all(from, to, &refs, "c1", entity), one_by_one);
            }
        }
        // The edit in place: svc-1xx allowed again, svc-2xx denied, all else unchanged.
        let expected: Vec<Option<bool>> = (0..700)
            .map(|i| match (i % 7 == 0, i / 100) {
                (true, _) => None,
                (false, 1) => Some(true),
                (false, 2) => Some(false),
                _ => None,
            })
            .collect();
        assert_eq!(
            flipped_all(&sets[1], &sets[2], &refs, "c1", entity),
            expected
        );
        assert!(
            flipped_all(&sets[1], &sets[3], &refs, "c1", entity)
                .iter()
                .all(Option::is_none),
            "the same forbid under another id flips nothing"
        );
    }

    /// `flipped_all` answers what `flipped` answers for a view with two records of one service
    /// (one entity uid in a chunk's set), for two requesters, and for a set whose policy names a
    /// service in its condition: in a chunk's entity set that service is there to be read, so
    /// the policy would apply to every record of its chunk (those sets are decided record by
    /// record).
    #[test]
    fn flipped_all_decides_as_flipped_does_with_twins_and_named_entities() {
        let set = |text: &str| {
            Policies::from_sources(&[("p.cedar".to_string(), text.to_string())]).expect("valid")
        };
        let sets = [
            set(
                r#"@id("x") forbid (principal, action == Xcc::Action::"discover", resource) when { resource.labels.contains("tier=restricted") };"#,
            ),
            set(
                r#"@id("y") forbid (principal, action == Xcc::Action::"discover", resource) when { resource.name like "svc-1*" };"#,
            ),
            set(
                r#"@id("z") forbid (principal, action == Xcc::Action::"discover", resource) when { Xcc::Service::"b2/shop/svc-005".name == "svc-005" };"#,
            ),
            Policies::default_set(),
        ];
        assert!(sets[2].names_entities && !sets[0].names_entities && !sets[1].names_entities);
        let record = |i: usize, restricted: bool| {
            let name = format!("svc-{i:03}");
            let mut e = api(&[]);
            e.key = ServiceKey::new("b2", "shop", &name);
            e.fqdn = format!("{name}.b2.svc.clusterset.local").into();
            if !restricted {
                e.labels = e
                    .labels
                    .iter()
                    .filter(|(k, _)| *k != "connectivity.tanzu.vmware.com/tier")
                    .collect();
            }
            Arc::new(e)
        };
        let mut view: Vec<Arc<ServiceEntry>> = (0..300).map(|i| record(i, i % 3 == 0)).collect();
        // Two records of one service in the second chunk: one uid, and the second version is
        // restricted. (The first chunk, with svc-005, is decided as one set.)
        assert!(
            !view[290]
                .labels
                .contains_key("connectivity.tanzu.vmware.com/tier")
        );
        let mut twin = (*record(290, true)).clone();
        twin.fqdn = "twin.b2.svc.clusterset.local".into();
        view.push(Arc::new(twin));
        let entity: EntityOf<'_> = &|e| service_entity(e);
        let refs: Vec<&Arc<ServiceEntry>> = view.iter().collect();
        for cluster in ["c1", "c2"] {
            for from in &sets {
                for to in &sets {
                    let one_by_one: Vec<Option<bool>> =
                        refs.iter().map(|e| flipped(from, to, e, cluster)).collect();
                    assert_eq!(
                        flipped_all(from, to, &refs, cluster, entity),
                        one_by_one,
                        "{cluster}"
                    );
                }
            }
        }
    }

    /// A stream's [`Discoverer`] answers what [`Policies::allows`] answers, for every record,
    /// requester (a cluster, a workload, one the records' allowed requesters leave out) and set:
    /// the default set, a forbid and a permit on names, a forbid on one requester, one on a
    /// workload's name, and one on a label for a cluster and its workloads (`principal in`).
    #[test]
    fn a_discoverer_decides_as_allows_does() {
        let set = |text: &str| {
            Arc::new(
                Policies::from_sources(&[("p.cedar".to_string(), text.to_string())])
                    .expect("valid"),
            )
        };
        let sets = [
            Arc::new(Policies::default_set()),
            set(
                r#"@id("x") forbid (principal, action == Xcc::Action::"discover", resource) when { resource.name like "svc-1*" };"#,
            ),
            set(
                r#"@id("p") permit (principal, action == Xcc::Action::"discover", resource) when { resource.name like "svc-3*" };"#,
            ),
            set(
                r#"@id("c") forbid (principal == Xcc::Cluster::"c2", action == Xcc::Action::"discover", resource);"#,
            ),
            set(
                r#"@id("w") forbid (principal is Xcc::Workload, action == Xcc::Action::"discover", resource) when { principal.name == "batch" };"#,
            ),
            set(
                r#"@id("l") forbid (principal in Xcc::Cluster::"c1", action == Xcc::Action::"discover", resource) when { resource.labels.contains("tier=restricted") && resource.name like "svc-2*" };"#,
            ),
        ];
        let entries: Vec<Arc<ServiceEntry>> = (0..400)
            .map(|i| {
                let name = format!("svc-{i:03}");
                let mut e = api(match i % 5 {
                    0 => &["c9"][..],
                    1 => &["c1/web"][..],
                    _ => &[][..],
                });
                e.key = ServiceKey::new("b2", "shop", &name);
                e.fqdn = format!("{name}.shop.svc.clusterset.local").into();
                Arc::new(e)
            })
            .collect();
        let entity: EntityOf<'_> = &|e| service_entity(e);
        let mut allowed = 0;
        for policies in &sets {
            for (cluster, service) in [("c1", ""), ("c1", "web"), ("c1", "batch"), ("c2", "")] {
                let d = Discoverer::new(policies.clone(), cluster, service);
                assert!(d.is_for(policies));
                for e in &entries {
                    let want = policies.allows(e, cluster, service, true);
                    assert_eq!(
                        d.allows(e, entity),
                        want,
                        "{} for {cluster}/{service}",
                        e.fqdn
                    );
                    allowed += usize::from(want);
                }
            }
        }
        // The sets decide differently: not everything is allowed or denied.
        assert!(
            allowed > 0 && allowed < sets.len() * 4 * entries.len(),
            "{allowed}"
        );
    }

    #[test]
    fn zones_are_label_wise_suffixes() {
        assert_eq!(zones_of("A.b.C."), vec!["a.b.c", "b.c", "c"]);
        assert_eq!(zones_of("x"), vec!["x"]);
    }

    /// Table: (allowed requesters, requester, service, requested) → condition.
    #[test]
    fn bilateral_table_with_default_policies() {
        let p = Policies::default_set();
        let cases: &[(&[&str], &str, &str, bool, Condition)] = &[
            (&[], "b1", "web", true, Condition::Granted),
            (&["b1/web"], "b1", "web", true, Condition::Granted),
            (&["b1"], "b1", "web", true, Condition::Granted),
            (
                &["b1/web"],
                "b1",
                "batch",
                true,
                Condition::NotAllowedByCallee,
            ),
            (&["c1"], "b1", "web", true, Condition::NotAllowedByCallee),
            (&["b1/web"], "b1", "web", false, Condition::NotRequested),
            (&["c1"], "b1", "web", false, Condition::NotAllowedByCallee),
        ];
        for (allowed, cluster, service, requested, want) in cases {
            let d = p.discover(&api(allowed), cluster, service, *requested);
            assert_eq!(
                d.condition, *want,
                "{allowed:?} {cluster}/{service} {requested}"
            );
            assert_eq!(d.allowed, *want == Condition::Granted);
        }
        let d = p.discover(&api(&["c1"]), "b1", "web", true);
        assert_eq!(
            d.reason,
            "b2/shop/api allows [c1]; b1/web is not among them"
        );
    }

    /// The same table through real Cedar evaluation (a non-default set), plus a forbid.
    #[test]
    fn cedar_evaluation_matches_and_forbid_wins() {
        let extra = r#"
@id("no-restricted-for-c")
forbid (principal in Xcc::Cluster::"c1", action == Xcc::Action::"discover", resource)
when { resource.labels.contains("tier=restricted") };
"#;
        let p = Policies::from_sources(&[("extra.cedar".into(), extra.into())]).expect("valid");
        assert!(!p.is_default_only());
        let d = p.discover(&api(&[]), "b1", "web", true);
        assert_eq!(
            (d.condition, d.policies.clone()),
            (Condition::Granted, vec!["bilateral".to_string()])
        );
        let d = p.discover(&api(&[]), "c1", "web", true);
        assert_eq!(d.condition, Condition::PolicyDenied);
        assert_eq!(d.policies, vec!["no-restricted-for-c"]);
        assert_eq!(d.reason, "forbidden by no-restricted-for-c");
        assert!(d.callee_admits && d.caller_requested && !d.policy_permits);
        let d = p.discover(&api(&["b1/web"]), "b1", "web", false);
        assert_eq!(d.condition, Condition::NotRequested);
    }

    #[test]
    fn announce_limits_zones() {
        let grant = r#"
@id("b2-zone")
permit (principal == Xcc::Cluster::"b2", action == Xcc::Action::"announce", resource)
when { resource.zones.contains("b2.example.org") };
"#;
        let p = Policies::from_sources(&[("zones.cedar".into(), grant.into())]).expect("valid");
        let mut e = api(&[]);
        assert!(p.announce("b2", &e).allowed, "clusterset names are open");
        e.fqdn = "api.b2.example.org".into();
        assert_eq!(p.announce("b2", &e).policies, vec!["b2-zone"]);
        assert!(p.announce("b2", &e).allowed);
        assert!(
            !p.announce("c1", &e).allowed,
            "another cluster cannot claim b2's zone"
        );
        e.fqdn = "login.bank.example".into();
        let v = p.announce("b2", &e);
        assert!(!v.allowed && v.policies.is_empty());
        // Default set: only clusterset names.
        assert!(!Policies::default_set().announce("b2", &e).allowed);
    }

    #[test]
    fn bad_policies_are_rejected_with_the_file_named() {
        let err = Policies::from_sources(&[("bad.cedar".into(), "permit(principal".into())])
            .err()
            .expect("syntax error");
        assert!(err.to_string().starts_with("bad.cedar: "), "{err}");
        let err = Policies::from_sources(&[(
            "typo.cedar".into(),
            r#"permit(principal, action == Xcc::Action::"discover", resource) when { resource.nosuch == "x" };"#.into(),
        )])
        .err()
        .expect("schema error");
        assert!(matches!(err, PolicyError::Invalid(_)), "{err}");
        let err = Policies::from_sources(&[(
            "dup.cedar".into(),
            "@id(\"bilateral\") permit(principal, action, resource);".into(),
        )])
        .err()
        .expect("duplicate");
        assert!(matches!(err, PolicyError::Duplicate { .. }), "{err}");
    }

    /// A policy can never silently stop matching. A label test that no
    /// service can carry to the policy is refused at load, naming the policy, the label and why;
    /// the labels a policy sees are the policy labels only.
    #[test]
    fn a_label_test_no_service_can_carry_is_refused_at_load() {
        for (label, why) in [
            (
                "connectivity.tanzu.vmware.com/tier=restricted",
                "not a Kubernetes label name",
            ),
            ("service-port=443", "a key xcc uses itself"),
            ("origin-namespace=kube-system", "a key xcc uses itself"),
            ("tier", "not a Kubernetes label name"),
            ("tier=Not Valid", "not a Kubernetes label value"),
            (
                &format!("tier={}", "x".repeat(64)),
                "not a Kubernetes label value",
            ),
        ] {
            for form in [
                format!("resource.labels.contains({label:?})"),
                format!("!resource.labels.containsAny([\"team=shop\", {label:?}])"),
                format!("resource.labels == [{label:?}]"),
            ] {
                let text = format!(
                    "@id(\"p\") forbid (principal, action == Xcc::Action::\"discover\", resource) when {{ {form} }};"
                );
                let err = Policies::from_sources(&[("l.cedar".into(), text.clone())])
                    .err()
                    .unwrap_or_else(|| panic!("accepted: {text}"));
                let shown = err.to_string();
                assert!(
                    matches!(&err, PolicyError::Label(e)
                        if e.file == "l.cedar" && e.id == "p" && e.label == label)
                        && shown.contains(why),
                    "{text}: {shown}"
                );
            }
        }
        // What a service can carry loads: plain names, dotted names, an empty value.
        let ok = r#"@id("p") forbid (principal, action == Xcc::Action::"discover", resource)
            when { resource.labels.containsAny(["tier=restricted", "team.name=a_b-c", "pci="]) };"#;
        assert!(Policies::from_sources(&[("ok.cedar".into(), ok.into())]).is_ok());
        // Cedar sees the policy labels only: neither the bare `tier` nor the control keys.
        let entity = service_entity(&api(&[])).expect("entity");
        let labels = entity.attr("labels").expect("labels").expect("value");
        assert_eq!(format!("{labels}"), r#"["tier=restricted"]"#);
    }

    /// The identity half of the one decision point. Only a cluster identity of
    /// this trust domain is a requesting cluster; look-alikes named `west` are refused.
    #[test]
    fn the_gate_binds_kind_and_trust_domain() {
        let gate = Gate::fixed("xcc.test", Policies::default_set());
        let policies = gate.policies();
        assert!(policies.allows(&api(&["west"]), "west", "", true));
        assert!(!policies.allows(&api(&["west"]), "north", "", true));
        assert!(!policies.allows(&api(&[]), "west", "", false));
        let forbid = r#"@id("f") forbid (principal in Xcc::Cluster::"west", action == Xcc::Action::"discover", resource);"#;
        let strict = Gate::fixed(
            "xcc.test",
            Policies::from_sources(&[("f.cedar".into(), forbid.into())]).expect("valid"),
        );
        assert!(!strict.policies().allows(&api(&[]), "west", "", true));
        assert!(strict.policies().allows(&api(&[]), "north", "", true));
        let changes = strict.subscribe();
        strict.set_policies(
            Policies::from_sources(&[("f.cedar".into(), forbid.into())]).expect("valid"),
        );
        assert!(
            !changes.has_changed().expect("open"),
            "the same sources change nothing"
        );
        strict.set_policies(Policies::default_set());
        assert!(changes.has_changed().expect("open"));
        assert!(strict.policies().allows(&api(&[]), "west", "", true));
        let cluster = |td: &str, name: &str| Identity::Cluster {
            trust_domain: td.into(),
            name: name.into(),
        };
        assert_eq!(
            gate.cluster_of(&cluster("xcc.test", "west")),
            Ok("west".into())
        );
        assert_eq!(
            gate.cluster_of(&Identity::Admin {
                trust_domain: "xcc.test".into(),
                name: "west".into()
            }),
            Err(IdentityRefused::NotACluster("admin/west".into()))
        );
        assert_eq!(
            gate.cluster_of(&Identity::External("west".into())),
            Err(IdentityRefused::NotACluster("external/west".into()))
        );
        let foreign = gate
            .cluster_of(&cluster("evil.test", "west"))
            .expect_err("foreign trust domain");
        assert_eq!(
            foreign.to_string(),
            "spiffe://evil.test/cluster/west belongs to trust domain \"evil.test\", not \"xcc.test\""
        );
        assert!(gate.admin_of(&cluster("xcc.test", "ops")).is_err());
        assert!(
            gate.admin_of(&Identity::Admin {
                trust_domain: "evil.test".into(),
                name: "ops".into()
            })
            .is_err(),
            "a stolen admin certificate of another domain opens nothing"
        );
        assert_eq!(
            tonic::Status::from(foreign).code(),
            tonic::Code::PermissionDenied
        );
    }

    /// `carry`: a child carries itself by default; more only by the parent's permit.
    #[test]
    fn carry_is_the_parents_decision() {
        let d = Policies::default_set();
        assert!(d.carry("c3", "c3").allowed);
        assert!(!d.carry("c3", "c2").allowed);
        let p = Policies::from_sources(&[(
            "carry.cedar".into(),
            carry_policy("b", &["b1", "b2"]).expect("names"),
        )])
        .expect("valid");
        assert!(p.carry("b", "b1").allowed);
        assert_eq!(p.carry("b", "b2").policies, vec!["carry-b"]);
        assert!(p.carry("b", "b").allowed, "itself, by the default");
        assert!(!p.carry("b", "c1").allowed);
        assert!(!p.carry("c", "b1").allowed);
        assert!(
            carry_policy("b", &["x\" || true || \""]).is_err(),
            "only cluster names reach the policy text"
        );
    }
}
