//! xcc publisher: turns what users mark for export in their cluster — Contour HTTPProxies and
//! Services labelled `connectivity.tanzu.vmware.com/export` — into exported ServiceRecords, which
//! the registry serves to other clusters.
//!
//! [`desired`] is the pure part (object in, desired record out, no I/O); [`apply`] writes one
//! source's result with server-side apply and removes what the source no longer owns.

// Tests state their expectations with unwrap; the lint guards input handling in library code.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod apply;
pub mod controller;
pub mod desired;
pub mod httpproxy;
pub mod mcs;
