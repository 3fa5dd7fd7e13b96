//! The parent link as this level sees it: the session's way up, what the parent sends down
//! (ancestry, answers, route notifications, refusals, clash notices) and the refusals kept.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use tracing::{info, warn};
use xcc_proto::xcc::federation::v1 as fed;

use super::super::convert::announcement;
use super::super::tree::{Direction, TreeError};
use super::{ANNOUNCEMENT_KIND, Level, ParentPort, QUERY_KIND, Resync, State, msg_up, refused_key};
use crate::catalog::CatalogEvent;

/// Most refused entries kept from the parent: more than any subtree sends in practice, and a
/// bound on what a parent can make us store. Past it a refusal is logged (and counted) only.
const KEEP_REFUSED: usize = 65_536;

impl Level {
    /// Entries our parent refused (the latest refusal of each), by kind, cluster, namespace and
    /// name: those refused in the current session, and those refused before that the parent has
    /// not yet decided again.
    pub fn rejections(&self) -> Vec<(SystemTime, fed::Rejection)> {
        self.lock().refused.values().cloned().collect()
    }

    /// Whether the parent confirmed it applied this session's snapshot: from then on
    /// [`Level::rejections`] is what it decided about every entry we announced, and an entry
    /// without a rejection was accepted (or is still being decided after a change).
    pub fn refusals_confirmed(&self) -> bool {
        self.lock().refusals_confirmed
    }

    /// The parent's latest refusal of our announcement of `namespace/name`, if it stands.
    pub fn refusal_of(&self, namespace: &str, name: &str) -> Option<fed::Rejection> {
        let key = (
            ANNOUNCEMENT_KIND.to_string(),
            self.inner.cluster.clone(),
            namespace.to_string(),
            name.to_string(),
        );
        self.lock().refused.get(&key).map(|(_, r)| r.clone())
    }

    /// A parent session begins: queue the subtree membership on `up` first and make `up` the
    /// way up, so every later membership change, query and acknowledgement follows it. Returns
    /// the persistent questions to re-issue once the snapshot is sent; the snapshot itself is
    /// streamed from the catalog by the parent link's stream (`federation::upward`).
    pub fn begin_upward(&self, up: impl ParentPort + 'static) -> Vec<fed::ServiceQuery> {
        let up: Arc<dyn ParentPort> = Arc::new(up);
        let mut st = self.lock();
        self.send_up(Some(up.clone()), self.membership_locked(&st));
        st.parent_tx = Some(up);
        // Earlier refusals of what the snapshot holds stand until the parent confirms it
        // without repeating them; a refused question stands until it is answered (it is asked
        // again after the snapshot).
        st.refused_before = st
            .refused
            .keys()
            .filter(|k| k.0 != QUERY_KIND)
            .cloned()
            .collect();
        st.refusals_confirmed = false;
        let queries = st
            .subs
            .iter()
            .filter(|(_, s)| s.persistent)
            .map(|(id, s)| self.query_msg(*id, s))
            .collect();
        drop(st);
        self.bump();
        queries
    }

    pub fn parent_disconnected(&self) {
        self.lock().parent_tx = None;
        self.bump();
    }

    pub fn parent_is_connected(&self) -> bool {
        self.lock().parent_tx.is_some()
    }

    /// The subtree membership message (what a snapshot starts with).
    pub fn membership(&self) -> fed::ChildMessage {
        self.membership_locked(&self.lock())
    }

    /// The upward message for a catalog change, if it concerns our subtree.
    pub fn upward_event(&self, ev: &CatalogEvent) -> Option<fed::ChildMessage> {
        // A changed or withdrawn entry is decided again by the parent: its old refusal goes.
        if ev.entry().source.in_subtree() {
            let mut st = self.lock();
            if !st.refused.is_empty() {
                let k = &ev.entry().key;
                st.refused.remove(&(
                    ANNOUNCEMENT_KIND.to_string(),
                    k.cluster.to_string(),
                    k.namespace.to_string(),
                    k.name.to_string(),
                ));
            }
        }
        match ev {
            CatalogEvent::Upsert(e) if e.source.in_subtree() => Some(msg_up(
                fed::child_message::Payload::ServiceAnnouncement(announcement(e, false)),
            )),
            CatalogEvent::Delete(e) if e.source.in_subtree() => Some(msg_up(
                fed::child_message::Payload::ServiceAnnouncement(announcement(e, true)),
            )),
            _ => None,
        }
    }

    pub(super) fn membership_locked(&self, st: &State) -> fed::ChildMessage {
        msg_up(fed::child_message::Payload::Subtree(
            fed::SubtreeMembership {
                clusters: st.tree.subtree().into_iter().collect(),
                resync: false,
            },
        ))
    }

    /// A message from the parent.
    pub fn on_parent_message(&self, msg: fed::ParentMessage) -> Result<(), TreeError> {
        use fed::parent_message::Payload;
        match msg.payload {
            Some(Payload::Ancestry(a)) => self.parent_ancestry(a)?,
            Some(Payload::ServiceQueryResponse(r)) => self.route_answer(r),
            Some(Payload::RouteNotification(n)) => self.parent_route(n),
            Some(Payload::Rejection(r)) => self.parent_refused(r),
            Some(Payload::NameClash(n)) => self.route_clash(n),
            Some(Payload::SnapshotComplete(_)) => self.parent_applied_snapshot(),
            Some(Payload::ServiceAnnouncement(_)) | None => {}
        }
        Ok(())
    }

    /// Our ancestry (the parent's path to the root): our children's changed too.
    fn parent_ancestry(&self, a: fed::Ancestry) -> Result<(), TreeError> {
        let mut st = self.lock();
        st.tree.set_ancestors(a.path)?;
        let mut path = st.tree.ancestors().to_vec();
        path.push(self.inner.cluster.clone());
        for session in st.sessions.values() {
            self.down(
                &session.link,
                fed::parent_message::Payload::Ancestry(fed::Ancestry { path: path.clone() }),
            );
        }
        drop(st);
        self.bump();
        Ok(())
    }

    /// A route notification on its way to the owner (applied here if we are it), acknowledged
    /// to the parent.
    fn parent_route(&self, n: fed::RouteNotification) {
        let mine = self.lock().tree.direction(&n.target_cluster) == Direction::Local;
        let error = match mine && !n.revoked {
            true => self
                .owner_check(&n)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            false => String::new(),
        };
        let applied = self.route_notification(n.clone());
        let tx = self.lock().parent_tx.clone();
        self.send_up(
            tx,
            msg_up(fed::child_message::Payload::RouteAck(fed::RouteAck {
                route_id: n.route_id,
                applied,
                error,
            })),
        );
    }

    /// The parent refused an entry of our subtree: kept (bounded by [`KEEP_REFUSED`]) and, if
    /// a cluster below sent it, forwarded to that cluster's child.
    fn parent_refused(&self, r: fed::Rejection) {
        warn!(kind = %r.kind, cluster = %r.cluster, namespace = %r.namespace, name = %r.name, code = r.code, check = %r.check, policies = ?r.policy_ids, reason = %r.reason, refused_by = %r.refused_by, "the parent refused an entry");
        let key = refused_key(&r.kind, &r.cluster, &r.namespace, &r.name, &r.fqdn);
        let mut st = self.lock();
        // What a cluster below announced or asked: the refusal goes on down to it, so
        // the sender stores and shows it (it is kept here too, as our subtree's).
        if (r.kind == ANNOUNCEMENT_KIND || r.kind == QUERY_KIND)
            && let Direction::Child(child) = st.tree.direction(&r.cluster)
            && let Some(session) = st.sessions.get(&child)
        {
            self.down(
                &session.link,
                fed::parent_message::Payload::Rejection(r.clone()),
            );
        }
        st.refused_before.remove(&key);
        if st.refused.len() < KEEP_REFUSED || st.refused.contains_key(&key) {
            st.refused.insert(key, (SystemTime::now(), r));
        } else {
            self.inner.overflows.inc();
        }
        drop(st);
        self.bump();
    }

    /// The parent applied the snapshot of this session: the refusals it did not repeat are
    /// lifted.
    fn parent_applied_snapshot(&self) {
        let mut st = self.lock();
        let lifted = std::mem::take(&mut st.refused_before);
        for k in &lifted {
            st.refused.remove(k);
        }
        st.refusals_confirmed = true;
        // A lifted refusal of what a cluster below announced was forwarded to it: its
        // child is asked to send its snapshot again, and the refusal goes there when
        // we confirm that snapshot without repeating it.
        let children: BTreeSet<String> = lifted
            .iter()
            .filter_map(|k| match st.tree.direction(&k.1) {
                Direction::Child(child) => Some(child),
                _ => None,
            })
            .collect();
        for child in children {
            if let Some(session) = st.sessions.get(&child) {
                info!(%child, "a refusal of the child's subtree was lifted above; asking it to reconnect and resend");
                session.link.resync(Resync::RefusalLifted);
            }
        }
        drop(st);
        self.bump();
    }
}
