//! All integration tests of this crate in one binary (one link instead of one per file); each
//! module was a test binary of its own. Tests on a shared control plane (`xcc_testkube::shared`)
//! share one per binary, each in its own namespace.

mod check;
#[path = "../common/mod.rs"]
mod common;
mod dashboard;
mod demo;
mod deploy;
mod dns_cli;
mod fuzz_corpora;
mod mcs_two_clusters;
mod monitoring;
mod names;
mod readme;
mod rotation;
mod rotation_load;
mod tree_processes;
mod two_clusters;
