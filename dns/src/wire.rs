//! DNS messages in and out (pure): bytes of a query → bytes of a response, a forward, or
//! nothing. Every input is untrusted; nothing here panics or allocates in proportion to what a
//! peer claims.
//!
//! - Shorter than a header, or a response (QR=1) → dropped (no reflection).
//! - Undecodable → FORMERR echoing the id and opcode; opcode other than QUERY → NOTIMP;
//!   not exactly one question → FORMERR; EDNS version above 0 → BADVERS (RFC 6891).
//! - The common questions (A or AAAA inside a zone) are answered by [`fast`] straight from the
//!   query's bytes, exactly as below; everything else is decoded with hickory-proto.
//! - Otherwise [`answer`] decides. A request with EDNS gets an OPT record back, advertising
//!   [`EDNS_PAYLOAD`] and echoing the DO bit (RFC 3225). Over UDP a response larger than the
//!   client's limit (512 without EDNS, else its advertised size capped at [`EDNS_PAYLOAD`]) first
//!   loses its additional section, which a client can do without (RFC 2181 §9: no TC for that);
//!   only if the answer and authority still do not fit is it replaced by an empty one with TC=1
//!   so the client retries over TCP.

use std::net::IpAddr;

use hickory_proto::op::{Edns, Header, Message, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use super::answer::{Answer, Response, Settings, Snapshot, answer};
use super::fast;

/// Our EDNS UDP payload size: 1232 bytes avoids IP fragmentation on any common path (DNS flag
/// day 2020).
pub const EDNS_PAYLOAD: u16 = 1232;
/// The classic DNS UDP limit without EDNS (RFC 1035).
pub(crate) const PLAIN_UDP_LIMIT: usize = 512;
/// Length of the fixed DNS header.
pub(crate) const HEADER_LEN: usize = 12;

/// The transport a query arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// UDP: responses are size-limited.
    Udp,
    /// TCP: up to 65535 bytes.
    Tcp,
}

/// What to do with a received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send these bytes back; `rcode` is for metrics.
    Reply {
        /// The encoded response.
        bytes: Vec<u8>,
        /// Its response code.
        rcode: ResponseCode,
    },
    /// Relay the query bytes unchanged to the upstream resolver.
    Forward {
        /// The query id, to match the upstream's reply.
        id: u16,
    },
    /// Send nothing.
    Drop,
}

/// Handle one received message.
pub fn handle(
    query: &[u8],
    source: IpAddr,
    transport: Transport,
    snapshot: &Snapshot,
    settings: &Settings,
) -> Outcome {
    if query.len() < HEADER_LEN {
        return Outcome::Drop;
    }
    if let Some(outcome) = fast::answer(query, source, transport, snapshot, settings) {
        return outcome;
    }
    handle_decoded(query, source, transport, snapshot, settings)
}

/// [`handle`] for what the fast path leaves: decode with hickory-proto, answer, encode.
pub(crate) fn handle_decoded(
    query: &[u8],
    source: IpAddr,
    transport: Transport,
    snapshot: &Snapshot,
    settings: &Settings,
) -> Outcome {
    let request = match Message::from_vec(query) {
        Ok(m) => m,
        Err(_) => return malformed(query),
    };
    let meta = request.metadata;
    if meta.message_type == MessageType::Response {
        return Outcome::Drop;
    }
    let mut response = Message::new(meta.id, MessageType::Response, meta.op_code);
    response.metadata = Metadata::response_from_request(&meta);
    if let Some(q) = request.queries.first() {
        response.add_query(q.clone());
    }
    if let Some(asked) = &request.edns {
        response.set_edns(our_edns(asked));
    }
    let rcode = if meta.op_code != OpCode::Query {
        ResponseCode::NotImp
    } else if request.queries.len() != 1 {
        ResponseCode::FormErr
    } else if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
        ResponseCode::BADVERS
    } else {
        let q = &request.queries[0];
        let decided = answer(
            snapshot,
            q.name(),
            q.query_type(),
            q.query_class(),
            source,
            settings,
        );
        match decided {
            Answer::Forward => return Outcome::Forward { id: meta.id },
            Answer::Response(r) => fill(&mut response, r),
        }
    };
    response.metadata.response_code = rcode;
    encode(response, limit(&request, transport))
}

/// Our OPT record for a request that carried `asked`.
fn our_edns(asked: &Edns) -> Edns {
    let mut edns = Edns::new();
    edns.set_max_payload(EDNS_PAYLOAD);
    edns.set_dnssec_ok(asked.flags().dnssec_ok);
    edns
}

fn fill(message: &mut Message, r: Response) -> ResponseCode {
    message.metadata.authoritative = r.authoritative;
    message.insert_answers(r.answers);
    message.insert_authorities(r.authorities);
    message.insert_additionals(r.additionals);
    r.rcode
}

/// Largest response the client accepts on `transport`.
fn limit(request: &Message, transport: Transport) -> usize {
    match transport {
        Transport::Tcp => usize::from(u16::MAX),
        Transport::Udp => match &request.edns {
            Some(edns) => usize::from(edns.max_payload().min(EDNS_PAYLOAD)).max(PLAIN_UDP_LIMIT),
            None => PLAIN_UDP_LIMIT,
        },
    }
}

fn encode(mut response: Message, limit: usize) -> Outcome {
    let rcode = response.metadata.response_code;
    let bytes = match response.to_vec() {
        Ok(b) if b.len() <= limit => b,
        Ok(_) if !response.additionals.is_empty() => {
            response.additionals.clear();
            return encode(response, limit);
        }
        Ok(_) => match response.truncate().to_vec() {
            Ok(b) => b,
            Err(_) => return servfail(&response.metadata),
        },
        Err(_) => return servfail(&response.metadata),
    };
    Outcome::Reply { bytes, rcode }
}

/// A response with `rcode` and no records for `query` (which [`handle`] accepted before): the
/// server's answer when relaying a query upstream failed.
pub fn error_reply(query: &[u8], rcode: ResponseCode) -> Option<Vec<u8>> {
    let request = Message::from_vec(query).ok()?;
    let mut m = Message::new(
        request.metadata.id,
        MessageType::Response,
        request.metadata.op_code,
    );
    m.metadata = Metadata::response_from_request(&request.metadata);
    m.metadata.response_code = rcode;
    m.add_queries(request.queries);
    if let Some(asked) = &request.edns {
        m.set_edns(our_edns(asked));
    }
    m.to_vec().ok()
}

/// Whether `reply` is a response to the query with id `id` (header only).
pub fn is_reply_to(reply: &[u8], id: u16) -> bool {
    reply.len() >= HEADER_LEN
        && u16::from_be_bytes([reply[0], reply[1]]) == id
        && reply[2] & 0x80 != 0
}

/// A bare SERVFAIL for a response we could not encode.
fn servfail(meta: &Metadata) -> Outcome {
    let mut m = Message::new(meta.id, MessageType::Response, meta.op_code);
    m.metadata.response_code = ResponseCode::ServFail;
    match m.to_vec() {
        Ok(bytes) => Outcome::Reply {
            bytes,
            rcode: ResponseCode::ServFail,
        },
        Err(_) => Outcome::Drop,
    }
}

/// FORMERR for a message whose header decodes but whose body does not.
/// FORMERR for a query that cannot be read whole, echoing its id and opcode; nothing for less
/// than a header or for a response.
pub fn malformed(query: &[u8]) -> Outcome {
    let mut decoder = BinDecoder::new(query);
    let Ok(header) = Header::read(&mut decoder) else {
        return Outcome::Drop;
    };
    if header.metadata.message_type == MessageType::Response {
        return Outcome::Drop;
    }
    let mut m = Message::new(
        header.metadata.id,
        MessageType::Response,
        header.metadata.op_code,
    );
    m.metadata = Metadata::response_from_request(&header.metadata);
    m.metadata.response_code = ResponseCode::FormErr;
    match m.to_vec() {
        Ok(bytes) => Outcome::Reply {
            bytes,
            rcode: ResponseCode::FormErr,
        },
        Err(_) => Outcome::Drop,
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
