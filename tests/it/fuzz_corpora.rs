//! Replays every file of the fuzzing corpora (`fuzz/corpus/<target>/`) through the same entry
//! points the libFuzzer targets call (`fuzz/src/entries.rs`), on the stable toolchain, so CI
//! exercises each decoder with every input the campaigns kept — including the inputs of fixed
//! crashes (`fuzz/corpus/<target>/crash-*`). A panic in any of them fails the test and names
//! the file.

#[allow(dead_code)]
#[path = "../../fuzz/src/entries.rs"]
mod entries;

use std::path::{Path, PathBuf};

/// An entry point: raw input bytes in, nothing out (it must not panic).
type Entry = fn(&[u8]);

const TARGETS: [(&str, Entry); 6] = [
    ("hamlet_messages", entries::hamlet_messages),
    ("federation_messages", entries::federation_messages),
    ("admin_requests", entries::admin_requests),
    ("yaml_records", entries::yaml_records),
    ("cedar_policies", entries::cedar_policies),
    ("dns_packets", entries::dns_packets),
];

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_goes_through_its_entry_point_without_a_panic() {
    for (target, entry) in TARGETS {
        let files = corpus_files(target);
        assert!(!files.is_empty(), "the {target} corpus is empty");
        for file in &files {
            let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let outcome = std::panic::catch_unwind(|| entry(&data));
            assert!(outcome.is_ok(), "{target}: {} panicked", file.display());
        }
    }
}
