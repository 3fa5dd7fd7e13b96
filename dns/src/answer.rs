//! The answer function (pure): one question, the current [`Snapshot`] and the asker's source
//! address in; an authoritative response, or "forward this upstream", out.
//!
//! Rules, in order:
//! 1. Not ready (first full sync pending) → SERVFAIL, for every question: resolvers
//!    retry or try another server and do not take it as a negative answer.
//! 2. Class other than IN (or ANY) → REFUSED. Zone transfers (AXFR, IXFR) → REFUSED on either
//!    transport (RFC 5936 §4.2: a server that does not transfer the zone refuses): there is
//!    nothing to transfer to, as every server builds its zones from the same feed.
//! 3. Inside a configured zone → authoritative (AA): records of the asked type with the owner name
//!    echoed as asked, case included; A / AAAA from cluster IPs, SRV at `_<port>._<proto>.<name>`,
//!    SOA and NS at the apex, ANY = all of them. An existing name without records of that type →
//!    NODATA: NOERROR, no answers, SOA in authority (RFC 8020: never NXDOMAIN for a name that
//!    exists). A missing name → NXDOMAIN with the SOA in authority. The NS target `ns.dns.<zone>`
//!    answers with [`Settings::ns_addresses`] (NODATA without them). Namespace mapping: a pod in a
//!    mapped namespace `foo` asking `<svc>.foo.svc.clusterset.local` gets
//!    `<svc>.<mapped>.svc.clusterset.local`.
//! 4. Outside every zone, with transparent resolution off → REFUSED (not SERVFAIL).
//! 5. Transparent resolution on: `<svc>` (relative to the asking pod's namespace, mapped) and
//!    `<svc>.<ns>` (namespace mapped) — optionally under `_<port>._<proto>.` — are answered as
//!    `…svc.clusterset.local` when that name holds a Service; the answer is authoritative, with
//!    no SOA on NODATA (the name is outside our zones). Anything else → [`Answer::Forward`]: the
//!    server relays the query unchanged to the upstream resolver.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, NS, SOA, SRV};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use xcc_proto::mapping::NamespaceMapping;

use super::pods::PodIndex;
use super::zone::{Node, Zone, ZoneSet};

/// Default TTL of every record we serve (seconds): short, because cluster IPs and imports change
/// and a resolver should notice within seconds.
pub const DEFAULT_TTL: u32 = 5;
/// SOA timers (RFC 1912 suggestions; XCC v1 used the same). Nothing transfers our zones, so they
/// only inform readers.
pub(crate) const SOA_REFRESH: i32 = 7200;
pub(crate) const SOA_RETRY: i32 = 1800;
pub(crate) const SOA_EXPIRE: i32 = 86400;
/// SRV weight of a single target (as the Kubernetes DNS specification).
const SRV_WEIGHT: u16 = 100;

/// How answers are shaped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// TTL of every record, and the SOA minimum (negative-caching TTL).
    pub ttl: u32,
    /// Answer `<svc>` and `<svc>.<ns>` and forward everything else (transparent resolution).
    pub transparent: bool,
    /// Addresses of this server, served for the NS target `ns.dns.<zone>` of every zone.
    pub ns_addresses: Vec<IpAddr>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_TTL,
            transparent: false,
            ns_addresses: Vec::new(),
        }
    }
}

/// Everything an answer depends on, published by the index as one immutable value.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The zones and their records.
    pub zones: Arc<ZoneSet>,
    /// Source address → pod namespace.
    pub pods: Arc<PodIndex>,
    /// Local namespace ↔ clusterset namespace.
    pub mapping: Arc<NamespaceMapping>,
    /// Every required feed source has delivered a full listing.
    pub ready: bool,
}

/// A response to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Response code.
    pub rcode: ResponseCode,
    /// The AA flag.
    pub authoritative: bool,
    /// Answer section.
    pub answers: Vec<Record>,
    /// Authority section.
    pub authorities: Vec<Record>,
    /// Additional section (addresses of SRV targets).
    pub additionals: Vec<Record>,
}

impl Response {
    fn error(rcode: ResponseCode) -> Self {
        Self {
            rcode,
            authoritative: false,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
        }
    }
}

/// What to do with a question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Send this response.
    Response(Response),
    /// Relay the query unchanged to the upstream resolver (transparent mode only).
    Forward,
}

/// Answer the question `(name, qtype, qclass)` asked from `source`.
pub fn answer(
    snapshot: &Snapshot,
    name: &Name,
    qtype: RecordType,
    qclass: DNSClass,
    source: IpAddr,
    settings: &Settings,
) -> Answer {
    if !snapshot.ready {
        return Answer::Response(Response::error(ResponseCode::ServFail));
    }
    if qclass != DNSClass::IN && qclass != DNSClass::ANY {
        return Answer::Response(Response::error(ResponseCode::Refused));
    }
    if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
        return Answer::Response(Response::error(ResponseCode::Refused));
    }
    let zones = &snapshot.zones;
    let pod_ns = snapshot.pods.namespace_of(source);
    if let Some(zone) = zones.find_zone(name) {
        if let Some(target) = mapped_clusterset_name(name, pod_ns, &snapshot.mapping)
            && let Some(target_zone) = zones.find_zone(&target)
        {
            return Answer::Response(authoritative(
                target_zone,
                &target,
                name,
                qtype,
                settings,
                true,
            ));
        }
        return Answer::Response(authoritative(zone, name, name, qtype, settings, true));
    }
    if !settings.transparent {
        return Answer::Response(Response::error(ResponseCode::Refused));
    }
    if let Some(target) = transparent_name(name, pod_ns, &snapshot.mapping)
        && let Some(zone) = zones.find_zone(&target)
        && zone.owner(&target).is_some()
    {
        return Answer::Response(authoritative(zone, &target, name, qtype, settings, false));
    }
    Answer::Forward
}

/// The authoritative response for `lookup` in `zone`, records owned by `asked` (the question's
/// name, case preserved). `with_soa` puts the SOA in the authority section of negative answers.
fn authoritative(
    zone: &Zone,
    lookup: &Name,
    asked: &Name,
    qtype: RecordType,
    settings: &Settings,
    with_soa: bool,
) -> Response {
    let ttl = settings.ttl;
    let soa_authority = || {
        if with_soa {
            vec![soa_record(zone, zone.apex().clone(), ttl)]
        } else {
            Vec::new()
        }
    };
    let ns_name = nameserver(zone);
    let Some(node) = zone.node(lookup) else {
        if *lookup == ns_name {
            return nameserver_response(zone, asked, qtype, settings, with_soa);
        }
        return Response {
            rcode: ResponseCode::NXDomain,
            authoritative: true,
            answers: Vec::new(),
            authorities: soa_authority(),
            additionals: Vec::new(),
        };
    };
    let is_apex = lookup == zone.apex();
    let want = |t: RecordType| qtype == t || qtype == RecordType::ANY;
    let mut answers = Vec::new();
    let mut additionals = Vec::new();
    if is_apex && want(RecordType::SOA) {
        answers.push(soa_record(zone, asked.clone(), ttl));
    }
    if is_apex && want(RecordType::NS) {
        answers.push(Record::from_rdata(
            asked.clone(),
            ttl,
            RData::NS(NS(ns_name.clone())),
        ));
        if zone.node(&ns_name).is_none() {
            push_addresses(
                &mut additionals,
                &settings.ns_addresses,
                &ns_name,
                RecordType::ANY,
                ttl,
            );
        }
    }
    if want(RecordType::A) {
        push_v4(&mut answers, &node, asked, ttl);
    }
    if want(RecordType::AAAA) {
        push_v6(&mut answers, &node, asked, ttl);
    }
    if want(RecordType::SRV) {
        for srv in node.srv() {
            answers.push(Record::from_rdata(
                asked.clone(),
                ttl,
                RData::SRV(SRV::new(0, SRV_WEIGHT, srv.port, srv.target.clone())),
            ));
            if let Some(target) = node.srv_target_node(&srv) {
                push_v4(&mut additionals, &target, &srv.target, ttl);
                push_v6(&mut additionals, &target, &srv.target, ttl);
            }
        }
    }
    let authorities = if answers.is_empty() {
        soa_authority()
    } else {
        Vec::new()
    };
    Response {
        rcode: ResponseCode::NoError,
        authoritative: true,
        answers,
        authorities,
        additionals,
    }
}

/// A and/or AAAA records for `ips` owned by `owner`, as `qtype` asks.
fn push_addresses(
    out: &mut Vec<Record>,
    ips: &[IpAddr],
    owner: &Name,
    qtype: RecordType,
    ttl: u32,
) {
    let any = qtype == RecordType::ANY;
    for ip in ips {
        let rdata = match ip {
            IpAddr::V4(v4) if any || qtype == RecordType::A => RData::A(A(*v4)),
            IpAddr::V6(v6) if any || qtype == RecordType::AAAA => RData::AAAA(AAAA(*v6)),
            _ => continue,
        };
        out.push(Record::from_rdata(owner.clone(), ttl, rdata));
    }
}

/// The answer for the NS target when no Service owns that name: this server's addresses.
fn nameserver_response(
    zone: &Zone,
    asked: &Name,
    qtype: RecordType,
    settings: &Settings,
    with_soa: bool,
) -> Response {
    let mut answers = Vec::new();
    push_addresses(
        &mut answers,
        &settings.ns_addresses,
        asked,
        qtype,
        settings.ttl,
    );
    let authorities = if answers.is_empty() && with_soa {
        vec![soa_record(zone, zone.apex().clone(), settings.ttl)]
    } else {
        Vec::new()
    };
    Response {
        rcode: ResponseCode::NoError,
        authoritative: true,
        answers,
        authorities,
        additionals: Vec::new(),
    }
}

fn push_v4(out: &mut Vec<Record>, node: &Node<'_>, owner: &Name, ttl: u32) {
    out.extend(
        node.v4
            .iter()
            .map(|ip| Record::from_rdata(owner.clone(), ttl, RData::A(A(*ip)))),
    );
}

fn push_v6(out: &mut Vec<Record>, node: &Node<'_>, owner: &Name, ttl: u32) {
    out.extend(
        node.v6
            .iter()
            .map(|ip| Record::from_rdata(owner.clone(), ttl, RData::AAAA(AAAA(*ip)))),
    );
}

/// `ns.dns.<apex>`, the name XCC v1 used as SOA MNAME; we also use it as the NS target.
fn nameserver(zone: &Zone) -> Name {
    prefixed(zone.apex(), &[b"ns", b"dns"])
}

fn prefixed(apex: &Name, labels: &[&[u8]]) -> Name {
    Name::from_labels(labels.iter().copied())
        .and_then(|p| p.append_domain(apex))
        .unwrap_or_else(|_| apex.clone())
}

/// The zone's SOA record, owned by `owner`.
fn soa_record(zone: &Zone, owner: Name, ttl: u32) -> Record {
    let soa = SOA::new(
        nameserver(zone),
        prefixed(zone.apex(), &[b"hostmaster"]),
        zone.serial(),
        SOA_REFRESH,
        SOA_RETRY,
        SOA_EXPIRE,
        ttl,
    );
    Record::from_rdata(owner, ttl, RData::SOA(soa))
}

/// Labels of `name`, split into an SRV prefix (`_<port>._<proto>`, or nothing) and the rest.
fn split_srv_prefix(name: &Name) -> (Vec<&[u8]>, Vec<&[u8]>) {
    let labels: Vec<&[u8]> = name.iter().collect();
    let is_underscore = |l: &&[u8]| l.first() == Some(&b'_');
    if labels.len() > 2 && is_underscore(&labels[0]) && is_underscore(&labels[1]) {
        (labels[..2].to_vec(), labels[2..].to_vec())
    } else {
        (Vec::new(), labels)
    }
}

/// `prefix` + `<svc>.<namespace>.svc.clusterset.local.`
fn clusterset_name(prefix: &[&[u8]], svc: &[u8], namespace: &str) -> Option<Name> {
    let mut labels: Vec<&[u8]> = prefix.to_vec();
    labels.extend([svc, namespace.as_bytes(), b"svc", b"clusterset", b"local"]);
    let mut name = Name::from_labels(labels).ok()?;
    name.set_fqdn(true);
    Some(name)
}

fn lower(label: &[u8]) -> Option<String> {
    std::str::from_utf8(label).ok().map(str::to_ascii_lowercase)
}

/// Namespace mapping (a namespace annotated with the namespace its clusterset names live in): a
/// pod in mapped namespace `foo` asking `<svc>.foo.svc.clusterset.local` (or an SRV
/// name under it) means `<svc>.<mapped>.svc.clusterset.local`.
fn mapped_clusterset_name(
    name: &Name,
    pod_ns: Option<&str>,
    mapping: &NamespaceMapping,
) -> Option<Name> {
    let pod_ns = pod_ns?;
    if !mapping.is_mapped(pod_ns) {
        return None;
    }
    let (prefix, host) = split_srv_prefix(name);
    let [svc, ns, rest @ ..] = host.as_slice() else {
        return None;
    };
    let suffix_ok = rest.len() == 3
        && rest
            .iter()
            .zip([&b"svc"[..], b"clusterset", b"local"])
            .all(|(a, b)| a.eq_ignore_ascii_case(b));
    if !suffix_ok || lower(ns)? != pod_ns {
        return None;
    }
    clusterset_name(&prefix, svc, mapping.clusterset_namespace(pod_ns))
}

/// Transparent resolution: `<svc>` (needs the pod's namespace) or `<svc>.<ns>`, each optionally
/// under an SRV prefix, as a clusterset name; namespaces go through the mapping.
fn transparent_name(name: &Name, pod_ns: Option<&str>, mapping: &NamespaceMapping) -> Option<Name> {
    let (prefix, host) = split_srv_prefix(name);
    match host.as_slice() {
        [svc] => clusterset_name(&prefix, svc, mapping.clusterset_namespace(pod_ns?)),
        [svc, ns] => {
            let ns = lower(ns)?;
            clusterset_name(&prefix, svc, mapping.clusterset_namespace(&ns))
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
