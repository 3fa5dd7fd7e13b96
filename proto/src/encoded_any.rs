//! A `google.protobuf.Any` kept as its encoding: what xcc's Hamlet servers send as a response's
//! resource.
//!
//! A registry encodes each record once per API version and sends that encoding to every
//! consumer. With `prost_types::Any` in the response, each send copied the record's bytes and its
//! type URL into a fresh message (two allocations and a copy per record and consumer: the largest
//! single cost of a snapshot after the TLS and the socket). [`EncodedAny`] holds the encoded
//! message body in a [`Bytes`], so a send is a reference count, and it encodes to exactly the
//! bytes the `Any` it was made from encodes to.

use prost::bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};

/// The encoded body of a `google.protobuf.Any` (its fields, without the length delimiter).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct EncodedAny(Bytes);

impl EncodedAny {
    /// `any`, encoded.
    pub fn new(any: &prost_types::Any) -> Self {
        Self(any.encode_to_vec().into())
    }

    /// The encoded fields.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The `Any` this encodes.
    pub fn decode(&self) -> Result<prost_types::Any, DecodeError> {
        prost_types::Any::decode(self.0.clone())
    }
}

impl From<&prost_types::Any> for EncodedAny {
    fn from(any: &prost_types::Any) -> Self {
        Self::new(any)
    }
}

impl std::fmt::Debug for EncodedAny {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.decode() {
            Ok(any) => f
                .debug_struct("EncodedAny")
                .field("type_url", &any.type_url)
                .field("value_bytes", &any.value.len())
                .finish(),
            Err(_) => write!(f, "EncodedAny({} undecodable bytes)", self.0.len()),
        }
    }
}

impl Message for EncodedAny {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    /// Decoding (which xcc's servers never do: they only send this type) keeps the `Any`'s two
    /// fields, encoded again as they came, and drops unknown fields as prost does.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if !matches!(tag, 1 | 2) {
            return prost::encoding::skip_field(wire_type, tag, buf, ctx);
        }
        let mut value = Vec::new();
        prost::encoding::bytes::merge(wire_type, &mut value, buf, ctx)?;
        let mut out = BytesMut::from(&self.0[..]);
        prost::encoding::bytes::encode(tag, &value, &mut out);
        self.0 = out.freeze();
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = Bytes::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::federation::resourcediscovery::v1alpha1 as rd1;
    use crate::hamlet_server::v1alpha1 as serve1;

    fn any() -> prost_types::Any {
        prost_types::Any {
            type_url: crate::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            value: (0..300u32).map(|i| (i % 251) as u8).collect(),
        }
    }

    /// A server response with an EncodedAny is byte for byte the response with the Any, and a
    /// peer decodes the Any back.
    #[test]
    fn a_response_encodes_as_with_the_any_itself() {
        let with_any = rd1::StreamResponse {
            nonce: "7".into(),
            resource_url: crate::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            resource: Some(any()),
            operation: rd1::stream_response::Operation::Create as i32,
        };
        let encoded = serve1::StreamResponse {
            nonce: "7".into(),
            resource_url: crate::FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            resource: Some(EncodedAny::new(&any())),
            operation: serve1::stream_response::Operation::Create as i32,
        };
        let bytes = encoded.encode_to_vec();
        assert_eq!(bytes, with_any.encode_to_vec());
        assert_eq!(encoded.encoded_len(), bytes.len());
        assert_eq!(
            rd1::StreamResponse::decode(&bytes[..]).expect("decodes"),
            with_any
        );
        // Decoded as the server's type, the resource is the same encoding (a field is not lost
        // or repeated), and empty fields stay absent.
        let back = serve1::StreamResponse::decode(&bytes[..]).expect("decodes");
        assert_eq!(back, encoded);
        assert_eq!(
            back.resource.expect("resource").decode().expect("any"),
            any()
        );
        let empty = EncodedAny::new(&prost_types::Any::default());
        assert!(empty.as_bytes().is_empty());
    }
}
