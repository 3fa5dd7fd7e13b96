//! What a watch event is about: the reconcile keys of imported records and of the objects the
//! binder manages. Pure.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::watcher;
use xcc_proto::crd::{
    CILIUM_GLOBAL_ANNOTATION, ENDPOINTSLICE_SERVICE_NAME_LABEL, Materialize, RemoteRegistry,
    ServiceRecord,
};
use xcc_proto::names::{self, FQDN_ANNOTATION, IMPORTED_LABEL, REMOTE_REGISTRY_LABEL};

use crate::apply::managed;
use crate::desired::GroupKey;
use crate::desired::cilium::{self, OriginKey};

/// One unit of reconciliation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// `Service` materialisation: the records of one namespace and canonical FQDN, and the
    /// Service, EndpointSlices and Endpoints made for them.
    Group(GroupKey),
    /// `CiliumGlobalService` materialisation: the records of one origin and the global Service
    /// with the origin's name and namespace.
    Global(OriginKey),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Group(g) => write!(f, "group {}/{}", g.namespace, g.fqdn),
            Key::Global(o) => write!(f, "global service {}/{}", o.namespace, o.name),
        }
    }
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Whether the record is an imported one.
pub fn is_imported(record: &ServiceRecord) -> bool {
    label(&record.metadata, IMPORTED_LABEL).is_some()
}

/// The RemoteRegistry an imported record came through.
pub fn remote_registry(record: &ServiceRecord) -> Option<&str> {
    label(&record.metadata, REMOTE_REGISTRY_LABEL)
}

/// The FQDN group of an imported record, whatever its materialisation.
pub fn group_key(record: &ServiceRecord) -> Option<GroupKey> {
    if !is_imported(record) {
        return None;
    }
    Some(GroupKey {
        namespace: record.metadata.namespace.clone()?,
        fqdn: names::canonical_fqdn(&record.spec.fqdn).ok()?,
    })
}

/// The origin of an imported record, whatever its materialisation.
pub fn origin_key(record: &ServiceRecord) -> Option<OriginKey> {
    if !is_imported(record) {
        return None;
    }
    record.spec.origin.as_ref().map(|o| OriginKey {
        namespace: o.namespace.clone(),
        name: o.name.clone(),
    })
}

/// Every key an imported record can contribute to: both materialisations, so a change of mode
/// reconciles the key it leaves as well as the one it enters.
pub fn record_keys(record: &ServiceRecord) -> Vec<Key> {
    group_key(record)
        .map(Key::Group)
        .into_iter()
        .chain(origin_key(record).map(Key::Global))
        .collect()
}

/// Whether a record of the given mode contributes to `key`.
pub fn contributes(record: &ServiceRecord, mode: Materialize, key: &Key) -> bool {
    match (key, mode) {
        (Key::Group(g), Materialize::Service) => group_key(record).as_ref() == Some(g),
        (Key::Global(o), Materialize::CiliumGlobalService) => {
            origin_key(record).as_ref() == Some(o)
        }
        _ => false,
    }
}

/// Whether a Service is a binder-made Cilium global Service, of any install.
fn is_any_global_service(service: &Service) -> bool {
    managed(&service.metadata)
        && annotation(&service.metadata, CILIUM_GLOBAL_ANNOTATION) == Some("true")
}

/// Whether a Service is a Cilium global Service made by the binder of `install` (its
/// namespace); another install's, or one without the install annotation, is not.
pub fn is_global_service(service: &Service, install: &str) -> bool {
    is_any_global_service(service) && cilium::is_ours(&service.metadata, install)
}

/// The key of a Service the binder of `namespace` manages: one of its global Services' origin,
/// or (in `namespace`) the FQDN group named by its annotation. `None` for anything else,
/// another install's global Services included.
pub fn service_key(service: &Service, namespace: &str) -> Option<Key> {
    if !managed(&service.metadata) {
        return None;
    }
    let ns = service.metadata.namespace.as_deref()?;
    if is_any_global_service(service) {
        if !is_global_service(service, namespace) {
            return None;
        }
        return Some(Key::Global(OriginKey {
            namespace: ns.to_string(),
            name: service.metadata.name.clone()?,
        }));
    }
    if ns != namespace {
        return None;
    }
    let fqdn = names::canonical_fqdn(annotation(&service.metadata, FQDN_ANNOTATION)?).ok()?;
    Some(Key::Group(GroupKey {
        namespace: ns.to_string(),
        fqdn,
    }))
}

/// The Service name an EndpointSlice belongs to.
pub fn slice_service_name(meta: &ObjectMeta) -> Option<&str> {
    label(meta, ENDPOINTSLICE_SERVICE_NAME_LABEL)
}

/// Each RemoteRegistry's `spec.materialize` as last seen, so that only a change of it moves the
/// registry's records between keys. Anything else about a RemoteRegistry (its status, which
/// the registry rewrites whenever its import count changes) concerns no key: reconciling every
/// record of the registry on each such event cost a full pass of reads per imported record.
/// A registry that is not known counts as `Service`, as in the binder's reconcile.
#[derive(Debug, Default)]
pub struct Modes {
    seen: HashMap<String, Materialize>,
    listing: HashMap<String, Materialize>,
}

impl Modes {
    /// Take `event` in; the name of the registry whose records changed materialisation, if
    /// any. A relist changes nothing here (every key is reconciled after one anyway).
    pub fn changed(&mut self, event: &watcher::Event<RemoteRegistry>) -> Option<String> {
        let (name, before, now) = match event {
            watcher::Event::Apply(rr) => {
                let now = rr.spec.materialize();
                (rr.name_any(), self.seen.insert(rr.name_any(), now), now)
            }
            watcher::Event::Delete(rr) => (
                rr.name_any(),
                self.seen.remove(&rr.name_any()),
                Materialize::default(),
            ),
            watcher::Event::Init => {
                self.listing.clear();
                return None;
            }
            watcher::Event::InitApply(rr) => {
                self.listing.insert(rr.name_any(), rr.spec.materialize());
                return None;
            }
            watcher::Event::InitDone => {
                self.seen = std::mem::take(&mut self.listing);
                return None;
            }
        };
        (before.unwrap_or_default() != now).then_some(name)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record(labels: serde_json::Value, fqdn: &str, origin: serde_json::Value) -> ServiceRecord {
        serde_json::from_value(json!({
            "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "ServiceRecord",
            "metadata": {"name": "r", "namespace": "xcc", "labels": labels},
            "spec": {"fqdn": fqdn, "endpoints": [], "origin": origin},
        }))
        .unwrap()
    }

    #[test]
    fn imported_records_map_to_both_keys() {
        let r = record(
            json!({"connectivity.tanzu.vmware.com/imported": ""}),
            "Web.Shop.Example.",
            json!({"namespace": "shop", "name": "web"}),
        );
        let group = Key::Group(GroupKey {
            namespace: "xcc".into(),
            fqdn: "web.shop.example".into(),
        });
        let global = Key::Global(OriginKey {
            namespace: "shop".into(),
            name: "web".into(),
        });
        assert_eq!(record_keys(&r), [group.clone(), global.clone()]);
        assert!(contributes(&r, Materialize::Service, &group));
        assert!(!contributes(&r, Materialize::Service, &global));
        assert!(contributes(&r, Materialize::CiliumGlobalService, &global));
        assert!(!contributes(&r, Materialize::CiliumGlobalService, &group));

        let exported = record(
            json!({"connectivity.tanzu.vmware.com/export": ""}),
            "web.shop.example",
            json!({"namespace": "shop", "name": "web"}),
        );
        assert!(record_keys(&exported).is_empty());
    }

    #[test]
    fn managed_services_map_to_their_key() {
        let svc = |meta: serde_json::Value| -> Service {
            serde_json::from_value(json!({"metadata": meta})).unwrap()
        };
        let managed = json!({"app.kubernetes.io/managed-by": "xcc-binder"});
        assert_eq!(
            service_key(
                &svc(
                    json!({"name": "web-1234", "namespace": "xcc", "labels": managed,
                    "annotations": {"connectivity.tanzu.vmware.com/fqdn": "WEB.x"}})
                ),
                "xcc"
            ),
            Some(Key::Group(GroupKey {
                namespace: "xcc".into(),
                fqdn: "web.x".into()
            }))
        );
        assert_eq!(
            service_key(
                &svc(
                    json!({"name": "web", "namespace": "shop", "labels": managed,
                    "annotations": {"connectivity.tanzu.vmware.com/fqdn": "web.x",
                                    "service.cilium.io/global": "true",
                                    "binder.xcc/install": "xcc"}})
                ),
                "xcc"
            ),
            Some(Key::Global(OriginKey {
                namespace: "shop".into(),
                name: "web".into()
            }))
        );
        // Another install's global Service, or one without the install annotation, is not
        // ours: no key, in any namespace (in the binder's own, not a group either).
        for ns in ["shop", "xcc"] {
            for install in [Some("other"), None] {
                let mut annotations = json!({"connectivity.tanzu.vmware.com/fqdn": "web.x",
                                             "service.cilium.io/global": "true"});
                if let Some(install) = install {
                    annotations["binder.xcc/install"] = json!(install);
                }
                let foreign = svc(json!({"name": "web", "namespace": ns, "labels": managed,
                                         "annotations": annotations}));
                assert_eq!(service_key(&foreign, "xcc"), None, "{ns} {install:?}");
            }
        }
        // Not managed, or a group Service outside the binder's namespace: no key.
        assert_eq!(
            service_key(
                &svc(json!({"name": "web-1234", "namespace": "xcc",
                    "annotations": {"connectivity.tanzu.vmware.com/fqdn": "web.x"}})),
                "xcc"
            ),
            None
        );
        assert_eq!(
            service_key(
                &svc(
                    json!({"name": "web-1234", "namespace": "other", "labels": managed,
                    "annotations": {"connectivity.tanzu.vmware.com/fqdn": "web.x"}})
                ),
                "xcc"
            ),
            None
        );
    }

    #[test]
    fn only_a_change_of_materialize_moves_a_registrys_records() {
        let rr = |materialize: Option<&str>, imported: i64| -> RemoteRegistry {
            let mut spec =
                json!({"address": "b:443", "tlsConfig": {"serverCA": "", "serverName": "b"}});
            if let Some(m) = materialize {
                spec["materialize"] = json!(m);
            }
            serde_json::from_value(json!({
                "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1", "kind": "RemoteRegistry",
                "metadata": {"name": "b", "namespace": "xcc"},
                "spec": spec,
                "status": {"importedRecords": imported},
            }))
            .unwrap()
        };
        let mut modes = Modes::default();
        let apply = |m: &mut Modes, r| m.changed(&watcher::Event::Apply(r));
        // New, with the default: its records were `Service` already.
        assert_eq!(apply(&mut modes, rr(None, 0)), None);
        // The registry writes its status with every import: no key concerned.
        assert_eq!(apply(&mut modes, rr(None, 1)), None);
        assert_eq!(apply(&mut modes, rr(Some("Service"), 2)), None);
        assert_eq!(
            apply(&mut modes, rr(Some("CiliumGlobalService"), 2)),
            Some("b".to_string())
        );
        assert_eq!(apply(&mut modes, rr(Some("CiliumGlobalService"), 3)), None);
        // Gone: its records fall back to `Service`.
        assert_eq!(
            modes.changed(&watcher::Event::Delete(rr(Some("CiliumGlobalService"), 3))),
            Some("b".to_string())
        );
        assert_eq!(
            apply(&mut modes, rr(Some("CiliumGlobalService"), 0)),
            Some("b".to_string())
        );
        // A relist replaces what was seen without naming anything.
        assert_eq!(modes.changed(&watcher::Event::Init), None);
        assert_eq!(modes.changed(&watcher::Event::InitDone), None);
        assert_eq!(apply(&mut modes, rr(None, 0)), None);
        assert_eq!(modes.changed(&watcher::Event::Delete(rr(None, 0))), None);
    }
}
