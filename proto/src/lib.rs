//! Every contract xcc speaks, and no behaviour: the Hamlet wire types (wire-identical with
//! VMware's definitions), the `xcc.federation.v1` and `xcc.admin.v1` APIs, the resource shapes of
//! `ServiceRecord` / `RemoteRegistry`, and the derived names and validation rules of XCC v1.

#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]
// Tests state their expectations with unwrap; the lint guards input handling in library code.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod crd;
pub mod domains;
pub mod encoded_any;
pub mod hamlet;
pub mod import_journal;
pub mod mapping;
pub mod mcs;
pub mod names;
pub mod ports;
pub mod propagation;
pub mod resources;

/// `google.rpc.Status`, as Hamlet imports it.
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// Hamlet: `federation.types.*` and `federation.resourcediscovery.*`.
pub mod federation {
    pub mod types {
        pub mod v1alpha1 {
            tonic::include_proto!("federation.types.v1alpha1");
        }
        pub mod v1alpha2 {
            tonic::include_proto!("federation.types.v1alpha2");
        }
    }
    pub mod resourcediscovery {
        pub mod v1alpha1 {
            tonic::include_proto!("federation.resourcediscovery.v1alpha1");
        }
        pub mod v1alpha2 {
            tonic::include_proto!("federation.resourcediscovery.v1alpha2");
        }
    }
}

/// The Hamlet discovery servers of xcc's registry: the services and messages of
/// [`federation::resourcediscovery`], field for field, except that a response's resource is an
/// [`encoded_any::EncodedAny`] (its encoding, shared) rather than a `prost_types::Any`.
pub mod hamlet_server {
    pub mod v1alpha1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/hamlet_server/federation.resourcediscovery.v1alpha1.rs"
        ));
    }
    pub mod v1alpha2 {
        include!(concat!(
            env!("OUT_DIR"),
            "/hamlet_server/federation.resourcediscovery.v1alpha2.rs"
        ));
    }
}

/// xcc's own APIs.
pub mod xcc {
    pub mod federation {
        pub mod v1 {
            tonic::include_proto!("xcc.federation.v1");
        }
    }
    pub mod admin {
        pub mod v1 {
            tonic::include_proto!("xcc.admin.v1");
        }
    }
}

/// Encoded `FileDescriptorSet` of every proto above, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/xcc_descriptor.bin"));

/// Type URL of the Hamlet v1alpha1 payload; the only URL XCC peers subscribe with.
pub const FEDERATED_SERVICE_V1ALPHA1_URL: &str =
    "type.googleapis.com/federation.types.v1alpha1.FederatedService";
/// Type URL of the Hamlet v1alpha2 payload.
pub const FEDERATED_SERVICE_V1ALPHA2_URL: &str =
    "type.googleapis.com/federation.types.v1alpha2.FederatedService";
/// Type URL of xcc's end-of-snapshot marker, sent only to consumers that asked for it.
pub const SNAPSHOT_COMPLETE_URL: &str = "type.googleapis.com/xcc.federation.v1.SnapshotComplete";
/// gRPC metadata key a consumer sets (value `"1"`) to receive the end-of-snapshot marker; the
/// server echoes it in its response headers when it will send one.
pub const SNAPSHOT_MARKER_METADATA: &str = "xcc-snapshot-marker";
