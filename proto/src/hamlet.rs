//! Packing Hamlet payloads into `google.protobuf.Any` and back, as the Go Hamlet library does
//! in its server and client: a payload travels as an `Any` whose type URL is
//! `type.googleapis.com/<full message name>`, and a consumer accepts it only when the part of
//! the type URL after the last `/` names the message it expects.

use prost::Message;
use prost_types::Any;
use thiserror::Error;

use crate::federation::types::{v1alpha1, v1alpha2};
use crate::{FEDERATED_SERVICE_V1ALPHA1_URL, FEDERATED_SERVICE_V1ALPHA2_URL};

/// Full protobuf name of the Hamlet v1alpha1 payload.
pub const FEDERATED_SERVICE_V1ALPHA1_NAME: &str = "federation.types.v1alpha1.FederatedService";
/// Full protobuf name of the Hamlet v1alpha2 payload.
pub const FEDERATED_SERVICE_V1ALPHA2_NAME: &str = "federation.types.v1alpha2.FederatedService";

/// Why an `Any` could not be unpacked.
#[derive(Debug, Error)]
pub enum UnpackError {
    /// The type URL names another message.
    #[error("mismatched message type: got {found:?} want {expected:?} (type URL {type_url:?})")]
    TypeMismatch {
        /// The message name expected.
        expected: &'static str,
        /// The name found after the last `/` of the type URL.
        found: String,
        /// The whole type URL.
        type_url: String,
    },
    /// The bytes are not a valid encoding of the expected message.
    #[error("decoding {message}: {source}")]
    Decode {
        /// The message name expected.
        message: &'static str,
        /// The protobuf error.
        source: prost::DecodeError,
    },
}

/// The message name a type URL refers to: everything after its last `/` (the whole URL when it
/// has none).
pub fn type_name_of(type_url: &str) -> &str {
    type_url.rsplit('/').next().unwrap_or(type_url)
}

/// Pack `msg` into an `Any` with the given type URL.
pub fn pack_any<M: Message>(type_url: &str, msg: &M) -> Any {
    Any {
        type_url: type_url.to_string(),
        value: msg.encode_to_vec(),
    }
}

/// Unpack an `Any` holding the message named `expected` (compared with [`type_name_of`]).
pub fn unpack_any<M: Message + Default>(
    any: &Any,
    expected: &'static str,
) -> Result<M, UnpackError> {
    let found = type_name_of(&any.type_url);
    if found != expected {
        return Err(UnpackError::TypeMismatch {
            expected,
            found: found.to_string(),
            type_url: any.type_url.clone(),
        });
    }
    M::decode(any.value.as_slice()).map_err(|source| UnpackError::Decode {
        message: expected,
        source,
    })
}

/// Pack a v1alpha1 FederatedService with [`FEDERATED_SERVICE_V1ALPHA1_URL`].
pub fn pack_federated_service(fs: &v1alpha1::FederatedService) -> Any {
    pack_any(FEDERATED_SERVICE_V1ALPHA1_URL, fs)
}

/// Unpack a v1alpha1 FederatedService, checking the type name as the Go client does.
pub fn unpack_federated_service(any: &Any) -> Result<v1alpha1::FederatedService, UnpackError> {
    unpack_any(any, FEDERATED_SERVICE_V1ALPHA1_NAME)
}

/// Pack a v1alpha2 FederatedService with [`FEDERATED_SERVICE_V1ALPHA2_URL`].
pub fn pack_federated_service_v1alpha2(fs: &v1alpha2::FederatedService) -> Any {
    pack_any(FEDERATED_SERVICE_V1ALPHA2_URL, fs)
}

/// Unpack a v1alpha2 FederatedService, checking the type name.
pub fn unpack_federated_service_v1alpha2(
    any: &Any,
) -> Result<v1alpha2::FederatedService, UnpackError> {
    unpack_any(any, FEDERATED_SERVICE_V1ALPHA2_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sample() -> v1alpha1::FederatedService {
        v1alpha1::FederatedService {
            name: "nginx.xcc.test".into(),
            fqdn: "nginx.xcc.test".into(),
            id: "nginx.xcc.test".into(),
            protocols: vec!["https".into()],
            labels: BTreeMap::from([(
                "connectivity.tanzu.vmware.com/service-port".to_string(),
                "443".to_string(),
            )]),
            endpoints: vec![v1alpha1::federated_service::Endpoint {
                address: "172.17.0.5".into(),
                port: 443,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn round_trip() {
        let any = pack_federated_service(&sample());
        assert_eq!(
            any.type_url,
            "type.googleapis.com/federation.types.v1alpha1.FederatedService"
        );
        assert_eq!(any.value, sample().encode_to_vec());
        assert_eq!(unpack_federated_service(&any).unwrap(), sample());
    }

    #[test]
    fn any_prefix_is_accepted_as_go_does() {
        let mut any = pack_federated_service(&sample());
        any.type_url = "example.org/custom/federation.types.v1alpha1.FederatedService".into();
        assert_eq!(unpack_federated_service(&any).unwrap(), sample());
        any.type_url = "federation.types.v1alpha1.FederatedService".into();
        assert_eq!(unpack_federated_service(&any).unwrap(), sample());
    }

    #[test]
    fn wrong_type_is_rejected() {
        let v2 = v1alpha2::FederatedService {
            name: "api".into(),
            ..Default::default()
        };
        let any = pack_federated_service_v1alpha2(&v2);
        let err = unpack_federated_service(&any).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mismatched message type: got \"federation.types.v1alpha2.FederatedService\" want \"federation.types.v1alpha1.FederatedService\" (type URL \"type.googleapis.com/federation.types.v1alpha2.FederatedService\")"
        );
        assert_eq!(unpack_federated_service_v1alpha2(&any).unwrap(), v2);
        let trailing_slash = Any {
            type_url: "type.googleapis.com/federation.types.v1alpha1.FederatedService/".into(),
            value: Vec::new(),
        };
        assert!(matches!(
            unpack_federated_service(&trailing_slash),
            Err(UnpackError::TypeMismatch { found, .. }) if found.is_empty()
        ));
    }

    #[test]
    fn garbage_is_a_decode_error() {
        let any = Any {
            type_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            value: vec![0x0a, 0x05, b'a'],
        };
        let err = unpack_federated_service(&any).unwrap_err();
        assert!(
            matches!(err, UnpackError::Decode { message, .. } if message == FEDERATED_SERVICE_V1ALPHA1_NAME)
        );
        assert!(
            err.to_string()
                .starts_with("decoding federation.types.v1alpha1.FederatedService: ")
        );
    }

    #[test]
    fn type_names() {
        assert_eq!(type_name_of("a/b/c.D"), "c.D");
        assert_eq!(type_name_of("c.D"), "c.D");
        assert_eq!(type_name_of(""), "");
    }
}
