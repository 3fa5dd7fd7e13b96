//! The zone data model (pure): what `xcc dns` serves, derived from the binder's Services.
//!
//! Inputs are [`ServiceInfo`]s — the feed's view of a Service (key, annotations, cluster IPs,
//! ports), whether it came from a Kubernetes watch or from a static records file. Each Service
//! contributes up to two names:
//! - the value of its `connectivity.tanzu.vmware.com/fqdn` annotation (only annotated Services
//!   count), canonicalised to lowercase (so mixed-case annotations resolve);
//! - its MCS name `<origin-name>.<origin-namespace>.svc.clusterset.local` when it carries the
//!   origin annotations of [`xcc_proto::mapping`].
//!
//! A name claimed by several Services is decided by how each claims it, never by the order
//! they arrive in (deterministic, not last-writer-wins) and the others are reported as a
//! [`Conflict`]:
//! 1. a Service whose FQDN annotation *is* the name beats every Service that claims it only
//!    through its origin annotations — the FQDN is the name the record was checked and owned
//!    under (allowedDomains, the tree's one-owner rule), the origin is a second name beside it;
//! 2. among Services whose FQDN is the name, the lowest `namespace/name` owns it (static
//!    records, keyed `""/<fqdn>`, first);
//! 3. Services that all claim it through their origin annotations are one service exported by
//!    several clusters (the Multi-Cluster Services rule): the name answers with all their
//!    addresses and ports, and none of them is a loser.
//!
//! Each name gets A and AAAA records from the cluster IPs (dual stack) and, per named port, an SRV record at
//! `_<port>._<proto>.<name>`. Every ancestor of a name inside its zone exists as an empty
//! non-terminal, so it answers NODATA rather than NXDOMAIN (RFC 8020).
//!
//! A zone stores each name once, lowercase, in DNS wire format relative to its apex, with its
//! records in flat arrays and a hash table of node indices, so a lookup by the bytes of a query
//! needs no `Name` and the zone costs no allocation per name. A zone's SOA serial changes only
//! when its records change: it becomes `max(previous + 1, now)` in Unix seconds, so it also
//! keeps increasing across restarts.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_proto::rr::Name;
use serde::{Deserialize, Serialize};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION, validate_namespace};
use xcc_proto::names::{CLUSTERSET_ZONE, FQDN_ANNOTATION, canonical_fqdn, clusterset_fqdn};

/// Identity of a Service: `namespace/name`. Orders by namespace, then name (the ownership rule).
/// The parts are shared, not copied, by clones: each zone name keeps its owner's key.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Namespace of the Service (`""` for static records).
    pub namespace: Arc<str>,
    /// Name of the Service.
    pub name: Arc<str>,
}

impl ServiceKey {
    /// A key from its parts.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Transport protocol of a Service port, as Kubernetes spells it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum PortProtocol {
    /// TCP (the Kubernetes default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl PortProtocol {
    /// The SRV label of the protocol, without the underscore (`tcp`, `udp`, `sctp`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// A Service port; only named ports get SRV records.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedPort {
    /// Port name (`http`); SRV records are served at `_<name>._<protocol>.<fqdn>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Port number.
    pub port: u16,
    /// Transport protocol (default TCP).
    #[serde(default)]
    pub protocol: PortProtocol,
}

/// The feed's view of one Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    /// `namespace/name` of the Service.
    pub key: ServiceKey,
    /// Its annotations that name it (the only ones the zone reads).
    pub annotations: NameAnnotations,
    /// Its cluster IPs (`spec.clusterIPs`: one per family; empty for headless Services).
    pub cluster_ips: Vec<IpAddr>,
    /// Its ports.
    pub ports: Vec<NamedPort>,
}

/// The annotations that name a Service: the FQDN and the origin pair. Collected from any
/// annotations (others are ignored), so a stored Service costs no more than these values
/// (shared, not copied: a static record's FQDN is also its key's name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NameAnnotations {
    /// [`FQDN_ANNOTATION`].
    pub fqdn: Option<Arc<str>>,
    /// [`ORIGIN_NAMESPACE_ANNOTATION`].
    pub origin_namespace: Option<Arc<str>>,
    /// [`ORIGIN_NAME_ANNOTATION`].
    pub origin_name: Option<Arc<str>>,
}

impl<K: AsRef<str>, V: Into<String>> FromIterator<(K, V)> for NameAnnotations {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(annotations: I) -> Self {
        let mut out = Self::default();
        for (key, value) in annotations {
            let slot = match key.as_ref() {
                FQDN_ANNOTATION => &mut out.fqdn,
                ORIGIN_NAMESPACE_ANNOTATION => &mut out.origin_namespace,
                ORIGIN_NAME_ANNOTATION => &mut out.origin_name,
                _ => continue,
            };
            *slot = Some(value.into().into());
        }
        out
    }
}

/// A Service name that could not be served, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// The Service.
    pub key: ServiceKey,
    /// The name as given (annotation value or derived MCS name).
    pub name: String,
    /// Why it is not served.
    pub reason: String,
}

/// Several Services claim one name; the winner owns it (see the module's rules).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The contested name (canonical, no trailing dot).
    pub name: String,
    /// The Service that owns it.
    pub winner: ServiceKey,
    /// The Services that lost, sorted.
    pub losers: Vec<ServiceKey>,
}

/// One SRV target: `port` on `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrvTarget {
    /// The service port.
    pub port: u16,
    /// The target host (the Service's own name).
    pub target: Name,
}

/// An SRV record as stored: the port and the node of its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SrvEntry {
    port: u16,
    target: u32,
}

/// The records at one name, borrowed from its zone. An empty node is an empty non-terminal.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// A records.
    pub v4: &'a [Ipv4Addr],
    /// AAAA records.
    pub v6: &'a [Ipv6Addr],
    srv: &'a [SrvEntry],
    zone: &'a Zone,
}

impl Node<'_> {
    /// True when the node holds no records (an empty non-terminal).
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty() && self.srv.is_empty()
    }

    /// SRV records, their targets as names (lowercase, fully qualified).
    pub fn srv(&self) -> Vec<SrvTarget> {
        self.srv
            .iter()
            .map(|s| SrvTarget {
                port: s.port,
                target: self.zone.name_at(s.target as usize),
            })
            .collect()
    }

    /// The node of an SRV target (always present: targets are the Service's own name).
    pub fn srv_target_node(&self, target: &SrvTarget) -> Option<Node<'_>> {
        self.zone.node(&target.target)
    }
}

/// Where one node's data ends in the zone's arrays (it starts where the previous node's ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NodeEnds {
    name: u32,
    v4: u32,
    v6: u32,
    srv: u32,
}

/// The records of a zone in flat arrays, nodes sorted by name: what the serial compares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Records {
    /// Every node's name relative to the apex, lowercase wire format (labels with their length
    /// bytes, no apex, no root label), concatenated in node order. The apex's is empty.
    names: Vec<u8>,
    nodes: Vec<NodeEnds>,
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
    srv: Vec<SrvEntry>,
}

/// No owner: an empty non-terminal or the apex.
const NO_OWNER: u32 = u32::MAX;

/// One authoritative zone, stored compactly: every name once, in lowercase wire format, with an
/// open-addressing table of node indices for lookups by wire name (no per-name allocation).
#[derive(Clone, Debug)]
pub struct Zone {
    apex: Name,
    /// The apex in lowercase wire format, root label included.
    apex_wire: Box<[u8]>,
    serial: u32,
    records: Records,
    /// Per node, the index of its owner in `owners` (or [`NO_OWNER`]).
    owner_of: Vec<u32>,
    owners: Vec<ServiceKey>,
    /// Slots holding node index + 1 (0 = empty); a power of two, at most half full.
    table: Vec<u32>,
    hasher: RandomState,
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.apex == other.apex
            && self.serial == other.serial
            && self.records == other.records
            && self.owner_of == other.owner_of
            && self.owners == other.owners
    }
}

impl Eq for Zone {}

/// Append `labels` to `out` in lowercase wire format (length byte, then the label).
fn push_wire_labels<'a>(out: &mut Vec<u8>, labels: impl Iterator<Item = &'a [u8]>) {
    for label in labels {
        // Labels of a `Name` are at most 63 bytes.
        out.push(u8::try_from(label.len()).unwrap_or(63));
        out.extend(label.iter().map(u8::to_ascii_lowercase));
    }
}

impl Zone {
    /// The apex (lowercase, fully qualified).
    pub fn apex(&self) -> &Name {
        &self.apex
    }

    /// The apex in lowercase wire format, root label included.
    pub fn apex_wire(&self) -> &[u8] {
        &self.apex_wire
    }

    /// The SOA serial.
    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// The node at `name` (any case); `None` means the name does not exist. The apex always
    /// exists.
    pub fn node(&self, name: &Name) -> Option<Node<'_>> {
        self.index_of(name).map(|i| self.node_at(i))
    }

    /// The node at `relative`: a name below the apex in lowercase wire format, without the apex
    /// (empty for the apex itself).
    pub fn node_by_wire(&self, relative: &[u8]) -> Option<Node<'_>> {
        self.lookup(relative).map(|i| self.node_at(i))
    }

    /// The Service owning the records at `name`, if any (empty non-terminals have none).
    pub fn owner(&self, name: &Name) -> Option<&ServiceKey> {
        let owner = *self.owner_of.get(self.index_of(name)?)?;
        self.owners.get(owner as usize)
    }

    /// Names with records (not counting empty non-terminals and the apex).
    pub fn record_names(&self) -> usize {
        self.owner_of.iter().filter(|&&o| o != NO_OWNER).count()
    }

    fn index_of(&self, name: &Name) -> Option<usize> {
        if !in_zone(name, &self.apex) {
            return None;
        }
        let below = usize::from(name.num_labels() - self.apex.num_labels());
        let mut relative = Vec::with_capacity(name.len());
        push_wire_labels(&mut relative, name.iter().take(below));
        self.lookup(&relative)
    }

    fn lookup(&self, relative: &[u8]) -> Option<usize> {
        let mask = self.table.len().checked_sub(1)?;
        let mut slot = self.hasher.hash_one(relative) as usize & mask;
        loop {
            let index = (*self.table.get(slot)? as usize).checked_sub(1)?;
            if self.name_bytes(index) == relative {
                return Some(index);
            }
            slot = (slot + 1) & mask;
        }
    }

    fn span(&self, index: usize, end: impl Fn(&NodeEnds) -> u32) -> std::ops::Range<usize> {
        let start = match index.checked_sub(1) {
            Some(prev) => self.records.nodes.get(prev).map_or(0, &end),
            None => 0,
        };
        let stop = self.records.nodes.get(index).map_or(start, end);
        start as usize..stop as usize
    }

    fn name_bytes(&self, index: usize) -> &[u8] {
        self.records
            .names
            .get(self.span(index, |n| n.name))
            .unwrap_or_default()
    }

    fn node_at(&self, index: usize) -> Node<'_> {
        let r = &self.records;
        Node {
            v4: r.v4.get(self.span(index, |n| n.v4)).unwrap_or_default(),
            v6: r.v6.get(self.span(index, |n| n.v6)).unwrap_or_default(),
            srv: r.srv.get(self.span(index, |n| n.srv)).unwrap_or_default(),
            zone: self,
        }
    }

    /// The full name of node `index` (lowercase, fully qualified).
    fn name_at(&self, index: usize) -> Name {
        let mut labels = Vec::new();
        let mut rest = self.name_bytes(index);
        while let Some((&len, tail)) = rest.split_first() {
            let (label, tail) = tail.split_at(usize::from(len).min(tail.len()));
            labels.push(label);
            rest = tail;
        }
        labels.extend(self.apex.iter());
        let mut name = Name::from_labels(labels).unwrap_or_else(|_| self.apex.clone());
        name.set_fqdn(true);
        name
    }
}

/// Every configured zone with its records: the immutable snapshot the server answers from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZoneSet {
    /// Most specific (most labels) first, so the first match is the longest.
    zones: Vec<Zone>,
    conflicts: Vec<Conflict>,
    rejected: Vec<Rejected>,
}

/// Whether `name` equals or is below `apex`, comparing labels without regard to ASCII case.
pub fn in_zone(name: &Name, apex: &Name) -> bool {
    name.num_labels() >= apex.num_labels()
        && name
            .iter()
            .rev()
            .zip(apex.iter().rev())
            .all(|(a, b)| a.eq_ignore_ascii_case(b))
}

/// Parse a canonical name (no trailing dot) into a fully qualified [`Name`].
pub fn fqdn_name(name: &str) -> Option<Name> {
    let mut n = Name::from_ascii(name).ok()?;
    n.set_fqdn(true);
    Some(n)
}

impl ZoneSet {
    /// Build the zones `apexes` (canonical names, as from [`canonical_fqdn`]) from `services`.
    ///
    /// `previous` supplies serials: a zone whose records are unchanged keeps its serial, a
    /// changed or new zone gets `max(previous + 1, now_unix)`.
    pub fn build<'a>(
        apexes: &[String],
        services: impl IntoIterator<Item = &'a ServiceInfo>,
        previous: Option<&ZoneSet>,
        now_unix: u32,
    ) -> ZoneSet {
        let mut zones = draft_zones(apexes);
        let mut rejected = Vec::new();
        let claims = claim_names(services, &zones, &mut rejected);
        let mut conflicts = Vec::new();
        let winners = owners_of(&claims, &mut conflicts);
        add_names(&mut zones, &winners);
        ZoneSet {
            zones: finish_zones(zones, previous, now_unix),
            conflicts,
            rejected,
        }
    }

    /// The zone holding `name` (the longest matching apex), if any.
    pub fn find_zone(&self, name: &Name) -> Option<&Zone> {
        self.zones.iter().find(|z| in_zone(name, &z.apex))
    }

    /// The zones, most specific first.
    pub fn zones(&self) -> &[Zone] {
        &self.zones
    }

    /// Names claimed by more than one Service at the last build.
    pub fn conflicts(&self) -> &[Conflict] {
        &self.conflicts
    }

    /// Names that could not be served at the last build.
    pub fn rejected(&self) -> &[Rejected] {
        &self.rejected
    }

    /// Names with records across all zones.
    pub fn record_names(&self) -> usize {
        self.zones.iter().map(Zone::record_names).sum()
    }
}

#[path = "zone_build.rs"]
mod build;
use build::{add_names, claim_names, draft_zones, finish_zones, owners_of};

#[cfg(test)]
#[path = "zone_tests.rs"]
mod tests;
