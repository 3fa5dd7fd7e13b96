//! What a policy reload changes: the records whose decision for a consumer differs between the
//! set in force before and the one after ([`flipped`] for one, [`flipped_all`] for a whole
//! Hamlet view).

use std::collections::HashSet;
use std::sync::Arc;

use cedar_policy::{
    Authorizer, Decision as CedarDecision, Entities, Entity, PolicyId, PolicySet, Request,
};

use super::decide::{Prepared, discover_context};
use super::schema::{service_entity, uid};
use super::{Policies, PolicyError, admits};
use crate::catalog::ServiceEntry;

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
        let context = discover_context(true, true)?;
        let (principal, mut entities) = to.principal(cluster, "")?;
        let service = service_entity(entry)?;
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

/// The Cedar entity of a record, as [`flipped_all`]'s caller provides it: [`service_entity`]
/// itself, or a copy the caller keeps with the entry's version (an entry changes by being
/// replaced, so the entity of an allocation never goes stale).
pub type EntityOf<'a> = &'a (dyn Fn(&Arc<ServiceEntry>) -> Result<Entity, PolicyError> + Sync);

/// [`flipped`] for every record of `entries` at once (a policy reload deciding a whole Hamlet
/// view for one consumer identity); one answer per entry, in order, equal to `flipped`'s.
/// Each record's entity comes from `entity`.
///
/// What a reload costs is mostly Cedar, so this pays it once where it can: the principal,
/// context and action are built once, the services' entities are gathered in one entity set
/// per chunk of [`REDECIDE_CHUNK`] (not validated against the schema again: see
/// [`Redecide::chunk`]), and a record is evaluated under both sets only when a policy that
/// differs between them (present in one and not, with the same text, in the other) applies to
/// it. Where none applies the two sets decide alike: the policies they share decide it, an
/// error in a policy only makes it not apply, and a default-only set's shortcut (allowed) is
/// what its default policies decide for a subscription. The chunks are decided on up to
/// `available_parallelism` threads. A set with a policy that names an entity in its condition
/// (it could read another service of the chunk), and anything that cannot be built this way,
/// is decided with [`flipped`] per record (in the same chunks and threads).
pub fn flipped_all(
    from: &Policies,
    to: &Policies,
    entries: &[&Arc<ServiceEntry>],
    cluster: &str,
    entity: EntityOf<'_>,
) -> Vec<Option<bool>> {
    if from.default_only && to.default_only {
        return vec![None; entries.len()];
    }
    let one_by_one = |chunk: &[&Arc<ServiceEntry>]| -> Vec<Option<bool>> {
        chunk
            .iter()
            .map(|e| flipped(from, to, e, cluster))
            .collect()
    };
    // A policy that names an entity in its condition could read another service of the chunk's
    // set, which a decision on its own (`flipped`, a stream's `Discoverer`) never sees: those
    // sets are decided record by record, still on every core.
    let shared = if from.names_entities || to.names_entities {
        None
    } else {
        Redecide::new(from, to, cluster, entity).ok()
    };
    let chunks: Vec<&[&Arc<ServiceEntry>]> = entries.chunks(REDECIDE_CHUNK).collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(chunks.len());
    let decide = |chunk: &[&Arc<ServiceEntry>]| match &shared {
        Some(shared) => shared.chunk(chunk).unwrap_or_else(|_| one_by_one(chunk)),
        None => one_by_one(chunk),
    };
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
    entity: EntityOf<'a>,
    /// The request's principal, action and context, as a consumer's decisions share them.
    shared: Prepared,
    /// The policies of either set that the other lacks (renamed apart); None: compare the two
    /// sets on every record.
    differing: Option<PolicySet>,
}

impl<'a> Redecide<'a> {
    fn new(
        from: &'a Policies,
        to: &'a Policies,
        cluster: &'a str,
        entity: EntityOf<'a>,
    ) -> Result<Self, PolicyError> {
        Ok(Self {
            from,
            to,
            cluster,
            entity,
            shared: Prepared::new(to, cluster, "")?,
            differing: differing_policies(&from.set, &to.set),
        })
    }

    /// One answer per entry of `chunk`; `Err` when its entity set cannot be built.
    fn chunk(&self, chunk: &[&Arc<ServiceEntry>]) -> Result<Vec<Option<bool>>, PolicyError> {
        let mut out = vec![None; chunk.len()];
        let mut entities = self.shared.principal_entities.clone();
        let mut asked = Vec::new();
        for (i, e) in chunk.iter().enumerate() {
            if admits(e, self.cluster, "") {
                let service = (self.entity)(e)?;
                asked.push((i, service.uid()));
                entities.push(service);
            }
        }
        // Without the schema: every entity and request here has the schema's shape by
        // construction (`service_entity`, `principal`, `discover_context`, the same for every
        // record), and validating each again cost a third of a reload. The actions need no
        // entities: the schema gives them no parents, so `action in [..]` is equality.
        let entities = Entities::from_entities(entities, None)
            .map_err(|e| PolicyError::Internal(e.to_string()))?;
        let authorizer = Authorizer::new();
        for (i, resource) in asked {
            let Ok(request) = Request::new(
                self.shared.principal.clone(),
                self.shared.action.clone(),
                resource,
                self.shared.context.clone(),
                None,
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
