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

/// A node being built: spans of the draft's arrays.
#[derive(Clone, Copy, Debug)]
struct DraftNode {
    name: (u32, u32),
    v4: (u32, u32),
    v6: (u32, u32),
    /// Into `srv`, whose targets are draft node indices.
    srv: (u32, u32),
    owner: u32,
}

fn span<T>(items: &[T], (start, end): (u32, u32)) -> &[T] {
    items.get(start as usize..end as usize).unwrap_or_default()
}

/// A zone being built, in flat arrays (no allocation per name, so building leaves no
/// fragments behind); [`DraftZone::finish`] sorts the nodes by name.
#[derive(Debug)]
struct DraftZone {
    apex: Name,
    names: Vec<u8>,
    nodes: Vec<DraftNode>,
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
    srv: Vec<(u16, u32)>,
    owners: Vec<ServiceKey>,
}

impl DraftZone {
    fn new(apex: Name) -> Self {
        Self {
            apex,
            names: Vec::new(),
            nodes: Vec::new(),
            v4: Vec::new(),
            v6: Vec::new(),
            srv: Vec::new(),
            owners: Vec::new(),
        }
    }

    /// `name`'s wire form relative to the apex (`name` is inside the zone).
    fn relative(&self, name: &Name) -> Vec<u8> {
        let below = usize::from(name.num_labels().saturating_sub(self.apex.num_labels()));
        let mut out = Vec::new();
        push_wire_labels(&mut out, name.iter().take(below));
        out
    }

    /// Add a node; returns its draft index.
    fn push(
        &mut self,
        name: &[u8],
        v4: &[Ipv4Addr],
        v6: &[Ipv6Addr],
        srv: &[(u16, u32)],
        owner: u32,
    ) -> u32 {
        fn extend<T: Copy>(out: &mut Vec<T>, items: &[T]) -> (u32, u32) {
            let start = len_u32(out.len());
            out.extend_from_slice(items);
            (start, len_u32(out.len()))
        }
        let node = DraftNode {
            name: extend(&mut self.names, name),
            v4: extend(&mut self.v4, v4),
            v6: extend(&mut self.v6, v6),
            srv: extend(&mut self.srv, srv),
            owner,
        };
        self.nodes.push(node);
        len_u32(self.nodes.len() - 1)
    }

    fn name(&self, index: u32) -> &[u8] {
        self.nodes
            .get(index as usize)
            .map_or(&[], |n| span(&self.names, n.name))
    }

    /// Draft indices sorted by name; of two nodes with one name the later one stays.
    fn sorted(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..len_u32(self.nodes.len())).collect();
        order.sort_by(|&a, &b| self.name(a).cmp(self.name(b)).then(b.cmp(&a)));
        order.dedup_by(|a, b| self.name(*a) == self.name(*b));
        order
    }

    /// Freeze into a [`Zone`], adding the apex and every empty non-terminal (RFC 8020).
    fn finish(mut self) -> Zone {
        let mut order = self.sorted();
        let mut missing: BTreeSet<Vec<u8>> = BTreeSet::new();
        let exists = |draft: &Self, order: &[u32], name: &[u8]| {
            order.binary_search_by(|&i| draft.name(i).cmp(name)).is_ok()
        };
        if !exists(&self, &order, &[]) {
            missing.insert(Vec::new());
        }
        for &index in &order {
            let mut rest = self.name(index);
            while let Some((&len, tail)) = rest.split_first() {
                rest = tail.get(usize::from(len)..).unwrap_or_default();
                if !rest.is_empty() && !missing.contains(rest) && !exists(&self, &order, rest) {
                    missing.insert(rest.to_vec());
                }
            }
        }
        if !missing.is_empty() {
            for name in &missing {
                self.push(name, &[], &[], &[], NO_OWNER);
            }
            order = self.sorted();
        }
        let count = order.len();
        // Final index of each draft node, for SRV targets.
        let mut position = vec![u32::MAX; self.nodes.len()];
        for (final_index, &draft) in order.iter().enumerate() {
            if let Some(p) = position.get_mut(draft as usize) {
                *p = len_u32(final_index);
            }
        }
        let mut apex_wire = Vec::new();
        push_wire_labels(&mut apex_wire, self.apex.iter());
        apex_wire.push(0);
        let mut records = Records {
            names: Vec::with_capacity(self.names.len()),
            nodes: Vec::with_capacity(count),
            v4: Vec::with_capacity(self.v4.len()),
            v6: Vec::with_capacity(self.v6.len()),
            srv: Vec::with_capacity(self.srv.len()),
        };
        let mut owner_of = Vec::with_capacity(count);
        for &index in &order {
            let Some(node) = self.nodes.get(index as usize) else {
                continue;
            };
            records
                .names
                .extend_from_slice(span(&self.names, node.name));
            records.v4.extend_from_slice(span(&self.v4, node.v4));
            records.v6.extend_from_slice(span(&self.v6, node.v6));
            records.srv.extend(
                span(&self.srv, node.srv)
                    .iter()
                    .filter_map(|&(port, target)| {
                        let target = *position.get(target as usize)?;
                        (target != u32::MAX).then_some(SrvEntry { port, target })
                    }),
            );
            records.nodes.push(NodeEnds {
                name: len_u32(records.names.len()),
                v4: len_u32(records.v4.len()),
                v6: len_u32(records.v6.len()),
                srv: len_u32(records.srv.len()),
            });
            owner_of.push(node.owner);
        }
        let mut zone = Zone {
            apex: self.apex,
            apex_wire: apex_wire.into_boxed_slice(),
            serial: 0,
            records,
            owner_of,
            owners: self.owners,
            table: vec![0; (count * 2).next_power_of_two()],
            hasher: RandomState::new(),
        };
        let mask = zone.table.len() - 1;
        for index in 0..count {
            let mut slot = zone.hasher.hash_one(zone.name_bytes(index)) as usize & mask;
            while zone.table.get(slot).is_some_and(|&s| s != 0) {
                slot = (slot + 1) & mask;
            }
            if let Some(s) = zone.table.get_mut(slot) {
                *s = len_u32(index + 1);
            }
        }
        zone
    }
}

/// An array length as stored in the zone: zones hold far fewer than 2^32 names and records.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
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

/// How a Service claims a name; the better claim sorts first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Claim {
    /// The name is its FQDN annotation.
    Fqdn,
    /// The name is its MCS name, from the origin annotations.
    Origin,
}

/// The zones `apexes` to fill, most specific first (so a name goes to its longest apex), each
/// once.
fn draft_zones(apexes: &[String]) -> Vec<DraftZone> {
    let mut zones: Vec<DraftZone> = apexes
        .iter()
        .filter_map(|a| fqdn_name(a))
        .map(DraftZone::new)
        .collect();
    zones.sort_by(|a, b| {
        (b.apex.num_labels().cmp(&a.apex.num_labels())).then_with(|| a.apex.cmp(&b.apex))
    });
    zones.dedup_by(|a, b| a.apex == b.apex);
    zones
}

/// Every name the `services` claim in one of the `zones`, sorted by name, then how it is
/// claimed, then Service; a name that cannot be served is `rejected`, with why.
fn claim_names<'a>(
    services: impl IntoIterator<Item = &'a ServiceInfo>,
    zones: &[DraftZone],
    rejected: &mut Vec<Rejected>,
) -> Vec<NameClaim<'a>> {
    // (canonical name, zone index, claimant), sorted below: one allocation, not a map. A
    // name already canonical is borrowed from its Service: a copy per name, freed after the
    // build, would leave that much of the heap in holes between the zone's arrays.
    let mut claims: Vec<NameClaim<'a>> = Vec::new();
    for svc in services {
        for (raw, how) in candidate_names(svc, rejected) {
            let reject = |reason: String| Rejected {
                key: svc.key.clone(),
                name: raw.clone(),
                reason,
            };
            let canonical = match canonical_fqdn(&raw) {
                Ok(c) => c,
                Err(e) => {
                    rejected.push(reject(e.to_string()));
                    continue;
                }
            };
            if svc.cluster_ips.is_empty() {
                rejected.push(reject("the Service has no cluster IP".into()));
                continue;
            }
            let Some(name) = fqdn_name(&canonical) else {
                rejected.push(reject("not a DNS name".into()));
                continue;
            };
            let Some(zi) = zones.iter().position(|z| in_zone(&name, &z.apex)) else {
                rejected.push(reject("outside every configured zone".into()));
                continue;
            };
            let canonical = match svc.annotations.fqdn.as_deref() {
                Some(fqdn) if fqdn == canonical => Cow::Borrowed(fqdn),
                _ => Cow::Owned(canonical),
            };
            claims.push((canonical, how, zi, svc));
        }
    }

    // By name, then how it is claimed (its FQDN first), then key; one claim per Service
    // and name (the best).
    claims.sort_by(|a, b| (&a.0, a.1, &a.3.key).cmp(&(&b.0, b.1, &b.3.key)));
    claims.dedup_by(|a, b| a.0 == b.0 && a.3.key == b.3.key);
    claims
}

/// For each claimed name, the claims that own it (the FQDN's, else every origin claim), and
/// the Services that lose it as `conflicts`.
fn owners_of<'c, 'a>(
    claims: &'c [NameClaim<'a>],
    conflicts: &mut Vec<Conflict>,
) -> Vec<(Name, usize, &'c [NameClaim<'a>])> {
    let mut winners: Vec<(Name, usize, &'c [NameClaim<'a>])> = Vec::new();
    for group in claims.chunk_by(|a, b| a.0 == b.0) {
        let Some((canonical, how, zi, winner)) = group.first() else {
            continue;
        };
        // Rule 3: every claim through the origin counts, when no FQDN claims the name.
        let owners = match how {
            Claim::Fqdn => 1,
            Claim::Origin => group.len(),
        };
        let (owners, losers) = group.split_at(owners.min(group.len()));
        let losers: Vec<ServiceKey> = losers.iter().map(|c| c.3.key.clone()).collect();
        if !losers.is_empty() {
            conflicts.push(Conflict {
                name: canonical.to_string(),
                winner: winner.key.clone(),
                losers,
            });
        }
        if let Some(name) = fqdn_name(canonical) {
            winners.push((name, *zi, owners));
        }
    }
    winners
}

/// Add each owned name to its zone: pods' names first, then the services (whose SRV records
/// may target their pods).
fn add_names(zones: &mut [DraftZone], winners: &[(Name, usize, &[NameClaim<'_>])]) {
    // Pods' names first (a headless service's `<hostname>.<cluster>.…`, keyed
    // `<service>/<hostname>.<cluster>`), so their service's SRV records can target them.
    // (zone, namespace, service) → the draft nodes of its pods' names.
    let mut pods: BTreeMap<(usize, &str, &str), Vec<u32>> = BTreeMap::new();
    for (name, zi, owners) in winners {
        let Some(first) = owners.first().map(|c| c.3) else {
            continue;
        };
        if let (Some((service, _)), Some(zone)) =
            (first.key.name.split_once('/'), zones.get_mut(*zi))
            && let Some(node) = add_service(zone, name, owners.iter().map(|c| c.3), None)
        {
            pods.entry((*zi, &*first.key.namespace, service))
                .or_default()
                .push(node);
        }
    }
    for (name, zi, owners) in winners {
        let Some(first) = owners.first().map(|c| c.3) else {
            continue;
        };
        if first.key.name.contains('/') {
            continue;
        }
        let targets = pods
            .get(&(*zi, &*first.key.namespace, &*first.key.name))
            .map(Vec::as_slice);
        if let Some(zone) = zones.get_mut(*zi) {
            add_service(
                zone,
                name,
                owners.iter().map(|c| c.3),
                Some(targets.unwrap_or_default()),
            );
        }
    }
}

/// The finished zones; a zone whose records are unchanged from `previous` keeps its serial, a
/// changed or new one gets `max(previous + 1, now_unix)`.
fn finish_zones(zones: Vec<DraftZone>, previous: Option<&ZoneSet>, now_unix: u32) -> Vec<Zone> {
    zones
        .into_iter()
        .map(|draft| {
            let mut zone = draft.finish();
            let prev = previous.and_then(|p| p.zones.iter().find(|z| z.apex == zone.apex));
            zone.serial = match prev {
                Some(p) if p.records == zone.records => p.serial,
                Some(p) => p.serial.wrapping_add(1).max(now_unix),
                None => now_unix,
            };
            zone
        })
        .collect()
}

/// The names `svc` asks for: its FQDN annotation and its MCS name (raw, not yet validated).
fn candidate_names(svc: &ServiceInfo, rejected: &mut Vec<Rejected>) -> Vec<(String, Claim)> {
    let mut out = Vec::new();
    let annotations = &svc.annotations;
    if let Some(fqdn) = &annotations.fqdn {
        out.push((fqdn.trim().to_string(), Claim::Fqdn));
    }
    if let (Some(ns), Some(name)) = (&annotations.origin_namespace, &annotations.origin_name) {
        let (ns, name) = (ns.trim(), name.trim());
        match (validate_namespace(ns), validate_namespace(name)) {
            (Ok(_), Ok(_)) => out.push((clusterset_fqdn(name, ns), Claim::Origin)),
            (Err(e), _) | (_, Err(e)) => rejected.push(Rejected {
                key: svc.key.clone(),
                name: format!("{name}.{ns}.svc.{CLUSTERSET_ZONE}"),
                reason: e.to_string(),
            }),
        }
    }
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// One claim of a name: (canonical name, how it is claimed, zone index, claimant).
type NameClaim<'a> = (Cow<'a, str>, Claim, usize, &'a ServiceInfo);

/// A port name usable as an SRV label (`_<name>`, so at most 62 characters), lowercased.
fn srv_label(port_name: &str) -> Option<String> {
    let lower = port_name.to_ascii_lowercase();
    let ok = !lower.is_empty()
        && lower.len() <= 62
        && lower.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    ok.then_some(lower)
}

/// Whether `name` is a clusterset name (`….svc.clusterset.local`), whose bare name answers
/// SRV queries (KEP-1645's DNS).
fn is_clusterset_name(name: &Name) -> bool {
    name.to_ascii()
        .to_ascii_lowercase()
        .ends_with(&format!(".svc.{CLUSTERSET_ZONE}."))
}

/// Add the records of `name`, owned by `owners` (one Service, or the several exporters of one
/// origin, whose addresses and ports are joined; the first is named as the owner), and its
/// `_<port>._<proto>` SRV names; returns the draft node of `name` (`None` without owners).
/// `pods` are the draft nodes of the service's pods' names (a headless service's), `None` for
/// a pod's name itself: at a clusterset name the bare name answers SRV too (KEP-1645), one
/// record per port targeting the name itself, or per pod and port targeting the pod's name
/// when the service has pods with names.
fn add_service<'s>(
    zone: &mut DraftZone,
    name: &Name,
    owners: impl Iterator<Item = &'s ServiceInfo> + Clone,
    pods: Option<&[u32]>,
) -> Option<u32> {
    let first = owners.clone().next()?;
    let owner = len_u32(zone.owners.len());
    zone.owners.push(first.key.clone());
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for ip in owners.clone().flat_map(|s| &s.cluster_ips) {
        match ip {
            IpAddr::V4(a) => v4.push(*a),
            IpAddr::V6(a) => v6.push(*a),
        }
    }
    v4.sort_unstable();
    v4.dedup();
    v6.sort_unstable();
    v6.dedup();
    let relative = zone.relative(name);
    // The node `push` is about to add: the bare name's SRV records may target it.
    let own = len_u32(zone.nodes.len());
    let mut bare: Vec<(u16, u32)> = Vec::new();
    if let Some(pods) = pods.filter(|_| is_clusterset_name(name)) {
        let targets: &[u32] = if pods.is_empty() { &[own] } else { pods };
        for port in owners.clone().flat_map(|s| &s.ports) {
            bare.extend(targets.iter().map(|t| (port.port, *t)));
        }
        bare.sort_unstable();
        bare.dedup();
    }
    let target = zone.push(&relative, &v4, &v6, &bare, owner);
    let apex_len = zone.apex.len();
    let mut srv: BTreeMap<Vec<u8>, Vec<(u16, u32)>> = BTreeMap::new();
    for port in owners.flat_map(|s| &s.ports) {
        let Some(label) = port.name.as_deref().and_then(srv_label) else {
            continue;
        };
        let labels = [format!("_{label}"), format!("_{}", port.protocol.label())];
        let mut owner_name = Vec::new();
        push_wire_labels(&mut owner_name, labels.iter().map(|l| l.as_bytes()));
        owner_name.extend_from_slice(&relative);
        // A DNS name is at most 255 bytes in wire format (root label included).
        if owner_name.len() + apex_len + 1 > 255 {
            continue;
        }
        srv.entry(owner_name).or_default().push((port.port, target));
    }
    for (owner_name, mut ports) in srv {
        ports.sort_unstable();
        ports.dedup();
        zone.push(&owner_name, &[], &[], &ports, owner);
    }
    Some(target)
}

#[cfg(test)]
#[path = "zone_tests.rs"]
mod tests;
