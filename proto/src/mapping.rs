//! Namespace mapping: the one function the publisher, the binder and the DNS server
//! share to translate between a cluster's local namespaces and the clusterset namespaces that
//! services travel under.
//!
//! A namespace `foo` annotated `multicluster.kubernetes.io/namespace: bar` belongs to clusterset
//! namespace `bar`: exports from `foo` are published as `bar`, imports for `bar` are materialised
//! in `foo`, and pods in `foo` resolve `<svc>` / `<svc>.foo` / `<svc>.foo.svc.clusterset.local`
//! to `<svc>.bar.svc.clusterset.local`. A namespace without the annotation (or with a value that
//! is not a DNS-1123 label) belongs to the clusterset namespace of the same name — the MCS
//! "namespace sameness" default.
//!
//! Also here, because this module owns the contract between the binder (which writes them) and
//! the DNS server (which reads them): the annotations naming the origin of an imported Service.

use std::collections::BTreeMap;

use thiserror::Error;

/// Namespace annotation naming the clusterset namespace a local namespace belongs to.
pub const NAMESPACE_ANNOTATION: &str = "multicluster.kubernetes.io/namespace";
/// Annotation the binder puts on an imported Service: the clusterset namespace of the exported
/// service (already mapped by the exporting cluster). With [`ORIGIN_NAME_ANNOTATION`] it gives
/// the Service its MCS name `<origin-name>.<origin-namespace>.svc.clusterset.local`.
pub const ORIGIN_NAMESPACE_ANNOTATION: &str = "connectivity.tanzu.vmware.com/origin-namespace";
/// Annotation the binder puts on an imported Service: the exported service's name.
pub const ORIGIN_NAME_ANNOTATION: &str = "connectivity.tanzu.vmware.com/origin-name";

/// Longest namespace name (a DNS-1123 label).
const MAX_NAMESPACE_LEN: usize = 63;

/// Why an annotation value is not a usable namespace name.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum MappingError {
    /// The value is not a DNS-1123 label (1–63 characters of `[a-z0-9-]`, alphanumeric at both
    /// ends). Kubernetes namespace names follow the same rule.
    #[error(
        "invalid clusterset namespace {value:?}: must be 1-63 characters of lowercase letters, \
         digits and '-', starting and ending with a letter or digit"
    )]
    InvalidNamespace {
        /// The value as given.
        value: String,
    },
}

/// Check that `value` is a DNS-1123 label, the shape of a Kubernetes namespace name.
pub fn validate_namespace(value: &str) -> Result<&str, MappingError> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let ok = !value.is_empty()
        && value.len() <= MAX_NAMESPACE_LEN
        && value.chars().all(|c| alnum(c) || c == '-')
        && value.starts_with(alnum)
        && value.ends_with(alnum);
    if ok {
        Ok(value)
    } else {
        Err(MappingError::InvalidNamespace {
            value: value.to_string(),
        })
    }
}

/// The clusterset namespace of local namespace `namespace` whose mapping annotation (the value of
/// [`NAMESPACE_ANNOTATION`], if any) is `annotation`.
///
/// The annotation wins when it is a valid namespace name (surrounding whitespace ignored);
/// otherwise the namespace maps to itself. Use [`validate_namespace`] to report a bad value.
pub fn clusterset_namespace_of<'a>(namespace: &'a str, annotation: Option<&'a str>) -> &'a str {
    annotation
        .map(str::trim)
        .and_then(|value| validate_namespace(value).ok())
        .unwrap_or(namespace)
}

/// The mapping of every namespace of a cluster that is known (from a Namespace watch). Pure,
/// cheap to clone for small clusters; lookups of unknown namespaces fall back to identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceMapping {
    /// Known local namespace → its clusterset namespace (identity entries included).
    local_to_clusterset: BTreeMap<String, String>,
}

impl NamespaceMapping {
    /// An empty mapping: every namespace maps to itself.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record (or update) namespace `namespace` with its `annotations`. Returns an error naming
    /// the bad value when the mapping annotation is present but invalid; the namespace is then
    /// recorded as mapping to itself.
    pub fn apply(
        &mut self,
        namespace: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), MappingError> {
        let value = annotations.get(NAMESPACE_ANNOTATION).map(String::as_str);
        let target = clusterset_namespace_of(namespace, value).to_string();
        self.local_to_clusterset
            .insert(namespace.to_string(), target);
        match value {
            Some(v) => validate_namespace(v.trim()).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Forget namespace `namespace` (it was deleted).
    pub fn remove(&mut self, namespace: &str) {
        self.local_to_clusterset.remove(namespace);
    }

    /// True when `namespace` is known and maps to a different clusterset namespace.
    pub fn is_mapped(&self, namespace: &str) -> bool {
        self.local_to_clusterset
            .get(namespace)
            .is_some_and(|cs| cs != namespace)
    }

    /// The clusterset namespace of local namespace `namespace` (itself when unknown or
    /// unannotated). Publisher: the namespace an export from `namespace` is published under.
    pub fn clusterset_namespace<'a>(&'a self, namespace: &'a str) -> &'a str {
        self.local_to_clusterset
            .get(namespace)
            .map(String::as_str)
            .unwrap_or(namespace)
    }

    /// The local namespaces materialising clusterset namespace `clusterset` (binder: where an
    /// import for `clusterset` lands), sorted: every known namespace whose clusterset namespace
    /// is `clusterset`, plus `clusterset` itself when it is not a known namespace (unknown
    /// namespaces map to themselves; the caller decides what to do if it does not exist).
    pub fn local_namespaces<'a>(&'a self, clusterset: &'a str) -> Vec<&'a str> {
        let mut out: Vec<&str> = self
            .local_to_clusterset
            .iter()
            .filter(|(_, cs)| cs.as_str() == clusterset)
            .map(|(local, _)| local.as_str())
            .collect();
        if !self.local_to_clusterset.contains_key(clusterset) {
            out.push(clusterset);
            out.sort_unstable();
        }
        out
    }

    /// Number of known namespaces.
    pub fn len(&self) -> usize {
        self.local_to_clusterset.len()
    }

    /// True when no namespace is known.
    pub fn is_empty(&self) -> bool {
        self.local_to_clusterset.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(NAMESPACE_ANNOTATION.to_string(), value.to_string())])
    }

    /// The namespace mapping's example: `foo` annotated `bar` (its names resolve in `bar`), `baz`
    /// unannotated, `qux` unknown to the mapping.
    fn example_mapping() -> NamespaceMapping {
        let mut m = NamespaceMapping::new();
        m.apply("foo", &annotated("bar")).unwrap();
        m.apply("baz", &BTreeMap::new()).unwrap();
        m
    }

    #[test]
    fn namespace_mapping_forward_table() {
        let m = example_mapping();
        let table = [
            ("foo", "bar"),
            ("baz", "baz"),
            ("qux", "qux"),
            ("bar", "bar"),
        ];
        for (local, clusterset) in table {
            assert_eq!(m.clusterset_namespace(local), clusterset, "local {local}");
        }
        assert!(m.is_mapped("foo"));
        assert!(!m.is_mapped("baz"));
        assert!(!m.is_mapped("qux"));
    }

    #[test]
    fn namespace_mapping_inverse_table() {
        let mut m = example_mapping();
        // `bar` is not a known namespace: imports for `bar` land in `foo` (mapped) and in `bar`
        // (namespace sameness; the binder skips it if it does not exist).
        assert_eq!(m.local_namespaces("bar"), vec!["bar", "foo"]);
        assert_eq!(m.local_namespaces("baz"), vec!["baz"]);
        assert_eq!(m.local_namespaces("qux"), vec!["qux"]);
        // `foo` is known and mapped elsewhere: nothing materialises clusterset namespace `foo`.
        assert!(m.local_namespaces("foo").is_empty());
        // Once `bar` exists and is itself mapped away, only `foo` materialises `bar`.
        m.apply("bar", &annotated("elsewhere")).unwrap();
        assert_eq!(m.local_namespaces("bar"), vec!["foo"]);
        assert_eq!(m.local_namespaces("elsewhere"), vec!["bar", "elsewhere"]);
    }

    #[test]
    fn updates_and_removal_change_the_mapping() {
        let mut m = example_mapping();
        m.apply("foo", &BTreeMap::new()).unwrap();
        assert_eq!(m.clusterset_namespace("foo"), "foo");
        assert_eq!(m.local_namespaces("bar"), vec!["bar"]);
        m.apply("foo", &annotated("bar")).unwrap();
        m.remove("foo");
        assert_eq!(m.clusterset_namespace("foo"), "foo");
        assert_eq!(m.len(), 1);
        assert!(!m.is_empty());
    }

    #[test]
    fn invalid_annotation_maps_to_itself_and_is_reported() {
        let mut m = NamespaceMapping::new();
        for bad in ["", "Bar", "-bar", "bar-", "b_r", &"a".repeat(64)] {
            let err = m.apply("foo", &annotated(bad)).unwrap_err();
            assert_eq!(
                err,
                MappingError::InvalidNamespace {
                    value: bad.trim().to_string()
                }
            );
            assert_eq!(m.clusterset_namespace("foo"), "foo", "value {bad:?}");
        }
        m.apply("foo", &annotated(" bar ")).unwrap();
        assert_eq!(m.clusterset_namespace("foo"), "bar");
    }

    #[test]
    fn the_pure_function_alone() {
        assert_eq!(clusterset_namespace_of("foo", Some("bar")), "bar");
        assert_eq!(clusterset_namespace_of("foo", None), "foo");
        assert_eq!(clusterset_namespace_of("foo", Some("BAR")), "foo");
        assert_eq!(validate_namespace("a").unwrap(), "a");
        assert_eq!(validate_namespace(&"a".repeat(63)).unwrap().len(), 63);
    }
}
