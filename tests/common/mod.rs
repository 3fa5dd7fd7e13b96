//! Helpers shared by the root integration tests and benches.

pub mod clusters;
