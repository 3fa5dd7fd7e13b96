//! Stores: where exports come from and where imports go.
//!
//! The stores sit above the rest of the registry: they use the catalog, Hamlet, the federation,
//! the remotes and the shared file helpers ([`crate::files`]), and only `run` (which composes
//! the process) uses them. What a lower part needs from a store is a trait it defines itself
//! (e.g. [`crate::hamlet::client::ImportSink`], `remotes::PersistedImports`).

pub mod file;
pub mod kube;
pub mod model;
