//! Compiles every contract under `proto/` with protox (pure Rust: no system `protoc`) and
//! generates prost messages and tonic services. The encoded descriptor set is kept for gRPC
//! server reflection.

use std::path::PathBuf;

const FILES: &[&str] = &[
    "google/rpc/status.proto",
    "federation/types/v1alpha1/federated_service.proto",
    "federation/types/v1alpha2/federated_service.proto",
    "federation/resourcediscovery/v1alpha1/resource_discovery.proto",
    "federation/resourcediscovery/v1alpha2/resource_discovery.proto",
    "xcc/federation/v1/federation.proto",
    "xcc/admin/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(FILES, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("xcc_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        // Go peers serialise maps with sorted keys; BTreeMap makes our encoding deterministic too.
        .btree_map(".")
        .build_client(true)
        // Channels are built by xcc-certs (reloadable mTLS); the generated `connect` helper would
        // also clash with the Federation service's own `Connect` method.
        .build_transport(false)
        .build_server(true)
        .compile_fds(fds.clone())?;
    // The Hamlet discovery servers once more, with messages of their own whose resource is
    // already encoded ([`EncodedAny`](crate::encoded_any::EncodedAny)), so that a send shares the
    // entry's encoding instead of copying it. Same packages, fields and numbers: the same wire.
    let server_dir = out.join("hamlet_server");
    std::fs::create_dir_all(&server_dir)?;
    // Every other package is the first pass's (the files generated for them here, services of
    // the xcc packages among them, are not included anywhere).
    tonic_prost_build::configure()
        .out_dir(&server_dir)
        .extern_path(".google.protobuf.Any", "crate::encoded_any::EncodedAny")
        .extern_path(".google.rpc", "crate::google::rpc")
        .extern_path(".federation.types", "crate::federation::types")
        .extern_path(".xcc", "crate::xcc")
        .build_client(false)
        .build_transport(false)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
