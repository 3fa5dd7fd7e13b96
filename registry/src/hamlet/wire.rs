//! What goes on the wire to Hamlet consumers: each entry's encoded resource, built once and
//! shared by every send ([`Encoded`]), and the requests and responses of both API versions
//! ([`Wire`], [`W1`], [`W2`]).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use tonic::{Code, Status};
// The servers' own messages: a response's resource is its shared encoding.
use xcc_proto::encoded_any::EncodedAny;
use xcc_proto::hamlet_server::{v1alpha1 as rd1, v1alpha2 as rd2};
use xcc_proto::{
    FEDERATED_SERVICE_V1ALPHA1_URL, FEDERATED_SERVICE_V1ALPHA2_URL, SNAPSHOT_COMPLETE_URL,
};

use super::consumer::{Op, Outgoing};
use super::convert;
use crate::catalog::ServiceEntry;
use crate::metrics::Api;

/// Each served entry's encoded Hamlet resource, per API version, shared by every consumer and
/// every send: built at the first send after the entry changed (a changed entry is a new
/// allocation), so a snapshot to 1,000 consumers encodes each record once, not 1,000 times.
/// The entry's Cedar entity is kept the same way, built at the first policy reload that decides
/// the entry again. Keyed by the entry's allocation; a slot whose entry is gone is replaced or
/// pruned.
#[derive(Default)]
pub(super) struct Encoded {
    slots: std::sync::RwLock<EncodedSlots>,
}

#[derive(Default)]
struct EncodedSlots {
    by_entry: HashMap<usize, Arc<EncodedEntry>, std::hash::BuildHasherDefault<AddressHasher>>,
    /// Prune dead slots when the map reaches this size.
    prune_at: usize,
}

/// Hashes an allocation's address (the [`EncodedSlots`] key, looked up on every send): a
/// multiply and a fold, not SipHash (the keys are not chosen by peers).
#[derive(Default)]
struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_usize(&mut self, n: usize) {
        // Allocations are 16-byte aligned: drop those bits, spread the rest over the word.
        let h = ((n as u64) >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 32);
    }
}

struct EncodedEntry {
    entry: std::sync::Weak<ServiceEntry>,
    v1alpha1: OnceLock<EncodedAny>,
    v1alpha2: OnceLock<EncodedAny>,
    /// None when the entity could not be built (it is built again, for its error, when asked).
    /// Boxed: a slot lives with every served entry, and most are never decided again (an
    /// entity is 272 bytes inline, its box pointer 8).
    cedar: OnceLock<Option<Box<cedar_policy::Entity>>>,
}

impl Encoded {
    fn slot(&self, e: &Arc<ServiceEntry>) -> Arc<EncodedEntry> {
        let key = Arc::as_ptr(e) as usize;
        let live = |slot: &EncodedEntry| {
            slot.entry.strong_count() > 0 && slot.entry.as_ptr() == Arc::as_ptr(e)
        };
        {
            let slots = xcc_controller::plumbing::read(&self.slots);
            if let Some(slot) = slots.by_entry.get(&key)
                && live(slot)
            {
                return slot.clone();
            }
        }
        let mut slots = xcc_controller::plumbing::write(&self.slots);
        if let Some(slot) = slots.by_entry.get(&key)
            && live(slot)
        {
            return slot.clone();
        }
        if slots.by_entry.len() >= slots.prune_at {
            slots.by_entry.retain(|_, s| s.entry.strong_count() > 0);
            slots.prune_at = (slots.by_entry.len() * 2).max(1024);
        }
        let slot = Arc::new(EncodedEntry {
            entry: Arc::downgrade(e),
            v1alpha1: OnceLock::new(),
            v1alpha2: OnceLock::new(),
            cedar: OnceLock::new(),
        });
        slots.by_entry.insert(key, slot.clone());
        slot
    }

    /// The entry's v1alpha1 resource; a clone of the shared encoding (a reference count).
    pub(super) fn v1alpha1(&self, e: &Arc<ServiceEntry>) -> EncodedAny {
        self.slot(e)
            .v1alpha1
            .get_or_init(|| EncodedAny::new(&convert::any_v1alpha1(e)))
            .clone()
    }

    /// The entry's v1alpha2 resource, shared as [`Self::v1alpha1`].
    pub(super) fn v1alpha2(&self, e: &Arc<ServiceEntry>) -> EncodedAny {
        self.slot(e)
            .v1alpha2
            .get_or_init(|| EncodedAny::new(&convert::any_v1alpha2(e)))
            .clone()
    }

    /// The entry's Cedar entity ([`crate::authz::service_entity`]), built once per version.
    pub(super) fn entity(
        &self,
        e: &Arc<ServiceEntry>,
    ) -> Result<cedar_policy::Entity, crate::authz::PolicyError> {
        match self
            .slot(e)
            .cedar
            .get_or_init(|| crate::authz::service_entity(e).ok().map(Box::new))
        {
            Some(entity) => Ok((**entity).clone()),
            None => crate::authz::service_entity(e),
        }
    }
}

/// What a consumer message means, whatever the API version.
pub(super) enum Incoming {
    Reply { nonce: String, nack: Option<String> },
}

/// Per-version encoding of requests and responses.
pub(super) trait Wire: Send + 'static {
    type Req: Send + 'static;
    type Resp: prost::Message + Unpin + 'static;
    const API: Api;
    const RESOURCE_URL: &'static str;
    /// Whether a subscription to `url` is served (by default only [`Self::RESOURCE_URL`]).
    fn serves(url: &str) -> bool {
        url == Self::RESOURCE_URL
    }
    /// The subscription: resource URL and the per-stream context handed to [`Self::render`].
    fn subscription(req: &Self::Req) -> Result<(String, String), Status>;
    fn incoming(req: Self::Req) -> Result<Incoming, Status>;
    fn render(out: &Outgoing, context: &str, encoded: &Encoded) -> Self::Resp;
    /// Bytes `resp` takes on the wire (without the 5-byte gRPC frame header).
    fn encoded_len(resp: &Self::Resp) -> usize {
        prost::Message::encoded_len(resp)
    }
}

pub(super) struct W1;
impl Wire for W1 {
    type Req = rd1::StreamRequest;
    type Resp = rd1::StreamResponse;
    const API: Api = Api::V1alpha1;
    const RESOURCE_URL: &'static str = FEDERATED_SERVICE_V1ALPHA1_URL;

    /// The Go reference server serves both FederatedService versions on this service, chosen by
    /// the consumer's `resource_url` (the Go client's `WatchResources` with the v1alpha2 URL).
    fn serves(url: &str) -> bool {
        url == FEDERATED_SERVICE_V1ALPHA1_URL || url == FEDERATED_SERVICE_V1ALPHA2_URL
    }

    /// The context is the subscribed resource URL: it picks the payload version.
    fn subscription(req: &Self::Req) -> Result<(String, String), Status> {
        Ok((req.resource_url.clone(), req.resource_url.clone()))
    }

    fn incoming(req: Self::Req) -> Result<Incoming, Status> {
        if !Self::serves(&req.resource_url) {
            check_url(&req.resource_url, Self::RESOURCE_URL)?;
        }
        Ok(reply(req.response_nonce, req.status))
    }

    fn render(out: &Outgoing, context: &str, encoded: &Encoded) -> Self::Resp {
        let (operation, url, resource) = match (out.op, &out.entry) {
            (Op::SnapshotComplete, _) | (_, None) => (
                rd1::stream_response::Operation::Unknown,
                SNAPSHOT_COMPLETE_URL,
                marker_any(out),
            ),
            (op, Some(e)) => {
                let (url, resource) = if context == FEDERATED_SERVICE_V1ALPHA2_URL {
                    (FEDERATED_SERVICE_V1ALPHA2_URL, encoded.v1alpha2(e))
                } else {
                    (FEDERATED_SERVICE_V1ALPHA1_URL, encoded.v1alpha1(e))
                };
                let operation = match op {
                    Op::Create => rd1::stream_response::Operation::Create,
                    Op::Update => rd1::stream_response::Operation::Update,
                    _ => rd1::stream_response::Operation::Delete,
                };
                (operation, url, resource)
            }
        };
        rd1::StreamResponse {
            nonce: out.nonce.clone(),
            resource_url: url.to_string(),
            resource: Some(resource),
            operation: operation as i32,
        }
    }
}

pub(super) struct W2;
impl Wire for W2 {
    type Req = rd2::BidirectionalStream;
    type Resp = rd2::BidirectionalStream;
    const API: Api = Api::V1alpha2;
    const RESOURCE_URL: &'static str = FEDERATED_SERVICE_V1ALPHA2_URL;

    fn subscription(req: &Self::Req) -> Result<(String, String), Status> {
        let r = req.request.as_ref().ok_or_else(|| {
            Status::invalid_argument("the first message must carry a StreamRequest")
        })?;
        Ok((r.resource_url.clone(), r.context.clone()))
    }

    fn incoming(req: Self::Req) -> Result<Incoming, Status> {
        let r = req
            .request
            .ok_or_else(|| Status::invalid_argument("expected a StreamRequest (ACK or NACK)"))?;
        check_url(&r.resource_url, Self::RESOURCE_URL)?;
        Ok(reply(r.response_nonce, r.status))
    }

    fn render(out: &Outgoing, context: &str, encoded: &Encoded) -> Self::Resp {
        let (operation, url, resource, id) = match (out.op, &out.entry) {
            (Op::SnapshotComplete, _) | (_, None) => (
                rd2::stream_response::Operation::Unknown,
                SNAPSHOT_COMPLETE_URL,
                marker_any(out),
                String::new(),
            ),
            (op, Some(e)) => (
                if op == Op::Delete {
                    rd2::stream_response::Operation::Delete
                } else {
                    rd2::stream_response::Operation::Upsert
                },
                FEDERATED_SERVICE_V1ALPHA2_URL,
                encoded.v1alpha2(e),
                e.fqdn.to_string(),
            ),
        };
        rd2::BidirectionalStream {
            request: None,
            response: Some(rd2::StreamResponse {
                nonce: out.nonce.clone(),
                resource_url: url.to_string(),
                resource_id: id,
                resource: Some(resource),
                operation: operation as i32,
                context: context.to_string(),
            }),
        }
    }
}

fn marker_any(out: &Outgoing) -> EncodedAny {
    use prost::Message;
    EncodedAny::new(&prost_types::Any {
        type_url: SNAPSHOT_COMPLETE_URL.into(),
        value: xcc_proto::xcc::federation::v1::SnapshotComplete {
            generation: out.nonce.parse().unwrap_or(0),
        }
        .encode_to_vec(),
    })
}

fn check_url(got: &str, want: &str) -> Result<(), Status> {
    if got.is_empty() || got == want {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "resource_url {got:?} differs from the subscription {want:?}"
        )))
    }
}

fn reply(nonce: String, status: Option<xcc_proto::google::rpc::Status>) -> Incoming {
    let nack = status.filter(|s| s.code != 0).map(|s| {
        if s.message.is_empty() {
            format!("code {}", s.code)
        } else {
            format!("code {}: {}", s.code, s.message)
        }
    });
    Incoming::Reply { nonce, nack }
}

/// The status that ends a stream whose consumer sent something unreadable: an oversized message
/// is `RESOURCE_EXHAUSTED` (tonic says OUT_OF_RANGE), undecodable bytes `INVALID_ARGUMENT`.
pub(super) fn inbound_error(status: Status) -> Status {
    match status.code() {
        Code::OutOfRange if status.message().contains("too large") => {
            Status::resource_exhausted(format!("request too large: {}", status.message()))
        }
        Code::Internal if status.message().contains("decode") => {
            Status::invalid_argument(format!("malformed request: {}", status.message()))
        }
        _ => status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ip: &str) -> Arc<ServiceEntry> {
        entry_labelled(ip, Default::default())
    }

    fn entry_labelled(ip: &str, labels: crate::catalog::Labels) -> Arc<ServiceEntry> {
        Arc::new(ServiceEntry {
            key: crate::catalog::ServiceKey::new("east", "ns", "web"),
            source: crate::catalog::Source::Local,
            fqdn: "web.xcc.test".into(),
            endpoints: vec![crate::catalog::Endpoint {
                address: ip.into(),
                port: 443,
            }],
            ports: vec![],
            labels,
            allowed_requesters: vec![],
            origin: None,
            revision: 0,
        })
    }

    /// One encoding per entry and API version, equal to encoding it directly; a changed entry
    /// (a new allocation) is encoded anew; slots of dropped entries are pruned.
    #[test]
    fn each_entry_is_encoded_once_per_version() {
        let encoded = Encoded::default();
        let one = entry("10.0.0.1");
        assert_eq!(
            encoded.v1alpha1(&one).decode().expect("any"),
            convert::any_v1alpha1(&one)
        );
        assert_eq!(
            encoded.v1alpha2(&one).decode().expect("any"),
            convert::any_v1alpha2(&one)
        );
        let slot = encoded.slot(&one);
        assert!(Arc::ptr_eq(&slot, &encoded.slot(&one)), "the same slot");
        assert!(slot.v1alpha1.get().is_some() && slot.v1alpha2.get().is_some());
        let two = entry("10.0.0.2");
        assert_eq!(
            encoded.v1alpha1(&two).decode().expect("any"),
            convert::any_v1alpha1(&two)
        );
        assert_ne!(encoded.v1alpha1(&two), encoded.v1alpha1(&one));
        drop(one);
        for i in 0..2000 {
            encoded.v1alpha1(&entry(&format!("10.1.{}.{}", i / 250, i % 250)));
        }
        let live = encoded.slots.read().expect("lock").by_entry.len();
        assert!(live <= 1024 + 1, "dead slots pruned: {live}");
    }

    /// The Cedar entity is kept with the entry's version like its encodings: equal to building
    /// it directly, built once, and a changed entry (another owner here) gets its own.
    #[test]
    fn each_entry_has_one_cedar_entity_per_version() {
        let encoded = Encoded::default();
        let one = entry("10.0.0.1");
        let direct = crate::authz::service_entity(&one).expect("entity");
        assert_eq!(encoded.entity(&one).expect("entity"), direct);
        assert!(encoded.slot(&one).cedar.get().is_some_and(Option::is_some));
        assert_eq!(encoded.entity(&one).expect("entity"), direct);
        let mut changed = (*one).clone();
        changed.key = crate::catalog::ServiceKey::new("west", "ns", "web");
        let two = Arc::new(changed);
        let entity = encoded.entity(&two).expect("entity");
        assert_eq!(entity, crate::authz::service_entity(&two).expect("entity"));
        assert_ne!(entity.uid(), direct.uid());
        assert_eq!(
            entity
                .attr("owner")
                .expect("owner")
                .expect("value")
                .to_string(),
            r#""west""#
        );
    }

    /// Attack on the kept entity, composed with a label policy: a peer replaces its record, again
    /// and again, with one carrying the policy label a `forbid` matches. Each reload must decide
    /// the new version's labels, never the entity kept for the old one. (The slot's weak
    /// reference keeps the old version's block reserved, so a new version cannot take its
    /// address; a cache keyed by the bare address would get the freed block back from the
    /// allocator and answer with the old entity, which this test catches.)
    #[test]
    fn a_replaced_entry_is_decided_on_its_own_labels_not_the_kept_entity() {
        let set = |text: &str| {
            crate::authz::Policies::from_sources(&[("p.cedar".to_string(), text.to_string())])
                .expect("valid")
        };
        let neutral = set(
            r#"@id("n") forbid (principal, action == Xcc::Action::"discover", resource) when { resource.name == "none" };"#,
        );
        let restricting = set(
            r#"@id("r") forbid (principal, action == Xcc::Action::"discover", resource) when { resource.labels.contains("tier=restricted") };"#,
        );
        let encoded = Encoded::default();
        let entity = |e: &Arc<ServiceEntry>| encoded.entity(e);
        for _ in 0..64 {
            let plain = entry("10.0.0.1");
            assert_eq!(
                crate::authz::flipped_all(&neutral, &restricting, &[&plain], "c1", &entity),
                vec![None],
                "no label: nothing flips"
            );
            drop(plain);
            let restricted = entry_labelled(
                "10.0.0.1",
                [("connectivity.tanzu.vmware.com/tier", "restricted")]
                    .into_iter()
                    .collect(),
            );
            assert_eq!(
                crate::authz::flipped_all(&neutral, &restricting, &[&restricted], "c1", &entity),
                vec![Some(false)],
                "the new version's label is what the reload decides"
            );
        }
    }
}
