//! All integration tests of this crate in one binary (one link instead of one per file); each
//! module was a test binary of its own. Tests on a shared control plane (`xcc_testkube::shared`)
//! share one per binary, each in its own namespace.

mod adversarial_federation;
mod common;
mod file_mode;
mod grant_paths;
mod hamlet_client;
mod hamlet_interop;
mod hamlet_server;
mod hierarchy;
mod kube_events;
mod kube_grants;
mod kube_name_owners;
mod kube_store;
mod security_admin;
