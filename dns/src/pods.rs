//! Pod IP → namespace index (pure): how transparent resolution and namespace mapping find the
//! namespace of the pod asking a question from its source address.
//!
//! Fed from a Pod watch (host-network pods excluded by the feed: their address is the node's).
//! When an address is reused, the pod applied last holds it; deleting a pod releases only the
//! addresses it still holds.

use std::collections::HashMap;
use std::net::IpAddr;

/// `(namespace, name)` of a pod.
type PodId = (String, String);

/// Source address → namespace of the pod using it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodIndex {
    by_ip: HashMap<IpAddr, PodId>,
    by_pod: HashMap<PodId, Vec<IpAddr>>,
}

impl PodIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record pod `namespace/name` with its addresses (replacing what it had).
    pub fn apply(&mut self, namespace: &str, name: &str, ips: &[IpAddr]) {
        let id = (namespace.to_string(), name.to_string());
        self.release(&id);
        let mut ips: Vec<IpAddr> = ips.iter().map(|ip| ip.to_canonical()).collect();
        ips.sort_unstable();
        ips.dedup();
        for ip in &ips {
            self.by_ip.insert(*ip, id.clone());
        }
        if !ips.is_empty() {
            self.by_pod.insert(id, ips);
        }
    }

    /// Forget pod `namespace/name`.
    pub fn remove(&mut self, namespace: &str, name: &str) {
        self.release(&(namespace.to_string(), name.to_string()));
    }

    /// Forget every pod.
    pub fn clear(&mut self) {
        self.by_ip.clear();
        self.by_pod.clear();
    }

    fn release(&mut self, id: &PodId) {
        if let Some(ips) = self.by_pod.remove(id) {
            for ip in ips {
                if self.by_ip.get(&ip) == Some(id) {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }

    /// The namespace of the pod using `ip` (IPv4-mapped IPv6 addresses match their IPv4 form).
    pub fn namespace_of(&self, ip: IpAddr) -> Option<&str> {
        self.by_ip
            .get(&ip.to_canonical())
            .map(|(ns, _)| ns.as_str())
    }

    /// Number of addresses indexed.
    pub fn len(&self) -> usize {
        self.by_ip.len()
    }

    /// True when no address is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn lookup_update_and_removal() {
        let mut idx = PodIndex::new();
        idx.apply("foo", "a", &[ip("10.0.0.1"), ip("fd00::1")]);
        assert_eq!(idx.namespace_of(ip("10.0.0.1")), Some("foo"));
        assert_eq!(idx.namespace_of(ip("fd00::1")), Some("foo"));
        assert_eq!(idx.namespace_of(ip("::ffff:10.0.0.1")), Some("foo"));
        assert_eq!(idx.namespace_of(ip("10.0.0.2")), None);
        idx.apply("foo", "a", &[ip("10.0.0.3")]);
        assert_eq!(idx.namespace_of(ip("10.0.0.1")), None);
        assert_eq!(idx.namespace_of(ip("10.0.0.3")), Some("foo"));
        idx.remove("foo", "a");
        assert!(idx.is_empty());
    }

    #[test]
    fn reused_address_belongs_to_the_latest_pod() {
        let mut idx = PodIndex::new();
        idx.apply("old", "a", &[ip("10.0.0.1")]);
        idx.apply("new", "b", &[ip("10.0.0.1")]);
        assert_eq!(idx.namespace_of(ip("10.0.0.1")), Some("new"));
        // The old pod going away does not take the address from the new one.
        idx.remove("old", "a");
        assert_eq!(idx.namespace_of(ip("10.0.0.1")), Some("new"));
        assert_eq!(idx.len(), 1);
        idx.clear();
        assert_eq!(idx.namespace_of(ip("10.0.0.1")), None);
    }
}
