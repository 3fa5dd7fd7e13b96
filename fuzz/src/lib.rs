//! libFuzzer entry points of xcc (see `docs/fuzzing.md`). The functions live in `entries.rs` so
//! the workspace's regression test can include the same file without depending on this crate.

#[path = "entries.rs"]
pub mod entries;
