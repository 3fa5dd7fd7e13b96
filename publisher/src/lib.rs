//! xcc publisher: turns what users mark for export in their cluster — Contour HTTPProxies and
//! Services labelled `connectivity.tanzu.vmware.com/export` — into exported ServiceRecords, which
//! the registry serves to other clusters.
//!
//! [`desired`] is the pure part (object in, desired record out, no I/O); the controllers that
//! watch the API server and apply its results build on it.

// Tests state their expectations with unwrap; the lint guards input handling in library code.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod desired;
pub mod httpproxy;
