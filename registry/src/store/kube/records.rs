//! Pure logic of the Kubernetes store's ServiceRecords: which records are exported, what the
//! imported record of a remote's import looks like (XCC v1's import, with only allow-listed
//! annotations, the canonical FQDN and owner references kept right), whether a stored record
//! already matches it, and what a persist of a remote's complete import set has to write and
//! delete. No I/O here; [`super::sink`] does the API calls.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use xcc_proto::crd::{ServiceRecord, ServiceRecordSpec};
use xcc_proto::names::{
    self, API_VERSION, IMPORTED_LABEL, REMOTE_REGISTRY_KIND, REMOTE_REGISTRY_LABEL,
};

use crate::hamlet::convert::Imported;
use crate::store::model::{
    ImportedRecordError, imported_endpoints, imported_origin, imported_ports,
};

/// Label selector of the records this registry exports: the export label, and never an
/// imported record (so nothing is re-exported transitively).
pub fn export_selector() -> String {
    format!("{},!{IMPORTED_LABEL}", names::EXPORT_LABEL)
}

/// Label selector of the imported records of the RemoteRegistry `remote`.
pub fn imports_selector(remote: &str) -> String {
    format!("{IMPORTED_LABEL},{REMOTE_REGISTRY_LABEL}={remote}")
}

/// Whether a record is an export this registry serves: it carries the export label and not the
/// imported label (what [`export_selector`] selects).
pub fn is_export(sr: &ServiceRecord) -> bool {
    let labels = sr.metadata.labels.as_ref();
    labels.is_some_and(|l| l.contains_key(names::EXPORT_LABEL) && !l.contains_key(IMPORTED_LABEL))
}

/// The RemoteRegistry that owns a remote's imports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub name: String,
    pub uid: String,
}

impl Owner {
    /// The owner reference every imported record carries, exactly as XCC v1 writes it.
    pub fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: API_VERSION.to_string(),
            kind: REMOTE_REGISTRY_KIND.to_string(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            ..OwnerReference::default()
        }
    }
}

/// The annotations an imported record may carry: the control keys every path in keeps
/// ([`crate::peer_labels`], which already validated the values). Policy labels are not written
/// on imported records: no policy at the importer decides about its imports.
const IMPORTED_ANNOTATIONS: [&str; 14] = crate::peer_labels::CONTROL_KEYS;

fn allowed_annotations(all: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    all.into_iter()
        .flatten()
        .filter(|(k, _)| IMPORTED_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The imported record of `imported` from `owner`, in `namespace` (as XCC v1 names it): name =
/// canonical FQDN + `-` + hash of the RemoteRegistry name, the imported and remote-registry labels,
/// the allow-listed annotations, the owner reference, and the canonical FQDN (lowercase, no
/// trailing dot).
pub fn imported_record(
    owner: &Owner,
    namespace: &str,
    imported: &Imported,
) -> Result<ServiceRecord, ImportedRecordError> {
    let name = names::imported_record_name(&imported.fqdn, &owner.name)?;
    let labels = BTreeMap::from([
        (IMPORTED_LABEL.to_string(), String::new()),
        (REMOTE_REGISTRY_LABEL.to_string(), owner.name.clone()),
    ]);
    let annotations = allowed_annotations(Some(&imported.labels));
    Ok(ServiceRecord {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner.reference()]),
            ..ObjectMeta::default()
        },
        spec: ServiceRecordSpec {
            fqdn: imported.fqdn.clone(),
            endpoints: imported_endpoints(imported)?,
            ports: imported_ports(imported),
            origin: imported_origin(imported),
            ..ServiceRecordSpec::default()
        },
        status: None,
    })
}

/// Whether a record is an import of the RemoteRegistry `remote`: both labels, whatever its
/// owner reference says (a RemoteRegistry re-created under the same name takes its records
/// back and fixes the owner reference).
pub fn is_import_of(sr: &ServiceRecord, remote: &str) -> bool {
    let labels = sr.metadata.labels.as_ref();
    labels.is_some_and(|l| {
        l.contains_key(IMPORTED_LABEL)
            && l.get(REMOTE_REGISTRY_LABEL).map(String::as_str) == Some(remote)
    })
}

/// Whether `sr` carries an owner reference to the RemoteRegistry with `uid`.
pub fn owned_by(sr: &ServiceRecord, owner: &Owner) -> bool {
    sr.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == owner.uid && o.kind == REMOTE_REGISTRY_KIND && o.name == owner.name)
}

/// Records this registry may delete for `owner`: its labels AND its owner UID (never another
/// remote's imports, an exported record or one someone else made).
pub fn deletable(sr: &ServiceRecord, owner: &Owner) -> bool {
    is_import_of(sr, &owner.name) && owned_by(sr, owner)
}

/// Whether `current` already has everything the registry owns in `desired`: spec, labels,
/// exactly the allow-listed annotations, the owner reference, and no reference to an earlier
/// RemoteRegistry of the same name.
pub fn up_to_date(current: &ServiceRecord, desired: &ServiceRecord) -> bool {
    let labels_present = desired
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| current.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v));
    let want_refs = desired.metadata.owner_references.as_deref().unwrap_or(&[]);
    let have_refs = current.metadata.owner_references.as_deref().unwrap_or(&[]);
    let refs_ok = want_refs.iter().all(|w| {
        have_refs.contains(w)
            && !have_refs
                .iter()
                .any(|h| h.kind == w.kind && h.name == w.name && h.uid != w.uid)
    });
    current.spec == desired.spec
        && labels_present
        && allowed_annotations(current.metadata.annotations.as_ref())
            == allowed_annotations(desired.metadata.annotations.as_ref())
        && refs_ok
}

/// What persisting a remote's complete import set has to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Records to server-side apply (new or different).
    pub apply: Vec<ServiceRecord>,
    /// Names among `apply` that `current` does not hold at all: check that no record of that
    /// name appeared since `current` was observed before creating it.
    pub unseen: BTreeSet<String>,
    /// Records to delete: (name, uid) — imports of this remote and owner that are no longer
    /// imported.
    pub delete: Vec<(String, String)>,
    /// Imports whose record name is taken by a record this registry does not own: left alone.
    pub conflicts: Vec<String>,
    /// Imports that have no valid record (name too long, bad port): (fqdn, reason).
    pub invalid: Vec<(String, ImportedRecordError)>,
    /// Number of imports whose record is (or will be after `apply`) in place.
    pub imported: usize,
}

/// Compare the desired records of `imports` with `current` (the records in the registry's
/// namespace by name, any labels) and plan the writes.
pub fn plan(
    owner: &Owner,
    namespace: &str,
    imports: &BTreeMap<String, Imported>,
    current: &BTreeMap<String, ServiceRecord>,
) -> Plan {
    let mut out = Plan::default();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    for imported in imports.values() {
        let desired = match imported_record(owner, namespace, imported) {
            Ok(d) => d,
            Err(e) => {
                out.invalid.push((imported.fqdn.clone(), e));
                continue;
            }
        };
        let name = desired.metadata.name.clone().unwrap_or_default();
        if !wanted.insert(name.clone()) {
            // Two FQDNs with the same canonical name cannot happen (the client keys by the
            // canonical FQDN); keep the first.
            continue;
        }
        match current.get(&name) {
            Some(cur) if !is_import_of(cur, &owner.name) => out.conflicts.push(name),
            Some(cur) if up_to_date(cur, &desired) => out.imported += 1,
            found => {
                if found.is_none() {
                    out.unseen.insert(name);
                }
                out.imported += 1;
                out.apply.push(desired);
            }
        }
    }
    for (name, r) in current {
        if !wanted.contains(name) && deletable(r, owner) {
            out.delete
                .push((name.to_string(), r.metadata.uid.clone().unwrap_or_default()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Endpoint as CatEndpoint;
    use xcc_proto::crd::Origin;
    use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
    use xcc_proto::names::SERVICE_PORT_ANNOTATION;

    fn owner() -> Owner {
        Owner {
            name: "some-remote-registry".into(),
            uid: "remote-registry-uid".into(),
        }
    }

    fn imported(fqdn: &str, labels: &[(&str, &str)]) -> Imported {
        Imported {
            fqdn: fqdn.into(),
            raw_fqdn: fqdn.into(),
            endpoints: vec![CatEndpoint {
                address: "10.0.0.1".into(),
                port: 443,
            }],
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cluster: None,
            ports: vec![],
        }
    }

    fn record(name: &str, labels: &[(&str, &str)], owner_uid: Option<&str>) -> ServiceRecord {
        ServiceRecord {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                owner_references: owner_uid.map(|uid| {
                    vec![
                        Owner {
                            name: "some-remote-registry".into(),
                            uid: uid.into(),
                        }
                        .reference(),
                    ]
                }),
                ..ObjectMeta::default()
            },
            spec: ServiceRecordSpec {
                fqdn: "x".into(),
                ..Default::default()
            },
            status: None,
        }
    }

    fn by_name(records: Vec<ServiceRecord>) -> BTreeMap<String, ServiceRecord> {
        records
            .into_iter()
            .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
            .collect()
    }

    const OURS: [(&str, &str); 2] = [
        (IMPORTED_LABEL, ""),
        (REMOTE_REGISTRY_LABEL, "some-remote-registry"),
    ];

    #[test]
    fn imported_record_keeps_the_headless_annotations() {
        let headless = [
            (xcc_proto::mcs::HEADLESS_ANNOTATION, "true"),
            (xcc_proto::mcs::HOSTNAMES_ANNOTATION, "10.0.0.1=web-0"),
        ];
        let r =
            imported_record(&owner(), "xcc", &imported("web.example", &headless)).expect("valid");
        assert_eq!(
            r.metadata.annotations,
            Some(
                headless
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            )
        );
    }

    #[test]
    fn imported_record_is_named_labelled_annotated_and_owned_as_the_reference() {
        let r = imported_record(
            &owner(),
            "cross-cluster-connectivity",
            &imported(
                "some-service.some.domain",
                &[(SERVICE_PORT_ANNOTATION, "443"), ("other/label", "x")],
            ),
        )
        .expect("valid");
        assert_eq!(
            r.metadata.name.as_deref(),
            Some("some-service.some.domain-06df7236")
        );
        assert_eq!(
            r.metadata.namespace.as_deref(),
            Some("cross-cluster-connectivity")
        );
        assert_eq!(
            r.metadata.labels,
            Some(BTreeMap::from([
                (IMPORTED_LABEL.to_string(), String::new()),
                (
                    REMOTE_REGISTRY_LABEL.to_string(),
                    "some-remote-registry".to_string()
                )
            ]))
        );
        assert_eq!(
            r.metadata.annotations,
            Some(BTreeMap::from([(
                SERVICE_PORT_ANNOTATION.to_string(),
                "443".to_string()
            )]))
        );
        let refs = r.metadata.owner_references.expect("owner");
        assert_eq!(refs.len(), 1);
        assert_eq!(
            (
                refs[0].api_version.as_str(),
                refs[0].kind.as_str(),
                refs[0].name.as_str(),
                refs[0].uid.as_str(),
                refs[0].controller,
                refs[0].block_owner_deletion
            ),
            (
                "connectivity.tanzu.vmware.com/v1alpha1",
                "RemoteRegistry",
                "some-remote-registry",
                "remote-registry-uid",
                None,
                None
            )
        );
        assert_eq!(r.spec.fqdn, "some-service.some.domain");
        assert_eq!(r.spec.origin, None);
    }

    #[test]
    fn imported_record_carries_the_exported_origin() {
        let r = imported_record(
            &owner(),
            "cross-cluster-connectivity",
            &imported(
                "api.shop.svc.clusterset.local",
                &[
                    (ORIGIN_NAMESPACE_ANNOTATION, "shop"),
                    (ORIGIN_NAME_ANNOTATION, "api"),
                ],
            ),
        )
        .expect("valid");
        assert_eq!(
            r.spec.origin,
            Some(Origin {
                cluster: None,
                namespace: "shop".into(),
                name: "api".into(),
                kind: None,
            })
        );
        assert_eq!(
            r.metadata.annotations.expect("annotations").len(),
            2,
            "both origin annotations are kept"
        );
        // A hierarchy import names its owner: the record's source cluster.
        let mut from_owner = imported(
            "api.shop.svc.clusterset.local",
            &[
                (ORIGIN_NAMESPACE_ANNOTATION, "shop"),
                (ORIGIN_NAME_ANNOTATION, "api"),
            ],
        );
        from_owner.cluster = Some("east".into());
        let r = imported_record(&owner(), "ns", &from_owner).expect("valid");
        assert_eq!(
            r.spec.origin.as_ref().and_then(|o| o.cluster.as_deref()),
            Some("east")
        );
        assert_eq!(xcc_proto::mcs::source_cluster(&r), Some("east"));
        assert_eq!(
            crate::store::model::imported_cluster(&r).as_deref(),
            Some("east")
        );
    }

    #[test]
    fn plan_applies_new_and_changed_keeps_equal_and_deletes_only_our_stale_records() {
        let o = owner();
        let imports: BTreeMap<String, Imported> = ["a.some.domain", "b.some.domain"]
            .iter()
            .map(|f| (f.to_string(), imported(f, &[])))
            .collect();
        let a = imported_record(&o, "ns", &imports["a.some.domain"]).expect("a");
        let mut current = vec![a.clone()];
        current.push(record(
            "stale.some.domain-06df7236",
            &OURS,
            Some("remote-registry-uid"),
        ));
        // Our labels but an earlier RemoteRegistry's UID: not ours to delete.
        current.push(record(
            "old.some.domain-06df7236",
            &OURS,
            Some("earlier-uid"),
        ));
        // Another remote's import, an export and an unlabelled record: never touched.
        current.push(record(
            "x-1",
            &[(IMPORTED_LABEL, ""), (REMOTE_REGISTRY_LABEL, "other")],
            Some("remote-registry-uid"),
        ));
        current.push(record("x-2", &[(names::EXPORT_LABEL, "")], None));
        current.push(record("x-3", &[], Some("remote-registry-uid")));
        let p = plan(&o, "ns", &imports, &by_name(current));
        assert_eq!(
            p.apply
                .iter()
                .map(|r| r.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>(),
            ["b.some.domain-06df7236"]
        );
        assert_eq!(
            p.delete,
            [(
                "stale.some.domain-06df7236".to_string(),
                "uid-stale.some.domain-06df7236".to_string()
            )]
        );
        assert!(p.conflicts.is_empty() && p.invalid.is_empty());
        assert_eq!(p.imported, 2);
        assert_eq!(
            p.unseen,
            BTreeSet::from(["b.some.domain-06df7236".to_string()])
        );
    }

    #[test]
    fn a_foreign_record_of_the_same_name_is_a_conflict_and_left_alone() {
        let o = owner();
        let imports = BTreeMap::from([(
            "some-service.some.domain".to_string(),
            imported("some-service.some.domain", &[]),
        )]);
        let current = vec![record("some-service.some.domain-06df7236", &[], None)];
        let p = plan(&o, "ns", &imports, &by_name(current));
        assert_eq!(p.conflicts, ["some-service.some.domain-06df7236"]);
        assert!(p.apply.is_empty() && p.delete.is_empty());
        assert_eq!(p.imported, 0);
    }

    #[test]
    fn owner_reference_of_a_recreated_registry_is_reconciled() {
        let o = owner();
        let i = imported("a.some.domain", &[]);
        let desired = imported_record(&o, "ns", &i).expect("a");
        let mut stale_owner = desired.clone();
        stale_owner.metadata.owner_references = Some(vec![
            Owner {
                name: o.name.clone(),
                uid: "earlier-uid".into(),
            }
            .reference(),
        ]);
        assert!(!up_to_date(&stale_owner, &desired));
        let mut both = desired.clone();
        both.metadata.owner_references = Some(vec![
            o.reference(),
            Owner {
                name: o.name.clone(),
                uid: "earlier-uid".into(),
            }
            .reference(),
        ]);
        assert!(!up_to_date(&both, &desired));
        assert!(up_to_date(&desired, &desired));
        // Someone else's annotation outside the allow-list does not count as a difference.
        let mut extra = desired.clone();
        extra.metadata.annotations = Some(BTreeMap::from([("team".into(), "x".into())]));
        assert!(up_to_date(&extra, &desired));
    }

    #[test]
    fn oversized_names_are_invalid_not_written() {
        let long = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(55)
        );
        let imports = BTreeMap::from([(long.clone(), imported(&long, &[]))]);
        let p = plan(&owner(), "ns", &imports, &BTreeMap::new());
        assert!(p.apply.is_empty());
        assert_eq!(p.invalid.len(), 1);
        assert_eq!(p.invalid[0].0, long);
    }

    #[test]
    fn exports_exclude_imported_records() {
        let mut r = record("web", &[(names::EXPORT_LABEL, "")], None);
        assert!(is_export(&r));
        r.metadata
            .labels
            .get_or_insert_default()
            .insert(IMPORTED_LABEL.into(), String::new());
        assert!(!is_export(&r));
        assert_eq!(
            export_selector(),
            "connectivity.tanzu.vmware.com/export,!connectivity.tanzu.vmware.com/imported"
        );
    }
}
