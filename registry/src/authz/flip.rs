//! What a policy reload changes: the records whose decision for a consumer differs between the
//! set in force before and the one after ([`flipped`] for one, [`flipped_all`] for a whole
//! Hamlet view).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use cedar_policy::{
    Authorizer, Decision as CedarDecision, Entities, Entity, EntityUid, PolicyId, PolicySet,
    Request,
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

/// Records a thread of [`flipped_all`] decides in one go (threads take every other chunk).
const REDECIDE_CHUNK: usize = 256;

/// Records changed since the [`EntityStore`] was built that a reload decides on their own, at
/// least (an eighth of the records decided, if more); with more the store is built again.
/// Cedar replaces an entity in a store by looking at every other one (7 ms at 10,000), and a
/// build costs about 10 µs a record (the first reload after a start pays it), against about
/// 20 µs for deciding a record on its own.
const STALE_MAX: usize = 64;

/// The Cedar entity of a record, as [`flipped_all`]'s caller provides it: [`service_entity`]
/// itself, or a copy the caller keeps with the entry's version (an entry changes by being
/// replaced, so the entity of an allocation never goes stale).
pub type EntityOf<'a> = &'a (dyn Fn(&Arc<ServiceEntry>) -> Result<Entity, PolicyError> + Sync);

/// The Cedar entities of the records policy reloads decide, kept from one reload to the next:
/// the services of the view (each built from one version of its entry) and the requesting
/// clusters. Building an entity set of 10,000 services for every reload was as costly as
/// deciding them; now a reload decides every record against the store, except the few whose
/// entries changed since it was built (decided on their own); when more than [`STALE_MAX`]
/// changed it is built again.
///
/// A decision made against the store equals one made against the request's principal and
/// resource alone ([`flipped`]) as long as no policy names an entity in its condition: the
/// schema gives services no parents and no attribute that holds an entity, so only a named one
/// can make a policy read an entity besides those two. Sets where a policy does are decided
/// record by record instead ([`Policies`]' `names_entities`).
///
/// Each version is known by its allocation, held by a weak reference so that a new version
/// cannot take the address of an old one. Entries gone from the view are dropped when the
/// store is built again (at the latest once it holds twice as many as the view serves).
#[derive(Default)]
pub struct EntityStore {
    entities: Entities,
    /// Entry version (address) → the uid of its entity in the store.
    by_entry: HashMap<usize, Member>,
    /// Requesting clusters → their principal entities, all in the store.
    principals: HashMap<String, Vec<Entity>>,
}

struct Member {
    /// Keeps the version's address reserved (never read).
    _entry: Weak<ServiceEntry>,
    uid: EntityUid,
}

fn address(e: &Arc<ServiceEntry>) -> usize {
    Arc::as_ptr(e) as usize
}

impl EntityStore {
    /// Services whose entities the store holds (with versions no longer served).
    pub fn len(&self) -> usize {
        self.by_entry.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_entry.is_empty()
    }

    /// Make the store ready for `entries` (the records a reload decides for `cluster`, whose
    /// principal entities are `principal`): one uid per entry, the one its entity has in the
    /// store; None for an entry the cluster is not admitted to, one changed since the store was
    /// built (a few: see [`STALE_MAX`]; with more it is built again), one whose entity cannot be
    /// built and one whose uid another entry holds (two records of one service): those are
    /// decided on their own. `Err`: the store could not be built (it is emptied, to be built
    /// again at the next reload).
    fn sync(
        &mut self,
        entries: &[&Arc<ServiceEntry>],
        cluster: &str,
        principal: &[Entity],
        entity: EntityOf<'_>,
    ) -> Result<Vec<Option<EntityUid>>, PolicyError> {
        let mut uids = vec![None; entries.len()];
        let mut stale = 0usize;
        let mut served = 0usize;
        for (i, e) in entries.iter().enumerate() {
            if !admits(e, cluster, "") {
                continue;
            }
            served += 1;
            match self.by_entry.get(&address(e)) {
                Some(m) => uids[i] = Some(m.uid.clone()),
                None => stale += 1,
            }
        }
        let new_principal = !self.principals.contains_key(cluster);
        if new_principal {
            self.principals
                .insert(cluster.to_string(), principal.to_vec());
        }
        let rebuild = (self.by_entry.is_empty() && stale > 0)
            || stale > STALE_MAX.max(served / 8)
            || self.by_entry.len() + stale > 2 * served + 1024;
        let result = if rebuild {
            self.rebuild(entries, &mut uids, cluster, entity)
        } else if new_principal {
            self.add_principal(principal)
        } else {
            // The few records changed since the store was built are decided on their own
            // (about 20 µs each); replacing an entity in the store would cost a pass over
            // every other one (7 ms at 10,000).
            Ok(())
        };
        match result {
            Ok(()) => Ok(uids),
            Err(e) => {
                *self = Self::default();
                Err(e)
            }
        }
    }

    /// Build the store again from the admitted `entries` and the known principals.
    fn rebuild(
        &mut self,
        entries: &[&Arc<ServiceEntry>],
        uids: &mut [Option<EntityUid>],
        cluster: &str,
        entity: EntityOf<'_>,
    ) -> Result<(), PolicyError> {
        self.by_entry.clear();
        let mut taken: HashSet<EntityUid> = HashSet::new();
        let mut all: Vec<Entity> = self.principals.values().flatten().cloned().collect();
        // Building an entity is most of a first build: done on every core.
        let built: Vec<Option<Entity>> = in_parallel(entries.len(), |range| {
            entries[range]
                .iter()
                .map(|e| admits(e, cluster, "").then(|| entity(e).ok()).flatten())
                .collect()
        });
        for (i, (e, service)) in entries.iter().zip(built).enumerate() {
            uids[i] = None;
            let Some(service) = service else { continue };
            let uid = service.uid();
            if !taken.insert(uid.clone()) {
                // Another record of the same service holds the uid: decided on its own.
                continue;
            }
            self.by_entry.insert(
                address(e),
                Member {
                    _entry: Arc::downgrade(e),
                    uid: uid.clone(),
                },
            );
            uids[i] = Some(uid);
            all.push(service);
        }
        // Without the schema: every entity here has the schema's shape by construction
        // (`service_entity`, `principal`), and validating each again cost a third of a reload.
        // The actions need no entities: the schema gives them no parents, so `action in [..]`
        // is equality.
        self.entities =
            Entities::from_entities(all, None).map_err(|e| PolicyError::Internal(e.to_string()))?;
        Ok(())
    }

    /// Put a new requester's principal entities into the store.
    fn add_principal(&mut self, principal: &[Entity]) -> Result<(), PolicyError> {
        self.entities = std::mem::take(&mut self.entities)
            .upsert_entities(principal.to_vec(), None)
            .map_err(|e| PolicyError::Internal(e.to_string()))?;
        Ok(())
    }
}

/// [`flipped`] for every record of `entries` at once (a policy reload deciding a whole Hamlet
/// view for one consumer identity); one answer per entry, in order, equal to `flipped`'s.
/// Each record's entity comes from `store`, brought up to date first with `entity`.
///
/// What a reload costs is mostly Cedar, so this pays it once where it can: the principal,
/// context and action are built once, the services' entities are kept in the [`EntityStore`]
/// between reloads, and a record is evaluated under both sets only when a policy that differs
/// between them (present in one and not, with the same text, in the other) applies to it.
/// Where none applies the two sets decide alike: the policies they share decide it, an error in
/// a policy only makes it not apply, and a default-only set's shortcut (allowed) is what its
/// default policies decide for a subscription. The records are decided in chunks of
/// [`REDECIDE_CHUNK`] on up to `available_parallelism` threads. A set with a policy that names
/// an entity, and anything that cannot be built this way, is decided with [`flipped`] per
/// record.
pub fn flipped_all(
    from: &Policies,
    to: &Policies,
    entries: &[&Arc<ServiceEntry>],
    cluster: &str,
    entity: EntityOf<'_>,
    store: &mut EntityStore,
) -> Vec<Option<bool>> {
    if from.default_only && to.default_only {
        return vec![None; entries.len()];
    }
    let by_store = (|| {
        if from.names_entities || to.names_entities {
            return None;
        }
        let shared = Redecide::new(from, to, cluster).ok()?;
        let uids = store
            .sync(entries, cluster, &shared.shared.principal_entities, entity)
            .ok()?;
        Some((shared, uids))
    })();
    let Some((shared, uids)) = by_store else {
        return in_parallel(entries.len(), |range| {
            entries[range]
                .iter()
                .map(|e| flipped(from, to, e, cluster))
                .collect()
        });
    };
    let entities = &store.entities;
    in_parallel(entries.len(), |range| {
        let authorizer = Authorizer::new();
        entries[range.clone()]
            .iter()
            .zip(&uids[range])
            .map(|(e, uid)| match uid {
                Some(uid) => shared.decide(&authorizer, entities, uid, e),
                None => flipped(from, to, e, cluster),
            })
            .collect()
    })
}

/// `decide` for each chunk of [`REDECIDE_CHUNK`] indexes of `0..len`, on up to
/// `available_parallelism` threads; the answers in order.
fn in_parallel<T: Clone + Send>(
    len: usize,
    decide: impl Fn(std::ops::Range<usize>) -> Vec<T> + Sync,
) -> Vec<T> {
    let chunks: Vec<std::ops::Range<usize>> = (0..len)
        .step_by(REDECIDE_CHUNK)
        .map(|start| start..(start + REDECIDE_CHUNK).min(len))
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(chunks.len());
    if threads <= 1 {
        return chunks.into_iter().flat_map(&decide).collect();
    }
    // Each thread takes every `threads`-th chunk; the answers are put back in order.
    let mut parts: Vec<Vec<(usize, Vec<T>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (chunks, decide) = (&chunks, &decide);
                s.spawn(move || {
                    chunks
                        .iter()
                        .enumerate()
                        .skip(t)
                        .step_by(threads)
                        .map(|(i, c)| (i, decide(c.clone())))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut decided: Vec<Option<Vec<T>>> = vec![None; chunks.len()];
    for (i, answers) in parts.drain(..).flatten() {
        decided[i] = Some(answers);
    }
    decided
        .into_iter()
        .zip(chunks)
        // A thread that panicked left its chunks undecided: decide them here.
        .flat_map(|(d, c)| d.unwrap_or_else(|| decide(c)))
        .collect()
}

/// What [`flipped_all`] builds once per reload and identity.
struct Redecide<'a> {
    from: &'a Policies,
    to: &'a Policies,
    cluster: &'a str,
    /// The request's principal, action and context, as a consumer's decisions share them.
    shared: Prepared,
    /// The policies of either set that the other lacks (renamed apart); None: compare the two
    /// sets on every record.
    differing: Option<PolicySet>,
}

impl<'a> Redecide<'a> {
    fn new(from: &'a Policies, to: &'a Policies, cluster: &'a str) -> Result<Self, PolicyError> {
        Ok(Self {
            from,
            to,
            cluster,
            shared: Prepared::new(to, cluster, "")?,
            differing: differing_policies(&from.set, &to.set),
        })
    }

    /// The answer for `entry`, whose entity `entities` holds under `resource`.
    fn decide(
        &self,
        authorizer: &Authorizer,
        entities: &Entities,
        resource: &EntityUid,
        entry: &ServiceEntry,
    ) -> Option<bool> {
        let Ok(request) = Request::new(
            self.shared.principal.clone(),
            self.shared.action.clone(),
            resource.clone(),
            self.shared.context.clone(),
            None,
        ) else {
            return flipped(self.from, self.to, entry, self.cluster);
        };
        if let Some(differing) = &self.differing
            && authorizer
                .is_authorized(&request, differing, entities)
                .diagnostics()
                .reason()
                .next()
                .is_none()
        {
            // No policy that differs applies: both sets decide alike.
            return None;
        }
        // The default set permits whatever (a) and (b) admit (as in `flipped`).
        let run = |p: &Policies| {
            p.default_only
                || authorizer
                    .is_authorized(&request, &p.set, entities)
                    .decision()
                    == CedarDecision::Allow
        };
        let (before, after) = (run(self.from), run(self.to));
        (before != after).then_some(after)
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
