//! xcc binder: turns imported ServiceRecords into Services, and serves them over DNS.

// Tests state their expectations with unwrap; the lint guards input handling in library code.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod apply;
pub mod controller;
pub mod desired;
pub mod dns;
