//! Stores: where exports come from and where imports go.

pub mod file;
pub mod kube;
pub mod model;
