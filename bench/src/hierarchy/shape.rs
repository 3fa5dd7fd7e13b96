//! The tree's shape, the names of its clusters and services, and the seeded choices.

use super::*;

#[derive(Clone, Debug, Serialize)]
pub(super) struct Shape {
    pub(super) clusters: usize,
    pub(super) mids: usize,
    pub(super) leaves_per_mid: usize,
    pub(super) leaves: usize,
    pub(super) services: usize,
    pub(super) big_leaf_services: usize,
    pub(super) namespaces: usize,
}

impl Shape {
    pub(super) fn of(args: &HierarchyArgs) -> Self {
        let leaves = args.mids * args.leaves_per_mid;
        Self {
            clusters: 1 + args.mids + leaves,
            mids: args.mids,
            leaves_per_mid: args.leaves_per_mid,
            leaves,
            services: args.services,
            big_leaf_services: args.big_leaf_services.min(args.services),
            namespaces: args.namespaces.max(1),
        }
    }

    /// Index of the mid-level registry above leaf `leaf`.
    pub(super) fn mid_of(&self, leaf: usize) -> usize {
        leaf / self.leaves_per_mid
    }

    /// Leaf that owns initial service `i`: the first leaf the first `big_leaf_services`, the
    /// other leaves the rest, round-robin (all leaves when there is only one).
    pub(super) fn leaf_of(&self, i: usize) -> usize {
        match (i.checked_sub(self.big_leaf_services), self.leaves) {
            (None, _) | (_, 1) => 0,
            (Some(rest), leaves) => 1 + rest % (leaves - 1),
        }
    }

    pub(super) fn leaf_name(&self, leaf: usize) -> String {
        leaf_name(self.mid_of(leaf), leaf % self.leaves_per_mid)
    }

    pub(super) fn namespace(&self, i: usize) -> String {
        format!("ns-{:02}", i % self.namespaces)
    }

    /// The root's configuration of its children: each mid may carry its own leaves.
    pub(super) fn carry_policies(&self) -> anyhow::Result<Vec<(String, String)>> {
        (0..self.mids)
            .map(|m| {
                let leaves: Vec<String> =
                    (0..self.leaves_per_mid).map(|l| leaf_name(m, l)).collect();
                let leaves: Vec<&str> = leaves.iter().map(String::as_str).collect();
                let text = xcc_registry::authz::carry_policy(&mid_name(m), &leaves)?;
                Ok((format!("carry-{}.cedar", mid_name(m)), text))
            })
            .collect()
    }
}

pub(super) fn mid_name(m: usize) -> String {
    format!("mid-{:02}", m + 1)
}

pub(super) fn leaf_name(m: usize, l: usize) -> String {
    format!("leaf-{:02}-{:02}", m + 1, l + 1)
}

pub(super) fn service_name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// A service as a leaf exports it: one endpoint (unique per `seq`), one port, the service-port
/// annotation, no allowed requesters.
pub(super) fn service_entry(
    cluster: &str,
    namespace: &str,
    name: &str,
    seq: usize,
) -> ServiceEntry {
    let mut labels = xcc_registry::catalog::Labels::new();
    labels.insert(
        xcc_proto::names::SERVICE_PORT_ANNOTATION.to_string(),
        "443".to_string(),
    );
    ServiceEntry {
        key: xcc_registry::catalog::ServiceKey::new(cluster, namespace, name),
        source: Source::Local,
        fqdn: xcc_proto::names::clusterset_fqdn(name, namespace).into(),
        endpoints: vec![Endpoint {
            address: format!(
                "10.{}.{}.{}",
                (seq >> 16) & 0xff,
                (seq >> 8) & 0xff,
                seq & 0xff
            )
            .into(),
            port: 443,
        }],
        ports: vec![NamedPort {
            name: "https".into(),
            port: 443,
            protocol: "TCP".into(),
            target_port: 0,
        }],
        labels,
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    }
}

/// Initial service `i` as its owner exports it.
pub(super) fn initial_entry(shape: &Shape, i: usize) -> ServiceEntry {
    service_entry(
        &shape.leaf_name(shape.leaf_of(i)),
        &shape.namespace(i),
        &service_name(i),
        i,
    )
}

/// SplitMix64: reproducible choices without a dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
