//! xcc binder: turns imported ServiceRecords into Services (the `xcc-dns` crate serves their names).

// Tests state their expectations with unwrap; the lint guards input handling in library code.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod apply;
pub mod controller;
pub mod desired;
pub mod mcs;
pub mod mcs_run;
