//! One owner per name: the first service to hold an FQDN or a `namespace/name` keeps it; a
//! later claimant is refused and the owner told (a [`fed::NameClash`] routed toward it).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::SystemTime;

use tracing::warn;
use xcc_proto::xcc::federation::v1 as fed;

use super::super::tree::Direction;
use super::{Clash, Level, Refusal, RefusalCode, reservations};
use crate::catalog::{ServiceEntry, ServiceKey};

/// How many refused claims are remembered for the admin API (the log has every one; this is
/// the recent window an operator looks at).
const KEEP_REPORTS: usize = 256;

fn push_bounded<T>(q: &mut VecDeque<T>, item: T) {
    if q.len() >= KEEP_REPORTS {
        q.pop_front();
    }
    q.push_back(item);
}

impl Level {
    /// One owner per name: the first service to hold an FQDN, or a `namespace/name` (what a
    /// query by name resolves), keeps it; a later claimant with another key is refused, the
    /// clash recorded here and reported to the owner. Sort order plays no part, so a cluster
    /// named `a9` gains nothing over `c2`. The holder is the service in the catalog (this
    /// level's subtree, local exports included) or, while it is away, its reservation.
    pub(super) fn claim_name(&self, entry: &ServiceEntry) -> Result<(), Refusal> {
        let fqdn = entry.fqdn.as_str();
        let by_name = format!("{}/{}", entry.key.namespace, entry.key.name);
        let other = |e: &Arc<ServiceEntry>| e.source.in_subtree() && e.key != entry.key;
        let fqdn_holder = self
            .inner
            .catalog
            .by_fqdn(fqdn)
            .into_iter()
            .filter(|e| other(e) && e.fqdn == fqdn)
            .map(|e| e.key.clone())
            .min();
        let name_holder = self
            .inner
            .catalog
            .by_name(&entry.key.namespace, &entry.key.name)
            .into_iter()
            .filter(other)
            .map(|e| e.key.clone())
            .min();
        let mut st = self.lock();
        self.expire_locked(&mut st);
        let held = |name: &str| st.reserved.get(name).filter(|k| **k != entry.key).cloned();
        let clash = fqdn_holder
            .or_else(|| held(fqdn))
            .map(|k| (fqdn.to_string(), k))
            .or_else(|| {
                name_holder
                    .or_else(|| held(&by_name))
                    .map(|k| (by_name.clone(), k))
            });
        if let Some((name, owner)) = clash {
            let clash = Clash {
                at: SystemTime::now(),
                fqdn: fqdn.to_string(),
                owner: owner.clone(),
                claimant: entry.key.clone(),
                refused_by: self.inner.cluster.clone(),
            };
            push_bounded(&mut st.clashes, clash);
            drop(st);
            warn!(%name, %owner, claimant = %entry.key, "refusing a claim on a name another service owns");
            self.route_clash(fed::NameClash {
                fqdn: fqdn.to_string(),
                owner_cluster: owner.cluster.to_string(),
                owner_namespace: owner.namespace.to_string(),
                owner_name: owner.name.to_string(),
                claimant_cluster: entry.key.cluster.to_string(),
                claimant_namespace: entry.key.namespace.to_string(),
                claimant_name: entry.key.name.to_string(),
                refused_by: self.inner.cluster.clone(),
            });
            self.bump();
            return Err(Refusal::new(
                "owner",
                RefusalCode::AlreadyExists,
                format!("{name} is owned by {owner}; the first owner keeps a name"),
            ));
        }
        // The owner is back: it holds its names through the catalog again.
        st.reserved.release(&entry.key);
        Ok(())
    }

    /// Hold the names of `entries` (leaving with their child) for their owners.
    pub(super) fn reserve_names<'a>(&self, entries: impl Iterator<Item = &'a ServiceEntry>) {
        let now = reservations::unix_now();
        let mut st = self.lock();
        for e in entries {
            let by_name = format!("{}/{}", e.key.namespace, e.key.name);
            st.reserved
                .insert(Arc::from(e.fqdn.as_str()), e.key.clone(), now);
            st.reserved
                .insert(Arc::from(by_name.as_str()), e.key.clone(), now);
        }
    }

    /// Deliver a clash notice toward the owner's cluster (recorded there and on the way).
    pub(crate) fn route_clash(&self, n: fed::NameClash) {
        let st = self.lock();
        match st.tree.direction(&n.owner_cluster) {
            Direction::Local => {
                drop(st);
                self.record_clash_notice(&n);
            }
            Direction::Child(child) => {
                let link = st.sessions.get(&child).map(|s| s.link.clone());
                drop(st);
                if let Some(link) = link {
                    self.down(&link, fed::parent_message::Payload::NameClash(n));
                }
            }
            Direction::Up => {
                drop(st);
                self.hold_clash(n);
            }
        }
    }

    fn record_clash_notice(&self, n: &fed::NameClash) {
        warn!(fqdn = %n.fqdn, claimant = %n.claimant_cluster, refused_by = %n.refused_by, "another cluster tried to announce a name this cluster owns; it was refused");
        let clash = Clash {
            at: SystemTime::now(),
            fqdn: n.fqdn.clone(),
            owner: ServiceKey::new(&n.owner_cluster, &n.owner_namespace, &n.owner_name),
            claimant: ServiceKey::new(&n.claimant_cluster, &n.claimant_namespace, &n.claimant_name),
            refused_by: n.refused_by.clone(),
        };
        push_bounded(&mut self.lock().clashes, clash);
        self.bump();
    }

    /// Refused claims on `fqdn` seen here (all of them with `None`), oldest first.
    pub fn clashes(&self, fqdn: Option<&str>) -> Vec<Clash> {
        self.lock()
            .clashes
            .iter()
            .filter(|c| fqdn.is_none_or(|f| c.fqdn == f))
            .cloned()
            .collect()
    }
}
