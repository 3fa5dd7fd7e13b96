//! Wire compatibility with VMware's Hamlet definitions: every vector of
//! `tests/data/hamlet-vectors.json` (encodings produced by the original `.proto` files) must
//! decode into exactly the content it was made from, and that content must encode back to the
//! very same bytes.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use prost::Message;
use prost_types::Any;
use xcc_proto::federation::resourcediscovery::{v1alpha1 as rd1, v1alpha2 as rd2};
use xcc_proto::federation::types::{v1alpha1, v1alpha2};
use xcc_proto::google::rpc::Status;
use xcc_proto::hamlet::{unpack_federated_service, unpack_federated_service_v1alpha2};
use xcc_proto::{FEDERATED_SERVICE_V1ALPHA1_URL, FEDERATED_SERVICE_V1ALPHA2_URL};

const VECTORS: &str = include_str!("../data/hamlet-vectors.json");

/// Decode a hex string (two digits per byte, either case).
fn hex_decode(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", hex.len()));
    }
    let digit = |c: u8| -> Result<u8, String> {
        (c as char)
            .to_digit(16)
            .map(|d| d as u8)
            .ok_or_else(|| format!("{:?} is not a hex digit", c as char))
    };
    hex.as_bytes()
        .chunks(2)
        .map(|pair| Ok(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[test]
fn hex_decoder() {
    assert_eq!(
        hex_decode("00ff0A1b").unwrap(),
        vec![0x00, 0xff, 0x0a, 0x1b]
    );
    assert_eq!(hex_decode("").unwrap(), Vec::<u8>::new());
    assert!(hex_decode("abc").is_err());
    assert!(hex_decode("zz").is_err());
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `fs_v1alpha1_xcc`: the FederatedService the XCC registry server sends for `nginx.xcc.test`.
fn xcc_federated_service() -> v1alpha1::FederatedService {
    v1alpha1::FederatedService {
        name: "nginx.xcc.test".into(),
        description: String::new(),
        tags: vec![],
        labels: labels(&[("connectivity.tanzu.vmware.com/service-port", "443")]),
        fqdn: "nginx.xcc.test".into(),
        id: "nginx.xcc.test".into(),
        san: String::new(),
        protocols: strings(&["https"]),
        endpoints: vec![
            v1alpha1::federated_service::Endpoint {
                address: "172.17.0.5".into(),
                port: 443,
            },
            v1alpha1::federated_service::Endpoint {
                address: "172.17.0.6".into(),
                port: 443,
            },
        ],
    }
}

/// `fs_v1alpha2_full`: every field of the 2020 v1alpha2 FederatedService.
fn full_v1alpha2() -> v1alpha2::FederatedService {
    v1alpha2::FederatedService {
        name: "api".into(),
        description: "payments api".into(),
        tags: strings(&["prod"]),
        labels: labels(&[("team", "pay")]),
        fqdn: "api.pay.example".into(),
        endpoints: vec![v1alpha2::federated_service::Endpoint {
            address: "10.1.2.3".into(),
            port: 8443,
            labels: strings(&["east"]),
            description: String::new(),
        }],
        sans: strings(&["spiffe://example.org/ns/pay/sa/api"]),
        instances: vec![v1alpha2::federated_service::Instance {
            id: "v1".into(),
            protocol: "HTTPS".into(),
            metadata: labels(&[("sni", "api.pay.example")]),
            endpoint_selector: strings(&["east"]),
            description: String::new(),
        }],
    }
}

/// `fs_v1alpha2_latest`: the newest revision's description fields.
fn latest_v1alpha2() -> v1alpha2::FederatedService {
    v1alpha2::FederatedService {
        name: "api".into(),
        description: String::new(),
        tags: vec![],
        labels: BTreeMap::new(),
        fqdn: "api.pay.example".into(),
        endpoints: vec![v1alpha2::federated_service::Endpoint {
            address: "10.1.2.3".into(),
            port: 8443,
            labels: strings(&["east"]),
            description: "east gw".into(),
        }],
        sans: vec![],
        instances: vec![v1alpha2::federated_service::Instance {
            id: "v1".into(),
            protocol: "HTTPS".into(),
            metadata: BTreeMap::new(),
            endpoint_selector: strings(&["east"]),
            description: "v1 instance".into(),
        }],
    }
}

fn xcc_any() -> Any {
    Any {
        type_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
        value: xcc_federated_service().encode_to_vec(),
    }
}

fn check_v1alpha1_service(decoded: &v1alpha1::FederatedService) {
    assert_eq!(decoded.name, "nginx.xcc.test");
    assert_eq!(decoded.description, "");
    assert!(decoded.tags.is_empty());
    assert_eq!(
        decoded.labels,
        labels(&[("connectivity.tanzu.vmware.com/service-port", "443")])
    );
    assert_eq!(decoded.fqdn, "nginx.xcc.test");
    assert_eq!(decoded.id, "nginx.xcc.test");
    assert_eq!(decoded.san, "");
    assert_eq!(decoded.protocols, strings(&["https"]));
    let endpoints: Vec<(&str, u32)> = decoded
        .endpoints
        .iter()
        .map(|e| (e.address.as_str(), e.port))
        .collect();
    assert_eq!(endpoints, vec![("172.17.0.5", 443), ("172.17.0.6", 443)]);
    assert_eq!(decoded, &xcc_federated_service());
}

fn check_v1alpha2_full(decoded: &v1alpha2::FederatedService) {
    assert_eq!(decoded.name, "api");
    assert_eq!(decoded.description, "payments api");
    assert_eq!(decoded.tags, strings(&["prod"]));
    assert_eq!(decoded.labels, labels(&[("team", "pay")]));
    assert_eq!(decoded.fqdn, "api.pay.example");
    assert_eq!(
        decoded.sans,
        strings(&["spiffe://example.org/ns/pay/sa/api"])
    );
    assert_eq!(decoded.endpoints.len(), 1);
    let endpoint = &decoded.endpoints[0];
    assert_eq!(
        (
            endpoint.address.as_str(),
            endpoint.port,
            endpoint.labels.clone(),
            endpoint.description.as_str()
        ),
        ("10.1.2.3", 8443, strings(&["east"]), "")
    );
    assert_eq!(decoded.instances.len(), 1);
    let instance = &decoded.instances[0];
    assert_eq!(instance.id, "v1");
    assert_eq!(instance.protocol, "HTTPS");
    assert_eq!(instance.metadata, labels(&[("sni", "api.pay.example")]));
    assert_eq!(instance.endpoint_selector, strings(&["east"]));
    assert_eq!(instance.description, "");
    assert_eq!(decoded, &full_v1alpha2());
}

fn check_v1alpha2_latest(decoded: &v1alpha2::FederatedService) {
    assert_eq!(decoded.name, "api");
    assert_eq!(decoded.fqdn, "api.pay.example");
    assert!(decoded.labels.is_empty() && decoded.tags.is_empty() && decoded.sans.is_empty());
    assert_eq!(decoded.endpoints[0].description, "east gw");
    assert_eq!(decoded.endpoints[0].labels, strings(&["east"]));
    assert_eq!(decoded.instances[0].description, "v1 instance");
    assert_eq!(decoded.instances[0].endpoint_selector, strings(&["east"]));
    assert!(decoded.instances[0].metadata.is_empty());
    assert_eq!(decoded, &latest_v1alpha2());
}

/// Decode `bytes` as `M`, check it equals `expected`, and check both the decoded and the
/// expected value encode back to `bytes`.
fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(
    name: &str,
    bytes: &[u8],
    expected: &M,
    check: impl FnOnce(&M),
) {
    let decoded = M::decode(bytes).unwrap_or_else(|e| panic!("{name}: decode failed: {e}"));
    check(&decoded);
    assert_eq!(&decoded, expected, "{name}: decoded content");
    assert_eq!(
        decoded.encode_to_vec(),
        bytes,
        "{name}: re-encoding the decoded message"
    );
    assert_eq!(
        expected.encode_to_vec(),
        bytes,
        "{name}: encoding the expected content"
    );
}

/// Check one vector; the expected content is chosen by vector name and the message type by the
/// message name, and both must be known.
fn check_vector(name: &str, message: &str, bytes: &[u8]) {
    let expected_message = match name {
        "fs_v1alpha1_xcc" => "federation.types.v1alpha1.FederatedService",
        "fs_v1alpha2_full" | "fs_v1alpha2_latest" => "federation.types.v1alpha2.FederatedService",
        "rd_v1alpha1_initial_request" | "rd_v1alpha1_ack_go_style" | "rd_v1alpha1_nack" => {
            "federation.resourcediscovery.v1alpha1.StreamRequest"
        }
        "rd_v1alpha1_response_create" | "rd_v1alpha1_response_delete" => {
            "federation.resourcediscovery.v1alpha1.StreamResponse"
        }
        "rd_v1alpha2_bidi_request" | "rd_v1alpha2_bidi_response_upsert" => {
            "federation.resourcediscovery.v1alpha2.BidirectionalStream"
        }
        other => panic!("unknown vector {other:?} (message {message:?}): add its expected content"),
    };
    assert_eq!(message, expected_message, "{name}: message type");

    match name {
        "fs_v1alpha1_xcc" => round_trip(
            name,
            bytes,
            &xcc_federated_service(),
            check_v1alpha1_service,
        ),
        "fs_v1alpha2_full" => round_trip(name, bytes, &full_v1alpha2(), check_v1alpha2_full),
        "fs_v1alpha2_latest" => round_trip(name, bytes, &latest_v1alpha2(), check_v1alpha2_latest),
        "rd_v1alpha1_initial_request" => {
            let expected = rd1::StreamRequest {
                resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
                response_nonce: String::new(),
                status: None,
            };
            round_trip(name, bytes, &expected, |req: &rd1::StreamRequest| {
                assert_eq!(
                    req.resource_url,
                    "type.googleapis.com/federation.types.v1alpha1.FederatedService"
                );
                assert_eq!(req.response_nonce, "");
                assert_eq!(req.status, None);
            });
        }
        "rd_v1alpha1_ack_go_style" => {
            let expected = rd1::StreamRequest {
                resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
                response_nonce: String::new(),
                status: Some(Status::default()),
            };
            round_trip(name, bytes, &expected, |req: &rd1::StreamRequest| {
                assert_eq!(req.resource_url, FEDERATED_SERVICE_V1ALPHA1_URL);
                assert_eq!(req.response_nonce, "");
                let status = req.status.as_ref().expect("ACK carries a status");
                assert_eq!((status.code, status.message.as_str()), (0, ""));
                assert!(status.details.is_empty());
            });
        }
        "rd_v1alpha1_nack" => {
            let expected = rd1::StreamRequest {
                resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
                response_nonce: "7".into(),
                status: Some(Status {
                    code: 14,
                    message: "decode failed".into(),
                    details: vec![],
                }),
            };
            round_trip(name, bytes, &expected, |req: &rd1::StreamRequest| {
                assert_eq!(req.resource_url, FEDERATED_SERVICE_V1ALPHA1_URL);
                assert_eq!(req.response_nonce, "7");
                let status = req.status.as_ref().expect("NACK carries a status");
                assert_eq!(status.code, tonic::Code::Unavailable as i32);
                assert_eq!(status.message, "decode failed");
                assert!(status.details.is_empty());
            });
        }
        "rd_v1alpha1_response_create" | "rd_v1alpha1_response_delete" => {
            let (nonce, operation) = if name.ends_with("create") {
                ("", rd1::stream_response::Operation::Create)
            } else {
                ("42", rd1::stream_response::Operation::Delete)
            };
            let expected = rd1::StreamResponse {
                nonce: nonce.into(),
                resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
                resource: Some(xcc_any()),
                operation: operation as i32,
            };
            round_trip(name, bytes, &expected, |res: &rd1::StreamResponse| {
                assert_eq!(res.nonce, nonce);
                assert_eq!(res.resource_url, FEDERATED_SERVICE_V1ALPHA1_URL);
                assert_eq!(res.operation(), operation);
                assert_eq!(res.operation, if nonce.is_empty() { 1 } else { 3 });
                let any = res.resource.as_ref().expect("resource present");
                assert_eq!(any.type_url, FEDERATED_SERVICE_V1ALPHA1_URL);
                let fs =
                    unpack_federated_service(any).expect("Any holds a v1alpha1 FederatedService");
                check_v1alpha1_service(&fs);
            });
        }
        "rd_v1alpha2_bidi_request" => {
            let expected = rd2::BidirectionalStream {
                request: Some(rd2::StreamRequest {
                    resource_url: FEDERATED_SERVICE_V1ALPHA2_URL.into(),
                    response_nonce: String::new(),
                    status: None,
                    context: "ctx-1".into(),
                }),
                response: None,
            };
            round_trip(name, bytes, &expected, |msg: &rd2::BidirectionalStream| {
                assert!(msg.response.is_none());
                let req = msg.request.as_ref().expect("request present");
                assert_eq!(
                    req.resource_url,
                    "type.googleapis.com/federation.types.v1alpha2.FederatedService"
                );
                assert_eq!(req.response_nonce, "");
                assert_eq!(req.status, None);
                assert_eq!(req.context, "ctx-1");
            });
        }
        "rd_v1alpha2_bidi_response_upsert" => {
            let expected = rd2::BidirectionalStream {
                request: None,
                response: Some(rd2::StreamResponse {
                    nonce: "1".into(),
                    resource_url: FEDERATED_SERVICE_V1ALPHA2_URL.into(),
                    resource_id: "api".into(),
                    resource: Some(Any {
                        type_url: FEDERATED_SERVICE_V1ALPHA2_URL.into(),
                        value: latest_v1alpha2().encode_to_vec(),
                    }),
                    operation: rd2::stream_response::Operation::Upsert as i32,
                    context: "ctx-1".into(),
                }),
            };
            round_trip(name, bytes, &expected, |msg: &rd2::BidirectionalStream| {
                assert!(msg.request.is_none());
                let res = msg.response.as_ref().expect("response present");
                assert_eq!(res.nonce, "1");
                assert_eq!(res.resource_url, FEDERATED_SERVICE_V1ALPHA2_URL);
                assert_eq!(res.resource_id, "api");
                assert_eq!(res.operation(), rd2::stream_response::Operation::Upsert);
                assert_eq!(res.operation, 1);
                assert_eq!(res.context, "ctx-1");
                let any = res.resource.as_ref().expect("resource present");
                assert_eq!(any.type_url, FEDERATED_SERVICE_V1ALPHA2_URL);
                let fs = unpack_federated_service_v1alpha2(any)
                    .expect("Any holds a v1alpha2 FederatedService");
                check_v1alpha2_latest(&fs);
            });
        }
        _ => unreachable!("vector names are matched above"),
    }
}

#[test]
fn every_hamlet_vector_decodes_and_re_encodes_identically() {
    let doc: serde_json::Value = serde_json::from_str(VECTORS).expect("vectors file is JSON");
    let vectors = doc["vectors"].as_array().expect("`vectors` is an array");
    let mut seen = BTreeSet::new();
    for vector in vectors {
        let field = |key: &str| {
            vector[key]
                .as_str()
                .unwrap_or_else(|| panic!("vector {vector} has no string {key:?}"))
        };
        let (name, message, hex) = (field("name"), field("message"), field("hex"));
        let bytes = hex_decode(hex).unwrap_or_else(|e| panic!("{name}: bad hex: {e}"));
        check_vector(name, message, &bytes);
        assert!(seen.insert(name.to_string()), "duplicate vector {name}");
    }
    let expected: BTreeSet<String> = [
        "fs_v1alpha1_xcc",
        "fs_v1alpha2_full",
        "rd_v1alpha1_initial_request",
        "rd_v1alpha1_ack_go_style",
        "rd_v1alpha1_nack",
        "rd_v1alpha1_response_create",
        "rd_v1alpha1_response_delete",
        "fs_v1alpha2_latest",
        "rd_v1alpha2_bidi_request",
        "rd_v1alpha2_bidi_response_upsert",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(
        seen, expected,
        "vectors present vs. vectors with expected content"
    );
}

#[test]
fn vector_file_matches_the_shared_reference() {
    // The copy under tests/data is what CI sees; when the shared reference is present (developer
    // machines), it must not have drifted.
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/reference/hamlet-vectors.json");
    if let Ok(text) = std::fs::read_to_string(&shared) {
        assert!(
            text == VECTORS,
            "tests/data/hamlet-vectors.json differs from {}: copy it again",
            shared.display()
        );
    }
}
