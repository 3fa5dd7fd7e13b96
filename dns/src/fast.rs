//! The fast path (pure): the common questions answered straight from the query's bytes.
//!
//! A plain query — QUERY opcode, one question of class IN and type A or AAAA, no other records
//! but an optional OPT without options — for a name inside a zone is answered here without
//! decoding it into a hickory `Message` or building records: the name is lowercased into a stack
//! buffer, looked up in the zone's table by its wire form, and the response is written directly:
//! the question copied as asked, answers owned by a pointer to it, and for NODATA and NXDOMAIN
//! the zone's SOA, its names pointers into the question. Everything else (other types, ANY,
//! transfers, names outside the zones, the NS target, namespace mapping, EDNS options or
//! versions, a snapshot that is not ready, a response over the UDP limit, anything malformed)
//! returns `None` and takes the general path in [`super::wire`], which this path must match
//! answer for answer (the tests compare the two).

use std::net::IpAddr;

use hickory_proto::op::ResponseCode;

use super::answer::{SOA_EXPIRE, SOA_REFRESH, SOA_RETRY, Settings, Snapshot};
use super::wire::{EDNS_PAYLOAD, HEADER_LEN, Outcome, PLAIN_UDP_LIMIT, Transport};
use super::zone::Zone;

const TYPE_A: u16 = 1;
const TYPE_SOA: u16 = 6;
const TYPE_AAAA: u16 = 28;
const TYPE_OPT: u16 = 41;
const CLASS_IN: u16 = 1;
/// Longest name in wire format (RFC 1035 §3.1).
const MAX_NAME: usize = 255;
/// Header flags.
const QR: u16 = 0x8000;
const OPCODE: u16 = 0x7800;
const AA: u16 = 0x0400;
const RD: u16 = 0x0100;
const CD: u16 = 0x0010;
/// EDNS DO bit in the OPT TTL (RFC 3225).
const DO: u32 = 0x8000;
/// The relative wire name of the NS target `ns.dns.<zone>`, which the general path answers.
const NS_TARGET: &[u8] = b"\x02ns\x03dns";

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*buf.get(at)?, *buf.get(at + 1)?]))
}

/// The question of a query this path can answer.
struct Question {
    /// The name lowercased, root label included: `lower[..len]`.
    lower: [u8; MAX_NAME],
    len: usize,
    /// Offsets in `lower` where a label starts (the root label not counted).
    starts: [u8; 128],
    labels: usize,
    /// End of the question section in the query.
    end: usize,
    qtype: u16,
    /// `Some(DO bit)` when the query carried an OPT record.
    edns: Option<bool>,
    /// The client's UDP payload size (RFC 6891: below 512 counts as 512).
    payload: u16,
}

/// Parse `query` if it is a plain query this path handles.
fn parse(query: &[u8]) -> Option<Question> {
    let flags = u16_at(query, 2)?;
    if flags & (QR | OPCODE) != 0
        || u16_at(query, 4)? != 1
        || u16_at(query, 6)? != 0
        || u16_at(query, 8)? != 0
    {
        return None;
    }
    let additionals = u16_at(query, 10)?;
    let mut q = Question {
        lower: [0; MAX_NAME],
        len: 0,
        starts: [0; 128],
        labels: 0,
        end: 0,
        qtype: 0,
        edns: None,
        payload: 0,
    };
    let mut at = HEADER_LEN;
    loop {
        let len = usize::from(*query.get(at)?);
        if len == 0 {
            *q.lower.get_mut(q.len)? = 0;
            q.len += 1;
            at += 1;
            break;
        }
        // Compression pointers and extended label types are left to the general path.
        if len > 63 {
            return None;
        }
        let label = query.get(at + 1..at + 1 + len)?;
        *q.starts.get_mut(q.labels)? = u8::try_from(q.len).ok()?;
        q.labels += 1;
        let out = q.lower.get_mut(q.len..q.len + 1 + len)?;
        out[0] = label.len() as u8;
        for (o, b) in out[1..].iter_mut().zip(label) {
            *o = b.to_ascii_lowercase();
        }
        q.len += 1 + len;
        at += 1 + len;
    }
    q.qtype = u16_at(query, at)?;
    if u16_at(query, at + 2)? != CLASS_IN || !matches!(q.qtype, TYPE_A | TYPE_AAAA) {
        return None;
    }
    q.end = at + 4;
    at = q.end;
    match additionals {
        0 => {}
        1 => {
            // An OPT record: root owner, version 0, no options.
            if *query.get(at)? != 0 || u16_at(query, at + 1)? != TYPE_OPT {
                return None;
            }
            q.payload = u16_at(query, at + 3)?.max(PLAIN_UDP_LIMIT as u16);
            let ttl = u32::from_be_bytes(query.get(at + 5..at + 9)?.try_into().ok()?);
            let version = (ttl >> 16) & 0xff;
            if version != 0 || u16_at(query, at + 9)? != 0 {
                return None;
            }
            q.edns = Some(ttl & DO != 0);
            at += 11;
        }
        _ => return None,
    }
    (at == query.len()).then_some(q)
}

/// The zone holding the question's name and the name's length below the apex: the first
/// (most specific) zone whose apex is a label-aligned suffix of the name.
fn find_zone<'a>(snapshot: &'a Snapshot, q: &Question) -> Option<(&'a Zone, usize)> {
    let name = q.lower.get(..q.len)?;
    snapshot.zones.zones().iter().find_map(|zone| {
        let apex = zone.apex_wire();
        let below = name.len().checked_sub(apex.len())?;
        let aligned = below == 0 || q.starts[..q.labels].contains(&u8::try_from(below).ok()?);
        (aligned && name.ends_with(apex)).then_some((zone, below))
    })
}

/// Answer `query` if it is one of the common questions; `None` sends it down the general path.
pub fn answer(
    query: &[u8],
    source: IpAddr,
    transport: Transport,
    snapshot: &Snapshot,
    settings: &Settings,
) -> Option<Outcome> {
    if !snapshot.ready {
        return None;
    }
    let q = parse(query)?;
    // A pod in a mapped namespace may be asking for a name the mapping rewrites.
    if let Some(ns) = snapshot.pods.namespace_of(source)
        && snapshot.mapping.is_mapped(ns)
    {
        return None;
    }
    let (zone, below) = find_zone(snapshot, &q)?;
    let relative = q.lower.get(..below)?;
    let node = zone.node_by_wire(relative);
    if node.is_none() && relative == NS_TARGET {
        return None;
    }
    let ttl = settings.ttl.to_be_bytes();
    let mut out = Vec::with_capacity(q.end + 128);
    out.extend_from_slice(query.get(..2)?);
    let flags = u16_at(query, 2)?;
    let mut answers = 0u16;
    let rcode = match node {
        None => ResponseCode::NXDomain,
        Some(_) => ResponseCode::NoError,
    };
    let header_flags = QR | AA | (flags & (RD | CD)) | u16::from(rcode.low() & 0x0f);
    out.extend_from_slice(&header_flags.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // counts, filled in below
    out.extend_from_slice(query.get(HEADER_LEN..q.end)?);
    if let Some(node) = node {
        if q.qtype == TYPE_A {
            for ip in node.v4 {
                push_answer_head(&mut out, TYPE_A, ttl, 4);
                out.extend_from_slice(&ip.octets());
                answers = answers.saturating_add(1);
            }
        } else {
            for ip in node.v6 {
                push_answer_head(&mut out, TYPE_AAAA, ttl, 16);
                out.extend_from_slice(&ip.octets());
                answers = answers.saturating_add(1);
            }
        }
    }
    let authorities = u16::from(answers == 0);
    if answers == 0 {
        // The owner and both names of the SOA point at the apex inside the question.
        let apex = (0xC000 | (HEADER_LEN + below) as u16).to_be_bytes();
        out.extend_from_slice(&apex);
        out.extend_from_slice(&TYPE_SOA.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ttl);
        out.extend_from_slice(&42u16.to_be_bytes()); // 9 + 13 name bytes + 5 × 4 timers
        out.extend_from_slice(NS_TARGET);
        out.extend_from_slice(&apex);
        out.extend_from_slice(b"\x0ahostmaster");
        out.extend_from_slice(&apex);
        out.extend_from_slice(&zone.serial().to_be_bytes());
        for timer in [SOA_REFRESH, SOA_RETRY, SOA_EXPIRE] {
            out.extend_from_slice(&timer.to_be_bytes());
        }
        out.extend_from_slice(&ttl);
    }
    if let Some(dnssec_ok) = q.edns {
        out.push(0);
        out.extend_from_slice(&TYPE_OPT.to_be_bytes());
        out.extend_from_slice(&EDNS_PAYLOAD.to_be_bytes());
        out.extend_from_slice(&[0, 0, if dnssec_ok { 0x80 } else { 0 }, 0, 0, 0]);
    }
    let counts = out.get_mut(6..HEADER_LEN)?;
    counts[0..2].copy_from_slice(&answers.to_be_bytes());
    counts[2..4].copy_from_slice(&authorities.to_be_bytes());
    counts[4..6].copy_from_slice(&u16::from(q.edns.is_some()).to_be_bytes());
    let limit = match (transport, q.edns) {
        (Transport::Tcp, _) => usize::from(u16::MAX),
        (Transport::Udp, None) => PLAIN_UDP_LIMIT,
        (Transport::Udp, Some(_)) => usize::from(q.payload.min(EDNS_PAYLOAD)),
    };
    // Too large: the general path decides what to drop or truncate.
    (out.len() <= limit).then_some(Outcome::Reply { bytes: out, rcode })
}

/// Owner (a pointer to the question's name), type, class IN, TTL and RDATA length.
fn push_answer_head(out: &mut Vec<u8>, rtype: u16, ttl: [u8; 4], rdlength: u16) {
    out.extend_from_slice(&[0xC0, HEADER_LEN as u8]);
    out.extend_from_slice(&rtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&ttl);
    out.extend_from_slice(&rdlength.to_be_bytes());
}

#[cfg(test)]
#[path = "fast_tests.rs"]
mod tests;
