//! Building a zone set: each Service's names claimed, conflicts settled (its FQDN before the
//! names its origin gives), and the names, with their address and SRV records, laid out in a
//! draft zone that [`DraftZone::finish`] turns into a [`Zone`].

use super::*;

/// A node being built: spans of the draft's arrays.
#[derive(Clone, Copy, Debug)]
pub(super) struct DraftNode {
    name: (u32, u32),
    v4: (u32, u32),
    v6: (u32, u32),
    /// Into `srv`, whose targets are draft node indices.
    srv: (u32, u32),
    owner: u32,
}

pub(super) fn span<T>(items: &[T], (start, end): (u32, u32)) -> &[T] {
    items.get(start as usize..end as usize).unwrap_or_default()
}

/// A zone being built, in flat arrays (no allocation per name, so building leaves no
/// fragments behind); [`DraftZone::finish`] sorts the nodes by name.
#[derive(Debug)]
pub(super) struct DraftZone {
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
pub(super) fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// How a Service claims a name; the better claim sorts first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Claim {
    /// The name is its FQDN annotation.
    Fqdn,
    /// The name is its MCS name, from the origin annotations.
    Origin,
}

/// The zones `apexes` to fill, most specific first (so a name goes to its longest apex), each
/// once.
pub(super) fn draft_zones(apexes: &[String]) -> Vec<DraftZone> {
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
pub(super) fn claim_names<'a>(
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
pub(super) fn owners_of<'c, 'a>(
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
pub(super) fn add_names(zones: &mut [DraftZone], winners: &[(Name, usize, &[NameClaim<'_>])]) {
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
pub(super) fn finish_zones(
    zones: Vec<DraftZone>,
    previous: Option<&ZoneSet>,
    now_unix: u32,
) -> Vec<Zone> {
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
pub(super) fn candidate_names(
    svc: &ServiceInfo,
    rejected: &mut Vec<Rejected>,
) -> Vec<(String, Claim)> {
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
pub(super) type NameClaim<'a> = (Cow<'a, str>, Claim, usize, &'a ServiceInfo);

/// A port name usable as an SRV label (`_<name>`, so at most 62 characters), lowercased.
pub(super) fn srv_label(port_name: &str) -> Option<String> {
    let lower = port_name.to_ascii_lowercase();
    let ok = !lower.is_empty()
        && lower.len() <= 62
        && lower.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    ok.then_some(lower)
}

/// Whether `name` is a clusterset name (`….svc.clusterset.local`), whose bare name answers
/// SRV queries (KEP-1645's DNS).
pub(super) fn is_clusterset_name(name: &Name) -> bool {
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
pub(super) fn add_service<'s>(
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
