//! A level's children: their sessions attach and detach, declare their subtrees (what each
//! carries is this level's decision, Cedar `carry`), announce their services (checked, then
//! stored as `Source::Child` entries) and acknowledge route notifications.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use tracing::{info, warn};
use xcc_proto::xcc::federation::v1 as fed;

use super::super::convert::entry_from_announcement;
use super::super::tree::TreeError;
use super::{ChildPort, Level, Refusal, RefusalCode, Resync, Session};
use crate::catalog::{ServiceEntry, ServiceKey, Source};

/// What one session of a child announced, for the sweep at its end-of-snapshot marker, without
/// a copy of every announced key: every entry the session stores gets a catalog revision above
/// `since` (the catalog's revision when the session attached), so only the keys of entries that
/// were already stored before the session and that it announced again are kept here (normally
/// none: a child's entries are dropped when its previous session ends).
#[derive(Debug)]
pub struct SessionAnnouncements {
    since: u64,
    older: BTreeSet<ServiceKey>,
}

impl SessionAnnouncements {
    /// Record `ann`, after [`Level::child_announcement`] accepted it from `child`.
    pub fn note(&mut self, level: &Level, child: &str, ann: &fed::ServiceAnnouncement) {
        let key = ServiceKey::new(&ann.cluster, &ann.namespace, &ann.name);
        if ann.deleted {
            self.older.remove(&key);
            return;
        }
        if let Some(e) = level.inner.catalog.get(&key)
            && e.revision <= self.since
            && matches!(&e.source, Source::Child(c) if &**c == child)
        {
            self.older.insert(key);
        }
    }

    /// Whether the session announced `e` (an entry of its child's source).
    fn covers(&self, e: &ServiceEntry) -> bool {
        e.revision > self.since || self.older.contains(&e.key)
    }
}

/// Why a child's stream is being closed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChildError {
    #[error("{0}")]
    Tree(#[from] TreeError),
    #[error("the first message must be the child's subtree membership")]
    NoMembership,
    #[error("a session for {0} is already open")]
    Duplicate(String),
}

impl Level {
    /// A child opened a session and declared its subtree.
    pub fn attach_child(
        &self,
        child: &str,
        address: String,
        membership: &fed::SubtreeMembership,
        link: impl ChildPort + 'static,
    ) -> Result<u64, ChildError> {
        let link: Arc<dyn ChildPort> = Arc::new(link);
        let (clusters, refused) = self.carried(child, membership);
        let mut st = self.lock();
        if st.sessions.contains_key(child) {
            return Err(ChildError::Duplicate(child.to_string()));
        }
        st.tree.set_child_subtree(child, clusters)?;
        st.claimed.insert(child.to_string(), membership.clone());
        st.policy_refused.remove(child);
        let id = st.next_id;
        st.next_id += 1;
        let mut path = st.tree.ancestors().to_vec();
        path.push(self.inner.cluster.clone());
        self.down(
            &link,
            fed::parent_message::Payload::Ancestry(fed::Ancestry { path }),
        );
        for r in refused {
            self.down(&link, fed::parent_message::Payload::Rejection(r));
        }
        // Deliver what was queued for this child while it was away (or sent in a session that
        // ended before the child acknowledged it).
        if let Some(q) = st.route_queues.get(child) {
            for n in q.pending.values() {
                self.down(
                    &link,
                    fed::parent_message::Payload::RouteNotification(n.clone()),
                );
            }
        }
        st.sessions.insert(
            child.to_string(),
            Session {
                id,
                link,
                since: SystemTime::now(),
                address,
            },
        );
        let membership = self.membership_locked(&st);
        let parent_tx = st.parent_tx.clone();
        drop(st);
        self.deliver_held_clashes(child);
        info!(child, "child attached");
        self.send_up(parent_tx, membership);
        self.bump();
        Ok(id)
    }

    /// A child's session ended: its subtree is dropped until it comes back.
    pub fn detach_child(&self, child: &str, session: u64) {
        let mut st = self.lock();
        if st.sessions.get(child).is_none_or(|s| s.id != session) {
            return;
        }
        st.sessions.remove(child);
        st.tree.remove_child(child);
        st.claimed.remove(child);
        st.policy_refused.remove(child);
        let membership = self.membership_locked(&st);
        let parent_tx = st.parent_tx.clone();
        drop(st);
        let source = self.child_source(child);
        self.reserve_names(
            self.inner
                .catalog
                .list(&crate::catalog::ListFilter {
                    source: Some(source.clone()),
                    ..Default::default()
                })
                .iter()
                .map(|e| &**e),
        );
        let (_, removed) = self.inner.catalog.replace_source(&source, vec![]);
        info!(
            child,
            removed, "child detached; its subtree was dropped (names held for it)"
        );
        self.send_up(parent_tx, membership);
        self.bump();
    }

    /// The child changed its subtree (one of its own children came or went).
    pub fn update_child_subtree(
        &self,
        child: &str,
        membership: &fed::SubtreeMembership,
    ) -> Result<(), ChildError> {
        let (clusters, refused) = self.carried(child, membership);
        let mut st = self.lock();
        st.tree.set_child_subtree(child, clusters)?;
        st.claimed.insert(child.to_string(), membership.clone());
        if let Some(session) = st.sessions.get(child) {
            for r in refused {
                self.down(&session.link, fed::parent_message::Payload::Rejection(r));
            }
        }
        let membership = self.membership_locked(&st);
        let parent_tx = st.parent_tx.clone();
        drop(st);
        // Drop announcements of clusters that left the child's subtree (their names are held).
        let mut gone = self.child_entries(child);
        {
            let st = self.lock();
            gone.retain(|e| st.tree.check_claim(child, &e.key.cluster).is_err());
        }
        self.reserve_names(gone.iter().map(|e| &**e));
        self.remove_child_entries(child, &gone);
        self.send_up(parent_tx, membership);
        self.bump();
        Ok(())
    }

    /// The part of `membership` that `child` may carry (Cedar `carry`, evaluated in this
    /// level's policies: by default a child carries only itself), and a rejection for each
    /// cluster it may not. A child's claim alone never puts a cluster under it.
    fn carried(
        &self,
        child: &str,
        membership: &fed::SubtreeMembership,
    ) -> (BTreeSet<String>, Vec<fed::Rejection>) {
        let policies = self.policies();
        let mut keep = BTreeSet::new();
        let mut refused = vec![];
        for cluster in &membership.clusters {
            // The child itself is always its own (MissingSelf catches its absence).
            let verdict = match cluster == child {
                true => None,
                false => Some(policies.carry(child, cluster)),
            };
            let Some(verdict) = verdict.filter(|v| !v.allowed) else {
                keep.insert(cluster.clone());
                continue;
            };
            warn!(child, %cluster, "refusing a cluster of the child's subtree: no carry permit for it here");
            refused.push(
                Refusal::new(
                    "carry",
                    RefusalCode::PermissionDenied,
                    format!(
                        "{child} may not carry {cluster:?}: no Cedar carry permit at {}",
                        self.inner.cluster
                    ),
                )
                .with_policies(verdict.policies)
                .to_rejection("subtree", cluster, "", "", "", &self.inner.cluster),
            );
        }
        (keep, refused)
    }

    /// An announcement from `child`. A refusal costs that entry only: the caller sends it back
    /// to the child as a [`fed::Rejection`] and reads on.
    pub fn child_announcement(
        &self,
        child: &str,
        ann: &fed::ServiceAnnouncement,
    ) -> Result<(), Refusal> {
        if let Err(e) = self.lock().tree.check_claim(child, &ann.cluster) {
            warn!(child, cluster = %ann.cluster, "refusing an announcement for a cluster the child does not carry");
            return Err(Refusal::new(
                "subtree",
                RefusalCode::PermissionDenied,
                e.to_string(),
            ));
        }
        let source = self.child_source(child);
        if ann.deleted {
            let key = ServiceKey::new(&ann.cluster, &ann.namespace, &ann.name);
            if self
                .inner
                .catalog
                .get(&key)
                .is_some_and(|e| e.source == source)
            {
                self.inner.catalog.remove(&key);
            }
            // The owner withdrew it: whatever was held for it is free.
            self.lock().reserved.release(&key);
            return Ok(());
        }
        let entry = match entry_from_announcement(ann, source.clone()) {
            Ok(e) => e,
            Err(e) => {
                warn!(child, cluster = %ann.cluster, error = %e, "refusing an invalid announcement");
                return Err(Refusal::new(
                    "valid",
                    RefusalCode::InvalidArgument,
                    format!("invalid announcement: {e}"),
                ));
            }
        };
        let verdict = self.policies().announce(&ann.cluster, &entry);
        if !verdict.allowed {
            warn!(child, cluster = %ann.cluster, fqdn = %entry.fqdn, "announcement refused by policy: no permit for this zone");
            self.lock().policy_refused.insert(child.to_string());
            if self
                .inner
                .catalog
                .get(&entry.key)
                .is_some_and(|e| e.source == source)
            {
                self.inner.catalog.remove(&entry.key);
            }
            return Err(Refusal::new(
                "announce",
                RefusalCode::PermissionDenied,
                if verdict.policies.is_empty() {
                    format!(
                        "{} may not announce {}: no Cedar announce permit",
                        ann.cluster, entry.fqdn
                    )
                } else {
                    format!(
                        "{} may not announce {}: forbidden by {}",
                        ann.cluster,
                        entry.fqdn,
                        verdict.policies.join(", ")
                    )
                },
            )
            .with_policies(verdict.policies));
        }
        if let Some(existing) = self.inner.catalog.get(&entry.key)
            && existing.source != source
        {
            warn!(child, key = %entry.key, existing = %existing.source, "announcement collides with an entry from elsewhere; keeping the existing one");
            return Err(Refusal::new(
                "collision",
                RefusalCode::AlreadyExists,
                format!("{} is already held from {}", entry.key, existing.source),
            ));
        }
        self.claim_name(&entry)?;
        self.inner.catalog.upsert(entry);
        Ok(())
    }

    /// Send a refusal of one entry back to `child` (the stream goes on).
    pub fn reject_to_child(&self, child: &str, r: fed::Rejection) {
        let link = self.lock().sessions.get(child).map(|s| s.link.clone());
        if let Some(link) = link {
            self.down(&link, fed::parent_message::Payload::Rejection(r));
        }
    }

    /// The policy set changed: decide again what each child carries (from what it declared),
    /// every grant held here, and every question without a granted answer.
    pub fn policies_changed(&self) {
        let claimed: Vec<(String, fed::SubtreeMembership)> = self
            .lock()
            .claimed
            .iter()
            .map(|(c, m)| (c.clone(), m.clone()))
            .collect();
        for (child, membership) in claimed {
            let before = self.lock().tree.children().get(&child).cloned();
            if let Err(e) = self.update_child_subtree(&child, &membership) {
                warn!(%child, error = %e, "the child's subtree no longer holds under the new policies");
                continue;
            }
            let st = self.lock();
            let grew = st
                .tree
                .children()
                .get(&child)
                .is_some_and(|now| before.is_none_or(|b| !now.is_subset(&b)));
            // Entries of the newly carried clusters, and those a policy refused, are decided
            // again when the child sends them again after reconnecting (and the child learns
            // which refusals no longer stand from the confirmation of its snapshot).
            let refused = st.policy_refused.contains(&child);
            if (grew || refused)
                && let Some(session) = st.sessions.get(&child)
            {
                info!(%child, grew, refused, "the policies changed; asking the child to reconnect and resend");
                session.link.resync(Resync::PoliciesChanged);
            }
        }
        self.recheck_grants();
        self.retry_unanswered();
    }

    /// A tracker for what one session of a child announces, started when the session attaches
    /// (before its first announcement).
    pub fn track_announcements(&self) -> SessionAnnouncements {
        SessionAnnouncements {
            since: self.inner.catalog.revision(),
            older: BTreeSet::new(),
        }
    }

    /// What `child`'s subtree has in the catalog now.
    fn child_entries(&self, child: &str) -> Vec<Arc<ServiceEntry>> {
        self.inner.catalog.list(&crate::catalog::ListFilter {
            source: Some(self.child_source(child)),
            ..Default::default()
        })
    }

    /// Remove these entries of `child`'s subtree by key. Only what goes is touched: replacing the
    /// source with copies of what stays cost a transient copy of every entry (a heap the
    /// allocator kept, ~120 B per service at a loaded root). Returns how many were removed.
    fn remove_child_entries(&self, child: &str, gone: &[Arc<ServiceEntry>]) -> usize {
        let keys: Vec<ServiceKey> = gone.iter().map(|e| e.key.clone()).collect();
        let source = self.child_source(child);
        self.inner
            .catalog
            .update_source(&source, Vec::new(), &keys)
            .1
    }

    /// The child finished its snapshot: drop whatever of its subtree it did not announce in
    /// this session.
    pub fn child_snapshot_complete(&self, child: &str, announced: &SessionAnnouncements) {
        let mut stale = self.child_entries(child);
        stale.retain(|e| !announced.covers(e));
        let removed = self.remove_child_entries(child, &stale);
        // The child's snapshot is complete: what it holds now is all its subtree owns, so
        // names held for its clusters and not announced again are free.
        {
            let mut st = self.lock();
            if !st.reserved.is_empty()
                && let Some(carried) = st.tree.children().get(child).cloned()
            {
                st.reserved
                    .release_clusters(carried.iter().map(|c| c.as_str()));
            }
        }
        if removed > 0 {
            info!(
                child,
                removed, "removed stale announcements after the child's snapshot"
            );
        }
        self.bump();
    }

    /// Tell `child` its snapshot up to `marker` was applied: every refusal of what it sent
    /// before the marker was sent before this confirmation.
    pub fn confirm_snapshot(&self, child: &str, marker: fed::SnapshotComplete) {
        let link = self.lock().sessions.get(child).map(|s| s.link.clone());
        if let Some(link) = link {
            self.down(
                &link,
                fed::parent_message::Payload::SnapshotComplete(marker),
            );
        }
    }

    /// May `child` speak for `cluster` (announce it, or ask on its behalf)?
    pub fn check_claim(&self, child: &str, cluster: &str) -> Result<(), TreeError> {
        self.lock().tree.check_claim(child, cluster)
    }

    /// A hop-by-hop acknowledgement from `child`.
    pub fn child_route_ack(&self, child: &str, ack: &fed::RouteAck) {
        let mut st = self.lock();
        if let Some(q) = st.route_queues.get_mut(child) {
            q.pending.remove(&ack.route_id);
        }
        drop(st);
        if !ack.error.is_empty() {
            warn!(child, route = ack.route_id, error = %ack.error, "child could not apply a route");
        }
        self.bump();
    }
}
