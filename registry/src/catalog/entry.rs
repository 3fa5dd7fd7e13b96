//! What the catalog stores: a service's key, where it came from, and the entry itself.

use std::fmt;
use std::sync::Arc;

use smol_str::SmolStr;
use xcc_proto::propagation::CHANGED_AT_ANNOTATION;

use super::Labels;

/// Identity of a service in the catalog. The names are DNS labels or subdomains, almost always
/// at most 23 bytes, which a [`SmolStr`] holds inline: a key allocates nothing of its own.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Cluster that owns the service: this registry's cluster name for its own exports, the
    /// RemoteRegistry name for flat Hamlet imports.
    pub cluster: SmolStr,
    pub namespace: SmolStr,
    pub name: SmolStr,
}

impl ServiceKey {
    pub fn new(
        cluster: impl AsRef<str>,
        namespace: impl AsRef<str>,
        name: impl AsRef<str>,
    ) -> Self {
        Self {
            cluster: SmolStr::new(cluster),
            namespace: SmolStr::new(namespace),
            name: SmolStr::new(name),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.cluster, self.namespace, self.name)
    }
}

/// Where an entry came from; decides who may replace or remove it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// This registry's own exports (exported ServiceRecords, export files).
    Local,
    /// Imported through the RemoteRegistry of that name.
    Remote(String),
    /// Announced by the direct child of that name (its subtree); the name is shared by all
    /// of the child's entries.
    Child(Arc<str>),
    /// Granted through the hierarchy (a query answered by an ancestor) via that parent link.
    Hierarchy(String),
}

impl Source {
    /// Served to Hamlet consumers and announced to the parent: this registry's subtree.
    pub fn in_subtree(&self) -> bool {
        matches!(self, Source::Local | Source::Child(_))
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Local => f.write_str("local"),
            Source::Remote(name) => write!(f, "remote/{name}"),
            Source::Child(name) => write!(f, "child/{name}"),
            Source::Hierarchy(name) => write!(f, "hierarchy/{name}"),
        }
    }
}

/// The address is an IP or a host name; up to 23 bytes (every IPv4 address) it is held inline,
/// with no allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub address: SmolStr,
    pub port: u32,
}

/// Port names (DNS labels) and protocols are held inline: no allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    pub name: SmolStr,
    pub port: u32,
    pub protocol: SmolStr,
    /// Port on the endpoints that serves `port`; 0: `port` itself.
    pub target_port: u32,
}

impl NamedPort {
    /// The port of a ServiceRecord (already checked, [`xcc_proto::ports::checked`]).
    pub fn of(p: &xcc_proto::crd::ServicePort) -> Self {
        let raw = xcc_proto::ports::RawPort::of(p);
        Self {
            name: raw.name.into(),
            port: raw.port,
            protocol: raw.protocol.into(),
            target_port: raw.target_port,
        }
    }

    /// The port as it came, for [`xcc_proto::ports::checked`].
    pub fn raw(&self) -> xcc_proto::ports::RawPort<'_> {
        xcc_proto::ports::RawPort {
            name: &self.name,
            port: self.port,
            protocol: &self.protocol,
            target_port: self.target_port,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Origin {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    pub kind: String,
}

/// One service as the catalog holds it. `fqdn` is canonical (lowercase, no trailing dot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntry {
    pub key: ServiceKey,
    pub source: Source,
    /// Longer than a `SmolStr` holds inline, almost always: its heap part is an `Arc<str>`,
    /// shared with the Hamlet view's key.
    pub fqdn: SmolStr,
    pub endpoints: Vec<Endpoint>,
    pub ports: Vec<NamedPort>,
    /// Pass-through labels (XCC: the `connectivity.tanzu.vmware.com/` annotations).
    pub labels: Labels,
    /// Clusters allowed to see the service; empty = every authenticated cluster.
    pub allowed_requesters: Vec<String>,
    /// Boxed: most entries have none, and an inline `Origin` would add 96 B to every entry.
    pub origin: Option<Box<Origin>>,
    /// Catalog revision at which this content was stored (set by the catalog).
    pub revision: u64,
}

impl ServiceEntry {
    /// Whether `requester` (a cluster name, or `cluster/workload`) may see this service.
    pub fn admits(&self, requester: &str) -> bool {
        if self.allowed_requesters.is_empty() {
            return true;
        }
        let cluster = requester.split('/').next().unwrap_or(requester);
        self.allowed_requesters.iter().any(|allowed| {
            allowed == requester
                || allowed == cluster
                || allowed
                    .strip_prefix(cluster)
                    .is_some_and(|rest| rest.starts_with('/') && requester == cluster)
        })
    }

    /// The time the exporting registry saw this content change (its propagation stamp), when
    /// it carries a valid one ([`xcc_proto::propagation`]).
    pub fn changed_at(&self) -> Option<std::time::SystemTime> {
        let value = self.labels.get(CHANGED_AT_ANNOTATION)?;
        xcc_proto::propagation::parse_stamp(value).ok()
    }

    /// Same content, the propagation stamp aside: a stamp never makes an unchanged record look
    /// changed.
    pub(super) fn same_content(&self, other: &ServiceEntry) -> bool {
        self.key == other.key
            && self.source == other.source
            && self.fqdn == other.fqdn
            && self.endpoints == other.endpoints
            && self.ports == other.ports
            && self.labels.eq_except(&other.labels, CHANGED_AT_ANNOTATION)
            && self.allowed_requesters == other.allowed_requesters
            && self.origin == other.origin
    }
}
