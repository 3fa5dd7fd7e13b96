//! The zone data model (pure): what `xcc dns` serves, derived from the binder's Services.
//!
//! Inputs are [`ServiceInfo`]s — the feed's view of a Service (key, annotations, cluster IPs,
//! ports), whether it came from a Kubernetes watch or from a static records file. Each Service
//! contributes up to two names:
//! - the value of its `connectivity.tanzu.vmware.com/fqdn` annotation (reference §3.7; only
//!   annotated Services count — fix D1), canonicalised to lowercase (fix D2);
//! - its MCS name `<origin-name>.<origin-namespace>.svc.clusterset.local` when it carries the
//!   origin annotations of [`xcc_proto::mapping`].
//!
//! A name owned by several Services goes to the lowest `namespace/name` and the others are
//! reported as a [`Conflict`] (fix D5: deterministic, not last-writer-wins). Each name gets A and
//! AAAA records from the cluster IPs (dual stack) and, per named port, an SRV record at
//! `_<port>._<proto>.<name>`. Every ancestor of a name inside its zone exists as an empty
//! non-terminal, so it answers NODATA rather than NXDOMAIN (RFC 8020).
//!
//! Records are keyed by hickory [`Name`], whose equality and hash ignore ASCII case, so lookups
//! need no lowercasing. A zone's SOA serial changes only when its records change: it becomes
//! `max(previous + 1, now)` in Unix seconds, so it also keeps increasing across restarts.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hickory_proto::rr::Name;
use serde::{Deserialize, Serialize};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION, validate_namespace};
use xcc_proto::names::{CLUSTERSET_ZONE, FQDN_ANNOTATION, canonical_fqdn, clusterset_fqdn};

/// Identity of a Service: `namespace/name`. Orders by namespace, then name (the ownership rule).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Namespace of the Service (`""` for static records).
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
}

impl ServiceKey {
    /// A key from its parts.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
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
    /// Its annotations (the FQDN and origin annotations are read).
    pub annotations: BTreeMap<String, String>,
    /// Its cluster IPs (`spec.clusterIPs`: one per family; empty for headless Services).
    pub cluster_ips: Vec<IpAddr>,
    /// Its ports.
    pub ports: Vec<NamedPort>,
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

/// Several Services claim one name; the lowest key owns it.
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

/// The records at one name. An empty node is an empty non-terminal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    /// A records.
    pub v4: Vec<Ipv4Addr>,
    /// AAAA records.
    pub v6: Vec<Ipv6Addr>,
    /// SRV records.
    pub srv: Vec<SrvTarget>,
}

impl Node {
    /// True when the node holds no records (an empty non-terminal).
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty() && self.srv.is_empty()
    }
}

/// One authoritative zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zone {
    apex: Name,
    serial: u32,
    nodes: HashMap<Name, Node>,
    owners: HashMap<Name, ServiceKey>,
}

impl Zone {
    fn empty(apex: Name) -> Self {
        Self {
            apex,
            serial: 0,
            nodes: HashMap::new(),
            owners: HashMap::new(),
        }
    }

    /// The apex (lowercase, fully qualified).
    pub fn apex(&self) -> &Name {
        &self.apex
    }

    /// The SOA serial.
    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// The node at `name` (any case); `None` means the name does not exist. The apex always
    /// exists.
    pub fn node(&self, name: &Name) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// The Service owning the records at `name`, if any (empty non-terminals have none).
    pub fn owner(&self, name: &Name) -> Option<&ServiceKey> {
        self.owners.get(name)
    }

    /// Names with records (not counting empty non-terminals and the apex).
    pub fn record_names(&self) -> usize {
        self.owners.len()
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
        let mut zones: Vec<Zone> = apexes
            .iter()
            .filter_map(|a| fqdn_name(a))
            .map(Zone::empty)
            .collect();
        zones.sort_by(|a, b| {
            (b.apex.num_labels().cmp(&a.apex.num_labels())).then_with(|| a.apex.cmp(&b.apex))
        });
        zones.dedup_by(|a, b| a.apex == b.apex);

        let mut rejected = Vec::new();
        // Canonical name → (zone index, claimants).
        let mut claims: BTreeMap<String, (usize, Vec<&ServiceInfo>)> = BTreeMap::new();
        for svc in services {
            for raw in candidate_names(svc, &mut rejected) {
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
                claims
                    .entry(canonical)
                    .or_insert((zi, Vec::new()))
                    .1
                    .push(svc);
            }
        }

        let mut conflicts = Vec::new();
        for (canonical, (zi, mut claimants)) in claims {
            claimants.sort_by(|a, b| a.key.cmp(&b.key));
            claimants.dedup_by(|a, b| a.key == b.key);
            let winner = claimants[0];
            if claimants.len() > 1 {
                conflicts.push(Conflict {
                    name: canonical.clone(),
                    winner: winner.key.clone(),
                    losers: claimants[1..].iter().map(|s| s.key.clone()).collect(),
                });
            }
            if let Some(name) = fqdn_name(&canonical) {
                add_service(&mut zones[zi], name, winner);
            }
        }
        for zone in &mut zones {
            add_empty_non_terminals(zone);
            let prev = previous.and_then(|p| p.zones.iter().find(|z| z.apex == zone.apex));
            zone.serial = match prev {
                Some(p) if p.nodes == zone.nodes => p.serial,
                Some(p) => p.serial.wrapping_add(1).max(now_unix),
                None => now_unix,
            };
        }
        ZoneSet {
            zones,
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

/// The names `svc` asks for: its FQDN annotation and its MCS name (raw, not yet validated).
fn candidate_names(svc: &ServiceInfo, rejected: &mut Vec<Rejected>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(fqdn) = svc.annotations.get(FQDN_ANNOTATION) {
        out.push(fqdn.trim().to_string());
    }
    let ns = svc.annotations.get(ORIGIN_NAMESPACE_ANNOTATION);
    let name = svc.annotations.get(ORIGIN_NAME_ANNOTATION);
    if let (Some(ns), Some(name)) = (ns, name) {
        let (ns, name) = (ns.trim(), name.trim());
        match (validate_namespace(ns), validate_namespace(name)) {
            (Ok(_), Ok(_)) => out.push(clusterset_fqdn(name, ns)),
            (Err(e), _) | (_, Err(e)) => rejected.push(Rejected {
                key: svc.key.clone(),
                name: format!("{name}.{ns}.svc.{CLUSTERSET_ZONE}"),
                reason: e.to_string(),
            }),
        }
    }
    out.dedup();
    out
}

/// A port name usable as an SRV label: what Kubernetes allows (IANA service names), lowercased.
fn srv_label(port_name: &str) -> Option<String> {
    let lower = port_name.to_ascii_lowercase();
    let ok = !lower.is_empty()
        && lower.len() <= 62
        && lower.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    ok.then_some(lower)
}

fn add_service(zone: &mut Zone, name: Name, svc: &ServiceInfo) {
    let mut node = Node::default();
    for ip in &svc.cluster_ips {
        match ip {
            IpAddr::V4(v4) => node.v4.push(*v4),
            IpAddr::V6(v6) => node.v6.push(*v6),
        }
    }
    node.v4.sort_unstable();
    node.v4.dedup();
    node.v6.sort_unstable();
    node.v6.dedup();
    let mut srv: BTreeMap<Name, Vec<u16>> = BTreeMap::new();
    for port in &svc.ports {
        let Some(label) = port.name.as_deref().and_then(srv_label) else {
            continue;
        };
        let owner = Name::from_labels([
            format!("_{label}").as_bytes(),
            format!("_{}", port.protocol.label()).as_bytes(),
        ])
        .and_then(|prefix| prefix.append_domain(&name));
        if let Ok(owner) = owner {
            srv.entry(owner).or_default().push(port.port);
        }
    }
    for (owner, mut ports) in srv {
        ports.sort_unstable();
        ports.dedup();
        let node = Node {
            srv: ports
                .into_iter()
                .map(|port| SrvTarget {
                    port,
                    target: name.clone(),
                })
                .collect(),
            ..Node::default()
        };
        zone.owners.insert(owner.clone(), svc.key.clone());
        zone.nodes.insert(owner, node);
    }
    zone.owners.insert(name.clone(), svc.key.clone());
    zone.nodes.insert(name, node);
}

fn add_empty_non_terminals(zone: &mut Zone) {
    let apex_labels = zone.apex.num_labels();
    let mut missing = Vec::new();
    for name in zone.nodes.keys() {
        let mut n = name.base_name();
        while n.num_labels() >= apex_labels {
            if !zone.nodes.contains_key(&n) {
                missing.push(n.clone());
            }
            if n.num_labels() == apex_labels {
                break;
            }
            n = n.base_name();
        }
    }
    missing.push(zone.apex.clone());
    for n in missing {
        zone.nodes.entry(n).or_default();
    }
}

#[cfg(test)]
#[path = "zone_tests.rs"]
mod tests;
