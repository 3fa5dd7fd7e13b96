//! One decision of a policy set: may a requester discover a service (the bilateral rule and
//! Cedar), may a cluster announce a name, may a child carry a cluster. An evaluation error is a
//! denial that says why.

use cedar_policy::{
    Authorizer, Context, Decision as CedarDecision, Entities, Entity, EntityUid, Request,
    RestrictedExpression,
};

use super::schema::uid;
use super::{Condition, Decision, Policies, PolicyError, Verdict, admits};
use crate::catalog::ServiceEntry;

impl Policies {
    fn evaluate(
        &self,
        principal: EntityUid,
        mut entities: Vec<Entity>,
        action: &str,
        resource: &ServiceEntry,
        context: Context,
    ) -> Verdict {
        fail_closed(super::schema::service_entity(resource).and_then(|service| {
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
            let context = discover_context(callee_admits, requested);
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
        let context = discover_context(true, true);
        match (context, self.principal(cluster, service)) {
            (Ok(ctx), Ok((p, entities))) => {
                self.evaluate(p, entities, "discover", entry, ctx).allowed
            }
            // Fail closed, as `discover` does.
            _ => false,
        }
    }
}

/// [`Policies::allows`] for one requester under one policy set, many records: what every
/// decision shares (the principal, action and context, as an entity set and request parts) is
/// built once, each record's Cedar entity comes from the caller (kept with the entry's version,
/// [`super::EntityOf`]), and neither is validated against the schema again (both have its shape
/// by construction, as in [`super::flipped_all`]). A Hamlet stream holds one: under a custom
/// policy set every record it sends is decided, a snapshot of 10,000 records 10,000 times.
pub struct Discoverer {
    policies: std::sync::Arc<Policies>,
    cluster: String,
    service: String,
    /// None under the default set (no Cedar needed) or when the parts could not be built (then
    /// every decision is [`Policies::allows`]'s own).
    prepared: Option<Prepared>,
}

/// What every `discover` decision for one requester shares: the principal with its entities,
/// the action and the context of a requested record the callee admits. Built once per
/// requester by a stream's [`Discoverer`] and by a reload's [`super::flipped_all`].
pub(super) struct Prepared {
    pub(super) principal: EntityUid,
    pub(super) principal_entities: Vec<Entity>,
    pub(super) action: EntityUid,
    pub(super) context: Context,
}

impl Prepared {
    pub(super) fn new(
        policies: &Policies,
        cluster: &str,
        service: &str,
    ) -> Result<Self, PolicyError> {
        let (principal, principal_entities) = policies.principal(cluster, service)?;
        Ok(Self {
            principal,
            principal_entities,
            action: uid("Xcc::Action", "discover")?,
            context: discover_context(true, true)?,
        })
    }
}

impl Discoverer {
    /// Decisions of `policies` for `cluster` (and `service`, empty for a cluster).
    pub fn new(policies: std::sync::Arc<Policies>, cluster: &str, service: &str) -> Self {
        let prepared = (!policies.default_only)
            .then(|| Prepared::new(&policies, cluster, service).ok())
            .flatten();
        Self {
            policies,
            cluster: cluster.to_string(),
            service: service.to_string(),
            prepared,
        }
    }

    /// Whether these are `policies`' decisions.
    pub fn is_for(&self, policies: &std::sync::Arc<Policies>) -> bool {
        std::sync::Arc::ptr_eq(&self.policies, policies)
    }

    /// [`Policies::allows`] for `entry`, requested: the same answer.
    pub fn allows(
        &self,
        entry: &std::sync::Arc<ServiceEntry>,
        entity: super::EntityOf<'_>,
    ) -> bool {
        let Some(p) = &self.prepared else {
            return self
                .policies
                .allows(entry, &self.cluster, &self.service, true);
        };
        if !admits(entry, &self.cluster, &self.service) {
            return false;
        }
        let decided = (|| -> Result<bool, PolicyError> {
            let service = entity(entry)?;
            let resource = service.uid();
            let mut entities = p.principal_entities.clone();
            entities.push(service);
            let entities = Entities::from_entities(entities, None)
                .map_err(|e| PolicyError::Internal(e.to_string()))?;
            let request = Request::new(
                p.principal.clone(),
                p.action.clone(),
                resource,
                p.context.clone(),
                None,
            )
            .map_err(|e| PolicyError::Internal(e.to_string()))?;
            let response = Authorizer::new().is_authorized(&request, &self.policies.set, &entities);
            Ok(response.decision() == CedarDecision::Allow)
        })();
        // Anything that could not be built this way is decided as `allows` decides it (which
        // fails closed).
        decided.unwrap_or_else(|_| {
            self.policies
                .allows(entry, &self.cluster, &self.service, true)
        })
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

/// The context of a `discover` request: whether the callee admits the caller (a) and whether
/// the caller asked for the service (b).
pub(super) fn discover_context(
    callee_admits: bool,
    requested: bool,
) -> Result<Context, PolicyError> {
    Context::from_pairs([
        (
            "calleeAdmits".to_string(),
            RestrictedExpression::new_bool(callee_admits),
        ),
        (
            "callerRequested".to_string(),
            RestrictedExpression::new_bool(requested),
        ),
    ])
    .map_err(|e| PolicyError::Internal(e.to_string()))
}
