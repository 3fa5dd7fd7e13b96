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
//! server ends up serving. It binds a certificate [`Identity`] to a requesting cluster (kind
//! and trust domain checked) and then evaluates (a), (b) and (c) above. `carry` (may a child
//! speak for a cluster of its subtree) is decided here too.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, OnceLock, RwLock};

use cedar_policy::{
    Authorizer, Context, Decision as CedarDecision, Entities, Entity, EntityUid, PolicyId,
    PolicySet, Request, RestrictedExpression, Schema, ValidationMode, Validator,
};

use xcc_certs::identity::Identity;

use crate::catalog::ServiceEntry;

/// The Cedar schema of xcc's entities and actions.
pub const SCHEMA: &str = r#"
namespace Xcc {
  // A registry's cluster.
  entity Cluster = { name: String };
  // A workload (service) inside a cluster, the finer-grained requester.
  entity Workload in [Cluster] = { cluster: String, name: String };
  // An operator holding an admin certificate.
  entity Admin;
  // A service in the catalog.
  entity Service = {
    owner: String,
    namespace: String,
    name: String,
    fqdn: String,
    // Every label-wise suffix of the FQDN: "a.b.c" -> {"a.b.c", "b.c", "c"}.
    zones: Set<String>,
    // "name=value" for every policy label: the service's annotation
    // `connectivity.tanzu.vmware.com/<name>: <value>`, with a Kubernetes label name and value
    // and a name xcc does not use itself; at most 32 (registry/src/peer_labels.rs). The same
    // set at every level: they travel with the service, and only they do.
    labels: Set<String>,
    allowedRequesters: Set<String>,
  };
  type Bilateral = { calleeAdmits: Bool, callerRequested: Bool };
  action announce appliesTo { principal: [Cluster], resource: [Service] };
  action discover appliesTo { principal: [Cluster, Workload], resource: [Service], context: Bilateral };
  action import appliesTo { principal: [Cluster, Workload], resource: [Service], context: Bilateral };
  action admin appliesTo { principal: [Admin], resource: [Cluster] };
  // May the child (principal) carry the cluster (resource) in its subtree, i.e. speak for it?
  action carry appliesTo { principal: [Cluster], resource: [Cluster] };
}
"#;

/// Policies always in force; a policy directory adds to them.
pub const DEFAULT_POLICIES: &str = r#"
@id("bilateral")
permit (
  principal,
  action in [Xcc::Action::"discover", Xcc::Action::"import"],
  resource
) when { context.calleeAdmits && context.callerRequested };

@id("carry-self")
permit (principal, action == Xcc::Action::"carry", resource)
when { principal == resource };

@id("announce-clusterset")
permit (principal, action == Xcc::Action::"announce", resource)
when { resource.fqdn like "*.svc.clusterset.local" };
"#;

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
    set: PolicySet,
    schema: &'static Schema,
    /// Only the default policies are loaded (lets hot paths skip Cedar evaluation).
    default_only: bool,
    /// Source files, for reporting.
    pub files: Vec<String>,
    /// The sources themselves (name, text), to tell a reload that changed nothing.
    sources: Vec<(String, String)>,
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

fn uid(ty: &str, id: &str) -> Result<EntityUid, PolicyError> {
    let ty = cedar_policy::EntityTypeName::from_str(ty)
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
    Ok(EntityUid::from_type_name_and_id(
        ty,
        cedar_policy::EntityId::new(id),
    ))
}

fn str_set(items: impl IntoIterator<Item = String>) -> RestrictedExpression {
    RestrictedExpression::new_set(items.into_iter().map(RestrictedExpression::new_string))
}

/// Every label-wise suffix of an FQDN.
pub fn zones_of(fqdn: &str) -> Vec<String> {
    let fqdn = fqdn.trim_end_matches('.').to_ascii_lowercase();
    let mut out = vec![];
    let mut rest = fqdn.as_str();
    loop {
        if !rest.is_empty() {
            out.push(rest.to_string());
        }
        match rest.split_once('.') {
            Some((_, tail)) => rest = tail,
            None => break,
        }
    }
    out
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
/// every place a test can hide (nested, negated, in `unless`) is seen.
fn check_label_tests(file: &str, policy: &cedar_policy::Policy) -> Result<(), PolicyError> {
    let json = policy
        .to_json()
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
    let mut bad = None;
    find_label_literals(&json, &mut |text| {
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
        for (file, text) in sources {
            let parsed = parse_file(file, text)?;
            for policy in parsed {
                set.add(policy.clone())
                    .map_err(|_| PolicyError::Duplicate {
                        file: file.clone(),
                        id: policy.id().to_string(),
                    })?;
                check_label_tests(file, &policy)?;
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

    fn service_entity(&self, e: &ServiceEntry) -> Result<Entity, PolicyError> {
        let attrs = HashMap::from([
            (
                "owner".to_string(),
                RestrictedExpression::new_string(e.key.cluster.to_string()),
            ),
            (
                "namespace".to_string(),
                RestrictedExpression::new_string(e.key.namespace.to_string()),
            ),
            (
                "name".to_string(),
                RestrictedExpression::new_string(e.key.name.to_string()),
            ),
            (
                "fqdn".to_string(),
                RestrictedExpression::new_string(e.fqdn.to_string()),
            ),
            ("zones".to_string(), str_set(zones_of(&e.fqdn))),
            (
                "labels".to_string(),
                str_set(
                    crate::peer_labels::policy_labels(e.labels.iter())
                        .map(|(name, value)| format!("{name}={value}")),
                ),
            ),
            (
                "allowedRequesters".to_string(),
                str_set(e.allowed_requesters.iter().cloned()),
            ),
        ]);
        Entity::new(
            uid("Xcc::Service", &e.key.to_string())?,
            attrs,
            HashSet::new(),
        )
        .map_err(|err| PolicyError::Internal(err.to_string()))
    }

    fn principal(
        &self,
        cluster: &str,
        service: &str,
    ) -> Result<(EntityUid, Vec<Entity>), PolicyError> {
        let cluster_uid = uid("Xcc::Cluster", cluster)?;
        let cluster_entity = Entity::new(
            cluster_uid.clone(),
            HashMap::from([(
                "name".to_string(),
                RestrictedExpression::new_string(cluster.to_string()),
            )]),
            HashSet::new(),
        )
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
        if service.is_empty() {
            return Ok((cluster_uid, vec![cluster_entity]));
        }
        let workload_uid = uid("Xcc::Workload", &format!("{cluster}/{service}"))?;
        let workload = Entity::new(
            workload_uid.clone(),
            HashMap::from([
                (
                    "cluster".to_string(),
                    RestrictedExpression::new_string(cluster.to_string()),
                ),
                (
                    "name".to_string(),
                    RestrictedExpression::new_string(service.to_string()),
                ),
            ]),
            HashSet::from([cluster_uid]),
        )
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
        Ok((workload_uid, vec![cluster_entity, workload]))
    }

    fn evaluate(
        &self,
        principal: EntityUid,
        mut entities: Vec<Entity>,
        action: &str,
        resource: &ServiceEntry,
        context: Context,
    ) -> Verdict {
        fail_closed(self.service_entity(resource).and_then(|service| {
            let resource_uid = service.uid();
            entities.push(service);
            self.decide(principal, action, resource_uid, context, entities)
        }))
    }

    /// Run the Cedar authorizer on one request; the policies that decided it, sorted.
    fn decide(
        &self,
        principal: EntityUid,
        action: &str,
        resource: EntityUid,
        context: Context,
        entities: Vec<Entity>,
    ) -> Result<Verdict, PolicyError> {
        let entities = Entities::from_entities(entities, Some(self.schema))
            .map_err(|e| PolicyError::Internal(e.to_string()))?;
        let request = Request::new(
            principal,
            uid("Xcc::Action", action)?,
            resource,
            context,
            Some(self.schema),
        )
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
        let response = Authorizer::new().is_authorized(&request, &self.set, &entities);
        let mut policies: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|p| p.to_string())
            .collect();
        policies.sort();
        Ok(Verdict {
            allowed: response.decision() == CedarDecision::Allow,
            policies,
            errors: response
                .diagnostics()
                .errors()
                .map(|e| e.to_string())
                .collect(),
        })
    }

    /// May `cluster` announce `entry`?
    pub fn announce(&self, cluster: &str, entry: &ServiceEntry) -> Verdict {
        match self.principal(cluster, "") {
            Ok((p, entities)) => self.evaluate(p, entities, "announce", entry, Context::empty()),
            Err(e) => Verdict {
                allowed: false,
                policies: vec![],
                errors: vec![e.to_string()],
            },
        }
    }

    /// May `child` carry `cluster` in its subtree (speak for it)? The default set permits a
    /// child only itself; every other cluster needs a `carry` permit in the parent's policies.
    pub fn carry(&self, child: &str, cluster: &str) -> Verdict {
        if self.default_only {
            let allowed = child == cluster;
            return Verdict {
                allowed,
                policies: if allowed {
                    vec!["carry-self".to_string()]
                } else {
                    vec![]
                },
                errors: vec![],
            };
        }
        let decided = self.principal(child, "").and_then(|(p, mut entities)| {
            let (r, carried) = self.principal(cluster, "")?;
            if child != cluster {
                entities.extend(carried);
            }
            self.decide(p, "carry", r, Context::empty(), entities)
        });
        fail_closed(decided)
    }

    /// The bilateral decision for `requester_cluster` (and optional `requester_service`) asking
    /// for `entry`. `requested` is condition (b).
    pub fn discover(
        &self,
        entry: &ServiceEntry,
        requester_cluster: &str,
        requester_service: &str,
        requested: bool,
    ) -> Decision {
        let requester = if requester_service.is_empty() {
            requester_cluster.to_string()
        } else {
            format!("{requester_cluster}/{requester_service}")
        };
        let callee_admits = admits(entry, requester_cluster, requester_service);
        let verdict = if self.default_only {
            // The default set permits exactly when (a) and (b) hold.
            Verdict {
                allowed: callee_admits && requested,
                policies: if callee_admits && requested {
                    vec!["bilateral".to_string()]
                } else {
                    vec![]
                },
                errors: vec![],
            }
        } else {
            let context = Context::from_pairs([
                (
                    "calleeAdmits".to_string(),
                    RestrictedExpression::new_bool(callee_admits),
                ),
                (
                    "callerRequested".to_string(),
                    RestrictedExpression::new_bool(requested),
                ),
            ]);
            match (
                context,
                self.principal(requester_cluster, requester_service),
            ) {
                (Ok(ctx), Ok((p, entities))) => self.evaluate(p, entities, "discover", entry, ctx),
                (Err(e), _) => Verdict {
                    allowed: false,
                    policies: vec![],
                    errors: vec![e.to_string()],
                },
                (_, Err(e)) => Verdict {
                    allowed: false,
                    policies: vec![],
                    errors: vec![e.to_string()],
                },
            }
        };
        let (condition, reason) = if !callee_admits {
            (
                Condition::NotAllowedByCallee,
                format!(
                    "{} allows [{}]; {requester} is not among them",
                    entry.key,
                    entry.allowed_requesters.join(", ")
                ),
            )
        } else if !requested {
            (
                Condition::NotRequested,
                format!("{requester} did not ask for {}", entry.fqdn),
            )
        } else if !verdict.allowed {
            let why = if !verdict.errors.is_empty() {
                format!("evaluation error: {}", verdict.errors.join("; "))
            } else if verdict.policies.is_empty() {
                "no policy permits it".to_string()
            } else {
                format!("forbidden by {}", verdict.policies.join(", "))
            };
            (Condition::PolicyDenied, why)
        } else {
            (
                Condition::Granted,
                format!("granted by {}", verdict.policies.join(", ")),
            )
        };
        Decision {
            allowed: condition == Condition::Granted,
            condition,
            callee_admits,
            caller_requested: requested,
            policy_permits: verdict.allowed,
            policies: verdict.policies,
            reason,
        }
    }

    /// [`Policies::discover`]'s outcome alone, for hot paths: no reason is written, and with
    /// only the default policies no Cedar evaluation runs.
    pub fn allows(
        &self,
        entry: &ServiceEntry,
        cluster: &str,
        service: &str,
        requested: bool,
    ) -> bool {
        if !requested || !admits(entry, cluster, service) {
            return false;
        }
        if self.default_only {
            // The default set permits exactly when (a) and (b) hold.
            return true;
        }
        let context = Context::from_pairs([
            (
                "calleeAdmits".to_string(),
                RestrictedExpression::new_bool(true),
            ),
            (
                "callerRequested".to_string(),
                RestrictedExpression::new_bool(true),
            ),
        ]);
        match (context, self.principal(cluster, service)) {
            (Ok(ctx), Ok((p, entities))) => {
                self.evaluate(p, entities, "discover", entry, ctx).allowed
            }
            // Fail closed, as `discover` does.
            _ => false,
        }
    }
}

/// The decision `to` makes for `cluster` asking for `entry` (a Hamlet subscription: every
/// record requested) where it differs from the one `from` made; None where both agree. One
/// request and one entity set serve both evaluations (a policy reload decides every record of
/// the Hamlet view again, for each consumer identity).
pub fn flipped(
    from: &Policies,
    to: &Policies,
    entry: &ServiceEntry,
    cluster: &str,
) -> Option<bool> {
    if !admits(entry, cluster, "") || (from.default_only && to.default_only) {
        return None;
    }
    let decided = (|| -> Result<(Option<bool>, Option<bool>), PolicyError> {
        let context = Context::from_pairs([
            (
                "calleeAdmits".to_string(),
                RestrictedExpression::new_bool(true),
            ),
            (
                "callerRequested".to_string(),
                RestrictedExpression::new_bool(true),
            ),
        ])
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
        let (principal, mut entities) = to.principal(cluster, "")?;
        let service = to.service_entity(entry)?;
        let resource = service.uid();
        entities.push(service);
        let entities = Entities::from_entities(entities, Some(to.schema))
            .map_err(|e| PolicyError::Internal(e.to_string()))?;
        let request = Request::new(
            principal,
            uid("Xcc::Action", "discover")?,
            resource,
            context,
            Some(to.schema),
        )
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
        let authorizer = Authorizer::new();
        let run = |p: &Policies| {
            (!p.default_only).then(|| {
                authorizer
                    .is_authorized(&request, &p.set, &entities)
                    .decision()
                    == CedarDecision::Allow
            })
        };
        Ok((run(from), run(to)))
    })();
    // The default set permits whatever (a) and (b) admit; an evaluation error denies.
    let (before, after) = match decided {
        Ok((before, after)) => (before.unwrap_or(true), after.unwrap_or(true)),
        Err(_) => (
            from.allows(entry, cluster, "", true),
            to.allows(entry, cluster, "", true),
        ),
    };
    (before != after).then_some(after)
}

/// Records [`flipped_all`] decides with one entity set (the principal plus these services):
/// bounds the set it builds at once while sharing the schema's action entities and the
/// principal across many records.
const REDECIDE_CHUNK: usize = 256;

/// [`flipped`] for every record of `entries` at once (a policy reload deciding a whole Hamlet
/// view for one consumer identity); one answer per entry, in order, equal to `flipped`'s.
///
/// What a reload costs is mostly Cedar, so this pays it once where it can: the principal,
/// context and action are built once, the services' entities are validated together in chunks
/// of [`REDECIDE_CHUNK`], and a record is evaluated under both sets only when a policy that
/// differs between them (present in one and not, with the same text, in the other) applies to
/// it. Where none applies the two sets decide alike: the policies they share decide it, an
/// error in a policy only makes it not apply, and a default-only set's shortcut (allowed) is
/// what its default policies decide for a subscription. The chunks are decided on up to
/// `available_parallelism` threads. Anything that cannot be built this way falls back to
/// [`flipped`] per record.
pub fn flipped_all(
    from: &Policies,
    to: &Policies,
    entries: &[&ServiceEntry],
    cluster: &str,
) -> Vec<Option<bool>> {
    if from.default_only && to.default_only {
        return vec![None; entries.len()];
    }
    let one_by_one = |chunk: &[&ServiceEntry]| -> Vec<Option<bool>> {
        chunk
            .iter()
            .map(|e| flipped(from, to, e, cluster))
            .collect()
    };
    let Ok(shared) = Redecide::new(from, to, cluster) else {
        return one_by_one(entries);
    };
    let chunks: Vec<&[&ServiceEntry]> = entries.chunks(REDECIDE_CHUNK).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(chunks.len());
    let decide =
        |chunk: &[&ServiceEntry]| shared.chunk(chunk).unwrap_or_else(|_| one_by_one(chunk));
    if threads <= 1 {
        return chunks.into_iter().flat_map(decide).collect();
    }
    // Each thread takes every `threads`-th chunk; the answers are put back in order.
    let mut parts: Vec<Vec<(usize, Vec<Option<bool>>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (chunks, decide) = (&chunks, &decide);
                s.spawn(move || {
                    chunks
                        .iter()
                        .enumerate()
                        .skip(t)
                        .step_by(threads)
                        .map(|(i, c)| (i, decide(c)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut decided: Vec<Option<Vec<Option<bool>>>> = vec![None; chunks.len()];
    for (i, answers) in parts.drain(..).flatten() {
        decided[i] = Some(answers);
    }
    decided
        .into_iter()
        .zip(&chunks)
        // A thread that panicked left its chunks undecided: decide them here.
        .flat_map(|(d, c)| d.unwrap_or_else(|| one_by_one(c)))
        .collect()
}

/// What [`flipped_all`] builds once per reload and identity.
struct Redecide<'a> {
    from: &'a Policies,
    to: &'a Policies,
    cluster: &'a str,
    principal: EntityUid,
    principal_entities: Vec<Entity>,
    action: EntityUid,
    context: Context,
    /// The policies of either set that the other lacks (renamed apart); None: compare the two
    /// sets on every record.
    differing: Option<PolicySet>,
}

impl<'a> Redecide<'a> {
    fn new(from: &'a Policies, to: &'a Policies, cluster: &'a str) -> Result<Self, PolicyError> {
        let context = Context::from_pairs([
            (
                "calleeAdmits".to_string(),
                RestrictedExpression::new_bool(true),
            ),
            (
                "callerRequested".to_string(),
                RestrictedExpression::new_bool(true),
            ),
        ])
        .map_err(|e| PolicyError::Internal(e.to_string()))?;
        let (principal, principal_entities) = to.principal(cluster, "")?;
        Ok(Self {
            from,
            to,
            cluster,
            principal,
            principal_entities,
            action: uid("Xcc::Action", "discover")?,
            context,
            differing: differing_policies(&from.set, &to.set),
        })
    }

    /// One answer per entry of `chunk`; `Err` when its entity set cannot be built.
    fn chunk(&self, chunk: &[&ServiceEntry]) -> Result<Vec<Option<bool>>, PolicyError> {
        let mut out = vec![None; chunk.len()];
        let mut entities = self.principal_entities.clone();
        let mut asked = Vec::new();
        for (i, e) in chunk.iter().enumerate() {
            if admits(e, self.cluster, "") {
                let service = self.to.service_entity(e)?;
                asked.push((i, service.uid()));
                entities.push(service);
            }
        }
        let entities = Entities::from_entities(entities, Some(self.to.schema))
            .map_err(|e| PolicyError::Internal(e.to_string()))?;
        let authorizer = Authorizer::new();
        for (i, resource) in asked {
            let Ok(request) = Request::new(
                self.principal.clone(),
                self.action.clone(),
                resource,
                self.context.clone(),
                Some(self.to.schema),
            ) else {
                out[i] = flipped(self.from, self.to, chunk[i], self.cluster);
                continue;
            };
            if let Some(differing) = &self.differing
                && authorizer
                    .is_authorized(&request, differing, &entities)
                    .diagnostics()
                    .reason()
                    .next()
                    .is_none()
            {
                // No policy that differs applies: both sets decide alike.
                continue;
            }
            // The default set permits whatever (a) and (b) admit (as in `flipped`).
            let run = |p: &Policies| {
                p.default_only
                    || authorizer
                        .is_authorized(&request, &p.set, &entities)
                        .decision()
                        == CedarDecision::Allow
            };
            let (before, after) = (run(self.from), run(self.to));
            out[i] = (before != after).then_some(after);
        }
        Ok(out)
    }
}

/// The policies of `a` not in `b` with the same text and of `b` not in `a`, in one set (ids
/// prefixed so that a policy edited in place appears twice). None when that cannot be built,
/// or when either set holds a template-linked policy (its text is its template's).
fn differing_policies(a: &PolicySet, b: &PolicySet) -> Option<PolicySet> {
    let texts = |s: &PolicySet| -> Option<HashSet<String>> {
        s.policies()
            .map(|p| p.is_static().then(|| p.to_string()))
            .collect()
    };
    let (in_a, in_b) = (texts(a)?, texts(b)?);
    let mut differing = PolicySet::new();
    for (set, other, side) in [(a, &in_b, "before"), (b, &in_a, "after")] {
        for p in set.policies() {
            if !other.contains(&p.to_string()) {
                let id = PolicyId::new(format!("{side}:{}", p.id()));
                differing.add(p.new_id(id)).ok()?;
            }
        }
    }
    Some(differing)
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

/// Shared handle on the loaded policy set (swapped on reload).
pub type PolicyHandle = Arc<RwLock<Arc<Policies>>>;

/// Why a certificate is not accepted as a requester.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityRefused {
    #[error("{0} is not a cluster identity")]
    NotACluster(String),
    #[error("{0} is not an admin identity")]
    NotAnAdmin(String),
    #[error("{identity} belongs to trust domain {found:?}, not {expected:?}")]
    ForeignTrustDomain {
        identity: String,
        found: String,
        expected: String,
    },
}

impl From<IdentityRefused> for tonic::Status {
    fn from(e: IdentityRefused) -> Self {
        tonic::Status::permission_denied(e.to_string())
    }
}

/// Fail closed: an evaluation error is a denial that says why.
fn fail_closed(decided: Result<Verdict, PolicyError>) -> Verdict {
    decided.unwrap_or_else(|e| Verdict {
        allowed: false,
        policies: vec![],
        errors: vec![e.to_string()],
    })
}

/// The one authorization decision point. Every listener binds its peer's certificate with
/// [`Gate::cluster_of`] / [`Gate::admin_of`] and decides each service with [`Gate::discover`];
/// the federation level decides what a child may carry and announce with [`Gate::carry`] and
/// [`Policies::announce`]. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    trust_domain: Arc<str>,
    policies: PolicyHandle,
    /// Bumped whenever [`Gate::set_policies`] swaps the set: decisions already handed out
    /// (open Hamlet streams, grants, carried clusters) must be made again. Hamlet streams stay
    /// open and send each consumer only the records whose decision changed.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Gate {
    /// `trust_domain`: this registry's own (from its certificate); peers of any other are refused.
    pub fn new(trust_domain: impl Into<Arc<str>>, policies: PolicyHandle) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            policies,
            generation: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Put `policies` in force and tell every holder of an earlier decision.
    /// A set built from the same sources as the one in force changes nothing (file watchers
    /// re-read on every poll).
    pub fn set_policies(&self, policies: Policies) {
        let mut current = self.policies.write().unwrap_or_else(|p| p.into_inner());
        if current.same_sources(&policies) {
            return;
        }
        *current = Arc::new(policies);
        drop(current);
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Changes whenever the policy set is swapped.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// A gate over a fixed policy set (tests, benches).
    pub fn fixed(trust_domain: &str, policies: Policies) -> Self {
        Self::new(trust_domain, Arc::new(RwLock::new(Arc::new(policies))))
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn policy_handle(&self) -> &PolicyHandle {
        &self.policies
    }

    /// The policy set in force now.
    pub fn policies(&self) -> Arc<Policies> {
        self.policies
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn same_domain(&self, id: &Identity) -> Result<(), IdentityRefused> {
        match id.trust_domain() {
            Some(td) if td == &*self.trust_domain => Ok(()),
            Some(td) => Err(IdentityRefused::ForeignTrustDomain {
                identity: id.spiffe_id().unwrap_or_else(|| id.to_string()),
                found: td.to_string(),
                expected: self.trust_domain.to_string(),
            }),
            None => Err(IdentityRefused::NotACluster(id.to_string())),
        }
    }

    /// The cluster a peer certificate speaks for: a cluster identity of this trust domain.
    /// Admin certificates, certificates without an xcc identity (DNS SAN or CN only) and
    /// identities of another trust domain are refused, whatever their name.
    pub fn cluster_of(&self, id: &Identity) -> Result<String, IdentityRefused> {
        match id {
            Identity::Cluster { name, .. } => {
                self.same_domain(id)?;
                Ok(name.clone())
            }
            _ => Err(IdentityRefused::NotACluster(id.to_string())),
        }
    }

    /// The operator an admin certificate names: an admin identity of this trust domain.
    pub fn admin_of(&self, id: &Identity) -> Result<String, IdentityRefused> {
        match id {
            Identity::Admin { name, .. } => {
                self.same_domain(id)?;
                Ok(name.clone())
            }
            _ => Err(IdentityRefused::NotAnAdmin(id.to_string())),
        }
    }

    /// The bilateral decision for `cluster` (already bound by [`Gate::cluster_of`] or vouched
    /// for by the federation tree) and optional `service` asking for `entry`.
    pub fn discover(
        &self,
        entry: &ServiceEntry,
        cluster: &str,
        service: &str,
        requested: bool,
    ) -> Decision {
        self.policies().discover(entry, cluster, service, requested)
    }

    /// [`Gate::discover`]'s outcome alone, for hot paths (every Hamlet record): no reason is
    /// written, and with only the default policies no Cedar evaluation runs.
    pub fn allows(
        &self,
        entry: &ServiceEntry,
        cluster: &str,
        service: &str,
        requested: bool,
    ) -> bool {
        self.policies().allows(entry, cluster, service, requested)
    }

    /// May `child` carry `cluster` in its subtree?
    pub fn carry(&self, child: &str, cluster: &str) -> Verdict {
        self.policies().carry(child, cluster)
    }

    /// May `cluster` announce `entry`?
    pub fn announce(&self, cluster: &str, entry: &ServiceEntry) -> Verdict {
        self.policies().announce(cluster, entry)
    }
}

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
        let entries: Vec<ServiceEntry> = (0..700)
            .map(|i| {
                let name = format!("svc-{i:03}");
                let mut e = api(if i % 7 == 0 { &["c9"] } else { &[] });
                e.key = ServiceKey::new("b2", "shop", &name);
                e.fqdn = format!("{name}.shop.svc.clusterset.local").into();
                e
            })
            .collect();
        let refs: Vec<&ServiceEntry> = entries.iter().collect();
        for from in &sets {
            for to in &sets {
                let one_by_one: Vec<Option<bool>> =
                    refs.iter().map(|e| flipped(from, to, e, "c1")).collect();
                assert_eq!(flipped_all(from, to, &refs, "c1"), one_by_one);
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
        assert_eq!(flipped_all(&sets[1], &sets[2], &refs, "c1"), expected);
        assert!(
            flipped_all(&sets[1], &sets[3], &refs, "c1")
                .iter()
                .all(Option::is_none),
            "the same forbid under another id flips nothing"
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
        let p = Policies::default_set();
        let entity = p.service_entity(&api(&[])).expect("entity");
        let labels = entity.attr("labels").expect("labels").expect("value");
        assert_eq!(format!("{labels}"), r#"["tier=restricted"]"#);
    }

    /// The identity half of the one decision point. Only a cluster identity of
    /// this trust domain is a requesting cluster; look-alikes named `west` are refused.
    #[test]
    fn the_gate_binds_kind_and_trust_domain() {
        let gate = Gate::fixed("xcc.test", Policies::default_set());
        assert!(gate.allows(&api(&["west"]), "west", "", true));
        assert!(!gate.allows(&api(&["west"]), "north", "", true));
        assert!(!gate.allows(&api(&[]), "west", "", false));
        let forbid = r#"@id("f") forbid (principal in Xcc::Cluster::"west", action == Xcc::Action::"discover", resource);"#;
        let strict = Gate::fixed(
            "xcc.test",
            Policies::from_sources(&[("f.cedar".into(), forbid.into())]).expect("valid"),
        );
        assert!(!strict.allows(&api(&[]), "west", "", true));
        assert!(strict.allows(&api(&[]), "north", "", true));
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
        assert!(strict.allows(&api(&[]), "west", "", true));
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
