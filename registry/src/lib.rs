//! The xcc registry: the catalog of services, the Hamlet server that serves this cluster's
//! subtree, the managed Hamlet clients that import from remote registries, the hierarchy
//! (federation), the Cedar and bilateral checks, the admin API, and the stores that keep exports
//! and imports (files, or Kubernetes objects). The map is docs/architecture.md.

pub mod admin;
pub mod authz;
pub mod authz_configmap;
pub mod budget;
pub mod catalog;
pub mod dial_errors;
pub mod federation;
pub mod files;
pub mod hamlet;
pub mod metrics;
pub mod peer_labels;
pub mod peer_metrics;
pub mod peers;
pub mod remote_ca;
pub(crate) mod remotes;
pub mod run;
pub mod store;

pub use catalog::Catalog;
pub use run::{Registry, RegistryConfig, StoreConfig};
