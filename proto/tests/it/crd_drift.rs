//! `deploy/crds/*.yaml` must be exactly what the Rust types in `xcc_proto::crd` generate.
//! Regenerate with `cargo run -q -- crds --dir deploy/crds` after changing the types.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;

const REGENERATE: &str =
    "regenerate with `cargo run -q -- crds --dir deploy/crds` and commit the result";

#[test]
fn checked_in_crds_match_the_rust_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let generated = xcc_proto::crd::crd_files().unwrap();
    let mut on_disk = BTreeMap::new();
    for entry in std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}; {REGENERATE}", dir.display()))
    {
        let path = entry.unwrap().path();
        // `Kustomization` (no .yaml, so `kubectl apply -f deploy/crds/` skips it) lists the
        // CRDs for `kubectl kustomize`; it is not generated.
        if path.extension().is_some_and(|e| e == "yaml") {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            on_disk.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    let generated_names: Vec<_> = generated.keys().collect();
    let disk_names: Vec<_> = on_disk.keys().collect();
    assert_eq!(
        disk_names, generated_names,
        "the CRD files in deploy/crds differ from the generated set; {REGENERATE}"
    );
    for (name, text) in &generated {
        assert!(
            on_disk[name] == *text,
            "deploy/crds/{name} is stale (it differs from what proto/src/crd.rs generates); {REGENERATE}"
        );
    }
}
