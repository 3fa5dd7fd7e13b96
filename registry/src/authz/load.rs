//! A validated policy set: the defaults plus sources (inline, files of a directory), each policy
//! parsed, named, checked for label tests no service can carry, and validated strictly against
//! the schema.

use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;

use cedar_policy::{PolicyId, PolicySet, Schema, ValidationMode, Validator};

use super::PolicyError;
use super::schema::{DEFAULT_POLICIES, SCHEMA};

/// A policy testing `resource.labels` for a label no service can carry ([`PolicyError::Label`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "{file}: policy {id:?} tests resource.labels for {label:?}, which no service can carry: {reason} (a policy label is \"<name>=<value>\" of an annotation connectivity.tanzu.vmware.com/<name>; docs/security.md)"
)]
pub struct LabelTestError {
    pub file: String,
    pub id: String,
    pub label: String,
    pub reason: String,
}

/// Why the built-in schema and default policies ([`SCHEMA`], [`DEFAULT_POLICIES`]) do not load.
#[derive(Debug, thiserror::Error)]
pub enum BaseError {
    #[error("schema: {0}")]
    Schema(Box<cedar_policy::CedarSchemaError>),
    #[error(transparent)]
    Policies(#[from] PolicyError),
    #[error(transparent)]
    Add(Box<cedar_policy::PolicySetError>),
}

/// A validated policy set.
pub struct Policies {
    pub(super) set: PolicySet,
    pub(super) schema: &'static Schema,
    /// Only the default policies are loaded (lets hot paths skip Cedar evaluation).
    pub(super) default_only: bool,
    /// Some policy names an entity in its condition (`Xcc::Service::"…".labels`, say), so it
    /// may read an entity other than the request's principal and resource: a decision must
    /// then see exactly those two (see [`super::flipped_all`]).
    pub(super) names_entities: bool,
    /// Source files, for reporting.
    pub files: Vec<String>,
    /// The sources themselves (name, text), to tell a reload that changed nothing.
    sources: Vec<(String, String)>,
}

/// What every policy set starts from, built once per process: the parsed schema, a validator
/// for it and the validated default policies (rebuilding them per set cost most of a load).
struct Base {
    schema: Schema,
    validator: Validator,
    defaults: PolicySet,
}

impl Base {
    fn get() -> Result<&'static Base, PolicyError> {
        static BASE: OnceLock<Result<Base, BaseError>> = OnceLock::new();
        BASE.get_or_init(|| {
            let (schema, _warnings) =
                Schema::from_cedarschema_str(SCHEMA).map_err(|e| BaseError::Schema(Box::new(e)))?;
            let validator = Validator::new(schema.clone());
            let mut defaults = PolicySet::new();
            for policy in parse_file("<default>", DEFAULT_POLICIES)? {
                defaults
                    .add(policy)
                    .map_err(|e| BaseError::Add(Box::new(e)))?;
            }
            validate(&validator, &defaults)?;
            Ok(Base {
                schema,
                validator,
                defaults,
            })
        })
        .as_ref()
        .map_err(PolicyError::Base)
    }
}

/// The policies of one file, each named by its `@id` annotation or `file#index`.
fn parse_file(file: &str, text: &str) -> Result<Vec<cedar_policy::Policy>, PolicyError> {
    let parsed = PolicySet::from_str(text).map_err(|e| PolicyError::Parse {
        file: file.to_string(),
        message: format!("{e:?}")
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
    })?;
    Ok(parsed
        .policies()
        .enumerate()
        .map(|(index, policy)| {
            let id = policy
                .annotation("id")
                .map(str::to_string)
                .unwrap_or_else(|| format!("{file}#{index}"));
            policy.new_id(PolicyId::new(&id))
        })
        .collect())
}

/// Refuse a policy that tests `….labels` (with `contains`, `containsAll`, `containsAny`, `==`
/// or `!=`) for a literal no service can carry ([`crate::peer_labels::check_policy_text`]): it
/// would silently never match — a `forbid` that fails open. Reads the policy's JSON form, so
/// every place a test can hide (nested, negated, in `unless`) is seen (`json`).
fn check_label_tests(
    file: &str,
    policy: &cedar_policy::Policy,
    json: &serde_json::Value,
) -> Result<(), PolicyError> {
    let mut bad = None;
    find_label_literals(json, &mut |text| {
        if bad.is_none()
            && let Err(e) = crate::peer_labels::check_policy_text(text)
        {
            bad = Some((text.to_string(), e.to_string()));
        }
    });
    match bad {
        None => Ok(()),
        Some((label, reason)) => Err(PolicyError::Label(Box::new(LabelTestError {
            file: file.to_string(),
            id: policy.id().to_string(),
            label,
            reason,
        }))),
    }
}

/// Whether a policy's condition names an entity (an entity literal anywhere in its `when` or
/// `unless` clauses): its JSON form (`json`) shows each as an `__entity` object.
fn names_entities_in_conditions(json: &serde_json::Value) -> bool {
    fn has_entity(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(map) => {
                map.contains_key("__entity") || map.values().any(has_entity)
            }
            serde_json::Value::Array(items) => items.iter().any(has_entity),
            _ => false,
        }
    }
    json.get("conditions").is_some_and(has_entity)
}

/// Call `found` with every string literal compared against a `labels` attribute in `expr` (a
/// Cedar policy in JSON form).
fn find_label_literals(expr: &serde_json::Value, found: &mut impl FnMut(&str)) {
    fn is_labels(e: &serde_json::Value) -> bool {
        e.get(".")
            .and_then(|a| a.get("attr"))
            .is_some_and(|a| a == "labels")
    }
    fn literals(e: &serde_json::Value, found: &mut impl FnMut(&str)) {
        if let Some(text) = e.get("Value").and_then(serde_json::Value::as_str) {
            found(text);
        } else if let Some(items) = e
            .get("Value")
            .and_then(serde_json::Value::as_array)
            .or_else(|| e.get("Set").and_then(serde_json::Value::as_array))
        {
            for item in items {
                match item.as_str() {
                    Some(text) => found(text),
                    None => literals(item, found),
                }
            }
        }
    }
    match expr {
        serde_json::Value::Object(map) => {
            for (op, body) in map {
                if matches!(
                    op.as_str(),
                    "contains" | "containsAll" | "containsAny" | "==" | "!="
                ) && let (Some(left), Some(right)) = (body.get("left"), body.get("right"))
                {
                    if is_labels(left) {
                        literals(right, found);
                    }
                    if is_labels(right) {
                        literals(left, found);
                    }
                }
                find_label_literals(body, found);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                find_label_literals(item, found);
            }
        }
        _ => {}
    }
}

/// Strict validation of `set` against the xcc schema.
fn validate(validator: &Validator, set: &PolicySet) -> Result<(), PolicyError> {
    let result = validator.validate(set, ValidationMode::Strict);
    if result.validation_passed() {
        return Ok(());
    }
    let errors: Vec<String> = result
        .validation_errors()
        .map(|e| format!("{}: {e}", e.policy_id()))
        .collect();
    Err(PolicyError::Invalid(errors.join("; ")))
}

impl Policies {
    /// The default policy set alone.
    pub fn default_set() -> Self {
        // The embedded sources are tested to parse and validate.
        match Self::from_sources(&[]) {
            Ok(p) => p,
            Err(e) => panic!("embedded default policies are invalid: {e}"),
        }
    }

    /// Default policies plus `sources` (name, text), validated against [`SCHEMA`].
    pub fn from_sources(sources: &[(String, String)]) -> Result<Self, PolicyError> {
        let base = Base::get()?;
        let mut set = base.defaults.clone();
        // Only the added policies are validated here: Cedar validates each policy on its own,
        // and the defaults were validated when `Base` was built.
        let mut added = PolicySet::new();
        let mut names_entities = false;
        for (file, text) in sources {
            let parsed = parse_file(file, text)?;
            for policy in parsed {
                set.add(policy.clone())
                    .map_err(|_| PolicyError::Duplicate {
                        file: file.clone(),
                        id: policy.id().to_string(),
                    })?;
                // Read in JSON form, where every place a test or a name can hide is explicit.
                let json = policy
                    .to_json()
                    .map_err(|e| PolicyError::Internal(e.to_string()))?;
                check_label_tests(file, &policy, &json)?;
                names_entities |= names_entities_in_conditions(&json);
                added
                    .add(policy)
                    .map_err(|e| PolicyError::Internal(format!("{e}")))?;
            }
        }
        validate(&base.validator, &added)?;
        Ok(Self {
            set,
            schema: &base.schema,
            default_only: sources.is_empty(),
            names_entities,
            files: sources.iter().map(|(n, _)| n.clone()).collect(),
            sources: sources.to_vec(),
        })
    }

    /// Default policies plus every `*.cedar` file in `dir` (sorted by name).
    pub fn from_dir(dir: &Path) -> Result<Self, PolicyError> {
        Self::from_dir_and(dir, &[])
    }

    /// Default policies, `inline` sources, then every `*.cedar` file in `dir`.
    pub fn from_dir_and(dir: &Path, inline: &[(String, String)]) -> Result<Self, PolicyError> {
        let mut sources = inline.to_vec();
        sources.extend(Self::dir_sources(dir)?);
        Self::from_sources(&sources)
    }

    /// The `*.cedar` files of `dir`, by file name, in name order, with their text.
    pub fn dir_sources(dir: &Path) -> Result<Vec<(String, String)>, PolicyError> {
        let mut sources = vec![];
        let entries = std::fs::read_dir(dir).map_err(|source| PolicyError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let mut paths: Vec<_> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "cedar") && p.is_file())
            .collect();
        paths.sort();
        for path in paths {
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                // Removed since the listing: as if it had not been listed.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(PolicyError::Io {
                        path: path.display().to_string(),
                        source,
                    });
                }
            };
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            sources.push((name, text));
        }
        Ok(sources)
    }

    /// Whether `other` was built from exactly the same sources (a reload that changed nothing
    /// must not re-decide what was handed out).
    pub fn same_sources(&self, other: &Policies) -> bool {
        self.sources == other.sources
    }

    pub fn is_default_only(&self) -> bool {
        self.default_only
    }

    pub fn policy_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.set.policies().map(|p| p.id().to_string()).collect();
        ids.sort();
        ids
    }
}

/// A Cedar policy that lets `child` carry `clusters` (besides itself), for a parent that
/// configures its children in code (tests, the demo, the hierarchy bench). Names must be
/// DNS-1123 labels, so nothing in them can escape the Cedar string.
pub fn carry_policy(child: &str, clusters: &[&str]) -> Result<String, PolicyError> {
    let bad = std::iter::once(&child)
        .chain(clusters)
        .find(|c| !xcc_certs::identity::is_dns1123_label(c));
    if let Some(bad) = bad {
        return Err(PolicyError::Internal(format!(
            "{bad:?} is not a cluster name (DNS-1123 label)"
        )));
    }
    let set = clusters
        .iter()
        .map(|c| format!("Xcc::Cluster::\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        "@id(\"carry-{child}\")\npermit (principal == Xcc::Cluster::\"{child}\", action == Xcc::Action::\"carry\", resource)\nwhen {{ [{set}].contains(resource) }};\n"
    ))
}
