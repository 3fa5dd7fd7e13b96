//! The resource registry: which group/version/plural the fake serves, with what scope, kind,
//! subresources and server-side behaviour (generation policy, conditional updates, delete
//! responses, list merge keys). Requests are resolved against it in `routes` (there is no
//! discovery); write pipelines read its [`Behavior`].

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::schema::Schema;
use crate::status::Subject;

/// A validation function for a custom resource: receives the whole object after defaulting and
/// returns the list of problems. Each problem becomes a cause of a 422 Invalid response; a
/// message of the form `"spec.x[0].y: detail"` is split into the cause's `field` and message.
pub type Validator = Arc<dyn Fn(&Value) -> Result<(), Vec<String>> + Send + Sync>;

/// Describes a resource served by the fake, like the parts of a CustomResourceDefinition the
/// fake understands. Build one with [`ResourceSpec::new`] or a struct literal with
/// `..Default::default()`.
#[derive(Clone, Default)]
pub struct ResourceSpec {
    /// API group; empty for the core group.
    pub group: String,
    /// API version within the group, e.g. `v1alpha1`.
    pub version: String,
    /// Kind, e.g. `ServiceRecord`.
    pub kind: String,
    /// Lower-case plural resource name used in URLs, e.g. `servicerecords`.
    pub plural: String,
    /// Namespaced (true) or cluster-scoped (false).
    pub namespaced: bool,
    /// Whether `/status` is a subresource: the main resource then ignores status changes and the
    /// subresource changes only status.
    pub status_subresource: bool,
    /// Optional schema-like validation run on create and update (422 Invalid on failure).
    pub validator: Option<Validator>,
    /// The version's `openAPIV3Schema`: unknown fields are pruned, defaults applied, the object
    /// validated, and `x-kubernetes-list-type` lists merged by server-side apply, as for a CRD.
    pub schema: Option<Arc<Value>>,
}

impl ResourceSpec {
    /// A resource without status subresource, validator or schema.
    pub fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            ..Default::default()
        }
    }
    /// Enables the `/status` subresource.
    pub fn with_status_subresource(mut self) -> Self {
        self.status_subresource = true;
        self
    }
    /// Sets the validation function.
    pub fn with_validator(
        mut self,
        f: impl Fn(&Value) -> Result<(), Vec<String>> + Send + Sync + 'static,
    ) -> Self {
        self.validator = Some(Arc::new(f));
        self
    }
    /// `group/version`, or just `version` for the core group.
    pub fn api_version(&self) -> String {
        api_version(&self.group, &self.version)
    }

    /// One spec per served version of a `CustomResourceDefinition` (apiextensions.k8s.io/v1, as
    /// a JSON value), storage version first, each with its schema and status subresource.
    pub fn from_crd(crd: &Value) -> Result<Vec<ResourceSpec>, RegisterError> {
        crate::schema::specs_from_crd(crd).map_err(RegisterError::Invalid)
    }

    /// [`ResourceSpec::from_crd`] for CRD YAML (a single document).
    pub fn from_crd_yaml(yaml: &str) -> Result<Vec<ResourceSpec>, RegisterError> {
        let crd: Value = yaml_serde::from_str(yaml)
            .map_err(|e| RegisterError::Invalid(format!("CRD YAML: {e}")))?;
        Self::from_crd(&crd)
    }
}

impl fmt::Debug for ResourceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceSpec")
            .field("group", &self.group)
            .field("version", &self.version)
            .field("kind", &self.kind)
            .field("plural", &self.plural)
            .field("namespaced", &self.namespaced)
            .field("status_subresource", &self.status_subresource)
            .field("validator", &self.validator.as_ref().map(|_| "<fn>"))
            .field("schema", &self.schema.as_ref().map(|_| "<openAPIV3Schema>"))
            .finish()
    }
}

/// Why [`crate::FakeApiServer::register`] refused a spec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegisterError {
    /// The group/version/plural is one of the preloaded built-in resources.
    #[error("{0} is a built-in resource and cannot be re-registered")]
    BuiltIn(String),
    /// Another version of the same group/plural was registered with a different kind or scope.
    #[error("{0} is already registered with a different kind or scope")]
    Inconsistent(String),
    /// A required field is empty or malformed.
    #[error("invalid resource spec: {0}")]
    Invalid(String),
}

pub(crate) fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// Splits `apps/v1` into `("apps", "v1")` and `v1` into `("", "v1")`.
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// Built-in kinds with server-side defaulting and validation in `defaults` / `validation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Builtin {
    Namespace,
    Node,
    Service,
    Endpoints,
    ConfigMap,
    Event,
    EndpointSlice,
}

/// When `metadata.generation` is set and bumped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GenerationPolicy {
    /// No generation at all (Services, ConfigMaps, Endpoints, ...).
    Never,
    /// 1 on create, +1 when anything outside `metadata` changes (custom resources).
    OutsideMetadata,
    /// As above, and also when labels change (EndpointSlices).
    OutsideMetadataOrLabels,
}

/// Which name format `metadata.name` must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NameRule {
    Subdomain,
    Label1123,
    Label1035,
}

/// How a list is merged by server-side apply.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ListKind {
    /// Items are objects identified by `keys` (with defaults for absent key fields).
    Map { keys: Vec<(String, Option<Value>)> },
    /// Items are scalars forming a set (finalizers).
    Set,
}

/// Strategy knobs that differ between resources, mirroring the apiserver's REST strategies.
#[derive(Clone, Debug)]
pub(crate) struct Behavior {
    pub generation: GenerationPolicy,
    pub allow_unconditional_update: bool,
    pub allow_create_on_update: bool,
    pub return_deleted_object: bool,
    pub drop_status_on_create: bool,
    pub name_rule: NameRule,
    /// Field-selector labels beyond `metadata.name` / `metadata.namespace`.
    pub field_labels: &'static [&'static str],
}

/// A served group/version/resource.
pub(crate) struct Resource {
    pub spec: ResourceSpec,
    pub builtin: Option<Builtin>,
    /// The version objects are stored at (the first registered version of the group/plural).
    pub storage_version: String,
    pub lists: Vec<(String, ListKind)>,
    pub behavior: Behavior,
    pub schema: Option<Arc<Schema>>,
}

impl Resource {
    pub fn subject<'a>(&'a self, name: &'a str) -> Subject<'a> {
        Subject {
            group: &self.spec.group,
            plural: &self.spec.plural,
            kind: &self.spec.kind,
            name,
        }
    }
    pub fn api_version(&self) -> String {
        self.spec.api_version()
    }
    pub fn storage_api_version(&self) -> String {
        api_version(&self.spec.group, &self.storage_version)
    }
    /// `plural[.group][/status]`, the key used by request counters.
    pub fn counter_name(&self, status: bool) -> String {
        let mut s = self.spec.plural.clone();
        if !self.spec.group.is_empty() {
            s.push('.');
            s.push_str(&self.spec.group);
        }
        if status {
            s.push_str("/status");
        }
        s
    }
    /// The merge behaviour of the list at dotted `path`, if it is not atomic.
    pub fn list_kind(&self, path: &str) -> Option<&ListKind> {
        self.lists.iter().find(|(p, _)| p == path).map(|(_, k)| k)
    }
    pub fn is(&self, b: Builtin) -> bool {
        self.builtin == Some(b)
    }
}

fn map_keys(keys: &[&str]) -> ListKind {
    ListKind::Map {
        keys: keys
            .iter()
            .map(|k| {
                // Kubernetes defaults `protocol` to TCP, and apply treats the default as part of
                // the key (structured-merge-diff key defaulting).
                let default = (*k == "protocol").then(|| Value::from("TCP"));
                (k.to_string(), default)
            })
            .collect(),
    }
}

fn metadata_lists() -> Vec<(String, ListKind)> {
    vec![
        ("metadata.ownerReferences".into(), map_keys(&["uid"])),
        ("metadata.finalizers".into(), ListKind::Set),
    ]
}

struct BuiltinDef {
    b: Option<Builtin>,
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    status: bool,
}

const BUILTINS: &[BuiltinDef] = &[
    BuiltinDef {
        b: Some(Builtin::Namespace),
        group: "",
        kind: "Namespace",
        plural: "namespaces",
        namespaced: false,
        status: true,
    },
    BuiltinDef {
        b: Some(Builtin::Node),
        group: "",
        kind: "Node",
        plural: "nodes",
        namespaced: false,
        status: true,
    },
    BuiltinDef {
        b: Some(Builtin::Service),
        group: "",
        kind: "Service",
        plural: "services",
        namespaced: true,
        status: true,
    },
    BuiltinDef {
        b: Some(Builtin::Endpoints),
        group: "",
        kind: "Endpoints",
        plural: "endpoints",
        namespaced: true,
        status: false,
    },
    BuiltinDef {
        b: Some(Builtin::ConfigMap),
        group: "",
        kind: "ConfigMap",
        plural: "configmaps",
        namespaced: true,
        status: false,
    },
    BuiltinDef {
        b: Some(Builtin::Event),
        group: "events.k8s.io",
        kind: "Event",
        plural: "events",
        namespaced: true,
        status: false,
    },
    BuiltinDef {
        b: Some(Builtin::EndpointSlice),
        group: "discovery.k8s.io",
        kind: "EndpointSlice",
        plural: "endpointslices",
        namespaced: true,
        status: false,
    },
    // Contour's HTTPProxy is a CRD in real clusters, so it gets custom-resource semantics.
    BuiltinDef {
        b: None,
        group: "projectcontour.io",
        kind: "HTTPProxy",
        plural: "httpproxies",
        namespaced: true,
        status: true,
    },
];

fn builtin_behavior(b: Builtin) -> Behavior {
    let mut be = Behavior {
        generation: GenerationPolicy::Never,
        allow_unconditional_update: true,
        allow_create_on_update: false,
        return_deleted_object: false,
        drop_status_on_create: false,
        name_rule: NameRule::Subdomain,
        field_labels: &[],
    };
    match b {
        Builtin::Namespace => {
            be.name_rule = NameRule::Label1123;
            be.return_deleted_object = true;
            be.field_labels = &["status.phase"];
        }
        Builtin::Node => be.field_labels = &["spec.unschedulable"],
        Builtin::Service => {
            be.name_rule = NameRule::Label1035;
            be.return_deleted_object = true;
            be.drop_status_on_create = true;
            be.field_labels = &["spec.clusterIP", "spec.type"];
        }
        Builtin::Endpoints => be.allow_create_on_update = true,
        Builtin::EndpointSlice => {
            be.generation = GenerationPolicy::OutsideMetadataOrLabels;
            be.field_labels = &["addressType"];
        }
        Builtin::ConfigMap | Builtin::Event => {}
    }
    be
}

fn custom_behavior() -> Behavior {
    Behavior {
        generation: GenerationPolicy::OutsideMetadata,
        // customResourceStrategy: AllowUnconditionalUpdate() == false, AllowCreateOnUpdate() == false.
        allow_unconditional_update: false,
        allow_create_on_update: false,
        return_deleted_object: false,
        drop_status_on_create: true,
        name_rule: NameRule::Subdomain,
        field_labels: &[],
    }
}

fn builtin_lists(b: Builtin) -> Vec<(String, ListKind)> {
    let mut v = metadata_lists();
    match b {
        Builtin::Service => {
            // SSA keys ports by (port, protocol).
            v.push(("spec.ports".into(), map_keys(&["port", "protocol"])));
            v.push(("status.conditions".into(), map_keys(&["type"])));
        }
        Builtin::Node | Builtin::Namespace => {
            v.push(("status.conditions".into(), map_keys(&["type"])));
        }
        _ => {}
    }
    v
}

/// All served resources.
#[derive(Clone)]
pub(crate) struct Registry {
    resources: Vec<Arc<Resource>>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let resources = BUILTINS
            .iter()
            .map(|d| {
                // Every preloaded resource is served at v1 only.
                let version = "v1";
                let mut spec = ResourceSpec::new(d.group, version, d.kind, d.plural, d.namespaced);
                spec.status_subresource = d.status;
                let (behavior, lists) = match d.b {
                    Some(b) => (builtin_behavior(b), builtin_lists(b)),
                    None => (custom_behavior(), metadata_lists()),
                };
                Arc::new(Resource {
                    storage_version: version.to_string(),
                    spec,
                    builtin: d.b,
                    lists,
                    behavior,
                    schema: None,
                })
            })
            .collect();
        Self { resources }
    }

    /// Adds (or replaces) a custom resource version.
    pub fn register(&mut self, spec: ResourceSpec) -> Result<(), RegisterError> {
        for (what, v) in [
            ("kind", &spec.kind),
            ("plural", &spec.plural),
            ("version", &spec.version),
        ] {
            if v.is_empty() {
                return Err(RegisterError::Invalid(format!("{what} must not be empty")));
            }
        }
        if spec
            .plural
            .chars()
            .any(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        {
            return Err(RegisterError::Invalid(format!(
                "plural {:?} must be lower-case alphanumeric",
                spec.plural
            )));
        }
        let id = format!("{}/{}", spec.api_version(), spec.plural);
        let mut storage_version = spec.version.clone();
        if let Some(existing) = self
            .resources
            .iter()
            .find(|r| r.spec.group == spec.group && r.spec.plural == spec.plural)
        {
            if existing.builtin.is_some()
                || BUILTINS
                    .iter()
                    .any(|d| d.group == spec.group && d.plural == spec.plural)
            {
                return Err(RegisterError::BuiltIn(id));
            }
            if existing.spec.kind != spec.kind || existing.spec.namespaced != spec.namespaced {
                return Err(RegisterError::Inconsistent(id));
            }
            storage_version = existing.storage_version.clone();
        }
        let schema = match &spec.schema {
            Some(raw) => Some(Arc::new(
                Schema::compile(raw).map_err(RegisterError::Invalid)?,
            )),
            None => None,
        };
        let mut lists = metadata_lists();
        if let Some(s) = &schema {
            lists.extend(s.list_kinds());
        }
        let res = Arc::new(Resource {
            spec,
            builtin: None,
            storage_version,
            lists,
            behavior: custom_behavior(),
            schema,
        });
        match self.resources.iter().position(|r| {
            r.spec.group == res.spec.group
                && r.spec.version == res.spec.version
                && r.spec.plural == res.spec.plural
        }) {
            Some(i) => self.resources[i] = res,
            None => self.resources.push(res),
        }
        Ok(())
    }

    /// The resources served at `group`/`version`.
    pub fn served<'a>(
        &'a self,
        group: &'a str,
        version: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Resource>> + 'a {
        self.resources
            .iter()
            .filter(move |r| r.spec.group == group && r.spec.version == version)
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<Resource>> {
        self.resources
            .iter()
            .find(|r| r.spec.group == group && r.spec.version == version && r.spec.plural == plural)
            .cloned()
    }

    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<Arc<Resource>> {
        let (g, v) = split_api_version(api_version);
        self.resources
            .iter()
            .find(|r| r.spec.group == g && r.spec.version == v && r.spec.kind == kind)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_preloaded_and_protected() {
        let mut r = Registry::with_builtins();
        assert!(
            r.find("", "v1", "services")
                .is_some_and(|s| s.spec.status_subresource)
        );
        assert!(r.find("discovery.k8s.io", "v1", "endpointslices").is_some());
        assert!(
            r.find("projectcontour.io", "v1", "httpproxies")
                .is_some_and(|p| p.builtin.is_none())
        );
        let err = r.register(ResourceSpec::new("", "v1", "Service", "services", true));
        assert_eq!(err, Err(RegisterError::BuiltIn("v1/services".into())));
    }

    #[test]
    fn second_version_shares_storage_and_must_agree() {
        let mut r = Registry::with_builtins();
        r.register(ResourceSpec::new(
            "x.io", "v1alpha1", "Thing", "things", true,
        ))
        .unwrap();
        r.register(ResourceSpec::new("x.io", "v1", "Thing", "things", true))
            .unwrap();
        assert_eq!(
            r.find("x.io", "v1", "things")
                .map(|t| t.storage_version.clone()),
            Some("v1alpha1".into())
        );
        assert!(r.find("x.io", "v1alpha1", "things").is_some());
        assert_eq!(
            r.register(ResourceSpec::new("x.io", "v2", "Thing", "things", false)),
            Err(RegisterError::Inconsistent("x.io/v2/things".into()))
        );
    }
}
